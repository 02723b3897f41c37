/* test/test_lazy.c — the planner's memory policy (src/core/plan.c): held
 * members of a fused group that no root needs stay lazy and are recomputed on
 * demand; nb_assign realizes only what reads the tensor it rebinds; steps
 * write in place over inputs that die there. References are plain loops. */
#include "common.h"

enum { N = 1000 };

static void fill(double *x, int n, uint64_t seed) { tc_fill(x, n, -2, 2, &seed); }

/* y = relu(x * 1.5 + w) * 0.5 - 0.25 and its steps, as bench_bandwidth's chain. */
static double chain_ref(double x, double w, int step) {
  double v[5];
  v[0] = x * 1.5;
  v[1] = v[0] + w;
  v[2] = v[1] > 0 ? v[1] : 0;
  v[3] = v[2] * 0.5;
  v[4] = v[3] - 0.25;
  return v[step];
}

Test(lazy, chain_in_one_scope_stores_only_its_output) {
  double x[N], w[N], ref[5][N];
  fill(x, N, 1);
  fill(w, N, 2);
  for (int s = 0; s < 5; s++)
    for (int i = 0; i < N; i++)
      ref[s][i] = chain_ref(x[i], w[i], s);
  nb_scope_begin();
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(N), NB_F64), *wt = tc_tensor(w, NB_SHAPE(N), NB_F64);
  nb_tensor *t[5];
  t[0] = nb_mul_scalar(xt, 1.5);
  t[1] = nb_add(t[0], wt);
  t[2] = nb_relu(t[1]);
  t[3] = nb_mul_scalar(t[2], 0.5);
  t[4] = nb_sub_scalar(t[3], 0.25);
  nb_reset_stats();
  cr_assert_eq(nb_eval(&t[4], 1), NB_OK, "%s", nb_last_error());
  nb_stats st = nb_get_stats();
  cr_assert_eq(st.kernels_run, 1);
  cr_assert_eq(st.buffer_allocs, 1, "only y gets a buffer (%llu)",
               (unsigned long long)st.buffer_allocs);
  for (int s = 0; s < 4; s++)
    cr_assert(!nb_is_realized(t[s]), "step %d is lazy", s);
  tc_assert_close(t[4], ref[4], NB_SHAPE(N));
  /* reading a lazy step recomputes it, in one kernel, with the same values */
  for (int s = 3; s >= 0; s--) {
    uint64_t k0 = nb_get_stats().kernels_run;
    tc_assert_close(t[s], ref[s], NB_SHAPE(N));
    cr_assert_eq(nb_get_stats().kernels_run, k0 + 1);
    cr_assert(nb_is_realized(t[s]));
  }
  nb_scope_end();
}

Test(lazy, scope_end_frees_lazy_nodes) {
  nb_tensor *x = nb_rand(NB_SHAPE(64), NB_F32);
  for (int it = 0; it < 4; it++) {
    uint64_t live = nb_get_stats().live_tensors;
    nb_scope_begin();
    nb_tensor *a = nb_exp(nb_sin(x));
    nb_tensor *y = nb_tanh(a);
    cr_assert_eq(nb_eval(&y, 1), NB_OK);
    cr_assert(!nb_is_realized(a));
    nb_scope_end();
    cr_assert_eq(nb_get_stats().live_tensors, live, "iteration %d", it);
  }
}

/* A lazy node reads a matmul output nobody else holds: the matmul's output is
 * kept, so reading the lazy node later runs only the elementwise step. */
