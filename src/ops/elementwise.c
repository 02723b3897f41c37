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
 * - Derivatives: VJP/JVP rules at the end of the file (JAX's conventions).
 * - Batching (vmap): one rule for every op, cast included, after them: the same
 *   node on the batched inputs.
 */
#include "../core/nbi.h"
#include "../core/oprules.h"

#include <math.h>

#include "rule_util.h"

/* ---- records ------------------------------------------------------------------------ */
/* attrs.i[0] of every op but CAST: the compute dtype. */
static bool cast_view(const nb_tensor *n, const nbi_view *in, nbi_view *out);
/* Autodiff rules of every differentiable op here (end of file). The rest are
 * NONDIFF: sign floor ceil round (piecewise constant), predicates (bool). */
static nb_status ew_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin);
static nb_tensor *ew_jvp(nb_tensor *y, nb_tensor *const *tin);
/* The batching rule of every op here, cast included (end of file). */
static nb_tensor *ew_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B);

/* clang-format off */
#define EW_DIFF_RECORDS(X)                                                                         \
  X(NEG, "neg", 1) X(ABS, "abs", 1) X(EXP, "exp", 1) X(EXPM1, "expm1", 1) X(LOG, "log", 1)         \
  X(LOG1P, "log1p", 1) X(SQRT, "sqrt", 1) X(RSQRT, "rsqrt", 1) X(SQUARE, "square", 1)              \
  X(SIN, "sin", 1) X(COS, "cos", 1) X(TAN, "tan", 1) X(TANH, "tanh", 1) X(SIGMOID, "sigmoid", 1)   \
  X(RELU, "relu", 1) X(GELU, "gelu", 1) X(SILU, "silu", 1) X(SOFTPLUS, "softplus", 1)              \
  X(ERF, "erf", 1) X(RECIPROCAL, "reciprocal", 1) X(ADD, "add", 2) X(SUB, "sub", 2)                \
  X(MUL, "mul", 2) X(DIV, "div", 2) X(POW, "pow", 2) X(MAXIMUM, "maximum", 2)                      \
  X(MINIMUM, "minimum", 2) X(ATAN2, "atan2", 2) X(MOD, "mod", 2) X(WHERE, "where", 3)
#define EW_NONDIFF_RECORDS(X)                                                                      \
  X(SIGN, "sign", 1) X(FLOOR, "floor", 1) X(CEIL, "ceil", 1) X(ROUND, "round", 1)                  \
  X(LOGICAL_NOT, "logical_not", 1) X(EQ, "eq", 2) X(NE, "ne", 2) X(LT, "lt", 2) X(LE, "le", 2)     \
  X(GT, "gt", 2) X(GE, "ge", 2) X(LOGICAL_AND, "logical_and", 2) X(LOGICAL_OR, "logical_or", 2)
/* clang-format on */

#define DEF_DIFF_RECORD(ID, nm, ar)                                                                \
  const nbi_op_def nbi_opdef_##ID = {                                                              \
      .name = nm, .arity = ar, .vjp = ew_vjp, .jvp = ew_jvp, .vmap = ew_vmap};
#define DEF_NONDIFF_RECORD(ID, nm, ar)                                                             \
  const nbi_op_def nbi_opdef_##ID = {                                                              \
      .name = nm, .arity = ar, .flags = NBI_OPF_NONDIFF, .vmap = ew_vmap};
EW_DIFF_RECORDS(DEF_DIFF_RECORD)
EW_NONDIFF_RECORDS(DEF_NONDIFF_RECORD)
#undef DEF_DIFF_RECORD
#undef DEF_NONDIFF_RECORD

const nbi_op_def nbi_opdef_CAST = {
    .name = "cast", .arity = 1, .view = cast_view, .vjp = ew_vjp, .jvp = ew_jvp, .vmap = ew_vmap};

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
      bool fits = dt == NB_I32   ? s >= -0x1p31 && s < 0x1p31
                  : dt == NB_U8  ? s >= 0 && s < 0x1p8
                  : dt == NB_I8  ? s >= -0x1p7 && s < 0x1p7
                  : dt == NB_I16 ? s >= -0x1p15 && s < 0x1p15
                                 : s >= -0x1p63 && s < 0x1p63;
      if (!fits) {
        nbi_error(NB_ERR_ARG, "%s: scalar %.17g does not fit the tensor's dtype %s", fn, s,
                  nb_dtype_name(dt));
        return NULL;
      }
    }
  }
  return nbi_full_on(t->device, &(nb_shape){0}, s, dt);
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

/* ---- autodiff rules ----------------------------------------------------------------------- */
/* Every elementwise derivative is diagonal: y's derivative along input k is
 * g * dy/dx_k elementwise, the same product for a cotangent (VJP) and for a
 * tangent (JVP). partial() forms it; the rules only fit shapes and dtypes.
 * Conventions are JAX's: relu'(0) = 0, abs'(x) = sign(x) (0 at 0), maximum and
 * minimum split a tie 0.5 / 0.5, mod's d/db = -floor(a/b), pow's d/db uses
 * log(a) with a == 0 replaced by 1 (so a == 0 gives 0, not NaN * 0). */

