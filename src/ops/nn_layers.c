/* src/ops/nn_layers.c — neural-network helpers composed from nabla ops, so
 * they are differentiable and transformable without rules of their own.
 * (conv2d and max_pool2d are primitives: src/ops/nn_conv.c.) */
#include "../core/nbi.h"
#include "index.h"

#include <float.h>
#include <math.h>

/* Checks that an optional per-feature parameter is [d] (d = x's last dim). */
static bool check_feature_param(const char *fn, const char *what, nb_tensor *x, nb_tensor *p) {
  if (!p) return true;
  nb_shape xs = nb_shape_of(x), ps = nb_shape_of(p);
  if (ps.ndim != 1 || xs.ndim < 1 || ps.dims[0] != xs.dims[xs.ndim - 1]) {
    char a[160], b[160];
    nbi_error(NB_ERR_SHAPE, "%s: %s of shape %s does not match the last dim of input %s", fn, what,
              nb_shape_str(ps, a, sizeof a), nb_shape_str(xs, b, sizeof b));
    return false;
  }
  return true;
}

static bool check_float(const char *fn, nb_tensor *x) {
  if (nb_dtype_is_float(nb_dtype_of(x))) return true;
  nbi_error(NB_ERR_DTYPE, "%s: input dtype %s is not a float dtype", fn,
            nb_dtype_name(nb_dtype_of(x)));
  return false;
}

static bool check_rank_at_least(const char *fn, const char *what, nb_tensor *x, int r) {
  if (nb_ndim(x) >= r) return true;
  char b[160];
  nbi_error(NB_ERR_SHAPE, "%s: %s of shape %s needs at least %d dims", fn, what,
            nb_shape_str(nb_shape_of(x), b, sizeof b), r);
  return false;
}

/* The dtype a norm computes in for result dtype dt: f16 and bf16 in f32, as
 * PyTorch and Flax do: the statistics of |x| >= 256 overflow f16 ((x - mean)^2
 * reaches 65536), and bf16's 8-bit mantissa would round them coarsely. */
static nb_dtype norm_compute_dtype(nb_dtype dt) {
  return dt == NB_F16 || dt == NB_BF16 ? NB_F32 : dt;
}

/* p (a norm's input or parameter, or NULL) in dtype ct. */
static nb_tensor *to_dtype(nb_tensor *p, nb_dtype ct) {
  return p && nb_dtype_of(p) != ct ? nb_cast(p, ct) : p;
}

static nb_tensor *layer_norm_body(nb_tensor *x, nb_tensor *weight, nb_tensor *bias, double eps) {
  if (nbi_any_null("nb_layer_norm", &x, 1)) return NULL;
  if (!check_float("nb_layer_norm", x) || !check_rank_at_least("nb_layer_norm", "input", x, 1) ||
      !check_feature_param("nb_layer_norm", "weight", x, weight) ||
      !check_feature_param("nb_layer_norm", "bias", x, bias))
    return NULL;
  nb_dtype dt = nb_dtype_of(x); /* the result's: x's, promoted with the parameters' */
  if (weight) dt = nb_promote_types(dt, nb_dtype_of(weight));
  if (bias) dt = nb_promote_types(dt, nb_dtype_of(bias));
  nb_dtype ct = norm_compute_dtype(dt);
  nb_tensor *xf = to_dtype(x, ct);
  nb_tensor *xc = nb_sub(xf, nb_mean(xf, NB_AXES(-1), true));
  nb_tensor *var = nb_mean(nb_square(xc), NB_AXES(-1), true);
  nb_tensor *y = nb_mul(xc, nb_rsqrt(nb_add_scalar(var, eps)));
  if (weight) y = nb_mul(y, to_dtype(weight, ct));
  if (bias) y = nb_add(y, to_dtype(bias, ct));
  return to_dtype(y, dt);
}

static nb_tensor *rms_norm_body(nb_tensor *x, nb_tensor *weight, double eps) {
  if (nbi_any_null("nb_rms_norm", &x, 1)) return NULL;
  if (!check_float("nb_rms_norm", x) || !check_rank_at_least("nb_rms_norm", "input", x, 1) ||
      !check_feature_param("nb_rms_norm", "weight", x, weight))
    return NULL;
  nb_dtype dt = weight ? nb_promote_types(nb_dtype_of(x), nb_dtype_of(weight)) : nb_dtype_of(x);
  nb_dtype ct = norm_compute_dtype(dt);
  nb_tensor *xf = to_dtype(x, ct);
  nb_tensor *ms = nb_mean(nb_square(xf), NB_AXES(-1), true);
  nb_tensor *y = nb_mul(xf, nb_rsqrt(nb_add_scalar(ms, eps)));
  return to_dtype(weight ? nb_mul(y, to_dtype(weight, ct)) : y, dt);
}

