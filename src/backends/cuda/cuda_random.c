/* src/backends/cuda/cuda_random.c — the RANDOM op on CUDA, with the CPU
 * kernel's numbers bit for bit (../cpu/k_random.c; the contract is in
 * ../../ops/random.c): in[0] holds K keys (i64 pairs of 32-bit words, last dim
 * 2), out holds K blocks of numel / K elements, element j of block k being
 * Threefry-2x32 (20 rounds) of key k at counter j, as the raw first word (i64
 * out) or a uniform in [0, 1) with as many random bits as the float dtype holds
 * exactly (f32 24, f64 53, f16 11, bf16 8), so the conversion to f16 / bf16 is
 * exact and never rounds up to 1. One thread per element: no state, so the
 * values depend on neither the launch shape nor the order. */
#include "cuda_be.h"

#include <stdint.h>

/* clang-format off */
#define RANDOM_SOURCE \
    "/* Threefry-2x32, 20 rounds: (x0, x1) encrypted under key (k0, k1). */\n" \
    "NB_D uint32_t nbx_rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }\n" \
    "NB_D void nbx_threefry(uint32_t k0, uint32_t k1, uint32_t &x0, uint32_t &x1) {\n" \
    "  const int rot[8] = {13, 15, 26, 6, 17, 29, 16, 24};\n" \
    "  uint32_t ks[3] = {k0, k1, 0x1BD11BDAu ^ k0 ^ k1};\n" \
    "  uint32_t a = x0 + ks[0], b = x1 + ks[1];\n" \
    "  for (int i = 0; i < 5; i++) {\n" \
    "    for (int j = 0; j < 4; j++) {\n" \
    "      a += b;\n" \
    "      b = nbx_rotl(b, rot[(i % 2) * 4 + j]);\n" \
    "      b ^= a;\n" \
    "    }\n" \
    "    a += ks[(i + 1) % 3];\n" \
    "    b += ks[(i + 2) % 3] + (uint32_t)(i + 1);\n" \
    "  }\n" \
    "  x0 = a;\n" \
    "  x1 = b;\n" \
    "}\n" \
    "\n" \
    "/* out: numel elements, contiguous; keys: 2 K i64, contiguous (key k is\n" \
    " * keys[2k], keys[2k+1], low 32 bits each); per = numel / K. */\n" \
    "struct nbx_random_args {\n" \
    "  int64_t numel, per;\n" \
    "};\n" \
    "\n" \
    "NB_D void nbx_random_words(const int64_t *keys, const nbx_random_args &a, int64_t i,\n" \
    "                           uint32_t &w0, uint32_t &w1) {\n" \
    "  int64_t q = i / a.per, j = i - q * a.per;\n" \
    "  w0 = (uint32_t)((uint64_t)j >> 32);\n" \
    "  w1 = (uint32_t)j;\n" \
    "  nbx_threefry((uint32_t)keys[2 * q], (uint32_t)keys[2 * q + 1], w0, w1);\n" \
    "}\n" \
    "\n" \
    "#define NBX_RANDOM_LOOP(i)                                                  \\\n" \
    "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;         \\\n" \
    "       i < a.numel; i += (int64_t)gridDim.x * blockDim.x)\n" \
    "\n" \
    "extern \"C\" __global__ void nbx_random_bits(int64_t *o, const int64_t *keys,\n" \
    "                                           nbx_random_args a) {\n" \
    "  NBX_RANDOM_LOOP(i) {\n" \
    "    uint32_t w0, w1;\n" \
    "    nbx_random_words(keys, a, i, w0, w1);\n" \
    "    o[i] = (int64_t)w0;\n" \
    "  }\n" \
    "}\n" \
    "extern \"C\" __global__ void nbx_random_f32(float *o, const int64_t *keys,\n" \
    "                                          nbx_random_args a) {\n" \
    "  NBX_RANDOM_LOOP(i) {\n" \
    "    uint32_t w0, w1;\n" \
    "    nbx_random_words(keys, a, i, w0, w1);\n" \
    "    o[i] = (float)(w0 >> 8) * 0x1p-24f;\n" \
    "  }\n" \
    "}\n" \
    "extern \"C\" __global__ void nbx_random_f64(double *o, const int64_t *keys,\n" \
    "                                          nbx_random_args a) {\n" \
    "  NBX_RANDOM_LOOP(i) {\n" \
    "    uint32_t w0, w1;\n" \
    "    nbx_random_words(keys, a, i, w0, w1);\n" \
    "    o[i] = (double)(((uint64_t)w0 << 21) ^ (w1 >> 11)) * 0x1p-53;\n" \
    "  }\n" \
    "}\n" \
    "extern \"C\" __global__ void nbx_random_f16(unsigned short *o, const int64_t *keys,\n" \
    "                                          nbx_random_args a) {\n" \
    "  NBX_RANDOM_LOOP(i) {\n" \
    "    uint32_t w0, w1;\n" \
    "    nbx_random_words(keys, a, i, w0, w1);\n" \
    "    o[i] = nb_f32_to_f16((float)(w0 >> 21) * 0x1p-11f); /* exact */\n" \
    "  }\n" \
    "}\n" \
    "extern \"C\" __global__ void nbx_random_bf16(unsigned short *o, const int64_t *keys,\n" \
    "                                           nbx_random_args a) {\n" \
    "  NBX_RANDOM_LOOP(i) {\n" \
    "    uint32_t w0, w1;\n" \
    "    nbx_random_words(keys, a, i, w0, w1);\n" \
    "    o[i] = nb_f32_to_bf16((float)(w0 >> 24) * 0x1p-8f); /* exact */\n" \
    "  }\n" \
    "}\n"
