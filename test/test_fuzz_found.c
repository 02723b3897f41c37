/* test/test_fuzz_found.c — defects the libFuzzer target (test/fuzz/) found, each a
 * test; their inputs are in test/fuzz/corpus/ (regress-*), run by make fuzz-ci. */
#include "common.h"

TestSuite(fuzz_found, .init = tc_setup, .fini = tc_teardown);

static nb_status unsqueeze_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_unsqueeze(in[0], 0);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status matmul_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_matmul(in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}

/* A value of rank 8 inside a vmapped function has no room for the batch dim: the
 * batching rules wrote a ninth dim past nb_shape's array (a stack overflow in
 * matmul's rule). */
Test(fuzz_found, vmap_of_a_rank_8_value_is_a_shape_error) {
  nb_fn *f = nb_fn_create(unsqueeze_body, NULL, 1, 1), *vf = nb_vmap(f, NULL, NULL);
  nb_tensor *x = nb_ones(NB_SHAPE(2, 1, 1, 1, 1, 1, 1, 3), NB_F32), *y = NULL;
  cr_assert_eq(nb_call(vf, &x, &y), NB_ERR_SHAPE);
  tc_assert_error(NB_ERR_SHAPE, "nb_vmap");
  cr_assert_null(y);

  nb_fn *g = nb_fn_create(matmul_body, NULL, 2, 1);
  nb_fn *vg = nb_vmap(g, (const int[]){NB_NOT_MAPPED, 0}, NULL);
  nb_tensor *in[2] = {nb_ones(NB_SHAPE(1, 1, 1, 1, 1, 1, 2, 3), NB_F32),
                      nb_ones(NB_SHAPE(4, 3, 2), NB_F32)};
  cr_assert_eq(nb_call(vg, in, &y), NB_ERR_SHAPE);
  tc_assert_error(NB_ERR_SHAPE, "nb_vmap");
  nb_fn_release(vg);
  nb_fn_release(g);
  nb_fn_release(vf);
  nb_fn_release(f);
}

/* nb_assign of a value on another device rebound dst to that device's memory
 * while dst kept its own device: the next read of dst faulted. The value now
 * moves to dst's device. */
Test(fuzz_found, assign_moves_the_value_to_the_device_of_dst) {
  double a[3] = {1, 2, 3}, b[3] = {-4, 5, 0.5};
  for (int k = 0; k < 2; k++) {
    nb_device da = k ? NB_CPU : NB_EMU(0), db = k ? NB_EMU(1) : NB_CPU;
    nb_tensor *dst = nb_to_device(tc_tensor(a, NB_SHAPE(3), NB_F64), da);
    nb_tensor *src = nb_to_device(tc_tensor(b, NB_SHAPE(3), NB_F64), db);
    cr_assert_eq(nb_assign(dst, src), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_device_of(dst).kind, da.kind);
    cr_assert_eq(nb_device_of(dst).index, da.index);
    tc_assert_close(nb_sum(dst, NB_ALL, false), (double[]){1.5}, NB_SCALAR_SHAPE);
    tc_assert_close(dst, b, NB_SHAPE(3));
  }
}

/* Each operand of a broadcast obeys the 2^48-element bound but the result did
 * not: [0, 2^47, 1] + [3] made an empty tensor of shape [0, 2^47, 3], whose
 * non-zero dims overflow the bound its strides rely on. */
Test(fuzz_found, a_result_shape_over_the_element_bound_is_an_overflow_error) {
  nb_tensor *a = nb_zeros(NB_SHAPE(0, (int64_t)1 << 47, 1), NB_F32);
  nb_tensor *b = nb_zeros(NB_SHAPE(3), NB_F32);
  cr_assert_not_null(a, "%s", nb_last_error());
  cr_assert_null(nb_add(a, b));
  tc_assert_error(NB_ERR_OVERFLOW, "nb_add");
}
