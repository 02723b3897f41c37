/* src/ops/nn_conv.c — NN primitives: 2-D convolution and max pooling (NCHW). */
#include "../backends/cpu/k_nn.h"

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

const nbi_op_def nbi_opdef_CONV2D = {
    .name = "conv2d", .arity = -1, .cpu = nbi_cpu_conv2d, .view = NULL};

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

const nbi_op_def nbi_opdef_MAX_POOL2D = {
    .name = "max_pool2d", .arity = 1, .cpu = nbi_cpu_max_pool2d, .view = NULL};
