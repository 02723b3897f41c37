/* test/test_jit.c — nb_jit: equal to eager, traced once per signature,
 * bounded cache, captures read at call time, composition with autodiff. */
#include "common.h"

/* y = sin(x) * w + x^2 summed over axis 0; counts how often the body runs. */
typedef struct body_state {
  int calls;
  nb_tensor *w; /* captured */
} body_state;

static nb_status f_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  body_state *b = user;
  b->calls++;
  nb_tensor *x = in[0];
  nb_tensor *y = nb_add(nb_mul(nb_sin(x), b->w), nb_square(x));
  out[0] = nb_sum(y, NB_AXES(0), false);
  out[1] = nb_mul_scalar(x, 2.0);
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

static nb_tensor *rand_t(nb_shape s, uint64_t seed) {
  int64_t n = tc_numel(s);
  double *x = malloc(sizeof *x * (size_t)(n ? n : 1));
  tc_fill(x, n, -1, 1, &seed);
  nb_tensor *t = tc_tensor(x, s, NB_F64);
  free(x);
  return t;
}

static void assert_close(nb_tensor *a, nb_tensor *b, double tol) {
  cr_assert(a && b, "%s", nb_last_error());
  cr_assert(nbi_shape_eq(&a->shape, &b->shape));
  int64_t n = nb_numel(a);
  double *x = tc_read(a), *y = tc_read(b);
  for (int64_t i = 0; i < n; i++)
    cr_assert(fabs(x[i] - y[i]) <= tol * (1 + fabs(y[i])), "element %lld: %g vs %g", (long long)i,
              x[i], y[i]);
  free(x);
  free(y);
}

Test(jit, equals_eager_and_traces_once_per_signature) {
  body_state st = {.w = rand_t(NB_SHAPE(3), 1)};
  nb_fn *f = nb_fn_create(f_body, &st, 1, 2), *jf = nb_jit(f);
  nb_reset_stats();
  for (int it = 0; it < 5; it++) {
    nb_scope_begin();
    nb_tensor *x = rand_t(NB_SHAPE(4, 3), 10 + (uint64_t)it), *e[2], *j[2];
    cr_assert(nb_call(f, &x, e) == NB_OK);
    int before = st.calls;
    cr_assert(nb_call(jf, &x, j) == NB_OK, "%s", nb_last_error());
    cr_assert(nb_is_realized(j[0]) && nb_is_realized(j[1]), "top-level jit realizes its outputs");
    /* it captures w: each call runs the body (recording only) to check that it
     * still reads w (test_jit_capture.c); it traces only the first time */
    cr_assert_eq(st.calls - before, 1, "the capture guard runs the body once per call");
    assert_close(j[0], e[0], 1e-12);
    assert_close(j[1], e[1], 1e-12);
    nb_scope_end();
  }
  nb_stats s = nb_get_stats();
  cr_assert_eq(s.jit_cache_misses, 1);
  cr_assert_eq(s.jit_cache_hits, 4);
  /* a new shape is a new signature */
  nb_tensor *x = rand_t(NB_SHAPE(2, 3), 5), *j[2];
  cr_assert(nb_call(jf, &x, j) == NB_OK);
  cr_assert_eq(nb_get_stats().jit_cache_misses, 2);
  nb_fn_release(jf);
  nb_fn_release(f);
}

Test(jit, cache_is_bounded_lru) {
  body_state st = {.w = rand_t(NB_SHAPE(1), 2)};
  nb_fn *f = nb_fn_create(f_body, &st, 1, 2), *jf = nb_jit(f);
  nb_reset_stats();
  /* 17 signatures: the first is evicted by the 17th (16 entries) */
  for (int n = 1; n <= 17; n++) {
    nb_scope_begin();
    nb_tensor *x = rand_t(NB_SHAPE(n, 1), (uint64_t)n), *o[2];
    cr_assert(nb_call(jf, &x, o) == NB_OK);
    nb_scope_end();
  }
  cr_assert_eq(nb_get_stats().jit_cache_misses, 17);
  nb_tensor *x = rand_t(NB_SHAPE(17, 1), 17), *o[2];
  cr_assert(nb_call(jf, &x, o) == NB_OK);
  cr_assert_eq(nb_get_stats().jit_cache_hits, 1, "the most recent signature is cached");
  x = rand_t(NB_SHAPE(1, 1), 1);
  cr_assert(nb_call(jf, &x, o) == NB_OK);
  cr_assert_eq(nb_get_stats().jit_cache_misses, 18, "the least recently used one was evicted");
  cr_assert_eq(st.calls, 19, "18 traces and the capture guard of the one hit");
  nb_fn_release(jf);
  nb_fn_release(f);
}

