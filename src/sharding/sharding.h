/* src/sharding/sharding.h — the sharding layer's internal contract (design:
 * SHARDING.md; this folder's README.md says how the pieces fit).
 *
 * Data model:
 *  - nb_mesh: named axes with sizes, devices row-major (last axis fastest).
 *  - nbi_axis: a (sub-)axis of a mesh axis: axis a (size n) split as
 *    [pre, size, n / (pre * size)], the middle part. A whole axis has pre 1,
 *    size n. A device's coordinate on it: (coord_a / (n / (pre * size))) % size.
 *  - nbi_sharding: per dimension an ordered axis list (major first), open or
 *    closed, an optional priority; per tensor the explicitly replicated axes
 *    and the partial axes (values are partial sums over them). A dimension's
 *    shard index on a device is the mixed-radix number of the device's
 *    coordinates on its axes (major first). A dimension of size N over S
 *    shards: chunk c = ceil(N / S); shard i holds [i c, min((i + 1) c, N)),
 *    possibly empty.
 *  - A sharded tensor (README.md) is a logical nb_tensor whose mesh is set,
 *    with a sharding and one physical single-device tensor per device.
 *
 * Functions taking `fn` name the public function in their error messages. */
#ifndef NABLA_SHARDING_INTERNAL_H
#define NABLA_SHARDING_INTERNAL_H

#include <nabla/sharding.h>

#include "../core/nbi.h"
#include "../core/dist.h"
#include "../core/oprules.h"
#include "../core/program.h"

#define NBI_MESH_MAX_AXES 8
#define NBI_AXIS_NAME_MAX 32

struct nb_mesh {
  int32_t refcount;
  int n_axes;
  char name[NBI_MESH_MAX_AXES][NBI_AXIS_NAME_MAX];
  int64_t size[NBI_MESH_MAX_AXES];
  int n_dev;
  nb_device *dev; /* [n_dev], row-major */
  int *dev_table; /* [n_dev]: each device's index in the device table (backend.h) */
  /* A mesh spanning the processes of the job (nb_mesh_world): n_ranks > 1,
   * device d held by rank d / per_rank; this process is rank `rank`. Other
   * meshes: n_ranks 1, rank 0, per_rank n_dev (every device here). */
  int n_ranks, rank, per_rank;
  char text[NBI_MESH_MAX_AXES * (NBI_AXIS_NAME_MAX + 24)]; /* nb_mesh_str */
};

typedef struct nbi_axis {
  int axis;     /* index into the mesh's axes */
  int64_t pre;  /* product of the major part it skips (1: from the start) */
  int64_t size; /* its size (the whole axis: the axis size) */
} nbi_axis;

typedef struct nbi_dim_sharding {
  int n; /* axes sharding this dimension, major first */
  nbi_axis ax[NBI_MESH_MAX_AXES];
  bool open;    /* propagation may extend it */
  int priority; /* -1: none given */
} nbi_dim_sharding;

typedef struct nbi_sharding {
  int ndim;
  nbi_dim_sharding dim[NB_MAX_DIMS];
  int n_repl; /* explicitly replicated (sub-)axes */
  nbi_axis repl[NBI_MESH_MAX_AXES];
  int n_partial; /* pending partial sums over these (sub-)axes */
  nbi_axis partial[NBI_MESH_MAX_AXES];
} nbi_sharding;

/* ---- meshes (mesh.c) ------------------------------------------------------- */
/* Parses "x=4,y=2" into a new mesh (refcount 1) over devs (NULL: n virtual CPU
 * devices; with n <= 0 too, as many as the axes have); n must equal the
 * product of the sizes. NULL + NB_ERR_SHARDING. */
nb_mesh *nbi_mesh_new(const char *fn, const char *axes, const nb_device *devs, int n);
/* Device placement. A physical tensor of device d lives on the mesh's device d
 * (m->dev_table[d]); values move between devices by TO_DEVICE nodes
 * (nb_to_device, differentiable). On a virtual CPU mesh every device is the
 * CPU and nothing moves. nbi_place: t on device d (t itself when it is there).
 * nbi_place_all: every t[d] on device d; one moved object per (object,
 * device). NULL / error status on failure. */
