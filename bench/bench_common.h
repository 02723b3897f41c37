/* bench/bench_common.h — timing helpers every benchmark shares. */
#ifndef NABLA_BENCH_COMMON_H
#define NABLA_BENCH_COMMON_H

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

#endif
