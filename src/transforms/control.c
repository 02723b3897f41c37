/* src/transforms/control.c — control flow: nb_cond, nb_while_loop, nb_scan and
 * nb_fori_loop (a scan over arange).
 *
 * Each call is one multi-output op (nbi.h, "multi-output nodes"): a pack node
 * whose payload (struct ctl) holds the bodies as programs, traced once per
 * call on placeholders of the operands' types. Tensors a body captures come
 * back from the trace and become further inputs of the pack (closure
 * conversion), so derivatives and batching reach them like any operand. The
 * payload hash combines the programs' structural hashes with the static
 * information (counts, direction, trip count): equal structure, equal plan.
 *
 * Calls are always recorded, never run eagerly, even when nothing is traced:
 * the result is lazy like every other op's, one code path serves every
 * context, and a predicate is never read before the graph is realized. The
 * kernels run the bodies with nested realizations (nbi_program_run) on the
 * pack's realized inputs.
 *
 * Rules (derivatives, batching) are written with the public transforms
 * applied to the bodies as functions (nbi_program_fn), plus small adapter
 * functions that reorder arguments; every rule records control flow again, so
 * rules of rules (higher derivatives, vmap of grad) work the same way.
 *
 * Pack inputs, in order:
 *   cond:  pred, ops[n_ops], captures of then, captures of else
 *   while: carries[n_ops], captures of cond, captures of body
 *   scan:  carries[n_ops], xs[n_xs], captures of body
 * Program inputs: cond branches (ops, own captures); while cond/body (carries,
 * own captures); scan body (carries, x rows, captures). */
#include "control.h"
#include "../core/oprules.h"
#include "../core/program.h"

#include "../ops/rule_util.h"

#include <stdlib.h>

static void ctl_destroy(nbi_payload *b) {
  ctl *c = (ctl *)b;
  nbi_program_release(c->prog[0]);
  nbi_program_release(c->prog[1]);
  nbi_multi_fini(&c->m);
  free(c);
}

/* Index in the pack's inputs of the first capture of prog[b]. */
int nbi_ctl_capt_base(const nb_tensor *p, int b) {
  const ctl *c = ctl_of(p);
  switch (p->op) {
  case NBI_OP_COND: return 1 + c->n_ops + (b ? c->n_capt[0] : 0);
  case NBI_OP_WHILE: return c->n_ops + (b ? c->n_capt[0] : 0);
  default: return c->n_ops + c->n_xs;
  }
}

/* Records the pack of op on in[0..n_in-1] with payload c (whose programs and
 * counts are set; consumed: the node keeps the only reference) and n_out
 * outputs of the given types. */
static nb_status ctl_record(const char *fn, int op, ctl *c, nb_tensor *const *in, int n_in,
                            int n_out, const nb_shape *shapes, const nb_dtype *dtypes,
                            nb_tensor **outs) {
  for (int j = 0; j < n_out; j++)
    outs[j] = NULL;
  c->m.base.refcount = 1;
  c->m.base.destroy = ctl_destroy;
  uint64_t h1 = 0x243f6a8885a308d3ull, h2 = 0x13198a2e03707344ull;
  uint64_t words[] = {(uint64_t)op,           (uint64_t)c->n_ops,     (uint64_t)c->n_xs,
                      (uint64_t)c->n_capt[0], (uint64_t)c->n_capt[1], (uint64_t)c->reverse,
                      (uint64_t)c->T};
  for (size_t i = 0; i < sizeof words / sizeof *words; i++)
    nbi_hash_mix(&h1, &h2, words[i]);
  for (int b = 0; b < 2; b++)
    if (c->prog[b]) nbi_hash_mix(&h1, &h2, c->prog[b]->h1), nbi_hash_mix(&h1, &h2, c->prog[b]->h2);
  c->m.base.h1 = h1;
  c->m.base.h2 = h2;
  nb_status st = nbi_multi_init(fn, &c->m, n_out, shapes, dtypes);
  if (!st) st = nbi_record_multi(op, in, n_in, &c->m, NULL, outs);
  nbi_payload_release(&c->m.base);
  return st;
}

