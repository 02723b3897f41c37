/* src/ops/shape.c — shapes and views.
 *
 * Primitives: reshape, permute, broadcast_to, slice and flip are views: their
 * view fn gives a strided window of the input's buffer, so realization aliases
 * it (reshape only when the strides allow, as NumPy's attempt_nocopy_reshape;
 * otherwise its kernel copies). concat and pad have kernels. Everything else
 * (transpose, squeeze, unsqueeze, flatten, stack, split, repeat, tile) is
 * composed of these at record time, so it differentiates through them.
 *
 * Autodiff: every primitive here is linear, so each VJP is the transpose map
 * and each JVP applies the op itself to the tangent. The rules use only these
 * shape ops (and sum for broadcast_to), so they differentiate again.
 *
 * Batching (vmap): each rule applies the op once to the whole batch (batch dim
 * 0, nbi.h) with its per-example arguments moved past the batch dim: shapes
 * get B in front, axes +1, permutations keep 0 first, slices and pads take the
 * whole batch dim, concat expands its unbatched parts. */
#include "../core/nbi.h"
#include "../core/oprules.h"

#include <stdlib.h>

#include "rule_util.h"

#define SHAPE_STR_CAP 160

/* The status a VJP rule returns after computing r: NB_OK, or the recorded
 * error when an op on the way failed (r is NULL). */
static nb_status rule_status(const nb_tensor *r) { return r ? NB_OK : nb_last_status(); }

/* (B, *s): a per-example shape with the batch dim in front; an error when that
 * exceeds the maximum rank. */
static nb_status batched_shape(int64_t B, const nb_shape *s, nb_shape *out) {
  if (s->ndim + 1 > NB_MAX_DIMS)
    return nbi_error(NB_ERR_SHAPE,
                     "nb_vmap: a batched value would have rank %d (the maximum is %d)", s->ndim + 1,
                     NB_MAX_DIMS);
  *out = (nb_shape){.ndim = s->ndim + 1, .dims = {B}};
  memcpy(out->dims + 1, s->dims, sizeof(int64_t) * (size_t)s->ndim);
  return NB_OK;
}

/* ---- reshape ---------------------------------------------------------------------- */

/* Fills out with s where the one -1 (if any) is inferred from from's numel;
 * records an error naming fn when s is malformed or the numel differs. */
static nb_status resolve_reshape(const char *fn, const nb_shape *from, nb_shape s, nb_shape *out) {
  char a[SHAPE_STR_CAP], b[SHAPE_STR_CAP];
  if (s.ndim < 0 || s.ndim > NB_MAX_DIMS)
    return nbi_error(NB_ERR_SHAPE, "%s: rank %d outside [0, %d]", fn, s.ndim, NB_MAX_DIMS);
  int infer = -1;
  nb_shape known = s;
  for (int d = 0; d < s.ndim; d++) {
    if (s.dims[d] == -1) {
      if (infer >= 0)
        return nbi_error(NB_ERR_SHAPE, "%s: more than one -1 in %s", fn,
                         nb_shape_str(s, a, sizeof a));
      infer = d;
      known.dims[d] = 1;
    } else if (s.dims[d] < 0) {
      return nbi_error(NB_ERR_SHAPE, "%s: negative dimension in %s", fn,
                       nb_shape_str(s, a, sizeof a));
    }
  }
  int64_t have = nbi_numel(from), k = nbi_numel(&known);
  if (infer >= 0 && k == 0)
    return nbi_error(NB_ERR_SHAPE, "%s: cannot infer the -1 in %s: the other dims hold 0 elements",
                     fn, nb_shape_str(s, a, sizeof a));
  if (infer >= 0 && k > 0 && have % k == 0)
    known.dims[infer] = have / k;
  else if (infer >= 0 || k != have)
    return nbi_error(NB_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) into %s", fn,
                     nb_shape_str(*from, a, sizeof a), (long long)have,
                     nb_shape_str(s, b, sizeof b));
  *out = known;
  return NB_OK;
}

/* Records a reshape of t into s (already resolved and validated). */
static nb_tensor *record_reshape(nb_tensor *t, const nb_shape *s) {
  return nbi_record(NBI_OP_RESHAPE, t->dtype, s, &t, 1, NULL);
}

/* Strides for viewing `in` (numel > 0) with dims nd[0..nnd) without copying, as
 * NumPy's _attempt_nocopy_reshape: size-1 input dims are dropped, then each
 * group of input dims whose product equals a group of output dims must be
 * contiguous within itself. Returns false when no such strides exist. */
static bool nocopy_strides(const nbi_view *in, int nnd, const int64_t *nd, int64_t *ns) {
  int64_t od[NB_MAX_DIMS], os[NB_MAX_DIMS];
  int ond = 0;
  for (int d = 0; d < in->ndim; d++) {
    if (in->dims[d] == 1) continue;
    od[ond] = in->dims[d];
    os[ond++] = in->strides[d];
  }
  int oi = 0, oj = 1, ni = 0, nj = 1;
  while (ni < nnd && oi < ond) {
    int64_t np = nd[ni], op = od[oi];
    while (np != op) {
      if (np < op)
        np *= nd[nj++];
      else
        op *= od[oj++];
    }
    for (int ok = oi; ok < oj - 1; ok++)
      if (os[ok] != od[ok + 1] * os[ok + 1]) return false;
    ns[nj - 1] = os[oj - 1];
    for (int nk = nj - 1; nk > ni; nk--)
      ns[nk - 1] = ns[nk] * nd[nk];
    ni = nj++;
    oi = oj++;
  }
  int64_t last = ni >= 1 ? ns[ni - 1] : 1;
  for (int nk = ni; nk < nnd; nk++)
    ns[nk] = last;
  return true;
}

