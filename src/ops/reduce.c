/* src/ops/reduce.c — reductions: sum mean prod max min var std logsumexp any
 * all argmax argmin, and softmax, log_softmax, cumsum along one axis. Every op
 * is one primitive node with its own CPU kernel (src/backends/cpu/k_reduce.c);
 * their VJP/JVP rules (argmax, argmin, any, all are NONDIFF) and batching
 * rules (the same node with its axes moved past the batch dim) close the file.
 *
 * Semantics (NumPy / JAX):
 * - Axes: NB_ALL (n = -1) reduces every axis; negative axes count from the end;
 *   an axis out of range or given twice is NB_ERR_AXIS. NB_NO_AXES reduces
 *   nothing (each element is reduced alone, in the result dtype; var is 0).
 *   A 0-d input with NB_ALL or NB_NO_AXES gives its value. keepdims keeps the
 *   reduced axes as size 1. argmax/argmin/softmax/log_softmax/cumsum take one
 *   axis, which must exist (a 0-d input has none).
 * - Dtypes (JAX): sum/prod/cumsum keep the dtype, bool gives i32, and u8, i8,
 *   i16 give i64 (PyTorch's rule for them); integers accumulate in int64 and
 *   wrap to the result width. f16/bf16 and f32 accumulate in
 *   double. mean/var/std/logsumexp/softmax/log_softmax keep float dtypes and
 *   give f32 for i32/i64/bool (computed as if cast to f32 first, except that
 *   mean sums integers exactly). max/min keep the dtype (bool included);
 *   any/all give bool (NaN counts as true); argmax/argmin give i64, the first
 *   occurrence of the extreme, NaN counting as the extreme (NumPy); cumsum keeps
 *   the dtype, bool gives i32.
 * - Empty reductions: sum 0, prod 1, mean/var/std NaN, logsumexp -inf, any
 *   false, all true. max/min/argmax/argmin over a zero-size axis have no
 *   identity: NB_ERR_SHAPE at call time, even when the result is empty (JAX).
 * - NaN: max/min/var/std/logsumexp propagate it; a NaN in a softmax row makes
 *   the whole row NaN.
 * - var/std: population (ddof 0), two passes (mean, then squared deviations).
 *   logsumexp: m + log(sum(exp(x - m))), m the max (a non-finite m is the
 *   result). softmax/log_softmax are max-shifted, so logits of any size are safe.
 *
 * Attribute slots: reductions i[0] = bitmask of the reduced input axes;
 * REDUCE_SUM f[0] = divisor (1 for sum, the reduced count for mean);
 * REDUCE_VAR i[1] = 1 for std. SOFTMAX, LOG_SOFTMAX, CUMSUM i[0] = the axis
 * (normalized).
 */
#include "../core/nbi.h"
#include "../core/oprules.h"

#include "rule_util.h"

/* A validated reduction: output shape, reduced-axes attrs, reduced count. */
typedef struct reduction {
  nb_shape out;
  nbi_attrs at;
  double count; /* elements per output (double: exact, and no overflow when empty) */
} reduction;

/* Validates t and axes for fn and fills r. no_identity: a reduction over a
 * zero-size axis is an error (max, min, argmax, argmin). Returns false with
 * the error recorded. */
static bool reduction_check(const char *fn, nb_tensor *t, nb_axes axes, bool keepdims,
                            bool no_identity, reduction *r) {
  if (nbi_any_null(fn, (nb_tensor *[]){t}, 1)) return false;
  uint32_t mask;
  if (nbi_axes_mask(fn, axes, t->shape.ndim, &mask)) return false;
  *r = (reduction){.count = 1};
  r->at.i[0] = mask;
  for (int d = 0; d < t->shape.ndim; d++) {
    int64_t dim = t->shape.dims[d];
    if (!((mask >> d) & 1u)) {
      r->out.dims[r->out.ndim++] = dim;
      continue;
    }
    if (dim == 0 && no_identity) {
      char b[160];
      nbi_error(NB_ERR_SHAPE, "%s: zero-size reduction (axis %d of shape %s) has no identity", fn,
                d, nb_shape_str(t->shape, b, sizeof b));
      return false;
    }
    r->count *= (double)dim;
    if (keepdims) r->out.dims[r->out.ndim++] = 1;
  }
  return nbi_check_shape(fn, &r->out) == NB_OK;
}

