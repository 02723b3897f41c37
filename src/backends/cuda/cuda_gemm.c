/* src/backends/cuda/cuda_gemm.c — products on the GPU through cuBLASLt: nbi_cuda_gemm
 * (strided-batched C = op(A) op(B)), the MATMUL op kernel, and the planner's GEMM
 * epilogue groups [matmul, add row bias, activation].
 *
 * Layout. nabla's matrices are row-major and cuBLASLt's are column-major. A row-major
 * R x C matrix with leading dimension ld is, read column-major, its C x R transpose
 * with the same ld, so C = A B is computed as C^T = B^T A^T: cuBLASLt's A is our B,
 * its B our A, its D our C (N rows, M columns), nothing moved, transposed operands
 * given by the TRANSA / TRANSB flags. This rather than CUBLASLT_ORDER_ROW layouts:
 * every cuBLASLt algorithm takes column order (row order narrows the heuristic's
 * choice, and the bench's direct peer is plain column order), and the BIAS epilogue
 * adds a vector of D's row count along D's columns, which for D = C^T is exactly a
 * row bias [N] added to every row of C.
 *
 * Types. f32: CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 when
 * nbi_matmul_precision() is NB_PRECISION_HIGH; f16 and bf16: CUBLAS_COMPUTE_32F
 * (f32 accumulation, f32 scale type, rounded once into the 16-bit output); f64:
 * CUBLAS_COMPUTE_64F. cuBLASLt multiplies no other dtype: integer products run on a
 * hand-written kernel (cuda_gemm_kernels.c; int64 sums, wrapping, as the CPU's, an
 * i32 result stored from them through nbi_cuda_copy, saturating as every int64 ->
 * i32 store), bool products as or-of-ands.
 *
 * Heuristics. cublasLtMatmulAlgoGetHeuristic costs tens of microseconds, so its best
 * answer is cached with the descriptors it was asked with: one LRU of LT_CACHE
 * entries per device (their algorithms are the device's), keyed by every input of the
 * query (dtype, compute type, transposes, sizes, leading dimensions, batch count and
 * strides, epilogue, and the pointer alignments: cuBLASLt's kernels need their
 * operands aligned as the heuristic assumed, so the actual alignments are set as
 * CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES and key the entry). A query that found
 * nothing is cached as well. The device's lock is held from the lookup through the
 * enqueue of cublasLtMatmul (the entry's descriptor carries the call's bias pointer);
 * the device has one stream, so this serializes nothing that could overlap. The
 * workspace is the context's (lt_workspace), shared by every call on its stream.
 *
 * Epilogues. Only CUBLASLT_EPILOGUE_BIAS is used. RELU_BIAS is not exact: cuBLASLt's
 * relu maps NaN to 0, while nabla's relu (../ew_formulas.h) passes NaN through; its
 * GELU is the tanh approximation, nabla's the erf form. So the activation (relu,
 * gelu, tanh, sigmoid, silu) runs as one small elementwise pass over the GEMM's
 * output (cuda_gemm_kernels.c) with the shared formula the unfused activation uses.
 * When the sum is needed too, the GEMM writes it and the pass writes the activation
 * beside it; else the pass works in place. Should cuBLASLt have no BIAS algorithm
 * for a case, the plain product runs and the same pass adds the bias. The
 * environment variable NABLA_CUDA_NO_EPILOGUE=1 makes nbi_cuda_gemm_ok refuse every
 * group (the planner then runs the members unfused).
 *
 * Operands. A MATMUL operand whose matrices are row-major (unit column stride) or
 * column-major (unit row stride) with a positive leading dimension goes in place;
 * anything else (zero or negative matrix strides, another dtype) is first copied
 * contiguous into a scratch block (nbi_cuda_copy), freed once its products are
 * queued (stream order makes that safe). Batch dims are merged where their strides
 * allow; the largest remaining one becomes cuBLASLt's strided batch (stride 0
 * broadcasts), the others are looped over on the host. Should cuBLASLt have no
 * algorithm for a product's alignments (odd leading dimensions of 16-bit types, odd
 * offsets), its operands are copied with rows padded to 16 bytes and its result
 * computed likewise and copied into place (lt_gemm_aligned). */
#include "cuda_be.h"

#include <stdatomic.h>
#include <stdlib.h>

enum {
  LT_CACHE = 64,      /* heuristic cache entries per device */
  LT_MAX_ALIGN = 256, /* cuBLASLt's default (and largest) alignment preference */
};
#define LT_MAX_BATCH ((int64_t)INT32_MAX) /* CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT is int32 */

/* ---- cuBLASLt statuses and types ------------------------------------------------------ */

/* The name of a cuBLAS status ("CUBLAS_STATUS_NOT_SUPPORTED"). */
static const char *lt_status_name(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
  case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  default: return "CUBLAS_STATUS_(unknown)";
  }
}

/* One product of a batch as cuBLASLt gets it, in nabla's row-major terms: C (m x n,
 * ldc) = op(A) op(B) where A is stored m x k (k x m when ta) with leading dimension
 * lda, B k x n (n x k when tb); batch items `batch` apart by sa, sb, sc elements.
 * bias: NULL, or a contiguous [n] of dt added to every row (the BIAS epilogue). */
typedef struct lt_problem {
  nb_dtype dt;
  bool ta, tb;
  int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
  const char *a, *b;
  char *c;
  const void *bias;
} lt_problem;

/* The cuBLASLt types of dt: data type, compute type, scale type. false for dtypes
 * cuBLASLt does not multiply here. */
static bool lt_types(nb_dtype dt, cudaDataType *data, cublasComputeType_t *compute,
                     cudaDataType *scale) {
  *data = *scale = CUDA_R_32F;
  *compute = CUBLAS_COMPUTE_32F;
  switch (dt) {
  case NB_F32:
    *data = CUDA_R_32F;
    if (nbi_matmul_precision() == NB_PRECISION_HIGH) *compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    return true;
  case NB_F16: *data = CUDA_R_16F; return true;
  case NB_BF16: *data = CUDA_R_16BF; return true;
  case NB_F64:
    *data = CUDA_R_64F;
    *compute = CUBLAS_COMPUTE_64F;
    *scale = CUDA_R_64F;
    return true;
  default: return false;
  }
}

/* The alignment in bytes (a power of two, at most LT_MAX_ALIGN) every matrix of an
 * operand keeps: that of its address, of its leading dimension when it has more
 * than one column (stored column-major: `cols`), and of its batch stride. */
