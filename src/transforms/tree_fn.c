/* src/transforms/tree_fn.c — functions of trees and their transforms.
 *
 * A function of trees is an nb_fn whose body is tree_entry and whose user
 * state is a tnode: a user's tree body (T_BODY) or a transform of another
 * function of trees (T_GRAD, T_VAG, T_JIT, T_VMAP, T_CHECKPOINT). The public
 * transforms (autodiff.c, jit.c, vmap.c, checkpoint.c) hand such an f to the
 * constructors here.
 *
 * Transforms work on tensors, so a tree function runs as its flat form for
 * the arrangement of its inputs (a treedef: the names and dtypes of every
 * input tree's leaves, in order): an ordinary nb_fn of the leaves. The flat
 * form of a T_BODY rebuilds the trees from the leaves, calls the body and
 * flattens what it returns; its output arrangement is learnt once by
 * tracing the body on placeholders. The flat form of a transform node is the
 * same transform of its inner node's flat form (nb_grad with every
 * floating-point leaf of the argnum trees listed, nb_jit, nb_vmap with one
 * axis per leaf, nb_checkpoint). Each node caches its flat forms per input
 * arrangement (FLAT_CACHE, least recently used out), so a jitted tree
 * function keeps its programs across calls.
 *
 * Calls within the folder: autodiff.c, jit.c, vmap.c and checkpoint.c call
 * the constructors here for a function of trees; this file calls their
 * public constructors only with flat functions (nbi_grad_flat for
 * gradients), so no call goes round.
 */
#include "tree.h"

#include <stdlib.h>
#include <string.h>

#include "../ops/rule_util.h"

enum { FLAT_CACHE = 8 };

/* ---- treedefs: the names and dtypes of a list of trees' leaves --------------------------- */
typedef struct treedef {
  int n_trees;
  int *start; /* [n_trees + 1]: tree k's leaves are [start[k], start[k + 1]) */
  char **names;
  nb_dtype *dtypes;
  uint64_t hash;
} treedef;

static int td_leaves(const treedef *d) { return d->start[d->n_trees]; }

static void td_free(treedef *d) {
  for (int i = 0; d->names && i < td_leaves(d); i++)
    free(d->names[i]);
  free(d->names);
  free(d->dtypes);
  free(d->start);
  *d = (treedef){0};
}

static nb_status td_alloc(const char *fn, treedef *d, int n_trees, int n_leaves) {
  *d = (treedef){.n_trees = n_trees};
  d->start = calloc((size_t)n_trees + 1, sizeof *d->start);
  d->names = calloc((size_t)n_leaves + 1, sizeof *d->names);
  d->dtypes = calloc((size_t)n_leaves + 1, sizeof *d->dtypes);
  if (d->start && d->names && d->dtypes) return NB_OK;
  free(d->start), free(d->names), free(d->dtypes);
  *d = (treedef){0};
  return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
}

static void td_hash(treedef *d) {
  uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)d->n_trees;
  for (int k = 0; k <= d->n_trees; k++)
    h = (h ^ (uint64_t)d->start[k]) * 0x100000001b3ull;
  for (int i = 0; i < td_leaves(d); i++) {
    for (const char *s = d->names[i]; *s; s++)
      h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    h = (h ^ (uint64_t)(d->dtypes[i] + 256)) * 0x100000001b3ull;
  }
  d->hash = h;
}

/* The arrangement of trees[0..n-1]; trees[k] == NULL counts as empty. */
static nb_status td_of(const char *fn, nb_tree *const *trees, int n, treedef *d) {
  int total = 0;
  for (int k = 0; k < n; k++)
    total += trees[k] ? trees[k]->n : 0;
  nb_status st = td_alloc(fn, d, n, total);
  for (int k = 0, i = 0; k < n && !st; k++) {
    d->start[k] = i;
    for (int j = 0; trees[k] && j < trees[k]->n && !st; j++, i++) {
      d->dtypes[i] = trees[k]->ts[j]->dtype;
      if (!(d->names[i] = strdup(trees[k]->names[j])))
        st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    }
    d->start[k + 1] = i;
  }
  if (st)
    td_free(d);
  else
    td_hash(d);
  return st;
}

