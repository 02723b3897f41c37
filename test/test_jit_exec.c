/* test/test_jit_exec.c — nb_jit's fast path (nbi_exec): a top-level call on
 * plain values runs the entry's planned executable (no graph recorded, no
 * plan looked up, no buffer from the system allocator once warm) and gives
 * the values the unjitted function gives; calls it cannot serve (another
 * layout, nb_backward provenance, traced arguments, other planner settings)
 * take the replay path and agree too. */
#include "common.h"

#include <time.h>

TestSuite(jit_exec, .init = tc_setup, .fini = tc_teardown);

/* in: x [B, 3], w [3, 4], b [4] -> relu(x @ w + b) (fused epilogue), its row
 * sums' mean (a row group), x passed through, the same relu again. */
static nb_status mlp_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_relu(nb_add(nb_matmul(in[0], in[1]), in[2]));
  out[0] = h;
  out[1] = nb_mean(nb_exp(nb_sum(nb_mul(h, h), NB_AXES(1), false)), NB_ALL, false);
  out[2] = in[0];
  out[3] = h;
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

/* Reference values of mlp_body's outputs 0 and 1 in double. */
static void mlp_ref(const double *x, const double *w, const double *b, int64_t rows, double *h,
                    double *m) {
  *m = 0;
  for (int64_t i = 0; i < rows; i++) {
    double s = 0;
    for (int j = 0; j < 4; j++) {
      double v = b[j];
      for (int k = 0; k < 3; k++)
        v += x[i * 3 + k] * w[k * 4 + j];
      h[i * 4 + j] = v > 0 ? v : 0;
      s += h[i * 4 + j] * h[i * 4 + j];
    }
    *m += exp(s) / (double)rows;
  }
}

static void check_call(nb_fn *j, nb_tensor *x, const double *xd, const double *w, const double *b,
                       nb_tensor *wt, nb_tensor *bt, int64_t rows) {
  nb_tensor *in[3] = {x, wt, bt}, *out[4];
  cr_assert_eq(nb_call(j, in, out), NB_OK, "%s", nb_last_error());
  double *h = malloc(sizeof(double) * (size_t)rows * 4), m;
  mlp_ref(xd, w, b, rows, h, &m);
  tc_assert_close(out[0], h, NB_SHAPE(rows, 4));
  tc_assert_close(out[3], h, NB_SHAPE(rows, 4));
  tc_assert_close(out[1], &m, NB_SHAPE());
  tc_assert_close_tol(out[2], xd, NB_SHAPE(rows, 3), 0);
  cr_assert(nb_is_realized(out[0]) && nb_is_realized(out[1]));
  free(h);
}

Test(jit_exec, repeated_calls_match_reference_without_graph_work) {
  uint64_t seed = 3;
  double *w = tc_rand_floats(12, NB_F32, &seed), *b = tc_rand_floats(4, NB_F32, &seed);
  nb_tensor *wt = tc_tensor(w, NB_SHAPE(3, 4), NB_F32), *bt = tc_tensor(b, NB_SHAPE(4), NB_F32);
  nb_fn *f = nb_fn_create(mlp_body, NULL, 3, 4), *j = nb_jit(f);
  uint64_t live0 = 0;
  for (int call = 0; call < 6; call++) {
    nb_scope_begin();
    double *x = tc_rand_floats(40 * 3, NB_F32, &seed);
    nb_tensor *xt = tc_tensor(x, NB_SHAPE(40, 3), NB_F32);
    nb_reset_stats();
    check_call(j, xt, x, w, b, wt, bt, 40);
    nb_stats s = nb_get_stats();
    if (call > 0) {
      /* one realization, no plan lookup, no tracing; every buffer from the cache */
      cr_assert_eq(s.plan_cache_hits + s.plan_cache_misses, 0);
      cr_assert_eq(s.realizations, 1);
      cr_assert_eq(s.jit_cache_hits, 1);
      cr_assert_eq(s.kernels_run, 2, "epilogue, row group with the mean: %llu",
                   (unsigned long long)s.kernels_run);
    }
    if (call > 1) cr_assert_eq(s.buffer_allocs, s.buffer_cache_hits);
    free(x);
    nb_scope_end();
    if (call == 1) live0 = nb_get_stats().live_tensors;
    if (call > 1) cr_assert_eq(nb_get_stats().live_tensors, live0, "no handle leaks across calls");
  }
  nb_fn_release(j);
  nb_fn_release(f);
  free(w), free(b);
}

/* nb_stats.exec_ns and plan_ns are summed in cheap ticks (the TSC where it is
 * invariant) and converted when read: over many calls they must agree with a
 * wall clock read around them. */
Test(jit_exec, exec_and_plan_time_agree_with_the_wall_clock) {
  nb_tensor *x = nb_rand(NB_SHAPE(512, 256), NB_F32);
  nb_fn *f = nb_fn_create(mlp_body, NULL, 3, 4), *j = nb_jit(f);
  nb_tensor *in[3] = {nb_rand(NB_SHAPE(512, 3), NB_F32), nb_rand(NB_SHAPE(3, 4), NB_F32),
                      nb_rand(NB_SHAPE(4), NB_F32)};
  nb_tensor *out[4];
  cr_assert_eq(nb_call(j, in, out), NB_OK); /* warm: traced and planned */
  nb_reset_stats();
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < 2000; i++) {
    nb_scope_begin();
    cr_assert_eq(nb_call(j, in, out), NB_OK);
    nb_scope_end();
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double wall = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
  nb_stats s = nb_get_stats();
  cr_expect_gt(s.exec_ns, 0);
  cr_expect_leq((double)s.exec_ns, wall * 1.02, "exec %llu ns in %.0f ns of wall time",
                (unsigned long long)s.exec_ns, wall);
  cr_expect_geq((double)s.exec_ns, wall * 0.2, "the calls are mostly execution");
  /* a planned realization: plan time counted, within the wall time too */
  nb_reset_stats();
  clock_gettime(CLOCK_MONOTONIC, &t0);
  nb_tensor *y = nb_tanh(nb_add_scalar(nb_mul_scalar(x, 3.0), 0.5));
  cr_assert_eq(nb_eval(&y, 1), NB_OK);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  wall = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
  s = nb_get_stats();
  cr_expect_gt(s.plan_ns + s.exec_ns, 0);
  cr_expect_leq((double)(s.plan_ns + s.exec_ns), wall * 1.02 + 1000);
  nb_fn_release(j);
  nb_fn_release(f);
}

