/* src/sharding/smap.c — shard_map bodies: the mesh stack collectives check,
 * and the per-device interpreter (contract: sharding.h, "shard_map bodies").
 *
 * nbi_smap_exec walks the body's program once, keeping one tensor per device
 * per node. An ordinary node is recorded per device on that device's inputs
 * (the body was traced on local shapes, which every device shares); devices
 * whose inputs are the same objects share one node, so a replicated
 * computation stays one graph. Multi-output packs and their TUPLE_GETs are
 * ordinary nodes too. A collective node runs as the nbi_coll_* collective
 * over its group (counted in nb_stats); axis_index gives per-device int32
 * constants (coll_ops.c, nbi_coll_run).
 *
 * Before anything runs, two checks:
 *  - variance: per value, the set of mesh axes it may vary over (a bitmask;
 *    a sub-axis counts as its whole axis). Inputs vary over the axes of their
 *    sharding's dimensions and partial sums; an ordinary node over the union
 *    of its inputs'; all_reduce and all_gather over A drop A; reduce_scatter,
 *    all_to_all and ppermute add A; axis_index varies over A. An output may
 *    vary only over axes its out sharding names (a dimension's or partial).
 *  - collectives only at the body's top level: the programs nested in
 *    checkpoint, control flow and shard_map nodes (recursively) hold none
 *    (their nested realizations run single-device programs). */
#include <stdlib.h>

#include "sharding.h"
#include "../core/oprules.h"
#include "../core/program.h"

/* ---- the mesh stack ------------------------------------------------------------ */
#define SMAP_DEPTH 32
static _Thread_local nb_mesh *smap_stack[SMAP_DEPTH];
static _Thread_local int smap_depth; /* entries in use */

nb_status nbi_smap_push(const char *fn, nb_mesh *m) {
  if (smap_depth == SMAP_DEPTH)
    return nbi_error(NB_ERR_SHARDING, "%s: bodies nested more than %d deep", fn, SMAP_DEPTH);
  smap_stack[smap_depth++] = m;
  return NB_OK;
}

void nbi_smap_pop(void) {
  if (smap_depth > 0) smap_depth--;
}

nb_mesh *nbi_smap_mesh(void) { return smap_depth > 0 ? smap_stack[smap_depth - 1] : NULL; }

/* ---- checks ------------------------------------------------------------------------ */
static bool is_collective(int op) {
  return op == NBI_OP_ALL_REDUCE || op == NBI_OP_ALL_GATHER || op == NBI_OP_REDUCE_SCATTER ||
         op == NBI_OP_ALL_TO_ALL || op == NBI_OP_PPERMUTE || op == NBI_OP_AXIS_INDEX;
}

/* The programs a node's payload nests (at most 2). */
static int nested_programs(int op, const nbi_payload *p, const nbi_program **out) {
  return p && nbi_op_table[op]->programs ? nbi_op_table[op]->programs(p, out) : 0;
}

static const char *op_kind(int op) {
  switch (op) {
  case NBI_OP_REMAT: return "a checkpoint";
  case NBI_OP_COND: return "an nb_cond branch";
  case NBI_OP_WHILE: return "an nb_while_loop";
  case NBI_OP_SCAN: return "an nb_scan";
  default: return "a nested nb_shard_map";
  }
}

/* No collective node in the programs nested in p's nodes (recursively);
 * depth 0 is the body itself (collectives allowed), top_op the outermost
 * nesting node's op (named in the message). */
static nb_status check_nested(const char *fn, const nbi_program *p, int top_op, int depth) {
  if (depth > 64)
    return nbi_error(NB_ERR_SHARDING, "%s: programs nested more than 64 deep in the body", fn);
  for (int i = 0; i < p->n_nodes; i++) {
    const nbi_prog_node *pn = &p->nodes[i];
    if (depth > 0 && is_collective(pn->op))
      return nbi_error(NB_ERR_SHARDING,
                       "%s: nb_%s inside %s in the shard_map body: collectives must be at the "
                       "body's top level (not inside checkpoint, control flow or a nested "
                       "shard_map)",
                       fn, nbi_op_table[pn->op]->name, op_kind(top_op));
    const nbi_program *sub[2] = {NULL, NULL};
    int ns = nested_programs(pn->op, pn->payload, sub);
    for (int k = 0; k < ns; k++) {
      if (!sub[k]) continue;
      nb_status st = check_nested(fn, sub[k], depth > 0 ? top_op : pn->op, depth + 1);
      if (st) return st;
    }
  }
  return NB_OK;
}

static uint32_t ref_var(const uint32_t *var_in, const uint32_t *var, int32_t r) {
  return r >= 0 ? var[r] : var_in[-1 - r];
}

