/* test/common.h — helpers for the Criterion suite: deterministic random data,
 * tensors from double arrays in any dtype, reading back as double, tolerance by
 * dtype (QUALITY.md), error assertions. Internal conversions come from nbi.h. */
#ifndef NABLA_TEST_COMMON_H
#define NABLA_TEST_COMMON_H

#ifdef TC_STANDALONE
#include "mini_criterion.h"
#else
#include <criterion/criterion.h>
#endif
#include <math.h>
#include <nabla/nabla.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/nbi.h"

/* splitmix64-based uniform doubles in [lo, hi); seed advanced in place */
static inline double tc_uniform(uint64_t *seed, double lo, double hi) {
  uint64_t z = (*seed += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return lo + (hi - lo) * (double)(z >> 11) * 0x1.0p-53;
}

static inline void tc_fill(double *x, int64_t n, double lo, double hi, uint64_t *seed) {
  for (int64_t i = 0; i < n; i++)
    x[i] = tc_uniform(seed, lo, hi);
}

static inline int64_t tc_numel(nb_shape s) {
  int64_t n = 1;
  for (int i = 0; i < s.ndim; i++)
    n *= s.dims[i];
  return n;
}

/* Tensor of dtype dt holding x (converted as nbi_store_f64 does). */
static inline nb_tensor *tc_tensor(const double *x, nb_shape s, nb_dtype dt) {
  int64_t n = tc_numel(s);
  void *buf = malloc((size_t)(n ? n : 1) * 8);
  for (int64_t i = 0; i < n; i++)
    nbi_store_f64(buf, dt, i, x[i]);
  nb_tensor *t = nb_from_data(buf, s, dt);
  free(buf);
  cr_assert(t, "tc_tensor: %s", nb_last_error());
  return t;
}

/* Values of x rounded through dtype dt (what tc_tensor actually stores). */
static inline void tc_round_to(double *x, int64_t n, nb_dtype dt) {
  char one[8];
  for (int64_t i = 0; i < n; i++) {
    nbi_store_f64(one, dt, 0, x[i]);
    x[i] = nbi_load_f64(one, dt, 0);
  }
}

/* Realizes t and returns its elements as doubles (malloc'd; caller frees). */
static inline double *tc_read(nb_tensor *t) {
  cr_assert(t, "tc_read: NULL tensor: %s", nb_last_error());
  int64_t n = nb_numel(t);
  size_t es = nb_dtype_size(nb_dtype_of(t));
  void *raw = malloc((size_t)(n ? n : 1) * es);
  nb_status st = nb_to_host(t, raw, (size_t)n * es);
  cr_assert_eq(st, NB_OK, "tc_read: %s", nb_last_error());
  double *out = malloc((size_t)(n ? n : 1) * sizeof *out);
  for (int64_t i = 0; i < n; i++)
    out[i] = nbi_load_f64(raw, nb_dtype_of(t), i);
  free(raw);
  return out;
}

/* Relative tolerance by dtype (QUALITY.md). */
static inline double tc_tol(nb_dtype dt) {
  switch (dt) {
  case NB_F64: return 1e-12;
  case NB_F32: return 1e-5;
  case NB_F16:
  case NB_BF16: return 1e-2;
  default: return 0;
  }
}

/* Asserts t has shape s and its values match ref within tol (relative, with an
 * absolute floor of tol for values near 0). NaNs must match NaNs. */
static inline void tc_assert_close_tol(nb_tensor *t, const double *ref, nb_shape s, double tol) {
  cr_assert(t, "NULL tensor: %s", nb_last_error());
  nb_shape ts = nb_shape_of(t);
  cr_assert_eq(ts.ndim, s.ndim, "rank %d, expected %d", ts.ndim, s.ndim);
  for (int i = 0; i < s.ndim; i++)
    cr_assert_eq(ts.dims[i], s.dims[i], "dim %d is %lld, expected %lld", i, (long long)ts.dims[i],
                 (long long)s.dims[i]);
  double *got = tc_read(t);
  int64_t n = tc_numel(s);
  for (int64_t i = 0; i < n; i++) {
    if (isnan(ref[i])) {
      cr_assert(isnan(got[i]), "element %lld: got %.17g, expected nan", (long long)i, got[i]);
      continue;
    }
    if (isinf(ref[i])) {
      cr_assert_eq(got[i], ref[i], "element %lld: got %.17g, expected %g", (long long)i, got[i],
                   ref[i]);
      continue;
    }
    double err = fabs(got[i] - ref[i]), lim = tol * (1.0 + fabs(ref[i]));
    cr_assert(err <= lim, "element %lld of %s: got %.17g, expected %.17g (tol %g)", (long long)i,
              nb_dtype_name(nb_dtype_of(t)), got[i], ref[i], tol);
  }
  free(got);
}

static inline void tc_assert_close(nb_tensor *t, const double *ref, nb_shape s) {
  tc_assert_close_tol(t, ref, s, tc_tol(nb_dtype_of(t)));
}

/* Asserts the thread's error is `status` and its message contains `substr`,
 * then clears it. */
#define tc_assert_error(status, substr)                                                            \
  do {                                                                                             \
    cr_assert_eq(nb_last_status(), (status), "status %s, expected %s (message: %s)",               \
                 nb_status_str(nb_last_status()), nb_status_str(status), nb_last_error());         \
    cr_assert(strstr(nb_last_error(), (substr)), "message \"%s\" lacks \"%s\"", nb_last_error(),   \
              (substr));                                                                           \
    nb_clear_error();                                                                              \
  } while (0)

/* ---- random shapes and values, index arithmetic ---------------------------- */

/* n uniform values in [-1, 1) rounded to dt (malloc'd). */
static inline double *tc_rand_floats(int64_t n, nb_dtype dt, uint64_t *seed) {
  double *x = malloc((size_t)(n + 1) * sizeof *x);
  tc_fill(x, n, -1, 1, seed);
  tc_round_to(x, n, dt);
  return x;
}

/* Uniform integer in [lo, hi]. */
static inline int64_t tc_randint(uint64_t *seed, int64_t lo, int64_t hi) {
  int64_t v = lo + (int64_t)floor(tc_uniform(seed, 0, (double)(hi - lo + 1)));
  return v > hi ? hi : v;
}

/* Random rank in [rmin, rmax], dims in [dmin, dmax]. */
static inline nb_shape tc_rand_shape(uint64_t *seed, int rmin, int rmax, int64_t dmin,
                                     int64_t dmax) {
  nb_shape s = {.ndim = (int)tc_randint(seed, rmin, rmax)};
  for (int d = 0; d < s.ndim; d++)
    s.dims[d] = tc_randint(seed, dmin, dmax);
  return s;
}

/* n small integers in [-lim, lim] (0/1 for bool, [0, lim] for u8), exact in
 * every dtype; malloc'd. */
static inline double *tc_rand_ints(int64_t n, nb_dtype dt, uint64_t *seed, int64_t lim) {
  double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++)
    x[i] = dt == NB_BOOL ? (double)tc_randint(seed, 0, 1)
           : dt == NB_U8 ? (double)tc_randint(seed, 0, lim)
                         : (double)tc_randint(seed, -lim, lim);
  return x;
}

