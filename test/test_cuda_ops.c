/* test/test_cuda_ops.c — every op that has a CPU kernel, run on NB_CUDA(0) and
 * compared with the CPU backend: seeded random inputs made on the CPU and moved
 * with nb_to_device, several shapes (broadcasting, transposed views, zero-size)
 * and every dtype the op takes; tolerances by dtype (f64 1e-12, f32 1e-5,
 * f16 / bf16 1e-2 relative, integers and bools exact, NaN where the CPU has
 * NaN). Also: out-of-range indices fail at the read with NB_ERR_INDEX naming
 * the op; gradients of small functions on CUDA match the CPU's; the op table
 * answers supports as documented (no GPU needed for that one).
 *
 * Compiled only in a CUDA build (make CUDA=1); tests that need a GPU skip when
 * nb_device_count(NB_DEVICE_CUDA) is 0. A mismatch names the op, the case
 * (dtypes, shapes), how many elements differ and the first ones. */
#ifdef NABLA_CUDA
#include "common.h"
#include "../src/core/oprules.h"

#include "../src/backends/cpu/cpu.h"
#include "../src/backends/cuda/cuda_be.h"
#include "../src/ops/index.h"
#include "../src/ops/nn.h"

TestSuite(cuda_ops, .init = tc_setup, .fini = tc_teardown);

static void need_gpu(void) {
  if (nb_device_count(NB_DEVICE_CUDA) == 0) cr_skip_test("no CUDA device: %s", nbi_cuda_why());
}

static const nb_dtype all_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64, NB_BOOL};
static const nb_dtype float_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- inputs ------------------------------------------------------------------------------ */

/* How an input's values are drawn. */
enum {
  V_REAL,    /* floats in [-3, 3); integers in [-5, 5]; bools 0/1 */
  V_POS,     /* floats in [0.5, 1.5); integers in [1, 3] (products) */
  V_TIES,    /* integral values in [-2, 2]: ties for arg/pool ops */
  V_NAN,     /* V_REAL with about one NaN in six (floats) */
  V_SPECIAL, /* NaN, infinities, signed zeros, halves, huge and tiny values */
  V_INDEX,   /* integers in [-range, range) */
};

typedef struct spec {
  nb_shape s;
  nb_dtype dt;
  int values;    /* V_* */
  int64_t range; /* V_INDEX */
  bool strided;  /* built as a transposed view (rank >= 2) */
} spec;

static double special_value(uint64_t *seed, nb_dtype dt) {
  static const double f[] = {NAN,  INFINITY, -INFINITY, 0.0,    -0.0,  0.5,   -0.5, 1.5, 2.5,
                             -2.5, 1e10,     -1e10,     65520., 1e-30, -3e38, 3e38, 7.0};
  static const double i[] = {0, 1, -1, 2147483647., -2147483648., 2147483649., -4e12, 9e15, 255};
  if (nb_dtype_is_float(dt)) return f[tc_randint(seed, 0, COUNT(f) - 1)];
  if (dt == NB_BOOL) return (double)tc_randint(seed, 0, 1);
  double v = i[tc_randint(seed, 0, COUNT(i) - 1)];
  return dt == NB_I32 && fabs(v) > 2147483647. ? 12345 : v;
}

/* numel(sp->s) values for sp (as doubles, rounded through sp->dt); malloc'd. */
static double *gen_values(const spec *sp, uint64_t *seed) {
  int64_t n = tc_numel(sp->s);
  double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  bool fl = nb_dtype_is_float(sp->dt);
  for (int64_t k = 0; k < n; k++) {
    switch (sp->values) {
    case V_POS: x[k] = fl ? tc_uniform(seed, 0.5, 1.5) : (double)tc_randint(seed, 1, 3); break;
    case V_TIES: x[k] = (double)tc_randint(seed, -2, 2); break;
    case V_INDEX: x[k] = (double)tc_randint(seed, -sp->range, sp->range - 1); break;
    case V_SPECIAL:
      x[k] = tc_randint(seed, 0, 1) ? special_value(seed, sp->dt) : tc_uniform(seed, -3, 3);
      break;
    default:
      x[k] = fl ? tc_uniform(seed, -3, 3) : (double)tc_randint(seed, -5, 5);
      if (fl && sp->values == V_NAN && tc_randint(seed, 0, 5) == 0) x[k] = NAN;
    }
    if (sp->dt == NB_BOOL && sp->values != V_INDEX) x[k] = x[k] != 0 && x[k] == x[k];
  }
  tc_round_to(x, n, sp->dt);
  return x;
}

/* sp's tensor holding x, made on the CPU and moved to CUDA when cuda; a
 * transposed view (made on its device) when sp->strided. */
static nb_tensor *make_input(const spec *sp, const double *x, bool cuda) {
  nb_shape s = sp->s;
  bool tr = sp->strided && s.ndim >= 2;
  int64_t n = tc_numel(s), j[NB_MAX_DIMS];
  double *data = malloc((size_t)(n ? n : 1) * sizeof *data);
  int a = s.ndim - 2, b = s.ndim - 1;
  if (tr) {
    nb_shape ts = s;
    ts.dims[a] = s.dims[b];
    ts.dims[b] = s.dims[a];
    for (int64_t k = 0; k < n; k++) {
      tc_unravel(k, &ts, j);
      int64_t tmp = j[a];
      j[a] = j[b];
      j[b] = tmp;
      data[k] = x[tc_ravel(j, &s)];
    }
    s = ts;
  } else if (n) {
    memcpy(data, x, (size_t)n * sizeof *data);
  }
  nb_tensor *t = tc_tensor(data, s, sp->dt);
  free(data);
  if (cuda) t = nb_to_device(t, NB_CUDA(0));
  if (tr && t) t = nb_transpose(t);
  cr_assert(t, "make_input: %s", nb_last_error());
  return t;
}

/* ---- comparison ------------------------------------------------------------------------------ */

/* t's elements in t's dtype (malloc'd); fails the test naming what. */
static void *read_raw(const char *what, const char *where, nb_tensor *t) {
  size_t n = (size_t)nb_numel(t) * nb_dtype_size(nb_dtype_of(t));
  void *raw = malloc(n ? n : 1);
  nb_status st = nb_to_host(t, raw, n);
  cr_assert_eq(st, NB_OK, "%s: reading the %s result: %s (%s)", what, where, nb_status_str(st),
               nb_last_error());
  return raw;
}

/* Asserts got (CUDA) equals ref (CPU): shape, dtype, device, and every element
 * within the dtype's tolerance times scale. */
