/* src/backends/cpu/k_linalg.c — MATMUL kernel and operand packing.
 *
 * A single 2-D f32 product below NBI_GEMM_SMALL_MACS whose right operand has unit-stride rows
 * runs on the small kernel (k_gemm_small.c) at the operands' strides. Other
 * f32 products (f16/bf16 widened to f32, rounded once at the end) run as one
 * cached oneDNN matmul primitive over all batch items, batch strides and
 * broadcast included (k_gemm_epi.c), from the second call of a shape and
 * layout on, except one large 2-D product (MM_SGEMM_MIN_MACS); otherwise, and for f64, they go to
 * nbi_cpu_gemm one matrix at a time (f32: oneDNN sgemm, f64: OpenBLAS dgemm). An operand whose
 * matrices are row-major, or transposed (column-major), with a positive leading dimension is handed
 * to GEMM in place with the matching transpose flag (or strides of the primitive's memory
 * descriptor); anything else (negative or zero strides, another dtype) is packed once into a
 * contiguous copy. Batch dims are never materialized: each product indexes its source batch item,
 * and stride-0 batch dims (broadcast views) are not copied either. Many small products are spread
 * over the threads one GEMM each; large ones use the GEMM library's threads.
 * Integer products accumulate exactly in int64 (wrapping like NumPy int64);
 * bool products are or-of-ands. */
#include "k_linalg.h"

#include "k_gemm_epi.h"
#include "k_gemm_small.h"

/* A single 2-D f32 product of at least this many multiply-adds goes to sgemm. */
#define MM_SGEMM_MIN_MACS (1 << 29)

#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

/* Scratch comes from the caching buffer allocator (src/core/alloc.c), so a
 * kernel's scratch of the same size class as the last call's is a cache hit
 * (no malloc, no page faults). The block's first 64 bytes hold its buffer, so
 * the memory handed out stays 64-byte aligned. */
enum { SCRATCH_HEADER = 64 };

void *nbi_cpu_scratch(const char *fn, size_t nbytes) {
  nbi_buffer *b =
      nbytes <= SIZE_MAX - SCRATCH_HEADER ? nbi_buffer_alloc(0, nbytes + SCRATCH_HEADER) : NULL;
  if (!b) {
    nbi_error(NB_ERR_OOM, "%s: out of memory allocating %zu bytes of scratch", fn, nbytes);
    return NULL;
  }
  memcpy(b->data, &b, sizeof b);
  return (char *)b->data + SCRATCH_HEADER;
}

void nbi_cpu_scratch_free(void *p) {
  if (!p) return;
  nbi_buffer *b;
  memcpy(&b, (char *)p - SCRATCH_HEADER, sizeof b);
  nbi_buffer_release(b);
}

const void *nbi_cpu_contig(const char *fn, const nbi_view *v, nb_dtype dt, void **owned) {
  *owned = NULL;
  if (v->dtype == dt && nbi_view_is_contiguous(v)) return v->data;
  nbi_view dst = {.dtype = dt, .ndim = v->ndim};
  nb_shape s = {.ndim = v->ndim};
  memcpy(s.dims, v->dims, sizeof s.dims);
  memcpy(dst.dims, v->dims, sizeof dst.dims);
  nbi_contig_strides(&s, dst.strides);
  dst.data = nbi_cpu_scratch(fn, (size_t)nbi_numel(&s) * nb_dtype_size(dt));
  if (!dst.data) return NULL;
  nbi_copy_view(&dst, v);
  *owned = dst.data;
  return dst.data;
}

bool nbi_cpu_gemm_batch_parallel(nb_dtype dt, int64_t batches, int64_t m, int64_t n, int64_t k) {
  double mnk = (double)m * (double)n * (double)k;
  if (batches < 2 || (double)batches * mnk < NBI_PAR_MIN) return false;
  /* OpenBLAS (pthreads build) runs dgemm single-threaded up to 65536 * 4
   * multiply-adds and its own threads above; nesting those in OpenMP threads
   * would oversubscribe. oneDNN runs sequentially inside an OpenMP region, and
   * one product per thread beats splitting each product up to ~128^3. */
  return mnk <= (dt == NB_F64 ? 262144.0 : 2097152.0);
}

