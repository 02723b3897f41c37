/* test/test_elementwise.c — elementwise unary and binary ops, scalar forms,
 * where, clip, cast: every op and dtype against float64 references written
 * here (libm), broadcasting, strided views, special values, dtype rules, errors,
 * laziness and the plan cache. */
#include "common.h"

#include "../src/backends/cpu/cpu.h" /* NBI_PAR_MIN */

TestSuite(elementwise, .init = tc_setup, .fini = tc_teardown);

#define N_DT NB_DTYPE_COUNT

/* ---- helpers ---------------------------------------------------------------------- */
/* Index into an operand of shape in for element i of the broadcast shape out. */
static int64_t bcast_index(nb_shape out, nb_shape in, int64_t i) {
  int64_t idx = 0, stride = 1;
  for (int d = out.ndim - 1; d >= 0; d--) {
    int64_t c = i % out.dims[d];
    i /= out.dims[d];
    int di = d - (out.ndim - in.ndim);
    if (di >= 0) {
      if (in.dims[di] != 1) idx += c * stride;
      stride *= in.dims[di];
    }
  }
  return idx;
}

static nb_shape bcast_shape(nb_shape a, nb_shape b) {
  nb_shape r = {.ndim = a.ndim > b.ndim ? a.ndim : b.ndim};
  for (int d = 0; d < r.ndim; d++) {
    int ia = d - (r.ndim - a.ndim), ib = d - (r.ndim - b.ndim);
    int64_t da = ia >= 0 ? a.dims[ia] : 1, db = ib >= 0 ? b.dims[ib] : 1;
    r.dims[d] = da == 1 ? db : da;
  }
  return r;
}

/* Input domain: float dtypes draw from [lo, hi] (snapped to multiples of step
 * when step > 0, pushed away from 0 by 0.5 when nonzero), integer dtypes draw
 * integers from [ilo, ihi] (skipping 0 when nonzero), bool draws 0/1. */
typedef struct domain {
  double lo, hi, step;
  int ilo, ihi;
  bool nonzero;
} domain;

static void gen(double *x, int64_t n, nb_dtype dt, domain d, uint64_t *seed) {
  for (int64_t i = 0; i < n; i++) {
    double v;
    if (dt == NB_BOOL) {
      v = tc_uniform(seed, 0, 1) < 0.5;
    } else if (nbi_dtype_is_int(dt)) {
      v = floor(tc_uniform(seed, d.ilo, d.ihi + 1));
      if (d.nonzero && v == 0) v = d.ihi;
    } else {
      v = tc_uniform(seed, d.lo, d.hi);
      if (d.step > 0) v = d.step * round(v / d.step);
      if (d.nonzero && fabs(v) < 0.5) v += v < 0 ? -0.5 : 0.5;
    }
    x[i] = v;
  }
  tc_round_to(x, n, dt);
}

/* A realized tensor of dtype dt whose elements are x viewed with the given
 * shape, element strides and offset into a base buffer of base_n elements. */
static nb_tensor *strided(const double *x, int64_t base_n, nb_dtype dt, nb_shape s,
                          const int64_t *strides, int64_t offset) {
  nb_tensor *t = tc_tensor(x, NB_SHAPE(base_n), dt);
  t->shape = s;
  memset(t->shard0.strides, 0, sizeof t->shard0.strides);
  for (int d = 0; d < s.ndim; d++)
    t->shard0.strides[d] = strides[d];
  t->shard0.offset = offset;
  return t;
}

static const nb_shape unary_shapes[] = {
    {3, {2, 3, 4}}, {0, {0}}, {2, {0, 3}}, {3, {1, 5, 1}}, {1, {1}}, {2, {3, 700}},
};
#define N_UNARY_SHAPES (int)(sizeof unary_shapes / sizeof unary_shapes[0])

static const nb_shape binary_shapes[][2] = {
    {{3, {3, 1, 4}}, {2, {5, 1}}},
    {{2, {2, 3}}, {0, {0}}},
    {{2, {0, 3}}, {2, {1, 3}}},
    {{1, {1}}, {2, {4, 1}}},
    {{0, {0}}, {0, {0}}},
    {{2, {6, 7}}, {2, {6, 7}}},
    {{4, {2, 1, 3, 1}}, {4, {1, 4, 1, 5}}},
    {{1, {600}}, {2, {2, 1}}},
};
#define N_BINARY_SHAPES (int)(sizeof binary_shapes / sizeof binary_shapes[0])

/* ---- unary references ------------------------------------------------------------- */
static double r_neg(double x) { return -x; }
static double r_sign(double x) { return x > 0 ? 1 : x < 0 ? -1 : 0; }
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_square(double x) { return x * x; }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_relu(double x) { return x > 0 ? x : 0; }
static double r_gelu(double x) { return x * 0.5 * (1 + erf(x / sqrt(2.0))); }
static double r_silu(double x) { return x / (1 + exp(-x)); }
static double r_softplus(double x) { return log(1 + exp(x)); }
static double r_round(double x) { /* half to even, by hand */
  double f = floor(x), d = x - f;
  if (d > 0.5 || (d == 0.5 && fmod(f, 2) != 0)) return f + 1;
  return f;
}
static double r_reciprocal(double x) { return 1 / x; }
static double r_not(double x) { return x == 0; }

typedef enum kind { KEEPS_INT, FLOAT_ONLY, TO_BOOL } kind;

typedef struct unary_case {
  const char *name;
  nb_tensor *(*fn)(nb_tensor *);
  double (*ref)(double);
  domain dom;
  kind kind;
} unary_case;

#define ANY ((domain){-3, 3, 0, -9, 9, false})
#define POS ((domain){0.1, 4, 0, 1, 9, false})
#define SMALL ((domain){-1.2, 1.2, 0, -1, 1, false})

static const unary_case unary_cases[] = {
    {"neg", nb_neg, r_neg, ANY, KEEPS_INT},
    {"abs", nb_abs, fabs, ANY, KEEPS_INT},
    {"sign", nb_sign, r_sign, ANY, KEEPS_INT},
    {"exp", nb_exp, exp, ANY, FLOAT_ONLY},
    {"expm1", nb_expm1, expm1, ANY, FLOAT_ONLY},
    {"log", nb_log, log, POS, FLOAT_ONLY},
    {"log1p", nb_log1p, log1p, POS, FLOAT_ONLY},
    {"sqrt", nb_sqrt, sqrt, POS, FLOAT_ONLY},
    {"rsqrt", nb_rsqrt, r_rsqrt, POS, FLOAT_ONLY},
    {"square", nb_square, r_square, ANY, KEEPS_INT},
    {"sin", nb_sin, sin, ANY, FLOAT_ONLY},
    {"cos", nb_cos, cos, ANY, FLOAT_ONLY},
    {"tan", nb_tan, tan, SMALL, FLOAT_ONLY},
    {"tanh", nb_tanh, tanh, ANY, FLOAT_ONLY},
    {"sigmoid", nb_sigmoid, r_sigmoid, ANY, FLOAT_ONLY},
    {"relu", nb_relu, r_relu, ANY, KEEPS_INT},
    {"gelu", nb_gelu, r_gelu, ANY, FLOAT_ONLY},
    {"silu", nb_silu, r_silu, ANY, FLOAT_ONLY},
    {"softplus", nb_softplus, r_softplus, ANY, FLOAT_ONLY},
    {"erf", nb_erf, erf, ANY, FLOAT_ONLY},
    {"floor", nb_floor, floor, ANY, KEEPS_INT},
    {"ceil", nb_ceil, ceil, ANY, KEEPS_INT},
    {"round", nb_round, r_round, ANY, KEEPS_INT},
    {"reciprocal", nb_reciprocal, r_reciprocal, POS, FLOAT_ONLY},
    {"logical_not", nb_logical_not, r_not, {-2, 2, 1, -2, 2, false}, TO_BOOL},
};
#define N_UNARY (int)(sizeof unary_cases / sizeof unary_cases[0])

