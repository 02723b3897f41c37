/* test/test_reduce.c — reductions (sum mean prod max min var std logsumexp any
 * all argmax argmin), softmax, log_softmax and cumsum, each against a plain
 * float64 reference loop, on random shapes, axes, dtypes and memory layouts. */
#include "common.h"

#include "../src/backends/cpu/vmath.h" /* nbi_isa_select */

TestSuite(reduce, .init = tc_setup, .fini = tc_teardown);

static const nb_dtype all_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64, NB_BOOL};
#define N_DTYPES 7

/* ---- inputs in any memory layout ------------------------------------------------ */
typedef enum layout { L_CONTIG, L_TRANSPOSED, L_FLIPPED, L_GAPPED, L_COUNT } layout;
static const char *const layout_names[L_COUNT] = {"contiguous", "transposed", "flipped", "gapped"};

/* A realized tensor of shape s viewing `base`'s buffer with element strides st
 * and offset off (how shape ops will hand views to kernels). */
static nb_tensor *view_of(nb_tensor *base, nb_shape s, const int64_t *st, int64_t off) {
  nb_shape one = NB_SHAPE(1);
  nb_tensor *v = nbi_leaf_alloc("test", &one, nb_dtype_of(base));
  nbi_buffer_release(v->shard0.buf);
  v->shard0.buf = base->shard0.buf;
  nbi_buffer_retain(v->shard0.buf);
  v->shape = s;
  v->shard0.offset = off;
  memcpy(v->shard0.strides, st, sizeof(int64_t) * (size_t)s.ndim);
  return v;
}

/* Tensor of dtype dt holding x (row-major over s) laid out as L: transposed (first
 * dim fastest), flipped (dim 0 has a negative stride) or gapped (every stride
 * doubled). Unused buffer elements hold NaN (floats) or 77, which must not leak. */
static nb_tensor *tensor_in_layout(const double *x, nb_shape s, nb_dtype dt, layout L) {
  if (L == L_CONTIG) return tc_tensor(x, s, dt);
  int64_t st[NB_MAX_DIMS], off = 0, span = L == L_GAPPED ? 2 : 1;
  for (int i = 0; i < s.ndim; i++) {
    int d = L == L_TRANSPOSED ? i : s.ndim - 1 - i;
    st[d] = span;
    span *= s.dims[d] > 0 ? s.dims[d] : 1;
  }
  if (L == L_FLIPPED && s.ndim > 0 && s.dims[0] > 0) {
    off = (s.dims[0] - 1) * st[0];
    st[0] = -st[0];
  }
  int64_t n = tc_numel(s), bufn = span + 1;
  double *buf = malloc((size_t)bufn * sizeof *buf);
  for (int64_t i = 0; i < bufn; i++)
    buf[i] = nb_dtype_is_float(dt) ? NAN : 77;
  for (int64_t i = 0; i < n; i++) {
    int64_t pos = off, r = i;
    for (int d = s.ndim - 1; d >= 0; d--) {
      pos += r % s.dims[d] * st[d];
      r /= s.dims[d];
    }
    buf[pos] = x[i];
  }
  nb_tensor *base = tc_tensor(buf, NB_SHAPE(bufn), dt);
  free(buf);
  return view_of(base, s, st, off);
}

/* ---- random cases ------------------------------------------------------------------ */
static int rand_int(uint64_t *seed, int lo, int hi) { /* [lo, hi] */
  return lo + (int)tc_uniform(seed, 0, hi - lo + 1);
}

/* Dims mostly 2..4, some 1, and 0 with probability p0. */
static nb_shape random_shape(uint64_t *seed, int nd, double p0) {
  nb_shape s = {.ndim = nd};
  for (int d = 0; d < nd; d++) {
    double u = tc_uniform(seed, 0, 1);
    s.dims[d] = u < p0 ? 0 : u < p0 + 0.2 ? 1 : rand_int(seed, 2, 4);
  }
  return s;
}

/* NB_ALL, NB_NO_AXES, or a shuffled subset of axes, each negative half the time. */
static nb_axes random_axes(uint64_t *seed, int nd) {
  double u = tc_uniform(seed, 0, 1);
  if (u < 0.15) return NB_ALL;
  if (u < 0.25 || nd == 0) return NB_NO_AXES;
  nb_axes ax = {.n = 0};
  for (int d = 0; d < nd; d++)
    if (tc_uniform(seed, 0, 1) < 0.5) ax.v[ax.n++] = tc_uniform(seed, 0, 1) < 0.5 ? d - nd : d;
  if (ax.n == 0) ax.v[ax.n++] = rand_int(seed, -nd, nd - 1);
  for (int i = ax.n - 1; i > 0; i--) {
    int j = rand_int(seed, 0, i), t = ax.v[i];
    ax.v[i] = ax.v[j];
    ax.v[j] = t;
  }
  return ax;
}

static uint32_t axes_mask(nb_axes ax, int nd) {
  if (ax.n < 0) return (1u << nd) - 1;
  uint32_t m = 0;
  for (int i = 0; i < ax.n; i++)
    m |= 1u << (ax.v[i] < 0 ? ax.v[i] + nd : ax.v[i]);
  return m;
}

/* Values of dtype dt, already rounded through it: floats in [lo, hi), integers
 * in [-9, 9], bools 0/1. */
static double *random_values(uint64_t *seed, int64_t n, nb_dtype dt, double lo, double hi) {
  double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++) {
    if (nb_dtype_is_float(dt))
      x[i] = tc_uniform(seed, lo, hi);
    else if (dt == NB_BOOL)
      x[i] = tc_uniform(seed, 0, 1) < 0.5;
    else
      x[i] = rand_int(seed, -9, 9);
  }
  tc_round_to(x, n, dt);
  return x;
}

static char ctx[256]; /* the case under test, for failure messages */

static void describe(const char *op, nb_dtype dt, nb_shape s, const char *what, layout L) {
  char b[96];
  snprintf(ctx, sizeof ctx, "%s(%s %s, %s) %s", op, nb_dtype_name(dt), nb_shape_str(s, b, sizeof b),
           what, layout_names[L]);
}

