/* src/backends/cpu/k_gemm_small.c — small f32 products C = act(A @ B + bias)
 * on the calling thread (k_gemm_small.h). Measured against oneDNN's sgemm on
 * the README MLP's products (2^13 to 2^19 multiply-adds): as fast from 2^19
 * down (both near the FMA peak), faster for the tiniest (K = 1, N = 1: sgemm's
 * per-call setup dominates there), and the bias and activation come free in
 * the tile instead of separate elementwise passes (k_gemm_epi.c's groups).
 *
 * The kernel keeps an MR x 2W tile of C in registers (W: the vector width;
 * MR = 12 rows with AVX-512, 6 with AVX2 and portable), broadcasts A's
 * elements (any strides) and loads B's rows as vectors: B goes in place when
 * its rows are unit-stride and n is a multiple of W, else it is packed once
 * (zero-padded to a multiple of W). Bias and relu are applied to the tile in
 * registers; other activations run over each finished block of rows (still in
 * L1) with vmath.h's functions, so they give the bits of the unfused
 * activation kernels. Two shapes get their own loop: n == 1 with a row-major A
 * (dot products, four rows at a time) and n == 1 with a column-major A (the
 * transposed product, a 1 x m row, whose B is then A^T in place).
 *
 * One variant per ISA (NBI_FOR_ISAS); the AVX2 one needs FMA too and falls
 * back to the portable one without it. */
#include "k_gemm_small.h"

#include <string.h>

#include "k_linalg.h"
#include "vmath.h"

#if NBI_HAVE_ISA_VARIANTS
#include <immintrin.h>
#endif

/* Full unrolling of the tile's row and vector loops (their bounds are
 * constants), which keeps the accumulators in registers. */
#if defined(__clang__)
#define GS_UNROLL _Pragma("clang loop unroll(full)")
#else
#define GS_UNROLL _Pragma("GCC unroll 16")
#endif

enum {
  GS_MR_MAX = 12,  /* rows of the largest register tile */
  GS_STACK = 4096, /* floats of packed operands kept on the stack */
  GS_MAX_W = 16    /* the widest vector, in floats */
};

bool nbi_gemm_small_fits(int64_t m, int64_t n, int64_t k) {
  return (double)m * (double)n * (double)(k > 1 ? k : 1) < NBI_GEMM_SMALL_MACS;
}

/* ---- per-ISA vector operations ----------------------------------------------------- */
/* V: the vector type; W: its floats; GS_LD / GS_ST unaligned load / store,
 * GS_BC broadcast, GS_Z zero, GS_FMA(a, b, c) = a * b + c, GS_ADD. */