static nb_tensor *cross_entropy_body(nb_tensor *logits, nb_tensor *labels) {
  if (nbi_any_null("nb_cross_entropy", (nb_tensor *[]){logits, labels}, 2)) return NULL;
  if (!check_float("nb_cross_entropy", logits) ||
      !check_rank_at_least("nb_cross_entropy", "logits", logits, 1))
    return NULL;
  nb_shape ls = nb_shape_of(logits), ys = nb_shape_of(labels);
  nb_dtype ydt = nb_dtype_of(labels);
  char a[160], b[160];
  nb_tensor *logp = nb_log_softmax(logits, -1);
  if (nbi_dtype_is_int(ydt)) { /* class indices: labels.shape == logits.shape[:-1] */
    nb_shape want = ls;
    want.ndim--;
    if (!nbi_shape_eq(&want, &ys)) {
      nbi_error(NB_ERR_SHAPE,
                "nb_cross_entropy: class labels %s must have the shape of logits %s "
                "without its last dim",
                nb_shape_str(ys, a, sizeof a), nb_shape_str(ls, b, sizeof b));
      return NULL;
    }
    /* labels out of [0, C) fail at realization naming nb_cross_entropy (index.h) */
    nb_tensor *picked =
        nbi_take_along_axis_as(logp, nb_unsqueeze(labels, -1), -1, NBI_INDEX_CROSS_ENTROPY);
    return nb_neg(nb_mean(picked, NB_ALL, false));
  }
  if (!nb_dtype_is_float(ydt)) {
    nbi_error(NB_ERR_DTYPE,
              "nb_cross_entropy: labels dtype %s is neither integer classes nor "
              "float probabilities",
              nb_dtype_name(ydt));
    return NULL;
  }
  if (!nbi_shape_eq(&ls, &ys)) {
    nbi_error(NB_ERR_SHAPE, "nb_cross_entropy: probability labels %s must match logits %s",
              nb_shape_str(ys, a, sizeof a), nb_shape_str(ls, b, sizeof b));
    return NULL;
  }
  nb_tensor *per_row = nb_sum(nb_mul(labels, logp), NB_AXES(-1), false);
  return nb_neg(nb_mean(per_row, NB_ALL, false));
}

static nb_tensor *mse_body(nb_tensor *pred, nb_tensor *target) {
  if (nbi_any_null("nb_mse", (nb_tensor *[]){pred, target}, 2)) return NULL;
  return nb_mean(nb_square(nb_sub(pred, target)), NB_ALL, false);
}

static nb_tensor *dropout_body(nb_tensor *t, double p, bool training) {
  if (nbi_any_null("nb_dropout", &t, 1)) return NULL;
  if (!(p >= 0 && p < 1)) {
    nbi_error(NB_ERR_ARG, "nb_dropout: p = %g is outside [0, 1)", p);
    return NULL;
  }
  if (!check_float("nb_dropout", t)) return NULL;
  if (!training || p == 0) return nb_reshape(t, nb_shape_of(t)); /* a new handle, same data */
  if (nbi_trace_depth > 0) {
    nbi_error(NB_ERR_STATE,
              "nb_dropout: training dropout inside a traced function (nb_jit, nb_grad, nb_vjp_fn, "
              "...) would draw one mask at trace time: pass a key and use nb_dropout_key");
    return NULL;
  }
  nb_tensor *keep = nb_ge_scalar(nb_rand(nb_shape_of(t), NB_F32), p);
  return nb_mul(t, nb_mul_scalar(nb_cast(keep, nb_dtype_of(t)), 1.0 / (1.0 - p)));
}

static nb_tensor *embedding_body(nb_tensor *table, nb_tensor *idx) {
  if (nbi_any_null("nb_embedding", (nb_tensor *[]){table, idx}, 2)) return NULL;
  if (nb_ndim(table) != 2) {
    char b[160];
    nbi_error(NB_ERR_SHAPE, "nb_embedding: table of shape %s is not [vocab, dim]",
              nb_shape_str(nb_shape_of(table), b, sizeof b));
    return NULL;
  }
  if (!nbi_dtype_is_int(nb_dtype_of(idx))) {
    nbi_error(NB_ERR_DTYPE,
              "nb_embedding: indices must be integers (i32, i64, u8, i8 or i16), got %s",
              nb_dtype_name(nb_dtype_of(idx)));
    return NULL;
  }
  /* rows out of [0, V) fail at realization naming nb_embedding (index.h) */
  return nbi_take_as(table, idx, 0, NBI_INDEX_EMBEDDING);
}

