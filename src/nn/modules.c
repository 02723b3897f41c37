/* src/nn/modules.c — the basic modules of include/nabla/nn.h: linear,
 * embedding, layer norm, RMS norm and MLP. Each init draws PyTorch's default
 * initializer from a key into a new tree; each apply reads its tree by name
 * and composes public ops, so it traces, differentiates and batches as they
 * do. nn_util.h holds what transformer.c shares with this file. */
#include "nn_util.h"

#include <math.h>
#include <stdio.h>

/* ---- shared helpers (nn_util.h) ------------------------------------------------------------- */
bool nbi_nn_check_float(const char *fn, nb_dtype dt) {
  if (nb_dtype_is_float(dt)) return true;
  nbi_error(NB_ERR_DTYPE, "%s: dtype %s is not a float dtype", fn, nb_dtype_name(dt));
  return false;
}

bool nbi_nn_check_dim(const char *fn, const char *what, int64_t v) {
  if (v >= 1) return true;
  nbi_error(NB_ERR_ARG, "%s: %s is %lld (need >= 1)", fn, what, (long long)v);
  return false;
}

/* prefix + "." + name (prefix NULL or "": name) into buf. */
static const char *full_name(char *buf, size_t cap, const char *prefix, const char *name) {
  if (prefix && prefix[0])
    snprintf(buf, cap, "%s.%s", prefix, name);
  else
    snprintf(buf, cap, "%s", name);
  return buf;
}

bool nbi_nn_has(const nb_tree *p, const char *prefix, const char *name) {
  char full[NBI_NN_NAME];
  return nb_tree_find(p, full_name(full, sizeof full, prefix, name)) >= 0;
}

nb_tensor *nbi_nn_param(const char *fn, const nb_tree *p, const char *prefix, const char *name,
                        int ndim, const int64_t *dims) {
  if (!p) {
    nbi_error(NB_ERR_NULL, "%s: the parameter tree is NULL", fn);
    return NULL;
  }
  char full[NBI_NN_NAME];
  full_name(full, sizeof full, prefix, name);
  nb_tensor *t = nb_tree_get(p, full);
  if (!t) {
    nbi_error(NB_ERR_ARG, "%s: the parameter tree has no \"%s\"", fn, full);
    return NULL;
  }
  nb_shape s = nb_shape_of(t);
  bool ok = s.ndim == ndim;
  for (int d = 0; d < ndim && ok; d++)
    ok = dims[d] < 0 || s.dims[d] == dims[d];
  if (!ok) {
    char got[160], want[160] = "[";
    for (int d = 0; d < ndim; d++) {
      size_t n = strlen(want);
      if (dims[d] < 0)
        snprintf(want + n, sizeof want - n, "%s*", d ? "," : "");
      else
        snprintf(want + n, sizeof want - n, "%s%lld", d ? "," : "", (long long)dims[d]);
    }
    strncat(want, "]", sizeof want - strlen(want) - 1);
    nbi_error(NB_ERR_SHAPE, "%s: parameter \"%s\" has shape %s, expected %s", fn, full,
              nb_shape_str(s, got, sizeof got), want);
    return NULL;
  }
  if (!nb_dtype_is_float(nb_dtype_of(t))) {
    nbi_error(NB_ERR_DTYPE, "%s: parameter \"%s\" has dtype %s, not a float dtype", fn, full,
              nb_dtype_name(nb_dtype_of(t)));
    return NULL;
  }
  return t;
}

bool nbi_nn_set(nb_tree *t, const char *name, nb_tensor *x) {
  return x && nb_tree_set(t, name, x) == NB_OK;
}

bool nbi_nn_set_tree(nb_tree *t, const char *prefix, nb_tree *sub) {
  bool ok = sub && nb_tree_set_tree(t, prefix, sub) == NB_OK;
  nb_tree_release(sub);
  return ok;
}

