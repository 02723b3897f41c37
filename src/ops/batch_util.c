/* src/ops/batch_util.c — helpers the batching (vmap) rules share. The batch
 * dim of a batched value is always dim 0 (see nbi_vmap_rule in nbi.h). */
#include "rule_util.h"
#include "../core/oprules.h"

#include <stdlib.h>

nb_tensor *nbi_bat_expand(nb_tensor *t, bool batched, int64_t B) {
  if (!t || batched) return t;
  nb_shape s = {.ndim = t->shape.ndim + 1, .dims = {B}};
  if (s.ndim > NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "nb_vmap: a batched value would have rank %d (the maximum is %d)",
              s.ndim, NB_MAX_DIMS);
    return NULL;
  }
  memcpy(s.dims + 1, t->shape.dims, sizeof(int64_t) * (size_t)t->shape.ndim);
  return nb_broadcast_to(t, s);
}

nb_tensor *nbi_bat_align(nb_tensor *t, bool batched, int rank) {
  if (!t || !batched || t->shape.ndim - 1 >= rank) return t;
  int add = rank - (t->shape.ndim - 1);
  nb_shape s = {.ndim = t->shape.ndim + add, .dims = {t->shape.dims[0]}};
  if (s.ndim > NB_MAX_DIMS) {
    nbi_error(NB_ERR_SHAPE, "nb_vmap: a batched value would have rank %d (the maximum is %d)",
              s.ndim, NB_MAX_DIMS);
    return NULL;
  }
  for (int d = 1; d <= add; d++)
    s.dims[d] = 1;
  memcpy(s.dims + 1 + add, t->shape.dims + 1, sizeof(int64_t) * (size_t)(t->shape.ndim - 1));
  return nb_reshape(t, s);
}

int nbi_bat_axis(int axis, int ndim) { return (axis < 0 ? axis + ndim : axis) + 1; }

nb_tensor *nbi_bat_moveaxis(nb_tensor *t, int from, int to) {
  if (!t || from == to) return t;
  int n = t->shape.ndim, order[NB_MAX_DIMS], m = 0;
  for (int d = 0; d < n; d++)
    if (d != from) order[m++] = d;
  nb_axes perm = {.n = n};
  for (int d = 0, k = 0; d < n; d++)
    perm.v[d] = d == to ? from : order[k++];
  return nb_permute(t, perm);
}

nb_tensor *nbi_bat_index(nb_tensor *t, int64_t b) {
  if (!t) return NULL;
  int64_t starts[NB_MAX_DIMS] = {b}, stops[NB_MAX_DIMS] = {b + 1}, steps[NB_MAX_DIMS];
  for (int d = 0; d < t->shape.ndim; d++) {
    if (d) starts[d] = 0, stops[d] = t->shape.dims[d];
    steps[d] = 1;
  }
  return nb_squeeze(nb_slice(t, starts, stops, steps), NB_AXES(0));
}

nb_tensor *nbi_bat_loop(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B,
                        nb_tensor *(*apply)(nb_tensor *y, nb_tensor *const *in)) {
  if (B == 0) {
    nb_shape s = {.ndim = y->shape.ndim + 1, .dims = {0}};
    memcpy(s.dims + 1, y->shape.dims, sizeof(int64_t) * (size_t)y->shape.ndim);
    return nb_zeros(s, y->dtype);
  }
  nb_tensor **rows = malloc(sizeof *rows * (size_t)B);
  nb_tensor *in_local[8], **in = y->n_in <= 8 ? in_local : malloc(sizeof *in * (size_t)y->n_in);
  nb_tensor *r = NULL;
  if (!rows || !in) {
    nbi_error(NB_ERR_OOM, "nb_vmap: out of memory");
    goto done;
  }
  for (int64_t b = 0; b < B; b++) {
    for (int k = 0; k < y->n_in; k++)
      in[k] = batched[k] ? nbi_bat_index(bin[k], b) : bin[k];
    if (!(rows[b] = apply(y, in))) goto done;
  }
  r = nb_stack(rows, (int)B, 0);
done:
  free(rows);
  if (in != in_local) free(in);
  return r;
}