static nb_dtype unary_out_dtype(kind k, nb_dtype in) {
  if (k == TO_BOOL) return NB_BOOL;
  if (k == FLOAT_ONLY && !nb_dtype_is_float(in)) return NB_F32;
  return in;
}

/* Checks op on x (n values of dt, already rounded to dt) in tensor t of shape s. */
static void check_unary(const unary_case *c, nb_tensor *t, const double *x, nb_shape s) {
  nb_dtype dt = nb_dtype_of(t), odt = unary_out_dtype(c->kind, dt);
  int64_t n = tc_numel(s);
  double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
  for (int64_t i = 0; i < n; i++)
    ref[i] = c->ref(x[i]);
  tc_round_to(ref, n, odt);
  nb_tensor *y = c->fn(t);
  cr_assert(y, "%s(%s): %s", c->name, nb_dtype_name(dt), nb_last_error());
  cr_assert_eq(nb_dtype_of(y), odt, "%s(%s) gave %s", c->name, nb_dtype_name(dt),
               nb_dtype_name(nb_dtype_of(y)));
  tc_assert_close(y, ref, s);
  free(ref);
}

Test(elementwise, unary_ops_match_reference_for_every_dtype) {
  uint64_t seed = 1;
  for (int k = 0; k < N_UNARY; k++) {
    const unary_case *c = &unary_cases[k];
    for (int dt = 0; dt < N_DT; dt++) {
      if (dt == NB_BOOL && c->fn == nb_neg) continue; /* an error: tested below */
      for (int si = 0; si < N_UNARY_SHAPES; si++) {
        nb_shape s = unary_shapes[si];
        int64_t n = tc_numel(s);
        double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
        gen(x, n, (nb_dtype)dt, c->dom, &seed);
        check_unary(c, tc_tensor(x, s, (nb_dtype)dt), x, s);
        free(x);
      }
    }
  }
}

Test(elementwise, unary_ops_read_strided_flipped_and_broadcast_views) {
  uint64_t seed = 2;
  double base[60], x[60];
  const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_I32};
  for (int k = 0; k < N_UNARY; k++) {
    const unary_case *c = &unary_cases[k];
    for (int di = 0; di < 4; di++) {
      nb_dtype dt = dts[di];
      gen(base, 60, dt, c->dom, &seed);
      /* transpose of a [4,15] buffer: shape [15,4], strides [1,15] */
      for (int i = 0; i < 15; i++)
        for (int j = 0; j < 4; j++)
          x[i * 4 + j] = base[j * 15 + i];
      check_unary(c, strided(base, 60, dt, NB_SHAPE(15, 4), (int64_t[]){1, 15}, 0), x,
                  NB_SHAPE(15, 4));
      /* reversed: shape [60], stride -1 from the last element */
      for (int i = 0; i < 60; i++)
        x[i] = base[59 - i];
      check_unary(c, strided(base, 60, dt, NB_SHAPE(60), (int64_t[]){-1}, 59), x, NB_SHAPE(60));
      /* a row broadcast down: shape [3,20], strides [0,1] from element 5 */
      for (int i = 0; i < 3; i++)
        for (int j = 0; j < 20; j++)
          x[i * 20 + j] = base[5 + j];
      check_unary(c, strided(base, 60, dt, NB_SHAPE(3, 20), (int64_t[]){0, 1}, 5), x,
                  NB_SHAPE(3, 20));
      /* one value broadcast everywhere: strides [0,0] */
      for (int i = 0; i < 12; i++)
        x[i] = base[7];
      check_unary(c, strided(base, 60, dt, NB_SHAPE(3, 4), (int64_t[]){0, 0}, 7), x,
                  NB_SHAPE(3, 4));
    }
  }
}

/* ---- binary references -------------------------------------------------------------- */
/* int_dom: the op runs on integers (mod by 0 gives 0 there). */
static double r_add(double a, double b, bool i) { return (void)i, a + b; }
static double r_sub(double a, double b, bool i) { return (void)i, a - b; }
static double r_mul(double a, double b, bool i) { return (void)i, a * b; }
static double r_div(double a, double b, bool i) { return (void)i, a / b; }
static double r_pow(double a, double b, bool i) { return (void)i, pow(a, b); }
static double r_max(double a, double b, bool i) { return (void)i, a > b ? a : b; }
static double r_min(double a, double b, bool i) { return (void)i, a < b ? a : b; }
static double r_atan2(double a, double b, bool i) { return (void)i, atan2(a, b); }
static double r_mod(double a, double b, bool int_dom) {
  if (int_dom && b == 0) return 0;
  double r = fmod(a, b);
  if (r != 0 && (r < 0) != (b < 0)) r += b;
  return r;
}
static double r_eq(double a, double b, bool i) { return (void)i, a == b; }
static double r_ne(double a, double b, bool i) { return (void)i, a != b; }
static double r_lt(double a, double b, bool i) { return (void)i, a < b; }
static double r_le(double a, double b, bool i) { return (void)i, a <= b; }
static double r_gt(double a, double b, bool i) { return (void)i, a > b; }
static double r_ge(double a, double b, bool i) { return (void)i, a >= b; }
static double r_and(double a, double b, bool i) { return (void)i, a != 0 && b != 0; }
static double r_or(double a, double b, bool i) { return (void)i, a != 0 || b != 0; }

typedef struct binary_case {
  const char *name;
  nb_tensor *(*fn)(nb_tensor *, nb_tensor *);
  double (*ref)(double, double, bool);
  domain da, db;
  kind kind;
} binary_case;

#define GRID ((domain){-3, 3, 0.5, -3, 3, false})
#define BASE ((domain){0.5, 3, 0, 0, 4, false})
#define EXPO ((domain){-2, 2, 0, 0, 3, false})
#define DIVISOR ((domain){-4, 4, 0, -4, 4, true})
#define WIDE ((domain){-10, 10, 0, -20, 20, false})

