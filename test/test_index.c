/* test/test_index.c — indexing: take, take_along_axis, scatter_add, the
 * internal scatter_add_along_axis, one_hot. Results are checked against
 * references written as index arithmetic on double arrays; out-of-range
 * indices must fail at realization with NB_ERR_INDEX. */
#include "../src/ops/index.h"
#include "common.h"

TestSuite(index, .init = tc_setup, .fini = tc_teardown);

/* ---- helpers --------------------------------------------------------------------- */

/* n valid indices for an axis of size `size`, negative half the time. */
static double *rand_indices(int64_t n, int64_t size, uint64_t *seed) {
  double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++) {
    int64_t v = tc_randint(seed, 0, size - 1);
    x[i] = (double)(tc_randint(seed, 0, 1) ? v : v - size);
  }
  return x;
}

static double *alloc_values(int64_t n) { return malloc((size_t)(n ? n : 1) * sizeof(double)); }

/* Some tensor holding x: contiguous or strided at random. */
static nb_tensor *any_tensor(const double *x, nb_shape s, nb_dtype dt, uint64_t *seed) {
  return tc_randint(seed, 0, 1) ? tc_strided_tensor(x, s, dt) : tc_tensor(x, s, dt);
}

static nb_dtype index_dtype(uint64_t *seed) { return tc_randint(seed, 0, 1) ? NB_I32 : NB_I64; }

/* Asserts reading t fails with NB_ERR_INDEX and a message containing msg,
 * through both nb_to_host and nb_eval, and leaves t unrealized. */
static void assert_index_error(nb_tensor *t, const char *msg) {
  cr_assert(t, "the op itself must succeed: %s", nb_last_error());
  size_t nbytes = (size_t)nb_numel(t) * nb_dtype_size(nb_dtype_of(t));
  void *buf = malloc(nbytes ? nbytes : 1);
  /* a GPU kernel reports the same index, axis and size as the CPU */
  cr_assert_eq(nb_to_host(t, buf, nbytes), NB_ERR_INDEX);
  tc_assert_error(NB_ERR_INDEX, msg);
  cr_assert_eq(nb_eval(&t, 1), NB_ERR_INDEX);
  tc_assert_error(NB_ERR_INDEX, msg);
  cr_assert(!nb_is_realized(t));
  free(buf);
}

/* Shape of take: t[:axis] + idx + t[axis+1:]. */
static nb_shape take_shape(nb_shape t, nb_shape idx, int axis) {
  nb_shape o = {0};
  for (int d = 0; d < axis; d++)
    o.dims[o.ndim++] = t.dims[d];
  for (int d = 0; d < idx.ndim; d++)
    o.dims[o.ndim++] = idx.dims[d];
  for (int d = axis + 1; d < t.ndim; d++)
    o.dims[o.ndim++] = t.dims[d];
  return o;
}

/* Position in t read (take) or written (scatter_add) for output position j of
 * take(t, idx, axis). */
static int64_t take_source(const int64_t *j, nb_shape ts, nb_shape is, const double *ix, int axis) {
  int64_t i[NB_MAX_DIMS];
  for (int d = 0; d < axis; d++)
    i[d] = j[d];
  int64_t v = (int64_t)ix[tc_ravel(j + axis, &is)];
  i[axis] = v < 0 ? v + ts.dims[axis] : v;
  for (int d = axis + 1; d < ts.ndim; d++)
    i[d] = j[d - 1 + is.ndim];
  return tc_ravel(i, &ts);
}

/* Shape of take_along_axis: idx's extent on axis, broadcast elsewhere. */
static nb_shape along_shape(nb_shape t, nb_shape idx, int axis) {
  nb_shape o = idx;
  for (int d = 0; d < t.ndim; d++)
    if (d != axis && idx.dims[d] == 1) o.dims[d] = t.dims[d];
  return o;
}

/* Position in t for position j of take_along_axis(t, idx, axis) (size-1 dims
 * of t and idx broadcast). */
