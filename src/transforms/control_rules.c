/* src/transforms/control_rules.c — the derivative (VJP, JVP) and batching rules
 * of cond, while and scan, and the argument adapters they (and nb_fori_loop)
 * build functions with. See control.c for the packs' layout. */
#include "control.h"

#include "../ops/rule_util.h"

#include <stdlib.h>

/* ---- adapters (control.h) ---------------------------------------------------------- */
static void adapt_destroy(void *p) {
  adapt *a = p;
  if (!a) return;
  nb_fn_release(a->f);
  for (int i = 0; i < a->n_held; i++)
    nb_release(a->held[i]);
  free(a->in);
  free(a->out);
  free(a->held);
  free(a);
}

/* Takes over the caller's reference to f (NULL: an error is recorded). */
adapt *nbi_ctl_adapt_new(const char *fn, nb_fn *f, int cap_out, int cap_held) {
  if (!f) return NULL;
  adapt *a = calloc(1, sizeof *a);
  if (a) {
    *a = (adapt){.f = f, .cap_out = cap_out, .cap_held = cap_held};
    a->in = calloc((size_t)f->n_in + 1, sizeof *a->in);
    a->out = calloc((size_t)cap_out + 1, sizeof *a->out);
    a->held = calloc((size_t)cap_held + 1, sizeof *a->held);
  }
  if (!a || !a->in || !a->out || !a->held) {
    if (a)
      adapt_destroy(a);
    else
      nb_fn_release(f);
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  for (int k = 0; k < f->n_in; k++)
    a->in[k].kind = -1;
  return a;
}

static int a_hold(adapt *a, nb_tensor *t) {
  if (!t || a->n_held == a->cap_held) {
    a->bad = true;
    return 0;
  }
  a->held[a->n_held] = nb_retain(t);
  return a->n_held++;
}

void nbi_ctl_a_in(adapt *a, int k, int outer) { a->in[k] = (asrc){A_ARG, outer, -1}; }
static void a_in_held(adapt *a, int k, nb_tensor *t) {
  a->in[k] = (asrc){A_HELD, a_hold(a, t), -1};
}
void nbi_ctl_a_out(adapt *a, int kind, int idx, int plus) {
  if (a->n_out == a->cap_out)
    a->bad = true;
  else
    a->out[a->n_out++] = (asrc){kind, idx, plus};
}

static nb_status adapt_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_in;
  const adapt *a = user;
  nb_status st = NB_OK;
  nb_tensor **x = nbi_ctl_xcalloc("nb_call", (size_t)(a->f->n_in + a->f->n_out), sizeof *x, &st);
  if (st) return st;
  nb_tensor **y = x + a->f->n_in;
  for (int k = 0; k < a->f->n_in; k++)
    x[k] = a->in[k].kind == A_ARG ? in[a->in[k].idx] : a->held[a->in[k].idx];
  st = nb_call(a->f, x, y);
  for (int j = 0; j < n_out && !st; j++) {
    asrc o = a->out[j];
    nb_tensor *v = o.kind == A_OUT ? y[o.idx] : o.kind == A_ARG ? in[o.idx] : a->held[o.idx];
    if (o.plus >= 0) v = nb_add(v, in[o.plus]);
    if (!(out[j] = v)) st = nb_last_status();
  }
  free(x);
  return st;
}

/* The adapter as an nb_fn of n_in inputs (consumes a). */
nb_fn *nbi_ctl_adapt_fn(const char *fn, adapt *a, int n_in) {
  if (!a) return NULL;
  bool unset = false;
  for (int k = 0; k < a->f->n_in; k++)
    unset |= a->in[k].kind < 0;
  if (a->bad || unset || a->n_out == 0) {
    if (!nb_last_status())
      nbi_error(NB_ERR_INTERNAL, "%s: an adapter was built inconsistently", fn);
    adapt_destroy(a);
    return NULL;
  }
  return nbi_fn_make(fn, adapt_body, a, adapt_destroy, n_in, a->n_out);
}

/* Program P as a function (NBI_XF_PLAIN), or its nb_vjp_fn / nb_jvp_fn. */
static nb_fn *prog_fn(const char *fn, nbi_program *P, int kind) {
  return nbi_program_xform(fn, P, kind, NULL, NULL, 0);
}

/* nb_vmap(f) mapping axis 0 of the batched inputs (consumes f); f itself
 * when no input is batched. */
