/* src/backends/cpu/k_gemm_epi.h — GEMM with a bias / activation epilogue: the
 * planner's [matmul, add bias, activation] groups, run as one oneDNN matmul
 * primitive with post-ops (or, small, on k_gemm_small.c's kernel). */
#ifndef NABLA_K_GEMM_EPI_H
#define NABLA_K_GEMM_EPI_H

#include "cpu.h"

/* For the planner (src/core/fuse.c): the length (2 or 3) of the epilogue group
 * that starts at step i of nodes[0..n-1] (topological order, mark = index,
 * held[j]: step j's value is kept after the realization), or 0 when none does.
 * A group is an f32 2-D MATMUL (any size: below 2^20 multiply-adds it runs on the small kernel
 * of k_gemm_small.c, above as a oneDNN primitive), the ADD of a row bias ([N] or [1, N]) to it, and
 * optionally one activation (relu, gelu, tanh, sigmoid, silu) of that sum. The product's value must
 * be needed by the add only; the sum's may be needed elsewhere too (the group then stores it: the
 * activation runs as a second pass from the stored sum). */
int nbi_cpu_gemm_epi_match(nb_tensor *const *nodes, int n, int i, const bool *held);

/* Runs a group nbi_cpu_gemm_epi_match claimed: nodes[0..m-1]; out[k] is member
 * k's buffer where store[k]. */
nb_status nbi_cpu_gemm_epi_run(nb_tensor *const *nodes, int m, const bool *store, nbi_view *out);

/* C = A @ B for f32 (batched) matrices through a cached oneDNN matmul
 * primitive (no epilogue), over nd dims (batch dims, then rows and columns):
 * A has dims ad and element strides as, B dims bd and strides bs (a batch dim
 * of size 1 broadcasts), C dims cd, contiguous. The primitive is made the
 * second time a shape and layout comes (one-off shapes pay no creation cost);
 * products of fewer than 2^20 multiply-adds stay on sgemm.
 * false when there is none (yet) or oneDNN has no fast one: the caller uses
 * sgemm. Not for use inside an OpenMP parallel region (calls are serialized). */
bool nbi_cpu_gemm_prim(int nd, const int64_t *ad, const int64_t *as, const float *a,
                       const int64_t *bd, const int64_t *bs, const float *b, const int64_t *cd,
                       float *c);

#endif
