/* test/mpi/test_mpi_mesh.c — meshes spanning the processes of an mpirun job
 * (nb_mesh_world), run by `make MPI=1 test-mpi` with 1, 2 and 4 processes.
 * Every rank computes the same program on a virtual mesh of the same axes in
 * its own process (nb_mesh_cpu) and checks that the job gives the same values
 * bit for bit (the same ops in the same order), that each process holds only
 * its own devices' blocks, and that data-parallel and Megatron MLP training
 * gives the unsharded losses. A standalone binary (test/mini_criterion.h).
 *   test_mpi_mesh          the suite
 *   test_mpi_mesh killed   rank 1 dies before a collective: the others must
 *                          end with the error within NABLA_COLLECTIVE_TIMEOUT_S */
#define TC_STANDALONE
#define TC_OWN_MAIN
#include <math.h>
#include <signal.h>
#include <unistd.h>

#include "../../src/sharding/sharding.h"
#include "../common.h"

static int R, N; /* this rank, the job's size */

#define STR_EQ(a, b, ...) cr_assert(strcmp((a), (b)) == 0, __VA_ARGS__)

TestSuite(mpi_mesh);

static nb_tensor *rand_f64(nb_shape s, uint64_t *seed) {
  double *x = tc_rand_floats(tc_numel(s), NB_F64, seed);
  nb_tensor *t = tc_tensor(x, s, NB_F64);
  free(x);
  return t;
}

/* got (on a world mesh) holds exactly the blocks ref (the same on a virtual
 * mesh of the same axes) holds on this rank's devices, remote blocks on the
 * others, and reads back as ref does, bit for bit. */
static void assert_same(nb_tensor *got, nb_tensor *ref, const char *what) {
  cr_assert(got && ref, "%s: %s", what, nb_last_error());
  STR_EQ(nb_sharding_str(got), nb_sharding_str(ref), "%s: %s vs %s", what, nb_sharding_str(got),
         nb_sharding_str(ref));
  nb_mesh *m = nb_mesh_of(got);
  if (m) {
    for (int d = 0; d < m->n_dev; d++) {
      nb_tensor *p = got->phys[d], *q = ref->phys[d];
      bool local = N == 1 || d / (m->n_dev / N) == R;
      cr_assert_eq(nbi_mesh_local(m, d), local, "%s: device %d", what, d);
      cr_assert(nbi_shape_eq(&p->shape, &q->shape), "%s: device %d's block", what, d);
      cr_assert_eq(!!(p->flags & NBI_T_REMOTE), !local, "%s: device %d remote?", what, d);
      if (!local) continue;
      double *a = tc_read(p), *b = tc_read(q);
      int64_t n = nbi_numel(&q->shape);
      for (int64_t i = 0; i < n; i++)
        cr_assert(a[i] == b[i] || (a[i] != a[i] && b[i] != b[i]),
                  "%s: device %d [%lld]: %.17g vs %.17g", what, d, (long long)i, a[i], b[i]);
      free(a), free(b);
    }
  }
  double *a = tc_read(got), *b = tc_read(ref);
  int64_t n = nb_numel(ref);
  cr_assert_eq(nb_numel(got), n, "%s", what);
  for (int64_t i = 0; i < n; i++)
    cr_assert(a[i] == b[i], "%s: [%lld] %.17g vs %.17g", what, (long long)i, a[i], b[i]);
  free(a), free(b);
}

typedef struct mesh_case {
  char axes[32];
  const char *specs[6];
} mesh_case;