static void compare(const char *what, nb_tensor *ref, nb_tensor *got, double scale) {
  cr_assert(ref, "%s: the CPU op failed: %s", what, nb_last_error());
  cr_assert(got, "%s: the CUDA op failed: %s", what, nb_last_error());
  cr_assert_eq(nb_device_of(got).kind, NB_DEVICE_CUDA, "%s: the result is on %s", what,
               nb_device_str(nb_device_of(got)));
  nb_shape rs = nb_shape_of(ref), gs = nb_shape_of(got);
  char b1[160], b2[160];
  cr_assert(nbi_shape_eq(&rs, &gs), "%s: shape %s on CUDA, %s on the CPU", what,
            nb_shape_str(gs, b1, sizeof b1), nb_shape_str(rs, b2, sizeof b2));
  nb_dtype dt = nb_dtype_of(ref);
  cr_assert_eq(nb_dtype_of(got), dt, "%s: dtype %s on CUDA, %s on the CPU", what,
               nb_dtype_name(nb_dtype_of(got)), nb_dtype_name(dt));
  nb_shape_str(rs, b2, sizeof b2); /* named by the mismatch message below */
  void *r = read_raw(what, "CPU", ref), *g = read_raw(what, "CUDA", got);
  int64_t n = nb_numel(ref), bad = 0;
  double tol = tc_tol(dt) * scale;
  char msg[1024] = "";
  size_t used = 0;
  for (int64_t i = 0; i < n; i++) {
    bool ok;
    if (!nb_dtype_is_float(dt)) {
      ok = nbi_load_i64(r, dt, i) == nbi_load_i64(g, dt, i);
    } else {
      double a = nbi_load_f64(r, dt, i), b = nbi_load_f64(g, dt, i);
      ok = isnan(a) ? isnan(b) : isinf(a) ? a == b : fabs(a - b) <= tol * (1 + fabs(a));
    }
    if (ok || bad++ >= 4) continue;
    int64_t ix[NB_MAX_DIMS] = {0};
    tc_unravel(i, &rs, ix);
    used += (size_t)snprintf(msg + used, sizeof msg - used, " [%lld:", (long long)i);
    for (int d = 0; d < rs.ndim && used < sizeof msg; d++)
      used += (size_t)snprintf(msg + used, sizeof msg - used, "%s%lld", d ? "," : "(",
                               (long long)ix[d]);
    if (used < sizeof msg)
      used += (size_t)snprintf(msg + used, sizeof msg - used, "%s cpu %.9g cuda %.9g]",
                               rs.ndim ? ")" : "", nbi_load_f64(r, dt, i), nbi_load_f64(g, dt, i));
  }
  free(r);
  free(g);
  cr_assert_eq(bad, 0, "%s: %lld of %lld elements differ (%s %s, tol %g):%s", what, (long long)bad,
               (long long)n, nb_dtype_name(dt), b2, tol, msg);
}

/* ---- the case runner ----------------------------------------------------------------------- */

/* An op applied to inputs x (all on one device); arg is the row's data. */
typedef nb_tensor *(*op_fn)(nb_tensor *const *x, const void *arg);

/* "name(f32[3,4]T, i64[5])": the case's label. */
static const char *label(char *buf, size_t cap, const char *name, int n, const spec *sp) {
  size_t u = (size_t)snprintf(buf, cap, "%s(", name);
  for (int k = 0; k < n && u < cap; k++) {
    char sb[160];
    u += (size_t)snprintf(buf + u, cap - u, "%s%s%s%s", k ? ", " : "", nb_dtype_name(sp[k].dt),
                          nb_shape_str(sp[k].s, sb, sizeof sb), sp[k].strided ? "T" : "");
  }
  if (u < cap) snprintf(buf + u, cap - u, ")");
  return buf;
}

/* Runs f on inputs drawn for sp[0..n) on the CPU and on CUDA and compares. */
static void run_case(const char *name, op_fn f, const void *arg, int n, const spec *sp,
                     double scale, uint64_t seed) {
  char what[512];
  label(what, sizeof what, name, n, sp);
  nb_tensor *cpu[4], *gpu[4];
  for (int k = 0; k < n; k++) {
    double *x = gen_values(&sp[k], &seed);
    cpu[k] = make_input(&sp[k], x, false);
    gpu[k] = make_input(&sp[k], x, true);
    free(x);
  }
  nb_tensor *r = f(cpu, arg);
  if (!r) cr_assert_fail("%s: the CPU op failed: %s", what, nb_last_error());
  nb_tensor *g = f(gpu, arg);
  compare(what, r, g, scale);
}

#define SPEC(dtype, vals, ...) ((spec){.s = NB_SHAPE(__VA_ARGS__), .dt = (dtype), .values = (vals)})
#define SPEC0(dtype, vals) ((spec){.s = NB_SCALAR_SHAPE, .dt = (dtype), .values = (vals)})
static spec strided(spec s) {
  s.strided = true;
  return s;
}

/* ---- elementwise ----------------------------------------------------------------------------- */

typedef struct unary_op {
  const char *name;
  nb_tensor *(*f)(nb_tensor *);
} unary_op;
static const unary_op unary_ops[] = {
    {"neg", nb_neg},
    {"abs", nb_abs},
    {"sign", nb_sign},
    {"exp", nb_exp},
    {"expm1", nb_expm1},
    {"log", nb_log},
    {"log1p", nb_log1p},
    {"sqrt", nb_sqrt},
    {"rsqrt", nb_rsqrt},
    {"square", nb_square},
    {"sin", nb_sin},
    {"cos", nb_cos},
    {"tan", nb_tan},
    {"tanh", nb_tanh},
    {"sigmoid", nb_sigmoid},
    {"relu", nb_relu},
    {"gelu", nb_gelu},
    {"silu", nb_silu},
    {"softplus", nb_softplus},
    {"erf", nb_erf},
    {"floor", nb_floor},
    {"ceil", nb_ceil},
    {"round", nb_round},
    {"reciprocal", nb_reciprocal},
    {"logical_not", nb_logical_not},
};
static nb_tensor *apply_unary(nb_tensor *const *x, const void *arg) {
  return ((const unary_op *)arg)->f(x[0]);
}

Test(cuda_ops, unary_ops_match_cpu) {
  need_gpu();
  for (int o = 0; o < COUNT(unary_ops); o++)
    for (int d = 0; d < COUNT(all_dtypes); d++) {
      nb_dtype dt = all_dtypes[d];
      if (unary_ops[o].f == nb_neg && dt == NB_BOOL) continue; /* an error on the CPU too */
      const spec cases[] = {SPEC(dt, V_REAL, 0),        SPEC0(dt, V_REAL),
                            SPEC(dt, V_REAL, 7),        strided(SPEC(dt, V_REAL, 3, 5)),
                            SPEC(dt, V_REAL, 4, 33, 9), SPEC(dt, V_SPECIAL, 96)};
      for (int c = 0; c < COUNT(cases); c++)
        run_case(unary_ops[o].name, apply_unary, &unary_ops[o], 1, &cases[c], 4, 100 + c);
    }
}

typedef struct binary_op {
  const char *name;
  nb_tensor *(*f)(nb_tensor *, nb_tensor *);
} binary_op;
static const binary_op binary_ops[] = {
    {"add", nb_add},
    {"sub", nb_sub},
    {"mul", nb_mul},
    {"div", nb_div},
    {"pow", nb_pow},
    {"maximum", nb_maximum},
    {"minimum", nb_minimum},
    {"atan2", nb_atan2},
    {"mod", nb_mod},
    {"eq", nb_eq},
    {"ne", nb_ne},
    {"lt", nb_lt},
    {"le", nb_le},
    {"gt", nb_gt},
    {"ge", nb_ge},
    {"logical_and", nb_logical_and},
    {"logical_or", nb_logical_or},
};
static nb_tensor *apply_binary(nb_tensor *const *x, const void *arg) {
  return ((const binary_op *)arg)->f(x[0], x[1]);
}

