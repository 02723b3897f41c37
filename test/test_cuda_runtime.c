/* test/test_cuda_runtime.c — the CUDA runtime on a GPU (`make test CUDA=1`; every
 * test skips, saying why, where no CUDA device answers): device discovery,
 * host I/O from 1 B to 64 MiB, strided copies for every dtype pair against the
 * CPU's nbi_copy_view (NaN, infinities, saturating values, transposed,
 * broadcast, flipped and misaligned views), fills against nbi_fill_view, the
 * caching allocator (reuse over 10,000 cycles, out-of-memory message), kernel
 * errors reported by sync, large shared memory and PTX launches, two host
 * threads on one device, and the public API (nb_from_data / nb_to_host on
 * NB_CUDA(0)). Failures print the dtype pair, layout and first bad element. */
#ifdef NABLA_CUDA

#include "common.h"

#include "../src/backends/cuda/cuda_be.h"

#include <pthread.h>

TestSuite(cuda, .init = tc_setup, .fini = tc_teardown);

#define MIB ((size_t)1 << 20)

/* The device table entry of NB_CUDA(0); skips the test without a GPU. */
static int cuda0(void) {
  if (nb_device_count(NB_DEVICE_CUDA) < 1) cr_skip_test("no CUDA device: %s", nbi_cuda_why());
  int i = nbi_device_lookup("test_cuda_runtime", NB_CUDA(0));
  cr_assert_geq(i, 0, "NB_CUDA(0) does not open: %s", nb_last_error());
  return i;
}

static const nbi_backend *be_of(int dev) { return nbi_device_at(dev)->be; }
static nbi_cuda_ctx *ctx_of(int dev) { return nbi_device_at(dev)->ctx; }

/* A device block of n bytes (asserted). */
static void *dev_alloc(int dev, size_t n) {
  void *p = be_of(dev)->alloc(ctx_of(dev), n);
  cr_assert_not_null(p, "alloc of %zu bytes on cuda:0 failed: %s", n, nb_last_error());
  return p;
}

/* Deterministic bytes. */
static void random_bytes(unsigned char *p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = (unsigned char)(seed >> 56);
  }
}

Test(cuda, a_device_is_found_and_named) {
  int dev = cuda0();
  nbi_cuda_ctx *c = ctx_of(dev);
  cr_assert_str_eq(be_of(dev)->name, "cuda");
  cr_assert_str_eq(nbi_device_name(dev), "cuda:0");
  cr_assert_gt(strlen(c->name), 0);
  cr_assert_geq(c->cc_major * 10 + c->cc_minor, 75, "compute capability %d.%d", c->cc_major,
                c->cc_minor);
  cr_assert_gt(c->sm_count, 0);
  cr_assert_geq(c->smem_optin, 48 * 1024);
  cr_assert_not_null(c->lt, "no cuBLASLt handle");
  cr_assert_geq(c->lt_workspace_bytes, 4 * MIB);
  cr_log_info("cuda:0 is %s (sm_%d%d, %d SMs, %zu B shared memory per block)", c->name, c->cc_major,
              c->cc_minor, c->sm_count, c->smem_optin);
  cr_assert_str_eq(nbi_cuda_why(), "");
}

Test(cuda, bytes_round_trip_from_1_b_to_64_mib) {
  int dev = cuda0();
  const nbi_backend *be = be_of(dev);
  const size_t sizes[] = {1, 3, 511, 4096, 65537, MIB + 7, 16 * MIB + 1, 40 * MIB + 13, 64 * MIB};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    size_t n = sizes[k];
    unsigned char *in = malloc(n), *out = malloc(n);
    random_bytes(in, n, k + 1);
    memset(out, 0xcd, n);
    void *d = dev_alloc(dev, n);
    cr_assert_eq(be->upload(ctx_of(dev), d, in, n), NB_OK, "upload %zu: %s", n, nb_last_error());
    memset(in + n / 2, 0, n - n / 2); /* the upload owns nothing of in */
    random_bytes(in, n, k + 1);
    cr_assert_eq(be->download(ctx_of(dev), out, d, n), NB_OK, "download %zu: %s", n,
                 nb_last_error());
    size_t bad = n;
    for (size_t i = 0; i < n && bad == n; i++)
      if (in[i] != out[i]) bad = i;
    cr_assert_eq(bad, n, "%zu bytes: byte %zu is 0x%02x, expected 0x%02x", n, bad,
                 bad < n ? out[bad] : 0, bad < n ? in[bad] : 0);
    be->free(ctx_of(dev), d, n);
    free(in);
    free(out);
  }
  cr_assert_eq(be->sync(ctx_of(dev)), NB_OK, "%s", nb_last_error());
}