/* Asserts t has shape s, dtype dt and values ref within tol relative (absolute
 * floor tol); NaN must match NaN and infinities exactly. */
static void check_close(nb_tensor *t, const double *ref, nb_shape s, nb_dtype dt, double tol) {
  cr_assert(t, "%s: NULL: %s", ctx, nb_last_error());
  cr_assert_eq(nb_dtype_of(t), dt, "%s: dtype %s, expected %s", ctx, nb_dtype_name(nb_dtype_of(t)),
               nb_dtype_name(dt));
  nb_shape ts = nb_shape_of(t);
  char b1[96], b2[96];
  cr_assert(nbi_shape_eq(&ts, &s), "%s: shape %s, expected %s", ctx,
            nb_shape_str(ts, b1, sizeof b1), nb_shape_str(s, b2, sizeof b2));
  double *got = tc_read(t);
  for (int64_t i = 0; i < tc_numel(s); i++) {
    bool ok = isnan(ref[i])   ? isnan(got[i])
              : isinf(ref[i]) ? got[i] == ref[i]
                              : fabs(got[i] - ref[i]) <= tol * (1 + fabs(ref[i]));
    cr_assert(ok, "%s: element %lld is %.10g, expected %.10g", ctx, (long long)i, got[i], ref[i]);
  }
  free(got);
}

/* ---- reductions: calls and reference ------------------------------------------------ */
typedef enum kind {
  K_SUM,
  K_MEAN,
  K_PROD,
  K_MAX,
  K_MIN,
  K_VAR,
  K_STD,
  K_LSE,
  K_ANY,
  K_ALL,
  K_ARGMAX,
  K_ARGMIN,
  K_COUNT
} kind;
static const char *const kind_names[K_COUNT] = {"sum", "mean", "prod", "max", "min",    "var",
                                                "std", "lse",  "any",  "all", "argmax", "argmin"};

static bool is_arg(kind k) { return k == K_ARGMAX || k == K_ARGMIN; }
static bool has_identity(kind k) { return k != K_MAX && k != K_MIN && !is_arg(k); }

static nb_tensor *reduce_call(kind k, nb_tensor *t, nb_axes ax, bool keep) {
  switch (k) {
  case K_SUM: return nb_sum(t, ax, keep);
  case K_MEAN: return nb_mean(t, ax, keep);
  case K_PROD: return nb_prod(t, ax, keep);
  case K_MAX: return nb_max(t, ax, keep);
  case K_MIN: return nb_min(t, ax, keep);
  case K_VAR: return nb_var(t, ax, keep);
  case K_STD: return nb_std(t, ax, keep);
  case K_LSE: return nb_logsumexp(t, ax, keep);
  case K_ANY: return nb_any(t, ax, keep);
  case K_ALL: return nb_all(t, ax, keep);
  case K_ARGMAX: return nb_argmax(t, ax.v[0], keep);
  default: return nb_argmin(t, ax.v[0], keep);
  }
}

/* JAX's result dtypes. */
static nb_dtype reduce_dtype(kind k, nb_dtype dt) {
  switch (k) {
  case K_SUM:
  case K_PROD: return dt == NB_BOOL ? NB_I32 : dt;
  case K_MEAN:
  case K_VAR:
  case K_STD:
  case K_LSE: return nb_dtype_is_float(dt) ? dt : NB_F32;
  case K_MAX:
  case K_MIN: return dt;
  case K_ANY:
  case K_ALL: return NB_BOOL;
  default: return NB_I64;
  }
}

/* Reference fold of the n values v (in reduced row-major order) as kind k. */
static double ref_fold(kind k, const double *v, int64_t n) {
  double s = 0, m, best;
  int64_t bi = 0;
  switch (k) {
  case K_SUM:
  case K_MEAN:
    for (int64_t i = 0; i < n; i++)
      s += v[i];
    return k == K_SUM ? s : n ? s / (double)n : NAN;
  case K_PROD:
    s = 1;
    for (int64_t i = 0; i < n; i++)
      s *= v[i];
    return s;
  case K_MAX:
  case K_MIN:
  case K_LSE:
    m = k == K_MIN ? INFINITY : -INFINITY;
    for (int64_t i = 0; i < n; i++) {
      if (isnan(v[i])) return NAN;
      m = k == K_MIN ? fmin(m, v[i]) : fmax(m, v[i]);
    }
    if (k != K_LSE || !isfinite(m)) return m;
    for (int64_t i = 0; i < n; i++)
      s += exp(v[i] - m);
    return m + log(s);
  case K_VAR:
  case K_STD: {
    if (n == 0) return NAN;
    double mean = ref_fold(K_MEAN, v, n);
    for (int64_t i = 0; i < n; i++)
      s += (v[i] - mean) * (v[i] - mean);
    return k == K_VAR ? s / (double)n : sqrt(s / (double)n);
  }
  case K_ANY:
    for (int64_t i = 0; i < n; i++)
      if (v[i] != 0) return 1;
    return 0;
  case K_ALL:
    for (int64_t i = 0; i < n; i++)
      if (v[i] == 0) return 0;
    return 1;
  default: /* argmax / argmin: first NaN, else first extreme */
    best = v[0];
    for (int64_t i = 1; i < n && !isnan(best); i++)
      if (isnan(v[i]) || (k == K_ARGMAX ? v[i] > best : v[i] < best)) best = v[i], bi = i;
    return (double)bi;
  }
}

/* Reference reduction of x (shape s) over the axes in mask: out[o] for every
 * output o (kept dims, row-major). Returns the number of outputs. */