/* dst = the trees sel[0..n_sel-1] of a, then (when b) every tree of b. */
static nb_status td_pick(const char *fn, const treedef *a, const int *sel, int n_sel,
                         const treedef *b, treedef *dst) {
  int n_trees = n_sel + (b ? b->n_trees : 0), total = b ? td_leaves(b) : 0;
  for (int s = 0; s < n_sel; s++)
    total += a->start[sel[s] + 1] - a->start[sel[s]];
  nb_status st = td_alloc(fn, dst, n_trees, total);
  int i = 0;
  for (int k = 0; k < n_trees && !st; k++) {
    const treedef *src = k < (b ? b->n_trees : 0) ? b : a;
    int tk = src == b ? k : sel[k - (b ? b->n_trees : 0)];
    dst->start[k] = i;
    for (int j = src->start[tk]; j < src->start[tk + 1] && !st; j++, i++) {
      dst->dtypes[i] = src->dtypes[j];
      if (!(dst->names[i] = strdup(src->names[j])))
        st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    }
  }
  if (!st) dst->start[n_trees] = i;
  if (st)
    td_free(dst);
  else
    td_hash(dst);
  return st;
}

static bool td_eq(const treedef *a, const treedef *b) {
  if (a->hash != b->hash || a->n_trees != b->n_trees) return false;
  for (int k = 0; k <= a->n_trees; k++)
    if (a->start[k] != b->start[k]) return false;
  for (int i = 0; i < td_leaves(a); i++)
    if (a->dtypes[i] != b->dtypes[i] || strcmp(a->names[i], b->names[i])) return false;
  return true;
}

/* Whether trees[0..n-1] have arrangement d. */
static bool td_matches(const treedef *d, nb_tree *const *trees, int n) {
  if (d->n_trees != n) return false;
  for (int k = 0; k < n; k++) {
    if (!trees[k] || trees[k]->n != d->start[k + 1] - d->start[k]) return false;
    for (int j = 0; j < trees[k]->n; j++) {
      int i = d->start[k] + j;
      if (trees[k]->ts[j]->dtype != d->dtypes[i] || strcmp(trees[k]->names[j], d->names[i]))
        return false;
    }
  }
  return true;
}

/* Builds d's trees with the tensors xs (one per leaf) into out[0..n_trees-1]
 * (new trees; on failure all NULL). */
static nb_status td_build(const char *fn, const treedef *d, nb_tensor *const *xs, nb_tree **out) {
  nb_status st = NB_OK;
  for (int k = 0; k < d->n_trees; k++)
    out[k] = NULL;
  for (int k = 0; k < d->n_trees && !st; k++) {
    if (!(out[k] = nb_tree_create())) st = nb_last_status();
    for (int i = d->start[k]; i < d->start[k + 1] && !st; i++)
      st = nbi_tree_push(fn, out[k], d->names[i], xs[i]);
  }
  for (int k = 0; k < d->n_trees && st; k++) {
    nb_tree_release(out[k]);
    out[k] = NULL;
  }
  return st;
}

/* ---- nodes ----------------------------------------------------------------------------------- */
enum tkind { T_BODY, T_GRAD, T_VAG, T_JIT, T_VMAP, T_CHECKPOINT };

typedef struct flat_entry {
  treedef in, out; /* in.names == NULL: an empty slot */
  nb_fn *flat;
  uint64_t used;
} flat_entry;

typedef struct tnode {
  enum tkind kind;
  const char *name; /* the public constructor, for messages */
  int n_in, n_out;  /* trees */
  nb_tree_body body;
  void *user;
  nb_fn *inner; /* transforms: the function of trees transformed (retained) */
  int n_arg;
  int *arg;                /* T_GRAD / T_VAG: tree argnums, normalized */
  int *in_axes, *out_axes; /* T_VMAP: one per tree */
  flat_entry cache[FLAT_CACHE];
  uint64_t clock;
} tnode;

static void entry_clear(flat_entry *e) {
  td_free(&e->in);
  td_free(&e->out);
  nb_fn_release(e->flat);
  *e = (flat_entry){0};
}

static void tnode_destroy(void *p) {
  tnode *t = p;
  for (int i = 0; i < FLAT_CACHE; i++)
    entry_clear(&t->cache[i]);
  nb_fn_release(t->inner);
  free(t->arg);
  free(t->in_axes);
  free(t->out_axes);
  free(t);
}

