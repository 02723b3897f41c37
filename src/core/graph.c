/* src/core/graph.c — realization of the pending graph.
 *
 * nbi_realize(ts):
 *  1. collect the pending nodes reachable from ts, in topological order
 *     (iterative post-order DFS; realized tensors are leaves);
 *  2. hash the subgraph's structure (ops, dtypes, shapes, attrs, edges, leaf
 *     layouts, which nodes are held from outside) and look the plan up;
 *  3. on a miss, plan: per step, the intermediates whose last use it is;
 *  4. execute the steps on the CPU backend, freeing dead intermediates;
 *  5. realized nodes that are held from outside keep their data and drop their
 *     graph edges; intermediates die with their consumers.
 * A node is "held from outside" when its refcount exceeds its uses inside the
 * subgraph (a scope, a user, or a pending node outside this realization).
 */
#include "nbi.h"

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
void nbi_stats_kernel(void) { stats.kernels_run++; }
void nbi_stats_jit(bool hit) {
  if (hit)
    stats.jit_cache_hits++;
  else
    stats.jit_cache_misses++;
}

/* ---- plan cache --------------------------------------------------------------------- */
typedef struct plan {
  uint64_t h1, h2; /* two independent 64-bit structural hashes */
  int n_steps;
  int *free_start; /* [n_steps + 1]: frees of step i are free_idx[free_start[i] ..] */
  int *free_idx;   /* topological indices of intermediates dead after the step */
  uint64_t last_used;
  int pinned; /* realizations running it (nested ones may not evict it) */
  /* Fused elementwise groups: runs of consecutive steps run as one kernel at
   * the run's last step. group[i] = first step of i's group (i itself when
   * alone); store[i]: the member's value is needed outside its group. */
  int *group;
  bool *store;
  /* Simplification (simplify.c): only the steps run[0..n_run-1] compute;
   * group, store and the free lists are indexed by run position. alias[i]:
   * the step or leaf (its mark) whose value step i has. While the plan runs,
   * input k of step s reads its alias source instead: swap holds (s, k, the
   * original input's mark) triples. Held aliased steps get their source's
   * storage when it exists: mat_idx[mat_start[c] ..] before run position c
   * (c = 0: before any, c + 1: after position c). */
  int n_run;
  int *run;
  int *alias;
  int n_swap;
  int *swap;
  int *mat_start, *mat_idx;
} plan;

#define PLAN_CACHE_SIZE 64
static plan plan_cache[PLAN_CACHE_SIZE];
static uint64_t plan_clock;

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
  *p = (plan){0};
}

__attribute__((destructor)) static void plan_cache_cleanup(void) {
  for (int i = 0; i < PLAN_CACHE_SIZE; i++)
    plan_clear(&plan_cache[i]);
}

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

static void graph_unmark_free(graph *g) {
  for (int i = 0; i < g->n; i++)
    g->nodes[i]->mark = -1;
  for (int i = 0; i < g->n_leaves; i++)
    g->leaves[i]->mark = -1;
  free(g->nodes);
  free(g->leaves);
}

/* ---- planning ---------------------------------------------------------------------------- */
static void graph_hash(const graph *g, const int *uses, const bool *held, hasher *h) {
  hash_i64(h, g->n);
  for (int i = 0; i < g->n; i++) {
    const nb_tensor *t = g->nodes[i];
    int64_t head[5] = {t->op, t->dtype, t->n_in, held[i], t->shape.ndim};
    hash_words(h, head, 5);
    hash_words(h, t->shape.dims, (size_t)t->shape.ndim);
    hash_words(h, &t->attrs, sizeof t->attrs / sizeof(uint64_t));
    for (int k = 0; k < t->n_in; k++)
      hash_i64(h, t->in[k]->mark);
    hash_i64(h, uses[i]);
  }
  for (int i = 0; i < g->n_leaves; i++) {
    const nb_tensor *l = g->leaves[i];
    int64_t head[2] = {l->dtype, l->shape.ndim};
    hash_words(h, head, 2);
    hash_words(h, l->shape.dims, (size_t)l->shape.ndim);
    hash_words(h, l->shard0.strides, (size_t)l->shape.ndim);
  }
}