/* reshape view: empty tensors always alias (no element is read). */
static bool reshape_view(const nb_tensor *n, const nbi_view *in, nbi_view *out) {
  out->data = in->data;
  if (nbi_numel(&n->shape) == 0) {
    nbi_contig_strides(&n->shape, out->strides);
    return true;
  }
  return nocopy_strides(in, out->ndim, out->dims, out->strides);
}

nb_tensor *nb_reshape(nb_tensor *t, nb_shape s) {
  if (nbi_any_null("nb_reshape", &t, 1)) return NULL;
  nb_shape out;
  if (resolve_reshape("nb_reshape", &t->shape, s, &out)) return NULL;
  return record_reshape(t, &out);
}

nb_tensor *nb_squeeze(nb_tensor *t, nb_axes axes) {
  if (nbi_any_null("nb_squeeze", &t, 1)) return NULL;
  uint32_t mask;
  if (nbi_axes_mask("nb_squeeze", axes, t->shape.ndim, &mask)) return NULL;
  nb_shape s = {0};
  for (int d = 0; d < t->shape.ndim; d++) {
    if (axes.n == -1 && t->shape.dims[d] != 1) mask &= ~(1u << d);
    if ((mask & (1u << d)) && t->shape.dims[d] != 1) {
      char a[SHAPE_STR_CAP];
      nbi_error(NB_ERR_SHAPE, "nb_squeeze: axis %d of %s has size %lld, not 1", d,
                nb_shape_str(t->shape, a, sizeof a), (long long)t->shape.dims[d]);
      return NULL;
    }
    if (!(mask & (1u << d))) s.dims[s.ndim++] = t->shape.dims[d];
  }
  return record_reshape(t, &s);
}

nb_tensor *nb_unsqueeze(nb_tensor *t, int axis) {
  if (nbi_any_null("nb_unsqueeze", &t, 1)) return NULL;
  int nd = t->shape.ndim, a;
  if (nd == NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "nb_unsqueeze: tensor already has the maximum rank %d", NB_MAX_DIMS);
    return NULL;
  }
  if (nbi_norm_axis("nb_unsqueeze", axis, nd + 1, &a)) return NULL;
  nb_shape s = {.ndim = nd + 1};
  for (int d = 0, k = 0; d <= nd; d++)
    s.dims[d] = d == a ? 1 : t->shape.dims[k++];
  return record_reshape(t, &s);
}

nb_tensor *nb_flatten(nb_tensor *t, int start_axis, int end_axis) {
  if (nbi_any_null("nb_flatten", &t, 1)) return NULL;
  int nd = t->shape.ndim, s0, e0;
  /* a 0-d tensor flattens to [1]; axes 0 and -1 name its one implicit dim */
  if (nbi_norm_axis("nb_flatten", start_axis, nd ? nd : 1, &s0) ||
      nbi_norm_axis("nb_flatten", end_axis, nd ? nd : 1, &e0))
    return NULL;
  if (s0 > e0) {
    nbi_error(NB_ERR_AXIS, "nb_flatten: start_axis %d comes after end_axis %d", start_axis,
              end_axis);
    return NULL;
  }
  nb_shape s = {.ndim = 1, .dims = {1}};
  if (nd > 0) {
    s.ndim = 0;
    for (int d = 0; d < nd; d++) {
      if (d <= s0 || d > e0)
        s.dims[s.ndim++] = t->shape.dims[d];
      else
        s.dims[s.ndim - 1] *= t->shape.dims[d];
    }
  }
  return record_reshape(t, &s);
}

/* y = reshape(x): gx = reshape(gy, x.shape); ty = reshape(tx, y.shape). */
static nb_status reshape_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = nb_reshape(gy, y->in[0]->shape);
  return rule_status(gin[0]);
}

static nb_tensor *reshape_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return nb_reshape(tin[0], y->shape);
}

/* Batched: reshape (B, *x.shape) into (B, *y.shape). */
static nb_tensor *reshape_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                               int64_t B) {
  (void)batched;
  nb_shape s;
  return batched_shape(B, &y->shape, &s) ? NULL : nb_reshape(bin[0], s);
}

const nbi_op_def nbi_opdef_RESHAPE = {.name = "reshape",
                                      .arity = 1,
                                      .view = reshape_view,
                                      .vjp = reshape_vjp,
                                      .jvp = reshape_jvp,
                                      .vmap = reshape_vmap};

/* ---- permute ---------------------------------------------------------------------- */

/* attrs.i[d] = the input axis that output axis d reads. */
static bool permute_view(const nb_tensor *n, const nbi_view *in, nbi_view *out) {
  out->data = in->data;
  for (int d = 0; d < out->ndim; d++)
    out->strides[d] = in->strides[n->attrs.i[d]];
  return true;
}