static int64_t ref_reduce(kind k, const double *x, nb_shape s, uint32_t mask, double *out) {
  int64_t n = tc_numel(s), n_out = 1, n_red = 1;
  for (int d = 0; d < s.ndim; d++) {
    if ((mask >> d) & 1u)
      n_red *= s.dims[d];
    else
      n_out *= s.dims[d];
  }
  double *vals = malloc((size_t)(n_out * n_red + 1) * sizeof *vals);
  int64_t *cnt = calloc((size_t)n_out + 1, sizeof *cnt);
  for (int64_t i = 0; i < n; i++) {
    int64_t o = 0, r = i, scale = 1;
    for (int d = s.ndim - 1; d >= 0; d--) {
      int64_t id = r % s.dims[d];
      r /= s.dims[d];
      if (!((mask >> d) & 1u)) {
        o += id * scale;
        scale *= s.dims[d];
      }
    }
    vals[o * n_red + cnt[o]++] = x[i];
  }
  for (int64_t o = 0; o < n_out; o++)
    out[o] = ref_fold(k, vals + o * n_red, n_red);
  free(vals);
  free(cnt);
  return n_out;
}

static nb_shape reduced_shape(nb_shape s, uint32_t mask, bool keep) {
  nb_shape r = {.ndim = 0};
  for (int d = 0; d < s.ndim; d++) {
    if (!((mask >> d) & 1u))
      r.dims[r.ndim++] = s.dims[d];
    else if (keep)
      r.dims[r.ndim++] = 1;
  }
  return r;
}

/* Runs kind k on x (dtype dt, shape s, layout L) over ax and compares with the
 * reference (or with the no-identity error when it applies). */
static void check_reduction(kind k, const double *x, nb_dtype dt, nb_shape s, nb_axes ax, bool keep,
                            layout L) {
  char what[64];
  snprintf(what, sizeof what, "axes n=%d [%d,%d,..] keepdims %d", ax.n, ax.v[0], ax.v[1], keep);
  describe(kind_names[k], dt, s, what, L);
  uint32_t mask = axes_mask(ax, s.ndim);
  nb_tensor *t = tensor_in_layout(x, s, dt, L);
  nb_tensor *r = reduce_call(k, t, ax, keep);
  bool empty_axis = false;
  for (int d = 0; d < s.ndim; d++)
    empty_axis |= ((mask >> d) & 1u) && s.dims[d] == 0;
  if (!has_identity(k) && empty_axis) {
    cr_assert_null(r, "%s: expected an error", ctx);
    tc_assert_error(NB_ERR_SHAPE, "has no identity");
    return;
  }
  nb_shape rs = reduced_shape(s, mask, keep);
  double *ref = malloc((size_t)(tc_numel(rs) + 1) * sizeof *ref);
  ref_reduce(k, x, s, mask, ref);
  nb_dtype odt = reduce_dtype(k, dt);
  check_close(r, ref, rs, odt, tc_tol(odt));
  free(ref);
}

/* Input values suited to kind k: products of values near 1 in magnitude. */
static double *values_for(kind k, uint64_t *seed, int64_t n, nb_dtype dt) {
  if (k != K_PROD) return random_values(seed, n, dt, -3, 3);
  double *x = random_values(seed, n, dt, 0.7, 1.4);
  for (int64_t i = 0; i < n; i++) {
    if (!nb_dtype_is_float(dt) && dt != NB_BOOL) x[i] = x[i] < 0 ? -1 : x[i] > 3 ? 2 : 1;
    if (nb_dtype_is_float(dt) && tc_uniform(seed, 0, 1) < 0.5) x[i] = -x[i];
  }
  return x;
}

/* Every dtype x 40 random cases (rank 0..4, sizes 0..4, random axes, keepdims
 * both ways, every layout) against the reference. */
static void check_kind_everywhere(kind k) {
  uint64_t seed = 1000 + (uint64_t)k;
  for (int di = 0; di < N_DTYPES; di++)
    for (int trial = 0; trial < 40; trial++) {
      int nd = trial % 5;
      if (is_arg(k) && nd == 0) nd = 1 + trial % 4;
      nb_shape s = random_shape(&seed, nd, trial % 3 == 0 ? 0.15 : 0);
      nb_axes ax = is_arg(k) ? NB_AXES(rand_int(&seed, -nd, nd - 1)) : random_axes(&seed, nd);
      double *x = values_for(k, &seed, tc_numel(s), all_dtypes[di]);
      check_reduction(k, x, all_dtypes[di], s, ax, trial % 2, (layout)(trial / 2 % L_COUNT));
      free(x);
    }
}

Test(reduce, sum_matches_reference_for_every_dtype_shape_and_axes) { check_kind_everywhere(K_SUM); }
Test(reduce, mean_matches_reference_for_every_dtype_shape_and_axes) {
  check_kind_everywhere(K_MEAN);
}
Test(reduce, prod_matches_reference_for_every_dtype_shape_and_axes) {
  check_kind_everywhere(K_PROD);
}
Test(reduce, max_matches_reference_for_every_dtype_shape_and_axes) { check_kind_everywhere(K_MAX); }
Test(reduce, min_matches_reference_for_every_dtype_shape_and_axes) { check_kind_everywhere(K_MIN); }
Test(reduce, var_matches_reference_for_every_dtype_shape_and_axes) { check_kind_everywhere(K_VAR); }
Test(reduce, std_matches_reference_for_every_dtype_shape_and_axes) { check_kind_everywhere(K_STD); }
Test(reduce, logsumexp_matches_reference_for_every_dtype_shape_and_axes) {
  check_kind_everywhere(K_LSE);
}
Test(reduce, any_matches_reference_for_every_dtype_shape_and_axes) { check_kind_everywhere(K_ANY); }
Test(reduce, all_matches_reference_for_every_dtype_shape_and_axes) { check_kind_everywhere(K_ALL); }
Test(reduce, argmax_matches_reference_for_every_dtype_shape_and_axis) {
  check_kind_everywhere(K_ARGMAX);
}
Test(reduce, argmin_matches_reference_for_every_dtype_shape_and_axis) {
  check_kind_everywhere(K_ARGMIN);
}

