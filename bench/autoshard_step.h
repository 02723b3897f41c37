/* bench/autoshard_step.h — the training step that bench_autoshard's `step`
 * case and bench/mpi/bench_mpi.c's `autoshard_step` time: a 2-block MLP
 * (x @ W1 + b1, relu, @ W2 + b2 per block; mean squared error; gradients;
 * SGD update, f32) run three ways on a mesh with a tp axis (and optionally
 * dp):
 *   solved     the plan nb_auto_shard_plan solved (updated parameters tied
 *              to their inputs' layouts), run with nb_shard_plan_call on
 *              inputs already in the plan's input specs;
 *   megatron   the hand-written layout: W1 [_, tp], b1 [tp] (column
 *              parallel), W2 [tp, _], b2 [_] (row parallel), x and y [dp, _]
 *              (or replicated without dp), placed with nb_shard and run with
 *              nb_call (the propagation of the sharding layer lays out the
 *              rest);
 *   unsharded  nb_call on the plain tensors.
 * Each step runs from the same inputs, so every variant's loss is the same
 * number (up to f32 reassociation). */
#ifndef NABLA_BENCH_AUTOSHARD_STEP_H
#define NABLA_BENCH_AUTOSHARD_STEP_H

#include <nabla/nabla.h>
#include <stdbool.h>
#include <string.h>

#include "bench_common.h"

enum { AS_BLOCKS = 2, AS_NP = 4 * AS_BLOCKS, AS_NIN = AS_NP + 2, AS_NOUT = 1 + AS_NP };
enum { AS_SOLVED, AS_MEGATRON, AS_UNSHARDED, AS_N_VARIANTS };
static const char *const AS_VARIANT[AS_N_VARIANTS] = {"solved", "megatron", "unsharded"};

static nb_status as_loss_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = in[AS_NP];
  for (int i = 0; i < AS_BLOCKS; i++) {
    nb_tensor *const *w = in + 4 * i;
    h = nb_add(nb_matmul(nb_relu(nb_add(nb_matmul(h, w[0]), w[1])), w[2]), w[3]);
  }
  out[0] = nb_mean(nb_square(nb_sub(h, in[AS_NP + 1])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* loss, then every parameter minus 0.05 times its gradient (u: value_and_grad) */
static nb_status as_step_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *o[1 + AS_NP];
  nb_status st = nb_call(u, in, o);
  if (st) return st;
  out[0] = o[0];
  for (int i = 0; i < AS_NP; i++)
    if (!(out[1 + i] = nb_sub(in[i], nb_mul_scalar(o[1 + i], 0.05)))) return nb_last_status();
  return NB_OK;
}

typedef struct as_step {
  nb_fn *loss, *vg, *step;
  nb_tensor *in[AS_NIN]; /* plain, realized */
  int tie[AS_NOUT];
} as_step;

/* Batch n, width d, hidden h; nb_seed(3) first so every rank draws the same.
 * The inputs live in the caller's scope. */
static inline nb_status as_step_make(as_step *s, int64_t n, int64_t d, int64_t h) {
  memset(s, 0, sizeof *s);
  nb_seed(3);
  int argnums[AS_NP];
  s->tie[0] = -1;
  for (int i = 0; i < AS_NP; i++)
    argnums[i] = i, s->tie[1 + i] = i;
  s->loss = nb_fn_create(as_loss_fn, NULL, AS_NIN, 1);
  s->vg = nb_value_and_grad_argnums(s->loss, argnums, AS_NP);
  s->step = nb_fn_create(as_step_fn, s->vg, AS_NIN, AS_NOUT);
  for (int i = 0; i < AS_BLOCKS; i++) {
    s->in[4 * i] = nb_glorot_uniform(NB_SHAPE(d, h), NB_F32);
    s->in[4 * i + 1] = nb_mul_scalar(nb_randn(NB_SHAPE(h), NB_F32), 0.1);
    s->in[4 * i + 2] = nb_glorot_uniform(NB_SHAPE(h, d), NB_F32);
    s->in[4 * i + 3] = nb_mul_scalar(nb_randn(NB_SHAPE(d), NB_F32), 0.1);
  }
  s->in[AS_NP] = nb_randn(NB_SHAPE(n, d), NB_F32);
  s->in[AS_NP + 1] = nb_tanh(s->in[AS_NP]);
  for (int k = 0; k < AS_NIN; k++)
    if (!s->in[k]) return nb_last_status();
  if (!s->step) return nb_last_status();
  return nb_eval(s->in, AS_NIN);
}

static inline void as_step_free(as_step *s) {
  nb_fn_release(s->step);
  nb_fn_release(s->vg);
  nb_fn_release(s->loss);
}

/* The plan for s on m (NULL + error on failure). */
static inline nb_shard_plan *as_step_solve(as_step *s, nb_mesh *m) {
  return nb_auto_shard_plan(s->step, m, s->in, &(nb_auto_shard_opts){.out_like_in = s->tie});
}

/* Input k's spec in the hand-written Megatron layout (dp: the mesh has a dp axis). */
static inline const char *as_megatron_spec(int k, bool dp) {
  if (k >= AS_NP) return dp ? "[dp, _]" : "[_, _]";
  static const char *const w[4] = {"[_, tp]", "[tp]", "[tp, _]", "[_]"};
  return w[k % 4];
}

/* Times `reps` steps of one variant (after one warm-up step): t[0..reps),
 * the loss of the last step, the collectives of one step (nb_stats
 * difference) and whether every step succeeded. sync (or NULL) runs before
 * each step (an MPI barrier). plan: AS_SOLVED's. */
static inline nb_status as_step_time(as_step *s, nb_mesh *m, nb_shard_plan *plan, int variant,
                                     int reps, void (*sync)(void), double *t, double *loss,
                                     uint64_t *collectives) {
  nb_status st = NB_OK;
  nb_scope_begin();
  nb_tensor *in[AS_NIN];
  bool dp = strstr(nb_mesh_str(m), "dp=") != NULL;
  for (int k = 0; k < AS_NIN && !st; k++) {
    in[k] = variant == AS_UNSHARDED ? s->in[k]
            : variant == AS_SOLVED  ? nb_shard(s->in[k], m, nb_shard_plan_in_spec(plan, k))
                                    : nb_shard(s->in[k], m, as_megatron_spec(k, dp));
    if (!in[k] || nb_eval(&in[k], 1)) st = nb_last_status();
  }
  for (int r = -1; r < reps && !st; r++) {
    nb_scope_begin();
    if (sync) sync();
    nb_stats s0 = nb_get_stats();
    double t0 = now_s();
    nb_tensor *o[AS_NOUT];
    st = variant == AS_SOLVED ? nb_shard_plan_call(plan, in, o) : nb_call(s->step, in, o);
    if (!st) st = nb_eval(o, AS_NOUT);
    if (r >= 0) t[r] = now_s() - t0;
    nb_stats s1 = nb_get_stats();
    *collectives = (s1.n_all_reduce - s0.n_all_reduce) + (s1.n_all_gather - s0.n_all_gather) +
                   (s1.n_reduce_scatter - s0.n_reduce_scatter) +
                   (s1.n_all_to_all - s0.n_all_to_all) + (s1.n_permute - s0.n_permute);
    if (!st) *loss = nb_item(o[0]);
    nb_scope_end();
  }
  nb_scope_end();
  return st;
}

#endif