static nb_tensor *record_permute(nb_tensor *t, const int *perm) {
  nbi_attrs at = {0};
  nb_shape s = {.ndim = t->shape.ndim};
  for (int d = 0; d < s.ndim; d++) {
    at.i[d] = perm[d];
    s.dims[d] = t->shape.dims[perm[d]];
  }
  return nbi_record(NBI_OP_PERMUTE, t->dtype, &s, &t, 1, &at);
}

nb_tensor *nb_permute(nb_tensor *t, nb_axes perm) {
  if (nbi_any_null("nb_permute", &t, 1)) return NULL;
  if (perm.n != t->shape.ndim) {
    nbi_error(NB_ERR_AXIS, "nb_permute: perm lists %d axes but the tensor has rank %d", perm.n,
              t->shape.ndim);
    return NULL;
  }
  uint32_t mask;
  if (nbi_axes_mask("nb_permute", perm, t->shape.ndim, &mask)) return NULL;
  int p[NB_MAX_DIMS];
  for (int d = 0; d < perm.n; d++)
    p[d] = perm.v[d] < 0 ? perm.v[d] + perm.n : perm.v[d];
  return record_permute(t, p);
}

nb_tensor *nb_transpose(nb_tensor *t) {
  if (nbi_any_null("nb_transpose", &t, 1)) return NULL;
  int nd = t->shape.ndim;
  if (nd < 2) {
    char a[SHAPE_STR_CAP];
    nbi_error(NB_ERR_SHAPE, "nb_transpose: needs rank >= 2, got shape %s",
              nb_shape_str(t->shape, a, sizeof a));
    return NULL;
  }
  int p[NB_MAX_DIMS];
  for (int d = 0; d < nd; d++)
    p[d] = d;
  p[nd - 2] = nd - 1;
  p[nd - 1] = nd - 2;
  return record_permute(t, p);
}

/* y = permute(x, p) with y axis d = x axis p[d]: gx = permute(gy, p^-1), where
 * p^-1[p[d]] = d; ty = permute(tx, p). */
static nb_status permute_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  nb_axes inv = {.n = y->shape.ndim};
  for (int d = 0; d < inv.n; d++)
    inv.v[y->attrs.i[d]] = d;
  gin[0] = nb_permute(gy, inv);
  return rule_status(gin[0]);
}

static nb_tensor *permute_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_axes p = {.n = y->shape.ndim};
  for (int d = 0; d < p.n; d++)
    p.v[d] = (int)y->attrs.i[d];
  return nb_permute(tin[0], p);
}

/* Batched: the batch dim stays first, every other axis moves as in y. */
static nb_tensor *permute_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                               int64_t B) {
  (void)batched, (void)B;
  nb_axes p = {.n = y->shape.ndim + 1};
  for (int d = 0; d < y->shape.ndim; d++)
    p.v[d + 1] = (int)y->attrs.i[d] + 1;
  return nb_permute(bin[0], p);
}

const nbi_op_def nbi_opdef_PERMUTE = {.name = "permute",
                                      .arity = 1,
                                      .view = permute_view,
                                      .vjp = permute_vjp,
                                      .jvp = permute_jvp,
                                      .vmap = permute_vmap};

/* ---- broadcast_to ----------------------------------------------------------------- */

/* Broadcast dims get stride 0; the target shape is the node's shape. */
static bool broadcast_view(const nb_tensor *n, const nbi_view *in, nbi_view *out) {
  nbi_view b = nbi_view_broadcast(in, &n->shape);
  out->data = b.data;
  memcpy(out->strides, b.strides, sizeof out->strides);
  return true;
}

static nb_tensor *record_broadcast(nb_tensor *t, const nb_shape *s) {
  return nbi_record(NBI_OP_BROADCAST_TO, t->dtype, s, &t, 1, NULL);
}

nb_tensor *nb_broadcast_to(nb_tensor *t, nb_shape s) {
  if (nbi_any_null("nb_broadcast_to", &t, 1)) return NULL;
  if (nbi_check_shape("nb_broadcast_to", &s)) return NULL;
  int lead = s.ndim - t->shape.ndim;
  bool ok = lead >= 0;
  for (int d = 0; d < t->shape.ndim && ok; d++)
    ok = t->shape.dims[d] == 1 || t->shape.dims[d] == s.dims[d + lead];
  if (!ok) {
    char a[SHAPE_STR_CAP], b[SHAPE_STR_CAP];
    nbi_error(NB_ERR_SHAPE, "nb_broadcast_to: cannot broadcast %s to %s",
              nb_shape_str(t->shape, a, sizeof a), nb_shape_str(s, b, sizeof b));
    return NULL;
  }
  return record_broadcast(t, &s);
}

/* y = broadcast_to(x, s): gx = gy summed over the added and stretched dims;
 * ty = broadcast_to(tx, s). */
static nb_status broadcast_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = nbi_sum_to(gy, &y->in[0]->shape);
  return rule_status(gin[0]);
}

static nb_tensor *broadcast_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return nb_broadcast_to(tin[0], y->shape);
}

/* Batched: the leading dims broadcasting adds go after the batch dim
 * (nbi_bat_align), then (B, 1.., *x.shape) broadcasts to (B, *y.shape). */
