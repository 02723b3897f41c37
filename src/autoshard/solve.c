/* src/autoshard/solve.c — the solvers (contract in autoshard.h):
 *  - as_solve_dp: exact dynamic programming over a forest (every chain or
 *    tree of ops: each variable's best subtree cost per strategy of its
 *    parent, then the choices top-down);
 *  - as_solve_local: deterministic local search for any graph: a start from
 *    replicated inputs (each node then takes its best strategy given its
 *    operands, in program order), iterated conditional modes (every variable
 *    in turn takes its best strategy given all its neighbours, until none
 *    changes), then moves of one input to each of its other layouts, the
 *    nodes re-chosen as at the start and improved again, kept when the total
 *    falls; rounds until no move helps;
 *  - as_solve: either, under the memory bound: a penalty lambda per byte of
 *    every value's local block is added to the unaries and doubled until the
 *    peak (as_peak_bytes) fits.
 * Ties go to the lowest strategy index (fewest axes used first), so results
 * are deterministic. */
#include "autoshard.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double ecost(const as_graph *g, const as_edge *e, int su, int sv) {
  return e->c[su * g->v[e->v].n_s + sv];
}

double as_total(const as_graph *g, const int *choice) {
  double t = 0;
  for (int i = 0; i < g->n_v; i++)
    t += g->v[i].unary[choice[i]];
  for (int e = 0; e < g->n_e; e++)
    t += ecost(g, &g->e[e], choice[g->e[e].u], choice[g->e[e].v]);
  return t;
}

/* ---- forests and the exact DP -------------------------------------------------------- */
static int find(int *parent, int x) { /* union-find root, halving the path */
  while (parent[x] != x)
    x = parent[x] = parent[parent[x]];
  return x;
}

bool as_is_forest(const as_graph *g) {
  int *parent = malloc(sizeof *parent * (size_t)(g->n_v + 1));
  if (!parent) return false;
  for (int i = 0; i < g->n_v; i++)
    parent[i] = i;
  bool ok = true;
  for (int e = 0; e < g->n_e && ok; e++) {
    int a = find(parent, g->e[e].u), b = find(parent, g->e[e].v);
    ok = a != b;
    parent[a] = b;
  }
  free(parent);
  return ok;
}

/* Exact DP over the variables in S (in[x]) whose induced graph is a forest,
 * the others fixed at choice (their edges into S become unaries). */
static nb_status dp_block(const as_graph *g, int *choice, const bool *in) {
  int n = g->n_v;
  int *order = malloc(sizeof *order * (size_t)(n + 1)), *up = malloc(sizeof *up * (size_t)(n + 1));
  bool *seen = calloc((size_t)n + 1, 1);
  double **best = calloc((size_t)n + 1, sizeof *best); /* subtree cost per own strategy */
  nb_status st = order && up && seen && best ? NB_OK : nbi_error(NB_ERR_OOM, "out of memory");
  for (int i = 0; i < n && !st; i++)
    if (in[i] && !(best[i] = malloc(sizeof **best * (size_t)g->v[i].n_s)))
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  int n_order = 0;
  /* breadth-first order from each component's lowest variable; up[x]: the edge to its parent */
  for (int r = 0; r < n && !st; r++) {
    if (seen[r] || !in[r]) continue;
    seen[r] = true;
    up[r] = -1;
    int head = n_order;
    order[n_order++] = r;
    while (head < n_order) {
      int x = order[head++];
      for (int q = 0; q < g->v[x].n_edges; q++) {
        const as_edge *e = &g->e[g->v[x].edges[q]];
        int y = e->u == x ? e->v : e->u;
        if (seen[y] || !in[y]) continue;
        seen[y] = true;
        up[y] = g->v[x].edges[q];
        order[n_order++] = y;
      }
    }
  }
  for (int i = n_order - 1; i >= 0 && !st; i--) { /* children before parents */
    int x = order[i];
    for (int s = 0; s < g->v[x].n_s; s++)
      best[x][s] = g->v[x].unary[s];
    for (int q = 0; q < g->v[x].n_edges; q++) {
      int ei = g->v[x].edges[q];
      if (ei == up[x]) continue;
      const as_edge *e = &g->e[ei];
      int y = e->u == x ? e->v : e->u;
      for (int s = 0; s < g->v[x].n_s; s++) {
        double m = INFINITY;
        if (!in[y]) { /* fixed: its edge is a unary of x */
          m = e->u == x ? ecost(g, e, s, choice[y]) : ecost(g, e, choice[y], s);
        } else {
          for (int t = 0; t < g->v[y].n_s; t++) {
            double c = best[y][t] + (e->u == x ? ecost(g, e, s, t) : ecost(g, e, t, s));
            if (c < m) m = c;
          }
        }
        best[x][s] += m;
      }
    }
  }
  for (int i = 0; i < n_order && !st; i++) { /* parents before children */
    int x = order[i], bs = 0;
    double bc = INFINITY;
    const as_edge *e = up[x] >= 0 ? &g->e[up[x]] : NULL;
    int p = e ? (e->u == x ? e->v : e->u) : -1;
    for (int s = 0; s < g->v[x].n_s; s++) {
      double c = best[x][s];
      if (e) c += e->u == x ? ecost(g, e, s, choice[p]) : ecost(g, e, choice[p], s);
      if (s == 0 || c < bc - 1e-12 * fabs(bc)) bc = c, bs = s;
    }
    choice[x] = bs;
  }
  for (int i = 0; best && i < n; i++)
    free(best[i]);
  free(best);
  free(order);
  free(up);
  free(seen);
  return st;
}

