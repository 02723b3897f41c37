/* src/backends/cpu/k_nn.h — CPU kernels of the NN primitives (NCHW). */
#ifndef NABLA_K_NN_H
#define NABLA_K_NN_H

#include "cpu.h"

/* Attribute slots (nbi_attrs.i) of CONV2D: stride h/w, padding h/w, dilation
 * h/w, groups; CONV2D_BWD_DATA adds the input's H/W, CONV2D_BWD_FILTER the
 * kernel's KH/KW (same slot). MAX_POOL2D and its two derivative ops: kernel
 * h/w, stride h/w, padding h/w. */
enum {
  NBI_CONV_STRIDE = 0,
  NBI_CONV_PAD = 2,
  NBI_CONV_DILATION = 4,
  NBI_CONV_GROUPS = 6,
  NBI_CONV_IN_HW = 7,
  NBI_CONV_KERNEL_HW = 7,
  NBI_POOL_KERNEL = 0,
  NBI_POOL_STRIDE = 2,
  NBI_POOL_PAD = 4,
};

/* CONV2D: in[0] x (N,C,H,W), in[1] w (O,C/G,KH,KW), optional in[2] bias (O). */
nb_status nbi_cpu_conv2d(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* CONV2D_BWD_DATA: in[0] dy (N,O,OH,OW), in[1] w (O,C/G,KH,KW) -> (N,C,H,W). */
nb_status nbi_cpu_conv2d_bwd_data(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* CONV2D_BWD_FILTER: in[0] x (N,C,H,W), in[1] dy (N,O,OH,OW) -> (O,C/G,KH,KW). */
nb_status nbi_cpu_conv2d_bwd_filter(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* MAX_POOL2D: in[0] x (N,C,H,W). */
nb_status nbi_cpu_max_pool2d(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* MAX_POOL2D_BWD: in[0] x (N,C,H,W), in[1] dy (N,C,OH,OW) -> (N,C,H,W). */
nb_status nbi_cpu_max_pool2d_bwd(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* MAX_POOL2D_SELECT: in[0] x (N,C,H,W), in[1] g (N,C,H,W) -> (N,C,OH,OW). */
nb_status nbi_cpu_max_pool2d_select(const nb_tensor *n, nbi_view *out, const nbi_view *in);

#endif