static nb_fn *vmapped(nb_fn *f, const bool *batched) {
  if (!f) return NULL;
  bool any = false;
  int local[16], *ax = f->n_in <= 16 ? local : malloc(sizeof *ax * (size_t)f->n_in);
  if (!ax) {
    nb_fn_release(f);
    nbi_error(NB_ERR_OOM, "nb_vmap: out of memory");
    return NULL;
  }
  for (int k = 0; k < f->n_in; k++)
    ax[k] = batched[k] ? 0 : NB_NOT_MAPPED, any |= batched[k];
  nb_fn *v = any ? nb_vmap(f, ax, NULL) : nb_fn_retain(f);
  nb_fn_release(f);
  if (ax != local) free(ax);
  return v;
}

/* ---- cond rules ----------------------------------------------------------------------------
 * The rules run a new cond on the same pred whose branches are the transformed
 * branches. Its operands: every operand of the primal pack but pred (ops, then
 * captures, else captures), then the given tangents / cotangents. A branch
 * reads its own ops and captures; the other branch's captures get zero
 * cotangents from it. */
nb_status nbi_ctl_cond_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin) {
  const char *fn = "nb_cond";
  const ctl *c = ctl_of(p);
  int no = c->m.n_out, nops = c->n_ops, nb = p->n_in - 1, n = nb, n_res = 0;
  nb_status st = NB_OK;
  nb_tensor **ops = nbi_ctl_xcalloc(fn, (size_t)(nb + no), sizeof *ops, &st);
  nb_tensor **res = nbi_ctl_xcalloc(fn, (size_t)p->n_in, sizeof *res, &st);
  int *gpos = nbi_ctl_xcalloc(fn, (size_t)no, sizeof *gpos, &st);
  nb_fn *br[2] = {NULL, NULL};
  if (st) goto done;
  nbi_ctl_put(ops, p->in + 1, nb);
  for (int j = 0; j < no; j++)
    if (gys[j]) gpos[j] = n, ops[n++] = gys[j];
  for (int k = 1; k < p->n_in; k++)
    n_res += need[k];
  for (int b = 0; b < 2 && !st; b++) {
    /* vjp of branch b: (ops, captures, cotangents) -> (outputs, g ops, g captures) */
    int base = nbi_ctl_capt_base(p, b) - 1, nt = c->n_capt[b];
    adapt *a = nbi_ctl_adapt_new(fn, prog_fn(fn, c->prog[b], NBI_XF_VJP), n_res, no + p->n_in);
    if (!a) {
      st = nb_last_status();
      break;
    }
    for (int k = 0; k < nops; k++)
      nbi_ctl_a_in(a, k, k);
    for (int i = 0; i < nt; i++)
      nbi_ctl_a_in(a, nops + i, base + i);
    for (int j = 0; j < no; j++) {
      if (gys[j])
        nbi_ctl_a_in(a, nops + nt + j, gpos[j]);
      else
        a_in_held(a, nops + nt + j, nbi_zeros_of(&c->m.shape[j], c->m.dtype[j]));
    }
    for (int k = 1; k < p->n_in; k++) {
      if (!need[k]) continue;
      int o = k - 1; /* operand index */
      if (o < nops)
        nbi_ctl_a_out(a, A_OUT, no + o, -1);
      else if (o >= base && o < base + nt)
        nbi_ctl_a_out(a, A_OUT, no + nops + (o - base), -1);
      else
        nbi_ctl_a_out(a, A_HELD, a_hold(a, nbi_zeros_like(p->in[k])), -1);
    }
    if (!(br[b] = nbi_ctl_adapt_fn(fn, a, n))) st = nb_last_status();
  }
  if (!st) st = nb_cond(p->in[0], br[0], br[1], ops, n, res);
  for (int k = 1, r = 0; k < p->n_in && !st; k++)
    if (need[k]) gin[k] = res[r++];
done:
  nb_fn_release(br[0]);
  nb_fn_release(br[1]);
  free(ops);
  free(res);
  free(gpos);
  return st;
}

