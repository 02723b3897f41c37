/* src/core/plan.c — planning a realization: collecting the pending graph,
 * hashing its structure, the plan (simplification by simplify.c, fused groups
 * and their descriptions by fuse.c, the memory policy below, per step the
 * buffers that die, in-place steps), the thread's plan cache, and the plan as
 * nb_graph_dot describes it. graph.c runs plans.
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
 * alias is a use of its source. nb_assign (nbi_realize_assign) realizes the
 * held pending readers of the tensor it rebinds before rebinding it; lazy
 * ones are instead pointed at a leaf sharing its old buffer (assign.c,
 * rewire_lazy).
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
#include "plan.h"
#include "oprules.h"

#include <pthread.h>
#include <stdlib.h>

/* ---- plan cache --------------------------------------------------------------------- */
#define PLAN_CACHE_SIZE 64
/* Each thread plans with its own cache (threads realize their own tensors, and a
 * lookup or an eviction must not race another thread's plan in use); a thread's
 * plans are freed when it exits (plan_cache_key), the main thread's at exit. */
static _Thread_local nbi_plan plan_cache[PLAN_CACHE_SIZE];
static _Thread_local uint64_t plan_clock;
static pthread_key_t plan_cache_key;
static pthread_once_t plan_cache_once = PTHREAD_ONCE_INIT;

void nbi_plan_clear(nbi_plan *p) {
  free(p->free_start);
  free(p->free_idx);
  free(p->group);
  free(p->store);
  free(p->fused);
  free(p->run);
  free(p->alias);
  free(p->swap);
  free(p->mat_start);
  free(p->mat_idx);
  free(p->fate);
  free(p->inplace);
  *p = (nbi_plan){0};
}

static void plan_cache_free(void *unused) {
  (void)unused;
  for (int i = 0; i < PLAN_CACHE_SIZE; i++)
    nbi_plan_clear(&plan_cache[i]);
}
static void plan_cache_key_make(void) {
  (void)pthread_key_create(&plan_cache_key, plan_cache_free);
}

__attribute__((destructor)) static void plan_cache_cleanup(void) { plan_cache_free(NULL); }

static nbi_plan *plan_cache_lookup(uint64_t h1, uint64_t h2, int n_steps) {
  for (int i = 0; i < PLAN_CACHE_SIZE; i++) {
    nbi_plan *p = &plan_cache[i];
    if (p->free_start && p->h1 == h1 && p->h2 == h2 && p->n_steps == n_steps) {
      p->last_used = ++plan_clock;
      return p;
    }
  }
  return NULL;
}