static int64_t along_source(const int64_t *j, nb_shape ts, nb_shape is, const double *ix,
                            int axis) {
  int64_t i[NB_MAX_DIMS], k[NB_MAX_DIMS];
  for (int d = 0; d < ts.ndim; d++)
    k[d] = is.dims[d] == 1 ? 0 : j[d];
  int64_t v = (int64_t)ix[tc_ravel(k, &is)];
  for (int d = 0; d < ts.ndim; d++)
    i[d] = d == axis ? (v < 0 ? v + ts.dims[d] : v) : ts.dims[d] == 1 ? 0 : j[d];
  return tc_ravel(i, &ts);
}

/* Adds u into *acc as scatter_add does in dtype dt (bool: logical or). */
static void ref_accumulate(double *acc, double u, nb_dtype dt) {
  *acc = dt == NB_BOOL ? (double)(*acc != 0 || u != 0) : *acc + u;
}

/* Random t / idx shapes for the along-axis ops: same rank, each non-axis dim
 * equal, or 1 in t, or 1 in idx. */
static void rand_along_shapes(uint64_t *seed, nb_shape *ts, nb_shape *is, int *axis) {
  *ts = tc_rand_shape(seed, 1, 4, 1, 3);
  *is = *ts;
  *axis = (int)tc_randint(seed, 0, ts->ndim - 1);
  for (int d = 0; d < ts->ndim; d++) {
    if (d == *axis) {
      is->dims[d] = tc_randint(seed, 0, 3);
      continue;
    }
    int64_t c = tc_randint(seed, 0, 3);
    if (c == 1) ts->dims[d] = 1;
    if (c == 2) is->dims[d] = 1;
    if (c == 3) ts->dims[d] = is->dims[d] = 0;
  }
}

/* ---- take ------------------------------------------------------------------------- */

Test(index, take_random_every_dtype) {
  uint64_t seed = 1;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 15; trial++) {
      nb_shape ts = tc_rand_shape(&seed, 1, 3, 0, 4), is = tc_rand_shape(&seed, 0, 2, 0, 3);
      int axis = (int)tc_randint(&seed, 0, ts.ndim - 1);
      if (ts.dims[axis] == 0 && tc_numel(is) > 0) is = NB_SHAPE(0); /* no valid index exists */
      double *x = tc_rand_ints(tc_numel(ts), (nb_dtype)dt, &seed, 20);
      double *ix = rand_indices(tc_numel(is), ts.dims[axis], &seed);
      nb_shape os = take_shape(ts, is, axis);
      int64_t on = tc_numel(os), j[NB_MAX_DIMS];
      double *ref = alloc_values(on);
      for (int64_t q = 0; q < on; q++) {
        tc_unravel(q, &os, j);
        ref[q] = x[take_source(j, ts, is, ix, axis)];
      }
      nb_tensor *t = any_tensor(x, ts, (nb_dtype)dt, &seed);
      nb_tensor *idx = any_tensor(ix, is, index_dtype(&seed), &seed);
      tc_assert_close_tol(nb_take(t, idx, tc_randint(&seed, 0, 1) ? axis : axis - ts.ndim), ref, os,
                          0);
      free(x);
      free(ix);
      free(ref);
    }
  }
}

Test(index, take_with_0d_index_drops_the_axis) {
  double x[6] = {0, 1, 2, 3, 4, 5}, r1[2] = {2, 5}, r0[3] = {3, 4, 5};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F64);
  tc_assert_close_tol(nb_take(t, nb_scalar(-1, NB_I64), 1), r1, NB_SHAPE(2), 0);
  tc_assert_close_tol(nb_take(t, nb_scalar(1, NB_I32), 0), r0, NB_SHAPE(3), 0);
}