/* ---- small helpers ------------------------------------------------------------------ */
static char *type_str(nb_shape s, nb_dtype dt, char *buf, size_t cap) {
  char b[160];
  snprintf(buf, cap, "%s %s", nb_dtype_name(dt), nb_shape_str(s, b, sizeof b));
  return buf;
}

nb_shape nbi_ctl_row_shape(const nb_shape *s) {
  nb_shape r = {.ndim = s->ndim - 1};
  memcpy(r.dims, s->dims + 1, sizeof(int64_t) * (size_t)r.ndim);
  return r;
}

/* dst[0..n-1] = src[0..n-1] (src may be NULL when n is 0). */
void nbi_ctl_put(nb_tensor **dst, nb_tensor *const *src, int n) {
  for (int i = 0; i < n; i++)
    dst[i] = src[i];
}

static bool is_one_bool(nb_shape s, nb_dtype dt) { return dt == NB_BOOL && nbi_numel(&s) == 1; }

/* A batched predicate (B, one element per example) as (B, 1 x rank), which
 * broadcasts per example against batched values of per-example rank `rank`. */
nb_tensor *nbi_ctl_mask_for(nb_tensor *m, int64_t B, int rank) {
  nb_shape s = {.ndim = rank + 1, .dims = {B}};
  for (int d = 1; d <= rank; d++)
    s.dims[d] = 1;
  return nb_reshape(m, s);
}

/* calloc of n + 1 elements, or NULL with *st set; nothing once *st is set, so
 * a run of allocations is checked once. */
void *nbi_ctl_xcalloc(const char *fn, size_t n, size_t size, nb_status *st) {
  void *p = *st ? NULL : calloc(n + 1, size);
  if (!p && !*st) *st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  return p;
}

/* ---- kernels -------------------------------------------------------------------------- */
/* dst (on device dev) = the value of r (realized, on any device). */
static nb_status copy_into(int dev, nbi_view dst, nb_tensor *r) {
  if (nbi_numel(&r->shape) == 0) return NB_OK;
  nbi_view src = nbi_tensor_view(r);
  return nbi_copy_between(dev, &dst, r->device, &src);
}

/* Row t of a view (dim 0 dropped). */
static nbi_view view_row(nbi_view v, int64_t t) {
  nbi_view r = {.data = v.data + t * v.strides[0] * (int64_t)nb_dtype_size(v.dtype),
                .dtype = v.dtype,
                .ndim = v.ndim - 1};
  memcpy(r.dims, v.dims + 1, sizeof(int64_t) * (size_t)r.ndim);
  memcpy(r.strides, v.strides + 1, sizeof(int64_t) * (size_t)r.ndim);
  return r;
}

/* A realized leaf holding row t of x (which holds data): x's storage, shared. */
static nb_tensor *leaf_row(nb_tensor *x, int64_t t) {
  nb_tensor *l = nbi_leaf_share(x);
  if (!l) return NULL;
  l->shard0.offset += t * l->shard0.strides[0];
  l->shape = nbi_ctl_row_shape(&x->shape);
  memmove(l->shard0.strides, l->shard0.strides + 1, sizeof(int64_t) * (size_t)l->shape.ndim);
  l->shard0.strides[l->shape.ndim] = 0;
  return l;
}

/* The value of a one-element predicate (one read from its device). */
static nb_status read_bool(nb_tensor *t, bool *out) {
  nbi_view v = nbi_tensor_view(t);
  double x = 0;
  nb_status st = nbi_host_scalar(t->device, &v, &x);
  *out = x != 0;
  return st;
}

