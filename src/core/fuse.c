/* src/core/fuse.c — the planner's fusion pass: which steps of a realization
 * run together as one kernel, and running such a group.
 *
 * A group is a run of consecutive steps (topological order); group[i] is the
 * first step of i's group (i itself when alone) and the group runs at its
 * last step. store[i]: member i's value is needed outside its group (held,
 * or read by a later step), so it gets a buffer; the others live in the
 * executor's tiles only.
 */
#include "nbi.h"

#include <stdlib.h>

/* Fusion on/off: on unless NABLA_NO_FUSION=1 (tests compare both). */
static int fusion = -1;
bool nbi_fusion_enabled(void) {
  if (fusion < 0) {
    const char *e = getenv("NABLA_NO_FUSION");
    fusion = !(e && e[0] == '1');
  }
  return fusion;
}
void nbi_set_fusion(bool on) { fusion = on; }

/* Groups consecutive fusible steps of one shape and dtype (nbi.h, "fusion"),
 * at most NBI_FUSE_MAX members and NBI_FUSE_MAX distinct outside operands. */
/* Adds t's inputs that are not members [first, i) nor already listed to ext;
 * returns the new count. */
static int group_operands(const nb_tensor *t, int first, int i, const nb_tensor **ext, int n) {
  for (int k = 0; k < t->n_in; k++) {
    const nb_tensor *x = t->in[k];
    bool known = x->mark >= first && x->mark < i;
    for (int e = 0; e < n && !known; e++)
      known = ext[e] == x;
    if (!known) ext[n++] = x;
  }
  return n;
}

void nbi_fuse_plan(nb_tensor *const *nodes, int n_nodes, const bool *held, int *group,
                   bool *store) {
  const nb_tensor *ext[NBI_FUSE_MAX + 3];
  int first = -1, n_ext = 0;
  for (int i = 0; i < n_nodes; i++) {
    const nb_tensor *t = nodes[i], *f = first >= 0 ? nodes[first] : NULL;
    bool fuse = nbi_fusion_enabled() && nbi_cpu_elementwise_fusible(t);
    if (fuse && f && t->dtype == f->dtype && nbi_shape_eq(&t->shape, &f->shape) &&
        i - first < NBI_FUSE_MAX) {
      int n = group_operands(t, first, i, ext, n_ext);
      if (n <= NBI_FUSE_MAX && (i - first + 1) + n <= NBI_FUSE_OPERANDS) {
        n_ext = n;
        group[i] = first;
        continue;
      }
    }
    group[i] = i; /* starts a group (or stays alone) */
    first = fuse ? i : -1;
    n_ext = fuse ? group_operands(t, i, i, ext, 0) : 0;
  }
  for (int i = 0; i < n_nodes; i++)
    store[i] = held[i];
  for (int i = 0; i < n_nodes; i++) {
    const nb_tensor *t = nodes[i];
    for (int k = 0; k < t->n_in; k++) {
      int c = t->in[k]->mark;
      if (c >= 0 && group[c] != group[i]) store[c] = true;
    }
  }
}

/* Runs steps first..end as one fused kernel: buffers only for the members whose
 * value is needed outside the group (a member the planner gave an input's
 * buffer to write in place keeps it). */
nb_status nbi_fuse_run(nb_tensor *const *nodes, int m, const bool *store) {
  nbi_view out[NBI_FUSE_MAX];
  nb_status st = NB_OK;
  for (int k = 0; k < m && !st; k++) {
    if (!store[k]) continue;
    nb_tensor *t = nodes[k];
    if (t->shard0.buf) {
      out[k] = nbi_tensor_view(t);
      continue;
    }
    nbi_buffer *b = nbi_buffer_alloc((size_t)nbi_numel(&t->shape) * nb_dtype_size(t->dtype));
    if (!b) {
      st = NB_ERR_OOM;
      break;
    }
    t->shard0.buf = b;
    t->shard0.offset = 0;
    nbi_contig_strides(&t->shape, t->shard0.strides);
    out[k] = nbi_tensor_view(t);
  }
  if (!st) st = nbi_cpu_elementwise_fused(nodes, m, store, out);
  if (st)
    for (int k = 0; k < m; k++) {
      nbi_buffer_release(nodes[k]->shard0.buf);
      nodes[k]->shard0.buf = NULL;
    }
  else
    nbi_stats_kernel();
  return st;
}
