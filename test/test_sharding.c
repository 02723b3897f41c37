/* test/test_sharding.c — sharded tensors end to end: placing and reading
 * back, resharding between every pair of specs, ops on sharded tensors
 * against the unsharded values, SHARDING.md's worked cases with their
 * shardings and collective counts, sharded autodiff, a tensor-parallel MLP. */
#include "common.h"

TestSuite(sharding, .init = tc_setup, .fini = tc_teardown);

static const char *const MESHES[] = {"x=2", "x=2,y=2", "x=4,y=2", "x=2,y=2,z=2"};

/* Values of t read back as doubles, compared with x exactly. */
static void assert_values(nb_tensor *t, const double *x, nb_shape s, double tol) {
  tc_assert_close_tol(t, x, s, tol);
}

Test(sharding, place_and_read_back_every_mesh) {
  uint64_t seed = 1;
  static const int64_t dims[][2] = {{8, 6}, {5, 3}, {1, 7}, {3, 0}};
  for (size_t mi = 0; mi < sizeof MESHES / sizeof *MESHES; mi++) {
    nb_mesh *m = nb_mesh_cpu(MESHES[mi]);
    cr_assert(m, "%s", nb_last_error());
    static const char *const specs[] = {"x, _", "_, x", "(x, y), _", "y, x", "_, _", "x"};
    for (size_t di = 0; di < sizeof dims / sizeof *dims; di++)
      for (size_t si = 0; si < sizeof specs / sizeof *specs; si++) {
        if (strchr(specs[si], 'y') && !strchr(MESHES[mi], 'y')) continue;
        nb_shape s = NB_SHAPE(dims[di][0], dims[di][1]);
        double *x = tc_rand_floats(tc_numel(s), NB_F32, &seed);
        nb_tensor *t = nb_shard(tc_tensor(x, s, NB_F32), m, specs[si]);
        cr_assert(t, "%s %s: %s", MESHES[mi], specs[si], nb_last_error());
        assert_values(t, x, s, 0);
        free(x);
      }
    nb_mesh_release(m);
  }
}

/* Every pair of specs of a rank-2 tensor on a 2x2 mesh, partial sources too:
 * resharding keeps the values. */
Test(sharding, reshard_every_pair_on_2x2) {
  static const char *const specs[] = {"_, _",
                                      "x, _",
                                      "_, x",
                                      "y, _",
                                      "_, y",
                                      "x, y",
                                      "y, x",
                                      "(x, y), _",
                                      "(y, x), _",
                                      "_, (x, y)",
                                      "_, (y, x)",
                                      "x, _ partial(y)",
                                      "_, y partial(x)",
                                      "_, _ partial(x)",
                                      "_, _ partial(x, y)"};
  int ns = (int)(sizeof specs / sizeof *specs);
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  uint64_t seed = 2;
  static const int64_t dims[][2] = {{4, 8}, {5, 3}};
  for (int di = 0; di < 2; di++) {
    nb_shape s = NB_SHAPE(dims[di][0], dims[di][1]);
    double *x = tc_rand_floats(tc_numel(s), NB_F64, &seed);
    for (int a = 0; a < ns; a++)
      for (int b = 0; b < ns; b++) {
        nb_scope_begin();
        nb_tensor *t = nb_shard(tc_tensor(x, s, NB_F64), m, specs[a]);
        cr_assert(t, "%s: %s", specs[a], nb_last_error());
        nb_tensor *r = nb_reshard(t, specs[b]);
        cr_assert(r, "%s -> %s: %s", specs[a], specs[b], nb_last_error());
        assert_values(r, x, s, 1e-12);
        nb_scope_end();
      }
    free(x);
  }
  nb_mesh_release(m);
}

