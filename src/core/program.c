/* src/core/program.c — multi-output nodes and programs (recorded graphs that
 * are applied to new inputs). See nbi.h for the contracts. */
#include "nbi.h"
#include "oprules.h"
#include "program.h"

#include <math.h>
#include <stdlib.h>

/* ---- multi-output nodes -------------------------------------------------------------- */
nb_status nbi_multi_init(const char *fn, nbi_multi *m, int n_out, const nb_shape *shapes,
                         const nb_dtype *dtypes) {
  m->n_out = n_out;
  m->shape = malloc(sizeof *m->shape * (size_t)(n_out ? n_out : 1));
  m->dtype = malloc(sizeof *m->dtype * (size_t)(n_out ? n_out : 1));
  m->offset = malloc(sizeof *m->offset * (size_t)(n_out ? n_out : 1));
  if (!m->shape || !m->dtype || !m->offset) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  int64_t off = 0;
  for (int j = 0; j < n_out; j++) {
    m->shape[j] = shapes[j];
    m->dtype[j] = dtypes[j];
    m->offset[j] = off;
    int64_t bytes = nbi_numel(&shapes[j]) * (int64_t)nb_dtype_size(dtypes[j]);
    off += (bytes + 63) / 64 * 64;
    if (off > NBI_MAX_NUMEL)
      return nbi_error(NB_ERR_OVERFLOW, "%s: the outputs need more than 2^48 bytes", fn);
  }
  m->nbytes = off;
  return NB_OK;
}

void nbi_multi_fini(nbi_multi *m) {
  free(m->shape);
  free(m->dtype);
  free(m->offset);
  m->shape = NULL, m->dtype = NULL, m->offset = NULL;
}

nb_tensor *nbi_multi_get(nb_tensor *p, int j) {
  const nbi_multi *m = nbi_multi_of(p);
  nbi_attrs a = {.i = {j, m->offset[j]}};
  return nbi_record(NBI_OP_TUPLE_GET, m->dtype[j], &m->shape[j], &p, 1, &a);
}

nb_status nbi_record_multi(int op, nb_tensor *const *in, int n_in, nbi_multi *m,
                           const nbi_attrs *extra, nb_tensor **outs) {
  for (int j = 0; j < m->n_out; j++)
    outs[j] = NULL;
  nbi_attrs a = {0};
  if (extra) a = *extra;
  a.i[0] = (int64_t)m->base.h1;
  a.i[1] = (int64_t)m->base.h2;
  nb_shape s = {.ndim = 1, .dims = {m->nbytes}};
  nb_tensor *p = nbi_record(op, NB_BOOL, &s, in, n_in, &a);
  if (!p) return nb_last_status();
  nbi_set_payload(p, &m->base);
  for (int j = 0; j < m->n_out; j++)
    if (!(outs[j] = nbi_multi_get(p, j))) {
      for (int i = 0; i < j; i++)
        outs[i] = NULL; /* the scope frees them */
      return nb_last_status();
    }
  return NB_OK;
}

nbi_view nbi_multi_out_view(const nb_tensor *p, const nbi_view *pack, int j) {
  const nbi_multi *m = nbi_multi_of(p);
  nbi_view v = {.data = pack->data + m->offset[j], .dtype = m->dtype[j], .ndim = m->shape[j].ndim};
  memcpy(v.dims, m->shape[j].dims, sizeof v.dims);
  nbi_contig_strides(&m->shape[j], v.strides);
  return v;
}

/* ---- a pointer -> index map for the build walk ------------------------------------------
 * Open addressing; programs never touch the tensors' scratch fields, so a
 * build may run while a sweep or a realization has them in use. */
typedef struct ptrmap {
  const void **key;
  int32_t *val;
  size_t cap, n;
} ptrmap;

