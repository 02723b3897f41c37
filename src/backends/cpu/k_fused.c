/* src/backends/cpu/k_fused.c — the CPU's fused groups: which groups it runs
 * (group_ok: its answers to the planner) and running them, from the neutral
 * description alone (backend.h, "fused groups"): members, operand views of F's
 * dims, output slot views.
 *
 * Elementwise groups run per unit of one walk (k_ew.h), row groups row by row
 * (full members in per-thread scratch rows, reductions and axis ops through
 * k_reduce.c's row routines, per-row members as scalars), GEMM epilogues on
 * k_gemm_epi.c. Elementwise and row groups give bitwise what their members give
 * run one by one: the same row functions and folds in the same order.
 */
#include "k_fused.h"
#include "../../core/oprules.h"

#include <stdlib.h>

#include "k_ew.h"
#include "k_gemm_epi.h"
#include "k_linalg.h" /* nbi_cpu_scratch */
#include "k_reduce.h"

/* The longest row a row group takes (elements): its scratch rows, a few per
 * member, live in each thread's block of the buffer cache. */
enum { ROW_MAX = 16384 };

/* ---- which groups (group_ok) ------------------------------------------------------------ */
/* What a member of an elementwise or row group does. */
typedef enum member_kind { M_VIEW, M_WHERE, M_UNARY, M_BINARY, M_REDUCE, M_AXIS } member_kind;

/* By the op's traits (ops.def); member_ok says whether this file has its kernel. */
static member_kind kind_of(const nbi_group_member *e) {
  uint32_t tr = nbi_op_traits[e->op];
  if (tr & (NBI_TR_ALIAS | NBI_TR_VIEW)) return M_VIEW;
  if (tr & NBI_TR_REDUCE) return tr & NBI_TR_AXIS ? M_AXIS : M_REDUCE;
  return e->op == NBI_OP_WHERE ? M_WHERE : e->n_in == 1 ? M_UNARY : M_BINARY;
}

/* The dtype of input q of member k: another member's or an operand's. */
static nb_dtype input_dtype(const nbi_group *g, int k, int q) {
  int s = g->m[k].src[q];
  return s >= 0 ? g->m[s].dtype : g->operand[-1 - s].dtype;
}

/* Whether member k has a kernel here: every member computes in the group's
 * dtype (f32 or f64); elementwise ops with their row function in that domain
 * (predicates, whose results are bool, never); views copy a value of their
 * own dtype; reductions and axis ops with a row routine (k_reduce.c), in row
 * groups only. */
static bool member_ok(const nbi_group *g, int k) {
  const nbi_group_member *e = &g->m[k];
  int op = e->op;
  if (op < 0 || op >= NBI_OP_COUNT || e->dtype != g->dtype || e->n_in < 1 || e->n_in > 3)
    return false;
  for (int q = 0; q < e->n_in; q++)
    if (e->src[q] >= k || -1 - e->src[q] >= g->n_operands) return false;
  bool rows = g->kind == NBI_GROUP_ROWS;
  nb_dtype in0 = input_dtype(g, k, 0);
  switch (kind_of(e)) {
  case M_VIEW: return e->n_in == 1 && in0 == e->dtype;
  case M_REDUCE: return rows && e->n_in == 1 && nbi_cpu_reduce_row_ok(op, e->dtype, in0);
  case M_AXIS:
    return rows && e->n_in == 1 && e->ai[0] == e->shape.ndim - 1 &&
           nbi_cpu_axis_row_ok(op, e->dtype, in0);
  default: break;
  }
  /* elementwise: computing in its own dtype (attrs.i[0]; a cast has none) */
  if (!(nbi_op_traits[op] & NBI_TR_EW) || op == NBI_OP_CAST || nbi_ew_is_pred[op] ||
      e->ai[0] != e->dtype)
    return false;
  if (op == NBI_OP_WHERE) return e->n_in == 3;
  const ew_rows *rt = &nbi_ew_rows_by_isa[NBI_ISA_PORTABLE];
  domain dom = domain_of(e->dtype);
  return e->n_in == 1 ? rt->un[dom][op] != NULL : e->n_in == 2 && rt->bin[dom][op] != NULL;
}

