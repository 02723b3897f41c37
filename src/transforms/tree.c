/* src/transforms/tree.c — nb_tree: the container (names in order, a hash
 * index over them), its maps and arithmetic, and packs (tree.h: entries that
 * are consecutive parts of one flat tensor, so whole-group computations
 * need no concatenation). */
#include "tree.h"

#include <stdlib.h>
#include <string.h>

#include "../ops/rule_util.h"

enum { NAME_MAX_BYTES = 255 };

/* ---- names and the index ----------------------------------------------------------- */
static uint64_t name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static nb_status check_name(const char *fn, const char *name) {
  if (!name) return nbi_error(NB_ERR_NULL, "%s: name is NULL", fn);
  size_t len = strlen(name);
  if (len == 0 || len > NAME_MAX_BYTES)
    return nbi_error(NB_ERR_ARG, "%s: a name has 1 to %d bytes (got %zu)", fn, NAME_MAX_BYTES, len);
  for (size_t i = 0; i < len; i++)
    if (name[i] == '.' && (i == 0 || i + 1 == len || name[i + 1] == '.'))
      return nbi_error(NB_ERR_ARG,
                       "%s: name \"%s\" has an empty part (dots separate non-empty "
                       "parts)",
                       fn, name);
  return NB_OK;
}

static int slot_of(const nb_tree *t, const char *name) {
  if (!t->n_slot) return -1;
  size_t mask = (size_t)t->n_slot - 1, s = (size_t)name_hash(name) & mask;
  for (; t->slot[s]; s = (s + 1) & mask)
    if (!strcmp(t->names[t->slot[s] - 1], name)) return (int)s;
  return -1 - (int)s; /* the empty slot where it would go */
}

static bool index_rebuild(nb_tree *t, int n_slot) {
  int *slot = calloc((size_t)n_slot, sizeof *slot);
  if (!slot) return false;
  free(t->slot);
  t->slot = slot;
  t->n_slot = n_slot;
  for (int i = 0; i < t->n; i++) {
    int s = slot_of(t, t->names[i]);
    t->slot[-1 - s] = i + 1;
  }
  return true;
}

nb_status nbi_tree_check(const char *fn, const char *what, const nb_tree *t) {
  return t ? NB_OK : nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, what);
}

/* ---- packs ---------------------------------------------------------------------------- */
static void pack_free(nbi_tree_pack *p) {
  nb_release(p->flat);
  for (int k = 0; k < p->n; k++)
    nb_release(p->part[k]);
  free(p->idx);
  free(p->part);
  free(p->off);
  *p = (nbi_tree_pack){0};
}

/* Drops every pack holding entry i (i < 0: all). */
static void packs_drop(nb_tree *t, int i) {
  int m = 0;
  for (int p = 0; p < t->n_packs; p++) {
    bool holds = i < 0;
    for (int k = 0; k < t->packs[p].n && !holds; k++)
      holds = t->packs[p].idx[k] == i;
    if (holds)
      pack_free(&t->packs[p]);
    else
      t->packs[m++] = t->packs[p];
  }
  t->n_packs = m;
}

static bool contiguous(const nb_tensor *x) {
  int64_t s = 1;
  for (int d = x->shape.ndim - 1; d >= 0; d--) {
    if (x->shape.dims[d] != 1 && x->shard0.strides[d] != s) return false;
    s *= x->shape.dims[d];
  }
  return true;
}

/* Part k of p still has the value packed: the entry holds the recorded
 * tensor, either still pending (its graph reads flat) or realized in flat's
 * buffer at its offset. */
static bool part_valid(const nb_tree *t, const nbi_tree_pack *p, int k) {
  const nb_tensor *x = p->part[k], *f = p->flat;
  if (p->idx[k] >= t->n || t->ts[p->idx[k]] != x || x->mesh) return false;
  if (!(x->flags & NBI_T_REALIZED)) return true;
  return (f->flags & NBI_T_REALIZED) && !f->mesh && x->n_shards == 1 &&
         x->shard0.buf == f->shard0.buf && x->shard0.buf && contiguous(x) &&
         x->shard0.offset == f->shard0.offset + p->off[k] * f->shard0.strides[0];
}

