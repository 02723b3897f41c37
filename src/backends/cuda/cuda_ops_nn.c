/* src/backends/cuda/cuda_ops_nn.c — CUDA kernels of the NN primitives (NCHW),
 * with the CPU kernels' semantics (../cpu/k_nn.c): CONV2D, CONV2D_BWD_DATA,
 * CONV2D_BWD_FILTER, MAX_POOL2D, MAX_POOL2D_BWD, MAX_POOL2D_SELECT.
 *
 * Operands are first staged as contiguous arrays of the compute type (f64 for
 * f64 results, else f32: f16 / bf16 compute in f32 and round once at the end).
 * Convolution is im2col + nbi_cuda_gemm (cuBLASLt), a chunk of images at a
 * time (its column matrices near 256 MiB), each GEMM batched over
 * the chunk's images (or over groups, when there are more groups than images);
 * a 1x1 kernel with stride 1 and no padding reads the image in place. The data
 * gradient is GEMM + col2im written as a gather (every pixel sums its entries
 * in a fixed order: no atomics, deterministic). The filter gradient puts a
 * chunk's columns side by side so one GEMM sums over its images; chunks' partial
 * results are added in order. Max pooling compares in the compute type (exact
 * for every float dtype); its derivative ops first find each window's maximum
 * (the forward's rule: first on ties, a NaN before any number), then gather:
 * the scatter of MAX_POOL2D_BWD is written as a gather over the windows that
 * cover each pixel, in the CPU's order. */
#include "cuda_be.h"

#include "../../ops/nn.h" /* the nodes' attribute slots: NBI_CONV_*, NBI_POOL_* */

#include <stdint.h>
#include <stdlib.h>

