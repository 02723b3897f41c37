/* test/test_conv.c — nb_conv2d against a direct 7-loop float64 reference
 * (strides, padding, dilation, groups, bias or not, every float dtype, sizes
 * that thread), nb_max_pool2d against a reference with -inf padding, the
 * kernels on strided views, bad inputs. */
#include "common.h"

#include "../src/backends/cpu/cpu.h"
#include "../src/ops/nn.h"

TestSuite(conv, .init = tc_setup, .fini = tc_teardown);

static const nb_dtype float_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16};

/* One convolution case: x [n,c,h,w], weight [o, c/g, kh, kw]. */
typedef struct conv_case {
  int64_t n, c, h, w, o, kh, kw;
  int sh, sw, ph, pw, dh, dw, groups;
  bool bias;
} conv_case;

/* Direct convolution in float64 (PyTorch semantics); *so gets [n, o, oh, ow]. */
static double *ref_conv2d(const double *x, const double *wt, const double *bias, const conv_case *k,
                          nb_shape *so) {
  int64_t oh = (k->h + 2 * k->ph - k->dh * (k->kh - 1) - 1) / k->sh + 1;
  int64_t ow = (k->w + 2 * k->pw - k->dw * (k->kw - 1) - 1) / k->sw + 1;
  int64_t cg = k->c / k->groups, og = k->o / k->groups;
  *so = NB_SHAPE(k->n, k->o, oh, ow);
  double *y = calloc((size_t)(k->n * k->o * oh * ow) + 1, sizeof *y);
  for (int64_t n = 0; n < k->n; n++)
    for (int64_t o = 0; o < k->o; o++)
      for (int64_t i = 0; i < oh; i++)
        for (int64_t j = 0; j < ow; j++) {
          double s = bias ? bias[o] : 0;
          int64_t g = o / og;
          for (int64_t c = 0; c < cg; c++)
            for (int64_t a = 0; a < k->kh; a++)
              for (int64_t b = 0; b < k->kw; b++) {
                int64_t hi = i * k->sh - k->ph + a * k->dh, wi = j * k->sw - k->pw + b * k->dw;
                if (hi < 0 || hi >= k->h || wi < 0 || wi >= k->w) continue;
                s += x[((n * k->c + g * cg + c) * k->h + hi) * k->w + wi] *
                     wt[((o * cg + c) * k->kh + a) * k->kw + b];
              }
          y[((n * k->o + o) * oh + i) * ow + j] = s;
        }
  return y;
}

/* nb_conv2d of case k in dtype dt against the reference. */
static void check_conv(const conv_case *k, nb_dtype dt) {
  uint64_t seed = 7 + (uint64_t)(k->c * 31 + k->kh);
  nb_shape xs = NB_SHAPE(k->n, k->c, k->h, k->w),
           ws = NB_SHAPE(k->o, k->c / k->groups, k->kh, k->kw);
  double *x = tc_rand_floats(tc_numel(xs), dt, &seed), *w = tc_rand_floats(tc_numel(ws), dt, &seed);
  double *b = tc_rand_floats(k->o, dt, &seed);
  nb_conv2d_params p = {{k->sh, k->sw}, {k->ph, k->pw}, {k->dh, k->dw}, k->groups};
  nb_tensor *y = nb_conv2d(tc_tensor(x, xs, dt), tc_tensor(w, ws, dt),
                           k->bias ? tc_tensor(b, NB_SHAPE(k->o), dt) : NULL, &p);
  cr_assert(y, "nb_conv2d failed: %s", nb_last_error());
  cr_assert_eq(nb_dtype_of(y), dt);
  nb_shape so;
  double *ref = ref_conv2d(x, w, k->bias ? b : NULL, k, &so);
  tc_assert_close(y, ref, so);
  free(x);
  free(w);
  free(b);
  free(ref);
}

