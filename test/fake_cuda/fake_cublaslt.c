/* test/fake_cuda/fake_cublaslt.c — the fake cuBLASLt: D = epilogue(alpha op(A) op(B) +
 * beta C) on the host, for the cases nabla's cuda_gemm.c asks for and their neighbours.
 *
 * Matrices are column-major (CUBLASLT_ORDER_COL; another order is NOT_SUPPORTED) with
 * a leading dimension of at least their rows, batched by CUBLASLT_MATRIX_LAYOUT_
 * BATCH_COUNT (equal on all four) and STRIDED_BATCH_OFFSET (elements; 0 broadcasts).
 * Types: compute CUBLAS_COMPUTE_32F (and its _FAST_TF32 / _FAST_16F / _FAST_16BF
 * forms, whose inputs are first rounded to TF32 (to nearest, ties away, as the
 * tensor cores' conversion), f16 or bf16) with scale type f32 and A, B of f32, f16 or
 * bf16 with C = D of that type or f32; CUBLAS_COMPUTE_64F with everything f64. Products
 * sum in double, then alpha, beta C (C is not read when beta is 0, as cuBLAS), the bias
 * (one value per row of D, of D's type unless CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
 * says) and relu (NaN to 0, as cuBLASLt's) are applied, and D is stored rounded once
 * (to nearest even). Epilogues: DEFAULT, BIAS, RELU, RELU_BIAS; others are
 * NOT_SUPPORTED. Pointer mode host or device (device memory is host memory here).
 *
 * The heuristic answers one algorithm that needs no workspace and that assumes the
 * preference's minimum alignments (default 256 bytes), none when an alignment is below
 * its operand's element size. cublasLtMatmul with that algorithm checks that every
 * matrix, leading dimension and batch stride keeps those alignments
 * (CUBLAS_STATUS_INVALID_VALUE otherwise: a real kernel would fault on such operands),
 * and that every operand lies inside device memory (CUBLAS_STATUS_EXECUTION_FAILED
 * otherwise). Attributes the fake does not model are CUBLAS_STATUS_NOT_SUPPORTED. */
#include "fake_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FK_EXPORT __attribute__((visibility("default")))
#define FK_DESC 0x44455343u
#define FK_LAYOUT 0x4c41594fu
#define FK_PREF 0x50524546u
#define FK_ALGO 0x414c474fu

struct cublasLtContext {
  int unused;
};

typedef struct fk_desc {
  uint32_t magic;
  int32_t compute, scale, pointer_mode, transa, transb, transc, bias_type;
  uint32_t epilogue;
  const void *bias;
} fk_desc;

typedef struct fk_layout {
  uint32_t magic;
  int32_t type, order, batch;
  uint64_t rows, cols;
  int64_t ld, stride;
} fk_layout;

typedef struct fk_pref {
  uint32_t magic;
  uint64_t workspace;
  uint32_t align[4]; /* A, B, C, D */
} fk_pref;

FK_EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = calloc(1, sizeof **handle);
  return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

FK_EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  free(handle);
  return CUBLAS_STATUS_SUCCESS;
}

FK_EXPORT size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

/* ---- descriptors -------------------------------------------------------------------------- */
FK_EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc,
                                                  cublasComputeType_t compute,
                                                  cudaDataType_t scale) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  fk_desc *d = calloc(1, sizeof *d);
  if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
  *d = (fk_desc){.magic = FK_DESC,
                 .compute = (int32_t)compute,
                 .scale = (int32_t)scale,
                 .pointer_mode = CUBLASLT_POINTER_MODE_HOST,
                 .transa = CUBLAS_OP_N,
                 .transb = CUBLAS_OP_N,
                 .transc = CUBLAS_OP_N,
                 .bias_type = -1,
                 .epilogue = CUBLASLT_EPILOGUE_DEFAULT};
  *desc = (cublasLtMatmulDesc_t)(void *)d;
  return CUBLAS_STATUS_SUCCESS;
}

static fk_desc *desc_of(cublasLtMatmulDesc_t d) {
  fk_desc *x = (fk_desc *)(void *)d;
  return x && x->magic == FK_DESC ? x : NULL;
}

FK_EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  fk_desc *d = desc_of(desc);
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  d->magic = 0;
  free(d);
  return CUBLAS_STATUS_SUCCESS;
}

/* Copies an attribute of want bytes from buf into dst; INVALID_VALUE on a size
 * mismatch, as cuBLASLt. */
