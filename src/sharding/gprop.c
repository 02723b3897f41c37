/* src/sharding/gprop.c — graph-mode propagation: nbi_program_apply on sharded
 * inputs (the apply_program hook; contract in sharding.h, "graph mode and
 * constraints").
 *
 * 1. Every value of the program (inputs, then nodes) gets a sharding and a
 *    kind:
 *    - inputs keep theirs (closed; a plain input is replicated);
 *    - SHARD_CONSTRAINT results are closed at their payload's sharding,
 *      SHARD_LIKE results at x's current dimension axes (no partial sums);
 *    - SHARD_MAP packs carry none; their TUPLE_GETs are closed at the
 *      payload's out specs, and their operands are seeded (backward) with
 *      the in specs; other multi-output packs carry none and their gets are
 *      closed replicated (the record hook runs them replicated);
 *    - every other value starts open and empty.
 * 2. A fixed point: rounds of a forward then a backward sweep over the nodes,
 *    each step one per-op propagation (nbi_shard_rule_of + nbi_propagate,
 *    the result's current sharding as a source, its dimensions open) whose
 *    operand targets and result update the open values; a constraint or an
 *    in spec updates its operand through the identity rule (so its axes are
 *    projected and merged as an op would). An update is taken only when it
 *    gains (every dimension's axes extend the old ones, partial axes only
 *    added), so values only grow: the rounds end (and are capped).
 * 3. Application, node by node (nbi_apply_node): a node with an apply rule
 *    (shard_map, the constraints) or a multi-output pack goes through as it
 *    is; any other is recorded per device with its chosen sharding (closed)
 *    as the result's constraint (nbi_shard_record_out, read by shard.c's
 *    record hook). A closed value whose result still differs is resharded.
 * Values are always those of the unsharded program: only layouts change. */
#include "sharding.h"
#include "../core/oprules.h"
#include "../core/program.h"

#include <stdlib.h>

enum { V_NONE, V_OPEN, V_CLOSED };
enum { MAX_ROUNDS = 64 };

typedef struct gp {
  const char *fn;
  const nbi_program *p;
  nb_mesh *m;
  int n_v;           /* inputs then nodes */
  nbi_sharding *s;   /* [n_v] */
  uint8_t *kind;     /* [n_v] V_* */
  bool *multi;       /* [n_v]: read by several nodes or outputs: never left partial */
  nb_shape *shape;   /* [n_v] */
  nbi_shard_rule *r; /* [n_nodes] */
  uint8_t *has_rule; /* [n_nodes]: 0 unknown, 1 yes, 2 none */
  bool changed;
  bool eager; /* values on several meshes (a shard_map on its own mesh): per-op
                 propagation, node by node, as eager ops do */
} gp;

static int vref(const gp *g, int32_t r) { return r >= 0 ? g->p->n_in + r : -1 - r; }

static nbi_sharding open_empty(int ndim) {
  nbi_sharding s = nbi_sharding_replicated(ndim);
  for (int d = 0; d < ndim; d++)
    s.dim[d].open = true, s.dim[d].priority = -1;
  return s;
}

static bool axes_extend(const nbi_dim_sharding *o, const nbi_dim_sharding *n) {
  if (n->n < o->n) return false;
  for (int i = 0; i < o->n; i++)
    if (!nbi_axis_eq(&o->ax[i], &n->ax[i])) return false;
  return true;
}

static bool in_set(const nbi_axis *set, int n, const nbi_axis *a) {
  for (int i = 0; i < n; i++)
    if (nbi_axis_eq(&set[i], a)) return true;
  return false;
}

