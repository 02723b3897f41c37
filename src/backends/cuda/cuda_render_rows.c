/* src/backends/cuda/cuda_render_rows.c — row groups (backend.h: FULL, AXIS,
 * ROW_REDUCE, PER_ROW members, then GLOBAL_REDUCE / GLOBAL ones) as CUDA C.
 *
 * Launch shape: rows of up to 1024 columns go one warp per row (8 rows per block of 256
 * threads; every reduction a warp shuffle tree, no __syncthreads); longer rows go one
 * block per row (256 threads, 1024 beyond 8192 columns; reductions are shuffle trees,
 * then shared memory across the warps). Blocks step through the rows (grid stride), at
 * most 16 per multiprocessor.
 *
 * Phases: a row is walked once per phase; phase p computes every FULL member needed
 * by the reductions scheduled in it and stores the stored FULL members whose value
 * is first computable in it. A value's level is the phase from which it can be
 * computed: operands 0; an elementwise member the max of its inputs'; a reduction of
 * a level-L value folds in phase L and is known from level L + 1 (var and logsumexp
 * fold twice: sum then squared deviations, max then sum of exponentials; known from
 * L + 2); softmax / log_softmax of a level-L value takes max and sum of exponentials
 * as those and is computable from L + 2; cumsum keeps its input's level, as a block
 * scan (chunk by chunk, with a carry) in whichever phase reads it. FULL members are
 * recomputed in every phase that needs them (arithmetic is cheap), and their operands
 * are not kept in shared memory: when a thread has at most 32 columns of a row (rows up
 * to 32768 columns), the operands read in two phases or more are kept in registers
 * (o<e>_c[], at most 64 words a thread; the phase loops are unrolled to the row's
 * length rounded up to a power of two, which the source depends on), so the row is
 * read from memory once; longer rows are read again in each phase (L1 / L2 hits).
 * Those unrolled loops come twice: for a row of exactly that length (no bounds
 * checks; loads at base + constant) and for shorter rows, whose lanes past the end
 * load zeros from nb_ld_zeros instead of branching around the load, so a phase's
 * loads are issued back to back.
 * Per-row members are computed by every thread of the row once the reductions they read
 * are known (stored by lane 0).
 *
 * Accuracy and determinism: float-domain sums (sum, mean, var, the sums of
 * exponentials, cumsum) accumulate in double, as the CPU's states do; products in
 * double; integers wrap in 64 bits. Each thread folds its columns in order, then the
 * threads combine in a tree fixed by the block shape: the same bits every run.
 * argmax / argmin take the first NaN, else the first extreme (NumPy); max / min and
 * logsumexp propagate NaN.
 *
 * Global members (a loss's mean over the rows) run in a second kernel, <name>_g, one
 * block of 256 threads launched after the first: a global reduction reads the per-row
 * member it reduces from that member's output slot (the planner stores it) and folds
 * the rows as the row kernel folds columns; global elementwise members follow. */
#include "cuda_render.h"

#include <stdio.h>

/* UNROLL: columns per thread per step of a phase's loop (independent loads in flight);
 * CACHE_MAX: the most columns per thread kept in registers; CACHE_WORDS: the most
 * 4-byte registers per thread the kept operands may take. */
enum { UNROLL = 4, CACHE_MAX = 32, CACHE_WORDS = 64 };

/* ---- structure -------------------------------------------------------------------------- */
static bool is_axis(int op) {
  return op == NBI_OP_SOFTMAX || op == NBI_OP_LOG_SOFTMAX || op == NBI_OP_CUMSUM;
}

/* Reductions that fold twice (a first pass gives the second its centre). */
static int passes_of(int op) {
  return op == NBI_OP_REDUCE_VAR || op == NBI_OP_LOGSUMEXP || op == NBI_OP_SOFTMAX ||
                 op == NBI_OP_LOG_SOFTMAX
             ? 2
         : op == NBI_OP_CUMSUM ? 0
                               : 1;
}

static bool role_is(const nbi_group *g, int s, int a, int b, int c) {
  if (s < 0) return false;
  int r = g->m[s].role;
  return r == a || r == b || r == c;
}

/* The domain a reduction or axis op of an input of dtype in computes in (k_reduce.c's
 * compute_dtype): f64 in double, other floats in float; integers as int64, except for
 * the float-result ops (var, logsumexp, softmax), which read them as f32. */
static int red_domain(int op, nb_dtype in) {
  if (in == NB_F64) return CR_DOM_D;
  bool float_result = op == NBI_OP_REDUCE_VAR || op == NBI_OP_LOGSUMEXP || op == NBI_OP_SOFTMAX ||
                      op == NBI_OP_LOG_SOFTMAX;
  return float_result || nb_dtype_is_float(in) ? CR_DOM_F : CR_DOM_I;
}

