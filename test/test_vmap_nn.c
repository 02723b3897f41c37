/* test/test_vmap_nn.c — batching rules of the linalg and NN families.
 *
 * Every check compares nb_vmap(f) with a loop that calls f once per example:
 * the examples are cut out of the batched inputs on the host (independently
 * of the library's view ops) and the loop's outputs are compared with the
 * batched outputs, slice by slice. Covered: matmul in every 1-D/2-D/3-D
 * combination and with broadcast leading dims, each operand mapped or not,
 * in_axes 0, 1 and -1; conv2d with and without bias, strides, padding,
 * dilation and groups, each of x, weight, bias mapped or not; max_pool2d; the
 * derivative primitives conv2d_bwd_data / _bwd_filter and max_pool2d_bwd /
 * _select directly, and through nb_vjp_fn / nb_jvp_fn; composites (einsum,
 * layer_norm, attention, cross_entropy); per-example gradients of a small CNN
 * (nb_vmap(nb_grad(loss))) against a loop of nb_grad; empty batches. */
#include "grad_check.h"

#include "../src/ops/nn.h"

TestSuite(vmap_nn, .init = tc_setup, .fini = tc_teardown);

#define MAX_IO 8

/* ---- harness ------------------------------------------------------------------------ */

/* A random f64 tensor for per-example shape e: mapped along axis (negative
 * counts from the end of the batched rank) with B examples, or e itself when
 * axis is NB_NOT_MAPPED. */
static nb_tensor *rand_mapped(nb_shape e, int axis, int64_t B, uint64_t *seed) {
  if (axis == NB_NOT_MAPPED) return tc_rand_f64(e, -1, 1, seed);
  nb_shape s = {.ndim = e.ndim + 1};
  int a = axis < 0 ? axis + s.ndim : axis;
  for (int d = 0, k = 0; d < s.ndim; d++)
    s.dims[d] = d == a ? B : e.dims[k++];
  return tc_rand_f64(s, -1, 1, seed);
}

/* Example b of t along axis (normalized): built from host data. */
static nb_tensor *example_of(nb_tensor *t, int axis, int64_t b) {
  nb_shape s = nb_shape_of(t), e = {.ndim = s.ndim - 1};
  int a = axis < 0 ? axis + s.ndim : axis;
  int64_t outer = 1, inner = 1;
  for (int d = 0, k = 0; d < s.ndim; d++) {
    if (d == a) continue;
    e.dims[k++] = s.dims[d];
    if (d < a)
      outer *= s.dims[d];
    else
      inner *= s.dims[d];
  }
  double *x = tc_read(t), *y = malloc((size_t)(outer * inner + 1) * sizeof *y);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++)
      y[o * inner + i] = x[(o * s.dims[a] + b) * inner + i];
  nb_tensor *r = tc_tensor(y, e, nb_dtype_of(t));
  free(x);
  free(y);
  return r;
}

/* nb_vmap(f, in_axes) (out_axes 0) on in against f called on each example:
 * output j must be (B, *example output j) holding the examples' outputs, to
 * tol relative to the largest magnitude. Returns B. */
static int64_t check_vmap(const char *what, nb_fn *f, nb_tensor *const *in, const int *in_axes,
                          double tol) {
  int n_in = nb_fn_n_in(f), n_out = nb_fn_n_out(f);
  cr_assert(n_in <= MAX_IO && n_out <= MAX_IO);
  int64_t B = -1;
  for (int k = 0; k < n_in && B < 0; k++)
    if (in_axes[k] != NB_NOT_MAPPED) {
      nb_shape s = nb_shape_of(in[k]);
      B = s.dims[in_axes[k] < 0 ? in_axes[k] + s.ndim : in_axes[k]];
    }
  nb_scope_begin();
  nb_fn *v = nb_vmap(f, in_axes, NULL);
  cr_assert(v, "%s: nb_vmap: %s", what, nb_last_error());
  nb_tensor *vo[MAX_IO];
  cr_assert_eq(nb_call(v, in, vo), NB_OK, "%s: vmap call: %s", what, nb_last_error());
  double *got[MAX_IO];
  for (int j = 0; j < n_out; j++)
    got[j] = tc_read(vo[j]);
  for (int64_t b = 0; b < B; b++) {
    nb_scope_begin();
    nb_tensor *ex[MAX_IO], *lo[MAX_IO];
    for (int k = 0; k < n_in; k++)
      ex[k] = in_axes[k] == NB_NOT_MAPPED ? in[k] : example_of(in[k], in_axes[k], b);
    cr_assert_eq(nb_call(f, ex, lo), NB_OK, "%s: example %lld: %s", what, (long long)b,
                 nb_last_error());
    for (int j = 0; j < n_out; j++) {
      nb_shape es = nb_shape_of(lo[j]), vs = nb_shape_of(vo[j]);
      cr_assert_eq(nb_dtype_of(vo[j]), nb_dtype_of(lo[j]), "%s: output %d dtype", what, j);
      cr_assert(vs.ndim == es.ndim + 1 && vs.dims[0] == B &&
                    !memcmp(vs.dims + 1, es.dims, sizeof(int64_t) * (size_t)es.ndim),
                "%s: output %d has rank %d, example output rank %d", what, j, vs.ndim, es.ndim);
      int64_t m = nb_numel(lo[j]);
      double *want = tc_read(lo[j]);
      char part[64];
      snprintf(part, sizeof part, "output %d example %lld", j, (long long)b);
      tc_assert_vec_close(what, part, got[j] + b * m, want, m, tol);
      free(want);
    }
    nb_scope_end();
  }
  for (int j = 0; j < n_out; j++)
    free(got[j]);
  nb_fn_release(v);
  nb_scope_end();
  return B;
}