Test(index, take_large_embedding_lookup) {
  /* big enough for the threaded path: [2000] rows of 64 from a [500, 64] table */
  uint64_t seed = 2;
  nb_shape ts = NB_SHAPE(500, 64), is = NB_SHAPE(40, 50);
  double *x = tc_rand_ints(500 * 64, NB_F32, &seed, 20), *ix = rand_indices(2000, 500, &seed);
  nb_shape os = take_shape(ts, is, 0);
  int64_t on = tc_numel(os), j[NB_MAX_DIMS];
  double *ref = alloc_values(on);
  for (int64_t q = 0; q < on; q++) {
    tc_unravel(q, &os, j);
    ref[q] = x[take_source(j, ts, is, ix, 0)];
  }
  nb_tensor *t = tc_tensor(x, ts, NB_F32), *idx = tc_tensor(ix, is, NB_I64);
  tc_assert_close_tol(nb_take(t, idx, 0), ref, os, 0);
  /* and the same on a strided table along its last axis */
  nb_tensor *tt = tc_strided_tensor(x, ts, NB_F32);
  double *ix2 = rand_indices(2000, 64, &seed);
  nb_shape os2 = take_shape(ts, is, 1);
  double *ref2 = alloc_values(tc_numel(os2));
  for (int64_t q = 0; q < tc_numel(os2); q++) {
    tc_unravel(q, &os2, j);
    ref2[q] = x[take_source(j, ts, is, ix2, 1)];
  }
  tc_assert_close_tol(nb_take(tt, tc_tensor(ix2, is, NB_I32), 1), ref2, os2, 0);
  free(x);
  free(ix);
  free(ix2);
  free(ref);
  free(ref2);
}

Test(index, take_out_of_range_index_fails_at_realization) {
  double x[6] = {0, 1, 2, 3, 4, 5};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  assert_index_error(nb_take(t, tc_tensor((double[]){0, 3}, NB_SHAPE(2), NB_I64), 1),
                     "nb_take: index 3 out of range for axis 1 of size 3");
  assert_index_error(nb_take(t, tc_tensor((double[]){-3}, NB_SHAPE(1), NB_I32), 0),
                     "nb_take: index -3 out of range for axis 0 of size 2");
  assert_index_error(nb_take(nb_zeros(NB_SHAPE(0, 2), NB_F32), nb_scalar(0, NB_I32), 0),
                     "nb_take: index 0 out of range for axis 0 of size 0");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

Test(index, take_rejects_bad_input) {
  double x[6] = {0, 1, 2, 3, 4, 5};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  nb_tensor *idx = tc_tensor((double[]){0, 1}, NB_SHAPE(2), NB_I64);
  cr_assert_null(nb_take(NULL, idx, 0));
  tc_assert_error(NB_ERR_NULL, "nb_take: argument 1 is NULL");
  cr_assert_null(nb_take(t, NULL, 0));
  tc_assert_error(NB_ERR_NULL, "nb_take: argument 2 is NULL");
  cr_assert_null(nb_take(t, nb_zeros(NB_SHAPE(2), NB_F32), 0));
  tc_assert_error(NB_ERR_DTYPE,
                  "nb_take: indices must be integers (i32, i64, u8, i8 or i16), got f32");
  cr_assert_null(nb_take(t, nb_zeros(NB_SHAPE(2), NB_BOOL), 0));
  tc_assert_error(NB_ERR_DTYPE, "got bool");
  cr_assert_null(nb_take(t, idx, 2));
  tc_assert_error(NB_ERR_AXIS, "nb_take: axis 2 out of range for rank 2");
  cr_assert_null(nb_take(nb_scalar(1, NB_F32), idx, 0));
  tc_assert_error(NB_ERR_AXIS, "for rank 0");
  nb_tensor *big = nb_zeros(NB_SHAPE(1, 1, 1, 1, 1, 1, 1, 1), NB_I32);
  cr_assert_null(nb_take(t, big, 0));
  tc_assert_error(NB_ERR_SHAPE,
                  "nb_take: result of t [2,3] with idx [1,1,1,1,1,1,1,1] would have rank 9");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- take_along_axis ----------------------------------------------------------------- */

Test(index, take_along_axis_random_with_broadcasting) {
  uint64_t seed = 3;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 15; trial++) {
      nb_shape ts, is;
      int axis;
      rand_along_shapes(&seed, &ts, &is, &axis);
      double *x = tc_rand_ints(tc_numel(ts), (nb_dtype)dt, &seed, 20);
      double *ix = rand_indices(tc_numel(is), ts.dims[axis], &seed);
      nb_shape os = along_shape(ts, is, axis);
      int64_t on = tc_numel(os), j[NB_MAX_DIMS];
      double *ref = alloc_values(on);
      for (int64_t q = 0; q < on; q++) {
        tc_unravel(q, &os, j);
        ref[q] = x[along_source(j, ts, is, ix, axis)];
      }
      nb_tensor *t = any_tensor(x, ts, (nb_dtype)dt, &seed);
      nb_tensor *idx = any_tensor(ix, is, index_dtype(&seed), &seed);
      tc_assert_close_tol(
          nb_take_along_axis(t, idx, tc_randint(&seed, 0, 1) ? axis : axis - ts.ndim), ref, os, 0);
      free(x);
      free(ix);
      free(ref);
    }
  }
}

