/* test/test_views.c — every kind of kernel on non-contiguous inputs: the
 * result of an op on a view (transpose, strided slice, flip, broadcast) equals
 * the op on a contiguous copy of the same values, whose correctness the family
 * tests establish against reference loops. */
#include "common.h"

TestSuite(views, .init = tc_setup, .fini = tc_teardown);

/* A contiguous tensor with the values of t, built from host data. */
static nb_tensor *contiguous_copy(nb_tensor *t) {
  double *v = tc_read(t);
  nb_tensor *c = tc_tensor(v, nb_shape_of(t), nb_dtype_of(t));
  free(v);
  return c;
}

/* Four non-contiguous [6,4] views over different layouts. */
static int make_views(nb_tensor **out, nb_dtype dt) {
  double base[8 * 6];
  uint64_t seed = 99;
  tc_fill(base, 48, 0.1, 2.0, &seed);
  nb_tensor *b46 = tc_tensor(base, NB_SHAPE(4, 6), dt);
  nb_tensor *b86 = tc_tensor(base, NB_SHAPE(8, 6), dt);
  nb_tensor *row = tc_tensor(base, NB_SHAPE(4), dt);
  out[0] = nb_transpose(b46);                                              /* strides (1,6) */
  out[1] = nb_slice(nb_transpose(b86), (int64_t[]){0, 1}, (int64_t[]){NB_END, NB_END},
                    (int64_t[]){1, 2});                                    /* [6,4], stride 2 */
  out[2] = nb_flip(nb_transpose(b46), NB_AXES(0, 1));                      /* negative strides */
  out[3] = nb_broadcast_to(row, NB_SHAPE(6, 4));                           /* stride 0 */
  for (int i = 0; i < 4; i++) cr_assert(out[i], "%s", nb_last_error());
  return 4;
}

typedef nb_tensor *(*unary_fn)(nb_tensor *);
typedef nb_tensor *(*binary_fn)(nb_tensor *, nb_tensor *);

static void assert_same(nb_tensor *got, nb_tensor *want) {
  double *w = tc_read(want);
  tc_assert_close(got, w, nb_shape_of(want));
  free(w);
}

Test(views, unary_ops_read_strided_inputs) {
  unary_fn ops[] = {nb_neg, nb_exp, nb_log, nb_sqrt, nb_tanh, nb_sigmoid, nb_relu, nb_square};
  for (int dt = NB_F32; dt <= NB_F64; dt++) {
    nb_tensor *v[4];
    int n = make_views(v, dt);
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
      for (int i = 0; i < n; i++) assert_same(ops[o](v[i]), ops[o](contiguous_copy(v[i])));
  }
}

Test(views, binary_ops_mix_layouts) {
  binary_fn ops[] = {nb_add, nb_sub, nb_mul, nb_div, nb_maximum, nb_pow};
  nb_tensor *v[4];
  int n = make_views(v, NB_F32);
  for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++)
        assert_same(ops[o](v[i], v[j]), ops[o](contiguous_copy(v[i]), contiguous_copy(v[j])));
}

Test(views, reductions_over_each_axis) {
  nb_tensor *v[4];
  int n = make_views(v, NB_F64);
  for (int i = 0; i < n; i++) {
    nb_tensor *c = contiguous_copy(v[i]);
    for (int ax = 0; ax < 2; ax++) {
      assert_same(nb_sum(v[i], NB_AXES(ax), false), nb_sum(c, NB_AXES(ax), false));
      assert_same(nb_max(v[i], NB_AXES(ax), true), nb_max(c, NB_AXES(ax), true));
      assert_same(nb_argmin(v[i], ax, false), nb_argmin(c, ax, false));
      assert_same(nb_softmax(v[i], ax), nb_softmax(c, ax));
      assert_same(nb_cumsum(v[i], ax), nb_cumsum(c, ax));
    }
    assert_same(nb_var(v[i], NB_ALL, false), nb_var(c, NB_ALL, false));
  }
}

Test(views, matmul_takes_transposed_sliced_and_broadcast_operands) {
  nb_tensor *v[4];
  for (int dt = NB_F32; dt <= NB_F64; dt++) {
    int n = make_views(v, dt);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) {
        nb_tensor *bt = nb_transpose(v[j]); /* [4,6] */
        assert_same(nb_matmul(v[i], bt), nb_matmul(contiguous_copy(v[i]), contiguous_copy(bt)));
      }
  }
}

Test(views, data_movement_ops_on_views) {
  nb_tensor *v[4];
  int n = make_views(v, NB_I64);
  for (int i = 0; i < n; i++) {
    nb_tensor *c = contiguous_copy(v[i]);
    assert_same(nb_reshape(v[i], NB_SHAPE(3, 8)), nb_reshape(c, NB_SHAPE(3, 8)));
    assert_same(nb_concat((nb_tensor *[]){v[i], c}, 2, 1), nb_concat((nb_tensor *[]){c, c}, 2, 1));
    assert_same(nb_pad(v[i], (int64_t[]){1, 0, 0, 2}, 7), nb_pad(c, (int64_t[]){1, 0, 0, 2}, 7));
    int64_t idx[3] = {3, 0, 3};
    nb_tensor *it = nb_from_data(idx, NB_SHAPE(3), NB_I64);
    assert_same(nb_take(v[i], it, 1), nb_take(c, it, 1));
    assert_same(nb_cast(v[i], NB_F16), nb_cast(c, NB_F16));
  }
}
