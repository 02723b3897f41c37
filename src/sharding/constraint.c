/* src/sharding/constraint.c — sharding constraints (contract in sharding.h,
 * "graph mode and constraints"; public side: include/nabla/sharding.h,
 * "Sharding constraints").
 *
 * SHARD_CONSTRAINT (nb_shard / nb_reshard of a traced value): its operand's
 * value, to have a sharding s on a mesh m wherever the program runs sharded.
 * The node's payload holds m (retained) and s; attrs.i[0..1] its structural
 * hash (the mesh's and the sharding's canonical texts).
 * SHARD_LIKE(g, x): g's value, laid out like x (x's dimension axes, no
 * partial sums) wherever the program runs sharded: how a gradient traced
 * under a trace mesh (call_sharded) gets its primal's layout.
 *
 * Both are one function of their inputs' kinds (also their program apply
 * rules): on a traced value the node is recorded (graph-mode propagation,
 * gprop.c, reads it); on a sharded value the value is resharded at once; on
 * a plain value it is the identity. On one device they are zero-copy views
 * of their first operand. Derivatives: the tangent / cotangent constrained
 * the same way (the transpose of with_sharding_constraint); batching: the
 * constraint with an unsharded batch dimension prepended. */
#include "sharding.h"
#include "../core/oprules.h"
#include "../core/program.h"

#include "../ops/rule_util.h"

#include <stdlib.h>

static _Thread_local nb_mesh *trace_mesh;

nb_mesh *nbi_trace_mesh(void) { return trace_mesh; }
void nbi_trace_mesh_set(nb_mesh *m) { trace_mesh = m; }

/* ---- the constraint's payload -------------------------------------------------- */
typedef struct cpayload {
  nbi_payload base;
  nb_mesh *mesh; /* retained */
  nbi_sharding s;
} cpayload;

static void cpayload_destroy(nbi_payload *p) {
  cpayload *c = (cpayload *)p;
  nb_mesh_release(c->mesh);
  free(c);
}

static void hash_text(uint64_t *a, uint64_t *b, const char *s) {
  for (; *s; s++)
    nbi_hash_mix(a, b, (uint64_t)(unsigned char)*s);
  nbi_hash_mix(a, b, 0xff);
}

static cpayload *cpayload_new(const char *fn, nb_mesh *m, const nbi_sharding *s) {
  cpayload *c = calloc(1, sizeof *c);
  if (!c) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  c->base = (nbi_payload){.refcount = 1, .destroy = cpayload_destroy};
  c->mesh = nb_mesh_retain(m);
  c->s = *s;
  char text[512];
  nbi_sharding_format(m, s, text, sizeof text);
  uint64_t a = 0x510e527fade682d1ull, b = 0x9b05688c2b3e6c1full;
  hash_text(&a, &b, nb_mesh_str(m));
  hash_text(&a, &b, text);
  c->base.h1 = a, c->base.h2 = b;
  return c;
}

const nbi_sharding *nbi_shard_constraint_of(const nbi_prog_node *pn, nb_mesh **m) {
  const cpayload *c = (const cpayload *)pn->payload;
  *m = c->mesh;
  return &c->s;
}

static nb_tensor *record_constraint(nb_tensor *t, nbi_payload *p) {
  nbi_attrs at = {.i = {(int64_t)p->h1, (int64_t)p->h2}};
  nb_tensor *r = nbi_record(NBI_OP_SHARD_CONSTRAINT, t->dtype, &t->shape, &t, 1, &at);
  if (r) nbi_set_payload(r, p);
  return r;
}

nb_tensor *nbi_shard_constraint(const char *fn, nb_tensor *t, nb_mesh *m, const nbi_sharding *s) {
  if (s->ndim != t->shape.ndim) {
    nbi_error(NB_ERR_SHARDING, "%s: a sharding of rank %d for a value of rank %d", fn, s->ndim,
              t->shape.ndim);
    return NULL;
  }
  cpayload *c = cpayload_new(fn, m, s);
  if (!c) return NULL;
  nb_tensor *r = record_constraint(t, &c->base);
  nbi_payload_release(&c->base);
  return r;
}

/* t constrained to s on m: recorded (traced), resharded (sharded), or the
 * identity (plain). */
static nb_tensor *constrain(const char *fn, nb_tensor *t, nb_mesh *m, const nbi_sharding *s) {
  if (!t) return NULL;
  if (t->flags & NBI_T_TRACED) return nbi_shard_constraint(fn, t, m, s);
  return t->mesh ? nbi_shard_to(fn, t, m, s) : nbi_identity(t);
}

