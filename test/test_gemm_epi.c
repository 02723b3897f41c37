/* test/test_gemm_epi.c — GEMM epilogues (src/backends/cpu/k_gemm_epi.c): a
 * [matmul, add bias, activation] run realizes as one kernel and matches both a
 * double-precision loop and the unfused kernels. The graphs are traced under
 * nb_jit, so the product and the sum are intermediates nothing else holds.
 *
 * Tolerances: the fused group is not bitwise the unfused one (the oneDNN
 * matmul primitive may order the K sum differently from dnnl_sgemm, and
 * oneDNN's gelu/tanh/sigmoid/silu differ from libm in the last bits), so f32
 * results are compared with a relative tolerance of 1e-5 (scaled by K / 100
 * where K is larger) on inputs in [-1, 1]. Groups need at least 2^20
 * multiply-adds (smaller products stay on sgemm), hence the sizes. */
#include "common.h"

enum { ACT_NONE, ACT_RELU, ACT_GELU, ACT_TANH, ACT_SIGMOID, ACT_SILU, N_ACT };

typedef struct epi_case {
  int act;
  bool trans_a, trans_b; /* operands stored transposed, passed as nb_transpose views */
  bool bias_2d;          /* bias [1, N] instead of [N] */
  bool keep_sum;         /* second output: the sum (needed outside the group) */
  bool keep_product;     /* second output: the product (the group must not fuse) */
} epi_case;

static nb_tensor *act_of(int act, nb_tensor *x) {
  switch (act) {
  case ACT_RELU: return nb_relu(x);
  case ACT_GELU: return nb_gelu(x);
  case ACT_TANH: return nb_tanh(x);
  case ACT_SIGMOID: return nb_sigmoid(x);
  case ACT_SILU: return nb_silu(x);
  default: return x;
  }
}

static double act_ref(int act, double x) {
  switch (act) {
  case ACT_RELU: return x < 0 ? 0 : x;
  case ACT_GELU: return 0.5 * x * erfc(-x / sqrt(2.0));
  case ACT_TANH: return tanh(x);
  case ACT_SIGMOID: return 1 / (1 + exp(-x));
  case ACT_SILU: return x / (1 + exp(-x));
  default: return x;
  }
}

/* in: a (or a^T), b (or b^T), bias -> act(a @ b + bias) [, sum or product] */
static nb_status epi_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in;
  const epi_case *c = u;
  nb_tensor *a = c->trans_a ? nb_transpose(in[0]) : in[0];
  nb_tensor *b = c->trans_b ? nb_transpose(in[1]) : in[1];
  nb_tensor *p = nb_matmul(a, b), *s = nb_add(p, in[2]);
  out[0] = act_of(c->act, s);
  if (n_out > 1) out[1] = c->keep_sum ? s : p;
  return out[0] ? NB_OK : nb_last_status();
}

/* Runs case c on an m x k by k x n product with fusion on or off; returns the
 * outputs' values and the kernels the realization ran. */
static uint64_t run_case(const epi_case *c, int64_t m, int64_t k, int64_t n, nb_dtype dt,
                         bool fused, const double *a, const double *b, const double *bias,
                         double **res) {
  nbi_set_fusion(fused);
  int n_out = c->keep_sum || c->keep_product ? 2 : 1;
  nb_scope_begin();
  nb_shape sa = c->trans_a ? NB_SHAPE(k, m) : NB_SHAPE(m, k);
  nb_shape sb = c->trans_b ? NB_SHAPE(n, k) : NB_SHAPE(k, n);
  nb_tensor *in[3] = {tc_tensor(a, sa, dt), tc_tensor(b, sb, dt),
                      tc_tensor(bias, c->bias_2d ? NB_SHAPE(1, n) : NB_SHAPE(n), dt)};
  cr_assert(nb_eval(in, 3) == NB_OK, "%s", nb_last_error());
  nb_fn *f = nb_fn_create(epi_body, (void *)c, 3, n_out), *j = nb_jit(f);
  nb_tensor *out[2];
  cr_assert(nb_call(j, in, out) == NB_OK, "%s", nb_last_error()); /* traces */
  nb_reset_stats();
  cr_assert(nb_call(j, in, out) == NB_OK, "%s", nb_last_error());
  cr_assert(nb_eval(out, n_out) == NB_OK, "%s", nb_last_error());
  uint64_t kernels = nb_get_stats().kernels_run;
  for (int o = 0; o < n_out; o++)
    res[o] = tc_read(out[o]);
  nb_fn_release(j);
  nb_fn_release(f);
  nb_scope_end();
  nbi_set_fusion(true);
  return kernels;
}

