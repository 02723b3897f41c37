/* src/backends/cpu/k_nn.c — CONV2D and MAX_POOL2D kernels (NCHW).
 *
 * Convolution is im2col + GEMM through nbi_cpu_gemm (oneDNN sgemm for f32,
 * OpenBLAS dgemm for f64), chosen over oneDNN's convolution primitive because
 * it covers f64 with the same code and needs no primitive cache. For each image
 * and group, the (C/G*KH*KW, OH*OW) column matrix of the image is built (zeros
 * where the dilated kernel reads padding) and out[n, g] (O/G, OH*OW) += w[g]
 * (O/G, C/G*KH*KW) @ col, onto outputs preset to the bias. A 1x1 kernel with
 * stride 1 and no padding reads the image in place. Many small products run
 * one per thread, each with its own column buffer; large ones use the GEMM
 * library's threads and build the columns in parallel. f16/bf16 compute in f32
 * and round once; max pooling compares in f32/f64 (exact for every dtype). */
#include "k_nn.h"

#include <math.h>

#include "k_linalg.h"
#ifdef _OPENMP
#include <omp.h>
#endif

/* Geometry of one convolution or pooling (all in elements). */
typedef struct conv_geom {
  int64_t c, h, w; /* input channels (per group for conv), height, width */
  int64_t kh, kw;  /* kernel */
  int64_t sh, sw;  /* stride */
  int64_t ph, pw;  /* padding */
  int64_t dh, dw;  /* dilation */
  int64_t oh, ow;  /* output */
} conv_geom;

/* ceil(a / b) for b > 0 and any sign of a. */
static int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); }

/* The output columns [*lo, *hi) whose input column ow*s - p + off lies in [0, w). */
static void valid_range(int64_t off, int64_t s, int64_t p, int64_t w, int64_t ow, int64_t *lo,
                        int64_t *hi) {
  int64_t a = ceil_div(p - off, s), b = ceil_div(w + p - off, s);
  *lo = a < 0 ? 0 : a > ow ? ow : a;
  *hi = b < *lo ? *lo : b > ow ? ow : b;
}

/* img is (C, H, W) contiguous, col is (C*KH*KW, OH*OW): row (c, kh, kw) holds
 * img[c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw], 0 outside the image. Elements
 * are copied as bits (T = uint32_t for f32, uint64_t for f64; 0 bits = +0.0). */
#define DEFINE_IM2COL(T)                                                                           \
  static void im2col_##T(const T *restrict img, T *restrict col, const conv_geom *g, bool par) {   \
    int64_t rows = g->c * g->kh * g->kw, p = g->oh * g->ow;                                        \
    _Pragma("omp parallel for schedule(static) if (par)") for (int64_t r = 0; r < rows; r++) {     \
      int64_t c = r / (g->kh * g->kw), kh = r / g->kw % g->kh, kw = r % g->kw;                     \
      int64_t lo, hi, off = kw * g->dw - g->pw;                                                    \
      valid_range(kw * g->dw, g->sw, g->pw, g->w, g->ow, &lo, &hi);                                \
      const T *plane = img + c * g->h * g->w;                                                      \
      for (int64_t oh = 0; oh < g->oh; oh++) {                                                     \
        T *restrict d = col + r * p + oh * g->ow;                                                  \
        int64_t ih = oh * g->sh - g->ph + kh * g->dh;                                              \
        if (ih < 0 || ih >= g->h) {                                                                \
          for (int64_t ow = 0; ow < g->ow; ow++)                                                   \
            d[ow] = 0;                                                                             \
          continue;                                                                                \
        }                                                                                          \
        const T *restrict src = plane + ih * g->w;                                                 \
        for (int64_t ow = 0; ow < lo; ow++)                                                        \
          d[ow] = 0;                                                                               \
        if (g->sw == 1 && hi > lo)                                                                 \
          memcpy(d + lo, src + lo + off, (size_t)(hi - lo) * sizeof(T));                           \
        else                                                                                       \
          for (int64_t ow = lo; ow < hi; ow++)                                                     \
            d[ow] = src[ow * g->sw + off];                                                         \
        for (int64_t ow = hi; ow < g->ow; ow++)                                                    \
          d[ow] = 0;                                                                               \
      }                                                                                            \
    }                                                                                              \
  }
