/* src/backends/cuda/cuda_gemm_kernels.c — the hand-written kernels of cuda_gemm.c,
 * compiled at run time by NVRTC after the common preamble (cuda_preamble.c):
 *  - integer and bool products (cuBLASLt multiplies floats only): int64 sums of
 *    int64 products, wrapping as the CPU's (src/backends/cpu/k_linalg.c), and bool
 *    products as or-of-ands; one thread per output element;
 *  - the epilogue pass of GEMM epilogue groups: the activation of the sum (and,
 *    where cuBLASLt has no BIAS algorithm, the bias add first), its formula taken
 *    from the shared list (../ew_formulas.h) so that it gives the unfused
 *    activation's bits.
 * Each kernel's CUfunction is kept per device (with the context it was loaded
 * in), so a launch after the first costs no source hashing. */
#include "cuda_be.h"

#include <stdio.h>
#include <stdlib.h>

#include "../ew_formulas.h"

enum {
  BLOCK = 256,      /* threads per block */
  MAX_GRID = 65536, /* blocks of a grid-stride launch */
  N_ACTS = 6,       /* none, relu, gelu, tanh, sigmoid, silu */
  N_DTYPES = 4,     /* f32, f64, f16, bf16 */
  SLOT_I64 = 0,     /* kernel slots: integer product, bool product, then the */
  SLOT_BOOL = 1,    /* epilogue pass per (dtype, activation, bias) */
  SLOT_EPI = 2,
  N_SLOTS = SLOT_EPI + N_DTYPES * N_ACTS * 2,
};

static const char mm_int_src[] =
    "/* C[bi] (m x n, rows contiguous) = A[bi] (m x k) @ B[bi] (k x n): element (i, p)\n"
    " * of A[bi] at a[bi*sa + i*sar + p*sac], (p, j) of B[bi] at b[bi*sb + p*sbr + j*sbc],\n"
    " * (i, j) of C[bi] at c[bi*sc + i*n + j]. One thread per element of C, grid-stride;\n"
    " * consecutive threads take consecutive j (coalesced B and C). int64: wrapping sums\n"
    " * of wrapping products; bool: any(a && b). */\n"
    "extern \"C\" __global__ void nb_matmul_i64(const int64_t *a, const int64_t *b, int64_t *c,\n"
    "    int64_t m, int64_t n, int64_t k, int64_t batch, int64_t sa, int64_t sar, int64_t sac,\n"
    "    int64_t sb, int64_t sbr, int64_t sbc, int64_t sc) {\n"
    "  int64_t total = batch * m * n, step = (int64_t)gridDim.x * blockDim.x;\n"
    "  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {\n"
    "    int64_t j = t % n, i = (t / n) % m, bi = t / (n * m);\n"
    "    const int64_t *ar = a + bi * sa + i * sar, *bc = b + bi * sb + j * sbc;\n"
    "    uint64_t acc = 0;\n"
    "    for (int64_t p = 0; p < k; p++) acc += (uint64_t)ar[p * sac] * (uint64_t)bc[p * sbr];\n"
    "    c[bi * sc + i * n + j] = (int64_t)acc;\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void nb_matmul_bool(const uint8_t *a, const uint8_t *b, uint8_t *c,\n"
    "    int64_t m, int64_t n, int64_t k, int64_t batch, int64_t sa, int64_t sar, int64_t sac,\n"
    "    int64_t sb, int64_t sbr, int64_t sbc, int64_t sc) {\n"
    "  int64_t total = batch * m * n, step = (int64_t)gridDim.x * blockDim.x;\n"
    "  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {\n"
    "    int64_t j = t % n, i = (t / n) % m, bi = t / (n * m);\n"
    "    const uint8_t *ar = a + bi * sa + i * sar, *bc = b + bi * sb + j * sbc;\n"
    "    uint8_t acc = 0;\n"
    "    for (int64_t p = 0; p < k && !acc; p++) acc = ar[p * sac] != 0 && bc[p * sbr] != 0;\n"
    "    c[bi * sc + i * n + j] = acc;\n"
    "  }\n"
    "}\n";

/* The activations of GEMM epilogue groups, in slot order (0: none). */
static const int acts[N_ACTS] = {-1,          NBI_OP_RELU,    NBI_OP_GELU,
                                 NBI_OP_TANH, NBI_OP_SIGMOID, NBI_OP_SILU};

/* Index of op in acts (0 for -1), or -1 when it is not an epilogue activation. */
static int act_index(int op) {
  for (int i = 0; i < N_ACTS; i++)
    if (acts[i] == op) return i;
  return -1;
}

