/* test/test_auto_shard.c — automatic sharding (src/autoshard/): on a training
 * step of a 2-block MLP (loss, gradients, SGD update, the updated parameters
 * tied to their inputs' layouts) the solver finds Megatron on tp=2 and tp=4
 * (W1 column-parallel, W2 row-parallel, one all-reduce per block and pass),
 * data parallelism on dp=4 for a large batch and small weights, the 2-D plan
 * on dp=2,tp=2, and sharded weights under a memory bound below the
 * replicated ones; every plan is run (nb_shard_plan_call) and its measured
 * collectives and bytes (nb_stats) equal the prediction, its loss and
 * updated parameters the unsharded step's (f64, 1e-9 relative). The exact
 * DP and the local search agree on a tree; pins are kept; errors.
 * AS_REPORT=1 in the environment prints every plan's report. */
#include "common.h"

TestSuite(auto_shard, .init = tc_setup, .fini = tc_teardown);

enum { BLOCKS = 2, NP = 4 * BLOCKS, NIN = NP + 2, NOUT = 1 + NP };

/* in = W1, b1, W2, b2 per block, then x, y -> mean((mlp(x) - y)^2) */
static nb_status loss_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = in[NP];
  for (int i = 0; i < BLOCKS; i++) {
    nb_tensor *const *w = in + 4 * i;
    h = nb_add(nb_matmul(nb_relu(nb_add(nb_matmul(h, w[0]), w[1])), w[2]), w[3]);
  }
  out[0] = nb_mean(nb_square(nb_sub(h, in[NP + 1])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* one SGD step: loss, then every parameter minus 0.1 times its gradient */
static nb_status step_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *o[1 + NP];
  nb_status st = nb_call(u, in, o);
  if (st) return st;
  out[0] = o[0];
  for (int i = 0; i < NP; i++)
    if (!(out[1 + i] = nb_sub(in[i], nb_mul_scalar(o[1 + i], 0.1)))) return nb_last_status();
  return NB_OK;
}

typedef struct mlp {
  nb_fn *loss, *vg, *step;
  nb_tensor *in[NIN];
  int tie[NOUT];
} mlp;

static void mlp_make(mlp *t, int64_t n, int64_t d, int64_t h) {
  t->loss = nb_fn_create(loss_fn, NULL, NIN, 1);
  nb_axes params = {.n = NP};
  for (int i = 0; i < NP; i++)
    params.v[i] = i;
  t->vg = nb_value_and_grad(t->loss, params);
  t->step = nb_fn_create(step_fn, t->vg, NIN, NOUT);
  cr_assert(t->step, "%s", nb_last_error());
  for (int i = 0; i < BLOCKS; i++) {
    t->in[4 * i] = nb_mul_scalar(nb_randn(NB_SHAPE(d, h), NB_F64), 0.2);
    t->in[4 * i + 1] = nb_mul_scalar(nb_randn(NB_SHAPE(h), NB_F64), 0.1);
    t->in[4 * i + 2] = nb_mul_scalar(nb_randn(NB_SHAPE(h, d), NB_F64), 0.2);
    t->in[4 * i + 3] = nb_mul_scalar(nb_randn(NB_SHAPE(d), NB_F64), 0.1);
  }
  t->in[NP] = nb_randn(NB_SHAPE(n, d), NB_F64);
  t->in[NP + 1] = nb_randn(NB_SHAPE(n, d), NB_F64);
  for (int k = 0; k < NIN; k++)
    cr_assert(nb_eval(&t->in[k], 1) == NB_OK, "%s", nb_last_error());
  t->tie[0] = -1;
  for (int i = 0; i < NP; i++)
    t->tie[1 + i] = i;
}

static void mlp_free(mlp *t) {
  nb_fn_release(t->step);
  nb_fn_release(t->vg);
  nb_fn_release(t->loss);
}

/* Solves t's step on m, runs the plan once, and checks: measured collectives
 * and bytes == predicted, every output == the unsharded step's. */
static nb_shard_plan *solve_and_check(mlp *t, nb_mesh *m, nb_auto_shard_opts o) {
  o.out_like_in = t->tie;
  nb_shard_plan *p = nb_auto_shard_plan(t->step, m, t->in, &o);
  cr_assert(p, "%s", nb_last_error());
  nb_tensor *ref[NOUT], *got[NOUT];
  cr_assert(nb_call(t->step, t->in, ref) == NB_OK, "%s", nb_last_error());
  cr_assert(nb_eval(ref, NOUT) == NB_OK, "%s", nb_last_error());
  nb_reset_stats();
  cr_assert(nb_shard_plan_call(p, t->in, got) == NB_OK, "%s", nb_last_error());
  nb_stats s = nb_get_stats();
  nb_shard_prediction pr = nb_shard_plan_predict(p);
  char *rep = NULL;
  size_t rep_n = 0;
  FILE *f = open_memstream(&rep, &rep_n);
  cr_assert(nb_auto_shard_report(f, p, &s) == NB_OK, "%s", nb_last_error());
  fclose(f);
  if (getenv("AS_REPORT")) fputs(rep, stderr);
  cr_assert(s.n_all_reduce == pr.n_all_reduce && s.n_all_gather == pr.n_all_gather &&
                s.n_reduce_scatter == pr.n_reduce_scatter && s.n_all_to_all == pr.n_all_to_all &&
                s.n_permute == pr.n_permute && s.collective_bytes == pr.collective_bytes,
            "measured collectives differ from the prediction:\n%s", rep);
  cr_assert(strstr(rep, "note:") == NULL, "an op ran in another layout:\n%s", rep);
  for (int j = 0; j < NOUT; j++) {
    cr_assert_str_eq(nb_sharding_str(got[j]), nb_shard_plan_out_spec(p, j));
    cr_assert(nbi_shape_eq(&got[j]->shape, &ref[j]->shape));
    int64_t n = nbi_numel(&ref[j]->shape);
    double *a = malloc(sizeof *a * (size_t)n), *b = malloc(sizeof *b * (size_t)n);
    cr_assert(nb_to_host(ref[j], a, sizeof *a * (size_t)n) == NB_OK &&
                  nb_to_host(got[j], b, sizeof *b * (size_t)n) == NB_OK,
              "%s", nb_last_error());
    for (int64_t i = 0; i < n; i++)
      cr_assert(fabs(a[i] - b[i]) <= 1e-9 * fmax(1.0, fabs(a[i])),
                "output %d element %lld: %.17g (plan) vs %.17g (unsharded)\n%s", j, (long long)i,
                b[i], a[i], rep);
    free(a);
    free(b);
  }
  free(rep);
  return p;
}

static void assert_specs(const nb_shard_plan *p, const char *const *want, int n) {
  for (int k = 0; k < n; k++)
    cr_assert_str_eq(nb_shard_plan_in_spec(p, k), want[k], "input %d: %s, expected %s", k,
                     nb_shard_plan_in_spec(p, k), want[k]);
}

static void megatron(const char *axes, int tp) {
  nb_mesh *m = nb_mesh_cpu(axes);
  cr_assert(m, "%s", nb_last_error());
  mlp t;
  mlp_make(&t, 8, 64, 512 * tp); /* small batch, large hidden size */
  nb_shard_plan *p = solve_and_check(&t, m, (nb_auto_shard_opts){0});
  static const char *const want[NIN] = {"[_, tp]", "[tp]",    "[tp, _]", "[_]",    "[_, tp]",
                                        "[tp]",    "[tp, _]", "[_]",     "[_, _]", "[_, _]"};
  assert_specs(p, want, NIN);
  nb_shard_prediction pr = nb_shard_plan_predict(p);
  /* one all-reduce per block forward, one per block backward but the first
   * (no gradient of x), nothing else */
  cr_assert_eq(pr.n_all_reduce, 2 * BLOCKS - 1);
  cr_assert_eq(pr.n_all_gather + pr.n_reduce_scatter + pr.n_all_to_all + pr.n_permute, 0);
  /* each all-reduces an [8, 64] f64 activation over tp: 2 (tp - 1) / tp of it sent by each
   * of the tp devices */
  cr_assert_eq(pr.collective_bytes, (uint64_t)(2 * BLOCKS - 1) * 2 * (tp - 1) * 8 * 64 * 8);
  nb_shard_plan_release(p);
  mlp_free(&t);
  nb_mesh_release(m);
}

Test(auto_shard, megatron_on_tp2) { megatron("tp=2", 2); }
Test(auto_shard, megatron_on_tp4) { megatron("tp=4", 4); }

Test(auto_shard, data_parallel_on_dp4) {
  nb_mesh *m = nb_mesh_cpu("dp=4");
  mlp t;
  mlp_make(&t, 4096, 32, 32); /* large batch, small weights */
  nb_shard_plan *p = solve_and_check(&t, m, (nb_auto_shard_opts){0});
  static const char *const want[NIN] = {"[_, _]", "[_]",    "[_, _]", "[_]",     "[_, _]",
                                        "[_]",    "[_, _]", "[_]",    "[dp, _]", "[dp, _]"};
  assert_specs(p, want, NIN);
  /* the gradients' sums over dp (one per parameter) and the loss's */
  nb_shard_prediction pr = nb_shard_plan_predict(p);
  cr_assert_eq(pr.n_all_reduce, NP + 1);
  nb_shard_plan_release(p);
  mlp_free(&t);
  nb_mesh_release(m);
}

Test(auto_shard, two_d_plan_on_dp2_tp2) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  mlp t;
  mlp_make(&t, 512, 16, 384);
  /* a fast interconnect (alpha 1 us): bytes decide */
  nb_auto_shard_opts o = {0};
  for (int a = 0; a < 2; a++)
    o.alpha_s[a] = 1e-6;
  /* dp and tp cost the same: the plan and its mirror (the axes' roles
   * swapped) tie; pinning the batch to dp picks one, at the same cost */
  nb_shard_plan *free_plan = solve_and_check(&t, m, o);
  const char *pins[NIN] = {0};
  pins[NP] = "[dp, _]";
  o.in_specs = pins;
  nb_shard_plan *p = solve_and_check(&t, m, o);
  static const char *const want[NIN] = {"[_, tp]", "[tp]",    "[tp, _]", "[_]",     "[_, tp]",
                                        "[tp]",    "[tp, _]", "[_]",     "[dp, _]", "[dp, _]"};
  assert_specs(p, want, NIN);
  double a = nb_shard_plan_predict(free_plan).cost_s, b = nb_shard_plan_predict(p).cost_s;
  cr_assert(fabs(a - b) <= 1e-9 * b, "free %.9g, pinned %.9g", a, b);
  nb_shard_plan_release(free_plan);
  nb_shard_plan_release(p);
  mlp_free(&t);
  nb_mesh_release(m);
}

