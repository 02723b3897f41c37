/* src/backends/cuda/cuda_render.c — CUDA C from the planner's nbi_group descriptions
 * (backend.h): elementwise groups here, row groups in cuda_render_rows.c; the pieces
 * both share (values, conversions, the formula list's expressions, parameters), the
 * kernel cache and nbi_cuda_run_group.
 *
 * Semantics are the CPU's, member by member: each member is evaluated in the domain of
 * its compute dtype (attrs.i[0]; a cast in its source's) from its inputs converted as
 * the CPU's loads convert them, and its value is rounded to its own dtype as the CPU
 * stores it (an f16 member is rounded to f16 before a later member reads it, as when
 * the nodes run one by one). The expressions are the formula list's
 * (../ew_formulas.h), stringized here and compiled with T / FN / VM defined per
 * domain; the preamble defines every name they use.
 *
 * Elementwise kernels: a grid-stride loop over the flat index of F. Dims are merged
 * where every operand and output is contiguous across them; an operand is read as
 * scalar (every stride 0: loaded once), flat (its offset is the flat index) or
 * general (the index split into the merged dims: 32-bit division by invariant
 * divisors when F has fewer than 2^31 elements, else 64-bit). When every operand and
 * output is flat or scalar and 16-byte aligned, a first loop moves vectors of 16
 * bytes (of the widest dtype; narrower ones move fewer) and a scalar loop takes the
 * tail. The source depends on the group's structure and these classes, never on
 * sizes or addresses (they are kernel parameters), so one kernel serves every size.
 *
 * Cache: nbi_cuda_run_group keys CUfunctions by (g->key, the layout's signature,
 * device) in a fixed table under a mutex: a repeated call computes the layout (a few
 * loops over dims), finds its entry and launches, rendering and hashing nothing. */
#include "cuda_render.h"
#include "../../core/oprules.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "../ew_formulas.h"

/* ---- growing text ------------------------------------------------------------------- */
void cr_put(cr_buf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->n;
    int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? room : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = true;
      return;
    }
    if (b->p && (size_t)k < room) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = b->cap ? b->cap : 1 << 14;
    while (cap - b->n <= (size_t)k)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
}

/* ---- dtypes ------------------------------------------------------------------------- */
int cr_domain(nb_dtype dt) {
  if (dt == NB_F64) return CR_DOM_D;
  return nb_dtype_is_float(dt) ? CR_DOM_F : CR_DOM_I;
}

const char *cr_dtn(nb_dtype dt) { return nb_dtype_name(dt); }

const char *cr_repr(nb_dtype dt) {
  switch (dt) {
  case NB_F64: return "double";
  case NB_I32: return "int32_t";
  case NB_I64: return "int64_t";
  case NB_BOOL: return "bool";
  case NB_U8:
  case NB_I8:
  case NB_I16: return "int32_t"; /* the preamble's nb_ld_u8 ... widen them */
  default: return "float";
  }
}

const char *cr_dom_type(int dom) {
  return dom == CR_DOM_F ? "float" : dom == CR_DOM_D ? "double" : "int64_t";
}

char cr_dom_letter(int dom) { return dom == CR_DOM_F ? 'f' : dom == CR_DOM_D ? 'd' : 'i'; }

const char *cr_to_domain(nb_dtype from, int dom, nb_dtype cdt) {
  if (dom == CR_DOM_D) return "nb_td";
  if (dom == CR_DOM_I) return "nb_ti";
  if (from != cdt && cdt == NB_F16) return "nb_th";
  if (from != cdt && cdt == NB_BF16) return "nb_tb";
  return "nb_tf";
}

/* The element type a dtype is stored as (vector packs). */
static const char *storage_type(nb_dtype dt) {
  switch (dt) {
  case NB_F32: return "float";
  case NB_F64: return "double";
  case NB_I32: return "int32_t";
  case NB_I64: return "int64_t";
  case NB_BOOL: return "uint8_t";
  case NB_U8: return "uint8_t";
  case NB_I8: return "int8_t";
  case NB_I16: return "int16_t";
  default: return "uint16_t";
  }
}

/* ---- the formula list, stringized ---------------------------------------------------------- */
#define CR_CASE(S, ID, EXPR)                                                                       \
  case NBI_OP_##ID: return #EXPR;
static const char *unary_float(int op) {
  switch (op) {
    EW_UNARY_FLOAT(CR_CASE, cuda)
  default: return NULL;
  }
}
static const char *binary_float(int op) {
  switch (op) {
    EW_BINARY_FLOAT(CR_CASE, cuda)
  default: return NULL;
  }
}
static const char *unary_int(int op) {
  switch (op) {
    EW_UNARY_INT(CR_CASE, cuda)
  default: return NULL;
  }
}
static const char *binary_int(int op) {
  switch (op) {
    EW_BINARY_INT(CR_CASE, cuda)
  default: return NULL;
  }
}
static const char *unary_pred(int op) {
  switch (op) {
    EW_UNARY_PRED(CR_CASE, cuda)
  default: return NULL;
  }
}
static const char *binary_pred(int op) {
  switch (op) {
    EW_BINARY_PRED(CR_CASE, cuda)
  default: return NULL;
  }
}
#undef CR_CASE

