/* test/test_cuda_render.c — the CUDA code generator (src/backends/cuda/cuda_render*.c,
 * cuda_preamble.c) checked where no GPU is: every rendered source is compiled for the
 * host through test/cuda_host_shim.h (threads of a block as real threads, warp
 * shuffles through shared slots) and run there on host memory, and its results are
 * compared with the CPU backend's own kernels run member by member (the semantics);
 * the sources also compile with NVRTC for sm_90 when NVRTC loads. Cases: every
 * elementwise op on every dtype combination the CPU supports, casts between all
 * dtypes, random elementwise chains over broadcast / transposed / strided / flipped
 * operands, row compositions (softmax, log_softmax, layer_norm, rms_norm,
 * cross-entropy, cumsum, argmax), every reduction on every input dtype, random row
 * groups, rows of 1 to 20000 columns, NaN / Inf rules, f16 statistics. The last tests
 * run the same kinds of groups through nbi_cuda_run_group on a GPU when there is one
 * (skipped otherwise). Without NABLA_CUDA the file is empty. */
#ifdef NABLA_CUDA
#include "cuda_render_util.h"
#include "../src/core/oprules.h"

#include "../src/backends/ew_formulas.h"

/* ---- the preamble's conversions against the CPU's ------------------------------------- */
static const char conv_probe[] =
    "extern \"C\" float p_h2f(unsigned short h) { return nb_f16_to_f32(h); }\n"
    "extern \"C\" unsigned short p_f2h(float f) { return nb_f32_to_f16(f); }\n"
    "extern \"C\" unsigned short p_f2b(float f) { return nb_f32_to_bf16(f); }\n"
    "extern \"C\" float p_d2h(double d) { return nb_as_f16(d); }\n"
    "extern \"C\" float p_d2b(double d) { return nb_as_bf16(d); }\n"
    "extern \"C\" float p_l2h(long long v) { return nb_as_f16((int64_t)v); }\n"
    "extern \"C\" float p_l2b(long long v) { return nb_as_bf16((int64_t)v); }\n"
    "extern \"C\" int p_d2i(double d) { return nb_as_i32(d); }\n"
    "extern \"C\" long long p_d2l(double d) { return nb_as_i64(d); }\n"
    "extern \"C\" unsigned p_udiv(unsigned n, unsigned long long w) { return nb_udiv(n, w); }\n";

/* The CPU's cast of n values of src (dtype from) to dtype to. */
static void cpu_cast(const void *src, nb_dtype from, void *dst, nb_dtype to, int64_t n) {
  nbi_view in = {.data = (char *)src, .dtype = from, .ndim = 1, .dims = {n}, .strides = {1}};
  nbi_view out = {.data = dst, .dtype = to, .ndim = 1, .dims = {n}, .strides = {1}};
  int64_t ai[NBI_GROUP_ATTRS] = {0};
  double af[2] = {0};
  cr_assert_eq(cpu_node(NBI_OP_CAST, to, &out, 1, ai, af, &out, &in), NB_OK);
}

Test(cuda_render, preamble_conversions_match_the_cpu) {
  tc_case dummy = {0};
  dummy.src = malloc(strlen(nbi_cuda_preamble) + sizeof conv_probe);
  sprintf(dummy.src, "%s%s", nbi_cuda_preamble, conv_probe);
  dummy.raw = true;
  tc_case *cs[1] = {&dummy};
  tc_lib lib;
  host_compile(cs, 1, 1, &lib);
  float (*h2f)(unsigned short) = (float (*)(unsigned short))dlsym(lib.so, "p_h2f");
  unsigned short (*f2h)(float) = (unsigned short (*)(float))dlsym(lib.so, "p_f2h");
  unsigned short (*f2b)(float) = (unsigned short (*)(float))dlsym(lib.so, "p_f2b");
  float (*d2h)(double) = (float (*)(double))dlsym(lib.so, "p_d2h");
  float (*d2b)(double) = (float (*)(double))dlsym(lib.so, "p_d2b");
  float (*l2h)(long long) = (float (*)(long long))dlsym(lib.so, "p_l2h");
  float (*l2b)(long long) = (float (*)(long long))dlsym(lib.so, "p_l2b");
  int (*d2i)(double) = (int (*)(double))dlsym(lib.so, "p_d2i");
  long long (*d2l)(double) = (long long (*)(double))dlsym(lib.so, "p_d2l");
  unsigned (*udiv)(unsigned, unsigned long long) =
      (unsigned (*)(unsigned, unsigned long long))dlsym(lib.so, "p_udiv");
  cr_assert(h2f && f2h && f2b && d2h && d2b && l2h && l2b && d2i && d2l && udiv);
  for (uint32_t h = 0; h < 65536; h++) { /* every f16 */
    float a = h2f((unsigned short)h), b = nbi_f16_to_f32((uint16_t)h);
    cr_assert(isnan(b) ? isnan(a) : !memcmp(&a, &b, 4), "f16 %04x", h);
  }
  cr_rng r = {7};
  enum { N = 200000 };
  static float f[N];
  static double d[N], rd[N];
  static int64_t l[N];
  static uint16_t h16[N], b16[N];
  static int32_t i32[N];
  static int64_t i64[N];
  for (int i = 0; i < N; i++) { /* every exponent, ties, boundaries, specials */
    uint32_t u = (uint32_t)(tc_uniform(&r.s, 0, 4294967296.0));
    if (i % 4 == 1) u = (u & 0xffffe000u) | 0x1000u; /* f16 ties */
    if (i % 4 == 2) u = (u & 0xffff0000u) | 0x8000u; /* bf16 ties */
    memcpy(&f[i], &u, 4);
    d[i] = (double)f[i] * (1 + tc_uniform(&r.s, -1e-7, 1e-7));
    if (i % 5 == 0) d[i] = ldexp(tc_uniform(&r.s, -1, 1), cr_pick(&r, 80) - 40);
    if (i % 7 == 0) d[i] = tc_uniform(&r.s, -1, 1) * ldexp(1, cr_pick(&r, 70));
    l[i] = (int64_t)(tc_uniform(&r.s, -1, 1) * ldexp(1, cr_pick(&r, 64)));
  }
  static const float edge[] = {
      65504,          65519.99f,      65520,          -65520, 6.1035156e-05f,
      5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f, 1e-45f, 0,
      -0.0f,          INFINITY,       -INFINITY,      NAN,    3.3895314e38f};
  memcpy(f, edge, sizeof edge);
  for (int i = 0; i < N; i++) {
    uint16_t a = f2h(f[i]), b = nbi_f32_to_f16(f[i]);
    cr_assert(a == b || (isnan(f[i]) && (a & 0x7c00) == 0x7c00 && (a & 0x3ff)), "f16(%a)", f[i]);
    a = f2b(f[i]), b = nbi_f32_to_bf16(f[i]);
    cr_assert(a == b || (isnan(f[i]) && (a & 0x7f80) == 0x7f80 && (a & 0x7f)), "bf16(%a)", f[i]);
  }
  cpu_cast(d, NB_F64, h16, NB_F16, N);
  cpu_cast(d, NB_F64, b16, NB_BF16, N);
  cpu_cast(d, NB_F64, i32, NB_I32, N);
  cpu_cast(d, NB_F64, i64, NB_I64, N);
  for (int i = 0; i < N; i++) {
    if (isnan(d[i])) {
      cr_assert(isnan(d2h(d[i])) && isnan(d2b(d[i])));
      continue;
    }
    cr_assert_eq(nbi_f32_to_f16(d2h(d[i])), h16[i], "f64 %a to f16", d[i]);
    cr_assert_eq(nbi_f32_to_bf16(d2b(d[i])), b16[i], "f64 %a to bf16", d[i]);
    cr_assert_eq(d2i(d[i]), i32[i], "f64 %a to i32", d[i]);
    cr_assert_eq(d2l(d[i]), i64[i], "f64 %a to i64", d[i]);
  }
  cpu_cast(l, NB_I64, h16, NB_F16, N);
  cpu_cast(l, NB_I64, b16, NB_BF16, N);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(nbi_f32_to_f16(l2h(l[i])), h16[i], "i64 %lld to f16", (long long)l[i]);
    cr_assert_eq(nbi_f32_to_bf16(l2b(l[i])), b16[i], "i64 %lld to bf16", (long long)l[i]);
  }
  (void)rd;
  static const uint32_t divs[] = {
      1,           2,        3, 5, 7, 10, 641, 1000, 65535, 65536, 65537, 1u << 31, (1u << 31) + 1,
      4294967295u, 123456789};
  for (int k = 0; k < (int)(sizeof divs / sizeof divs[0]) + 200; k++) {
    uint32_t dv = k < (int)(sizeof divs / sizeof divs[0])
                      ? divs[k]
                      : 1 + (uint32_t)tc_uniform(&r.s, 0, ldexp(1, 1 + cr_pick(&r, 31)));
    uint32_t s = 0;
    while (s < 32 && ((uint64_t)1 << s) < dv)
      s++;
    uint64_t w = ((((uint64_t)1 << 32) * (((uint64_t)1 << s) - dv)) / dv + 1) & 0xffffffffu;
    w |= (uint64_t)s << 32;
    for (int j = 0; j < 2000; j++) {
      uint32_t n = j < 4 ? (uint32_t[]){0, dv - 1, dv, 4294967295u}[j]
                         : (uint32_t)tc_uniform(&r.s, 0, 4294967296.0);
      cr_assert_eq(udiv(n, w), n / dv, "%u / %u", n, dv);
    }
  }
  dlclose(lib.so);
  free(dummy.src);
}

