/* src/core/fuse.c — the planner's fusion pass: which steps of a realization
 * run together as one kernel, each group's backend-neutral description, and
 * running a group.
 *
 * A group is a run of consecutive steps (topological order): elementwise
 * steps of one shape, a row group (elementwise steps, reductions and axis
 * ops along trailing axes, per-row and global values), or a GEMM epilogue
 * (matmul, bias add, activation); nbi.h, "fusion". What may join is read
 * from the op's traits (ops.def) and the graph's structure; whether the device runs
 * the group is its backend's answer for the group's description (group_ok,
 * asked each time a step would join, so a group stops growing where the
 * device's limits are: the CPU's operand counts, row lengths and dtypes).
 * group[i] is the first step of i's group (i itself when alone) and the group
 * runs at its last step. store[i]: member i's value is needed outside its
 * group (held, or read by a later step), so it gets a buffer; the others live
 * in the executor's tiles only.
 */
#include "fuse.h"
#include "oprules.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* How an op may join a group, from its traits (ops.def): the planner proposes
 * every such op; which ones a device runs (dtypes, reductions it can fold)
 * is its backend's answer. */
enum {
  FUSE_NONE,        /* never fused */
  FUSE_ELEMENTWISE, /* elementwise (NBI_TR_EW) */
  FUSE_ROW_REDUCE,  /* a reduction of the axes of its mask (NBI_TR_REDUCE) */
  FUSE_ROW_AXIS,    /* along one axis, a row op along F's last (NBI_TR_REDUCE | NBI_TR_AXIS) */
  FUSE_VIEW,        /* a copy of its operand in a group (NBI_TR_ALIAS, NBI_TR_VIEW); joins a
                       group, never starts one */
};

static int fuse_class(const nb_tensor *t) {
  uint32_t tr = nbi_op_traits[t->op];
  if (tr & NBI_TR_EW) return FUSE_ELEMENTWISE;
  if (tr & NBI_TR_REDUCE) return tr & NBI_TR_AXIS ? FUSE_ROW_AXIS : FUSE_ROW_REDUCE;
  return tr & (NBI_TR_ALIAS | NBI_TR_VIEW) ? FUSE_VIEW : FUSE_NONE;
}

/* Groups consecutive fusible steps (nbi.h, "fusion"): elementwise steps of one
 * dtype and one full shape F, and, once a row op along F's trailing axes
 * [ra, ndim) joins, such row ops, steps on the per-row shape and then global
 * members; at most NBI_FUSE_MAX members and NBI_FUSE_MAX operands, and only
 * while the device takes the group. The grouping reads only the graph's
 * structure (ops, shapes, dtypes, attributes, edges), so it is part of the
 * cached plan. */
typedef struct fgroup {
  int first, ra;   /* ra < 0: no row op yet (an elementwise group) */
  uint32_t global; /* members (bit i - first) that come after the rows */
  nb_shape full;
} fgroup;

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

/* If t is a reduction or an axis op a row group can hold (its trait), ra = the
 * first of the trailing axes it works along (its input's rows are axes
 * [0, ra)), else -1. Rows must have at least 2 elements and the input must
 * not be empty; how long a row may be is the device's answer. */