nb_status as_solve_dp(as_graph *g, int *choice) {
  bool *all = malloc((size_t)g->n_v + 1);
  if (!all) return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  memset(all, 1, (size_t)g->n_v + 1);
  nb_status st = dp_block(g, choice, all);
  free(all);
  return st;
}

/* A maximal set of variables, taken in the given order (step +1 or -1 from
 * first, wrapping), whose induced graph is a forest. */
static void forest_block(const as_graph *g, int first, int step, bool *in, int *parent) {
  int n = g->n_v;
  for (int i = 0; i < n; i++)
    in[i] = false, parent[i] = i;
  for (int c = 0; c < n; c++) {
    int x = ((first + step * c) % n + n) % n;
    bool ok = true;
    int roots[64], n_roots = 0;
    for (int q = 0; q < g->v[x].n_edges && ok; q++) {
      const as_edge *e = &g->e[g->v[x].edges[q]];
      int y = e->u == x ? e->v : e->u;
      if (!in[y]) continue;
      int r = find(parent, y);
      for (int j = 0; j < n_roots && ok; j++)
        ok = roots[j] != r;
      if (ok && n_roots < 64)
        roots[n_roots++] = r;
      else
        ok = false;
    }
    if (!ok) continue;
    in[x] = true;
    for (int j = 0; j < n_roots; j++)
      parent[roots[j]] = x;
  }
}

/* ---- local search ------------------------------------------------------------------- */
/* x's cost under strategy s given its neighbours' choices (those with done
 * set, or all when done is NULL). */
static double local_cost(const as_graph *g, const int *choice, const bool *done, int x, int s) {
  double c = g->v[x].unary[s];
  for (int q = 0; q < g->v[x].n_edges; q++) {
    const as_edge *e = &g->e[g->v[x].edges[q]];
    int y = e->u == x ? e->v : e->u;
    if (done && !done[y]) continue;
    c += e->u == x ? ecost(g, e, s, choice[y]) : ecost(g, e, choice[y], s);
  }
  return c;
}

static int argmin(const as_graph *g, const int *choice, const bool *done, int x) {
  int bs = choice[x];
  double bc = local_cost(g, choice, done, x, bs);
  for (int s = 0; s < g->v[x].n_s; s++) {
    double c = local_cost(g, choice, done, x, s);
    if (c < bc - 1e-12 * fabs(bc)) bc = c, bs = s;
  }
  return bs;
}

/* Nodes in program order take their best strategy given the variables before. */
static void greedy(const as_graph *g, int *choice, bool *done) {
  int n_in = g->n_inputs;
  for (int i = 0; i < g->n_v; i++)
    done[i] = i < n_in;
  for (int i = n_in; i < g->n_v; i++) {
    choice[i] = 0;
    choice[i] = argmin(g, choice, done, i);
    done[i] = true;
  }
}

