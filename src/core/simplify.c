/* src/core/simplify.c — the planner's simplification pass: which steps of a
 * realization need not run because another value already is theirs.
 *
 * The pass is a function of the graph's structure (ops, dtypes, shapes,
 * attrs, edges, which nodes are held), so its result is plan data, computed
 * once per structure and cached with the plan (src/core/plan.c). It writes
 *  - alias[i]: the mark of the step (>= 0, earlier than i) or leaf (<= -3)
 *    whose value step i has, or i itself when i computes its own value;
 *  - needed[i]: step i's value is wanted (held, or read by a needed step
 *    that runs). A step runs when it is needed and not aliased; the others
 *    are dead code.
 * What makes an alias (each exact, bit for bit, for every input value):
 *  - common subexpressions: the same op, dtype, shape and attrs on the same
 *    sources (operands of add, mul, eq, ne, and, or in either order);
 *  - no-ops: identity, stop_gradient, reshape / broadcast_to to the source's
 *    own shape, cast to its own dtype, the identity permutation, a full slice,
 *    a zero pad, a flip along dims of size <= 1, a concat of one tensor;
 *  - compositions that are no-ops: a chain of reshapes back to the shape it
 *    started from, a permutation of a permutation composing to the identity,
 *    neg of neg, logical_not of logical_not on bools, and a cast round trip
 *    through a dtype that holds every value of the source (f32 -> f64 -> f32).
 * x * 1 and x + (-0) need the constants' values, which plans do not see (a
 * plan serves every value of its leaves): programs drop those when they are
 * built, and fold subgraphs of trace constants (src/core/program.c). */
#include "nbi.h"
#include "oprules.h"

#include <stdlib.h>

/* On unless NABLA_NO_SIMPLIFY=1 (tests compare both). */
static int simplify = -1;
bool nbi_simplify_enabled(void) {
  if (simplify < 0) {
    const char *e = getenv("NABLA_NO_SIMPLIFY");
    simplify = !(e && e[0] == '1');
  }
  return simplify;
}
void nbi_set_simplify(bool on) { simplify = on; }

typedef struct pass {
  nb_tensor *const *nodes;
  int n;
  int *alias;
  nb_tensor **src; /* [n]: the tensor whose value step i has (nodes[i] or a source) */
  int *table;      /* CSE hash table of computing steps, -1 = empty */
  size_t cap;
} pass;

/* The tensor whose value input x has: a step's source, or x (a leaf). */
static nb_tensor *source(const pass *s, const nb_tensor *x) {
  return x->mark >= 0 ? s->src[x->mark] : (nb_tensor *)x;
}

/* A step that computes (not a leaf): its inputs may be looked through. */
static bool is_step(const nb_tensor *t) { return t->mark >= 0; }

static bool same_type(const nb_tensor *a, const nb_tensor *b) {
  return a->dtype == b->dtype && nbi_shape_eq(&a->shape, &b->shape);
}

/* Every value of dtype a converts to dtype b and back unchanged. */
static bool lossless(nb_dtype a, nb_dtype b) {
  switch (a) {
  case NB_BOOL: return true;
  case NB_F16:
  case NB_BF16: return b == a || b == NB_F32 || b == NB_F64;
  case NB_F32: return b == NB_F32 || b == NB_F64;
  case NB_I32: return b == NB_I32 || b == NB_I64 || b == NB_F64;
  case NB_U8:
  case NB_I8:
    return b == a || b == NB_I16 || b == NB_I32 || b == NB_I64 || b == NB_F32 || b == NB_F64;
  case NB_I16: return b == a || b == NB_I32 || b == NB_I64 || b == NB_F32 || b == NB_F64;
  default: return b == a;
  }
}