DEFINE_IM2COL(uint32_t)
DEFINE_IM2COL(uint64_t)

/* Builds img's column matrix in col (element size es: 4 or 8). */
static void im2col(const char *img, char *col, size_t es, const conv_geom *g, bool par) {
  if (es == 4)
    im2col_uint32_t((const uint32_t *)img, (uint32_t *)col, g, par);
  else
    im2col_uint64_t((const uint64_t *)img, (uint64_t *)col, g, par);
}

/* y (N, O, P) contiguous of dtype dt (F32/F64) = bias[o] (dt, contiguous) or 0. */
static void conv_init_output(char *y, nb_dtype dt, const char *bias, int64_t n, int64_t o,
                             int64_t p) {
  int64_t planes = n * o;
#pragma omp parallel for schedule(static) if (planes * p >= NBI_PAR_MIN && planes > 1)
  for (int64_t i = 0; i < planes; i++) {
    int64_t ch = i % o;
    if (dt == NB_F64) {
      double v = bias ? ((const double *)bias)[ch] : 0.0, *restrict d = (double *)y + i * p;
      for (int64_t j = 0; j < p; j++)
        d[j] = v;
    } else {
      float v = bias ? ((const float *)bias)[ch] : 0.0f, *restrict d = (float *)y + i * p;
      for (int64_t j = 0; j < p; j++)
        d[j] = v;
    }
  }
}

/* One convolution as GEMM jobs: y (N, O, P), x (N, C, H, W) and w (O, C/G * KH
 * * KW) contiguous in dt (F32/F64); og = O/G output channels per group. */
typedef struct conv_gemm_args {
  nb_dtype dt;
  size_t es;
  char *y;
  const char *x, *w;
  const conv_geom *g;
  int64_t groups, og, ksz, p;
  bool in_place; /* 1x1 kernel, stride 1, no padding: x is its own column matrix */
} conv_gemm_args;

/* Job j = (image, group): out[n, g] += w[g] @ columns of x[n, g], the columns
 * built in col (threaded when par_cols) unless in_place. */
static nb_status conv_job(const conv_gemm_args *a, int64_t j, char *col, bool par_cols) {
  const conv_geom *g = a->g;
  const char *src = a->x + (size_t)(j * g->c * g->h * g->w) * a->es;
  if (!a->in_place) im2col(src, col, a->es, g, par_cols);
  int64_t grp = j % a->groups;
  return nbi_cpu_gemm(
      a->dt, false, false, a->og, a->p, a->ksz, 1.0, a->w + (size_t)(grp * a->og * a->ksz) * a->es,
      a->ksz, a->in_place ? src : col, a->p, 1.0, a->y + (size_t)(j * a->og * a->p) * a->es, a->p);
}

/* Runs every (image, group) job: one per thread with a column buffer each when
 * the products are small, else one after another on threaded GEMMs. */