/* ---- large reductions: every loop and parallel split ---------------------------------- */
Test(reduce, large_reductions_match_reference_on_every_loop_and_split) {
  struct {
    nb_shape s;
    nb_axes ax;
  } cases[] = {
      {NB_SHAPE(100003), NB_ALL},             /* one output: parallel chunks */
      {NB_SHAPE(3, 40001), NB_AXES(1)},       /* few rows: chunks per output */
      {NB_SHAPE(500, 301), NB_AXES(-1)},      /* many rows: parallel outputs */
      {NB_SHAPE(40001, 3), NB_AXES(0)},       /* few columns: private partial states */
      {NB_SHAPE(301, 700), NB_AXES(0)},       /* many columns: column blocks */
      {NB_SHAPE(30, 50, 41), NB_AXES(0, 2)},  /* interleaved groups, inner */
      {NB_SHAPE(41, 50, 30), NB_AXES(-3, 1)}, /* two reduced groups, outer */
  };
  const kind kinds[] = {K_SUM, K_MEAN, K_MAX, K_VAR, K_LSE, K_ARGMAX, K_ARGMIN, K_ANY};
  const nb_dtype dts[] = {NB_F32, NB_F64, NB_I32, NB_BF16};
  uint64_t seed = 7;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
      double *x = random_values(&seed, tc_numel(cases[c].s), dts[di], -3, 3);
      for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
        nb_axes ax = cases[c].ax;
        if (is_arg(kinds[ki]) && ax.n != 1) continue;
        check_reduction(kinds[ki], x, dts[di], cases[c].s, ax, false, L_CONTIG);
      }
      free(x);
    }
}

Test(reduce, f32_sum_of_100k_elements_is_accurate_to_1e_5) {
  uint64_t seed = 3;
  int64_t n = 100000;
  double *x = random_values(&seed, n, NB_F32, 0, 1), ref = 0;
  for (int64_t i = 0; i < n; i++)
    ref += x[i];
  nb_tensor *t = tc_tensor(x, NB_SHAPE(n), NB_F32);
  double got = nb_item(nb_sum(t, NB_ALL, false));
  cr_assert(fabs(got - ref) <= 1e-5 * fabs(ref), "sum %.9g, expected %.9g", got, ref);
  got = nb_item(nb_mean(tc_tensor(x, NB_SHAPE(250, 400), NB_F32), NB_ALL, false));
  cr_assert(fabs(got - ref / (double)n) <= 1e-5 * fabs(ref / (double)n), "mean %.9g", got);
  free(x);
}

Test(reduce, argmax_keeps_first_tie_and_first_nan_across_parallel_chunks) {
  int64_t n = 100000;
  double *x = calloc((size_t)n, sizeof *x);
  x[40000] = x[70000] = 5; /* ties in different chunks */
  nb_tensor *t = tc_tensor(x, NB_SHAPE(n), NB_F32);
  cr_assert_eq(nb_item(nb_argmax(t, 0, false)), 40000);
  cr_assert_eq(
      nb_item(nb_argmin(nb_from_data((float[]){3, 1, 1, 2}, NB_SHAPE(4), NB_F32), 0, false)), 1);
  x[60000] = x[90000] = NAN;
  t = tc_tensor(x, NB_SHAPE(n), NB_F64);
  cr_assert_eq(nb_item(nb_argmax(t, 0, false)), 60000);
  cr_assert_eq(nb_item(nb_argmin(t, 0, false)), 60000);
  cr_assert(isnan(nb_item(nb_max(t, NB_ALL, false))));
  /* the same down columns: [n/2, 2] over axis 0 splits rows into partial states */
  double ref[2] = {30000, 0}; /* column 0: first NaN at 60000; column 1: all 0 */
  tc_assert_close(nb_argmax(tc_tensor(x, NB_SHAPE(n / 2, 2), NB_F32), 0, false), ref, NB_SHAPE(2));
  free(x);
}

/* ---- semantics ------------------------------------------------------------------------ */
Test(reduce, result_dtypes_follow_jax) {
  for (int di = 0; di < N_DTYPES; di++) {
    nb_dtype dt = all_dtypes[di];
    nb_tensor *t = nb_zeros(NB_SHAPE(2, 3), dt);
    for (int k = 0; k < K_COUNT; k++)
      cr_assert_eq(nb_dtype_of(reduce_call((kind)k, t, NB_AXES(1), false)),
                   reduce_dtype((kind)k, dt), "%s of %s", kind_names[k], nb_dtype_name(dt));
    nb_dtype fl = nb_dtype_is_float(dt) ? dt : NB_F32;
    cr_assert_eq(nb_dtype_of(nb_softmax(t, 0)), fl);
    cr_assert_eq(nb_dtype_of(nb_log_softmax(t, 0)), fl);
    cr_assert_eq(nb_dtype_of(nb_cumsum(t, 0)), dt == NB_BOOL ? NB_I32 : dt);
  }
}

Test(reduce, keepdims_keeps_reduced_axes_as_size_one) {
  nb_tensor *t = nb_ones(NB_SHAPE(2, 3, 4), NB_F32);
  double r12[2] = {12, 12}, r24[1] = {24};
  tc_assert_close(nb_sum(t, NB_AXES(-1, 1), true), r12, NB_SHAPE(2, 1, 1));
  tc_assert_close(nb_sum(t, NB_AXES(2, 1), false), r12, NB_SHAPE(2));
  tc_assert_close(nb_sum(t, NB_ALL, true), r24, NB_SHAPE(1, 1, 1));
  tc_assert_close(nb_sum(t, NB_ALL, false), r24, NB_SCALAR_SHAPE);
  cr_assert_eq(nb_ndim(nb_argmax(t, -2, true)), 3);
}

Test(reduce, no_axes_reduces_nothing) {
  double x[6] = {1, 0, 1, 1, 0, 0}, v[6] = {-2, 7, 3, 0, 1, 5}, z[6] = {0};
  tc_assert_close(nb_sum(tc_tensor(x, NB_SHAPE(2, 3), NB_BOOL), NB_NO_AXES, false), x,
                  NB_SHAPE(2, 3));
  cr_assert_eq(nb_dtype_of(nb_sum(tc_tensor(x, NB_SHAPE(2, 3), NB_BOOL), NB_NO_AXES, true)),
               NB_I32);
  tc_assert_close(nb_mean(tc_tensor(v, NB_SHAPE(2, 3), NB_I32), NB_NO_AXES, false), v,
                  NB_SHAPE(2, 3));
  tc_assert_close(nb_var(tc_tensor(v, NB_SHAPE(3, 2), NB_F64), NB_NO_AXES, false), z,
                  NB_SHAPE(3, 2));
  tc_assert_close(nb_max(tc_tensor(v, NB_SHAPE(6), NB_F16), NB_NO_AXES, true), v, NB_SHAPE(6));
}