/* ---- copies against the CPU
 * ---------------------------------------------------------------------- */
/* n elements of dt worth testing conversions on: ordinary values, zeros,
 * NaN, infinities, subnormals, values past every integer and f16 range, ties. */
static void special_values(void *p, nb_dtype dt, int64_t n, uint64_t seed) {
  static const double specials[] = {0.0,
                                    -0.0,
                                    1.0,
                                    -1.5,
                                    2.5,
                                    -2.5,
                                    NAN,
                                    INFINITY,
                                    -INFINITY,
                                    1e-40,
                                    -3e-310,
                                    65504.0,
                                    65519.0,
                                    65520.0,
                                    -70000.0,
                                    2147483647.0,
                                    2147483648.5,
                                    -2147483649.0,
                                    9.3e18,
                                    -9.3e18,
                                    1e30,
                                    3.5e38,
                                    -1e300,
                                    1.0009765625,
                                    1.00048828125000001,
                                    0.333333333333333333,
                                    4097.0,
                                    16777217.0};
  const int ns = (int)(sizeof specials / sizeof *specials);
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = seed >> 11;
    switch (dt) {
    case NB_F16:
    case NB_BF16: ((uint16_t *)p)[i] = (uint16_t)(seed >> 40); break; /* every pattern */
    case NB_BOOL: ((uint8_t *)p)[i] = (uint8_t)((const int[]){0, 1, 2, 255}[r % 4]); break;
    case NB_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(seed >> 32) >> (r % 31); break;
    case NB_I64: ((int64_t *)p)[i] = (int64_t)(seed ^ (seed << 17)) >> (r % 63); break;
    default: {
      double v = i % 3 == 0 ? specials[r % (uint64_t)ns]
                            : ldexp((double)(r % 2000000) / 1000000.0 - 1.0, (int)(r % 80) - 40);
      nbi_store_f64(p, dt, i, v);
    }
    }
  }
}

/* One layout: dims, and per view its strides (elements) and offset. */
typedef struct layout {
  const char *name;
  int ndim;
  int64_t dims[NB_MAX_DIMS];
  int64_t sstride[NB_MAX_DIMS], dstride[NB_MAX_DIMS];
  int64_t soff, doff;     /* elements from the buffer start */
  int64_t selems, delems; /* buffer sizes in elements */
} layout;

static const layout layouts[] = {
    {"contiguous", 1, {4099}, {1}, {1}, 0, 0, 4099, 4099},
    {"contiguous, misaligned", 1, {1031}, {1}, {1}, 1, 3, 1040, 1040},
    {"transposed", 2, {37, 53}, {1, 37}, {53, 1}, 0, 0, 37 * 53, 37 * 53},
    {"broadcast", 3, {3, 5, 7}, {7, 0, 1}, {35, 7, 1}, 0, 0, 21, 105},
    {"flipped", 2, {6, 33}, {-33, -1}, {33, 1}, 6 * 33 - 1, 0, 6 * 33, 6 * 33},
    {"strided dst", 2, {9, 10}, {10, 1}, {1, 9 * 3}, 0, 0, 90, 9 * 3 * 10},
    {"rank 8",
     8,
     {2, 3, 1, 2, 3, 2, 1, 5},
     {360, 120, 60, 30, 10, 5, 5, 1},
     {1, 2, 6, 6, 12, 36, 72, 72},
     0,
     0,
     720,
     360},
    {"scalar", 0, {0}, {0}, {0}, 2, 1, 3, 2},
    {"empty", 2, {4, 0}, {1, 4}, {0, 1}, 0, 0, 1, 1},
};

static nbi_view view_of(char *base, nb_dtype dt, const layout *l, bool src) {
  nbi_view v = {.dtype = dt, .ndim = l->ndim};
  v.data = base + (src ? l->soff : l->doff) * (int64_t)nb_dtype_size(dt);
  for (int d = 0; d < l->ndim; d++) {
    v.dims[d] = l->dims[d];
    v.strides[d] = src ? l->sstride[d] : l->dstride[d];
  }
  return v;
}