static cublasStatus_t set_attr(void *dst, size_t want, const void *buf, size_t n) {
  if (!buf || n != want) return CUBLAS_STATUS_INVALID_VALUE;
  memcpy(dst, buf, n);
  return CUBLAS_STATUS_SUCCESS;
}

FK_EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                        cublasLtMatmulDescAttributes_t attr,
                                                        const void *buf, size_t n) {
  fk_desc *d = desc_of(desc);
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set_attr(&d->compute, 4, buf, n);
  case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set_attr(&d->scale, 4, buf, n);
  case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set_attr(&d->pointer_mode, 4, buf, n);
  case CUBLASLT_MATMUL_DESC_TRANSA: return set_attr(&d->transa, 4, buf, n);
  case CUBLASLT_MATMUL_DESC_TRANSB: return set_attr(&d->transb, 4, buf, n);
  case CUBLASLT_MATMUL_DESC_TRANSC: return set_attr(&d->transc, 4, buf, n);
  case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attr(&d->epilogue, 4, buf, n);
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attr(&d->bias, sizeof(void *), buf, n);
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_attr(&d->bias_type, 4, buf, n);
  default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

FK_EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout,
                                                    cudaDataType type, uint64_t rows, uint64_t cols,
                                                    int64_t ld) {
  if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
  fk_layout *l = calloc(1, sizeof *l);
  if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
  *l = (fk_layout){.magic = FK_LAYOUT,
                   .type = (int32_t)type,
                   .order = CUBLASLT_ORDER_COL,
                   .batch = 1,
                   .rows = rows,
                   .cols = cols,
                   .ld = ld};
  *layout = (cublasLtMatrixLayout_t)(void *)l;
  return CUBLAS_STATUS_SUCCESS;
}

static fk_layout *layout_of(cublasLtMatrixLayout_t l) {
  fk_layout *x = (fk_layout *)(void *)l;
  return x && x->magic == FK_LAYOUT ? x : NULL;
}

FK_EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  fk_layout *l = layout_of(layout);
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  l->magic = 0;
  free(l);
  return CUBLAS_STATUS_SUCCESS;
}

FK_EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                          cublasLtMatrixLayoutAttribute_t attr,
                                                          const void *buf, size_t n) {
  fk_layout *l = layout_of(layout);
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
  case CUBLASLT_MATRIX_LAYOUT_TYPE: return set_attr(&l->type, 4, buf, n);
  case CUBLASLT_MATRIX_LAYOUT_ORDER: return set_attr(&l->order, 4, buf, n);
  case CUBLASLT_MATRIX_LAYOUT_ROWS: return set_attr(&l->rows, 8, buf, n);
  case CUBLASLT_MATRIX_LAYOUT_COLS: return set_attr(&l->cols, 8, buf, n);
  case CUBLASLT_MATRIX_LAYOUT_LD: return set_attr(&l->ld, 8, buf, n);
  case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return set_attr(&l->batch, 4, buf, n);
  case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return set_attr(&l->stride, 8, buf, n);
  default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

FK_EXPORT cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  fk_pref *p = calloc(1, sizeof *p);
  if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
  *p = (fk_pref){.magic = FK_PREF, .align = {256, 256, 256, 256}};
  *pref = (cublasLtMatmulPreference_t)(void *)p;
  return CUBLAS_STATUS_SUCCESS;
}

static fk_pref *pref_of(cublasLtMatmulPreference_t p) {
  fk_pref *x = (fk_pref *)(void *)p;
  return x && x->magic == FK_PREF ? x : NULL;
}

FK_EXPORT cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  fk_pref *p = pref_of(pref);
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  p->magic = 0;
  free(p);
  return CUBLAS_STATUS_SUCCESS;
}

FK_EXPORT cublasStatus_t cublasLtMatmulPreferenceSetAttribute(
    cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
    size_t n) {
  fk_pref *p = pref_of(pref);
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set_attr(&p->workspace, 8, buf, n);
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_attr(&p->align[0], 4, buf, n);
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_attr(&p->align[1], 4, buf, n);
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_attr(&p->align[2], 4, buf, n);
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_attr(&p->align[3], 4, buf, n);
  default: return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}

/* ---- a problem ---------------------------------------------------------------------------- */
/* What op, A, B, C, D describe, validated. */
typedef struct problem {
  const fk_desc *d;
  const fk_layout *l[4]; /* A, B, C, D */
  int64_t m, n, k, batch;
  int input; /* rounding of A and B before the product: 0 none, 'T' TF32, 'h' f16, 'b' bf16 */
  int bias_type;
} problem;