nb_status nbi_ctl_cond_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts) {
  const char *fn = "nb_cond";
  const ctl *c = ctl_of(p);
  int no = c->m.n_out, nops = c->n_ops, nb = p->n_in - 1, n = nb, n_res = 0;
  nb_status st = NB_OK;
  nb_tensor **ops = nbi_ctl_xcalloc(fn, (size_t)(2 * nb), sizeof *ops, &st);
  nb_tensor **res = nbi_ctl_xcalloc(fn, (size_t)no, sizeof *res, &st);
  int *tpos = nbi_ctl_xcalloc(fn, (size_t)nb, sizeof *tpos, &st);
  nb_fn *br[2] = {NULL, NULL};
  if (st) goto done;
  nbi_ctl_put(ops, p->in + 1, nb);
  for (int o = 0; o < nb; o++)
    if (tin[1 + o]) tpos[o] = n, ops[n++] = tin[1 + o];
  for (int j = 0; j < no; j++)
    n_res += nb_dtype_is_float(c->m.dtype[j]);
  if (!n_res) goto done; /* only integer outputs: no tangents */
  for (int b = 0; b < 2 && !st; b++) {
    /* jvp of branch b: (ops, captures, their tangents) -> (outputs, tangents) */
    int base = nbi_ctl_capt_base(p, b) - 1, nt = c->n_capt[b], ni = nops + nt;
    adapt *a = nbi_ctl_adapt_new(fn, prog_fn(fn, c->prog[b], NBI_XF_JVP), n_res, ni);
    if (!a) {
      st = nb_last_status();
      break;
    }
    for (int i = 0; i < ni; i++) {
      int o = i < nops ? i : base + (i - nops);
      nbi_ctl_a_in(a, i, o);
      if (tin[1 + o])
        nbi_ctl_a_in(a, ni + i, tpos[o]);
      else
        a_in_held(a, ni + i, nbi_zeros_like(p->in[1 + o]));
    }
    for (int j = 0; j < no; j++)
      if (nb_dtype_is_float(c->m.dtype[j])) nbi_ctl_a_out(a, A_OUT, no + j, -1);
    if (!(br[b] = nbi_ctl_adapt_fn(fn, a, n))) st = nb_last_status();
  }
  if (!st) st = nb_cond(p->in[0], br[0], br[1], ops, n, res);
  for (int j = 0, r = 0; j < no && !st; j++)
    if (nb_dtype_is_float(c->m.dtype[j])) touts[j] = res[r++];
done:
  nb_fn_release(br[0]);
  nb_fn_release(br[1]);
  free(ops);
  free(res);
  free(tpos);
  return st;
}

/* Unbatched pred: a cond of the vmapped branches. Batched pred: both vmapped
 * branches run on the whole batch and each example selects its branch's
 * outputs (nb_where), as jax.vmap of lax.cond. */
nb_status nbi_ctl_cond_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                            nb_tensor **outs) {
  const char *fn = "nb_cond";
  const ctl *c = ctl_of(p);
  int no = c->m.n_out, nops = c->n_ops, nb = p->n_in - 1;
  nb_status st = NB_OK;
  nb_tensor **r = nbi_ctl_xcalloc(fn, (size_t)(2 * no), sizeof *r, &st);
  nb_fn *br[2] = {NULL, NULL};
  for (int b = 0; b < 2 && !st; b++) {
    /* branch b over every operand, vmapped over the batched ones */
    int base = nbi_ctl_capt_base(p, b) - 1, nt = c->n_capt[b];
    adapt *a = nbi_ctl_adapt_new(fn, prog_fn(fn, c->prog[b], NBI_XF_PLAIN), no, 0);
    if (!a) {
      st = nb_last_status();
      break;
    }
    for (int i = 0; i < nops + nt; i++)
      nbi_ctl_a_in(a, i, i < nops ? i : base + (i - nops));
    for (int j = 0; j < no; j++)
      nbi_ctl_a_out(a, A_OUT, j, -1);
    if (!(br[b] = vmapped(nbi_ctl_adapt_fn(fn, a, nb), batched + 1))) st = nb_last_status();
  }
  if (!st && !batched[0]) {
    st = nb_cond(bin[0], br[0], br[1], bin + 1, nb, outs);
  } else if (!st) {
    st = nb_call(br[0], bin + 1, r);
    if (!st) st = nb_call(br[1], bin + 1, r + no);
    for (int j = 0; j < no && !st; j++) {
      nb_tensor *m = nbi_ctl_mask_for(bin[0], B, c->m.shape[j].ndim);
      if (!(outs[j] = nb_where(m, r[j], r[no + j]))) st = nb_last_status();
    }
  }
  nb_fn_release(br[0]);
  nb_fn_release(br[1]);
  free(r);
  return st;
}

/* ---- while rules ---------------------------------------------------------------------------- */
nb_status nbi_ctl_while_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need,
                            nb_tensor **gin) {
  (void)p, (void)gys, (void)need, (void)gin;
  return nbi_error(NB_ERR_ARG, "nb_while_loop: reverse-mode differentiation needs a static trip "
                               "count; use nb_fori_loop or nb_scan");
}

/* A while over (carries, tangents of the float carries): the same cond, and
 * nb_jvp_fn of the body. */
