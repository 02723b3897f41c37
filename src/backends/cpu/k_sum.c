/* src/backends/cpu/k_sum.c — the f32 and f64 row sums of the reduction
 * kernels (k_reduce.c: sum, mean, var's second pass, and fused row groups'
 * sums and product sums), one variant per ISA, the same bits on every ISA. */
#include "k_sum.h"

#include <string.h>

/* row_sum_T_S: the sum over j < n of x[j] (sq false) or of (x[j] - c)^2 (sq
 * true), in double: lane k of SUM_LANES takes terms k, k + SUM_LANES, ..., then
 * the lanes pairwise. Explicit lanes fix the order on every ISA (no omp simd
 * reassociation) and give independent chains: one accumulator ran the row sums
 * latency-bound, at a quarter of the adds' throughput. One variant per ISA.
 *
 * row_sum_f32_S with sq false (the f32 sums of sum, mean and every fused row
 * sum) first adds each block of SUM_PRE * SUM_LANES terms in float, per lane
 * and pairwise (the 8 terms k, k + 32, ..., k + 224 as ((t0 + t1) + (t2 + t3))
 * + ((t4 + t5) + (t6 + t7))), then widens that once into lane k: a term meets at
 * most three float roundings, so the error stays within 3 * 2^-24 * sum |x[j]|
 * beyond the double lanes' (a pairwise float sum, as PyTorch's, allows
 * log2(n) * 2^-24), with an eighth of the float-to-double conversions, which
 * bounded the sum on AVX2 (issue 14: the row sums were 42% of a layer_norm
 * row). It is written with vector types (8 floats, 4 doubles: lanes 4i..4i+3
 * in acc[i]) so that the lanes stay in registers; the operations per lane are
 * the scalar form's, so every ISA gives the same bits. */
enum { SUM_LANES = 32, SUM_PRE = 8 };
typedef float sum_v8f __attribute__((vector_size(32)));
typedef double sum_v4d __attribute__((vector_size(32)));
#define DEF_ROW_SUM(SUF, T, S, ATTR)                                                               \
  ATTR static double row_sum_##SUF##_##S(const T *restrict x, const T *restrict y, int64_t n,      \
                                         double c, bool sq) {                                      \
    double lane[SUM_LANES] = {0};                                                                  \
    int64_t n0 = n - n % SUM_LANES;                                                                \
    if (sq) {                                                                                      \
      for (int64_t j = 0; j < n0; j += SUM_LANES)                                                  \
        for (int k = 0; k < SUM_LANES; k++)                                                        \
          lane[k] += ((double)x[j + k] - c) * ((double)x[j + k] - c);                              \
      for (int64_t k = 0; k < n - n0; k++)                                                         \
        lane[k] += ((double)x[n0 + k] - c) * ((double)x[n0 + k] - c);                              \
    } else if (y) {                                                                                \
      for (int64_t j = 0; j < n0; j += SUM_LANES)                                                  \
        for (int k = 0; k < SUM_LANES; k++)                                                        \
          lane[k] += (double)(x[j + k] * y[j + k]);                                                \
      for (int64_t k = 0; k < n - n0; k++)                                                         \
        lane[k] += (double)(x[n0 + k] * y[n0 + k]);                                                \
    } else {                                                                                       \
      for (int64_t j = 0; j < n0; j += SUM_LANES)                                                  \
        for (int k = 0; k < SUM_LANES; k++)                                                        \
          lane[k] += (double)x[j + k];                                                             \
      for (int64_t k = 0; k < n - n0; k++)                                                         \
        lane[k] += (double)x[n0 + k];                                                              \
    }                                                                                              \
    for (int h = SUM_LANES / 2; h > 0; h >>= 1)                                                    \
      for (int k = 0; k < h; k++)                                                                  \
        lane[k] += lane[k + h];                                                                    \
    return lane[0];                                                                                \
  }
/* acc[2g], acc[2g + 1] (lanes 8g .. 8g + 7) += the 8 floats v, widened. */
#define SUM_WIDEN_ADD(acc, g, v)                                                                   \
  do {                                                                                             \
    acc[2 * (g)] += (sum_v4d){(v)[0], (v)[1], (v)[2], (v)[3]};                                     \
    acc[2 * (g) + 1] += (sum_v4d){(v)[4], (v)[5], (v)[6], (v)[7]};                                 \
  } while (0)
/* The 8 terms at p + 32 * o: x's, or x's times y's (py: the same place in y;
 * sh: y's values shifted, (y - mx) - ls, as a log_softmax row forms them). */
#define SUM_LD(p, py, o, sh)                                                                       \
  (memcpy(&ld[o], (p) + 32 * (o), sizeof ld[o]),                                                   \
   (py) ? (memcpy(&ly[o], (py) + 32 * (o), sizeof ly[o]),                                          \
           ld[o] * ((sh) ? (ly[o] - vmx) - vls : ly[o]))                                           \
        : ld[o])
/* row_sum_f32_S's body; sh (a constant in each caller): y's values are
 * shifted by mx and ls (row_sum_lsm_f32_S). */