static size_t ptr_slot(const ptrmap *m, const void *k) {
  uint64_t h = (uint64_t)(uintptr_t)k * 0x9e3779b97f4a7c15ull;
  size_t i = (size_t)(h >> 20) & (m->cap - 1);
  while (m->key[i] && m->key[i] != k)
    i = (i + 1) & (m->cap - 1);
  return i;
}

static bool ptr_put(ptrmap *m, const void *k, int32_t v) {
  if (2 * (m->n + 1) > m->cap) {
    ptrmap g = {.cap = m->cap ? 2 * m->cap : 64};
    g.key = calloc(g.cap, sizeof *g.key);
    g.val = malloc(g.cap * sizeof *g.val);
    if (!g.key || !g.val) {
      free(g.key);
      free(g.val);
      return false;
    }
    for (size_t i = 0; i < m->cap; i++)
      if (m->key[i]) {
        size_t s = ptr_slot(&g, m->key[i]);
        g.key[s] = m->key[i];
        g.val[s] = m->val[i];
        g.n++;
      }
    free(m->key);
    free(m->val);
    *m = g;
  }
  size_t s = ptr_slot(m, k);
  if (!m->key[s]) m->n++;
  m->key[s] = k;
  m->val[s] = v;
  return true;
}

static bool ptr_get(const ptrmap *m, const void *k, int32_t *v) {
  if (!m->cap) return false;
  size_t s = ptr_slot(m, k);
  if (!m->key[s]) return false;
  *v = m->val[s];
  return true;
}

/* ---- programs --------------------------------------------------------------------------- */
nbi_program *nbi_program_retain(nbi_program *p) {
  if (p) NBI_REF_INC(p);
  return p;
}

void nbi_program_release(nbi_program *p) {
  if (!p || NBI_REF_DEC(p) > 0) return;
  for (int i = 0; i < p->n_nodes; i++) {
    nbi_payload_release(p->nodes[i].payload);
    free(p->nodes[i].in);
  }
  free(p->nodes);
  free(p->in_shape);
  free(p->in_dtype);
  free(p->out_shape);
  free(p->out_dtype);
  free(p->out);
  free(p);
}

typedef struct builder {
  const char *fn;
  uint64_t seq0;
  ptrmap map; /* tensor -> ref (node index, or -1 - input) */
  nbi_prog_node *nodes;
  int n, cap;
  nb_tensor **capt;
  int n_capt, cap_capt;
  int n_x;
} builder;

static bool grow(void **arr, int *cap, int need, size_t elem) {
  if (need <= *cap) return true;
  int nc = *cap ? *cap : 16;
  while (nc < need)
    nc *= 2;
  void *na = realloc(*arr, (size_t)nc * elem);
  if (!na) return false;
  *arr = na;
  *cap = nc;
  return true;
}

static bool is_capture(const builder *b, const nb_tensor *t) {
  return (t->flags & NBI_T_REALIZED) || t->seq < b->seq0 || t->op == NBI_OP_PLACEHOLDER ||
         t->op == NBI_OP_CONST;
}

/* Every element of the trace's constant c is exactly v (signs of zeros
 * included). Constants are small or broadcast; at most 2^20 are read. */
static bool constant_all(const builder *b, const nb_tensor *c, double v) {
  if (!(c->flags & NBI_T_REALIZED) || c->seq < b->seq0 || !c->shard0.buf) return false;
  int64_t n = nbi_numel(&c->shape);
  if (n > ((int64_t)1 << 20)) return false;
  nbi_view w = nbi_tensor_view(c);
  double one, *x = n > 1 ? malloc(sizeof *x * (size_t)n) : &one;
  nb_status before = nb_last_status();
  bool all = x && !nbi_host_read(c->device, &w, x, NB_F64); /* the values, on the host */
  if (!all && !before) nb_clear_error(); /* a failed read: only "not known to be constant" */
  for (int64_t i = 0; i < n && all; i++)
    all = x[i] == v && signbit(x[i]) == signbit(v);
  if (x != &one) free(x);
  return all;
}