static nb_tensor *broadcast_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                 int64_t B) {
  (void)batched;
  nb_shape s;
  if (batched_shape(B, &y->shape, &s)) return NULL;
  return nb_broadcast_to(nbi_bat_align(bin[0], true, y->shape.ndim), s);
}

const nbi_op_def nbi_opdef_BROADCAST_TO = {.name = "broadcast_to",
                                           .arity = 1,
                                           .view = broadcast_view,
                                           .vjp = broadcast_vjp,
                                           .jvp = broadcast_jvp,
                                           .vmap = broadcast_vmap};

/* ---- slice ------------------------------------------------------------------------ */

/* attrs.i[d] = first index along d (0 when the result is empty),
 * attrs.i[NB_MAX_DIMS + d] = step along d; the node's dims are the counts. */
static bool slice_view(const nb_tensor *n, const nbi_view *in, nbi_view *out) {
  int64_t off = 0;
  for (int d = 0; d < out->ndim; d++) {
    off += n->attrs.i[d] * in->strides[d];
    out->strides[d] = in->strides[d] * n->attrs.i[NB_MAX_DIMS + d];
  }
  out->data = in->data + off * (int64_t)nb_dtype_size(in->dtype);
  return true;
}

/* Records t[starts[d] :: steps[d]] with counts[d] elements per dim (resolved). */
static nb_tensor *record_slice(nb_tensor *t, const int64_t *starts, const int64_t *steps,
                               const int64_t *counts) {
  nbi_attrs at = {0};
  nb_shape s = {.ndim = t->shape.ndim};
  memcpy(s.dims, counts, sizeof(int64_t) * (size_t)s.ndim);
  bool empty = nbi_numel(&s) == 0;
  for (int d = 0; d < s.ndim; d++) {
    at.i[d] = empty ? 0 : starts[d];
    /* a dim of at most one element never steps: step 1 keeps its stride (and
     * stride * step) within the input's extent, whatever step was asked */
    at.i[NB_MAX_DIMS + d] = counts[d] <= 1 ? 1 : steps[d];
  }
  return nbi_record(NBI_OP_SLICE, t->dtype, &s, &t, 1, &at);
}

/* Python's slice.indices for a dim of size n: normalizes *start and returns the
 * element count. NB_END as stop with a negative step runs through index 0. */
static int64_t slice_count(int64_t n, int64_t *start, int64_t stop, int64_t step) {
  int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
  int64_t b = *start, e = stop;
  if (b < 0)
    b = b + n < lo ? lo : b + n;
  else if (b > hi)
    b = hi;
  if (step < 0 && e == NB_END)
    e = -1;
  else if (e < 0)
    e = e + n < lo ? lo : e + n;
  else if (e > hi)
    e = hi;
  *start = b;
  if (step > 0) return e > b ? (e - b - 1) / step + 1 : 0;
  int64_t mag = step == INT64_MIN ? INT64_MAX : -step;
  return b > e ? (b - e - 1) / mag + 1 : 0;
}

nb_tensor *nb_slice(nb_tensor *t, const int64_t *starts, const int64_t *stops,
                    const int64_t *steps) {
  if (nbi_any_null("nb_slice", &t, 1)) return NULL;
  int nd = t->shape.ndim;
  if (nd > 0 && (!starts || !stops)) {
    nbi_error(NB_ERR_NULL, "nb_slice: %s is NULL", starts ? "stops" : "starts");
    return NULL;
  }
  int64_t b[NB_MAX_DIMS], st[NB_MAX_DIMS], c[NB_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    st[d] = steps ? steps[d] : 1;
    if (st[d] == 0) {
      nbi_error(NB_ERR_ARG, "nb_slice: step 0 for axis %d", d);
      return NULL;
    }
    b[d] = starts[d];
    c[d] = slice_count(t->shape.dims[d], &b[d], stops[d], st[d]);
  }
  return record_slice(t, b, st, c);
}

nb_status nb_split(nb_tensor *t, const int64_t *sizes, int n, int axis, nb_tensor **out) {
  if (!out) return nbi_error(NB_ERR_NULL, "nb_split: out is NULL");
  for (int i = 0; i < n; i++)
    out[i] = NULL; /* every part stays NULL unless the whole split succeeds */
  if (nbi_any_null("nb_split", &t, 1)) return NB_ERR_NULL;
  if (!sizes) return nbi_error(NB_ERR_NULL, "nb_split: sizes is NULL");
  if (n < 1) return nbi_error(NB_ERR_ARG, "nb_split: n is %d (need at least 1 part)", n);
  int a;
  if (nbi_norm_axis("nb_split", axis, t->shape.ndim, &a)) return NB_ERR_AXIS;
  int64_t dim = t->shape.dims[a], sum = 0;
  bool over = false;
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0)
      return nbi_error(NB_ERR_ARG, "nb_split: sizes[%d] is %lld (must be >= 0)", i,
                       (long long)sizes[i]);
    if (sizes[i] > INT64_MAX - sum)
      over = true;
    else
      sum += sizes[i];
  }
  if (over || sum != dim) {
    char s[SHAPE_STR_CAP];
    return nbi_error(NB_ERR_SHAPE, "nb_split: sizes sum to %s%lld but axis %d of %s has size %lld",
                     over ? "more than " : "", (long long)(over ? INT64_MAX : sum), a,
                     nb_shape_str(t->shape, s, sizeof s), (long long)dim);
  }
  int64_t b[NB_MAX_DIMS] = {0}, st[NB_MAX_DIMS], c[NB_MAX_DIMS];
  for (int d = 0; d < t->shape.ndim; d++) {
    st[d] = 1;
    c[d] = t->shape.dims[d];
  }
  for (int i = 0; i < n; i++) {
    c[a] = sizes[i];
    if (!(out[i] = record_slice(t, b, st, c))) {
      for (int k = 0; k < i; k++)
        out[k] = NULL;
      return nb_last_status();
    }
    b[a] += sizes[i];
  }
  return NB_OK;
}