bool nbi_cpu_group_ok(void *ctx, const nbi_group *g) {
  (void)ctx;
  if (g->kind == NBI_GROUP_GEMM) return nbi_cpu_gemm_epi_ok(g);
  if (g->n_members < 1 || g->n_members > NBI_FUSE_MAX || (g->dtype != NB_F32 && g->dtype != NB_F64))
    return false;
  /* an elementwise group's walk takes its outputs and operands together */
  if (g->kind == NBI_GROUP_ELEMENTWISE && g->n_outputs + g->n_operands > NBI_ITER_MAX_OPS)
    return false;
  if (g->kind == NBI_GROUP_ROWS && (g->cols > ROW_MAX || g->rows < 1 || g->cols < 2)) return false;
  for (int k = 0; k < g->n_members; k++)
    if (!member_ok(g, k)) return false;
  return true;
}

/* ---- elementwise groups ------------------------------------------------------------------
 * Members of one float domain and one shape F, evaluated in one pass over the
 * units of one walk: per unit, each member's row function runs once on the
 * unit's elements, into a per-thread scratch buffer that later members read,
 * so values used only inside the group never reach memory; stored members
 * (output slots) are written to their buffers (the walk's outputs; later
 * members read them back from there, or from scratch when the walk streams).
 * Operands are the walk's inputs, read as the single-op kernel reads them. The
 * plan resolves every member's row function, operands and scratch slot once
 * per call. */
typedef struct fused_member {
  member_kind kind;
  int n_in;
  int src[3]; /* operand: an earlier member, or -1 - its walk operand */
  int out;    /* the walk output it is stored to, or -1 */
  int val;    /* its scratch slot (freed after its last reader), or -1: not
                 stored, or stored when the walk does not stream */
  unary_row un;
  binary_row bin;
  where_row where;
} fused_member;

typedef struct fused_plan {
  _Alignas(64) int m; /* own cache lines, as ew_walk */
  ew_plan pl;         /* domain, compute dtype, element size: for operand conversions */
  fused_member mb[NBI_FUSE_MAX];
} fused_plan;

/* o[0..n) = p[0..n) (s = 1) or n copies of p[0] (s = 0), es bytes each: a
 * view member. */
static void copy_row(size_t es, void *restrict o, const void *restrict p, int64_t s, int64_t n) {
  if (s) {
    memcpy(o, p, (size_t)n * es);
    return;
  }
  for (int64_t j = 0; j < n; j++)
    memcpy((char *)o + (size_t)j * es, p, es);
}

static void fused_unit(const fused_plan *fp, const ew_walk *w, const ew_unit *u, char *val,
                       chunk_buf *tmp) {
  const void *mv[NBI_FUSE_MAX]; /* each member's values, contiguous */
  int64_t n = u->len;
  for (int k = 0; k < fp->m; k++) {
    const fused_member *mb = &fp->mb[k];
    const void *p[3];
    int64_t ps[3];
    for (int q = 0; q < mb->n_in; q++) {
      if (mb->src[q] >= 0) {
        p[q] = mv[mb->src[q]];
        ps[q] = 1;
      } else {
        ps[q] = unit_operand(&fp->pl, w, u, -1 - mb->src[q], mb->kind == M_WHERE && q == 0, &tmp[q],
                             &p[q]);
      }
    }
    void *o = mb->val < 0 ? (void *)unit_at(w, u, mb->out)
                          : (void *)(val + (int64_t)mb->val * FUSE_CHUNK * fp->pl.des);
    switch (mb->kind) {
    case M_VIEW: copy_row((size_t)fp->pl.des, o, p[0], ps[0], n); break;
    case M_WHERE: mb->where(o, p[0], ps[0], p[1], ps[1], p[2], ps[2], n); break;
    case M_UNARY: mb->un(o, p[0], ps[0], n); break;
    default: mb->bin(o, p[0], ps[0], p[1], ps[1], n); break;
    }
    mv[k] = o;
    if (mb->val >= 0 && mb->out >= 0) stream_out(unit_at(w, u, mb->out), o, n * fp->pl.des);
  }
}

