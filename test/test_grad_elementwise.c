/* test/test_grad_elementwise.c — VJP and JVP rules of the elementwise ops
 * (src/ops/elementwise.c): every differentiable op against finite differences
 * at random points away from its kinks and poles, on several shapes (0-d and
 * broadcasting pairs for binary ops), with second derivatives for the smooth
 * ones; JAX's conventions at kinks and ties; dtypes of cotangents and tangents;
 * zero derivatives of the NONDIFF ops and of integer inputs. */
#include "grad_check.h"
#include "../src/core/oprules.h"

TestSuite(grad_elementwise, .init = tc_setup, .fini = tc_teardown);

typedef nb_tensor *(*unary_op)(nb_tensor *);
typedef nb_tensor *(*binary_op)(nb_tensor *, nb_tensor *);

typedef struct unary_case {
  const char *name;
  unary_op f;
  double lo, hi; /* inputs in [lo, hi), or +-[lo, hi) when signed */
  bool signed_;
  unsigned flags;
} unary_case;

typedef struct binary_case {
  const char *name;
  binary_op f;
  double alo, ahi, blo, bhi; /* as unary_case, per operand */
  bool asigned, bsigned;
  unsigned flags;
} binary_case;

/* out = f(in[0]) / f(in[0], in[1]), f passed through user */
static nb_status unary_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_in;
  (void)n_out;
  out[0] = ((const unary_case *)user)->f(in[0]);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status binary_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                             int n_out) {
  (void)n_in;
  (void)n_out;
  out[0] = ((const binary_case *)user)->f(in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}

/* An f64 tensor with values in [lo, hi), each negated with probability 1/2
 * when signed_ (two-sided inputs that keep |x| >= lo off a kink at 0). */
static nb_tensor *rand_input(nb_shape s, double lo, double hi, bool signed_, uint64_t *seed) {
  int64_t n = tc_numel(s);
  double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++) {
    x[i] = tc_uniform(seed, lo, hi);
    if (signed_ && tc_uniform(seed, 0, 1) < 0.5) x[i] = -x[i];
  }
  nb_tensor *t = tc_tensor(x, s, NB_F64);
  free(x);
  return t;
}

/* ---- unary ops ------------------------------------------------------------------- */
static const unary_case unary_cases[] = {
    {"neg", nb_neg, -2, 2, false, TC_SECOND},
    {"abs", nb_abs, 0.2, 2, true, TC_SECOND},
    {"exp", nb_exp, -2, 2, false, TC_SECOND},
    {"expm1", nb_expm1, -2, 2, false, TC_SECOND},
    {"log", nb_log, 0.5, 2, false, TC_SECOND},
    {"log1p", nb_log1p, -0.5, 2, false, TC_SECOND},
    {"sqrt", nb_sqrt, 0.5, 2, false, TC_SECOND},
    {"rsqrt", nb_rsqrt, 0.5, 2, false, TC_SECOND},
    {"square", nb_square, -2, 2, false, TC_SECOND},
    {"sin", nb_sin, -3, 3, false, TC_SECOND},
    {"cos", nb_cos, -3, 3, false, TC_SECOND},
    {"tan", nb_tan, -1.2, 1.2, false, TC_SECOND},
    {"tanh", nb_tanh, -2, 2, false, TC_SECOND},
    {"sigmoid", nb_sigmoid, -3, 3, false, TC_SECOND},
    {"relu", nb_relu, 0.2, 2, true, TC_SECOND},
    {"gelu", nb_gelu, -3, 3, false, TC_SECOND},
    {"silu", nb_silu, -3, 3, false, TC_SECOND},
    {"softplus", nb_softplus, -3, 3, false, TC_SECOND},
    {"erf", nb_erf, -2, 2, false, TC_SECOND},
    {"reciprocal", nb_reciprocal, 0.5, 2, true, TC_SECOND},
    /* piecewise constant (NONDIFF): zero derivative between the jumps */
    {"sign", nb_sign, 0.2, 2, true, 0},
    {"floor", nb_floor, 0.1, 0.9, true, 0},
    {"ceil", nb_ceil, 0.1, 0.9, true, 0},
    {"round", nb_round, 0.1, 0.4, true, 0},
};