const char *cr_formula(int dom, int op, int *arity, bool *pred) {
  const char *e;
  *pred = false;
  *arity = 1;
  if ((e = unary_pred(op))) {
    *pred = true;
    return e;
  }
  *arity = 2;
  if ((e = binary_pred(op))) {
    *pred = true;
    return e;
  }
  if (dom == CR_DOM_I) {
    *arity = 1;
    if ((e = unary_int(op))) return e;
    *arity = 2;
    return binary_int(op);
  }
  *arity = 1;
  if ((e = unary_float(op))) return e;
  *arity = 2;
  return binary_float(op);
}

bool cr_is_view(int op) {
  return op == NBI_OP_RESHAPE || op == NBI_OP_BROADCAST_TO || op == NBI_OP_IDENTITY ||
         op == NBI_OP_STOP_GRADIENT;
}

bool cr_is_reduce(int op) {
  switch (op) {
  case NBI_OP_REDUCE_SUM:
  case NBI_OP_REDUCE_PROD:
  case NBI_OP_REDUCE_MAX:
  case NBI_OP_REDUCE_MIN:
  case NBI_OP_REDUCE_ANY:
  case NBI_OP_REDUCE_ALL:
  case NBI_OP_REDUCE_VAR:
  case NBI_OP_LOGSUMEXP:
  case NBI_OP_ARGMAX:
  case NBI_OP_ARGMIN: return true;
  default: return false;
  }
}

nb_dtype cr_src_dtype(const nbi_group *g, int s) {
  return s >= 0 ? g->m[s].dtype : g->operand[-1 - s].dtype;
}

bool cr_elementwise_ok(const nbi_group *g, int k) {
  const nbi_group_member *m = &g->m[k];
  if (!nbi_dtype_valid(m->dtype)) return false;
  for (int q = 0; q < m->n_in; q++)
    if (!nbi_dtype_valid(cr_src_dtype(g, m->src[q]))) return false;
  if (cr_is_view(m->op)) return m->n_in == 1;
  if (m->op == NBI_OP_CAST) return m->n_in == 1;
  nb_dtype cdt = (nb_dtype)m->ai[0];
  if (!nbi_dtype_valid(cdt)) return false;
  if (m->op == NBI_OP_WHERE) return m->n_in == 3 && m->dtype == cdt;
  int arity;
  bool pred;
  const char *e = cr_formula(cr_domain(cdt), m->op, &arity, &pred);
  return e && arity == m->n_in && (pred ? m->dtype == NB_BOOL : m->dtype == cdt);
}

/* ---- emitting values ------------------------------------------------------------------------ */
void cr_src_name(const nbi_group *g, int k, int s, char out[16]) {
  if (s >= 0) {
    snprintf(out, 16, "v%d", s);
    return;
  }
  int e = -1 - s, role = g->m[k].role, level = g->operand[e].level;
  char c = 'o';
  if (g->kind == NBI_GROUP_ROWS) {
    if (role == NBI_ROLE_GLOBAL || role == NBI_ROLE_GLOBAL_REDUCE || level == NBI_ROLE_GLOBAL)
      c = 'q';
    else if (role == NBI_ROLE_PER_ROW || level == NBI_ROLE_PER_ROW)
      c = 'r';
  }
  snprintf(out, 16, "%c%d", c, e);
}

/* The op functions a member needs: its domain and op, or -1 when none (views, casts,
 * where, reductions, axis ops). */
static int member_function(const nbi_group *g, int k, int *dom) {
  const nbi_group_member *m = &g->m[k];
  if (m->role != NBI_ROLE_FULL && m->role != NBI_ROLE_PER_ROW && m->role != NBI_ROLE_GLOBAL)
    return -1;
  if (cr_is_view(m->op) || m->op == NBI_OP_CAST || m->op == NBI_OP_WHERE) return -1;
  *dom = cr_domain((nb_dtype)m->ai[0]);
  return m->op;
}

void cr_emit_op_functions(cr_buf *b, const nbi_group *g) {
  static const char *const defs[3][3] = {
      {"float", "n##f", "vm_##n##f"}, {"double", "n", "dm_##n"}, {"int64_t", "n", "n"}};
  for (int dom = 0; dom < 3; dom++) {
    bool any = false;
    for (int k = 0; k < g->n_members; k++) {
      int d, op = member_function(g, k, &d);
      if (op < 0 || d != dom) continue;
      bool seen = false;
      for (int j = 0; j < k && !seen; j++) {
        int dj, oj = member_function(g, j, &dj);
        seen = oj == op && dj == dom;
      }
      if (seen) continue;
      if (!any) {
        cr_put(b, "#define T %s\n#define FN(n) %s\n#define VM(n) %s\n", defs[dom][0], defs[dom][1],
               defs[dom][2]);
        any = true;
      }
      int arity;
      bool pred;
      const char *e = cr_formula(dom, op, &arity, &pred);
      const char *t = cr_dom_type(dom);
      if (arity == 1)
        cr_put(b, "NB_D %s nbo_%c_%s(%s x) { return %s; }\n", pred ? "bool" : t, cr_dom_letter(dom),
               nbi_op_table[op]->name, t, e);
      else
        cr_put(b, "NB_D %s nbo_%c_%s(%s a, %s b) { return %s; }\n", pred ? "bool" : t,
               cr_dom_letter(dom), nbi_op_table[op]->name, t, t, e);
    }
    if (any) cr_put(b, "#undef T\n#undef FN\n#undef VM\n");
  }
}