/* var[i] for every node; var_in[k] for the inputs. */
static nb_status variance(const char *fn, const nb_mesh *m, const nbi_program *p,
                          const uint32_t *var_in, uint32_t *var) {
  for (int i = 0; i < p->n_nodes; i++) {
    const nbi_prog_node *pn = &p->nodes[i];
    uint32_t v = 0, a = 0;
    for (int k = 0; k < pn->n_in; k++)
      v |= ref_var(var_in, var, pn->in[k]);
    if (is_collective(pn->op)) {
      int ax[NBI_MESH_MAX_AXES] = {0}, n = nbi_coll_group(&pn->attrs, ax);
      for (int k = 0; k < n; k++) {
        if (ax[k] < 0 || ax[k] >= m->n_axes)
          return nbi_error(NB_ERR_SHARDING,
                           "%s: the body's nb_%s was traced on another mesh than %s", fn,
                           nbi_op_table[pn->op]->name, m->text);
        a |= 1u << ax[k];
      }
      if (pn->op == NBI_OP_ALL_REDUCE || pn->op == NBI_OP_ALL_GATHER)
        v &= ~a;
      else
        v |= a; /* reduce_scatter, all_to_all, ppermute add A; axis_index is A */
    }
    var[i] = v;
  }
  return NB_OK;
}

/* ---- the interpreter ---------------------------------------------------------------- */

typedef struct run {
  const char *fn;
  const nb_mesh *m;
  const nbi_program *p;
  int nd;
  nb_tensor **in; /* [n_in * nd] each input's device values */
  nb_tensor **t;  /* [n_nodes * nd] each node's */
} run;

static nb_tensor *ref(const run *r, int32_t x, int d) {
  return x >= 0 ? r->t[(size_t)x * (size_t)r->nd + (size_t)d]
                : r->in[(size_t)(-1 - x) * (size_t)r->nd + (size_t)d];
}

/* Node i once per device (shared by devices whose inputs are the same). */
static nb_status run_node(run *r, int i) {
  const nbi_prog_node *pn = &r->p->nodes[i];
  nb_tensor **out = r->t + (size_t)i * (size_t)r->nd;
  int nd = r->nd;
  if (is_collective(pn->op)) {
    nb_tensor **phys = NULL;
    if (pn->n_in > 0) {
      if (!(phys = malloc(sizeof *phys * (size_t)nd)))
        return nbi_error(NB_ERR_OOM, "%s: out of memory", r->fn);
      for (int d = 0; d < nd; d++)
        phys[d] = ref(r, pn->in[0], d);
    }
    nb_status st = nbi_coll_run(r->fn, r->m, pn->op, &pn->attrs, pn->payload, phys, out);
    free(phys);
    return st;
  }
  nb_tensor *local[8], **ins = pn->n_in <= 8 ? local : malloc(sizeof *ins * (size_t)pn->n_in);
  if (!ins) return nbi_error(NB_ERR_OOM, "%s: out of memory", r->fn);
  nb_status st = NB_OK;
  for (int d = 0; d < nd && !st; d++) {
    out[d] = NULL;
    if (!nbi_mesh_local(r->m, d)) { /* another process runs it */
      if (!(out[d] = nbi_remote_block(r->m, d, &pn->shape, pn->dtype))) st = nb_last_status();
      continue;
    }
    for (int e = 0; e < d && !out[d]; e++) {
      bool same = nbi_mesh_local(r->m, e);
      for (int k = 0; k < pn->n_in && same; k++)
        same = ref(r, pn->in[k], e) == ref(r, pn->in[k], d);
      if (same) out[d] = out[e];
    }
    if (out[d]) continue;
    for (int k = 0; k < pn->n_in; k++)
      ins[k] = ref(r, pn->in[k], d);
    if (!(out[d] = nbi_record(pn->op, pn->dtype, &pn->shape, ins, pn->n_in, &pn->attrs)))
      st = nb_last_status();
    else
      nbi_set_payload(out[d], pn->payload);
  }
  if (ins != local) free(ins);
  /* a node without inputs was made on the default device: each device's on its own */
  if (!st && pn->n_in == 0) st = nbi_place_all(r->m, out);
  return st;
}

/* Checks the inputs and fills each one's device values and variance. A value
 * that is not on the mesh (a capture, a plain input) is every device's, placed
 * on each device. */
