/* src/ops/nn_conv.c — NN primitives: 2-D convolution and max pooling (NCHW),
 * and the internal ops their derivatives are made of (nn.h).
 *
 * Derivative rules. conv2d is bilinear in (x, w):
 *   dx = bwd_data(dy, w), dw = bwd_filter(x, dy), dbias = sum of dy over N,H,W;
 *   tangent = conv2d(tx, w) + conv2d(x, tw) + tbias.
 * bwd_data and bwd_filter are bilinear too, and each is a transpose of conv2d
 * in one argument, so their rules use the same three ops again:
 *   bwd_data(dy, w):   d/ddy <- conv2d(g, w),   d/dw  <- bwd_filter(g, dy);
 *   bwd_filter(x, dy): d/dx  <- bwd_data(dy, g), d/ddy <- conv2d(x, g).
 * max_pool2d is linear in x between ties, routed through each window's argmax:
 *   dx = pool_bwd(x, dy) (scatter), tangent = pool_select(x, tx) (gather);
 * pool_bwd and pool_select are linear in their second argument and transposes
 * of each other; their x only picks the routes (zero derivative). */
#include "nn.h"
#include "../core/oprules.h"
#include "rule_util.h"

#include <limits.h>

/* Records an error naming fn unless t is a float tensor; `what` names the
 * argument ("input", "weight", "bias"). */
static nb_status require_float(const char *fn, const char *what, const nb_tensor *t) {
  if (nb_dtype_is_float(nb_dtype_of(t))) return NB_OK;
  return nbi_error(NB_ERR_DTYPE, "%s: %s must have a float dtype, got %s", fn, what,
                   nb_dtype_name(nb_dtype_of(t)));
}

/* Records an error naming fn unless t is 4-D; layout describes the dims. */
static nb_status require_4d(const char *fn, const char *what, const char *layout,
                            const nb_tensor *t) {
  nb_shape s = nb_shape_of(t);
  char b[160];
  if (s.ndim == 4) return NB_OK;
  return nbi_error(NB_ERR_SHAPE, "%s: %s must be 4-D %s, got %s", fn, what, layout,
                   nb_shape_str(s, b, sizeof b));
}

/* Output length of a (dilated) window sliding over n inputs padded by p on both
 * sides with stride s, or -1 when the window (span d*(k-1)+1) does not fit. */
static int64_t window_out(int64_t n, int64_t k, int64_t s, int64_t p, int64_t d) {
  int64_t padded = n + 2 * p;
  if (padded < 1 || k - 1 > (padded - 1) / d) return -1;
  return (padded - d * (k - 1) - 1) / s + 1;
}

/* Cross-correlation as PyTorch's conv2d: x [N, C, H, W], w [O, C/G, KH, KW],
 * bias [O] or NULL -> [N, O, OH, OW], OH = (H + 2p - d(KH-1) - 1) / s + 1.
 * CONV2D attrs (k_nn.h): i[0..1] stride, i[2..3] padding, i[4..5] dilation,
 * i[6] groups; 2 inputs, or 3 with the bias. */
