/* src/core/graph.c — realization of the pending graph.
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
 *     keep (the memory policy below), per step the buffers that die, and
 *     in-place steps;
 *  4. execute the running steps on the CPU backend (a step reading an alias
 *     reads its source), freeing dead intermediates;
 *  5. kept nodes are marked realized and drop their graph edges (unless
 *     nb_backward still needs them); lazy nodes stay pending.
 * A node is "held from outside" when its refcount exceeds its uses inside the
 * subgraph (a scope, a user, or a pending node outside this realization).
 *
 * Memory policy. Only the roots (ts) must be stored, plus what later steps
 * of this realization read. A held node that runs alone (GEMM, reductions,
 * views, ...) has its output anyway and keeps it (realized). A held member of
 * a fused group (elementwise, row group, GEMM epilogue) whose value nothing
 * else in this realization needs is not materialized: it stays pending
 * ("lazy", NBI_T_LAZY, tracked in the lazy set), keeps its edges, and is
 * recomputed if it is ever requested. The unstored members it reads stay
 * pending with it; a stored intermediate it reads is kept (realized), so a
 * lazy node never recomputes a step that ran alone. It may recompute its own
 * group's reductions, or an epilogue's product (reading an epilogue's held
 * matmul or bias sum later runs the matmul again). An alias has a value when its source
 * does (a leaf, or a step with a buffer): it is then kept like any node with
 * one, sharing the source's storage from the end of the source's group, else
 * it is lazy with its source (a root's source is always stored). Fates
 * follow the original edges (a lazy node is recomputed from them); grouping,
 * liveness and in-place steps see the simplified graph, where a use of an
 * alias is a use of its source. nb_assign (nbi_realize_assign, assign.c)
 * realizes the held pending readers of the tensor it rebinds before
 * rebinding it; lazy ones are instead pointed at a leaf sharing its old
 * buffer. Its realization here (nbi_realize_dying) knows which leaves die.
 *
 * In place. An elementwise step (alone, or a stored member of a fused group
 * other than a GEMM epilogue, whose primitive reads its operands while it
 * writes) of an f32/f64 op writes into the buffer of an input that dies at that step
 * instead of allocating: an intermediate whose last use it is (counting uses
 * through its aliases) whose value is not kept and that no kept alias
 * shares, or the tensor nb_assign rebinds (unless a lazy node or a kept alias
 * reads it); same dtype and shape as the output (not broadcast), and in a
 * group no later member reads it (members read operands chunk by chunk, at
 * the index they write). The plan picks the input; the run checks that its
 * buffer is unshared (refcount 1), contiguous and starts at offset 0, and
 * allocates otherwise.
 */
#include "../backends/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- stats ------------------------------------------------------------------------- */
static nb_stats stats;

nb_stats nb_get_stats(void) {
  nb_stats s = stats;
  s.live_tensors = nbi_live_tensors();
  nbi_buffer_cache_stats(&s);
  return s;
}
void nb_reset_stats(void) {
  uint64_t live = stats.live_bytes;
  stats = (nb_stats){0};
  stats.live_bytes = stats.peak_bytes = live;
  nbi_buffer_cache_reset_stats();
}
void nbi_stats_alloc(size_t nbytes) {
  stats.live_bytes += nbytes;
  if (stats.live_bytes > stats.peak_bytes) stats.peak_bytes = stats.live_bytes;
}
void nbi_stats_free(size_t nbytes) { stats.live_bytes -= nbytes; }
/* Counters are bumped from every thread: relaxed atomic adds. */
#define STAT_ADD(field, v) __atomic_fetch_add(&stats.field, (v), __ATOMIC_RELAXED)
void nbi_stats_kernel(void) { STAT_ADD(kernels_run, 1); }
void nbi_stats_collective(int kind, uint64_t bytes) {
  uint64_t *count[] = {&stats.n_all_reduce, &stats.n_all_gather, &stats.n_reduce_scatter,
                       &stats.n_all_to_all, &stats.n_permute};
  if (kind < 0 || kind > NBI_COLL_PERMUTE) return;
  __atomic_fetch_add(count[kind], 1, __ATOMIC_RELAXED);
  STAT_ADD(collective_bytes, bytes);
}
void nbi_stats_jit(bool hit) {
  if (hit)
    STAT_ADD(jit_cache_hits, 1);
  else
    STAT_ADD(jit_cache_misses, 1);
}

/* ---- plan cache --------------------------------------------------------------------- */
typedef struct plan {
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
  /* The memory policy: fate[i] (FATE_*) of step i; inplace[c] = 4 * j + q
   * when run position c's output takes the buffer of its j-th running
   * step's input q (as the run reads it: aliased inputs swapped), else -1. */
  uint8_t *fate;
  int *inplace;
  /* Devices (bits of device-table indices) whose asynchronous kernels ran a
   * step that checks its data (NBI_OPF_CHECKED): synced after the run. */
  uint32_t check_devices;
} plan;

enum {
  FATE_TEMP, /* no value after the realization (freed, or never stored) */
  FATE_KEEP, /* realized: keeps its buffer */
  FATE_LAZY, /* left pending without a value (held: recomputed on demand) */
};

#define PLAN_CACHE_SIZE 64
/* Each thread plans with its own cache (threads realize their own tensors, and a
 * lookup or an eviction must not race another thread's plan in use); a thread's
 * plans are freed when it exits (plan_cache_key), the main thread's at exit. */
