/* test/test_gemm_small.c — the small f32 GEMM kernel (src/backends/cpu/k_gemm_small.c):
 * C = act(A @ B + bias) against a double-precision loop over many shapes (K = 1, N = 1,
 * M = 1, K = 0, odd sizes, each register-tile remainder), operand layouts (row-major,
 * transposed, strided, negative and zero strides), strided bias, every activation and every
 * instruction set the CPU has; then the same products through nb_matmul and through jitted
 * [matmul, add, activation] groups, which run on this kernel below 2^20 multiply-adds.
 *
 * Tolerance: f32 sums against the double reference, relative 1e-5 scaled by K / 100 where K is
 * larger, on inputs in [-1, 1]; the activations (vmath.h) are within 2 ulp. */
#include "common.h"

#include "../src/backends/cpu/k_gemm_small.h"
#include "../src/backends/cpu/vmath.h"

static double act_ref(nbi_epi_act act, double x) {
  switch (act) {
  case NBI_EPI_RELU: return x < 0 ? 0 : x;
  case NBI_EPI_GELU: return 0.5 * x * erfc(-x / sqrt(2.0));
  case NBI_EPI_TANH: return tanh(x);
  case NBI_EPI_SIGMOID: return 1 / (1 + exp(-x));
  case NBI_EPI_SILU: return x / (1 + exp(-x));
  default: return x;
  }
}

enum { LAY_ROW, LAY_COL, LAY_STRIDED, LAY_NEG, N_LAY };

/* An r x c operand of values v (row-major, r * c) stored in a fresh buffer *mem in layout lay;
 * returns the pointer to element (0, 0) and its strides. */
static const float *place(const double *v, int64_t r, int64_t c, int lay, float **mem, int64_t *sr,
                          int64_t *sc) {
  int64_t n = r * c, span = 2 * n + 1;
  *mem = calloc((size_t)span, sizeof **mem);
  float *base = *mem;
  switch (lay) {
  case LAY_ROW: *sr = c, *sc = 1; break;
  case LAY_COL: *sr = 1, *sc = r; break;
  case LAY_STRIDED: *sr = 2 * c, *sc = 2; break; /* every other element */
  default:                                       /* rows reversed: negative row stride */
    *sr = -c, *sc = 1;
    base += (r - 1) * c;
    break;
  }
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < c; j++)
      base[i * *sr + j * *sc] = (float)v[i * c + j];
  return base;
}

static void check_shape(int64_t m, int64_t k, int64_t n, int lay_a, int lay_b, bool bias_on,
                        nbi_epi_act act, uint64_t *seed) {
  double *a = tc_rand_floats(m * k, NB_F32, seed), *b = tc_rand_floats(k * n, NB_F32, seed),
         *bias = tc_rand_floats(n, NB_F32, seed);
  float *ma, *mb, *mbias = calloc((size_t)(3 * n + 1), sizeof *mbias);
  nbi_gemm_small_args g = {.m = m, .n = n, .k = k, .act = act, .ldc = n + 3};
  g.a = place(a, m, k, lay_a, &ma, &g.sa_r, &g.sa_c);
  g.b = place(b, k, n, lay_b, &mb, &g.sb_r, &g.sb_c);
  for (int64_t j = 0; j < n; j++)
    mbias[3 * j] = (float)bias[j];
  if (bias_on) g.bias = mbias, g.s_bias = 3;
  float *c = malloc(sizeof *c * (size_t)(m * g.ldc));
  for (int64_t i = 0; i < m * g.ldc; i++)
    c[i] = 12345.0f; /* the padding between rows must stay */
  g.c = c;
  cr_assert_eq(nbi_gemm_small(&g), NB_OK);
  double tol = 1e-5 * (k > 100 ? (double)k / 100 : 1);
  for (int64_t i = 0; i < m; i++) {
    for (int64_t j = 0; j < n; j++) {
      double s = bias_on ? bias[j] : 0;
      for (int64_t p = 0; p < k; p++)
        s += a[i * k + p] * b[p * n + j];
      double r = act_ref(act, s), x = c[i * g.ldc + j];
      cr_assert(fabs(x - r) <= tol * (1 + fabs(r)),
                "%s %lldx%lldx%lld lay %d/%d bias %d act %d (%lld, %lld): %.9g, reference %.9g",
                nbi_isa_name(nbi_isa_active()), (long long)m, (long long)k, (long long)n, lay_a,
                lay_b, bias_on, act, (long long)i, (long long)j, x, r);
    }
    for (int64_t j = n; j < g.ldc; j++)
      cr_assert_eq(c[i * g.ldc + j], 12345.0f, "row padding written");
  }
  free(a), free(b), free(bias), free(ma), free(mb), free(mbias), free(c);
}