/* The in_axes value for case i of a mapped input: 0, 1, -1 in turn. */
static int axis_choice(int i) { return (int[]){0, 1, -1}[i % 3]; }

/* ---- matmul ----------------------------------------------------------------------------- */

static nb_status f_matmul(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_matmul(in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}

/* Each operand pair (per-example shapes) with every map pattern and in_axes. */
static void check_matmul_pairs(const nb_shape *as, const nb_shape *bs, int n_pairs) {
  nb_fn *f = nb_fn_create(f_matmul, NULL, 2, 1);
  uint64_t seed = 7;
  int cases = 0;
  for (int p = 0; p < n_pairs; p++)
    for (int mask = 1; mask <= 3; mask++)
      for (int ax = 0; ax < 3; ax++) {
        nb_scope_begin();
        int axes[2] = {mask & 1 ? axis_choice(ax) : NB_NOT_MAPPED,
                       mask & 2 ? axis_choice(ax + p) : NB_NOT_MAPPED};
        nb_tensor *in[2] = {rand_mapped(as[p], axes[0], 3, &seed),
                            rand_mapped(bs[p], axes[1], 3, &seed)};
        char what[96];
        snprintf(what, sizeof what, "matmul pair %d (ranks %d, %d) axes %d, %d", p, as[p].ndim,
                 bs[p].ndim, axes[0], axes[1]);
        cr_assert_eq(check_vmap(what, f, in, axes, 1e-12), 3);
        nb_scope_end();
        cases++;
      }
  cr_assert_eq(cases, n_pairs * 9);
  nb_fn_release(f);
}

Test(vmap_nn, matmul_ranks_1_2_3) {
  /* K = 4, M = 2, N = 5, leading P = 6 (B = 3) */
  nb_shape opts_a[3] = {NB_SHAPE(4), NB_SHAPE(2, 4), NB_SHAPE(6, 2, 4)};
  nb_shape opts_b[3] = {NB_SHAPE(4), NB_SHAPE(4, 5), NB_SHAPE(6, 4, 5)};
  nb_shape as[9], bs[9];
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++)
      as[3 * i + j] = opts_a[i], bs[3 * i + j] = opts_b[j];
  check_matmul_pairs(as, bs, 9);
}

Test(vmap_nn, matmul_broadcast_leading_dims) {
  nb_shape as[] = {NB_SHAPE(2, 1, 3, 4), NB_SHAPE(4), NB_SHAPE(1, 3, 4), NB_SHAPE(2, 6, 3, 4),
                   NB_SHAPE(6, 1, 4)};
  nb_shape bs[] = {NB_SHAPE(6, 4, 5), NB_SHAPE(2, 6, 4, 5), NB_SHAPE(6, 4, 5), NB_SHAPE(4),
                   NB_SHAPE(2, 1, 4, 5)};
  check_matmul_pairs(as, bs, 5);
}

/* Mixed dtypes keep matmul's promotion; a mapped operand with B = 1. */
Test(vmap_nn, matmul_dtypes_and_single_example) {
  nb_fn *f = nb_fn_create(f_matmul, NULL, 2, 1);
  uint64_t seed = 3;
  double *xa = tc_rand_floats(2 * 3 * 4, NB_F32, &seed), *xb = tc_rand_floats(4 * 5, NB_F64, &seed);
  nb_tensor *in[2] = {tc_tensor(xa, NB_SHAPE(2, 3, 4), NB_F32),
                      tc_tensor(xb, NB_SHAPE(4, 5), NB_F64)};
  check_vmap("f32 @ f64", f, in, (int[]){0, NB_NOT_MAPPED}, 1e-6);
  nb_tensor *one[2] = {rand_mapped(NB_SHAPE(3, 4), 0, 1, &seed),
                       rand_mapped(NB_SHAPE(4), 0, 1, &seed)};
  cr_assert_eq(check_vmap("B = 1", f, one, (int[]){0, 0}, 1e-12), 1);
  free(xa);
  free(xb);
  nb_fn_release(f);
}