static uint32_t lt_align(const void *p, size_t es, int64_t ld, int64_t cols, int64_t stride,
                         int64_t batch) {
  uint64_t bits = (uint64_t)(uintptr_t)p | LT_MAX_ALIGN;
  if (cols > 1) bits |= (uint64_t)ld * es;
  if (batch > 1) bits |= (uint64_t)stride * es;
  return (uint32_t)(bits & (~bits + 1));
}

/* ---- the heuristic cache ------------------------------------------------------------------ */
/* Every input of a heuristic query; all words, so that memcmp and hashing see no
 * padding. */
typedef struct lt_key {
  int64_t handle, dt, compute, ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, batch, epilogue;
  int64_t align_a, align_b, align_c, align_bias;
} lt_key;

typedef struct lt_entry {
  lt_key key;
  uint64_t hash, used; /* used: LRU clock; 0 = empty */
  bool found;          /* the heuristic returned an algorithm */
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
  cublasLtMatmulAlgo_t algo;
} lt_entry;

typedef struct lt_cache {
  pthread_mutex_t lock;
  uint64_t clock;
  lt_entry e[LT_CACHE];
} lt_cache;

static lt_cache lt_caches[NBI_MAX_DEVICES];
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static atomic_uint_fast64_t lt_queries, lt_hits;

/* pthread_once routine: the per-device cache locks. */
static void lt_init_locks(void) {
  for (int i = 0; i < NBI_MAX_DEVICES; i++)
    pthread_mutex_init(&lt_caches[i].lock, NULL);
}

/* cuda_be.h: the cache counters, summed over devices. */
nbi_cuda_gemm_stats nbi_cuda_gemm_get_stats(void) {
  return (nbi_cuda_gemm_stats){.queries = atomic_load(&lt_queries), .hits = atomic_load(&lt_hits)};
}

/* FNV-1a over the key's words. */
static uint64_t lt_hash(const lt_key *k) {
  const int64_t *w = (const int64_t *)k;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < sizeof *k / sizeof *w; i++)
    h = (h ^ (uint64_t)w[i]) * 0x100000001b3ull;
  return h;
}

/* Destroys e's descriptors and empties it. */
static void lt_entry_clear(lt_entry *e) {
  if (e->op) nbi_cu.cublasLtMatmulDescDestroy(e->op);
  if (e->la) nbi_cu.cublasLtMatrixLayoutDestroy(e->la);
  if (e->lb) nbi_cu.cublasLtMatrixLayoutDestroy(e->lb);
  if (e->lc) nbi_cu.cublasLtMatrixLayoutDestroy(e->lc);
  memset(e, 0, sizeof *e);
}

/* Records NB_ERR_DEVICE for a failed cuBLASLt call `what` on problem p; NB_OK when s
 * is CUBLAS_STATUS_SUCCESS. */
static nb_status lt_check(cublasStatus_t s, const char *what, const lt_problem *p) {
  if (s == CUBLAS_STATUS_SUCCESS) return NB_OK;
  return nbi_error(NB_ERR_DEVICE,
                   "nb_matmul: %s failed: %s (%s, C[%lld x %lld] = A%s[%lld x %lld] @ B%s[%lld x "
                   "%lld], batch %lld)",
                   what, lt_status_name(s), nb_dtype_name(p->dt), (long long)p->m, (long long)p->n,
                   p->ta ? "^T" : "", (long long)p->m, (long long)p->k, p->tb ? "^T" : "",
                   (long long)p->k, (long long)p->n, (long long)p->batch);
}

/* A column-major layout of rows x cols (ld) of type t, batched as p; *l = NULL on
 * failure. */
static cublasStatus_t lt_layout(cublasLtMatrixLayout_t *l, cudaDataType t, int64_t rows,
                                int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  if (cols <= 1 && ld < rows) ld = rows; /* one column: ld is never used */
  if (ld < 1) ld = 1;
  *l = NULL;
  cublasStatus_t s = nbi_cu.cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
  int32_t count = (int32_t)batch;
  if (s == CUBLAS_STATUS_SUCCESS && batch > 1)
    s = nbi_cu.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof count);
  if (s == CUBLAS_STATUS_SUCCESS && batch > 1)
    s = nbi_cu.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof stride);
  return s;
}

/* Fills empty entry e for problem p (key k): descriptors, then the heuristic's best
 * algorithm (e->found false when it has none). On a failed cuBLASLt call, records
 * NB_ERR_DEVICE and leaves e empty. */
static nb_status lt_entry_create(nbi_cuda_ctx *c, const lt_problem *p, const lt_key *k,
                                 lt_entry *e) {
  cudaDataType data, scale;
  cublasComputeType_t compute;
  lt_types(p->dt, &data, &compute, &scale);
  compute = (cublasComputeType_t)k->compute; /* as keyed, should the precision change */
  e->key = *k;
  e->hash = lt_hash(k);
  int32_t op_a = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  uint32_t epilogue = (uint32_t)k->epilogue;
  cublasStatus_t s = nbi_cu.cublasLtMatmulDescCreate(&e->op, compute, scale);
  const char *what = "cublasLtMatmulDescCreate";
  if (!s) {
    what = "cublasLtMatmulDescSetAttribute";
    s = nbi_cu.cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                              sizeof op_a);
  }
  if (!s)
    s = nbi_cu.cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                              sizeof op_b);
  if (!s && p->bias) {
    s = nbi_cu.cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                              sizeof epilogue);
    if (!s)
      s = nbi_cu.cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias,
                                                sizeof p->bias);
  }
  /* cuBLASLt's A = our B: stored n x k read as op(.) = B^T; its B = our A */
  if (!s) {
    what = "cublasLtMatrixLayoutCreate";
    s = lt_layout(&e->la, data, p->tb ? p->k : p->n, p->tb ? p->n : p->k, p->ldb, p->sb, p->batch);
  }
  if (!s)
    s = lt_layout(&e->lb, data, p->ta ? p->m : p->k, p->ta ? p->k : p->m, p->lda, p->sa, p->batch);
  if (!s) s = lt_layout(&e->lc, data, p->n, p->m, p->ldc, p->sc, p->batch);
  cublasLtMatmulPreference_t pref = NULL;
  if (!s) {
    what = "cublasLtMatmulPreferenceCreate";
    s = nbi_cu.cublasLtMatmulPreferenceCreate(&pref);
  }
  uint64_t ws = c->lt_workspace ? (uint64_t)c->lt_workspace_bytes : 0;
  uint32_t align[4] = {(uint32_t)k->align_b, (uint32_t)k->align_a, (uint32_t)k->align_c,
                       (uint32_t)k->align_c};
  static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  if (!s) {
    what = "cublasLtMatmulPreferenceSetAttribute";
    s = nbi_cu.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws);
  }
  for (int i = 0; i < 4 && !s; i++)
    s = nbi_cu.cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i],
                                                    sizeof align[i]);
  cublasLtMatmulHeuristicResult_t res;
  memset(&res, 0, sizeof res);
  int n_res = 0;
  if (!s) {
    what = "cublasLtMatmulAlgoGetHeuristic";
    atomic_fetch_add(&lt_queries, 1);
    s = nbi_cu.cublasLtMatmulAlgoGetHeuristic(c->lt, e->op, e->la, e->lb, e->lc, e->lc, pref, 1,
                                              &res, &n_res);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) s = CUBLAS_STATUS_SUCCESS, n_res = 0;
  }
  if (pref) nbi_cu.cublasLtMatmulPreferenceDestroy(pref);
  if (s) {
    nb_status st = lt_check(s, what, p);
    lt_entry_clear(e);
    return st;
  }
  e->found = n_res > 0 && res.state == CUBLAS_STATUS_SUCCESS && res.workspaceSize <= ws;
  e->algo = res.algo;
  return NB_OK;
}

