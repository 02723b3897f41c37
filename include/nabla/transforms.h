/* nabla/transforms.h — functions of tensors (nb_fn), JAX-style transforms, and
 * PyTorch-style imperative autodiff.
 *
 * An nb_fn maps n_in tensors to n_out tensors. It is a C callback
 * (nb_fn_create) or the result of a transform. A transform traces its function:
 * it calls it on symbolic tensors that stand for the real inputs, so the body
 * records a graph with known shapes and dtypes; the transform then rewrites that
 * graph (a reverse sweep for vjp/grad, a forward sweep for jvp) and returns the
 * new graph's outputs. Because the result is again a graph of ordinary ops,
 * transforms nest to any depth: nb_jacfwd(nb_jacrev(f)) is a Hessian, and
 * nb_jacfwd(nb_hessian(f)) a third derivative.
 *
 * Inside a transform the body's tensors are symbolic: reading them (nb_item,
 * nb_to_host, nb_eval, nb_print shows "<traced ...>") is an NB_ERR_STATE error
 * ("cannot read a traced value; use nb_cond / nb_while_loop"). Tensors the body
 * captures from outside (through `user`) are constants: no gradient flows to
 * them, as with JAX closures.
 *
 * Ownership: nb_fn handles are reference counted. Creating one gives the caller
 * one reference; every transform takes its own reference to the function it
 * transforms, so the caller may release its reference right away:
 *   nb_fn *loss = nb_fn_create(loss_body, NULL, 10, 1);
 *   nb_fn *vg = nb_value_and_grad(loss, NB_AXES(0, 1));
 *   nb_fn_release(loss);            // vg keeps what it needs
 *   ...
 *   nb_fn_release(vg);
 */
#ifndef NABLA_TRANSFORMS_H
#define NABLA_TRANSFORMS_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_fn nb_fn;

/* A function body: reads in[0..n_in-1], writes out[0..n_out-1] (new tensors
 * made with nabla ops, or some of the inputs themselves), returns NB_OK or an
 * error status (nb_last_status() after a failed op is the usual choice). */
typedef nb_status (*nb_fn_body)(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out);

/* NULL + NB_ERR_NULL if body is NULL; NB_ERR_ARG unless 0 <= n_in, 1 <= n_out. */
nb_fn *nb_fn_create(nb_fn_body body, void *user, int n_in, int n_out);
nb_fn *nb_fn_retain(nb_fn *f);
void nb_fn_release(nb_fn *f);    /* NULL is ignored */
int nb_fn_n_in(const nb_fn *f);  /* -1 for NULL */
int nb_fn_n_out(const nb_fn *f); /* -1 for NULL */

/* Calls f: in[0..n_in-1] must be non-NULL; writes n_out new tensors to out,
 * registered in the caller's scope. Tensors the body makes and does not
 * return are released when nb_call returns. On error every out[k] is NULL. */
nb_status nb_call(nb_fn *f, nb_tensor *const *in, nb_tensor **out);

/* ---- functional transforms (JAX semantics) ----------------------------------------
 * argnums lists the differentiated inputs (negative counts from the end; an
 * nb_axes list holds at most NB_MAX_DIMS; NB_ALL = every input, however many;
 * nb_grad_argnums takes a list of any length); listed inputs must be
 * floating-point tensors. Gradients have the shape and dtype of their input.
 * With NB_ALL, integer and bool inputs are passed through: their "gradient"
 * is zeros of their shape and dtype (a token batch beside the weights).
 * Each returns a new nb_fn, NULL on a bad argument (argnums out of range or
 * repeated, NULL f). A function of trees (nabla/tree.h) is accepted by
 * nb_grad, nb_value_and_grad (and their _argnums forms), nb_jit, nb_vmap and
 * nb_checkpoint; argnums then count trees. */

