/* src/backends/cpu/gemm.c — GEMM: f32 through oneDNN's dnnl_sgemm (measured
 * faster than Debian's OpenBLAS here; see bench/README.md) or, where oneDNN
 * runs AVX2 code, OpenBLAS (nbi_cpu_sgemm_blas); f64 through OpenBLAS. oneDNN is built on libgomp
 * and shares nabla's OpenMP pool; the Debian OpenBLAS is its pthreads build (single-threaded below
 * 65536 * 4 multiply-adds, which is what nbi_cpu_gemm_batch_parallel relies on). f32 products below
 * NBI_GEMM_SERIAL_MACS run on the calling thread: sgemm would open a two-thread OpenMP region for
 * them. */
#include "cpu.h"

#include <cblas.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

/* Which library takes f32 GEMMs. oneDNN's AVX2 sgemm and matmul take 1.7x the
 * time of OpenBLAS's Haswell kernels on row-major A @ B (256x1024 @ 1024x1024:
 * 3.87 ms vs 2.20 ms, 139 vs 244 GFLOP/s, 2 threads, AMD EPYC with
 * ONEDNN_MAX_CPU_ISA=AVX2 and OPENBLAS_CORETYPE=Haswell; A @ B^T runs at
 * 240 on both), while with AVX-512 oneDNN is as fast or faster. So OpenBLAS
 * takes them when oneDNN's effective ISA is below AVX-512 and OpenBLAS runs
 * AVX2 kernels of its own (its core name: Haswell, Zen, or an AVX-512 core).
 * OpenBLAS's pthreads pool would then fight the OpenMP pool (its threads
 * spin while ours spin: the MLP-784 step took 2.2x as long), so in this mode
 * OpenBLAS is set to one thread (process-wide, as nb_set_num_threads already
 * set its count) and nbi_cpu_blas_split runs the products, f64 ones too, over this
 * thread's OpenMP team: the contention guard shrinks them per thread as well.
 * If the application sets OpenBLAS's count again afterwards (its own calls),
 * nabla respects it: f32 products go back to oneDNN (which shares the OpenMP
 * pool) and f64 ones to OpenBLAS's pool, rather than running a split over
 * OpenMP whose every part OpenBLAS threads again (measured 20x slower).
 * NABLA_SGEMM=onednn or =openblas forces the choice. */
bool nbi_cpu_sgemm_blas(void) {
  static _Atomic int pick = -1; /* -1: not decided; 0: oneDNN; 1: OpenBLAS */
  int p = pick;
  if (p < 0) {
    const char *e = getenv("NABLA_SGEMM");
    if (e && !strcmp(e, "openblas"))
      p = 1;
    else if (e && !strcmp(e, "onednn"))
      p = 0;
    else {
      const char *core = openblas_get_corename();
      bool blas_avx2 = core && (strcasestr(core, "haswell") || strcasestr(core, "zen") ||
                                strcasestr(core, "skylakex") || strcasestr(core, "cooperlake") ||
                                strcasestr(core, "sapphirerapids"));
      p = blas_avx2 && dnnl_get_effective_cpu_isa() < dnnl_cpu_isa_avx512_core;
    }
    if (p) openblas_set_num_threads(1); /* nbi_cpu_blas_split threads it */
    pick = p;
  }
  return p && openblas_get_num_threads() == 1; /* else the application set it again */
}

/* One OpenBLAS call on the calling thread (OpenBLAS is single-threaded in this
 * mode): C[m, n] (+)= op(A) @ op(B), elements of es bytes. */
static void blas_call(nb_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                      const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                      int64_t ldc) {
  if (dt == NB_F32)
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, (float)alpha, a, (blasint)lda, b, (blasint)ldb,
                (float)beta, c, (blasint)ldc);
  else
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta,
                c, (blasint)ldc);
}

/* The product split over this thread's OpenMP team: column blocks of B and C
 * (row blocks of A and C when C is taller than wide), one single-threaded
 * OpenBLAS call each. Every element's inner sum is the same however C is
 * split, so results do not depend on the team. */
void nbi_cpu_blas_split(nb_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                        double beta, void *c, int64_t ldc) {
  int team = omp_get_max_threads();
  if (team < 2 || (double)m * (double)n * (double)k < NBI_GEMM_SERIAL_MACS) {
    blas_call(dt, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  size_t es = dt == NB_F32 ? 4 : 8;
  bool by_cols = n >= m;
  int64_t len = by_cols ? n : m, step = (len + team - 1) / team;
  step = (step + 15) / 16 * 16; /* whole vector blocks */
  int parts = (int)((len + step - 1) / step);
#pragma omp parallel for schedule(static)
  for (int p = 0; p < parts; p++) {
    int64_t s0 = p * step, cnt = len - s0 < step ? len - s0 : step;
    const char *pa = a, *pb = b;
    char *pc = c;
    if (by_cols) /* B's columns s0..: op(B) = B[:, s0] or B^T's rows s0.. */
      blas_call(dt, ta, tb, m, cnt, k, alpha, a, lda, pb + (size_t)(tb ? s0 * ldb : s0) * es, ldb,
                beta, pc + (size_t)s0 * es, ldc);
    else /* A's rows s0..: op(A) = A[s0, :] or A^T's columns s0.. */
      blas_call(dt, ta, tb, cnt, n, k, alpha, pa + (size_t)(ta ? s0 : s0 * lda) * es, lda, b, ldb,
                beta, pc + (size_t)(s0 * ldc) * es, ldc);
  }
}

nb_status nbi_cpu_gemm(nb_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc) {
  if (m == 0 || n == 0) return NB_OK;
  if (dt == NB_F32 && nbi_cpu_sgemm_blas() && m <= INT_MAX && n <= INT_MAX && k <= INT_MAX &&
      lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX) {
    nbi_cpu_blas_split(dt, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return NB_OK;
  }
  if (dt == NB_F32) {
    int team = omp_get_max_threads();
    bool serial = team > 1 && (double)m * (double)n * (double)k < NBI_GEMM_SERIAL_MACS;
    if (serial) omp_set_num_threads(1); /* this thread's ICV: sgemm reads it */
    dnnl_status_t s = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, (float)alpha, a,
                                 lda, b, ldb, (float)beta, c, ldc);
    if (serial) omp_set_num_threads(team);
    if (s != dnnl_success)
      return nbi_error(NB_ERR_INTERNAL, "nabla: oneDNN sgemm failed (status %d)", (int)s);
    return NB_OK;
  }
  if (dt == NB_F64) {
    /* OpenBLAS's interface is 32-bit (blasint = int). */
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
      return nbi_error(NB_ERR_OVERFLOW,
                       "nabla: f64 GEMM %lldx%lldx%lld exceeds OpenBLAS's 32-bit sizes",
                       (long long)m, (long long)n, (long long)k);
    if (nbi_cpu_sgemm_blas()) /* OpenBLAS is single-threaded then: split it ourselves */
      nbi_cpu_blas_split(dt, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
      blas_call(dt, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return NB_OK;
  }
  return nbi_error(NB_ERR_DTYPE, "nabla: GEMM has no %s path", nb_dtype_name(dt));
}
