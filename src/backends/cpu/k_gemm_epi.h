/* src/backends/cpu/k_gemm_epi.h — GEMM with a bias / activation epilogue: the
 * planner's [matmul, add bias, activation] groups, run as one oneDNN matmul
 * primitive with post-ops (or, small, on k_gemm_small.c's kernel). */
#ifndef NABLA_K_GEMM_EPI_H
#define NABLA_K_GEMM_EPI_H

#include "cpu.h"

/* The CPU's answer for an epilogue group g (backend.h, "GEMM epilogues"): an
 * f32 2-D MATMUL (any size: below 2^20 multiply-adds it runs on the small
 * kernel of k_gemm_small.c, above as a oneDNN primitive) of f32 operands, the
 * ADD of an f32 row bias to it, and optionally one activation (relu, gelu,
 * tanh, sigmoid, silu) of that sum; the product not stored. The sum may be
 * stored too (the activation then runs as a second pass from the stored sum). */
bool nbi_cpu_gemm_epi_ok(const nbi_group *g);

/* Runs a group nbi_cpu_gemm_epi_ok took: in[k] is operand k's view (at its own
 * shape), out[j] output slot j's buffer. */
nb_status nbi_cpu_gemm_epi_run(const nbi_group *g, nbi_view *out, const nbi_view *in);

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
