/* src/transforms/sweep.c — collecting the nodes between outputs and sources,
 * and running the VJP rules backward or the JVP rules forward over them.
 * The rules (in each op's record, src/ops) build new nodes with public ops, so
 * a sweep's result is again an ordinary graph: sweeps of sweeps give higher
 * derivatives. Node indices live in nb_tensor.aux while a sweep is alive. */
#include "transforms.h"
#include "../core/oprules.h"
#include "../core/program.h"

#include "../ops/rule_util.h"

#include <stdlib.h>

static bool grow(void **arr, int *cap, int need, size_t elem) {
  if (need <= *cap) return true;
  int nc = *cap ? *cap : 64;
  while (nc < need)
    nc *= 2;
  void *na = realloc(*arr, (size_t)nc * elem);
  if (!na) return false;
  *arr = na;
  *cap = nc;
  return true;
}

/* aux encoding: -1 idle, -2 on the DFS stack, >= 0 index into nodes.
 * Functional sources are pre-marked -3 - j until reached. */
enum { DEP = 1, SOURCE = 2 }; /* bits of kind[i] */

/* Whether the walk continues into t's inputs. */
static bool descend(const nbi_sweep *s, const nb_tensor *t) {
  if (s->imperative) return (t->flags & NBI_T_GRAD_PATH) && !(t->flags & NBI_T_REQUIRES_GRAD);
  return t->seq >= s->seq0 && t->aux > -3;
}

/* Whether t belongs to the sweep at all (else it is a constant to it). */
static bool member(const nbi_sweep *s, const nb_tensor *t) {
  if (s->imperative) return t->flags & (NBI_T_GRAD_PATH | NBI_T_REQUIRES_GRAD);
  return t->seq >= s->seq0;
}

/* t's index in this sweep, or -1. aux alone is not enough: sweeps nest (a
 * jacobian batches a derivative graph while its own sweep is alive), and a
 * node of the enclosing sweep carries that sweep's index. */
static int index_of(const nbi_sweep *s, const nb_tensor *t) {
  return t->aux >= 0 && t->aux < s->n && s->nodes[t->aux] == t ? t->aux : -1;
}

static nb_status add_node(nbi_sweep *s, nb_tensor *t, uint8_t kind) {
  if (!grow((void **)&s->nodes, &s->cap, s->n + 1, sizeof *s->nodes)) goto oom;
  uint8_t *nk = realloc(s->kind, (size_t)s->cap);
  if (!nk) goto oom;
  s->kind = nk;
  s->kind[s->n] = kind;
  t->aux = s->n;
  s->nodes[s->n++] = t;
  return NB_OK;
oom:
  return nbi_error(NB_ERR_OOM, "%s: out of memory collecting the graph", s->fn);
}