static nb_status cond_exec(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  const ctl *c = ctl_of(n);
  double pred = 0;
  nb_status st = nbi_host_scalar(n->in[0]->device, &in[0], &pred);
  if (st) return st;
  int b = pred != 0 ? 0 : 1;
  const nbi_program *P = c->prog[b];
  nb_tensor **args = nbi_ctl_xcalloc("nb_cond", (size_t)(P->n_in + P->n_out), sizeof *args, &st);
  if (st) return st;
  nb_tensor **res = args + P->n_in;
  for (int k = 0; k < c->n_ops; k++)
    args[k] = n->in[1 + k];
  for (int i = 0; i < c->n_capt[b]; i++)
    args[c->n_ops + i] = n->in[nbi_ctl_capt_base(n, b) + i];
  st = nbi_program_run("nb_cond", P, args, res);
  for (int j = 0; j < P->n_out; j++) {
    if (!st) st = copy_into(n->device, nbi_multi_out_view(n, out, j), res[j]);
    nb_release(res[j]);
  }
  free(args);
  return st;
}

static nb_status while_exec(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)in;
  const char *fn = "nb_while_loop";
  const ctl *c = ctl_of(n);
  const nbi_program *Pc = c->prog[0], *Pb = c->prog[1];
  int nc = c->n_ops;
  nb_status st = NB_OK;
  nb_tensor **cur = nbi_ctl_xcalloc(fn, (size_t)nc, sizeof *cur, &st);
  nb_tensor **nxt = nbi_ctl_xcalloc(fn, (size_t)nc, sizeof *nxt, &st);
  nb_tensor **ca = nbi_ctl_xcalloc(fn, (size_t)Pc->n_in, sizeof *ca, &st);
  nb_tensor **ba = nbi_ctl_xcalloc(fn, (size_t)Pb->n_in, sizeof *ba, &st);
  bool owned = false; /* cur holds results of earlier iterations (ours to release) */
  for (int k = 0; k < nc && !st; k++)
    cur[k] = n->in[k];
  for (int i = 0; i < c->n_capt[0] && !st; i++)
    ca[nc + i] = n->in[nbi_ctl_capt_base(n, 0) + i];
  for (int i = 0; i < c->n_capt[1] && !st; i++)
    ba[nc + i] = n->in[nbi_ctl_capt_base(n, 1) + i];
  while (!st) {
    nb_tensor *pred = NULL;
    nbi_ctl_put(ca, cur, nc);
    if ((st = nbi_program_run(fn, Pc, ca, &pred))) break;
    bool go = false;
    st = read_bool(pred, &go);
    nb_release(pred);
    if (st || !go) break;
    nbi_ctl_put(ba, cur, nc);
    if ((st = nbi_program_run(fn, Pb, ba, nxt))) break;
    for (int k = 0; k < nc && owned; k++)
      nb_release(cur[k]);
    nbi_ctl_put(cur, nxt, nc);
    owned = true;
  }
  for (int k = 0; k < nc && !st; k++)
    st = copy_into(n->device, nbi_multi_out_view(n, out, k), cur[k]);
  for (int k = 0; k < nc && owned; k++)
    nb_release(cur[k]);
  free(cur);
  free(nxt);
  free(ca);
  free(ba);
  return st;
}

