/* nabla/optim.h — optimizers, gradient clipping and learning-rate schedules,
 * in optax's shape: an optimizer is a value; nb_optim_init(params) gives its
 * state as a tree; nb_optim_update(grads, state, params) gives the updates
 * (a tree shaped like grads) and the next state; nb_apply_updates adds the
 * updates to the parameters. Parts chain (nb_optim_chain): clipping, then
 * Adam, then weight decay, each seeing the updates of the one before.
 *
 *   nb_optim *parts[2] = {nb_clip_by_global_norm(1.0), nb_adamw(3e-4, 0.9, 0.95, 1e-8, 0.1)};
 *   nb_optim *opt = nb_optim_chain(parts, 2);
 *   nb_optim_release(parts[0]), nb_optim_release(parts[1]);
 *   nb_schedule *lr = nb_schedule_warmup_cosine(0, 3e-4, 100, 5000, 3e-5);
 *   nb_optim_set_schedule(opt, lr);      nb_schedule_release(lr);
 *   nb_optim_set_decay_mask(opt, nb_decay_matrices, NULL);   // no decay on biases, norms
 *   nb_tree *state = nb_optim_init(opt, params);
 *   for (...) { ... grads ...; nb_optim_step(opt, params, grads, state); }
 *
 * The arithmetic follows torch.optim (the golden tests compare 100 steps of
 * each optimizer with PyTorch to 1e-6 in f64): scalars that depend on the
 * step (bias corrections, the scheduled learning rate) are computed in f64
 * from the state's step count, a tensor, so a jitted training step sees the
 * current step; the elementwise work runs in each parameter's dtype.
 *
 * One pass per group. Floating-point parameters are grouped by dtype,
 * device and decay mask (a sharded parameter is a group of its own); each
 * group's update is computed on its tensors concatenated into one 1-D
 * tensor, so a step over 100 tensors is a handful of kernels (a
 * concatenation of the gradients, a norm for clipping, one fused
 * elementwise pass per group), not 100. The state holds one 1-D tensor per
 * group and moment ("mu.0", "nu.0", ...) and the step count ("count", i64).
 * nb_apply_updates rebinds the parameters into one buffer per group, so
 * later steps read them without concatenating. Integer and bool parameters
 * are left alone (their updates are zeros).
 *
 * Ownership: optimizers and schedules are reference counted; a chain and
 * nb_optim_set_schedule take their own references. Errors name the public
 * function and the offending entry.
 */
#ifndef NABLA_OPTIM_H
#define NABLA_OPTIM_H

#include "tree.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_optim nb_optim;
typedef struct nb_schedule nb_schedule;

/* ---- optimizers (NULL + NB_ERR_ARG for a negative or NaN hyperparameter,
 *      b1 / b2 outside [0, 1), lr < 0) ------------------------------------------- */
/* torch.optim.SGD (dampening 0): buf = momentum * buf + g (buf = g at the
 * first step); d = nesterov ? g + momentum * buf : buf (momentum 0: d = g);
 * update = -lr * d. nesterov needs momentum > 0. */
nb_optim *nb_sgd(double lr, double momentum, bool nesterov);
/* torch.optim.Adam (no weight decay, amsgrad off): m = lerp(m, g, 1 - b1),
 * v = b2 v + (1 - b2) g^2, update = -(lr / (1 - b1^t)) m / (sqrt(v) /
 * sqrt(1 - b2^t) + eps), t the step (1, 2, ...). */
nb_optim *nb_adam(double lr, double b1, double b2, double eps);
/* torch.optim.AdamW: Adam's update minus lr * weight_decay * param
 * (decoupled decay; masked by nb_optim_set_decay_mask). */
nb_optim *nb_adamw(double lr, double b1, double b2, double eps, double weight_decay);
/* Lion (Chen et al. 2023, optax.lion): c = b1 m + (1 - b1) g, update =
 * -lr (sign(c) + weight_decay * param), m = b2 m + (1 - b2) g. Typical: b1
 * 0.9, b2 0.99, lr 3-10x smaller than AdamW's. */
nb_optim *nb_lion(double lr, double b1, double b2, double weight_decay);
/* Scales the updates by min(1, max_norm / (norm + 1e-6)), norm the global
 * L2 norm of all floating-point updates (torch.nn.utils.clip_grad_norm_). A
 * chain's first part, before the optimizer. max_norm > 0. */
