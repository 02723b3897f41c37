/* src/transforms/autodiff.c — the functional transforms: vjp, jvp, grad,
 * value_and_grad, jacrev, jacfwd, hessian.
 *
 * Each returns an nb_fn whose body (1) traces the wrapped function on
 * symbolic aliases of its inputs, (2) collects one sweep over that trace, (3)
 * runs the sweep backward or forward once (jacrev/jacfwd: once per output or
 * argument, with a symbolic seed, then batch that derivative graph over the
 * basis with the vmap pass), and (4) returns the new graph's outputs. The outputs are ordinary
 * lazy tensors: realized when read, or traced again by an enclosing transform.
 *
 * Traced under a trace mesh (a call on sharded values, src/transforms/fn.c),
 * each input cotangent of vjp / grad / value_and_grad is laid out like its
 * primal (nbi_shard_like): graph-mode propagation then gives a replicated
 * weight a replicated gradient (one all-reduce), a sharded one its layout.
 */
#include "transforms.h"

#include <stdlib.h>

#include "../ops/rule_util.h"
#include "../sharding/sharding.h"
#include "tree.h"

enum kind { K_VJP, K_JVP, K_GRAD, K_VALUE_AND_GRAD, K_JACREV, K_JACFWD };

typedef struct xform {
  enum kind kind;
  const char *name;
  nb_fn *f;
  bool int_zero; /* grad: integer arguments get zero gradients (else an error) */
  int n_arg;
  int arg[]; /* argnums, normalized: n_arg entries (NB_ALL: every input) */
} xform;

static void xform_destroy(void *p) {
  xform *x = p;
  nb_fn_release(x->f);
  free(x);
}

/* ---- helpers -------------------------------------------------------------------- */
/* The standard basis of a dt tensor of shape s, stacked: shape (n, *s) with
 * row i the one-hot vector of flat index i (a realized constant). */
static nb_tensor *basis(const char *fn, const nb_shape *s, nb_dtype dt, int64_t n, int dev) {
  nb_shape bs = {.ndim = s->ndim + 1, .dims = {n}};
  if (bs.ndim > NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "%s: a Jacobian of a rank-%d value exceeds the maximum rank %d", fn,
              s->ndim, NB_MAX_DIMS);
    return NULL;
  }
  memcpy(bs.dims + 1, s->dims, sizeof(int64_t) * (size_t)s->ndim);
  /* built on the host (n x n values), then written to the device of the value
   * it is a basis for */
  double *h = calloc((size_t)(n ? n * n : 1), sizeof *h);
  nb_tensor *e = h ? nbi_leaf_alloc_on(fn, &bs, dt, dev) : NULL;
  if (!h) nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int64_t i = 0; i < n && e; i++)
    h[i * n + i] = 1.0;
  nbi_view v = e ? nbi_tensor_view(e) : (nbi_view){0};
  if (e && nbi_host_write(dev, &v, h, NB_F64)) e = NULL;
  free(h);
  return e;
}

/* Gives t the shape prefix + suffix (a Jacobian block). */
static nb_tensor *jac_reshape(nb_tensor *t, const nb_shape *prefix, const nb_shape *suffix,
                              const char *fn) {
  nb_shape s = *prefix;
  if (prefix->ndim + suffix->ndim > NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "%s: a Jacobian of rank %d + %d exceeds the maximum rank %d", fn,
              prefix->ndim, suffix->ndim, NB_MAX_DIMS);
    return NULL;
  }
  for (int d = 0; d < suffix->ndim; d++)
    s.dims[s.ndim++] = suffix->dims[d];
  return nb_reshape(t, s);
}

static nb_status check_float_args(const xform *x, const nbi_trace *tr) {
  for (int a = 0; a < x->n_arg; a++) {
    nb_tensor *t = tr->x[x->arg[a]];
    if (!nb_dtype_is_float(t->dtype))
      return nbi_error(NB_ERR_DTYPE,
                       "%s: input %d is %s; differentiated inputs must be floating-point", x->name,
                       x->arg[a], nb_dtype_name(t->dtype));
  }
  return NB_OK;
}