static nb_status scan_exec(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)in;
  const char *fn = "nb_scan";
  const ctl *c = ctl_of(n);
  const nbi_program *P = c->prog[0];
  int nc = c->n_ops, nx = c->n_xs, ny = c->m.n_out - nc;
  nb_status st = NB_OK;
  nb_tensor **args = nbi_ctl_xcalloc(fn, (size_t)P->n_in, sizeof *args, &st);
  nb_tensor **res = nbi_ctl_xcalloc(fn, (size_t)P->n_out, sizeof *res, &st);
  nb_tensor **cur = nbi_ctl_xcalloc(fn, (size_t)nc, sizeof *cur, &st);
  bool owned = false;
  for (int k = 0; k < nc && !st; k++)
    cur[k] = n->in[k];
  for (int i = 0; i < c->n_capt[0] && !st; i++)
    args[nc + nx + i] = n->in[nc + nx + i];
  for (int64_t s = 0; s < c->T && !st; s++) {
    int64_t t = c->reverse ? c->T - 1 - s : s;
    nb_scope_begin();
    nbi_ctl_put(args, cur, nc);
    for (int k = 0; k < nx && !st; k++)
      if (!(args[nc + k] = leaf_row(n->in[nc + k], t))) st = nb_last_status();
    if (!st) st = nbi_program_run(fn, P, args, res);
    nb_scope_end();
    if (st) break;
    for (int j = 0; j < ny; j++) {
      if (!st)
        st = copy_into(n->device, view_row(nbi_multi_out_view(n, out, nc + j), t), res[nc + j]);
      nb_release(res[nc + j]);
    }
    for (int k = 0; k < nc && owned; k++)
      nb_release(cur[k]);
    nbi_ctl_put(cur, res, nc);
    owned = true;
  }
  for (int k = 0; k < nc && !st; k++)
    st = copy_into(n->device, nbi_multi_out_view(n, out, k), cur[k]);
  for (int k = 0; k < nc && owned; k++)
    nb_release(cur[k]);
  free(args);
  free(res);
  free(cur);
  return st;
}

/* ---- checks ----------------------------------------------------------------------------- */
/* Checks P's outputs j0..j0+n-1 against n types: "output 1 of body_fn is f32 [3]
 * but carry 1 is f64 [3]" (who: "body_fn", want: "carry"). */
static nb_status check_outs(const char *fn, const char *who, const nbi_program *P, int j0,
                            const nb_shape *s, const nb_dtype *d, int n, const char *want) {
  for (int j = 0; j < n; j++) {
    if (P->out_dtype[j0 + j] == d[j] && nbi_shape_eq(&P->out_shape[j0 + j], &s[j])) continue;
    char a[200], b[200];
    return nbi_error(NB_ERR_SHAPE, "%s: output %d of %s is %s but %s %d is %s", fn, j0 + j, who,
                     type_str(P->out_shape[j0 + j], P->out_dtype[j0 + j], a, sizeof a), want, j,
                     type_str(s[j], d[j], b, sizeof b));
  }
  return NB_OK;
}

static nb_status check_fn(const char *fn, const char *name, const nb_fn *f, int n_in, int n_out) {
  if (!f) return nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, name);
  if (f->n_in != n_in || (n_out >= 0 && f->n_out != n_out))
    return nbi_error(NB_ERR_ARG, "%s: %s takes %d inputs and gives %d outputs (need %d -> %d)", fn,
                     name, f->n_in, f->n_out, n_in, n_out >= 0 ? n_out : f->n_out);
  return NB_OK;
}

