/* src/transforms/backward.c — imperative autodiff (PyTorch style):
 * requires-grad leaves, provenance, nb_backward, .grad, detach, assign.
 *
 * Provenance is the ordinary graph: a node made from a requires-grad tensor
 * gets NBI_T_GRAD_PATH at record time (src/core/tensor.c) and keeps its input
 * edges even after it is realized (src/core/graph.c), so nb_backward can walk
 * from the loss to the leaves and apply the same VJP rules the transforms
 * use. Afterwards the walked nodes drop their edges (NBI_T_GRAD_FREED): the
 * forward graph is freed as soon as nothing else holds it. */
#include "transforms.h"
#include "../core/oprules.h"

#include "../ops/rule_util.h"
#include "../sharding/sharding.h"

#include <stdlib.h>

static nb_status check_untraced(const char *fn, const nb_tensor *t) {
  if (t->flags & NBI_T_TRACED)
    return nbi_error(NB_ERR_STATE,
                     "%s: cannot use a traced value here (inside a transform, return new "
                     "values instead)",
                     fn);
  return NB_OK;
}

nb_tensor *nb_set_requires_grad(nb_tensor *t, bool on) {
  if (nbi_any_null("nb_set_requires_grad", &t, 1)) return NULL;
  if (check_untraced("nb_set_requires_grad", t)) return NULL;
  if (on && t->mesh && nbi_sharding_of(t)->n_partial) {
    nbi_error(NB_ERR_SHARDING,
              "nb_set_requires_grad: the tensor holds pending partial sums (%s); reshard it "
              "to a layout without partial(...) first (nb_reshard)",
              nb_sharding_str(t));
    return NULL;
  }
  if (on && t->mesh && t->mesh->n_ranks > 1) {
    nbi_error(NB_ERR_DISTRIBUTED,
              "nb_set_requires_grad: the tensor is on mesh %s, which spans %d processes: "
              "nb_backward does not run across processes (differentiate with nb_grad or "
              "nb_value_and_grad)",
              nb_mesh_str(t->mesh), t->mesh->n_ranks);
    return NULL;
  }
  if (on && !nb_dtype_is_float(t->dtype)) {
    nbi_error(NB_ERR_DTYPE,
              "nb_set_requires_grad: only floating-point tensors can require "
              "gradients (this one is %s)",
              nb_dtype_name(t->dtype));
    return NULL;
  }
  /* a sharded tensor: the logical tensor and its physical objects (the
   * sources nb_backward reaches on the physical graph) */
  for (int d = -1; d < (t->mesh ? t->n_phys : 0); d++) {
    nb_tensor *x = d < 0 ? t : t->phys[d];
    if (on)
      x->flags |= NBI_T_REQUIRES_GRAD;
    else
      x->flags &= ~(uint32_t)NBI_T_REQUIRES_GRAD;
  }
  return t;
}

bool nb_requires_grad(const nb_tensor *t) {
  return t && (t->flags & (NBI_T_REQUIRES_GRAD | NBI_T_GRAD_PATH));
}

/* The first device before d whose block of a tensor under s is d's (its
 * coordinates on the axes s shards dimensions over are d's), or d. */
static int first_with_block(const nb_mesh *m, const nbi_sharding *s, int d) {
  for (int e = 0; e < d; e++) {
    bool same = true;
    for (int k = 0; k < s->ndim && same; k++)
      same = nbi_dim_index(m, s, k, e) == nbi_dim_index(m, s, k, d);
    if (same) return e;
  }
  return d;
}

/* The (sub-)axes of m that no dimension of s is sharded over (nor, with
 * partial_too, s sums over): the gaps each mesh axis leaves between the
 * sub-axes s uses, into out (room for NBI_GAPS_MAX). Returns their count, or
 * -1 when they do not fit. */