/* Reference in double: element (i, j) of a @ b (+ bias, then act). */
static double ref_at(const epi_case *c, int64_t m, int64_t k, int64_t n, const double *a,
                     const double *b, const double *bias, int64_t i, int64_t j, int stage) {
  double s = 0;
  for (int64_t p = 0; p < k; p++)
    s += (c->trans_a ? a[p * m + i] : a[i * k + p]) * (c->trans_b ? b[j * k + p] : b[p * n + j]);
  if (stage == 0) return s;
  s += bias[j];
  return stage == 1 ? s : act_ref(c->act, s);
}

static void check_case(const epi_case *c, int64_t m, int64_t k, int64_t n, uint64_t seed) {
  double *a = tc_rand_floats(m * k, NB_F32, &seed), *b = tc_rand_floats(k * n, NB_F32, &seed),
         *bias = tc_rand_floats(n, NB_F32, &seed);
  double *on[2] = {0}, *off[2] = {0};
  uint64_t k_on = run_case(c, m, k, n, NB_F32, true, a, b, bias, on);
  uint64_t k_off = run_case(c, m, k, n, NB_F32, false, a, b, bias, off);
  int members = c->act == ACT_NONE ? 2 : 3;
  if (c->keep_product)
    cr_assert_eq(k_on, 2, "product held: no epilogue group");
  else
    cr_assert_eq(k_on, 1, "act %d: %llu kernels fused (unfused %llu)", c->act,
                 (unsigned long long)k_on, (unsigned long long)k_off);
  cr_assert_eq(k_off, (uint64_t)members);
  int n_out = c->keep_sum || c->keep_product ? 2 : 1;
  double tol = 1e-5 * (k > 100 ? (double)k / 100 : 1);
  for (int o = 0; o < n_out; o++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        int stage = o == 0 ? (c->act == ACT_NONE ? 1 : 2) : c->keep_sum ? 1 : 0;
        double r = ref_at(c, m, k, n, a, b, bias, i, j, stage), x = on[o][i * n + j],
               y = off[o][i * n + j];
        cr_assert(fabs(x - r) <= tol * (1 + fabs(r)),
                  "act %d out %d (%lld, %lld): fused %.9g, reference %.9g", c->act, o, (long long)i,
                  (long long)j, x, r);
        cr_assert(fabs(x - y) <= tol * (1 + fabs(y)),
                  "act %d out %d (%lld, %lld): fused %.9g, unfused %.9g", c->act, o, (long long)i,
                  (long long)j, x, y);
      }
  for (int o = 0; o < 2; o++)
    free(on[o]), free(off[o]);
  free(a), free(b), free(bias);
}

Test(gemm_epi, every_activation_matches_reference_and_unfused) {
  static const int64_t shapes[][3] = {
      {130, 97, 91}, {1, 1100, 1000}, {1024, 1, 1030}, {160, 64, 128}, {1100, 0, 1000}};
  uint64_t seed = 7;
  for (int act = 0; act < N_ACT; act++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      epi_case c = {.act = act, .bias_2d = s % 2 == 1};
      check_case(&c, shapes[s][0], shapes[s][1], shapes[s][2], seed++);
    }
}

Test(gemm_epi, transposed_operands_go_in_place) {
  uint64_t seed = 11;
  for (int t = 1; t < 4; t++) {
    epi_case c = {.act = ACT_GELU, .trans_a = t & 1, .trans_b = t & 2};
    check_case(&c, 110, 100, 97, seed++);
  }
}

Test(gemm_epi, held_sum_is_stored_and_activation_runs_after) {
  uint64_t seed = 13;
  for (int act = ACT_RELU; act < N_ACT; act++) {
    epi_case c = {.act = act, .keep_sum = true};
    check_case(&c, 128, 96, 100, seed++);
  }
}

Test(gemm_epi, held_product_is_not_fused) {
  uint64_t seed = 17;
  epi_case c = {.act = ACT_RELU, .keep_product = true};
  check_case(&c, 20, 12, 16, seed);
}

