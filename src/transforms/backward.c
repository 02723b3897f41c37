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
  if (on && t->mesh) {
    nbi_error(NB_ERR_SHARDING, "nb_set_requires_grad: nb_backward does not support sharded "
                               "tensors yet (nb_grad and nb_value_and_grad do)");
    return NULL;
  }
  if (on && !nb_dtype_is_float(t->dtype)) {
    nbi_error(NB_ERR_DTYPE,
              "nb_set_requires_grad: only floating-point tensors can require "
              "gradients (this one is %s)",
              nb_dtype_name(t->dtype));
    return NULL;
  }
  if (on)
    t->flags |= NBI_T_REQUIRES_GRAD;
  else
    t->flags &= ~(uint32_t)NBI_T_REQUIRES_GRAD;
  return t;
}

bool nb_requires_grad(const nb_tensor *t) {
  return t && (t->flags & (NBI_T_REQUIRES_GRAD | NBI_T_GRAD_PATH));
}

nb_tensor *nb_grad_of(nb_tensor *leaf) {
  if (nbi_any_null("nb_grad_of", &leaf, 1) || !leaf->grad) return NULL;
  nbi_scope_register(nb_retain(leaf->grad));
  return leaf->grad;
}

void nb_zero_grad(nb_tensor *leaf) {
  if (nbi_any_null("nb_zero_grad", &leaf, 1)) return;
  nb_release(leaf->grad);
  leaf->grad = NULL;
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

nb_status nb_backward(nb_tensor *loss) {
  const char *fn = "nb_backward";
  if (nbi_any_null(fn, &loss, 1)) return nb_last_status();
  nb_status st = check_untraced(fn, loss);
  if (st) return st;
  if (loss->mesh)
    return nbi_error(NB_ERR_SHARDING,
                     "%s: the loss is sharded; nb_backward does not support "
                     "sharded tensors yet (nb_grad and nb_value_and_grad do)",
                     fn);
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
  if (loss->flags & NBI_T_GRAD_FREED)
    return nbi_error(NB_ERR_STATE,
                     "%s: the graph was already freed by an earlier nb_backward (each forward "
                     "pass supports one backward)",
                     fn);
  nbi_sweep s = {.fn = fn, .imperative = true};
  nb_tensor **g = NULL, **eval = NULL;
  nb_scope_begin();
  bool saved = nbi_no_grad;
  nbi_no_grad = true;
  st = nbi_sweep_collect(&s, &loss, 1, NULL, 0);
  if (!st) {
    g = calloc((size_t)s.n_sources + 1, sizeof *g);
    eval = calloc((size_t)s.n_sources + 1, sizeof *eval);
    if (!g || !eval) st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  }
  if (!st) {
    nb_tensor *seed = nbi_ones_like(loss);
    st = seed ? nbi_sweep_reverse(&s, &loss, &seed, 1, g) : nb_last_status();
  }
  nbi_no_grad = saved;
  int n_eval = 0;
  if (!st) {
    eval[n_eval++] = loss;
    for (int j = 0; j < s.n_sources; j++) {
      nb_tensor *leaf = s.sources[j];
      if (!g[j]) continue;
      nb_tensor *acc = leaf->grad ? nb_add(leaf->grad, g[j]) : g[j];
      if (!acc) {
        st = nb_last_status();
        break;
      }
      nb_release(leaf->grad);
      leaf->grad = nb_retain(acc);
      eval[n_eval++] = acc;
    }
  }
  /* the loss and every new gradient in one realization */
  if (!st) st = nbi_realize(eval, n_eval);
  if (!st) free_provenance(&s);
  nbi_sweep_free(&s);
  nb_scope_end();
  free(g);
  free(eval);
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
  /* Realize val and every pending tensor that reads dst first: nothing
   * computed before the assign may see dst's new value. dst's old value dies
   * there, so an elementwise update (w - lr * g) may write over it. */
  if (!st) st = nbi_realize_assign(dst, val);
  if (!st && val->shard0.buf) {
    nbi_buffer *b = val->shard0.buf;
    nbi_buffer_retain(b);
    for (int sh = 0; sh < dst->n_shards; sh++)
      if (dst->shards[sh].buf) nbi_buffer_release(dst->shards[sh].buf);
    dst->shard0 = val->shard0;
    dst->shard0.buf = b;
    nbi_tensor_drop_graph(dst);
    nbi_lazy_remove(dst);
    dst->op = NBI_OP_CONST;
    dst->attrs = (nbi_attrs){0};
    dst->flags = (dst->flags & NBI_T_REQUIRES_GRAD) | NBI_T_REALIZED;
  }
  nb_scope_end();
  return st;
}
