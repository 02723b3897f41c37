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
#include "transforms.h"

#include "../ops/rule_util.h"

#include <stdlib.h>

typedef struct ctl {
  nbi_multi m;          /* outputs: cond/while carries; scan carries then ys */
  nbi_program *prog[2]; /* cond: then, else; while: cond, body; scan: body */
  int n_ops;            /* cond: operands; while, scan: carries */
  int n_xs;             /* scan: scanned inputs */
  int n_capt[2];        /* captures of prog[0], prog[1] */
  bool reverse;         /* scan direction */
  int64_t T;            /* scan: number of steps */
} ctl;

static const ctl *ctl_of(const nb_tensor *p) { return (const ctl *)p->payload; }

static void ctl_destroy(nbi_payload *b) {
  ctl *c = (ctl *)b;
  nbi_program_release(c->prog[0]);
  nbi_program_release(c->prog[1]);
  nbi_multi_fini(&c->m);
  free(c);
}

/* Index in the pack's inputs of the first capture of prog[b]. */
static int capt_base(const nb_tensor *p, int b) {
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

static nb_shape row_shape(const nb_shape *s) {
  nb_shape r = {.ndim = s->ndim - 1};
  memcpy(r.dims, s->dims + 1, sizeof(int64_t) * (size_t)r.ndim);
  return r;
}

/* dst[0..n-1] = src[0..n-1] (src may be NULL when n is 0). */
static void put(nb_tensor **dst, nb_tensor *const *src, int n) {
  for (int i = 0; i < n; i++)
    dst[i] = src[i];
}

static bool is_one_bool(nb_shape s, nb_dtype dt) { return dt == NB_BOOL && nbi_numel(&s) == 1; }

/* A batched predicate (B, one element per example) as (B, 1 x rank), which
 * broadcasts per example against batched values of per-example rank `rank`. */
static nb_tensor *mask_for(nb_tensor *m, int64_t B, int rank) {
  nb_shape s = {.ndim = rank + 1, .dims = {B}};
  for (int d = 1; d <= rank; d++)
    s.dims[d] = 1;
  return nb_reshape(m, s);
}

/* calloc of n + 1 elements, or NULL with *st set; nothing once *st is set, so
 * a run of allocations is checked once. */
static void *xcalloc(const char *fn, size_t n, size_t size, nb_status *st) {
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
  l->shape = row_shape(&x->shape);
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
  nb_tensor **args = xcalloc("nb_cond", (size_t)(P->n_in + P->n_out), sizeof *args, &st);
  if (st) return st;
  nb_tensor **res = args + P->n_in;
  for (int k = 0; k < c->n_ops; k++)
    args[k] = n->in[1 + k];
  for (int i = 0; i < c->n_capt[b]; i++)
    args[c->n_ops + i] = n->in[capt_base(n, b) + i];
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
  nb_tensor **cur = xcalloc(fn, (size_t)nc, sizeof *cur, &st);
  nb_tensor **nxt = xcalloc(fn, (size_t)nc, sizeof *nxt, &st);
  nb_tensor **ca = xcalloc(fn, (size_t)Pc->n_in, sizeof *ca, &st);
  nb_tensor **ba = xcalloc(fn, (size_t)Pb->n_in, sizeof *ba, &st);
  bool owned = false; /* cur holds results of earlier iterations (ours to release) */
  for (int k = 0; k < nc && !st; k++)
    cur[k] = n->in[k];
  for (int i = 0; i < c->n_capt[0] && !st; i++)
    ca[nc + i] = n->in[capt_base(n, 0) + i];
  for (int i = 0; i < c->n_capt[1] && !st; i++)
    ba[nc + i] = n->in[capt_base(n, 1) + i];
  while (!st) {
    nb_tensor *pred = NULL;
    put(ca, cur, nc);
    if ((st = nbi_program_run(fn, Pc, ca, &pred))) break;
    bool go = false;
    st = read_bool(pred, &go);
    nb_release(pred);
    if (st || !go) break;
    put(ba, cur, nc);
    if ((st = nbi_program_run(fn, Pb, ba, nxt))) break;
    for (int k = 0; k < nc && owned; k++)
      nb_release(cur[k]);
    put(cur, nxt, nc);
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
  nb_tensor **args = xcalloc(fn, (size_t)P->n_in, sizeof *args, &st);
  nb_tensor **res = xcalloc(fn, (size_t)P->n_out, sizeof *res, &st);
  nb_tensor **cur = xcalloc(fn, (size_t)nc, sizeof *cur, &st);
  bool owned = false;
  for (int k = 0; k < nc && !st; k++)
    cur[k] = n->in[k];
  for (int i = 0; i < c->n_capt[0] && !st; i++)
    args[nc + nx + i] = n->in[nc + nx + i];
  for (int64_t s = 0; s < c->T && !st; s++) {
    int64_t t = c->reverse ? c->T - 1 - s : s;
    nb_scope_begin();
    put(args, cur, nc);
    for (int k = 0; k < nx && !st; k++)
      if (!(args[nc + k] = leaf_row(n->in[nc + k], t))) st = nb_last_status();
    if (!st) st = nbi_program_run(fn, P, args, res);
    nb_scope_end();
    if (st) break;
    for (int j = 0; j < ny; j++) {
      if (!st) st = copy_into(n->device, view_row(nbi_multi_out_view(n, out, nc + j), t), res[nc + j]);
      nb_release(res[nc + j]);
    }
    for (int k = 0; k < nc && owned; k++)
      nb_release(cur[k]);
    put(cur, res, nc);
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
  ctl *c = xcalloc(fn, 1, sizeof *c, &st);
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
  in = xcalloc(fn, (size_t)n_in, sizeof *in, &st);
  if (!st) {
    in[0] = pred;
    put(in + 1, ops, n_ops);
    put(in + 1 + n_ops, capt[0], nt[0]);
    put(in + 1 + n_ops + nt[0], capt[1], nt[1]);
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
  ctl *c = xcalloc(fn, 1, sizeof *c, &st);
  if (st) return st;
  nb_tensor **capt[2] = {NULL, NULL}, **in = NULL;
  int nt[2] = {0, 0};
  c->n_ops = n;
  nb_shape *s = xcalloc(fn, (size_t)n, sizeof *s, &st);
  nb_dtype *d = xcalloc(fn, (size_t)n, sizeof *d, &st);
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
  in = xcalloc(fn, (size_t)n_in, sizeof *in, &st);
  if (!st) {
    put(in, init, n);
    put(in + n, capt[0], nt[0]);
    put(in + n + nt[0], capt[1], nt[1]);
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
                     "n_xs >= 1, body outputs >= n_carry)",
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
  ctl *c = xcalloc(fn, 1, sizeof *c, &st);
  if (st) return st;
  *c = (ctl){.n_ops = n_carry, .n_xs = n_xs, .reverse = reverse, .T = T};
  nb_tensor **capt = NULL, **in = NULL, **outs = NULL;
  int nt = 0;
  nb_shape *s = xcalloc(fn, (size_t)(n_in_body + n_out), sizeof *s, &st);
  nb_dtype *d = xcalloc(fn, (size_t)(n_in_body + n_out), sizeof *d, &st);
  for (int k = 0; k < n_in_body && !st; k++) {
    nb_tensor *t = k < n_carry ? init[k] : xs[k - n_carry];
    s[k] = k < n_carry ? t->shape : row_shape(&t->shape);
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
  in = xcalloc(fn, (size_t)n_in, sizeof *in, &st);
  outs = xcalloc(fn, (size_t)n_out, sizeof *outs, &st);
  if (!st) {
    put(in, init, n_carry);
    put(in + n_carry, xs, n_xs);
    put(in + n_in_body, capt, nt);
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

/* ---- adapters: a function that reorders the arguments of another --------------------------
 * Inner input k is outer input in[k].idx (A_ARG) or a tensor the adapter holds
 * (A_HELD: an operand of the primal op, a zero, a batched capture); held
 * tensors become captures of the trace that uses the adapter. Outer output j
 * is inner output out[j].idx (A_OUT), an outer input (A_ARG) or a held tensor,
 * plus outer input out[j].plus when that is >= 0 (accumulators). */
enum { A_ARG, A_HELD, A_OUT };
typedef struct asrc {
  int kind, idx, plus;
} asrc;

typedef struct adapt {
  nb_fn *f;
  asrc *in;  /* [f->n_in] */
  asrc *out; /* [n_out], up to cap_out */
  nb_tensor **held;
  int n_out, cap_out, n_held, cap_held;
  bool bad; /* a held tensor failed to build: the error is recorded */
} adapt;

static void adapt_destroy(void *p) {
  adapt *a = p;
  if (!a) return;
  nb_fn_release(a->f);
  for (int i = 0; i < a->n_held; i++)
    nb_release(a->held[i]);
  free(a->in);
  free(a->out);
  free(a->held);
  free(a);
}

/* Takes over the caller's reference to f (NULL: an error is recorded). */
static adapt *adapt_new(const char *fn, nb_fn *f, int cap_out, int cap_held) {
  if (!f) return NULL;
  adapt *a = calloc(1, sizeof *a);
  if (a) {
    *a = (adapt){.f = f, .cap_out = cap_out, .cap_held = cap_held};
    a->in = calloc((size_t)f->n_in + 1, sizeof *a->in);
    a->out = calloc((size_t)cap_out + 1, sizeof *a->out);
    a->held = calloc((size_t)cap_held + 1, sizeof *a->held);
  }
  if (!a || !a->in || !a->out || !a->held) {
    if (a)
      adapt_destroy(a);
    else
      nb_fn_release(f);
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  for (int k = 0; k < f->n_in; k++)
    a->in[k].kind = -1;
  return a;
}

static int a_hold(adapt *a, nb_tensor *t) {
  if (!t || a->n_held == a->cap_held) {
    a->bad = true;
    return 0;
  }
  a->held[a->n_held] = nb_retain(t);
  return a->n_held++;
}

static void a_in(adapt *a, int k, int outer) { a->in[k] = (asrc){A_ARG, outer, -1}; }
static void a_in_held(adapt *a, int k, nb_tensor *t) {
  a->in[k] = (asrc){A_HELD, a_hold(a, t), -1};
}
static void a_out(adapt *a, int kind, int idx, int plus) {
  if (a->n_out == a->cap_out)
    a->bad = true;
  else
    a->out[a->n_out++] = (asrc){kind, idx, plus};
}

static nb_status adapt_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_in;
  const adapt *a = user;
  nb_status st = NB_OK;
  nb_tensor **x = xcalloc("nb_call", (size_t)(a->f->n_in + a->f->n_out), sizeof *x, &st);
  if (st) return st;
  nb_tensor **y = x + a->f->n_in;
  for (int k = 0; k < a->f->n_in; k++)
    x[k] = a->in[k].kind == A_ARG ? in[a->in[k].idx] : a->held[a->in[k].idx];
  st = nb_call(a->f, x, y);
  for (int j = 0; j < n_out && !st; j++) {
    asrc o = a->out[j];
    nb_tensor *v = o.kind == A_OUT ? y[o.idx] : o.kind == A_ARG ? in[o.idx] : a->held[o.idx];
    if (o.plus >= 0) v = nb_add(v, in[o.plus]);
    if (!(out[j] = v)) st = nb_last_status();
  }
  free(x);
  return st;
}

/* The adapter as an nb_fn of n_in inputs (consumes a). */
static nb_fn *adapt_fn(const char *fn, adapt *a, int n_in) {
  if (!a) return NULL;
  bool unset = false;
  for (int k = 0; k < a->f->n_in; k++)
    unset |= a->in[k].kind < 0;
  if (a->bad || unset || a->n_out == 0) {
    if (!nb_last_status())
      nbi_error(NB_ERR_INTERNAL, "%s: an adapter was built inconsistently", fn);
    adapt_destroy(a);
    return NULL;
  }
  return nbi_fn_make(fn, adapt_body, a, adapt_destroy, n_in, a->n_out);
}

/* Program P as a function (NBI_XF_PLAIN), or its nb_vjp_fn / nb_jvp_fn. */
static nb_fn *prog_fn(const char *fn, nbi_program *P, int kind) {
  return nbi_program_xform(fn, P, kind, NULL, NULL, 0);
}

/* nb_vmap(f) mapping axis 0 of the batched inputs (consumes f); f itself
 * when no input is batched. */
static nb_fn *vmapped(nb_fn *f, const bool *batched) {
  if (!f) return NULL;
  bool any = false;
  int local[16], *ax = f->n_in <= 16 ? local : malloc(sizeof *ax * (size_t)f->n_in);
  if (!ax) {
    nb_fn_release(f);
    nbi_error(NB_ERR_OOM, "nb_vmap: out of memory");
    return NULL;
  }
  for (int k = 0; k < f->n_in; k++)
    ax[k] = batched[k] ? 0 : NB_NOT_MAPPED, any |= batched[k];
  nb_fn *v = any ? nb_vmap(f, ax, NULL) : nb_fn_retain(f);
  nb_fn_release(f);
  if (ax != local) free(ax);
  return v;
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
  adapt *a = adapt_new(fn, nb_fn_retain(body), n, 0);
  if (!a) return nb_last_status();
  a_in(a, 0, n);
  for (int k = 0; k < n; k++)
    a_in(a, 1 + k, k), a_out(a, A_OUT, k, -1);
  nb_fn *step = adapt_fn(fn, a, n + 1);
  nb_tensor *idx = nb_arange((double)lower, (double)upper, 1, NB_I64);
  st = step && idx ? nb_scan(step, init, n, &idx, 1, false, out, NULL) : nb_last_status();
  nb_fn_release(step);
  return st;
}

/* ---- cond rules ----------------------------------------------------------------------------
 * The rules run a new cond on the same pred whose branches are the transformed
 * branches. Its operands: every operand of the primal pack but pred (ops, then
 * captures, else captures), then the given tangents / cotangents. A branch
 * reads its own ops and captures; the other branch's captures get zero
 * cotangents from it. */
static nb_status cond_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin) {
  const char *fn = "nb_cond";
  const ctl *c = ctl_of(p);
  int no = c->m.n_out, nops = c->n_ops, nb = p->n_in - 1, n = nb, n_res = 0;
  nb_status st = NB_OK;
  nb_tensor **ops = xcalloc(fn, (size_t)(nb + no), sizeof *ops, &st);
  nb_tensor **res = xcalloc(fn, (size_t)p->n_in, sizeof *res, &st);
  int *gpos = xcalloc(fn, (size_t)no, sizeof *gpos, &st);
  nb_fn *br[2] = {NULL, NULL};
  if (st) goto done;
  put(ops, p->in + 1, nb);
  for (int j = 0; j < no; j++)
    if (gys[j]) gpos[j] = n, ops[n++] = gys[j];
  for (int k = 1; k < p->n_in; k++)
    n_res += need[k];
  for (int b = 0; b < 2 && !st; b++) {
    /* vjp of branch b: (ops, captures, cotangents) -> (outputs, g ops, g captures) */
    int base = capt_base(p, b) - 1, nt = c->n_capt[b];
    adapt *a = adapt_new(fn, prog_fn(fn, c->prog[b], NBI_XF_VJP), n_res, no + p->n_in);
    if (!a) {
      st = nb_last_status();
      break;
    }
    for (int k = 0; k < nops; k++)
      a_in(a, k, k);
    for (int i = 0; i < nt; i++)
      a_in(a, nops + i, base + i);
    for (int j = 0; j < no; j++) {
      if (gys[j])
        a_in(a, nops + nt + j, gpos[j]);
      else
        a_in_held(a, nops + nt + j, nbi_zeros_of(&c->m.shape[j], c->m.dtype[j]));
    }
    for (int k = 1; k < p->n_in; k++) {
      if (!need[k]) continue;
      int o = k - 1; /* operand index */
      if (o < nops)
        a_out(a, A_OUT, no + o, -1);
      else if (o >= base && o < base + nt)
        a_out(a, A_OUT, no + nops + (o - base), -1);
      else
        a_out(a, A_HELD, a_hold(a, nbi_zeros_like(p->in[k])), -1);
    }
    if (!(br[b] = adapt_fn(fn, a, n))) st = nb_last_status();
  }
  if (!st) st = nb_cond(p->in[0], br[0], br[1], ops, n, res);
  for (int k = 1, r = 0; k < p->n_in && !st; k++)
    if (need[k]) gin[k] = res[r++];
done:
  nb_fn_release(br[0]);
  nb_fn_release(br[1]);
  free(ops);
  free(res);
  free(gpos);
  return st;
}

static nb_status cond_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts) {
  const char *fn = "nb_cond";
  const ctl *c = ctl_of(p);
  int no = c->m.n_out, nops = c->n_ops, nb = p->n_in - 1, n = nb, n_res = 0;
  nb_status st = NB_OK;
  nb_tensor **ops = xcalloc(fn, (size_t)(2 * nb), sizeof *ops, &st);
  nb_tensor **res = xcalloc(fn, (size_t)no, sizeof *res, &st);
  int *tpos = xcalloc(fn, (size_t)nb, sizeof *tpos, &st);
  nb_fn *br[2] = {NULL, NULL};
  if (st) goto done;
  put(ops, p->in + 1, nb);
  for (int o = 0; o < nb; o++)
    if (tin[1 + o]) tpos[o] = n, ops[n++] = tin[1 + o];
  for (int j = 0; j < no; j++)
    n_res += nb_dtype_is_float(c->m.dtype[j]);
  if (!n_res) goto done; /* only integer outputs: no tangents */
  for (int b = 0; b < 2 && !st; b++) {
    /* jvp of branch b: (ops, captures, their tangents) -> (outputs, tangents) */
    int base = capt_base(p, b) - 1, nt = c->n_capt[b], ni = nops + nt;
    adapt *a = adapt_new(fn, prog_fn(fn, c->prog[b], NBI_XF_JVP), n_res, ni);
    if (!a) {
      st = nb_last_status();
      break;
    }
    for (int i = 0; i < ni; i++) {
      int o = i < nops ? i : base + (i - nops);
      a_in(a, i, o);
      if (tin[1 + o])
        a_in(a, ni + i, tpos[o]);
      else
        a_in_held(a, ni + i, nbi_zeros_like(p->in[1 + o]));
    }
    for (int j = 0; j < no; j++)
      if (nb_dtype_is_float(c->m.dtype[j])) a_out(a, A_OUT, no + j, -1);
    if (!(br[b] = adapt_fn(fn, a, n))) st = nb_last_status();
  }
  if (!st) st = nb_cond(p->in[0], br[0], br[1], ops, n, res);
  for (int j = 0, r = 0; j < no && !st; j++)
    if (nb_dtype_is_float(c->m.dtype[j])) touts[j] = res[r++];
done:
  nb_fn_release(br[0]);
  nb_fn_release(br[1]);
  free(ops);
  free(res);
  free(tpos);
  return st;
}

/* Unbatched pred: a cond of the vmapped branches. Batched pred: both vmapped
 * branches run on the whole batch and each example selects its branch's
 * outputs (nb_where), as jax.vmap of lax.cond. */
static nb_status cond_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                           nb_tensor **outs) {
  const char *fn = "nb_cond";
  const ctl *c = ctl_of(p);
  int no = c->m.n_out, nops = c->n_ops, nb = p->n_in - 1;
  nb_status st = NB_OK;
  nb_tensor **r = xcalloc(fn, (size_t)(2 * no), sizeof *r, &st);
  nb_fn *br[2] = {NULL, NULL};
  for (int b = 0; b < 2 && !st; b++) {
    /* branch b over every operand, vmapped over the batched ones */
    int base = capt_base(p, b) - 1, nt = c->n_capt[b];
    adapt *a = adapt_new(fn, prog_fn(fn, c->prog[b], NBI_XF_PLAIN), no, 0);
    if (!a) {
      st = nb_last_status();
      break;
    }
    for (int i = 0; i < nops + nt; i++)
      a_in(a, i, i < nops ? i : base + (i - nops));
    for (int j = 0; j < no; j++)
      a_out(a, A_OUT, j, -1);
    if (!(br[b] = vmapped(adapt_fn(fn, a, nb), batched + 1))) st = nb_last_status();
  }
  if (!st && !batched[0]) {
    st = nb_cond(bin[0], br[0], br[1], bin + 1, nb, outs);
  } else if (!st) {
    st = nb_call(br[0], bin + 1, r);
    if (!st) st = nb_call(br[1], bin + 1, r + no);
    for (int j = 0; j < no && !st; j++) {
      nb_tensor *m = mask_for(bin[0], B, c->m.shape[j].ndim);
      if (!(outs[j] = nb_where(m, r[j], r[no + j]))) st = nb_last_status();
    }
  }
  nb_fn_release(br[0]);
  nb_fn_release(br[1]);
  free(r);
  return st;
}

/* ---- while rules ---------------------------------------------------------------------------- */
static nb_status while_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin) {
  (void)p, (void)gys, (void)need, (void)gin;
  return nbi_error(NB_ERR_ARG, "nb_while_loop: reverse-mode differentiation needs a static trip "
                               "count; use nb_fori_loop or nb_scan");
}

/* A while over (carries, tangents of the float carries): the same cond, and
 * nb_jvp_fn of the body. */
static nb_status while_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts) {
  const char *fn = "nb_while_loop";
  const ctl *c = ctl_of(p);
  int n = c->n_ops, ncc = c->n_capt[0], ncb = c->n_capt[1], nf = 0;
  int cb0 = capt_base(p, 1);
  nb_status st = NB_OK;
  int *fc = xcalloc(fn, (size_t)n, sizeof *fc, &st); /* float carries */
  nb_tensor **init = xcalloc(fn, (size_t)(2 * n), sizeof *init, &st);
  nb_tensor **res = xcalloc(fn, (size_t)(2 * n), sizeof *res, &st);
  nb_fn *cf = NULL, *bf = NULL;
  if (st) goto done;
  for (int k = 0; k < n; k++)
    if (nb_dtype_is_float(p->in[k]->dtype)) fc[nf++] = k;
  if (!nf) goto done;
  put(init, p->in, n);
  for (int f = 0; f < nf && !st; f++)
    if (!(init[n + f] = tin[fc[f]] ? tin[fc[f]] : nbi_zeros_like(p->in[fc[f]])))
      st = nb_last_status();
  /* cond: (carries, tangents) -> cond(carries, captures) */
  adapt *a = st ? NULL : adapt_new(fn, prog_fn(fn, c->prog[0], NBI_XF_PLAIN), 1, ncc);
  if (a) {
    for (int k = 0; k < n; k++)
      a_in(a, k, k);
    for (int i = 0; i < ncc; i++)
      a_in_held(a, n + i, p->in[n + i]);
    a_out(a, A_OUT, 0, -1);
  }
  if (!st && !(cf = adapt_fn(fn, a, n + nf))) st = nb_last_status();
  /* body: jvp of body over (carries, captures; their tangents) */
  int ni = n + ncb;
  a = st ? NULL : adapt_new(fn, prog_fn(fn, c->prog[1], NBI_XF_JVP), n + nf, 2 * ni);
  if (a) {
    for (int k = 0; k < n; k++) {
      a_in(a, k, k);
      if (!nb_dtype_is_float(p->in[k]->dtype)) /* integer carries: zero (co)tangents */
        a_in_held(a, ni + k, nbi_zeros_like(p->in[k]));
    }
    for (int f = 0; f < nf; f++)
      a_in(a, ni + fc[f], n + f);
    for (int i = 0; i < ncb; i++) {
      nb_tensor *x = p->in[cb0 + i];
      a_in_held(a, n + i, x);
      a_in_held(a, ni + n + i, tin[cb0 + i] ? tin[cb0 + i] : nbi_zeros_like(x));
    }
    for (int k = 0; k < n; k++)
      a_out(a, A_OUT, k, -1);
    for (int f = 0; f < nf; f++)
      a_out(a, A_OUT, n + fc[f], -1);
  }
  if (!st && !(bf = adapt_fn(fn, a, n + nf))) st = nb_last_status();
  if (!st) st = nb_while_loop(cf, bf, init, n + nf, res);
  for (int f = 0; f < nf && !st; f++)
    touts[fc[f]] = res[n + f];
done:
  nb_fn_release(cf);
  nb_fn_release(bf);
  free(fc);
  free(init);
  free(res);
  return st;
}

/* Batched while: every carry is batched; the loop runs while any example's
 * predicate holds, and an example whose predicate is false keeps its carry
 * (body' = where(vmap(cond)(c), vmap(body)(c), c)). Captures enter the
 * vmapped functions as explicit inputs, batched or not. */
typedef struct wvm {
  int refs; /* shared by the cond and the body function */
  nb_fn *vcond, *vbody;
  nb_tensor **cc, **cb; /* captures of cond and body (batched values or not) */
  int n, ncc, ncb;
  int64_t B;
} wvm;

static void wvm_destroy(void *p) {
  wvm *w = p;
  if (--w->refs > 0) return;
  nb_fn_release(w->vcond);
  nb_fn_release(w->vbody);
  for (int i = 0; i < w->ncc && w->cc; i++)
    nb_release(w->cc[i]);
  for (int i = 0; i < w->ncb && w->cb; i++)
    nb_release(w->cb[i]);
  free(w->cc);
  free(w->cb);
  free(w);
}

/* vmap(cond)(c): the batched predicate (B, 1..). */
static nb_tensor *wvm_pred(const wvm *w, nb_tensor *const *c) {
  nb_status st = NB_OK;
  nb_tensor **x = xcalloc("nb_while_loop", (size_t)(w->n + w->ncc), sizeof *x, &st), *m = NULL;
  if (st) return NULL;
  put(x, c, w->n);
  put(x + w->n, w->cc, w->ncc);
  if (nb_call(w->vcond, x, &m)) m = NULL;
  free(x);
  return m;
}

static nb_status wvm_cond_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *m = wvm_pred(user, in);
  out[0] = m ? nb_any(m, NB_ALL, false) : NULL;
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status wvm_body_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)n_in, (void)n_out;
  const wvm *w = user;
  nb_tensor *m = wvm_pred(w, in);
  nb_status st = m ? NB_OK : nb_last_status();
  nb_tensor **x = xcalloc("nb_while_loop", (size_t)(2 * w->n + w->ncb), sizeof *x, &st);
  if (st) return st;
  nb_tensor **y = x + w->n + w->ncb;
  put(x, in, w->n);
  put(x + w->n, w->cb, w->ncb);
  st = nb_call(w->vbody, x, y);
  for (int k = 0; k < w->n && !st; k++)
    if (!(out[k] = nb_where(mask_for(m, w->B, in[k]->shape.ndim - 1), y[k], in[k])))
      st = nb_last_status();
  free(x);
  return st;
}

static nb_status while_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                            nb_tensor **outs) {
  const char *fn = "nb_while_loop";
  const ctl *c = ctl_of(p);
  int n = c->n_ops, ncc = c->n_capt[0], ncb = c->n_capt[1], cb0 = capt_base(p, 1);
  nb_status st = NB_OK;
  wvm *w = xcalloc(fn, 1, sizeof *w, &st);
  nb_tensor **init = xcalloc(fn, (size_t)n, sizeof *init, &st);
  bool *bat = xcalloc(fn, (size_t)(n + ncc + ncb), sizeof *bat, &st);
  nb_fn *cf = NULL, *bf = NULL;
  if (w) {
    *w = (wvm){.refs = 1, .n = n, .ncc = ncc, .ncb = ncb, .B = B};
    w->cc = xcalloc(fn, (size_t)ncc, sizeof *w->cc, &st);
    w->cb = xcalloc(fn, (size_t)ncb, sizeof *w->cb, &st);
  }
  for (int k = 0; k < n && !st; k++) {
    if (!(init[k] = nbi_bat_expand(bin[k], batched[k], B))) st = nb_last_status();
    bat[k] = true;
  }
  for (int i = 0; i < ncc && !st; i++)
    w->cc[i] = nb_retain(bin[n + i]), bat[n + i] = batched[n + i];
  if (!st && !(w->vcond = vmapped(prog_fn(fn, c->prog[0], NBI_XF_PLAIN), bat)))
    st = nb_last_status();
  for (int i = 0; i < ncb && !st; i++)
    w->cb[i] = nb_retain(bin[cb0 + i]), bat[n + i] = batched[cb0 + i];
  if (!st && !(w->vbody = vmapped(prog_fn(fn, c->prog[1], NBI_XF_PLAIN), bat)))
    st = nb_last_status();
  if (!st) { /* each function holds a reference to w; ours goes at the end */
    w->refs++;
    if (!(cf = nbi_fn_make(fn, wvm_cond_body, w, wvm_destroy, n, 1))) st = nb_last_status();
  }
  if (!st) {
    w->refs++;
    if (!(bf = nbi_fn_make(fn, wvm_body_body, w, wvm_destroy, n, n))) st = nb_last_status();
  }
  if (!st) st = nb_while_loop(cf, bf, init, n, outs);
  nb_fn_release(cf);
  nb_fn_release(bf);
  if (w) wvm_destroy(w);
  free(init);
  free(bat);
  return st;
}