/* f64 products stay with OpenBLAS dgemm: no epilogue group. */
Test(gemm_epi, f64_is_not_fused) {
  uint64_t seed = 19;
  epi_case c = {.act = ACT_TANH};
  double *a = tc_rand_floats(12 * 8, NB_F64, &seed), *b = tc_rand_floats(8 * 5, NB_F64, &seed),
         *bias = tc_rand_floats(5, NB_F64, &seed), *res[2] = {0};
  cr_assert_eq(run_case(&c, 12, 8, 5, NB_F64, true, a, b, bias, res), 2); /* gemm + add-tanh */
  for (int64_t i = 0; i < 12; i++)
    for (int64_t j = 0; j < 5; j++) {
      double r = ref_at(&c, 12, 8, 5, a, b, bias, i, j, 2);
      cr_assert(fabs(res[0][i * 5 + j] - r) <= 1e-12 * (1 + fabs(r)));
    }
  free(res[0]), free(a), free(b), free(bias);
}

/* A training step of a 2-layer MLP under jit (value_and_grad): the forward's
 * linear layers run as epilogue groups with their pre-activations stored for
 * the backward (and the alias of a bias that the loss reads again stored);
 * loss and gradients match the unfused realization. */
static nb_status mlp_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_gelu(nb_add(nb_matmul(in[4], in[0]), in[1]));
  nb_tensor *y = nb_relu(nb_add(nb_matmul(h, in[2]), in[3]));
  /* + 0.5 sum(b1): the alias of b1 inside the first group is read outside it too */
  out[0] = nb_add(nb_mean(nb_square(y), NB_ALL, false),
                  nb_mul_scalar(nb_sum(in[1], NB_ALL, false), 0.5));
  return out[0] ? NB_OK : nb_last_status();
}

Test(gemm_epi, mlp_gradients_match_unfused) {
  uint64_t seed = 23;
  static const nb_shape shapes[5] = {
      {2, {96, 100}}, {1, {100}}, {2, {100, 90}}, {1, {90}}, {2, {128, 96}}};
  double *vals[5];
  for (int k = 0; k < 5; k++)
    vals[k] = tc_rand_floats(tc_numel(shapes[k]), NB_F32, &seed);
  double *res[2][5];
  uint64_t kernels[2];
  for (int fused = 0; fused < 2; fused++) {
    nbi_set_fusion(fused);
    nb_scope_begin();
    nb_tensor *in[5];
    for (int k = 0; k < 5; k++)
      in[k] = tc_tensor(vals[k], shapes[k], NB_F32);
    nb_fn *f = nb_fn_create(mlp_loss, NULL, 5, 1);
    nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1, 2, 3)), *j = nb_jit(vg);
    nb_tensor *out[5];
    cr_assert(nb_call(j, in, out) == NB_OK, "%s", nb_last_error()); /* traces */
    nb_reset_stats();
    cr_assert(nb_call(j, in, out) == NB_OK, "%s", nb_last_error());
    cr_assert(nb_eval(out, 5) == NB_OK, "%s", nb_last_error());
    kernels[fused] = nb_get_stats().kernels_run;
    for (int k = 0; k < 5; k++)
      res[fused][k] = tc_read(out[k]);
    nb_fn_release(j);
    nb_fn_release(vg);
    nb_fn_release(f);
    nb_scope_end();
  }
  nbi_set_fusion(true);
  cr_assert_lt(kernels[1], kernels[0]);
  static const int64_t numel[5] = {1, 96 * 100, 100, 100 * 90, 90};
  for (int k = 0; k < 5; k++) {
    for (int64_t i = 0; i < numel[k]; i++)
      cr_assert(fabs(res[1][k][i] - res[0][k][i]) <= 1e-5 * (1 + fabs(res[0][k][i])),
                "output %d element %lld: fused %.9g, unfused %.9g", k, (long long)i, res[1][k][i],
                res[0][k][i]);
    free(res[0][k]), free(res[1][k]);
  }
  for (int k = 0; k < 5; k++)
    free(vals[k]);
}

/* Batched f32 products of strided views (a permuted batch dim, a transposed
 * operand, a broadcast batch dim): the repeated call runs them as one oneDNN
 * matmul primitive (k_linalg.c), the first through per-item sgemm; both match
 * a double loop. */