Test(auto_shard, memory_bound_shards_the_weights) {
  nb_mesh *m = nb_mesh_cpu("dp=4");
  mlp t;
  mlp_make(&t, 2, 64, 256); /* too little work to split: all replicated */
  nb_shard_plan *p = solve_and_check(&t, m, (nb_auto_shard_opts){0});
  for (int k = 0; k < NIN; k++)
    cr_assert(!strstr(nb_shard_plan_in_spec(p, k), "dp"), "input %d: %s", k,
              nb_shard_plan_in_spec(p, k));
  double weights = 0;
  for (int k = 0; k < NP; k++)
    weights += (double)tc_numel(t.in[k]->shape) * 8;
  double all = nb_shard_plan_predict(p).bytes_per_device;
  cr_assert(all > weights);
  nb_shard_plan_release(p);
  /* half the weights must go */
  nb_auto_shard_opts o = {.max_bytes_per_device = all - 0.5 * weights};
  p = solve_and_check(&t, m, o);
  nb_shard_prediction pr = nb_shard_plan_predict(p);
  cr_assert(pr.bytes_per_device <= o.max_bytes_per_device, "%.0f > %.0f", pr.bytes_per_device,
            o.max_bytes_per_device);
  int sharded = 0;
  for (int k = 0; k < NP; k += 2)
    sharded += strstr(nb_shard_plan_in_spec(p, k), "dp") != NULL;
  cr_assert(sharded >= 2, "%d weight matrices sharded under the bound", sharded);
  nb_shard_plan_release(p);
  /* nothing fits a bound below the fully sharded parameters */
  o.max_bytes_per_device = weights / 16;
  o.out_like_in = t.tie;
  cr_assert_null(nb_auto_shard_plan(t.step, m, t.in, &o));
  cr_assert_eq(nb_last_status(), NB_ERR_SHARDING);
  nb_clear_error();
  mlp_free(&t);
  nb_mesh_release(m);
}