/* One operand seen as a batch of r x c matrices: element (i, j) of the batch
 * item with index vector I sits at data + sum_e I[e] * bstrides[e] + i * sr +
 * j * sc (elements). Batch dims align right with the output's; a size-1 dim
 * broadcasts (stride-0 dims are recorded as size 1). owned: packed copy. */
typedef struct mm_operand {
  char *data;
  nb_dtype dt;
  int nb;
  int64_t bdims[NB_MAX_DIMS], bstrides[NB_MAX_DIMS];
  int64_t r, c, sr, sc;
  void *owned;
} mm_operand;

/* The operand view v of matmul; a 1-D left operand is one row [1, K], a 1-D
 * right operand one column [K, 1] (the stride of the size-1 dim is unused). */
static mm_operand mm_describe(const nbi_view *v, bool left) {
  mm_operand o = {.data = v->data, .dt = v->dtype};
  if (v->ndim == 1) {
    o.r = left ? 1 : v->dims[0];
    o.c = left ? v->dims[0] : 1;
    o.sr = left ? 0 : v->strides[0];
    o.sc = left ? v->strides[0] : 0;
    return o;
  }
  o.nb = v->ndim - 2;
  for (int d = 0; d < o.nb; d++) {
    o.bdims[d] = v->strides[d] == 0 ? 1 : v->dims[d];
    o.bstrides[d] = v->strides[d];
  }
  o.r = v->dims[o.nb];
  o.c = v->dims[o.nb + 1];
  o.sr = v->strides[o.nb];
  o.sc = v->strides[o.nb + 1];
  return o;
}

/* Whether o's matrices can go to GEMM in place: row-major (*trans false) or
 * column-major (*trans true), with a leading dimension *ld of at least the
 * stored row length that fits BLAS's 32-bit interface. Strides of size-1 dims
 * do not matter. */
static bool mm_gemm_layout(const mm_operand *o, bool *trans, int64_t *ld) {
  int64_t r1 = o->r > 1 ? o->r : 1, c1 = o->c > 1 ? o->c : 1;
  if ((o->c <= 1 || o->sc == 1) && (o->r <= 1 || o->sr >= c1)) {
    *trans = false;
    *ld = o->r <= 1 ? c1 : o->sr;
  } else if ((o->r <= 1 || o->sr == 1) && (o->c <= 1 || o->sc >= r1)) {
    *trans = true;
    *ld = o->c <= 1 ? r1 : o->sc;
  } else {
    return false;
  }
  return *ld <= INT_MAX;
}

bool nbi_cpu_gemm_layout(const nbi_view *v, bool *trans, int64_t *ld) {
  mm_operand o = mm_describe(v, true);
  return v->ndim == 2 && mm_gemm_layout(&o, trans, ld);
}

/* Replaces o's data by a contiguous row-major copy in dtype dt (o's own batch
 * dims, broadcast dims kept at size 1); keeps o's memory when it already is
 * one. Returns NB_ERR_OOM on failure. */
static nb_status mm_pack(mm_operand *o, nb_dtype dt) {
  nbi_view src = {.data = o->data, .dtype = o->dt, .ndim = o->nb + 2};
  for (int d = 0; d < o->nb; d++) {
    src.dims[d] = o->bdims[d];
    src.strides[d] = o->bstrides[d];
  }
  src.dims[o->nb] = o->r;
  src.strides[o->nb] = o->sr;
  src.dims[o->nb + 1] = o->c;
  src.strides[o->nb + 1] = o->sc;
  const void *p = nbi_cpu_contig("nb_matmul", &src, dt, &o->owned);
  if (!p) return NB_ERR_OOM;
  o->data = (char *)p;
  o->dt = dt;
  o->sc = 1;
  o->sr = o->c;
  int64_t st = o->r * o->c;
  for (int d = o->nb - 1; d >= 0; d--) {
    o->bstrides[d] = st;
    st *= o->bdims[d];
  }
  return NB_OK;
}