static nbi_plan *plan_cache_slot(void) { /* empty slot, else least recently used */
  if (!plan_clock) {                     /* the thread's first plan: free its cache when it exits */
    pthread_once(&plan_cache_once, plan_cache_key_make);
    (void)pthread_setspecific(plan_cache_key, &plan_cache_key);
  }
  nbi_plan *victim = &plan_cache[0];
  for (int i = 0; i < PLAN_CACHE_SIZE; i++) {
    if (!plan_cache[i].free_start) return &plan_cache[i];
    if (plan_cache[i].pinned) continue;
    if (victim->pinned || plan_cache[i].last_used < victim->last_used) victim = &plan_cache[i];
  }
  if (victim->pinned) return NULL; /* every slot runs: more nesting than slots */
  nbi_plan_clear(victim);
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

bool nbi_push_tensor(nb_tensor ***arr, int *n, int *cap, nb_tensor *t) {
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
bool nbi_dfs_push(nb_tensor ***stack, int **next, int *n, int *cap, nb_tensor *t) {
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
nb_status nbi_graph_collect(nbi_graph *g, nb_tensor *const *roots, int n_roots) {
  nb_tensor **stack = NULL;
  int *next = NULL, n = 0, cap = 0;
  nb_status st = NB_OK;
  for (int r = 0; r < n_roots && !st; r++) {
    nb_tensor *root = roots[r];
    if (root->mark != -1) continue;
    if (root->flags & NBI_T_REALIZED) {
      root->mark = -3 - g->n_leaves;
      if (!nbi_push_tensor(&g->leaves, &g->n_leaves, &g->cap_leaves, root)) st = NB_ERR_OOM;
      continue;
    }
    if (!nbi_dfs_push(&stack, &next, &n, &cap, root)) {
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
          if (!nbi_push_tensor(&g->leaves, &g->n_leaves, &g->cap_leaves, c)) st = NB_ERR_OOM;
          continue;
        }
        if (!nbi_dfs_push(&stack, &next, &n, &cap, c)) {
          st = NB_ERR_OOM;
          break;
        }
      } else {
        t->mark = g->n;
        if (!nbi_push_tensor(&g->nodes, &g->n, &g->cap, t)) st = NB_ERR_OOM;
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
void nbi_graph_mark(const nbi_graph *g, bool on) {
  for (int i = 0; i < g->n; i++)
    g->nodes[i]->mark = on ? i : -1;
  for (int i = 0; i < g->n_leaves; i++)
    g->leaves[i]->mark = on ? -3 - i : -1;
}

void nbi_graph_free(nbi_graph *g) {
  nbi_graph_mark(g, false);
  free(g->nodes);
  free(g->leaves);
}

/* uses[i]: step i's readers in g; flags[i]: NBI_HELD when its value must outlive
 * the realization (referenced from outside g, or a root), NBI_ROOT for ts. */
void nbi_graph_flags(const nbi_graph *g, nb_tensor *const *ts, int n, int *uses, uint8_t *flags) {
  for (int i = 0; i < g->n; i++)
    for (int k = 0; k < g->nodes[i]->n_in; k++)
      if (g->nodes[i]->in[k]->mark >= 0) uses[g->nodes[i]->in[k]->mark]++;
  for (int i = 0; i < g->n; i++)
    flags[i] = g->nodes[i]->refcount > uses[i] ? NBI_HELD : 0;
  for (int r = 0; r < n; r++)
    if (ts[r]->mark >= 0) flags[ts[r]->mark] = NBI_HELD | NBI_ROOT;
}

/* ---- planning ---------------------------------------------------------------------------- */

/* flags[i]: NBI_HELD / NBI_ROOT; dying[k]: leaf k is one nb_assign rebinds (NULL: none). */
static void graph_hash(const nbi_graph *g, const int *uses, const uint8_t *flags, const bool *dying,
                       hasher *h) {
  hash_i64(h, g->n);
  for (int i = 0; i < g->n; i++) {
    const nb_tensor *t = g->nodes[i];
    /* attrs up to their last nonzero word, and that count: most ops set a
     * few of the 36 words, and hashing all of them was a tenth of a small
     * step's time (bench_mlp readme_mlp_step) */
    size_t nw = sizeof t->attrs / sizeof(uint64_t);
    for (uint64_t w = 0; nw > 0; nw--) {
      memcpy(&w, (const char *)&t->attrs + 8 * (nw - 1), 8);
      if (w) break;
    }
    int64_t head[7] = {t->op, t->dtype, t->n_in, flags[i], t->shape.ndim, t->device, (int64_t)nw};
    hash_words(h, head, 7);
    hash_words(h, t->shape.dims, (size_t)t->shape.ndim);
    hash_words(h, &t->attrs, nw);
    for (int k = 0; k < t->n_in; k++)
      hash_i64(h, t->in[k]->mark);
    hash_i64(h, uses[i]);
  }
  for (int i = 0; i < g->n_leaves; i++) {
    const nb_tensor *l = g->leaves[i];
    int64_t head[4] = {l->dtype, l->shape.ndim, dying && dying[i], l->device};
    hash_words(h, head, 4);
    hash_words(h, l->shape.dims, (size_t)l->shape.ndim);
    hash_words(h, l->shard0.strides, (size_t)l->shape.ndim);
  }
}

/* Points every swapped input at its alias source (on) or back (off). */
void nbi_plan_swap_inputs(const nbi_plan *p, const nbi_graph *g, bool on) {
  for (int e = 0; e < p->n_swap; e++) {
    const int *w = p->swap + 3 * e;
    g->nodes[w[0]]->in[w[1]] = on ? nbi_mark_tensor(g, p->alias[w[2]]) : g->nodes[w[2]];
  }
}

/* Shows the planner the simplified graph cn[0..n_run-1] (on): inputs swapped
 * to their sources, marks = run positions; or restores g (off). */
static void simplified_view(const nbi_plan *p, const nbi_graph *g, nb_tensor *const *cn, bool on) {
  if (on) nbi_plan_swap_inputs(p, g, true);
  for (int c = 0; c < p->n_run; c++)
    cn[c]->mark = on ? c : p->run[c];
  if (!on) nbi_plan_swap_inputs(p, g, false);
}

/* The input whose buffer member k of the step f..e (run positions: a group,
 * or f == e == k alone) may take: 4 * j + q for cn[j]->in[q], or -1; on the
 * simplified view. spare[c]: run position c's buffer is temporary (nothing
 * keeps it, no kept alias shares it); last/llast: the run position after
 * which a step / leaf is dead; dies[k]: leaf k is one nb_assign rebinds. */
static int inplace_source(nb_tensor *const *cn, const nbi_plan *p, const bool *spare,
                          const int *last, const int *llast, const bool *dies, int f, int e,
                          int k) {
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
 * NBI_HELD / NBI_ROOT; dying[k]: leaf k is one nb_assign rebinds (NULL: none). In order:
 * simplification; grouping and last uses on the simplified graph (a last use,
 * last[c]: the run position after which c's buffer is dead, inside a fused
 * group counts at the group's last step, when it runs; uses of an aliased
 * step count as uses of its source); fates on the original edges; kept
 * aliases' shares of their sources' storage; in-place steps; frees. On
 * failure p keeps what it allocated (nbi_plan_clear frees it). */
bool nbi_plan_fill(nbi_plan *p, const nbi_graph *g, const uint8_t *flags, const bool *dying) {
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
    held[i] = flags[i] & NBI_HELD;
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
    root_run[c] = flags[p->run[c]] & NBI_ROOT;
  }
  for (int i = 0; i < n; i++) /* a root alias takes its source's buffer: it needs one */
    if ((flags[i] & NBI_ROOT) && p->alias[i] != i && p->alias[i] >= 0)
      root_run[pos[p->alias[i]]] = true;

  /* Grouping (only what roots and other groups read is stored) and last uses,
   * of steps and of leaves, on the simplified graph. */
  simplified_view(p, g, cn, true);
  nbi_fuse_plan(cn, n_run, root_run, p->group, p->store);
  p->fused = nbi_fuse_describe_groups(cn, n_run, p->group, p->store, &p->n_fused);
  if (!(ok = p->fused != NULL)) {
    simplified_view(p, g, cn, false);
    goto done;
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
    p->fate[i] = held[i] && !has[i] ? NBI_FATE_LAZY : NBI_FATE_TEMP;
  }
  for (int i = n - 1; i >= 0; i--) {
    if (p->fate[i] != NBI_FATE_LAZY) continue;
    const nb_tensor *t = g->nodes[i];
    for (int k = 0; k < t->n_in; k++) {
      int x = t->in[k]->mark;
      if (x >= 0 && has[x])
        keep[x] = true;
      else if (x >= 0)
        p->fate[x] = NBI_FATE_LAZY;
      else
        dies[-3 - x] = false; /* a lazy node will read its value later */
    }
  }
  for (int i = 0; i < n; i++)
    if (has[i] && (held[i] || keep[i])) p->fate[i] = NBI_FATE_KEEP;

  /* Kept aliases take their source's storage at the end of the source's
   * group (leaves' before any step); the source's buffer lives until then and
   * is no longer spare (nor a rebound leaf's). */
  for (int c = 0; c < n_run; c++)
    spare[c] = has[p->run[c]] && p->fate[p->run[c]] == NBI_FATE_TEMP;
  for (int i = 0; i < n; i++) {
    if (p->fate[i] != NBI_FATE_KEEP || p->alias[i] == i) continue;
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
    if (p->fate[i] == NBI_FATE_KEEP && p->alias[i] != i) {
      int a = p->alias[i];
      p->mat_idx[count[a >= 0 ? nbi_fuse_group_end(p->group, n_run, pos[a]) + 1 : 0]++] = i;
    }

  /* In place: elementwise steps with a buffer, on the simplified graph. */
  for (int c = 0; c < n_run; c++)
    p->inplace[c] = -1;
  simplified_view(p, g, cn, true);
  for (int f = 0, gi = 0; f < n_run;) {
    int e = nbi_fuse_group_end(p->group, n_run, f);
    /* a GEMM epilogue's primitive reads its operands (the bias too) while it
     * writes its result, and a row group's members read operands across a
     * whole row (a broadcast operand across rows too), some more than once (a
     * GPU kernel recomputes a row per phase): none of their members writes
     * over an input. An elementwise group reads each operand only at the
     * index it writes. */
    bool no_inplace = e > f && p->fused[gi++].g.kind != NBI_GROUP_ELEMENTWISE;
    for (int k = f; k <= e && !no_inplace; k++)
      if (has[p->run[k]] && nbi_fuse_elementwise_step(cn[k]))
        p->inplace[k] = inplace_source(cn, p, spare, last, llast, dies, f, e, k);
    f = e + 1;
  }
  simplified_view(p, g, cn, false);

  memset(count, 0, sizeof(int) * (mm + 2));
  for (int c = 0; c < n_run; c++)
    if (has[p->run[c]] && p->fate[p->run[c]] == NBI_FATE_TEMP && last[c] >= 0)
      count[last[c]]++, n_free++;
  p->free_idx = malloc(sizeof(int) * (size_t)(n_free ? n_free : 1));
  if (!(ok = p->free_idx != NULL)) goto done;
  p->free_start[0] = 0;
  for (int c = 0; c < n_run; c++)
    p->free_start[c + 1] = p->free_start[c] + count[c];
  for (int c = 0; c < n_run; c++)
    count[c] = p->free_start[c];
  for (int c = 0; c < n_run; c++)
    if (has[p->run[c]] && p->fate[p->run[c]] == NBI_FATE_TEMP && last[c] >= 0)
      p->free_idx[count[last[c]]++] = p->run[c];
  for (int c = 0; c < n_run; c++) {
    const nb_tensor *t = g->nodes[p->run[c]];
    p->devices |= 1u << t->device;
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

static nbi_plan *plan_build(const nbi_graph *g, const uint8_t *flags, const bool *dying,
                            uint64_t h1, uint64_t h2) {
  nbi_plan *p = plan_cache_slot();
  if (!p) return NULL;
  if (!nbi_plan_fill(p, g, flags, dying)) {
    nbi_plan_clear(p);
    return NULL;
  }
  p->h1 = h1;
  p->h2 = h2;
  p->last_used = ++plan_clock;
  return p;
}

/* The structural hash keys the cache: the graph (graph_hash) and the settings
 * that change a plan. */
nbi_plan *nbi_plan_get(const nbi_graph *g, const int *uses, const uint8_t *flags,
                       const bool *dying) {
  hasher h = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
  graph_hash(g, uses, flags, dying, &h);
  hash_i64(&h, nbi_fusion_enabled()); /* the grouping is part of the plan */
  hash_i64(&h, nbi_simplify_enabled());
  nbi_plan *p = plan_cache_lookup(h.a, h.b, g->n);
  nbi_stats_plan(p != NULL);
  return p ? p : plan_build(g, flags, dying, h.a, h.b);
}

/* ---- description (nb_graph_dot) --------------------------------------------------------- */
typedef struct describe {
  nbi_graph g;
  nbi_plan p;
  int *uses;
  uint8_t *flags;
} describe;

nb_status nbi_plan_describe(nb_tensor *const *ts, int n, nbi_plan_desc *d) {
  *d = (nbi_plan_desc){0};
  describe *x = calloc(1, sizeof *x);
  if (!x) return nbi_error(NB_ERR_OOM, "nb_graph_dot: out of memory");
  d->internal = x;
  nb_status st = nbi_graph_collect(&x->g, ts, n);
  int m = x->g.n ? x->g.n : 1;
  x->uses = calloc((size_t)m, sizeof(int));
  x->flags = calloc((size_t)m, 1);
  d->held = calloc((size_t)m, sizeof(bool));
  if (!st && (!x->uses || !x->flags || !d->held)) st = NB_ERR_OOM;
  if (!st) nbi_graph_flags(&x->g, ts, n, x->uses, x->flags);
  if (!st && !nbi_plan_fill(&x->p, &x->g, x->flags, NULL)) st = NB_ERR_OOM;
  if (st) {
    nbi_plan_describe_free(d);
    return nbi_error(st, "nb_graph_dot: out of memory planning the graph");
  }
  for (int i = 0; i < x->g.n; i++)
    d->held[i] = x->flags[i] & NBI_HELD;
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
    nbi_graph_free(&x->g);
    nbi_plan_clear(&x->p);
    free(x->uses);
    free(x->flags);
    free(x);
  }
  free(d->held);
  *d = (nbi_plan_desc){0};
}
