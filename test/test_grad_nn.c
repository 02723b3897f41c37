/* test/test_grad_nn.c — derivatives of the NN family.
 *
 * The derivative ops (src/ops/nn.h) against float64 reference loops:
 * conv2d_bwd_data, conv2d_bwd_filter, max_pool2d_bwd and max_pool2d_select on
 * fixed and random geometries (stride, padding, dilation, groups), every float
 * dtype, sizes that take the threaded and chunked paths, ties and NaN in
 * pooling windows. Then conv2d (with and without bias) and max_pool2d through
 * tc_check_grad, the derivative ops themselves (second and third derivatives
 * of conv2d and pooling), dtypes of gradients, and the composites of
 * nn_layers.c (layer_norm, rms_norm, cross_entropy, mse, dropout, embedding,
 * attention), which differentiate through their primitives' rules. */
#include "grad_check.h"
#include "../src/core/oprules.h"

#include "../src/backends/cpu/cpu.h"
#include "../src/ops/nn.h"

TestSuite(grad_nn, .init = tc_setup, .fini = tc_teardown);

/* ---- float64 references --------------------------------------------------------------- */

/* A convolution geometry: x [n,c,h,w], weight [o, c/groups, kh, kw]. */
typedef struct conv_case {
  int64_t n, c, h, w, o, kh, kw;
  int sh, sw, ph, pw, dh, dw, groups;
} conv_case;

static int64_t case_oh(const conv_case *k) {
  return (k->h + 2 * k->ph - k->dh * (k->kh - 1) - 1) / k->sh + 1;
}
static int64_t case_ow(const conv_case *k) {
  return (k->w + 2 * k->pw - k->dw * (k->kw - 1) - 1) / k->sw + 1;
}

/* The CONV2D attrs of case k (slots of src/ops/nn.h). */
static nbi_attrs case_attrs(const conv_case *k) {
  nbi_attrs at = {0};
  at.i[NBI_CONV_STRIDE] = k->sh;
  at.i[NBI_CONV_STRIDE + 1] = k->sw;
  at.i[NBI_CONV_PAD] = k->ph;
  at.i[NBI_CONV_PAD + 1] = k->pw;
  at.i[NBI_CONV_DILATION] = k->dh;
  at.i[NBI_CONV_DILATION + 1] = k->dw;
  at.i[NBI_CONV_GROUPS] = k->groups;
  return at;
}

static nb_conv2d_params case_params(const conv_case *k) {
  return (nb_conv2d_params){{k->sh, k->sw}, {k->ph, k->pw}, {k->dh, k->dw}, k->groups};
}

/* Calls f(n, o, i, j, ci, a, b, xi, wi) for every term x[xi] * w[wi] of
 * y[n, o, i, j] in a direct convolution (ci: input channel, a/b: kernel tap). */
#define FOR_CONV_TERMS(k, BODY)                                                                    \
  do {                                                                                             \
    int64_t oh_ = case_oh(k), ow_ = case_ow(k), cg_ = (k)->c / (k)->groups,                        \
            og_ = (k)->o / (k)->groups;                                                            \
    for (int64_t n = 0; n < (k)->n; n++)                                                           \
      for (int64_t o = 0; o < (k)->o; o++)                                                         \
        for (int64_t i = 0; i < oh_; i++)                                                          \
          for (int64_t j = 0; j < ow_; j++)                                                        \
            for (int64_t c = 0; c < cg_; c++)                                                      \
              for (int64_t a = 0; a < (k)->kh; a++)                                                \
                for (int64_t b = 0; b < (k)->kw; b++) {                                            \
                  int64_t hi = i * (k)->sh - (k)->ph + a * (k)->dh,                                \
                          wi = j * (k)->sw - (k)->pw + b * (k)->dw;                                \
                  if (hi < 0 || hi >= (k)->h || wi < 0 || wi >= (k)->w) continue;                  \
                  int64_t xi = ((n * (k)->c + o / og_ * cg_ + c) * (k)->h + hi) * (k)->w + wi;     \
                  int64_t wix = ((o * cg_ + c) * (k)->kh + a) * (k)->kw + b;                       \
                  int64_t yi = ((n * (k)->o + o) * oh_ + i) * ow_ + j;                             \
                  BODY;                                                                            \
                }                                                                                  \
  } while (0)

/* dx[n, c, h, w] = sum of dy[y] * w[wi] over the terms reading x[n, c, h, w]. */
static double *ref_bwd_data(const double *dy, const double *wt, const conv_case *k) {
  double *dx = calloc((size_t)(k->n * k->c * k->h * k->w) + 1, sizeof *dx);
  FOR_CONV_TERMS(k, dx[xi] += dy[yi] * wt[wix]);
  return dx;
}

/* dw[o, c, a, b] = sum of dy[y] * x[xi] over the terms using w[o, c, a, b]. */
static double *ref_bwd_filter(const double *x, const double *dy, const conv_case *k) {
  double *dw = calloc((size_t)(k->o * (k->c / k->groups) * k->kh * k->kw) + 1, sizeof *dw);
  FOR_CONV_TERMS(k, dw[wix] += dy[yi] * x[xi]);
  return dw;
}

/* A pooling geometry over x [n, c, h, w]. */
typedef struct pool_case {
  int64_t n, c, h, w;
  int kh, kw, sh, sw, ph, pw;
} pool_case;

static int64_t pool_oh(const pool_case *k) { return (k->h + 2 * k->ph - k->kh) / k->sh + 1; }
static int64_t pool_ow(const pool_case *k) { return (k->w + 2 * k->pw - k->kw) / k->sw + 1; }