/* x (a double, f64 or an integer's value) to f16 / bf16 rounded once. */
static uint16_t round_once(double x, nb_dtype dt) {
  float f = (float)x;
  if (f == f && (double)f != x && !isinf(f)) {
    if (fabs((double)f) > fabs(x)) f = nextafterf(f, 0.0f);
    uint32_t u;
    memcpy(&u, &f, 4);
    u |= 1;
    memcpy(&f, &u, 4);
  }
  return dt == NB_F16 ? nbi_f32_to_f16(f) : nbi_f32_to_bf16(f);
}

/* Whether got (element i of dst) is right where the CPU wrote want: the same
 * bytes; NaN for NaN; for f16 / bf16 from a value wider than f32 (f64, i32,
 * i64), the value rounded once (the CPU's copy rounds through f32 first and
 * may then differ by one unit in the last place). */
static bool element_ok(const void *got, const void *want, const char *srcp, nb_dtype sdt,
                       nb_dtype ddt) {
  size_t es = nb_dtype_size(ddt);
  if (!memcmp(got, want, es)) return true;
  if (nb_dtype_is_float(ddt)) {
    double g = nbi_load_f64(got, ddt, 0), w = nbi_load_f64(want, ddt, 0);
    if (g != g && w != w) return true;
  }
  if ((ddt == NB_F16 || ddt == NB_BF16) && (sdt == NB_F64 || sdt == NB_I32 || sdt == NB_I64)) {
    uint16_t g, w;
    memcpy(&g, got, 2);
    memcpy(&w, want, 2);
    double x = sdt == NB_F64 ? nbi_load_f64(srcp, sdt, 0) : (double)nbi_load_i64(srcp, sdt, 0);
    return (g == w + 1 || g + 1 == w) && g == round_once(x, ddt);
  }
  return false;
}

/* Row-major index i of l's dims -> element offsets of both views. */
static void offsets(const layout *l, int64_t i, int64_t *so, int64_t *dof) {
  *so = l->soff;
  *dof = l->doff;
  for (int d = l->ndim - 1; d >= 0; d--) {
    int64_t c = i % l->dims[d];
    i /= l->dims[d];
    *so += c * l->sstride[d];
    *dof += c * l->dstride[d];
  }
}

/* Copies sdt -> ddt in layout l on the device and on the CPU; asserts equal. */
static void check_copy(int dev, nb_dtype sdt, nb_dtype ddt, const layout *l, uint64_t seed) {
  const nbi_backend *be = be_of(dev);
  size_t ses = nb_dtype_size(sdt), des = nb_dtype_size(ddt);
  size_t sbytes = (size_t)l->selems * ses, dbytes = (size_t)l->delems * des;
  char *hs = malloc(sbytes), *hd = malloc(dbytes), *got = malloc(dbytes);
  special_values(hs, sdt, l->selems, seed);
  random_bytes((unsigned char *)hd, dbytes, seed + 99); /* untouched elements must stay */
  char *ds = dev_alloc(dev, sbytes), *dd = dev_alloc(dev, dbytes);
  cr_assert_eq(be->upload(ctx_of(dev), ds, hs, sbytes), NB_OK, "%s", nb_last_error());
  cr_assert_eq(be->upload(ctx_of(dev), dd, hd, dbytes), NB_OK, "%s", nb_last_error());
  nbi_view vd = view_of(dd, ddt, l, false), vs = view_of(ds, sdt, l, true);
  nb_status st = be->copy(ctx_of(dev), &vd, &vs);
  cr_assert_eq(st, NB_OK, "copy %s -> %s (%s): %s", nb_dtype_name(sdt), nb_dtype_name(ddt), l->name,
               nb_last_error());
  cr_assert_eq(be->download(ctx_of(dev), got, dd, dbytes), NB_OK, "%s", nb_last_error());
  cr_assert_eq(be->sync(ctx_of(dev)), NB_OK, "%s", nb_last_error());
  nbi_view hvd = view_of(hd, ddt, l, false), hvs = view_of(hs, sdt, l, true);
  nbi_copy_view(&hvd, &hvs);
  int64_t n = 1;
  for (int d = 0; d < l->ndim; d++)
    n *= l->dims[d];
  bool *inside = calloc((size_t)l->delems, 1);
  for (int64_t i = 0; i < n; i++) {
    int64_t so, dof;
    offsets(l, i, &so, &dof);
    inside[dof] = true;
    const char *g = got + dof * (int64_t)des, *w = hd + dof * (int64_t)des;
    const char *x = hs + so * (int64_t)ses;
    cr_assert(element_ok(g, w, x, sdt, ddt),
              "copy %s -> %s (%s): element %lld (source %.17g) is %.17g, the CPU gives %.17g",
              nb_dtype_name(sdt), nb_dtype_name(ddt), l->name, (long long)i,
              nbi_load_f64(x, sdt, 0), nbi_load_f64(g, ddt, 0), nbi_load_f64(w, ddt, 0));
  }
  for (int64_t e = 0; e < l->delems; e++) /* elements outside the view are untouched */
    cr_assert(inside[e] || !memcmp(got + e * (int64_t)des, hd + e * (int64_t)des, des),
              "copy %s -> %s (%s): element %lld outside the view changed", nb_dtype_name(sdt),
              nb_dtype_name(ddt), l->name, (long long)e);
  free(inside);
  be->free(ctx_of(dev), ds, sbytes);
  be->free(ctx_of(dev), dd, dbytes);
  free(hs);
  free(hd);
  free(got);
}

