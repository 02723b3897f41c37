/* src/backends/backend.h — the backend vtable. Core and ops reach devices only
 * through it. The CPU backend is always present; CUDA and MPI plug in here. */
#ifndef NABLA_BACKEND_H
#define NABLA_BACKEND_H

#include "../core/nbi.h"

typedef struct nbi_backend {
  const char *name;
  /* buffers: 64-byte aligned, NULL on failure (no error recorded) */
  void *(*alloc)(size_t nbytes);
  void (*free)(void *p);
  void (*memcpy_to_host)(void *dst, const void *src, size_t nbytes);
  /* C[m,n] = alpha * op(A) op(B) + beta * C, row-major; op transposes when the
   * flag is set. dt is NB_F32 or NB_F64. Leading dims in elements. */
  nb_status (*gemm)(nb_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                    double beta, void *c, int64_t ldc);
  /* runs one node's kernel (the op table's entry for this backend) */
  nb_status (*run_kernel)(const nb_tensor *node, nbi_view *out, const nbi_view *in);
} nbi_backend;

extern const nbi_backend nbi_cpu_backend;

/* GEMM through oneDNN (f32) and OpenBLAS (f64); see src/backends/cpu/gemm.c. */
nb_status nbi_cpu_gemm(nb_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc);

#endif