#define NBI_GAPS_MAX (3 * NBI_MESH_MAX_AXES)
static int replicated_axes(const nb_mesh *m, const nbi_sharding *s, bool partial_too,
                           nbi_axis *out) {
  int n_out = 0;
  for (int a = 0; a < m->n_axes; a++) {
    nbi_axis used[2 * NBI_MESH_MAX_AXES];
    int n = 0;
    for (int k = 0; k <= s->ndim; k++) {
      const nbi_axis *ax = k < s->ndim ? s->dim[k].ax : s->partial;
      int cnt = k < s->ndim ? s->dim[k].n : partial_too ? s->n_partial : 0;
      for (int i = 0; i < cnt; i++)
        if (ax[i].axis == a) {
          if (n == 2 * NBI_MESH_MAX_AXES) return -1;
          int j = n++; /* sorted by pre */
          while (j > 0 && used[j - 1].pre > ax[i].pre) {
            used[j] = used[j - 1];
            j--;
          }
          used[j] = ax[i];
        }
    }
    int64_t c = 1; /* the product of the part covered so far */
    for (int i = 0; i <= n; i++) {
      int64_t next = i < n ? used[i].pre : m->size[a];
      if (next > c && n_out == NBI_GAPS_MAX) return -1;
      if (next > c) out[n_out++] = (nbi_axis){.axis = a, .pre = c, .size = next / c};
      if (i < n && used[i].pre * used[i].size > c) c = used[i].pre * used[i].size;
    }
  }
  return n_out;
}

/* The gradient of a sharded leaf, laid out like the leaf: each device's
 * block is the gradient of its physical object (zeros where it has none).
 * Devices holding one block in distinct objects (each got its own gradient)
 * hold a partial sum over the leaf's replicated axes, reduced here to the
 * leaf's layout. NULL (no error) when no object has a gradient. */
static nb_tensor *sharded_grad(const char *fn, nb_tensor *leaf) {
  nb_mesh *m = leaf->mesh;
  const nbi_sharding *ls = nbi_sharding_of(leaf);
  int n = m->n_dev;
  bool any = false, split = false;
  for (int d = 0; d < n; d++) {
    any |= leaf->phys[d]->grad != NULL;
    split |= leaf->phys[first_with_block(m, ls, d)] != leaf->phys[d];
  }
  if (!any) return NULL;
  nb_tensor **g = malloc(sizeof *g * (size_t)n);
  if (!g) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  nbi_sharding ps = *ls;
  if (split) { /* a partial sum over the replicated (sub-)axes */
    nbi_axis gaps[NBI_GAPS_MAX];
    int n_gaps = replicated_axes(m, ls, false, gaps);
    if (n_gaps < 0 || n_gaps > NBI_MESH_MAX_AXES - ps.n_partial) {
      free(g);
      nbi_error(NB_ERR_SHARDING, "%s: the leaf's layout %s leaves too many replicated sub-axes", fn,
                nb_sharding_str(leaf));
      return NULL;
    }
    ps.n_repl = 0;
    for (int i = 0; i < n_gaps; i++)
      ps.partial[ps.n_partial++] = gaps[i];
  }
  nb_status st = NB_OK;
  for (int d = 0; d < n && !st; d++) {
    nb_tensor *p = leaf->phys[d];
    int e = 0; /* an earlier device holding p for the same block */
    while (e < d &&
           !(leaf->phys[e] == p && first_with_block(m, ls, e) == first_with_block(m, ls, d)))
      e++;
    /* an object counts once per block: in a partial sum its later holders
     * add zeros; otherwise they share its gradient */
    if (e < d)
      g[d] = split ? nb_zeros(p->shape, p->dtype) : g[e];
    else
      g[d] = p->grad ? p->grad : nb_zeros(p->shape, p->dtype);
    if (!g[d]) st = nb_last_status();
  }
  nb_tensor *r = st ? NULL : nbi_sharded_make(fn, m, &ps, &leaf->shape, leaf->dtype, g);
  free(g);
  return r && split ? nbi_shard_to(fn, r, m, ls) : r;
}

nb_tensor *nb_grad_of(nb_tensor *leaf) {
  if (nbi_any_null("nb_grad_of", &leaf, 1)) return NULL;
  if (leaf->mesh && (leaf->flags & NBI_T_REQUIRES_GRAD)) return sharded_grad("nb_grad_of", leaf);
  if (!leaf->grad) return NULL;
  return nbi_scope_register(nb_retain(leaf->grad));
}