Test(index, take_along_axis_large_argmax_style_gather) {
  /* [300, 200] f64, one index per row along axis 1, then all rows along axis 0 */
  uint64_t seed = 4;
  nb_shape ts = NB_SHAPE(300, 200), is = NB_SHAPE(300, 1), is0 = NB_SHAPE(200, 200);
  double *x = tc_rand_ints(60000, NB_F64, &seed, 20);
  double *ix = rand_indices(300, 200, &seed), *ix0 = rand_indices(40000, 300, &seed);
  nb_tensor *t = tc_tensor(x, ts, NB_F64);
  double ref[300];
  int64_t j[2];
  for (int64_t q = 0; q < 300; q++) {
    tc_unravel(q, &is, j);
    ref[q] = x[along_source(j, ts, is, ix, 1)];
  }
  tc_assert_close_tol(nb_take_along_axis(t, tc_tensor(ix, is, NB_I32), -1), ref, is, 0);
  double *ref0 = alloc_values(40000);
  for (int64_t q = 0; q < 40000; q++) {
    tc_unravel(q, &is0, j);
    ref0[q] = x[along_source(j, ts, is0, ix0, 0)];
  }
  tc_assert_close_tol(nb_take_along_axis(t, tc_tensor(ix0, is0, NB_I64), 0), ref0, is0, 0);
  free(x);
  free(ix);
  free(ix0);
  free(ref0);
}