/* ---- elementwise ops ---------------------------------------------------------------------- */
/* Every op of the formula list with its arity and whether an integer domain has it. */
typedef struct ew_op {
  int op, arity;
  bool ints, pred;
} ew_op;
#define T_UF(S, ID, E) {NBI_OP_##ID, 1, false, false},
#define T_BF(S, ID, E) {NBI_OP_##ID, 2, false, false},
#define T_UP(S, ID, E) {NBI_OP_##ID, 1, true, true},
#define T_BP(S, ID, E) {NBI_OP_##ID, 2, true, true},
static const ew_op float_ops[] = {EW_UNARY_FLOAT(T_UF, t) EW_BINARY_FLOAT(T_BF, t)
                                      EW_UNARY_PRED(T_UP, t) EW_BINARY_PRED(T_BP, t)};
#define T_I(S, ID, E) NBI_OP_##ID,
static const int int_ops[] = {EW_UNARY_INT(T_I, t) EW_BINARY_INT(T_I, t)};
#undef T_UF
#undef T_BF
#undef T_UP
#undef T_BP
#undef T_I

static bool has_int(int op) {
  for (size_t i = 0; i < sizeof int_ops / sizeof int_ops[0]; i++)
    if (int_ops[i] == op) return true;
  return false;
}

/* The compute dtype and result dtype of op on inputs a (and b), as src/ops/elementwise.c
 * records them; false where the op rejects them. */
static bool ew_types(const ew_op *o, nb_dtype a, nb_dtype b, nb_dtype *cdt, nb_dtype *res) {
  nb_dtype c = o->arity == 2 ? nb_promote_types(a, b) : a;
  if ((o->op == NBI_OP_NEG || o->op == NBI_OP_SUB) && c == NB_BOOL) return false;
  if (!nb_dtype_is_float(c) && !o->pred && !has_int(o->op)) c = NB_F32;
  *cdt = c;
  *res = o->pred ? NB_BOOL : c;
  return true;
}

static const nb_shape shapes[] = {{1, {37}},         {2, {5, 7}}, {3, {3, 4, 5}}, {2, {1, 9}},
                                  {3, {2, 1, 17}},   {1, {1}},    {0, {0}},       {2, {64, 33}},
                                  {4, {2, 3, 2, 5}}, {1, {1000}}};

Test(cuda_render, every_elementwise_op_on_every_dtype_combination) {
  static const nb_dtype pairs[][2] = {{NB_F32, NB_F32},   {NB_F64, NB_F64},  {NB_F16, NB_F16},
                                      {NB_BF16, NB_BF16}, {NB_I32, NB_I32},  {NB_I64, NB_I64},
                                      {NB_BOOL, NB_BOOL}, {NB_F16, NB_I32},  {NB_BF16, NB_BOOL},
                                      {NB_F32, NB_I64},   {NB_F16, NB_BF16}, {NB_I32, NB_I64},
                                      {NB_F64, NB_F32},   {NB_BOOL, NB_I32}, {NB_I64, NB_F16}};
  cr_rng r = {11};
  tc_case *cs[1200];
  int n = 0;
  for (size_t i = 0; i < sizeof float_ops / sizeof float_ops[0]; i++) {
    const ew_op *o = &float_ops[i];
    int np = o->arity == 1 ? 7 : (int)(sizeof pairs / sizeof pairs[0]);
    for (int p = 0; p < np; p++) {
      nb_dtype a = o->arity == 1 ? (nb_dtype)p : pairs[p][0], b = pairs[p][1], cdt, res;
      if (!ew_types(o, a, b, &cdt, &res)) continue;
      char what[96];
      snprintf(what, sizeof what, "%s(%s%s%s)", nbi_op_table[o->op]->name, nb_dtype_name(a),
               o->arity == 2 ? ", " : "", o->arity == 2 ? nb_dtype_name(b) : "");
      nb_shape F = shapes[cr_pick(&r, 10)];
      tc_case *c = cs[n++] = case_new(cdt, F, -1, what);
      int e0 = opnd(c, &r, a, NBI_ROLE_FULL, cr_pick(&r, LAY_COUNT), -4, 4, 0.05);
      int e1 =
          o->arity == 2 ? opnd(c, &r, b, NBI_ROLE_FULL, cr_pick(&r, LAY_COUNT), -4, 4, 0.05) : 0;
      store(c, mem(c, o->op, NBI_ROLE_FULL, res, cdt, o->arity, -1 - e0, -1 - e1, 0));
      case_finish(c);
    }
  }
  for (int p = 0; p < 7; p++) { /* where(bool, a, b) */
    nb_dtype a = pairs[p][0];
    nb_shape F = shapes[cr_pick(&r, 10)];
    char what[64];
    snprintf(what, sizeof what, "where(bool, %s, %s)", nb_dtype_name(a), nb_dtype_name(a));
    tc_case *c = cs[n++] = case_new(a, F, -1, what);
    int e0 = opnd(c, &r, NB_BOOL, NBI_ROLE_FULL, cr_pick(&r, LAY_COUNT), 0, 2, 0);
    int e1 = opnd(c, &r, a, NBI_ROLE_FULL, cr_pick(&r, LAY_COUNT), -4, 4, 0.05);
    int e2 = opnd(c, &r, a, NBI_ROLE_FULL, cr_pick(&r, LAY_COUNT), -4, 4, 0.05);
    store(c, mem(c, NBI_OP_WHERE, NBI_ROLE_FULL, a, a, 3, -1 - e0, -1 - e1, -1 - e2));
    case_finish(c);
  }
  for (int a = 0; a < NB_DTYPE_COUNT; a++) /* cast between any two dtypes */
    for (int b = 0; b < NB_DTYPE_COUNT; b++) {
      char what[64];
      snprintf(what, sizeof what, "cast %s to %s", nb_dtype_name((nb_dtype)a),
               nb_dtype_name((nb_dtype)b));
      tc_case *c = cs[n++] = case_new((nb_dtype)b, shapes[cr_pick(&r, 10)], -1, what);
      int e0 = opnd(c, &r, (nb_dtype)a, NBI_ROLE_FULL, cr_pick(&r, LAY_COUNT), -1e5, 1e5, 0.1);
      store(c, mem(c, NBI_OP_CAST, NBI_ROLE_FULL, (nb_dtype)b, NB_F32, 1, -1 - e0, 0, 0));
      case_finish(c);
    }
  cr_assert_eq(check_on_host(cs, n), 0, "mismatches (see above)");
}