/* Value v takes what `want` adds to it, when it only adds. */
static void gain(gp *g, int v, const nbi_sharding *want) {
  if (v < 0 || g->kind[v] != V_OPEN || want->ndim != g->s[v].ndim) return;
  nbi_sharding *o = &g->s[v], c = *o;
  bool more = false;
  int n_partial = g->multi[v] ? 0 : want->n_partial;
  for (int d = 0; d < o->ndim; d++) {
    if (!axes_extend(&o->dim[d], &want->dim[d])) return;
    if (want->dim[d].n > o->dim[d].n) {
      more = true;
      c.dim[d].n = want->dim[d].n;
      memcpy(c.dim[d].ax, want->dim[d].ax, sizeof c.dim[d].ax);
    }
  }
  for (int i = 0; i < n_partial && c.n_partial < NBI_MESH_MAX_AXES; i++)
    if (!in_set(c.partial, c.n_partial, &want->partial[i])) {
      c.partial[c.n_partial++] = want->partial[i];
      more = true;
    }
  if (!more) return;
  nb_status before = nb_last_status();
  if (nbi_sharding_check(g->fn, g->m, &c) != NB_OK) {
    if (!before) nb_clear_error(); /* not a layout: the update is not taken */
    return;
  }
  *o = c;
  g->changed = true;
}

/* Node i's factor rule, or NULL when it has none (the hook then replicates). */
static const nbi_shard_rule *rule(gp *g, int i) {
  if (!g->has_rule[i]) {
    const nbi_prog_node *pn = &g->p->nodes[i];
    nb_shape sh[NBI_RULE_MAX_TENSORS];
    bool ok = pn->n_in + 1 <= NBI_RULE_MAX_TENSORS;
    for (int k = 0; k < pn->n_in && ok; k++)
      sh[k] = g->shape[vref(g, pn->in[k])];
    nb_status before = nb_last_status();
    ok = ok && nbi_shard_rule_of(pn->op, &pn->attrs, sh, pn->n_in, &pn->shape, &g->r[i]) == NB_OK;
    if (!ok && !before) nb_clear_error();
    g->has_rule[i] = ok ? 1 : 2;
  }
  return g->has_rule[i] == 1 ? &g->r[i] : NULL;
}

/* Value v takes `want`'s layout through the identity rule (a constraint or
 * an in spec seeding its operand). */
static nb_status seed(gp *g, int v, const nbi_sharding *want) {
  if (g->kind[v] != V_OPEN) return NB_OK;
  nbi_shard_rule r;
  nb_status st = nbi_shard_rule_of(NBI_OP_IDENTITY, NULL, &g->shape[v], 1, &g->shape[v], &r);
  nbi_sharding tgt, out;
  const nbi_sharding *in = &g->s[v];
  if (!st) st = nbi_propagate(g->fn, g->m, &r, &in, &g->shape[v], want, &tgt, &out);
  if (!st) gain(g, v, &tgt);
  return st;
}

/* One propagation step at node i. */
static nb_status step(gp *g, int i) {
  const nbi_prog_node *pn = &g->p->nodes[i];
  int v = g->p->n_in + i;
  switch (pn->op) {
  case NBI_OP_SHARD_CONSTRAINT: return seed(g, vref(g, pn->in[0]), &g->s[v]);
  case NBI_OP_SHARD_LIKE: {
    int x = vref(g, pn->in[1]);
    if (g->kind[x] == V_NONE) return NB_OK;
    nbi_sharding like = g->s[x];
    like.n_partial = 0;
    for (int d = 0; d < like.ndim; d++)
      like.dim[d].open = false, like.dim[d].priority = -1;
    if (!nbi_sharding_eq(&like, &g->s[v])) g->changed = true;
    g->s[v] = like;
    return seed(g, vref(g, pn->in[0]), &g->s[v]);
  }
  case NBI_OP_SHARD_MAP: {
    const nbi_smap_payload *sp = (const nbi_smap_payload *)pn->payload;
    nb_status st = NB_OK;
    for (int k = 0; k < pn->n_in && k < sp->prog->n_in && !st; k++)
      st = seed(g, vref(g, pn->in[k]), &sp->in_s[k]);
    return st;
  }
  default: break;
  }
  if (g->kind[v] == V_NONE || nbi_op_table[pn->op]->apply) return NB_OK;
  const nbi_shard_rule *r = rule(g, i);
  if (!r) return NB_OK;
  const nbi_sharding *in[NBI_RULE_MAX_TENSORS];
  nb_shape sh[NBI_RULE_MAX_TENSORS];
  nbi_sharding tgt[NBI_RULE_MAX_TENSORS], out;
  for (int k = 0; k < pn->n_in; k++) {
    int u = vref(g, pn->in[k]);
    if (g->kind[u] == V_NONE) return NB_OK;
    in[k] = &g->s[u];
    sh[k] = g->shape[u];
  }
  nb_status st = nbi_propagate(g->fn, g->m, r, in, sh, &g->s[v], tgt, &out);
  if (st) return st;
  gain(g, v, &out);
  for (int k = 0; k < pn->n_in; k++)
    gain(g, vref(g, pn->in[k]), &tgt[k]);
  return NB_OK;
}