static _Thread_local plan plan_cache[PLAN_CACHE_SIZE];
static _Thread_local uint64_t plan_clock;
static pthread_key_t plan_cache_key;
static pthread_once_t plan_cache_once = PTHREAD_ONCE_INIT;

static void plan_clear(plan *p) {
  free(p->free_start);
  free(p->free_idx);
  free(p->group);
  free(p->store);
  free(p->run);
  free(p->alias);
  free(p->swap);
  free(p->mat_start);
  free(p->mat_idx);
  free(p->fate);
  free(p->inplace);
  *p = (plan){0};
}

static void plan_cache_free(void *unused) {
  (void)unused;
  for (int i = 0; i < PLAN_CACHE_SIZE; i++)
    plan_clear(&plan_cache[i]);
}
static void plan_cache_key_make(void) { (void)pthread_key_create(&plan_cache_key, plan_cache_free); }

__attribute__((destructor)) static void plan_cache_cleanup(void) { plan_cache_free(NULL); }

static plan *plan_cache_lookup(uint64_t h1, uint64_t h2, int n_steps) {
  for (int i = 0; i < PLAN_CACHE_SIZE; i++) {
    plan *p = &plan_cache[i];
    if (p->free_start && p->h1 == h1 && p->h2 == h2 && p->n_steps == n_steps) {
      p->last_used = ++plan_clock;
      return p;
    }
  }
  return NULL;
}

static plan *plan_cache_slot(void) { /* empty slot, else least recently used */
  if (!plan_clock) { /* the thread's first plan: free its cache when it exits */
    pthread_once(&plan_cache_once, plan_cache_key_make);
    (void)pthread_setspecific(plan_cache_key, &plan_cache_key);
  }
  plan *victim = &plan_cache[0];
  for (int i = 0; i < PLAN_CACHE_SIZE; i++) {
    if (!plan_cache[i].free_start) return &plan_cache[i];
    if (plan_cache[i].pinned) continue;
    if (victim->pinned || plan_cache[i].last_used < victim->last_used) victim = &plan_cache[i];
  }
  if (victim->pinned) return NULL; /* every slot runs: more nesting than slots */
  plan_clear(victim);
  return victim;
}

/* ---- hashing ------------------------------------------------------------------------- */
typedef struct hasher {
  uint64_t a, b;
} hasher;

/* Mixes 64-bit words (two independent multiply-xorshift lanes): a word at a
 * time, since a plan lookup hashes every node's attributes on each realization. */
static void hash_words(hasher *h, const void *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t w;
    memcpy(&w, (const char *)p + 8 * i, 8); /* any 8-byte field: ints, doubles */
    nbi_hash_mix(&h->a, &h->b, w);
  }
}
static void hash_i64(hasher *h, int64_t v) { hash_words(h, &v, 1); }

_Static_assert(sizeof(nbi_attrs) % sizeof(uint64_t) == 0, "attrs hash as whole words");

/* ---- collection ------------------------------------------------------------------------ */
typedef struct graph {
  nb_tensor **nodes; /* pending nodes, topological order */
  int n, cap;
  nb_tensor **leaves; /* realized inputs, in order of first use */
  int n_leaves, cap_leaves;
} graph;

static bool push(nb_tensor ***arr, int *n, int *cap, nb_tensor *t) {
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 64;
    nb_tensor **na = realloc(*arr, (size_t)nc * sizeof *na);
    if (!na) return false;
    *arr = na;
    *cap = nc;
  }
  (*arr)[(*n)++] = t;
  return true;
}

/* Pushes t on the DFS stack (with its next-input cursor at 0) and marks it
 * as on the stack; false when the stack cannot grow. */
static bool dfs_push(nb_tensor ***stack, int **next, int *n, int *cap, nb_tensor *t) {
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 64;
    nb_tensor **ns = realloc(*stack, (size_t)nc * sizeof *ns);
    if (ns) *stack = ns;
    int *nn = realloc(*next, (size_t)nc * sizeof *nn);
    if (nn) *next = nn;
    if (!ns || !nn) return false;
    *cap = nc;
  }
  (*stack)[*n] = t;
  (*next)[(*n)++] = 0;
  t->mark = -2;
  return true;
}

/* Post-order DFS. mark: -2 = on the stack, >= 0 = topological index (nodes) or
 * leaf index encoded as -3 - k (leaves). Every visited tensor gets a mark, reset
 * to -1 by graph_unmark. */
static nb_status graph_collect(graph *g, nb_tensor *const *roots, int n_roots) {
  nb_tensor **stack = NULL;
  int *next = NULL, n = 0, cap = 0;
  nb_status st = NB_OK;
  for (int r = 0; r < n_roots && !st; r++) {
    nb_tensor *root = roots[r];
    if (root->mark != -1) continue;
    if (root->flags & NBI_T_REALIZED) {
      root->mark = -3 - g->n_leaves;
      if (!push(&g->leaves, &g->n_leaves, &g->cap_leaves, root)) st = NB_ERR_OOM;
      continue;
    }
    if (!dfs_push(&stack, &next, &n, &cap, root)) {
      st = NB_ERR_OOM;
      break;
    }
    while (n && !st) {
      nb_tensor *t = stack[n - 1];
      if (next[n - 1] < t->n_in) {
        nb_tensor *c = t->in[next[n - 1]++];
        if (c->mark != -1) continue;
        if (c->flags & NBI_T_REALIZED) {
          c->mark = -3 - g->n_leaves;
          if (!push(&g->leaves, &g->n_leaves, &g->cap_leaves, c)) st = NB_ERR_OOM;
          continue;
        }
        if (!dfs_push(&stack, &next, &n, &cap, c)) {
          st = NB_ERR_OOM;
          break;
        }
      } else {
        t->mark = g->n;
        if (!push(&g->nodes, &g->n, &g->cap, t)) st = NB_ERR_OOM;
        n--;
      }
    }
  }
  /* on failure some nodes may still carry -2: mark them so unmark resets them */
  for (int i = 0; i < n; i++)
    if (stack[i]->mark == -2) stack[i]->mark = -1;
  free(stack);
  free(next);
  return st;
}

