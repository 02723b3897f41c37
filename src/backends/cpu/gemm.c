/* src/backends/cpu/gemm.c — GEMM: f32 through oneDNN's dnnl_sgemm (measured
 * faster than Debian's OpenBLAS here; see bench/), f64 through OpenBLAS. Both
 * run on the one OpenMP pool (oneDNN is built on libgomp). */
#include "../backend.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

nb_status nbi_cpu_gemm(nb_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc) {
  if (m == 0 || n == 0) return NB_OK;
  if (dt == NB_F32) {
    dnnl_status_t s = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, (float)alpha,
                                 a, lda, b, ldb, (float)beta, c, ldc);
    if (s != dnnl_success)
      return nbi_error(NB_ERR_INTERNAL, "nb_matmul: oneDNN sgemm failed (status %d)", (int)s);
    return NB_OK;
  }
  if (dt == NB_F64) {
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha,
                a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
    return NB_OK;
  }
  return nbi_error(NB_ERR_DTYPE, "nb_matmul: GEMM has no %s path", nb_dtype_name(dt));
}