bool cr_rows_ok(const nbi_group *g) {
  int nd = g->full.ndim;
  if (g->ra < 0 || g->ra > nd) return false;
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    if (!nbi_dtype_valid(m->dtype)) return false;
    bool reads_ok = true;
    switch (m->role) {
    case NBI_ROLE_FULL:
      for (int q = 0; q < m->n_in; q++)
        reads_ok = reads_ok && (m->src[q] < 0 || !role_is(g, m->src[q], NBI_ROLE_GLOBAL,
                                                          NBI_ROLE_GLOBAL_REDUCE, -1));
      if (!reads_ok || !cr_elementwise_ok(g, k)) return false;
      break;
    case NBI_ROLE_AXIS:
    case NBI_ROLE_ROW_REDUCE:
      if (m->n_in != 1 || (m->role == NBI_ROLE_AXIS ? !is_axis(m->op) : !cr_is_reduce(m->op)))
        return false;
      if (m->role == NBI_ROLE_AXIS && g->ra != nd - 1) return false; /* along F's last axis */
      if (m->src[0] >= 0 && !role_is(g, m->src[0], NBI_ROLE_FULL, NBI_ROLE_AXIS, -1)) return false;
      if (!nbi_dtype_valid(cr_src_dtype(g, m->src[0]))) return false;
      break;
    case NBI_ROLE_PER_ROW:
      for (int q = 0; q < m->n_in; q++)
        reads_ok = reads_ok && (m->src[q] < 0 ||
                                role_is(g, m->src[q], NBI_ROLE_ROW_REDUCE, NBI_ROLE_PER_ROW, -1));
      if (!reads_ok || !cr_elementwise_ok(g, k)) return false;
      break;
    case NBI_ROLE_GLOBAL_REDUCE: /* of a stored per-row member */
      if (m->n_in != 1 || !cr_is_reduce(m->op) ||
          !role_is(g, m->src[0], NBI_ROLE_ROW_REDUCE, NBI_ROLE_PER_ROW, -1) ||
          g->m[m->src[0]].out < 0)
        return false;
      break;
    case NBI_ROLE_GLOBAL:
      for (int q = 0; q < m->n_in; q++)
        reads_ok = reads_ok && (m->src[q] < 0 ||
                                role_is(g, m->src[q], NBI_ROLE_GLOBAL, NBI_ROLE_GLOBAL_REDUCE, -1));
      if (!reads_ok || !cr_elementwise_ok(g, k)) return false;
      break;
    default: return false;
    }
  }
  return true;
}

/* ---- levels and phases ---------------------------------------------------------------------- */
typedef struct rows_plan {
  int lvl[NBI_FUSE_MAX];      /* see the top */
  int phase[NBI_FUSE_MAX][2]; /* the phases a member's folds run in, -1: none */
  int n_phases;
} rows_plan;

static bool in_rows(int role) { return role != NBI_ROLE_GLOBAL && role != NBI_ROLE_GLOBAL_REDUCE; }

static void plan_rows(const nbi_group *g, rows_plan *P) {
  P->n_phases = 0;
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    int L = 0;
    for (int q = 0; q < m->n_in; q++)
      if (m->src[q] >= 0 && P->lvl[m->src[q]] > L) L = P->lvl[m->src[q]];
    int np = m->role == NBI_ROLE_ROW_REDUCE || m->role == NBI_ROLE_AXIS ? passes_of(m->op) : 0;
    P->phase[k][0] = np > 0 ? L : -1;
    P->phase[k][1] = np > 1 ? L + 1 : -1;
    P->lvl[k] = L + np;
    if (np > 0 && L + np > P->n_phases) P->n_phases = L + np;
    bool full = m->role == NBI_ROLE_FULL || m->role == NBI_ROLE_AXIS;
    if (full && m->out >= 0 && P->lvl[k] + 1 > P->n_phases) P->n_phases = P->lvl[k] + 1;
  }
}

/* Marks the FULL / AXIS members phase p computes: inputs of its folds, stored ones first
 * computable in it, and their inputs. Returns whether any is a cumsum (a scan phase). */
static bool phase_members(const nbi_group *g, const rows_plan *P, int p, bool *need) {
  memset(need, 0, sizeof(bool) * NBI_FUSE_MAX);
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    if ((P->phase[k][0] == p || P->phase[k][1] == p) && m->src[0] >= 0) need[m->src[0]] = true;
    if ((m->role == NBI_ROLE_FULL || m->role == NBI_ROLE_AXIS) && m->out >= 0 && P->lvl[k] == p)
      need[k] = true;
  }
  bool scan = false;
  for (int k = g->n_members - 1; k >= 0; k--) {
    const nbi_group_member *m = &g->m[k];
    if (!need[k] || (m->role != NBI_ROLE_FULL && m->role != NBI_ROLE_AXIS)) {
      need[k] = false;
      continue;
    }
    scan = scan || m->op == NBI_OP_CUMSUM;
    for (int q = 0; q < m->n_in; q++)
      if (role_is(g, m->src[q], NBI_ROLE_FULL, NBI_ROLE_AXIS, -1)) need[m->src[q]] = true;
  }
  return scan;
}

/* ---- layout -------------------------------------------------------------------------------------
 */
static bool contiguous(const nbi_view *v) {
  int64_t c = 1;
  for (int d = v->ndim - 1; d >= 0; d--) {
    if (v->dims[d] != 1 && v->strides[d] != c) return false;
    c *= v->dims[d];
  }
  return true;
}

static int64_t numel_of(const nbi_view *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++)
    n *= v->dims[d];
  return n;
}

/* Merges dims [d0, d1) of F (size-1 dims dropped, a dim joined to the previous one
 * when every operand nests) into L->dims from index base; returns how many. */
static int merge_dims(const nbi_group *g, const nb_shape *F, int64_t st[][NB_MAX_DIMS], int d0,
                      int d1, cr_layout *L, int base) {
  int n = 0;
  for (int d = d0; d < d1; d++) {
    if (F->dims[d] == 1) continue;
    bool join = n > 0;
    for (int e = 0; e < g->n_operands && join; e++)
      join = L->st[e][base + n - 1] == st[e][d] * F->dims[d];
    if (join) {
      L->dims[base + n - 1] *= F->dims[d];
      for (int e = 0; e < g->n_operands; e++)
        L->st[e][base + n - 1] = st[e][d];
    } else {
      L->dims[base + n] = F->dims[d];
      for (int e = 0; e < g->n_operands; e++)
        L->st[e][base + n] = st[e][d];
      n++;
    }
  }
  return n;
}