Test(grad_elementwise, unary_ops_match_finite_differences_on_several_shapes) {
  const nb_shape shapes[] = {NB_SHAPE(2, 3), NB_SHAPE(5), NB_SCALAR_SHAPE};
  uint64_t seed = 7;
  for (size_t c = 0; c < sizeof unary_cases / sizeof *unary_cases; c++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      const unary_case *uc = &unary_cases[c];
      nb_scope_begin();
      nb_tensor *x = rand_input(shapes[s], uc->lo, uc->hi, uc->signed_, &seed);
      char what[64];
      snprintf(what, sizeof what, "%s on shape %zu", uc->name, s);
      tc_check_grad(what, unary_body, (void *)uc, 1, &x, uc->flags);
      nb_scope_end();
    }
}

/* ---- binary ops ------------------------------------------------------------------ */
static const binary_case binary_cases[] = {
    {"add", nb_add, -2, 2, -2, 2, false, false, TC_SECOND},
    {"sub", nb_sub, -2, 2, -2, 2, false, false, TC_SECOND},
    {"mul", nb_mul, -2, 2, -2, 2, false, false, TC_SECOND},
    {"div", nb_div, -2, 2, 0.5, 2, false, true, TC_SECOND},
    {"pow", nb_pow, 0.5, 2, -2, 2, false, false, TC_SECOND},
    {"maximum", nb_maximum, -2, 2, -2, 2, false, false, TC_SECOND},
    {"minimum", nb_minimum, -2, 2, -2, 2, false, false, TC_SECOND},
    {"atan2", nb_atan2, 0.2, 2, -2, 2, true, false, TC_SECOND},
    {"mod", nb_mod, -3, 3, 0.5, 2, false, true, TC_SECOND},
};

Test(grad_elementwise, binary_ops_match_finite_differences_with_broadcasting) {
  const nb_shape pairs[][2] = {
      {NB_SHAPE(2, 3), NB_SHAPE(2, 3)}, {NB_SHAPE(2, 3), NB_SHAPE(3)},
      {NB_SHAPE(2, 1), NB_SHAPE(1, 4)}, {NB_SCALAR_SHAPE, NB_SHAPE(3)},
      {NB_SHAPE(3), NB_SCALAR_SHAPE},   {NB_SCALAR_SHAPE, NB_SCALAR_SHAPE},
  };
  uint64_t seed = 11;
  for (size_t c = 0; c < sizeof binary_cases / sizeof *binary_cases; c++)
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
      const binary_case *bc = &binary_cases[c];
      nb_scope_begin();
      nb_tensor *xs[2] = {rand_input(pairs[p][0], bc->alo, bc->ahi, bc->asigned, &seed),
                          rand_input(pairs[p][1], bc->blo, bc->bhi, bc->bsigned, &seed)};
      char what[64];
      snprintf(what, sizeof what, "%s on shape pair %zu", bc->name, p);
      tc_check_grad(what, binary_body, (void *)bc, 2, xs, bc->flags);
      nb_scope_end();
    }
}

/* ---- where, cast ------------------------------------------------------------------- */
/* where(cond, a, b) with cond captured (a bool tensor carries no derivative) */
static nb_status where_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_in;
  (void)n_out;
  out[0] = nb_where((nb_tensor *)user, in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_elementwise, where_routes_each_element_to_its_branch) {
  const nb_shape sets[][3] = {/* cond, a, b */
                              {NB_SHAPE(2, 3), NB_SHAPE(2, 3), NB_SHAPE(2, 3)},
                              {NB_SHAPE(2, 3), NB_SHAPE(3), NB_SHAPE(2, 1)},
                              {NB_SHAPE(2, 1), NB_SCALAR_SHAPE, NB_SHAPE(1, 3)},
                              {NB_SCALAR_SHAPE, NB_SHAPE(4), NB_SCALAR_SHAPE}};
  uint64_t seed = 3;
  for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
    nb_scope_begin();
    int64_t n = tc_numel(sets[k][0]);
    double *c = tc_rand_ints(n, NB_BOOL, &seed, 1);
    nb_tensor *cond = tc_tensor(c, sets[k][0], NB_BOOL);
    free(c);
    nb_tensor *xs[2] = {tc_rand_f64(sets[k][1], -2, 2, &seed),
                        tc_rand_f64(sets[k][2], -2, 2, &seed)};
    char what[64];
    snprintf(what, sizeof what, "where on shape set %zu", k);
    tc_check_grad(what, where_body, cond, 2, xs, TC_SECOND);
    nb_scope_end();
  }
}