Test(lazy, lazy_node_keeps_its_expensive_input) {
  double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, -1, 2, 0, -2, 1};
  nb_tensor *at = tc_tensor(a, NB_SHAPE(2, 3), NB_F64), *bt = tc_tensor(b, NB_SHAPE(3, 2), NB_F64);
  nb_scope_begin();
  nb_scope_begin();
  nb_tensor *m = nb_matmul(at, bt);
  nb_tensor *l = nb_keep(nb_add_scalar(m, 1.0));
  nb_tensor *y = nb_keep(nb_mul_scalar(l, 2.0));
  nb_scope_end(); /* m is held only by l now */
  cr_assert_eq(nb_eval(&y, 1), NB_OK);
  cr_assert(!nb_is_realized(l));
  cr_assert(nb_is_realized(m), "the lazy node's input stays materialized");
  double mm[4];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      mm[2 * i + j] = 0;
      for (int k = 0; k < 3; k++)
        mm[2 * i + j] += a[3 * i + k] * b[2 * k + j];
    }
  double rl[4], ry[4];
  for (int i = 0; i < 4; i++)
    rl[i] = mm[i] + 1, ry[i] = 2 * rl[i];
  tc_assert_close(y, ry, NB_SHAPE(2, 2));
  uint64_t k0 = nb_get_stats().kernels_run;
  tc_assert_close(l, rl, NB_SHAPE(2, 2));
  cr_assert_eq(nb_get_stats().kernels_run, k0 + 1, "no matmul again");
  nb_scope_end();
}

Test(lazy, assign_realizes_only_what_reads_dst) {
  double x[N], u[N], r2[N], r3[N], ru[N];
  fill(x, N, 3);
  fill(u, N, 4);
  for (int i = 0; i < N; i++)
    r2[i] = 2 * x[i], r3[i] = 2 * x[i] + 3, ru[i] = u[i] + 1;
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(N), NB_F64), *ut = tc_tensor(u, NB_SHAPE(N), NB_F64);
  nb_scope_begin();
  nb_tensor *reads = nb_mul_scalar(xt, 2.0);     /* pending, reads x */
  nb_tensor *reads2 = nb_add_scalar(reads, 3.0); /* pending, reads x through reads */
  nb_tensor *other = nb_add_scalar(ut, 1.0);     /* pending, unrelated */
  cr_assert_eq(nb_assign(xt, nb_zeros(NB_SHAPE(N), NB_F64)), NB_OK, "%s", nb_last_error());
  cr_assert(nb_is_realized(reads) && nb_is_realized(reads2), "readers of x run before the assign");
  cr_assert(!nb_is_realized(other), "unrelated pending work stays lazy");
  tc_assert_close(reads, r2, NB_SHAPE(N));
  tc_assert_close(reads2, r3, NB_SHAPE(N));
  tc_assert_close(other, ru, NB_SHAPE(N));
  double zero[N] = {0};
  tc_assert_close(xt, zero, NB_SHAPE(N));
  nb_scope_end();
}

/* A lazy node that no scope holds any more (the user retains it) still sees
 * the old value of a tensor nb_assign rebinds. */
Test(lazy, assign_keeps_lazy_readers_outside_scopes_correct) {
  double x[N], r[N];
  fill(x, N, 5);
  for (int i = 0; i < N; i++)
    r[i] = sin(x[i]) * 3;
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(N), NB_F64);
  nb_scope_begin();
  nb_tensor *s = nb_retain(nb_sin(xt));
  nb_tensor *y = nb_retain(nb_mul_scalar(s, 3.0));
  cr_assert_eq(nb_eval(&y, 1), NB_OK);
  cr_assert(!nb_is_realized(s));
  nb_scope_end();
  nb_scope_begin();
  nb_tensor *lazy3 = nb_mul_scalar(s, 3.0); /* recorded on the lazy node, still pending */
  nb_release(s);                            /* s lives on as lazy3's input only */
  cr_assert_eq(nb_assign(xt, nb_add_scalar(xt, 100.0)), NB_OK, "%s", nb_last_error());
  tc_assert_close(lazy3, r, NB_SHAPE(N));
  tc_assert_close(y, r, NB_SHAPE(N));
  nb_scope_end();
  nb_scope_begin();
  s = nb_retain(nb_sin(xt)); /* and a lazy node held only by the user */
  nb_tensor *y2 = nb_retain(nb_mul_scalar(s, 3.0));
  cr_assert_eq(nb_eval(&y2, 1), NB_OK);
  cr_assert(!nb_is_realized(s));
  nb_scope_end();
  cr_assert_eq(nb_assign(xt, nb_zeros(NB_SHAPE(N), NB_F64)), NB_OK);
  double rs[N];
  for (int i = 0; i < N; i++)
    rs[i] = sin(x[i] + 100.0);
  tc_assert_close(s, rs, NB_SHAPE(N));
  nb_release(s);
  nb_release(y);
  nb_release(y2);
}