/* The source t's value equals when t is a no-op, else NULL. */
static nb_tensor *noop_source(const pass *s, const nb_tensor *t) {
  if (t->n_in < 1) return NULL;
  nb_tensor *x = source(s, t->in[0]);
  const nbi_attrs *a = &t->attrs;
  int nd = t->shape.ndim;
  switch (t->op) {
  case NBI_OP_IDENTITY:
  case NBI_OP_STOP_GRADIENT:
  case NBI_OP_SHARD_CONSTRAINT: /* layouts only: on one device, identities */
  case NBI_OP_SHARD_LIKE:
  case NBI_OP_BROADCAST_TO: return same_type(t, x) ? x : NULL;
  case NBI_OP_CONCAT: return t->n_in == 1 && same_type(t, x) ? x : NULL;
  case NBI_OP_RESHAPE:
    /* reshape(reshape(..(y)..)) reads y's elements in row-major order */
    for (int depth = 0; depth < 16; depth++) {
      if (same_type(t, x)) return x;
      if (!is_step(x) ||
          (x->op != NBI_OP_RESHAPE && x->op != NBI_OP_IDENTITY && x->op != NBI_OP_STOP_GRADIENT))
        return NULL;
      x = source(s, x->in[0]);
    }
    return NULL;
  case NBI_OP_CAST:
    if (same_type(t, x)) return x;
    if (is_step(x) && x->op == NBI_OP_CAST) {
      nb_tensor *y = source(s, x->in[0]);
      if (same_type(t, y) && lossless(y->dtype, x->dtype)) return y;
    }
    return NULL;
  case NBI_OP_PERMUTE: {
    bool id = true;
    for (int d = 0; d < nd; d++)
      id = id && a->i[d] == d;
    if (id) return same_type(t, x) ? x : NULL;
    if (!is_step(x) || x->op != NBI_OP_PERMUTE) return NULL;
    nb_tensor *y = source(s, x->in[0]);
    for (int d = 0; d < nd; d++) /* output dim d reads x's dim a[d], which reads y's */
      if (x->attrs.i[a->i[d]] != d) return NULL;
    return same_type(t, y) ? y : NULL;
  }
  case NBI_OP_SLICE:
    for (int d = 0; d < nd; d++)
      if (a->i[d] != 0 || a->i[NB_MAX_DIMS + d] != 1) return NULL;
    return same_type(t, x) ? x : NULL;
  case NBI_OP_PAD:
    for (int d = 0; d < 2 * nd; d++)
      if (a->i[d] != 0) return NULL;
    return same_type(t, x) ? x : NULL;
  case NBI_OP_FLIP:
    for (int d = 0; d < nd; d++)
      if ((a->i[0] >> d & 1) && t->shape.dims[d] > 1) return NULL;
    return same_type(t, x) ? x : NULL;
  case NBI_OP_NEG:
  case NBI_OP_LOGICAL_NOT:
    if (is_step(x) && x->op == t->op) {
      nb_tensor *y = source(s, x->in[0]);
      bool exact = t->op == NBI_OP_NEG ? x->dtype == t->dtype : y->dtype == NB_BOOL;
      if (exact && same_type(t, y)) return y;
    }
    return NULL;
  default: return NULL;
  }
}

/* Operands that may be swapped without changing a single bit of the result
 * (maximum/minimum are not: they return the first of two NaNs or zeros). */
static bool commutative(int op) { return nbi_op_traits[op] & NBI_TR_COMMUTATIVE; }

/* The marks of t's sources, sorted for commutative ops. */
static void source_marks(const pass *s, const nb_tensor *t, int32_t *m) {
  for (int k = 0; k < t->n_in; k++)
    m[k] = source(s, t->in[k])->mark;
  if (t->n_in == 2 && commutative(t->op) && m[0] > m[1]) {
    int32_t x = m[0];
    m[0] = m[1];
    m[1] = x;
  }
}