nb_tensor *nb_conv2d(nb_tensor *x, nb_tensor *weight, nb_tensor *bias, const nb_conv2d_params *p) {
  const char *fn = "nb_conv2d";
  if (nbi_any_null(fn, (nb_tensor *[]){x, weight}, 2)) return NULL;
  nb_conv2d_params q = p ? *p : (nb_conv2d_params){0};
  const char *names[3] = {"stride", "padding", "dilation"};
  int *vals[3] = {q.stride, q.padding, q.dilation};
  for (int i = 0; i < 3; i++)
    if (vals[i][0] < 0 || vals[i][1] < 0) {
      nbi_error(NB_ERR_ARG, "%s: %s must be >= 0 (0 = default), got %dx%d", fn, names[i],
                vals[i][0], vals[i][1]);
      return NULL;
    }
  if (q.groups < 0) {
    nbi_error(NB_ERR_ARG, "%s: groups must be >= 0 (0 = default 1), got %d", fn, q.groups);
    return NULL;
  }
  nbi_attrs at = {0};
  for (int i = 0; i < 2; i++) {
    at.i[NBI_CONV_STRIDE + i] = q.stride[i] ? q.stride[i] : 1;
    at.i[NBI_CONV_PAD + i] = q.padding[i];
    at.i[NBI_CONV_DILATION + i] = q.dilation[i] ? q.dilation[i] : 1;
  }
  int64_t groups = at.i[NBI_CONV_GROUPS] = q.groups ? q.groups : 1;

  if (require_float(fn, "input", x) || require_float(fn, "weight", weight) ||
      (bias && require_float(fn, "bias", bias)) || require_4d(fn, "input", "[N,C,H,W]", x) ||
      require_4d(fn, "weight", "[O,C/groups,KH,KW]", weight))
    return NULL;
  nb_shape xs = nb_shape_of(x), ws = nb_shape_of(weight);
  char bx[160], bw[160], bb[160];
  nb_shape_str(xs, bx, sizeof bx);
  nb_shape_str(ws, bw, sizeof bw);
  int64_t c = xs.dims[1], o = ws.dims[0];
  if (c % groups || o % groups) {
    nbi_error(NB_ERR_ARG,
              "%s: groups %lld must divide input channels %lld and output "
              "channels %lld (input %s, weight %s)",
              fn, (long long)groups, (long long)c, (long long)o, bx, bw);
    return NULL;
  }
  if (ws.dims[1] != c / groups) {
    nbi_error(NB_ERR_SHAPE,
              "%s: channel mismatch: input %s has %lld channels, weight %s with "
              "groups %lld expects %lld",
              fn, bx, (long long)c, bw, (long long)groups, (long long)(ws.dims[1] * groups));
    return NULL;
  }
  if (ws.dims[2] < 1 || ws.dims[3] < 1) {
    nbi_error(NB_ERR_SHAPE, "%s: kernel size must be positive, weight %s", fn, bw);
    return NULL;
  }
  if (bias) {
    nb_shape bs = nb_shape_of(bias);
    if (bs.ndim != 1 || bs.dims[0] != o) {
      nbi_error(NB_ERR_SHAPE, "%s: bias must be [%lld] for weight %s, got %s", fn, (long long)o, bw,
                nb_shape_str(bs, bb, sizeof bb));
      return NULL;
    }
  }
  int64_t oh = window_out(xs.dims[2], ws.dims[2], at.i[NBI_CONV_STRIDE], at.i[NBI_CONV_PAD],
                          at.i[NBI_CONV_DILATION]);
  int64_t ow = window_out(xs.dims[3], ws.dims[3], at.i[NBI_CONV_STRIDE + 1], at.i[NBI_CONV_PAD + 1],
                          at.i[NBI_CONV_DILATION + 1]);
  if (oh < 0 || ow < 0) {
    nbi_error(NB_ERR_SHAPE,
              "%s: kernel %lldx%lld with dilation %lldx%lld is larger than the "
              "padded input %lldx%lld (input %s, padding %lldx%lld)",
              fn, (long long)ws.dims[2], (long long)ws.dims[3], (long long)at.i[NBI_CONV_DILATION],
              (long long)at.i[NBI_CONV_DILATION + 1],
              (long long)(xs.dims[2] + 2 * at.i[NBI_CONV_PAD]),
              (long long)(xs.dims[3] + 2 * at.i[NBI_CONV_PAD + 1]), bx,
              (long long)at.i[NBI_CONV_PAD], (long long)at.i[NBI_CONV_PAD + 1]);
    return NULL;
  }
  nb_shape out = {.ndim = 4, .dims = {xs.dims[0], o, oh, ow}};
  if (nbi_check_shape(fn, &out)) return NULL;
  nb_dtype dt = nb_promote_types(nb_dtype_of(x), nb_dtype_of(weight));
  if (bias) dt = nb_promote_types(dt, nb_dtype_of(bias));
  return nbi_record(NBI_OP_CONV2D, dt, &out, (nb_tensor *[]){x, weight, bias}, bias ? 3 : 2, &at);
}

/* Max pooling of x [N, C, H, W] by kh x kw windows, stride sh x sw (0 = the
 * kernel), padding ph x pw that counts as -inf (at most half the kernel, as
 * PyTorch) -> [N, C, OH, OW], OH = (H + 2ph - kh) / sh + 1. MAX_POOL2D attrs
 * (k_nn.h): i[0..1] kernel, i[2..3] stride, i[4..5] padding. */