/* The body of a function of trees as an nb_fn: never run (nb_call refuses
 * such an f before reading its inputs); an error if some path reaches it. */
static nb_status tree_entry(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)user, (void)in, (void)n_in, (void)out, (void)n_out;
  return nbi_error(NB_ERR_ARG, "nb_call: f takes trees; call it with nb_call_trees");
}

bool nbi_fn_is_tree(const nb_fn *f) { return f && f->takes_trees; }
bool nb_fn_takes_trees(const nb_fn *f) { return nbi_fn_is_tree(f); }

static nb_fn *node_make(tnode *t) {
  nb_fn *f = nbi_fn_make(t->name, tree_entry, t, tnode_destroy, t->n_in, t->n_out);
  if (f) f->takes_trees = true;
  return f;
}

nb_fn *nb_fn_create_trees(nb_tree_body body, void *user, int n_in, int n_out) {
  const char *fn = "nb_fn_create_trees";
  if (!body) {
    nbi_error(NB_ERR_NULL, "%s: body is NULL", fn);
    return NULL;
  }
  if (n_in < 0 || n_out < 1) {
    nbi_error(NB_ERR_ARG, "%s: n_in is %d and n_out %d (need n_in >= 0, n_out >= 1)", fn, n_in,
              n_out);
    return NULL;
  }
  tnode *t = calloc(1, sizeof *t);
  if (!t) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  *t =
      (tnode){.kind = T_BODY, .name = fn, .n_in = n_in, .n_out = n_out, .body = body, .user = user};
  return node_make(t);
}

/* ---- the flat form of a user's body -----------------------------------------------------------
 */
typedef struct flat_body {
  nb_tree_body body;
  void *user;
  treedef in, out;
} flat_body;

static void flat_body_destroy(void *p) {
  flat_body *b = p;
  td_free(&b->in);
  td_free(&b->out);
  free(b);
}

static void release_trees(nb_tree **ts, int n) {
  for (int k = 0; k < n; k++) {
    nb_tree_release(ts[k]);
    ts[k] = NULL;
  }
}

/* Runs body on trees in[0..n_in-1] into out[0..n_out-1], checking that it
 * gave a tree for each; every tensor of the outputs is registered in the
 * current scope too (so it outlives the trees). */
static nb_status run_body(const char *fn, nb_tree_body body, void *user, nb_tree *const *in,
                          int n_in, nb_tree **out, int n_out) {
  for (int k = 0; k < n_out; k++)
    out[k] = NULL;
  nb_status st = body(user, in, n_in, out, n_out);
  for (int k = 0; k < n_out && !st; k++)
    if (!out[k]) {
      st = nb_last_status();
      if (!st) st = nbi_error(NB_ERR_ARG, "%s: the function left output tree %d NULL", fn, k);
    }
  if (st && !nb_last_status()) nbi_error(st, "%s: the function returned %s", fn, nb_status_str(st));
  for (int k = 0; k < n_out && !st; k++)
    for (int i = 0; i < out[k]->n && !st; i++)
      if (!nbi_scope_register(nb_retain(out[k]->ts[i]))) st = nb_last_status();
  if (st) release_trees(out, n_out);
  return st;
}

static nb_status flat_body_run(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  const char *fn = "nb_call_trees";
  flat_body *b = user;
  (void)n_in, (void)n_out;
  int ni = b->in.n_trees, no = b->out.n_trees;
  nb_tree **trees = calloc((size_t)(ni + no) + 1, sizeof *trees), **outs = trees + ni;
  nb_status st = trees ? td_build(fn, &b->in, in, trees)
                       : nbi_error(NB_ERR_OOM,
                                   "%s: out of "
                                   "memory",
                                   fn);
  if (!st) st = run_body(fn, b->body, b->user, trees, ni, outs, no);
  if (!st && !td_matches(&b->out, outs, no))
    st = nbi_error(NB_ERR_ARG,
                   "%s: the function returned trees of other names or dtypes than when it was "
                   "first traced on inputs so arranged (what it returns may depend only on the "
                   "names and dtypes of its inputs)",
                   fn);
  for (int k = 0, i = 0; k < no && !st; k++)
    for (int j = 0; j < outs[k]->n; j++)
      out[i++] = outs[k]->ts[j];
  if (trees) {
    release_trees(trees, ni);
    release_trees(outs, no);
  }
  free(trees);
  return st;
}

