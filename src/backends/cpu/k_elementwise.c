/* src/backends/cpu/k_elementwise.c — elementwise kernels: unary, binary, where,
 * cast.
 *
 * Every op is evaluated in one of three domains picked by the node's compute
 * dtype: float (f32, f16, bf16), double (f64), int64 (i32, i64, bool). Each op's
 * scalar expression is written once in an X-macro list below and instantiated
 * per domain type as a row function over unit-stride or stride-0 operands.
 *
 * The driver walks rows with nbi_iter and cuts them into chunks of CHUNK
 * elements (the unit of OpenMP work, so a single long row parallelizes too).
 * Per chunk, an operand that already has the domain's type with stride 0 or 1
 * is read in place (the f32/f64 fast path: no copies, vectorizable loops);
 * anything else (other dtypes, arbitrary or negative strides) is first
 * converted into a chunk buffer. The result goes straight to out when out has
 * the domain's type (or is bool for predicates), else through a buffer that is
 * converted once at the store.
 */
#include "k_elementwise.h"
#include "k_reduce.h"

#include <math.h>
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

/* ---- the op lists: one expression per op and domain ------------------------------ */
/* clang-format off */
/* Float domains: x (unary) or a, b (binary) have type T; FN(f) is libm's f for T;
 * VM(f) is vmath.h's vectorizable vm_<f>f for float, libm's f (dm_<f> below) for
 * double. Every list takes S, the ISA suffix its row functions are compiled for. */
#define EW_UNARY_FLOAT(X, S)                                                                       \
  X(S, NEG, -x)                                                                                    \
  X(S, ABS, FN(fabs)(x))                                                                           \
  X(S, SIGN, x > 0 ? (T)1 : x < 0 ? (T)-1 : x) /* keeps +-0 and NaN */                             \
  X(S, EXP, VM(exp)(x))                                                                            \
  X(S, EXPM1, VM(expm1)(x))                                                                        \
  X(S, LOG, VM(log)(x))                                                                            \
  X(S, LOG1P, VM(log1p)(x))                                                                        \
  X(S, SQRT, FN(sqrt)(x))                                                                          \
  X(S, RSQRT, (T)1 / FN(sqrt)(x))                                                                  \
  X(S, SQUARE, x * x)                                                                              \
  X(S, SIN, FN(sin)(x))                                                                            \
  X(S, COS, FN(cos)(x))                                                                            \
  X(S, TAN, FN(tan)(x))                                                                            \
  X(S, TANH, VM(tanh)(x))                                                                          \
  X(S, SIGMOID, VM(sigmoid)(x))                                                                    \
  X(S, RELU, x < 0 ? (T)0 : x)                         /* NaN passes through */                    \
  X(S, GELU, VM(gelu)(x))                                                                          \
  X(S, SILU, VM(silu)(x))                                                                          \
  X(S, SOFTPLUS, VM(softplus)(x))                                                                  \
  X(S, ERF, VM(erf)(x))                                                                            \
  X(S, FLOOR, FN(floor)(x))                                                                        \
  X(S, CEIL, FN(ceil)(x))                                                                          \
  X(S, ROUND, FN(nearbyint)(x)) /* default rounding mode: half to even */                          \
  X(S, RECIPROCAL, (T)1 / x)

#define EW_BINARY_FLOAT(X, S)                                                                      \
  X(S, ADD, a + b)                                                                                 \
  X(S, SUB, a - b)                                                                                 \
  X(S, MUL, a * b)                                                                                 \
  X(S, DIV, a / b)                                                                                 \
  X(S, POW, FN(pow)(a, b))                                                                         \
  X(S, MAXIMUM, (a > b || a != a) ? a : b) /* NaN in either propagates */                          \
  X(S, MINIMUM, (a < b || a != a) ? a : b)                                                         \
  X(S, ATAN2, FN(atan2)(a, b))                                                                     \
  X(S, MOD, FN(floor_mod)(a, b))

