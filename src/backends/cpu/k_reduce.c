/* src/backends/cpu/k_reduce.c — CPU kernels of the reduction family: axis
 * reductions (sum/mean, prod, max, min, any, all, var/std, logsumexp, argmax,
 * argmin), softmax / log_softmax and cumsum along one axis.
 *
 * Every kernel first stages its input as a contiguous array of a compute type
 * (stage_input): f32 for f32/f16/bf16 and f64 for f64; reductions read
 * i32/i64/bool as they are, cumsum widens them to i64, and the float-result ops
 * (var, logsumexp, softmax) read every non-f64 input as f32, as JAX casts
 * integers to f32 first. A contiguous input already of that type is read in
 * place; anything else (strided, broadcast, flipped, other dtype) is copied once.
 *
 * Reductions then merge adjacent dims that are both kept or both reduced
 * (size-1 dims vanish) into groups, and run one of two loops:
 *   inner  the last group is reduced: each output folds its rows of length L
 *          with unit stride (vectorized);
 *   outer  the last group is kept: each reduced row of length B is folded into
 *          a vector of B states, so [R,B] -> [B] streams rows and never gathers
 *          with a stride.
 * States are double for float compute types (f32 sums are accurate to double
 * rounding) and int64 for integers (sums and products wrap modulo 2^64, and
 * narrower outputs keep the low bits, as JAX's int32 sums do). How work is
 * split between threads depends on the sizes only, never on the thread count,
 * so results do not change with OMP_NUM_THREADS.
 */
#include "k_reduce.h"
#include "../../core/oprules.h"
#include "k_linalg.h" /* nbi_cpu_scratch */
#include "k_sum.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>

#include "vmath.h"

#if NBI_HAVE_ISA_VARIANTS
#include <immintrin.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
/* Under -ftrapping-math (its default) gcc will not vectorize loops holding
 * float selects, such as exp's range clamp; nothing here reads FP flags. */
#pragma GCC optimize("no-trapping-math")
#endif
#if defined(__clang__)
/* `omp simd` is a hint: with UBSan's checks in the loop clang cannot vectorize
 * the f32 exp map and reports it (-Wpass-failed), an error under -Werror. */
#pragma clang diagnostic ignored "-Wpass-failed"
#endif

/* Hot row and column loops are compiled twice, for x86-64-v3 (AVX2 and FMA:
 * VM_FMA is one instruction there) and for the baseline ISA, and picked at
 * load time (ifunc): the build targets plain x86-64. */
#if defined(__x86_64__) && defined(__ELF__) && (defined(__GNUC__) || defined(__clang__)) &&        \
    !defined(NBI_NO_CLONES) /* a ThreadSanitizer build: the default clone */
#define HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HOT
#endif

/* What one pass folds into a state. F_SQDEV and F_SUMEXP sum (x - c)^2 and
 * exp(x - c) for a per-output centre c (passes 2 of var and logsumexp). */
typedef enum fold_op {
  F_SUM,
  F_PROD,
  F_MAX,
  F_MIN,
  F_ANY,
  F_ALL,
  F_ARGMAX,
  F_ARGMIN,
  F_SQDEV,
  F_SUMEXP
} fold_op;

enum {
  COL_BLOCK = 256, /* columns per task in the outer / column loops */
  CHUNK = 1 << 15, /* elements per parallel chunk of one long reduction */
  MIN_TASKS = 16,  /* below this many independent tasks, split the reduction */
  MAX_SPLITS = 64, /* at most this many private state vectors (outer loop) */
};

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- element steps ------------------------------------------------------------ */
/* Folds element x (reduced index i) into state *a (and *ix for the arg ops,
 * where *ix < 0 means "nothing yet"). Max/min propagate NaN; argmax/argmin keep
 * the first extreme and treat NaN as the most extreme value (NumPy). */
static inline void fstep(fold_op op, double *a, int64_t *ix, double x, int64_t i, double c) {
  switch (op) {
  case F_SUM: *a += x; break;
  case F_PROD: *a *= x; break;
  case F_MAX:
    if (x > *a || x != x) *a = x;
    break;
  case F_MIN:
    if (x < *a || x != x) *a = x;
    break;
  case F_ANY: *a = (*a != 0 || x != 0); break;
  case F_ALL: *a = (*a != 0 && x != 0); break;
  case F_ARGMAX:
    if (*ix < 0 || (*a == *a && (x > *a || x != x))) {
      *a = x;
      *ix = i;
    }
    break;
  case F_ARGMIN:
    if (*ix < 0 || (*a == *a && (x < *a || x != x))) {
      *a = x;
      *ix = i;
    }
    break;
  case F_SQDEV: *a += (x - c) * (x - c); break;
  case F_SUMEXP: *a += exp(x - c); break;
  }
}

/* The integer counterpart of fstep (F_SQDEV and F_SUMEXP never run on integers). */
static inline void istep(fold_op op, int64_t *a, int64_t *ix, int64_t x, int64_t i) {
  switch (op) {
  case F_SUM: *a = (int64_t)((uint64_t)*a + (uint64_t)x); break;
  case F_PROD: *a = (int64_t)((uint64_t)*a * (uint64_t)x); break;
  case F_MAX:
    if (x > *a) *a = x;
    break;
  case F_MIN:
    if (x < *a) *a = x;
    break;
  case F_ANY: *a = *a != 0 || x != 0; break;
  case F_ALL: *a = *a != 0 && x != 0; break;
  case F_ARGMAX:
    if (*ix < 0 || x > *a) {
      *a = x;
      *ix = i;
    }
    break;
  case F_ARGMIN:
    if (*ix < 0 || x < *a) {
      *a = x;
      *ix = i;
    }
    break;
  default: break;
  }
}

/* ---- row and column folds, per float compute type -------------------------------- */
/* Loops meant to vectorize: row sums keep explicit lanes (row_sum_T_S); exp
 * maps carry MAP_SIMD, `omp simd` where exp is inline (f32) and nothing where
 * it is a libm call (f64). */
#define SIMD_MAP _Pragma("omp simd")
#define NO_SIMD

/* for (int64_t I = LO; I < HI; I++) BODY: over the OpenMP threads (static
 * schedule) when PAR, else on the calling thread without entering a region
 * (even one with a false if clause costs a microsecond or so: several per
 * step of a small training loop). */
#define FOR_PAR_IF(PAR, I, LO, HI, ...)                                                            \
  do {                                                                                             \
    if (PAR) {                                                                                     \
      _Pragma("omp parallel for schedule(static)") for (int64_t I = (LO); I < (HI); I++)           \
          __VA_ARGS__                                                                              \
    } else {                                                                                       \
      for (int64_t I = (LO); I < (HI); I++)                                                        \
        __VA_ARGS__                                                                                \
    }                                                                                              \
  } while (0)

/* key_T: the bits of v as a signed integer, with the magnitude bits of negative
 *   values flipped, so keys order like the (non-NaN) values.
 * row_extreme_T: max (or min) of x[0..n), n >= 1, NaN if any element is NaN.
 *   It compares keys because compilers vectorize an integer max but not a
 *   float one, and tracks the largest |x| bits to detect NaN.
 * sum_exp_T: sum of exp(x[j] - c) over j < n, c >= every x[j] (a NaN x[j]
 *   only with a NaN c); NaN when c is not finite. e (if not NULL) receives the
 *   n exponentials (for f32 0 where x[j] - c is NaN: EXP_ROW, vm_expf_nonpos_nan0). Each block of
 * COL_BLOCK terms is summed in 16 lanes of T (lane k takes terms k, k + 16, ...), the lanes
 *   pairwise, and the blocks in double: the same order on every ISA, and for
 *   f32 a relative error within 20 units of 2^-24 (terms are positive).
 * fold_row_T: folds x[0..n) (unit stride, n >= 1; x[0] has reduced index i0)
 *   into the single state *acc / *ix; c is the centre of F_SQDEV / F_SUMEXP.
 * fold_rows_T: fold_row_T on `rows` rows back to back, into consecutive states
 *   with consecutive centres c (or NULL).
 * fold_col_T: folds rows x + r * stride, r < rows (reduced index q0 + r), of n
 *   elements into n states: acc[j] op= x[j], with centres c[j] (F_SQDEV /
 *   F_SUMEXP only) and arg indices ix[j] = q0 + r when taken. */