/* The operand t's value equals bit for bit, when t is x * 1, 1 * x, x / 1,
 * x - (+0) or x + (-0) with a constant of the trace (x + 0 is not exact: -0
 * + 0 = +0), x of t's shape and dtype and the op computing in that dtype. */
static nb_tensor *exact_operand(const builder *b, const nb_tensor *t) {
  if (t->n_in != 2 || (nb_dtype)t->attrs.i[0] != t->dtype) return NULL;
  for (int k = 0; k < 2; k++) {
    nb_tensor *x = t->in[k], *c = t->in[1 - k];
    if (x->dtype != t->dtype || !nbi_shape_eq(&x->shape, &t->shape)) continue;
    bool ok = false;
    switch (t->op) {
    case NBI_OP_MUL: ok = constant_all(b, c, 1.0); break;
    case NBI_OP_DIV: ok = k == 0 && constant_all(b, c, 1.0); break;
    case NBI_OP_SUB: ok = k == 0 && constant_all(b, c, 0.0); break;
    case NBI_OP_ADD: ok = constant_all(b, c, -0.0); break;
    default: break;
    }
    if (ok) return x;
  }
  return NULL;
}

/* The ref of t, adding it (and, iteratively, everything it needs) first. */
static nb_status build_ref(builder *b, nb_tensor *root, int32_t *ref) {
  if (ptr_get(&b->map, root, ref)) return NB_OK;
  nb_tensor **stack = NULL;
  int *next = NULL, n = 0, cap = 0, cap_next = 0;
  nb_status st = NB_OK;
#define PUSH(t)                                                                                    \
  do {                                                                                             \
    if (!grow((void **)&stack, &cap, n + 1, sizeof *stack) ||                                      \
        !grow((void **)&next, &cap_next, n + 1, sizeof *next)) {                                   \
      st = NB_ERR_OOM;                                                                             \
      goto done;                                                                                   \
    }                                                                                              \
    stack[n] = (t);                                                                                \
    next[n++] = 0;                                                                                 \
  } while (0)
  PUSH(root);
  while (n) {
    nb_tensor *t = stack[n - 1];
    int32_t r;
    if (ptr_get(&b->map, t, &r)) {
      n--;
      continue;
    }
    if (is_capture(b, t)) {
      if (!grow((void **)&b->capt, &b->cap_capt, b->n_capt + 1, sizeof *b->capt) ||
          !ptr_put(&b->map, t, -1 - (b->n_x + b->n_capt))) {
        st = NB_ERR_OOM;
        goto done;
      }
      b->capt[b->n_capt++] = nb_retain(t);
      n--;
      continue;
    }
    if (next[n - 1] < t->n_in) {
      nb_tensor *c = t->in[next[n - 1]++];
      if (!ptr_get(&b->map, c, &r)) PUSH(c);
      continue;
    }
    /* post-order: every input has a ref */
    nb_tensor *same = nbi_simplify_enabled() ? exact_operand(b, t) : NULL;
    int32_t same_ref = 0;
    if (same && ptr_get(&b->map, same, &same_ref)) { /* x * 1 and the like: t's ref is x's */
      if (!ptr_put(&b->map, t, same_ref)) {
        st = NB_ERR_OOM;
        goto done;
      }
      n--;
      continue;
    }
    if (!grow((void **)&b->nodes, &b->cap, b->n + 1, sizeof *b->nodes)) {
      st = NB_ERR_OOM;
      goto done;
    }
    nbi_prog_node *pn = &b->nodes[b->n];
    *pn = (nbi_prog_node){
        .op = t->op, .dtype = t->dtype, .shape = t->shape, .attrs = t->attrs, .n_in = t->n_in};
    pn->in = malloc(sizeof *pn->in * (size_t)(t->n_in ? t->n_in : 1));
    if (!pn->in) {
      st = NB_ERR_OOM;
      goto done;
    }
    for (int k = 0; k < t->n_in; k++)
      ptr_get(&b->map, t->in[k], &pn->in[k]);
    pn->payload = nbi_payload_retain(t->payload);
    b->n++;
    if (!ptr_put(&b->map, t, b->n - 1)) {
      st = NB_ERR_OOM;
      goto done;
    }
    n--;
  }
#undef PUSH
done:
  free(stack);
  free(next);
  if (st) return nbi_error(st, "%s: out of memory recording the program", b->fn);
  ptr_get(&b->map, root, ref);
  return NB_OK;
}