/* ---- random elementwise chains ------------------------------------------------------------ */
/* Appends one of a few bounded compositions (test_fusion's) of a and b to c; returns
 * the member holding the result. one: an operand holding 1. */
static int chain_step(tc_case *c, cr_rng *r, nb_dtype dt, int a, int b, int one) {
  int k;
  bool ints = !nb_dtype_is_float(dt);
  switch (cr_pick(r, ints ? 6 : 12)) {
  case 0: return mem(c, NBI_OP_ADD, NBI_ROLE_FULL, dt, dt, 2, a, b, 0);
  case 1: return mem(c, NBI_OP_SUB, NBI_ROLE_FULL, dt, dt, 2, a, b, 0);
  case 2: return mem(c, NBI_OP_MAXIMUM, NBI_ROLE_FULL, dt, dt, 2, a, b, 0);
  case 3: /* where(a > b, a, b) */
    k = mem(c, NBI_OP_GT, NBI_ROLE_FULL, NB_BOOL, dt, 2, a, b, 0);
    return mem(c, NBI_OP_WHERE, NBI_ROLE_FULL, dt, dt, 3, k, a, b);
  case 4:
    return mem(c, ints ? NBI_OP_MINIMUM : NBI_OP_RELU, NBI_ROLE_FULL, dt, dt, ints ? 2 : 1, a, b,
               0);
  case 5:
    return mem(c, ints ? NBI_OP_MOD : NBI_OP_SIN, NBI_ROLE_FULL, dt, dt, ints ? 2 : 1, a, b, 0);
  case 6: return mem(c, NBI_OP_TANH, NBI_ROLE_FULL, dt, dt, 1, a, 0, 0);
  case 7: return mem(c, NBI_OP_SIGMOID, NBI_ROLE_FULL, dt, dt, 1, a, 0, 0);
  case 8: /* exp(-|a|) */
    k = mem(c, NBI_OP_ABS, NBI_ROLE_FULL, dt, dt, 1, a, 0, 0);
    k = mem(c, NBI_OP_NEG, NBI_ROLE_FULL, dt, dt, 1, k, 0, 0);
    return mem(c, NBI_OP_EXP, NBI_ROLE_FULL, dt, dt, 1, k, 0, 0);
  case 9: /* sqrt(|a| + 1) */
    k = mem(c, NBI_OP_ABS, NBI_ROLE_FULL, dt, dt, 1, a, 0, 0);
    k = mem(c, NBI_OP_ADD, NBI_ROLE_FULL, dt, dt, 2, k, one, 0);
    return mem(c, NBI_OP_SQRT, NBI_ROLE_FULL, dt, dt, 1, k, 0, 0);
  case 10: /* a / (|b| + 1) */
    k = mem(c, NBI_OP_ABS, NBI_ROLE_FULL, dt, dt, 1, b, 0, 0);
    k = mem(c, NBI_OP_ADD, NBI_ROLE_FULL, dt, dt, 2, k, one, 0);
    return mem(c, NBI_OP_DIV, NBI_ROLE_FULL, dt, dt, 2, a, k, 0);
  default: return mem(c, NBI_OP_MUL, NBI_ROLE_FULL, dt, dt, 2, a, b, 0);
  }
}

/* A random elementwise group of dtype dt over a random F: operands of random layouts
 * (contiguous or one value when contig; an i32 one among them sometimes), up to 16
 * members, some stored. */
static tc_case *random_chain(cr_rng *r, nb_dtype dt, int i, const nb_shape *F, bool contig) {
  char what[64];
  snprintf(what, sizeof what, "chain %d (%s)", i, nb_dtype_name(dt));
  tc_case *c = case_new(dt, F ? *F : shapes[cr_pick(r, 10)], -1, what);
  int pool[NBI_FUSE_MAX * 2], n = 0;
  int one = -1 - opnd(c, r, dt, NBI_ROLE_FULL, LAY_SCALAR, 1, 1, 0);
  int n_ops = 1 + cr_pick(r, 3);
  for (int k = 0; k < n_ops; k++) {
    nb_dtype odt = cr_pick(r, 6) == 0 && nb_dtype_is_float(dt) ? NB_I32 : dt;
    int lay = contig ? (cr_pick(r, 4) ? LAY_CONTIG : LAY_SCALAR) : cr_pick(r, LAY_COUNT);
    pool[n++] = -1 - opnd(c, r, odt, NBI_ROLE_FULL, lay, -3, 3, 0.02);
  }
  while (c->g.n_members < NBI_FUSE_MAX - 4) {
    int k = chain_step(c, r, dt, pool[cr_pick(r, n)], pool[cr_pick(r, n)], one);
    if (cr_pick(r, 3)) pool[n++] = k;
    if (c->g.n_members > 3 && cr_pick(r, 4) == 0) break;
    if (cr_pick(r, 4) == 0 && c->g.m[k].dtype == dt) store(c, k);
  }
  /* the last member must be stored; a member reading an operand directly counts */
  int last = c->g.n_members - 1;
  if (c->g.m[last].src[0] < 0 && c->g.m[last].n_in == 1 && c->g.n_members == 1) last = 0;
  store(c, last);
  case_finish(c);
  return c;
}

Test(cuda_render, random_elementwise_chains) {
  static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F32, NB_F16, NB_BF16, NB_I32, NB_I64};
  cr_rng r = {23};
  tc_case *cs[300];
  for (int i = 0; i < 300; i++)
    cs[i] = random_chain(&r, dts[i % 7], i, NULL, false);
  cr_assert_eq(check_on_host(cs, 300), 0, "mismatches (see above)");
}

/* Contiguous operands: the 16-byte vector loop and its scalar tail. */
Test(cuda_render, vectorized_chains_and_their_tails) {
  static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32, NB_I64};
  cr_rng r = {29};
  tc_case *cs[60];
  int vectorized = 0;
  for (int i = 0; i < 60; i++) {
    nb_shape F = {2, {1 + cr_pick(&r, 40), 1 + cr_pick(&r, 50)}};
    cs[i] = random_chain(&r, dts[i % 6], i, &F, true);
  }
  render_all(cs, 60);
  for (int i = 0; i < 60; i++) {
    vectorized += strstr(cs[i]->src, "nb_pack<") != NULL;
    free(cs[i]->src);
    cs[i]->src = NULL;
  }
  cr_assert_gt(vectorized, 30, "%d of 60 vectorized", vectorized);
  cr_assert_eq(check_on_host(cs, 60), 0, "mismatches (see above)");
}