/* g with k-1 zeros inserted between neighbours along axis d: extent c becomes
 * (c-1)*k + 1 (c >= 1, k >= 2). g is seen as [pre, c, post], padded to
 * [pre, c, k, post] (zeros after each element), merged to [pre, c*k, post] and
 * cut after the last element; built from reshape, pad and slice (any rank). */
static nb_tensor *dilate_axis(nb_tensor *g, int d, int64_t k) {
  if (!g) return NULL;
  nb_shape s = g->shape;
  int64_t c = s.dims[d], pre = 1, post = 1;
  for (int e = 0; e < d; e++)
    pre *= s.dims[e];
  for (int e = d + 1; e < s.ndim; e++)
    post *= s.dims[e];
  int64_t pads[8] = {0, 0, 0, 0, 0, k - 1, 0, 0};
  int64_t starts[3] = {0, 0, 0}, stops[3] = {NB_END, (c - 1) * k + 1, NB_END};
  nb_tensor *x = nb_reshape(g, (nb_shape){.ndim = 4, .dims = {pre, c, 1, post}});
  x = nb_pad(x, pads, 0.0);
  x = nb_reshape(x, (nb_shape){.ndim = 3, .dims = {pre, c * k, post}});
  x = nb_slice(x, starts, stops, NULL);
  s.dims[d] = (c - 1) * k + 1;
  return nb_reshape(x, s);
}

/* y = x[start_d :: step_d] (count_d elements per axis): gx is gy placed back
 * into zeros of x's shape. Per axis, a negative step is undone by a flip, a
 * step k > 1 by dilate_axis; the block then covers [lo, lo + span) of the axis,
 * and one pad adds the zeros around it. An empty y gives a zero gx (NULL). */
static nb_status slice_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0] || nbi_numel(&y->shape) == 0) return NB_OK;
  const nb_shape *xs = &y->in[0]->shape;
  int nd = xs->ndim;
  int64_t pads[2 * NB_MAX_DIMS] = {0};
  bool any_pad = false;
  nb_tensor *g = gy;
  for (int d = 0; d < nd; d++) {
    int64_t c = y->shape.dims[d], lo = y->attrs.i[d], k = y->attrs.i[NB_MAX_DIMS + d];
    if (c > 1 && k < 0) {
      g = nb_flip(g, (nb_axes){.n = 1, .v = {d}});
      k = -k;
      lo -= (c - 1) * k;
    }
    if (c > 1 && k > 1) g = dilate_axis(g, d, k);
    int64_t span = c > 1 ? (c - 1) * k + 1 : 1;
    pads[2 * d] = lo;
    pads[2 * d + 1] = xs->dims[d] - lo - span;
    any_pad = any_pad || pads[2 * d] || pads[2 * d + 1];
    if (!g) break;
  }
  gin[0] = any_pad ? nb_pad(g, pads, 0.0) : g;
  return rule_status(gin[0]);
}

/* ty = the same slice of tx (tx has x's shape, so y's attrs apply as they are). */
static nb_tensor *slice_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return record_slice(tin[0], y->attrs.i, y->attrs.i + NB_MAX_DIMS, y->shape.dims);
}

/* Batched: the same slice with the whole batch dim (start 0, step 1, B). */
static nb_tensor *slice_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  (void)batched;
  int nd = y->shape.ndim;
  int64_t starts[NB_MAX_DIMS] = {0}, steps[NB_MAX_DIMS] = {1}, counts[NB_MAX_DIMS] = {B};
  for (int d = 0; d < nd; d++) {
    starts[d + 1] = y->attrs.i[d];
    steps[d + 1] = y->attrs.i[NB_MAX_DIMS + d];
    counts[d + 1] = y->shape.dims[d];
  }
  return record_slice(bin[0], starts, steps, counts);
}

const nbi_op_def nbi_opdef_SLICE = {.name = "slice",
                                    .arity = 1,
                                    .view = slice_view,
                                    .vjp = slice_vjp,
                                    .jvp = slice_jvp,
                                    .vmap = slice_vmap};

/* ---- flip ------------------------------------------------------------------------- */

/* attrs.i[0] = bitmask of flipped axes: data starts at their last element and
 * their strides are negated. */
static bool flip_view(const nb_tensor *n, const nbi_view *in, nbi_view *out) {
  int64_t off = 0;
  for (int d = 0; d < out->ndim; d++) {
    bool flip = (n->attrs.i[0] >> d & 1) && in->dims[d] > 0;
    if (flip) off += (in->dims[d] - 1) * in->strides[d];
    out->strides[d] = flip ? -in->strides[d] : in->strides[d];
  }
  out->data = in->data + off * (int64_t)nb_dtype_size(in->dtype);
  return true;
}