nb_status nbi_sweep_collect(nbi_sweep *s, nb_tensor *const *ys, int n_y, nb_tensor *const *xs,
                            int n_x) {
  nb_status st = NB_OK;
  if (!s->imperative) {
    if (!grow((void **)&s->sources, &s->cap_sources, n_x + 1, sizeof *s->sources))
      return nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
    for (int j = 0; j < n_x; j++) {
      s->sources[j] = xs[j];
      if (xs[j]->aux == -1) xs[j]->aux = -3 - j;
    }
    s->n_sources = n_x;
  }
  nb_tensor **stack = NULL;
  int *next = NULL, n = 0, cap = 0, cap_next = 0;
  for (int r = 0; r < n_y && !st; r++) {
    nb_tensor *root = ys[r];
    if (index_of(s, root) >= 0 || !member(s, root)) continue;
    if (!grow((void **)&stack, &cap, n + 1, sizeof *stack) ||
        !grow((void **)&next, &cap_next, n + 1, sizeof *next)) {
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
      break;
    }
    stack[n] = root;
    next[n++] = 0;
    while (n && !st) {
      nb_tensor *t = stack[n - 1];
      bool leaf = !descend(s, t);
      if (!leaf && s->imperative && (t->flags & NBI_T_GRAD_FREED)) {
        st = nbi_error(NB_ERR_STATE,
                       "%s: the graph was already freed by an earlier nb_backward (each forward "
                       "pass supports one backward)",
                       s->fn);
        break;
      }
      if (!leaf && next[n - 1] < t->n_in) {
        nb_tensor *c = t->in[next[n - 1]++];
        if (!member(s, c) || c->aux == -2 || index_of(s, c) >= 0) continue;
        if (!grow((void **)&stack, &cap, n + 1, sizeof *stack) ||
            !grow((void **)&next, &cap_next, n + 1, sizeof *next)) {
          st = nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
          break;
        }
        if (c->aux == -1) c->aux = -2; /* sources keep their -3 - j until added */
        stack[n] = c;
        next[n++] = 0;
        continue;
      }
      /* post-order: t's inputs are all placed */
      uint8_t kind = 0;
      if (leaf) {
        if (s->imperative) {
          if (t->flags & NBI_T_REQUIRES_GRAD) {
            kind = DEP | SOURCE;
            if (!grow((void **)&s->sources, &s->cap_sources, s->n_sources + 1, sizeof *s->sources))
              st = nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
            else
              s->sources[s->n_sources++] = t;
          }
        } else if (t->aux <= -3) {
          kind = DEP | SOURCE;
        }
      } else {
        for (int k = 0; k < t->n_in; k++)
          if (index_of(s, t->in[k]) >= 0 && (s->kind[t->in[k]->aux] & DEP)) kind = DEP;
      }
      if (!st) st = add_node(s, t, kind);
      n--;
    }
  }
  for (int i = 0; i < n; i++)
    if (stack[i]->aux == -2) stack[i]->aux = -1;
  free(stack);
  free(next);
  return st;
}

void nbi_sweep_free(nbi_sweep *s) {
  for (int i = 0; i < s->n; i++)
    s->nodes[i]->aux = -1;
  for (int j = 0; j < s->n_sources; j++)
    s->sources[j]->aux = -1;
  free(s->nodes);
  free(s->kind);
  free(s->sources);
  *s = (nbi_sweep){0};
}

/* Sources and nodes the walk did not enter are leaves: their value is given. */
static bool stops(const nbi_sweep *s, int i) {
  return (s->kind[i] & SOURCE) || !(s->kind[i] & DEP);
}

static nb_status check_like(const nbi_sweep *s, const char *what, const nb_tensor *g,
                            const nb_tensor *x, int op) {
  if (nbi_shape_eq(&g->shape, &x->shape) && g->dtype == x->dtype) return NB_OK;
  char a[160], b[160];
  return nbi_error(NB_ERR_INTERNAL, "%s: the %s rule of %s gave %s %s for a %s %s value", s->fn,
                   what, nbi_op_table[op]->name, nb_dtype_name(g->dtype),
                   nb_shape_str(g->shape, a, sizeof a), nb_dtype_name(x->dtype),
                   nb_shape_str(x->shape, b, sizeof b));
}

/* ---- multi-output packs --------------------------------------------------------------
 * A pack and its TUPLE_GET nodes act as one op: per pack (by node index) one
 * value per output, gathered from the gets (reverse) or handed to them
 * (forward, vmap). */
nb_status nbi_multi_vals_slot(const nbi_sweep *s, nbi_multi_vals *mv, int i, int n_out) {
  if (!mv->v && !(mv->v = calloc((size_t)s->n + 1, sizeof *mv->v)))
    return nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
  if (!mv->v[i] && !(mv->v[i] = calloc((size_t)n_out + 1, sizeof **mv->v)))
    return nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
  return NB_OK;
}

void nbi_multi_vals_free(const nbi_sweep *s, nbi_multi_vals *mv) {
  if (mv->v)
    for (int i = 0; i < s->n; i++)
      free(mv->v[i]);
  free(mv->v);
  mv->v = NULL;
}