static void fused_range(const fused_plan *fp, const ew_walk *w, int64_t u0, int64_t u1) {
  _Alignas(64) char val[NBI_FUSE_MAX * FUSE_CHUNK * 8]; /* the first slots in use */
  chunk_buf tmp[3];
  WALK_RANGE(w, u0, u1, u, fused_unit(fp, w, &u, val, tmp));
  stream_end(w->stream);
}

/* An elementwise group g: out[j] (contiguous, F's shape) are its output slots,
 * in[k] its operands broadcast to F (any strides). */
static nb_status elementwise_run(const nbi_group *g, nbi_view *out, const nbi_view *in) {
  int m = g->n_members, n_out = g->n_outputs;
  fused_plan fp = {.m = m, .pl.dom = domain_of(g->dtype)};
  fp.pl.cdt = domain_dtype[fp.pl.dom];
  fp.pl.des = (int64_t)nb_dtype_size(fp.pl.cdt);
  const ew_rows *rt = &nbi_ew_rows_by_isa[nbi_isa_active()];
  const nbi_view *views[NBI_ITER_MAX_OPS]; /* the walk's outputs, then its inputs */
  if (n_out + g->n_operands > NBI_ITER_MAX_OPS)
    return nbi_error(NB_ERR_INTERNAL, "nb_eval: a fused group has too many operands");
  for (int j = 0; j < n_out; j++)
    views[j] = &out[j];
  for (int k = 0; k < g->n_operands; k++)
    views[n_out + k] = &in[k];
  int last[NBI_FUSE_MAX]; /* each member's last reader */
  for (int k = 0; k < m; k++) {
    const nbi_group_member *e = &g->m[k];
    fused_member *mb = &fp.mb[k];
    last[k] = k;
    mb->n_in = e->n_in;
    mb->out = e->out;
    mb->kind = kind_of(e);
    if (mb->kind == M_WHERE)
      mb->where = rt->where[fp.pl.dom];
    else if (mb->kind == M_UNARY)
      mb->un = rt->un[fp.pl.dom][e->op];
    else if (mb->kind == M_BINARY)
      mb->bin = rt->bin[fp.pl.dom][e->op];
    for (int q = 0; q < e->n_in; q++) {
      int s = e->src[q];
      if (s >= 0) last[s] = k;
      mb->src[q] = s >= 0 ? s : -1 - (n_out + (-1 - s));
    }
  }
  ew_walk w;
  walk_init(&w, n_out + g->n_operands, views, n_out, FUSE_CHUNK);
  /* scratch slots: a member takes a free one, freed after its last reader */
  int owner[NBI_FUSE_MAX], n_slots = 0;
  for (int k = 0; k < m; k++) {
    fp.mb[k].val = -1;
    if (fp.mb[k].out >= 0 && !w.stream) continue;
    int s = 0;
    while (s < n_slots && last[owner[s]] >= k)
      s++;
    if (s == n_slots) n_slots++;
    owner[s] = k;
    fp.mb[k].val = s;
  }
  if (w.rows * w.n < NBI_PAR_MIN || w.units < 2) {
    fused_range(&fp, &w, 0, w.units);
    return NB_OK;
  }
#pragma omp parallel
  {
    int64_t u0, u1;
    thread_range(w.units, &u0, &u1);
    fused_range(&fp, &w, u0, u1);
  }
  return NB_OK;
}

/* ---- row groups --------------------------------------------------------------------------
 * A row group runs row by row: a member of the full shape F gets its row of N
 * (F's trailing elements) in a scratch row, or straight in its buffer when
 * stored; a reduction folds its input's row with the kernel's own row routine
 * (nbi_cpu_reduce_row); a per-row member is one scalar per row; an axis op
 * along the last axis (softmax, log_softmax, cumsum) is a full member computed
 * by its kernel's row routine (nbi_cpu_axis_row). Operands are views of F's
 * dims: per row, an offset from the row index and the strides of the row dims,
 * then either one stride over the row (read in place when it is 0 or 1 and of
 * the domain's type) or a gather of its trailing dims (a per-row or global
 * operand has stride 0 along the row: one value). Blocks of rows go to the
 * threads; each thread gets its part of one scratch block from the buffer
 * cache. Global members (single values from all rows) run after the row loop,
 * on the stored per-row values. */

