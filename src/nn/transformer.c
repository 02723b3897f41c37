/* src/nn/transformer.c — the transformer modules of include/nabla/nn.h:
 * multi-head self-attention, the pre-LayerNorm block and the GPT, composed
 * from the basic modules (modules.c) and public ops. */
#include "nn_util.h"

#include <math.h>
#include <stdio.h>

/* ---- self-attention ----------------------------------------------------------------------------
 */
static nb_tree *attention_init(const char *fn, nb_tensor *key, int64_t dim, bool bias,
                               nb_dtype dt) {
  if (!nbi_nn_check_dim(fn, "dim", dim) || !nbi_nn_check_float(fn, dt)) return NULL;
  static const char *const proj[4] = {"q", "k", "v", "o"};
  nb_tensor *k[4];
  if (nb_key_split(key, 4, k)) return NULL;
  nb_tree *t = nb_tree_create();
  bool ok = t != NULL;
  for (int i = 0; i < 4 && ok; i++) { /* each an nn.Linear(dim, dim) */
    nb_tree *lin = nbi_nn_linear_init(k[i], dim, dim, bias, dt);
    char w[8], b[8];
    snprintf(w, sizeof w, "w_%s", proj[i]);
    snprintf(b, sizeof b, "b_%s", proj[i]);
    ok = lin && nbi_nn_set(t, w, nb_tree_get(lin, "w")) &&
         (!bias || nbi_nn_set(t, b, nb_tree_get(lin, "b")));
    nb_tree_release(lin);
  }
  return nbi_nn_finish(t, ok);
}

static bool check_rate(const char *fn, double dropout) {
  if (dropout >= 0 && dropout < 1) return true;
  nbi_error(NB_ERR_ARG, "%s: dropout %g is outside [0, 1)", fn, dropout);
  return false;
}

/* x dropped with key at rate p; x itself without a key or at rate 0. */
static nb_tensor *drop(nb_tensor *x, nb_tensor *key, double p) {
  return key && p > 0 ? nb_dropout_key(x, key, p) : x;
}

/* x [..., T, dim] -> [..., H, T, dim / H] */
static nb_tensor *split_heads(nb_tensor *x, int n_heads) {
  nb_shape s = nb_shape_of(x);
  if (s.ndim + 1 > NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "nb_self_attention_apply: the input's rank %d leaves no room for heads",
              s.ndim);
    return NULL;
  }
  int r = s.ndim;
  nb_shape h = s;
  h.dims[r - 1] = n_heads;
  h.dims[r] = s.dims[r - 1] / n_heads;
  h.ndim = r + 1;
  nb_axes perm = {.n = r + 1};
  for (int d = 0; d < r + 1; d++)
    perm.v[d] = d;
  perm.v[r - 2] = r - 1, perm.v[r - 1] = r - 2;
  return nb_permute(nb_reshape(x, h), perm);
}

/* [..., H, T, dh] -> [..., T, H dh] */
static nb_tensor *join_heads(nb_tensor *x) {
  if (!x) return NULL;
  nb_shape s = nb_shape_of(x);
  int r = s.ndim;
  nb_axes perm = {.n = r};
  for (int d = 0; d < r; d++)
    perm.v[d] = d;
  perm.v[r - 3] = r - 2, perm.v[r - 2] = r - 3;
  nb_shape o = s;
  o.ndim = r - 1;
  o.dims[r - 3] = s.dims[r - 2];
  o.dims[r - 2] = s.dims[r - 3] * s.dims[r - 1];
  return nb_reshape(nb_permute(x, perm), o);
}

static nb_tensor *attention(const char *fn, const nb_tree *p, const char *prefix, nb_tensor *x,
                            int n_heads, bool causal, nb_tensor *key, double dropout) {
  if (nbi_any_null(fn, &x, 1) || !check_rate(fn, dropout)) return NULL;
  nb_shape s = nb_shape_of(x);
  if (s.ndim < 2) {
    char b[160];
    nbi_error(NB_ERR_SHAPE, "%s: the input %s is not [..., T, dim]", fn,
              nb_shape_str(s, b, sizeof b));
    return NULL;
  }
  int64_t dim = s.dims[s.ndim - 1];
  if (n_heads < 1 || dim % n_heads) {
    nbi_error(NB_ERR_ARG, "%s: n_heads %d does not divide the width %lld", fn, n_heads,
              (long long)dim);
    return NULL;
  }
  nb_tensor *q = nbi_nn_linear(fn, p, prefix, "w_q", "b_q", x);
  nb_tensor *k = q ? nbi_nn_linear(fn, p, prefix, "w_k", "b_k", x) : NULL;
  nb_tensor *v = k ? nbi_nn_linear(fn, p, prefix, "w_v", "b_v", x) : NULL;
  if (!v) return NULL;
  nb_attention_params ap = {.causal = causal};
  nb_tensor *y = join_heads(nb_attention_ex(split_heads(q, n_heads), split_heads(k, n_heads),
                                            split_heads(v, n_heads), &ap));
  y = y ? nbi_nn_linear(fn, p, prefix, "w_o", "b_o", y) : NULL;
  return y ? drop(y, key, dropout) : NULL;
}

