/* src/core/rng.c — the seeded random generator (xoshiro256**, seeded through
 * splitmix64). One stream per thread; nb_seed makes every draw reproducible. */
#include "nbi.h"

#include <stdlib.h>

#include <math.h>

static _Thread_local uint64_t rng_state[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull,
                                              0x94d049bb133111ebull, 0x2545f4914f6cdd1dull};

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void nb_seed(uint64_t seed) {
  for (int i = 0; i < 4; i++)
    rng_state[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(void) {
  uint64_t *s = rng_state, r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return r;
}

static double next_uniform(void) { return (double)(next_u64() >> 11) * 0x1.0p-53; }

_Thread_local int nbi_trace_depth;

static nb_tensor *random_leaf(const char *fn, nb_shape s, nb_dtype dt) {
  if (nbi_trace_depth > 0) {
    nbi_error(NB_ERR_STATE,
              "%s: the seeded generator inside a traced function (nb_jit, nb_grad, nb_vmap, "
              "...) would draw one constant at trace time: pass a key and draw with "
              "nb_random_uniform / nb_random_normal / nb_dropout_key (nabla/random.h)",
              fn);
    return NULL;
  }
  if (nbi_dtype_valid(dt) && !nb_dtype_is_float(dt)) {
    nbi_error(NB_ERR_DTYPE, "%s: dtype %s is not a float dtype", fn, nb_dtype_name(dt));
    return NULL;
  }
  return nbi_leaf_alloc(fn, &s, dt);
}

/* Uniform in [lo, hi); values that round up to hi in a narrow dtype are
 * redrawn so the interval stays half-open. */
static void fill_uniform(void *p, nb_tensor *t, double lo, double hi) {
  int64_t n = nbi_numel(&t->shape);
  if (!(hi > lo)) { /* empty interval (a zero-size fan): all lo */
    for (int64_t i = 0; i < n; i++)
      nbi_store_f64(p, t->dtype, i, lo);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    double v;
    do {
      nbi_store_f64(p, t->dtype, i, lo + (hi - lo) * next_uniform());
      v = nbi_load_f64(p, t->dtype, i);
    } while (v >= hi);
  }
}

/* The values are drawn into host memory p of t's dtype, then written to t's
 * device (nbi_host_write). */
static void *host_values(const char *fn, const nb_tensor *t) {
  size_t nbytes = (size_t)nbi_numel(&t->shape) * nb_dtype_size(t->dtype);
  void *p = malloc(nbytes ? nbytes : 1);
  if (!p) nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  return p;
}

static nb_tensor *write_values(nb_tensor *t, void *p) {
  nbi_view v = nbi_tensor_view(t);
  nb_status st = nbi_host_write(t->device, &v, p, t->dtype);
  free(p);
  return st ? NULL : t;
}

nb_tensor *nb_rand(nb_shape s, nb_dtype dt) {
  nb_tensor *t = random_leaf("nb_rand", s, dt);
  void *p = t ? host_values("nb_rand", t) : NULL;
  if (!p) return NULL;
  fill_uniform(p, t, 0.0, 1.0);
  return write_values(t, p);
}

nb_tensor *nb_randn(nb_shape s, nb_dtype dt) {
  nb_tensor *t = random_leaf("nb_randn", s, dt);
  void *p = t ? host_values("nb_randn", t) : NULL;
  if (!p) return NULL;
  int64_t n = nbi_numel(&t->shape);
  for (int64_t i = 0; i < n; i += 2) { /* Box-Muller, two normals per pair */
    double u1 = 1.0 - next_uniform(), u2 = next_uniform();
    double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
    nbi_store_f64(p, dt, i, r * cos(a));
    if (i + 1 < n) nbi_store_f64(p, dt, i + 1, r * sin(a));
  }
  return write_values(t, p);
}

nb_tensor *nb_glorot_uniform(nb_shape s, nb_dtype dt) {
  nb_tensor *t = random_leaf("nb_glorot_uniform", s, dt);
  if (!t) return NULL;
  double fan_in = 1, fan_out = 1;
  if (s.ndim == 1) {
    fan_in = fan_out = (double)s.dims[0];
  } else if (s.ndim >= 2) {
    double receptive = 1;
    for (int i = 0; i < s.ndim - 2; i++)
      receptive *= (double)s.dims[i];
    fan_in = (double)s.dims[s.ndim - 2] * receptive;
    fan_out = (double)s.dims[s.ndim - 1] * receptive;
  }
  double a = fan_in + fan_out > 0 ? sqrt(6.0 / (fan_in + fan_out)) : 0.0;
  void *p = host_values("nb_glorot_uniform", t);
  if (!p) return NULL;
  fill_uniform(p, t, -a, a);
  return write_values(t, p);
}