static nbi_attrs pool_case_attrs(const pool_case *k) {
  nbi_attrs at = {0};
  at.i[NBI_POOL_KERNEL] = k->kh;
  at.i[NBI_POOL_KERNEL + 1] = k->kw;
  at.i[NBI_POOL_STRIDE] = k->sh;
  at.i[NBI_POOL_STRIDE + 1] = k->sw;
  at.i[NBI_POOL_PAD] = k->ph;
  at.i[NBI_POOL_PAD + 1] = k->pw;
  return at;
}

/* Flat index into x of the element pooled into output (p, i, j) (p = plane):
 * the first maximum in row-major window order, a NaN beating every number. */
static int64_t ref_argmax(const double *x, const pool_case *k, int64_t p, int64_t i, int64_t j) {
  int64_t best = -1;
  for (int a = 0; a < k->kh; a++)
    for (int b = 0; b < k->kw; b++) {
      int64_t hi = i * k->sh - k->ph + a, wi = j * k->sw - k->pw + b;
      if (hi < 0 || hi >= k->h || wi < 0 || wi >= k->w) continue;
      int64_t at = (p * k->h + hi) * k->w + wi;
      if (best < 0 || x[at] > x[best] || (isnan(x[at]) && !isnan(x[best]))) best = at;
    }
  return best;
}

/* dx = dy routed to each window's argmax (accumulating). */
static double *ref_pool_bwd(const double *x, const double *dy, const pool_case *k) {
  int64_t oh = pool_oh(k), ow = pool_ow(k);
  double *dx = calloc((size_t)(k->n * k->c * k->h * k->w) + 1, sizeof *dx);
  for (int64_t p = 0; p < k->n * k->c; p++)
    for (int64_t i = 0; i < oh; i++)
      for (int64_t j = 0; j < ow; j++)
        dx[ref_argmax(x, k, p, i, j)] += dy[(p * oh + i) * ow + j];
  return dx;
}

/* y = g at each window's argmax. */
static double *ref_pool_select(const double *x, const double *g, const pool_case *k) {
  int64_t oh = pool_oh(k), ow = pool_ow(k);
  double *y = calloc((size_t)(k->n * k->c * oh * ow) + 1, sizeof *y);
  for (int64_t p = 0; p < k->n * k->c; p++)
    for (int64_t i = 0; i < oh; i++)
      for (int64_t j = 0; j < ow; j++)
        y[(p * oh + i) * ow + j] = g[ref_argmax(x, k, p, i, j)];
  return y;
}

/* Tolerance for a sum of `terms` products of values in [-1, 1] in dtype dt. */
static double sum_tol(nb_dtype dt, int64_t terms) {
  return tc_tol(dt) * (dt == NB_F16 || dt == NB_BF16 ? 2.0 : (double)(terms > 1 ? terms : 1));
}

/* ---- derivative ops against the references ---------------------------------------------- */

/* bwd_data and bwd_filter of case k in dtype dt against the references. */
static void check_conv_bwd(const conv_case *k, nb_dtype dt) {
  uint64_t seed = 17 + (uint64_t)(k->c * 7 + k->kh * 3 + k->groups);
  int64_t oh = case_oh(k), ow = case_ow(k);
  nb_shape xs = NB_SHAPE(k->n, k->c, k->h, k->w),
           ws = NB_SHAPE(k->o, k->c / k->groups, k->kh, k->kw), ys = NB_SHAPE(k->n, k->o, oh, ow);
  double *x = tc_rand_floats(tc_numel(xs), dt, &seed), *w = tc_rand_floats(tc_numel(ws), dt, &seed),
         *dy = tc_rand_floats(tc_numel(ys), dt, &seed);
  nbi_attrs at = case_attrs(k);
  nb_tensor *dx = nbi_conv2d_bwd_data(tc_tensor(dy, ys, dt), tc_tensor(w, ws, dt), &at, k->h, k->w);
  nb_tensor *dw =
      nbi_conv2d_bwd_filter(tc_tensor(x, xs, dt), tc_tensor(dy, ys, dt), &at, k->kh, k->kw);
  cr_assert(dx && dw, "%s", nb_last_error());
  cr_assert_eq(nb_dtype_of(dx), dt);
  cr_assert_eq(nb_dtype_of(dw), dt);
  double *rdx = ref_bwd_data(dy, w, k), *rdw = ref_bwd_filter(x, dy, k);
  tc_assert_close_tol(dx, rdx, xs, sum_tol(dt, k->o / k->groups * k->kh * k->kw));
  tc_assert_close_tol(dw, rdw, ws, sum_tol(dt, k->n * oh * ow));
  free(x);
  free(w);
  free(dy);
  free(rdx);
  free(rdw);
}

static const conv_case conv_cases[] = {
    /*  n  c  h  w  o kh kw sh sw ph pw dh dw groups */
    {2, 3, 5, 4, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1}, /* plain */
    {1, 2, 5, 5, 3, 3, 3, 2, 2, 1, 1, 1, 1, 1}, /* stride 2, padding 1 */
    {2, 2, 7, 6, 2, 2, 3, 1, 1, 1, 2, 2, 2, 1}, /* dilation 2 */
    {2, 4, 6, 5, 6, 3, 2, 2, 1, 1, 0, 1, 2, 2}, /* 2 groups, mixed */
    {1, 4, 4, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 4}, /* depthwise */
    {3, 4, 3, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, 2}, /* 1x1, stride 1: in place */
    {2, 2, 5, 5, 2, 1, 1, 2, 2, 0, 0, 1, 1, 1}, /* 1x1 strided: pixels never read */
    {1, 1, 6, 6, 1, 2, 2, 3, 3, 0, 0, 1, 1, 1}, /* stride > kernel: gaps */
    {1, 3, 1, 9, 2, 1, 4, 1, 3, 0, 2, 1, 2, 1}, /* one row */
};