nb_status cr_rows_layout(const nbi_group *g, const nbi_view *out, const nbi_view *in,
                         cr_layout *L) {
  const nb_shape *F = &g->full;
  int ra = g->ra, nd = F->ndim;
  int64_t st[NBI_FUSE_MAX][NB_MAX_DIMS] = {{0}};
  L->n = 1;
  L->cols = 1;
  for (int d = 0; d < nd; d++)
    *(d < ra ? &L->n : &L->cols) *= F->dims[d];
  for (int e = 0; e < g->n_operands; e++) {
    const nbi_view *v = &in[e];
    bool ok = v->dtype == g->operand[e].dtype && v->ndim == nd;
    for (int d = 0; d < nd && ok; d++) {
      ok = v->dims[d] == F->dims[d] || v->dims[d] == 1;
      bool zero = v->dims[d] != F->dims[d] || F->dims[d] == 1 ||
                  g->operand[e].level == NBI_ROLE_GLOBAL ||
                  (g->operand[e].level == NBI_ROLE_PER_ROW && d >= ra);
      st[e][d] = zero ? 0 : v->strides[d];
    }
    if (!ok)
      return nbi_error(NB_ERR_INTERNAL, "nb_eval: fused row group operand %d is not a %s view of F",
                       e, nb_dtype_name(g->operand[e].dtype));
    L->ptr[e] = v->data;
  }
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    if (m->out < 0) continue;
    const nbi_view *v = &out[m->out];
    int64_t want = m->role == NBI_ROLE_FULL || m->role == NBI_ROLE_AXIS ? L->n * L->cols
                   : in_rows(m->role)                                   ? L->n
                                                                        : 1;
    if (v->dtype != m->dtype || numel_of(v) != want || !contiguous(v))
      return nbi_error(NB_ERR_INTERNAL,
                       "nb_eval: fused row group output %d is not a contiguous %s of %lld "
                       "elements",
                       m->out, nb_dtype_name(m->dtype), (long long)want);
    L->ptr[NBI_FUSE_MAX + m->out] = v->data;
  }
  int nrd = merge_dims(g, F, st, 0, ra, L, 0);
  int ncd = merge_dims(g, F, st, ra, nd, L, nrd);
  L->sig.nrd = (uint8_t)nrd;
  L->sig.ncd = (uint8_t)ncd;
  bool row_general = false, col_general = false;
  for (int e = 0; e < g->n_operands; e++) {
    bool rz = true, cz = true;
    for (int d = 0; d < nrd; d++)
      rz = rz && L->st[e][d] == 0;
    for (int d = nrd; d < nrd + ncd; d++)
      cz = cz && L->st[e][d] == 0;
    int col = cz                               ? CR_COL_ZERO
              : ncd == 1 && L->st[e][nrd] == 1 ? CR_COL_CONTIG
              : ncd == 1                       ? CR_COL_STRIDED
                                               : CR_COL_GENERAL;
    L->sig.cls[e] = (uint8_t)(col | (rz ? CR_ROW_ZERO : CR_ROW_GENERAL));
    row_general = row_general || !rz;
    col_general = col_general || col == CR_COL_GENERAL;
  }
  /* launch shape: a warp per row up to 1024 columns, else a block of 256 threads up to
   * 8192, then 1024; up to CACHE_MAX columns per thread stay in registers (a power of
   * two, so that few sources serve every length) */
  bool warp = L->cols <= 1024;
  L->sig.warp = warp;
  L->sig.block = warp || L->cols <= 8192 ? 256 : 1024;
  int64_t step = warp ? 32 : L->sig.block, k = 1;
  while (k * step < L->cols)
    k *= 2;
  L->sig.cache_k = k <= CACHE_MAX ? (uint8_t)k : 0;
  int64_t per_block = warp ? L->sig.block / 32 : 1;
  int64_t blocks = (L->n + per_block - 1) / per_block, cap = (int64_t)L->sm_count * 16;
  L->cfg->block = L->sig.block;
  L->cfg->grid = (unsigned)(blocks < cap ? blocks : cap);
  for (int k = 0; k < g->n_members; k++)
    if (!in_rows(g->m[k].role)) {
      L->cfg->grid2 = 1;
      L->cfg->block2 = 256;
    }
  /* parameters */
  char nm[12];
  int w;
#define FIELD(NAME, TYPE, COUNT)                                                                   \
  if ((w = cr_field_add(L, NAME, TYPE, COUNT)) < 0) return NB_ERR_INTERNAL
  FIELD("rows", CR_I64, 0);
  L->cfg->words[w] = (uint64_t)L->n;
  FIELD("cols", CR_I64, 0);
  L->cfg->words[w] = (uint64_t)L->cols;
  if (row_general && nrd > 1) {
    FIELD("rdim", CR_I64, nrd);
    for (int d = 0; d < nrd; d++)
      L->cfg->words[w + d] = (uint64_t)L->dims[d];
  }
  if (col_general) {
    FIELD("cdim", CR_I64, ncd);
    for (int d = 0; d < ncd; d++)
      L->cfg->words[w + d] = (uint64_t)L->dims[nrd + d];
  }
  for (int e = 0; e < g->n_operands; e++) {
    snprintf(nm, sizeof nm, "in%d", e);
    FIELD(nm, CR_CPTR, 0);
    L->cfg->words[w] = (uint64_t)(uintptr_t)L->ptr[e];
    if (L->sig.cls[e] & CR_ROW_GENERAL) {
      snprintf(nm, sizeof nm, "ir%d", e);
      FIELD(nm, CR_I64, nrd);
      for (int d = 0; d < nrd; d++)
        L->cfg->words[w + d] = (uint64_t)L->st[e][d];
    }
    int col = L->sig.cls[e] & 3;
    if (col == CR_COL_STRIDED || col == CR_COL_GENERAL) {
      snprintf(nm, sizeof nm, "ic%d", e);
      FIELD(nm, CR_I64, ncd);
      for (int d = 0; d < ncd; d++)
        L->cfg->words[w + d] = (uint64_t)L->st[e][nrd + d];
    }
  }
  for (int j = 0; j < g->n_outputs; j++) {
    snprintf(nm, sizeof nm, "out%d", j);
    FIELD(nm, CR_PTR, 0);
    L->cfg->words[w] = (uint64_t)(uintptr_t)L->ptr[NBI_FUSE_MAX + j];
  }
  for (int k = 0; k < g->n_members; k++) /* mean's divisor */
    if (g->m[k].op == NBI_OP_REDUCE_SUM && g->m[k].af[0] != 1) {
      snprintf(nm, sizeof nm, "dv%d", k);
      FIELD(nm, CR_F64, 0);
      memcpy(&L->cfg->words[w], &g->m[k].af[0], 8);
    }