/* the forward pass alone: a tree (each input read once), where the exact DP
 * runs; the local search reaches the same objective */
static nb_status fwd_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_matmul(nb_tanh(nb_matmul(in[0], in[1])), in[2]);
  return out[0] ? NB_OK : nb_last_status();
}

Test(auto_shard, dp_and_local_search_agree_on_a_tree) {
  static const char *const meshes[] = {"tp=2", "dp=2,tp=2", "x=4"};
  static const int64_t sizes[][3] = {{8, 64, 512}, {512, 16, 16}, {64, 64, 64}};
  nb_fn *f = nb_fn_create(fwd_fn, NULL, 3, 1);
  for (int c = 0; c < 3; c++) {
    nb_mesh *m = nb_mesh_cpu(meshes[c]);
    const int64_t *s = sizes[c];
    nb_tensor *in[3] = {nb_randn(NB_SHAPE(s[0], s[1]), NB_F64),
                        nb_randn(NB_SHAPE(s[1], s[2]), NB_F64),
                        nb_randn(NB_SHAPE(s[2], s[1]), NB_F64)};
    nb_shard_plan *dp =
        nb_auto_shard_plan(f, m, in, &(nb_auto_shard_opts){.solver = NB_AUTO_SHARD_DP});
    nb_shard_plan *ls =
        nb_auto_shard_plan(f, m, in, &(nb_auto_shard_opts){.solver = NB_AUTO_SHARD_LOCAL});
    cr_assert(dp && ls, "%s", nb_last_error());
    nb_shard_prediction a = nb_shard_plan_predict(dp), b = nb_shard_plan_predict(ls);
    cr_assert_eq(a.solver, NB_AUTO_SHARD_DP);
    cr_assert_eq(b.solver, NB_AUTO_SHARD_LOCAL);
    cr_assert(fabs(a.cost_s - b.cost_s) <= 1e-12 + 1e-9 * a.cost_s, "%s: DP %.9g, local %.9g",
              meshes[c], a.cost_s, b.cost_s);
    /* the plan's values are f's */
    nb_tensor *ref, *got;
    cr_assert(nb_call(f, in, &ref) == NB_OK && nb_shard_plan_call(dp, in, &got) == NB_OK, "%s",
              nb_last_error());
    cr_assert(nb_item(nb_max(nb_abs(nb_sub(ref, got)), NB_ALL, false)) < 1e-9);
    nb_shard_plan_release(dp);
    nb_shard_plan_release(ls);
    nb_mesh_release(m);
  }
  nb_fn_release(f);
}

