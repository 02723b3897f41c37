/* src/autoshard/graph.c — the strategy graph of a traced program (contract
 * in autoshard.h): variables and their strategies from the factor rules of
 * src/sharding/rules.c (no second table), the alpha-beta costs, and the
 * reshard cost, which mirrors the reshard planner of src/sharding/shard.c
 * step by step for the layouts enumerated here (whole axes in mesh order,
 * dividing sizes). */
#include "autoshard.h"
#include "../core/oprules.h"
#include "../core/program.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- layouts --------------------------------------------------------------------- */
bool as_layout_eq(as_layout a, as_layout b) { return !memcmp(a.d, b.d, sizeof a.d); }

static as_layout repl(void) {
  as_layout l;
  memset(l.d, AS_REPL, sizeof l.d);
  return l;
}

as_layout as_unpartial(as_layout l) {
  for (int a = 0; a < AS_MAXA; a++)
    if (l.d[a] == AS_PARTIAL) l.d[a] = AS_REPL;
  return l;
}

as_layout as_from(const as_var *x, as_layout l) { return x->shared ? as_unpartial(l) : l; }

static int64_t dim_shards(const nb_mesh *m, as_layout l, int d) {
  int64_t s = 1;
  for (int a = 0; a < m->n_axes; a++)
    if (l.d[a] == d) s *= m->size[a];
  return s;
}

static int64_t all_shards(const nb_mesh *m, as_layout l) {
  int64_t s = 1;
  for (int a = 0; a < m->n_axes; a++)
    if (l.d[a] >= 0) s *= m->size[a];
  return s;
}

double as_local_bytes(const as_graph *g, const as_var *x, as_layout l) {
  return (double)nbi_numel(&x->shape) * (double)x->elt / (double)all_shards(g->m, l);
}

nbi_sharding as_to_sharding(const as_graph *g, as_layout l, int ndim) {
  nbi_sharding s = nbi_sharding_replicated(ndim);
  for (int a = 0; a < g->m->n_axes; a++) {
    nbi_axis ax = nbi_axis_whole(g->m, a);
    if (l.d[a] >= 0 && l.d[a] < ndim)
      s.dim[l.d[a]].ax[s.dim[l.d[a]].n++] = ax;
    else if (l.d[a] == AS_PARTIAL)
      s.partial[s.n_partial++] = ax;
  }
  return s;
}

/* The axes of dimension d, in mesh order. */
static int dim_axes(const nb_mesh *m, as_layout l, int d, int *ax) {
  int n = 0;
  for (int a = 0; a < m->n_axes; a++)
    if (l.d[a] == d) ax[n++] = a;
  return n;
}

static bool uses(as_layout l, int a) { return l.d[a] >= 0; }

/* ---- the alpha-beta model --------------------------------------------------------- */
/* One collective of kind over the axes in mask, `bytes` summed over devices. */
static void coll(const as_graph *g, as_coll *acc, int kind, uint32_t mask, double bytes) {
  double alpha = 0, beta = 0;
  for (int a = 0; a < g->m->n_axes; a++)
    if (mask >> a & 1u) {
      alpha = alpha > g->alpha[a] ? alpha : g->alpha[a];
      beta = beta > g->beta[a] ? beta : g->beta[a];
    }
  acc->n[kind]++;
  acc->bytes += (uint64_t)(bytes + 0.5);
  acc->time += alpha + bytes / g->m->n_dev * beta;
}

enum { K_AR, K_AG, K_RS, K_A2A, K_PERM };

/* The steps of reshard_phys (src/sharding/shard.c) for dividing whole-axis
 * layouts: 1. partial axes `to` does not keep: a reduce-scatter for one
 * `to` shards a dimension over right after cur's axes, one all-reduce over
 * the others; 2a. an axis moving from the end of a dimension to the end of
 * another: all-to-all; 2b. the last axis of a dimension replaced by one of
 * equal size neither uses elsewhere: permute; 2. per dimension, the axes
 * after the common prefix all-gathered; 3. blocks cut locally (free). */