nb_tensor *nb_max_pool2d(nb_tensor *x, int kh, int kw, int sh, int sw, int ph, int pw) {
  const char *fn = "nb_max_pool2d";
  if (nbi_any_null(fn, (nb_tensor *[]){x}, 1)) return NULL;
  if (kh < 1 || kw < 1 || sh < 0 || sw < 0 || ph < 0 || pw < 0) {
    nbi_error(NB_ERR_ARG,
              "%s: kernel %dx%d must be positive, stride %dx%d and padding %dx%d "
              ">= 0",
              fn, kh, kw, sh, sw, ph, pw);
    return NULL;
  }
  if (ph > kh / 2 || pw > kw / 2) {
    nbi_error(NB_ERR_ARG, "%s: padding %dx%d exceeds half the kernel %dx%d", fn, ph, pw, kh, kw);
    return NULL;
  }
  if (require_float(fn, "input", x) || require_4d(fn, "input", "[N,C,H,W]", x)) return NULL;
  nbi_attrs at = {0};
  int64_t k[2] = {kh, kw}, s[2] = {sh ? sh : kh, sw ? sw : kw}, pad[2] = {ph, pw};
  nb_shape xs = nb_shape_of(x), out = xs;
  for (int i = 0; i < 2; i++) {
    at.i[NBI_POOL_KERNEL + i] = k[i];
    at.i[NBI_POOL_STRIDE + i] = s[i];
    at.i[NBI_POOL_PAD + i] = pad[i];
    out.dims[2 + i] = window_out(xs.dims[2 + i], k[i], s[i], pad[i], 1);
  }
  if (out.dims[2] < 0 || out.dims[3] < 0) {
    char bx[160];
    nbi_error(NB_ERR_SHAPE,
              "%s: kernel %dx%d is larger than the padded input %lldx%lld (input "
              "%s, padding %dx%d)",
              fn, kh, kw, (long long)(xs.dims[2] + 2 * ph), (long long)(xs.dims[3] + 2 * pw),
              nb_shape_str(xs, bx, sizeof bx), ph, pw);
    return NULL;
  }
  return nbi_record(NBI_OP_MAX_POOL2D, nb_dtype_of(x), &out, (nb_tensor *[]){x}, 1, &at);
}

/* ---- derivative ops ------------------------------------------------------------------ */

/* Output extent of a CONV2D-family geometry (conv attrs) for an input h x w
 * and kernel kh x kw; -1 where the kernel does not fit. */
static void conv_out_hw(const nbi_attrs *conv, int64_t h, int64_t w, int64_t kh, int64_t kw,
                        int64_t *oh, int64_t *ow) {
  const int64_t *a = conv->i;
  *oh = window_out(h, kh, a[NBI_CONV_STRIDE], a[NBI_CONV_PAD], a[NBI_CONV_DILATION]);
  *ow = window_out(w, kw, a[NBI_CONV_STRIDE + 1], a[NBI_CONV_PAD + 1], a[NBI_CONV_DILATION + 1]);
}

/* The geometry slots of a conv node's attrs (stride, padding, dilation,
 * groups), the rest zero, with (e0, e1) in NBI_CONV_IN_HW / _KERNEL_HW. */
static nbi_attrs conv_attrs_with(const nbi_attrs *conv, int64_t e0, int64_t e1) {
  nbi_attrs at = {0};
  for (int i = NBI_CONV_STRIDE; i <= NBI_CONV_GROUPS; i++)
    at.i[i] = conv->i[i];
  at.i[NBI_CONV_IN_HW] = e0;
  at.i[NBI_CONV_IN_HW + 1] = e1;
  return at;
}

/* The public parameters that give a conv2d node's geometry. */
static nb_conv2d_params conv_params(const nbi_attrs *conv) {
  const int64_t *a = conv->i;
  return (nb_conv2d_params){
      .stride = {(int)a[NBI_CONV_STRIDE], (int)a[NBI_CONV_STRIDE + 1]},
      .padding = {(int)a[NBI_CONV_PAD], (int)a[NBI_CONV_PAD + 1]},
      .dilation = {(int)a[NBI_CONV_DILATION], (int)a[NBI_CONV_DILATION + 1]},
      .groups = (int)a[NBI_CONV_GROUPS],
  };
}

/* Records a shape error naming fn: the two operands do not fit together. */
static nb_status mismatch(const char *fn, const char *what, const nb_tensor *a,
                          const nb_tensor *b) {
  char ba[160], bb[160];
  return nbi_error(NB_ERR_SHAPE, "%s: %s (%s and %s)", fn, what,
                   nb_shape_str(a->shape, ba, sizeof ba), nb_shape_str(b->shape, bb, sizeof bb));
}

