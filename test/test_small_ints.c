/* test/test_small_ints.c — the u8, i8 and i16 dtypes: PyTorch's promotion
 * table, arithmetic wrapping in the result dtype (C's and PyTorch's two's
 * complement), sums accumulating in i64, comparisons, indices of these
 * dtypes (take, take_along_axis, one_hot, embedding, scatter_add) and data of
 * these dtypes through the index ops. Casts between every pair of dtypes are
 * elementwise::cast_every_pair_of_dtypes (it loops over every dtype). */
#include "common.h"

TestSuite(small_ints, .init = tc_setup, .fini = tc_teardown);

Test(small_ints, names_sizes_promotion) {
  cr_assert_str_eq(nb_dtype_name(NB_U8), "u8");
  cr_assert_str_eq(nb_dtype_name(NB_I8), "i8");
  cr_assert_str_eq(nb_dtype_name(NB_I16), "i16");
  cr_assert_eq(nb_dtype_size(NB_U8), 1u);
  cr_assert_eq(nb_dtype_size(NB_I8), 1u);
  cr_assert_eq(nb_dtype_size(NB_I16), 2u);
  cr_assert(!nb_dtype_is_float(NB_U8) && nbi_dtype_is_int(NB_I16));
  /* torch.promote_types for every pair of these and their neighbours */
  static const struct {
    nb_dtype a, b, r;
  } table[] = {
      {NB_U8, NB_I8, NB_I16},    {NB_U8, NB_I16, NB_I16},    {NB_U8, NB_I32, NB_I32},
      {NB_U8, NB_I64, NB_I64},   {NB_I8, NB_I16, NB_I16},    {NB_I8, NB_I32, NB_I32},
      {NB_I16, NB_I64, NB_I64},  {NB_U8, NB_BOOL, NB_U8},    {NB_I8, NB_BOOL, NB_I8},
      {NB_U8, NB_F16, NB_F16},   {NB_I16, NB_BF16, NB_BF16}, {NB_I8, NB_F32, NB_F32},
      {NB_U8, NB_F64, NB_F64},   {NB_U8, NB_U8, NB_U8},      {NB_I32, NB_I64, NB_I64},
      {NB_BOOL, NB_I32, NB_I32}, {NB_F16, NB_BF16, NB_F32},  {NB_I64, NB_F16, NB_F16},
  };
  for (size_t k = 0; k < sizeof table / sizeof table[0]; k++) {
    cr_assert_eq(nb_promote_types(table[k].a, table[k].b), table[k].r, "%s v %s",
                 nb_dtype_name(table[k].a), nb_dtype_name(table[k].b));
    cr_assert_eq(nb_promote_types(table[k].b, table[k].a), table[k].r);
  }
}

/* Every pair of values of a and b (exhaustive for 8 bits): op in the result
 * dtype, as C computes it in int then converts (wrapping). */
static void check_binary(nb_dtype da, nb_dtype db, int op) {
  int na = da == NB_I16 ? 512 : 256, nb_ = db == NB_I16 ? 64 : 256;
  double *a = malloc(sizeof *a * (size_t)(na * nb_)), *b = malloc(sizeof *b * (size_t)(na * nb_));
  double *ref = malloc(sizeof *ref * (size_t)(na * nb_));
  nb_dtype rt = nb_promote_types(da, db);
  for (int i = 0; i < na; i++)
    for (int j = 0; j < nb_; j++) {
      int64_t x = da == NB_U8 ? i : da == NB_I8 ? i - 128 : (int64_t)i * 128 - 32768;
      int64_t y = db == NB_U8 ? j : db == NB_I8 ? j - 128 : (int64_t)j * 1021 - 32768;
      int64_t r = op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x > y ? x : y;
      a[i * nb_ + j] = (double)x;
      b[i * nb_ + j] = (double)y;
      ref[i * nb_ + j] = rt == NB_U8    ? (double)(uint8_t)r
                         : rt == NB_I8  ? (double)(int8_t)(uint8_t)r
                         : rt == NB_I16 ? (double)(int16_t)(uint16_t)r
                                        : (double)r;
    }
  nb_shape s = NB_SHAPE(na, nb_);
  nb_tensor *ta = tc_tensor(a, s, da), *tb = tc_tensor(b, s, db);
  nb_tensor *y = op == 0   ? nb_add(ta, tb)
                 : op == 1 ? nb_sub(ta, tb)
                 : op == 2 ? nb_mul(ta, tb)
                           : nb_maximum(ta, tb);
  cr_assert_eq(nb_dtype_of(y), rt);
  tc_assert_close_tol(y, ref, s, 0);
  free(a), free(b), free(ref);
}

