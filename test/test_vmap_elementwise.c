/* test/test_vmap_elementwise.c — batching rules of the elementwise ops
 * (unary, scalar forms, binary, comparisons, logic, where, clip, cast) and of
 * the reductions (sum mean prod max min var std logsumexp any all argmax argmin
 * softmax log_softmax cumsum). Every check compares nb_vmap(f) with a loop of f
 * over the examples (each mapped input sliced, f called, the results stacked)
 * on random inputs: exact for integer and bool results, to 1e-6 in f32 and
 * 1e-12 in f64. Covered: in_axes 0, 1 and negative, unmapped inputs, mapped
 * inputs of different per-example ranks, out_axes other than 0, 0-d examples,
 * empty examples, keepdims, NB_ALL / NB_NO_AXES, integer and bool dtypes,
 * vmap of vmap, vmap of nb_grad (per-example gradients), nb_grad of a vmap,
 * and the op table. */
#include "common.h"
#include "../src/core/oprules.h"

TestSuite(vmap_ew, .init = tc_setup, .fini = tc_teardown);

enum { MAX_IO = 4, MAX_B = 16, VB = 5 /* batch size of most checks */ };

static int norm_axis(int a, int ndim) { return a < 0 ? a + ndim : a; }

/* ---- the reference: a loop of f over the examples ------------------------------------ */
typedef struct looped {
  nb_fn *f;
  int in_axes[MAX_IO], out_axes[MAX_IO];
} looped;

/* Example b of x along axis a (the axis dropped). */
static nb_tensor *example(nb_tensor *x, int a, int64_t b) {
  nb_shape s = nb_shape_of(x);
  int64_t starts[NB_MAX_DIMS] = {0}, stops[NB_MAX_DIMS];
  for (int d = 0; d < s.ndim; d++)
    stops[d] = s.dims[d];
  starts[a] = b;
  stops[a] = b + 1;
  return nb_squeeze(nb_slice(x, starts, stops, NULL), NB_AXES(a));
}

/* body: calls l->f on every example of the mapped inputs and stacks each
 * output's results along its out axis. */
static nb_status loop_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  const looped *l = user;
  int64_t nb = 0;
  for (int k = 0; k < n_in; k++)
    if (l->in_axes[k] != NB_NOT_MAPPED) {
      nb_shape s = nb_shape_of(in[k]);
      nb = s.dims[norm_axis(l->in_axes[k], s.ndim)];
    }
  cr_assert(nb >= 1 && nb <= MAX_B);
  nb_tensor *rows[MAX_IO][MAX_B], *x[MAX_IO], *y[MAX_IO];
  for (int64_t b = 0; b < nb; b++) {
    for (int k = 0; k < n_in; k++) {
      int a = l->in_axes[k];
      x[k] = a == NB_NOT_MAPPED ? in[k] : example(in[k], norm_axis(a, nb_ndim(in[k])), b);
    }
    nb_status st = nb_call(l->f, x, y);
    if (st) return st;
    for (int j = 0; j < n_out; j++)
      rows[j][b] = y[j];
  }
  for (int j = 0; j < n_out; j++)
    if (!(out[j] = nb_stack(rows[j], (int)nb, norm_axis(l->out_axes[j], nb_ndim(rows[j][0]) + 1))))
      return nb_last_status();
  return NB_OK;
}

/* ---- comparing --------------------------------------------------------------------- */
static double tol_of(nb_dtype dt) { return dt == NB_F32 ? 1e-6 : dt == NB_F64 ? 1e-12 : 0; }

/* got and ref: same dtype and shape, values equal within tol_of (NaN matches NaN). */
static void assert_same(nb_tensor *got, nb_tensor *ref, const char *ctx) {
  cr_assert(got && ref, "%s: NULL result: %s", ctx, nb_last_error());
  cr_assert_eq(nb_dtype_of(got), nb_dtype_of(ref), "%s: dtype %s, expected %s", ctx,
               nb_dtype_name(nb_dtype_of(got)), nb_dtype_name(nb_dtype_of(ref)));
  nb_shape gs = nb_shape_of(got), rs = nb_shape_of(ref);
  char a[160], b[160];
  cr_assert(nbi_shape_eq(&gs, &rs), "%s: shape %s, expected %s", ctx, nb_shape_str(gs, a, sizeof a),
            nb_shape_str(rs, b, sizeof b));
  double *g = tc_read(got), *r = tc_read(ref), tol = tol_of(nb_dtype_of(ref));
  for (int64_t i = 0; i < nb_numel(ref); i++) {
    bool ok = isnan(r[i])   ? isnan(g[i])
              : isinf(r[i]) ? g[i] == r[i]
                            : fabs(g[i] - r[i]) <= tol * (1 + fabs(r[i]));
    cr_assert(ok, "%s: element %lld is %.17g, expected %.17g (%s)", ctx, (long long)i, g[i], r[i],
              nb_dtype_name(nb_dtype_of(ref)));
  }
  free(g);
  free(r);
}