Test(reduce, zero_d_input_gives_its_value) {
  nb_tensor *t = nb_scalar(-2.5, NB_F32);
  for (int k = 0; k < K_COUNT; k++) {
    if (is_arg((kind)k)) continue;
    double ref = ref_fold((kind)k, (double[]){-2.5}, 1);
    tc_assert_close(reduce_call((kind)k, t, NB_ALL, false), &ref, NB_SCALAR_SHAPE);
    tc_assert_close(reduce_call((kind)k, t, NB_NO_AXES, true), &ref, NB_SCALAR_SHAPE);
  }
  cr_assert_eq(nb_item(nb_sum(nb_scalar(1, NB_BOOL), NB_ALL, false)), 1);
}

Test(reduce, empty_reductions_give_identities) {
  nb_tensor *t = nb_zeros(NB_SHAPE(3, 0), NB_F32);
  double zero[3] = {0, 0, 0}, one[3] = {1, 1, 1}, nan3[3] = {NAN, NAN, NAN},
         ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
  tc_assert_close(nb_sum(t, NB_AXES(1), false), zero, NB_SHAPE(3));
  tc_assert_close(nb_prod(t, NB_AXES(1), false), one, NB_SHAPE(3));
  tc_assert_close(nb_mean(t, NB_AXES(1), false), nan3, NB_SHAPE(3));
  tc_assert_close(nb_var(t, NB_AXES(1), false), nan3, NB_SHAPE(3));
  tc_assert_close(nb_std(t, NB_AXES(1), false), nan3, NB_SHAPE(3));
  tc_assert_close(nb_logsumexp(t, NB_AXES(1), false), ninf, NB_SHAPE(3));
  tc_assert_close(nb_any(t, NB_AXES(1), false), zero, NB_SHAPE(3));
  tc_assert_close(nb_all(t, NB_AXES(1), false), one, NB_SHAPE(3));
  tc_assert_close(nb_sum(nb_zeros(NB_SHAPE(0), NB_I32), NB_ALL, false), zero, NB_SCALAR_SHAPE);
  /* an empty result over a non-empty axis is fine even without an identity */
  cr_assert_eq(nb_numel(nb_max(nb_zeros(NB_SHAPE(0, 3), NB_F32), NB_AXES(1), false)), 0);
  cr_assert_eq(nb_numel(nb_argmax(nb_zeros(NB_SHAPE(0, 3), NB_I64), 1, true)), 0);
  cr_assert_eq(nb_numel(nb_softmax(nb_zeros(NB_SHAPE(2, 0), NB_F32), 1)), 0);
  cr_assert_eq(nb_numel(nb_cumsum(nb_zeros(NB_SHAPE(0, 2), NB_F32), 1)), 0);
}

Test(reduce, max_min_var_logsumexp_propagate_nan) {
  double x[6] = {1, NAN, 3, -1, -5, 2}, r_max[2] = {NAN, 2}, r_min[2] = {NAN, -5};
  for (int di = 0; di < 4; di++) { /* float dtypes */
    nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), all_dtypes[di]);
    tc_assert_close(nb_max(t, NB_AXES(1), false), r_max, NB_SHAPE(2));
    tc_assert_close(nb_min(t, NB_AXES(1), false), r_min, NB_SHAPE(2));
    cr_assert(isnan(nb_item(nb_var(t, NB_ALL, false))));
    cr_assert(isnan(nb_item(nb_logsumexp(t, NB_ALL, false))));
    cr_assert(isnan(nb_item(nb_max(t, NB_ALL, false))));
  }
}

Test(reduce, argmax_argmin_take_nan_as_extreme_and_first_of_ties) {
  double x[8] = {1, 4, 4, -2, 0, NAN, 2, NAN};
  double amax[2] = {1, 1}, amin[2] = {3, 1};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 4), NB_F64);
  tc_assert_close(nb_argmax(t, 1, false), amax, NB_SHAPE(2));
  tc_assert_close(nb_argmin(t, -1, false), amin, NB_SHAPE(2));
  double b[5] = {0, 1, 1, 0, 1}, col[5] = {0, 0, 0, 0, 0};
  cr_assert_eq(nb_item(nb_argmax(tc_tensor(b, NB_SHAPE(5), NB_BOOL), 0, false)), 1);
  cr_assert_eq(nb_item(nb_argmin(tc_tensor(b, NB_SHAPE(5), NB_BOOL), 0, false)), 0);
  tc_assert_close(nb_argmax(tc_tensor(b, NB_SHAPE(1, 5), NB_I32), 0, false), col, NB_SHAPE(5));
}

Test(reduce, any_all_count_nan_as_true) {
  double x[3] = {NAN, 0, 1};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(3), NB_F32);
  double r_any[3] = {1, 0, 1};
  tc_assert_close(nb_any(t, NB_NO_AXES, false), r_any, NB_SHAPE(3));
  cr_assert_eq(nb_item(nb_all(tc_tensor((double[]){NAN, 2}, NB_SHAPE(2), NB_F16), NB_ALL, false)),
               1);
}

Test(reduce, integer_sums_wrap_to_the_result_width) {
  int32_t x[2] = {INT32_MAX, 1};
  cr_assert_eq(nb_item(nb_sum(nb_from_data(x, NB_SHAPE(2), NB_I32), NB_ALL, false)), INT32_MIN);
  int64_t y[2] = {INT64_MAX, 2}, got;
  nb_to_host(nb_sum(nb_from_data(y, NB_SHAPE(2), NB_I64), NB_ALL, false), &got, sizeof got);
  cr_assert_eq(got, INT64_MIN + 1);
  int64_t cs[2];
  nb_to_host(nb_cumsum(nb_from_data(y, NB_SHAPE(2), NB_I64), 0), cs, sizeof cs);
  cr_assert(cs[0] == INT64_MAX && cs[1] == INT64_MIN + 1);
  int32_t cs32[2];
  nb_to_host(nb_cumsum(nb_from_data(x, NB_SHAPE(2), NB_I32), 0), cs32, sizeof cs32);
  cr_assert(cs32[0] == INT32_MAX && cs32[1] == INT32_MIN);
  int64_t big[2] = {(int64_t)1 << 53, 1}; /* beyond double: integers stay exact */
  nb_to_host(nb_sum(nb_from_data(big, NB_SHAPE(2), NB_I64), NB_ALL, false), &got, sizeof got);
  cr_assert_eq(got, ((int64_t)1 << 53) + 1);
  nb_to_host(nb_max(nb_from_data(big, NB_SHAPE(2), NB_I64), NB_ALL, false), &got, sizeof got);
  cr_assert_eq(got, (int64_t)1 << 53);
}

