/* src/backends/cpu/k_elementwise.c — elementwise kernels: unary, binary, where,
 * cast.
 *
 * Every op is evaluated in one of three domains picked by the node's compute
 * dtype: float (f32, f16, bf16), double (f64), int64 (i32, i64, bool). Each op's
 * scalar expression is written once in an X-macro list below and instantiated
 * per domain type as a row function over unit-stride or stride-0 operands.
 *
 * The driver walks rows with nbi_iter in units of up to CHUNK elements (the
 * "walks" section): pieces of a long row, or blocks of whole short rows, so a
 * row function always runs on many elements and a single long row
 * parallelizes too; each thread takes one contiguous range of units. Per
 * unit, an operand that already has the domain's type and is one run of
 * stride 0 or 1 is read in place (the f32/f64 fast path: no copies,
 * vectorizable loops); anything else (other dtypes, arbitrary or negative
 * strides, a broadcast row repeated over a block) is first converted or
 * gathered into a chunk buffer. The result goes straight to out when out has
 * the domain's type (or is bool for predicates), else through a buffer that is
 * converted once at the store; outputs of STREAM_MIN bytes or more go out by
 * streaming stores. The row functions and tables are looked up once per call.
 */
#include "k_elementwise.h"
#include "k_linalg.h" /* nbi_cpu_scratch */
#include "k_reduce.h"

#include <math.h>
#include <omp.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#include <stdlib.h>

#include "vmath.h"

/* ---- domains and conversions ---------------------------------------------------- */
typedef enum domain { DOM_F32, DOM_F64, DOM_I64, DOM_COUNT } domain;

static const nb_dtype domain_dtype[DOM_COUNT] = {NB_F32, NB_F64, NB_I64};

static domain domain_of(nb_dtype dt) {
  if (dt == NB_F64) return DOM_F64;
  return nb_dtype_is_float(dt) ? DOM_F32 : DOM_I64;
}

/* Float -> integer: truncation toward zero, saturating, NaN -> 0. */
static int32_t sat_i32(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return INT32_MAX;
  if (v <= -2147483648.0) return INT32_MIN;
  return (int32_t)v;
}
static int64_t sat_i64(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX; /* the literal is 2^63 */
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

/* The f32 nearest x by round-to-odd: x itself when representable, else its
 * neighbour toward zero with the last mantissa bit set. Rounding that to f16 or
 * bf16 (nearest even) equals rounding x directly, which a plain (float) step
 * would not guarantee (double rounding). */
static float f64_to_f32_odd(double x) {
  float f = (float)x;
  if ((double)f == x || isnan(f) || isinf(f)) return f;
  if (fabs((double)f) > fabs(x)) f = nextafterf(f, 0.0f);
  uint32_t u;
  memcpy(&u, &f, 4);
  u |= 1;
  memcpy(&f, &u, 4);
  return f;
}

/* The same for a 64-bit integer, done on the integer: keep the top 24
 * significant bits, fold the rest into a sticky last bit. */
static float i64_to_f32_odd(int64_t v) {
  uint64_t m = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  int sh = m >> 24 ? 40 - __builtin_clzll(m) : 0; /* bits beyond 24 significant */
  if (sh > 0) {
    uint64_t lost = m & ((1ull << sh) - 1);
    m = (m >> sh) | (lost != 0);
  }
  float f = (float)m * (float)(1ull << sh); /* both exact */
  return v < 0 ? -f : f;
}

/* d[j] = src[j * s] converted to the domain's type, j < n; s may be any stride. */
#define GATHER(TYPE, EXPR)                                                                         \
  {                                                                                                \
    const TYPE *p = (const TYPE *)src;                                                             \
    for (int64_t j = 0; j < n; j++) {                                                              \
      TYPE v = p[j * s];                                                                           \
      d[j] = EXPR;                                                                                 \
    }                                                                                              \
  }                                                                                                \
  break;

static void load_f32(float *restrict d, const char *src, nb_dtype dt, int64_t s, int64_t n) {
  switch (dt) {
  case NB_F32: GATHER(float, v)
  case NB_F64: GATHER(double, (float)v)
  case NB_F16: GATHER(uint16_t, nbi_f16_to_f32(v))
  case NB_BF16: GATHER(uint16_t, nbi_bf16_to_f32(v))
  case NB_I32: GATHER(int32_t, (float)v)
  case NB_I64: GATHER(int64_t, (float)v)
  default: GATHER(uint8_t, (float)(v != 0)) /* bool */
  }
}

static void load_f64(double *restrict d, const char *src, nb_dtype dt, int64_t s, int64_t n) {
  switch (dt) {
  case NB_F32: GATHER(float, v)
  case NB_F64: GATHER(double, v)
  case NB_F16: GATHER(uint16_t, nbi_f16_to_f32(v))
  case NB_BF16: GATHER(uint16_t, nbi_bf16_to_f32(v))
  case NB_I32: GATHER(int32_t, v)
  case NB_I64: GATHER(int64_t, (double)v)
  default: GATHER(uint8_t, v != 0) /* bool */
  }
}

static void load_i64(int64_t *restrict d, const char *src, nb_dtype dt, int64_t s, int64_t n) {
  switch (dt) {
  case NB_I32: GATHER(int32_t, v)
  case NB_I64: GATHER(int64_t, v)
  case NB_BOOL: GATHER(uint8_t, v != 0)
  default: /* float dtypes: truncation toward zero, saturating */
    for (int64_t j = 0; j < n; j++)
      d[j] = sat_i64(nbi_load_f64(src, dt, j * s));
    break;
  }
}
#undef GATHER

static void load(domain dom, void *d, const char *src, nb_dtype dt, int64_t s, int64_t n) {
  switch (dom) {
  case DOM_F32: load_f32(d, src, dt, s, n); break;
  case DOM_F64: load_f64(d, src, dt, s, n); break;
  default: load_i64(d, src, dt, s, n); break;
  }
}

/* dst[j] = x[j] converted to dt, both contiguous, j < n. */
#define SCATTER(TYPE, EXPR)                                                                        \
  {                                                                                                \
    TYPE *p = (TYPE *)dst;                                                                         \
    for (int64_t j = 0; j < n; j++) {                                                              \
      p[j] = EXPR;                                                                                 \
    }                                                                                              \
  }                                                                                                \
  break;

static void store_f32(char *dst, nb_dtype dt, const float *restrict x, int64_t n) {
  switch (dt) {
  case NB_F32: SCATTER(float, x[j])
  case NB_F64: SCATTER(double, x[j])
  case NB_F16: SCATTER(uint16_t, nbi_f32_to_f16(x[j]))
  case NB_BF16: SCATTER(uint16_t, nbi_f32_to_bf16(x[j]))
  case NB_I32: SCATTER(int32_t, sat_i32(x[j]))
  case NB_I64: SCATTER(int64_t, sat_i64(x[j]))
  default: SCATTER(uint8_t, x[j] != 0) /* bool */
  }
}

static void store_f64(char *dst, nb_dtype dt, const double *restrict x, int64_t n) {
  switch (dt) {
  case NB_F32: SCATTER(float, (float)x[j])
  case NB_F64: SCATTER(double, x[j])
  case NB_F16: SCATTER(uint16_t, nbi_f32_to_f16(f64_to_f32_odd(x[j])))
  case NB_BF16: SCATTER(uint16_t, nbi_f32_to_bf16(f64_to_f32_odd(x[j])))
  case NB_I32: SCATTER(int32_t, sat_i32(x[j]))
  case NB_I64: SCATTER(int64_t, sat_i64(x[j]))
  default: SCATTER(uint8_t, x[j] != 0) /* bool */
  }
}

/* Integers narrow by wrapping (two's complement), as NumPy and JAX. */
static void store_i64(char *dst, nb_dtype dt, const int64_t *restrict x, int64_t n) {
  switch (dt) {
  case NB_F32: SCATTER(float, (float)x[j])
  case NB_F64: SCATTER(double, (double)x[j])
  case NB_F16: SCATTER(uint16_t, nbi_f32_to_f16(i64_to_f32_odd(x[j])))
  case NB_BF16: SCATTER(uint16_t, nbi_f32_to_bf16(i64_to_f32_odd(x[j])))
  case NB_I32: SCATTER(int32_t, (int32_t)(uint32_t)(uint64_t)x[j])
  case NB_I64: SCATTER(int64_t, x[j])
  default: SCATTER(uint8_t, x[j] != 0) /* bool */
  }
}
#undef SCATTER

static void store(domain dom, char *dst, nb_dtype dt, const void *x, int64_t n) {
  switch (dom) {
  case DOM_F32: store_f32(dst, dt, x, n); break;
  case DOM_F64: store_f64(dst, dt, x, n); break;
  default: store_i64(dst, dt, x, n); break;
  }
}

/* ---- scalar helpers used by the op expressions ----------------------------------- */
/* Wrapping int64 arithmetic (unsigned, so overflow is defined). */
static inline int64_t wrap_add(int64_t a, int64_t b) {
  return (int64_t)((uint64_t)a + (uint64_t)b);
}
static inline int64_t wrap_sub(int64_t a, int64_t b) {
  return (int64_t)((uint64_t)a - (uint64_t)b);
}
static inline int64_t wrap_mul(int64_t a, int64_t b) {
  return (int64_t)((uint64_t)a * (uint64_t)b);
}

/* a ** b exactly (wrapping) by repeated squaring; a negative exponent gives 0
 * unless |a| is 1. */
static inline int64_t int_pow(int64_t a, int64_t b) {
  if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;
  uint64_t r = 1, x = (uint64_t)a;
  for (; b; b >>= 1) {
    if (b & 1) r *= x;
    x *= x;
  }
  return (int64_t)r;
}

/* Remainder with the sign of the divisor (NumPy); 0 when b is 0. */
static inline int64_t int_mod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0; /* -1: INT64_MIN % -1 would trap */
  int64_t r = a % b;
  return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;
}

