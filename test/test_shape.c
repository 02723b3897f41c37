/* test/test_shape.c — shapes and views: reshape (view and copy paths),
 * transpose, permute, squeeze, unsqueeze, flatten, broadcast_to, slice, flip,
 * chains of views, concat, stack, split, pad, repeat, tile. Every result is
 * checked against a reference written as index arithmetic on double arrays. */
#include "common.h"

#include "../src/backends/cpu/cpu.h"

TestSuite(shape, .init = tc_setup, .fini = tc_teardown);

/* ---- helpers --------------------------------------------------------------------- */

/* Reference permute: out[j] = x[i] with i[perm[d]] = j[d]. */
static double *ref_permute(const double *x, const nb_shape *s, const int *perm, nb_shape *os) {
  os->ndim = s->ndim;
  for (int d = 0; d < s->ndim; d++)
    os->dims[d] = s->dims[perm[d]];
  int64_t n = tc_numel(*s), j[NB_MAX_DIMS], i[NB_MAX_DIMS];
  double *r = malloc((size_t)(n ? n : 1) * sizeof *r);
  for (int64_t k = 0; k < n; k++) {
    tc_unravel(k, os, j);
    for (int d = 0; d < s->ndim; d++)
      i[perm[d]] = j[d];
    r[k] = x[tc_ravel(i, s)];
  }
  return r;
}

/* Indices of Python's range(n)[b:e:st], walked case by case; returns the count. */
static int64_t ref_slice_indices(int64_t n, int64_t b, int64_t e, int64_t st, int64_t *idx) {
  int64_t k = 0;
  if (st > 0) {
    int64_t i = b < 0 ? b + n : b, stop = e < 0 ? e + n : e;
    if (i < 0) i = 0;
    if (stop > n) stop = n;
    for (; i < stop; i += st)
      idx[k++] = i;
  } else {
    int64_t i = b < 0 ? b + n : b, stop = e == NB_END ? -1 : e < 0 ? e + n : e;
    if (i > n - 1) i = n - 1;
    if (stop < -1) stop = -1;
    for (; i > stop; i += st)
      idx[k++] = i;
  }
  return k;
}

/* Reference slice of x (shape s) into *os. */
static double *ref_slice(const double *x, const nb_shape *s, const int64_t *b, const int64_t *e,
                         const int64_t *st, nb_shape *os) {
  int64_t sel[NB_MAX_DIMS][64];
  os->ndim = s->ndim;
  for (int d = 0; d < s->ndim; d++)
    os->dims[d] = ref_slice_indices(s->dims[d], b[d], e[d], st[d], sel[d]);
  int64_t n = tc_numel(*os), j[NB_MAX_DIMS], i[NB_MAX_DIMS];
  double *r = malloc((size_t)(n ? n : 1) * sizeof *r);
  for (int64_t k = 0; k < n; k++) {
    tc_unravel(k, os, j);
    for (int d = 0; d < s->ndim; d++)
      i[d] = sel[d][j[d]];
    r[k] = x[tc_ravel(i, s)];
  }
  return r;
}

/* Reference flip of the axes in mask. */
static double *ref_flip(const double *x, const nb_shape *s, uint32_t mask) {
  int64_t n = tc_numel(*s), i[NB_MAX_DIMS];
  double *r = malloc((size_t)(n ? n : 1) * sizeof *r);
  for (int64_t k = 0; k < n; k++) {
    tc_unravel(k, s, i);
    for (int d = 0; d < s->ndim; d++)
      if (mask >> d & 1) i[d] = s->dims[d] - 1 - i[d];
    r[k] = x[tc_ravel(i, s)];
  }
  return r;
}

/* Random permutation of [0, n). */
static void rand_perm(uint64_t *seed, int n, int *p) {
  for (int d = 0; d < n; d++)
    p[d] = d;
  for (int d = n - 1; d > 0; d--) {
    int k = (int)tc_randint(seed, 0, d), tmp = p[d];
    p[d] = p[k];
    p[k] = tmp;
  }
}

static uint64_t kernels(void) { return nb_get_stats().kernels_run; }

/* ---- reshape ---------------------------------------------------------------------- */

/* Random target shape for numel n (rank <= 4), built from n's factors; with a
 * zero-size source, one dim is 0 and the rest random. */
static nb_shape rand_target(uint64_t *seed, int64_t n) {
  nb_shape s = {.ndim = (int)tc_randint(seed, n == 1 ? 0 : 1, 4)};
  for (int d = 0; d < s.ndim; d++)
    s.dims[d] = 1;
  if (n == 0) {
    for (int d = 0; d < s.ndim; d++)
      s.dims[d] = tc_randint(seed, 1, 3);
    s.dims[tc_randint(seed, 0, s.ndim - 1)] = 0;
    return s;
  }
  int64_t m = n;
  for (int64_t f = 2; m > 1; f++)
    while (m % f == 0) {
      s.dims[tc_randint(seed, 0, s.ndim - 1)] *= f;
      m /= f;
    }
  return s;
}

Test(shape, reshape_random_shapes_every_dtype) {
  uint64_t seed = 11;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 20; trial++) {
      nb_shape s = tc_rand_shape(&seed, 0, 4, 0, 4);
      int64_t n = tc_numel(s);
      double *x = tc_rand_ints(n, (nb_dtype)dt, &seed, 60);
      nb_shape target = rand_target(&seed, n), ask = target;
      if (n > 0 && target.ndim > 0 && tc_randint(&seed, 0, 1)) ask.dims[tc_randint(&seed, 0, ask.ndim - 1)] = -1;
      nb_tensor *t = tc_tensor(x, s, (nb_dtype)dt);
      tc_assert_close_tol(nb_reshape(t, ask), x, target, 0);
      free(x);
    }
  }
}

Test(shape, reshape_infers_the_minus_one_dim) {
  double x[24];
  for (int i = 0; i < 24; i++)
    x[i] = i;
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3, 4), NB_F32);
  tc_assert_close_tol(nb_reshape(t, NB_SHAPE(-1, 4)), x, NB_SHAPE(6, 4), 0);
  tc_assert_close_tol(nb_reshape(t, NB_SHAPE(2, -1, 3)), x, NB_SHAPE(2, 4, 3), 0);
  tc_assert_close_tol(nb_reshape(t, NB_SHAPE(-1)), x, NB_SHAPE(24), 0);
  nb_tensor *z = nb_zeros(NB_SHAPE(0, 3), NB_I32);
  tc_assert_close_tol(nb_reshape(z, NB_SHAPE(3, -1)), x, NB_SHAPE(3, 0), 0);
  nb_tensor *one = nb_full(NB_SHAPE(1, 1), 5, NB_F64);
  double five = 5;
  tc_assert_close_tol(nb_reshape(one, NB_SCALAR_SHAPE), &five, NB_SCALAR_SHAPE, 0);
}