/* SHARDING.md, worked cases (mesh x=4, y=2; sharded inputs are closed). */
Test(sharding, worked_case_1_matmul_partial_then_all_reduce) {
  nb_mesh *m = nb_mesh_cpu("x=4,y=2");
  uint64_t seed = 3;
  double *a = tc_rand_floats(8 * 32, NB_F64, &seed), *b = tc_rand_floats(32 * 16, NB_F64, &seed);
  nb_tensor *A = nb_shard(tc_tensor(a, NB_SHAPE(8, 32), NB_F64), m, "x, y");
  nb_tensor *B = nb_shard(tc_tensor(b, NB_SHAPE(32, 16), NB_F64), m, "y, _");
  nb_reset_stats();
  nb_tensor *C = nb_matmul(A, B);
  cr_assert(C, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(C), "[x, _] partial(y)");
  cr_assert_eq(nb_get_stats().n_all_reduce + nb_get_stats().n_all_gather, 0);
  double *c = calloc(8 * 16, sizeof *c);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 16; j++)
      for (int k = 0; k < 32; k++)
        c[i * 16 + j] += a[i * 32 + k] * b[k * 16 + j];
  assert_values(C, c, NB_SHAPE(8, 16), 1e-12); /* reading all-reduces */
  cr_assert_eq(nb_get_stats().n_all_reduce, 1);
  free(a), free(b), free(c);
  nb_mesh_release(m);
}

Test(sharding, worked_case_2_conflict_larger_tensor_wins) {
  nb_mesh *m = nb_mesh_cpu("x=4,y=2");
  uint64_t seed = 4;
  double *a = tc_rand_floats(8 * 32, NB_F64, &seed), *b = tc_rand_floats(32 * 16, NB_F64, &seed);
  nb_tensor *A = nb_shard(tc_tensor(a, NB_SHAPE(8, 32), NB_F64), m, "x, _");
  nb_tensor *B = nb_shard(tc_tensor(b, NB_SHAPE(32, 16), NB_F64), m, "_, x");
  nb_reset_stats();
  nb_tensor *C = nb_matmul(A, B);
  cr_assert(C, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(C), "[_, x]");
  cr_assert_eq(nb_get_stats().n_all_gather, 1, "A gathered on dim 0");
  double *c = calloc(8 * 16, sizeof *c);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 16; j++)
      for (int k = 0; k < 32; k++)
        c[i * 16 + j] += a[i * 32 + k] * b[k * 16 + j];
  assert_values(C, c, NB_SHAPE(8, 16), 1e-12);
  free(a), free(b), free(c);
  nb_mesh_release(m);
}

Test(sharding, worked_case_3_local_slice_no_communication) {
  nb_mesh *m = nb_mesh_cpu("x=4,y=2");
  uint64_t seed = 5;
  double *x = tc_rand_floats(64, NB_F64, &seed), *y = tc_rand_floats(64, NB_F64, &seed), z[64];
  nb_tensor *X = nb_shard(tc_tensor(x, NB_SHAPE(16, 4), NB_F64), m, "(x, y), _");
  nb_tensor *Y = nb_shard(tc_tensor(y, NB_SHAPE(16, 4), NB_F64), m, "x, _");
  nb_reset_stats();
  nb_tensor *Z = nb_add(X, Y);
  cr_assert(Z, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(Z), "[(x, y), _]");
  nb_stats s = nb_get_stats();
  cr_assert_eq(s.n_all_reduce + s.n_all_gather + s.n_all_to_all + s.n_permute + s.n_reduce_scatter,
               0);
  for (int i = 0; i < 64; i++)
    z[i] = x[i] + y[i];
  assert_values(Z, z, NB_SHAPE(16, 4), 0);
  free(x), free(y);
  nb_mesh_release(m);
}

Test(sharding, worked_case_4_reshape_sub_axes) {
  nb_mesh *m = nb_mesh_cpu("x=4,y=2");
  double x[8];
  for (int i = 0; i < 8; i++)
    x[i] = i;
  nb_tensor *X = nb_shard(tc_tensor(x, NB_SHAPE(8), NB_F64), m, "x");
  nb_tensor *R = nb_reshape(X, NB_SHAPE(2, 4));
  cr_assert(R, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(R), "[x:(1)2, x:(2)2]");
  assert_values(R, x, NB_SHAPE(2, 4), 0);
  nb_mesh *m3 = nb_mesh_cpu("x=3");
  double w[6] = {0, 1, 2, 3, 4, 5};
  nb_tensor *W = nb_shard(tc_tensor(w, NB_SHAPE(6), NB_F64), m3, "x");
  nb_tensor *R3 = nb_reshape(W, NB_SHAPE(2, 3));
  cr_assert(R3, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(R3), "[_, _]");
  assert_values(R3, w, NB_SHAPE(2, 3), 0);
  nb_mesh_release(m3);
  nb_mesh_release(m);
}