void as_reshard(const as_graph *g, const nb_shape *shape, size_t elt, as_layout cur, as_layout to,
                as_coll *acc) {
  const nb_mesh *m = g->m;
  int na = m->n_axes, nd = shape->ndim;
  double n_dev = m->n_dev;
  double local = (double)nbi_numel(shape) * (double)elt / (double)all_shards(m, cur);
  for (int a = 0; a < na; a++) /* a pending sum cannot be made from a complete value */
    if (to.d[a] == AS_PARTIAL && cur.d[a] != AS_PARTIAL) {
      acc->time += AS_INVALID;
      return;
    }
  /* 1 */
  uint32_t red = 0;
  int64_t n_red = 1;
  for (int a = 0; a < na; a++) {
    if (cur.d[a] != AS_PARTIAL || to.d[a] == AS_PARTIAL) continue;
    int rs = -1;
    for (int k = 0; k < nd && rs < 0; k++) {
      int ca[AS_MAXA], ta[AS_MAXA];
      int cn = dim_axes(m, cur, k, ca), tn = dim_axes(m, to, k, ta);
      bool prefix = tn == cn + 1 && ta[cn] == a;
      for (int j = 0; j < cn && prefix; j++)
        prefix = ca[j] == ta[j];
      if (prefix && shape->dims[k] % dim_shards(m, to, k) == 0) rs = k;
    }
    if (rs >= 0) {
      double n = (double)m->size[a];
      coll(g, acc, K_RS, 1u << a, n_dev / n * (n - 1) * local);
      cur.d[a] = (int8_t)rs;
      local /= n;
    } else {
      red |= 1u << a;
      n_red *= m->size[a];
      cur.d[a] = AS_REPL;
    }
  }
  if (red) coll(g, acc, K_AR, red, n_dev / (double)n_red * 2.0 * (double)(n_red - 1) * local);
  /* 2a */
  for (int i = 0; i < nd; i++)
    for (int j = 0; j < nd; j++) {
      if (i == j) continue;
      int ci[AS_MAXA], cj[AS_MAXA], ti[AS_MAXA], tj[AS_MAXA];
      int cin = dim_axes(m, cur, i, ci), cjn = dim_axes(m, cur, j, cj);
      int tin = dim_axes(m, to, i, ti), tjn = dim_axes(m, to, j, tj);
      if (cin == 0 || tin != cin - 1 || tjn != cjn + 1) continue;
      int ax = ci[cin - 1];
      bool ok = tj[cjn] == ax;
      for (int q = 0; q < tin && ok; q++)
        ok = ti[q] == ci[q];
      for (int q = 0; q < cjn && ok; q++)
        ok = tj[q] == cj[q];
      as_layout after = cur;
      after.d[ax] = (int8_t)j;
      ok = ok && shape->dims[i] % dim_shards(m, cur, i) == 0 &&
           shape->dims[j] % dim_shards(m, after, j) == 0;
      /* the axis lands at the end of j only when it is last in mesh order there */
      for (int q = 0; q < cjn && ok; q++)
        ok = cj[q] < ax;
      if (!ok) continue;
      double n = (double)m->size[ax];
      coll(g, acc, K_A2A, 1u << ax, n_dev * (local - local / n));
      cur = after;
    }
  /* 2b */
  for (int k = 0; k < nd; k++) {
    int ca[AS_MAXA], ta[AS_MAXA];
    int cn = dim_axes(m, cur, k, ca), tn = dim_axes(m, to, k, ta);
    if (cn == 0 || cn != tn) continue;
    int a0 = ca[cn - 1], a1 = ta[tn - 1];
    if (a0 == a1 || m->size[a0] != m->size[a1]) continue;
    bool ok = true;
    for (int q = 0; q + 1 < cn && ok; q++)
      ok = ca[q] == ta[q];
    ok = ok && !uses(to, a0) && !uses(cur, a1) && shape->dims[k] % dim_shards(m, cur, k) == 0;
    for (int q = 0; q + 1 < cn && ok; q++) /* a1 stays last in mesh order */
      ok = ca[q] < a1;
    if (!ok) continue;
    double sz = (double)m->size[a0];
    coll(g, acc, K_PERM, 1u << a0 | 1u << a1, n_dev / (sz * sz) * (sz * sz - sz) * local);
    cur.d[a0] = AS_REPL;
    cur.d[a1] = (int8_t)k;
  }
  /* 2 */
  for (int k = 0; k < nd; k++) {
    int ca[AS_MAXA], ta[AS_MAXA];
    int cn = dim_axes(m, cur, k, ca), tn = dim_axes(m, to, k, ta);
    int p = 0;
    while (p < cn && p < tn && ca[p] == ta[p])
      p++;
    if (p == cn) continue;
    uint32_t mask = 0;
    int64_t n = 1;
    for (int q = p; q < cn; q++)
      mask |= 1u << ca[q], n *= m->size[ca[q]], cur.d[ca[q]] = AS_REPL;
    coll(g, acc, K_AG, mask, n_dev * (double)(n - 1) * local);
    local *= (double)n;
  }
}

