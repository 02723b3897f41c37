/* src/transforms/program_xform.c — program transforms: a body program as a
 * function, or its vjp / jvp / vmap, with selected outputs (contract:
 * transforms.h, "programs as functions").
 *
 * What the rules of checkpoint, control flow and shard_map build on. It sits
 * above autodiff.c and vmap.c (it calls nb_vjp_fn, nb_jvp_fn, nb_vmap), and
 * below those rules; fn.c (nb_fn objects, calls, tracing) depends on nothing
 * above it. */
#include "transforms.h"

#include <stdlib.h>

/* An nb_fn giving outputs idx[0..n-1] of f; fn names the public function in
 * its errors. */
typedef struct select_fn {
  nb_fn *f;
  const char *fn;
  int n;
  int idx[];
} select_fn;

static nb_status select_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                             int n_out) {
  (void)n_in;
  const select_fn *s = user;
  nb_tensor *local[16],
      **all = s->f->n_out <= 16 ? local : malloc(sizeof *all * (size_t)s->f->n_out);
  if (!all) return nbi_error(NB_ERR_OOM, "%s: out of memory", s->fn);
  nb_status st = nb_call(s->f, in, all);
  for (int i = 0; i < n_out && !st; i++)
    out[i] = all[s->idx[i]];
  if (all != local) free(all);
  return st;
}

static void select_destroy(void *user) {
  select_fn *s = user;
  nb_fn_release(s->f);
  free(s);
}

nb_fn *nbi_select_fn(const char *fn, nb_fn *g, const int *idx, int n) {
  if (!g) return NULL;
  select_fn *s = malloc(sizeof *s + sizeof(int) * (size_t)(n + 1));
  if (!s) {
    nb_fn_release(g);
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  s->f = g;
  s->fn = fn;
  s->n = n;
  memcpy(s->idx, idx, sizeof(int) * (size_t)n);
  return nbi_fn_make(fn, select_body, s, select_destroy, g->n_in, n);
}

nb_fn *nbi_program_xform(const char *fn, nbi_program *p, int kind, const int *in_axes,
                         const int *idx, int n) {
  nb_fn *pf = nbi_program_fn(fn, p), *g = NULL;
  if (kind == NBI_XF_PLAIN)
    g = pf;
  else if (pf)
    g = kind == NBI_XF_VJP   ? nb_vjp_fn(pf)
        : kind == NBI_XF_JVP ? nb_jvp_fn(pf)
                             : nb_vmap(pf, in_axes, NULL);
  if (g != pf) nb_fn_release(pf);
  return idx ? nbi_select_fn(fn, g, idx, n) : g;
}