/* p <- p - lr * g, repeated: after the first step every update writes over
 * p's buffer, so it asks the allocator for nothing (lr is a tensor made
 * once: the scalar forms make a 0-d data leaf, a buffer, per call). */
static void sgd_steps(bool requires_grad) {
  double p[N], g[N], ref[N];
  fill(p, N, 6);
  fill(g, N, 7);
  nb_tensor *pt = tc_tensor(p, NB_SHAPE(N), NB_F32), *gt = tc_tensor(g, NB_SHAPE(N), NB_F32);
  nb_tensor *lr = nb_scalar(0.125, NB_F32);
  if (requires_grad) nb_set_requires_grad(pt, true);
  tc_round_to(p, N, NB_F32);
  tc_round_to(g, N, NB_F32);
  for (int i = 0; i < N; i++)
    ref[i] = p[i];
  for (int step = 0; step < 4; step++) {
    for (int i = 0; i < N; i++)
      ref[i] = (double)((float)ref[i] - (float)(0.125f * (float)g[i]));
    if (step == 3) nb_reset_stats();
    nb_scope_begin();
    cr_assert_eq(nb_assign(pt, nb_sub(pt, nb_mul(gt, lr))), NB_OK, "%s", nb_last_error());
    nb_scope_end();
    if (step == 3) {
      nb_stats st = nb_get_stats();
      cr_assert_eq(st.buffer_allocs, 0, "the update runs in place (%llu buffers)",
                   (unsigned long long)st.buffer_allocs);
      cr_assert_eq(st.kernels_run, 1);
    }
  }
  tc_assert_close(pt, ref, NB_SHAPE(N));
  cr_assert_eq(nb_requires_grad(pt), requires_grad);
}

Test(lazy, sgd_update_is_in_place) { sgd_steps(false); }
Test(lazy, sgd_update_of_a_requires_grad_leaf_is_in_place) { sgd_steps(true); }

/* nb_backward, then the update: the gradient leaf and p are updated without
 * allocations, and the values follow the closed form d/dp sum(p^2) = 2p. */
Test(lazy, backward_then_update_in_place) {
  double p[N];
  fill(p, N, 8);
  nb_tensor *pt = tc_tensor(p, NB_SHAPE(N), NB_F64), *lr = nb_scalar(0.01, NB_F64);
  nb_set_requires_grad(pt, true);
  for (int step = 0; step < 3; step++) {
    nb_scope_begin();
    /* the forward's values die with their scope: a lazy reader of pt still
     * alive at the assign would share pt's old buffer (and so rule out the
     * in-place write) */
    nb_scope_begin();
    nb_tensor *h = nb_mul_scalar(nb_tanh(pt), 2.0); /* lazy members of the forward */
    nb_tensor *loss = nb_sum(nb_square(h), NB_ALL, false);
    cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
    nb_scope_end();
    double gref[N];
    for (int i = 0; i < N; i++) {
      double th = tanh(p[i]);
      gref[i] = 8 * th * (1 - th * th);
    }
    tc_assert_close(nb_grad_of(pt), gref, NB_SHAPE(N));
    if (step == 2) nb_reset_stats();
    cr_assert_eq(nb_assign(pt, nb_sub(pt, nb_mul(nb_grad_of(pt), lr))), NB_OK);
    if (step == 2) cr_assert_eq(nb_get_stats().buffer_allocs, 0);
    nb_zero_grad(pt);
    for (int i = 0; i < N; i++)
      p[i] -= 0.01 * gref[i];
    tc_assert_close(pt, p, NB_SHAPE(N));
    nb_scope_end();
  }
}

/* In place is skipped where the input's buffer is shared: a realized view of
 * the assigned tensor keeps its old values. */