/* A vmapped matmul is one batched matmul: the kernels run do not grow with B. */
Test(vmap_nn, matmul_is_one_op) {
  nb_fn *f = nb_fn_create(f_matmul, NULL, 2, 1), *v = nb_vmap(f, NULL, NULL);
  uint64_t seed = 5;
  uint64_t runs[2];
  int64_t sizes[2] = {2, 64};
  for (int i = 0; i < 2; i++) {
    nb_tensor *in[2] = {rand_mapped(NB_SHAPE(3, 4), 0, sizes[i], &seed),
                        rand_mapped(NB_SHAPE(4), 0, sizes[i], &seed)},
              *out[1];
    cr_assert_eq(nb_call(v, in, out), NB_OK, "%s", nb_last_error());
    nb_reset_stats();
    cr_assert_eq(nb_eval(out, 1), NB_OK);
    runs[i] = nb_get_stats().kernels_run;
  }
  cr_assert_eq(runs[0], runs[1], "kernels for B = 2: %llu, for B = 64: %llu",
               (unsigned long long)runs[0], (unsigned long long)runs[1]);
  nb_fn_release(v);
  nb_fn_release(f);
}

/* ---- conv2d and max_pool2d ------------------------------------------------------------- */

/* A convolution geometry: per-example x [n, c, h, w], weight [o, c/groups,
 * kh, kw], bias [o] when bias. */
typedef struct conv_case {
  int64_t n, c, h, w, o, kh, kw;
  nb_conv2d_params p;
  bool bias;
} conv_case;

static const conv_case CONV_CASES[] = {
    {2, 3, 6, 5, 4, 3, 3, {{1, 1}, {0, 0}, {1, 1}, 1}, true},
    {1, 2, 7, 6, 3, 3, 2, {{2, 1}, {1, 0}, {1, 1}, 1}, false},
    {2, 4, 6, 6, 6, 2, 3, {{1, 2}, {1, 1}, {2, 1}, 2}, true},
    {3, 4, 5, 5, 2, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 2}, false},
};
#define N_CONV_CASES (int)(sizeof CONV_CASES / sizeof *CONV_CASES)

static nb_shape conv_x(const conv_case *k) { return NB_SHAPE(k->n, k->c, k->h, k->w); }
static nb_shape conv_w(const conv_case *k) {
  return NB_SHAPE(k->o, k->c / (k->p.groups ? k->p.groups : 1), k->kh, k->kw);
}

static nb_status f_conv(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_out;
  out[0] = nb_conv2d(in[0], in[1], n_in == 3 ? in[2] : NULL, u);
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_nn, conv2d_each_operand_mapped_or_not) {
  uint64_t seed = 11;
  for (int c = 0; c < N_CONV_CASES; c++) {
    const conv_case *k = &CONV_CASES[c];
    int n_in = k->bias ? 3 : 2;
    nb_fn *f = nb_fn_create(f_conv, (void *)&k->p, n_in, 1);
    for (int mask = 1; mask < 1 << n_in; mask++) {
      nb_scope_begin();
      int axes[3];
      nb_shape es[3] = {conv_x(k), conv_w(k), NB_SHAPE(k->o)};
      nb_tensor *in[3];
      for (int i = 0; i < n_in; i++) {
        axes[i] = mask >> i & 1 ? axis_choice(mask + i + c) : NB_NOT_MAPPED;
        in[i] = rand_mapped(es[i], axes[i], 3, &seed);
      }
      char what[96];
      snprintf(what, sizeof what, "conv2d case %d mask %d", c, mask);
      check_vmap(what, f, in, axes, 1e-12);
      nb_scope_end();
    }
    nb_fn_release(f);
  }
}

static nb_status f_pool(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const int *g = u;
  out[0] = nb_max_pool2d(in[0], g[0], g[1], g[2], g[3], g[4], g[5]);
  return out[0] ? NB_OK : nb_last_status();
}

static const int POOL_CASES[][6] = {{2, 2, 0, 0, 0, 0}, {3, 2, 2, 1, 1, 1}, {3, 3, 1, 2, 1, 0}};

Test(vmap_nn, max_pool2d) {
  uint64_t seed = 13;
  for (int c = 0; c < 3; c++) {
    nb_fn *f = nb_fn_create(f_pool, (void *)POOL_CASES[c], 1, 1);
    for (int ax = 0; ax < 3; ax++) {
      nb_tensor *in[1] = {rand_mapped(NB_SHAPE(2, 3, 7, 6), axis_choice(ax), 4, &seed)};
      check_vmap("max_pool2d", f, in, (int[]){axis_choice(ax)}, 0);
    }
    nb_fn_release(f);
  }
}