/* The cache of device c (its index in the device table). */
static lt_cache *lt_cache_of(const nbi_cuda_ctx *c) {
  pthread_once(&lt_once, lt_init_locks);
  return c->table >= 0 && c->table < NBI_MAX_DEVICES ? &lt_caches[c->table] : NULL;
}

/* Queues problem p (p->batch <= LT_MAX_BATCH) on c's stream with the cached (or
 * newly found) algorithm. *found false: cuBLASLt has no algorithm for it (nothing
 * queued, nothing recorded). Errors of cuBLASLt calls: NB_ERR_DEVICE recorded. */
static nb_status lt_run(nbi_cuda_ctx *c, const lt_problem *p, bool *found) {
  cudaDataType data, scale;
  cublasComputeType_t compute;
  *found = false;
  if (!lt_types(p->dt, &data, &compute, &scale))
    return nbi_error(NB_ERR_DTYPE, "nb_matmul: cuBLASLt does not multiply %s",
                     nb_dtype_name(p->dt));
  lt_cache *cache = lt_cache_of(c);
  if (!cache)
    return nbi_error(NB_ERR_INTERNAL, "nb_matmul: CUDA device table index %d out of range",
                     c->table);
  size_t es = nb_dtype_size(p->dt);
  lt_key k;
  memset(&k, 0, sizeof k);
  k.handle = (int64_t)(uintptr_t)c->lt;
  k.dt = p->dt, k.compute = compute, k.ta = p->ta, k.tb = p->tb;
  k.m = p->m, k.n = p->n, k.k = p->k, k.lda = p->lda, k.ldb = p->ldb, k.ldc = p->ldc;
  k.batch = p->batch;
  if (p->batch > 1) k.sa = p->sa, k.sb = p->sb, k.sc = p->sc;
  k.epilogue = p->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  k.align_a = lt_align(p->a, es, p->lda, p->ta ? p->k : p->m, p->sa, p->batch);
  k.align_b = lt_align(p->b, es, p->ldb, p->tb ? p->n : p->k, p->sb, p->batch);
  k.align_c = lt_align(p->c, es, p->ldc, p->m, p->sc, p->batch);
  k.align_bias = p->bias ? lt_align(p->bias, es, 0, 1, 0, 1) : 0;
  uint64_t h = lt_hash(&k);
  pthread_mutex_lock(&cache->lock);
  lt_entry *e = NULL, *victim = &cache->e[0];
  for (int i = 0; i < LT_CACHE && !e; i++) {
    lt_entry *x = &cache->e[i];
    if (x->used && x->hash == h && memcmp(&x->key, &k, sizeof k) == 0)
      e = x;
    else if (x->used < victim->used)
      victim = x;
  }
  nb_status st = NB_OK;
  if (e) {
    atomic_fetch_add(&lt_hits, 1);
  } else {
    lt_entry_clear(victim);
    st = lt_entry_create(c, p, &k, victim);
    e = st ? NULL : victim;
  }
  if (e) e->used = ++cache->clock;
  if (e && e->found) {
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (p->bias)
      s = nbi_cu.cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias,
                                                sizeof p->bias);
    st = lt_check(s, "cublasLtMatmulDescSetAttribute", p);
    float one_f = 1.0f, zero_f = 0.0f;
    double one_d = 1.0, zero_d = 0.0;
    const void *alpha = p->dt == NB_F64 ? (const void *)&one_d : (const void *)&one_f;
    const void *beta = p->dt == NB_F64 ? (const void *)&zero_d : (const void *)&zero_f;
    void *ws = c->lt_workspace ? (void *)(uintptr_t)c->lt_workspace : NULL;
    if (!st) {
      s = nbi_cu.cublasLtMatmul(c->lt, e->op, alpha, p->b, e->la, p->a, e->lb, beta, p->c, e->lc,
                                p->c, e->lc, &e->algo, ws, ws ? c->lt_workspace_bytes : 0,
                                c->stream);
      st = lt_check(s, "cublasLtMatmul", p);
    }
    *found = st == NB_OK;
  }
  pthread_mutex_unlock(&cache->lock);
  return st;
}

/* Records the error for a product cuBLASLt has no algorithm for. */
static nb_status lt_no_algo(const lt_problem *p) {
  return nbi_error(NB_ERR_DEVICE,
                   "nb_matmul: cuBLASLt has no algorithm for %s C[%lld x %lld] = A%s[%lld x %lld] "
                   "@ B%s[%lld x %lld] (lda %lld, ldb %lld, ldc %lld, batch %lld%s)",
                   nb_dtype_name(p->dt), (long long)p->m, (long long)p->n, p->ta ? "^T" : "",
                   (long long)p->m, (long long)p->k, p->tb ? "^T" : "", (long long)p->k,
                   (long long)p->n, (long long)p->lda, (long long)p->ldb, (long long)p->ldc,
                   (long long)p->batch, p->bias ? ", bias epilogue" : "");
}

