/* test/test_linalg.c — nb_matmul against a float64 triple-loop reference: every
 * dtype, 1-D / 2-D / batched / broadcast shapes, size-0 and size-1 dims, sizes
 * that thread, dtype promotion, the kernel on hand-made strided views
 * (transpose folding, packing, broadcast batches), bad inputs. */
#include "common.h"

#include <omp.h>

#include "../src/backends/cpu/cpu.h"

TestSuite(linalg, .init = tc_setup, .fini = tc_teardown);

static const nb_dtype all_dtypes[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64, NB_BOOL};
#define N_DTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))

/* NumPy matmul in float64 of row-major a (shape sa) and b (shape sb): the
 * result shape in *so, the values malloc'd. Bool results are 0/1. */
static double *ref_matmul(const double *a, nb_shape sa, const double *b, nb_shape sb, nb_shape *so,
                          bool to_bool) {
  nb_shape A = sa, B = sb;
  if (sa.ndim == 1) A = NB_SHAPE(1, sa.dims[0]);
  if (sb.ndim == 1) B = NB_SHAPE(sb.dims[0], 1);
  int nba = A.ndim - 2, nbb = B.ndim - 2, nbo = nba > nbb ? nba : nbb;
  int64_t m = A.dims[nba], k = A.dims[nba + 1], n = B.dims[nbb + 1];
  nb_shape o = {.ndim = nbo};
  for (int d = 0; d < nbo; d++) {
    int ia = d - (nbo - nba), ib = d - (nbo - nbb);
    int64_t da = ia >= 0 ? A.dims[ia] : 1, db = ib >= 0 ? B.dims[ib] : 1;
    o.dims[d] = da == 1 ? db : da;
  }
  int64_t batches = 1;
  for (int d = 0; d < nbo; d++)
    batches *= o.dims[d];
  if (sa.ndim > 1) o.dims[o.ndim++] = m;
  if (sb.ndim > 1) o.dims[o.ndim++] = n;
  *so = o;
  double *c = calloc((size_t)(batches * m * n) + 1, sizeof *c);
  for (int64_t bi = 0; bi < batches; bi++) {
    int64_t rem = bi, oa = 0, ob = 0, sta = 1, stb = 1;
    for (int d = nbo - 1; d >= 0; d--) {
      int64_t i = rem % o.dims[d];
      rem /= o.dims[d];
      int ia = d - (nbo - nba), ib = d - (nbo - nbb);
      if (ia >= 0) {
        if (A.dims[ia] != 1) oa += i * sta;
        sta *= A.dims[ia];
      }
      if (ib >= 0) {
        if (B.dims[ib] != 1) ob += i * stb;
        stb *= B.dims[ib];
      }
    }
    const double *pa = a + oa * m * k, *pb = b + ob * k * n;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t p = 0; p < k; p++)
          s += pa[i * k + p] * pb[p * n + j];
        c[(bi * m + i) * n + j] = to_bool ? s != 0 : s;
      }
  }
  return c;
}

/* n random values representable in dt: floats in [-1, 1), integers in
 * [-9, 9], bools 0/1. malloc'd. */
