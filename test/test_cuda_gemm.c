/* test/test_cuda_gemm.c — the CUDA backend's products (src/backends/cuda/cuda_gemm.c,
 * cuda_gemm_kernels.c) on a GPU, against float64 host references and the CPU kernel:
 *  - nbi_cuda_gemm: every float dtype, both transposes, odd sizes, padded leading
 *    dimensions, strided batches with stride-0 (broadcast) operands; the heuristic
 *    cache; TF32 under NB_PRECISION_HIGH; bad arguments;
 *  - nbi_cuda_matmul on hand-made device views (transposed, padded, broadcast,
 *    negative and non-unit strides, 1-D, mixed dtypes, integers, bool, size 0)
 *    against nbi_cpu_matmul on the same views in host memory;
 *  - GEMM epilogue groups given directly to nbi_cuda_gemm_group (every activation,
 *    the sum stored or not, bias [N], [1, N] or strided, an alias member);
 *  - the public API: nb_matmul on tensors made on NB_CUDA(0), and
 *    act(matmul + bias) chains as the planner runs them (fused where it forms a GEMM
 *    group, else member by member), with NaN through relu and
 *    NABLA_CUDA_NO_EPILOGUE=1.
 * Tolerances (QUALITY.md): f64 1e-12, f32 1e-5 (scaled by K / 100 above K = 100),
 * TF32 and f16 / bf16 1e-2, relative with an absolute floor; integers exact.
 * Built only with `make CUDA=1`; every test skips where no GPU answers. */
#ifdef NABLA_CUDA
#include "common.h"

#include "../src/backends/cpu/k_linalg.h"
#include "../src/backends/cuda/cuda_be.h"

TestSuite(cuda_gemm, .init = tc_setup, .fini = tc_teardown);

static const nb_dtype float_dtypes[4] = {NB_F32, NB_F64, NB_F16, NB_BF16};

/* The first GPU's table entry; skips the test where there is none. */
static const nbi_device *gpu(void) {
  if (nb_device_count(NB_DEVICE_CUDA) == 0) cr_skip_test("no CUDA device: %s", nbi_cuda_why());
  int i = nbi_device_lookup("test_cuda_gemm", NB_CUDA(0));
  cr_assert(i >= 0, "cuda:0 does not open: %s", nb_last_error());
  return nbi_device_at(i);
}

static nbi_cuda_ctx *ctx_of(const nbi_device *d) { return (nbi_cuda_ctx *)d->ctx; }

/* A device block holding host's n bytes (uploaded). */
static char *dev_upload(const nbi_device *d, const void *host, size_t n) {
  char *p = d->be->alloc(d->ctx, n ? n : 1);
  cr_assert(p, "device alloc of %zu bytes failed", n);
  if (n) cr_assert_eq(d->be->upload(d->ctx, p, host, n), NB_OK, "upload: %s", nb_last_error());
  return p;
}

/* Waits for the device (failing on a deferred error) and downloads n bytes. */
static void dev_download(const nbi_device *d, void *host, const void *p, size_t n) {
  cr_assert_eq(d->be->sync(d->ctx), NB_OK, "sync: %s", nb_last_error());
  if (n) cr_assert_eq(d->be->download(d->ctx, host, p, n), NB_OK, "download: %s", nb_last_error());
}

/* n random values of dt in host memory (floats in [-1, 1), integers in [-50, 50),
 * bools 0/1), malloc'd with room to spare. */
static void *host_rand(nb_dtype dt, int64_t n, uint64_t *seed) {
  char *p = calloc((size_t)n + 64, 8);
  for (int64_t i = 0; i < n; i++) {
    double u = tc_uniform(seed, -1, 1);
    double v = nb_dtype_is_float(dt) ? u : dt == NB_BOOL ? u > 0.3 : floor(50 * u);
    nbi_store_f64(p, dt, i, v);
  }
  return p;
}

/* Relative tolerance for a product of inner size k in dt (TF32 with tf32). */
static double prod_tol(nb_dtype dt, int64_t k, bool tf32) {
  if (tf32 || dt == NB_F16 || dt == NB_BF16) return 1e-2;
  return tc_tol(dt) * (k > 100 ? (double)k / 100 : 1);
}

/* Counts the elements of got (dt) off ref by more than tol (relative, floor tol)
 * and fails with the first one and the largest error. */
static void assert_near(const char *what, const void *got, nb_dtype dt, const double *ref,
                        int64_t n, double tol) {
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = nbi_load_f64(got, dt, i), r = ref[i];
    bool ok = isnan(r) ? isnan(g) : fabs(g - r) <= tol * (1 + fabs(r));
    if (!ok && first < 0) first = i;
    bad += !ok;
    if (!isnan(r) && fabs(g - r) / (1 + fabs(r)) > worst) worst = fabs(g - r) / (1 + fabs(r));
  }
  cr_assert(bad == 0,
            "%s (%s): %lld of %lld elements off; first [%lld] got %.9g expected %.9g; worst "
            "relative error %.3g (tol %g)",
            what, nb_dtype_name(dt), (long long)bad, (long long)n, (long long)first,
            first >= 0 ? nbi_load_f64(got, dt, first) : 0.0, first >= 0 ? ref[first] : 0.0, worst,
            tol);
}

/* ---- nbi_cuda_gemm -------------------------------------------------------------------------- */

/* One nbi_cuda_gemm of dt against a double loop: C[b] = op(A[b]) op(B[b]) with padded
 * leading dimensions; bcast 1 / 2: A / B has batch stride 0. */