#define DEF_FLOAT_FOLDS(SUF, T, U, I, EXP, EXP_ROW, MAP_SIMD)                                      \
  static I key_##SUF(T v) {                                                                        \
    U u;                                                                                           \
    memcpy(&u, &v, sizeof u);                                                                      \
    return (I)(u ^ ((0 - (u >> (8 * sizeof u - 1))) >> 1));                                        \
  }                                                                                                \
  static inline T row_extreme_##SUF(const T *restrict x, int64_t n, bool max) {                    \
    const U abs_mask = (U)-1 >> 1;                                                                 \
    const I inf_key = key_##SUF((T)INFINITY);                                                      \
    I mk = key_##SUF(max ? (T)-INFINITY : (T)INFINITY), ma = 0;                                    \
    if (max)                                                                                       \
      for (int64_t j = 0; j < n; j++) {                                                            \
        U u;                                                                                       \
        memcpy(&u, &x[j], sizeof u);                                                               \
        I k = key_##SUF(x[j]), a = (I)(u & abs_mask);                                              \
        mk = k > mk ? k : mk;                                                                      \
        ma = a > ma ? a : ma;                                                                      \
      }                                                                                            \
    else                                                                                           \
      for (int64_t j = 0; j < n; j++) {                                                            \
        U u;                                                                                       \
        memcpy(&u, &x[j], sizeof u);                                                               \
        I k = key_##SUF(x[j]), a = (I)(u & abs_mask);                                              \
        mk = k < mk ? k : mk;                                                                      \
        ma = a > ma ? a : ma;                                                                      \
      }                                                                                            \
    if (ma > inf_key) return (T)NAN;                                                               \
    U u = (U)mk;                                                                                   \
    u ^= (0 - (u >> (8 * sizeof u - 1))) >> 1;                                                     \
    T r;                                                                                           \
    memcpy(&r, &u, sizeof r);                                                                      \
    return r;                                                                                      \
  }                                                                                                \
  static inline __attribute__((always_inline)) double sum_exp_##SUF(const T *restrict x, T c,      \
                                                                    int64_t n, T *restrict e) {    \
    double s = 0;                                                                                  \
    for (int64_t j0 = 0; j0 < n; j0 += COL_BLOCK) {                                                \
      int64_t w = min64(COL_BLOCK, n - j0), w16 = w & ~(int64_t)15;                                \
      T lane[16] = {0};                                                                            \
      if (e) { /* the terms stored, then summed */                                                 \
        T *restrict d = e + j0;                                                                    \
        MAP_SIMD for (int64_t j = 0; j < w; j++) d[j] = EXP_ROW(x[j0 + j] - c);                    \
        for (int64_t j = 0; j < w16; j += 16)                                                      \
          for (int k = 0; k < 16; k++)                                                             \
            lane[k] += d[j + k];                                                                   \
        for (int64_t k = 0; k < w - w16; k++)                                                      \
          lane[k] += d[w16 + k];                                                                   \
      } else { /* summed as computed (the same lanes): no store and reload */                      \
        for (int64_t j = 0; j < w16; j += 16)                                                      \
          for (int k = 0; k < 16; k++)                                                             \
            lane[k] += EXP_ROW(x[j0 + j + k] - c);                                                 \
        for (int64_t k = 0; k < w - w16; k++)                                                      \
          lane[k] += EXP_ROW(x[j0 + w16 + k] - c);                                                 \
      }                                                                                            \
      T a8[8], a4[4]; /* lanes pairwise, written out: gcc kept the loop form in memory */          \
      for (int k = 0; k < 8; k++)                                                                  \
        a8[k] = lane[k] + lane[k + 8];                                                             \
      for (int k = 0; k < 4; k++)                                                                  \
        a4[k] = a8[k] + a8[k + 4];                                                                 \
      s += (double)((a4[0] + a4[2]) + (a4[1] + a4[3]));                                            \
    }                                                                                              \
    return c - c == 0 ? s : (double)NAN; /* EXP_ROW may take NaN to 0 */                           \
  }                                                                                                \
  static inline void fold_row_##SUF(fold_op op, const T *restrict x, int64_t n, double c,          \
                                    double *acc, int64_t *ix, int64_t i0) {                        \
    if (n < 8) { /* too short for vector loops */                                                  \
      for (int64_t j = 0; j < n; j++)                                                              \
        fstep(op, acc, ix, x[j], i0 + j, c);                                                       \
      return;                                                                                      \
    }                                                                                              \
    switch (op) {                                                                                  \
    case F_SUM:                                                                                    \
    case F_SQDEV:                                                                                  \
      *acc += nbi_cpu_row_sum_##SUF[nbi_isa_active()](x, NULL, n, c, op == F_SQDEV);               \
      return;                                                                                      \
    case F_SUMEXP: *acc += sum_exp_##SUF(x, (T)c, n, NULL); return;                                \
    case F_MAX:                                                                                    \
    case F_MIN: fstep(op, acc, ix, row_extreme_##SUF(x, n, op == F_MAX), 0, 0); return;            \
    case F_ARGMAX:                                                                                 \
    case F_ARGMIN: { /* the first NaN, else the first element equal to the extreme */              \
      T m = row_extreme_##SUF(x, n, op == F_ARGMAX);                                               \
      int64_t j = 0;                                                                               \
      if (m != m)                                                                                  \
        while (x[j] == x[j])                                                                       \
          j++;                                                                                     \
      else                                                                                         \
        while (x[j] != m)                                                                          \
          j++;                                                                                     \
      fstep(op, acc, ix, x[j], i0 + j, 0);                                                         \
      return;                                                                                      \
    }                                                                                              \
    default:                                                                                       \
      for (int64_t j = 0; j < n; j++)                                                              \
        fstep(op, acc, ix, x[j], i0 + j, c);                                                       \
      return;                                                                                      \
    }                                                                                              \
  }                                                                                                \
  HOT static void fold_rows_##SUF(fold_op op, const T *restrict x, int64_t n, int64_t rows,        \
                                  const double *c, double *acc, int64_t *ix, int64_t i0) {         \
    for (int64_t r = 0; r < rows; r++)                                                             \
      fold_row_##SUF(op, x + r * n, n, c ? c[r] : 0, acc + r, ix ? ix + r : NULL, i0);             \
  }                                                                                                \
  HOT static void fold_col_##SUF(fold_op op, const T *restrict x, int64_t n, int64_t rows,         \
                                 int64_t stride, const double *restrict c, double *restrict acc,   \
                                 int64_t *restrict ix, int64_t q0) {                               \
    for (int64_t r = 0; r < rows; r++) {                                                           \
      const T *restrict xr = x + r * stride;                                                       \
      int64_t i = q0 + r;                                                                          \
      switch (op) {                                                                                \
      case F_SUM:                                                                                  \
        for (int64_t j = 0; j < n; j++)                                                            \
          acc[j] += (double)xr[j];                                                                 \
        break;                                                                                     \
      case F_SQDEV:                                                                                \
        for (int64_t j = 0; j < n; j++) {                                                          \
          double d = (double)xr[j] - c[j];                                                         \
          acc[j] += d * d;                                                                         \
        }                                                                                          \
        break;                                                                                     \
      case F_SUMEXP:                                                                               \
        for (int64_t j = 0; j < n; j++)                                                            \
          acc[j] += (double)EXP(xr[j] - (T)c[j]);                                                  \
        break;                                                                                     \
      case F_MAX:                                                                                  \
        for (int64_t j = 0; j < n; j++) {                                                          \
          double v = xr[j];                                                                        \
          acc[j] = (v > acc[j] || v != v) ? v : acc[j];                                            \
        }                                                                                          \
        break;                                                                                     \
      case F_MIN:                                                                                  \
        for (int64_t j = 0; j < n; j++) {                                                          \
          double v = xr[j];                                                                        \
          acc[j] = (v < acc[j] || v != v) ? v : acc[j];                                            \
        }                                                                                          \
        break;                                                                                     \
      default:                                                                                     \
        for (int64_t j = 0; j < n; j++)                                                            \
          fstep(op, &acc[j], ix ? &ix[j] : NULL, xr[j], i, 0);                                     \
        break;                                                                                     \
      }                                                                                            \
    }                                                                                              \
  }