/* ---- nb_cond ------------------------------------------------------------------------------ */
nb_status nb_cond(nb_tensor *pred, nb_fn *then_fn, nb_fn *else_fn, nb_tensor *const *ops, int n_ops,
                  nb_tensor **out) {
  const char *fn = "nb_cond";
  if (!out) return nbi_error(NB_ERR_NULL, "%s: out is NULL", fn);
  nb_status st = check_fn(fn, "then_fn", then_fn, n_ops, -1);
  if (!st) st = check_fn(fn, "else_fn", else_fn, n_ops, then_fn->n_out);
  if (st) {
    if (then_fn)
      for (int j = 0; j < then_fn->n_out; j++)
        out[j] = NULL;
    return st;
  }
  int n_out = then_fn->n_out;
  for (int j = 0; j < n_out; j++)
    out[j] = NULL;
  if (n_ops < 0) return nbi_error(NB_ERR_ARG, "%s: n_ops is %d", fn, n_ops);
  if (n_ops > 0 && !ops) return nbi_error(NB_ERR_NULL, "%s: ops is NULL", fn);
  if (nbi_any_null(fn, &pred, 1) || nbi_any_null(fn, ops, n_ops)) return nb_last_status();
  if (!is_one_bool(pred->shape, pred->dtype)) {
    char b[200];
    return nbi_error(NB_ERR_ARG, "%s: pred must be a one-element bool tensor, got %s", fn,
                     type_str(pred->shape, pred->dtype, b, sizeof b));
  }
  ctl *c = nbi_ctl_xcalloc(fn, 1, sizeof *c, &st);
  if (st) return st;
  nb_tensor **capt[2] = {NULL, NULL}, **in = NULL;
  int nt[2] = {0, 0};
  c->n_ops = n_ops;
  nb_fn *br[2] = {then_fn, else_fn};
  for (int b = 0; b < 2 && !st; b++)
    st = nbi_trace_program_like(fn, br[b], ops, &c->prog[b], &capt[b], &nt[b]);
  if (!st)
    st = check_outs(fn, "else_fn", c->prog[1], 0, c->prog[0]->out_shape, c->prog[0]->out_dtype,
                    n_out, "then_fn output");
  int n_in = 1 + n_ops + nt[0] + nt[1];
  in = nbi_ctl_xcalloc(fn, (size_t)n_in, sizeof *in, &st);
  if (!st) {
    in[0] = pred;
    nbi_ctl_put(in + 1, ops, n_ops);
    nbi_ctl_put(in + 1 + n_ops, capt[0], nt[0]);
    nbi_ctl_put(in + 1 + n_ops + nt[0], capt[1], nt[1]);
    c->n_capt[0] = nt[0], c->n_capt[1] = nt[1];
    st = ctl_record(fn, NBI_OP_COND, c, in, n_in, n_out, c->prog[0]->out_shape,
                    c->prog[0]->out_dtype, out);
  } else {
    ctl_destroy(&c->m.base);
  }
  free(in);
  nbi_release_all(capt[0], nt[0]);
  nbi_release_all(capt[1], nt[1]);
  return st;
}

/* ---- nb_while_loop -------------------------------------------------------------------------- */
nb_status nb_while_loop(nb_fn *cond_fn, nb_fn *body_fn, nb_tensor *const *init, int n,
                        nb_tensor **out) {
  const char *fn = "nb_while_loop";
  if (!out) return nbi_error(NB_ERR_NULL, "%s: out is NULL", fn);
  for (int k = 0; k < n; k++)
    out[k] = NULL;
  if (n < 1) return nbi_error(NB_ERR_ARG, "%s: n is %d (need at least one carry)", fn, n);
  nb_status st = check_fn(fn, "cond_fn", cond_fn, n, 1);
  if (!st) st = check_fn(fn, "body_fn", body_fn, n, n);
  if (st) return st;
  if (!init) return nbi_error(NB_ERR_NULL, "%s: init is NULL", fn);
  if (nbi_any_null(fn, init, n)) return nb_last_status();
  ctl *c = nbi_ctl_xcalloc(fn, 1, sizeof *c, &st);
  if (st) return st;
  nb_tensor **capt[2] = {NULL, NULL}, **in = NULL;
  int nt[2] = {0, 0};
  c->n_ops = n;
  nb_shape *s = nbi_ctl_xcalloc(fn, (size_t)n, sizeof *s, &st);
  nb_dtype *d = nbi_ctl_xcalloc(fn, (size_t)n, sizeof *d, &st);
  for (int k = 0; k < n && !st; k++)
    s[k] = init[k]->shape, d[k] = init[k]->dtype;
  if (!st) st = nbi_trace_program_like(fn, cond_fn, init, &c->prog[0], &capt[0], &nt[0]);
  if (!st && !is_one_bool(c->prog[0]->out_shape[0], c->prog[0]->out_dtype[0])) {
    char b[200];
    st = nbi_error(NB_ERR_ARG, "%s: cond_fn must give a one-element bool tensor, not %s", fn,
                   type_str(c->prog[0]->out_shape[0], c->prog[0]->out_dtype[0], b, sizeof b));
  }
  if (!st) st = nbi_trace_program_like(fn, body_fn, init, &c->prog[1], &capt[1], &nt[1]);
  if (!st) st = check_outs(fn, "body_fn", c->prog[1], 0, s, d, n, "carry");
  int n_in = n + nt[0] + nt[1];
  in = nbi_ctl_xcalloc(fn, (size_t)n_in, sizeof *in, &st);
  if (!st) {
    nbi_ctl_put(in, init, n);
    nbi_ctl_put(in + n, capt[0], nt[0]);
    nbi_ctl_put(in + n + nt[0], capt[1], nt[1]);
    c->n_capt[0] = nt[0], c->n_capt[1] = nt[1];
    st = ctl_record(fn, NBI_OP_WHILE, c, in, n_in, n, s, d, out);
  } else {
    ctl_destroy(&c->m.base);
  }
  free(in);
  free(s);
  free(d);
  nbi_release_all(capt[0], nt[0]);
  nbi_release_all(capt[1], nt[1]);
  return st;
}