Test(grad_nn, conv_bwd_ops_match_reference) {
  static const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
    for (int d = 0; d < 4; d++)
      check_conv_bwd(&conv_cases[i], dts[d]);
}

Test(grad_nn, conv_bwd_ops_match_reference_on_random_geometries) {
  uint64_t seed = 2024;
  int done = 0;
  while (done < 30) {
    conv_case k = {0};
    k.groups = (int)tc_randint(&seed, 1, 2);
    k.n = tc_randint(&seed, 1, 2);
    k.c = k.groups * tc_randint(&seed, 1, 2);
    k.o = k.groups * tc_randint(&seed, 1, 2);
    k.kh = tc_randint(&seed, 1, 3);
    k.kw = tc_randint(&seed, 1, 3);
    k.sh = (int)tc_randint(&seed, 1, 2);
    k.sw = (int)tc_randint(&seed, 1, 2);
    k.ph = (int)tc_randint(&seed, 0, 1);
    k.pw = (int)tc_randint(&seed, 0, 1);
    k.dh = (int)tc_randint(&seed, 1, 2);
    k.dw = (int)tc_randint(&seed, 1, 2);
    k.h = tc_randint(&seed, 1, 7);
    k.w = tc_randint(&seed, 1, 7);
    if (k.h + 2 * k.ph < k.dh * (k.kh - 1) + 1 || k.w + 2 * k.pw < k.dw * (k.kw - 1) + 1) continue;
    check_conv_bwd(&k, done % 2 ? NB_F32 : NB_F64);
    done++;
  }
}