Test(index, take_along_axis_out_of_range_index_fails_at_realization) {
  double x[6] = {0, 1, 2, 3, 4, 5};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  nb_tensor *idx = tc_tensor((double[]){0, 2, 1, 7}, NB_SHAPE(2, 2), NB_I32);
  assert_index_error(nb_take_along_axis(t, idx, 1),
                     "nb_take_along_axis: index 7 out of range for axis 1 of size 3");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

Test(index, take_along_axis_rejects_bad_input) {
  double x[6] = {0, 1, 2, 3, 4, 5};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  nb_tensor *idx = tc_tensor((double[]){0, 1}, NB_SHAPE(2, 1), NB_I64);
  cr_assert_null(nb_take_along_axis(NULL, idx, 1));
  tc_assert_error(NB_ERR_NULL, "nb_take_along_axis: argument 1 is NULL");
  cr_assert_null(nb_take_along_axis(t, NULL, 1));
  tc_assert_error(NB_ERR_NULL, "nb_take_along_axis: argument 2 is NULL");
  cr_assert_null(nb_take_along_axis(t, nb_zeros(NB_SHAPE(2, 1), NB_F64), 1));
  tc_assert_error(
      NB_ERR_DTYPE,
      "nb_take_along_axis: indices must be integers (i32, i64, u8, i8 or i16), got f64");
  cr_assert_null(nb_take_along_axis(t, nb_zeros(NB_SHAPE(2), NB_I32), 1));
  tc_assert_error(NB_ERR_SHAPE, "nb_take_along_axis: idx [2] must have the rank of t [2,3]");
  cr_assert_null(nb_take_along_axis(t, nb_zeros(NB_SHAPE(3, 1), NB_I32), 1));
  tc_assert_error(NB_ERR_SHAPE,
                  "nb_take_along_axis: idx [3,1] does not broadcast with t [2,3] outside axis 1");
  cr_assert_null(nb_take_along_axis(t, idx, -3));
  tc_assert_error(NB_ERR_AXIS, "nb_take_along_axis: axis -3 out of range for rank 2");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- scatter_add ------------------------------------------------------------------ */

Test(index, scatter_add_random_every_dtype) {
  uint64_t seed = 5;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 15; trial++) {
      nb_shape ts = tc_rand_shape(&seed, 1, 3, 0, 4), is = tc_rand_shape(&seed, 0, 2, 0, 4);
      int axis = (int)tc_randint(&seed, 0, ts.ndim - 1);
      if (ts.dims[axis] == 0 && tc_numel(is) > 0) is = NB_SHAPE(0);
      nb_shape us = take_shape(ts, is, axis);
      double *x = tc_rand_ints(tc_numel(ts), (nb_dtype)dt, &seed, 20);
      double *u = tc_rand_ints(tc_numel(us), (nb_dtype)dt, &seed, 20);
      double *ix = rand_indices(tc_numel(is), ts.dims[axis], &seed); /* repeats are likely */
      double *ref = alloc_values(tc_numel(ts));
      memcpy(ref, x, (size_t)tc_numel(ts) * sizeof *x);
      int64_t j[NB_MAX_DIMS];
      for (int64_t q = 0; q < tc_numel(us); q++) {
        tc_unravel(q, &us, j);
        ref_accumulate(&ref[take_source(j, ts, is, ix, axis)], u[q], (nb_dtype)dt);
      }
      tc_round_to(ref, tc_numel(ts), (nb_dtype)dt);
      nb_tensor *t = any_tensor(x, ts, (nb_dtype)dt, &seed);
      nb_tensor *idx = any_tensor(ix, is, index_dtype(&seed), &seed);
      nb_tensor *upd = any_tensor(u, us, (nb_dtype)dt, &seed);
      nb_tensor *r = nb_scatter_add(t, idx, upd, tc_randint(&seed, 0, 1) ? axis : axis - ts.ndim);
      cr_assert_eq((int)nb_dtype_of(r), dt);
      tc_assert_close_tol(r, ref, ts, 0);
      free(x);
      free(u);
      free(ix);
      free(ref);
    }
  }
}

Test(index, scatter_add_repeated_indices_accumulate) {
  double x[3] = {10, 20, 30}, u[5] = {1, 2, 3, 4, 5}, ix[5] = {0, 2, 0, -3, 1};
  double ref[3] = {10 + 1 + 3 + 4, 20 + 5, 30 + 2};
  nb_tensor *r =
      nb_scatter_add(tc_tensor(x, NB_SHAPE(3), NB_I32), tc_tensor(ix, NB_SHAPE(5), NB_I64),
                     tc_tensor(u, NB_SHAPE(5), NB_I32), 0);
  tc_assert_close_tol(r, ref, NB_SHAPE(3), 0);
  double b[3] = {0, 1, 0}, bu[2] = {1, 0}, bi[2] = {2, 0}, bref[3] = {0, 1, 1};
  nb_tensor *rb =
      nb_scatter_add(tc_tensor(b, NB_SHAPE(3), NB_BOOL), tc_tensor(bi, NB_SHAPE(2), NB_I32),
                     tc_tensor(bu, NB_SHAPE(2), NB_BOOL), 0);
  tc_assert_close_tol(rb, bref, NB_SHAPE(3), 0);
}