/* ---- scan rules ----------------------------------------------------------------------------- */
/* A scan over (carries, tangents of the float carries) and (xs, the given
 * tangents of the xs): its body is nb_jvp_fn of the step. */
static nb_status scan_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts) {
  const char *fn = "nb_scan";
  const ctl *c = ctl_of(p);
  int nc = c->n_ops, nx = c->n_xs, ncap = c->n_capt[0], no = c->m.n_out, ny = no - nc;
  int ni = nc + nx + ncap, nfc = 0, ntx = 0, nfy = 0;
  nb_status st = NB_OK;
  int *fc = xcalloc(fn, (size_t)nc, sizeof *fc, &st); /* float carries */
  int *fy = xcalloc(fn, (size_t)ny, sizeof *fy, &st); /* float ys */
  int *tx = xcalloc(fn, (size_t)nx, sizeof *tx, &st); /* xs with a tangent */
  nb_tensor **init = xcalloc(fn, (size_t)(2 * nc), sizeof *init, &st);
  nb_tensor **xs = xcalloc(fn, (size_t)(2 * nx), sizeof *xs, &st);
  nb_tensor **co = xcalloc(fn, (size_t)(2 * nc), sizeof *co, &st);
  nb_tensor **ys = xcalloc(fn, (size_t)(2 * ny), sizeof *ys, &st);
  nb_fn *step = NULL;
  if (st) goto done;
  for (int k = 0; k < nc; k++)
    if (nb_dtype_is_float(c->m.dtype[k])) fc[nfc++] = k;
  for (int j = 0; j < ny; j++)
    if (nb_dtype_is_float(c->m.dtype[nc + j])) fy[nfy++] = j;
  for (int k = 0; k < nx; k++)
    if (tin[nc + k]) tx[ntx++] = k;
  if (!nfc && !nfy) goto done;
  put(init, p->in, nc);
  for (int f = 0; f < nfc && !st; f++)
    if (!(init[nc + f] = tin[fc[f]] ? tin[fc[f]] : nbi_zeros_like(p->in[fc[f]])))
      st = nb_last_status();
  put(xs, p->in + nc, nx);
  for (int i = 0; i < ntx; i++)
    xs[nx + i] = tin[nc + tx[i]];
  /* step: (c[nc], tc[nfc], x[nx], tx[ntx]) -> (c', tc'[float], y, ty[float]) */
  adapt *a = st ? NULL : adapt_new(fn, prog_fn(fn, c->prog[0], NBI_XF_JVP), 2 * no, 2 * ni);
  if (a) {
    int xo = nc + nfc; /* outer index of x[0] */
    for (int k = 0; k < nc; k++) {
      a_in(a, k, k);
      if (!nb_dtype_is_float(p->in[k]->dtype)) /* integer carries: zero (co)tangents */
        a_in_held(a, ni + k, nbi_zeros_like(p->in[k]));
    }
    for (int f = 0; f < nfc; f++)
      a_in(a, ni + fc[f], nc + f);
    for (int k = 0; k < nx; k++) {
      nb_shape rs = row_shape(&p->in[nc + k]->shape);
      a_in(a, nc + k, xo + k);
      a_in_held(a, ni + nc + k, nbi_zeros_of(&rs, p->in[nc + k]->dtype));
    }
    for (int i = 0; i < ntx; i++)
      a_in(a, ni + nc + tx[i], xo + nx + i);
    for (int i = 0; i < ncap; i++) {
      nb_tensor *x = p->in[nc + nx + i], *t = tin[nc + nx + i];
      a_in_held(a, nc + nx + i, x);
      a_in_held(a, ni + nc + nx + i, t ? t : nbi_zeros_like(x));
    }
    for (int k = 0; k < nc; k++)
      a_out(a, A_OUT, k, -1);
    for (int f = 0; f < nfc; f++)
      a_out(a, A_OUT, no + fc[f], -1);
    for (int j = 0; j < ny; j++)
      a_out(a, A_OUT, nc + j, -1);
    for (int f = 0; f < nfy; f++)
      a_out(a, A_OUT, no + nc + fy[f], -1);
  }
  if (!st && !(step = adapt_fn(fn, a, nc + nfc + nx + ntx))) st = nb_last_status();
  if (!st) st = nb_scan(step, init, nc + nfc, xs, nx + ntx, c->reverse, co, ys);
  for (int f = 0; f < nfc && !st; f++)
    touts[fc[f]] = co[nc + f];
  for (int f = 0; f < nfy && !st; f++)
    touts[nc + fy[f]] = ys[ny + f];
done:
  nb_fn_release(step);
  free(fc);
  free(fy);
  free(tx);
  free(init);
  free(xs);
  free(co);
  free(ys);
  return st;
}