static nb_status conv_gemm(const conv_gemm_args *a, int64_t jobs) {
  bool par = nbi_cpu_gemm_batch_parallel(a->dt, jobs, a->og, a->p, a->ksz);
  int threads = 1;
#ifdef _OPENMP
  if (par) threads = omp_get_max_threads();
#endif
  size_t col_bytes = a->in_place ? 0 : (size_t)(a->ksz * a->p) * a->es;
  char *cols = NULL;
  if (col_bytes) {
    cols = nbi_cpu_scratch("nb_conv2d", (size_t)threads * col_bytes);
    if (!cols) return NB_ERR_OOM;
  }
  nb_status st = NB_OK;
  if (par) {
#pragma omp parallel num_threads(threads)
    {
      int tid = 0;
#ifdef _OPENMP
      tid = omp_get_thread_num();
#endif
#pragma omp for schedule(static)
      for (int64_t j = 0; j < jobs; j++) {
        nb_status s = conv_job(a, j, cols ? cols + (size_t)tid * col_bytes : NULL, false);
        if (s != NB_OK) {
#pragma omp critical(nbi_conv_status)
          st = s;
        }
      }
    }
  } else {
    for (int64_t j = 0; j < jobs && st == NB_OK; j++)
      st = conv_job(a, j, cols, a->ksz * a->p >= NBI_PAR_MIN);
  }
  nbi_cpu_scratch_free(cols);
  return st;
}

/* in[0] x is (N, C, H, W), in[1] w is (O, C/G, KH, KW), in[2] (when the node has
 * three inputs) bias is (O); out is contiguous (N, O, OH, OW) with
 * OH = (H + 2*ph - dh*(KH-1) - 1) / sh + 1 (likewise OW). Any strides and float
 * dtypes in; the node's attrs hold stride, padding, dilation, groups. */
nb_status nbi_cpu_conv2d(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  const int64_t *at = node->attrs.i;
  int64_t n_img = out->dims[0], o = out->dims[1], groups = at[NBI_CONV_GROUPS];
  conv_geom g = {
      .c = in[0].dims[1] / groups,
      .h = in[0].dims[2],
      .w = in[0].dims[3],
      .kh = in[1].dims[2],
      .kw = in[1].dims[3],
      .sh = at[NBI_CONV_STRIDE],
      .sw = at[NBI_CONV_STRIDE + 1],
      .ph = at[NBI_CONV_PAD],
      .pw = at[NBI_CONV_PAD + 1],
      .dh = at[NBI_CONV_DILATION],
      .dw = at[NBI_CONV_DILATION + 1],
      .oh = out->dims[2],
      .ow = out->dims[3],
  };
  int64_t p = g.oh * g.ow;
  if (n_img * o * p == 0) return NB_OK;
  nb_dtype dt = out->dtype == NB_F64 ? NB_F64 : NB_F32;
  void *own_x = NULL, *own_w = NULL, *own_b = NULL;
  const char *x = nbi_cpu_contig("nb_conv2d", &in[0], dt, &own_x);
  const char *w = x ? nbi_cpu_contig("nb_conv2d", &in[1], dt, &own_w) : NULL;
  const char *bias = NULL;
  if (w && node->n_in == 3) bias = nbi_cpu_contig("nb_conv2d", &in[2], dt, &own_b);
  char *y = out->dtype == dt
                ? out->data
                : nbi_cpu_scratch("nb_conv2d", (size_t)(n_img * o * p) * nb_dtype_size(dt));
  nb_status st = NB_ERR_OOM;
  if (x && w && (bias || node->n_in < 3) && y) {
    conv_init_output(y, dt, bias, n_img, o, p);
    conv_gemm_args a = {
        .dt = dt,
        .es = nb_dtype_size(dt),
        .y = y,
        .x = x,
        .w = w,
        .g = &g,
        .groups = groups,
        .og = o / groups,
        .ksz = g.c * g.kh * g.kw,
        .p = p,
        .in_place = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0,
    };
    st = a.ksz == 0 ? NB_OK : conv_gemm(&a, n_img * groups);
  }
  if (y && y != out->data) {
    if (st == NB_OK) {
      nbi_view src = *out;
      src.data = y;
      src.dtype = dt;
      nbi_copy_view(out, &src);
    }
    nbi_cpu_scratch_free(y);
  }
  nbi_cpu_scratch_free(own_x);
  nbi_cpu_scratch_free(own_w);
  nbi_cpu_scratch_free(own_b);
  return st;
}