/* Frees the packs no longer valid: a stale pack would keep its flat
 * tensor's buffer (a whole group's memory) alive for nothing. A pack is a
 * hint, so dropping one leaves the tree's value as it was. */
static void packs_prune(nb_tree *t) {
  int m = 0;
  for (int p = 0; p < t->n_packs; p++) {
    bool ok = true;
    for (int k = 0; k < t->packs[p].n && ok; k++)
      ok = part_valid(t, &t->packs[p], k);
    if (ok)
      t->packs[m++] = t->packs[p];
    else
      pack_free(&t->packs[p]);
  }
  t->n_packs = m;
}

const nbi_tree_pack *nbi_tree_pack_find(const nb_tree *t, const int *idx, int n) {
  packs_prune((nb_tree *)t);
  for (int p = 0; p < t->n_packs; p++) {
    const nbi_tree_pack *q = &t->packs[p];
    bool ok = q->n == n;
    for (int k = 0; k < n && ok; k++)
      ok = q->idx[k] == idx[k] && part_valid(t, q, k);
    if (ok) return q;
  }
  return NULL;
}

nb_status nbi_tree_pack_add(const char *fn, nb_tree *t, const int *idx, int n, nb_tensor *flat) {
  for (int k = 0; k < n; k++)
    packs_drop(t, idx[k]);
  nbi_tree_pack *grown = realloc(t->packs, sizeof *grown * (size_t)(t->n_packs + 1));
  if (!grown) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  t->packs = grown;
  nbi_tree_pack p = {.n = n};
  p.idx = malloc(sizeof *p.idx * (size_t)n);
  p.part = malloc(sizeof *p.part * (size_t)n);
  p.off = malloc(sizeof *p.off * (size_t)(n + 1));
  if (!p.idx || !p.part || !p.off) {
    free(p.idx), free(p.part), free(p.off);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  }
  p.off[0] = 0;
  for (int k = 0; k < n; k++) {
    p.idx[k] = idx[k];
    p.part[k] = nb_retain(t->ts[idx[k]]);
    p.off[k + 1] = p.off[k] + nbi_numel(&t->ts[idx[k]]->shape);
  }
  p.flat = nb_retain(flat);
  t->packs[t->n_packs++] = p;
  return NB_OK;
}

nb_tensor *nbi_tree_flat(const char *fn, const nb_tree *t, const int *idx, int n) {
  const nbi_tree_pack *p = nbi_tree_pack_find(t, idx, n);
  if (p) return nbi_scope_register(nb_retain(p->flat)); /* NULL + NB_ERR_OOM if it cannot */
  nb_tensor *local[16], **parts = n <= 16 ? local : malloc(sizeof *parts * (size_t)n);
  if (!parts) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  nb_tensor *r = NULL;
  bool ok = true;
  for (int k = 0; k < n && ok; k++)
    ok = (parts[k] = nb_reshape(t->ts[idx[k]], NB_SHAPE(-1))) != NULL;
  if (ok) r = n == 1 ? parts[0] : nb_concat(parts, n, 0);
  if (parts != local) free(parts);
  return r;
}

nb_status nbi_tree_unflat(const char *fn, nb_tree *t, const int *idx, int n, const nb_shape *shapes,
                          nb_tensor *flat) {
  int64_t off = 0;
  for (int k = 0; k < n; k++) {
    int64_t m = nbi_numel(&shapes[k]), start = off, stop = off + m;
    nb_tensor *part = n == 1 ? flat : nb_slice(flat, &start, &stop, NULL);
    part = part ? nb_reshape(part, shapes[k]) : NULL;
    if (!part) return nb_last_status();
    nbi_tree_replace(t, idx[k], part);
    off = stop;
  }
  return n > 1 ? nbi_tree_pack_add(fn, t, idx, n, flat) : NB_OK;
}

nb_status nbi_tree_extra_add(const char *fn, nb_tree *t, nb_tensor *x) {
  nb_tensor **grown = realloc(t->extra, sizeof *grown * (size_t)(t->n_extra + 1));
  if (!grown) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  t->extra = grown;
  t->extra[t->n_extra++] = nb_retain(x);
  return NB_OK;
}

