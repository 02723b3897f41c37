/* src/autoshard/share.c — repeated layers share one set of choices (contract
 * in autoshard.h).
 *
 * Detection: every variable gets a local signature (op, attributes, shape,
 * element size, its strategies' count, and per operand the operand's kind,
 * op, shape and element size: not which value it is, so layer k's matmul
 * reading its own weight and activation looks like layer k+1's). The nodes,
 * in program order, are scanned for every period P: a run of at least P
 * consecutive nodes i with sig(i) == sig(i + P) (and the same strategies) is
 * a structure repeated at distance P (runs shorter than 4 nodes are
 * ignored), and each i is tied to i + P; the
 * inputs they read in the same operand slot (parameters) are tied too. A
 * tie only restricts the problem (the objective is still the full graph's),
 * so a coincidental match costs optimality, never correctness.
 *
 * The reduced problem has one variable per group (ordered by first member,
 * so inputs come first): its unary is the sum of its members' unaries plus
 * the diagonal of edges inside the group (both ends take the same strategy),
 * and the edges between two groups are summed into one. The solvers of
 * solve.c run on it unchanged; a group's choice is every member's. */
#include "autoshard.h"
#include "../core/oprules.h"
#include "../core/program.h"

#include <stdlib.h>
#include <string.h>

/* A repeat must span at least this many nodes: shorter matches are
 * coincidences (two relu masks in a row), not layers. */
enum { AS_SHARE_MIN_RUN = 4 };

static uint64_t mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

static uint64_t mix_bytes(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    h = mix(h, b[i]);
  return h;
}

/* The variable itself: kind, op, shape, element size, strategies. */
static uint64_t sig0(const as_graph *g, int x) {
  const as_var *v = &g->v[x];
  uint64_t h = mix(0, (uint64_t)v->kind);
  if (v->kind == AS_NODE) h = mix(h, (uint64_t)g->prog->nodes[v->index].op);
  h = mix(h, (uint64_t)v->shape.ndim);
  for (int d = 0; d < v->shape.ndim; d++)
    h = mix(h, (uint64_t)v->shape.dims[d]);
  h = mix(h, (uint64_t)v->elt);
  h = mix(h, (uint64_t)v->n_s);
  return mix(h, (uint64_t)v->plain | (uint64_t)v->opaque << 1 | (uint64_t)v->pinned << 2);
}

/* Whether x and y have the same strategies (layouts and targets). */
static bool same_strats(const as_graph *g, int x, int y) {
  const as_var *a = &g->v[x], *b = &g->v[y];
  if (a->n_s != b->n_s || a->n_in != b->n_in || a->kind != b->kind) return false;
  for (int s = 0; s < a->n_s; s++)
    if (!as_layout_eq(a->s[s].out, b->s[s].out)) return false;
  size_t nt = (size_t)a->n_s * (size_t)a->n_in;
  return nt == 0 || !memcmp(a->tgt, b->tgt, sizeof *a->tgt * nt);
}

static int find(int *parent, int x) {
  while (parent[x] != x)
    x = parent[x] = parent[parent[x]];
  return x;
}

static void unite(int *parent, int a, int b) {
  a = find(parent, a), b = find(parent, b);
  if (a == b) return;
  if (a < b)
    parent[b] = a;
  else
    parent[a] = b;
}

/* Ties node i to node j and the inputs they read in the same slots. */
static void tie_nodes(const as_graph *g, int *parent, int i, int j) {
  unite(parent, i, j);
  const as_var *a = &g->v[i], *b = &g->v[j];
  for (int k = 0; k < a->n_in; k++) {
    int x = a->in_var[k], y = b->in_var[k];
    if (x == y || g->v[x].kind != AS_INPUT || g->v[y].kind != AS_INPUT) continue;
    if (g->v[x].plain || g->v[y].plain || !same_strats(g, x, y)) continue;
    unite(parent, x, y);
  }
}

void as_share_free(as_share *sh) {
  as_graph *r = &sh->r;
  for (int i = 0; r->v && i < r->n_v; i++) {
    free(r->v[i].unary);
    free(r->v[i].edges);
  }
  for (int e = 0; e < r->n_e; e++)
    free(r->e[e].c);
  free(r->e);
  free(r->v);
  free(r->choice);
  free(sh->group);
  *sh = (as_share){0};
}

void as_share_unaries(const as_graph *g, as_share *sh) {
  as_graph *r = &sh->r;
  for (int q = 0; q < r->n_v; q++)
    memset(r->v[q].unary, 0, sizeof *r->v[q].unary * (size_t)r->v[q].n_s);
  for (int i = 0; i < g->n_v; i++) {
    as_var *x = &r->v[sh->group[i]];
    for (int s = 0; s < x->n_s; s++)
      x->unary[s] += g->v[i].unary[s];
  }
  for (int e = 0; e < g->n_e; e++) {
    const as_edge *ed = &g->e[e];
    int q = sh->group[ed->u];
    if (q != sh->group[ed->v]) continue;
    as_var *x = &r->v[q];
    for (int s = 0; s < x->n_s; s++)
      x->unary[s] += ed->c[s * x->n_s + s];
  }
}