nb_tensor *nbi_conv2d_bwd_data(nb_tensor *dy, nb_tensor *w, const nbi_attrs *conv, int64_t h,
                               int64_t width) {
  const char *fn = "conv2d_bwd_data";
  if (nbi_any_null(fn, (nb_tensor *[]){dy, w}, 2)) return NULL;
  if (require_float(fn, "dy", dy) || require_float(fn, "weight", w) ||
      require_4d(fn, "dy", "[N,O,OH,OW]", dy) || require_4d(fn, "weight", "[O,C/groups,KH,KW]", w))
    return NULL;
  int64_t groups = conv->i[NBI_CONV_GROUPS], oh, ow;
  conv_out_hw(conv, h, width, w->shape.dims[2], w->shape.dims[3], &oh, &ow);
  if (groups < 1 || w->shape.dims[0] % groups || dy->shape.dims[1] != w->shape.dims[0] ||
      dy->shape.dims[2] != oh || dy->shape.dims[3] != ow) {
    mismatch(fn, "dy is not the output of a convolution with this weight and input size", dy, w);
    return NULL;
  }
  nbi_attrs at = conv_attrs_with(conv, h, width);
  nb_shape out = {.ndim = 4, .dims = {dy->shape.dims[0], w->shape.dims[1] * groups, h, width}};
  if (nbi_check_shape(fn, &out)) return NULL;
  return nbi_record(NBI_OP_CONV2D_BWD_DATA, nb_promote_types(dy->dtype, w->dtype), &out,
                    (nb_tensor *[]){dy, w}, 2, &at);
}

nb_tensor *nbi_conv2d_bwd_filter(nb_tensor *x, nb_tensor *dy, const nbi_attrs *conv, int64_t kh,
                                 int64_t kw) {
  const char *fn = "conv2d_bwd_filter";
  if (nbi_any_null(fn, (nb_tensor *[]){x, dy}, 2)) return NULL;
  if (require_float(fn, "input", x) || require_float(fn, "dy", dy) ||
      require_4d(fn, "input", "[N,C,H,W]", x) || require_4d(fn, "dy", "[N,O,OH,OW]", dy))
    return NULL;
  int64_t groups = conv->i[NBI_CONV_GROUPS], oh, ow;
  conv_out_hw(conv, x->shape.dims[2], x->shape.dims[3], kh, kw, &oh, &ow);
  if (groups < 1 || kh < 1 || kw < 1 || x->shape.dims[1] % groups || dy->shape.dims[1] % groups ||
      dy->shape.dims[0] != x->shape.dims[0] || dy->shape.dims[2] != oh || dy->shape.dims[3] != ow) {
    mismatch(fn, "dy is not the output of a convolution of this input with this kernel size", x,
             dy);
    return NULL;
  }
  nbi_attrs at = conv_attrs_with(conv, kh, kw);
  nb_shape out = {.ndim = 4, .dims = {dy->shape.dims[1], x->shape.dims[1] / groups, kh, kw}};
  return nbi_record(NBI_OP_CONV2D_BWD_FILTER, nb_promote_types(x->dtype, dy->dtype), &out,
                    (nb_tensor *[]){x, dy}, 2, &at);
}

/* The pooled shape of x for a MAX_POOL2D node's attrs. */
static nb_shape pool_out_shape(const nbi_attrs *pool, const nb_shape *xs) {
  nb_shape out = *xs;
  for (int i = 0; i < 2; i++)
    out.dims[2 + i] = window_out(xs->dims[2 + i], pool->i[NBI_POOL_KERNEL + i],
                                 pool->i[NBI_POOL_STRIDE + i], pool->i[NBI_POOL_PAD + i], 1);
  return out;
}

/* The geometry slots of a pool node's attrs, the rest zero. */
static nbi_attrs pool_attrs(const nbi_attrs *pool) {
  nbi_attrs at = {0};
  for (int i = NBI_POOL_KERNEL; i < NBI_POOL_PAD + 2; i++)
    at.i[i] = pool->i[i];
  return at;
}

/* Checks the operands of the pool derivative ops: x and v float and 4-D, v of
 * the pooled shape (pooled) or of x's shape. */
static bool pool_operands_ok(const char *fn, nb_tensor *x, nb_tensor *v, const nbi_attrs *pool,
                             bool pooled) {
  if (nbi_any_null(fn, (nb_tensor *[]){x, v}, 2)) return false;
  if (require_float(fn, "input", x) || require_float(fn, pooled ? "dy" : "g", v) ||
      require_4d(fn, "input", "[N,C,H,W]", x))
    return false;
  nb_shape want = pooled ? pool_out_shape(pool, &x->shape) : x->shape;
  if (!nbi_shape_eq(&want, &v->shape)) {
    mismatch(fn,
             pooled ? "dy must have the pooled shape of the input"
                    : "g must have the shape of the input",
             x, v);
    return false;
  }
  return true;
}

