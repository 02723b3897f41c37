/* src/ops/index.h — internal indexing primitives used by other parts of the
 * library (autodiff), beyond the public ones in nabla/ops.h. */
#ifndef NABLA_OPS_INDEX_H
#define NABLA_OPS_INDEX_H

#include "../core/nbi.h"

/* The transpose of nb_take_along_axis: out = t, then for every position i of
 * updates, out[i with i[axis] replaced by idx[i]] += updates[i]. t and idx have
 * the same rank; updates.shape is nb_take_along_axis(t, idx, axis)'s shape
 * (t's and idx's dims broadcast outside axis, idx's extent along axis). Where t
 * has extent 1 and updates more, the updates sum into that one element.
 * updates must have t's dtype; accumulation is in that dtype (f16/bf16 via f32,
 * bool as logical or). Returns a new lazy tensor of t's shape and dtype, or NULL
 * with the error set; out-of-range indices are NB_ERR_INDEX at realization. */
nb_tensor *nbi_scatter_add_along_axis(nb_tensor *t, nb_tensor *idx, nb_tensor *updates, int axis);

#endif