/* out: one gradient per argnum. f's out[0] must have exactly one element. */
nb_fn *nb_grad(nb_fn *f, nb_axes argnums);
/* out: f's outputs, then one gradient (of out[0]) per argnum. */
nb_fn *nb_value_and_grad(nb_fn *f, nb_axes argnums);
/* The same with argnums[0..n-1], n >= 1, of any length. */
nb_fn *nb_grad_argnums(nb_fn *f, const int *argnums, int n);
nb_fn *nb_value_and_grad_argnums(nb_fn *f, const int *argnums, int n);
/* in: primals (n_in), then one cotangent per output (n_out, each of the
 * output's shape and dtype). out: f's outputs, then one cotangent per input
 * (zeros for integer inputs and inputs the outputs do not depend on). */
nb_fn *nb_vjp_fn(nb_fn *f);
/* in: primals (n_in), then one tangent per input (of its shape and dtype).
 * out: f's outputs, then one tangent per output (zeros for integer outputs). */
nb_fn *nb_jvp_fn(nb_fn *f);
/* Jacobians d out[o] / d in[a] for every output o and argnum a (in that order,
 * output-major), each of shape out.shape + in.shape (JAX). jacrev runs one
 * reverse sweep per output element, jacfwd one forward sweep per input element,
 * all over one trace of f. */
nb_fn *nb_jacrev(nb_fn *f, nb_axes argnums);
nb_fn *nb_jacfwd(nb_fn *f, nb_axes argnums);
/* nb_jacfwd(nb_jacrev(f, argnums), argnums) for one output: the n_a * n_a
 * blocks d2 out / d in[a] d in[b], each of shape out.shape + in[a] + in[b]. */
nb_fn *nb_hessian(nb_fn *f, nb_axes argnums);

/* ---- vmap, jit, checkpoint ------------------------------------------------------------ */
/* in_axes value of an input that is not mapped (the same for every example). */
#define NB_NOT_MAPPED (-(1 << 30))

/* Vectorizing map (JAX semantics). in_axes[k] (n_in entries; NULL = all 0) is
 * the axis of input k that is mapped over, negative counting from the end, or
 * NB_NOT_MAPPED; at least one input must be mapped, and every mapped input
 * must have the same size B along its axis. f sees one example: mapped inputs
 * without their axis. out_axes[j] (n_out entries; NULL = all 0) is where
 * output j's batch axis goes (negative counts from the end of the result);
 * outputs that do not depend on a mapped input are broadcast along it.
 * Each op is batched by its own rule (a vmapped matmul is one batched
 * matmul); nested vmaps stack batch axes. */
nb_fn *nb_vmap(nb_fn *f, const int *in_axes, const int *out_axes);

/* The same function, traced once per input signature (shapes and dtypes)
 * into a program that later calls replay without calling f's body: a call
 * costs microseconds, whatever the body does in C. At top level the outputs
 * come back realized: on plain arguments (realized, no nb_backward
 * provenance, the first call's layouts) the program runs as an executable
 * planned once, with no graph recorded and no plan looked up per call
 * (otherwise it is replayed as one graph, its plan cached); under
 * another transform the program is recorded into the enclosing trace, so
 * jit composes with every transform. The last 16 signatures are kept (least
 * recently used out); nb_stats counts jit_cache_hits / jit_cache_misses.
 * As in JAX, the body must be pure: C-side effects happen only while
 * tracing, and nb_rand inside the body is drawn once, at the trace.
 * Tensors the body captures from outside (through `user`) are read when a
 * call runs (nb_assign on them is seen), and a call never uses a tensor the
 * body no longer reads: when the body captured any, each call first runs it
 * again on placeholders (recording, not computing; its C side effects
 * happen again) to check that it reads the same tensors, and traces anew
 * when a captured pointer was swapped. Pass values that change from call to
 * call as arguments (trees hold any number, nabla/tree.h): then the body
 * runs only when a new signature is traced. */
nb_fn *nb_jit(nb_fn *f);