void nb_zero_grad(nb_tensor *leaf) {
  if (nbi_any_null("nb_zero_grad", &leaf, 1)) return;
  for (int d = -1; d < (leaf->mesh ? leaf->n_phys : 0); d++) {
    nb_tensor *x = d < 0 ? leaf : leaf->phys[d];
    nb_release(x->grad);
    x->grad = NULL;
  }
}

/* Drops the edges of the walked provenance. Every node is retained first:
 * dropping one node's edges may free another one of the list. */
static void free_provenance(nbi_sweep *s) {
  for (int i = 0; i < s->n; i++)
    nb_retain(s->nodes[i]);
  for (int i = 0; i < s->n; i++) {
    nb_tensor *t = s->nodes[i];
    if (!(t->flags & NBI_T_GRAD_PATH) || (t->flags & NBI_T_REQUIRES_GRAD)) continue;
    t->flags |= NBI_T_GRAD_FREED;
    if (t->flags & NBI_T_REALIZED) nbi_tensor_drop_graph(t);
  }
  /* the sweep forgets its nodes before they may be freed (sources included:
   * a leaf only the graph held dies here) */
  int n = s->n;
  for (int i = 0; i < n; i++)
    s->nodes[i]->aux = -1;
  s->n = s->n_sources = 0;
  for (int i = 0; i < n; i++)
    nb_release(s->nodes[i]);
}

/* The physical tensors of a sharded loss whose sum is the logical loss:
 * device d's where its coordinate is 0 on every mesh (sub-)axis the loss
 * neither shards a dimension over nor lists as partial (its replicated
 * axes: one representative), once per such device (an object two of them
 * hold counts twice: the sweep adds the seeds of a repeated root). */
static nb_status sharded_roots(const char *fn, nb_tensor *loss, nb_tensor ***roots, int *n) {
  const nb_mesh *m = loss->mesh;
  nbi_axis rep[NBI_GAPS_MAX];
  int n_rep = replicated_axes(m, nbi_sharding_of(loss), true, rep);
  if (n_rep < 0)
    return nbi_error(NB_ERR_SHARDING, "%s: the loss's layout %s uses too many sub-axes", fn,
                     nb_sharding_str(loss));
  nb_tensor **r = malloc(sizeof *r * (size_t)m->n_dev);
  if (!r) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  int k = 0;
  for (int d = 0; d < m->n_dev; d++) {
    bool first = true;
    for (int i = 0; i < n_rep && first; i++)
      first = nbi_axis_coord(m, &rep[i], d) == 0;
    if (first) r[k++] = loss->phys[d];
  }
  *roots = r;
  *n = k;
  return NB_OK;
}