/* Marks every node with its index and every leaf with -3 - its index (on),
 * or back to idle -1 (off). */
static void graph_mark(const graph *g, bool on) {
  for (int i = 0; i < g->n; i++)
    g->nodes[i]->mark = on ? i : -1;
  for (int i = 0; i < g->n_leaves; i++)
    g->leaves[i]->mark = on ? -3 - i : -1;
}

static void graph_unmark_free(graph *g) {
  graph_mark(g, false);
  free(g->nodes);
  free(g->leaves);
}

/* ---- planning ---------------------------------------------------------------------------- */
enum { HELD = 1, ROOT = 2 }; /* per-node flags of a realization */

/* flags[i]: HELD / ROOT; dies[k]: leaf k is one nb_assign rebinds (dies NULL: none). */
static void graph_hash(const graph *g, const int *uses, const uint8_t *flags, const bool *dies,
                       hasher *h) {
  hash_i64(h, g->n);
  for (int i = 0; i < g->n; i++) {
    const nb_tensor *t = g->nodes[i];
    int64_t head[6] = {t->op, t->dtype, t->n_in, flags[i], t->shape.ndim, t->device};
    hash_words(h, head, 6);
    hash_words(h, t->shape.dims, (size_t)t->shape.ndim);
    hash_words(h, &t->attrs, sizeof t->attrs / sizeof(uint64_t));
    for (int k = 0; k < t->n_in; k++)
      hash_i64(h, t->in[k]->mark);
    hash_i64(h, uses[i]);
  }
  for (int i = 0; i < g->n_leaves; i++) {
    const nb_tensor *l = g->leaves[i];
    int64_t head[4] = {l->dtype, l->shape.ndim, dies && dies[i], l->device};
    hash_words(h, head, 4);
    hash_words(h, l->shape.dims, (size_t)l->shape.ndim);
    hash_words(h, l->shard0.strides, (size_t)l->shape.ndim);
  }
}

/* The tensor a mark names: a step (>= 0) or a leaf (-3 - k). */
static nb_tensor *mark_tensor(const graph *g, int m) {
  return m >= 0 ? g->nodes[m] : g->leaves[-3 - m];
}

/* Points every swapped input at its alias source (on) or back (off). */
static void swap_inputs(const plan *p, const graph *g, bool on) {
  for (int e = 0; e < p->n_swap; e++) {
    const int *w = p->swap + 3 * e;
    g->nodes[w[0]]->in[w[1]] = on ? mark_tensor(g, p->alias[w[2]]) : g->nodes[w[2]];
  }
}

/* Shows the planner the simplified graph cn[0..n_run-1] (on): inputs swapped
 * to their sources, marks = run positions; or restores g (off). */
static void simplified_view(const plan *p, const graph *g, nb_tensor *const *cn, bool on) {
  if (on) swap_inputs(p, g, true);
  for (int c = 0; c < p->n_run; c++)
    cn[c]->mark = on ? c : p->run[c];
  if (!on) swap_inputs(p, g, false);
}

/* The input whose buffer member k of the step f..e (run positions: a group,
 * or f == e == k alone) may take: 4 * j + q for cn[j]->in[q], or -1; on the
 * simplified view. spare[c]: run position c's buffer is temporary (nothing
 * keeps it, no kept alias shares it); last/llast: the run position after
 * which a step / leaf is dead; dies[k]: leaf k is one nb_assign rebinds. */
static int inplace_source(nb_tensor *const *cn, const plan *p, const bool *spare, const int *last,
                          const int *llast, const bool *dies, int f, int e, int k) {
  const nb_tensor *t = cn[k];
  for (int j = f; j <= e; j++)
    for (int q = 0; q < cn[j]->n_in; q++) {
      const nb_tensor *x = cn[j]->in[q];
      int m = x->mark;
      if (m >= f && m <= e) continue; /* a member of the group */
      bool dead = m >= 0 ? spare[m] && last[m] == e : dies[-3 - m] && llast[-3 - m] == e;
      if (!dead || x->dtype != t->dtype || !nbi_shape_eq(&x->shape, &t->shape)) continue;
      bool ok = true;
      for (int r = k + 1; r <= e && ok; r++) /* no later member reads it */
        for (int c = 0; c < cn[r]->n_in; c++)
          ok = ok && cn[r]->in[c] != x;
      for (int r = f; r < k && ok; r++) /* no earlier member took it */
        ok = p->inplace[r] < 0 || cn[p->inplace[r] / 4]->in[p->inplace[r] % 4] != x;
      if (ok) return 4 * j + q;
    }
  return -1;
}

/* Fills p (all zero) for g (see the memory policy at the top). flags[i]:
 * HELD / ROOT; dying: the leaves nb_assign rebinds (NULL: none). In order:
 * simplification; grouping and last uses on the simplified graph (a last use,
 * last[c]: the run position after which c's buffer is dead, inside a fused
 * group counts at the group's last step, when it runs; uses of an aliased
 * step count as uses of its source); fates on the original edges; kept
 * aliases' shares of their sources' storage; in-place steps; frees. On
 * failure p keeps what it allocated (plan_clear frees it). */
