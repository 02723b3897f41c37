/* src/core/plan.h — realization's internal contract, shared by the files that
 * realize the pending graph: plan.c (collection, hashing, the plan with its
 * memory policy, the plan cache, nb_graph_dot's description), graph.c
 * (execution, nbi_realize, stats), exec.c (planned executables: nb_jit's fast
 * path) and assign.c (nb_assign's realization). Nothing outside src/core
 * includes it. */
#ifndef NABLA_PLAN_H
#define NABLA_PLAN_H

#include "fuse.h"
#include "oprules.h"

/* A cheap monotonic count for the stats' durations (stats.c): the x86 time
 * stamp counter where it is invariant (~9 ns to read in a VM where the vDSO
 * clock takes ~20), else CLOCK_MONOTONIC nanoseconds; nb_get_stats converts. */
uint64_t nbi_ticks(void);

/* ---- the graph of one realization (plan.c) ---------------------------------------- */
typedef struct nbi_graph {
  nb_tensor **nodes; /* pending nodes, topological order */
  int n, cap;
  nb_tensor **leaves; /* realized inputs, in order of first use */
  int n_leaves, cap_leaves;
} nbi_graph;

/* Appends t to (*arr)[0..*n) (capacity *cap, grown by doubling); false when
 * out of memory. */
bool nbi_push_tensor(nb_tensor ***arr, int *n, int *cap, nb_tensor *t);
/* Pushes t on a DFS stack (its next-input cursor at 0) and marks it -2 (on
 * the stack); false when the stack cannot grow. */
bool nbi_dfs_push(nb_tensor ***stack, int **next, int *n, int *cap, nb_tensor *t);
/* Collects the pending nodes reachable from roots into g (all zero) in
 * topological order (post-order DFS; realized tensors are leaves). Every
 * visited tensor gets a mark: its node index, or -3 - its leaf index; reset
 * with nbi_graph_mark(g, false) or nbi_graph_free. On failure (out of
 * memory) g holds what was collected. */
nb_status nbi_graph_collect(nbi_graph *g, nb_tensor *const *roots, int n_roots);
/* Marks every node with its index and every leaf with -3 - its index (on),
 * or back to idle -1 (off). */
void nbi_graph_mark(const nbi_graph *g, bool on);
/* Unmarks g's tensors and frees its arrays. */
void nbi_graph_free(nbi_graph *g);

enum { NBI_HELD = 1, NBI_ROOT = 2 }; /* per-node flags of a realization */
/* uses[i]: step i's readers in g (zeroed by the caller); flags[i]: NBI_HELD when
 * its value must outlive the realization (referenced from outside g, or a
 * root), NBI_ROOT for ts[0..n-1]. */
void nbi_graph_flags(const nbi_graph *g, nb_tensor *const *ts, int n, int *uses, uint8_t *flags);

/* The tensor a mark names: a step (>= 0) or a leaf (-3 - k). */
static inline nb_tensor *nbi_mark_tensor(const nbi_graph *g, int m) {
  return m >= 0 ? g->nodes[m] : g->leaves[-3 - m];
}