static nb_status multi_add(const nbi_sweep *s, nbi_multi_vals *mv, int p, const nb_tensor *pack,
                           int j, nb_tensor *g) {
  nb_status st = nbi_multi_vals_slot(s, mv, p, nbi_multi_of(pack)->n_out);
  if (!st && !(mv->v[p][j] = nbi_add_maybe(mv->v[p][j], g))) st = nb_last_status();
  return st;
}

nb_status nbi_multi_check(const char *fn, const char *what, const nb_tensor *p, nb_tensor *const *v,
                          int64_t B) {
  const nbi_multi *m = nbi_multi_of(p);
  for (int j = 0; j < m->n_out; j++) {
    if (!v[j]) continue;
    nb_shape want = m->shape[j];
    if (B >= 0) {
      want.ndim++;
      memmove(want.dims + 1, want.dims, sizeof(int64_t) * (size_t)(want.ndim - 1));
      want.dims[0] = B;
    }
    if (nbi_shape_eq(&v[j]->shape, &want) && v[j]->dtype == m->dtype[j]) continue;
    char a[160], b[160];
    return nbi_error(NB_ERR_INTERNAL, "%s: the %s rule of %s gave %s %s for output %d, %s %s", fn,
                     what, nbi_op_table[p->op]->name, nb_dtype_name(v[j]->dtype),
                     nb_shape_str(v[j]->shape, a, sizeof a), j, nb_dtype_name(m->dtype[j]),
                     nb_shape_str(want, b, sizeof b));
  }
  return NB_OK;
}

static nb_status multi_vjp(const nbi_sweep *s, nb_tensor *t, nb_tensor *const *gys,
                           nb_tensor **ct) {
  const nbi_op_def *def = nbi_op_table[t->op];
  bool *need = calloc((size_t)t->n_in + 1, 1);
  nb_tensor **gin = calloc((size_t)t->n_in + 1, sizeof *gin);
  nb_status st = need && gin ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
  bool any = false;
  for (int k = 0; k < t->n_in && !st; k++) {
    int j = index_of(s, t->in[k]);
    need[k] = j >= 0 && (s->kind[j] & DEP) && nb_dtype_is_float(t->in[k]->dtype);
    any |= need[k];
  }
  if (!st && any) {
    if (!def->vjp_multi)
      st = nbi_error(NB_ERR_INTERNAL, "%s: op %s has no VJP rule", s->fn, def->name);
    else {
      int tok = nbi_device_push(t->device);
      st = def->vjp_multi(t, gys, need, gin);
      nbi_device_pop(tok);
    }
  }
  for (int k = 0; k < t->n_in && !st && any; k++) {
    if (!need[k] || !gin[k]) continue;
    if ((st = check_like(s, "VJP", gin[k], t->in[k], t->op))) break;
    int j = index_of(s, t->in[k]);
    if (!(ct[j] = nbi_add_maybe(ct[j], gin[k]))) st = nb_last_status();
  }
  free(need);
  free(gin);
  return st;
}

static nb_status multi_jvp(const nbi_sweep *s, nbi_multi_vals *mv, int i, nb_tensor *t,
                           nb_tensor **tan) {
  const nbi_op_def *def = nbi_op_table[t->op];
  nb_tensor **tin = calloc((size_t)t->n_in + 1, sizeof *tin);
  if (!tin) return nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
  bool any = false;
  for (int k = 0; k < t->n_in; k++) {
    int j = index_of(s, t->in[k]);
    tin[k] = j >= 0 && nb_dtype_is_float(t->in[k]->dtype) ? tan[j] : NULL;
    any |= tin[k] != NULL;
  }
  nb_status st = NB_OK;
  if (any) {
    if (!def->jvp_multi)
      st = nbi_error(NB_ERR_INTERNAL, "%s: op %s has no JVP rule", s->fn, def->name);
    else if (!(st = nbi_multi_vals_slot(s, mv, i, nbi_multi_of(t)->n_out))) {
      int tok = nbi_device_push(t->device);
      st = def->jvp_multi(t, tin, mv->v[i]);
      nbi_device_pop(tok);
    }
    if (!st) st = nbi_multi_check(s->fn, "JVP", t, mv->v[i], -1);
  }
  free(tin);
  return st;
}

