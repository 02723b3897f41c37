/* src/ops/index.c — indexing: take (gather along an axis), take_along_axis,
 * their transposes scatter_add and scatter_add_along_axis (internal, for
 * autodiff; see index.h), and one_hot. Shapes, dtypes and axes are checked here
 * when the op is called; index values are checked by the kernels when the
 * graph is realized (NB_ERR_INDEX from nb_eval / nb_to_host).
 *
 * Autodiff: each op is linear in its float inputs and the gathers and scatters
 * are each other's transposes, so the rules pair them up (take <-> scatter_add,
 * take_along_axis <-> scatter_add_along_axis) with the node's own indices and
 * axis. Indices get no cotangent; one_hot is not differentiable.
 *
 * Batching (vmap): with unbatched indices the op runs once on the whole batch
 * along axis + 1. Batched indices into batched data make take / scatter_add an
 * along-axis gather / scatter whose leading dim pairs example b's indices with
 * example b's data (see along_views); no index arithmetic, so out-of-range
 * indices still fail at realization as they do unbatched. */
#include "index.h"
#include "../core/oprules.h"
#include "rule_util.h"

#define SHAPE_STR_CAP 160

/* Checks that idx holds integer indices (i32, i64, u8, i8, i16). */
static nb_status check_index_dtype(const char *fn, const nb_tensor *idx) {
  if (nbi_dtype_is_int(idx->dtype)) return NB_OK;
  return nbi_error(NB_ERR_DTYPE, "%s: indices must be integers (i32, i64, u8, i8 or i16), got %s",
                   fn, nb_dtype_name(idx->dtype));
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

/* The attrs of take, take_along_axis and both scatters (index.h). */
static nbi_attrs index_attrs(int axis, nbi_index_caller c) {
  nbi_attrs at = {0};
  at.i[NBI_INDEX_AXIS] = axis;
  at.i[NBI_INDEX_CALLER] = c;
  return at;
}

/* The caller of index node y, for the ops its rules make. */
static nbi_index_caller caller_of(const nb_tensor *y) {
  return (nbi_index_caller)y->attrs.i[NBI_INDEX_CALLER];
}

nb_tensor *nb_take(nb_tensor *t, nb_tensor *idx, int axis) {
  return nbi_take_as(t, idx, axis, NBI_INDEX_OWN);
}

nb_tensor *nbi_take_as(nb_tensor *t, nb_tensor *idx, int axis, nbi_index_caller c) {
  const char *fn = "nb_take";
  if (nbi_any_null(fn, (nb_tensor *[]){t, idx}, 2)) return NULL;
  int a;
  nb_shape s;
  if (check_index_dtype(fn, idx) || nbi_norm_axis(fn, axis, t->shape.ndim, &a) ||
      take_shape(fn, t, idx, a, &s))
    return NULL;
  nbi_attrs at = index_attrs(a, c);
  return nbi_record(NBI_OP_TAKE, t->dtype, &s, (nb_tensor *[]){t, idx}, 2, &at);
}

nb_tensor *nb_take_along_axis(nb_tensor *t, nb_tensor *idx, int axis) {
  return nbi_take_along_axis_as(t, idx, axis, NBI_INDEX_OWN);
}

nb_tensor *nbi_take_along_axis_as(nb_tensor *t, nb_tensor *idx, int axis, nbi_index_caller c) {
  const char *fn = "nb_take_along_axis";
  if (nbi_any_null(fn, (nb_tensor *[]){t, idx}, 2)) return NULL;
  int a;
  nb_shape s;
  if (check_index_dtype(fn, idx) || nbi_norm_axis(fn, axis, t->shape.ndim, &a) ||
      along_axis_shape(fn, t, idx, a, &s))
    return NULL;
  nbi_attrs at = index_attrs(a, c);
  return nbi_record(NBI_OP_TAKE_ALONG_AXIS, t->dtype, &s, (nb_tensor *[]){t, idx}, 2, &at);
}

nb_tensor *nb_scatter_add(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis) {
  return nbi_scatter_add_as(t, idx, updates, axis, NBI_INDEX_OWN);
}

nb_tensor *nbi_scatter_add_as(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis,
                              nbi_index_caller c) {
  const char *fn = "nb_scatter_add";
  if (nbi_any_null(fn, (nb_tensor *[]){t, idx, updates}, 3)) return NULL;
  int a;
  nb_shape s;
  if (check_index_dtype(fn, idx) || nbi_norm_axis(fn, axis, t->shape.ndim, &a) ||
      take_shape(fn, t, idx, a, &s) || check_updates(fn, t, idx, updates, a, &s))
    return NULL;
  nbi_attrs at = index_attrs(a, c);
  return nbi_record(NBI_OP_SCATTER_ADD, t->dtype, &t->shape, (nb_tensor *[]){t, idx, updates}, 3,
                    &at);
}

nb_tensor *nbi_scatter_add_along_axis(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis) {
  return nbi_scatter_add_along_axis_as(t, idx, updates, axis, NBI_INDEX_OWN);
}

nb_tensor *nbi_scatter_add_along_axis_as(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis,
                                         nbi_index_caller c) {
  const char *fn = "nb_scatter_add_along_axis";
  if (nbi_any_null(fn, (nb_tensor *[]){t, idx, updates}, 3)) return NULL;
  int a;
  nb_shape s;
  if (check_index_dtype(fn, idx) || nbi_norm_axis(fn, axis, t->shape.ndim, &a) ||
      along_axis_shape(fn, t, idx, a, &s) || check_updates(fn, t, idx, updates, a, &s))
    return NULL;
  nbi_attrs at = index_attrs(a, c);
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

/* ---- autodiff rules ---------------------------------------------------------------- */

/* The status a VJP rule returns after computing r (NULL: an op failed). */
static nb_status rule_status(const nb_tensor *r) { return r ? NB_OK : nb_last_status(); }

/* y = take(t, idx, axis): gt = scatter_add(0, idx, gy, axis), so repeated
 * indices accumulate; ty = take(tt, idx, axis). */
static nb_status take_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] =
      nbi_scatter_add_as(nbi_zeros_like(y->in[0]), y->in[1], gy, (int)y->attrs.i[0], caller_of(y));
  return rule_status(gin[0]);
}

