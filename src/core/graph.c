/* src/core/graph.c — realization of the pending graph: running plans (the
 * stats they count are stats.c's).
 *
 * nbi_realize(ts):
 *  1. collect the pending nodes reachable from ts, in topological order
 *     (iterative post-order DFS; realized tensors are leaves);
 *  2. hash the subgraph's structure (ops, dtypes, shapes, attrs, edges, leaf
 *     layouts, which nodes are roots and which are held from outside) and
 *     look the plan up;
 *  3. on a miss, plan: simplification (simplify.c: steps whose value another
 *     step or leaf already has become aliases and do not run, dead steps are
 *     skipped), fused groups of the steps that run (fuse.c), which values to
 *     keep (the memory policy, plan.c), per step the buffers that die, and
 *     in-place steps; each fused group's description is built here and kept;
 *  4. execute the running steps on their devices' backends (a step reading an
 *     alias reads its source), freeing dead intermediates;
 *  5. kept nodes are marked realized and drop their graph edges (unless
 *     nb_backward still needs them); lazy nodes stay pending.
 * A node is "held from outside" when its refcount exceeds its uses inside the
 * subgraph (a scope, a user, or a pending node outside this realization).
 *
 * Steps 1-3 are plan.c's (plan.h: the graph, the plan and the memory
 * policy); this file runs plans: each running step on its device's backend
 * (a fused group through fuse.c's nbi_fuse_run with the description cached in
 * the plan), in-place buffers checked at run time, kept aliases sharing their
 * sources' storage, dead intermediates freed. exec.c keeps a graph and its
 * plan for reuse (nb_jit); assign.c realizes for nb_assign.
 */
#include "plan.h"
#include "oprules.h"

#include <stdio.h>
#include <stdlib.h>

/* ---- execution ---------------------------------------------------------------------------- */
/* The buffer run position c's output takes in place, or NULL: the plan's
 * input, if its buffer is unshared, contiguous and starts at offset 0.
 * cn: the running steps, their inputs swapped. The input dies at c: an
 * intermediate's reference moves to the output (*from is the input, whose
 * buffer the caller clears once the step ran: no atomic operations); a leaf
 * (the tensor nb_assign rebinds) keeps its own, and the buffer is retained. */
static nbi_buffer *inplace_buffer(const nbi_plan *p, nb_tensor *const *cn, int c,
                                  nb_tensor **from) {
  *from = NULL;
  if (p->inplace[c] < 0) return NULL;
  nb_tensor *x = cn[p->inplace[c] / 4]->in[p->inplace[c] % 4];
  nbi_buffer *b = x->shard0.buf;
  /* 1: only this realization holds it (no other thread can retain it then) */
  if (!b || x->n_shards != 1 || __atomic_load_n(&b->refcount, __ATOMIC_ACQUIRE) != 1 ||
      x->shard0.offset != 0)
    return NULL;
  nbi_view v = nbi_tensor_view(x);
  if (!nbi_view_is_contiguous(&v)) return NULL;
  if (x->mark >= 0)
    *from = x;
  else
    nbi_buffer_retain(b);
  return b;
}

/* Whether run position c's first input is an intermediate that dies at c
 * (its buffer is freed after c): a view of it may take its reference. */
static bool input_dies_here(const nbi_plan *p, const nbi_graph *g, nb_tensor *const *cn, int c) {
  if (cn[c]->n_in < 1 || cn[c]->in[0]->mark < 0) return false;
  for (int f = p->free_start[c]; f < p->free_start[c + 1]; f++)
    if (g->nodes[p->free_idx[f]] == cn[c]->in[0]) return true;
  return false;
}

/* Runs t alone; its output goes to reuse (an input's buffer) when given:
 * retained, or (from not NULL) borrowed from `from`, whose reference moves to
 * t when the step ran. A view of in[0] takes in[0]'s reference when
 * in0_dies (input_dies_here), else retains the buffer. */
