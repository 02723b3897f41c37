/* src/core/assign.c — the single-device rebind behind nb_assign, and its
 * realization.
 *
 * nb_assign (src/transforms/backward.c) checks its arguments, casts and sends
 * a sharded dst to the sharding layer, which rebinds each physical tensor
 * through nbi_assign_rebind; so both reach down into core and the sharding
 * layer never calls the public, transforms-level nb_assign. The rebind first
 * realizes (nbi_realize_assign) the value with every pending tensor that
 * reads dst, so none of them sees dst's next value, in a realization where
 * dst's old value dies (plan.c, "In place"). */
#include "plan.h"

#include <assert.h>
#include <stdlib.h>

/* nb_assign: marks every pending tensor reachable from cand[0..n-1] by whether
 * it reads dst (transitively) and returns, in roots, val and the candidates
 * that do. An iterative DFS over pending nodes: mark -2 on the stack, -4 does
 * not read dst, -5 does; visited nodes are listed for the reset. */
static nb_status assign_roots(nb_tensor *dst, nb_tensor *const *cand, int n, nb_tensor **roots,
                              int *n_roots) {
  nb_tensor **stack = NULL, **seen = NULL;
  int *next = NULL, sp = 0, cap = 0, n_seen = 0, cap_seen = 0;
  bool *reads = NULL;
  nb_status st = NB_OK;
  for (int c = 0; c < n && !st; c++) {
    if (cand[c]->mark != -1 || (cand[c]->flags & NBI_T_REALIZED)) continue;
    if (!nbi_dfs_push(&stack, &next, &sp, &cap, cand[c])) st = NB_ERR_OOM;
    bool *grown = st ? NULL : realloc(reads, sizeof(bool) * (size_t)cap);
    if (!grown)
      st = NB_ERR_OOM;
    else
      reads = grown, reads[sp - 1] = false;
    while (sp && !st) {
      nb_tensor *t = stack[sp - 1];
      if (next[sp - 1] < t->n_in) {
        nb_tensor *x = t->in[next[sp - 1]++];
        if ((x->flags & NBI_T_REALIZED) || x->mark == -4 || x->mark == -5) {
          if (x == dst || x->mark == -5) reads[sp - 1] = true;
          continue;
        }
        if (!nbi_dfs_push(&stack, &next, &sp, &cap, x) ||
            !(grown = realloc(reads, sizeof(bool) * (size_t)cap))) {
          st = NB_ERR_OOM;
          break;
        }
        reads = grown;
        reads[sp - 1] = false;
        continue;
      }
      bool r = t == dst || reads[sp - 1];
      if (!nbi_push_tensor(&seen, &n_seen, &cap_seen, t)) {
        st = NB_ERR_OOM;
        break;
      }
      t->mark = r ? -5 : -4;
      if (--sp && r) reads[sp - 1] = true;
    }
  }
  int nr = 0;
  for (int c = 0; c < n && !st; c++)
    if (cand[c]->mark == -5 || c == n - 1) { /* the last candidate is val */
      cand[c]->mark = -6;                    /* listed once */
      roots[nr++] = cand[c];
    }
  for (int i = 0; i < sp; i++)
    stack[i]->mark = -1;
  for (int i = 0; i < n_seen; i++)
    seen[i]->mark = -1;
  for (int c = 0; c < nr; c++)
    roots[c]->mark = -1;
  *n_roots = nr;
  free(stack);
  free(next);
  free(seen);
  free(reads);
  return st ? nbi_error(st, "nb_assign: out of memory") : NB_OK;
}

/* Lazy readers of dst among the roots (val aside) computed nothing yet and
 * may never be read: rather than running them, point them (and the pending
 * nodes under them) at a new leaf sharing dst's current buffer. That buffer
 * is then shared, so dst is not written in place. Not when such a reader
 * still carries provenance for nb_backward (the gradient must reach dst):
 * then they stay roots. Drops the rewired roots from roots[0..*n-1]. */