/* ---- nb_scan -------------------------------------------------------------------------------- */
nb_status nb_scan(nb_fn *body, nb_tensor *const *init, int n_carry, nb_tensor *const *xs, int n_xs,
                  bool reverse, nb_tensor **carry_out, nb_tensor **ys) {
  const char *fn = "nb_scan";
  if (!body) return nbi_error(NB_ERR_NULL, "%s: body is NULL", fn);
  int n_ys = body->n_out - n_carry;
  if (n_carry < 0 || n_xs < 1 || n_ys < 0)
    return nbi_error(NB_ERR_ARG,
                     "%s: n_carry is %d and n_xs %d with a body of %d outputs (need n_carry >= 0, "
                     "n_xs >= 1 (no xs: nb_scan_length), body outputs >= n_carry)",
                     fn, n_carry, n_xs, body->n_out);
  if ((n_carry > 0 && !carry_out) || (n_ys > 0 && !ys))
    return nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn,
                     n_carry > 0 && !carry_out ? "carry_out" : "ys");
  for (int k = 0; k < n_carry; k++)
    carry_out[k] = NULL;
  for (int j = 0; j < n_ys; j++)
    ys[j] = NULL;
  nb_status st = check_fn(fn, "body", body, n_carry + n_xs, -1);
  if (st) return st;
  if ((n_carry > 0 && !init) || !xs)
    return nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, !xs ? "xs" : "init");
  if (nbi_any_null(fn, init, n_carry) || nbi_any_null(fn, xs, n_xs)) return nb_last_status();
  int64_t T = -1;
  for (int k = 0; k < n_xs; k++) {
    char b[160];
    if (xs[k]->shape.ndim < 1)
      return nbi_error(NB_ERR_SHAPE, "%s: xs[%d] is 0-d; scanned inputs need an axis 0", fn, k);
    if (T >= 0 && xs[k]->shape.dims[0] != T)
      return nbi_error(NB_ERR_SHAPE, "%s: xs[%d] has shape %s but xs[0] has %lld steps", fn, k,
                       nb_shape_str(xs[k]->shape, b, sizeof b), (long long)T);
    T = xs[k]->shape.dims[0];
  }
  int n_in_body = n_carry + n_xs, n_out = n_carry + n_ys;
  ctl *c = nbi_ctl_xcalloc(fn, 1, sizeof *c, &st);
  if (st) return st;
  *c = (ctl){.n_ops = n_carry, .n_xs = n_xs, .reverse = reverse, .T = T};
  nb_tensor **capt = NULL, **in = NULL, **outs = NULL;
  int nt = 0;
  nb_shape *s = nbi_ctl_xcalloc(fn, (size_t)(n_in_body + n_out), sizeof *s, &st);
  nb_dtype *d = nbi_ctl_xcalloc(fn, (size_t)(n_in_body + n_out), sizeof *d, &st);
  for (int k = 0; k < n_in_body && !st; k++) {
    nb_tensor *t = k < n_carry ? init[k] : xs[k - n_carry];
    s[k] = k < n_carry ? t->shape : nbi_ctl_row_shape(&t->shape);
    d[k] = t->dtype;
  }
  if (!st) st = nbi_trace_program(fn, body, s, d, &c->prog[0], &capt, &nt);
  if (!st) st = check_outs(fn, "body", c->prog[0], 0, s, d, n_carry, "carry");
  /* output types: the carries, then each y stacked on a new axis 0 */
  nb_shape *os = s + n_in_body;
  nb_dtype *od = d + n_in_body;
  for (int j = 0; j < n_out && !st; j++) {
    nb_shape ys_ = c->prog[0]->out_shape[j];
    od[j] = c->prog[0]->out_dtype[j];
    if (j < n_carry) {
      os[j] = ys_;
    } else if (ys_.ndim + 1 > NB_MAX_DIMS) {
      st = nbi_error(NB_ERR_SHAPE, "%s: stacking output %d of body would exceed rank %d", fn, j,
                     NB_MAX_DIMS);
    } else {
      os[j] = (nb_shape){.ndim = ys_.ndim + 1, .dims = {T}};
      memcpy(os[j].dims + 1, ys_.dims, sizeof(int64_t) * (size_t)ys_.ndim);
      if (nbi_check_shape(fn, &os[j])) st = nb_last_status();
    }
  }
  int n_in = n_in_body + nt;
  in = nbi_ctl_xcalloc(fn, (size_t)n_in, sizeof *in, &st);
  outs = nbi_ctl_xcalloc(fn, (size_t)n_out, sizeof *outs, &st);
  if (!st) {
    nbi_ctl_put(in, init, n_carry);
    nbi_ctl_put(in + n_carry, xs, n_xs);
    nbi_ctl_put(in + n_in_body, capt, nt);
    c->n_capt[0] = nt;
    st = ctl_record(fn, NBI_OP_SCAN, c, in, n_in, n_out, os, od, outs);
    for (int j = 0; j < n_out && !st; j++)
      if (j < n_carry)
        carry_out[j] = outs[j];
      else
        ys[j - n_carry] = outs[j];
  } else {
    ctl_destroy(&c->m.base);
  }
  free(in);
  free(outs);
  free(s);
  free(d);
  nbi_release_all(capt, nt);
  return st;
}