/* ---- row groups ---------------------------------------------------------------------------- */
enum { RR = NBI_ROLE_ROW_REDUCE, PR = NBI_ROLE_PER_ROW, FU = NBI_ROLE_FULL, AX = NBI_ROLE_AXIS };

/* The row compositions the planner forms (src/ops/nn_layers.c, test_fusion.c), over F
 * with rows F[0, ra); x laid out by lay. */
enum {
  C_SOFTMAX,
  C_SOFTMAX_OP,
  C_LOG_SOFTMAX,
  C_LAYER_NORM,
  C_RMS_NORM,
  C_XENT,
  C_XENT_ROWS,
  C_CUMSUM,
  C_ARGMAX,
  C_SOFTMAX_BWD,
  C_STATS,
  C_COUNT
};

static tc_case *composition(cr_rng *r, int which, nb_dtype dt, nb_shape F, int ra, int lay,
                            double lo, double hi) {
  static const char *const names[] = {
      "softmax",  "softmax op",       "log_softmax",          "layer_norm",
      "rms_norm", "cross_entropy",    "cross_entropy rows",   "cumsum",
      "argmax",   "softmax backward", "var / std / logsumexp"};
  char what[96];
  snprintf(what, sizeof what, "%s %s (%lld rows x %lld)", names[which], nb_dtype_name(dt),
           (long long)1, (long long)1);
  tc_case *c = case_new(dt, F, ra, what);
  snprintf(c->what, sizeof c->what, "%s %s (%lld rows x %lld)", names[which], nb_dtype_name(dt),
           (long long)c->g.rows, (long long)c->g.cols);
  double cols = (double)c->g.cols;
  int x = -1 - opnd(c, r, dt, FU, lay, lo, hi, 0), k, m, e;
  switch (which) {
  case C_SOFTMAX:
  case C_SOFTMAX_BWD:
    m = red(c, NBI_OP_REDUCE_MAX, RR, dt, x, 1, 0);
    k = mem(c, NBI_OP_SUB, FU, dt, dt, 2, x, m, 0);
    e = mem(c, NBI_OP_EXP, FU, dt, dt, 1, k, 0, 0);
    k = red(c, NBI_OP_REDUCE_SUM, RR, dt, e, 1, 0);
    k = mem(c, NBI_OP_DIV, FU, dt, dt, 2, e, k, 0);
    if (which == C_SOFTMAX_BWD) { /* y (g - sum(g y)) */
      int g = -1 - opnd(c, r, dt, FU, LAY_CONTIG, -1, 1, 0);
      int gy = mem(c, NBI_OP_MUL, FU, dt, dt, 2, g, k, 0);
      int s = red(c, NBI_OP_REDUCE_SUM, RR, dt, gy, 1, 0);
      int d = mem(c, NBI_OP_SUB, FU, dt, dt, 2, g, s, 0);
      k = mem(c, NBI_OP_MUL, FU, dt, dt, 2, k, d, 0);
    }
    store(c, k);
    break;
  case C_SOFTMAX_OP: store(c, red(c, NBI_OP_SOFTMAX, AX, dt, x, 1, 0)); break;
  case C_LOG_SOFTMAX:
    m = red(c, NBI_OP_REDUCE_MAX, RR, dt, x, 1, 0);
    k = mem(c, NBI_OP_SUB, FU, dt, dt, 2, x, m, 0);
    e = mem(c, NBI_OP_EXP, FU, dt, dt, 1, k, 0, 0);
    e = red(c, NBI_OP_REDUCE_SUM, RR, dt, e, 1, 0);
    e = mem(c, NBI_OP_LOG, PR, dt, dt, 1, e, 0, 0);
    store(c, mem(c, NBI_OP_SUB, FU, dt, dt, 2, k, e, 0));
    store(c, m);
    break;
  case C_LAYER_NORM:
  case C_RMS_NORM: {
    int w = -1 - opnd(c, r, dt, FU, LAY_ROWB, 0.5, 1.5, 0);
    int b = -1 - opnd(c, r, dt, FU, LAY_ROWB, -1, 1, 0);
    int eps = -1 - opnd(c, r, dt, PR, LAY_SCALAR, 1e-5, 1e-5, 0);
    int xc = x;
    if (which == C_LAYER_NORM) {
      m = red(c, NBI_OP_REDUCE_SUM, RR, dt, x, cols, 0); /* mean */
      xc = mem(c, NBI_OP_SUB, FU, dt, dt, 2, x, m, 0);
    }
    k = mem(c, NBI_OP_SQUARE, FU, dt, dt, 1, xc, 0, 0);
    k = red(c, NBI_OP_REDUCE_SUM, RR, dt, k, cols, 0);
    k = mem(c, NBI_OP_ADD, PR, dt, dt, 2, k, eps, 0);
    k = mem(c, NBI_OP_RSQRT, PR, dt, dt, 1, k, 0, 0);
    store(c, k);
    k = mem(c, NBI_OP_MUL, FU, dt, dt, 2, xc, k, 0);
    k = mem(c, NBI_OP_MUL, FU, dt, dt, 2, k, w, 0);
    if (which == C_LAYER_NORM) k = mem(c, NBI_OP_ADD, FU, dt, dt, 2, k, b, 0);
    store(c, k);
    break;
  }
  case C_XENT:
  case C_XENT_ROWS: { /* probability labels; loss = mean over rows of -sum(labels logp) */
    int lab = -1 - opnd(c, r, dt, FU, cr_pick(r, 2) ? LAY_CONTIG : LAY_TRANS, 0, 1, 0);
    k = red(c, NBI_OP_LOG_SOFTMAX, AX, dt, x, 1, 0);
    k = mem(c, NBI_OP_MUL, FU, dt, dt, 2, lab, k, 0);
    k = red(c, NBI_OP_REDUCE_SUM, RR, dt, k, 1, 0);
    if (which == C_XENT_ROWS) k = mem(c, NBI_OP_NEG, PR, dt, dt, 1, k, 0, 0);
    store(c, k);
    if (c->g.rows >= 2) {
      k = red(c, NBI_OP_REDUCE_SUM, NBI_ROLE_GLOBAL_REDUCE, dt, k, (double)c->g.rows, 0);
      if (which == C_XENT) k = mem(c, NBI_OP_NEG, NBI_ROLE_GLOBAL, dt, dt, 1, k, 0, 0);
      store(c, k);
    }
    break;
  }
  case C_CUMSUM:
    k = red(c, NBI_OP_CUMSUM, AX, dt, x, 1, 0);
    store(c, k);
    if (dt != NB_F64 || c->g.cols <= 1024) /* (compare's cumsum tolerance is its own) */
      store(c, mem(c, NBI_OP_MUL, FU, dt, dt, 2, k, x, 0));
    break;
  case C_ARGMAX:
    store(c, red(c, NBI_OP_ARGMAX, RR, NB_I64, x, 1, 0));
    store(c, red(c, NBI_OP_ARGMIN, RR, NB_I32, x, 1, 0));
    break;
  default:
    store(c, red(c, NBI_OP_REDUCE_VAR, RR, dt, x, 1, 0));
    store(c, red(c, NBI_OP_REDUCE_VAR, RR, dt, x, 1, 1));
    store(c, red(c, NBI_OP_LOGSUMEXP, RR, dt, x, 1, 0));
    break;
  }
  case_finish(c);
  return c;
}

/* Row shapes: F and ra, from one column to 40000 (a warp per row up to 1024, then a
 * block of 256, then 1024 threads; columns kept in registers up to 32768). */