static uint64_t cse_hash(const nb_tensor *t, const int32_t *m) {
  uint64_t a = 0x243f6a8885a308d3ull, b = 0x13198a2e03707344ull;
  nbi_hash_mix(&a, &b, (uint64_t)t->op);
  nbi_hash_mix(&a, &b, (uint64_t)t->dtype);
  nbi_hash_mix(&a, &b, (uint64_t)t->shape.ndim);
  for (int d = 0; d < t->shape.ndim; d++)
    nbi_hash_mix(&a, &b, (uint64_t)t->shape.dims[d]);
  for (size_t w = 0; w < sizeof t->attrs / 8; w++) {
    uint64_t v;
    memcpy(&v, (const char *)&t->attrs + 8 * w, 8);
    nbi_hash_mix(&a, &b, v);
  }
  nbi_hash_mix(&a, &b, (uint64_t)t->n_in);
  for (int k = 0; k < t->n_in; k++)
    nbi_hash_mix(&a, &b, (uint64_t)(int64_t)m[k]);
  return a ^ b;
}

static bool cse_equal(const pass *s, const nb_tensor *t, const int32_t *m, const nb_tensor *u) {
  if (u->op != t->op || u->n_in != t->n_in || !same_type(t, u) ||
      memcmp(&u->attrs, &t->attrs, sizeof t->attrs) != 0)
    return false;
  int32_t local[8], *mu = u->n_in <= 8 ? local : malloc(sizeof *mu * (size_t)u->n_in);
  if (!mu) return false;
  source_marks(s, u, mu);
  bool eq = memcmp(mu, m, sizeof *m * (size_t)t->n_in) == 0;
  if (mu != local) free(mu);
  return eq;
}

/* CSE: an earlier computing step with t's op, type, attrs and sources, or -1
 * after recording step i as the first of its kind. */
static int cse(pass *s, int i) {
  const nb_tensor *t = s->nodes[i];
  if (t->op == NBI_OP_CUSTOM || t->n_in == 0 || !s->table) return -1; /* user code may be impure */
  int32_t local[8], *m = t->n_in <= 8 ? local : malloc(sizeof *m * (size_t)t->n_in);
  if (!m) return -1;
  source_marks(s, t, m);
  size_t mask = s->cap - 1, h = (size_t)cse_hash(t, m) & mask;
  int found = -1;
  while (s->table[h] >= 0) {
    if (cse_equal(s, t, m, s->nodes[s->table[h]])) {
      found = s->table[h];
      break;
    }
    h = (h + 1) & mask;
  }
  if (found < 0) s->table[h] = i;
  if (m != local) free(m);
  return found;
}

void nbi_simplify_plan(nb_tensor *const *nodes, int n, const bool *held, int *alias, bool *needed) {
  pass s = {.nodes = nodes, .n = n, .alias = alias};
  for (int i = 0; i < n; i++) {
    alias[i] = i;
    needed[i] = held[i];
  }
  if (nbi_simplify_enabled() && n > 0) {
    s.src = malloc(sizeof *s.src * (size_t)n);
    s.cap = 64;
    while (s.cap < 2 * (size_t)n)
      s.cap *= 2;
    s.table = malloc(sizeof *s.table * s.cap);
    if (s.table)
      for (size_t h = 0; h < s.cap; h++)
        s.table[h] = -1;
  }
  if (s.src) /* without memory the plan simply computes every step */
    for (int i = 0; i < n; i++) {
      nb_tensor *t = nodes[i], *x = noop_source(&s, t);
      int j = x ? x->mark : cse(&s, i);
      alias[i] = x || j >= 0 ? j : i;
      s.src[i] = alias[i] == i ? t : x ? x : s.src[j];
    }
  /* Dead code: walk back from the held steps through what runs. */
  for (int i = n - 1; i >= 0; i--) {
    if (!needed[i]) continue;
    if (alias[i] != i) {
      if (alias[i] >= 0) needed[alias[i]] = true;
      continue;
    }
    const nb_tensor *t = nodes[i];
    for (int k = 0; k < t->n_in; k++) {
      int c = t->in[k]->mark;
      if (c >= 0 && alias[c] >= 0) needed[alias[c]] = true; /* else a leaf's value */
    }
  }
  free(s.src);
  free(s.table);
}