nb_status nb_backward(nb_tensor *loss) {
  const char *fn = "nb_backward";
  if (nbi_any_null(fn, &loss, 1)) return nb_last_status();
  nb_status st = check_untraced(fn, loss);
  if (st) return st;
  if (nbi_numel(&loss->shape) != 1) {
    char b[160];
    return nbi_error(NB_ERR_SHAPE, "%s: the loss has shape %s; backward needs one element", fn,
                     nb_shape_str(loss->shape, b, sizeof b));
  }
  if (!(loss->flags & (NBI_T_GRAD_PATH | NBI_T_REQUIRES_GRAD)))
    return nbi_error(NB_ERR_STATE,
                     "%s: the loss does not depend on any tensor that requires grad (call "
                     "nb_set_requires_grad on the parameters first)",
                     fn);
  if (loss->mesh && loss->mesh->n_ranks > 1)
    return nbi_error(NB_ERR_DISTRIBUTED,
                     "%s: the loss is on mesh %s, which spans %d processes: nb_backward does "
                     "not run across processes (differentiate with nb_grad or "
                     "nb_value_and_grad)",
                     fn, nb_mesh_str(loss->mesh), loss->mesh->n_ranks);
  if (loss->flags & NBI_T_GRAD_FREED)
    return nbi_error(NB_ERR_STATE,
                     "%s: the graph was already freed by an earlier nb_backward (each forward "
                     "pass supports one backward)",
                     fn);
  nbi_sweep s = {.fn = fn, .imperative = true};
  nb_tensor **g = NULL, **eval = NULL, **roots = &loss, **seeds = NULL, **old = NULL;
  bool *set = NULL; /* set[j]: source j's .grad was replaced (old[j] is the one before) */
  int n_roots = 1;
  nb_scope_begin();
  uint64_t seq0 = nbi_next_seq(); /* the backward graph's nodes come after */
  bool saved = nbi_no_grad;
  nbi_no_grad = true;
  if (loss->mesh) st = sharded_roots(fn, loss, &roots, &n_roots);
  if (!st) st = nbi_sweep_collect(&s, roots, n_roots, NULL, 0);
  if (!st) {
    g = calloc((size_t)s.n_sources + 1, sizeof *g);
    old = calloc((size_t)s.n_sources + 1, sizeof *old);
    set = calloc((size_t)s.n_sources + 1, sizeof *set);
    eval = calloc((size_t)s.n_sources + (size_t)n_roots, sizeof *eval);
    seeds = calloc((size_t)n_roots, sizeof *seeds);
    if (!g || !old || !set || !eval || !seeds) st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  }
  for (int r = 0; r < n_roots && !st; r++)
    if (!(seeds[r] = nbi_ones_like(roots[r]))) st = nb_last_status();
  if (!st) st = nbi_sweep_reverse(&s, roots, seeds, n_roots, g);
  nbi_no_grad = saved;
  int n_eval = 0;
  if (!st) {
    eval[n_eval++] = loss;
    /* the last source found first: the walk from the loss reaches the
     * first layer's leaves first, and a plan that starts with the layers
     * nearest the loss frees their activations sooner */
    for (int j = s.n_sources - 1; j >= 0; j--) {
      nb_tensor *leaf = s.sources[j];
      if (!g[j]) continue;
      nb_tensor *acc = leaf->grad ? nb_add(leaf->grad, g[j]) : g[j];
      if (!acc) {
        st = nb_last_status();
        break;
      }
      old[j] = leaf->grad; /* kept until the realization succeeds */
      set[j] = true;
      leaf->grad = nb_retain(acc);
      eval[n_eval++] = acc;
    }
  }
  /* the loss and every new gradient in one realization; the forward's
   * intermediates die as the backward consumes them (left lazy) */
  bool sharded = false;
  for (int k = 0; k < n_eval && !st; k++)
    sharded |= eval[k]->mesh != NULL;
  if (!st) st = sharded ? nbi_realize(eval, n_eval) : nbi_realize_backward(eval, n_eval, seq0);
  /* a failed backward (an index out of range found by a kernel) leaves every
   * .grad as it was: a pending gradient would hold the forward graph, whose
   * leaf holds the gradient (a cycle nothing frees) */
  for (int j = 0; set && j < s.n_sources; j++) {
    if (!set[j]) continue;
    nb_tensor *leaf = s.sources[j];
    if (st) {
      nb_release(leaf->grad);
      leaf->grad = old[j];
    } else {
      nb_release(old[j]);
    }
  }
  if (!st) free_provenance(&s);
  if (!st && loss->mesh) loss->flags |= NBI_T_GRAD_FREED;
  nbi_sweep_free(&s);
  nb_scope_end();
  free(g);
  free(old);
  free(set);
  free(eval);
  free(seeds);
  if (roots != &loss) free(roots);
  return st;
}

nb_status nb_assign(nb_tensor *dst, nb_tensor *src) {
  const char *fn = "nb_assign";
  if (nbi_any_null(fn, (nb_tensor *[]){dst, src}, 2)) return nb_last_status();
  nb_status st = check_untraced(fn, dst);
  if (!st) st = check_untraced(fn, src);
  if (st) return st;
  if (!nbi_shape_eq(&dst->shape, &src->shape)) {
    char a[160], b[160];
    return nbi_error(NB_ERR_SHAPE, "%s: src has shape %s but dst has shape %s", fn,
                     nb_shape_str(src->shape, a, sizeof a), nb_shape_str(dst->shape, b, sizeof b));
  }
  nb_scope_begin();
  nb_tensor *val = src->dtype == dst->dtype ? src : nb_cast(src, dst->dtype);
  if (!val) st = nb_last_status();
  if (!st && dst->mesh) { /* a sharded dst keeps its layout (src/sharding) */
    st = nbi_sharded_assign(dst, val);
    nb_scope_end();
    return st;
  }
  if (!st && val->mesh && !(val = nbi_readable(fn, val))) st = nb_last_status();
  /* dst keeps its device: a value elsewhere moves (rebound as it was, dst's
   * storage would be another device's memory) */
  if (!st && val->device != dst->device &&
      !(val = nb_to_device(val, nbi_device_public(dst->device))))
    st = nb_last_status();
  if (!st) st = nbi_assign_rebind(dst, val);
  nb_scope_end();
  return st;
}

