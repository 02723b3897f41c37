/* src/ops/elementwise.c — elementwise unary and binary ops, their scalar forms,
 * where, clip, cast.
 *
 * Semantics (NumPy broadcasting; dtypes promote with nb_promote_types, JAX's
 * lattice):
 * - Every node except cast stores its compute dtype in attrs.i[0]: the inputs
 *   are converted to it and the op is evaluated there (f16/bf16 in f32 and
 *   rounded once at the store, f64 in double, i32/i64/bool exactly in int64).
 *   It is the promoted input dtype, except for float-only ops below.
 * - Float-only ops (exp expm1 log log1p sqrt rsqrt sin cos tan tanh sigmoid gelu
 *   silu softplus erf reciprocal, div, atan2) on integer or bool inputs compute
 *   and return f32, as JAX. div is true division.
 * - neg abs sign square relu floor ceil round keep integer dtypes (floor, ceil,
 *   round are the identity there; round is half to even). On bool, these and
 *   add/mul/maximum/minimum/pow/mod compute on 0/1 and store != 0, so add and
 *   maximum act as or, mul and minimum as and (JAX). neg of bool and sub of two
 *   bools are NB_ERR_DTYPE errors (NumPy).
 * - Integer arithmetic wraps (two's complement) on overflow, as NumPy and JAX.
 *   pow on integers is exact (repeated squaring); a negative exponent gives 0
 *   unless the base is +-1. mod takes the sign of the divisor (NumPy); integer
 *   mod by 0 gives 0, float mod by 0 NaN.
 * - maximum/minimum propagate NaN. Comparisons compare in the promoted dtype;
 *   they and the logical ops (nonzero, NaN included, is true) return bool.
 * - Scalar forms are weakly typed: the scalar becomes a 0-d tensor of the
 *   tensor's dtype. An integer or bool tensor with a non-integral (or
 *   non-finite) scalar gives f32; a bool tensor with an integral scalar gives
 *   i32 (JAX: a Python int with a bool array is int32). An integral scalar that
 *   does not fit an integer tensor's dtype is an NB_ERR_ARG error (JAX raises).
 * - where: cond must be bool; a and b promote; all three broadcast.
 * - clip(t, lo, hi) = minimum(maximum(t, lo), hi) with weak scalars, as NumPy
 *   (so lo > hi gives hi everywhere; NaN stays NaN).
 * - cast: float -> int truncates toward zero and saturates, NaN -> 0 (XLA);
 *   int -> int wraps; -> bool is != 0; narrowing float casts round once to
 *   nearest even (f64 -> f16 too). A cast to the same dtype aliases the input.
 */
#include "../backends/cpu/k_elementwise.h"

#include <math.h>

/* ---- records ------------------------------------------------------------------------ */
/* attrs.i[0] of every op but CAST: the compute dtype. */
static bool cast_view(const nb_tensor *n, const nbi_view *in, nbi_view *out);