/* cuda_be.h. */
bool nbi_cuda_gemm_epi_act(int op) { return op >= 0 && act_index(op) > 0; }

/* The float-domain formula of unary op (../ew_formulas.h) as text, NULL if none. */
static const char *unary_formula(int op) {
#define NB_FORMULA_CASE_(S, ID, EXPR)                                                              \
  case NBI_OP_##ID: return #EXPR;
  switch (op) {
    EW_UNARY_FLOAT(NB_FORMULA_CASE_, cuda)
  default: return NULL;
  }
#undef NB_FORMULA_CASE_
}

/* Index of a float dtype among the epilogue variants, -1 for the others. */
static int dtype_index(nb_dtype dt) {
  switch (dt) {
  case NB_F32: return 0;
  case NB_F64: return 1;
  case NB_F16: return 2;
  case NB_BF16: return 3;
  default: return -1;
  }
}

/* The preamble followed by body (malloc'd; NULL when out of memory). */
static char *with_preamble(const char *body) {
  size_t pre = strlen(nbi_cuda_preamble), n = strlen(body);
  char *src = malloc(pre + n + 1);
  if (!src) return NULL;
  memcpy(src, nbi_cuda_preamble, pre);
  memcpy(src + pre, body, n + 1);
  return src;
}

/* Source of the epilogue pass for float dtype dt (dtype_index >= 0), activation
 * act_op (-1: none) and with_bias: the preamble, then the kernel (malloc'd; NULL
 * when out of memory). The storage type S is the dtype's, the compute type T float
 * (double for f64), as the unfused elementwise kernels compute. */
static char *epi_source(nb_dtype dt, int act_op, bool with_bias) {
  static const char *const storage[N_DTYPES] = {"float", "double", "unsigned short",
                                                "unsigned short"};
  static const char *const load[N_DTYPES] = {"(v)", "(v)", "nb_f16_to_f32(v)", "nb_bf16_to_f32(v)"};
  static const char *const store[N_DTYPES] = {"(v)", "(v)", "nb_f32_to_f16(v)",
                                              "nb_f32_to_bf16(v)"};
  static const char fmt[] =
      "\n#undef S\n#undef T\n#undef LD\n#undef ST\n#undef FN\n#undef VM\n"
      "#define S %s\n#define T %s\n#define LD(v) %s\n#define ST(v) %s\n%s\n%s\n"
      "/* The pass after the GEMM of an epilogue group, over its [rows, cols] output src\n"
      " * (contiguous, n = rows * cols elements): s = src[i] (+ bias[i %% cols], rounded\n"
      " * to the storage type as the unfused add is), sum[i] = s when sum is given,\n"
      " * act[i] = f(s) when act is given (f: the activation's formula, in T). In place\n"
      " * when sum or act is src. Grid-stride, one element per thread and step. */\n"
      "extern \"C\" __global__ void nb_gemm_epi(const S *src, const S *bias, S *sum, S *act,\n"
      "                                        int64_t n, int64_t cols) {\n"
      "  int64_t step = (int64_t)gridDim.x * blockDim.x;\n"
      "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {\n"
      "    S s = src[i];\n"
      "%s"
      "    if (sum) sum[i] = s;\n"
      "    if (act) {\n"
      "      T x = LD(s);\n"
      "      act[i] = ST((T)(%s));\n"
      "    }\n"
      "  }\n"
      "}\n";
  int d = dtype_index(dt);
  bool dbl = dt == NB_F64;
  const char *expr = act_op >= 0 ? unary_formula(act_op) : "x";
  const char *bias_line = with_bias ? "    s = ST((T)(LD(s) + LD(bias[i % cols])));\n" : "";
  const char *fn = dbl ? "#define FN(fn) fn" : "#define FN(fn) fn##f";
  const char *vm = dbl ? "#define VM(fn) dm_##fn" : "#define VM(fn) vm_##fn##f";
  const char *t = dbl ? "double" : "float";
  if (d < 0 || !expr) return NULL;
  int len = snprintf(NULL, 0, fmt, storage[d], t, load[d], store[d], fn, vm, bias_line, expr);
  char *body = len < 0 ? NULL : malloc((size_t)len + 1);
  if (!body) return NULL;
  snprintf(body, (size_t)len + 1, fmt, storage[d], t, load[d], store[d], fn, vm, bias_line, expr);
  char *src = with_preamble(body);
  free(body);
  return src;
}

/* Kernel functions looked up so far, per device table index and slot, with the
 * context they were loaded in. */