/* An operand as a row group reads it: dims [0, ra) index rows, dims [ra, nd)
 * the row. */
typedef struct row_ext {
  const char *data;
  nb_dtype dt;
  int nd, ra;
  int64_t dims[NB_MAX_DIMS], st[NB_MAX_DIMS];
  int64_t s; /* the one element stride of the row's dims, or INT64_MIN when none */
} row_ext;

typedef struct row_plan {
  int m, ra, n_slots;
  domain dom;
  const ew_rows *rt; /* the active ISA's row functions */
  size_t es;
  int64_t rows, n;
  size_t pitch; /* bytes between scratch rows (n elements, 64-byte aligned) */
  const nbi_group *g;
  member_kind kind[NBI_FUSE_MAX];
  bool full[NBI_FUSE_MAX];   /* member has the full shape (else one value per row) */
  bool global[NBI_FUSE_MAX]; /* member is one value computed after the rows */
  int slot[NBI_FUSE_MAX];    /* scratch row of an unstored full member, or -1 */
  char *out[NBI_FUSE_MAX];   /* buffer of a stored member, or NULL */
  row_ext ext[NBI_FUSE_MAX];
  /* a sum (mean) of a product row that nothing else reads: the product member
   * is folded (never computed) and the reduction reads its factors' rows
   * (nbi_cpu_reduce_row_dot) */
  bool folded[NBI_FUSE_MAX], dot[NBI_FUSE_MAX];
  /* a dot whose product reads an f32 log_softmax row that nothing else reads:
   * that member is folded too, the dot forms its row in registers
   * (nbi_cpu_reduce_row_dot_lsm: cross-entropy with probability labels); the
   * log_softmax member, or -1 */
  int lsm[NBI_FUSE_MAX];
  bool stream;                /* stored full members go out by stream_out */
  int n_pf, pf[NBI_FUSE_MAX]; /* ext rows prefetched a row ahead */
} row_plan;

static row_ext row_ext_of(const nbi_view *v, int ra) {
  row_ext e = {.data = v->data, .dt = v->dtype, .nd = v->ndim, .ra = ra, .s = INT64_MIN};
  memcpy(e.dims, v->dims, sizeof e.dims);
  memcpy(e.st, v->strides, sizeof e.st);
  int last = -1; /* the row's dims collapse to one stride when consecutive ones nest */
  bool one = true;
  for (int d = ra; d < e.nd; d++) {
    if (e.dims[d] == 1) continue;
    if (last >= 0 && e.st[last] != e.st[d] * e.dims[d]) one = false;
    last = d;
  }
  if (one && last >= 0) e.s = e.st[last];
  return e;
}

/* Element offset of row r's first element (r < the product of the row dims:
 * the outermost takes the quotient without a division: 2-D views divide
 * nothing). */
static int64_t row_ext_offset(const row_ext *e, int64_t r) {
  int64_t off = 0;
  for (int d = e->ra - 1; d > 0; d--) {
    off += r % e->dims[d] * e->st[d];
    r /= e->dims[d];
  }
  return e->ra > 0 ? off + r * e->st[0] : off;
}

/* Rows up to this many bytes, read whole in place, are prefetched a row ahead
 * (fused_row): a row of a page or less starts where the hardware prefetcher,
 * which stops at page boundaries, has no stream yet. */
enum { ROW_PREFETCH_MAX = 16384 };

/* Adds ext i of rp (read as whole rows) to the prefetched ones when it is read
 * in place, its rows differ, and no other prefetched ext reads the same rows. */