Test(gemm_small, matches_double_reference_every_isa_shape_layout) {
  static const int64_t shapes[][3] = {
      {1, 1, 1},    {1, 7, 1},   {256, 1, 32},  {256, 32, 1}, {32, 256, 1}, {1, 256, 32},
      {13, 5, 17},  {12, 3, 32}, {11, 9, 33},   {25, 40, 15}, {7, 33, 49},  {48, 17, 1},
      {64, 16, 64}, {3, 0, 5},   {37, 70, 100}, {100, 1, 1},  {5, 20, 2},   {24, 64, 31}};
  uint64_t seed = 3;
  for (int isa = 0; isa <= (int)nbi_isa_best(); isa++) {
    cr_assert_eq(nbi_isa_select((nbi_isa)isa), (nbi_isa)isa);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int la = 0; la < N_LAY; la++)
        for (int lb = 0; lb < N_LAY; lb++) {
          int v = (int)(s + (size_t)la + (size_t)lb);
          check_shape(shapes[s][0], shapes[s][1], shapes[s][2], la, lb, v % 2 == 0,
                      (nbi_epi_act)(v % 6), &seed);
        }
  }
  nbi_isa_select(NBI_ISA_COUNT);
}

Test(gemm_small, every_activation_with_and_without_bias) {
  uint64_t seed = 5;
  for (int isa = 0; isa <= (int)nbi_isa_best(); isa++) {
    nbi_isa_select((nbi_isa)isa);
    for (int act = 0; act < 6; act++)
      for (int bias = 0; bias < 2; bias++) {
        check_shape(29, 19, 45, LAY_ROW, LAY_ROW, bias, (nbi_epi_act)act, &seed);
        check_shape(64, 23, 1, LAY_COL, LAY_ROW, bias, (nbi_epi_act)act, &seed);     /* C^T form */
        check_shape(40, 50, 1, LAY_ROW, LAY_STRIDED, bias, (nbi_epi_act)act, &seed); /* dots */
      }
  }
  nbi_isa_select(NBI_ISA_COUNT);
}

/* NaN through relu stays NaN (the elementwise kernel's x < 0 ? 0 : x); negatives give 0. */
Test(gemm_small, relu_passes_nan) {
  float a[2] = {NAN, 1.0f}, b[32], c[64];
  for (int j = 0; j < 32; j++)
    b[j] = j == 3 ? -2.0f : 1.0f;
  for (int isa = 0; isa <= (int)nbi_isa_best(); isa++) {
    nbi_isa_select((nbi_isa)isa);
    nbi_gemm_small_args g = {.m = 2,
                             .n = 32,
                             .k = 1,
                             .a = a,
                             .sa_r = 1,
                             .sa_c = 1,
                             .b = b,
                             .sb_r = 32,
                             .sb_c = 1,
                             .act = NBI_EPI_RELU,
                             .c = c,
                             .ldc = 32};
    cr_assert_eq(nbi_gemm_small(&g), NB_OK);
    for (int j = 0; j < 32; j++)
      cr_assert(isnan(c[j]), "relu(NaN) at %d: %g", j, c[j]);
    for (int j = 0; j < 32; j++)
      cr_assert_eq(c[32 + j], j == 3 ? 0.0f : 1.0f);
  }
  nbi_isa_select(NBI_ISA_COUNT);
}