Test(cuda, copies_convert_every_dtype_pair_as_the_cpu_does, .timeout = 600) {
  int dev = cuda0();
  uint64_t seed = 1;
  for (int s = 0; s < NB_DTYPE_COUNT; s++)
    for (int d = 0; d < NB_DTYPE_COUNT; d++)
      for (size_t k = 0; k < sizeof layouts / sizeof *layouts; k++)
        check_copy(dev, (nb_dtype)s, (nb_dtype)d, &layouts[k], seed++);
}

Test(cuda, large_copies_take_the_64_bit_and_vector_paths, .timeout = 300) {
  int dev = cuda0();
  /* 2^31 + 5 bool elements (> 2^31: the 64-bit kernel) broadcast from one */
  layout big = {"2^31 + 5 broadcast",  1, {((int64_t)1 << 31) + 5}, {0}, {1}, 0, 0, 1,
                ((int64_t)1 << 31) + 5};
  const nbi_backend *be = be_of(dev);
  size_t n = (size_t)big.delems;
  char *dd = dev_alloc(dev, n), *ds = dev_alloc(dev, 4);
  float one = 3.0f;
  cr_assert_eq(be->upload(ctx_of(dev), ds, &one, 4), NB_OK);
  nbi_view vd = view_of(dd, NB_BOOL, &big, false), vs = view_of(ds, NB_F32, &big, true);
  cr_assert_eq(be->copy(ctx_of(dev), &vd, &vs), NB_OK, "%s", nb_last_error());
  unsigned char *h = malloc(n);
  cr_assert_eq(be->download(ctx_of(dev), h, dd, n), NB_OK, "%s", nb_last_error());
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; i++)
    if (h[i] != 1) bad = i;
  cr_assert_eq(bad, n, "element %zu is %d", bad, bad < n ? h[bad] : 0);
  free(h);
  be->free(ctx_of(dev), dd, n);
  be->free(ctx_of(dev), ds, 4);
  /* a 2-D view whose rows lie 2^31 elements apart: the 64-bit kernel over dims */
  size_t far = ((size_t)1 << 31) + 8;
  char *src = dev_alloc(dev, far);
  int32_t *dst = dev_alloc(dev, 10 * sizeof(int32_t)), got[10];
  const unsigned char row0[5] = {0, 1, 2, 0, 255}, row1[5] = {7, 0, 0, 1, 0};
  cr_assert_eq(be->upload(ctx_of(dev), src, row0, 5), NB_OK);
  cr_assert_eq(be->upload(ctx_of(dev), src + ((size_t)1 << 31), row1, 5), NB_OK);
  nbi_view fs = {
      .data = src, .dtype = NB_BOOL, .ndim = 2, .dims = {2, 5}, .strides = {(int64_t)1 << 31, 1}};
  nbi_view fd = {
      .data = (char *)dst, .dtype = NB_I32, .ndim = 2, .dims = {2, 5}, .strides = {5, 1}};
  cr_assert_eq(be->copy(ctx_of(dev), &fd, &fs), NB_OK, "%s", nb_last_error());
  cr_assert_eq(be->download(ctx_of(dev), got, dst, sizeof got), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 10; i++)
    cr_assert_eq(got[i], (i < 5 ? row0[i] : row1[i - 5]) != 0, "far view: element %d is %d", i,
                 got[i]);
  be->free(ctx_of(dev), src, far);
  be->free(ctx_of(dev), dst, 10 * sizeof(int32_t));
  layout vec = {"contiguous 3M", 1, {3 * 1000 * 1000 + 3}, {1}, {1}, 0, 0, 3000003, 3000003};
  check_copy(dev, NB_F32, NB_BF16, &vec, 5);
  check_copy(dev, NB_F64, NB_I32, &vec, 6);
  check_copy(dev, NB_F16, NB_F16, &vec, 7);
}

