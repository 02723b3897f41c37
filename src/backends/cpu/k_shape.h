/* src/backends/cpu/k_shape.h — CPU kernels of the shape family (src/ops/shape.c).
 * Every kernel follows nbi_kernel: in[k] are views with any strides, out is
 * a fresh contiguous buffer of the node's shape and dtype. */
#ifndef NABLA_K_SHAPE_H
#define NABLA_K_SHAPE_H

#include "cpu.h"
#include "../../core/oprules.h"

/* reshape when the input strides do not allow a view: row-major copy. */
nb_status nbi_cpu_reshape(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* permute, broadcast_to, slice, flip: copies the op's view of in[0] into out
 * (the zero-copy path is the op's view fn; this materializes the same view). */
nb_status nbi_cpu_view_copy(const nb_tensor *n, nbi_view *out, const nbi_view *in);
nb_status nbi_cpu_concat(const nb_tensor *n, nbi_view *out, const nbi_view *in);
nb_status nbi_cpu_pad(const nb_tensor *n, nbi_view *out, const nbi_view *in);

#endif