Test(cuda_ops, binary_ops_match_cpu_with_broadcasting) {
  need_gpu();
  static const nb_dtype mixed[][2] = {
      {NB_F32, NB_I32}, {NB_F16, NB_BF16}, {NB_I32, NB_I64}, {NB_BOOL, NB_F64}, {NB_BF16, NB_F32}};
  for (int o = 0; o < COUNT(binary_ops); o++) {
    for (int d = 0; d < COUNT(all_dtypes) + COUNT(mixed); d++) {
      nb_dtype a = d < COUNT(all_dtypes) ? all_dtypes[d] : mixed[d - COUNT(all_dtypes)][0];
      nb_dtype b = d < COUNT(all_dtypes) ? all_dtypes[d] : mixed[d - COUNT(all_dtypes)][1];
      if (binary_ops[o].f == nb_sub && nb_promote_types(a, b) == NB_BOOL) continue;
      const spec cases[][2] = {
          {SPEC(a, V_REAL, 3, 4), SPEC(b, V_REAL, 3, 4)},
          {SPEC(a, V_REAL, 3, 1), SPEC(b, V_REAL, 1, 4)},
          {strided(SPEC(a, V_REAL, 2, 5, 6)), SPEC(b, V_REAL, 6)},
          {SPEC0(a, V_REAL), strided(SPEC(b, V_REAL, 4, 3))},
          {SPEC(a, V_REAL, 0, 3), SPEC(b, V_REAL, 3)},
          {SPEC(a, V_SPECIAL, 64), SPEC(b, V_SPECIAL, 64)},
          {SPEC(a, V_REAL, 7, 1, 300), SPEC(b, V_TIES, 5, 300)},
      };
      for (int c = 0; c < COUNT(cases); c++)
        run_case(binary_ops[o].name, apply_binary, &binary_ops[o], 2, cases[c], 4, 200 + c);
    }
  }
}

static nb_tensor *apply_where(nb_tensor *const *x, const void *arg) {
  (void)arg;
  return nb_where(x[0], x[1], x[2]);
}

Test(cuda_ops, where_matches_cpu) {
  need_gpu();
  for (int d = 0; d < COUNT(all_dtypes); d++) {
    nb_dtype dt = all_dtypes[d];
    const spec c1[] = {SPEC(NB_BOOL, V_REAL, 3, 1), SPEC(dt, V_REAL, 1, 4), SPEC(dt, V_NAN, 3, 4)};
    const spec c2[] = {strided(SPEC(NB_BOOL, V_REAL, 5, 2)), SPEC0(dt, V_REAL),
                       SPEC(NB_F32, V_REAL, 2)};
    const spec c3[] = {SPEC(NB_BOOL, V_REAL, 0, 2), SPEC(dt, V_REAL, 2), SPEC(dt, V_REAL, 1)};
    run_case("where", apply_where, NULL, 3, c1, 1, 300);
    run_case("where", apply_where, NULL, 3, c2, 1, 301);
    run_case("where", apply_where, NULL, 3, c3, 1, 302);
  }
}

static nb_tensor *apply_cast(nb_tensor *const *x, const void *arg) {
  return nb_cast(x[0], *(const nb_dtype *)arg);
}

/* Float -> int saturates (NaN -> 0), int -> int wraps, f64 -> f16 rounds once. */
Test(cuda_ops, cast_between_every_pair_of_dtypes) {
  need_gpu();
  for (int s = 0; s < COUNT(all_dtypes); s++)
    for (int d = 0; d < COUNT(all_dtypes); d++) {
      char name[32];
      snprintf(name, sizeof name, "cast_to_%s", nb_dtype_name(all_dtypes[d]));
      const spec cases[] = {SPEC(all_dtypes[s], V_SPECIAL, 128),
                            strided(SPEC(all_dtypes[s], V_REAL, 3, 4)),
                            SPEC(all_dtypes[s], V_REAL, 0)};
      for (int c = 0; c < COUNT(cases); c++)
        run_case(name, apply_cast, &all_dtypes[d], 1, &cases[c], 1, 400 + c);
    }
}

/* u8, i8, i16: casts to and from every dtype, and the elementwise ops (same
 * and mixed dtypes, wrapping as the CPU); ops without a kernel for them are
 * NB_ERR_DEVICE errors naming the op, never a wrong answer. */
Test(cuda_ops, small_int_dtypes_cast_and_elementwise_match_cpu) {
  need_gpu();
  static const nb_dtype small[] = {NB_U8, NB_I8, NB_I16};
  static const nb_dtype every[] = {NB_F32, NB_F64,  NB_F16, NB_BF16, NB_I32,
                                   NB_I64, NB_BOOL, NB_U8,  NB_I8,   NB_I16};
  for (int s = 0; s < COUNT(every); s++)
    for (int d = 0; d < COUNT(every); d++) {
      if (s < 7 && d < 7) continue; /* cast_between_every_pair_of_dtypes */
      char name[32];
      snprintf(name, sizeof name, "cast_to_%s", nb_dtype_name(every[d]));
      const spec cases[] = {SPEC(every[s], V_SPECIAL, 128), strided(SPEC(every[s], V_REAL, 3, 4))};
      for (int c = 0; c < COUNT(cases); c++)
        run_case(name, apply_cast, &every[d], 1, &cases[c], 1, 500 + c);
    }
  static const binary_op ops[] = {{"add", nb_add},         {"sub", nb_sub}, {"mul", nb_mul},
                                  {"maximum", nb_maximum}, {"lt", nb_lt},   {"div", nb_div}};
  for (int o = 0; o < COUNT(ops); o++)
    for (int a = 0; a < COUNT(small); a++)
      for (int b = 0; b < COUNT(every); b++) {
        const spec cases[][2] = {
            {SPEC(small[a], V_SPECIAL, 64), SPEC(every[b], V_SPECIAL, 64)},
            {strided(SPEC(small[a], V_REAL, 4, 3)), SPEC(every[b], V_REAL, 3)},
        };
        for (int c = 0; c < COUNT(cases); c++)
          run_case(ops[o].name, apply_binary, &ops[o], 2, cases[c], 4, 600 + c);
      }
}

/* ---- reductions and axis ops --------------------------------------------------------------- */

typedef struct reduce_case {
  const char *name;
  nb_tensor *(*f)(nb_tensor *, nb_axes, bool);
  nb_tensor *(*arg_f)(nb_tensor *, int, bool); /* argmax / argmin */
  nb_axes axes;
  bool keepdims;
} reduce_case;
static nb_tensor *apply_reduce(nb_tensor *const *x, const void *arg) {
  const reduce_case *r = arg;
  if (r->arg_f) return r->arg_f(x[0], r->axes.v[0], r->keepdims);
  return r->f(x[0], r->axes, r->keepdims);
}

static const reduce_case reductions[] = {
    {"sum", nb_sum, NULL, {0}, false},       {"mean", nb_mean, NULL, {0}, false},
    {"prod", nb_prod, NULL, {0}, false},     {"max", nb_max, NULL, {0}, false},
    {"min", nb_min, NULL, {0}, false},       {"var", nb_var, NULL, {0}, false},
    {"std", nb_std, NULL, {0}, false},       {"logsumexp", nb_logsumexp, NULL, {0}, false},
    {"any", nb_any, NULL, {0}, false},       {"all", nb_all, NULL, {0}, false},
    {"argmax", NULL, nb_argmax, {0}, false}, {"argmin", NULL, nb_argmin, {0}, false},
};

/* Over any axes (leading, trailing, interleaved, all, none), keepdims or not,
 * strided inputs, long rows and columns, NaN, and zero-size reductions (sum
 * 0, mean NaN, prod 1, ...). */