static double *rand_values(int64_t n, nb_dtype dt, uint64_t *seed) {
  double *x = malloc((size_t)(n + 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++) {
    double u = tc_uniform(seed, 0, 1);
    x[i] = nb_dtype_is_float(dt) ? 2 * u - 1 : dt == NB_BOOL ? u < 0.5 : floor(19 * u) - 9;
  }
  tc_round_to(x, n, dt);
  return x;
}

/* nb_matmul of random a (sa, da) and b (sb, db) against the reference. */
static void check_matmul(nb_shape sa, nb_dtype da, nb_shape sb, nb_dtype db) {
  uint64_t seed = 42 + (uint64_t)sa.ndim * 7 + (uint64_t)sb.ndim;
  double *a = rand_values(tc_numel(sa), da, &seed), *b = rand_values(tc_numel(sb), db, &seed);
  nb_tensor *c = nb_matmul(tc_tensor(a, sa, da), tc_tensor(b, sb, db));
  cr_assert(c, "nb_matmul failed: %s", nb_last_error());
  nb_dtype dc = nb_promote_types(da, db);
  cr_assert_eq(nb_dtype_of(c), dc, "dtype %s, expected %s", nb_dtype_name(nb_dtype_of(c)),
               nb_dtype_name(dc));
  nb_shape so;
  double *ref = ref_matmul(a, sa, b, sb, &so, dc == NB_BOOL);
  tc_assert_close(c, ref, so);
  free(a);
  free(b);
  free(ref);
}

Test(linalg, matmul_2d_matches_reference_for_every_dtype) {
  for (int i = 0; i < N_DTYPES; i++)
    check_matmul(NB_SHAPE(5, 7), all_dtypes[i], NB_SHAPE(7, 3), all_dtypes[i]);
}

Test(linalg, matmul_1d_operands_follow_numpy) {
  for (int i = 0; i < N_DTYPES; i++) {
    nb_dtype dt = all_dtypes[i];
    check_matmul(NB_SHAPE(4), dt, NB_SHAPE(4, 3), dt);    /* -> [3] */
    check_matmul(NB_SHAPE(3, 4), dt, NB_SHAPE(4), dt);    /* -> [3] */
    check_matmul(NB_SHAPE(4), dt, NB_SHAPE(4), dt);       /* -> [] */
    check_matmul(NB_SHAPE(2, 3, 4), dt, NB_SHAPE(4), dt); /* -> [2,3] */
    check_matmul(NB_SHAPE(4), dt, NB_SHAPE(2, 4, 3), dt); /* -> [2,3] */
  }
  nb_tensor *dot = nb_matmul(nb_ones(NB_SHAPE(6), NB_F32), nb_ones(NB_SHAPE(6), NB_F32));
  cr_assert_eq(nb_ndim(dot), 0);
  cr_assert_eq(nb_item(dot), 6.0);
}

Test(linalg, matmul_batch_dims_broadcast) {
  nb_shape out = nb_shape_of(
      nb_matmul(nb_zeros(NB_SHAPE(2, 1, 3, 4), NB_F32), nb_zeros(NB_SHAPE(5, 4, 6), NB_F32)));
  cr_assert_eq(out.ndim, 4);
  cr_assert(out.dims[0] == 2 && out.dims[1] == 5 && out.dims[2] == 3 && out.dims[3] == 6);
  for (int i = 0; i < N_DTYPES; i++) {
    nb_dtype dt = all_dtypes[i];
    check_matmul(NB_SHAPE(2, 1, 3, 4), dt, NB_SHAPE(5, 4, 6), dt);
    check_matmul(NB_SHAPE(3, 4), dt, NB_SHAPE(2, 4, 5), dt);
    check_matmul(NB_SHAPE(2, 3, 4), dt, NB_SHAPE(2, 4, 5), dt);
    check_matmul(NB_SHAPE(3, 1, 2, 3), dt, NB_SHAPE(1, 4, 3, 2), dt);
  }
}

Test(linalg, matmul_size_zero_dims_give_empty_or_zero_results) {
  for (int i = 0; i < N_DTYPES; i++) {
    nb_dtype dt = all_dtypes[i];
    check_matmul(NB_SHAPE(0, 4), dt, NB_SHAPE(4, 3), dt); /* m = 0 */
    check_matmul(NB_SHAPE(2, 4), dt, NB_SHAPE(4, 0), dt); /* n = 0 */
    check_matmul(NB_SHAPE(2, 0), dt, NB_SHAPE(0, 3), dt); /* k = 0: zeros */
    check_matmul(NB_SHAPE(0), dt, NB_SHAPE(0), dt);       /* empty dot: 0 */
    check_matmul(NB_SHAPE(0, 2, 4), dt, NB_SHAPE(4, 3), dt);
    check_matmul(NB_SHAPE(3, 2, 0), dt, NB_SHAPE(1, 0, 5), dt);
  }
}

Test(linalg, matmul_size_one_dims) {
  for (int i = 0; i < N_DTYPES; i++) {
    nb_dtype dt = all_dtypes[i];
    check_matmul(NB_SHAPE(1, 1), dt, NB_SHAPE(1, 1), dt);
    check_matmul(NB_SHAPE(1, 5), dt, NB_SHAPE(5, 1), dt);
    check_matmul(NB_SHAPE(5, 1), dt, NB_SHAPE(1, 5), dt);
    check_matmul(NB_SHAPE(1, 1, 3, 1), dt, NB_SHAPE(1, 4, 1, 2), dt);
    check_matmul(NB_SHAPE(1), dt, NB_SHAPE(1, 1), dt);
  }
}

Test(linalg, matmul_large_sizes_use_threads) {
  check_matmul(NB_SHAPE(300, 200), NB_F32, NB_SHAPE(200, 100), NB_F32);
  check_matmul(NB_SHAPE(300, 200), NB_F64, NB_SHAPE(200, 100), NB_F64);
  check_matmul(NB_SHAPE(130, 90), NB_BF16, NB_SHAPE(90, 70), NB_BF16);
  check_matmul(NB_SHAPE(120, 100), NB_I64, NB_SHAPE(100, 80), NB_I32);
  check_matmul(NB_SHAPE(120, 100), NB_BOOL, NB_SHAPE(100, 80), NB_BOOL);
  /* many small products: one GEMM per thread */
  check_matmul(NB_SHAPE(64, 8, 9), NB_F32, NB_SHAPE(64, 9, 8), NB_F32);
  check_matmul(NB_SHAPE(64, 8, 9), NB_F64, NB_SHAPE(9, 8), NB_F64);
  check_matmul(NB_SHAPE(4, 16, 8, 10), NB_F16, NB_SHAPE(16, 10, 8), NB_F16);
  /* few medium products: threaded GEMMs one after another */
  check_matmul(NB_SHAPE(3, 160, 70), NB_F64, NB_SHAPE(3, 70, 60), NB_F64);
  check_matmul(NB_SHAPE(2, 200, 120), NB_F32, NB_SHAPE(120, 100), NB_F32);
}

Test(linalg, matmul_promotes_dtypes) {
  nb_dtype pairs[][2] = {{NB_I32, NB_F16},  {NB_F32, NB_F64},  {NB_BOOL, NB_I32}, {NB_I32, NB_I64},
                         {NB_F16, NB_BF16}, {NB_BOOL, NB_F32}, {NB_I64, NB_F64}};
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
    check_matmul(NB_SHAPE(3, 4), pairs[i][0], NB_SHAPE(4, 2), pairs[i][1]);
}

Test(linalg, matmul_integers_accumulate_exactly) {
  /* (2^42 + 1)(2^12 + 1) - 3 is odd and above 2^53: exact only in int64 */
  int64_t a[2] = {((int64_t)1 << 42) + 1, 3}, b[2] = {((int64_t)1 << 12) + 1, -1};
  nb_tensor *c =
      nb_matmul(nb_from_data(a, NB_SHAPE(1, 2), NB_I64), nb_from_data(b, NB_SHAPE(2, 1), NB_I64));
  int64_t got;
  cr_assert_eq(nb_to_host(c, &got, sizeof got), NB_OK);
  int64_t want = (((int64_t)1 << 42) + 1) * (((int64_t)1 << 12) + 1) - 3;
  cr_assert_eq(got, want, "got %lld, expected %lld", (long long)got, (long long)want);
  /* i32: 16777217 is not a float32 */
  int32_t x[2] = {4097, 1}, y[2] = {4095, 16777217 - 4097 * 4095};
  int32_t r;
  cr_assert_eq(nb_to_host(nb_matmul(nb_from_data(x, NB_SHAPE(2), NB_I32),
                                    nb_from_data(y, NB_SHAPE(2), NB_I32)),
                          &r, sizeof r),
               NB_OK);
  cr_assert_eq(r, 16777217);
}

Test(linalg, matmul_bool_is_or_of_ands) {
  uint8_t a[6] = {1, 0, 0, 0, 0, 0}, b[6] = {0, 1, 1, 1, 0, 0};
  /* [[1,0,0],[0,0,0]] @ [[0,1],[1,1],[0,0]] = [[0,1],[0,0]] */
  double ref[4] = {0, 1, 0, 0};
  nb_tensor *c =
      nb_matmul(nb_from_data(a, NB_SHAPE(2, 3), NB_BOOL), nb_from_data(b, NB_SHAPE(3, 2), NB_BOOL));
  cr_assert_eq(nb_dtype_of(c), NB_BOOL);
  tc_assert_close(c, ref, NB_SHAPE(2, 2));
}

/* ---- the kernel on hand-made views ---------------------------------------------------- */

/* A view of mem (dtype dt) at element offset off with the given dims/strides. */
static nbi_view make_view(void *mem, nb_dtype dt, int64_t off, nb_shape dims,
                          const int64_t *strides) {
  nbi_view v = {
      .data = (char *)mem + off * (int64_t)nb_dtype_size(dt), .dtype = dt, .ndim = dims.ndim};
  for (int d = 0; d < dims.ndim; d++) {
    v.dims[d] = dims.dims[d];
    v.strides[d] = strides[d];
  }
  return v;
}

/* The elements of v, read from pool (the doubles mem was made from, same
 * layout), as a row-major array. */
static double *gather(const double *pool, const void *mem, const nbi_view *v) {
  nb_shape s = {.ndim = v->ndim};
  memcpy(s.dims, v->dims, sizeof s.dims);
  int64_t n = tc_numel(s);
  double *x = malloc((size_t)(n + 1) * sizeof *x);
  int64_t base = (v->data - (const char *)mem) / (int64_t)nb_dtype_size(v->dtype);
  for (int64_t i = 0; i < n; i++) {
    int64_t rem = i, off = base;
    for (int d = v->ndim - 1; d >= 0; d--) {
      off += rem % v->dims[d] * v->strides[d];
      rem /= v->dims[d];
    }
    x[i] = pool[off];
  }
  return x;
}

/* Runs the MATMUL kernel on views va, vb of one pool of dtype dt (built by the
 * caller from pool) and compares with the reference. */
static void check_kernel(const double *pool, void *mem, nbi_view va, nbi_view vb) {
  nb_shape sa = {.ndim = va.ndim}, sb = {.ndim = vb.ndim};
  memcpy(sa.dims, va.dims, sizeof sa.dims);
  memcpy(sb.dims, vb.dims, sizeof sb.dims);
  nb_tensor *node = nb_matmul(nb_zeros(sa, va.dtype), nb_zeros(sb, vb.dtype));
  cr_assert(node, "%s", nb_last_error());
  nb_dtype dc = nb_dtype_of(node);
  double *a = gather(pool, mem, &va), *b = gather(pool, mem, &vb);
  nb_shape so;
  double *ref = ref_matmul(a, sa, b, sb, &so, dc == NB_BOOL);
  int64_t n = tc_numel(so);
  nbi_view out = {.data = malloc((size_t)(n + 1) * 8), .dtype = dc, .ndim = so.ndim};
  memcpy(out.dims, so.dims, sizeof out.dims);
  nbi_contig_strides(&so, out.strides);
  nbi_view in[2] = {va, vb};
  cr_assert_eq(nbi_cpu_run_op(NULL, node, &out, in), NB_OK, "%s", nb_last_error());
  double tol = tc_tol(dc);
  for (int64_t i = 0; i < n; i++) {
    double got = nbi_load_f64(out.data, dc, i);
    cr_assert(fabs(got - ref[i]) <= tol * (1 + fabs(ref[i])),
              "%s element %lld: got %.17g, expected %.17g", nb_dtype_name(dc), (long long)i, got,
              ref[i]);
  }
  free(out.data);
  free(a);
  free(b);
  free(ref);
}

/* A pool of POOL random values of dt: doubles in *pool, typed copy returned. */
#define POOL 16384
static void *make_pool(nb_dtype dt, double **pool) {
  uint64_t seed = 99;
  *pool = rand_values(POOL, dt, &seed);
  void *mem = malloc(POOL * 8);
  for (int i = 0; i < POOL; i++)
    nbi_store_f64(mem, dt, i, (*pool)[i]);
  return mem;
}

Test(linalg, kernel_folds_transposed_operands) {
  for (int i = 0; i < N_DTYPES; i++) {
    nb_dtype dt = all_dtypes[i];
    double *pool;
    void *mem = make_pool(dt, &pool);
    /* a [5,4] stored as [4,5]; b [4,3] contiguous at offset 100 */
    nbi_view at = make_view(mem, dt, 0, NB_SHAPE(5, 4), (int64_t[]){1, 5});
    nbi_view b = make_view(mem, dt, 100, NB_SHAPE(4, 3), (int64_t[]){3, 1});
    check_kernel(pool, mem, at, b);
    /* b [4,3] stored as [3,4] */
    nbi_view a = make_view(mem, dt, 200, NB_SHAPE(5, 4), (int64_t[]){4, 1});
    nbi_view bt = make_view(mem, dt, 300, NB_SHAPE(4, 3), (int64_t[]){1, 4});
    check_kernel(pool, mem, a, bt);
    check_kernel(pool, mem, at, bt);
    /* batched, both transposed: [3,5,4] stored [3,4,5], [3,4,2] stored [3,2,4] */
    check_kernel(pool, mem, make_view(mem, dt, 0, NB_SHAPE(3, 5, 4), (int64_t[]){20, 1, 5}),
                 make_view(mem, dt, 500, NB_SHAPE(3, 4, 2), (int64_t[]){8, 1, 4}));
    /* batch dim not outermost: a [3,5,4] stored as [5,3,4] (lda 12) */
    check_kernel(pool, mem, make_view(mem, dt, 7, NB_SHAPE(3, 5, 4), (int64_t[]){4, 12, 1}), b);
    /* transposed with a leading dimension larger than the rows (slice of [4,8]) */
    check_kernel(pool, mem, make_view(mem, dt, 1000, NB_SHAPE(5, 4), (int64_t[]){1, 8}), b);
    free(pool);
    free(mem);
  }
}

Test(linalg, kernel_packs_other_strided_operands) {
  for (int i = 0; i < N_DTYPES; i++) {
    nb_dtype dt = all_dtypes[i];
    double *pool;
    void *mem = make_pool(dt, &pool);
    nbi_view b = make_view(mem, dt, 100, NB_SHAPE(4, 3), (int64_t[]){3, 1});
    /* every other column of a [5,8] buffer */
    check_kernel(pool, mem, make_view(mem, dt, 0, NB_SHAPE(5, 4), (int64_t[]){8, 2}), b);
    /* rows flipped: negative row stride */
    check_kernel(pool, mem, make_view(mem, dt, 16, NB_SHAPE(5, 4), (int64_t[]){-4, 1}), b);
    /* columns flipped */
    check_kernel(pool, mem, make_view(mem, dt, 3, NB_SHAPE(5, 4), (int64_t[]){4, -1}), b);
    /* b's rows all the same row (stride 0) */
    check_kernel(pool, mem, make_view(mem, dt, 0, NB_SHAPE(5, 4), (int64_t[]){4, 1}),
                 make_view(mem, dt, 50, NB_SHAPE(4, 3), (int64_t[]){0, 1}));
    /* 1-D operands with stride 3 and -2 */
    check_kernel(pool, mem, make_view(mem, dt, 0, NB_SHAPE(4), (int64_t[]){3}), b);
    check_kernel(pool, mem, make_view(mem, dt, 0, NB_SHAPE(5, 4), (int64_t[]){4, 1}),
                 make_view(mem, dt, 40, NB_SHAPE(4), (int64_t[]){-2}));
    free(pool);
    free(mem);
  }
}

Test(linalg, kernel_indexes_broadcast_batches_in_place) {
  for (int i = 0; i < N_DTYPES; i++) {
    nb_dtype dt = all_dtypes[i];
    double *pool;
    void *mem = make_pool(dt, &pool);
    /* a [4,5,4] whose batch dim is a stride-0 broadcast, b [4,4,3] contiguous */
    check_kernel(pool, mem, make_view(mem, dt, 0, NB_SHAPE(4, 5, 4), (int64_t[]){0, 4, 1}),
                 make_view(mem, dt, 100, NB_SHAPE(4, 4, 3), (int64_t[]){12, 3, 1}));
    /* broadcast batch and a packed matrix (column step 2) */
    check_kernel(pool, mem, make_view(mem, dt, 0, NB_SHAPE(2, 3, 5, 4), (int64_t[]){0, 40, 8, 2}),
                 make_view(mem, dt, 300, NB_SHAPE(3, 4, 3), (int64_t[]){-12, 1, 4}));
    free(pool);
    free(mem);
  }
}

Test(linalg, kernel_many_small_transposed_products) {
  nb_dtype dts[2] = {NB_F32, NB_F64};
  for (int i = 0; i < 2; i++) {
    double *pool;
    void *mem = make_pool(dts[i], &pool);
    /* 32 products [12,24] @ [24,16]: a stored [32,24,12], b one [16,24] shared */
    check_kernel(pool, mem,
                 make_view(mem, dts[i], 0, NB_SHAPE(32, 12, 24), (int64_t[]){288, 1, 12}),
                 make_view(mem, dts[i], 10000, NB_SHAPE(32, 24, 16), (int64_t[]){0, 1, 24}));
    free(pool);
    free(mem);
  }
}

/* ---- bad inputs ---------------------------------------------------------------------------- */

Test(linalg, matmul_rejects_null) {
  nb_tensor *a = nb_zeros(NB_SHAPE(2, 2), NB_F32);
  cr_assert_null(nb_matmul(NULL, a));
  tc_assert_error(NB_ERR_NULL, "nb_matmul");
  cr_assert_null(nb_matmul(a, NULL));
  tc_assert_error(NB_ERR_NULL, "nb_matmul");
}

Test(linalg, matmul_rejects_inner_dimension_mismatch) {
  double x[6] = {1, 2, 3, 4, 5, 6};
  nb_tensor *a = tc_tensor(x, NB_SHAPE(2, 3), NB_F32);
  cr_assert_null(nb_matmul(a, nb_zeros(NB_SHAPE(4, 5), NB_F32)));
  tc_assert_error(NB_ERR_SHAPE, "nb_matmul: inner dimensions differ: [2,3] @ [4,5]");
  cr_assert_null(nb_matmul(a, nb_zeros(NB_SHAPE(2), NB_F32)));
  tc_assert_error(NB_ERR_SHAPE, "nb_matmul: inner dimensions differ: [2,3] @ [2]");
  cr_assert_null(nb_matmul(nb_zeros(NB_SHAPE(3), NB_F32), a));
  tc_assert_error(NB_ERR_SHAPE, "nb_matmul: inner dimensions differ: [3] @ [2,3]");
  tc_assert_close(a, x, NB_SHAPE(2, 3)); /* input untouched */
}

Test(linalg, matmul_rejects_unbroadcastable_batches) {
  cr_assert_null(
      nb_matmul(nb_zeros(NB_SHAPE(2, 3, 4), NB_F32), nb_zeros(NB_SHAPE(3, 4, 5), NB_F32)));
  tc_assert_error(NB_ERR_SHAPE, "nb_matmul: batch dimensions do not broadcast: [2,3,4] @ [3,4,5]");
}

Test(linalg, matmul_rejects_0d_operands) {
  cr_assert_null(nb_matmul(nb_scalar(2, NB_F32), nb_zeros(NB_SHAPE(3), NB_F32)));
  tc_assert_error(NB_ERR_SHAPE, "nb_matmul: operands must be at least 1-D: [] @ [3]");
  cr_assert_null(nb_matmul(nb_zeros(NB_SHAPE(3), NB_F32), nb_scalar(2, NB_F32)));
  tc_assert_error(NB_ERR_SHAPE, "at least 1-D");
}

Test(linalg, matmul_rejects_results_past_the_size_limit) {
  /* [2^16, 2^16, 1, 1] pending (never allocated) @ [1, 2^17] -> 2^49 elements */
  nb_tensor *big = nb_matmul(nb_zeros(NB_SHAPE(65536, 1, 1, 1), NB_BOOL),
                             nb_zeros(NB_SHAPE(65536, 1, 1), NB_BOOL));
  cr_assert(big, "%s", nb_last_error());
  cr_assert_null(nb_matmul(big, nb_zeros(NB_SHAPE(1, 131072), NB_BOOL)));
  tc_assert_error(NB_ERR_OVERFLOW, "nb_matmul");
}

Test(linalg, matmul_keeps_the_first_error_in_a_chain) {
  nb_tensor *bad = nb_matmul(nb_zeros(NB_SHAPE(2, 3), NB_F32), nb_zeros(NB_SHAPE(2, 3), NB_F32));
  cr_assert_null(nb_matmul(bad, nb_zeros(NB_SHAPE(3, 3), NB_F32)));
  tc_assert_error(NB_ERR_SHAPE, "inner dimensions differ: [2,3] @ [2,3]");
}

/* nbi_cpu_blas_split (gemm.c: f32 and f64 GEMMs where OpenBLAS takes them):
 * every transpose combination, column and row splits, beta != 0, leading
 * dimensions wider than the matrices; the same bits on 1, 2 and 3 threads and
 * a float64 reference within rounding. */
Test(linalg, blas_split_matches_reference_on_any_team) {
  static const int64_t shapes[][3] = {{70, 200, 130}, {300, 40, 120}, {33, 33, 1100}};
  for (int dt_i = 0; dt_i < 2; dt_i++) {
    nb_dtype dt = dt_i ? NB_F64 : NB_F32;
    size_t es = dt == NB_F32 ? 4 : 8;
    for (int s = 0; s < 3; s++)
      for (int tr = 0; tr < 4; tr++) {
        bool ta = tr & 1, tb = tr & 2;
        int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
        int64_t na = (ta ? k : m) * lda, nbb = (tb ? n : k) * ldb, nc = m * ldc;
        double *ra = malloc(sizeof(double) * (size_t)(na + nbb + nc));
        double *rb = ra + na, *rc = rb + nbb;
        void *a = malloc(es * (size_t)na), *b = malloc(es * (size_t)nbb);
        void *c[3];
        for (int64_t i = 0; i < na + nbb + nc; i++) /* small integers over 8: exact in f32 */
          ra[i] = (double)((i * 7919 + 13) % 17 - 8) / 8.0;
        for (int64_t i = 0; i < na; i++)
          dt == NB_F32 ? (((float *)a)[i] = (float)ra[i]) : (((double *)a)[i] = ra[i]);
        for (int64_t i = 0; i < nbb; i++)
          dt == NB_F32 ? (((float *)b)[i] = (float)rb[i]) : (((double *)b)[i] = rb[i]);
        int before = omp_get_max_threads();
        for (int t = 0; t < 3; t++) {
          c[t] = malloc(es * (size_t)nc);
          for (int64_t i = 0; i < nc; i++)
            dt == NB_F32 ? (((float *)c[t])[i] = (float)rc[i]) : (((double *)c[t])[i] = rc[i]);
          omp_set_num_threads(t + 1);
          nbi_cpu_blas_split(dt, ta, tb, m, n, k, 0.5, a, lda, b, ldb, 2.0, c[t], ldc);
        }
        omp_set_num_threads(before);
        for (int t = 1; t < 3; t++)
          cr_assert(memcmp(c[0], c[t], es * (size_t)nc) == 0, "%s %s%s %d threads",
                    nb_dtype_name(dt), ta ? "T" : "N", tb ? "T" : "N", t + 1);
        for (int64_t i = 0; i < m; i++)
          for (int64_t j = 0; j < n; j++) {
            double want = 2.0 * rc[i * ldc + j];
            for (int64_t q = 0; q < k; q++)
              want += 0.5 * ra[ta ? q * lda + i : i * lda + q] * rb[tb ? j * ldb + q : q * ldb + j];
            double got =
                dt == NB_F32 ? ((float *)c[0])[i * ldc + j] : ((double *)c[0])[i * ldc + j];
            cr_assert(fabs(got - want) <= 1e-4 * (1 + fabs(want)), "[%lld, %lld] %g vs %g",
                      (long long)i, (long long)j, got, want);
          }
        for (int t = 0; t < 3; t++)
          free(c[t]);
        free(a), free(b), free(ra);
      }
  }
}