/* Bytes of an element of type t (0 for a type the fake does not multiply). */
static size_t type_size(int32_t t) {
  switch (t) {
  case CUDA_R_32F: return 4;
  case CUDA_R_64F: return 8;
  case CUDA_R_16F:
  case CUDA_R_16BF: return 2;
  default: return 0;
  }
}

/* Validates the operation; SUCCESS, INVALID_VALUE (inconsistent) or NOT_SUPPORTED (a
 * case the fake, like a cuBLASLt without such kernels, does not run). */
static cublasStatus_t problem_make(cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                   cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                   cublasLtMatrixLayout_t dd, problem *p) {
  p->d = desc_of(op);
  p->l[0] = layout_of(a), p->l[1] = layout_of(b), p->l[2] = layout_of(c), p->l[3] = layout_of(dd);
  if (!p->d || !p->l[0] || !p->l[1] || !p->l[2] || !p->l[3]) return CUBLAS_STATUS_INVALID_VALUE;
  const fk_desc *d = p->d;
  bool ta = d->transa != CUBLAS_OP_N, tb = d->transb != CUBLAS_OP_N;
  if (d->transa < CUBLAS_OP_N || d->transa > CUBLAS_OP_C || d->transb < CUBLAS_OP_N ||
      d->transb > CUBLAS_OP_C || d->transc != CUBLAS_OP_N)
    return CUBLAS_STATUS_INVALID_VALUE;
  p->m = (int64_t)(ta ? p->l[0]->cols : p->l[0]->rows);
  p->k = (int64_t)(ta ? p->l[0]->rows : p->l[0]->cols);
  p->n = (int64_t)(tb ? p->l[1]->rows : p->l[1]->cols);
  int64_t kb = (int64_t)(tb ? p->l[1]->cols : p->l[1]->rows);
  p->batch = p->l[3]->batch;
  for (int i = 0; i < 4; i++) {
    const fk_layout *l = p->l[i];
    if (l->order != CUBLASLT_ORDER_COL) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (l->ld < (int64_t)(l->rows ? l->rows : 1) || l->batch != p->batch || l->batch < 1)
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  for (int i = 2; i < 4; i++)
    if ((int64_t)p->l[i]->rows != p->m || (int64_t)p->l[i]->cols != p->n)
      return CUBLAS_STATUS_INVALID_VALUE;
  if (kb != p->k || p->l[2]->type != p->l[3]->type) return CUBLAS_STATUS_INVALID_VALUE;
  int32_t tab = p->l[0]->type, tcd = p->l[2]->type;
  if (p->l[1]->type != tab) return CUBLAS_STATUS_NOT_SUPPORTED;
  p->input = 0;
  if (d->compute == CUBLAS_COMPUTE_64F) {
    if (tab != CUDA_R_64F || tcd != CUDA_R_64F || d->scale != CUDA_R_64F)
      return CUBLAS_STATUS_NOT_SUPPORTED;
  } else {
    bool ab = tab == CUDA_R_32F || tab == CUDA_R_16F || tab == CUDA_R_16BF;
    if (!ab || (tcd != tab && tcd != CUDA_R_32F) || d->scale != CUDA_R_32F)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->compute == CUBLAS_COMPUTE_32F_FAST_TF32)
      p->input = 'T';
    else if (d->compute == CUBLAS_COMPUTE_32F_FAST_16F)
      p->input = 'h';
    else if (d->compute == CUBLAS_COMPUTE_32F_FAST_16BF)
      p->input = 'b';
    else if (d->compute != CUBLAS_COMPUTE_32F)
      return CUBLAS_STATUS_NOT_SUPPORTED;
    if (tab != CUDA_R_32F) p->input = 0; /* 16-bit inputs are already that narrow */
  }
  uint32_t e = d->epilogue;
  if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS &&
      e != CUBLASLT_EPILOGUE_RELU && e != CUBLASLT_EPILOGUE_RELU_BIAS)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  p->bias_type = d->bias_type == -1 ? tcd : d->bias_type;
  if ((e & CUBLASLT_EPILOGUE_BIAS) && p->bias_type != tcd) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST &&
      d->pointer_mode != CUBLASLT_POINTER_MODE_DEVICE)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- the heuristic ------------------------------------------------------------------------ */
