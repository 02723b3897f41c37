/* src/backends/ew_formulas.h — the elementwise formulas, one expression per op and
 * domain, shared by every backend (tinygrad's renderer table, as C X-macros).
 *
 * The CPU kernels (src/backends/cpu/k_elementwise.c) expand each list into row
 * functions; the CUDA generator (src/backends/cuda) stringizes the same
 * expressions into generated CUDA C. An expression is written in terms of:
 *   x (unary) or a, b (binary), of the domain's type T;
 *   FN(f): the C library's f for T (fabsf / fabs ...);
 *   VM(f): the backend's accurate vectorizable f for T (CPU: vmath.h's vm_<f>f
 *          for float, libm for double);
 *   wrap_add / wrap_sub / wrap_mul (wrapping int64), int_pow, int_mod,
 *   FN(floor_mod) (NumPy's remainder for floats).
 * Every backend defines those names, so one edit here changes the math, and its
 * NaN rules, everywhere. Domains: float (f32; f16 / bf16 compute in it), double
 * (f64), int64 (i32, i64, bool). Each list takes S, a suffix the CPU compiles
 * its row functions for (one per ISA); other backends pass anything. */
#ifndef NABLA_EW_FORMULAS_H
#define NABLA_EW_FORMULAS_H

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

#endif
