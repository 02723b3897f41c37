/* src/backends/cpu/vmath.h — vectorizable f32 math for the CPU kernels, and the
 * instruction set the hot loops run with.
 *
 * Every function here is branch-free straight-line code (selects, integer bit
 * tricks, polynomials), always inlined, so a loop calling it vectorizes to the
 * width of whatever ISA the enclosing function is compiled for. The same
 * operations run in every lane and in scalar code, and nothing is contracted
 * into FMA (the Makefile builds with -ffp-contract=off), so a value does not
 * depend on the ISA or on where in a loop it falls. gcc vectorizes the selects
 * only under -fno-trapping-math (also in the Makefile; nothing reads FP flags).
 *
 * Accuracy, as the largest error in ulp against libm in double over every
 * 61st float of both signs (normal results; FTZ/DAZ off):
 *   vm_expf 0.96 (vm_expf_nonpos 1.07), vm_logf 0.81, vm_tanhf 1.05, vm_expm1f 1.49,
 * vm_log1pf 1.44, vm_softplusf 1.89; vm_sigmoidf, vm_siluf, vm_erff, vm_geluf 0.501 (computed in
 * double, rounded once). test/test_vmath.c bounds them by 2 ulp (1 for the double-evaluated ones)
 * over every 4099th float, dense samples of 13 ranges and special values;
 * results in the denormal range are checked to within FLT_MIN.
 * Polynomials are least-squares Chebyshev fits (mpmath chebyfit) made for this
 * file. Special values follow C99 Annex F: exp(-inf) = 0, exp(inf) = inf,
 * log(0) = -inf, log(x < 0) = NaN, +-0 keep their sign where libm's do, NaN in
 * gives NaN out. Results below FLT_MIN are computed (to within the same bound
 * in units of the smallest denormal) but the compute threads run with FTZ/DAZ,
 * which flushes them (cpu.c). f64 kernels keep libm.
 */
#ifndef NABLA_CPU_VMATH_H
#define NABLA_CPU_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- instruction sets ----------------------------------------------------------- */
/* The ISA the kernels' hot loops use: the best the CPU supports, or what the
 * environment variable NABLA_ISA names (portable, avx2, avx512; lowered to what
 * the CPU supports; anything else is ignored), read once. */
typedef enum nbi_isa { NBI_ISA_PORTABLE, NBI_ISA_AVX2, NBI_ISA_AVX512, NBI_ISA_COUNT } nbi_isa;

nbi_isa nbi_isa_active(void);
/* The best ISA this CPU (and this build) supports. */
nbi_isa nbi_isa_best(void);
/* Makes min(want, nbi_isa_best()) the active ISA and returns it (tests use this
 * to run every path in one process). */
nbi_isa nbi_isa_select(nbi_isa want);
const char *nbi_isa_name(nbi_isa isa);

/* Function attributes compiling one variant per ISA: NBI_ISA_ATTR_<suffix>,
 * and NBI_FOR_ISAS(M) applying M(suffix, enum value) to every ISA of this
 * build. Only x86-64 gcc/clang builds have more than the portable one. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NBI_HAVE_ISA_VARIANTS 1
#define NBI_ISA_ATTR_avx512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma")))
#define NBI_ISA_ATTR_avx2 __attribute__((target("avx2,fma")))
#define NBI_ISA_ATTR_portable
#define NBI_FOR_ISAS(M)                                                                            \
  M(portable, NBI_ISA_PORTABLE) M(avx2, NBI_ISA_AVX2) M(avx512, NBI_ISA_AVX512)
#else
#define NBI_HAVE_ISA_VARIANTS 0
#define NBI_ISA_ATTR_portable
#define NBI_FOR_ISAS(M) M(portable, NBI_ISA_PORTABLE)
#endif

/* ---- bits ----------------------------------------------------------------------- */
#define VM_INLINE static inline __attribute__((always_inline))

VM_INLINE uint32_t vm_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
VM_INLINE float vm_float(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}
VM_INLINE uint64_t vm_bits64(double x) {
  uint64_t u;
  memcpy(&u, &x, 8);
  return u;
}
VM_INLINE double vm_double(uint64_t u) {
  double x;
  memcpy(&x, &u, 8);
  return x;
}
/* 2^n as a float, n in [-126, 127]. */
VM_INLINE float vm_pow2f(int32_t n) { return vm_float((uint32_t)(n + 127) << 23); }
/* |m| with the sign of s. */
VM_INLINE float vm_copysignf(float m, float s) {
  return vm_float((vm_bits(m) & 0x7fffffffu) | (vm_bits(s) & 0x80000000u));
}