static const struct {
  nb_shape F;
  int ra;
} row_shapes[] = {{{2, {7, 1}}, 1},      {{2, {5, 2}}, 1},     {{2, {9, 33}}, 1},
                  {{2, {16, 300}}, 1},   {{3, {2, 3, 40}}, 2}, {{3, {2, 3, 50}}, 1},
                  {{2, {3, 1024}}, 1},   {{2, {3, 1025}}, 1},  {{2, {2, 5000}}, 1},
                  {{2, {1, 16384}}, 1},  {{2, {1, 40000}}, 1}, {{1, {700}}, 0},
                  {{3, {3, 1, 129}}, 2}, {{2, {20, 64}}, 1},   {{4, {2, 2, 3, 30}}, 2}};
enum { N_ROW_SHAPES = sizeof row_shapes / sizeof row_shapes[0] };

Test(cuda_render, row_compositions) {
  static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F32, NB_F16};
  cr_rng r = {31};
  tc_case *cs[C_COUNT * 12];
  int n = 0;
  for (int w = 0; w < C_COUNT; w++)
    for (int i = 0; i < 12; i++) {
      int si = (w * 5 + i * 7) % N_ROW_SHAPES, lay = i % 3 == 2 ? LAY_TRANS : LAY_CONTIG;
      nb_shape F = row_shapes[si].F;
      int ra = row_shapes[si].ra;
      bool axis = w == C_SOFTMAX_OP || w == C_XENT || w == C_XENT_ROWS || w == C_CUMSUM;
      if (axis && ra != F.ndim - 1) { /* axis ops run along the last axis alone */
        ra = F.ndim - 1;
      }
      cs[n++] = composition(&r, w, dts[i % 4], F, ra, lay, -3, 3);
    }
  cr_assert_eq(check_on_host(cs, n), 0, "mismatches (see above)");
}

/* Every reduction and axis op alone (the op table's one-member groups) on every input
 * dtype, with NaN, infinities and zeros among float inputs. */
Test(cuda_render, every_reduction_and_axis_op_on_every_dtype) {
  static const int ops[] = {NBI_OP_REDUCE_SUM, -1 /* mean */,      NBI_OP_REDUCE_PROD,
                            NBI_OP_REDUCE_MAX, NBI_OP_REDUCE_MIN,  NBI_OP_REDUCE_ANY,
                            NBI_OP_REDUCE_ALL, NBI_OP_REDUCE_VAR,  -2 /* std */,
                            NBI_OP_LOGSUMEXP,  NBI_OP_ARGMAX,      NBI_OP_ARGMIN,
                            NBI_OP_SOFTMAX,    NBI_OP_LOG_SOFTMAX, NBI_OP_CUMSUM};
  cr_rng r = {37};
  tc_case *cs[16 * NB_DTYPE_COUNT * 2];
  int n = 0;
  /* every dtype; u8, i8 and i16 sum, multiply and count in i64 (src/ops/reduce.c) */
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    for (int t = 0; t < NB_DTYPE_COUNT; t++)
      for (int rep = 0; rep < 2; rep++) {
        nb_dtype in = (nb_dtype)t;
        int op = ops[i] < 0 ? (ops[i] == -1 ? NBI_OP_REDUCE_SUM : NBI_OP_REDUCE_VAR) : ops[i];
        bool axis = op == NBI_OP_SOFTMAX || op == NBI_OP_LOG_SOFTMAX || op == NBI_OP_CUMSUM;
        bool float_res = ops[i] == -1 || op == NBI_OP_REDUCE_VAR || op == NBI_OP_LOGSUMEXP ||
                         op == NBI_OP_SOFTMAX || op == NBI_OP_LOG_SOFTMAX;
        nb_dtype res = float_res ? (nb_dtype_is_float(in) ? in : NB_F32) : in;
        if (op == NBI_OP_REDUCE_SUM && ops[i] != -1 && in == NB_BOOL) res = NB_I32;
        if ((op == NBI_OP_REDUCE_PROD || op == NBI_OP_CUMSUM) && in == NB_BOOL) res = NB_I32;
        bool small = in == NB_U8 || in == NB_I8 || in == NB_I16;
        if ((op == NBI_OP_REDUCE_SUM || op == NBI_OP_REDUCE_PROD || op == NBI_OP_CUMSUM) &&
            ops[i] != -1 && small)
          res = NB_I64;
        if (op == NBI_OP_REDUCE_ANY || op == NBI_OP_REDUCE_ALL) res = NB_BOOL;
        if (op == NBI_OP_ARGMAX || op == NBI_OP_ARGMIN) res = rep ? NB_I32 : NB_I64;
        int si = cr_pick(&r, N_ROW_SHAPES);
        nb_shape F = row_shapes[si].F;
        int ra = axis ? F.ndim - 1 : row_shapes[si].ra;
        char what[96];
        snprintf(what, sizeof what, "%s%s of %s",
                 ops[i] == -1   ? "mean"
                 : ops[i] == -2 ? "std"
                                : "",
                 ops[i] < 0 ? "" : nbi_op_table[op]->name, nb_dtype_name(in));
        tc_case *c = cs[n++] = case_new(res, F, ra, what);
        bool prod = op == NBI_OP_REDUCE_PROD;
        int x = -1 - opnd(c, &r, in, FU, cr_pick(&r, LAY_COUNT), prod ? 0.5 : -9, prod ? 1.6 : 9,
                          rep ? 0.01 : 0);
        store(c, red(c, op, axis ? AX : RR, res, x, ops[i] == -1 ? (double)c->g.cols : 1,
                     ops[i] == -2));
        case_finish(c);
      }
  cr_assert_eq(check_on_host(cs, n), 0, "mismatches (see above)");
}

/* NaN and infinity rules in rows: max / min / logsumexp / var propagate NaN, argmax
 * takes the first NaN, softmax of a row with a NaN is NaN, rows of -inf. */
Test(cuda_render, nan_and_infinity_rules_in_rows) {
  cr_rng r = {41};
  tc_case *cs[24];
  int n = 0;
  for (int i = 0; i < 24; i++) {
    nb_dtype dt = i % 2 ? NB_F64 : NB_F32;
    int si = i % N_ROW_SHAPES;
    nb_shape F = row_shapes[si].F;
    tc_case *c = cs[n++] = case_new(dt, F, F.ndim - 1, "nan rules");
    int x = -1 - opnd(c, &r, dt, FU, LAY_CONTIG, -5, 5, i < 12 ? 0.3 : 0.02);
    store(c, red(c, NBI_OP_REDUCE_MAX, RR, dt, x, 1, 0));
    store(c, red(c, NBI_OP_REDUCE_MIN, RR, dt, x, 1, 0));
    store(c, red(c, NBI_OP_LOGSUMEXP, RR, dt, x, 1, 0));
    store(c, red(c, NBI_OP_REDUCE_VAR, RR, dt, x, 1, 0));
    store(c, red(c, NBI_OP_ARGMAX, RR, NB_I64, x, 1, 0));
    store(c, red(c, NBI_OP_ARGMIN, RR, NB_I64, x, 1, 0));
    store(c, red(c, NBI_OP_SOFTMAX, AX, dt, x, 1, 0));
    store(c, red(c, NBI_OP_LOG_SOFTMAX, AX, dt, x, 1, 0));
    store(c, red(c, NBI_OP_REDUCE_SUM, RR, dt, x, 1, 0));
    case_finish(c);
  }
  cr_assert_eq(check_on_host(cs, n), 0, "mismatches (see above)");
}