void cr_emit_member(cr_buf *b, const nbi_group *g, int k) {
  const nbi_group_member *m = &g->m[k];
  char s[3][16];
  for (int q = 0; q < m->n_in; q++)
    cr_src_name(g, k, m->src[q], s[q]);
  const char *rt = cr_repr(m->dtype), *dn = cr_dtn(m->dtype);
  if (cr_is_view(m->op) || m->op == NBI_OP_CAST) {
    nb_dtype from = cr_src_dtype(g, m->src[0]);
    if (from == m->dtype) {
      cr_put(b, "const %s v%d = %s;\n", rt, k, s[0]);
    } else { /* in the source's domain, stored as the CPU's cast stores */
      int dom = cr_domain(from);
      cr_put(b, "const %s v%d = nb_as_%s(%s(%s));\n", rt, k, dn, cr_to_domain(from, dom, from),
             s[0]);
    }
    return;
  }
  nb_dtype cdt = (nb_dtype)m->ai[0];
  int dom = cr_domain(cdt);
  char a[3][48];
  for (int q = 0; q < m->n_in; q++)
    snprintf(a[q], sizeof a[q], "%s(%s)", cr_to_domain(cr_src_dtype(g, m->src[q]), dom, cdt), s[q]);
  if (m->op == NBI_OP_WHERE) {
    cr_put(b, "const %s v%d = nb_as_%s(%s != 0 ? %s : %s);\n", rt, k, dn, s[0], a[1], a[2]);
    return;
  }
  int arity;
  bool pred;
  cr_formula(dom, m->op, &arity, &pred);
  const char *name = nbi_op_table[m->op]->name;
  char call[128];
  if (arity == 1)
    snprintf(call, sizeof call, "nbo_%c_%s(%s)", cr_dom_letter(dom), name, a[0]);
  else
    snprintf(call, sizeof call, "nbo_%c_%s(%s, %s)", cr_dom_letter(dom), name, a[0], a[1]);
  if (pred)
    cr_put(b, "const bool v%d = %s;\n", k, call);
  else
    cr_put(b, "const %s v%d = nb_as_%s(%s);\n", rt, k, dn, call);
}

void cr_describe_member(cr_buf *b, const nbi_group *g, int k) {
  static const char *const roles[] = {"full",    "axis",          "row_reduce",
                                      "per_row", "global_reduce", "global"};
  const nbi_group_member *m = &g->m[k];
  cr_put(b, " *   m%d = %s(", k, nbi_op_table[m->op]->name);
  for (int q = 0; q < m->n_in; q++) {
    int s = m->src[q];
    if (s >= 0)
      cr_put(b, "%sm%d", q ? ", " : "", s);
    else
      cr_put(b, "%sin%d", q ? ", " : "", -1 - s);
  }
  cr_put(b, "): %s %s", nb_dtype_name(m->dtype), m->role < 6 ? roles[m->role] : "?");
  if (m->out >= 0) cr_put(b, ", stored to out%d", m->out);
  cr_put(b, "\n");
}

/* ---- parameters --------------------------------------------------------------------------------
 */
int cr_field_add(cr_layout *L, const char *name, int type, int count) {
  int w = 0, words = count ? count : 1;
  for (int i = 0; i < L->n_fields; i++)
    w += L->f[i].count ? L->f[i].count : 1;
  if (L->n_fields == CR_MAX_FIELDS || w + words > NBI_CUDA_PARAM_WORDS || count > 255) return -1;
  cr_field *f = &L->f[L->n_fields++];
  snprintf(f->name, sizeof f->name, "%s", name);
  f->type = (uint8_t)type;
  f->count = (uint8_t)count;
  f->word = (uint16_t)w;
  L->cfg->n_words = (unsigned)(w + words);
  return w;
}

void cr_emit_params(cr_buf *b, const cr_layout *L) {
  static const char *const types[] = {"int64_t", "uint64_t", "double", "const void *", "void *"};
  cr_put(b, "struct nb_params {\n");
  for (int i = 0; i < L->n_fields; i++) {
    const cr_field *f = &L->f[i];
    const char *t = types[f->type];
    bool ptr = f->type == CR_CPTR || f->type == CR_PTR;
    if (f->count == 0)
      cr_put(b, "  %s%s%s;\n", t, ptr ? "" : " ", f->name);
    else
      cr_put(b, "  %s %s[%d];\n", t, f->name, f->count);
  }
  cr_put(b, "};\n");
}