static const binary_case binary_cases[] = {
    {"add", nb_add, r_add, ANY, ANY, KEEPS_INT},
    {"sub", nb_sub, r_sub, ANY, ANY, KEEPS_INT},
    {"mul", nb_mul, r_mul, ANY, ANY, KEEPS_INT},
    {"div", nb_div, r_div, ANY, DIVISOR, FLOAT_ONLY},
    {"pow", nb_pow, r_pow, BASE, EXPO, KEEPS_INT},
    {"maximum", nb_maximum, r_max, GRID, GRID, KEEPS_INT},
    {"minimum", nb_minimum, r_min, GRID, GRID, KEEPS_INT},
    {"atan2", nb_atan2, r_atan2, ANY, ANY, FLOAT_ONLY},
    {"mod", nb_mod, r_mod, WIDE, DIVISOR, KEEPS_INT},
    {"eq", nb_eq, r_eq, GRID, GRID, TO_BOOL},
    {"ne", nb_ne, r_ne, GRID, GRID, TO_BOOL},
    {"lt", nb_lt, r_lt, GRID, GRID, TO_BOOL},
    {"le", nb_le, r_le, GRID, GRID, TO_BOOL},
    {"gt", nb_gt, r_gt, GRID, GRID, TO_BOOL},
    {"ge", nb_ge, r_ge, GRID, GRID, TO_BOOL},
    {"logical_and", nb_logical_and, r_and, {-1, 1, 1, -1, 1, false}, GRID, TO_BOOL},
    {"logical_or", nb_logical_or, r_or, {-1, 1, 1, -1, 1, false}, GRID, TO_BOOL},
};
#define N_BINARY (int)(sizeof binary_cases / sizeof binary_cases[0])

/* Checks c on tensors ta, tb holding xa, xb (already rounded to their dtypes). */
static void check_binary(const binary_case *c, nb_tensor *ta, const double *xa, nb_tensor *tb,
                         const double *xb) {
  nb_dtype da = nb_dtype_of(ta), db = nb_dtype_of(tb), pdt = nb_promote_types(da, db);
  nb_dtype cdt = c->kind == FLOAT_ONLY && !nb_dtype_is_float(pdt) ? NB_F32 : pdt;
  nb_dtype odt = c->kind == TO_BOOL ? NB_BOOL : cdt;
  nb_shape sa = nb_shape_of(ta), sb = nb_shape_of(tb), s = bcast_shape(sa, sb);
  int64_t n = tc_numel(s);
  double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
  for (int64_t i = 0; i < n; i++)
    ref[i] = c->ref(xa[bcast_index(s, sa, i)], xb[bcast_index(s, sb, i)], !nb_dtype_is_float(cdt));
  tc_round_to(ref, n, odt);
  nb_tensor *y = c->fn(ta, tb);
  cr_assert(y, "%s(%s, %s): %s", c->name, nb_dtype_name(da), nb_dtype_name(db), nb_last_error());
  cr_assert_eq(nb_dtype_of(y), odt, "%s(%s, %s) gave %s", c->name, nb_dtype_name(da),
               nb_dtype_name(db), nb_dtype_name(nb_dtype_of(y)));
  tc_assert_close(y, ref, s);
  free(ref);
}

Test(elementwise, binary_ops_match_reference_for_every_dtype_pair_with_broadcasting) {
  uint64_t seed = 3;
  int shape_i = 0;
  for (int k = 0; k < N_BINARY; k++) {
    const binary_case *c = &binary_cases[k];
    for (int da = 0; da < N_DT; da++) {
      for (int db = 0; db < N_DT; db++) {
        if (c->fn == nb_sub && da == NB_BOOL && db == NB_BOOL) continue; /* an error */
        const nb_shape *sp = binary_shapes[shape_i++ % N_BINARY_SHAPES];
        int64_t na = tc_numel(sp[0]), nb = tc_numel(sp[1]);
        double *xa = malloc((size_t)(na ? na : 1) * sizeof *xa);
        double *xb = malloc((size_t)(nb ? nb : 1) * sizeof *xb);
        gen(xa, na, (nb_dtype)da, c->da, &seed);
        gen(xb, nb, (nb_dtype)db, c->db, &seed);
        check_binary(c, tc_tensor(xa, sp[0], (nb_dtype)da), xa, tc_tensor(xb, sp[1], (nb_dtype)db),
                     xb);
        free(xa);
        free(xb);
      }
    }
  }
}

/* A random operand shape broadcastable to out: a suffix of out's dims, some set to 1. */
static nb_shape random_operand_shape(nb_shape out, uint64_t *seed) {
  nb_shape s = {.ndim = (int)floor(tc_uniform(seed, 0, out.ndim + 1))};
  for (int d = 0; d < s.ndim; d++) {
    s.dims[d] = out.dims[out.ndim - s.ndim + d];
    if (tc_uniform(seed, 0, 1) < 0.3) s.dims[d] = 1;
  }
  return s;
}

Test(elementwise, binary_ops_match_reference_on_random_broadcast_shapes) {
  uint64_t seed = 8;
  const nb_dtype dts[] = {NB_F32, NB_F64, NB_I32};
  for (int k = 0; k < N_BINARY; k++) {
    const binary_case *c = &binary_cases[k];
    for (int trial = 0; trial < 12; trial++) {
      nb_dtype dt = dts[trial % 3];
      nb_shape out = {.ndim = (int)floor(tc_uniform(&seed, 0, 5))};
      for (int d = 0; d < out.ndim; d++)
        out.dims[d] = tc_uniform(&seed, 0, 1) < 0.05 ? 0 : (int64_t)floor(tc_uniform(&seed, 1, 6));
      nb_shape sa = random_operand_shape(out, &seed), sb = random_operand_shape(out, &seed);
      int64_t na = tc_numel(sa), nb = tc_numel(sb);
      double *xa = malloc((size_t)(na ? na : 1) * sizeof *xa);
      double *xb = malloc((size_t)(nb ? nb : 1) * sizeof *xb);
      gen(xa, na, dt, c->da, &seed);
      gen(xb, nb, dt, c->db, &seed);
      check_binary(c, tc_tensor(xa, sa, dt), xa, tc_tensor(xb, sb, dt), xb);
      free(xa);
      free(xb);
    }
  }
}

Test(elementwise, binary_ops_read_strided_and_flipped_views) {
  uint64_t seed = 4;
  double base_a[24], base_b[24], xa[24], xb[24];
  const nb_dtype dts[] = {NB_F32, NB_F64, NB_BF16, NB_I64};
  for (int k = 0; k < N_BINARY; k++) {
    const binary_case *c = &binary_cases[k];
    for (int di = 0; di < 4; di++) {
      nb_dtype dt = dts[di];
      gen(base_a, 24, dt, c->da, &seed);
      gen(base_b, 24, dt, c->db, &seed);
      /* a: transpose of [6,4] -> [4,6]; b: reversed [24] seen as [4,6] */
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) {
          xa[i * 6 + j] = base_a[j * 4 + i];
          xb[i * 6 + j] = base_b[23 - (i * 6 + j)];
        }
      nb_tensor *ta = strided(base_a, 24, dt, NB_SHAPE(4, 6), (int64_t[]){1, 4}, 0);
      nb_tensor *tb = strided(base_b, 24, dt, NB_SHAPE(4, 6), (int64_t[]){-6, -1}, 23);
      check_binary(c, ta, xa, tb, xb);
      /* contiguous a with a stride-0 (broadcast) column view of b */
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++)
          xb[i * 6 + j] = base_b[i];
      nb_tensor *tc = strided(base_b, 24, dt, NB_SHAPE(4, 6), (int64_t[]){1, 0}, 0);
      for (int i = 0; i < 24; i++)
        xa[i] = base_a[i];
      check_binary(c, tc_tensor(xa, NB_SHAPE(4, 6), dt), xa, tc, xb);
    }
  }
}