/* ---- nb_scan_length: a scan without xs ---------------------------------------------------------
 * nb_scan over a [length] bool placeholder of zeros that an adapter drops: the
 * body sees only the carries, and the scan's rules (derivatives, batching) do
 * the rest. */
nb_status nb_scan_length(nb_fn *body, nb_tensor *const *init, int n_carry, int64_t length,
                         bool reverse, nb_tensor **carry_out, nb_tensor **ys) {
  const char *fn = "nb_scan_length";
  if (!body) return nbi_error(NB_ERR_NULL, "%s: body is NULL", fn);
  int n_ys = body->n_out - n_carry;
  if (n_carry < 0 || n_ys < 0)
    return nbi_error(NB_ERR_ARG,
                     "%s: n_carry is %d with a body of %d outputs (need 0 <= n_carry <= body "
                     "outputs)",
                     fn, n_carry, body->n_out);
  if ((n_carry > 0 && !carry_out) || (n_ys > 0 && !ys))
    return nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn,
                     n_carry > 0 && !carry_out ? "carry_out" : "ys");
  for (int k = 0; k < n_carry; k++)
    carry_out[k] = NULL;
  for (int j = 0; j < n_ys; j++)
    ys[j] = NULL;
  if (length < 0)
    return nbi_error(NB_ERR_ARG, "%s: length is %lld (need >= 0)", fn, (long long)length);
  nb_status st = check_fn(fn, "body", body, n_carry, -1);
  if (st) return st;
  if (n_carry > 0 && !init) return nbi_error(NB_ERR_NULL, "%s: init is NULL", fn);
  if (nbi_any_null(fn, init, n_carry)) return nb_last_status();
  /* scan body: (carry..., dropped) -> body(carry...) */
  adapt *a = nbi_ctl_adapt_new(fn, nb_fn_retain(body), body->n_out, 0);
  if (!a) return nb_last_status();
  for (int k = 0; k < n_carry; k++)
    nbi_ctl_a_in(a, k, k);
  for (int j = 0; j < body->n_out; j++)
    nbi_ctl_a_out(a, A_OUT, j, -1);
  nb_fn *step = nbi_ctl_adapt_fn(fn, a, n_carry + 1);
  nb_tensor *steps = nb_zeros(NB_SHAPE(length), NB_BOOL);
  st = step && steps ? nb_scan(step, init, n_carry, &steps, 1, reverse, carry_out, ys)
                     : nb_last_status();
  nb_fn_release(step);
  return st;
}