static bool plan_fill(plan *p, const graph *g, const uint8_t *flags, const bool *dying) {
  int n = g->n, m = n ? n : 1;
  size_t mm = (size_t)m;
  bool *dies = calloc((size_t)g->n_leaves + 1, 1); /* still dying (a lazy reader may revive) */
  if (dies && dying) memcpy(dies, dying, (size_t)g->n_leaves);
  bool *held = calloc(mm, 1), *needed = malloc(mm), *root_run = calloc(mm, 1), *has = malloc(mm);
  bool *keep = calloc(mm, 1), *spare = malloc(mm);
  int *pos = malloc(sizeof(int) * mm), *last = malloc(sizeof(int) * mm);
  int *llast = malloc(sizeof(int) * (size_t)(g->n_leaves ? g->n_leaves : 1));
  int *count = calloc(mm + 2, sizeof(int));
  nb_tensor **cn = malloc(sizeof *cn * mm);
  p->alias = malloc(sizeof(int) * mm);
  p->run = malloc(sizeof(int) * mm);
  p->group = malloc(sizeof(int) * mm);
  p->store = malloc(sizeof(bool) * mm);
  p->fate = malloc(mm);
  p->inplace = malloc(sizeof(int) * mm);
  p->free_start = malloc(sizeof(int) * ((size_t)n + 1));
  p->mat_start = calloc((size_t)n + 2, sizeof(int));
  bool ok = held && needed && root_run && has && keep && spare && pos && last && llast && count &&
            cn && dies && p->alias && p->run && p->group && p->store && p->fate && p->inplace &&
            p->free_start && p->mat_start;
  if (!ok) goto done;
  for (int i = 0; i < n; i++)
    held[i] = flags[i] & HELD;
  nbi_simplify_plan(g->nodes, n, held, p->alias, needed);
  int n_run = 0, n_swap = 0, n_mat = 0, n_free = 0;
  for (int i = 0; i < n; i++) {
    pos[i] = -1;
    if (needed[i] && p->alias[i] == i) pos[i] = n_run, p->run[n_run++] = i;
  }
  for (int c = 0; c < n_run; c++) {
    const nb_tensor *t = g->nodes[p->run[c]];
    for (int k = 0; k < t->n_in; k++)
      if (t->in[k]->mark >= 0 && p->alias[t->in[k]->mark] != t->in[k]->mark) n_swap++;
  }
  p->n_run = n_run;
  p->swap = malloc(sizeof(int) * 3 * (size_t)(n_swap ? n_swap : 1));
  if (!(ok = p->swap != NULL)) goto done;
  for (int c = 0; c < n_run; c++) {
    const nb_tensor *t = g->nodes[p->run[c]];
    for (int k = 0; k < t->n_in; k++) {
      int x = t->in[k]->mark;
      if (x >= 0 && p->alias[x] != x) {
        int *w = p->swap + 3 * p->n_swap++;
        w[0] = p->run[c], w[1] = k, w[2] = x;
      }
    }
    cn[c] = g->nodes[p->run[c]];
    root_run[c] = flags[p->run[c]] & ROOT;
  }
  for (int i = 0; i < n; i++) /* a root alias takes its source's buffer: it needs one */
    if ((flags[i] & ROOT) && p->alias[i] != i && p->alias[i] >= 0)
      root_run[pos[p->alias[i]]] = true;

  /* Grouping (only what roots and other groups read is stored) and last uses,
   * of steps and of leaves, on the simplified graph. */
  simplified_view(p, g, cn, true);
  nbi_fuse_plan(cn, n_run, root_run, p->group, p->store);
  for (int f = 0; f < n_run;) { /* groups a device cannot run become single steps */
    int e = nbi_fuse_group_end(p->group, n_run, f);
    if (e > f && !nbi_fuse_supported(cn + f, e - f + 1, p->store + f))
      for (int k = f; k <= e; k++)
        p->group[k] = k, p->store[k] = true;
    f = e + 1;
  }
  for (int c = 0; c < n_run; c++)
    last[c] = -1;
  for (int l = 0; l < g->n_leaves; l++)
    llast[l] = -1;
  for (int c = 0, end = -1; c < n_run; c++) {
    if (c > end) end = nbi_fuse_group_end(p->group, n_run, c);
    for (int k = 0; k < cn[c]->n_in; k++) {
      int x = cn[c]->in[k]->mark;
      if (x >= 0)
        last[x] = end;
      else
        llast[-3 - x] = end;
    }
  }
  simplified_view(p, g, cn, false);

  /* Fates, on the original edges (a lazy node is recomputed from them).
   * has[i]: step i's value is in a buffer during the run: it runs stored or
   * alone, or it is an alias of a leaf or of such a step. A held step without
   * one is lazy, and so are the steps without one that a lazy step reads;
   * what a lazy step reads with one is kept, like the held steps with one. */
  for (int i = 0; i < n; i++) {
    int a = p->alias[i], c = a >= 0 ? pos[a] : -1;
    has[i] = a < 0 ||
             (c >= 0 &&
              (p->store[c] || (p->group[c] == c && nbi_fuse_group_end(p->group, n_run, c) == c)));
    p->fate[i] = held[i] && !has[i] ? FATE_LAZY : FATE_TEMP;
  }
  for (int i = n - 1; i >= 0; i--) {
    if (p->fate[i] != FATE_LAZY) continue;
    const nb_tensor *t = g->nodes[i];
    for (int k = 0; k < t->n_in; k++) {
      int x = t->in[k]->mark;
      if (x >= 0 && has[x])
        keep[x] = true;
      else if (x >= 0)
        p->fate[x] = FATE_LAZY;
      else
        dies[-3 - x] = false; /* a lazy node will read its value later */
    }
  }
  for (int i = 0; i < n; i++)
    if (has[i] && (held[i] || keep[i])) p->fate[i] = FATE_KEEP;

  /* Kept aliases take their source's storage at the end of the source's
   * group (leaves' before any step); the source's buffer lives until then and
   * is no longer spare (nor a rebound leaf's). */
  for (int c = 0; c < n_run; c++)
    spare[c] = has[p->run[c]] && p->fate[p->run[c]] == FATE_TEMP;
  for (int i = 0; i < n; i++) {
    if (p->fate[i] != FATE_KEEP || p->alias[i] == i) continue;
    int a = p->alias[i], slot = 0;
    if (a >= 0) {
      int e = nbi_fuse_group_end(p->group, n_run, pos[a]);
      slot = e + 1;
      if (last[pos[a]] < e) last[pos[a]] = e;
      spare[pos[a]] = false;
    } else {
      dies[-3 - a] = false;
    }
    count[slot]++, n_mat++;
  }
  p->mat_idx = malloc(sizeof(int) * (size_t)(n_mat ? n_mat : 1));
  if (!(ok = p->mat_idx != NULL)) goto done;
  for (int c = 0; c <= n_run; c++)
    p->mat_start[c + 1] = p->mat_start[c] + count[c];
  for (int c = 0; c <= n_run; c++)
    count[c] = p->mat_start[c];
  for (int i = 0; i < n; i++)
    if (p->fate[i] == FATE_KEEP && p->alias[i] != i) {
      int a = p->alias[i];
      p->mat_idx[count[a >= 0 ? nbi_fuse_group_end(p->group, n_run, pos[a]) + 1 : 0]++] = i;
    }

  /* In place: elementwise steps with a buffer, on the simplified graph. */
  for (int c = 0; c < n_run; c++)
    p->inplace[c] = -1;
  simplified_view(p, g, cn, true);
  for (int f = 0; f < n_run;) {
    int e = nbi_fuse_group_end(p->group, n_run, f);
    /* a GEMM epilogue's primitive reads its operands (the bias too) while it
     * writes its result, and a row group's members read operands across a
     * whole row (a broadcast operand across rows too), some more than once (a
     * GPU kernel recomputes a row per phase): none of their members writes
     * over an input. An elementwise group reads each operand only at the
     * index it writes. */
    bool no_inplace = e > f && (cn[f]->op == NBI_OP_MATMUL || nbi_fuse_is_rows(cn + f, e - f + 1));
    for (int k = f; k <= e && !no_inplace; k++)
      if (has[p->run[k]] && nbi_cpu_elementwise_fusible(cn[k]))
        p->inplace[k] = inplace_source(cn, p, spare, last, llast, dies, f, e, k);
    f = e + 1;
  }
  simplified_view(p, g, cn, false);

  memset(count, 0, sizeof(int) * (mm + 2));
  for (int c = 0; c < n_run; c++)
    if (has[p->run[c]] && p->fate[p->run[c]] == FATE_TEMP && last[c] >= 0)
      count[last[c]]++, n_free++;
  p->free_idx = malloc(sizeof(int) * (size_t)(n_free ? n_free : 1));
  if (!(ok = p->free_idx != NULL)) goto done;
  p->free_start[0] = 0;
  for (int c = 0; c < n_run; c++)
    p->free_start[c + 1] = p->free_start[c] + count[c];
  for (int c = 0; c < n_run; c++)
    count[c] = p->free_start[c];
  for (int c = 0; c < n_run; c++)
    if (has[p->run[c]] && p->fate[p->run[c]] == FATE_TEMP && last[c] >= 0)
      p->free_idx[count[last[c]]++] = p->run[c];
  for (int c = 0; c < n_run; c++) {
    const nb_tensor *t = g->nodes[p->run[c]];
    if (t->device != 0 && (nbi_op_table[t->op]->flags & NBI_OPF_CHECKED))
      p->check_devices |= 1u << t->device;
  }
  p->n_steps = n;
done:
  free(held);
  free(needed);
  free(root_run);
  free(has);
  free(keep);
  free(spare);
  free(pos);
  free(last);
  free(llast);
  free(count);
  free(cn);
  free(dies);
  return ok;
}

