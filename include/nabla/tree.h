/* nabla/tree.h — parameter trees: a model's tensors as one value.
 *
 * An nb_tree is an ordered collection of named tensors. Names nest with dots
 * ("h.0.attn.w_q"): nb_tree_subtree takes the part under a prefix and
 * nb_tree_set_tree puts a tree under one, so a model is built from its
 * layers' trees. Transforms (nb_grad, nb_value_and_grad, nb_jit, nb_vmap,
 * nb_checkpoint), optimizers (nabla/optim.h) and I/O take trees where a
 * model has many tensors; a tree holds any number of them.
 *
 * Ownership: trees are reference counted (nb_tree_create gives one
 * reference; nb_tree_release drops one). A tree holds a reference to each
 * of its tensors, outside scopes, as nb_retain does. Tensors a function of
 * this header makes (nb_tree_map's results, the outputs of nb_call_trees)
 * are also registered in the caller's scope, like every new tensor, so
 * nb_assign sees them while that scope is open. nb_tree_get and nb_tree_at
 * return borrowed pointers: valid while the tree holds the tensor.
 *
 * Leaves of an integer or bool dtype are carried along but never
 * differentiated, scaled or decayed: gradients give them zeros, nb_tree_axpy
 * and the optimizers pass them through.
 */
#ifndef NABLA_TREE_H
#define NABLA_TREE_H

#include "transforms.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_tree nb_tree;

/* ---- the container ---------------------------------------------------------------- */
/* An empty tree (NULL + NB_ERR_OOM when out of memory). */
nb_tree *nb_tree_create(void);
nb_tree *nb_tree_retain(nb_tree *t); /* returns t; NULL is ignored */
void nb_tree_release(nb_tree *t);    /* NULL is ignored */

/* Binds name to x: a new name is appended, an existing one keeps its place
 * and drops its old tensor. The tree retains x. A name is non-empty, at
 * most 255 bytes, and its dot-separated parts are non-empty ("a..b", ".a"
 * and "a." are NB_ERR_ARG errors). */
nb_status nb_tree_set(nb_tree *t, const char *name, nb_tensor *x);
/* The tensor bound to name (borrowed), or NULL with no error when there is
 * none (NULL + NB_ERR_NULL for a NULL argument). */
nb_tensor *nb_tree_get(const nb_tree *t, const char *name);
/* Index of name, or -1 when there is none. */
int nb_tree_find(const nb_tree *t, const char *name);
/* Number of tensors (-1 for NULL); name and tensor of entry i in order
 * (NULL + NB_ERR_INDEX when i is out of range). */
int nb_tree_len(const nb_tree *t);
const char *nb_tree_name(const nb_tree *t, int i);
nb_tensor *nb_tree_at(const nb_tree *t, int i);
/* Removes name (the rest keep their order); NB_ERR_ARG when it is absent. */
nb_status nb_tree_remove(nb_tree *t, const char *name);

/* A new tree with the same names bound to the same tensors. */
nb_tree *nb_tree_copy(const nb_tree *t);
/* The entries whose name starts with prefix + "." (prefix "" or NULL: all),
 * in order, with that part of the name removed: nb_tree_subtree(gpt, "h.0")
 * holds "attn.w_q", "mlp.w1", ... An empty tree when none match. */
nb_tree *nb_tree_subtree(const nb_tree *t, const char *prefix);
/* Binds prefix + "." + name to every tensor of sub, in sub's order (prefix
 * "" or NULL: the names as they are), as nb_tree_set does. */
nb_status nb_tree_set_tree(nb_tree *t, const char *prefix, const nb_tree *sub);
/* The same names in the same order (and each pair of tensors of one shape
 * and dtype when check_types). False for NULL. */
bool nb_tree_same_structure(const nb_tree *a, const nb_tree *b, bool check_types);
/* Total number of elements (-1 for NULL). */
int64_t nb_tree_numel(const nb_tree *t);
/* Realizes every tensor of trees[0..n-1] as one planned graph (nb_eval). */
nb_status nb_tree_eval(nb_tree *const *trees, int n);
/* Prints each name with its dtype and shape, one per line, to f. */
void nb_tree_fprint(FILE *f, const nb_tree *t);