/* ---- the container ----------------------------------------------------------------------- */
nb_tree *nb_tree_create(void) {
  nb_tree *t = calloc(1, sizeof *t);
  if (!t) {
    nbi_error(NB_ERR_OOM, "nb_tree_create: out of memory");
    return NULL;
  }
  t->refcount = 1;
  return t;
}

nb_tree *nb_tree_retain(nb_tree *t) {
  if (t) t->refcount++;
  return t;
}

void nb_tree_release(nb_tree *t) {
  if (!t || --t->refcount > 0) return;
  packs_drop(t, -1);
  free(t->packs);
  for (int i = 0; i < t->n; i++) {
    free(t->names[i]);
    nb_release(t->ts[i]);
  }
  for (int i = 0; i < t->n_extra; i++)
    nb_release(t->extra[i]);
  free(t->extra);
  free(t->names);
  free(t->ts);
  free(t->slot);
  free(t);
}

void nbi_tree_replace(nb_tree *t, int i, nb_tensor *x) {
  packs_drop(t, i);
  nb_retain(x);
  nb_release(t->ts[i]);
  t->ts[i] = x;
}

nb_status nbi_tree_push(const char *fn, nb_tree *t, const char *name, nb_tensor *x) {
  if (t->n == t->cap) {
    int cap = t->cap ? 2 * t->cap : 8;
    char **names = realloc(t->names, sizeof *names * (size_t)cap);
    if (names) t->names = names;
    nb_tensor **ts = names ? realloc(t->ts, sizeof *ts * (size_t)cap) : NULL;
    if (!ts) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    t->ts = ts;
    t->cap = cap;
  }
  if (2 * (t->n + 1) >= t->n_slot && !index_rebuild(t, t->n_slot ? 2 * t->n_slot : 32))
    return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  char *copy = strdup(name);
  if (!copy) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  int s = slot_of(t, name);
  t->names[t->n] = copy;
  t->ts[t->n] = nb_retain(x);
  t->slot[-1 - s] = ++t->n;
  return NB_OK;
}

nb_status nb_tree_set(nb_tree *t, const char *name, nb_tensor *x) {
  const char *fn = "nb_tree_set";
  nb_status st = nbi_tree_check(fn, "the tree", t);
  if (!st) st = check_name(fn, name);
  if (!st && !x) st = nbi_error(NB_ERR_NULL, "%s: the tensor for \"%s\" is NULL", fn, name);
  if (st) return st;
  int s = slot_of(t, name);
  if (s >= 0) {
    nbi_tree_replace(t, t->slot[s] - 1, x);
    return NB_OK;
  }
  return nbi_tree_push(fn, t, name, x);
}

int nb_tree_find(const nb_tree *t, const char *name) {
  if (!t || !name) return -1;
  int s = slot_of(t, name);
  return s >= 0 ? t->slot[s] - 1 : -1;
}

nb_tensor *nb_tree_get(const nb_tree *t, const char *name) {
  if (nbi_tree_check("nb_tree_get", "the tree", t)) return NULL;
  if (!name) {
    nbi_error(NB_ERR_NULL, "nb_tree_get: name is NULL");
    return NULL;
  }
  int i = nb_tree_find(t, name);
  return i >= 0 ? t->ts[i] : NULL;
}

int nb_tree_len(const nb_tree *t) { return t ? t->n : -1; }

static bool check_index(const char *fn, const nb_tree *t, int i) {
  if (nbi_tree_check(fn, "the tree", t)) return false;
  if (i < 0 || i >= t->n) {
    nbi_error(NB_ERR_INDEX, "%s: index %d is out of range (the tree has %d entries)", fn, i, t->n);
    return false;
  }
  return true;
}

const char *nb_tree_name(const nb_tree *t, int i) {
  return check_index("nb_tree_name", t, i) ? t->names[i] : NULL;
}

nb_tensor *nb_tree_at(const nb_tree *t, int i) {
  return check_index("nb_tree_at", t, i) ? t->ts[i] : NULL;
}