/* Min-sum belief propagation: per edge a message each way (a cost per
 * strategy of the receiver), variables swept in order then in reverse, each
 * sending to all its neighbours from its unary plus the other incoming
 * messages; half damped; choice: each variable's least belief. Exact on a
 * forest; on a graph with cycles a global start that local moves cannot
 * reach (a whole layer switching to tensor parallelism at once). */
static nb_status bp_start(const as_graph *g, int *choice, int sweeps, double damping) {
  int n = g->n_v;
  size_t tot = 0, maxs = 1;
  for (int e = 0; e < g->n_e; e++)
    tot += (size_t)g->v[g->e[e].u].n_s + (size_t)g->v[g->e[e].v].n_s;
  for (int i = 0; i < n; i++)
    maxs = (size_t)g->v[i].n_s > maxs ? (size_t)g->v[i].n_s : maxs;
  double *msg = calloc(tot + 1, sizeof *msg), *bel = malloc(sizeof *bel * maxs);
  double *nm = malloc(sizeof *nm * maxs);
  size_t *off = malloc(sizeof *off * (size_t)(g->n_e + 1)); /* to v at off, to u after */
  if (!msg || !bel || !nm || !off) {
    free(msg), free(bel), free(nm), free(off);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  }
  for (int e = 0, o = 0; e < g->n_e; e++) {
    off[e] = (size_t)o;
    o += g->v[g->e[e].u].n_s + g->v[g->e[e].v].n_s;
  }
  /* the message on edge e into x */
  for (int it = 0; it < 2 * sweeps; it++)
    for (int c = 0; c < n; c++) {
      int x = it % 2 ? n - 1 - c : c;
      const as_var *X = &g->v[x];
      for (int s = 0; s < X->n_s; s++)
        bel[s] = X->unary[s];
      for (int q = 0; q < X->n_edges; q++) {
        int ei = X->edges[q];
        const as_edge *e = &g->e[ei];
        const double *in = msg + off[ei] + (e->v == x ? 0 : (size_t)g->v[e->v].n_s);
        for (int s = 0; s < X->n_s; s++)
          bel[s] += in[s];
      }
      for (int q = 0; q < X->n_edges; q++) {
        int ei = X->edges[q];
        const as_edge *e = &g->e[ei];
        int y = e->u == x ? e->v : e->u;
        const double *in = msg + off[ei] + (e->v == x ? 0 : (size_t)g->v[e->v].n_s);
        double *out = msg + off[ei] + (e->v == y ? 0 : (size_t)g->v[e->v].n_s);
        int ny = g->v[y].n_s;
        double lo = INFINITY;
        for (int t = 0; t < ny; t++) {
          double m = INFINITY;
          for (int s = 0; s < X->n_s; s++) {
            double v = bel[s] - in[s] + (e->u == x ? ecost(g, e, s, t) : ecost(g, e, t, s));
            m = v < m ? v : m;
          }
          nm[t] = m;
          lo = m < lo ? m : lo;
        }
        for (int t = 0; t < ny; t++)
          out[t] = it < 2 ? nm[t] - lo : damping * out[t] + (1 - damping) * (nm[t] - lo);
      }
    }
  for (int x = 0; x < n; x++) {
    const as_var *X = &g->v[x];
    for (int s = 0; s < X->n_s; s++)
      bel[s] = X->unary[s];
    for (int q = 0; q < X->n_edges; q++) {
      int ei = X->edges[q];
      const as_edge *e = &g->e[ei];
      const double *in = msg + off[ei] + (e->v == x ? 0 : (size_t)g->v[e->v].n_s);
      for (int s = 0; s < X->n_s; s++)
        bel[s] += in[s];
    }
    int bs = 0;
    for (int s = 1; s < X->n_s; s++)
      if (bel[s] < bel[bs] - 1e-12 * fabs(bel[bs])) bs = s;
    choice[x] = bs;
  }
  free(msg), free(bel), free(nm), free(off);
  return NB_OK;
}

static void icm(const as_graph *g, int *choice) {
  for (int sweep = 0; sweep < 100; sweep++) {
    bool changed = false;
    for (int i = 0; i < g->n_v; i++) {
      int s = argmin(g, choice, NULL, i);
      if (s != choice[i]) choice[i] = s, changed = true;
    }
    if (!changed) return;
  }
}