nb_status nbi_ctl_while_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts) {
  const char *fn = "nb_while_loop";
  const ctl *c = ctl_of(p);
  int n = c->n_ops, ncc = c->n_capt[0], ncb = c->n_capt[1], nf = 0;
  int cb0 = nbi_ctl_capt_base(p, 1);
  nb_status st = NB_OK;
  int *fc = nbi_ctl_xcalloc(fn, (size_t)n, sizeof *fc, &st); /* float carries */
  nb_tensor **init = nbi_ctl_xcalloc(fn, (size_t)(2 * n), sizeof *init, &st);
  nb_tensor **res = nbi_ctl_xcalloc(fn, (size_t)(2 * n), sizeof *res, &st);
  nb_fn *cf = NULL, *bf = NULL;
  if (st) goto done;
  for (int k = 0; k < n; k++)
    if (nb_dtype_is_float(p->in[k]->dtype)) fc[nf++] = k;
  if (!nf) goto done;
  nbi_ctl_put(init, p->in, n);
  for (int f = 0; f < nf && !st; f++)
    if (!(init[n + f] = tin[fc[f]] ? tin[fc[f]] : nbi_zeros_like(p->in[fc[f]])))
      st = nb_last_status();
  /* cond: (carries, tangents) -> cond(carries, captures) */
  adapt *a = st ? NULL : nbi_ctl_adapt_new(fn, prog_fn(fn, c->prog[0], NBI_XF_PLAIN), 1, ncc);
  if (a) {
    for (int k = 0; k < n; k++)
      nbi_ctl_a_in(a, k, k);
    for (int i = 0; i < ncc; i++)
      a_in_held(a, n + i, p->in[n + i]);
    nbi_ctl_a_out(a, A_OUT, 0, -1);
  }
  if (!st && !(cf = nbi_ctl_adapt_fn(fn, a, n + nf))) st = nb_last_status();
  /* body: jvp of body over (carries, captures; their tangents) */
  int ni = n + ncb;
  a = st ? NULL : nbi_ctl_adapt_new(fn, prog_fn(fn, c->prog[1], NBI_XF_JVP), n + nf, 2 * ni);
  if (a) {
    for (int k = 0; k < n; k++) {
      nbi_ctl_a_in(a, k, k);
      if (!nb_dtype_is_float(p->in[k]->dtype)) /* integer carries: zero (co)tangents */
        a_in_held(a, ni + k, nbi_zeros_like(p->in[k]));
    }
    for (int f = 0; f < nf; f++)
      nbi_ctl_a_in(a, ni + fc[f], n + f);
    for (int i = 0; i < ncb; i++) {
      nb_tensor *x = p->in[cb0 + i];
      a_in_held(a, n + i, x);
      a_in_held(a, ni + n + i, tin[cb0 + i] ? tin[cb0 + i] : nbi_zeros_like(x));
    }
    for (int k = 0; k < n; k++)
      nbi_ctl_a_out(a, A_OUT, k, -1);
    for (int f = 0; f < nf; f++)
      nbi_ctl_a_out(a, A_OUT, n + fc[f], -1);
  }
  if (!st && !(bf = nbi_ctl_adapt_fn(fn, a, n + nf))) st = nb_last_status();
  if (!st) st = nb_while_loop(cf, bf, init, n + nf, res);
  for (int f = 0; f < nf && !st; f++)
    touts[fc[f]] = res[n + f];
done:
  nb_fn_release(cf);
  nb_fn_release(bf);
  free(fc);
  free(init);
  free(res);
  return st;
}

/* Batched while: every carry is batched; the loop runs while any example's
 * predicate holds, and an example whose predicate is false keeps its carry
 * (body' = where(vmap(cond)(c), vmap(body)(c), c)). Captures enter the
 * vmapped functions as explicit inputs, batched or not. */
typedef struct wvm {
  int refs; /* shared by the cond and the body function */
  nb_fn *vcond, *vbody;
  nb_tensor **cc, **cb; /* captures of cond and body (batched values or not) */
  int n, ncc, ncb;
  int64_t B;
} wvm;

static void wvm_destroy(void *p) {
  wvm *w = p;
  if (--w->refs > 0) return;
  nb_fn_release(w->vcond);
  nb_fn_release(w->vbody);
  for (int i = 0; i < w->ncc && w->cc; i++)
    nb_release(w->cc[i]);
  for (int i = 0; i < w->ncb && w->cb; i++)
    nb_release(w->cb[i]);
  free(w->cc);
  free(w->cb);
  free(w);
}

/* vmap(cond)(c): the batched predicate (B, 1..). */
static nb_tensor *wvm_pred(const wvm *w, nb_tensor *const *c) {
  nb_status st = NB_OK;
  nb_tensor **x = nbi_ctl_xcalloc("nb_while_loop", (size_t)(w->n + w->ncc), sizeof *x, &st),
            *m = NULL;
  if (st) return NULL;
  nbi_ctl_put(x, c, w->n);
  nbi_ctl_put(x + w->n, w->cc, w->ncc);
  if (nb_call(w->vcond, x, &m)) m = NULL;
  free(x);
  return m;
}