/* ---- the derivative primitives, directly --------------------------------------------------- */

/* The CONV2D attrs of case k. */
static nbi_attrs case_attrs(const conv_case *k) {
  nbi_attrs at = {0};
  for (int i = 0; i < 2; i++) {
    at.i[NBI_CONV_STRIDE + i] = k->p.stride[i] ? k->p.stride[i] : 1;
    at.i[NBI_CONV_PAD + i] = k->p.padding[i];
    at.i[NBI_CONV_DILATION + i] = k->p.dilation[i] ? k->p.dilation[i] : 1;
  }
  at.i[NBI_CONV_GROUPS] = k->p.groups ? k->p.groups : 1;
  return at;
}

/* The per-example output shape of conv2d for case k. */
static nb_shape conv_y(const conv_case *k) {
  nbi_attrs at = case_attrs(k);
  int64_t oh = (k->h + 2 * at.i[NBI_CONV_PAD] - at.i[NBI_CONV_DILATION] * (k->kh - 1) - 1) /
                   at.i[NBI_CONV_STRIDE] +
               1;
  int64_t ow = (k->w + 2 * at.i[NBI_CONV_PAD + 1] - at.i[NBI_CONV_DILATION + 1] * (k->kw - 1) - 1) /
                   at.i[NBI_CONV_STRIDE + 1] +
               1;
  return NB_SHAPE(k->n, k->o, oh, ow);
}