nb_tensor *nbi_max_pool2d_bwd(nb_tensor *x, nb_tensor *dy, const nbi_attrs *pool) {
  if (!pool_operands_ok("max_pool2d_bwd", x, dy, pool, true)) return NULL;
  nbi_attrs at = pool_attrs(pool);
  return nbi_record(NBI_OP_MAX_POOL2D_BWD, dy->dtype, &x->shape, (nb_tensor *[]){x, dy}, 2, &at);
}

nb_tensor *nbi_max_pool2d_select(nb_tensor *x, nb_tensor *g, const nbi_attrs *pool) {
  if (!pool_operands_ok("max_pool2d_select", x, g, pool, false)) return NULL;
  nbi_attrs at = pool_attrs(pool);
  nb_shape out = pool_out_shape(pool, &x->shape);
  return nbi_record(NBI_OP_MAX_POOL2D_SELECT, g->dtype, &out, (nb_tensor *[]){x, g}, 2, &at);
}

/* ---- rules ------------------------------------------------------------------------------ */

/* Fits cotangent g to input x into *slot; the status of a failed op otherwise. */
static nb_status put_grad(nb_tensor **slot, nb_tensor *g, const nb_tensor *x) {
  *slot = g ? nbi_grad_fit(g, x) : NULL;
  return *slot ? NB_OK : nb_last_status();
}

/* a + b, the terms of a tangent, cast to y's dtype. a_ok / b_ok tell whether
 * a term was computed (its tangent input is non-NULL): a NULL term that was is
 * a failed op. NULL for zero, or on failure (error recorded). */
static nb_tensor *sum_terms(nb_tensor *y, nb_tensor *a, bool a_ok, nb_tensor *b, bool b_ok) {
  if ((a_ok && !a) || (b_ok && !b)) return NULL;
  nb_tensor *t = nbi_add_maybe(a, b);
  if (t && t->dtype != y->dtype) t = nb_cast(t, y->dtype);
  return t;
}

/* y = conv2d(x, w[, bias]). */
static nb_status conv2d_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  nb_tensor *x = y->in[0], *w = y->in[1];
  nb_status st = NB_OK;
  if (need[0])
    st = put_grad(&gin[0],
                  nbi_conv2d_bwd_data(gy, w, &y->attrs, x->shape.dims[2], x->shape.dims[3]), x);
  if (!st && need[1])
    st = put_grad(&gin[1],
                  nbi_conv2d_bwd_filter(x, gy, &y->attrs, w->shape.dims[2], w->shape.dims[3]), w);
  if (!st && y->n_in == 3 && need[2])
    st = put_grad(&gin[2], nb_sum(gy, NB_AXES(0, 2, 3), false), y->in[2]);
  return st;
}

static nb_tensor *conv2d_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_conv2d_params p = conv_params(&y->attrs);
  nb_tensor *a = tin[0] ? nb_conv2d(tin[0], y->in[1], NULL, &p) : NULL;
  nb_tensor *b = tin[1] ? nb_conv2d(y->in[0], tin[1], NULL, &p) : NULL;
  nb_tensor *t = sum_terms(y, a, tin[0], b, tin[1]);
  if (y->n_in < 3 || !tin[2] || ((tin[0] || tin[1]) && !t)) return t;
  nb_tensor *tb = nb_reshape(tin[2], NB_SHAPE(1, y->shape.dims[1], 1, 1));
  t = t ? nb_add(t, tb) : nb_broadcast_to(tb, y->shape);
  return t && t->dtype != y->dtype ? nb_cast(t, y->dtype) : t;
}

/* y = bwd_data(dy, w): dx of an input of the attrs' size. */
static nb_status bwd_data_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  nb_tensor *dy = y->in[0], *w = y->in[1];
  nb_conv2d_params p = conv_params(&y->attrs);
  nb_status st = NB_OK;
  if (need[0]) st = put_grad(&gin[0], nb_conv2d(gy, w, NULL, &p), dy);
  if (!st && need[1])
    st = put_grad(&gin[1],
                  nbi_conv2d_bwd_filter(gy, dy, &y->attrs, w->shape.dims[2], w->shape.dims[3]), w);
  return st;
}

static nb_tensor *bwd_data_jvp(nb_tensor *y, nb_tensor *const *tin) {
  int64_t h = y->shape.dims[2], w = y->shape.dims[3];
  nb_tensor *a = tin[0] ? nbi_conv2d_bwd_data(tin[0], y->in[1], &y->attrs, h, w) : NULL;
  nb_tensor *b = tin[1] ? nbi_conv2d_bwd_data(y->in[0], tin[1], &y->attrs, h, w) : NULL;
  return sum_terms(y, a, tin[0], b, tin[1]);
}