/* Magic word of 32-bit division by d >= 1 (preamble: nb_udiv): floor(2^32 (2^s - d) / d)
 * + 1 in the low half, s = ceil(log2 d) in the high half. */
static uint64_t udiv_word(uint32_t d) {
  uint32_t s = 0;
  while (s < 32 && ((uint64_t)1 << s) < d)
    s++;
  uint64_t m = (((uint64_t)1 << 32) * (((uint64_t)1 << s) - d)) / d + 1;
  return (m & 0xffffffffu) | (uint64_t)s << 32;
}

/* ---- elementwise layout ------------------------------------------------------------------------
 */
static int64_t view_numel(const nbi_view *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++)
    n *= v->dims[d];
  return n;
}

/* Strides of view v laid over F's dims into st (broadcast dims 0); false when v is
 * not a view of F. */
static bool strides_over(const nbi_view *v, const nb_shape *F, int64_t *st) {
  if (v->ndim != F->ndim) return false;
  for (int d = 0; d < F->ndim; d++) {
    if (v->dims[d] != F->dims[d] && v->dims[d] != 1) return false;
    st[d] = v->dims[d] == F->dims[d] && F->dims[d] != 1 ? v->strides[d] : 0;
  }
  return true;
}

/* The output slots' views, checked: every slot in [0, n_outputs) belongs to exactly
 * one member. */
static bool slots_ok(const nbi_group *g) {
  if (g->n_outputs < 0 || g->n_outputs > NBI_FUSE_MAX) return false;
  unsigned seen = 0;
  for (int k = 0; k < g->n_members; k++) {
    int o = g->m[k].out;
    if (o < 0) continue;
    if (o >= g->n_outputs || (seen >> o) & 1u) return false;
    seen |= 1u << o;
  }
  return seen == (g->n_outputs ? (1u << g->n_outputs) - 1u : 0u);
}

static bool ew_ok(const nbi_group *g) {
  for (int k = 0; k < g->n_members; k++)
    if (g->m[k].role != NBI_ROLE_FULL || !cr_elementwise_ok(g, k)) return false;
  return true;
}

