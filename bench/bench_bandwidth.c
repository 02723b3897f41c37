/* bench/bench_bandwidth.c — memory-bound nabla ops against a STREAM-style
 * triad and copy (plain C, OpenMP, default thread count: the pool nabla's
 * kernels use), same machine, same run.
 *
 *   stream_triad   a[i] = b[i] + s * c[i], 16M f32; bytes = 3 arrays x 4 per element
 *   stream_copy    a[i] = b[i],            16M f32; bytes = 2 arrays x 4 per element
 *   chain          y = relu(x * 1.5 + w) * 0.5 - 0.25 on 16M f32 (x, w full tensors:
 *                  5 ops); bytes = x and w read once + y written once = 12 per element,
 *                  the triad's own count, so ratio = how close to one triad pass it runs
 *   softmax        nb_softmax(x, -1), x [4096, 1024] f32; bytes = read + write once
 *   layer_norm     nb_layer_norm(x, w, b, 1e-5), x [4096, 1024] f32, w and b [1024];
 *                  bytes = x read + y written once (w and b are 8 KiB, not counted)
 *   cross_entropy  nb_cross_entropy(x, p), x [4096, 1024] f32 logits, p probability
 *                  labels of the same shape; bytes = x and p read once (the result is
 *                  one number)
 *
 * A nabla repetition records the ops and realizes them (nb_eval) inside a
 * scope, so it includes the graph, the plan-cache lookup and fresh buffers.
 * Each implementation runs its repetitions back to back in a block (one
 * untimed warm-up first); the blocks take turns over PASSES passes so that load
 * from other processes hits all alike. Reported: the median over all timed
 * repetitions, GB/s = bytes / median (1 GB = 1e9 bytes), ratio = GB/s over the
 * triad's, and for nabla the kernels one realization runs (nb_stats.kernels_run).
 *
 *   bench_bandwidth           the sizes above, PASSES x PER_PASS repetitions
 *   bench_bandwidth --smoke   4096 floats and [8, 64] rows, once (build and link check)
 *   bench_bandwidth --case C  only stream_triad (the peer) and case C (for profiling)
 *
 * One JSON line per case and implementation, then a table. */
#include <nabla/nabla.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

#define PASSES 3
#define PER_PASS 10

enum { C_TRIAD, C_COPY, C_CHAIN, C_SOFTMAX, C_LAYER_NORM, C_CROSS_ENTROPY, N_CASES };
static const char *const case_names[N_CASES] = {"stream_triad", "stream_copy", "chain",
                                                "softmax",      "layer_norm",  "cross_entropy"};
static const char *const impl_names[N_CASES] = {"c_openmp", "c_openmp", "nabla",
                                                "nabla",    "nabla",    "nabla"};

/* Inputs of every case: plain arrays for the peers, realized tensors for nabla. */
typedef struct bw_data {
  int64_t n;          /* elements of the flat cases */
  int64_t rows, cols; /* the row cases */
  float *a, *b, *c;
  nb_tensor *x, *w;        /* chain: [n] each */
  nb_tensor *rx, *lw, *lb; /* rows: [rows, cols]; layer_norm weight, bias [cols] */
  nb_tensor *rp;           /* cross_entropy labels: [rows, cols], rows sum to 1 */
} bw_data;

static void triad(float *restrict a, const float *restrict b, const float *restrict c, float s,
                  int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    a[i] = b[i] + s * c[i];
}

static void copy(float *restrict a, const float *restrict b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++)
    a[i] = b[i];
}

/* Records case k's ops on d's inputs (inside the caller's scope). */
static nb_tensor *record(int k, const bw_data *d) {
  switch (k) {
  case C_CHAIN:
    return nb_sub_scalar(nb_mul_scalar(nb_relu(nb_add(nb_mul_scalar(d->x, 1.5), d->w)), 0.5), 0.25);
  case C_SOFTMAX: return nb_softmax(d->rx, -1);
  case C_CROSS_ENTROPY: return nb_cross_entropy(d->rx, d->rp);
  default: return nb_layer_norm(d->rx, d->lw, d->lb, 1e-5);
  }
}

/* Runs case k once; returns seconds, or -1 on failure. */
static double run_once(int k, bw_data *d) {
  double t0 = now_s();
  if (k == C_TRIAD) {
    triad(d->a, d->b, d->c, 3.0f, d->n);
  } else if (k == C_COPY) {
    copy(d->a, d->b, d->n);
  } else {
    nb_scope_begin();
    nb_tensor *y = record(k, d);
    nb_status st = y ? nb_eval(&y, 1) : nb_last_status();
    nb_scope_end();
    if (st != NB_OK) return -1;
  }
  return now_s() - t0;
}

static double case_bytes(int k, const bw_data *d) {
  double flat = (double)d->n * sizeof(float), rows = (double)d->rows * d->cols * sizeof(float);
  switch (k) {
  case C_TRIAD: return 3 * flat;
  case C_COPY: return 2 * flat;
  case C_CHAIN: return 3 * flat;
  default: return 2 * rows; /* softmax, layer_norm: x and y; cross_entropy: x and p */
  }
}

static void case_size(int k, const bw_data *d, char *buf, size_t cap) {
  if (k <= C_CHAIN)
    snprintf(buf, cap, "%lld", (long long)d->n);
  else
    snprintf(buf, cap, "%lldx%lld", (long long)d->rows, (long long)d->cols);
}