/* ---- constant folding -------------------------------------------------------------------
 * A node recorded during the trace (seq >= seq0) whose inputs are all
 * constants of the trace has the same value at every call: constants are the
 * realized tensors the trace made (nb_full, nb_scalar, nb_arange, nb_from_data
 * in the body, the ones a gradient starts from) and the untraced nodes built
 * only from them. Tensors from outside the trace are not constants (nb_assign
 * on them is seen by later calls). The constant nodes that the rest of the
 * graph reads are realized here, once, and become captures of the program:
 * a replay runs none of their kernels. */
enum { FOLD_NO = 1, FOLD_CONST, FOLD_FRONTIER }; /* ptrmap values */

static bool fold_candidate(const nb_tensor *t, uint64_t seq0) {
  return !(t->flags & (NBI_T_REALIZED | NBI_T_TRACED)) && t->seq >= seq0 && t->n_in > 0 &&
         t->op != NBI_OP_CUSTOM;
}

static nb_status fold_constants(const char *fn, nb_tensor *const *y, int n_y, uint64_t seq0) {
  ptrmap seen = {0};
  nb_tensor **stack = NULL, **frontier = NULL;
  int *next = NULL, n = 0, cap = 0, cap_next = 0, n_front = 0, cap_front = 0;
  nb_status st = NB_OK;
  for (int j = 0; j < n_y && !st; j++) {
    int32_t v;
    if (!grow((void **)&stack, &cap, n + 1, sizeof *stack) ||
        !grow((void **)&next, &cap_next, n + 1, sizeof *next)) {
      st = NB_ERR_OOM;
      break;
    }
    stack[n] = y[j], next[n++] = 0;
    while (n && !st) {
      nb_tensor *t = stack[n - 1];
      if (ptr_get(&seen, t, &v)) {
        n--;
        continue;
      }
      if ((t->flags & NBI_T_REALIZED) || t->seq < seq0 || t->n_in == 0) { /* a leaf */
        bool c = (t->flags & NBI_T_REALIZED) && t->seq >= seq0;
        if (!ptr_put(&seen, t, c ? FOLD_CONST : FOLD_NO)) st = NB_ERR_OOM;
        n--;
        continue;
      }
      if (next[n - 1] < t->n_in) {
        nb_tensor *c = t->in[next[n - 1]++];
        if (ptr_get(&seen, c, &v)) continue;
        if (!grow((void **)&stack, &cap, n + 1, sizeof *stack) ||
            !grow((void **)&next, &cap_next, n + 1, sizeof *next)) {
          st = NB_ERR_OOM;
          break;
        }
        stack[n] = c, next[n++] = 0;
        continue;
      }
      /* post-order: every input is classified */
      bool c = fold_candidate(t, seq0);
      for (int k = 0; k < t->n_in && c; k++)
        c = ptr_get(&seen, t->in[k], &v) && v != FOLD_NO;
      if (!ptr_put(&seen, t, c ? FOLD_CONST : FOLD_NO)) st = NB_ERR_OOM;
      for (int k = 0; k < t->n_in && !c && !st; k++) { /* constant inputs of a variable node */
        nb_tensor *x = t->in[k];
        if (!(ptr_get(&seen, x, &v) && v == FOLD_CONST) || (x->flags & NBI_T_REALIZED)) continue;
        if (!grow((void **)&frontier, &cap_front, n_front + 1, sizeof *frontier) ||
            !ptr_put(&seen, x, FOLD_FRONTIER))
          st = NB_ERR_OOM;
        else
          frontier[n_front++] = x;
      }
      n--;
    }
  }
  for (int j = 0; j < n_y && !st; j++) { /* constant outputs */
    int32_t v;
    if (!ptr_get(&seen, y[j], &v) || v != FOLD_CONST || (y[j]->flags & NBI_T_REALIZED)) continue;
    if (!grow((void **)&frontier, &cap_front, n_front + 1, sizeof *frontier) ||
        !ptr_put(&seen, y[j], FOLD_FRONTIER))
      st = NB_ERR_OOM;
    else
      frontier[n_front++] = y[j];
  }
  free(stack);
  free(next);
  free(seen.key);
  free(seen.val);
  if (st) st = nbi_error(st, "%s: out of memory folding constants", fn);
  if (!st && n_front) st = nbi_realize(frontier, n_front);
  free(frontier);
  return st;
}