Test(auto_shard, nb_auto_shard_keeps_pins_and_mallocs_the_rest) {
  nb_mesh *m = nb_mesh_cpu("dp=4");
  mlp t;
  mlp_make(&t, 4096, 32, 32);
  char *in_specs[NIN] = {0}, *out_specs[NOUT] = {0};
  char pin[] = "[_, _]";
  in_specs[0] = pin; /* W1 of block 0 replicated */
  cr_assert(nb_auto_shard(t.step, m, t.in, in_specs, out_specs) == NB_OK, "%s", nb_last_error());
  cr_assert(in_specs[0] == pin);
  cr_assert_str_eq(in_specs[NP], "[dp, _]");
  for (int k = 1; k < NIN; k++)
    cr_assert(in_specs[k] && in_specs[k][0] == '[');
  for (int j = 0; j < NOUT; j++)
    cr_assert(out_specs[j] && out_specs[j][0] == '[');
  cr_assert_str_eq(out_specs[0], "[]"); /* the loss: a scalar, summed */
  /* the specs place the inputs */
  for (int k = 0; k < NIN; k++)
    cr_assert(nb_shard(t.in[k], m, in_specs[k]), "%s: %s", in_specs[k], nb_last_error());
  for (int k = 1; k < NIN; k++)
    free(in_specs[k]);
  for (int j = 0; j < NOUT; j++)
    free(out_specs[j]);
  mlp_free(&t);
  nb_mesh_release(m);
}

Test(auto_shard, errors) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  mlp t;
  mlp_make(&t, 16, 8, 8);
  char *in_specs[NIN] = {0}, *out_specs[NOUT] = {0};
  cr_assert_eq(nb_auto_shard(NULL, m, t.in, in_specs, out_specs), NB_ERR_NULL);
  cr_assert_eq(nb_auto_shard(t.step, NULL, t.in, in_specs, out_specs), NB_ERR_NULL);
  cr_assert_eq(nb_auto_shard(t.step, m, NULL, in_specs, out_specs), NB_ERR_NULL);
  nb_clear_error();
  char bad[] = "[(tp, dp), _]"; /* not mesh order */
  in_specs[0] = bad;
  cr_assert_eq(nb_auto_shard(t.step, m, t.in, in_specs, out_specs), NB_ERR_SHARDING, "%s",
               nb_last_error());
  cr_assert(strstr(nb_last_error(), "pinned spec"), "%s", nb_last_error());
  nb_clear_error();
  char unknown[] = "[zz, _]";
  in_specs[0] = unknown;
  cr_assert_eq(nb_auto_shard(t.step, m, t.in, in_specs, out_specs), NB_ERR_SHARDING);
  cr_assert(in_specs[1] == NULL && out_specs[0] == NULL); /* nothing written on failure */
  nb_clear_error();
  /* the exact DP on a graph with cycles */
  cr_assert_null(
      nb_auto_shard_plan(t.step, m, t.in, &(nb_auto_shard_opts){.solver = NB_AUTO_SHARD_DP}));
  cr_assert_eq(nb_last_status(), NB_ERR_ARG);
  nb_clear_error();
  cr_assert_null(nb_auto_shard_plan(t.step, m, t.in, &(nb_auto_shard_opts){.solver = 7}));
  nb_clear_error();
  int tie[NOUT] = {-1, 99};
  cr_assert_null(nb_auto_shard_plan(t.step, m, t.in, &(nb_auto_shard_opts){.out_like_in = tie}));
  cr_assert_eq(nb_last_status(), NB_ERR_ARG);
  nb_tensor *outs[NOUT];
  cr_assert_eq(nb_shard_plan_call(NULL, t.in, outs), NB_ERR_NULL);
  cr_assert_eq(nb_auto_shard_report(stdout, NULL, NULL), NB_ERR_NULL);
  nb_clear_error();
  mlp_free(&t);
  nb_mesh_release(m);
}

/* a + b, and (a @ b) + c: pinned layouts force every kind of reshard; the
 * measured collectives and bytes are the predicted ones */