/* Max over each window of planes x (rows = N*C planes of H x W, contiguous) into
 * y (planes of OH x OW); out-of-image positions are skipped (-inf), NaN wins.
 * Each output row is swept once per (window row, kernel column), so the inner
 * loop runs along the output row. */
#define DEFINE_MAX_POOL(T)                                                                         \
  static void max_pool_##T(const T *restrict x, T *restrict y, int64_t planes,                     \
                           const conv_geom *g) {                                                   \
    int64_t rows = planes * g->oh;                                                                 \
    bool par = rows > 1 && (double)rows * (double)(g->ow * g->kh * g->kw) >= NBI_PAR_MIN;          \
    _Pragma("omp parallel for schedule(static) if (par)") for (int64_t r = 0; r < rows; r++) {     \
      int64_t h0 = r % g->oh * g->sh - g->ph;                                                      \
      int64_t hs = h0 < 0 ? 0 : h0, he = h0 + g->kh > g->h ? g->h : h0 + g->kh;                    \
      const T *plane = x + r / g->oh * g->h * g->w;                                                \
      T *restrict d = y + r * g->ow;                                                               \
      for (int64_t ow = 0; ow < g->ow; ow++)                                                       \
        d[ow] = -INFINITY;                                                                         \
      for (int64_t h = hs; h < he; h++)                                                            \
        for (int64_t kw = 0; kw < g->kw; kw++) {                                                   \
          int64_t lo, hi, off = kw - g->pw;                                                        \
          valid_range(kw, g->sw, g->pw, g->w, g->ow, &lo, &hi);                                    \
          const T *restrict src = plane + h * g->w;                                                \
          for (int64_t ow = lo; ow < hi; ow++) {                                                   \
            T v = src[ow * g->sw + off];                                                           \
            d[ow] = v > d[ow] || v != v ? v : d[ow];                                               \
          }                                                                                        \
        }                                                                                          \
    }                                                                                              \
  }
DEFINE_MAX_POOL(float)
DEFINE_MAX_POOL(double)

/* in[0] x is (N, C, H, W), out is contiguous (N, C, OH, OW) with
 * OH = (H + 2*ph - KH) / sh + 1 (likewise OW); the node's attrs hold kernel,
 * stride and padding. Any strides; float dtypes. */
nb_status nbi_cpu_max_pool2d(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  const int64_t *at = node->attrs.i;
  conv_geom g = {
      .h = in[0].dims[2],
      .w = in[0].dims[3],
      .kh = at[NBI_POOL_KERNEL],
      .kw = at[NBI_POOL_KERNEL + 1],
      .sh = at[NBI_POOL_STRIDE],
      .sw = at[NBI_POOL_STRIDE + 1],
      .ph = at[NBI_POOL_PAD],
      .pw = at[NBI_POOL_PAD + 1],
      .oh = out->dims[2],
      .ow = out->dims[3],
  };
  int64_t planes = out->dims[0] * out->dims[1];
  if (planes * g.oh * g.ow == 0) return NB_OK;
  nb_dtype dt = out->dtype == NB_F64 ? NB_F64 : NB_F32;
  void *own_x = NULL;
  const char *x = nbi_cpu_contig("nb_max_pool2d", &in[0], dt, &own_x);
  char *y = out->dtype == dt ? out->data
                             : nbi_cpu_scratch("nb_max_pool2d",
                                               (size_t)(planes * g.oh * g.ow) * nb_dtype_size(dt));
  nb_status st = x && y ? NB_OK : NB_ERR_OOM;
  if (st == NB_OK) {
    if (dt == NB_F64)
      max_pool_double((const double *)x, (double *)y, planes, &g);
    else
      max_pool_float((const float *)x, (float *)y, planes, &g);
  }
  if (y && y != out->data) {
    if (st == NB_OK) {
      nbi_view src = *out;
      src.data = y;
      src.dtype = dt;
      nbi_copy_view(out, &src);
    }
    nbi_cpu_scratch_free(y);
  }
  nbi_cpu_scratch_free(own_x);
  return st;
}