static void hash_shape(uint64_t *a, uint64_t *b, const nb_shape *s, nb_dtype dt) {
  nbi_hash_mix(a, b, (uint64_t)dt);
  nbi_hash_mix(a, b, (uint64_t)s->ndim);
  for (int d = 0; d < s->ndim; d++)
    nbi_hash_mix(a, b, (uint64_t)s->dims[d]);
}

static void program_hash(nbi_program *p) {
  uint64_t a = 0x6a09e667f3bcc908ull, b = 0xbb67ae8584caa73bull;
  nbi_hash_mix(&a, &b, (uint64_t)p->n_in);
  for (int k = 0; k < p->n_in; k++)
    hash_shape(&a, &b, &p->in_shape[k], p->in_dtype[k]);
  for (int i = 0; i < p->n_nodes; i++) {
    const nbi_prog_node *pn = &p->nodes[i];
    nbi_hash_mix(&a, &b, (uint64_t)pn->op);
    hash_shape(&a, &b, &pn->shape, pn->dtype);
    for (size_t w = 0; w < sizeof pn->attrs / 8; w++) {
      uint64_t v;
      memcpy(&v, (const char *)&pn->attrs + 8 * w, 8);
      nbi_hash_mix(&a, &b, v);
    }
    nbi_hash_mix(&a, &b, (uint64_t)pn->n_in);
    for (int k = 0; k < pn->n_in; k++)
      nbi_hash_mix(&a, &b, (uint64_t)(int64_t)pn->in[k]);
  }
  for (int j = 0; j < p->n_out; j++)
    nbi_hash_mix(&a, &b, (uint64_t)(int64_t)p->out[j]);
  p->h1 = a;
  p->h2 = b;
}

