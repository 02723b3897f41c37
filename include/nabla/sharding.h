/* nabla/sharding.h — SPMD sharding: device meshes, sharded tensors,
 * collectives (design: SHARDING.md).
 *
 * Write the program for one logical device; a tensor placed on a mesh with
 * nb_shard holds one shard per device, and every op on it runs per shard,
 * with the layouts of its results chosen by factor-based propagation and the
 * data movement it needs done by collectives (counted in nb_stats). A sharded
 * computation gives the values of the unsharded one (up to float
 * reassociation); reading a sharded tensor (nb_to_host, nb_item) assembles it
 * (on a mesh spanning processes, nb_mesh_world: on every rank, which must all
 * read it).
 *
 * Spec grammar (one entry per tensor dimension, comma separated, optionally
 * in brackets, then optional modifiers):
 *   _                 the dimension is not sharded
 *   x                 sharded over mesh axis x
 *   (x, y)            sharded over x then y (x major)
 *   x:(2)2            a sub-axis: axis x (size n) split as [2, 2, n/4], the
 *                     middle part (used when a dimension takes part of an axis)
 *   entry?            open: propagation may add axes to it (default: closed)
 *   entry@N           priority N (lower wins; default: none, after all given)
 *   replicated(a, b)  modifier: axes explicitly replicated (never added)
 *   partial(a, b)     modifier: values are partial sums still to be summed
 *                     over those axes
 * e.g. "x, _", "[(x, y), _?] partial(z)". nb_sharding_str gives the canonical
 * text: "[x, _] partial(y)". Unknown axes, an axis (or overlapping sub-axes)
 * used twice, more entries than dimensions and malformed text are
 * NB_ERR_SHARDING errors naming the spec. Sizes need not divide: shards take
 * ceil-sized chunks and the last ones are short (or empty). */
#ifndef NABLA_SHARDING_H
#define NABLA_SHARDING_H

#include "tensor.h"
#include "transforms.h"
#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A mesh: ordered named axes with sizes, devices numbered row-major (the last
 * axis varies fastest). Reference counted; tensors on it retain it. */
typedef struct nb_mesh nb_mesh;

/* axes: "x=4,y=2" (names: letters, digits, '_', starting with a letter; at
 * most 8 axes). nb_mesh_cpu: virtual CPU devices in this process, one buffer
 * per shard. nb_mesh_create: devs[0..n-1] in row-major order, n = product of
 * the sizes. NULL + error (NB_ERR_SHARDING, NB_ERR_DEVICE) on failure. */
nb_mesh *nb_mesh_cpu(const char *axes);
nb_mesh *nb_mesh_create(const char *axes, const nb_device *devs, int n);
/* A mesh spanning every process of the job (include/nabla/distributed.h):
 * its devices are the processes' CPUs, n_dev / nb_world_size() virtual
 * devices per process (which must divide), in rank order: rank r holds
 * devices r * k .. r * k + k - 1 (k devices per rank), so the leading axes
 * split the ranks ("dp=2,tp=2" over 2 ranks: each rank holds one dp row of
 * two tp devices; over 4 ranks one device each). Each process holds only its
 * own devices' blocks (the others are remote: shape only, no memory); ops
 * compute only those, and the collectives between ranks go over MPI, giving
 * the values of the same program on nb_mesh_cpu in one process (the same
 * ops in the same order: bit for bit). The program is the same on every
 * rank (SPMD): every rank makes the same meshes, shards, ops and reads, in
 * the same order; reading a sharded tensor (nb_to_host, nb_item, nb_print)
 * gathers it on every rank, so every rank must read it. nb_backward does not
 * run across processes (nb_set_requires_grad on such a tensor is
 * NB_ERR_DISTRIBUTED): differentiate with nb_grad / nb_value_and_grad. In a
 * job of one process (or before nb_init_distributed) it is nb_mesh_cpu. */
nb_mesh *nb_mesh_world(const char *axes);
nb_mesh *nb_mesh_retain(nb_mesh *m);
void nb_mesh_release(nb_mesh *m);
int nb_mesh_n_devices(const nb_mesh *m);
/* Canonical text of the mesh, "x=4,y=2". */
const char *nb_mesh_str(const nb_mesh *m);

/* t placed on m with the given spec (t may be a plain or a sharded tensor).
 * The result's dimensions listed in spec are closed unless marked open. */