static void check_gemm(const nbi_device *d, nb_dtype dt, bool ta, bool tb, int64_t m, int64_t n,
                       int64_t k, int64_t batch, int bcast, bool tf32) {
  uint64_t seed = 7 + (uint64_t)(m * 31 + n * 7 + k) + (uint64_t)ta * 2 + tb;
  int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 1, ldc = n + 2;
  int64_t ra = ta ? k : m, rb = tb ? n : k;
  int64_t sa = bcast == 1 ? 0 : ra * lda + 5, sb = bcast == 2 ? 0 : rb * ldb, sc = m * ldc + 7;
  int64_t na = sa * (batch - 1) + ra * lda, nb = sb * (batch - 1) + rb * ldb;
  int64_t nc = sc * (batch - 1) + m * ldc;
  size_t es = nb_dtype_size(dt);
  void *a = host_rand(dt, na, &seed), *b = host_rand(dt, nb, &seed), *c = calloc((size_t)nc, es);
  char *da = dev_upload(d, a, (size_t)na * es), *db = dev_upload(d, b, (size_t)nb * es);
  char *dc = dev_upload(d, c, (size_t)nc * es);
  nb_status st =
      nbi_cuda_gemm(ctx_of(d), dt, ta, tb, m, n, k, da, lda, sa, db, ldb, sb, dc, ldc, sc, batch);
  cr_assert_eq(st, NB_OK, "nbi_cuda_gemm %s ta %d tb %d %lldx%lldx%lld batch %lld: %s",
               nb_dtype_name(dt), ta, tb, (long long)m, (long long)n, (long long)k,
               (long long)batch, nb_last_error());
  dev_download(d, c, dc, (size_t)nc * es);
  double *ref = calloc((size_t)(batch * m * n), sizeof *ref);
  void *got = calloc((size_t)(batch * m * n), es);
  for (int64_t bi = 0; bi < batch; bi++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t p = 0; p < k; p++)
          s += nbi_load_f64(a, dt, bi * sa + (ta ? p * lda + i : i * lda + p)) *
               nbi_load_f64(b, dt, bi * sb + (tb ? j * ldb + p : p * ldb + j));
        int64_t o = (bi * m + i) * n + j;
        ref[o] = s;
        nbi_store_f64(got, dt, o, nbi_load_f64(c, dt, bi * sc + i * ldc + j));
      }
  char what[128];
  snprintf(what, sizeof what, "gemm ta %d tb %d %lldx%lldx%lld batch %lld bcast %d", ta, tb,
           (long long)m, (long long)n, (long long)k, (long long)batch, bcast);
  assert_near(what, got, dt, ref, batch * m * n, prod_tol(dt, k, tf32));
  d->be->free(d->ctx, da, (size_t)na * es);
  d->be->free(d->ctx, db, (size_t)nb * es);
  d->be->free(d->ctx, dc, (size_t)nc * es);
  free(a), free(b), free(c), free(ref), free(got);
}

Test(cuda_gemm, gemm_every_dtype_transpose_and_size) {
  const nbi_device *d = gpu();
  static const int64_t sizes[3][3] = {{1, 1, 1}, {3, 5, 7}, {127, 129, 65}}; /* m, k, n */
  for (int t = 0; t < 4; t++)
    for (int tr = 0; tr < 4; tr++)
      for (int s = 0; s < 3; s++)
        check_gemm(d, float_dtypes[t], tr & 1, tr & 2, sizes[s][0], sizes[s][2], sizes[s][1], 1, 0,
                   false);
}

Test(cuda_gemm, gemm_strided_batches_and_broadcast_operands) {
  const nbi_device *d = gpu();
  for (int t = 0; t < 4; t++)
    for (int bc = 0; bc < 3; bc++) {
      check_gemm(d, float_dtypes[t], false, false, 13, 7, 9, 3, bc, false);
      check_gemm(d, float_dtypes[t], true, true, 33, 17, 40, 5, bc, false);
    }
}

Test(cuda_gemm, gemm_tf32_under_high_precision) {
  const nbi_device *d = gpu();
  nb_set_matmul_precision(NB_PRECISION_HIGH);
  check_gemm(d, NB_F32, false, false, 127, 65, 129, 1, 0, true);
  check_gemm(d, NB_F32, true, false, 64, 64, 64, 2, 1, true);
  nb_set_matmul_precision(NB_PRECISION_HIGHEST);
  check_gemm(d, NB_F32, false, false, 127, 65, 129, 1, 0, false);
}

Test(cuda_gemm, gemm_heuristic_is_cached) {
  const nbi_device *d = gpu();
  check_gemm(d, NB_F32, false, true, 19, 23, 29, 2, 0, false);
  nbi_cuda_gemm_stats s0 = nbi_cuda_gemm_get_stats();
  check_gemm(d, NB_F32, false, true, 19, 23, 29, 2, 0, false);
  nbi_cuda_gemm_stats s1 = nbi_cuda_gemm_get_stats();
  cr_assert(s1.queries == s0.queries && s1.hits > s0.hits,
            "a repeated product queried the heuristic again (queries %llu -> %llu, hits %llu -> "
            "%llu); alignment differs between the two calls' blocks?",
            (unsigned long long)s0.queries, (unsigned long long)s1.queries,
            (unsigned long long)s0.hits, (unsigned long long)s1.hits);
}