/* Learns the output arrangement of body on inputs arranged as in with leaf
 * shapes shapes: the body traced once on placeholders. */
static nb_status discover(const char *fn, const tnode *t, const treedef *in, const nb_shape *shapes,
                          treedef *out) {
  int n = td_leaves(in);
  nb_tensor **xs = calloc((size_t)n + 1, sizeof *xs);
  nb_tree **trees = calloc((size_t)(t->n_in + t->n_out) + 1, sizeof *trees), **outs;
  if (!xs || !trees) {
    free(xs), free(trees);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  }
  outs = trees + t->n_in;
  nb_scope_begin();
  nb_status st = NB_OK;
  for (int i = 0; i < n && !st; i++)
    if (!(xs[i] = nbi_placeholder(&shapes[i], in->dtypes[i]))) st = nb_last_status();
  if (!st) st = td_build(fn, in, xs, trees);
  if (!st) {
    nbi_trace_depth++; /* a trace: the seeded generator refuses, as in any */
    st = run_body(fn, t->body, t->user, trees, t->n_in, outs, t->n_out);
    nbi_trace_depth--;
  }
  if (!st) st = td_of(fn, outs, t->n_out, out);
  release_trees(trees, t->n_in);
  release_trees(outs, t->n_out);
  nb_scope_end();
  free(xs);
  free(trees);
  return st;
}

/* ---- flat forms of the nodes --------------------------------------------------------------------
 */
static nb_fn *flat_get(const char *fn, tnode *t, const treedef *in, const nb_shape *shapes,
                       const treedef **out);

static nb_status build_body(const char *fn, tnode *t, const treedef *in, const nb_shape *shapes,
                            flat_entry *e) {
  flat_body *b = calloc(1, sizeof *b);
  if (!b) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  b->body = t->body, b->user = t->user;
  nb_status st = td_pick(fn, in, NULL, 0, in, &b->in);
  if (!st) st = discover(fn, t, in, shapes, &b->out);
  if (!st) st = td_pick(fn, &b->out, NULL, 0, &b->out, &e->out);
  if (st) {
    flat_body_destroy(b);
    return st;
  }
  e->flat =
      nbi_fn_make(fn, flat_body_run, b, flat_body_destroy, td_leaves(&b->in), td_leaves(&b->out));
  return e->flat ? NB_OK : nb_last_status();
}

/* The shapes the inner function of a vmap sees: each mapped leaf without its
 * mapped axis. */
static nb_status vmap_shapes(const char *fn, const tnode *t, const treedef *in,
                             const nb_shape *shapes, nb_shape *inner, int *leaf_axes) {
  for (int k = 0; k < t->n_in; k++)
    for (int i = in->start[k]; i < in->start[k + 1]; i++) {
      int a = t->in_axes ? t->in_axes[k] : 0, nd = shapes[i].ndim;
      inner[i] = shapes[i];
      leaf_axes[i] = a;
      if (a == NB_NOT_MAPPED) continue;
      int p = a < 0 ? a + nd : a;
      if (p < 0 || p >= nd) {
        char b[160];
        return nbi_error(NB_ERR_ARG, "%s: in_axes[%d] = %d is out of range for \"%s\" of shape %s",
                         fn, k, a, in->names[i], nb_shape_str(shapes[i], b, sizeof b));
      }
      for (int d = p; d + 1 < nd; d++)
        inner[i].dims[d] = inner[i].dims[d + 1];
      inner[i].ndim--;
    }
  return NB_OK;
}