double as_reshard_time(const as_graph *g, const nb_shape *shape, size_t elt, as_layout cur,
                       as_layout to) {
  as_coll acc = {0};
  as_reshard(g, shape, elt, cur, to, &acc);
  return acc.time;
}

/* ---- strategies --------------------------------------------------------------------- */
static nb_status push_strat(as_graph *g, as_var *x, const as_strat *s, const as_layout *tgt) {
  if (x->n_s >= AS_MAX_STRATS) return NB_OK; /* the first ones (fewer axes used first) */
  as_strat *ns = realloc(x->s, sizeof *ns * (size_t)(x->n_s + 1));
  if (!ns) return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  x->s = ns;
  as_layout *nt = realloc(x->tgt, sizeof *nt * (size_t)((x->n_s + 1) * x->n_in + 1));
  if (!nt) return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  x->tgt = nt;
  x->s[x->n_s] = *s;
  if (x->n_in)
    memcpy(x->tgt + (size_t)x->n_s * (size_t)x->n_in, tgt, sizeof *tgt * (size_t)x->n_in);
  x->n_s++;
  return NB_OK;
}

/* Every layout of an input: each axis shards one dimension (sizes dividing)
 * or none; the replicated layout first. */
static nb_status input_strats(as_graph *g, as_var *x) {
  int na = g->m->n_axes, nd = x->shape.ndim;
  int64_t total = 1;
  for (int a = 0; a < na; a++)
    total *= nd + 1;
  for (int64_t c = 0; c < total; c++) {
    as_layout l = repl();
    int64_t r = c;
    for (int a = 0; a < na; a++, r /= nd + 1)
      l.d[a] = (int8_t)(r % (nd + 1) - 1);
    bool ok = true;
    for (int d = 0; d < nd && ok; d++)
      ok = x->shape.dims[d] % dim_shards(g->m, l, d) == 0 &&
           (dim_shards(g->m, l, d) == 1 || x->shape.dims[d] > 1);
    if (!ok) continue;
    as_strat s = {.out = l};
    nb_status st = push_strat(g, x, &s, NULL);
    if (st) return st;
  }
  return NB_OK;
}

static double node_flops(const nbi_prog_node *pn, const nb_shape *in_shapes) {
  double out = (double)nbi_numel(&pn->shape);
  if (pn->op == NBI_OP_MATMUL && pn->n_in == 2) {
    const nb_shape *A = &in_shapes[0];
    return 2.0 * out * (double)A->dims[A->ndim - 1];
  }
  double f = out;
  for (int k = 0; k < pn->n_in; k++)
    f = f > (double)nbi_numel(&in_shapes[k]) ? f : (double)nbi_numel(&in_shapes[k]);
  return f;
}

/* The strategies of a linear node that keep partial sums (SHARDING.md
 * "Partial sums are lazy"): base (its factors' assignment fac, its layout
 * and targets) with each nonempty set P of the axes no factor uses pending
 * in the result, and in the operands the op's linearity lets stay partial:
 * every operand of an add-like op, one operand (each in turn) of a mul-like
 * one, operand 0 of a div-like or unary one. An operand that arrives without
 * that partial sum cannot meet such a target (as_reshard: AS_INVALID), so
 * these are chosen only where partial values meet, e.g. the transformer's
 * backward adds the q, k and v input gradients as partial sums and reduces
 * once, as Megatron does. Only where each such operand has no other reader:
 * a shared value is reduced before any reader gets it (as_from). */