static nb_status add_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_add(in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status mm_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_tanh(nb_add(nb_matmul(in[0], in[1]), in[2]));
  return out[0] ? NB_OK : nb_last_status();
}

Test(auto_shard, every_reshard_kind_measured_as_predicted) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  nb_fn *add = nb_fn_create(add_fn, NULL, 2, 1), *mm = nb_fn_create(mm_fn, NULL, 3, 1);
  static const char *const pins[][3] = {
      {"[x, _]", "[_, x]", NULL},
      {"[x, _]", "[y, _]", NULL},
      {"[(x, y), _]", "[_, _]", NULL},
      {"[_, x]", "[x, _]", "[_, _]"},
      {"[_, (x, y)]", "[(x, y), _]", "[x, y]"},
      {"[y, x]", "[x, _]", "[y, _]"},
  };
  uint64_t seen[5] = {0};
  for (int c = 0; c < 6; c++) {
    bool is_mm = pins[c][2] != NULL;
    nb_tensor *in[3] = {nb_randn(NB_SHAPE(8, 8), NB_F64), nb_randn(NB_SHAPE(8, 8), NB_F64),
                        nb_randn(NB_SHAPE(8, 8), NB_F64)};
    nb_auto_shard_opts o = {.in_specs = pins[c], .solver = NB_AUTO_SHARD_LOCAL};
    o.alpha_s[0] = o.alpha_s[1] = 1e-12; /* free collectives: the compute splits */
    nb_shard_plan *p = nb_auto_shard_plan(is_mm ? mm : add, m, in, &o);
    cr_assert(p, "%s", nb_last_error());
    nb_tensor *ref, *got;
    cr_assert(nb_call(is_mm ? mm : add, in, &ref) == NB_OK, "%s", nb_last_error());
    nb_reset_stats();
    cr_assert(nb_shard_plan_call(p, in, &got) == NB_OK, "%s", nb_last_error());
    nb_stats s = nb_get_stats();
    nb_shard_prediction pr = nb_shard_plan_predict(p);
    uint64_t mk[5] = {s.n_all_reduce, s.n_all_gather, s.n_reduce_scatter, s.n_all_to_all,
                      s.n_permute};
    uint64_t pk[5] = {pr.n_all_reduce, pr.n_all_gather, pr.n_reduce_scatter, pr.n_all_to_all,
                      pr.n_permute};
    for (int k = 0; k < 5; k++) {
      cr_assert_eq(mk[k], pk[k], "case %d kind %d: measured %llu, predicted %llu", c, k,
                   (unsigned long long)mk[k], (unsigned long long)pk[k]);
      seen[k] += mk[k];
    }
    cr_assert_eq(s.collective_bytes, pr.collective_bytes, "case %d", c);
    cr_assert(nb_item(nb_max(nb_abs(nb_sub(ref, got)), NB_ALL, false)) < 1e-12);
    nb_shard_plan_release(p);
  }
  /* all-reduces: the MLP tests */
  cr_assert(seen[1] && seen[2] && seen[3] && seen[4],
            "all-gather %llu reduce-scatter %llu all-to-all %llu permute %llu",
            (unsigned long long)seen[1], (unsigned long long)seen[2], (unsigned long long)seen[3],
            (unsigned long long)seen[4]);
  nb_fn_release(add);
  nb_fn_release(mm);
  nb_mesh_release(m);
}

/* ---- the transformer block (src/nn): Megatron attention ---------------------------------
 * A training step of nb_block_apply (pre-LayerNorm, causal self-attention of
 * 4 heads, GELU MLP) on tp=2, a short sequence and a wide model: the solver
 * splits the heads over tp (w_q, w_k, w_v column-parallel: the [T, H*D] ->
 * [T, H, D] reshape sharded on H, its major factor), w_o and the MLP's
 * second matmul row-parallel, its first column-parallel: one all-reduce
 * after attention and one after the MLP in the forward pass. */
enum { TF_MAXP = 32 };
typedef struct tfm {
  nb_block_config c;
  int np;
  const char *names[TF_MAXP];
  nb_fn *loss, *vg, *step;
} tfm;

static nb_status tf_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const tfm *t = u;
  nb_tree *p = nb_tree_create();
  for (int i = 0; i < t->np; i++)
    nb_tree_set(p, t->names[i], in[i]);
  out[0] = nb_mse(nb_block_apply(p, &t->c, in[t->np], NULL), in[t->np + 1]);
  nb_tree_release(p);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status tf_step(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const tfm *t = u;
  nb_tensor *o[1 + TF_MAXP];
  nb_status st = nb_call(t->vg, in, o);
  if (st) return st;
  out[0] = o[0];
  for (int i = 0; i < t->np; i++)
    if (!(out[1 + i] = nb_sub(in[i], nb_mul_scalar(o[1 + i], 0.1)))) return nb_last_status();
  return NB_OK;
}

