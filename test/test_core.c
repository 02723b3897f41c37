/* test/test_core.c — tensors, dtypes, shapes, scopes, errors, RNG, printing. */
#include "common.h"

TestSuite(core, .init = tc_setup, .fini = tc_teardown);

Test(core, from_data_round_trips_every_dtype) {
  double x[6] = {0, 1, -2, 3.5, 100, -0.25};
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    double ref[6];
    memcpy(ref, x, sizeof x);
    tc_round_to(ref, 6, (nb_dtype)dt);
    nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), (nb_dtype)dt);
    cr_assert(nb_is_realized(t));
    cr_assert_eq((int)nb_dtype_of(t), dt);
    tc_assert_close_tol(t, ref, NB_SHAPE(2, 3), 0);
  }
}

Test(core, queries_report_shape_and_dtype) {
  nb_tensor *t = nb_zeros(NB_SHAPE(2, 3, 4), NB_F64);
  cr_assert_eq(nb_ndim(t), 3);
  cr_assert_eq(nb_numel(t), 24);
  cr_assert_eq(nb_dtype_of(t), NB_F64);
  char b[32];
  cr_assert_str_eq(nb_shape_str(nb_shape_of(t), b, sizeof b), "[2,3,4]");
  cr_assert_eq(nb_ndim(NULL), -1);
  cr_assert_eq(nb_numel(NULL), -1);
}

Test(core, full_ones_zeros_scalar) {
  double ref7[4] = {7, 7, 7, 7}, ref1[4] = {1, 1, 1, 1}, ref0[4] = {0};
  tc_assert_close(nb_full(NB_SHAPE(4), 7, NB_I32), ref7, NB_SHAPE(4));
  tc_assert_close(nb_ones(NB_SHAPE(2, 2), NB_BF16), ref1, NB_SHAPE(2, 2));
  tc_assert_close(nb_zeros(NB_SHAPE(4), NB_BOOL), ref0, NB_SHAPE(4));
  cr_assert_eq(nb_item(nb_scalar(2.5, NB_F16)), 2.5);
  cr_assert_eq(nb_ndim(nb_scalar(1, NB_F32)), 0);
}

Test(core, size_zero_tensors) {
  nb_tensor *t = nb_zeros(NB_SHAPE(3, 0, 2), NB_F32);
  cr_assert_eq(nb_numel(t), 0);
  float dummy;
  cr_assert_eq(nb_to_host(t, &dummy, 0), NB_OK);
}

Test(core, arange_follows_numpy) {
  double r1[5] = {0, 1, 2, 3, 4};
  tc_assert_close(nb_arange(0, 5, 1, NB_I64), r1, NB_SHAPE(5));
  double r2[4] = {1, 0.5, 0, -0.5};
  tc_assert_close(nb_arange(1, -1, -0.5, NB_F64), r2, NB_SHAPE(4));
  cr_assert_eq(nb_numel(nb_arange(3, 1, 1, NB_F32)), 0);
  cr_assert_null(nb_arange(0, 1, 0, NB_F32));
  tc_assert_error(NB_ERR_ARG, "nb_arange");
}

Test(core, promotion_follows_jax_lattice) {
  cr_assert_eq(nb_promote_types(NB_I32, NB_F16), NB_F16);
  cr_assert_eq(nb_promote_types(NB_F16, NB_BF16), NB_F32);
  cr_assert_eq(nb_promote_types(NB_I32, NB_I64), NB_I64);
  cr_assert_eq(nb_promote_types(NB_BOOL, NB_I32), NB_I32);
  cr_assert_eq(nb_promote_types(NB_F32, NB_F64), NB_F64);
  cr_assert_eq(nb_promote_types(NB_I64, NB_F32), NB_F32);
  cr_assert_eq(nb_promote_types(NB_BOOL, NB_BOOL), NB_BOOL);
  cr_assert_eq(nb_promote_types((nb_dtype)99, NB_F32), NB_DTYPE_COUNT);
}