static plan *plan_build(const graph *g, const uint8_t *flags, const bool *dying, uint64_t h1,
                        uint64_t h2) {
  plan *p = plan_cache_slot();
  if (!p) return NULL;
  if (!plan_fill(p, g, flags, dying)) {
    plan_clear(p);
    return NULL;
  }
  p->h1 = h1;
  p->h2 = h2;
  p->last_used = ++plan_clock;
  return p;
}

/* Kept aliased steps of materialization slot c take their source's storage. */
static void share_sources(const plan *p, const graph *g, int c) {
  for (int a = p->mat_start[c]; a < p->mat_start[c + 1]; a++) {
    nb_tensor *t = g->nodes[p->mat_idx[a]], *src = mark_tensor(g, p->alias[p->mat_idx[a]]);
    if (src->shard0.buf) nbi_buffer_retain(src->shard0.buf);
    t->shard0 = src->shard0;
  }
}

/* ---- execution ---------------------------------------------------------------------------- */
/* The buffer run position c's output takes in place (retained), or NULL: the
 * plan's input, if its buffer is unshared, contiguous and starts at offset 0.
 * cn: the running steps, their inputs swapped. */
static nbi_buffer *inplace_buffer(const plan *p, nb_tensor *const *cn, int c) {
  if (p->inplace[c] < 0) return NULL;
  const nb_tensor *x = cn[p->inplace[c] / 4]->in[p->inplace[c] % 4];
  nbi_buffer *b = x->shard0.buf;
  if (!b || x->n_shards != 1 || b->refcount != 1 || x->shard0.offset != 0) return NULL;
  nbi_view v = nbi_tensor_view(x);
  if (!nbi_view_is_contiguous(&v)) return NULL;
  nbi_buffer_retain(b);
  return b;
}

