/* test/test_optim.c — optimizers beyond the golden trajectories
 * (test_optim_golden.c): one fused pass per group (kernels counted, the
 * update's graph inspected), parameters packed into one buffer, the state's
 * names and groups, integer and sharded parameters, schedules against their
 * closed forms, and the errors. */
#include "common.h"

#include "../src/transforms/tree.h"

TestSuite(optim, .init = tc_setup, .fini = tc_teardown);

static nb_tensor *rand_t(nb_shape s, nb_dtype dt, uint64_t seed) {
  double *x = tc_rand_floats(tc_numel(s), dt, &seed);
  nb_tensor *t = tc_tensor(x, s, dt);
  free(x);
  return t;
}

/* n tensors "p<i>" of mixed shapes (matrices and vectors), and gradients */
static void make_trees(int n, nb_dtype dt, nb_tree **p, nb_tree **g) {
  *p = nb_tree_create(), *g = nb_tree_create();
  char name[32];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "p%d", i);
    nb_shape s = i % 2 ? NB_SHAPE(16 + i) : NB_SHAPE(8, 4 + i);
    nb_tree_set(*p, name, rand_t(s, dt, 10 + (uint64_t)i));
    nb_tree_set(*g, name, rand_t(s, dt, 100 + (uint64_t)i));
  }
}

static nb_optim *clip_adamw(void) {
  nb_optim *parts[2] = {nb_clip_by_global_norm(1.0), nb_adamw(1e-3, 0.9, 0.95, 1e-8, 0.1)};
  nb_optim *o = nb_optim_chain(parts, 2);
  nb_optim_release(parts[0]);
  nb_optim_release(parts[1]);
  nb_schedule *s = nb_schedule_warmup_cosine(0, 1e-3, 10, 100, 1e-4);
  cr_assert(nb_optim_set_schedule(o, s) == NB_OK);
  nb_schedule_release(s);
  return o;
}

/* Kernels of one step (after the first, when the parameters are packed). */
static uint64_t step_kernels(int n) {
  nb_tree *p, *g;
  make_trees(n, NB_F32, &p, &g);
  nb_optim *o = clip_adamw();
  nb_tree *st = nb_optim_init(o, p);
  uint64_t k = 0;
  for (int step = 0; step < 3; step++) {
    nb_scope_begin();
    nb_reset_stats();
    cr_assert(nb_optim_step(o, p, g, st) == NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_get_stats().realizations, 1, "one realization per step");
    k = nb_get_stats().kernels_run;
    nb_scope_end();
  }
  nb_tree_release(st);
  nb_optim_release(o);
  nb_tree_release(g);
  nb_tree_release(p);
  return k;
}

Test(optim, a_step_is_a_few_kernels_whatever_the_number_of_tensors) {
  if (nb_default_device().kind != NB_DEVICE_CPU) return; /* the CPU's fusion */
  uint64_t k4 = step_kernels(4), k24 = step_kernels(24), k60 = step_kernels(60);
  /* clipping + AdamW + warmup-cosine schedule: concatenated gradients, their
   * norm, one fused pass computing the moments, the update and the new
   * parameters (a row group takes the norm with it when the vector is small) */
  cr_assert(k4 <= 5 && k24 <= 5 && k60 <= 5, "kernels per step: %llu, %llu, %llu",
            (unsigned long long)k4, (unsigned long long)k24, (unsigned long long)k60);
  cr_assert_eq(k24, k60, "the count does not grow with the number of tensors");
}

static int fused_ops_max(const char *dot) {
  int best = 0;
  for (const char *s = strstr(dot, "fused kernel"); s; s = strstr(s + 1, "fused kernel")) {
    int id, ops;
    if (sscanf(s, "fused kernel %d (%d ops)", &id, &ops) == 2 && ops > best) best = ops;
  }
  return best;
}