Test(jit_exec, other_layout_and_planner_settings_replay) {
  uint64_t seed = 5;
  double *w = tc_rand_floats(12, NB_F32, &seed), *b = tc_rand_floats(4, NB_F32, &seed);
  double *x = tc_rand_floats(24 * 3, NB_F32, &seed);
  nb_tensor *wt = tc_tensor(w, NB_SHAPE(3, 4), NB_F32), *bt = tc_tensor(b, NB_SHAPE(4), NB_F32);
  nb_tensor *xc = tc_tensor(x, NB_SHAPE(24, 3), NB_F32);
  nb_tensor *xs = tc_strided_tensor(x, NB_SHAPE(24, 3), NB_F32); /* a transposed view */
  cr_assert_eq(nb_eval(&xs, 1), NB_OK);
  nb_fn *f = nb_fn_create(mlp_body, NULL, 3, 4), *j = nb_jit(f);
  check_call(j, xc, x, w, b, wt, bt, 24); /* plans for contiguous x */
  nb_reset_stats();
  check_call(j, xs, x, w, b, wt, bt, 24); /* strided: replayed and realized */
  cr_assert_geq(nb_get_stats().plan_cache_hits + nb_get_stats().plan_cache_misses, 1);
  nbi_set_fusion(false);
  nb_reset_stats();
  check_call(j, xc, x, w, b, wt, bt, 24); /* planned with fusion: replayed */
  cr_assert_gt(nb_get_stats().kernels_run, 2);
  nbi_set_fusion(true);
  nb_reset_stats();
  check_call(j, xc, x, w, b, wt, bt, 24); /* the executable again */
  cr_assert_eq(nb_get_stats().plan_cache_hits + nb_get_stats().plan_cache_misses, 0);
  nb_fn_release(j);
  nb_fn_release(f);
  free(w), free(b), free(x);
}

static nb_status sq_sum(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_mul(nb_sin(in[0]), in[1]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* Arguments with nb_backward provenance replay (the result keeps its graph),
 * and a transform over the jitted function traces through it. */
Test(jit_exec, backward_and_transforms_see_the_graph) {
  double xd[5] = {0.1, -0.7, 1.3, 2.0, -2.5}, yd[5] = {1, 2, 3, -1, 0.5}, g[5], v = 0;
  for (int i = 0; i < 5; i++) {
    g[i] = cos(xd[i]) * yd[i];
    v += sin(xd[i]) * yd[i];
  }
  nb_fn *f = nb_fn_create(sq_sum, NULL, 2, 1), *j = nb_jit(f);
  nb_tensor *x = tc_tensor(xd, NB_SHAPE(5), NB_F64), *y = tc_tensor(yd, NB_SHAPE(5), NB_F64);
  nb_tensor *in[2] = {x, y}, *out[1];
  for (int call = 0; call < 2; call++) { /* planned, then the executable */
    cr_assert_eq(nb_call(j, in, out), NB_OK, "%s", nb_last_error());
    tc_assert_close(out[0], &v, NB_SHAPE());
  }
  nb_set_requires_grad(x, true);
  cr_assert_eq(nb_call(j, in, out), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_backward(out[0]), NB_OK, "%s", nb_last_error());
  tc_assert_close(nb_grad_of(x), g, NB_SHAPE(5));
  nb_set_requires_grad(x, false);
  nb_fn *gj = nb_grad(j, NB_AXES(0));
  nb_tensor *go[1];
  cr_assert_eq(nb_call(gj, in, go), NB_OK, "%s", nb_last_error());
  tc_assert_close(go[0], g, NB_SHAPE(5));
  nb_fn_release(gj);
  nb_fn_release(j);
  nb_fn_release(f);
}

/* The executable rebinds its arguments per call: nb_assign between calls
 * (a training loop) changes what the next call reads. */
static nb_status step_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sub(in[0], nb_mul_scalar(in[1], 0.5)); /* p - 0.5 g */
  return out[0] ? NB_OK : nb_last_status();
}

Test(jit_exec, assign_between_calls) {
  double p0[3] = {1, 2, 3}, gd[3] = {2, -2, 4}, ref[3];
  nb_tensor *p = tc_tensor(p0, NB_SHAPE(3), NB_F32), *gt = tc_tensor(gd, NB_SHAPE(3), NB_F32);
  nb_fn *f = nb_fn_create(step_body, NULL, 2, 1), *j = nb_jit(f);
  for (int i = 0; i < 3; i++)
    ref[i] = p0[i];
  for (int step = 0; step < 5; step++) {
    nb_scope_begin();
    nb_tensor *in[2] = {p, gt}, *out[1];
    cr_assert_eq(nb_call(j, in, out), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_assign(p, out[0]), NB_OK, "%s", nb_last_error());
    nb_scope_end();
    for (int i = 0; i < 3; i++)
      ref[i] -= 0.5 * gd[i];
    tc_assert_close(p, ref, NB_SHAPE(3));
  }
  nb_fn_release(j);
  nb_fn_release(f);
}