static nb_status partial_strats(as_graph *g, as_var *x, const nbi_shard_rule *r, const int *fac,
                                const as_strat *base, const as_layout *tgt, const int *uses) {
  int na = g->m->n_axes, free_ax[AS_MAXA], nf = 0;
  if (r->linear == NBI_LINEAR_NONE || r->n_in < 1) return NB_OK;
  for (int a = 0; a < na; a++)
    if (fac[a] < 0 && base->out.d[a] == AS_REPL) free_ax[nf++] = a;
  int n_ops = r->linear == NBI_LINEAR_MULTI ? r->n_in : 1; /* which operand stays partial */
  for (uint32_t set = 1; set < 1u << nf; set++)
    for (int which = 0; which < n_ops; which++) {
      bool single = true; /* every operand kept partial is read by this node only */
      for (int k = 0; k < r->n_in; k++)
        if (r->linear == NBI_LINEAR_SUM || k == which) single = single && uses[x->in_var[k]] == 1;
      if (!single) continue;
      as_strat s = *base;
      as_layout t[NBI_RULE_MAX_TENSORS];
      memcpy(t, tgt, sizeof *t * (size_t)r->n_in);
      for (int q = 0; q < nf; q++) {
        if (!(set >> q & 1)) continue;
        int a = free_ax[q];
        s.out.d[a] = AS_PARTIAL;
        for (int k = 0; k < r->n_in; k++)
          if (r->linear == NBI_LINEAR_SUM || k == which) t[k].d[a] = AS_PARTIAL;
      }
      nb_status st = push_strat(g, x, &s, t);
      if (st) return st;
    }
  return NB_OK;
}

/* The strategies of a node from its factor rule: each mesh axis is given to
 * one eligible factor (pass or reduction, first in every dimension holding
 * it) or to none; a factor's axes (mesh order) must divide its size. */
static nb_status node_strats(as_graph *g, as_var *x, const nbi_shard_rule *r, double flops,
                             const int *uses) {
  const nb_mesh *m = g->m;
  int na = m->n_axes;
  int elig[NBI_RULE_MAX_FACTORS], ne = 0;
  for (int f = 0; f < r->n_factors; f++) {
    if (r->kind[f] != NBI_FACTOR_PASS && r->kind[f] != NBI_FACTOR_REDUCTION) continue;
    bool first = true;
    for (int t = 0; t < r->n_in + r->n_out && first; t++)
      for (int d = 0; d < r->ndim[t]; d++)
        for (int q = 1; q < r->dim[t][d].n; q++)
          if (r->dim[t][d].f[q] == f) first = false;
    if (first) elig[ne++] = f;
  }
  int64_t total = 1;
  for (int a = 0; a < na; a++)
    total *= ne + 1;
  as_layout tgt[NBI_RULE_MAX_TENSORS];
  for (int64_t c = 0; c < total; c++) {
    int fac[AS_MAXA];
    int64_t rr = c;
    for (int a = 0; a < na; a++, rr /= ne + 1) {
      int q = (int)(rr % (ne + 1)) - 1;
      fac[a] = q < 0 ? -1 : elig[q];
    }
    bool ok = true;
    int64_t shards = 1;
    for (int f = 0; f < r->n_factors && ok; f++) {
      int64_t n = 1;
      for (int a = 0; a < na; a++)
        if (fac[a] == f) n *= m->size[a];
      ok = r->size[f] % n == 0;
      shards *= n;
    }
    if (!ok) continue;
    as_strat s = {.out = repl()};
    for (int t = 0; t <= r->n_in; t++) {
      as_layout l = repl();
      for (int d = 0; d < r->ndim[t]; d++) {
        if (r->dim[t][d].n == 0) continue;
        for (int a = 0; a < na; a++)
          if (fac[a] == r->dim[t][d].f[0]) l.d[a] = (int8_t)d;
      }
      if (t < r->n_in)
        tgt[t] = l;
      else
        s.out = l;
    }
    for (int a = 0; a < na; a++)
      if (fac[a] >= 0 && r->kind[fac[a]] == NBI_FACTOR_REDUCTION) s.out.d[a] = AS_PARTIAL;
    s.flops_local = flops / (double)shards;
    s.compute = s.flops_local / g->flops_per_s;
    nb_status st = push_strat(g, x, &s, tgt);
    if (!st) st = partial_strats(g, x, r, fac, &s, tgt, uses);
    if (st) return st;
  }
  return NB_OK;
}