DEF_FLOAT_FOLDS(f32, float, uint32_t, int32_t, vm_expf_nonpos, vm_expf_nonpos_nan0, SIMD_MAP)
DEF_FLOAT_FOLDS(f64, double, uint64_t, int64_t, exp, exp, NO_SIMD)

/* The integer counterparts of fold_rows_T and fold_col_T, reading elements of
 * type T (i64, i32, bool) through LOAD into int64 states. */
#define DEF_INT_FOLDS(SUF, T, LOAD)                                                                \
  HOT static void fold_rows_##SUF(fold_op op, const T *restrict x, int64_t n, int64_t rows,        \
                                  int64_t *acc, int64_t *ix, int64_t i0) {                         \
    for (int64_t r = 0; r < rows; r++) {                                                           \
      const T *restrict xr = x + r * n;                                                            \
      int64_t m = op == F_MAX ? INT64_MIN : INT64_MAX, any = 0, all = 1;                           \
      uint64_t s = 0;                                                                              \
      switch (op) {                                                                                \
      case F_SUM:                                                                                  \
        for (int64_t j = 0; j < n; j++)                                                            \
          s += (uint64_t)LOAD(xr[j]);                                                              \
        istep(op, acc + r, NULL, (int64_t)s, 0);                                                   \
        break;                                                                                     \
      case F_MAX:                                                                                  \
        for (int64_t j = 0; j < n; j++)                                                            \
          m = LOAD(xr[j]) > m ? LOAD(xr[j]) : m;                                                   \
        istep(op, acc + r, NULL, m, 0);                                                            \
        break;                                                                                     \
      case F_MIN:                                                                                  \
        for (int64_t j = 0; j < n; j++)                                                            \
          m = LOAD(xr[j]) < m ? LOAD(xr[j]) : m;                                                   \
        istep(op, acc + r, NULL, m, 0);                                                            \
        break;                                                                                     \
      case F_ANY:                                                                                  \
        for (int64_t j = 0; j < n; j++)                                                            \
          any |= xr[j] != 0;                                                                       \
        istep(op, acc + r, NULL, any, 0);                                                          \
        break;                                                                                     \
      case F_ALL:                                                                                  \
        for (int64_t j = 0; j < n; j++)                                                            \
          all &= xr[j] != 0;                                                                       \
        istep(op, acc + r, NULL, all, 0);                                                          \
        break;                                                                                     \
      default:                                                                                     \
        for (int64_t j = 0; j < n; j++)                                                            \
          istep(op, acc + r, ix ? ix + r : NULL, LOAD(xr[j]), i0 + j);                             \
        break;                                                                                     \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  HOT static void fold_col_##SUF(fold_op op, const T *restrict x, int64_t n, int64_t rows,         \
                                 int64_t stride, int64_t *restrict acc, int64_t *restrict ix,      \
                                 int64_t q0) {                                                     \
    for (int64_t r = 0; r < rows; r++) {                                                           \
      const T *restrict xr = x + r * stride;                                                       \
      switch (op) {                                                                                \
      case F_SUM:                                                                                  \
        for (int64_t j = 0; j < n; j++)                                                            \
          acc[j] = (int64_t)((uint64_t)acc[j] + (uint64_t)LOAD(xr[j]));                            \
        break;                                                                                     \
      case F_MAX:                                                                                  \
        for (int64_t j = 0; j < n; j++)                                                            \
          acc[j] = LOAD(xr[j]) > acc[j] ? LOAD(xr[j]) : acc[j];                                    \
        break;                                                                                     \
      case F_MIN:                                                                                  \
        for (int64_t j = 0; j < n; j++)                                                            \
          acc[j] = LOAD(xr[j]) < acc[j] ? LOAD(xr[j]) : acc[j];                                    \
        break;                                                                                     \
      default:                                                                                     \
        for (int64_t j = 0; j < n; j++)                                                            \
          istep(op, &acc[j], ix ? &ix[j] : NULL, LOAD(xr[j]), q0 + r);                             \
        break;                                                                                     \
      }                                                                                            \
    }                                                                                              \
  }

#define LOAD_INT(v) ((int64_t)(v))
#define LOAD_BOOL(v) ((int64_t)((v) != 0))
DEF_INT_FOLDS(i64, int64_t, LOAD_INT)
DEF_INT_FOLDS(i32, int32_t, LOAD_INT)
DEF_INT_FOLDS(b8, uint8_t, LOAD_BOOL)

/* ---- staging and output ---------------------------------------------------------- */
/* f64 computes in f64, f32/f16/bf16 in f32. Integers and bools compute in f32
 * when the result is float, else as i64 when widen_ints, else as themselves. */
static nb_dtype compute_dtype(nb_dtype dt, bool float_result, bool widen_ints) {
  if (dt == NB_F64) return NB_F64;
  if (float_result || nb_dtype_is_float(dt)) return NB_F32;
  return widen_ints || dt == NB_U8 || dt == NB_I8 || dt == NB_I16 ? NB_I64 : dt;
}

static int64_t view_numel(const nbi_view *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++)
    n *= v->dims[d];
  return n;
}

/* dst[i] = src[i] for n contiguous elements, src of dtype dt converted to ct
 * (f32 or i64: the staging conversions of a contiguous input). */
static void convert_contig(void *dst, nb_dtype ct, const void *src, nb_dtype dt, int64_t n) {
  float *f = dst;
  int64_t *l = dst;
  const uint16_t *h = src;
  const uint8_t *b = src;
  const int32_t *w = src;
  const int64_t *q = src;
  FOR_PAR_IF(n >= NBI_PAR_MIN, c, 0, ceil_div(n, CHUNK), {
    int64_t i0 = c * CHUNK, i1 = min64(i0 + CHUNK, n);
    if (ct == NB_I64 && dt == NB_I32)
      for (int64_t i = i0; i < i1; i++)
        l[i] = w[i];
    else if (ct == NB_I64 && dt == NB_BOOL)
      for (int64_t i = i0; i < i1; i++)
        l[i] = b[i] != 0;
    else if (ct == NB_I64) /* u8, i8, i16 */
      for (int64_t i = i0; i < i1; i++)
        l[i] = nbi_load_i64(src, dt, i);
    else if (dt == NB_F16)
      for (int64_t i = i0; i < i1; i++)
        f[i] = nbi_f16_to_f32(h[i]);
    else if (dt == NB_BF16)
      for (int64_t i = i0; i < i1; i++)
        f[i] = nbi_bf16_to_f32(h[i]);
    else if (dt == NB_I32)
      for (int64_t i = i0; i < i1; i++)
        f[i] = (float)w[i];
    else if (dt == NB_I64)
      for (int64_t i = i0; i < i1; i++)
        f[i] = (float)q[i];
    else if (dt == NB_BOOL)
      for (int64_t i = i0; i < i1; i++)
        f[i] = b[i] != 0;
    else /* u8, i8, i16 */
      for (int64_t i = i0; i < i1; i++)
        f[i] = (float)nbi_load_i64(src, dt, i);
  });
}

/* Points *x at in's numel (> 0) elements as a contiguous array of ct. *owned is
 * the copy the caller frees, or NULL when in is read in place. */
static nb_status stage_input(const char *op, const nbi_view *in, nb_dtype ct, int64_t numel,
                             const void **x, void **owned) {
  *owned = NULL;
  bool contiguous = nbi_view_is_contiguous(in);
  if (in->dtype == ct && contiguous) {
    *x = in->data;
    return NB_OK;
  }
  void *buf = malloc((size_t)numel * nb_dtype_size(ct));
  if (!buf)
    return nbi_error(NB_ERR_OOM, "nb_%s: out of memory staging %lld elements", op,
                     (long long)numel);
  if (contiguous) {
    convert_contig(buf, ct, in->data, in->dtype, numel);
  } else {
    nbi_view dst = *in;
    dst.data = buf;
    dst.dtype = ct;
    nb_shape s = {.ndim = in->ndim};
    memcpy(s.dims, in->dims, sizeof s.dims);
    nbi_contig_strides(&s, dst.strides);
    nbi_copy_view(&dst, in);
  }
  *x = buf;
  *owned = buf;
  return NB_OK;
}

/* Writes n contiguous elements of src (dtype f32, f64 or i64) into out (contiguous)
 * converting to out's dtype; i32 outputs keep the low 32 bits of i64 values. */
static void write_out(nbi_view *out, const void *src, nb_dtype st, int64_t n) {
  if (out->data == src) return;
  nb_dtype dt = out->dtype;
  if (dt == st) {
    memcpy(out->data, src, (size_t)n * nb_dtype_size(dt));
    return;
  }
  FOR_PAR_IF(n >= NBI_PAR_MIN, c, 0, ceil_div(n, CHUNK), {
    int64_t i0 = c * CHUNK, i1 = min64(i0 + CHUNK, n);
    if (st == NB_F64 && dt == NB_F32) {
      for (int64_t i = i0; i < i1; i++)
        ((float *)out->data)[i] = (float)((const double *)src)[i];
    } else if (st == NB_I64 && dt == NB_I32) {
      for (int64_t i = i0; i < i1; i++)
        ((int32_t *)out->data)[i] = (int32_t)(uint32_t)((const uint64_t *)src)[i];
    } else if (st == NB_I64) {
      for (int64_t i = i0; i < i1; i++)
        nbi_store_i64(out->data, dt, i, ((const int64_t *)src)[i]);
    } else {
      for (int64_t i = i0; i < i1; i++)
        nbi_store_f64(out->data, dt, i, nbi_load_f64(src, st, i));
    }
  });
}

/* ---- reduction geometry ------------------------------------------------------------ */
/* Groups of merged dims of a contiguous input, split into kept and reduced ones
 * (in order), with their element strides. There is always at least one group. */
typedef struct geom {
  int nk, nr;
  int64_t ks[NB_MAX_DIMS], kst[NB_MAX_DIMS]; /* kept groups: sizes, strides */
  int64_t rs[NB_MAX_DIMS], rst[NB_MAX_DIMS]; /* reduced groups: sizes, strides */
  int64_t n_out, n_red;
  bool inner; /* the last group is reduced */
} geom;

/* dims are all >= 1 (the input is not empty); mask marks the reduced dims. */
static void geom_build(geom *g, const int64_t *dims, int ndim, uint32_t mask) {
  int64_t size[NB_MAX_DIMS], stride[NB_MAX_DIMS];
  bool red[NB_MAX_DIMS];
  int ng = 0;
  for (int d = 0; d < ndim; d++) {
    if (dims[d] == 1) continue;
    bool r = (mask >> d) & 1u;
    if (ng > 0 && red[ng - 1] == r) {
      size[ng - 1] *= dims[d];
    } else {
      size[ng] = dims[d];
      red[ng++] = r;
    }
  }
  if (ng == 0) { /* one element: one kept group of size 1 */
    size[0] = 1;
    red[ng++] = false;
  }
  int64_t st = 1;
  for (int k = ng - 1; k >= 0; k--) {
    stride[k] = st;
    st *= size[k];
  }
  *g = (geom){.n_out = 1, .n_red = 1, .inner = red[ng - 1]};
  for (int k = 0; k < ng; k++) {
    if (red[k]) {
      g->rs[g->nr] = size[k];
      g->rst[g->nr++] = stride[k];
      g->n_red *= size[k];
    } else {
      g->ks[g->nk] = size[k];
      g->kst[g->nk++] = stride[k];
      g->n_out *= size[k];
    }
  }
}

/* Element offset of the idx-th combination (row-major) of the first n groups. */
static int64_t group_offset(const int64_t *size, const int64_t *stride, int n, int64_t idx) {
  int64_t off = 0;
  for (int k = n - 1; k >= 0; k--) {
    off += idx % size[k] * stride[k];
    idx /= size[k];
  }
  return off;
}

/* One pass of a reduction: folds the staged input x (compute type ct) into the
 * n_out states acc (8 bytes each: double, or int64 for integer ct) and arg indices ix
 * (NULL unless argmax/argmin), with per-output centres c (NULL unless needed). */
typedef struct pass {
  nb_dtype ct;
  fold_op op;
  const void *x;
  const geom *g;
  const double *c;
  void *acc;
  int64_t *ix;
} pass;

static void state_init(const pass *p, void *acc, int64_t *ix, int64_t n) {
  bool one = p->op == F_PROD || p->op == F_ALL;
  bool hi = p->op == F_MIN || p->op == F_ARGMIN, lo = p->op == F_MAX || p->op == F_ARGMAX;
  if (nb_dtype_is_float(p->ct)) {
    double v = lo ? -INFINITY : hi ? INFINITY : one;
    for (int64_t k = 0; k < n; k++)
      ((double *)acc)[k] = v;
  } else {
    int64_t v = lo ? INT64_MIN : hi ? INT64_MAX : one;
    for (int64_t k = 0; k < n; k++)
      ((int64_t *)acc)[k] = v;
  }
  for (int64_t k = 0; ix && k < n; k++)
    ix[k] = -1;
}

/* Folds partial state (b, ib) of a later part of the reduction into (*a, *ia). */
static void state_combine(const pass *p, void *a, int64_t *ia, const void *b, int64_t ib) {
  fold_op op = p->op == F_SQDEV || p->op == F_SUMEXP ? F_SUM : p->op;
  if (!nb_dtype_is_float(p->ct))
    istep(op, a, ia, *(const int64_t *)b, ib);
  else
    fstep(op, a, ia, *(const double *)b, ib, 0);
}

static void *state_at(void *acc, int64_t k) { return (char *)acc + 8 * k; }

/* Folds `rows` consecutive rows of n elements from offset off of the staged
 * input into consecutive states acc / ix, with centres c (or NULL); i0 is the
 * reduced index of each row's first element. */
static void fold_rows(const pass *p, int64_t off, int64_t n, int64_t rows, const double *c,
                      void *acc, int64_t *ix, int64_t i0) {
  switch (p->ct) {
  case NB_F32: fold_rows_f32(p->op, (const float *)p->x + off, n, rows, c, acc, ix, i0); break;
  case NB_F64: fold_rows_f64(p->op, (const double *)p->x + off, n, rows, c, acc, ix, i0); break;
  case NB_I32: fold_rows_i32(p->op, (const int32_t *)p->x + off, n, rows, acc, ix, i0); break;
  case NB_BOOL: fold_rows_b8(p->op, (const uint8_t *)p->x + off, n, rows, acc, ix, i0); break;
  default: fold_rows_i64(p->op, (const int64_t *)p->x + off, n, rows, acc, ix, i0); break;
  }
}

/* Inner loop: folds reduced elements [a, b) (row-major over the reduced
 * groups) of output o into the state (st, si). */
static void inner_range(const pass *p, int64_t o, int64_t a, int64_t b, void *st, int64_t *si) {
  const geom *g = p->g;
  int64_t len_row = g->rs[g->nr - 1], base = group_offset(g->ks, g->kst, g->nk, o);
  const double *c = p->c ? p->c + o : NULL;
  while (a < b) {
    int64_t q = a / len_row, j0 = a % len_row, len = min64(len_row - j0, b - a);
    fold_rows(p, base + group_offset(g->rs, g->rst, g->nr - 1, q) + j0, len, 1, c, st, si, a);
    a += len;
  }
}

/* Whether the inner loop folds each of n_out outputs' n_red elements in CHUNK
 * pieces (from fresh states, combined in order) rather than whole. */
static bool inner_splits(int64_t n_out, int64_t n_red) {
  return n_out * n_red >= NBI_PAR_MIN && n_out < MIN_TASKS;
}

static nb_status run_inner(const pass *p, const char *opname) {
  const geom *g = p->g;
  int64_t work = g->n_out * g->n_red;
  if (!inner_splits(g->n_out, g->n_red) && g->nr == 1) {
    /* [outputs, L] rows back to back: blocks of about CHUNK elements */
    int64_t L = g->n_red, rb = CHUNK / L + 1, nblk = ceil_div(g->n_out, rb);
    FOR_PAR_IF(work >= NBI_PAR_MIN, b, 0, nblk, {
      int64_t o = b * rb;
      fold_rows(p, o * L, L, min64(rb, g->n_out - o), p->c ? p->c + o : NULL, state_at(p->acc, o),
                p->ix ? p->ix + o : NULL, 0);
    });
    return NB_OK;
  }
  if (!inner_splits(g->n_out, g->n_red)) {
    FOR_PAR_IF(work >= NBI_PAR_MIN, o, 0, g->n_out,
               { inner_range(p, o, 0, g->n_red, state_at(p->acc, o), p->ix ? p->ix + o : NULL); });
    return NB_OK;
  }
  /* few outputs, long reductions: fixed-size chunks of every output in
   * parallel, merged in order */
  int64_t nch = ceil_div(g->n_red, CHUNK), tasks = g->n_out * nch;
  int64_t *part = malloc((size_t)tasks * 2 * sizeof *part);
  if (!part) return nbi_error(NB_ERR_OOM, "nb_%s: out of memory splitting a reduction", opname);
  int64_t *pix = p->ix ? part + tasks : NULL;
  state_init(p, part, pix, tasks);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tasks; t++) {
    int64_t o = t / nch, a = t % nch * CHUNK;
    inner_range(p, o, a, min64(a + CHUNK, g->n_red), state_at(part, t), pix ? pix + t : NULL);
  }
  for (int64_t t = 0; t < tasks; t++)
    state_combine(p, state_at(p->acc, t / nch), pix ? p->ix + t / nch : NULL, state_at(part, t),
                  pix ? pix[t] : 0);
  free(part);
  return NB_OK;
}

