/* test/test_grad_reduce.c — VJP and JVP rules of the reductions (sum mean prod
 * max min var std logsumexp), softmax, log_softmax and cumsum against central
 * finite differences (test/grad_check.h), second derivatives for all of them,
 * on axes NB_ALL / single / negative / several / none, with and without
 * keepdims, and on 0-d inputs. Exact checks for max/min ties and prod at
 * zeros, f32 gradients staying f32, integer inputs, and the op table. */
#include "grad_check.h"
#include "../src/core/oprules.h"

#include "../src/ops/rule_util.h"

TestSuite(grad_reduce, .init = tc_setup, .fini = tc_teardown);

typedef enum red_op {
  R_SUM,
  R_MEAN,
  R_PROD,
  R_MAX,
  R_MIN,
  R_VAR,
  R_STD,
  R_LOGSUMEXP,
  R_SOFTMAX,
  R_LOG_SOFTMAX,
  R_CUMSUM,
} red_op;

/* One call of a reduction: axes and keepdims, or for the ops along one axis
 * (softmax, log_softmax, cumsum) the axis axes.v[0]. */
typedef struct red_call {
  red_op op;
  nb_axes axes;
  bool keepdims;
} red_call;

static nb_tensor *apply(const red_call *c, nb_tensor *x) {
  switch (c->op) {
  case R_SUM: return nb_sum(x, c->axes, c->keepdims);
  case R_MEAN: return nb_mean(x, c->axes, c->keepdims);
  case R_PROD: return nb_prod(x, c->axes, c->keepdims);
  case R_MAX: return nb_max(x, c->axes, c->keepdims);
  case R_MIN: return nb_min(x, c->axes, c->keepdims);
  case R_VAR: return nb_var(x, c->axes, c->keepdims);
  case R_STD: return nb_std(x, c->axes, c->keepdims);
  case R_LOGSUMEXP: return nb_logsumexp(x, c->axes, c->keepdims);
  case R_SOFTMAX: return nb_softmax(x, c->axes.v[0]);
  case R_LOG_SOFTMAX: return nb_log_softmax(x, c->axes.v[0]);
  case R_CUMSUM: return nb_cumsum(x, c->axes.v[0]);
  }
  return NULL;
}

/* body: out[0] = op(in[0]) as described by the red_call in user */
static nb_status red_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in;
  (void)n_out;
  out[0] = apply(user, in[0]);
  return out[0] ? NB_OK : nb_last_status();
}