static const conv_case conv_cases[] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, true},  /* plain, bias */
    {1, 2, 5, 5, 3, 3, 3, 2, 2, 1, 1, 1, 1, 1, false}, /* stride 2, padding 1 */
    {2, 4, 9, 8, 6, 3, 2, 1, 2, 2, 1, 2, 1, 2, true},  /* dilation, 2 groups, mixed */
    {1, 6, 6, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6, true},  /* depthwise */
    {3, 4, 5, 5, 8, 1, 1, 1, 1, 0, 0, 1, 1, 1, true},  /* 1x1: image read in place */
    {2, 4, 5, 5, 4, 1, 1, 2, 2, 0, 0, 1, 1, 2, false}, /* 1x1 strided, grouped */
    {1, 1, 3, 3, 1, 3, 3, 1, 1, 0, 0, 1, 1, 1, false}, /* kernel = input: 1x1 out */
    {2, 2, 4, 4, 2, 2, 2, 3, 3, 1, 1, 3, 3, 1, true},  /* dilation 3 in padded 6x6 */
    {1, 3, 1, 9, 2, 1, 4, 1, 3, 0, 2, 1, 2, 1, true},  /* one row */
};

Test(conv, conv2d_matches_reference_for_every_float_dtype) {
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++)
    for (int d = 0; d < 4; d++)
      check_conv(&conv_cases[i], float_dtypes[d]);
}

Test(conv, conv2d_zero_params_mean_defaults) {
  conv_case k = {2, 3, 5, 4, 2, 2, 3, 1, 1, 0, 0, 1, 1, 1, true};
  uint64_t seed = 3;
  double *x = tc_rand_floats(120, NB_F64, &seed), *w = tc_rand_floats(36, NB_F64, &seed);
  double *b = tc_rand_floats(2, NB_F64, &seed);
  nb_tensor *tx = tc_tensor(x, NB_SHAPE(2, 3, 5, 4), NB_F64);
  nb_tensor *tw = tc_tensor(w, NB_SHAPE(2, 3, 2, 3), NB_F64);
  nb_tensor *tb = tc_tensor(b, NB_SHAPE(2), NB_F64);
  nb_shape so;
  double *ref = ref_conv2d(x, w, b, &k, &so);
  tc_assert_close(nb_conv2d(tx, tw, tb, NULL), ref, so);
  tc_assert_close(nb_conv2d(tx, tw, tb, &(nb_conv2d_params){0}), ref, so);
  free(x);
  free(w);
  free(b);
  free(ref);
}

Test(conv, conv2d_size_zero_dims) {
  conv_case cases[] = {
      {0, 2, 4, 4, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1, true}, /* no images */
      {1, 2, 4, 4, 0, 3, 3, 1, 1, 0, 0, 1, 1, 1, true}, /* no output channels */
      {2, 0, 4, 4, 3, 3, 3, 1, 1, 0, 0, 1, 1, 1, true}, /* no input channels: bias */
      {1, 2, 0, 3, 2, 1, 1, 1, 1, 1, 0, 1, 1, 1, true}, /* empty image, padding: bias */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    check_conv(&cases[i], NB_F32);
    check_conv(&cases[i], NB_F16);
  }
}

Test(conv, conv2d_large_sizes_use_threads) {
  conv_case many_small = {8, 3, 12, 12, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true};
  conv_case one_large = {1, 8, 30, 30, 16, 3, 3, 1, 1, 0, 0, 1, 1, 1, true};
  conv_case f64_large = {2, 16, 20, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1, 2, false};
  check_conv(&many_small, NB_F32);
  check_conv(&many_small, NB_F64);
  check_conv(&one_large, NB_F32);
  check_conv(&one_large, NB_BF16);
  check_conv(&f64_large, NB_F64);
}

Test(conv, conv2d_promotes_float_dtypes) {
  double x[16], w[4], b[1] = {0.5};
  for (int i = 0; i < 16; i++)
    x[i] = i * 0.25;
  for (int i = 0; i < 4; i++)
    w[i] = 1 - i * 0.5;
  nb_tensor *y = nb_conv2d(tc_tensor(x, NB_SHAPE(1, 1, 4, 4), NB_F16),
                           tc_tensor(w, NB_SHAPE(1, 1, 2, 2), NB_BF16),
                           tc_tensor(b, NB_SHAPE(1), NB_F64), NULL);
  cr_assert_eq(nb_dtype_of(y), NB_F64);
  conv_case k = {1, 1, 4, 4, 1, 2, 2, 1, 1, 0, 0, 1, 1, 1, true};
  nb_shape so;
  double *ref = ref_conv2d(x, w, b, &k, &so);
  tc_assert_close(y, ref, so);
  free(ref);
}

