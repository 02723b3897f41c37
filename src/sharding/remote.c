/* src/sharding/remote.c — meshes spanning the processes of an mpirun job
 * (nb_mesh_world): remote blocks and the exchange that fetches the blocks of
 * other ranks a collective needs (contract: sharding.h, "meshes spanning
 * processes"). */
#include "sharding.h"
#include "../core/dist.h"
#include "../core/oprules.h"

#include <nabla/distributed.h>
#include <stdlib.h>

nb_mesh *nb_mesh_world(const char *axes) {
  nb_mesh *m = nbi_mesh_new("nb_mesh_world", axes, NULL, 0);
  if (!m) return NULL;
  int w = nb_world_size();
  if (m->n_dev % w != 0) {
    nbi_error(NB_ERR_SHARDING,
              "nb_mesh_world: \"%.200s\" has %d devices, which the job's %d processes do not "
              "divide",
              axes, m->n_dev, w);
    nb_mesh_release(m);
    return NULL;
  }
  m->n_ranks = w;
  m->rank = nb_rank();
  m->per_rank = m->n_dev / w;
  return m;
}

nb_tensor *nbi_remote_block(const nb_mesh *m, int d, const nb_shape *s, nb_dtype dt) {
  return nbi_remote_leaf(s, dt, m->dev_table[d]);
}

nb_status nbi_localize(const nb_mesh *m, nb_tensor **t) {
  if (m->n_ranks <= 1) return NB_OK;
  for (int d = 0; d < m->n_dev; d++) {
    if (nbi_mesh_local(m, d) || (t[d]->flags & NBI_T_REMOTE)) continue;
    nb_tensor *was = t[d];
    if (!(t[d] = nbi_remote_block(m, d, &was->shape, was->dtype))) return nb_last_status();
    for (int e = d + 1; e < m->n_dev; e++) /* one object: one remote block */
      if (t[e] == was && !nbi_mesh_local(m, e)) t[e] = t[d];
  }
  return NB_OK;
}

static int64_t bytes_of(const nb_tensor *t) {
  return nbi_numel(&t->shape) * (int64_t)nb_dtype_size(t->dtype);
}

nb_status nbi_fetch_blocks(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                           const bool *need, nb_tensor **got) {
  int R = m->n_ranks, me = m->rank, nd = m->n_dev;
  for (int s = 0; s < nd; s++)
    got[s] = phys[s];
  if (R <= 1) return NB_OK;
  int64_t *cnt = calloc((size_t)(2 * R), sizeof *cnt), *sc = cnt, *rc = cnt + R, sig = 0;
  if (!cnt) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  nb_status st = NB_OK;
  for (int s = 0; s < nd && !st; s++)
    for (int u = 0; u < R; u++) {
      if (!need[(size_t)s * (size_t)R + (size_t)u]) continue;
      int64_t b = bytes_of(phys[s]);
      sig += b + 1; /* an empty block counts too */
      if (nbi_mesh_local(m, s)) {
        sc[u] += b;
        if ((phys[s]->flags & (NBI_T_REQUIRES_GRAD | NBI_T_GRAD_PATH)) && !nbi_no_grad)
          st = nbi_error(NB_ERR_DISTRIBUTED,
                         "%s: on mesh %s, which spans %d processes, a collective reached a "
                         "value nb_backward would differentiate: nb_backward does not run "
                         "across processes (differentiate with nb_grad or nb_value_and_grad, "
                         "or compute under nb_no_grad)",
                         fn, m->text, R);
      }
      if (u == me) rc[nbi_mesh_rank_of(m, s)] += b;
    }
  int64_t ns = 0, nr = 0;
  for (int u = 0; u < R; u++)
    ns += sc[u], nr += rc[u];
  char *sb = st ? NULL : malloc((size_t)(ns ? ns : 1)),
       *rb = st ? NULL : malloc((size_t)(nr ? nr : 1));
  if (!st && (!sb || !rb)) st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  /* send: rank by rank, each block it needs from here in device order */
  int64_t off = 0;
  for (int u = 0; u < R && !st; u++)
    for (int s = 0; s < nd && !st; s++)
      if (nbi_mesh_local(m, s) && need[(size_t)s * (size_t)R + (size_t)u]) {
        int64_t b = bytes_of(phys[s]);
        st = nb_to_host(phys[s], sb + off, (size_t)b);
        off += b;
      }
  if (!st) st = nbi_dist_exchange(sb, sc, rb, rc, sig);
  /* receive: from rank by rank (devices in order, so rank order too) */
  off = 0;
  for (int s = 0; s < nd && !st; s++) {
    if (!need[(size_t)s * (size_t)R + (size_t)me]) continue;
    nb_tensor *t = nbi_leaf_alloc_on(fn, &phys[s]->shape, phys[s]->dtype, m->dev_table[s]);
    if (!t) {
      st = nb_last_status();
      break;
    }
    nbi_view v = nbi_tensor_view(t);
    int64_t b = bytes_of(phys[s]);
    if (b && (st = nbi_host_write(t->device, &v, rb + off, t->dtype))) break;
    off += b;
    got[s] = t;
  }
  free(sb);
  free(rb);
  free(cnt);
  return st;
}