/* y = bwd_filter(x, dy): dw of a kernel of the attrs' size. */
static nb_status bwd_filter_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  nb_tensor *x = y->in[0], *dy = y->in[1];
  nb_conv2d_params p = conv_params(&y->attrs);
  nb_status st = NB_OK;
  if (need[0])
    st = put_grad(&gin[0],
                  nbi_conv2d_bwd_data(dy, gy, &y->attrs, x->shape.dims[2], x->shape.dims[3]), x);
  if (!st && need[1]) st = put_grad(&gin[1], nb_conv2d(x, gy, NULL, &p), dy);
  return st;
}

static nb_tensor *bwd_filter_jvp(nb_tensor *y, nb_tensor *const *tin) {
  int64_t kh = y->shape.dims[2], kw = y->shape.dims[3];
  nb_tensor *a = tin[0] ? nbi_conv2d_bwd_filter(tin[0], y->in[1], &y->attrs, kh, kw) : NULL;
  nb_tensor *b = tin[1] ? nbi_conv2d_bwd_filter(y->in[0], tin[1], &y->attrs, kh, kw) : NULL;
  return sum_terms(y, a, tin[0], b, tin[1]);
}

/* y = max_pool2d(x). */
static nb_status pool_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  return put_grad(&gin[0], nbi_max_pool2d_bwd(y->in[0], gy, &y->attrs), y->in[0]);
}

static nb_tensor *pool_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return sum_terms(y, nbi_max_pool2d_select(y->in[0], tin[0], &y->attrs), true, NULL, false);
}

/* y = pool_bwd(x, dy) and y = pool_select(x, g): linear in in[1], each the
 * other's transpose; x only picks the routes, so it gets no derivative. */
static nb_status pool_bwd_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[1]) return NB_OK;
  return put_grad(&gin[1], nbi_max_pool2d_select(y->in[0], gy, &y->attrs), y->in[1]);
}

static nb_tensor *pool_bwd_jvp(nb_tensor *y, nb_tensor *const *tin) {
  if (!tin[1]) return NULL;
  return sum_terms(y, nbi_max_pool2d_bwd(y->in[0], tin[1], &y->attrs), true, NULL, false);
}

static nb_status pool_select_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[1]) return NB_OK;
  return put_grad(&gin[1], nbi_max_pool2d_bwd(y->in[0], gy, &y->attrs), y->in[1]);
}

static nb_tensor *pool_select_jvp(nb_tensor *y, nb_tensor *const *tin) {
  if (!tin[1]) return NULL;
  return sum_terms(y, nbi_max_pool2d_select(y->in[0], tin[1], &y->attrs), true, NULL, false);
}

/* ---- batching rules ------------------------------------------------------------------------
 * The batch is folded into what the primitives already loop over, so every
 * rule is one op on the whole batch:
 * - batched activations (x, dy, g) with shared weights: the batch joins N,
 *   (B, N, ...) -> (B*N, ...), one op, reshaped back (fold_n, as_batched);
 * - batched weights (per-example filters: vmap over an ensemble, or the
 *   filter gradients of vmap(grad(cnn))): the examples become channel groups
 *   of one grouped convolution. With G groups per example, a channel axis of
 *   G*k channels becomes G*B*k arranged (G, B, k) (merge_chan), so group
 *   g*B + b of the big op is group g of example b; the result's channel axis
 *   is split back the same way (split_chan). An operand that is the same for
 *   every example keeps its G groups and is not copied: its group g meets all
 *   B examples' channels of group g at once. In conv2d_bwd_filter this keeps
 *   the sum over N per example, since examples never share a group. */

/* The batched shape of y: (B, *y). */
static nb_shape batch_shape(const nb_tensor *y, int64_t B) {
  nb_shape s = {.ndim = y->shape.ndim + 1, .dims = {B}};
  memcpy(s.dims + 1, y->shape.dims, sizeof(int64_t) * (size_t)y->shape.ndim);
  return s;
}

/* r reshaped to y's batched shape. */
static nb_tensor *as_batched(nb_tensor *r, const nb_tensor *y, int64_t B) {
  return r ? nb_reshape(r, batch_shape(y, B)) : NULL;
}

