/* src/backends/cpu/k_shape.c — CPU kernels of the shape family: the reshape
 * copy path, materialized views, concat and pad. They only move data (with the
 * dtype conversion concat's promotion needs), all through nbi_copy_view, which
 * handles any strides and parallelizes large copies. */
#include "k_shape.h"
#include "../../core/oprules.h"

/* Gives v contiguous row-major strides for its own dims. */
static void set_contig_strides(nbi_view *v) {
  int64_t st = 1;
  for (int d = v->ndim - 1; d >= 0; d--) {
    v->strides[d] = st;
    st *= v->dims[d] > 0 ? v->dims[d] : 1;
  }
}

/* reshape: in[0] has any dims and strides, out has the same numel in another
 * shape. Reading in[0] in row-major order is writing out in row-major order,
 * so out is seen with in[0]'s dims and contiguous strides. */
nb_status nbi_cpu_reshape(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)n;
  nbi_view dst = in[0];
  dst.data = out->data;
  dst.dtype = out->dtype;
  set_contig_strides(&dst);
  nbi_copy_view(&dst, &in[0]);
  return NB_OK;
}

/* permute / broadcast_to / slice / flip: out has the node's shape; the op's
 * view fn (always successful for these ops) gives the strided window of in[0]
 * that out is a copy of. */
nb_status nbi_cpu_view_copy(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  nbi_view src = *out;
  (void)nbi_op_table[n->op]->view(n, &in[0], &src);
  nbi_copy_view(out, &src);
  return NB_OK;
}

/* concat: in[k] are (..., d_k, ...) with every other dim equal; out is
 * (..., sum d_k, ...) in the promoted dtype. attrs.i[0] = axis. Each input is
 * copied (converting dtype) into its window of out along axis. */
nb_status nbi_cpu_concat(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  int axis = (int)n->attrs.i[0];
  int64_t es = (int64_t)nb_dtype_size(out->dtype), start = 0;
  for (int k = 0; k < n->n_in; k++) {
    nbi_view dst = *out;
    dst.dims[axis] = in[k].dims[axis];
    dst.data = out->data + start * out->strides[axis] * es;
    nbi_copy_view(&dst, &in[k]);
    start += in[k].dims[axis];
  }
  return NB_OK;
}

/* pad: in[0] is (d_0, ..., d_{r-1}); out is (b_0 + d_0 + a_0, ...) with
 * attrs.i[2k] = b_k (before), attrs.i[2k+1] = a_k (after), attrs.f[0] = the
 * fill value. out is filled, then in[0] is copied into its interior. */
nb_status nbi_cpu_pad(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  nbi_fill_view(out, n->attrs.f[0]);
  int64_t numel = 1, off = 0;
  for (int d = 0; d < in[0].ndim; d++) {
    numel *= in[0].dims[d];
    off += n->attrs.i[2 * d] * out->strides[d];
  }
  if (numel == 0) return NB_OK;
  nbi_view dst = *out;
  memcpy(dst.dims, in[0].dims, sizeof dst.dims);
  dst.data = out->data + off * (int64_t)nb_dtype_size(out->dtype);
  nbi_copy_view(&dst, &in[0]);
  return NB_OK;
}