Test(shape, reshape_of_contiguous_tensor_is_zero_copy) {
  uint64_t seed = 3;
  double *x = tc_rand_ints(24, NB_F32, &seed, 60);
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3, 4), NB_F32);
  nb_tensor *r = nb_reshape(nb_reshape(t, NB_SHAPE(6, 4)), NB_SHAPE(4, 1, 6));
  uint64_t before = kernels();
  tc_assert_close_tol(r, x, NB_SHAPE(4, 1, 6), 0);
  cr_assert_eq(kernels(), before, "a contiguous reshape ran a kernel");
  free(x);
}

Test(shape, reshape_of_compatible_strided_view_is_zero_copy) {
  /* rows 0, 2, 4 of a [6,4] tensor: strides [8,1]; splitting the last dim keeps a view */
  double x[24];
  for (int i = 0; i < 24; i++)
    x[i] = i;
  nb_tensor *t = tc_tensor(x, NB_SHAPE(6, 4), NB_I64);
  nb_tensor *s = nb_slice(t, (int64_t[]){0, 0}, (int64_t[]){6, 4}, (int64_t[]){2, 1});
  nb_tensor *r = nb_reshape(s, NB_SHAPE(3, 2, 1, 2));
  double ref[12];
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++)
      ref[i * 4 + j] = x[(2 * i) * 4 + j];
  uint64_t before = kernels();
  tc_assert_close_tol(r, ref, NB_SHAPE(3, 2, 1, 2), 0);
  cr_assert_eq(kernels(), before);
}

Test(shape, reshape_of_transposed_tensor_copies) {
  uint64_t seed = 5;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    double *x = tc_rand_ints(12, (nb_dtype)dt, &seed, 60);
    nb_tensor *t = tc_tensor(x, NB_SHAPE(3, 4), (nb_dtype)dt);
    nb_tensor *r = nb_reshape(nb_transpose(t), NB_SHAPE(2, 6));
    double ref[12];
    for (int k = 0; k < 12; k++)
      ref[k] = x[(k % 3) * 4 + k / 3]; /* transposed [4,3], row-major */
    uint64_t before = kernels();
    tc_assert_close_tol(r, ref, NB_SHAPE(2, 6), 0);
    cr_assert_eq(kernels(), before + 1, "the copy path should run exactly one kernel");
    free(x);
  }
}

Test(shape, reshape_of_broadcast_and_flipped_views_copies) {
  double x[3] = {1, 2, 3};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(3), NB_F64);
  double ref[6] = {1, 2, 3, 1, 2, 3};
  tc_assert_close_tol(nb_reshape(nb_broadcast_to(t, NB_SHAPE(2, 3)), NB_SHAPE(6)), ref, NB_SHAPE(6),
                      0);
  double y[6] = {0, 1, 2, 3, 4, 5}, rf[6] = {2, 1, 0, 5, 4, 3};
  nb_tensor *u = tc_tensor(y, NB_SHAPE(2, 3), NB_BF16);
  tc_assert_close_tol(nb_reshape(nb_flip(u, NB_AXES(1)), NB_SHAPE(3, 2)), rf, NB_SHAPE(3, 2), 0);
}

Test(shape, reshape_rejects_bad_shapes) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  cr_assert_null(nb_reshape(NULL, NB_SHAPE(6)));
  tc_assert_error(NB_ERR_NULL, "nb_reshape");
  cr_assert_null(nb_reshape(t, NB_SHAPE(4, 2)));
  tc_assert_error(NB_ERR_SHAPE, "nb_reshape: cannot reshape [2,3] (6 elements) into [4,2]");
  cr_assert_null(nb_reshape(t, NB_SHAPE(4, -1)));
  tc_assert_error(NB_ERR_SHAPE, "into [4,-1]");
  cr_assert_null(nb_reshape(t, NB_SHAPE(-1, -1)));
  tc_assert_error(NB_ERR_SHAPE, "more than one -1");
  cr_assert_null(nb_reshape(t, NB_SHAPE(-2, -3)));
  tc_assert_error(NB_ERR_SHAPE, "negative dimension");
  cr_assert_null(nb_reshape(t, (nb_shape){.ndim = 9}));
  tc_assert_error(NB_ERR_SHAPE, "rank 9");
  nb_tensor *z = nb_zeros(NB_SHAPE(0, 2), NB_F32);
  cr_assert_null(nb_reshape(z, NB_SHAPE(0, -1)));
  tc_assert_error(NB_ERR_SHAPE, "cannot infer");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- transpose, permute ------------------------------------------------------------ */

Test(shape, transpose_swaps_the_last_two_dims) {
  uint64_t seed = 21;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    nb_shape s = tc_rand_shape(&seed, 2, 4, 0, 4);
    double *x = tc_rand_ints(tc_numel(s), (nb_dtype)dt, &seed, 60);
    int perm[NB_MAX_DIMS];
    for (int d = 0; d < s.ndim; d++)
      perm[d] = d;
    perm[s.ndim - 2] = s.ndim - 1;
    perm[s.ndim - 1] = s.ndim - 2;
    nb_shape os;
    double *ref = ref_permute(x, &s, perm, &os);
    nb_tensor *t = tc_tensor(x, s, (nb_dtype)dt);
    uint64_t before = kernels();
    tc_assert_close_tol(nb_transpose(t), ref, os, 0);
    cr_assert_eq(kernels(), before, "transpose is a view");
    free(x);
    free(ref);
  }
}

Test(shape, permute_random_perms_every_dtype) {
  uint64_t seed = 22;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 10; trial++) {
      nb_shape s = tc_rand_shape(&seed, 0, 5, 0, 3);
      double *x = tc_rand_ints(tc_numel(s), (nb_dtype)dt, &seed, 60);
      int perm[NB_MAX_DIMS];
      rand_perm(&seed, s.ndim, perm);
      nb_axes ax = {.n = s.ndim};
      for (int d = 0; d < s.ndim; d++)
        ax.v[d] = tc_randint(&seed, 0, 1) ? perm[d] : perm[d] - s.ndim;
      nb_shape os;
      double *ref = ref_permute(x, &s, perm, &os);
      tc_assert_close_tol(nb_permute(tc_tensor(x, s, (nb_dtype)dt), ax), ref, os, 0);
      free(x);
      free(ref);
    }
  }
}