/* Most negative finite value of a float dtype: masked scores, as JAX does, so a
 * fully masked row gives a uniform average instead of NaN. */
static double lowest(nb_dtype dt) {
  switch (dt) {
  case NB_F64: return -DBL_MAX;
  case NB_F16: return -65504.0;
  case NB_BF16: return -3.3895313892515355e38;
  default: return -FLT_MAX;
  }
}

static nb_tensor *attention_body(nb_tensor *q, nb_tensor *k, nb_tensor *v, nb_tensor *mask,
                                 bool causal, double scale) {
  if (nbi_any_null("nb_attention", (nb_tensor *[]){q, k, v}, 3)) return NULL;
  if (!isfinite(scale)) {
    nbi_error(NB_ERR_ARG, "nb_attention: scale %g is not finite", scale);
    return NULL;
  }
  if (!check_float("nb_attention", q) || !check_rank_at_least("nb_attention", "q", q, 2) ||
      !check_rank_at_least("nb_attention", "k", k, 2) ||
      !check_rank_at_least("nb_attention", "v", v, 2))
    return NULL;
  nb_shape qs = nb_shape_of(q), ks = nb_shape_of(k), vs = nb_shape_of(v);
  if (qs.dims[qs.ndim - 1] != ks.dims[ks.ndim - 1] ||
      ks.dims[ks.ndim - 2] != vs.dims[vs.ndim - 2]) {
    char a[160], b[160], c[160];
    nbi_error(NB_ERR_SHAPE,
              "nb_attention: q %s, k %s, v %s are not [..,Lq,d], [..,Lk,d], [..,Lk,dv]",
              nb_shape_str(qs, a, sizeof a), nb_shape_str(ks, b, sizeof b),
              nb_shape_str(vs, c, sizeof c));
    return NULL;
  }
  if (mask && nb_dtype_of(mask) != NB_BOOL) {
    nbi_error(NB_ERR_DTYPE, "nb_attention: mask dtype %s is not bool",
              nb_dtype_name(nb_dtype_of(mask)));
    return NULL;
  }
  /* the scores' shape: q's and k's batch dims broadcast, then [Lq, Lk]; the
   * mask broadcasts to it without growing it */
  nb_shape qb = qs, kb = ks, sb = {.ndim = qs.ndim > ks.ndim ? qs.ndim - 2 : ks.ndim - 2};
  qb.ndim -= 2, kb.ndim -= 2;
  for (int d = 0; d < sb.ndim; d++) {
    int dq = d - (sb.ndim - qb.ndim), dk = d - (sb.ndim - kb.ndim);
    int64_t x = dq >= 0 ? qb.dims[dq] : 1, y = dk >= 0 ? kb.dims[dk] : 1;
    if (x != y && x != 1 && y != 1) {
      char a[160], b[160];
      nbi_error(NB_ERR_SHAPE, "nb_attention: the batch dims of q %s and k %s do not broadcast",
                nb_shape_str(qs, a, sizeof a), nb_shape_str(ks, b, sizeof b));
      return NULL;
    }
    sb.dims[d] = x == 1 ? y : x;
  }
  sb.dims[sb.ndim++] = qs.dims[qs.ndim - 2];
  sb.dims[sb.ndim++] = ks.dims[ks.ndim - 2];
  nb_shape ms = mask ? nb_shape_of(mask) : sb;
  bool fits = ms.ndim <= sb.ndim;
  for (int d = 0; d < ms.ndim && fits; d++)
    fits = ms.dims[d] == 1 || ms.dims[d] == sb.dims[d + sb.ndim - ms.ndim];
  if (!fits) {
    char a[160], b[160];
    nbi_error(NB_ERR_SHAPE,
              "nb_attention: mask %s does not broadcast to the scores [..., Lq, Lk] %s",
              nb_shape_str(ms, a, sizeof a), nb_shape_str(sb, b, sizeof b));
    return NULL;
  }
  if (scale == 0) scale = 1.0 / sqrt((double)qs.dims[qs.ndim - 1]);
  nb_tensor *scores = nb_mul_scalar(nb_matmul(q, nb_transpose(k)), scale);
  if (causal) { /* key j <= query i: tril(ones(Lq, Lk)) */
    int64_t lq = qs.dims[qs.ndim - 2], lk = ks.dims[ks.ndim - 2];
    nb_tensor *rows = nb_reshape(nb_arange(0, (double)lq, 1, NB_I64), NB_SHAPE(lq, 1));
    nb_tensor *cols = nb_reshape(nb_arange(0, (double)lk, 1, NB_I64), NB_SHAPE(1, lk));
    nb_tensor *tril = nb_le(cols, rows);
    mask = mask ? nb_logical_and(mask, tril) : tril;
  }
  if (mask) {
    nb_tensor *low = nb_scalar(lowest(nb_dtype_of(scores)), nb_dtype_of(scores));
    scores = nb_where(mask, scores, low);
  }
  return nb_matmul(nb_softmax(scores, -1), v);
}