#define DEF_ROW_SUM_F32(S, ATTR)                                                                   \
  DEF_ROW_SUM(f32sq, float, S, ATTR)                                                               \
  ATTR static inline __attribute__((always_inline)) double row_sum_f32b_##S(                       \
      const float *restrict x, const float *restrict y, int64_t n, bool sh, float mx, float ls) {  \
    const sum_v8f vmx = {mx, mx, mx, mx, mx, mx, mx, mx}, vls = {ls, ls, ls, ls, ls, ls, ls, ls};  \
    sum_v4d acc[SUM_LANES / 4] = {{0}};                                                            \
    sum_v8f ld[SUM_PRE], ly[SUM_PRE];                                                              \
    int64_t j = 0;                                                                                 \
    for (; j + SUM_PRE * SUM_LANES <= n; j += SUM_PRE * SUM_LANES)                                 \
      _Pragma("GCC unroll 4") for (int g = 0; g < SUM_LANES / 8; g++) {                            \
        const float *p = x + j + 8 * g, *py = y ? y + j + 8 * g : NULL;                            \
        sum_v8f t = ((SUM_LD(p, py, 0, sh) + SUM_LD(p, py, 1, sh)) +                               \
                     (SUM_LD(p, py, 2, sh) + SUM_LD(p, py, 3, sh))) +                              \
                    ((SUM_LD(p, py, 4, sh) + SUM_LD(p, py, 5, sh)) +                               \
                     (SUM_LD(p, py, 6, sh) + SUM_LD(p, py, 7, sh)));                               \
        SUM_WIDEN_ADD(acc, g, t);                                                                  \
      }                                                                                            \
    for (; j < n; j += SUM_LANES) { /* the last block zero-padded (a lane plus +0 is unchanged) */ \
      float pad[SUM_LANES], pady[SUM_LANES];                                                       \
      const float *p = x + j, *py = y ? y + j : NULL;                                              \
      if (n - j < SUM_LANES) {                                                                     \
        size_t w = (size_t)(n - j) * sizeof(float), z = SUM_LANES * sizeof(float) - w;             \
        memcpy(pad, p, w);                                                                         \
        memset((char *)pad + w, 0, z);                                                             \
        p = pad;                                                                                   \
        if (py) {                                                                                  \
          memcpy(pady, py, w);                                                                     \
          memset((char *)pady + w, 0, z);                                                          \
          py = pady;                                                                               \
        }                                                                                          \
      }                                                                                            \
      if (sh) { /* shifted here: the padding stays 0 (a lane plus 0 * 0) */                        \
        int64_t w = n - j < SUM_LANES ? n - j : SUM_LANES;                                         \
        for (int64_t k = 0; k < SUM_LANES; k++)                                                    \
          pady[k] = k < w ? (py[k] - mx) - ls : 0.0f;                                              \
        py = pady;                                                                                 \
      }                                                                                            \
      _Pragma("GCC unroll 4") for (int g = 0; g < SUM_LANES / 8; g++) {                            \
        const float *pg = p + 8 * g, *pyg = py ? py + 8 * g : NULL;                                \
        sum_v8f t = SUM_LD(pg, pyg, 0, false);                                                     \
        SUM_WIDEN_ADD(acc, g, t);                                                                  \
      }                                                                                            \
    }                                                                                              \
    for (int i = 0; i < 4; i++) /* the lanes pairwise: 16, 8, 4 apart (written out: gcc kept */    \
      acc[i] += acc[i + 4];     /* the loop form in memory) */                                     \
    acc[0] += acc[2];                                                                              \
    acc[1] += acc[3];                                                                              \
    acc[0] += acc[1];                                                                              \
    return (acc[0][0] + acc[0][2]) + (acc[0][1] + acc[0][3]); /* 2 apart, then 1 */                \
  }                                                                                                \
  ATTR static double row_sum_f32_##S(const float *restrict x, const float *restrict y, int64_t n,  \
                                     double c, bool sq) {                                          \
    if (sq) return row_sum_f32sq_##S(x, NULL, n, c, true);                                         \
    return row_sum_f32b_##S(x, y, n, false, 0, 0);                                                 \
  }                                                                                                \
  ATTR static double row_sum_lsm_f32_##S(const float *restrict x, const float *restrict z,         \
                                         int64_t n, float mx, float ls) {                          \
    return row_sum_f32b_##S(x, z, n, true, mx, ls);                                                \
  }
#define DEF_ROW_SUMS(S, ISA)                                                                       \
  DEF_ROW_SUM_F32(S, NBI_ISA_ATTR_##S) DEF_ROW_SUM(f64, double, S, NBI_ISA_ATTR_##S)
NBI_FOR_ISAS(DEF_ROW_SUMS)
#define ROW_SUM_F32_ENTRY(S, ISA) [ISA] = row_sum_f32_##S,
#define ROW_SUM_F64_ENTRY(S, ISA) [ISA] = row_sum_f64_##S,
const nbi_row_sum_f32_fn nbi_cpu_row_sum_f32[NBI_ISA_COUNT] = {NBI_FOR_ISAS(ROW_SUM_F32_ENTRY)};
const nbi_row_sum_f64_fn nbi_cpu_row_sum_f64[NBI_ISA_COUNT] = {NBI_FOR_ISAS(ROW_SUM_F64_ENTRY)};
#define ROW_SUM_LSM_ENTRY(S, ISA) [ISA] = row_sum_lsm_f32_##S,
const nbi_row_sum_lsm_f32_fn nbi_cpu_row_sum_lsm_f32[NBI_ISA_COUNT] = {
    NBI_FOR_ISAS(ROW_SUM_LSM_ENTRY)};