/* Elementwise, reductions and views on random specs of 4x2 and 2x2x2 meshes
 * give the unsharded values. */
Test(sharding, ops_match_unsharded) {
  uint64_t seed = 6;
  static const char *const specs[] = {"x, _", "_, y", "(x, y), _", "y, x", "_, (y, x)"};
  for (int mi = 2; mi < 4; mi++) {
    nb_mesh *m = nb_mesh_cpu(MESHES[mi]);
    for (int a = 0; a < 5; a++)
      for (int b = 0; b < 5; b++) {
        nb_scope_begin();
        nb_shape s = NB_SHAPE(8, 6);
        double *x = tc_rand_floats(48, NB_F64, &seed), *y = tc_rand_floats(48, NB_F64, &seed);
        nb_tensor *X = tc_tensor(x, s, NB_F64), *Y = tc_tensor(y, s, NB_F64);
        nb_tensor *SX = nb_shard(X, m, specs[a]), *SY = nb_shard(Y, m, specs[b]);
        nb_tensor *ref[4] = {nb_mul(nb_exp(X), Y), nb_sum(nb_mul(X, Y), NB_AXES(1), false),
                             nb_transpose(nb_add(X, Y)), nb_mean(nb_tanh(X), NB_AXES(0), true)};
        nb_tensor *got[4] = {nb_mul(nb_exp(SX), SY), nb_sum(nb_mul(SX, SY), NB_AXES(1), false),
                             nb_transpose(nb_add(SX, SY)), nb_mean(nb_tanh(SX), NB_AXES(0), true)};
        for (int k = 0; k < 4; k++) {
          cr_assert(got[k], "%s %s op %d: %s", specs[a], specs[b], k, nb_last_error());
          double *r = tc_read(ref[k]);
          assert_values(got[k], r, nb_shape_of(ref[k]), 1e-12);
          free(r);
        }
        free(x), free(y);
        nb_scope_end();
      }
    nb_mesh_release(m);
  }
}

/* Megatron-style tensor-parallel MLP block on dp=2, tp=2: column-parallel
 * W1, row-parallel W2: one all-reduce per block in the forward pass, and the
 * loss equals the unsharded one. */
static nb_tensor *mlp_loss(nb_tensor *x, nb_tensor *const *w, int blocks) {
  nb_tensor *h = x;
  for (int i = 0; i < blocks; i++)
    h = nb_add(nb_matmul(nb_relu(nb_add(nb_matmul(h, w[4 * i]), w[4 * i + 1])), w[4 * i + 2]),
               w[4 * i + 3]);
  return nb_mean(nb_square(h), NB_ALL, false);
}

Test(sharding, megatron_mlp_one_all_reduce_per_block) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 7;
  enum { B = 2, D = 8, H = 16, N = 12 };
  nb_tensor *w[4 * B], *sw[4 * B];
  static const char *const wspec[4] = {"_, tp", "tp", "tp, _", "_"};
  for (int i = 0; i < B; i++) {
    nb_shape sh[4] = {NB_SHAPE(D, H), NB_SHAPE(H), NB_SHAPE(H, D), NB_SHAPE(D)};
    for (int j = 0; j < 4; j++) {
      double *v = tc_rand_floats(tc_numel(sh[j]), NB_F64, &seed);
      w[4 * i + j] = tc_tensor(v, sh[j], NB_F64);
      sw[4 * i + j] = nb_shard(w[4 * i + j], m, wspec[j]);
      cr_assert(sw[4 * i + j], "%s", nb_last_error());
      free(v);
    }
  }
  double *xv = tc_rand_floats(N * D, NB_F64, &seed);
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(N, D), NB_F64), *sx = nb_shard(x, m, "dp, _");
  double ref = nb_item(mlp_loss(x, w, B));
  nb_reset_stats();
  nb_tensor *loss = mlp_loss(sx, sw, B);
  cr_assert(loss, "%s", nb_last_error());
  cr_assert_eq(nb_get_stats().n_all_reduce, B, "one all-reduce per block: %llu",
               (unsigned long long)nb_get_stats().n_all_reduce);
  cr_assert_eq(nb_get_stats().n_all_gather, 0);
  double got = nb_item(loss);
  cr_assert(fabs(got - ref) <= 1e-12 * (1 + fabs(ref)), "%.17g vs %.17g", got, ref);
  free(xv);
  nb_mesh_release(m);
}