/* Meshes every job size (1, 2, 4) divides: one device per rank, two, mixed. */
static int mesh_cases(mesh_case *c) {
  int k = 0;
  snprintf(c[k].axes, sizeof c[k].axes, "x=%d", N);
  memcpy(c[k++].specs, (const char *[6]){"_, _", "x, _", "_, x", "_, _ partial(x)"},
         sizeof c->specs);
  snprintf(c[k].axes, sizeof c[k].axes, "x=%d,y=2", N);
  memcpy(c[k++].specs,
         (const char *[6]){"x, y", "(x, y), _", "y, x", "_, (y, x)", "x, _ partial(y)", "y, _"},
         sizeof c->specs);
  snprintf(c[k].axes, sizeof c[k].axes, "dp=2,tp=2");
  memcpy(c[k++].specs,
         (const char *[6]){"dp, tp", "tp, _", "(tp, dp), _", "_, _ partial(dp)", "_, dp", "_, _"},
         sizeof c->specs);
  snprintf(c[k].axes, sizeof c[k].axes, "a=2,b=2,c=2");
  memcpy(c[k++].specs, (const char *[6]){"(a, b), c", "c, _ partial(a)", "b, (c, a)", "_, _"},
         sizeof c->specs);
  return k;
}

Test(mpi_mesh, world_mesh_spans_the_ranks) {
  nb_mesh *m = nb_mesh_world("dp=2,tp=2");
  cr_assert(m, "%s", nb_last_error());
  cr_assert_eq(m->n_ranks, N);
  STR_EQ(nb_mesh_str(m), "dp=2,tp=2", "%s", nb_mesh_str(m));
  int local = 0;
  for (int d = 0; d < 4; d++)
    local += nbi_mesh_local(m, d);
  cr_assert_eq(local, 4 / N);
  nb_mesh_release(m);
  if (N > 1) {
    char axes[16];
    snprintf(axes, sizeof axes, "x=%d", N + 1);
    cr_assert(!nb_mesh_world(axes), "x=N+1");
    cr_assert_eq(nb_last_status(), NB_ERR_SHARDING);
    cr_assert(strstr(nb_last_error(), "processes do not divide"), "%s", nb_last_error());
    nb_clear_error();
  }
}

/* nb_shard of a host value keeps this rank's blocks only; reading gathers. */
Test(mpi_mesh, place_and_read_back_every_mesh) {
  mesh_case mc[4];
  int nc = mesh_cases(mc);
  uint64_t seed = 5;
  nb_tensor *x = rand_f64(NB_SHAPE(8, 6), &seed);
  for (int c = 0; c < nc; c++) {
    nb_mesh *w = nb_mesh_world(mc[c].axes), *v = nb_mesh_cpu(mc[c].axes);
    cr_assert(w && v, "%s", nb_last_error());
    for (int s = 0; s < 6 && mc[c].specs[s]; s++) {
      char what[400];
      snprintf(what, sizeof what, "%s %s", mc[c].axes, mc[c].specs[s]);
      assert_same(nb_shard(x, w, mc[c].specs[s]), nb_shard(x, v, mc[c].specs[s]), what);
    }
    nb_mesh_release(w);
    nb_mesh_release(v);
  }
}

/* Every pair of layouts: all-gather, all-to-all, permute, all-reduce,
 * reduce-scatter between the processes; the same counts as in one process. */
Test(mpi_mesh, reshard_every_pair) {
  mesh_case mc[4];
  int nc = mesh_cases(mc);
  uint64_t seed = 6;
  nb_tensor *x = rand_f64(NB_SHAPE(8, 12), &seed);
  for (int c = 1; c < nc; c++) {
    nb_mesh *w = nb_mesh_world(mc[c].axes), *v = nb_mesh_cpu(mc[c].axes);
    for (int a = 0; a < 6 && mc[c].specs[a]; a++)
      for (int b = 0; b < 6 && mc[c].specs[b]; b++) {
        if (strstr(mc[c].specs[b], "partial")) continue;
        char what[400];
        snprintf(what, sizeof what, "%s: %s -> %s", mc[c].axes, mc[c].specs[a], mc[c].specs[b]);
        nb_scope_begin();
        nb_stats s0 = nb_get_stats();
        nb_tensor *g = nb_reshard(nb_shard(x, w, mc[c].specs[a]), mc[c].specs[b]);
        nb_stats s1 = nb_get_stats();
        nb_tensor *r = nb_reshard(nb_shard(x, v, mc[c].specs[a]), mc[c].specs[b]);
        nb_stats s2 = nb_get_stats();
        cr_assert(s1.n_all_reduce - s0.n_all_reduce == s2.n_all_reduce - s1.n_all_reduce &&
                      s1.n_all_gather - s0.n_all_gather == s2.n_all_gather - s1.n_all_gather &&
                      s1.n_all_to_all - s0.n_all_to_all == s2.n_all_to_all - s1.n_all_to_all &&
                      s1.n_permute - s0.n_permute == s2.n_permute - s1.n_permute &&
                      s1.n_reduce_scatter - s0.n_reduce_scatter ==
                          s2.n_reduce_scatter - s1.n_reduce_scatter,
                  "%s: other collectives", what);
        assert_same(g, r, what);
        nb_scope_end();
      }
    nb_mesh_release(w);
    nb_mesh_release(v);
  }
}