nb_status nbi_sweep_reverse(nbi_sweep *s, nb_tensor *const *ys, nb_tensor *const *gys, int n_y,
                            nb_tensor **gxs) {
  nb_tensor **ct = calloc((size_t)s->n + 1, sizeof *ct);
  if (!ct) return nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
  nb_status st = NB_OK;
  nbi_multi_vals mv = {0};
  for (int r = 0; r < n_y; r++) {
    int i = index_of(s, ys[r]);
    if (i >= 0 && (s->kind[i] & DEP) && gys[r]) ct[i] = nbi_add_maybe(ct[i], gys[r]);
  }
  for (int i = s->n - 1; i >= 0 && !st; i--) {
    nb_tensor *t = s->nodes[i];
    if (stops(s, i)) continue;
    const nbi_op_def *def = nbi_op_table[t->op];
    if (t->op == NBI_OP_TUPLE_GET) { /* hand the cotangent to the pack's slot */
      int p = index_of(s, t->in[0]);
      if (ct[i] && p >= 0 && (s->kind[p] & DEP))
        st = multi_add(s, &mv, p, t->in[0], (int)t->attrs.i[0], ct[i]);
      continue;
    }
    if (def->flags & NBI_OPF_MULTI) {
      if (mv.v && mv.v[i]) st = multi_vjp(s, t, mv.v[i], ct);
      continue;
    }
    if (!ct[i]) continue;
    if (def->flags & NBI_OPF_NONDIFF) continue;
    bool need_local[4], *need = t->n_in <= 4 ? need_local : calloc((size_t)t->n_in, 1);
    nb_tensor *gin_local[4],
        **gin = t->n_in <= 4 ? gin_local : calloc((size_t)t->n_in, sizeof *gin);
    if (!need || !gin) {
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
      goto next;
    }
    bool any = false;
    for (int k = 0; k < t->n_in; k++) {
      int j = index_of(s, t->in[k]);
      need[k] = j >= 0 && (s->kind[j] & DEP) && nb_dtype_is_float(t->in[k]->dtype);
      gin[k] = NULL;
      any |= need[k];
    }
    if (!any) goto next;
    if (!def->vjp) {
      st = nbi_error(NB_ERR_INTERNAL, "%s: op %s has no VJP rule", s->fn, def->name);
      goto next;
    }
    int tok = nbi_device_push(t->device);
    st = def->vjp(t, ct[i], need, gin);
    nbi_device_pop(tok);
    if (st) goto next;
    for (int k = 0; k < t->n_in && !st; k++) {
      if (!need[k] || !gin[k]) continue;
      if ((st = check_like(s, "VJP", gin[k], t->in[k], t->op))) break;
      int j = index_of(s, t->in[k]);
      if (!(ct[j] = nbi_add_maybe(ct[j], gin[k]))) st = nb_last_status();
    }
  next:
    if (need != need_local) free(need);
    if (gin != gin_local) free(gin);
  }
  for (int j = 0; j < s->n_sources; j++) {
    int i = index_of(s, s->sources[j]);
    gxs[j] = !st && i >= 0 ? ct[i] : NULL;
  }
  free(ct);
  nbi_multi_vals_free(s, &mv);
  return st;
}