/* nb_grad of a function of sharded values equals the unsharded gradient. */
static nb_status loss_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = mlp_loss(in[0], in + 1, 1);
  return out[0] ? NB_OK : nb_last_status();
}

Test(sharding, grad_of_sharded_function) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 8;
  enum { D = 4, H = 8, N = 6 };
  nb_shape sh[5] = {NB_SHAPE(N, D), NB_SHAPE(D, H), NB_SHAPE(H), NB_SHAPE(H, D), NB_SHAPE(D)};
  static const char *const spec[5] = {"dp, _", "_, tp", "tp", "tp, _", "_"};
  nb_tensor *in[5], *sin[5];
  for (int j = 0; j < 5; j++) {
    double *v = tc_rand_floats(tc_numel(sh[j]), NB_F64, &seed);
    in[j] = tc_tensor(v, sh[j], NB_F64);
    sin[j] = nb_shard(in[j], m, spec[j]);
    free(v);
  }
  nb_fn *f = nb_fn_create(loss_body, NULL, 5, 1), *g = nb_grad(f, NB_ALL);
  nb_tensor *ref[5], *got[5];
  cr_assert_eq(nb_call(g, in, ref), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(g, sin, got), NB_OK, "%s", nb_last_error());
  for (int j = 0; j < 5; j++) {
    cr_assert(nb_mesh_of(got[j]) == m, "gradient %d is sharded", j);
    double *r = tc_read(ref[j]);
    assert_values(got[j], r, sh[j], 1e-12);
    free(r);
  }
  nb_fn_release(g);
  nb_fn_release(f);
  nb_mesh_release(m);
}

Test(sharding, errors_are_clear) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  nb_tensor *t = nb_zeros(NB_SHAPE(4, 4), NB_F32);
  cr_assert_null(nb_shard(t, m, "z, _"));
  cr_assert_eq(nb_last_status(), NB_ERR_SHARDING);
  nb_clear_error();
  cr_assert_null(nb_shard(t, m, "x, x"));
  cr_assert_eq(nb_last_status(), NB_ERR_SHARDING);
  nb_clear_error();
  cr_assert_null(nb_shard(t, m, "x, y, _"));
  cr_assert_eq(nb_last_status(), NB_ERR_SHARDING);
  nb_clear_error();
  cr_assert_null(nb_reshard(t, "x, _"));
  cr_assert_eq(nb_last_status(), NB_ERR_SHARDING);
  nb_clear_error();
  nb_mesh *m2 = nb_mesh_cpu("x=2");
  nb_tensor *a = nb_shard(t, m, "x, _"), *b = nb_shard(t, m2, "x, _");
  cr_assert_null(nb_add(a, b));
  cr_assert_eq(nb_last_status(), NB_ERR_SHARDING);
  nb_clear_error();
  nb_mesh_release(m2);
  nb_mesh_release(m);
}

/* The planner's choice of collective (SHARDING.md "Reshard"): counts and values. */
Test(sharding, reshard_picks_the_cheapest_collective) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  static const struct {
    const char *from, *to;
    uint64_t a2a, perm, gather, reduce, rs;
  } cases[] = {
      {"x, _", "_, x", 1, 0, 0, 0, 0},            /* an axis moves between dims */
      {"x, _", "y, _", 0, 1, 0, 0, 0},            /* equal-size swap */
      {"(x, y), _", "x, _", 0, 0, 1, 0, 0},       /* dropping an axis */
      {"x, _", "(x, y), _", 0, 0, 0, 0, 0},       /* adding one: a local cut */
      {"_, _ partial(y)", "y, _", 0, 0, 0, 0, 1}, /* partial onto a sharded dim */
      {"_, _ partial(y)", "_, _", 0, 0, 0, 1, 0},
  };
  uint64_t seed = 9;
  double *x = tc_rand_floats(8 * 4, NB_F64, &seed);
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    nb_scope_begin();
    nb_tensor *t = nb_shard(tc_tensor(x, NB_SHAPE(8, 4), NB_F64), m, cases[c].from);
    cr_assert(t, "%s", nb_last_error());
    nb_reset_stats();
    nb_tensor *r = nb_reshard(t, cases[c].to);
    cr_assert(r, "%s -> %s: %s", cases[c].from, cases[c].to, nb_last_error());
    nb_stats s = nb_get_stats();
    cr_assert(s.n_all_to_all == cases[c].a2a && s.n_permute == cases[c].perm &&
                  s.n_all_gather == cases[c].gather && s.n_all_reduce == cases[c].reduce &&
                  s.n_reduce_scatter == cases[c].rs,
              "%s -> %s: all-to-all %llu, permute %llu, all-gather %llu, all-reduce %llu, "
              "reduce-scatter %llu",
              cases[c].from, cases[c].to, (unsigned long long)s.n_all_to_all,
              (unsigned long long)s.n_permute, (unsigned long long)s.n_all_gather,
              (unsigned long long)s.n_all_reduce, (unsigned long long)s.n_reduce_scatter);
    cr_assert_str_eq(nb_sharding_str(r), nb_sharding_str(nb_shard(t, m, cases[c].to)));
    assert_values(r, x, NB_SHAPE(8, 4), 1e-12);
    nb_scope_end();
  }
  free(x);
  nb_mesh_release(m);
}