/* All-reduces past the one-message size (16 KiB: two rounds of chunks) send
 * from each member's own buffer and fold into the result's (no staging
 * copies): the same bits as the virtual mesh, waited at the consumer or at
 * once (NABLA_MPI_OVERLAP=0), of a value and of its transpose. */
Test(mpi_mesh, large_all_reduces_match_the_virtual_mesh) {
  uint64_t seed = 12;
  const char *axes[2] = {NULL, "dp=2,tp=2"}, *spec[2] = {"_, _ partial(x)", "_, _ partial(dp)"};
  char ax0[16];
  snprintf(ax0, sizeof ax0, "x=%d", N);
  axes[0] = ax0;
  int64_t rows[3] = {8, 64, 515}; /* 1.5, 150 and 1207 KiB of f64 */
  for (int overlap = 0; overlap < 2; overlap++) {
    setenv("NABLA_MPI_OVERLAP", overlap ? "1" : "0", 1);
    for (int c = 0; c < 2; c++) {
      nb_mesh *w = nb_mesh_world(axes[c]), *v = nb_mesh_cpu(axes[c]);
      for (int k = 0; k < 3; k++) {
        nb_scope_begin();
        nb_tensor *x = rand_f64(NB_SHAPE(rows[k], 300), &seed);
        char what[160];
        snprintf(what, sizeof what, "%s %s rows %lld overlap %d", axes[c], spec[c],
                 (long long)rows[k], overlap);
        nb_tensor *g = nb_reshard(nb_shard(x, w, spec[c]), "_, _");
        nb_tensor *r = nb_reshard(nb_shard(x, v, spec[c]), "_, _");
        assert_same(g, r, what);
        nb_tensor *gt = nb_reshard(nb_transpose(nb_shard(x, w, spec[c])), "_, _");
        nb_tensor *rt = nb_reshard(nb_transpose(nb_shard(x, v, spec[c])), "_, _");
        assert_same(gt, rt, what);
        nb_scope_end();
      }
      nb_mesh_release(w);
      nb_mesh_release(v);
    }
  }
  unsetenv("NABLA_MPI_OVERLAP");
}

/* Ops on sharded values: partial sums (worked case 1), reductions,
 * elementwise chains, a conflict resolved by an all-gather. */
static nb_tensor *program(nb_mesh *m, nb_tensor *a, nb_tensor *b, nb_tensor *c) {
  nb_tensor *A = nb_shard(a, m, "dp, tp"), *B = nb_shard(b, m, "tp, _"),
            *C = nb_shard(c, m, "_, dp");
  nb_tensor *y = nb_matmul(A, B);               /* [dp, _] partial(tp) */
  nb_tensor *z = nb_tanh(nb_add(y, nb_exp(y))); /* all-reduced first */
  nb_tensor *u = nb_matmul(z, C);               /* conflict on dp */
  nb_tensor *s = nb_sum(nb_square(u), NB_AXES(0), false);
  return nb_add(nb_mul_scalar(s, 0.5), nb_max(u, NB_AXES(0), false));
}