/* int64 domain (i32, i64 and bool; the store wraps to i32 or tests != 0 for
 * bool, so add/mul/maximum/minimum on bool act as or/and/or/and). Ops missing
 * here are float-only: the op layer gives them an f32 compute dtype. */
#define EW_UNARY_INT(X, S)                                                                         \
  X(S, NEG, wrap_sub(0, x))                                                                        \
  X(S, ABS, x < 0 ? wrap_sub(0, x) : x)                                                            \
  X(S, SIGN, (int64_t)((x > 0) - (x < 0)))                                                         \
  X(S, SQUARE, wrap_mul(x, x))                                                                     \
  X(S, RELU, x < 0 ? 0 : x)                                                                        \
  X(S, FLOOR, x)                                                                                   \
  X(S, CEIL, x)                                                                                    \
  X(S, ROUND, x)

#define EW_BINARY_INT(X, S)                                                                        \
  X(S, ADD, wrap_add(a, b))                                                                        \
  X(S, SUB, wrap_sub(a, b))                                                                        \
  X(S, MUL, wrap_mul(a, b))                                                                        \
  X(S, POW, int_pow(a, b))                                                                         \
  X(S, MAXIMUM, a > b ? a : b)                                                                     \
  X(S, MINIMUM, a < b ? a : b)                                                                     \
  X(S, MOD, int_mod(a, b))

/* Predicates, every domain: the result is written as bool (0 or 1). */
#define EW_UNARY_PRED(X, S) X(S, LOGICAL_NOT, x == 0)

#define EW_BINARY_PRED(X, S)                                                                       \
  X(S, EQ, a == b)                                                                                 \
  X(S, NE, a != b)                                                                                 \
  X(S, LT, a < b)                                                                                  \
  X(S, LE, a <= b)                                                                                 \
  X(S, GT, a > b)                                                                                  \
  X(S, GE, a >= b)                                                                                 \
  X(S, LOGICAL_AND, a != 0 && b != 0)                                                              \
  X(S, LOGICAL_OR, a != 0 || b != 0)
/* clang-format on */

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

/* The active ISA's tables, [domain][op] (where_rows: [domain]); looked up at
 * each use, so nbi_isa_select takes effect at once. */
#define unary_rows (rows_by_isa[nbi_isa_active()].un)
#define binary_rows (rows_by_isa[nbi_isa_active()].bin)
#define where_rows (rows_by_isa[nbi_isa_active()].where)
/* Ops whose row function writes bool directly. */
static const bool is_pred[NBI_OP_COUNT] = {EW_UNARY_PRED(ENTRY_PRED, portable)
                                               EW_BINARY_PRED(ENTRY_PRED, portable)};

/* ---- driver ---------------------------------------------------------------------------- */
enum { CHUNK = 512 };

/* What one kernel call does, shared read-only by the threads. */
typedef struct ew_plan {
  int n_in; /* 1, 2, or 3 (where) */
  bool is_where, is_cast;
  nb_dtype cdt;    /* compute dtype */
  domain dom;      /* its domain */
  bool direct_out; /* the row function writes out itself */
  nb_dtype out_dt, in_dt[3];
  unary_row un;
  binary_row bin;
} ew_plan;

typedef union chunk_buf {
  float f[CHUNK];
  double d[CHUNK];
  int64_t i[CHUNK];
} chunk_buf;

/* Points *p at operand values in the domain's type: in place when src already
 * has that type and stride 0 or 1, else converted into buf (one value for a
 * broadcast operand). Returns the stride of *p (0 or 1). An integer operand of
 * an f16/bf16 computation is first rounded to that dtype, as if cast to it. */