nb_status nbi_program_build(const char *fn, nb_tensor *const *x, int n_x, nb_tensor *const *y,
                            int n_y, uint64_t seq0, nbi_program **prog, nb_tensor ***capt,
                            int *n_capt) {
  *prog = NULL;
  *capt = NULL;
  *n_capt = 0;
  if (nbi_simplify_enabled()) {
    nb_status st = fold_constants(fn, y, n_y, seq0);
    if (st) return st;
  }
  builder b = {.fn = fn, .seq0 = seq0, .n_x = n_x};
  nbi_program *p = calloc(1, sizeof *p);
  int32_t *out = malloc(sizeof *out * (size_t)(n_y ? n_y : 1));
  nb_status st = p && out ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int k = 0; k < n_x && !st; k++)
    if (!ptr_put(&b.map, x[k], -1 - k)) st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int j = 0; j < n_y && !st; j++)
    st = build_ref(&b, y[j], &out[j]);
  if (!st) {
    int n_in = n_x + b.n_capt;
    *p = (nbi_program){
        .refcount = 1, .n_in = n_in, .n_out = n_y, .n_nodes = b.n, .out = out, .nodes = b.nodes};
    p->in_shape = malloc(sizeof *p->in_shape * (size_t)(n_in ? n_in : 1));
    p->in_dtype = malloc(sizeof *p->in_dtype * (size_t)(n_in ? n_in : 1));
    p->out_shape = malloc(sizeof *p->out_shape * (size_t)(n_y ? n_y : 1));
    p->out_dtype = malloc(sizeof *p->out_dtype * (size_t)(n_y ? n_y : 1));
    b.nodes = NULL;
    out = NULL;
    if (!p->in_shape || !p->in_dtype || !p->out_shape || !p->out_dtype) {
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    } else {
      for (int k = 0; k < n_in; k++) {
        const nb_tensor *t = k < n_x ? x[k] : b.capt[k - n_x];
        p->in_shape[k] = t->shape;
        p->in_dtype[k] = t->dtype;
      }
      for (int j = 0; j < n_y; j++) {
        p->out_shape[j] = y[j]->shape;
        p->out_dtype[j] = y[j]->dtype;
      }
      program_hash(p);
    }
  }
  free(b.map.key);
  free(b.map.val);
  if (st) {
    /* the nodes are still the builder's, or already the program's (moved) */
    for (int i = 0; i < b.n && b.nodes; i++) {
      nbi_payload_release(b.nodes[i].payload);
      free(b.nodes[i].in);
    }
    free(b.nodes);
    free(out);
    for (int i = 0; i < b.n_capt; i++)
      nb_release(b.capt[i]);
    free(b.capt);
    if (p && p->refcount)
      nbi_program_release(p);
    else
      free(p);
    return st;
  }
  *prog = p;
  *capt = b.capt;
  *n_capt = b.n_capt;
  return NB_OK;
}

nb_status nbi_apply_begin(nbi_apply *a, const char *fn, const nbi_program *p,
                          nb_tensor *const *in) {
  *a = (nbi_apply){.fn = fn, .p = p, .in = in};
  for (int k = 0; k < p->n_in; k++) {
    if (!in[k]) return nbi_error(NB_ERR_NULL, "%s: input %d is NULL", fn, k);
    if (in[k]->dtype != p->in_dtype[k] || !nbi_shape_eq(&in[k]->shape, &p->in_shape[k])) {
      char x[160], y[160];
      return nbi_error(NB_ERR_SHAPE, "%s: input %d is %s %s but the traced program takes %s %s", fn,
                       k, nb_dtype_name(in[k]->dtype), nb_shape_str(in[k]->shape, x, sizeof x),
                       nb_dtype_name(p->in_dtype[k]), nb_shape_str(p->in_shape[k], y, sizeof y));
    }
  }
  /* outs is made when a pack's apply rule first gives outputs (shard_map:
   * rare), so an ordinary replay allocates one array */
  if (!(a->t = calloc((size_t)p->n_nodes + 1, sizeof *a->t)))
    return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  return NB_OK;
}

nb_tensor *nbi_apply_ref(const nbi_apply *a, int32_t r) { return r >= 0 ? a->t[r] : a->in[-1 - r]; }

