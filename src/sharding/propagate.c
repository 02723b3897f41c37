/* src/sharding/propagate.c — per-op sharding propagation (SHARDING.md
 * "Propagation (per op)", aggressive mode; contract in sharding.h).
 *
 * The steps, over the op's tensors (operands 0 .. n_in-1, the result n_in,
 * which is a source only when out_constraint is given):
 *  0. Partial operands (linear): which pending partial axes stay partial
 *     through the op. Kept axes become the result's partial axes and no factor
 *     may use them; the others are dropped from the operands' targets (the
 *     operand is all-reduced, or reduce-scattered, before the op).
 *  1. Project each source's dimension axes onto the dimension's factors,
 *     major to minor: a non-minor factor takes axes while they divide its
 *     remaining size; an axis of which only a part fits is split into
 *     sub-axes (the major part to this factor, the rest on to the next when
 *     the factor is then complete, else the projection stops there); the
 *     minor-most factor takes the rest.
 *  2. Fold each pass/reduction factor's projections into a candidate list.
 *     Sources are ordered by strength: the out_constraint first, then by
 *     priority (lower wins; none is weakest), then the larger tensor
 *     (numel), then the lower index. Position by position, all active
 *     sources whose lists reach it must agree; a shorter list never blocks;
 *     on a mismatch the strongest proposer wins and the disagreeing sources
 *     drop out (they will be resharded). A closed out_constraint dimension
 *     ends its factors' lists where the constraint's end.
 *  3. Give factors their axes, strongest source first (cross-factor
 *     conflicts go to the factor of the larger tensor, case 2 of
 *     SHARDING.md), truncating a candidate at its first axis that: is kept
 *     partial; overlaps an axis already given to another factor of a tensor
 *     holding this one (the result holds the reduction factors, as partial
 *     axes); is explicitly replicated by such a tensor whose priority for
 *     the factor is at least as strong as the proposer's (replication wins
 *     at equal priority); would overflow a dimension's axis list; or, for a
 *     factor that shares a dimension with others (reshape), does not divide
 *     its remaining size (the fitting sub-axis is kept, then it stops). A
 *     factor alone in each of its dimensions may take non-dividing axes
 *     (ceil-sized shards).
 *  4. A dimension holds its factors' axes concatenated, and a factor can
 *     follow only fully sharded ones (else the layout would be strided): a
 *     factor after one that is not fully sharded in any tensor loses its
 *     axes (repeated to a fixed point). Every tensor thus holds exactly the
 *     chosen factor blocks, so the op can run per shard.
 *  5. Targets and result: per dimension the factors' axes (adjacent
 *     sub-axes merged), flags and explicit replication kept from the source
 *     (replicated axes now used are dropped), partial = kept axes (result:
 *     plus the reduction factors' axes).
 * Need-replication and permutation factors never get axes. Operands' closed
 * dimensions do not block in aggressive mode (case 3: a closed [x] operand
 * is extended to (x, y) by a local slice). */
#include "sharding.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct alist {
  int n;
  nbi_axis ax[NBI_MESH_MAX_AXES];
} alist;

enum { MAXT = NBI_RULE_MAX_TENSORS, MAXF = NBI_RULE_MAX_FACTORS, MAXA = NBI_MESH_MAX_AXES };

typedef struct prop {
  const nbi_shard_rule *r;
  int nt;                       /* operands and the result */
  const nbi_sharding *sh[MAXT]; /* sources; the result's is out_constraint */
  int64_t numel[MAXT];
  int8_t dim_of[MAXT][MAXF]; /* the dim of tensor t holding factor f, or -1 */
  alist proj[MAXT][MAXF];
  alist cand[MAXF];
  int cand_prio[MAXF][MAXA]; /* strength rank of each candidate axis's proposer */
  int src[MAXF];             /* the source that proposed cand[f]'s first axis */
  alist chosen[MAXF];
  alist kept[MAXT]; /* per operand: its partial axes that stay partial */
  alist blocked;    /* every kept partial axis */
} prop;

/* ---- (sub-)axes ---------------------------------------------------------------- */

static bool list_overlaps(const alist *l, const nbi_axis *a) {
  for (int i = 0; i < l->n; i++)
    if (nbi_axis_overlap(&l->ax[i], a)) return true;
  return false;
}