Test(core, half_conversions_are_exact_round_to_nearest_even) {
  /* f16: 1 + 2^-11 is a tie between 1 and 1 + 2^-10: rounds to even (1). */
  cr_assert_eq(nbi_f16_to_f32(nbi_f32_to_f16(1.0f + 0x1.0p-11f)), 1.0f);
  cr_assert_eq(nbi_f16_to_f32(nbi_f32_to_f16(1.0f + 3 * 0x1.0p-11f)), 1.0f + 0x1.0p-9f);
  cr_assert_eq(nbi_f16_to_f32(nbi_f32_to_f16(65504.0f)), 65504.0f);
  cr_assert(isinf(nbi_f16_to_f32(nbi_f32_to_f16(70000.0f))));
  cr_assert_eq(nbi_f16_to_f32(nbi_f32_to_f16(0x1.0p-24f)), 0x1.0p-24f); /* smallest subnormal */
  cr_assert(isnan(nbi_f16_to_f32(nbi_f32_to_f16(NAN))));
  cr_assert_eq(nbi_bf16_to_f32(nbi_f32_to_bf16(1.0f + 0x1.0p-8f)), 1.0f);
  cr_assert_eq(nbi_bf16_to_f32(nbi_f32_to_bf16(3.0f)), 3.0f);
  cr_assert(isnan(nbi_bf16_to_f32(nbi_f32_to_bf16(NAN))));
}

Test(core, seeded_rng_is_deterministic_and_in_range) {
  nb_seed(7);
  double *a = tc_read(nb_rand(NB_SHAPE(1000), NB_F32));
  nb_seed(7);
  double *b = tc_read(nb_rand(NB_SHAPE(1000), NB_F32));
  double mean = 0;
  for (int i = 0; i < 1000; i++) {
    cr_assert_eq(a[i], b[i]);
    cr_assert(a[i] >= 0 && a[i] < 1);
    mean += a[i] / 1000;
  }
  cr_assert(fabs(mean - 0.5) < 0.05);
  free(a);
  free(b);
  double *n = tc_read(nb_randn(NB_SHAPE(20000), NB_F64));
  double m = 0, v = 0;
  for (int i = 0; i < 20000; i++) m += n[i] / 20000;
  for (int i = 0; i < 20000; i++) v += (n[i] - m) * (n[i] - m) / 20000;
  cr_assert(fabs(m) < 0.05 && fabs(v - 1) < 0.05, "mean %g var %g", m, v);
  free(n);
}

Test(core, glorot_uniform_bounds) {
  double *w = tc_read(nb_glorot_uniform(NB_SHAPE(32, 64), NB_F32));
  double a = sqrt(6.0 / 96), mx = 0;
  for (int i = 0; i < 32 * 64; i++) {
    cr_assert(fabs(w[i]) <= a);
    if (fabs(w[i]) > mx) mx = fabs(w[i]);
  }
  cr_assert(mx > 0.9 * a);
  free(w);
  cr_assert_null(nb_rand(NB_SHAPE(2), NB_I32));
  tc_assert_error(NB_ERR_DTYPE, "nb_rand");
}

Test(core, scopes_release_and_keep) {
  uint64_t before = nb_get_stats().live_tensors;
  nb_scope_begin();
  nb_zeros(NB_SHAPE(10), NB_F32);
  nb_tensor *kept = nb_keep(nb_full(NB_SHAPE(1), 3, NB_F32));
  cr_assert_eq(nb_get_stats().live_tensors, before + 2);
  nb_scope_end();
  cr_assert_eq(nb_get_stats().live_tensors, before + 1);
  cr_assert_eq(nb_item(kept), 3);
}

Test(core, retain_outlives_scope_and_release_frees) {
  uint64_t before = nb_get_stats().live_tensors;
  nb_scope_begin();
  nb_tensor *t = nb_retain(nb_full(NB_SHAPE(2), 5, NB_I64));
  nb_scope_end();
  cr_assert_eq(nb_get_stats().live_tensors, before + 1);
  int64_t got[2];
  cr_assert_eq(nb_to_host(t, got, 16), NB_OK);
  cr_assert_eq(got[1], 5);
  nb_release(t);
  cr_assert_eq(nb_get_stats().live_tensors, before);
}

Test(core, scope_end_without_begin_is_an_error) {
  nb_scope_end(); /* closes the suite's scope */
  cr_assert_eq(nb_scope_end(), NB_ERR_SCOPE);
  tc_assert_error(NB_ERR_SCOPE, "nb_scope_end");
  nb_scope_begin(); /* for the suite's teardown */
}

