/* bench/bench_gemm.c — f32 square GEMM: nb_matmul (recording the op and
 * realizing it every repetition) against oneDNN's dnnl_sgemm and OpenBLAS's
 * cblas_sgemm called directly, same machine, same run. Each implementation
 * runs its calls back to back in blocks (as a program would), and the blocks
 * take turns over PASSES passes so that load from other processes hits all
 * alike. Before a block: a 300 ms pause, because OpenBLAS's pthreads spin for
 * about 2^28 cycles after a call (its THREAD_TIMEOUT) and would take the cores
 * from whatever runs next, and one untimed warm-up call. Reported: the median
 * over all timed calls.
 *
 *   bench_gemm           sizes 256, 512, 1024, 2048
 *   bench_gemm --smoke   size 64, one round (build and link check)
 *
 * One JSON line per case and implementation, then a table. ratio = GFLOP/s of
 * the implementation over the best of OpenBLAS and oneDNN at that size. */
#include <cblas.h>
#include <nabla/nabla.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"

enum { IMPL_NABLA, IMPL_ONEDNN, IMPL_OPENBLAS, N_IMPLS };
static const char *const impl_names[N_IMPLS] = {"nabla", "onednn", "openblas"};

#define PASSES 3

/* Lets the previous block's spinning worker threads go to sleep. */
static void settle(void) {
  struct timespec ts = {0, 300 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

/* The inputs of one size: nabla tensors and the same values as plain arrays. */
typedef struct gemm_case {
  int n;
  nb_tensor *a, *b;
  float *ha, *hb, *hc;
} gemm_case;

/* Runs implementation impl once on c; returns seconds, or -1 on failure. */
/* The OpenBLAS peer runs on every core (nb_get_num_threads()): where nabla
 * takes f32 GEMMs through OpenBLAS itself (AVX2 machines) it keeps OpenBLAS
 * single-threaded and splits products over its own OpenMP team, so the
 * peer's count is set around its calls and nabla's restored after. */
static double run_once(int impl, gemm_case *c) {
  int64_t n = c->n;
  int keep = openblas_get_num_threads();
  if (impl != IMPL_NABLA && impl != IMPL_ONEDNN) openblas_set_num_threads(nb_get_num_threads());
  double t0 = now_s();
  if (impl == IMPL_NABLA) {
    nb_scope_begin();
    nb_tensor *out = nb_matmul(c->a, c->b);
    nb_status st = out ? nb_eval(&out, 1) : nb_last_status();
    nb_scope_end();
    if (st != NB_OK) return -1;
  } else if (impl == IMPL_ONEDNN) {
    if (dnnl_sgemm('N', 'N', n, n, n, 1.0f, c->ha, n, c->hb, n, 0.0f, c->hc, n) != dnnl_success)
      return -1;
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)n, (blasint)n, (blasint)n, 1.0f,
                c->ha, (blasint)n, c->hb, (blasint)n, 0.0f, c->hc, (blasint)n);
  }
  double t = now_s() - t0;
  openblas_set_num_threads(keep);
  return t;
}