static int row_op(const nb_tensor *t) {
  int cls = fuse_class(t);
  if (cls != FUSE_ROW_REDUCE && cls != FUSE_ROW_AXIS) return -1;
  const nb_shape *s = &t->in[0]->shape;
  int ra = s->ndim;
  if (cls == FUSE_ROW_AXIS) {
    if (t->attrs.i[0] != t->shape.ndim - 1) return -1; /* along the last axis only */
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
  return n >= 2 && nbi_numel(s) > 0 ? ra : -1;
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
  if (fuse_class(t) == FUSE_ROW_REDUCE) /* of a per-row member */
    return member && !((g->global >> (x->mark - g->first)) & 1u) && per_row(g, &x->shape, false);
  if (!ew && !(fuse_class(t) == FUSE_VIEW && x->dtype == t->dtype)) return false;
  int n_member = 0; /* every member input is global, at least one unless already after the rows */
  for (int k = 0; k < t->n_in; k++) {
    int c = t->in[k]->mark;
    if (c < g->first || c >= i) continue;
    if (!((g->global >> (c - g->first)) & 1u)) return false;
    n_member++;
  }
  return n_member > 0 || g->global;
}

/* Whether step i (node t) can join group g as the graph's structure goes,
 * given its kind: elementwise (ew), a row op (ra >= 0), a view (reshape,
 * broadcast_to, identity: a copy inside the group, which views join but never
 * start), or a global member. The device is asked next (fits). */
static bool joins(const fgroup *g, nb_tensor *const *nodes, int i, bool ew, int ra, bool global) {
  const nb_tensor *t = nodes[i], *f = nodes[g->first];
  if (t->dtype != f->dtype || t->device != f->device || i - g->first >= NBI_FUSE_MAX) return false;
  if (global || g->global) return global; /* after the first global member, only those */
  if (ra >= 0) /* works along F's trailing axes, as the group's others do */
    return nbi_shape_eq(&t->in[0]->shape, &g->full) && (g->ra < 0 || g->ra == ra);
  if (fuse_class(t) == FUSE_VIEW) { /* a reshape only between per-row shapes (or to its own) */
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

/* ---- GEMM epilogues ---------------------------------------------------------------------
 * A 2-D MATMUL of 2-D float operands, the ADD of a row bias ([N] or [1, N],
 * same dtype) to it after at most EPI_MAX_ALIASES aliases (identity /
 * stop_gradient of outside values: transforms wrap parameters in them),
 * optionally one activation of the sum; the product's value needed by the add
 * only. One pattern for every device; the device's group_ok says which it
 * takes (the CPU: f32). */
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

/* The length (2 to 2 + EPI_MAX_ALIASES) of the epilogue group that starts at
 * step i, or 0 when none does. */
static int gemm_epi_match(nb_tensor *const *nodes, int n, int i, const bool *held) {
  const nb_tensor *mm = nodes[i];
  if (mm->op != NBI_OP_MATMUL || !nb_dtype_is_float(mm->dtype) || mm->shape.ndim != 2 ||
      mm->in[0]->shape.ndim != 2 || mm->in[1]->shape.ndim != 2 || mm->in[0]->dtype != mm->dtype ||
      mm->in[1]->dtype != mm->dtype)
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

/* ---- the neutral description (backend.h, "fused groups") ------------------------------- */
/* dst = src with zero padding, so a description hashes the same every time. */
static void copy_shape(nb_shape *dst, const nb_shape *src) {
  memset(dst, 0, sizeof *dst);
  dst->ndim = src->ndim;
  memcpy(dst->dims, src->dims, sizeof dst->dims);
}

/* The operand slot for input q of member k, an outside value x read at level
 * lv (per row: in the keepdims form when keep), added when new (ext[s]: slot
 * s's tensor); -1 when the slots are full. */
static int operand_slot(nbi_fused *d, const nb_tensor **ext, int k, int q, const nb_tensor *x,
                        uint8_t lv, bool keep) {
  nbi_group *g = &d->g;
  for (int s = 0; s < g->n_operands; s++)
    if (ext[s] == x && g->operand[s].level == lv && d->operand_keep[s] == keep) return s;
  if (g->n_operands == NBI_FUSE_MAX) return -1;
  ext[g->n_operands] = x;
  g->operand[g->n_operands].dtype = x->dtype;
  g->operand[g->n_operands].level = lv;
  d->operand_member[g->n_operands] = (uint8_t)k;
  d->operand_in[g->n_operands] = (uint8_t)q;
  d->operand_keep[g->n_operands] = keep;
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

/* Describes the group nodes[0..m-1] (store[k]: member k gets a buffer) into
 * d, its structural key too when keyed (the planner's trial descriptions, for
 * group_ok only, skip it); false when it has no description: too many
 * operands, or a row group's reshape of an outside value that is not one value
 * per row (it reads the value by its own linear index, which a view over F's
 * row axes cannot express). */
static bool describe(nb_tensor *const *nodes, int m, const bool *store, bool keyed, nbi_fused *d) {
  nbi_group *g = &d->g;
  const nb_tensor *ext[NBI_FUSE_MAX];
  memset(d, 0, sizeof *d);
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
  fgroup rg = {.ra = ra, .full = g->full}; /* per-row shapes of a row group */
  for (int k = 0; k < m; k++) {
    const nb_tensor *t = nodes[k];
    nbi_group_member *e = &g->m[k];
    int cls = fuse_class(t);
    e->op = (int16_t)t->op;
    e->dtype = t->dtype;
    copy_shape(&e->shape, &t->shape);
    e->n_in = (uint8_t)t->n_in;
    e->out = store[k] ? (int16_t)g->n_outputs++ : -1;
    for (int a = 0; a < NBI_GROUP_ATTRS; a++)
      e->ai[a] = t->attrs.i[a];
    e->af[0] = t->attrs.f[0], e->af[1] = t->attrs.f[1];
    if (ra < 0)
      e->role = NBI_ROLE_FULL;
    else if (g->rows >= 2 && nbi_numel(&t->shape) == 1)
      e->role = cls == FUSE_ROW_REDUCE ? NBI_ROLE_GLOBAL_REDUCE : NBI_ROLE_GLOBAL;
    else if (cls == FUSE_ROW_AXIS)
      e->role = NBI_ROLE_AXIS;
    else if (cls == FUSE_ROW_REDUCE)
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
      /* a per-row reader's operand broadcasts to the reader's form of the
       * per-row shape; a reshape's operand is per-row itself */
      bool reshape = t->op == NBI_OP_RESHAPE && !nbi_shape_eq(&x->shape, &t->shape);
      if (ra >= 0 && reshape && e->role == NBI_ROLE_PER_ROW && !per_row(&rg, &x->shape, false))
        return false;
      bool keep =
          e->role == NBI_ROLE_PER_ROW && per_row(&rg, reshape ? &x->shape : &t->shape, true);
      int s = operand_slot(d, ext, k, q, x, read_level(e->role), keep);
      if (s < 0) return false;
      e->src[q] = (int16_t)(-1 - s);
    }
  }
  if (!keyed) return true;
  uint64_t a = 0x9e3779b97f4a7c15ull, b = 0xcbf29ce484222325ull;
  const uint64_t *w = (const uint64_t *)(const void *)g;
  for (size_t i = 0; i < offsetof(nbi_group, key) / 8; i++)
    nbi_hash_mix(&a, &b, w[i]);
  g->key[0] = a, g->key[1] = b;
  return true;
}

/* Whether the device of nodes[f] takes nodes[f..e] as one group (backend.h,
 * group_ok), its members stored as they would be were the group to end at e:
 * as store[] has them so far (held, or read by a global reduction), or read
 * after e (last[j]: step j's last reader; NULL: every member counts as
 * stored), or also (a joining global reduction's input; -1: none). */
static bool fits(nb_tensor *const *nodes, int f, int e, const bool *store, const int *last,
                 int also) {
  if (e - f + 1 > NBI_FUSE_MAX) return false;
  bool s[NBI_FUSE_MAX];
  for (int k = 0; k <= e - f; k++)
    s[k] = store[f + k] || !last || last[f + k] > e || f + k == also;
  nbi_fused d;
  if (!describe(nodes + f, e - f + 1, s, false, &d)) return false;
  const nbi_device *dev = nbi_device_at(nodes[f]->device);
  return dev->be->group_ok(dev->ctx, &d.g);
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
  bool on = nbi_fusion_enabled();
  for (int i = 0; i < n_nodes; i++) {
    /* GEMM epilogues: [matmul, add bias, activation] as one group */
    int epi = on ? gemm_epi_match(nodes, n_nodes, i, held) : 0;
    if (epi > 1 && fits(nodes, i, i + epi - 1, store, last, -1)) {
      for (int k = 0; k < epi; k++)
        group[i + k] = i;
      i += epi - 1;
      g.first = -1;
      continue;
    }
    const nb_tensor *t = nodes[i];
    int cls = on ? fuse_class(t) : FUSE_NONE, ra = on ? row_op(t) : -1;
    bool ew = cls == FUSE_ELEMENTWISE;
    bool global = g.first >= 0 && global_member(&g, nodes, i, ew);
    /* a joining global reduction reads all rows of its input after the row loop */
    int reread = global && cls == FUSE_ROW_REDUCE ? t->in[0]->mark : -1;
    if (g.first >= 0 && joins(&g, nodes, i, ew, ra, global) &&
        fits(nodes, g.first, i, store, last, reread)) {
      group[i] = g.first;
      if (global) {
        g.global |= 1u << (i - g.first);
        if (reread >= 0) store[reread] = true;
      } else if (ra >= 0) {
        g.ra = ra;
      }
      continue;
    }
    group[i] = i; /* starts a group (or stays alone) */
    g.first = (ew || ra >= 0) && fits(nodes, i, i, store, last, -1) ? i : -1;
    g.ra = ra;
    g.global = 0;
    g.full = ra >= 0 ? t->in[0]->shape : t->shape;
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

nbi_fused *nbi_fuse_describe_groups(nb_tensor *const *nodes, int n, int *group, bool *store,
                                    int *n_fused) {
  int count = 0;
  for (int f = 0; f < n; f = nbi_fuse_group_end(group, n, f) + 1)
    count += nbi_fuse_group_end(group, n, f) > f;
  nbi_fused *d = malloc(sizeof *d * (size_t)(count ? count : 1));
  if (!d) return NULL;
  int k = 0;
  for (int f = 0; f < n;) {
    int e = nbi_fuse_group_end(group, n, f);
    if (e > f) {
      const nbi_device *dev = nbi_device_at(nodes[f]->device);
      if (describe(nodes + f, e - f + 1, store + f, true, &d[k]) &&
          dev->be->group_ok(dev->ctx, &d[k].g))
        k++;
      else
        for (int c = f; c <= e; c++)
          group[c] = c, store[c] = true;
    }
    f = e + 1;
  }
  *n_fused = k;
  return d;
}

/* attrs.i[0] is an elementwise op's compute dtype (a cast has none). */
bool nbi_fuse_elementwise_step(const nb_tensor *t) {
  return fuse_class(t) == FUSE_ELEMENTWISE && t->op != NBI_OP_CAST &&
         (t->dtype == NB_F32 || t->dtype == NB_F64) && t->attrs.i[0] == t->dtype;
}

/* Operand k's view (of F's dims, backend.h) for its tensor x: broadcast to F,
 * one value per row (stride 0 along the row), or one value; GEMM operands at
 * their own shapes. */
static nbi_view operand_view_of(const nbi_fused *fd, int k, nbi_view v) {
  const nbi_group *g = &fd->g;
  nbi_view r = v;
  const nb_shape *F = &g->full;
  if (g->kind == NBI_GROUP_GEMM) return v;
  switch (g->operand[k].level) {
  case NBI_ROLE_FULL: return nbi_view_broadcast(&v, F);
  case NBI_ROLE_GLOBAL:
    r.ndim = F->ndim;
    for (int d = 0; d < F->ndim; d++)
      r.dims[d] = F->dims[d], r.strides[d] = 0;
    return r;
  default: break;
  }
  /* per row: broadcast to the keepdims form (ones on the row axes'
   * complement) or to the row axes F[0..ra), as its reader's shape is (both
   * right-aligned: leading ones may be missing); stride 0 along the row */
  bool keep = fd->operand_keep[k];
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

static nbi_view operand_view(const nbi_fused *fd, int k, const nb_tensor *x) {
  return operand_view_of(fd, k, nbi_tensor_view(x));
}

/* A tensor's view when it has storage, else the one a fresh buffer will give
 * it: contiguous, at an aligned placeholder that is never dereferenced. */
static nbi_view predicted_view(const nb_tensor *t) {
  if (t->shard0.buf) return nbi_tensor_view(t);
  nbi_view v = {
      .data = (char *)(uintptr_t)NBI_PREDICTED_DATA, .dtype = t->dtype, .ndim = t->shape.ndim};
  memcpy(v.dims, t->shape.dims, sizeof v.dims);
  nbi_contig_strides(&t->shape, v.strides);
  return v;
}

void nbi_fuse_predict_views(const nbi_fused *d, nb_tensor *const *nodes, nbi_view *out,
                            nbi_view *in) {
  const nbi_group *g = &d->g;
  for (int k = 0; k < g->n_members; k++)
    if (g->m[k].out >= 0) out[g->m[k].out] = predicted_view(nodes[k]);
  for (int k = 0; k < g->n_operands; k++)
    in[k] =
        operand_view_of(d, k, predicted_view(nodes[d->operand_member[k]]->in[d->operand_in[k]]));
}

void nbi_fuse_predict_node(const nb_tensor *t, nbi_view *out, nbi_view *in) {
  *out = predicted_view(t);
  for (int k = 0; k < t->n_in; k++)
    in[k] = predicted_view(t->in[k]);
}

nb_status nbi_fuse_run(const nbi_fused *d, nb_tensor *const *nodes) {
  const nbi_group *g = &d->g;
  nbi_view in[NBI_FUSE_MAX], out[NBI_FUSE_MAX];
  nb_status st = NB_OK;
  int m = g->n_members, dev = nodes[0]->device;
  for (int k = 0; k < m && !st; k++) {
    if (g->m[k].out < 0) continue;
    nb_tensor *t = nodes[k];
    if (!t->shard0.buf) {
      nbi_buffer *b = nbi_buffer_alloc(dev, (size_t)nbi_numel(&t->shape) * nb_dtype_size(t->dtype));
      if (!b) {
        st = NB_ERR_OOM;
        break;
      }
      t->shard0.buf = b;
      t->shard0.offset = 0;
      nbi_contig_strides(&t->shape, t->shard0.strides);
    }
    out[g->m[k].out] = nbi_tensor_view(t);
  }
  if (!st) {
    for (int k = 0; k < g->n_operands; k++)
      in[k] = operand_view(d, k, nodes[d->operand_member[k]]->in[d->operand_in[k]]);
    const nbi_device *dv = nbi_device_at(dev);
    st = dv->be->run_group(dv->ctx, g, out, in);
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
