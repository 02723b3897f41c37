/* src/ops/reduce.c — reductions: sum mean prod max min var std logsumexp any
 * all argmax argmin, and softmax, log_softmax, cumsum along one axis. Every op
 * is one primitive node with its own CPU kernel (src/backends/cpu/k_reduce.c).
 *
 * Semantics (NumPy / JAX):
 * - Axes: NB_ALL (n = -1) reduces every axis; negative axes count from the end;
 *   an axis out of range or given twice is NB_ERR_AXIS. NB_NO_AXES reduces
 *   nothing (each element is reduced alone, in the result dtype; var is 0).
 *   A 0-d input with NB_ALL or NB_NO_AXES gives its value. keepdims keeps the
 *   reduced axes as size 1. argmax/argmin/softmax/log_softmax/cumsum take one
 *   axis, which must exist (a 0-d input has none).
 * - Dtypes (JAX): sum/prod keep the dtype, bool gives i32; integers accumulate
 *   in int64 and wrap to the result width. f16/bf16 and f32 accumulate in
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
#include "../backends/cpu/k_reduce.h"

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
static nb_dtype sum_result(nb_dtype dt) { return dt == NB_BOOL ? NB_I32 : dt; }

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

const nbi_op_def nbi_opdef_REDUCE_SUM = {
    .name = "reduce_sum", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_REDUCE_PROD = {
    .name = "reduce_prod", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_REDUCE_MAX = {
    .name = "reduce_max", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_REDUCE_MIN = {
    .name = "reduce_min", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_REDUCE_ANY = {
    .name = "reduce_any", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_REDUCE_ALL = {
    .name = "reduce_all", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_REDUCE_VAR = {
    .name = "reduce_var", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_LOGSUMEXP = {
    .name = "logsumexp", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_ARGMAX = {
    .name = "argmax", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_ARGMIN = {
    .name = "argmin", .arity = 1, .cpu = nbi_cpu_reduce, .view = NULL};
const nbi_op_def nbi_opdef_SOFTMAX = {
    .name = "softmax", .arity = 1, .cpu = nbi_cpu_softmax, .view = NULL};
const nbi_op_def nbi_opdef_LOG_SOFTMAX = {
    .name = "log_softmax", .arity = 1, .cpu = nbi_cpu_softmax, .view = NULL};
const nbi_op_def nbi_opdef_CUMSUM = {
    .name = "cumsum", .arity = 1, .cpu = nbi_cpu_cumsum, .view = NULL};