/* The step that runs run position i: its group's last member. */
static int group_end(const plan *p, int n, int i) {
  int f = p->group[i];
  while (i + 1 < n && p->group[i + 1] == f && f != i + 1)
    i++;
  return i;
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

/* Fills p (all zero) for g: simplification, grouping, liveness. A last use
 * (last[c]: the run position after which c's buffer is dead) inside a fused
 * group counts at the group's last step, when it runs; uses of an aliased
 * step count as uses of its source. On failure p keeps what it allocated
 * (plan_clear frees it). */
static bool plan_fill(plan *p, const graph *g, const bool *held) {
  int n = g->n, m = n ? n : 1;
  bool *needed = malloc(sizeof(bool) * (size_t)m), *held_run = calloc((size_t)m, sizeof(bool));
  int *pos = malloc(sizeof(int) * (size_t)m), *last = malloc(sizeof(int) * (size_t)m);
  int *count = calloc((size_t)m + 2, sizeof(int));
  nb_tensor **cn = malloc(sizeof *cn * (size_t)m);
  p->alias = malloc(sizeof(int) * (size_t)m);
  p->run = malloc(sizeof(int) * (size_t)m);
  p->group = malloc(sizeof(int) * (size_t)m);
  p->store = malloc(sizeof(bool) * (size_t)m);
  p->free_start = malloc(sizeof(int) * ((size_t)n + 1));
  p->mat_start = calloc((size_t)n + 2, sizeof(int));
  bool ok = needed && held_run && pos && last && count && cn && p->alias && p->run && p->group &&
            p->store && p->free_start && p->mat_start;
  if (!ok) goto done;
  nbi_simplify_plan(g->nodes, n, held, p->alias, needed);
  int n_run = 0, n_swap = 0, n_mat = 0, n_free = 0;
  for (int i = 0; i < n; i++) {
    pos[i] = -1;
    if (needed[i] && p->alias[i] == i) pos[i] = n_run, p->run[n_run++] = i;
    if (held[i] && p->alias[i] != i) n_mat++;
  }
  for (int c = 0; c < n_run; c++) {
    const nb_tensor *t = g->nodes[p->run[c]];
    for (int k = 0; k < t->n_in; k++)
      if (t->in[k]->mark >= 0 && p->alias[t->in[k]->mark] != t->in[k]->mark) n_swap++;
  }
  p->n_run = n_run;
  p->swap = malloc(sizeof(int) * 3 * (size_t)(n_swap ? n_swap : 1));
  p->mat_idx = malloc(sizeof(int) * (size_t)(n_mat ? n_mat : 1));
  if (!(ok = p->swap && p->mat_idx)) goto done;
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
    held_run[c] = held[p->run[c]];
  }
  for (int i = 0; i < n; i++) /* a held alias takes its source's buffer: it needs one */
    if (held[i] && p->alias[i] != i && p->alias[i] >= 0) held_run[pos[p->alias[i]]] = true;

  /* Group and find last uses on the simplified graph: inputs swapped to their
   * sources, marks = run positions; then everything back. */
  swap_inputs(p, g, true);
  for (int c = 0; c < n_run; c++)
    cn[c]->mark = c;
  nbi_fuse_plan(cn, n_run, held_run, p->group, p->store);
  for (int c = 0; c < n_run; c++)
    last[c] = -1;
  for (int c = 0, end = -1; c < n_run; c++) {
    if (c > end) end = group_end(p, n_run, c);
    for (int k = 0; k < cn[c]->n_in; k++)
      if (cn[c]->in[k]->mark >= 0) last[cn[c]->in[k]->mark] = end;
  }
  for (int c = 0; c < n_run; c++)
    cn[c]->mark = p->run[c];
  swap_inputs(p, g, false);

  /* Held aliases get their source's storage at the end of its group; the
   * source may die there. */
  for (int i = 0; i < n; i++) {
    if (!held[i] || p->alias[i] == i) continue;
    int a = p->alias[i], slot = 0;
    if (a >= 0) {
      int e = group_end(p, n_run, pos[a]);
      slot = e + 1;
      if (last[pos[a]] < e) last[pos[a]] = e;
    }
    count[slot]++;
  }
  for (int c = 0; c <= n_run; c++)
    p->mat_start[c + 1] = p->mat_start[c] + count[c];
  for (int c = 0; c <= n_run; c++)
    count[c] = p->mat_start[c];
  for (int i = 0; i < n; i++)
    if (held[i] && p->alias[i] != i) {
      int a = p->alias[i];
      p->mat_idx[count[a >= 0 ? group_end(p, n_run, pos[a]) + 1 : 0]++] = i;
    }

  memset(count, 0, sizeof(int) * ((size_t)m + 2));
  for (int c = 0; c < n_run; c++)
    if (!held[p->run[c]] && last[c] >= 0) count[last[c]]++, n_free++;
  p->free_idx = malloc(sizeof(int) * (size_t)(n_free ? n_free : 1));
  if (!(ok = p->free_idx != NULL)) goto done;
  p->free_start[0] = 0;
  for (int c = 0; c < n_run; c++)
    p->free_start[c + 1] = p->free_start[c] + count[c];
  for (int c = 0; c < n_run; c++)
    count[c] = p->free_start[c];
  for (int c = 0; c < n_run; c++)
    if (!held[p->run[c]] && last[c] >= 0) p->free_idx[count[last[c]]++] = p->run[c];
  p->n_steps = n;
done:
  free(needed);
  free(held_run);
  free(pos);
  free(last);
  free(count);
  free(cn);
  return ok;
}