static nb_status run_node(nb_tensor *t, nbi_buffer *reuse, nb_tensor *from, bool in0_dies) {
  const nbi_op_def *def = nbi_op_table[t->op];
  nbi_view in[t->n_in > 0 ? t->n_in : 1];
  for (int k = 0; k < t->n_in; k++)
    in[k] = nbi_tensor_view(t->in[k]);
  nbi_view out; /* strides: the view's, else contiguous (set below) */
  out.data = NULL;
  out.dtype = t->dtype;
  out.ndim = t->shape.ndim;
  memcpy(out.dims, t->shape.dims, sizeof out.dims);
  if (def->view) memset(out.strides, 0, sizeof out.strides);

  if (def->view && t->n_in > 0 && def->view(t, &in[0], &out)) {
    if (!from) nbi_buffer_release(reuse);
    nbi_buffer *b = t->in[0]->shard0.buf;
    if (in0_dies)
      t->in[0]->shard0.buf = NULL; /* freed after this step anyway */
    else
      nbi_buffer_retain(b);
    t->shard0.buf = b;
    t->shard0.offset = (out.data - (char *)b->data) / (int64_t)nb_dtype_size(t->dtype);
    memcpy(t->shard0.strides, out.strides, sizeof out.strides);
    return NB_OK;
  }
  const nbi_device *d = nbi_device_at(t->device);
  if (!def->exec && !d->be->supports(d->ctx, t->op, t->dtype)) {
    if (!from) nbi_buffer_release(reuse);
    return nbi_error(NB_ERR_DEVICE, "nb_eval: op %s has no kernel on %s", def->name, d->name);
  }
  size_t nbytes = (size_t)nbi_numel(&t->shape) * nb_dtype_size(t->dtype);
  nbi_buffer *b = reuse ? reuse : nbi_buffer_alloc(t->device, nbytes);
  if (!b) return NB_ERR_OOM;
  out.data = b->data;
  nbi_contig_strides(&t->shape, out.strides);
  nb_status st = def->exec ? def->exec(t, &out, in) : d->be->run_op(d->ctx, t, &out, in);
  if (st) {
    if (!from) nbi_buffer_release(b);
    return st;
  }
  t->shard0.buf = b;
  t->shard0.offset = 0;
  memcpy(t->shard0.strides, out.strides, sizeof out.strides);
  if (from) from->shard0.buf = NULL; /* dead after this step: its reference is t's now */
  nbi_stats_kernel();
  return NB_OK;
}

/* Kept aliased steps of materialization slot c take their source's storage. */
static void share_sources(const nbi_plan *p, const nbi_graph *g, int c) {
  for (int a = p->mat_start[c]; a < p->mat_start[c + 1]; a++) {
    nb_tensor *t = g->nodes[p->mat_idx[a]], *src = nbi_mark_tensor(g, p->alias[p->mat_idx[a]]);
    if (src->shard0.buf) nbi_buffer_retain(src->shard0.buf);
    t->shard0 = src->shard0;
  }
}

/* Runs the fused group cn[f..e] (run positions) that d describes: stored
 * members with an in-place input take its buffer first (nbi_fuse_run keeps a
 * buffer a member already has). */
static nb_status run_group(const nbi_plan *p, nb_tensor *const *cn, int f, int e,
                           const nbi_fused *d) {
  for (int k = f; k <= e; k++) {
    nb_tensor *from;
    nbi_buffer *b = p->store[k] ? inplace_buffer(p, cn, k, &from) : NULL;
    if (!b) continue;
    if (from) nbi_buffer_retain(b); /* a group's members keep their inputs' references */
    nb_tensor *t = cn[k];
    t->shard0.buf = b;
    t->shard0.offset = 0;
    nbi_contig_strides(&t->shape, t->shard0.strides);
  }
  return nbi_fuse_run(d, cn + f);
}

/* After run position c: kept aliases of its value take its storage, and the
 * intermediates dead after it are freed. */
static void step_done(const nbi_plan *p, nbi_graph *g, int c) {
  share_sources(p, g, c + 1);
  for (int f = p->free_start[c]; f < p->free_start[c + 1]; f++) {
    nb_tensor *dead = g->nodes[p->free_idx[f]];
    nbi_buffer_release(dead->shard0.buf);
    dead->shard0.buf = NULL;
  }
}

/* Before p's first run: the backends that compile code (backend.h's
 * prepare) get their groups and the steps that run alone on their devices,
 * with the views the run will give them as far as they can be known now
 * (fuse.c predicts the rest). Best effort: allocation failures skip it. */
_Static_assert(NBI_MAX_DEVICES <= 32, "a device set is a 32-bit mask");
static bool prepares(int dev) { return nbi_device_at(dev)->be->prepare != NULL; }