/* layer_norm on f16 values near 200 over 4096 columns: the row sums (8e5) and sums of
 * squares are far beyond f16's range and must be accumulated wide. */
Test(cuda_render, f16_layer_norm_statistics_do_not_overflow) {
  cr_rng r = {43};
  tc_case *cs[2];
  cs[0] = composition(&r, C_LAYER_NORM, NB_F16, (nb_shape){2, {3, 4096}}, 1, LAY_CONTIG, 150, 250);
  cs[1] = composition(&r, C_RMS_NORM, NB_BF16, (nb_shape){2, {2, 5000}}, 1, LAY_CONTIG, 150, 250);
  cr_assert_eq(check_on_host(cs, 2), 0, "mismatches (see above)");
}

/* Random row groups: a chain over the rows, reductions of its values, per-row members on
 * them (and a per-row operand), full members reading those back, an axis op sometimes,
 * some stored, and a global mean of a stored per-row value. */
static tc_case *random_rows(cr_rng *r, nb_dtype dt, int i) {
  static const int reds[] = {NBI_OP_REDUCE_SUM, NBI_OP_REDUCE_MAX, NBI_OP_REDUCE_MIN,
                             NBI_OP_REDUCE_VAR, NBI_OP_LOGSUMEXP,  NBI_OP_REDUCE_SUM};
  int si = cr_pick(r, N_ROW_SHAPES);
  nb_shape F = row_shapes[si].F;
  int ra = row_shapes[si].ra;
  bool axis = cr_pick(r, 3) == 0;
  if (axis) ra = F.ndim - 1;
  char what[64];
  snprintf(what, sizeof what, "rows %d (%s)", i, nb_dtype_name(dt));
  tc_case *c = case_new(dt, F, ra, what);
  int full[NBI_FUSE_MAX], nf = 0, rowv[NBI_FUSE_MAX], nr = 0;
  int one = -1 - opnd(c, r, dt, FU, LAY_SCALAR, 1, 1, 0);
  full[nf++] = -1 - opnd(c, r, dt, FU, cr_pick(r, LAY_COUNT), -2, 2, 0);
  if (cr_pick(r, 2)) full[nf++] = -1 - opnd(c, r, dt, FU, LAY_ROWB, -2, 2, 0);
  rowv[nr++] = -1 - opnd(c, r, dt, PR, cr_pick(r, 2) ? LAY_CONTIG : LAY_SCALAR, -1, 1, 0);
  for (int s = 0; s < 2 + cr_pick(r, 2); s++) {
    int a = full[cr_pick(r, nf)], b = full[cr_pick(r, nf)];
    full[nf] = chain_step(c, r, dt, a, b, one);
    nf++;
  }
  if (axis) { /* (no f64 cumsum of long rows: compare's cumsum tolerance is its own) */
    static const int ax[] = {NBI_OP_SOFTMAX, NBI_OP_LOG_SOFTMAX, NBI_OP_CUMSUM};
    full[nf] = red(c, ax[cr_pick(r, dt == NB_F64 && c->g.cols > 1024 ? 2 : 3)], AX, dt,
                   full[nf - 1], 1, 0);
    nf++;
  }
  for (int s = 0; s < 1 + cr_pick(r, 2); s++) {
    int op = reds[cr_pick(r, 6)];
    rowv[nr++] = red(c, op, RR, dt, full[cr_pick(r, nf)], op == NBI_OP_REDUCE_SUM ? 2 : 1, 0);
  }
  int k = mem(c, NBI_OP_ADD, PR, dt, dt, 2, rowv[nr - 1], rowv[cr_pick(r, nr)], 0);
  rowv[nr++] = mem(c, NBI_OP_TANH, PR, dt, dt, 1, k, 0, 0);
  k = mem(c, cr_pick(r, 2) ? NBI_OP_MUL : NBI_OP_SUB, FU, dt, dt, 2, full[cr_pick(r, nf)],
          rowv[nr - 1], 0);
  full[nf++] = k;
  if (c->g.n_members < NBI_FUSE_MAX - 2 && cr_pick(r, 2)) {
    int b = full[cr_pick(r, nf)];
    full[nf] = chain_step(c, r, dt, k, b, one);
    nf++;
  }
  store(c, full[nf - 1]);
  for (int j = 0; j < c->g.n_members; j++)
    if (c->g.m[j].role != NBI_ROLE_GLOBAL && cr_pick(r, 4) == 0) store(c, j);
  if (c->g.rows >= 2 && c->g.n_members < NBI_FUSE_MAX - 1 && cr_pick(r, 2)) {
    int pr = rowv[nr - 1];
    store(c, pr);
    k = red(c, NBI_OP_REDUCE_SUM, NBI_ROLE_GLOBAL_REDUCE, dt, pr, (double)c->g.rows, 0);
    store(c, mem(c, NBI_OP_NEG, NBI_ROLE_GLOBAL, dt, dt, 1, k, 0, 0));
  }
  case_finish(c);
  return c;
}

Test(cuda_render, random_row_groups) {
  static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F32, NB_F16};
  cr_rng r = {47};
  tc_case *cs[160];
  for (int i = 0; i < 160; i++)
    cs[i] = random_rows(&r, dts[i % 4], i);
  cr_assert_eq(check_on_host(cs, 160), 0, "mismatches (see above)");
}

/* ---- properties of the sources -------------------------------------------------------------- */
/* A mix of every kind of case, rendered. */
static int mixed_cases(tc_case **cs, uint64_t seed) {
  static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
  cr_rng r = {seed};
  int n = 0;
  for (int i = 0; i < 24; i++)
    cs[n++] = random_chain(&r, dts[i % 4], i, NULL, i % 3 == 0);
  for (int w = 0; w < C_COUNT; w++) {
    int si = cr_pick(&r, N_ROW_SHAPES);
    nb_shape F = row_shapes[si].F;
    cs[n++] = composition(&r, w, dts[w % 3], F, F.ndim - 1, LAY_CONTIG, -2, 2);
  }
  for (int i = 0; i < 24; i++)
    cs[n++] = random_rows(&r, dts[i % 3], i);
  render_all(cs, n);
  return n;
}

Test(cuda_render, sources_compile_with_nvrtc_for_sm_90) {
  if (!nbi_nvrtc_load()) cr_skip_test("NVRTC is not available: %s", nbi_cu.why);
  tc_case *cs[80];
  int n = mixed_cases(cs, 53);
  for (int i = 0; i < 6; i++) { /* exactly as rendered */
    nbi_cuda_image img = {0};
    cr_assert_eq(nbi_cuda_compile(cs[i * 11]->src, 90, &img), NB_OK, "%s: %s", cs[i * 11]->what,
                 nb_last_error());
    cr_assert(img.data && img.size > 0);
    free(img.data);
  }
  for (int p = 0; p < 2; p++) { /* all, two translation units */
    int i0 = n * p / 2, i1 = n * (p + 1) / 2;
    char *src = batch_source(cs + i0, i1 - i0, false);
    nbi_cuda_image img = {0};
    cr_assert_eq(nbi_cuda_compile(src, 90, &img), NB_OK, "%s", nb_last_error());
    free(img.data);
    free(src);
  }
  for (int i = 0; i < n; i++)
    case_free(cs[i]);
}