/* Input k of y converted to y's dtype: derivatives evaluate in the dtype the op
 * computed in (an f16 operand of an f32 add, an i32 operand of an f64 atan2). */
static nb_tensor *in_as(nb_tensor *y, int k) {
  nb_tensor *x = y->in[k];
  return x->dtype == y->dtype ? x : nb_cast(x, y->dtype);
}

/* 1/sqrt(2 pi) and 2/sqrt(pi). */
#define EW_INV_SQRT_2PI 0.39894228040143267794
#define EW_TWO_INV_SQRT_PI 1.12837916709551257390

static nb_tensor *zero_of(const nb_tensor *y) { return nb_scalar(0, y->dtype); }

/* g * dy/d(in k), g in y's dtype and of y's shape or input k's (it broadcasts).
 * Unary ops read x = in[0]; binary ones x = in[0] and b = in[1]. */
static nb_tensor *partial(nb_tensor *y, nb_tensor *g, int k) {
  int op = y->op;
  if (op == NBI_OP_NEG) return nb_neg(g);
  if (op == NBI_OP_CAST || op == NBI_OP_ADD || (op == NBI_OP_SUB && k == 0) ||
      (op == NBI_OP_MOD && k == 0))
    return g;
  if (op == NBI_OP_SUB) return nb_neg(g);
  if (op == NBI_OP_WHERE) /* the cotangent goes to the chosen branch */
    return k == 1 ? nb_where(y->in[0], g, zero_of(y)) : nb_where(y->in[0], zero_of(y), g);
  nb_tensor *x = in_as(y, 0), *b = y->n_in == 2 ? in_as(y, 1) : NULL;
  switch (op) {
  case NBI_OP_ABS: return nb_mul(g, nb_sign(x));
  case NBI_OP_EXP: return nb_mul(g, y);
  case NBI_OP_EXPM1: return nb_mul(g, nb_add_scalar(y, 1));
  case NBI_OP_LOG: return nb_div(g, x);
  case NBI_OP_LOG1P: return nb_div(g, nb_add_scalar(x, 1));
  case NBI_OP_SQRT: return nb_div(g, nb_mul_scalar(y, 2));
  case NBI_OP_RSQRT: return nb_mul(g, nb_mul_scalar(nb_div(y, x), -0.5)); /* -y / 2x */
  case NBI_OP_SQUARE: return nb_mul(g, nb_mul_scalar(x, 2));
  case NBI_OP_SIN: return nb_mul(g, nb_cos(x));
  case NBI_OP_COS: return nb_neg(nb_mul(g, nb_sin(x)));
  case NBI_OP_TAN: return nb_mul(g, nb_add_scalar(nb_square(y), 1));
  case NBI_OP_TANH: return nb_mul(g, nb_rsub_scalar(nb_square(y), 1));
  case NBI_OP_SIGMOID: return nb_mul(g, nb_mul(y, nb_rsub_scalar(y, 1)));
  case NBI_OP_RELU: /* from the output (y > 0 iff x > 0, NaN included): a matmul, bias and
                       relu epilogue then need not store the pre-activation */
    return nb_where(nb_gt_scalar(y, 0), g, zero_of(y));
  case NBI_OP_GELU: { /* Phi(x) + x phi(x), Phi(x) = y / x read from the output (a second
                         erf costs more than the matmuls around it; 1 ulp, and no
                         cancellation for x << 0), 1/2 at x == 0: z = 1 - sign(x)^2 is 1
                         there and 0 elsewhere (an f32 select, so the steps fuse as one) */
    nb_tensor *z = nb_rsub_scalar(nb_square(nb_sign(x)), 1);
    nb_tensor *cdf = nb_div(nb_add(y, nb_mul_scalar(z, 0.5)), nb_add(x, z));
    nb_tensor *pdf = nb_mul_scalar(nb_exp(nb_mul_scalar(nb_square(x), -0.5)), EW_INV_SQRT_2PI);
    return nb_mul(g, nb_add(cdf, nb_mul(x, pdf)));
  }
  case NBI_OP_SILU: { /* s (1 + x (1 - s)), s = sigmoid(x) */
    nb_tensor *s = nb_sigmoid(x);
    return nb_mul(g, nb_mul(s, nb_add_scalar(nb_mul(x, nb_rsub_scalar(s, 1)), 1)));
  }
  case NBI_OP_SOFTPLUS: return nb_mul(g, nb_sigmoid(x));
  case NBI_OP_ERF:
    return nb_mul(g, nb_mul_scalar(nb_exp(nb_neg(nb_square(x))), EW_TWO_INV_SQRT_PI));
  case NBI_OP_RECIPROCAL: return nb_neg(nb_mul(g, nb_square(y)));
  case NBI_OP_MUL: return nb_mul(g, k == 0 ? b : x);
  case NBI_OP_DIV: return k == 0 ? nb_div(g, b) : nb_neg(nb_mul(g, nb_div(y, b)));
  case NBI_OP_POW:
    if (k == 0) { /* b x^(b-1); an integer b == 0 gives 0 even at x == 0 (JAX) */
      nb_tensor *d = nb_mul(b, nb_pow(x, nb_sub_scalar(b, 1)));
      if (!nb_dtype_is_float(y->in[1]->dtype))
        d = nb_where(nb_eq_scalar(y->in[1], 0), zero_of(y), d);
      return nb_mul(g, d);
    } else { /* log(x) y, with log(0) read as 0 */
      nb_tensor *safe = nb_where(nb_eq_scalar(x, 0), nb_scalar(1, y->dtype), x);
      return nb_mul(g, nb_mul(nb_log(safe), y));
    }
  case NBI_OP_MAXIMUM:
  case NBI_OP_MINIMUM: { /* 1 where this operand is the result, halved on a tie */
    nb_tensor *won = nb_eq(k == 0 ? x : b, y), *other = nb_eq(k == 0 ? b : x, y);
    nb_tensor *share = nb_div(nb_where(won, nb_scalar(1, y->dtype), zero_of(y)),
                              nb_where(other, nb_scalar(2, y->dtype), nb_scalar(1, y->dtype)));
    return nb_mul(g, share);
  }
  case NBI_OP_ATAN2: { /* d/dx = b / (x^2 + b^2), d/db = -x / (x^2 + b^2) */
    nb_tensor *r2 = nb_add(nb_square(x), nb_square(b));
    return k == 0 ? nb_mul(g, nb_div(b, r2)) : nb_neg(nb_mul(g, nb_div(x, r2)));
  }
  case NBI_OP_MOD: return nb_neg(nb_mul(g, nb_floor(nb_div(x, b)))); /* d/db */
  default:
    nbi_error(NB_ERR_INTERNAL, "autodiff: no elementwise rule for op %s", nbi_op_table[op]->name);
    return NULL;
  }
}