Test(cuda_ops, reductions_over_any_axes_match_cpu) {
  need_gpu();
  const nb_axes axes[] = {NB_ALL, NB_AXES(0), NB_AXES(-1), NB_AXES(0, 2), NB_AXES(1), NB_NO_AXES};
  for (int o = 0; o < COUNT(reductions); o++)
    for (int d = 0; d < COUNT(all_dtypes); d++) {
      nb_dtype dt = all_dtypes[d];
      reduce_case r = reductions[o];
      bool arg = r.arg_f != NULL, ident = !arg && r.f != nb_max && r.f != nb_min;
      int vals = r.f == nb_prod ? V_POS : arg ? V_TIES : V_REAL;
      for (int a = 0; a < COUNT(axes); a++) {
        if (arg && (axes[a].n != 1)) continue; /* one axis */
        r.axes = axes[a];
        r.keepdims = a % 2;
        const spec cases[] = {SPEC(dt, vals, 3, 4, 5), strided(SPEC(dt, vals, 2, 3, 4)),
                              SPEC(dt, V_NAN, 4, 3, 6)};
        int n_cases = nb_dtype_is_float(dt) ? 3 : 2; /* NaN only where there is one */
        for (int c = 0; c < n_cases; c++)
          run_case(r.name, apply_reduce, &r, 1, &cases[c], 8, 500 + c);
      }
      r.axes = NB_AXES(-1);
      const spec rows[] = {SPEC(dt, vals, 2, 5000), SPEC(dt, vals, 0, 7)};
      for (int c = 0; c < COUNT(rows); c++)
        run_case(r.name, apply_reduce, &r, 1, &rows[c], 8, 510 + c);
      r.axes = NB_AXES(0);
      const spec cols = SPEC(dt, vals, 3000, 3);
      run_case(r.name, apply_reduce, &r, 1, &cols, 8, 520);
      if (ident) { /* zero-size reduced axis; a 0-d input */
        r.axes = NB_AXES(1);
        const spec empty = SPEC(dt, vals, 3, 0, 2);
        run_case(r.name, apply_reduce, &r, 1, &empty, 1, 530);
      }
      r.axes = arg ? NB_AXES(0) : NB_ALL;
      const spec scalar = arg ? SPEC(dt, vals, 1) : SPEC0(dt, vals);
      run_case(r.name, apply_reduce, &r, 1, &scalar, 1, 540);
    }
}

typedef struct axis_case {
  const char *name;
  nb_tensor *(*f)(nb_tensor *, int);
  int axis;
} axis_case;
static nb_tensor *apply_axis(nb_tensor *const *x, const void *arg) {
  const axis_case *a = arg;
  return a->f(x[0], a->axis);
}

/* softmax / log_softmax / cumsum along every axis (the axis need not be last),
 * long rows, NaN rows, zero-size. */
Test(cuda_ops, axis_ops_along_any_axis_match_cpu) {
  need_gpu();
  const axis_case ops[] = {
      {"softmax", nb_softmax, 0}, {"log_softmax", nb_log_softmax, 0}, {"cumsum", nb_cumsum, 0}};
  const int axes[] = {0, 1, 2, -1};
  for (int o = 0; o < COUNT(ops); o++)
    for (int d = 0; d < COUNT(all_dtypes); d++) {
      nb_dtype dt = all_dtypes[d];
      axis_case a = ops[o];
      for (int k = 0; k < COUNT(axes); k++) {
        a.axis = axes[k];
        const spec cases[] = {SPEC(dt, V_REAL, 3, 4, 5), strided(SPEC(dt, V_REAL, 2, 6, 3)),
                              SPEC(dt, V_NAN, 2, 3, 4), SPEC(dt, V_REAL, 0, 3, 2)};
        for (int c = 0; c < COUNT(cases); c++)
          run_case(a.name, apply_axis, &a, 1, &cases[c], 8, 600 + c);
      }
      a.axis = -1;
      const spec row = SPEC(dt, V_REAL, 3, 3000);
      run_case(a.name, apply_axis, &a, 1, &row, 8, 610);
      a.axis = 0;
      const spec col = SPEC(dt, V_REAL, 3000, 2);
      run_case(a.name, apply_axis, &a, 1, &col, 8, 611);
    }
}

/* ---- data movement ------------------------------------------------------------------------- */

static nb_tensor *apply_shape(nb_tensor *const *x, const void *arg) {
  int which = *(const int *)arg;
  static const int64_t starts[] = {1, 0, 4}, stops[] = {3, 5, 0}, steps[] = {1, 2, -2};
  static const int64_t pads[] = {1, 2, 0, 3, 2, 0};
  switch (which) {
  case 0: return nb_reshape(x[0], NB_SHAPE(-1)); /* of a transposed view: the copy path */
  case 1: return nb_reshape(x[0], NB_SHAPE(4, 1, -1));
  case 2: return nb_permute(x[0], NB_AXES(2, 0, 1));
  case 3: { /* x[:, 0:1, :] broadcast to [2, d0, 5, d2] */
    nb_shape s = nb_shape_of(x[0]);
    const int64_t lo[] = {0, 0, 0}, hi[] = {NB_END, 1, NB_END};
    return nb_broadcast_to(nb_slice(x[0], lo, hi, NULL), NB_SHAPE(2, s.dims[0], 5, s.dims[2]));
  }
  case 4: return nb_slice(x[0], starts, stops, steps);
  case 5: return nb_flip(x[0], NB_AXES(0, 2));
  case 6: return nb_pad(x[0], pads, 7.5);
  case 7: return nb_tile(x[0], NB_SHAPE(2, 1, 2));
  case 8: return nb_repeat(x[0], 3, 1);
  default: return nb_add(nb_detach(x[0]), nb_detach(x[0]));
  }
}

Test(cuda_ops, shape_ops_match_cpu) {
  need_gpu();
  for (int d = 0; d < COUNT(all_dtypes); d++) {
    nb_dtype dt = all_dtypes[d];
    for (int which = 0; which < 10; which++) {
      const spec cases[] = {strided(SPEC(dt, V_REAL, 3, 4, 3)), SPEC(dt, V_REAL, 4, 5, 3)};
      for (int c = 0; c < COUNT(cases); c++)
        run_case("shape", apply_shape, &which, 1, &cases[c], 1, 700 + which);
    }
  }
}

static nb_tensor *apply_concat(nb_tensor *const *x, const void *arg) {
  return nb_concat(x, 3, *(const int *)arg);
}

Test(cuda_ops, concat_promotes_and_skips_empty_parts) {
  need_gpu();
  static const nb_dtype trios[][3] = {{NB_F32, NB_I32, NB_F16},
                                      {NB_I64, NB_BOOL, NB_I32},
                                      {NB_BF16, NB_BF16, NB_BF16},
                                      {NB_BOOL, NB_BOOL, NB_BOOL},
                                      {NB_F64, NB_F32, NB_I64}};
  for (int t = 0; t < COUNT(trios); t++) {
    const nb_dtype *k = trios[t];
    int ax0 = 0, ax1 = 1;
    const spec a[] = {SPEC(k[0], V_REAL, 2, 3), SPEC(k[1], V_REAL, 0, 3),
                      strided(SPEC(k[2], V_REAL, 4, 3))};
    const spec b[] = {SPEC(k[0], V_REAL, 2, 1), SPEC(k[1], V_REAL, 2, 5), SPEC(k[2], V_REAL, 2, 0)};
    run_case("concat", apply_concat, &ax0, 3, a, 1, 800);
    run_case("concat", apply_concat, &ax1, 3, b, 1, 801);
  }
}