/* Outer loop: folds reduced rows [q0, q1) into the states acc/ix (laid out as
 * the outputs) of columns [c0, c1) of output row o1. */
static void outer_block(const pass *p, void *acc, int64_t *ix, int64_t o1, int64_t c0, int64_t c1,
                        int64_t q0, int64_t q1) {
  const geom *g = p->g;
  int64_t B = g->ks[g->nk - 1], so = o1 * B + c0, w = c1 - c0;
  int64_t base = group_offset(g->ks, g->kst, g->nk - 1, o1) + c0;
  const double *c = p->c ? p->c + so : NULL;
  int64_t *six = ix ? ix + so : NULL;
  /* one reduced group: rows at a fixed stride, folded in one call */
  int64_t rows = g->nr <= 1 ? q1 - q0 : 1, stride = g->nr == 1 ? g->rst[0] : 0;
  for (int64_t q = q0; q < q1; q += rows) {
    int64_t off = base + group_offset(g->rs, g->rst, g->nr, q);
    switch (p->ct) {
    case NB_F32:
      fold_col_f32(p->op, (const float *)p->x + off, w, rows, stride, c, (double *)acc + so, six,
                   q);
      break;
    case NB_F64:
      fold_col_f64(p->op, (const double *)p->x + off, w, rows, stride, c, (double *)acc + so, six,
                   q);
      break;
    case NB_I32:
      fold_col_i32(p->op, (const int32_t *)p->x + off, w, rows, stride, (int64_t *)acc + so, six,
                   q);
      break;
    case NB_BOOL:
      fold_col_b8(p->op, (const uint8_t *)p->x + off, w, rows, stride, (int64_t *)acc + so, six, q);
      break;
    default:
      fold_col_i64(p->op, (const int64_t *)p->x + off, w, rows, stride, (int64_t *)acc + so, six,
                   q);
      break;
    }
  }
}