nb_status nbi_sweep_forward(nbi_sweep *s, nb_tensor *const *txs, nb_tensor *const *ys, int n_y,
                            nb_tensor **tys) {
  nb_tensor **tan = calloc((size_t)s->n + 1, sizeof *tan);
  if (!tan) return nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
  nb_status st = NB_OK;
  nbi_multi_vals mv = {0};
  for (int j = 0; j < s->n_sources; j++) {
    int i = index_of(s, s->sources[j]);
    if (i >= 0 && txs[j]) tan[i] = txs[j];
  }
  for (int i = 0; i < s->n && !st; i++) {
    nb_tensor *t = s->nodes[i];
    if (stops(s, i)) continue;
    const nbi_op_def *def = nbi_op_table[t->op];
    if (t->op == NBI_OP_TUPLE_GET) { /* take the tangent from the pack's slot */
      int p = index_of(s, t->in[0]);
      if (p >= 0 && mv.v && mv.v[p] && nb_dtype_is_float(t->dtype)) tan[i] = mv.v[p][t->attrs.i[0]];
      continue;
    }
    if (def->flags & NBI_OPF_MULTI) {
      st = multi_jvp(s, &mv, i, t, tan);
      continue;
    }
    if ((def->flags & NBI_OPF_NONDIFF) || !nb_dtype_is_float(t->dtype)) continue;
    nb_tensor *tin_local[4],
        **tin = t->n_in <= 4 ? tin_local : calloc((size_t)t->n_in, sizeof *tin);
    if (!tin) {
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
      break;
    }
    bool any = false;
    for (int k = 0; k < t->n_in; k++) {
      int j = index_of(s, t->in[k]);
      tin[k] = j >= 0 && nb_dtype_is_float(t->in[k]->dtype) ? tan[j] : NULL;
      any |= tin[k] != NULL;
    }
    if (any) {
      if (!def->jvp) {
        st = nbi_error(NB_ERR_INTERNAL, "%s: op %s has no JVP rule", s->fn, def->name);
      } else {
        nb_status before = nb_last_status();
        int tok = nbi_device_push(t->device);
        tan[i] = def->jvp(t, tin);
        nbi_device_pop(tok);
        if (!tan[i] && !before && nb_last_status()) st = nb_last_status();
        if (tan[i]) st = check_like(s, "JVP", tan[i], t, t->op);
      }
    }
    if (tin != tin_local) free(tin);
  }
  for (int r = 0; r < n_y; r++) {
    int i = index_of(s, ys[r]);
    tys[r] = !st && i >= 0 ? tan[i] : NULL;
  }
  free(tan);
  nbi_multi_vals_free(s, &mv);
  return st;
}

/* ---- batching (vmap) -------------------------------------------------------------------- */
/* t's batching rule, run with t's device as the device of the constants it makes. */
static nb_tensor *vmap_on_device(const nbi_op_def *def, nb_tensor *t, nb_tensor *const *bin,
                                 const bool *bat, int64_t B) {
  int tok = nbi_device_push(t->device);
  nb_tensor *r = def->vmap(t, bin, bat, B);
  nbi_device_pop(tok);
  return r;
}

static nb_status check_batched(const char *fn, const nb_tensor *b, const nb_tensor *y, int64_t B) {
  nb_shape want = {.ndim = y->shape.ndim + 1, .dims = {B}};
  memcpy(want.dims + 1, y->shape.dims, sizeof(int64_t) * (size_t)y->shape.ndim);
  if (nbi_shape_eq(&b->shape, &want) && b->dtype == y->dtype) return NB_OK;
  char a[160], c[160];
  return nbi_error(NB_ERR_INTERNAL, "%s: the batching rule of %s gave %s %s for a %s %s value", fn,
                   nbi_op_table[y->op]->name, nb_dtype_name(b->dtype),
                   nb_shape_str(b->shape, a, sizeof a), nb_dtype_name(y->dtype),
                   nb_shape_str(want, c, sizeof c));
}

/* A batched value has one dim more than t's (every output's, for a multi-output
 * node): NB_ERR_SHAPE when that exceeds NB_MAX_DIMS (the rules assume room). */
static nb_status check_batchable(const char *fn, const nb_tensor *t) {
  const nbi_multi *m = nbi_op_table[t->op]->flags & NBI_OPF_MULTI ? nbi_multi_of(t) : NULL;
  for (int j = 0; j < (m ? m->n_out : 1); j++) {
    int nd = m ? m->shape[j].ndim : t->shape.ndim;
    if (nd >= NB_MAX_DIMS)
      return nbi_error(NB_ERR_SHAPE,
                       "%s: a batched value would have rank %d (the maximum is %d): batching %s, "
                       "whose result has rank %d",
                       fn, nd + 1, NB_MAX_DIMS, nbi_op_table[t->op]->name, nd);
  }
  return NB_OK;
}

