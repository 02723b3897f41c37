/* src/core/dtype.c — dtype sizes, names, promotion, f16/bf16 conversion, and
 * typed element access used by generic (non-hot) loops. */
#include "nbi.h"

#include <math.h>

static const char *const dtype_names[NB_DTYPE_COUNT] = {"f32", "f64",  "f16", "bf16", "i32",
                                                        "i64", "bool", "u8",  "i8",   "i16"};
static const size_t dtype_sizes[NB_DTYPE_COUNT] = {4, 8, 2, 2, 4, 8, 1, 1, 1, 2};

bool nbi_dtype_valid(nb_dtype dt) { return (unsigned)dt < NB_DTYPE_COUNT; }
const char *nb_dtype_name(nb_dtype dt) { return nbi_dtype_valid(dt) ? dtype_names[dt] : "?"; }
size_t nb_dtype_size(nb_dtype dt) { return nbi_dtype_valid(dt) ? dtype_sizes[dt] : 0; }
bool nb_dtype_is_float(nb_dtype dt) {
  return dt == NB_F32 || dt == NB_F64 || dt == NB_F16 || dt == NB_BF16;
}
bool nbi_dtype_is_int(nb_dtype dt) {
  return dt == NB_I32 || dt == NB_I64 || dt == NB_U8 || dt == NB_I8 || dt == NB_I16;
}

/* PyTorch's rules: bool < integers < {f16, bf16} < f32 < f64, f16 v bf16 =
 * f32; two integers give the narrowest signed type holding both (u8 is the
 * only unsigned one: u8 v i8 = i16). */
nb_dtype nb_promote_types(nb_dtype a, nb_dtype b) {
  if (!nbi_dtype_valid(a) || !nbi_dtype_valid(b)) return NB_DTYPE_COUNT;
  if (a == b) return a;
  if (nbi_dtype_is_int(a) && nbi_dtype_is_int(b)) {
    /* bits of a signed type holding the values: u8 needs 16 beside a signed one */
    static const int bits[NB_DTYPE_COUNT] = {
        [NB_I8] = 8, [NB_I16] = 16, [NB_I32] = 32, [NB_I64] = 64, [NB_U8] = 16};
    if (a == NB_U8 || b == NB_U8) {
      nb_dtype s = a == NB_U8 ? b : a;
      return bits[s] <= 16 ? NB_I16 : s;
    }
    return bits[a] > bits[b] ? a : b;
  }
  static const int rank[NB_DTYPE_COUNT] = {
      [NB_BOOL] = 0, [NB_U8] = 1,  [NB_I8] = 1,   [NB_I16] = 1, [NB_I32] = 1,
      [NB_I64] = 1,  [NB_F16] = 3, [NB_BF16] = 3, [NB_F32] = 4, [NB_F64] = 5};
  if (rank[a] == rank[b]) return NB_F32; /* f16 with bf16 */
  return rank[a] > rank[b] ? a : b;
}

/* ---- half precision: bit-exact round-to-nearest-even conversions ---------- */
float nbi_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalize */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t nbi_f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
  if (exp == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
  int e = (int)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00);
  if (e <= 0) { /* subnormal or zero in f16 */
    if (e < -10) return (uint16_t)sign;
    man |= 0x800000;
    int shift = 14 - e;
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = (uint32_t)e << 10 | man >> 13, rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* may carry into exp: ok */
  return (uint16_t)(sign | half);
}

float nbi_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t nbi_f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

/* ---- typed element access ---------------------------------------------------- */
double nbi_load_f64(const void *p, nb_dtype dt, int64_t i) {
  switch (dt) {
  case NB_F32: return ((const float *)p)[i];
  case NB_F64: return ((const double *)p)[i];
  case NB_F16: return nbi_f16_to_f32(((const uint16_t *)p)[i]);
  case NB_BF16: return nbi_bf16_to_f32(((const uint16_t *)p)[i]);
  case NB_I32: return ((const int32_t *)p)[i];
  case NB_I64: return (double)((const int64_t *)p)[i];
  case NB_BOOL: return ((const uint8_t *)p)[i] != 0;
  case NB_U8: return ((const uint8_t *)p)[i];
  case NB_I8: return ((const int8_t *)p)[i];
  case NB_I16: return ((const int16_t *)p)[i];
  default: return NAN;
  }
}

int64_t nbi_load_i64(const void *p, nb_dtype dt, int64_t i) {
  switch (dt) {
  case NB_I32: return ((const int32_t *)p)[i];
  case NB_I64: return ((const int64_t *)p)[i];
  case NB_BOOL: return ((const uint8_t *)p)[i] != 0;
  case NB_U8: return ((const uint8_t *)p)[i];
  case NB_I8: return ((const int8_t *)p)[i];
  case NB_I16: return ((const int16_t *)p)[i];
  default: {
    double v = nbi_load_f64(p, dt, i);
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
  }
  }
}

static int32_t sat_i32(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return INT32_MAX;
  if (v <= -2147483648.0) return INT32_MIN;
  return (int32_t)v;
}

void nbi_store_f64(void *p, nb_dtype dt, int64_t i, double v) {
  switch (dt) {
  case NB_F32: ((float *)p)[i] = (float)v; break;
  case NB_F64: ((double *)p)[i] = v; break;
  case NB_F16: ((uint16_t *)p)[i] = nbi_f32_to_f16((float)v); break;
  case NB_BF16: ((uint16_t *)p)[i] = nbi_f32_to_bf16((float)v); break;
  case NB_I32: ((int32_t *)p)[i] = sat_i32(v); break;
  case NB_I64:
    ((int64_t *)p)[i] = v != v                        ? 0
                        : v >= 9.2233720368547758e18  ? INT64_MAX
                        : v <= -9.2233720368547758e18 ? INT64_MIN
                                                      : (int64_t)v;
    break;
  case NB_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  case NB_U8:
  case NB_I8:
  case NB_I16: /* truncation toward zero (saturating to i64), then wrapping */
    nbi_store_i64(p, dt, i,
                  v != v                        ? 0
                  : v >= 9.2233720368547758e18  ? INT64_MAX
                  : v <= -9.2233720368547758e18 ? INT64_MIN
                                                : (int64_t)v);
    break;
  default: break;
  }
}

void nbi_store_i64(void *p, nb_dtype dt, int64_t i, int64_t v) {
  switch (dt) {
  case NB_I32:
    ((int32_t *)p)[i] = v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
    break;
  case NB_I64: ((int64_t *)p)[i] = v; break;
  case NB_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  case NB_U8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)v; break; /* wrapping, as PyTorch */
  case NB_I8: ((int8_t *)p)[i] = (int8_t)(uint8_t)(uint64_t)v; break;
  case NB_I16: ((int16_t *)p)[i] = (int16_t)(uint16_t)(uint64_t)v; break;
  default: nbi_store_f64(p, dt, i, (double)v); break;
  }
}