Test(shape, transpose_and_permute_reject_bad_input) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_I32);
  cr_assert_null(nb_transpose(NULL));
  tc_assert_error(NB_ERR_NULL, "nb_transpose");
  cr_assert_null(nb_transpose(nb_reshape(t, NB_SHAPE(6))));
  tc_assert_error(NB_ERR_SHAPE, "nb_transpose: needs rank >= 2, got shape [6]");
  cr_assert_null(nb_permute(NULL, NB_AXES(0)));
  tc_assert_error(NB_ERR_NULL, "nb_permute");
  cr_assert_null(nb_permute(t, NB_AXES(0)));
  tc_assert_error(NB_ERR_AXIS, "nb_permute: perm lists 1 axes but the tensor has rank 2");
  cr_assert_null(nb_permute(t, NB_AXES(1, 1)));
  tc_assert_error(NB_ERR_AXIS, "repeated");
  cr_assert_null(nb_permute(t, NB_AXES(0, 2)));
  tc_assert_error(NB_ERR_AXIS, "axis 2 out of range for rank 2");
  cr_assert_null(nb_permute(t, NB_ALL));
  tc_assert_error(NB_ERR_AXIS, "nb_permute");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- squeeze, unsqueeze, flatten ----------------------------------------------------- */

Test(shape, squeeze_removes_size_one_dims) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(1, 2, 1, 3, 1), NB_F16);
  uint64_t before = kernels();
  tc_assert_close_tol(nb_squeeze(t, NB_ALL), x, NB_SHAPE(2, 3), 0);
  tc_assert_close_tol(nb_squeeze(t, NB_AXES(0, -1)), x, NB_SHAPE(2, 1, 3), 0);
  tc_assert_close_tol(nb_squeeze(t, NB_NO_AXES), x, NB_SHAPE(1, 2, 1, 3, 1), 0);
  tc_assert_close_tol(nb_squeeze(nb_ones(NB_SHAPE(1, 1), NB_BOOL), NB_ALL), (double[]){1},
                      NB_SCALAR_SHAPE, 0);
  cr_assert_eq(kernels(), before, "squeeze is a view");
}

Test(shape, unsqueeze_inserts_a_size_one_dim) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_I64);
  tc_assert_close_tol(nb_unsqueeze(t, 0), x, NB_SHAPE(1, 2, 3), 0);
  tc_assert_close_tol(nb_unsqueeze(t, 2), x, NB_SHAPE(2, 3, 1), 0);
  tc_assert_close_tol(nb_unsqueeze(t, -1), x, NB_SHAPE(2, 3, 1), 0);
  tc_assert_close_tol(nb_unsqueeze(t, -3), x, NB_SHAPE(1, 2, 3), 0);
  tc_assert_close_tol(nb_unsqueeze(nb_scalar(4, NB_F32), 0), (double[]){4}, NB_SHAPE(1), 0);
  /* on a transposed view: still a view (only size-1 dims change) */
  nb_tensor *u = nb_unsqueeze(nb_transpose(t), 1);
  double ref[6] = {1, 4, 2, 5, 3, 6};
  uint64_t before = kernels();
  tc_assert_close_tol(u, ref, NB_SHAPE(3, 1, 2), 0);
  cr_assert_eq(kernels(), before);
}

Test(shape, flatten_merges_an_inclusive_range) {
  double x[24];
  for (int i = 0; i < 24; i++)
    x[i] = i;
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3, 4), NB_F32);
  tc_assert_close_tol(nb_flatten(t, 0, -1), x, NB_SHAPE(24), 0);
  tc_assert_close_tol(nb_flatten(t, 1, 2), x, NB_SHAPE(2, 12), 0);
  tc_assert_close_tol(nb_flatten(t, 0, 1), x, NB_SHAPE(6, 4), 0);
  tc_assert_close_tol(nb_flatten(t, 1, 1), x, NB_SHAPE(2, 3, 4), 0);
  tc_assert_close_tol(nb_flatten(nb_scalar(7, NB_I32), 0, -1), (double[]){7}, NB_SHAPE(1), 0);
  tc_assert_close_tol(nb_flatten(nb_zeros(NB_SHAPE(2, 0, 3), NB_F32), 1, 2), x, NB_SHAPE(2, 0), 0);
}

Test(shape, squeeze_unsqueeze_flatten_reject_bad_input) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(1, 2, 3), NB_F32);
  cr_assert_null(nb_squeeze(NULL, NB_ALL));
  tc_assert_error(NB_ERR_NULL, "nb_squeeze");
  cr_assert_null(nb_squeeze(t, NB_AXES(1)));
  tc_assert_error(NB_ERR_SHAPE, "nb_squeeze: axis 1 of [1,2,3] has size 2, not 1");
  cr_assert_null(nb_squeeze(t, NB_AXES(3)));
  tc_assert_error(NB_ERR_AXIS, "nb_squeeze: axis 3 out of range");
  cr_assert_null(nb_unsqueeze(NULL, 0));
  tc_assert_error(NB_ERR_NULL, "nb_unsqueeze");
  cr_assert_null(nb_unsqueeze(t, 4));
  tc_assert_error(NB_ERR_AXIS, "nb_unsqueeze: axis 4 out of range for rank 4");
  cr_assert_null(nb_unsqueeze(t, -5));
  tc_assert_error(NB_ERR_AXIS, "nb_unsqueeze");
  nb_tensor *big = nb_zeros(NB_SHAPE(1, 1, 1, 1, 1, 1, 1, 1), NB_F32);
  cr_assert_null(nb_unsqueeze(big, 0));
  tc_assert_error(NB_ERR_SHAPE, "maximum rank 8");
  cr_assert_null(nb_flatten(NULL, 0, 1));
  tc_assert_error(NB_ERR_NULL, "nb_flatten");
  cr_assert_null(nb_flatten(t, 2, 1));
  tc_assert_error(NB_ERR_AXIS, "nb_flatten: start_axis 2 comes after end_axis 1");
  cr_assert_null(nb_flatten(t, 0, 3));
  tc_assert_error(NB_ERR_AXIS, "axis 3 out of range for rank 3");
  tc_assert_unchanged(t, x, NB_SHAPE(1, 2, 3));
}