static void row_ext_prefetch(row_plan *rp, int i) {
  const row_ext *e = &rp->ext[i];
  bool varies = false;
  for (int d = 0; d < e->ra; d++)
    varies = varies || (e->dims[d] > 1 && e->st[d] != 0);
  if (e->s != 1 || !varies || rp->n * (int64_t)nb_dtype_size(e->dt) > ROW_PREFETCH_MAX) return;
  for (int k = 0; k < rp->n_pf; k++) {
    const row_ext *o = &rp->ext[rp->pf[k]];
    if (o->data == e->data && o->dt == e->dt && !memcmp(o->st, e->st, sizeof e->st)) return;
  }
  rp->pf[rp->n_pf++] = i;
}

/* Copies row r's n elements of e into buf, converted to the domain's type
 * (bool as bytes 0/1 when cond). */
static void row_ext_gather(const row_plan *rp, const row_ext *e, int64_t r, void *buf, bool cond) {
  int64_t idx[NB_MAX_DIMS] = {0}, in = e->dims[e->nd - 1], ins = e->st[e->nd - 1];
  size_t es = nb_dtype_size(e->dt);
  for (int64_t j = 0; j < rp->n; j += in) {
    int64_t off = row_ext_offset(e, r);
    for (int d = e->ra; d < e->nd - 1; d++)
      off += idx[d] * e->st[d];
    const char *p = e->data + off * (int64_t)es;
    if (cond)
      for (int64_t i = 0; i < in; i++)
        ((uint8_t *)buf)[j + i] = p[i * ins] != 0;
    else
      load(rp->dom, (char *)buf + j * (int64_t)rp->es, p, e->dt, ins, in);
    for (int d = e->nd - 2; d >= e->ra && ++idx[d] == e->dims[d]; d--)
      idx[d] = 0;
  }
}

/* Points *p at row r of e for a consumer of n elements per row (1 when e is
 * per-row): in place or gathered into buf; returns the stride of *p (0 or 1).
 * contig: always n values at stride 1 (a reduction's input). */
static int64_t row_ext_row(const row_plan *rp, const row_ext *e, int64_t r, int64_t n, void *buf,
                           bool cond, bool contig, const void **p) {
  const char *base = e->data + row_ext_offset(e, r) * (int64_t)nb_dtype_size(e->dt);
  int64_t s = n == 1 ? 0 : e->s;
  if (s == INT64_MIN || (contig && (s != 1 || e->dt != domain_dtype[rp->dom]))) {
    row_ext_gather(rp, e, r, buf, cond);
    *p = buf;
    return 1;
  }
  if (cond) {
    if (s == 0 || s == 1) {
      *p = base;
      return s;
    }
    for (int64_t j = 0; j < n; j++)
      ((uint8_t *)buf)[j] = base[j * s] != 0;
    *p = buf;
    return 1;
  }
  ew_plan pl = {.dom = rp->dom, .cdt = domain_dtype[rp->dom]};
  return operand(&pl, base, e->dt, s, n, buf, p);
}

/* Points *p at row r of input q of member k (n: the member's elements per row)
 * and returns its stride; row[] and val[] hold the earlier members' rows and
 * per-row values, scr the thread's scratch (operand rows after the slots). */
static inline __attribute__((always_inline)) int64_t
member_input_at(const row_plan *rp, int64_t r, int k, int q, int64_t n, const void *const *row,
                char (*val)[8], char *scr, int bq, const void **p) {
  const nbi_group_member *t = &rp->g->m[k];
  int src = t->src[q];
  if (src >= 0) {
    *p = rp->full[src] ? row[src] : (const void *)val[src];
    return rp->full[src] ? 1 : 0;
  }
  /* a row op (and a folded product's factors) reads its input's row as n contiguous values */
  member_kind kind = rp->kind[k];
  bool row_op = kind == M_REDUCE || kind == M_AXIS || rp->folded[k];
  char *buf = scr + (size_t)(rp->n_slots + bq) * rp->pitch; /* operand row bq */
  return row_ext_row(rp, &rp->ext[-1 - src], r, row_op ? rp->n : n, buf, kind == M_WHERE && q == 0,
                     row_op, p);
}