nb_tensor *nbi_place(const nb_mesh *m, int d, nb_tensor *t);
nb_status nbi_place_all(const nb_mesh *m, nb_tensor **t);

/* ---- meshes spanning processes (remote.c) ------------------------------------
 * On a mesh of nb_mesh_world in a job of several processes, a device another
 * rank holds is remote: its physical tensor here is a remote block
 * (nbi_remote_leaf: shape and dtype, no memory), and nothing is computed for
 * it. Ops record nodes for the local devices only; collectives fetch the
 * blocks of other ranks their local members need (nbi_fetch_blocks, one
 * exchange between the processes) and combine them with the same ordinary
 * ops, in the same order, as on the virtual mesh: the same values. */
static inline int nbi_mesh_rank_of(const nb_mesh *m, int d) {
  return m->n_ranks > 1 ? d / m->per_rank : m->rank;
}
static inline bool nbi_mesh_local(const nb_mesh *m, int d) {
  return nbi_mesh_rank_of(m, d) == m->rank;
}
/* The first device this process holds. */
static inline int nbi_mesh_first_local(const nb_mesh *m) {
  return m->n_ranks > 1 ? m->rank * m->per_rank : 0;
}
/* A remote block of device d (shape s, dtype dt), in the current scope. */
nb_tensor *nbi_remote_block(const nb_mesh *m, int d, const nb_shape *s, nb_dtype dt);
/* Every remote device's entry of t[0..n_dev) that is not a remote block
 * already replaced by one of its shape. */
nb_status nbi_localize(const nb_mesh *m, nb_tensor **t);
/* need[s * n_ranks + u]: rank u needs device s's block phys[s] (s held by
 * another rank than u); every rank passes the same matrix. got[s] becomes a
 * realized copy, here, of each block this rank needs (the others: phys[s]),
 * all moved by one exchange between the processes (nbi_dist_exchange).
 * Blocks with provenance (nb_backward) are refused: NB_ERR_DISTRIBUTED. */
nb_status nbi_fetch_blocks(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                           const bool *need, nb_tensor **got);

/* The groups of a collective on such a mesh whose members all sit on ranks of
 * their own (member[gi * n + r]: the device of rank r of group gi): it runs
 * as the matching MPI collective of each group (dist_coll.c), moving only
 * what it must, the result a lazy node waiting for the transfer (overlap;
 * NABLA_MPI_OVERLAP=0: waited at once). Each writes every out[d]: local
 * devices their results, the others remote blocks of the results' shapes,
 * registered in the current scope. Values: those of the virtual mesh, but
 * float sums over groups of more than 2 ranks (MPI's association). */
typedef struct nbi_dgroups {
  const nb_mesh *m;
  int n, n_groups;
  const int *member;
  nb_dtype dtype;
} nbi_dgroups;
/* NABLA_MPI_EXACT=1: float sums over more than 2 ranks go the whole-blocks
 * way (exact) instead. */
bool nbi_dist_exact(void);
nb_status nbi_dist_all_reduce(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys, int op,
                              nb_tensor **out);
nb_status nbi_dist_all_gather(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys, int a,
                              nb_tensor **out);
nb_status nbi_dist_reduce_scatter(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys,
                                  int a, nb_tensor **out);
nb_status nbi_dist_all_to_all(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys,
                              int split, int concat, nb_tensor **out);
/* src_of[r]: the group rank r receives from (-1: zeros); no rank is the
 * source of two. */
nb_status nbi_dist_ppermute(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys,
                            const int *src_of, nb_tensor **out);

/* Index of the axis named name[0..len), or -1. */
int nbi_mesh_axis(const nb_mesh *m, const char *name, size_t len);
/* Device dev's coordinate on the (sub-)axis a. */
int64_t nbi_axis_coord(const nb_mesh *m, const nbi_axis *a, int dev);
/* Whether two (sub-)axes share devices' coordinates (same axis, overlapping
 * ranges of the split). */