/* ---- max pooling ------------------------------------------------------------------------- */

/* Max over windows in float64; padding is -inf. *so gets [n, c, oh, ow]. */
static double *ref_max_pool(const double *x, nb_shape xs, int kh, int kw, int sh, int sw, int ph,
                            int pw, nb_shape *so) {
  int64_t n = xs.dims[0] * xs.dims[1], h = xs.dims[2], w = xs.dims[3];
  int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  *so = NB_SHAPE(xs.dims[0], xs.dims[1], oh, ow);
  double *y = malloc((size_t)(n * oh * ow + 1) * sizeof *y);
  for (int64_t p = 0; p < n; p++)
    for (int64_t i = 0; i < oh; i++)
      for (int64_t j = 0; j < ow; j++) {
        double m = -INFINITY;
        for (int a = 0; a < kh; a++)
          for (int b = 0; b < kw; b++) {
            int64_t hi = i * sh - ph + a, wi = j * sw - pw + b;
            if (hi < 0 || hi >= h || wi < 0 || wi >= w) continue;
            double v = x[(p * h + hi) * w + wi];
            if (v > m || isnan(v)) m = isnan(m) ? m : v;
          }
        y[(p * oh + i) * ow + j] = m;
      }
  return y;
}

/* nb_max_pool2d of random x [xs] in dt against the reference (exact). */
static void check_pool(nb_shape xs, nb_dtype dt, int kh, int kw, int sh, int sw, int ph, int pw) {
  uint64_t seed = 11 + (uint64_t)kh;
  double *x = tc_rand_floats(tc_numel(xs), dt, &seed);
  nb_tensor *y = nb_max_pool2d(tc_tensor(x, xs, dt), kh, kw, sh, sw, ph, pw);
  cr_assert(y, "nb_max_pool2d failed: %s", nb_last_error());
  cr_assert_eq(nb_dtype_of(y), dt);
  nb_shape so;
  double *ref = ref_max_pool(x, xs, kh, kw, sh ? sh : kh, sw ? sw : kw, ph, pw, &so);
  tc_assert_close_tol(y, ref, so, 0);
  free(x);
  free(ref);
}

Test(conv, max_pool2d_matches_reference_for_every_float_dtype) {
  for (int d = 0; d < 4; d++) {
    nb_dtype dt = float_dtypes[d];
    check_pool(NB_SHAPE(2, 3, 6, 6), dt, 2, 2, 0, 0, 0, 0); /* stride = kernel */
    check_pool(NB_SHAPE(1, 2, 5, 5), dt, 3, 3, 1, 1, 1, 1); /* padding: -inf, not 0 */
    check_pool(NB_SHAPE(2, 2, 7, 5), dt, 3, 2, 2, 1, 1, 0);
    check_pool(NB_SHAPE(1, 1, 4, 4), dt, 4, 4, 1, 1, 0, 0); /* whole image */
    check_pool(NB_SHAPE(3, 4, 1, 1), dt, 1, 1, 1, 1, 0, 0);
    check_pool(NB_SHAPE(1, 2, 7, 7), dt, 3, 3, 2, 2, 0, 0); /* floor: last row unused */
    check_pool(NB_SHAPE(0, 2, 4, 4), dt, 2, 2, 0, 0, 0, 0);
    check_pool(NB_SHAPE(2, 0, 4, 4), dt, 2, 2, 0, 0, 0, 0);
  }
}

Test(conv, max_pool2d_large_sizes_use_threads) {
  check_pool(NB_SHAPE(4, 8, 32, 32), NB_F32, 3, 3, 1, 1, 1, 1);
  check_pool(NB_SHAPE(4, 8, 32, 32), NB_F64, 2, 2, 2, 2, 1, 1);
}

Test(conv, max_pool2d_propagates_nan) {
  double x[16];
  for (int i = 0; i < 16; i++)
    x[i] = i;
  x[5] = NAN;
  double ref[4] = {NAN, 7, 13, 15};
  tc_assert_close(nb_max_pool2d(tc_tensor(x, NB_SHAPE(1, 1, 4, 4), NB_F32), 2, 2, 0, 0, 0, 0), ref,
                  NB_SHAPE(1, 1, 2, 2));
}