static struct {
  CUcontext ctx;
  CUfunction fn;
} slots[NBI_MAX_DEVICES][N_SLOTS];
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;

/* The function of slot `slot` on device c (for the epilogue slots: dtype dt,
 * activation act_op, bias): from the table, else through nbi_cuda_function (its
 * caches, else NVRTC). Errors recorded (compile errors: NVRTC's log). */
static nb_status kernel_get(nbi_cuda_ctx *c, int slot, nb_dtype dt, int act_op, bool bias,
                            CUfunction *fn) {
  if (c->table < 0 || c->table >= NBI_MAX_DEVICES)
    return nbi_error(NB_ERR_INTERNAL, "nb_matmul: CUDA device table index %d out of range",
                     c->table);
  pthread_mutex_lock(&slots_lock);
  nb_status st = NB_OK;
  if (slots[c->table][slot].fn && slots[c->table][slot].ctx == c->ctx) {
    *fn = slots[c->table][slot].fn;
  } else {
    const char *name = slot == SLOT_I64    ? "nb_matmul_i64"
                       : slot == SLOT_BOOL ? "nb_matmul_bool"
                                           : "nb_gemm_epi";
    char *src = slot < SLOT_EPI ? with_preamble(mm_int_src) : epi_source(dt, act_op, bias);
    st = src ? nbi_cuda_function(c, src, name, fn)
             : nbi_error(NB_ERR_OOM, "nb_matmul: out of memory building the source of %s", name);
    free(src);
    if (!st) slots[c->table][slot].ctx = c->ctx, slots[c->table][slot].fn = *fn;
  }
  pthread_mutex_unlock(&slots_lock);
  return st;
}

/* Blocks for a grid-stride launch over n elements. */
static unsigned grid_for(int64_t n) {
  int64_t g = (n + BLOCK - 1) / BLOCK;
  return (unsigned)(g < 1 ? 1 : g > MAX_GRID ? MAX_GRID : g);
}

/* cuda_be.h: the integer / bool product kernel over `batch` items, queued on c. */
nb_status nbi_cuda_int_gemm(nbi_cuda_ctx *c, bool is_bool, int64_t m, int64_t n, int64_t k,
                            int64_t batch, const void *a, int64_t sa, int64_t sar, int64_t sac,
                            const void *b, int64_t sb, int64_t sbr, int64_t sbc, void *cc,
                            int64_t sc) {
  if (m <= 0 || n <= 0 || batch <= 0) return NB_OK;
  CUfunction fn;
  nb_status st = kernel_get(c, is_bool ? SLOT_BOOL : SLOT_I64, NB_I64, -1, false, &fn);
  if (st) return st;
  CUdeviceptr pa = (CUdeviceptr)(uintptr_t)a, pb = (CUdeviceptr)(uintptr_t)b;
  CUdeviceptr pc = (CUdeviceptr)(uintptr_t)cc;
  void *args[] = {&pa, &pb, &pc, &m, &n, &k, &batch, &sa, &sar, &sac, &sb, &sbr, &sbc, &sc};
  return nbi_cuda_launch(c, fn, grid_for(batch * m * n), 1, BLOCK, 0, args);
}

/* cuda_be.h: the epilogue pass, queued on c (a NULL act writes no activation). */
nb_status nbi_cuda_gemm_epi_pass(nbi_cuda_ctx *c, nb_dtype dt, int act_op, const void *src,
                                 const void *bias, void *sum, void *act, int64_t n, int64_t cols) {
  int d = dtype_index(dt), ai = act_index(act ? act_op : -1);
  if (d < 0 || ai < 0)
    return nbi_error(NB_ERR_INTERNAL, "nb_matmul: no epilogue pass for %s and op %d",
                     nb_dtype_name(dt), act_op);
  if (n <= 0) return NB_OK;
  CUfunction fn;
  int slot = SLOT_EPI + (d * N_ACTS + ai) * 2 + (bias != NULL);
  nb_status st = kernel_get(c, slot, dt, acts[ai], bias != NULL, &fn);
  if (st) return st;
  CUdeviceptr p_src = (CUdeviceptr)(uintptr_t)src, p_bias = (CUdeviceptr)(uintptr_t)bias;
  CUdeviceptr p_sum = (CUdeviceptr)(uintptr_t)sum, p_act = (CUdeviceptr)(uintptr_t)act;
  void *args[] = {&p_src, &p_bias, &p_sum, &p_act, &n, &cols};
  return nbi_cuda_launch(c, fn, grid_for(n), 1, BLOCK, 0, args);
}