Test(reduce, bool_bytes_other_than_one_count_as_true) {
  uint8_t raw[4] = {2, 0, 255, 1};
  nb_tensor *t = nb_from_data(raw, NB_SHAPE(4), NB_BOOL);
  cr_assert_eq(nb_item(nb_sum(t, NB_ALL, false)), 3);
  cr_assert_eq(nb_item(nb_max(t, NB_ALL, false)), 1);
  cr_assert_eq(nb_item(nb_argmin(t, 0, false)), 1);
  cr_assert_eq(nb_item(nb_argmax(t, 0, false)), 0);
  cr_assert_eq(nb_item(nb_mean(t, NB_ALL, false)), 0.75);
  double cs[4] = {1, 1, 2, 3};
  tc_assert_close(nb_cumsum(t, 0), cs, NB_SHAPE(4));
}

Test(reduce, broadcast_input_with_zero_strides) {
  double row[3] = {1, -2, 5};
  nb_tensor *base = tc_tensor(row, NB_SHAPE(3), NB_F32);
  nb_tensor *t = view_of(base, NB_SHAPE(4, 3), (int64_t[]){0, 1}, 0); /* 4 copies of row */
  double sum0[3] = {4, -8, 20}, amax[4] = {2, 2, 2, 2};
  tc_assert_close(nb_sum(t, NB_AXES(0), false), sum0, NB_SHAPE(3));
  tc_assert_close(nb_argmax(t, 1, false), amax, NB_SHAPE(4));
  nb_tensor *c = nb_cumsum(t, 0);
  double *got = tc_read(c);
  for (int j = 0; j < 3; j++)
    cr_assert_eq(got[9 + j], 4 * row[j]);
  free(got);
  double quarter[12];
  for (int i = 0; i < 12; i++)
    quarter[i] = 0.25;
  tc_assert_close(nb_softmax(t, 0), quarter, NB_SHAPE(4, 3));
}

/* ---- softmax and log_softmax ------------------------------------------------------------ */
/* Reference softmax / log_softmax of x (shape s) along axis. */
static void ref_softmax(const double *x, nb_shape s, int axis, bool lg, double *out) {
  int64_t A = 1, N = s.dims[axis], B = 1;
  for (int d = 0; d < axis; d++)
    A *= s.dims[d];
  for (int d = axis + 1; d < s.ndim; d++)
    B *= s.dims[d];
  for (int64_t a = 0; a < A; a++)
    for (int64_t b = 0; b < B; b++) {
      const double *xr = x + a * N * B + b;
      double *yr = out + a * N * B + b, m = -INFINITY, z = 0;
      for (int64_t i = 0; i < N; i++)
        m = fmax(m, xr[i * B]);
      for (int64_t i = 0; i < N; i++)
        z += exp(xr[i * B] - m);
      for (int64_t i = 0; i < N; i++)
        yr[i * B] = lg ? xr[i * B] - m - log(z) : exp(xr[i * B] - m) / z;
    }
}

static void check_softmax_everywhere(bool lg) {
  uint64_t seed = lg ? 21 : 22;
  for (int di = 0; di < N_DTYPES; di++)
    for (int trial = 0; trial < 30; trial++) {
      nb_dtype dt = all_dtypes[di];
      nb_shape s = random_shape(&seed, 1 + trial % 4, trial % 5 == 0 ? 0.15 : 0);
      if (trial % 7 == 0) s.dims[s.ndim - 1] = 300; /* long rows and column blocks */
      int axis = rand_int(&seed, -s.ndim, s.ndim - 1);
      int64_t n = tc_numel(s);
      double *x = random_values(&seed, n, dt, -8, 8), *ref = malloc((size_t)(n + 1) * 8);
      layout L = (layout)(trial % L_COUNT);
      char what[32];
      snprintf(what, sizeof what, "axis %d", axis);
      describe(lg ? "log_softmax" : "softmax", dt, s, what, L);
      nb_tensor *t = tensor_in_layout(x, s, dt, L);
      nb_tensor *r = lg ? nb_log_softmax(t, axis) : nb_softmax(t, axis);
      ref_softmax(x, s, axis < 0 ? axis + s.ndim : axis, lg, ref);
      nb_dtype odt = nb_dtype_is_float(dt) ? dt : NB_F32;
      check_close(r, ref, s, odt, tc_tol(odt));
      free(x);
      free(ref);
    }
}

Test(reduce, softmax_matches_reference_for_every_dtype_and_axis) {
  check_softmax_everywhere(false);
}
Test(reduce, log_softmax_matches_reference_for_every_dtype_and_axis) {
  check_softmax_everywhere(true);
}

Test(reduce, softmax_rows_sum_to_one) {
  uint64_t seed = 5;
  double *x = random_values(&seed, 64 * 1000, NB_F32, -20, 20);
  nb_tensor *t = tc_tensor(x, NB_SHAPE(64, 1000), NB_F32);
  double ones[1000];
  for (int i = 0; i < 1000; i++)
    ones[i] = 1;
  tc_assert_close(nb_sum(nb_softmax(t, 1), NB_AXES(1), false), ones, NB_SHAPE(64));
  tc_assert_close(nb_sum(nb_softmax(t, 0), NB_AXES(0), false), ones, NB_SHAPE(1000));
  free(x);
}