nb_tensor *nb_flip(nb_tensor *t, nb_axes axes) {
  if (nbi_any_null("nb_flip", &t, 1)) return NULL;
  uint32_t mask;
  if (nbi_axes_mask("nb_flip", axes, t->shape.ndim, &mask)) return NULL;
  nbi_attrs at = {0};
  at.i[0] = mask;
  return nbi_record(NBI_OP_FLIP, t->dtype, &t->shape, &t, 1, &at);
}

/* The axes of a flip node's bitmask, each plus shift (1 for the batched value). */
static nb_axes flip_axes(const nb_tensor *y, int shift) {
  nb_axes ax = {0};
  for (int d = 0; d < y->shape.ndim; d++)
    if (y->attrs.i[0] >> d & 1) ax.v[ax.n++] = d + shift;
  return ax;
}

/* A flip is its own transpose: gx = flip(gy), ty = flip(tx), same axes. */
static nb_status flip_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = nb_flip(gy, flip_axes(y, 0));
  return rule_status(gin[0]);
}

static nb_tensor *flip_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return nb_flip(tin[0], flip_axes(y, 0));
}

/* Batched: the same axes, past the batch dim. */
static nb_tensor *flip_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  (void)batched, (void)B;
  return nb_flip(bin[0], flip_axes(y, 1));
}

const nbi_op_def nbi_opdef_FLIP = {.name = "flip",
                                   .arity = 1,
                                   .view = flip_view,
                                   .vjp = flip_vjp,
                                   .jvp = flip_jvp,
                                   .vmap = flip_vmap};

/* ---- concat, stack ---------------------------------------------------------------- */

/* Checks a tensor array argument: non-NULL array, n >= 1, no NULL element. */
static nb_status check_tensor_array(const char *fn, nb_tensor *const *ts, int n) {
  if (!ts) return nbi_error(NB_ERR_NULL, "%s: ts is NULL", fn);
  if (n < 1) return nbi_error(NB_ERR_ARG, "%s: n is %d (need at least 1 tensor)", fn, n);
  for (int k = 0; k < n; k++)
    if (!ts[k]) return nbi_error(NB_ERR_NULL, "%s: ts[%d] is NULL", fn, k);
  return NB_OK;
}

/* Records concat of ts (validated) along a (normalized) into shape s, dtype dt. */
static nb_tensor *record_concat(nb_tensor *const *ts, int n, int a, nb_dtype dt,
                                const nb_shape *s) {
  nbi_attrs at = {0};
  at.i[0] = a;
  return nbi_record(NBI_OP_CONCAT, dt, s, ts, n, &at);
}

nb_tensor *nb_concat(nb_tensor *const *ts, int n, int axis) {
  if (check_tensor_array("nb_concat", ts, n)) return NULL;
  nb_shape s = ts[0]->shape;
  if (s.ndim == 0) {
    nbi_error(NB_ERR_SHAPE, "nb_concat: cannot concatenate 0-d tensors");
    return NULL;
  }
  int a;
  if (nbi_norm_axis("nb_concat", axis, s.ndim, &a)) return NULL;
  nb_dtype dt = ts[0]->dtype;
  for (int k = 1; k < n; k++) {
    const nb_shape *sk = &ts[k]->shape;
    bool ok = sk->ndim == s.ndim;
    for (int d = 0; d < s.ndim && ok; d++)
      ok = d == a || sk->dims[d] == s.dims[d];
    if (!ok) {
      char x[SHAPE_STR_CAP], y[SHAPE_STR_CAP];
      nbi_error(NB_ERR_SHAPE, "nb_concat: ts[%d] has shape %s, incompatible with %s along axis %d",
                k, nb_shape_str(*sk, x, sizeof x), nb_shape_str(ts[0]->shape, y, sizeof y), a);
      return NULL;
    }
    if (sk->dims[a] > NBI_MAX_NUMEL - s.dims[a]) {
      nbi_error(NB_ERR_OVERFLOW, "nb_concat: concatenated axis %d is too long", a);
      return NULL;
    }
    s.dims[a] += sk->dims[a];
    dt = nb_promote_types(dt, ts[k]->dtype);
  }
  if (nbi_check_shape("nb_concat", &s)) return NULL;
  return record_concat(ts, n, a, dt, &s);
}

