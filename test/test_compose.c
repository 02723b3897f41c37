/* test/test_compose.c — every pair and triple of grad, vjp, jvp, vmap, jit and
 * checkpoint, in every order, applied to f(x) = sin(x) (x of shape [3]).
 *
 * Each transform is wrapped so that it maps a function [3] -> [3] to another:
 *   G(h)    = grad of sum(h(x))                    -> h'(x)
 *   VJP(h)  = cotangent of h at x for c            -> c * h'(x)
 *   JVP(h)  = tangent of h at x for v              -> v * h'(x)
 *   VMAP(h) = sum over axis 0 of vmap(h)([x, x+1]) -> h(x) + h(x + 1)
 *   JIT(h), CKPT(h)                                -> h(x)
 * Every such h is elementwise, a sum of terms coef * sin^(k)(x + shift), so
 * the reference is exact: each wrapper maps the terms as written above. */
#include "common.h"

enum { G, VJP, JVP, VMAP, JIT, CKPT, N_KINDS };
static const char *kind_name[N_KINDS] = {"grad", "vjp", "jvp", "vmap", "jit", "checkpoint"};
static const double C[3] = {0.5, -1.5, 2.0}, V[3] = {1.25, 0.75, -0.5};

/* ---- reference: terms coef[i] * sin^(k)(x + shift) ---------------------------------- */
typedef struct term {
  double coef[3];
  int k;
  double shift;
} term;

typedef struct ref {
  term t[16];
  int n;
} ref;

static ref ref_apply(ref r, int kind) {
  ref o = {.n = 0};
  for (int i = 0; i < r.n; i++) {
    term t = r.t[i];
    switch (kind) {
    case G: t.k++; break;
    case VJP:
    case JVP:
      t.k++;
      for (int j = 0; j < 3; j++)
        t.coef[j] *= kind == VJP ? C[j] : V[j];
      break;
    case VMAP: o.t[o.n] = t, o.t[o.n++].shift += 1; break;
    default: break;
    }
    o.t[o.n++] = t;
  }
  return o;
}

static double dsin(int k, double x) {
  switch (k % 4) {
  case 0: return sin(x);
  case 1: return cos(x);
  case 2: return -sin(x);
  default: return -cos(x);
  }
}

static double ref_eval(const ref *r, int j, double x) {
  double s = 0;
  for (int i = 0; i < r->n; i++)
    s += r->t[i].coef[j] * dsin(r->t[i].k, x + r->t[i].shift);
  return s;
}

/* ---- the transforms, each wrapped back to [3] -> [3] --------------------------------- */
typedef struct wrap {
  int kind;
  nb_fn *inner; /* the transform of the wrapped function */
} wrap;

static nb_status sin_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sin(in[0]);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status sum_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *y;
  nb_status st = nb_call(u, in, &y);
  if (st) return st;
  out[0] = nb_sum(y, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status wrap_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const wrap *w = u;
  nb_tensor *x = in[0], *o[2];
  nb_status st;
  switch (w->kind) {
  case VJP:
  case JVP: {
    nb_tensor *args[2] = {x, nb_from_data(w->kind == VJP ? C : V, NB_SHAPE(3), NB_F64)};
    if ((st = nb_call(w->inner, args, o))) return st;
    out[0] = o[1];
    break;
  }
  case VMAP: {
    nb_tensor *pair[2] = {x, nb_add_scalar(x, 1.0)}, *xs = nb_stack(pair, 2, 0);
    if (!xs) return nb_last_status();
    if ((st = nb_call(w->inner, &xs, o))) return st;
    out[0] = nb_sum(o[0], NB_AXES(0), false);
    break;
  }
  default:
    if ((st = nb_call(w->inner, &x, o))) return st;
    out[0] = o[0];
  }
  return out[0] ? NB_OK : nb_last_status();
}

static void wrap_free(wrap *w) {
  nb_fn_release(w->inner);
  free(w);
}

/* Applies transform kind to h ([3] -> [3]); the returned fn owns its state
 * through the list the caller frees. */
static nb_fn *apply(int kind, nb_fn *h, wrap **keep) {
  wrap *w = calloc(1, sizeof *w);
  w->kind = kind;
  switch (kind) {
  case G: {
    nb_fn *s = nb_fn_create(sum_body, h, 1, 1);
    w->inner = nb_grad(s, NB_AXES(0));
    nb_fn_release(s);
    break;
  }
  case VJP: w->inner = nb_vjp_fn(h); break;
  case JVP: w->inner = nb_jvp_fn(h); break;
  case VMAP: w->inner = nb_vmap(h, NULL, NULL); break;
  case JIT: w->inner = nb_jit(h); break;
  default: w->inner = nb_checkpoint(h); break;
  }
  cr_assert(w->inner, "%s: %s", kind_name[kind], nb_last_error());
  *keep = w;
  return nb_fn_create(wrap_body, w, 1, 1);
}

static void check_chain(const int *kinds, int depth) {
  nb_scope_begin();
  nb_fn *fs[4];
  wrap *ws[3];
  fs[0] = nb_fn_create(sin_body, NULL, 1, 1);
  ref r = {.n = 1, .t = {{.coef = {1, 1, 1}, .k = 0, .shift = 0}}};
  char name[128] = "";
  /* kinds[0] is the outermost transform: apply from the innermost */
  for (int d = depth - 1, i = 0; d >= 0; d--, i++) {
    fs[i + 1] = apply(kinds[d], fs[i], &ws[i]);
    r = ref_apply(r, kinds[d]);
  }
  for (int d = 0; d < depth; d++)
    snprintf(name + strlen(name), sizeof name - strlen(name), "%s%s", d ? "(" : "",
             kind_name[kinds[d]]);
  const double xv[3] = {0.3, -0.7, 1.1};
  nb_tensor *x = nb_from_data(xv, NB_SHAPE(3), NB_F64), *y;
  nb_status st = nb_call(fs[depth], &x, &y);
  cr_assert(st == NB_OK, "%s(sin): %s", name, nb_last_error());
  double *got = tc_read(y);
  for (int j = 0; j < 3; j++) {
    double want = ref_eval(&r, j, xv[j]);
    cr_assert(fabs(got[j] - want) <= 1e-12 * (1 + fabs(want)), "%s(sin) element %d: %.15g vs %.15g",
              name, j, got[j], want);
  }
  free(got);
  for (int i = depth; i >= 1; i--) {
    nb_fn_release(fs[i]);
    wrap_free(ws[i - 1]);
  }
  nb_fn_release(fs[0]);
  nb_scope_end();
}

Test(compose, every_pair_in_either_order) {
  for (int a = 0; a < N_KINDS; a++)
    for (int b = 0; b < N_KINDS; b++)
      check_chain((int[]){a, b}, 2);
}

Test(compose, every_triple_in_every_order) {
  for (int a = 0; a < N_KINDS; a++)
    for (int b = 0; b < N_KINDS; b++)
      for (int c = 0; c < N_KINDS; c++)
        check_chain((int[]){a, b, c}, 3);
}