static nb_status init(gp *g, nb_tensor *const *in) {
  const nbi_program *p = g->p;
  int *uses = calloc((size_t)g->n_v + 1, sizeof *uses);
  if (!uses) return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  for (int i = 0; i < p->n_nodes; i++)
    for (int k = 0; k < p->nodes[i].n_in; k++) {
      bool again = false; /* a node reading a value twice is one reader */
      for (int q = 0; q < k && !again; q++)
        again = p->nodes[i].in[q] == p->nodes[i].in[k];
      if (!again) uses[vref(g, p->nodes[i].in[k])]++;
    }
  for (int j = 0; j < p->n_out; j++)
    uses[vref(g, p->out[j])]++;
  for (int v = 0; v < g->n_v; v++)
    g->multi[v] = uses[v] > 1;
  free(uses);
  for (int k = 0; k < p->n_in; k++) {
    g->shape[k] = p->in_shape[k];
    if (in[k]->mesh && in[k]->mesh != g->m) g->eager = true;
    g->s[k] = in[k]->mesh ? *nbi_sharding_of(in[k]) : nbi_sharding_replicated(p->in_shape[k].ndim);
    g->kind[k] = V_CLOSED;
  }
  for (int i = 0; i < p->n_nodes; i++) {
    const nbi_prog_node *pn = &p->nodes[i];
    int v = p->n_in + i;
    g->shape[v] = pn->shape;
    g->s[v] = open_empty(pn->shape.ndim);
    g->kind[v] = V_OPEN;
    if (nbi_op_table[pn->op]->flags & NBI_OPF_MULTI) {
      g->kind[v] = V_NONE;
      if (pn->op == NBI_OP_SHARD_MAP) {
        const nbi_smap_payload *sp = (const nbi_smap_payload *)pn->payload;
        if (sp->mesh != g->m) g->eager = true;
      }
    } else if (pn->op == NBI_OP_TUPLE_GET) {
      g->kind[v] = V_CLOSED;
      g->s[v] = nbi_sharding_replicated(pn->shape.ndim);
      if (pn->in[0] >= 0 && p->nodes[pn->in[0]].op == NBI_OP_SHARD_MAP) {
        const nbi_smap_payload *sp = (const nbi_smap_payload *)p->nodes[pn->in[0]].payload;
        g->s[v] = sp->out_s[pn->attrs.i[0]];
      }
    } else if (pn->op == NBI_OP_SHARD_CONSTRAINT) {
      nb_mesh *cm;
      const nbi_sharding *cs = nbi_shard_constraint_of(pn, &cm);
      if (cm != g->m)
        return nbi_error(NB_ERR_SHARDING,
                         "nb_shard: a sharding constraint on mesh %s applied to values on %s",
                         nb_mesh_str(cm), nb_mesh_str(g->m));
      g->kind[v] = V_CLOSED;
      g->s[v] = *cs;
    } else if (pn->op == NBI_OP_SHARD_LIKE) {
      g->kind[v] = V_CLOSED;
    }
  }
  return NB_OK;
}