/* ---- broadcast_to ----------------------------------------------------------------- */

Test(shape, broadcast_to_random_shapes_every_dtype) {
  uint64_t seed = 31;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 10; trial++) {
      nb_shape target = tc_rand_shape(&seed, 0, 4, 0, 3);
      int lead = (int)tc_randint(&seed, 0, target.ndim);
      nb_shape s = {.ndim = target.ndim - lead};
      for (int d = 0; d < s.ndim; d++)
        s.dims[d] = tc_randint(&seed, 0, 1) ? 1 : target.dims[d + lead];
      double *x = tc_rand_ints(tc_numel(s), (nb_dtype)dt, &seed, 60);
      int64_t n = tc_numel(target), j[NB_MAX_DIMS], i[NB_MAX_DIMS];
      double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
      for (int64_t k = 0; k < n; k++) {
        tc_unravel(k, &target, j);
        for (int d = 0; d < s.ndim; d++)
          i[d] = s.dims[d] == 1 ? 0 : j[d + lead];
        ref[k] = x[tc_ravel(i, &s)];
      }
      nb_tensor *b = nb_broadcast_to(tc_tensor(x, s, (nb_dtype)dt), target);
      uint64_t before = kernels();
      tc_assert_close_tol(b, ref, target, 0);
      cr_assert_eq(kernels(), before, "broadcast_to is a view");
      free(x);
      free(ref);
    }
  }
}

Test(shape, broadcast_to_rejects_incompatible_shapes) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  cr_assert_null(nb_broadcast_to(NULL, NB_SHAPE(2, 3)));
  tc_assert_error(NB_ERR_NULL, "nb_broadcast_to");
  cr_assert_null(nb_broadcast_to(t, NB_SHAPE(4, 3, 2)));
  tc_assert_error(NB_ERR_SHAPE, "nb_broadcast_to: cannot broadcast [2,3] to [4,3,2]");
  cr_assert_null(nb_broadcast_to(t, NB_SHAPE(3)));
  tc_assert_error(NB_ERR_SHAPE, "cannot broadcast [2,3] to [3]");
  cr_assert_null(nb_broadcast_to(t, NB_SHAPE(-1, 3)));
  tc_assert_error(NB_ERR_SHAPE, "negative dimension");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- slice ------------------------------------------------------------------------ */

Test(shape, slice_follows_python_rules_on_known_cases) {
  /* expected index lists from Python: list(range(n))[b:e:s] */
  struct {
    int64_t n, b, e, s, count, idx[6];
  } cases[] = {
      {5, 1, 4, 1, 3, {1, 2, 3}},
      {5, -1, NB_END, -1, 5, {4, 3, 2, 1, 0}},
      {5, 10, -10, -2, 3, {4, 2, 0}},
      {5, -10, 10, 3, 2, {0, 3}},
      {5, 3, 1, 1, 0, {0}},
      {5, -100, -100, 1, 0, {0}},
      {5, 0, NB_END, 2, 3, {0, 2, 4}},
      {5, NB_END, NB_END, -2, 3, {4, 2, 0}},
      {5, 4, -6, -1, 5, {4, 3, 2, 1, 0}},
      {5, 2, 2, -1, 0, {0}},
      {0, 0, NB_END, 1, 0, {0}},
      {0, -1, NB_END, -1, 0, {0}},
      {1, -5, 5, -1, 0, {0}},
      {6, -2, -5, -1, 3, {4, 3, 2}},
      {6, 5, 0, -4, 2, {5, 1}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    double x[6] = {0, 1, 2, 3, 4, 5}, ref[6];
    for (int k = 0; k < cases[c].count; k++)
      ref[k] = (double)cases[c].idx[k];
    nb_tensor *t = tc_tensor(x, NB_SHAPE(cases[c].n), NB_I32);
    nb_tensor *r = nb_slice(t, &cases[c].b, &cases[c].e, &cases[c].s);
    tc_assert_close_tol(r, ref, NB_SHAPE(cases[c].count), 0);
  }
}

Test(shape, slice_random_every_dtype) {
  uint64_t seed = 41;
  static const int64_t steps[] = {-3, -2, -1, 1, 1, 2, 3};
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 15; trial++) {
      nb_shape s = tc_rand_shape(&seed, 0, 4, 0, 5);
      double *x = tc_rand_ints(tc_numel(s), (nb_dtype)dt, &seed, 60);
      int64_t b[NB_MAX_DIMS], e[NB_MAX_DIMS], st[NB_MAX_DIMS];
      for (int d = 0; d < s.ndim; d++) {
        b[d] = tc_randint(&seed, -7, 7);
        e[d] = tc_randint(&seed, 0, 5) == 0 ? NB_END : tc_randint(&seed, -7, 7);
        st[d] = steps[tc_randint(&seed, 0, 6)];
      }
      nb_shape os;
      double *ref = ref_slice(x, &s, b, e, st, &os);
      nb_tensor *r = nb_slice(tc_tensor(x, s, (nb_dtype)dt), b, e, st);
      uint64_t before = kernels();
      tc_assert_close_tol(r, ref, os, 0);
      cr_assert_eq(kernels(), before, "slice is a view");
      free(x);
      free(ref);
    }
  }
}

Test(shape, slice_without_steps_uses_step_one) {
  double x[12];
  for (int i = 0; i < 12; i++)
    x[i] = i;
  nb_tensor *t = tc_tensor(x, NB_SHAPE(3, 4), NB_F64);
  double ref[4] = {5, 6, 9, 10};
  tc_assert_close_tol(nb_slice(t, (int64_t[]){1, 1}, (int64_t[]){NB_END, -1}, NULL), ref,
                      NB_SHAPE(2, 2), 0);
  double seven = 7;
  nb_tensor *z = nb_scalar(7, NB_F32);
  tc_assert_close_tol(nb_slice(z, NULL, NULL, NULL), &seven, NB_SCALAR_SHAPE, 0);
}