Test(elementwise, large_tensors_split_rows_across_threads) {
  /* one long contiguous row (split into chunks) and many short broadcast rows */
  uint64_t seed = 5;
  int64_t n = 3 * NBI_PAR_MIN + 7;
  double *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
  double *ref = malloc((size_t)n * sizeof *ref), col[3];
  gen(x, n, NB_F32, ANY, &seed);
  gen(y, n, NB_F32, ANY, &seed);
  for (int64_t i = 0; i < n; i++)
    ref[i] = x[i] * y[i];
  tc_assert_close(nb_mul(tc_tensor(x, NB_SHAPE(n), NB_F32), tc_tensor(y, NB_SHAPE(n), NB_F32)), ref,
                  NB_SHAPE(n));
  gen(col, 3, NB_F64, ANY, &seed);
  int64_t rows = n / 3;
  for (int64_t i = 0; i < rows * 3; i++)
    ref[i] = exp(x[i]) - col[i % 3];
  nb_tensor *ex = nb_exp(tc_tensor(x, NB_SHAPE(rows, 3), NB_F64));
  tc_assert_close(nb_sub(ex, tc_tensor(col, NB_SHAPE(3), NB_F64)), ref, NB_SHAPE(rows, 3));
  free(x);
  free(y);
  free(ref);
}

/* ---- dtype rules -------------------------------------------------------------------- */
static nb_dtype dtype_of_binary(nb_tensor *(*fn)(nb_tensor *, nb_tensor *), nb_dtype a,
                                nb_dtype b) {
  return nb_dtype_of(fn(nb_zeros(NB_SHAPE(2), a), nb_ones(NB_SHAPE(2), b)));
}

Test(elementwise, binary_results_promote_as_jax) {
  cr_assert_eq(dtype_of_binary(nb_add, NB_I32, NB_F16), NB_F16);
  cr_assert_eq(dtype_of_binary(nb_add, NB_F16, NB_BF16), NB_F32);
  cr_assert_eq(dtype_of_binary(nb_mul, NB_BOOL, NB_I32), NB_I32);
  cr_assert_eq(dtype_of_binary(nb_sub, NB_I64, NB_F32), NB_F32);
  cr_assert_eq(dtype_of_binary(nb_add, NB_F32, NB_F64), NB_F64);
  cr_assert_eq(dtype_of_binary(nb_add, NB_I32, NB_I64), NB_I64);
  cr_assert_eq(dtype_of_binary(nb_add, NB_BOOL, NB_BOOL), NB_BOOL);
  cr_assert_eq(dtype_of_binary(nb_div, NB_I32, NB_I32), NB_F32);
  cr_assert_eq(dtype_of_binary(nb_div, NB_BF16, NB_I64), NB_BF16);
  cr_assert_eq(dtype_of_binary(nb_atan2, NB_I64, NB_BOOL), NB_F32);
  cr_assert_eq(dtype_of_binary(nb_pow, NB_I32, NB_I32), NB_I32);
  cr_assert_eq(dtype_of_binary(nb_mod, NB_I64, NB_I32), NB_I64);
  cr_assert_eq(dtype_of_binary(nb_lt, NB_F64, NB_F64), NB_BOOL);
  cr_assert_eq(dtype_of_binary(nb_logical_or, NB_F16, NB_I32), NB_BOOL);
}

Test(elementwise, unary_results_keep_or_float_the_dtype) {
  cr_assert_eq(nb_dtype_of(nb_exp(nb_zeros(NB_SHAPE(2), NB_I32))), NB_F32);
  cr_assert_eq(nb_dtype_of(nb_sqrt(nb_zeros(NB_SHAPE(2), NB_BOOL))), NB_F32);
  cr_assert_eq(nb_dtype_of(nb_exp(nb_zeros(NB_SHAPE(2), NB_BF16))), NB_BF16);
  cr_assert_eq(nb_dtype_of(nb_neg(nb_zeros(NB_SHAPE(2), NB_I64))), NB_I64);
  cr_assert_eq(nb_dtype_of(nb_floor(nb_zeros(NB_SHAPE(2), NB_I32))), NB_I32);
  cr_assert_eq(nb_dtype_of(nb_abs(nb_zeros(NB_SHAPE(2), NB_BOOL))), NB_BOOL);
  cr_assert_eq(nb_dtype_of(nb_logical_not(nb_zeros(NB_SHAPE(2), NB_F64))), NB_BOOL);
}

Test(elementwise, integer_operands_of_half_ops_round_to_the_half_dtype) {
  /* as JAX converts both operands to f16 first: 2049 becomes 2048 */
  nb_tensor *i = nb_full(NB_SHAPE(1), 2049, NB_I32), *h = nb_full(NB_SHAPE(1), 2048, NB_F16);
  cr_assert_eq(nb_item(nb_eq(i, h)), 1);
  cr_assert_eq(nb_item(nb_sub(i, h)), 0);
}

Test(elementwise, bool_add_mul_maximum_minimum_are_or_and) {
  double a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1}, or_[4] = {0, 1, 1, 1}, and_[4] = {0, 0, 0, 1};
  nb_tensor *ta = tc_tensor(a, NB_SHAPE(4), NB_BOOL), *tb = tc_tensor(b, NB_SHAPE(4), NB_BOOL);
  tc_assert_close(nb_add(ta, tb), or_, NB_SHAPE(4));
  tc_assert_close(nb_maximum(ta, tb), or_, NB_SHAPE(4));
  tc_assert_close(nb_mul(ta, tb), and_, NB_SHAPE(4));
  tc_assert_close(nb_minimum(ta, tb), and_, NB_SHAPE(4));
  cr_assert_eq(nb_dtype_of(nb_add(ta, tb)), NB_BOOL);
}

/* ---- special values ------------------------------------------------------------------ */
Test(elementwise, maximum_minimum_propagate_nan) {
  double a[4] = {NAN, 1, NAN, -INFINITY}, b[4] = {1, NAN, NAN, 2};
  double mx[4] = {NAN, NAN, NAN, 2}, mn[4] = {NAN, NAN, NAN, -INFINITY};
  for (int dt = NB_F32; dt <= NB_BF16; dt++) {
    nb_tensor *ta = tc_tensor(a, NB_SHAPE(4), (nb_dtype)dt);
    nb_tensor *tb = tc_tensor(b, NB_SHAPE(4), (nb_dtype)dt);
    tc_assert_close(nb_maximum(ta, tb), mx, NB_SHAPE(4));
    tc_assert_close(nb_minimum(ta, tb), mn, NB_SHAPE(4));
  }
}