static plan *plan_build(const graph *g, const bool *held, uint64_t h1, uint64_t h2) {
  plan *p = plan_cache_slot();
  if (!p) return NULL;
  if (!plan_fill(p, g, held)) {
    plan_clear(p);
    return NULL;
  }
  p->h1 = h1;
  p->h2 = h2;
  p->last_used = ++plan_clock;
  return p;
}

/* Held aliased steps of materialization slot c take their source's storage. */
static void share_sources(const plan *p, const graph *g, int c) {
  for (int a = p->mat_start[c]; a < p->mat_start[c + 1]; a++) {
    nb_tensor *t = g->nodes[p->mat_idx[a]], *src = mark_tensor(g, p->alias[p->mat_idx[a]]);
    if (src->shard0.buf) nbi_buffer_retain(src->shard0.buf);
    t->shard0 = src->shard0;
  }
}

/* ---- execution ---------------------------------------------------------------------------- */
static nb_status run_node(nb_tensor *t) {
  const nbi_op_def *def = nbi_op_table[t->op];
  nbi_view in[t->n_in > 0 ? t->n_in : 1];
  for (int k = 0; k < t->n_in; k++)
    in[k] = nbi_tensor_view(t->in[k]);
  nbi_view out = {.dtype = t->dtype, .ndim = t->shape.ndim};
  memcpy(out.dims, t->shape.dims, sizeof out.dims);

  if (def->view && t->n_in > 0 && def->view(t, &in[0], &out)) {
    nbi_buffer *b = t->in[0]->shard0.buf;
    nbi_buffer_retain(b);
    t->shard0.buf = b;
    t->shard0.offset = (out.data - (char *)b->data) / (int64_t)nb_dtype_size(t->dtype);
    memcpy(t->shard0.strides, out.strides, sizeof out.strides);
    return NB_OK;
  }
  if (!def->cpu) return nbi_error(NB_ERR_INTERNAL, "nb_eval: op %s has no CPU kernel", def->name);
  size_t nbytes = (size_t)nbi_numel(&t->shape) * nb_dtype_size(t->dtype);
  nbi_buffer *b = nbi_buffer_alloc(nbytes);
  if (!b) return NB_ERR_OOM;
  out.data = b->data;
  nbi_contig_strides(&t->shape, out.strides);
  nb_status st = def->cpu(t, &out, in);
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

/* uses[i]: step i's readers in g; held[i]: its value must outlive the
 * realization (a root, or referenced from outside g). */
static void count_held(const graph *g, nb_tensor *const *ts, int n, int *uses, bool *held) {
  for (int i = 0; i < g->n; i++)
    for (int k = 0; k < g->nodes[i]->n_in; k++)
      if (g->nodes[i]->in[k]->mark >= 0) uses[g->nodes[i]->in[k]->mark]++;
  for (int i = 0; i < g->n; i++)
    held[i] = g->nodes[i]->refcount > uses[i];
  for (int r = 0; r < n; r++)
    if (ts[r]->mark >= 0) held[ts[r]->mark] = true;
}

/* Depth of realizations running on this thread: a kernel may realize a nested
 * graph (control flow, checkpoint); only the outermost adds to the timers. */
static _Thread_local int depth;

nb_status nbi_realize(nb_tensor *const *ts, int n) {
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
  bool *held = calloc((size_t)g.n, sizeof(bool));
  if (!uses || !held) {
    st = nbi_error(NB_ERR_OOM, "nb_eval: out of memory planning %d nodes", g.n);
    goto done;
  }
  count_held(&g, ts, n, uses, held);

  hasher h = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
  graph_hash(&g, uses, held, &h);
  hash_i64(&h, nbi_fusion_enabled()); /* the grouping is part of the plan */
  hash_i64(&h, nbi_simplify_enabled());
  p = plan_cache_lookup(h.a, h.b, g.n);
  if (p) {
    stats.plan_cache_hits++;
  } else {
    stats.plan_cache_misses++;
    if (!(p = plan_build(&g, held, h.a, h.b))) {
      st = nbi_error(NB_ERR_OOM, "nb_eval: out of memory planning %d nodes", g.n);
      goto done;
    }
  }
  stats.realizations++;
  p->pinned++;
  t1 = now_ns();
  if (!depth) stats.plan_ns += t1 - t0;
  depth++;
  /* the steps that compute, in order; aliased inputs read their sources */
  nb_tensor **cn = g.nodes;
  if (p->n_run < g.n && !(cn = malloc(sizeof *cn * (size_t)(p->n_run ? p->n_run : 1))))
    st = nbi_error(NB_ERR_OOM, "nb_eval: out of memory running %d nodes", g.n);
  for (int c = 0; c < p->n_run && !st; c++)
    cn[c] = g.nodes[p->run[c]];
  if (!st) swap_inputs(p, &g, true);
  if (!st) share_sources(p, &g, 0);
  for (int c = 0; c < p->n_run && !st; c++) {
    if (c + 1 < p->n_run && p->group[c + 1] == p->group[c])
      ; /* a member of a fused group that runs at its last step */
    else if (p->group[c] != c)
      st = nbi_fuse_run(cn + p->group[c], c - p->group[c] + 1, p->store + p->group[c]);
    else
      st = run_node(cn[c]);
    if (!st) share_sources(p, &g, c + 1);
    for (int f = p->free_start[c]; f < p->free_start[c + 1] && !st; f++) {
      nb_tensor *dead = g.nodes[p->free_idx[f]];
      nbi_buffer_release(dead->shard0.buf);
      dead->shard0.buf = NULL;
    }
  }
  if (cn != g.nodes) {
    swap_inputs(p, &g, false);
    free(cn);
  }
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
  for (int i = 0; i < g.n; i++)
    if (held[i]) g.nodes[i]->flags |= NBI_T_REALIZED;
  /* Drop edges only after every node is final and unmarked: releasing edges
   * frees the intermediates (and may free nodes of g). */
  for (int i = 0; i < g.n; i++)
    g.nodes[i]->mark = -1;
  for (int i = 0; i < g.n_leaves; i++)
    g.leaves[i]->mark = -1;
  g.n_leaves = 0;
  int n_held = 0;
  for (int i = 0; i < g.n; i++)
    if (held[i]) g.nodes[n_held++] = g.nodes[i];
  g.n = 0;
  for (int i = 0; i < n_held; i++) {
    nb_tensor *t = g.nodes[i];
    /* provenance for nb_backward stays until the backward frees it */
    if (!(t->flags & NBI_T_GRAD_PATH) || (t->flags & NBI_T_GRAD_FREED)) nbi_tensor_drop_graph(t);
  }
done:
  free(uses);
  free(held);
  graph_unmark_free(&g);
  if (t1 && !depth) stats.exec_ns += now_ns() - t1;
  return st;
}

/* ---- description (nb_graph_dot) --------------------------------------------------------- */
typedef struct describe {
  graph g;
  plan p;
  int *uses;
} describe;

nb_status nbi_plan_describe(nb_tensor *const *ts, int n, nbi_plan_desc *d) {
  *d = (nbi_plan_desc){0};
  describe *x = calloc(1, sizeof *x);
  if (!x) return nbi_error(NB_ERR_OOM, "nb_graph_dot: out of memory");
  d->internal = x;
  nb_status st = graph_collect(&x->g, ts, n);
  int m = x->g.n ? x->g.n : 1;
  x->uses = calloc((size_t)m, sizeof(int));
  d->held = calloc((size_t)m, sizeof(bool));
  if (!st && (!x->uses || !d->held)) st = NB_ERR_OOM;
  if (!st) count_held(&x->g, ts, n, x->uses, d->held);
  if (!st && !plan_fill(&x->p, &x->g, d->held)) st = NB_ERR_OOM;
  if (st) {
    nbi_plan_describe_free(d);
    return nbi_error(st, "nb_graph_dot: out of memory planning the graph");
  }
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
    free(x);
  }
  free(d->held);
  *d = (nbi_plan_desc){0};
}