Test(lazy, shared_buffer_is_not_overwritten) {
  double x[N], r[N];
  fill(x, N, 9);
  for (int i = 0; i < N; i++)
    r[i] = x[i] * 4;
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(N), NB_F64);
  nb_scope_begin();
  nb_tensor *v = nb_reshape(xt, NB_SHAPE(10, N / 10));
  cr_assert_eq(nb_eval(&v, 1), NB_OK);
  cr_assert_eq(nb_assign(xt, nb_mul_scalar(xt, 4.0)), NB_OK);
  tc_assert_close(xt, r, NB_SHAPE(N));
  tc_assert_close(v, x, NB_SHAPE(10, N / 10));
  nb_scope_end();
}

/* Unfused steps write over intermediates that die: a chain nobody holds but
 * its output needs one buffer, with fusion on or off, and gives the same
 * values. */
Test(lazy, unfused_chain_runs_in_place) {
  double x[N], r[N];
  fill(x, N, 10);
  for (int i = 0; i < N; i++)
    r[i] = exp(sin(x[i]) * 0.5) + 1;
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(N), NB_F64);
  for (int fused = 0; fused < 2; fused++) {
    nbi_set_fusion(fused);
    nb_scope_begin();
    nb_scope_begin();
    nb_tensor *y = nb_keep(nb_add_scalar(nb_exp(nb_mul_scalar(nb_sin(xt), 0.5)), 1.0));
    nb_scope_end();
    nb_reset_stats();
    cr_assert_eq(nb_eval(&y, 1), NB_OK);
    nb_stats st = nb_get_stats();
    cr_assert_eq(st.buffer_allocs, 1, "fusion %d: %llu buffers", fused,
                 (unsigned long long)st.buffer_allocs);
    cr_assert_eq(st.kernels_run, fused ? 1 : 4);
    tc_assert_close(y, r, NB_SHAPE(N));
    nb_scope_end();
  }
  nbi_set_fusion(true);
}

/* A group member that writes in place must not clobber an operand a later
 * member still reads: t = x * 2 (stored: read later), y = t + x. */
Test(lazy, group_member_does_not_overwrite_an_operand_read_later) {
  double x[N], rt[N], ry[N];
  fill(x, N, 11);
  for (int i = 0; i < N; i++)
    rt[i] = x[i] * 2, ry[i] = rt[i] + 2 * x[i] * x[i];
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(10, N / 10), NB_F64);
  nb_scope_begin();
  nb_scope_begin();
  /* an intermediate from outside the group that dies in it (a view of a
   * product of another shape: its own steps) */
  nb_tensor *x2 = nb_reshape(nb_mul_scalar(xt, 1.0), NB_SHAPE(N));
  nb_tensor *t = nb_keep(nb_mul_scalar(x2, 2.0));
  nb_tensor *y = nb_keep(nb_add(t, nb_mul(t, x2)));
  nb_scope_end();
  nb_tensor *outs[2] = {t, y};
  nb_reset_stats();
  cr_assert_eq(nb_eval(outs, 2), NB_OK);
  cr_assert_eq(nb_get_stats().buffer_allocs, 2, "x * 1 and t; y writes over x2");
  tc_assert_close(t, rt, NB_SHAPE(N));
  tc_assert_close(y, ry, NB_SHAPE(N));
  nb_scope_end();
}

/* Plans are cached by structure, roots included: the same chain realized
 * with one more root (held the same way) realizes that root. */
Test(lazy, roots_are_part_of_the_plan) {
  double x[N], r[3][N];
  fill(x, N, 12);
  for (int i = 0; i < N; i++)
    r[0][i] = exp(x[i]), r[1][i] = r[0][i] * 2, r[2][i] = r[1][i] + 1;
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(N), NB_F64);
  for (int n_roots = 1; n_roots <= 3; n_roots++)
    for (int rep = 0; rep < 2; rep++) {
      nb_scope_begin();
      nb_tensor *t[3];
      t[0] = nb_exp(xt);
      t[1] = nb_mul_scalar(t[0], 2.0);
      t[2] = nb_add_scalar(t[1], 1.0);
      nb_tensor *roots[3] = {t[2], t[1], t[0]};
      cr_assert_eq(nb_eval(roots, n_roots), NB_OK);
      for (int k = 0; k < 3; k++)
        cr_assert_eq(nb_is_realized(roots[k]), k < n_roots, "%d roots: root %d", n_roots, k);
      for (int k = 0; k < 3; k++)
        tc_assert_close(t[k], r[k], NB_SHAPE(N));
      nb_scope_end();
    }
}

