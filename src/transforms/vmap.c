/* src/transforms/vmap.c — nb_vmap.
 *
 * The body traces f on one example: each mapped input becomes a placeholder
 * of the example's shape, each unmapped one a traced alias of the input. The
 * batching pass (nbi_vmap_graph, sweep.c) then rebuilds every node that
 * depends on a placeholder with its op's batching rule, the placeholders
 * replaced by the inputs with their mapped axis moved to the front. Nodes that
 * depend only on unmapped inputs stay as they are. Outputs get their batch
 * axis moved to out_axes (unbatched outputs are broadcast).
 */
#include "transforms.h"
#include "../core/oprules.h"
#include "tree.h"

#include "../ops/rule_util.h"

#include <stdlib.h>

typedef struct vmap_fn {
  nb_fn *f;
  int *in_axes;  /* [n_in] as given (NB_NOT_MAPPED allowed) */
  int *out_axes; /* [n_out] */
} vmap_fn;

static void vmap_destroy(void *p) {
  vmap_fn *v = p;
  nb_fn_release(v->f);
  free(v->in_axes);
  free(v->out_axes);
  free(v);
}

static const char *FN = "nb_vmap";

/* Normalizes in_axes against the inputs and finds B. */
static nb_status batch_size(const vmap_fn *v, nb_tensor *const *in, int *axis, int64_t *B) {
  int first = -1;
  for (int k = 0; k < v->f->n_in; k++) {
    axis[k] = -1;
    if (v->in_axes[k] == NB_NOT_MAPPED) continue;
    int nd = in[k]->shape.ndim, a = v->in_axes[k] < 0 ? v->in_axes[k] + nd : v->in_axes[k];
    if (a < 0 || a >= nd) {
      char b[160];
      return nbi_error(NB_ERR_ARG, "%s: in_axes[%d] = %d is out of range for input %d of shape %s",
                       FN, k, v->in_axes[k], k, nb_shape_str(in[k]->shape, b, sizeof b));
    }
    axis[k] = a;
    int64_t n = in[k]->shape.dims[a];
    if (first < 0) {
      first = k;
      *B = n;
    } else if (n != *B) {
      return nbi_error(NB_ERR_SHAPE,
                       "%s: mapped inputs have different sizes: input %d has %lld along axis %d, "
                       "input %d has %lld along axis %d",
                       FN, first, (long long)*B, axis[first], k, (long long)n, a);
    }
  }
  if (first < 0)
    return nbi_error(NB_ERR_ARG, "%s: no input is mapped (every in_axes entry is NB_NOT_MAPPED)",
                     FN);
  return NB_OK;
}

static nb_tensor *untrace(nb_tensor *t, bool top) {
  if (!t || !top) return t;
  nb_tensor *r = nbi_identity(t);
  if (r) r->flags &= ~(uint32_t)NBI_T_TRACED;
  return r;
}

/* Output j from its batched value b (batch first) or unbatched y. */
static nb_tensor *place_output(const vmap_fn *v, int j, nb_tensor *b, nb_tensor *y, int64_t B) {
  int oa = v->out_axes[j];
  if (oa == NB_NOT_MAPPED) {
    if (!b) return y;
    nbi_error(NB_ERR_ARG,
              "%s: out_axes[%d] is NB_NOT_MAPPED but output %d depends on a mapped input", FN, j,
              j);
    return NULL;
  }
  int nd = y->shape.ndim + 1, a = oa < 0 ? oa + nd : oa;
  if (a < 0 || a >= nd) {
    char s[160];
    nbi_error(NB_ERR_ARG, "%s: out_axes[%d] = %d is out of range for output %d of shape %s + batch",
              FN, j, oa, j, nb_shape_str(y->shape, s, sizeof s));
    return NULL;
  }
  if (!b) b = nbi_bat_expand(y, false, B);
  return nbi_bat_moveaxis(b, 0, a);
}

static nb_status vmap_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  const vmap_fn *v = user;
  int ax_local[8], *axis = n_in <= 8 ? ax_local : malloc(sizeof *axis * (size_t)n_in);
  nb_tensor **x = calloc((size_t)(3 * n_in + 2 * n_out) + 1, sizeof *x);
  if (!axis || !x) {
    if (axis != ax_local) free(axis);
    free(x);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  }
  nb_tensor **src = x + n_in, **bsrc = src + n_in, **y = bsrc + n_in, **by = y + n_out;
  int64_t B = 0;
  int n_src = 0;
  bool top = true;
  nb_status st = batch_size(v, in, axis, &B);
  uint64_t seq0 = nbi_next_seq();
  for (int k = 0; k < n_in && !st; k++) {
    if (in[k]->flags & NBI_T_TRACED) top = false;
    if (axis[k] < 0) {
      if ((x[k] = nbi_identity(in[k]))) x[k]->flags |= NBI_T_TRACED;
    } else {
      nb_shape s = in[k]->shape;
      for (int d = axis[k]; d < s.ndim - 1; d++)
        s.dims[d] = s.dims[d + 1];
      s.ndim--;
      x[k] = nbi_placeholder(&s, in[k]->dtype);
      src[n_src] = x[k];
      bsrc[n_src++] = nbi_bat_moveaxis(in[k], axis[k], 0);
      if (!bsrc[n_src - 1]) st = nb_last_status();
    }
    if (!x[k]) st = nb_last_status();
  }
  if (!st) st = nb_call(v->f, x, y);
  if (!st) st = nbi_vmap_graph(FN, y, n_out, src, bsrc, n_src, B, seq0, by);
  for (int j = 0; j < n_out && !st; j++)
    if (!(out[j] = untrace(place_output(v, j, by[j], y[j], B), top))) st = nb_last_status();
  if (axis != ax_local) free(axis);
  free(x);
  return st;
}

nb_fn *nb_vmap(nb_fn *f, const int *in_axes, const int *out_axes) {
  if (!f) {
    nbi_error(NB_ERR_NULL, "%s: f is NULL", FN);
    return NULL;
  }
  if (nbi_fn_is_tree(f)) return nbi_tree_vmap(f, in_axes, out_axes);
  vmap_fn *v = calloc(1, sizeof *v);
  if (v) {
    v->in_axes = calloc((size_t)f->n_in + 1, sizeof(int));
    v->out_axes = calloc((size_t)f->n_out + 1, sizeof(int));
  }
  if (!v || !v->in_axes || !v->out_axes) {
    if (v) free(v->in_axes), free(v->out_axes);
    free(v);
    nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
    return NULL;
  }
  for (int k = 0; k < f->n_in; k++)
    v->in_axes[k] = in_axes ? in_axes[k] : 0;
  for (int j = 0; j < f->n_out; j++)
    v->out_axes[j] = out_axes ? out_axes[j] : 0;
  v->f = nb_fn_retain(f);
  return nbi_fn_make(FN, vmap_body, v, vmap_destroy, f->n_in, f->n_out);
}