Test(elementwise, comparisons_with_nan_and_logical_ops_on_nan) {
  double a[3] = {NAN, NAN, 1}, b[3] = {NAN, 1, 1};
  double eq[3] = {0, 0, 1}, ne[3] = {1, 1, 0}, lt[3] = {0, 0, 0}, and_[3] = {1, 1, 1};
  nb_tensor *ta = tc_tensor(a, NB_SHAPE(3), NB_F32), *tb = tc_tensor(b, NB_SHAPE(3), NB_F32);
  tc_assert_close(nb_eq(ta, tb), eq, NB_SHAPE(3));
  tc_assert_close(nb_ne(ta, tb), ne, NB_SHAPE(3));
  tc_assert_close(nb_lt(ta, tb), lt, NB_SHAPE(3));
  tc_assert_close(nb_logical_and(ta, tb), and_, NB_SHAPE(3));
  tc_assert_close(nb_logical_not(ta), (double[]){0, 0, 0}, NB_SHAPE(3));
}

Test(elementwise, mod_takes_the_sign_of_the_divisor) {
  double a[6] = {7, -7, 7, -7, 6, -6}, b[6] = {3, 3, -3, -3, 3, -3};
  double r[6] = {1, 2, -2, -1, 0, 0};
  for (int dt = 0; dt < NB_BOOL; dt++)
    tc_assert_close(
        nb_mod(tc_tensor(a, NB_SHAPE(6), (nb_dtype)dt), tc_tensor(b, NB_SHAPE(6), (nb_dtype)dt)), r,
        NB_SHAPE(6));
  double fa[3] = {5.5, -5.5, 0}, fb[3] = {2, 2, -2}, fr[3] = {1.5, 0.5, 0};
  double *got =
      tc_read(nb_mod(tc_tensor(fa, NB_SHAPE(3), NB_F64), tc_tensor(fb, NB_SHAPE(3), NB_F64)));
  for (int i = 0; i < 3; i++)
    cr_assert_eq(got[i], fr[i]);
  cr_assert(signbit(got[2]), "a zero remainder takes the divisor's sign");
  free(got);
}

Test(elementwise, mod_by_zero_is_zero_for_integers_and_nan_for_floats) {
  double a[3] = {5, -5, 0}, z[3] = {0, 0, 0};
  tc_assert_close(nb_mod(tc_tensor(a, NB_SHAPE(3), NB_I32), tc_tensor(z, NB_SHAPE(3), NB_I32)), z,
                  NB_SHAPE(3));
  double nan3[3] = {NAN, NAN, NAN};
  tc_assert_close(nb_mod(tc_tensor(a, NB_SHAPE(3), NB_F32), tc_tensor(z, NB_SHAPE(3), NB_F32)),
                  nan3, NB_SHAPE(3));
  int64_t mn = INT64_MIN, m1 = -1, out = 7;
  nb_tensor *r =
      nb_mod(nb_from_data(&mn, NB_SHAPE(1), NB_I64), nb_from_data(&m1, NB_SHAPE(1), NB_I64));
  cr_assert_eq(nb_to_host(r, &out, 8), NB_OK);
  cr_assert_eq(out, 0);
}

Test(elementwise, round_is_half_to_even) {
  double x[10] = {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999, 2.5001, 3.5, -3.5};
  double r[10] = {0, 2, 2, -0, -2, -2, 2, 3, 4, -4};
  for (int dt = NB_F32; dt <= NB_BF16; dt++) {
    double xr[10], rr[10];
    memcpy(xr, x, sizeof x);
    tc_round_to(xr, 10, (nb_dtype)dt);
    for (int i = 0; i < 10; i++)
      rr[i] = xr[i] == x[i] ? r[i] : r_round(xr[i]);
    tc_assert_close_tol(nb_round(tc_tensor(x, NB_SHAPE(10), (nb_dtype)dt)), rr, NB_SHAPE(10), 0);
  }
}

Test(elementwise, integer_pow_is_exact) {
  int64_t a[7] = {3, -3, 2, 1, -1, -1, 5}, b[7] = {39, 3, -1, -5, -5, -4, 0};
  int64_t r[7] = {4052555153018976267LL, -27, 0, 1, -1, 1, 1}, got[7];
  nb_tensor *p = nb_pow(nb_from_data(a, NB_SHAPE(7), NB_I64), nb_from_data(b, NB_SHAPE(7), NB_I64));
  cr_assert_eq(nb_dtype_of(p), NB_I64);
  cr_assert_eq(nb_to_host(p, got, sizeof got), NB_OK);
  for (int i = 0; i < 7; i++)
    cr_assert_eq(got[i], r[i], "%lld ** %lld", (long long)a[i], (long long)b[i]);
  cr_assert_eq(nb_item(nb_pow_scalar(nb_full(NB_SHAPE(1), 0, NB_I32), -2)), 0);
}

Test(elementwise, division_by_zero_gives_inf_or_nan) {
  double a[3] = {1, -1, 0}, z[3] = {0, 0, 0}, r[3] = {INFINITY, -INFINITY, NAN};
  for (int dt = 0; dt < N_DT; dt++) {
    if (dt == NB_BOOL) continue;
    nb_tensor *q =
        nb_div(tc_tensor(a, NB_SHAPE(3), (nb_dtype)dt), tc_tensor(z, NB_SHAPE(3), (nb_dtype)dt));
    double ru[3] = {INFINITY, INFINITY, NAN}; /* u8: -1 is 255 */
    tc_assert_close(q, dt == NB_U8 ? ru : r, NB_SHAPE(3));
  }
  tc_assert_close(nb_reciprocal(tc_tensor(z, NB_SHAPE(1), NB_I32)), (double[]){INFINITY},
                  NB_SHAPE(1));
}

Test(elementwise, integer_overflow_wraps) {
  int32_t a[2] = {INT32_MAX, INT32_MIN}, b[2] = {1, 0}, got[2];
  nb_tensor *ta = nb_from_data(a, NB_SHAPE(2), NB_I32), *tb = nb_from_data(b, NB_SHAPE(2), NB_I32);
  cr_assert_eq(nb_to_host(nb_add(ta, tb), got, sizeof got), NB_OK);
  cr_assert(got[0] == INT32_MIN && got[1] == INT32_MIN);
  cr_assert_eq(nb_to_host(nb_neg(ta), got, sizeof got), NB_OK);
  cr_assert(got[0] == -INT32_MAX && got[1] == INT32_MIN);
  cr_assert_eq(nb_to_host(nb_square(ta), got, sizeof got), NB_OK);
  cr_assert(got[0] == 1 && got[1] == 0);
}