/* Runs t alone; its output goes to reuse (an input's buffer, retained) when
 * given. */
static nb_status run_node(nb_tensor *t, nbi_buffer *reuse) {
  const nbi_op_def *def = nbi_op_table[t->op];
  nbi_view in[t->n_in > 0 ? t->n_in : 1];
  for (int k = 0; k < t->n_in; k++)
    in[k] = nbi_tensor_view(t->in[k]);
  nbi_view out = {.dtype = t->dtype, .ndim = t->shape.ndim};
  memcpy(out.dims, t->shape.dims, sizeof out.dims);

  if (def->view && t->n_in > 0 && def->view(t, &in[0], &out)) {
    nbi_buffer_release(reuse);
    nbi_buffer *b = t->in[0]->shard0.buf;
    nbi_buffer_retain(b);
    t->shard0.buf = b;
    t->shard0.offset = (out.data - (char *)b->data) / (int64_t)nb_dtype_size(t->dtype);
    memcpy(t->shard0.strides, out.strides, sizeof out.strides);
    return NB_OK;
  }
  const nbi_device *d = nbi_device_at(t->device);
  if (!def->exec && !d->be->supports(d->ctx, t->op, t->dtype)) {
    nbi_buffer_release(reuse);
    return nbi_error(NB_ERR_DEVICE, "nb_eval: op %s has no kernel on %s", def->name, d->name);
  }
  size_t nbytes = (size_t)nbi_numel(&t->shape) * nb_dtype_size(t->dtype);
  nbi_buffer *b = reuse ? reuse : nbi_buffer_alloc(t->device, nbytes);
  if (!b) return NB_ERR_OOM;
  out.data = b->data;
  nbi_contig_strides(&t->shape, out.strides);
  nb_status st = def->exec ? def->exec(t, &out, in) : d->be->run_op(d->ctx, t, &out, in);
  if (st) {
    nbi_buffer_release(b);
    return st;
  }
  t->shard0.buf = b;
  t->shard0.offset = 0;
  memcpy(t->shard0.strides, out.strides, sizeof out.strides);
  nbi_stats_kernel();
  return NB_OK;
}

/* uses[i]: step i's readers in g; flags[i]: HELD when its value must outlive
 * the realization (referenced from outside g, or a root), ROOT for ts. */
static void count_flags(const graph *g, nb_tensor *const *ts, int n, int *uses, uint8_t *flags) {
  for (int i = 0; i < g->n; i++)
    for (int k = 0; k < g->nodes[i]->n_in; k++)
      if (g->nodes[i]->in[k]->mark >= 0) uses[g->nodes[i]->in[k]->mark]++;
  for (int i = 0; i < g->n; i++)
    flags[i] = g->nodes[i]->refcount > uses[i] ? HELD : 0;
  for (int r = 0; r < n; r++)
    if (ts[r]->mark >= 0) flags[ts[r]->mark] = HELD | ROOT;
}

/* Runs the fused group cn[f..e] (run positions): stored members with an
 * in-place input take its buffer first (nbi_fuse_run keeps a buffer a member
 * already has). */
static nb_status run_group(const plan *p, nb_tensor *const *cn, int f, int e) {
  for (int k = f; k <= e; k++) {
    nbi_buffer *b = p->store[k] ? inplace_buffer(p, cn, k) : NULL;
    if (!b) continue;
    nb_tensor *t = cn[k];
    t->shard0.buf = b;
    t->shard0.offset = 0;
    nbi_contig_strides(&t->shape, t->shard0.strides);
  }
  return nbi_fuse_run(cn + f, e - f + 1, p->store + f);
}

/* After run position c: kept aliases of its value take its storage, and the
 * intermediates dead after it are freed. */
static void step_done(const plan *p, graph *g, int c) {
  share_sources(p, g, c + 1);
  for (int f = p->free_start[c]; f < p->free_start[c + 1]; f++) {
    nb_tensor *dead = g->nodes[p->free_idx[f]];
    nbi_buffer_release(dead->shard0.buf);
    dead->shard0.buf = NULL;
  }
}

/* Executes p's running steps over g's nodes (step 4): the steps that compute,
 * in order, aliased inputs reading their sources, dead intermediates freed.
 * cn_buf: room for n_run nodes, or NULL (allocated here when needed). On
 * failure some nodes may hold partial results (the caller drops them). */