/* ---- through the ops ---------------------------------------------------------------- */
/* nb_matmul of small 2-D products with transposed views on either side. */
Test(gemm_small, matmul_op_small_products_with_transposed_views) {
  static const int64_t shapes[][3] = {{256, 1, 32}, {256, 32, 1}, {32, 256, 1},
                                      {1, 256, 32}, {9, 13, 7},   {64, 32, 64}};
  uint64_t seed = 9;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int t = 0; t < 4; t++) {
      int64_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
      double *a = tc_rand_floats(m * k, NB_F32, &seed), *b = tc_rand_floats(k * n, NB_F32, &seed);
      nb_scope_begin();
      nb_tensor *ta = t & 1 ? tc_strided_tensor(a, NB_SHAPE(m, k), NB_F32)
                            : tc_tensor(a, NB_SHAPE(m, k), NB_F32);
      nb_tensor *tb = t & 2 ? tc_strided_tensor(b, NB_SHAPE(k, n), NB_F32)
                            : tc_tensor(b, NB_SHAPE(k, n), NB_F32);
      double *c = tc_read(nb_matmul(ta, tb));
      nb_scope_end();
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
          double r = 0;
          for (int64_t p = 0; p < k; p++)
            r += a[i * k + p] * b[p * n + j];
          cr_assert(fabs(c[i * n + j] - r) <= 1e-5 * (k > 100 ? k / 100.0 : 1) * (1 + fabs(r)),
                    "%lldx%lldx%lld t %d (%lld, %lld): %.9g vs %.9g", (long long)m, (long long)k,
                    (long long)n, t, (long long)i, (long long)j, c[i * n + j], r);
        }
      free(a), free(b), free(c);
    }
}

/* in: x, w, bias -> act(x @ w + bias) [, the sum]: a jitted epilogue group below 2^20
 * multiply-adds runs as one kernel (the small one) and matches a double loop. */
typedef struct small_case {
  int act; /* 0 none, 1 relu, 2 gelu, 3 tanh, 4 sigmoid, 5 silu */
  bool keep_sum, trans_x;
} small_case;

static nb_status small_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in;
  const small_case *c = u;
  nb_tensor *s = nb_add(nb_matmul(c->trans_x ? nb_transpose(in[0]) : in[0], in[1]), in[2]);
  nb_tensor *y = c->act == 1   ? nb_relu(s)
                 : c->act == 2 ? nb_gelu(s)
                 : c->act == 3 ? nb_tanh(s)
                 : c->act == 4 ? nb_sigmoid(s)
                 : c->act == 5 ? nb_silu(s)
                               : s;
  out[0] = y;
  if (n_out > 1) out[1] = s;
  return y ? NB_OK : nb_last_status();
}