/* The same for floats, as NumPy's divmod: NaN when b is 0, a zero result takes
 * b's sign. Named so that FN(floor_mod) picks the float or double one. */
static inline double floor_mod(double a, double b) {
  double r = fmod(a, b);
  if (r == 0) return copysign(0.0, b);
  return (r < 0) != (b < 0) ? r + b : r;
}
static inline float floor_modf(float a, float b) {
  float r = fmodf(a, b);
  if (r == 0) return copysignf(0.0f, b);
  return (r < 0) != (b < 0) ? r + b : r;
}

/* The double counterparts of vmath.h's functions: libm. */
static inline double dm_exp(double x) { return exp(x); }
static inline double dm_expm1(double x) { return expm1(x); }
static inline double dm_log(double x) { return log(x); }
static inline double dm_log1p(double x) { return log1p(x); }
static inline double dm_tanh(double x) { return tanh(x); }
static inline double dm_erf(double x) { return erf(x); }
static inline double dm_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static inline double dm_silu(double x) { return x / (1 + exp(-x)); }
/* x Phi(x), no cancellation for x << 0 */
static inline double dm_gelu(double x) { return 0.5 * x * erfc(-x * M_SQRT1_2); }
static inline double dm_softplus(double x) { return (x > 0 ? x : 0) + log1p(exp(-fabs(x))); }

/* ---- the op lists: ../ew_formulas.h (shared with the CUDA generator) ------------- */
#include "../ew_formulas.h"

/* ---- row functions ----------------------------------------------------------------- */
/* Operands are unit-stride (s = 1) or one broadcast value (s = 0); o is
 * contiguous; n elements. The stride cases are separate loops so each one
 * vectorizes. Every row function is compiled once per ISA (suffix S: portable,
 * avx2, avx512; NBI_FOR_ISAS) and the tables below pick the active ISA's. The
 * same operations run in every variant (no FMA contraction), so results do not
 * depend on the ISA.
 * Aliasing: o may be the very buffer of a unit-stride operand (an in-place
 * step, graph.c "in place"), never a partial overlap. Element i is read only
 * to write element i, so the reorderings restrict allows (later loads hoisted
 * above earlier stores) see no changed value. Strictly, C11 makes such
 * same-index aliasing of restrict pointers undefined: keep every row function
 * free of cross-index reads, and o never read. */
typedef void (*unary_row)(void *restrict o, const void *restrict a, int64_t sa, int64_t n);
typedef void (*binary_row)(void *restrict o, const void *restrict a, int64_t sa,
                           const void *restrict b, int64_t sb, int64_t n);
typedef void (*where_row)(void *restrict o, const uint8_t *restrict c, int64_t sc,
                          const void *restrict a, int64_t sa, const void *restrict b, int64_t sb,
                          int64_t n);

#define DEF_UNARY(NAME, S, TO, TI, EXPR)                                                           \
  NBI_ISA_ATTR_##S static void NAME(void *restrict ov, const void *restrict av, int64_t sa,        \
                                    int64_t n) {                                                   \
    TO *restrict o = ov;                                                                           \
    const TI *restrict pa = av;                                                                    \
    if (sa == 0) {                                                                                 \
      TI x = pa[0];                                                                                \
      TO v = (TO)(EXPR);                                                                           \
      for (int64_t j = 0; j < n; j++)                                                              \
        o[j] = v;                                                                                  \
      return;                                                                                      \
    }                                                                                              \
    for (int64_t j = 0; j < n; j++) {                                                              \
      TI x = pa[j];                                                                                \
      o[j] = (TO)(EXPR);                                                                           \
    }                                                                                              \
  }

#define DEF_BINARY(NAME, S, TO, TI, EXPR)                                                          \
  NBI_ISA_ATTR_##S static void NAME(void *restrict ov, const void *restrict av, int64_t sa,        \
                                    const void *restrict bv, int64_t sb, int64_t n) {              \
    TO *restrict o = ov;                                                                           \
    const TI *restrict pa = av, *restrict pb = bv;                                                 \
    if (sa && sb) {                                                                                \
      for (int64_t j = 0; j < n; j++) {                                                            \
        TI a = pa[j], b = pb[j];                                                                   \
        o[j] = (TO)(EXPR);                                                                         \
      }                                                                                            \
    } else if (sb) {                                                                               \
      TI a = pa[0];                                                                                \
      for (int64_t j = 0; j < n; j++) {                                                            \
        TI b = pb[j];                                                                              \
        o[j] = (TO)(EXPR);                                                                         \
      }                                                                                            \
    } else if (sa) {                                                                               \
      TI b = pb[0];                                                                                \
      for (int64_t j = 0; j < n; j++) {                                                            \
        TI a = pa[j];                                                                              \
        o[j] = (TO)(EXPR);                                                                         \
      }                                                                                            \
    } else {                                                                                       \
      TI a = pa[0], b = pb[0];                                                                     \
      TO v = (TO)(EXPR);                                                                           \
      for (int64_t j = 0; j < n; j++)                                                              \
        o[j] = v;                                                                                  \
    }                                                                                              \
  }

#define DEF_WHERE(NAME, S, T)                                                                      \
  NBI_ISA_ATTR_##S static void NAME(void *restrict ov, const uint8_t *restrict c, int64_t sc,      \
                                    const void *restrict av, int64_t sa, const void *restrict bv,  \
                                    int64_t sb, int64_t n) {                                       \
    T *restrict o = ov;                                                                            \
    const T *restrict a = av, *restrict b = bv;                                                    \
    if (sc == 1 && sa == 1 && sb == 0) { /* where(c, x, scalar): the VJPs of relu, max... */       \
      T y = b[0];                                                                                  \
      for (int64_t j = 0; j < n; j++)                                                              \
        o[j] = c[j] ? a[j] : y;                                                                    \
      return;                                                                                      \
    }                                                                                              \
    for (int64_t j = 0; j < n; j++) { /* both loaded, then selected: no branch to mispredict */    \
      T x = a[j * sa], y = b[j * sb];                                                              \
      o[j] = c[j * sc] ? x : y;                                                                    \
    }                                                                                              \
  }