Test(jit, captured_tensor_is_read_at_call_time) {
  body_state st = {.w = rand_t(NB_SHAPE(3), 3)};
  nb_fn *f = nb_fn_create(f_body, &st, 1, 2), *jf = nb_jit(f);
  nb_tensor *x = rand_t(NB_SHAPE(4, 3), 4), *o[2], *e[2];
  cr_assert(nb_call(jf, &x, o) == NB_OK);
  cr_assert(nb_assign(st.w, nb_mul_scalar(st.w, -3.0)) == NB_OK);
  cr_assert(nb_call(jf, &x, o) == NB_OK);
  cr_assert(nb_call(f, &x, e) == NB_OK);
  assert_close(o[0], e[0], 1e-12);
  cr_assert_eq(st.calls, 3, "one trace, one capture guard, one eager call");
  nb_fn_release(jf);
  nb_fn_release(f);
}

static nb_status loss_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *h = nb_tanh(nb_matmul(in[0], in[1]));
  out[0] = nb_mean(nb_square(nb_sub(h, in[2])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

Test(jit, composes_with_grad_both_ways_and_nested) {
  nb_tensor *in[3] = {rand_t(NB_SHAPE(5, 3), 7), rand_t(NB_SHAPE(3, 2), 8),
                      rand_t(NB_SHAPE(5, 2), 9)};
  nb_fn *f = nb_fn_create(loss_body, NULL, 3, 1);
  nb_fn *g = nb_grad(f, NB_AXES(0, 1));
  nb_fn *jf = nb_jit(f), *g_of_jit = nb_grad(jf, NB_AXES(0, 1)), *jit_of_g = nb_jit(g);
  nb_fn *jj = nb_jit(jit_of_g);
  nb_tensor *ref[2], *a[2], *b[2], *c[2];
  cr_assert(nb_call(g, in, ref) == NB_OK);
  for (int it = 0; it < 2; it++) {
    cr_assert(nb_call(g_of_jit, in, a) == NB_OK, "%s", nb_last_error());
    cr_assert(nb_call(jit_of_g, in, b) == NB_OK, "%s", nb_last_error());
    cr_assert(nb_call(jj, in, c) == NB_OK, "%s", nb_last_error());
    for (int k = 0; k < 2; k++) {
      assert_close(a[k], ref[k], 1e-12);
      assert_close(b[k], ref[k], 1e-12);
      assert_close(c[k], ref[k], 1e-12);
    }
  }
  nb_fn_release(jj);
  nb_fn_release(jit_of_g);
  nb_fn_release(g_of_jit);
  nb_fn_release(jf);
  nb_fn_release(g);
  nb_fn_release(f);
}

Test(jit, imperative_backward_through_a_jitted_call) {
  nb_tensor *in[3] = {rand_t(NB_SHAPE(5, 3), 17), rand_t(NB_SHAPE(3, 2), 18),
                      rand_t(NB_SHAPE(5, 2), 19)};
  nb_fn *f = nb_fn_create(loss_body, NULL, 3, 1), *g = nb_grad(f, NB_AXES(1)), *jf = nb_jit(f);
  nb_tensor *ref;
  cr_assert(nb_call(g, in, &ref) == NB_OK);
  nb_set_requires_grad(in[1], true);
  for (int it = 0; it < 2; it++) {
    nb_zero_grad(in[1]);
    nb_tensor *loss;
    cr_assert(nb_call(jf, in, &loss) == NB_OK, "%s", nb_last_error());
    cr_assert(nb_backward(loss) == NB_OK, "%s", nb_last_error());
    assert_close(nb_grad_of(in[1]), ref, 1e-12);
  }
  nb_fn_release(jf);
  nb_fn_release(g);
  nb_fn_release(f);
}

/* A body closing over a traced value of an enclosing transform. */
typedef struct closure {
  nb_tensor *c;
} closure;

static nb_status scaled(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = nb_mul(in[0], ((closure *)user)->c);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status outer(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  closure cl = {.c = in[0]};
  nb_fn *inner = nb_fn_create(scaled, &cl, 1, 1), *ji = nb_jit(inner);
  nb_tensor *two = nb_scalar(2.0, NB_F64), *y;
  nb_status st = nb_call(ji, &two, &y);
  nb_fn_release(ji);
  nb_fn_release(inner);
  if (st) return st;
  out[0] = nb_sum(nb_mul(y, in[0]), NB_ALL, false); /* 2 * sum(x^2) */
  return out[0] ? NB_OK : nb_last_status();
}

Test(jit, closure_over_a_traced_value_is_differentiated) {
  nb_fn *f = nb_fn_create(outer, NULL, 1, 1), *g = nb_grad(f, NB_AXES(0));
  nb_tensor *x = rand_t(NB_SHAPE(4), 21), *gx;
  cr_assert(nb_call(g, &x, &gx) == NB_OK, "%s", nb_last_error());
  assert_close(gx, nb_mul_scalar(x, 4.0), 1e-12);
  nb_fn_release(g);
  nb_fn_release(f);
}

Test(jit, errors) {
  nb_clear_error();
  cr_assert_null(nb_jit(NULL));
  cr_assert_eq(nb_last_status(), NB_ERR_NULL);
  nb_clear_error();
}