nb_status nb_tree_remove(nb_tree *t, const char *name) {
  const char *fn = "nb_tree_remove";
  nb_status st = nbi_tree_check(fn, "the tree", t);
  if (!st && !name) st = nbi_error(NB_ERR_NULL, "%s: name is NULL", fn);
  if (st) return st;
  int i = nb_tree_find(t, name);
  if (i < 0) return nbi_error(NB_ERR_ARG, "%s: the tree has no entry \"%s\"", fn, name);
  packs_drop(t, -1); /* indices shift */
  free(t->names[i]);
  nb_release(t->ts[i]);
  memmove(t->names + i, t->names + i + 1, sizeof *t->names * (size_t)(t->n - i - 1));
  memmove(t->ts + i, t->ts + i + 1, sizeof *t->ts * (size_t)(t->n - i - 1));
  t->n--;
  if (!index_rebuild(t, t->n_slot)) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  return NB_OK;
}

nb_tree *nb_tree_copy(const nb_tree *t) {
  const char *fn = "nb_tree_copy";
  if (nbi_tree_check(fn, "the tree", t)) return NULL;
  nb_tree *c = nb_tree_create();
  for (int i = 0; c && i < t->n; i++)
    if (nbi_tree_push(fn, c, t->names[i], t->ts[i])) {
      nb_tree_release(c);
      return NULL;
    }
  for (int p = 0; c && p < t->n_packs; p++)
    if (nbi_tree_pack_find(t, t->packs[p].idx, t->packs[p].n) &&
        nbi_tree_pack_add(fn, c, t->packs[p].idx, t->packs[p].n, t->packs[p].flat)) {
      nb_tree_release(c);
      return NULL;
    }
  return c;
}

nb_tree *nb_tree_subtree(const nb_tree *t, const char *prefix) {
  const char *fn = "nb_tree_subtree";
  if (nbi_tree_check(fn, "the tree", t)) return NULL;
  size_t len = prefix ? strlen(prefix) : 0;
  nb_tree *c = nb_tree_create();
  for (int i = 0; c && i < t->n; i++) {
    const char *nm = t->names[i];
    if (len && (strncmp(nm, prefix, len) || nm[len] != '.')) continue;
    if (nbi_tree_push(fn, c, len ? nm + len + 1 : nm, t->ts[i])) {
      nb_tree_release(c);
      return NULL;
    }
  }
  return c;
}

nb_status nb_tree_set_tree(nb_tree *t, const char *prefix, const nb_tree *sub) {
  const char *fn = "nb_tree_set_tree";
  nb_status st = nbi_tree_check(fn, "the tree", t);
  if (!st) st = nbi_tree_check(fn, "sub", sub);
  size_t len = prefix ? strlen(prefix) : 0;
  if (!st && len) st = check_name(fn, prefix);
  char name[2 * NAME_MAX_BYTES + 2];
  for (int i = 0; sub && i < sub->n && !st; i++) {
    if (len) snprintf(name, sizeof name, "%s.%s", prefix, sub->names[i]);
    st = nb_tree_set(t, len ? name : sub->names[i], sub->ts[i]);
  }
  return st;
}

nb_status nbi_tree_same_names(const char *fn, const nb_tree *a, const nb_tree *b) {
  for (int i = 0; i < a->n && i < b->n; i++)
    if (strcmp(a->names[i], b->names[i]))
      return nbi_error(NB_ERR_ARG, "%s: the trees differ at entry %d: \"%s\" and \"%s\"", fn, i,
                       a->names[i], b->names[i]);
  if (a->n != b->n)
    return nbi_error(NB_ERR_ARG, "%s: the trees have %d and %d entries", fn, a->n, b->n);
  return NB_OK;
}

bool nb_tree_same_structure(const nb_tree *a, const nb_tree *b, bool check_types) {
  if (!a || !b || a->n != b->n) return false;
  for (int i = 0; i < a->n; i++) {
    if (strcmp(a->names[i], b->names[i])) return false;
    if (check_types &&
        (a->ts[i]->dtype != b->ts[i]->dtype || !nbi_shape_eq(&a->ts[i]->shape, &b->ts[i]->shape)))
      return false;
  }
  return true;
}