/* The same function, but its internals are not kept for the backward pass:
 * a derivative recomputes them from f's inputs (gradient checkpointing,
 * jax.checkpoint). Forward values and derivatives are unchanged; peak memory
 * during a backward drops to the checkpointed segments' inputs plus one
 * segment's internals at a time. */
nb_fn *nb_checkpoint(nb_fn *f);

/* ---- control flow -----------------------------------------------------------------------
 * Bodies are nb_fn, traced once per call into programs; traceable (usable
 * inside every transform), vmappable and differentiable. Tensors a body
 * captures from outside are passed as hidden operands, so derivatives flow
 * to them too. A predicate is a one-element bool tensor (any shape). Each
 * call records one lazy op, also at top level (a predicate is read only when
 * the result is realized), and its outputs are new tensors in the caller's
 * scope. On error every output is NULL. */

/* out = pred ? then_fn(ops) : else_fn(ops). Both branches take n_ops inputs and
 * must give outputs of equal shapes and dtypes (nb_fn_n_out of each). Under
 * vmap with a batched pred both branches run and each element selects. */
nb_status nb_cond(nb_tensor *pred, nb_fn *then_fn, nb_fn *else_fn, nb_tensor *const *ops, int n_ops,
                  nb_tensor **out);
/* carry = init; while (cond_fn(carry)) carry = body_fn(carry); out = carry.
 * cond_fn: n -> 1 (a one-element bool), body_fn: n -> n of the same types,
 * n >= 1. Forward-mode differentiable; reverse mode needs a static trip count
 * (nb_fori_loop, nb_scan) and is an NB_ERR_ARG error. Under vmap with a
 * batched predicate the loop runs until every example is done, finished
 * examples keeping their carry. */
nb_status nb_while_loop(nb_fn *cond_fn, nb_fn *body_fn, nb_tensor *const *init, int n,
                        nb_tensor **out);
/* Scans body over axis 0 of the xs (n_xs >= 1, equal lengths T >= 0):
 * body: (carry[n_carry], x slices[n_xs]) -> (carry[n_carry], y[body n_out - n_carry]);
 * carry_out gets the final carry, ys[j] the y[j] stacked on a new axis 0 (in
 * step order of the xs: with reverse the scan runs from T-1 down to 0 and
 * ys[t] is still step t's output, as jax.lax.scan(reverse=True)). n_carry may
 * be 0 (a map; carry_out may then be NULL), and so may the number of ys (ys
 * may then be NULL). Differentiable in both modes; reverse mode runs the
 * forward scan once more to recover the carry entering each step. */
nb_status nb_scan(nb_fn *body, nb_tensor *const *init, int n_carry, nb_tensor *const *xs, int n_xs,
                  bool reverse, nb_tensor **carry_out, nb_tensor **ys);
/* nb_scan without xs (jax.lax.scan(f, init, xs=None, length=length)): body
 * takes the n_carry carries and gives (carry[n_carry], y...); it runs length
 * >= 0 times and ys[j] stacks the y[j] on a new axis 0. Differentiable and
 * vmappable as nb_scan. */
nb_status nb_scan_length(nb_fn *body, nb_tensor *const *init, int n_carry, int64_t length,
                         bool reverse, nb_tensor **carry_out, nb_tensor **ys);
/* for (i = lower; i < upper; i++) carry = body(i, carry): body takes a 0-d
 * i64 index then the n >= 1 carries, and gives n carries. A static trip count,
 * so it is differentiable in both modes (it is a scan over arange). */
nb_status nb_fori_loop(int64_t lower, int64_t upper, nb_fn *body, nb_tensor *const *init, int n,
                       nb_tensor **out);