/* ---- indexing ------------------------------------------------------------------------------- */

typedef struct index_case {
  int op, axis;
} index_case;
static nb_tensor *apply_index(nb_tensor *const *x, const void *arg) {
  const index_case *k = arg;
  switch (k->op) {
  case 0: return nb_take(x[0], x[1], k->axis);
  case 1: return nb_take_along_axis(x[0], x[1], k->axis);
  case 2: return nb_scatter_add(x[0], x[1], x[2], k->axis);
  case 3: return nbi_scatter_add_along_axis(x[0], x[1], x[2], k->axis);
  default: return nb_one_hot(x[0], 6, nb_dtype_of(x[1]));
  }
}
static spec index_spec(nb_dtype dt, int64_t range, nb_shape s) {
  return (spec){.s = s, .dt = dt, .values = V_INDEX, .range = range};
}

/* Negative indices, strided data, several index shapes, repeated indices for
 * the scatters (ordered and atomic paths), broadcast along-axis operands, every
 * dtype (u8, i8 and i16 scatter through an i32 accumulator). */
Test(cuda_ops, index_ops_match_cpu) {
  need_gpu();
  static const nb_dtype dts[] = {NB_F32, NB_F64,  NB_F16, NB_BF16, NB_I32,
                                 NB_I64, NB_BOOL, NB_U8,  NB_I8,   NB_I16};
  for (int d = 0; d < COUNT(dts); d++) {
    nb_dtype dt = dts[d], it = d % 2 ? NB_I64 : NB_I32;
    index_case k = {0, 0};
    /* take: t [5, 4, 3] along each axis, idx of several shapes */
    const nb_shape ishapes[] = {NB_SHAPE(6), NB_SHAPE(2, 3), NB_SCALAR_SHAPE, NB_SHAPE(0)};
    for (int ax = 0; ax < 3; ax++)
      for (int s = 0; s < COUNT(ishapes); s++) {
        k = (index_case){0, ax};
        const int64_t size[] = {5, 4, 3};
        const spec c[] = {strided(SPEC(dt, V_REAL, 5, 4, 3)), index_spec(it, size[ax], ishapes[s])};
        run_case("take", apply_index, &k, 2, c, 1, 900 + s);
      }
    /* take_along_axis with broadcasting of t's and idx's extent-1 dims */
    k = (index_case){1, 1};
    const spec al1[] = {SPEC(dt, V_REAL, 3, 5, 4), index_spec(it, 5, NB_SHAPE(3, 7, 4))};
    const spec al2[] = {SPEC(dt, V_REAL, 1, 5, 4), index_spec(it, 5, NB_SHAPE(3, 2, 1))};
    run_case("take_along_axis", apply_index, &k, 2, al1, 1, 910);
    run_case("take_along_axis", apply_index, &k, 2, al2, 1, 911);
    /* scatter_add: many repeated indices; outer*inner small and K large takes
     * the atomic path for floats */
    double sc = nb_dtype_is_float(dt) ? 8 : 1;
    k = (index_case){2, 1};
    const spec s1[] = {SPEC(dt, V_REAL, 3, 5, 2), index_spec(it, 5, NB_SHAPE(4, 3)),
                       strided(SPEC(dt, V_REAL, 3, 4, 3, 2))};
    run_case("scatter_add", apply_index, &k, 3, s1, sc, 920);
    k = (index_case){2, 0};
    const spec s2[] = {SPEC(dt, V_REAL, 10, 8), index_spec(it, 10, NB_SHAPE(1000)),
                       SPEC(dt, V_TIES, 1000, 8)};
    run_case("scatter_add", apply_index, &k, 3, s2, sc, 921);
    /* scatter_add_along_axis, t's extent-1 dims summing the broadcast updates */
    k = (index_case){3, 1};
    const spec s3[] = {SPEC(dt, V_REAL, 3, 5, 4), index_spec(it, 5, NB_SHAPE(3, 7, 4)),
                       SPEC(dt, V_REAL, 3, 7, 4)};
    const spec s4[] = {SPEC(dt, V_REAL, 1, 5, 4), index_spec(it, 5, NB_SHAPE(3, 2, 1)),
                       strided(SPEC(dt, V_REAL, 3, 2, 4))};
    run_case("scatter_add_along_axis", apply_index, &k, 3, s3, sc, 930);
    run_case("scatter_add_along_axis", apply_index, &k, 3, s4, sc, 931);
    /* one_hot: indices outside [0, 6) give zero rows; x[1] names the dtype */
    k = (index_case){4, 0};
    const spec oh[] = {strided(index_spec(it, 8, NB_SHAPE(4, 5))), SPEC0(dt, V_REAL)};
    run_case("one_hot", apply_index, &k, 2, oh, 1, 940);
  }
}

/* An index out of range is found by the kernel and reported at the read:
 * NB_ERR_INDEX naming the op, on nb_to_host. */
static void expect_index_error(const char *name, int op, int axis, int n, const spec *sp) {
  uint64_t seed = 950;
  nb_tensor *x[3];
  for (int k = 0; k < n; k++) {
    double *v = gen_values(&sp[k], &seed);
    if (sp[k].values == V_INDEX) v[tc_numel(sp[k].s) - 1] = op % 2 ? -(double)sp[k].range - 1 : 99;
    x[k] = make_input(&sp[k], v, true);
    free(v);
  }
  index_case k = {op, axis};
  nb_tensor *y = apply_index(x, &k);
  cr_assert(y, "%s: the op itself must succeed: %s", name, nb_last_error());
  size_t nbytes = (size_t)nb_numel(y) * nb_dtype_size(nb_dtype_of(y));
  void *buf = malloc(nbytes ? nbytes : 1);
  nb_status st = nb_to_host(y, buf, nbytes);
  free(buf);
  cr_assert_eq(st, NB_ERR_INDEX, "%s: nb_to_host gave %s (%s), expected an index error", name,
               nb_status_str(st), nb_last_error());
  cr_assert(strstr(nb_last_error(), name), "%s: the message \"%s\" does not name the op", name,
            nb_last_error());
  nb_clear_error();
}

Test(cuda_ops, out_of_range_indices_fail_at_the_read_naming_the_op) {
  need_gpu();
  const spec take[] = {SPEC(NB_F32, V_REAL, 5, 3), index_spec(NB_I64, 5, NB_SHAPE(4))};
  const spec along[] = {SPEC(NB_F32, V_REAL, 5, 3), index_spec(NB_I32, 3, NB_SHAPE(5, 2))};
  const spec scat[] = {SPEC(NB_F32, V_REAL, 5, 3), index_spec(NB_I32, 5, NB_SHAPE(4)),
                       SPEC(NB_F32, V_REAL, 4, 3)};
  const spec scat_al[] = {SPEC(NB_I64, V_REAL, 5, 3), index_spec(NB_I64, 3, NB_SHAPE(5, 2)),
                          SPEC(NB_I64, V_REAL, 5, 2)};
  expect_index_error("take", 0, 0, 2, take);
  expect_index_error("take_along_axis", 1, 1, 2, along);
  expect_index_error("scatter_add", 2, 0, 3, scat);
  expect_index_error("scatter_add_along_axis", 3, 1, 3, scat_al);
}

