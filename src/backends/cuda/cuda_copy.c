/* src/backends/cuda/cuda_copy.c — strided copies with dtype conversion, and fills.
 *
 * Conversions are the CPU's (src/backends/cpu/copy.c, src/core/dtype.c): one
 * dtype to itself moves bytes; between integers and bool through int64
 * (narrowing saturates, bool = != 0); otherwise through the value as a
 * double (f32 / f16 / bf16 sources through float, which is exact): floats
 * narrow by round to nearest even, f16 / bf16 from a double value by way of
 * the f32 nearest it by round-to-odd (so the result is the double rounded
 * once), float -> integer truncates toward zero and saturates (NaN -> 0),
 * -> bool is != 0 (NaN -> true). A fill stores value as nbi_store_f64 does.
 *
 * Both views are first coalesced (size-1 dims dropped, dims that are
 * contiguous in both merged; as nbi_iter_init). Then:
 *  - one dtype, both contiguous: cuMemcpyDtoDAsync;
 *  - contiguous, aligned: a kernel moving up to 16 bytes per load and store;
 *  - otherwise a kernel indexing every element through the dims, with 32-bit
 *    offsets and multiply-shift division when everything fits in 31 bits,
 *    64-bit arithmetic otherwise.
 * A fill of a contiguous view is a cuMemsetD8/D16/D32; others a kernel.
 * Kernels are CUDA C compiled by NVRTC: one module per dtype pair (per
 * element size for same-dtype copies and fills), functions remembered per
 * device so a copy costs no hashing. */
#include "cuda_be.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#define COPY_BLOCK 256u

/* The geometry every kernel takes by value: 8-byte fields only, so host and
 * device lay it out alike. Dims run outermost first; strides are in
 * elements. magic[d] packs the 32-bit path's divisor of dims[d]: multiplier
 * in the low half, shift in the high half. */
typedef struct copy_geom {
  uint64_t dst, src; /* device addresses */
  int64_t n;         /* elements */
  int64_t ndim;      /* 1..8 */
  int64_t dims[NB_MAX_DIMS];
  int64_t dstride[NB_MAX_DIMS], sstride[NB_MAX_DIMS];
  uint64_t magic[NB_MAX_DIMS];
  uint64_t pattern; /* fills: the element's bytes */
} copy_geom;

/* ---- kernel sources ----------------------------------------------------------------------------
 */
/* Shared by every module: the geometry, index helpers and the three copy
 * kernels over nb_convert (defined before this text, with nb_src_t,
 * nb_dst_t and NB_VEC). */