/* ---- imperative autodiff (PyTorch semantics) -------------------------------------
 * A tensor marked with nb_set_requires_grad is a leaf: ops on it (and on their
 * results) keep their provenance; nb_backward(loss) runs the VJP rules over that
 * provenance, adds d loss / d leaf into each leaf's .grad, and then frees the
 * provenance (a second nb_backward through the same graph is an error, as
 * PyTorch without retain_graph). The loss and the new gradients are computed in
 * one realization, which frees the forward's intermediates as it goes: each
 * dies after the backward's last use of it, even when a scope holds it, so
 * imperative training peaks near the functional style's memory. Such an
 * intermediate read afterwards is recomputed (lazily) from the values its
 * inputs had (an nb_assign'd parameter's old buffer is kept for it while the
 * intermediate lives). Tensors made without requires-grad inputs keep nothing. */

/* Returns t. Only floating-point tensors may require gradients. on = false
 * makes t an ordinary tensor again (its .grad is kept). */
nb_tensor *nb_set_requires_grad(nb_tensor *t, bool on);
bool nb_requires_grad(const nb_tensor *t);
/* loss must have one element and depend on a tensor that requires grad. */
nb_status nb_backward(nb_tensor *loss);
/* The accumulated gradient of a leaf (registered in the current scope), or
 * NULL (no error) when none has been accumulated since creation / zero_grad. */
nb_tensor *nb_grad_of(nb_tensor *leaf);
/* Drops the leaf's gradient (PyTorch's set_to_none): the next nb_backward
 * starts from nothing. */
void nb_zero_grad(nb_tensor *leaf);
/* The same value, cut from every gradient: no provenance (imperative) and a
 * zero derivative under the transforms (JAX's stop_gradient). A view: no copy. */
nb_tensor *nb_detach(nb_tensor *t);
/* Rebinds dst's value to src's (same shape; converted to dst's dtype and moved
 * to dst's device): same handle, same requires-grad flag and .grad. An in-place update such as
 * w = w - lr * g:  nb_assign(w, nb_sub(w, nb_mul_scalar(g, lr))).
 * What it realizes, in one plan: src, and every pending tensor that reads
 * dst (directly or through other pending tensors) and is registered in one
 * of the calling thread's scopes, so values computed before the assign (a
 * loss you print afterwards) keep dst's old value. A lazy tensor (a result
 * a realization left pending to recompute on demand) that reads dst is not
 * run: it is pointed at dst's old buffer. Pending tensors that do not read
 * dst stay pending; tensors you hold outside any scope (nb_retain, a tree's
 * own reference) are not looked at: realize them first if they read dst.
 * dst's old value dies in that plan, so an elementwise update writes over
 * dst's buffer when nothing else shares it. Neither may be traced (inside a
 * transform, return new values instead). */
nb_status nb_assign(nb_tensor *dst, nb_tensor *src);
/* nb_assign of src[k] to dst[k] for k < n, all in one plan: every src and
 * every scope-held pending tensor that reads any dst are realized together
 * (each sees every dst's old value), then each dst is rebound. An optimizer
 * step over 100 parameters is one realization, not 100. The dsts must be
 * distinct (NB_ERR_ARG); a src may be another dst (a swap). Sharded dsts are
 * assigned after the others, one by one. */
nb_status nb_assign_n(nb_tensor *const *dst, nb_tensor *const *src, int n);

/* No-grad mode (torch.no_grad): between nb_no_grad_begin and the matching
 * nb_no_grad_end, ops on tensors that require grad record no provenance, so
 * inference keeps no graph for nb_backward (nb_backward of such a result is
 * an error: it depends on no tensor that requires grad). Nested pairs count;
 * per thread. The transforms are unaffected. nb_no_grad_end without a begin
 * is NB_ERR_SCOPE. */
void nb_no_grad_begin(void);
nb_status nb_no_grad_end(void);
/* False between nb_no_grad_begin and its end (and while nb_backward builds
 * its graph). */
bool nb_is_grad_enabled(void);

#ifdef __cplusplus
}
#endif
#endif