Test(grad_nn, conv_bwd_ops_large_sizes_use_threads_and_chunks) {
  /* many small products (one per thread), one large product, and a filter
   * gradient whose columns exceed the chunk budget (several chunks, the last
   * one partial) */
  conv_case many_small = {8, 3, 12, 12, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  conv_case one_large = {1, 8, 30, 30, 16, 3, 3, 1, 1, 0, 0, 1, 1, 1};
  conv_case chunked = {7, 16, 64, 64, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  conv_case grouped = {3, 16, 20, 20, 16, 3, 3, 2, 2, 1, 1, 1, 1, 4};
  check_conv_bwd(&many_small, NB_F32);
  check_conv_bwd(&many_small, NB_F64);
  check_conv_bwd(&one_large, NB_F32);
  check_conv_bwd(&one_large, NB_BF16);
  check_conv_bwd(&chunked, NB_F32);
  check_conv_bwd(&chunked, NB_F64);
  check_conv_bwd(&grouped, NB_F64);
}

Test(grad_nn, conv_bwd_ops_size_zero_dims) {
  /* no images: both gradients are zeros of their shape */
  conv_case k = {0, 2, 4, 4, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1};
  nbi_attrs at = case_attrs(&k);
  nb_tensor *dx = nbi_conv2d_bwd_data(nb_zeros(NB_SHAPE(0, 3, 2, 2), NB_F32),
                                      nb_zeros(NB_SHAPE(3, 2, 3, 3), NB_F32), &at, 4, 4);
  cr_assert(dx, "%s", nb_last_error());
  cr_assert_eq(nb_numel(dx), 0);
  nb_tensor *dw = nbi_conv2d_bwd_filter(nb_zeros(NB_SHAPE(0, 2, 4, 4), NB_F32),
                                        nb_zeros(NB_SHAPE(0, 3, 2, 2), NB_F32), &at, 3, 3);
  double zeros[54] = {0};
  tc_assert_close(dw, zeros, NB_SHAPE(3, 2, 3, 3));
  /* no output channels: dx is zeros */
  dx = nbi_conv2d_bwd_data(nb_zeros(NB_SHAPE(1, 0, 2, 2), NB_F64),
                           nb_zeros(NB_SHAPE(0, 2, 3, 3), NB_F64), &at, 4, 4);
  tc_assert_close(dx, zeros, NB_SHAPE(1, 2, 4, 4));
}

Test(grad_nn, conv_bwd_ops_reject_inconsistent_operands) {
  conv_case k = {1, 2, 5, 5, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1};
  nbi_attrs at = case_attrs(&k);
  nb_tensor *w = nb_zeros(NB_SHAPE(3, 2, 3, 3), NB_F32);
  cr_assert_null(nbi_conv2d_bwd_data(nb_zeros(NB_SHAPE(1, 3, 2, 3), NB_F32), w, &at, 5, 5));
  tc_assert_error(NB_ERR_SHAPE, "conv2d_bwd_data: dy is not the output of a convolution");
  cr_assert_null(nbi_conv2d_bwd_data(NULL, w, &at, 5, 5));
  tc_assert_error(NB_ERR_NULL, "conv2d_bwd_data");
  cr_assert_null(nbi_conv2d_bwd_filter(nb_zeros(NB_SHAPE(1, 2, 5, 5), NB_F32),
                                       nb_zeros(NB_SHAPE(2, 3, 3, 3), NB_F32), &at, 3, 3));
  tc_assert_error(NB_ERR_SHAPE, "conv2d_bwd_filter: dy is not the output of a convolution");
  cr_assert_null(nbi_conv2d_bwd_filter(nb_zeros(NB_SHAPE(1, 2, 5, 5), NB_I32),
                                       nb_zeros(NB_SHAPE(1, 3, 3, 3), NB_F32), &at, 3, 3));
  tc_assert_error(NB_ERR_DTYPE, "conv2d_bwd_filter: input must have a float dtype");
  pool_case p = {1, 1, 4, 4, 2, 2, 2, 2, 0, 0};
  nbi_attrs pa = pool_case_attrs(&p);
  nb_tensor *x = nb_zeros(NB_SHAPE(1, 1, 4, 4), NB_F32);
  cr_assert_null(nbi_max_pool2d_bwd(x, nb_zeros(NB_SHAPE(1, 1, 3, 2), NB_F32), &pa));
  tc_assert_error(NB_ERR_SHAPE, "max_pool2d_bwd: dy must have the pooled shape of the input");
  cr_assert_null(nbi_max_pool2d_select(x, nb_zeros(NB_SHAPE(1, 1, 2, 2), NB_F32), &pa));
  tc_assert_error(NB_ERR_SHAPE, "max_pool2d_select: g must have the shape of the input");
}

/* pool bwd and select of case k on x (values given) in dtype dt. */
static void check_pool_ops_on(const pool_case *k, const double *x, nb_dtype dt, uint64_t seed) {
  int64_t oh = pool_oh(k), ow = pool_ow(k);
  nb_shape xs = NB_SHAPE(k->n, k->c, k->h, k->w), ys = NB_SHAPE(k->n, k->c, oh, ow);
  double *dy = tc_rand_floats(tc_numel(ys), dt, &seed),
         *g = tc_rand_floats(tc_numel(xs), dt, &seed);
  nbi_attrs at = pool_case_attrs(k);
  nb_tensor *tx = tc_tensor(x, xs, dt);
  nb_tensor *dx = nbi_max_pool2d_bwd(tx, tc_tensor(dy, ys, dt), &at);
  nb_tensor *sel = nbi_max_pool2d_select(tx, tc_tensor(g, xs, dt), &at);
  cr_assert(dx && sel, "%s", nb_last_error());
  double *rdx = ref_pool_bwd(x, dy, k), *rsel = ref_pool_select(x, g, k);
  tc_assert_close_tol(dx, rdx, xs, sum_tol(dt, 4));
  tc_assert_close_tol(sel, rsel, ys, 0);
  free(dy);
  free(g);
  free(rdx);
  free(rsel);
}

static void check_pool_ops(const pool_case *k, nb_dtype dt, bool ties) {
  uint64_t seed = 31 + (uint64_t)(k->kh * 5 + k->sh);
  int64_t n = k->n * k->c * k->h * k->w;
  double *x = tc_rand_floats(n, dt, &seed);
  if (ties) /* few distinct values: many windows hold their maximum twice */
    for (int64_t i = 0; i < n; i++)
      x[i] = floor(x[i] * 2);
  check_pool_ops_on(k, x, dt, seed);
  free(x);
}

static const pool_case pool_cases[] = {
    /* n  c  h  w kh kw sh sw ph pw */
    {2, 3, 6, 6, 2, 2, 2, 2, 0, 0}, /* stride = kernel */
    {1, 2, 5, 5, 3, 3, 1, 1, 1, 1}, /* overlapping, padding -inf */
    {2, 2, 7, 5, 3, 2, 2, 1, 1, 0}, /* mixed */
    {1, 1, 4, 4, 4, 4, 1, 1, 0, 0}, /* whole image */
    {1, 2, 7, 7, 3, 3, 2, 2, 1, 1}, /* stride 2, padding 1 */
    {1, 2, 7, 7, 3, 3, 2, 2, 0, 0}, /* floor: last row never pooled */
    {3, 4, 1, 1, 1, 1, 1, 1, 0, 0},
};

Test(grad_nn, pool_bwd_and_select_match_reference) {
  static const nb_dtype dts[] = {NB_F64, NB_F32, NB_F16, NB_BF16};
  for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++)
    for (int d = 0; d < 4; d++) {
      check_pool_ops(&pool_cases[i], dts[d], false);
      check_pool_ops(&pool_cases[i], dts[d], true);
    }
  pool_case big = {4, 8, 32, 32, 3, 3, 1, 1, 1, 1};
  check_pool_ops(&big, NB_F32, true);
  check_pool_ops(&big, NB_F64, false);
}

Test(grad_nn, pool_routes_ties_to_first_max_and_nan_first) {
  /* 2x2 windows over a 4x4 plane:
   *   window 0: {1, 1; 1, 1}        -> first element
   *   window 1: {0, 2; 2, 2}        -> first 2 (offset 3)
   *   window 2: {-inf x 4}           -> first element
   *   window 3: {5, nan; nan, 9}    -> first nan */
  double x[16] = {1,         1,         0, 2,   1,         1,         2,   2,
                  -INFINITY, -INFINITY, 5, NAN, -INFINITY, -INFINITY, NAN, 9};
  pool_case k = {1, 1, 4, 4, 2, 2, 2, 2, 0, 0};
  double dy[4] = {1, 2, 3, 4}, want[16] = {0};
  want[0] = 1, want[3] = 2, want[8] = 3, want[11] = 4;
  nbi_attrs at = pool_case_attrs(&k);
  nb_tensor *dx = nbi_max_pool2d_bwd(tc_tensor(x, NB_SHAPE(1, 1, 4, 4), NB_F32),
                                     tc_tensor(dy, NB_SHAPE(1, 1, 2, 2), NB_F32), &at);
  tc_assert_close_tol(dx, want, NB_SHAPE(1, 1, 4, 4), 0);
  double g[16], sel[4] = {0, 3, 8, 11};
  for (int i = 0; i < 16; i++)
    g[i] = i;
  nb_tensor *s = nbi_max_pool2d_select(tc_tensor(x, NB_SHAPE(1, 1, 4, 4), NB_F64),
                                       tc_tensor(g, NB_SHAPE(1, 1, 4, 4), NB_F64), &at);
  tc_assert_close_tol(s, sel, NB_SHAPE(1, 1, 2, 2), 0);
  /* overlapping windows (3x3, stride 1, padding 1) accumulate on one max */
  double y[9] = {0, 0, 0, 0, 9, 0, 0, 0, 0}, ones[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1},
         acc[9] = {0, 0, 0, 0, 9, 0, 0, 0, 0};
  pool_case o = {1, 1, 3, 3, 3, 3, 1, 1, 1, 1};
  nbi_attrs oa = pool_case_attrs(&o);
  dx = nbi_max_pool2d_bwd(tc_tensor(y, NB_SHAPE(1, 1, 3, 3), NB_F64),
                          tc_tensor(ones, NB_SHAPE(1, 1, 3, 3), NB_F64), &oa);
  tc_assert_close_tol(dx, acc, NB_SHAPE(1, 1, 3, 3), 0);
}

/* ---- gradient checks ---------------------------------------------------------------------- */

typedef struct conv_fn {
  nb_conv2d_params p;
  bool tanh_after; /* f = tanh(conv): a non-bilinear function of conv */
} conv_fn;

static nb_status conv_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_out;
  conv_fn *c = user;
  out[0] = nb_conv2d(in[0], in[1], n_in == 3 ? in[2] : NULL, &c->p);
  if (c->tanh_after) out[0] = nb_tanh(out[0]);
  return out[0] ? NB_OK : nb_last_status();
}