int64_t nb_tree_numel(const nb_tree *t) {
  if (!t) return -1;
  int64_t n = 0;
  for (int i = 0; i < t->n; i++)
    n += nbi_numel(&t->ts[i]->shape);
  return n;
}

nb_status nb_tree_eval(nb_tree *const *trees, int n) {
  const char *fn = "nb_tree_eval";
  if (n < 0) return nbi_error(NB_ERR_ARG, "%s: n is %d", fn, n);
  if (n > 0 && !trees) return nbi_error(NB_ERR_NULL, "%s: trees is NULL", fn);
  int total = 0;
  for (int k = 0; k < n; k++) {
    if (!trees[k]) return nbi_error(NB_ERR_NULL, "%s: tree %d is NULL", fn, k);
    total += trees[k]->n + trees[k]->n_extra;
  }
  nb_tensor **all = malloc(sizeof *all * (size_t)(total + 1));
  if (!all) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  int m = 0;
  for (int k = 0; k < n; k++) {
    for (int i = 0; i < trees[k]->n_extra; i++)
      all[m++] = trees[k]->extra[i];
    for (int i = 0; i < trees[k]->n; i++)
      all[m++] = trees[k]->ts[i];
  }
  nb_status st = nb_eval(all, m);
  free(all);
  return st;
}

void nb_tree_fprint(FILE *f, const nb_tree *t) {
  if (!f || !t) return;
  for (int i = 0; i < t->n; i++) {
    char b[160];
    fprintf(f, "%s %s %s\n", t->names[i], nb_dtype_name(t->ts[i]->dtype),
            nb_shape_str(t->ts[i]->shape, b, sizeof b));
  }
}

/* ---- maps ---------------------------------------------------------------------------------- */
static nb_tensor *map_result(const char *fn, const char *name, nb_tensor *r) {
  if (!r && !nb_last_status())
    nbi_error(NB_ERR_ARG, "%s: the callback returned NULL for \"%s\"", fn, name);
  return r;
}

nb_tree *nb_tree_map(const nb_tree *t, nb_tree_map_fn fn_, void *user) {
  const char *fn = "nb_tree_map";
  if (nbi_tree_check(fn, "the tree", t)) return NULL;
  if (!fn_) {
    nbi_error(NB_ERR_NULL, "%s: fn is NULL", fn);
    return NULL;
  }
  nb_tree *r = nb_tree_create();
  for (int i = 0; r && i < t->n; i++) {
    nb_tensor *x = map_result(fn, t->names[i], fn_(user, t->names[i], t->ts[i]));
    if (!x || nbi_tree_push(fn, r, t->names[i], x)) {
      nb_tree_release(r);
      return NULL;
    }
  }
  return r;
}

nb_tree *nb_tree_zip(nb_tree *const *trees, int n, nb_tree_zip_fn fn_, void *user) {
  const char *fn = "nb_tree_zip";
  if (n < 1) {
    nbi_error(NB_ERR_ARG, "%s: n is %d (need at least one tree)", fn, n);
    return NULL;
  }
  if (!trees || !fn_) {
    nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, trees ? "fn" : "trees");
    return NULL;
  }
  for (int k = 0; k < n; k++)
    if (nbi_tree_check(fn, "a tree", trees[k]) ||
        (k && nbi_tree_same_names(fn, trees[0], trees[k])))
      return NULL;
  nb_tensor *local[8], **xs = n <= 8 ? local : malloc(sizeof *xs * (size_t)n);
  nb_tree *r = xs ? nb_tree_create() : NULL;
  if (!xs) nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int i = 0; r && i < trees[0]->n; i++) {
    for (int k = 0; k < n; k++)
      xs[k] = trees[k]->ts[i];
    const char *nm = trees[0]->names[i];
    nb_tensor *x = map_result(fn, nm, fn_(user, nm, xs, n));
    if (!x || nbi_tree_push(fn, r, nm, x)) {
      nb_tree_release(r);
      r = NULL;
    }
  }
  if (xs != local) free(xs);
  return r;
}

/* ---- arithmetic ----------------------------------------------------------------------------- */
static nb_tensor *zeros_of(void *user, const char *name, nb_tensor *x) {
  (void)user, (void)name;
  return nbi_zeros_like(x);
}