static const char copy_kernels[] =
    "struct nb_copy_geom {\n"
    "  unsigned long long dst, src;\n"
    "  long long n, ndim;\n"
    "  long long dims[8], dstride[8], sstride[8];\n"
    "  unsigned long long magic[8], pattern;\n"
    "};\n"
    "/* q = n / d for n < 2^31: magic = multiplier | shift << 32 (host: copy_magic) */\n"
    "__device__ __forceinline__ unsigned nb_copy_div(unsigned n, unsigned long long magic) {\n"
    "  return (__umulhi(n, (unsigned)magic) + n) >> (unsigned)(magic >> 32);\n"
    "}\n"
    "/* 32-bit offsets of element i (i < 2^31) in dst (*d) and src (*s) */\n"
    "__device__ __forceinline__ void nb_copy_offsets32(const nb_copy_geom &g, unsigned i,\n"
    "                                                  int *d, int *s) {\n"
    "  int od = 0, os = 0;\n"
    "#pragma unroll\n"
    "  for (int k = 7; k >= 1; k--) {\n"
    "    if (k < g.ndim) {\n"
    "      unsigned q = nb_copy_div(i, g.magic[k]);\n"
    "      int c = (int)(i - q * (unsigned)g.dims[k]);\n"
    "      od += c * (int)g.dstride[k];\n"
    "      os += c * (int)g.sstride[k];\n"
    "      i = q;\n"
    "    }\n"
    "  }\n"
    "  *d = od + (int)i * (int)g.dstride[0];\n"
    "  *s = os + (int)i * (int)g.sstride[0];\n"
    "}\n"
    "/* the same in 64 bits */\n"
    "__device__ __forceinline__ void nb_copy_offsets64(const nb_copy_geom &g, long long i,\n"
    "                                                  long long *d, long long *s) {\n"
    "  long long od = 0, os = 0;\n"
    "#pragma unroll\n"
    "  for (int k = 7; k >= 1; k--) {\n"
    "    if (k < g.ndim) {\n"
    "      long long q = i / g.dims[k], c = i - q * g.dims[k];\n"
    "      od += c * g.dstride[k];\n"
    "      os += c * g.sstride[k];\n"
    "      i = q;\n"
    "    }\n"
    "  }\n"
    "  *d = od + i * g.dstride[0];\n"
    "  *s = os + i * g.sstride[0];\n"
    "}\n"
    "#ifdef NB_COPY\n"
    "/* dst[d(i)] = convert(src[s(i)]) for i < g.n < 2^31, offsets d, s < 2^31 */\n"
    "extern \"C\" __global__ void nb_copy_i32(nb_copy_geom g) {\n"
    "  const nb_src_t *src = (const nb_src_t *)g.src;\n"
    "  nb_dst_t *dst = (nb_dst_t *)g.dst;\n"
    "  unsigned n = (unsigned)g.n, step = gridDim.x * blockDim.x;\n"
    "  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {\n"
    "    int d, s;\n"
    "    nb_copy_offsets32(g, i, &d, &s);\n"
    "    dst[d] = nb_convert(src[s]);\n"
    "  }\n"
    "}\n"
    "/* the same for any sizes */\n"
    "extern \"C\" __global__ void nb_copy_i64(nb_copy_geom g) {\n"
    "  const nb_src_t *src = (const nb_src_t *)g.src;\n"
    "  nb_dst_t *dst = (nb_dst_t *)g.dst;\n"
    "  long long step = (long long)gridDim.x * blockDim.x;\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += step) {\n"
    "    long long d, s;\n"
    "    nb_copy_offsets64(g, i, &d, &s);\n"
    "    dst[d] = nb_convert(src[s]);\n"
    "  }\n"
    "}\n"
    "/* contiguous dst[i] = convert(src[i]), i < g.n: NB_VEC elements per load and\n"
    " * store (src and dst aligned to them), then the g.n % NB_VEC last ones */\n"
    "struct __align__(sizeof(nb_src_t) * NB_VEC) nb_src_vec { nb_src_t v[NB_VEC]; };\n"
    "struct __align__(sizeof(nb_dst_t) * NB_VEC) nb_dst_vec { nb_dst_t v[NB_VEC]; };\n"
    "extern \"C\" __global__ void nb_copy_vec(nb_copy_geom g) {\n"
    "  const nb_src_vec *src = (const nb_src_vec *)g.src;\n"
    "  nb_dst_vec *dst = (nb_dst_vec *)g.dst;\n"
    "  long long nv = g.n / NB_VEC, step = (long long)gridDim.x * blockDim.x;\n"
    "  long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  for (long long i = first; i < nv; i += step) {\n"
    "    nb_src_vec a = src[i];\n"
    "    nb_dst_vec b;\n"
    "#pragma unroll\n"
    "    for (int k = 0; k < NB_VEC; k++) b.v[k] = nb_convert(a.v[k]);\n"
    "    dst[i] = b;\n"
    "  }\n"
    "  long long t = nv * NB_VEC + first;\n"
    "  if (t < g.n) ((nb_dst_t *)g.dst)[t] = nb_convert(((const nb_src_t *)g.src)[t]);\n"
    "}\n"
    "#else\n"
    "/* dst[d(i)] = the pattern's low bytes, i < g.n < 2^31, offsets < 2^31 */\n"
    "extern \"C\" __global__ void nb_fill_i32(nb_copy_geom g) {\n"
    "  nb_dst_t *dst = (nb_dst_t *)g.dst, v = (nb_dst_t)g.pattern;\n"
    "  unsigned n = (unsigned)g.n, step = gridDim.x * blockDim.x;\n"
    "  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {\n"
    "    int d, s;\n"
    "    nb_copy_offsets32(g, i, &d, &s);\n"
    "    dst[d] = v;\n"
    "  }\n"
    "}\n"
    "/* the same for any sizes */\n"
    "extern \"C\" __global__ void nb_fill_i64(nb_copy_geom g) {\n"
    "  nb_dst_t *dst = (nb_dst_t *)g.dst, v = (nb_dst_t)g.pattern;\n"
    "  long long step = (long long)gridDim.x * blockDim.x;\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += step) {\n"
    "    long long d, s;\n"
    "    nb_copy_offsets64(g, i, &d, &s);\n"
    "    dst[d] = v;\n"
    "  }\n"
    "}\n"
    "#endif\n";