Test(mpi_mesh, ops_match_the_virtual_mesh) {
  uint64_t seed = 7;
  nb_tensor *a = rand_f64(NB_SHAPE(8, 12), &seed), *b = rand_f64(NB_SHAPE(12, 6), &seed),
            *c = rand_f64(NB_SHAPE(6, 10), &seed);
  nb_mesh *w = nb_mesh_world("dp=2,tp=2"), *v = nb_mesh_cpu("dp=2,tp=2");
  assert_same(program(w, a, b, c), program(v, a, b, c), "program");
  nb_tensor *plain = program(v, a, b, c);
  cr_assert_eq(nb_item(nb_sum(program(w, a, b, c), NB_ALL, false)),
               nb_item(nb_sum(plain, NB_ALL, false)));
  nb_mesh_release(w);
  nb_mesh_release(v);
}

/* ---- shard_map: every collective between the processes ------------------------ */
static const int RING[4][2] = {{0, 1}, {1, 2}, {2, 3}, {3, 0}};
static int g_n; /* group size of axis x */

static nb_status coll_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *x = in[0];
  out[0] = nb_all_reduce(x, "x", NB_SUM);
  out[1] = nb_all_reduce(x, "x", NB_MAX);
  out[2] = nb_all_reduce(x, "x", NB_MIN);
  out[3] = nb_all_reduce(x, "x", NB_MEAN);
  out[4] = nb_all_gather(x, "x", 0);
  out[5] = nb_reduce_scatter(x, "x", 0);
  out[6] = nb_all_to_all(x, "x", 0, 1);
  int ring[4][2];
  for (int i = 0; i < g_n; i++)
    ring[i][0] = RING[i][0] % g_n, ring[i][1] = (RING[i][0] + 1) % g_n;
  out[7] = nb_ppermute(nb_exp(x), "x", (const int(*)[2])ring, g_n > 1 ? g_n - 1 : 1);
  out[8] = nb_all_reduce(nb_sin(x), "x,y", NB_SUM);
  out[9] = nb_mul(nb_cast(nb_axis_index("x,y"), NB_F64), x);
  for (int j = 0; j < 10; j++)
    if (!out[j]) return nb_last_status();
  return NB_OK;
}

Test(mpi_mesh, shard_map_collectives) {
  char axes[32];
  snprintf(axes, sizeof axes, "x=%d,y=2", N);
  g_n = N;
  uint64_t seed = 8;
  nb_tensor *x = rand_f64(NB_SHAPE(4 * N, 8), &seed);
  static const char *const in_specs[] = {"x, y"};
  static const char *const out_specs[] = {"_, y", "_, y", "_, y", "_, y", "_, y",
                                          "x, y", "x, y", "x, y", "_, _", "x, y"};
  nb_fn *f = nb_fn_create(coll_body, NULL, 1, 10);
  nb_mesh *w = nb_mesh_world(axes), *v = nb_mesh_cpu(axes);
  nb_fn *sw = nb_shard_map(f, w, in_specs, out_specs),
        *sv = nb_shard_map(f, v, in_specs, out_specs);
  nb_tensor *gw[10], *gv[10];
  cr_assert_eq(nb_call(sw, (nb_tensor *[]){nb_shard(x, w, "x, y")}, gw), NB_OK, "%s",
               nb_last_error());
  cr_assert_eq(nb_call(sv, (nb_tensor *[]){nb_shard(x, v, "x, y")}, gv), NB_OK, "%s",
               nb_last_error());
  static const char *names[] = {"sum",         "max",        "min",      "mean",    "all_gather",
                                "red_scatter", "all_to_all", "ppermute", "sum x,y", "axis_index"};
  for (int j = 0; j < 10; j++)
    assert_same(gw[j], gv[j], names[j]);
  nb_fn_release(sw);
  nb_fn_release(sv);
  nb_fn_release(f);
  nb_mesh_release(w);
  nb_mesh_release(v);
}

