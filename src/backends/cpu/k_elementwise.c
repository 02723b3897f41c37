/* src/backends/cpu/k_elementwise.c — elementwise kernels: unary, binary, where,
 * cast; the row functions every elementwise executor runs (the fused groups'
 * too: k_fused.c).
 *
 * Every op is evaluated in one of three domains picked by the node's compute
 * dtype: float (f32, f16, bf16), double (f64), int64 (i32, i64, i16, i8, u8, bool). Each op's
 * scalar expression is written once in an X-macro list (../ew_formulas.h) and
 * instantiated per domain type as a row function over unit-stride or stride-0
 * operands.
 *
 * The driver walks rows with nbi_iter in units of up to CHUNK elements (k_ew.h,
 * "walks"): pieces of a long row, or blocks of whole short rows, so a row
 * function always runs on many elements and a single long row parallelizes
 * too; each thread takes one contiguous range of units. Per unit, an operand
 * that already has the domain's type and is one run of stride 0 or 1 is read
 * in place (the f32/f64 fast path: no copies, vectorizable loops); anything
 * else (other dtypes, arbitrary or negative strides, a broadcast row repeated
 * over a block) is first converted or gathered into a chunk buffer. The result
 * goes straight to out when out has the domain's type (or is bool for
 * predicates), else through a buffer that is converted once at the store;
 * outputs of STREAM_MIN bytes or more go out by streaming stores. The row
 * functions and tables are looked up once per call.
 */
#include "k_elementwise.h"
#include "../../core/oprules.h"
#include "k_ew.h"

#include <stdlib.h>

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
 * step, src/core/plan.c "In place"), never a partial overlap. Element i is read only
 * to write element i, so the reorderings restrict allows (later loads hoisted
 * above earlier stores) see no changed value. Strictly, C11 makes such
 * same-index aliasing of restrict pointers undefined: keep every row function
 * free of cross-index reads, and o never read. */

/* The row loops unrolled 4 times (after vectorization): a fused row group runs
 * several of these over one L1 row, where a loop of one vector per iteration
 * was bound by its loop overhead (issue 14: 7% of a layer_norm row on AVX2). */
#define ROW_UNROLL _Pragma("GCC unroll 4")
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
    ROW_UNROLL for (int64_t j = 0; j < n; j++) {                                                   \
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
      ROW_UNROLL for (int64_t j = 0; j < n; j++) {                                                 \
        TI a = pa[j], b = pb[j];                                                                   \
        o[j] = (TO)(EXPR);                                                                         \
      }                                                                                            \
    } else if (sb) {                                                                               \
      TI a = pa[0];                                                                                \
      ROW_UNROLL for (int64_t j = 0; j < n; j++) {                                                 \
        TI b = pb[j];                                                                              \
        o[j] = (TO)(EXPR);                                                                         \
      }                                                                                            \
    } else if (sa) {                                                                               \
      TI b = pb[0];                                                                                \
      ROW_UNROLL for (int64_t j = 0; j < n; j++) {                                                 \
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

#define ROWS_OF(S, ISA)                                                                            \
  [ISA] = {                                                                                        \
      .un = {[DOM_F32] = {EW_UNARY_FLOAT(ENTRY_UN_F32, S) EW_UNARY_PRED(ENTRY_UN_F32, S)},         \
             [DOM_F64] = {EW_UNARY_FLOAT(ENTRY_UN_F64, S) EW_UNARY_PRED(ENTRY_UN_F64, S)},         \
             [DOM_I64] = {EW_UNARY_INT(ENTRY_UN_I64, S) EW_UNARY_PRED(ENTRY_UN_I64, S)}},          \
      .bin = {[DOM_F32] = {EW_BINARY_FLOAT(ENTRY_BIN_F32, S) EW_BINARY_PRED(ENTRY_BIN_F32, S)},    \
              [DOM_F64] = {EW_BINARY_FLOAT(ENTRY_BIN_F64, S) EW_BINARY_PRED(ENTRY_BIN_F64, S)},    \
              [DOM_I64] = {EW_BINARY_INT(ENTRY_BIN_I64, S) EW_BINARY_PRED(ENTRY_BIN_I64, S)}},     \
      .where = {where_f32_##S, where_f64_##S, where_i64_##S}},
const ew_rows nbi_ew_rows_by_isa[NBI_ISA_COUNT] = {NBI_FOR_ISAS(ROWS_OF)};
#undef ROWS_OF

/* The executors take the active ISA's table (nbi_ew_rows_by_isa[nbi_isa_active()])
 * once per call, so nbi_isa_select takes effect at the next kernel. */
const bool nbi_ew_is_pred[NBI_OP_COUNT] = {EW_UNARY_PRED(ENTRY_PRED, portable)
                                               EW_BINARY_PRED(ENTRY_PRED, portable)};

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
  const ew_rows *rt = &nbi_ew_rows_by_isa[nbi_isa_active()];
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
  pl.direct_out = nbi_ew_is_pred[n->op] || pl.out_dt == domain_dtype[pl.dom];
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