Test(cuda_gemm, gemm_rejects_bad_arguments) {
  const nbi_device *d = gpu();
  nbi_cuda_ctx *c = ctx_of(d);
  float h[16] = {0};
  char *p = dev_upload(d, h, sizeof h);
  cr_assert_eq(nbi_cuda_gemm(c, NB_I32, false, false, 2, 2, 2, p, 2, 0, p, 2, 0, p, 2, 0, 1),
               NB_ERR_DTYPE);
  tc_assert_error(NB_ERR_DTYPE, "f32, f64, f16 or bf16");
  cr_assert_eq(nbi_cuda_gemm(c, NB_F32, false, false, -1, 2, 2, p, 2, 0, p, 2, 0, p, 2, 0, 1),
               NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "sizes");
  cr_assert_eq(nbi_cuda_gemm(c, NB_F32, false, false, 2, 2, 3, p, 2, 0, p, 2, 0, p, 2, 0, 1),
               NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "leading dimensions");
  cr_assert_eq(nbi_cuda_gemm(c, NB_F32, false, false, 2, 2, 2, p, 2, 0, p, 2, 0, p, 2, 1, 2),
               NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "batch strides");
  cr_assert_eq(nbi_cuda_gemm(c, NB_F32, false, false, 2, 2, 2, NULL, 2, 0, p, 2, 0, p, 2, 0, 1),
               NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "NULL");
  /* k = 0: C is zeros */
  float ones[4] = {1, 1, 1, 1}, back[4];
  char *q = dev_upload(d, ones, sizeof ones);
  cr_assert_eq(nbi_cuda_gemm(c, NB_F32, false, false, 2, 2, 0, p, 1, 0, p, 2, 0, q, 2, 0, 1), NB_OK,
               "%s", nb_last_error());
  dev_download(d, back, q, sizeof back);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(back[i], 0.0f, "k = 0 left C[%d] = %g", i, back[i]);
  d->be->free(d->ctx, p, sizeof h);
  d->be->free(d->ctx, q, sizeof ones);
}

/* ---- nbi_cuda_matmul on hand-made views ------------------------------------------------------ */
/* A view of a buffer: dims, strides (all 0: contiguous), element offset of the view's
 * first element (room for negative strides). */
typedef struct vspec {
  int ndim;
  int64_t dims[4], strides[4], offset;
} vspec;

/* The view s of dtype dt over buf. */
static nbi_view make_view(char *buf, nb_dtype dt, const vspec *s) {
  nbi_view v = {.data = buf + s->offset * (int64_t)nb_dtype_size(dt), .dtype = dt, .ndim = s->ndim};
  bool contig = true;
  for (int i = 0; i < s->ndim; i++)
    contig = contig && s->strides[i] == 0;
  for (int i = s->ndim - 1, st = 1; i >= 0; i--) {
    v.dims[i] = s->dims[i];
    v.strides[i] = contig ? st : s->strides[i];
    st *= (int)s->dims[i];
  }
  return v;
}

/* Elements a view of s may reach (generous: every dim's extent, the offset, slack). */
static int64_t span_of(const vspec *s) {
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++)
    n *= s->dims[i];
  return 4 * n + s->offset + 64;
}

/* nbi_cuda_matmul of views sa (da) @ sb (db) into a dout result, against
 * nbi_cpu_matmul of the same views over host copies of the same bytes. */
static void check_views(const nbi_device *d, const char *what, nb_dtype da, vspec sa, nb_dtype db,
                        vspec sb, nb_dtype dout) {
  uint64_t seed = 99;
  int64_t na = span_of(&sa), nb = span_of(&sb);
  size_t ea = nb_dtype_size(da), eb = nb_dtype_size(db), eo = nb_dtype_size(dout);
  char *ha = host_rand(da, na, &seed), *hb = host_rand(db, nb, &seed);
  char *ga = dev_upload(d, ha, (size_t)na * ea), *gb = dev_upload(d, hb, (size_t)nb * eb);
  nbi_view hin[2] = {make_view(ha, da, &sa), make_view(hb, db, &sb)};
  nbi_view gin[2] = {make_view(ga, da, &sa), make_view(gb, db, &sb)};
  nb_shape so = {0}; /* nb_matmul's result shape */
  int nba = sa.ndim > 2 ? sa.ndim - 2 : 0, nbb = sb.ndim > 2 ? sb.ndim - 2 : 0;
  so.ndim = nba > nbb ? nba : nbb;
  for (int i = 0; i < so.ndim; i++) {
    int ia = nba - so.ndim + i, ib = nbb - so.ndim + i;
    int64_t x = ia >= 0 ? sa.dims[ia] : 1, y = ib >= 0 ? sb.dims[ib] : 1;
    so.dims[i] = x == 1 ? y : x;
  }
  if (sa.ndim > 1) so.dims[so.ndim++] = sa.dims[sa.ndim - 2];
  if (sb.ndim > 1) so.dims[so.ndim++] = sb.dims[sb.ndim - 1];
  int64_t n = tc_numel(so);
  char *ref = calloc((size_t)n + 1, eo), *got = calloc((size_t)n + 1, eo);
  nbi_view hout = {.data = ref, .dtype = dout, .ndim = so.ndim}, gout = hout;
  memcpy(hout.dims, so.dims, sizeof hout.dims);
  nbi_contig_strides(&so, hout.strides);
  gout = hout;
  gout.data = dev_upload(d, got, (size_t)(n ? n : 1) * eo);
  cr_assert_eq(nbi_cpu_matmul(NULL, &hout, hin), NB_OK, "%s: cpu: %s", what, nb_last_error());
  cr_assert_eq(nbi_cuda_matmul(ctx_of(d), NULL, &gout, gin), NB_OK, "%s: %s", what,
               nb_last_error());
  dev_download(d, got, gout.data, (size_t)n * eo);
  double *rd = malloc((size_t)(n + 1) * sizeof *rd);
  for (int64_t i = 0; i < n; i++)
    rd[i] = nbi_load_f64(ref, dout, i);
  int64_t k = sa.dims[sa.ndim - 1];
  assert_near(what, got, dout, rd, n, nb_dtype_is_float(dout) ? 2 * prod_tol(dout, k, false) : 0);
  d->be->free(d->ctx, ga, (size_t)na * ea);
  d->be->free(d->ctx, gb, (size_t)nb * eb);
  d->be->free(d->ctx, gout.data, (size_t)(n ? n : 1) * eo);
  free(ha), free(hb), free(ref), free(got), free(rd);
}

