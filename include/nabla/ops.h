/* nabla/ops.h — forward operations. Each returns a new lazy tensor registered in
 * the current scope, or NULL with the thread's error set. Any NULL input gives
 * NULL and keeps the first error, so a chain can be checked once at the end.
 * Shapes broadcast NumPy-style; dtypes promote as nb_promote_types. A `double`
 * scalar argument is weakly typed: it takes the tensor's dtype (an integer
 * tensor with a non-integral scalar becomes f32).
 */
#ifndef NABLA_OPS_H
#define NABLA_OPS_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise unary (float ops on integer inputs compute in f32) ---------- */
nb_tensor *nb_neg(nb_tensor *t);
nb_tensor *nb_abs(nb_tensor *t);
nb_tensor *nb_sign(nb_tensor *t);
nb_tensor *nb_exp(nb_tensor *t);
nb_tensor *nb_expm1(nb_tensor *t);
nb_tensor *nb_log(nb_tensor *t);
nb_tensor *nb_log1p(nb_tensor *t);
nb_tensor *nb_sqrt(nb_tensor *t);
nb_tensor *nb_rsqrt(nb_tensor *t);
nb_tensor *nb_square(nb_tensor *t);
nb_tensor *nb_sin(nb_tensor *t);
nb_tensor *nb_cos(nb_tensor *t);
nb_tensor *nb_tan(nb_tensor *t);
nb_tensor *nb_tanh(nb_tensor *t);
nb_tensor *nb_sigmoid(nb_tensor *t);
nb_tensor *nb_relu(nb_tensor *t);
nb_tensor *nb_gelu(nb_tensor *t); /* exact: x * Phi(x) */
/* The tanh approximation (PyTorch's gelu(approximate='tanh'), GPT-2's):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). A composite of the ops
 * above (differentiable, vmappable); f16 and bf16 compute in f32. */
nb_tensor *nb_gelu_tanh(nb_tensor *t);
nb_tensor *nb_silu(nb_tensor *t);
nb_tensor *nb_softplus(nb_tensor *t);
nb_tensor *nb_erf(nb_tensor *t);
nb_tensor *nb_floor(nb_tensor *t);
nb_tensor *nb_ceil(nb_tensor *t);
nb_tensor *nb_round(nb_tensor *t); /* half to even, as NumPy */
nb_tensor *nb_reciprocal(nb_tensor *t);
nb_tensor *nb_logical_not(nb_tensor *t); /* -> bool */
nb_tensor *nb_cast(nb_tensor *t, nb_dtype dt);