bool nbi_axis_overlap(const nbi_axis *a, const nbi_axis *b);
bool nbi_axis_eq(const nbi_axis *a, const nbi_axis *b);
/* The whole axis i of m. */
nbi_axis nbi_axis_whole(const nb_mesh *m, int i);

/* ---- shardings (spec.c) ---------------------------------------------------- */
/* Parses spec for a tensor of ndim dimensions on m into *out (dimensions the
 * spec does not list: unsharded, and open when open_rest). Checks everything
 * nbi_sharding_check checks. NB_ERR_SHARDING with a message naming fn and the
 * spec on failure. */
nb_status nbi_sharding_parse(const char *fn, const nb_mesh *m, const char *spec, int ndim,
                             bool open_rest, nbi_sharding *out);
/* No (sub-)axis used twice or overlapping across dims, replicated and partial
 * sets; sub-axes divide their axis. */
nb_status nbi_sharding_check(const char *fn, const nb_mesh *m, const nbi_sharding *s);
/* Canonical text into buf (cap bytes, NUL-terminated, truncated to fit):
 * "[x, _]", "[(x, y), _?@1] replicated(z) partial(w)"; a whole axis prints as
 * its name, a sub-axis as "x:(pre)size". Returns the length it needed. */
size_t nbi_sharding_format(const nb_mesh *m, const nbi_sharding *s, char *buf, size_t cap);
/* A fully replicated sharding of ndim dims (closed, no partial). */
nbi_sharding nbi_sharding_replicated(int ndim);
/* The mesh axes (bit a: axis a) s's dimensions name, and its partial sums
 * with partial_too; a sub-axis counts as its whole axis. */
uint32_t nbi_sharding_axes(const nbi_sharding *s, bool partial_too);
/* s with an unsharded batch dimension prepended (vmap rules); s->ndim <
 * NB_MAX_DIMS (a batched value has at most NB_MAX_DIMS dims). */
nbi_sharding nbi_sharding_batched(const nbi_sharding *s);
bool nbi_sharding_eq(const nbi_sharding *a, const nbi_sharding *b); /* layouts (not flags) */
/* Shards of dimension d: the product of its axes' sizes. */
int64_t nbi_dim_shards(const nbi_sharding *s, int d);
/* Device dev's shard index along dimension d. */
int64_t nbi_dim_index(const nb_mesh *m, const nbi_sharding *s, int d, int dev);
/* Device dev's local shape of a logical shape, and where its block starts. */
void nbi_local_block(const nb_mesh *m, const nbi_sharding *s, const nb_shape *logical, int dev,
                     nb_shape *local, int64_t *start);

/* ---- factor rules (rules.c) ------------------------------------------------
 * An op's rule (SHARDING.md "Op rules"): factors with sizes and kinds; each
 * operand and result dimension maps to a list of factors, major to minor (a
 * compound dimension of a reshape has several; a size-1 dimension that is
 * broadcast has none and stays unsharded). Tensors 0 .. n_in-1 are the
 * operands, n_in .. n_in+n_out-1 the results. linear says which partial
 * operands the op keeps partial (SHARDING.md "Partial sums are lazy"). */