/* ---- fills
 * ------------------------------------------------------------------------------------------ */
Test(cuda, fills_store_the_value_as_the_cpu_does) {
  int dev = cuda0();
  const nbi_backend *be = be_of(dev);
  const double values[] = {0.0, 1.5, -2.75, NAN, INFINITY, 1e10, -1e300, 65519.99, 3e-8};
  const layout fills[] = {layouts[0], layouts[1], layouts[3], layouts[5], layouts[7]};
  for (int t = 0; t < NB_DTYPE_COUNT; t++) {
    for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
      for (size_t k = 0; k < sizeof fills / sizeof *fills; k++) {
        const layout *l = &fills[k];
        nb_dtype dt = (nb_dtype)t;
        size_t es = nb_dtype_size(dt), bytes = (size_t)l->delems * es;
        char *want = malloc(bytes), *got = malloc(bytes);
        random_bytes((unsigned char *)want, bytes, 17 + v);
        char *d = dev_alloc(dev, bytes);
        cr_assert_eq(be->upload(ctx_of(dev), d, want, bytes), NB_OK);
        nbi_view vd = view_of(d, dt, l, false), hv = view_of(want, dt, l, false);
        cr_assert_eq(be->fill(ctx_of(dev), &vd, values[v]), NB_OK, "%s", nb_last_error());
        nbi_fill_view(&hv, values[v]);
        cr_assert_eq(be->download(ctx_of(dev), got, d, bytes), NB_OK, "%s", nb_last_error());
        for (int64_t e = 0; e < l->delems; e++)
          cr_assert(!memcmp(got + e * (int64_t)es, want + e * (int64_t)es, es),
                    "fill %s with %g (%s): element %lld is %.17g, the CPU gives %.17g",
                    nb_dtype_name(dt), values[v], l->name, (long long)e, nbi_load_f64(got, dt, e),
                    nbi_load_f64(want, dt, e));
        be->free(ctx_of(dev), d, bytes);
        free(want);
        free(got);
      }
    }
  }
}

/* ---- the allocator
 * ---------------------------------------------------------------------------------- */
Test(cuda, reserved_memory_stays_flat_over_10000_cycles) {
  int dev = cuda0();
  const nbi_backend *be = be_of(dev);
  size_t al0, re0, al, re, re_warm = 0;
  be->mem_info(ctx_of(dev), &al0, &re0);
  uint64_t seed = 7;
  for (int cyc = 0; cyc < 10000; cyc++) {
    void *p[8];
    size_t sz[8];
    int n = (int)tc_randint(&seed, 1, 8);
    for (int i = 0; i < n; i++) {
      sz[i] = tc_uniform(&seed, 0, 1) < 0.25 ? (size_t)tc_randint(&seed, 1 << 20, 16 << 20)
                                             : (size_t)tc_randint(&seed, 1, 256 << 10);
      p[i] = dev_alloc(dev, sz[i]);
    }
    for (int i = n - 1; i >= 0; i--)
      be->free(ctx_of(dev), p[i], sz[i]);
    if (cyc == 1000) be->mem_info(ctx_of(dev), &al, &re_warm);
  }
  be->mem_info(ctx_of(dev), &al, &re);
  cr_assert_eq(al, al0, "allocated %zu after the cycles, %zu before", al, al0);
  cr_assert_leq(re, re_warm + re_warm / 2, "reserved grew from %zu (cycle 1000) to %zu", re_warm,
                re);
  cr_log_info("reserved: %zu at cycle 1000, %zu after 10000", re_warm, re);
}