/* Random f64 point for case k: x, w and (with_bias) bias in xs[0..2]. */
static int conv_point(const conv_case *k, bool with_bias, uint64_t *seed, nb_tensor **xs) {
  xs[0] = tc_rand_f64(NB_SHAPE(k->n, k->c, k->h, k->w), -1, 1, seed);
  xs[1] = tc_rand_f64(NB_SHAPE(k->o, k->c / k->groups, k->kh, k->kw), -1, 1, seed);
  if (with_bias) xs[2] = tc_rand_f64(NB_SHAPE(k->o), -1, 1, seed);
  return with_bias ? 3 : 2;
}

static const conv_case grad_cases[] = {
    /*  n  c  h  w  o kh kw sh sw ph pw dh dw groups */
    {1, 2, 4, 4, 2, 3, 3, 1, 1, 1, 1, 1, 1, 1}, /* padding 1: 32 + 36 */
    {1, 2, 5, 5, 2, 2, 2, 2, 2, 1, 1, 2, 2, 2}, /* stride 2, dilation 2, 2 groups */
    {2, 1, 3, 4, 3, 2, 2, 1, 2, 0, 1, 1, 1, 1}, /* batch of 2, mixed stride */
    {1, 2, 5, 4, 2, 1, 1, 2, 1, 0, 0, 1, 1, 2}, /* 1x1 grouped, rows skipped */
};

Test(grad_nn, conv2d_grads_without_bias) {
  uint64_t seed = 5;
  for (size_t i = 0; i < sizeof grad_cases / sizeof grad_cases[0]; i++) {
    conv_fn c = {case_params(&grad_cases[i]), false};
    nb_tensor *xs[3];
    int n = conv_point(&grad_cases[i], false, &seed, xs);
    tc_check_grad("conv2d", conv_body, &c, n, xs, TC_SECOND);
  }
}

Test(grad_nn, conv2d_grads_with_bias) {
  uint64_t seed = 6;
  for (size_t i = 0; i < sizeof grad_cases / sizeof grad_cases[0]; i++) {
    conv_fn c = {case_params(&grad_cases[i]), false};
    nb_tensor *xs[3];
    int n = conv_point(&grad_cases[i], true, &seed, xs);
    tc_check_grad("conv2d+bias", conv_body, &c, n, xs, TC_SECOND);
  }
}

Test(grad_nn, conv2d_then_tanh_second_order) {
  /* a nonzero Hessian: both sweeps run the rules of bwd_data / bwd_filter */
  uint64_t seed = 7;
  conv_fn c = {case_params(&grad_cases[1]), true};
  nb_tensor *xs[3];
  int n = conv_point(&grad_cases[1], true, &seed, xs);
  tc_check_grad("tanh(conv2d)", conv_body, &c, n, xs, TC_SECOND);
}

/* The derivative ops as functions of both their operands. */
typedef struct conv_bwd_fn {
  nbi_attrs at;
  int64_t e0, e1; /* input h, w (data) or kernel kh, kw (filter) */
  bool filter;
} conv_bwd_fn;

static nb_status conv_bwd_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)n_in;
  (void)n_out;
  conv_bwd_fn *c = user;
  out[0] = c->filter ? nbi_conv2d_bwd_filter(in[0], in[1], &c->at, c->e0, c->e1)
                     : nbi_conv2d_bwd_data(in[0], in[1], &c->at, c->e0, c->e1);
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_nn, conv_bwd_ops_grads_second_order) {
  /* first and second derivatives of bwd_data / bwd_filter: the second and
   * third derivatives of conv2d */
  uint64_t seed = 8;
  for (size_t i = 0; i < sizeof grad_cases / sizeof grad_cases[0]; i++) {
    const conv_case *k = &grad_cases[i];
    nb_shape xs = NB_SHAPE(k->n, k->c, k->h, k->w),
             ws = NB_SHAPE(k->o, k->c / k->groups, k->kh, k->kw),
             ys = NB_SHAPE(k->n, k->o, case_oh(k), case_ow(k));
    conv_bwd_fn data = {case_attrs(k), k->h, k->w, false};
    nb_tensor *dxin[2] = {tc_rand_f64(ys, -1, 1, &seed), tc_rand_f64(ws, -1, 1, &seed)};
    tc_check_grad("conv2d_bwd_data", conv_bwd_body, &data, 2, dxin, TC_SECOND);
    conv_bwd_fn filt = {case_attrs(k), k->kh, k->kw, true};
    nb_tensor *dwin[2] = {tc_rand_f64(xs, -1, 1, &seed), tc_rand_f64(ys, -1, 1, &seed)};
    tc_check_grad("conv2d_bwd_filter", conv_bwd_body, &filt, 2, dwin, TC_SECOND);
  }
}

