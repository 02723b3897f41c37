/* src/core/assign.c — the single-device rebind behind nb_assign and
 * nb_assign_n, and what it realizes first (nbi_realize_assign_n), in a
 * realization where the dsts' old values die (plan.c, "In place").
 *
 * nb_assign (src/transforms/backward.c) checks its arguments, casts and sends
 * a sharded dst to the sharding layer, which rebinds each physical tensor
 * through this function; so both reach down into core and the sharding layer
 * never calls the public, transforms-level nb_assign. */
#include "plan.h"
#include "oprules.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- nb_assign's realization ------------------------------------------------------------
 * Which pending tensors must be realized before dsts are rebound, found by
 * DFS over the pending graph with the tensors' mark field (-1 when idle), as
 * the planner's own passes use it (plan.c); it is reset before realizing. */
/* nb_assign's destinations as a sorted set (bsearch by address). */
typedef struct dst_set {
  nb_tensor *const *v; /* sorted */
  int n;
} dst_set;

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (nb_tensor *const *)a, y = (uintptr_t) * (nb_tensor *const *)b;
  return x < y ? -1 : x > y;
}

/* Index of t in d, or -1. */
static int dst_find(const dst_set *d, const nb_tensor *t) {
  if (d->n == 1) return d->v[0] == t ? 0 : -1;
  nb_tensor *const *r = bsearch(&t, d->v, (size_t)d->n, sizeof *d->v, cmp_ptr);
  return r ? (int)(r - d->v) : -1;
}

/* The walks' shared cleanup: marks back to idle (-1), arrays freed. */
static void unmark(nb_tensor *const *t, int n) {
  for (int i = 0; i < n; i++)
    t[i]->mark = -1;
}

static void walk_free(nb_tensor **stack, int *next, nb_tensor **seen) {
  free(stack);
  free(next);
  free(seen);
}

/* nb_assign: marks every pending tensor reachable from cand[0..n-1] by whether
 * it reads a tensor of dst (transitively) and returns, in roots, the last
 * n_vals candidates (the values assigned) and the others that do. An
 * iterative DFS over pending nodes: mark -2 on the stack, -4 does not read a
 * dst, -5 does; visited nodes are listed for the reset. */
static bool frozen_pending(const nb_tensor *t) {
  return (t->flags & (NBI_T_FROZEN | NBI_T_REALIZED)) == NBI_T_FROZEN;
}

/* skip_frozen: frozen pending nodes read no dst (every dst is realized and
 * was never frozen), so the walk passes over them. */