/* member_input_at reading into operand row q */
static inline __attribute__((always_inline)) int64_t
member_input(const row_plan *rp, int64_t r, int k, int q, int64_t n, const void *const *row,
             char (*val)[8], char *scr, const void **p) {
  return member_input_at(rp, r, k, q, n, row, val, scr, q, p);
}

/* Evaluates row r of every member; scr: the thread's scratch rows, then three
 * operand rows. */
static void fused_row(const row_plan *rp, int64_t r, char *scr) {
  _Alignas(8) char val[NBI_FUSE_MAX][8]; /* per-row members' values */
  const void *row[NBI_FUSE_MAX];         /* full members' rows */
  size_t rowbytes = (size_t)rp->n * rp->es;
  for (int i = 0; i < rp->n_pf && r + 1 < rp->rows; i++) {
    const row_ext *e = &rp->ext[rp->pf[i]];
    int64_t es = (int64_t)nb_dtype_size(e->dt);
    const char *next = e->data + row_ext_offset(e, r + 1) * es;
    for (int64_t j = 0; j < rp->n * es; j += 64)
      __builtin_prefetch(next + j);
  }
  for (int k = 0; k < rp->m; k++) {
    const nbi_group_member *t = &rp->g->m[k];
    member_kind kind = rp->kind[k];
    int64_t n = rp->full[k] ? rp->n : 1;
    const void *p[3];
    int64_t ps[3];
    if (rp->global[k] || rp->folded[k]) continue;
    if (rp->dot[k]) { /* the factors of the folded product, read as its inputs */
      int f = t->src[0], l = rp->lsm[k];
      const void *a, *b;
      double v;
      if (l >= 0) { /* the other factor and the log_softmax's input (operand row 2) */
        member_input(rp, r, f, rp->g->m[f].src[0] == l, rp->n, row, val, scr, &a);
        member_input_at(rp, r, l, 0, rp->n, row, val, scr, 2, &b);
        v = nbi_cpu_reduce_row_dot_lsm(t, a, b, rp->n);
      } else {
        member_input(rp, r, f, 0, rp->n, row, val, scr, &a);
        if (rp->g->m[f].n_in == 2)
          member_input(rp, r, f, 1, rp->n, row, val, scr, &b);
        else
          b = a;
        v = nbi_cpu_reduce_row_dot(t, a, b, rp->n);
      }
      if (rp->dom == DOM_F32)
        *(float *)val[k] = (float)v;
      else
        *(double *)val[k] = v;
      if (rp->out[k]) memcpy(rp->out[k] + (size_t)r * rp->es, val[k], rp->es);
      continue;
    }
    for (int q = 0; q < t->n_in; q++)
      ps[q] = member_input(rp, r, k, q, n, row, val, scr, &p[q]);
    void *o = rp->full[k] ? (rp->slot[k] < 0 ? rp->out[k] + (size_t)r * rowbytes
                                             : scr + (size_t)rp->slot[k] * rp->pitch)
                          : (void *)val[k];
    switch (kind) {
    case M_REDUCE: {
      double v = nbi_cpu_reduce_row(t, p[0], rp->n, rp->rows);
      if (rp->dom == DOM_F32)
        *(float *)o = (float)v;
      else
        *(double *)o = v;
      break;
    }
    case M_AXIS: nbi_cpu_axis_row(t, p[0], o, n); break;
    case M_VIEW: copy_row(rp->es, o, p[0], ps[0], n); break;
    case M_WHERE: rp->rt->where[rp->dom](o, p[0], ps[0], p[1], ps[1], p[2], ps[2], n); break;
    case M_UNARY: rp->rt->un[rp->dom][t->op](o, p[0], ps[0], n); break;
    default: rp->rt->bin[rp->dom][t->op](o, p[0], ps[0], p[1], ps[1], n); break;
    }
    if (rp->full[k]) {
      row[k] = o;
      if (rp->out[k] && rp->slot[k] >= 0)
        stream_out(rp->out[k] + (size_t)r * rowbytes, o, (int64_t)rowbytes);
    } else if (rp->out[k]) {
      memcpy(rp->out[k] + (size_t)r * rp->es, o, rp->es);
    }
  }
}