/* a * b + c rounded once, on every ISA: an instruction where the variant is
 * compiled for FMA (AVX2 and AVX-512 variants, and the x86-64-v3 clones of
 * HOT loops), libm's fmaf elsewhere (the portable variant on x86-64: slow,
 * but the same bits). The build never contracts a * b + c by itself
 * (-ffp-contract=off): only what is written VM_FMA is fused. */
#define VM_FMA(a, b, c) __builtin_fmaf(a, b, c)

/* ---- exp family ------------------------------------------------------------------ */
/* Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2: n rounds through the
 * magic 1.5 * 2^23; ln2 = C1 + C2 with C1 short enough that n * C1 is exact. */
#define VM_LN2_C1 0.693359375f
#define VM_LN2_C2 -2.12194440e-4f
/* ln2 = VM_LN2_F + VM_LN2_F_LO: the float nearest ln2 and the rest, for a
 * reduction by two FMAs (x - n ln2 to within a few ulp of r for |n| <= 128). */
#define VM_LN2_F 0.693147182f
#define VM_LN2_F_LO -1.90465421e-09f

/* (e^r - 1 - r) / r^2 on |r| <= ln2 / 2 (relative error 3e-9). */
VM_INLINE float vm_exp_poly(float r) {
  float p = 0.0001989098087f;
  p = p * r + 0.001393364103f;
  p = p * r + 0.008333310934f;
  p = p * r + 0.04166646501f;
  p = p * r + 0.1666666668f;
  p = p * r + 0.5000000013f;
  return p;
}

/* n = round(x / ln2) (as float nf and integer n) and r = x - n ln2, for
 * |x| <= 2^21. */
VM_INLINE float vm_reduce_ln2(float x, float *nf, int32_t *n) {
  const float magic = 12582912.0f;
  float t = x * 1.44269504088896341f + magic;
  *nf = t - magic;
  *n = (int32_t)(vm_bits(t) - 0x4B400000u);
  return (x - *nf * VM_LN2_C1) - *nf * VM_LN2_C2;
}

/* e^x. Clamped to [-104, 89], past which the result is 0 or inf anyway; the
 * scale 2^n is applied in two halves so results in the denormal range round
 * once, and n = 128 overflows to inf as it should. */
VM_INLINE float vm_expf(float x) {
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  float nf;
  int32_t n;
  float r = vm_reduce_ln2(xc, &nf, &n);
  float y = (vm_exp_poly(r) * r * r + r) + 1.0f;
  int32_t n1 = n >> 1;
  return y * vm_pow2f(n1) * vm_pow2f(n - n1);
}

/* e^x for x <= 0 (softmax and logsumexp terms, max-shifted; x > 0 is not
 * supported), 1.07 ulp: a Cody-Waite reduction and a degree-4 polynomial for
 * (e^r - 1 - r) / r^2 (one lower than vm_exp_poly: a least-squares Chebyshev
 * fit, numpy), both by FMAs (VM_FMA: the same bits on every ISA), and the scale added to
 * the exponent field of y (t's low bits shifted up: one shift and one integer
 * add instead of vm_expf's two multiplies and clamps), exact where the result
 * is a normal float (x >= -87.33); 0 below (e^x < 1.2e-38 there: denormals,
 * which the compute threads flush anyway, and a sliver just above FLT_MIN).
 * In softmax's AVX2 loop: 16 vector instructions per 8 lanes (26 without
 * FMA, vm_expf's 42), which is what that loop is bound by; softmax rows
 * 4096 x 1024 went from 0.73 to 0.84 of a STREAM triad on AVX2 (issue 14).
 * vm_expf_nonpos_nan0 gives 0 for NaN (a row loop that knows its shift is
 * finite needs no NaN select); vm_expf_nonpos gives NaN. */
VM_INLINE float vm_expf_nonpos_nan0(float x) {
  const float magic = 12582912.0f;
  float t = VM_FMA(x, 1.44269504088896341f, magic), nf = t - magic;
  float r = VM_FMA(nf, -VM_LN2_F, x);
  r = VM_FMA(nf, -VM_LN2_F_LO, r);
  float p = 0.001393545419f;
  p = VM_FMA(p, r, 0.008364383131f);
  p = VM_FMA(p, r, 0.04166644812f);
  p = VM_FMA(p, r, 0.1666657031f);
  p = VM_FMA(p, r, 0.5f);
  float y = VM_FMA(p, r * r, r) + 1.0f;
  /* n = bits(t) - bits(magic), and bits(magic) << 23 wraps to 0 */
  float s = vm_float(vm_bits(y) + (vm_bits(t) << 23));
  return x >= -87.33f ? s : 0.0f;
}
VM_INLINE float vm_expf_nonpos(float x) {
  float s = vm_expf_nonpos_nan0(x);
  return x != x ? x : s;
}

