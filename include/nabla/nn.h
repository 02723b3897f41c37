/* nabla/nn.h — neural-network helpers. All are differentiable compositions of
 * nabla ops (conv2d and max_pool2d are primitives with their own kernels). */
#ifndef NABLA_NN_H
#define NABLA_NN_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Normalizes over the last dimension: (x - mean) / sqrt(var + eps) * w + b.
 * weight and bias are [d] or NULL. f16 and bf16 compute in f32 (statistics
 * included, as PyTorch and Flax) and round the result once. */
nb_tensor *nb_layer_norm(nb_tensor *x, nb_tensor *weight, nb_tensor *bias, double eps);
/* x / sqrt(mean(x^2, last) + eps) * w; weight [d] or NULL. f16 and bf16
 * compute in f32, as nb_layer_norm. */
nb_tensor *nb_rms_norm(nb_tensor *x, nb_tensor *weight, double eps);
/* Mean softmax cross-entropy over the batch. logits [..., C]; labels either
 * integer class indices [...] in [0, C) or float probabilities [..., C]. A
 * class outside [0, C), -1 included (there is no ignore_index), is an
 * NB_ERR_INDEX error naming nb_cross_entropy when the loss is realized. */
nb_tensor *nb_cross_entropy(nb_tensor *logits, nb_tensor *labels);
nb_tensor *nb_mse(nb_tensor *pred, nb_tensor *target); /* mean((pred - target)^2) */
/* Inverted dropout: zeroes each element with probability p and scales the rest
 * by 1/(1-p) when training; identity otherwise. p in [0, 1). */
nb_tensor *nb_dropout(nb_tensor *t, double p, bool training);
/* table [V, D], idx i32/i64 [...] -> [..., D]. An index outside [0, V), -1
 * included, is an NB_ERR_INDEX error naming nb_embedding when realized. */
nb_tensor *nb_embedding(nb_tensor *table, nb_tensor *idx);
/* softmax(q k^T / sqrt(d) + mask) v with q [..., Lq, d], k [..., Lk, d],
 * v [..., Lk, dv]; mask NULL or bool broadcastable to [..., Lq, Lk], true = attend.
 * A masked score becomes the dtype's lowest finite value before the softmax,
 * so its weight is exactly 0 and a fully masked row averages v uniformly (as
 * JAX; PyTorch gives NaN there). */
nb_tensor *nb_attention(nb_tensor *q, nb_tensor *k, nb_tensor *v, nb_tensor *mask);
/* nb_attention with a causal mask: query i attends keys j <= i (the mask is
 * tril(ones(Lq, Lk)), top-left aligned, as PyTorch's
 * scaled_dot_product_attention(is_causal=True) and JAX's
 * dot_product_attention(is_causal=True)). */
nb_tensor *nb_attention_causal(nb_tensor *q, nb_tensor *k, nb_tensor *v);
/* The general form (torch's scaled_dot_product_attention): mask as above or
 * NULL, causal as nb_attention_causal (both: a key must pass both), scale
 * the factor of q k^T (0: 1 / sqrt(d)). p NULL: no mask, not causal. */
typedef struct nb_attention_params {
  nb_tensor *mask;
  bool causal;
  double scale;
} nb_attention_params;
nb_tensor *nb_attention_ex(nb_tensor *q, nb_tensor *k, nb_tensor *v, const nb_attention_params *p);

/* 2-D convolution (cross-correlation, as PyTorch), NCHW input [N, C, H, W],
 * weight [O, C/groups, KH, KW], bias [O] or NULL. Zero fields mean the defaults
 * (stride 1, padding 0, dilation 1, groups 1); p may be NULL for all defaults. */
typedef struct nb_conv2d_params {
  int stride[2], padding[2], dilation[2], groups;
} nb_conv2d_params;
nb_tensor *nb_conv2d(nb_tensor *x, nb_tensor *weight, nb_tensor *bias, const nb_conv2d_params *p);
/* Max pooling over [N, C, H, W]; padding counts as -inf. stride 0 = kernel. */
nb_tensor *nb_max_pool2d(nb_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw);

#ifdef __cplusplus
}
#endif
#endif