/* Reverse mode, in two scans:
 * 1. a forward scan of the step that also emits its input carry as a y: the
 *    carry entering every step, stacked (the primal scan did not keep them,
 *    so the backward recomputes the forward scan once);
 * 2. a scan in the opposite direction over (those carries, the xs, the ys'
 *    cotangents) whose step applies nb_vjp_fn of the step at (carry_t, x_t) to
 *    (g carry, g y_t): it carries g carry and the running sum of the captured
 *    operands' cotangents, and emits g x_t. */
static nb_status scan_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin) {
  const char *fn = "nb_scan";
  const ctl *c = ctl_of(p);
  int nc = c->n_ops, nx = c->n_xs, ncap = c->n_capt[0], no = c->m.n_out, ny = no - nc;
  int cap0 = nc + nx, ni = nc + nx + ncap, nfc = 0, nac = 0, nxn = 0, ngy = 0;
  nb_status st = NB_OK;
  int *fc = xcalloc(fn, (size_t)nc, sizeof *fc, &st);   /* float carries */
  int *ac = xcalloc(fn, (size_t)ncap, sizeof *ac, &st); /* captures needing a cotangent */
  int *xn = xcalloc(fn, (size_t)nx, sizeof *xn, &st);   /* xs needing a cotangent */
  int *gy = xcalloc(fn, (size_t)ny, sizeof *gy, &st);   /* ys with a cotangent */
  nb_tensor **C = xcalloc(fn, (size_t)(2 * nc), sizeof *C, &st), **co = C + nc;
  nb_tensor **binit = xcalloc(fn, (size_t)(nc + ncap), sizeof *binit, &st);
  nb_tensor **bxs = xcalloc(fn, (size_t)(nc + nx + ny), sizeof *bxs, &st);
  nb_tensor **bco = xcalloc(fn, (size_t)(nc + ncap), sizeof *bco, &st);
  nb_tensor **bys = xcalloc(fn, (size_t)nx, sizeof *bys, &st);
  nb_fn *aug = NULL, *bwd = NULL;
  if (st) goto done;
  for (int k = 0; k < nc; k++)
    if (nb_dtype_is_float(c->m.dtype[k])) fc[nfc++] = k;
  for (int i = 0; i < ncap; i++)
    if (need[cap0 + i]) ac[nac++] = i;
  for (int k = 0; k < nx; k++)
    if (need[nc + k]) xn[nxn++] = k;
  for (int j = 0; j < ny; j++)
    if (gys[nc + j] && nb_dtype_is_float(c->m.dtype[nc + j])) gy[ngy++] = j;
  if (nfc + nac + nxn == 0) goto done;

  /* 1. the carries entering each step: (c, x) -> (c', c) */
  if (nc > 0) {
    adapt *a = adapt_new(fn, prog_fn(fn, c->prog[0], NBI_XF_PLAIN), 2 * nc, ncap);
    if (a) {
      for (int k = 0; k < nc + nx; k++)
        a_in(a, k, k);
      for (int i = 0; i < ncap; i++)
        a_in_held(a, cap0 + i, p->in[cap0 + i]);
      for (int k = 0; k < nc; k++)
        a_out(a, A_OUT, k, -1);
      for (int k = 0; k < nc; k++)
        a_out(a, A_ARG, k, -1);
    }
    if (!(aug = adapt_fn(fn, a, nc + nx))) st = nb_last_status();
    if (!st) st = nb_scan(aug, p->in, nc, p->in + nc, nx, c->reverse, co, C);
    if (st) goto done;
  }

  /* 2. backward: carries (g c[nfc], acc[nac]), xs (C[nc], x[nx], g y[ngy]) ->
   *    (g c_in[nfc], acc + g capt[nac]), ys (g x[nxn]) */
  int go = nfc, xo = nfc + nac; /* outer index of acc[0], C[0] */
  adapt *a = adapt_new(fn, prog_fn(fn, c->prog[0], NBI_XF_VJP), nfc + nac + nxn, ni + no);
  if (a) {
    for (int k = 0; k < nc; k++) {
      a_in(a, k, xo + k);
      if (!nb_dtype_is_float(p->in[k]->dtype)) /* integer carries: zero (co)tangents */
        a_in_held(a, ni + k, nbi_zeros_like(p->in[k]));
    }
    for (int f = 0; f < nfc; f++)
      a_in(a, ni + fc[f], f);
    for (int k = 0; k < nx; k++)
      a_in(a, nc + k, xo + nc + k);
    for (int i = 0; i < ncap; i++)
      a_in_held(a, cap0 + i, p->in[cap0 + i]);
    for (int j = 0; j < ny; j++) {
      nb_shape rs = row_shape(&c->m.shape[nc + j]);
      a_in_held(a, ni + nc + j, nbi_zeros_of(&rs, c->m.dtype[nc + j]));
    }
    for (int i = 0; i < ngy; i++)
      a_in(a, ni + nc + gy[i], xo + nc + nx + i);
    /* inner outputs: c'[nc], y[ny], g c[nc], g x[nx], g capt[ncap] */
    for (int f = 0; f < nfc; f++)
      a_out(a, A_OUT, no + fc[f], -1);
    for (int i = 0; i < nac; i++)
      a_out(a, A_OUT, no + nc + nx + ac[i], go + i);
    for (int i = 0; i < nxn; i++)
      a_out(a, A_OUT, no + nc + xn[i], -1);
  }
  if (!(bwd = adapt_fn(fn, a, nfc + nac + nc + nx + ngy))) st = nb_last_status();
  for (int f = 0; f < nfc && !st; f++) {
    nb_tensor *g = gys[fc[f]];
    if (!(binit[f] = g ? g : nbi_zeros_like(p->in[fc[f]]))) st = nb_last_status();
  }
  for (int i = 0; i < nac && !st; i++)
    if (!(binit[nfc + i] = nbi_zeros_like(p->in[cap0 + ac[i]]))) st = nb_last_status();
  if (st) goto done;
  put(bxs, C, nc);
  put(bxs + nc, p->in + nc, nx);
  for (int i = 0; i < ngy; i++)
    bxs[nc + nx + i] = gys[nc + gy[i]];
  st = nb_scan(bwd, binit, nfc + nac, bxs, nc + nx + ngy, !c->reverse, bco, bys);
  for (int f = 0; f < nfc && !st; f++)
    if (need[fc[f]]) gin[fc[f]] = bco[f];
  for (int i = 0; i < nac && !st; i++)
    gin[cap0 + ac[i]] = bco[nfc + i];
  for (int i = 0; i < nxn && !st; i++)
    gin[nc + xn[i]] = bys[i];
done:
  nb_fn_release(aug);
  nb_fn_release(bwd);
  free(fc);
  free(ac);
  free(xn);
  free(gy);
  free(C);
  free(binit);
  free(bxs);
  free(bco);
  free(bys);
  return st;
}