/* The global members, in order, after every row: a reduction of all rows of
 * a (stored) per-row member, elementwise ops and views on single values. */
static void fused_global(const row_plan *rp) {
  _Alignas(8) char val[NBI_FUSE_MAX][8], tmp[3][8];
  for (int k = 0; k < rp->m; k++) {
    const nbi_group_member *t = &rp->g->m[k];
    member_kind kind = rp->kind[k];
    if (!rp->global[k]) continue;
    const void *p[3];
    int64_t ps[3];
    for (int q = 0; q < t->n_in; q++) {
      int src = t->src[q];
      if (src >= 0) {
        p[q] = rp->global[src] ? (const void *)val[src] : (const void *)rp->out[src];
        ps[q] = 0;
      } else {
        ps[q] = row_ext_row(rp, &rp->ext[-1 - src], 0, 1, tmp[q], kind == M_WHERE && q == 0, false,
                            &p[q]);
      }
    }
    void *o = val[k];
    switch (kind) {
    case M_REDUCE: {
      double v = nbi_cpu_reduce_row(t, p[0], rp->rows, 1);
      if (rp->dom == DOM_F32)
        *(float *)o = (float)v;
      else
        *(double *)o = v;
      break;
    }
    case M_VIEW: copy_row(rp->es, o, p[0], ps[0], 1); break;
    case M_WHERE: rp->rt->where[rp->dom](o, p[0], ps[0], p[1], ps[1], p[2], ps[2], 1); break;
    case M_UNARY: rp->rt->un[rp->dom][t->op](o, p[0], ps[0], 1); break;
    default: rp->rt->bin[rp->dom][t->op](o, p[0], ps[0], p[1], ps[1], 1); break;
    }
    if (rp->out[k]) memcpy(rp->out[k], o, rp->es);
  }
}

/* A row group g: rows x cols of F (F's axes [0, ra) index rows); out[j] are
 * its output slots (contiguous: F, rows values or one value by the member's
 * role), in[k] its operands as views of F's dims. */