FK_EXPORT cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
    cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int *count) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  const fk_pref *pr = pref_of(pref);
  if (!pr || requested <= 0 || !results || !count) return CUBLAS_STATUS_INVALID_VALUE;
  problem p;
  cublasStatus_t s = problem_make(op, a, b, c, d, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  *count = 0;
  for (int i = 0; i < 4; i++) {
    uint32_t al = pr->align[i];
    if (al < type_size(p.l[i]->type) || (al & (al - 1))) return CUBLAS_STATUS_SUCCESS;
  }
  memset(&results[0], 0, sizeof results[0]);
  results[0].algo.data[0] = FK_ALGO;
  for (int i = 0; i < 4; i++)
    results[0].algo.data[1 + i] = pr->align[i];
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- the product -------------------------------------------------------------------------- */
/* f16 / bf16 bits to float and float to their bits (to nearest even; NaN stays NaN). */
static float f16_to_f32(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = h >> 10 & 0x1fu, m = h & 0x3ffu;
  float f = e == 0    ? ldexpf((float)m, -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : ldexpf((float)(m | 0x400u), (int)e - 25);
  return s ? -f : f;
}

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t s = x >> 16 & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);
  if (a >= 0x38800000u) {
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + (r >> 13 & 1u);
    return (uint16_t)(s | r >> 13);
  }
  if (a < 0x33000000u) return (uint16_t)s;
  uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, sh = 126u - e;
  uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return (uint16_t)(s | q);
}

static float bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(x >> 16 | 0x40u);
  x += 0x7fffu + (x >> 16 & 1u);
  return (uint16_t)(x >> 16);
}

/* f rounded to TF32 (10 mantissa bits; to nearest, ties away from zero). */
static float round_tf32(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7f800000u) == 0x7f800000u) return f;
  x = (x + 0x1000u) & 0xffffe000u;
  memcpy(&f, &x, 4);
  return f;
}

/* Element i of an array of type t, as double. */
static double load(const void *p, int32_t t, int64_t i) {
  switch (t) {
  case CUDA_R_64F: return ((const double *)p)[i];
  case CUDA_R_32F: return ((const float *)p)[i];
  case CUDA_R_16F: return f16_to_f32(((const uint16_t *)p)[i]);
  default: return bf16_to_f32(((const uint16_t *)p)[i]);
  }
}

/* Stores v as element i of type t (rounded once, to nearest even). */
static void store(void *p, int32_t t, int64_t i, double v) {
  switch (t) {
  case CUDA_R_64F: ((double *)p)[i] = v; break;
  case CUDA_R_32F: ((float *)p)[i] = (float)v; break;
  case CUDA_R_16F: ((uint16_t *)p)[i] = f32_to_f16((float)v); break;
  default: ((uint16_t *)p)[i] = f32_to_bf16((float)v); break;
  }
}

/* An input value after the compute type's rounding. */
static double narrow(double v, int input) {
  if (input == 'T') return round_tf32((float)v);
  if (input == 'h') return f16_to_f32(f32_to_f16((float)v));
  if (input == 'b') return bf16_to_f32(f32_to_bf16((float)v));
  return v;
}

/* Bytes from an operand's base to the end of its last element. */
static size_t extent(const fk_layout *l) {
  if (!l->rows || !l->cols) return 0;
  int64_t last = (int64_t)(l->cols - 1) * l->ld + (int64_t)l->rows - 1;
  if (l->batch > 1 && l->stride > 0) last += (int64_t)(l->batch - 1) * l->stride;
  return (size_t)(last + 1) * type_size(l->type);
}

/* Whether p and the operand's leading dimension and batch stride keep align bytes. */
static bool aligned(const void *p, const fk_layout *l, uint64_t align) {
  uint64_t es = type_size(l->type), bits = (uint64_t)(uintptr_t)p;
  if (l->cols > 1) bits |= (uint64_t)l->ld * es;
  if (l->batch > 1) bits |= (uint64_t)l->stride * es;
  return (bits & (align - 1)) == 0;
}

/* One batch item's product in progress: op(A)'s rows ra, op(B)'s columns rb (doubles),
 * and what completes each element of D. */
typedef struct gemm_job {
  const problem *p;
  const double *ra, *rb;
  const void *C;
  void *D;
  double al, be;
  bool use_c, bias, relu;
  int64_t bi;
} gemm_job;