int main(int argc, char **argv) {
  bool smoke = false, run[N_CASES];
  const char *only = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--smoke") == 0)
      smoke = true;
    else if (strcmp(argv[i], "--case") == 0 && i + 1 < argc)
      only = argv[++i];
    else {
      fprintf(stderr, "usage: bench_bandwidth [--smoke] [--case NAME]\n");
      return 2;
    }
  }
  int found = 0;
  for (int k = 0; k < N_CASES; k++) {
    found += only && strcmp(only, case_names[k]) == 0;
    run[k] = !only || k == C_TRIAD || strcmp(only, case_names[k]) == 0;
  }
  if (only && !found) {
    fprintf(stderr, "bench_bandwidth: no case named '%s'\n", only);
    return 2;
  }
  int per_pass = smoke ? 1 : PER_PASS, passes = smoke ? 1 : PASSES, rounds = per_pass * passes;
  bw_data d = {.n = smoke ? 4096 : 16 << 20, .rows = smoke ? 8 : 4096, .cols = smoke ? 64 : 1024};
  nb_seed(1);
  nb_scope_begin();
  size_t nbytes = (size_t)d.n * sizeof(float);
  d.a = malloc(nbytes);
  d.b = malloc(nbytes);
  d.c = malloc(nbytes);
  d.x = nb_rand((nb_shape){1, {d.n}}, NB_F32);
  d.w = nb_rand((nb_shape){1, {d.n}}, NB_F32);
  d.rx = nb_randn((nb_shape){2, {d.rows, d.cols}}, NB_F32);
  d.lw = nb_rand((nb_shape){1, {d.cols}}, NB_F32);
  d.lb = nb_rand((nb_shape){1, {d.cols}}, NB_F32);
  d.rp = nb_softmax(nb_randn((nb_shape){2, {d.rows, d.cols}}, NB_F32), -1);
  nb_tensor *inputs[] = {d.x, d.w, d.rx, d.lw, d.lb, d.rp};
  if (!d.a || !d.b || !d.c || !d.x || !d.w || !d.rx || !d.lw || !d.lb || !d.rp ||
      nb_eval(inputs, 6)) {
    fprintf(stderr, "bench_bandwidth: setup failed: %s\n", nb_last_error());
    return 1;
  }
  /* First touch by the threads that will stream the arrays. */
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < d.n; i++) {
    d.a[i] = 0.0f;
    d.b[i] = (float)(i % 1000) * 1e-3f;
    d.c[i] = (float)(i % 777) * 1e-3f;
  }

  double *times[N_CASES];
  for (int k = 0; k < N_CASES; k++)
    times[k] = malloc((size_t)rounds * sizeof(double));
  for (int pass = 0; pass < passes; pass++)
    for (int k = 0; k < N_CASES; k++)
      for (int r = smoke ? 0 : -1; run[k] && r < per_pass; r++) { /* r = -1: warm-up */
        double t = run_once(k, &d);
        if (t < 0) {
          fprintf(stderr, "bench_bandwidth: %s failed: %s\n", case_names[k], nb_last_error());
          return 1;
        }
        if (r >= 0) times[k][pass * per_pass + r] = t;
      }

  /* Kernels one realization runs, and the buffer memory it holds at its peak
   * beyond its inputs (intermediates + output). */
  uint64_t kernels[N_CASES] = {0}, extra_mb[N_CASES] = {0};
  for (int k = C_CHAIN; k < N_CASES; k++) {
    if (!run[k]) continue;
    nb_reset_stats();
    nb_stats s0 = nb_get_stats();
    run_once(k, &d);
    nb_stats s1 = nb_get_stats();
    kernels[k] = s1.kernels_run - s0.kernels_run;
    extra_mb[k] = (s1.peak_bytes - s0.live_bytes) >> 20;
  }

  double med[N_CASES], gbps[N_CASES];
  for (int k = 0; k < N_CASES; k++) {
    if (!run[k]) continue;
    qsort(times[k], (size_t)rounds, sizeof(double), cmp_double);
    med[k] =
        rounds % 2 ? times[k][rounds / 2] : 0.5 * (times[k][rounds / 2 - 1] + times[k][rounds / 2]);
    gbps[k] = case_bytes(k, &d) / med[k] * 1e-9;
    free(times[k]);
  }
  char size[64];
  for (int k = 0; k < N_CASES; k++) {
    if (!run[k]) continue;
    case_size(k, &d, size, sizeof size);
    printf("{\"case\":\"%s\",\"size\":\"%s\",\"impl\":\"%s\",\"median_s\":%.6g,\"gbps\":%.2f,"
           "\"peer\":\"stream_triad\",\"ratio\":%.3f",
           case_names[k], size, impl_names[k], med[k], gbps[k], gbps[k] / gbps[C_TRIAD]);
    if (k >= C_CHAIN)
      printf(",\"kernels\":%llu,\"peak_extra_mib\":%llu", (unsigned long long)kernels[k],
             (unsigned long long)extra_mb[k]);
    printf("}\n");
  }
  printf("\nmemory bandwidth, GB/s (median of %d), %d OpenMP threads\n%-13s %-10s %10s %8s %8s "
         "%8s\n",
         rounds, omp_get_max_threads(), "case", "size", "median ms", "GB/s", "ratio", "kernels");
  for (int k = 0; k < N_CASES; k++) {
    if (!run[k]) continue;
    case_size(k, &d, size, sizeof size);
    printf("%-13s %-10s %10.2f %8.1f %8.3f %8llu\n", case_names[k], size, med[k] * 1e3, gbps[k],
           gbps[k] / gbps[C_TRIAD], (unsigned long long)kernels[k]);
  }
  free(d.a);
  free(d.b);
  free(d.c);
  nb_scope_end();
  return 0;
}