Test(index, scatter_add_half_precision_accumulates_in_f32) {
  /* 2048 + 1 + 1 in f16: one add at a time would round back to 2048 twice;
   * through f32 the sum is 2050, representable. bf16: 256 + 1 + 1 = 258. */
  double ix[2] = {0, 0}, u[2] = {1, 1};
  nb_tensor *idx = tc_tensor(ix, NB_SHAPE(2), NB_I32);
  double r16 = 2050, rb16 = 258;
  tc_assert_close_tol(
      nb_scatter_add(nb_full(NB_SHAPE(1), 2048, NB_F16), idx, tc_tensor(u, NB_SHAPE(2), NB_F16), 0),
      &r16, NB_SHAPE(1), 0);
  tc_assert_close_tol(nb_scatter_add(nb_full(NB_SHAPE(1), 256, NB_BF16), idx,
                                     tc_tensor(u, NB_SHAPE(2), NB_BF16), 0),
                      &rb16, NB_SHAPE(1), 0);
}

Test(index, scatter_add_large_embedding_gradient) {
  /* the transpose of an embedding lookup, threaded: [64, 200] += [64, 3000] along axis 1 */
  uint64_t seed = 6;
  nb_shape ts = NB_SHAPE(64, 200), is = NB_SHAPE(3000), us = NB_SHAPE(64, 3000);
  double *x = tc_rand_ints(tc_numel(ts), NB_F32, &seed, 20),
         *u = tc_rand_ints(tc_numel(us), NB_F32, &seed, 20);
  double *ix = rand_indices(3000, 200, &seed);
  double *ref = alloc_values(tc_numel(ts));
  memcpy(ref, x, (size_t)tc_numel(ts) * sizeof *x);
  int64_t j[NB_MAX_DIMS];
  for (int64_t q = 0; q < tc_numel(us); q++) {
    tc_unravel(q, &us, j);
    ref[take_source(j, ts, is, ix, 1)] += u[q];
  }
  nb_tensor *r = nb_scatter_add(tc_tensor(x, ts, NB_F32), tc_tensor(ix, is, NB_I64),
                                tc_tensor(u, us, NB_F32), 1);
  tc_assert_close_tol(r, ref, ts, 0);
  free(x);
  free(u);
  free(ix);
  free(ref);
}

Test(index, scatter_add_out_of_range_index_fails_at_realization) {
  double x[4] = {0, 1, 2, 3};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(4), NB_F64);
  nb_tensor *r = nb_scatter_add(t, tc_tensor((double[]){1, -5}, NB_SHAPE(2), NB_I64),
                                nb_ones(NB_SHAPE(2), NB_F64), 0);
  assert_index_error(r, "nb_scatter_add: index -5 out of range for axis 0 of size 4");
  tc_assert_unchanged(t, x, NB_SHAPE(4));
}