static const cpayload *cpayload_of(const nb_tensor *y) { return (const cpayload *)y->payload; }

static nb_status constraint_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  const cpayload *c = cpayload_of(y);
  if (need[0] && !(gin[0] = constrain("nb_shard", gy, c->mesh, &c->s))) return nb_last_status();
  return NB_OK;
}

static nb_tensor *constraint_jvp(nb_tensor *y, nb_tensor *const *tin) {
  const cpayload *c = cpayload_of(y);
  return constrain("nb_shard", tin[0], c->mesh, &c->s);
}

static nb_tensor *constraint_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                  int64_t B) {
  (void)batched, (void)B;
  const cpayload *c = cpayload_of(y);
  nbi_sharding b = nbi_sharding_batched(&c->s);
  return constrain("nb_shard", bin[0], c->mesh, &b);
}

static nb_status constraint_apply(const nbi_prog_node *pn, nb_tensor *const *in, nb_tensor **out) {
  const cpayload *c = (const cpayload *)pn->payload;
  if (in[0]->flags & NBI_T_TRACED)
    out[0] = record_constraint(in[0], pn->payload);
  else
    out[0] = constrain("nb_shard", in[0], c->mesh, &c->s);
  return out[0] ? NB_OK : nb_last_status();
}

/* ---- shard_like ----------------------------------------------------------------------- */
nb_tensor *nbi_shard_like(nb_tensor *g, nb_tensor *x) {
  static const char *FN = "nb_grad";
  if (nbi_any_null(FN, (nb_tensor *[]){g, x}, 2)) return NULL;
  if (!nbi_shape_eq(&g->shape, &x->shape)) {
    char a[160], b[160];
    nbi_error(NB_ERR_SHAPE, "%s: a value of shape %s laid out like one of shape %s", FN,
              nb_shape_str(g->shape, a, sizeof a), nb_shape_str(x->shape, b, sizeof b));
    return NULL;
  }
  if ((g->flags | x->flags) & NBI_T_TRACED)
    return nbi_record(NBI_OP_SHARD_LIKE, g->dtype, &g->shape, (nb_tensor *[]){g, x}, 2, NULL);
  nb_mesh *m = x->mesh ? x->mesh : g->mesh;
  if (!m) return nbi_identity(g);
  nbi_sharding s = x->mesh ? *nbi_sharding_of(x) : nbi_sharding_replicated(x->shape.ndim);
  s.n_partial = 0;
  return constrain(FN, g, m, &s);
}

static nb_status like_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  /* x only names a layout: its cotangent is zero */
  if (need[0] && !(gin[0] = nbi_shard_like(gy, y->in[1]))) return nb_last_status();
  return NB_OK;
}

static nb_tensor *like_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return tin[0] ? nbi_shard_like(tin[0], y->in[1]) : NULL;
}

static nb_tensor *like_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  (void)y;
  nb_tensor *g = nbi_bat_expand(bin[0], batched[0], B), *x = nbi_bat_expand(bin[1], batched[1], B);
  return g && x ? nbi_shard_like(g, x) : NULL;
}

static nb_status like_apply(const nbi_prog_node *pn, nb_tensor *const *in, nb_tensor **out) {
  (void)pn;
  out[0] = nbi_shard_like(in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}

/* On one device: a view of operand 0 (no kernel, no copy). */
static bool alias_view(const nb_tensor *n, const nbi_view *in, nbi_view *out) {
  (void)n;
  out->data = in->data;
  memcpy(out->strides, in->strides, sizeof out->strides);
  return true;
}

const nbi_op_def nbi_opdef_SHARD_CONSTRAINT = {.name = "sharding_constraint",
                                               .arity = 1,
                                               .view = alias_view,
                                               .vjp = constraint_vjp,
                                               .jvp = constraint_jvp,
                                               .vmap = constraint_vmap,
                                               .apply = constraint_apply,
                                               .flags = NBI_OPF_NO_KERNEL};
const nbi_op_def nbi_opdef_SHARD_LIKE = {.name = "shard_like",
                                         .arity = 2,
                                         .view = alias_view,
                                         .vjp = like_vjp,
                                         .jvp = like_jvp,
                                         .vmap = like_vmap,
                                         .apply = like_apply,
                                         .flags = NBI_OPF_NO_KERNEL};