nb_tensor *nb_shard(nb_tensor *t, nb_mesh *m, const char *spec);
/* t (sharded) moved to another spec on its mesh by the cheapest collectives. */
nb_tensor *nb_reshard(nb_tensor *t, const char *spec);
/* Canonical sharding text ("[x, _] partial(y)"), "" for a tensor on no mesh.
 * Owned by t: valid while t lives. */
const char *nb_sharding_str(const nb_tensor *t);
/* Reductions of collectives (nb_all_reduce in shard_map bodies, NB_REDUCE_*). */
typedef enum nb_reduce_op {
  NB_REDUCE_SUM,
  NB_REDUCE_MAX,
  NB_REDUCE_MIN,
  NB_REDUCE_MEAN,
  /* the short names API.md writes: nb_all_reduce(t, "tp", NB_SUM) */
  NB_SUM = NB_REDUCE_SUM,
  NB_MAX = NB_REDUCE_MAX,
  NB_MIN = NB_REDUCE_MIN,
  NB_MEAN = NB_REDUCE_MEAN
} nb_reduce_op;

/* The mesh t lives on, or NULL (not retained). */
nb_mesh *nb_mesh_of(const nb_tensor *t);

/* Sharding constraints. Inside a traced function (a transform's trace, nb_jit,
 * a call on sharded values), nb_shard and nb_reshard on a traced value do not
 * move data: they record a constraint (jax.lax.with_sharding_constraint) that
 * the value has that layout wherever the function runs on sharded values, and
 * graph-mode propagation (SHARDING.md) spreads it to the ops before and after
 * it. nb_reshard of a traced value uses the mesh of the sharded call being
 * traced. On one device a constraint is the identity. */

/* ---- shard_map (jax.shard_map) -------------------------------------------------
 * nb_shard_map(f, m, in_specs, out_specs): a function of f's arity whose body
 * f is written per device. f is traced on local (per-device) shapes: input k
 * of logical shape S arrives as its block under in_specs[k] (S divided by the
 * shards of each dimension, which must divide it). f may call the
 * collectives below over m's axes. Output j's per-device values are
 * assembled under out_specs[j]: a dimension sharded over axes is the
 * concatenation of the devices' blocks; an axis out_specs[j] does not name is
 * one the value must not vary over (checked before the body runs: reduce or gather it
 * in f, else NB_ERR_SHARDING naming the output and the axis), unless the spec
 * lists it in partial(...): the output is then the pending sum over it.
 * Inputs may be plain tensors or tensors on m (resharded to in_specs by the
 * cheapest collectives); outputs are tensors on m with sharding out_specs.
 * The result composes with every transform (grad, vjp, jvp, vmap, jit,
 * checkpoint): its VJP is the shard_map of f's VJP (the collectives' rules:
 * all-gather <-> reduce-scatter, all-reduce sum -> all-reduce sum, all-to-all
 * -> the inverse all-to-all, ppermute -> the inverse permutation), the
 * cotangent of an input replicated over an axis being the sum over it; its
 * batching is the shard_map of f batched, the batch dimension unsharded.
 * in_specs has f's n_in entries, out_specs its n_out (the arrays are copied).
 * NULL + error on a NULL argument; spec errors are reported at the call. */
nb_fn *nb_shard_map(nb_fn *f, nb_mesh *m, const char *const *in_specs,
                    const char *const *out_specs);

/* ---- automatic sharding (src/autoshard/README.md) ---------------------------------
 * nb_auto_shard(f, m, example_in, in_specs_out, out_specs_out): chooses a
 * sharding for every input and output of f (a function of tensors; a training
 * step: loss, gradients, update) on mesh m. f is traced once on the types of
 * example_in[0..f->n_in) (their values are not read). Every op of the trace
 * gets one strategy among those its factor rule allows (each mesh axis shards
 * at most one pass or reduction factor of the op, or none), costed by an
 * alpha-beta model (compute flops / shards / flop rate; per collective alpha +
 * bytes per device * beta; resharding between a producer's layout and what
 * its consumer needs, as nb_reshard would do it), and the total is minimized
 * (exact dynamic programming when the graph is a tree, else deterministic
 * local search). in_specs_out has f->n_in entries: an entry non-NULL on entry
 * is a pinned spec (kept as it is, owned by the caller); each NULL entry gets
 * a malloc'd spec string, as does every out_specs_out[j] (f->n_out of them):
 * the caller frees them with free(). On failure nothing is written (pins stay)
 * and an error is recorded. Specs use whole mesh axes, major first in mesh
 * order, sizes dividing ("[dp, _]", "[_, tp]"); outputs are never partial. */
