/* src/ops/nn.h — the NN primitives' attribute slots, and the internal NN
 * primitives behind the derivatives of conv2d and max_pool2d (src/ops/nn_conv.c).
 * Backends include this header for the slots' meanings (the ops layer includes
 * no backend). */
#ifndef NABLA_OPS_NN_H
#define NABLA_OPS_NN_H

#include "../core/nbi.h"

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

/* The internal primitives are lazy ops with kernels and rules of their own,
 * written with conv2d and these, so every derivative order works. `conv` /
 * `pool` are the attrs of a CONV2D / MAX_POOL2D node (slots above); only their
 * geometry slots are read. Each returns a new lazy tensor, or NULL with an
 * error naming the function on inconsistent shapes or NULL inputs. */

/* The gradient of conv2d's input: dy [N, O, OH, OW] and w [O, C/G, KH, KW] ->
 * dx [N, C, h, width], the transpose of x -> conv2d(x, w) for an input of
 * h x width
 * (which must give OH x OW). Dtype: dy's and w's promoted. */
nb_tensor *nbi_conv2d_bwd_data(nb_tensor *dy, nb_tensor *w, const nbi_attrs *conv, int64_t h,
                               int64_t width);
/* The gradient of conv2d's weight: x [N, C, H, W] and dy [N, O, OH, OW] ->
 * dw [O, C/G, kh, kw], the transpose of w -> conv2d(x, w) for a kh x kw kernel
 * (which must give OH x OW). Dtype: x's and dy's promoted. */
nb_tensor *nbi_conv2d_bwd_filter(nb_tensor *x, nb_tensor *dy, const nbi_attrs *conv, int64_t kh,
                                 int64_t kw);
/* The gradient of max_pool2d's input: x [N, C, H, W], dy [N, C, OH, OW] (the
 * pooled shape) -> [N, C, H, W] of dy's dtype, each dy summed onto its
 * window's maximum in x (the first on ties, a NaN before any number), 0 at
 * the others. */
nb_tensor *nbi_max_pool2d_bwd(nb_tensor *x, nb_tensor *dy, const nbi_attrs *pool);
/* The transpose of nbi_max_pool2d_bwd in dy: x and g [N, C, H, W] ->
 * [N, C, OH, OW] of g's dtype, g at each window's maximum in x. */
nb_tensor *nbi_max_pool2d_select(nb_tensor *x, nb_tensor *g, const nbi_attrs *pool);

#endif
