/* bench/bench_cuda_gemm.c — square GEMM on the GPU: nabla's nbi_cuda_gemm (the
 * backend's cuBLASLt path, src/backends/cuda/cuda_gemm.c) and nb_matmul (a product
 * recorded and realized through the public API every repetition) against cuBLASLt
 * called directly in the same process: its best heuristic algorithm, the same
 * handle, workspace and stream. Cases: f32 (HIGHEST: CUBLAS_COMPUTE_32F; HIGH:
 * CUBLAS_COMPUTE_32F_FAST_TF32) and bf16 (f32 accumulation), sizes 4096 and 8192,
 * random inputs in [-1, 1). Each implementation runs blocks of 7 calls queued back to
 * back, as a program queues them (nb_matmul's recording and planning for a call
 * overlap the GPU's work on the one before; where they take longer, the GPU waits
 * and the time shows it), each call between its own pair of CUDA events on the
 * device's stream, the device synchronized after each block; the implementations
 * take turns over PASSES passes after one warm-up call each. Reported: the median
 * over all 21 timed calls per implementation. Before timing, the three results are
 * compared (a wrong product is not worth timing).
 *
 *   bench_cuda_gemm           sizes 4096, 8192
 *   bench_cuda_gemm --smoke   size 256, one call each (build, link and run check)
 *
 * One JSON line per case, size and implementation, then a table. ratio = GFLOP/s of
 * the implementation over cuBLASLt's at that case and size. Without `make CUDA=1`,
 * or without a GPU, it prints one line saying so and exits 0. */
#include <nabla/nabla.h>
#include <stdio.h>
#include <string.h>

#include "bench_common.h"

#ifndef NABLA_CUDA
/* Without the CUDA backend: says so, successfully. */
int main(int argc, char **argv) {
  (void)argc, (void)argv;
  printf("{\"case\":\"cuda_gemm\",\"skipped\":\"built without CUDA=1\"}\n");
  printf("bench_cuda_gemm: skipped (build with make CUDA=1)\n");
  return 0;
}
#else
#include <math.h>

#include "../src/backends/cuda/cuda_be.h"

enum { IMPL_GEMM, IMPL_MATMUL, IMPL_PEER, N_IMPLS };
static const char *const impl_names[N_IMPLS] = {"nabla_gemm", "nabla_matmul", "cublaslt"};
enum { CASE_F32, CASE_TF32, CASE_BF16, N_CASES };
static const char *const case_names[N_CASES] = {"cuda_gemm_f32", "cuda_gemm_tf32",
                                                "cuda_gemm_bf16"};
#define PASSES 3

/* Prints a failed step and exits. */
static void die(const char *what, const char *why) {
  fprintf(stderr, "bench_cuda_gemm: %s failed: %s\n", what, why);
  exit(1);
}

/* Exits with the driver error's name unless r is CUDA_SUCCESS. */
static void check_cu(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS) {
    const char *s = NULL;
    if (nbi_cu.cuGetErrorName) nbi_cu.cuGetErrorName(r, &s);
    die(what, s ? s : "CUDA error");
  }
}

/* Exits with the status unless s is CUBLAS_STATUS_SUCCESS. */
static void check_lt(cublasStatus_t s, const char *what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    char code[32];
    snprintf(code, sizeof code, "cuBLAS status %d", (int)s);
    die(what, code);
  }
}

/* The direct cuBLASLt peer of one case and size: C^T = B^T A^T in column order (the
 * same problem nabla maps its row-major product to), best heuristic algorithm. */
typedef struct peer {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulAlgo_t algo;
} peer;