/* ---- the collectives of groups spanning ranks, called directly ----------------
 * On "x=N" (a device per rank: each runs as its group's MPI collective) and
 * on "x=N,y=2" over axis x (two groups per rank on one communicator), every
 * kind on blocks of uneven chunks, along dims 0 and 1, of every dtype MPI
 * moves, each device's result against the virtual mesh's byte for byte (float
 * reduce-scatters over more than 2 ranks: within rounding, and exact with
 * NABLA_MPI_EXACT=1). */
enum {
  K_SUM,
  K_MAX,
  K_MIN,
  K_MEAN,
  K_GATHER0,
  K_GATHER1,
  K_SCATTER0,
  K_SCATTER1,
  K_A2A,
  K_PERM,
  N_KINDS
};
static const char *const KIND[] = {"sum",     "max",      "min",      "mean",       "gather0",
                                   "gather1", "scatter0", "scatter1", "all_to_all", "ppermute"};

/* Device d's block of mesh m ([3 + d % 2 ... ] uneven along dim 0 for the
 * gathers): values from d and the dtype, NaN and signed zeros among them. */
static nb_tensor *block(nb_mesh *m, int d, nb_dtype dt, bool same_shape) {
  nb_shape s = NB_SHAPE(same_shape ? 5 : 5 + d % 2, 3);
  if (!nbi_mesh_local(m, d)) return nbi_remote_block(m, d, &s, dt);
  int64_t n = tc_numel(s);
  double *x = malloc(sizeof *x * (size_t)n);
  uint64_t seed = 100 + (uint64_t)d;
  double *r = tc_rand_floats(n, NB_F64, &seed);
  for (int64_t i = 0; i < n; i++) {
    x[i] = nb_dtype_is_float(dt) ? r[i] * 4 : (double)((int64_t)(r[i] * 1000) % 97);
    if (nb_dtype_is_float(dt) && i % 7 == 3) x[i] = (d % 2) ? -0.0 : 0.0; /* ties */
    if (nb_dtype_is_float(dt) && i == 4 && d == 1) x[i] = NAN;
  }
  nb_tensor *h = nb_cast(tc_tensor(x, s, NB_F64), dt);
  free(x), free(r);
  return nbi_place(m, d, h);
}

static nb_status run_kind(nb_mesh *m, int kind, nb_dtype dt, nb_tensor **out) {
  nb_tensor *phys[16];
  bool same = kind != K_GATHER0;
  for (int d = 0; d < m->n_dev; d++)
    phys[d] = block(m, d, dt, same);
  nbi_axis ax = nbi_axis_whole(m, 0);
  const char *fn = KIND[kind];
  int pairs[4][2], np = 0;
  switch (kind) {
  case K_SUM: return nbi_coll_all_reduce(fn, m, phys, &ax, 1, NB_REDUCE_SUM, out);
  case K_MAX: return nbi_coll_all_reduce(fn, m, phys, &ax, 1, NB_REDUCE_MAX, out);
  case K_MIN: return nbi_coll_all_reduce(fn, m, phys, &ax, 1, NB_REDUCE_MIN, out);
  case K_MEAN: return nbi_coll_all_reduce(fn, m, phys, &ax, 1, NB_REDUCE_MEAN, out);
  case K_GATHER0: return nbi_coll_all_gather(fn, m, phys, &ax, 1, 0, out);
  case K_GATHER1: return nbi_coll_all_gather(fn, m, phys, &ax, 1, 1, out);
  case K_SCATTER0: return nbi_coll_reduce_scatter(fn, m, phys, &ax, 1, 0, out);
  case K_SCATTER1: return nbi_coll_reduce_scatter(fn, m, phys, &ax, 1, 1, out);
  case K_A2A: return nbi_coll_all_to_all(fn, m, phys, &ax, 1, 0, 1, out);
  default: /* a shift by one, the last rank receiving nothing (zeros) */
    for (int i = 0; i + 1 < N; i++)
      pairs[np][0] = i, pairs[np][1] = i + 1, np++;
    return nbi_coll_ppermute(fn, m, phys, &ax, 1, (const int(*)[2])pairs, np, out);
  }
}