/* Row-major multi-index of flat index i in s, and back. */
static inline void tc_unravel(int64_t i, const nb_shape *s, int64_t *ix) {
  for (int d = s->ndim - 1; d >= 0; d--) {
    ix[d] = s->dims[d] ? i % s->dims[d] : 0;
    i = s->dims[d] ? i / s->dims[d] : 0;
  }
}
static inline int64_t tc_ravel(const int64_t *ix, const nb_shape *s) {
  int64_t i = 0;
  for (int d = 0; d < s->ndim; d++)
    i = i * s->dims[d] + ix[d];
  return i;
}

/* A tensor holding x (shape s, row-major) as a transposed view of a tensor
 * built from the transposed data (rank >= 2), so reads go through strides. */
static inline nb_tensor *tc_strided_tensor(const double *x, nb_shape s, nb_dtype dt) {
  if (s.ndim < 2) return tc_tensor(x, s, dt);
  nb_shape ts = s;
  int a = s.ndim - 2, b = s.ndim - 1;
  ts.dims[a] = s.dims[b];
  ts.dims[b] = s.dims[a];
  int64_t n = tc_numel(s), j[NB_MAX_DIMS];
  double *xt = malloc((size_t)(n ? n : 1) * sizeof *xt);
  for (int64_t k = 0; k < n; k++) {
    tc_unravel(k, &ts, j);
    int64_t tmp = j[a];
    j[a] = j[b];
    j[b] = tmp;
    xt[k] = x[tc_ravel(j, &s)];
  }
  nb_tensor *t = nb_transpose(tc_tensor(xt, ts, dt));
  free(xt);
  return t;
}

/* Asserts t still holds x exactly (after a failed call on it). */
static inline void tc_assert_unchanged(nb_tensor *t, const double *x, nb_shape s) {
  cr_assert(nb_is_realized(t));
  tc_assert_close_tol(t, x, s, 0);
}

/* Every test starts from a clean error state and its own scope. */
/* Whether the default device is an asynchronous GPU (NABLA_TEST_DEVICE=cuda:N):
 * its reductions run in another summation order,
 * and custom ops need a CUDA kernel there. */
static inline bool tc_on_gpu(void) { return nb_default_device().kind == NB_DEVICE_CUDA; }

/* A mesh of n virtual devices that are all the default device (the CPU, or the
 * device NABLA_TEST_DEVICE names), for tests that build tensors there. */
static inline nb_mesh *tc_mesh_here(const char *axes, int n) {
  nb_device d[64];
  for (int i = 0; i < n && i < 64; i++)
    d[i] = nb_default_device();
  return nb_mesh_create(axes, d, n);
}

static inline void tc_setup(void) {
  nb_clear_error();
  nb_seed(1234);
  nb_scope_begin();
}
static inline void tc_teardown(void) {
  nb_scope_end();
  nb_clear_error();
}

#endif