/* The spec planned for the parameter named name. */
static const char *tf_spec(const nb_shard_plan *p, const tfm *t, const char *name) {
  for (int i = 0; i < t->np; i++)
    if (!strcmp(t->names[i], name)) return nb_shard_plan_in_spec(p, i);
  return "(missing)";
}

Test(auto_shard, transformer_block_gets_megatron_attention_on_tp2) {
  tfm t = {.c = {.dim = 256, .n_heads = 4, .hidden = 1024, .bias = true}};
  nb_tree *params = nb_block_init(nb_key(3), &t.c, NB_F64);
  cr_assert(params, "%s", nb_last_error());
  t.np = nb_tree_len(params);
  cr_assert(t.np <= TF_MAXP);
  nb_tensor *in[TF_MAXP + 2];
  int argnums[TF_MAXP], tie[TF_MAXP + 1];
  tie[0] = -1;
  for (int i = 0; i < t.np; i++) {
    t.names[i] = nb_tree_name(params, i);
    in[i] = nb_tree_at(params, i);
    argnums[i] = i, tie[1 + i] = i;
  }
  in[t.np] = nb_randn(NB_SHAPE(1, 16, 256), NB_F64);
  in[t.np + 1] = nb_randn(NB_SHAPE(1, 16, 256), NB_F64);
  cr_assert(nb_eval(in + t.np, 2) == NB_OK, "%s", nb_last_error());
  t.loss = nb_fn_create(tf_loss, &t, t.np + 2, 1);
  t.vg = nb_value_and_grad_argnums(t.loss, argnums, t.np);
  t.step = nb_fn_create(tf_step, &t, t.np + 2, t.np + 1);
  nb_mesh *m = nb_mesh_cpu("tp=2");
  nb_shard_plan *p = nb_auto_shard_plan(t.step, m, in, &(nb_auto_shard_opts){.out_like_in = tie});
  cr_assert(p, "%s", nb_last_error());
  char *rep = NULL;
  size_t rep_n = 0;
  FILE *f = open_memstream(&rep, &rep_n);
  nb_tensor *ref[TF_MAXP + 1], *got[TF_MAXP + 1];
  cr_assert(nb_call(t.step, in, ref) == NB_OK, "%s", nb_last_error());
  nb_reset_stats();
  cr_assert(nb_shard_plan_call(p, in, got) == NB_OK, "%s", nb_last_error());
  nb_stats s = nb_get_stats();
  nb_auto_shard_report(f, p, &s);
  fclose(f);
  if (getenv("AS_REPORT")) fputs(rep, stderr);
  static const char *const want[][2] = {
      {"attn.w_q", "[_, tp]"}, {"attn.w_k", "[_, tp]"}, {"attn.w_v", "[_, tp]"},
      {"attn.b_q", "[tp]"},    {"attn.b_k", "[tp]"},    {"attn.b_v", "[tp]"},
      {"attn.w_o", "[tp, _]"}, {"attn.b_o", "[_]"},     {"mlp.0.w", "[_, tp]"},
      {"mlp.0.b", "[tp]"},     {"mlp.1.w", "[tp, _]"},  {"mlp.1.b", "[_]"},
      {"ln_2.w", "[_]"},       {"ln_2.b", "[_]"}};
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
    cr_assert_str_eq(tf_spec(p, &t, want[k][0]), want[k][1], "%s: %s\n%s", want[k][0],
                     tf_spec(p, &t, want[k][0]), rep);
  nb_shard_prediction pr = nb_shard_plan_predict(p);
  cr_assert(s.n_all_reduce == pr.n_all_reduce && s.n_all_gather == pr.n_all_gather &&
                s.collective_bytes == pr.collective_bytes && s.n_all_to_all == 0,
            "%s", rep);
  /* Megatron's four [1, 16, 256] f64 all-reduces (2 (tp - 1) = 2 times 32 KiB
   * sent each): forward after attention and after the MLP; backward the
   * input gradient of the MLP and that of attention, the sum of q's, k's and
   * v's partial gradients kept partial through the adds and reduced once */
  cr_assert_eq(pr.n_all_reduce, 4, "%s", rep);
  cr_assert_eq(pr.collective_bytes, 4 * 2 * 16 * 256 * 8, "%s", rep);
  cr_assert(strstr(rep, "note:") == NULL, "%s", rep);
  /* the loss and the updated parameters are the unsharded step's */
  for (int j = 0; j < t.np + 1; j++) {
    double d = nb_item(nb_max(nb_abs(nb_sub(ref[j], got[j])), NB_ALL, false));
    double r = nb_item(nb_max(nb_abs(ref[j]), NB_ALL, false));
    cr_assert(d <= 1e-9 * fmax(1.0, r), "output %d differs by %g", j, d);
  }
  free(rep);
  nb_shard_plan_release(p);
  nb_mesh_release(m);
  nb_fn_release(t.step);
  nb_fn_release(t.vg);
  nb_fn_release(t.loss);
  nb_tree_release(params);
}