/* Element offset in o of batch item `b`, numbered row-major over the output
 * batch dims odims[0..onb). */
static int64_t mm_batch_offset(const mm_operand *o, const int64_t *odims, int onb, int64_t b) {
  int64_t off = 0;
  for (int d = onb - 1, e = o->nb - 1; e >= 0; d--, e--) {
    int64_t i = b % odims[d];
    b /= odims[d];
    if (o->bdims[e] != 1) off += i * o->bstrides[e];
  }
  return off;
}

/* The GEMMs of one float product: operands a, b (GEMM-ready in dt), C rows of
 * m x n per batch item, out's first onb dims being the batch. */
typedef struct mm_gemms {
  const mm_operand *a, *b;
  nb_dtype dt;
  bool ta, tb;
  int64_t lda, ldb, es;
  char *c;
  const int64_t *odims;
  int onb;
} mm_gemms;

/* C[i] = A[i] @ B[i] for batch item i. */
static nb_status mm_gemm_item(const mm_gemms *g, int64_t i) {
  int64_t m = g->a->r, k = g->a->c, n = g->b->c;
  const char *pa = g->a->data + mm_batch_offset(g->a, g->odims, g->onb, i) * g->es;
  const char *pb = g->b->data + mm_batch_offset(g->b, g->odims, g->onb, i) * g->es;
  return nbi_cpu_gemm(g->dt, g->ta, g->tb, m, n, k, 1.0, pa, g->lda, pb, g->ldb, 0.0,
                      g->c + i * m * n * g->es, n);
}

/* o's dims and element strides over the output's onb batch dims (aligned
 * right; missing and broadcast dims have size 1) and its matrix dims, for a
 * oneDNN memory descriptor: o is GEMM-ready (trans, ld). A size-1 dim gets the
 * span of the dims inside it as its stride. */
static void mm_dnnl_layout(const mm_operand *o, int onb, bool trans, int64_t ld, int64_t *dims,
                           int64_t *strides) {
  int nd = onb + 2;
  dims[nd - 2] = o->r;
  dims[nd - 1] = o->c;
  strides[nd - 2] = trans ? 1 : ld;
  strides[nd - 1] = trans ? ld : 1;
  int64_t span = 1 + (o->r - 1) * strides[nd - 2] + (o->c - 1) * strides[nd - 1];
  for (int d = onb - 1; d >= 0; d--) {
    int e = d - (onb - o->nb);
    dims[d] = e >= 0 ? o->bdims[e] : 1;
    strides[d] = dims[d] > 1 ? o->bstrides[e] : span;
    span += (dims[d] - 1) * strides[d];
  }
}

/* Float product: GEMM per batch item into out (or an f32 scratch rounded into
 * an f16/bf16 out once at the end). Small products run one per thread; the
 * others run in turn outside any OpenMP region, so that the GEMM library's own
 * parallel region is the top-level one (nested inside even an inactive region,
 * libgomp would start fresh threads for every call). */