/* ---- nb_fori_loop ------------------------------------------------------------------------- */
nb_status nb_fori_loop(int64_t lower, int64_t upper, nb_fn *body, nb_tensor *const *init, int n,
                       nb_tensor **out) {
  const char *fn = "nb_fori_loop";
  if (!out) return nbi_error(NB_ERR_NULL, "%s: out is NULL", fn);
  for (int k = 0; k < n; k++)
    out[k] = NULL;
  if (n < 1) return nbi_error(NB_ERR_ARG, "%s: n is %d (need at least one carry)", fn, n);
  nb_status st = check_fn(fn, "body", body, n + 1, n);
  if (st) return st;
  if (!init) return nbi_error(NB_ERR_NULL, "%s: init is NULL", fn);
  if (nbi_any_null(fn, init, n)) return nb_last_status();
  /* scan body: (carry..., i) -> body(i, carry...) */
  adapt *a = nbi_ctl_adapt_new(fn, nb_fn_retain(body), n, 0);
  if (!a) return nb_last_status();
  nbi_ctl_a_in(a, 0, n);
  for (int k = 0; k < n; k++)
    nbi_ctl_a_in(a, 1 + k, k), nbi_ctl_a_out(a, A_OUT, k, -1);
  nb_fn *step = nbi_ctl_adapt_fn(fn, a, n + 1);
  nb_tensor *idx = nb_arange((double)lower, (double)upper, 1, NB_I64);
  st = step && idx ? nb_scan(step, init, n, &idx, 1, false, out, NULL) : nb_last_status();
  nb_fn_release(step);
  return st;
}

/* ---- op records ------------------------------------------------------------------------------ */
static int ctl_programs2(const nbi_payload *p, const nbi_program **out) {
  const ctl *c = (const ctl *)p;
  out[0] = c->prog[0], out[1] = c->prog[1];
  return 2;
}
static int ctl_programs1(const nbi_payload *p, const nbi_program **out) {
  out[0] = ((const ctl *)p)->prog[0];
  return 1;
}

const nbi_op_def nbi_opdef_COND = {.name = "cond",
                                   .arity = -1,
                                   .exec = cond_exec,
                                   .flags = NBI_OPF_MULTI,
                                   .vjp_multi = nbi_ctl_cond_vjp,
                                   .jvp_multi = nbi_ctl_cond_jvp,
                                   .vmap_multi = nbi_ctl_cond_vmap,
                                   .programs = ctl_programs2};
const nbi_op_def nbi_opdef_WHILE = {.name = "while_loop",
                                    .arity = -1,
                                    .exec = while_exec,
                                    .flags = NBI_OPF_MULTI,
                                    .vjp_multi = nbi_ctl_while_vjp,
                                    .jvp_multi = nbi_ctl_while_jvp,
                                    .vmap_multi = nbi_ctl_while_vmap,
                                    .programs = ctl_programs2};
const nbi_op_def nbi_opdef_SCAN = {.name = "scan",
                                   .arity = -1,
                                   .exec = scan_exec,
                                   .flags = NBI_OPF_MULTI,
                                   .vjp_multi = nbi_ctl_scan_vjp,
                                   .jvp_multi = nbi_ctl_scan_jvp,
                                   .vmap_multi = nbi_ctl_scan_vmap,
                                   .programs = ctl_programs1};
