/* nabla/random.h — explicit random keys (JAX's style).
 *
 * A key is an ordinary tensor (i64, shape [2]: two 32-bit words), so random
 * numbers drawn from it trace, jit, vmap and shard like any op: a jitted step
 * that takes a key draws new numbers on every call with a new key. Numbers
 * are counter-based (Threefry-2x32, 20 rounds): the same key gives the same
 * numbers on any thread count and in any evaluation order. Never reuse a key
 * for two draws you want independent: split it.
 *
 *   nb_tensor *key = nb_key(42), *k[2];
 *   nb_key_split(key, 2, k);                       // k[0] for init, k[1] for dropout
 *   nb_tensor *w = nb_random_normal(k[0], NB_SHAPE(784, 256), NB_F32);
 *
 * The seeded generator (nb_seed, nb_rand, nb_randn, nb_glorot_uniform,
 * nb_dropout) draws at record time from a per-thread stream: fine for eager
 * code, but inside a traced function (nb_jit, nb_grad, nb_vmap, ...) its
 * numbers would be constants of the trace, so there it is an NB_ERR_STATE
 * error that points here.
 */
#ifndef NABLA_RANDOM_H
#define NABLA_RANDOM_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

nb_tensor *nb_key(uint64_t seed); /* [seed >> 32, seed & 0xffffffff] */
/* n new independent keys from key (out[0..n)); key is not consumed. */
nb_status nb_key_split(nb_tensor *key, int n, nb_tensor **out);
/* U[0, 1) of float dtype dt (f32: 24 random bits, f64: 53, f16: 11, bf16: 8). */
nb_tensor *nb_random_uniform(nb_tensor *key, nb_shape s, nb_dtype dt);
/* N(0, 1) (Box-Muller on two uniforms of split keys). */
nb_tensor *nb_random_normal(nb_tensor *key, nb_shape s, nb_dtype dt);
/* bool, true with probability p in [0, 1]. */
nb_tensor *nb_random_bernoulli(nb_tensor *key, double p, nb_shape s);
/* i64 samples of the categorical distributions softmax(logits) along axis
 * (Gumbel-max): logits' shape without that axis. */
nb_tensor *nb_categorical(nb_tensor *key, nb_tensor *logits, int axis);
/* Inverted dropout with a key: each element zeroed with probability p, the
 * rest scaled by 1 / (1 - p). */
nb_tensor *nb_dropout_key(nb_tensor *t, nb_tensor *key, double p);

#ifdef __cplusplus
}
#endif
#endif