/* ---- the public functions ----------------------------------------------------------------
 * Each runs its body in its error context (nbi.h), so an error of an op it
 * composes (nb_sub of mse's operands, nb_where of attention's mask) names it. */
nb_tensor *nb_layer_norm(nb_tensor *x, nb_tensor *weight, nb_tensor *bias, double eps) {
  const char *outer = nbi_error_context_begin("nb_layer_norm");
  nb_tensor *r = layer_norm_body(x, weight, bias, eps);
  nbi_error_context_end(outer);
  return r;
}

nb_tensor *nb_rms_norm(nb_tensor *x, nb_tensor *weight, double eps) {
  const char *outer = nbi_error_context_begin("nb_rms_norm");
  nb_tensor *r = rms_norm_body(x, weight, eps);
  nbi_error_context_end(outer);
  return r;
}

nb_tensor *nb_cross_entropy(nb_tensor *logits, nb_tensor *labels) {
  const char *outer = nbi_error_context_begin("nb_cross_entropy");
  nb_tensor *r = cross_entropy_body(logits, labels);
  nbi_error_context_end(outer);
  return r;
}

nb_tensor *nb_mse(nb_tensor *pred, nb_tensor *target) {
  const char *outer = nbi_error_context_begin("nb_mse");
  nb_tensor *r = mse_body(pred, target);
  nbi_error_context_end(outer);
  return r;
}

nb_tensor *nb_dropout(nb_tensor *t, double p, bool training) {
  const char *outer = nbi_error_context_begin("nb_dropout");
  nb_tensor *r = dropout_body(t, p, training);
  nbi_error_context_end(outer);
  return r;
}

nb_tensor *nb_embedding(nb_tensor *table, nb_tensor *idx) {
  const char *outer = nbi_error_context_begin("nb_embedding");
  nb_tensor *r = embedding_body(table, idx);
  nbi_error_context_end(outer);
  return r;
}

nb_tensor *nb_attention(nb_tensor *q, nb_tensor *k, nb_tensor *v, nb_tensor *mask) {
  const char *outer = nbi_error_context_begin("nb_attention");
  nb_tensor *r = attention_body(q, k, v, mask, false, 0);
  nbi_error_context_end(outer);
  return r;
}

nb_tensor *nb_attention_causal(nb_tensor *q, nb_tensor *k, nb_tensor *v) {
  const char *outer = nbi_error_context_begin("nb_attention");
  nb_tensor *r = attention_body(q, k, v, NULL, true, 0);
  nbi_error_context_end(outer);
  return r;
}

nb_tensor *nb_attention_ex(nb_tensor *q, nb_tensor *k, nb_tensor *v, const nb_attention_params *p) {
  const char *outer = nbi_error_context_begin("nb_attention");
  nb_tensor *r = p ? attention_body(q, k, v, p->mask, p->causal, p->scale)
                   : attention_body(q, k, v, NULL, false, 0);
  nbi_error_context_end(outer);
  return r;
}

/* torch's CPU kernel's order: x^3 = x x x, inner = beta (x + kappa x^3),
 * 0.5 x (1 + tanh(inner)). */
static nb_tensor *gelu_tanh_body(nb_tensor *x) {
  if (nbi_any_null("nb_gelu_tanh", &x, 1)) return NULL;
  nb_dtype dt = nb_dtype_of(x);
  if (dt == NB_BOOL) {
    nbi_error(NB_ERR_DTYPE, "nb_gelu_tanh: input dtype bool is not a number");
    return NULL;
  }
  nb_dtype rt = nb_dtype_is_float(dt) ? dt : NB_F32; /* integers compute in f32, as nb_tanh */
  nb_dtype ct = norm_compute_dtype(rt);
  nb_tensor *xf = to_dtype(x, ct);
  nb_tensor *x3 = nb_mul(nb_mul(xf, xf), xf);
  nb_tensor *inner = nb_mul_scalar(nb_add(xf, nb_mul_scalar(x3, 0.044715)),
                                   0.79788456080286535588 /* sqrt(2 / pi) */);
  nb_tensor *y = nb_mul(nb_mul_scalar(xf, 0.5), nb_add_scalar(nb_tanh(inner), 1.0));
  return to_dtype(y, rt);
}

nb_tensor *nb_gelu_tanh(nb_tensor *t) {
  const char *outer = nbi_error_context_begin("nb_gelu_tanh");
  nb_tensor *r = gelu_tanh_body(t);
  nbi_error_context_end(outer);
  return r;
}