static nb_status build_xform(const char *fn, tnode *t, const treedef *in, const nb_shape *shapes,
                             flat_entry *e) {
  tnode *inner = t->inner->user;
  int n = td_leaves(in);
  nb_shape *ishapes = malloc(sizeof *ishapes * (size_t)(n + 1));
  int *ints = malloc(sizeof *ints * (size_t)(n + 1 + td_leaves(in)));
  if (!ishapes || !ints) {
    free(ishapes), free(ints);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  }
  nb_status st = NB_OK;
  if (t->kind == T_VMAP)
    st = vmap_shapes(fn, t, in, shapes, ishapes, ints);
  else
    memcpy(ishapes, shapes, sizeof *shapes * (size_t)n);
  const treedef *iout = NULL;
  nb_fn *g = st ? NULL : flat_get(fn, inner, in, ishapes, &iout);
  if (!st && !g) st = nb_last_status();
  if (!st) switch (t->kind) {
    case T_GRAD:
    case T_VAG: {
      if (td_leaves(iout) == 0 || iout->start[1] == 0) {
        st = nbi_error(NB_ERR_ARG,
                       "%s: the function's first output tree is empty (its first "
                       "tensor is the loss)",
                       fn);
        break;
      }
      int na = 0;
      for (int a = 0; a < t->n_arg; a++)
        for (int i = in->start[t->arg[a]]; i < in->start[t->arg[a] + 1]; i++)
          ints[na++] = i;
      if (na == 0) {
        st = nbi_error(NB_ERR_ARG, "%s: the differentiated trees hold no tensor", fn);
        break;
      }
      e->flat = nbi_grad_flat(fn, g, ints, na, t->kind == T_VAG);
      if (!e->flat) st = nb_last_status();
      if (!st) st = td_pick(fn, in, t->arg, t->n_arg, t->kind == T_VAG ? iout : NULL, &e->out);
      break;
    }
    case T_VMAP: {
      int no = td_leaves(iout);
      int *oaxes = malloc(sizeof *oaxes * (size_t)(no + 1));
      if (!oaxes) {
        st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
        break;
      }
      for (int k = 0; k < iout->n_trees; k++)
        for (int i = iout->start[k]; i < iout->start[k + 1]; i++)
          oaxes[i] = t->out_axes ? t->out_axes[k] : 0;
      e->flat = nb_vmap(g, ints, oaxes);
      free(oaxes);
      if (!e->flat) st = nb_last_status();
      if (!st) st = td_pick(fn, iout, NULL, 0, iout, &e->out);
      break;
    }
    default:
      e->flat = t->kind == T_JIT ? nb_jit(g) : nb_checkpoint(g);
      if (!e->flat) st = nb_last_status();
      if (!st) st = td_pick(fn, iout, NULL, 0, iout, &e->out);
      break;
    }
  free(ishapes);
  free(ints);
  return st;
}

/* t's flat form for inputs arranged as in, with leaf shapes shapes (used
 * only when it is built); *out gets its output arrangement. Borrowed: the
 * cache of t holds it. */
static nb_fn *flat_get(const char *fn, tnode *t, const treedef *in, const nb_shape *shapes,
                       const treedef **out) {
  flat_entry *e = NULL, *victim = &t->cache[0];
  for (int i = 0; i < FLAT_CACHE && !e; i++) {
    if (t->cache[i].flat && td_eq(&t->cache[i].in, in)) e = &t->cache[i];
    if (!t->cache[i].flat || (victim->flat && t->cache[i].used < victim->used))
      victim = &t->cache[i];
  }
  if (!e) {
    flat_entry fresh = {0};
    nb_status st = td_pick(fn, in, NULL, 0, in, &fresh.in);
    if (!st)
      st = t->kind == T_BODY ? build_body(fn, t, in, shapes, &fresh)
                             : build_xform(fn, t, in, shapes, &fresh);
    if (st) {
      entry_clear(&fresh);
      return NULL;
    }
    entry_clear(victim);
    *victim = fresh;
    e = victim;
  }
  e->used = ++t->clock;
  *out = &e->out;
  return e->flat;
}

/* ---- nb_call_trees
 * ----------------------------------------------------------------------------------- */