static bool push(alist *l, nbi_axis a) {
  if (l->n >= MAXA) return false;
  l->ax[l->n++] = a;
  return true;
}

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b, b = t;
  }
  return a;
}

static int64_t list_prod(const alist *l) {
  int64_t p = 1;
  for (int i = 0; i < l->n; i++)
    p *= l->ax[i].size;
  return p;
}

/* Appends a to an axis list of n entries (cap MAXA), merging it into the last
 * entry when it is that entry's minor continuation on the same axis. */
static void append_merged(nbi_axis *ax, int *n, nbi_axis a) {
  if (*n > 0) {
    nbi_axis *l = &ax[*n - 1];
    if (l->axis == a.axis && l->pre * l->size == a.pre) {
      l->size *= a.size;
      return;
    }
  }
  if (*n < MAXA) ax[(*n)++] = a;
}

/* ---- strength ---------------------------------------------------------------- */

/* Priority rank of source t for factor f: the constraint first, then given
 * priorities, then none. */
static int prio_rank(const prop *p, int t, int f) {
  if (t == p->nt - 1) return -1;
  int d = p->dim_of[t][f];
  int pr = d >= 0 ? p->sh[t]->dim[d].priority : -1;
  return pr < 0 ? INT_MAX : pr;
}

/* Whether source s is stronger than source t for factor f. */
static bool stronger(const prop *p, int f, int s, int t) {
  int ps = prio_rank(p, s, f), pt = prio_rank(p, t, f);
  if (ps != pt) return ps < pt;
  if (p->numel[s] != p->numel[t]) return p->numel[s] > p->numel[t];
  return s < t;
}

/* Whether factor f's candidate comes from a stronger source than g's (by
 * priority, size, index; equal ones keep factor order). */
static bool factor_before(const prop *p, int f, int g) {
  int s = p->src[f], t = p->src[g];
  int ps = prio_rank(p, s, f), pt = prio_rank(p, t, g);
  if (ps != pt) return ps < pt;
  if (p->numel[s] != p->numel[t]) return p->numel[s] > p->numel[t];
  return s < t;
}

/* Whether tensor t holds factor f: in a dimension, or (the result) as a
 * reduction factor's partial axes. */
static bool holds(const prop *p, int t, int f) {
  return p->dim_of[t][f] >= 0 || (t == p->nt - 1 && p->r->kind[f] == NBI_FACTOR_REDUCTION);
}

/* ---- steps ------------------------------------------------------------------- */

/* Step 0: the partial axes the op keeps (linear). */
static void keep_partials(prop *p, const nbi_sharding *const *in) {
  int n_in = p->nt - 1;
  for (int k = 0; k < n_in; k++) {
    if (!in[k]) continue;
    for (int i = 0; i < in[k]->n_partial; i++) {
      const nbi_axis *y = &in[k]->partial[i];
      bool seen = false; /* handled with an earlier operand */
      for (int q = 0; q < k && !seen; q++)
        for (int j = 0; in[q] && j < in[q]->n_partial && !seen; j++)
          seen = nbi_axis_eq(&in[q]->partial[j], y);
      if (seen) continue;
      unsigned holders = 0;
      for (int q = 0; q < n_in; q++)
        for (int j = 0; in[q] && j < in[q]->n_partial; j++)
          if (nbi_axis_eq(&in[q]->partial[j], y)) holders |= 1u << q;
      unsigned keep = 0, all = (1u << n_in) - 1;
      switch (p->r->linear) {
      case NBI_LINEAR_UNARY: keep = n_in == 1 ? holders : 0; break;
      case NBI_LINEAR_SUM: keep = holders == all ? holders : 0; break;
      case NBI_LINEAR_FIRST: keep = holders & 1u; break;
      case NBI_LINEAR_MULTI: { /* one operand keeps it: the largest (the others are reduced) */
        int best = -1;
        for (int q = 0; q < n_in; q++)
          if ((holders >> q & 1u) && (best < 0 || p->numel[q] > p->numel[best])) best = q;
        keep = 1u << best;
        break;
      }
      default: keep = 0;
      }
      if (!keep || list_overlaps(&p->blocked, y)) continue;
      for (int q = 0; q < n_in; q++)
        if (keep >> q & 1u) push(&p->kept[q], *y);
      push(&p->blocked, *y);
    }
  }
}