/* A sharded tensor captured (not passed) by a traced function is read whole:
 * a constant of the trace, gathered once. */
static nb_tensor *captured;
static nb_status capture_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_mul(in[0], nb_square(captured)), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

Test(sharding, captured_sharded_tensor_in_a_trace_is_read_whole) {
  nb_mesh *m = tc_mesh_here("x=2", 2); /* the capture and the arguments on one device */
  double cv[4] = {1, -2, 3, 0.5}, xv[4] = {2, 1, -1, 4};
  captured = nb_shard(tc_tensor(cv, NB_SHAPE(4), NB_F64), m, "x");
  nb_fn *f = nb_fn_create(capture_body, NULL, 1, 1), *g = nb_grad(f, NB_AXES(0));
  nb_fn *jf = nb_jit(f);
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(4), NB_F64), *o[1];
  double ref[4], y = 0;
  for (int i = 0; i < 4; i++)
    ref[i] = cv[i] * cv[i], y += xv[i] * ref[i];
  nb_reset_stats();
  cr_assert_eq(nb_call(g, &x, o), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(o[0], ref, NB_SHAPE(4), 0);
  cr_assert_eq(nb_get_stats().n_all_gather, 1);
  /* jit of it, on plain and on sharded arguments */
  cr_assert_eq(nb_call(jf, &x, o), NB_OK, "%s", nb_last_error());
  cr_assert_float_eq(nb_item(o[0]), y, 1e-12);
  nb_tensor *sx = nb_shard(x, m, "x");
  cr_assert_eq(nb_call(jf, &sx, o), NB_OK, "%s", nb_last_error());
  cr_assert_float_eq(nb_item(o[0]), y, 1e-12);
  nb_fn_release(jf);
  nb_fn_release(g);
  nb_fn_release(f);
  nb_mesh_release(m);
}

/* nb_backward runs through sharded tensors (test_sharded_backward.c has
 * the models): a plain requires-grad tensor placed on a mesh gets the
 * gradient of a loss computed on its shards, and so does a sharded leaf. */
Test(sharding, backward_through_sharded_tensors) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  nb_tensor *x = nb_set_requires_grad(nb_full(NB_SHAPE(4), 3, NB_F32), true);
  nb_tensor *s = nb_shard(x, m, "x");
  cr_assert(nb_requires_grad(s));
  cr_assert_eq(nb_backward(nb_sum(nb_mul(s, s), NB_ALL, false)), NB_OK, "%s", nb_last_error());
  tc_assert_close(nb_grad_of(x), (double[]){6, 6, 6, 6}, NB_SHAPE(4));
  nb_tensor *l = nb_set_requires_grad(nb_shard(nb_full(NB_SHAPE(4), 2, NB_F32), m, "x"), true);
  cr_assert(l, "%s", nb_last_error());
  cr_assert_eq(nb_backward(nb_sum(nb_mul(l, l), NB_ALL, false)), NB_OK, "%s", nb_last_error());
  nb_tensor *g = nb_grad_of(l);
  cr_assert_str_eq(nb_sharding_str(g), nb_sharding_str(l));
  tc_assert_close(g, (double[]){4, 4, 4, 4}, NB_SHAPE(4));
  nb_mesh_release(m);
}
