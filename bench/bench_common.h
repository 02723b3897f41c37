/* bench/bench_common.h — timing helpers every benchmark shares. */
#ifndef NABLA_BENCH_COMMON_H
#define NABLA_BENCH_COMMON_H

#include <nabla/nabla.h>
#include <stdlib.h>
#include <time.h>

/* Monotonic wall time in seconds. */
static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort comparator for doubles (ascending). */
static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median of t[0..n-1] (sorts t in place). */
static inline double median(double *t, int n) {
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  return t[n / 2];
}

/* ---- the README MLP ([1,32,64,32,1], batch 256, f32, MSE) ------------------------- */
/* p: W0 b0 W1 b1 W2 b2 W3 b3, then x [256,1] and y [256,1] (nb_seed(0) first for
 * the README's numbers). */
static inline void readme_mlp_init(nb_tensor **p) {
  static const int64_t layers[5] = {1, 32, 64, 32, 1};
  for (int i = 0; i < 4; i++) {
    p[2 * i] = nb_glorot_uniform(NB_SHAPE(layers[i], layers[i + 1]), NB_F32);
    p[2 * i + 1] = nb_zeros(NB_SHAPE(1, layers[i + 1]), NB_F32);
  }
  p[8] = nb_rand(NB_SHAPE(256, 1), NB_F32);
  p[9] = nb_rand(NB_SHAPE(256, 1), NB_F32);
}

static inline nb_tensor *readme_mlp_loss(nb_tensor *const *p, nb_tensor *x, nb_tensor *y) {
  nb_tensor *h = x;
  for (int i = 0; i < 4; i++) {
    h = nb_add(nb_matmul(h, p[2 * i]), p[2 * i + 1]);
    if (i < 3) h = nb_relu(h);
  }
  return nb_mean(nb_square(nb_sub(h, y)), NB_ALL, false);
}

/* The loss as an nb_fn body: in = p[0..9]. */
static inline nb_status readme_mlp_loss_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                           int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = readme_mlp_loss(in, in[8], in[9]);
  return out[0] ? NB_OK : nb_last_status();
}

#endif