nb_optim *nb_clip_by_global_norm(double max_norm);
/* updates += weight_decay * param (optax.add_decayed_weights; masked). */
nb_optim *nb_add_decayed_weights(double weight_decay);
/* parts[0], then parts[1] on its updates, ... (optax.chain); 1 <= n <= 32.
 * The chain takes a reference to each part; its state holds each part's
 * state under "<k>." (part k). */
nb_optim *nb_optim_chain(nb_optim *const *parts, int n);
nb_optim *nb_optim_retain(nb_optim *o); /* returns o; NULL is ignored */
void nb_optim_release(nb_optim *o);     /* NULL is ignored */

/* The learning rate of o (every part of a chain that has one) becomes
 * s(step), step = 0 at the first update: the lr given at creation is
 * replaced. o takes a reference to s. NB_ERR_ARG when o has no learning rate. */
nb_status nb_optim_set_schedule(nb_optim *o, nb_schedule *s);
/* Weight decay (nb_adamw, nb_lion, nb_add_decayed_weights; every such part
 * of a chain) applies only to parameters for which mask returns true; the
 * mask is asked at nb_optim_init and at each update (it must answer the
 * same). NULL mask: every parameter (the default). NB_ERR_ARG when o has no
 * weight decay. */
typedef bool (*nb_decay_mask_fn)(void *user, const char *name, const nb_tensor *param);
nb_status nb_optim_set_decay_mask(nb_optim *o, nb_decay_mask_fn mask, void *user);
/* A ready mask: true for parameters of rank >= 2 (weights, embeddings), false
 * for biases and norm scales (GPT-2's convention). */
bool nb_decay_matrices(void *user, const char *name, const nb_tensor *param);

/* ---- state and updates ----------------------------------------------------------------- */
/* o's initial state for params (a new tree: counts 0, moments 0). */
nb_tree *nb_optim_init(nb_optim *o, const nb_tree *params);
/* updates (a new tree with grads' names, the caller releases it) and the
 * next state (state's entries are replaced by new tensors; on error state is
 * unchanged). grads and params have the same names in the same order, the
 * same shapes and dtypes, and params (NULL allowed when no part reads them:
 * no weight decay) are those the state was made for. Lazy: nothing is
 * computed until the updates or the state are read, applied or realized. */
nb_status nb_optim_update(nb_optim *o, const nb_tree *grads, nb_tree *state, const nb_tree *params,
                          nb_tree **updates);
/* params += updates (optax.apply_updates) with nb_assign_n: one
 * realization computes every new parameter, the scope-held pending tensors
 * that read the old ones (a loss, the gradients) and, when the updates came
 * from nb_optim_update, the optimizer's new state. Integer parameters are
 * left alone. Inside a traced function use nb_tree_axpy(1, updates, params)
 * instead (a new tree). */
nb_status nb_apply_updates(nb_tree *params, const nb_tree *updates);
/* nb_optim_update then nb_apply_updates: one training step's parameter and
 * state update, in one realization. */
nb_status nb_optim_step(nb_optim *o, nb_tree *params, const nb_tree *grads, nb_tree *state);

/* ---- learning-rate schedules (optax's; step counts from 0) -------------------------------- */
/* value */
nb_schedule *nb_schedule_constant(double value);
/* init + (end - init) * min(step, steps) / steps (optax.linear_schedule):
 * a linear warmup from 0 to the peak is nb_schedule_linear(0, peak, n). */
nb_schedule *nb_schedule_linear(double init, double end, int64_t steps);
/* init * ((1 - alpha) * (1 + cos(pi * min(step, steps) / steps)) / 2 + alpha)
 * (optax.cosine_decay_schedule). */
nb_schedule *nb_schedule_cosine(double init, int64_t steps, double alpha);
/* Linear from init to peak over warmup_steps, then cosine from peak to end
 * over steps - warmup_steps (optax.warmup_cosine_decay_schedule; steps
 * counts the warmup too, steps > warmup_steps >= 0). */
nb_schedule *nb_schedule_warmup_cosine(double init, double peak, int64_t warmup_steps,
                                       int64_t steps, double end);
/* The schedule at a step, on the host. NaN + NB_ERR_NULL for NULL. */
double nb_schedule_value(const nb_schedule *s, int64_t step);
/* The schedule at step (a one-element integer tensor, e.g. a state's
 * "count"), as a 0-d f64 tensor: traceable and jittable. */
nb_tensor *nb_schedule_at(const nb_schedule *s, nb_tensor *step);
nb_schedule *nb_schedule_retain(nb_schedule *s); /* returns s; NULL is ignored */
void nb_schedule_release(nb_schedule *s);        /* NULL is ignored */

#ifdef __cplusplus
}
#endif
#endif