nb_tensor *nb_stack(nb_tensor *const *ts, int n, int axis) {
  if (check_tensor_array("nb_stack", ts, n)) return NULL;
  nb_shape s = ts[0]->shape;
  for (int k = 1; k < n; k++) {
    if (!nbi_shape_eq(&ts[k]->shape, &s)) {
      char x[SHAPE_STR_CAP], y[SHAPE_STR_CAP];
      nbi_error(NB_ERR_SHAPE, "nb_stack: ts[%d] has shape %s but ts[0] has %s", k,
                nb_shape_str(ts[k]->shape, x, sizeof x), nb_shape_str(s, y, sizeof y));
      return NULL;
    }
  }
  if (s.ndim == NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "nb_stack: inputs already have the maximum rank %d", NB_MAX_DIMS);
    return NULL;
  }
  int a;
  if (nbi_norm_axis("nb_stack", axis, s.ndim + 1, &a)) return NULL;
  nb_shape u = {.ndim = s.ndim + 1};
  for (int d = 0, k = 0; d < u.ndim; d++)
    u.dims[d] = d == a ? 1 : s.dims[k++];
  nb_shape out = u;
  out.dims[a] = n;
  if (nbi_check_shape("nb_stack", &out)) return NULL;
  nb_tensor **parts = malloc((size_t)n * sizeof *parts);
  if (!parts) {
    nbi_error(NB_ERR_OOM, "nb_stack: out of memory");
    return NULL;
  }
  nb_dtype dt = ts[0]->dtype;
  nb_tensor *r = NULL;
  for (int k = 0; k < n; k++) {
    dt = nb_promote_types(dt, ts[k]->dtype);
    if (!(parts[k] = record_reshape(ts[k], &u))) goto done;
  }
  r = record_concat(parts, n, a, dt, &out);
done:
  free(parts);
  return r;
}

/* y = concat(x_0 .. x_{n-1}) along attrs.i[0], in the promoted dtype: gx_k is
 * gy's block [off_k, off_k + len_k) along the axis, cast back to x_k's dtype.
 * ty = concat of the tangents (zeros for the missing ones) in y's dtype. */
static nb_status concat_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  int a = (int)y->attrs.i[0], nd = y->shape.ndim;
  int64_t starts[NB_MAX_DIMS] = {0}, stops[NB_MAX_DIMS];
  for (int d = 0; d < nd; d++)
    stops[d] = NB_END;
  int64_t off = 0;
  for (int k = 0; k < y->n_in; k++) {
    nb_tensor *x = y->in[k];
    int64_t len = x->shape.dims[a];
    if (need[k]) {
      starts[a] = off;
      stops[a] = off + len;
      gin[k] = nbi_grad_fit(nb_slice(gy, starts, stops, NULL), x);
      if (!gin[k]) return nb_last_status();
    }
    off += len;
  }
  return NB_OK;
}

static nb_tensor *concat_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor **parts = malloc((size_t)y->n_in * sizeof *parts);
  if (!parts) {
    nbi_error(NB_ERR_OOM, "nb_concat: out of memory for its tangent");
    return NULL;
  }
  nb_tensor *r = NULL;
  for (int k = 0; k < y->n_in; k++)
    if (!(parts[k] = tin[k] ? tin[k] : nbi_zeros_like(y->in[k]))) goto done;
  r = nb_concat(parts, y->n_in, (int)y->attrs.i[0]);
  if (r && r->dtype != y->dtype) r = nb_cast(r, y->dtype);
done:
  free(parts);
  return r;
}

/* Batched: unbatched parts are broadcast along the batch (views), then one
 * concat along the axis past the batch dim. */
static nb_tensor *concat_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  nb_tensor **parts = malloc((size_t)y->n_in * sizeof *parts);
  if (!parts) {
    nbi_error(NB_ERR_OOM, "nb_vmap: out of memory batching a concat");
    return NULL;
  }
  nb_tensor *r = NULL;
  for (int k = 0; k < y->n_in; k++)
    if (!(parts[k] = nbi_bat_expand(bin[k], batched[k], B))) goto done;
  r = nb_concat(parts, y->n_in, (int)y->attrs.i[0] + 1);
done:
  free(parts);
  return r;
}

const nbi_op_def nbi_opdef_CONCAT = {.name = "concat",
                                     .arity = -1,
                                     .view = NULL,
                                     .vjp = concat_vjp,
                                     .jvp = concat_jvp,
                                     .vmap = concat_vmap};

/* ---- pad -------------------------------------------------------------------------- */

nb_tensor *nb_pad(nb_tensor *t, const int64_t *pads, double value) {
  if (nbi_any_null("nb_pad", &t, 1)) return NULL;
  int nd = t->shape.ndim;
  if (nd > 0 && !pads) {
    nbi_error(NB_ERR_NULL, "nb_pad: pads is NULL");
    return NULL;
  }
  nbi_attrs at = {0};
  nb_shape s = t->shape;
  for (int k = 0; k < 2 * nd; k++) {
    if (pads[k] < 0 || pads[k] > NBI_MAX_NUMEL) {
      nbi_error(pads[k] < 0 ? NB_ERR_ARG : NB_ERR_OVERFLOW,
                "nb_pad: pads[%d] is %lld (must be in [0, 2^48])", k, (long long)pads[k]);
      return NULL;
    }
    s.dims[k / 2] += pads[k];
    at.i[k] = pads[k];
  }
  if (nbi_check_shape("nb_pad", &s)) return NULL;
  at.f[0] = value;
  return nbi_record(NBI_OP_PAD, t->dtype, &s, &t, 1, &at);
}

/* y = pad(x, pads, value) with attrs.i[2d], i[2d+1] = before/after along d:
 * gx = gy[before_d : before_d + x.dims[d]]; ty = pad(tx, pads, 0) (the fill
 * value is a constant). */
static nb_status pad_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  const nb_shape *xs = &y->in[0]->shape;
  int64_t starts[NB_MAX_DIMS], stops[NB_MAX_DIMS];
  for (int d = 0; d < xs->ndim; d++) {
    starts[d] = y->attrs.i[2 * d];
    stops[d] = starts[d] + xs->dims[d];
  }
  gin[0] = nb_slice(gy, starts, stops, NULL);
  return rule_status(gin[0]);
}