#define V(nd, ...) ((vspec){.ndim = nd, __VA_ARGS__})

Test(cuda_gemm, matmul_views_in_place_packed_and_broadcast) {
  const nbi_device *d = gpu();
  for (int t = 0; t < 4; t++) {
    nb_dtype x = float_dtypes[t];
    check_views(d, "2-D", x, V(2, .dims = {3, 5}), x, V(2, .dims = {5, 7}), x);
    check_views(d, "a transposed", x, V(2, .dims = {3, 5}, .strides = {1, 3}), x,
                V(2, .dims = {5, 7}), x);
    check_views(d, "both transposed, padded", x, V(2, .dims = {3, 5}, .strides = {1, 4}), x,
                V(2, .dims = {5, 7}, .strides = {1, 6}), x);
    check_views(d, "padded rows", x, V(2, .dims = {3, 5}, .strides = {9, 1}), x,
                V(2, .dims = {5, 7}, .strides = {8, 1}), x);
    check_views(d, "batch broadcast (missing dim)", x, V(4, .dims = {2, 3, 4, 5}), x,
                V(3, .dims = {3, 5, 6}), x);
    check_views(d, "batch broadcast both ways", x, V(4, .dims = {4, 1, 3, 5}), x,
                V(4, .dims = {1, 5, 5, 6}), x);
    check_views(d, "stride-0 batch dim", x, V(4, .dims = {2, 3, 4, 5}, .strides = {20, 0, 5, 1}), x,
                V(4, .dims = {2, 3, 5, 6}), x);
    check_views(d, "negative batch stride", x,
                V(3, .dims = {3, 4, 5}, .strides = {-20, 5, 1}, .offset = 40), x,
                V(3, .dims = {3, 5, 6}), x);
    check_views(d, "transposed batches", x, V(3, .dims = {3, 4, 5}, .strides = {20, 1, 4}), x,
                V(3, .dims = {3, 5, 6}, .strides = {30, 1, 5}), x);
    check_views(d, "column stride 2 (packed)", x, V(2, .dims = {4, 5}, .strides = {10, 2}), x,
                V(2, .dims = {5, 3}), x);
    check_views(d, "stride-0 rows (packed)", x, V(2, .dims = {4, 5}, .strides = {0, 1}), x,
                V(2, .dims = {5, 3}), x);
    check_views(d, "flipped rows (packed)", x,
                V(2, .dims = {4, 5}, .strides = {-5, 1}, .offset = 15), x, V(2, .dims = {5, 3}), x);
    check_views(d, "odd offset", x, V(2, .dims = {3, 5}, .offset = 1), x,
                V(2, .dims = {5, 7}, .offset = 3), x);
    check_views(d, "1-D @ 2-D", x, V(1, .dims = {5}), x, V(2, .dims = {5, 7}), x);
    check_views(d, "2-D @ 1-D", x, V(2, .dims = {3, 5}), x, V(1, .dims = {5}), x);
    check_views(d, "1-D @ 1-D", x, V(1, .dims = {5}), x, V(1, .dims = {5}), x);
    check_views(d, "strided 1-D", x, V(1, .dims = {5}, .strides = {3}), x, V(2, .dims = {5, 7}), x);
    check_views(d, "flipped 1-D", x, V(2, .dims = {3, 5}), x,
                V(1, .dims = {5}, .strides = {-1}, .offset = 4), x);
    check_views(d, "batched @ 1-D", x, V(3, .dims = {2, 3, 5}), x, V(1, .dims = {5}), x);
    check_views(d, "k = 0", x, V(2, .dims = {3, 0}), x, V(2, .dims = {0, 4}), x);
    check_views(d, "m = 0", x, V(2, .dims = {0, 3}), x, V(2, .dims = {3, 4}), x);
    check_views(d, "odd sizes", x, V(2, .dims = {127, 129}), x, V(2, .dims = {129, 65}), x);
  }
  check_views(d, "f16 @ f32", NB_F16, V(2, .dims = {3, 5}), NB_F32, V(2, .dims = {5, 7}), NB_F32);
  check_views(d, "bf16 @ f16", NB_BF16, V(3, .dims = {2, 3, 5}), NB_F16, V(2, .dims = {5, 7}),
              NB_F32);
  check_views(d, "f32 @ f64", NB_F32, V(2, .dims = {3, 5}), NB_F64, V(2, .dims = {5, 7}), NB_F64);
  check_views(d, "i32 @ i32 -> i32", NB_I32, V(3, .dims = {2, 3, 5}), NB_I32, V(2, .dims = {5, 7}),
              NB_I32);
  check_views(d, "i64 transposed", NB_I64, V(2, .dims = {3, 5}, .strides = {1, 3}), NB_I64,
              V(2, .dims = {5, 7}), NB_I64);
  check_views(d, "i32 @ i64 broadcast", NB_I32, V(4, .dims = {4, 1, 3, 5}), NB_I64,
              V(4, .dims = {1, 2, 5, 6}), NB_I64);
  check_views(d, "i64 negative batch stride", NB_I64,
              V(3, .dims = {3, 4, 5}, .strides = {-20, 5, 1}, .offset = 40), NB_I64,
              V(3, .dims = {3, 5, 6}), NB_I64);
  check_views(d, "bool", NB_BOOL, V(3, .dims = {2, 3, 5}), NB_BOOL, V(3, .dims = {2, 5, 4}),
              NB_BOOL);
  check_views(d, "bool @ i32", NB_BOOL, V(2, .dims = {3, 5}), NB_I32, V(2, .dims = {5, 4}), NB_I32);
  check_views(d, "i32 1-D flipped", NB_I32, V(1, .dims = {5}), NB_I32,
              V(1, .dims = {5}, .strides = {-2}, .offset = 8), NB_I32);
}