/* Inputs with a derivative: all but where's cond. */
static int first_diff_input(const nb_tensor *y) { return y->op == NBI_OP_WHERE ? 1 : 0; }

static nb_status ew_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!nb_dtype_is_float(y->dtype)) return NB_OK; /* a cast to an integer: no flow */
  for (int k = first_diff_input(y); k < y->n_in; k++) {
    if (!need[k]) continue;
    gin[k] = nbi_grad_fit(partial(y, gy, k), y->in[k]);
    if (!gin[k]) return nb_last_status();
  }
  return NB_OK;
}

static nb_tensor *ew_jvp(nb_tensor *y, nb_tensor *const *tin) {
  if (!nb_dtype_is_float(y->dtype)) return NULL;
  nb_tensor *t = NULL;
  for (int k = first_diff_input(y); k < y->n_in; k++) {
    if (!tin[k]) continue;
    nb_tensor *g = tin[k]->dtype == y->dtype ? tin[k] : nb_cast(tin[k], y->dtype);
    nb_tensor *d = partial(y, g, k);
    if (!d) return NULL;
    t = nbi_add_maybe(t, d);
    if (!t) return NULL;
  }
  /* a tangent of a broadcast operand alone (add, where) has that operand's shape */
  if (t && !nbi_shape_eq(&t->shape, &y->shape)) t = nb_broadcast_to(t, y->shape);
  return t;
}

/* ---- batching rule ------------------------------------------------------------------------
 * Elementwise ops commute with the batch: the batched node is the same op with
 * the same attrs (the compute dtype) on the batched inputs, of shape
 * (B, *y's shape). A batched input of lower per-example rank gets singleton
 * dims after its batch dim (nbi_bat_align) so that it broadcasts per example;
 * unbatched inputs broadcast from the right against the batched result as
 * they did against y. cast keeps its input's shape, so the same rule holds. */
static nb_tensor *ew_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  (void)B; /* the batched inputs carry it */
  nb_tensor *in[3];
  int kb = 0;
  for (int k = 0; k < y->n_in; k++) {
    if (!(in[k] = nbi_bat_align(bin[k], batched[k], y->shape.ndim))) return NULL;
    if (batched[k]) kb = k;
  }
  /* in[kb] is (B, ..) of rank y's + 1; the other dims are y's */
  nb_shape s = in[kb]->shape;
  memcpy(s.dims + 1, y->shape.dims, sizeof(int64_t) * (size_t)y->shape.ndim);
  return nbi_record(y->op, y->dtype, &s, in, y->n_in, &y->attrs);
}
