/* src/core/program.h — multi-output nodes and programs (src/core/program.c): traced
 * functions as graphs that transforms rewrite and kernels run. */
#ifndef NABLA_PROGRAM_H
#define NABLA_PROGRAM_H

#include "nbi.h"

/* ---- multi-output nodes (src/core/program.c) -------------------------------------- */
/* The payload header of every multi-output op (embed it first). */
typedef struct nbi_multi {
  nbi_payload base;
  int n_out;
  nb_shape *shape; /* [n_out] */
  nb_dtype *dtype; /* [n_out] */
  int64_t *offset; /* [n_out] byte offset of each output in the pack */
  int64_t nbytes;  /* size of the pack */
} nbi_multi;
/* Fills m's output table from n_out types (allocates; base.destroy must call
 * nbi_multi_fini). Error naming fn on overflow or out of memory. */
nb_status nbi_multi_init(const char *fn, nbi_multi *m, int n_out, const nb_shape *shapes,
                         const nb_dtype *dtypes);
void nbi_multi_fini(nbi_multi *m);
/* Records the pack node (op must be flagged NBI_OPF_MULTI) on in[0..n_in-1]
 * with payload m (retained by the node; the caller keeps its own reference),
 * m's hash in attrs.i[0..1] and extra->i[2..] / f[] copied when extra is
 * given; then one TUPLE_GET per output into outs[0..n_out-1]. On failure
 * every outs[j] is NULL. */
nb_status nbi_record_multi(int op, nb_tensor *const *in, int n_in, nbi_multi *m,
                           const nbi_attrs *extra, nb_tensor **outs);
/* A new TUPLE_GET of output j of pack p. */
nb_tensor *nbi_multi_get(nb_tensor *p, int j);
static inline const nbi_multi *nbi_multi_of(const nb_tensor *p) {
  return (const nbi_multi *)p->payload;
}
/* Output j's contiguous view inside the pack's buffer view (kernels). */
nbi_view nbi_multi_out_view(const nb_tensor *p, const nbi_view *pack, int j);

/* ---- programs (src/core/program.c) -------------------------------------------------
 * A program is a recorded graph detached from any tensor: nodes by index, with
 * inputs that are bound when it is applied. jit caches one per signature;
 * control flow and checkpoint keep their bodies as programs; a kernel runs
 * one with a nested realization. Programs are immutable once built. */
typedef struct nbi_prog_node {
  int op;
  nb_dtype dtype;
  nb_shape shape;
  nbi_attrs attrs;
  nbi_payload *payload; /* retained */
  int n_in;
  int32_t *in; /* >= 0: an earlier node; < 0: program input -1 - in[k] */
} nbi_prog_node;

typedef struct nbi_program {
  int32_t refcount;
  int n_in, n_out, n_nodes;
  nb_shape *in_shape; /* [n_in] */
  nb_dtype *in_dtype;
  nb_shape *out_shape; /* [n_out] */
  nb_dtype *out_dtype;
  int32_t *out; /* [n_out] node or input refs, as nbi_prog_node.in */
  nbi_prog_node *nodes;
  uint64_t h1, h2; /* structural hash: equal hashes compute the same function */
} nbi_program;

/* Records the graph between the inputs x[0..n_x-1] and the outputs y as a
 * program. The walk visits nodes made since seq0 and stops at the x (the
 * program's first inputs, in order) and at captures: tensors that are
 * realized, older than seq0, or placeholders other than the x. Captures
 * become the program's further inputs, in order of discovery, and are
 * returned retained in *capt (malloc'd array of *n_capt; the caller releases
 * each and frees it). */
nb_status nbi_program_build(const char *fn, nb_tensor *const *x, int n_x, nb_tensor *const *y,
                            int n_y, uint64_t seq0, nbi_program **prog, nb_tensor ***capt,
                            int *n_capt);
nbi_program *nbi_program_retain(nbi_program *p); /* NULL is ignored */
void nbi_program_release(nbi_program *p);
/* Records p's nodes on in[0..n_in-1] (their shapes and dtypes must be p's:
 * error naming fn otherwise) and writes n_out new tensors, registered in the
 * caller's scope (an output that is an input comes back as an identity node).
 * The intermediates live only as long as the outputs need them. */
nb_status nbi_program_apply(const char *fn, const nbi_program *p, nb_tensor *const *in,
                            nb_tensor **out);
/* nbi_program_apply one node at a time (it is the loop below; the sharding
 * layer's graph mode steps it with a sharding chosen per node). begin checks
 * the inputs against p and allocates; node(i) records node i (its apply
 * rule, or nbi_record + payload; a TUPLE_GET of a pack an apply rule gave
 * outputs resolves to that output) into a->t[i], borrowed in the current
 * scope; ref gives the tensor of a node or input reference (nbi_prog_node.in
 * encoding); end frees what begin allocated. */
typedef struct nbi_apply {
  const char *fn;
  const nbi_program *p;
  nb_tensor *const *in; /* [p->n_in] */
  nb_tensor **t;        /* [p->n_nodes] */
  nb_tensor ***outs;    /* NULL, or [p->n_nodes]: a pack's outputs its apply rule gave */
} nbi_apply;
nb_status nbi_apply_begin(nbi_apply *a, const char *fn, const nbi_program *p, nb_tensor *const *in);
nb_status nbi_apply_node(nbi_apply *a, int i);
nb_tensor *nbi_apply_ref(const nbi_apply *a, int32_t r);
void nbi_apply_end(nbi_apply *a);
/* Applies every node of a's program in order in a scope (node(ctx, a, i);
 * NULL: nbi_apply_node), then writes out[j] (p->n_out of them: kept, for
 * the caller's scope; all NULL on failure) and ends a. */
nb_status nbi_apply_all(nbi_apply *a, nb_status (*node)(void *ctx, nbi_apply *a, int i), void *ctx,
                        nb_tensor **out);
/* For kernels: shares every in[k]'s storage as a leaf, applies p and realizes
 * its outputs in one nested realization. out[j] are realized tensors the
 * caller owns (nb_release each). */
nb_status nbi_program_run(const char *fn, const nbi_program *p, nb_tensor *const *in,
                          nb_tensor **out);

#endif