/* (B, N, ...) -> (B*N, ...); an unbatched t is broadcast along B first. */
static nb_tensor *fold_n(nb_tensor *t, bool batched, int64_t B) {
  if (!(t = nbi_bat_expand(t, batched, B))) return NULL;
  nb_shape s = {.ndim = t->shape.ndim - 1, .dims = {B * t->shape.dims[1]}};
  memcpy(s.dims + 1, t->shape.dims + 2, sizeof(int64_t) * (size_t)(s.ndim - 1));
  return nb_reshape(t, s);
}

/* Batched t (B, ...) whose per-example axis ax holds G*k channels -> the
 * unbatched layout with G*B*k channels there, arranged (G, B, k). */
static nb_tensor *merge_chan(nb_tensor *t, int ax, int64_t G, int64_t B) {
  if (!t) return NULL;
  nb_shape s = t->shape, r = {.ndim = s.ndim + 1}, m = {.ndim = s.ndim - 1};
  for (int d = 0; d < s.ndim; d++)
    r.dims[d + (d > ax + 1)] = s.dims[d];
  r.dims[ax + 1] = G;
  r.dims[ax + 2] = s.dims[ax + 1] / G;
  for (int d = 1; d < s.ndim; d++)
    m.dims[d - 1] = s.dims[d];
  m.dims[ax] = B * s.dims[ax + 1];
  return nb_reshape(nbi_bat_moveaxis(nb_reshape(t, r), 0, ax + 1), m);
}

/* The inverse: t whose axis ax holds G*B*k channels arranged (G, B, k) ->
 * (B, ...) with G*k channels there. */
static nb_tensor *split_chan(nb_tensor *t, int ax, int64_t G, int64_t B) {
  if (!t) return NULL;
  nb_shape s = t->shape, r = {.ndim = s.ndim + 2}, m = {.ndim = s.ndim + 1, .dims = {B}};
  for (int d = 0; d < s.ndim; d++) {
    r.dims[d + (d > ax ? 2 : 0)] = s.dims[d];
    m.dims[d + 1] = s.dims[d];
  }
  r.dims[ax] = G;
  r.dims[ax + 1] = B;
  r.dims[ax + 2] = s.dims[ax] / (G * B);
  m.dims[ax + 1] = s.dims[ax] / B;
  return nb_reshape(nbi_bat_moveaxis(nb_reshape(t, r), ax + 1, 0), m);
}

/* The batched value of y for an empty batch (B == 0), where a fold or a
 * grouping by B has nothing to run. */
static nb_tensor *empty_batch(const nb_tensor *y) { return nb_zeros(batch_shape(y, 0), y->dtype); }

/* y = conv2d(x, w[, bias]). A shared bias goes into the op when the batch is
 * folded into N; otherwise the bias, (O) or batched (B, O), is added to the
 * batched result. */
static nb_tensor *conv2d_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  if (B == 0) return empty_batch(y);
  nb_conv2d_params p = conv_params(&y->attrs);
  nb_tensor *bias = y->n_in == 3 ? bin[2] : NULL, *r;
  int64_t G = p.groups, o = y->shape.dims[1];
  if (batched[1]) {
    nb_tensor *x = bin[0];
    if (batched[0]) {
      if (G * B > INT_MAX) {
        nbi_error(NB_ERR_SHAPE,
                  "nb_vmap: conv2d with per-example weights: %lld groups x batch "
                  "%lld is too many groups",
                  (long long)G, (long long)B);
        return NULL;
      }
      x = merge_chan(x, 1, G, B);
      p.groups = (int)(G * B);
    }
    r = split_chan(nb_conv2d(x, merge_chan(bin[1], 0, G, B), NULL, &p), 1, G, B);
  } else if (batched[0]) {
    bool shared = bias && !batched[2];
    r = as_batched(nb_conv2d(fold_n(bin[0], true, B), bin[1], shared ? bias : NULL, &p), y, B);
    if (shared) return r;
  } else {
    r = nb_conv2d(bin[0], bin[1], NULL, &p); /* only the bias is batched */
  }
  if (!bias || !r) return r;
  nb_shape bs = batched[2] ? (nb_shape){.ndim = 5, .dims = {B, 1, o, 1, 1}}
                           : (nb_shape){.ndim = 3, .dims = {o, 1, 1}};
  return nb_add(r, nb_reshape(bias, bs));
}

/* y = bwd_data(dy, w). Per-example w with a shared dy: w's examples stack
 * on its input-channel axis, (O, B*C/G) per group, and dx comes out with
 * G*B*C/G channels. */