/* ---- edges ---------------------------------------------------------------------------- */
static nb_status link(as_graph *g, int u, int v, int e) {
  int w[2] = {u, v};
  for (int q = 0; q < 2; q++) {
    as_var *x = &g->v[w[q]];
    if (x->n_edges == x->cap_edges) {
      int cap = x->cap_edges ? 2 * x->cap_edges : 4;
      int *ne = realloc(x->edges, sizeof *ne * (size_t)cap);
      if (!ne) return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
      x->edges = ne, x->cap_edges = cap;
    }
    x->edges[x->n_edges++] = e;
  }
  return NB_OK;
}

nb_status as_edge_get(as_graph *g, int u, int v, as_edge **out) {
  as_var *x = &g->v[u];
  for (int q = 0; q < x->n_edges; q++) {
    as_edge *e = &g->e[x->edges[q]];
    if (e->u == u && e->v == v) {
      *out = e;
      return NB_OK;
    }
  }
  if (g->n_e == g->cap_e) {
    int cap = g->cap_e ? 2 * g->cap_e : 64;
    as_edge *ne = realloc(g->e, sizeof *ne * (size_t)cap);
    if (!ne) return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
    g->e = ne, g->cap_e = cap;
  }
  as_edge *e = &g->e[g->n_e];
  *e = (as_edge){.u = u, .v = v};
  e->c = calloc((size_t)g->v[u].n_s * (size_t)g->v[v].n_s, sizeof *e->c);
  if (!e->c) return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  nb_status st = link(g, u, v, g->n_e++);
  *out = e;
  return st;
}

/* Producer p's layout moved to consumer c's operand-k target. */
static nb_status use_edge(as_graph *g, int p, int c, int k) {
  as_var *P = &g->v[p], *C = &g->v[c];
  if (P->plain) return NB_OK; /* cut from a plain value: free */
  as_edge *e;
  nb_status st = as_edge_get(g, p, c, &e);
  if (st) return st;
  for (int a = 0; a < P->n_s; a++)
    for (int b = 0; b < C->n_s; b++)
      e->c[a * C->n_s + b] += as_reshard_time(g, &P->shape, P->elt, as_from(P, P->s[a].out),
                                              C->tgt[(size_t)b * (size_t)C->n_in + (size_t)k]);
  return NB_OK;
}

/* Output value p moved to input w's layout (w < p, or p an input itself). */
static nb_status tie_edge(as_graph *g, int p, int w) {
  if (p == w) return NB_OK;
  int u = p < w ? p : w, v = p < w ? w : p;
  as_edge *e;
  nb_status st = as_edge_get(g, u, v, &e);
  if (st) return st;
  as_var *P = &g->v[p], *W = &g->v[w];
  for (int a = 0; a < P->n_s; a++)
    for (int b = 0; b < W->n_s; b++) {
      double t =
          as_reshard_time(g, &P->shape, P->elt, as_from(P, P->s[a].out), as_unpartial(W->s[b].out));
      e->c[p < w ? a * W->n_s + b : b * P->n_s + a] += t;
    }
  return NB_OK;
}

static int vref(const as_graph *g, int32_t r);

void as_unaries(as_graph *g, double lambda) {
  g->lambda = lambda;
  /* a tie-breaker: of two plans that cost the same, the one holding fewer
   * bytes per device (data arrives sharded rather than replicated and cut) */
  double beta = INFINITY;
  for (int a = 0; a < g->m->n_axes; a++)
    beta = beta < g->beta[a] ? beta : g->beta[a];
  lambda += 1e-3 * beta;
  const nbi_program *p = g->prog;
  for (int i = 0; i < g->n_v; i++) {
    as_var *x = &g->v[i];
    for (int s = 0; s < x->n_s; s++) {
      x->unary[s] = x->s[s].compute + lambda * as_local_bytes(g, x, x->s[s].out);
      if (x->shared) /* its pending sums, reduced once for every reader */
        x->unary[s] +=
            as_reshard_time(g, &x->shape, x->elt, x->s[s].out, as_unpartial(x->s[s].out));
    }
  }
  for (int j = 0; j < p->n_out; j++) { /* an output not tied to an input: summed */
    if ((g->tie && g->tie[j] >= 0) || g->v[vref(g, p->out[j])].shared) continue;
    as_var *x = &g->v[vref(g, p->out[j])];
    for (int s = 0; s < x->n_s; s++)
      x->unary[s] += as_reshard_time(g, &x->shape, x->elt, x->s[s].out, as_unpartial(x->s[s].out));
  }
}

