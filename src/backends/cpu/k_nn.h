/* src/backends/cpu/k_nn.h — CPU kernels of the NN primitives (NCHW). */
#ifndef NABLA_K_NN_H
#define NABLA_K_NN_H

#include "cpu.h"

/* Attribute slots (nbi_attrs.i) of CONV2D: stride h/w, padding h/w, dilation
 * h/w, groups; of MAX_POOL2D: kernel h/w, stride h/w, padding h/w. */
enum {
  NBI_CONV_STRIDE = 0,
  NBI_CONV_PAD = 2,
  NBI_CONV_DILATION = 4,
  NBI_CONV_GROUPS = 6,
  NBI_POOL_KERNEL = 0,
  NBI_POOL_STRIDE = 2,
  NBI_POOL_PAD = 4,
};

/* CONV2D: in[0] x (N,C,H,W), in[1] w (O,C/G,KH,KW), optional in[2] bias (O). */
nb_status nbi_cpu_conv2d(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* MAX_POOL2D: in[0] x (N,C,H,W). */
nb_status nbi_cpu_max_pool2d(const nb_tensor *n, nbi_view *out, const nbi_view *in);

#endif
