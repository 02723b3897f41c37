/* test/test_vmath.c — the vectorizable f32 math of src/backends/cpu/vmath.h
 * against libm in double (sampled ranges, every 4099th float, special values),
 * with denormals honoured; and the kernels that use it giving the same bits on
 * every instruction set the CPU supports (NABLA_ISA paths, nbi_isa_select). */
#include "common.h"

#include <float.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "../src/backends/cpu/vmath.h"

TestSuite(vmath, .init = tc_setup, .fini = tc_teardown);

/* ---- references and error measure ------------------------------------------------ */
typedef struct vm_case {
  const char *name;
  float (*f)(float);
  double (*ref)(double);
  double max_ulp; /* bound where the result is a normal float */
} vm_case;

static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double ref_silu(double x) { return x / (1 + exp(-x)); }
static double ref_softplus(double x) { return (x > 0 ? x : 0) + log1p(exp(-fabs(x))); }
static double ref_gelu(double x) { return 0.5 * x * erfc(-x * M_SQRT1_2); }
static float f_exp(float x) { return vm_expf(x); }
static float f_expm1(float x) { return vm_expm1f(x); }
static float f_log(float x) { return vm_logf(x); }
static float f_log1p(float x) { return vm_log1pf(x); }
static float f_tanh(float x) { return vm_tanhf(x); }
static float f_sigmoid(float x) { return vm_sigmoidf(x); }
static float f_silu(float x) { return vm_siluf(x); }
static float f_softplus(float x) { return vm_softplusf(x); }
static float f_erf(float x) { return vm_erff(x); }
static float f_gelu(float x) { return vm_geluf(x); }

static const vm_case cases[] = {
    {"exp", f_exp, exp, 2},        {"expm1", f_expm1, expm1, 2},
    {"log", f_log, log, 2},        {"log1p", f_log1p, log1p, 2},
    {"tanh", f_tanh, tanh, 2},     {"sigmoid", f_sigmoid, ref_sigmoid, 1},
    {"silu", f_silu, ref_silu, 1}, {"softplus", f_softplus, ref_softplus, 2},
    {"erf", f_erf, erf, 1},        {"gelu", f_gelu, ref_gelu, 1},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

/* Error of got against the exact value ref, in units of the float spacing at
 * ref: 0 for matching NaN / inf / signed zero, INFINITY for a wrong special.
 * Results in the denormal range (which the kernels flush) only need to be
 * within FLT_MIN of ref: returned as 0 when so. */
static double ulp_error(float got, double ref) {
  if (isnan(ref)) return isnan(got) ? 0 : INFINITY;
  if (isnan(got)) return INFINITY;
  if (ref == 0 || isinf(ref))
    return (double)got == ref && !signbit(got) == !signbit(ref) ? 0 : INFINITY;
  if (fabs(ref) > FLT_MAX) /* at the overflow edge: inf or FLT_MAX */
    return (isinf(got) || fabs(got) == FLT_MAX) && !signbit(got) == !signbit(ref) ? 0 : INFINITY;
  if (isinf(got)) return fabs(ref) >= FLT_MAX * (1 - 0x1p-22) ? 2 : INFINITY;
  if (fabs(ref) < FLT_MIN) return fabs((double)got - ref) <= FLT_MIN ? 0 : INFINITY;
  int e;
  frexp(ref, &e); /* |ref| in [2^(e-1), 2^e) */
  return fabs((double)got - ref) / ldexp(1, e - 24);
}

/* Runs with FTZ/DAZ off (the library sets them in the calling thread). */
static unsigned save_csr(void) {
#if defined(__x86_64__)
  unsigned csr = _mm_getcsr();
  _mm_setcsr(csr & ~0x8040u);
  return csr;
#else
  return 0;
#endif
}
static void restore_csr(unsigned csr) {
#if defined(__x86_64__)
  _mm_setcsr(csr);
#else
  (void)csr;
#endif
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Worst error of case c over x[0..n); reports the worst input. */
static void check_inputs(const vm_case *c, const float *x, int64_t n, const char *what) {
  double worst = 0;
  float at = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = ulp_error(c->f(x[i]), c->ref((double)x[i]));
    if (e > worst || e != e) worst = e, at = x[i];
  }
  cr_expect(worst <= c->max_ulp, "%s over %s: %.3g ulp at x = %a (got %a, libm %a)", c->name, what,
            worst, (double)at, (double)c->f(at), c->ref(at));
}

/* ---- accuracy ---------------------------------------------------------------------- */
Test(vmath, every_4099th_float) {
  unsigned csr = save_csr();
  enum { STEP = 4099 };
  int64_t n = 2 * (0x7f800000 / STEP + 1);
  float *x = malloc((size_t)n * sizeof *x);
  int64_t m = 0;
  for (uint32_t u = 0; u < 0x7f800000u; u += STEP) { /* zero, denormals, normals, both signs */
    x[m++] = from_bits(u);
    x[m++] = from_bits(u | 0x80000000u);
  }
  for (int k = 0; k < N_CASES; k++)
    check_inputs(&cases[k], x, m, "every 4099th float");
  free(x);
  restore_csr(csr);
}

Test(vmath, dense_ranges) {
  unsigned csr = save_csr();
  /* uniform samples where the functions change shape: reduction and branch
   * boundaries, the overflow and underflow edges */
  static const float ranges[][2] = {{-1, 1},        {-4, 4},       {-20, 20},       {-0.8f, 0.8f},
                                    {86, 90},       {-106, -85},   {-1e-3f, 1e-3f}, {0.5f, 2},
                                    {0.99f, 1.01f}, {-0.4f, 0.4f}, {-12, -8},       {8, 12},
                                    {-110, 110}};
  enum { PER = 200000 };
  float *x = malloc(PER * sizeof *x);
  uint64_t seed = 7;
  for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
    for (int i = 0; i < PER; i++)
      x[i] = (float)tc_uniform(&seed, ranges[r][0], ranges[r][1]);
    char what[64];
    snprintf(what, sizeof what, "[%g, %g]", (double)ranges[r][0], (double)ranges[r][1]);
    for (int k = 0; k < N_CASES; k++)
      check_inputs(&cases[k], x, PER, what);
  }
  free(x);
  restore_csr(csr);
}