/* ---- building ------------------------------------------------------------------------- */
static int vref(const as_graph *g, int32_t r) { return r >= 0 ? g->prog->n_in + r : -1 - r; }

/* Parses a pinned spec into a whole-axis layout. */
static nb_status pin(as_graph *g, as_var *x, int k, const char *spec) {
  nbi_sharding s;
  nb_status st = nbi_sharding_parse(g->fn, g->m, spec, x->shape.ndim, false, &s);
  if (st) return st;
  as_layout l = repl();
  bool ok = s.n_partial == 0;
  for (int d = 0; d < s.ndim && ok; d++) {
    int last = -1;
    for (int i = 0; i < s.dim[d].n && ok; i++) {
      const nbi_axis *a = &s.dim[d].ax[i];
      ok = a->pre == 1 && a->size == g->m->size[a->axis] && a->axis > last;
      last = a->axis;
      if (ok) l.d[a->axis] = (int8_t)d;
    }
    ok = ok && x->shape.dims[d] % dim_shards(g->m, l, d) == 0;
  }
  if (!ok)
    return nbi_error(NB_ERR_SHARDING,
                     "%s: pinned spec \"%s\" of input %d: only whole mesh axes in mesh order, "
                     "sizes dividing, no partial sums",
                     g->fn, spec, k);
  as_strat one = {.out = l};
  x->n_s = 0;
  x->pinned = true;
  return push_strat(g, x, &one, NULL);
}

