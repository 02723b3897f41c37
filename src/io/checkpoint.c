/* src/io/checkpoint.c — nb_save_checkpoint / nb_load_checkpoint: a training
 * state (parameters, optimizer state, step, random key) as one safetensors
 * file (include/nabla/io.h): tensors "params.<name>", "opt.<name>", "step"
 * (0-d i64) and "key" (when given), metadata {"format": "nabla.checkpoint",
 * "version": "1"}. Built on the public tree and safetensors functions. */
#include "io.h"

#include <stdlib.h>

#define SAVE "nb_save_checkpoint"
#define LOAD "nb_load_checkpoint"

nb_status nb_save_checkpoint(const char *path, const nb_tree *params, const nb_tree *opt_state,
                             int64_t step, nb_tensor *key) {
  if (!path) return nbi_error(NB_ERR_NULL, SAVE ": path is NULL");
  if (!params) return nbi_error(NB_ERR_NULL, SAVE ": params is NULL");
  if (key && (nb_dtype_of(key) != NB_I64 || nb_numel(key) != 2))
    return nbi_error(NB_ERR_ARG, SAVE ": key is a %s tensor of %lld elements (a key is i64 [2])",
                     nb_dtype_name(nb_dtype_of(key)), (long long)nb_numel(key));
  nb_tree *all = nb_tree_create();
  if (!all) return nb_last_status();
  nb_scope_begin();
  const char *outer = nbi_error_context_begin(SAVE);
  nb_tensor *s = nb_from_data(&step, NB_SCALAR_SHAPE, NB_I64);
  nb_status st = s ? nb_tree_set_tree(all, "params", params) : nb_last_status();
  if (!st && opt_state) st = nb_tree_set_tree(all, "opt", opt_state);
  if (!st) st = nb_tree_set(all, "step", s);
  if (!st && key) st = nb_tree_set(all, "key", key);
  nbi_error_context_end(outer);
  const char *meta[4] = {"format", "nabla.checkpoint", "version", "1"};
  if (!st) st = nb_save_safetensors(path, all, meta, 2);
  nb_tree_release(all);
  nb_scope_end();
  return st;
}

nb_status nb_load_checkpoint(const char *path, nb_tree **params, nb_tree **opt_state, int64_t *step,
                             nb_tensor **key) {
  if (params) *params = NULL;
  if (opt_state) *opt_state = NULL;
  if (key) *key = NULL;
  if (!path) return nbi_error(NB_ERR_NULL, LOAD ": path is NULL");
  char **kv = NULL;
  int n_kv = 0;
  nb_tree *all = nb_load_safetensors_meta(path, &kv, &n_kv);
  if (!all) return nb_last_status();
  const char *format = NULL;
  for (int k = 0; k < n_kv; k++)
    if (!strcmp(kv[2 * k], "format")) format = kv[2 * k + 1];
  nb_status st = NB_OK;
  nb_tensor *s = nb_tree_get(all, "step"), *kt = nb_tree_get(all, "key");
  if (!format || strcmp(format, "nabla.checkpoint"))
    st = nbi_error(NB_ERR_IO,
                   LOAD ": %s: not a nabla checkpoint (no __metadata__ format "
                        "\"nabla.checkpoint\")",
                   path);
  else if (!s || nb_dtype_of(s) != NB_I64 || nb_numel(s) != 1)
    st = nbi_error(NB_ERR_IO, LOAD ": %s: the checkpoint has no i64 \"step\"", path);
  else if (kt && (nb_dtype_of(kt) != NB_I64 || nb_numel(kt) != 2))
    st = nbi_error(NB_ERR_IO, LOAD ": %s: the checkpoint's \"key\" is not i64 [2]", path);
  free(kv);
  int64_t sv = 0;
  if (!st) st = nb_to_host(s, &sv, sizeof sv);
  nb_tree *p = NULL, *o = NULL;
  if (!st && params && !(p = nb_tree_subtree(all, "params"))) st = nb_last_status();
  if (!st && opt_state && !(o = nb_tree_subtree(all, "opt"))) st = nb_last_status();
  if (st) {
    nb_tree_release(p), nb_tree_release(o), nb_tree_release(all);
    return st;
  }
  if (params) *params = p;
  if (opt_state) *opt_state = o;
  if (step) *step = sv;
  if (key) *key = kt; /* loaded tensors are in the caller's scope */
  nb_tree_release(all);
  return NB_OK;
}
