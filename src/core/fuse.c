/* src/core/fuse.c — the planner's fusion pass: which steps of a realization
 * run together as one kernel, and running such a group.
 *
 * A group is a run of consecutive steps (topological order): elementwise
 * steps of one shape, a row group (elementwise steps, reductions and axis
 * ops along trailing axes, per-row and global values), or a GEMM epilogue
 * (matmul, bias add, activation; k_gemm_epi.c); nbi.h, "fusion";
 * group[i] is the first step of i's group (i itself when alone) and the group
 * runs at its last step. store[i]: member i's value is needed outside its group (held,
 * or read by a later step), so it gets a buffer; the others live in the
 * executor's tiles only.
 */
#include "nbi.h"

#include <stdlib.h>

#include "../backends/cpu/k_gemm_epi.h"

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

/* Groups consecutive fusible steps (nbi.h, "fusion"): elementwise steps of one
 * dtype and one full shape F, and, once a row op along F's trailing axes
 * [ra, ndim) joins, such row ops, steps on the per-row shape and then global
 * members. At most NBI_FUSE_MAX members and NBI_FUSE_MAX distinct outside
 * operands. The grouping reads only the graph's structure (ops, shapes,
 * dtypes, attributes, edges), so it is part of the cached plan. */
typedef struct fgroup {
  int first, n_ext, ra; /* ra < 0: no row op yet (an elementwise group) */
  uint32_t global;      /* members (bit i - first) that come after the rows */
  nb_shape full;
  const nb_tensor *ext[NBI_FUSE_MAX + 3];
} fgroup;

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

/* s without its leading size-1 dims. */
static nb_shape strip_ones(const nb_shape *s) {
  nb_shape r = {0};
  int d = 0;
  while (d < s->ndim && s->dims[d] == 1)
    d++;
  for (; d < s->ndim; d++)
    r.dims[r.ndim++] = s->dims[d];
  return r;
}

/* F's row dims [0, ra), followed by ones when keep (a keepdims reduction's
 * shape), without leading ones. */
static nb_shape row_shape(const fgroup *g, bool keep) {
  nb_shape r = {.ndim = keep ? g->full.ndim : g->ra};
  for (int d = 0; d < r.ndim; d++)
    r.dims[d] = d < g->ra ? g->full.dims[d] : 1;
  return strip_ones(&r);
}

/* s is a per-row shape of g: one value per row; broadcast ones (keepdims) if
 * bcast, else either form. */
static bool per_row(const fgroup *g, const nb_shape *s, bool bcast) {
  nb_shape a = strip_ones(s), k = row_shape(g, true), f = row_shape(g, false);
  return nbi_shape_eq(&a, &k) || (!bcast && nbi_shape_eq(&a, &f));
}

/* If t is a reduction or an axis op a row group can hold, ra = the first of
 * the trailing axes it works along (its input's rows are axes [0, ra)), else
 * -1. Rows must have 2 to NBI_FUSE_ROW_MAX elements and the input must not be
 * empty. */
static int row_op(const nb_tensor *t) {
  bool axis_op = nbi_cpu_axis_row_fusible(t);
  if (!axis_op && !nbi_cpu_reduce_row_fusible(t)) return -1;
  const nb_shape *s = &t->in[0]->shape;
  int ra = s->ndim;
  if (axis_op) {
    ra = s->ndim - 1;
  } else {
    uint32_t mask = (uint32_t)t->attrs.i[0];
    while (ra > 0 && (mask >> (ra - 1)) & 1u)
      ra--;
    if (mask & ((1u << ra) - 1u)) return -1;
  }
  if (ra < 0 || ra == s->ndim) return -1;
  int64_t n = 1;
  for (int d = ra; d < s->ndim; d++)
    n *= s->dims[d];
  return n >= 2 && n <= NBI_FUSE_ROW_MAX && nbi_numel(s) > 0 ? ra : -1;
}

/* Whether step i (node t, elementwise when ew) is a global member of row group
 * g: computed once after the rows, from a reduction of all of a per-row
 * member (a loss's mean over the batch) and elementwise ops or views on such
 * single values. Needs rows >= 2, so that single values and per-row values
 * differ. */
static bool global_member(const fgroup *g, nb_tensor *const *nodes, int i, bool ew) {
  const nb_tensor *t = nodes[i];
  if (g->ra < 0 || nbi_numel(&t->shape) != 1 || t->n_in < 1) return false;
  int64_t rows = 1;
  for (int d = 0; d < g->ra; d++)
    rows *= g->full.dims[d];
  if (rows < 2) return false;
  const nb_tensor *x = t->in[0];
  bool member = x->mark >= g->first && x->mark < i;
  if (nbi_cpu_reduce_row_fusible(t)) /* of a per-row member */
    return member && !((g->global >> (x->mark - g->first)) & 1u) && per_row(g, &x->shape, false);
  if (!ew && !(nbi_fuse_view(t) && x->dtype == t->dtype)) return false;
  int n_member = 0; /* every member input is global, at least one unless already after the rows */
  for (int k = 0; k < t->n_in; k++) {
    int c = t->in[k]->mark;
    if (c < g->first || c >= i) continue;
    if (!((g->global >> (c - g->first)) & 1u)) return false;
    n_member++;
  }
  return n_member > 0 || g->global;
}

/* Whether step i (node t) can join group g, given its kind: elementwise
 * (fusible), a row op (ra >= 0), a view (reshape, broadcast_to, identity: a
 * copy inside the group, which views join but never start), or a global
 * member. */