Test(index, scatter_add_rejects_bad_input) {
  double x[6] = {0, 1, 2, 3, 4, 5};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  nb_tensor *idx = tc_tensor((double[]){0, 1, 1, 0}, NB_SHAPE(4), NB_I32);
  nb_tensor *u = nb_ones(NB_SHAPE(2, 4), NB_F32);
  cr_assert_null(nb_scatter_add(NULL, idx, u, 1));
  tc_assert_error(NB_ERR_NULL, "nb_scatter_add: argument 1 is NULL");
  cr_assert_null(nb_scatter_add(t, NULL, u, 1));
  tc_assert_error(NB_ERR_NULL, "nb_scatter_add: argument 2 is NULL");
  cr_assert_null(nb_scatter_add(t, idx, NULL, 1));
  tc_assert_error(NB_ERR_NULL, "nb_scatter_add: argument 3 is NULL");
  cr_assert_null(nb_scatter_add(t, nb_zeros(NB_SHAPE(4), NB_F16), u, 1));
  tc_assert_error(NB_ERR_DTYPE,
                  "nb_scatter_add: indices must be integers (i32, i64, u8, i8 or i16), got f16");
  cr_assert_null(nb_scatter_add(t, idx, nb_ones(NB_SHAPE(2, 4), NB_F64), 1));
  tc_assert_error(NB_ERR_DTYPE, "nb_scatter_add: updates are f64 but t is f32");
  cr_assert_null(nb_scatter_add(t, idx, nb_ones(NB_SHAPE(4, 2), NB_F32), 1));
  tc_assert_error(
      NB_ERR_SHAPE,
      "nb_scatter_add: updates have shape [4,2], expected [2,4] for t [2,3], idx [4], axis 1");
  cr_assert_null(nb_scatter_add(t, idx, u, 5));
  tc_assert_error(NB_ERR_AXIS, "nb_scatter_add: axis 5 out of range for rank 2");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- scatter_add_along_axis (internal) --------------------------------------------------- */

Test(index, scatter_add_along_axis_random_with_broadcasting) {
  uint64_t seed = 7;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 15; trial++) {
      nb_shape ts, is;
      int axis;
      rand_along_shapes(&seed, &ts, &is, &axis);
      nb_shape us = along_shape(ts, is, axis);
      double *x = tc_rand_ints(tc_numel(ts), (nb_dtype)dt, &seed, 20);
      double *u = tc_rand_ints(tc_numel(us), (nb_dtype)dt, &seed, 20);
      double *ix = rand_indices(tc_numel(is), ts.dims[axis], &seed);
      double *ref = alloc_values(tc_numel(ts));
      memcpy(ref, x, (size_t)tc_numel(ts) * sizeof *x);
      int64_t j[NB_MAX_DIMS];
      for (int64_t q = 0; q < tc_numel(us); q++) {
        tc_unravel(q, &us, j);
        ref_accumulate(&ref[along_source(j, ts, is, ix, axis)], u[q], (nb_dtype)dt);
      }
      tc_round_to(ref, tc_numel(ts), (nb_dtype)dt);
      nb_tensor *t = any_tensor(x, ts, (nb_dtype)dt, &seed);
      nb_tensor *idx = any_tensor(ix, is, index_dtype(&seed), &seed);
      nb_tensor *upd = any_tensor(u, us, (nb_dtype)dt, &seed);
      nb_tensor *r =
          nbi_scatter_add_along_axis(t, idx, upd, tc_randint(&seed, 0, 1) ? axis : axis - ts.ndim);
      tc_assert_close_tol(r, ref, ts, 0);
      free(x);
      free(u);
      free(ix);
      free(ref);
    }
  }
}

Test(index, scatter_add_along_axis_large_is_transpose_of_gather) {
  /* threaded rows: [400, 100] f32, 100 indices per row along axis 1 */
  uint64_t seed = 8;
  nb_shape ts = NB_SHAPE(400, 100), is = NB_SHAPE(400, 100);
  double *x = tc_rand_ints(40000, NB_F32, &seed, 20), *u = tc_rand_ints(40000, NB_F32, &seed, 20);
  double *ix = rand_indices(40000, 100, &seed), *ref = alloc_values(40000);
  memcpy(ref, x, 40000 * sizeof *x);
  int64_t j[2];
  for (int64_t q = 0; q < 40000; q++) {
    tc_unravel(q, &is, j);
    ref[along_source(j, ts, is, ix, 1)] += u[q];
  }
  nb_tensor *r = nbi_scatter_add_along_axis(tc_tensor(x, ts, NB_F32), tc_tensor(ix, is, NB_I32),
                                            tc_tensor(u, is, NB_F32), 1);
  tc_assert_close_tol(r, ref, ts, 0);
  free(x);
  free(u);
  free(ix);
  free(ref);
}

Test(index, scatter_add_along_axis_out_of_range_index_fails_at_realization) {
  nb_tensor *t = nb_zeros(NB_SHAPE(2, 2), NB_F32);
  nb_tensor *idx = tc_tensor((double[]){0, 2}, NB_SHAPE(2, 1), NB_I32);
  assert_index_error(nbi_scatter_add_along_axis(t, idx, nb_ones(NB_SHAPE(2, 1), NB_F32), 1),
                     "nb_scatter_add_along_axis: index 2 out of range for axis 1 of size 2");
}