nb_status nb_auto_shard(nb_fn *f, nb_mesh *m, nb_tensor *const *example_in, char **in_specs_out,
                        char **out_specs_out);

/* The solver's options (zero-initialize: every 0 / NULL field takes its
 * default). Costs are in seconds. */
typedef struct nb_auto_shard_opts {
  /* per-device memory bound in bytes (inputs' local blocks plus the peak of
   * live intermediates in program order); 0: the environment variable
   * NABLA_AUTOSHARD_MAX_BYTES, else none. Infeasible: NB_ERR_SHARDING. */
  double max_bytes_per_device;
  double flops_per_s;          /* per device; default 1e11 */
  double alpha_s[8];           /* latency per collective, per mesh axis; default 1e-5 */
  double beta_s_per_byte[8];   /* seconds per byte sent per device, per axis; default 1e-10 */
  const char *const *in_specs; /* NULL, or f->n_in entries: non-NULL entries are pinned */
  const int *out_like_in;      /* NULL, or f->n_out entries: output j takes the spec of
                                  input out_like_in[j] (an updated parameter), -1: free */
  int solver;                  /* NB_AUTO_SHARD_AUTO (0), _DP, _LOCAL or _ILP */
  /* false (default): structurally repeated ops (layers) and the parameters
   * they read share one choice, which the local search solves once; true:
   * every op chosen on its own (slower on deep models, never worse) */
  bool no_layer_sharing;
  double ilp_max_seconds; /* NB_AUTO_SHARD_ILP's time limit; default 60 */
} nb_auto_shard_opts;
/* _ILP: COIN-OR CBC (libCbcSolver.so.3, Debian coinor-libcbc-dev) loaded with
 * dlopen, warm-started from the local search, exact when it finishes within
 * the time limit; NB_ERR_STATE when CBC is not installed. */
enum {
  NB_AUTO_SHARD_AUTO = 0,
  NB_AUTO_SHARD_DP = 1,
  NB_AUTO_SHARD_LOCAL = 2,
  NB_AUTO_SHARD_ILP = 3
};
/* Whether NB_AUTO_SHARD_ILP can run (CBC found). */
bool nb_auto_shard_ilp_available(void);

/* A solved plan: the layout of every value of f's trace, its predicted cost,
 * collectives and memory. Reference counted (made with one reference). */
typedef struct nb_shard_plan nb_shard_plan;
/* NULL + error on failure (NB_ERR_SHARDING: a pinned spec that is not a whole-axis
 * dividing layout, an infeasible memory bound; NB_ERR_ARG: NB_AUTO_SHARD_DP on
 * a graph that is not a tree, f a function of trees: see nb_auto_shard_plan_trees). */
nb_shard_plan *nb_auto_shard_plan(nb_fn *f, nb_mesh *m, nb_tensor *const *example_in,
                                  const nb_auto_shard_opts *opts);
void nb_shard_plan_release(nb_shard_plan *p);
/* Spec text of input k / output j ("[dp, _]"), owned by the plan. NULL out of range. */
const char *nb_shard_plan_in_spec(const nb_shard_plan *p, int k);
const char *nb_shard_plan_out_spec(const nb_shard_plan *p, int j);
/* The prediction for one call of the plan (nb_shard_plan_call). */
typedef struct nb_shard_prediction {
  double cost_s, compute_s, comm_s; /* the model's objective and its parts */
  uint64_t n_all_reduce, n_all_gather, n_reduce_scatter, n_all_to_all, n_permute;
  uint64_t collective_bytes; /* summed over devices, as nb_stats counts them */
  double bytes_per_device;   /* inputs' local blocks + peak of live intermediates */
  int solver;                /* NB_AUTO_SHARD_DP, _LOCAL or _ILP: the one that ran */
  double solve_s;            /* wall time of the solve */
  int n_values;              /* inputs and ops of the trace */
  int n_choices;             /* choices solved for: fewer when repeated layers share them */
} nb_shard_prediction;
nb_shard_prediction nb_shard_plan_predict(const nb_shard_plan *p);
/* Runs f with exactly the plan: inputs (plain or on the mesh) moved to their
 * specs, each op recorded per device with its planned layout (operands
 * resharded to what it needs, once per value and layout), outputs moved to
 * their specs. out: f->n_out new tensors on the mesh. Values are those of f. */