/* e^x - 1: 2^n (e^r - 1) + (2^n - 1), formed at half scale and doubled (exact)
 * so that n = 128 overflows to inf; n = 0 returns e^r - 1 itself, which keeps
 * tiny and denormal x exact. */
VM_INLINE float vm_expm1f(float x) {
  float xc = x < -30.0f ? -30.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  float nf;
  int32_t n;
  float r = vm_reduce_ln2(xc, &nf, &n);
  float em = vm_exp_poly(r) * r * r + r;
  float h = vm_pow2f(n - 1);
  float y = 2.0f * (h * em + (h - 0.5f));
  y = n == 0 ? em : y;
  return x == 0 ? x : y;
}

/* tanh x: x + x^3 q(x^2) for |x| < 0.75, else sign(x) (1 - 2 / (e^2|x| + 1)). */
VM_INLINE float vm_tanhf(float x) {
  float z = x * x;
  float q = 0.001909502452f;
  q = q * z - 0.007933807623f;
  q = q * z + 0.02161531890f;
  q = q * z - 0.05393585355f;
  q = q * z + 0.1333317964f;
  q = q * z - 0.3333333214f;
  float small = vm_copysignf(x + x * z * q, x); /* keeps -0 */
  float a = vm_copysignf(x, 1.0f);
  float big = vm_copysignf(1.0f - 2.0f / (vm_expf(2.0f * a) + 1.0f), x);
  return a < 0.75f ? small : big;
}

/* ---- log family ------------------------------------------------------------------ */
/* log x: x = m 2^e with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact),
 * log(1 + f) = f - f^2 / 2 + f^3 q(f), plus e ln2 in two parts. Denormal x is
 * scaled by 2^23 first. */
VM_INLINE float vm_logf(float x) {
  int sub = x < 1.17549435e-38f;
  float xs = sub ? x * 8388608.0f : x;
  uint32_t u = vm_bits(xs);
  int32_t e = (int32_t)((u >> 23) & 0xff) - (sub ? 150 : 127);
  float m = vm_float((u & 0x007fffffu) | 0x3f800000u);
  int big = m > 1.41421356f;
  m = big ? 0.5f * m : m;
  e += big;
  float f = m - 1.0f, z = f * f;
  float q = 0.06971611471f;
  q = q * f - 0.1147973385f;
  q = q * f + 0.1168541992f;
  q = q * f - 0.1242568733f;
  q = q * f + 0.1424905765f;
  q = q * f - 0.1666780232f;
  q = q * f + 0.2000071575f;
  q = q * f - 0.2499999696f;
  q = q * f + 0.3333333118f;
  float ef = (float)e;
  float y = f * z * q + ef * VM_LN2_C2;
  y = y - 0.5f * z;
  float r = (f + y) + ef * VM_LN2_C1;
  r = x == INFINITY ? x : r;
  r = x == 0 ? -INFINITY : r;
  r = x < 0 ? NAN : r;
  return x != x ? x : r;
}

/* log(1 + x) = log u + (x - (u - 1)) / u with u = 1 + x rounded: the second
 * term corrects u's rounding (and is all of it when u == 1). */
VM_INLINE float vm_log1pf(float x) {
  float u = 1.0f + x;
  float r = vm_logf(u) + (x - (u - 1.0f)) / u;
  r = x == INFINITY ? x : r;
  r = x == -1.0f ? -INFINITY : r;
  return x == 0 ? x : r;
}

/* log(1 + e^x), without overflow: max(x, 0) + log1p(e^-|x|). */
VM_INLINE float vm_softplusf(float x) {
  return (x > 0 ? x : 0.0f) + vm_log1pf(vm_expf(-vm_copysignf(x, 1.0f)));
}

/* ---- evaluated in double: sigmoid, silu, erf, gelu -------------------------------- */
/* e^y for y in [-111, 0] in double, relative error ~1e-12 (enough for a float
 * result): reduction by ln2 = C1 + C2 (C1 of 32 bits) and a degree-9 polynomial. */