/* Problem p over any batch count, in slices of at most LT_MAX_BATCH. *found as
 * lt_run (false: nothing was queued for the first slice that had no algorithm). */
static nb_status lt_gemm(nbi_cuda_ctx *c, lt_problem p, bool *found) {
  int64_t total = p.batch, es = (int64_t)nb_dtype_size(p.dt);
  const char *a = p.a, *b = p.b;
  char *cc = p.c;
  *found = true;
  for (int64_t b0 = 0; b0 < total && *found; b0 += LT_MAX_BATCH) {
    p.batch = total - b0 < LT_MAX_BATCH ? total - b0 : LT_MAX_BATCH;
    p.a = a + b0 * p.sa * es;
    p.b = b + b0 * p.sb * es;
    p.c = cc + b0 * p.sc * es;
    nb_status st = lt_run(c, &p, found);
    if (st) return st;
  }
  return NB_OK;
}

/* Whether the cuBLASLt library was loaded; records NB_ERR_DEVICE otherwise. */
static nb_status lt_available(void) {
  if (nbi_cu.lt) return NB_OK;
  return nbi_error(NB_ERR_DEVICE, "nb_matmul: cuBLASLt is not available: %s",
                   nbi_cu.why[0] ? nbi_cu.why : "libcublasLt.so was not loaded");
}

/* The view [batch, m, n] (strides sc, ldc, 1) of C, for fills and copies. */
static nbi_view c_view(void *cc, nb_dtype dt, int64_t m, int64_t n, int64_t ldc, int64_t sc,
                       int64_t batch) {
  return (nbi_view){.data = cc,
                    .dtype = dt,
                    .ndim = 3,
                    .dims = {batch, m, n},
                    .strides = {batch > 1 ? sc : 0, ldc, 1}};
}

/* Bytes the rows of lt_gemm_aligned's copies are padded to. */
enum { LT_PAD_BYTES = 16 };

/* *blk: a fresh block holding the matrices of one operand (rows x cols, row stride
 * ld, batch stride s over batch items; s 0: one matrix for all) with each row padded
 * to LT_PAD_BYTES, copied from src (left unset when src is NULL: a result). Writes
 * the copy's row and batch strides. Errors recorded (the block then freed). */
static nb_status lt_copy_padded(nbi_cuda_ctx *c, nb_dtype dt, const char *src, int64_t rows,
                                int64_t cols, int64_t ld, int64_t s, int64_t batch, int64_t *ldp,
                                int64_t *sp, CUdeviceptr *blk) {
  int64_t es = (int64_t)nb_dtype_size(dt), q = LT_PAD_BYTES / es, items = s == 0 ? 1 : batch;
  *ldp = cols > q ? (cols + q - 1) / q * q : q;
  *sp = s == 0 ? 0 : rows * *ldp;
  *blk = nbi_cuda_alloc_block(c->alloc, (size_t)(items * rows * *ldp * es));
  if (!*blk) return NB_ERR_OOM;
  if (!src) return NB_OK;
  nbi_view from = {.data = (char *)src,
                   .dtype = dt,
                   .ndim = 3,
                   .dims = {items, rows, cols},
                   .strides = {s, ld, 1}};
  nbi_view to = from;
  to.data = (char *)(uintptr_t)*blk;
  to.strides[0] = rows * *ldp, to.strides[1] = *ldp;
  nb_status st = nbi_cuda_copy(c, &to, &from);
  if (st) nbi_cuda_free_block(c->alloc, *blk), *blk = 0;
  return st;
}

/* Problem p for cuBLASLt having no algorithm for its alignments or leading
 * dimensions: A and B copied into blocks with rows padded to 16 bytes, C computed in
 * such a block and copied into place. *found as lt_gemm. */
static nb_status lt_gemm_aligned(nbi_cuda_ctx *c, const lt_problem *p, bool *found) {
  lt_problem q = *p;
  CUdeviceptr blk[3] = {0, 0, 0};
  *found = false;
  nb_status st = lt_copy_padded(c, p->dt, p->a, p->ta ? p->k : p->m, p->ta ? p->m : p->k, p->lda,
                                p->sa, p->batch, &q.lda, &q.sa, &blk[0]);
  if (!st)
    st = lt_copy_padded(c, p->dt, p->b, p->tb ? p->n : p->k, p->tb ? p->k : p->n, p->ldb, p->sb,
                        p->batch, &q.ldb, &q.sb, &blk[1]);
  if (!st)
    st = lt_copy_padded(c, p->dt, NULL, p->m, p->n, p->ldc, 1, p->batch, &q.ldc, &q.sc, &blk[2]);
  if (!st) {
    q.a = (const char *)(uintptr_t)blk[0], q.b = (const char *)(uintptr_t)blk[1];
    q.c = (char *)(uintptr_t)blk[2];
    st = lt_gemm(c, q, found);
  }
  if (!st && *found) {
    nbi_view to = c_view(p->c, p->dt, p->m, p->n, p->ldc, p->sc, p->batch);
    nbi_view from = c_view(q.c, p->dt, p->m, p->n, q.ldc, q.sc, p->batch);
    st = nbi_cuda_copy(c, &to, &from);
  }
  for (int i = 0; i < 3; i++)
    if (blk[i]) nbi_cuda_free_block(c->alloc, blk[i]);
  return st;
}

/* p through cuBLASLt: in place, else through lt_gemm_aligned's padded copies;
 * NB_ERR_DEVICE when neither has an algorithm. */
static nb_status lt_gemm_any(nbi_cuda_ctx *c, const lt_problem *p) {
  bool found;
  nb_status st = lt_gemm(c, *p, &found);
  if (!st && !found) st = lt_gemm_aligned(c, p, &found);
  return st ? st : found ? NB_OK : lt_no_algo(p);
}

/* cuda_be.h. Row-major, as a BLAS: A is stored m x k (k x m when trans_a) with row
 * stride lda, B k x n (n x k when trans_b), C m x n (ldc); batch items stride_a,
 * stride_b, stride_c elements apart (0 broadcasts A or B; C's must keep the results
 * apart). k = 0 fills C with zeros. Bad arguments: NB_ERR_ARG / NB_ERR_DTYPE /
 * NB_ERR_NULL naming nb_matmul; no cuBLASLt algorithm even for padded copies:
 * NB_ERR_DEVICE. Queued on c's stream. */