/* nb_cross_entropy's labels and nb_embedding's rows are class and row numbers:
 * out of range or negative, the kernel's error names the composite (its caller
 * code, src/ops/index.h), also for the gradient's scatter. */
Test(cuda_ops, composite_index_errors_name_the_composite) {
  need_gpu();
  nb_tensor *logits =
      nb_set_requires_grad(nb_to_device(nb_randn(NB_SHAPE(2, 3), NB_F32), NB_CUDA(0)), true);
  nb_tensor *table = nb_to_device(nb_randn(NB_SHAPE(3, 2), NB_F32), NB_CUDA(0));
  int64_t bad[2][2] = {{0, 3}, {-1, 1}};
  for (int k = 0; k < 2; k++) {
    nb_tensor *labels = nb_to_device(nb_from_data(bad[k], NB_SHAPE(2), NB_I64), NB_CUDA(0));
    nb_tensor *loss = nb_cross_entropy(logits, labels);
    cr_assert(loss, "%s", nb_last_error());
    cr_assert_eq(nb_backward(loss), NB_ERR_INDEX, "labels %d: %s", k, nb_last_error());
    /* the CPU's messages: the bad label or row itself */
    tc_assert_error(NB_ERR_INDEX, k ? "nb_cross_entropy: label -1 is not a class of [0, 3)"
                                    : "nb_cross_entropy: label 3 is not a class of [0, 3)");
    nb_tensor *rows = nb_embedding(table, labels);
    cr_assert_eq(nb_eval(&rows, 1), NB_ERR_INDEX, "rows %d: %s", k, nb_last_error());
    tc_assert_error(NB_ERR_INDEX, k ? "nb_embedding: index -1 is not a row of [0, 3)"
                                    : "nb_embedding: index 3 is not a row of [0, 3)");
  }
  nb_tensor *good = nb_to_device(nb_from_data((int64_t[]){2, 0}, NB_SHAPE(2), NB_I64), NB_CUDA(0));
  cr_assert_eq(nb_backward(nb_cross_entropy(logits, good)), NB_OK, "%s", nb_last_error());
}

/* ---- NN ------------------------------------------------------------------------------------- */

typedef struct conv_case {
  int64_t n, c, h, w, o, kh, kw;
  int sh, sw, ph, pw, dh, dw, groups;
  bool bias;
} conv_case;
static const conv_case conv_cases[] = {
    {2, 3, 7, 6, 4, 3, 2, 1, 1, 0, 0, 1, 1, 1, true},
    {3, 4, 9, 8, 6, 3, 3, 2, 1, 1, 2, 2, 1, 2, false},
    {2, 6, 5, 5, 9, 1, 1, 1, 1, 0, 0, 1, 1, 3, true},
    {4, 5, 6, 7, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, false},
    {1, 2, 4, 4, 2, 5, 5, 1, 1, 2, 2, 1, 1, 1, true},
    {0, 2, 4, 4, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1, false},
    {5, 8, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, false},
};

static nbi_attrs conv_attrs(const conv_case *k) {
  nbi_attrs at = {0};
  at.i[NBI_CONV_STRIDE] = k->sh, at.i[NBI_CONV_STRIDE + 1] = k->sw;
  at.i[NBI_CONV_PAD] = k->ph, at.i[NBI_CONV_PAD + 1] = k->pw;
  at.i[NBI_CONV_DILATION] = k->dh, at.i[NBI_CONV_DILATION + 1] = k->dw;
  at.i[NBI_CONV_GROUPS] = k->groups;
  return at;
}

typedef struct conv_apply {
  const conv_case *k;
  int which; /* 0 conv2d, 1 bwd_data, 2 bwd_filter */
} conv_apply;
static nb_tensor *apply_conv(nb_tensor *const *x, const void *arg) {
  const conv_apply *a = arg;
  const conv_case *k = a->k;
  nb_conv2d_params p = {{k->sh, k->sw}, {k->ph, k->pw}, {k->dh, k->dw}, k->groups};
  nbi_attrs at = conv_attrs(k);
  if (a->which == 0) return nb_conv2d(x[0], x[1], k->bias ? x[2] : NULL, &p);
  if (a->which == 1) return nbi_conv2d_bwd_data(x[0], x[1], &at, k->h, k->w);
  return nbi_conv2d_bwd_filter(x[0], x[1], &at, k->kh, k->kw);
}

/* conv2d, its data and filter gradients: strides, padding, dilation, groups
 * (depthwise too), 1x1 in place, bias, an empty batch; also with a tiny
 * column budget so every image is its own chunk. */
Test(cuda_ops, conv2d_and_its_gradients_match_cpu) {
  need_gpu();
  for (int budget = 0; budget < 2; budget++) {
    if (budget) setenv("NABLA_CUDA_COL_BYTES", "64", 1);
    for (int i = 0; i < COUNT(conv_cases); i++)
      for (int d = 0; d < COUNT(float_dtypes); d++) {
        const conv_case *k = &conv_cases[i];
        nb_dtype dt = float_dtypes[d];
        int64_t oh = (k->h + 2 * k->ph - k->dh * (k->kh - 1) - 1) / k->sh + 1;
        int64_t ow = (k->w + 2 * k->pw - k->dw * (k->kw - 1) - 1) / k->sw + 1;
        spec x = SPEC(dt, V_REAL, k->n, k->c, k->h, k->w);
        spec w = SPEC(dt, V_REAL, k->o, k->c / k->groups, k->kh, k->kw);
        spec dy = SPEC(dt, V_REAL, k->n, k->o, oh, ow);
        const spec fwd[] = {i % 2 ? strided(x) : x, w, SPEC(dt, V_REAL, k->o)};
        const spec bwd_data[] = {dy, i % 2 ? strided(w) : w};
        const spec bwd_filter[] = {x, i % 2 ? strided(dy) : dy};
        conv_apply a = {k, 0};
        run_case("conv2d", apply_conv, &a, k->bias ? 3 : 2, fwd, 8, 1000 + i);
        a.which = 1;
        run_case("conv2d_bwd_data", apply_conv, &a, 2, bwd_data, 8, 1010 + i);
        a.which = 2;
        run_case("conv2d_bwd_filter", apply_conv, &a, 2, bwd_filter, 8, 1020 + i);
      }
  }
  unsetenv("NABLA_CUDA_COL_BYTES");
}

typedef struct pool_case {
  int64_t n, c, h, w;
  int kh, kw, sh, sw, ph, pw;
} pool_case;
typedef struct pool_apply {
  const pool_case *k;
  int which; /* 0 max_pool2d, 1 bwd, 2 select */
} pool_apply;
static nb_tensor *apply_pool(nb_tensor *const *x, const void *arg) {
  const pool_apply *a = arg;
  const pool_case *k = a->k;
  nbi_attrs at = {0};
  at.i[NBI_POOL_KERNEL] = k->kh, at.i[NBI_POOL_KERNEL + 1] = k->kw;
  at.i[NBI_POOL_STRIDE] = k->sh, at.i[NBI_POOL_STRIDE + 1] = k->sw;
  at.i[NBI_POOL_PAD] = k->ph, at.i[NBI_POOL_PAD + 1] = k->pw;
  if (a->which == 0) return nb_max_pool2d(x[0], k->kh, k->kw, k->sh, k->sw, k->ph, k->pw);
  if (a->which == 1) return nbi_max_pool2d_bwd(x[0], x[1], &at);
  return nbi_max_pool2d_select(x[0], x[1], &at);
}

