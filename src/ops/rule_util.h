/* src/ops/rule_util.h — helpers for the ops' rules (VJP, JVP, batching),
 * written with public ops: the contracts of the rules themselves are in
 * src/core/nbi.h ("autodiff rules", "batching rules"). Included by the ops,
 * sharding and transforms files whose rules (or sweeps) use them; core does
 * not. */
#ifndef NABLA_OPS_RULE_UTIL_H
#define NABLA_OPS_RULE_UTIL_H

#include "../core/nbi.h"
#include "../core/oprules.h"

/* ---- helpers for rules (src/ops/grad_util.c) ------------------------------------ */
/* g summed over the dims that broadcasting added or stretched to reach g's
 * shape from s (s must broadcast to g's shape); returns g itself if equal. */
nb_tensor *nbi_sum_to(nb_tensor *g, const nb_shape *s);
/* nbi_sum_to(g, x's shape) cast to x's dtype: a cotangent for input x. */
nb_tensor *nbi_grad_fit(nb_tensor *g, const nb_tensor *x);
/* Zeros of x's shape and dtype as a broadcast 0-d constant (no big buffer). */
nb_tensor *nbi_zeros_like(const nb_tensor *x);
/* The same for a shape and dtype no tensor at hand has (rows of a scan,
 * outputs of a multi-output pack). */
nb_tensor *nbi_zeros_of(const nb_shape *s, nb_dtype dt);
/* Ones of x's shape and dtype, the same way (the seed of a gradient). */
nb_tensor *nbi_ones_like(const nb_tensor *x);
/* a + b where either may be NULL (zero); NULL only if both are. */
nb_tensor *nbi_add_maybe(nb_tensor *a, nb_tensor *b);

/* ---- helpers for batching rules (src/ops/batch_util.c) ----------------------------- */
/* t with the batch dim: itself if batched, else broadcast (a view) to (B, *shape). */
nb_tensor *nbi_bat_expand(nb_tensor *t, bool batched, int64_t B);
/* For broadcasting ops: a batched t whose per-example rank is below rank gets
 * singleton dims after the batch dim, (B, 1.., *shape), so that it broadcasts
 * per example against inputs of that rank. Unbatched t is returned as is
 * (right-aligned broadcasting already does the right thing). */
nb_tensor *nbi_bat_align(nb_tensor *t, bool batched, int rank);
/* A per-example axis (negative allowed) of a rank-ndim value -> its axis in
 * the batched value (normalized + 1). The op already validated it. */
int nbi_bat_axis(int axis, int ndim);
/* Moves dim `from` of t to position `to` (both normalized), as jnp.moveaxis. */
nb_tensor *nbi_bat_moveaxis(nb_tensor *t, int from, int to);
/* Example b of a batched value: t[b] (a view, batch dim dropped). */
nb_tensor *nbi_bat_index(nb_tensor *t, int64_t b);
/* The fallback a few rules document: calls apply once per example on
 * (bin[k][b] or bin[k]) and stacks the results on a new dim 0. */
nb_tensor *nbi_bat_loop(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B,
                        nb_tensor *(*apply)(nb_tensor *y, nb_tensor *const *in));

#endif