nb_status nbi_cuda_gemm(nbi_cuda_ctx *c, nb_dtype dt, bool trans_a, bool trans_b, int64_t m,
                        int64_t n, int64_t k, const void *a, int64_t lda, int64_t stride_a,
                        const void *b, int64_t ldb, int64_t stride_b, void *cc, int64_t ldc,
                        int64_t stride_c, int64_t batch) {
  if (!c) return nbi_error(NB_ERR_NULL, "nb_matmul: no CUDA device context");
  if (dt != NB_F32 && dt != NB_F64 && dt != NB_F16 && dt != NB_BF16)
    return nbi_error(NB_ERR_DTYPE, "nb_matmul: cuBLASLt GEMM takes f32, f64, f16 or bf16, not %s",
                     nb_dtype_name(dt));
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return nbi_error(NB_ERR_ARG, "nb_matmul: GEMM sizes m %lld, n %lld, k %lld, batch %lld",
                     (long long)m, (long long)n, (long long)k, (long long)batch);
  if (m == 0 || n == 0 || batch == 0) return NB_OK;
  int64_t row_a = trans_a ? m : k, row_b = trans_b ? k : n; /* stored row lengths */
  int64_t rows_a = trans_a ? k : m, rows_b = trans_b ? n : k;
  if ((rows_a > 1 && lda < row_a) || (rows_b > 1 && ldb < row_b) || (m > 1 && ldc < n) || lda < 1 ||
      ldb < 1 || ldc < 1)
    return nbi_error(NB_ERR_ARG,
                     "nb_matmul: GEMM leading dimensions lda %lld, ldb %lld, ldc %lld are below "
                     "the rows they hold (%lld, %lld, %lld)",
                     (long long)lda, (long long)ldb, (long long)ldc, (long long)row_a,
                     (long long)row_b, (long long)n);
  if (batch > 1 && (stride_a < 0 || stride_b < 0 || stride_c < (m - 1) * ldc + n))
    return nbi_error(NB_ERR_ARG,
                     "nb_matmul: GEMM batch strides a %lld, b %lld must be >= 0 and c %lld "
                     "must keep the %lld x %lld results apart",
                     (long long)stride_a, (long long)stride_b, (long long)stride_c, (long long)m,
                     (long long)n);
  if (!cc || (k > 0 && (!a || !b))) return nbi_error(NB_ERR_NULL, "nb_matmul: NULL GEMM operand");
  nb_status st = nbi_cuda_enter(c);
  if (st) return st;
  if (k == 0) {
    nbi_view v = c_view(cc, dt, m, n, ldc, stride_c, batch);
    return nbi_cuda_fill(c, &v, 0.0);
  }
  if ((st = lt_available())) return st;
  lt_problem p = {.dt = dt,
                  .ta = trans_a,
                  .tb = trans_b,
                  .m = m,
                  .n = n,
                  .k = k,
                  .lda = lda,
                  .ldb = ldb,
                  .ldc = ldc,
                  .sa = stride_a,
                  .sb = stride_b,
                  .sc = stride_c,
                  .batch = batch,
                  .a = a,
                  .b = b,
                  .c = cc};
  return lt_gemm_any(c, &p);
}

/* ---- MATMUL operands ----------------------------------------------------------------------- */

/* One operand seen as a batch of r x c matrices: element (i, j) of batch item I at
 * data + sum_e I[e] * bstrides[e] + i * sr + j * sc (elements). Batch dims align
 * right with the output's; a size-1 or stride-0 dim broadcasts (kept as size 1).
 * owned: a scratch copy (freed by the caller). */
typedef struct mm_operand {
  char *data;
  nb_dtype dt;
  int nb;
  int64_t bdims[NB_MAX_DIMS], bstrides[NB_MAX_DIMS];
  int64_t r, c, sr, sc;
  CUdeviceptr owned;
} mm_operand;

/* Operand view v of matmul; a 1-D left operand is the row [1, K], a 1-D right one
 * the column [K, 1] (the size-1 dim's stride is unused). */
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

/* Whether o's matrices can go to cuBLASLt in place: row-major (*trans false) or
 * column-major (*trans true) with a leading dimension *ld of at least the stored
 * row length. Strides of size-1 dims do not matter. */
static bool mm_layout(const mm_operand *o, bool *trans, int64_t *ld) {
  int64_t r1 = o->r > 1 ? o->r : 1, c1 = o->c > 1 ? o->c : 1;
  if ((o->c <= 1 || o->sc == 1) && (o->r <= 1 || o->sr >= c1)) {
    *trans = false;
    *ld = o->r <= 1 ? c1 : o->sr;
    return true;
  }
  if ((o->r <= 1 || o->sr == 1) && (o->c <= 1 || o->sc >= r1)) {
    *trans = true;
    *ld = o->c <= 1 ? r1 : o->sc;
    return true;
  }
  return false;
}

/* Replaces o's data by a contiguous row-major copy in dtype dt (its own batch dims,
 * broadcast dims kept at size 1) in a scratch block of device c. */
static nb_status mm_pack(nbi_cuda_ctx *c, mm_operand *o, nb_dtype dt) {
  nbi_view src = {.data = o->data, .dtype = o->dt, .ndim = o->nb + 2};
  int64_t n = o->r * o->c;
  for (int d = 0; d < o->nb; d++) {
    src.dims[d] = o->bdims[d];
    src.strides[d] = o->bstrides[d];
    n *= o->bdims[d];
  }
  src.dims[o->nb] = o->r, src.strides[o->nb] = o->sr;
  src.dims[o->nb + 1] = o->c, src.strides[o->nb + 1] = o->sc;
  size_t bytes = (size_t)n * nb_dtype_size(dt);
  CUdeviceptr p = nbi_cuda_alloc_block(c->alloc, bytes ? bytes : 1);
  if (!p) return NB_ERR_OOM;
  nbi_view dst = src;
  dst.data = (char *)(uintptr_t)p;
  dst.dtype = dt;
  int64_t st = 1;
  for (int d = dst.ndim - 1; d >= 0; d--) {
    dst.strides[d] = st;
    st *= dst.dims[d];
  }
  nb_status s = n ? nbi_cuda_copy(c, &dst, &src) : NB_OK;
  if (s) {
    nbi_cuda_free_block(c->alloc, p);
    return s;
  }
  if (o->owned) nbi_cuda_free_block(c->alloc, o->owned);
  o->owned = p;
  o->data = dst.data;
  o->dt = dt;
  o->sr = o->c;
  o->sc = 1;
  for (int d = 0; d < o->nb; d++)
    o->bstrides[d] = dst.strides[d];
  return NB_OK;
}