static nb_status plan_exec(const plan *p, graph *g, nb_tensor **cn_buf) {
  nb_status st = NB_OK;
  nb_tensor **cn = cn_buf ? cn_buf : g->nodes;
  if (!cn_buf && p->n_run < g->n && !(cn = malloc(sizeof *cn * (size_t)(p->n_run ? p->n_run : 1))))
    return nbi_error(NB_ERR_OOM, "nb_eval: out of memory running %d nodes", g->n);
  for (int c = 0; c < p->n_run; c++)
    cn[c] = g->nodes[p->run[c]];
  swap_inputs(p, g, true);
  share_sources(p, g, 0);
  for (int c = 0; c < p->n_run && !st; c++) {
    if (c + 1 < p->n_run && p->group[c + 1] == p->group[c])
      ; /* a member of a fused group that runs at its last step */
    else if (p->group[c] != c)
      st = run_group(p, cn, p->group[c], c);
    else
      st = run_node(cn[c], inplace_buffer(p, cn, c));
    if (!st) step_done(p, g, c);
  }
  swap_inputs(p, g, false);
  if (cn != g->nodes && cn != cn_buf) free(cn);
  return st;
}

/* After a run: the errors the checking steps found on asynchronous devices
 * (NBI_OPF_CHECKED). */
static nb_status plan_check(const plan *p) {
  nb_status st = NB_OK;
  for (int d = 1; d < NBI_MAX_DEVICES && !st; d++)
    if (p->check_devices >> d & 1u) st = nbi_dev_sync(d);
  return st;
}

/* Depth of realizations running on this thread: a kernel may realize a nested
 * graph (control flow, checkpoint); only the outermost adds to the timers. */
static _Thread_local int depth;
int nbi_realize_depth(void) { return depth; }

/* nbi_realize, where dying_t[0..n_dying-1] (realized tensors) are nb_assign's
 * dsts: their values die in this realization. backward: nb_backward's
 * realization (nbi_realize_backward, seq0 > 0): held nodes with provenance
 * are planned as temporaries and left lazy; nodes made since seq0 (the
 * backward's own) as temporaries. */
static nb_status realize(nb_tensor *const *ts, int n, nb_tensor *const *dying_t, int n_dying,
                         uint64_t seq0) {
  int r = 0;
  while (r < n && (ts[r]->flags & NBI_T_REALIZED))
    r++;
  if (r == n) return NB_OK; /* nothing pending (reading a value back, say) */
  uint64_t t0 = now_ns(), t1 = 0;
  plan *p = NULL;
  graph g = {0};
  nb_status st = graph_collect(&g, ts, n);
  if (st) {
    graph_unmark_free(&g);
    return nbi_error(st, "nb_eval: out of memory collecting the graph");
  }
  if (g.n == 0) {
    graph_unmark_free(&g);
    return NB_OK;
  }
  nbi_cpu_init();
  int *uses = calloc((size_t)g.n, sizeof(int));
  uint8_t *flags = calloc((size_t)g.n, 1);
  bool *dying = n_dying ? calloc((size_t)g.n_leaves + 1, 1) : NULL;
  if (!uses || !flags || (n_dying && !dying)) {
    st = nbi_error(NB_ERR_OOM, "nb_eval: out of memory planning %d nodes", g.n);
    goto done;
  }
  count_flags(&g, ts, n, uses, flags);
  /* nb_backward: the forward's intermediates that scopes hold are not kept
   * for them; the plan frees each after its last use in the backward */
  uint8_t released = 4; /* a flags bit no plan reads (HELD | ROOT are 1 | 2) */
  for (int i = 0; i < g.n && seq0; i++) {
    const nb_tensor *t = g.nodes[i];
    if ((flags[i] & (HELD | ROOT)) != HELD) continue;
    if (t->seq >= seq0)
      flags[i] = 0; /* held by nb_backward's own scope only */
    else if ((t->flags & NBI_T_GRAD_PATH) && !(t->flags & NBI_T_REQUIRES_GRAD))
      flags[i] = released;
  }
  for (int k = 0; k < n_dying; k++)
    if (dying_t[k]->mark <= -3) dying[-3 - dying_t[k]->mark] = true;

  hasher h = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
  graph_hash(&g, uses, flags, dying, &h);
  hash_i64(&h, nbi_fusion_enabled()); /* the grouping is part of the plan */
  hash_i64(&h, nbi_simplify_enabled());
  p = plan_cache_lookup(h.a, h.b, g.n);
  if (p) {
    STAT_ADD(plan_cache_hits, 1);
  } else {
    STAT_ADD(plan_cache_misses, 1);
    if (!(p = plan_build(&g, flags, dying, h.a, h.b))) {
      st = nbi_error(NB_ERR_OOM, "nb_eval: out of memory planning %d nodes", g.n);
      goto done;
    }
  }
  STAT_ADD(realizations, 1);
  p->pinned++;
  t1 = now_ns();
  if (!depth) STAT_ADD(plan_ns, t1 - t0);
  depth++;
  st = plan_exec(p, &g, NULL);
  if (!st) st = plan_check(p);
  /* room in the lazy set for this realization's lazy nodes, reserved after
   * the steps ran: nested realizations (control flow) may have added theirs */
  int n_lazy = 0;
  for (int i = 0; i < g.n; i++)
    n_lazy += (p->fate[i] == FATE_LAZY && (flags[i] & HELD)) || flags[i] == released;
  if (!st) st = nbi_lazy_reserve(n_lazy);
  depth--;
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
    if (p->fate[i] == FATE_KEEP) {
      t->flags |= NBI_T_REALIZED;
      nbi_lazy_remove(t);
    } else if ((p->fate[i] == FATE_LAZY && (flags[i] & HELD)) || flags[i] == released) {
      nbi_lazy_add(t); /* recomputed if it is ever read */
    } else { /* pending, but only other nodes hold it */
      nbi_lazy_remove(t);
    }
  }
  /* Drop edges only after every node is final and unmarked: releasing edges
   * frees the intermediates (and may free nodes of g). */
  graph_mark(&g, false);
  g.n_leaves = 0;
  int n_kept = 0;
  for (int i = 0; i < g.n; i++)
    if (p->fate[i] == FATE_KEEP) g.nodes[n_kept++] = g.nodes[i];
  g.n = 0;
  for (int i = 0; i < n_kept; i++) {
    nb_tensor *t = g.nodes[i];
    /* provenance for nb_backward stays until the backward frees it */
    if (!(t->flags & NBI_T_GRAD_PATH) || (t->flags & NBI_T_GRAD_FREED)) nbi_tensor_drop_graph(t);
  }