/* ---- the block ------------------------------------------------------------------------------- */
static bool check_block(const char *fn, const nb_block_config *c) {
  if (!c) {
    nbi_error(NB_ERR_NULL, "%s: the config is NULL", fn);
    return false;
  }
  if (!nbi_nn_check_dim(fn, "dim", c->dim) || !check_rate(fn, c->dropout)) return false;
  if (c->n_heads < 1 || c->dim % c->n_heads) {
    nbi_error(NB_ERR_ARG, "%s: n_heads %d does not divide dim %lld", fn, c->n_heads,
              (long long)c->dim);
    return false;
  }
  if (c->hidden < 0 || !(c->eps >= 0) || !isfinite(c->eps)) {
    nbi_error(NB_ERR_ARG, "%s: hidden %lld or eps %g is negative or not finite", fn,
              (long long)c->hidden, c->eps);
    return false;
  }
  return true;
}

static int64_t hidden_of(const nb_block_config *c) { return c->hidden ? c->hidden : 4 * c->dim; }
static double eps_of(const nb_block_config *c) { return c->eps ? c->eps : 1e-5; }

static nb_tree *block_init(const char *fn, nb_tensor *key, const nb_block_config *c, nb_dtype dt) {
  if (!check_block(fn, c) || !nbi_nn_check_float(fn, dt)) return NULL;
  nb_tensor *k[2];
  if (nb_key_split(key, 2, k)) return NULL;
  nb_tree *t = nb_tree_create();
  int64_t widths[3] = {c->dim, hidden_of(c), c->dim};
  bool ok = t && nbi_nn_set_tree(t, "ln_1", nbi_nn_norm_init(fn, c->dim, c->bias, dt)) &&
            nbi_nn_set_tree(t, "attn", attention_init(fn, k[0], c->dim, c->bias, dt)) &&
            nbi_nn_set_tree(t, "ln_2", nbi_nn_norm_init(fn, c->dim, c->bias, dt)) &&
            nbi_nn_set_tree(t, "mlp", nbi_nn_mlp_init(k[1], widths, 2, c->bias, dt));
  return nbi_nn_finish(t, ok);
}

/* name = prefix + "." + part (or part) */
static const char *sub(char *buf, size_t cap, const char *prefix, const char *part) {
  snprintf(buf, cap, "%s%s%s", prefix && prefix[0] ? prefix : "", prefix && prefix[0] ? "." : "",
           part);
  return buf;
}

static nb_tensor *block(const char *fn, const nb_tree *p, const char *prefix,
                        const nb_block_config *c, nb_tensor *x, nb_tensor *key) {
  if (!check_block(fn, c) || nbi_any_null(fn, &x, 1)) return NULL;
  nb_tensor *k[2] = {NULL, NULL};
  if (key && c->dropout > 0 && nb_key_split(key, 2, k)) return NULL;
  char name[NBI_NN_NAME];
  double eps = eps_of(c);
  nb_tensor *h = nbi_nn_layer_norm(fn, p, sub(name, sizeof name, prefix, "ln_1"), x, eps);
  h = h ? attention(fn, p, sub(name, sizeof name, prefix, "attn"), h, c->n_heads, true, k[0],
                    c->dropout)
        : NULL;
  x = h ? nb_add(x, h) : NULL;
  h = x ? nbi_nn_layer_norm(fn, p, sub(name, sizeof name, prefix, "ln_2"), x, eps) : NULL;
  h = h ? nbi_nn_mlp(fn, p, sub(name, sizeof name, prefix, "mlp"), h, nb_gelu_tanh) : NULL;
  return h ? nb_add(x, drop(h, k[1], c->dropout)) : NULL;
}

/* ---- GPT ------------------------------------------------------------------------------------- */
static bool check_gpt(const char *fn, const nb_gpt_config *c) {
  if (!c) {
    nbi_error(NB_ERR_NULL, "%s: the config is NULL", fn);
    return false;
  }
  if (!nbi_nn_check_dim(fn, "vocab", c->vocab) || !nbi_nn_check_dim(fn, "context", c->context))
    return false;
  if (c->n_layers < 1 || c->n_layers > 4096) {
    nbi_error(NB_ERR_ARG, "%s: n_layers is %d (need 1 to 4096)", fn, c->n_layers);
    return false;
  }
  return check_block(fn, &c->block);
}