/* ---- epilogue groups given directly ---------------------------------------------------------- */
enum { ACT_NONE = -1 };
static const int acts[6] = {ACT_NONE,    NBI_OP_RELU,    NBI_OP_GELU,
                            NBI_OP_TANH, NBI_OP_SIGMOID, NBI_OP_SILU};

/* Activation op of x in double, as nabla defines it (gelu: the erf form). */
static double act_ref(int op, double x) {
  switch (op) {
  case NBI_OP_RELU: return x < 0 ? 0 : x;
  case NBI_OP_GELU: return 0.5 * x * erfc(-x / sqrt(2.0));
  case NBI_OP_TANH: return tanh(x);
  case NBI_OP_SIGMOID: return 1 / (1 + exp(-x));
  case NBI_OP_SILU: return x / (1 + exp(-x));
  default: return x;
  }
}

/* A GEMM group [matmul, (identity of the bias,) add, act] of dt on [m, k] @ [k, n]:
 * bias_kind 0: [N], 1: [1, N], 2: [N] with stride 2; run by nbi_cuda_gemm_group and
 * checked against a double loop (the sum rounded to dt first). */
static void check_group(const nbi_device *d, nb_dtype dt, int act, bool keep_sum, bool trans_a,
                        int bias_kind, bool alias, int64_t m, int64_t k, int64_t n) {
  nbi_group g;
  memset(&g, 0, sizeof g);
  g.kind = NBI_GROUP_GEMM;
  g.dtype = dt;
  nb_shape mn = NB_SHAPE(m, n);
  g.full = mn;
  int mi = 0, bias_src = -3;
  g.m[mi++] = (nbi_group_member){
      .op = NBI_OP_MATMUL, .n_in = 2, .dtype = dt, .src = {-1, -2}, .out = -1, .shape = mn};
  if (alias) {
    g.m[mi] = (nbi_group_member){.op = NBI_OP_IDENTITY, .n_in = 1, .dtype = dt, .src = {-3}};
    g.m[mi].out = (int16_t)g.n_outputs++;
    g.m[mi].shape = bias_kind == 1 ? NB_SHAPE(1, n) : NB_SHAPE(n);
    bias_src = mi++;
  }
  int add = mi++, acti = act == ACT_NONE ? -1 : mi++;
  g.m[add] = (nbi_group_member){
      .op = NBI_OP_ADD, .n_in = 2, .dtype = dt, .src = {0, (int16_t)bias_src}, .shape = mn};
  g.m[add].out = keep_sum || acti < 0 ? (int16_t)g.n_outputs++ : -1;
  if (acti >= 0) {
    g.m[acti] = (nbi_group_member){
        .op = (int16_t)act, .n_in = 1, .dtype = dt, .src = {(int16_t)add}, .shape = mn};
    g.m[acti].out = (int16_t)g.n_outputs++;
  }
  g.n_members = mi;
  g.n_operands = 3;
  cr_assert(nbi_cuda_gemm_ok(ctx_of(d), &g), "nbi_cuda_gemm_ok refused %s act %d",
            nb_dtype_name(dt), act);
  uint64_t seed = 5;
  size_t es = nb_dtype_size(dt);
  char *ha = host_rand(dt, m * k, &seed), *hb = host_rand(dt, k * n, &seed);
  char *hbias = host_rand(dt, 2 * n, &seed);
  char *ga = dev_upload(d, ha, (size_t)(m * k) * es), *gb = dev_upload(d, hb, (size_t)(k * n) * es);
  char *gbias = dev_upload(d, hbias, (size_t)(2 * n) * es);
  nbi_view in[3] = {
      {.data = ga,
       .dtype = dt,
       .ndim = 2,
       .dims = {m, k},
       .strides = {trans_a ? 1 : k, trans_a ? m : 1}},
      {.data = gb, .dtype = dt, .ndim = 2, .dims = {k, n}, .strides = {n, 1}},
      {.data = gbias, .dtype = dt, .ndim = 1, .dims = {n}, .strides = {bias_kind == 2 ? 2 : 1}}};
  if (bias_kind == 1)
    in[2] = (nbi_view){.data = gbias, .dtype = dt, .ndim = 2, .dims = {1, n}, .strides = {n, 1}};
  nbi_view out[4];
  for (int i = 0; i < g.n_outputs; i++) {
    void *z = calloc((size_t)(m * n) + 1, es);
    out[i] = (nbi_view){.data = dev_upload(d, z, (size_t)(m * n) * es),
                        .dtype = dt,
                        .ndim = 2,
                        .dims = {m, n},
                        .strides = {n, 1}};
    free(z);
  }
  if (alias) {
    int o = g.m[1].out;
    out[o].ndim = g.m[1].shape.ndim;
    memcpy(out[o].dims, g.m[1].shape.dims, sizeof out[o].dims);
    nbi_contig_strides(&g.m[1].shape, out[o].strides);
  }
  nb_status st = nbi_cuda_gemm_group(ctx_of(d), &g, out, in);
  cr_assert_eq(st, NB_OK, "nbi_cuda_gemm_group %s act %d: %s", nb_dtype_name(dt), act,
               nb_last_error());
  double *sum = malloc((size_t)(m * n) * sizeof *sum), *ya = malloc((size_t)(m * n) * sizeof *ya);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = nbi_load_f64(hbias, dt, bias_kind == 2 ? 2 * j : j);
      for (int64_t p = 0; p < k; p++)
        s +=
            nbi_load_f64(ha, dt, trans_a ? p * m + i : i * k + p) * nbi_load_f64(hb, dt, p * n + j);
      char one[8];
      nbi_store_f64(one, dt, 0, s);
      sum[i * n + j] = nbi_load_f64(one, dt, 0);
      ya[i * n + j] = act_ref(act, sum[i * n + j]);
    }
  char *host = malloc((size_t)(m * n) * es), what[96];
  double tol = 2 * prod_tol(dt, k, false);
  snprintf(what, sizeof what, "group act %d keep_sum %d trans_a %d bias %d alias %d", act, keep_sum,
           trans_a, bias_kind, alias);
  if (g.m[add].out >= 0) {
    dev_download(d, host, out[g.m[add].out].data, (size_t)(m * n) * es);
    assert_near(what, host, dt, sum, m * n, tol);
  }
  if (acti >= 0) {
    dev_download(d, host, out[g.m[acti].out].data, (size_t)(m * n) * es);
    assert_near(what, host, dt, ya, m * n, tol);
  }
  if (alias) {
    dev_download(d, host, out[g.m[1].out].data, (size_t)n * es);
    for (int64_t j = 0; j < n; j++)
      cr_assert_eq(nbi_load_f64(host, dt, j), nbi_load_f64(hbias, dt, bias_kind == 2 ? 2 * j : j),
                   "alias member element %lld not copied", (long long)j);
  }
  for (int i = 0; i < g.n_outputs; i++)
    d->be->free(d->ctx, out[i].data, (size_t)(m * n) * es);
  d->be->free(d->ctx, ga, (size_t)(m * k) * es);
  d->be->free(d->ctx, gb, (size_t)(k * n) * es);
  d->be->free(d->ctx, gbias, (size_t)(2 * n) * es);
  free(ha), free(hb), free(hbias), free(sum), free(ya), free(host);
}