static nb_status run_outer(const pass *p, const char *opname) {
  const geom *g = p->g;
  int64_t B = g->ks[g->nk - 1], nb = ceil_div(B, COL_BLOCK), tasks = g->n_out / B * nb;
  int64_t work = g->n_out * g->n_red;
  if (work < NBI_PAR_MIN || tasks >= MIN_TASKS) {
    FOR_PAR_IF(work >= NBI_PAR_MIN, t, 0, tasks, {
      int64_t c0 = t % nb * COL_BLOCK;
      outer_block(p, p->acc, p->ix, t / nb, c0, min64(c0 + COL_BLOCK, B), 0, g->n_red);
    });
    return NB_OK;
  }
  /* few columns, many rows: row chunks into private states, merged in order */
  int64_t qc = CHUNK / g->n_out > 0 ? CHUNK / g->n_out : 1, nch = ceil_div(g->n_red, qc);
  if (nch > MAX_SPLITS) {
    nch = MAX_SPLITS;
    qc = ceil_div(g->n_red, nch);
  }
  int64_t *part = malloc((size_t)(nch * g->n_out) * 2 * sizeof *part);
  if (!part) return nbi_error(NB_ERR_OOM, "nb_%s: out of memory splitting a reduction", opname);
  int64_t *pix = p->ix ? part + nch * g->n_out : NULL;
#pragma omp parallel for schedule(static)
  for (int64_t ch = 0; ch < nch; ch++) {
    void *acc = state_at(part, ch * g->n_out);
    int64_t *ix = pix ? pix + ch * g->n_out : NULL;
    state_init(p, acc, ix, g->n_out);
    for (int64_t t = 0; t < tasks; t++) {
      int64_t c0 = t % nb * COL_BLOCK;
      outer_block(p, acc, ix, t / nb, c0, min64(c0 + COL_BLOCK, B), ch * qc,
                  min64((ch + 1) * qc, g->n_red));
    }
  }
  for (int64_t ch = 0; ch < nch; ch++)
    for (int64_t o = 0; o < g->n_out; o++)
      state_combine(p, state_at(p->acc, o), pix ? p->ix + o : NULL,
                    state_at(part, ch * g->n_out + o), pix ? pix[ch * g->n_out + o] : 0);
  free(part);
  return NB_OK;
}