nb_status nbi_apply_node(nbi_apply *a, int i) {
  const nbi_prog_node *pn = &a->p->nodes[i];
  const nbi_op_def *def = nbi_op_table[pn->op];
  if (pn->op == NBI_OP_TUPLE_GET && pn->in[0] >= 0 && a->outs && a->outs[pn->in[0]]) {
    a->t[i] = a->outs[pn->in[0]][pn->attrs.i[0]];
    return NB_OK;
  }
  nb_tensor *ins_local[8],
      **ins = pn->n_in <= 8 ? ins_local : malloc(sizeof *ins * (size_t)pn->n_in);
  if (!ins) return nbi_error(NB_ERR_OOM, "%s: out of memory", a->fn);
  for (int k = 0; k < pn->n_in; k++)
    ins[k] = nbi_apply_ref(a, pn->in[k]);
  nb_status st = NB_OK;
  if (def->apply && (def->flags & NBI_OPF_MULTI)) {
    int n_out = ((const nbi_multi *)pn->payload)->n_out;
    if (!a->outs && !(a->outs = calloc((size_t)a->p->n_nodes + 1, sizeof *a->outs)))
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", a->fn);
    else if (!(a->outs[i] = calloc((size_t)n_out + 1, sizeof **a->outs)))
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", a->fn);
    if (!st) st = def->apply(pn, ins, a->outs[i]);
    a->t[i] = NULL; /* only its gets are used */
  } else if (def->apply) {
    st = def->apply(pn, ins, &a->t[i]);
  } else if (!(a->t[i] = nbi_record(pn->op, pn->dtype, &pn->shape, ins, pn->n_in, &pn->attrs))) {
    st = nb_last_status();
  } else {
    nbi_set_payload(a->t[i], pn->payload);
  }
  if (ins != ins_local) free(ins);
  return st;
}

void nbi_apply_end(nbi_apply *a) {
  for (int i = 0; a->outs && i < a->p->n_nodes; i++)
    free(a->outs[i]);
  free(a->outs);
  free(a->t);
  a->outs = NULL, a->t = NULL;
}

nb_status nbi_apply_all(nbi_apply *a, nb_status (*node)(void *ctx, nbi_apply *a, int i), void *ctx,
                        nb_tensor **out) {
  const nbi_program *p = a->p;
  nb_status st = NB_OK;
  nb_scope_begin();
  for (int i = 0; i < p->n_nodes && !st; i++)
    st = node ? node(ctx, a, i) : nbi_apply_node(a, i);
  for (int j = 0; j < p->n_out && !st; j++) {
    int32_t r = p->out[j];
    out[j] = r >= 0 ? a->t[r] : nbi_identity(a->in[-1 - r]);
    if (!out[j]) st = nb_last_status();
  }
  for (int j = 0; j < p->n_out && !st; j++) /* kept or, out of memory, released with the scope */
    if (!nb_keep(out[j])) st = nb_last_status();
  nb_scope_end();
  if (st)
    for (int j = 0; j < p->n_out; j++)
      out[j] = NULL;
  nbi_apply_end(a);
  return st;
}

nb_status nbi_program_apply(const char *fn, const nbi_program *p, nb_tensor *const *in,
                            nb_tensor **out) {
  for (int j = 0; j < p->n_out; j++)
    out[j] = NULL;
  if (nbi_shard_hook.apply_program)
    for (int k = 0; k < p->n_in; k++)
      if (in[k] && in[k]->mesh) return nbi_shard_hook.apply_program(fn, p, in, out);
  nbi_apply a;
  nb_status st = nbi_apply_begin(&a, fn, p, in);
  return st ? st : nbi_apply_all(&a, NULL, NULL, out);
}

nb_status nbi_program_run(const char *fn, const nbi_program *p, nb_tensor *const *in,
                          nb_tensor **out) {
  nb_tensor *local[16], **leaf = p->n_in <= 16 ? local : malloc(sizeof *leaf * (size_t)p->n_in);
  if (!leaf) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  nb_status st = NB_OK;
  for (int j = 0; j < p->n_out; j++)
    out[j] = NULL;
  nb_scope_begin();
  for (int k = 0; k < p->n_in && !st; k++)
    if (!(leaf[k] = nbi_leaf_share(in[k]))) st = nb_last_status();
  if (!st) st = nbi_program_apply(fn, p, leaf, out);
  if (!st) st = nbi_realize(out, p->n_out);
  for (int j = 0; j < p->n_out && !st; j++)
    nb_retain(out[j]); /* the caller's reference, past the scope */
  nb_scope_end();
  if (st)
    for (int j = 0; j < p->n_out; j++)
      out[j] = NULL;
  if (leaf != local) free(leaf);
  return st;
}
