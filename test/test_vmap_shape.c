/* test/test_vmap_shape.c — nb_vmap through the shape and index ops (their
 * batching rules, src/ops/shape.c and index.c).
 *
 * One harness (check_vmap) compares nb_vmap(f, in_axes, out_axes) with a loop
 * over the examples: each mapped input is sliced on the host, f is called on
 * the example, and its outputs are placed at the output's batch axis. Values
 * are small integers, so every op (sums of scatters included) is exact and
 * results must match bit for bit. run_sig drives the harness over in_axes 0,
 * 1 and -1, every subset of mapped inputs (the rest NB_NOT_MAPPED) with random
 * (also negative) axes, random out_axes, and batch sizes 0, 1, 2 and 3. The
 * same driver runs on nb_vjp_fn / nb_jvp_fn of each op, on vmap of vmap, and
 * on nb_grad of losses that chain these ops (per-example gradients). */
#include "../src/ops/index.h"
#include "common.h"

TestSuite(vmap_shape, .init = tc_setup, .fini = tc_teardown);

#define MAX_IO 8

/* A shape / axes in a static initializer: SH(2, 3), AX(0, -1). */
#define SH(...)                                                                                    \
  {                                                                                                \
    .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), .dims = { __VA_ARGS__ }     \
  }
#define AX(...)                                                                                    \
  {                                                                                                \
    .n = (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), .v = { __VA_ARGS__ }                   \
  }
#define SCALAR                                                                                     \
  { .ndim = 0 }

/* The per-example inputs of a function: shape, dtype, and for index inputs
 * the size of the axis they index (values drawn from [-isize, isize)). */
typedef struct sig {
  int n_in, n_out;
  nb_shape shape[MAX_IO];
  nb_dtype dtype[MAX_IO];
  int64_t isize[MAX_IO];
} sig;

/* ---- host-side helpers -------------------------------------------------------------- */

static int norm_axis(int a, int ndim) { return a < 0 ? a + ndim : a; }

static nb_shape insert_dim(nb_shape s, int a, int64_t n) {
  for (int d = s.ndim; d > a; d--)
    s.dims[d] = s.dims[d - 1];
  s.dims[a] = n;
  s.ndim++;
  return s;
}

/* Copies between x (shape xs) at index b of axis a and y (xs without axis a):
 * y = x[.., b, ..] (put false) or x[.., b, ..] = y (put true). */
static void host_slab(double *x, nb_shape xs, int a, int64_t b, double *y, bool put) {
  nb_shape ys = xs;
  for (int d = a; d < xs.ndim - 1; d++)
    ys.dims[d] = xs.dims[d + 1];
  ys.ndim--;
  int64_t iy[NB_MAX_DIMS], ix[NB_MAX_DIMS];
  for (int64_t i = 0; i < tc_numel(ys); i++) {
    tc_unravel(i, &ys, iy);
    for (int d = 0, e = 0; d < xs.ndim; d++)
      ix[d] = d == a ? b : iy[e++];
    int64_t j = tc_ravel(ix, &xs);
    if (put)
      x[j] = y[i];
    else
      y[i] = x[j];
  }
}

/* n values for an input: indices in [-isize, isize), or small integers. */
static double *rand_data(int64_t n, nb_dtype dt, int64_t isize, uint64_t *seed) {
  if (!isize) return tc_rand_ints(n, dt, seed, 8);
  double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++)
    x[i] = (double)tc_randint(seed, -isize, isize - 1);
  return x;
}

/* A tensor holding x: contiguous or strided at random. */
static nb_tensor *any_tensor(const double *x, nb_shape s, nb_dtype dt, uint64_t *seed) {
  return tc_randint(seed, 0, 1) ? tc_strided_tensor(x, s, dt) : tc_tensor(x, s, dt);
}

static void describe(char *buf, size_t cap, const char *name, int n_in, const int *in_axes,
                     int n_out, const int *out_axes, int64_t B) {
  int k = snprintf(buf, cap, "%s B=%lld in_axes=[", name, (long long)B);
  for (int i = 0; i < n_in && k < (int)cap; i++)
    k += in_axes[i] == NB_NOT_MAPPED
             ? snprintf(buf + k, cap - (size_t)k, "%s-", i ? "," : "")
             : snprintf(buf + k, cap - (size_t)k, "%s%d", i ? "," : "", in_axes[i]);
  for (int j = 0; j < n_out && k < (int)cap; j++)
    k += out_axes[j] == NB_NOT_MAPPED
             ? snprintf(buf + k, cap - (size_t)k, "%s-", j ? "," : "] out_axes=[")
             : snprintf(buf + k, cap - (size_t)k, "%s%d", j ? "," : "] out_axes=[", out_axes[j]);
  if (k < (int)cap) snprintf(buf + k, cap - (size_t)k, "]");
}