const nbi_op_def nbi_opdef_NEG = {
    .name = "neg", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_ABS = {
    .name = "abs", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_SIGN = {
    .name = "sign", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_EXP = {
    .name = "exp", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_EXPM1 = {
    .name = "expm1", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_LOG = {
    .name = "log", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_LOG1P = {
    .name = "log1p", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_SQRT = {
    .name = "sqrt", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_RSQRT = {
    .name = "rsqrt", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_SQUARE = {
    .name = "square", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_SIN = {
    .name = "sin", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_COS = {
    .name = "cos", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_TAN = {
    .name = "tan", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_TANH = {
    .name = "tanh", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_SIGMOID = {
    .name = "sigmoid", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_RELU = {
    .name = "relu", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_GELU = {
    .name = "gelu", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_SILU = {
    .name = "silu", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_SOFTPLUS = {
    .name = "softplus", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_ERF = {
    .name = "erf", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_FLOOR = {
    .name = "floor", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_CEIL = {
    .name = "ceil", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_ROUND = {
    .name = "round", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_RECIPROCAL = {
    .name = "reciprocal", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_LOGICAL_NOT = {
    .name = "logical_not", .arity = 1, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_CAST = {
    .name = "cast", .arity = 1, .cpu = nbi_cpu_cast, .view = cast_view};
const nbi_op_def nbi_opdef_ADD = {
    .name = "add", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_SUB = {
    .name = "sub", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_MUL = {
    .name = "mul", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_DIV = {
    .name = "div", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_POW = {
    .name = "pow", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_MAXIMUM = {
    .name = "maximum", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_MINIMUM = {
    .name = "minimum", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_ATAN2 = {
    .name = "atan2", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_MOD = {
    .name = "mod", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_EQ = {
    .name = "eq", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_NE = {
    .name = "ne", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_LT = {
    .name = "lt", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_LE = {
    .name = "le", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_GT = {
    .name = "gt", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_GE = {
    .name = "ge", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_LOGICAL_AND = {
    .name = "logical_and", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_LOGICAL_OR = {
    .name = "logical_or", .arity = 2, .cpu = nbi_cpu_elementwise, .view = NULL};
const nbi_op_def nbi_opdef_WHERE = {
    .name = "where", .arity = 3, .cpu = nbi_cpu_elementwise, .view = NULL};

/* ---- dtype rules ------------------------------------------------------------------------ */
/* Ops with no integer meaning: integer and bool inputs compute in f32. */
static const bool float_only[NBI_OP_COUNT] = {
    [NBI_OP_EXP] = true,        [NBI_OP_EXPM1] = true,    [NBI_OP_LOG] = true,
    [NBI_OP_LOG1P] = true,      [NBI_OP_SQRT] = true,     [NBI_OP_RSQRT] = true,
    [NBI_OP_SIN] = true,        [NBI_OP_COS] = true,      [NBI_OP_TAN] = true,
    [NBI_OP_TANH] = true,       [NBI_OP_SIGMOID] = true,  [NBI_OP_GELU] = true,
    [NBI_OP_SILU] = true,       [NBI_OP_SOFTPLUS] = true, [NBI_OP_ERF] = true,
    [NBI_OP_RECIPROCAL] = true, [NBI_OP_DIV] = true,      [NBI_OP_ATAN2] = true,
};

/* Predicates: the result is bool. */
static const bool returns_bool[NBI_OP_COUNT] = {
    [NBI_OP_LOGICAL_NOT] = true, [NBI_OP_EQ] = true,          [NBI_OP_NE] = true,
    [NBI_OP_LT] = true,          [NBI_OP_LE] = true,          [NBI_OP_GT] = true,
    [NBI_OP_GE] = true,          [NBI_OP_LOGICAL_AND] = true, [NBI_OP_LOGICAL_OR] = true,
};

/* Records op on the compute dtype cdt (attrs.i[0]); the result is bool for
 * predicates, else cdt. */
static nb_tensor *record(int op, nb_dtype cdt, const nb_shape *s, nb_tensor *const *in, int n) {
  if (float_only[op] && !nb_dtype_is_float(cdt)) cdt = NB_F32;
  nbi_attrs at = {0};
  at.i[0] = cdt;
  return nbi_record(op, returns_bool[op] ? NB_BOOL : cdt, s, in, n, &at);
}

/* ---- unary ------------------------------------------------------------------------------- */
static nb_tensor *unary(const char *fn, int op, nb_tensor *t) {
  if (nbi_any_null(fn, &t, 1)) return NULL;
  if (op == NBI_OP_NEG && t->dtype == NB_BOOL) {
    nbi_error(NB_ERR_DTYPE, "%s: negation of a bool tensor is not supported (use nb_logical_not)",
              fn);
    return NULL;
  }
  return record(op, t->dtype, &t->shape, &t, 1);
}

/* clang-format off */
#define EW_UNARY_PUBLIC(X)                                                                         \
  X(NEG, neg) X(ABS, abs) X(SIGN, sign) X(EXP, exp) X(EXPM1, expm1) X(LOG, log)                    \
  X(LOG1P, log1p) X(SQRT, sqrt) X(RSQRT, rsqrt) X(SQUARE, square) X(SIN, sin) X(COS, cos)          \
  X(TAN, tan) X(TANH, tanh) X(SIGMOID, sigmoid) X(RELU, relu) X(GELU, gelu) X(SILU, silu)          \
  X(SOFTPLUS, softplus) X(ERF, erf) X(FLOOR, floor) X(CEIL, ceil) X(ROUND, round)                  \
  X(RECIPROCAL, reciprocal) X(LOGICAL_NOT, logical_not)
/* clang-format on */

#define DEF_UNARY_PUBLIC(ID, name)                                                                 \
  nb_tensor *nb_##name(nb_tensor *t) { return unary("nb_" #name, NBI_OP_##ID, t); }
EW_UNARY_PUBLIC(DEF_UNARY_PUBLIC)
#undef DEF_UNARY_PUBLIC

/* ---- binary ------------------------------------------------------------------------------ */
static nb_tensor *binary(const char *fn, int op, nb_tensor *a, nb_tensor *b) {
  nb_tensor *in[2] = {a, b};
  if (nbi_any_null(fn, in, 2)) return NULL;
  nb_shape s;
  if (nbi_broadcast_shapes(fn, &a->shape, &b->shape, &s)) return NULL;
  nb_dtype dt = nb_promote_types(a->dtype, b->dtype);
  if (op == NBI_OP_SUB && dt == NB_BOOL) {
    nbi_error(NB_ERR_DTYPE,
              "%s: subtraction of bool tensors is not supported (use nb_logical_and / "
              "nb_logical_not, or cast first)",
              fn);
    return NULL;
  }
  return record(op, dt, &s, in, 2);
}

/* clang-format off */
#define EW_BINARY_PUBLIC(X)                                                                        \
  X(ADD, add) X(SUB, sub) X(MUL, mul) X(DIV, div) X(POW, pow) X(MAXIMUM, maximum)                  \
  X(MINIMUM, minimum) X(ATAN2, atan2) X(MOD, mod) X(EQ, eq) X(NE, ne) X(LT, lt) X(LE, le)          \
  X(GT, gt) X(GE, ge) X(LOGICAL_AND, logical_and) X(LOGICAL_OR, logical_or)
/* clang-format on */

#define DEF_BINARY_PUBLIC(ID, name)                                                                \
  nb_tensor *nb_##name(nb_tensor *a, nb_tensor *b) {                                               \
    return binary("nb_" #name, NBI_OP_##ID, a, b);                                                 \
  }
EW_BINARY_PUBLIC(DEF_BINARY_PUBLIC)
#undef DEF_BINARY_PUBLIC

/* ---- scalar forms ------------------------------------------------------------------------- */
/* The weakly typed 0-d tensor for scalar s next to t (rules in the header
 * comment), or NULL with an error naming fn. */
static nb_tensor *weak_scalar(const char *fn, const nb_tensor *t, double s) {
  nb_dtype dt = t->dtype;
  if (!nb_dtype_is_float(dt)) {
    if (!isfinite(s) || s != floor(s)) {
      dt = NB_F32;
    } else {
      if (dt == NB_BOOL) dt = NB_I32;
      bool fits = dt == NB_I32 ? s >= -0x1p31 && s < 0x1p31 : s >= -0x1p63 && s < 0x1p63;
      if (!fits) {
        nbi_error(NB_ERR_ARG, "%s: scalar %.17g does not fit the tensor's dtype %s", fn, s,
                  nb_dtype_name(dt));
        return NULL;
      }
    }
  }
  return nb_scalar(s, dt);
}

/* op(t, s), or op(s, t) when reversed. */
static nb_tensor *scalar_op(const char *fn, int op, nb_tensor *t, double s, bool reversed) {
  if (nbi_any_null(fn, &t, 1)) return NULL;
  nb_tensor *c = weak_scalar(fn, t, s);
  if (!c) return NULL;
  return reversed ? binary(fn, op, c, t) : binary(fn, op, t, c);
}

/* clang-format off */
#define EW_SCALAR_PUBLIC(X)                                                                        \
  X(add, ADD, false) X(sub, SUB, false) X(rsub, SUB, true) X(mul, MUL, false)                      \
  X(div, DIV, false) X(rdiv, DIV, true) X(pow, POW, false) X(maximum, MAXIMUM, false)              \
  X(minimum, MINIMUM, false) X(eq, EQ, false) X(ne, NE, false) X(lt, LT, false)                    \
  X(le, LE, false) X(gt, GT, false) X(ge, GE, false)
/* clang-format on */

#define DEF_SCALAR_PUBLIC(name, ID, reversed)                                                      \
  nb_tensor *nb_##name##_scalar(nb_tensor *t, double s) {                                          \
    return scalar_op("nb_" #name "_scalar", NBI_OP_##ID, t, s, reversed);                          \
  }
EW_SCALAR_PUBLIC(DEF_SCALAR_PUBLIC)
#undef DEF_SCALAR_PUBLIC

nb_tensor *nb_clip(nb_tensor *t, double lo, double hi) {
  return scalar_op("nb_clip", NBI_OP_MINIMUM, scalar_op("nb_clip", NBI_OP_MAXIMUM, t, lo, false),
                   hi, false);
}

/* ---- where, cast -------------------------------------------------------------------------- */
nb_tensor *nb_where(nb_tensor *cond, nb_tensor *a, nb_tensor *b) {
  nb_tensor *in[3] = {cond, a, b};
  if (nbi_any_null("nb_where", in, 3)) return NULL;
  if (cond->dtype != NB_BOOL) {
    nbi_error(NB_ERR_DTYPE, "nb_where: cond must be bool, got %s (compare it first, e.g. nb_ne)",
              nb_dtype_name(cond->dtype));
    return NULL;
  }
  nb_shape ab, s;
  if (nbi_broadcast_shapes("nb_where", &a->shape, &b->shape, &ab) ||
      nbi_broadcast_shapes("nb_where", &cond->shape, &ab, &s))
    return NULL;
  return record(NBI_OP_WHERE, nb_promote_types(a->dtype, b->dtype), &s, in, 3);
}

nb_tensor *nb_cast(nb_tensor *t, nb_dtype dt) {
  if (nbi_any_null("nb_cast", &t, 1)) return NULL;
  if (!nbi_dtype_valid(dt)) {
    nbi_error(NB_ERR_DTYPE, "nb_cast: invalid dtype %d", (int)dt);
    return NULL;
  }
  return nbi_record(NBI_OP_CAST, dt, &t->shape, &t, 1, NULL);
}

/* A cast to the input's own dtype is a view of it. */
static bool cast_view(const nb_tensor *n, const nbi_view *in, nbi_view *out) {
  if (in->dtype != n->dtype) return false;
  out->data = in->data;
  memcpy(out->strides, in->strides, sizeof out->strides);
  return true;
}