enum {
  NBI_FACTOR_PASS,        /* in operands and results: elementwise, batch, matmul m/n */
  NBI_FACTOR_REDUCTION,   /* in operands only: sharding it makes partial results */
  NBI_FACTOR_NEED_REPL,   /* must be unsharded to compute locally */
  NBI_FACTOR_PERMUTATION, /* flip, pad, slice dims: unsharded (needs data movement) */
};
enum {
  NBI_LINEAR_NONE,  /* nonlinear: every partial operand is all-reduced first */
  NBI_LINEAR_SUM,   /* add-like: partial on y stays when every operand is partial on y */
  NBI_LINEAR_MULTI, /* mul-like (mul, matmul): stays when exactly one operand is partial */
  NBI_LINEAR_FIRST, /* div-like: stays when only operand 0 is partial on y */
  NBI_LINEAR_UNARY, /* views, negation, casts to wider floats, sums: a partial operand stays */
};
#define NBI_RULE_MAX_FACTORS 32
#define NBI_RULE_MAX_TENSORS 8
#define NBI_RULE_MAX_COMPOUND 4
typedef struct nbi_rule_dim {
  int n;
  int8_t f[NBI_RULE_MAX_COMPOUND];
} nbi_rule_dim;
typedef struct nbi_shard_rule {
  int n_factors;
  int64_t size[NBI_RULE_MAX_FACTORS];
  uint8_t kind[NBI_RULE_MAX_FACTORS];
  int n_in, n_out;
  int ndim[NBI_RULE_MAX_TENSORS];
  nbi_rule_dim dim[NBI_RULE_MAX_TENSORS][NB_MAX_DIMS];
  uint8_t linear;
} nbi_shard_rule;

/* The rule of op (attrs a) on operands of shapes in_shapes[0..n_in) giving a
 * result of shape out (single-result ops; multi-output packs, control flow
 * and custom calls without a rule get the all-replicated rule). Every op of
 * the registry has one. NB_ERR_INTERNAL for an op or arity it cannot
 * describe (n_in + 1 > NBI_RULE_MAX_TENSORS: the caller replicates). */
nb_status nbi_shard_rule_of(int op, const nbi_attrs *a, const nb_shape *in_shapes, int n_in,
                            const nb_shape *out, nbi_shard_rule *r);

/* ---- propagation (propagate.c) ---------------------------------------------
 * One op, eagerly (SHARDING.md "Propagation", aggressive mode): in[k] is
 * operand k's sharding (NULL: not on the mesh, i.e. replicated and closed);
 * chooses each factor's axes (projection with sub-axes, candidate folding,
 * priorities, conflict truncation, conflicts resolved in favour of the larger
 * tensor) and writes in_target[k] (the sharding operand k must have when the
 * op runs per shard: its projection of the chosen factors, keeping the
 * partial axes the op's linearity keeps) and out (the result's sharding: its
 * factors' axes per dimension, stopping a dimension at the first factor not
 * fully sharded; reduction factors' axes and kept partial axes as partial).
 * out_constraint (NULL: none) is a sharding the result must have (graph
 * mode, shard_map out specs); the operands are then chosen to produce it when
 * the rule allows. */
nb_status nbi_propagate(const char *fn, const nb_mesh *m, const nbi_shard_rule *r,
                        const nbi_sharding *const *in, const nb_shape *in_shapes,
                        const nbi_sharding *out_constraint, nbi_sharding *in_target,
                        nbi_sharding *out);

/* ---- collectives on physical shards (collectives.c) -------------------------
 * phys[0..n_dev) are a logical tensor's per-device tensors (single-device,
 * pending or realized; two devices may share one tensor object, which is how
 * replicated blocks are held). Each function writes n_dev new tensors to out
 * (registered in the current scope; devices whose results are equal share one
 * object) and records them as ordinary ops (sums, concatenations, slices), so
 * autodiff, vmap and jit see ordinary ops; it counts the collective in
 * nb_stats (kind, and bytes sent summed over devices: ring all-reduce
 * 2 (n-1)/n B per device, all-gather and reduce-scatter (n-1)/n B, all-to-all
 * (n-1)/n of its shard, permute the bytes it moves, B the full size of the
 * tensor over the group). A group is the set of devices whose coordinates
 * differ only on `axes` (n_axes (sub-)axes, major first: a device's rank in
 * its group is the mixed-radix number of its coordinates on them). Blocks are
 * ceil chunks (the last short or empty), as nbi_local_block cuts them.
 * NULL entries never occur on success; on failure out is all NULL and an
 * error is recorded naming fn. Counting: nbi_stats_collective (nbi.h). */