static void assert_exact(const char *ctx, int j, nb_tensor *got, nb_tensor *like,
                         const double *want, nb_shape ws) {
  cr_assert(got, "%s: output %d is NULL", ctx, j);
  nb_shape gs = nb_shape_of(got);
  cr_assert(nbi_shape_eq(&gs, &ws), "%s: output %d has rank %d, expected %d (or dims differ)", ctx,
            j, gs.ndim, ws.ndim);
  cr_assert_eq(nb_dtype_of(got), nb_dtype_of(like), "%s: output %d is %s, expected %s", ctx, j,
               nb_dtype_name(nb_dtype_of(got)), nb_dtype_name(nb_dtype_of(like)));
  double *g = tc_read(got);
  for (int64_t i = 0; i < tc_numel(ws); i++)
    cr_assert(g[i] == want[i], "%s: output %d element %lld is %.17g, expected %.17g", ctx, j,
              (long long)i, g[i], want[i]);
  free(g);
}

/* ---- the harness ------------------------------------------------------------------------ */

/* vmap(f, in_axes, out_axes) on random batched inputs equals the loop over
 * examples. An NB_NOT_MAPPED output must not depend on a mapped input. */
static void check_vmap(nb_fn *f, const sig *g, const int *in_axes, const int *out_axes, int64_t B,
                       uint64_t *seed, const char *name) {
  char ctx[320];
  describe(ctx, sizeof ctx, name, g->n_in, in_axes, g->n_out, out_axes, B);
  nb_scope_begin();
  int ax[MAX_IO], oa[MAX_IO];
  nb_shape fs[MAX_IO], ws[MAX_IO];
  double *data[MAX_IO], *want[MAX_IO] = {0};
  nb_tensor *full[MAX_IO], *got[MAX_IO], *like[MAX_IO];
  for (int k = 0; k < g->n_in; k++) {
    const nb_shape *es = &g->shape[k];
    ax[k] = in_axes[k] == NB_NOT_MAPPED ? -1 : norm_axis(in_axes[k], es->ndim + 1);
    fs[k] = ax[k] < 0 ? *es : insert_dim(*es, ax[k], B);
    data[k] = rand_data(tc_numel(fs[k]), g->dtype[k], g->isize[k], seed);
    full[k] = any_tensor(data[k], fs[k], g->dtype[k], seed);
  }
  nb_fn *v = nb_vmap(f, in_axes, out_axes);
  cr_assert(v, "%s: nb_vmap: %s", ctx, nb_last_error());
  cr_assert_eq(nb_call(v, full, got), NB_OK, "%s: %s", ctx, nb_last_error());
  nb_fn_release(v);
  for (int64_t b = 0; b < (B ? B : 1); b++) { /* B = 0: one example gives the shapes */
    nb_tensor *ex[MAX_IO], *y[MAX_IO];
    for (int k = 0; k < g->n_in; k++) {
      if (ax[k] < 0) {
        ex[k] = full[k];
        continue;
      }
      int64_t n = tc_numel(g->shape[k]);
      double *e = calloc((size_t)(n ? n : 1), sizeof *e);
      if (B) host_slab(data[k], fs[k], ax[k], b, e, false);
      ex[k] = tc_tensor(e, g->shape[k], g->dtype[k]);
      free(e);
    }
    cr_assert_eq(nb_call(f, ex, y), NB_OK, "%s: example %lld: %s", ctx, (long long)b,
                 nb_last_error());
    for (int j = 0; j < g->n_out; j++) {
      nb_shape ys = nb_shape_of(y[j]);
      if (b == 0) {
        like[j] = y[j];
        oa[j] = out_axes[j] == NB_NOT_MAPPED ? -1 : norm_axis(out_axes[j], ys.ndim + 1);
        ws[j] = oa[j] < 0 ? ys : insert_dim(ys, oa[j], B);
        want[j] = calloc((size_t)(tc_numel(ws[j]) + 1), sizeof(double));
      }
      double *yv = tc_read(y[j]);
      if (oa[j] < 0)
        memcpy(want[j], yv, sizeof(double) * (size_t)tc_numel(ys));
      else if (B)
        host_slab(want[j], ws[j], oa[j], b, yv, true);
      free(yv);
    }
  }
  for (int j = 0; j < g->n_out; j++) {
    assert_exact(ctx, j, got[j], like[j], want[j], ws[j]);
    free(want[j]);
  }
  for (int k = 0; k < g->n_in; k++)
    free(data[k]);
  nb_scope_end();
}

/* The ranks of f's outputs on one example (random inputs). */
static void probe(nb_fn *f, const sig *g, uint64_t *seed, nb_shape *out_shape,
                  nb_dtype *out_dtype) {
  nb_scope_begin();
  nb_tensor *ex[MAX_IO], *y[MAX_IO];
  for (int k = 0; k < g->n_in; k++) {
    double *e = rand_data(tc_numel(g->shape[k]), g->dtype[k], g->isize[k], seed);
    ex[k] = tc_tensor(e, g->shape[k], g->dtype[k]);
    free(e);
  }
  cr_assert_eq(nb_call(f, ex, y), NB_OK, "probe: %s", nb_last_error());
  for (int j = 0; j < g->n_out; j++) {
    out_shape[j] = nb_shape_of(y[j]);
    out_dtype[j] = nb_dtype_of(y[j]);
  }
  nb_scope_end();
}