/* body: out[0] = sum(op(in[0])), a scalar for nb_grad */
static nb_status red_total_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)n_in;
  (void)n_out;
  out[0] = nb_sum(apply(user, in[0]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

typedef struct red_case {
  nb_shape shape;
  nb_axes axes;
  bool keepdims;
} red_case;

#define N_REDUCTION_CASES 12

/* Shapes and axes every reduction is checked on. Cases from `first_group_of_2`
 * on reduce groups of at least two elements (std is not differentiable on a
 * group of one, where it is sqrt(0)). */
static void reduction_cases(red_case *c, int *first_group_of_2) {
  red_case all[N_REDUCTION_CASES] = {
      {NB_SCALAR_SHAPE, NB_ALL, false},
      {NB_SCALAR_SHAPE, NB_ALL, true},
      {NB_SHAPE(3, 4), NB_NO_AXES, false},
      {NB_SHAPE(2, 1, 3), NB_AXES(1), false},
      {NB_SHAPE(5), NB_ALL, false},
      {NB_SHAPE(3, 4), NB_AXES(0), false},
      {NB_SHAPE(3, 4), NB_AXES(-1), true},
      {NB_SHAPE(3, 4), NB_ALL, true},
      {NB_SHAPE(2, 3, 4), NB_AXES(0, 2), false},
      {NB_SHAPE(2, 3, 4), NB_AXES(-1, 0), true},
      {NB_SHAPE(2, 3, 4), NB_AXES(-2), false},
      {NB_SHAPE(2, 3, 2, 2), NB_AXES(3, 1), false},
  };
  memcpy(c, all, sizeof all);
  *first_group_of_2 = 4;
}

/* Checks op on every reduction case at random points in [lo, hi); values
 * get a random sign when signed. */
static void check_reduction(red_op op, double lo, double hi, bool signed_values, unsigned flags) {
  red_case cs[N_REDUCTION_CASES];
  int first;
  reduction_cases(cs, &first);
  uint64_t seed = 1000 + (uint64_t)op;
  for (int i = op == R_STD ? first : 0; i < N_REDUCTION_CASES; i++) {
    nb_scope_begin();
    int64_t n = tc_numel(cs[i].shape);
    double *x = malloc((size_t)n * sizeof *x);
    tc_fill(x, n, lo, hi, &seed);
    for (int64_t j = 0; signed_values && j < n; j++)
      if (tc_uniform(&seed, 0, 1) < 0.5) x[j] = -x[j];
    nb_tensor *xt = tc_tensor(x, cs[i].shape, NB_F64);
    red_call c = {op, cs[i].axes, cs[i].keepdims};
    char what[64];
    snprintf(what, sizeof what, "op %d case %d", (int)op, i);
    tc_check_grad(what, red_body, &c, 1, &xt, flags);
    free(x);
    nb_scope_end();
  }
}

Test(grad_reduce, sum) { check_reduction(R_SUM, -2, 2, false, TC_SECOND); }
Test(grad_reduce, mean) { check_reduction(R_MEAN, -2, 2, false, TC_SECOND); }
Test(grad_reduce, var) { check_reduction(R_VAR, -2, 2, false, TC_SECOND); }
Test(grad_reduce, std) { check_reduction(R_STD, -2, 2, false, TC_SECOND); }
Test(grad_reduce, logsumexp) { check_reduction(R_LOGSUMEXP, -3, 3, false, TC_SECOND); }
Test(grad_reduce, prod) { check_reduction(R_PROD, 0.5, 1.5, true, TC_SECOND); }
/* Distinct random values: the extreme is unique, and its derivative (zero
 * second derivative) is checked to second order too. */
Test(grad_reduce, max_distinct_values) { check_reduction(R_MAX, -2, 2, false, TC_SECOND); }
Test(grad_reduce, min_distinct_values) { check_reduction(R_MIN, -2, 2, false, TC_SECOND); }

/* Checks an op along one axis on several shapes and axes. */
static void check_along_axis(red_op op) {
  const struct {
    nb_shape shape;
    int axis;
  } cs[] = {
      {NB_SHAPE(5), 0},       {NB_SHAPE(1), 0},        {NB_SHAPE(3, 4), 0},    {NB_SHAPE(3, 4), -1},
      {NB_SHAPE(2, 3, 4), 1}, {NB_SHAPE(2, 3, 4), -3}, {NB_SHAPE(2, 1, 3), 1},
  };
  uint64_t seed = 2000 + (uint64_t)op;
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    nb_scope_begin();
    nb_tensor *xt = tc_rand_f64(cs[i].shape, -2, 2, &seed);
    red_call c = {op, NB_AXES(cs[i].axis), false};
    char what[64];
    snprintf(what, sizeof what, "op %d case %zu", (int)op, i);
    tc_check_grad(what, red_body, &c, 1, &xt, TC_SECOND);
    nb_scope_end();
  }
}

Test(grad_reduce, softmax) { check_along_axis(R_SOFTMAX); }
Test(grad_reduce, log_softmax) { check_along_axis(R_LOG_SOFTMAX); }
Test(grad_reduce, cumsum) { check_along_axis(R_CUMSUM); }

/* prod is multilinear, so central differences are exact there and the check
 * holds at zeros: one zero in a group (its derivative is the product of the
 * others), two zeros (every first derivative is 0, but not every second). */
Test(grad_reduce, prod_at_zeros_to_second_order) {
  const double x[] = {2, 0, 3, -1.5, /**/ 0, 1.5, 0, 2, /**/ 0, 0, 0, 0.5};
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(3, 4), NB_F64);
  red_call rows = {R_PROD, NB_AXES(1), false}, all = {R_PROD, NB_ALL, false};
  red_call cols = {R_PROD, NB_AXES(0), true};
  tc_check_grad("prod at zeros, rows", red_body, &rows, 1, &xt, TC_SECOND);
  tc_check_grad("prod at zeros, all", red_body, &all, 1, &xt, TC_SECOND);
  tc_check_grad("prod at zeros, columns", red_body, &cols, 1, &xt, TC_SECOND);
}

