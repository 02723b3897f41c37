/* src/ops/index.c — indexing: take (gather along an axis), take_along_axis,
 * their transposes scatter_add and scatter_add_along_axis (internal, for
 * autodiff; see index.h), and one_hot. Shapes, dtypes and axes are checked here
 * when the op is called; index values are checked by the kernels when the
 * graph is realized (NB_ERR_INDEX from nb_eval / nb_to_host). */
#include "index.h"

#include "../backends/cpu/k_index.h"

#define SHAPE_STR_CAP 160

/* Checks that idx holds integer indices (i32 or i64). */
static nb_status check_index_dtype(const char *fn, const nb_tensor *idx) {
  if (idx->dtype == NB_I32 || idx->dtype == NB_I64) return NB_OK;
  return nbi_error(NB_ERR_DTYPE, "%s: indices must be i32 or i64, got %s", fn,
                   nb_dtype_name(idx->dtype));
}

/* Shape of take(t, idx, axis): t.shape[:axis] + idx.shape + t.shape[axis+1:]. */
static nb_status take_shape(const char *fn, const nb_tensor *t, const nb_tensor *idx, int axis,
                            nb_shape *out) {
  int nd = t->shape.ndim - 1 + idx->shape.ndim;
  if (nd > NB_MAX_DIMS) {
    char a[SHAPE_STR_CAP], b[SHAPE_STR_CAP];
    return nbi_error(NB_ERR_SHAPE, "%s: result of t %s with idx %s would have rank %d (max %d)", fn,
                     nb_shape_str(t->shape, a, sizeof a), nb_shape_str(idx->shape, b, sizeof b), nd,
                     NB_MAX_DIMS);
  }
  out->ndim = 0;
  for (int d = 0; d < axis; d++)
    out->dims[out->ndim++] = t->shape.dims[d];
  for (int d = 0; d < idx->shape.ndim; d++)
    out->dims[out->ndim++] = idx->shape.dims[d];
  for (int d = axis + 1; d < t->shape.ndim; d++)
    out->dims[out->ndim++] = t->shape.dims[d];
  return nbi_check_shape(fn, out);
}

/* Shape of take_along_axis(t, idx, axis): same rank; idx's extent along axis;
 * t's and idx's dims broadcast elsewhere. */
static nb_status along_axis_shape(const char *fn, const nb_tensor *t, const nb_tensor *idx,
                                  int axis, nb_shape *out) {
  char a[SHAPE_STR_CAP], b[SHAPE_STR_CAP];
  if (idx->shape.ndim != t->shape.ndim)
    return nbi_error(NB_ERR_SHAPE, "%s: idx %s must have the rank of t %s", fn,
                     nb_shape_str(idx->shape, b, sizeof b), nb_shape_str(t->shape, a, sizeof a));
  *out = idx->shape;
  for (int d = 0; d < t->shape.ndim; d++) {
    int64_t x = t->shape.dims[d], y = idx->shape.dims[d];
    if (d == axis || x == y || x == 1) continue;
    if (y != 1)
      return nbi_error(NB_ERR_SHAPE,
                       "%s: idx %s does not broadcast with t %s outside axis %d (dim %d: %lld vs "
                       "%lld)",
                       fn, nb_shape_str(idx->shape, b, sizeof b),
                       nb_shape_str(t->shape, a, sizeof a), axis, d, (long long)y, (long long)x);
    out->dims[d] = x;
  }
  return NB_OK;
}

/* Checks updates for a scatter: t's dtype and the expected shape. */
static nb_status check_updates(const char *fn, const nb_tensor *t, const nb_tensor *idx,
                               const nb_tensor *updates, int axis, const nb_shape *expect) {
  char a[SHAPE_STR_CAP], b[SHAPE_STR_CAP], c[SHAPE_STR_CAP], e[SHAPE_STR_CAP];
  if (updates->dtype != t->dtype)
    return nbi_error(NB_ERR_DTYPE, "%s: updates are %s but t is %s", fn,
                     nb_dtype_name(updates->dtype), nb_dtype_name(t->dtype));
  if (!nbi_shape_eq(&updates->shape, expect))
    return nbi_error(
        NB_ERR_SHAPE, "%s: updates have shape %s, expected %s for t %s, idx %s, axis %d", fn,
        nb_shape_str(updates->shape, a, sizeof a), nb_shape_str(*expect, e, sizeof e),
        nb_shape_str(t->shape, b, sizeof b), nb_shape_str(idx->shape, c, sizeof c), axis);
  return NB_OK;
}

/* attrs.i[0] = axis (normalized) for take, take_along_axis and both scatters. */
static nbi_attrs axis_attrs(int axis) {
  nbi_attrs at = {0};
  at.i[0] = axis;
  return at;
}