/* The step vmapped (carries batched; xs and captures as they come), over xs
 * whose batch axis moves to 1 (the scan runs over axis 0): ys come out
 * (T, B, ...) and go back to (B, T, ...). */
static nb_status scan_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                           nb_tensor **outs) {
  const char *fn = "nb_scan";
  const ctl *c = ctl_of(p);
  int nc = c->n_ops, nx = c->n_xs, ncap = c->n_capt[0], no = c->m.n_out, ny = no - nc;
  int cap0 = nc + nx, ni = cap0 + ncap;
  nb_status st = NB_OK;
  bool *bat = xcalloc(fn, (size_t)ni, sizeof *bat, &st);
  nb_tensor **in = xcalloc(fn, (size_t)(nc + nx), sizeof *in, &st);
  nb_tensor **ys = xcalloc(fn, (size_t)ny, sizeof *ys, &st);
  nb_fn *step = NULL;
  if (st) goto done;
  for (int k = 0; k < nc && !st; k++) {
    bat[k] = true;
    if (!(in[k] = nbi_bat_expand(bin[k], batched[k], B))) st = nb_last_status();
  }
  for (int k = nc; k < ni && !st; k++) {
    bat[k] = batched[k];
    if (k < cap0 && !(in[k] = batched[k] ? nbi_bat_moveaxis(bin[k], 0, 1) : bin[k]))
      st = nb_last_status();
  }
  adapt *a =
      st ? NULL : adapt_new(fn, vmapped(prog_fn(fn, c->prog[0], NBI_XF_PLAIN), bat), no, ncap);
  if (a) {
    for (int k = 0; k < cap0; k++)
      a_in(a, k, k);
    for (int i = 0; i < ncap; i++)
      a_in_held(a, cap0 + i, bin[cap0 + i]);
    for (int j = 0; j < no; j++)
      a_out(a, A_OUT, j, -1);
  }
  if (!st && !(step = adapt_fn(fn, a, cap0))) st = nb_last_status();
  if (!st) st = nb_scan(step, in, nc, in + nc, nx, c->reverse, outs, ys);
  for (int j = 0; j < ny && !st; j++)
    if (!(outs[nc + j] = nbi_bat_moveaxis(ys[j], 1, 0))) st = nb_last_status();
done:
  nb_fn_release(step);
  free(bat);
  free(in);
  free(ys);
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
                                   .vjp_multi = cond_vjp,
                                   .jvp_multi = cond_jvp,
                                   .vmap_multi = cond_vmap,
                                   .programs = ctl_programs2};
const nbi_op_def nbi_opdef_WHILE = {.name = "while_loop",
                                    .arity = -1,
                                    .exec = while_exec,
                                    .flags = NBI_OPF_MULTI,
                                    .vjp_multi = while_vjp,
                                    .jvp_multi = while_jvp,
                                    .vmap_multi = while_vmap,
                                    .programs = ctl_programs2};
const nbi_op_def nbi_opdef_SCAN = {.name = "scan",
                                   .arity = -1,
                                   .exec = scan_exec,
                                   .flags = NBI_OPF_MULTI,
                                   .vjp_multi = scan_vjp,
                                   .jvp_multi = scan_jvp,
                                   .vmap_multi = scan_vmap,
                                   .programs = ctl_programs1};
