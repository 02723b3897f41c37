/* test/test_par_exec.c — independent steps of a plan run at once on the
 * OpenMP pool (src/core/graph.c, "parallel steps", NABLA_PAR_STEPS=1): sharded
 * computations on virtual CPU meshes give the same bits, the same kernel
 * counts and the same errors as the serial order (NABLA_PAR_STEPS=0), and
 * parallel levels did run. */
#include "common.h"

#include <stdio.h>

enum { MAX_OUT = 8 };

static bool mesh_2d; /* the mesh compare() runs on has two axes */

/* Builds the computation's outputs on mesh m (inputs from fixed seeds). */
typedef int (*build_fn)(nb_mesh *m, nb_tensor **out);

static void set_serial(bool on) { nbi_set_par_steps(!on); }

/* A [r, c] f32 tensor of seeded values in [-1, 1), placed by spec on m. */
static nb_tensor *input(nb_mesh *m, int64_t r, int64_t c, uint64_t seed, const char *spec) {
  int64_t n = c ? r * c : r;
  double *x = malloc(sizeof(double) * (size_t)n);
  tc_fill(x, n, -1, 1, &seed);
  nb_tensor *t = tc_tensor(x, c ? NB_SHAPE(r, c) : NB_SHAPE(r), NB_F32);
  free(x);
  nb_tensor *s = m ? nb_shard(t, m, spec) : t;
  cr_assert(s, "%s", nb_last_error());
  cr_assert_eq(nb_eval(&s, 1), NB_OK, "%s", nb_last_error());
  return s;
}

/* Realizes build's outputs on mesh spec ms serially, then in parallel: the
 * values are bitwise equal and nb_stats counts the same kernels. Returns the
 * parallel levels the parallel realization ran. */
static uint64_t compare(const char *ms, build_fn build) {
  double *vals[2][MAX_OUT];
  int64_t numel[2][MAX_OUT];
  int n[2];
  uint64_t kernels[2], levels = 0;
  for (int mode = 0; mode < 2; mode++) {
    set_serial(mode == 0);
    mesh_2d = strchr(ms, ',') != NULL;
    nb_mesh *m = nb_mesh_cpu(ms);
    cr_assert(m, "%s", nb_last_error());
    nb_scope_begin();
    nb_tensor *out[MAX_OUT];
    n[mode] = build(m, out);
    nb_reset_stats();
    uint64_t l0 = nbi_par_levels_run();
    cr_assert_eq(nb_eval(out, n[mode]), NB_OK, "%s", nb_last_error());
    kernels[mode] = nb_get_stats().kernels_run;
    levels = nbi_par_levels_run() - l0;
    for (int i = 0; i < n[mode]; i++) {
      numel[mode][i] = nb_numel(out[i]);
      vals[mode][i] = tc_read(out[i]);
    }
    nb_scope_end();
    nb_mesh_release(m);
  }
  nbi_set_par_steps(false);
  cr_assert_eq(n[0], n[1]);
  cr_expect_eq(kernels[0], kernels[1], "%s: kernels_run serial %llu, parallel %llu", ms,
               (unsigned long long)kernels[0], (unsigned long long)kernels[1]);
  for (int i = 0; i < n[0]; i++) {
    cr_assert_eq(numel[0][i], numel[1][i]);
    for (int64_t k = 0; k < numel[0][i]; k++)
      cr_assert(memcmp(&vals[0][i][k], &vals[1][i][k], sizeof(double)) == 0,
                "%s: output %d element %lld: serial %.9g, parallel %.9g", ms, i, (long long)k,
                vals[0][i][k], vals[1][i][k]);
    free(vals[0][i]);
    free(vals[1][i]);
  }
  return levels;
}

static bool two_d(nb_mesh *m) { return (void)m, mesh_2d; }

/* Products per device (rows over x; on x=2,y=2 the contraction over y, a
 * partial sum), one product reading another (a dependency in the window). */
static int b_matmul(nb_mesh *m, nb_tensor **out) {
  nb_tensor *a = input(m, 256, 64, 1, two_d(m) ? "x, y" : "x, _");
  nb_tensor *w = input(m, 64, 64, 2, two_d(m) ? "y, _" : "_, _");
  nb_tensor *w2 = input(m, 64, 64, 3, "_, _");
  out[0] = nb_matmul(a, w);
  out[1] = nb_matmul(nb_matmul(a, w2), w2);
  return 2;
}

/* Reductions and row ops over each device's block. */
static int b_reduce(nb_mesh *m, nb_tensor **out) {
  nb_tensor *a = input(m, 256, 128, 4, two_d(m) ? "x, y" : "x, _");
  out[0] = nb_sum(a, NB_AXES(1), false);
  out[1] = nb_max(a, NB_AXES(1), true);
  out[2] = nb_softmax(a, 1);
  out[3] = nb_cumsum(a, 1);
  return 4;
}

/* Elementwise steps alone (fusion off): u = exp(a); sin(sin(u)) + neg(u),
 * where neg writes over u in place (u is no handle's: its scope ended) and
 * must wait for sin(u) of its device. */
static int b_elementwise(nb_mesh *m, nb_tensor **out) {
  nb_tensor *a = input(m, 256, 128, 5, two_d(m) ? "x, y" : "x, _");
  nb_scope_begin();
  nb_tensor *u = nb_exp(a);
  out[0] = nb_keep(nb_add(nb_sin(nb_sin(u)), nb_neg(u)));
  nb_scope_end();
  out[1] = nb_tanh(nb_mul(a, a));
  return 2;
}

Test(par_exec, matmul_equals_serial) {
  const char *meshes[] = {"x=2", "x=4", "x=2,y=2"};
  for (int i = 0; i < 3; i++)
    cr_expect_gt(compare(meshes[i], b_matmul), 0, "%s ran no parallel level", meshes[i]);
}