Test(optim, the_update_of_all_tensors_is_one_fused_kernel_in_the_graph) {
  if (nb_default_device().kind != NB_DEVICE_CPU) return;
  nb_tree *p, *g, *u;
  make_trees(12, NB_F32, &p, &g);
  nb_optim *o = nb_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
  nb_tree *st = nb_optim_init(o, p);
  cr_assert(nb_optim_update(o, g, st, p, &u) == NB_OK, "%s", nb_last_error());
  /* the state and the update, as nb_apply_updates realizes them */
  nb_tensor *roots[4] = {nb_tree_get(st, "mu.0"), nb_tree_get(st, "nu.0"), u->packs[0].flat};
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert(nb_graph_dot(f, roots, 3) == NB_OK);
  fclose(f);
  /* Adam's moments, denominator and decayed update: 12+ elementwise ops */
  cr_assert(fused_ops_max(buf) >= 12, "largest fused kernel: %d ops\n%s", fused_ops_max(buf), buf);
  cr_assert_eq(u->n_packs, 1, "one group");
  free(buf);
  nb_tree_release(u);
  nb_tree_release(st);
  nb_optim_release(o);
  nb_tree_release(g);
  nb_tree_release(p);
}

Test(optim, apply_packs_the_parameters_into_one_buffer) {
  nb_tree *p, *g;
  make_trees(5, NB_F32, &p, &g);
  nb_optim *o = nb_sgd(0.1, 0.9, false);
  nb_tree *st = nb_optim_init(o, p);
  cr_assert(nb_optim_step(o, p, g, st) == NB_OK, "%s", nb_last_error());
  int idx[5] = {0, 1, 2, 3, 4};
  cr_assert(nbi_tree_pack_find(p, idx, 5), "the parameters are one pack");
  for (int i = 1; i < 5; i++)
    cr_assert_eq(nb_tree_at(p, i)->shard0.buf, nb_tree_at(p, 0)->shard0.buf, "one buffer");
  /* assigning one parameter breaks the pack; the next step concatenates */
  cr_assert(nb_assign(nb_tree_at(p, 2), nb_zeros(nb_shape_of(nb_tree_at(p, 2)), NB_F32)) == NB_OK);
  cr_assert_null(nbi_tree_pack_find(p, idx, 5));
  cr_assert(nb_optim_step(o, p, g, st) == NB_OK, "%s", nb_last_error());
  cr_assert(nbi_tree_pack_find(p, idx, 5));
  nb_tree_release(st);
  nb_optim_release(o);
  nb_tree_release(g);
  nb_tree_release(p);
}

/* ---- state, groups, integer and sharded parameters ---------------------------------------- */
Test(optim, state_names_groups_by_dtype_and_mask) {
  nb_tree *p = nb_tree_create();
  nb_tree_set(p, "w", rand_t(NB_SHAPE(3, 2), NB_F32, 1));
  nb_tree_set(p, "b", rand_t(NB_SHAPE(2), NB_F32, 2));
  nb_tree_set(p, "w64", rand_t(NB_SHAPE(2, 2), NB_F64, 3));
  nb_tree_set(p, "step", nb_scalar(7, NB_I64));
  nb_optim *parts[2] = {nb_clip_by_global_norm(1), nb_adamw(0.1, 0.9, 0.99, 1e-8, 0.1)};
  nb_optim *o = nb_optim_chain(parts, 2);
  nb_optim_release(parts[0]);
  nb_optim_release(parts[1]);
  cr_assert(nb_optim_set_decay_mask(o, nb_decay_matrices, NULL) == NB_OK);
  nb_tree *st = nb_optim_init(o, p);
  cr_assert(st, "%s", nb_last_error());
  /* groups: f32 decayed (w), f32 not decayed (b), f64 decayed (w64) */
  const char *names[] = {"1.count", "1.mu.0", "1.mu.1", "1.mu.2", "1.nu.0", "1.nu.1", "1.nu.2"};
  cr_assert_eq(nb_tree_len(st), 7);
  for (int i = 0; i < 7; i++)
    cr_assert_str_eq(nb_tree_name(st, i), names[i]);
  cr_assert_eq(nb_numel(nb_tree_get(st, "1.mu.0")), 6);
  cr_assert_eq(nb_dtype_of(nb_tree_get(st, "1.nu.2")), NB_F64);
  nb_tree *g = nb_tree_zeros_like(p);
  nb_tree_set(g, "w", rand_t(NB_SHAPE(3, 2), NB_F32, 4));
  nb_tree_set(g, "w64", rand_t(NB_SHAPE(2, 2), NB_F64, 5));
  double *w64 = tc_read(nb_tree_get(p, "w64")), *b = tc_read(nb_tree_get(p, "b"));
  cr_assert(nb_optim_step(o, p, g, st) == NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_item(nb_tree_get(st, "1.count")), 1);
  cr_assert_eq(nb_item(nb_tree_get(p, "step")), 7, "integer parameters are left alone");
  /* b: zero gradient and no decay: unchanged; w64 moved */
  tc_assert_close_tol(nb_tree_get(p, "b"), b, NB_SHAPE(2), 0);
  double *w64b = tc_read(nb_tree_get(p, "w64"));
  cr_assert(fabs(w64b[0] - w64[0]) > 1e-3);
  free(w64b), free(w64), free(b);
  nb_tree_release(g);
  nb_tree_release(st);
  nb_optim_release(o);
  nb_tree_release(p);
}

