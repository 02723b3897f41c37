/* test/test_graph.c — laziness, realization, plan cache, liveness, memory. */
#include "common.h"

#include <malloc.h>

TestSuite(graph, .init = tc_setup, .fini = tc_teardown);

Test(graph, ops_record_and_realize_on_demand) {
  nb_tensor *a = nb_full(NB_SHAPE(3), 2, NB_F32), *b = nb_full(NB_SHAPE(3), 5, NB_F32);
  uint64_t k0 = nb_get_stats().kernels_run;
  nb_tensor *c = nb_mul(nb_add(a, b), b);
  cr_assert_not(nb_is_realized(c));
  cr_assert_eq(nb_get_stats().kernels_run, k0, "recording must not compute");
  cr_assert_eq(nb_eval(&c, 1), NB_OK);
  cr_assert(nb_is_realized(c));
  cr_assert_eq(nb_get_stats().kernels_run, k0 + 1, "add and mul run as one fused kernel");
  double ref[3] = {35, 35, 35};
  tc_assert_close(c, ref, NB_SHAPE(3));
}

Test(graph, print_realizes) {
  nb_tensor *c = nb_add_scalar(nb_zeros(NB_SHAPE(2), NB_I32), 4);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  nb_fprint(f, c);
  fclose(f);
  cr_assert(nb_is_realized(c));
  cr_assert_str_eq(buf, "[4, 4] (i32 [2])\n");
  free(buf);
}

Test(graph, shared_subgraph_runs_once_for_several_outputs) {
  nb_tensor *x = nb_full(NB_SHAPE(4), 3, NB_F32);
  nb_tensor *s = nb_exp(x);
  nb_tensor *outs[2] = {nb_add(s, x), nb_mul(s, x)};
  uint64_t k0 = nb_get_stats().kernels_run;
  cr_assert_eq(nb_eval(outs, 2), NB_OK);
  cr_assert_eq(nb_get_stats().kernels_run, k0 + 1, "exp, add and mul: one fused pass");
  cr_assert(!nb_is_realized(s), "s is held but no root needs it: the group leaves it lazy");
  double e3 = exp(3.0), r1[4] = {e3 + 3, e3 + 3, e3 + 3, e3 + 3},
         r2[4] = {3 * e3, 3 * e3, 3 * e3, 3 * e3}, rs[4] = {e3, e3, e3, e3};
  tc_assert_close(outs[0], r1, NB_SHAPE(4));
  tc_assert_close(outs[1], r2, NB_SHAPE(4));
  tc_assert_close(s, rs, NB_SHAPE(4)); /* recomputed on demand */
}

Test(graph, identical_graphs_in_a_loop_plan_once) {
  nb_tensor *x = nb_rand(NB_SHAPE(8, 8), NB_F32);
  nb_stats s0 = nb_get_stats();
  for (int i = 0; i < 10; i++) {
    nb_scope_begin();
    nb_tensor *y = nb_sum(nb_relu(nb_sub_scalar(nb_mul_scalar(x, 2.0), 1.0)), NB_ALL, false);
    cr_assert(!isnan(nb_item(y)));
    nb_scope_end();
  }
  nb_stats s1 = nb_get_stats();
  cr_assert_eq(s1.plan_cache_misses - s0.plan_cache_misses, 1);
  cr_assert_eq(s1.plan_cache_hits - s0.plan_cache_hits, 9);
}

Test(graph, different_shapes_plan_separately) {
  nb_stats s0 = nb_get_stats();
  for (int n = 1; n <= 3; n++) {
    nb_tensor *y = nb_add_scalar(nb_zeros(NB_SHAPE(n), NB_F32), 1);
    cr_assert_eq(nb_eval(&y, 1), NB_OK);
  }
  cr_assert_eq(nb_get_stats().plan_cache_misses - s0.plan_cache_misses, 3);
}

/* A chain whose intermediates nobody holds keeps at most a few buffers alive. */
Test(graph, unheld_intermediates_are_freed_by_liveness) {
  const int64_t n = 1 << 18; /* 1 MiB per f32 buffer */
  nb_tensor *y;
  uint64_t base = nb_get_stats().live_bytes;
  nb_scope_begin();
  nb_tensor *x = nb_full(NB_SHAPE(n), 0.5, NB_F32);
  y = x;
  for (int i = 0; i < 12; i++)
    y = nb_mul_scalar(nb_add_scalar(y, 1.0), 0.5);
  nb_keep(y);
  nb_scope_end(); /* the chain is now held only by y */
  nb_reset_stats();
  uint64_t live0 = nb_get_stats().live_bytes;
  cr_assert_eq(nb_eval(&y, 1), NB_OK);
  nb_stats s = nb_get_stats();
  cr_assert_leq(s.peak_bytes - live0, 3 * (uint64_t)n * 4, "peak grew by %llu bytes",
                (unsigned long long)(s.peak_bytes - live0));
  /* the leaf x and every intermediate died with the graph: y's buffer only */
  /* x, the scalar constants and every intermediate died with the graph */
  cr_assert_eq(s.live_bytes, base + (uint64_t)n * 4, "only y's buffer is left");
}