static void prepare_plan(const nbi_plan *p, nb_tensor *const *cn) {
  int n = p->n_fused, gi = 0, oi = 0;
  uint32_t devs = 0; /* the devices (table indices) whose backends prepare */
  int *first = malloc(sizeof *first * (size_t)(n ? n : 1));
  int *alone = malloc(sizeof *alone * (size_t)(p->n_run ? p->n_run : 1));
  for (int c = 0; first && alone && c < p->n_run; c++) { /* in run order */
    if (c + 1 < p->n_run && p->group[c + 1] == p->group[c]) continue; /* a member */
    int dev = cn[p->group[c]]->device;
    const nbi_op_def *def = nbi_op_table[cn[c]->op];
    if (p->group[c] != c)
      first[gi++] = p->group[c];
    else if (!def->exec && !def->view && prepares(dev))
      alone[oi++] = c;
    else
      continue;
    if (prepares(dev)) devs |= 1u << dev;
  }
  int n_in = 0; /* the alone steps' inputs */
  for (int j = 0; j < oi; j++)
    n_in += cn[alone[j]]->n_in;
  nbi_view(*out)[NBI_FUSE_MAX] = devs ? malloc(sizeof *out * (size_t)(gi + 1)) : NULL;
  nbi_view(*in)[NBI_FUSE_MAX] = out ? malloc(sizeof *in * (size_t)(gi + 1)) : NULL;
  const nbi_group **gs = in ? malloc(sizeof *gs * (size_t)(gi + 1)) : NULL;
  const nbi_view **po = gs ? malloc(sizeof *po * (size_t)(gi + 1)) : NULL;
  const nbi_view **pi = po ? malloc(sizeof *pi * (size_t)(gi + 1)) : NULL;
  const nb_tensor **ops = pi ? malloc(sizeof *ops * (size_t)(oi + 1)) : NULL;
  nbi_view *op_out = ops ? malloc(sizeof *op_out * (size_t)(oi + 1)) : NULL;
  nbi_view *op_inv = op_out ? malloc(sizeof *op_inv * (size_t)(n_in + 1)) : NULL;
  const nbi_view **op_in = op_inv ? malloc(sizeof *op_in * (size_t)(oi + 1)) : NULL;
  for (uint32_t m = op_in ? devs : 0; m; m &= m - 1) {
    int dev = __builtin_ctz(m), k = 0, o = 0, v = 0;
    for (int j = 0; j < gi; j++)
      if (cn[first[j]]->device == dev) {
        nbi_fuse_predict_views(&p->fused[j], cn + first[j], out[k], in[k]);
        gs[k] = &p->fused[j].g, po[k] = out[k], pi[k] = in[k], k++;
      }
    for (int j = 0; j < oi; j++) {
      const nb_tensor *t = cn[alone[j]];
      if (t->device != dev) continue;
      nbi_fuse_predict_node(t, &op_out[o], &op_inv[v]);
      ops[o] = t, op_in[o++] = &op_inv[v];
      v += t->n_in;
    }
    nbi_prepare_list l = {.n_groups = k, .g = gs, .out = po, .in = pi,
                          .n_ops = o, .ops = ops, .op_out = op_out, .op_in = op_in};
    const nbi_device *d = nbi_device_at(dev);
    d->be->prepare(d->ctx, &l);
  }
  free(op_in), free(op_inv), free(op_out), free(ops);
  free(pi), free(po), free(gs), free(in), free(out), free(alone), free(first);
}

/* Executes p's running steps over g's nodes (step 4): the steps that compute,
 * in order, aliased inputs reading their sources, dead intermediates freed.
 * cn_buf: room for n_run nodes, or NULL (allocated here when needed). On
 * failure some nodes may hold partial results (the caller drops them). */
