/* src/backends/cpu/gemm.c — GEMM: f32 through oneDNN's dnnl_sgemm (measured
 * faster than Debian's OpenBLAS here; see bench/README.md), f64 through
 * OpenBLAS. oneDNN is built on libgomp and shares nabla's OpenMP pool; the
 * Debian OpenBLAS is its pthreads build (single-threaded below 65536 * 4
 * multiply-adds, which is what nbi_cpu_gemm_batch_parallel relies on).
 * f32 products below NBI_GEMM_SERIAL_MACS run on the calling thread: sgemm
 * would open a two-thread OpenMP region for them. */
#include "cpu.h"

#include <cblas.h>
#include <limits.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

nb_status nbi_cpu_gemm(nb_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc) {
  if (m == 0 || n == 0) return NB_OK;
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
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
    return NB_OK;
  }
  return nbi_error(NB_ERR_DTYPE, "nabla: GEMM has no %s path", nb_dtype_name(dt));
}