Test(vmath, special_values) {
  unsigned csr = save_csr();
  const float sp[] = {0.0f,     -0.0f,    INFINITY,  -INFINITY,      NAN,         -NAN,
                      FLT_MIN,  -FLT_MIN, 0x1p-149f, -0x1p-149f,     0x1.8p-140f, FLT_MAX,
                      -FLT_MAX, 1.0f,     -1.0f,     88.72283f,      88.72284f,   -87.33654f,
                      -103.97f, -103.98f, -104.5f,   0x1.fffffep-2f, 0.75f,       -0.75f,
                      10.0f,    -10.0f,   10.06f,    -13.2f,         -15.0f,      2.0f,
                      -2.0f,    0x1p-30f, -0x1p-30f, 0x1p24f,        -0.999999f,  1e30f};
  for (int k = 0; k < N_CASES; k++)
    check_inputs(&cases[k], sp, sizeof sp / sizeof sp[0], "special values");
  /* the exact values the C library guarantees */
  cr_expect(vm_expf(0) == 1 && vm_expf(-INFINITY) == 0 && vm_expf(INFINITY) == INFINITY);
  cr_expect(vm_logf(1) == 0 && vm_logf(-0.0f) == -INFINITY && isnan(vm_logf(-1)));
  cr_expect(signbit(vm_tanhf(-0.0f)) && vm_tanhf(-INFINITY) == -1 && vm_tanhf(INFINITY) == 1);
  cr_expect(signbit(vm_expm1f(-0.0f)) && vm_expm1f(-INFINITY) == -1);
  cr_expect(signbit(vm_log1pf(-0.0f)) && vm_log1pf(-1) == -INFINITY && isnan(vm_log1pf(-2)));
  cr_expect(vm_erff(INFINITY) == 1 && vm_erff(-INFINITY) == -1 && signbit(vm_erff(-0.0f)));
  cr_expect(vm_sigmoidf(INFINITY) == 1 && vm_sigmoidf(-INFINITY) == 0);
  cr_expect(vm_softplusf(INFINITY) == INFINITY && vm_softplusf(-INFINITY) == 0);
  cr_expect(vm_geluf(INFINITY) == INFINITY && isnan(vm_geluf(-INFINITY)));
  restore_csr(csr);
}

/* vm_expf_nonpos (softmax's exp, x <= 0 only) within 2 ulp of libm on [-87.33,
 * 0] and +0 below, over every 31st non-positive float and every float near -0
 * and -87.33; NaN for NaN (0 for vm_expf_nonpos_nan0). */