/* ---- kernel source ------------------------------------------------------------------------- */
/* clang-format off */
#define NN_SOURCE \
    "/* Geometry of a convolution or pooling window, in elements (the host's\n" \
    " * conv_geom): c counts every channel of the image (all groups). */\n" \
    "struct nbx_conv_geom {\n" \
    "  int64_t c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;\n" \
    "};\n" \
    "\n" \
    "#define NBX_GRID_LOOP(i, n)                                          \\\n" \
    "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  \\\n" \
    "       i < (n); i += (int64_t)gridDim.x * blockDim.x)\n" \
    "\n" \
    "/* im2col: img is (nimg, C, H, W) contiguous; col gets image i's C*KH*KW rows\n" \
    " * of P = OH*OW columns at col + i * step, rows ld apart:\n" \
    " * col[i][(c*KH + kh)*KW + kw][oh*OW + ow] =\n" \
    " *   img[i, c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw], 0 outside the image. */\n" \
    "template <typename T>\n" \
    "__device__ void nbx_im2col_body(const T *img, T *col, nbx_conv_geom g, int64_t nimg,\n" \
    "                               int64_t ld, int64_t step) {\n" \
    "  int64_t P = g.oh * g.ow, R = g.c * g.kh * g.kw;\n" \
    "  NBX_GRID_LOOP(e, nimg * R * P) {\n" \
    "    int64_t p = e % P, r = e / P % R, i = e / P / R;\n" \
    "    int64_t kw = r % g.kw, kh = r / g.kw % g.kh, ch = r / g.kw / g.kh;\n" \
    "    int64_t ih = p / g.ow * g.sh - g.ph + kh * g.dh;\n" \
    "    int64_t iw = p % g.ow * g.sw - g.pw + kw * g.dw;\n" \
    "    T v = 0;\n" \
    "    if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)\n" \
    "      v = img[((i * g.c + ch) * g.h + ih) * g.w + iw];\n" \
    "    col[i * step + r * ld + p] = v;\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* col2im (the transpose, as a gather): col as im2col lays it out; img is\n" \
    " * (nimg, C, H, W) contiguous; each pixel gets the sum, in (kh, kw) order, of\n" \
    " * the col entries im2col read from it (0 when none): deterministic. */\n" \
    "template <typename T>\n" \
    "__device__ void nbx_col2im_body(const T *col, T *img, nbx_conv_geom g, int64_t nimg,\n" \
    "                               int64_t ld, int64_t step) {\n" \
    "  NBX_GRID_LOOP(e, nimg * g.c * g.h * g.w) {\n" \
    "    int64_t x = e % g.w, y = e / g.w % g.h, ch = e / g.w / g.h % g.c;\n" \
    "    int64_t i = e / g.w / g.h / g.c;\n" \
    "    const T *src = col + i * step;\n" \
    "    T s = 0;\n" \
    "    for (int64_t kh = 0; kh < g.kh; kh++) {\n" \
    "      int64_t ny = y + g.ph - kh * g.dh;\n" \
    "      if (ny < 0 || ny % g.sh != 0 || ny / g.sh >= g.oh) continue;\n" \
    "      for (int64_t kw = 0; kw < g.kw; kw++) {\n" \
    "        int64_t nx = x + g.pw - kw * g.dw;\n" \
    "        if (nx < 0 || nx % g.sw != 0 || nx / g.sw >= g.ow) continue;\n" \
    "        int64_t r = (ch * g.kh + kh) * g.kw + kw;\n" \
    "        s += src[r * ld + ny / g.sh * g.ow + nx / g.sw];\n" \
    "      }\n" \
    "    }\n" \
    "    img[e] = s;\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* y (N, O, P) contiguous, total = N*O*P elements: y[n, o, p] += bias[o]. */\n" \
    "template <typename T>\n" \
    "__device__ void nbx_bias_body(T *y, const T *bias, int64_t O, int64_t P, int64_t total) {\n" \
    "  NBX_GRID_LOOP(e, total) y[e] += bias[e / P % O];\n" \
    "}\n" \
    "\n" \
    "/* dst[e] = parts[0][e] + parts[1][e] + ... (chunks arrays of n elements\n" \
    " * back to back), summed in chunk order. */\n" \
    "template <typename T>\n" \
    "__device__ void nbx_chunk_sum_body(T *dst, const T *parts, int64_t n, int64_t chunks) {\n" \
    "  NBX_GRID_LOOP(e, n) {\n" \
    "    T s = parts[e];\n" \
    "    for (int64_t k = 1; k < chunks; k++) s += parts[k * n + e];\n" \
    "    dst[e] = s;\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* The window of output (oh, ow): rows [*hs, *he) and columns [*ws, *we) of the\n" \
    " * image, clipped to it. */\n" \
    "__device__ __forceinline__ void nbx_window(const nbx_conv_geom &g, int64_t oh, int64_t ow,\n" \
    "                                          int64_t *hs, int64_t *he, int64_t *ws,\n" \
    "                                          int64_t *we) {\n" \
    "  int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;\n" \
    "  *hs = h0 < 0 ? 0 : h0;\n" \
    "  *he = h0 + g.kh < g.h ? h0 + g.kh : g.h;\n" \
    "  *ws = w0 < 0 ? 0 : w0;\n" \
    "  *we = w0 + g.kw < g.w ? w0 + g.kw : g.w;\n" \
    "}\n" \
    "\n" \
    "/* max pooling: x is (planes, H, W), y (planes, OH, OW), contiguous, total =\n" \
    " * planes*OH*OW: the max of each window's in-image elements in row-major order,\n" \
    " * a NaN winning (v > m || v != v: the CPU's rule); -inf for none. */\n" \
    "template <typename T>\n" \
    "__device__ void nbx_pool_max_body(const T *x, T *y, nbx_conv_geom g, int64_t total) {\n" \
    "  NBX_GRID_LOOP(e, total) {\n" \
    "    int64_t hs, he, ws, we;\n" \
    "    nbx_window(g, e / g.ow % g.oh, e % g.ow, &hs, &he, &ws, &we);\n" \
    "    const T *plane = x + e / g.ow / g.oh * g.h * g.w;\n" \
    "    T m = -(T)NB_INF;\n" \
    "    for (int64_t h = hs; h < he; h++)\n" \
    "      for (int64_t w = ws; w < we; w++) {\n" \
    "        T v = plane[h * g.w + w];\n" \
    "        m = (v > m || v != v) ? v : m;\n" \
    "      }\n" \
    "    y[e] = m;\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* idx (planes, OH, OW) int64 = the in-plane offset h*W + w of each window's\n" \
    " * first maximum of x (row-major window order), the first NaN beating every\n" \
    " * number; -1 for a window with no in-image element. */\n" \
    "template <typename T>\n" \
    "__device__ void nbx_pool_argmax_body(const T *x, int64_t *idx, nbx_conv_geom g,\n" \
    "                                    int64_t total) {\n" \
    "  NBX_GRID_LOOP(e, total) {\n" \
    "    int64_t hs, he, ws, we, best = -1;\n" \
    "    nbx_window(g, e / g.ow % g.oh, e % g.ow, &hs, &he, &ws, &we);\n" \
    "    const T *plane = x + e / g.ow / g.oh * g.h * g.w;\n" \
    "    T m = 0;\n" \
    "    for (int64_t h = hs; h < he; h++)\n" \
    "      for (int64_t w = ws; w < we; w++) {\n" \
    "        T v = plane[h * g.w + w];\n" \
    "        if (best < 0 || v > m || (v != v && m == m)) {\n" \
    "          m = v;\n" \
    "          best = h * g.w + w;\n" \
    "        }\n" \
    "      }\n" \
    "    idx[e] = best;\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* max_pool2d_bwd as a gather: dx (planes, H, W) contiguous; each pixel sums,\n" \
    " * in row-major order of the windows covering it, the dy (planes, OH, OW) of\n" \
    " * those whose maximum idx is this pixel (the CPU's order); 0 for none. */\n" \
    "template <typename T>\n" \
    "__device__ void nbx_pool_bwd_body(const int64_t *idx, const T *dy, T *dx, nbx_conv_geom g,\n" \
    "                                 int64_t total) {\n" \
    "  NBX_GRID_LOOP(e, total) {\n" \
    "    int64_t x = e % g.w, y = e / g.w % g.h, pl = e / g.w / g.h, off = y * g.w + x;\n" \
    "    int64_t a = y + g.ph - g.kh + 1, b = x + g.pw - g.kw + 1;\n" \
    "    int64_t oh0 = a <= 0 ? 0 : (a + g.sh - 1) / g.sh;\n" \
    "    int64_t ow0 = b <= 0 ? 0 : (b + g.sw - 1) / g.sw;\n" \
    "    int64_t oh1 = (y + g.ph) / g.sh, ow1 = (x + g.pw) / g.sw;\n" \
    "    oh1 = oh1 < g.oh - 1 ? oh1 : g.oh - 1;\n" \
    "    ow1 = ow1 < g.ow - 1 ? ow1 : g.ow - 1;\n" \
    "    T s = 0;\n" \
    "    for (int64_t oh = oh0; oh <= oh1; oh++)\n" \
    "      for (int64_t ow = ow0; ow <= ow1; ow++) {\n" \
    "        int64_t o = (pl * g.oh + oh) * g.ow + ow;\n" \
    "        if (idx[o] == off) s += dy[o];\n" \
    "      }\n" \
    "    dx[e] = s;\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* max_pool2d_select: y (planes, OH, OW) = src (planes, H, W) at each window's\n" \
    " * maximum idx (0 where idx is -1). */\n" \
    "template <typename T>\n" \
    "__device__ void nbx_pool_select_body(const int64_t *idx, const T *src, T *y,\n" \
    "                                    nbx_conv_geom g, int64_t total) {\n" \
    "  NBX_GRID_LOOP(e, total) {\n" \
    "    int64_t i = idx[e];\n" \
    "    y[e] = i >= 0 ? src[e / g.ow / g.oh * g.h * g.w + i] : (T)0;\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* Entry points per compute type. */\n" \
    "#define NBX_NN_KERNELS(S, T)                                                     \\\n" \
    "  extern \"C\" __global__ void nbx_im2col_##S(const T *img, T *col, nbx_conv_geom g, \\\n" \
    "                                           int64_t nimg, int64_t ld,            \\\n" \
    "                                           int64_t step) {                      \\\n" \
    "    nbx_im2col_body(img, col, g, nimg, ld, step);                                \\\n" \
    "  }                                                                             \\\n" \
    "  extern \"C\" __global__ void nbx_col2im_##S(const T *col, T *img, nbx_conv_geom g, \\\n" \
    "                                           int64_t nimg, int64_t ld,            \\\n" \
    "                                           int64_t step) {                      \\\n" \
    "    nbx_col2im_body(col, img, g, nimg, ld, step);                                \\\n" \
    "  }                                                                             \\\n" \
    "  extern \"C\" __global__ void nbx_bias_##S(T *y, const T *bias, int64_t O,        \\\n" \
    "                                         int64_t P, int64_t total) {            \\\n" \
    "    nbx_bias_body(y, bias, O, P, total);                                         \\\n" \
    "  }                                                                             \\\n" \
    "  extern \"C\" __global__ void nbx_chunk_sum_##S(T *dst, const T *parts, int64_t n, \\\n" \
    "                                              int64_t chunks) {                 \\\n" \
    "    nbx_chunk_sum_body(dst, parts, n, chunks);                                   \\\n" \
    "  }                                                                             \\\n" \
    "  extern \"C\" __global__ void nbx_pool_max_##S(const T *x, T *y, nbx_conv_geom g,  \\\n" \
    "                                             int64_t total) {                   \\\n" \
    "    nbx_pool_max_body(x, y, g, total);                                           \\\n" \
    "  }                                                                             \\\n" \
    "  extern \"C\" __global__ void nbx_pool_argmax_##S(const T *x, int64_t *idx,       \\\n" \
    "                                                nbx_conv_geom g, int64_t total) { \\\n" \
    "    nbx_pool_argmax_body(x, idx, g, total);                                      \\\n" \
    "  }                                                                             \\\n" \
    "  extern \"C\" __global__ void nbx_pool_bwd_##S(const int64_t *idx, const T *dy,   \\\n" \
    "                                             T *dx, nbx_conv_geom g,             \\\n" \
    "                                             int64_t total) {                   \\\n" \
    "    nbx_pool_bwd_body(idx, dy, dx, g, total);                                    \\\n" \
    "  }                                                                             \\\n" \
    "  extern \"C\" __global__ void nbx_pool_select_##S(const int64_t *idx, const T *src, \\\n" \
    "                                                T *y, nbx_conv_geom g,           \\\n" \
    "                                                int64_t total) {                \\\n" \
    "    nbx_pool_select_body(idx, src, y, g, total);                                 \\\n" \
    "  }\n" \
    "NBX_NN_KERNELS(f32, float)\n" \
    "NBX_NN_KERNELS(f64, double)\n"