Test(cuda_gemm, group_every_activation_dtype_and_output_set) {
  const nbi_device *d = gpu();
  for (int t = 0; t < 4; t++)
    for (int a = 0; a < 6; a++)
      for (int ks = 0; ks < 2; ks++)
        check_group(d, float_dtypes[t], acts[a], ks, a % 2, (a + ks) % 3, false, 37, 29, 45);
  check_group(d, NB_F32, NBI_OP_GELU, true, false, 0, true, 16, 8, 24);
  check_group(d, NB_F32, NBI_OP_RELU, false, true, 1, true, 16, 8, 24);
  check_group(d, NB_F16, NBI_OP_SILU, false, false, 0, false, 16, 0, 24); /* k = 0: the bias */
  check_group(d, NB_F32, NBI_OP_GELU, false, false, 0, false, 256, 512, 384);
}

Test(cuda_gemm, group_refusals_and_the_no_epilogue_switch) {
  const nbi_device *d = gpu();
  nbi_group g;
  memset(&g, 0, sizeof g);
  g.kind = NBI_GROUP_GEMM;
  nb_shape mn = NB_SHAPE(2, 3);
  g.m[0] = (nbi_group_member){
      .op = NBI_OP_MATMUL, .n_in = 2, .dtype = NB_F32, .src = {-1, -2}, .out = -1, .shape = mn};
  g.m[1] = (nbi_group_member){
      .op = NBI_OP_ADD, .n_in = 2, .dtype = NB_F32, .src = {-3, 0}, .out = 0, .shape = mn};
  g.n_members = 2, g.n_operands = 3, g.n_outputs = 1;
  cr_assert(nbi_cuda_gemm_ok(ctx_of(d), &g), "[matmul, add bias] refused");
  setenv("NABLA_CUDA_NO_EPILOGUE", "1", 1);
  cr_assert(!nbi_cuda_gemm_ok(ctx_of(d), &g), "NABLA_CUDA_NO_EPILOGUE=1 ignored");
  unsetenv("NABLA_CUDA_NO_EPILOGUE");
  g.m[0].out = 1, g.n_outputs = 2;
  cr_assert(!nbi_cuda_gemm_ok(ctx_of(d), &g), "a stored product was taken");
  g.m[0].out = -1, g.n_outputs = 1;
  g.m[0].dtype = g.m[1].dtype = NB_I32;
  cr_assert(!nbi_cuda_gemm_ok(ctx_of(d), &g), "an i32 group was taken");
  g.m[0].dtype = g.m[1].dtype = NB_F32;
  g.m[1].src[0] = 0;
  cr_assert(!nbi_cuda_gemm_ok(ctx_of(d), &g), "product + product was taken");
  g.m[1].src[0] = 3;
  cr_assert(!nbi_cuda_gemm_ok(ctx_of(d), &g), "a forward reference was taken");
}

