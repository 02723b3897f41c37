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
} plan;

#define PLAN_CACHE_SIZE 64
static plan plan_cache[PLAN_CACHE_SIZE];
static uint64_t plan_clock;

static void plan_clear(plan *p) {
  free(p->free_start);
  free(p->free_idx);
  free(p->group);
  free(p->store);
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

/* last[i]: the step after which node i's buffer is dead (or -1 if held/root). */
/* The step that runs step i: its group's last member. */
static int group_end(const plan *p, int n, int i) {
  int f = p->group[i];
  while (i + 1 < n && p->group[i + 1] == f && f != i + 1)
    i++;
  return i;
}

/* last[i]: the step after which node i's buffer is dead (or -1 if held/root).
 * A use inside a fused group counts at the group's last step, when it runs. */
static plan *plan_build(const graph *g, const bool *held, uint64_t h1, uint64_t h2) {
  int *last = malloc(sizeof(int) * (size_t)(g->n ? g->n : 1));
  int *count = calloc((size_t)g->n + 1, sizeof(int));
  plan *p = plan_cache_slot();
  if (!p) {
    free(last);
    free(count);
    return NULL;
  }
  p->group = malloc(sizeof(int) * (size_t)(g->n ? g->n : 1));
  p->store = malloc(sizeof(bool) * (size_t)(g->n ? g->n : 1));
  if (!last || !count || !p->group || !p->store) goto oom;
  nbi_fuse_plan(g->nodes, g->n, held, p->group, p->store);
  for (int i = 0; i < g->n; i++)
    last[i] = -1;
  for (int i = 0, end = -1; i < g->n; i++) {
    if (i > end) end = group_end(p, g->n, i);
    const nb_tensor *t = g->nodes[i];
    for (int k = 0; k < t->n_in; k++)
      if (t->in[k]->mark >= 0) last[t->in[k]->mark] = end;
  }
  int n_free = 0;
  for (int i = 0; i < g->n; i++)
    if (!held[i] && last[i] >= 0) count[last[i]]++, n_free++;
  p->free_start = malloc(sizeof(int) * ((size_t)g->n + 1));
  p->free_idx = malloc(sizeof(int) * (size_t)(n_free ? n_free : 1));
  if (!p->free_start || !p->free_idx) goto oom;
  p->free_start[0] = 0;
  for (int i = 0; i < g->n; i++)
    p->free_start[i + 1] = p->free_start[i] + count[i];
  for (int i = 0; i < g->n; i++)
    count[i] = p->free_start[i];
  for (int i = 0; i < g->n; i++)
    if (!held[i] && last[i] >= 0) p->free_idx[count[last[i]]++] = i;
  p->h1 = h1;
  p->h2 = h2;
  p->n_steps = g->n;
  p->last_used = ++plan_clock;
  free(last);
  free(count);
  return p;
oom:
  free(last);
  free(count);
  plan_clear(p);
  return NULL;
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
  for (int i = 0; i < g.n; i++)
    for (int k = 0; k < g.nodes[i]->n_in; k++)
      if (g.nodes[i]->in[k]->mark >= 0) uses[g.nodes[i]->in[k]->mark]++;
  for (int i = 0; i < g.n; i++)
    held[i] = g.nodes[i]->refcount > uses[i];
  for (int r = 0; r < n; r++)
    if (ts[r]->mark >= 0) held[ts[r]->mark] = true;

  hasher h = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
  graph_hash(&g, uses, held, &h);
  hash_i64(&h, nbi_fusion_enabled()); /* the grouping is part of the plan */
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
  for (int i = 0; i < g.n && !st; i++) {
    if (i + 1 < g.n && p->group[i + 1] == p->group[i])
      ; /* a member of a fused group that runs at its last step */
    else if (p->group[i] != i)
      st = nbi_fuse_run(g.nodes + p->group[i], i - p->group[i] + 1, p->store + p->group[i]);
    else
      st = run_node(g.nodes[i]);
    for (int f = p->free_start[i]; f < p->free_start[i + 1]; f++) {
      nb_tensor *dead = g.nodes[p->free_idx[f]];
      nbi_buffer_release(dead->shard0.buf);
      dead->shard0.buf = NULL;
    }
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