/* The forward realized first (its elementwise steps lazy), then nb_backward:
 * the backward recomputes what it needs and the gradients are right. */
Test(lazy, backward_after_reading_the_loss) {
  double p[N], gref[N];
  fill(p, N, 13);
  nb_tensor *pt = tc_tensor(p, NB_SHAPE(N), NB_F64);
  nb_set_requires_grad(pt, true);
  nb_scope_begin();
  nb_tensor *h = nb_sin(nb_mul_scalar(pt, 3.0));
  nb_tensor *loss = nb_sum(nb_mul(h, pt), NB_ALL, false);
  double lref = 0;
  for (int i = 0; i < N; i++) {
    lref += sin(3 * p[i]) * p[i];
    gref[i] = sin(3 * p[i]) + 3 * p[i] * cos(3 * p[i]);
  }
  cr_assert_float_eq(nb_item(loss), lref, 1e-9 * fabs(lref) + 1e-12);
  cr_assert(!nb_is_realized(h));
  cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
  tc_assert_close(nb_grad_of(pt), gref, NB_SHAPE(N));
  nb_scope_end();
}

/* A lazy reader of the assigned tensor is not run by nb_assign: it reads a
 * leaf sharing the old buffer (which is then not overwritten in place); one
 * whose provenance nb_backward may still need runs instead. */
Test(lazy, assign_leaves_lazy_readers_lazy) {
  double x[N], r[N], y[N];
  fill(x, N, 14);
  for (int i = 0; i < N; i++)
    r[i] = exp(x[i]), y[i] = x[i] + 1;
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(N), NB_F64);
  nb_scope_begin();
  nb_tensor *e = nb_exp(xt);
  nb_tensor *out = nb_mul_scalar(e, 2.0);
  cr_assert_eq(nb_eval(&out, 1), NB_OK);
  cr_assert(!nb_is_realized(e));
  nb_reset_stats();
  cr_assert_eq(nb_assign(xt, nb_add_scalar(xt, 1.0)), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_get_stats().kernels_run, 1, "only the new value runs");
  cr_assert(!nb_is_realized(e), "the lazy reader stays lazy");
  tc_assert_close(xt, y, NB_SHAPE(N));
  tc_assert_close(e, r, NB_SHAPE(N));
  nb_scope_end();

  nb_tensor *pt = tc_tensor(x, NB_SHAPE(N), NB_F64);
  nb_set_requires_grad(pt, true);
  nb_scope_begin();
  nb_tensor *h = nb_sin(pt);
  nb_tensor *loss = nb_sum(nb_mul_scalar(h, 2.0), NB_ALL, false);
  cr_assert(!isnan(nb_item(loss)));
  cr_assert(!nb_is_realized(h));
  cr_assert_eq(nb_assign(pt, nb_zeros(NB_SHAPE(N), NB_F64)), NB_OK);
  cr_assert(nb_is_realized(h), "h keeps provenance to pt: it runs before the assign");
  double rs[N];
  for (int i = 0; i < N; i++)
    rs[i] = sin(x[i]);
  tc_assert_close(h, rs, NB_SHAPE(N));
  nb_scope_end();
}

/* ---- with simplification (src/core/simplify.c) ---------------------------------------- */
/* A held common subexpression of a lazy group member has no buffer to share:
 * it stays lazy too, and reading it later gives its value. */