/* Ceil chunk r of n along a dimension of size len: [*start, *stop) (the last chunks may be
 * short or empty); and that chunk of t along dim (t itself when it is all of t). The one
 * chunking rule of the in-memory collectives and the ones between processes (dist_coll.c). */
void nbi_coll_chunk(int64_t len, int n, int r, int64_t *start, int64_t *stop);
nb_tensor *nbi_coll_chunk_of(nb_tensor *t, int dim, int n, int r);
nb_status nbi_coll_all_reduce(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                              const nbi_axis *axes, int n_axes, int op /* NB_REDUCE_* */,
                              nb_tensor **out);
/* Each device gets the group's blocks concatenated along dim (in rank order). */
nb_status nbi_coll_all_gather(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                              const nbi_axis *axes, int n_axes, int dim, nb_tensor **out);
/* The group's sum, cut along dim into ceil chunks: device of rank r gets chunk r. */
nb_status nbi_coll_reduce_scatter(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                                  const nbi_axis *axes, int n_axes, int dim, nb_tensor **out);
/* Each device cuts its block along split_dim into group-size ceil chunks and
 * gets, concatenated along concat_dim in rank order, chunk r of every member
 * (r its rank). */
nb_status nbi_coll_all_to_all(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                              const nbi_axis *axes, int n_axes, int split_dim, int concat_dim,
                              nb_tensor **out);
/* Device of rank dst in its group gets the block of rank src, for each
 * (src, dst) pair (ranks on `axes`); devices no pair names get zeros. */
nb_status nbi_coll_ppermute(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                            const nbi_axis *axes, int n_axes, const int (*pairs)[2], int n_pairs,
                            nb_tensor **out);
/* No communication: each device keeps chunk r (its rank on axes) of its block
 * cut along dim into ceil chunks. */
nb_status nbi_local_slice(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                          const nbi_axis *axes, int n_axes, int dim, nb_tensor **out);

/* ---- sharded tensors (shard.c) ---------------------------------------------- */
/* nb_assign onto a sharded dst: src (plain, or on dst's mesh) is moved onto
 * dst's sharding and computed; dst then holds its physical tensors. */
nb_status nbi_sharded_assign(nb_tensor *dst, nb_tensor *src);
/* A logical tensor on m with sharding s (logical shape and dtype) over
 * phys[0..n_dev) (each entry retained; shapes must be the local blocks),
 * registered in the current scope. NULL + error naming fn. */
nb_tensor *nbi_sharded_make(const char *fn, nb_mesh *m, const nbi_sharding *s,
                            const nb_shape *shape, nb_dtype dt, nb_tensor *const *phys);
/* t moved to sharding s on m: on m by the cheapest collectives; plain, cut
 * into blocks (no communication); on another mesh, gathered into one tensor
 * first. New in the current scope. NULL + error naming fn. */
nb_tensor *nbi_shard_to(const char *fn, nb_tensor *t, nb_mesh *m, const nbi_sharding *s);
/* The sharding of a tensor on a mesh. */
const nbi_sharding *nbi_sharding_of(const nb_tensor *t);

/* ---- shard_map bodies (smap.c) ---------------------------------------------
 * While an nb_shard_map body is traced (or a transform of it: its VJP, JVP,
 * batching), its mesh is pushed on this thread's stack; the collective ops
 * (coll_ops.c) record only inside one and name axes of it. */
nb_status nbi_smap_push(const char *fn, nb_mesh *m); /* NB_ERR_SHARDING when full: no pop */
void nbi_smap_pop(void);
nb_mesh *nbi_smap_mesh(void); /* the innermost, or NULL */

/* A collective node's group (coll_ops.c owns the attribute layout): its
 * mesh axis indices, major first, into ax (at most NBI_MESH_MAX_AXES);
 * returns their number. */
int nbi_coll_group(const nbi_attrs *a, int *ax);
/* Runs collective node (op, attrs a, payload) across m's devices: phys[d] is
 * device d's input (ignored by axis_index), out[d] its result, as the
 * nbi_coll_* functions give them (borrowed, counted in nb_stats). */