static nb_status ew_layout(const nbi_group *g, const nbi_view *out, const nbi_view *in,
                           cr_layout *L) {
  const nb_shape *F = &g->full;
  int nref = NBI_FUSE_MAX + g->n_outputs;
  int64_t st[CR_REFS][NB_MAX_DIMS] = {{0}};
  bool used[CR_REFS] = {false};
  for (int k = 0; k < g->n_operands; k++) {
    used[k] = true;
    L->ptr[k] = in[k].data;
    if (in[k].dtype != g->operand[k].dtype || !strides_over(&in[k], F, st[k]))
      return nbi_error(NB_ERR_INTERNAL, "nb_eval: fused group operand %d is not a %s view of F", k,
                       nb_dtype_name(g->operand[k].dtype));
  }
  for (int j = 0; j < g->n_outputs; j++) {
    int r = NBI_FUSE_MAX + j;
    used[r] = true;
    L->ptr[r] = out[j].data;
    if (!strides_over(&out[j], F, st[r])) { /* any contiguous buffer of F's size */
      if (!nbi_view_is_contiguous(&out[j]) || view_numel(&out[j]) != nbi_numel(F))
        return nbi_error(NB_ERR_INTERNAL, "nb_eval: fused group output %d is not a view of F", j);
      nbi_contig_strides(F, st[r]);
    }
  }
  for (int k = 0; k < g->n_members; k++)
    if (g->m[k].out >= 0 && out[g->m[k].out].dtype != g->m[k].dtype)
      return nbi_error(NB_ERR_INTERNAL, "nb_eval: fused group output %d is not %s", g->m[k].out,
                       nb_dtype_name(g->m[k].dtype));
  /* merge dims: drop size 1, join d into the previous kept dim when every ref nests */
  int nd = 0;
  L->n = nbi_numel(F);
  for (int d = 0; d < F->ndim; d++) {
    if (F->dims[d] == 1) continue;
    bool join = nd > 0;
    for (int r = 0; r < nref && join; r++)
      join = !used[r] || st[r][nd - 1] == st[r][d] * F->dims[d];
    if (join) {
      L->dims[nd - 1] *= F->dims[d];
      for (int r = 0; r < nref; r++)
        st[r][nd - 1] = st[r][d];
    } else {
      L->dims[nd] = F->dims[d];
      for (int r = 0; r < nref; r++)
        st[r][nd] = st[r][d];
      nd++;
    }
  }
  if (L->n == 0) {
    /* no element: one empty contiguous dim. A kept zero-size dim would reach
     * udiv_word (a division by zero, SIGFPE) when an operand's strides make the
     * layout general (an empty reversed slice); the kernel is never launched. */
    L->dims[0] = 0;
    for (int r = 0; r < nref; r++)
      st[r][0] = 1;
    nd = 1;
  } else if (nd == 0) { /* one element (or F is 0-d) */
    L->dims[0] = 1;
    for (int r = 0; r < nref; r++)
      st[r][0] = 1;
    nd = 1;
  }
  L->sig.nd = (uint8_t)nd;
  L->sig.idx32 = L->n < ((int64_t)1 << 31);
  int64_t es_max = 1;
  bool vec = true, general = false;
  for (int r = 0; r < nref; r++) {
    if (!used[r]) continue;
    int64_t c = 1;
    bool flat = true, zero = true;
    for (int d = nd - 1; d >= 0; d--) {
      flat = flat && (st[r][d] == c || L->dims[d] == 1);
      zero = zero && st[r][d] == 0;
      c *= L->dims[d];
    }
    int cls = zero && r < NBI_FUSE_MAX ? CR_EW_SCALAR : flat ? CR_EW_FLAT : CR_EW_GENERAL;
    if (zero && r >= NBI_FUSE_MAX && L->n > 1)
      return nbi_error(NB_ERR_INTERNAL, "nb_eval: fused group output %d is broadcast",
                       r - NBI_FUSE_MAX);
    L->sig.cls[r] = (uint8_t)cls;
    memcpy(L->st[r], st[r], sizeof st[r]);
    general = general || cls == CR_EW_GENERAL;
    if (cls == CR_EW_SCALAR) continue;
    vec = vec && cls == CR_EW_FLAT;
    nb_dtype dt = r < NBI_FUSE_MAX ? g->operand[r].dtype : out[r - NBI_FUSE_MAX].dtype;
    int64_t es = (int64_t)nb_dtype_size(dt);
    es_max = es > es_max ? es : es_max;
  }
  int64_t vw = 16 / es_max;
  for (int r = 0; r < nref && vec; r++) {
    if (!used[r] || L->sig.cls[r] == CR_EW_SCALAR) continue;
    nb_dtype dt = r < NBI_FUSE_MAX ? g->operand[r].dtype : out[r - NBI_FUSE_MAX].dtype;
    vec = (uintptr_t)L->ptr[r] % (uintptr_t)(vw * (int64_t)nb_dtype_size(dt)) == 0;
  }
  L->sig.vec = vec && L->n >= 2 * vw;
  L->sig.vw = L->sig.vec ? (uint8_t)vw : 0;
  L->sig.block = 256;
  /* parameters */
  int w = cr_field_add(L, "n", CR_I64, 0);
  if (w < 0) return NB_ERR_INTERNAL;
  L->cfg->words[w] = (uint64_t)L->n;
  if (general) {
    int wd = cr_field_add(L, "dim", CR_I64, nd);
    int wv = L->sig.idx32 ? cr_field_add(L, "dv", CR_U64, nd) : 0;
    if (wd < 0 || wv < 0) return NB_ERR_INTERNAL;
    for (int d = 0; d < nd; d++) {
      L->cfg->words[wd + d] = (uint64_t)L->dims[d];
      if (L->sig.idx32) L->cfg->words[wv + d] = udiv_word((uint32_t)L->dims[d]);
    }
  }
  for (int r = 0; r < nref; r++) {
    if (!used[r]) continue;
    bool o = r >= NBI_FUSE_MAX;
    int idx = o ? r - NBI_FUSE_MAX : r;
    char nm[12];
    snprintf(nm, sizeof nm, "%s%d", o ? "out" : "in", idx);
    if ((w = cr_field_add(L, nm, o ? CR_PTR : CR_CPTR, 0)) < 0) return NB_ERR_INTERNAL;
    L->cfg->words[w] = (uint64_t)(uintptr_t)L->ptr[r];
    if (L->sig.cls[r] != CR_EW_GENERAL) continue;
    snprintf(nm, sizeof nm, "%s%d", o ? "os" : "is", idx);
    if ((w = cr_field_add(L, nm, CR_I64, nd)) < 0) return NB_ERR_INTERNAL;
    for (int d = 0; d < nd; d++)
      L->cfg->words[w + d] = (uint64_t)L->st[r][d];
  }
  /* launch: grid-stride, at most 32 blocks per multiprocessor */
  int64_t work = L->sig.vec ? L->n / vw + L->n % vw : L->n;
  int64_t blocks = (work + 255) / 256, cap = (int64_t)L->sm_count * 32;
  L->cfg->block = 256;
  L->cfg->grid = (unsigned)(blocks < cap ? blocks : cap);
  return NB_OK;
}

/* ---- elementwise kernel
 * -------------------------------------------------------------------------- */
/* Emits the loads of the operands that member k..n read and no earlier member loaded
 * in this loop body; `at` is the element offset expression of a flat operand. */
