/* src/backends/cpu/k_random.c — the RANDOM op: counter-based random numbers
 * from keys (src/ops/random.c has the contract). in[0] holds K keys (i64
 * pairs of 32-bit words, its last dim 2); the output holds K blocks of
 * numel / K elements, element j of block k drawn from Threefry-2x32 (20
 * rounds, Salmon et al. 2011) of key k at counter j: no state, so the values
 * depend on neither the thread count nor the order of evaluation. */
#include "k_random.h"

#include <omp.h>
#include <stdlib.h>

static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

/* Threefry-2x32, 20 rounds: (x0, x1) encrypted under key (k0, k1). */
static inline void threefry2x32(uint32_t k0, uint32_t k1, uint32_t *x0, uint32_t *x1) {
  static const int rot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
  uint32_t ks[3] = {k0, k1, 0x1BD11BDAu ^ k0 ^ k1};
  uint32_t a = *x0 + ks[0], b = *x1 + ks[1];
  for (int i = 0; i < 5; i++) {
    for (int j = 0; j < 4; j++) {
      a += b;
      b = rotl32(b, rot[(i % 2) * 4 + j]);
      b ^= a;
    }
    a += ks[(i + 1) % 3];
    b += ks[(i + 2) % 3] + (uint32_t)(i + 1);
  }
  *x0 = a;
  *x1 = b;
}

enum { MODE_BITS = 0, MODE_UNIFORM = 1 };

/* Element j of a block under key (k0, k1) as out's dtype: the 32-bit word
 * (bits, i64) or a uniform in [0, 1) with as many random bits as the dtype
 * holds exactly (never rounding up to 1). */
static inline void draw(char *o, nb_dtype dt, int mode, uint32_t k0, uint32_t k1, int64_t j) {
  uint32_t w0 = (uint32_t)((uint64_t)j >> 32), w1 = (uint32_t)j;
  threefry2x32(k0, k1, &w0, &w1);
  if (mode == MODE_BITS) {
    *(int64_t *)o = (int64_t)w0;
    return;
  }
  switch (dt) {
  case NB_F32: *(float *)o = (float)(w0 >> 8) * 0x1p-24f; break;
  case NB_F64: *(double *)o = (double)(((uint64_t)w0 << 21) ^ (w1 >> 11)) * 0x1p-53; break;
  case NB_F16: nbi_store_f64(o, dt, 0, (double)(w0 >> 21) * 0x1p-11); break;
  default: nbi_store_f64(o, dt, 0, (double)(w0 >> 24) * 0x1p-8); break; /* bf16 */
  }
}

nb_status nbi_cpu_random(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  int mode = (int)n->attrs.i[0];
  int64_t numel = 1, keys = 1;
  for (int d = 0; d < out->ndim; d++)
    numel *= out->dims[d];
  for (int d = 0; d + 1 < in[0].ndim; d++)
    keys *= in[0].dims[d];
  if (numel == 0 || keys == 0) return NB_OK;
  int64_t per = numel / keys;
  size_t es = nb_dtype_size(out->dtype);
  /* the keys, read through the input's strides (i64 pairs) */
  uint32_t *k = malloc(sizeof *k * 2 * (size_t)keys);
  if (!k) return nbi_error(NB_ERR_OOM, "nb_random: out of memory");
  for (int64_t q = 0; q < keys; q++) {
    int64_t off = 0, rem = q;
    for (int d = in[0].ndim - 2; d >= 0; d--) {
      off += (rem % in[0].dims[d]) * in[0].strides[d];
      rem /= in[0].dims[d];
    }
    int64_t s = in[0].strides[in[0].ndim - 1];
    k[2 * q] = (uint32_t)((const int64_t *)in[0].data)[off];
    k[2 * q + 1] = (uint32_t)((const int64_t *)in[0].data)[off + s];
  }
  /* out is contiguous (the kernel contract's fresh output) */
  char *o = out->data;
  bool par = numel >= NBI_PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t i = 0; i < numel; i++) {
    int64_t q = i / per;
    draw(o + (size_t)i * es, out->dtype, mode, k[2 * q], k[2 * q + 1], i - q * per);
  }
  free(k);
  return NB_OK;
}