/* d/dx of sum(tanh(conv2d(x, w))): its first and second derivatives are the
 * second and third derivatives of the sum. */
typedef struct conv_grad_fn {
  nb_fn *grad; /* grad of sum(tanh(conv2d)) in x and w */
} conv_grad_fn;

static nb_status sum_tanh_conv_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                    int n_out) {
  (void)n_in;
  (void)n_out;
  conv_fn *c = user;
  out[0] = nb_sum(nb_tanh(nb_conv2d(in[0], in[1], NULL, &c->p)), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status conv_grad_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)n_in;
  (void)n_out;
  conv_grad_fn *c = user;
  nb_tensor *g[2];
  nb_status st = nb_call(c->grad, in, g);
  out[0] = st ? NULL : nb_add(g[0], nb_sum(g[1], NB_ALL, false));
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_nn, conv2d_third_order) {
  uint64_t seed = 9;
  const conv_case *k = &grad_cases[1];
  conv_fn inner = {case_params(k), true};
  nb_fn *s = nb_fn_create(sum_tanh_conv_body, &inner, 2, 1);
  conv_grad_fn c = {nb_grad(s, NB_ALL)};
  cr_assert(c.grad, "%s", nb_last_error());
  nb_tensor *xs[3];
  conv_point(k, false, &seed, xs);
  tc_check_grad("grad of sum(tanh(conv2d))", conv_grad_body, &c, 2, xs, TC_SECOND);
  nb_fn_release(c.grad);
  nb_fn_release(s);
}

/* Distinct values (gaps 0.1, shuffled) of shape s: no near-ties for the finite
 * differences to cross. */
static nb_tensor *distinct_f64(nb_shape s, uint64_t *seed) {
  int64_t n = tc_numel(s);
  double *x = malloc((size_t)(n + 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++)
    x[i] = 0.1 * (double)i - 0.05 * (double)n;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = tc_randint(seed, 0, i);
    double t = x[i];
    x[i] = x[j];
    x[j] = t;
  }
  nb_tensor *t = tc_tensor(x, s, NB_F64);
  free(x);
  return t;
}

typedef struct pool_fn {
  pool_case k;
  int op; /* 0: max_pool2d(x); 1: pool_bwd(x, dy); 2: pool_select(x, g); 3: square(pool) */
} pool_fn;

static nb_status pool_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in;
  (void)n_out;
  pool_fn *p = user;
  const pool_case *k = &p->k;
  nbi_attrs at = pool_case_attrs(k);
  switch (p->op) {
  case 0: out[0] = nb_max_pool2d(in[0], k->kh, k->kw, k->sh, k->sw, k->ph, k->pw); break;
  case 1: out[0] = nbi_max_pool2d_bwd(in[0], in[1], &at); break;
  case 2: out[0] = nbi_max_pool2d_select(in[0], in[1], &at); break;
  default:
    out[0] = nb_square(nb_max_pool2d(in[0], k->kh, k->kw, k->sh, k->sw, k->ph, k->pw));
    break;
  }
  return out[0] ? NB_OK : nb_last_status();
}

static const pool_case pool_grad_cases[] = {
    {1, 2, 4, 4, 2, 2, 2, 2, 0, 0}, /* 32 inputs */
    {1, 1, 5, 5, 3, 3, 2, 2, 1, 1}, /* overlapping windows, padding */
    {2, 1, 5, 4, 3, 2, 1, 2, 1, 1}, /* stride 1 rows: heavy overlap */
};

Test(grad_nn, max_pool2d_grads) {
  uint64_t seed = 10;
  for (size_t i = 0; i < sizeof pool_grad_cases / sizeof pool_grad_cases[0]; i++) {
    const pool_case *k = &pool_grad_cases[i];
    nb_shape xs = NB_SHAPE(k->n, k->c, k->h, k->w),
             ys = NB_SHAPE(k->n, k->c, pool_oh(k), pool_ow(k));
    nb_tensor *x = distinct_f64(xs, &seed);
    pool_fn f = {*k, 0};
    tc_check_grad("max_pool2d", pool_body, &f, 1, &x, TC_SECOND);
    f.op = 3;
    tc_check_grad("square(max_pool2d)", pool_body, &f, 1, &x, TC_SECOND);
    f.op = 1;
    nb_tensor *bin[2] = {x, tc_rand_f64(ys, -1, 1, &seed)};
    tc_check_grad("max_pool2d_bwd", pool_body, &f, 2, bin, TC_SECOND);
    f.op = 2;
    nb_tensor *sin[2] = {x, tc_rand_f64(xs, -1, 1, &seed)};
    tc_check_grad("max_pool2d_select", pool_body, &f, 2, sin, TC_SECOND);
  }
}

/* ---- dtypes of gradients ------------------------------------------------------------------- */

/* Gradient k of sum(f(xs) * u) through nb_vjp_fn for one-output f (in out[k]). */
static void vjp_of(nb_fn_body body, void *user, int n, nb_tensor *const *xs, nb_tensor **g) {
  nb_fn *f = nb_fn_create(body, user, n, 1);
  nb_tensor *y[1];
  cr_assert_eq(nb_call(f, xs, y), NB_OK, "%s", nb_last_error());
  nb_fn *v = nb_vjp_fn(f);
  nb_tensor *in[4], *out[4];
  for (int k = 0; k < n; k++)
    in[k] = xs[k];
  in[n] = nb_ones(nb_shape_of(y[0]), nb_dtype_of(y[0]));
  cr_assert_eq(nb_call(v, in, out), NB_OK, "%s", nb_last_error());
  for (int k = 0; k < n; k++)
    g[k] = out[1 + k];
  nb_fn_release(v);
  nb_fn_release(f);
}