Test(reduce, softmax_of_large_logits_does_not_overflow) {
  double x[8] = {1000, 1001, 1002, 999, -1000, -1001, -998, -1003}, ref[8];
  for (int lg = 0; lg < 2; lg++) {
    ref_softmax(x, NB_SHAPE(2, 4), 1, lg, ref);
    for (int di = 0; di < 2; di++) {
      tc_assert_close(lg ? nb_log_softmax(tc_tensor(x, NB_SHAPE(2, 4), all_dtypes[di]), -1)
                         : nb_softmax(tc_tensor(x, NB_SHAPE(2, 4), all_dtypes[di]), -1),
                      ref, NB_SHAPE(2, 4));
    }
    ref_softmax(x, NB_SHAPE(4, 2), 0, lg, ref);
    tc_assert_close(lg ? nb_log_softmax(tc_tensor(x, NB_SHAPE(4, 2), NB_F32), 0)
                       : nb_softmax(tc_tensor(x, NB_SHAPE(4, 2), NB_F32), 0),
                    ref, NB_SHAPE(4, 2));
  }
  double lse = nb_item(nb_logsumexp(tc_tensor(x, NB_SHAPE(8), NB_F32), NB_ALL, false));
  cr_assert(fabs(lse - (1002 + log(1 + exp(-1) + exp(-2) + exp(-3)))) < 1e-3, "lse %g", lse);
}

Test(reduce, softmax_gives_zero_to_minus_inf_and_nan_to_rows_with_nan) {
  double x[6] = {-INFINITY, 0, 0, 1, NAN, 2}, ref[6] = {0, 0.5, 0.5, NAN, NAN, NAN};
  tc_assert_close(nb_softmax(tc_tensor(x, NB_SHAPE(2, 3), NB_F32), 1), ref, NB_SHAPE(2, 3));
  double lref[3] = {-INFINITY, -log(2), -log(2)};
  double *got = tc_read(nb_log_softmax(tc_tensor(x, NB_SHAPE(2, 3), NB_F64), 1));
  for (int i = 0; i < 3; i++)
    cr_assert(got[i] == lref[i] || fabs(got[i] - lref[i]) < 1e-12);
  for (int i = 3; i < 6; i++)
    cr_assert(isnan(got[i]));
  free(got);
}

/* Long f32 rows take the vector max (k_reduce.c softmax_max_f32_S): a NaN in
 * the vector part or the tail makes its row NaN, and a row whose max is a zero
 * of either sign gives the same bits on every ISA (log_softmax of [-0, -1, ...]
 * keeps the sign rules of the portable path). */
Test(reduce, softmax_rows_with_nan_or_zero_max_agree_on_every_isa) {
  int64_t rows = 6, n = 1029;
  float *x = malloc(sizeof(float) * (size_t)(rows * n));
  for (int64_t i = 0; i < rows * n; i++)
    x[i] = -(float)(i % 97) * 0.25f - 0.5f;
  int64_t nan_at[4] = {0, 17, 1000, 1028}; /* rows 0-3: vector part, 16-block, tail */
  for (int r = 0; r < 4; r++)
    x[r * n + nan_at[r]] = NAN;
  x[4 * n + 500] = -0.0f; /* row 4: max -0 */
  x[5 * n + 3] = -0.0f;   /* row 5: max +0 beside a -0 */
  x[5 * n + 900] = 0.0f;
  float *want = malloc(sizeof(float) * (size_t)(2 * rows * n));
  for (int isa = 0; isa < NBI_ISA_COUNT; isa++) { /* the portable path first */
    if (nbi_isa_select((nbi_isa)isa) != (nbi_isa)isa) continue;
    for (int lg = 0; lg < 2; lg++) {
      nb_scope_begin();
      nb_tensor *t = nb_from_data(x, NB_SHAPE(rows, n), NB_F32);
      nb_tensor *y = lg ? nb_log_softmax(t, -1) : nb_softmax(t, -1);
      float *got = malloc(sizeof(float) * (size_t)(rows * n)), *w = want + lg * rows * n;
      cr_assert_eq(nb_to_host(y, got, sizeof(float) * (size_t)(rows * n)), NB_OK);
      for (int r = 0; r < 4; r++)
        for (int64_t j = 0; j < n; j++)
          cr_assert(isnan(got[r * n + j]), "isa %d lg %d: row %d not NaN at %lld", isa, lg, r,
                    (long long)j);
      if (isa == NBI_ISA_PORTABLE)
        memcpy(w, got, sizeof(float) * (size_t)(rows * n));
      else
        cr_assert(memcmp(w + 4 * n, got + 4 * n, sizeof(float) * 2 * (size_t)n) == 0,
                  "isa %d lg %d: zero-max rows differ from the portable path", isa, lg);
      free(got);
      nb_scope_end();
    }
  }
  nbi_isa_select(NBI_ISA_COUNT);
  free(want);
  free(x);
}

/* ---- cumsum --------------------------------------------------------------------------------- */
static void ref_cumsum(const double *x, nb_shape s, int axis, double *out) {
  int64_t A = 1, N = s.dims[axis], B = 1;
  for (int d = 0; d < axis; d++)
    A *= s.dims[d];
  for (int d = axis + 1; d < s.ndim; d++)
    B *= s.dims[d];
  for (int64_t a = 0; a < A; a++)
    for (int64_t b = 0; b < B; b++) {
      double acc = 0;
      for (int64_t i = 0; i < N; i++)
        out[(a * N + i) * B + b] = acc += x[(a * N + i) * B + b];
    }
}

Test(reduce, cumsum_matches_reference_along_every_axis_and_dtype) {
  uint64_t seed = 31;
  for (int di = 0; di < N_DTYPES; di++)
    for (int trial = 0; trial < 30; trial++) {
      nb_dtype dt = all_dtypes[di];
      nb_shape s = random_shape(&seed, 1 + trial % 4, trial % 5 == 0 ? 0.15 : 0);
      if (trial % 7 == 0) s.dims[s.ndim - 1] = 300;
      int64_t n = tc_numel(s);
      double *x = random_values(&seed, n, dt, -3, 3), *ref = malloc((size_t)(n + 1) * 8);
      for (int axis = -s.ndim; axis < s.ndim; axis += 1 + trial % 2) {
        layout L = (layout)((trial + axis + 8) % L_COUNT);
        char what[32];
        snprintf(what, sizeof what, "axis %d", axis);
        describe("cumsum", dt, s, what, L);
        ref_cumsum(x, s, axis < 0 ? axis + s.ndim : axis, ref);
        nb_dtype odt = dt == NB_BOOL ? NB_I32 : dt;
        check_close(nb_cumsum(tensor_in_layout(x, s, dt, L), axis), ref, s, odt, tc_tol(odt));
      }
      free(x);
      free(ref);
    }
}