/* Gradient of sum(op(x)) for x of shape s at the values x (f64). */
static double *grad_of_total(red_call *c, const double *x, nb_shape s) {
  nb_fn *f = nb_fn_create(red_total_body, c, 1, 1);
  nb_fn *g = nb_grad(f, NB_ALL);
  cr_assert(g, "nb_grad: %s", nb_last_error());
  nb_tensor *xt = tc_tensor(x, s, NB_F64), *out[1];
  cr_assert_eq(nb_call(g, &xt, out), NB_OK, "%s", nb_last_error());
  tc_assert_like("gradient", out[0], xt);
  double *r = tc_read(out[0]);
  nb_fn_release(g);
  nb_fn_release(f);
  return r;
}

Test(grad_reduce, prod_gradient_at_zeros_is_exact) {
  const double x[] = {2, 0, 3, 4, /**/ 2, 0, 3, 0, /**/ 1, 2, 3, 4};
  const double want[] = {0, 24, 0, 0, /**/ 0, 0, 0, 0, /**/ 24, 12, 8, 6};
  red_call c = {R_PROD, NB_AXES(-1), false};
  double *g = grad_of_total(&c, x, NB_SHAPE(3, 4));
  tc_assert_vec_close("prod gradient", "rows", g, want, 12, 0);
  free(g);
}

/* Hessian and third derivative of prod at a point with a zero: d2/dxi dxj is
 * the product of the third element (0 on the diagonal), d3/dx0 dx1 dx2 = 1. */