static void check_kinds(const char *axes, nb_dtype dt, double tol) {
  nb_mesh *w = nb_mesh_world(axes), *v = nb_mesh_cpu(axes);
  bool reduces_ok = dt == NB_F32 || dt == NB_F64 || dt == NB_I32 || dt == NB_I64;
  for (int k = 0; k < N_KINDS; k++) {
    if (k == K_MEAN && !nb_dtype_is_float(dt)) continue;
    if (!reduces_ok && (k <= K_MEAN || k == K_SCATTER0 || k == K_SCATTER1)) continue;
    nb_scope_begin();
    nb_tensor *gw[16], *gv[16];
    cr_assert_eq(run_kind(w, k, dt, gw), NB_OK, "%s %s: %s", axes, KIND[k], nb_last_error());
    cr_assert_eq(run_kind(v, k, dt, gv), NB_OK, "%s %s: %s", axes, KIND[k], nb_last_error());
    /* all-reduces fold in group order at every size (src/backends/mpi): exact;
     * reduce-scatters add in MPI's order */
    bool sums = nb_dtype_is_float(dt) && (k == K_SCATTER0 || k == K_SCATTER1);
    for (int d = 0; d < w->n_dev; d++) {
      cr_assert(nbi_shape_eq(&gw[d]->shape, &gv[d]->shape), "%s %s %s: device %d's shape", axes,
                KIND[k], nb_dtype_name(dt), d);
      if (!nbi_mesh_local(w, d)) {
        cr_assert(gw[d]->flags & NBI_T_REMOTE, "%s %s: device %d is remote", axes, KIND[k], d);
        continue;
      }
      size_t nb = (size_t)nbi_numel(&gv[d]->shape) * nb_dtype_size(dt);
      char *a = malloc(nb + 1), *b = malloc(nb + 1);
      cr_assert_eq(nb_to_host(gw[d], a, nb), NB_OK, "%s", nb_last_error());
      cr_assert_eq(nb_to_host(gv[d], b, nb), NB_OK, "%s", nb_last_error());
      if (sums && tol > 0) {
        double *x = tc_read(gw[d]), *y = tc_read(gv[d]);
        for (int64_t i = 0; i < nbi_numel(&gv[d]->shape); i++)
          cr_assert(fabs(x[i] - y[i]) <= tol * (1 + fabs(y[i])) || (x[i] != x[i] && y[i] != y[i]),
                    "%s %s %s: device %d [%lld]: %.17g vs %.17g", axes, KIND[k], nb_dtype_name(dt),
                    d, (long long)i, x[i], y[i]);
        free(x), free(y);
      } else {
        cr_assert(memcmp(a, b, nb) == 0, "%s %s %s: device %d differs from the virtual mesh", axes,
                  KIND[k], nb_dtype_name(dt), d);
      }
      free(a), free(b);
    }
    nb_scope_end();
  }
  nb_mesh_release(w);
  nb_mesh_release(v);
}

Test(mpi_mesh, group_collectives_every_kind_and_dtype) {
  char a1[16], a2[16];
  snprintf(a1, sizeof a1, "x=%d", N);
  snprintf(a2, sizeof a2, "x=%d,y=2", N);
  static const nb_dtype dts[] = {NB_F64, NB_F32, NB_I32, NB_I64, NB_F16};
  for (int i = 0; i < 5; i++) {
    double tol = N <= 2 ? 0 : dts[i] == NB_F32 ? 1e-5 : 1e-12; /* MPI's association */
    check_kinds(a1, dts[i], tol);
    check_kinds(a2, dts[i], tol);
  }
  setenv("NABLA_MPI_EXACT", "1", 1); /* the whole-blocks way: exact at every size */
  check_kinds(a1, NB_F64, 0);
  check_kinds(a2, NB_F32, 0);
  unsetenv("NABLA_MPI_EXACT");
}