Test(lazy, alias_of_a_lazy_member_is_lazy) {
  double x[N], w[N], r1[N], ry[N];
  fill(x, N, 14);
  fill(w, N, 15);
  for (int i = 0; i < N; i++)
    r1[i] = x[i] * 1.5 + w[i], ry[i] = r1[i] * r1[i];
  nb_scope_begin();
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(N), NB_F64), *wt = tc_tensor(w, NB_SHAPE(N), NB_F64);
  nb_tensor *t0 = nb_mul_scalar(xt, 1.5);
  nb_tensor *t1 = nb_add(t0, wt), *t1b = nb_add(wt, t0); /* t1b aliases t1 */
  nb_tensor *y = nb_mul(t1, t1b);
  nb_reset_stats();
  cr_assert_eq(nb_eval(&y, 1), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_get_stats().kernels_run, 1);
  cr_assert_eq(nb_get_stats().buffer_allocs, 1, "only y gets a buffer");
  cr_assert(!nb_is_realized(t1) && !nb_is_realized(t1b));
  tc_assert_close(y, ry, NB_SHAPE(N));
  tc_assert_close(t1b, r1, NB_SHAPE(N));
  tc_assert_close(t1, r1, NB_SHAPE(N));
  nb_scope_end();
}

/* A lazy node reads a no-op view of a matmul: the view is kept (sharing the
 * matmul's buffer), so reading the lazy node later runs one kernel. */
Test(lazy, lazy_node_keeps_an_aliased_input) {
  double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, -1, 2, 0, -2, 1}, mm[4], rl[4], ry[4];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      mm[2 * i + j] = 0;
      for (int k = 0; k < 3; k++)
        mm[2 * i + j] += a[3 * i + k] * b[2 * k + j];
    }
  for (int i = 0; i < 4; i++)
    rl[i] = mm[i] + 1, ry[i] = 2 * rl[i];
  nb_tensor *at = tc_tensor(a, NB_SHAPE(2, 3), NB_F64), *bt = tc_tensor(b, NB_SHAPE(3, 2), NB_F64);
  nb_scope_begin();
  nb_scope_begin();
  nb_tensor *m = nb_transpose(nb_transpose(nb_matmul(at, bt))); /* aliases the matmul */
  nb_tensor *l = nb_keep(nb_add_scalar(m, 1.0));
  nb_tensor *y = nb_keep(nb_mul_scalar(l, 2.0));
  nb_scope_end();
  nb_reset_stats();
  cr_assert_eq(nb_eval(&y, 1), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_get_stats().kernels_run, 2, "the matmul and the fused group");
  cr_assert(!nb_is_realized(l));
  cr_assert(nb_is_realized(m), "the lazy node's aliased input stays materialized");
  tc_assert_close(m, mm, NB_SHAPE(2, 2));
  tc_assert_close(y, ry, NB_SHAPE(2, 2));
  uint64_t k0 = nb_get_stats().kernels_run;
  tc_assert_close(l, rl, NB_SHAPE(2, 2));
  cr_assert_eq(nb_get_stats().kernels_run, k0 + 1, "no matmul again");
  nb_scope_end();
}

/* In place and aliases: u's last use is through its alias w (read after a
 * step that reads u directly), and the held alias v shares u's buffer; no
 * step may write over u. */
Test(lazy, no_in_place_write_over_a_value_aliases_still_read) {
  double a[4] = {0.5, -1, 0.25, 2}, id[4] = {1, 0, 0, 1}, rc[4];
  for (int i = 0; i < 4; i++)
    rc[i] = exp(a[i]) + a[i];
  nb_tensor *at = tc_tensor(a, NB_SHAPE(2, 2), NB_F64), *it = tc_tensor(id, NB_SHAPE(2, 2), NB_F64);
  for (int held = 0; held < 2; held++) {
    nb_scope_begin();
    nb_scope_begin();
    nb_tensor *u = nb_matmul(at, it); /* its own kernel: a buffer that may die */
    nb_tensor *s = nb_matmul(nb_exp(u), it);
    nb_tensor *w = nb_transpose(nb_transpose(u)); /* aliases u */
    nb_tensor *c = nb_keep(nb_add(s, w));
    nb_tensor *v = held ? nb_keep(nb_reshape(nb_reshape(u, NB_SHAPE(4)), NB_SHAPE(2, 2))) : NULL;
    nb_scope_end();
    cr_assert_eq(nb_eval(held ? (nb_tensor *[]){c, v} : &c, held ? 2 : 1), NB_OK, "%s",
                 nb_last_error());
    tc_assert_close(c, rc, NB_SHAPE(2, 2));
    if (held) {
      cr_assert(nb_is_realized(v));
      tc_assert_close(v, a, NB_SHAPE(2, 2));
    }
    nb_scope_end();
  }
}