nb_status nb_call_trees(nb_fn *f, nb_tree *const *in, nb_tree **out) {
  const char *fn = "nb_call_trees";
  if (!f) return nbi_error(NB_ERR_NULL, "%s: f is NULL", fn);
  if (!out) return nbi_error(NB_ERR_NULL, "%s: out is NULL", fn);
  for (int k = 0; k < f->n_out; k++)
    out[k] = NULL;
  if (!nbi_fn_is_tree(f))
    return nbi_error(NB_ERR_ARG, "%s: f takes tensors, not trees; call it with nb_call", fn);
  if (f->n_in > 0 && !in) return nbi_error(NB_ERR_NULL, "%s: in is NULL", fn);
  for (int k = 0; k < f->n_in; k++)
    if (!in[k]) return nbi_error(NB_ERR_NULL, "%s: input tree %d is NULL", fn, k);
  tnode *t = f->user;
  if (t->kind == T_BODY) { /* the body itself, on the caller's trees */
    nb_scope_begin();
    nb_status st = run_body(fn, t->body, t->user, in, t->n_in, out, t->n_out);
    for (int k = 0; k < t->n_out && !st; k++)
      for (int i = 0; i < out[k]->n; i++)
        nb_keep(out[k]->ts[i]);
    nb_scope_end();
    return st;
  }
  treedef d;
  nb_status st = td_of(fn, in, f->n_in, &d);
  if (st) return st;
  int n = td_leaves(&d);
  nb_tensor **xs = calloc((size_t)n + 1, sizeof *xs);
  nb_shape *shapes = calloc((size_t)n + 1, sizeof *shapes);
  if (!xs || !shapes) st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int k = 0, i = 0; k < f->n_in && !st; k++)
    for (int j = 0; j < in[k]->n; j++, i++)
      xs[i] = in[k]->ts[j], shapes[i] = in[k]->ts[j]->shape;
  const treedef *od = NULL;
  nb_fn *g = st ? NULL : flat_get(fn, t, &d, shapes, &od);
  if (!st && !g) st = nb_last_status();
  nb_tensor **ys = st ? NULL : calloc((size_t)g->n_out + 1, sizeof *ys);
  if (!st && !ys) st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  if (!st) st = nb_call(g, xs, ys);
  if (!st) st = td_build(fn, od, ys, out);
  free(ys);
  free(xs);
  free(shapes);
  td_free(&d);
  return st;
}

/* ---- constructors
 * --------------------------------------------------------------------------------- */
static tnode *xform_node(const char *fn, enum tkind kind, nb_fn *f, int n_out) {
  tnode *t = calloc(1, sizeof *t);
  if (!t) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  *t = (tnode){.kind = kind, .name = fn, .n_in = f->n_in, .n_out = n_out, .inner = nb_fn_retain(f)};
  return t;
}

