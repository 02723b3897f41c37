/* src/backends/cpu/k_gemm_small.h — small f32 matrix products on the calling
 * thread, operands at any strides, with an optional bias / activation
 * epilogue (the planner's GEMM-epilogue groups below oneDNN's sizes). */
#ifndef NABLA_K_GEMM_SMALL_H
#define NABLA_K_GEMM_SMALL_H

#include "cpu.h"

/* The activation of an epilogue, with the elementwise kernels' semantics
 * (relu passes NaN; gelu is the erf form; silu is x * sigmoid(x)). */
typedef enum nbi_epi_act {
  NBI_EPI_NONE,
  NBI_EPI_RELU,
  NBI_EPI_GELU,
  NBI_EPI_TANH,
  NBI_EPI_SIGMOID,
  NBI_EPI_SILU
} nbi_epi_act;

/* C = act(A @ B + bias): A is m x k with element (i, p) at a[i * sa_r + p * sa_c], B is k x n
 * with (p, j) at b[p * sb_r + j * sb_c] (any strides: negative, zero, transposed), bias (NULL:
 * none) adds bias[j * s_bias] to column j, C is row-major with rows ldc >= n apart. */
typedef struct nbi_gemm_small_args {
  int64_t m, n, k;
  const float *a;
  int64_t sa_r, sa_c;
  const float *b;
  int64_t sb_r, sb_c;
  const float *bias;
  int64_t s_bias;
  nbi_epi_act act;
  float *c;
  int64_t ldc;
} nbi_gemm_small_args;

/* Whether an m x k by k x n product is small enough for nbi_gemm_small: fewer
 * than NBI_GEMM_SMALL_MACS multiply-adds, the size up to which products run on
 * one thread anyway (NBI_GEMM_SERIAL_MACS) and the kernel keeps up with
 * oneDNN's sgemm (measured on the README MLP's shapes). */
#define NBI_GEMM_SMALL_MACS (1 << 20)
bool nbi_gemm_small_fits(int64_t m, int64_t n, int64_t k);

/* Runs g on the calling thread (any size; meant for those that fit) with the
 * active ISA's kernel (vmath.h). The K sum runs in order p = 0..k-1 per
 * element (the AVX2 / AVX-512 kernels with FMA, the portable one without), or
 * for n == 1 with a row-major A as W-lane partial sums (W the vector width)
 * added pairwise, so the ISAs differ in the last bits.
 * NB_ERR_OOM (naming nb_matmul) when packing scratch cannot be had. */
nb_status nbi_gemm_small(const nbi_gemm_small_args *g);

/* y[i] = act(x[i]) for i < n (x == y allowed), as the elementwise kernels. */
void nbi_epi_act_apply(nbi_epi_act act, const float *x, float *y, int64_t n);

#endif