Test(elementwise, unary_special_values) {
  double x[5] = {-INFINITY, INFINITY, NAN, -0.0, -1000};
  struct {
    nb_tensor *(*fn)(nb_tensor *);
    double r[5];
  } cases[] = {
      {nb_exp, {0, INFINITY, NAN, 1, 0}},           {nb_sigmoid, {0, 1, NAN, 0.5, 0}},
      {nb_relu, {0, INFINITY, NAN, 0, 0}},          {nb_softplus, {0, INFINITY, NAN, M_LN2, 0}},
      {nb_gelu, {NAN, INFINITY, NAN, 0, 0}},        {nb_sign, {-1, 1, NAN, 0, -1}},
      {nb_abs, {INFINITY, INFINITY, NAN, 0, 1000}}, {nb_tanh, {-1, 1, NAN, 0, -1}},
      {nb_sqrt, {NAN, INFINITY, NAN, 0, NAN}},      {nb_erf, {-1, 1, NAN, 0, -1}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int dt = NB_F32; dt <= NB_F64; dt++)
      tc_assert_close(cases[k].fn(tc_tensor(x, NB_SHAPE(5), (nb_dtype)dt)), cases[k].r,
                      NB_SHAPE(5));
}

/* ---- scalar forms --------------------------------------------------------------------- */
Test(elementwise, scalar_forms_match_reference) {
  struct {
    nb_tensor *(*fn)(nb_tensor *, double);
    double (*ref)(double, double, bool);
    bool reversed;
  } cases[] = {
      {nb_add_scalar, r_add, false},     {nb_sub_scalar, r_sub, false},
      {nb_rsub_scalar, r_sub, true},     {nb_mul_scalar, r_mul, false},
      {nb_div_scalar, r_div, false},     {nb_rdiv_scalar, r_div, true},
      {nb_pow_scalar, r_pow, false},     {nb_maximum_scalar, r_max, false},
      {nb_minimum_scalar, r_min, false}, {nb_eq_scalar, r_eq, false},
      {nb_ne_scalar, r_ne, false},       {nb_lt_scalar, r_lt, false},
      {nb_le_scalar, r_le, false},       {nb_gt_scalar, r_gt, false},
      {nb_ge_scalar, r_ge, false},
  };
  double x[6] = {1, 2, 3, 0.5, 4, 2.5}, ref[6];
  const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_I32, NB_I64};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    for (int di = 0; di < 5; di++) {
      nb_dtype dt = dts[di];
      double xr[6], s = 2;
      memcpy(xr, x, sizeof x);
      tc_round_to(xr, 6, dt);
      for (int i = 0; i < 6; i++)
        ref[i] = cases[k].reversed ? cases[k].ref(s, xr[i], false) : cases[k].ref(xr[i], s, false);
      nb_tensor *y = cases[k].fn(tc_tensor(xr, NB_SHAPE(2, 3), dt), s);
      cr_assert(y, "%s", nb_last_error());
      nb_dtype odt = nb_dtype_of(y);
      tc_round_to(ref, 6, odt);
      tc_assert_close(y, ref, NB_SHAPE(2, 3));
    }
  }
}

Test(elementwise, scalars_are_weakly_typed) {
  nb_tensor *h = nb_full(NB_SHAPE(2), 3, NB_F16), *i = nb_full(NB_SHAPE(2), 3, NB_I32);
  nb_tensor *b = nb_full(NB_SHAPE(2), 1, NB_BOOL);
  cr_assert_eq(nb_dtype_of(nb_mul_scalar(h, 0.5)), NB_F16);
  cr_assert_eq(nb_item(nb_mul_scalar(nb_full(NB_SHAPE(1), 3, NB_F16), 0.5)), 1.5);
  cr_assert_eq(nb_dtype_of(nb_add_scalar(i, 2)), NB_I32);
  cr_assert_eq(nb_dtype_of(nb_add_scalar(i, 0.5)), NB_F32);
  cr_assert_eq(nb_item(nb_add_scalar(nb_full(NB_SHAPE(1), 3, NB_I32), 0.5)), 3.5);
  cr_assert_eq(nb_dtype_of(nb_add_scalar(i, INFINITY)), NB_F32);
  cr_assert_eq(nb_dtype_of(nb_add_scalar(b, 1)), NB_I32);
  cr_assert_eq(nb_dtype_of(nb_mul_scalar(b, 0.5)), NB_F32);
  cr_assert_eq(nb_dtype_of(nb_add_scalar(nb_full(NB_SHAPE(2), 3, NB_BF16), 1e6)), NB_BF16);
  cr_assert_eq(nb_dtype_of(nb_gt_scalar(i, 0.5)), NB_BOOL);
  cr_assert_eq(nb_dtype_of(nb_div_scalar(i, 2)), NB_F32);
}

Test(elementwise, integral_scalar_outside_the_integer_dtype_is_an_error) {
  nb_tensor *i = nb_full(NB_SHAPE(2), 3, NB_I32);
  cr_assert_null(nb_add_scalar(i, 3e9));
  tc_assert_error(NB_ERR_ARG, "nb_add_scalar: scalar 3000000000 does not fit");
  cr_assert_null(nb_lt_scalar(nb_full(NB_SHAPE(2), 3, NB_I64), 0x1p63));
  tc_assert_error(NB_ERR_ARG, "nb_lt_scalar");
  cr_assert_not_null(nb_add_scalar(nb_full(NB_SHAPE(2), 3, NB_I64), -0x1p63));
}

/* ---- where, clip -------------------------------------------------------------------- */
Test(elementwise, where_selects_with_three_way_broadcast_and_promotes) {
  uint64_t seed = 6;
  double c[3], a[4], b[10];
  gen(c, 3, NB_BOOL, ANY, &seed);
  gen(a, 4, NB_I32, ANY, &seed);
  gen(b, 10, NB_F16, ANY, &seed);
  nb_shape sc = NB_SHAPE(3, 1, 1, 1), sa = NB_SHAPE(4, 1), sb = NB_SHAPE(2, 1, 5);
  nb_shape s = NB_SHAPE(3, 2, 4, 5);
  int64_t n = tc_numel(s);
  double ref[120];
  for (int64_t i = 0; i < n; i++)
    ref[i] = c[bcast_index(s, sc, i)] ? a[bcast_index(s, sa, i)] : b[bcast_index(s, sb, i)];
  nb_tensor *w =
      nb_where(tc_tensor(c, sc, NB_BOOL), tc_tensor(a, sa, NB_I32), tc_tensor(b, sb, NB_F16));
  cr_assert(w, "%s", nb_last_error());
  cr_assert_eq(nb_dtype_of(w), NB_F16);
  tc_assert_close_tol(w, ref, s, 0);
}

Test(elementwise, where_on_every_dtype_and_strided_cond) {
  uint64_t seed = 7;
  double cb[12], a[12], b[12], ref[12];
  gen(cb, 12, NB_BOOL, ANY, &seed);
  for (int dt = 0; dt < N_DT; dt++) {
    gen(a, 12, (nb_dtype)dt, ANY, &seed);
    gen(b, 12, (nb_dtype)dt, ANY, &seed);
    /* cond: transpose of a [4,3] buffer */
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 4; j++)
        ref[i * 4 + j] = cb[j * 3 + i] ? a[i * 4 + j] : b[i * 4 + j];
    nb_tensor *cond = strided(cb, 12, NB_BOOL, NB_SHAPE(3, 4), (int64_t[]){1, 3}, 0);
    nb_tensor *w = nb_where(cond, tc_tensor(a, NB_SHAPE(3, 4), (nb_dtype)dt),
                            tc_tensor(b, NB_SHAPE(3, 4), (nb_dtype)dt));
    cr_assert_eq(nb_dtype_of(w), (nb_dtype)dt);
    tc_assert_close_tol(w, ref, NB_SHAPE(3, 4), 0);
  }
}

