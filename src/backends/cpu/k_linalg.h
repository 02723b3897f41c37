/* src/backends/cpu/k_linalg.h — CPU kernels of the linear-algebra family, and
 * the operand packing they share with the NN kernels (k_nn.c). */
#ifndef NABLA_K_LINALG_H
#define NABLA_K_LINALG_H

#include "cpu.h"

/* MATMUL: NumPy matmul of in[0] @ in[1] into the contiguous out (dtype and
 * shape of the node); reads only the views, so it may be called with any node. */
nb_status nbi_cpu_matmul(const nb_tensor *n, nbi_view *out, const nbi_view *in);

/* Elements of v as a contiguous row-major array of dtype dt: v's own memory when
 * it already is one, else a fresh copy (converted) returned in *owned, which the
 * caller frees with nbi_cpu_scratch_free. NULL + NB_ERR_OOM (naming fn) on failure. */
const void *nbi_cpu_contig(const char *fn, const nbi_view *v, nb_dtype dt, void **owned);
/* 64-byte aligned scratch memory for kernels; NULL + NB_ERR_OOM naming fn. */
void *nbi_cpu_scratch(const char *fn, size_t nbytes);
void nbi_cpu_scratch_free(void *p);

/* Whether the 2-D view v can go to GEMM in place: row-major (*trans false) or
 * column-major (*trans true) with leading dimension *ld (<= INT_MAX). */
bool nbi_cpu_gemm_layout(const nbi_view *v, bool *trans, int64_t *ld);

/* Whether `batches` independent m x k by k x n GEMMs in dtype dt (F32 or F64)
 * should run one per thread (true) rather than one after another, each threaded
 * by the GEMM library (false). */
bool nbi_cpu_gemm_batch_parallel(nb_dtype dt, int64_t batches, int64_t m, int64_t n, int64_t k);

#endif