Test(cuda, a_request_larger_than_the_card_is_out_of_memory) {
  int dev = cuda0();
  const nbi_backend *be = be_of(dev);
  nbi_cuda_ctx *c = ctx_of(dev);
  size_t total = 0;
  cr_assert_eq(nbi_cu_check(nbi_cu.cuDeviceTotalMem(&total, c->dev), "cuDeviceTotalMem"), NB_OK);
  size_t al0 = 0;
  be->mem_info(c, &al0, NULL);
  void *held = dev_alloc(dev, 3 * MIB);
  size_t ask = total + total / 2;
  cr_assert_null(be->alloc(c, ask));
  char want[96];
  snprintf(want, sizeof want, "nabla: CUDA out of memory on cuda:0: requested %zu bytes", ask);
  const char *msg = nb_last_error();
  cr_assert_eq(nb_last_status(), NB_ERR_OOM, "status %s: %s", nb_status_str(nb_last_status()), msg);
  cr_assert(strstr(msg, want), "\"%s\" lacks \"%s\"", msg, want);
  snprintf(want, sizeof want, "allocated %zu, reserved ", al0 + 3 * MIB);
  cr_assert(strstr(msg, want), "\"%s\" lacks \"%s\"", msg, want);
  nb_clear_error();
  void *again = dev_alloc(dev, 1024); /* the allocator still works */
  be->free(c, again, 1024);
  be->free(c, held, 3 * MIB);
  cr_assert_eq(be->sync(c), NB_OK, "%s", nb_last_error());
}

/* ---- kernels: deferred errors, shared memory, PTX
 * ---------------------------------------------------- */
static const char *index_error_kernel =
    "/* err: the device's error word; one thread reports an index error of op */\n"
    "extern \"C\" __global__ void nb_test_report(int *err, int code) {\n"
    "  if (threadIdx.x == 0) atomicCAS(err, 0, code);\n"
    "}\n";

Test(cuda, a_kernel_reporting_a_bad_index_fails_the_next_sync) {
  int dev = cuda0();
  nbi_cuda_ctx *c = ctx_of(dev);
  cr_assert_eq(nbi_cuda_enter(c), NB_OK);
  CUfunction f;
  cr_assert_eq(nbi_cuda_function(c, index_error_kernel, "nb_test_report", &f), NB_OK, "%s",
               nb_last_error());
  int code = NBI_CUDA_KERR_INDEX | (NBI_OP_TAKE << 8), later = NBI_CUDA_KERR_INDEX;
  CUdeviceptr err = c->err_word;
  void *args[] = {&err, &code};
  cr_assert_eq(nbi_cuda_launch(c, f, 1, 1, 32, 0, args), NB_OK, "%s", nb_last_error());
  void *args2[] = {&err, &later}; /* dropped: the first error stays */
  cr_assert_eq(nbi_cuda_launch(c, f, 1, 1, 32, 0, args2), NB_OK, "%s", nb_last_error());
  cr_assert_eq(be_of(dev)->sync(c), NB_ERR_INDEX, "sync gave %s: %s",
               nb_status_str(nb_last_status()), nb_last_error());
  tc_assert_error(NB_ERR_INDEX, "nb_take: index"); /* no index words: "index 0 ... size 0" */
  cr_assert_eq(be_of(dev)->sync(c), NB_OK, "the error word is cleared: %s", nb_last_error());
  int unknown = 0x7f;
  void *args3[] = {&err, &unknown};
  cr_assert_eq(nbi_cuda_launch(c, f, 1, 1, 32, 0, args3), NB_OK);
  cr_assert_eq(be_of(dev)->sync(c), NB_ERR_INTERNAL);
  tc_assert_error(NB_ERR_INTERNAL, "error code 0x7f");
}

Test(cuda, a_download_after_a_kernel_reporting_a_bad_index_fails) {
  int dev = cuda0();
  nbi_cuda_ctx *c = ctx_of(dev);
  cr_assert_eq(nbi_cuda_enter(c), NB_OK);
  CUfunction f;
  cr_assert_eq(nbi_cuda_function(c, index_error_kernel, "nb_test_report", &f), NB_OK, "%s",
               nb_last_error());
  int code = NBI_CUDA_KERR_INDEX | (NBI_OP_ONE_HOT << 8), word = 5, got = 0;
  int *buf = dev_alloc(dev, 4);
  cr_assert_eq(be_of(dev)->upload(c, buf, &word, 4), NB_OK);
  CUdeviceptr err = c->err_word;
  void *args[] = {&err, &code};
  cr_assert_eq(nbi_cuda_launch(c, f, 1, 1, 32, 0, args), NB_OK, "%s", nb_last_error());
  cr_assert_eq(be_of(dev)->download(c, &got, buf, 4), NB_ERR_INDEX, "download gave %s: %s",
               nb_status_str(nb_last_status()), nb_last_error());
  tc_assert_error(NB_ERR_INDEX, "nb_one_hot: index");
  cr_assert_eq(got, 5, "the bytes still arrive");
  cr_assert_eq(be_of(dev)->download(c, &got, buf, 4), NB_OK, "%s", nb_last_error());
  be_of(dev)->free(c, buf, 4);
}