Test(par_exec, reductions_equal_serial) {
  const char *meshes[] = {"x=2", "x=4", "x=2,y=2"};
  nbi_set_fusion(false); /* each reduction alone (fused, they form one row group) */
  for (int i = 0; i < 3; i++)
    cr_expect_gt(compare(meshes[i], b_reduce), 0, "%s ran no parallel level", meshes[i]);
  nbi_set_fusion(true);
  for (int i = 0; i < 3; i++)
    compare(meshes[i], b_reduce);
}

Test(par_exec, elementwise_chains_and_in_place_equal_serial) {
  nbi_set_fusion(false);
  const char *meshes[] = {"x=2", "x=4", "x=2,y=2"};
  for (int i = 0; i < 3; i++)
    cr_expect_gt(compare(meshes[i], b_elementwise), 0, "%s ran no parallel level", meshes[i]);
  nbi_set_fusion(true);
  for (int i = 0; i < 3; i++) /* fused: groups run in order, same values */
    compare(meshes[i], b_elementwise);
}

/* A Megatron MLP block: W1 column-parallel, W2 row-parallel over the last
 * mesh axis (x on x=4; on x=2,y=2 the batch over x, the hidden dim over y). */
static nb_status mlp_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_relu(nb_add(nb_matmul(in[4], in[0]), in[1]));
  nb_tensor *y = nb_add(nb_matmul(h, in[2]), in[3]);
  out[0] = nb_mean(nb_square(nb_sub(y, in[5])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static int b_mlp(nb_mesh *m, nb_tensor **out) {
  bool d2 = two_d(m);
  const char *tp = d2 ? "y" : "x";
  char col[8], row[8], vec[8];
  snprintf(col, sizeof col, "_, %s", tp);
  snprintf(row, sizeof row, "%s, _", tp);
  snprintf(vec, sizeof vec, "%s", tp);
  nb_tensor *in[6] = {
      input(m, 32, 128, 6, col),
      input(m, 128, 0, 7, vec),
      input(m, 128, 32, 8, row),
      input(m, 32, 0, 9, "_"),
      input(m, 64, 32, 10, d2 ? "x, _" : "_, _"),
      input(m, 64, 32, 11, d2 ? "x, _" : "_, _"),
  };
  nb_fn *f = nb_fn_create(mlp_loss, NULL, 6, 1);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1, 2, 3));
  nb_tensor *o[5];
  cr_assert_eq(nb_call(vg, in, o), NB_OK, "%s", nb_last_error());
  nb_fn_release(vg);
  nb_fn_release(f);
  for (int i = 0; i < 5; i++)
    out[i] = o[i];
  return 5;
}

Test(par_exec, sharded_mlp_value_and_grad_equal_serial) {
  const char *meshes[] = {"x=2", "x=4", "x=2,y=2"};
  for (int i = 0; i < 3; i++)
    cr_expect_gt(compare(meshes[i], b_mlp), 0, "%s ran no parallel level", meshes[i]);
}

/* nb_take on x=4 with out-of-range indices on devices 1 and 3: the
 * realization fails with the lowest failing step's error, as in order. */
static nb_status take_error(bool serial, char *msg, size_t cap, uint64_t *kernels,
                            uint64_t *levels) {
  set_serial(serial);
  nb_mesh *m = nb_mesh_cpu("x=4");
  nb_scope_begin();
  nb_tensor *t = input(m, 64, 256, 12, "_, _");
  int32_t idx[64];
  for (int i = 0; i < 64; i++)
    idx[i] = i % 64;
  idx[16 + 5] = 1000; /* device 1 */
  idx[48 + 2] = 5000; /* device 3 */
  nb_tensor *ix = nb_shard(nb_from_data(idx, NB_SHAPE(64), NB_I32), m, "x");
  cr_assert_eq(nb_eval(&ix, 1), NB_OK, "%s", nb_last_error());
  nb_tensor *y = nb_take(t, ix, 0);
  cr_assert(y, "%s", nb_last_error());
  nb_reset_stats();
  uint64_t l0 = nbi_par_levels_run();
  nb_status st = nb_eval(&y, 1);
  *levels = nbi_par_levels_run() - l0;
  *kernels = nb_get_stats().kernels_run;
  snprintf(msg, cap, "%s", nb_last_error());
  nb_clear_error();
  nb_scope_end();
  nb_mesh_release(m);
  nbi_set_par_steps(false);
  return st;
}

Test(par_exec, kernel_error_in_parallel_level_is_reported) {
  char m_ser[1024], m_par[1024];
  uint64_t k_ser, k_par, l_ser, l_par;
  nb_status s_ser = take_error(true, m_ser, sizeof m_ser, &k_ser, &l_ser);
  nb_status s_par = take_error(false, m_par, sizeof m_par, &k_par, &l_par);
  cr_assert_eq(s_ser, NB_ERR_INDEX, "%s", m_ser);
  cr_assert_eq(s_par, NB_ERR_INDEX, "%s", m_par);
  cr_assert_str_eq(m_par, m_ser);
  cr_assert(strstr(m_par, "nb_take") && strstr(m_par, "1000"), "%s", m_par);
  cr_assert_eq(k_par, k_ser);
  cr_assert_eq(l_ser, 0);
  cr_assert_gt(l_par, 0, "no parallel level ran");
  /* an error already recorded on the calling thread stays first */
  nb_clear_error();
  nbi_error(NB_ERR_STATE, "earlier error");
  char m2[1024];
  take_error(false, m2, sizeof m2, &k_par, &l_par);
  cr_assert_str_eq(m2, "earlier error");
  /* and the pool is usable after the failure */
  cr_expect_gt(compare("x=4", b_matmul), 0);
}
