/* src/autoshard/autoshard.h — the auto-sharding layer's internal contract
 * (README.md in this folder says how the pieces fit; public API:
 * include/nabla/sharding.h, "automatic sharding").
 *
 * A traced program becomes a graph of variables: the program's inputs, then
 * its nodes (in program order, which is topological). Each variable has
 * strategies; a strategy fixes the variable's layout (as_layout) and, for a
 * node, the layout each operand must have when it runs (its targets). The
 * objective is the sum of unary costs (compute of the node under its
 * strategy, the reduction of a partial output, a memory penalty) and edge
 * costs (resharding the producer's layout to the consumer's target, tying an
 * updated output to its input's layout). */
#ifndef NABLA_AUTOSHARD_INTERNAL_H
#define NABLA_AUTOSHARD_INTERNAL_H

#include "../sharding/sharding.h"
#include "../transforms/transforms.h"

enum { AS_MAXA = NBI_MESH_MAX_AXES, AS_MAX_STRATS = 512 };
enum { AS_REPL = -1, AS_PARTIAL = -2 };
/* The cost of a reshard that cannot be done (a complete value to a partial
 * target): far above any plan's (seconds), finite and small enough for CBC's
 * objective (below 1e25) and for sums and differences in the solvers. */
#define AS_INVALID 1e9

/* A layout in whole mesh axes: per axis a, d[a] is the dimension it shards
 * (axes of one dimension are major first in mesh order), AS_REPL or
 * AS_PARTIAL (a pending sum over it). */
typedef struct as_layout {
  int8_t d[AS_MAXA];
} as_layout;

/* Counts of the collectives a reshard (or a whole plan) performs, as nb_stats
 * counts them, and their time under the alpha-beta model. */
typedef struct as_coll {
  uint64_t n[5]; /* all-reduce, all-gather, reduce-scatter, all-to-all, permute */
  uint64_t bytes;
  double time;
} as_coll;

typedef struct as_strat {
  as_layout out;
  double compute; /* seconds */
  double flops_local;
} as_strat;

enum { AS_INPUT, AS_NODE };
typedef struct as_var {
  int kind, index; /* program input k or node i */
  nb_shape shape;
  size_t elt;
  bool plain;  /* a value that is never on the mesh (constants, captures) */
  bool opaque; /* no factor rule: runs replicated */
  bool pinned; /* an input whose spec the caller gave */
  int n_s;
  as_strat *s;    /* [n_s] */
  as_layout *tgt; /* [n_s * n_in]: operand k's target under strategy s */
  int n_in;
  int *in_var;   /* [n_in]: the operand's variable */
  double *unary; /* [n_s] */
  int *edges;    /* incident edges */
  int n_edges, cap_edges;
  int last_use; /* liveness: the last node (index) reading it; n_nodes for outputs */
  bool shared;  /* read more than once (operands, outputs): its pending sums are reduced
                   once, before it moves for any reader (as_from) */
} as_var;

/* A pairwise cost between u and v (u < v), c[su * v.n_s + sv]; parallel
 * uses are summed into one edge. */
typedef struct as_edge {
  int u, v;
  double *c;
} as_edge;

typedef struct as_graph {
  const char *fn;
  nb_mesh *m;
  nbi_program *prog;
  nb_tensor **capt; /* the program's captured inputs (retained) */
  int n_capt;
  int n_fin;    /* f's inputs (the rest of prog's inputs are captures) */
  int n_v;      /* prog->n_in + prog->n_nodes */
  int n_inputs; /* the first n_inputs variables are inputs (prog->n_in; in a reduced graph
                   the groups of inputs) */
  as_var *v;
  int n_e, cap_e;
  as_edge *e;
  double flops_per_s, alpha[AS_MAXA], beta[AS_MAXA];
  double max_bytes; /* 0: none */
  const int *tie;   /* [n_fin outputs] or NULL (copied) */
  int *tie_copy;
  double lambda;    /* the memory penalty per byte in the unaries */
  int *choice;      /* [n_v] the solution */
  int solver;       /* the one that ran */
  bool share;       /* repeated layers share one set of choices (local search, ILP) */
  double ilp_max_s; /* the ILP's time limit */
  int n_choices;    /* variables the solver chose for (groups when shared) */
} as_graph;

/* graph.c */
/* Builds g from f traced on example_in's types (opts already defaulted). */
nb_status as_build(as_graph *g, nb_fn *f, nb_mesh *m, nb_tensor *const *example_in,
                   const nb_auto_shard_opts *o);
void as_free(as_graph *g);
/* The edge between u and v (u < v), made (costs zero) when missing. */
nb_status as_edge_get(as_graph *g, int u, int v, as_edge **out);
/* Adds the reshard of a value (shape, elt) from cur to to into acc (counts,
 * bytes, time), mirroring the reshard planner of src/sharding/shard.c for
 * whole-axis, dividing layouts. */
void as_reshard(const as_graph *g, const nb_shape *shape, size_t elt, as_layout cur, as_layout to,
                as_coll *acc);
double as_reshard_time(const as_graph *g, const nb_shape *shape, size_t elt, as_layout cur,
                       as_layout to);
as_layout as_unpartial(as_layout l);
/* Where x's moves to its readers start from when it has layout l: l, or for a
 * shared value l without its partial sums (reduced once, then moved: the run
 * and the prediction do the same, so the edge costs charge that reduction
 * once, as a unary, and not once per reader). */
as_layout as_from(const as_var *x, as_layout l);
bool as_layout_eq(as_layout a, as_layout b);
/* Local bytes of a value under l on one device. */
double as_local_bytes(const as_graph *g, const as_var *x, as_layout l);
/* l as an nbi_sharding (closed dims) of ndim dims. */
nbi_sharding as_to_sharding(const as_graph *g, as_layout l, int ndim);
/* Sets unary costs for penalty lambda (compute, output sinks, memory). */
void as_unaries(as_graph *g, double lambda);

/* share.c: repeated layers. group[i] is variable i's group; r has one
 * variable per group (inputs' groups first), its unaries the members' summed
 * (plus the diagonal of edges inside a group), its edges the members' edges
 * between groups summed. r borrows g's strategies. */
typedef struct as_share {
  int n_groups;
  int *group;
  as_graph r;
} as_share;
nb_status as_share_build(const as_graph *g, as_share *sh);
/* Recomputes r's unaries from g's (after as_unaries). */
void as_share_unaries(const as_graph *g, as_share *sh);
/* g's choice from r's. */
void as_share_expand(const as_graph *g, const as_share *sh, int *choice);
void as_share_free(as_share *sh);

/* solve.c */
double as_total(const as_graph *g, const int *choice);
bool as_is_forest(const as_graph *g);
/* Exact minimum over a forest into choice. */
nb_status as_solve_dp(as_graph *g, int *choice);
/* Deterministic local search into choice. */
nb_status as_solve_local(as_graph *g, int *choice);
/* ilp.c: exact (up to max_s seconds) through COIN-OR CBC loaded with dlopen,
 * warm-started from as_solve_local; NB_ERR_STATE when CBC is missing. */
bool as_ilp_available(void);
nb_status as_solve_ilp(as_graph *g, int *choice, double max_s);
/* Predicted per-device peak bytes of a solution. */
double as_peak_bytes(const as_graph *g, const int *choice);
/* Solves with the memory bound (Lagrangian penalty doubled until it holds). */
nb_status as_solve(as_graph *g, int solver);

#endif