static nb_status f_bwd_data(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const conv_case *k = u;
  nbi_attrs at = case_attrs(k);
  out[0] = nbi_conv2d_bwd_data(in[0], in[1], &at, k->h, k->w);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status f_bwd_filter(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const conv_case *k = u;
  nbi_attrs at = case_attrs(k);
  out[0] = nbi_conv2d_bwd_filter(in[0], in[1], &at, k->kh, k->kw);
  return out[0] ? NB_OK : nb_last_status();
}

/* Both conv derivative ops on every case, each operand mapped or not. */
Test(vmap_nn, conv2d_bwd_data_and_bwd_filter) {
  uint64_t seed = 17;
  for (int c = 0; c < N_CONV_CASES; c++) {
    const conv_case *k = &CONV_CASES[c];
    nb_fn *fd = nb_fn_create(f_bwd_data, (void *)k, 2, 1);
    nb_fn *ff = nb_fn_create(f_bwd_filter, (void *)k, 2, 1);
    for (int mask = 1; mask <= 3; mask++) {
      nb_scope_begin();
      int axes[2] = {mask & 1 ? axis_choice(c + mask) : NB_NOT_MAPPED,
                     mask & 2 ? axis_choice(c + mask + 1) : NB_NOT_MAPPED};
      char what[96];
      nb_tensor *din[2] = {rand_mapped(conv_y(k), axes[0], 3, &seed),
                           rand_mapped(conv_w(k), axes[1], 3, &seed)};
      snprintf(what, sizeof what, "conv2d_bwd_data case %d mask %d", c, mask);
      check_vmap(what, fd, din, axes, 1e-12);
      nb_tensor *fin[2] = {rand_mapped(conv_x(k), axes[0], 3, &seed),
                           rand_mapped(conv_y(k), axes[1], 3, &seed)};
      snprintf(what, sizeof what, "conv2d_bwd_filter case %d mask %d", c, mask);
      check_vmap(what, ff, fin, axes, 1e-12);
      nb_scope_end();
    }
    nb_fn_release(fd);
    nb_fn_release(ff);
  }
}

/* The MAX_POOL2D attrs of a POOL_CASES row. */
static nbi_attrs pool_case_attrs(const int *g) {
  nbi_attrs at = {0};
  for (int i = 0; i < 2; i++) {
    at.i[NBI_POOL_KERNEL + i] = g[i];
    at.i[NBI_POOL_STRIDE + i] = g[2 + i] ? g[2 + i] : g[i];
    at.i[NBI_POOL_PAD + i] = g[4 + i];
  }
  return at;
}

static nb_status f_pool_bwd(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nbi_attrs at = pool_case_attrs(u);
  out[0] = nbi_max_pool2d_bwd(in[0], in[1], &at);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status f_pool_select(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)n_in, (void)n_out;
  nbi_attrs at = pool_case_attrs(u);
  out[0] = nbi_max_pool2d_select(in[0], in[1], &at);
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_nn, max_pool2d_bwd_and_select) {
  uint64_t seed = 19;
  nb_shape xs = NB_SHAPE(2, 3, 7, 6);
  for (int c = 0; c < 3; c++) {
    nb_fn *fb = nb_fn_create(f_pool_bwd, (void *)POOL_CASES[c], 2, 1);
    nb_fn *fs = nb_fn_create(f_pool_select, (void *)POOL_CASES[c], 2, 1);
    nb_fn *pool = nb_fn_create(f_pool, (void *)POOL_CASES[c], 1, 1);
    nb_tensor *probe[1], *x0 = tc_rand_f64(xs, -1, 1, &seed);
    cr_assert_eq(nb_call(pool, &x0, probe), NB_OK);
    nb_shape ys = nb_shape_of(probe[0]);
    for (int mask = 1; mask <= 3; mask++) {
      nb_scope_begin();
      int axes[2] = {mask & 1 ? axis_choice(c + mask) : NB_NOT_MAPPED,
                     mask & 2 ? axis_choice(c + mask + 2) : NB_NOT_MAPPED};
      nb_tensor *bin[2] = {rand_mapped(xs, axes[0], 4, &seed), rand_mapped(ys, axes[1], 4, &seed)};
      check_vmap("max_pool2d_bwd", fb, bin, axes, 0);
      nb_tensor *sin[2] = {rand_mapped(xs, axes[0], 4, &seed), rand_mapped(xs, axes[1], 4, &seed)};
      check_vmap("max_pool2d_select", fs, sin, axes, 0);
      nb_scope_end();
    }
    nb_fn_release(fb);
    nb_fn_release(fs);
    nb_fn_release(pool);
  }
}

/* ---- the derivative primitives through the transforms -------------------------------------- */

/* vmap(vjp(conv2d)): inputs x, w, [bias], gy; outputs y, gx, gw, [gbias].
 * Reaches conv2d_bwd_data(gy, w) and conv2d_bwd_filter(x, gy) with every
 * combination of batched operands. */
Test(vmap_nn, conv2d_vjp_and_jvp) {
  uint64_t seed = 23;
  for (int c = 0; c < N_CONV_CASES; c++) {
    const conv_case *k = &CONV_CASES[c];
    int n_in = k->bias ? 3 : 2;
    nb_fn *f = nb_fn_create(f_conv, (void *)&k->p, n_in, 1);
    nb_fn *vjp = nb_vjp_fn(f), *jvp = nb_jvp_fn(f);
    nb_shape es[3] = {conv_x(k), conv_w(k), NB_SHAPE(k->o)};
    for (int mask = 1; mask < 1 << (n_in + 1); mask++) {
      nb_scope_begin();
      int axes[4];
      nb_tensor *in[4];
      for (int i = 0; i <= n_in; i++) {
        axes[i] = mask >> i & 1 ? axis_choice(mask + i) : NB_NOT_MAPPED;
        in[i] = rand_mapped(i < n_in ? es[i] : conv_y(k), axes[i], 3, &seed);
      }
      char what[96];
      snprintf(what, sizeof what, "vjp of conv2d case %d mask %d", c, mask);
      check_vmap(what, vjp, in, axes, 1e-12);
      nb_scope_end();
    }
    /* jvp: primals then tangents; map the primals and tangents by halves */
    for (int mask = 1; mask < 1 << (2 * n_in); mask += 5) {
      nb_scope_begin();
      int axes[6];
      nb_tensor *in[6];
      for (int i = 0; i < 2 * n_in; i++) {
        axes[i] = mask >> i & 1 ? axis_choice(i) : NB_NOT_MAPPED;
        in[i] = rand_mapped(es[i % n_in], axes[i], 2, &seed);
      }
      char what[96];
      snprintf(what, sizeof what, "jvp of conv2d case %d mask %d", c, mask);
      check_vmap(what, jvp, in, axes, 1e-12);
      nb_scope_end();
    }
    nb_fn_release(vjp);
    nb_fn_release(jvp);
    nb_fn_release(f);
  }
}

/* vmap(vjp(pool)) reaches max_pool2d_bwd, vmap(jvp(pool)) max_pool2d_select. */
Test(vmap_nn, max_pool2d_vjp_and_jvp) {
  uint64_t seed = 29;
  nb_shape xs = NB_SHAPE(2, 3, 7, 6);
  for (int c = 0; c < 3; c++) {
    nb_fn *f = nb_fn_create(f_pool, (void *)POOL_CASES[c], 1, 1);
    nb_fn *vjp = nb_vjp_fn(f), *jvp = nb_jvp_fn(f);
    nb_tensor *probe[1], *x0 = tc_rand_f64(xs, -1, 1, &seed);
    cr_assert_eq(nb_call(f, &x0, probe), NB_OK);
    nb_shape ys = nb_shape_of(probe[0]);
    for (int mask = 1; mask <= 3; mask++) {
      nb_scope_begin();
      int axes[2] = {mask & 1 ? axis_choice(mask) : NB_NOT_MAPPED,
                     mask & 2 ? axis_choice(mask + 1) : NB_NOT_MAPPED};
      nb_tensor *vin[2] = {rand_mapped(xs, axes[0], 3, &seed), rand_mapped(ys, axes[1], 3, &seed)};
      check_vmap("vjp of max_pool2d", vjp, vin, axes, 0);
      nb_tensor *jin[2] = {rand_mapped(xs, axes[0], 3, &seed), rand_mapped(xs, axes[1], 3, &seed)};
      check_vmap("jvp of max_pool2d", jvp, jin, axes, 0);
      nb_scope_end();
    }
    nb_fn_release(vjp);
    nb_fn_release(jvp);
    nb_fn_release(f);
  }
}

/* An empty batch gives empty results of the right shape, weights mapped or not. */
Test(vmap_nn, empty_batch) {
  uint64_t seed = 31;
  const conv_case *k = &CONV_CASES[2];
  nb_fn *f = nb_fn_create(f_conv, (void *)&k->p, 3, 1);
  nb_fn *vjp = nb_vjp_fn(f);
  for (int mask = 1; mask < 8; mask++) {
    nb_scope_begin();
    nb_shape es[4] = {conv_x(k), conv_w(k), NB_SHAPE(k->o), conv_y(k)};
    int axes[4];
    nb_tensor *in[4];
    for (int i = 0; i < 4; i++) {
      axes[i] = mask >> (i % 3) & 1 ? 0 : NB_NOT_MAPPED;
      in[i] = rand_mapped(es[i], axes[i], 0, &seed);
    }
    nb_fn *v = nb_vmap(vjp, axes, NULL);
    nb_tensor *out[4];
    cr_assert_eq(nb_call(v, in, out), NB_OK, "mask %d: %s", mask, nb_last_error());
    nb_shape want[4] = {conv_y(k), conv_x(k), conv_w(k), NB_SHAPE(k->o)};
    for (int j = 0; j < 4; j++) {
      nb_shape s = nb_shape_of(out[j]);
      cr_assert(s.ndim == want[j].ndim + 1 && s.dims[0] == 0 &&
                !memcmp(s.dims + 1, want[j].dims, sizeof(int64_t) * (size_t)want[j].ndim));
      cr_assert_eq(nb_eval(&out[j], 1), NB_OK, "%s", nb_last_error());
    }
    nb_fn_release(v);
    nb_scope_end();
  }
  nb_fn_release(vjp);
  nb_fn_release(f);
}

/* Nested vmaps stack batch dims: an outer vmap over models (weights, bias)
 * of an inner vmap over examples (x), against a loop of the inner vmap; and
 * both levels mapping x. The outer pass batches the inner pass's graph (its
 * grouped convolutions and reshapes) again. */
Test(vmap_nn, nested_conv2d) {
  uint64_t seed = 61;
  const conv_case *k = &CONV_CASES[2];
  nb_fn *f = nb_fn_create(f_conv, (void *)&k->p, 3, 1);
  int inner_axes[2][3] = {{0, NB_NOT_MAPPED, NB_NOT_MAPPED}, {1, 0, NB_NOT_MAPPED}};
  int outer_axes[2][3] = {{NB_NOT_MAPPED, 0, 0}, {0, -1, 0}};
  for (int c = 0; c < 2; c++) {
    nb_scope_begin();
    nb_fn *inner = nb_vmap(f, inner_axes[c], NULL);
    nb_shape es[3] = {conv_x(k), conv_w(k), NB_SHAPE(k->o)};
    nb_tensor *in[3];
    for (int i = 0; i < 3; i++) {
      nb_tensor *t = rand_mapped(es[i], inner_axes[c][i], 3, &seed);
      in[i] = rand_mapped(nb_shape_of(t), outer_axes[c][i], 2, &seed);
    }
    check_vmap("nested vmap of conv2d", inner, in, outer_axes[c], 1e-12);
    nb_fn_release(inner);
    nb_scope_end();
  }
  nb_fn_release(f);
}

Test(vmap_nn, nested_matmul) {
  uint64_t seed = 67;
  nb_fn *f = nb_fn_create(f_matmul, NULL, 2, 1);
  nb_fn *inner = nb_vmap(f, (int[]){0, NB_NOT_MAPPED}, NULL);
  nb_tensor *in[2] = {rand_mapped(NB_SHAPE(3, 2, 4), 1, 5, &seed),
                      rand_mapped(NB_SHAPE(4), -1, 5, &seed)};
  check_vmap("nested vmap of matmul", inner, in, (int[]){1, -1}, 1e-12);
  nb_fn_release(inner);
  nb_fn_release(f);
}

/* ---- composites ------------------------------------------------------------------------ */

static nb_status f_einsum(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_out;
  out[0] = nb_einsum(u, in, n_in);
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_nn, einsum) {
  uint64_t seed = 37;
  struct {
    const char *spec;
    nb_shape a, b;
  } cases[] = {
      {"ij,jk->ik", NB_SHAPE(2, 3), NB_SHAPE(3, 4)},
      {"bij,bjk->bik", NB_SHAPE(2, 3, 4), NB_SHAPE(2, 4, 5)},
      {"ij,ij->i", NB_SHAPE(3, 4), NB_SHAPE(3, 4)},
      {"i,j->ij", NB_SHAPE(3), NB_SHAPE(4)},
      {"ijk,kj->i", NB_SHAPE(2, 3, 4), NB_SHAPE(4, 3)},
  };
  for (int c = 0; c < 5; c++) {
    nb_fn *f = nb_fn_create(f_einsum, (void *)cases[c].spec, 2, 1);
    for (int mask = 1; mask <= 3; mask++) {
      nb_scope_begin();
      int axes[2] = {mask & 1 ? axis_choice(c + mask) : NB_NOT_MAPPED,
                     mask & 2 ? axis_choice(c) : NB_NOT_MAPPED};
      nb_tensor *in[2] = {rand_mapped(cases[c].a, axes[0], 3, &seed),
                          rand_mapped(cases[c].b, axes[1], 3, &seed)};
      check_vmap(cases[c].spec, f, in, axes, 1e-12);
      nb_scope_end();
    }
    nb_fn_release(f);
  }
}

static nb_status f_layer_norm(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_layer_norm(in[0], in[1], in[2], 1e-5);
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_nn, layer_norm) {
  uint64_t seed = 41;
  nb_fn *f = nb_fn_create(f_layer_norm, NULL, 3, 1);
  for (int mask = 1; mask < 8; mask++) {
    nb_scope_begin();
    nb_shape es[3] = {NB_SHAPE(4, 6), NB_SHAPE(6), NB_SHAPE(6)};
    int axes[3];
    nb_tensor *in[3];
    for (int i = 0; i < 3; i++) {
      axes[i] = mask >> i & 1 ? axis_choice(mask + i) : NB_NOT_MAPPED;
      in[i] = rand_mapped(es[i], axes[i], 3, &seed);
    }
    check_vmap("layer_norm", f, in, axes, 1e-12);
    nb_scope_end();
  }
  nb_fn_release(f);
}

static nb_status f_attention(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = nb_attention(in[0], in[1], in[2], u);
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_nn, attention) {
  uint64_t seed = 43;
  /* a causal mask [Lq, Lk] captured by the second function */
  bool causal[3 * 5];
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 5; j++)
      causal[i * 5 + j] = j <= i + 2;
  nb_tensor *mask = nb_from_data(causal, NB_SHAPE(3, 5), NB_BOOL);
  for (int m = 0; m < 2; m++) {
    nb_fn *f = nb_fn_create(f_attention, m ? mask : NULL, 3, 1);
    for (int bits = 1; bits < 8; bits++) {
      nb_scope_begin();
      nb_shape es[3] = {NB_SHAPE(2, 3, 4), NB_SHAPE(2, 5, 4), NB_SHAPE(2, 5, 6)};
      int axes[3];
      nb_tensor *in[3];
      for (int i = 0; i < 3; i++) {
        axes[i] = bits >> i & 1 ? axis_choice(bits + i) : NB_NOT_MAPPED;
        in[i] = rand_mapped(es[i], axes[i], 3, &seed);
      }
      check_vmap(m ? "attention with mask" : "attention", f, in, axes, 1e-12);
      nb_scope_end();
    }
    nb_fn_release(f);
  }
}

