/* src/nn/nn_util.h — what the module files of src/nn share: parameter lookup
 * by (prefix, name) with shape checks, tree building that stops at the first
 * error, and the initializers and applies the bigger modules compose. Each
 * takes `fn`, the public function its errors name. Internal to src/nn. */
#ifndef NABLA_NN_UTIL_H
#define NABLA_NN_UTIL_H

#include "../core/nbi.h"

#include <stdlib.h>

enum { NBI_NN_NAME = 256 }; /* a tree name's bytes, with its terminator */

bool nbi_nn_check_float(const char *fn, nb_dtype dt);
bool nbi_nn_check_dim(const char *fn, const char *what, int64_t v); /* v >= 1 */
/* Whether p holds prefix + "." + name (prefix NULL or "": name). */
bool nbi_nn_has(const nb_tree *p, const char *prefix, const char *name);
/* The float tensor bound to prefix + "." + name, of rank ndim and dims (-1:
 * any size); NULL with an error naming fn and the full name otherwise. */
nb_tensor *nbi_nn_param(const char *fn, const nb_tree *p, const char *prefix, const char *name,
                        int ndim, const int64_t *dims);
/* nb_tree_set of x (false when x is NULL or the set fails). */
bool nbi_nn_set(nb_tree *t, const char *name, nb_tensor *x);
/* nb_tree_set_tree of sub under prefix, then releases sub (false when sub is NULL). */
bool nbi_nn_set_tree(nb_tree *t, const char *prefix, nb_tree *sub);
/* t when ok, else releases t and returns NULL. */
nb_tree *nbi_nn_finish(nb_tree *t, bool ok);

nb_tree *nbi_nn_linear_init(nb_tensor *key, int64_t in, int64_t out, bool bias, nb_dtype dt);
nb_tree *nbi_nn_norm_init(const char *fn, int64_t dim, bool bias, nb_dtype dt);
nb_tree *nbi_nn_mlp_init(nb_tensor *key, const int64_t *widths, int n_layers, bool bias,
                         nb_dtype dt);
/* x @ p[prefix.w_name] (+ p[prefix.b_name] when present). */
nb_tensor *nbi_nn_linear(const char *fn, const nb_tree *p, const char *prefix, const char *w_name,
                         const char *b_name, nb_tensor *x);
/* nb_layer_norm with p[prefix.w] and p[prefix.b] (when present). */
nb_tensor *nbi_nn_layer_norm(const char *fn, const nb_tree *p, const char *prefix, nb_tensor *x,
                             double eps);
/* The MLP of layers prefix.0, prefix.1, ... */
nb_tensor *nbi_nn_mlp(const char *fn, const nb_tree *p, const char *prefix, nb_tensor *x,
                      nb_activation_fn act);

#endif