/* The ILP backend (COIN-OR CBC through dlopen): where CBC is installed it
 * reaches the exact DP's objective on trees and, on the MLP training step on
 * tp=2 (a graph with cycles), the built-in local search reaches CBC's; where
 * it is not, asking for it is a clear NB_ERR_STATE. */
Test(auto_shard, ilp_backend_agrees_with_the_builtin_solvers) {
  nb_fn *f = nb_fn_create(fwd_fn, NULL, 3, 1);
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  nb_tensor *in[3] = {nb_randn(NB_SHAPE(64, 32), NB_F64), nb_randn(NB_SHAPE(32, 128), NB_F64),
                      nb_randn(NB_SHAPE(128, 32), NB_F64)};
  nb_auto_shard_opts o = {.solver = NB_AUTO_SHARD_ILP, .ilp_max_seconds = 30};
  if (!nb_auto_shard_ilp_available()) {
    cr_assert_null(nb_auto_shard_plan(f, m, in, &o));
    cr_assert_eq(nb_last_status(), NB_ERR_STATE);
    cr_assert(strstr(nb_last_error(), "CBC"), "%s", nb_last_error());
    nb_clear_error();
  } else {
    nb_shard_plan *ilp = nb_auto_shard_plan(f, m, in, &o);
    nb_shard_plan *dp =
        nb_auto_shard_plan(f, m, in, &(nb_auto_shard_opts){.solver = NB_AUTO_SHARD_DP});
    cr_assert(ilp && dp, "%s", nb_last_error());
    nb_shard_prediction a = nb_shard_plan_predict(ilp), b = nb_shard_plan_predict(dp);
    cr_assert_eq(a.solver, NB_AUTO_SHARD_ILP);
    cr_assert(fabs(a.cost_s - b.cost_s) <= 1e-9 * b.cost_s, "ILP %.12g, DP %.12g", a.cost_s,
              b.cost_s);
    nb_shard_plan_release(ilp);
    nb_shard_plan_release(dp);
    mlp t;
    nb_mesh *tp = nb_mesh_cpu("tp=2");
    mlp_make(&t, 8, 64, 1024);
    o.out_like_in = t.tie;
    nb_shard_plan *pi = nb_auto_shard_plan(t.step, tp, t.in, &o);
    nb_shard_plan *pl =
        nb_auto_shard_plan(t.step, tp, t.in, &(nb_auto_shard_opts){.out_like_in = t.tie});
    cr_assert(pi && pl, "%s", nb_last_error());
    a = nb_shard_plan_predict(pi), b = nb_shard_plan_predict(pl);
    cr_assert(fabs(a.cost_s - b.cost_s) <= 1e-9 * b.cost_s, "ILP %.12g, local %.12g", a.cost_s,
              b.cost_s);
    nb_shard_plan_release(pi);
    nb_shard_plan_release(pl);
    mlp_free(&t);
    nb_mesh_release(tp);
  }
  nb_mesh_release(m);
  nb_fn_release(f);
}

/* ---- functions of trees: nb_auto_shard_plan_trees ---------------------------------------
 * The MLP step as a function of two trees (the parameters, by name; the data
 * x, y) returning two (the loss; the updated parameters): its plan is the
 * flat step's, leaf by leaf. */
static const char *const LEAF[NP] = {"w1_0", "b1_0", "w2_0", "b2_0",
                                     "w1_1", "b1_1", "w2_1", "b2_1"};

static nb_status tree_step(void *u, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  mlp *t = u;
  nb_tensor *x[NIN], *y[NOUT];
  for (int i = 0; i < NP; i++)
    x[i] = nb_tree_get(in[0], LEAF[i]);
  x[NP] = nb_tree_get(in[1], "x");
  x[NP + 1] = nb_tree_get(in[1], "y");
  nb_status st = nb_call(t->step, x, y);
  if (st) return st;
  out[0] = nb_tree_create();
  out[1] = nb_tree_create();
  nb_tree_set(out[0], "loss", y[0]);
  for (int i = 0; i < NP; i++)
    nb_tree_set(out[1], LEAF[i], y[1 + i]);
  return nb_last_status();
}