/* A tangent/cotangent argument for value v: same shape, cast to v's dtype. */
static nb_status seed_like(const char *fn, const char *what, int k, nb_tensor *seed,
                           const nb_tensor *v, nb_tensor **out) {
  if (!nbi_shape_eq(&seed->shape, &v->shape)) {
    char a[160], b[160];
    return nbi_error(NB_ERR_SHAPE, "%s: %s %d has shape %s but its value has shape %s", fn, what, k,
                     nb_shape_str(seed->shape, a, sizeof a), nb_shape_str(v->shape, b, sizeof b));
  }
  *out = seed->dtype == v->dtype ? seed : nb_cast(seed, v->dtype);
  return *out ? NB_OK : nb_last_status();
}

/* The cotangent g (NULL: zero) of primal alias x (the trace's identity of
 * the value the caller passed), laid out like that value under a trace mesh:
 * like the argument itself, not like the layout the alias may take inside
 * the program. */
static nb_tensor *cotangent_of(nb_tensor *g, nb_tensor *x) {
  if (!g) g = nbi_zeros_like(x);
  if (!g || !nbi_trace_mesh()) return g;
  return nbi_shard_like(g, x->op == NBI_OP_IDENTITY && x->n_in == 1 ? x->in[0] : x);
}

/* ---- the bodies ------------------------------------------------------------------ */
static nb_status body_vjp(const xform *x, nbi_trace *tr, nb_tensor *const *in, nb_tensor **out) {
  int n_in = tr->n_in, n_out = tr->n_out;
  nbi_sweep s = {.fn = x->name, .seq0 = tr->seq0};
  nb_tensor **g = calloc((size_t)(n_out + n_in) + 1, sizeof *g);
  nb_status st = g ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", x->name);
  for (int k = 0; k < n_out && !st; k++)
    st = seed_like(x->name, "cotangent", k, in[n_in + k], tr->y[k], &g[k]);
  if (!st) st = nbi_sweep_collect(&s, tr->y, n_out, tr->x, n_in);
  if (!st) st = nbi_sweep_reverse(&s, tr->y, g, n_out, g + n_out);
  for (int k = 0; k < n_out && !st; k++)
    out[k] = tr->y[k];
  for (int k = 0; k < n_in && !st; k++)
    if (!(out[n_out + k] = cotangent_of(g[n_out + k], tr->x[k]))) st = nb_last_status();
  nbi_sweep_free(&s);
  free(g);
  return st;
}

static nb_status body_jvp(const xform *x, nbi_trace *tr, nb_tensor *const *in, nb_tensor **out) {
  int n_in = tr->n_in, n_out = tr->n_out;
  nbi_sweep s = {.fn = x->name, .seq0 = tr->seq0};
  nb_tensor **t = calloc((size_t)(n_out + n_in) + 1, sizeof *t);
  nb_status st = t ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", x->name);
  for (int k = 0; k < n_in && !st; k++) {
    st = seed_like(x->name, "tangent", k, in[n_in + k], tr->x[k], &t[k]);
    if (!nb_dtype_is_float(tr->x[k]->dtype)) t[k] = NULL; /* integers carry no tangent */
  }
  if (!st) st = nbi_sweep_collect(&s, tr->y, n_out, tr->x, n_in);
  if (!st) st = nbi_sweep_forward(&s, t, tr->y, n_out, t + n_in);
  for (int k = 0; k < n_out && !st; k++) {
    out[k] = tr->y[k];
    out[n_out + k] = t[n_in + k] ? t[n_in + k] : nbi_zeros_like(tr->y[k]);
  }
  nbi_sweep_free(&s);
  free(t);
  return st;
}