Test(grad_nn, gradients_keep_input_dtypes) {
  uint64_t seed = 11;
  const conv_case *k = &grad_cases[0];
  conv_fn c = {case_params(k), false};
  nb_tensor *x64[3];
  conv_point(k, true, &seed, x64);
  nb_tensor *g64[3], *g32[3], *gmix[3];
  vjp_of(conv_body, &c, 3, x64, g64);
  nb_tensor *x32[3] = {nb_cast(x64[0], NB_F32), nb_cast(x64[1], NB_F32), nb_cast(x64[2], NB_F32)};
  vjp_of(conv_body, &c, 3, x32, g32);
  /* mixed: f32 x, f64 w, f16 bias -> f64 output; each gradient in its input's dtype */
  nb_tensor *xmix[3] = {x32[0], x64[1], nb_cast(x64[2], NB_F16)};
  vjp_of(conv_body, &c, 3, xmix, gmix);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(nb_dtype_of(g32[i]), NB_F32, "input %d", i);
    cr_assert_eq(nb_dtype_of(gmix[i]), nb_dtype_of(xmix[i]), "input %d", i);
    double *want = tc_read(g64[i]);
    tc_assert_close_tol(g32[i], want, nb_shape_of(x64[i]), 1e-4);
    tc_assert_close_tol(gmix[i], want, nb_shape_of(x64[i]), i == 2 ? 1e-2 : 1e-4);
    free(want);
  }
  /* max pooling in f32 */
  pool_fn p = {pool_grad_cases[1], 0};
  nb_tensor *px = nb_cast(distinct_f64(NB_SHAPE(1, 1, 5, 5), &seed), NB_F32), *pg[1];
  vjp_of(pool_body, &p, 1, &px, pg);
  cr_assert_eq(nb_dtype_of(pg[0]), NB_F32);
}

Test(grad_nn, op_table_has_rules_or_nondiff) {
  static const int ops[] = {NBI_OP_CONV2D,     NBI_OP_CONV2D_BWD_DATA, NBI_OP_CONV2D_BWD_FILTER,
                            NBI_OP_MAX_POOL2D, NBI_OP_MAX_POOL2D_BWD,  NBI_OP_MAX_POOL2D_SELECT};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    const nbi_op_def *d = nbi_op_table[ops[i]];
    cr_assert(nbi_cpu_kernel_of(ops[i]), "%s has no CPU kernel", d->name);
    cr_assert((d->vjp && d->jvp) || (d->flags & NBI_OPF_NONDIFF), "%s has no rules", d->name);
    cr_assert(!((d->vjp || d->jvp) && (d->flags & NBI_OPF_NONDIFF)), "%s: rules and NONDIFF",
              d->name);
  }
}

/* ---- composites of nn_layers.c --------------------------------------------------------------- */

typedef struct layer_fn {
  int which;
  nb_tensor *aux; /* labels / mask / indices, captured as a constant */
  double p;       /* dropout */
  bool training;  /* dropout */
} layer_fn;

enum {
  L_LAYER_NORM,
  L_LAYER_NORM_PLAIN,
  L_RMS_NORM,
  L_RMS_NORM_PLAIN,
  L_CE_CLASSES,
  L_CE_PROBS,
  L_MSE,
  L_ATTENTION,
  L_ATTENTION_MASKED,
  L_EMBEDDING,
  L_DROPOUT,
};

static nb_status layer_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_in;
  (void)n_out;
  layer_fn *l = user;
  switch (l->which) {
  case L_LAYER_NORM: out[0] = nb_layer_norm(in[0], in[1], in[2], 1e-5); break;
  case L_LAYER_NORM_PLAIN: out[0] = nb_layer_norm(in[0], NULL, NULL, 1e-5); break;
  case L_RMS_NORM: out[0] = nb_rms_norm(in[0], in[1], 1e-6); break;
  case L_RMS_NORM_PLAIN: out[0] = nb_rms_norm(in[0], NULL, 1e-6); break;
  case L_CE_CLASSES: out[0] = nb_cross_entropy(in[0], l->aux); break;
  case L_CE_PROBS: out[0] = nb_cross_entropy(in[0], in[1]); break;
  case L_MSE: out[0] = nb_mse(in[0], in[1]); break;
  case L_ATTENTION: out[0] = nb_attention(in[0], in[1], in[2], NULL); break;
  case L_ATTENTION_MASKED: out[0] = nb_attention(in[0], in[1], in[2], l->aux); break;
  case L_EMBEDDING: out[0] = nb_embedding(in[0], l->aux); break;
  default: out[0] = nb_dropout(in[0], l->p, l->training); break;
  }
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_nn, layer_norm_grads) {
  uint64_t seed = 12;
  layer_fn l = {.which = L_LAYER_NORM};
  nb_tensor *xs[3] = {tc_rand_f64(NB_SHAPE(3, 4), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(4), 0.5, 1.5, &seed),
                      tc_rand_f64(NB_SHAPE(4), -1, 1, &seed)};
  tc_check_grad("layer_norm", layer_body, &l, 3, xs, TC_SECOND);
  l.which = L_LAYER_NORM_PLAIN;
  nb_tensor *x3 = tc_rand_f64(NB_SHAPE(2, 2, 5), -2, 2, &seed);
  tc_check_grad("layer_norm (no affine)", layer_body, &l, 1, &x3, TC_SECOND);
}