static nb_status bind_inputs(run *r, nb_tensor *const *in, uint32_t *var_in) {
  const nbi_program *p = r->p;
  for (int k = 0; k < p->n_in; k++) {
    nb_tensor *x = in[k];
    char a[160], b[160];
    if (!x) return nbi_error(NB_ERR_NULL, "%s: input %d is NULL", r->fn, k);
    if (x->mesh && x->mesh != r->m)
      return nbi_error(NB_ERR_SHARDING, "%s: input %d is on mesh %s, not %s", r->fn, k,
                       nb_mesh_str(x->mesh), r->m->text);
    if (x->dtype != p->in_dtype[k])
      return nbi_error(NB_ERR_DTYPE, "%s: input %d is %s but the body takes %s", r->fn, k,
                       nb_dtype_name(x->dtype), nb_dtype_name(p->in_dtype[k]));
    var_in[k] = x->mesh ? nbi_sharding_axes(nbi_sharding_of(x), true) : 0;
    for (int d = 0; d < r->nd; d++) {
      nb_tensor *v = x->mesh ? x->phys[d] : x;
      if (!nbi_shape_eq(&v->shape, &p->in_shape[k]))
        return nbi_error(NB_ERR_SHAPE,
                         "%s: input %d's block on device %d has shape %s but the body was traced "
                         "on %s",
                         r->fn, k, d, nb_shape_str(v->shape, a, sizeof a),
                         nb_shape_str(p->in_shape[k], b, sizeof b));
      r->in[(size_t)k * (size_t)r->nd + (size_t)d] = v;
    }
    if (!x->mesh) {
      nb_status st = nbi_place_all(r->m, r->in + (size_t)k * (size_t)r->nd);
      if (st) return st;
    }
  }
  return NB_OK;
}

nb_status nbi_smap_exec(const char *fn, nb_mesh *m, const nbi_program *prog, nb_tensor *const *in,
                        const nbi_sharding *out_s, nb_tensor **out) {
  if (!m || !prog || (prog->n_in > 0 && !in) || (prog->n_out > 0 && (!out_s || !out)))
    return nbi_error(NB_ERR_NULL, "%s: NULL argument to the shard_map interpreter", fn);
  for (int j = 0; j < prog->n_out; j++)
    out[j] = NULL;
  int nd = m->n_dev, N = prog->n_nodes;
  run r = {.fn = fn, .m = m, .p = prog, .nd = nd};
  uint32_t *var_in = malloc(sizeof *var_in * (size_t)(prog->n_in + 1));
  uint32_t *var = malloc(sizeof *var * (size_t)(N + 1));
  r.in = calloc((size_t)prog->n_in * (size_t)nd + 1, sizeof *r.in);
  r.t = calloc((size_t)N * (size_t)nd + 1, sizeof *r.t);
  nb_status st =
      var_in && var && r.in && r.t ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  if (!st) st = bind_inputs(&r, in, var_in);
  if (!st) st = variance(fn, m, prog, var_in, var);
  if (!st) st = check_nested(fn, prog, 0, 0);
  for (int j = 0; j < prog->n_out && !st; j++) {
    const nbi_sharding *s = &out_s[j];
    if (s->ndim != prog->out_shape[j].ndim)
      st = nbi_error(NB_ERR_SHARDING, "%s: output %d has %d dims but its sharding %d", fn, j,
                     prog->out_shape[j].ndim, s->ndim);
    uint32_t extra = st ? 0 : ref_var(var_in, var, prog->out[j]) & ~nbi_sharding_axes(s, true);
    for (int a = 0; a < m->n_axes && extra && !st; a++)
      if (extra & (1u << a))
        st = nbi_error(NB_ERR_SHARDING,
                       "%s: output %d varies over mesh axis %s, which its out spec does not name "
                       "(all-reduce or all-gather it in the body, or list it in partial(...))",
                       fn, j, m->name[a]);
  }
  if (!st) {
    nb_scope_begin();
    for (int i = 0; i < N && !st; i++)
      st = run_node(&r, i);
    nb_tensor **phys = st ? NULL : malloc(sizeof *phys * (size_t)nd);
    if (!st && !phys) st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    for (int j = 0; j < prog->n_out && !st; j++) {
      nb_shape logical = prog->out_shape[j];
      for (int k = 0; k < logical.ndim; k++)
        logical.dims[k] *= nbi_dim_shards(&out_s[j], k);
      for (int d = 0; d < nd; d++)
        phys[d] = ref(&r, prog->out[j], d);
      if (!(out[j] = nbi_sharded_make(fn, m, &out_s[j], &logical, prog->out_dtype[j], phys)))
        st = nb_last_status();
    }
    free(phys);
    for (int j = 0; j < prog->n_out && !st; j++) /* out of memory: released with the scope */
      if (!nb_keep(out[j])) st = nb_last_status();
    nb_scope_end();
    if (st)
      for (int j = 0; j < prog->n_out; j++)
        out[j] = NULL;
  }
  free(var_in);
  free(var);
  free(r.in);
  free(r.t);
  return st;
}