static nb_dtype float_result(nb_dtype dt) { return nb_dtype_is_float(dt) ? dt : NB_F32; }
/* bool sums count in i32 (JAX); u8, i8 and i16 accumulate in i64 (PyTorch). */
static nb_dtype sum_result(nb_dtype dt) {
  return dt == NB_BOOL ? NB_I32 : dt == NB_U8 || dt == NB_I8 || dt == NB_I16 ? NB_I64 : dt;
}

static nb_tensor *record_reduction(int op, nb_dtype dt, nb_tensor *t, const reduction *r) {
  return nbi_record(op, dt, &r->out, &t, 1, &r->at);
}

nb_tensor *nb_sum(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_sum", t, axes, keepdims, false, &r)) return NULL;
  r.at.f[0] = 1;
  return record_reduction(NBI_OP_REDUCE_SUM, sum_result(t->dtype), t, &r);
}

nb_tensor *nb_mean(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_mean", t, axes, keepdims, false, &r)) return NULL;
  r.at.f[0] = r.count;
  return record_reduction(NBI_OP_REDUCE_SUM, float_result(t->dtype), t, &r);
}

nb_tensor *nb_prod(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_prod", t, axes, keepdims, false, &r)) return NULL;
  return record_reduction(NBI_OP_REDUCE_PROD, sum_result(t->dtype), t, &r);
}

nb_tensor *nb_max(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_max", t, axes, keepdims, true, &r)) return NULL;
  return record_reduction(NBI_OP_REDUCE_MAX, t->dtype, t, &r);
}

nb_tensor *nb_min(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_min", t, axes, keepdims, true, &r)) return NULL;
  return record_reduction(NBI_OP_REDUCE_MIN, t->dtype, t, &r);
}

nb_tensor *nb_var(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_var", t, axes, keepdims, false, &r)) return NULL;
  return record_reduction(NBI_OP_REDUCE_VAR, float_result(t->dtype), t, &r);
}

nb_tensor *nb_std(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_std", t, axes, keepdims, false, &r)) return NULL;
  r.at.i[1] = 1;
  return record_reduction(NBI_OP_REDUCE_VAR, float_result(t->dtype), t, &r);
}

nb_tensor *nb_logsumexp(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_logsumexp", t, axes, keepdims, false, &r)) return NULL;
  return record_reduction(NBI_OP_LOGSUMEXP, float_result(t->dtype), t, &r);
}

nb_tensor *nb_any(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_any", t, axes, keepdims, false, &r)) return NULL;
  return record_reduction(NBI_OP_REDUCE_ANY, NB_BOOL, t, &r);
}

nb_tensor *nb_all(nb_tensor *t, nb_axes axes, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_all", t, axes, keepdims, false, &r)) return NULL;
  return record_reduction(NBI_OP_REDUCE_ALL, NB_BOOL, t, &r);
}

nb_tensor *nb_argmax(nb_tensor *t, int axis, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_argmax", t, NB_AXES(axis), keepdims, true, &r)) return NULL;
  return record_reduction(NBI_OP_ARGMAX, NB_I64, t, &r);
}

nb_tensor *nb_argmin(nb_tensor *t, int axis, bool keepdims) {
  reduction r;
  if (!reduction_check("nb_argmin", t, NB_AXES(axis), keepdims, true, &r)) return NULL;
  return record_reduction(NBI_OP_ARGMIN, NB_I64, t, &r);
}

/* Validates t and axis for an op along one axis and records it with t's shape. */
static nb_tensor *record_along_axis(const char *fn, int op, nb_tensor *t, int axis,
                                    nb_dtype (*result)(nb_dtype)) {
  if (nbi_any_null(fn, (nb_tensor *[]){t}, 1)) return NULL;
  int a;
  if (nbi_norm_axis(fn, axis, t->shape.ndim, &a)) return NULL;
  nbi_attrs at = {0};
  at.i[0] = a;
  return nbi_record(op, result(t->dtype), &t->shape, &t, 1, &at);
}

