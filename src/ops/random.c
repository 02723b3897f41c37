/* src/ops/random.c — explicit random keys (include/nabla/random.h): nb_key,
 * nb_key_split and the draws built on the one RANDOM op.
 *
 * RANDOM(key) -> out: key is i64 [..., 2] (a batch of keys: vmap adds one
 * leading dim), out = key's batch dims + the sample shape; attrs.i[0] is the
 * mode: 0 the raw 32-bit words as i64 (what nb_key_split draws new keys
 * from), 1 uniforms in [0, 1) of out's float dtype. No derivative; its
 * batching rule is the op on the batched keys. Everything else (normal,
 * bernoulli, categorical, dropout) is composed from it with public ops, so it
 * differentiates, batches and shards as those do. */
#include "../core/nbi.h"
#include "../core/oprules.h"

#include <math.h>
#include <nabla/nabla.h>

enum { MODE_BITS = 0, MODE_UNIFORM = 1 };

static bool check_key(const char *fn, nb_tensor *key) {
  if (nbi_any_null(fn, &key, 1)) return false;
  if (key->dtype != NB_I64 || key->shape.ndim != 1 || key->shape.dims[0] != 2) {
    char b[64];
    nbi_error(NB_ERR_ARG, "%s: a key is i64 [2] (nb_key, nb_key_split); got %s %s", fn,
              nb_dtype_name(key->dtype), nb_shape_str(key->shape, b, sizeof b));
    return false;
  }
  return true;
}

static nb_tensor *random_op(nb_tensor *key, const nb_shape *s, nb_dtype dt, int mode) {
  nbi_attrs at = {0};
  at.i[0] = mode;
  return nbi_record(NBI_OP_RANDOM, dt, s, &key, 1, &at);
}

nb_tensor *nb_key(uint64_t seed) {
  int64_t w[2] = {(int64_t)(seed >> 32), (int64_t)(seed & 0xffffffffu)};
  return nb_from_data(w, NB_SHAPE(2), NB_I64);
}

nb_status nb_key_split(nb_tensor *key, int n, nb_tensor **out) {
  const char *fn = "nb_key_split";
  if (!out) return nbi_error(NB_ERR_NULL, "%s: out is NULL", fn);
  for (int i = 0; i < n; i++)
    out[i] = NULL;
  if (n < 1) return nbi_error(NB_ERR_ARG, "%s: n is %d (at least 1)", fn, n);
  if (!check_key(fn, key)) return nb_last_status();
  nb_tensor *bits = random_op(key, &NB_SHAPE(n, 2), NB_I64, MODE_BITS);
  for (int i = 0; i < n && bits; i++) {
    int64_t lo[2] = {i, 0}, hi[2] = {i + 1, NB_END};
    out[i] = nb_reshape(nb_slice(bits, lo, hi, NULL), NB_SHAPE(2));
  }
  for (int i = 0; i < n; i++)
    if (!out[i]) return nb_last_status() ? nb_last_status() : NB_ERR_INTERNAL;
  return NB_OK;
}

static bool check_float_dt(const char *fn, nb_dtype dt) {
  if (dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16) return true;
  nbi_error(NB_ERR_DTYPE, "%s: dtype %s (a float dtype)", fn, nb_dtype_name(dt));
  return false;
}

nb_tensor *nb_random_uniform(nb_tensor *key, nb_shape s, nb_dtype dt) {
  const char *fn = "nb_random_uniform";
  if (!check_key(fn, key) || !check_float_dt(fn, dt) || nbi_check_shape(fn, &s)) return NULL;
  return random_op(key, &s, dt, MODE_UNIFORM);
}