/* The result of a collective between ranks is a lazy node waiting for the
 * transfer (overlap) that realizes to the value; NABLA_MPI_OVERLAP=0 waits at
 * once. A result dropped unread is waited for when it goes (no leak, no
 * dangling transfer). */
Test(mpi_mesh, results_wait_at_the_first_consumer) {
  if (N == 1) return;
  char axes[16];
  snprintf(axes, sizeof axes, "x=%d", N);
  nb_mesh *w = nb_mesh_world(axes), *v = nb_mesh_cpu(axes);
  for (int overlap = 1; overlap >= 0; overlap--) {
    setenv("NABLA_MPI_OVERLAP", overlap ? "1" : "0", 1);
    nb_scope_begin();
    nb_tensor *gw[16], *gv[16];
    cr_assert_eq(run_kind(w, K_MAX, NB_F64, gw), NB_OK, "%s", nb_last_error());
    int d = nbi_mesh_first_local(w);
    if (overlap) cr_assert(!nb_is_realized(gw[d]), "the result waits for its first consumer");
    cr_assert_eq(run_kind(w, K_SUM, NB_F64, gw + 8), NB_OK, "%s", nb_last_error()); /* dropped */
    cr_assert_eq(run_kind(v, K_MAX, NB_F64, gv), NB_OK, "%s", nb_last_error());
    nb_tensor *y = nb_exp(gw[d]), *z = nb_exp(gv[d]);
    double *a = tc_read(y), *b = tc_read(z);
    for (int64_t i = 0; i < nbi_numel(&z->shape); i++)
      cr_assert(a[i] == b[i] || (a[i] != a[i] && b[i] != b[i]), "[%lld]", (long long)i);
    free(a), free(b);
    nb_scope_end();
  }
  unsetenv("NABLA_MPI_OVERLAP");
  nb_mesh_release(w);
  nb_mesh_release(v);
}

