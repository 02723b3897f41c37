/* src/transforms/tree.h — internal contract of parameter trees (tree.c) and
 * of the transforms of functions of trees (tree_fn.c); src/train builds on it.
 *
 * Packs. Entries whose values are consecutive parts of one 1-D tensor (an
 * optimizer's update computed once for a whole dtype group, parameters
 * rebound into one buffer by nb_apply_updates) are recorded as a pack, so
 * the next whole-group computation reads that tensor instead of
 * concatenating the entries again: one pass per group instead of one
 * kernel per tensor. A pack is only a hint: it is used while every entry
 * still holds the tensor recorded for it, with the value it had (pending, or
 * realized in the flat tensor's buffer at its offset); otherwise the entries
 * are concatenated afresh.
 */
#ifndef NABLA_TREE_INTERNAL_H
#define NABLA_TREE_INTERNAL_H

#include <nabla/tree.h>

#include "transforms.h"

typedef struct nbi_tree_pack {
  nb_tensor *flat;  /* retained: 1-D, the entries' values one after another */
  int n;            /* entries in the pack */
  int *idx;         /* [n] entry indices, in the order of their parts */
  nb_tensor **part; /* [n] retained: the tensor entry idx[k] held when packed */
  int64_t *off;     /* [n + 1] element offsets of the parts in flat */
} nbi_tree_pack;

struct nb_tree {
  int32_t refcount;
  int n, cap;
  char **names;   /* [n] owned */
  nb_tensor **ts; /* [n] retained */
  int *slot;      /* open-addressing index of names: entry + 1, 0 empty */
  int n_slot;     /* a power of two > 2 n, or 0 */
  nbi_tree_pack *packs;
  int n_packs;
  /* Tensors to realize with this tree's entries (an optimizer's new state
   * beside the updates it computed), retained. */
  nb_tensor **extra;
  int n_extra;
};

/* Validates a public tree argument (NB_ERR_NULL naming fn and what). */
nb_status nbi_tree_check(const char *fn, const char *what, const nb_tree *t);
/* Appends name -> x without the public checks (x retained). */
nb_status nbi_tree_push(const char *fn, nb_tree *t, const char *name, nb_tensor *x);
/* Entry i's tensor replaced by x (retained); packs that hold i are dropped. */
void nbi_tree_replace(nb_tree *t, int i, nb_tensor *x);
/* The same names as a in the same order (NB_ERR_ARG naming fn and the
 * first difference). */
nb_status nbi_tree_same_names(const char *fn, const nb_tree *a, const nb_tree *b);

/* The entries idx[0..n-1] of t, flattened and concatenated into one 1-D
 * tensor (a new tensor in the current scope): t's pack of exactly those
 * entries when it is still valid, else nb_concat of their reshapes (one
 * entry: just the reshape). The entries have one dtype and device. */
nb_tensor *nbi_tree_flat(const char *fn, const nb_tree *t, const int *idx, int n);
/* Binds entries idx[0..n-1] of t to consecutive parts of the 1-D flat
 * (reshaped to shapes[k]) and records the pack (flat retained). The entries
 * must already exist. */
nb_status nbi_tree_unflat(const char *fn, nb_tree *t, const int *idx, int n, const nb_shape *shapes,
                          nb_tensor *flat);
/* Records a pack of entries idx[0..n-1] over flat as they are now (after an
 * assignment rebound them into flat's buffer). */
nb_status nbi_tree_pack_add(const char *fn, nb_tree *t, const int *idx, int n, nb_tensor *flat);
/* The pack of t holding exactly entries idx[0..n-1] in that order, valid
 * now, or NULL. Frees t's packs that are no longer valid (a hint only: t's
 * value does not change, so t may be const to the caller). */
const nbi_tree_pack *nbi_tree_pack_find(const nb_tree *t, const int *idx, int n);
/* Adds x to t's companions (retained). */
nb_status nbi_tree_extra_add(const char *fn, nb_tree *t, nb_tensor *x);

/* ---- functions of trees (tree_fn.c) ----------------------------------------------------
 * The public transforms hand a function of trees to these (nb_grad, ...
 * dispatch on nbi_fn_is_tree); each returns a new function of trees. */
bool nbi_fn_is_tree(const nb_fn *f);
nb_fn *nbi_tree_grad(const char *fn, nb_fn *f, const int *argnums, int n, bool with_value);
nb_fn *nbi_tree_jit(nb_fn *f);
nb_fn *nbi_tree_vmap(nb_fn *f, const int *in_axes, const int *out_axes);
nb_fn *nbi_tree_checkpoint(nb_fn *f);
/* A function of trees seen as its flat form for one arrangement of its
 * inputs (src/autoshard): the function of the leaves (tree k's after tree
 * k - 1's, each tree's in nb_tree_name order), its input and output
 * arrangements (names and dtypes). nbi_tree_flatten_fn: NULL + error
 * (NB_ERR_ARG: f takes tensors; NB_ERR_NULL: a NULL tree). */
typedef struct nbi_tree_flatfn nbi_tree_flatfn;
nbi_tree_flatfn *nbi_tree_flatten_fn(const char *fn, nb_fn *f, nb_tree *const *in);
void nbi_tree_flat_free(nbi_tree_flatfn *t);
nb_fn *nbi_tree_flat_fn(const nbi_tree_flatfn *t); /* borrowed */
/* The flat index of leaf name of input (out: output) tree `tree`, or -1. */
int nbi_tree_flat_leaf(const nbi_tree_flatfn *t, bool out, int tree, const char *name);
/* xs[i] = the leaves of in (borrowed); NB_ERR_ARG unless in has t's input
 * arrangement. */
nb_status nbi_tree_flat_inputs(const char *fn, const nbi_tree_flatfn *t, nb_tree *const *in,
                               nb_tensor **xs);
/* The output trees of t's arrangement holding ys (one per output leaf). */
nb_status nbi_tree_flat_outputs(const char *fn, const nbi_tree_flatfn *t, nb_tensor *const *ys,
                                nb_tree **out);

#endif