/* Calls both functions on in and compares every output. */
static void check_fns(nb_fn *got_fn, nb_fn *ref_fn, nb_tensor *const *in, const char *ctx) {
  cr_assert(got_fn && ref_fn, "%s: %s", ctx, nb_last_error());
  int n_out = nb_fn_n_out(ref_fn);
  cr_assert_eq(nb_fn_n_out(got_fn), n_out);
  nb_tensor *got[MAX_IO], *ref[MAX_IO];
  nb_scope_begin();
  cr_assert_eq(nb_call(got_fn, in, got), NB_OK, "%s: %s", ctx, nb_last_error());
  cr_assert_eq(nb_call(ref_fn, in, ref), NB_OK, "%s: reference: %s", ctx, nb_last_error());
  for (int j = 0; j < n_out; j++)
    assert_same(got[j], ref[j], ctx);
  nb_scope_end();
}

/* The loop over the examples as an nb_fn; l is filled and must outlive it. */
static nb_fn *loop_fn(looped *l, nb_fn *f, const int *in_axes, const int *out_axes) {
  *l = (looped){.f = f};
  for (int k = 0; k < nb_fn_n_in(f); k++)
    l->in_axes[k] = in_axes[k];
  for (int j = 0; j < nb_fn_n_out(f); j++)
    l->out_axes[j] = out_axes[j];
  return nb_fn_create(loop_body, l, nb_fn_n_in(f), nb_fn_n_out(f));
}

/* nb_vmap(f, in_axes, out_axes) against the loop, on in. */
static void check_vmap(nb_fn *f, nb_tensor *const *in, const int *in_axes, const int *out_axes,
                       const char *ctx) {
  looped l;
  nb_fn *v = nb_vmap(f, in_axes, out_axes), *r = loop_fn(&l, f, in_axes, out_axes);
  check_fns(v, r, in, ctx);
  nb_fn_release(v);
  nb_fn_release(r);
}

/* ---- random inputs ------------------------------------------------------------------- */
/* Example shape ex with a batch of size nb inserted at axis (NB_NOT_MAPPED:
 * ex itself). */
static nb_shape batched_shape(nb_shape ex, int axis, int64_t nb) {
  if (axis == NB_NOT_MAPPED) return ex;
  int a = norm_axis(axis, ex.ndim + 1);
  nb_shape s = {.ndim = ex.ndim + 1};
  for (int d = 0, k = 0; d < s.ndim; d++)
    s.dims[d] = d == a ? nb : ex.dims[k++];
  return s;
}

/* Random tensor of dtype dt: floats uniform in [lo, hi), integers in [-3, 3],
 * bool 0/1. */
static nb_tensor *rand_tensor(nb_shape s, nb_dtype dt, double lo, double hi, uint64_t *seed) {
  int64_t n = tc_numel(s);
  double *x;
  if (nb_dtype_is_float(dt)) {
    x = malloc((size_t)(n + 1) * sizeof *x);
    tc_fill(x, n, lo, hi, seed);
  } else {
    x = tc_rand_ints(n, dt, seed, 3);
  }
  nb_tensor *t = tc_tensor(x, s, dt);
  free(x);
  return t;
}

static const nb_dtype ALL_DTS[] = {NB_F32, NB_F64, NB_I32, NB_I64, NB_BOOL};
#define N_DTS ((int)(sizeof ALL_DTS / sizeof *ALL_DTS))

/* ---- the ops, as a table ------------------------------------------------------------------ */
typedef struct spec spec;
struct spec {
  const char *name;
  nb_tensor *(*build)(const spec *s, nb_tensor *const *in);
  int n_in;
  double lo, hi; /* range of float inputs */
  bool no_bool;  /* bool inputs are an error (neg, sub) */
  nb_tensor *(*un)(nb_tensor *);
  nb_tensor *(*bin)(nb_tensor *, nb_tensor *);
  nb_tensor *(*sc)(nb_tensor *, double);
  double c; /* the scalar of a scalar form */
  nb_tensor *(*red)(nb_tensor *, nb_axes, bool);
  nb_tensor *(*arg)(nb_tensor *, int, bool);
  nb_tensor *(*along)(nb_tensor *, int);
  /* per call: */
  nb_axes axes; /* reductions; axes.v[0] for the ops along one axis */
  bool keepdims;
};

static nb_tensor *build_un(const spec *s, nb_tensor *const *in) { return s->un(in[0]); }
static nb_tensor *build_sc(const spec *s, nb_tensor *const *in) { return s->sc(in[0], s->c); }
static nb_tensor *build_clip(const spec *s, nb_tensor *const *in) {
  return nb_clip(in[0], -s->c, s->c);
}
static nb_tensor *build_bin(const spec *s, nb_tensor *const *in) { return s->bin(in[0], in[1]); }
static nb_tensor *build_red(const spec *s, nb_tensor *const *in) {
  return s->red(in[0], s->axes, s->keepdims);
}
static nb_tensor *build_arg(const spec *s, nb_tensor *const *in) {
  return s->arg(in[0], s->axes.v[0], s->keepdims);
}
static nb_tensor *build_along(const spec *s, nb_tensor *const *in) {
  return s->along(in[0], s->axes.v[0]);
}