static nb_status wvm_cond_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *m = wvm_pred(user, in);
  out[0] = m ? nb_any(m, NB_ALL, false) : NULL;
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status wvm_body_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)n_in, (void)n_out;
  const wvm *w = user;
  nb_tensor *m = wvm_pred(w, in);
  nb_status st = m ? NB_OK : nb_last_status();
  nb_tensor **x = nbi_ctl_xcalloc("nb_while_loop", (size_t)(2 * w->n + w->ncb), sizeof *x, &st);
  if (st) return st;
  nb_tensor **y = x + w->n + w->ncb;
  nbi_ctl_put(x, in, w->n);
  nbi_ctl_put(x + w->n, w->cb, w->ncb);
  st = nb_call(w->vbody, x, y);
  for (int k = 0; k < w->n && !st; k++)
    if (!(out[k] = nb_where(nbi_ctl_mask_for(m, w->B, in[k]->shape.ndim - 1), y[k], in[k])))
      st = nb_last_status();
  free(x);
  return st;
}

nb_status nbi_ctl_while_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                             nb_tensor **outs) {
  const char *fn = "nb_while_loop";
  const ctl *c = ctl_of(p);
  int n = c->n_ops, ncc = c->n_capt[0], ncb = c->n_capt[1], cb0 = nbi_ctl_capt_base(p, 1);
  nb_status st = NB_OK;
  wvm *w = nbi_ctl_xcalloc(fn, 1, sizeof *w, &st);
  nb_tensor **init = nbi_ctl_xcalloc(fn, (size_t)n, sizeof *init, &st);
  bool *bat = nbi_ctl_xcalloc(fn, (size_t)(n + ncc + ncb), sizeof *bat, &st);
  nb_fn *cf = NULL, *bf = NULL;
  if (w) {
    *w = (wvm){.refs = 1, .n = n, .ncc = ncc, .ncb = ncb, .B = B};
    w->cc = nbi_ctl_xcalloc(fn, (size_t)ncc, sizeof *w->cc, &st);
    w->cb = nbi_ctl_xcalloc(fn, (size_t)ncb, sizeof *w->cb, &st);
  }
  for (int k = 0; k < n && !st; k++) {
    if (!(init[k] = nbi_bat_expand(bin[k], batched[k], B))) st = nb_last_status();
    bat[k] = true;
  }
  for (int i = 0; i < ncc && !st; i++)
    w->cc[i] = nb_retain(bin[n + i]), bat[n + i] = batched[n + i];
  if (!st && !(w->vcond = vmapped(prog_fn(fn, c->prog[0], NBI_XF_PLAIN), bat)))
    st = nb_last_status();
  for (int i = 0; i < ncb && !st; i++)
    w->cb[i] = nb_retain(bin[cb0 + i]), bat[n + i] = batched[cb0 + i];
  if (!st && !(w->vbody = vmapped(prog_fn(fn, c->prog[1], NBI_XF_PLAIN), bat)))
    st = nb_last_status();
  if (!st) { /* each function holds a reference to w; ours goes at the end */
    w->refs++;
    if (!(cf = nbi_fn_make(fn, wvm_cond_body, w, wvm_destroy, n, 1))) st = nb_last_status();
  }
  if (!st) {
    w->refs++;
    if (!(bf = nbi_fn_make(fn, wvm_body_body, w, wvm_destroy, n, n))) st = nb_last_status();
  }
  if (!st) st = nb_while_loop(cf, bf, init, n, outs);
  nb_fn_release(cf);
  nb_fn_release(bf);
  if (w) wvm_destroy(w);
  free(init);
  free(bat);
  return st;
}

/* ---- scan rules ----------------------------------------------------------------------------- */
/* A scan over (carries, tangents of the float carries) and (xs, the given
 * tangents of the xs): its body is nb_jvp_fn of the step. */
