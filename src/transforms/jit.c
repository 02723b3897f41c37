/* src/transforms/jit.c — nb_jit.
 *
 * A jitted function keeps a small LRU cache of programs keyed by the input
 * signature (each input's dtype and shape). A miss traces f on placeholders
 * into a program (nbi_trace_program); a hit replays the cached program on the
 * call's inputs, so f's C body does not run again. The tensors f captured
 * (closures, constants it made) are retained by the entry and passed as the
 * program's further inputs on every replay.
 *
 * At top level the replayed outputs are realized at once in one nb_eval: the
 * replayed graph has the same structure each call, so its plan comes from the
 * plan cache. Under another transform the replay is just recorded into the
 * enclosing trace (that transform's rules see ordinary ops).
 *
 * A program that captured a traced tensor (a closure over an enclosing
 * transform's value) is valid for this call only: it is applied and not
 * cached.
 */
#include "transforms.h"

#include <stdlib.h>

#define JIT_CACHE 16

typedef struct jit_entry {
  nbi_program *prog; /* NULL: empty slot */
  nb_tensor **capt;  /* retained captures: the program's inputs after f's */
  int n_capt;
  uint64_t last_used;
} jit_entry;

typedef struct jit_fn {
  nb_fn *f;
  jit_entry cache[JIT_CACHE];
  uint64_t clock;
} jit_fn;

static const char *FN = "nb_jit";

static void entry_clear(jit_entry *e) {
  nbi_program_release(e->prog);
  nbi_release_all(e->capt, e->n_capt);
  *e = (jit_entry){0};
}

static void jit_destroy(void *p) {
  jit_fn *j = p;
  for (int i = 0; i < JIT_CACHE; i++)
    entry_clear(&j->cache[i]);
  nb_fn_release(j->f);
  free(j);
}

static bool matches(const nbi_program *p, nb_tensor *const *in, int n_in) {
  for (int k = 0; k < n_in; k++)
    if (in[k]->dtype != p->in_dtype[k] || !nbi_shape_eq(&in[k]->shape, &p->in_shape[k]))
      return false;
  return true;
}

static jit_entry *lookup(jit_fn *j, nb_tensor *const *in) {
  for (int i = 0; i < JIT_CACHE; i++)
    if (j->cache[i].prog && matches(j->cache[i].prog, in, j->f->n_in)) return &j->cache[i];
  return NULL;
}

static jit_entry *victim(jit_fn *j) {
  jit_entry *v = &j->cache[0];
  for (int i = 0; i < JIT_CACHE; i++) {
    if (!j->cache[i].prog) return &j->cache[i];
    if (j->cache[i].last_used < v->last_used) v = &j->cache[i];
  }
  entry_clear(v);
  return v;
}

/* Applies e's program to the call's inputs followed by its captures. */
static nb_status replay(const jit_entry *e, nb_tensor *const *in, int n_in, nb_tensor **out) {
  nb_tensor *local[16],
      **args = e->prog->n_in <= 16 ? local : malloc(sizeof *args * (size_t)e->prog->n_in);
  if (!args) return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int k = 0; k < n_in; k++)
    args[k] = in[k];
  for (int c = 0; c < e->n_capt; c++)
    args[n_in + c] = e->capt[c];
  nb_status st = nbi_program_apply(FN, e->prog, args, out);
  if (args != local) free(args);
  return st;
}

static nb_status jit_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  jit_fn *j = user;
  jit_entry *e = lookup(j, in), fresh = {0};
  nbi_stats_jit(e != NULL);
  nb_status st = NB_OK;
  if (!e) {
    st = nbi_trace_program_like(FN, j->f, in, &fresh.prog, &fresh.capt, &fresh.n_capt);
    if (st) return st;
    bool cacheable = true;
    for (int c = 0; c < fresh.n_capt; c++)
      if (fresh.capt[c]->flags & NBI_T_TRACED) cacheable = false;
    if (cacheable) {
      e = victim(j);
      *e = fresh;
      fresh = (jit_entry){0};
    } else {
      e = &fresh;
    }
  }
  e->last_used = ++j->clock;
  st = replay(e, in, n_in, out);
  entry_clear(&fresh);
  if (st) return st;
  for (int k = 0; k < n_out; k++)
    if (out[k]->flags & NBI_T_TRACED) return NB_OK; /* recorded into an enclosing trace */
  return nbi_realize(out, n_out);
}

nb_fn *nb_jit(nb_fn *f) {
  if (!f) {
    nbi_error(NB_ERR_NULL, "%s: f is NULL", FN);
    return NULL;
  }
  jit_fn *j = calloc(1, sizeof *j);
  if (!j) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
    return NULL;
  }
  j->f = nb_fn_retain(f);
  return nbi_fn_make(FN, jit_body, j, jit_destroy, f->n_in, f->n_out);
}