nb_tensor *nb_softmax(nb_tensor *t, int axis) {
  return record_along_axis("nb_softmax", NBI_OP_SOFTMAX, t, axis, float_result);
}

nb_tensor *nb_log_softmax(nb_tensor *t, int axis) {
  return record_along_axis("nb_log_softmax", NBI_OP_LOG_SOFTMAX, t, axis, float_result);
}

nb_tensor *nb_cumsum(nb_tensor *t, int axis) {
  return record_along_axis("nb_cumsum", NBI_OP_CUMSUM, t, axis, sum_result);
}

/* ---- autodiff rules ------------------------------------------------------------
 * Written with public ops (nbi.h), so they differentiate again. For a reduction
 * y = r(x) over the axes of mask i[0], y has x's shape without those axes, or
 * with them as size 1 when keepdims was given (then y has x's rank). Integer and
 * bool inputs have no cotangent (need[0] is false) and a zero tangent. For float
 * inputs y has x's dtype, so gy and the rules' results do too.
 *
 * prod: the derivative of y by x[i] is the product of the other reduced
 * elements, computed as an exclusive prefix product times an exclusive suffix
 * product (as JAX does), never as y / x[i]: exact where x holds zeros, and to
 * every order, since the scan is made of mul, pad, slice and flip.
 * max/min: the cotangent is split equally among the elements equal to the
 * result (JAX); the indicator of those is a constant (eq has no derivative).
 */

static nb_axes axes_of_mask(uint32_t mask, int ndim) {
  nb_axes a = {0};
  for (int d = 0; d < ndim; d++)
    if ((mask >> d) & 1u) a.v[a.n++] = d;
  return a;
}

/* A tangent (or other tensor) of x's shape reduced as y was: summed over y's
 * axes, with y's keepdims. t itself when no axis is reduced. */
static nb_tensor *sum_like(nb_tensor *t, const nb_tensor *y) {
  uint32_t mask = (uint32_t)y->attrs.i[0];
  if (!t || !mask) return t;
  return nb_sum(t, axes_of_mask(mask, y->in[0]->shape.ndim), y->shape.ndim == y->in[0]->shape.ndim);
}

/* g of y's shape, reshaped to x's rank with the reduced axes as size 1 (the
 * keepdims shape), so it broadcasts against x. */
static nb_tensor *with_kept_dims(nb_tensor *g, const nb_tensor *y) {
  const nb_tensor *x = y->in[0];
  if (!g || g->shape.ndim == x->shape.ndim) return g;
  nb_shape s = x->shape;
  for (int d = 0; d < s.ndim; d++)
    if ((y->attrs.i[0] >> d) & 1) s.dims[d] = 1;
  return nb_reshape(g, s);
}

/* g of y's shape broadcast back to x's shape. */
static nb_tensor *unreduce(nb_tensor *g, const nb_tensor *y) {
  nb_tensor *k = with_kept_dims(g, y);
  if (!k || nbi_shape_eq(&k->shape, &y->in[0]->shape)) return k;
  return nb_broadcast_to(k, y->in[0]->shape);
}

/* The status of a VJP rule that stored gin[0] (NULL: an op failed). */
static nb_status vjp_status(nb_tensor *const *gin) { return gin[0] ? NB_OK : nb_last_status(); }

/* The tangent input of a unary rule, or NULL when the tangent is zero (no
 * tangent, or an integer / bool input). */
static nb_tensor *float_tangent(const nb_tensor *y, nb_tensor *const *tin) {
  return nb_dtype_is_float(y->in[0]->dtype) ? tin[0] : NULL;
}

/* sum: y = sum(x) / f[0]. gx = broadcast(gy) / f[0]; ty = sum(tx) / f[0]. */
static nb_status sum_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  nb_tensor *g = unreduce(gy, y);
  gin[0] = nbi_grad_fit(y->attrs.f[0] == 1 ? g : nb_div_scalar(g, y->attrs.f[0]), y->in[0]);
  return vjp_status(gin);
}