/* ---- elementwise binary (broadcasting) --------------------------------------- */
nb_tensor *nb_add(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_sub(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_mul(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_div(nb_tensor *a, nb_tensor *b); /* integers: true division -> f32 */
nb_tensor *nb_pow(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_maximum(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_minimum(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_atan2(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_mod(nb_tensor *a, nb_tensor *b); /* sign of the divisor, as NumPy */
nb_tensor *nb_eq(nb_tensor *a, nb_tensor *b);  /* comparisons -> bool */
nb_tensor *nb_ne(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_lt(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_le(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_gt(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_ge(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_logical_and(nb_tensor *a, nb_tensor *b);
nb_tensor *nb_logical_or(nb_tensor *a, nb_tensor *b);

/* scalar forms: op(t, s); nb_rsub_scalar is s - t, nb_rdiv_scalar is s / t */
nb_tensor *nb_add_scalar(nb_tensor *t, double s);
nb_tensor *nb_sub_scalar(nb_tensor *t, double s);
nb_tensor *nb_rsub_scalar(nb_tensor *t, double s);
nb_tensor *nb_mul_scalar(nb_tensor *t, double s);
nb_tensor *nb_div_scalar(nb_tensor *t, double s);
nb_tensor *nb_rdiv_scalar(nb_tensor *t, double s);
nb_tensor *nb_pow_scalar(nb_tensor *t, double s);
nb_tensor *nb_maximum_scalar(nb_tensor *t, double s);
nb_tensor *nb_minimum_scalar(nb_tensor *t, double s);
nb_tensor *nb_eq_scalar(nb_tensor *t, double s);
nb_tensor *nb_ne_scalar(nb_tensor *t, double s);
nb_tensor *nb_lt_scalar(nb_tensor *t, double s);
nb_tensor *nb_le_scalar(nb_tensor *t, double s);
nb_tensor *nb_gt_scalar(nb_tensor *t, double s);
nb_tensor *nb_ge_scalar(nb_tensor *t, double s);

/* cond must be bool; a and b promote; all three broadcast. */
nb_tensor *nb_where(nb_tensor *cond, nb_tensor *a, nb_tensor *b);
nb_tensor *nb_clip(nb_tensor *t, double lo, double hi);

/* ---- reductions (axes may be negative; NB_ALL = every axis). sum, prod and cumsum
 *      keep the dtype, except bool -> i32 and u8, i8, i16 -> i64 ---------------- */
nb_tensor *nb_sum(nb_tensor *t, nb_axes axes, bool keepdims);
nb_tensor *nb_mean(nb_tensor *t, nb_axes axes, bool keepdims);
nb_tensor *nb_prod(nb_tensor *t, nb_axes axes, bool keepdims);
nb_tensor *nb_max(nb_tensor *t, nb_axes axes, bool keepdims);
nb_tensor *nb_min(nb_tensor *t, nb_axes axes, bool keepdims);
nb_tensor *nb_var(nb_tensor *t, nb_axes axes, bool keepdims); /* population (ddof 0) */
nb_tensor *nb_std(nb_tensor *t, nb_axes axes, bool keepdims);
nb_tensor *nb_logsumexp(nb_tensor *t, nb_axes axes, bool keepdims);
nb_tensor *nb_any(nb_tensor *t, nb_axes axes, bool keepdims); /* -> bool */
nb_tensor *nb_all(nb_tensor *t, nb_axes axes, bool keepdims); /* -> bool */
nb_tensor *nb_argmax(nb_tensor *t, int axis, bool keepdims);  /* -> i64, first max */
nb_tensor *nb_argmin(nb_tensor *t, int axis, bool keepdims);  /* -> i64, first min */
nb_tensor *nb_softmax(nb_tensor *t, int axis);
nb_tensor *nb_log_softmax(nb_tensor *t, int axis);
nb_tensor *nb_cumsum(nb_tensor *t, int axis);

/* ---- linear algebra --------------------------------------------------------------- */
/* NumPy matmul: 1-D operands get a dimension prepended/appended and removed
 * again; leading (batch) dimensions broadcast. */
nb_tensor *nb_matmul(nb_tensor *a, nb_tensor *b);
/* Explicit-output einsum, e.g. "bij,bjk->bik"; "->" may be omitted (implicit
 * output: letters used once, sorted). Letters a-z, A-Z. */
nb_tensor *nb_einsum(const char *spec, nb_tensor *const *ts, int n);
nb_tensor *nb_outer(nb_tensor *a, nb_tensor *b); /* flattens both, [m] x [n] -> [m,n] */

/* ---- shapes and views --------------------------------------------------------------- */
nb_tensor *nb_reshape(nb_tensor *t, nb_shape s); /* one dim may be -1 */
nb_tensor *nb_transpose(nb_tensor *t);           /* swaps the last two dims */
nb_tensor *nb_permute(nb_tensor *t, nb_axes perm);
nb_tensor *nb_squeeze(nb_tensor *t, nb_axes axes); /* NB_ALL: every size-1 dim */
nb_tensor *nb_unsqueeze(nb_tensor *t, int axis);   /* axis in [-(ndim+1), ndim] */
nb_tensor *nb_broadcast_to(nb_tensor *t, nb_shape s);
nb_tensor *nb_flatten(nb_tensor *t, int start_axis, int end_axis); /* inclusive */
nb_tensor *nb_concat(nb_tensor *const *ts, int n, int axis);
nb_tensor *nb_stack(nb_tensor *const *ts, int n, int axis);
/* Splits into n parts of sizes[i] along axis (sizes must sum to the dim). */
nb_status nb_split(nb_tensor *t, const int64_t *sizes, int n, int axis, nb_tensor **out);
/* Per-dimension start/stop/step arrays of length ndim (steps may be NULL for 1).
 * Python slicing rules: negative values count from the end, out-of-range values
 * clamp, steps may be negative (never 0). NB_END as stop means "to the end". */
#define NB_END INT64_MAX
nb_tensor *nb_slice(nb_tensor *t, const int64_t *starts, const int64_t *stops,
                    const int64_t *steps);
/* pads has 2*ndim entries: (before0, after0, before1, after1, ...), >= 0. */
nb_tensor *nb_pad(nb_tensor *t, const int64_t *pads, double value);
nb_tensor *nb_flip(nb_tensor *t, nb_axes axes);
nb_tensor *nb_repeat(nb_tensor *t, int64_t repeats, int axis); /* NumPy repeat */
nb_tensor *nb_tile(nb_tensor *t, nb_shape reps);               /* NumPy tile */

/* ---- indexing (indices are i32, i64, i16, i8 or u8; negative indices count from the end;
 *      an index out of range is an NB_ERR_INDEX error when realized) ------------- */
/* out.shape = t.shape[:axis] + idx.shape + t.shape[axis+1:] */
nb_tensor *nb_take(nb_tensor *t, nb_tensor *idx, int axis);
/* idx has t's rank; its dims broadcast with t's except along axis (NumPy). */
nb_tensor *nb_take_along_axis(nb_tensor *t, nb_tensor *idx, int axis);
/* The transpose of nb_take: out = t, then out[.., idx[k], ..] += updates[.., k, ..]
 * with updates.shape = t.shape[:axis] + idx.shape + t.shape[axis+1:]. */
nb_tensor *nb_scatter_add(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis);
/* out.shape = idx.shape + [n]; indices outside [0, n) give a zero row. */
nb_tensor *nb_one_hot(nb_tensor *idx, int64_t n, nb_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