nb_status nbi_ctl_scan_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts) {
  const char *fn = "nb_scan";
  const ctl *c = ctl_of(p);
  int nc = c->n_ops, nx = c->n_xs, ncap = c->n_capt[0], no = c->m.n_out, ny = no - nc;
  int ni = nc + nx + ncap, nfc = 0, ntx = 0, nfy = 0;
  nb_status st = NB_OK;
  int *fc = nbi_ctl_xcalloc(fn, (size_t)nc, sizeof *fc, &st); /* float carries */
  int *fy = nbi_ctl_xcalloc(fn, (size_t)ny, sizeof *fy, &st); /* float ys */
  int *tx = nbi_ctl_xcalloc(fn, (size_t)nx, sizeof *tx, &st); /* xs with a tangent */
  nb_tensor **init = nbi_ctl_xcalloc(fn, (size_t)(2 * nc), sizeof *init, &st);
  nb_tensor **xs = nbi_ctl_xcalloc(fn, (size_t)(2 * nx), sizeof *xs, &st);
  nb_tensor **co = nbi_ctl_xcalloc(fn, (size_t)(2 * nc), sizeof *co, &st);
  nb_tensor **ys = nbi_ctl_xcalloc(fn, (size_t)(2 * ny), sizeof *ys, &st);
  nb_fn *step = NULL;
  if (st) goto done;
  for (int k = 0; k < nc; k++)
    if (nb_dtype_is_float(c->m.dtype[k])) fc[nfc++] = k;
  for (int j = 0; j < ny; j++)
    if (nb_dtype_is_float(c->m.dtype[nc + j])) fy[nfy++] = j;
  for (int k = 0; k < nx; k++)
    if (tin[nc + k]) tx[ntx++] = k;
  if (!nfc && !nfy) goto done;
  nbi_ctl_put(init, p->in, nc);
  for (int f = 0; f < nfc && !st; f++)
    if (!(init[nc + f] = tin[fc[f]] ? tin[fc[f]] : nbi_zeros_like(p->in[fc[f]])))
      st = nb_last_status();
  nbi_ctl_put(xs, p->in + nc, nx);
  for (int i = 0; i < ntx; i++)
    xs[nx + i] = tin[nc + tx[i]];
  /* step: (c[nc], tc[nfc], x[nx], tx[ntx]) -> (c', tc'[float], y, ty[float]) */
  adapt *a = st ? NULL : nbi_ctl_adapt_new(fn, prog_fn(fn, c->prog[0], NBI_XF_JVP), 2 * no, 2 * ni);
  if (a) {
    int xo = nc + nfc; /* outer index of x[0] */
    for (int k = 0; k < nc; k++) {
      nbi_ctl_a_in(a, k, k);
      if (!nb_dtype_is_float(p->in[k]->dtype)) /* integer carries: zero (co)tangents */
        a_in_held(a, ni + k, nbi_zeros_like(p->in[k]));
    }
    for (int f = 0; f < nfc; f++)
      nbi_ctl_a_in(a, ni + fc[f], nc + f);
    for (int k = 0; k < nx; k++) {
      nb_shape rs = nbi_ctl_row_shape(&p->in[nc + k]->shape);
      nbi_ctl_a_in(a, nc + k, xo + k);
      a_in_held(a, ni + nc + k, nbi_zeros_of(&rs, p->in[nc + k]->dtype));
    }
    for (int i = 0; i < ntx; i++)
      nbi_ctl_a_in(a, ni + nc + tx[i], xo + nx + i);
    for (int i = 0; i < ncap; i++) {
      nb_tensor *x = p->in[nc + nx + i], *t = tin[nc + nx + i];
      a_in_held(a, nc + nx + i, x);
      a_in_held(a, ni + nc + nx + i, t ? t : nbi_zeros_like(x));
    }
    for (int k = 0; k < nc; k++)
      nbi_ctl_a_out(a, A_OUT, k, -1);
    for (int f = 0; f < nfc; f++)
      nbi_ctl_a_out(a, A_OUT, no + fc[f], -1);
    for (int j = 0; j < ny; j++)
      nbi_ctl_a_out(a, A_OUT, nc + j, -1);
    for (int f = 0; f < nfy; f++)
      nbi_ctl_a_out(a, A_OUT, no + nc + fy[f], -1);
  }
  if (!st && !(step = nbi_ctl_adapt_fn(fn, a, nc + nfc + nx + ntx))) st = nb_last_status();
  if (!st) st = nb_scan(step, init, nc + nfc, xs, nx + ntx, c->reverse, co, ys);
  for (int f = 0; f < nfc && !st; f++)
    touts[fc[f]] = co[nc + f];
  for (int f = 0; f < nfy && !st; f++)
    touts[nc + fy[f]] = ys[ny + f];
done:
  nb_fn_release(step);
  free(fc);
  free(fy);
  free(tx);
  free(init);
  free(xs);
  free(co);
  free(ys);
  return st;
}

/* Reverse mode, in two scans:
 * 1. a forward scan of the step that also emits its input carry as a y: the
 *    carry entering every step, stacked (the primal scan did not keep them,
 *    so the backward recomputes the forward scan once);
 * 2. a scan in the opposite direction over (those carries, the xs, the ys'
 *    cotangents) whose step applies nb_vjp_fn of the step at (carry_t, x_t) to
 *    (g carry, g y_t): it carries g carry and the running sum of the captured
 *    operands' cotangents, and emits g x_t. */