/* ---- training: data parallel and Megatron ------------------------------------- */
static nb_status loss_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_tanh(nb_matmul(in[0], in[1]));
  out[0] = nb_mean(nb_square(nb_sub(nb_matmul(h, in[2]), in[3])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* Five SGD steps of the MLP (x [16, 4], W1 [4, 8], W2 [8, 4]) on m (NULL:
 * unsharded) with the given layouts; losses[5]. */
static void train(nb_mesh *m, const char *xs, const char *w1s, const char *w2s, double *losses,
                  bool jit) {
  uint64_t seed = 9;
  nb_tensor *x = rand_f64(NB_SHAPE(16, 4), &seed), *w1 = rand_f64(NB_SHAPE(4, 8), &seed),
            *w2 = rand_f64(NB_SHAPE(8, 4), &seed), *y = rand_f64(NB_SHAPE(16, 4), &seed);
  if (m) {
    x = nb_shard(x, m, xs), y = nb_shard(y, m, xs);
    w1 = nb_shard(w1, m, w1s), w2 = nb_shard(w2, m, w2s);
  }
  nb_fn *f = nb_fn_create(loss_body, NULL, 4, 1), *vg = nb_value_and_grad(f, NB_AXES(1, 2));
  if (jit) {
    nb_fn *j = nb_jit(vg);
    nb_fn_release(vg);
    vg = j;
  }
  for (int step = 0; step < 5; step++) {
    nb_tensor *o[3];
    cr_assert_eq(nb_call(vg, (nb_tensor *[]){x, w1, w2, y}, o), NB_OK, "%s", nb_last_error());
    if (m) {
      STR_EQ(nb_sharding_str(o[1]), nb_sharding_str(w1), "%s", nb_sharding_str(o[1]));
      STR_EQ(nb_sharding_str(o[2]), nb_sharding_str(w2), "%s", nb_sharding_str(o[2]));
    }
    w1 = nb_sub(w1, nb_mul_scalar(o[1], 0.1));
    w2 = nb_sub(w2, nb_mul_scalar(o[2], 0.1));
    cr_assert_eq(nb_eval((nb_tensor *[]){w1, w2}, 2), NB_OK, "%s", nb_last_error());
    losses[step] = nb_item(o[0]);
  }
  nb_fn_release(vg);
  nb_fn_release(f);
}

static void check_training(const char *xs, const char *w1s, const char *w2s) {
  double plain[5], virt[5], job[5], virt_jit[5], job_jit[5];
  nb_mesh *w = nb_mesh_world("dp=2,tp=2"), *v = nb_mesh_cpu("dp=2,tp=2");
  train(NULL, NULL, NULL, NULL, plain, false);
  train(v, xs, w1s, w2s, virt, false);
  train(w, xs, w1s, w2s, job, false);
  train(v, xs, w1s, w2s, virt_jit, true);
  train(w, xs, w1s, w2s, job_jit, true);
  for (int s = 0; s < 5; s++) {
    cr_assert_eq(job[s], virt[s], "step %d: %.17g vs %.17g on one process's mesh", s, job[s],
                 virt[s]);
    cr_assert(fabs(job[s] - plain[s]) <= 1e-12 * fabs(plain[s]), "step %d: %.17g vs %.17g", s,
              job[s], plain[s]);
    cr_assert_eq(job_jit[s], virt_jit[s], "jit step %d: %.17g vs %.17g", s, job_jit[s],
                 virt_jit[s]);
    cr_assert(fabs(job_jit[s] - plain[s]) <= 1e-12 * fabs(plain[s]), "jit step %d", s);
  }
  cr_assert(job[4] < job[0], "the loss goes down: %g -> %g", job[0], job[4]);
  nb_mesh_release(w);
  nb_mesh_release(v);
}

Test(mpi_mesh, data_parallel_training_gives_the_unsharded_losses) {
  check_training("dp, _", "_, _", "_, _");
}

Test(mpi_mesh, megatron_training_gives_the_unsharded_losses) {
  check_training("dp, _", "_, tp", "tp, _");
}

Test(mpi_mesh, nb_backward_is_refused_across_processes) {
  if (N == 1) return;
  nb_mesh *w = nb_mesh_world("x=2,y=2");
  uint64_t seed = 10;
  nb_tensor *x = nb_shard(rand_f64(NB_SHAPE(4, 4), &seed), w, "x, _");
  cr_assert(!nb_set_requires_grad(x, true), "requires grad");
  cr_assert_eq(nb_last_status(), NB_ERR_DISTRIBUTED);
  cr_assert(strstr(nb_last_error(), "nb_value_and_grad"), "%s", nb_last_error());
  nb_clear_error();
  nb_mesh_release(w);
}

int main(int argc, char **argv) {
  if (nb_init_distributed(&argc, &argv) != NB_OK) {
    fprintf(stderr, "%s\n", nb_last_error());
    return 2;
  }
  R = nb_rank(), N = nb_world_size();
  if (argc > 1 && strcmp(argv[1], "killed") == 0) {
    char axes[16];
    snprintf(axes, sizeof axes, "x=%d", N);
    nb_mesh *m = nb_mesh_world(axes);
    double v[64];
    for (int i = 0; i < 64; i++)
      v[i] = i;
    nb_tensor *t = nb_shard(nb_from_data(v, NB_SHAPE(64), NB_F64), m, "x");
    if (R == 1) raise(SIGKILL); /* dies before the gather */
    double out[64];
    nb_to_host(t, out, sizeof out); /* the others end the job here */
    return 0;
  }
  int rc = tcm_main();
  nb_finalize();
  if (R == 0) fprintf(stderr, "test_mpi_mesh: %d ranks: %s\n", N, rc ? "FAILED" : "ok");
  return rc;
}