/* ---- kernels on strided views ------------------------------------------------------------- */

/* View of mem (dtype dt) at element offset off with dims s and strides st. */
static nbi_view strided(void *mem, nb_dtype dt, int64_t off, nb_shape s, const int64_t *st) {
  nbi_view v = {.data = (char *)mem + off * (int64_t)nb_dtype_size(dt), .dtype = dt, .ndim = 4};
  for (int d = 0; d < 4; d++) {
    v.dims[d] = s.dims[d];
    v.strides[d] = st[d];
  }
  return v;
}

Test(conv, kernels_read_strided_views) {
  /* x [2,3,5,4] stored as [2,3,4,5] (H and W swapped); w [4,3,2,2] with its
   * kernel columns flipped (negative stride). */
  uint64_t seed = 5;
  double *xs = tc_rand_floats(120, NB_F32, &seed), *ws = tc_rand_floats(48, NB_F32, &seed);
  float xm[120], wm[48];
  for (int i = 0; i < 120; i++)
    xm[i] = (float)xs[i];
  for (int i = 0; i < 48; i++)
    wm[i] = (float)ws[i];
  nbi_view vx = strided(xm, NB_F32, 0, NB_SHAPE(2, 3, 5, 4), (int64_t[]){60, 20, 1, 5});
  nbi_view vw = strided(wm, NB_F32, 1, NB_SHAPE(4, 3, 2, 2), (int64_t[]){12, 4, 2, -1});
  double x[120], w[48];
  for (int n = 0; n < 2; n++)
    for (int c = 0; c < 3; c++)
      for (int h = 0; h < 5; h++)
        for (int v = 0; v < 4; v++)
          x[((n * 3 + c) * 5 + h) * 4 + v] = xs[n * 60 + c * 20 + v * 5 + h];
  for (int o = 0; o < 4; o++)
    for (int c = 0; c < 3; c++)
      for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
          w[((o * 3 + c) * 2 + a) * 2 + b] = ws[o * 12 + c * 4 + a * 2 + 1 - b];

  conv_case k = {2, 3, 5, 4, 4, 2, 2, 1, 2, 1, 0, 1, 1, 1, false};
  nb_conv2d_params p = {{1, 2}, {1, 0}, {1, 1}, 1};
  nb_tensor *node = nb_conv2d(nb_zeros(NB_SHAPE(2, 3, 5, 4), NB_F32),
                              nb_zeros(NB_SHAPE(4, 3, 2, 2), NB_F32), NULL, &p);
  cr_assert(node, "%s", nb_last_error());
  nb_shape so;
  double *ref = ref_conv2d(x, w, NULL, &k, &so);
  float y[96];
  cr_assert_eq(tc_numel(so), 96);
  nbi_view out = {.data = (char *)y, .dtype = NB_F32, .ndim = 4};
  memcpy(out.dims, so.dims, sizeof out.dims);
  nbi_contig_strides(&so, out.strides);
  cr_assert_eq(nbi_cpu_run_op(NULL, node, &out, (nbi_view[]){vx, vw}), NB_OK);
  for (int64_t i = 0; i < tc_numel(so); i++)
    cr_assert(fabs(y[i] - ref[i]) <= 1e-5 * (1 + fabs(ref[i])), "conv element %lld: %g vs %g",
              (long long)i, y[i], ref[i]);
  free(ref);

  nb_tensor *pool = nb_max_pool2d(nb_zeros(NB_SHAPE(2, 3, 5, 4), NB_F32), 2, 2, 1, 1, 1, 1);
  ref = ref_max_pool(x, NB_SHAPE(2, 3, 5, 4), 2, 2, 1, 1, 1, 1, &so);
  float z[180];
  cr_assert_eq(tc_numel(so), 180);
  out = (nbi_view){.data = (char *)z, .dtype = NB_F32, .ndim = 4};
  memcpy(out.dims, so.dims, sizeof out.dims);
  nbi_contig_strides(&so, out.strides);
  cr_assert_eq(nbi_cpu_run_op(NULL, pool, &out, (nbi_view[]){vx}), NB_OK);
  for (int64_t i = 0; i < tc_numel(so); i++)
    cr_assert_eq(z[i], (float)ref[i], "pool element %lld: %g vs %g", (long long)i, z[i], ref[i]);
  free(ref);
  free(xs);
  free(ws);
}