static nb_tensor *sum_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor *t = float_tangent(y, tin);
  if (!t) return NULL;
  t = sum_like(t, y);
  return y->attrs.f[0] == 1 ? t : nb_div_scalar(t, y->attrs.f[0]);
}

/* e[:, j] = prod of z[:, i] for i < j (1 for j = 0). z: (M, n), n >= 2.
 * Hillis-Steele scan: log2(n) steps of e[:, j] *= e[:, j - k] (1 for j < k). */
static nb_tensor *exclusive_cumprod_rows(nb_tensor *z) {
  if (!z) return NULL;
  int64_t n = z->shape.dims[1];
  int64_t starts[2] = {0, 0}, stops[2] = {NB_END, n - 1}, pads[4] = {0, 0, 1, 0};
  nb_tensor *e = nb_pad(nb_slice(z, starts, stops, NULL), pads, 1);
  for (int64_t k = 1; k < n - 1; k *= 2) {
    stops[1] = n - k;
    pads[2] = k;
    e = nb_mul(e, nb_pad(nb_slice(e, starts, stops, NULL), pads, 1));
  }
  return e;
}

/* o (x's shape): o[i] = product of x over the reduced positions that share
 * i's kept coordinates, except i itself. The reduced axes move last and
 * flatten into one row of n elements per output element: (M, n). */
static nb_tensor *prod_of_others(nb_tensor *x, uint32_t mask) {
  int nd = x->shape.ndim;
  nb_axes perm = {.n = 0}, inv = {.n = nd};
  nb_shape ps = {.ndim = nd};
  int64_t m = 1, n = 1;
  for (int pass = 0; pass < 2; pass++)
    for (int d = 0; d < nd; d++) {
      bool reduced = (mask >> d) & 1u;
      if (reduced != (pass == 1)) continue;
      inv.v[d] = perm.n;
      ps.dims[perm.n] = x->shape.dims[d];
      perm.v[perm.n++] = d;
      *(reduced ? &n : &m) *= x->shape.dims[d];
    }
  if (n < 2) {
    nb_tensor *one = nb_scalar(1, x->dtype);
    return nd ? nb_broadcast_to(one, x->shape) : one;
  }
  bool moved = false;
  for (int d = 0; d < nd; d++)
    moved |= perm.v[d] != d;
  nb_tensor *z = nb_reshape(moved ? nb_permute(x, perm) : x, NB_SHAPE(m, n));
  if (!z) return NULL;
  nb_tensor *right = nb_flip(exclusive_cumprod_rows(nb_flip(z, NB_AXES(1))), NB_AXES(1));
  nb_tensor *o = nb_reshape(nb_mul(exclusive_cumprod_rows(z), right), ps);
  return moved ? nb_permute(o, inv) : o;
}

/* prod: gx = broadcast(gy) * others; ty = sum(tx * others). */
static nb_status prod_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  nb_tensor *o = prod_of_others(y->in[0], (uint32_t)y->attrs.i[0]);
  gin[0] = nbi_grad_fit(nb_mul(with_kept_dims(gy, y), o), y->in[0]);
  return vjp_status(gin);
}

static nb_tensor *prod_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor *t = float_tangent(y, tin);
  if (!t) return NULL;
  return sum_like(nb_mul(t, prod_of_others(y->in[0], (uint32_t)y->attrs.i[0])), y);
}

/* w (x's shape) = [x == y] / (number of such elements in x's reduced group):
 * how max/min share their derivative among ties. */
static nb_tensor *extreme_weights(nb_tensor *y) {
  nb_tensor *x = y->in[0];
  nb_tensor *ind = nb_cast(nb_eq(x, with_kept_dims(y, y)), x->dtype);
  return nb_div(ind, nb_sum(ind, axes_of_mask((uint32_t)y->attrs.i[0], x->shape.ndim), true));
}

/* max, min: gx = broadcast(gy) * w; ty = sum(tx * w). */
static nb_status extreme_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = nbi_grad_fit(nb_mul(with_kept_dims(gy, y), extreme_weights(y)), y->in[0]);
  return vjp_status(gin);
}