nb_status as_build(as_graph *g, nb_fn *f, nb_mesh *m, nb_tensor *const *example_in,
                   const nb_auto_shard_opts *o) {
  g->m = m;
  g->n_fin = f->n_in;
  g->flops_per_s = o->flops_per_s;
  memcpy(g->alpha, o->alpha_s, sizeof g->alpha);
  memcpy(g->beta, o->beta_s_per_byte, sizeof g->beta);
  g->max_bytes = o->max_bytes_per_device;
  g->share = !o->no_layer_sharing;
  g->ilp_max_s = o->ilp_max_seconds;
  nb_status st = nbi_trace_program_like(g->fn, f, example_in, &g->prog, &g->capt, &g->n_capt);
  if (st) return st;
  const nbi_program *p = g->prog;
  if (o->out_like_in) {
    if (!(g->tie_copy = malloc(sizeof *g->tie_copy * (size_t)(p->n_out + 1))))
      return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
    for (int j = 0; j < p->n_out; j++) {
      int w = o->out_like_in[j];
      if (w >= f->n_in || w < -1)
        return nbi_error(NB_ERR_ARG, "%s: out_like_in[%d] = %d (f has %d inputs)", g->fn, j, w,
                         f->n_in);
      if (w >= 0 && (!nbi_shape_eq(&p->out_shape[j], &p->in_shape[w])))
        return nbi_error(NB_ERR_ARG, "%s: out_like_in[%d]: output %d and input %d differ in shape",
                         g->fn, j, j, w);
      g->tie_copy[j] = w;
    }
    g->tie = g->tie_copy;
  }
  g->n_v = p->n_in + p->n_nodes;
  g->n_inputs = p->n_in;
  if (!(g->v = calloc((size_t)g->n_v + 1, sizeof *g->v)) ||
      !(g->choice = calloc((size_t)g->n_v + 1, sizeof *g->choice)))
    return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  for (int i = 0; i < g->n_v; i++)
    g->v[i].last_use = -1;
  for (int k = 0; k < p->n_in && !st; k++) {
    as_var *x = &g->v[k];
    *x = (as_var){.kind = AS_INPUT, .index = k, .shape = p->in_shape[k], .last_use = -1};
    x->elt = nb_dtype_size(p->in_dtype[k]);
    x->plain = k >= f->n_in;
    const char *spec = o->in_specs && k < f->n_in ? o->in_specs[k] : NULL;
    if (x->plain) {
      as_strat one = {.out = repl()};
      st = push_strat(g, x, &one, NULL);
    } else if (spec) {
      st = pin(g, x, k, spec);
    } else {
      st = input_strats(g, x);
    }
  }
  /* readers of each variable (nodes, and outputs) */
  int *uses = st ? NULL : calloc((size_t)g->n_v + 1, sizeof *uses);
  if (!st && !uses) st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  for (int i = 0; i < p->n_nodes && !st; i++)
    for (int k = 0; k < p->nodes[i].n_in; k++)
      uses[vref(g, p->nodes[i].in[k])]++;
  for (int j = 0; j < p->n_out && !st; j++)
    uses[vref(g, p->out[j])]++;
  for (int i = 0; i < p->n_nodes && !st; i++) {
    const nbi_prog_node *pn = &p->nodes[i];
    as_var *x = &g->v[p->n_in + i];
    *x = (as_var){.kind = AS_NODE, .index = i, .shape = pn->shape, .n_in = pn->n_in};
    x->last_use = -1;
    x->elt = nb_dtype_size(pn->dtype);
    if (!(x->in_var = malloc(sizeof *x->in_var * (size_t)(pn->n_in + 1)))) {
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
      break;
    }
    bool plain = true;
    nb_shape sh[NBI_RULE_MAX_TENSORS];
    for (int k = 0; k < pn->n_in; k++) {
      x->in_var[k] = vref(g, pn->in[k]);
      plain = plain && g->v[x->in_var[k]].plain;
      g->v[x->in_var[k]].last_use = i;
      if (k < NBI_RULE_MAX_TENSORS) sh[k] = g->v[x->in_var[k]].shape;
    }
    x->plain = plain;
    const nbi_op_def *def = nbi_op_table[pn->op];
    nbi_shard_rule r;
    bool rule = !plain && !def->apply && !(def->flags & NBI_OPF_MULTI) &&
                pn->op != NBI_OP_TUPLE_GET && pn->n_in + 1 <= NBI_RULE_MAX_TENSORS;
    if (rule) {
      nb_status before = nb_last_status();
      rule = nbi_shard_rule_of(pn->op, &pn->attrs, sh, pn->n_in, &pn->shape, &r) == NB_OK;
      if (!rule && !before) nb_clear_error();
    }
    if (rule) {
      st = node_strats(g, x, &r, node_flops(pn, sh), uses);
    } else {
      as_layout t[64];
      for (int k = 0; k < 64; k++)
        t[k] = repl();
      as_strat one = {.out = repl()};
      one.flops_local = plain ? 0 : (double)nbi_numel(&pn->shape);
      one.compute = one.flops_local / g->flops_per_s;
      x->opaque = !plain;
      if (pn->n_in > 64) {
        x->n_in = 0; /* too many operands to describe: they keep their layouts */
        st = push_strat(g, x, &one, NULL);
      } else {
        st = push_strat(g, x, &one, t);
      }
    }
    if (!st && x->n_s == 0)
      st = nbi_error(NB_ERR_INTERNAL, "%s: node %d (%s) has no strategy", g->fn, i, def->name);
  }
  for (int i = 0; i < g->n_v && uses; i++)
    g->v[i].shared = uses[i] >= 2;
  free(uses);
  for (int j = 0; j < p->n_out; j++)
    g->v[vref(g, p->out[j])].last_use = p->n_nodes;
  for (int i = 0; i < g->n_v && !st; i++)
    if (!(g->v[i].unary = calloc((size_t)g->v[i].n_s + 1, sizeof *g->v[i].unary)))
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  for (int i = p->n_in; i < g->n_v && !st; i++)
    for (int k = 0; k < g->v[i].n_in && !st; k++)
      st = use_edge(g, g->v[i].in_var[k], i, k);
  for (int j = 0; j < p->n_out && !st; j++)
    if (g->tie && g->tie[j] >= 0) st = tie_edge(g, vref(g, p->out[j]), g->tie[j]);
  if (!st) as_unaries(g, 0);
  return st;
}

void as_free(as_graph *g) {
  for (int i = 0; g->v && i < g->n_v; i++) {
    free(g->v[i].s);
    free(g->v[i].tgt);
    free(g->v[i].in_var);
    free(g->v[i].unary);
    free(g->v[i].edges);
  }
  for (int e = 0; e < g->n_e; e++)
    free(g->e[e].c);
  free(g->e);
  free(g->v);
  free(g->choice);
  free(g->tie_copy);
  nbi_release_all(g->capt, g->n_capt);
  nbi_program_release(g->prog);
  *g = (as_graph){0};
}