Test(grad_nn, rms_norm_grads) {
  uint64_t seed = 13;
  layer_fn l = {.which = L_RMS_NORM};
  nb_tensor *xs[2] = {tc_rand_f64(NB_SHAPE(3, 4), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(4), 0.5, 1.5, &seed)};
  tc_check_grad("rms_norm", layer_body, &l, 2, xs, TC_SECOND);
  l.which = L_RMS_NORM_PLAIN;
  nb_tensor *x1 = tc_rand_f64(NB_SHAPE(6), -2, 2, &seed);
  tc_check_grad("rms_norm (1-d, no weight)", layer_body, &l, 1, &x1, TC_SECOND);
}

Test(grad_nn, cross_entropy_grads) {
  uint64_t seed = 14;
  int64_t labels[3] = {2, 0, 3};
  layer_fn l = {.which = L_CE_CLASSES, .aux = nb_from_data(labels, NB_SHAPE(3), NB_I64)};
  nb_tensor *logits = tc_rand_f64(NB_SHAPE(3, 4), -2, 2, &seed);
  tc_check_grad("cross_entropy (classes)", layer_body, &l, 1, &logits, TC_SECOND);
  l.which = L_CE_PROBS;
  nb_tensor *xs[2] = {tc_rand_f64(NB_SHAPE(2, 3, 4), -2, 2, &seed),
                      tc_rand_f64(NB_SHAPE(2, 3, 4), 0, 1, &seed)};
  tc_check_grad("cross_entropy (probabilities)", layer_body, &l, 2, xs, TC_SECOND);
}

Test(grad_nn, mse_grads) {
  uint64_t seed = 15;
  layer_fn l = {.which = L_MSE};
  nb_tensor *xs[2] = {tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed)};
  tc_check_grad("mse", layer_body, &l, 2, xs, TC_SECOND);
}

Test(grad_nn, attention_grads) {
  uint64_t seed = 16;
  layer_fn l = {.which = L_ATTENTION};
  nb_tensor *xs[3] = {tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(4, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(4, 2), -1, 1, &seed)};
  tc_check_grad("attention", layer_body, &l, 3, xs, TC_SECOND);
  /* batched, with a mask (one row attends to a single key) */
  bool mask[6] = {true, false, true, false, true, false};
  l.which = L_ATTENTION_MASKED;
  l.aux = nb_from_data(mask, NB_SHAPE(2, 3), NB_BOOL);
  nb_tensor *bs[3] = {tc_rand_f64(NB_SHAPE(2, 2, 2), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 3, 2), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 3, 2), -1, 1, &seed)};
  tc_check_grad("attention (masked, batched)", layer_body, &l, 3, bs, TC_SECOND);
}

Test(grad_nn, embedding_grads) {
  uint64_t seed = 17;
  int64_t idx[4] = {3, 0, 3, 1}; /* a repeated row accumulates */
  layer_fn l = {.which = L_EMBEDDING, .aux = nb_from_data(idx, NB_SHAPE(2, 2), NB_I64)};
  nb_tensor *table = tc_rand_f64(NB_SHAPE(5, 3), -1, 1, &seed);
  tc_check_grad("embedding", layer_body, &l, 1, &table, TC_SECOND);
}

static nb_status dropout_key_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                  int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_dropout_key(in[0], in[1], 0.5);
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_nn, dropout_grads) {
  uint64_t seed = 18;
  /* evaluation: the identity */
  layer_fn l = {.which = L_DROPOUT, .p = 0.5};
  nb_tensor *x = tc_rand_f64(NB_SHAPE(3, 4), 0.5, 1.5, &seed);
  tc_check_grad("dropout (eval)", layer_body, &l, 1, &x, TC_SECOND);
  /* training under a transform: the seeded mask would be a constant of the
   * trace, an error pointing to keys */
  l.training = true;
  nb_shape s = NB_SHAPE(4, 16);
  nb_tensor *xt = tc_rand_f64(s, 0.5, 1.5, &seed), *u = tc_rand_f64(s, -1, 1, &seed);
  nb_fn *f0 = nb_fn_create(layer_body, &l, 1, 1), *v0 = nb_vjp_fn(f0);
  nb_tensor *out[2];
  cr_assert_eq(nb_call(v0, (nb_tensor *[]){xt, u}, out), NB_ERR_STATE);
  cr_assert(strstr(nb_last_error(), "nb_dropout") && strstr(nb_last_error(), "key"), "%s",
            nb_last_error());
  nb_clear_error();
  nb_fn_release(v0);
  nb_fn_release(f0);
  /* with a key (an integer input: no gradient): the gradient is the mask of
   * the same call, scaled by 1/(1-p) */
  nb_fn *f = nb_fn_create(dropout_key_body, NULL, 2, 1), *v = nb_vjp_fn(f);
  nb_tensor *vout[3];
  cr_assert_eq(nb_call(v, (nb_tensor *[]){xt, nb_key(7), u}, vout), NB_OK, "%s", nb_last_error());
  out[0] = vout[0], out[1] = vout[1];
  double *y = tc_read(out[0]), *g = tc_read(out[1]), *uh = tc_read(u), *xh = tc_read(xt);
  int kept = 0;
  for (int64_t i = 0; i < tc_numel(s); i++) {
    bool keep = y[i] != 0;
    kept += keep;
    if (keep) cr_assert(fabs(y[i] - 2 * xh[i]) <= 1e-12, "element %lld", (long long)i);
    cr_assert(fabs(g[i] - (keep ? 2 * uh[i] : 0)) <= 1e-12, "element %lld: grad %g", (long long)i,
              g[i]);
  }
  cr_assert(kept > 0 && kept < tc_numel(s), "mask kept %d of %lld", kept, (long long)tc_numel(s));
  free(y);
  free(g);
  free(uh);
  free(xh);
  nb_fn_release(v);
  nb_fn_release(f);
}