static nb_status plan_exec(const nbi_plan *p, nbi_graph *g, nb_tensor **cn_buf) {
  nb_status st = NB_OK;
  nb_tensor **cn = cn_buf ? cn_buf : g->nodes;
  if (!cn_buf && p->n_run < g->n && !(cn = malloc(sizeof *cn * (size_t)(p->n_run ? p->n_run : 1))))
    return nbi_error(NB_ERR_OOM, "nb_eval: out of memory running %d nodes", g->n);
  for (int c = 0; c < p->n_run; c++)
    cn[c] = g->nodes[p->run[c]];
  nbi_plan_swap_inputs(p, g, true);
  share_sources(p, g, 0);
  /* prepared is the one field a run writes (a plan is otherwise read-only here) */
  if (!__atomic_load_n(&p->prepared, __ATOMIC_RELAXED) && (p->devices & ~1u) &&
      !__atomic_exchange_n(&((nbi_plan *)p)->prepared, 1, __ATOMIC_RELAXED))
    prepare_plan(p, cn);
  for (int c = 0, gi = 0; c < p->n_run && !st; c++) {
    if (c + 1 < p->n_run && p->group[c + 1] == p->group[c])
      ; /* a member of a fused group that runs at its last step */
    else if (p->group[c] != c)
      st = run_group(p, cn, p->group[c], c, &p->fused[gi++]);
    else {
      nb_tensor *from;
      nbi_buffer *reuse = inplace_buffer(p, cn, c, &from);
      bool view = nbi_op_table[cn[c]->op]->view != NULL;
      st = run_node(cn[c], reuse, from, view && !reuse && input_dies_here(p, g, cn, c));
    }
    if (!st) step_done(p, g, c);
  }
  nbi_plan_swap_inputs(p, g, false);
  if (cn != g->nodes && cn != cn_buf) free(cn);
  return st;
}

/* After a run: the errors the checking steps found on asynchronous devices
 * (NBI_OPF_CHECKED). */
static nb_status plan_check(const nbi_plan *p) {
  nb_status st = NB_OK;
  for (uint32_t m = p->check_devices & ~1u; m && !st; m &= m - 1) /* the set bits, cpu:0 aside */
    st = nbi_dev_sync(__builtin_ctz(m));
  return st;
}

/* Depth of realizations running on this thread: a kernel may realize a nested
 * graph (control flow, checkpoint); only the outermost adds to the timers. */
static _Thread_local int depth;
int nbi_realize_depth(void) { return depth; }

nb_status nbi_plan_run(const nbi_plan *p, nbi_graph *g, nb_tensor **cn) {
  depth++;
  nbi_stats_realization();
  nb_status st = plan_exec(p, g, cn);
  if (!st) st = plan_check(p);
  depth--;
  return st;
}

/* nbi_realize, where dying_t[0..n_dying-1] (realized tensors) are nb_assign's
 * dsts: their values die in this realization. seq0 > 0: nb_backward's
 * realization (nbi_realize_backward): held nodes with provenance are planned
 * as temporaries and left lazy; nodes made since seq0 (the backward's own)
 * as temporaries. */