Test(elementwise, clip_matches_numpy) {
  double x[6] = {-3, -0.5, 0, 0.7, 2, NAN};
  double r[6] = {-1, -0.5, 0, 0.7, 1, NAN};
  tc_assert_close(nb_clip(tc_tensor(x, NB_SHAPE(6), NB_F64), -1, 1), r, NB_SHAPE(6));
  double hi[6] = {0, 0, 0, 0, 0, NAN}; /* lo > hi: hi everywhere, as NumPy */
  tc_assert_close(nb_clip(tc_tensor(x, NB_SHAPE(6), NB_F64), 1, 0), hi, NB_SHAPE(6));
  double xi[4] = {-5, 0, 3, 9}, ri[4] = {-2, 0, 3, 4}, rf[4] = {-1.5, 0, 2.5, 2.5};
  nb_tensor *c = nb_clip(tc_tensor(xi, NB_SHAPE(4), NB_I32), -2, 4);
  cr_assert_eq(nb_dtype_of(c), NB_I32);
  tc_assert_close(c, ri, NB_SHAPE(4));
  nb_tensor *f = nb_clip(tc_tensor(xi, NB_SHAPE(4), NB_I32), -1.5, 2.5);
  cr_assert_eq(nb_dtype_of(f), NB_F32);
  tc_assert_close(f, rf, NB_SHAPE(4));
}

/* ---- cast ------------------------------------------------------------------------------ */
/* What a cast of v (a value of dtype from) to dtype to must give. */
static double cast_ref(double v, nb_dtype from, nb_dtype to) {
  if (to == NB_BOOL) return v != 0;
  if (to == NB_U8 || to == NB_I8 || to == NB_I16) { /* to i64 (saturating), then wrapping */
    int64_t w = !nb_dtype_is_float(from) ? (int64_t)v
                : isnan(v)               ? 0
                : v >= 0x1p63            ? INT64_MAX
                : v <= -0x1p63           ? INT64_MIN
                                         : (int64_t)trunc(v);
    return to == NB_U8   ? (double)(uint8_t)w
           : to == NB_I8 ? (double)(int8_t)(uint8_t)w
                         : (double)(int16_t)(uint16_t)w;
  }
  if (nbi_dtype_is_int(to)) {
    double lo = to == NB_I32 ? -0x1p31 : -0x1p63, hi = to == NB_I32 ? 0x1p31 - 1 : 0x1p63;
    if (nb_dtype_is_float(from)) {
      if (isnan(v)) return 0;
      return v <= lo ? lo : v >= hi ? hi : trunc(v);
    }
    if (to == NB_I32) return (double)(int32_t)(uint32_t)(int64_t)v; /* wraps */
    return v;
  }
  char one[8];
  nbi_store_f64(one, to, 0, v);
  return nbi_load_f64(one, to, 0);
}

Test(elementwise, cast_every_pair_of_dtypes) {
  double x[10] = {0, 1, -1, 2.7, -2.7, 100.5, -3e9, 3e9, NAN, 65519};
  for (int from = 0; from < N_DT; from++) {
    double xr[10];
    memcpy(xr, x, sizeof x);
    tc_round_to(xr, 10, (nb_dtype)from);
    nb_tensor *t = tc_tensor(xr, NB_SHAPE(2, 5), (nb_dtype)from);
    for (int to = 0; to < N_DT; to++) {
      double ref[10];
      for (int i = 0; i < 10; i++)
        ref[i] = cast_ref(xr[i], (nb_dtype)from, (nb_dtype)to);
      nb_tensor *c = nb_cast(t, (nb_dtype)to);
      cr_assert_eq(nb_dtype_of(c), (nb_dtype)to);
      tc_assert_close_tol(c, ref, NB_SHAPE(2, 5), 0);
    }
  }
}

Test(elementwise, cast_float_to_int_truncates_and_saturates) {
  double x[7] = {2.7, -2.7, 1e10, -1e10, NAN, INFINITY, -INFINITY};
  double r32[7] = {2, -2, INT32_MAX, INT32_MIN, 0, INT32_MAX, INT32_MIN};
  for (int dt = NB_F32; dt <= NB_F64; dt++)
    tc_assert_close_tol(nb_cast(tc_tensor(x, NB_SHAPE(7), (nb_dtype)dt), NB_I32), r32, NB_SHAPE(7),
                        0);
  int64_t got[3];
  double y[3] = {1e19, -1e19, -2.9};
  cr_assert_eq(nb_to_host(nb_cast(tc_tensor(y, NB_SHAPE(3), NB_F64), NB_I64), got, 24), NB_OK);
  cr_assert(got[0] == INT64_MAX && got[1] == INT64_MIN && got[2] == -2);
}

Test(elementwise, cast_to_bool_is_nonzero) {
  double x[5] = {0, -0.0, 0.25, NAN, -3};
  tc_assert_close_tol(nb_cast(tc_tensor(x, NB_SHAPE(5), NB_F32), NB_BOOL),
                      (double[]){0, 0, 1, 1, 1}, NB_SHAPE(5), 0);
}

Test(elementwise, cast_between_integers_wraps) {
  int64_t x[3] = {((int64_t)1 << 32) + 5, -1, (int64_t)INT32_MAX + 1};
  int32_t got[3];
  cr_assert_eq(nb_to_host(nb_cast(nb_from_data(x, NB_SHAPE(3), NB_I64), NB_I32), got, 12), NB_OK);
  cr_assert(got[0] == 5 && got[1] == -1 && got[2] == INT32_MIN);
}

Test(elementwise, narrowing_casts_round_once) {
  /* 1 + 2^-11 + 2^-40 lies just above the f16 tie between 1 and 1 + 2^-10 */
  double x = 1 + 0x1p-11 + 0x1p-40;
  cr_assert_eq(nb_item(nb_cast(nb_scalar(x, NB_F64), NB_F16)), 1 + 0x1p-10);
  cr_assert_eq(nb_item(nb_cast(nb_scalar(1 + 0x1p-8 + 0x1p-30, NB_F64), NB_BF16)), 1 + 0x1p-7);
  int32_t i = (1 << 24) + (1 << 16) + 1; /* just above a bf16 tie */
  nb_tensor *b = nb_cast(nb_from_data(&i, NB_SHAPE(1), NB_I32), NB_BF16);
  cr_assert_eq(nb_item(b), 0x1p24 + 0x1p17);
}

Test(elementwise, cast_to_the_same_dtype_shares_the_data) {
  double x[4] = {1, 2, 3, 4};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 2), NB_I64);
  nb_reset_stats();
  nb_tensor *c = nb_cast(t, NB_I64);
  tc_assert_close_tol(c, x, NB_SHAPE(2, 2), 0);
  cr_assert_eq(nb_get_stats().kernels_run, 0);
  cr_assert_eq(c->shard0.buf, t->shard0.buf);
}