Test(auto_shard, tree_function_plans_like_its_flat_form) {
  nb_mesh *m = nb_mesh_cpu("tp=2");
  mlp t;
  mlp_make(&t, 8, 64, 1024);
  nb_fn *f = nb_fn_create_trees(tree_step, &t, 2, 2);
  nb_tree *in[2] = {nb_tree_create(), nb_tree_create()};
  for (int i = 0; i < NP; i++)
    nb_tree_set(in[0], LEAF[i], t.in[i]);
  nb_tree_set(in[1], "x", t.in[NP]);
  nb_tree_set(in[1], "y", t.in[NP + 1]);
  nb_auto_shard_opts o = {.out_like_in = t.tie}; /* leaves: the loss, then the parameters */
  nb_shard_plan *pt = nb_auto_shard_plan_trees(f, m, in, &o);
  nb_shard_plan *pf = nb_auto_shard_plan(t.step, m, t.in, &o);
  cr_assert(pt && pf, "%s", nb_last_error());
  for (int k = 0; k < NIN; k++)
    cr_assert_str_eq(nb_shard_plan_in_spec(pt, k), nb_shard_plan_in_spec(pf, k), "input %d", k);
  for (int j = 0; j < NOUT; j++)
    cr_assert_str_eq(nb_shard_plan_out_spec(pt, j), nb_shard_plan_out_spec(pf, j), "output %d", j);
  for (int i = 0; i < NP; i++) {
    cr_assert_str_eq(nb_shard_plan_in_leaf_spec(pt, 0, LEAF[i]), nb_shard_plan_in_spec(pf, i));
    cr_assert_str_eq(nb_shard_plan_out_leaf_spec(pt, 1, LEAF[i]),
                     nb_shard_plan_out_spec(pf, 1 + i));
  }
  cr_assert_str_eq(nb_shard_plan_in_leaf_spec(pt, 0, "w1_0"), "[_, tp]"); /* Megatron */
  cr_assert_str_eq(nb_shard_plan_in_leaf_spec(pt, 0, "w2_1"), "[tp, _]");
  cr_assert_str_eq(nb_shard_plan_in_leaf_spec(pt, 1, "y"), nb_shard_plan_in_spec(pf, NP + 1));
  cr_assert_str_eq(nb_shard_plan_out_leaf_spec(pt, 0, "loss"), nb_shard_plan_out_spec(pf, 0));
  cr_assert_null(nb_shard_plan_in_leaf_spec(pt, 0, "x")); /* x is in tree 1 */
  cr_assert_null(nb_shard_plan_in_leaf_spec(pt, 2, "x"));
  cr_assert_null(nb_shard_plan_out_leaf_spec(pf, 0, "loss")); /* not a plan of trees */
  /* run it: the loss and updated parameters of the unsharded step, in their specs */
  nb_tensor *ref[NOUT];
  cr_assert(nb_call(t.step, t.in, ref) == NB_OK, "%s", nb_last_error());
  nb_tree *out[2];
  cr_assert(nb_shard_plan_call_trees(pt, in, out) == NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_tree_len(out[0]), 1);
  cr_assert_eq(nb_tree_len(out[1]), NP);
  double a = nb_item(ref[0]), b = nb_item(nb_tree_get(out[0], "loss"));
  cr_assert(fabs(a - b) <= 1e-9 * fmax(1.0, fabs(a)), "loss %.17g (plan) vs %.17g", b, a);
  for (int i = 0; i < NP; i++) {
    nb_tensor *g = nb_tree_get(out[1], LEAF[i]);
    cr_assert_str_eq(nb_sharding_str(g), nb_shard_plan_out_spec(pf, 1 + i));
    double d = nb_item(nb_max(nb_abs(nb_sub(g, ref[1 + i])), NB_ALL, false));
    cr_assert(d <= 1e-9, "%s differs by %g", LEAF[i], d);
  }
  nb_tree_release(out[0]);
  nb_tree_release(out[1]);
  /* errors */
  cr_assert_null(nb_auto_shard_plan(f, m, t.in, &o));
  cr_assert_eq(nb_last_status(), NB_ERR_ARG);
  cr_assert(strstr(nb_last_error(), "nb_auto_shard_plan_trees"), "%s", nb_last_error());
  nb_clear_error();
  cr_assert_null(nb_auto_shard_plan_trees(t.step, m, in, &o));
  cr_assert_eq(nb_last_status(), NB_ERR_ARG);
  nb_clear_error();
  cr_assert_null(nb_auto_shard_plan_trees(f, m, NULL, &o));
  cr_assert_eq(nb_last_status(), NB_ERR_NULL);
  nb_clear_error();
  cr_assert_eq(nb_shard_plan_call_trees(pf, in, out), NB_ERR_ARG);
  nb_tree *swapped[2] = {in[1], in[0]};
  cr_assert_eq(nb_shard_plan_call_trees(pt, swapped, out), NB_ERR_ARG);
  cr_assert(out[0] == NULL && out[1] == NULL);
  cr_assert_eq(nb_shard_plan_call_trees(pt, NULL, out), NB_ERR_NULL);
  nb_clear_error();
  nb_shard_plan_release(pt);
  nb_shard_plan_release(pf);
  nb_tree_release(in[0]);
  nb_tree_release(in[1]);
  nb_fn_release(f);
  mlp_free(&t);
  nb_mesh_release(m);
}