Test(shape, slice_rejects_bad_input) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  int64_t b[2] = {0, 0}, e[2] = {2, 3};
  cr_assert_null(nb_slice(NULL, b, e, NULL));
  tc_assert_error(NB_ERR_NULL, "nb_slice");
  cr_assert_null(nb_slice(t, NULL, e, NULL));
  tc_assert_error(NB_ERR_NULL, "nb_slice: starts is NULL");
  cr_assert_null(nb_slice(t, b, NULL, NULL));
  tc_assert_error(NB_ERR_NULL, "nb_slice: stops is NULL");
  cr_assert_null(nb_slice(t, b, e, (int64_t[]){1, 0}));
  tc_assert_error(NB_ERR_ARG, "nb_slice: step 0 for axis 1");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- flip -------------------------------------------------------------------------- */

Test(shape, flip_random_axes_every_dtype) {
  uint64_t seed = 51;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 10; trial++) {
      nb_shape s = tc_rand_shape(&seed, 0, 4, 0, 4);
      double *x = tc_rand_ints(tc_numel(s), (nb_dtype)dt, &seed, 60);
      nb_axes ax = {.n = 0};
      uint32_t mask = 0;
      for (int d = 0; d < s.ndim; d++)
        if (tc_randint(&seed, 0, 1)) {
          ax.v[ax.n++] = tc_randint(&seed, 0, 1) ? d : d - s.ndim;
          mask |= 1u << d;
        }
      if (trial == 0) {
        ax = NB_ALL;
        mask = (1u << s.ndim) - 1;
      }
      double *ref = ref_flip(x, &s, mask);
      nb_tensor *r = nb_flip(tc_tensor(x, s, (nb_dtype)dt), ax);
      uint64_t before = kernels();
      tc_assert_close_tol(r, ref, s, 0);
      cr_assert_eq(kernels(), before, "flip is a view");
      free(x);
      free(ref);
    }
  }
}

Test(shape, flip_rejects_bad_axes) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  cr_assert_null(nb_flip(NULL, NB_ALL));
  tc_assert_error(NB_ERR_NULL, "nb_flip");
  cr_assert_null(nb_flip(t, NB_AXES(0, -2)));
  tc_assert_error(NB_ERR_AXIS, "nb_flip: axis -2 repeated");
  cr_assert_null(nb_flip(t, NB_AXES(2)));
  tc_assert_error(NB_ERR_AXIS, "nb_flip: axis 2 out of range for rank 2");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- chains of views ----------------------------------------------------------------- */

Test(shape, chains_of_views_read_back_without_kernels) {
  uint64_t seed = 61;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    nb_shape s = NB_SHAPE(3, 4, 5);
    double *x = tc_rand_ints(60, (nb_dtype)dt, &seed, 60);
    nb_tensor *t = tc_tensor(x, s, (nb_dtype)dt);
    /* flip axes 0, 2 -> slice [::-1, 1::2, -1:0:-2] -> permute (2, 0, 1) -> broadcast [2,...] */
    double *f = ref_flip(x, &s, 5u);
    int64_t b[3] = {-1, 1, -1}, e[3] = {NB_END, NB_END, 0}, st[3] = {-1, 2, -2};
    nb_shape ss, ps;
    double *sl = ref_slice(f, &s, b, e, st, &ss);
    int perm[3] = {2, 0, 1};
    double *p = ref_permute(sl, &ss, perm, &ps);
    nb_shape bs = {.ndim = 4, .dims = {2, ps.dims[0], ps.dims[1], ps.dims[2]}};
    int64_t n = tc_numel(bs), pn = tc_numel(ps);
    double *ref = malloc((size_t)n * sizeof *ref);
    for (int64_t k = 0; k < n; k++)
      ref[k] = p[k % pn];
    nb_tensor *v = nb_flip(t, NB_AXES(0, 2));
    v = nb_slice(v, b, e, st);
    v = nb_permute(v, NB_AXES(2, 0, 1));
    v = nb_broadcast_to(v, bs);
    uint64_t before = kernels();
    tc_assert_close_tol(v, ref, bs, 0);
    cr_assert_eq(kernels(), before, "a chain of views ran a kernel");
    /* the same chain reshaped: strides no longer fit, one copy */
    nb_tensor *r = nb_reshape(v, NB_SHAPE(-1));
    before = kernels();
    tc_assert_close_tol(r, ref, NB_SHAPE(n), 0);
    cr_assert_eq(kernels(), before + 1);
    free(x);
    free(f);
    free(sl);
    free(p);
    free(ref);
  }
}

Test(shape, view_of_pending_intermediate_survives_realization) {
  /* the slice's input is a pending concat: the view aliases a buffer whose
   * producing node is an intermediate freed by the plan */
  double x[4] = {1, 2, 3, 4}, ref[3] = {4, 3, 2};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 2), NB_F32);
  nb_tensor *c = nb_concat((nb_tensor *[]){t, t}, 2, 0); /* [4,2] */
  nb_tensor *v =
      nb_slice(nb_reshape(c, NB_SHAPE(8)), (int64_t[]){3}, (int64_t[]){0}, (int64_t[]){-1});
  tc_assert_close_tol(v, ref, NB_SHAPE(3), 0);
}

Test(shape, view_kernels_materialize_the_same_view) {
  /* the CPU kernels of the view ops copy the view they would alias */
  uint64_t seed = 62;
  double *x = tc_rand_ints(24, NB_F32, &seed, 60);
  /* on the CPU whatever the default device: the test calls CPU kernels itself */
  nb_tensor *t = nb_to_device(tc_tensor(x, NB_SHAPE(2, 3, 4), NB_F32), NB_CPU);
  cr_assert_eq(nb_eval(&t, 1), NB_OK);
  nb_tensor *views[] = {
      nb_permute(t, NB_AXES(2, 0, 1)),
      nb_broadcast_to(t, NB_SHAPE(2, 2, 3, 4)),
      nb_slice(t, (int64_t[]){1, NB_END, 0}, (int64_t[]){NB_END, 0, NB_END}, (int64_t[]){1, -1, 3}),
      nb_flip(t, NB_AXES(1)),
  };
  for (size_t k = 0; k < sizeof views / sizeof views[0]; k++) {
    nb_tensor *v = views[k];
    int64_t n = nb_numel(v);
    float *buf = malloc((size_t)n * sizeof *buf);
    nbi_view in = nbi_tensor_view(t),
             out = {.data = (char *)buf, .dtype = NB_F32, .ndim = v->shape.ndim};
    memcpy(out.dims, v->shape.dims, sizeof out.dims);
    nbi_contig_strides(&v->shape, out.strides);
    cr_assert_eq(nbi_cpu_run_op(NULL, v, &out, &in), NB_OK);
    double *ref = malloc((size_t)n * sizeof *ref);
    for (int64_t i = 0; i < n; i++)
      ref[i] = buf[i];
    tc_assert_close_tol(v, ref, v->shape, 0);
    free(buf);
    free(ref);
  }
  free(x);
}