/* float */
#define T float
#define FN(name) name##f
#define VM(name) vm_##name##f
#define UN(S, ID, EXPR) DEF_UNARY(un_##ID##_f32_##S, S, float, float, EXPR)
#define BIN(S, ID, EXPR) DEF_BINARY(bin_##ID##_f32_##S, S, float, float, EXPR)
#define UNP(S, ID, EXPR) DEF_UNARY(un_##ID##_f32_##S, S, uint8_t, float, EXPR)
#define BINP(S, ID, EXPR) DEF_BINARY(bin_##ID##_f32_##S, S, uint8_t, float, EXPR)
#define ROWS(S, ISA)                                                                               \
  EW_UNARY_FLOAT(UN, S)                                                                            \
  EW_BINARY_FLOAT(BIN, S)                                                                          \
  EW_UNARY_PRED(UNP, S)                                                                            \
  EW_BINARY_PRED(BINP, S)                                                                          \
  DEF_WHERE(where_f32_##S, S, float)
NBI_FOR_ISAS(ROWS)
#undef T
#undef FN
#undef VM
#undef UN
#undef BIN
#undef UNP
#undef BINP
#undef ROWS

/* double */
#define T double
#define FN(name) name
#define VM(name) dm_##name
#define UN(S, ID, EXPR) DEF_UNARY(un_##ID##_f64_##S, S, double, double, EXPR)
#define BIN(S, ID, EXPR) DEF_BINARY(bin_##ID##_f64_##S, S, double, double, EXPR)
#define UNP(S, ID, EXPR) DEF_UNARY(un_##ID##_f64_##S, S, uint8_t, double, EXPR)
#define BINP(S, ID, EXPR) DEF_BINARY(bin_##ID##_f64_##S, S, uint8_t, double, EXPR)
#define ROWS(S, ISA)                                                                               \
  EW_UNARY_FLOAT(UN, S)                                                                            \
  EW_BINARY_FLOAT(BIN, S)                                                                          \
  EW_UNARY_PRED(UNP, S)                                                                            \
  EW_BINARY_PRED(BINP, S)                                                                          \
  DEF_WHERE(where_f64_##S, S, double)
NBI_FOR_ISAS(ROWS)
#undef T
#undef FN
#undef VM
#undef UN
#undef BIN
#undef UNP
#undef BINP
#undef ROWS

/* int64 */
#define UN(S, ID, EXPR) DEF_UNARY(un_##ID##_i64_##S, S, int64_t, int64_t, EXPR)
#define BIN(S, ID, EXPR) DEF_BINARY(bin_##ID##_i64_##S, S, int64_t, int64_t, EXPR)
#define UNP(S, ID, EXPR) DEF_UNARY(un_##ID##_i64_##S, S, uint8_t, int64_t, EXPR)
#define BINP(S, ID, EXPR) DEF_BINARY(bin_##ID##_i64_##S, S, uint8_t, int64_t, EXPR)
#define ROWS(S, ISA)                                                                               \
  EW_UNARY_INT(UN, S)                                                                              \
  EW_BINARY_INT(BIN, S)                                                                            \
  EW_UNARY_PRED(UNP, S)                                                                            \
  EW_BINARY_PRED(BINP, S)                                                                          \
  DEF_WHERE(where_i64_##S, S, int64_t)
NBI_FOR_ISAS(ROWS)
#undef UN
#undef BIN
#undef UNP
#undef BINP
#undef ROWS

/* ---- dispatch tables, indexed [isa] then [domain][op] -------------------------------- */
#define ENTRY_UN_F32(S, ID, EXPR) [NBI_OP_##ID] = un_##ID##_f32_##S,
#define ENTRY_UN_F64(S, ID, EXPR) [NBI_OP_##ID] = un_##ID##_f64_##S,
#define ENTRY_UN_I64(S, ID, EXPR) [NBI_OP_##ID] = un_##ID##_i64_##S,
#define ENTRY_BIN_F32(S, ID, EXPR) [NBI_OP_##ID] = bin_##ID##_f32_##S,
#define ENTRY_BIN_F64(S, ID, EXPR) [NBI_OP_##ID] = bin_##ID##_f64_##S,
#define ENTRY_BIN_I64(S, ID, EXPR) [NBI_OP_##ID] = bin_##ID##_i64_##S,
#define ENTRY_PRED(S, ID, EXPR) [NBI_OP_##ID] = true,

typedef struct ew_rows {
  unary_row un[DOM_COUNT][NBI_OP_COUNT];
  binary_row bin[DOM_COUNT][NBI_OP_COUNT];
  where_row where[DOM_COUNT];
} ew_rows;

#define ROWS_OF(S, ISA)                                                                            \
  [ISA] = {                                                                                        \
      .un = {[DOM_F32] = {EW_UNARY_FLOAT(ENTRY_UN_F32, S) EW_UNARY_PRED(ENTRY_UN_F32, S)},         \
             [DOM_F64] = {EW_UNARY_FLOAT(ENTRY_UN_F64, S) EW_UNARY_PRED(ENTRY_UN_F64, S)},         \
             [DOM_I64] = {EW_UNARY_INT(ENTRY_UN_I64, S) EW_UNARY_PRED(ENTRY_UN_I64, S)}},          \
      .bin = {[DOM_F32] = {EW_BINARY_FLOAT(ENTRY_BIN_F32, S) EW_BINARY_PRED(ENTRY_BIN_F32, S)},    \
              [DOM_F64] = {EW_BINARY_FLOAT(ENTRY_BIN_F64, S) EW_BINARY_PRED(ENTRY_BIN_F64, S)},    \
              [DOM_I64] = {EW_BINARY_INT(ENTRY_BIN_I64, S) EW_BINARY_PRED(ENTRY_BIN_I64, S)}},     \
      .where = {where_f32_##S, where_f64_##S, where_i64_##S}},
static const ew_rows rows_by_isa[NBI_ISA_COUNT] = {NBI_FOR_ISAS(ROWS_OF)};
#undef ROWS_OF

/* The executors take the active ISA's table (rows_by_isa[nbi_isa_active()])
 * once per call, so nbi_isa_select takes effect at the next kernel. Every ISA
 * has the same ops: the portable table answers which ops have a row function. */
/* Ops whose row function writes bool directly. */
static const bool is_pred[NBI_OP_COUNT] = {EW_UNARY_PRED(ENTRY_PRED, portable)
                                               EW_BINARY_PRED(ENTRY_PRED, portable)};

/* ---- driver ---------------------------------------------------------------------------- */
enum { CHUNK = 512, FUSE_CHUNK = 256 };
_Static_assert(FUSE_CHUNK <= CHUNK, "a fused unit fits a chunk buffer");

/* What one kernel call does, shared read-only by the threads. */
typedef struct ew_plan {
  int n_in; /* 1, 2, or 3 (where) */
  bool is_where, is_cast;
  nb_dtype cdt;    /* compute dtype */
  domain dom;      /* its domain */
  int64_t des;     /* the domain's element size (walks) */
  bool direct_out; /* the row function writes out itself */
  nb_dtype out_dt;
  unary_row un; /* the active ISA's row function, looked up once per call */
  binary_row bin;
  where_row where;
} ew_plan;

typedef union chunk_buf {
  float f[CHUNK];
  double d[CHUNK];
  int64_t i[CHUNK];
} chunk_buf;

/* d[0..n) = src[j * s] converted to the domain's type. An integer operand of an
 * f16/bf16 computation is first rounded to that dtype, as if cast to it. */
static void convert(const ew_plan *pl, void *d, const char *src, nb_dtype dt, int64_t s,
                    int64_t n) {
  if (pl->dom == DOM_F32 && dt != pl->cdt && pl->cdt != NB_F32) {
    int64_t wide[CHUNK];
    uint16_t half[CHUNK];
    load_i64(wide, src, dt, s, n);
    store_i64((char *)half, pl->cdt, wide, n);
    load_f32(d, (const char *)half, pl->cdt, 1, n);
  } else {
    load(pl->dom, d, src, dt, s, n);
  }
}

/* Points *p at operand values in the domain's type: in place when src already
 * has that type and stride 0 or 1, else converted into buf (one value for a
 * broadcast operand). Returns the stride of *p (0 or 1). */
static int64_t operand(const ew_plan *pl, const char *src, nb_dtype dt, int64_t s, int64_t n,
                       void *buf, const void **p) {
  if (dt == domain_dtype[pl->dom] && (s == 0 || s == 1)) {
    *p = src;
    return s;
  }
  convert(pl, buf, src, dt, s, s == 0 ? 1 : n);
  *p = buf;
  return s == 0 ? 0 : 1;
}

/* ---- walks -------------------------------------------------------------------------------
 * Both executors cut an nbi_iter's rows (n elements each) into units of at most
 * `chunk` elements: pieces of one row when n >= chunk, else blocks of chunk / n
 * whole rows (one row per unit when an output is not flat), so the row
 * functions run on a chunk's worth of elements however short the rows. Over a
 * block, a flat operand (nbi_iter_flat) is one run read in place; any other is
 * gathered row by row into a buffer. Outputs have stride 1 along the row. Each
 * thread takes one contiguous range of units and steps through it with
 * nbi_iter_next (one division per dim per range, not per unit). */
typedef struct ew_walk {
  _Alignas(64) nbi_iter it; /* own cache lines: the threads only read them */
  int64_t rows, n, chunk;
  int64_t b;       /* rows per unit: > 1 for blocks */
  int64_t per_row; /* units per row: > 1 for pieces */
  int64_t units;
  char *base[NBI_ITER_MAX_OPS];
  nb_dtype dt[NBI_ITER_MAX_OPS];
  int64_t es[NBI_ITER_MAX_OPS]; /* element size */
  int64_t s[NBI_ITER_MAX_OPS];  /* stride along the row */
  bool flat[NBI_ITER_MAX_OPS];
  bool same_row[NBI_ITER_MAX_OPS]; /* every row is row 0 (a broadcast row) */
  bool stream;                     /* outputs go out by stream_out */
} ew_walk;

/* Outputs of STREAM_MIN bytes or more (per call, all together; far beyond the
 * L2s) that the row functions write in the domain's type are computed into
 * scratch and copied out with streaming stores. Regular stores to such an
 * output miss the caches, and as stores retire in order, the scratch stores
 * of the next members queue behind them until the store buffer fills and the
 * row functions stall (measured: a 5-op f32 chain ran at 0.5x a STREAM triad;
 * streamed, above 0.8x). Streamed lines need no read for ownership either. */
enum { STREAM_MIN = 16 << 20 };

static void stream_out(char *restrict d, const char *restrict src, int64_t bytes) {
#if defined(__SSE2__)
  int64_t j = (int64_t)(-(uintptr_t)d & 15); /* to a 16-byte boundary */
  j = j < bytes ? j : bytes;
  memcpy(d, src, (size_t)j);
  for (; j + 16 <= bytes; j += 16)
    _mm_stream_si128((__m128i *)(d + j), _mm_loadu_si128((const __m128i *)(src + j)));
  memcpy(d + j, src + j, (size_t)(bytes - j));
#else
  memcpy(d, src, (size_t)bytes);
#endif
}

/* After a thread's streamed stores (if stream): orders them before what
 * follows (the region's end, where other threads may read them). */
static void stream_end(bool stream) {
#if defined(__SSE2__)
  if (stream) _mm_sfence();
#else
  (void)stream;
#endif
}

/* views[0..n_out) are the outputs. */
static void walk_init(ew_walk *w, int n_ops, const nbi_view *const *views, int n_out,
                      int64_t chunk) {
  nbi_iter_init(&w->it, n_ops, views);
  int last = w->it.ndim - 1;
  w->rows = nbi_iter_rows(&w->it);
  w->n = w->it.dims[last];
  w->chunk = chunk;
  bool block = w->n < chunk;
  int64_t out_bytes = 0;
  for (int q = 0; q < n_ops; q++) {
    w->base[q] = views[q]->data;
    w->dt[q] = views[q]->dtype;
    w->es[q] = (int64_t)nb_dtype_size(w->dt[q]);
    w->s[q] = w->it.strides[q][last];
    w->flat[q] = nbi_iter_flat(&w->it, q);
    w->same_row[q] = true;
    for (int d = 0; d < last; d++)
      w->same_row[q] = w->same_row[q] && w->it.strides[q][d] == 0;
    if (q < n_out && !w->flat[q]) block = false;
    if (q < n_out) out_bytes += w->es[q];
  }
  w->stream = w->rows * w->n * out_bytes >= STREAM_MIN;
  w->b = block && w->n > 0 ? chunk / w->n : 1;
  w->per_row = w->n > chunk ? (w->n + chunk - 1) / chunk : 1;
  w->units = (w->rows + w->b - 1) / w->b * w->per_row;
}

/* A unit of a walk: nr rows from row r (at pos), or piece c of row r. */
typedef struct ew_unit {
  nbi_iter_pos pos;
  int64_t r, c;
  int64_t nr, j0, len; /* rows, first element in the row, elements */
} ew_unit;

static void unit_set(const ew_walk *w, ew_unit *u) {
  u->nr = w->rows - u->r < w->b ? w->rows - u->r : w->b;
  u->j0 = u->c * w->chunk;
  u->len = w->b > 1 ? u->nr * w->n : (w->n - u->j0 < w->chunk ? w->n - u->j0 : w->chunk);
}

static void unit_seek(const ew_walk *w, ew_unit *u, int64_t k) {
  u->r = k / w->per_row * w->b;
  u->c = k % w->per_row;
  nbi_iter_seek(&w->it, u->r, &u->pos);
  unit_set(w, u);
}

static void unit_next(const ew_walk *w, ew_unit *u) {
  if (++u->c == w->per_row) {
    u->c = 0;
    int d = w->it.ndim - 2;                                /* the rows' innermost dim */
    if (d >= 0 && u->pos.idx[d] + u->nr < w->it.dims[d]) { /* no carry */
      u->pos.idx[d] += u->nr;
      for (int q = 0; q < w->it.n_ops; q++)
        u->pos.off[q] += u->nr * w->it.strides[q][d];
    } else {
      for (int64_t i = 0; i < u->nr; i++)
        nbi_iter_next(&w->it, &u->pos);
    }
    u->r += u->nr;
  }
  unit_set(w, u);
}

/* Operand q's first element in unit u. */
static inline char *unit_at(const ew_walk *w, const ew_unit *u, int q) {
  return w->base[q] + (u->pos.off[q] + u->j0 * w->s[q]) * w->es[q];
}

/* d[0..n) = src[j * s]: converted to the domain's type, or bytes as they are
 * (cond: a where's bool condition). */
static void fetch(const ew_plan *pl, bool cond, void *d, const char *src, nb_dtype dt, int64_t s,
                  int64_t n) {
  if (!cond) {
    convert(pl, d, src, dt, s, n);
    return;
  }
  for (int64_t j = 0; j < n; j++)
    ((uint8_t *)d)[j] = (uint8_t)src[j * s];
}

/* Operand q of unit u for a row function, as operand() gives it (cond: read
 * as bytes). A non-flat operand of a block is gathered into buf row by row (a
 * broadcast row: once, then copied). Returns the stride of *p (0 or 1). */
static int64_t unit_operand(const ew_plan *pl, const ew_walk *w, const ew_unit *u, int q, bool cond,
                            void *buf, const void **p) {
  int64_t s = w->s[q], n = w->n;
  const char *src = unit_at(w, u, q);
  *p = buf;
  if (u->nr == 1 || w->flat[q]) {
    if (!cond) return operand(pl, src, w->dt[q], s, u->len, buf, p);
    if (s == 0 || s == 1) {
      *p = src;
      return s;
    }
    fetch(pl, true, buf, src, w->dt[q], s, u->len);
    return 1;
  }
  int64_t row = n * (cond ? 1 : pl->des); /* bytes */
  if (w->same_row[q]) {
    fetch(pl, cond, buf, src, w->dt[q], s, n);
    for (int64_t i = 1; i < u->nr; i *= 2)
      memcpy((char *)buf + i * row, buf, (size_t)((i < u->nr - i ? i : u->nr - i) * row));
    return 1;
  }
  nbi_iter_pos pos = u->pos;
  for (int64_t i = 0; i < u->nr; i++) {
    fetch(pl, cond, (char *)buf + i * row, w->base[q] + pos.off[q] * w->es[q], w->dt[q], s, n);
    nbi_iter_next(&w->it, &pos);
  }
  return 1;
}

/* Runs BODY for units [u0, u1) of w, the unit in U: a thread's part. */
#define WALK_RANGE(w, u0, u1, U, BODY)                                                             \
  do {                                                                                             \
    ew_unit U;                                                                                     \
    for (int64_t k_ = (u0); k_ < (u1); k_++) {                                                     \
      if (k_ == (u0))                                                                              \
        unit_seek((w), &U, k_);                                                                    \
      else                                                                                         \
        unit_next((w), &U);                                                                        \
      BODY;                                                                                        \
    }                                                                                              \
  } while (0)

/* ---- single ops --------------------------------------------------------------------------
 * Operand 0 of the walk is out, operand k + 1 input k. */
static void run_unit(const ew_plan *pl, const ew_walk *w, const ew_unit *u, chunk_buf *buf) {
  char *out = unit_at(w, u, 0);
  int64_t n = u->len;
  domain dom = pl->dom;
  if (pl->is_cast) { /* load in the source's domain, store converting */
    const char *src = unit_at(w, u, 1);
    nb_dtype dt = w->dt[1];
    int64_t s = w->s[1];
    if (u->nr > 1 && !w->flat[1]) { /* gathered: the domain's type, contiguous */
      const void *p;
      unit_operand(pl, w, u, 1, false, &buf[1], &p);
      src = p;
      dt = domain_dtype[dom];
      s = 1;
    }
    if (pl->out_dt == domain_dtype[dom]) {
      load(dom, out, src, dt, s, n);
    } else if (dt == domain_dtype[dom] && s == 1) {
      store(dom, out, pl->out_dt, src, n);
    } else {
      load(dom, &buf[0], src, dt, s, n);
      store(dom, out, pl->out_dt, &buf[0], n);
    }
    return;
  }
  const void *p[3];
  int64_t ps[3];
  for (int k = 0; k < pl->n_in; k++)
    ps[k] = unit_operand(pl, w, u, k + 1, pl->is_where && k == 0, &buf[k], &p[k]);
  void *o = pl->direct_out && !w->stream ? (void *)out : (void *)&buf[3];
  if (pl->is_where)
    pl->where(o, p[0], ps[0], p[1], ps[1], p[2], ps[2], n);
  else if (pl->n_in == 1)
    pl->un(o, p[0], ps[0], n);
  else
    pl->bin(o, p[0], ps[0], p[1], ps[1], n);
  if (!pl->direct_out)
    store(dom, out, pl->out_dt, o, n);
  else if (w->stream)
    stream_out(out, o, n * w->es[0]);
}

static void run_range(const ew_plan *pl, const ew_walk *w, int64_t u0, int64_t u1) {
  chunk_buf buf[4]; /* three operands, the result */
  WALK_RANGE(w, u0, u1, u, run_unit(pl, w, &u, buf));
  stream_end(w->stream);
}

/* This thread's share [*u0, *u1) of units, contiguous. */
static void thread_range(int64_t units, int64_t *u0, int64_t *u1) {
  int t = omp_get_thread_num(), nt = omp_get_num_threads();
  *u0 = units * t / nt;
  *u1 = units * (t + 1) / nt;
}

/* Broadcasts the inputs to out and walks the rows, in parallel when the work
 * is large. Small work never enters an OpenMP region (even one with a false if
 * clause costs about a microsecond). */
static void run(const ew_plan *pl, nbi_view *out, const nbi_view *in) {
  nb_shape shape = {.ndim = out->ndim};
  memcpy(shape.dims, out->dims, sizeof shape.dims);
  nbi_view v[3];
  const nbi_view *views[4] = {out};
  for (int k = 0; k < pl->n_in; k++) {
    v[k] = nbi_view_broadcast(&in[k], &shape);
    views[k + 1] = &v[k];
  }
  ew_walk w;
  walk_init(&w, pl->n_in + 1, views, 1, CHUNK);
  if (w.rows * w.n < NBI_PAR_MIN || w.units < 2) {
    run_range(pl, &w, 0, w.units);
    return;
  }
#pragma omp parallel
  {
    int64_t u0, u1;
    thread_range(w.units, &u0, &u1);
    run_range(pl, &w, u0, u1);
  }
}

nb_status nbi_cpu_elementwise(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  /* out is n's shape; in[k] (k < n->n_in) broadcast to it; compute dtype in attrs.i[0] */
  ew_plan pl = {.n_in = n->n_in, .is_where = n->op == NBI_OP_WHERE, .out_dt = out->dtype};
  pl.cdt = (nb_dtype)n->attrs.i[0];
  pl.dom = domain_of(pl.cdt);
  pl.des = (int64_t)nb_dtype_size(domain_dtype[pl.dom]);
  const ew_rows *rt = &rows_by_isa[nbi_isa_active()];
  if (pl.is_where) {
    pl.where = rt->where[pl.dom];
  } else {
    if (pl.n_in == 1)
      pl.un = rt->un[pl.dom][n->op];
    else
      pl.bin = rt->bin[pl.dom][n->op];
    if (!pl.un && !pl.bin)
      return nbi_error(NB_ERR_INTERNAL, "nb_eval: op %s has no kernel for compute dtype %s",
                       nbi_op_table[n->op]->name, nb_dtype_name(pl.cdt));
  }
  pl.direct_out = is_pred[n->op] || pl.out_dt == domain_dtype[pl.dom];
  run(&pl, out, in);
  return NB_OK;
}

nb_status nbi_cpu_cast(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  /* out has in[0]'s shape, n's dtype */
  (void)n;
  ew_plan pl = {.n_in = 1, .is_cast = true, .out_dt = out->dtype};
  pl.cdt = in[0].dtype;
  pl.dom = domain_of(pl.cdt);
  pl.des = (int64_t)nb_dtype_size(domain_dtype[pl.dom]);
  run(&pl, out, in);
  return NB_OK;
}

/* ---- fused groups ------------------------------------------------------------------------
 * A run of elementwise nodes of one float domain and one shape, evaluated in one
 * pass over the units of one walk: per unit, each member's row function runs
 * once on the unit's elements, into a per-thread scratch buffer that later
 * members read, so values used only inside the group never reach memory; the
 * members the planner marks `store` are written to their buffers (the walk's
 * outputs; later members read them back from there, or from scratch when the
 * walk streams). Operands from outside the group are the walk's inputs, read
 * as the single-op kernel reads them. The plan resolves every member's row
 * function, operands and scratch slot once per call. */

/* (View members, nbi_fuse_view, are copies in both executors.) */
bool nbi_cpu_elementwise_fusible(const nb_tensor *n) {
  if (nbi_cpu_kernel_of(n->op) != nbi_cpu_elementwise || is_pred[n->op]) return false;
  nb_dtype cdt = (nb_dtype)n->attrs.i[0];
  if ((cdt != NB_F32 && cdt != NB_F64) || n->dtype != cdt) return false;
  if (n->op == NBI_OP_WHERE) return true;
  const ew_rows *rt = &rows_by_isa[NBI_ISA_PORTABLE];
  return n->n_in == 1 ? rt->un[domain_of(cdt)][n->op] != NULL
                      : rt->bin[domain_of(cdt)][n->op] != NULL;
}

typedef enum member_kind { M_VIEW, M_WHERE, M_UNARY, M_BINARY } member_kind;

typedef struct fused_member {
  member_kind kind;
  int n_in;
  int src[3]; /* operand: an earlier member, or -1 - its walk operand */
  int out;    /* the walk output it is stored to, or -1 */
  int val;    /* its scratch slot (freed after its last reader), or -1: not
                 stored, or stored when the walk does not stream */
  unary_row un;
  binary_row bin;
  where_row where;
} fused_member;

typedef struct fused_plan {
  _Alignas(64) int m; /* own cache lines, as ew_walk */
  ew_plan pl;         /* domain, compute dtype, element size: for operand conversions */
  fused_member mb[NBI_FUSE_MAX];
} fused_plan;

/* o[0..n) = p[0..n) (s = 1) or n copies of p[0] (s = 0), es bytes each: a
 * view member. */
static void copy_row(size_t es, void *restrict o, const void *restrict p, int64_t s, int64_t n) {
  if (s) {
    memcpy(o, p, (size_t)n * es);
    return;
  }
  for (int64_t j = 0; j < n; j++)
    memcpy((char *)o + (size_t)j * es, p, es);
}

static void fused_unit(const fused_plan *fp, const ew_walk *w, const ew_unit *u, char *val,
                       chunk_buf *tmp) {
  const void *mv[NBI_FUSE_MAX]; /* each member's values, contiguous */
  int64_t n = u->len;
  for (int k = 0; k < fp->m; k++) {
    const fused_member *mb = &fp->mb[k];
    const void *p[3];
    int64_t ps[3];
    for (int q = 0; q < mb->n_in; q++) {
      if (mb->src[q] >= 0) {
        p[q] = mv[mb->src[q]];
        ps[q] = 1;
      } else {
        ps[q] = unit_operand(&fp->pl, w, u, -1 - mb->src[q], mb->kind == M_WHERE && q == 0, &tmp[q],
                             &p[q]);
      }
    }
    void *o = mb->val < 0 ? (void *)unit_at(w, u, mb->out)
                          : (void *)(val + (int64_t)mb->val * FUSE_CHUNK * fp->pl.des);
    switch (mb->kind) {
    case M_VIEW: copy_row((size_t)fp->pl.des, o, p[0], ps[0], n); break;
    case M_WHERE: mb->where(o, p[0], ps[0], p[1], ps[1], p[2], ps[2], n); break;
    case M_UNARY: mb->un(o, p[0], ps[0], n); break;
    default: mb->bin(o, p[0], ps[0], p[1], ps[1], n); break;
    }
    mv[k] = o;
    if (mb->val >= 0 && mb->out >= 0) stream_out(unit_at(w, u, mb->out), o, n * fp->pl.des);
  }
}

static void fused_range(const fused_plan *fp, const ew_walk *w, int64_t u0, int64_t u1) {
  _Alignas(64) char val[NBI_FUSE_MAX * FUSE_CHUNK * 8]; /* the first slots in use */
  chunk_buf tmp[3];
  WALK_RANGE(w, u0, u1, u, fused_unit(fp, w, &u, val, tmp));
  stream_end(w->stream);
}

nb_status nbi_cpu_elementwise_fused(nb_tensor *const *nodes, int m, const bool *store,
                                    nbi_view *out) {
  fused_plan fp = {.m = m, .pl.dom = domain_of(nodes[0]->dtype)};
  fp.pl.cdt = domain_dtype[fp.pl.dom];
  fp.pl.des = (int64_t)nb_dtype_size(fp.pl.cdt);
  const ew_rows *rt = &rows_by_isa[nbi_isa_active()];
  const nb_shape *shape = &nodes[m - 1]->shape;
  nbi_view ext[NBI_FUSE_MAX];
  const nb_tensor *ext_t[NBI_FUSE_MAX];
  const nbi_view *views[NBI_ITER_MAX_OPS];
  int n_store = 0, n_ext = 0;
  for (int k = 0; k < m; k++) {
    fp.mb[k].out = -1;
    if (store[k]) {
      fp.mb[k].out = n_store;
      views[n_store++] = &out[k];
    }
  }
  int last[NBI_FUSE_MAX]; /* each member's last reader */
  for (int k = 0; k < m; k++) {
    const nb_tensor *t = nodes[k];
    fused_member *mb = &fp.mb[k];
    last[k] = k;
    mb->n_in = t->n_in;
    if (nbi_fuse_view(t)) {
      mb->kind = M_VIEW;
    } else if (t->op == NBI_OP_WHERE) {
      mb->kind = M_WHERE;
      mb->where = rt->where[fp.pl.dom];
    } else if (t->n_in == 1) {
      mb->kind = M_UNARY;
      mb->un = rt->un[fp.pl.dom][t->op];
    } else {
      mb->kind = M_BINARY;
      mb->bin = rt->bin[fp.pl.dom][t->op];
    }
    for (int q = 0; q < t->n_in; q++) {
      const nb_tensor *x = t->in[q];
      int j = k - 1;
      while (j >= 0 && nodes[j] != x)
        j--;
      if (j >= 0) {
        last[j] = k;
        mb->src[q] = j;
        continue;
      }
      int e = 0;
      while (e < n_ext && ext_t[e] != x)
        e++;
      if (e == n_ext) {
        if (n_ext == NBI_FUSE_MAX || n_store + n_ext + 1 > NBI_ITER_MAX_OPS)
          return nbi_error(NB_ERR_INTERNAL, "nb_eval: a fused group has too many operands");
        nbi_view v = nbi_tensor_view(x);
        ext[n_ext] = nbi_view_broadcast(&v, shape);
        ext_t[n_ext++] = x;
      }
      mb->src[q] = -1 - (n_store + e);
    }
  }
  for (int e = 0; e < n_ext; e++)
    views[n_store + e] = &ext[e];
  ew_walk w;
  walk_init(&w, n_store + n_ext, views, n_store, FUSE_CHUNK);
  /* scratch slots: a member takes a free one, freed after its last reader */
  int owner[NBI_FUSE_MAX], n_slots = 0;
  for (int k = 0; k < m; k++) {
    fp.mb[k].val = -1;
    if (fp.mb[k].out >= 0 && !w.stream) continue;
    int s = 0;
    while (s < n_slots && last[owner[s]] >= k)
      s++;
    if (s == n_slots) n_slots++;
    owner[s] = k;
    fp.mb[k].val = s;
  }
  if (w.rows * w.n < NBI_PAR_MIN || w.units < 2) {
    fused_range(&fp, &w, 0, w.units);
    return NB_OK;
  }
#pragma omp parallel
  {
    int64_t u0, u1;
    thread_range(w.units, &u0, &u1);
    fused_range(&fp, &w, u0, u1);
  }
  return NB_OK;
}

/* ---- fused row groups ------------------------------------------------------------------
 * A row group (nbi.h, "fusion") runs row by row: a member of the full shape F
 * gets its row of N (F's trailing elements) in a scratch row, or straight in
 * its buffer when stored; a reduction folds its input's row with the kernel's
 * own row routine (nbi_cpu_reduce_row); a per-row member is one scalar per
 * row; an axis op along the last axis (softmax, log_softmax, cumsum) is a full
 * member computed by its kernel's row routine (nbi_cpu_axis_row). Outside
 * operands are read through their broadcast views: per row, an
 * offset from the row index and the strides of the row dims, then either one
 * stride over the row (read in place when it is 0 or 1 and of the domain's
 * type) or a gather of its trailing dims. Blocks of rows go to the threads;
 * each thread gets its part of one scratch block from the buffer cache. Global members (single
 * values from all rows) run after the row loop, on the stored per-row values. */

/* An outside operand broadcast to its consumer's shape: dims [0, ra) index
 * rows, dims [ra, nd) the row (none for a per-row consumer). */
typedef struct row_ext {
  const char *data;
  nb_dtype dt;
  int nd, ra;
  int64_t dims[NB_MAX_DIMS], st[NB_MAX_DIMS];
  int64_t s; /* the one element stride of the row's dims, or INT64_MIN when none */
} row_ext;

typedef struct row_plan {
  int m, ra, n_slots;
  domain dom;
  const ew_rows *rt; /* the active ISA's row functions */
  size_t es;
  int64_t rows, n;
  size_t pitch; /* bytes between scratch rows (n elements, 64-byte aligned) */
  nb_tensor *const *nodes;
  bool full[NBI_FUSE_MAX];   /* member has the full shape (else one value per row) */
  bool global[NBI_FUSE_MAX]; /* member is one value computed after the rows */
  int slot[NBI_FUSE_MAX];    /* scratch row of an unstored full member, or -1 */
  char *out[NBI_FUSE_MAX];   /* buffer of a stored member, or NULL */
  int src[NBI_FUSE_MAX][3];  /* operand: member index, or -1 - its index in ext */
  row_ext ext[NBI_FUSE_MAX * 3];
  bool stream;                    /* stored full members go out by stream_out */
  int n_pf, pf[NBI_FUSE_MAX * 3]; /* ext rows prefetched a row ahead */
} row_plan;

static row_ext row_ext_of(const nb_tensor *x, const nb_shape *target, int ra) {
  nbi_view v = nbi_tensor_view(x);
  v = nbi_view_broadcast(&v, target);
  row_ext e = {.data = v.data, .dt = v.dtype, .nd = target->ndim, .ra = ra, .s = INT64_MIN};
  memcpy(e.dims, v.dims, sizeof e.dims);
  memcpy(e.st, v.strides, sizeof e.st);
  int last = -1; /* the row's dims collapse to one stride when consecutive ones nest */
  bool one = true;
  for (int d = ra; d < e.nd; d++) {
    if (e.dims[d] == 1) continue;
    if (last >= 0 && e.st[last] != e.st[d] * e.dims[d]) one = false;
    last = d;
  }
  if (one && last >= 0) e.s = e.st[last];
  return e;
}

/* Element offset of row r's first element. */
static int64_t row_ext_offset(const row_ext *e, int64_t r) {
  int64_t off = 0;
  for (int d = e->ra - 1; d >= 0; d--) {
    off += r % e->dims[d] * e->st[d];
    r /= e->dims[d];
  }
  return off;
}

/* Rows up to this many bytes, read whole in place, are prefetched a row ahead
 * (fused_row): a row of a page or less starts where the hardware prefetcher,
 * which stops at page boundaries, has no stream yet. */
enum { ROW_PREFETCH_MAX = 16384 };

/* Adds ext i of rp (read as whole rows) to the prefetched ones when it is read
 * in place, its rows differ, and no other prefetched ext reads the same rows. */
static void row_ext_prefetch(row_plan *rp, int i) {
  const row_ext *e = &rp->ext[i];
  bool varies = false;
  for (int d = 0; d < e->ra; d++)
    varies = varies || (e->dims[d] > 1 && e->st[d] != 0);
  if (e->s != 1 || !varies || rp->n * (int64_t)nb_dtype_size(e->dt) > ROW_PREFETCH_MAX) return;
  for (int k = 0; k < rp->n_pf; k++) {
    const row_ext *o = &rp->ext[rp->pf[k]];
    if (o->data == e->data && o->dt == e->dt && !memcmp(o->st, e->st, sizeof e->st)) return;
  }
  rp->pf[rp->n_pf++] = i;
}

/* Copies row r's n elements of e into buf, converted to the domain's type
 * (bool as bytes 0/1 when cond). */
static void row_ext_gather(const row_plan *rp, const row_ext *e, int64_t r, void *buf, bool cond) {
  int64_t idx[NB_MAX_DIMS] = {0}, in = e->dims[e->nd - 1], ins = e->st[e->nd - 1];
  size_t es = nb_dtype_size(e->dt);
  for (int64_t j = 0; j < rp->n; j += in) {
    int64_t off = row_ext_offset(e, r);
    for (int d = e->ra; d < e->nd - 1; d++)
      off += idx[d] * e->st[d];
    const char *p = e->data + off * (int64_t)es;
    if (cond)
      for (int64_t i = 0; i < in; i++)
        ((uint8_t *)buf)[j + i] = p[i * ins] != 0;
    else
      load(rp->dom, (char *)buf + j * (int64_t)rp->es, p, e->dt, ins, in);
    for (int d = e->nd - 2; d >= e->ra && ++idx[d] == e->dims[d]; d--)
      idx[d] = 0;
  }
}

/* Points *p at row r of e for a consumer of n elements per row (1 when e is
 * per-row): in place or gathered into buf; returns the stride of *p (0 or 1).
 * contig: always n values at stride 1 (a reduction's input). */
static int64_t row_ext_row(const row_plan *rp, const row_ext *e, int64_t r, int64_t n, void *buf,
                           bool cond, bool contig, const void **p) {
  const char *base = e->data + row_ext_offset(e, r) * (int64_t)nb_dtype_size(e->dt);
  int64_t s = n == 1 ? 0 : e->s;
  if (s == INT64_MIN || (contig && (s != 1 || e->dt != domain_dtype[rp->dom]))) {
    row_ext_gather(rp, e, r, buf, cond);
    *p = buf;
    return 1;
  }
  if (cond) {
    if (s == 0 || s == 1) {
      *p = base;
      return s;
    }
    for (int64_t j = 0; j < n; j++)
      ((uint8_t *)buf)[j] = base[j * s] != 0;
    *p = buf;
    return 1;
  }
  ew_plan pl = {.dom = rp->dom, .cdt = domain_dtype[rp->dom]};
  return operand(&pl, base, e->dt, s, n, buf, p);
}

/* Evaluates row r of every member; scr: the thread's scratch rows, then three
 * operand rows. */
static void fused_row(const row_plan *rp, int64_t r, char *scr) {
  _Alignas(8) char val[NBI_FUSE_MAX][8]; /* per-row members' values */
  const void *row[NBI_FUSE_MAX];         /* full members' rows */
  size_t rowbytes = (size_t)rp->n * rp->es;
  for (int i = 0; i < rp->n_pf && r + 1 < rp->rows; i++) {
    const row_ext *e = &rp->ext[rp->pf[i]];
    int64_t es = (int64_t)nb_dtype_size(e->dt);
    const char *next = e->data + row_ext_offset(e, r + 1) * es;
    for (int64_t j = 0; j < rp->n * es; j += 64)
      __builtin_prefetch(next + j);
  }
  for (int k = 0; k < rp->m; k++) {
    const nb_tensor *t = rp->nodes[k];
    int64_t n = rp->full[k] ? rp->n : 1;
    const void *p[3];
    int64_t ps[3];
    if (rp->global[k]) continue;
    for (int q = 0; q < t->n_in; q++) {
      int src = rp->src[k][q];
      char *buf = scr + (size_t)(rp->n_slots + q) * rp->pitch;
      bool cond = t->op == NBI_OP_WHERE && q == 0;
      if (src >= 0) {
        p[q] = rp->full[src] ? row[src] : (const void *)val[src];
        ps[q] = rp->full[src] ? 1 : 0;
      } else { /* a row op reads its input's row as n contiguous values */
        bool row_op = nbi_cpu_reduce_row_fusible(t) || nbi_cpu_axis_row_fusible(t);
        ps[q] =
            row_ext_row(rp, &rp->ext[-1 - src], r, row_op ? rp->n : n, buf, cond, row_op, &p[q]);
      }
    }
    void *o = rp->full[k] ? (rp->slot[k] < 0 ? rp->out[k] + (size_t)r * rowbytes
                                             : scr + (size_t)rp->slot[k] * rp->pitch)
                          : (void *)val[k];
    if (nbi_cpu_reduce_row_fusible(t)) {
      double v = nbi_cpu_reduce_row(t, p[0], rp->n, rp->rows);
      if (rp->dom == DOM_F32)
        *(float *)o = (float)v;
      else
        *(double *)o = v;
    } else if (nbi_cpu_axis_row_fusible(t)) {
      nbi_cpu_axis_row(t, p[0], o, n);
    } else if (nbi_fuse_view(t)) {
      copy_row(rp->es, o, p[0], ps[0], n);
    } else if (t->op == NBI_OP_WHERE) {
      rp->rt->where[rp->dom](o, p[0], ps[0], p[1], ps[1], p[2], ps[2], n);
    } else if (t->n_in == 1) {
      rp->rt->un[rp->dom][t->op](o, p[0], ps[0], n);
    } else {
      rp->rt->bin[rp->dom][t->op](o, p[0], ps[0], p[1], ps[1], n);
    }
    if (rp->full[k]) {
      row[k] = o;
      if (rp->out[k] && rp->slot[k] >= 0)
        stream_out(rp->out[k] + (size_t)r * rowbytes, o, (int64_t)rowbytes);
    } else if (rp->out[k]) {
      memcpy(rp->out[k] + (size_t)r * rp->es, o, rp->es);
    }
  }
}

/* The global members, in order, after every row: a reduction of all rows of
 * a (stored) per-row member, elementwise ops and views on single values. */
static void fused_global(const row_plan *rp) {
  _Alignas(8) char val[NBI_FUSE_MAX][8], tmp[3][8];
  for (int k = 0; k < rp->m; k++) {
    const nb_tensor *t = rp->nodes[k];
    if (!rp->global[k]) continue;
    const void *p[3];
    int64_t ps[3];
    for (int q = 0; q < t->n_in; q++) {
      int src = rp->src[k][q];
      if (src >= 0) {
        p[q] = rp->global[src] ? (const void *)val[src] : (const void *)rp->out[src];
        ps[q] = 0;
      } else {
        ps[q] = row_ext_row(rp, &rp->ext[-1 - src], 0, 1, tmp[q], t->op == NBI_OP_WHERE && q == 0,
                            false, &p[q]);
      }
    }
    void *o = val[k];
    if (nbi_cpu_reduce_row_fusible(t)) {
      double v = nbi_cpu_reduce_row(t, p[0], rp->rows, 1);
      if (rp->dom == DOM_F32)
        *(float *)o = (float)v;
      else
        *(double *)o = v;
    } else if (nbi_fuse_view(t)) {
      copy_row(rp->es, o, p[0], ps[0], 1);
    } else if (t->op == NBI_OP_WHERE) {
      rp->rt->where[rp->dom](o, p[0], ps[0], p[1], ps[1], p[2], ps[2], 1);
    } else if (t->n_in == 1) {
      rp->rt->un[rp->dom][t->op](o, p[0], ps[0], 1);
    } else {
      rp->rt->bin[rp->dom][t->op](o, p[0], ps[0], p[1], ps[1], 1);
    }
    if (rp->out[k]) memcpy(rp->out[k], o, rp->es);
  }
}

nb_status nbi_cpu_rows_fused(nb_tensor *const *nodes, int m, const bool *store, nbi_view *out,
                             int ra) {
  row_plan rp = {.m = m, .ra = ra, .nodes = nodes, .dom = domain_of(nodes[0]->dtype), .rows = 1};
  rp.rt = &rows_by_isa[nbi_isa_active()];
  rp.es = nb_dtype_size(domain_dtype[rp.dom]);
  const nb_shape *full = NULL;
  for (int k = 0; k < m && !full; k++)
    if (nbi_cpu_reduce_row_fusible(nodes[k]) || nbi_cpu_axis_row_fusible(nodes[k]))
      full = &nodes[k]->in[0]->shape;
  rp.n = nbi_numel(full);
  for (int d = 0; d < ra; d++)
    rp.rows *= full->dims[d];
  rp.n /= rp.rows;
  /* scratch rows: an unstored full member takes a free one, freed after its last use */
  int last[NBI_FUSE_MAX], owner[NBI_FUSE_MAX], n_ext = 0;
  for (int k = 0; k < m; k++) {
    const nb_tensor *t = nodes[k];
    last[k] = k;
    rp.full[k] = nbi_shape_eq(&t->shape, full);
    rp.out[k] = store[k] ? out[k].data : NULL;
    /* global (nbi.h): a reduction to one value of a per-row member, or an op on
     * global members (the planner keeps them after every other member) */
    rp.global[k] = rp.rows >= 2 && nbi_numel(&t->shape) == 1;
    for (int q = 0; q < t->n_in; q++) {
      int j = k - 1;
      while (j >= 0 && nodes[j] != t->in[q])
        j--;
      if (j >= 0) {
        last[j] = k;
      } else {
        /* per-row: broadcast to the member's shape; a reshape reads its input's
         * elements in order (the row index is the linear index of both) */
        bool per_row = !rp.full[k] && !nbi_cpu_reduce_row_fusible(t);
        const nb_shape *ts = t->op == NBI_OP_RESHAPE ? &t->in[0]->shape : &t->shape;
        rp.ext[n_ext] = row_ext_of(t->in[q], per_row ? ts : full, per_row ? ts->ndim : ra);
        if (!per_row) row_ext_prefetch(&rp, n_ext);
        j = -1 - n_ext++;
      }
      rp.src[k][q] = j;
    }
  }
  /* streamed: a stored full member computes into a scratch row too */
  int64_t out_bytes = 0;
  for (int k = 0; k < m; k++)
    if (rp.full[k] && rp.out[k]) out_bytes += rp.rows * rp.n * (int64_t)rp.es;
  rp.stream = out_bytes >= STREAM_MIN;
  for (int k = 0; k < m; k++) {
    rp.slot[k] = -1;
    if (!rp.full[k] || (rp.out[k] && !rp.stream)) continue;
    int s = 0;
    while (s < rp.n_slots && last[owner[s]] >= k)
      s++;
    if (s == rp.n_slots) rp.n_slots++;
    owner[s] = k;
    rp.slot[k] = s;
  }
  rp.pitch = ((size_t)rp.n * rp.es + 63) / 64 * 64;
  size_t scr_bytes = (size_t)(rp.n_slots + 3) * rp.pitch;
  int64_t rb = 8192 / rp.n + 1, n_blocks = (rp.rows + rb - 1) / rb;
  /* per-thread scratch, one block from the buffer cache (nothing allocated per call) */
  bool par = rp.rows * rp.n >= NBI_PAR_MIN && n_blocks > 1;
  int n_threads = par ? omp_get_max_threads() : 1;
  char *scr_all = nbi_cpu_scratch("nb_eval", scr_bytes * (size_t)n_threads);
  if (!scr_all) return NB_ERR_OOM;
  if (!par) { /* no OpenMP region (even an inactive one costs about a microsecond) */
    for (int64_t r = 0; r < rp.rows; r++)
      fused_row(&rp, r, scr_all);
    stream_end(rp.stream);
  } else {
#pragma omp parallel num_threads(n_threads)
    {
      char *scr = scr_all + (size_t)omp_get_thread_num() * scr_bytes;
#pragma omp for schedule(dynamic)
      for (int64_t b = 0; b < n_blocks; b++)
        for (int64_t r = b * rb; r < rp.rows && r < (b + 1) * rb; r++)
          fused_row(&rp, r, scr);
      stream_end(rp.stream);
    }
  }
  nbi_cpu_scratch_free(scr_all);
  fused_global(&rp);
  return NB_OK;
}