static int rand_axis(uint64_t *seed, int rank) { return (int)tc_randint(seed, -rank, rank - 1); }

/* Runs check_vmap over the in_axes / out_axes patterns of the file comment. */
static void run_sig(nb_fn *f, const sig *g, uint64_t seed, const char *name) {
  cr_assert(f, "%s: %s", name, nb_last_error());
  cr_assert(g->n_in <= MAX_IO && g->n_out <= MAX_IO);
  nb_shape os[MAX_IO];
  nb_dtype od[MAX_IO];
  probe(f, g, &seed, os, od);
  int in[MAX_IO], out[MAX_IO];
  /* all 0 (B = 3 and B = 0), all 1 where the rank allows, all -1 */
  for (int p = 0; p < 4; p++) {
    for (int k = 0; k < g->n_in; k++)
      in[k] = p == 2 ? (g->shape[k].ndim ? 1 : 0) : p == 3 ? -1 : 0;
    for (int j = 0; j < g->n_out; j++)
      out[j] = p == 2 ? (os[j].ndim ? 1 : 0) : p == 3 ? -1 : 0;
    check_vmap(f, g, in, out, (int64_t[]){3, 0, 2, 1}[p], &seed, name);
  }
  /* every subset of mapped inputs, random axes */
  for (int mask = 1; mask < 1 << g->n_in; mask++) {
    for (int k = 0; k < g->n_in; k++)
      in[k] = mask >> k & 1 ? rand_axis(&seed, g->shape[k].ndim + 1) : NB_NOT_MAPPED;
    for (int j = 0; j < g->n_out; j++)
      out[j] = rand_axis(&seed, os[j].ndim + 1);
    check_vmap(f, g, in, out, 3, &seed, name);
  }
}

static uint64_t name_seed(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 1099511628211ull;
  return h;
}

/* ---- the ops as functions ---------------------------------------------------------------- */

/* Arguments of one op application (each body reads what it needs). */
typedef struct opargs {
  nb_shape s;
  nb_axes ax;
  int axis;
  int64_t v[3][NB_MAX_DIMS]; /* slice starts/stops/steps, pads, split sizes */
  double value;
  int64_t n;
  nb_dtype dt;
} opargs;