/* ---- concat, stack, split ------------------------------------------------------------- */

Test(shape, concat_random_pieces_promote_dtypes) {
  uint64_t seed = 71;
  for (int trial = 0; trial < 40; trial++) {
    nb_shape base = tc_rand_shape(&seed, 1, 4, 0, 3);
    int axis = (int)tc_randint(&seed, 0, base.ndim - 1), n = (int)tc_randint(&seed, 1, 4);
    nb_tensor *ts[4];
    double *xs[4];
    nb_shape ss[4];
    nb_shape os = base;
    os.dims[axis] = 0;
    nb_dtype dt = (nb_dtype)tc_randint(&seed, 0, NB_DTYPE_COUNT - 1), odt = dt;
    for (int k = 0; k < n; k++) {
      nb_dtype dk = tc_randint(&seed, 0, 2) ? dt : (nb_dtype)tc_randint(&seed, 0, NB_DTYPE_COUNT - 1);
      odt = k == 0 ? dk : nb_promote_types(odt, dk);
      ss[k] = base;
      ss[k].dims[axis] = tc_randint(&seed, 0, 3);
      os.dims[axis] += ss[k].dims[axis];
      xs[k] = tc_rand_ints(tc_numel(ss[k]), dk, &seed, 60);
      ts[k] = tc_randint(&seed, 0, 1) ? tc_strided_tensor(xs[k], ss[k], dk) : tc_tensor(xs[k], ss[k], dk);
    }
    int64_t on = tc_numel(os), j[NB_MAX_DIMS];
    double *ref = malloc((size_t)(on ? on : 1) * sizeof *ref);
    for (int64_t q = 0; q < on; q++) {
      tc_unravel(q, &os, j);
      int k = 0;
      while (j[axis] >= ss[k].dims[axis])
        j[axis] -= ss[k++].dims[axis];
      ref[q] = xs[k][tc_ravel(j, &ss[k])];
    }
    nb_tensor *c = nb_concat(ts, n, tc_randint(&seed, 0, 1) ? axis : axis - base.ndim);
    cr_assert(c, "%s", nb_last_error());
    cr_assert_eq(nb_dtype_of(c), odt);
    tc_assert_close_tol(c, ref, os, 0);
    for (int k = 0; k < n; k++)
      free(xs[k]);
    free(ref);
  }
}

Test(shape, concat_rejects_bad_input) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *a = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  nb_tensor *b = nb_zeros(NB_SHAPE(2, 2), NB_F32);
  nb_tensor *c = nb_zeros(NB_SHAPE(2, 3, 1), NB_F32);
  cr_assert_null(nb_concat(NULL, 1, 0));
  tc_assert_error(NB_ERR_NULL, "nb_concat: ts is NULL");
  cr_assert_null(nb_concat((nb_tensor *[]){a}, 0, 0));
  tc_assert_error(NB_ERR_ARG, "nb_concat: n is 0");
  cr_assert_null(nb_concat((nb_tensor *[]){a, NULL}, 2, 0));
  tc_assert_error(NB_ERR_NULL, "nb_concat: ts[1] is NULL");
  cr_assert_null(nb_concat((nb_tensor *[]){a, b}, 2, 0));
  tc_assert_error(NB_ERR_SHAPE,
                  "nb_concat: ts[1] has shape [2,2], incompatible with [2,3] along axis 0");
  cr_assert_null(nb_concat((nb_tensor *[]){a, c}, 2, 1));
  tc_assert_error(NB_ERR_SHAPE, "ts[1] has shape [2,3,1]");
  cr_assert_null(nb_concat((nb_tensor *[]){a, a}, 2, 2));
  tc_assert_error(NB_ERR_AXIS, "nb_concat: axis 2 out of range for rank 2");
  nb_tensor *s = nb_scalar(1, NB_F32);
  cr_assert_null(nb_concat((nb_tensor *[]){s, s}, 2, 0));
  tc_assert_error(NB_ERR_SHAPE, "nb_concat: cannot concatenate 0-d tensors");
  nb_tensor *huge = nb_broadcast_to(s, NB_SHAPE(((int64_t)1 << 47) + 1)); /* a view: no data */
  cr_assert_null(nb_concat((nb_tensor *[]){huge, huge}, 2, 0));
  tc_assert_error(NB_ERR_OVERFLOW, "nb_concat: concatenated axis 0 is too long");
  tc_assert_unchanged(a, x, NB_SHAPE(2, 3));
}

Test(shape, stack_adds_a_new_axis) {
  uint64_t seed = 81;
  for (int trial = 0; trial < 20; trial++) {
    nb_shape s = tc_rand_shape(&seed, 0, 3, 0, 3);
    int n = (int)tc_randint(&seed, 1, 4), axis = (int)tc_randint(&seed, 0, s.ndim);
    nb_dtype dt = (nb_dtype)(trial % NB_DTYPE_COUNT);
    nb_tensor *ts[4];
    double *xs[4];
    for (int k = 0; k < n; k++) {
      xs[k] = tc_rand_ints(tc_numel(s), dt, &seed, 60);
      ts[k] = tc_tensor(xs[k], s, dt);
    }
    nb_shape os = {.ndim = s.ndim + 1};
    for (int d = 0, q = 0; d < os.ndim; d++)
      os.dims[d] = d == axis ? n : s.dims[q++];
    int64_t on = tc_numel(os), j[NB_MAX_DIMS], i[NB_MAX_DIMS];
    double *ref = malloc((size_t)(on ? on : 1) * sizeof *ref);
    for (int64_t q = 0; q < on; q++) {
      tc_unravel(q, &os, j);
      for (int d = 0, r = 0; d < os.ndim; d++)
        if (d != axis) i[r++] = j[d];
      ref[q] = xs[j[axis]][tc_ravel(i, &s)];
    }
    tc_assert_close_tol(nb_stack(ts, n, tc_randint(&seed, 0, 1) ? axis : axis - s.ndim - 1), ref, os, 0);
    for (int k = 0; k < n; k++)
      free(xs[k]);
    free(ref);
  }
}