/* ---- errors --------------------------------------------------------------------------- */
Test(elementwise, null_arguments_are_errors_naming_the_function) {
  nb_tensor *t = nb_zeros(NB_SHAPE(2), NB_F32);
  for (int k = 0; k < N_UNARY; k++) {
    cr_assert_null(unary_cases[k].fn(NULL));
    char name[32];
    snprintf(name, sizeof name, "nb_%s: argument 1 is NULL", unary_cases[k].name);
    tc_assert_error(NB_ERR_NULL, name);
  }
  for (int k = 0; k < N_BINARY; k++) {
    cr_assert_null(binary_cases[k].fn(t, NULL));
    char name[40];
    snprintf(name, sizeof name, "nb_%s: argument 2 is NULL", binary_cases[k].name);
    tc_assert_error(NB_ERR_NULL, name);
  }
  cr_assert_null(nb_add_scalar(NULL, 1));
  tc_assert_error(NB_ERR_NULL, "nb_add_scalar");
  cr_assert_null(nb_rdiv_scalar(NULL, 1));
  tc_assert_error(NB_ERR_NULL, "nb_rdiv_scalar");
  cr_assert_null(nb_cast(NULL, NB_F32));
  tc_assert_error(NB_ERR_NULL, "nb_cast");
  cr_assert_null(nb_where(NULL, t, t));
  tc_assert_error(NB_ERR_NULL, "nb_where: argument 1");
  cr_assert_null(nb_clip(NULL, 0, 1));
  tc_assert_error(NB_ERR_NULL, "nb_clip");
}

Test(elementwise, null_keeps_the_first_error_through_a_chain) {
  nb_tensor *t = nb_zeros(NB_SHAPE(2), NB_F32);
  nb_tensor *r = nb_exp(nb_add(nb_mul(t, nb_zeros(NB_SHAPE(3), NB_F32)), t));
  cr_assert_null(r);
  tc_assert_error(NB_ERR_SHAPE, "nb_mul");
}

Test(elementwise, shapes_that_do_not_broadcast_are_errors_naming_both) {
  nb_tensor *a = nb_zeros(NB_SHAPE(2, 3), NB_F32), *b = nb_zeros(NB_SHAPE(4, 3), NB_F32);
  cr_assert_null(nb_add(a, b));
  tc_assert_error(NB_ERR_SHAPE, "nb_add: shapes [2,3] and [4,3] do not broadcast");
  cr_assert_null(nb_lt(a, nb_zeros(NB_SHAPE(2), NB_I32)));
  tc_assert_error(NB_ERR_SHAPE, "[2,3] and [2]");
  nb_tensor *c = nb_zeros(NB_SHAPE(5, 1, 1), NB_BOOL);
  cr_assert_null(nb_where(c, a, b));
  tc_assert_error(NB_ERR_SHAPE, "nb_where: shapes [2,3] and [4,3]");
  cr_assert_null(nb_where(nb_zeros(NB_SHAPE(3, 1), NB_BOOL), a, a));
  tc_assert_error(NB_ERR_SHAPE, "nb_where: shapes [3,1] and [2,3]");
}

Test(elementwise, neg_and_sub_of_bool_are_dtype_errors) {
  nb_tensor *b = nb_ones(NB_SHAPE(2), NB_BOOL);
  cr_assert_null(nb_neg(b));
  tc_assert_error(NB_ERR_DTYPE, "nb_neg: negation of a bool tensor");
  cr_assert_null(nb_sub(b, b));
  tc_assert_error(NB_ERR_DTYPE, "nb_sub: subtraction of bool tensors");
  cr_assert_not_null(nb_sub(b, nb_ones(NB_SHAPE(2), NB_I32))); /* bool - int is fine */
}

Test(elementwise, where_requires_a_bool_condition) {
  nb_tensor *c = nb_ones(NB_SHAPE(2), NB_I32), *a = nb_zeros(NB_SHAPE(2), NB_F32);
  cr_assert_null(nb_where(c, a, a));
  tc_assert_error(NB_ERR_DTYPE, "nb_where: cond must be bool, got i32");
}

Test(elementwise, cast_to_an_invalid_dtype_is_an_error) {
  nb_tensor *t = nb_zeros(NB_SHAPE(2), NB_F32);
  cr_assert_null(nb_cast(t, NB_DTYPE_COUNT));
  char msg[64];
  snprintf(msg, sizeof msg, "nb_cast: invalid dtype %d", (int)NB_DTYPE_COUNT);
  tc_assert_error(NB_ERR_DTYPE, msg);
  cr_assert_null(nb_cast(t, (nb_dtype)-1));
  tc_assert_error(NB_ERR_DTYPE, "nb_cast: invalid dtype -1");
}

Test(elementwise, failed_calls_leave_their_inputs_unchanged) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *a = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  nb_tensor *l = nb_add_scalar(a, 1); /* a pending input */
  uint64_t live = nb_get_stats().live_tensors;
  cr_assert_null(nb_add(l, nb_zeros(NB_SHAPE(4), NB_F32)));
  nb_clear_error();
  cr_assert_null(nb_where(a, a, a));
  nb_clear_error();
  cr_assert_null(nb_cast(a, (nb_dtype)42));
  nb_clear_error();
  cr_assert_eq(nb_get_stats().live_tensors, live + 1); /* only the zeros were made */
  cr_assert(!nb_is_realized(l));
  tc_assert_close(a, x, NB_SHAPE(2, 3));
  double y[6] = {2, 3, 4, 5, 6, 7};
  tc_assert_close(l, y, NB_SHAPE(2, 3));
}

/* ---- laziness, plan cache --------------------------------------------------------------- */
Test(elementwise, results_are_not_computed_until_eval) {
  nb_tensor *a = nb_full(NB_SHAPE(3), 2, NB_F32), *b = nb_full(NB_SHAPE(3), 5, NB_F32);
  uint64_t runs = nb_get_stats().kernels_run;
  nb_tensor *c = nb_add(a, b), *d = nb_exp(c);
  cr_assert(!nb_is_realized(c) && !nb_is_realized(d));
  cr_assert_eq(nb_get_stats().kernels_run, runs);
  cr_assert_eq(nb_eval(&c, 1), NB_OK);
  cr_assert(nb_is_realized(c) && !nb_is_realized(d));
  tc_assert_close(c, (double[]){7, 7, 7}, NB_SHAPE(3));
}

Test(elementwise, a_repeated_graph_hits_the_plan_cache) {
  nb_tensor *x = nb_full(NB_SHAPE(4, 4), 0.5, NB_F32);
  uint64_t hits = 0;
  for (int it = 0; it < 5; it++) {
    nb_scope_begin();
    nb_tensor *y = nb_mul_scalar(nb_sigmoid(nb_add_scalar(x, (double)it)), 2.0);
    cr_assert_eq(nb_eval(&y, 1), NB_OK);
    double *v = tc_read(y), r = 2 / (1 + exp(-(0.5 + it)));
    cr_assert(fabs(v[15] - r) < 1e-6, "got %g, expected %g", v[15], r);
    free(v);
    if (it == 1) hits = nb_get_stats().plan_cache_hits;
    nb_scope_end();
  }
  cr_assert_geq(nb_get_stats().plan_cache_hits, hits + 3);
}