/* ---- the plan (plan.c) ------------------------------------------------------------ */
typedef struct nbi_plan {
  uint64_t h1, h2; /* two independent 64-bit structural hashes */
  int n_steps;
  /* Simplification (simplify.c): only the steps run[0..n_run-1] compute;
   * group, store, inplace and the free lists are indexed by run position.
   * alias[i]: the step or leaf (its mark) whose value step i has. While the
   * plan runs, input k of step s reads its alias source instead: swap holds
   * (s, k, the original input's mark) triples. Kept aliased steps get their
   * source's storage: mat_idx[mat_start[c] ..] before run position c (c = 0:
   * before any, c + 1: after position c). */
  int n_run;
  int *run;
  int *alias;
  int n_swap;
  int *swap;
  int *mat_start, *mat_idx;
  int *free_start; /* [n_run + 1]: frees after run position c are free_idx[free_start[c] ..] */
  int *free_idx;   /* step indices of intermediates dead after it */
  uint64_t last_used;
  int pinned; /* realizations running it (nested ones may not evict it) */
  /* Fused groups (fuse.c): runs of consecutive running steps run as one
   * kernel at the run's last step. group[c] = first run position of c's
   * group (c itself when alone); store[c]: the member's value is needed
   * outside its group. */
  int *group;
  bool *store;
  /* Their descriptions (fuse.c), one per group of two or more steps, in the
   * order the groups run. */
  nbi_fused *fused;
  int n_fused;
  /* The memory policy: fate[i] (FATE_*) of step i; inplace[c] = 4 * j + q
   * when run position c's output takes the buffer of its j-th running
   * step's input q (as the run reads it: aliased inputs swapped), else -1. */
  uint8_t *fate;
  int *inplace;
  /* Devices (bits of device-table indices) whose asynchronous kernels ran a
   * step that checks its data (NBI_OPF_CHECKED): synced after the run. */
  uint32_t check_devices;
  uint32_t devices; /* the devices its running steps are on */
  /* Set (atomically) by the first run, which lets the devices' backends
   * prepare the groups and steps (backend.h's prepare). */
  int prepared;
} nbi_plan;

enum {
  NBI_FATE_TEMP, /* no value after the realization (freed, or never stored) */
  NBI_FATE_KEEP, /* realized: keeps its buffer */
  NBI_FATE_LAZY, /* left pending without a value (held: recomputed on demand) */
};

/* Fills p (all zero) for g, marked (see the memory policy, plan.c). flags[i]:
 * NBI_HELD / NBI_ROOT; dying[k]: leaf k is one nb_assign rebinds (NULL: none). On failure
 * (out of memory) p keeps what it allocated (nbi_plan_clear frees it). */
bool nbi_plan_fill(nbi_plan *p, const nbi_graph *g, const uint8_t *flags, const bool *dying);
/* Frees what p holds; p is all zero after. */
void nbi_plan_clear(nbi_plan *p);
/* The thread's cached plan for g (marked; uses and flags as nbi_graph_flags
 * gives them, dying as nbi_plan_fill takes it), built and cached on a miss;
 * NULL when out of memory or when every cache slot is running (no error
 * recorded). The plan stays cached until evicted: pin it (p->pinned) while it
 * runs. */
nbi_plan *nbi_plan_get(const nbi_graph *g, const int *uses, const uint8_t *flags,
                       const bool *dying);
/* Points every input the plan swaps at its alias source (on) or back (off). */
void nbi_plan_swap_inputs(const nbi_plan *p, const nbi_graph *g, bool on);

/* ---- execution (graph.c) ------------------------------------------------------------ */
/* Runs p over g (marked) as one realization nested in the thread's current
 * ones: its running steps on their devices' backends, then the deferred
 * errors of checking steps. cn: room for p->n_run nodes, or NULL. On failure
 * some nodes may hold partial results (the caller drops them). */
nb_status nbi_plan_run(const nbi_plan *p, nbi_graph *g, nb_tensor **cn);
/* nbi_realize of ts[0..n-1] (no sharded root), where the realized tensors
 * dying[0..n_dying-1] (nb_assign's dsts) may be written over: their values
 * die in this realization. An error while a kernel runs (a nested
 * realization may not rebind). */
nb_status nbi_realize_dying(nb_tensor *const *ts, int n, nb_tensor *const *dying, int n_dying);
/* nb_stats counters of the planner and the executables. */
void nbi_stats_plan(bool cache_hit);
void nbi_stats_exec_ticks(uint64_t t0, uint64_t t1); /* nbi_ticks at start and end */
void nbi_stats_plan_ticks(uint64_t t0, uint64_t t1);
void nbi_stats_realization(void);

#endif
