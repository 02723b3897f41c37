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
#include "../backends/backend.h"

#include <stddef.h>
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
  if (t->dtype != f->dtype || t->device != f->device || i - g->first >= NBI_FUSE_MAX) return false;
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

/* ---- GEMM epilogues on other devices --------------------------------------------------
 * The same pattern as the CPU's (k_gemm_epi.c): a 2-D MATMUL of 2-D float
 * operands, the ADD of a row bias ([N] or [1, N], same dtype) to it after at
 * most EPI_MAX_ALIASES aliases (identity / stop_gradient of outside values:
 * transforms wrap parameters in them), optionally one activation of the sum;
 * the product's value needed by the add only. The device's gemm_ok decides
 * (nbi_fuse_supported). */
enum { EPI_MAX_ALIASES = 4 };

static bool epi_alias(const nb_tensor *t) { return nbi_op_traits[t->op] & NBI_TR_ALIAS; }

static bool epi_act(int op) { return nbi_op_traits[op] & NBI_TR_ACT; }

/* Whether step i's value is read by a step other than `user` or held. */
static bool epi_used_elsewhere(nb_tensor *const *nodes, int n, int i, int user, const bool *held) {
  if (held[i]) return true;
  for (int j = i + 1; j < n; j++)
    for (int k = 0; j != user && k < nodes[j]->n_in; k++)
      if (nodes[j]->in[k]->mark == i) return true;
  return false;
}