static nb_tensor *extreme_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor *t = float_tangent(y, tin);
  if (!t) return NULL;
  return sum_like(nb_mul(t, extreme_weights(y)), y);
}

/* var: y = mean((x - mu)^2) over groups of n elements, dy/dx = 2 (x - mu) / n.
 * std: y = sqrt(var), dy/dx = (x - mu) / (n y). The derivative of mu drops out
 * at first order, but the rules keep mu a function of x, so their own
 * derivatives (the Hessian 2/n (I - 1 1^T / n) of var) come out right. */

/* x - mean(x) over y's axes (x's shape), and the group size n. */
static nb_tensor *deviations(const nb_tensor *y, double *n) {
  nb_tensor *x = y->in[0];
  uint32_t mask = (uint32_t)y->attrs.i[0];
  *n = 1;
  for (int d = 0; d < x->shape.ndim; d++)
    if ((mask >> d) & 1u) *n *= (double)x->shape.dims[d];
  return nb_sub(x, nb_mean(x, axes_of_mask(mask, x->shape.ndim), true));
}

/* var/std: gx = dev * broadcast(gy * 2 / n) (var) or dev * broadcast(gy / (n y))
 * (std); ty = sum(tx * dev) * 2 / n (var) or sum(tx * dev) / (n y) (std). */
static nb_status var_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  double n;
  nb_tensor *dev = deviations(y, &n);
  nb_tensor *s = y->attrs.i[1] ? nb_div_scalar(nb_div(gy, y), n) : nb_mul_scalar(gy, 2 / n);
  gin[0] = nbi_grad_fit(nb_mul(dev, with_kept_dims(s, y)), y->in[0]);
  return vjp_status(gin);
}

static nb_tensor *var_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor *t = float_tangent(y, tin);
  if (!t) return NULL;
  double n;
  nb_tensor *s = sum_like(nb_mul(t, deviations(y, &n)), y);
  return y->attrs.i[1] ? nb_div(nb_div_scalar(s, n), y) : nb_mul_scalar(s, 2 / n);
}

/* logsumexp: dy/dx = p = exp(x - y). gx = broadcast(gy) * p; ty = sum(tx * p). */
static nb_tensor *lse_weights(nb_tensor *y) {
  return nb_exp(nb_sub(y->in[0], with_kept_dims(y, y)));
}

static nb_status lse_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = nbi_grad_fit(nb_mul(with_kept_dims(gy, y), lse_weights(y)), y->in[0]);
  return vjp_status(gin);
}

static nb_tensor *lse_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor *t = float_tangent(y, tin);
  if (!t) return NULL;
  return sum_like(nb_mul(t, lse_weights(y)), y);
}

/* softmax along axis i[0]: J = diag(y) - y y^T per row, symmetric, so both
 * directions are v -> y * (v - sum(v * y, axis)). */
static nb_tensor *softmax_apply(nb_tensor *y, nb_tensor *v) {
  nb_tensor *s = nb_sum(nb_mul(v, y), NB_AXES((int)y->attrs.i[0]), true);
  return nb_mul(y, nb_sub(v, s));
}

static nb_status softmax_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = nbi_grad_fit(softmax_apply(y, gy), y->in[0]);
  return vjp_status(gin);
}

static nb_tensor *softmax_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor *t = float_tangent(y, tin);
  return t ? softmax_apply(y, t) : NULL;
}

/* log_softmax along axis i[0]: y = x - logsumexp(x), J = I - 1 p^T per row with
 * p = exp(y). gx = gy - p * sum(gy, axis); ty = tx - sum(tx * p, axis). */
static nb_status log_softmax_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  nb_tensor *s = nb_sum(gy, NB_AXES((int)y->attrs.i[0]), true);
  gin[0] = nbi_grad_fit(nb_sub(gy, nb_mul(nb_exp(y), s)), y->in[0]);
  return vjp_status(gin);
}

static nb_tensor *log_softmax_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor *t = float_tangent(y, tin);
  if (!t) return NULL;
  return nb_sub(t, nb_sum(nb_mul(t, nb_exp(y)), NB_AXES((int)y->attrs.i[0]), true));
}

