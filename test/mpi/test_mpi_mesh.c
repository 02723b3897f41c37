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