nb_status nb_shard_plan_call(nb_shard_plan *p, nb_tensor *const *in, nb_tensor **out);
/* Prints the plan: the spec per input and output, the collectives of each op
 * that needs one, the predicted collectives, bytes and memory per device,
 * and, when measured is given (nb_get_stats around one nb_shard_plan_call),
 * the measured counts next to them. */
nb_status nb_auto_shard_report(FILE *out, const nb_shard_plan *p, const nb_stats *measured);

/* Functions of trees (nb_fn_create_trees, include/nabla/tree.h; or a
 * transform of one): nb_auto_shard_plan_trees plans f for the arrangement
 * (names, dtypes, shapes) of example_in[0..f->n_in) (non-NULL trees) as
 * nb_auto_shard_plan plans its flat form, the function of the leaves: input
 * tree k's leaves after tree k - 1's, each tree's in nb_tree_name order, and
 * the output trees' leaves likewise. The plan's in / out spec k
 * (nb_shard_plan_in_spec) and the options' in_specs and out_like_in count
 * those leaves. NULL + error: NB_ERR_ARG when f takes tensors (and
 * nb_auto_shard_plan refuses a function of trees), else as
 * nb_auto_shard_plan. */
nb_shard_plan *nb_auto_shard_plan_trees(nb_fn *f, nb_mesh *m, nb_tree *const *example_in,
                                        const nb_auto_shard_opts *opts);
/* Spec of leaf name of input tree `tree` / output tree `tree`, owned by the
 * plan; NULL when the plan is not of a function of trees, the tree is out
 * of range or has no such leaf. */
const char *nb_shard_plan_in_leaf_spec(const nb_shard_plan *p, int tree, const char *name);
const char *nb_shard_plan_out_leaf_spec(const nb_shard_plan *p, int tree, const char *name);
/* nb_shard_plan_call on trees of the planned arrangement (NB_ERR_ARG when
 * the names or dtypes differ, or the plan is not of trees): out gets
 * f->n_out new trees (the caller releases them) of tensors on the mesh. */
nb_status nb_shard_plan_call_trees(nb_shard_plan *p, nb_tree *const *in, nb_tree **out);

/* Collectives, callable only inside an nb_shard_map body (NB_ERR_SHARDING
 * elsewhere). axes names the group: one mesh axis "tp", or several "dp,tp"
 * (also "(dp, tp)"; major first): the devices whose coordinates differ only
 * on those axes, ranked by those coordinates (mixed radix, major first).
 * Every function returns the calling device's value, a new tensor:
 *  - nb_all_reduce: the group's elementwise SUM / MAX / MIN / MEAN of t;
 *  - nb_all_gather: the group's blocks concatenated along dim in rank order
 *    (dim grows by the group size: jax.lax.all_gather(tiled=True));
 *  - nb_reduce_scatter: the group's sum cut along dim into group-size chunks,
 *    chunk r to rank r (dim must divide: jax.lax.psum_scatter(tiled=True));
 *  - nb_all_to_all: t cut along split_dim into group-size chunks, chunk r
 *    sent to rank r, the received chunks concatenated along concat_dim in rank
 *    order (split_dim must divide);
 *  - nb_ppermute: rank pairs[i][1] receives rank pairs[i][0]'s t (each rank
 *    at most once as a source and once as a destination); ranks that receive
 *    nothing get zeros;
 *  - nb_axis_index: the device's rank in the group, an int32 scalar.
 * Differentiable (VJP and JVP) and batchable (vmap inside the body). Counted
 * in nb_stats when they run. */
nb_tensor *nb_all_reduce(nb_tensor *t, const char *axes, nb_reduce_op op);
nb_tensor *nb_all_gather(nb_tensor *t, const char *axes, int dim);
nb_tensor *nb_reduce_scatter(nb_tensor *t, const char *axes, int dim);
nb_tensor *nb_all_to_all(nb_tensor *t, const char *axes, int split_dim, int concat_dim);
nb_tensor *nb_ppermute(nb_tensor *t, const char *axes, const int (*pairs)[2], int n_pairs);
nb_tensor *nb_axis_index(const char *axes);

#ifdef __cplusplus
}
#endif
#endif
