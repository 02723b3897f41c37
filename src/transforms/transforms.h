/* src/transforms/transforms.h — internal contract of the transforms layer.
 *
 * A sweep is the set of graph nodes between some outputs and the tensors being
 * differentiated (the "sources"), in topological order, with for each node
 * whether it depends on a source. It is collected once and then run any number
 * of times: reverse (cotangents -> source cotangents, the VJP rules) or forward
 * (source tangents -> output tangents, the JVP rules). jacrev/jacfwd run one
 * collected sweep once per basis vector.
 *
 * Two ways to pick the nodes:
 * - functional (transforms): sources are the traced input aliases; only nodes
 *   made since the trace began (seq >= seq0) are visited, so a trace never walks
 *   older history however long it is;
 * - imperative (nb_backward): sources are requires-grad leaves; only nodes
 *   with provenance (NBI_T_GRAD_PATH) are visited.
 */
#ifndef NABLA_TRANSFORMS_INTERNAL_H
#define NABLA_TRANSFORMS_INTERNAL_H

#include "../core/nbi.h"
#include "../core/program.h"

struct nb_fn {
  int32_t refcount;
  int n_in, n_out;
  nb_fn_body body;
  void *user;
  void (*destroy)(void *user); /* frees user (transforms' own state), or NULL */
  bool user_body;              /* made by nb_fn_create (else a transform's) */
  bool takes_trees;            /* a function of trees (tree_fn.c): n_in, n_out count trees */
};

/* Makes an nb_fn whose user state is freed by destroy when the last reference
 * goes (destroy is called on failure too). */
nb_fn *nbi_fn_make(const char *fn, nb_fn_body body, void *user, void (*destroy)(void *), int n_in,
                   int n_out);

typedef struct nbi_sweep {
  const char *fn; /* public name for error messages */
  bool imperative;
  uint64_t seq0;     /* functional: visit nodes with seq >= seq0 */
  nb_tensor **nodes; /* topological order; sources included where reached */
  uint8_t *kind;     /* [n]: depends on a source (1), is a source (2) */
  int n, cap;
  nb_tensor **sources; /* functional: the aliases; imperative: leaves found */
  int n_sources, cap_sources;
} nbi_sweep;

/* Collects the nodes from ys back to the sources. Functional: sources are
 * xs[0..n_x-1]. Imperative: xs is ignored; sources are the requires-grad
 * tensors reached (in s->sources afterwards). Error if the imperative walk
 * meets provenance an earlier backward freed. */
nb_status nbi_sweep_collect(nbi_sweep *s, nb_tensor *const *ys, int n_y, nb_tensor *const *xs,
                            int n_x);
/* Reverse: gys[i] is the cotangent of ys[i] (NULL = zero). Writes gxs[j], the
 * cotangent of sources[j], or NULL when no path carries one. */
nb_status nbi_sweep_reverse(nbi_sweep *s, nb_tensor *const *ys, nb_tensor *const *gys, int n_y,
                            nb_tensor **gxs);
/* Forward: txs[j] is the tangent of sources[j] (NULL = zero). Writes tys[i],
 * the tangent of ys[i], or NULL for zero. */
nb_status nbi_sweep_forward(nbi_sweep *s, nb_tensor *const *txs, nb_tensor *const *ys, int n_y,
                            nb_tensor **tys);
void nbi_sweep_free(nbi_sweep *s);
/* Batches the graph: srcs[j] (nodes made since seq0; placeholders or aliases)
 * take the batched values bsrc[j] (batch first, size B), every node between
 * them and ys gets its batching rule applied in order, and bys[r] is ys[r]'s
 * batched value (batch first), or NULL when ys[r] does not depend on any src
 * (the caller broadcasts it). */
nb_status nbi_vmap_graph(const char *fn, nb_tensor *const *ys, int n_y, nb_tensor *const *srcs,
                         nb_tensor *const *bsrc, int n_src, int64_t B, uint64_t seq0,
                         nb_tensor **bys);