/* clang-format on */

/* ---- host side ------------------------------------------------------------------------------ */

/* The host image of nb_conv_geom (int64 fields only: the layouts match). c is
 * every channel of the image (all groups). */
typedef struct conv_geom {
  int64_t c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow;
} conv_geom;

/* Kernels, K_PER_TYPE per compute type, f32 first. */
static const char *const nn_names[] = {
#define NN_NAMES(S)                                                                                \
  "nbx_im2col_" S, "nbx_col2im_" S, "nbx_bias_" S, "nbx_chunk_sum_" S, "nbx_pool_max_" S,          \
      "nbx_pool_argmax_" S, "nbx_pool_bwd_" S, "nbx_pool_select_" S,
    NN_NAMES("f32") NN_NAMES("f64")
#undef NN_NAMES
};
enum {
  K_IM2COL,
  K_COL2IM,
  K_BIAS,
  K_CHUNK_SUM,
  K_POOL_MAX,
  K_POOL_ARGMAX,
  K_POOL_BWD,
  K_POOL_SELECT,
  K_PER_TYPE /* kernels per compute type */
};
_Static_assert(sizeof nn_names / sizeof nn_names[0] == 2 * K_PER_TYPE,
               "K_PER_TYPE kernels for f32, then for f64");
static nbi_cuda_module nn_module = {
    .body = NN_SOURCE,
    .names = nn_names,
    .n_names = (int)(sizeof nn_names / sizeof nn_names[0]),
};

