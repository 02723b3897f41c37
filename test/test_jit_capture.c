/* test/test_jit_capture.c — nb_jit never computes with a tensor its body no
 * longer reads: a captured pointer swapped between calls is seen (issue 17:
 * the batch-capturing jitted step gave 3, 3, 3 instead of 3, 6, 9), values
 * assigned into a capture are seen, and a function without captures never
 * runs its body after the trace. */
#include "common.h"

TestSuite(jit_capture, .init = tc_setup, .fini = tc_teardown);

typedef struct cap {
  nb_tensor *x; /* captured through user; the test swaps it */
  int calls;
} cap;

/* sum(in[0] * x) */
static nb_status dot_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  cap *c = user;
  c->calls++;
  out[0] = nb_sum(nb_mul(in[0], c->x), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

Test(jit_capture, swapped_pointer_gives_3_6_9) {
  cap c = {0};
  nb_fn *f = nb_fn_create(dot_body, &c, 1, 1), *jf = nb_jit(f);
  nb_tensor *ones = nb_ones(NB_SHAPE(3), NB_F32);
  nb_tensor *xs[3] = {nb_full(NB_SHAPE(3), 1, NB_F32), nb_full(NB_SHAPE(3), 2, NB_F32),
                      nb_full(NB_SHAPE(3), 3, NB_F32)};
  nb_reset_stats();
  for (int k = 0; k < 3; k++) {
    c.x = xs[k];
    nb_tensor *o;
    cr_assert(nb_call(jf, &ones, &o) == NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_item(o), 3.0 * (k + 1), "call %d gave %g", k, nb_item(o));
  }
  c.x = xs[0]; /* back to the first tensor: still the current one's values */
  nb_tensor *o;
  cr_assert(nb_call(jf, &ones, &o) == NB_OK);
  cr_assert_eq(nb_item(o), 3.0);
  cr_assert_eq(nb_get_stats().jit_cache_misses, 4, "each swap traces anew");
  nb_fn_release(jf);
  nb_fn_release(f);
}

Test(jit_capture, same_capture_replays_without_tracing_and_sees_assign) {
  cap c = {.x = nb_full(NB_SHAPE(3), 2, NB_F32)};
  nb_fn *f = nb_fn_create(dot_body, &c, 1, 1), *jf = nb_jit(f);
  nb_tensor *ones = nb_ones(NB_SHAPE(3), NB_F32), *o;
  nb_reset_stats();
  for (int k = 0; k < 3; k++) {
    cr_assert(nb_call(jf, &ones, &o) == NB_OK);
    cr_assert_eq(nb_item(o), 6.0);
  }
  cr_assert_eq(nb_get_stats().jit_cache_misses, 1);
  cr_assert_eq(nb_get_stats().jit_cache_hits, 2);
  cr_assert_eq(c.calls, 3, "the guard runs the body (recording only) on every call");
  cr_assert(nb_assign(c.x, nb_full(NB_SHAPE(3), 5, NB_F32)) == NB_OK);
  cr_assert(nb_call(jf, &ones, &o) == NB_OK);
  cr_assert_eq(nb_item(o), 15.0, "an assigned capture is read at the call");
  cr_assert_eq(nb_get_stats().jit_cache_misses, 1);
  nb_fn_release(jf);
  nb_fn_release(f);
}

static nb_status pure_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  ++*(int *)user;
  out[0] = nb_sum(nb_mul_scalar(in[0], 2), NB_ALL, false); /* its constant is made in the body */
  return out[0] ? NB_OK : nb_last_status();
}

Test(jit_capture, function_without_captures_never_runs_its_body_again) {
  int calls = 0;
  nb_fn *f = nb_fn_create(pure_body, &calls, 1, 1), *jf = nb_jit(f);
  nb_tensor *x = nb_ones(NB_SHAPE(4), NB_F32), *o;
  for (int k = 0; k < 5; k++) {
    cr_assert(nb_call(jf, &x, &o) == NB_OK);
    cr_assert_eq(nb_item(o), 8.0);
  }
  cr_assert_eq(calls, 1);
  nb_fn_release(jf);
  nb_fn_release(f);
}

Test(jit_capture, swapped_capture_is_seen_under_grad) {
  cap c = {.x = nb_full(NB_SHAPE(3), 2, NB_F32)};
  nb_fn *f = nb_fn_create(dot_body, &c, 1, 1), *jf = nb_jit(f), *g = nb_grad(jf, NB_AXES(0));
  nb_tensor *ones = nb_ones(NB_SHAPE(3), NB_F32), *o;
  cr_assert(nb_call(g, &ones, &o) == NB_OK, "%s", nb_last_error());
  tc_assert_close(o, (double[]){2, 2, 2}, NB_SHAPE(3));
  c.x = nb_full(NB_SHAPE(3), 7, NB_F32);
  cr_assert(nb_call(g, &ones, &o) == NB_OK, "%s", nb_last_error());
  tc_assert_close(o, (double[]){7, 7, 7}, NB_SHAPE(3));
  nb_fn_release(g);
  nb_fn_release(jf);
  nb_fn_release(f);
}