#define BODY(fname, expr)                                                                          \
  static nb_status fname(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {    \
    const opargs *a = u;                                                                           \
    (void)a, (void)n_in, (void)n_out;                                                              \
    out[0] = (expr);                                                                               \
    return out[0] ? NB_OK : nb_last_status();                                                      \
  }
BODY(f_reshape, nb_reshape(in[0], a->s))
BODY(f_permute, nb_permute(in[0], a->ax))
BODY(f_transpose, nb_transpose(in[0]))
BODY(f_squeeze, nb_squeeze(in[0], a->ax))
BODY(f_unsqueeze, nb_unsqueeze(in[0], a->axis))
BODY(f_flatten, nb_flatten(in[0], a->ax.v[0], a->ax.v[1]))
BODY(f_broadcast, nb_broadcast_to(in[0], a->s))
BODY(f_repeat, nb_repeat(in[0], a->n, a->axis))
BODY(f_tile, nb_tile(in[0], a->s))
BODY(f_slice, nb_slice(in[0], a->v[0], a->v[1], a->v[2]))
BODY(f_flip, nb_flip(in[0], a->ax))
BODY(f_pad, nb_pad(in[0], a->v[0], a->value))
BODY(f_concat, nb_concat(in, n_in, a->axis))
BODY(f_stack, nb_stack(in, n_in, a->axis))
BODY(f_take, nb_take(in[0], in[1], a->axis))
BODY(f_take_along, nb_take_along_axis(in[0], in[1], a->axis))
BODY(f_scatter, nb_scatter_add(in[0], in[1], in[2], a->axis))
BODY(f_scatter_along, nbi_scatter_add_along_axis(in[0], in[1], in[2], a->axis))
BODY(f_one_hot, nb_one_hot(in[0], a->n, a->dt))

static nb_status f_split(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  const opargs *a = u;
  (void)n_in;
  return nb_split(in[0], a->v[0], n_out, a->axis, out);
}

typedef struct vcase {
  const char *name;
  nb_fn_body body;
  opargs a;
  sig g;
  /* The VJP batches with this file's rules alone: not for broadcast_to,
   * repeat and tile (their VJP sums), mixed-dtype concat (casts) nor split
   * (its parts' cotangents are added). */
  bool vjp;
} vcase;

#define F32 NB_F32
#define I64 NB_I64
#define I32 NB_I32
#define G1(s0, dt0)                                                                                \
  {                                                                                                \
    .n_in = 1, .n_out = 1, .shape = {s0}, .dtype = { dt0 }                                         \
  }

static const vcase shape_cases[] = {
    {"reshape", f_reshape, {.s = SH(4, 6)}, G1(SH(2, 3, 4), F32), true},
    {"reshape -1", f_reshape, {.s = SH(3, -1)}, G1(SH(2, 3), NB_F64), true},
    {"reshape to 0-d", f_reshape, {.s = SCALAR}, G1(SH(1), F32), true},
    {"reshape from 0-d", f_reshape, {.s = SH(1, 1)}, G1(SCALAR, F32), true},
    {"reshape i32", f_reshape, {.s = SH(2, 2, 2)}, G1(SH(8), I32), false},
    {"permute", f_permute, {.ax = AX(2, 0, 1)}, G1(SH(2, 3, 4), F32), true},
    {"permute negative", f_permute, {.ax = AX(1, -1, 0)}, G1(SH(2, 3, 4), F32), true},
    {"transpose", f_transpose, {0}, G1(SH(3, 4), F32), true},
    {"squeeze", f_squeeze, {.ax = AX(0, -1)}, G1(SH(1, 3, 1), F32), true},
    {"unsqueeze", f_unsqueeze, {.axis = -1}, G1(SH(3, 2), F32), true},
    {"flatten", f_flatten, {.ax = AX(1, 2)}, G1(SH(2, 3, 2, 2), F32), true},
    {"broadcast_to", f_broadcast, {.s = SH(2, 3, 4)}, G1(SH(3, 1), F32), false},
    {"broadcast_to from 0-d", f_broadcast, {.s = SH(3)}, G1(SCALAR, F32), false},
    {"broadcast_to same rank", f_broadcast, {.s = SH(3, 4)}, G1(SH(1, 4), I32), false},
    {"repeat", f_repeat, {.n = 2, .axis = 1}, G1(SH(2, 3), F32), false},
    {"tile", f_tile, {.s = SH(2, 1, 2)}, G1(SH(2, 3), F32), false},
    {"slice", f_slice, {.v = {{1, 5}, {4, NB_END}, {1, -2}}}, G1(SH(5, 6), F32), true},
    {"slice reversed", f_slice, {.v = {{-1, 0}, {NB_END, 6}, {-1, 3}}}, G1(SH(5, 6), F32), true},
    {"slice empty", f_slice, {.v = {{3, 0}, {1, 6}, {1, 1}}}, G1(SH(5, 6), F32), true},
    {"slice 3-d", f_slice, {.v = {{0, 1, -2}, {2, 3, 0}, {1, 1, -1}}}, G1(SH(2, 4, 5), F32), true},
    {"flip", f_flip, {.ax = AX(0, -1)}, G1(SH(3, 4), F32), true},
    {"flip middle", f_flip, {.ax = AX(1)}, G1(SH(2, 3, 4), F32), true},
    {"flip all", f_flip, {.ax = {.n = -1}}, G1(SH(2, 3), I64), false},
    {"pad", f_pad, {.v = {{1, 0, 2, 1}}, .value = 1.5}, G1(SH(2, 3), F32), true},
    {"pad 1-d", f_pad, {.v = {{0, 3}}, .value = -2}, G1(SH(4), NB_F64), true},
    {"concat last",
     f_concat,
     {.axis = -1},
     {.n_in = 2, .n_out = 1, .shape = {SH(2, 3), SH(2, 2)}, .dtype = {F32, F32}},
     true},
    {"concat three, one empty",
     f_concat,
     {.axis = 0},
     {.n_in = 3, .n_out = 1, .shape = {SH(1, 3), SH(2, 3), SH(0, 3)}, .dtype = {F32, F32, F32}},
     true},
    {"concat mixed dtypes",
     f_concat,
     {.axis = 1},
     {.n_in = 2, .n_out = 1, .shape = {SH(2, 1), SH(2, 3)}, .dtype = {F32, NB_F64}},
     false},
    {"stack",
     f_stack,
     {.axis = 1},
     {.n_in = 3, .n_out = 1, .shape = {SH(2, 3), SH(2, 3), SH(2, 3)}, .dtype = {F32, F32, F32}},
     true},
    {"split",
     f_split,
     {.v = {{1, 2, 3}}, .axis = 0},
     {.n_in = 1, .n_out = 3, .shape = {SH(6, 2)}, .dtype = {F32}},
     false},
};

static const vcase index_cases[] = {
    {"take",
     f_take,
     {.axis = 0},
     {.n_in = 2, .n_out = 1, .shape = {SH(5, 3), SH(2, 2)}, .dtype = {F32, I64}, .isize = {0, 5}},
     true},
    {"take last axis, i32 data",
     f_take,
     {.axis = -1},
     {.n_in = 2, .n_out = 1, .shape = {SH(4, 5), SH(3)}, .dtype = {I32, I32}, .isize = {0, 5}},
     false},
    {"take 0-d index",
     f_take,
     {.axis = 0},
     {.n_in = 2, .n_out = 1, .shape = {SH(5, 3), SCALAR}, .dtype = {F32, I64}, .isize = {0, 5}},
     true},
    {"take middle axis",
     f_take,
     {.axis = 1},
     {.n_in = 2,
      .n_out = 1,
      .shape = {SH(2, 3, 4), SH(2, 2)},
      .dtype = {F32, I32},
      .isize = {0, 3}},
     true},
    {"take from 1-d",
     f_take,
     {.axis = 0},
     {.n_in = 2, .n_out = 1, .shape = {SH(6), SH(4)}, .dtype = {NB_F64, I64}, .isize = {0, 6}},
     true},
    {"take_along_axis",
     f_take_along,
     {.axis = 1},
     {.n_in = 2, .n_out = 1, .shape = {SH(4, 3), SH(4, 2)}, .dtype = {F32, I64}, .isize = {0, 3}},
     true},
    {"take_along_axis, indices broadcast",
     f_take_along,
     {.axis = -1},
     {.n_in = 2, .n_out = 1, .shape = {SH(4, 3), SH(1, 5)}, .dtype = {F32, I32}, .isize = {0, 3}},
     true},
    {"take_along_axis, data broadcast",
     f_take_along,
     {.axis = 0},
     {.n_in = 2, .n_out = 1, .shape = {SH(4, 1), SH(2, 3)}, .dtype = {F32, I64}, .isize = {0, 4}},
     true},
    {"scatter_add",
     f_scatter,
     {.axis = 0},
     {.n_in = 3,
      .n_out = 1,
      .shape = {SH(5, 3), SH(2, 2), SH(2, 2, 3)},
      .dtype = {F32, I64, F32},
      .isize = {0, 5, 0}},
     true},
    {"scatter_add last axis",
     f_scatter,
     {.axis = -1},
     {.n_in = 3,
      .n_out = 1,
      .shape = {SH(3, 4), SH(5), SH(3, 5)},
      .dtype = {NB_F64, I32, NB_F64},
      .isize = {0, 4, 0}},
     true},
    {"scatter_add 0-d index",
     f_scatter,
     {.axis = 0},
     {.n_in = 3,
      .n_out = 1,
      .shape = {SH(5, 3), SCALAR, SH(3)},
      .dtype = {F32, I64, F32},
      .isize = {0, 5, 0}},
     true},
    {"scatter_add_along_axis",
     f_scatter_along,
     {.axis = 1},
     {.n_in = 3,
      .n_out = 1,
      .shape = {SH(4, 3), SH(4, 2), SH(4, 2)},
      .dtype = {F32, I64, F32},
      .isize = {0, 3, 0}},
     true},
    {"scatter_add_along_axis into size-1 dims",
     f_scatter_along,
     {.axis = 0},
     {.n_in = 3,
      .n_out = 1,
      .shape = {SH(4, 1), SH(2, 3), SH(2, 3)},
      .dtype = {F32, I32, F32},
      .isize = {0, 4, 0}},
     true},
    {"one_hot",
     f_one_hot,
     {.n = 4, .dt = F32},
     {.n_in = 1, .n_out = 1, .shape = {SH(3)}, .dtype = {I64}, .isize = {4}},
     false},
    {"one_hot 2-d i32",
     f_one_hot,
     {.n = 3, .dt = I32},
     {.n_in = 1, .n_out = 1, .shape = {SH(2, 2)}, .dtype = {I32}, .isize = {3}},
     false},
    {"one_hot 0-d",
     f_one_hot,
     {.n = 5, .dt = NB_F64},
     {.n_in = 1, .n_out = 1, .shape = {SCALAR}, .dtype = {I64}, .isize = {5}},
     false},
};

#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

static nb_fn *case_fn(const vcase *c) {
  return nb_fn_create(c->body, (void *)&c->a, c->g.n_in, c->g.n_out);
}

/* The signature of nb_vjp_fn(f) (with_outputs: cotangents of f's outputs)
 * or nb_jvp_fn(f) (tangents of f's inputs). */
static sig derived_sig(nb_fn *f, const sig *g, bool vjp, uint64_t *seed) {
  nb_shape os[MAX_IO];
  nb_dtype od[MAX_IO];
  probe(f, g, seed, os, od);
  sig d = *g;
  int n = vjp ? g->n_out : g->n_in;
  cr_assert(g->n_in + n <= MAX_IO);
  for (int k = 0; k < n; k++) {
    d.shape[g->n_in + k] = vjp ? os[k] : g->shape[k];
    d.dtype[g->n_in + k] = vjp ? od[k] : g->dtype[k];
    d.isize[g->n_in + k] = 0;
  }
  d.n_in = g->n_in + n;
  d.n_out = g->n_out + (vjp ? g->n_in : g->n_out);
  return d;
}

static void run_cases(const vcase *cs, int n) {
  for (int i = 0; i < n; i++) {
    nb_fn *f = case_fn(&cs[i]);
    run_sig(f, &cs[i].g, name_seed(cs[i].name), cs[i].name);
    nb_fn_release(f);
  }
}

/* vmap of the VJP (or JVP) of each case, every subset of primals and
 * (co)tangents mapped: per-example derivatives of these ops. */
static void run_derivs(const vcase *cs, int n, bool vjp) {
  for (int i = 0; i < n; i++) {
    if (vjp && !cs[i].vjp) continue;
    uint64_t seed = name_seed(cs[i].name) + vjp;
    nb_fn *f = case_fn(&cs[i]), *d = vjp ? nb_vjp_fn(f) : nb_jvp_fn(f);
    sig g = derived_sig(f, &cs[i].g, vjp, &seed);
    char name[160];
    snprintf(name, sizeof name, "%s of %s", vjp ? "vjp" : "jvp", cs[i].name);
    run_sig(d, &g, seed, name);
    nb_fn_release(d);
    nb_fn_release(f);
  }
}

/* vmap of vmap: an inner vmap with random mapped inputs and axes (batch 2),
 * checked by run_sig against the loop over the inner vmap (itself checked
 * against the loop over f by run_cases). */
static void run_nested(const vcase *cs, int n) {
  for (int i = 0; i < n; i++) {
    uint64_t seed = name_seed(cs[i].name) ^ 0x5eedull;
    const sig *g = &cs[i].g;
    nb_shape os[MAX_IO];
    nb_dtype od[MAX_IO];
    nb_fn *f = case_fn(&cs[i]);
    probe(f, g, &seed, os, od);
    int in[MAX_IO], out[MAX_IO];
    int mask = (int)tc_randint(&seed, 1, (1 << g->n_in) - 1);
    sig h = *g;
    for (int k = 0; k < g->n_in; k++) {
      in[k] = mask >> k & 1 ? rand_axis(&seed, g->shape[k].ndim + 1) : NB_NOT_MAPPED;
      if (in[k] != NB_NOT_MAPPED)
        h.shape[k] = insert_dim(g->shape[k], norm_axis(in[k], g->shape[k].ndim + 1), 2);
    }
    for (int j = 0; j < g->n_out; j++)
      out[j] = rand_axis(&seed, os[j].ndim + 1);
    nb_fn *v = nb_vmap(f, in, out);
    char name[160];
    snprintf(name, sizeof name, "vmap of vmap of %s", cs[i].name);
    run_sig(v, &h, seed, name);
    nb_fn_release(v);
    nb_fn_release(f);
  }
}

Test(vmap_shape, shape_ops) { run_cases(shape_cases, N_OF(shape_cases)); }
Test(vmap_shape, index_ops) { run_cases(index_cases, N_OF(index_cases)); }
Test(vmap_shape, shape_vjp) { run_derivs(shape_cases, N_OF(shape_cases), true); }
Test(vmap_shape, index_vjp) { run_derivs(index_cases, N_OF(index_cases), true); }
Test(vmap_shape, shape_jvp) { run_derivs(shape_cases, N_OF(shape_cases), false); }
Test(vmap_shape, index_jvp) { run_derivs(index_cases, N_OF(index_cases), false); }
Test(vmap_shape, nested_shape) { run_nested(shape_cases, N_OF(shape_cases)); }
Test(vmap_shape, nested_index) { run_nested(index_cases, N_OF(index_cases)); }

/* ---- per-example gradients of losses through these ops ------------------------------- */

/* loss(x (2,3,4), w (3,), k ()): x goes through permute, flip, pad, slice,
 * take (constant indices), reshape and concat with w; k picks one element. */
static nb_status chain_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  int64_t ix[2] = {2, -3};
  nb_tensor *idx = nb_from_data(ix, NB_SHAPE(2), NB_I64);
  nb_tensor *h = nb_permute(in[0], NB_AXES(2, 0, 1)); /* (4,2,3) */
  h = nb_flip(h, NB_AXES(0));
  h = nb_pad(h, (int64_t[]){0, 1, 1, 0, 0, 0}, 2.0); /* (5,3,3) */
  h = nb_slice(h, (int64_t[]){0, 0, 2}, (int64_t[]){5, 3, NB_END},
               (int64_t[]){2, 1, -1});                                      /* (3,3,3) */
  h = nb_take(h, idx, 1);                                                   /* (3,2,3) */
  h = nb_concat((nb_tensor *[]){nb_reshape(h, NB_SHAPE(-1)), in[1]}, 2, 0); /* (21) */
  out[0] = nb_take(h, in[2], 0);
  return out[0] ? NB_OK : nb_last_status();
}