Test(shape, stack_rejects_bad_input) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *a = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  nb_tensor *b = nb_zeros(NB_SHAPE(3, 2), NB_F32);
  cr_assert_null(nb_stack(NULL, 2, 0));
  tc_assert_error(NB_ERR_NULL, "nb_stack: ts is NULL");
  cr_assert_null(nb_stack((nb_tensor *[]){a}, -1, 0));
  tc_assert_error(NB_ERR_ARG, "nb_stack: n is -1");
  cr_assert_null(nb_stack((nb_tensor *[]){NULL, a}, 2, 0));
  tc_assert_error(NB_ERR_NULL, "nb_stack: ts[0] is NULL");
  cr_assert_null(nb_stack((nb_tensor *[]){a, b}, 2, 0));
  tc_assert_error(NB_ERR_SHAPE, "nb_stack: ts[1] has shape [3,2] but ts[0] has [2,3]");
  cr_assert_null(nb_stack((nb_tensor *[]){a, a}, 2, 3));
  tc_assert_error(NB_ERR_AXIS, "nb_stack: axis 3 out of range for rank 3");
  nb_tensor *big = nb_zeros(NB_SHAPE(1, 1, 1, 1, 1, 1, 1, 1), NB_F32);
  cr_assert_null(nb_stack((nb_tensor *[]){big, big}, 2, 0));
  tc_assert_error(NB_ERR_SHAPE, "nb_stack: inputs already have the maximum rank 8");
  tc_assert_unchanged(a, x, NB_SHAPE(2, 3));
}

Test(shape, split_parts_match_reference_slices) {
  uint64_t seed = 91;
  for (int trial = 0; trial < 20; trial++) {
    nb_shape s = tc_rand_shape(&seed, 1, 4, 0, 4);
    int axis = (int)tc_randint(&seed, 0, s.ndim - 1), n = (int)tc_randint(&seed, 1, 4);
    int64_t sizes[4] = {0}, left = s.dims[axis];
    for (int k = 0; k < n - 1; k++)
      left -= sizes[k] = tc_randint(&seed, 0, left);
    sizes[n - 1] = left;
    nb_dtype dt = (nb_dtype)(trial % NB_DTYPE_COUNT);
    double *x = tc_rand_ints(tc_numel(s), dt, &seed, 60);
    nb_tensor *out[4];
    cr_assert_eq(nb_split(tc_tensor(x, s, dt), sizes, n, axis, out), NB_OK, "%s", nb_last_error());
    int64_t start = 0;
    for (int k = 0; k < n; k++) {
      int64_t b[NB_MAX_DIMS] = {0}, e[NB_MAX_DIMS], st[NB_MAX_DIMS];
      for (int d = 0; d < s.ndim; d++) {
        e[d] = s.dims[d];
        st[d] = 1;
      }
      b[axis] = start;
      e[axis] = start + sizes[k];
      nb_shape os;
      double *ref = ref_slice(x, &s, b, e, st, &os);
      tc_assert_close_tol(out[k], ref, os, 0);
      free(ref);
      start += sizes[k];
    }
    free(x);
  }
}

Test(shape, split_rejects_bad_sizes) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  nb_tensor *out[3] = {t, t, t};
  cr_assert_eq(nb_split(NULL, (int64_t[]){1, 1}, 2, 0, out), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "nb_split");
  cr_assert_null(out[0], "parts are NULL after a failed split");
  cr_assert_eq(nb_split(t, (int64_t[]){1, 1}, 2, 0, NULL), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "nb_split: out is NULL");
  cr_assert_eq(nb_split(t, NULL, 2, 0, out), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "nb_split: sizes is NULL");
  cr_assert_eq(nb_split(t, (int64_t[]){1}, 0, 0, out), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "nb_split: n is 0");
  cr_assert_eq(nb_split(t, (int64_t[]){1, 1}, 2, 1, out), NB_ERR_SHAPE);
  tc_assert_error(NB_ERR_SHAPE, "nb_split: sizes sum to 2 but axis 1 of [2,3] has size 3");
  cr_assert_null(out[0]);
  cr_assert_null(out[1]);
  cr_assert_eq(nb_split(t, (int64_t[]){4, -1}, 2, 1, out), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "nb_split: sizes[1] is -1");
  cr_assert_eq(nb_split(t, (int64_t[]){INT64_MAX, INT64_MAX}, 2, 1, out), NB_ERR_SHAPE);
  tc_assert_error(NB_ERR_SHAPE, "sizes sum to more than");
  cr_assert_eq(nb_split(t, (int64_t[]){1, 1}, 2, 2, out), NB_ERR_AXIS);
  tc_assert_error(NB_ERR_AXIS, "nb_split: axis 2 out of range for rank 2");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- pad ----------------------------------------------------------------------------- */

Test(shape, pad_random_every_dtype) {
  uint64_t seed = 101;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 8; trial++) {
      nb_shape s = tc_rand_shape(&seed, 0, 3, 0, 3);
      double *x = tc_rand_ints(tc_numel(s), (nb_dtype)dt, &seed, 60);
      int64_t pads[2 * NB_MAX_DIMS];
      nb_shape os = s;
      for (int d = 0; d < s.ndim; d++) {
        pads[2 * d] = tc_randint(&seed, 0, 2);
        pads[2 * d + 1] = tc_randint(&seed, 0, 2);
        os.dims[d] += pads[2 * d] + pads[2 * d + 1];
      }
      double value = dt == NB_BOOL ? 1 : dt == NB_U8 ? 7 : -7;
      /* an input view (flipped) exercises strided reads */
      nb_tensor *t = nb_flip(tc_tensor(x, s, (nb_dtype)dt), NB_ALL);
      double *xf = ref_flip(x, &s, (1u << s.ndim) - 1);
      int64_t on = tc_numel(os), j[NB_MAX_DIMS];
      double *ref = malloc((size_t)(on ? on : 1) * sizeof *ref);
      for (int64_t q = 0; q < on; q++) {
        tc_unravel(q, &os, j);
        bool inside = true;
        for (int d = 0; d < s.ndim; d++) {
          j[d] -= pads[2 * d];
          inside = inside && j[d] >= 0 && j[d] < s.dims[d];
        }
        ref[q] = inside ? xf[tc_ravel(j, &s)] : value;
      }
      tc_assert_close_tol(nb_pad(t, pads, value), ref, os, 0);
      free(x);
      free(xf);
      free(ref);
    }
  }
}