static nb_tensor *pad_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return nb_pad(tin[0], y->attrs.i, 0.0);
}

/* Batched: no padding on the batch dim, the same pads and value elsewhere. */
static nb_tensor *pad_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  (void)batched, (void)B;
  int64_t pads[2 * NB_MAX_DIMS] = {0};
  memcpy(pads + 2, y->attrs.i, sizeof(int64_t) * (size_t)(2 * y->shape.ndim));
  return nb_pad(bin[0], pads, y->attrs.f[0]);
}

const nbi_op_def nbi_opdef_PAD = {
    .name = "pad", .arity = 1, .view = NULL, .vjp = pad_vjp, .jvp = pad_jvp, .vmap = pad_vmap};

/* ---- repeat, tile ------------------------------------------------------------------ */

/* Product of dims [from, to) of s. */
static int64_t dims_product(const nb_shape *s, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++)
    p *= s->dims[d];
  return p;
}

/* Repeats t along a new axis: t seen as [p, q] becomes [p, r, q] by
 * broadcasting [p, 1, q], then is reshaped to s. Every element of the q-block
 * appears r times in a row: the one pattern behind repeat (q = 1 element) and
 * tile (q = the rest of the tensor). */
static nb_tensor *repeat_blocks(nb_tensor *t, int64_t p, int64_t r, int64_t q, const nb_shape *s) {
  nb_shape s1 = {.ndim = 3, .dims = {p, 1, q}}, s2 = {.ndim = 3, .dims = {p, r, q}};
  nb_tensor *x = record_reshape(t, &s1);
  nb_tensor *y = x ? record_broadcast(x, &s2) : NULL;
  return y ? record_reshape(y, s) : NULL;
}

/* Checks that the shape with dims[d] = base[d] * mult[d] stays in range. */
static nb_status check_scaled_shape(const char *fn, const nb_shape *base, const int64_t *mult,
                                    nb_shape *out) {
  *out = *base;
  for (int d = 0; d < base->ndim; d++) {
    if (mult[d] > 0 && base->dims[d] > NBI_MAX_NUMEL / mult[d])
      return nbi_error(NB_ERR_OVERFLOW, "%s: axis %d would have more than 2^48 elements", fn, d);
    out->dims[d] = base->dims[d] * mult[d];
  }
  return nbi_check_shape(fn, out);
}

nb_tensor *nb_repeat(nb_tensor *t, int64_t repeats, int axis) {
  if (nbi_any_null("nb_repeat", &t, 1)) return NULL;
  int a;
  if (nbi_norm_axis("nb_repeat", axis, t->shape.ndim, &a)) return NULL;
  if (repeats < 0) {
    nbi_error(NB_ERR_ARG, "nb_repeat: repeats is %lld (must be >= 0)", (long long)repeats);
    return NULL;
  }
  int64_t mult[NB_MAX_DIMS];
  for (int d = 0; d < t->shape.ndim; d++)
    mult[d] = d == a ? repeats : 1;
  nb_shape s;
  if (check_scaled_shape("nb_repeat", &t->shape, mult, &s)) return NULL;
  return repeat_blocks(t, dims_product(&t->shape, 0, a + 1), repeats,
                       dims_product(&t->shape, a + 1, t->shape.ndim), &s);
}

nb_tensor *nb_tile(nb_tensor *t, nb_shape reps) {
  if (nbi_any_null("nb_tile", &t, 1)) return NULL;
  if (reps.ndim < 0 || reps.ndim > NB_MAX_DIMS) {
    nbi_error(NB_ERR_ARG, "nb_tile: reps has %d entries (at most %d)", reps.ndim, NB_MAX_DIMS);
    return NULL;
  }
  int nd = reps.ndim > t->shape.ndim ? reps.ndim : t->shape.ndim;
  nb_shape base = {.ndim = nd}; /* t with leading 1s to nd dims */
  int64_t mult[NB_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    int dt = d - (nd - t->shape.ndim), dr = d - (nd - reps.ndim);
    base.dims[d] = dt >= 0 ? t->shape.dims[dt] : 1;
    mult[d] = dr >= 0 ? reps.dims[dr] : 1;
    if (mult[d] < 0) {
      char b[SHAPE_STR_CAP];
      nbi_error(NB_ERR_ARG, "nb_tile: negative repetition in reps %s",
                nb_shape_str(reps, b, sizeof b));
      return NULL;
    }
  }
  nb_shape s;
  if (check_scaled_shape("nb_tile", &base, mult, &s)) return NULL;
  /* Tile one axis at a time: dims before it are already tiled, the block from
   * it on repeats mult[d] times (as NumPy does). */
  nb_tensor *x = record_reshape(t, &base);
  nb_shape cur = base;
  for (int d = 0; d < nd && x; d++) {
    if (mult[d] == 1) continue;
    int64_t p = dims_product(&cur, 0, d), q = dims_product(&cur, d, nd);
    cur.dims[d] = s.dims[d];
    x = repeat_blocks(x, p, mult[d], q, &cur);
  }
  return x;
}