static nb_tree *gpt_init(const char *fn, nb_tensor *key, const nb_gpt_config *c, nb_dtype dt) {
  if (!check_gpt(fn, c) || !nbi_nn_check_float(fn, dt)) return NULL;
  int n = c->n_layers + 3;
  nb_tensor **k = malloc(sizeof *k * (size_t)n);
  nb_tree *t = k ? nb_tree_create() : NULL;
  if (!t) {
    free(k);
    if (!nb_last_status()) nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  int64_t d = c->block.dim;
  bool ok = nb_key_split(key, n, k) == NB_OK &&
            nbi_nn_set_tree(t, "wte", nb_embedding_init(k[0], c->vocab, d, dt)) &&
            nbi_nn_set_tree(t, "wpe", nb_embedding_init(k[1], c->context, d, dt));
  for (int i = 0; i < c->n_layers && ok; i++) {
    char name[32];
    snprintf(name, sizeof name, "h.%d", i);
    ok = nbi_nn_set_tree(t, name, block_init(fn, k[3 + i], &c->block, dt));
  }
  ok = ok && nbi_nn_set_tree(t, "ln_f", nbi_nn_norm_init(fn, d, c->block.bias, dt)) &&
       nbi_nn_set_tree(t, "lm_head", nbi_nn_linear_init(k[2], d, c->vocab, false, dt));
  free(k);
  return nbi_nn_finish(t, ok);
}

static nb_tensor *gpt(const char *fn, const nb_tree *p, const nb_gpt_config *c, nb_tensor *idx,
                      nb_tensor *key) {
  if (!check_gpt(fn, c) || nbi_any_null(fn, &idx, 1)) return NULL;
  nb_shape s = nb_shape_of(idx);
  if (s.ndim < 1 || s.dims[s.ndim - 1] > c->context) {
    char b[160];
    nbi_error(NB_ERR_SHAPE, "%s: the tokens %s are not [..., T] with T <= context %lld", fn,
              nb_shape_str(s, b, sizeof b), (long long)c->context);
    return NULL;
  }
  int64_t T = s.dims[s.ndim - 1], d = c->block.dim;
  nb_tensor *wte = nbi_nn_param(fn, p, "wte", "w", 2, (int64_t[]){c->vocab, d});
  nb_tensor *wpe = wte ? nbi_nn_param(fn, p, "wpe", "w", 2, (int64_t[]){c->context, d}) : NULL;
  if (!wpe) return NULL;
  int n = c->n_layers + 1;
  bool dropping = key && c->block.dropout > 0;
  nb_tensor **k = calloc((size_t)n, sizeof *k);
  if (!k) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  nb_tensor *x = NULL;
  if (!dropping || nb_key_split(key, n, k) == NB_OK) {
    nb_tensor *pos = nb_embedding(wpe, nb_arange(0, (double)T, 1, NB_I64));
    x = nb_add(nb_embedding(wte, idx), pos);
    x = x ? drop(x, k[0], c->block.dropout) : NULL;
  }
  for (int i = 0; i < c->n_layers && x; i++) {
    char name[32];
    snprintf(name, sizeof name, "h.%d", i);
    x = block(fn, p, name, &c->block, x, k[1 + i]);
  }
  free(k);
  x = x ? nbi_nn_layer_norm(fn, p, "ln_f", x, eps_of(&c->block)) : NULL;
  return x ? nbi_nn_linear(fn, p, "lm_head", "w", "b", x) : NULL;
}

/* ---- the public functions (in their error contexts) ------------------------------------------ */
#define NN_WRAP(type, name, call)                                                                  \
  const char *outer = nbi_error_context_begin(name);                                               \
  type r = call;                                                                                   \
  nbi_error_context_end(outer);                                                                    \
  return r

nb_tree *nb_self_attention_init(nb_tensor *key, int64_t dim, bool bias, nb_dtype dt) {
  NN_WRAP(nb_tree *, "nb_self_attention_init",
          attention_init("nb_self_attention_init", key, dim, bias, dt));
}
nb_tensor *nb_self_attention_apply(const nb_tree *p, nb_tensor *x, int n_heads, bool causal,
                                   nb_tensor *key, double dropout) {
  NN_WRAP(nb_tensor *, "nb_self_attention_apply",
          attention("nb_self_attention_apply", p, NULL, x, n_heads, causal, key, dropout));
}
nb_tree *nb_block_init(nb_tensor *key, const nb_block_config *c, nb_dtype dt) {
  NN_WRAP(nb_tree *, "nb_block_init", block_init("nb_block_init", key, c, dt));
}
nb_tensor *nb_block_apply(const nb_tree *p, const nb_block_config *c, nb_tensor *x,
                          nb_tensor *key) {
  NN_WRAP(nb_tensor *, "nb_block_apply", block("nb_block_apply", p, NULL, c, x, key));
}
nb_tree *nb_gpt_init(nb_tensor *key, const nb_gpt_config *c, nb_dtype dt) {
  NN_WRAP(nb_tree *, "nb_gpt_init", gpt_init("nb_gpt_init", key, c, dt));
}
nb_tensor *nb_gpt_apply(const nb_tree *p, const nb_gpt_config *c, nb_tensor *idx, nb_tensor *key) {
  NN_WRAP(nb_tensor *, "nb_gpt_apply", gpt("nb_gpt_apply", p, c, idx, key));
}
