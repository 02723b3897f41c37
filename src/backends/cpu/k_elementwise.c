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

#include <math.h>

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

/* ---- the op lists: one expression per op and domain ------------------------------ */
/* clang-format off */
/* Float domains: x (unary) or a, b (binary) have type T; FN(f) is libm's f for T. */
#define EW_UNARY_FLOAT(X)                                                                          \
  X(NEG, -x)                                                                                       \
  X(ABS, FN(fabs)(x))                                                                              \
  X(SIGN, x > 0 ? (T)1 : x < 0 ? (T)-1 : x) /* keeps +-0 and NaN */                                \
  X(EXP, FN(exp)(x))                                                                               \
  X(EXPM1, FN(expm1)(x))                                                                           \
  X(LOG, FN(log)(x))                                                                               \
  X(LOG1P, FN(log1p)(x))                                                                           \
  X(SQRT, FN(sqrt)(x))                                                                             \
  X(RSQRT, (T)1 / FN(sqrt)(x))                                                                     \
  X(SQUARE, x * x)                                                                                 \
  X(SIN, FN(sin)(x))                                                                               \
  X(COS, FN(cos)(x))                                                                               \
  X(TAN, FN(tan)(x))                                                                               \
  X(TANH, FN(tanh)(x))                                                                             \
  X(SIGMOID, (T)1 / ((T)1 + FN(exp)(-x)))                                                          \
  X(RELU, x < 0 ? (T)0 : x)                         /* NaN passes through */                       \
  X(GELU, (T)0.5 * x * FN(erfc)(-x * (T)M_SQRT1_2)) /* x Phi(x), no cancellation for x << 0 */     \
  X(SILU, x / ((T)1 + FN(exp)(-x)))                                                                \
  X(SOFTPLUS, (x > 0 ? x : (T)0) + FN(log1p)(FN(exp)(-FN(fabs)(x))))                               \
  X(ERF, FN(erf)(x))                                                                               \
  X(FLOOR, FN(floor)(x))                                                                           \
  X(CEIL, FN(ceil)(x))                                                                             \
  X(ROUND, FN(nearbyint)(x)) /* default rounding mode: half to even */                             \
  X(RECIPROCAL, (T)1 / x)

#define EW_BINARY_FLOAT(X)                                                                         \
  X(ADD, a + b)                                                                                    \
  X(SUB, a - b)                                                                                    \
  X(MUL, a * b)                                                                                    \
  X(DIV, a / b)                                                                                    \
  X(POW, FN(pow)(a, b))                                                                            \
  X(MAXIMUM, (a > b || a != a) ? a : b) /* NaN in either propagates */                             \
  X(MINIMUM, (a < b || a != a) ? a : b)                                                            \
  X(ATAN2, FN(atan2)(a, b))                                                                        \
  X(MOD, FN(floor_mod)(a, b))

/* int64 domain (i32, i64 and bool; the store wraps to i32 or tests != 0 for
 * bool, so add/mul/maximum/minimum on bool act as or/and/or/and). Ops missing
 * here are float-only: the op layer gives them an f32 compute dtype. */
#define EW_UNARY_INT(X)                                                                            \
  X(NEG, wrap_sub(0, x))                                                                           \
  X(ABS, x < 0 ? wrap_sub(0, x) : x)                                                               \
  X(SIGN, (int64_t)((x > 0) - (x < 0)))                                                            \
  X(SQUARE, wrap_mul(x, x))                                                                        \
  X(RELU, x < 0 ? 0 : x)                                                                           \
  X(FLOOR, x)                                                                                      \
  X(CEIL, x)                                                                                       \
  X(ROUND, x)

#define EW_BINARY_INT(X)                                                                           \
  X(ADD, wrap_add(a, b))                                                                           \
  X(SUB, wrap_sub(a, b))                                                                           \
  X(MUL, wrap_mul(a, b))                                                                           \
  X(POW, int_pow(a, b))                                                                            \
  X(MAXIMUM, a > b ? a : b)                                                                        \
  X(MINIMUM, a < b ? a : b)                                                                        \
  X(MOD, int_mod(a, b))

/* Predicates, every domain: the result is written as bool (0 or 1). */
#define EW_UNARY_PRED(X) X(LOGICAL_NOT, x == 0)