/* ---- bad inputs ------------------------------------------------------------------------------ */
Test(reduce, null_input_fails_every_op_naming_it) {
  for (int k = 0; k < K_COUNT; k++) {
    cr_assert_null(reduce_call((kind)k, NULL, NB_AXES(0), false));
    char name[32];
    snprintf(name, sizeof name, "nb_%s", k == K_LSE ? "logsumexp" : kind_names[k]);
    tc_assert_error(NB_ERR_NULL, name);
  }
  cr_assert_null(nb_softmax(NULL, 0));
  tc_assert_error(NB_ERR_NULL, "nb_softmax");
  cr_assert_null(nb_log_softmax(NULL, 0));
  tc_assert_error(NB_ERR_NULL, "nb_log_softmax");
  cr_assert_null(nb_cumsum(NULL, 0));
  tc_assert_error(NB_ERR_NULL, "nb_cumsum");
}

Test(reduce, axis_out_of_range_names_the_axis_and_rank) {
  nb_tensor *t = nb_ones(NB_SHAPE(2, 3), NB_F32);
  cr_assert_null(nb_sum(t, NB_AXES(2), false));
  tc_assert_error(NB_ERR_AXIS, "nb_sum: axis 2 out of range for rank 2");
  cr_assert_null(nb_var(t, NB_AXES(0, -3), true));
  tc_assert_error(NB_ERR_AXIS, "nb_var: axis -3 out of range for rank 2");
  cr_assert_null(nb_argmax(t, 5, false));
  tc_assert_error(NB_ERR_AXIS, "nb_argmax: axis 5 out of range for rank 2");
  cr_assert_null(nb_argmin(nb_scalar(1, NB_F32), 0, false));
  tc_assert_error(NB_ERR_AXIS, "nb_argmin: axis 0 out of range for rank 0");
  cr_assert_null(nb_softmax(t, -3));
  tc_assert_error(NB_ERR_AXIS, "nb_softmax: axis -3 out of range for rank 2");
  cr_assert_null(nb_log_softmax(t, 2));
  tc_assert_error(NB_ERR_AXIS, "nb_log_softmax: axis 2 out of range for rank 2");
  cr_assert_null(nb_cumsum(nb_scalar(1, NB_I32), 0));
  tc_assert_error(NB_ERR_AXIS, "nb_cumsum: axis 0 out of range for rank 0");
  cr_assert_null(nb_max(nb_scalar(1, NB_F32), NB_AXES(0), false));
  tc_assert_error(NB_ERR_AXIS, "nb_max: axis 0 out of range for rank 0");
}

Test(reduce, repeated_or_too_many_axes_fail) {
  nb_tensor *t = nb_ones(NB_SHAPE(2, 3), NB_F32);
  cr_assert_null(nb_mean(t, NB_AXES(0, -2), false));
  tc_assert_error(NB_ERR_AXIS, "nb_mean: axis -2 repeated");
  cr_assert_null(nb_any(t, NB_AXES(1, 1), true));
  tc_assert_error(NB_ERR_AXIS, "nb_any: axis 1 repeated");
  cr_assert_null(nb_prod(t, (nb_axes){.n = 9}, false));
  tc_assert_error(NB_ERR_AXIS, "nb_prod");
  cr_assert_null(nb_logsumexp(t, (nb_axes){.n = -2}, false));
  tc_assert_error(NB_ERR_AXIS, "nb_logsumexp");
}

Test(reduce, max_min_argmax_argmin_over_an_empty_axis_fail_at_call_time) {
  nb_tensor *t = nb_zeros(NB_SHAPE(3, 0), NB_F32);
  cr_assert_null(nb_max(t, NB_AXES(1), false));
  tc_assert_error(NB_ERR_SHAPE,
                  "nb_max: zero-size reduction (axis 1 of shape [3,0]) has no identity");
  cr_assert_null(nb_min(t, NB_ALL, true));
  tc_assert_error(NB_ERR_SHAPE, "nb_min: zero-size reduction");
  cr_assert_null(nb_argmax(t, -1, false));
  tc_assert_error(NB_ERR_SHAPE, "nb_argmax: zero-size reduction");
  cr_assert_null(nb_argmin(nb_zeros(NB_SHAPE(0, 0), NB_I32), 0, true));
  tc_assert_error(NB_ERR_SHAPE, "has no identity");
}

/* An empty shape whose other dims multiply past 2^48 is refused when made (its
 * strides would overflow), so no reduction ever sees a result that large. */
Test(reduce, result_too_large_fails) {
  nb_tensor *t = nb_zeros(NB_SHAPE(1 << 30, 0, 1 << 30), NB_F32);
  cr_assert_null(t);
  tc_assert_error(NB_ERR_OVERFLOW, "nb_zeros");
  cr_assert_null(nb_sum(t, NB_AXES(1), false));
}

Test(reduce, input_is_unchanged_after_failed_calls) {
  double x[6] = {1, -2, 3, 4, -5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  cr_assert_null(nb_sum(t, NB_AXES(4), false));
  cr_assert_null(nb_max(t, NB_AXES(1, 1), false));
  cr_assert_null(nb_argmax(t, -9, false));
  cr_assert_null(nb_softmax(t, 2));
  cr_assert_null(nb_cumsum(t, -3));
  nb_clear_error();
  tc_assert_close(t, x, NB_SHAPE(2, 3));
  double s[2] = {2, 5};
  tc_assert_close(nb_sum(t, NB_AXES(1), false), s, NB_SHAPE(2));
}