/* Step 1: source t's dimension axes projected onto its factors. */
static void project(prop *p, int t) {
  const nbi_shard_rule *r = p->r;
  const nbi_sharding *s = p->sh[t];
  for (int d = 0; d < r->ndim[t]; d++) {
    const nbi_rule_dim *rd = &r->dim[t][d];
    if (rd->n == 0) continue;
    int fi = 0;
    int64_t R = r->size[rd->f[0]];
    bool stop = false;
    for (int k = 0; k < s->dim[d].n && !stop; k++) {
      nbi_axis cur = s->dim[d].ax[k];
      for (;;) {
        alist *pl = &p->proj[t][rd->f[fi]];
        if (fi == rd->n - 1) { /* the minor-most factor takes the rest */
          stop = !push(pl, cur);
          break;
        }
        if (R % cur.size == 0) {
          stop = !push(pl, cur);
          if ((R /= cur.size) == 1) R = r->size[rd->f[++fi]];
          break;
        }
        int64_t g = gcd64(cur.size, R);
        stop = true;
        if (g == 1 || !push(pl, (nbi_axis){cur.axis, cur.pre, g}) || g < R) break;
        /* the factor is complete: the axis's minor part goes on */
        cur = (nbi_axis){cur.axis, cur.pre * g, cur.size / g};
        R = r->size[rd->f[++fi]];
        stop = false;
      }
    }
  }
}

/* Step 2: factor f's candidate axes. */
static void fold(prop *p, int f) {
  int order[MAXT], n = 0;
  for (int t = 0; t < p->nt; t++) {
    if (!p->sh[t] || p->dim_of[t][f] < 0) continue;
    int i = n++;
    while (i > 0 && stronger(p, f, t, order[i - 1])) {
      order[i] = order[i - 1];
      i--;
    }
    order[i] = t;
  }
  bool active[MAXT];
  for (int t = 0; t < MAXT; t++)
    active[t] = true;
  int res = p->nt - 1;
  bool closed_end =
      p->sh[res] && p->dim_of[res][f] >= 0 && !p->sh[res]->dim[p->dim_of[res][f]].open;
  p->src[f] = -1;
  for (int pos = 0; pos < MAXA; pos++) {
    int w = -1;
    for (int i = 0; i < n && w < 0; i++) {
      int q = order[i];
      int len = p->proj[q][f].n;
      if (active[q] && (len > pos || (q == res && closed_end && len == pos))) w = q;
    }
    if (w < 0 || p->proj[w][f].n == pos) return;
    nbi_axis a = p->proj[w][f].ax[pos];
    for (int i = 0; i < n; i++) {
      int q = order[i];
      if (active[q] && p->proj[q][f].n > pos && !nbi_axis_eq(&p->proj[q][f].ax[pos], &a))
        active[q] = false;
    }
    if (pos == 0) p->src[f] = w;
    p->cand_prio[f][pos] = prio_rank(p, w, f);
    push(&p->cand[f], a);
  }
}

/* Number of axes tensor t's dimension d (or, d < 0, its partial set) would
 * hold with the factors chosen so far. */
static int axes_in(const prop *p, int t, int d) {
  int c = 0;
  if (d >= 0) {
    const nbi_rule_dim *rd = &p->r->dim[t][d];
    for (int i = 0; i < rd->n; i++)
      c += p->chosen[rd->f[i]].n;
    return c;
  }
  c = p->blocked.n;
  for (int f = 0; f < p->r->n_factors; f++)
    if (p->r->kind[f] == NBI_FACTOR_REDUCTION) c += p->chosen[f].n;
  return c;
}

/* Whether axis a (candidate position pos of factor f) conflicts in tensor t. */
static bool conflicts(const prop *p, int t, int f, int pos, const nbi_axis *a) {
  for (int g = 0; g < p->r->n_factors; g++)
    if (g != f && holds(p, t, g) && list_overlaps(&p->chosen[g], a)) return true;
  int d = p->dim_of[t][f];
  if (axes_in(p, t, d) + 1 > MAXA) return true;
  const nbi_sharding *s = p->sh[t];
  if (!s || d < 0) return false;
  for (int i = 0; i < s->n_repl; i++)
    if (nbi_axis_overlap(&s->repl[i], a) && prio_rank(p, t, f) <= p->cand_prio[f][pos]) return true;
  return false;
}