static nb_status f_cross_entropy(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                 int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_cross_entropy(in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}

/* Class-index labels and probability labels, each mapped or not. */
Test(vmap_nn, cross_entropy) {
  uint64_t seed = 47;
  nb_fn *f = nb_fn_create(f_cross_entropy, NULL, 2, 1);
  for (int mask = 1; mask <= 3; mask++) {
    nb_scope_begin();
    int axes[2] = {mask & 1 ? axis_choice(mask) : NB_NOT_MAPPED,
                   mask & 2 ? axis_choice(mask + 1) : NB_NOT_MAPPED};
    nb_tensor *logits = rand_mapped(NB_SHAPE(4, 5), axes[0], 3, &seed);
    /* class indices 0..4, (4) per example */
    nb_shape ls = axes[1] == NB_NOT_MAPPED ? NB_SHAPE(4)
                  : axes[1]                ? NB_SHAPE(4, 3)
                                           : NB_SHAPE(3, 4);
    double *lab = tc_rand_ints(tc_numel(ls), NB_I64, &seed, 2);
    for (int64_t i = 0; i < tc_numel(ls); i++)
      lab[i] += 2;
    nb_tensor *in[2] = {logits, tc_tensor(lab, ls, NB_I64)};
    check_vmap("cross_entropy, class labels", f, in, axes, 1e-12);
    /* probability labels (any weights: the function is the same formula) */
    nb_tensor *pin[2] = {logits, rand_mapped(NB_SHAPE(4, 5), axes[1], 3, &seed)};
    check_vmap("cross_entropy, probability labels", f, pin, axes, 1e-12);
    free(lab);
    nb_scope_end();
  }
  nb_fn_release(f);
}

/* ---- per-example gradients of a small CNN ---------------------------------------------------- */

/* loss(w1 [4,2,3,3], b1 [4], w2 [16, 3], x [1,2,6,6], labels [1]) =
 * cross_entropy(flatten(pool2(relu(conv(x, w1, b1, pad 1)))) @ w2, labels). */
static nb_status f_cnn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_conv2d_params p = {.padding = {1, 1}};
  nb_tensor *h = nb_relu(nb_conv2d(in[3], in[0], in[1], &p));
  h = nb_max_pool2d(h, 3, 3, 3, 3, 0, 0); /* [1, 4, 2, 2] */
  h = nb_reshape(h, NB_SHAPE(1, 16));
  out[0] = nb_cross_entropy(nb_matmul(h, in[2]), in[4]);
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_nn, per_example_cnn_gradients) {
  uint64_t seed = 53;
  int64_t B = 5;
  nb_fn *loss = nb_fn_create(f_cnn, NULL, 5, 1);
  nb_fn *g = nb_grad(loss, NB_AXES(0, 1, 2));
  nb_tensor *w1 = tc_rand_f64(NB_SHAPE(4, 2, 3, 3), -1, 1, &seed);
  nb_tensor *b1 = tc_rand_f64(NB_SHAPE(4), -1, 1, &seed);
  nb_tensor *w2 = tc_rand_f64(NB_SHAPE(16, 3), -1, 1, &seed);
  nb_tensor *x = tc_rand_f64(NB_SHAPE(5, 1, 2, 6, 6), -1, 1, &seed);
  double lab[5] = {0, 2, 1, 1, 0};
  nb_tensor *labels = tc_tensor(lab, NB_SHAPE(5, 1), NB_I64);
  nb_tensor *in[5] = {w1, b1, w2, x, labels};
  int axes[5] = {NB_NOT_MAPPED, NB_NOT_MAPPED, NB_NOT_MAPPED, 0, 0};
  cr_assert_eq(check_vmap("per-example CNN gradients", g, in, axes, 1e-12), B);
  /* and the mean of the per-example gradients is the batch gradient */
  nb_fn *v = nb_vmap(g, axes, NULL);
  nb_tensor *per[3];
  cr_assert_eq(nb_call(v, in, per), NB_OK, "%s", nb_last_error());
  nb_tensor *gw1 = nb_mean(per[0], NB_AXES(0), false);
  double *got = tc_read(gw1), *sum = calloc(4 * 2 * 3 * 3, sizeof *sum);
  for (int64_t b = 0; b < B; b++) {
    nb_scope_begin();
    nb_tensor *ex[5] = {w1, b1, w2, example_of(x, 0, b), example_of(labels, 0, b)}, *gb[3];
    cr_assert_eq(nb_call(g, ex, gb), NB_OK);
    double *d = tc_read(gb[0]);
    for (int i = 0; i < 72; i++)
      sum[i] += d[i] / (double)B;
    free(d);
    nb_scope_end();
  }
  tc_assert_vec_close("mean per-example gradient", "w1", got, sum, 72, 1e-12);
  free(got);
  free(sum);
  nb_fn_release(v);
  nb_fn_release(g);
  nb_fn_release(loss);
}

/* Per-example weights (an ensemble): vmap(grad) over the weights with a
 * shared input makes conv2d_bwd_data see batched weights and
 * conv2d_bwd_filter a shared x with batched dy. */
Test(vmap_nn, ensemble_cnn_gradients) {
  uint64_t seed = 59;
  nb_fn *loss = nb_fn_create(f_cnn, NULL, 5, 1);
  nb_fn *g = nb_grad(loss, NB_AXES(0, 1, 2, 3));
  nb_tensor *in[5] = {
      rand_mapped(NB_SHAPE(4, 2, 3, 3), 0, 3, &seed), rand_mapped(NB_SHAPE(4), 0, 3, &seed),
      rand_mapped(NB_SHAPE(16, 3), 0, 3, &seed), tc_rand_f64(NB_SHAPE(1, 2, 6, 6), -1, 1, &seed),
      tc_tensor((double[]){2}, NB_SHAPE(1), NB_I64)};
  check_vmap("ensemble CNN gradients", g, in, (int[]){0, 0, 0, NB_NOT_MAPPED, NB_NOT_MAPPED},
             1e-12);
  nb_fn_release(g);
  nb_fn_release(loss);
}