/* o ready for cuBLASLt in dtype dt: in place when its layout allows, else packed.
 * Writes its transpose flag and leading dimension. */
static nb_status mm_ready(nbi_cuda_ctx *c, mm_operand *o, nb_dtype dt, bool *trans, int64_t *ld) {
  if (o->dt == dt && mm_layout(o, trans, ld)) return NB_OK;
  nb_status st = mm_pack(c, o, dt);
  if (!st) mm_layout(o, trans, ld);
  return st;
}

/* ---- batch dims --------------------------------------------------------------------------- */
/* The output's batch dims after dropping size-1 dims and merging neighbours whose
 * strides allow (for A, B and C alike): `inner` is the one given to the product as
 * its strided batch (the largest with non-negative A and B strides; -1: none), the
 * others are looped over. s[0], s[1], s[2]: element strides of A, B, C. */
typedef struct mm_batch {
  int nd, inner;
  int64_t dims[NB_MAX_DIMS];
  int64_t s[3][NB_MAX_DIMS];
} mm_batch;

/* o's element stride along output batch dim d of onb (0 where it broadcasts). */
static int64_t mm_bstride(const mm_operand *o, int onb, int d) {
  int e = d - (onb - o->nb);
  return e >= 0 && o->bdims[e] != 1 ? o->bstrides[e] : 0;
}

/* Fills p for a product of a and b into out, whose first onb dims are the batch. */
static void mm_batch_plan(const mm_operand *a, const mm_operand *b, const nbi_view *out, int onb,
                          mm_batch *p) {
  p->nd = 0;
  p->inner = -1;
  for (int d = 0; d < onb; d++) {
    int64_t n = out->dims[d];
    if (n == 1) continue;
    int64_t s[3] = {mm_bstride(a, onb, d), mm_bstride(b, onb, d), out->strides[d]};
    int q = p->nd - 1;
    bool merge = q >= 0;
    for (int x = 0; x < 3 && merge; x++) {
      int64_t span;
      merge = !__builtin_mul_overflow(s[x], n, &span) && span == p->s[x][q];
    }
    if (!merge) q = p->nd++, p->dims[q] = 1;
    p->dims[q] *= n;
    for (int x = 0; x < 3; x++)
      p->s[x][q] = s[x];
  }
  for (int q = 0; q < p->nd; q++)
    if (p->s[0][q] >= 0 && p->s[1][q] >= 0 && (p->inner < 0 || p->dims[q] > p->dims[p->inner]))
      p->inner = q;
}

/* Advances idx over p's looped dims (all but inner); false after the last. */
static bool mm_batch_next(const mm_batch *p, int64_t *idx) {
  for (int q = p->nd - 1; q >= 0; q--) {
    if (q == p->inner) continue;
    if (++idx[q] < p->dims[q]) return true;
    idx[q] = 0;
  }
  return false;
}

/* Element offset of looped position idx in operand x (0 A, 1 B, 2 C). */
static int64_t mm_batch_offset(const mm_batch *p, const int64_t *idx, int x) {
  int64_t off = 0;
  for (int q = 0; q < p->nd; q++)
    if (q != p->inner) off += idx[q] * p->s[x][q];
  return off;
}

/* ---- MATMUL ------------------------------------------------------------------------------- */

/* Float products: every batch item through cuBLASLt in out's dtype (operands packed
 * where their layout or dtype needs it). */
static nb_status mm_float(nbi_cuda_ctx *c, mm_operand *a, mm_operand *b, nbi_view *out, int onb) {
  nb_status st = lt_available();
  if (st) return st;
  nb_dtype dt = out->dtype;
  lt_problem p = {.dt = dt, .m = a->r, .n = b->c, .k = a->c, .ldc = b->c};
  if ((st = mm_ready(c, a, dt, &p.ta, &p.lda)) || (st = mm_ready(c, b, dt, &p.tb, &p.ldb)))
    return st;
  int64_t es = (int64_t)nb_dtype_size(dt);
  mm_batch bp;
  mm_batch_plan(a, b, out, onb, &bp);
  int in = bp.inner;
  p.batch = in >= 0 ? bp.dims[in] : 1;
  p.sa = in >= 0 ? bp.s[0][in] : 0;
  p.sb = in >= 0 ? bp.s[1][in] : 0;
  p.sc = in >= 0 ? bp.s[2][in] : 0;
  int64_t idx[NB_MAX_DIMS] = {0};
  do {
    p.a = a->data + mm_batch_offset(&bp, idx, 0) * es;
    p.b = b->data + mm_batch_offset(&bp, idx, 1) * es;
    p.c = out->data + mm_batch_offset(&bp, idx, 2) * es;
    st = lt_gemm_any(c, &p);
  } while (!st && mm_batch_next(&bp, idx));
  return st;
}

/* Integer (int64 sums, wrapping) and bool (or of ands) products on
 * nbi_cuda_int_gemm; an i32 result goes through an int64 scratch and nbi_cuda_copy
 * (saturating as every int64 -> i32 store). */