/* The source depends on structure and layout classes, never on sizes or addresses. */
Test(cuda_render, sources_depend_on_structure_not_sizes) {
  cr_rng r = {59};
  tc_case *a = composition(&r, C_LAYER_NORM, NB_F32, (nb_shape){2, {4, 300}}, 1, LAY_CONTIG, -1, 1);
  tc_case *b = composition(&r, C_LAYER_NORM, NB_F32, (nb_shape){2, {9, 500}}, 1, LAY_CONTIG, -1, 1);
  tc_case *t =
      composition(&r, C_LAYER_NORM, NB_F32, (nb_shape){2, {9, 500}}, 1, LAY_STRIDED, -1, 1);
  tc_case *cs[3] = {a, b, t};
  render_all(cs, 3);
  cr_assert_str_eq(a->src, b->src);
  cr_assert_str_eq(a->name, b->name);
  cr_assert_str_neq(a->src, t->src, "strided columns are another layout class");
  cr_assert(a->cfg.words[0] != b->cfg.words[0], "sizes are parameters");
  cr_assert(strstr(a->src, "one warp per row"));
  tc_case *e = random_chain(&r, NB_F32, 0, &(nb_shape){1, {1000}}, true);
  tc_case *f = random_chain(&r, NB_F32, 0, &(nb_shape){1, {1000}}, true);
  tc_case *es[2] = {e, f};
  render_all(es, 2);
  cr_assert_eq(strcmp(e->src, f->src) == 0, e->g.key[0] == f->g.key[0]);
  for (int i = 0; i < 3; i++)
    case_free(cs[i]);
  case_free(e);
  case_free(f);
}

/* Zero-size work needs no launch. */
Test(cuda_render, zero_size_groups_launch_nothing) {
  cr_rng r = {61};
  tc_case *e = case_new(NB_F32, (nb_shape){2, {0, 5}}, -1, "empty elementwise");
  int x = -1 - opnd(e, &r, NB_F32, FU, LAY_CONTIG, -1, 1, 0);
  store(e, mem(e, NBI_OP_EXP, FU, NB_F32, NB_F32, 1, x, 0, 0));
  case_finish(e);
  tc_case *w = case_new(NB_F32, (nb_shape){2, {0, 5}}, 1, "no rows");
  x = -1 - opnd(w, &r, NB_F32, FU, LAY_CONTIG, -1, 1, 0);
  store(w, red(w, NBI_OP_REDUCE_SUM, RR, NB_F32, x, 1, 0));
  case_finish(w);
  tc_case *cs[2] = {e, w};
  render_all(cs, 2);
  cr_assert_eq(e->cfg.grid, 0);
  cr_assert_eq(w->cfg.grid, 0);
  cr_assert_eq(w->cfg.grid2, 0);
  case_free(e);
  case_free(w);
}

/* Descriptions the generator cannot run are refused, never rendered wrongly. */
Test(cuda_render, group_ok_refuses_what_it_cannot_run) {
  cr_rng r = {67};
  nb_shape F = {2, {4, 8}};
  tc_case *c = case_new(NB_F32, F, 1, "refusals");
  int x = -1 - opnd(c, &r, NB_F32, FU, LAY_CONTIG, -1, 1, 0);
  int s = red(c, NBI_OP_REDUCE_SUM, RR, NB_F32, x, 1, 0);
  int m = mem(c, NBI_OP_SUB, FU, NB_F32, NB_F32, 2, x, s, 0);
  store(c, m);
  case_finish(c);
  nbi_group g = c->g;
  cr_assert(nbi_cuda_group_ok(NULL, &g));
  g.kind = NBI_GROUP_GEMM;
  cr_assert_not(nbi_cuda_group_ok(NULL, &g), "GEMM epilogues are cuBLASLt's");
  g = c->g;
  g.m[m].op = NBI_OP_MATMUL;
  cr_assert_not(nbi_cuda_group_ok(NULL, &g), "not an elementwise op");
  g = c->g;
  g.m[m].src[1] = (int16_t)m;
  cr_assert_not(nbi_cuda_group_ok(NULL, &g), "reads itself");
  g = c->g;
  g.m[m].out = 3;
  cr_assert_not(nbi_cuda_group_ok(NULL, &g), "an output slot out of range");
  g = c->g;
  g.m[s].role = NBI_ROLE_GLOBAL_REDUCE;
  cr_assert_not(nbi_cuda_group_ok(NULL, &g), "a global reduction of an unstored full value");
  g = c->g;
  g.m[s].op = NBI_OP_SOFTMAX;
  g.m[s].role = NBI_ROLE_AXIS;
  g.ra = 0;
  cr_assert_not(nbi_cuda_group_ok(NULL, &g), "an axis op over several axes");
  g = c->g;
  g.m[m].op = NBI_OP_LOG; /* exp, log ...: float ops on an int compute dtype */
  g.m[m].n_in = 1;
  g.m[m].ai[0] = NB_I32;
  cr_assert_not(nbi_cuda_group_ok(NULL, &g), "log has no int formula");
  g = c->g;
  g.n_members = 0;
  cr_assert_not(nbi_cuda_group_ok(NULL, &g));
  cr_assert_null(nbi_cuda_render_group(&g, c->out, c->in, c->name, &c->cfg));
  cr_assert_eq(nb_last_status(), NB_ERR_INTERNAL);
  nb_clear_error();
  case_free(c);
}

/* Runs repeat: the same bits (fixed combine order; here on the host's threads). */
Test(cuda_render, results_are_the_same_every_run) {
  cr_rng r = {71};
  tc_case *cs[2];
  cs[0] = composition(&r, C_XENT, NB_F32, (nb_shape){2, {6, 3000}}, 1, LAY_CONTIG, -3, 3);
  cs[1] = composition(&r, C_STATS, NB_F32, (nb_shape){2, {20, 900}}, 1, LAY_CONTIG, -3, 3);
  render_all(cs, 2);
  tc_lib lib;
  host_compile(cs, 2, 1, &lib);
  for (int i = 0; i < 2; i++) {
    tc_case *c = cs[i];
    char *first[NBI_FUSE_MAX];
    host_run(&lib, i, c);
    for (int j = 0; j < c->g.n_outputs; j++) {
      size_t bytes = (size_t)c->out[j].dims[0] * nb_dtype_size(c->out[j].dtype);
      first[j] = malloc(bytes);
      memcpy(first[j], c->outb[j], bytes);
    }
    for (int rep = 0; rep < 3; rep++) {
      host_run(&lib, i, c);
      for (int j = 0; j < c->g.n_outputs; j++)
        cr_assert(!memcmp(first[j], c->outb[j],
                          (size_t)c->out[j].dims[0] * nb_dtype_size(c->out[j].dtype)),
                  "%s: output %d differs between runs", c->what, j);
    }
    for (int j = 0; j < c->g.n_outputs; j++)
      free(first[j]);
    case_free(c);
  }
  dlclose(lib.so);
}

/* ---- on a GPU: nbi_cuda_run_group against the CPU ------------------------------------------- */
/* The first CUDA device's table entry, or -1. */
static int gpu_device(void) {
  if (nb_device_count(NB_DEVICE_CUDA) == 0) return -1;
  int dev = nbi_device_lookup("test_cuda_render", NB_CUDA(0));
  cr_assert_geq(dev, 0, "%s", nb_last_error());
  return dev;
}

/* Runs case c through nbi_cuda_run_group on device dev (operand buffers uploaded whole,
 * views at the same offsets) `runs` times; compares the first run with the CPU and the
 * others with the first, bit for bit. Returns whether all matched; frees c. */
