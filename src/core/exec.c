/* src/core/exec.c — planned executables, nb_jit's fast path (nbi.h,
 * nbi_exec_*): the graph and plan of one realization kept for reuse.
 *
 * The graph and plan of one realization kept for reuse: the nodes stay pending
 * between runs (retained through the roots), each run binds the slots (leaves
 * standing for the inputs) to the call's tensors, executes the plan with no
 * collection, hashing, lookup or allocation of its own, hands each root's
 * value to a fresh leaf and clears every node's buffer again. */
#include "plan.h"

#include <stdlib.h>

struct nbi_exec {
  nbi_graph g;
  nbi_plan p;
  nb_tensor **cn;    /* [p.n_run] scratch for plan_exec */
  nb_tensor **slots; /* [n_slots] retained */
  int n_slots;
  nb_tensor **roots; /* [n_roots] retained */
  int n_roots;
  bool fusion, simplify; /* the settings it was planned under */
  bool busy;             /* a run is in progress (a nested call takes the slow path) */
};

void nbi_exec_free(nbi_exec *x) {
  if (!x) return;
  nbi_plan_clear(&x->p);
  free(x->g.nodes);
  free(x->g.leaves);
  free(x->cn);
  for (int r = 0; r < x->n_roots; r++)
    nb_release(x->roots[r]);
  for (int k = 0; k < x->n_slots; k++)
    nb_release(x->slots[k]);
  free(x->roots);
  free(x->slots);
  free(x);
}

nbi_exec *nbi_exec_build(nb_tensor *const *slots, int n_slots, nb_tensor *const *roots,
                         int n_roots) {
  nbi_exec *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->slots = malloc(sizeof *x->slots * (size_t)(n_slots ? n_slots : 1));
  x->roots = malloc(sizeof *x->roots * (size_t)(n_roots ? n_roots : 1));
  if (!x->slots || !x->roots) goto fail;
  for (int k = 0; k < n_slots; k++)
    x->slots[x->n_slots++] = nb_retain(slots[k]);
  for (int r = 0; r < n_roots; r++)
    x->roots[x->n_roots++] = nb_retain(roots[r]);
  x->fusion = nbi_fusion_enabled();
  x->simplify = nbi_simplify_enabled();
  nb_status st = nbi_graph_collect(&x->g, roots, n_roots);
  int m = x->g.n ? x->g.n : 1;
  int *uses = st ? NULL : calloc((size_t)m, sizeof(int));
  uint8_t *flags = st ? NULL : calloc((size_t)m, 1);
  bool ok = uses && flags;
  if (ok) {
    nbi_graph_flags(&x->g, roots, n_roots, uses, flags);
    ok = nbi_plan_fill(&x->p, &x->g, flags, NULL);
  }
  free(uses);
  free(flags);
  nbi_graph_mark(&x->g, false);
  if (!ok || !(x->cn = malloc(sizeof *x->cn * (size_t)(x->p.n_run ? x->p.n_run : 1)))) goto fail;
  for (int k = 0; k < x->n_slots; k++) { /* bound per run */
    nbi_buffer_release(x->slots[k]->shard0.buf);
    x->slots[k]->shard0.buf = NULL;
  }
  return x;
fail:
  nbi_exec_free(x);
  return NULL;
}

bool nbi_exec_fits(const nbi_exec *x, nb_tensor *const *in) {
  if (x->busy || x->fusion != nbi_fusion_enabled() || x->simplify != nbi_simplify_enabled())
    return false;
  for (int k = 0; k < x->n_slots; k++) {
    const nb_tensor *t = in[k], *s = x->slots[k];
    if (!(t->flags & NBI_T_REALIZED) || (t->flags & NBI_T_TRACED) || t->n_shards != 1 || t->mesh ||
        !t->shard0.buf || t->dtype != s->dtype || !nbi_shape_eq(&t->shape, &s->shape))
      return false;
    /* the plan was made for the slots' layouts (in-place and fusion choices read them) */
    for (int d = 0; d < t->shape.ndim; d++)
      if (t->shape.dims[d] != 1 && t->shard0.strides[d] != s->shard0.strides[d]) return false;
  }
  return true;
}

nb_status nbi_exec_run(nbi_exec *x, nb_tensor *const *in, nb_tensor **out) {
  uint64_t t0 = nbi_realize_depth() ? 0 : nbi_ticks();
  nbi_cpu_init(); /* this thread's FP mode and kernel threads, as realize does */
  for (int r = 0; r < x->n_roots; r++)
    out[r] = NULL;
  /* bind: the slots borrow the inputs' storage (no reference: the caller holds
   * in[] for the call, captures are held by the pinned jit entry, and a plan
   * never frees nor writes over a leaf's buffer; two atomic operations per
   * input were a sixth of a tiny jitted call) */
  for (int k = 0; k < x->n_slots; k++)
    x->slots[k]->shard0 = in[k]->shard0;
  /* marked as during a realization: group kernels find their members by mark */
  nbi_graph_mark(&x->g, true);
  x->busy = true;
  nb_status st = nbi_plan_run(&x->p, &x->g, x->cn);
  x->busy = false;
  /* each output takes its computed root's buffer reference (the loop below
   * would drop it; marks still tell nodes, >= 0, from leaves); a root listed
   * again shares the output that took it, and a leaf (a slot borrows its
   * storage, a capture's is the entry's) is shared */
  for (int r = 0; r < x->n_roots && !st; r++) {
    nb_tensor *t = x->roots[r];
    int prev = -1;
    if (t->mark >= 0 && !t->shard0.buf) /* taken by an earlier output, or empty */
      for (int q = r - 1; q >= 0 && prev < 0; q--)
        if (x->roots[q] == t) prev = q;
    out[r] = prev >= 0        ? nbi_leaf_share(out[prev])
             : t->mark >= 0 ? nbi_leaf_take(t)
                            : nbi_leaf_share(t);
    if (!out[r]) st = nb_last_status();
  }
  nbi_graph_mark(&x->g, false);
  if (st)
    for (int r = 0; r < x->n_roots; r++)
      out[r] = NULL;                 /* the scope frees those made */
  for (int i = 0; i < x->g.n; i++) { /* every node pending and empty again */
    nb_tensor *t = x->g.nodes[i];
    nbi_buffer_release(t->shard0.buf);
    t->shard0.buf = NULL;
  }
  for (int k = 0; k < x->n_slots; k++)
    x->slots[k]->shard0.buf = NULL;
  nbi_cpu_done();
  if (t0) nbi_stats_exec_ticks(t0, nbi_ticks());
  return st;
}