typedef struct ls_work {
  int *trial;
  bool *done, *in;
  int *parent;
} ls_work;

/* Block moves (exact DP over maximal induced forests taken in program order,
 * in reverse and from the middle) and ICM until the total stops falling. */
static nb_status improve(const as_graph *g, int *choice, ls_work *w) {
  int n = g->n_v;
  const int firsts[4][2] = {{0, 1}, {n - 1, -1}, {g->n_inputs, 1}, {n / 2, -1}};
  double cur = as_total(g, choice);
  for (int it = 0; it < 50; it++) {
    for (int b = 0; b < 4; b++) {
      forest_block(g, firsts[b][0], firsts[b][1], w->in, w->parent);
      nb_status st = dp_block(g, choice, w->in);
      if (st) return st;
    }
    icm(g, choice);
    double t = as_total(g, choice);
    if (!(t < cur - 1e-12 * fabs(cur))) break;
    cur = t;
  }
  return NB_OK;
}

/* Moves of one input to each of its other layouts (the nodes re-chosen
 * greedily, then improved), kept when the total falls, in rounds until none
 * helps. */
static nb_status input_moves(const as_graph *g, int *choice, ls_work *w, int *trial) {
  int n = g->n_v;
  nb_status st = NB_OK;
  double cur = as_total(g, choice);
  for (int round = 0; round < 20 && !st; round++) {
    bool better = false;
    for (int k = 0; k < g->n_inputs && !st; k++) {
      if (g->v[k].n_s < 2) continue;
      for (int s = 0; s < g->v[k].n_s && !st; s++) {
        if (s == choice[k]) continue;
        memcpy(trial, choice, sizeof *trial * (size_t)n);
        trial[k] = s;
        greedy(g, trial, w->done);
        icm(g, trial);
        st = improve(g, trial, w);
        double t = as_total(g, trial);
        if (!st && t < cur - 1e-12 * fabs(cur)) {
          memcpy(choice, trial, sizeof *trial * (size_t)n);
          cur = t;
          better = true;
        }
      }
    }
    if (!better) break;
  }
  return st;
}

nb_status as_solve_local(as_graph *g, int *choice) {
  int n = g->n_v;
  ls_work w = {malloc(sizeof *w.trial * (size_t)(n + 1)), malloc((size_t)n + 1),
               malloc((size_t)n + 1), malloc(sizeof *w.parent * (size_t)(n + 1))};
  int *start = malloc(sizeof *start * (size_t)(n + 1));
  nb_status st = NB_OK;
  if (!w.trial || !w.done || !w.in || !w.parent || !start)
    st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  /* four starts: everything replicated (strategy 0: no axis used); the nodes
   * chosen greedily on replicated inputs; min-sum belief propagation
   * undamped and half damped. Each is improved, then its inputs moved; the
   * best result is kept (the first on ties). */
  double best = INFINITY;
  for (int k = 0; k < 4 && !st; k++) {
    memset(start, 0, sizeof *start * (size_t)n);
    if (k == 1) greedy(g, start, w.done);
    if (k >= 2) st = bp_start(g, start, k == 2 ? 10 : 30, k == 2 ? 0.0 : 0.5);
    if (st) break;
    icm(g, start);
    if (!(st = improve(g, start, &w))) st = input_moves(g, start, &w, w.trial);
    double t = as_total(g, start);
    if (!st && (k == 0 || t < best - 1e-12 * fabs(best))) {
      memcpy(choice, start, sizeof *start * (size_t)n);
      best = t;
    }
  }
  free(start);
  free(w.trial);
  free(w.done);
  free(w.in);
  free(w.parent);
  return st;
}

/* ---- memory ------------------------------------------------------------------------- */
double as_peak_bytes(const as_graph *g, const int *choice) {
  const nbi_program *p = g->prog;
  double base = 0, peak = 0;
  for (int k = 0; k < p->n_in; k++)
    base += as_local_bytes(g, &g->v[k], g->v[k].s[choice[k]].out);
  double *delta = calloc((size_t)p->n_nodes + 2, sizeof *delta);
  if (!delta) return INFINITY;
  for (int i = 0; i < p->n_nodes; i++) {
    const as_var *x = &g->v[p->n_in + i];
    double b = as_local_bytes(g, x, x->s[choice[p->n_in + i]].out);
    int last = x->last_use < i ? i : x->last_use;
    delta[i] += b;
    delta[last + 1] -= b;
  }
  double live = 0;
  for (int i = 0; i <= p->n_nodes; i++) {
    live += delta[i];
    if (live > peak) peak = live;
  }
  free(delta);
  return base + peak;
}