/* Runs one pass from the initial states. */
static nb_status run_pass(pass *p, fold_op op, const double *c, const char *opname) {
  p->op = op;
  p->c = c;
  state_init(p, p->acc, p->ix, p->g->n_out);
  if (p->g->n_red == 0) return NB_OK;
  return p->g->inner ? run_inner(p, opname) : run_outer(p, opname);
}

/* The fold of a one-pass reduction op. */
static fold_op simple_fold(int op) {
  switch (op) {
  case NBI_OP_REDUCE_PROD: return F_PROD;
  case NBI_OP_REDUCE_MAX: return F_MAX;
  case NBI_OP_REDUCE_MIN: return F_MIN;
  case NBI_OP_REDUCE_ANY: return F_ANY;
  case NBI_OP_REDUCE_ALL: return F_ALL;
  case NBI_OP_ARGMAX: return F_ARGMAX;
  case NBI_OP_ARGMIN: return F_ARGMIN;
  default: return F_SUM;
  }
}

/* Sum's result from its state v: v / div for mean (div = the count), NaN when
 * nothing was reduced. */
static double mean_of(double v, double div) { return div > 0 ? v / div : NAN; }

/* Var's (std's) result from the F_SQDEV state of count elements. */
static double var_of(double sqdev, double count, bool sd) {
  double v = count > 0 ? sqdev / count : NAN;
  return sd ? sqrt(v) : v;
}

/* in[0] is (..., reduced dims interleaved with kept dims ...), any strides;
 * out is (kept dims) contiguous, with reduced dims as 1 when keepdims. */
nb_status nbi_cpu_reduce(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  const char *opname = nbi_op_table[n->op]->name;
  int64_t numel = view_numel(in), n_out = view_numel(out);
  if (n_out == 0) return NB_OK;
  uint32_t mask = (uint32_t)n->attrs.i[0];
  bool float_result = n->op == NBI_OP_REDUCE_VAR || n->op == NBI_OP_LOGSUMEXP;
  bool arg = n->op == NBI_OP_ARGMAX || n->op == NBI_OP_ARGMIN;
  geom g = {.n_out = n_out}; /* numel == 0: every output reduces nothing */
  if (numel > 0) geom_build(&g, in->dims, in->ndim, mask);
  pass p = {.ct = compute_dtype(in->dtype, float_result, false), .g = &g};
  void *owned = NULL;
  if (numel > 0 && stage_input(opname, in, p.ct, numel, &p.x, &owned)) return NB_ERR_OOM;
  /* acc: states; ix / centre: arg indices, or the centres of pass 2 */
  double *acc = nbi_cpu_scratch(opname, (size_t)n_out * 2 * sizeof(double)); /* buffer cache */
  if (!acc) {
    free(owned);
    return NB_ERR_OOM;
  }
  double *centre = acc + n_out;
  p.acc = acc;
  p.ix = arg ? (int64_t *)centre : NULL;
  nb_status st = NB_OK;
  double count = (double)g.n_red;
  bool ints = !nb_dtype_is_float(p.ct);
  nb_dtype res = ints ? NB_I64 : NB_F64; /* dtype of the results in acc */
  switch (n->op) {
  case NBI_OP_REDUCE_SUM: {
    st = run_pass(&p, F_SUM, NULL, opname);
    double div = n->attrs.f[0]; /* 1 for sum, the count for mean */
    if (div == 1) break;
    for (int64_t o = 0; o < n_out; o++) {
      double v = ints ? (double)((int64_t *)acc)[o] : acc[o];
      acc[o] = mean_of(v, div);
    }
    res = NB_F64;
    break;
  }
  case NBI_OP_REDUCE_VAR:
    st = run_pass(&p, F_SUM, NULL, opname);
    if (!st && count > 0) {
      for (int64_t o = 0; o < n_out; o++)
        centre[o] = acc[o] / count;
      st = run_pass(&p, F_SQDEV, centre, opname);
    }
    for (int64_t o = 0; o < n_out; o++)
      acc[o] = var_of(acc[o], count, n->attrs.i[1]);
    break;
  case NBI_OP_LOGSUMEXP:
    /* max-shifted: m + log(sum(exp(x - m))); m >= every x keeps exp's argument
     * <= 0 (or NaN), and a non-finite m (inf, -inf, NaN, empty) is the result */
    st = run_pass(&p, F_MAX, NULL, opname);
    memcpy(centre, acc, (size_t)n_out * sizeof *centre);
    if (!st && count > 0) st = run_pass(&p, F_SUMEXP, centre, opname);
    for (int64_t o = 0; o < n_out; o++)
      acc[o] = isfinite(centre[o]) ? centre[o] + log(acc[o]) : centre[o];
    break;
  default: st = run_pass(&p, simple_fold(n->op), NULL, opname); break;
  }
  if (!st) write_out(out, arg ? (void *)p.ix : (void *)acc, arg ? NB_I64 : res, n_out);
  nbi_cpu_scratch_free(acc);
  free(owned);
  return st;
}

/* ---- one row, for fused groups ---------------------------------------------------- */
bool nbi_cpu_reduce_row_ok(int op, nb_dtype dt, nb_dtype in_dt) {
  switch (op) {
  case NBI_OP_REDUCE_SUM:
  case NBI_OP_REDUCE_PROD:
  case NBI_OP_REDUCE_MAX:
  case NBI_OP_REDUCE_MIN:
  case NBI_OP_REDUCE_VAR: break;
  default: return false;
  }
  return (dt == NB_F32 || dt == NB_F64) && in_dt == dt;
}

/* Folds one output's reduced elements x[0..len) (len >= 1) into *acc from its
 * initial state, as run_inner does for an input of n_out such outputs. */
static void fold_one_row(pass *p, fold_op op, const void *x, int64_t len, int64_t n_out, double c,
                         double *acc) {
  p->op = op;
  p->x = x;
  state_init(p, acc, NULL, 1);
  if (!inner_splits(n_out, len)) {
    fold_rows(p, 0, len, 1, &c, acc, NULL, 0);
    return;
  }
  for (int64_t a = 0; a < len; a += CHUNK) {
    double part;
    state_init(p, &part, NULL, 1);
    fold_rows(p, a, min64(CHUNK, len - a), 1, &c, &part, NULL, a);
    state_combine(p, acc, NULL, &part, 0);
  }
}

double nbi_cpu_reduce_row(const nbi_group_member *e, const void *x, int64_t len, int64_t n_out) {
  pass p = {.ct = e->dtype};
  double acc, count = (double)len;
  if (len == 0) { /* every state stays initial */
    p.op = e->op == NBI_OP_REDUCE_VAR ? F_SUM : simple_fold(e->op);
    state_init(&p, &acc, NULL, 1);
  }
  switch (e->op) {
  case NBI_OP_REDUCE_SUM:
    if (len > 0) fold_one_row(&p, F_SUM, x, len, n_out, 0, &acc);
    return e->af[0] == 1 ? acc : mean_of(acc, e->af[0]);
  case NBI_OP_REDUCE_VAR:
    if (len > 0) {
      fold_one_row(&p, F_SUM, x, len, n_out, 0, &acc);
      fold_one_row(&p, F_SQDEV, x, len, n_out, acc / count, &acc);
    }
    return var_of(acc, count, e->ai[1]);
  default:
    if (len > 0) fold_one_row(&p, simple_fold(e->op), x, len, n_out, 0, &acc);
    return acc;
  }
}