/* body: out[0] = the spec's op on in */
static nb_status spec_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const spec *s = user;
  out[0] = s->build(s, in);
  return out[0] ? NB_OK : nb_last_status();
}

#define UN(f, lo_, hi_, ...)                                                                       \
  { .name = #f, .build = build_un, .n_in = 1, .lo = lo_, .hi = hi_, .un = nb_##f, __VA_ARGS__ }
#define SC(f, c_)                                                                                  \
  { .name = #f, .build = build_sc, .n_in = 1, .lo = -2, .hi = 2, .sc = nb_##f, .c = c_ }

/* One input: unary ops, scalar forms, clip. */
static const spec UNARY[] = {
    UN(neg, -1, 1, .no_bool = true),
    UN(abs, -1, 1),
    UN(sign, -1, 1),
    UN(exp, -1, 1),
    UN(expm1, -1, 1),
    UN(log, 0.1, 2),
    UN(log1p, -0.5, 2),
    UN(sqrt, 0.1, 2),
    UN(rsqrt, 0.1, 2),
    UN(square, -1, 1),
    UN(sin, -2, 2),
    UN(cos, -2, 2),
    UN(tan, -1, 1),
    UN(tanh, -2, 2),
    UN(sigmoid, -3, 3),
    UN(relu, -1, 1),
    UN(gelu, -2, 2),
    UN(silu, -2, 2),
    UN(softplus, -2, 2),
    UN(erf, -2, 2),
    UN(floor, -3, 3),
    UN(ceil, -3, 3),
    UN(round, -3, 3),
    UN(reciprocal, 0.2, 2),
    UN(logical_not, -1, 1),
    SC(add_scalar, 2.5),
    SC(sub_scalar, 1),
    SC(rsub_scalar, 1),
    SC(mul_scalar, -3),
    SC(div_scalar, 4),
    SC(rdiv_scalar, 1.5),
    SC(pow_scalar, 2),
    SC(maximum_scalar, 0.25),
    SC(minimum_scalar, 0),
    SC(eq_scalar, 1),
    SC(ne_scalar, 0),
    SC(lt_scalar, 0.5),
    SC(le_scalar, 1),
    SC(gt_scalar, -0.5),
    SC(ge_scalar, 0),
    {.name = "clip", .build = build_clip, .n_in = 1, .lo = -1, .hi = 1, .c = 0.5},
};

#define BIN(f, lo_, hi_, ...)                                                                      \
  { .name = #f, .build = build_bin, .n_in = 2, .lo = lo_, .hi = hi_, .bin = nb_##f, __VA_ARGS__ }

/* Two inputs: arithmetic, comparisons, logic. */
static const spec BINARY[] = {
    BIN(add, -1, 1),        BIN(sub, -1, 1, .no_bool = true),
    BIN(mul, -1, 1),        BIN(div, 0.25, 2),
    BIN(pow, 0.25, 2),      BIN(maximum, -1, 1),
    BIN(minimum, -1, 1),    BIN(atan2, -1, 1),
    BIN(mod, 0.25, 2),      BIN(eq, -1, 1),
    BIN(ne, -1, 1),         BIN(lt, -1, 1),
    BIN(le, -1, 1),         BIN(gt, -1, 1),
    BIN(ge, -1, 1),         BIN(logical_and, -1, 1),
    BIN(logical_or, -1, 1),
};

#define RED(f)                                                                                     \
  { .name = #f, .build = build_red, .n_in = 1, .lo = -1, .hi = 1, .red = nb_##f }
static const spec REDUCTIONS[] = {
    RED(sum), RED(mean), RED(prod), RED(max),       RED(min),
    RED(var), RED(std),  RED(any),  RED(logsumexp), RED(all),
};
static const spec ARG_REDUCTIONS[] = {
    {.name = "argmax", .build = build_arg, .n_in = 1, .lo = -1, .hi = 1, .arg = nb_argmax},
    {.name = "argmin", .build = build_arg, .n_in = 1, .lo = -1, .hi = 1, .arg = nb_argmin},
};
static const spec ALONG_AXIS[] = {
    {.name = "softmax", .build = build_along, .n_in = 1, .lo = -2, .hi = 2, .along = nb_softmax},
    {.name = "log_softmax",
     .build = build_along,
     .n_in = 1,
     .lo = -2,
     .hi = 2,
     .along = nb_log_softmax},
    {.name = "cumsum", .build = build_along, .n_in = 1, .lo = -1, .hi = 1, .along = nb_cumsum},
};
#define COUNT(a) ((int)(sizeof(a) / sizeof *(a)))

/* One vmap check of spec s: input k has example shape ex[k], dtype dts[k] and
 * in_axes[k]; the output goes to out_axis. */
static void check_spec(const spec *s, const nb_shape *ex, const nb_dtype *dts, const int *in_axes,
                       int out_axis, uint64_t *seed) {
  nb_scope_begin();
  nb_tensor *in[MAX_IO];
  char ctx[256];
  int len = snprintf(ctx, sizeof ctx, "%s", s->name);
  for (int k = 0; k < s->n_in; k++) {
    char b[96];
    in[k] = rand_tensor(batched_shape(ex[k], in_axes[k], VB), dts[k], s->lo, s->hi, seed);
    len += snprintf(ctx + len, sizeof ctx - (size_t)len, " %s%s@%d", nb_dtype_name(dts[k]),
                    nb_shape_str(ex[k], b, sizeof b), in_axes[k]);
  }
  snprintf(ctx + len, sizeof ctx - (size_t)len, " axes n=%d v0=%d keepdims=%d -> out %d", s->axes.n,
           s->axes.v[0], s->keepdims, out_axis);
  nb_fn *f = nb_fn_create(spec_body, (void *)s, s->n_in, 1);
  check_vmap(f, in, in_axes, &out_axis, ctx);
  nb_fn_release(f);
  nb_scope_end();
}

/* ---- elementwise ------------------------------------------------------------------------- */
/* Example shape, in axis, out axis of a one-input check. */
typedef struct un_cfg {
  nb_shape ex;
  int in_axis, out_axis;
} un_cfg;
static const un_cfg UN_CFGS[] = {
    {{2, {3, 4}}, 0, 0},     /* plain */
    {{2, {3, 4}}, 1, -1},    /* batch in the middle, out last */
    {{3, {2, 3, 2}}, -1, 2}, /* batch last (negative), out in the middle */
    {{0, {0}}, 0, 0},        /* 0-d examples */
    {{1, {4}}, -2, -1},      /* batch first given negative, out last */
};

Test(vmap_ew, unary_ops_every_dtype_and_axis) {
  uint64_t seed = 11;
  for (int i = 0; i < COUNT(UNARY); i++)
    for (int d = 0; d < N_DTS; d++) {
      if (UNARY[i].no_bool && ALL_DTS[d] == NB_BOOL) continue;
      for (int c = 0; c < COUNT(UN_CFGS); c++)
        check_spec(&UNARY[i], &UN_CFGS[c].ex, &ALL_DTS[d], &UN_CFGS[c].in_axis, UN_CFGS[c].out_axis,
                   &seed);
    }
}

/* Example shapes and axes of a two-input check. */
typedef struct bin_cfg {
  nb_shape a, b;
  int ax_a, ax_b, out_axis;
} bin_cfg;
static const bin_cfg BIN_CFGS[] = {
    {{2, {3, 4}}, {2, {3, 4}}, 0, 1, 0},              /* both mapped, same rank */
    {{2, {3, 4}}, {1, {4}}, -1, NB_NOT_MAPPED, 1},    /* unmapped lower-rank partner */
    {{2, {3, 4}}, {2, {3, 4}}, NB_NOT_MAPPED, 2, -1}, /* unmapped first operand */
    {{2, {3, 4}}, {1, {4}}, 0, 0, 0},                 /* mapped lower rank: aligned */
    {{1, {4}}, {2, {3, 1}}, 1, -1, 2},                /* both broadcast, a lower */
    {{0, {0}}, {2, {2, 3}}, 0, NB_NOT_MAPPED, 1},     /* 0-d example, unmapped b */
    {{2, {2, 3}}, {0, {0}}, NB_NOT_MAPPED, 0, 0},     /* unmapped a, 0-d example */
    {{0, {0}}, {0, {0}}, 0, -1, 0},                   /* 0-d both */
    {{2, {3, 1}}, {2, {1, 4}}, NB_NOT_MAPPED, 1, -1}, /* unmapped a broadcasts */
    {{3, {2, 3, 1}}, {1, {4}}, 2, 0, -2},             /* rank 3 against rank 1 */
};
/* dtype pairs: each dtype with itself, and mixed (promotion) */
static const nb_dtype BIN_DTS[][2] = {
    {NB_F32, NB_F32}, {NB_F64, NB_F64}, {NB_I32, NB_I32},  {NB_I64, NB_I64}, {NB_BOOL, NB_BOOL},
    {NB_F32, NB_I32}, {NB_F64, NB_F32}, {NB_BOOL, NB_F64}, {NB_I64, NB_I32},
};

Test(vmap_ew, binary_ops_broadcasting_and_dtypes) {
  uint64_t seed = 12;
  for (int i = 0; i < COUNT(BINARY); i++)
    for (int d = 0; d < COUNT(BIN_DTS); d++) {
      if (BINARY[i].no_bool && BIN_DTS[d][0] == NB_BOOL && BIN_DTS[d][1] == NB_BOOL) continue;
      for (int c = 0; c < COUNT(BIN_CFGS); c++) {
        const bin_cfg *g = &BIN_CFGS[c];
        nb_shape ex[2] = {g->a, g->b};
        int axes[2] = {g->ax_a, g->ax_b};
        check_spec(&BINARY[i], ex, BIN_DTS[d], axes, g->out_axis, &seed);
      }
    }
}

/* body: where(in[0], in[1], in[2]) */
static nb_status where_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)user, (void)n_in, (void)n_out;
  out[0] = nb_where(in[0], in[1], in[2]);
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_ew, where_any_operand_mapped) {
  uint64_t seed = 13;
  struct {
    nb_shape ex[3];
    int axes[3], out_axis;
    nb_dtype a, b;
  } cfgs[] = {
      {{NB_SHAPE(3, 4), NB_SHAPE(3, 4), NB_SHAPE(3, 4)}, {0, 0, 0}, 0, NB_F32, NB_F32},
      {{NB_SHAPE(3, 4), NB_SHAPE(4), NB_SCALAR_SHAPE},
       {1, NB_NOT_MAPPED, NB_NOT_MAPPED},
       -1,
       NB_F64,
       NB_F64},
      {{NB_SHAPE(3, 1), NB_SHAPE(4), NB_SHAPE(3, 4)},
       {NB_NOT_MAPPED, 0, NB_NOT_MAPPED},
       1,
       NB_I32,
       NB_F32},
      {{NB_SHAPE(4), NB_SHAPE(3, 4), NB_SCALAR_SHAPE}, {-1, NB_NOT_MAPPED, 0}, 0, NB_I64, NB_I32},
      {{NB_SCALAR_SHAPE, NB_SHAPE(2, 3), NB_SHAPE(3)}, {0, 2, -1}, 2, NB_BOOL, NB_BOOL},
      {{NB_SHAPE(2, 3), NB_SCALAR_SHAPE, NB_SHAPE(2, 1)},
       {NB_NOT_MAPPED, 0, 1},
       -1,
       NB_F32,
       NB_F64},
  };
  nb_fn *f = nb_fn_create(where_body, NULL, 3, 1);
  for (int c = 0; c < COUNT(cfgs); c++) {
    nb_scope_begin();
    nb_dtype dts[3] = {NB_BOOL, cfgs[c].a, cfgs[c].b};
    nb_tensor *in[3];
    for (int k = 0; k < 3; k++)
      in[k] = rand_tensor(batched_shape(cfgs[c].ex[k], cfgs[c].axes[k], VB), dts[k], -1, 1, &seed);
    char ctx[64];
    snprintf(ctx, sizeof ctx, "where case %d", c);
    check_vmap(f, in, cfgs[c].axes, &cfgs[c].out_axis, ctx);
    nb_scope_end();
  }
  nb_fn_release(f);
}

/* body: cast(in[0], *(nb_dtype *)user) */
static nb_status cast_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = nb_cast(in[0], *(const nb_dtype *)user);
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_ew, cast_between_every_dtype_pair) {
  uint64_t seed = 14;
  const nb_dtype to[] = {NB_F16, NB_BF16, NB_F32, NB_F64, NB_I32, NB_I64, NB_BOOL};
  for (int d = 0; d < N_DTS; d++)
    for (int t = 0; t < COUNT(to); t++)
      for (int c = 0; c < COUNT(UN_CFGS); c++) {
        nb_scope_begin();
        nb_fn *f = nb_fn_create(cast_body, (void *)&to[t], 1, 1);
        nb_tensor *x = rand_tensor(batched_shape(UN_CFGS[c].ex, UN_CFGS[c].in_axis, VB), ALL_DTS[d],
                                   -3, 3, &seed);
        char ctx[64];
        snprintf(ctx, sizeof ctx, "cast %s -> %s, case %d", nb_dtype_name(ALL_DTS[d]),
                 nb_dtype_name(to[t]), c);
        check_vmap(f, &x, &UN_CFGS[c].in_axis, &UN_CFGS[c].out_axis, ctx);
        nb_fn_release(f);
        nb_scope_end();
      }
}

/* ---- reductions ----------------------------------------------------------------------- */
Test(vmap_ew, reductions_axes_keepdims_dtypes) {
  uint64_t seed = 15;
  nb_axes axes[] = {NB_ALL,        NB_NO_AXES,     NB_AXES(0),    NB_AXES(-1),
                    NB_AXES(0, 2), NB_AXES(1, -1), NB_AXES(2, 0), NB_AXES(0, 1, 2)};
  const int in_axes[] = {0, 1, -1, 2}, out_axes[] = {0, -1, 1};
  nb_shape ex = NB_SHAPE(2, 3, 4);
  int n = 0;
  for (int i = 0; i < COUNT(REDUCTIONS); i++)
    for (int a = 0; a < COUNT(axes); a++)
      for (int kd = 0; kd < 2; kd++)
        for (int d = 0; d < N_DTS; d++, n++) {
          spec s = REDUCTIONS[i];
          s.axes = axes[a];
          s.keepdims = kd;
          int out_axis = out_axes[n % 3];
          /* an out axis past the end of a rank-1 result wraps to 0 */
          if (!kd && (axes[a].n == -1 || axes[a].n == 3)) out_axis = n % 2 ? -1 : 0;
          check_spec(&s, &ex, &ALL_DTS[d], &in_axes[n % 4], out_axis, &seed);
        }
}

Test(vmap_ew, reductions_of_0d_and_empty_examples) {
  uint64_t seed = 16;
  nb_shape empty = NB_SHAPE(0, 3), zero_d = NB_SCALAR_SHAPE;
  for (int i = 0; i < COUNT(REDUCTIONS); i++)
    for (int d = 0; d < N_DTS; d++)
      for (int kd = 0; kd < 2; kd++) {
        spec s = REDUCTIONS[i];
        s.keepdims = kd;
        s.axes = NB_ALL;
        check_spec(&s, &zero_d, &ALL_DTS[d], (int[]){0}, 0, &seed);
        s.axes = NB_NO_AXES;
        check_spec(&s, &zero_d, &ALL_DTS[d], (int[]){-1}, -1, &seed);
        /* max and min have no identity for an empty reduction */
        if (s.red == nb_max || s.red == nb_min) continue;
        s.axes = NB_AXES(0);
        check_spec(&s, &empty, &ALL_DTS[d], (int[]){1}, kd ? 2 : 1, &seed);
        s.axes = NB_ALL;
        check_spec(&s, &empty, &ALL_DTS[d], (int[]){-1}, 0, &seed);
      }
}

Test(vmap_ew, argmax_argmin_every_axis) {
  uint64_t seed = 17;
  nb_shape ex = NB_SHAPE(3, 4, 2);
  const int in_axes[] = {0, 1, -1, 3}, out_axes[] = {0, 1, -1};
  int n = 0;
  for (int i = 0; i < COUNT(ARG_REDUCTIONS); i++)
    for (int ax = -3; ax < 3; ax++)
      for (int kd = 0; kd < 2; kd++)
        for (int d = 0; d < N_DTS; d++, n++) {
          spec s = ARG_REDUCTIONS[i];
          s.axes = NB_AXES(ax);
          s.keepdims = kd;
          check_spec(&s, &ex, &ALL_DTS[d], &in_axes[n % 4], out_axes[n % 3], &seed);
        }
}

Test(vmap_ew, softmax_log_softmax_cumsum_every_axis) {
  uint64_t seed = 18;
  nb_shape exs[] = {NB_SHAPE(3, 4, 2), NB_SHAPE(5), NB_SHAPE(0, 3)};
  const int in_axes[] = {0, 1, -1, 2}, out_axes[] = {0, -1, 1};
  int n = 0;
  for (int i = 0; i < COUNT(ALONG_AXIS); i++)
    for (int e = 0; e < COUNT(exs); e++)
      for (int ax = -exs[e].ndim; ax < exs[e].ndim; ax++)
        for (int d = 0; d < N_DTS; d++, n++) {
          spec s = ALONG_AXIS[i];
          s.axes = NB_AXES(ax);
          int in_axis = in_axes[n % 4] > exs[e].ndim ? 0 : in_axes[n % 4];
          int out_axis = out_axes[n % 3] > exs[e].ndim ? 0 : out_axes[n % 3];
          check_spec(&s, &exs[e], &ALL_DTS[d], &in_axis, out_axis, &seed);
        }
}

/* ---- compositions: nested vmap, gradients ------------------------------------------------- */
/* body: x (3, 4), w (4): a mix of the ops here, outputs
 * out[0] = sum(softmax(x w + 1) tanh(x), -1) * logsumexp(where(x > 0, x, w^2), -1)
 *          + mean(var(cumsum(x w, 0), 0), keepdims)                       (3)
 * out[1] = argmax(x, -1) + any(x > 0.5, -1)                       (3) i64 */
static nb_status mix_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *x = in[0], *w = in[1], *h = nb_mul(x, w);
  nb_tensor *s = nb_softmax(nb_add_scalar(h, 1), -1);
  nb_tensor *a = nb_sum(nb_mul(s, nb_tanh(x)), NB_AXES(-1), false);
  nb_tensor *b = nb_logsumexp(nb_where(nb_gt_scalar(x, 0), x, nb_square(w)), NB_AXES(-1), false);
  nb_tensor *c = nb_mean(nb_var(nb_cumsum(h, 0), NB_AXES(0), false), NB_ALL, true); /* (1) */
  out[0] = nb_add(nb_mul(a, b), c);
  out[1] = nb_add(nb_argmax(x, -1, false),
                  nb_cast(nb_any(nb_gt_scalar(x, 0.5), NB_AXES(-1), false), NB_I64));
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

/* body: a (3, 4), b (3, 4) of one dtype: out[0] = logsumexp(where(a > b, a, b b), -1,
 * keepdims) + cumsum(a - b, 1), out[1] = all(a >= b, 0) */
static nb_status pair_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *a = in[0], *b = in[1];
  nb_tensor *l = nb_logsumexp(nb_where(nb_gt(a, b), a, nb_mul(b, b)), NB_AXES(-1), true);
  out[0] = nb_add(l, nb_cumsum(nb_sub(a, b), 1));
  out[1] = nb_all(nb_ge(a, b), NB_AXES(0), false);
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

/* vmap(vmap(f)) against a loop of a loop, and against a loop of the inner
 * vmap. The inner vmap maps axis 0 to axis 0 and its operands broadcast
 * without rank alignment, so every node of its result that the outer vmap
 * batches is an elementwise op or a reduction (axis moves and alignments
 * inside it would be permute / reshape nodes, batched by the shape ops' rules). */
Test(vmap_ew, vmap_of_vmap) {
  uint64_t seed = 19;
  nb_fn *fs[2] = {nb_fn_create(mix_body, NULL, 2, 2), nb_fn_create(pair_body, NULL, 2, 2)};
  struct {
    int f, inner[2], outer[2], outer_out[2];
    nb_shape ex_b;
  } cfgs[] = {
      {0, {0, NB_NOT_MAPPED}, {0, 0}, {0, 0}, {1, {4}}},
      {0, {0, NB_NOT_MAPPED}, {2, NB_NOT_MAPPED}, {-1, 1}, {1, {4}}},
      {0, {0, NB_NOT_MAPPED}, {-1, 1}, {1, 2}, {1, {4}}},
      {0, {0, NB_NOT_MAPPED}, {NB_NOT_MAPPED, 0}, {2, -1}, {1, {4}}},
      {1, {0, 0}, {0, 0}, {0, 0}, {2, {3, 4}}},
      {1, {0, NB_NOT_MAPPED}, {1, -1}, {-1, 0}, {2, {3, 4}}},
      {1, {0, 0}, {NB_NOT_MAPPED, 3}, {2, 1}, {2, {3, 4}}},
  };
  const int zero[2] = {0, 0};
  for (int c = 0; c < COUNT(cfgs); c++)
    for (int d = 0; d < 3; d++) {
      nb_scope_begin();
      nb_dtype dt = (nb_dtype[]){NB_F64, NB_F32, NB_I32}[d];
      /* example shapes x (3, 4) and ex_b; inner batch 4, outer batch 3 */
      nb_shape xs =
          batched_shape(batched_shape(NB_SHAPE(3, 4), cfgs[c].inner[0], 4), cfgs[c].outer[0], 3);
      nb_shape ws =
          batched_shape(batched_shape(cfgs[c].ex_b, cfgs[c].inner[1], 4), cfgs[c].outer[1], 3);
      nb_tensor *in[2] = {rand_tensor(xs, dt, -1, 1, &seed), rand_tensor(ws, dt, -1, 1, &seed)};
      nb_fn *f = fs[cfgs[c].f];
      looped li, lo, lo2;
      nb_fn *vi = nb_vmap(f, cfgs[c].inner, zero);
      nb_fn *vv = nb_vmap(vi, cfgs[c].outer, cfgs[c].outer_out);
      nb_fn *ri = loop_fn(&li, f, cfgs[c].inner, zero);
      nb_fn *rr = loop_fn(&lo, ri, cfgs[c].outer, cfgs[c].outer_out);
      nb_fn *lv = loop_fn(&lo2, vi, cfgs[c].outer, cfgs[c].outer_out);
      char ctx[64];
      snprintf(ctx, sizeof ctx, "vmap of vmap, case %d, %s", c, nb_dtype_name(dt));
      check_fns(vv, rr, in, ctx);
      check_fns(vv, lv, in, ctx);
      nb_fn_release(vi), nb_fn_release(vv), nb_fn_release(ri), nb_fn_release(rr);
      nb_fn_release(lv);
      nb_scope_end();
    }
  nb_fn_release(fs[0]), nb_fn_release(fs[1]);
}

/* body: a scalar loss of x (3, 4) and w (4) through the differentiable ops
 * here. Its reductions keep their dims (or reduce everything), so the
 * gradient graph is made of elementwise ops and reductions only. */
static nb_status loss_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *x = in[0], *w = in[1];
  nb_tensor *h = nb_add(nb_mul(x, w), nb_sin(w));
  nb_tensor *t = nb_sum(nb_mul(nb_softmax(h, -1), nb_tanh(x)), NB_ALL, false);
  t = nb_add(t, nb_sum(nb_log_softmax(nb_mul_scalar(x, 2), 0), NB_ALL, false));
  t = nb_add(t, nb_sum(nb_logsumexp(h, NB_AXES(-1), true), NB_ALL, false));
  t = nb_add(t, nb_sum(nb_mul(nb_var(x, NB_AXES(0), true), nb_exp(w)), NB_ALL, false));
  t = nb_add(t, nb_sum(nb_std(h, NB_AXES(1), true), NB_ALL, false));
  nb_tensor *m = nb_mul(nb_max(h, NB_ALL, true), nb_min(nb_sigmoid(x), NB_ALL, true));
  t = nb_add(t, nb_sum(m, NB_ALL, false));
  t = nb_add(t, nb_mean(nb_where(nb_gt_scalar(x, 0), nb_square(x), nb_softplus(x)), NB_ALL, false));
  t = nb_add(t, nb_sum(nb_div(nb_pow_scalar(nb_abs(w), 1.5), nb_add_scalar(nb_square(x), 1)),
                       NB_ALL, false));
  out[0] = nb_add(t, nb_sum(nb_maximum(nb_gelu(x), nb_silu(w)), NB_ALL, false));
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_ew, per_example_gradients) {
  uint64_t seed = 20;
  nb_fn *f = nb_fn_create(loss_body, NULL, 2, 1), *g = nb_grad(f, NB_ALL);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0));
  struct {
    int axes[2], out[2];
  } cfgs[] = {
      {{0, NB_NOT_MAPPED}, {0, 0}},
      {{1, 0}, {0, -1}},
      {{-1, NB_NOT_MAPPED}, {-1, 1}},
      {{NB_NOT_MAPPED, 1}, {2, 0}},
  };
  for (int c = 0; c < COUNT(cfgs); c++) {
    nb_scope_begin();
    nb_tensor *in[2] = {
        rand_tensor(batched_shape(NB_SHAPE(3, 4), cfgs[c].axes[0], VB), NB_F64, -1, 1, &seed),
        rand_tensor(batched_shape(NB_SHAPE(4), cfgs[c].axes[1], VB), NB_F64, -1, 1, &seed)};
    char ctx[64];
    snprintf(ctx, sizeof ctx, "vmap of grad, case %d", c);
    check_vmap(g, in, cfgs[c].axes, cfgs[c].out, ctx);
    /* value_and_grad: a 0-d value (out axis 0) and the gradient of x */
    int vg_out[2] = {0, cfgs[c].out[0]};
    snprintf(ctx, sizeof ctx, "vmap of value_and_grad, case %d", c);
    check_vmap(vg, in, cfgs[c].axes, vg_out, ctx);
    /* f32 too */
    nb_tensor *in32[2] = {nb_cast(in[0], NB_F32), nb_cast(in[1], NB_F32)};
    snprintf(ctx, sizeof ctx, "vmap of grad f32, case %d", c);
    check_vmap(g, in32, cfgs[c].axes, cfgs[c].out, ctx);
    nb_scope_end();
  }
  nb_fn_release(f), nb_fn_release(g), nb_fn_release(vg);
}