Test(vmath, expf_nonpos) {
  unsigned csr = save_csr();
  double worst = 0;
  float at = 0;
  uint32_t edge = vm_bits(-87.33f);
  for (uint64_t u = 0x80000000u; u <= 0xff800000u; u++) { /* -0 down to -inf */
    float x = from_bits((uint32_t)u);
    float got = vm_expf_nonpos(x);
    double e = x < -87.33f ? (vm_bits(got) == 0 ? 0 : INFINITY) : ulp_error(got, exp((double)x));
    if (e > worst || e != e) worst = e, at = x;
    bool dense = u - 0x80000000u < 65536 || (u + 65536 > edge && u < edge + 65536);
    if (!dense) u += 30;
  }
  cr_expect(worst <= 2, "vm_expf_nonpos: %.3g ulp at x = %a (got %a, libm %a)", worst, (double)at,
            (double)vm_expf_nonpos(at), exp((double)at));
  cr_expect(vm_bits(vm_expf_nonpos(-87.34f)) == 0 && vm_bits(vm_expf_nonpos(-INFINITY)) == 0);
  cr_expect(vm_expf_nonpos(0.0f) == 1 && vm_expf_nonpos(-0.0f) == 1);
  cr_expect(isnan(vm_expf_nonpos(NAN)) && isnan(vm_expf_nonpos(-NAN)) &&
            isnan(vm_expf_nonpos(from_bits(0x7f800001u))));
  cr_expect(vm_expf_nonpos_nan0(NAN) == 0 && vm_expf_nonpos_nan0(-1.0f) == vm_expf_nonpos(-1.0f));
  restore_csr(csr);
}

/* ---- the kernels on every ISA ------------------------------------------------------- */
/* Inputs for the kernels: specials, every range above, and values on either
 * side of each function's switch points; n not a multiple of any vector width. */
static float *kernel_inputs(int64_t n) {
  float *x = malloc((size_t)n * sizeof *x);
  const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.72283f, 88.8f, -104.5f, 0.75f};
  uint64_t seed = 11;
  for (int64_t i = 0; i < n; i++) {
    double r = tc_uniform(&seed, 0, 1);
    x[i] = i < 9     ? sp[i]
           : r < 0.5 ? (float)tc_uniform(&seed, -6, 6)
           : r < 0.8 ? (float)tc_uniform(&seed, -100, 100)
                     : (float)tc_uniform(&seed, -1, 1);
  }
  return x;
}

typedef nb_tensor *(*unary_op)(nb_tensor *);
static nb_tensor *op_softmax_rows(nb_tensor *t) { return nb_softmax(t, -1); }
static nb_tensor *op_softmax_cols(nb_tensor *t) { return nb_softmax(t, 0); }
static nb_tensor *op_log_softmax_rows(nb_tensor *t) { return nb_log_softmax(t, -1); }
static nb_tensor *op_log_softmax_cols(nb_tensor *t) { return nb_log_softmax(t, 0); }
static nb_tensor *op_logsumexp(nb_tensor *t) { return nb_logsumexp(t, NB_AXES(1), false); }
static nb_tensor *op_add_mul(nb_tensor *t) { return nb_mul(nb_add(t, t), nb_sqrt(nb_abs(t))); }

/* Runs op on x ([rows, cols] f32) once per ISA and checks every ISA gives
 * the portable path's bits. */
static void check_isas(const char *name, unary_op op, const float *x, int64_t rows, int64_t cols) {
  nb_shape s = {.ndim = 2, .dims = {rows, cols}};
  float *first = NULL;
  int64_t n = 0;
  nbi_isa best = nbi_isa_best();
  for (int isa = NBI_ISA_PORTABLE; isa <= (int)best; isa++) {
    cr_assert_eq(nbi_isa_select((nbi_isa)isa), (nbi_isa)isa);
    nb_tensor *t = nb_from_data(x, s, NB_F32);
    nb_tensor *y = op(t);
    cr_assert(y, "%s: %s", name, nb_last_error());
    n = nb_numel(y);
    float *got = malloc((size_t)n * sizeof *got);
    cr_assert_eq(nb_to_host(y, got, (size_t)n * sizeof *got), NB_OK, "%s", nb_last_error());
    if (!first) {
      first = got;
      continue;
    }
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
      if (memcmp(&got[i], &first[i], 4) != 0 && !(isnan(got[i]) && isnan(first[i]))) bad = i;
    cr_expect(bad < 0, "%s: %s differs from portable at %lld: %a vs %a", name,
              nbi_isa_name((nbi_isa)isa), (long long)bad, bad < 0 ? 0.0 : (double)got[bad],
              bad < 0 ? 0.0 : (double)first[bad]);
    free(got);
  }
  free(first);
  nbi_isa_select(NBI_ISA_COUNT);
}

