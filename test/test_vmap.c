/* test/test_vmap.c — nb_vmap's own behaviour: argument errors, unbatched
 * outputs, out_axes NB_NOT_MAPPED. (Per-op batching rules: test_vmap_*.c and
 * test_matrix.c.) */
#include "common.h"

static nb_status add_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_add(in[0], in[1]);
  out[1] = nb_mul_scalar(in[1], 3.0); /* depends on input 1 only */
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

static nb_fn *add_fn(void) { return nb_fn_create(add_body, NULL, 2, 2); }

static void expect_error(nb_fn *v, nb_tensor *const *in, nb_status want, const char *needle) {
  nb_tensor *out[2];
  nb_clear_error();
  cr_assert_eq(nb_call(v, in, out), want, "got %s", nb_last_error());
  cr_assert(strstr(nb_last_error(), needle), "message: %s", nb_last_error());
  cr_assert_null(out[0]);
  nb_clear_error();
}

Test(vmap, mismatched_batch_sizes_are_an_error) {
  nb_fn *f = add_fn();
  int axes[2] = {0, 1};
  nb_fn *v = nb_vmap(f, axes, NULL);
  nb_tensor *in[2] = {nb_zeros(NB_SHAPE(3, 4), NB_F32), nb_zeros(NB_SHAPE(4, 4), NB_F32)};
  expect_error(
      v, in, NB_ERR_SHAPE,
      "mapped inputs have different sizes: input 0 has 3 along axis 0, input 1 has 4 along axis 1");
  nb_fn_release(v);
  nb_fn_release(f);
}

Test(vmap, argument_errors) {
  nb_fn *f = add_fn();
  nb_tensor *in[2] = {nb_zeros(NB_SHAPE(3, 4), NB_F32), nb_zeros(NB_SHAPE(3, 4), NB_F32)};
  int none[2] = {NB_NOT_MAPPED, NB_NOT_MAPPED}, far[2] = {0, -3};
  nb_fn *v1 = nb_vmap(f, none, NULL), *v2 = nb_vmap(f, far, NULL);
  expect_error(v1, in, NB_ERR_ARG, "no input is mapped");
  expect_error(v2, in, NB_ERR_ARG, "in_axes[1] = -3 is out of range for input 1 of shape [3,4]");
  int out_bad[2] = {3, 0}, out_unmapped[2] = {NB_NOT_MAPPED, 0};
  nb_fn *v3 = nb_vmap(f, NULL, out_bad), *v4 = nb_vmap(f, NULL, out_unmapped);
  expect_error(v3, in, NB_ERR_ARG, "out_axes[0] = 3 is out of range");
  expect_error(v4, in, NB_ERR_ARG,
               "out_axes[0] is NB_NOT_MAPPED but output 0 depends on a mapped input");
  nb_clear_error();
  cr_assert_null(nb_vmap(NULL, NULL, NULL));
  cr_assert_eq(nb_last_status(), NB_ERR_NULL);
  nb_clear_error();
  nb_fn_release(v1), nb_fn_release(v2), nb_fn_release(v3), nb_fn_release(v4);
  nb_fn_release(f);
}

Test(vmap, unbatched_outputs_broadcast_or_stay_unmapped) {
  nb_fn *f = add_fn();
  const double a[6] = {1, 2, 3, 4, 5, 6}, b[2] = {10, 20};
  nb_tensor *in[2] = {nb_from_data(a, NB_SHAPE(3, 2), NB_F64),
                      nb_from_data(b, NB_SHAPE(2), NB_F64)};
  int in_axes[2] = {0, NB_NOT_MAPPED}, out_b[2] = {-1, 1}, out_u[2] = {0, NB_NOT_MAPPED};
  nb_fn *vb = nb_vmap(f, in_axes, out_b), *vu = nb_vmap(f, in_axes, out_u);
  nb_tensor *o[2];
  cr_assert(nb_call(vb, in, o) == NB_OK, "%s", nb_last_error());
  /* out 0 = a + b with the batch last: [2,3]; out 1 = 3b broadcast along axis 1: [2,3] */
  cr_assert(nb_shape_of(o[0]).ndim == 2 && nb_shape_of(o[0]).dims[0] == 2);
  double *x = tc_read(o[0]), *y = tc_read(o[1]);
  for (int i = 0; i < 2; i++)
    for (int bi = 0; bi < 3; bi++) {
      cr_assert_float_eq(x[i * 3 + bi], a[bi * 2 + i] + b[i], 0);
      cr_assert_float_eq(y[i * 3 + bi], 3 * b[i], 0);
    }
  free(x), free(y);
  cr_assert(nb_call(vu, in, o) == NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_shape_of(o[1]).ndim, 1, "NB_NOT_MAPPED keeps an unbatched output as is");
  nb_fn_release(vb), nb_fn_release(vu);
  nb_fn_release(f);
}
