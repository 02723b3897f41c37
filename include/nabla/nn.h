/* nabla/nn.h — neural-network helpers. All are differentiable compositions of
 * nabla ops (conv2d and max_pool2d are primitives with their own kernels). */
#ifndef NABLA_NN_H
#define NABLA_NN_H

#include "tree.h"

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

/* ---- modules (Flax / Equinox style) -------------------------------------------------
 * Each module is a pair: nb_<module>_init makes its parameters as a new tree
 * (the caller releases it), nb_<module>_apply is a pure function of that
 * tree and the inputs, so a model is any C function of a tree: it traces,
 * differentiates (gradients come back as a tree of the same names), jits and
 * vmaps like any op. A bigger module holds its parts' trees under a prefix
 * (nb_tree_set_tree): a block's attention is "attn.w_q", a GPT's first block
 * "h.0.attn.w_q"; nb_tree_subtree gives a part back. Apply functions take any
 * tree with the names they read (one loaded from a file, a gradient tree);
 * a missing name, or a tensor of the wrong shape, is an NB_ERR_ARG / NB_ERR_SHAPE
 * error naming the function and the entry.
 *
 * Initializers are PyTorch's defaults, drawn from an explicit key (the same
 * key gives the same parameters, on any thread count): nn.Linear's weight
 * and bias U(-1/sqrt(in), 1/sqrt(in)), nn.Embedding's N(0, 1), LayerNorm and
 * RMSNorm ones (and zeros for a bias). Weights are stored [in, out] and
 * applied as x @ w + b (Flax's layout; PyTorch's nn.Linear weight is its
 * transpose). dt is a float dtype. Dropout: apply functions that take a key
 * drop with it (nb_dropout_key, split per use), and do not drop when the key
 * is NULL (evaluation). */

/* nb_activation_fn: an elementwise function such as nb_relu, nb_gelu_tanh, nb_silu. */
typedef nb_tensor *(*nb_activation_fn)(nb_tensor *x);

/* Linear: "w" [in, out], "b" [out] (when bias). x [..., in] -> [..., out]. */
nb_tree *nb_linear_init(nb_tensor *key, int64_t in, int64_t out, bool bias, nb_dtype dt);
nb_tensor *nb_linear_apply(const nb_tree *p, nb_tensor *x);
/* Embedding: "w" [vocab, dim]. idx (i32 / i64) [...] -> [..., dim]. */
nb_tree *nb_embedding_init(nb_tensor *key, int64_t vocab, int64_t dim, nb_dtype dt);
nb_tensor *nb_embedding_apply(const nb_tree *p, nb_tensor *idx);
/* LayerNorm over the last dim: "w" [dim] ones, "b" [dim] zeros (when bias). */
nb_tree *nb_layer_norm_init(int64_t dim, bool bias, nb_dtype dt);
nb_tensor *nb_layer_norm_apply(const nb_tree *p, nb_tensor *x, double eps);
/* RMSNorm over the last dim: "w" [dim] ones. */
nb_tree *nb_rms_norm_init(int64_t dim, nb_dtype dt);
nb_tensor *nb_rms_norm_apply(const nb_tree *p, nb_tensor *x, double eps);
/* MLP of n_layers >= 1 linears widths[0] -> widths[1] -> ... -> widths[n_layers]:
 * "0.w", "0.b", "1.w", ...; act (non-NULL) between layers, not after the last. */
nb_tree *nb_mlp_init(nb_tensor *key, const int64_t *widths, int n_layers, bool bias, nb_dtype dt);
nb_tensor *nb_mlp_apply(const nb_tree *p, nb_tensor *x, nb_activation_fn act);

/* Multi-head self-attention over x [..., T, dim]: q, k, v = x @ w_q + b_q, ...,
 * split into n_heads heads of dim / n_heads, nb_attention (causal: position
 * t attends positions <= t) per head, heads joined, then @ w_o + b_o.
 * "w_q" "w_k" "w_v" "w_o" [dim, dim] and "b_q" "b_k" "b_v" "b_o" [dim] (when
 * bias), each initialized as an nn.Linear(dim, dim). With a key the output
 * projection's result is dropped with rate dropout (nanoGPT's resid_dropout). */
nb_tree *nb_self_attention_init(nb_tensor *key, int64_t dim, bool bias, nb_dtype dt);
nb_tensor *nb_self_attention_apply(const nb_tree *p, nb_tensor *x, int n_heads, bool causal,
                                   nb_tensor *key, double dropout);

/* A pre-LayerNorm transformer block (GPT-2's):
 *   x = x + drop(attn(ln_1(x)));  x = x + drop(mlp(ln_2(x)))
 * with causal self-attention and an MLP dim -> hidden -> dim with the tanh
 * GELU. Tree: "ln_1.*", "attn.*", "ln_2.*", "mlp.0.*", "mlp.1.*". */
typedef struct nb_block_config {
  int64_t dim;    /* model width */
  int n_heads;    /* divides dim */
  int64_t hidden; /* the MLP's width; 0: 4 dim */
  bool bias;      /* biases in the linears and layer norms (GPT-2: true) */
  double eps;     /* the layer norms' epsilon; 0: 1e-5 (PyTorch's default) */
  double dropout; /* residual dropout rate in [0, 1), used when a key is given */
} nb_block_config;
nb_tree *nb_block_init(nb_tensor *key, const nb_block_config *c, nb_dtype dt);
nb_tensor *nb_block_apply(const nb_tree *p, const nb_block_config *c, nb_tensor *x, nb_tensor *key);

/* A GPT (GPT-2's architecture): token and position embeddings, n_layers
 * blocks, a final layer norm and an output projection without bias:
 *   x = drop(wte[idx] + wpe[0..T)); x = block_i(x) for each i; logits = ln_f(x) @ lm_head
 * idx (i32 / i64) [..., T] with T <= context -> logits [..., T, vocab].
 * Tree: "wte.w" [vocab, dim], "wpe.w" [context, dim], "h.<i>.*" (blocks),
 * "ln_f.*", "lm_head.w" [dim, vocab]. */
typedef struct nb_gpt_config {
  int64_t vocab, context; /* vocabulary size; longest sequence */
  int n_layers;           /* >= 1 */
  nb_block_config block;  /* width, heads, MLP, biases, eps, dropout */
} nb_gpt_config;
nb_tree *nb_gpt_init(nb_tensor *key, const nb_gpt_config *c, nb_dtype dt);
nb_tensor *nb_gpt_apply(const nb_tree *p, const nb_gpt_config *c, nb_tensor *idx, nb_tensor *key);

#ifdef __cplusplus
}
#endif
#endif
