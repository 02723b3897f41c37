/* src/backends/cpu/k_sum.h — row sums shared by the reduction kernels
 * (k_sum.c; k_reduce.c folds with them). */
#ifndef NABLA_K_SUM_H
#define NABLA_K_SUM_H

#include "vmath.h"

#include <stdbool.h>
#include <stdint.h>

/* The sum over j < n of x[j] (y NULL, sq false), of x[j] * y[j] (products
 * rounded to the type first, as a MUL kernel rounds them; sq false), or of
 * (x[j] - c)^2 (sq true, y NULL), in double, in a fixed order (k_sum.c): the
 * same bits on every ISA. Indexed by nbi_isa. */
typedef double (*nbi_row_sum_f32_fn)(const float *restrict x, const float *restrict y, int64_t n,
                                     double c, bool sq);
typedef double (*nbi_row_sum_f64_fn)(const double *restrict x, const double *restrict y, int64_t n,
                                     double c, bool sq);
extern const nbi_row_sum_f32_fn nbi_cpu_row_sum_f32[NBI_ISA_COUNT];
extern const nbi_row_sum_f64_fn nbi_cpu_row_sum_f64[NBI_ISA_COUNT];
/* The f32 product sum of x[j] * y[j] with y[j] = (z[j] - mx) - ls formed in
 * registers (a log_softmax row: cross-entropy's sum of labels times log
 * probabilities), the same bits as nbi_cpu_row_sum_f32 of x and the stored
 * y. Indexed by nbi_isa. */
typedef double (*nbi_row_sum_lsm_f32_fn)(const float *restrict x, const float *restrict z,
                                         int64_t n, float mx, float ls);
extern const nbi_row_sum_lsm_f32_fn nbi_cpu_row_sum_lsm_f32[NBI_ISA_COUNT];

#endif