static nb_status body_grad(const xform *x, nbi_trace *tr, nb_tensor **out) {
  nb_tensor *y = tr->y[0];
  if (nbi_numel(&y->shape) != 1 || !nb_dtype_is_float(y->dtype)) {
    char b[160];
    return nbi_error(nbi_numel(&y->shape) != 1 ? NB_ERR_SHAPE : NB_ERR_DTYPE,
                     "%s: output 0 is %s %s; gradients need a one-element floating-point output "
                     "(use nb_jacrev or nb_vjp_fn otherwise)",
                     x->name, nb_dtype_name(y->dtype), nb_shape_str(y->shape, b, sizeof b));
  }
  nb_status st = x->int_zero ? NB_OK : check_float_args(x, tr);
  if (st) return st;
  /* heap, not the stack: NB_ALL may cover any number of inputs. xs: the
   * floating-point arguments (the sweep's sources); an integer argument
   * passed through (int_zero) gets zeros. */
  nb_tensor **xs = calloc(3 * (size_t)x->n_arg, sizeof *xs), **g = xs + x->n_arg,
            **all = g + x->n_arg;
  if (!xs) return nbi_error(NB_ERR_OOM, "%s: out of memory", x->name);
  int n_src = 0;
  for (int a = 0; a < x->n_arg; a++) {
    all[a] = tr->x[x->arg[a]];
    if (nb_dtype_is_float(all[a]->dtype)) xs[n_src++] = all[a];
  }
  if (n_src == 0) {
    free(xs);
    return nbi_error(NB_ERR_DTYPE,
                     "%s: no differentiated input is floating-point (integer "
                     "inputs are passed through with zero gradients)",
                     x->name);
  }
  nbi_sweep s = {.fn = x->name, .seq0 = tr->seq0};
  nb_tensor *seed = nbi_ones_like(y);
  st = seed ? nbi_sweep_collect(&s, &y, 1, xs, n_src) : nb_last_status();
  if (!st) st = nbi_sweep_reverse(&s, &y, &seed, 1, g);
  nbi_sweep_free(&s);
  int base = x->kind == K_VALUE_AND_GRAD ? tr->n_out : 0;
  for (int k = 0; k < base && !st; k++)
    out[k] = tr->y[k];
  for (int a = 0, j = 0; a < x->n_arg && !st; a++) {
    bool fl = nb_dtype_is_float(all[a]->dtype);
    nb_tensor *r = fl ? cotangent_of(g[j], xs[j]) : nbi_zeros_like(all[a]);
    j += fl;
    if (!(out[base + a] = r)) st = nb_last_status();
  }
  free(xs);
  return st;
}

/* Jacobians, output-major: out[o * n_arg + a] = d y[o] / d x[arg[a]].
 * jacrev: one reverse sweep seeded with a placeholder cotangent p for y[o],
 * then that backward graph is batched over the basis of y[o] (vmap of the
 * VJP): one graph whatever the output size. jacfwd: the same with a forward
 * sweep per argument, batched over the basis of that argument. */
static nb_status body_jac(const xform *x, nbi_trace *tr, nb_tensor **out) {
  nb_status st = check_float_args(x, tr);
  if (st) return st;
  int n_out = tr->n_out, na = x->n_arg;
  for (int o = 0; o < n_out; o++)
    if (!nb_dtype_is_float(tr->y[o]->dtype))
      return nbi_error(NB_ERR_DTYPE, "%s: output %d is %s; Jacobians need floating-point outputs",
                       x->name, o, nb_dtype_name(tr->y[o]->dtype));
  /* heap, not the stack: NB_ALL may cover any number of inputs */
  nb_tensor **xs = calloc(4 * (size_t)na, sizeof *xs), **g = xs + na, **bg = g + na, **t = bg + na;
  if (!xs) return nbi_error(NB_ERR_OOM, "%s: out of memory", x->name);
  for (int a = 0; a < na; a++)
    xs[a] = tr->x[x->arg[a]];
  nbi_sweep s = {.fn = x->name, .seq0 = tr->seq0};
  nb_tensor **seeds = calloc((size_t)n_out + 1, sizeof *seeds);
  if (!seeds) st = nbi_error(NB_ERR_OOM, "%s: out of memory", x->name);
  if (!st) st = nbi_sweep_collect(&s, tr->y, n_out, xs, na);
  if (x->kind == K_JACREV) {
    for (int o = 0; o < n_out && !st; o++) {
      nb_tensor *y = tr->y[o];
      int64_t m = nbi_numel(&y->shape);
      nb_tensor *p = nbi_placeholder(&y->shape, y->dtype);
      nb_tensor *e = p ? basis(x->name, &y->shape, y->dtype, m, y->device) : NULL;
      if (!e) {
        st = nb_last_status();
        break;
      }
      seeds[o] = p;
      st = nbi_sweep_reverse(&s, tr->y, seeds, n_out, g);
      seeds[o] = NULL;
      for (int a = 0; a < na; a++)
        if (!g[a]) g[a] = nbi_zeros_like(xs[a]);
      if (!st) st = nbi_vmap_graph(x->name, g, na, &p, &e, 1, m, p->seq, bg);
      for (int a = 0; a < na && !st; a++) {
        nb_tensor *j = bg[a] ? bg[a] : nbi_bat_expand(g[a], false, m);
        if (!(out[o * na + a] = jac_reshape(j, &y->shape, &xs[a]->shape, x->name)))
          st = nb_last_status();
      }
    }
  } else {
    nb_tensor **ty = calloc((size_t)n_out + 1, sizeof *ty),
              **bty = calloc((size_t)n_out + 1, sizeof *bty);
    if (!st && (!ty || !bty)) st = nbi_error(NB_ERR_OOM, "%s: out of memory", x->name);
    for (int a = 0; a < na && !st; a++) {
      int64_t n = nbi_numel(&xs[a]->shape);
      nb_tensor *p = nbi_placeholder(&xs[a]->shape, xs[a]->dtype);
      nb_tensor *e = p ? basis(x->name, &xs[a]->shape, xs[a]->dtype, n, xs[a]->device) : NULL;
      if (!e) {
        st = nb_last_status();
        break;
      }
      t[a] = p;
      st = nbi_sweep_forward(&s, t, tr->y, n_out, ty);
      t[a] = NULL;
      for (int o = 0; o < n_out; o++)
        if (!ty[o]) ty[o] = nbi_zeros_like(tr->y[o]);
      if (!st) st = nbi_vmap_graph(x->name, ty, n_out, &p, &e, 1, n, p->seq, bty);
      for (int o = 0; o < n_out && !st; o++) {
        nb_tensor *y = tr->y[o];
        nb_tensor *j = bty[o] ? bty[o] : nbi_bat_expand(ty[o], false, n);
        j = nbi_bat_moveaxis(j, 0, y->shape.ndim); /* (*y.shape, n) */
        if (!(out[o * na + a] = j ? jac_reshape(j, &y->shape, &xs[a]->shape, x->name) : NULL))
          st = nb_last_status();
      }
    }
    free(ty);
    free(bty);
  }
  nbi_sweep_free(&s);
  free(seeds);
  free(xs);
  return st;
}