#undef FIELD
  if (L->n == 0) L->cfg->grid = 0;
  return NB_OK;
}

/* ---- folds
 * ----------------------------------------------------------------------------------------- */
/* What member k's fold looks like in the source. */
typedef struct fold {
  int op, dom;
  const char *t;   /* the domain's type */
  const char *acc; /* the first pass's accumulator type */
  char x[48];      /* the input converted to the domain */
  char raw[16];    /* the input as it is */
  int redop;       /* nb_combine's OP of the first pass, or -1 (arg ops) */
  const char *id;  /* the first pass's identity */
} fold;

static void fold_of(const nbi_group *g, int k, fold *f) {
  const nbi_group_member *m = &g->m[k];
  nb_dtype in = cr_src_dtype(g, m->src[0]);
  f->op = m->op;
  f->dom = red_domain(m->op, in);
  f->t = cr_dom_type(f->dom);
  cr_src_name(g, k, m->src[0], f->raw);
  snprintf(f->x, sizeof f->x, "%s(%s)", cr_to_domain(in, f->dom, in), f->raw);
  bool ints = f->dom == CR_DOM_I;
  static const char *const inf[3] = {"NB_INF", "(double)NB_INF", "9223372036854775807LL"};
  static const char *const ninf[3] = {"-NB_INF", "-(double)NB_INF", "(-9223372036854775807LL - 1)"};
  f->redop = -1;
  switch (m->op) {
  case NBI_OP_REDUCE_SUM:
  case NBI_OP_REDUCE_VAR:
  case NBI_OP_CUMSUM:
    f->acc = ints ? "uint64_t" : "double";
    f->redop = 0;
    f->id = "0";
    break;
  case NBI_OP_REDUCE_PROD:
    f->acc = ints ? "uint64_t" : "double";
    f->redop = 1;
    f->id = "1";
    break;
  case NBI_OP_REDUCE_MAX:
  case NBI_OP_LOGSUMEXP:
  case NBI_OP_SOFTMAX:
  case NBI_OP_LOG_SOFTMAX:
    f->acc = f->t;
    f->redop = 2;
    f->id = ninf[f->dom];
    break;
  case NBI_OP_REDUCE_MIN:
    f->acc = f->t;
    f->redop = 3;
    f->id = inf[f->dom];
    break;
  case NBI_OP_REDUCE_ANY:
  case NBI_OP_REDUCE_ALL:
    f->acc = "int";
    f->redop = m->op == NBI_OP_REDUCE_ANY ? 4 : 5;
    f->id = m->op == NBI_OP_REDUCE_ANY ? "0" : "1";
    break;
  default: /* argmax, argmin */
    f->acc = f->t;
    f->id = m->op == NBI_OP_ARGMAX ? ninf[f->dom] : inf[f->dom];
    break;
  }
}

static void fold_decl(cr_buf *b, const nbi_group *g, int k, int pass) {
  fold f;
  fold_of(g, k, &f);
  if (pass == 1) {
    cr_put(b, "double b%d = 0;\n", k);
    return;
  }
  cr_put(b, "%s a%d = (%s)%s;\n", f.acc, k, f.acc, f.id);
  if (f.redop < 0) cr_put(b, "int64_t x%d = -1;\n", k);
}

/* One element (column or row j) into member k's fold, pass 0 or 1. */
static void fold_step(cr_buf *b, const nbi_group *g, int k, int pass) {
  fold f;
  fold_of(g, k, &f);
  if (pass == 1) {
    if (f.op == NBI_OP_REDUCE_VAR)
      cr_put(b, "{ const double d_ = (double)%s - c%d; b%d += d_ * d_; }\n", f.x, k, k);
    else if (f.dom == CR_DOM_F)
      cr_put(b, "b%d += (double)vm_expf(%s - a%d);\n", k, f.x, k);
    else
      cr_put(b, "b%d += exp(%s - a%d);\n", k, f.x, k);
    return;
  }
  switch (f.redop) {
  case 0: cr_put(b, "a%d += (%s)%s;\n", k, f.acc, f.x); break;
  case 1: cr_put(b, "a%d *= (%s)%s;\n", k, f.acc, f.x); break;
  case 2:
    cr_put(b, "{ const %s y_ = %s; if (y_ > a%d || y_ != y_) a%d = y_; }\n", f.t, f.x, k, k);
    break;
  case 3:
    cr_put(b, "{ const %s y_ = %s; if (y_ < a%d || y_ != y_) a%d = y_; }\n", f.t, f.x, k, k);
    break;
  case 4: cr_put(b, "a%d = a%d | (%s != 0);\n", k, k, f.raw); break;
  case 5: cr_put(b, "a%d = a%d & (%s != 0);\n", k, k, f.raw); break;
  default:
    cr_put(b, "nb_arg_combine<%s, %s>(a%d, x%d, %s, j);\n", f.t,
           f.op == NBI_OP_ARGMAX ? "true" : "false", k, k, f.x);
  }
}