static nb_tensor *take_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return nbi_take_as(tin[0], y->in[1], (int)y->attrs.i[0], caller_of(y));
}

/* y = take_along_axis(t, idx, axis), y's dims broadcast from t's and idx's
 * outside axis: gt = scatter_add_along_axis(0, idx, gy, axis), which also sums
 * the broadcast copies back into t's size-1 dims; ty = take_along_axis(tt). */
static nb_status take_along_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = nbi_scatter_add_along_axis_as(nbi_zeros_like(y->in[0]), y->in[1], gy, (int)y->attrs.i[0],
                                         caller_of(y));
  return rule_status(gin[0]);
}

static nb_tensor *take_along_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return nbi_take_along_axis_as(tin[0], y->in[1], (int)y->attrs.i[0], caller_of(y));
}

/* y = scatter_add(t, idx, u, axis) = t + S u with S linear: gt = gy,
 * gu = S^T gy = take(gy, idx, axis); ty = scatter_add(tt, idx, tu, axis)
 * (tt alone when tu is zero, zeros for a missing tt). */
static nb_status scatter_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (need[0]) gin[0] = gy;
  if (need[2] && !(gin[2] = nbi_take_as(gy, y->in[1], (int)y->attrs.i[0], caller_of(y))))
    return nb_last_status();
  return NB_OK;
}

static nb_tensor *scatter_jvp(nb_tensor *y, nb_tensor *const *tin) {
  if (!tin[2]) return tin[0];
  nb_tensor *tt = tin[0] ? tin[0] : nbi_zeros_like(y->in[0]);
  return nbi_scatter_add_as(tt, y->in[1], tin[2], (int)y->attrs.i[0], caller_of(y));
}