bool nbi_cpu_reduce_row_dot_ok(const nbi_group_member *e, int64_t len, int64_t n_out) {
  return e->op == NBI_OP_REDUCE_SUM && (e->dtype == NB_F32 || e->dtype == NB_F64) && len >= 8 &&
         !inner_splits(n_out, len);
}

double nbi_cpu_reduce_row_dot(const nbi_group_member *e, const void *x, const void *y,
                              int64_t len) {
  assert(nbi_cpu_reduce_row_dot_ok(e, len, MIN_TASKS));
  double acc = 0; /* F_SUM's initial state, then fold_row's one row sum */
  if (e->dtype == NB_F32)
    acc += nbi_cpu_row_sum_f32[nbi_isa_active()](x, y, len, 0, false);
  else
    acc += nbi_cpu_row_sum_f64[nbi_isa_active()](x, y, len, 0, false);
  return e->af[0] == 1 ? acc : mean_of(acc, e->af[0]);
}

/* ---- softmax and cumsum along one axis --------------------------------------------- */
/* The input is staged as (A, N, B) with N along the axis. B == 1: one task is a
 * row of N contiguous elements. B > 1: one task is a block of w <= COL_BLOCK
 * columns of an (N, B) slab, walked row by row (unit stride inside a row). */

enum { ROW_PREFETCH = 16384 }; /* rows up to this many bytes prefetch the next */

/* softmax_row_T: y[0..n) = softmax (lg: log_softmax) of x[0..n), max-shifted; a
 *   NaN anywhere (or a row of -inf) makes the row NaN, as JAX.
 * softmax_cols_T: the same down each of the w columns of (n, B) slabs x, y. */
#define DEF_SOFTMAX(SUF, FS, T, EXP, MAXF, ATTR, IATTR)                                            \
  /* log_softmax_shift_T: log_softmax's row is y[j] = (x[j] - *mx) - *ls */                        \
  IATTR static inline __attribute__((always_inline)) void log_softmax_shift_##SUF(                 \
      const T *restrict x, int64_t n, T *mx, T *ls) {                                              \
    *mx = MAXF(x, n);                                                                              \
    *ls = (T)log(sum_exp_##FS(x, *mx, n, NULL));                                                   \
  }                                                                                                \
  ATTR static void softmax_row_##SUF(const T *restrict x, T *restrict y, int64_t n, bool lg) {     \
    /* the next row (if any, and short) streams in while this one computes */                      \
    if (n * (int64_t)sizeof(T) <= ROW_PREFETCH)                                                    \
      for (int64_t j = 0; j < n; j += 64 / (int64_t)sizeof(T))                                     \
        __builtin_prefetch(x + n + j);                                                             \
    if (lg) {                                                                                      \
      T mx, ls;                                                                                    \
      log_softmax_shift_##SUF(x, n, &mx, &ls);                                                     \
      for (int64_t j = 0; j < n; j++)                                                              \
        y[j] = (x[j] - mx) - ls;                                                                   \
      return;                                                                                      \
    }                                                                                              \
    T mx = MAXF(x, n);                                                                             \
    T inv = (T)(1.0 / sum_exp_##FS(x, mx, n, y));                                                  \
    for (int64_t j = 0; j < n; j++)                                                                \
      y[j] *= inv;                                                                                 \
  }                                                                                                \
  ATTR static void softmax_cols_##SUF(const T *restrict x, T *restrict y, int64_t n, int64_t B,    \
                                      int64_t w, bool lg) {                                        \
    T m[COL_BLOCK], f[COL_BLOCK];                                                                  \
    double s[COL_BLOCK];                                                                           \
    for (int64_t j = 0; j < w; j++)                                                                \
      m[j] = (T)-INFINITY, s[j] = 0;                                                               \
    for (int64_t i = 0; i < n; i++)                                                                \
      for (int64_t j = 0; j < w; j++)                                                              \
        m[j] = x[i * B + j] > m[j] ? x[i * B + j] : m[j];                                          \
    for (int64_t i = 0; i < n; i++)                                                                \
      for (int64_t j = 0; j < w; j++)                                                              \
        s[j] += (double)EXP(x[i * B + j] - m[j]);                                                  \
    for (int64_t j = 0; j < w; j++)                                                                \
      f[j] = lg ? (T)log(s[j]) : (T)(1.0 / s[j]);                                                  \
    for (int64_t i = 0; i < n; i++) {                                                              \
      if (lg)                                                                                      \
        for (int64_t j = 0; j < w; j++)                                                            \
          y[i * B + j] = (x[i * B + j] - m[j]) - f[j];                                             \
      else                                                                                         \
        for (int64_t j = 0; j < w; j++)                                                            \
          y[i * B + j] = EXP(x[i * B + j] - m[j]) * f[j];                                          \
    }                                                                                              \
  }

/* f32: one variant per ISA (vmath.h), picked at each call; f64 (libm's exp):
 * the load-time clones of HOT. softmax_max_T_S: a row's shift, the max of x[0..n) (n >= 1) as
 * row_extreme_T gives it (NaN if any element is NaN). The vector variants
 * take max instructions and an unordered-compare mask for NaN (4 vector
 * instructions per 8 or 16 lanes against the keys' 7: a sixth of a
 * log_softmax row on AVX2), and row_extreme's keys again when the max is a
 * zero, the one value whose sign a max instruction leaves to the order: the
 * same bits on every ISA. */
#define softmax_max_f32_portable(x, n) row_extreme_f32(x, n, true)
#define softmax_max_f64(x, n) row_extreme_f64(x, n, true)
#if NBI_HAVE_ISA_VARIANTS
NBI_ISA_ATTR_avx2 static inline float softmax_max_f32_avx2(const float *restrict x, int64_t n) {
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, bad = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + 8);
    m0 = _mm256_max_ps(a, m0); /* a NaN in a leaves m0: the mask records it */
    m1 = _mm256_max_ps(b, m1);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
  float lane[8], m = -INFINITY;
  _mm256_storeu_ps(lane, _mm256_max_ps(m0, m1));
  bool nan = _mm256_movemask_ps(bad) != 0;
  for (int k = 0; k < 8; k++)
    m = lane[k] > m ? lane[k] : m;
  for (; j < n; j++) {
    nan = nan || x[j] != x[j];
    m = x[j] > m ? x[j] : m;
  }
  return nan ? NAN : m == 0 ? row_extreme_f32(x, n, true) : m;
}
NBI_ISA_ATTR_avx512 static inline float softmax_max_f32_avx512(const float *restrict x, int64_t n) {
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0;
  __mmask16 bad = 0;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + 16);
    m0 = _mm512_max_ps(a, m0);
    m1 = _mm512_max_ps(b, m1);
    bad |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
  }
  float lane[16], m = -INFINITY;
  _mm512_storeu_ps(lane, _mm512_max_ps(m0, m1));
  bool nan = bad != 0;
  for (int k = 0; k < 16; k++)
    m = lane[k] > m ? lane[k] : m;
  for (; j < n; j++) {
    nan = nan || x[j] != x[j];
    m = x[j] > m ? x[j] : m;
  }
  return nan ? NAN : m == 0 ? row_extreme_f32(x, n, true) : m;
}
#endif

/* row_dot_lsm_f32_S: cross-entropy's row, the sum of p[j] times log_softmax(z)[j] */
#define DEF_SOFTMAX_F32(S, ISA)                                                                    \
  DEF_SOFTMAX(f32_##S, f32, float, vm_expf_nonpos, softmax_max_f32_##S, NBI_ISA_ATTR_##S,          \
              NBI_ISA_ATTR_##S)                                                                    \
  NBI_ISA_ATTR_##S static double row_dot_lsm_f32_##S(const float *restrict p,                      \
                                                     const float *restrict z, int64_t n) {         \
    float mx, ls;                                                                                  \
    log_softmax_shift_f32_##S(z, n, &mx, &ls);                                                     \
    return nbi_cpu_row_sum_lsm_f32[ISA](p, z, n, mx, ls);                                          \
  }