/* f64 -> the f32 nearest by round-to-odd: truncated toward zero, last bit set
 * when inexact (NaN and infinities pass). Rounding it to f16 / bf16 equals
 * rounding the double once. */
static const char odd_helper[] =
    "__device__ __forceinline__ float nb_copy_f64_to_f32_odd(double x) {\n"
    "  float f = __double2float_rz(x);\n"
    "  if (f == f && (double)f != x) f = __uint_as_float(__float_as_uint(f) | 1u);\n"
    "  return f;\n"
    "}\n";

static const char *const storage_type[NB_DTYPE_COUNT] = {[NB_F32] = "float",
                                                         [NB_F64] = "double",
                                                         [NB_F16] = "unsigned short",
                                                         [NB_BF16] = "unsigned short",
                                                         [NB_I32] = "int",
                                                         [NB_I64] = "long long",
                                                         [NB_BOOL] = "unsigned char",
                                                         [NB_U8] = "unsigned char",
                                                         [NB_I8] = "signed char",
                                                         [NB_I16] = "short"};

/* The unsigned type of an element of es bytes (same-dtype copies, fills). */
static const char *raw_type(size_t es) {
  return es == 1   ? "unsigned char"
         : es == 2 ? "unsigned short"
         : es == 4 ? "unsigned int"
                   : "unsigned long long";
}

/* Whether dt's values go through float exactly (f32, f16, bf16). */
static bool via_float(nb_dtype dt) { return dt == NB_F32 || dt == NB_F16 || dt == NB_BF16; }

/* The expression reading v (of src's storage type) as the conversion's
 * intermediate: long long for integer pairs, float or double otherwise. */
static const char *load_expr(nb_dtype s, bool ints, bool flt) {
  if (ints) return s == NB_BOOL ? "(long long)(v != 0)" : "(long long)v";
  switch (s) {
  case NB_F16: return "nb_f16_to_f32(v)";
  case NB_BF16: return "nb_bf16_to_f32(v)";
  case NB_BOOL: return flt ? "(v != 0 ? 1.0f : 0.0f)" : "(v != 0 ? 1.0 : 0.0)";
  case NB_F32: return "v";
  default: return "(double)v"; /* f64, i32, i64: as nbi_load_f64 */
  }
}

/* The expression storing x (the intermediate) as d. */
static const char *store_expr(nb_dtype d, bool ints, bool flt) {
  if (ints) {
    switch (d) {
    case NB_I32:
      return "(int)(x > 2147483647LL ? 2147483647LL : x < -2147483648LL ? -2147483648LL : x)";
    case NB_I64: return "x";
    /* u8, i8, i16 wrap, as the CPU's stores */
    case NB_U8: return "(unsigned char)(unsigned long long)x";
    case NB_I8: return "(signed char)(unsigned char)(unsigned long long)x";
    case NB_I16: return "(short)(unsigned short)(unsigned long long)x";
    default: return "(unsigned char)(x != 0)";
    }
  }
  switch (d) {
  case NB_F32: return flt ? "x" : "(float)x";
  case NB_F64: return "(double)x";
  case NB_F16: return flt ? "nb_f32_to_f16(x)" : "nb_f32_to_f16(nb_copy_f64_to_f32_odd(x))";
  case NB_BF16: return flt ? "nb_f32_to_bf16(x)" : "nb_f32_to_bf16(nb_copy_f64_to_f32_odd(x))";
  case NB_I32: return "nb_sat_i32((double)x)";
  case NB_I64: return "nb_sat_i64((double)x)";
  case NB_U8: return "(unsigned char)(unsigned long long)nb_sat_i64((double)x)";
  case NB_I8: return "(signed char)(unsigned char)(unsigned long long)nb_sat_i64((double)x)";
  case NB_I16: return "(short)(unsigned short)(unsigned long long)nb_sat_i64((double)x)";
  default: return "(unsigned char)(x != 0)";
  }
}

/* Appends text to a growing malloc'd buffer; false when out of memory. */
typedef struct sbuf {
  char *p;
  size_t n, cap;
} sbuf;