#define EW_BINARY_PRED(X)                                                                          \
  X(EQ, a == b)                                                                                    \
  X(NE, a != b)                                                                                    \
  X(LT, a < b)                                                                                     \
  X(LE, a <= b)                                                                                    \
  X(GT, a > b)                                                                                     \
  X(GE, a >= b)                                                                                    \
  X(LOGICAL_AND, a != 0 && b != 0)                                                                 \
  X(LOGICAL_OR, a != 0 || b != 0)
/* clang-format on */

/* ---- row functions ----------------------------------------------------------------- */
/* Operands are unit-stride (s = 1) or one broadcast value (s = 0); o is
 * contiguous; n elements. The stride cases are separate loops so each one
 * vectorizes. */
typedef void (*unary_row)(void *restrict o, const void *restrict a, int64_t sa, int64_t n);
typedef void (*binary_row)(void *restrict o, const void *restrict a, int64_t sa,
                           const void *restrict b, int64_t sb, int64_t n);
typedef void (*where_row)(void *restrict o, const uint8_t *restrict c, int64_t sc,
                          const void *restrict a, int64_t sa, const void *restrict b, int64_t sb,
                          int64_t n);

#define DEF_UNARY(NAME, TO, TI, EXPR)                                                              \
  static void NAME(void *restrict ov, const void *restrict av, int64_t sa, int64_t n) {            \
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

#define DEF_BINARY(NAME, TO, TI, EXPR)                                                             \
  static void NAME(void *restrict ov, const void *restrict av, int64_t sa,                         \
                   const void *restrict bv, int64_t sb, int64_t n) {                               \
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

#define DEF_WHERE(NAME, T)                                                                         \
  static void NAME(void *restrict ov, const uint8_t *restrict c, int64_t sc,                       \
                   const void *restrict av, int64_t sa, const void *restrict bv, int64_t sb,       \
                   int64_t n) {                                                                    \
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
#define UN(ID, EXPR) DEF_UNARY(un_##ID##_f32, float, float, EXPR)
#define BIN(ID, EXPR) DEF_BINARY(bin_##ID##_f32, float, float, EXPR)
#define UNP(ID, EXPR) DEF_UNARY(un_##ID##_f32, uint8_t, float, EXPR)
#define BINP(ID, EXPR) DEF_BINARY(bin_##ID##_f32, uint8_t, float, EXPR)
EW_UNARY_FLOAT(UN)
EW_BINARY_FLOAT(BIN)
EW_UNARY_PRED(UNP)
EW_BINARY_PRED(BINP)
DEF_WHERE(where_f32, float)
#undef T
#undef FN
#undef UN
#undef BIN
#undef UNP
#undef BINP

/* double */
#define T double
#define FN(name) name
#define UN(ID, EXPR) DEF_UNARY(un_##ID##_f64, double, double, EXPR)
#define BIN(ID, EXPR) DEF_BINARY(bin_##ID##_f64, double, double, EXPR)
#define UNP(ID, EXPR) DEF_UNARY(un_##ID##_f64, uint8_t, double, EXPR)
#define BINP(ID, EXPR) DEF_BINARY(bin_##ID##_f64, uint8_t, double, EXPR)
EW_UNARY_FLOAT(UN)
EW_BINARY_FLOAT(BIN)
EW_UNARY_PRED(UNP)
EW_BINARY_PRED(BINP)
DEF_WHERE(where_f64, double)
#undef T
#undef FN
#undef UN
#undef BIN
#undef UNP
#undef BINP

/* int64 */
#define UN(ID, EXPR) DEF_UNARY(un_##ID##_i64, int64_t, int64_t, EXPR)
#define BIN(ID, EXPR) DEF_BINARY(bin_##ID##_i64, int64_t, int64_t, EXPR)
#define UNP(ID, EXPR) DEF_UNARY(un_##ID##_i64, uint8_t, int64_t, EXPR)
#define BINP(ID, EXPR) DEF_BINARY(bin_##ID##_i64, uint8_t, int64_t, EXPR)
EW_UNARY_INT(UN)
EW_BINARY_INT(BIN)
EW_UNARY_PRED(UNP)
EW_BINARY_PRED(BINP)
DEF_WHERE(where_i64, int64_t)
#undef UN
#undef BIN
#undef UNP
#undef BINP

/* ---- dispatch tables, indexed [domain][op] ----------------------------------------- */
#define ENTRY_UN_F32(ID, EXPR) [NBI_OP_##ID] = un_##ID##_f32,
#define ENTRY_UN_F64(ID, EXPR) [NBI_OP_##ID] = un_##ID##_f64,
#define ENTRY_UN_I64(ID, EXPR) [NBI_OP_##ID] = un_##ID##_i64,
#define ENTRY_BIN_F32(ID, EXPR) [NBI_OP_##ID] = bin_##ID##_f32,
#define ENTRY_BIN_F64(ID, EXPR) [NBI_OP_##ID] = bin_##ID##_f64,
#define ENTRY_BIN_I64(ID, EXPR) [NBI_OP_##ID] = bin_##ID##_i64,
#define ENTRY_PRED(ID, EXPR) [NBI_OP_##ID] = true,

static const unary_row unary_rows[DOM_COUNT][NBI_OP_COUNT] = {
    [DOM_F32] = {EW_UNARY_FLOAT(ENTRY_UN_F32) EW_UNARY_PRED(ENTRY_UN_F32)},
    [DOM_F64] = {EW_UNARY_FLOAT(ENTRY_UN_F64) EW_UNARY_PRED(ENTRY_UN_F64)},
    [DOM_I64] = {EW_UNARY_INT(ENTRY_UN_I64) EW_UNARY_PRED(ENTRY_UN_I64)},
};
static const binary_row binary_rows[DOM_COUNT][NBI_OP_COUNT] = {
    [DOM_F32] = {EW_BINARY_FLOAT(ENTRY_BIN_F32) EW_BINARY_PRED(ENTRY_BIN_F32)},
    [DOM_F64] = {EW_BINARY_FLOAT(ENTRY_BIN_F64) EW_BINARY_PRED(ENTRY_BIN_F64)},
    [DOM_I64] = {EW_BINARY_INT(ENTRY_BIN_I64) EW_BINARY_PRED(ENTRY_BIN_I64)},
};
static const where_row where_rows[DOM_COUNT] = {where_f32, where_f64, where_i64};
/* Ops whose row function writes bool directly. */
static const bool is_pred[NBI_OP_COUNT] = {EW_UNARY_PRED(ENTRY_PRED) EW_BINARY_PRED(ENTRY_PRED)};

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

/* Broadcasts the inputs to out, iterates rows, and runs chunks of rows in
 * parallel when the work is large. */
static void run(const ew_plan *pl, nbi_view *out, const nbi_view *in) {
  nb_shape shape = {.ndim = out->ndim};
  memcpy(shape.dims, out->dims, sizeof shape.dims);
  nbi_view v[3];
  const nbi_view *views[4] = {out};
  for (int k = 0; k < pl->n_in; k++) {
    v[k] = nbi_view_broadcast(&in[k], &shape);
    views[k + 1] = &v[k];
  }
  nbi_iter it;
  nbi_iter_init(&it, pl->n_in + 1, views);
  int last = it.ndim - 1;
  int64_t rows = nbi_iter_rows(&it), n = it.dims[last];
  int64_t n_chunks = (n + CHUNK - 1) / CHUNK, units = rows * n_chunks;
  size_t out_es = nb_dtype_size(out->dtype);
#pragma omp parallel for schedule(static) if (rows * n >= NBI_PAR_MIN && units > 1)
  for (int64_t u = 0; u < units; u++) {
    int64_t r = u / n_chunks, j0 = (u % n_chunks) * CHUNK;
    int64_t len = n - j0 < CHUNK ? n - j0 : CHUNK, off[4], s[3];
    const char *src[3];
    nbi_iter_row(&it, r, off);
    for (int k = 0; k < pl->n_in; k++) {
      s[k] = it.strides[k + 1][last];
      src[k] = v[k].data + (off[k + 1] + j0 * s[k]) * (int64_t)nb_dtype_size(v[k].dtype);
    }
    /* out is contiguous, so its inner stride is 1 */
    run_chunk(pl, out->data + (off[0] + j0) * (int64_t)out_es, src, s, len);
  }
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
    if (t->op == NBI_OP_WHERE)
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