Test(core, errors_are_sticky_and_name_the_function) {
  cr_assert_null(nb_zeros(NB_SHAPE(-1, 2), NB_F32));
  cr_assert_null(nb_from_data(NULL, NB_SHAPE(2), NB_F32)); /* second error is ignored */
  tc_assert_error(NB_ERR_SHAPE, "nb_zeros: negative dimension in shape [-1,2]");
  cr_assert_str_eq(nb_last_error(), "");
  cr_assert_null(nb_zeros(NB_SHAPE(1 << 30, 1 << 30, 1 << 30), NB_F32));
  tc_assert_error(NB_ERR_OVERFLOW, "2^48");
  cr_assert_null(nb_zeros(NB_SHAPE(2), (nb_dtype)42));
  tc_assert_error(NB_ERR_DTYPE, "invalid dtype");
  nb_shape big = {.ndim = 9};
  cr_assert_null(nb_zeros(big, NB_F32));
  tc_assert_error(NB_ERR_SHAPE, "rank 9");
  cr_assert_str_eq(nb_status_str(NB_ERR_AXIS), "axis out of range");
  cr_assert_str_eq(nb_status_str((nb_status)1000), "unknown status");
}

Test(core, reading_data_checks_arguments) {
  nb_tensor *t = nb_ones(NB_SHAPE(2, 2), NB_F32);
  float buf[4];
  cr_assert_eq(nb_to_host(t, buf, 8), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "nb_to_host: nbytes is 8 but the f32 tensor needs 16");
  cr_assert_eq(nb_to_host(t, NULL, 16), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "dst");
  cr_assert_eq(nb_to_host(NULL, buf, 16), NB_ERR_NULL);
  nb_clear_error();
  cr_assert(isnan(nb_item(t)));
  tc_assert_error(NB_ERR_SHAPE, "nb_item: tensor of shape [2,2] has 4 elements");
  cr_assert_eq(nb_eval(NULL, 1), NB_ERR_NULL);
  nb_clear_error();
  cr_assert_eq(nb_eval(&t, -1), NB_ERR_ARG);
  nb_clear_error();
  nb_device before = nb_default_device();
  cr_assert_eq(nb_set_default_device(NB_CUDA(99)), NB_ERR_DEVICE);
  tc_assert_error(NB_ERR_DEVICE, "cuda:99");
  cr_assert_eq(nb_default_device().kind, before.kind);
  cr_assert_eq(nb_default_device().index, before.index);
}

Test(core, print_shows_values_dtype_and_shape) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  double x[4] = {1, 2.5, -3, 4};
  nb_fprint(f, tc_tensor(x, NB_SHAPE(2, 2), NB_F32));
  nb_fprint(f, nb_full(NB_SHAPE(2), 1, NB_BOOL));
  fclose(f);
  cr_assert_str_eq(buf, "[[1, 2.5],\n [-3, 4]] (f32 [2,2])\n[true, true] (bool [2])\n");
  free(buf);
}


/* Shapes: a zero dim does not excuse the others from the size limit (their
 * strides would overflow int64), a slice's step does not matter on a dim of
 * one element, and an empty tensor prints once, however long its other dims. */
Test(core, overflow_audit_of_empty_shapes_slices_and_printing) {
  cr_assert_null(nb_zeros(NB_SHAPE(0, (int64_t)1 << 40, (int64_t)1 << 40, 8), NB_F32));
  tc_assert_error(NB_ERR_OVERFLOW, "nb_zeros");
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F64);
  nb_tensor *s = nb_slice(t, (int64_t[]){1, 2}, (int64_t[]){0, 3},
                          (int64_t[]){INT64_MIN + 1, INT64_MAX});
  cr_assert_not_null(s, "%s", nb_last_error());
  cr_assert_float_eq(nb_item(s), 6.0, 0);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  nb_fprint(f, nb_zeros(NB_SHAPE((int64_t)1 << 40, 0), NB_F32));
  fclose(f);
  cr_expect_str_eq(buf, "[] (f32 [1099511627776,0])\n");
  free(buf);
}