Test(optim, a_sharded_parameter_gets_the_unsharded_update) {
  nb_mesh *m = nb_mesh_cpu("dp=2");
  nb_tensor *w = rand_t(NB_SHAPE(4, 3), NB_F32, 7), *gw = rand_t(NB_SHAPE(4, 3), NB_F32, 8);
  nb_tensor *b = rand_t(NB_SHAPE(3), NB_F32, 9), *gb = rand_t(NB_SHAPE(3), NB_F32, 10);
  /* p: w sharded over dp (with its gradient); q: the same values unsharded */
  nb_tree *p = nb_tree_create(), *q = nb_tree_create(), *gp = nb_tree_create(),
          *gq = nb_tree_create();
  nb_tree_set(p, "w", nb_shard(w, m, "dp, _"));
  nb_tree_set(p, "b", b);
  nb_tree_set(gp, "w", nb_shard(gw, m, "dp, _"));
  nb_tree_set(gp, "b", gb);
  nb_tree_set(q, "w", nb_mul_scalar(w, 1));
  nb_tree_set(q, "b", nb_mul_scalar(b, 1));
  nb_tree_set(gq, "w", gw);
  nb_tree_set(gq, "b", gb);
  nb_tree_eval(&q, 1);
  nb_optim *o = nb_adam(0.1, 0.9, 0.999, 1e-8);
  nb_tree *sp = nb_optim_init(o, p), *sq = nb_optim_init(o, q);
  for (int step = 0; step < 3; step++) {
    cr_assert(nb_optim_step(o, p, gp, sp) == NB_OK, "%s", nb_last_error());
    cr_assert(nb_optim_step(o, q, gq, sq) == NB_OK, "%s", nb_last_error());
  }
  cr_assert_str_eq(nb_sharding_str(nb_tree_get(p, "w")), "[dp, _]", "the layout is kept");
  double *want = tc_read(nb_tree_get(q, "w"));
  tc_assert_close(nb_tree_get(p, "w"), want, NB_SHAPE(4, 3));
  free(want);
  nb_tree_release(sq);
  nb_tree_release(sp);
  nb_optim_release(o);
  nb_tree_release(gq);
  nb_tree_release(gp);
  nb_tree_release(q);
  nb_tree_release(p);
  nb_mesh_release(m);
}

/* ---- schedules ---------------------------------------------------------------------------- */
Test(optim, schedules_match_their_closed_forms_on_host_and_in_graph) {
  nb_schedule *s[4] = {nb_schedule_constant(0.5), nb_schedule_linear(0, 1e-3, 10),
                       nb_schedule_cosine(1e-2, 50, 0.1),
                       nb_schedule_warmup_cosine(1e-5, 1e-3, 10, 110, 1e-4)};
  for (int64_t t = 0; t <= 120; t += 7) {
    double lin = 1e-3 * (double)(t < 10 ? t : 10) / 10;
    double ct = (double)(t < 50 ? t : 50);
    double cosv = 1e-2 * (0.9 * 0.5 * (1 + cos(M_PI * ct / 50)) + 0.1);
    double wc =
        t < 10 ? 1e-5 + (1e-3 - 1e-5) * (double)t / 10
               : 1e-3 * (0.9 * 0.5 * (1 + cos(M_PI * (double)(t - 10 < 100 ? t - 10 : 100) / 100)) +
                         0.1);
    double want[4] = {0.5, lin, cosv, wc};
    nb_tensor *step = nb_scalar((double)t, NB_I64);
    for (int k = 0; k < 4; k++) {
      double h = nb_schedule_value(s[k], t), gph = nb_item(nb_schedule_at(s[k], step));
      cr_assert(fabs(h - want[k]) <= 1e-15 * (1 + fabs(want[k])),
                "schedule %d at %lld: %.17g vs "
                "%.17g",
                k, (long long)t, h, want[k]);
      cr_assert(fabs(gph - h) <= 1e-15 * (1 + fabs(h)),
                "schedule %d at %lld in the graph: %.17g "
                "vs %.17g",
                k, (long long)t, gph, h);
    }
  }
  for (int k = 0; k < 4; k++)
    nb_schedule_release(s[k]);
}