/* body: sum of every output of nb_call(user, in) (a scalar loss of a vmap or
 * of its loop, both with float outputs) */
static nb_status total_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *y[1];
  nb_status st = nb_call(user, in, y);
  if (st) return st;
  out[0] = nb_sum(nb_sin(y[0]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* body: out[0] of mix_body */
static nb_status mix0_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  nb_tensor *o[2];
  nb_status st = mix_body(user, in, n_in, o, 2);
  (void)n_out;
  out[0] = o[0];
  return st;
}

/* The batched nodes are ordinary nodes: their own derivatives (the rules read
 * the shifted axes) match those of the loop. */
Test(vmap_ew, grad_of_vmap) {
  uint64_t seed = 21;
  nb_fn *f = nb_fn_create(mix0_body, NULL, 2, 1);
  int axes[2] = {1, NB_NOT_MAPPED}, out = -1;
  looped l;
  nb_fn *v = nb_vmap(f, axes, &out), *r = loop_fn(&l, f, axes, &out);
  nb_fn *tv = nb_fn_create(total_body, v, 2, 1), *tr = nb_fn_create(total_body, r, 2, 1);
  nb_fn *gv = nb_grad(tv, NB_ALL), *gr = nb_grad(tr, NB_ALL);
  nb_tensor *in[2] = {rand_tensor(NB_SHAPE(3, VB, 4), NB_F64, -1, 1, &seed),
                      rand_tensor(NB_SHAPE(4), NB_F64, -1, 1, &seed)};
  check_fns(gv, gr, in, "grad of vmap");
  nb_fn_release(f), nb_fn_release(v), nb_fn_release(r), nb_fn_release(tv), nb_fn_release(tr);
  nb_fn_release(gv), nb_fn_release(gr);
}

/* Every op of the two families has a batching rule. */
Test(vmap_ew, op_table_has_every_rule) {
  const int ops[] = {
#define NB_OP(id, name, arity, traits) NBI_OP_##id,
#include "../src/ops/elementwise.def"
#include "../src/ops/reduce.def"
#undef NB_OP
  };
  for (int i = 0; i < COUNT(ops); i++)
    cr_assert(nbi_op_table[ops[i]]->vmap, "op %s has no batching rule", nbi_op_table[ops[i]]->name);
}