typedef float gs_v4 __attribute__((vector_size(16)));
static inline gs_v4 gs_ld_portable(const float *p) {
  gs_v4 v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline void gs_st_portable(float *p, gs_v4 v) { memcpy(p, &v, sizeof v); }
#define GS_V_portable gs_v4
#define GS_W_portable 4
#define GS_MR_portable 6
#define GS_LD_portable(p) gs_ld_portable(p)
#define GS_ST_portable(p, v) gs_st_portable(p, v)
#define GS_BC_portable(x) ((gs_v4){0, 0, 0, 0} + (x))
#define GS_Z_portable ((gs_v4){0, 0, 0, 0})
#define GS_FMA_portable(a, b, c) ((a) * (b) + (c))
#define GS_ADD_portable(a, b) ((a) + (b))
#define GS_ATTR_portable
static inline gs_v4 gs_relu_portable(gs_v4 v) {
  for (int l = 0; l < 4; l++)
    v[l] = v[l] < 0 ? 0.0f : v[l];
  return v;
}
#define GS_RELU_portable(v) gs_relu_portable(v)
static inline void gs_hsum4_portable(gs_v4 a, gs_v4 b, gs_v4 c, gs_v4 d, float *o) {
  o[0] = (a[0] + a[1]) + (a[2] + a[3]);
  o[1] = (b[0] + b[1]) + (b[2] + b[3]);
  o[2] = (c[0] + c[1]) + (c[2] + c[3]);
  o[3] = (d[0] + d[1]) + (d[2] + d[3]);
}
#define GS_HSUM4_portable gs_hsum4_portable

#if NBI_HAVE_ISA_VARIANTS
#define GS_V_avx2 __m256
#define GS_W_avx2 8
#define GS_MR_avx2 6
#define GS_LD_avx2(p) _mm256_loadu_ps(p)
#define GS_ST_avx2(p, v) _mm256_storeu_ps(p, v)
#define GS_BC_avx2(x) _mm256_set1_ps(x)
#define GS_Z_avx2 _mm256_setzero_ps()
#define GS_FMA_avx2(a, b, c) _mm256_fmadd_ps(a, b, c)
#define GS_ADD_avx2(a, b) _mm256_add_ps(a, b)
#define GS_ATTR_avx2 __attribute__((target("avx2,fma")))
#define GS_RELU_avx2(v) _mm256_max_ps(_mm256_setzero_ps(), v) /* NaN: v */
#define GS_HSUM4_avx2 gs_hsum4_avx2
/* o[0..3]: the sums of a, b, c, d's lanes (halves added, then horizontal adds). */
GS_ATTR_avx2 static inline __attribute__((always_inline)) void
gs_hsum4_avx2(__m256 a, __m256 b, __m256 c, __m256 d, float *o) {
  __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 b4 = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  __m128 c4 = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
  __m128 d4 = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
  _mm_storeu_ps(o, _mm_hadd_ps(_mm_hadd_ps(a4, b4), _mm_hadd_ps(c4, d4)));
}

#define GS_V_avx512 __m512
#define GS_W_avx512 16
#define GS_MR_avx512 12
#define GS_LD_avx512(p) _mm512_loadu_ps(p)
#define GS_ST_avx512(p, v) _mm512_storeu_ps(p, v)
#define GS_BC_avx512(x) _mm512_set1_ps(x)
#define GS_Z_avx512 _mm512_setzero_ps()
#define GS_FMA_avx512(a, b, c) _mm512_fmadd_ps(a, b, c)
#define GS_ADD_avx512(a, b) _mm512_add_ps(a, b)
#define GS_ATTR_avx512 NBI_ISA_ATTR_avx512
#define GS_RELU_avx512(v) _mm512_max_ps(_mm512_setzero_ps(), v) /* NaN: v */
#define GS_HSUM4_avx512 gs_hsum4_avx512
GS_ATTR_avx512 static inline __attribute__((always_inline)) __m256 gs_half_avx512(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}
GS_ATTR_avx512 static inline __attribute__((always_inline)) void
gs_hsum4_avx512(__m512 a, __m512 b, __m512 c, __m512 d, float *o) {
  __m256 h[4] = {gs_half_avx512(a), gs_half_avx512(b), gs_half_avx512(c), gs_half_avx512(d)};
  __m128 q[4];
  for (int i = 0; i < 4; i++)
    q[i] = _mm_add_ps(_mm256_castps256_ps128(h[i]), _mm256_extractf128_ps(h[i], 1));
  _mm_storeu_ps(o, _mm_hadd_ps(_mm_hadd_ps(q[0], q[1]), _mm_hadd_ps(q[2], q[3])));
}
#endif

/* What the per-ISA drivers run: C = act(A @ B + bias) with B's rows unit-stride
 * and readable to a multiple of W floats (ldb apart), bias_c (NULL: none)
 * readable likewise, bias_r (NULL: none) one value per row (s_r apart). */
typedef struct gs_job {
  int64_t m, n, k;
  const float *a;
  int64_t sa_r, sa_c;
  const float *b;
  int64_t ldb;
  const float *bias_c, *bias_r;
  int64_t s_r;
  nbi_epi_act act;
  float *c;
  int64_t ldc;
} gs_job;

/* The dot-product form (n == 1, A row-major): c[i] = act(sum_p a[i, p] b[p] + bias). */
typedef struct gs_dot {
  int64_t m, k;
  const float *a;
  int64_t sa_r;
  const float *b; /* k contiguous */
  float bias;
  nbi_epi_act act;
  float *c;
  int64_t ldc;
} gs_dot;

#define GS_ACT_CASE(S, A, EXPR)                                                                    \
  case A:                                                                                          \
    for (int64_t i = 0; i < n; i++) {                                                              \
      float x = xs[i];                                                                             \
      ys[i] = EXPR;                                                                                \
    }                                                                                              \
    break;

/* The register tile: rows i of a, columns b's first nv vectors, into c (cols
 * valid columns). mr and nv are constants at each (inlined) call. */
#define GS_DEFINE(S, ISA)                                                                          \
  GS_ATTR_##S static void act_##S(nbi_epi_act act, const float *restrict xs, float *restrict ys,   \
                                  int64_t n) {                                                     \
    switch (act) {                                                                                 \
      GS_ACT_CASE(S, NBI_EPI_RELU, x < 0 ? 0.0f : x)                                               \
      GS_ACT_CASE(S, NBI_EPI_GELU, vm_geluf(x))                                                    \
      GS_ACT_CASE(S, NBI_EPI_TANH, vm_tanhf(x))                                                    \
      GS_ACT_CASE(S, NBI_EPI_SIGMOID, vm_sigmoidf(x))                                              \
      GS_ACT_CASE(S, NBI_EPI_SILU, vm_siluf(x))                                                    \
    case NBI_EPI_NONE: memcpy(ys, xs, sizeof *ys *(size_t)n); break;                               \
    }                                                                                              \
  }                                                                                                \
                                                                                                   \
  /* x[i] = act(x[i]), through a buffer (act_ needs distinct arrays to vectorize). */              \
  GS_ATTR_##S static void act_row_##S(nbi_epi_act act, float *x, int64_t n) {                      \
    float t[256];                                                                                  \
    for (int64_t i = 0; i < n; i += 256) {                                                         \
      int64_t len = n - i < 256 ? n - i : 256;                                                     \
      memcpy(t, x + i, sizeof *t * (size_t)len);                                                   \
      act_##S(act, t, x + i, len);                                                                 \
    }                                                                                              \
  }                                                                                                \
                                                                                                   \
  GS_ATTR_##S static inline __attribute__((always_inline)) void tile_##S(                          \
      const gs_job *g, int64_t i, int64_t j, const int mr, const int nv, int64_t cols) {           \
    /* locals: vector stores may alias anything, *g included */                                    \
    const int64_t k = g->k, ldb = g->ldb, sa_r = g->sa_r, sa_c = g->sa_c, ldc = g->ldc;            \
    const float *a = g->a + i * sa_r, *b = g->b + j, *bias_c = g->bias_c, *bias_r = g->bias_r;     \
    const int64_t s_r = g->s_r;                                                                    \
    const bool relu = g->act == NBI_EPI_RELU;                                                      \
    float *c = g->c + i * ldc + j;                                                                 \
    GS_V_##S acc[GS_MR_MAX][2];                                                                    \
    GS_UNROLL for (int r = 0; r < mr; r++) GS_UNROLL for (int v = 0; v < nv; v++) acc[r][v] =      \
        GS_Z_##S;                                                                                  \
    for (int64_t p = 0; p < k; p++) {                                                              \
      GS_V_##S b0 = GS_LD_##S(b + p * ldb), b1 = b0;                                               \
      if (nv > 1) b1 = GS_LD_##S(b + p * ldb + GS_W_##S);                                          \
      const float *ap = a + p * sa_c;                                                              \
      GS_UNROLL for (int r = 0; r < mr; r++) {                                                     \
        GS_V_##S av = GS_BC_##S(ap[r * sa_r]);                                                     \
        acc[r][0] = GS_FMA_##S(av, b0, acc[r][0]);                                                 \
        if (nv > 1) acc[r][1] = GS_FMA_##S(av, b1, acc[r][1]);                                     \
      }                                                                                            \
    }                                                                                              \
    /* each condition once per tile, not per vector (taken branches cost) */                       \
    if (bias_c) {                                                                                  \
      GS_V_##S b0 = GS_LD_##S(bias_c + j), b1 = b0;                                                \
      if (nv > 1) b1 = GS_LD_##S(bias_c + j + GS_W_##S);                                           \
      GS_UNROLL for (int r = 0; r < mr; r++) {                                                     \
        acc[r][0] = GS_ADD_##S(acc[r][0], b0);                                                     \
        if (nv > 1) acc[r][1] = GS_ADD_##S(acc[r][1], b1);                                         \
      }                                                                                            \
    }                                                                                              \
    if (bias_r) {                                                                                  \
      GS_UNROLL for (int r = 0; r < mr; r++) GS_UNROLL for (int v = 0; v < nv; v++) acc[r][v] =    \
          GS_ADD_##S(acc[r][v], GS_BC_##S(bias_r[(i + r) * s_r]));                                 \
    }                                                                                              \
    if (relu) {                                                                                    \
      GS_UNROLL for (int r = 0; r < mr; r++) GS_UNROLL for (int v = 0; v < nv; v++) acc[r][v] =    \
          GS_RELU_##S(acc[r][v]);                                                                  \
    }                                                                                              \
    if (cols == nv * GS_W_##S) {                                                                   \
      GS_UNROLL for (int r = 0; r < mr; r++) GS_UNROLL for (int v = 0; v < nv; v++)                \
          GS_ST_##S(c + r * ldc + v * GS_W_##S, acc[r][v]);                                        \
    } else {                                                                                       \
      GS_UNROLL for (int r = 0; r < mr; r++) GS_UNROLL for (int v = 0; v < nv; v++) {              \
        float t[GS_W_##S];                                                                         \
        GS_ST_##S(t, acc[r][v]);                                                                   \
        int64_t w = cols - v * GS_W_##S;                                                           \
        memcpy(c + r * ldc + v * GS_W_##S, t, sizeof *t * (size_t)(w < GS_W_##S ? w : GS_W_##S));  \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  /* One block of mr rows over all column tiles, then an activation other                          \
   * than relu over its rows (in L1). */                                                           \
  GS_ATTR_##S static inline                                                                        \
      __attribute__((always_inline)) void rows_##S(const gs_job *g, int64_t i, const int mr) {     \
    int64_t j = 0, n = g->n;                                                                       \
    for (; j + 2 * GS_W_##S <= n; j += 2 * GS_W_##S)                                               \
      tile_##S(g, i, j, mr, 2, 2 * GS_W_##S);                                                      \
    if (n - j > GS_W_##S)                                                                          \
      tile_##S(g, i, j, mr, 2, n - j);                                                             \
    else if (n > j)                                                                                \
      tile_##S(g, i, j, mr, 1, n - j);                                                             \
    if (g->act != NBI_EPI_NONE && g->act != NBI_EPI_RELU)                                          \
      for (int r = 0; r < mr; r++)                                                                 \
        act_row_##S(g->act, g->c + (i + r) * g->ldc, n);                                           \
  }                                                                                                \
  GS_ATTR_##S static void run_##S(const gs_job *g) {                                               \
    int64_t i = 0;                                                                                 \
    for (; i + GS_MR_##S <= g->m; i += GS_MR_##S)                                                  \
      rows_##S(g, i, GS_MR_##S);                                                                   \
    switch (g->m - i) { /* the last rows: a tile of each height, fully unrolled */                 \
    case 11: rows_##S(g, i, 11 < GS_MR_##S ? 11 : 1); break;                                       \
    case 10: rows_##S(g, i, 10 < GS_MR_##S ? 10 : 1); break;                                       \
    case 9: rows_##S(g, i, 9 < GS_MR_##S ? 9 : 1); break;                                          \
    case 8: rows_##S(g, i, 8 < GS_MR_##S ? 8 : 1); break;                                          \
    case 7: rows_##S(g, i, 7 < GS_MR_##S ? 7 : 1); break;                                          \
    case 6: rows_##S(g, i, 6 < GS_MR_##S ? 6 : 1); break;                                          \
    case 5: rows_##S(g, i, 5); break;                                                              \
    case 4: rows_##S(g, i, 4); break;                                                              \
    case 3: rows_##S(g, i, 3); break;                                                              \
    case 2: rows_##S(g, i, 2); break;                                                              \
    case 1: rows_##S(g, i, 1); break;                                                              \
    default: break;                                                                                \
    }                                                                                              \
  }                                                                                                \
                                                                                                   \
  /* Four rows at a time (one load of b for four FMAs), reduced together. */                       \
  GS_ATTR_##S static void dot_##S(const gs_dot *d) {                                               \
    const int64_t w = GS_W_##S, k = d->k, m = d->m, sa_r = d->sa_r, ldc = d->ldc;                  \
    const float *b = d->b, *a0 = d->a;                                                             \
    const float bias = d->bias;                                                                    \
    float *c = d->c;                                                                               \
    float sum[64], out[64];                                                                        \
    for (int64_t i0 = 0; i0 < m; i0 += 64) {                                                       \
      int64_t rows = m - i0 < 64 ? m - i0 : 64, r = 0;                                             \
      for (; r + 4 <= rows; r += 4) {                                                              \
        const float *a = a0 + (i0 + r) * sa_r;                                                     \
        GS_V_##S s0 = GS_Z_##S, s1 = GS_Z_##S, s2 = GS_Z_##S, s3 = GS_Z_##S;                       \
        int64_t p = 0;                                                                             \
        for (; p + w <= k; p += w) {                                                               \
          GS_V_##S bv = GS_LD_##S(b + p);                                                          \
          s0 = GS_FMA_##S(GS_LD_##S(a + p), bv, s0);                                               \
          s1 = GS_FMA_##S(GS_LD_##S(a + sa_r + p), bv, s1);                                        \
          s2 = GS_FMA_##S(GS_LD_##S(a + 2 * sa_r + p), bv, s2);                                    \
          s3 = GS_FMA_##S(GS_LD_##S(a + 3 * sa_r + p), bv, s3);                                    \
        }                                                                                          \
        GS_HSUM4_##S(s0, s1, s2, s3, sum + r);                                                     \
        if (p < k) /* the last k % w terms */                                                      \
          for (int q = 0; q < 4; q++)                                                              \
            for (int64_t pp = p; pp < k; pp++)                                                     \
              sum[r + q] += a[q * sa_r + pp] * b[pp];                                              \
      }                                                                                            \
      for (; r < rows; r++) {                                                                      \
        const float *a = a0 + (i0 + r) * sa_r;                                                     \
        GS_V_##S s0 = GS_Z_##S;                                                                    \
        int64_t p = 0;                                                                             \
        for (; p + w <= k; p += w)                                                                 \
          s0 = GS_FMA_##S(GS_LD_##S(a + p), GS_LD_##S(b + p), s0);                                 \
        float t[4];                                                                                \
        GS_HSUM4_##S(s0, s0, s0, s0, t);                                                           \
        for (; p < k; p++)                                                                         \
          t[0] += a[p] * b[p];                                                                     \
        sum[r] = t[0];                                                                             \
      }                                                                                            \
      for (r = 0; r < rows; r++)                                                                   \
        sum[r] += bias;                                                                            \
      act_##S(d->act, sum, out, rows);                                                             \
      for (r = 0; r < rows; r++)                                                                   \
        c[(i0 + r) * ldc] = out[r];                                                                \
    }                                                                                              \
  }

NBI_FOR_ISAS(GS_DEFINE)

typedef struct gs_fns {
  void (*run)(const gs_job *);
  void (*dot)(const gs_dot *);
  void (*act)(nbi_epi_act, const float *, float *, int64_t);
  int64_t w;
} gs_fns;

#define GS_FNS(S, ISA) [ISA] = {run_##S, dot_##S, act_##S, GS_W_##S},
static const gs_fns fns_by_isa[NBI_ISA_COUNT] = {NBI_FOR_ISAS(GS_FNS)};

/* The active ISA's kernels (AVX2 without FMA: the portable ones). */
static const gs_fns *gs_active(void) {
  nbi_isa isa = nbi_isa_active();
#if NBI_HAVE_ISA_VARIANTS
  if (isa == NBI_ISA_AVX2 && !__builtin_cpu_supports("fma")) isa = NBI_ISA_PORTABLE;
#endif
  return &fns_by_isa[isa];
}

void nbi_epi_act_apply(nbi_epi_act act, const float *x, float *y, int64_t n) {
  gs_active()->act(act, x, y, n);
}

/* ---- driver -------------------------------------------------------------------------- */
/* Scratch of n floats: the stack buffer when it is large enough, else from the
 * buffer cache (*owned, freed by the caller). */
static float *gs_buf(float *stack, int64_t cap, int64_t n, void **owned) {
  *owned = NULL;
  if (n <= cap) return stack;
  *owned = nbi_cpu_scratch("nb_matmul", sizeof(float) * (size_t)n);
  return *owned;
}

nb_status nbi_gemm_small(const nbi_gemm_small_args *g) {
  int64_t m = g->m, n = g->n, k = g->k;
  if (m <= 0 || n <= 0) return NB_OK;
  const gs_fns *f = gs_active();
  const int64_t w = f->w;
  if (n == 1 && g->sa_c == 1 && k >= w) { /* one dot product per row */
    float bstack[GS_STACK];
    void *owned = NULL;
    const float *b = g->b;
    if (g->sb_r != 1) {
      float *pb = gs_buf(bstack, GS_STACK, k, &owned);
      if (!pb) return NB_ERR_OOM;
      for (int64_t p = 0; p < k; p++)
        pb[p] = g->b[p * g->sb_r];
      b = pb;
    }
    gs_dot d = {.m = m,
                .k = k,
                .a = g->a,
                .sa_r = g->sa_r,
                .b = b,
                .bias = g->bias ? g->bias[0] : 0.0f,
                .act = g->act,
                .c = g->c,
                .ldc = g->ldc};
    f->dot(&d);
    nbi_cpu_scratch_free(owned);
    return NB_OK;
  }
  if (n == 1 && g->sa_r == 1 && g->ldc == 1 && m % w == 0) {
    /* C^T = B^T A^T: one row of m, its B (A^T) unit-stride in place. */
    gs_job t = {.m = 1,
                .n = m,
                .k = k,
                .a = g->b,
                .sa_r = g->sb_c,
                .sa_c = g->sb_r,
                .b = g->a,
                .ldb = g->sa_c,
                .bias_r = g->bias,
                .s_r = 0,
                .act = g->act,
                .c = g->c,
                .ldc = m};
    f->run(&t);
    return NB_OK;
  }
  gs_job j = {.m = m,
              .n = n,
              .k = k,
              .a = g->a,
              .sa_r = g->sa_r,
              .sa_c = g->sa_c,
              .b = g->b,
              .ldb = g->sb_r,
              .act = g->act,
              .c = g->c,
              .ldc = g->ldc};
  int64_t npad = (n + w - 1) / w * w;
  float bstack[GS_STACK], biasstack[GS_MAX_W * 16];
  void *owned[2] = {NULL, NULL};
  if (g->sb_c != 1 || n % w != 0) { /* pack B: rows of npad, zero-padded */
    float *pb = gs_buf(bstack, GS_STACK, k * npad, &owned[0]);
    if (!pb) return NB_ERR_OOM;
    for (int64_t p = 0; p < k; p++) {
      float *row = pb + p * npad;
      for (int64_t c = 0; c < n; c++)
        row[c] = g->b[p * g->sb_r + c * g->sb_c];
      for (int64_t c = n; c < npad; c++)
        row[c] = 0;
    }
    j.b = pb;
    j.ldb = npad;
  }
  if (g->bias) {
    float *pb = gs_buf(biasstack, GS_MAX_W * 16, npad, &owned[1]);
    if (!pb) {
      nbi_cpu_scratch_free(owned[0]);
      return NB_ERR_OOM;
    }
    for (int64_t c = 0; c < n; c++)
      pb[c] = g->bias[c * g->s_bias];
    for (int64_t c = n; c < npad; c++)
      pb[c] = 0;
    j.bias_c = pb;
  }
  f->run(&j);
  nbi_cpu_scratch_free(owned[0]);
  nbi_cpu_scratch_free(owned[1]);
  return NB_OK;
}