/* Column j of D in batch item job->bi: sums, alpha, beta C, bias, relu, the store. */
static void gemm_column(void *arg, unsigned long long j) {
  const gemm_job *g = arg;
  const problem *p = g->p;
  const fk_layout *lc = p->l[2], *ld = p->l[3];
  int64_t k = p->k;
  for (int64_t i = 0; i < p->m; i++) {
    double acc = 0;
    const double *x = g->ra + i * k, *y = g->rb + (int64_t)j * k;
    for (int64_t q = 0; q < k; q++)
      acc += x[q] * y[q];
    double v = g->al * acc;
    if (g->use_c) v += g->be * load(g->C, lc->type, g->bi * lc->stride + (int64_t)j * lc->ld + i);
    if (g->bias) v += load(p->d->bias, p->bias_type, i);
    if (g->relu) v = v > 0 ? v : 0;
    store(g->D, ld->type, g->bi * ld->stride + (int64_t)j * ld->ld + i, v);
  }
}

FK_EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                        const void *alpha, const void *A,
                                        cublasLtMatrixLayout_t adesc, const void *B,
                                        cublasLtMatrixLayout_t bdesc, const void *beta,
                                        const void *C, cublasLtMatrixLayout_t cdesc, void *D,
                                        cublasLtMatrixLayout_t ddesc,
                                        const cublasLtMatmulAlgo_t *algo, void *workspace,
                                        size_t workspace_bytes, cudaStream_t stream) {
  (void)workspace;
  (void)workspace_bytes;
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (fk_need_ctx() != CUDA_SUCCESS || !fk_stream_ok((CUstream)stream))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  problem p;
  cublasStatus_t s = problem_make(op, adesc, bdesc, cdesc, ddesc, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (!alpha || !beta || !D || (algo && algo->data[0] != FK_ALGO))
    return CUBLAS_STATUS_INVALID_VALUE;
  const void *ops[4] = {A, B, C, D};
  for (int i = 0; i < 4 && algo; i++)
    if (!aligned(ops[i], p.l[i], algo->data[1 + i])) return CUBLAS_STATUS_INVALID_VALUE;
  bool dbl = p.d->scale == CUDA_R_64F;
  double al = dbl ? *(const double *)alpha : *(const float *)alpha;
  double be = dbl ? *(const double *)beta : *(const float *)beta;
  bool use_c = be != 0, has_bias = p.d->epilogue & CUBLASLT_EPILOGUE_BIAS;
  bool relu = p.d->epilogue & CUBLASLT_EPILOGUE_RELU;
  if ((use_c && !C) || (has_bias && !p.d->bias) || (p.k > 0 && (!A || !B)))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!fk_device_range(D, extent(p.l[3])) || (use_c && !fk_device_range(C, extent(p.l[2]))) ||
      (p.k > 0 && (!fk_device_range(A, extent(p.l[0])) || !fk_device_range(B, extent(p.l[1])))) ||
      (has_bias && !fk_device_range(p.d->bias, (size_t)p.m * type_size(p.bias_type))))
    return CUBLAS_STATUS_EXECUTION_FAILED;
  int64_t m = p.m, n = p.n, k = p.k;
  double *ra = malloc(((size_t)(m * k) + 1) * sizeof *ra), *rb = malloc(((size_t)(n * k) + 1) * 8);
  if (!ra || !rb) {
    free(ra);
    free(rb);
    return CUBLAS_STATUS_ALLOC_FAILED;
  }
  const fk_layout *la = p.l[0], *lb = p.l[1];
  bool ta = p.d->transa != CUBLAS_OP_N, tb = p.d->transb != CUBLAS_OP_N;
  gemm_job job = {.p = &p,
                  .ra = ra,
                  .rb = rb,
                  .C = C,
                  .D = D,
                  .al = al,
                  .be = be,
                  .use_c = use_c,
                  .bias = has_bias,
                  .relu = relu};
  for (int64_t bi = 0; bi < p.batch; bi++) {
    /* ra[i][q] = op(A)(i, q), rb[j][q] = op(B)(q, j): rows of the product's dot products */
    for (int64_t i = 0; i < m; i++)
      for (int64_t q = 0; q < k; q++)
        ra[i * k + q] = narrow(
            load(A, la->type, bi * la->stride + (ta ? i * la->ld + q : q * la->ld + i)), p.input);
    for (int64_t j = 0; j < n; j++)
      for (int64_t q = 0; q < k; q++)
        rb[j * k + q] = narrow(
            load(B, lb->type, bi * lb->stride + (tb ? q * lb->ld + j : j * lb->ld + q)), p.input);
    job.bi = bi;
    if (m * n * k > ((int64_t)1 << 18)) {
      fk_parallel_for((unsigned long long)n, gemm_column, &job);
    } else {
      for (int64_t j = 0; j < n; j++)
        gemm_column(&job, (unsigned long long)j);
    }
  }
  free(ra);
  free(rb);
  return CUBLAS_STATUS_SUCCESS;
}