static const char *smem_kernel =
    "/* out[0] = sum of i over i < n, staged through n ints of dynamic shared memory */\n"
    "extern \"C\" __global__ void nb_test_smem(int *out, int n) {\n"
    "  extern __shared__ int buf[];\n"
    "  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = i;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {\n"
    "    int s = 0;\n"
    "    for (int i = 0; i < n; i++) s += buf[i];\n"
    "    out[0] = s;\n"
    "  }\n"
    "}\n";

Test(cuda, a_launch_above_48_kib_of_shared_memory_opts_in) {
  int dev = cuda0();
  nbi_cuda_ctx *c = ctx_of(dev);
  unsigned bytes = (unsigned)(c->smem_optin < 100 * 1024 ? c->smem_optin : 100 * 1024);
  int n = (int)(bytes / 4);
  cr_assert_eq(nbi_cuda_enter(c), NB_OK);
  CUfunction f;
  cr_assert_eq(nbi_cuda_function(c, smem_kernel, "nb_test_smem", &f), NB_OK, "%s", nb_last_error());
  int *out = dev_alloc(dev, 4);
  CUdeviceptr o = (CUdeviceptr)(uintptr_t)out;
  void *args[] = {&o, &n};
  cr_assert_eq(nbi_cuda_launch(c, f, 1, 1, 256, bytes, args), NB_OK, "%s", nb_last_error());
  int got = 0;
  cr_assert_eq(be_of(dev)->download(c, &got, out, 4), NB_OK, "%s", nb_last_error());
  cr_assert_eq(got, (int)((int64_t)n * (n - 1) / 2), "sum %d over %u B of shared memory", got,
               bytes);
  cr_assert_eq(nbi_cuda_launch(c, f, 1, 1, 256, (unsigned)c->smem_optin + 1, args),
               NB_ERR_INTERNAL);
  nb_clear_error();
  be_of(dev)->free(c, out, 4);
}

Test(cuda, ptx_for_an_older_arch_loads_and_runs) {
  int dev = cuda0();
  nbi_cuda_ctx *c = ctx_of(dev);
  /* one above the device's arch: NVRTC gives PTX for the newest arch it
   * knows up to there, which the driver compiles for this GPU */
  nbi_cuda_image img;
  int arch = c->cc_major * 10 + c->cc_minor + 1;
  cr_assert_eq(nbi_cuda_compile(smem_kernel, arch, &img), NB_OK, "%s", nb_last_error());
  cr_assert(img.ptx, "sm_%d should be unknown to NVRTC", arch);
  cr_assert_eq(nbi_cuda_enter(c), NB_OK);
  CUmodule mod;
  cr_assert_eq(nbi_cu_check(nbi_cu.cuModuleLoadData(&mod, img.data), "cuModuleLoadData (PTX)"),
               NB_OK, "%s", nb_last_error());
  CUfunction f;
  cr_assert_eq(nbi_cu_check(nbi_cu.cuModuleGetFunction(&f, mod, "nb_test_smem"), "get"), NB_OK);
  int *out = dev_alloc(dev, 4), n = 1000;
  CUdeviceptr o = (CUdeviceptr)(uintptr_t)out;
  void *args[] = {&o, &n};
  cr_assert_eq(nbi_cuda_launch(c, f, 1, 1, 128, 4000, args), NB_OK, "%s", nb_last_error());
  int got = 0;
  cr_assert_eq(be_of(dev)->download(c, &got, out, 4), NB_OK, "%s", nb_last_error());
  cr_assert_eq(got, 499500);
  be_of(dev)->free(c, out, 4);
  cr_assert_eq(nbi_cu_check(nbi_cu.cuModuleUnload(mod), "cuModuleUnload"), NB_OK);
  free(img.data);
}