static nb_status realize(nb_tensor *const *ts, int n, nb_tensor *const *dying_t, int n_dying,
                         uint64_t seq0) {
  int r = 0;
  while (r < n && (ts[r]->flags & NBI_T_REALIZED))
    r++;
  if (r == n) return NB_OK; /* nothing pending (reading a value back, say) */
  uint64_t t0 = nbi_ticks(), t1 = 0;
  nbi_plan *p = NULL;
  nbi_graph g = {0};
  nb_status st = nbi_graph_collect(&g, ts, n);
  if (st) {
    nbi_graph_free(&g);
    return nbi_error(st, "nb_eval: out of memory collecting the graph");
  }
  if (g.n == 0) {
    nbi_graph_free(&g);
    return NB_OK;
  }
  nbi_cpu_init(); /* paired with nbi_cpu_done at done: */
  /* uses[g.n], then flags[g.n] and dying[n_leaves + 1] (n_dying) in one block */
  int *uses = calloc(sizeof(int) * (size_t)g.n + (size_t)g.n + (size_t)g.n_leaves + 1, 1);
  uint8_t *flags = uses ? (uint8_t *)(uses + g.n) : NULL;
  bool *dying = uses && n_dying ? (bool *)(flags + g.n) : NULL;
  if (!uses) {
    st = nbi_error(NB_ERR_OOM, "nb_eval: out of memory planning %d nodes", g.n);
    goto done;
  }
  nbi_graph_flags(&g, ts, n, uses, flags);
  /* nb_backward: the forward's intermediates that scopes hold are not kept
   * for them; the plan frees each after its last use in the backward */
  const uint8_t released = 4; /* a flags bit no plan reads (NBI_HELD, NBI_ROOT are 1, 2) */
  for (int i = 0; i < g.n && seq0; i++) {
    const nb_tensor *t = g.nodes[i];
    if ((flags[i] & (NBI_HELD | NBI_ROOT)) != NBI_HELD) continue;
    if (t->seq >= seq0)
      flags[i] = 0; /* held by nb_backward's own scope only */
    else if ((t->flags & NBI_T_GRAD_PATH) && !(t->flags & NBI_T_REQUIRES_GRAD))
      flags[i] = released;
  }
  for (int k = 0; k < n_dying; k++)
    if (dying_t[k]->mark <= -3) dying[-3 - dying_t[k]->mark] = true;

  if (!(p = nbi_plan_get(&g, uses, flags, dying))) {
    st = nbi_error(NB_ERR_OOM, "nb_eval: out of memory planning %d nodes", g.n);
    goto done;
  }
  p->pinned++;
  t1 = nbi_ticks();
  if (!depth) nbi_stats_plan_ticks(t0, t1);
  st = nbi_plan_run(p, &g, NULL);
  /* room in the lazy set for this realization's lazy nodes, reserved after
   * the steps ran: nested realizations (control flow) may have added theirs */
  int n_lazy = 0;
  for (int i = 0; i < g.n; i++)
    n_lazy += (p->fate[i] == NBI_FATE_LAZY && (flags[i] & NBI_HELD)) || flags[i] == released;
  if (!st) st = nbi_lazy_reserve(n_lazy);
  p->pinned--;
  if (st) { /* leave every node pending; drop partial results */
    for (int i = 0; i < g.n; i++) {
      nb_tensor *t = g.nodes[i];
      if (t->shard0.buf) nbi_buffer_release(t->shard0.buf);
      t->shard0.buf = NULL;
    }
    goto done;
  }
  for (int i = 0; i < g.n; i++) {
    nb_tensor *t = g.nodes[i];
    if (p->fate[i] == NBI_FATE_KEEP) {
      t->flags |= NBI_T_REALIZED;
      nbi_lazy_remove(t);
    } else if ((p->fate[i] == NBI_FATE_LAZY && (flags[i] & NBI_HELD)) || flags[i] == released) {
      nbi_lazy_add(t); /* recomputed if it is ever read */
    } else {           /* pending, but only other nodes hold it */
      nbi_lazy_remove(t);
    }
  }
  /* Drop edges only after every node is final and unmarked: releasing edges
   * frees the intermediates (and may free nodes of g). */
  nbi_graph_mark(&g, false);
  g.n_leaves = 0;
  int n_kept = 0;
  for (int i = 0; i < g.n; i++)
    if (p->fate[i] == NBI_FATE_KEEP) g.nodes[n_kept++] = g.nodes[i];
  g.n = 0;
  for (int i = 0; i < n_kept; i++) {
    nb_tensor *t = g.nodes[i];
    /* provenance for nb_backward stays until the backward frees it */
    if (!(t->flags & NBI_T_GRAD_PATH) || (t->flags & NBI_T_GRAD_FREED)) nbi_tensor_drop_graph(t);
  }
done:
  nbi_cpu_done();
  free(uses);
  nbi_graph_free(&g);
  if (t1 && !depth) nbi_stats_exec_ticks(t1, nbi_ticks());
  return st;
}

nb_status nbi_realize_dying(nb_tensor *const *ts, int n, nb_tensor *const *dying, int n_dying) {
  if (depth)
    return nbi_error(NB_ERR_STATE, "nb_assign: cannot rebind a tensor while a kernel runs");
  return realize(ts, n, dying, n_dying, 0);
}

nb_status nbi_realize_backward(nb_tensor *const *ts, int n, uint64_t seq0) {
  return realize(ts, n, NULL, 0, seq0 ? seq0 : 1);
}

/* A sharded root stands for its physical tensors: they are realized instead
 * (pending partial sums stay partial). */
nb_status nbi_realize(nb_tensor *const *ts, int n) {
  int extra = 0;
  for (int i = 0; i < n; i++)
    if (ts[i]->mesh) extra += ts[i]->n_phys;
  if (!extra) return realize(ts, n, NULL, 0, 0);
  nb_tensor **all = malloc(sizeof *all * (size_t)(n + extra));
  if (!all) return nbi_error(NB_ERR_OOM, "nb_eval: out of memory");
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (!ts[i]->mesh) all[m++] = ts[i];
    for (int d = 0; ts[i]->mesh && d < ts[i]->n_phys; d++)
      all[m++] = ts[i]->phys[d];
  }
  nb_status st = realize(all, m, NULL, 0, 0);
  free(all);
  return st;
}