Test(vmath, kernels_agree_on_every_isa) {
  int64_t rows = 37, cols = 1029, n = rows * cols;
  float *x = kernel_inputs(n);
  const struct {
    const char *name;
    unary_op op;
  } ops[] = {{"exp", nb_exp},
             {"expm1", nb_expm1},
             {"log", nb_log},
             {"log1p", nb_log1p},
             {"tanh", nb_tanh},
             {"sigmoid", nb_sigmoid},
             {"silu", nb_silu},
             {"softplus", nb_softplus},
             {"erf", nb_erf},
             {"gelu", nb_gelu},
             {"add_mul_sqrt", op_add_mul},
             {"softmax rows", op_softmax_rows},
             {"softmax cols", op_softmax_cols},
             {"log_softmax rows", op_log_softmax_rows},
             {"log_softmax cols", op_log_softmax_cols},
             {"logsumexp", op_logsumexp}};
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    bool row_op = k >= 11; /* softmax family: finite inputs */
    if (row_op)
      for (int64_t i = 0; i < n; i++)
        x[i] = isfinite(x[i]) ? x[i] : 1.5f;
    check_isas(ops[k].name, ops[k].op, x, rows, cols);
  }
  free(x);
}

/* The kernels compute what vmath.h computes (DAZ aside: normal inputs only). */
Test(vmath, kernels_use_vmath) {
  int64_t n = 4099;
  float *x = kernel_inputs(n);
  nb_tensor *t = nb_from_data(x, (nb_shape){.ndim = 1, .dims = {n}}, NB_F32);
  float *y = malloc((size_t)n * sizeof *y);
  cr_assert_eq(nb_to_host(nb_gelu(nb_tanh(t)), y, (size_t)n * sizeof *y), NB_OK);
  for (int64_t i = 0; i < n; i++) {
    float want = vm_geluf(vm_tanhf(x[i]));
    cr_assert(memcmp(&y[i], &want, 4) == 0 || (isnan(want) && isnan(y[i])),
              "gelu(tanh(%a)): %a, vmath %a", (double)x[i], (double)y[i], (double)want);
  }
  free(y);
  free(x);
}

/* Softmax in f32: within 8 ulp of the double softmax of the same shifted
 * inputs x - max (rounded to f32 by any f32 softmax: that alone moves a result
 * by up to |x - max| 2^-24 relative) (exp within 2 ulp, the 16-lane blocked sum
 * within 20 units of 2^-24 in the worst case, far less in practice, the scale
 * within 1). */
Test(vmath, softmax_accuracy) {
  int64_t rows = 64, cols = 1000;
  uint64_t seed = 3;
  double *xd = malloc((size_t)(rows * cols) * sizeof *xd);
  tc_fill(xd, rows * cols, -20, 20, &seed);
  tc_round_to(xd, rows * cols, NB_F32);
  nb_shape s = {.ndim = 2, .dims = {rows, cols}};
  double *y = tc_read(nb_softmax(tc_tensor(xd, s, NB_F32), -1));
  double worst = 0;
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = xd + r * cols;
    double m = xr[0], sum = 0;
    for (int64_t j = 0; j < cols; j++)
      m = xr[j] > m ? xr[j] : m;
    for (int64_t j = 0; j < cols; j++)
      sum += exp((float)(xr[j] - m));
    for (int64_t j = 0; j < cols; j++) {
      double ref = exp((float)(xr[j] - m)) / sum;
      if (ref < FLT_MIN) continue;
      int e;
      frexp(ref, &e);
      double err = fabs(y[r * cols + j] - ref) / ldexp(1, e - 24);
      worst = err > worst ? err : worst;
    }
  }
  cr_expect(worst <= 8, "softmax f32: %.3g ulp", worst);
  free(y);
  free(xd);
}

#if defined(__x86_64__) && defined(_OPENMP)
/* Threads of the calling thread's OpenMP team lacking FTZ and DAZ after a
 * realization. */
static int workers_without_ftz(void) {
  nb_tensor *y = nb_exp(nb_from_data((float[]){1, 2}, (nb_shape){.ndim = 1, .dims = {2}}, NB_F32));
  cr_assert_eq(nb_eval(&y, 1), NB_OK, "%s", nb_last_error());
  int missing = 0;
#pragma omp parallel reduction(+ : missing)
  missing += (_mm_getcsr() & 0x8040u) != 0x8040u;
  return missing;
}

/* FTZ/DAZ reach every worker, also after the team grows (libgomp then starts
 * fresh threads) and in the calling thread after something cleared them. */
Test(vmath, ftz_daz_in_every_thread) {
  omp_set_num_threads(3);
  cr_expect_eq(workers_without_ftz(), 0);
  omp_set_num_threads(1);
  cr_expect_eq(workers_without_ftz(), 0);
  omp_set_num_threads(5);
  cr_expect_eq(workers_without_ftz(), 0);
  _mm_setcsr(_mm_getcsr() & ~0x8040u);
  cr_expect_eq(workers_without_ftz(), 0);
}
#endif