Test(small_ints, arithmetic_wraps_in_the_result_dtype) {
  const nb_dtype dts[3] = {NB_U8, NB_I8, NB_I16};
  for (int p = 0; p < 3; p++)
    for (int q = 0; q < 3; q++)
      for (int op = 0; op < 4; op++)
        check_binary(dts[p], dts[q], op);
  /* u8: 200 + 100 = 44, 3 - 5 = 254, neg(1) = 255; i8: 127 + 1 = -128 */
  uint8_t u[3] = {200, 3, 1}, got[3];
  nb_tensor *tu = nb_from_data(u, NB_SHAPE(3), NB_U8);
  cr_assert_eq(nb_to_host(nb_add_scalar(tu, 100), got, 3), NB_OK);
  cr_assert(got[0] == 44 && got[1] == 103 && got[2] == 101);
  cr_assert_eq(nb_to_host(nb_sub_scalar(tu, 5), got, 3), NB_OK);
  cr_assert(got[0] == 195 && got[1] == 254 && got[2] == 252);
  cr_assert_eq(nb_to_host(nb_neg(tu), got, 3), NB_OK);
  cr_assert(got[0] == 56 && got[1] == 253 && got[2] == 255);
  int8_t s8[2] = {127, -128}, g8[2];
  cr_assert_eq(nb_to_host(nb_add_scalar(nb_from_data(s8, NB_SHAPE(2), NB_I8), 1), g8, 2), NB_OK);
  cr_assert(g8[0] == -128 && g8[1] == -127);
  /* a scalar outside the tensor's dtype is an error, as in PyTorch */
  cr_assert_null(nb_add_scalar(tu, 256));
  tc_assert_error(NB_ERR_ARG, "does not fit the tensor's dtype u8");
  cr_assert_null(nb_add_scalar(tu, -1));
  tc_assert_error(NB_ERR_ARG, "does not fit");
  /* float ops promote to f32; comparisons give bool */
  nb_tensor *e = nb_sqrt(tu);
  cr_assert_eq(nb_dtype_of(e), NB_F32);
  tc_assert_close(e, (double[]){sqrt(200), sqrt(3), 1}, NB_SHAPE(3));
  tc_assert_close_tol(nb_lt(tu, nb_from_data((int8_t[]){-1, 4, 1}, NB_SHAPE(3), NB_I8)),
                      (double[]){0, 1, 0}, NB_SHAPE(3), 0);
  /* mod and floor division of negative i16 follow the divisor's sign */
  int16_t m[2] = {-7, 7};
  tc_assert_close_tol(nb_mod(nb_from_data(m, NB_SHAPE(2), NB_I16), nb_scalar(3, NB_I16)),
                      (double[]){2, 1}, NB_SHAPE(2), 0);
}

Test(small_ints, reductions_accumulate_in_i64) {
  /* 1000 u8 of 255: the sum (255000) would wrap in u8 or i16 */
  int64_t n = 1000;
  uint8_t *u = malloc((size_t)n);
  memset(u, 255, (size_t)n);
  nb_tensor *t = nb_from_data(u, NB_SHAPE(10, 100), NB_U8);
  free(u);
  nb_tensor *s = nb_sum(t, NB_ALL, false);
  cr_assert_eq(nb_dtype_of(s), NB_I64);
  cr_assert_eq(nb_item(s), 255000);
  nb_tensor *rows = nb_sum(t, NB_AXES(1), false);
  cr_assert_eq(nb_dtype_of(rows), NB_I64);
  cr_assert_eq(nb_item(nb_sum(rows, NB_ALL, false)), 255000);
  cr_assert_eq(nb_dtype_of(nb_cumsum(t, 1)), NB_I64);
  cr_assert_eq(nb_item(nb_max(nb_cumsum(t, 1), NB_ALL, false)), 25500);
  int16_t h[4] = {-32768, 32767, -1, 5};
  nb_tensor *th = nb_from_data(h, NB_SHAPE(4), NB_I16);
  cr_assert_eq(nb_item(nb_sum(th, NB_ALL, false)), 3);
  cr_assert_eq(nb_dtype_of(nb_max(th, NB_ALL, false)), NB_I16);
  cr_assert_eq(nb_item(nb_max(th, NB_ALL, false)), 32767);
  cr_assert_eq(nb_item(nb_min(th, NB_ALL, false)), -32768);
  cr_assert_eq(nb_item(nb_argmin(th, 0, false)), 0);
  cr_assert_eq(nb_item(nb_mean(th, NB_ALL, false)), 0.75);
  int8_t p[3] = {-2, 3, 100};
  cr_assert_eq(nb_item(nb_prod(nb_from_data(p, NB_SHAPE(3), NB_I8), NB_ALL, false)), -600);
}