Test(grad_reduce, prod_higher_derivatives_at_a_zero) {
  const double x[] = {0, 3, 5};
  const double hess[] = {0, 5, 3, /**/ 5, 0, 0, /**/ 3, 0, 0};
  double third[27] = {0};
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++)
      for (int k = 0; k < 3; k++)
        if (i != j && j != k && i != k) third[(i * 3 + j) * 3 + k] = 1;
  red_call c = {R_PROD, NB_ALL, false};
  nb_fn *f = nb_fn_create(red_body, &c, 1, 1), *h = nb_hessian(f, NB_ALL);
  nb_fn *t = nb_jacfwd(h, NB_ALL);
  cr_assert(h && t, "%s", nb_last_error());
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(3), NB_F64), *out[1];
  cr_assert_eq(nb_call(h, &xt, out), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(out[0], hess, NB_SHAPE(3, 3), 0);
  cr_assert_eq(nb_call(t, &xt, out), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(out[0], third, NB_SHAPE(3, 3, 3), 0);
  nb_fn_release(t);
  nb_fn_release(h);
  nb_fn_release(f);
}

Test(grad_reduce, max_splits_gradient_equally_among_ties) {
  const double x[] = {1, 3, 3}, want[] = {0, 0.5, 0.5};
  red_call c = {R_MAX, NB_ALL, false};
  double *g = grad_of_total(&c, x, NB_SHAPE(3));
  tc_assert_vec_close("max ties", "gradient", g, want, 3, 0);
  free(g);
}

Test(grad_reduce, min_splits_gradient_equally_among_ties_per_group) {
  /* rows: one minimum; a tie of two; all three tied */
  const double x[] = {4, 1, 2, /**/ -1, 5, -1, /**/ 7, 7, 7};
  const double want[] = {0, 1, 0, /**/ 0.5, 0, 0.5, /**/ 1. / 3, 1. / 3, 1. / 3};
  red_call c = {R_MIN, NB_AXES(1), true};
  double *g = grad_of_total(&c, x, NB_SHAPE(3, 3));
  tc_assert_vec_close("min ties", "gradient", g, want, 9, 1e-15);
  free(g);
}

Test(grad_reduce, max_tangent_is_mean_of_tied_tangents) {
  /* columns: {1, 1} tied; {3, -2}; {3, 3} tied */
  const double x[] = {1, 3, 3, /**/ 1, -2, 3}, v[] = {10, 2, 4, /**/ 6, 1, 8};
  const double cols[] = {8, 2, 6};
  red_call c = {R_MAX, NB_AXES(0), false};
  nb_fn *f = nb_fn_create(red_body, &c, 1, 1), *jf = nb_jvp_fn(f);
  nb_tensor *in[2] = {tc_tensor(x, NB_SHAPE(2, 3), NB_F64), tc_tensor(v, NB_SHAPE(2, 3), NB_F64)};
  nb_tensor *out[2];
  cr_assert_eq(nb_call(jf, in, out), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(out[1], cols, NB_SHAPE(3), 0);
  nb_fn_release(jf);
  nb_fn_release(f);

  red_call all = {R_MAX, NB_ALL, false};
  const double ties[] = {1, 3, 3}, t[] = {10, 2, 4}, mean_of_tied = 3;
  f = nb_fn_create(red_body, &all, 1, 1);
  jf = nb_jvp_fn(f);
  in[0] = tc_tensor(ties, NB_SHAPE(3), NB_F64);
  in[1] = tc_tensor(t, NB_SHAPE(3), NB_F64);
  cr_assert_eq(nb_call(jf, in, out), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(out[1], &mean_of_tied, NB_SCALAR_SHAPE, 0);
  nb_fn_release(jf);
  nb_fn_release(f);
}

/* f32 inputs: the cotangent and the tangent stay f32 and agree with f64. */
Test(grad_reduce, f32_inputs_give_f32_derivatives) {
  const red_call calls[] = {
      {R_SUM, NB_AXES(1), false},     {R_MEAN, NB_ALL, true},          {R_PROD, NB_AXES(0), false},
      {R_MAX, NB_AXES(-1), false},    {R_MIN, NB_AXES(0), true},       {R_VAR, NB_AXES(1), false},
      {R_STD, NB_AXES(0, 1), false},  {R_LOGSUMEXP, NB_AXES(1), true}, {R_SOFTMAX, NB_AXES(1), 0},
      {R_LOG_SOFTMAX, NB_AXES(0), 0}, {R_CUMSUM, NB_AXES(1), 0},
  };
  uint64_t seed = 7;
  double x[12], v[12];
  tc_fill(x, 12, 0.5, 2, &seed);
  tc_fill(v, 12, -1, 1, &seed);
  tc_round_to(x, 12, NB_F32);
  tc_round_to(v, 12, NB_F32);
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    nb_scope_begin();
    red_call c = calls[i];
    nb_fn *f = nb_fn_create(red_body, &c, 1, 1), *vf = nb_vjp_fn(f), *jf = nb_jvp_fn(f);
    double *got[2][2]; /* [f32, f64][cotangent, tangent] */
    for (int k = 0; k < 2; k++) {
      nb_dtype dt = k ? NB_F64 : NB_F32;
      nb_tensor *xt = tc_tensor(x, NB_SHAPE(3, 4), dt), *y = apply(&c, xt);
      int64_t m = nb_numel(y);
      double *u = malloc((size_t)m * sizeof *u);
      for (int64_t j = 0; j < m; j++)
        u[j] = 0.25 * (double)(j % 5) - 0.5;
      nb_tensor *vin[2] = {xt, tc_tensor(u, nb_shape_of(y), dt)}, *vout[2];
      cr_assert_eq(nb_call(vf, vin, vout), NB_OK, "call %zu: %s", i, nb_last_error());
      tc_assert_like("f32 cotangent", vout[1], xt);
      nb_tensor *jin[2] = {xt, tc_tensor(v, NB_SHAPE(3, 4), dt)}, *jout[2];
      cr_assert_eq(nb_call(jf, jin, jout), NB_OK, "call %zu: %s", i, nb_last_error());
      tc_assert_like("f32 tangent", jout[1], y);
      got[k][0] = tc_read(vout[1]);
      got[k][1] = tc_read(jout[1]);
      free(u);
    }
    tc_assert_vec_close("f32 vs f64", "cotangent", got[0][0], got[1][0], 12, 1e-5);
    int64_t m = nb_numel(apply(&c, tc_tensor(x, NB_SHAPE(3, 4), NB_F64)));
    tc_assert_vec_close("f32 vs f64", "tangent", got[0][1], got[1][1], m, 1e-5);
    for (int k = 0; k < 2; k++)
      free(got[k][0]), free(got[k][1]);
    nb_fn_release(jf);
    nb_fn_release(vf);
    nb_fn_release(f);
    nb_scope_end();
  }
}

/* An integer input has no cotangent (need[0] false leaves it NULL) and a zero
 * tangent, for every differentiable reduction of an i32 tensor. */
Test(grad_reduce, integer_inputs_get_no_derivative) {
  const double x[] = {1, -2, 3, 4, 0, 2};
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(2, 3), NB_I32);
  for (red_op op = R_SUM; op <= R_CUMSUM; op++) {
    red_call c = {op, NB_AXES(1), false};
    nb_tensor *y = apply(&c, xt);
    cr_assert(y, "%s", nb_last_error());
    const nbi_op_def *def = nbi_op_table[y->op];
    nb_tensor *gin[1] = {NULL}, *gy = nbi_zeros_like(y);
    cr_assert_eq(def->vjp(y, gy, (bool[]){false}, gin), NB_OK);
    cr_assert_null(gin[0], "%s gave a cotangent for an integer input", def->name);
    nb_tensor *tin[1] = {nbi_zeros_like(xt)};
    cr_assert_null(def->jvp(y, tin), "%s gave a tangent for an integer input", def->name);
    cr_assert_eq(nb_last_status(), NB_OK);
  }
}

/* Through the transforms: the sum of an i32 input has a zero i32 cotangent. */
Test(grad_reduce, vjp_of_integer_sum_is_zero) {
  const double x[] = {1, -2, 3, 4};
  red_call c = {R_SUM, NB_ALL, false};
  nb_fn *f = nb_fn_create(red_body, &c, 1, 1), *vf = nb_vjp_fn(f);
  nb_tensor *in[2] = {tc_tensor(x, NB_SHAPE(4), NB_I32), nb_scalar(1, NB_I32)}, *out[2];
  cr_assert_eq(nb_call(vf, in, out), NB_OK, "%s", nb_last_error());
  tc_assert_like("integer cotangent", out[1], in[0]);
  const double zeros[4] = {0};
  tc_assert_close_tol(out[1], zeros, NB_SHAPE(4), 0);
  nb_fn_release(vf);
  nb_fn_release(f);
}

/* Every op of the reduce family has both rules or is marked NONDIFF (and then
 * has none); argmax, argmin, any, all are the NONDIFF ones. */
Test(grad_reduce, op_table_has_rules_for_every_reduce_op) {
  static const int ops[] = {
#define NB_OP(id, name, arity, traits) NBI_OP_##id,
#include "../src/ops/reduce.def"
#undef NB_OP
  };
  int nondiff = 0;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    const nbi_op_def *d = nbi_op_table[ops[i]];
    bool nd = d->flags & NBI_OPF_NONDIFF;
    cr_assert(nd ? !d->vjp && !d->jvp : d->vjp && d->jvp, "%s: vjp %p jvp %p flags %u", d->name,
              (void *)d->vjp, (void *)d->jvp, d->flags);
    nondiff += nd;
  }
  cr_assert_eq(nondiff, 4);
  const int nd_ops[] = {NBI_OP_ARGMAX, NBI_OP_ARGMIN, NBI_OP_REDUCE_ANY, NBI_OP_REDUCE_ALL};
  for (int i = 0; i < 4; i++)
    cr_assert(nbi_op_table[nd_ops[i]]->flags & NBI_OPF_NONDIFF, "%s",
              nbi_op_table[nd_ops[i]]->name);
}