/* Combines the threads' states of member k's pass (warp: across the warp only). */
static void fold_combine(cr_buf *b, const nbi_group *g, int k, int pass, bool warp) {
  fold f;
  fold_of(g, k, &f);
  if (pass == 1) {
    cr_put(b,
           warp ? "b%d = nb_warp_reduce<double, 0>(b%d);\n"
                : "b%d = nb_block_reduce<double, 0>(b%d, 0.0);\n",
           k, k);
    return;
  }
  if (f.redop < 0)
    cr_put(b, "nb_%s_arg<%s, %s>(a%d, x%d);\n", warp ? "warp" : "block", f.t,
           f.op == NBI_OP_ARGMAX ? "true" : "false", k, k);
  else if (warp)
    cr_put(b, "a%d = nb_warp_reduce<%s, %d>(a%d);\n", k, f.acc, f.redop, k);
  else
    cr_put(b, "a%d = nb_block_reduce<%s, %d>(a%d, (%s)%s);\n", k, f.acc, f.redop, k, f.acc, f.id);
}

/* After member k's pass: its centre (var's first pass), or its value. count: the
 * number of elements folded (a double expression). */
static void fold_finish(cr_buf *b, const nbi_group *g, int k, int pass, const char *count) {
  const nbi_group_member *m = &g->m[k];
  fold f;
  fold_of(g, k, &f);
  const char *rt = cr_repr(m->dtype), *dn = cr_dtn(m->dtype);
  bool ints = f.dom == CR_DOM_I;
  switch (m->op) {
  case NBI_OP_REDUCE_SUM:
    if (m->af[0] != 1) /* mean: divisor > 0 ? sum / divisor : NaN, in double */
      cr_put(b, "const %s v%d = nb_as_%s(p.dv%d > 0 ? %sa%d / p.dv%d : (double)NB_NAN);\n", rt, k,
             dn, k, ints ? "(double)(int64_t)" : "", k, k);
    else
      cr_put(b, "const %s v%d = nb_as_%s(%sa%d);\n", rt, k, dn, ints ? "(int64_t)" : "", k);
    break;
  case NBI_OP_REDUCE_PROD:
    cr_put(b, "const %s v%d = nb_as_%s(%sa%d);\n", rt, k, dn, ints ? "(int64_t)" : "", k);
    break;
  case NBI_OP_REDUCE_MAX:
  case NBI_OP_REDUCE_MIN: cr_put(b, "const %s v%d = nb_as_%s(a%d);\n", rt, k, dn, k); break;
  case NBI_OP_REDUCE_ANY:
  case NBI_OP_REDUCE_ALL:
    cr_put(b, "const %s v%d = nb_as_%s((int64_t)a%d);\n", rt, k, dn, k);
    break;
  case NBI_OP_ARGMAX:
  case NBI_OP_ARGMIN: cr_put(b, "const %s v%d = nb_as_%s(x%d);\n", rt, k, dn, k); break;
  case NBI_OP_REDUCE_VAR:
    if (pass == 0) {
      cr_put(b, "const double c%d = %s > 0 ? a%d / %s : 0.0;\n", k, count, k, count);
    } else {
      cr_put(b, "double s%d = %s > 0 ? b%d / %s : (double)NB_NAN;\n", k, count, k, count);
      if (m->ai[1]) cr_put(b, "s%d = sqrt(s%d);\n", k, k);
      cr_put(b, "const %s v%d = nb_as_%s(s%d);\n", rt, k, dn, k);
    }
    break;
  case NBI_OP_LOGSUMEXP:
    if (pass == 1)
      cr_put(b, "const %s v%d = nb_as_%s(a%d - a%d == 0 ? (double)a%d + log(b%d) : (double)a%d);\n",
             rt, k, dn, k, k, k, k, k);
    break;
  case NBI_OP_SOFTMAX:
  case NBI_OP_LOG_SOFTMAX:
    if (pass == 1) /* the factor (softmax) or the log of the sum (log_softmax) */
      cr_put(b, "const %s f%d = (%s)%s(b%d);\n", f.t, k, f.t,
             m->op == NBI_OP_SOFTMAX ? "1.0 / " : "log", k);
    break;
  default: break;
  }
}

/* ---- the kernels
 * --------------------------------------------------------------------------------- */
/* Which operands member k's kind of reader names with prefix c ('o', 'r', 'q'), over
 * the members marked in which (NULL: all). */
static void operands_read(const nbi_group *g, const bool *which, char c, bool *read) {
  memset(read, 0, sizeof(bool) * NBI_FUSE_MAX);
  for (int k = 0; k < g->n_members; k++) {
    if (which && !which[k]) continue;
    for (int q = 0; q < g->m[k].n_in; q++) {
      char nm[16];
      if (g->m[k].src[q] >= 0) continue;
      cr_src_name(g, k, g->m[k].src[q], nm);
      if (nm[0] == c) read[-1 - g->m[k].src[q]] = true;
    }
  }
}

/* Loads operand e as q<e> (element 0), r<e> (the row's value) or o<e> (column j);
 * cache (o only): 1 keeps the value in o<e>_c[u] too, 2 takes it from there. */