static int64_t operand(const ew_plan *pl, const char *src, nb_dtype dt, int64_t s, int64_t n,
                       void *buf, const void **p) {
  domain dom = pl->dom;
  if (dt == domain_dtype[dom] && (s == 0 || s == 1)) {
    *p = src;
    return s;
  }
  int64_t m = s == 0 ? 1 : n;
  if (dom == DOM_F32 && dt != pl->cdt && pl->cdt != NB_F32) {
    int64_t wide[CHUNK];
    uint16_t half[CHUNK];
    load_i64(wide, src, dt, s, m);
    store_i64((char *)half, pl->cdt, wide, m);
    load_f32(buf, (const char *)half, pl->cdt, 1, m);
  } else {
    load(dom, buf, src, dt, s, m);
  }
  *p = buf;
  return s == 0 ? 0 : 1;
}

/* One chunk: n elements; out contiguous; operand k at src[k] with stride s[k]. */
static void run_chunk(const ew_plan *pl, char *out, const char *const *src, const int64_t *s,
                      int64_t n) {
  chunk_buf buf[3], obuf;
  if (pl->is_cast) { /* load in the source's domain, store converting */
    if (pl->out_dt == domain_dtype[pl->dom]) {
      load(pl->dom, out, src[0], pl->in_dt[0], s[0], n);
    } else if (pl->in_dt[0] == domain_dtype[pl->dom] && s[0] == 1) {
      store(pl->dom, out, pl->out_dt, src[0], n);
    } else {
      load(pl->dom, &buf[0], src[0], pl->in_dt[0], s[0], n);
      store(pl->dom, out, pl->out_dt, &buf[0], n);
    }
    return;
  }
  const void *p[3];
  int64_t ps[3];
  int first = 0;
  uint8_t cond[CHUNK];
  if (pl->is_where) { /* the bool condition is read as bytes */
    first = 1;
    if (s[0] == 0 || s[0] == 1) {
      p[0] = src[0];
      ps[0] = s[0];
    } else {
      for (int64_t j = 0; j < n; j++)
        cond[j] = (uint8_t)src[0][j * s[0]];
      p[0] = cond;
      ps[0] = 1;
    }
  }
  for (int k = first; k < pl->n_in; k++)
    ps[k] = operand(pl, src[k], pl->in_dt[k], s[k], n, &buf[k], &p[k]);
  void *o = pl->direct_out ? (void *)out : (void *)&obuf;
  if (pl->is_where)
    where_rows[pl->dom](o, p[0], ps[0], p[1], ps[1], p[2], ps[2], n);
  else if (pl->n_in == 1)
    pl->un(o, p[0], ps[0], n);
  else
    pl->bin(o, p[0], ps[0], p[1], ps[1], n);
  if (!pl->direct_out) store(pl->dom, out, pl->out_dt, o, n);
}

/* One kernel's walk: out and the broadcast inputs v, rows of n elements cut
 * into n_chunks chunks each. */
typedef struct ew_walk {
  const ew_plan *pl;
  nbi_iter it;
  nbi_view v[3];
  const nbi_view *out;
  int64_t n, n_chunks;
} ew_walk;

/* Unit u of the walk: chunk u % n_chunks of row u / n_chunks. */
static void run_unit(const ew_walk *w, int64_t u) {
  const ew_plan *pl = w->pl;
  int last = w->it.ndim - 1;
  int64_t r = u / w->n_chunks, j0 = (u % w->n_chunks) * CHUNK;
  int64_t len = w->n - j0 < CHUNK ? w->n - j0 : CHUNK, off[4], s[3];
  const char *src[3];
  nbi_iter_row(&w->it, r, off);
  for (int k = 0; k < pl->n_in; k++) {
    s[k] = w->it.strides[k + 1][last];
    src[k] = w->v[k].data + (off[k + 1] + j0 * s[k]) * (int64_t)nb_dtype_size(w->v[k].dtype);
  }
  /* out is contiguous, so its inner stride is 1 */
  run_chunk(pl, w->out->data + (off[0] + j0) * (int64_t)nb_dtype_size(w->out->dtype), src, s, len);
}

/* Broadcasts the inputs to out, iterates rows, and runs chunks of rows in
 * parallel when the work is large. Small work never enters an OpenMP region
 * (even one with a false if clause costs about a microsecond). */