/* loss(t (3,4), idx (2,), u (3,2), j (3,2), k ()): scatter_add along axis 1,
 * take_along_axis with j, then one element picked by k. */
static nb_status scatter_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *s = nb_scatter_add(in[0], in[1], in[2], 1);
  nb_tensor *r = nb_take_along_axis(s, in[3], 1);
  out[0] = nb_take(nb_reshape(r, NB_SHAPE(6)), in[4], 0);
  return out[0] ? NB_OK : nb_last_status();
}

Test(vmap_shape, grad_chain) {
  sig g = {.n_in = 3,
           .n_out = 2,
           .shape = {NB_SHAPE(2, 3, 4), NB_SHAPE(3), NB_SCALAR_SHAPE},
           .dtype = {NB_F32, NB_F32, NB_I64},
           .isize = {0, 0, 21}};
  nb_fn *f = nb_fn_create(chain_loss, NULL, 3, 1), *gr = nb_grad(f, NB_AXES(0, 1));
  run_sig(gr, &g, 11, "grad of chain_loss");
  /* value_and_grad: the loss itself and both gradients */
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1));
  g.n_out = 3;
  run_sig(vg, &g, 12, "value_and_grad of chain_loss");
  nb_fn_release(vg);
  nb_fn_release(gr);
  nb_fn_release(f);
}