static nb_tensor *bwd_data_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                int64_t B) {
  if (B == 0) return empty_batch(y);
  int64_t h = y->shape.dims[2], wd = y->shape.dims[3], G = y->attrs.i[NBI_CONV_GROUPS];
  if (!batched[1])
    return as_batched(nbi_conv2d_bwd_data(fold_n(bin[0], true, B), bin[1], &y->attrs, h, wd), y, B);
  nbi_attrs at = y->attrs;
  nb_tensor *dy = bin[0], *w;
  if (batched[0]) {
    dy = merge_chan(dy, 1, G, B);
    w = merge_chan(bin[1], 0, G, B);
    at.i[NBI_CONV_GROUPS] = G * B;
  } else {
    w = merge_chan(bin[1], 1, 1, B);
  }
  return split_chan(nbi_conv2d_bwd_data(dy, w, &at, h, wd), 1, G, B);
}

/* y = bwd_filter(x, dy), always a batch of filters: with dy batched the
 * examples are groups of output rows (axis 0), with only x batched they
 * are columns of each group's input channels (axis 1). */
static nb_tensor *bwd_filter_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                  int64_t B) {
  if (B == 0) return empty_batch(y);
  int64_t G = y->attrs.i[NBI_CONV_GROUPS];
  nbi_attrs at = y->attrs;
  nb_tensor *x = batched[0] ? merge_chan(bin[0], 1, G, B) : bin[0];
  nb_tensor *dy = batched[1] ? merge_chan(bin[1], 1, G, B) : bin[1];
  if (batched[0] && batched[1]) at.i[NBI_CONV_GROUPS] = G * B;
  nb_tensor *r = nbi_conv2d_bwd_filter(x, dy, &at, y->shape.dims[2], y->shape.dims[3]);
  return batched[1] ? split_chan(r, 0, G, B) : split_chan(r, 1, 1, B);
}

/* Pooling works per image and channel: the batch folds into N. */
static nb_tensor *pool_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  (void)batched;
  if (B == 0) return empty_batch(y);
  const int64_t *a = y->attrs.i;
  return as_batched(nb_max_pool2d(fold_n(bin[0], true, B), (int)a[NBI_POOL_KERNEL],
                                  (int)a[NBI_POOL_KERNEL + 1], (int)a[NBI_POOL_STRIDE],
                                  (int)a[NBI_POOL_STRIDE + 1], (int)a[NBI_POOL_PAD],
                                  (int)a[NBI_POOL_PAD + 1]),
                    y, B);
}

static nb_tensor *pool_bwd_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                int64_t B) {
  if (B == 0) return empty_batch(y);
  return as_batched(
      nbi_max_pool2d_bwd(fold_n(bin[0], batched[0], B), fold_n(bin[1], batched[1], B), &y->attrs),
      y, B);
}

static nb_tensor *pool_select_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                   int64_t B) {
  if (B == 0) return empty_batch(y);
  return as_batched(nbi_max_pool2d_select(fold_n(bin[0], batched[0], B),
                                          fold_n(bin[1], batched[1], B), &y->attrs),
                    y, B);
}

const nbi_op_def nbi_opdef_CONV2D = {
    .name = "conv2d", .arity = -1, .vjp = conv2d_vjp, .jvp = conv2d_jvp, .vmap = conv2d_vmap};
const nbi_op_def nbi_opdef_CONV2D_BWD_DATA = {.name = "conv2d_bwd_data",
                                              .arity = 2,
                                              .vjp = bwd_data_vjp,
                                              .jvp = bwd_data_jvp,
                                              .vmap = bwd_data_vmap};
const nbi_op_def nbi_opdef_CONV2D_BWD_FILTER = {.name = "conv2d_bwd_filter",
                                                .arity = 2,
                                                .vjp = bwd_filter_vjp,
                                                .jvp = bwd_filter_jvp,
                                                .vmap = bwd_filter_vmap};
const nbi_op_def nbi_opdef_MAX_POOL2D = {
    .name = "max_pool2d", .arity = 1, .vjp = pool_vjp, .jvp = pool_jvp, .vmap = pool_vmap};
const nbi_op_def nbi_opdef_MAX_POOL2D_BWD = {.name = "max_pool2d_bwd",
                                             .arity = 2,
                                             .vjp = pool_bwd_vjp,
                                             .jvp = pool_bwd_jvp,
                                             .vmap = pool_bwd_vmap};
const nbi_op_def nbi_opdef_MAX_POOL2D_SELECT = {.name = "max_pool2d_select",
                                                .arity = 2,
                                                .vjp = pool_select_vjp,
                                                .jvp = pool_select_jvp,
                                                .vmap = pool_select_vmap};