/* The same for scatter_add_along_axis with take_along_axis as S^T. */
static nb_status scatter_along_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (need[0]) gin[0] = gy;
  if (need[2] && !(gin[2] = nbi_take_along_axis_as(gy, y->in[1], (int)y->attrs.i[0], caller_of(y))))
    return nb_last_status();
  return NB_OK;
}

static nb_tensor *scatter_along_jvp(nb_tensor *y, nb_tensor *const *tin) {
  if (!tin[2]) return tin[0];
  nb_tensor *tt = tin[0] ? tin[0] : nbi_zeros_like(y->in[0]);
  return nbi_scatter_add_along_axis_as(tt, y->in[1], tin[2], (int)y->attrs.i[0], caller_of(y));
}

/* ---- batching rules ------------------------------------------------------------------ */

/* A per-example take / scatter_add along axis a of data with shape ts and
 * indices with shape is (k = is.ndim), both batched, as an along-axis op along
 * a + 1 on views that share the batch dim 0:
 *   data:                  tv = (B, ts[:a], n, 1 x (k-1), ts[a+1:])
 *   indices:               iv = (B, 1 x a, is (or 1 when k = 0), 1 x (ts.ndim - a - 1))
 *   gathered / updates:    ov = (B, ts[:a], is (or 1), ts[a+1:])
 * so gathering along a + 1 gives result[b, p, j, q] = data[b, p, idx[b, j], q],
 * and scattering sums every update into the data's size-1 dims, which is
 * take's transpose. Error if a view would exceed the maximum rank. */
static nb_status along_views(const nb_shape *ts, const nb_shape *is, int a, int64_t B, nb_shape *tv,
                             nb_shape *iv, nb_shape *ov) {
  int kk = is->ndim ? is->ndim : 1, nd = ts->ndim + kk;
  if (nd > NB_MAX_DIMS)
    return nbi_error(NB_ERR_SHAPE,
                     "nb_vmap: a batched value would have rank %d (the maximum is %d)", nd,
                     NB_MAX_DIMS);
  *tv = *iv = *ov = (nb_shape){.ndim = 1, .dims = {B}};
  for (int d = 0; d < ts->ndim; d++) {
    if (d != a) {
      tv->dims[tv->ndim++] = ov->dims[ov->ndim++] = ts->dims[d];
      iv->dims[iv->ndim++] = 1;
      continue;
    }
    for (int j = 0; j < kk; j++) {
      tv->dims[tv->ndim++] = j ? 1 : ts->dims[a];
      iv->dims[iv->ndim++] = ov->dims[ov->ndim++] = is->ndim ? is->dims[j] : 1;
    }
  }
  return NB_OK;
}

/* t reshaped to s, or t itself when it already has that shape. */
static nb_tensor *reshape_to(nb_tensor *t, nb_shape s) {
  return t && nbi_shape_eq(&t->shape, &s) ? t : nb_reshape(t, s);
}

/* An unbatched t with a size-1 batch dim in front (for the along-axis ops,
 * which broadcast it against the batched operand); a batched one as it is. */
static nb_tensor *lead1(nb_tensor *t, bool batched) { return batched ? t : nb_unsqueeze(t, 0); }

/* take: data batched only -> take along axis + 1; indices batched only ->
 * take(t, idx_b) puts the batch at the axis, moved to the front; both ->
 * along_views. */
static nb_tensor *take_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  int a = (int)y->attrs.i[0];
  nbi_index_caller c = caller_of(y);
  if (!batched[1]) return nbi_take_as(bin[0], bin[1], a + 1, c);
  if (!batched[0]) return nbi_bat_moveaxis(nbi_take_as(bin[0], bin[1], a, c), a, 0);
  nb_shape tv, iv, ov;
  if (along_views(&y->in[0]->shape, &y->in[1]->shape, a, B, &tv, &iv, &ov)) return NULL;
  nb_tensor *r = nbi_take_along_axis_as(reshape_to(bin[0], tv), reshape_to(bin[1], iv), a + 1, c);
  /* ov is (B, *y.shape) but for a 0-d index, which leaves a size-1 dim */
  return y->in[1]->shape.ndim ? r : nb_squeeze(r, (nb_axes){.n = 1, .v = {a + 1}});
}