nb_fn *nbi_tree_grad(const char *fn, nb_fn *f, const int *argnums, int n, bool with_value) {
  int n_arg = n < 0 ? f->n_in : n;
  if (n_arg == 0) {
    nbi_error(NB_ERR_ARG, "%s: argnums is empty", fn);
    return NULL;
  }
  tnode *t = xform_node(fn, with_value ? T_VAG : T_GRAD, f, (with_value ? f->n_out : 0) + n_arg);
  if (t && !(t->arg = malloc(sizeof *t->arg * (size_t)n_arg))) {
    tnode_destroy(t);
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  for (int a = 0; t && a < n_arg; a++) {
    int v = n < 0 ? a : argnums[a] < 0 ? argnums[a] + f->n_in : argnums[a];
    bool dup = false;
    for (int b = 0; b < a; b++)
      dup |= t->arg[b] == v;
    if (v < 0 || v >= f->n_in || dup) {
      nbi_error(NB_ERR_ARG, "%s: argnums[%d] = %d is %s (f takes %d trees)", fn, a, argnums[a],
                dup ? "repeated" : "out of range", f->n_in);
      tnode_destroy(t);
      return NULL;
    }
    t->arg[t->n_arg++] = v;
  }
  return t ? node_make(t) : NULL;
}

nb_fn *nbi_tree_jit(nb_fn *f) {
  tnode *t = xform_node("nb_jit", T_JIT, f, f->n_out);
  return t ? node_make(t) : NULL;
}

nb_fn *nbi_tree_checkpoint(nb_fn *f) {
  tnode *t = xform_node("nb_checkpoint", T_CHECKPOINT, f, f->n_out);
  return t ? node_make(t) : NULL;
}

nb_fn *nbi_tree_vmap(nb_fn *f, const int *in_axes, const int *out_axes) {
  const char *fn = "nb_vmap";
  tnode *t = xform_node(fn, T_VMAP, f, f->n_out);
  if (!t) return NULL;
  if (in_axes && !(t->in_axes = malloc(sizeof(int) * (size_t)(f->n_in + 1)))) goto oom;
  if (out_axes && !(t->out_axes = malloc(sizeof(int) * (size_t)(f->n_out + 1)))) goto oom;
  if (in_axes) memcpy(t->in_axes, in_axes, sizeof(int) * (size_t)f->n_in);
  if (out_axes) memcpy(t->out_axes, out_axes, sizeof(int) * (size_t)f->n_out);
  bool mapped = false;
  for (int k = 0; k < f->n_in; k++)
    mapped |= !in_axes || in_axes[k] != NB_NOT_MAPPED;
  if (!mapped) {
    tnode_destroy(t);
    nbi_error(NB_ERR_ARG, "%s: no input tree is mapped (every in_axes entry is NB_NOT_MAPPED)", fn);
    return NULL;
  }
  return node_make(t);
oom:
  tnode_destroy(t);
  nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  return NULL;
}

/* ---- flat forms for other layers (src/autoshard) ------------------------------------------ */
struct nbi_tree_flatfn {
  nb_fn *flat; /* retained */
  treedef in, out;
};

nbi_tree_flatfn *nbi_tree_flatten_fn(const char *fn, nb_fn *f, nb_tree *const *in) {
  if (!nbi_fn_is_tree(f)) {
    nbi_error(NB_ERR_ARG, "%s: f takes tensors, not trees", fn);
    return NULL;
  }
  for (int k = 0; k < f->n_in; k++)
    if (!in || !in[k]) {
      nbi_error(NB_ERR_NULL, "%s: input tree %d is NULL", fn, k);
      return NULL;
    }
  nbi_tree_flatfn *r = calloc(1, sizeof *r);
  if (!r) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  nb_status st = td_of(fn, in, f->n_in, &r->in);
  int n = st ? 0 : td_leaves(&r->in);
  nb_shape *shapes = st ? NULL : calloc((size_t)n + 1, sizeof *shapes);
  if (!st && !shapes) st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int k = 0, i = 0; k < f->n_in && !st; k++)
    for (int j = 0; j < in[k]->n; j++, i++)
      shapes[i] = in[k]->ts[j]->shape;
  const treedef *od = NULL;
  nb_fn *g = st ? NULL : flat_get(fn, f->user, &r->in, shapes, &od);
  if (!st && !g) st = nb_last_status();
  if (!st) st = td_pick(fn, od, NULL, 0, od, &r->out);
  if (!st) r->flat = nb_fn_retain(g);
  free(shapes);
  if (st) {
    nbi_tree_flat_free(r);
    return NULL;
  }
  return r;
}

void nbi_tree_flat_free(nbi_tree_flatfn *t) {
  if (!t) return;
  nb_fn_release(t->flat);
  td_free(&t->in);
  td_free(&t->out);
  free(t);
}

nb_fn *nbi_tree_flat_fn(const nbi_tree_flatfn *t) { return t->flat; }

int nbi_tree_flat_leaf(const nbi_tree_flatfn *t, bool out, int tree, const char *name) {
  const treedef *d = out ? &t->out : &t->in;
  if (!name || tree < 0 || tree >= d->n_trees) return -1;
  for (int i = d->start[tree]; i < d->start[tree + 1]; i++)
    if (!strcmp(d->names[i], name)) return i;
  return -1;
}

nb_status nbi_tree_flat_inputs(const char *fn, const nbi_tree_flatfn *t, nb_tree *const *in,
                               nb_tensor **xs) {
  for (int k = 0; k < t->in.n_trees; k++)
    if (!in || !in[k]) return nbi_error(NB_ERR_NULL, "%s: input tree %d is NULL", fn, k);
  if (!td_matches(&t->in, in, t->in.n_trees))
    return nbi_error(NB_ERR_ARG,
                     "%s: the input trees' names or dtypes differ from the example the plan was "
                     "solved for",
                     fn);
  for (int k = 0, i = 0; k < t->in.n_trees; k++)
    for (int j = 0; j < in[k]->n; j++, i++)
      xs[i] = in[k]->ts[j];
  return NB_OK;
}

nb_status nbi_tree_flat_outputs(const char *fn, const nbi_tree_flatfn *t, nb_tensor *const *ys,
                                nb_tree **out) {
  return td_build(fn, &t->out, ys, out);
}