int main(int argc, char **argv) {
  bool smoke = argc > 1 && strcmp(argv[1], "--smoke") == 0;
  static const int sizes[] = {256, 512, 1024, 2048};
  int n_sizes = smoke ? 1 : (int)(sizeof sizes / sizeof sizes[0]);
  double table[4][N_IMPLS];
  nb_seed(1);
  { /* one product first: nabla picks its GEMM library (and OpenBLAS's thread
     * count) before run_once saves that count around the OpenBLAS peer */
    nb_scope_begin();
    nb_tensor *x = nb_rand(NB_SHAPE(64, 64), NB_F32), *y = nb_matmul(x, x);
    nb_eval(&y, 1);
    nb_scope_end();
  }
  for (int s = 0; s < n_sizes; s++) {
    int n = smoke ? 64 : sizes[s];
    /* at least ~40 ms of calls per block below 1024: a block's first calls
     * after the settle (threads waking, sometimes placed on one core until
     * the scheduler spreads them: 5-7 ms calls where 1.1 ms is usual) must
     * not decide the median of so few calls */
    int per_pass = smoke ? 1 : n >= 2048 ? 4 : n >= 1024 ? 8 : n >= 512 ? 40 : 120;
    int passes = smoke ? 1 : PASSES, rounds = per_pass * passes;
    size_t bytes = (size_t)n * (size_t)n * sizeof(float);
    gemm_case c = {.n = n};
    nb_scope_begin();
    c.a = nb_rand((nb_shape){2, {n, n}}, NB_F32);
    c.b = nb_rand((nb_shape){2, {n, n}}, NB_F32);
    c.ha = malloc(bytes);
    c.hb = malloc(bytes);
    c.hc = malloc(bytes);
    if (!c.a || !c.b || !c.ha || !c.hb || !c.hc || nb_to_host(c.a, c.ha, bytes) ||
        nb_to_host(c.b, c.hb, bytes)) {
      fprintf(stderr, "bench_gemm: setup failed at %d: %s\n", n, nb_last_error());
      return 1;
    }
    double *times[N_IMPLS];
    for (int i = 0; i < N_IMPLS; i++)
      times[i] = malloc((size_t)rounds * sizeof(double));
    for (int pass = 0; pass < passes; pass++)
      for (int i = 0; i < N_IMPLS; i++) {
        if (!smoke) settle();
        for (int r = smoke ? 0 : -1; r < per_pass; r++) { /* r = -1: warm-up */
          double t = run_once(i, &c);
          if (t < 0) {
            fprintf(stderr, "bench_gemm: %s failed at %d: %s\n", impl_names[i], n, nb_last_error());
            return 1;
          }
          if (r >= 0) times[i][pass * per_pass + r] = t;
        }
      }
    double flops = 2.0 * n * (double)n * n, gflops[N_IMPLS], med[N_IMPLS];
    for (int i = 0; i < N_IMPLS; i++) {
      qsort(times[i], (size_t)rounds, sizeof(double), cmp_double);
      med[i] = rounds % 2 ? times[i][rounds / 2]
                          : 0.5 * (times[i][rounds / 2 - 1] + times[i][rounds / 2]);
      gflops[i] = flops / med[i] * 1e-9;
      free(times[i]);
    }
    double peer =
        gflops[IMPL_ONEDNN] > gflops[IMPL_OPENBLAS] ? gflops[IMPL_ONEDNN] : gflops[IMPL_OPENBLAS];
    for (int i = 0; i < N_IMPLS; i++) {
      printf("{\"case\":\"gemm\",\"size\":%d,\"impl\":\"%s\",\"median_s\":%.6g,\"gflops\":%.2f,"
             "\"peer\":\"best of openblas/onednn\",\"ratio\":%.3f}\n",
             n, impl_names[i], med[i], gflops[i], gflops[i] / peer);
      table[s][i] = gflops[i];
    }
    fflush(stdout);
    free(c.ha);
    free(c.hb);
    free(c.hc);
    nb_scope_end();
  }
  printf("\nf32 GEMM, GFLOP/s (median)\n%6s %10s %10s %10s %8s\n", "size", "nabla", "onednn",
         "openblas", "ratio");
  for (int s = 0; s < n_sizes; s++) {
    double peer = table[s][IMPL_ONEDNN] > table[s][IMPL_OPENBLAS] ? table[s][IMPL_ONEDNN]
                                                                  : table[s][IMPL_OPENBLAS];
    printf("%6d %10.1f %10.1f %10.1f %8.3f\n", smoke ? 64 : sizes[s], table[s][IMPL_NABLA],
           table[s][IMPL_ONEDNN], table[s][IMPL_OPENBLAS], table[s][IMPL_NABLA] / peer);
  }
  return 0;
}