/* Max pooling and its routes: ties (the first maximum wins), NaN (the first
 * NaN wins), padding, overlapping windows summing in the backward. */
Test(cuda_ops, max_pool2d_and_its_routes_match_cpu) {
  need_gpu();
  static const pool_case cases[] = {{2, 3, 6, 7, 2, 2, 2, 2, 0, 0},
                                    {2, 2, 7, 7, 3, 3, 2, 2, 1, 1},
                                    {1, 3, 5, 6, 3, 2, 1, 1, 1, 1},
                                    {3, 1, 4, 9, 1, 3, 1, 2, 0, 1},
                                    {0, 2, 4, 4, 2, 2, 2, 2, 0, 0}};
  for (int i = 0; i < COUNT(cases); i++)
    for (int d = 0; d < COUNT(float_dtypes); d++)
      for (int v = 0; v < 2; v++) {
        const pool_case *k = &cases[i];
        nb_dtype dt = float_dtypes[d];
        int vals = v ? V_NAN : V_TIES;
        int64_t oh = (k->h + 2 * k->ph - k->kh) / k->sh + 1;
        int64_t ow = (k->w + 2 * k->pw - k->kw) / k->sw + 1;
        spec x = SPEC(dt, vals, k->n, k->c, k->h, k->w);
        const spec fwd[] = {v ? strided(x) : x};
        const spec bwd[] = {x, SPEC(float_dtypes[(d + 1) % 4], V_REAL, k->n, k->c, oh, ow)};
        const spec sel[] = {x, strided(SPEC(dt, V_REAL, k->n, k->c, k->h, k->w))};
        pool_apply a = {k, 0};
        run_case("max_pool2d", apply_pool, &a, 1, fwd, 1, 1100 + i);
        a.which = 1;
        run_case("max_pool2d_bwd", apply_pool, &a, 2, bwd, 2, 1110 + i);
        a.which = 2;
        run_case("max_pool2d_select", apply_pool, &a, 2, sel, 1, 1120 + i);
      }
}

/* ---- matmul -------------------------------------------------------------------------------- */

static nb_tensor *apply_matmul(nb_tensor *const *x, const void *arg) {
  (void)arg;
  return nb_matmul(x[0], x[1]);
}

Test(cuda_ops, matmul_matches_cpu_for_every_dtype) {
  need_gpu();
  for (int d = 0; d < COUNT(all_dtypes); d++) {
    nb_dtype dt = all_dtypes[d];
    const spec cases[][2] = {
        {SPEC(dt, V_REAL, 3, 4), SPEC(dt, V_REAL, 4, 5)},
        {strided(SPEC(dt, V_REAL, 2, 1, 3, 4)), SPEC(dt, V_REAL, 5, 4, 6)},
        {SPEC(dt, V_REAL, 4), SPEC(dt, V_REAL, 4, 3)},
        {strided(SPEC(dt, V_REAL, 3, 4)), SPEC(dt, V_REAL, 4)},
        {SPEC(dt, V_REAL, 3, 0), SPEC(dt, V_REAL, 0, 4)},
        {SPEC(dt, V_REAL, 0, 4), SPEC(dt, V_REAL, 4, 2)},
        {SPEC(dt, V_REAL, 65, 130), strided(SPEC(dt, V_REAL, 130, 33))},
    };
    for (int c = 0; c < COUNT(cases); c++)
      run_case("matmul", apply_matmul, NULL, 2, cases[c], 8, 1200 + c);
  }
}

/* u8, i8, i16 through the other kernels: reductions (sums, products and cumsums
 * in i64, max / min in the dtype), matmul (wrapping), as the CPU. The index ops
 * take them in cuda_ops::index_ops_match_cpu. */
static nb_tensor *apply_small_cumsum(nb_tensor *const *x, const void *arg) {
  return nb_cumsum(x[0], *(const int *)arg);
}
Test(cuda_ops, small_int_dtypes_reduce_and_multiply_as_the_cpu) {
  need_gpu();
  static const nb_dtype small[] = {NB_U8, NB_I8, NB_I16};
  static const reduce_case red[] = {
      {"sum", nb_sum, NULL, {1, {1}}, false},       {"sum", nb_sum, NULL, {-1, {0}}, false},
      {"prod", nb_prod, NULL, {1, {0}}, true},      {"max", nb_max, NULL, {1, {1}}, false},
      {"min", nb_min, NULL, {1, {0}}, false},       {"mean", nb_mean, NULL, {1, {1}}, false},
      {"argmax", NULL, nb_argmax, {1, {1}}, false}, {"argmin", NULL, nb_argmin, {1, {0}}, false},
  };
  for (int a = 0; a < COUNT(small); a++) {
    for (int r = 0; r < COUNT(red); r++) {
      const spec c[] = {SPEC(small[a], V_SPECIAL, 7, 33), strided(SPEC(small[a], V_REAL, 5, 9))};
      for (int k = 0; k < COUNT(c); k++)
        run_case(red[r].name, apply_reduce, &red[r], 1, &c[k], 1, 700 + k);
    }
    for (int ax = 0; ax < 2; ax++) {
      const spec c = strided(SPEC(small[a], V_SPECIAL, 6, 40));
      run_case("cumsum", apply_small_cumsum, &ax, 1, &c, 1, 710);
    }
    const spec mm[] = {SPEC(small[a], V_REAL, 3, 5, 7), strided(SPEC(small[a], V_SPECIAL, 7, 4))};
    run_case("matmul", apply_matmul, NULL, 2, mm, 1, 720);
  }
}

/* ---- random ---------------------------------------------------------------------------------- */

/* Draws from keys on the CPU and on CUDA: the same numbers bit for bit (tolerance 0), for every
 * float dtype, split keys (the raw words), bernoulli and a batch of keys (vmap), with more
 * elements than one grid covers. The normal composite goes through log, sqrt and cos, whose
 * CUDA versions differ from the CPU's libm in the last bit (seen on an H100: 24 of 132 f64
 * draws): its uniforms are the same bits, its values agree to f64's test tolerance. */
static nb_status vmap_draw_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_random_uniform(in[0], NB_SHAPE(3, 5), NB_F32);
  return out[0] ? NB_OK : nb_last_status();
}

Test(cuda_ops, random_draws_match_cpu_bit_for_bit) {
  need_gpu();
  nb_tensor *key[2];
  for (int g = 0; g < 2; g++) {
    key[g] = nb_key(0x1234567890abcdefull);
    if (g) key[g] = nb_to_device(key[g], NB_CUDA(0));
    cr_assert(key[g], "%s", nb_last_error());
  }
  const nb_shape shapes[] = {NB_SHAPE(7), NB_SHAPE(3, 1000), NB_SHAPE(0, 4), NB_SHAPE(1 << 19)};
  char what[128];
  for (int d = 0; d < COUNT(float_dtypes); d++)
    for (int k = 0; k < COUNT(shapes); k++) {
      snprintf(what, sizeof what, "random_uniform %s shape %d", nb_dtype_name(float_dtypes[d]), k);
      compare(what, nb_random_uniform(key[0], shapes[k], float_dtypes[d]),
              nb_random_uniform(key[1], shapes[k], float_dtypes[d]), 0);
    }
  nb_tensor *split[2][5];
  for (int g = 0; g < 2; g++)
    cr_assert_eq(nb_key_split(key[g], 5, split[g]), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 5; i++) {
    snprintf(what, sizeof what, "key_split %d", i);
    compare(what, split[0][i], split[1][i], 0);
  }
  compare("random_normal f64", nb_random_normal(split[0][3], NB_SHAPE(4, 33), NB_F64),
          nb_random_normal(split[1][3], NB_SHAPE(4, 33), NB_F64), 1);
  compare("random_bernoulli", nb_random_bernoulli(split[0][4], 0.3, NB_SHAPE(999)),
          nb_random_bernoulli(split[1][4], 0.3, NB_SHAPE(999)), 0);
  /* a batch of keys, one of them a column of a transposed view (strided keys) */
  nb_fn *f = nb_fn_create(vmap_draw_body, NULL, 1, 1), *v = nb_vmap(f, (int[]){0}, NULL);
  nb_tensor *out[2][1];
  for (int g = 0; g < 2; g++) {
    nb_tensor *keys = nb_stack((nb_tensor *[]){split[g][0], split[g][1], split[g][2]}, 3, 1);
    keys = nb_transpose(keys); /* [3, 2], strided */
    cr_assert_eq(nb_call(v, &keys, out[g]), NB_OK, "%s", nb_last_error());
  }
  compare("vmap random_uniform over strided keys", out[0][0], out[1][0], 0);
  nb_fn_release(v);
  nb_fn_release(f);
}

