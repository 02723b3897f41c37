/* src/backends/cpu/k_nn.c — CONV2D and MAX_POOL2D kernels (NCHW), and those of
 * their derivative ops CONV2D_BWD_DATA, CONV2D_BWD_FILTER, MAX_POOL2D_BWD and
 * MAX_POOL2D_SELECT.
 *
 * Convolution is im2col + GEMM through nbi_cpu_gemm (oneDNN sgemm for f32,
 * OpenBLAS dgemm for f64), chosen over oneDNN's convolution primitive because
 * it covers f64 with the same code and needs no primitive cache. For each image
 * and group, the (C/G*KH*KW, OH*OW) column matrix of the image is built (zeros
 * where the dilated kernel reads padding) and out[n, g] (O/G, OH*OW) += w[g]
 * (O/G, C/G*KH*KW) @ col, onto outputs preset to the bias. A 1x1 kernel with
 * stride 1 and no padding reads the image in place. Many small products run
 * one per thread, each with its own column buffer; large ones use the GEMM
 * library's threads and build the columns in parallel. The data gradient runs
 * the same jobs backwards: col = w[g]^T @ dy[n, g], summed into dx[n, g] by
 * col2im. The filter gradient is dw[g] += dy[:, g] @ col^T with the columns of
 * a chunk of images side by side, so one GEMM has K = images * OH*OW (no per
 * thread accumulators; the result does not depend on the thread count).
 * f16/bf16 compute in f32 and round once; max pooling compares in f32/f64
 * (exact for every dtype), and its derivative ops route through the index of
 * each window's maximum, found by the forward kernel's rule. */
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

/* The buffer a kernel computes out in: out's own memory when its dtype is the
 * compute dtype dt, else scratch of n elements of dt. NULL + NB_ERR_OOM. */
static char *out_buffer(const char *fn, nbi_view *out, nb_dtype dt, int64_t n) {
  if (out->dtype == dt) return out->data;
  return nbi_cpu_scratch(fn, (size_t)n * nb_dtype_size(dt));
}

/* Ends a kernel that computed into y (from out_buffer): on success converts y
 * into out when it is scratch; frees it. Returns st. */
static nb_status out_finish(nbi_view *out, char *y, nb_dtype dt, nb_status st) {
  if (y && y != out->data) {
    if (st == NB_OK) {
      nbi_view src = *out;
      src.data = y;
      src.dtype = dt;
      nbi_copy_view(out, &src);
    }
    nbi_cpu_scratch_free(y);
  }
  return st;
}

/* img is (C, H, W) contiguous, col is (C*KH*KW, OH*OW) with rows ld elements
 * apart: row (c, kh, kw) holds img[c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw],
 * 0 outside the image. Elements are copied as bits (T = uint32_t for f32,
 * uint64_t for f64; 0 bits = +0.0). */
