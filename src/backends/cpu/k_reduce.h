/* src/backends/cpu/k_reduce.h — CPU kernels of the reduction family
 * (src/ops/reduce.c records the nodes and documents the attribute slots). */
#ifndef NABLA_K_REDUCE_H
#define NABLA_K_REDUCE_H

#include "cpu.h"

/* Axis reductions: REDUCE_SUM (mean too), REDUCE_PROD, REDUCE_MAX, REDUCE_MIN,
 * REDUCE_ANY, REDUCE_ALL, REDUCE_VAR (std too), LOGSUMEXP, ARGMAX, ARGMIN.
 * in[0] is any shape with any strides; the reduced axes are the bits of
 * n->attrs.i[0]; out holds the kept axes in order (keepdims or not). */
nb_status nbi_cpu_reduce(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* Fused row groups (k_fused.c). Whether a reduction member (op, result dtype
 * dt, input dtype in_dt) has a row routine: sum (mean too), prod, max, min,
 * var (std too) of f32 or f64, input of the same dtype. */
bool nbi_cpu_reduce_row_ok(int op, nb_dtype dt, nb_dtype in_dt);
/* Its value (before the conversion to e's dtype) as nbi_cpu_reduce gives it
 * for an output whose reduced elements are x[0..len), contiguous of e's dtype,
 * in an input of n_out outputs that reduces its trailing axes: the same folds
 * in the same order, so fused and unfused results agree bit for bit. e: the
 * member (op, dtype, ai[1] = ddof of var, af[0] = mean's count or 1). */
double nbi_cpu_reduce_row(const nbi_group_member *e, const void *x, int64_t len, int64_t n_out);
/* A sum (mean) member e whose input is the product x[j] * y[j] (y == x: a
 * square) of two contiguous rows of e's dtype, without the product row:
 * nbi_cpu_reduce_row of that row, bit for bit (the products are rounded to
 * e's dtype as the MUL / SQUARE kernels round them, then folded alike). Only
 * where _ok: sum of f32 or f64, len >= 8, and no split of the row (as
 * nbi_cpu_reduce_row would for n_out such outputs). */
bool nbi_cpu_reduce_row_dot_ok(const nbi_group_member *e, int64_t len, int64_t n_out);
double nbi_cpu_reduce_row_dot(const nbi_group_member *e, const void *x, const void *y, int64_t len);
/* The same for a product of p and lsm's row, lsm a log_softmax of the row z
 * (f32): the row formed in registers, never stored; the bits of the stored
 * form. */
bool nbi_cpu_reduce_row_dot_lsm_ok(const nbi_group_member *sum, const nbi_group_member *lsm,
                                   int64_t len, int64_t n_out);
double nbi_cpu_reduce_row_dot_lsm(const nbi_group_member *e, const void *p, const void *z,
                                  int64_t len);
/* The same for an axis op over its last axis: softmax, log_softmax, cumsum of
 * f32 or f64, input of the same dtype; y[0..len) from x[0..len), both
 * contiguous of e's dtype, as nbi_cpu_softmax / nbi_cpu_cumsum compute each
 * row. */
bool nbi_cpu_axis_row_ok(int op, nb_dtype dt, nb_dtype in_dt);
void nbi_cpu_axis_row(const nbi_group_member *e, const void *x, void *y, int64_t len);
/* SOFTMAX / LOG_SOFTMAX along axis n->attrs.i[0]; out has in[0]'s shape. */
nb_status nbi_cpu_softmax(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* CUMSUM (inclusive) along axis n->attrs.i[0]; out has in[0]'s shape. */
nb_status nbi_cpu_cumsum(const nb_tensor *n, nbi_view *out, const nbi_view *in);

#endif
