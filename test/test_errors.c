/* test/test_errors.c — errors name the public function the user called (issue
 * 14.8, 14.10), checked by status and by message text; and the integer
 * overflow audit of products of dims, strides and sizes (0-size dims
 * included): absurd sizes fail with a clean error naming the function, empty
 * shapes beside huge dims work, and huge steps or pads go through every
 * transform (make test SAN=1 runs these under UBSan, where any signed overflow
 * aborts).
 *
 * Composites (nb_cross_entropy, nb_embedding, nb_attention, nb_mse, ...) are
 * built from other public ops; an error an inner op finds names the composite
 * first, and the index errors found at realization name it through the index
 * ops' caller attribute (src/ops/index.h), also under nb_grad, vmap and jit. */
#include "common.h"

TestSuite(errors, .init = tc_setup, .fini = tc_teardown);

/* Asserts that call returned NULL with status st and a message that starts
 * with "fn:" (the function the user called). */
#define assert_named(call, st, fn)                                                                 \
  do {                                                                                             \
    nb_clear_error();                                                                              \
    const void *r_ = (call);                                                                       \
    cr_assert_null(r_, "%s accepted its arguments", #call);                                        \
    cr_assert_eq(nb_last_status(), (st), "%s: status %s (%s)", #call,                              \
                 nb_status_str(nb_last_status()), nb_last_error());                                \
    cr_assert(!strncmp(nb_last_error(), fn ":", strlen(fn ":")), "%s: \"%s\" does not name %s",    \
              #call, nb_last_error(), fn);                                                         \
    nb_clear_error();                                                                              \
  } while (0)

/* Realizes t (a lazy result the call accepted) and asserts the realization
 * fails with NB_ERR_INDEX and a message naming fn and containing what. */
static void assert_index_error(nb_tensor *t, const char *fn, const char *what) {
  cr_assert(t, "%s refused its arguments: %s", fn, nb_last_error());
  cr_assert_eq(nb_eval(&t, 1), NB_ERR_INDEX, "%s: %s", fn, nb_last_error());
  cr_assert(!strncmp(nb_last_error(), fn, strlen(fn)), "\"%s\" does not name %s", nb_last_error(),
            fn);
  cr_assert(strstr(nb_last_error(), what), "\"%s\" lacks \"%s\"", nb_last_error(), what);
  nb_clear_error();
}

static nb_tensor *i64s(const int64_t *v, nb_shape s) { return nb_from_data(v, s, NB_I64); }

/* ---- index errors of composites --------------------------------------------------------- */
Test(errors, cross_entropy_labels_outside_the_classes_name_cross_entropy) {
  nb_tensor *logits = nb_randn(NB_SHAPE(2, 3), NB_F32);
  assert_index_error(nb_cross_entropy(logits, i64s((int64_t[]){0, 3}, NB_SHAPE(2))),
                     "nb_cross_entropy", "label 3 is not a class of [0, 3)");
  /* -1 is no class (PyTorch raises; there is no ignore_index), not the last one */
  assert_index_error(nb_cross_entropy(logits, i64s((int64_t[]){-1, 2}, NB_SHAPE(2))),
                     "nb_cross_entropy", "label -1 is not a class of [0, 3)");
  nb_tensor *i32 = nb_cast(i64s((int64_t[]){2, -3}, NB_SHAPE(2)), NB_I32);
  assert_index_error(nb_cross_entropy(logits, i32), "nb_cross_entropy", "label -3");
  /* valid labels still work, and match the log-softmax picked by hand */
  double got = nb_item(nb_cross_entropy(logits, i64s((int64_t[]){0, 2}, NB_SHAPE(2))));
  double *lp = tc_read(nb_log_softmax(logits, -1));
  cr_assert_float_eq(got, -(lp[0] + lp[5]) / 2, 1e-6);
  free(lp);
}

/* The gradient's scatter and the forward's gather carry the same caller; a
 * failed backward leaves .grad as it was (and leaks nothing: the pending
 * gradient would hold the forward graph, which holds the leaf). */
Test(errors, cross_entropy_label_errors_name_it_under_backward) {
  nb_tensor *logits = nb_set_requires_grad(nb_randn(NB_SHAPE(2, 3), NB_F32), true);
  nb_tensor *good = nb_cross_entropy(logits, i64s((int64_t[]){1, 2}, NB_SHAPE(2)));
  cr_assert_eq(nb_backward(good), NB_OK, "%s", nb_last_error());
  double *before = tc_read(nb_grad_of(logits));
  nb_tensor *loss = nb_cross_entropy(logits, i64s((int64_t[]){1, -1}, NB_SHAPE(2)));
  cr_assert_eq(nb_backward(loss), NB_ERR_INDEX, "%s", nb_last_error());
  cr_assert(!strncmp(nb_last_error(), "nb_cross_entropy: label -1", 26), "%s", nb_last_error());
  nb_clear_error();
  tc_assert_close_tol(nb_grad_of(logits), before, NB_SHAPE(2, 3), 0);
  free(before);
}

static nb_status xent_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_cross_entropy(in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}

Test(errors, cross_entropy_label_errors_name_it_under_transforms) {
  nb_tensor *in[2] = {nb_randn(NB_SHAPE(2, 4), NB_F32), i64s((int64_t[]){4, 0}, NB_SHAPE(2))};
  nb_tensor *batch[2] = {nb_randn(NB_SHAPE(3, 2, 4), NB_F32),
                         i64s((int64_t[]){0, 1, 2, 3, -1, 0}, NB_SHAPE(3, 2))};
  nb_fn *f = nb_fn_create(xent_body, NULL, 2, 1), *g = nb_grad(f, NB_AXES(0));
  nb_fn *fns[4] = {nb_fn_retain(g), nb_jit(f), nb_jit(g), nb_vmap(f, NULL, NULL)};
  for (int k = 0; k < 4; k++) {
    nb_tensor *out[1];
    nb_status st = nb_call(fns[k], k == 3 ? batch : in, out);
    if (st == NB_OK) st = nb_eval(out, 1);
    cr_assert_eq(st, NB_ERR_INDEX, "transform %d: %s", k, nb_last_error());
    cr_assert(!strncmp(nb_last_error(), "nb_cross_entropy: label", 23), "transform %d: %s", k,
              nb_last_error());
    nb_clear_error();
    nb_fn_release(fns[k]);
  }
  nb_fn_release(g);
  nb_fn_release(f);
}

Test(errors, embedding_rows_outside_the_table_name_embedding) {
  nb_tensor *table = nb_randn(NB_SHAPE(4, 2), NB_F32);
  assert_index_error(nb_embedding(table, i64s((int64_t[]){1, 4}, NB_SHAPE(2))), "nb_embedding",
                     "index 4 is not a row of [0, 4)");
  assert_index_error(nb_embedding(table, i64s((int64_t[]){-1}, NB_SHAPE(1))), "nb_embedding",
                     "index -1");
  assert_named(nb_embedding(table, nb_ones(NB_SHAPE(2), NB_F32)), NB_ERR_DTYPE, "nb_embedding");
  /* its gradient (a scatter) names it too */
  nb_tensor *w = nb_set_requires_grad(nb_randn(NB_SHAPE(4, 2), NB_F32), true);
  nb_tensor *loss = nb_sum(nb_embedding(w, i64s((int64_t[]){0, 9}, NB_SHAPE(2))), NB_ALL, false);
  cr_assert_eq(nb_backward(loss), NB_ERR_INDEX);
  cr_assert(!strncmp(nb_last_error(), "nb_embedding: index 9", 21), "%s", nb_last_error());
  nb_clear_error();
  /* the ops themselves keep NumPy's negative indices */
  double *v = tc_read(nb_take(nb_arange(0, 4, 1, NB_F32), i64s((int64_t[]){-1}, NB_SHAPE(1)), 0));
  cr_assert_eq(v[0], 3);
  free(v);
}

/* ---- argument errors of composites -------------------------------------------------------- */
Test(errors, attention_shape_errors_name_attention) {
  nb_tensor *q = nb_randn(NB_SHAPE(2, 3, 4), NB_F32), *k5 = nb_randn(NB_SHAPE(5, 3, 4), NB_F32);
  nb_tensor *bad_mask = nb_gt_scalar(nb_randn(NB_SHAPE(5, 7), NB_F32), 0);
  assert_named(nb_attention(q, q, q, bad_mask), NB_ERR_SHAPE, "nb_attention");
  nb_attention(q, q, q, bad_mask); /* the message gives both shapes */
  cr_assert(strstr(nb_last_error(), "mask [5,7]") && strstr(nb_last_error(), "[2,3,3]"), "%s",
            nb_last_error());
  nb_clear_error();
  assert_named(nb_attention(q, k5, k5, NULL), NB_ERR_SHAPE, "nb_attention");
  /* a mask that grows the scores is refused too; one that broadcasts is fine */
  nb_tensor *grow = nb_gt_scalar(nb_randn(NB_SHAPE(4, 2, 3, 3), NB_F32), 0);
  assert_named(nb_attention(q, q, q, grow), NB_ERR_SHAPE, "nb_attention");
  nb_tensor *causal =
      nb_ge(nb_reshape(nb_arange(0, 3, 1, NB_I64), NB_SHAPE(3, 1)), nb_arange(0, 3, 1, NB_I64));
  nb_tensor *y = nb_attention(q, q, q, causal);
  cr_assert(y && nb_eval(&y, 1) == NB_OK, "%s", nb_last_error());
}

Test(errors, composites_name_themselves) {
  nb_tensor *a = nb_ones(NB_SHAPE(2, 3), NB_F32), *b = nb_ones(NB_SHAPE(4, 5), NB_F32);
  assert_named(nb_mse(a, b), NB_ERR_SHAPE, "nb_mse");
  assert_named(nb_mse(NULL, a), NB_ERR_NULL, "nb_mse");
  assert_named(nb_cross_entropy(a, b), NB_ERR_SHAPE, "nb_cross_entropy");
  assert_named(nb_cross_entropy(a, nb_zeros(NB_SHAPE(3), NB_I64)), NB_ERR_SHAPE,
               "nb_cross_entropy");
  assert_named(nb_layer_norm(a, b, NULL, 1e-5), NB_ERR_SHAPE, "nb_layer_norm");
  assert_named(nb_rms_norm(a, b, 1e-5), NB_ERR_SHAPE, "nb_rms_norm");
  assert_named(nb_dropout(a, 1.5, true), NB_ERR_ARG, "nb_dropout");
  assert_named(nb_embedding(a, nb_zeros(NB_SHAPE(1, 1, 1, 1, 1, 1, 1, 1), NB_I64)), NB_ERR_SHAPE,
               "nb_embedding");
  assert_named(nb_outer(a, NULL), NB_ERR_NULL, "nb_outer");
  assert_named(nb_einsum("ij,jk->ik", (nb_tensor *[]){a, a}, 2), NB_ERR_SHAPE, "nb_einsum");
  assert_named(nb_stack((nb_tensor *[]){a, b}, 2, 0), NB_ERR_SHAPE, "nb_stack");
  assert_named(nb_flatten(a, 1, 0), NB_ERR_AXIS, "nb_flatten");
  assert_named(nb_conv2d(nb_ones(NB_SHAPE(1, 2, 5, 5), NB_F32),
                         nb_ones(NB_SHAPE(3, 2, 3, 3), NB_F32), nb_ones(NB_SHAPE(4), NB_F32), NULL),
               NB_ERR_SHAPE, "nb_conv2d");
  /* the first error is kept: a later composite does not rename it */
  nb_mse(a, b);
  nb_attention(a, a, a, nb_gt_scalar(b, 0));
  cr_assert(!strncmp(nb_last_error(), "nb_mse: nb_sub:", 15), "%s", nb_last_error());
  nb_clear_error();
}

Test(errors, creation_errors_name_the_function) {
  nb_shape neg = NB_SHAPE(-1, 2);
  assert_named(nb_zeros(neg, NB_F32), NB_ERR_SHAPE, "nb_zeros");
  assert_named(nb_ones(neg, NB_F32), NB_ERR_SHAPE, "nb_ones");
  assert_named(nb_full(neg, 1, NB_F32), NB_ERR_SHAPE, "nb_full");
  assert_named(nb_rand(neg, NB_F32), NB_ERR_SHAPE, "nb_rand");
  assert_named(nb_randn(NB_SHAPE(2), NB_I32), NB_ERR_DTYPE, "nb_randn");
  assert_named(nb_glorot_uniform(NB_SHAPE(2), NB_I32), NB_ERR_DTYPE, "nb_glorot_uniform");
  assert_named(nb_ones(NB_SHAPE(2), (nb_dtype)99), NB_ERR_DTYPE, "nb_ones");
  assert_named(nb_scalar(1, (nb_dtype)99), NB_ERR_DTYPE, "nb_scalar");
  assert_named(nb_arange(0, 1, 0, NB_F32), NB_ERR_ARG, "nb_arange");
  assert_named(nb_from_data(NULL, NB_SHAPE(2), NB_F32), NB_ERR_NULL, "nb_from_data");
}

/* ---- the overflow audit ----------------------------------------------------------------- */
#define BIG INT64_MAX
#define P40 ((int64_t)1 << 40)

Test(errors, absurd_sizes_fail_cleanly_naming_the_function) {
  nb_tensor *a = nb_ones(NB_SHAPE(2, 3), NB_F32), *e = nb_zeros(NB_SHAPE(0, 3), NB_F32);
  assert_named(nb_zeros(NB_SHAPE(P40, P40), NB_F32), NB_ERR_OVERFLOW, "nb_zeros");
  assert_named(nb_full(NB_SHAPE(0, P40, P40), 1, NB_F32), NB_ERR_OVERFLOW, "nb_full");
  assert_named(nb_rand(NB_SHAPE(P40, P40), NB_F32), NB_ERR_OVERFLOW, "nb_rand");
  assert_named(nb_tile(a, NB_SHAPE(P40, P40)), NB_ERR_OVERFLOW, "nb_tile");
  assert_named(nb_tile(a, NB_SHAPE(BIG, 2)), NB_ERR_OVERFLOW, "nb_tile");
  assert_named(nb_tile(e, NB_SHAPE(BIG, BIG)), NB_ERR_OVERFLOW, "nb_tile");
  assert_named(nb_repeat(a, BIG, 0), NB_ERR_OVERFLOW, "nb_repeat");
  assert_named(nb_repeat(e, BIG, 1), NB_ERR_OVERFLOW, "nb_repeat");
  assert_named(nb_pad(a, (int64_t[]){BIG, BIG, 0, 0}, 0), NB_ERR_OVERFLOW, "nb_pad");
  assert_named(nb_pad(e, (int64_t[]){0, 0, BIG, 1}, 0), NB_ERR_OVERFLOW, "nb_pad");
  assert_named(nb_arange(0, 1e300, 1e-300, NB_F32), NB_ERR_OVERFLOW, "nb_arange");
  assert_named(nb_arange(0, INFINITY, 1, NB_F32), NB_ERR_OVERFLOW, "nb_arange");
  assert_named(nb_arange(0, NAN, 1, NB_F32), NB_ERR_ARG, "nb_arange");
  assert_named(nb_one_hot(nb_zeros(NB_SHAPE(0), NB_I64), BIG, NB_F32), NB_ERR_OVERFLOW,
               "nb_one_hot");
  assert_named(nb_broadcast_to(nb_ones(NB_SHAPE(1), NB_F32), NB_SHAPE(P40, P40, 0)),
               NB_ERR_OVERFLOW, "nb_broadcast_to");
  assert_named(nb_reshape(e, NB_SHAPE(P40, P40, -1)), NB_ERR_SHAPE, "nb_reshape");
  assert_named(
      nb_take(nb_ones(NB_SHAPE(P40 / 1024, 0), NB_F32), nb_zeros(NB_SHAPE(1 << 20, 0), NB_I64), 1),
      NB_ERR_OVERFLOW, "nb_take");
  nb_tensor *x4 = nb_ones(NB_SHAPE(1, 1, 4, 4), NB_F32),
            *w4 = nb_ones(NB_SHAPE(1, 1, 2, 2), NB_F32);
  nb_conv2d_params pad = {{1, 1}, {INT32_MAX, INT32_MAX}, {1, 1}, 1};
  nb_conv2d_params dil = {{1, 1}, {0, 0}, {INT32_MAX, INT32_MAX}, 1};
  assert_named(nb_conv2d(x4, w4, NULL, &pad), NB_ERR_OVERFLOW, "nb_conv2d");
  assert_named(nb_conv2d(x4, w4, NULL, &dil), NB_ERR_SHAPE, "nb_conv2d");
  assert_named(nb_max_pool2d(x4, INT32_MAX, INT32_MAX, 1, 1, 0, 0), NB_ERR_SHAPE, "nb_max_pool2d");
  assert_named(nb_max_pool2d(x4, 2, 2, INT32_MIN, 1, 0, 0), NB_ERR_ARG, "nb_max_pool2d");
  nb_tensor *parts[2];
  cr_assert_eq(nb_split(a, (int64_t[]){BIG, BIG}, 2, 0, parts), NB_ERR_SHAPE);
  tc_assert_error(NB_ERR_SHAPE, "nb_split: sizes sum to more than");
  int axes[] = {INT32_MIN, INT32_MAX};
  for (int k = 0; k < 2; k++) {
    assert_named(nb_unsqueeze(a, axes[k]), NB_ERR_AXIS, "nb_unsqueeze");
    assert_named(nb_softmax(a, axes[k]), NB_ERR_AXIS, "nb_softmax");
    assert_named(nb_sum(a, NB_AXES(axes[k]), false), NB_ERR_AXIS, "nb_sum");
    assert_named(nb_concat((nb_tensor *[]){a, a}, 2, axes[k]), NB_ERR_AXIS, "nb_concat");
    assert_named(nb_flatten(a, axes[k], 1), NB_ERR_AXIS, "nb_flatten");
  }
}

/* Shapes with a 0-size dim beside dims whose product is large but below 2^48:
 * accepted, and every op and derivative over them runs (no stride or offset
 * overflow), giving empty results of the right shapes. */
Test(errors, empty_tensors_beside_huge_dims_work_under_transforms) {
  nb_tensor *e = nb_set_requires_grad(nb_zeros(NB_SHAPE(0, P40, 64), NB_F32), true);
  nb_tensor *y = nb_tile(nb_pad(nb_flatten(e, 1, 2), (int64_t[]){0, 0, 3, 4}, 1.0), NB_SHAPE(2, 1));
  cr_assert(y, "%s", nb_last_error());
  nb_shape s = nb_shape_of(y);
  cr_assert(s.ndim == 2 && s.dims[0] == 0 && s.dims[1] == P40 * 64 + 7);
  nb_tensor *loss = nb_sum(nb_mul(nb_transpose(y), nb_scalar(2, NB_F32)), NB_ALL, false);
  cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_item(loss), 0);
  nb_shape g = nb_shape_of(nb_grad_of(e));
  cr_assert(nbi_shape_eq(&g, &(nb_shape){3, {0, P40, 64}}));
}

static int64_t slice_step;
static nb_status slice_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  /* rows from the first forward, from the last backward */
  int64_t starts[2] = {slice_step > 0 ? 0 : -1, 1}, stops[2] = {NB_END, NB_END},
          steps[2] = {slice_step, 1};
  out[0] = nb_sum(nb_square(nb_slice(in[0], starts, stops, steps)), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* A step far beyond the dim selects one element: its stride is never
 * multiplied by the step, in the forward, the gradient (a dilation by the
 * step), the JVP and the batched forms. */
Test(errors, huge_slice_steps_under_transforms) {
  int64_t steps[4] = {BIG, INT64_MIN + 1, (int64_t)1 << 50, -((int64_t)1 << 50)};
  double x[12];
  for (int i = 0; i < 12; i++)
    x[i] = i + 1;
  nb_tensor *t = tc_tensor(x, NB_SHAPE(3, 4), NB_F64);
  for (int k = 0; k < 4; k++) {
    slice_step = steps[k];
    int row = steps[k] > 0 ? 0 : 2; /* the one row selected */
    double want[12] = {0};
    for (int j = 1; j < 4; j++)
      want[row * 4 + j] = 2 * x[row * 4 + j];
    nb_fn *f = nb_fn_create(slice_body, NULL, 1, 1), *g = nb_grad(f, NB_AXES(0));
    nb_fn *jg = nb_jvp_fn(g), *vf = nb_vmap(g, NULL, NULL);
    nb_tensor *out[2];
    cr_assert_eq(nb_call(g, &t, out), NB_OK, "step %lld: %s", (long long)steps[k], nb_last_error());
    tc_assert_close(out[0], want, NB_SHAPE(3, 4));
    cr_assert_eq(nb_call(jg, (nb_tensor *[]){t, t}, out), NB_OK, "%s", nb_last_error());
    tc_assert_close(out[1], want, NB_SHAPE(3, 4)); /* the Hessian is 2 on the slice: 2 * t there */
    nb_tensor *tb = nb_stack((nb_tensor *[]){t, t}, 2, 0);
    cr_assert_eq(nb_call(vf, &tb, out), NB_OK, "%s", nb_last_error());
    double wantb[24];
    memcpy(wantb, want, sizeof want);
    memcpy(wantb + 12, want, sizeof want);
    tc_assert_close(out[0], wantb, NB_SHAPE(2, 3, 4));
    nb_fn_release(vf), nb_fn_release(jg), nb_fn_release(g), nb_fn_release(f);
  }
}