static bool check_on_gpu(int dev, tc_case *c, int runs) {
  const nbi_device *d = nbi_device_at(dev);
  const nbi_backend *be = d->be;
  nbi_group *g = &c->g;
  nbi_view in[NBI_FUSE_MAX], out[NBI_FUSE_MAX];
  void *dbase[NBI_FUSE_MAX] = {0}, *dout[NBI_FUSE_MAX] = {0};
  size_t out_bytes[NBI_FUSE_MAX] = {0};
  for (int k = 0; k < g->n_operands; k++) {
    dbase[k] = be->alloc(d->ctx, c->base_bytes[k]);
    cr_assert(dbase[k]);
    cr_assert_eq(be->upload(d->ctx, dbase[k], c->base[k], c->base_bytes[k]), NB_OK);
    in[k] = c->in[k];
    in[k].data = (char *)dbase[k] + (c->in[k].data - c->base[k]);
  }
  for (int j = 0; j < g->n_outputs; j++) {
    out_bytes[j] =
        (size_t)(c->out[j].dims[0] ? c->out[j].dims[0] : 1) * nb_dtype_size(c->out[j].dtype);
    dout[j] = be->alloc(d->ctx, out_bytes[j]);
    cr_assert(dout[j]);
    out[j] = c->out[j];
    out[j].data = dout[j];
  }
  char *val[NBI_FUSE_MAX], *first[NBI_FUSE_MAX];
  reference(c, val);
  bool ok = true;
  for (int run = 0; run < runs && ok; run++) {
    cr_assert_eq(nbi_cuda_run_group((nbi_cuda_ctx *)d->ctx, g, out, in), NB_OK, "%s: %s", c->what,
                 nb_last_error());
    cr_assert_eq(be->sync(d->ctx), NB_OK, "%s: %s", c->what, nb_last_error());
    for (int j = 0; j < g->n_outputs; j++)
      cr_assert_eq(be->download(d->ctx, c->outb[j], dout[j], out_bytes[j]), NB_OK);
    for (int k = 0; k < g->n_members && ok; k++) {
      int j = g->m[k].out;
      if (j < 0) continue;
      if (run == 0) {
        ok = compare(c, k, c->outb[j], val[k], "gpu");
        first[j] = malloc(out_bytes[j]);
        memcpy(first[j], c->outb[j], out_bytes[j]);
      } else if (memcmp(first[j], c->outb[j], out_bytes[j])) {
        cr_log_error("%s: output %d differs between runs on the GPU", c->what, j);
        ok = false;
      }
    }
  }
  for (int k = 0; k < g->n_members; k++) {
    free(val[k]);
    if (g->m[k].out >= 0 && runs > 0) free(first[g->m[k].out]);
  }
  for (int k = 0; k < g->n_operands; k++)
    be->free(d->ctx, dbase[k], c->base_bytes[k]);
  for (int j = 0; j < g->n_outputs; j++)
    be->free(d->ctx, dout[j], out_bytes[j]);
  case_free(c);
  return ok;
}

Test(cuda_gpu, random_groups_match_the_cpu_and_repeat_bitwise) {
  int dev = gpu_device();
  if (dev < 0) cr_skip_test("no CUDA device");
  static const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16, NB_I32};
  cr_rng r = {73};
  int bad = 0;
  for (int i = 0; i < 120; i++)
    bad += !check_on_gpu(dev, random_chain(&r, dts[i % 5], i, NULL, i % 4 == 0), 2);
  for (int w = 0; w < C_COUNT; w++)
    for (int i = 0; i < 6; i++) {
      int si = (w * 5 + i * 7) % N_ROW_SHAPES;
      nb_shape F = row_shapes[si].F;
      bad += !check_on_gpu(
          dev,
          composition(&r, w, dts[i % 3], F, F.ndim - 1, i % 3 == 2 ? LAY_TRANS : LAY_CONTIG, -3, 3),
          2);
    }
  for (int i = 0; i < 80; i++)
    bad += !check_on_gpu(dev, random_rows(&r, dts[i % 3], i), 2);
  cr_assert_eq(bad, 0, "%d mismatches (see above)", bad);
}

Test(cuda_gpu, every_elementwise_op_and_reduction_matches_the_cpu) {
  int dev = gpu_device();
  if (dev < 0) cr_skip_test("no CUDA device");
  cr_rng r = {79};
  int bad = 0;
  for (size_t i = 0; i < sizeof float_ops / sizeof float_ops[0]; i++)
    for (int t = 0; t < NB_DTYPE_COUNT; t++) {
      const ew_op *o = &float_ops[i];
      nb_dtype a = (nb_dtype)t, cdt, res;
      if (!ew_types(o, a, a, &cdt, &res)) continue;
      tc_case *c = case_new(cdt, shapes[cr_pick(&r, 10)], -1, nbi_op_table[o->op]->name);
      int e0 = opnd(c, &r, a, FU, cr_pick(&r, LAY_COUNT), -4, 4, 0.05);
      int e1 = opnd(c, &r, a, FU, cr_pick(&r, LAY_COUNT), -4, 4, 0.05);
      store(c, mem(c, o->op, FU, res, cdt, o->arity, -1 - e0, -1 - e1, 0));
      case_finish(c);
      bad += !check_on_gpu(dev, c, 1);
    }
  static const int reds[] = {NBI_OP_REDUCE_SUM, NBI_OP_REDUCE_PROD, NBI_OP_REDUCE_MAX,
                             NBI_OP_REDUCE_MIN, NBI_OP_REDUCE_ANY,  NBI_OP_REDUCE_ALL,
                             NBI_OP_REDUCE_VAR, NBI_OP_LOGSUMEXP,   NBI_OP_ARGMAX,
                             NBI_OP_ARGMIN,     NBI_OP_SOFTMAX,     NBI_OP_CUMSUM};
  for (size_t i = 0; i < sizeof reds / sizeof reds[0]; i++)
    for (int t = 0; t <= NB_BOOL; t++) { /* u8, i8, i16: rows groups refuse them (group_ok) */
      int op = reds[i], si = cr_pick(&r, N_ROW_SHAPES);
      nb_dtype in = (nb_dtype)t, res = in;
      bool axis = op == NBI_OP_SOFTMAX || op == NBI_OP_CUMSUM;
      if (op == NBI_OP_REDUCE_VAR || op == NBI_OP_LOGSUMEXP || op == NBI_OP_SOFTMAX)
        res = nb_dtype_is_float(in) ? in : NB_F32;
      if ((op == NBI_OP_REDUCE_SUM || op == NBI_OP_REDUCE_PROD || op == NBI_OP_CUMSUM) &&
          in == NB_BOOL)
        res = NB_I32;
      if (op == NBI_OP_REDUCE_ANY || op == NBI_OP_REDUCE_ALL) res = NB_BOOL;
      if (op == NBI_OP_ARGMAX || op == NBI_OP_ARGMIN) res = NB_I64;
      nb_shape F = row_shapes[si].F;
      tc_case *c = case_new(res, F, axis ? F.ndim - 1 : row_shapes[si].ra, nbi_op_table[op]->name);
      bool prod = op == NBI_OP_REDUCE_PROD;
      int x =
          -1 - opnd(c, &r, in, FU, cr_pick(&r, LAY_COUNT), prod ? 0.5 : -9, prod ? 1.6 : 9, 0.01);
      store(c, red(c, op, axis ? AX : RR, res, x, 1, 0));
      case_finish(c);
      bad += !check_on_gpu(dev, c, 2);
    }
  cr_assert_eq(bad, 0, "%d mismatches (see above)", bad);
}

#endif