/* ---- maps ----------------------------------------------------------------------------
 * The callback gets each entry's name and tensor(s) and returns the new
 * tensor for that name (a new tensor or one of its arguments). NULL is an
 * error: the map stops there and returns NULL, keeping the callback's error
 * (or recording one naming the entry). */
typedef nb_tensor *(*nb_tree_map_fn)(void *user, const char *name, nb_tensor *x);
typedef nb_tensor *(*nb_tree_zip_fn)(void *user, const char *name, nb_tensor *const *xs, int n);
/* fn applied to every tensor of t: a new tree of the same names. */
nb_tree *nb_tree_map(const nb_tree *t, nb_tree_map_fn fn, void *user);
/* fn applied to the tensors of one name in trees[0..n-1]: the trees must
 * have the same names in the same order (NB_ERR_ARG naming the first
 * difference). A new tree of those names. */
nb_tree *nb_tree_zip(nb_tree *const *trees, int n, nb_tree_zip_fn fn, void *user);

/* ---- arithmetic on trees --------------------------------------------------------------- */
/* Zeros of each tensor's shape and dtype. */
nb_tree *nb_tree_zeros_like(const nb_tree *t);
/* alpha * x + y, name by name (the same names in the same order; each pair
 * of one shape): floating-point entries are computed in y's dtype, the
 * others are y's tensors passed through. nb_tree_axpy(1, updates, params)
 * is optax's apply_updates without nb_assign (for traced code). */
nb_tree *nb_tree_axpy(double alpha, const nb_tree *x, const nb_tree *y);
/* sqrt of the sum of squares of every floating-point element of t, a 0-d
 * tensor, computed in f32 (f64 when a leaf is f64). A tree without
 * floating-point leaves gives 0. */
nb_tensor *nb_tree_global_norm(const nb_tree *t);

/* ---- functions of trees ------------------------------------------------------------------
 * A function of trees reads in[0..n_in-1] and writes out[0..n_out-1]: new
 * trees it made (or one of in, with nb_tree_retain); the caller takes the
 * reference. Its tensors follow the rules of an nb_fn body.
 *
 * Every transform that takes an nb_fn accepts one of these for nb_grad,
 * nb_value_and_grad, nb_jit, nb_vmap and nb_checkpoint (the others and
 * nb_call refuse it: NB_ERR_ARG). argnums then count trees: every
 * floating-point leaf of a listed tree is differentiated, whatever their
 * number, and its gradient comes back in a tree of the same names (zeros
 * for integer leaves). nb_grad's loss is the first tensor of f's first
 * output tree (one element). nb_vmap's in_axes / out_axes give one axis per
 * tree, used for each of its tensors. Transforms see f as a function of the
 * trees' tensors, flattened in order; they trace it once more per new
 * arrangement of names and dtypes, to learn its output names. */
typedef nb_status (*nb_tree_body)(void *user, nb_tree *const *in, int n_in, nb_tree **out,
                                  int n_out);
/* NULL + NB_ERR_NULL if body is NULL; NB_ERR_ARG unless 0 <= n_in and
 * 1 <= n_out. nb_fn_n_in / nb_fn_n_out count trees. */
nb_fn *nb_fn_create_trees(nb_tree_body body, void *user, int n_in, int n_out);
/* True when f takes trees (made by nb_fn_create_trees or a transform of one). */
bool nb_fn_takes_trees(const nb_fn *f);
/* Calls f on in[0..n_in-1] (non-NULL trees): writes n_out new trees to out
 * (the caller releases them); their tensors are also registered in the
 * caller's scope. On error every out[k] is NULL. */
nb_status nb_call_trees(nb_fn *f, nb_tree *const *in, nb_tree **out);

#ifdef __cplusplus
}
#endif
#endif