nb_tree *nbi_nn_finish(nb_tree *t, bool ok) {
  if (ok) return t;
  nb_tree_release(t);
  return NULL;
}

/* U(-bound, bound) of shape s and dtype dt; f16 and bf16 are drawn in f32
 * and rounded once. */
static nb_tensor *uniform(nb_tensor *key, nb_shape s, double bound, nb_dtype dt) {
  nb_dtype ct = dt == NB_F16 || dt == NB_BF16 ? NB_F32 : dt;
  nb_tensor *u = nb_add_scalar(nb_mul_scalar(nb_random_uniform(key, s, ct), 2 * bound), -bound);
  return ct == dt ? u : nb_cast(u, dt);
}

/* ---- linear ---------------------------------------------------------------------------------- */
nb_tree *nbi_nn_linear_init(nb_tensor *key, int64_t in, int64_t out, bool bias, nb_dtype dt) {
  const char *fn = "nb_linear_init";
  if (!nbi_nn_check_dim(fn, "in", in) || !nbi_nn_check_dim(fn, "out", out) ||
      !nbi_nn_check_float(fn, dt))
    return NULL;
  nb_tensor *k[2];
  if (nb_key_split(key, 2, k)) return NULL;
  nb_tree *t = nb_tree_create();
  if (!t) return NULL;
  double bound = 1.0 / sqrt((double)in); /* kaiming_uniform(a = sqrt 5): 1 / sqrt(fan_in) */
  bool ok = nbi_nn_set(t, "w", uniform(k[0], NB_SHAPE(in, out), bound, dt));
  if (ok && bias) ok = nbi_nn_set(t, "b", uniform(k[1], NB_SHAPE(out), bound, dt));
  return nbi_nn_finish(t, ok);
}

nb_tensor *nbi_nn_linear(const char *fn, const nb_tree *p, const char *prefix, const char *w_name,
                         const char *b_name, nb_tensor *x) {
  if (nbi_any_null(fn, &x, 1)) return NULL;
  if (nb_ndim(x) < 1) {
    nbi_error(NB_ERR_SHAPE, "%s: the input is 0-d (need [..., in])", fn);
    return NULL;
  }
  int64_t in = nb_shape_of(x).dims[nb_ndim(x) - 1];
  nb_tensor *w = nbi_nn_param(fn, p, prefix, w_name, 2, (int64_t[]){in, -1});
  if (!w) return NULL;
  nb_tensor *y = nb_matmul(x, w);
  if (nbi_nn_has(p, prefix, b_name)) {
    nb_tensor *b = nbi_nn_param(fn, p, prefix, b_name, 1, (int64_t[]){nb_shape_of(w).dims[1]});
    y = b ? nb_add(y, b) : NULL;
  }
  return y;
}

/* ---- embedding ------------------------------------------------------------------------------- */
static nb_tree *embedding_init(nb_tensor *key, int64_t vocab, int64_t dim, nb_dtype dt) {
  const char *fn = "nb_embedding_init";
  if (!nbi_nn_check_dim(fn, "vocab", vocab) || !nbi_nn_check_dim(fn, "dim", dim) ||
      !nbi_nn_check_float(fn, dt))
    return NULL;
  nb_tree *t = nb_tree_create();
  if (!t) return NULL;
  nb_dtype ct = dt == NB_F16 || dt == NB_BF16 ? NB_F32 : dt;
  nb_tensor *w = nb_random_normal(key, NB_SHAPE(vocab, dim), ct);
  return nbi_nn_finish(t, nbi_nn_set(t, "w", ct == dt ? w : nb_cast(w, dt)));
}

static nb_tensor *embedding_apply(const nb_tree *p, nb_tensor *idx) {
  nb_tensor *w = nbi_nn_param("nb_embedding_apply", p, NULL, "w", 2, (int64_t[]){-1, -1});
  return w ? nb_embedding(w, idx) : NULL;
}