nb_tree *nb_tree_zeros_like(const nb_tree *t) {
  if (nbi_tree_check("nb_tree_zeros_like", "the tree", t)) return NULL;
  return nb_tree_map(t, zeros_of, NULL);
}

/* The groups of entries computed as one flat tensor: the entries of x
 * covered by a valid pack of x (an optimizer's update) are one group. */
nb_tree *nb_tree_axpy(double alpha, const nb_tree *x, const nb_tree *y) {
  const char *fn = "nb_tree_axpy";
  if (nbi_tree_check(fn, "x", x) || nbi_tree_check(fn, "y", y) || nbi_tree_same_names(fn, x, y))
    return NULL;
  nb_tree *r = nb_tree_copy(y);
  bool *done = r ? calloc((size_t)x->n + 1, 1) : NULL;
  nb_status st = r && done ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int p = 0; p < x->n_packs && !st; p++) { /* whole groups at once */
    const nbi_tree_pack *q = &x->packs[p];
    if (!nbi_tree_pack_find(x, q->idx, q->n)) continue;
    nb_dtype dt = y->ts[q->idx[0]]->dtype;
    bool same = nb_dtype_is_float(dt);
    nb_shape *shapes = malloc(sizeof *shapes * (size_t)q->n);
    for (int k = 0; k < q->n && same && shapes; k++) {
      const nb_tensor *a = x->ts[q->idx[k]], *b = y->ts[q->idx[k]];
      same = b->dtype == dt && !b->mesh && b->device == y->ts[q->idx[0]]->device &&
             nbi_shape_eq(&a->shape, &b->shape);
      shapes[k] = b->shape;
    }
    if (same && shapes) {
      nb_tensor *yf = nbi_tree_flat(fn, y, q->idx, q->n);
      nb_tensor *xf = yf ? nb_cast(q->flat, dt) : NULL;
      nb_tensor *s = xf ? nb_add(yf, alpha == 1 ? xf : nb_mul_scalar(xf, alpha)) : NULL;
      st = s ? nbi_tree_unflat(fn, r, q->idx, q->n, shapes, s) : nb_last_status();
      for (int k = 0; k < q->n && !st; k++)
        done[q->idx[k]] = true;
    }
    free(shapes);
  }
  for (int i = 0; i < x->n && !st; i++) {
    nb_tensor *a = x->ts[i], *b = y->ts[i];
    if (done[i] || !nb_dtype_is_float(b->dtype)) continue;
    if (!nbi_shape_eq(&a->shape, &b->shape)) {
      char sa[160], sb[160];
      st = nbi_error(NB_ERR_SHAPE, "%s: \"%s\" has shape %s in x and %s in y", fn, x->names[i],
                     nb_shape_str(a->shape, sa, sizeof sa), nb_shape_str(b->shape, sb, sizeof sb));
      break;
    }
    nb_tensor *ax = alpha == 1 ? a : nb_mul_scalar(a, alpha);
    nb_tensor *s = ax ? nb_add(b, nb_cast(ax, b->dtype)) : NULL;
    if (!s)
      st = nb_last_status();
    else
      nbi_tree_replace(r, i, s);
  }
  free(done);
  if (st) {
    nb_tree_release(r);
    return NULL;
  }
  return r;
}

nb_tensor *nb_tree_global_norm(const nb_tree *t) {
  const char *fn = "nb_tree_global_norm";
  if (nbi_tree_check(fn, "the tree", t)) return NULL;
  nb_dtype acc = NB_F32;
  for (int i = 0; i < t->n; i++)
    if (t->ts[i]->dtype == NB_F64) acc = NB_F64;
  nb_tensor *sum = NULL;
  for (int i = 0; i < t->n; i++) {
    nb_tensor *x = t->ts[i];
    if (!nb_dtype_is_float(x->dtype)) continue;
    nb_tensor *s = nb_sum(nb_square(nb_cast(x, acc)), NB_ALL, false);
    sum = sum ? nb_add(sum, s) : s;
    if (!sum) return NULL;
  }
  return sum ? nb_sqrt(sum) : nb_scalar(0, acc);
}