/* ---- the public API -------------------------------------------------------------------------- */
/* NumPy matmul in float64 of row-major a (sa) and b (sb) into *so, malloc'd. */
static double *ref_matmul(const double *a, nb_shape sa, const double *b, nb_shape sb,
                          nb_shape *so) {
  nb_shape A = sa.ndim == 1 ? NB_SHAPE(1, sa.dims[0]) : sa;
  nb_shape B = sb.ndim == 1 ? NB_SHAPE(sb.dims[0], 1) : sb;
  int nba = A.ndim - 2, nbb = B.ndim - 2, nbo = nba > nbb ? nba : nbb;
  int64_t m = A.dims[nba], k = A.dims[nba + 1], n = B.dims[nbb + 1], batches = 1;
  nb_shape o = {.ndim = nbo};
  for (int i = 0; i < nbo; i++) {
    int ia = i - (nbo - nba), ib = i - (nbo - nbb);
    int64_t x = ia >= 0 ? A.dims[ia] : 1, y = ib >= 0 ? B.dims[ib] : 1;
    o.dims[i] = x == 1 ? y : x;
    batches *= o.dims[i];
  }
  if (sa.ndim > 1) o.dims[o.ndim++] = m;
  if (sb.ndim > 1) o.dims[o.ndim++] = n;
  *so = o;
  double *c = calloc((size_t)(batches * m * n) + 1, sizeof *c);
  for (int64_t bi = 0; bi < batches; bi++) {
    int64_t rem = bi, oa = 0, ob = 0, sta = 1, stb = 1;
    for (int i = nbo - 1; i >= 0; i--) {
      int64_t x = rem % o.dims[i];
      rem /= o.dims[i];
      int ia = i - (nbo - nba), ib = i - (nbo - nbb);
      if (ia >= 0) oa += A.dims[ia] != 1 ? x * sta : 0, sta *= A.dims[ia];
      if (ib >= 0) ob += B.dims[ib] != 1 ? x * stb : 0, stb *= B.dims[ib];
    }
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t p = 0; p < k; p++)
          s += a[oa * m * k + i * k + p] * b[ob * k * n + p * n + j];
        c[(bi * m + i) * n + j] = s;
      }
  }
  return c;
}

/* n random values representable in dt, malloc'd. */
static double *rand_values(int64_t n, nb_dtype dt, uint64_t *seed) {
  double *x = malloc((size_t)(n + 1) * sizeof *x);
  for (int64_t i = 0; i < n; i++) {
    double u = tc_uniform(seed, -1, 1);
    x[i] = nb_dtype_is_float(dt) ? u : dt == NB_BOOL ? u > 0 : floor(10 * u);
  }
  tc_round_to(x, n, dt);
  return x;
}

/* nb_matmul on NB_CUDA(0) of random a (sa, da) and b (sb, db), a given as a
 * transposed view (tc_strided_tensor) when trans_a. */
static void check_public(nb_shape sa, nb_dtype da, nb_shape sb, nb_dtype db, bool trans_a) {
  uint64_t seed = 11 + (uint64_t)tc_numel(sa) * 3 + (uint64_t)tc_numel(sb);
  double *a = rand_values(tc_numel(sa), da, &seed), *b = rand_values(tc_numel(sb), db, &seed);
  nb_tensor *ta = trans_a ? tc_strided_tensor(a, sa, da) : tc_tensor(a, sa, da);
  nb_tensor *y = nb_matmul(ta, tc_tensor(b, sb, db));
  cr_assert(y, "nb_matmul on cuda:0: %s", nb_last_error());
  cr_assert_eq(nb_device_of(y).kind, NB_DEVICE_CUDA, "the product is on %s",
               nb_device_str(nb_device_of(y)));
  nb_dtype dc = nb_promote_types(da, db);
  nb_shape so;
  double *ref = ref_matmul(a, sa, b, sb, &so);
  if (dc == NB_BOOL)
    for (int64_t i = 0; i < tc_numel(so); i++)
      ref[i] = ref[i] != 0;
  int64_t k = sa.dims[sa.ndim - 1];
  tc_assert_close_tol(y, ref, so, nb_dtype_is_float(dc) ? prod_tol(dc, k, false) : 0);
  free(a), free(b), free(ref);
}

Test(cuda_gemm, public_matmul_shapes_dtypes_and_transposes) {
  gpu();
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK, "%s", nb_last_error());
  static const int64_t sizes[3][3] = {{1, 1, 1}, {3, 5, 7}, {127, 129, 65}};
  for (int t = 0; t < 4; t++) {
    nb_dtype x = float_dtypes[t];
    for (int s = 0; s < 3; s++)
      for (int tr = 0; tr < 2; tr++)
        check_public(NB_SHAPE(sizes[s][0], sizes[s][1]), x, NB_SHAPE(sizes[s][1], sizes[s][2]), x,
                     tr);
    check_public(NB_SHAPE(2, 3, 4, 5), x, NB_SHAPE(3, 5, 6), x, false);
    check_public(NB_SHAPE(4, 1, 3, 5), x, NB_SHAPE(1, 5, 5, 6), x, true);
    check_public(NB_SHAPE(5), x, NB_SHAPE(5, 7), x, false);
    check_public(NB_SHAPE(3, 5), x, NB_SHAPE(5), x, false);
    check_public(NB_SHAPE(5), x, NB_SHAPE(5), x, false);
    check_public(NB_SHAPE(2, 3, 5), x, NB_SHAPE(5), x, false);
    check_public(NB_SHAPE(3, 0), x, NB_SHAPE(0, 4), x, false);
  }
  check_public(NB_SHAPE(3, 5), NB_F16, NB_SHAPE(5, 7), NB_F32, false);
  check_public(NB_SHAPE(2, 3, 5), NB_I32, NB_SHAPE(5, 7), NB_I32, true);
  check_public(NB_SHAPE(3, 5), NB_I64, NB_SHAPE(2, 5, 4), NB_I32, false);
  check_public(NB_SHAPE(3, 5), NB_BOOL, NB_SHAPE(5, 4), NB_BOOL, false);
  nb_set_default_device(NB_CPU);
}