int nbi_cuda_nn_modules(int op, nbi_cuda_module **m) {
  (void)op;
  m[0] = &nn_module;
  return 1;
}

/* Bytes of column matrix a convolution builds at once (at least one image's):
 * 256 MiB, or NABLA_CUDA_COL_BYTES when set (tests make it small to run many
 * chunks). */
static size_t col_bytes(void) {
  const char *e = getenv("NABLA_CUDA_COL_BYTES");
  char *end = NULL;
  unsigned long long v = e ? strtoull(e, &end, 10) : 0;
  return v > 0 && *end == '\0' ? (size_t)v : (size_t)256 << 20;
}

/* A device address as a kernel argument, and back (views hold char *). */
static CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }
static char *hptr(CUdeviceptr p) { return (char *)(uintptr_t)p; }

/* Kernel k of the compute type dt (f32 / f64). */
static nb_status nn_fn(nbi_cuda_ctx *c, int k, nb_dtype dt, CUfunction *f) {
  return nbi_cuda_module_fn(c, &nn_module, k + (dt == NB_F64 ? K_PER_TYPE : 0), f);
}

/* Launches kernel k of dt over n items with args. */
static nb_status nn_launch(nbi_cuda_ctx *c, int k, nb_dtype dt, int64_t n, void **args) {
  if (n <= 0) return NB_OK;
  CUfunction f;
  nb_status st = nn_fn(c, k, dt, &f);
  return st ? st : nbi_cuda_launch_n(c, f, n, args);
}

/* A contiguous view of dtype dt and dims d[0..nd) at p. */
static nbi_view contig_view(char *p, nb_dtype dt, int nd, const int64_t *d) {
  nbi_view v = {.data = p, .dtype = dt, .ndim = nd};
  int64_t st = 1;
  for (int k = nd - 1; k >= 0; k--) {
    v.dims[k] = d[k];
    v.strides[k] = st;
    st *= d[k] > 0 ? d[k] : 1;
  }
  return v;
}

/* Staged operands and scratch of one kernel: every block in own[] is freed by
 * nn_end (stream-ordered, so right after the last launch is queued). */
typedef struct nn_run {
  nbi_cuda_ctx *c;
  CUdeviceptr own[8];
  int n_own;
} nn_run;

/* Scratch of n elements of dt, owned by r; NULL on failure (recorded). */
static char *nn_scratch(nn_run *r, int64_t n, nb_dtype dt) {
  if (r->n_own == (int)(sizeof r->own / sizeof r->own[0])) {
    nbi_error(NB_ERR_INTERNAL, "nabla: a CUDA NN kernel asked for too many scratch blocks");
    return NULL;
  }
  CUdeviceptr p = nbi_cuda_scratch(r->c, (size_t)n * nb_dtype_size(dt));
  if (p) r->own[r->n_own++] = p;
  return hptr(p);
}

/* v as a contiguous array of dt (staged into scratch owned by r when it is not
 * one already); NULL on failure. */
