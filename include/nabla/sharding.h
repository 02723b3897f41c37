/* nabla/sharding.h — SPMD sharding: device meshes, sharded tensors,
 * collectives (design: SHARDING.md).
 *
 * Write the program for one logical device; a tensor placed on a mesh with
 * nb_shard holds one shard per device, and every op on it runs per shard,
 * with the layouts of its results chosen by factor-based propagation and the
 * data movement it needs done by collectives (counted in nb_stats). A sharded
 * computation gives the values of the unsharded one (up to float
 * reassociation); reading a sharded tensor (nb_to_host, nb_item) assembles it.
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
  NB_REDUCE_MEAN
} nb_reduce_op;

/* The mesh t lives on, or NULL (not retained). */
nb_mesh *nb_mesh_of(const nb_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