static nb_status mm_float(mm_operand *a, mm_operand *b, nbi_view *out, int onb, int64_t batches) {
  if (batches == 1 && out->dtype == NB_F32 && a->dt == NB_F32 && b->dt == NB_F32 &&
      (b->sc == 1 || b->c == 1) && nbi_gemm_small_fits(a->r, b->c, a->c)) {
    /* small 2-D: the in-house kernel at the operands' strides (B's rows unit-stride, or one
     * column: packing a transposed B costs more than oneDNN's sgemm takes) */
    nbi_gemm_small_args s = {.m = a->r, .n = b->c, .k = a->c};
    s.a = (const float *)a->data, s.sa_r = a->sr, s.sa_c = a->sc;
    s.b = (const float *)b->data, s.sb_r = b->sr, s.sb_c = b->sc;
    s.c = (float *)out->data, s.ldc = b->c;
    return nbi_gemm_small(&s);
  }
  nb_dtype cdt = out->dtype == NB_F64 ? NB_F64 : NB_F32;
  mm_gemms g = {
      .a = a, .b = b, .dt = cdt, .es = (int64_t)nb_dtype_size(cdt), .odims = out->dims, .onb = onb};
  if (a->dt != cdt || !mm_gemm_layout(a, &g.ta, &g.lda)) {
    if (mm_pack(a, cdt)) return NB_ERR_OOM;
    mm_gemm_layout(a, &g.ta, &g.lda);
  }
  if (b->dt != cdt || !mm_gemm_layout(b, &g.tb, &g.ldb)) {
    if (mm_pack(b, cdt)) return NB_ERR_OOM;
    mm_gemm_layout(b, &g.tb, &g.ldb);
  }
  int64_t m = a->r, k = a->c, n = b->c;
  g.c = out->dtype == cdt ? out->data
                          : nbi_cpu_scratch("nb_matmul", (size_t)(batches * m * n * g.es));
  if (!g.c) return NB_ERR_OOM;
  nb_status st = NB_OK;
  int64_t ad[NB_MAX_DIMS], as[NB_MAX_DIMS], bd[NB_MAX_DIMS], bs[NB_MAX_DIMS], cd[NB_MAX_DIMS];
  if (cdt == NB_F32) { /* all batch items in one oneDNN matmul primitive */
    mm_dnnl_layout(a, onb, g.ta, g.lda, ad, as);
    mm_dnnl_layout(b, onb, g.tb, g.ldb, bd, bs);
    memcpy(cd, out->dims, sizeof *cd * (size_t)onb);
    cd[onb] = m;
    cd[onb + 1] = n;
  }
  /* One large 2-D product: sgemm measured faster than the primitive here
   * (bench_gemm, 1024 and 2048: 4% and 14%); batched and mid-size ones gain. */
  bool prim = batches > 1 ||
              ((double)m * (double)n * (double)k < MM_SGEMM_MIN_MACS && !nbi_cpu_sgemm_blas());
  if (cdt == NB_F32 && prim &&
      nbi_cpu_gemm_prim(onb + 2, ad, as, (const float *)a->data, bd, bs, (const float *)b->data, cd,
                        (float *)g.c)) {
    ; /* done */
  } else if (nbi_cpu_gemm_batch_parallel(cdt, batches, m, n, k)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < batches; i++) {
      nb_status s = mm_gemm_item(&g, i);
      if (s != NB_OK) {
#pragma omp critical(nbi_matmul_status)
        st = s;
      }
    }
  } else {
    for (int64_t i = 0; i < batches && st == NB_OK; i++)
      st = mm_gemm_item(&g, i);
  }
  if (g.c != out->data) {
    nbi_view src = *out;
    src.data = g.c;
    src.dtype = cdt;
    nbi_copy_view(out, &src);
    nbi_cpu_scratch_free(g.c);
  }
  return st;
}

/* Integer product: exact int64 sums (wrapping) into out, or into an int64
 * scratch stored into an i32 out (saturating, as every int64 -> i32 store). */