nb_status nbi_coll_run(const char *fn, const nb_mesh *m, int op, const nbi_attrs *a,
                       const nbi_payload *payload, nb_tensor *const *phys, nb_tensor **out);

/* The payload of a SHARD_MAP node (src/transforms/shard_map.c): its
 * operands are the body's inputs then its captures, in logical shapes. */
typedef struct nbi_smap_payload {
  nbi_multi m;         /* first: the outputs' logical types */
  nbi_program *prog;   /* the body traced on local shapes */
  nb_mesh *mesh;       /* retained */
  nbi_sharding *in_s;  /* [prog->n_in]: the layout each operand is resharded to */
  nbi_sharding *out_s; /* [m.n_out]: each output's layout */
} nbi_smap_payload;

/* Runs a shard_map body on every device of m. prog was traced on local
 * shapes (its inputs: the body's, then its captures). in[k] (prog->n_in of
 * them) are tensors on m whose local blocks have shape prog->in_shape[k]
 * (the caller resharded them to the in specs); their shardings (dimension
 * axes and partial axes) are the axes each input varies over. out_s[j] is the
 * sharding output j gets (prog->n_out of them); out[j] is written: a tensor on
 * m of sharding out_s[j] whose logical shape is the local one times the
 * shards of each dimension, borrowed in the current scope.
 * Each node runs once per device (devices whose inputs are the same tensor
 * objects share one node), collectives over their groups (nbi_coll_*),
 * axis_index as per-device constants. Checks before running anything that no
 * output varies over an axis its sharding neither shards a dimension over
 * nor lists as partial: NB_ERR_SHARDING "fn: output j varies over mesh axis
 * a, which its out spec does not name (all-reduce or all-gather it in the
 * body, or list it in partial(...))". Collective nodes inside nested programs
 * (control flow, checkpoint, another shard_map) are NB_ERR_SHARDING errors
 * naming the op. */
nb_status nbi_smap_exec(const char *fn, nb_mesh *m, const nbi_program *prog, nb_tensor *const *in,
                        const nbi_sharding *out_s, nb_tensor **out);

/* ---- graph mode and constraints (gprop.c, constraint.c) ---------------------
 * nbi_program_apply on sharded inputs (the apply_program hook): every value
 * of the program gets a sharding by iterating per-op propagation forward and
 * backward over all nodes to a fixed point (inputs keep theirs, constraints
 * are closed, other values start open and empty and only gain axes), then
 * the nodes are applied in order, each recorded per device with its chosen
 * sharding as the result's constraint. */
nb_status nbi_sharded_apply_program(const char *fn, const nbi_program *p, nb_tensor *const *in,
                                    nb_tensor **out);
/* The sharding the next op recorded on sharded inputs must give its result
 * (graph mode sets it around each node's record; shard.c's record hook takes
 * it, clearing it, and passes it to nbi_propagate as out_constraint). */
extern _Thread_local const nbi_sharding *nbi_shard_record_out;
/* A SHARD_CONSTRAINT program node's sharding and mesh (*m). */
const nbi_sharding *nbi_shard_constraint_of(const nbi_prog_node *pn, nb_mesh **m);
/* The mesh of the call on sharded values being traced on this thread (set by
 * call_sharded around its trace; NULL otherwise): nb_reshard of a traced
 * value uses it, and gradients traced under it are laid out like their
 * primals (nbi_shard_like). */
nb_mesh *nbi_trace_mesh(void);
void nbi_trace_mesh_set(nb_mesh *m); /* callers save nbi_trace_mesh() and restore it */
/* A SHARD_CONSTRAINT node on traced t: its value, to have sharding s on m
 * wherever the program runs sharded. */
nb_tensor *nbi_shard_constraint(const char *fn, nb_tensor *t, nb_mesh *m, const nbi_sharding *s);
/* A SHARD_LIKE node: g's value, laid out like x (x's dimension axes, no
 * partial sums) wherever the program runs sharded; g and x have one shape. */
nb_tensor *nbi_shard_like(nb_tensor *g, nb_tensor *x);

#endif