/* Per-pack values of a multi-output op during a sweep (sweep.c, vmap.c). */
typedef struct nbi_multi_vals {
  nb_tensor ***v; /* [s->n]: NULL or one value per output of the pack at that index */
} nbi_multi_vals;
nb_status nbi_multi_vals_slot(const nbi_sweep *s, nbi_multi_vals *mv, int i, int n_out);
void nbi_multi_vals_free(const nbi_sweep *s, nbi_multi_vals *mv);
/* Checks one value per output of pack p against its types (B >= 0: with a
 * leading batch dim of B). */
nb_status nbi_multi_check(const char *fn, const char *what, const nb_tensor *p, nb_tensor *const *v,
                          int64_t B);

/* A trace of f: the body run on symbolic aliases of the inputs. */
typedef struct nbi_trace {
  uint64_t seq0;
  bool top; /* no input was traced: outputs must be made readable */
  int n_in, n_out;
  nb_tensor **x; /* [n_in] traced aliases of the inputs */
  nb_tensor **y; /* [n_out] outputs */
} nbi_trace;

nb_status nbi_trace_run(const char *fn, nb_fn *f, nb_tensor *const *in, nbi_trace *tr);
void nbi_trace_free(nbi_trace *tr);
/* What a transform returns for t: at top level a fresh readable (untraced)
 * node with t's value, else t. */
nb_tensor *nbi_trace_result(const nbi_trace *tr, nb_tensor *t);

/* ---- programs as functions -----------------------------------------------------------
 * fn.c: tracing into programs and a program as an nb_fn (core only below it);
 * program_xform.c: nbi_select_fn and nbi_program_xform, above autodiff.c and
 * vmap.c. */
/* Traces f on placeholders of the given types (n = f->n_in) into a program
 * whose inputs are f's inputs then the tensors f captured (returned retained
 * in *capt, *n_capt; see nbi_program_build). */
nb_status nbi_trace_program(const char *fn, nb_fn *f, const nb_shape *shapes,
                            const nb_dtype *dtypes, nbi_program **prog, nb_tensor ***capt,
                            int *n_capt);
/* The same, with the types of the tensors in[0..f->n_in-1]. */
nb_status nbi_trace_program_like(const char *fn, nb_fn *f, nb_tensor *const *in, nbi_program **prog,
                                 nb_tensor ***capt, int *n_capt);
/* An nb_fn (p->n_in inputs, p->n_out outputs) that applies p: what control
 * flow and checkpoint rules hand to the transforms (nb_vjp_fn of a body). */
nb_fn *nbi_program_fn(const char *fn, nbi_program *p);
/* An nb_fn giving outputs idx[0..n-1] of g, taking over the reference to g
 * (released on failure; NULL g gives NULL). */
nb_fn *nbi_select_fn(const char *fn, nb_fn *g, const int *idx, int n);
/* A rule's function over a body program p (checkpoint, control flow,
 * shard_map): p as a function (NBI_XF_PLAIN), or its nb_vjp_fn (NBI_XF_VJP),
 * nb_jvp_fn (NBI_XF_JVP) or nb_vmap(., in_axes, NULL) (NBI_XF_VMAP), then,
 * when idx is given, only its outputs idx[0..n-1] (nbi_select_fn). NULL +
 * error on failure. */
enum { NBI_XF_PLAIN, NBI_XF_VJP, NBI_XF_JVP, NBI_XF_VMAP };
nb_fn *nbi_program_xform(const char *fn, nbi_program *p, int kind, const int *in_axes,
                         const int *idx, int n);
/* nb_grad (with_value: nb_value_and_grad) of a function of tensors f over
 * argnums[0..n-1] (n < 0: every input), integer arguments passed through
 * with zero gradients: the flat form of a gradient of a function of trees
 * (tree_fn.c). */
nb_fn *nbi_grad_flat(const char *name, nb_fn *f, const int *argnums, int n, bool with_value);
/* Releases n tensors and frees the array (captures). */
void nbi_release_all(nb_tensor **ts, int n);

#endif