static char *nn_stage(nn_run *r, const nbi_view *v, nb_dtype dt) {
  if (r->n_own == (int)(sizeof r->own / sizeof r->own[0])) {
    nbi_error(NB_ERR_INTERNAL, "nabla: a CUDA NN kernel asked for too many scratch blocks");
    return NULL;
  }
  CUdeviceptr own;
  char *p = nbi_cuda_contig(r->c, v, dt, &own);
  if (own) r->own[r->n_own++] = own;
  return p;
}

/* Where a kernel computes out: out itself when its dtype is the compute dtype,
 * else scratch (nn_end converts it into out). NULL on failure. */
static char *nn_result(nn_run *r, const nbi_view *out, nb_dtype dt) {
  if (out->dtype == dt) return out->data;
  return nn_scratch(r, nbi_cuda_view_numel(out), dt);
}

/* Ends a kernel that computed into res (dtype dt): converts res into out when
 * it is scratch (st == NB_OK), frees r's blocks; returns the first failure. */
static nb_status nn_end(nn_run *r, nb_status st, nbi_view *out, char *res, nb_dtype dt) {
  if (st == NB_OK && res && res != out->data) {
    nbi_view src = contig_view(res, dt, out->ndim, out->dims);
    st = nbi_cuda_copy(r->c, out, &src);
  }
  for (int k = 0; k < r->n_own; k++)
    nbi_cuda_free_block(r->c->alloc, r->own[k]);
  return st;
}

/* The compute dtype of a float result: f64 for f64, else f32 (f16 / bf16
 * compute in f32 and round once, as the CPU). */
static nb_dtype compute_dtype(nb_dtype dt) { return dt == NB_F64 ? NB_F64 : NB_F32; }

/* The geometry of a CONV2D-family node from the dims of x (N, C, H, W), w (O,
 * C/G, KH, KW) and y (N, O, OH, OW): stride, padding, dilation from its attrs
 * (the slots above). */
static conv_geom conv_geom_of(const nb_tensor *n, const int64_t *x, const int64_t *w,
                              const int64_t *y) {
  const int64_t *at = n->attrs.i;
  return (conv_geom){.c = x[1],
                     .h = x[2],
                     .w = x[3],
                     .kh = w[2],
                     .kw = w[3],
                     .sh = at[NBI_CONV_STRIDE],
                     .sw = at[NBI_CONV_STRIDE + 1],
                     .ph = at[NBI_CONV_PAD],
                     .pw = at[NBI_CONV_PAD + 1],
                     .dh = at[NBI_CONV_DILATION],
                     .dw = at[NBI_CONV_DILATION + 1],
                     .oh = y[2],
                     .ow = y[3]};
}

/* A 1x1 kernel with stride 1 and no padding reads the image as its own column
 * matrix (C, H*W). */