static nb_status rewire_lazy(nb_tensor *dst, const nb_tensor *val, nb_tensor **roots, int *n) {
  nb_tensor **stack = NULL, **seen = NULL;
  int *next = NULL, sp = 0, cap = 0, n_seen = 0, cap_seen = 0;
  bool ok = true, any = false, oom = false;
  for (int r = 0; r < *n && ok; r++) {
    nb_tensor *l = roots[r];
    if (l == val || !(l->flags & NBI_T_LAZY) || l->mark != -1) continue;
    any = true;
    oom = !nbi_push_tensor(&seen, &n_seen, &cap_seen, l) ||
          !nbi_dfs_push(&stack, &next, &sp, &cap, l);
    while (sp && !oom) {
      nb_tensor *t = stack[sp - 1];
      if (next[sp - 1] == t->n_in) {
        sp--;
        continue;
      }
      nb_tensor *x = t->in[next[sp - 1]++];
      if (x == dst && (t->flags & NBI_T_GRAD_PATH) && !(t->flags & NBI_T_GRAD_FREED)) ok = false;
      if ((x->flags & NBI_T_REALIZED) || x->mark != -1) continue;
      oom = !nbi_push_tensor(&seen, &n_seen, &cap_seen, x) ||
            !nbi_dfs_push(&stack, &next, &sp, &cap, x);
    }
    ok = ok && !oom;
  }
  nb_tensor *old = ok && any ? nbi_leaf_share(dst) : NULL;
  for (int i = 0; i < n_seen; i++) {
    nb_tensor *t = seen[i];
    t->mark = -1;
    for (int k = 0; k < t->n_in && old; k++)
      if (t->in[k] == dst) {
        t->in[k] = nb_retain(old);
        nb_release(dst); /* the caller holds dst */
      }
  }
  free(stack);
  free(next);
  free(seen);
  if (oom) return nbi_error(NB_ERR_OOM, "nb_assign: out of memory");
  if (ok && any && !old) return nb_last_status();
  if (!old) return NB_OK;
  int m = 0;
  for (int r = 0; r < *n; r++)
    if (roots[r] == val || !(roots[r]->flags & NBI_T_LAZY)) roots[m++] = roots[r];
  *n = m;
  return NB_OK;
}

nb_status nbi_realize_assign(nb_tensor *dst, nb_tensor *val) {
  if (nbi_realize_depth())
    return nbi_error(NB_ERR_STATE, "nb_assign: cannot rebind a tensor while a kernel runs");
  if ((val->flags & NBI_T_REALIZED) && !nbi_any_held_pending())
    return NB_OK; /* nothing pending reads dst or needs realizing */
  nb_tensor **cand = NULL, **roots = NULL;
  int n = 0, cap = 0, n_roots = 0;
  nb_status st = nbi_held_pending(&cand, &n, &cap);
  if (!st && n == cap) {
    nb_tensor **grown = realloc(cand, (size_t)(cap + 1) * sizeof *grown);
    if (grown)
      cand = grown;
    else
      st = nbi_error(NB_ERR_OOM, "nb_assign: out of memory");
  }
  if (!st) {
    cand[n++] = val;
    roots = malloc(sizeof *roots * (size_t)n);
    if (!roots) st = nbi_error(NB_ERR_OOM, "nb_assign: out of memory");
  }
  if (!st) st = assign_roots(dst, cand, n, roots, &n_roots);
  if (!st && (dst->flags & NBI_T_REALIZED) && dst->n_shards == 1)
    st = rewire_lazy(dst, val, roots, &n_roots);
  if (!st) st = nbi_realize_dying(roots, n_roots, dst->flags & NBI_T_REALIZED ? dst : NULL);
  free(cand);
  free(roots);
  return st;
}

nb_status nbi_assign_rebind(nb_tensor *dst, nb_tensor *val) {
  assert(!dst->mesh && !val->mesh && dst->dtype == val->dtype);
  nb_scope_begin();
  /* Realize val and every pending tensor that reads dst first: nothing
   * computed before the assign may see dst's new value. dst's old value dies
   * there, so an elementwise update (w - lr * g) may write over it. */
  nb_status st = nbi_realize_assign(dst, val);
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