static nb_status xform_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  const xform *x = user;
  nbi_trace tr;
  nb_status st = nbi_trace_run(x->name, x->f, in, &tr);
  if (!st) switch (x->kind) {
    case K_VJP: st = body_vjp(x, &tr, in, out); break;
    case K_JVP: st = body_jvp(x, &tr, in, out); break;
    case K_GRAD:
    case K_VALUE_AND_GRAD: st = body_grad(x, &tr, out); break;
    case K_JACREV:
    case K_JACFWD: st = body_jac(x, &tr, out); break;
    }
  (void)n_in;
  for (int k = 0; k < n_out && !st; k++)
    if (!(out[k] = nbi_trace_result(&tr, out[k]))) st = nb_last_status();
  nbi_trace_free(&tr);
  return st;
}

/* ---- constructors ---------------------------------------------------------------- */
/* argnums[0..n-1] (n < 0: every input); int_zero: integer arguments of a
 * gradient get zeros instead of an error. */
static nb_fn *make(const char *name, enum kind kind, nb_fn *f, const int *argnums, int n,
                   bool uses_args, bool int_zero) {
  if (!f) {
    nbi_error(NB_ERR_NULL, "%s: f is NULL", name);
    return NULL;
  }
  if (nbi_fn_is_tree(f)) {
    nbi_error(NB_ERR_ARG,
              "%s: f takes trees; %s applies to functions of tensors (nb_grad, "
              "nb_value_and_grad, nb_jit, nb_vmap and nb_checkpoint take trees)",
              name, name);
    return NULL;
  }
  if (uses_args && n > 0 && !argnums) {
    nbi_error(NB_ERR_NULL, "%s: argnums is NULL", name);
    return NULL;
  }
  int max_arg = n < 0 ? f->n_in : n;
  xform *x = calloc(1, sizeof *x + sizeof(int) * (size_t)(max_arg + 1));
  if (!x) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", name);
    return NULL;
  }
  x->kind = kind;
  x->name = name;
  x->f = f;
  x->int_zero = int_zero;
  if (uses_args) {
    if (n < 0) {
      for (int k = 0; k < f->n_in; k++)
        x->arg[x->n_arg++] = k;
    } else {
      for (int a = 0; a < n; a++) {
        int v = argnums[a] < 0 ? argnums[a] + f->n_in : argnums[a];
        bool dup = false;
        for (int b = 0; b < a && !dup; b++)
          dup = x->arg[b] == v;
        if (v < 0 || v >= f->n_in || dup) {
          free(x);
          nbi_error(NB_ERR_ARG, "%s: argnums[%d] = %d is %s (f has %d inputs)", name, a, argnums[a],
                    dup ? "repeated" : "out of range", f->n_in);
          return NULL;
        }
        x->arg[x->n_arg++] = v;
      }
    }
    if (x->n_arg == 0) {
      free(x);
      nbi_error(NB_ERR_ARG, "%s: argnums is empty", name);
      return NULL;
    }
  }
  int n_in = f->n_in, n_out;
  switch (kind) {
  case K_VJP: n_in = f->n_in + f->n_out, n_out = f->n_out + f->n_in; break;
  case K_JVP: n_in = 2 * f->n_in, n_out = 2 * f->n_out; break;
  case K_GRAD: n_out = x->n_arg; break;
  case K_VALUE_AND_GRAD: n_out = f->n_out + x->n_arg; break;
  default: n_out = f->n_out * x->n_arg; break;
  }
  nb_fn_retain(f);
  return nbi_fn_make(name, xform_body, x, xform_destroy, n_in, n_out);
}