static bool joins(const fgroup *g, nb_tensor *const *nodes, int i, bool ew, int ra, bool global) {
  const nb_tensor *t = nodes[i], *f = nodes[g->first];
  if (t->dtype != f->dtype || i - g->first >= NBI_FUSE_MAX) return false;
  if (global || g->global) return global; /* after the first global member, only those */
  if (ra >= 0) /* works along F's trailing axes, as the group's others do */
    return nbi_shape_eq(&t->in[0]->shape, &g->full) && (g->ra < 0 || g->ra == ra);
  if (nbi_fuse_view(t)) { /* a reshape only between per-row shapes (or to its own shape) */
    if (t->in[0]->dtype != t->dtype) return false;
    if (t->op == NBI_OP_RESHAPE && !nbi_shape_eq(&t->shape, &t->in[0]->shape) &&
        !(g->ra >= 0 && per_row(g, &t->shape, false)))
      return false;
  } else if (!ew) {
    return false;
  }
  if (!nbi_shape_eq(&t->shape, &g->full)) return g->ra >= 0 && per_row(g, &t->shape, false);
  for (int k = 0; k < t->n_in; k++) { /* per-row members broadcast back as keepdims */
    const nb_tensor *x = t->in[k];
    if (x->mark >= g->first && x->mark < i && !nbi_shape_eq(&x->shape, &g->full) &&
        !per_row(g, &x->shape, true))
      return false;
  }
  return true;
}

/* The members of group [first, i] that get a buffer if the group ends at i
 * (as the loop after the grouping decides): held, or read after step i.
 * last[j]: step j's last reader (j when none); NULL counts every member. */
static int stored_members(const int *last, const bool *held, int first, int i) {
  int n = 0;
  for (int j = first; j <= i; j++)
    n += !last || held[j] || last[j] > i;
  return n;
}

void nbi_fuse_plan(nb_tensor *const *nodes, int n_nodes, const bool *held, int *group,
                   bool *store) {
  fgroup g = {.first = -1};
  /* without room for last (out of memory), every member counts as stored */
  int *last = malloc(sizeof *last * (size_t)(n_nodes > 0 ? n_nodes : 1));
  for (int i = 0; i < n_nodes; i++) {
    store[i] = held[i];
    if (last) last[i] = i;
  }
  for (int i = 0; i < n_nodes && last; i++)
    for (int k = 0; k < nodes[i]->n_in; k++)
      if (nodes[i]->in[k]->mark >= 0) last[nodes[i]->in[k]->mark] = i;
  for (int i = 0; i < n_nodes; i++) {
    /* GEMM epilogues: [matmul, add bias, activation] as one group (k_gemm_epi.c). */
    int epi = nbi_fusion_enabled() ? nbi_cpu_gemm_epi_match(nodes, n_nodes, i, held) : 0;
    if (epi > 1) {
      for (int k = 0; k < epi; k++)
        group[i + k] = i;
      i += epi - 1;
      g.first = -1;
      continue;
    }
    const nb_tensor *t = nodes[i];
    bool on = nbi_fusion_enabled(), ew = on && nbi_cpu_elementwise_fusible(t);
    int ra = on ? row_op(t) : -1;
    bool global = g.first >= 0 && global_member(&g, nodes, i, ew);
    if (g.first >= 0 && joins(&g, nodes, i, ew, ra, global)) {
      int n = group_operands(t, g.first, i, g.ext, g.n_ext);
      /* the elementwise executor walks stored members and operands with one
       * iterator; the row executor indexes each operand itself */
      bool rows = g.ra >= 0 || ra >= 0;
      if (n <= NBI_FUSE_MAX &&
          (rows || stored_members(last, held, g.first, i) + n <= NBI_FUSE_OPERANDS)) {
        g.n_ext = n;
        group[i] = g.first;
        if (global) {
          g.global |= 1u << (i - g.first);
          if (nbi_cpu_reduce_row_fusible(t)) /* reads all rows after the row loop */
            store[t->in[0]->mark] = true;
        } else if (ra >= 0) {
          g.ra = ra;
        }
        continue;
      }
    }
    group[i] = i; /* starts a group (or stays alone) */
    g.first = ew || ra >= 0 ? i : -1;
    g.ra = ra;
    g.global = 0;
    g.full = ra >= 0 ? t->in[0]->shape : t->shape;
    g.n_ext = g.first >= 0 ? group_operands(t, i, i, g.ext, 0) : 0;
  }
  for (int i = 0; i < n_nodes; i++) {
    const nb_tensor *t = nodes[i];
    for (int k = 0; k < t->n_in; k++) {
      int c = t->in[k]->mark;
      if (c >= 0 && group[c] != group[i]) store[c] = true;
    }
  }
  free(last);
}

int nbi_fuse_group_end(const int *group, int n, int i) {
  int f = group[i];
  while (i + 1 < n && group[i + 1] == f && f != i + 1)
    i++;
  return i;
}

bool nbi_fuse_view(const nb_tensor *t) {
  return t->op == NBI_OP_RESHAPE || t->op == NBI_OP_BROADCAST_TO || t->op == NBI_OP_IDENTITY ||
         t->op == NBI_OP_STOP_GRADIENT;
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
  int ra = -1; /* a row group: its row ops' first trailing axis */
  for (int k = 0; k < m && ra < 0; k++)
    ra = row_op(nodes[k]);
  if (!st && nodes[0]->op == NBI_OP_MATMUL)
    st = nbi_cpu_gemm_epi_run(nodes, m, store, out);
  else if (!st && ra >= 0)
    st = nbi_cpu_rows_fused(nodes, m, store, out, ra);
  else if (!st)
    st = nbi_cpu_elementwise_fused(nodes, m, store, out);
  if (st)
    for (int k = 0; k < m; k++) {
      nbi_buffer_release(nodes[k]->shard0.buf);
      nodes[k]->shard0.buf = NULL;
    }
  else
    nbi_stats_kernel();
  return st;
}
