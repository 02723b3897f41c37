/* src/ops/nn_layers.c — neural-network helpers composed from nabla ops, so
 * they are differentiable and transformable without rules of their own.
 * (conv2d and max_pool2d are primitives: src/ops/nn_conv.c.) */
#include "../core/nbi.h"

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

nb_tensor *nb_layer_norm(nb_tensor *x, nb_tensor *weight, nb_tensor *bias, double eps) {
  if (nbi_any_null("nb_layer_norm", &x, 1)) return NULL;
  if (!check_float("nb_layer_norm", x) || !check_rank_at_least("nb_layer_norm", "input", x, 1) ||
      !check_feature_param("nb_layer_norm", "weight", x, weight) ||
      !check_feature_param("nb_layer_norm", "bias", x, bias))
    return NULL;
  nb_tensor *xc = nb_sub(x, nb_mean(x, NB_AXES(-1), true));
  nb_tensor *var = nb_mean(nb_square(xc), NB_AXES(-1), true);
  nb_tensor *y = nb_mul(xc, nb_rsqrt(nb_add_scalar(var, eps)));
  if (weight) y = nb_mul(y, weight);
  if (bias) y = nb_add(y, bias);
  return y;
}

nb_tensor *nb_rms_norm(nb_tensor *x, nb_tensor *weight, double eps) {
  if (nbi_any_null("nb_rms_norm", &x, 1)) return NULL;
  if (!check_float("nb_rms_norm", x) || !check_rank_at_least("nb_rms_norm", "input", x, 1) ||
      !check_feature_param("nb_rms_norm", "weight", x, weight))
    return NULL;
  nb_tensor *ms = nb_mean(nb_square(x), NB_AXES(-1), true);
  nb_tensor *y = nb_mul(x, nb_rsqrt(nb_add_scalar(ms, eps)));
  return weight ? nb_mul(y, weight) : y;
}

nb_tensor *nb_cross_entropy(nb_tensor *logits, nb_tensor *labels) {
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
    nb_tensor *picked = nb_take_along_axis(logp, nb_unsqueeze(labels, -1), -1);
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

nb_tensor *nb_mse(nb_tensor *pred, nb_tensor *target) {
  if (nbi_any_null("nb_mse", (nb_tensor *[]){pred, target}, 2)) return NULL;
  return nb_mean(nb_square(nb_sub(pred, target)), NB_ALL, false);
}

nb_tensor *nb_dropout(nb_tensor *t, double p, bool training) {
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

nb_tensor *nb_embedding(nb_tensor *table, nb_tensor *idx) {
  if (nbi_any_null("nb_embedding", (nb_tensor *[]){table, idx}, 2)) return NULL;
  if (nb_ndim(table) != 2) {
    char b[160];
    nbi_error(NB_ERR_SHAPE, "nb_embedding: table of shape %s is not [vocab, dim]",
              nb_shape_str(nb_shape_of(table), b, sizeof b));
    return NULL;
  }
  return nb_take(table, idx, 0);
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

nb_tensor *nb_attention(nb_tensor *q, nb_tensor *k, nb_tensor *v, nb_tensor *mask) {
  if (nbi_any_null("nb_attention", (nb_tensor *[]){q, k, v}, 3)) return NULL;
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
  double scale = 1.0 / sqrt((double)qs.dims[qs.ndim - 1]);
  nb_tensor *scores = nb_mul_scalar(nb_matmul(q, nb_transpose(k)), scale);
  if (mask) {
    nb_tensor *low = nb_scalar(lowest(nb_dtype_of(scores)), nb_dtype_of(scores));
    scores = nb_where(mask, scores, low);
  }
  return nb_matmul(nb_softmax(scores, -1), v);
}
