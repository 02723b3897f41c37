/* src/backends/cpu/k_nn.h — CPU kernels of the NN primitives (NCHW). */
#ifndef NABLA_K_NN_H
#define NABLA_K_NN_H

#include "../../ops/nn.h" /* the nodes' attribute slots: NBI_CONV_*, NBI_POOL_* */
#include "cpu.h"

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