nb_status nb_assign_n(nb_tensor *const *dst, nb_tensor *const *src, int n) {
  const char *fn = "nb_assign_n";
  if (n < 0) return nbi_error(NB_ERR_ARG, "%s: n is %d", fn, n);
  if (n > 0 && (!dst || !src))
    return nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, dst ? "src" : "dst");
  nb_status st = NB_OK;
  for (int k = 0; k < n && !st; k++) {
    if (!dst[k] || !src[k])
      return nbi_error(NB_ERR_NULL, "%s: %s[%d] is NULL", fn, dst[k] ? "src" : "dst", k);
    st = check_untraced(fn, dst[k]);
    if (!st) st = check_untraced(fn, src[k]);
    if (!st && !nbi_shape_eq(&dst[k]->shape, &src[k]->shape)) {
      char a[160], b[160];
      st = nbi_error(NB_ERR_SHAPE, "%s: src[%d] has shape %s but dst[%d] has shape %s", fn, k,
                     nb_shape_str(src[k]->shape, a, sizeof a), k,
                     nb_shape_str(dst[k]->shape, b, sizeof b));
    }
    for (int j = 0; j < k && !st; j++)
      if (dst[j] == dst[k])
        st = nbi_error(NB_ERR_ARG, "%s: dst[%d] and dst[%d] are the same tensor", fn, j, k);
  }
  if (st || n == 0) return st;
  nb_tensor **d = malloc(sizeof *d * 2 * (size_t)n), **v = d ? d + n : NULL;
  if (!d) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  nb_scope_begin();
  int m = 0; /* the single-device dsts, assigned in one plan */
  for (int k = 0; k < n && !st; k++) {
    if (dst[k]->mesh) continue;
    nb_tensor *val = src[k]->dtype == dst[k]->dtype ? src[k] : nb_cast(src[k], dst[k]->dtype);
    if (val && val->mesh) val = nbi_readable(fn, val);
    /* dst keeps its device, as in nb_assign */
    if (val && val->device != dst[k]->device)
      val = nb_to_device(val, nbi_device_public(dst[k]->device));
    if (!val) st = nb_last_status();
    d[m] = dst[k], v[m++] = val;
  }
  if (!st && m) st = nbi_assign_rebind_n(d, v, m, NULL, 0);
  /* sharded dsts keep their layouts (src/sharding), one by one: their values
   * were realized above when they read a single-device dst */
  for (int k = 0; k < n && !st; k++) {
    if (!dst[k]->mesh) continue;
    nb_tensor *val = src[k]->dtype == dst[k]->dtype ? src[k] : nb_cast(src[k], dst[k]->dtype);
    st = val ? nbi_sharded_assign(dst[k], val) : nb_last_status();
  }
  nb_scope_end();
  free(d);
  return st;
}

/* ---- no-grad mode ------------------------------------------------------------------- */
static _Thread_local int no_grad_depth;

void nb_no_grad_begin(void) {
  no_grad_depth++;
  nbi_no_grad = true;
}

nb_status nb_no_grad_end(void) {
  if (no_grad_depth == 0)
    return nbi_error(NB_ERR_SCOPE, "nb_no_grad_end: no nb_no_grad_begin is open (begin/end are "
                                   "unbalanced)");
  nbi_no_grad = --no_grad_depth > 0;
  return NB_OK;
}

bool nb_is_grad_enabled(void) { return !nbi_no_grad; }