/* ---- norms ----------------------------------------------------------------------------------- */
nb_tree *nbi_nn_norm_init(const char *fn, int64_t dim, bool bias, nb_dtype dt) {
  if (!nbi_nn_check_dim(fn, "dim", dim) || !nbi_nn_check_float(fn, dt)) return NULL;
  nb_tree *t = nb_tree_create();
  if (!t) return NULL;
  bool ok = nbi_nn_set(t, "w", nb_ones(NB_SHAPE(dim), dt));
  if (ok && bias) ok = nbi_nn_set(t, "b", nb_zeros(NB_SHAPE(dim), dt));
  return nbi_nn_finish(t, ok);
}

nb_tensor *nbi_nn_layer_norm(const char *fn, const nb_tree *p, const char *prefix, nb_tensor *x,
                             double eps) {
  if (nbi_any_null(fn, &x, 1)) return NULL;
  if (!(eps >= 0) || !isfinite(eps)) {
    nbi_error(NB_ERR_ARG, "%s: eps %g is not a finite value >= 0", fn, eps);
    return NULL;
  }
  int64_t d = nb_ndim(x) >= 1 ? nb_shape_of(x).dims[nb_ndim(x) - 1] : -1;
  nb_tensor *w = nbi_nn_param(fn, p, prefix, "w", 1, &d), *b = NULL;
  if (!w) return NULL;
  if (nbi_nn_has(p, prefix, "b") && !(b = nbi_nn_param(fn, p, prefix, "b", 1, &d))) return NULL;
  return nb_layer_norm(x, w, b, eps);
}

static nb_tensor *rms_norm_apply(const nb_tree *p, nb_tensor *x, double eps) {
  const char *fn = "nb_rms_norm_apply";
  if (nbi_any_null(fn, &x, 1)) return NULL;
  if (!(eps >= 0) || !isfinite(eps)) {
    nbi_error(NB_ERR_ARG, "%s: eps %g is not a finite value >= 0", fn, eps);
    return NULL;
  }
  int64_t d = nb_ndim(x) >= 1 ? nb_shape_of(x).dims[nb_ndim(x) - 1] : -1;
  nb_tensor *w = nbi_nn_param(fn, p, NULL, "w", 1, &d);
  return w ? nb_rms_norm(x, w, eps) : NULL;
}

