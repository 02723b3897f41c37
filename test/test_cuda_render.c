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

#endif