/* cumsum along axis i[0]: linear; its transpose is the reverse cumsum
 * gx = flip(cumsum(flip(gy))); ty = cumsum(tx). */
static nb_status cumsum_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  int a = (int)y->attrs.i[0];
  gin[0] = nbi_grad_fit(nb_flip(nb_cumsum(nb_flip(gy, NB_AXES(a)), a), NB_AXES(a)), y->in[0]);
  return vjp_status(gin);
}

static nb_tensor *cumsum_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor *t = float_tangent(y, tin);
  return t ? nb_cumsum(t, (int)y->attrs.i[0]) : NULL;
}

/* ---- batching rules --------------------------------------------------------------
 * The only input is batched, its batch dim first, so the batched node is the
 * same op on it with the same attrs (mean's divisor, std's flag) and its axes
 * one further along: the reduced-axes mask shifts by one (reductions), the
 * axis moves up by one (softmax, log_softmax, cumsum). The batch dim is never
 * reduced, so the result is (B, *y's shape). */
static nb_tensor *rebatch(nb_tensor *y, nb_tensor *const *bin, int64_t B, int64_t attr0) {
  nbi_attrs at = y->attrs;
  at.i[0] = attr0;
  nb_shape s = {.ndim = y->shape.ndim + 1, .dims = {B}}; /* y's rank <= its input's */
  memcpy(s.dims + 1, y->shape.dims, sizeof(int64_t) * (size_t)y->shape.ndim);
  return nbi_record(y->op, y->dtype, &s, bin, 1, &at);
}

static nb_tensor *reduction_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                 int64_t B) {
  (void)batched;
  return rebatch(y, bin, B, y->attrs.i[0] << 1);
}

static nb_tensor *along_axis_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                  int64_t B) {
  (void)batched;
  return rebatch(y, bin, B, y->attrs.i[0] + 1);
}

const nbi_op_def nbi_opdef_REDUCE_SUM = {
    .name = "reduce_sum", .arity = 1, .vjp = sum_vjp, .jvp = sum_jvp, .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_REDUCE_PROD = {
    .name = "reduce_prod", .arity = 1, .vjp = prod_vjp, .jvp = prod_jvp, .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_REDUCE_MAX = {.name = "reduce_max",
                                         .arity = 1,
                                         .vjp = extreme_vjp,
                                         .jvp = extreme_jvp,
                                         .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_REDUCE_MIN = {.name = "reduce_min",
                                         .arity = 1,
                                         .vjp = extreme_vjp,
                                         .jvp = extreme_jvp,
                                         .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_REDUCE_ANY = {
    .name = "reduce_any", .arity = 1, .flags = NBI_OPF_NONDIFF, .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_REDUCE_ALL = {
    .name = "reduce_all", .arity = 1, .flags = NBI_OPF_NONDIFF, .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_REDUCE_VAR = {
    .name = "reduce_var", .arity = 1, .vjp = var_vjp, .jvp = var_jvp, .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_LOGSUMEXP = {
    .name = "logsumexp", .arity = 1, .vjp = lse_vjp, .jvp = lse_jvp, .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_ARGMAX = {
    .name = "argmax", .arity = 1, .flags = NBI_OPF_NONDIFF, .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_ARGMIN = {
    .name = "argmin", .arity = 1, .flags = NBI_OPF_NONDIFF, .vmap = reduction_vmap};
const nbi_op_def nbi_opdef_SOFTMAX = {
    .name = "softmax", .arity = 1, .vjp = softmax_vjp, .jvp = softmax_jvp, .vmap = along_axis_vmap};
const nbi_op_def nbi_opdef_LOG_SOFTMAX = {.name = "log_softmax",
                                          .arity = 1,
                                          .vjp = log_softmax_vjp,
                                          .jvp = log_softmax_jvp,
                                          .vmap = along_axis_vmap};
const nbi_op_def nbi_opdef_CUMSUM = {
    .name = "cumsum", .arity = 1, .vjp = cumsum_vjp, .jvp = cumsum_jvp, .vmap = along_axis_vmap};
