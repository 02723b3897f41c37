/* src/ops/index.h — internal indexing primitives used by other parts of the
 * library (autodiff, nn layers), beyond the public ones in nabla/ops.h, and the
 * index ops' attribute slots (backends include this header for them). */
#ifndef NABLA_OPS_INDEX_H
#define NABLA_OPS_INDEX_H

#include "../core/nbi.h"

/* Attribute slots of TAKE, TAKE_ALONG_AXIS, SCATTER_ADD and
 * SCATTER_ADD_ALONG_AXIS: i[NBI_INDEX_AXIS] the axis (normalized),
 * i[NBI_INDEX_CALLER] the public function the node's out-of-range indices
 * are reported as (nbi_index_caller). */
enum { NBI_INDEX_AXIS = 0, NBI_INDEX_CALLER = 1 };

/* The op's own public function, or a public composite built on it, whose
 * indices must also be >= 0 (a class or row -1 is an error, as in PyTorch,
 * not the last one). The derivative and batching rules give the ops they make
 * their node's caller, so a gradient or a vmap reports as its forward does. */
typedef enum nbi_index_caller {
  NBI_INDEX_OWN = 0,
  NBI_INDEX_CROSS_ENTROPY = 1, /* nb_cross_entropy's class labels */
  NBI_INDEX_EMBEDDING = 2,     /* nb_embedding's rows */
} nbi_index_caller;

/* The lowest index an op made by caller accepts on an axis of size elements:
 * the op's own calls count negative indices from the end, the composites'
 * indices are class and row numbers. */
static inline int64_t nbi_index_low(int64_t caller, int64_t size) {
  return caller == NBI_INDEX_OWN ? -size : 0;
}

/* Records the error of an index v out of range for axis `axis` of `size`
 * elements, of an index op made by `caller` (nbi_index_caller); own is the op's
 * own public name. Returns NB_ERR_INDEX. nbi_index_range_error: of node n. */
static inline nb_status nbi_index_range_error_as(int64_t caller, const char *own, int64_t v,
                                                 int axis, int64_t size) {
  switch (caller) {
  case NBI_INDEX_CROSS_ENTROPY:
    return nbi_error(NB_ERR_INDEX, "nb_cross_entropy: label %lld is not a class of [0, %lld)",
                     (long long)v, (long long)size);
  case NBI_INDEX_EMBEDDING:
    return nbi_error(NB_ERR_INDEX, "nb_embedding: index %lld is not a row of [0, %lld)",
                     (long long)v, (long long)size);
  default:
    return nbi_error(NB_ERR_INDEX, "%s: index %lld out of range for axis %d of size %lld", own,
                     (long long)v, axis, (long long)size);
  }
}
static inline nb_status nbi_index_range_error(const nb_tensor *n, const char *own, int64_t v,
                                              int axis, int64_t size) {
  return nbi_index_range_error_as(n->attrs.i[NBI_INDEX_CALLER], own, v, axis, size);
}

/* nb_take / nb_take_along_axis recorded for caller c (argument errors still
 * name the op's own function: the composites check their arguments first). */
nb_tensor *nbi_take_as(nb_tensor *t, nb_tensor *idx, int axis, nbi_index_caller c);
nb_tensor *nbi_take_along_axis_as(nb_tensor *t, nb_tensor *idx, int axis, nbi_index_caller c);

/* The transpose of nb_take_along_axis: out = t, then for every position i of
 * updates, out[i with i[axis] replaced by idx[i]] += updates[i]. t and idx have
 * the same rank; updates.shape is nb_take_along_axis(t, idx, axis)'s shape
 * (t's and idx's dims broadcast outside axis, idx's extent along axis). Where t
 * has extent 1 and updates more, the updates sum into that one element.
 * updates must have t's dtype; accumulation is in that dtype (f16/bf16 via f32,
 * bool as logical or). Returns a new lazy tensor of t's shape and dtype, or NULL
 * with the error set; out-of-range indices are NB_ERR_INDEX at realization. */
nb_tensor *nbi_scatter_add_along_axis(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis);
/* nb_scatter_add / nbi_scatter_add_along_axis recorded for caller c. */
nb_tensor *nbi_scatter_add_as(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis,
                              nbi_index_caller c);
nb_tensor *nbi_scatter_add_along_axis_as(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis,
                                         nbi_index_caller c);

#endif