Test(shape, pad_converts_the_value_to_the_dtype) {
  double x[2] = {1, 2};
  double ri[4] = {2, 1, 2, 2}, rb[3] = {1, 1, 1};
  tc_assert_close_tol(nb_pad(tc_tensor(x, NB_SHAPE(2), NB_I32), (int64_t[]){1, 1}, 2.75), ri,
                      NB_SHAPE(4), 0);
  tc_assert_close_tol(nb_pad(tc_tensor(x, NB_SHAPE(2), NB_BOOL), (int64_t[]){0, 1}, -0.5), rb,
                      NB_SHAPE(3), 0);
  double five = 5;
  tc_assert_close_tol(nb_pad(nb_scalar(5, NB_F32), NULL, 0), &five, NB_SCALAR_SHAPE, 0);
}

Test(shape, pad_rejects_bad_pads) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  cr_assert_null(nb_pad(NULL, (int64_t[]){0, 0, 0, 0}, 0));
  tc_assert_error(NB_ERR_NULL, "nb_pad");
  cr_assert_null(nb_pad(t, NULL, 0));
  tc_assert_error(NB_ERR_NULL, "nb_pad: pads is NULL");
  cr_assert_null(nb_pad(t, (int64_t[]){0, 1, -1, 0}, 0));
  tc_assert_error(NB_ERR_ARG, "nb_pad: pads[2] is -1");
  cr_assert_null(nb_pad(t, (int64_t[]){0, 0, INT64_MAX, 0}, 0));
  tc_assert_error(NB_ERR_OVERFLOW, "nb_pad: pads[2]");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- repeat, tile ----------------------------------------------------------------------- */

Test(shape, repeat_random_every_dtype) {
  uint64_t seed = 111;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 8; trial++) {
      nb_shape s = tc_rand_shape(&seed, 1, 4, 0, 3);
      int axis = (int)tc_randint(&seed, 0, s.ndim - 1);
      int64_t r = tc_randint(&seed, 0, 3);
      double *x = tc_rand_ints(tc_numel(s), (nb_dtype)dt, &seed, 60);
      nb_shape os = s;
      os.dims[axis] *= r;
      int64_t on = tc_numel(os), j[NB_MAX_DIMS];
      double *ref = malloc((size_t)(on ? on : 1) * sizeof *ref);
      for (int64_t q = 0; q < on; q++) {
        tc_unravel(q, &os, j);
        j[axis] /= r;
        ref[q] = x[tc_ravel(j, &s)];
      }
      nb_tensor *t = tc_strided_tensor(x, s, (nb_dtype)dt);
      tc_assert_close_tol(nb_repeat(t, r, tc_randint(&seed, 0, 1) ? axis : axis - s.ndim), ref, os, 0);
      free(x);
      free(ref);
    }
  }
}

Test(shape, tile_random_reps_every_dtype) {
  uint64_t seed = 121;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 8; trial++) {
      nb_shape s = tc_rand_shape(&seed, 0, 3, 0, 3), reps = tc_rand_shape(&seed, 0, 4, 0, 3);
      double *x = tc_rand_ints(tc_numel(s), (nb_dtype)dt, &seed, 60);
      int nd = s.ndim > reps.ndim ? s.ndim : reps.ndim;
      nb_shape base = {.ndim = nd}, os = {.ndim = nd};
      for (int d = 0; d < nd; d++) {
        int ds = d - (nd - s.ndim), dr = d - (nd - reps.ndim);
        base.dims[d] = ds >= 0 ? s.dims[ds] : 1;
        os.dims[d] = base.dims[d] * (dr >= 0 ? reps.dims[dr] : 1);
      }
      int64_t on = tc_numel(os), j[NB_MAX_DIMS];
      double *ref = malloc((size_t)(on ? on : 1) * sizeof *ref);
      for (int64_t q = 0; q < on; q++) {
        tc_unravel(q, &os, j);
        for (int d = 0; d < nd; d++)
          j[d] %= base.dims[d];
        ref[q] = x[tc_ravel(j, &base)];
      }
      nb_tensor *t = tc_strided_tensor(x, s, (nb_dtype)dt);
      tc_assert_close_tol(nb_tile(t, reps), ref, os, 0);
      free(x);
      free(ref);
    }
  }
}

Test(shape, tile_and_repeat_of_rank_eight_tensors) {
  /* one axis more than NB_MAX_DIMS would be needed by a naive interleave */
  double x[2] = {1, 2};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(1, 1, 1, 1, 1, 1, 1, 2), NB_F32);
  double rt[8] = {1, 2, 1, 2, 1, 2, 1, 2}, rr[4] = {1, 1, 2, 2};
  tc_assert_close_tol(nb_tile(t, NB_SHAPE(2, 1, 1, 1, 1, 1, 1, 2)), rt,
                      NB_SHAPE(2, 1, 1, 1, 1, 1, 1, 4), 0);
  tc_assert_close_tol(nb_repeat(t, 2, -1), rr, NB_SHAPE(1, 1, 1, 1, 1, 1, 1, 4), 0);
}

Test(shape, repeat_and_tile_reject_bad_input) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  cr_assert_null(nb_repeat(NULL, 2, 0));
  tc_assert_error(NB_ERR_NULL, "nb_repeat");
  cr_assert_null(nb_repeat(t, -1, 0));
  tc_assert_error(NB_ERR_ARG, "nb_repeat: repeats is -1");
  cr_assert_null(nb_repeat(t, 2, 2));
  tc_assert_error(NB_ERR_AXIS, "nb_repeat: axis 2 out of range for rank 2");
  cr_assert_null(nb_repeat(nb_scalar(1, NB_F32), 2, 0));
  tc_assert_error(NB_ERR_AXIS, "for rank 0");
  cr_assert_null(nb_repeat(t, INT64_MAX, 0));
  tc_assert_error(NB_ERR_OVERFLOW, "nb_repeat");
  cr_assert_null(nb_tile(NULL, NB_SHAPE(2)));
  tc_assert_error(NB_ERR_NULL, "nb_tile");
  cr_assert_null(nb_tile(t, NB_SHAPE(2, -1)));
  tc_assert_error(NB_ERR_ARG, "nb_tile: negative repetition in reps [2,-1]");
  cr_assert_null(nb_tile(t, (nb_shape){.ndim = 9}));
  tc_assert_error(NB_ERR_ARG, "nb_tile: reps has 9 entries");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}