/* nb_axes as a list: n < 0 for NB_ALL. */
static int axes_n(nb_axes a) { return a.n < 0 ? -1 : a.n > NB_MAX_DIMS ? NB_MAX_DIMS : a.n; }
static nb_fn *make_axes(const char *name, enum kind kind, nb_fn *f, nb_axes argnums) {
  return make(name, kind, f, argnums.v, axes_n(argnums), true, false);
}

static nb_fn *grad_of(const char *name, nb_fn *f, const int *argnums, int n, bool with_value) {
  if (nbi_fn_is_tree(f)) return nbi_tree_grad(name, f, argnums, n, with_value);
  /* NB_ALL passes integer inputs through (zero gradients); a list names
   * only floating-point inputs */
  return make(name, with_value ? K_VALUE_AND_GRAD : K_GRAD, f, argnums, n, true, n < 0);
}

nb_fn *nbi_grad_flat(const char *name, nb_fn *f, const int *argnums, int n, bool with_value) {
  return make(name, with_value ? K_VALUE_AND_GRAD : K_GRAD, f, argnums, n, true, true);
}

nb_fn *nb_vjp_fn(nb_fn *f) { return make("nb_vjp_fn", K_VJP, f, NULL, -1, false, false); }
nb_fn *nb_jvp_fn(nb_fn *f) { return make("nb_jvp_fn", K_JVP, f, NULL, -1, false, false); }
nb_fn *nb_grad(nb_fn *f, nb_axes argnums) {
  return f ? grad_of("nb_grad", f, argnums.v, axes_n(argnums), false)
           : make("nb_grad", K_GRAD, f, NULL, -1, true, false);
}
nb_fn *nb_value_and_grad(nb_fn *f, nb_axes argnums) {
  return f ? grad_of("nb_value_and_grad", f, argnums.v, axes_n(argnums), true)
           : make("nb_value_and_grad", K_GRAD, f, NULL, -1, true, false);
}
nb_fn *nb_grad_argnums(nb_fn *f, const int *argnums, int n) {
  if (n < 0) {
    nbi_error(NB_ERR_ARG, "nb_grad_argnums: n is %d", n);
    return NULL;
  }
  return f ? grad_of("nb_grad_argnums", f, argnums, n, false)
           : make("nb_grad_argnums", K_GRAD, f, NULL, -1, true, false);
}
nb_fn *nb_value_and_grad_argnums(nb_fn *f, const int *argnums, int n) {
  if (n < 0) {
    nbi_error(NB_ERR_ARG, "nb_value_and_grad_argnums: n is %d", n);
    return NULL;
  }
  return f ? grad_of("nb_value_and_grad_argnums", f, argnums, n, true)
           : make("nb_value_and_grad_argnums", K_GRAD, f, NULL, -1, true, false);
}
nb_fn *nb_jacrev(nb_fn *f, nb_axes argnums) { return make_axes("nb_jacrev", K_JACREV, f, argnums); }
nb_fn *nb_jacfwd(nb_fn *f, nb_axes argnums) { return make_axes("nb_jacfwd", K_JACFWD, f, argnums); }

nb_fn *nb_hessian(nb_fn *f, nb_axes argnums) {
  nb_fn *jr = make_axes("nb_hessian", K_JACREV, f, argnums);
  if (!jr) return NULL;
  nb_fn *h = make_axes("nb_hessian", K_JACFWD, jr, argnums);
  nb_fn_release(jr);
  return h;
}