nb_tensor *nb_random_normal(nb_tensor *key, nb_shape s, nb_dtype dt) {
  const char *fn = "nb_random_normal";
  if (!check_key(fn, key) || !check_float_dt(fn, dt) || nbi_check_shape(fn, &s)) return NULL;
  nb_tensor *k[2];
  if (nb_key_split(key, 2, k)) return NULL;
  nb_dtype w = dt == NB_F64 ? NB_F64 : NB_F32; /* computed in f32 at least */
  nb_tensor *u1 = random_op(k[0], &s, w, MODE_UNIFORM), *u2 = random_op(k[1], &s, w, MODE_UNIFORM);
  /* 1 - u1 in (0, 1]: the log is finite */
  nb_tensor *r = nb_sqrt(nb_mul_scalar(nb_log(nb_rsub_scalar(u1, 1.0)), -2.0));
  nb_tensor *z = nb_mul(r, nb_cos(nb_mul_scalar(u2, 2 * M_PI)));
  return dt == w ? z : nb_cast(z, dt);
}

nb_tensor *nb_random_bernoulli(nb_tensor *key, double p, nb_shape s) {
  const char *fn = "nb_random_bernoulli";
  if (!(p >= 0 && p <= 1)) {
    nbi_error(NB_ERR_ARG, "%s: p = %g is outside [0, 1]", fn, p);
    return NULL;
  }
  if (!check_key(fn, key) || nbi_check_shape(fn, &s)) return NULL;
  return nb_lt_scalar(random_op(key, &s, NB_F64, MODE_UNIFORM), p);
}

nb_tensor *nb_categorical(nb_tensor *key, nb_tensor *logits, int axis) {
  const char *fn = "nb_categorical";
  if (!check_key(fn, key) || nbi_any_null(fn, &logits, 1)) return NULL;
  if (!nb_dtype_is_float(logits->dtype)) {
    nbi_error(NB_ERR_DTYPE, "%s: logits are %s (a float dtype)", fn, nb_dtype_name(logits->dtype));
    return NULL;
  }
  int nd = logits->shape.ndim;
  if (axis < -nd || axis >= nd || nd == 0) {
    nbi_error(NB_ERR_AXIS, "%s: axis %d of a rank-%d tensor", fn, axis, nd);
    return NULL;
  }
  /* Gumbel-max: argmax(logits - log(-log(u))), u in (0, 1) */
  nb_dtype w = logits->dtype == NB_F64 ? NB_F64 : NB_F32;
  nb_tensor *u = random_op(key, &logits->shape, w, MODE_UNIFORM);
  nb_tensor *g = nb_neg(nb_log(nb_neg(nb_log(nb_rsub_scalar(u, 1.0)))));
  return nb_argmax(nb_add(nb_cast(nb_detach(logits), w), g), axis, false);
}

nb_tensor *nb_dropout_key(nb_tensor *t, nb_tensor *key, double p) {
  const char *fn = "nb_dropout_key";
  if (nbi_any_null(fn, &t, 1) || !check_key(fn, key)) return NULL;
  if (!(p >= 0 && p < 1)) {
    nbi_error(NB_ERR_ARG, "%s: p = %g is outside [0, 1)", fn, p);
    return NULL;
  }
  if (!nb_dtype_is_float(t->dtype)) {
    nbi_error(NB_ERR_DTYPE, "%s: t is %s (a float dtype)", fn, nb_dtype_name(t->dtype));
    return NULL;
  }
  if (p == 0) return nbi_identity(t);
  nb_tensor *keep = nb_random_bernoulli(key, 1 - p, t->shape);
  return nb_mul(t, nb_mul_scalar(nb_cast(keep, t->dtype), 1 / (1 - p)));
}

/* ---- rules ------------------------------------------------------------------------- */
/* The op on the batched keys [B, ..., 2]: one more leading dim of keys. */
static nb_tensor *random_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  (void)batched;
  nb_shape s = y->shape;
  if (s.ndim == NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "nb_vmap: random numbers of rank %d under one more batch", s.ndim);
    return NULL;
  }
  for (int d = s.ndim; d > 0; d--)
    s.dims[d] = s.dims[d - 1];
  s.dims[0] = B;
  s.ndim++;
  return nbi_record(NBI_OP_RANDOM, y->dtype, &s, &bin[0], 1, &y->attrs);
}

const nbi_op_def nbi_opdef_RANDOM = {
    .name = "random", .arity = 1, .flags = NBI_OPF_NONDIFF, .vmap = random_vmap};