done:
  free(dying);
  free(uses);
  free(flags);
  graph_unmark_free(&g);
  if (t1 && !depth) STAT_ADD(exec_ns, now_ns() - t1);
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

/* ---- planned executables (nb_jit's fast path) ----------------------------------------
 * The graph and plan of one realization kept for reuse: the nodes stay pending
 * between runs (retained through the roots), each run binds the slots (leaves
 * standing for the inputs) to the call's tensors, executes the plan with no
 * collection, hashing, lookup or allocation of its own, hands each root's
 * value to a fresh leaf and clears every node's buffer again. */
struct nbi_exec {
  graph g;
  plan p;
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
  plan_clear(&x->p);
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
  nb_status st = graph_collect(&x->g, roots, n_roots);
  int m = x->g.n ? x->g.n : 1;
  int *uses = st ? NULL : calloc((size_t)m, sizeof(int));
  uint8_t *flags = st ? NULL : calloc((size_t)m, 1);
  bool ok = uses && flags;
  if (ok) {
    count_flags(&x->g, roots, n_roots, uses, flags);
    ok = plan_fill(&x->p, &x->g, flags, NULL);
  }
  free(uses);
  free(flags);
  graph_mark(&x->g, false);
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
  uint64_t t0 = depth ? 0 : now_ns();
  for (int r = 0; r < x->n_roots; r++)
    out[r] = NULL;
  for (int k = 0; k < x->n_slots; k++) { /* bind: the slots share the inputs' storage */
    nb_tensor *s = x->slots[k];
    s->shard0 = in[k]->shard0;
    nbi_buffer_retain(s->shard0.buf);
  }
  /* marked as during a realization: group kernels find their members by mark */
  graph_mark(&x->g, true);
  x->busy = true;
  depth++;
  STAT_ADD(realizations, 1);
  nb_status st = plan_exec(&x->p, &x->g, x->cn);
  if (!st) st = plan_check(&x->p);
  depth--;
  x->busy = false;
  graph_mark(&x->g, false);
  for (int r = 0; r < x->n_roots && !st; r++)
    if (!(out[r] = nbi_leaf_share(x->roots[r]))) st = nb_last_status();
  if (st)
    for (int r = 0; r < x->n_roots; r++)
      out[r] = NULL;                 /* the scope frees those made */
  for (int i = 0; i < x->g.n; i++) { /* every node pending and empty again */
    nb_tensor *t = x->g.nodes[i];
    nbi_buffer_release(t->shard0.buf);
    t->shard0.buf = NULL;
  }
  for (int k = 0; k < x->n_slots; k++) {
    nbi_buffer_release(x->slots[k]->shard0.buf);
    x->slots[k]->shard0.buf = NULL;
  }
  if (t0) STAT_ADD(exec_ns, now_ns() - t0);
  return st;
}

/* ---- description (nb_graph_dot) --------------------------------------------------------- */
typedef struct describe {
  graph g;
  plan p;
  int *uses;
  uint8_t *flags;
} describe;

nb_status nbi_plan_describe(nb_tensor *const *ts, int n, nbi_plan_desc *d) {
  *d = (nbi_plan_desc){0};
  describe *x = calloc(1, sizeof *x);
  if (!x) return nbi_error(NB_ERR_OOM, "nb_graph_dot: out of memory");
  d->internal = x;
  nb_status st = graph_collect(&x->g, ts, n);
  int m = x->g.n ? x->g.n : 1;
  x->uses = calloc((size_t)m, sizeof(int));
  x->flags = calloc((size_t)m, 1);
  d->held = calloc((size_t)m, sizeof(bool));
  if (!st && (!x->uses || !x->flags || !d->held)) st = NB_ERR_OOM;
  if (!st) count_flags(&x->g, ts, n, x->uses, x->flags);
  if (!st && !plan_fill(&x->p, &x->g, x->flags, NULL)) st = NB_ERR_OOM;
  if (st) {
    nbi_plan_describe_free(d);
    return nbi_error(st, "nb_graph_dot: out of memory planning the graph");
  }
  for (int i = 0; i < x->g.n; i++)
    d->held[i] = x->flags[i] & HELD;
  d->n = x->g.n;
  d->n_leaves = x->g.n_leaves;
  d->nodes = x->g.nodes;
  d->leaves = x->g.leaves;
  d->alias = x->p.alias;
  d->n_run = x->p.n_run;
  d->run = x->p.run;
  d->group = x->p.group;
  d->store = x->p.store;
  return NB_OK;
}

void nbi_plan_describe_free(nbi_plan_desc *d) {
  describe *x = d->internal;
  if (x) {
    graph_unmark_free(&x->g);
    plan_clear(&x->p);
    free(x->uses);
    free(x->flags);
    free(x);
  }
  free(d->held);
  *d = (nbi_plan_desc){0};
}