nb_tensor *nb_take(nb_tensor *t, nb_tensor *idx, int axis) {
  const char *fn = "nb_take";
  if (nbi_any_null(fn, (nb_tensor *[]){t, idx}, 2)) return NULL;
  int a;
  nb_shape s;
  if (check_index_dtype(fn, idx) || nbi_norm_axis(fn, axis, t->shape.ndim, &a) ||
      take_shape(fn, t, idx, a, &s))
    return NULL;
  nbi_attrs at = axis_attrs(a);
  return nbi_record(NBI_OP_TAKE, t->dtype, &s, (nb_tensor *[]){t, idx}, 2, &at);
}

nb_tensor *nb_take_along_axis(nb_tensor *t, nb_tensor *idx, int axis) {
  const char *fn = "nb_take_along_axis";
  if (nbi_any_null(fn, (nb_tensor *[]){t, idx}, 2)) return NULL;
  int a;
  nb_shape s;
  if (check_index_dtype(fn, idx) || nbi_norm_axis(fn, axis, t->shape.ndim, &a) ||
      along_axis_shape(fn, t, idx, a, &s))
    return NULL;
  nbi_attrs at = axis_attrs(a);
  return nbi_record(NBI_OP_TAKE_ALONG_AXIS, t->dtype, &s, (nb_tensor *[]){t, idx}, 2, &at);
}

nb_tensor *nb_scatter_add(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis) {
  const char *fn = "nb_scatter_add";
  if (nbi_any_null(fn, (nb_tensor *[]){t, idx, updates}, 3)) return NULL;
  int a;
  nb_shape s;
  if (check_index_dtype(fn, idx) || nbi_norm_axis(fn, axis, t->shape.ndim, &a) ||
      take_shape(fn, t, idx, a, &s) || check_updates(fn, t, idx, updates, a, &s))
    return NULL;
  nbi_attrs at = axis_attrs(a);
  return nbi_record(NBI_OP_SCATTER_ADD, t->dtype, &t->shape, (nb_tensor *[]){t, idx, updates}, 3,
                    &at);
}

nb_tensor *nbi_scatter_add_along_axis(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis) {
  const char *fn = "nbi_scatter_add_along_axis";
  if (nbi_any_null(fn, (nb_tensor *[]){t, idx, updates}, 3)) return NULL;
  int a;
  nb_shape s;
  if (check_index_dtype(fn, idx) || nbi_norm_axis(fn, axis, t->shape.ndim, &a) ||
      along_axis_shape(fn, t, idx, a, &s) || check_updates(fn, t, idx, updates, a, &s))
    return NULL;
  nbi_attrs at = axis_attrs(a);
  return nbi_record(NBI_OP_SCATTER_ADD_ALONG_AXIS, t->dtype, &t->shape,
                    (nb_tensor *[]){t, idx, updates}, 3, &at);
}

nb_tensor *nb_one_hot(nb_tensor *idx, int64_t n, nb_dtype dt) {
  const char *fn = "nb_one_hot";
  if (nbi_any_null(fn, &idx, 1) || check_index_dtype(fn, idx)) return NULL;
  if (!nbi_dtype_valid(dt)) {
    nbi_error(NB_ERR_DTYPE, "nb_one_hot: invalid dtype %d", (int)dt);
    return NULL;
  }
  if (n < 0) {
    nbi_error(NB_ERR_ARG, "nb_one_hot: n is %lld (must be >= 0)", (long long)n);
    return NULL;
  }
  if (idx->shape.ndim == NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "nb_one_hot: idx already has the maximum rank %d", NB_MAX_DIMS);
    return NULL;
  }
  nb_shape s = idx->shape;
  s.dims[s.ndim++] = n;
  if (nbi_check_shape(fn, &s)) return NULL;
  return nbi_record(NBI_OP_ONE_HOT, dt, &s, &idx, 1, NULL);
}

const nbi_op_def nbi_opdef_TAKE = {.name = "take", .arity = 2, .cpu = nbi_cpu_take, .view = NULL};
const nbi_op_def nbi_opdef_TAKE_ALONG_AXIS = {
    .name = "take_along_axis", .arity = 2, .cpu = nbi_cpu_take_along_axis, .view = NULL};
const nbi_op_def nbi_opdef_SCATTER_ADD = {
    .name = "scatter_add", .arity = 3, .cpu = nbi_cpu_scatter_add, .view = NULL};
const nbi_op_def nbi_opdef_SCATTER_ADD_ALONG_AXIS = {.name = "scatter_add_along_axis",
                                                     .arity = 3,
                                                     .cpu = nbi_cpu_scatter_add_along_axis,
                                                     .view = NULL};
const nbi_op_def nbi_opdef_ONE_HOT = {
    .name = "one_hot", .arity = 1, .cpu = nbi_cpu_one_hot, .view = NULL};