static void emit_operand_load(cr_buf *b, const nbi_group *g, const cr_layout *L, int e, char c,
                              int cache) {
  nb_dtype dt = g->operand[e].dtype;
  const char *rt = cr_repr(dt), *dn = cr_dtn(dt);
  if (cache == 2) {
    cr_put(b, "const %s o%d = o%d_c[u];\n", rt, e, e);
    return;
  }
  if (c == 'q') {
    cr_put(b, "const %s q%d = nb_ld_%s(p.in%d, 0);\n", rt, e, dn, e);
    return;
  }
  if (c == 'r') {
    cr_put(b, "const %s r%d = nb_ld_%s(p.in%d, rb%d);\n", rt, e, dn, e, e);
    return;
  }
  /* a lane past the row's end loads nb_ld_zeros (the dtype's 0) rather than branching
   * around its load: loads in branches are issued one at a time, each waiting for the
   * previous column's use (softmax rows ran at 0.47 of a copy on an H100; a
   * hand-written kernel of the same shape without them at 1.02: bench/probe_softmax.cu) */
  cr_put(b, "const %s o%d = nb_ld_%s(ok ? p.in%d : (const void *)nb_ld_zeros, ok ? rb%d + ", rt, e,
         dn, e, e);
  int ncd = L->sig.ncd;
  switch (L->sig.cls[e] & 3) {
  case CR_COL_ZERO: cr_put(b, "0"); break;
  case CR_COL_CONTIG: cr_put(b, "j"); break;
  case CR_COL_STRIDED: cr_put(b, "j * p.ic%d[0]", e); break;
  default:
    for (int d = 0; d < ncd; d++)
      cr_put(b, "%scj%d * p.ic%d[%d]", d ? " + " : "", d, e, d);
  }
  cr_put(b, " : 0);\n");
  if (cache == 1) cr_put(b, "o%d_c[u] = o%d;\n", e, e);
}

/* An axis member's value at column j (softmax, log_softmax: from the row's max a<k>
 * and factor f<k>; cumsum: a scan of the chunk plus the carry y<k>). */
static void emit_axis_value(cr_buf *b, const nbi_group *g, int k, bool warp) {
  const nbi_group_member *m = &g->m[k];
  fold f;
  fold_of(g, k, &f);
  const char *rt = cr_repr(m->dtype), *dn = cr_dtn(m->dtype);
  if (m->op == NBI_OP_SOFTMAX)
    cr_put(b, "const %s v%d = nb_as_%s(%s(%s - a%d) * f%d);\n", rt, k, dn,
           f.dom == CR_DOM_F ? "vm_expf" : "exp", f.x, k, k);
  else if (m->op == NBI_OP_LOG_SOFTMAX)
    cr_put(b, "const %s v%d = nb_as_%s((%s - a%d) - f%d);\n", rt, k, dn, f.x, k, k);
  else
    cr_put(b,
           "%s s%d_ = ok ? (%s)%s : (%s)0, t%d_;\n"
           "s%d_ = nb_%s_scan<%s>(s%d_, &t%d_);\n"
           "const %s v%d = nb_as_%s((%s)(y%d + s%d_));\n"
           "y%d += t%d_;\n",
           f.acc, k, f.acc, f.x, f.acc, k, k, warp ? "warp" : "block", f.acc, k, k, rt, k, dn,
           f.dom == CR_DOM_I ? "int64_t" : f.t, k, k, k, k);
}

/* The operands column j of phase p loads (reads[e]), given its members (need). */
static void phase_reads(const nbi_group *g, const rows_plan *P, int p, const bool *need,
                        bool *reads) {
  bool folds[NBI_FUSE_MAX];
  for (int k = 0; k < g->n_members; k++)
    folds[k] = need[k] || P->phase[k][0] == p || P->phase[k][1] == p;
  operands_read(g, folds, 'o', reads);
}

/* The operands kept in registers (cached[e]) and the phase that loads each first: full
 * ones read in two phases or more, while CACHE_WORDS allows (register layouts only). */
static void plan_cache(const nbi_group *g, const cr_layout *L, const rows_plan *P, bool *cached,
                       int *first) {
  int count[NBI_FUSE_MAX] = {0}, words = 0;
  bool need[NBI_FUSE_MAX], reads[NBI_FUSE_MAX];
  for (int e = 0; e < g->n_operands; e++) {
    cached[e] = false;
    first[e] = -1;
  }
  for (int p = 0; p < P->n_phases; p++) {
    phase_members(g, P, p, need);
    phase_reads(g, P, p, need, reads);
    for (int e = 0; e < g->n_operands; e++)
      if (reads[e]) {
        count[e]++;
        if (first[e] < 0) first[e] = p;
      }
  }
  for (int e = 0; e < g->n_operands && L->sig.cache_k; e++) {
    int w = L->sig.cache_k * (nb_dtype_size(g->operand[e].dtype) == 8 ? 2 : 1);
    if (count[e] < 2 || words + w > CACHE_WORDS) continue;
    cached[e] = true;
    words += w;
  }
}