Test(vmap_shape, grad_scatter) {
  sig g = {.n_in = 5,
           .n_out = 2,
           .shape = {NB_SHAPE(3, 4), NB_SHAPE(2), NB_SHAPE(3, 2), NB_SHAPE(3, 2), NB_SCALAR_SHAPE},
           .dtype = {NB_F32, NB_I64, NB_F32, NB_I32, NB_I64},
           .isize = {0, 4, 0, 4, 6}};
  nb_fn *f = nb_fn_create(scatter_loss, NULL, 5, 1), *gr = nb_grad(f, NB_AXES(0, 2));
  run_sig(gr, &g, 21, "grad of scatter_loss");
  nb_fn_release(gr);
  nb_fn_release(f);
}

/* vmap of vmap of grad: per-example gradients of a batch of batches. */
Test(vmap_shape, nested_grad) {
  nb_fn *f = nb_fn_create(scatter_loss, NULL, 5, 1), *gr = nb_grad(f, NB_AXES(0, 2));
  nb_fn *v = nb_vmap(gr, (int[]){0, NB_NOT_MAPPED, -1, 1, 0}, (int[]){1, -1});
  sig g = {
      .n_in = 5,
      .n_out = 2,
      .shape = {NB_SHAPE(2, 3, 4), NB_SHAPE(2), NB_SHAPE(3, 2, 2), NB_SHAPE(3, 2, 2), NB_SHAPE(2)},
      .dtype = {NB_F32, NB_I64, NB_F32, NB_I32, NB_I64},
      .isize = {0, 4, 0, 4, 6}};
  run_sig(v, &g, 31, "vmap of grad of scatter_loss");
  nb_fn_release(v);
  nb_fn_release(gr);
  nb_fn_release(f);
}