nb_status as_share_build(const as_graph *g, as_share *sh) {
  *sh = (as_share){0};
  int n = g->n_v, n_in = g->n_inputs;
  int *parent = malloc(sizeof *parent * (size_t)(n + 1));
  uint64_t *sig = malloc(sizeof *sig * (size_t)(n + 1)), *s0 = malloc(sizeof *s0 * (size_t)(n + 1));
  sh->group = malloc(sizeof *sh->group * (size_t)(n + 1));
  nb_status st = NB_OK;
  if (!parent || !sig || !s0 || !sh->group) {
    st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
    goto done;
  }
  for (int i = 0; i < n; i++)
    parent[i] = i, s0[i] = sig0(g, i);
  for (int i = 0; i < n; i++) {
    const as_var *v = &g->v[i];
    uint64_t h = s0[i];
    if (v->kind == AS_NODE) {
      const nbi_prog_node *pn = &g->prog->nodes[v->index];
      h = mix_bytes(h, &pn->attrs, sizeof pn->attrs);
      h = mix(h, (uint64_t)v->n_in);
      for (int k = 0; k < v->n_in; k++)
        h = mix(h, s0[v->in_var[k]]);
    }
    sig[i] = h;
  }
  /* runs of at least P nodes repeated at distance P */
  int n_nodes = n - n_in;
  for (int P = 1; P <= n_nodes / 2; P++) {
    int run = 0;
    for (int i = n_in; i + P <= n; i++) {
      bool match = i + P < n && sig[i] == sig[i + P] && same_strats(g, i, i + P);
      if (match) {
        run++;
        continue;
      }
      if (run >= P && run >= AS_SHARE_MIN_RUN)
        for (int j = i - run; j < i; j++)
          tie_nodes(g, parent, j, j + P);
      run = 0;
    }
  }
  /* groups numbered by first member: inputs' groups first */
  int n_g = 0, n_gin = 0;
  for (int i = 0; i < n; i++) {
    int root = find(parent, i);
    if (root == i) {
      sh->group[i] = n_g++;
      n_gin += i < n_in;
    } else {
      sh->group[i] = sh->group[root];
    }
  }
  sh->n_groups = n_g;
  as_graph *r = &sh->r;
  *r = (as_graph){.fn = g->fn, .m = g->m, .prog = g->prog, .n_v = n_g, .n_inputs = n_gin};
  r->flops_per_s = g->flops_per_s;
  memcpy(r->alpha, g->alpha, sizeof r->alpha);
  memcpy(r->beta, g->beta, sizeof r->beta);
  if (!(r->v = calloc((size_t)n_g + 1, sizeof *r->v)) ||
      !(r->choice = calloc((size_t)n_g + 1, sizeof *r->choice))) {
    st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
    goto done;
  }
  for (int i = 0; i < n && !st; i++) {
    as_var *x = &r->v[sh->group[i]];
    if (x->unary) continue;
    x->kind = g->v[i].kind, x->index = i, x->n_s = g->v[i].n_s;
    x->s = g->v[i].s; /* borrowed: the solvers read n_s, unary and edges only */
    x->shape = g->v[i].shape, x->elt = g->v[i].elt;
    if (!(x->unary = calloc((size_t)x->n_s + 1, sizeof *x->unary)))
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  }
  for (int e = 0; e < g->n_e && !st; e++) {
    const as_edge *ed = &g->e[e];
    int a = sh->group[ed->u], b = sh->group[ed->v];
    if (a == b) continue;
    as_edge *re;
    if ((st = as_edge_get(r, a < b ? a : b, a < b ? b : a, &re))) break;
    int nu = g->v[ed->u].n_s, nv = g->v[ed->v].n_s;
    for (int su = 0; su < nu; su++)
      for (int sv = 0; sv < nv; sv++) {
        double c = ed->c[su * nv + sv];
        if (a < b)
          re->c[su * nv + sv] += c;
        else
          re->c[sv * nu + su] += c;
      }
  }
  if (!st) as_share_unaries(g, sh);
done:
  free(parent);
  free(sig);
  free(s0);
  if (st) as_share_free(sh);
  return st;
}

void as_share_expand(const as_graph *g, const as_share *sh, int *choice) {
  for (int i = 0; i < g->n_v; i++)
    choice[i] = sh->r.choice[sh->group[i]];
}