Test(small_ints, indices_of_every_integer_dtype) {
  double table[12];
  for (int i = 0; i < 12; i++)
    table[i] = i * 1.5;
  nb_tensor *tab = tc_tensor(table, NB_SHAPE(4, 3), NB_F32);
  const nb_dtype idts[3] = {NB_U8, NB_I8, NB_I16};
  for (int k = 0; k < 3; k++) {
    nb_tensor *ix = tc_tensor((double[]){3, 0, 2, 3}, NB_SHAPE(4), idts[k]);
    double ref[12];
    const int rows[4] = {3, 0, 2, 3};
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 3; j++)
        ref[i * 3 + j] = table[rows[i] * 3 + j];
    tc_assert_close(nb_take(tab, ix, 0), ref, NB_SHAPE(4, 3));
    tc_assert_close(nb_embedding(tab, ix), ref, NB_SHAPE(4, 3));
    double oh[16] = {0};
    for (int i = 0; i < 4; i++)
      oh[i * 4 + rows[i]] = 1;
    tc_assert_close(nb_one_hot(ix, 4, NB_F32), oh, NB_SHAPE(4, 4));
    nb_tensor *col = tc_tensor((double[]){2, 1, 0, 2}, NB_SHAPE(4, 1), idts[k]);
    tc_assert_close(nb_take_along_axis(tab, col, 1), (double[]){3, 6, 9, 16.5}, NB_SHAPE(4, 1));
    nb_tensor *sc =
        nb_scatter_add(nb_zeros(NB_SHAPE(4, 3), NB_F32), ix, nb_ones(NB_SHAPE(4, 3), NB_F32), 0);
    double sref[12] = {1, 1, 1, 0, 0, 0, 1, 1, 1, 2, 2, 2};
    tc_assert_close(sc, sref, NB_SHAPE(4, 3));
  }
  /* a negative i8 index counts from the end; one out of range is an error */
  tc_assert_close(nb_take(tab, tc_tensor((double[]){-1}, NB_SHAPE(1), NB_I8), 0),
                  (double[]){13.5, 15, 16.5}, NB_SHAPE(1, 3));
  nb_tensor *bad = nb_take(tab, tc_tensor((double[]){200}, NB_SHAPE(1), NB_U8), 0);
  cr_assert_neq(nb_eval(&bad, 1), NB_OK);
  tc_assert_error(NB_ERR_INDEX, "nb_take");
}

Test(small_ints, data_of_small_dtypes_through_index_ops) {
  uint8_t img[6] = {0, 10, 20, 250, 251, 252}, got[6];
  nb_tensor *t = nb_from_data(img, NB_SHAPE(3, 2), NB_U8);
  nb_tensor *g = nb_take(t, nb_from_data((int64_t[]){2, 0}, NB_SHAPE(2), NB_I64), 0);
  cr_assert_eq(nb_dtype_of(g), NB_U8);
  cr_assert_eq(nb_to_host(g, got, 4), NB_OK);
  cr_assert(got[0] == 251 && got[1] == 252 && got[2] == 0 && got[3] == 10);
  /* scatter_add of u8 wraps: 250 + 10 = 4 (row 1: [20, 250]) */
  nb_tensor *s = nb_scatter_add(t, nb_from_data((int32_t[]){1}, NB_SHAPE(1), NB_I32),
                                nb_full(NB_SHAPE(1, 2), 10, NB_U8), 0);
  cr_assert_eq(nb_to_host(s, got, 6), NB_OK);
  cr_assert(got[2] == 30 && got[3] == 4 && got[0] == 0 && got[5] == 252);
  /* transpose, slice, concatenate, reshape keep the bytes */
  nb_tensor *tr = nb_transpose(t);
  cr_assert_eq(nb_to_host(tr, got, 6), NB_OK);
  cr_assert(got[0] == 0 && got[1] == 20 && got[2] == 251 && got[3] == 10);
  int16_t h[3] = {-300, 0, 300};
  nb_tensor *th = nb_from_data(h, NB_SHAPE(3), NB_I16);
  tc_assert_close_tol(nb_concat((nb_tensor *[]){th, th}, 2, 0),
                      (double[]){-300, 0, 300, -300, 0, 300}, NB_SHAPE(6), 0);
  tc_assert_close_tol(nb_where(nb_gt(th, nb_scalar(0, NB_I16)), th, nb_scalar(-1, NB_I16)),
                      (double[]){-1, -1, 300}, NB_SHAPE(3), 0);
  /* matmul of i8 accumulates and wraps in i8: [100, 100] . [1, 1] = 200 -> -56 */
  int8_t a8[2] = {100, 100}, b8[2] = {1, 1};
  nb_tensor *mm =
      nb_matmul(nb_from_data(a8, NB_SHAPE(1, 2), NB_I8), nb_from_data(b8, NB_SHAPE(2, 1), NB_I8));
  cr_assert_eq(nb_dtype_of(mm), NB_I8);
  cr_assert_eq(nb_item(mm), -56);
  /* printing */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  nb_fprint(f, th);
  fclose(f);
  cr_assert(strstr(buf, "-300") && strstr(buf, "300"), "%s", buf);
  free(buf);
}