/* Whether every dimension holding f holds only f (then f may take axes that
 * do not divide its size). */
static bool sole(const prop *p, int f) {
  for (int t = 0; t < p->nt; t++) {
    int d = p->dim_of[t][f];
    if (d >= 0 && p->r->dim[t][d].n != 1) return false;
  }
  return true;
}

/* Step 3: factor f's axes from its candidate. */
static void choose(prop *p, int f) {
  alist *c = &p->cand[f], *out = &p->chosen[f];
  bool alone = sole(p, f);
  int64_t R = p->r->size[f];
  for (int pos = 0; pos < c->n; pos++) {
    nbi_axis a = c->ax[pos];
    if (list_overlaps(&p->blocked, &a) || list_overlaps(out, &a)) return;
    for (int t = 0; t < p->nt; t++)
      if (holds(p, t, f) && conflicts(p, t, f, pos, &a)) return;
    if (!alone && R % a.size != 0) {
      int64_t g = gcd64(a.size, R);
      if (g > 1) push(out, (nbi_axis){a.axis, a.pre, g});
      return;
    }
    if (!alone) R /= a.size;
    push(out, a);
  }
}

/* Step 4: a factor follows only fully sharded factors in every dimension. */
static void make_consistent(prop *p) {
  const nbi_shard_rule *r = p->r;
  bool changed = true;
  while (changed) {
    changed = false;
    for (int t = 0; t < p->nt; t++)
      for (int d = 0; d < r->ndim[t]; d++) {
        const nbi_rule_dim *rd = &r->dim[t][d];
        bool full = true;
        for (int i = 0; i < rd->n; i++) {
          alist *l = &p->chosen[rd->f[i]];
          if (!full && l->n) l->n = 0, changed = true;
          full = full && list_prod(l) == r->size[rd->f[i]];
        }
      }
  }
}

/* Sorts a partial set by (axis, pre) and merges adjacent sub-axes. */
static void normalize_set(nbi_axis *ax, int *n) {
  for (int i = 1; i < *n; i++)
    for (int j = i; j > 0; j--) {
      nbi_axis *a = &ax[j - 1], *b = &ax[j];
      if (a->axis < b->axis || (a->axis == b->axis && a->pre <= b->pre)) break;
      nbi_axis t = *a;
      *a = *b, *b = t;
    }
  int m = 0;
  nbi_axis tmp[MAXA];
  for (int i = 0; i < *n; i++)
    append_merged(tmp, &m, ax[i]);
  memcpy(ax, tmp, sizeof(nbi_axis) * (size_t)m);
  *n = m;
}

/* Step 5: tensor t's sharding from the chosen factors. */
static void build(const prop *p, int t, nbi_sharding *o) {
  const nbi_shard_rule *r = p->r;
  const nbi_sharding *s = p->sh[t];
  nbi_sharding res;
  memset(&res, 0, sizeof res);
  res.ndim = r->ndim[t];
  for (int d = 0; d < res.ndim; d++) {
    nbi_dim_sharding *ds = &res.dim[d];
    ds->open = s ? s->dim[d].open : false;
    ds->priority = s ? s->dim[d].priority : -1;
    const nbi_rule_dim *rd = &r->dim[t][d];
    for (int i = 0; i < rd->n; i++) {
      const alist *l = &p->chosen[rd->f[i]];
      for (int j = 0; j < l->n; j++)
        append_merged(ds->ax, &ds->n, l->ax[j]);
    }
  }
  bool result = t == p->nt - 1;
  const alist *kept = result ? &p->blocked : &p->kept[t];
  for (int i = 0; i < kept->n; i++)
    res.partial[res.n_partial++] = kept->ax[i];
  for (int f = 0; result && f < r->n_factors; f++)
    if (r->kind[f] == NBI_FACTOR_REDUCTION)
      for (int j = 0; j < p->chosen[f].n && res.n_partial < MAXA; j++)
        res.partial[res.n_partial++] = p->chosen[f].ax[j];
  normalize_set(res.partial, &res.n_partial);
  for (int i = 0; s && i < s->n_repl; i++) {
    const nbi_axis *a = &s->repl[i];
    bool used = false;
    for (int d = 0; d < res.ndim && !used; d++)
      for (int j = 0; j < res.dim[d].n && !used; j++)
        used = nbi_axis_overlap(&res.dim[d].ax[j], a);
    for (int j = 0; j < res.n_partial && !used; j++)
      used = nbi_axis_overlap(&res.partial[j], a);
    if (!used) res.repl[res.n_repl++] = *a;
  }
  *o = res;
}