nb_status nbi_ctl_scan_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin) {
  const char *fn = "nb_scan";
  const ctl *c = ctl_of(p);
  int nc = c->n_ops, nx = c->n_xs, ncap = c->n_capt[0], no = c->m.n_out, ny = no - nc;
  int cap0 = nc + nx, ni = nc + nx + ncap, nfc = 0, nac = 0, nxn = 0, ngy = 0;
  nb_status st = NB_OK;
  int *fc = nbi_ctl_xcalloc(fn, (size_t)nc, sizeof *fc, &st);   /* float carries */
  int *ac = nbi_ctl_xcalloc(fn, (size_t)ncap, sizeof *ac, &st); /* captures needing a cotangent */
  int *xn = nbi_ctl_xcalloc(fn, (size_t)nx, sizeof *xn, &st);   /* xs needing a cotangent */
  int *gy = nbi_ctl_xcalloc(fn, (size_t)ny, sizeof *gy, &st);   /* ys with a cotangent */
  nb_tensor **C = nbi_ctl_xcalloc(fn, (size_t)(2 * nc), sizeof *C, &st), **co = C + nc;
  nb_tensor **binit = nbi_ctl_xcalloc(fn, (size_t)(nc + ncap), sizeof *binit, &st);
  nb_tensor **bxs = nbi_ctl_xcalloc(fn, (size_t)(nc + nx + ny), sizeof *bxs, &st);
  nb_tensor **bco = nbi_ctl_xcalloc(fn, (size_t)(nc + ncap), sizeof *bco, &st);
  nb_tensor **bys = nbi_ctl_xcalloc(fn, (size_t)nx, sizeof *bys, &st);
  nb_fn *aug = NULL, *bwd = NULL;
  if (st) goto done;
  for (int k = 0; k < nc; k++)
    if (nb_dtype_is_float(c->m.dtype[k])) fc[nfc++] = k;
  for (int i = 0; i < ncap; i++)
    if (need[cap0 + i]) ac[nac++] = i;
  for (int k = 0; k < nx; k++)
    if (need[nc + k]) xn[nxn++] = k;
  for (int j = 0; j < ny; j++)
    if (gys[nc + j] && nb_dtype_is_float(c->m.dtype[nc + j])) gy[ngy++] = j;
  if (nfc + nac + nxn == 0) goto done;

  /* 1. the carries entering each step: (c, x) -> (c', c) */
  if (nc > 0) {
    adapt *a = nbi_ctl_adapt_new(fn, prog_fn(fn, c->prog[0], NBI_XF_PLAIN), 2 * nc, ncap);
    if (a) {
      for (int k = 0; k < nc + nx; k++)
        nbi_ctl_a_in(a, k, k);
      for (int i = 0; i < ncap; i++)
        a_in_held(a, cap0 + i, p->in[cap0 + i]);
      for (int k = 0; k < nc; k++)
        nbi_ctl_a_out(a, A_OUT, k, -1);
      for (int k = 0; k < nc; k++)
        nbi_ctl_a_out(a, A_ARG, k, -1);
    }
    if (!(aug = nbi_ctl_adapt_fn(fn, a, nc + nx))) st = nb_last_status();
    if (!st) st = nb_scan(aug, p->in, nc, p->in + nc, nx, c->reverse, co, C);
    if (st) goto done;
  }

  /* 2. backward: carries (g c[nfc], acc[nac]), xs (C[nc], x[nx], g y[ngy]) ->
   *    (g c_in[nfc], acc + g capt[nac]), ys (g x[nxn]) */
  int go = nfc, xo = nfc + nac; /* outer index of acc[0], C[0] */
  adapt *a = nbi_ctl_adapt_new(fn, prog_fn(fn, c->prog[0], NBI_XF_VJP), nfc + nac + nxn, ni + no);
  if (a) {
    for (int k = 0; k < nc; k++) {
      nbi_ctl_a_in(a, k, xo + k);
      if (!nb_dtype_is_float(p->in[k]->dtype)) /* integer carries: zero (co)tangents */
        a_in_held(a, ni + k, nbi_zeros_like(p->in[k]));
    }
    for (int f = 0; f < nfc; f++)
      nbi_ctl_a_in(a, ni + fc[f], f);
    for (int k = 0; k < nx; k++)
      nbi_ctl_a_in(a, nc + k, xo + nc + k);
    for (int i = 0; i < ncap; i++)
      a_in_held(a, cap0 + i, p->in[cap0 + i]);
    for (int j = 0; j < ny; j++) {
      nb_shape rs = nbi_ctl_row_shape(&c->m.shape[nc + j]);
      a_in_held(a, ni + nc + j, nbi_zeros_of(&rs, c->m.dtype[nc + j]));
    }
    for (int i = 0; i < ngy; i++)
      nbi_ctl_a_in(a, ni + nc + gy[i], xo + nc + nx + i);
    /* inner outputs: c'[nc], y[ny], g c[nc], g x[nx], g capt[ncap] */
    for (int f = 0; f < nfc; f++)
      nbi_ctl_a_out(a, A_OUT, no + fc[f], -1);
    for (int i = 0; i < nac; i++)
      nbi_ctl_a_out(a, A_OUT, no + nc + nx + ac[i], go + i);
    for (int i = 0; i < nxn; i++)
      nbi_ctl_a_out(a, A_OUT, no + nc + xn[i], -1);
  }
  if (!(bwd = nbi_ctl_adapt_fn(fn, a, nfc + nac + nc + nx + ngy))) st = nb_last_status();
  for (int f = 0; f < nfc && !st; f++) {
    nb_tensor *g = gys[fc[f]];
    if (!(binit[f] = g ? g : nbi_zeros_like(p->in[fc[f]]))) st = nb_last_status();
  }
  for (int i = 0; i < nac && !st; i++)
    if (!(binit[nfc + i] = nbi_zeros_like(p->in[cap0 + ac[i]]))) st = nb_last_status();
  if (st) goto done;
  nbi_ctl_put(bxs, C, nc);
  nbi_ctl_put(bxs + nc, p->in + nc, nx);
  for (int i = 0; i < ngy; i++)
    bxs[nc + nx + i] = gys[nc + gy[i]];
  st = nb_scan(bwd, binit, nfc + nac, bxs, nc + nx + ngy, !c->reverse, bco, bys);
  for (int f = 0; f < nfc && !st; f++)
    if (need[fc[f]]) gin[fc[f]] = bco[f];
  for (int i = 0; i < nac && !st; i++)
    gin[cap0 + ac[i]] = bco[nfc + i];
  for (int i = 0; i < nxn && !st; i++)
    gin[nc + xn[i]] = bys[i];
done:
  nb_fn_release(aug);
  nb_fn_release(bwd);
  free(fc);
  free(ac);
  free(xn);
  free(gy);
  free(C);
  free(binit);
  free(bxs);
  free(bco);
  free(bys);
  return st;
}

