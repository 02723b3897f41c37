/* test/test_debug.c — misuse is an error naming the function, not memory
 * corruption: NABLA_DEBUG's released-handle checks (use after nb_release or
 * after the owning scope ended, nb_release of a scope's reference) and, always
 * on, the scope checks at nb_call boundaries (a body that ends the caller's
 * scope, or leaves its own open). */
#include "common.h"

TestSuite(debug, .init = tc_setup, .fini = tc_teardown);

/* Debug mode is read from NABLA_DEBUG at load; each test runs in its own
 * process, so turning it on here is the test's alone. */
static void debug_on(void) { nbi_debug = true; }

Test(debug, use_after_scope_end_is_an_error_naming_the_function) {
  debug_on();
  nb_scope_begin();
  nb_tensor *x = nb_ones(NB_SHAPE(4, 4), NB_F32);
  nb_scope_end();
  cr_assert_null(nb_add(x, x));
  cr_assert_eq(nb_last_status(), NB_ERR_ARG);
  cr_assert(strstr(nb_last_error(), "nb_add: input 0") && strstr(nb_last_error(), "released"), "%s",
            nb_last_error());
  nb_clear_error();
  cr_assert(isnan(nb_item(x)));
  cr_assert(strstr(nb_last_error(), "nb_item"), "%s", nb_last_error());
  nb_clear_error();
  nb_release(x); /* no double free */
  cr_assert(strstr(nb_last_error(), "nb_release"), "%s", nb_last_error());
  nb_clear_error();
  nb_tensor *y = nb_ones(NB_SHAPE(2), NB_F32); /* the dead handle is never handed out again */
  cr_assert_neq(y, x);
  cr_assert_eq(nb_item(nb_sum(y, NB_ALL, false)), 2.0);
}

Test(debug, use_after_release_is_an_error) {
  debug_on();
  nb_tensor *x = nb_retain(nb_ones(NB_SHAPE(3), NB_F32));
  nb_scope_begin();
  nb_tensor *z = nb_zeros(NB_SHAPE(3), NB_F32);
  nb_scope_end();
  (void)z;
  nb_release(x); /* the scope's reference remains */
  cr_assert_eq(nb_last_status(), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_item(nb_sum(x, NB_ALL, false)), 3.0);
  nb_tensor *keep = nb_keep(z);
  cr_assert_null(keep);
  cr_assert(strstr(nb_last_error(), "nb_keep") && strstr(nb_last_error(), "released"), "%s",
            nb_last_error());
}

Test(debug, release_of_a_scopes_reference_is_refused) {
  debug_on();
  nb_tensor *x = nb_ones(NB_SHAPE(5), NB_F32);
  nb_release(x);
  cr_assert_eq(nb_last_status(), NB_ERR_SCOPE);
  cr_assert(strstr(nb_last_error(), "nb_release") && strstr(nb_last_error(), "scope"), "%s",
            nb_last_error());
  nb_clear_error();
  cr_assert_eq(nb_item(nb_sum(x, NB_ALL, false)), 5.0); /* still alive */
}

static nb_status closes_too_many(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                 int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_status st = nb_scope_end(); /* ends nb_call's scope, or worse the caller's */
  out[0] = nb_add(in[0], in[0]);
  return st;
}

static nb_status leaves_one_open(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                 int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_scope_begin();
  out[0] = nb_add(in[0], in[0]);
  return NB_OK;
}

/* Always on: a body that ends a scope it did not begin gets NB_ERR_SCOPE, and
 * the caller's tensors and scope depth are intact. */
Test(debug, call_body_cannot_end_the_callers_scope) {
  nb_tensor *a = nb_full(NB_SHAPE(3), 2.0, NB_F32);
  nb_fn *f = nb_fn_create(closes_too_many, NULL, 1, 1);
  int depth = nbi_scope_depth();
  nb_tensor *out[1];
  cr_assert_eq(nb_call(f, &a, out), NB_ERR_SCOPE);
  cr_assert(strstr(nb_last_error(), "nb_scope_end") && strstr(nb_last_error(), "nb_call"), "%s",
            nb_last_error());
  cr_assert_null(out[0]);
  cr_assert_eq(nbi_scope_depth(), depth);
  nb_clear_error();
  cr_assert_eq(nb_item(nb_sum(a, NB_ALL, false)), 6.0);
  nb_fn_release(f);
}

Test(debug, call_body_leaving_a_scope_open_is_an_error_and_closed) {
  nb_tensor *a = nb_full(NB_SHAPE(3), 2.0, NB_F32);
  nb_fn *f = nb_fn_create(leaves_one_open, NULL, 1, 1);
  int depth = nbi_scope_depth();
  uint64_t live = nb_get_stats().live_tensors;
  nb_tensor *out[1];
  cr_assert_eq(nb_call(f, &a, out), NB_ERR_SCOPE);
  cr_assert(strstr(nb_last_error(), "nb_call") && strstr(nb_last_error(), "left 1 scope"), "%s",
            nb_last_error());
  cr_assert_eq(nbi_scope_depth(), depth);
  cr_assert_eq(nb_get_stats().live_tensors, live, "the body's tensors were released");
  nb_clear_error();
  cr_assert_eq(nb_item(nb_sum(a, NB_ALL, false)), 6.0);
  nb_fn_release(f);
}