VM_INLINE double vm_exp_neg_d(double y) {
  const double magic = 6755399441055744.0; /* 1.5 * 2^52 */
  double t = y * 1.4426950408889634 + magic, nf = t - magic;
  int64_t n = (int64_t)(vm_bits64(t) - vm_bits64(magic));
  double r = (y - nf * 0x1.62e42feep-1) - nf * 0x1.a39ef35793c76p-33;
  double p = 2.7617564785876086e-6;
  p = p * r + 2.4867870179687726e-5;
  p = p * r + 0.00019841224599656012;
  p = p * r + 0.0013888839110572008;
  p = p * r + 0.0083333333442029799;
  p = p * r + 0.041666666786265734;
  p = p * r + 0.16666666666662587;
  p = p * r + 0.49999999999955107;
  return ((p * r * r + r) + 1.0) * vm_double((uint64_t)(n + 1023) << 52);
}

/* 1 / (1 + e^-x), in double from e = e^-|x| (which neither overflows nor goes
 * denormal): 1 / (1 + e) for x >= 0, e / (1 + e) below. */
VM_INLINE double vm_sigmoid_d(float x) {
  double a = x < 0 ? -(double)x : (double)x;
  double e = a > 110.0 ? 0.0 : vm_exp_neg_d(-a);
  return (x >= 0 ? 1.0 : e) / (1.0 + e);
}
VM_INLINE float vm_sigmoidf(float x) { return (float)vm_sigmoid_d(x); }

/* x / (1 + e^-x) = x sigmoid(x); silu(-inf) is NaN (-inf * 0), as the libm
 * formula gives. */
VM_INLINE float vm_siluf(float x) { return (float)(x * vm_sigmoid_d(x)); }

/* erf(a) / a as a polynomial in z = a^2, for a in [0, 1] (relative error 1e-12). */
VM_INLINE double vm_erf_small_d(double z) {
  double p = 1.0589380641075019e-6;
  p = p * z - 1.3909340021874599e-5;
  p = p * z + 0.00011956562568207330;
  p = p * z - 0.00085426379970872296;
  p = p * z + 0.0052237834771892481;
  p = p * z - 0.026866133235095592;
  p = p * z + 0.11283791308604581;
  p = p * z - 0.37612638889635307;
  p = p * z + 1.1283791670946767;
  return p;
}

/* erfc(a) for a in [1, 10.5]: e^(-a^2) t k(t) with t = 2 / (2 + a) and k a
 * polynomial (relative error 5e-11). */
VM_INLINE double vm_erfc_tail_d(double a) {
  double t = 2.0 / (2.0 + a);
  double k = 0.057716694969974849;
  k = k * t - 0.30873849414204245;
  k = k * t + 0.65485188462936990;
  k = k * t - 0.65227909399625730;
  k = k * t + 0.28218953456834420;
  k = k * t - 0.13295091076200572;
  k = k * t + 0.11709896091083326;
  k = k * t + 0.17045416462447255;
  k = k * t + 0.24749809895691270;
  k = k * t + 0.28205069465754026;
  k = k * t + 0.28209608555385813;
  return vm_exp_neg_d(-(a * a)) * t * k;
}

/* erfc(y) for any double y (NaN gives NaN): 1 - erf for |y| <= 1, the tail
 * beyond (2 - tail for y < -1); exactly 0 past 10.5, where the float result
 * underflows anyway. */
VM_INLINE double vm_erfc_d(double y) {
  double a = y < 0 ? -y : y;
  double small = 1.0 - y * vm_erf_small_d(y * y);
  double ac = a < 1.0 ? 1.0 : a > 10.5 ? 10.5 : a;
  double tail = vm_erfc_tail_d(ac);
  double r = a <= 1.0 ? small : y > 0 ? tail : 2.0 - tail;
  return y > 10.5 ? 0.0 : r;
}

/* erf x */
VM_INLINE float vm_erff(float x) {
  double d = x, a = d < 0 ? -d : d;
  double small = d * vm_erf_small_d(d * d);
  double ac = a < 1.0 ? 1.0 : a > 10.5 ? 10.5 : a;
  double tail = 1.0 - vm_erfc_tail_d(ac);
  double big = d < 0 ? -tail : tail;
  return (float)(a <= 1.0 ? small : big);
}

/* gelu x = x Phi(x) = x erfc(-x / sqrt 2) / 2 (no cancellation for x << 0);
 * gelu(-inf) is NaN (-inf * 0), as the libm formula gives. */
VM_INLINE float vm_geluf(float x) {
  double d = x;
  return (float)(0.5 * d * vm_erfc_d(d * -0.70710678118654752440));
}

#endif