/* ---- errors --------------------------------------------------------------------------------- */
Test(optim, errors_name_the_function_and_the_value) {
  cr_assert_null(nb_adam(-1, 0.9, 0.999, 1e-8));
  tc_assert_error(NB_ERR_ARG, "nb_adam: lr is -1");
  cr_assert_null(nb_adamw(1e-3, 1.0, 0.999, 1e-8, 0));
  tc_assert_error(NB_ERR_ARG, "nb_adamw: b1 is 1");
  cr_assert_null(nb_sgd(0.1, 0, true));
  tc_assert_error(NB_ERR_ARG, "nb_sgd: nesterov needs momentum > 0");
  cr_assert_null(nb_clip_by_global_norm(0));
  tc_assert_error(NB_ERR_ARG, "nb_clip_by_global_norm");
  cr_assert_null(nb_optim_chain(NULL, 0));
  tc_assert_error(NB_ERR_ARG, "nb_optim_chain: n is 0");
  cr_assert_null(nb_schedule_warmup_cosine(0, 1, 10, 10, 0));
  tc_assert_error(NB_ERR_ARG, "nb_schedule_warmup_cosine");
  nb_optim *clip = nb_clip_by_global_norm(1);
  nb_schedule *s = nb_schedule_constant(1);
  cr_assert_eq(nb_optim_set_schedule(clip, s), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "nb_optim_set_schedule: the optimizer has no learning rate");
  cr_assert_eq(nb_optim_set_decay_mask(clip, nb_decay_matrices, NULL), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "no weight decay");
  nb_tree *p, *g, *u = NULL;
  make_trees(3, NB_F32, &p, &g);
  nb_optim *sgd = nb_sgd(0.1, 0.9, false), *adam = nb_adam(0.1, 0.9, 0.99, 1e-8);
  nb_tree *st = nb_optim_init(sgd, p);
  cr_assert_eq(nb_optim_update(adam, g, st, p, &u), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "nb_optim_update: the state has no entry \"nu.0\"");
  cr_assert_null(u);
  nb_tree *g2 = nb_tree_copy(g);
  nb_tree_set(g2, "p1", nb_zeros(NB_SHAPE(2), NB_F32));
  cr_assert_eq(nb_optim_update(sgd, g2, st, p, &u), NB_ERR_SHAPE);
  tc_assert_error(NB_ERR_SHAPE, "the gradient of \"p1\" is f32 [2], the parameter f32 [17]");
  nb_tree_remove(g2, "p1");
  cr_assert_eq(nb_optim_step(sgd, p, g2, st), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "nb_optim_step: the trees");
  cr_assert_eq(nb_item(nb_tree_get(st, "count")), 0, "a failed update leaves the state");
  nb_tree *tied = nb_tree_copy(p);
  nb_tree_set(tied, "p2", nb_tree_get(p, "p0")); /* shapes differ: two names, one tensor */
  nb_tree *tg = nb_tree_zeros_like(tied), *tu = NULL, *ts = nb_optim_init(sgd, tied);
  cr_assert(nb_optim_update(sgd, tg, ts, tied, &tu) == NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_apply_updates(tied, tu), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "nb_apply_updates: \"p0\" and \"p2\" are the same tensor");
  nb_tree_release(tu), nb_tree_release(ts), nb_tree_release(tg), nb_tree_release(tied);
  nb_optim *w = nb_adamw(0.1, 0.9, 0.99, 1e-8, 0.1);
  nb_tree *sw = nb_optim_init(w, p);
  cr_assert_eq(nb_optim_update(w, g, sw, NULL, &u), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "params is NULL, but weight decay reads them");
  nb_tree_release(sw);
  nb_optim_release(w);
  nb_tree_release(g2);
  nb_tree_release(st);
  nb_optim_release(adam);
  nb_optim_release(sgd);
  nb_tree_release(g);
  nb_tree_release(p);
  nb_schedule_release(s);
  nb_optim_release(clip);
}