Test(gemm_epi, batched_strided_products_match_loops) {
  enum { B0 = 2, B1 = 4, M = 64, K = 64, N = 64 };
  uint64_t seed = 29;
  double *av = tc_rand_floats(B0 * M * B1 * K, NB_F32, &seed); /* stored [B0, M, B1, K] */
  double *bv = tc_rand_floats(B1 * N * K, NB_F32, &seed);      /* stored [B1, N, K] */
  double *ref = malloc(sizeof(double) * B0 * B1 * M * N);
  double *ref0 = malloc(sizeof(double) * B1 * M * N);
  for (int i0 = 0; i0 < B0; i0++)
    for (int i1 = 0; i1 < B1; i1++)
      for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
          double s = 0;
          for (int p = 0; p < K; p++)
            s += av[((i0 * M + r) * B1 + i1) * K + p] * bv[(i1 * N + c) * K + p];
          ref[((i0 * B1 + i1) * M + r) * N + c] = s;
        }
  for (int rep = 0; rep < 3; rep++) {
    nb_scope_begin();
    nb_tensor *a = nb_permute(tc_tensor(av, NB_SHAPE(B0, M, B1, K), NB_F32), NB_AXES(0, 2, 1, 3));
    nb_tensor *b = nb_transpose(tc_tensor(bv, NB_SHAPE(B1, N, K), NB_F32)); /* [B1, K, N] */
    tc_assert_close(nb_matmul(a, b), ref, NB_SHAPE(B0, B1, M, N));
    /* a single left matrix broadcast over b's batch */
    nb_tensor *a0 = nb_reshape(tc_tensor(av, NB_SHAPE(M, K), NB_F32), NB_SHAPE(1, M, K));
    for (int i1 = 0; i1 < B1; i1++)
      for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
          double s = 0;
          for (int p = 0; p < K; p++)
            s += av[r * K + p] * bv[(i1 * N + c) * K + p];
          ref0[(i1 * M + r) * N + c] = s;
        }
    tc_assert_close(nb_matmul(a0, b), ref0, NB_SHAPE(B1, M, N));
    nb_scope_end();
  }
  free(av), free(bv), free(ref), free(ref0);
}

/* A one-row product whose [1, N] bias is an intermediate dying at the add
 * (exp(b), computed before the product): the add's output has the bias's
 * shape, but the primitive reads the bias while it writes its result, so the
 * group must not write over the bias's buffer. Three calls (the primitive is
 * made on the second). */
static nb_status bias_dies_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *e = nb_exp(in[2]);
  out[0] = nb_add(e, nb_matmul(in[0], in[1]));
  return out[0] ? NB_OK : nb_last_status();
}

Test(gemm_epi, dying_bias_of_one_row_is_not_overwritten) {
  uint64_t seed = 23;
  enum { K = 2048, N = 1024 };
  double *a = tc_rand_floats(K, NB_F32, &seed), *b = tc_rand_floats((int64_t)K * N, NB_F32, &seed),
         *bias = tc_rand_floats(N, NB_F32, &seed);
  nb_scope_begin();
  nb_tensor *in[3] = {tc_tensor(a, (nb_shape){2, {1, K}}, NB_F32),
                      tc_tensor(b, (nb_shape){2, {K, N}}, NB_F32),
                      tc_tensor(bias, (nb_shape){2, {1, N}}, NB_F32)};
  nb_fn *body = nb_fn_create(bias_dies_body, NULL, 3, 1), *f = nb_jit(body);
  cr_assert(f, "%s", nb_last_error());
  double ref[N];
  for (int64_t j = 0; j < N; j++) {
    ref[j] = exp((double)(float)bias[j]);
    for (int64_t k = 0; k < K; k++)
      ref[j] += a[k] * b[k * N + j];
  }
  for (int call = 0; call < 3; call++) {
    nb_tensor *y;
    cr_assert_eq(nb_call(f, in, &y), NB_OK, "%s", nb_last_error());
    tc_assert_close_tol(y, ref, (nb_shape){2, {1, N}}, 1e-5 * K / 100);
  }
  nb_fn_release(f);
  nb_fn_release(body);
  nb_scope_end();
  free(a), free(b), free(bias);
}