/* The step vmapped (carries batched; xs and captures as they come), over xs
 * whose batch axis moves to 1 (the scan runs over axis 0): ys come out
 * (T, B, ...) and go back to (B, T, ...). */
nb_status nbi_ctl_scan_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                            nb_tensor **outs) {
  const char *fn = "nb_scan";
  const ctl *c = ctl_of(p);
  int nc = c->n_ops, nx = c->n_xs, ncap = c->n_capt[0], no = c->m.n_out, ny = no - nc;
  int cap0 = nc + nx, ni = cap0 + ncap;
  nb_status st = NB_OK;
  bool *bat = nbi_ctl_xcalloc(fn, (size_t)ni, sizeof *bat, &st);
  nb_tensor **in = nbi_ctl_xcalloc(fn, (size_t)(nc + nx), sizeof *in, &st);
  nb_tensor **ys = nbi_ctl_xcalloc(fn, (size_t)ny, sizeof *ys, &st);
  nb_fn *step = NULL;
  if (st) goto done;
  for (int k = 0; k < nc && !st; k++) {
    bat[k] = true;
    if (!(in[k] = nbi_bat_expand(bin[k], batched[k], B))) st = nb_last_status();
  }
  for (int k = nc; k < ni && !st; k++) {
    bat[k] = batched[k];
    if (k < cap0 && !(in[k] = batched[k] ? nbi_bat_moveaxis(bin[k], 0, 1) : bin[k]))
      st = nb_last_status();
  }
  adapt *a =
      st ? NULL
         : nbi_ctl_adapt_new(fn, vmapped(prog_fn(fn, c->prog[0], NBI_XF_PLAIN), bat), no, ncap);
  if (a) {
    for (int k = 0; k < cap0; k++)
      nbi_ctl_a_in(a, k, k);
    for (int i = 0; i < ncap; i++)
      a_in_held(a, cap0 + i, bin[cap0 + i]);
    for (int j = 0; j < no; j++)
      nbi_ctl_a_out(a, A_OUT, j, -1);
  }
  if (!st && !(step = nbi_ctl_adapt_fn(fn, a, cap0))) st = nb_last_status();
  if (!st) st = nb_scan(step, in, nc, in + nc, nx, c->reverse, outs, ys);
  for (int j = 0; j < ny && !st; j++)
    if (!(outs[nc + j] = nbi_bat_moveaxis(ys[j], 1, 0))) st = nb_last_status();
done:
  nb_fn_release(step);
  free(bat);
  free(in);
  free(ys);
  return st;
}