static nb_status rows_run(const nbi_group *g, nbi_view *out, const nbi_view *in) {
  int m = g->n_members;
  row_plan rp = {.m = m, .ra = g->ra, .g = g, .dom = domain_of(g->dtype)};
  rp.rt = &nbi_ew_rows_by_isa[nbi_isa_active()];
  rp.es = nb_dtype_size(domain_dtype[rp.dom]);
  rp.rows = g->rows;
  rp.n = g->cols;
  for (int k = 0; k < g->n_operands; k++) { /* whole rows of full-level operands prefetch */
    rp.ext[k] = row_ext_of(&in[k], g->ra);
    if (g->operand[k].level == NBI_ROLE_FULL) row_ext_prefetch(&rp, k);
  }
  /* scratch rows: an unstored full member takes a free one, freed after its last use */
  int last[NBI_FUSE_MAX], owner[NBI_FUSE_MAX];
  for (int k = 0; k < m; k++) {
    const nbi_group_member *e = &g->m[k];
    last[k] = k;
    rp.lsm[k] = -1;
    rp.kind[k] = kind_of(e);
    rp.full[k] = e->role == NBI_ROLE_FULL || e->role == NBI_ROLE_AXIS;
    rp.global[k] = e->role == NBI_ROLE_GLOBAL || e->role == NBI_ROLE_GLOBAL_REDUCE;
    rp.out[k] = e->out >= 0 ? out[e->out].data : NULL;
    for (int q = 0; q < e->n_in; q++)
      if (e->src[q] >= 0) last[e->src[q]] = k;
  }
  /* products folded into their sums: a MUL or SQUARE member of full rows that
   * nothing but one sum (mean) reads and nothing stores; its factors then live
   * until the sum */
  int uses[NBI_FUSE_MAX] = {0};
  for (int k = 0; k < m; k++)
    for (int q = 0; q < g->m[k].n_in; q++)
      if (g->m[k].src[q] >= 0) uses[g->m[k].src[q]]++;
  for (int k = 0; k < m; k++) {
    int f = g->m[k].src[0];
    if (rp.kind[k] != M_REDUCE || rp.global[k] || f < 0 || !rp.full[f] || rp.out[f] ||
        uses[f] != 1 || !nbi_cpu_reduce_row_dot_ok(&g->m[k], rp.n, rp.rows))
      continue;
    const nbi_group_member *e = &g->m[f];
    bool ok = (e->op == NBI_OP_MUL && e->n_in == 2) || (e->op == NBI_OP_SQUARE && e->n_in == 1);
    for (int q = 0; ok && q < e->n_in; q++)
      ok = e->src[q] < 0 || rp.full[e->src[q]];
    if (!ok) continue;
    rp.folded[f] = rp.dot[k] = true;
    for (int q = 0; q < e->n_in; q++)
      if (e->src[q] >= 0 && last[e->src[q]] < k) last[e->src[q]] = k;
    /* a factor that is a log_softmax row only this product reads */
    for (int q = 0; q < 2 && e->op == NBI_OP_MUL; q++) {
      int l = e->src[q], o = e->src[1 - q];
      if (l < 0 || l == o || rp.out[l] || uses[l] != 1 || rp.kind[l] != M_AXIS ||
          !nbi_cpu_reduce_row_dot_lsm_ok(&g->m[k], &g->m[l], rp.n, rp.rows))
        continue;
      rp.lsm[k] = l;
      rp.folded[l] = true;
      int z = g->m[l].src[0]; /* its input, read at the dot now */
      if (z >= 0 && last[z] < k) last[z] = k;
      break;
    }
  }
  /* streamed: a stored full member computes into a scratch row too */
  int64_t out_bytes = 0;
  for (int k = 0; k < m; k++)
    if (rp.full[k] && rp.out[k]) out_bytes += rp.rows * rp.n * (int64_t)rp.es;
  rp.stream = out_bytes >= STREAM_MIN;
  for (int k = 0; k < m; k++) {
    rp.slot[k] = -1;
    if (!rp.full[k] || rp.folded[k] || (rp.out[k] && !rp.stream)) continue;
    int s = 0;
    while (s < rp.n_slots && last[owner[s]] >= k)
      s++;
    if (s == rp.n_slots) rp.n_slots++;
    owner[s] = k;
    rp.slot[k] = s;
  }
  rp.pitch = ((size_t)rp.n * rp.es + 63) / 64 * 64;
  size_t scr_bytes = (size_t)(rp.n_slots + 3) * rp.pitch;
  int64_t rb = 8192 / rp.n + 1, n_blocks = (rp.rows + rb - 1) / rb;
  /* per-thread scratch, one block from the buffer cache (nothing allocated per call) */
  bool par = rp.rows * rp.n >= NBI_PAR_MIN && n_blocks > 1;
  int n_threads = par ? omp_get_max_threads() : 1;
  char *scr_all = nbi_cpu_scratch("nb_eval", scr_bytes * (size_t)n_threads);
  if (!scr_all) return NB_ERR_OOM;
  if (!par) { /* no OpenMP region (even an inactive one costs about a microsecond) */
    for (int64_t r = 0; r < rp.rows; r++)
      fused_row(&rp, r, scr_all);
    stream_end(rp.stream);
  } else {
#pragma omp parallel num_threads(n_threads)
    {
      char *scr = scr_all + (size_t)omp_get_thread_num() * scr_bytes;
#pragma omp for schedule(dynamic)
      for (int64_t b = 0; b < n_blocks; b++)
        for (int64_t r = b * rb; r < rp.rows && r < (b + 1) * rb; r++)
          fused_row(&rp, r, scr);
      stream_end(rp.stream);
    }
  }
  nbi_cpu_scratch_free(scr_all);
  fused_global(&rp);
  return NB_OK;
}

nb_status nbi_cpu_run_group(void *ctx, const nbi_group *g, nbi_view *out, const nbi_view *in) {
  (void)ctx;
  switch (g->kind) {
  case NBI_GROUP_GEMM: return nbi_cpu_gemm_epi_run(g, out, in);
  case NBI_GROUP_ROWS: return rows_run(g, out, in);
  default: return elementwise_run(g, out, in);
  }
}
