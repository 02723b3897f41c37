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
 * argnums lists the differentiated inputs (negative counts from the end;
 * NB_ALL = every input); they must be floating-point tensors. Gradients have the
 * shape and dtype of their input. Each returns a new nb_fn, NULL on a bad
 * argument (argnums out of range or repeated, NULL f). */

/* out: one gradient per argnum. f's out[0] must have exactly one element. */
nb_fn *nb_grad(nb_fn *f, nb_axes argnums);
/* out: f's outputs, then one gradient (of out[0]) per argnum. */
nb_fn *nb_value_and_grad(nb_fn *f, nb_axes argnums);
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

/* ---- imperative autodiff (PyTorch semantics) -------------------------------------
 * A tensor marked with nb_set_requires_grad is a leaf: ops on it (and on their
 * results) keep their provenance; nb_backward(loss) runs the VJP rules over that
 * provenance, adds d loss / d leaf into each leaf's .grad, and then frees the
 * provenance (a second nb_backward through the same graph is an error, as
 * PyTorch without retain_graph). The loss and the new gradients are computed in
 * one realization. Tensors made without requires-grad inputs keep nothing. */

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
/* Rebinds dst's value to src's (same shape; converted to dst's dtype): same
 * handle, same requires-grad flag and .grad. An in-place update such as
 * w = w - lr * g:  nb_assign(w, nb_sub(w, nb_mul_scalar(g, lr))).
 * Every pending tensor in the calling thread's scopes is realized first, so
 * values computed before the assign (a loss you print afterwards) see the old
 * value of dst; tensors you hold outside any scope must be realized by you.
 * Neither may be traced (inside a transform, return new values instead). */
nb_status nb_assign(nb_tensor *dst, nb_tensor *src);

#ifdef __cplusplus
}
#endif
#endif