/* The shared solution improved on the full graph (block moves and ICM: the
 * layers may then differ where the boundary makes one cheaper). */
static nb_status polish(const as_graph *g, int *choice) {
  int n = g->n_v;
  ls_work w = {NULL, malloc((size_t)n + 1), malloc((size_t)n + 1),
               malloc(sizeof *w.parent * (size_t)(n + 1))};
  nb_status st =
      w.done && w.in && w.parent ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  if (!st) {
    icm(g, choice);
    st = improve(g, choice, &w);
  }
  free(w.done);
  free(w.in);
  free(w.parent);
  return st;
}

static nb_status solve_once(as_graph *g, int solver, as_share *sh, int *choice) {
  if (sh) {
    as_share_unaries(g, sh);
    nb_status st = solver == NB_AUTO_SHARD_ILP ? as_solve_ilp(&sh->r, sh->r.choice, g->ilp_max_s)
                   : as_is_forest(&sh->r)      ? as_solve_dp(&sh->r, sh->r.choice)
                                               : as_solve_local(&sh->r, sh->r.choice);
    if (!st) as_share_expand(g, sh, choice);
    return st ? st : polish(g, choice);
  }
  if (solver == NB_AUTO_SHARD_DP) return as_solve_dp(g, choice);
  if (solver == NB_AUTO_SHARD_ILP) return as_solve_ilp(g, choice, g->ilp_max_s);
  return as_solve_local(g, choice);
}

static nb_status solve_bounded(as_graph *g, int solver, as_share *sh) {
  as_unaries(g, 0);
  nb_status st = solve_once(g, solver, sh, g->choice);
  if (st || g->max_bytes <= 0) return st;
  double peak = as_peak_bytes(g, g->choice);
  if (peak <= g->max_bytes) return NB_OK;
  /* the penalty starts where a byte costs what it takes to send it */
  double lambda = 0;
  for (int a = 0; a < g->m->n_axes; a++)
    lambda = lambda > g->beta[a] ? lambda : g->beta[a];
  if (lambda <= 0) lambda = 1e-12;
  for (int it = 0; it < 60 && peak > g->max_bytes; it++, lambda *= 2) {
    as_unaries(g, lambda);
    if ((st = solve_once(g, solver, sh, g->choice))) return st;
    peak = as_peak_bytes(g, g->choice);
  }
  as_unaries(g, 0);
  if (peak > g->max_bytes)
    return nbi_error(NB_ERR_SHARDING,
                     "%s: no plan found within max_bytes_per_device = %.0f bytes (the best "
                     "needs %.0f per device)",
                     g->fn, g->max_bytes, peak);
  return NB_OK;
}

nb_status as_solve(as_graph *g, int solver) {
  bool forest = as_is_forest(g);
  if (solver == NB_AUTO_SHARD_DP && !forest)
    return nbi_error(NB_ERR_ARG,
                     "%s: the exact DP solver needs a graph that is a tree (this one has cycles: "
                     "a value read twice, a tied output); use NB_AUTO_SHARD_LOCAL or AUTO",
                     g->fn);
  if (solver == NB_AUTO_SHARD_AUTO) solver = forest ? NB_AUTO_SHARD_DP : NB_AUTO_SHARD_LOCAL;
  g->solver = solver;
  g->n_choices = g->n_v;
  as_share sh;
  bool shared = false;
  if (g->share && (solver == NB_AUTO_SHARD_LOCAL || solver == NB_AUTO_SHARD_ILP)) {
    nb_status st = as_share_build(g, &sh);
    if (st) return st;
    shared = sh.n_groups < g->n_v;
    if (shared)
      g->n_choices = sh.n_groups;
    else
      as_share_free(&sh);
  }
  nb_status st = solve_bounded(g, solver, shared ? &sh : NULL);
  if (shared) as_share_free(&sh);
  return st;
}