/* Descriptors and the best algorithm of case cs at size n on device c. */
static void peer_init(peer *p, nbi_cuda_ctx *c, int cs, int64_t n) {
  cudaDataType t = cs == CASE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasComputeType_t ct = cs == CASE_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check_lt(nbi_cu.cublasLtMatmulDescCreate(&p->op, ct, CUDA_R_32F), "cublasLtMatmulDescCreate");
  check_lt(nbi_cu.cublasLtMatrixLayoutCreate(&p->la, t, (uint64_t)n, (uint64_t)n, n), "layout A");
  check_lt(nbi_cu.cublasLtMatrixLayoutCreate(&p->lb, t, (uint64_t)n, (uint64_t)n, n), "layout B");
  check_lt(nbi_cu.cublasLtMatrixLayoutCreate(&p->lc, t, (uint64_t)n, (uint64_t)n, n), "layout C");
  cublasLtMatmulPreference_t pref;
  check_lt(nbi_cu.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  uint64_t ws = c->lt_workspace ? (uint64_t)c->lt_workspace_bytes : 0;
  check_lt(nbi_cu.cublasLtMatmulPreferenceSetAttribute(
               pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "workspace preference");
  cublasLtMatmulHeuristicResult_t res;
  int count = 0;
  check_lt(nbi_cu.cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1,
                                                 &res, &count),
           "cublasLtMatmulAlgoGetHeuristic");
  nbi_cu.cublasLtMatmulPreferenceDestroy(pref);
  if (count < 1 || res.state != CUBLAS_STATUS_SUCCESS) die("heuristic", "no algorithm");
  p->algo = res.algo;
}

/* Destroys p's descriptors. */
static void peer_fini(peer *p) {
  nbi_cu.cublasLtMatmulDescDestroy(p->op);
  nbi_cu.cublasLtMatrixLayoutDestroy(p->la);
  nbi_cu.cublasLtMatrixLayoutDestroy(p->lb);
  nbi_cu.cublasLtMatrixLayoutDestroy(p->lc);
}

/* Everything one case and size runs on. */
typedef struct gemm_case {
  nbi_cuda_ctx *c;
  int cs;
  int64_t n;
  nb_dtype dt;
  nb_tensor *a, *b; /* on the GPU, realized */
  char *pa, *pb;    /* their device addresses */
  char *pc;         /* C of the direct calls */
  peer peer;
} gemm_case;

/* Queues implementation impl once (nb_matmul: records and realizes the product). */
static void run_impl(gemm_case *g, int impl) {
  int64_t n = g->n;
  if (impl == IMPL_GEMM) {
    if (nbi_cuda_gemm(g->c, g->dt, false, false, n, n, n, g->pa, n, 0, g->pb, n, 0, g->pc, n, 0, 1))
      die("nbi_cuda_gemm", nb_last_error());
  } else if (impl == IMPL_MATMUL) {
    nb_scope_begin();
    nb_tensor *y = nb_matmul(g->a, g->b);
    if (!y || nb_eval(&y, 1)) die("nb_matmul", nb_last_error());
    nb_scope_end();
  } else {
    float one = 1, zero = 0;
    void *ws = g->c->lt_workspace ? (void *)(uintptr_t)g->c->lt_workspace : NULL;
    check_lt(nbi_cu.cublasLtMatmul(g->c->lt, g->peer.op, &one, g->pb, g->peer.la, g->pa, g->peer.lb,
                                   &zero, g->pc, g->peer.lc, g->pc, g->peer.lc, &g->peer.algo, ws,
                                   ws ? g->c->lt_workspace_bytes : 0, g->c->stream),
             "cublasLtMatmul");
  }
}

/* Times `count` calls of impl queued back to back, as a program queues them (the
 * host's work for a call overlaps the GPU's for the one before), each between its
 * own pair of events on the device's stream; waits for the last, writes seconds. */
static void time_block(gemm_case *g, int impl, int count, CUevent *e0, CUevent *e1, double *t) {
  for (int r = 0; r < count; r++) {
    check_cu(nbi_cu.cuEventRecord(e0[r], g->c->stream), "cuEventRecord");
    run_impl(g, impl);
    check_cu(nbi_cu.cuEventRecord(e1[r], g->c->stream), "cuEventRecord");
  }
  check_cu(nbi_cu.cuEventSynchronize(e1[count - 1]), "cuEventSynchronize");
  for (int r = 0; r < count; r++) {
    float ms = 0;
    check_cu(nbi_cu.cuEventElapsedTime(&ms, e0[r], e1[r]), "cuEventElapsedTime");
    t[r] = 1e-3 * ms;
  }
}

/* Up to 4096 elements of C (sampled) from each of nbi_cuda_gemm, nb_matmul and
 * cuBLASLt; fails when they differ beyond rounding of dt. */
static void check_results(gemm_case *g) {
  int64_t total = g->n * g->n, step = total / 4096 > 0 ? total / 4096 : 1;
  size_t es = nb_dtype_size(g->dt);
  char *c_full = malloc((size_t)total * es), *y_full = malloc((size_t)total * es);
  run_impl(g, IMPL_GEMM);
  nb_tensor *y = nb_matmul(g->a, g->b);
  if (!y || nb_to_host(y, y_full, (size_t)total * es)) die("nb_matmul", nb_last_error());
  check_cu(nbi_cu.cuStreamSynchronize(g->c->stream), "cuStreamSynchronize");
  check_cu(nbi_cu.cuMemcpyDtoHAsync(c_full, (CUdeviceptr)(uintptr_t)g->pc, (size_t)total * es,
                                    g->c->stream),
           "download");
  run_impl(g, IMPL_PEER);
  char *p_full = malloc((size_t)total * es);
  check_cu(nbi_cu.cuMemcpyDtoHAsync(p_full, (CUdeviceptr)(uintptr_t)g->pc, (size_t)total * es,
                                    g->c->stream),
           "download");
  check_cu(nbi_cu.cuStreamSynchronize(g->c->stream), "cuStreamSynchronize");
  double tol = g->dt == NB_BF16 ? 1e-2 : g->cs == CASE_TF32 ? 1e-3 : 1e-5;
  for (int64_t i = 0; i < total; i += step) {
    double p = nbi_load_f64(p_full, g->dt, i), x = nbi_load_f64(c_full, g->dt, i);
    double z = nbi_load_f64(y_full, g->dt, i), lim = tol * (1 + fabs(p)) * sqrt((double)g->n);
    if (!(fabs(x - p) <= lim) || !(fabs(z - p) <= lim)) {
      fprintf(stderr,
              "bench_cuda_gemm: %s %lld: element %lld: nbi_cuda_gemm %g, nb_matmul %g, cuBLASLt "
              "%g\n",
              case_names[g->cs], (long long)g->n, (long long)i, x, z, p);
      exit(1);
    }
  }
  free(c_full), free(y_full), free(p_full);
}

/* Random values in [-1, 1) of dt, n elements (malloc'd). */
static void *random_host(nb_dtype dt, int64_t n, uint64_t *seed) {
  char *p = malloc((size_t)n * nb_dtype_size(dt));
  for (int64_t i = 0; i < n; i++) {
    uint64_t z = (*seed += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    nbi_store_f64(p, dt, i, 2.0 * (double)(z >> 11) * 0x1.0p-53 - 1.0);
  }
  return p;
}

/* Every case and size (--smoke: 256, one call each); JSON lines, then the table. */
int main(int argc, char **argv) {
  bool smoke = argc > 1 && strcmp(argv[1], "--smoke") == 0;
  if (nb_device_count(NB_DEVICE_CUDA) == 0) {
    printf("{\"case\":\"cuda_gemm\",\"skipped\":\"no CUDA device\"}\n");
    printf("bench_cuda_gemm: skipped (no CUDA device: %s)\n", nbi_cuda_why());
    return 0;
  }
  int dev = nbi_device_lookup("bench_cuda_gemm", NB_CUDA(0));
  if (dev < 0 || nb_set_default_device(NB_CUDA(0))) die("opening cuda:0", nb_last_error());
  nbi_cuda_ctx *c = (nbi_cuda_ctx *)nbi_device_at(dev)->ctx;
  if (nbi_cuda_enter(c)) die("making cuda:0 current", nb_last_error());
  static const int64_t sizes[] = {4096, 8192};
  int n_sizes = smoke ? 1 : 2, per_pass = smoke ? 1 : 7, passes = smoke ? 1 : PASSES;
  int rounds = per_pass * passes;
  double gflops[N_CASES][2][N_IMPLS];
  CUevent e0[8], e1[8]; /* per_pass pairs */
  for (int r = 0; r < per_pass; r++) {
    check_cu(nbi_cu.cuEventCreate(&e0[r], CU_EVENT_DEFAULT), "cuEventCreate");
    check_cu(nbi_cu.cuEventCreate(&e1[r], CU_EVENT_DEFAULT), "cuEventCreate");
  }
  uint64_t seed = 1;
  for (int cs = 0; cs < N_CASES; cs++)
    for (int s = 0; s < n_sizes; s++) {
      gemm_case g = {.c = c, .cs = cs, .n = smoke ? 256 : sizes[s]};
      g.dt = cs == CASE_BF16 ? NB_BF16 : NB_F32;
      nb_set_matmul_precision(cs == CASE_TF32 ? NB_PRECISION_HIGH : NB_PRECISION_HIGHEST);
      int64_t nn = g.n * g.n;
      size_t bytes = (size_t)nn * nb_dtype_size(g.dt);
      nb_scope_begin();
      void *ha = random_host(g.dt, nn, &seed), *hb = random_host(g.dt, nn, &seed);
      g.a = nb_from_data(ha, NB_SHAPE(g.n, g.n), g.dt);
      g.b = nb_from_data(hb, NB_SHAPE(g.n, g.n), g.dt);
      free(ha), free(hb);
      nb_tensor *ab[2] = {g.a, g.b};
      if (!g.a || !g.b || nb_eval(ab, 2)) die("making the inputs", nb_last_error());
      g.pa = nbi_tensor_view(g.a).data;
      g.pb = nbi_tensor_view(g.b).data;
      g.pc = (char *)(uintptr_t)nbi_cuda_alloc_block(c->alloc, bytes);
      if (!g.pc) die("allocating C", nb_last_error());
      peer_init(&g.peer, c, cs, g.n);
      check_results(&g);
      double *times[N_IMPLS];
      for (int i = 0; i < N_IMPLS; i++) {
        times[i] = malloc((size_t)rounds * sizeof(double));
        run_impl(&g, i); /* warm-up */
      }
      for (int pass = 0; pass < passes; pass++)
        for (int i = 0; i < N_IMPLS; i++)
          time_block(&g, i, per_pass, e0, e1, times[i] + pass * per_pass);
      double flops = 2.0 * (double)g.n * (double)g.n * (double)g.n, med[N_IMPLS];
      for (int i = 0; i < N_IMPLS; i++) {
        med[i] = median(times[i], rounds);
        gflops[cs][s][i] = flops / med[i] * 1e-9;
        free(times[i]);
      }
      for (int i = 0; i < N_IMPLS; i++)
        printf("{\"case\":\"%s\",\"size\":%lld,\"impl\":\"%s\",\"median_s\":%.6g,\"gflops\":%.1f,"
               "\"peer\":\"cublaslt\",\"ratio\":%.3f,\"runs\":%d,\"device\":\"%s\"}\n",
               case_names[cs], (long long)g.n, impl_names[i], med[i], gflops[cs][s][i],
               gflops[cs][s][i] / gflops[cs][s][IMPL_PEER], rounds, c->name);
      fflush(stdout);
      peer_fini(&g.peer);
      nbi_cuda_free_block(c->alloc, (CUdeviceptr)(uintptr_t)g.pc);
      nb_scope_end();
    }
  nb_set_matmul_precision(NB_PRECISION_HIGHEST);
  for (int r = 0; r < per_pass; r++) {
    nbi_cu.cuEventDestroy(e0[r]);
    nbi_cu.cuEventDestroy(e1[r]);
  }
  printf("\nGPU GEMM on %s, GFLOP/s (median of %d calls); ratio = nabla / cuBLASLt\n", c->name,
         rounds);
  printf("%-16s %6s %12s %12s %12s %8s %8s\n", "case", "size", "nabla_gemm", "nabla_matmul",
         "cublaslt", "ratio_g", "ratio_m");
  for (int cs = 0; cs < N_CASES; cs++)
    for (int s = 0; s < n_sizes; s++) {
      const double *r = gflops[cs][s];
      printf("%-16s %6lld %12.1f %12.1f %12.1f %8.3f %8.3f\n", case_names[cs],
             (long long)(smoke ? 256 : sizes[s]), r[IMPL_GEMM], r[IMPL_MATMUL], r[IMPL_PEER],
             r[IMPL_GEMM] / r[IMPL_PEER], r[IMPL_MATMUL] / r[IMPL_PEER]);
    }
  return 0;
}
#endif