static int gemm_epi_match(nb_tensor *const *nodes, int n, int i, const bool *held) {
  const nb_tensor *mm = nodes[i];
  if (mm->op != NBI_OP_MATMUL || !nb_dtype_is_float(mm->dtype) || mm->shape.ndim != 2 ||
      mm->in[0]->shape.ndim != 2 || mm->in[1]->shape.ndim != 2 ||
      mm->in[0]->dtype != mm->dtype || mm->in[1]->dtype != mm->dtype)
    return 0;
  int j = i + 1;
  while (j < n && j - i < EPI_MAX_ALIASES && epi_alias(nodes[j]) && nodes[j]->in[0]->mark < i &&
         nodes[j]->device == mm->device)
    j++;
  if (j >= n) return 0;
  const nb_tensor *add = nodes[j];
  if (add->op != NBI_OP_ADD || add->n_in != 2 || add->dtype != mm->dtype ||
      add->device != mm->device || !nbi_shape_eq(&add->shape, &mm->shape))
    return 0;
  const nb_tensor *b = add->in[0] == mm ? add->in[1] : add->in[1] == mm ? add->in[0] : NULL;
  int64_t N = mm->shape.dims[1];
  if (!b || b == mm || b->dtype != mm->dtype ||
      !((b->shape.ndim == 1 && b->shape.dims[0] == N) ||
        (b->shape.ndim == 2 && b->shape.dims[0] == 1 && b->shape.dims[1] == N)))
    return 0;
  if (epi_used_elsewhere(nodes, n, i, j, held)) return 0;
  if (j + 1 < n && nodes[j + 1]->n_in == 1 && nodes[j + 1]->in[0] == add &&
      nodes[j + 1]->dtype == mm->dtype && epi_act(nodes[j + 1]->op))
    return j + 2 - i;
  return j + 1 - i;
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
    int epi = !nbi_fusion_enabled()    ? 0
              : nodes[i]->device == 0 ? nbi_cpu_gemm_epi_match(nodes, n_nodes, i, held)
                                      : gemm_epi_match(nodes, n_nodes, i, held);
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

bool nbi_fuse_is_rows(nb_tensor *const *nodes, int m) {
  for (int k = 0; k < m; k++)
    if (row_op(nodes[k]) >= 0) return true;
  return false;
}

int nbi_fuse_group_end(const int *group, int n, int i) {
  int f = group[i];
  while (i + 1 < n && group[i + 1] == f && f != i + 1)
    i++;
  return i;
}

bool nbi_fuse_view(const nb_tensor *t) {
  return t->op == NBI_OP_RESHAPE || t->op == NBI_OP_BROADCAST_TO ||
         (nbi_op_traits[t->op] & NBI_TR_ALIAS);
}

/* ---- the neutral description (backend.h, "fused groups") ------------------------------- */
/* dst = src with zero padding, so a description hashes the same every time. */
static void copy_shape(nb_shape *dst, const nb_shape *src) {
  memset(dst, 0, sizeof *dst);
  dst->ndim = src->ndim;
  memcpy(dst->dims, src->dims, sizeof dst->dims);
}

/* The operand slot for outside value x read at level lv, added when new. */
static int operand_slot(nbi_group *g, const nb_tensor **ext, const nb_tensor *x, uint8_t lv) {
  for (int k = 0; k < g->n_operands; k++)
    if (ext[k] == x && g->operand[k].level == lv) return k;
  ext[g->n_operands] = x;
  g->operand[g->n_operands].dtype = x->dtype;
  g->operand[g->n_operands].level = lv;
  return g->n_operands++;
}

/* The level at which a member of role r reads its operands. */
static uint8_t read_level(uint8_t r) {
  switch (r) {
  case NBI_ROLE_PER_ROW:
  case NBI_ROLE_GLOBAL_REDUCE: return NBI_ROLE_PER_ROW;
  case NBI_ROLE_GLOBAL: return NBI_ROLE_GLOBAL;
  default: return NBI_ROLE_FULL;
  }
}

bool nbi_fuse_describe(nb_tensor *const *nodes, int m, const bool *store, nbi_group *g,
                       const nb_tensor **ext) {
  memset(g, 0, sizeof *g);
  if (m < 1 || m > NBI_FUSE_MAX) return false;
  bool gemm = nodes[0]->op == NBI_OP_MATMUL;
  int ra = -1, first_row = -1;
  for (int k = 0; k < m && ra < 0 && !gemm; k++)
    if ((ra = row_op(nodes[k])) >= 0) first_row = k;
  g->kind = gemm ? NBI_GROUP_GEMM : ra >= 0 ? NBI_GROUP_ROWS : NBI_GROUP_ELEMENTWISE;
  g->dtype = nodes[0]->dtype;
  copy_shape(&g->full, ra >= 0 ? &nodes[first_row]->in[0]->shape : &nodes[0]->shape);
  g->ra = ra >= 0 ? ra : g->full.ndim;
  g->rows = 1;
  for (int d = 0; d < g->ra && ra >= 0; d++)
    g->rows *= g->full.dims[d];
  g->cols = nbi_numel(&g->full) / (g->rows ? g->rows : 1);
  if (ra >= 0 && g->rows == 0) g->cols = 0;
  g->n_members = m;
  for (int k = 0; k < m; k++) {
    const nb_tensor *t = nodes[k];
    nbi_group_member *e = &g->m[k];
    e->op = (int16_t)t->op;
    e->dtype = t->dtype;
    copy_shape(&e->shape, &t->shape);
    e->n_in = (uint8_t)t->n_in;
    e->out = store[k] ? (int16_t)g->n_outputs++ : -1;
    for (int a = 0; a < NBI_GROUP_ATTRS; a++)
      e->ai[a] = t->attrs.i[a];
    e->af[0] = t->attrs.f[0], e->af[1] = t->attrs.f[1];
    bool reduce = nbi_cpu_reduce_row_fusible(t);
    if (ra < 0)
      e->role = NBI_ROLE_FULL;
    else if (g->rows >= 2 && nbi_numel(&t->shape) == 1)
      e->role = reduce ? NBI_ROLE_GLOBAL_REDUCE : NBI_ROLE_GLOBAL;
    else if (nbi_cpu_axis_row_fusible(t))
      e->role = NBI_ROLE_AXIS;
    else if (reduce)
      e->role = NBI_ROLE_ROW_REDUCE;
    else
      e->role = nbi_shape_eq(&t->shape, &g->full) ? NBI_ROLE_FULL : NBI_ROLE_PER_ROW;
    if (t->n_in > 3) return false;
    for (int q = 0; q < t->n_in; q++) {
      const nb_tensor *x = t->in[q];
      int j = k - 1;
      while (j >= 0 && nodes[j] != x)
        j--;
      if (j >= 0) {
        e->src[q] = (int16_t)j;
        continue;
      }
      /* a reshape between per-row shapes reads its operand by its own linear
       * row index, which a view over F's row axes cannot express */
      if (ra >= 0 && t->op == NBI_OP_RESHAPE && !nbi_shape_eq(&x->shape, &t->shape)) return false;
      if (g->n_operands == NBI_FUSE_MAX) return false;
      e->src[q] = (int16_t)(-1 - operand_slot(g, ext, x, read_level(e->role)));
    }
  }
  uint64_t a = 0x9e3779b97f4a7c15ull, b = 0xcbf29ce484222325ull;
  const uint64_t *w = (const uint64_t *)(const void *)g;
  for (size_t i = 0; i < offsetof(nbi_group, key) / 8; i++)
    nbi_hash_mix(&a, &b, w[i]);
  g->key[0] = a, g->key[1] = b;
  return true;
}

nbi_view nbi_fuse_operand_view(const nbi_group *g, int k, const nb_tensor *x) {
  nbi_view v = nbi_tensor_view(x), r = v;
  const nb_shape *F = &g->full;
  if (g->kind == NBI_GROUP_GEMM) return v; /* operands at their own shapes */
  switch (g->operand[k].level) {
  case NBI_ROLE_FULL: return nbi_view_broadcast(&v, F);
  case NBI_ROLE_GLOBAL:
    r.ndim = F->ndim;
    for (int d = 0; d < F->ndim; d++)
      r.dims[d] = F->dims[d], r.strides[d] = 0;
    return r;
  default: break;
  }
  /* per row: keepdims form (ones on the row axes' complement) in place, else
   * right-aligned to the row axes F[0..ra); stride 0 along the row */
  bool keep = x->shape.ndim == F->ndim;
  for (int d = g->ra; d < F->ndim && keep; d++)
    keep = x->shape.dims[d] == 1;
  nb_shape rs = {.ndim = keep ? F->ndim : g->ra};
  for (int d = 0; d < rs.ndim; d++)
    rs.dims[d] = d < g->ra ? F->dims[d] : 1;
  nbi_view b = nbi_view_broadcast(&v, &rs);
  r.ndim = F->ndim;
  for (int d = 0; d < F->ndim; d++) {
    r.dims[d] = F->dims[d];
    r.strides[d] = d < g->ra ? b.strides[d] : 0;
  }
  r.data = b.data;
  return r;
}

/* Runs steps first..end as one fused kernel: buffers only for the members whose
 * value is needed outside the group (a member the planner gave an input's
 * buffer to write in place keeps it). On the CPU the executors walk the nodes;
 * other devices get the neutral description and operand views. */
nb_status nbi_fuse_run(nb_tensor *const *nodes, int m, const bool *store) {
  nbi_view out[NBI_FUSE_MAX];
  nb_status st = NB_OK;
  int dev = nodes[0]->device;
  for (int k = 0; k < m && !st; k++) {
    if (!store[k]) continue;
    nb_tensor *t = nodes[k];
    if (t->shard0.buf) {
      out[k] = nbi_tensor_view(t);
      continue;
    }
    nbi_buffer *b = nbi_buffer_alloc(dev, (size_t)nbi_numel(&t->shape) * nb_dtype_size(t->dtype));
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
  if (!st && dev != 0) {
    nbi_group g;
    const nb_tensor *ext[NBI_FUSE_MAX];
    nbi_view in[NBI_FUSE_MAX], slot[NBI_FUSE_MAX];
    if (!nbi_fuse_describe(nodes, m, store, &g, ext)) {
      st = nbi_error(NB_ERR_INTERNAL, "nb_eval: a fused group the planner kept has no description");
    } else {
      g.nodes = nodes;
      for (int k = 0; k < g.n_operands; k++)
        in[k] = nbi_fuse_operand_view(&g, k, ext[k]);
      for (int k = 0; k < m; k++)
        if (g.m[k].out >= 0) slot[g.m[k].out] = out[k];
      const nbi_device *d = nbi_device_at(dev);
      st = d->be->run_group(d->ctx, &g, slot, in);
    }
  } else if (!st && nodes[0]->op == NBI_OP_MATMUL) {
    st = nbi_cpu_gemm_epi_run(nodes, m, store, out);
  } else if (!st && ra >= 0) {
    st = nbi_cpu_rows_fused(nodes, m, store, out, ra);
  } else if (!st) {
    st = nbi_cpu_elementwise_fused(nodes, m, store, out);
  }
  if (st)
    for (int k = 0; k < m; k++) {
      nbi_buffer_release(nodes[k]->shard0.buf);
      nodes[k]->shard0.buf = NULL;
    }
  else
    nbi_stats_kernel();
  return st;
}

bool nbi_fuse_supported(nb_tensor *const *nodes, int m, const bool *store) {
  int dev = nodes[0]->device;
  if (dev == 0) return true;
  nbi_group g;
  const nb_tensor *ext[NBI_FUSE_MAX];
  if (!nbi_fuse_describe(nodes, m, store, &g, ext)) return false;
  const nbi_device *d = nbi_device_at(dev);
  return d->be->group_ok(d->ctx, &g);
}