/* take_along_axis: data and indices have the same rank, so an unbatched one
 * gets a size-1 batch dim that broadcasts against the other's. */
static nb_tensor *take_along_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                  int64_t B) {
  (void)B;
  return nbi_take_along_axis_as(lead1(bin[0], batched[0]), lead1(bin[1], batched[1]),
                                (int)y->attrs.i[0] + 1, caller_of(y));
}

/* scatter_add: the result is batched, so t and updates are expanded to the
 * batch (views); unbatched indices scatter along axis + 1, batched ones go
 * through the along-axis scatter on along_views. */
static nb_tensor *scatter_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                               int64_t B) {
  int a = (int)y->attrs.i[0];
  nb_tensor *t = nbi_bat_expand(bin[0], batched[0], B), *u = nbi_bat_expand(bin[2], batched[2], B);
  if (!batched[1]) return nbi_scatter_add_as(t, bin[1], u, a + 1, caller_of(y));
  nb_shape tv, iv, ov;
  if (!t || !u || along_views(&y->in[0]->shape, &y->in[1]->shape, a, B, &tv, &iv, &ov)) return NULL;
  nb_tensor *r = nbi_scatter_add_along_axis_as(reshape_to(t, tv), reshape_to(bin[1], iv),
                                               reshape_to(u, ov), a + 1, caller_of(y));
  return reshape_to(r, t->shape); /* tv back to (B, *t.shape) */
}

/* scatter_add_along_axis: t and updates expanded as for scatter_add, indices
 * broadcast as for take_along_axis. */
static nb_tensor *scatter_along_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                     int64_t B) {
  return nbi_scatter_add_along_axis_as(
      nbi_bat_expand(bin[0], batched[0], B), lead1(bin[1], batched[1]),
      nbi_bat_expand(bin[2], batched[2], B), (int)y->attrs.i[0] + 1, caller_of(y));
}

/* one_hot: the batch dim is one more index dim. */
static nb_tensor *one_hot_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                               int64_t B) {
  (void)batched, (void)B;
  return nb_one_hot(bin[0], y->shape.dims[y->shape.ndim - 1], y->dtype);
}

const nbi_op_def nbi_opdef_TAKE = {.name = "take",
                                   .flags = NBI_OPF_CHECKED,
                                   .arity = 2,
                                   .view = NULL,
                                   .vjp = take_vjp,
                                   .jvp = take_jvp,
                                   .vmap = take_vmap};
const nbi_op_def nbi_opdef_TAKE_ALONG_AXIS = {.name = "take_along_axis",
                                              .flags = NBI_OPF_CHECKED,
                                              .arity = 2,
                                              .view = NULL,
                                              .vjp = take_along_vjp,
                                              .jvp = take_along_jvp,
                                              .vmap = take_along_vmap};
const nbi_op_def nbi_opdef_SCATTER_ADD = {.name = "scatter_add",
                                          .flags = NBI_OPF_CHECKED,
                                          .arity = 3,
                                          .view = NULL,
                                          .vjp = scatter_vjp,
                                          .jvp = scatter_jvp,
                                          .vmap = scatter_vmap};
const nbi_op_def nbi_opdef_SCATTER_ADD_ALONG_AXIS = {.name = "scatter_add_along_axis",
                                                     .flags = NBI_OPF_CHECKED,
                                                     .arity = 3,
                                                     .view = NULL,
                                                     .vjp = scatter_along_vjp,
                                                     .jvp = scatter_along_jvp,
                                                     .vmap = scatter_along_vmap};
const nbi_op_def nbi_opdef_ONE_HOT = {
    .name = "one_hot", .arity = 1, .view = NULL, .flags = NBI_OPF_NONDIFF, .vmap = one_hot_vmap};