Test(graph, deep_chains_realize_and_free_without_recursion) {
  uint64_t t0 = nb_get_stats().live_tensors;
  nb_scope_begin();
  nb_tensor *y = nb_zeros(NB_SHAPE(1), NB_F32);
  nb_scope_begin();
  for (int i = 0; i < 20000; i++) {
    nb_tensor *next = nb_add_scalar(y, 1.0);
    y = next;
  }
  nb_keep(y);
  nb_scope_end();
  cr_assert_eq(nb_item(y), 20000);
  nb_scope_end();
  cr_assert_eq(nb_get_stats().live_tensors, t0);
}

Test(graph, dropping_an_unrealized_deep_chain_is_iterative) {
  uint64_t t0 = nb_get_stats().live_tensors;
  nb_scope_begin();
  nb_tensor *y = nb_zeros(NB_SHAPE(1), NB_F32);
  for (int i = 0; i < 200000; i++)
    y = nb_add_scalar(y, 1.0);
  nb_scope_end();
  cr_assert_eq(nb_get_stats().live_tensors, t0);
}

/* The loop shape of a training step: a new value each iteration replaces the
 * old one. Tensors, buffer bytes and heap use must stay flat. */
Test(graph, ten_thousand_iterations_keep_memory_flat) {
  nb_tensor *w = nb_retain(nb_rand(NB_SHAPE(16, 16), NB_F32));
  nb_tensor *x = nb_rand(NB_SHAPE(4, 16), NB_F32);
  uint64_t tensors_at[2] = {0}, bytes_at[2] = {0};
  size_t heap_at[2] = {0};
  for (int it = 1; it <= 10000; it++) {
    nb_scope_begin();
    nb_tensor *h = nb_tanh(nb_matmul(x, w));
    nb_tensor *g = nb_mean(nb_square(h), NB_ALL, false);
    nb_tensor *w_new = nb_sub(w, nb_mul(nb_mul_scalar(w, 1e-4), g));
    cr_assert_eq(nb_eval(&w_new, 1), NB_OK, "%s", nb_last_error());
    nb_release(w);
    w = nb_retain(w_new);
    nb_scope_end();
    if (it == 1000 || it == 10000) {
      int k = it == 1000 ? 0 : 1;
      tensors_at[k] = nb_get_stats().live_tensors;
      bytes_at[k] = nb_get_stats().live_bytes;
      heap_at[k] = mallinfo2().uordblks;
    }
  }
  cr_assert_eq(tensors_at[0], tensors_at[1]);
  cr_assert_eq(bytes_at[0], bytes_at[1]);
  cr_assert_leq(heap_at[1], heap_at[0] + 64 * 1024, "heap grew from %zu to %zu", heap_at[0],
                heap_at[1]);
  nb_release(w);
}

Test(graph, a_failed_realization_leaves_inputs_intact) {
  double x[3] = {1, 2, 3};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(3), NB_F32);
  int64_t bad[2] = {0, 7};
  nb_tensor *g = nb_take(t, nb_from_data(bad, NB_SHAPE(2), NB_I64), 0);
  cr_assert(g);
  cr_assert_eq(nb_eval(&g, 1), NB_ERR_INDEX);
  tc_assert_error(NB_ERR_INDEX, "nb_take");
  cr_assert_not(nb_is_realized(g));
  tc_assert_close(t, x, NB_SHAPE(3));
  tc_assert_close(nb_add_scalar(t, 1), (double[]){2, 3, 4}, NB_SHAPE(3));
}

Test(graph, null_inputs_propagate_the_first_error) {
  nb_tensor *a = nb_ones(NB_SHAPE(2, 3), NB_F32), *b = nb_ones(NB_SHAPE(4, 5), NB_F32);
  nb_tensor *y = nb_mean(nb_square(nb_matmul(a, b)), NB_ALL, false);
  cr_assert_null(y);
  tc_assert_error(NB_ERR_SHAPE, "nb_matmul: inner dimensions differ: [2,3] @ [4,5]");
}