nb_status nbi_propagate(const char *fn, const nb_mesh *m, const nbi_shard_rule *r,
                        const nbi_sharding *const *in, const nb_shape *in_shapes,
                        const nbi_sharding *out_constraint, nbi_sharding *in_target,
                        nbi_sharding *out) {
  if (!fn) fn = "nbi_propagate";
  if (!m || !r || !out || (r->n_in > 0 && (!in || !in_shapes || !in_target)))
    return nbi_error(NB_ERR_INTERNAL, "%s: NULL argument to nbi_propagate", fn);
  if (r->n_out != 1 || r->n_in < 0 || r->n_in + 1 > MAXT || r->n_factors < 0 || r->n_factors > MAXF)
    return nbi_error(NB_ERR_INTERNAL, "%s: a rule with %d operands, %d results, %d factors", fn,
                     r->n_in, r->n_out, r->n_factors);
  prop *p = calloc(1, sizeof *p);
  if (!p) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  p->r = r;
  p->nt = r->n_in + 1;
  memset(p->dim_of, -1, sizeof p->dim_of);
  nb_status st = NB_OK;
  for (int t = 0; t < p->nt && !st; t++) {
    bool res = t == r->n_in;
    p->sh[t] = res ? out_constraint : in[t];
    if (r->ndim[t] < 0 || r->ndim[t] > NB_MAX_DIMS || (!res && in_shapes[t].ndim != r->ndim[t])) {
      st = nbi_error(NB_ERR_INTERNAL, "%s: tensor %d's rank does not match the op's rule", fn, t);
      break;
    }
    if (p->sh[t] && p->sh[t]->ndim != r->ndim[t])
      st = nbi_error(NB_ERR_INTERNAL, "%s: a sharding of rank %d for tensor %d of rank %d", fn,
                     p->sh[t]->ndim, t, r->ndim[t]);
    else if (p->sh[t])
      st = nbi_sharding_check(fn, m, p->sh[t]);
    p->numel[t] = 1;
    for (int d = 0; d < r->ndim[t] && !st; d++) {
      const nbi_rule_dim *rd = &r->dim[t][d];
      if (rd->n < 0 || rd->n > NBI_RULE_MAX_COMPOUND) {
        st = nbi_error(NB_ERR_INTERNAL, "%s: a malformed rule", fn);
        break;
      }
      for (int i = 0; i < rd->n; i++) {
        int f = rd->f[i];
        if (f < 0 || f >= r->n_factors || p->dim_of[t][f] >= 0) {
          st = nbi_error(NB_ERR_INTERNAL, "%s: a malformed rule", fn);
          break;
        }
        p->dim_of[t][f] = (int8_t)d;
        if (res) p->numel[t] *= r->size[f];
      }
      if (!res) p->numel[t] *= in_shapes[t].dims[d];
    }
  }
  if (!st) {
    keep_partials(p, in);
    for (int t = 0; t < p->nt; t++)
      if (p->sh[t]) project(p, t);
    int order[MAXF], n = 0;
    for (int f = 0; f < r->n_factors; f++) {
      if (r->kind[f] != NBI_FACTOR_PASS && r->kind[f] != NBI_FACTOR_REDUCTION) continue;
      fold(p, f);
      if (p->cand[f].n == 0) continue;
      int i = n++; /* strongest source first */
      while (i > 0 && factor_before(p, f, order[i - 1])) {
        order[i] = order[i - 1];
        i--;
      }
      order[i] = f;
    }
    for (int i = 0; i < n; i++)
      choose(p, order[i]);
    make_consistent(p);
    for (int k = 0; k < r->n_in; k++)
      build(p, k, &in_target[k]);
    build(p, r->n_in, out);
  }
  free(p);
  return st;
}