static void run(const ew_plan *pl, nbi_view *out, const nbi_view *in) {
  nb_shape shape = {.ndim = out->ndim};
  memcpy(shape.dims, out->dims, sizeof shape.dims);
  ew_walk w = {.pl = pl, .out = out};
  const nbi_view *views[4] = {out};
  for (int k = 0; k < pl->n_in; k++) {
    w.v[k] = nbi_view_broadcast(&in[k], &shape);
    views[k + 1] = &w.v[k];
  }
  nbi_iter_init(&w.it, pl->n_in + 1, views);
  int64_t rows = nbi_iter_rows(&w.it);
  w.n = w.it.dims[w.it.ndim - 1];
  w.n_chunks = (w.n + CHUNK - 1) / CHUNK;
  int64_t units = rows * w.n_chunks;
  if (rows * w.n < NBI_PAR_MIN || units < 2) {
    for (int64_t u = 0; u < units; u++)
      run_unit(&w, u);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < units; u++)
    run_unit(&w, u);
}

nb_status nbi_cpu_elementwise(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  /* out is n's shape; in[k] (k < n->n_in) broadcast to it; compute dtype in attrs.i[0] */
  ew_plan pl = {.n_in = n->n_in, .is_where = n->op == NBI_OP_WHERE, .out_dt = out->dtype};
  pl.cdt = (nb_dtype)n->attrs.i[0];
  pl.dom = domain_of(pl.cdt);
  for (int k = 0; k < pl.n_in; k++)
    pl.in_dt[k] = in[k].dtype;
  if (!pl.is_where) {
    if (pl.n_in == 1)
      pl.un = unary_rows[pl.dom][n->op];
    else
      pl.bin = binary_rows[pl.dom][n->op];
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
  ew_plan pl = {.n_in = 1, .is_cast = true, .out_dt = out->dtype, .in_dt = {in[0].dtype}};
  pl.cdt = in[0].dtype;
  pl.dom = domain_of(pl.cdt);
  run(&pl, out, in);
  return NB_OK;
}

/* ---- fused groups ------------------------------------------------------------------------
 * A run of elementwise nodes of one float domain and one shape, evaluated in one
 * pass: per chunk, each member's row goes into a chunk buffer that later
 * members read, so values used only inside the group never reach memory; the
 * members the planner marks `store` are written to their buffers (and read
 * back from there by later members). Operands from outside the group are
 * read through their views, as the single-op kernel does. */
enum { FUSE_CHUNK = 256 };

/* (View members, nbi_fuse_view, are copies in both executors.) */
bool nbi_cpu_elementwise_fusible(const nb_tensor *n) {
  if (nbi_op_table[n->op]->cpu != nbi_cpu_elementwise || is_pred[n->op]) return false;
  nb_dtype cdt = (nb_dtype)n->attrs.i[0];
  if ((cdt != NB_F32 && cdt != NB_F64) || n->dtype != cdt) return false;
  if (n->op == NBI_OP_WHERE) return true;
  return n->n_in == 1 ? unary_rows[domain_of(cdt)][n->op] != NULL
                      : binary_rows[domain_of(cdt)][n->op] != NULL;
}

typedef struct fused_operand {
  int member; /* >= 0: an earlier member; -1: external operand ext */
  int ext;
} fused_operand;

typedef struct fused_plan {
  int m, n_ext, n_store;
  domain dom;
  nb_tensor *const *nodes;
  fused_operand op[NBI_FUSE_MAX][3];
  int store_slot[NBI_FUSE_MAX]; /* iterator operand of a stored member, or -1 */
  nb_dtype ext_dt[NBI_FUSE_MAX];
} fused_plan;

/* o[0..n) = p[0..n) (s = 1) or n copies of p[0] (s = 0): a view member. */
static void copy_row(domain dom, void *restrict o, const void *restrict p, int64_t s, int64_t n) {
  size_t es = nb_dtype_size(domain_dtype[dom]);
  if (s) {
    memcpy(o, p, (size_t)n * es);
    return;
  }
  for (int64_t j = 0; j < n; j++)
    memcpy((char *)o + (size_t)j * es, p, es);
}

static void fused_chunk(const fused_plan *fp, char *const *ptr, const int64_t *s, int64_t n) {
  _Alignas(64) char val[NBI_FUSE_MAX][FUSE_CHUNK * 8];
  _Alignas(64) char tmp[3][FUSE_CHUNK * 8];
  const void *mv[NBI_FUSE_MAX]; /* each member's values, contiguous */
  ew_plan pl = {.dom = fp->dom, .cdt = domain_dtype[fp->dom]};
  for (int k = 0; k < fp->m; k++) {
    const nb_tensor *t = fp->nodes[k];
    const void *p[3];
    int64_t ps[3];
    uint8_t cond[FUSE_CHUNK];
    for (int q = 0; q < t->n_in; q++) {
      const fused_operand *o = &fp->op[k][q];
      if (o->member >= 0) {
        p[q] = mv[o->member];
        ps[q] = 1;
        continue;
      }
      int slot = fp->n_store + o->ext;
      if (t->op == NBI_OP_WHERE && q == 0) { /* the bool condition, as bytes */
        for (int64_t j = 0; j < n; j++)
          cond[j] = (uint8_t)(ptr[slot][j * s[slot]] != 0);
        p[q] = cond;
        ps[q] = 1;
      } else {
        ps[q] = operand(&pl, ptr[slot], fp->ext_dt[o->ext], s[slot], n, tmp[q], &p[q]);
      }
    }
    void *o = fp->store_slot[k] >= 0 ? (void *)ptr[fp->store_slot[k]] : (void *)val[k];
    if (nbi_fuse_view(t))
      copy_row(fp->dom, o, p[0], ps[0], n);
    else if (t->op == NBI_OP_WHERE)
      where_rows[fp->dom](o, p[0], ps[0], p[1], ps[1], p[2], ps[2], n);
    else if (t->n_in == 1)
      unary_rows[fp->dom][t->op](o, p[0], ps[0], n);
    else
      binary_rows[fp->dom][t->op](o, p[0], ps[0], p[1], ps[1], n);
    mv[k] = o;
  }
}

nb_status nbi_cpu_elementwise_fused(nb_tensor *const *nodes, int m, const bool *store,
                                    nbi_view *out) {
  fused_plan fp = {.m = m, .nodes = nodes, .dom = domain_of(nodes[0]->dtype)};
  const nb_shape *shape = &nodes[m - 1]->shape;
  nbi_view ext[NBI_FUSE_MAX];
  const nb_tensor *ext_t[NBI_FUSE_MAX];
  const nbi_view *views[NBI_ITER_MAX_OPS];
  for (int k = 0; k < m; k++) {
    fp.store_slot[k] = -1;
    if (store[k]) {
      fp.store_slot[k] = fp.n_store;
      views[fp.n_store++] = &out[k];
    }
  }
  for (int k = 0; k < m; k++) {
    const nb_tensor *t = nodes[k];
    for (int q = 0; q < t->n_in; q++) {
      const nb_tensor *x = t->in[q];
      fused_operand o = {.member = -1, .ext = -1};
      for (int j = 0; j < k; j++)
        if (nodes[j] == x) o.member = j;
      if (o.member < 0) {
        for (int e = 0; e < fp.n_ext; e++)
          if (ext_t[e] == x) o.ext = e;
        if (o.ext < 0) {
          if (fp.n_ext == NBI_FUSE_MAX || fp.n_store + fp.n_ext + 1 > NBI_ITER_MAX_OPS)
            return nbi_error(NB_ERR_INTERNAL, "nb_eval: a fused group has too many operands");
          nbi_view v = nbi_tensor_view(x);
          ext[fp.n_ext] = nbi_view_broadcast(&v, shape);
          ext_t[fp.n_ext] = x;
          fp.ext_dt[fp.n_ext] = x->dtype;
          o.ext = fp.n_ext++;
        }
      }
      fp.op[k][q] = o;
    }
  }
  for (int e = 0; e < fp.n_ext; e++)
    views[fp.n_store + e] = &ext[e];
  int n_ops = fp.n_store + fp.n_ext;
  nbi_iter it;
  nbi_iter_init(&it, n_ops, views);
  int last = it.ndim - 1;
  int64_t rows = nbi_iter_rows(&it), n = it.dims[last];
  int64_t n_chunks = (n + FUSE_CHUNK - 1) / FUSE_CHUNK, units = rows * n_chunks;
#pragma omp parallel for schedule(static) if (rows * n >= NBI_PAR_MIN && units > 1)
  for (int64_t u = 0; u < units; u++) {
    int64_t r = u / n_chunks, j0 = (u % n_chunks) * FUSE_CHUNK;
    int64_t len = n - j0 < FUSE_CHUNK ? n - j0 : FUSE_CHUNK, off[NBI_ITER_MAX_OPS],
            s[NBI_ITER_MAX_OPS];
    char *ptr[NBI_ITER_MAX_OPS];
    nbi_iter_row(&it, r, off);
    for (int q = 0; q < n_ops; q++) {
      s[q] = it.strides[q][last];
      ptr[q] = views[q]->data + (off[q] + j0 * s[q]) * (int64_t)nb_dtype_size(views[q]->dtype);
    }
    fused_chunk(&fp, ptr, s, len);
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
 * each thread allocates its scratch once per call. Global members (single
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
    void *o = rp->full[k] ? (rp->out[k] ? rp->out[k] + (size_t)r * rowbytes
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
      copy_row(rp->dom, o, p[0], ps[0], n);
    } else if (t->op == NBI_OP_WHERE) {
      where_rows[rp->dom](o, p[0], ps[0], p[1], ps[1], p[2], ps[2], n);
    } else if (t->n_in == 1) {
      unary_rows[rp->dom][t->op](o, p[0], ps[0], n);
    } else {
      binary_rows[rp->dom][t->op](o, p[0], ps[0], p[1], ps[1], n);
    }
    if (rp->full[k])
      row[k] = o;
    else if (rp->out[k])
      memcpy(rp->out[k] + (size_t)r * rp->es, o, rp->es);
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
      copy_row(rp->dom, o, p[0], ps[0], 1);
    } else if (t->op == NBI_OP_WHERE) {
      where_rows[rp->dom](o, p[0], ps[0], p[1], ps[1], p[2], ps[2], 1);
    } else if (t->n_in == 1) {
      unary_rows[rp->dom][t->op](o, p[0], ps[0], 1);
    } else {
      binary_rows[rp->dom][t->op](o, p[0], ps[0], p[1], ps[1], 1);
    }
    if (rp->out[k]) memcpy(rp->out[k], o, rp->es);
  }
}

nb_status nbi_cpu_rows_fused(nb_tensor *const *nodes, int m, const bool *store, nbi_view *out,
                             int ra) {
  row_plan rp = {.m = m, .ra = ra, .nodes = nodes, .dom = domain_of(nodes[0]->dtype), .rows = 1};
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
        j = -1 - n_ext++;
      }
      rp.src[k][q] = j;
    }
  }
  for (int k = 0; k < m; k++) {
    rp.slot[k] = -1;
    if (!rp.full[k] || rp.out[k]) continue;
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
  bool oom = false;
#pragma omp parallel if (rp.rows * rp.n >= NBI_PAR_MIN && n_blocks > 1)
  {
    char *scr = aligned_alloc(64, scr_bytes);
    if (!scr) {
#pragma omp atomic write
      oom = true;
    }
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < n_blocks; b++)
      for (int64_t r = b * rb; scr && r < rp.rows && r < (b + 1) * rb; r++)
        fused_row(&rp, r, scr);
    free(scr);
  }
  if (oom)
    return nbi_error(NB_ERR_OOM, "nb_eval: out of memory for a fused group's rows (%lld bytes)",
                     (long long)scr_bytes);
  fused_global(&rp);
  return NB_OK;
}