Test(gemm_small, jitted_epilogue_groups_fuse_and_match) {
  static const int64_t shapes[][3] = {{256, 1, 32}, {256, 32, 1}, {31, 17, 45}, {64, 64, 32}};
  uint64_t seed = 21;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int act = 0; act < 6; act++) {
      small_case c = {.act = act, .keep_sum = act % 2 == 1 && act > 0, .trans_x = s % 2 == 1};
      int64_t m = shapes[s][0], k = shapes[s][1], n = shapes[s][2];
      double *x = tc_rand_floats(m * k, NB_F32, &seed), *w = tc_rand_floats(k * n, NB_F32, &seed),
             *bias = tc_rand_floats(n, NB_F32, &seed);
      int n_out = c.keep_sum ? 2 : 1;
      nb_scope_begin();
      nb_tensor *in[3] = {
          c.trans_x ? tc_tensor(x, NB_SHAPE(k, m), NB_F32) : tc_tensor(x, NB_SHAPE(m, k), NB_F32),
          tc_tensor(w, NB_SHAPE(k, n), NB_F32), tc_tensor(bias, NB_SHAPE(n), NB_F32)};
      cr_assert(nb_eval(in, 3) == NB_OK, "%s", nb_last_error());
      nb_fn *f = nb_fn_create(small_body, &c, 3, n_out), *j = nb_jit(f);
      nb_tensor *out[2];
      cr_assert(nb_call(j, in, out) == NB_OK, "%s", nb_last_error()); /* traces */
      nb_reset_stats();
      cr_assert(nb_call(j, in, out) == NB_OK, "%s", nb_last_error());
      cr_assert(nb_eval(out, n_out) == NB_OK, "%s", nb_last_error());
      cr_assert_eq(nb_get_stats().kernels_run, 1, "act %d: one epilogue group", act);
      double *res[2] = {tc_read(out[0]), n_out > 1 ? tc_read(out[1]) : NULL};
      nb_fn_release(j);
      nb_fn_release(f);
      nb_scope_end();
      double tol = 1e-5 * (k > 100 ? k / 100.0 : 1);
      for (int64_t i = 0; i < m; i++)
        for (int64_t jj = 0; jj < n; jj++) {
          double sum = bias[jj];
          for (int64_t p = 0; p < k; p++)
            sum += (c.trans_x ? x[p * m + i] : x[i * k + p]) * w[p * n + jj];
          double r = act_ref((nbi_epi_act)act, sum), y = res[0][i * n + jj];
          cr_assert(fabs(y - r) <= tol * (1 + fabs(r)), "act %d (%lld, %lld): %.9g vs %.9g", act,
                    (long long)i, (long long)jj, y, r);
          if (res[1])
            cr_assert(fabs(res[1][i * n + jj] - sum) <= tol * (1 + fabs(sum)), "sum (%lld, %lld)",
                      (long long)i, (long long)jj);
        }
      free(x), free(w), free(bias), free(res[0]), free(res[1]);
    }
}

/* Matrix-vector products (a 1-D operand on either side) take the small kernel too. */
Test(gemm_small, matvec_and_vecmat_products) {
  uint64_t seed = 31;
  for (int t = 0; t < 2; t++) {
    int64_t m = 37, k = 53;
    double *a = tc_rand_floats(m * k, NB_F32, &seed), *v = tc_rand_floats(k, NB_F32, &seed),
           *u = tc_rand_floats(m, NB_F32, &seed);
    nb_scope_begin();
    nb_tensor *ta =
        t ? tc_strided_tensor(a, NB_SHAPE(m, k), NB_F32) : tc_tensor(a, NB_SHAPE(m, k), NB_F32);
    double *av = tc_read(nb_matmul(ta, tc_tensor(v, NB_SHAPE(k), NB_F32)));
    double *ua = tc_read(nb_matmul(tc_tensor(u, NB_SHAPE(m), NB_F32), ta));
    nb_scope_end();
    for (int64_t i = 0; i < m; i++) {
      double r = 0;
      for (int64_t p = 0; p < k; p++)
        r += a[i * k + p] * v[p];
      cr_assert(fabs(av[i] - r) <= 1e-5 * (1 + fabs(r)), "A v [%lld]: %.9g vs %.9g", (long long)i,
                av[i], r);
    }
    for (int64_t p = 0; p < k; p++) {
      double r = 0;
      for (int64_t i = 0; i < m; i++)
        r += u[i] * a[i * k + p];
      cr_assert(fabs(ua[p] - r) <= 1e-5 * (1 + fabs(r)), "u A [%lld]: %.9g vs %.9g", (long long)p,
                ua[p], r);
    }
    free(a), free(v), free(u), free(av), free(ua);
  }
}