/* Appends text (NUL kept at the end); false when out of memory. */
static bool sb_add(sbuf *b, const char *text) {
  size_t k = strlen(text);
  if (b->n + k + 1 > b->cap) {
    size_t cap = (b->n + k + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, text, k + 1);
  b->n += k;
  return true;
}

/* The module source converting s to d (s == d: raw moves of es bytes), or
 * filling elements of es bytes (fill); malloc'd, NULL when out of memory. */
static char *module_source(bool fill, nb_dtype s, nb_dtype d, size_t es) {
  char head[640];
  if (fill) {
    snprintf(head, sizeof head, "typedef %s nb_dst_t;\n", raw_type(es));
  } else if (s == d) {
    snprintf(head, sizeof head,
             "#define NB_COPY 1\n#define NB_VEC %d\ntypedef %s nb_src_t;\ntypedef %s nb_dst_t;\n"
             "__device__ __forceinline__ nb_dst_t nb_convert(nb_src_t v) { return v; }\n",
             (int)(16 / es), raw_type(es), raw_type(es));
  } else {
    bool ints = !nb_dtype_is_float(s) && !nb_dtype_is_float(d);
    bool flt = !ints && (via_float(s) || s == NB_BOOL) && d != NB_F64;
    size_t big = nb_dtype_size(s) > nb_dtype_size(d) ? nb_dtype_size(s) : nb_dtype_size(d);
    snprintf(head, sizeof head,
             "#define NB_COPY 1\n#define NB_VEC %d\ntypedef %s nb_src_t;\ntypedef %s nb_dst_t;\n"
             "/* %s -> %s */\n"
             "__device__ __forceinline__ nb_dst_t nb_convert(nb_src_t v) {\n"
             "  %s x = %s;\n  return %s;\n}\n",
             (int)(16 / big), storage_type[s], storage_type[d], nb_dtype_name(s), nb_dtype_name(d),
             ints  ? "long long"
             : flt ? "float"
                   : "double",
             load_expr(s, ints, flt), store_expr(d, ints, flt));
  }
  sbuf b = {NULL, 0, 0};
  if (sb_add(&b, nbi_cuda_preamble) && sb_add(&b, "\n") && sb_add(&b, odd_helper) &&
      sb_add(&b, head) && sb_add(&b, copy_kernels))
    return b.p;
  free(b.p);
  return NULL;
}

/* See cuda_be.h; NULL for an invalid dtype or out of memory. */
char *nbi_cuda_copy_source(bool fill, nb_dtype src, nb_dtype dst) {
  if (!nbi_dtype_valid(src) || !nbi_dtype_valid(dst)) return NULL;
  return module_source(fill, src, dst, nb_dtype_size(dst));
}

/* ---- modules and functions
 * ------------------------------------------------------------------------ */
/* Module slots: converting pairs [s][d] (s != d), raw copies by size, fills
 * by size. Sources are built once; functions are remembered per device. */
#define N_PAIR (NB_DTYPE_COUNT * NB_DTYPE_COUNT)
#define SLOT_RAW N_PAIR
#define SLOT_FILL (N_PAIR + 4)
#define N_SLOTS (N_PAIR + 8)
enum { K_I32, K_I64, K_VEC, N_KERNELS };
static const char *const kernel_name[2][N_KERNELS] = {{"nb_copy_i32", "nb_copy_i64", "nb_copy_vec"},
                                                      {"nb_fill_i32", "nb_fill_i64", NULL}};

static pthread_mutex_t source_lock = PTHREAD_MUTEX_INITIALIZER;
static char *sources[N_SLOTS];
static _Atomic(CUfunction) functions[NBI_MAX_DEVICES][N_SLOTS][N_KERNELS];

/* Slot offset of an element size (1, 2, 4, 8 bytes). */
static int size_index(size_t es) { return es == 1 ? 0 : es == 2 ? 1 : es == 4 ? 2 : 3; }

/* Kernel k of module slot on c (fill: a fill module). */
static nb_status get_kernel(nbi_cuda_ctx *c, int slot, int k, bool fill, nb_dtype s, nb_dtype d,
                            size_t es, CUfunction *fn) {
  bool cached = c->index >= 0 && c->index < NBI_MAX_DEVICES;
  if (cached && (*fn = atomic_load(&functions[c->index][slot][k]))) return NB_OK;
  pthread_mutex_lock(&source_lock);
  if (!sources[slot]) sources[slot] = module_source(fill, s, d, es);
  const char *src = sources[slot];
  pthread_mutex_unlock(&source_lock);
  if (!src) return nbi_error(NB_ERR_OOM, "nabla: out of host memory for a copy kernel");
  nb_status st = nbi_cuda_function(c, src, kernel_name[fill][k], fn);
  if (st == NB_OK && cached) atomic_store(&functions[c->index][slot][k], *fn);
  return st;
}

/* ---- geometry
 * ------------------------------------------------------------------------------------ */
/* Multiply-shift divisor of d (1 <= d < 2^31): q = (umulhi(n, m) + n) >> s
 * for every n < 2^31, with s = ceil(log2 d), m = 2^32 (2^s - d) / d + 1. */
static uint64_t copy_magic(uint64_t d) {
  unsigned s = 0;
  while (((uint64_t)1 << s) < d)
    s++;
  uint64_t m = (((uint64_t)1 << 32) * (((uint64_t)1 << s) - d)) / d + 1;
  return (m & 0xffffffffu) | (uint64_t)s << 32;
}

/* Coalesces dst (and src, when given) into g: size-1 dims dropped, a dim
 * merged into the one outside it when both views are contiguous across them. */
static void coalesce(const nbi_view *dst, const nbi_view *src, copy_geom *g) {
  int nd = 0;
  g->n = 1;
  for (int d = 0; d < dst->ndim; d++) {
    int64_t n = dst->dims[d];
    g->n *= n;
    if (n == 1) continue;
    int64_t ss = src ? src->strides[d] : 0;
    if (nd > 0 && g->dstride[nd - 1] == dst->strides[d] * n && g->sstride[nd - 1] == ss * n) {
      g->dims[nd - 1] *= n;
      g->dstride[nd - 1] = dst->strides[d];
      g->sstride[nd - 1] = ss;
      continue;
    }
    g->dims[nd] = n;
    g->dstride[nd] = dst->strides[d];
    g->sstride[nd] = ss;
    nd++;
  }
  if (nd == 0) { /* 0-d or all dims 1: one element */
    g->dims[0] = 1;
    g->dstride[0] = g->sstride[0] = 1;
    nd = 1;
  }
  g->ndim = nd;
}

/* Whether every offset of g fits the 32-bit kernels. */
static bool fits32(const copy_geom *g) {
  const int64_t lim = ((int64_t)1 << 31) - 1;
  if (g->n > lim) return false;
  int64_t d = 0, s = 0;
  for (int k = 0; k < g->ndim; k++) {
    d += (g->dstride[k] < 0 ? -g->dstride[k] : g->dstride[k]) * (g->dims[k] - 1);
    s += (g->sstride[k] < 0 ? -g->sstride[k] : g->sstride[k]) * (g->dims[k] - 1);
    if (d > lim || s > lim) return false;
  }
  return true;
}

/* Launches kernel fn over g's elements (or vectors) on c. */
static nb_status launch(nbi_cuda_ctx *c, CUfunction fn, copy_geom *g, int64_t items) {
  int64_t blocks = (items + COPY_BLOCK - 1) / COPY_BLOCK;
  int64_t cap = (int64_t)(c->sm_count > 0 ? c->sm_count : 1) * 16;
  void *args[] = {g};
  return nbi_cuda_launch(c, fn, (unsigned)(blocks < cap ? blocks : cap), 1, COPY_BLOCK, 0, args);
}

/* Checks a view the backend was given: dtype, rank, dims. */
static nb_status check_view(const char *what, const nbi_view *v) {
  if (!v || !nbi_dtype_valid(v->dtype) || v->ndim < 0 || v->ndim > NB_MAX_DIMS)
    return nbi_error(NB_ERR_INTERNAL, "nabla: CUDA %s: bad view", what);
  for (int d = 0; d < v->ndim; d++)
    if (v->dims[d] < 0) return nbi_error(NB_ERR_INTERNAL, "nabla: CUDA %s: bad view", what);
  return NB_OK;
}

/* ---- copy and fill
 * ---------------------------------------------------------------------------------- */
/* dst = src converted (views on c, same dims): DtoD when both are contiguous
 * in one dtype, else the vector kernel when contiguous and aligned, else the
 * 32-bit or 64-bit strided kernel. */
nb_status nbi_cuda_copy(nbi_cuda_ctx *c, nbi_view *dst, const nbi_view *src) {
  nb_status st = check_view("copy", dst);
  if (st == NB_OK) st = check_view("copy", src);
  if (st != NB_OK) return st;
  bool same_dims = dst->ndim == src->ndim;
  for (int d = 0; same_dims && d < dst->ndim; d++)
    same_dims = dst->dims[d] == src->dims[d];
  if (!same_dims) return nbi_error(NB_ERR_INTERNAL, "nabla: CUDA copy: views differ in shape");
  copy_geom g = {.dst = (uint64_t)(uintptr_t)dst->data, .src = (uint64_t)(uintptr_t)src->data};
  coalesce(dst, src, &g);
  if (g.n == 0) return NB_OK;
  size_t des = nb_dtype_size(dst->dtype), ses = nb_dtype_size(src->dtype);
  bool same = dst->dtype == src->dtype;
  bool contiguous = g.ndim == 1 && g.dstride[0] == 1 && g.sstride[0] == 1;
  if (same && contiguous)
    return nbi_cu_check(nbi_cu.cuMemcpyDtoDAsync(g.dst, g.src, (size_t)g.n * des, c->stream),
                        "nabla: cuMemcpyDtoDAsync");
  int slot = same ? SLOT_RAW + size_index(des) : (int)src->dtype * NB_DTYPE_COUNT + (int)dst->dtype;
  size_t vec = 16 / (des > ses ? des : ses);
  CUfunction fn;
  if (contiguous && g.src % (vec * ses) == 0 && g.dst % (vec * des) == 0) {
    st = get_kernel(c, slot, K_VEC, false, src->dtype, dst->dtype, des, &fn);
    return st != NB_OK ? st : launch(c, fn, &g, g.n / (int64_t)vec + 1);
  }
  bool narrow = fits32(&g);
  for (int k = 0; narrow && k < g.ndim; k++)
    g.magic[k] = copy_magic((uint64_t)g.dims[k]);
  st = get_kernel(c, slot, narrow ? K_I32 : K_I64, false, src->dtype, dst->dtype, des, &fn);
  return st != NB_OK ? st : launch(c, fn, &g, g.n);
}

/* Every element of dst (on c) = value stored as nbi_store_f64 does: memset
 * for contiguous views, else a kernel storing the element's bytes. */
nb_status nbi_cuda_fill(nbi_cuda_ctx *c, nbi_view *dst, double value) {
  nb_status st = check_view("fill", dst);
  if (st != NB_OK) return st;
  copy_geom g = {.dst = (uint64_t)(uintptr_t)dst->data};
  coalesce(dst, NULL, &g);
  if (g.n == 0) return NB_OK;
  size_t es = nb_dtype_size(dst->dtype);
  unsigned char one[8] = {0};
  nbi_store_f64(one, dst->dtype, 0, value);
  uint64_t pattern = 0;
  memcpy(&pattern, one, es);
  if (g.ndim == 1 && g.dstride[0] == 1 && g.dst % es == 0) {
    size_t n = (size_t)g.n;
    uint32_t lo = (uint32_t)pattern, hi = (uint32_t)(pattern >> 32);
    CUresult r = CUDA_SUCCESS;
    bool done = true;
    if (es == 1)
      r = nbi_cu.cuMemsetD8Async(g.dst, (unsigned char)pattern, n, c->stream);
    else if (es == 2)
      r = nbi_cu.cuMemsetD16Async(g.dst, (unsigned short)pattern, n, c->stream);
    else if (es == 4)
      r = nbi_cu.cuMemsetD32Async(g.dst, lo, n, c->stream);
    else if (lo == hi)
      r = nbi_cu.cuMemsetD32Async(g.dst, lo, 2 * n, c->stream);
    else
      done = false;
    if (done) return nbi_cu_check(r, "nabla: cuMemset");
  }
  g.pattern = pattern;
  bool narrow = fits32(&g);
  for (int k = 0; narrow && k < g.ndim; k++)
    g.magic[k] = copy_magic((uint64_t)g.dims[k]);
  CUfunction fn;
  st = get_kernel(c, SLOT_FILL + size_index(es), narrow ? K_I32 : K_I64, true, dst->dtype,
                  dst->dtype, es, &fn);
  return st != NB_OK ? st : launch(c, fn, &g, g.n);
}
