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