static bool conv_in_place(const conv_geom *g) {
  return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* Images per chunk: their column matrices (img_elems elements of es bytes
 * each) stay near col_bytes(); at least 1, at most n. */
static int64_t chunk_images(int64_t n, int64_t img_elems, size_t es) {
  size_t per = (size_t)img_elems * es;
  int64_t nb = per ? (int64_t)(col_bytes() / per) : n;
  return nb < 1 ? 1 : nb > n ? n : nb;
}

/* One GEMM operand over a grid of groups x images: element offsets per group
 * and per image, and its leading dimension. */
typedef struct gemm_operand {
  const char *p;
  int64_t ld, per_group, per_image;
} gemm_operand;

/* C[g, i] = op(A[g, i]) @ op(B[g, i]) (m x n, inner k) for every group g <
 * groups and image i < images, in dtype dt: one batched nbi_cuda_gemm per
 * group (batched over images) or per image (batched over groups), whichever
 * makes fewer calls. */
static nb_status gemm_grid(nbi_cuda_ctx *c, nb_dtype dt, bool ta, bool tb, int64_t m, int64_t n,
                           int64_t k, gemm_operand a, gemm_operand b, gemm_operand cc,
                           int64_t groups, int64_t images) {
  int64_t es = (int64_t)nb_dtype_size(dt);
  bool by_group = groups <= images; /* loop over groups, batch the images */
  int64_t loops = by_group ? groups : images, batch = by_group ? images : groups;
  nb_status st = NB_OK;
  for (int64_t l = 0; l < loops && st == NB_OK; l++) {
    int64_t oa = l * (by_group ? a.per_group : a.per_image);
    int64_t ob = l * (by_group ? b.per_group : b.per_image);
    int64_t oc = l * (by_group ? cc.per_group : cc.per_image);
    st = nbi_cuda_gemm(c, dt, ta, tb, m, n, k, a.p + oa * es, a.ld,
                       by_group ? a.per_image : a.per_group, b.p + ob * es, b.ld,
                       by_group ? b.per_image : b.per_group, (char *)cc.p + oc * es, cc.ld,
                       by_group ? cc.per_image : cc.per_group, batch);
  }
  return st;
}

/* in[0] x (N, C, H, W), in[1] w (O, C/G, KH, KW), optional in[2] bias (O), any
 * strides, float dtypes; out (N, O, OH, OW) contiguous: the cross-correlation
 * with the node's stride, padding, dilation and groups, plus bias. Per chunk
 * of images: im2col, then y[n, g] (O/G, P) = w[g] (O/G, C/G*KH*KW) @ col[n, g]. */
nb_status nbi_cuda_conv2d(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  int64_t N = out->dims[0], O = out->dims[1], G = n->attrs.i[NBI_CONV_GROUPS];
  conv_geom g = conv_geom_of(n, in[0].dims, in[1].dims, out->dims);
  int64_t P = g.oh * g.ow, og = O / G, ksz = g.c / G * g.kh * g.kw, col_img = G * ksz * P;
  if (N * O * P == 0) return NB_OK;
  nb_dtype dt = compute_dtype(out->dtype);
  nn_run r = {.c = c};
  char *x = nn_stage(&r, &in[0], dt), *w = x ? nn_stage(&r, &in[1], dt) : NULL;
  char *bias = w && n->n_in == 3 ? nn_stage(&r, &in[2], dt) : NULL;
  char *y = (bias || (w && n->n_in == 2)) ? nn_result(&r, out, dt) : NULL;
  nb_status st = y ? NB_OK : NB_ERR_OOM;
  int64_t es = (int64_t)nb_dtype_size(dt);
  if (st == NB_OK && ksz == 0) {
    nbi_view yv = contig_view(y, dt, 4, out->dims);
    st = nbi_cuda_fill(c, &yv, 0);
  } else if (st == NB_OK) {
    bool in_place = conv_in_place(&g);
    int64_t nb = in_place ? N : chunk_images(N, col_img, (size_t)es);
    char *col = in_place ? NULL : nn_scratch(&r, nb * col_img, dt);
    st = in_place || col ? NB_OK : NB_ERR_OOM;
    for (int64_t n0 = 0; n0 < N && st == NB_OK; n0 += nb) {
      int64_t cnt = N - n0 < nb ? N - n0 : nb, ld = P;
      CUdeviceptr px = dptr(x + n0 * g.c * g.h * g.w * es), pc = dptr(col);
      if (!in_place)
        st = nn_launch(c, K_IM2COL, dt, cnt * col_img,
                       (void *[]){&px, &pc, &g, &cnt, &ld, &col_img});
      gemm_operand A = {w, ksz, og * ksz, 0};
      gemm_operand B = {in_place ? x + n0 * col_img * es : col, P, ksz * P, col_img};
      gemm_operand C = {y + n0 * O * P * es, P, og * P, O * P};
      if (st == NB_OK) st = gemm_grid(c, dt, false, false, og, P, ksz, A, B, C, G, cnt);
    }
  }
  if (st == NB_OK && bias) {
    int64_t total = N * O * P;
    CUdeviceptr py = dptr(y), pb = dptr(bias);
    st = nn_launch(c, K_BIAS, dt, total, (void *[]){&py, &pb, &O, &P, &total});
  }
  return nn_end(&r, st, out, y, dt);
}

/* in[0] dy (N, O, OH, OW), in[1] w (O, C/G, KH, KW); out dx (N, C, H, W)
 * contiguous, H and W from the attrs: conv2d's input gradient. Per chunk of
 * images: col[n, g] (C/G*KH*KW, P) = w[g]^T @ dy[n, g], then col2im as a
 * gather (each pixel sums its entries in a fixed order: deterministic). */
nb_status nbi_cuda_conv2d_bwd_data(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                   const nbi_view *in) {
  int64_t N = out->dims[0], O = in[0].dims[1], G = n->attrs.i[NBI_CONV_GROUPS];
  conv_geom g = conv_geom_of(n, out->dims, in[1].dims, in[0].dims);
  int64_t P = g.oh * g.ow, og = O / G, ksz = g.c / G * g.kh * g.kw, col_img = G * ksz * P;
  if (nbi_cuda_view_numel(out) == 0) return NB_OK;
  nb_dtype dt = compute_dtype(out->dtype);
  nn_run r = {.c = c};
  char *dy = nn_stage(&r, &in[0], dt), *w = dy ? nn_stage(&r, &in[1], dt) : NULL;
  char *dx = w ? nn_result(&r, out, dt) : NULL;
  nb_status st = dx ? NB_OK : NB_ERR_OOM;
  int64_t es = (int64_t)nb_dtype_size(dt), img = g.c * g.h * g.w;
  if (st == NB_OK && og * P == 0) {
    nbi_view v = contig_view(dx, dt, 4, out->dims);
    st = nbi_cuda_fill(c, &v, 0);
  } else if (st == NB_OK) {
    bool in_place = conv_in_place(&g);
    int64_t nb = in_place ? N : chunk_images(N, col_img, (size_t)es);
    char *col = in_place ? NULL : nn_scratch(&r, nb * col_img, dt);
    st = in_place || col ? NB_OK : NB_ERR_OOM;
    for (int64_t n0 = 0; n0 < N && st == NB_OK; n0 += nb) {
      int64_t cnt = N - n0 < nb ? N - n0 : nb, ld = P;
      char *dst = in_place ? dx + n0 * img * es : col;
      gemm_operand A = {w, ksz, og * ksz, 0};
      gemm_operand B = {dy + n0 * O * P * es, P, og * P, O * P};
      gemm_operand C = {dst, P, ksz * P, col_img};
      st = gemm_grid(c, dt, true, false, ksz, P, og, A, B, C, G, cnt);
      CUdeviceptr pc = dptr(col), px = dptr(dx + n0 * img * es);
      if (st == NB_OK && !in_place)
        st = nn_launch(c, K_COL2IM, dt, cnt * img, (void *[]){&pc, &px, &g, &cnt, &ld, &col_img});
    }
  }
  return nn_end(&r, st, out, dx, dt);
}

/* in[0] x (N, C, H, W), in[1] dy (N, O, OH, OW); out dw (O, C/G, KH, KW)
 * contiguous, KH and KW from the attrs: conv2d's weight gradient. Per chunk
 * of images, the columns of its images side by side (C*KH*KW, cnt*P) and dy
 * regrouped as (O, cnt*P): dw[g] = dy[g] @ col[g]^T, one GEMM with inner
 * dimension cnt*P; several chunks give partial sums added in chunk order. */
nb_status nbi_cuda_conv2d_bwd_filter(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                     const nbi_view *in) {
  int64_t N = in[0].dims[0], O = out->dims[0], G = n->attrs.i[NBI_CONV_GROUPS];
  conv_geom g = conv_geom_of(n, in[0].dims, out->dims, in[1].dims);
  int64_t P = g.oh * g.ow, og = O / G, ksz = g.c / G * g.kh * g.kw, numel = O * ksz;
  if (numel == 0) return NB_OK;
  nb_dtype dt = compute_dtype(out->dtype);
  int64_t es = (int64_t)nb_dtype_size(dt), col_img = g.c * g.kh * g.kw * P;
  int64_t nb = chunk_images(N, col_img + O * P, (size_t)es), chunks = N > 0 ? (N + nb - 1) / nb : 0;
  nn_run r = {.c = c};
  char *dw = chunks > 1 ? nn_scratch(&r, chunks * numel, dt) : nn_result(&r, out, dt);
  nb_status st = dw ? NB_OK : NB_ERR_OOM;
  if (st == NB_OK && P * chunks == 0) {
    nbi_view v = contig_view(dw, dt, 4, out->dims);
    st = nbi_cuda_fill(c, &v, 0);
    return nn_end(&r, st, out, dw, dt);
  }
  char *x = st == NB_OK ? nn_stage(&r, &in[0], dt) : NULL;
  char *col = x ? nn_scratch(&r, nb * col_img, dt) : NULL;
  char *dyc = col ? nn_scratch(&r, nb * O * P, dt) : NULL;
  if (st == NB_OK && !dyc) st = NB_ERR_OOM;
  for (int64_t ci = 0; ci < chunks && st == NB_OK; ci++) {
    int64_t n0 = ci * nb, cnt = N - n0 < nb ? N - n0 : nb, ld = cnt * P;
    CUdeviceptr px = dptr(x + n0 * g.c * g.h * g.w * es), pc = dptr(col);
    st = nn_launch(c, K_IM2COL, dt, cnt * col_img, (void *[]){&px, &pc, &g, &cnt, &ld, &P});
    /* dy[n0 : n0+cnt] (cnt, O, OH, OW) -> dyc (O, cnt, OH, OW) */
    nbi_view src = in[1];
    src.data += n0 * in[1].strides[0] * (int64_t)nb_dtype_size(in[1].dtype);
    src.dims[0] = cnt;
    nbi_view dst = {.data = dyc,
                    .dtype = dt,
                    .ndim = 4,
                    .dims = {cnt, O, g.oh, g.ow},
                    .strides = {P, cnt * P, g.ow, 1}};
    if (st == NB_OK) st = nbi_cuda_copy(c, &dst, &src);
    gemm_operand A = {dyc, ld, og * ld, 0};
    gemm_operand B = {col, ld, ksz * ld, 0};
    gemm_operand C = {dw + ci * numel * es, ksz, og * ksz, 0};
    if (st == NB_OK) st = gemm_grid(c, dt, false, true, og, ksz, ld, A, B, C, G, 1);
  }
  if (st != NB_OK || chunks <= 1) return nn_end(&r, st, out, dw, dt);
  char *sum = nn_result(&r, out, dt);
  if (!sum) return nn_end(&r, NB_ERR_OOM, out, NULL, dt);
  CUdeviceptr ps = dptr(sum), pp = dptr(dw);
  st = nn_launch(c, K_CHUNK_SUM, dt, numel, (void *[]){&ps, &pp, &numel, &chunks});
  return nn_end(&r, st, out, sum, dt);
}

/* The geometry of a MAX_POOL2D-family node: x (N, C, H, W), y (N, C, OH, OW),
 * kernel / stride / padding from its attrs. */
static conv_geom pool_geom(const nb_tensor *n, const int64_t *x, const int64_t *y) {
  const int64_t *at = n->attrs.i;
  return (conv_geom){.c = x[1],
                     .h = x[2],
                     .w = x[3],
                     .kh = at[NBI_POOL_KERNEL],
                     .kw = at[NBI_POOL_KERNEL + 1],
                     .sh = at[NBI_POOL_STRIDE],
                     .sw = at[NBI_POOL_STRIDE + 1],
                     .ph = at[NBI_POOL_PAD],
                     .pw = at[NBI_POOL_PAD + 1],
                     .dh = 1,
                     .dw = 1,
                     .oh = y[2],
                     .ow = y[3]};
}

/* in[0] x (N, C, H, W), any strides, float dtypes; out (N, C, OH, OW)
 * contiguous: the max of each window (padding never wins), NaN propagating. */
nb_status nbi_cuda_max_pool2d(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                              const nbi_view *in) {
  int64_t total = nbi_cuda_view_numel(out);
  if (total == 0) return NB_OK;
  conv_geom g = pool_geom(n, in[0].dims, out->dims);
  nb_dtype dt = compute_dtype(out->dtype);
  nn_run r = {.c = c};
  char *x = nn_stage(&r, &in[0], dt), *y = x ? nn_result(&r, out, dt) : NULL;
  nb_status st = y ? NB_OK : NB_ERR_OOM;
  CUdeviceptr px = dptr(x), py = dptr(y);
  if (st == NB_OK) st = nn_launch(c, K_POOL_MAX, dt, total, (void *[]){&px, &py, &g, &total});
  return nn_end(&r, st, out, y, dt);
}

/* MAX_POOL2D_BWD (scatter: in[1] dy pooled, out x's shape) and
 * MAX_POOL2D_SELECT (gather: in[1] g of x's shape, out pooled): each window's
 * maximum in x (in[0]) found first (the forward's rule, first on ties), then
 * in[1]'s values moved through it in f64 for f64 results, else f32. */
static nb_status pool_route(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in,
                            bool scatter) {
  if (nbi_cuda_view_numel(out) == 0) return NB_OK;
  const nbi_view *y = scatter ? &in[1] : out;
  conv_geom g = pool_geom(n, in[0].dims, y->dims);
  int64_t pooled = nbi_cuda_view_numel(y), total = nbi_cuda_view_numel(out);
  nb_dtype xdt = compute_dtype(in[0].dtype), dt = compute_dtype(out->dtype);
  nn_run r = {.c = c};
  char *x = nn_stage(&r, &in[0], xdt), *v = x ? nn_stage(&r, &in[1], dt) : NULL;
  char *idx = v ? nn_scratch(&r, pooled, NB_I64) : NULL;
  char *res = idx ? nn_result(&r, out, dt) : NULL;
  nb_status st = res ? NB_OK : NB_ERR_OOM;
  CUdeviceptr px = dptr(x), pi = dptr(idx), pv = dptr(v), pr = dptr(res);
  if (st == NB_OK) st = nn_launch(c, K_POOL_ARGMAX, xdt, pooled, (void *[]){&px, &pi, &g, &pooled});
  if (st == NB_OK)
    st = nn_launch(c, scatter ? K_POOL_BWD : K_POOL_SELECT, dt, total,
                   (void *[]){&pi, &pv, &pr, &g, &total});
  return nn_end(&r, st, out, res, dt);
}

/* in[0] x (N, C, H, W), in[1] dy (N, C, OH, OW); out dx (N, C, H, W)
 * contiguous: dy routed to each window's maximum (summed where windows
 * overlap), 0 elsewhere. */
nb_status nbi_cuda_max_pool2d_bwd(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                  const nbi_view *in) {
  return pool_route(c, n, out, in, true);
}

/* in[0] x and in[1] g (N, C, H, W); out (N, C, OH, OW) contiguous: g at each
 * window's maximum of x. */
nb_status nbi_cuda_max_pool2d_select(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                     const nbi_view *in) {
  return pool_route(c, n, out, in, false);
}