#define DEFINE_IM2COL(T)                                                                           \
  static void im2col_##T(const T *restrict img, T *restrict col, int64_t ld, const conv_geom *g,   \
                         bool par) {                                                               \
    int64_t rows = g->c * g->kh * g->kw;                                                           \
    _Pragma("omp parallel for schedule(static) if (par)") for (int64_t r = 0; r < rows; r++) {     \
      int64_t c = r / (g->kh * g->kw), kh = r / g->kw % g->kh, kw = r % g->kw;                     \
      int64_t lo, hi, off = kw * g->dw - g->pw;                                                    \
      valid_range(kw * g->dw, g->sw, g->pw, g->w, g->ow, &lo, &hi);                                \
      const T *plane = img + c * g->h * g->w;                                                      \
      for (int64_t oh = 0; oh < g->oh; oh++) {                                                     \
        T *restrict d = col + r * ld + oh * g->ow;                                                 \
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

/* Builds img's column matrix in col, rows ld apart (element size es: 4 or 8). */
static void im2col(const char *img, char *col, int64_t ld, size_t es, const conv_geom *g,
                   bool par) {
  if (es == 4)
    im2col_uint32_t((const uint32_t *)img, (uint32_t *)col, ld, g, par);
  else
    im2col_uint64_t((const uint64_t *)img, (uint64_t *)col, ld, g, par);
}

/* The transpose of im2col: img (C, H, W) += col (C*KH*KW, OH*OW) summed back
 * onto the pixels each entry was read from; entries that im2col took from
 * padding are dropped. Channels touch disjoint planes, so they run in parallel
 * when par; within a channel the sum order is fixed. */
#define DEFINE_COL2IM(T)                                                                           \
  static void col2im_##T(const T *restrict col, T *restrict img, const conv_geom *g, bool par) {   \
    int64_t p = g->oh * g->ow, kk = g->kh * g->kw;                                                 \
    _Pragma("omp parallel for schedule(static) if (par)") for (int64_t c = 0; c < g->c; c++) {     \
      T *plane = img + c * g->h * g->w;                                                            \
      for (int64_t k = 0; k < kk; k++) {                                                           \
        int64_t kh = k / g->kw, kw = k % g->kw, lo, hi, off = kw * g->dw - g->pw;                  \
        valid_range(kw * g->dw, g->sw, g->pw, g->w, g->ow, &lo, &hi);                              \
        for (int64_t oh = 0; oh < g->oh; oh++) {                                                   \
          int64_t ih = oh * g->sh - g->ph + kh * g->dh;                                            \
          if (ih < 0 || ih >= g->h) continue;                                                      \
          const T *s = col + (c * kk + k) * p + oh * g->ow;                                        \
          T *d = plane + ih * g->w + off;                                                          \
          for (int64_t ow = lo; ow < hi; ow++)                                                     \
            d[ow * g->sw] += s[ow];                                                                \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
  }
DEFINE_COL2IM(float)
DEFINE_COL2IM(double)

static void col2im(const char *col, char *img, nb_dtype dt, const conv_geom *g, bool par) {
  if (dt == NB_F64)
    col2im_double((const double *)col, (double *)img, g, par);
  else
    col2im_float((const float *)col, (float *)img, g, par);
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

/* One convolution as GEMM jobs, one per (image, group), all operands contiguous
 * in dt (F32/F64); og = O/G output channels per group, ksz = C/G * KH * KW,
 * p = OH * OW. Forward: img is x (N, C, H, W), res is y (N, O, P). Data
 * gradient: res is dy (N, O, P), img is dx (N, C, H, W). w is (O, ksz). */
typedef struct conv_gemm_args {
  nb_dtype dt;
  size_t es;
  char *out;
  const char *in, *w;
  const conv_geom *g;
  int64_t groups, og, ksz, p;
  bool in_place; /* 1x1 kernel, stride 1, no padding: the image is its own column matrix */
} conv_gemm_args;

/* A job j = (image, group) with a column buffer (unless in_place), the columns
 * built or scattered by threads when par_cols. */
typedef nb_status (*conv_job_fn)(const conv_gemm_args *a, int64_t j, char *col, bool par_cols);

/* Forward job: out[n, g] (og, P) += w[g] @ columns of in[n, g]. */
static nb_status conv_fwd_job(const conv_gemm_args *a, int64_t j, char *col, bool par_cols) {
  const conv_geom *g = a->g;
  const char *src = a->in + (size_t)(j * g->c * g->h * g->w) * a->es;
  if (!a->in_place) im2col(src, col, a->p, a->es, g, par_cols);
  int64_t grp = j % a->groups;
  return nbi_cpu_gemm(a->dt, false, false, a->og, a->p, a->ksz, 1.0,
                      a->w + (size_t)(grp * a->og * a->ksz) * a->es, a->ksz,
                      a->in_place ? src : col, a->p, 1.0,
                      a->out + (size_t)(j * a->og * a->p) * a->es, a->p);
}

/* Data-gradient job: col = w[g]^T (ksz, og) @ in[n, g] (og, P), summed into
 * out[n, g] (C/G, H, W) by col2im (the GEMM writes it directly when in_place). */
static nb_status conv_bwd_data_job(const conv_gemm_args *a, int64_t j, char *col, bool par_cols) {
  const conv_geom *g = a->g;
  char *dst = a->out + (size_t)(j * g->c * g->h * g->w) * a->es;
  int64_t grp = j % a->groups;
  nb_status st = nbi_cpu_gemm(
      a->dt, true, false, a->ksz, a->p, a->og, 1.0, a->w + (size_t)(grp * a->og * a->ksz) * a->es,
      a->ksz, a->in + (size_t)(j * a->og * a->p) * a->es, a->p, 0.0, a->in_place ? dst : col, a->p);
  if (st == NB_OK && !a->in_place) col2im(col, dst, a->dt, g, par_cols);
  return st;
}

/* Runs every (image, group) job: one per thread with a column buffer each when
 * the products are small, else one after another on threaded GEMMs. */
static nb_status conv_run_jobs(const char *fn, const conv_gemm_args *a, int64_t jobs,
                               conv_job_fn job) {
  bool par = nbi_cpu_gemm_batch_parallel(a->dt, jobs, a->og, a->p, a->ksz);
  int threads = 1;
#ifdef _OPENMP
  if (par) threads = omp_get_max_threads();
#endif
  size_t col_bytes = a->in_place ? 0 : (size_t)(a->ksz * a->p) * a->es;
  char *cols = NULL;
  if (col_bytes) {
    cols = nbi_cpu_scratch(fn, (size_t)threads * col_bytes);
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
        nb_status s = job(a, j, cols ? cols + (size_t)tid * col_bytes : NULL, false);
        if (s != NB_OK) {
#pragma omp critical(nbi_conv_status)
          st = s;
        }
      }
    }
  } else {
    for (int64_t j = 0; j < jobs && st == NB_OK; j++)
      st = job(a, j, cols, a->ksz * a->p >= NBI_PAR_MIN);
  }
  nbi_cpu_scratch_free(cols);
  return st;
}

/* The geometry of a CONV2D-family node: stride/padding/dilation from its attrs,
 * sizes from the dims of x (N, C, H, W), w (O, C/G, KH, KW) and y (N, O, OH,
 * OW), whichever of in/out each one is for the op at hand. */
static conv_geom conv_geom_of(const nb_tensor *node, const int64_t *x, const int64_t *w,
                              const int64_t *y) {
  const int64_t *at = node->attrs.i;
  return (conv_geom){
      .sh = at[NBI_CONV_STRIDE],
      .sw = at[NBI_CONV_STRIDE + 1],
      .ph = at[NBI_CONV_PAD],
      .pw = at[NBI_CONV_PAD + 1],
      .dh = at[NBI_CONV_DILATION],
      .dw = at[NBI_CONV_DILATION + 1],
      .c = x[1] / at[NBI_CONV_GROUPS],
      .h = x[2],
      .w = x[3],
      .kh = w[2],
      .kw = w[3],
      .oh = y[2],
      .ow = y[3],
  };
}

/* Inputs staged as contiguous arrays of a compute dtype: p[k] reads in[k];
 * own[k] is scratch to free (NULL when in[k] was usable as is). */
typedef struct staged {
  const char *p[3];
  void *own[3];
} staged;

/* Stages in[0..n-1] as dts[k]; false (error recorded) if one cannot be. */
static bool stage(const char *fn, const nbi_view *in, int n, const nb_dtype *dts, staged *s) {
  *s = (staged){0};
  for (int k = 0; k < n; k++)
    if (!(s->p[k] = nbi_cpu_contig(fn, &in[k], dts[k], &s->own[k]))) return false;
  return true;
}

static void unstage(staged *s) {
  for (int k = 0; k < 3; k++)
    nbi_cpu_scratch_free(s->own[k]);
}

static bool conv_in_place(const conv_geom *g) {
  return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* in[0] x is (N, C, H, W), in[1] w is (O, C/G, KH, KW), in[2] (when the node has
 * three inputs) bias is (O); out is contiguous (N, O, OH, OW) with
 * OH = (H + 2*ph - dh*(KH-1) - 1) / sh + 1 (likewise OW). Any strides and float
 * dtypes in; the node's attrs hold stride, padding, dilation, groups. */
nb_status nbi_cpu_conv2d(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  int64_t n_img = out->dims[0], o = out->dims[1], groups = node->attrs.i[NBI_CONV_GROUPS];
  conv_geom g = conv_geom_of(node, in[0].dims, in[1].dims, out->dims);
  int64_t p = g.oh * g.ow;
  if (n_img * o * p == 0) return NB_OK;
  nb_dtype dt = out->dtype == NB_F64 ? NB_F64 : NB_F32;
  staged in_c;
  bool ok = stage("nb_conv2d", in, node->n_in, (nb_dtype[]){dt, dt, dt}, &in_c);
  const char *x = in_c.p[0], *w = in_c.p[1], *bias = in_c.p[2];
  char *y = ok ? out_buffer("nb_conv2d", out, dt, n_img * o * p) : NULL;
  nb_status st = NB_ERR_OOM;
  if (y) {
    conv_init_output(y, dt, bias, n_img, o, p);
    conv_gemm_args a = {
        .dt = dt,
        .es = nb_dtype_size(dt),
        .out = y,
        .in = x,
        .w = w,
        .g = &g,
        .groups = groups,
        .og = o / groups,
        .ksz = g.c * g.kh * g.kw,
        .p = p,
        .in_place = conv_in_place(&g),
    };
    st = a.ksz == 0 ? NB_OK : conv_run_jobs("nb_conv2d", &a, n_img * groups, conv_fwd_job);
  }
  st = out_finish(out, y, dt, st);
  unstage(&in_c);
  return st;
}

/* in[0] dy is (N, O, OH, OW), in[1] w is (O, C/G, KH, KW); out is contiguous
 * dx (N, C, H, W), H and W from the attrs (NBI_CONV_IN_HW): the gradient of
 * CONV2D's x. dx[n, c, ih, iw] = sum of dy[n, o, oh, ow] * w[o, c', kh, kw]
 * over o in c's group and positions with ih = oh*sh - ph + kh*dh (likewise iw);
 * pixels no window reads get 0. */
nb_status nbi_cpu_conv2d_bwd_data(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  const char *fn = "conv2d_bwd_data";
  int64_t n_img = out->dims[0], c = out->dims[1], groups = node->attrs.i[NBI_CONV_GROUPS];
  conv_geom g = conv_geom_of(node, out->dims, in[1].dims, in[0].dims);
  int64_t numel = n_img * c * g.h * g.w, o = in[0].dims[1];
  if (numel == 0) return NB_OK;
  nb_dtype dt = out->dtype == NB_F64 ? NB_F64 : NB_F32;
  staged in_c;
  bool ok = stage(fn, in, 2, (nb_dtype[]){dt, dt}, &in_c);
  const char *dy = in_c.p[0], *w = in_c.p[1];
  char *dx = ok ? out_buffer(fn, out, dt, numel) : NULL;
  nb_status st = NB_ERR_OOM;
  if (dx) {
    memset(dx, 0, (size_t)numel * nb_dtype_size(dt));
    conv_gemm_args a = {
        .dt = dt,
        .es = nb_dtype_size(dt),
        .out = dx,
        .in = dy,
        .w = w,
        .g = &g,
        .groups = groups,
        .og = o / groups,
        .ksz = g.c * g.kh * g.kw,
        .p = g.oh * g.ow,
        .in_place = conv_in_place(&g),
    };
    st = a.ksz * a.og * a.p == 0 ? NB_OK : conv_run_jobs(fn, &a, n_img * groups, conv_bwd_data_job);
  }
  st = out_finish(out, dx, dt, st);
  unstage(&in_c);
  return st;
}

/* Bytes of column matrix the filter gradient builds at once (at least one
 * image's worth). */
#define NBI_CONV_FILTER_CHUNK ((size_t)16 << 20)

/* in[0] x is (N, C, H, W), in[1] dy is (N, O, OH, OW); out is contiguous dw
 * (O, C/G, KH, KW), KH and KW from the attrs (NBI_CONV_KERNEL_HW): the gradient
 * of CONV2D's weight. dw[o, c, kh, kw] = sum over n, oh, ow of dy[n, o, oh, ow]
 * * x[n, g*C/G + c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw] (0 in padding). */
nb_status nbi_cpu_conv2d_bwd_filter(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  const char *fn = "conv2d_bwd_filter";
  int64_t n_img = in[0].dims[0], o = out->dims[0], groups = node->attrs.i[NBI_CONV_GROUPS];
  conv_geom g = conv_geom_of(node, in[0].dims, out->dims, in[1].dims);
  int64_t og = o / groups, ksz = g.c * g.kh * g.kw, p = g.oh * g.ow, numel = o * ksz;
  if (numel == 0) return NB_OK;
  nb_dtype dt = out->dtype == NB_F64 ? NB_F64 : NB_F32;
  size_t es = nb_dtype_size(dt);
  char *dw = out_buffer(fn, out, dt, numel);
  if (!dw) return NB_ERR_OOM;
  memset(dw, 0, (size_t)numel * es);
  if (n_img * p == 0) return out_finish(out, dw, dt, NB_OK);
  /* images per chunk: the chunk's columns (ksz, nb * P) stay near the budget */
  size_t img_bytes = (size_t)(ksz * p) * es;
  int64_t nb = (int64_t)(NBI_CONV_FILTER_CHUNK / img_bytes);
  nb = nb < 1 ? 1 : nb > n_img ? n_img : nb;
  staged in_c;
  bool ok = stage(fn, in, 2, (nb_dtype[]){dt, dt}, &in_c);
  const char *x = in_c.p[0], *dy = in_c.p[1];
  char *col = ok ? nbi_cpu_scratch(fn, (size_t)nb * img_bytes) : NULL;
  char *dyc = col && nb > 1 ? nbi_cpu_scratch(fn, (size_t)(nb * og * p) * es) : NULL;
  nb_status st = col && (dyc || nb == 1) ? NB_OK : NB_ERR_OOM;
  for (int64_t grp = 0; grp < groups && st == NB_OK; grp++)
    for (int64_t n0 = 0; n0 < n_img && st == NB_OK; n0 += nb) {
      int64_t cnt = n_img - n0 < nb ? n_img - n0 : nb, ld = cnt * p;
      bool par_imgs = cnt > 1 && cnt * (ksz + og) * p >= NBI_PAR_MIN;
      /* columns of image i at column offset i*P; dy[n, g] rows likewise */
#pragma omp parallel for schedule(static) if (par_imgs)
      for (int64_t i = 0; i < cnt; i++) {
        int64_t n = n0 + i;
        im2col(x + (size_t)((n * groups + grp) * g.c * g.h * g.w) * es, col + (size_t)(i * p) * es,
               ld, es, &g, !par_imgs && ksz * p >= NBI_PAR_MIN);
        if (cnt > 1)
          for (int64_t r = 0; r < og; r++)
            memcpy(dyc + (size_t)(r * ld + i * p) * es,
                   dy + (size_t)(((n * groups + grp) * og + r) * p) * es, (size_t)p * es);
      }
      const char *a = cnt > 1 ? dyc : dy + (size_t)((n0 * groups + grp) * og * p) * es;
      st = nbi_cpu_gemm(dt, false, true, og, ksz, ld, 1.0, a, ld, col, ld, 1.0,
                        dw + (size_t)(grp * og * ksz) * es, ksz);
    }
  nbi_cpu_scratch_free(dyc);
  nbi_cpu_scratch_free(col);
  unstage(&in_c);
  return out_finish(out, dw, dt, st);
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

/* The geometry of a MAX_POOL2D-family node: x (N, C, H, W) -> (N, C, OH, OW). */
static conv_geom pool_geom(const nb_tensor *node, const int64_t *xdims, const int64_t *ydims) {
  const int64_t *at = node->attrs.i;
  return (conv_geom){
      .h = xdims[2],
      .w = xdims[3],
      .kh = at[NBI_POOL_KERNEL],
      .kw = at[NBI_POOL_KERNEL + 1],
      .sh = at[NBI_POOL_STRIDE],
      .sw = at[NBI_POOL_STRIDE + 1],
      .ph = at[NBI_POOL_PAD],
      .pw = at[NBI_POOL_PAD + 1],
      .oh = ydims[2],
      .ow = ydims[3],
  };
}

/* in[0] x is (N, C, H, W), out is contiguous (N, C, OH, OW) with
 * OH = (H + 2*ph - KH) / sh + 1 (likewise OW); the node's attrs hold kernel,
 * stride and padding. Any strides; float dtypes. */
nb_status nbi_cpu_max_pool2d(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  conv_geom g = pool_geom(node, in[0].dims, out->dims);
  int64_t planes = out->dims[0] * out->dims[1];
  if (planes * g.oh * g.ow == 0) return NB_OK;
  nb_dtype dt = out->dtype == NB_F64 ? NB_F64 : NB_F32;
  staged in_c;
  bool ok = stage("nb_max_pool2d", in, 1, &dt, &in_c);
  const char *x = in_c.p[0];
  char *y = ok ? out_buffer("nb_max_pool2d", out, dt, planes * g.oh * g.ow) : NULL;
  nb_status st = y ? NB_OK : NB_ERR_OOM;
  if (st == NB_OK) {
    if (dt == NB_F64)
      max_pool_double((const double *)x, (double *)y, planes, &g);
    else
      max_pool_float((const float *)x, (float *)y, planes, &g);
  }
  st = out_finish(out, y, dt, st);
  unstage(&in_c);
  return st;
}

/* For every output position of the planes of x (contiguous H x W each), idx
 * gets the in-plane offset h*W + w of the element max pooling takes: the first
 * maximum in row-major window order (ties go to the first, as the forward
 * kernel keeps the first of equal values), a NaN beating every number (the
 * first NaN). Windows never lie wholly in padding; such a one would get -1. */
#define DEFINE_POOL_ARGMAX(T)                                                                      \
  static void pool_argmax_##T(const T *restrict x, int64_t *restrict idx, int64_t planes,          \
                              const conv_geom *g) {                                                \
    int64_t rows = planes * g->oh;                                                                 \
    bool par = rows > 1 && (double)rows * (double)(g->ow * g->kh * g->kw) >= NBI_PAR_MIN;          \
    _Pragma("omp parallel for schedule(static) if (par)") for (int64_t r = 0; r < rows; r++) {     \
      int64_t h0 = r % g->oh * g->sh - g->ph;                                                      \
      int64_t hs = h0 < 0 ? 0 : h0, he = h0 + g->kh > g->h ? g->h : h0 + g->kh;                    \
      const T *plane = x + r / g->oh * g->h * g->w;                                                \
      for (int64_t ow = 0; ow < g->ow; ow++) {                                                     \
        int64_t w0 = ow * g->sw - g->pw;                                                           \
        int64_t ws = w0 < 0 ? 0 : w0, we = w0 + g->kw > g->w ? g->w : w0 + g->kw, best = -1;       \
        T m = 0;                                                                                   \
        for (int64_t h = hs; h < he; h++)                                                          \
          for (int64_t w = ws; w < we; w++) {                                                      \
            T v = plane[h * g->w + w];                                                             \
            if (best < 0 || v > m || (v != v && m == m)) {                                         \
              m = v;                                                                               \
              best = h * g->w + w;                                                                 \
            }                                                                                      \
          }                                                                                        \
        idx[r * g->ow + ow] = best;                                                                \
      }                                                                                            \
    }                                                                                              \
  }
DEFINE_POOL_ARGMAX(float)
DEFINE_POOL_ARGMAX(double)

/* dx (planes of H x W) = 0, then dx[plane, idx[o]] += dy[o] for every output
 * o of the plane, in order (overlapping windows accumulate). */
#define DEFINE_POOL_SCATTER(T)                                                                     \
  static void pool_scatter_##T(const int64_t *restrict idx, const T *restrict dy, T *restrict dx,  \
                               int64_t planes, const conv_geom *g) {                               \
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow;                                                 \
    bool par = planes > 1 && planes * (hw + ohw) >= NBI_PAR_MIN;                                   \
    _Pragma("omp parallel for schedule(static) if (par)") for (int64_t p = 0; p < planes; p++) {   \
      T *d = dx + p * hw;                                                                          \
      for (int64_t i = 0; i < hw; i++)                                                             \
        d[i] = 0;                                                                                  \
      for (int64_t o = p * ohw; o < (p + 1) * ohw; o++)                                            \
        if (idx[o] >= 0) d[idx[o]] += dy[o];                                                       \
    }                                                                                              \
  }
DEFINE_POOL_SCATTER(float)
DEFINE_POOL_SCATTER(double)

/* y[o] = g[plane of o, idx[o]] (0 where idx is -1): the transpose of scatter. */
#define DEFINE_POOL_GATHER(T)                                                                      \
  static void pool_gather_##T(const int64_t *restrict idx, const T *restrict src, T *restrict y,   \
                              int64_t planes, const conv_geom *g) {                                \
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow, n = planes * ohw;                               \
    _Pragma("omp parallel for schedule(static) if (n >= NBI_PAR_MIN)") for (int64_t o = 0; o < n;  \
                                                                            o++) {                 \
      y[o] = idx[o] >= 0 ? src[o / ohw * hw + idx[o]] : 0;                                         \
    }                                                                                              \
  }
DEFINE_POOL_GATHER(float)
DEFINE_POOL_GATHER(double)

/* Shared body of MAX_POOL2D_BWD (scatter: in[1] has y's shape, out x's) and
 * MAX_POOL2D_SELECT (gather: in[1] has x's shape, out y's): finds each
 * window's maximum in in[0] x, then moves in[1]'s values through it, in f64
 * when out is f64, else in f32 rounded once. */
static nb_status pool_route(const char *fn, const nb_tensor *node, nbi_view *out,
                            const nbi_view *in, bool scatter) {
  const nbi_view *y = scatter ? &in[1] : out;
  conv_geom g = pool_geom(node, in[0].dims, y->dims);
  int64_t planes = in[0].dims[0] * in[0].dims[1], numel = 1;
  for (int d = 0; d < 4; d++)
    numel *= out->dims[d];
  if (numel == 0) return NB_OK;
  nb_dtype xdt = in[0].dtype == NB_F64 ? NB_F64 : NB_F32;
  nb_dtype dt = out->dtype == NB_F64 ? NB_F64 : NB_F32;
  staged in_c;
  bool ok = stage(fn, in, 2, (nb_dtype[]){xdt, dt}, &in_c);
  const char *x = in_c.p[0], *v = in_c.p[1];
  int64_t *idx = ok ? nbi_cpu_scratch(fn, (size_t)(planes * g.oh * g.ow) * sizeof *idx) : NULL;
  char *res = idx ? out_buffer(fn, out, dt, numel) : NULL;
  nb_status st = res ? NB_OK : NB_ERR_OOM;
  if (st == NB_OK) {
    if (xdt == NB_F64)
      pool_argmax_double((const double *)x, idx, planes, &g);
    else
      pool_argmax_float((const float *)x, idx, planes, &g);
    if (scatter && dt == NB_F64)
      pool_scatter_double(idx, (const double *)v, (double *)res, planes, &g);
    else if (scatter)
      pool_scatter_float(idx, (const float *)v, (float *)res, planes, &g);
    else if (dt == NB_F64)
      pool_gather_double(idx, (const double *)v, (double *)res, planes, &g);
    else
      pool_gather_float(idx, (const float *)v, (float *)res, planes, &g);
  }
  st = out_finish(out, res, dt, st);
  nbi_cpu_scratch_free(idx);
  unstage(&in_c);
  return st;
}

/* in[0] x is (N, C, H, W), in[1] dy is (N, C, OH, OW); out is contiguous dx
 * (N, C, H, W): dy routed to the maximum of each window (0 elsewhere). */
nb_status nbi_cpu_max_pool2d_bwd(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  return pool_route("max_pool2d_bwd", node, out, in, true);
}

/* in[0] x and in[1] g are (N, C, H, W); out is contiguous (N, C, OH, OW): g at
 * the maximum of each window of x. */
nb_status nbi_cpu_max_pool2d_select(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  return pool_route("max_pool2d_select", node, out, in, false);
}