static nb_status mm_int(mm_operand *a, mm_operand *b, nbi_view *out, int onb, int64_t batches) {
  if (mm_pack(a, NB_I64) || mm_pack(b, NB_I64)) return NB_ERR_OOM;
  int64_t m = a->r, k = a->c, n = b->c;
  uint64_t *acc = out->dtype == NB_I64
                      ? (uint64_t *)out->data
                      : nbi_cpu_scratch("nb_matmul", (size_t)(batches * m * n) * sizeof *acc);
  if (!acc) return NB_ERR_OOM;
  int64_t rows = batches * m;
#pragma omp parallel for schedule(static) if ((double)rows * n * k >= NBI_PAR_MIN && rows > 1)
  for (int64_t row = 0; row < rows; row++) {
    int64_t bi = row / m, i = row % m;
    const int64_t *restrict ar =
        (const int64_t *)a->data + mm_batch_offset(a, out->dims, onb, bi) + i * k;
    const int64_t *bm = (const int64_t *)b->data + mm_batch_offset(b, out->dims, onb, bi);
    uint64_t *restrict cr = acc + row * n;
    for (int64_t j = 0; j < n; j++)
      cr[j] = 0;
    for (int64_t p = 0; p < k; p++) {
      uint64_t av = (uint64_t)ar[p];
      const int64_t *restrict br = bm + p * n;
      for (int64_t j = 0; j < n; j++)
        cr[j] += av * (uint64_t)br[j];
    }
  }
  if ((void *)acc != out->data) {
    nbi_view src = *out;
    src.data = (char *)acc;
    src.dtype = NB_I64;
    nbi_copy_view(out, &src);
    nbi_cpu_scratch_free(acc);
  }
  return NB_OK;
}

/* Bool product: out[i, j] = any_p(a[i, p] && b[p, j]). */
static nb_status mm_bool(mm_operand *a, mm_operand *b, nbi_view *out, int onb, int64_t batches) {
  if (mm_pack(a, NB_BOOL) || mm_pack(b, NB_BOOL)) return NB_ERR_OOM;
  int64_t m = a->r, k = a->c, n = b->c, rows = batches * m;
#pragma omp parallel for schedule(static) if ((double)rows * n * k >= NBI_PAR_MIN && rows > 1)
  for (int64_t row = 0; row < rows; row++) {
    int64_t bi = row / m, i = row % m;
    const uint8_t *restrict ar =
        (const uint8_t *)a->data + mm_batch_offset(a, out->dims, onb, bi) + i * k;
    const uint8_t *bm = (const uint8_t *)b->data + mm_batch_offset(b, out->dims, onb, bi);
    uint8_t *restrict cr = (uint8_t *)out->data + row * n;
    for (int64_t j = 0; j < n; j++)
      cr[j] = 0;
    for (int64_t p = 0; p < k; p++) {
      if (!ar[p]) continue;
      const uint8_t *restrict br = bm + p * n;
      for (int64_t j = 0; j < n; j++)
        cr[j] |= br[j] != 0;
    }
  }
  return NB_OK;
}

/* in[0] is (..., M, K) or (K), in[1] is (..., K, N) or (K); out is contiguous
 * (..., M, N) with the M / N dim absent for a 1-D in[0] / in[1] and the batch
 * dims broadcast from both inputs' leading dims. Inputs may be any dtype and
 * any strides; the product is computed in out's dtype (f16/bf16 in f32). */
nb_status nbi_cpu_matmul(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  (void)node;
  mm_operand a = mm_describe(&in[0], true), b = mm_describe(&in[1], false);
  int onb = out->ndim - (in[0].ndim > 1) - (in[1].ndim > 1);
  int64_t batches = 1;
  for (int d = 0; d < onb; d++)
    batches *= out->dims[d];
  if (batches == 0 || a.r == 0 || b.c == 0) return NB_OK;
  if (a.c == 0) {
    nbi_fill_view(out, 0);
    return NB_OK;
  }
  nb_status st = nb_dtype_is_float(out->dtype) ? mm_float(&a, &b, out, onb, batches)
                 : out->dtype == NB_BOOL       ? mm_bool(&a, &b, out, onb, batches)
                                               : mm_int(&a, &b, out, onb, batches);
  nbi_cpu_scratch_free(a.owned);
  nbi_cpu_scratch_free(b.owned);
  return st;
}