/* ---- threads
 * -------------------------------------------------------------------------------------- */
typedef struct job {
  int dev;
  uint64_t seed;
  int failures;
  char why[256];
} job;

/* Round trips with a conversion (f32 -> f64 -> f32 is exact) many times. */
static void *round_trips(void *arg) {
  job *j = arg;
  const nbi_backend *be = be_of(j->dev);
  nbi_cuda_ctx *c = ctx_of(j->dev);
  enum { N = 100003 };
  float *in = malloc(N * sizeof *in), *out = malloc(N * sizeof *out);
  for (int it = 0; it < 60 && !j->failures; it++) {
    for (int i = 0; i < N; i++)
      in[i] = (float)tc_uniform(&j->seed, -1e6, 1e6);
    void *a = be->alloc(c, N * 4), *b = be->alloc(c, N * 8);
    nbi_view va = {.data = a, .dtype = NB_F32, .ndim = 1, .dims = {N}, .strides = {1}};
    nbi_view vb = {.data = b, .dtype = NB_F64, .ndim = 1, .dims = {N}, .strides = {1}};
    bool ok = a && b && be->upload(c, a, in, N * 4) == NB_OK && be->copy(c, &vb, &va) == NB_OK &&
              be->fill(c, &va, 0.0) == NB_OK && be->copy(c, &va, &vb) == NB_OK &&
              be->download(c, out, a, N * 4) == NB_OK && be->sync(c) == NB_OK;
    if (!ok || memcmp(in, out, N * 4)) {
      j->failures++;
      snprintf(j->why, sizeof j->why, "iteration %d: %s", it,
               ok ? "values differ" : nb_last_error());
    }
    be->free(c, a, N * 4);
    be->free(c, b, N * 8);
  }
  free(in);
  free(out);
  return NULL;
}

Test(cuda, two_host_threads_share_the_device) {
  int dev = cuda0();
  pthread_t t[2];
  job j[2] = {{.dev = dev, .seed = 1}, {.dev = dev, .seed = 2}};
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, round_trips, &j[i]), 0);
  for (int i = 0; i < 2; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(j[i].failures, 0, "thread %d: %s", i, j[i].why);
  }
}

/* ---- the public API
 * ----------------------------------------------------------------------------------- */
Test(cuda, public_tensors_round_trip_through_cuda_0) {
  cuda0();
  enum { N = 1000 };
  float x[N], y[N];
  for (int i = 0; i < N; i++)
    x[i] = (float)i * 0.25f - 3.0f;
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK, "%s", nb_last_error());
  nb_tensor *t = nb_from_data(x, NB_SHAPE(10, 100), NB_F32);
  cr_assert_not_null(t, "%s", nb_last_error());
  nb_device d = nb_device_of(t);
  cr_assert(d.kind == NB_DEVICE_CUDA && d.index == 0, "the tensor is on %s", nb_device_str(d));
  cr_assert_eq(nb_to_host(t, y, sizeof y), NB_OK, "%s", nb_last_error());
  cr_assert(!memcmp(x, y, sizeof x), "values changed on the way");
  cr_assert_eq(nb_set_default_device(NB_CPU), NB_OK);
  nb_tensor *h = nb_to_device(t, NB_CPU);
  cr_assert_not_null(h, "%s", nb_last_error());
  cr_assert_eq(nb_device_of(h).kind, NB_DEVICE_CPU);
  memset(y, 0, sizeof y);
  cr_assert_eq(nb_to_host(h, y, sizeof y), NB_OK, "%s", nb_last_error());
  cr_assert(!memcmp(x, y, sizeof x));
  nb_tensor *back = nb_to_device(h, NB_CUDA(0));
  cr_assert_not_null(back, "%s", nb_last_error());
  memset(y, 0, sizeof y);
  cr_assert_eq(nb_to_host(back, y, sizeof y), NB_OK, "%s", nb_last_error());
  cr_assert(!memcmp(x, y, sizeof x));
}

Test(cuda, a_missing_device_index_is_a_device_error) {
  int n = nb_device_count(NB_DEVICE_CUDA);
  if (n < 1) cr_skip_test("no CUDA device: %s", nbi_cuda_why());
  cr_assert_eq(nb_set_default_device(NB_CUDA(n)), NB_ERR_DEVICE);
  nb_clear_error();
}

#endif