NBI_FOR_ISAS(DEF_SOFTMAX_F32)
DEF_SOFTMAX(f64, f64, double, exp, softmax_max_f64, HOT, )

typedef struct softmax_f32_fns {
  void (*row)(const float *restrict x, float *restrict y, int64_t n, bool lg);
  void (*cols)(const float *restrict x, float *restrict y, int64_t n, int64_t B, int64_t w,
               bool lg);
  double (*dot_lsm)(const float *restrict p, const float *restrict z, int64_t n);
} softmax_f32_fns;
#define SOFTMAX_F32_ENTRY(S, ISA)                                                                  \
  [ISA] = {softmax_row_f32_##S, softmax_cols_f32_##S, row_dot_lsm_f32_##S},
static const softmax_f32_fns softmax_f32[NBI_ISA_COUNT] = {NBI_FOR_ISAS(SOFTMAX_F32_ENTRY)};

bool nbi_cpu_reduce_row_dot_lsm_ok(const nbi_group_member *sum, const nbi_group_member *lsm,
                                   int64_t len, int64_t n_out) {
  return nbi_cpu_reduce_row_dot_ok(sum, len, n_out) && sum->dtype == NB_F32 &&
         lsm->op == NBI_OP_LOG_SOFTMAX && lsm->dtype == NB_F32;
}

double nbi_cpu_reduce_row_dot_lsm(const nbi_group_member *e, const void *p, const void *z,
                                  int64_t len) {
  double acc = 0 + softmax_f32[nbi_isa_active()].dot_lsm(p, z, len); /* as reduce_row_dot */
  return e->af[0] == 1 ? acc : mean_of(acc, e->af[0]);
}

/* cumsum_row_T: y[j] = x[0] + ... + x[j] (floats accumulate in double).
 * cumsum_cols_T: the same down each of the w columns of (n, B) slabs. */
#define DEF_CUMSUM(SUF, T, ACC)                                                                    \
  static void cumsum_row_##SUF(const T *restrict x, T *restrict y, int64_t n) {                    \
    ACC s = 0;                                                                                     \
    for (int64_t j = 0; j < n; j++) {                                                              \
      s += (ACC)x[j];                                                                              \
      y[j] = (T)s;                                                                                 \
    }                                                                                              \
  }                                                                                                \
  HOT static void cumsum_cols_##SUF(const T *restrict x, T *restrict y, int64_t n, int64_t B,      \
                                    int64_t w) {                                                   \
    ACC s[COL_BLOCK] = {0};                                                                        \
    for (int64_t i = 0; i < n; i++)                                                                \
      for (int64_t j = 0; j < w; j++) {                                                            \
        s[j] += (ACC)x[i * B + j];                                                                 \
        y[i * B + j] = (T)s[j];                                                                    \
      }                                                                                            \
  }

DEF_CUMSUM(f32, float, double)
DEF_CUMSUM(f64, double, double)
DEF_CUMSUM(i64, int64_t, uint64_t) /* wraps modulo 2^64 */

/* One task of an axis op on elements from offset off of x and y (compute type
 * ct): a row (B == 1) or w columns of an (n, B) slab. */
static void axis_task(int op, nb_dtype ct, const void *x, void *y, int64_t off, int64_t n,
                      int64_t B, int64_t w) {
  bool lg = op == NBI_OP_LOG_SOFTMAX, rows = B == 1;
  if (ct == NB_I64) { /* cumsum only */
    const int64_t *xi = (const int64_t *)x + off;
    int64_t *yi = (int64_t *)y + off;
    if (rows)
      cumsum_row_i64(xi, yi, n);
    else
      cumsum_cols_i64(xi, yi, n, B, w);
  } else if (ct == NB_F32) {
    const float *xf = (const float *)x + off;
    float *yf = (float *)y + off;
    if (op == NBI_OP_CUMSUM && rows)
      cumsum_row_f32(xf, yf, n);
    else if (op == NBI_OP_CUMSUM)
      cumsum_cols_f32(xf, yf, n, B, w);
    else if (rows)
      softmax_f32[nbi_isa_active()].row(xf, yf, n, lg);
    else
      softmax_f32[nbi_isa_active()].cols(xf, yf, n, B, w, lg);
  } else {
    const double *xd = (const double *)x + off;
    double *yd = (double *)y + off;
    if (op == NBI_OP_CUMSUM && rows)
      cumsum_row_f64(xd, yd, n);
    else if (op == NBI_OP_CUMSUM)
      cumsum_cols_f64(xd, yd, n, B, w);
    else if (rows)
      softmax_row_f64(xd, yd, n, lg);
    else
      softmax_cols_f64(xd, yd, n, B, w, lg);
  }
}

/* in[0] is (A, N, B) around axis attrs.i[0], any strides; out is the same
 * shape, contiguous. Computes into out directly when its dtype is ct. */
static nb_status run_axis_op(const nb_tensor *nd, nbi_view *out, const nbi_view *in, nb_dtype ct) {
  const char *opname = nbi_op_table[nd->op]->name;
  int64_t numel = view_numel(in);
  if (numel == 0) return NB_OK;
  int axis = (int)nd->attrs.i[0];
  const void *x;
  void *owned, *y = out->data;
  if (stage_input(opname, in, ct, numel, &x, &owned)) return NB_ERR_OOM;
  if (out->dtype != ct && !(y = malloc((size_t)numel * nb_dtype_size(ct)))) {
    free(owned);
    return nbi_error(NB_ERR_OOM, "nb_%s: out of memory for %lld elements", opname,
                     (long long)numel);
  }
  int64_t A = 1, N = in->dims[axis], B = 1;
  for (int d = 0; d < axis; d++)
    A *= in->dims[d];
  for (int d = axis + 1; d < in->ndim; d++)
    B *= in->dims[d];
  int64_t nb = ceil_div(B, COL_BLOCK), tasks = A * nb;
  if (numel < NBI_PAR_MIN || tasks < 2) { /* no OpenMP region (one costs ~1 us) */
    for (int64_t t = 0; t < tasks; t++) {
      int64_t c0 = t % nb * COL_BLOCK;
      axis_task(nd->op, ct, x, y, t / nb * N * B + c0, N, B, min64(COL_BLOCK, B - c0));
    }
  } else {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
      int64_t c0 = t % nb * COL_BLOCK;
      axis_task(nd->op, ct, x, y, t / nb * N * B + c0, N, B, min64(COL_BLOCK, B - c0));
    }
  }
  write_out(out, y, ct, numel);
  if (y != out->data) free(y);
  free(owned);
  return NB_OK;
}

nb_status nbi_cpu_softmax(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  return run_axis_op(n, out, in, compute_dtype(in->dtype, true, true));
}

nb_status nbi_cpu_cumsum(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  return run_axis_op(n, out, in, compute_dtype(in->dtype, false, true));
}

/* ---- one row of an axis op, for fused groups ---------------------------------------- */
bool nbi_cpu_axis_row_ok(int op, nb_dtype dt, nb_dtype in_dt) {
  return (op == NBI_OP_SOFTMAX || op == NBI_OP_LOG_SOFTMAX || op == NBI_OP_CUMSUM) &&
         (dt == NB_F32 || dt == NB_F64) && in_dt == dt;
}

void nbi_cpu_axis_row(const nbi_group_member *e, const void *x, void *y, int64_t len) {
  axis_task(e->op, e->dtype, x, y, 0, len, 1, 1); /* run_axis_op's task for one row */
}