static void ew_emit_loads(cr_buf *b, const nbi_group *g, const cr_layout *L, bool *loaded,
                          const char *at, bool vector) {
  for (int e = 0; e < g->n_operands; e++) {
    if (loaded[e] || L->sig.cls[e] == CR_EW_SCALAR) continue;
    nb_dtype dt = g->operand[e].dtype;
    if (vector) {
      if (dt == NB_F16 || dt == NB_BF16)
        cr_put(b, "const float o%d = nb_%s_to_f32(a%d.v[e]);\n", e, cr_dtn(dt), e);
      else if (dt == NB_BOOL)
        cr_put(b, "const bool o%d = a%d.v[e] != 0;\n", e, e);
      else
        cr_put(b, "const %s o%d = a%d.v[e];\n", cr_repr(dt), e, e);
    } else if (L->sig.cls[e] == CR_EW_FLAT) {
      cr_put(b, "const %s o%d = nb_ld_%s(p.in%d, %s);\n", cr_repr(dt), e, cr_dtn(dt), e, at);
    } else {
      cr_put(b, "const %s o%d = nb_ld_%s(p.in%d, ", cr_repr(dt), e, cr_dtn(dt), e);
      for (int d = 0; d < L->sig.nd; d++)
        cr_put(b, "%si%d * p.is%d[%d]", d ? " + " : "", d, e, d);
      cr_put(b, ");\n");
    }
    loaded[e] = true;
  }
}

static void ew_emit_members_and_stores(cr_buf *b, const nbi_group *g, const cr_layout *L,
                                       bool vector) {
  for (int k = 0; k < g->n_members; k++)
    cr_emit_member(b, g, k);
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    if (m->out < 0) continue;
    int r = NBI_FUSE_MAX + m->out;
    if (vector) {
      if (m->dtype == NB_F16 || m->dtype == NB_BF16)
        cr_put(b, "w%d.v[e] = nb_f32_to_%s(v%d);\n", m->out, cr_dtn(m->dtype), k);
      else
        cr_put(b, "w%d.v[e] = (%s)v%d;\n", m->out, storage_type(m->dtype), k);
    } else if (L->sig.cls[r] == CR_EW_FLAT || L->sig.cls[r] == CR_EW_SCALAR) {
      cr_put(b, "nb_st_%s(p.out%d, i, v%d);\n", cr_dtn(m->dtype), m->out, k);
    } else {
      cr_put(b, "nb_st_%s(p.out%d, ", cr_dtn(m->dtype), m->out);
      for (int d = 0; d < L->sig.nd; d++)
        cr_put(b, "%si%d * p.os%d[%d]", d ? " + " : "", d, m->out, d);
      cr_put(b, ", v%d);\n", k);
    }
  }
}

static void ew_render(cr_buf *b, const nbi_group *g, const cr_layout *L, const char *name) {
  static const char *const cls_names[] = {"scalar (every stride 0)", "flat", "strided"};
  int nd = L->sig.nd, vw = L->sig.vw;
  cr_put(b,
         "/* %s: an elementwise group of %d members over F, n = numel(F) elements, "
         "walked as %d merged dim%s (%s indices)",
         name, g->n_members, nd, nd > 1 ? "s" : "", L->sig.idx32 ? "32-bit" : "64-bit");
  if (vw) cr_put(b, ", %d elements per 16-byte vector", vw);
  cr_put(b, ".\n");
  for (int e = 0; e < g->n_operands; e++)
    cr_put(b, " *   in%d: %s, %s\n", e, nb_dtype_name(g->operand[e].dtype),
           cls_names[L->sig.cls[e]]);
  for (int j = 0; j < g->n_outputs; j++)
    cr_put(b, " *   out%d: %s (n)\n", j, cls_names[L->sig.cls[NBI_FUSE_MAX + j]]);
  for (int k = 0; k < g->n_members; k++)
    cr_describe_member(b, g, k);
  cr_put(b, " */\n");
  cr_emit_op_functions(b, g);
  cr_emit_params(b, L);
  cr_put(b, "extern \"C\" __global__ void __launch_bounds__(%d) %s(const nb_params p) {\n",
         L->sig.block, name);
  cr_put(b, "const int64_t nt = (int64_t)gridDim.x * blockDim.x;\n"
            "const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n");
  for (int e = 0; e < g->n_operands; e++)
    if (L->sig.cls[e] == CR_EW_SCALAR)
      cr_put(b, "const %s o%d = nb_ld_%s(p.in%d, 0);\n", cr_repr(g->operand[e].dtype), e,
             cr_dtn(g->operand[e].dtype), e);
  bool loaded[NBI_FUSE_MAX];
  const char *start = "0";
  if (vw) {
    start = "p.n / VW * VW";
    cr_put(b, "constexpr int VW = %d;\nfor (int64_t i = t0; i < p.n / VW; i += nt) {\n", vw);
    for (int e = 0; e < g->n_operands; e++)
      if (L->sig.cls[e] != CR_EW_SCALAR)
        cr_put(b, "const nb_pack<%s, VW> a%d = ((const nb_pack<%s, VW> *)p.in%d)[i];\n",
               storage_type(g->operand[e].dtype), e, storage_type(g->operand[e].dtype), e);
    for (int k = 0; k < g->n_members; k++)
      if (g->m[k].out >= 0)
        cr_put(b, "nb_pack<%s, VW> w%d;\n", storage_type(g->m[k].dtype), g->m[k].out);
    cr_put(b, "#pragma unroll\nfor (int e = 0; e < VW; e++) {\n");
    memset(loaded, 0, sizeof loaded);
    ew_emit_loads(b, g, L, loaded, "", true);
    ew_emit_members_and_stores(b, g, L, true);
    cr_put(b, "}\n");
    for (int k = 0; k < g->n_members; k++)
      if (g->m[k].out >= 0)
        cr_put(b, "((nb_pack<%s, VW> *)p.out%d)[i] = w%d;\n", storage_type(g->m[k].dtype),
               g->m[k].out, g->m[k].out);
    cr_put(b, "}\n");
  }
  cr_put(b, "for (int64_t i = %s + t0; i < p.n; i += nt) {\n", start);
  bool general = false;
  for (int r = 0; r < CR_REFS; r++)
    general = general || L->sig.cls[r] == CR_EW_GENERAL;
  if (general) { /* i as indices into the merged dims, innermost last */
    if (L->sig.idx32) {
      cr_put(b, "uint32_t rem = (uint32_t)i, q;\n");
      for (int d = nd - 1; d > 0; d--)
        cr_put(b,
               "q = nb_udiv(rem, p.dv[%d]);\nconst int64_t i%d = rem - q * (uint32_t)p.dim[%d];\n"
               "rem = q;\n",
               d, d, d);
      cr_put(b, "const int64_t i0 = rem;\n");
    } else {
      cr_put(b, "int64_t rem = i;\n");
      for (int d = nd - 1; d > 0; d--)
        cr_put(b, "const int64_t i%d = rem %% p.dim[%d];\nrem /= p.dim[%d];\n", d, d, d);
      cr_put(b, "const int64_t i0 = rem;\n");
    }
  }
  memset(loaded, 0, sizeof loaded);
  ew_emit_loads(b, g, L, loaded, "i", false);
  ew_emit_members_and_stores(b, g, L, false);
  cr_put(b, "}\n}\n");
}