/* ---- frozen lazy nodes (src/core/assign.c, freeze_lazy) ------------------------------- */
/* An imperative step: the forward's values nb_backward left lazy are frozen
 * at the first assign (the requires-grad leaves they read are shared, the
 * data they read flagged), and every later assign passes over them. They
 * keep their old values whatever is assigned next: the parameters, the
 * data (a flagged source), a frozen node that was read since, and readers
 * recorded on them after the freeze. */
enum { FB = 4, FI = 3, FO = 5 };

static void frozen_ref(const double *x, const double *w, const double *b, double *z, double *h) {
  for (int i = 0; i < FB; i++)
    for (int j = 0; j < FO; j++) {
      double s = b[j];
      for (int k = 0; k < FI; k++)
        s += x[i * FI + k] * w[k * FO + j];
      z[i * FO + j] = s;
      h[i * FO + j] = s > 0 ? s : 0;
    }
}

Test(lazy, frozen_lazy_nodes_keep_their_values_across_assigns) {
  double x[FB * FI], w[FI * FO], b[FO], z[FB * FO], h[FB * FO], h3[FB * FO];
  fill(x, FB * FI, 21);
  fill(w, FI * FO, 22);
  fill(b, FO, 23);
  frozen_ref(x, w, b, z, h);
  for (int i = 0; i < FB * FO; i++)
    h3[i] = 3 * h[i];
  nb_tensor *xt = tc_tensor(x, NB_SHAPE(FB, FI), NB_F64);
  nb_tensor *wt = tc_tensor(w, NB_SHAPE(FI, FO), NB_F64);
  nb_tensor *bt = tc_tensor(b, NB_SHAPE(FO), NB_F64);
  nb_set_requires_grad(wt, true);
  nb_set_requires_grad(bt, true);
  for (int variant = 0; variant < 3; variant++) {
    nb_scope_begin();
    nb_tensor *zt = nb_add(nb_matmul(xt, wt), bt);
    nb_tensor *ht = nb_relu(zt);
    nb_tensor *loss = nb_sum(nb_mul_scalar(nb_exp(nb_mul_scalar(ht, 0.1)), 2.0), NB_ALL, false);
    cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
    cr_assert(!nb_is_realized(ht), "the forward's value is left lazy");
    cr_assert_eq(nb_assign(wt, nb_sub(wt, nb_mul_scalar(nb_grad_of(wt), 0.5))), NB_OK, "%s",
                 nb_last_error());
    nb_tensor *u = nb_mul_scalar(ht, 3.0); /* recorded on a frozen node */
    if (variant == 1) {
      cr_assert_eq(nb_eval(&zt, 1), NB_OK); /* a frozen node read since ... */
      cr_assert_eq(nb_assign(zt, nb_zeros(NB_SHAPE(FB, FO), NB_F64)), NB_OK, "%s",
                   nb_last_error()); /* ... and rebound */
    }
    cr_assert_eq(nb_assign(bt, nb_add_scalar(bt, 100.0)), NB_OK, "%s", nb_last_error());
    if (variant == 2)
      cr_assert_eq(nb_assign(xt, nb_mul_scalar(xt, -1.0)), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_assign(wt, nb_mul_scalar(wt, 0.0)), NB_OK, "%s", nb_last_error());
    tc_assert_close(ht, h, NB_SHAPE(FB, FO));
    tc_assert_close(u, h3, NB_SHAPE(FB, FO));
    nb_zero_grad(wt);
    nb_zero_grad(bt);
    nb_scope_end();
    /* the next variant starts from the same values */
    nb_tensor *fresh[3] = {tc_tensor(x, NB_SHAPE(FB, FI), NB_F64),
                           tc_tensor(w, NB_SHAPE(FI, FO), NB_F64), tc_tensor(b, NB_SHAPE(FO), NB_F64)};
    cr_assert_eq(nb_assign(xt, fresh[0]), NB_OK);
    cr_assert_eq(nb_assign(wt, fresh[1]), NB_OK);
    cr_assert_eq(nb_assign(bt, fresh[2]), NB_OK);
  }
}