/* sin(x) * cast(x, f64): a cast node on the path (f64 -> f64 aliases) */
static nb_status cast_same_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)user;
  (void)n_in;
  (void)n_out;
  out[0] = nb_mul(nb_sin(in[0]), nb_cast(in[0], NB_F64));
  return out[0] ? NB_OK : nb_last_status();
}

/* x * cast(cast(x, i32), f64): the integer detour carries no derivative, so
 * the derivative is trunc(x) */
static nb_status cast_int_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)user;
  (void)n_in;
  (void)n_out;
  out[0] = nb_mul(in[0], nb_cast(nb_cast(in[0], NB_I32), NB_F64));
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_elementwise, cast_passes_float_derivatives_and_stops_at_integers) {
  uint64_t seed = 5;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 3), -2, 2, &seed);
  tc_check_grad("cast f64 -> f64", cast_same_body, NULL, 1, &x, TC_SECOND);
  nb_tensor *y = rand_input(NB_SHAPE(5), 1.1, 1.9, true, &seed);
  tc_check_grad("cast through i32", cast_int_body, NULL, 1, &y, TC_SECOND);
}

/* ---- dtypes ------------------------------------------------------------------------ */
/* sum(f(in[0], in[1])) */
static nb_status sum_binary_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                 int n_out) {
  (void)n_in;
  (void)n_out;
  out[0] = nb_sum(((const binary_case *)user)->f(in[0], in[1]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status sum_unary_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)n_in;
  (void)n_out;
  out[0] = nb_sum(((const unary_case *)user)->f(in[0]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* grad of sum(f(a, b)) at a, b (in their own dtypes) into g[0], g[1] */
static void grad2(binary_op f, nb_tensor *a, nb_tensor *b, nb_tensor **g) {
  binary_case bc = {.f = f};
  nb_fn *fn = nb_fn_create(sum_binary_body, &bc, 2, 1);
  nb_fn *gf = nb_grad(fn, NB_ALL);
  cr_assert(gf, "nb_grad: %s", nb_last_error());
  nb_tensor *in[2] = {a, b};
  cr_assert_eq(nb_call(gf, in, g), NB_OK, "grad: %s", nb_last_error());
  nb_fn_release(gf);
  nb_fn_release(fn);
}

Test(grad_elementwise, gradients_keep_each_inputs_dtype) {
  const double av[6] = {0.5, -1, 1.5, 2, -0.25, 0.75}, bv[3] = {1.5, -0.5, 2};
  /* f32 in -> f32 gradient: exp */
  unary_case uc = {.f = nb_exp};
  nb_fn *fn = nb_fn_create(sum_unary_body, &uc, 1, 1);
  nb_fn *gf = nb_grad(fn, NB_ALL);
  nb_tensor *x = tc_tensor(av, NB_SHAPE(2, 3), NB_F32), *gx[1];
  cr_assert_eq(nb_call(gf, &x, gx), NB_OK, "grad: %s", nb_last_error());
  cr_assert_eq(nb_dtype_of(gx[0]), NB_F32);
  double want[6];
  for (int i = 0; i < 6; i++)
    want[i] = exp((float)av[i]);
  tc_assert_close(gx[0], want, NB_SHAPE(2, 3));
  nb_fn_release(gf);
  nb_fn_release(fn);

  /* mul of an f32 [2,3] and an f64 [3]: d/da = b (f32), d/db = sum over rows of a (f64) */
  nb_tensor *g[2];
  grad2(nb_mul, tc_tensor(av, NB_SHAPE(2, 3), NB_F32), tc_tensor(bv, NB_SHAPE(3), NB_F64), g);
  cr_assert_eq(nb_dtype_of(g[0]), NB_F32);
  cr_assert_eq(nb_dtype_of(g[1]), NB_F64);
  double ga[6], gb[3];
  for (int i = 0; i < 6; i++)
    ga[i] = bv[i % 3];
  for (int j = 0; j < 3; j++)
    gb[j] = (double)(float)av[j] + (double)(float)av[3 + j];
  tc_assert_close(g[0], ga, NB_SHAPE(2, 3));
  tc_assert_close(g[1], gb, NB_SHAPE(3));

  /* f16 + f32 -> f32 result; the f16 operand's gradient is f16 ones */
  grad2(nb_add, tc_tensor(bv, NB_SHAPE(3), NB_F16), tc_tensor(av, NB_SHAPE(2, 3), NB_F32), g);
  cr_assert_eq(nb_dtype_of(g[0]), NB_F16);
  cr_assert_eq(nb_dtype_of(g[1]), NB_F32);
  const double twos[3] = {2, 2, 2}, ones[6] = {1, 1, 1, 1, 1, 1};
  tc_assert_close(g[0], twos, NB_SHAPE(3));
  tc_assert_close(g[1], ones, NB_SHAPE(2, 3));

  /* f32 atan2 with a bf16 operand */
  grad2(nb_atan2, tc_tensor(bv, NB_SHAPE(3), NB_F32), tc_tensor(av, NB_SHAPE(2, 3), NB_BF16), g);
  cr_assert_eq(nb_dtype_of(g[0]), NB_F32);
  cr_assert_eq(nb_dtype_of(g[1]), NB_BF16);
}

/* jvp of f(x) = f(in[0]) with the tangent in[1], returning the tangent */
static nb_tensor *jvp1(unary_op f, nb_tensor *x, nb_tensor *t) {
  unary_case uc = {.f = f};
  nb_fn *fn = nb_fn_create(unary_body, &uc, 1, 1);
  nb_fn *jf = nb_jvp_fn(fn);
  nb_tensor *in[2] = {x, t}, *out[2];
  cr_assert_eq(nb_call(jf, in, out), NB_OK, "jvp: %s", nb_last_error());
  nb_fn_release(jf);
  nb_fn_release(fn);
  return out[1];
}

Test(grad_elementwise, jvp_tangents_have_the_outputs_dtype) {
  const double xv[4] = {0.5, -1, 1.5, 2}, tv[4] = {1, 2, -1, 0.5};
  nb_tensor *t =
      jvp1(nb_tanh, tc_tensor(xv, NB_SHAPE(4), NB_F32), tc_tensor(tv, NB_SHAPE(4), NB_F32));
  cr_assert_eq(nb_dtype_of(t), NB_F32);
  double want[4];
  for (int i = 0; i < 4; i++) {
    double y = tanh((float)xv[i]);
    want[i] = tv[i] * (1 - y * y);
  }
  tc_assert_close(t, want, NB_SHAPE(4));
}

/* ---- JAX's conventions at kinks and ties ----------------------------------------------- */
static nb_tensor *grad1(unary_op f, nb_tensor *x) {
  unary_case uc = {.f = f};
  nb_fn *fn = nb_fn_create(sum_unary_body, &uc, 1, 1);
  nb_fn *gf = nb_grad(fn, NB_ALL);
  nb_tensor *g[1];
  cr_assert_eq(nb_call(gf, &x, g), NB_OK, "grad: %s", nb_last_error());
  nb_fn_release(gf);
  nb_fn_release(fn);
  return g[0];
}

Test(grad_elementwise, relu_and_abs_have_zero_derivative_at_zero) {
  const double xv[3] = {-1, 0, 2};
  const double relu_g[3] = {0, 0, 1}, abs_g[3] = {-1, 0, 1};
  tc_assert_close(grad1(nb_relu, tc_tensor(xv, NB_SHAPE(3), NB_F64)), relu_g, NB_SHAPE(3));
  tc_assert_close(grad1(nb_abs, tc_tensor(xv, NB_SHAPE(3), NB_F64)), abs_g, NB_SHAPE(3));
}

Test(grad_elementwise, gelu_derivative_is_exact_at_zero_and_in_both_tails) {
  /* Phi(x) + x phi(x): 1/2 at +-0, Phi and phi from erfc and exp in double */
  const double xv[8] = {0, -0.0, 1e-30, -1e-3, 0.75, -2.5, -9, 12};
  double want[8];
  for (int i = 0; i < 8; i++)
    want[i] = 0.5 * erfc(-xv[i] / sqrt(2.0)) + xv[i] * exp(-0.5 * xv[i] * xv[i]) / sqrt(2 * M_PI);
  for (int f32 = 0; f32 < 2; f32++) {
    nb_dtype dt = f32 ? NB_F32 : NB_F64;
    double *g = tc_read(grad1(nb_gelu, tc_tensor(xv, NB_SHAPE(8), dt)));
    cr_assert(g[0] == 0.5 && g[1] == 0.5, "%s: gelu'(+-0) = %g, %g", nb_dtype_name(dt), g[0], g[1]);
    for (int i = 2; i < 8; i++) /* relative: the tails are tiny (x = -9: 1e-17) */
      cr_assert(fabs(g[i] - want[i]) <= (f32 ? 4e-7 : 1e-15) * fabs(want[i]) + 1e-300,
                "%s: gelu'(%g) = %.17g, want %.17g", nb_dtype_name(dt), xv[i], g[i], want[i]);
    free(g);
  }
}

Test(grad_elementwise, maximum_and_minimum_split_ties_evenly) {
  const double av[4] = {1, 2, 3, -1}, bv[4] = {1, 0, 5, -1};
  nb_tensor *a = tc_tensor(av, NB_SHAPE(4), NB_F64), *b = tc_tensor(bv, NB_SHAPE(4), NB_F64), *g[2];
  grad2(nb_maximum, a, b, g);
  const double max_a[4] = {0.5, 1, 0, 0.5}, max_b[4] = {0.5, 0, 1, 0.5};
  tc_assert_close(g[0], max_a, NB_SHAPE(4));
  tc_assert_close(g[1], max_b, NB_SHAPE(4));
  grad2(nb_minimum, a, b, g);
  const double min_a[4] = {0.5, 0, 1, 0.5}, min_b[4] = {0.5, 1, 0, 0.5};
  tc_assert_close(g[0], min_a, NB_SHAPE(4));
  tc_assert_close(g[1], min_b, NB_SHAPE(4));
  /* clip(x, lo, hi) passes the derivative inside the range only */
  const double xv[4] = {-2, 0.5, 3, 1};
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(4), NB_F64);
  nb_tensor *lo = nb_scalar(0, NB_F64), *hi = nb_scalar(2, NB_F64);
  nb_tensor *c[2];
  grad2(nb_maximum, x, lo, c);
  const double clip_lo[4] = {0, 1, 1, 1};
  tc_assert_close(c[0], clip_lo, NB_SHAPE(4));
  const double lo_g = 1;
  tc_assert_close(c[1], &lo_g, NB_SCALAR_SHAPE);
  grad2(nb_minimum, x, hi, c);
  const double clip_hi[4] = {1, 1, 0, 1}, hi_g = 1;
  tc_assert_close(c[0], clip_hi, NB_SHAPE(4));
  tc_assert_close(c[1], &hi_g, NB_SCALAR_SHAPE);
}

Test(grad_elementwise, pow_at_zero_base_gives_finite_derivatives) {
  /* d/db of a^b at a == 0 is 0 (log(0) read as 0), d/da = b a^(b-1) */
  const double av[3] = {0, 0, 1.5}, bv[3] = {2.5, 1, 2};
  nb_tensor *g[2];
  grad2(nb_pow, tc_tensor(av, NB_SHAPE(3), NB_F64), tc_tensor(bv, NB_SHAPE(3), NB_F64), g);
  const double ga[3] = {0, 1, 3}, gb[3] = {0, 0, log(1.5) * 2.25};
  tc_assert_close(g[0], ga, NB_SHAPE(3));
  tc_assert_close(g[1], gb, NB_SHAPE(3));
}

/* pow(in[0], k) with an integer exponent k captured through user */
static nb_status pow_int_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                              int n_out) {
  (void)n_in;
  (void)n_out;
  out[0] = nb_sum(nb_pow(in[0], (nb_tensor *)user), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_elementwise, pow_with_an_integer_exponent_zero_has_zero_derivative) {
  const double xv[4] = {0, 1.5, -2, 0}, kv[4] = {0, 3, 2, 1};
  nb_tensor *k = tc_tensor(kv, NB_SHAPE(4), NB_I32), *x = tc_tensor(xv, NB_SHAPE(4), NB_F64), *g[1];
  nb_fn *fn = nb_fn_create(pow_int_body, k, 1, 1);
  nb_fn *gf = nb_grad(fn, NB_ALL);
  cr_assert_eq(nb_call(gf, &x, g), NB_OK, "grad: %s", nb_last_error());
  const double want[4] = {0, 3 * 2.25, -4, 1};
  tc_assert_close(g[0], want, NB_SHAPE(4));
  nb_fn_release(gf);
  nb_fn_release(fn);
}

/* ---- third derivatives ------------------------------------------------------------------ */
/* sum(f(in[0])) for f: exp*sin, x^2.5, tanh, sigmoid, 1/(1+exp(-x)) */
static nb_status third_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_in;
  (void)n_out;
  nb_tensor *x = in[0], *y = NULL;
  switch (*(const int *)user) {
  case 0: y = nb_mul(nb_exp(x), nb_sin(x)); break;
  case 1: y = nb_pow_scalar(x, 2.5); break;
  case 2: y = nb_tanh(x); break;
  case 3: y = nb_sigmoid(x); break;
  case 4: y = nb_rdiv_scalar(nb_add_scalar(nb_exp(nb_neg(x)), 1), 1); break; /* sigmoid */
  }
  out[0] = nb_sum(y, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* d3/dx3 of case c at x */
static double third_ref(int c, double x) {
  double t = tanh(x), s = 1 / (1 + exp(-x));
  switch (c) {
  case 0: return 2 * exp(x) * (cos(x) - sin(x));
  case 1: return 2.5 * 1.5 * 0.5 / sqrt(x);
  case 2: return -2 * (1 - t * t) * (1 - 3 * t * t);
  default: return s * (1 - s) * (1 - 6 * s + 6 * s * s);
  }
}

Test(grad_elementwise, rules_differentiate_three_times) {
  const double xv[3] = {0.7, 1.3, 0.4};
  for (int c = 0; c < 5; c++)
    for (int i = 0; i < 3; i++) {
      nb_fn *f = nb_fn_create(third_body, &c, 1, 1);
      nb_fn *h = nb_hessian(f, NB_ALL);
      nb_fn *t = nb_jacfwd(h, NB_ALL);
      cr_assert(t, "jacfwd(hessian): %s", nb_last_error());
      nb_tensor *x = nb_scalar(xv[i], NB_F64), *out[1];
      cr_assert_eq(nb_call(t, &x, out), NB_OK, "case %d: %s", c, nb_last_error());
      double want = third_ref(c, xv[i]);
      tc_assert_close(out[0], &want, NB_SCALAR_SHAPE);
      nb_fn_release(t);
      nb_fn_release(h);
      nb_fn_release(f);
    }
}

/* ---- integer inputs and NONDIFF ops --------------------------------------------------- */
/* x * exp(k): k is an i32 input (exp computes in f32); it gets no derivative */
static nb_status int_input_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)user;
  (void)n_in;
  (void)n_out;
  out[0] = nb_mul(in[0], nb_exp(in[1]));
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_elementwise, integer_inputs_get_zero_cotangents_and_no_tangent) {
  const double xv[3] = {0.5, -1, 2}, kv[3] = {0, 1, -2}, uv[3] = {1, 2, 3};
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(3), NB_F32), *k = tc_tensor(kv, NB_SHAPE(3), NB_I32);
  nb_fn *fn = nb_fn_create(int_input_body, NULL, 2, 1);
  nb_fn *vf = nb_vjp_fn(fn), *jf = nb_jvp_fn(fn);
  nb_tensor *vin[3] = {x, k, tc_tensor(uv, NB_SHAPE(3), NB_F32)}, *vout[3];
  cr_assert_eq(nb_call(vf, vin, vout), NB_OK, "vjp: %s", nb_last_error());
  double gx[3], tx[3];
  for (int i = 0; i < 3; i++)
    gx[i] = uv[i] * exp(kv[i]);
  tc_assert_close(vout[1], gx, NB_SHAPE(3));
  cr_assert_eq(nb_dtype_of(vout[2]), NB_I32);
  const double zeros[3] = {0, 0, 0};
  tc_assert_close(vout[2], zeros, NB_SHAPE(3));
  /* a tangent for k (here nonzero) is ignored */
  nb_tensor *jin[4] = {x, k, tc_tensor(uv, NB_SHAPE(3), NB_F32),
                       tc_tensor(uv, NB_SHAPE(3), NB_I32)};
  nb_tensor *jout[2];
  cr_assert_eq(nb_call(jf, jin, jout), NB_OK, "jvp: %s", nb_last_error());
  for (int i = 0; i < 3; i++)
    tx[i] = uv[i] * exp(kv[i]);
  tc_assert_close(jout[1], tx, NB_SHAPE(3));
  nb_fn_release(jf);
  nb_fn_release(vf);
  nb_fn_release(fn);
}

static const binary_op predicates[] = {nb_eq, nb_ne, nb_lt,          nb_le,
                                       nb_gt, nb_ge, nb_logical_and, nb_logical_or};

Test(grad_elementwise, comparisons_and_logical_ops_have_zero_tangents_and_cotangents) {
  const double av[3] = {0.5, -1, 2}, bv[3] = {0.5, 1, -3}, tv[3] = {1, -2, 3};
  nb_tensor *a = tc_tensor(av, NB_SHAPE(3), NB_F64), *b = tc_tensor(bv, NB_SHAPE(3), NB_F64);
  nb_tensor *t = tc_tensor(tv, NB_SHAPE(3), NB_F64);
  const double zeros[3] = {0, 0, 0};
  for (size_t p = 0; p < sizeof predicates / sizeof *predicates; p++) {
    binary_case bc = {.f = predicates[p]};
    nb_fn *fn = nb_fn_create(binary_body, &bc, 2, 1);
    nb_fn *jf = nb_jvp_fn(fn), *vf = nb_vjp_fn(fn);
    nb_tensor *jin[4] = {a, b, t, t}, *jout[2];
    cr_assert_eq(nb_call(jf, jin, jout), NB_OK, "jvp: %s", nb_last_error());
    cr_assert_eq(nb_dtype_of(jout[0]), NB_BOOL);
    tc_assert_close(jout[1], zeros, NB_SHAPE(3));
    nb_tensor *u = tc_tensor(tv, NB_SHAPE(3), NB_BOOL), *vin[3] = {a, b, u}, *vout[3];
    cr_assert_eq(nb_call(vf, vin, vout), NB_OK, "vjp: %s", nb_last_error());
    cr_assert_eq(nb_dtype_of(vout[1]), NB_F64);
    tc_assert_close(vout[1], zeros, NB_SHAPE(3));
    tc_assert_close(vout[2], zeros, NB_SHAPE(3));
    nb_fn_release(vf);
    nb_fn_release(jf);
    nb_fn_release(fn);
  }
  /* logical_not, and a float-valued piecewise-constant op */
  tc_assert_close(jvp1(nb_logical_not, a, t), zeros, NB_SHAPE(3));
  tc_assert_close(jvp1(nb_floor, a, t), zeros, NB_SHAPE(3));
  tc_assert_close(grad1(nb_round, a), zeros, NB_SHAPE(3));
}

/* ---- the records ---------------------------------------------------------------------- */
Test(grad_elementwise, every_op_has_both_rules_or_is_nondiff) {
  static const int ids[] = {
#define NB_OP(id, name, arity, traits) NBI_OP_##id,
#include "../src/ops/elementwise.def"
#undef NB_OP
  };
  int n_nondiff = 0;
  for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
    const nbi_op_def *d = nbi_op_table[ids[i]];
    bool nondiff = d->flags & NBI_OPF_NONDIFF;
    cr_assert((d->vjp && d->jvp) != nondiff, "%s: vjp %d, jvp %d, nondiff %d", d->name, !!d->vjp,
              !!d->jvp, nondiff);
    cr_assert(!nondiff || (!d->vjp && !d->jvp), "%s: NONDIFF with rules", d->name);
    n_nondiff += nondiff;
  }
  /* sign floor ceil round logical_not, 6 comparisons, logical_and/or */
  cr_assert_eq(n_nondiff, 13);
}