/* ---- entry points
 * ------------------------------------------------------------------------------------ */
static bool group_ok(const nbi_group *g) {
  if (!g || g->n_members < 1 || g->n_members > NBI_FUSE_MAX || g->n_operands < 0 ||
      g->n_operands > NBI_FUSE_MAX || g->full.ndim < 0 || g->full.ndim > NB_MAX_DIMS ||
      !slots_ok(g))
    return false;
  for (int e = 0; e < g->n_operands; e++)
    if (!nbi_dtype_valid(g->operand[e].dtype)) return false;
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    if (m->n_in > 3 || m->op < 0 || m->op >= NBI_OP_COUNT) return false;
    for (int q = 0; q < m->n_in; q++)
      if (m->src[q] >= k || -1 - m->src[q] >= g->n_operands) return false;
  }
  if (g->kind == NBI_GROUP_ELEMENTWISE) return ew_ok(g);
  if (g->kind == NBI_GROUP_ROWS) return cr_rows_ok(g);
  return false;
}

/* The layout of g for these views (cfg receives the parameters and the launch). */
static nb_status layout(const nbi_group *g, const nbi_view *out, const nbi_view *in, int sm_count,
                        cr_layout *L, nbi_cuda_launch_cfg *cfg) {
  memset(&L->sig, 0, sizeof L->sig);
  L->n_fields = 0;
  L->cfg = cfg;
  L->sm_count = sm_count > 0 ? sm_count : 132;
  memset(cfg, 0, offsetof(nbi_cuda_launch_cfg, words));
  if (!group_ok(g))
    return nbi_error(NB_ERR_INTERNAL, "nb_eval: the CUDA generator cannot run this fused group");
  L->sig.kind = g->kind;
  nb_status st =
      g->kind == NBI_GROUP_ROWS ? cr_rows_layout(g, out, in, L) : ew_layout(g, out, in, L);
  if (st == NB_ERR_INTERNAL && nb_last_status() == NB_OK)
    st = nbi_error(NB_ERR_INTERNAL, "nb_eval: a fused group has too many kernel parameters");
  return st;
}

/* The source of g for layout L: malloc'd, NULL (recorded) when out of memory. The
 * kernel's name is a hash of its own text (rendered with a placeholder of the same
 * length, then written over it), so equal sources have equal names and a source never
 * depends on sizes or on g's key. */
static char *render(const nbi_group *g, const cr_layout *L, char name[64]) {
  static const char placeholder[] = "nbk_@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@";
  cr_buf b = {0};
  cr_put(&b, "%s", nbi_cuda_preamble);
  size_t body = b.n;
  if (g->kind == NBI_GROUP_ROWS)
    cr_rows_render(&b, g, L, placeholder);
  else
    ew_render(&b, g, L, placeholder);
  if (b.oom) {
    free(b.p);
    nbi_error(NB_ERR_OOM, "nb_eval: out of memory rendering a CUDA kernel");
    return NULL;
  }
  uint64_t h1 = 0x243f6a8885a308d3ull, h2 = 0x13198a2e03707344ull;
  for (size_t i = body; i < b.n; i += 8) {
    uint64_t w = 0;
    memcpy(&w, b.p + i, b.n - i < 8 ? b.n - i : 8);
    nbi_hash_mix(&h1, &h2, w);
  }
  snprintf(name, 64, "nb%c_%016llx%016llx", g->kind == NBI_GROUP_ROWS ? 'r' : 'e',
           (unsigned long long)h1, (unsigned long long)h2);
  size_t len = sizeof placeholder - 1;
  for (char *at = strstr(b.p + body, placeholder); at; at = strstr(at + len, placeholder))
    memcpy(at, name, len);
  return b.p;
}