/* ---- bad inputs ------------------------------------------------------------------------------ */

Test(conv, conv2d_rejects_null) {
  nb_tensor *x = nb_zeros(NB_SHAPE(1, 1, 3, 3), NB_F32);
  cr_assert_null(nb_conv2d(NULL, x, NULL, NULL));
  tc_assert_error(NB_ERR_NULL, "nb_conv2d");
  cr_assert_null(nb_conv2d(x, NULL, NULL, NULL));
  tc_assert_error(NB_ERR_NULL, "nb_conv2d");
}

Test(conv, conv2d_rejects_non_4d_operands) {
  cr_assert_null(nb_conv2d(nb_zeros(NB_SHAPE(3, 4), NB_F32), nb_zeros(NB_SHAPE(1, 1, 1, 1), NB_F32),
                           NULL, NULL));
  tc_assert_error(NB_ERR_SHAPE, "nb_conv2d: input must be 4-D [N,C,H,W], got [3,4]");
  cr_assert_null(nb_conv2d(nb_zeros(NB_SHAPE(1, 1, 3, 3), NB_F32),
                           nb_zeros(NB_SHAPE(1, 3, 3), NB_F32), NULL, NULL));
  tc_assert_error(NB_ERR_SHAPE, "nb_conv2d: weight must be 4-D [O,C/groups,KH,KW], got [1,3,3]");
}

Test(conv, conv2d_rejects_channel_mismatch) {
  double xv[100];
  for (int i = 0; i < 100; i++)
    xv[i] = i;
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(1, 4, 5, 5), NB_F32);
  cr_assert_null(nb_conv2d(x, nb_zeros(NB_SHAPE(8, 3, 3, 3), NB_F32), NULL, NULL));
  tc_assert_error(NB_ERR_SHAPE, "nb_conv2d: channel mismatch: input [1,4,5,5] has 4 channels, "
                                "weight [8,3,3,3] with groups 1 expects 3");
  tc_assert_close(x, xv, NB_SHAPE(1, 4, 5, 5)); /* input untouched */
}

Test(conv, conv2d_rejects_groups_not_dividing_channels) {
  nb_conv2d_params p = {.groups = 3};
  cr_assert_null(nb_conv2d(nb_zeros(NB_SHAPE(1, 4, 5, 5), NB_F32),
                           nb_zeros(NB_SHAPE(6, 1, 3, 3), NB_F32), NULL, &p));
  tc_assert_error(NB_ERR_ARG, "nb_conv2d: groups 3 must divide input channels 4");
  cr_assert_null(nb_conv2d(nb_zeros(NB_SHAPE(1, 6, 5, 5), NB_F32),
                           nb_zeros(NB_SHAPE(4, 2, 3, 3), NB_F32), NULL, &p));
  tc_assert_error(NB_ERR_ARG, "output channels 4");
}

Test(conv, conv2d_rejects_kernel_larger_than_padded_input) {
  nb_tensor *x = nb_zeros(NB_SHAPE(1, 3, 4, 4), NB_F32),
            *w = nb_zeros(NB_SHAPE(2, 3, 5, 5), NB_F32);
  cr_assert_null(nb_conv2d(x, w, NULL, NULL));
  tc_assert_error(NB_ERR_SHAPE, "nb_conv2d: kernel 5x5 with dilation 1x1 is larger than the "
                                "padded input 4x4");
  nb_shape s = nb_shape_of(nb_conv2d(x, w, NULL, &(nb_conv2d_params){.padding = {1, 1}}));
  cr_assert(s.ndim == 4 && s.dims[2] == 2 && s.dims[3] == 2);
  cr_assert_null(nb_conv2d(nb_zeros(NB_SHAPE(1, 1, 5, 5), NB_F32),
                           nb_zeros(NB_SHAPE(1, 1, 3, 3), NB_F32), NULL,
                           &(nb_conv2d_params){.dilation = {3, 1}}));
  tc_assert_error(NB_ERR_SHAPE, "kernel 3x3 with dilation 3x1 is larger than the padded input 5x5");
}

