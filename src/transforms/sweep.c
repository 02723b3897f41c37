/* src/transforms/sweep.c — collecting the nodes between outputs and sources,
 * and running the VJP rules backward or the JVP rules forward over them.
 * The rules (in each op's record, src/ops) build new nodes with public ops, so
 * a sweep's result is again an ordinary graph: sweeps of sweeps give higher
 * derivatives. Node indices live in nb_tensor.aux while a sweep is alive. */
#include "transforms.h"

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
    if (root->aux >= 0 || !member(s, root)) continue;
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
        if (c->aux >= 0 || c->aux == -2 || !member(s, c)) continue;
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
          if (t->in[k]->aux >= 0 && (s->kind[t->in[k]->aux] & DEP)) kind = DEP;
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

static int index_of(const nbi_sweep *s, const nb_tensor *t) {
  return t->aux >= 0 && t->aux < s->n && s->nodes[t->aux] == t ? t->aux : -1;
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

nb_status nbi_sweep_reverse(nbi_sweep *s, nb_tensor *const *ys, nb_tensor *const *gys, int n_y,
                            nb_tensor **gxs) {
  nb_tensor **ct = calloc((size_t)s->n + 1, sizeof *ct);
  if (!ct) return nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
  nb_status st = NB_OK;
  for (int r = 0; r < n_y; r++) {
    int i = index_of(s, ys[r]);
    if (i >= 0 && (s->kind[i] & DEP) && gys[r]) ct[i] = nbi_add_maybe(ct[i], gys[r]);
  }
  for (int i = s->n - 1; i >= 0 && !st; i--) {
    nb_tensor *t = s->nodes[i];
    if (!ct[i] || stops(s, i)) continue;
    const nbi_op_def *def = nbi_op_table[t->op];
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
    if ((st = def->vjp(t, ct[i], need, gin))) goto next;
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
  return st;
}

nb_status nbi_sweep_forward(nbi_sweep *s, nb_tensor *const *txs, nb_tensor *const *ys, int n_y,
                            nb_tensor **tys) {
  nb_tensor **tan = calloc((size_t)s->n + 1, sizeof *tan);
  if (!tan) return nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
  nb_status st = NB_OK;
  for (int j = 0; j < s->n_sources; j++) {
    int i = index_of(s, s->sources[j]);
    if (i >= 0 && txs[j]) tan[i] = txs[j];
  }
  for (int i = 0; i < s->n && !st; i++) {
    nb_tensor *t = s->nodes[i];
    if (stops(s, i)) continue;
    const nbi_op_def *def = nbi_op_table[t->op];
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
        tan[i] = def->jvp(t, tin);
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
  return st;
}