char *nbi_cuda_render_group(const nbi_group *g, const nbi_view *out, const nbi_view *in,
                            char name[64], nbi_cuda_launch_cfg *launch) {
  cr_layout L;
  if (layout(g, out, in, 0, &L, launch)) return NULL;
  return render(g, &L, name);
}

bool nbi_cuda_group_ok(const nbi_cuda_ctx *c, const nbi_group *g) {
  (void)c; /* no device limit applies: blocks of 256 threads, static shared memory only */
  return group_ok(g);
}

/* ---- the kernel cache
 * --------------------------------------------------------------------------------- */
enum { CACHE_SLOTS = 2048 };
typedef struct cache_entry {
  bool used;
  int ordinal;
  uint64_t key[2];
  cr_sig sig;
  CUfunction fn, fn2;
} cache_entry;
static cache_entry cache[CACHE_SLOTS];
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* The entry of (g, sig, ordinal) or NULL; with insert, the free slot it would take
 * (NULL when the table is full). Under cache_lock. */
static cache_entry *cache_slot(const nbi_group *g, const cr_sig *sig, int ordinal, bool insert) {
  for (uint64_t i = 0; i < CACHE_SLOTS; i++) {
    cache_entry *e = &cache[(g->key[0] + i) % CACHE_SLOTS];
    if (!e->used) return insert ? e : NULL;
    if (e->key[0] == g->key[0] && e->key[1] == g->key[1] && e->ordinal == ordinal &&
        !memcmp(&e->sig, sig, sizeof *sig))
      return e;
  }
  return NULL;
}

/* The functions the table keeps for (g, sig) on device ordinal: true and
 * *fn, *fn2 set when it has them (never for an unkeyed group). */
static bool cache_find(const nbi_group *g, const cr_sig *sig, int ordinal, CUfunction *fn,
                       CUfunction *fn2) {
  if (!g->key[0] && !g->key[1]) return false;
  pthread_mutex_lock(&cache_lock);
  const cache_entry *e = cache_slot(g, sig, ordinal, false);
  if (e) *fn = e->fn, *fn2 = e->fn2;
  pthread_mutex_unlock(&cache_lock);
  return e != NULL;
}

char *nbi_cuda_group_source(nbi_cuda_ctx *c, const nbi_group *g, const nbi_view *out,
                            const nbi_view *in) {
  if (!g || g->kind == NBI_GROUP_GEMM) return NULL; /* cuBLASLt's, and a small pass */
  nb_status before = nb_last_status();
  cr_layout L;
  nbi_cuda_launch_cfg cfg;
  CUfunction fn, fn2;
  char name[64], *src = NULL;
  if (layout(g, out, in, c->sm_count, &L, &cfg) == NB_OK && (cfg.grid || cfg.grid2) &&
      !cache_find(g, &L.sig, c->ordinal, &fn, &fn2))
    src = render(g, &L, name);
  if (before == NB_OK && nb_last_status() != NB_OK) nb_clear_error(); /* best effort */
  return src;
}

nb_status nbi_cuda_run_group(nbi_cuda_ctx *c, const nbi_group *g, nbi_view *out,
                             const nbi_view *in) {
  cr_layout L;
  nbi_cuda_launch_cfg cfg;
  nb_status st = layout(g, out, in, c->sm_count, &L, &cfg);
  if (st) return st;
  if (cfg.grid == 0 && cfg.grid2 == 0) return NB_OK; /* nothing to compute */
  bool keyed = g->key[0] || g->key[1];
  CUfunction fn = NULL, fn2 = NULL;
  if (!cache_find(g, &L.sig, c->ordinal, &fn, &fn2)) {
    char name[64], name2[72];
    char *src = render(g, &L, name);
    if (!src) return NB_ERR_OOM;
    st = nbi_cuda_function(c, src, name, &fn);
    if (!st && cfg.block2) {
      snprintf(name2, sizeof name2, "%s_g", name);
      st = nbi_cuda_function(c, src, name2, &fn2);
    }
    free(src);
    if (st) return st;
    if (keyed) {
      pthread_mutex_lock(&cache_lock);
      cache_entry *e = cache_slot(g, &L.sig, c->ordinal, true);
      if (e && !e->used)
        *e = (cache_entry){.used = true,
                           .ordinal = c->ordinal,
                           .key = {g->key[0], g->key[1]},
                           .sig = L.sig,
                           .fn = fn,
                           .fn2 = fn2};
      pthread_mutex_unlock(&cache_lock);
    }
  }
  void *args[1] = {cfg.words};
  if (cfg.grid) st = nbi_cuda_launch(c, fn, cfg.grid, 1, cfg.block, cfg.smem, args);
  if (!st && cfg.block2) st = nbi_cuda_launch(c, fn2, cfg.grid2, 1, cfg.block2, 0, args);
  return st;
}