static nb_status mm_int(nbi_cuda_ctx *c, mm_operand *a, mm_operand *b, nbi_view *out, int onb) {
  bool is_bool = out->dtype == NB_BOOL;
  nb_dtype cdt = is_bool ? NB_BOOL : NB_I64;
  nb_status st = NB_OK;
  if ((a->dt != cdt && (st = mm_pack(c, a, cdt))) || (b->dt != cdt && (st = mm_pack(c, b, cdt))))
    return st;
  int64_t n_out = 1;
  for (int d = 0; d < out->ndim; d++)
    n_out *= out->dims[d];
  CUdeviceptr scratch = 0;
  char *cbuf = out->data;
  if (out->dtype != cdt) {
    scratch = nbi_cuda_alloc_block(c->alloc, (size_t)n_out * sizeof(int64_t));
    if (!scratch) return NB_ERR_OOM;
    cbuf = (char *)(uintptr_t)scratch;
  }
  mm_batch bp;
  mm_batch_plan(a, b, out, onb, &bp);
  int in = bp.inner;
  int64_t es = (int64_t)nb_dtype_size(cdt), batch = in >= 0 ? bp.dims[in] : 1;
  int64_t sa = in >= 0 ? bp.s[0][in] : 0, sb = in >= 0 ? bp.s[1][in] : 0;
  int64_t sc = in >= 0 ? bp.s[2][in] : 0;
  int64_t idx[NB_MAX_DIMS] = {0};
  do {
    st = nbi_cuda_int_gemm(c, is_bool, a->r, b->c, a->c, batch,
                           a->data + mm_batch_offset(&bp, idx, 0) * es, sa, a->sr, a->sc,
                           b->data + mm_batch_offset(&bp, idx, 1) * es, sb, b->sr, b->sc,
                           cbuf + mm_batch_offset(&bp, idx, 2) * es, sc);
  } while (!st && mm_batch_next(&bp, idx));
  if (!st && scratch) {
    nbi_view src = *out;
    src.data = cbuf;
    src.dtype = cdt;
    st = nbi_cuda_copy(c, out, &src);
  }
  if (scratch) nbi_cuda_free_block(c->alloc, scratch);
  return st;
}

/* in[0] is (..., M, K) or (K), in[1] (..., K, N) or (K); out is contiguous (..., M, N)
 * without the M / N dim for a 1-D in[0] / in[1], batch dims broadcast from both
 * inputs' leading dims, in the node's dtype. Inputs: any dtype, any strides. */
nb_status nbi_cuda_matmul(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)n;
  if (!c || !out || !in) return nbi_error(NB_ERR_NULL, "nb_matmul: NULL CUDA kernel argument");
  if (in[0].ndim < 1 || in[1].ndim < 1)
    return nbi_error(NB_ERR_SHAPE, "nb_matmul: operands must be at least 1-D (ranks %d, %d)",
                     in[0].ndim, in[1].ndim);
  nb_status st = nbi_cuda_enter(c);
  if (st) return st;
  mm_operand a = mm_describe(&in[0], true), b = mm_describe(&in[1], false);
  int onb = out->ndim - (in[0].ndim > 1) - (in[1].ndim > 1);
  int64_t batches = 1;
  for (int d = 0; d < onb; d++)
    batches *= out->dims[d];
  if (batches == 0 || a.r == 0 || b.c == 0) return NB_OK;
  if (a.c == 0) return nbi_cuda_fill(c, out, 0.0);
  st = nb_dtype_is_float(out->dtype) ? mm_float(c, &a, &b, out, onb) : mm_int(c, &a, &b, out, onb);
  if (a.owned) nbi_cuda_free_block(c->alloc, a.owned);
  if (b.owned) nbi_cuda_free_block(c->alloc, b.owned);
  return st;
}

/* ---- GEMM epilogue groups ----------------------------------------------------------------- */
/* A group's parts: member indices of the product, the add and the activation (-1:
 * none), operand indices of A, B and the bias, the activation's op, and the output
 * slots of the sum and the activation (-1: not stored). Other members are aliases
 * (identity, stop_gradient) of operands. */
typedef struct epi_plan {
  int mm, add, act, op_a, op_b, op_bias, act_op, out_sum, out_act;
} epi_plan;

static bool is_alias(int op) { return op == NBI_OP_IDENTITY || op == NBI_OP_STOP_GRADIENT; }

/* Reference src (a member index or an operand, < 0) followed through alias
 * members. */
static int resolve(const nbi_group *g, int src) {
  while (src >= 0 && is_alias(g->m[src].op))
    src = g->m[src].src[0];
  return src;
}

/* Parses g into p; false when g is not a GEMM epilogue group this file runs. */
static bool epi_parse(const nbi_group *g, epi_plan *p) {
  *p = (epi_plan){-1, -1, -1, -1, -1, -1, -1, -1, -1};
  if (g->kind != NBI_GROUP_GEMM || g->n_members < 2 || g->n_members > NBI_FUSE_MAX ||
      g->n_operands < 1 || g->n_operands > NBI_FUSE_MAX || g->n_outputs > NBI_FUSE_MAX)
    return false;
  for (int k = 0; k < g->n_members; k++) { /* references point back, operands exist */
    const nbi_group_member *e = &g->m[k];
    if (e->n_in > 3 || e->out >= g->n_outputs || (is_alias(e->op) && e->n_in != 1)) return false;
    for (int q = 0; q < e->n_in; q++)
      if (e->src[q] >= k || e->src[q] < -g->n_operands) return false;
  }
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *e = &g->m[k];
    int r0 = e->n_in > 0 ? resolve(g, e->src[0]) : 0, r1 = e->n_in > 1 ? resolve(g, e->src[1]) : 0;
    if (is_alias(e->op)) {
      if (r0 >= 0) return false; /* an alias of the product or the sum */
    } else if (e->op == NBI_OP_MATMUL) {
      if (p->mm >= 0 || e->n_in != 2 || r0 >= 0 || r1 >= 0 || e->out >= 0 || e->shape.ndim != 2)
        return false;
      p->mm = k, p->op_a = -1 - r0, p->op_b = -1 - r1;
    } else if (e->op == NBI_OP_ADD) {
      if (p->mm < 0 || p->add >= 0 || e->n_in != 2 || !((r0 == p->mm) ^ (r1 == p->mm)))
        return false;
      int bias = r0 == p->mm ? r1 : r0;
      if (bias >= 0 || e->dtype != g->m[p->mm].dtype ||
          !nbi_shape_eq(&e->shape, &g->m[p->mm].shape))
        return false;
      p->add = k, p->op_bias = -1 - bias, p->out_sum = e->out;
    } else if (nbi_cuda_gemm_epi_act(e->op)) {
      if (p->add < 0 || p->act >= 0 || e->n_in != 1 || r0 != p->add ||
          e->dtype != g->m[p->add].dtype || !nbi_shape_eq(&e->shape, &g->m[p->add].shape))
        return false;
      p->act = k, p->act_op = e->op, p->out_act = e->out;
    } else {
      return false;
    }
  }
  nb_dtype dt = p->add >= 0 ? g->m[p->mm].dtype : NB_DTYPE_COUNT;
  return dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16;
}

/* Whether NABLA_CUDA_NO_EPILOGUE=1 turns the epilogue groups off. */
static bool epilogue_disabled(void) {
  const char *v = getenv("NABLA_CUDA_NO_EPILOGUE");
  return v && strcmp(v, "1") == 0;
}