Test(cuda_gemm, public_matmul_broadcast_view_operand) {
  gpu();
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK, "%s", nb_last_error());
  uint64_t seed = 3;
  double *a = rand_values(4 * 5, NB_F32, &seed), *b = rand_values(5 * 6, NB_F32, &seed);
  nb_tensor *ab = nb_broadcast_to(tc_tensor(a, NB_SHAPE(4, 5), NB_F32), NB_SHAPE(3, 4, 5));
  nb_tensor *y = nb_matmul(ab, tc_tensor(b, NB_SHAPE(5, 6), NB_F32));
  nb_shape so;
  double *r1 = ref_matmul(a, NB_SHAPE(4, 5), b, NB_SHAPE(5, 6), &so), *ref = malloc(3 * 24 * 8);
  for (int i = 0; i < 3; i++)
    memcpy(ref + i * 24, r1, 24 * sizeof *ref);
  tc_assert_close(y, ref, NB_SHAPE(3, 4, 6));
  free(a), free(b), free(r1), free(ref);
  nb_set_default_device(NB_CPU);
}

/* act(x @ w + b) (and the sum when keep_sum) on NB_CUDA(0) with the product and the
 * sum intermediates (made in an inner scope), against a double loop. */
static void check_chain(nb_dtype dt, int act, bool keep_sum, bool bias_2d, int64_t m, int64_t k,
                        int64_t n, bool nan_row) {
  uint64_t seed = 17 + (uint64_t)act;
  double *x = rand_values(m * k, dt, &seed), *w = rand_values(k * n, dt, &seed);
  double *b = rand_values(n, dt, &seed);
  if (nan_row)
    for (int64_t p = 0; p < k; p++)
      x[p] = NAN;
  nb_tensor *tx = tc_tensor(x, NB_SHAPE(m, k), dt), *tw = tc_tensor(w, NB_SHAPE(k, n), dt);
  nb_tensor *tb = tc_tensor(b, bias_2d ? NB_SHAPE(1, n) : NB_SHAPE(n), dt);
  nb_stats s0 = nb_get_stats();
  nb_scope_begin();
  nb_tensor *s = nb_add(nb_matmul(tx, tw), tb), *y = s;
  switch (act) {
  case NBI_OP_RELU: y = nb_relu(s); break;
  case NBI_OP_GELU: y = nb_gelu(s); break;
  case NBI_OP_TANH: y = nb_tanh(s); break;
  case NBI_OP_SIGMOID: y = nb_sigmoid(s); break;
  case NBI_OP_SILU: y = nb_silu(s); break;
  default: break;
  }
  cr_assert(y, "chain: %s", nb_last_error());
  nb_keep(y);
  if (keep_sum) nb_keep(s);
  nb_scope_end();
  nb_tensor *outs[2] = {y, s};
  cr_assert_eq(nb_eval(outs, keep_sum ? 2 : 1), NB_OK, "%s", nb_last_error());
  cr_log_info("chain %s act %d keep_sum %d: %llu kernels", nb_dtype_name(dt), act, keep_sum,
              (unsigned long long)(nb_get_stats().kernels_run - s0.kernels_run));
  double *sum = malloc((size_t)(m * n) * sizeof *sum), *ya = malloc((size_t)(m * n) * sizeof *ya);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double v = b[j];
      for (int64_t p = 0; p < k; p++)
        v += x[i * k + p] * w[p * n + j];
      sum[i * n + j] = v;
    }
  tc_round_to(sum, m * n, dt);
  for (int64_t i = 0; i < m * n; i++)
    ya[i] = act_ref(act, sum[i]);
  double tol = 2 * prod_tol(dt, k, false);
  tc_assert_close_tol(y, ya, NB_SHAPE(m, n), tol);
  if (keep_sum) tc_assert_close_tol(s, sum, NB_SHAPE(m, n), tol);
  free(x), free(w), free(b), free(sum), free(ya);
}

Test(cuda_gemm, public_bias_activation_chains) {
  gpu();
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK, "%s", nb_last_error());
  for (int t = 0; t < 4; t++)
    for (int a = 0; a < 6; a++)
      check_chain(float_dtypes[t], acts[a], a % 2, a % 3 == 0, 64, 96, 80, false);
  check_chain(NB_F32, NBI_OP_GELU, true, false, 256, 512, 384, false);
  nb_set_default_device(NB_CPU);
}

Test(cuda_gemm, public_relu_chain_passes_nan_through) {
  gpu();
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK, "%s", nb_last_error());
  check_chain(NB_F32, NBI_OP_RELU, false, false, 8, 16, 24, true);
  check_chain(NB_F16, NBI_OP_RELU, true, true, 8, 16, 24, true);
  nb_set_default_device(NB_CPU);
}

Test(cuda_gemm, public_chains_without_epilogue_groups_give_the_same_values) {
  gpu();
  setenv("NABLA_CUDA_NO_EPILOGUE", "1", 1);
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK, "%s", nb_last_error());
  for (int a = 0; a < 6; a++)
    check_chain(NB_F32, acts[a], a % 2, false, 64, 96, 80, false);
  check_chain(NB_BF16, NBI_OP_GELU, true, true, 64, 96, 80, false);
  nb_set_default_device(NB_CPU);
  unsetenv("NABLA_CUDA_NO_EPILOGUE");
}

#endif