/* One column j of phase p (ok: j < cols; u: the column's step, for the registers). */
static void emit_phase_body(cr_buf *b, const nbi_group *g, const cr_layout *L, const rows_plan *P,
                            int p, const bool *need, bool warp, const bool *cached,
                            const int *first) {
  bool reads[NBI_FUSE_MAX];
  phase_reads(g, P, p, need, reads);
  bool general = false;
  for (int e = 0; e < g->n_operands; e++)
    general = general || (reads[e] && (L->sig.cls[e] & 3) == CR_COL_GENERAL);
  if (general) { /* j as indices into the merged column dims, innermost last */
    int ncd = L->sig.ncd;
    cr_put(b, "int64_t cc_ = j;\n");
    for (int d = ncd - 1; d > 0; d--)
      cr_put(b, "const int64_t cj%d = cc_ %% p.cdim[%d];\ncc_ /= p.cdim[%d];\n", d, d, d);
    cr_put(b, "const int64_t cj0 = cc_;\n");
  }
  for (int e = 0; e < g->n_operands; e++)
    if (reads[e]) emit_operand_load(b, g, L, e, 'o', cached[e] ? (first[e] == p ? 1 : 2) : 0);
  for (int k = 0; k < g->n_members; k++) {
    if (!need[k]) continue;
    if (g->m[k].role == NBI_ROLE_AXIS)
      emit_axis_value(b, g, k, warp);
    else
      cr_emit_member(b, g, k);
  }
  for (int k = 0; k < g->n_members; k++)
    for (int pass = 0; pass < 2; pass++)
      if (P->phase[k][pass] == p) {
        cr_put(b, "if (ok) ");
        fold_step(b, g, k, pass);
      }
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    if (need[k] && m->out >= 0 && P->lvl[k] == p)
      cr_put(b, "if (ok) nb_st_%s(p.out%d, r * p.cols + j, v%d);\n", cr_dtn(m->dtype), m->out, k);
  }
}

/* The per-row members known from level lvl, and the stores of per-row values. */
static void emit_per_row(cr_buf *b, const nbi_group *g, const rows_plan *P, int lvl) {
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    if (P->lvl[k] != lvl || (m->role != NBI_ROLE_PER_ROW && m->role != NBI_ROLE_ROW_REDUCE))
      continue;
    if (m->role == NBI_ROLE_PER_ROW) cr_emit_member(b, g, k);
    if (m->out >= 0)
      cr_put(b, "if (lane == 0) nb_st_%s(p.out%d, r, v%d);\n", cr_dtn(m->dtype), m->out, k);
  }
}

static void emit_row_kernel(cr_buf *b, const nbi_group *g, const cr_layout *L, const rows_plan *P,
                            const char *name) {
  bool warp = L->sig.warp;
  int nt = L->sig.block, nrd = L->sig.nrd;
  bool rows_members[NBI_FUSE_MAX], reads[NBI_FUSE_MAX], need[NBI_FUSE_MAX];
  for (int k = 0; k < g->n_members; k++)
    rows_members[k] = in_rows(g->m[k].role);
  cr_put(b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const nb_params p) {\n", nt,
         name);
  if (warp)
    cr_put(b,
           "const int lane = (int)(threadIdx.x %% 32);\n"
           "for (int64_t r = (int64_t)blockIdx.x * %d + threadIdx.x / 32; r < p.rows; "
           "r += (int64_t)gridDim.x * %d) {\n",
           nt / 32, nt / 32);
  else
    cr_put(b, "const int lane = (int)threadIdx.x;\n"
              "for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {\n");
  /* the row's indices into the merged row dims, then each operand's row offset */
  if (nrd == 1) cr_put(b, "const int64_t ri0 = r;\n");
  if (nrd > 1) {
    bool any = false;
    for (int e = 0; e < g->n_operands; e++)
      any = any || (L->sig.cls[e] & CR_ROW_GENERAL);
    if (any) {
      cr_put(b, "int64_t rr_ = r;\n");
      for (int d = nrd - 1; d > 0; d--)
        cr_put(b, "const int64_t ri%d = rr_ %% p.rdim[%d];\nrr_ /= p.rdim[%d];\n", d, d, d);
      cr_put(b, "const int64_t ri0 = rr_;\n");
    }
  }
  for (int e = 0; e < g->n_operands; e++) {
    cr_put(b, "const int64_t rb%d = ", e);
    if (!(L->sig.cls[e] & CR_ROW_GENERAL))
      cr_put(b, "0");
    else
      for (int d = 0; d < nrd; d++)
        cr_put(b, "%sri%d * p.ir%d[%d]", d ? " + " : "", d, e, d);
    cr_put(b, ";\n(void)rb%d;\n", e);
  }
  operands_read(g, rows_members, 'q', reads);
  for (int e = 0; e < g->n_operands; e++)
    if (reads[e]) emit_operand_load(b, g, L, e, 'q', 0);
  operands_read(g, rows_members, 'r', reads);
  for (int e = 0; e < g->n_operands; e++)
    if (reads[e]) emit_operand_load(b, g, L, e, 'r', 0);
  emit_per_row(b, g, P, 0);
  const char *step = warp ? "32" : nt == 256 ? "256" : "1024";
  bool cached[NBI_FUSE_MAX];
  int first[NBI_FUSE_MAX], ck = L->sig.cache_k;
  plan_cache(g, L, P, cached, first);
  for (int e = 0; e < g->n_operands; e++)
    if (cached[e]) cr_put(b, "%s o%d_c[%d];\n", cr_repr(g->operand[e].dtype), e, ck);
  for (int p = 0; p < P->n_phases; p++) {
    bool scan = phase_members(g, P, p, need);
    cr_put(b, "/* phase %d */\n", p);
    for (int k = 0; k < g->n_members; k++)
      for (int pass = 0; pass < 2; pass++)
        if (P->phase[k][pass] == p) fold_decl(b, g, k, pass);
    cr_put(b, "{\n");
    for (int k = 0; k < g->n_members; k++)
      if (need[k] && g->m[k].op == NBI_OP_CUMSUM && g->m[k].role == NBI_ROLE_AXIS) {
        fold f;
        fold_of(g, k, &f);
        cr_put(b, "%s y%d = 0;\n", f.acc, k);
      }
    if (ck) { /* every column of the row in ck steps, unrolled: the registers stay registers.
               * Twice: a row of exactly ck steps (no lane past the end: no checks, and
               * the loads address base + constant), then any shorter row. */
      for (int full = 1; full >= 0; full--) {
        cr_put(b, full ? "if (p.cols == %d * %s) {\n" : "} else {\n", ck, step);
        cr_put(b,
               "#pragma unroll\nfor (int u = 0; u < %d; u++) {\nconst int64_t j = u * %s + lane;\n"
               "const bool ok = %s;\n",
               ck, step, full ? "true" : "j < p.cols");
        emit_phase_body(b, g, L, P, p, need, warp, cached, first);
        cr_put(b, "}\n");
      }
      cr_put(b, "}\n}\n");
    } else {
      int u = scan ? 1 : UNROLL;
      cr_put(b,
             "for (int64_t j0_ = 0; j0_ < p.cols; j0_ += %s * %d) {\n#pragma unroll\n"
             "for (int u = 0; u < %d; u++) {\nconst int64_t j = j0_ + u * %s + lane;\n"
             "const bool ok = j < p.cols;\n",
             step, u, u, step);
      emit_phase_body(b, g, L, P, p, need, warp, cached, first);
      cr_put(b, "}\n}\n}\n");
    }
    for (int k = 0; k < g->n_members; k++)
      for (int pass = 0; pass < 2; pass++)
        if (P->phase[k][pass] == p) {
          fold_combine(b, g, k, pass, warp);
          fold_finish(b, g, k, pass, "(double)p.cols");
        }
    emit_per_row(b, g, P, p + 1);
  }
  cr_put(b, "}\n}\n");
}