Test(index, scatter_add_along_axis_rejects_bad_input) {
  double x[6] = {0, 1, 2, 3, 4, 5};
  nb_tensor *t = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  nb_tensor *idx = tc_tensor((double[]){0, 1}, NB_SHAPE(2, 1), NB_I64);
  nb_tensor *u = nb_ones(NB_SHAPE(2, 1), NB_F32);
  cr_assert_null(nbi_scatter_add_along_axis(t, idx, NULL, 1));
  tc_assert_error(NB_ERR_NULL, "nb_scatter_add_along_axis: argument 3 is NULL");
  cr_assert_null(nbi_scatter_add_along_axis(t, nb_zeros(NB_SHAPE(2, 1), NB_F32), u, 1));
  tc_assert_error(NB_ERR_DTYPE, "indices must be integers (i32, i64, u8, i8 or i16)");
  cr_assert_null(nbi_scatter_add_along_axis(t, nb_zeros(NB_SHAPE(2), NB_I32), u, 1));
  tc_assert_error(NB_ERR_SHAPE, "must have the rank of t");
  cr_assert_null(nbi_scatter_add_along_axis(t, idx, nb_ones(NB_SHAPE(2, 3), NB_F32), 1));
  tc_assert_error(NB_ERR_SHAPE, "updates have shape [2,3], expected [2,1]");
  cr_assert_null(nbi_scatter_add_along_axis(t, idx, nb_ones(NB_SHAPE(2, 1), NB_I32), 1));
  tc_assert_error(NB_ERR_DTYPE, "updates are i32 but t is f32");
  cr_assert_null(nbi_scatter_add_along_axis(t, idx, u, 2));
  tc_assert_error(NB_ERR_AXIS, "axis 2 out of range");
  tc_assert_unchanged(t, x, NB_SHAPE(2, 3));
}

/* ---- one_hot ------------------------------------------------------------------------ */

Test(index, one_hot_random_every_dtype) {
  uint64_t seed = 9;
  for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
    for (int trial = 0; trial < 8; trial++) {
      nb_shape is = tc_rand_shape(&seed, 0, 3, 0, 3);
      int64_t n = tc_randint(&seed, 0, 5), m = tc_numel(is);
      double *ix = alloc_values(m);
      for (int64_t k = 0; k < m; k++)
        ix[k] = (double)tc_randint(&seed, -2, n + 1); /* some outside [0, n) */
      nb_shape os = is;
      os.dims[os.ndim++] = n;
      double *ref = alloc_values(m * n);
      for (int64_t k = 0; k < m; k++)
        for (int64_t c = 0; c < n; c++)
          ref[k * n + c] = ix[k] == (double)c;
      nb_tensor *idx = any_tensor(ix, is, index_dtype(&seed), &seed);
      nb_tensor *r = nb_one_hot(idx, n, (nb_dtype)dt);
      cr_assert_eq((int)nb_dtype_of(r), dt);
      tc_assert_close_tol(r, ref, os, 0);
      free(ix);
      free(ref);
    }
  }
}

Test(index, one_hot_rejects_bad_input) {
  nb_tensor *idx = tc_tensor((double[]){0, 1}, NB_SHAPE(2), NB_I32);
  cr_assert_null(nb_one_hot(NULL, 3, NB_F32));
  tc_assert_error(NB_ERR_NULL, "nb_one_hot");
  cr_assert_null(nb_one_hot(nb_zeros(NB_SHAPE(2), NB_F32), 3, NB_F32));
  tc_assert_error(NB_ERR_DTYPE,
                  "nb_one_hot: indices must be integers (i32, i64, u8, i8 or i16), got f32");
  cr_assert_null(nb_one_hot(idx, -1, NB_F32));
  tc_assert_error(NB_ERR_ARG, "nb_one_hot: n is -1");
  cr_assert_null(nb_one_hot(idx, 3, (nb_dtype)42));
  tc_assert_error(NB_ERR_DTYPE, "nb_one_hot: invalid dtype 42");
  cr_assert_null(nb_one_hot(nb_zeros(NB_SHAPE(1, 1, 1, 1, 1, 1, 1, 1), NB_I64), 3, NB_F32));
  tc_assert_error(NB_ERR_SHAPE, "nb_one_hot: idx already has the maximum rank 8");
  tc_assert_unchanged(idx, (double[]){0, 1}, NB_SHAPE(2));
}