/* ---- unmapped outputs, errors ------------------------------------------------------------ */

static nb_status two_outputs(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_flip(nb_reshape(in[0], NB_SHAPE(3, 2)), NB_AXES(1));
  out[1] = nb_take(in[1], nb_from_data((int64_t[]){1, 0}, NB_SHAPE(2), NB_I64), 0);
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

Test(vmap_shape, unmapped_output) {
  sig g = {
      .n_in = 2, .n_out = 2, .shape = {NB_SHAPE(6), NB_SHAPE(2, 2)}, .dtype = {NB_F32, NB_F32}};
  nb_fn *f = nb_fn_create(two_outputs, NULL, 2, 2);
  uint64_t seed = 41;
  /* output 1 depends only on the unmapped input: NB_NOT_MAPPED keeps it as is,
   * a mapped out_axes broadcasts it */
  check_vmap(f, &g, (int[]){0, NB_NOT_MAPPED}, (int[]){-1, NB_NOT_MAPPED}, 3, &seed, "unmapped");
  check_vmap(f, &g, (int[]){1, NB_NOT_MAPPED}, (int[]){0, 2}, 2, &seed, "broadcast");
  /* but not an output that depends on a mapped input */
  nb_fn *v = nb_vmap(f, (int[]){0, 0}, (int[]){0, NB_NOT_MAPPED});
  nb_tensor *in[2] = {nb_zeros(NB_SHAPE(2, 6), NB_F32), nb_zeros(NB_SHAPE(2, 2, 2), NB_F32)},
            *out[2];
  cr_assert_neq(nb_call(v, in, out), NB_OK);
  tc_assert_error(NB_ERR_ARG, "out_axes[1] is NB_NOT_MAPPED");
  cr_assert(!out[0] && !out[1]);
  nb_fn_release(v);
  nb_fn_release(f);
}

/* Reads t and expects NB_ERR_INDEX. */
static void expect_index_error(nb_tensor *t) {
  cr_assert(t, "%s", nb_last_error());
  float buf[64];
  cr_assert_eq(nb_to_host(t, buf, sizeof(float) * (size_t)nb_numel(t)), NB_ERR_INDEX);
  tc_assert_error(NB_ERR_INDEX, "out of range");
}

/* An index one past the end in example 0 must fail as it does unbatched, not
 * read example 1's data. */
Test(vmap_shape, index_out_of_range) {
  nb_tensor *t = nb_arange(0, 30, 1, NB_F32), *u = nb_ones(NB_SHAPE(2, 2, 3), NB_F32), *out[1];
  t = nb_reshape(t, NB_SHAPE(2, 5, 3));
  nb_tensor *idx = nb_from_data((int64_t[]){5, 0, 1, 2}, NB_SHAPE(2, 2), NB_I64);
  nb_tensor *neg = nb_from_data((int64_t[]){0, 1, -6, 2}, NB_SHAPE(2, 2), NB_I64);
  opargs a0 = {.axis = 0};
  nb_fn *take = nb_fn_create(f_take, &a0, 2, 1), *scatter = nb_fn_create(f_scatter, &a0, 3, 1);
  nb_fn *along = nb_fn_create(f_take_along, &a0, 2, 1);
  struct {
    nb_fn *f;
    const int *in_axes;
    nb_tensor *in[3];
  } runs[] = {
      {take, (int[]){0, 0}, {t, idx}},
      {take, (int[]){0, 0}, {t, neg}},
      {take,
       (int[]){NB_NOT_MAPPED, 0},
       {nb_reshape(nb_arange(0, 15, 1, NB_F32), NB_SHAPE(5, 3)), idx}},
      {scatter, (int[]){0, 0, 0}, {t, idx, u}},
      {scatter, (int[]){NB_NOT_MAPPED, 0, 0}, {nb_zeros(NB_SHAPE(5, 3), NB_F32), neg, u}},
      {along,
       (int[]){0, 1},
       {t, nb_from_data((int64_t[]){0, 5, 1, 2, 0, 1}, NB_SHAPE(1, 2, 3), NB_I64)}},
  };
  for (int r = 0; r < N_OF(runs); r++) {
    nb_fn *v = nb_vmap(runs[r].f, runs[r].in_axes, NULL);
    cr_assert_eq(nb_call(v, runs[r].in, out), NB_OK, "run %d: %s", r, nb_last_error());
    expect_index_error(out[0]);
    nb_fn_release(v);
  }
  nb_fn_release(take);
  nb_fn_release(scatter);
  nb_fn_release(along);
}

/* A batched value above the maximum rank is an error naming nb_vmap. */
Test(vmap_shape, rank_limit) {
  opargs to8 = {.s = {.ndim = NB_MAX_DIMS, .dims = {1, 1, 1, 1, 1, 1, 1, 1}}}, a1 = {.axis = 1};
  nb_fn *fs[] = {nb_fn_create(f_reshape, &to8, 1, 1), nb_fn_create(f_broadcast, &to8, 1, 1),
                 nb_fn_create(f_take, &a1, 2, 1), nb_fn_create(f_scatter, &a1, 3, 1)};
  /* take of a rank-7 example with a 2-d index is rank 8 */
  nb_tensor *x = nb_zeros(NB_SHAPE(2, 1), NB_F32);
  nb_tensor *t = nb_zeros((nb_shape){.ndim = 8, .dims = {2, 1, 3, 1, 1, 1, 1, 1}}, NB_F32);
  nb_tensor *idx = nb_zeros(NB_SHAPE(2, 2, 1), NB_I64);
  nb_tensor *u = nb_zeros((nb_shape){.ndim = 8, .dims = {1, 2, 1, 1, 1, 1, 1, 1}}, NB_F32);
  struct {
    nb_fn *f;
    const int *in_axes;
    nb_tensor *in[3];
  } runs[] = {{fs[0], NULL, {x}},
              {fs[1], NULL, {x}},
              {fs[2], NULL, {t, idx}},
              {fs[3], (int[]){0, 0, NB_NOT_MAPPED}, {t, idx, u}}};
  for (int r = 0; r < N_OF(runs); r++) {
    nb_fn *v = nb_vmap(runs[r].f, runs[r].in_axes, NULL);
    nb_tensor *out[1];
    cr_assert_neq(nb_call(v, runs[r].in, out), NB_OK, "run %d", r);
    tc_assert_error(NB_ERR_SHAPE, "nb_vmap: a batched value would have rank 9");
    cr_assert(!out[0]);
    nb_fn_release(v);
  }
  for (int k = 0; k < N_OF(fs); k++)
    nb_fn_release(fs[k]);
}