static void emit_global_kernel(cr_buf *b, const nbi_group *g, const char *name) {
  bool global[NBI_FUSE_MAX], reads[NBI_FUSE_MAX];
  for (int k = 0; k < g->n_members; k++)
    global[k] = !in_rows(g->m[k].role);
  cr_put(b,
         "extern \"C\" __global__ void __launch_bounds__(256) %s_g(const nb_params p) {\n"
         "const int lane = (int)threadIdx.x;\n",
         name);
  operands_read(g, global, 'q', reads);
  for (int e = 0; e < g->n_operands; e++)
    if (reads[e])
      cr_put(b, "const %s q%d = nb_ld_%s(p.in%d, 0);\n", cr_repr(g->operand[e].dtype), e,
             cr_dtn(g->operand[e].dtype), e);
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    if (!global[k]) continue;
    if (m->role == NBI_ROLE_GLOBAL) {
      cr_emit_member(b, g, k);
    } else { /* fold the rows of the stored per-row member s */
      int s = m->src[0], np = passes_of(m->op);
      nb_dtype dt = g->m[s].dtype;
      for (int pass = 0; pass < np; pass++) {
        fold_decl(b, g, k, pass);
        cr_put(b,
               "for (int64_t j0_ = 0; j0_ < p.rows; j0_ += 256) {\nconst int64_t j = j0_ + lane;\n"
               "const bool ok = j < p.rows;\n"
               "const %s v%d = ok ? nb_ld_%s(p.out%d, j) : %s();\nif (ok) ",
               cr_repr(dt), s, cr_dtn(dt), g->m[s].out, cr_repr(dt));
        fold_step(b, g, k, pass);
        cr_put(b, "}\n");
        fold_combine(b, g, k, pass, false);
        fold_finish(b, g, k, pass, "(double)p.rows");
      }
    }
    if (m->out >= 0)
      cr_put(b, "if (lane == 0) nb_st_%s(p.out%d, 0, v%d);\n", cr_dtn(m->dtype), m->out, k);
  }
  cr_put(b, "}\n");
}

void cr_rows_render(cr_buf *b, const nbi_group *g, const cr_layout *L, const char *name) {
  static const char *const col_names[] = {"one value per row", "contiguous columns",
                                          "strided columns", "columns over several dims"};
  rows_plan P;
  plan_rows(g, &P);
  cr_put(b,
         "/* %s: a row group over F = rows x cols (rows = prod F[0, ra), cols = prod F[ra, "
         "nd)), ",
         name);
  if (L->sig.warp)
    cr_put(b, "one warp per row, %d rows per block of %d threads", L->sig.block / 32, L->sig.block);
  else
    cr_put(b, "one block of %d threads per row", L->sig.block);
  cr_put(b, "; %d phase%s over each row", P.n_phases, P.n_phases == 1 ? "" : "s");
  if (L->sig.cache_k)
    cr_put(b, ", up to %d columns a thread, operands read twice kept in registers", L->sig.cache_k);
  cr_put(b, ".\n");
  for (int e = 0; e < g->n_operands; e++) {
    int cls = L->sig.cls[e];
    if (cls == (CR_ROW_ZERO | CR_COL_ZERO))
      cr_put(b, " *   in%d: %s, one value\n", e, nb_dtype_name(g->operand[e].dtype));
    else
      cr_put(b, " *   in%d: %s, %s, %s\n", e, nb_dtype_name(g->operand[e].dtype),
             cls & CR_ROW_GENERAL ? "strided rows" : "the same for every row", col_names[cls & 3]);
  }
  for (int k = 0; k < g->n_members; k++) {
    cr_describe_member(b, g, k);
    if (P.phase[k][0] >= 0)
      cr_put(b, " *     folded in phase %d%s%s\n", P.phase[k][0], P.phase[k][1] >= 0 ? " and " : "",
             P.phase[k][1] >= 0 ? "the next" : "");
  }
  cr_put(b, " * Outputs: full members (rows, cols), per-row members (rows), global ones (1), "
            "contiguous.\n */\n");
  cr_emit_op_functions(b, g);
  cr_emit_params(b, L);
  emit_row_kernel(b, g, L, &P, name);
  if (L->cfg->block2) emit_global_kernel(b, g, name);
}