nb_status nbi_vmap_graph(const char *fn, nb_tensor *const *ys, int n_y, nb_tensor *const *srcs,
                         nb_tensor *const *bsrc, int n_src, int64_t B, uint64_t seq0,
                         nb_tensor **bys) {
  nbi_sweep s = {.fn = fn, .seq0 = seq0};
  nbi_multi_vals mv = {0};
  nb_tensor **val = NULL;
  nb_status st = nbi_sweep_collect(&s, ys, n_y, srcs, n_src);
  if (!st && !(val = calloc((size_t)s.n + 1, sizeof *val)))
    st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int j = 0; j < n_src && !st; j++) {
    int i = index_of(&s, srcs[j]);
    if (i >= 0) val[i] = bsrc[j];
  }
  for (int i = 0; i < s.n && !st; i++) {
    nb_tensor *t = s.nodes[i];
    if (stops(&s, i)) continue;
    const nbi_op_def *def = nbi_op_table[t->op];
    if (t->op == NBI_OP_TUPLE_GET) {
      int p = index_of(&s, t->in[0]);
      val[i] = p >= 0 && mv.v && mv.v[p] ? mv.v[p][t->attrs.i[0]] : NULL;
      if (!val[i])
        st = nbi_error(NB_ERR_INTERNAL, "%s: output %d of %s was not batched", fn,
                       (int)t->attrs.i[0], nbi_op_table[t->in[0]->op]->name);
      continue;
    }
    nb_tensor *bin_local[4],
        **bin = t->n_in <= 4 ? bin_local : calloc((size_t)t->n_in, sizeof *bin);
    bool bat_local[4], *bat = t->n_in <= 4 ? bat_local : calloc((size_t)t->n_in, 1);
    if (!bin || !bat) {
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    } else if (!(st = check_batchable(fn, t))) {
      for (int k = 0; k < t->n_in; k++) {
        int j = index_of(&s, t->in[k]);
        bat[k] = j >= 0 && val[j];
        bin[k] = bat[k] ? val[j] : t->in[k];
      }
      if (def->flags & NBI_OPF_MULTI) {
        if (!def->vmap_multi)
          st = nbi_error(NB_ERR_INTERNAL, "%s: op %s has no batching rule", fn, def->name);
        else if (!(st = nbi_multi_vals_slot(&s, &mv, i, nbi_multi_of(t)->n_out))) {
          int tok = nbi_device_push(t->device);
          st = def->vmap_multi(t, bin, bat, B, mv.v[i]);
          nbi_device_pop(tok);
        }
        for (int j = 0; j < nbi_multi_of(t)->n_out && !st; j++)
          if (!mv.v[i][j])
            st = nbi_error(NB_ERR_INTERNAL, "%s: the batching rule of %s left output %d", fn,
                           def->name, j);
        if (!st) st = nbi_multi_check(fn, "batching", t, mv.v[i], B);
      } else if (!def->vmap) {
        st = nbi_error(NB_ERR_INTERNAL, "%s: op %s has no batching rule", fn, def->name);
      } else if (!(val[i] = vmap_on_device(def, t, bin, bat, B))) {
        st = nb_last_status();
        if (!st)
          st = nbi_error(NB_ERR_INTERNAL, "%s: the batching rule of %s failed", fn, def->name);
      } else {
        st = check_batched(fn, val[i], t, B);
      }
    }
    if (bin != bin_local) free(bin);
    if (bat != bat_local) free(bat);
  }
  for (int r = 0; r < n_y; r++) {
    int i = index_of(&s, ys[r]);
    bys[r] = !st && i >= 0 ? val[i] : NULL;
  }
  free(val);
  nbi_multi_vals_free(&s, &mv);
  nbi_sweep_free(&s);
  return st;
}