/* ---- MLP ------------------------------------------------------------------------------------- */
nb_tree *nbi_nn_mlp_init(nb_tensor *key, const int64_t *widths, int n_layers, bool bias,
                         nb_dtype dt) {
  const char *fn = "nb_mlp_init";
  if (!widths) {
    nbi_error(NB_ERR_NULL, "%s: widths is NULL", fn);
    return NULL;
  }
  if (n_layers < 1 || n_layers > 4096) {
    nbi_error(NB_ERR_ARG, "%s: n_layers is %d (need 1 to 4096)", fn, n_layers);
    return NULL;
  }
  nb_tensor **k = malloc(sizeof *k * (size_t)n_layers);
  nb_tree *t = k ? nb_tree_create() : NULL;
  if (!t) {
    free(k);
    if (!nb_last_status()) nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  bool ok = nb_key_split(key, n_layers, k) == NB_OK;
  for (int i = 0; i < n_layers && ok; i++) {
    char name[16];
    snprintf(name, sizeof name, "%d", i);
    ok = nbi_nn_set_tree(t, name, nbi_nn_linear_init(k[i], widths[i], widths[i + 1], bias, dt));
  }
  free(k);
  return nbi_nn_finish(t, ok);
}

nb_tensor *nbi_nn_mlp(const char *fn, const nb_tree *p, const char *prefix, nb_tensor *x,
                      nb_activation_fn act) {
  if (!act) {
    nbi_error(NB_ERR_NULL, "%s: the activation is NULL", fn);
    return NULL;
  }
  if (!p) {
    nbi_error(NB_ERR_NULL, "%s: the parameter tree is NULL", fn);
    return NULL;
  }
  char layer[NBI_NN_NAME];
  int n = 0;
  for (;; n++) { /* layers "0", "1", ... up to the first missing one */
    snprintf(layer, sizeof layer, "%s%s%d", prefix && prefix[0] ? prefix : "",
             prefix && prefix[0] ? "." : "", n);
    if (!nbi_nn_has(p, layer, "w")) break;
  }
  if (n == 0) {
    char full[NBI_NN_NAME];
    nbi_error(NB_ERR_ARG, "%s: the parameter tree has no \"%s\"", fn,
              full_name(full, sizeof full, prefix, "0.w"));
    return NULL;
  }
  for (int i = 0; i < n && x; i++) {
    snprintf(layer, sizeof layer, "%s%s%d", prefix && prefix[0] ? prefix : "",
             prefix && prefix[0] ? "." : "", i);
    x = nbi_nn_linear(fn, p, layer, "w", "b", x);
    if (x && i + 1 < n) x = act(x);
  }
  return x;
}

/* ---- the public functions: each runs in its error context (an inner op's error
 *      names the module the user called) --------------------------------------------------- */
#define NN_WRAP(type, name, call)                                                                  \
  const char *outer = nbi_error_context_begin(name);                                               \
  type r = call;                                                                                   \
  nbi_error_context_end(outer);                                                                    \
  return r

nb_tree *nb_linear_init(nb_tensor *key, int64_t in, int64_t out, bool bias, nb_dtype dt) {
  NN_WRAP(nb_tree *, "nb_linear_init", nbi_nn_linear_init(key, in, out, bias, dt));
}
nb_tensor *nb_linear_apply(const nb_tree *p, nb_tensor *x) {
  NN_WRAP(nb_tensor *, "nb_linear_apply", nbi_nn_linear("nb_linear_apply", p, NULL, "w", "b", x));
}
nb_tree *nb_embedding_init(nb_tensor *key, int64_t vocab, int64_t dim, nb_dtype dt) {
  NN_WRAP(nb_tree *, "nb_embedding_init", embedding_init(key, vocab, dim, dt));
}
nb_tensor *nb_embedding_apply(const nb_tree *p, nb_tensor *idx) {
  NN_WRAP(nb_tensor *, "nb_embedding_apply", embedding_apply(p, idx));
}
nb_tree *nb_layer_norm_init(int64_t dim, bool bias, nb_dtype dt) {
  NN_WRAP(nb_tree *, "nb_layer_norm_init", nbi_nn_norm_init("nb_layer_norm_init", dim, bias, dt));
}
nb_tensor *nb_layer_norm_apply(const nb_tree *p, nb_tensor *x, double eps) {
  NN_WRAP(nb_tensor *, "nb_layer_norm_apply",
          nbi_nn_layer_norm("nb_layer_norm_apply", p, NULL, x, eps));
}
nb_tree *nb_rms_norm_init(int64_t dim, nb_dtype dt) {
  NN_WRAP(nb_tree *, "nb_rms_norm_init", nbi_nn_norm_init("nb_rms_norm_init", dim, false, dt));
}
nb_tensor *nb_rms_norm_apply(const nb_tree *p, nb_tensor *x, double eps) {
  NN_WRAP(nb_tensor *, "nb_rms_norm_apply", rms_norm_apply(p, x, eps));
}
nb_tree *nb_mlp_init(nb_tensor *key, const int64_t *widths, int n_layers, bool bias, nb_dtype dt) {
  NN_WRAP(nb_tree *, "nb_mlp_init", nbi_nn_mlp_init(key, widths, n_layers, bias, dt));
}
nb_tensor *nb_mlp_apply(const nb_tree *p, nb_tensor *x, nb_activation_fn act) {
  NN_WRAP(nb_tensor *, "nb_mlp_apply", nbi_nn_mlp("nb_mlp_apply", p, NULL, x, act));
}