static nb_status fixed_point(gp *g) {
  g->changed = true;
  for (int round = 0; round < MAX_ROUNDS && g->changed; round++) {
    g->changed = false;
    for (int i = 0; i < g->p->n_nodes; i++) {
      nb_status st = step(g, i);
      if (st) return st;
    }
    for (int i = g->p->n_nodes - 1; i >= 0; i--) {
      nb_status st = step(g, i);
      if (st) return st;
    }
  }
  return NB_OK;
}

/* Records node i with its chosen sharding; a closed value is then resharded
 * to it where the result differs. */
static nb_status apply_node(gp *g, nbi_apply *a, int i) {
  const nbi_prog_node *pn = &g->p->nodes[i];
  int v = g->p->n_in + i;
  const nbi_op_def *def = nbi_op_table[pn->op];
  nbi_sharding want = g->s[v];
  for (int d = 0; d < want.ndim; d++)
    want.dim[d].open = false, want.dim[d].priority = -1;
  bool hint = g->kind[v] != V_NONE && !def->apply && !(def->flags & NBI_OPF_MULTI);
  nbi_shard_record_out = hint ? &want : NULL;
  nb_status st = nbi_apply_node(a, i);
  nbi_shard_record_out = NULL;
  nb_tensor *t = a->t[i];
  if (!st && g->kind[v] == V_OPEN && g->multi[v] && t->mesh && nbi_sharding_of(t)->n_partial) {
    /* a partial sum several ops read is summed once, here */
    nbi_sharding full = *nbi_sharding_of(t);
    full.n_partial = 0;
    if (!(a->t[i] = nbi_shard_to(g->fn, t, g->m, &full))) return nb_last_status();
  }
  if (st || g->kind[v] != V_CLOSED) return st;
  if (t->mesh == g->m && nbi_sharding_eq(nbi_sharding_of(t), &want)) return NB_OK;
  nb_tensor *r = nbi_shard_to(g->fn, t, g->m, &want);
  if (!r) return nb_last_status();
  a->t[i] = r;
  return NB_OK;
}

/* Node i: per-op propagation in eager mode, else with its chosen sharding. */
static nb_status gp_node(void *ctx, nbi_apply *a, int i) {
  gp *g = ctx;
  return g->eager ? nbi_apply_node(a, i) : apply_node(g, a, i);
}

nb_status nbi_sharded_apply_program(const char *fn, const nbi_program *p, nb_tensor *const *in,
                                    nb_tensor **out) {
  for (int j = 0; j < p->n_out; j++)
    out[j] = NULL;
  gp g = {.fn = fn, .p = p, .n_v = p->n_in + p->n_nodes};
  for (int k = 0; k < p->n_in && !g.m; k++)
    if (in[k]) g.m = in[k]->mesh;
  nbi_apply a;
  nb_status st = nbi_apply_begin(&a, fn, p, in);
  if (st) return st;
  size_t nv = (size_t)g.n_v + 1, nn = (size_t)p->n_nodes + 1;
  g.s = malloc(sizeof *g.s * nv);
  g.kind = malloc(nv);
  g.multi = malloc(sizeof *g.multi * nv);
  g.shape = malloc(sizeof *g.shape * nv);
  g.r = malloc(sizeof *g.r * nn);
  g.has_rule = calloc(nn, 1);
  if (!g.s || !g.kind || !g.multi || !g.shape || !g.r || !g.has_rule)
    st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  if (!st) st = init(&g, in);
  if (!st && !g.eager) st = fixed_point(&g);
  if (!st)
    st = nbi_apply_all(&a, gp_node, &g, out);
  else
    nbi_apply_end(&a);
  free(g.s);
  free(g.kind);
  free(g.multi);
  free(g.shape);
  free(g.r);
  free(g.has_rule);
  return st;
}