/* clang-format on */

typedef struct random_args {
  int64_t numel, per;
} random_args;

/* Kernels in nb_dtype order of their results (f32, f64, f16, bf16), then i64. */
static const char *const random_names[] = {"nbx_random_f32", "nbx_random_f64", "nbx_random_f16",
                                           "nbx_random_bf16", "nbx_random_bits"};
_Static_assert(NB_F32 == 0 && NB_F64 == 1 && NB_F16 == 2 && NB_BF16 == 3,
               "random kernels are listed in nb_dtype order");
static nbi_cuda_module random_module = {
    .body = RANDOM_SOURCE,
    .names = random_names,
    .n_names = (int)(sizeof random_names / sizeof random_names[0]),
};

int nbi_cuda_random_modules(int op, nbi_cuda_module **m) {
  (void)op;
  m[0] = &random_module;
  return 1;
}

nb_status nbi_cuda_random(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)n; /* the mode is implied by out's dtype: i64 words, else uniforms */
  int64_t numel = nbi_cuda_view_numel(out), keys = 1;
  for (int d = 0; d + 1 < in[0].ndim; d++)
    keys *= in[0].dims[d];
  if (numel == 0 || keys == 0) return NB_OK;
  int k = out->dtype == NB_I64 ? 4 : (int)out->dtype;
  if (k > 4)
    return nbi_error(NB_ERR_DTYPE, "random: no CUDA kernel for %s", nb_dtype_name(out->dtype));
  nb_status st;
  CUfunction f;
  if ((st = nbi_cuda_module_fn(c, &random_module, k, &f))) return st;
  CUdeviceptr owned;
  const char *kp = nbi_cuda_contig(c, &in[0], NB_I64, &owned);
  if (!kp) return nb_last_status() ? nb_last_status() : NB_ERR_OOM;
  random_args a = {.numel = numel, .per = numel / keys};
  CUdeviceptr po = (CUdeviceptr)(uintptr_t)out->data, pk = (CUdeviceptr)(uintptr_t)kp;
  st = nbi_cuda_launch_n(c, f, numel, (void *[]){&po, &pk, &a});
  if (owned) nbi_cuda_free_block(c->alloc, owned);
  return st;
}