/* cuda_be.h: whether g is a GEMM epilogue group of a float dtype this file runs
 * (see epi_parse), cuBLASLt is loaded and NABLA_CUDA_NO_EPILOGUE is not 1. */
bool nbi_cuda_gemm_ok(const nbi_cuda_ctx *c, const nbi_group *g) {
  epi_plan p;
  return c && g && nbi_cu.lt && !epilogue_disabled() && epi_parse(g, &p);
}

/* The bias operand v as a 1-D view of n elements ([N], [1, N], or any view whose
 * other dims are size 1 or stride 0); false when it is none of those. */
static bool bias_row(const nbi_view *v, int64_t n, nbi_view *row) {
  if (v->ndim < 1 || v->dims[v->ndim - 1] != n) return false;
  for (int d = 0; d < v->ndim - 1; d++)
    if (v->dims[d] != 1 && v->strides[d] != 0) return false;
  *row = (nbi_view){.data = v->data,
                    .dtype = v->dtype,
                    .ndim = 1,
                    .dims = {n},
                    .strides = {v->strides[v->ndim - 1]}};
  return true;
}

/* Copies the stored alias members of g from their operands. */
static nb_status epi_aliases(nbi_cuda_ctx *c, const nbi_group *g, nbi_view *out,
                             const nbi_view *in) {
  nb_status st = NB_OK;
  for (int k = 0; k < g->n_members && !st; k++)
    if (is_alias(g->m[k].op) && g->m[k].out >= 0)
      st = nbi_cuda_copy(c, &out[g->m[k].out], &in[-1 - resolve(g, k)]);
  return st;
}

/* The product, bias and activation of parsed group p into out: A, B packed where
 * needed (aob[0..1] own them), bias packed into aob[2] where it is not a
 * contiguous [N] of dt. */
static nb_status epi_run(nbi_cuda_ctx *c, const nbi_group *g, const epi_plan *p, nbi_view *out,
                         const nbi_view *in, CUdeviceptr *aob) {
  nb_dtype dt = g->m[p->mm].dtype;
  int64_t m = g->m[p->mm].shape.dims[0], n = g->m[p->mm].shape.dims[1];
  const nbi_view *va = &in[p->op_a], *vb = &in[p->op_b];
  if (va->ndim != 2 || vb->ndim != 2 || va->dims[0] != m || vb->dims[1] != n ||
      va->dims[1] != vb->dims[0])
    return nbi_error(NB_ERR_SHAPE, "nb_matmul: GEMM group operands do not make [%lld, %lld]",
                     (long long)m, (long long)n);
  int slot = p->out_sum >= 0 ? p->out_sum : p->act >= 0 ? p->out_act : -1;
  if (slot < 0 || m == 0 || n == 0) return NB_OK; /* nothing of the group is needed */
  nbi_view bias;
  if (!bias_row(&in[p->op_bias], n, &bias))
    return nbi_error(NB_ERR_SHAPE, "nb_matmul: GEMM group bias is not a row of %lld", (long long)n);
  for (int s = 0; s < 2; s++) {
    int o = s ? p->out_act : p->out_sum;
    if (o >= 0 && (out[o].dtype != dt || !nbi_view_is_contiguous(&out[o])))
      return nbi_error(NB_ERR_INTERNAL, "nb_matmul: GEMM group output %d is not a contiguous %s", o,
                       nb_dtype_name(dt));
  }
  mm_operand a = mm_describe(va, true), b = mm_describe(vb, false);
  lt_problem pr = {.dt = dt, .m = m, .n = n, .k = a.c, .ldc = n, .batch = 1, .c = out[slot].data};
  nb_status st = mm_ready(c, &a, dt, &pr.ta, &pr.lda);
  aob[0] = a.owned;
  if (!st) st = mm_ready(c, &b, dt, &pr.tb, &pr.ldb);
  aob[1] = b.owned;
  if (!st && (bias.dtype != dt || (n > 1 && bias.strides[0] != 1))) {
    mm_operand o = mm_describe(&bias, true);
    st = mm_pack(c, &o, dt);
    aob[2] = o.owned;
    bias.data = o.data, bias.dtype = dt, bias.strides[0] = 1;
  }
  if (st) return st;
  bool found = false;
  if (pr.k == 0) {
    nbi_view v = c_view(pr.c, dt, m, n, n, 0, 1);
    st = nbi_cuda_fill(c, &v, 0.0);
  } else {
    pr.a = a.data, pr.b = b.data, pr.bias = bias.data;
    st = lt_run(c, &pr, &found);
    if (!st && !found) { /* no BIAS algorithm: the plain product, the bias in the pass */
      pr.bias = NULL;
      st = lt_gemm_any(c, &pr);
    }
  }
  bool bias_in_pass = !found, act = p->act >= 0 && p->out_act >= 0;
  if (st || (!bias_in_pass && !act)) return st;
  void *sum = bias_in_pass && p->out_sum >= 0 ? out[slot].data : NULL;
  return nbi_cuda_gemm_epi_pass(c, dt, act ? p->act_op : -1, out[slot].data,
                                bias_in_pass ? bias.data : NULL, sum,
                                act ? out[p->out_act].data : NULL, m * n, n);
}

/* cuda_be.h: runs group g (nbi_cuda_gemm_ok took it): in[k] is operand k's view (A,
 * B: 2-D, any strides; the bias as given), out[j] output slot j (contiguous). */
nb_status nbi_cuda_gemm_group(nbi_cuda_ctx *c, const nbi_group *g, nbi_view *out,
                              const nbi_view *in) {
  epi_plan p;
  if (!c || !g || !out || !in) return nbi_error(NB_ERR_NULL, "nb_eval: NULL GEMM group argument");
  if (!epi_parse(g, &p))
    return nbi_error(NB_ERR_INTERNAL, "nb_eval: a GEMM group nbi_cuda_gemm_ok does not take");
  nb_status st = nbi_cuda_enter(c);
  if (!st) st = lt_available();
  if (!st) st = epi_aliases(c, g, out, in);
  if (st) return st;
  CUdeviceptr owned[3] = {0, 0, 0};
  st = epi_run(c, g, &p, out, in, owned);
  for (int i = 0; i < 3; i++)
    if (owned[i]) nbi_cuda_free_block(c->alloc, owned[i]);
  return st;
}