Test(conv, conv2d_rejects_bad_bias_kernel_and_params) {
  nb_tensor *x = nb_zeros(NB_SHAPE(1, 3, 5, 5), NB_F32),
            *w = nb_zeros(NB_SHAPE(2, 3, 3, 3), NB_F32);
  cr_assert_null(nb_conv2d(x, w, nb_zeros(NB_SHAPE(3), NB_F32), NULL));
  tc_assert_error(NB_ERR_SHAPE, "nb_conv2d: bias must be [2] for weight [2,3,3,3], got [3]");
  cr_assert_null(nb_conv2d(x, nb_zeros(NB_SHAPE(2, 3, 0, 3), NB_F32), NULL, NULL));
  tc_assert_error(NB_ERR_SHAPE, "nb_conv2d: kernel size must be positive");
  cr_assert_null(nb_conv2d(x, w, NULL, &(nb_conv2d_params){.stride = {1, -1}}));
  tc_assert_error(NB_ERR_ARG, "nb_conv2d: stride must be >= 0 (0 = default), got 1x-1");
  cr_assert_null(nb_conv2d(x, w, NULL, &(nb_conv2d_params){.padding = {-2, 0}}));
  tc_assert_error(NB_ERR_ARG, "nb_conv2d: padding must be >= 0");
  cr_assert_null(nb_conv2d(x, w, NULL, &(nb_conv2d_params){.groups = -1}));
  tc_assert_error(NB_ERR_ARG, "nb_conv2d: groups must be >= 0");
}

Test(conv, conv2d_rejects_integer_dtypes) {
  nb_tensor *w = nb_zeros(NB_SHAPE(2, 3, 3, 3), NB_F32);
  cr_assert_null(nb_conv2d(nb_zeros(NB_SHAPE(1, 3, 5, 5), NB_I32), w, NULL, NULL));
  tc_assert_error(NB_ERR_DTYPE, "nb_conv2d: input must have a float dtype, got i32");
  cr_assert_null(
      nb_conv2d(nb_zeros(NB_SHAPE(1, 3, 5, 5), NB_F32), w, nb_zeros(NB_SHAPE(2), NB_BOOL), NULL));
  tc_assert_error(NB_ERR_DTYPE, "nb_conv2d: bias must have a float dtype, got bool");
}

Test(conv, max_pool2d_rejects_bad_inputs) {
  cr_assert_null(nb_max_pool2d(NULL, 2, 2, 0, 0, 0, 0));
  tc_assert_error(NB_ERR_NULL, "nb_max_pool2d");
  double xv[16];
  for (int i = 0; i < 16; i++)
    xv[i] = -i;
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(1, 1, 4, 4), NB_F32);
  cr_assert_null(nb_max_pool2d(x, 0, 2, 0, 0, 0, 0));
  tc_assert_error(NB_ERR_ARG, "nb_max_pool2d: kernel 0x2 must be positive");
  cr_assert_null(nb_max_pool2d(x, 2, 2, -1, 0, 0, 0));
  tc_assert_error(NB_ERR_ARG, "stride -1x0 and padding 0x0 >= 0");
  cr_assert_null(nb_max_pool2d(x, 3, 3, 1, 1, 2, 1));
  tc_assert_error(NB_ERR_ARG, "nb_max_pool2d: padding 2x1 exceeds half the kernel 3x3");
  cr_assert_null(nb_max_pool2d(x, 5, 2, 1, 1, 0, 0));
  tc_assert_error(NB_ERR_SHAPE, "nb_max_pool2d: kernel 5x2 is larger than the padded input 4x4");
  cr_assert_null(nb_max_pool2d(nb_zeros(NB_SHAPE(4, 4), NB_F32), 2, 2, 0, 0, 0, 0));
  tc_assert_error(NB_ERR_SHAPE, "nb_max_pool2d: input must be 4-D [N,C,H,W], got [4,4]");
  cr_assert_null(nb_max_pool2d(nb_zeros(NB_SHAPE(1, 1, 4, 4), NB_I64), 2, 2, 0, 0, 0, 0));
  tc_assert_error(NB_ERR_DTYPE, "nb_max_pool2d: input must have a float dtype, got i64");
  tc_assert_close(x, xv, NB_SHAPE(1, 1, 4, 4)); /* input untouched */
}