/* ---- gradients ------------------------------------------------------------------------------- */

/* Bodies of one output each (a scalar), in f64. */
static nb_status body_matmul(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_tanh(nb_matmul(in[0], in[1])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status body_softmax(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *s = nb_softmax(in[0], 0);
  out[0] = nb_sum(nb_mul(s, nb_sin(in[0])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status body_conv(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_conv2d_params p = {{2, 1}, {1, 1}, {1, 2}, 1};
  out[0] = nb_sum(nb_square(nb_conv2d(in[0], in[1], in[2], &p)), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status body_take(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_square(nb_take(in[0], in[1], 0)), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status body_layer_norm(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                 int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_sin(nb_layer_norm(in[0], in[1], in[2], 1e-5)), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* value_and_grad of f by its first n_diff inputs at inputs drawn for
 * sp[0..n) on the CPU and on CUDA (with CUDA the default device while it
 * runs, so constants made inside the transforms land there too). */
static void check_grad(const char *name, nb_fn_body body, int n, int n_diff, const spec *sp) {
  nb_fn *f = nb_fn_create(body, NULL, n, 1);
  nb_axes argnums = {.n = n_diff};
  for (int k = 0; k < n_diff; k++)
    argnums.v[k] = k;
  nb_fn *vg = nb_value_and_grad(f, argnums);
  nb_fn_release(f);
  cr_assert(vg, "%s: %s", name, nb_last_error());
  uint64_t seed = 1300;
  nb_tensor *cpu[4], *gpu[4], *rc[5], *rg[5];
  for (int k = 0; k < n; k++) {
    double *x = gen_values(&sp[k], &seed);
    cpu[k] = make_input(&sp[k], x, false);
    gpu[k] = make_input(&sp[k], x, true);
    free(x);
  }
  cr_assert_eq(nb_call(vg, cpu, rc), NB_OK, "%s on the CPU: %s", name, nb_last_error());
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK, "%s", nb_last_error());
  nb_status st = nb_call(vg, gpu, rg);
  if (st == NB_OK) st = nb_eval(rg, n_diff + 1);
  nb_set_default_device(NB_CPU);
  cr_assert_eq(st, NB_OK, "%s on CUDA: %s", name, nb_last_error());
  for (int k = 0; k <= n_diff; k++) {
    char what[128];
    snprintf(what, sizeof what, "grad %s: %s %d", name, k ? "d/dinput" : "value", k - 1);
    compare(what, rc[k], rg[k], 1000);
  }
  nb_fn_release(vg);
}

Test(cuda_ops, gradients_through_cuda_match_cpu) {
  need_gpu();
  const spec mm[] = {SPEC(NB_F64, V_REAL, 5, 7), strided(SPEC(NB_F64, V_REAL, 7, 3))};
  const spec sm[] = {SPEC(NB_F64, V_REAL, 6, 4)};
  const spec cv[] = {SPEC(NB_F64, V_REAL, 2, 3, 6, 5), SPEC(NB_F64, V_REAL, 4, 3, 3, 2),
                     SPEC(NB_F64, V_REAL, 4)};
  const spec tk[] = {SPEC(NB_F64, V_REAL, 5, 3), index_spec(NB_I64, 5, NB_SHAPE(2, 6))};
  const spec ln[] = {SPEC(NB_F64, V_REAL, 4, 8), SPEC(NB_F64, V_REAL, 8), SPEC(NB_F64, V_REAL, 8)};
  check_grad("matmul", body_matmul, 2, 2, mm);
  check_grad("softmax", body_softmax, 1, 1, sm);
  check_grad("conv2d", body_conv, 3, 3, cv);
  check_grad("take", body_take, 2, 1, tk);
  check_grad("layer_norm", body_layer_norm, 3, 3, ln);
}

/* ---- the table (no GPU needed) ------------------------------------------------------------------
 */

/* Every op with a CPU kernel has a CUDA path for some dtype, except the ops
 * core runs itself; those and the pure bookkeeping ops have none. */
Test(cuda_ops, supports_covers_every_op_with_a_cpu_kernel) {
  static const int core_ops[] = {NBI_OP_CONST,      NBI_OP_PLACEHOLDER,
                                 NBI_OP_TUPLE_GET,  NBI_OP_COND,
                                 NBI_OP_WHILE,      NBI_OP_SCAN,
                                 NBI_OP_REMAT,      NBI_OP_CUSTOM,
                                 NBI_OP_SHARD_MAP,  NBI_OP_SHARD_CONSTRAINT,
                                 NBI_OP_SHARD_LIKE, NBI_OP_ALL_REDUCE,
                                 NBI_OP_ALL_GATHER, NBI_OP_REDUCE_SCATTER,
                                 NBI_OP_ALL_TO_ALL, NBI_OP_PPERMUTE,
                                 NBI_OP_AXIS_INDEX};
  bool core[NBI_OP_COUNT] = {0};
  for (int k = 0; k < COUNT(core_ops); k++)
    core[core_ops[k]] = true;
  for (int op = 0; op < NBI_OP_COUNT; op++) {
    bool any = false;
    for (int d = 0; d < COUNT(all_dtypes); d++)
      any |= nbi_cuda_supports(NULL, op, all_dtypes[d]);
    if (core[op])
      cr_assert(!any, "%s: core runs it; CUDA must not claim it", nbi_op_table[op]->name);
    else if (nbi_cpu_kernel_of(op))
      cr_assert(any, "%s has a CPU kernel but no CUDA path", nbi_op_table[op]->name);
  }
  cr_assert(nbi_cuda_supports(NULL, NBI_OP_CONV2D, NB_BF16));
  cr_assert(!nbi_cuda_supports(NULL, NBI_OP_CONV2D, NB_I32));
  cr_assert(nbi_cuda_supports(NULL, NBI_OP_ARGMAX, NB_I64));
  cr_assert(!nbi_cuda_supports(NULL, NBI_OP_SOFTMAX, NB_BOOL));
  cr_assert(!nbi_cuda_supports(NULL, -1, NB_F32));
  cr_assert(!nbi_cuda_supports(NULL, NBI_OP_ADD, NB_DTYPE_COUNT));
}

#endif /* NABLA_CUDA */