static nb_status assign_roots(const dst_set *dst, nb_tensor *const *cand, int n, int n_vals,
                              bool skip_frozen, nb_tensor **roots, int *n_roots) {
  nb_tensor **stack = NULL, **seen = NULL;
  int *next = NULL, sp = 0, cap = 0, n_seen = 0, cap_seen = 0, cap_reads = 0;
  bool *reads = NULL; /* [cap_reads]: grown with the stack, not on every push */
  nb_status st = NB_OK;
  for (int c = 0; c < n && !st; c++) {
    if (cand[c]->mark != -1 || (cand[c]->flags & NBI_T_REALIZED)) continue;
    if (skip_frozen && frozen_pending(cand[c])) continue;
    if (!nbi_dfs_push(&stack, &next, &sp, &cap, cand[c])) st = NB_ERR_OOM;
    bool *grown = st ? NULL : cap == cap_reads ? reads : realloc(reads, sizeof(bool) * (size_t)cap);
    if (!grown)
      st = NB_ERR_OOM;
    else
      reads = grown, cap_reads = cap, reads[sp - 1] = false;
    while (sp && !st) {
      nb_tensor *t = stack[sp - 1];
      if (next[sp - 1] < t->n_in) {
        nb_tensor *x = t->in[next[sp - 1]++];
        if (skip_frozen && frozen_pending(x)) continue;
        if ((x->flags & NBI_T_REALIZED) || x->mark == -4 || x->mark == -5) {
          if (x->mark == -5 || dst_find(dst, x) >= 0) reads[sp - 1] = true;
          continue;
        }
        if (!nbi_dfs_push(&stack, &next, &sp, &cap, x) ||
            !(grown = cap == cap_reads ? reads : realloc(reads, sizeof(bool) * (size_t)cap))) {
          st = NB_ERR_OOM;
          break;
        }
        reads = grown, cap_reads = cap;
        reads[sp - 1] = false;
        continue;
      }
      bool r = reads[sp - 1] || dst_find(dst, t) >= 0;
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
    if ((cand[c]->mark == -5 || c >= n - n_vals) && cand[c]->mark != -6) {
      cand[c]->mark = -6; /* listed once */
      roots[nr++] = cand[c];
    }
  unmark(stack, sp);
  unmark(seen, n_seen);
  unmark(roots, nr);
  *n_roots = nr;
  walk_free(stack, next, seen);
  free(reads);
  return st ? nbi_error(st, "nb_assign: out of memory") : NB_OK;
}

/* Freezes the lazy candidates (not values assigned) that carry no live
 * provenance, so that this and every later nb_assign passes over them
 * instead of walking them again (an imperative step's eight assigns walked
 * the backward's lazy forward values eight times). In their pending
 * subtree, each dst and requires-grad leaf read (the likely dsts of the
 * next assigns) is replaced by a new leaf sharing its buffer; every other
 * realized tensor read gets frozen_src (nbi.h), and an assign to one
 * walks frozen nodes too (rewire_lazy then gives them a share). The subtree
 * is flagged NBI_T_FROZEN. A subtree that reads a sharded, remote or traced
 * tensor, or that has a node with live provenance (nb_backward must still
 * reach the leaves through it), is left as it is. Called only when every dst
 * is realized and unflagged: a frozen subtree then holds no dst. Shared
 * leaves are numbered in their mark (-10 - k) while the pass runs. */
static bool freeze_ok_node(const nb_tensor *t) {
  if (t->flags & NBI_T_REALIZED)
    return t->n_shards == 1 && !t->mesh && !(t->flags & (NBI_T_REMOTE | NBI_T_TRACED));
  return !t->mesh && t->n_shards == 1 && !(t->flags & NBI_T_TRACED) &&
         (!(t->flags & NBI_T_GRAD_PATH) || (t->flags & NBI_T_GRAD_FREED));
}

static nb_status freeze_lazy(const dst_set *dst, const dst_set *vals, nb_tensor *const *cand,
                             int n) {
  nb_tensor **stack = NULL, **seen = NULL, **src = NULL, **share = NULL;
  int *next = NULL, sp = 0, cap = 0, n_seen = 0, cap_seen = 0, n_src = 0, cap_src = 0;
  bool oom = false;
  for (int c = 0; c < n && !oom; c++) {
    nb_tensor *l = cand[c];
    if (!(l->flags & NBI_T_LAZY) || (l->flags & (NBI_T_FROZEN | NBI_T_REALIZED)) ||
        l->mark != -1 || dst_find(vals, l) >= 0)
      continue;
    /* walk l's pending subtree; seen[first..] are its new nodes */
    int first = n_seen, first_src = n_src;
    bool ok = freeze_ok_node(l);
    oom = !nbi_push_tensor(&seen, &n_seen, &cap_seen, l) ||
          !nbi_dfs_push(&stack, &next, &sp, &cap, l);
    l->mark = -2;
    while (sp && !oom) {
      nb_tensor *t = stack[sp - 1];
      if (next[sp - 1] == t->n_in) {
        sp--;
        continue;
      }
      nb_tensor *x = t->in[next[sp - 1]++];
      if (x->mark != -1 || frozen_pending(x)) continue;
      ok = ok && freeze_ok_node(x);
      if ((x->flags & (NBI_T_REALIZED | NBI_T_REQUIRES_GRAD)) == NBI_T_REALIZED &&
          dst_find(dst, x) < 0) {
        x->frozen_src = 1; /* stale when l is not frozen: a full walk */
        continue;
      }
      if (x->flags & NBI_T_REALIZED) {
        oom = !nbi_push_tensor(&src, &n_src, &cap_src, x);
        x->mark = -10 - (n_src - 1);
        continue;
      }
      x->mark = -2;
      oom = !nbi_push_tensor(&seen, &n_seen, &cap_seen, x) ||
            !nbi_dfs_push(&stack, &next, &sp, &cap, x);
    }
    sp = 0;
    if (ok || oom) continue;
    /* not frozen: its nodes may be met again from another candidate */
    unmark(seen + first, n_seen - first);
    unmark(src + first_src, n_src - first_src);
    n_seen = first;
    n_src = first_src;
  }
  share = oom || !n_src ? NULL : calloc((size_t)n_src, sizeof *share);
  oom = oom || (n_src && !share);
  for (int k = 0; k < n_src && !oom; k++)
    oom = !(share[k] = nbi_leaf_share(src[k]));
  for (int i = 0; i < n_seen && !oom; i++) {
    nb_tensor *t = seen[i];
    for (int k = 0; k < t->n_in; k++) {
      nb_tensor *x = t->in[k];
      if (!(x->flags & NBI_T_REALIZED) || x->mark > -10) continue;
      t->in[k] = nb_retain(share[-10 - x->mark]);
      nb_release(x);
    }
    t->flags |= NBI_T_FROZEN;
  }
  unmark(seen, n_seen);
  unmark(src, n_src);
  walk_free(stack, next, seen);
  free(src);
  free(share); /* the leaves live in the current scope and in their readers */
  if (!oom) return NB_OK;
  if (!nb_last_status()) nbi_error(NB_ERR_OOM, "nb_assign: out of memory");
  return nb_last_status();
}

/* Lazy readers of the dsts among the roots (the values assigned aside)
 * computed nothing yet and may never be read: rather than running them,
 * point them (and the pending nodes under them) at new leaves sharing each
 * dst's current buffer. That buffer is then shared, so that dst is not
 * written in place. Not when such a reader still carries provenance for
 * nb_backward (the gradient must reach the dst): then they stay roots.
 * Only realized single-shard dsts are rewired. Drops the rewired roots from
 * roots[0..*n-1]. */
static nb_status rewire_lazy(const dst_set *dst, const dst_set *vals, nb_tensor **roots, int *n) {
  nb_tensor **stack = NULL, **seen = NULL;
  int *next = NULL, sp = 0, cap = 0, n_seen = 0, cap_seen = 0;
  bool ok = true, any = false, oom = false;
  for (int r = 0; r < *n && ok; r++) {
    nb_tensor *l = roots[r];
    if (!(l->flags & NBI_T_LAZY) || l->mark != -1 || dst_find(vals, l) >= 0) continue;
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
      int d = dst_find(dst, x);
      if (d >= 0 && (((t->flags & NBI_T_GRAD_PATH) && !(t->flags & NBI_T_GRAD_FREED)) ||
                     !(x->flags & NBI_T_REALIZED) || x->n_shards != 1))
        ok = false; /* x keeps its readers: they run now */
      if ((x->flags & NBI_T_REALIZED) || x->mark != -1) continue;
      oom = !nbi_push_tensor(&seen, &n_seen, &cap_seen, x) ||
            !nbi_dfs_push(&stack, &next, &sp, &cap, x);
    }
    ok = ok && !oom;
  }
  nb_tensor **old = ok && any ? calloc((size_t)dst->n, sizeof *old) : NULL;
  bool failed = ok && any && !old;
  for (int i = 0; i < n_seen; i++) {
    nb_tensor *t = seen[i];
    t->mark = -1;
    for (int k = 0; k < t->n_in && old && !failed; k++) {
      int d = dst_find(dst, t->in[k]);
      if (d < 0) continue;
      if (!old[d] && !(old[d] = nbi_leaf_share(dst->v[d]))) {
        failed = true;
        break;
      }
      t->in[k] = nb_retain(old[d]);
      nb_release(dst->v[d]); /* the caller holds dst */
    }
  }
  walk_free(stack, next, seen);
  free(old); /* the leaves live in the current scope and in their readers */
  if (oom) return nbi_error(NB_ERR_OOM, "nb_assign: out of memory");
  if (failed && !nb_last_status()) nbi_error(NB_ERR_OOM, "nb_assign: out of memory");
  if (failed) return nb_last_status();
  if (!ok || !any) return NB_OK;
  int m = 0;
  for (int r = 0; r < *n; r++)
    if (dst_find(vals, roots[r]) >= 0 || !(roots[r]->flags & NBI_T_LAZY)) roots[m++] = roots[r];
  *n = m;
  return NB_OK;
}

nb_status nbi_realize_assign_n(nb_tensor *const *dst, int n_dst, nb_tensor *const *val, int n_val) {
  if (nbi_realize_depth())
    return nbi_error(NB_ERR_STATE, "nb_assign: cannot rebind a tensor while a kernel runs");
  bool pending = false;
  for (int k = 0; k < n_val && !pending; k++)
    pending = !(val[k]->flags & NBI_T_REALIZED);
  if (!pending && !nbi_any_held_pending())
    return NB_OK; /* nothing pending reads a dst or needs realizing */
  /* every dst realized, never frozen and no frozen node's source: no frozen
   * node reads one */
  bool quiet = true;
  for (int k = 0; k < n_dst && quiet; k++)
    quiet = (dst[k]->flags & (NBI_T_REALIZED | NBI_T_FROZEN)) == NBI_T_REALIZED &&
            !dst[k]->frozen_src;
  nb_tensor **cand = NULL, **roots = NULL, **sd = NULL, **sv = NULL, **dying = NULL;
  nb_tensor **block = NULL; /* sd, sv, dying and roots in one allocation */
  int n = 0, cap = 0, n_roots = 0, n_dying = 0;
  nb_status st = nbi_held_pending(&cand, &n, &cap, quiet);
  if (!st) {
    nb_tensor **grown = n + n_val <= cap ? cand : realloc(cand, (size_t)(n + n_val + 1) * sizeof *grown);
    if (grown) cand = grown;
    block = grown ? malloc(sizeof *block * (size_t)(2 * n_dst + 2 * n_val + n + 1)) : NULL;
    if (!block) st = nbi_error(NB_ERR_OOM, "nb_assign: out of memory");
  }
  if (!st) {
    sd = block;
    sv = sd + n_dst;
    dying = sv + n_val;
    roots = dying + n_dst;
    for (int k = 0; k < n_val; k++)
      cand[n++] = val[k];
  }
  dst_set ds = {sd, n_dst}, vs = {sv, n_val};
  if (!st) {
    memcpy(sd, dst, sizeof *sd * (size_t)n_dst);
    memcpy(sv, val, sizeof *sv * (size_t)n_val);
    qsort(sd, (size_t)n_dst, sizeof *sd, cmp_ptr);
    qsort(sv, (size_t)n_val, sizeof *sv, cmp_ptr);
    if (quiet) st = freeze_lazy(&ds, &vs, cand, n - n_val);
    if (!st) st = assign_roots(&ds, cand, n, n_val, quiet, roots, &n_roots);
  }
  if (!st) st = rewire_lazy(&ds, &vs, roots, &n_roots);
  /* a dst's value dies in the plan (may be written over) unless a value
   * assigned is that very tensor (a swap: its buffer moves to another dst) */
  for (int k = 0; k < n_dst && !st; k++)
    if ((dst[k]->flags & NBI_T_REALIZED) && dst_find(&vs, dst[k]) < 0) dying[n_dying++] = dst[k];
  if (!st) st = nbi_realize_dying(roots, n_roots, dying, n_dying);
  free(cand);
  free(block);
  return st;
}

nb_status nbi_realize_assign(nb_tensor *dst, nb_tensor *val) {
  return nbi_realize_assign_n(&dst, 1, &val, 1);
}

/* ---- rebinding -------------------------------------------------------------------------- */
/* dst takes val's storage (val realized with a buffer). */
static void rebind(nb_tensor *dst, nb_tensor *val) {
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
  dst->frozen_src = 0; /* its frozen readers were given the old value */
}

nb_status nbi_assign_rebind(nb_tensor *dst, nb_tensor *val) {
  assert(!dst->mesh && !val->mesh && dst->dtype == val->dtype);
  nb_scope_begin();
  /* Realize val and every pending tensor that reads dst first: nothing
   * computed before the assign may see dst's new value. dst's old value dies
   * there, so an elementwise update (w - lr * g) may write over it. */
  nb_status st = nbi_realize_assign(dst, val);
  if (!st && val->shard0.buf) rebind(dst, val);
  nb_scope_end();
  return st;
}

nb_status nbi_assign_rebind_n(nb_tensor *const *dst, nb_tensor *const *val, int n,
                              nb_tensor *const *extra, int n_extra) {
  nb_tensor **roots = malloc(sizeof *roots * (size_t)(n + n_extra + 1));
  if (!roots) return nbi_error(NB_ERR_OOM, "nb_assign_n: out of memory");
  /* extras first: the plan's order follows its roots, so an optimizer's
   * state (and the scalars it needs) comes before the parameters it feeds */
  for (int k = 0; k < n_extra; k++)
    roots[k] = extra[k];
  for (int k = 0; k < n; k++) {
    assert(!dst[k]->mesh && !val[k]->mesh && dst[k]->dtype == val[k]->dtype);
    roots[n_extra + k] = val[k];
  }
  nb_scope_begin();
  nb_status st = nbi_realize_assign_n(dst, n, roots, n + n_extra);
  /* a val that is another dst (a swap) is read before that dst is rebound:
   * take every new storage first */
  nbi_storage *keep = st ? NULL : malloc(sizeof *keep * (size_t)(n + 1));
  if (!st && !keep) st = nbi_error(NB_ERR_OOM, "nb_assign_n: out of memory");
  for (int k = 0; k < n && !st; k++) {
    keep[k] = val[k]->shard0;
    if (keep[k].buf) nbi_buffer_retain(keep[k].buf);
  }
  for (int k = 0; k < n && !st; k++) {
    if (!keep[k].buf) continue;
    nb_tensor tmp = {.shard0 = keep[k]};
    rebind(dst[k], &tmp);
    nbi_buffer_release(keep[k].buf);
  }
  free(keep);
  nb_scope_end();
  free(roots);
  return st;
}
