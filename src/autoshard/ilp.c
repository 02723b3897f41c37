/* src/autoshard/ilp.c — the ILP backend: COIN-OR CBC (Eclipse Public License)
 * through its C interface (Cbc_C_Interface.h), loaded with dlopen at the
 * first use, so nabla builds and runs without it (Debian coinor-libcbc-dev).
 *
 * The model (Alpa's): a binary x[i][s] per variable and strategy, one per
 * variable (sum_s x[i][s] = 1); per edge a continuous y[e][s][t] in [0, 1]
 * with sum_t y[e][s][t] = x[u][s] and sum_s y[e][s][t] = x[v][t], which
 * forces y = x[u][s] x[v][t] when the x are integral; minimize
 * sum unary x + sum edge cost y. Warm-started from the local search's
 * solution (Cbc_setMIPStartI), under a time limit: the result is the best
 * solution CBC has when it stops, never worse than the start. */
#include "autoshard.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void cbc_model;
typedef struct cbc_api {
  void *lib;
  cbc_model *(*new_model)(void);
  void (*delete_model)(cbc_model *);
  void (*add_col)(cbc_model *, const char *, double, double, double, char, int, int *, double *);
  void (*add_row)(cbc_model *, const char *, int, const int *, const double *, char, double);
  void (*set_mip_start)(cbc_model *, int, const int *, const double *);
  void (*set_max_seconds)(cbc_model *, double);
  void (*set_log_level)(cbc_model *, int);
  int (*solve)(cbc_model *);
  const double *(*col_solution)(cbc_model *);
} cbc_api;

static cbc_api cbc;
static int cbc_state; /* 0: not tried, 1: loaded, -1: missing */
static char cbc_why[256];

static bool cbc_load(void) {
  if (cbc_state) return cbc_state > 0;
  static const char *const names[] = {"libCbcSolver.so.3", "libCbcSolver.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !cbc.lib; i++)
    cbc.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!cbc.lib) {
    const char *e = dlerror();
    snprintf(cbc_why, sizeof cbc_why, "%s", e ? e : "libCbcSolver.so not found");
    cbc_state = -1;
    return false;
  }
  struct {
    const char *name;
    void **slot;
  } syms[] = {
      {"Cbc_newModel", (void **)&cbc.new_model},
      {"Cbc_deleteModel", (void **)&cbc.delete_model},
      {"Cbc_addCol", (void **)&cbc.add_col},
      {"Cbc_addRow", (void **)&cbc.add_row},
      {"Cbc_setMIPStartI", (void **)&cbc.set_mip_start},
      {"Cbc_setMaximumSeconds", (void **)&cbc.set_max_seconds},
      {"Cbc_setLogLevel", (void **)&cbc.set_log_level},
      {"Cbc_solve", (void **)&cbc.solve},
      {"Cbc_getColSolution", (void **)&cbc.col_solution},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    void *p = dlsym(cbc.lib, syms[i].name);
    if (!p) {
      snprintf(cbc_why, sizeof cbc_why, "libCbcSolver has no %s", syms[i].name);
      dlclose(cbc.lib);
      cbc = (cbc_api){0};
      cbc_state = -1;
      return false;
    }
    memcpy(syms[i].slot, &p, sizeof p);
  }
  cbc_state = 1;
  return true;
}

bool as_ilp_available(void) { return cbc_load(); }

nb_status as_solve_ilp(as_graph *g, int *choice, double max_s) {
  if (!cbc_load())
    return nbi_error(NB_ERR_STATE,
                     "%s: NB_AUTO_SHARD_ILP needs COIN-OR CBC (libCbcSolver.so.3, Debian "
                     "coinor-libcbc-dev): %s",
                     g->fn, cbc_why);
  /* the start: the built-in local search */
  nb_status st = as_solve_local(g, choice);
  if (st) return st;
  int n = g->n_v;
  size_t n_x = 0, n_y = 0;
  int *xo = malloc(sizeof *xo * (size_t)(n + 1));
  size_t *yo = malloc(sizeof *yo * (size_t)(g->n_e + 1));
  if (!xo || !yo) {
    free(xo), free(yo);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  }
  for (int i = 0; i < n; i++)
    xo[i] = (int)n_x, n_x += (size_t)g->v[i].n_s;
  for (int e = 0; e < g->n_e; e++)
    yo[e] = n_x + n_y, n_y += (size_t)g->v[g->e[e].u].n_s * (size_t)g->v[g->e[e].v].n_s;
  if (n_x + n_y > 4000000) {
    free(xo), free(yo);
    return nbi_error(NB_ERR_ARG,
                     "%s: the ILP would have %zu columns (over 4e6): use the local search "
                     "(repeated layers shrink it)",
                     g->fn, n_x + n_y);
  }
  cbc_model *mdl = cbc.new_model();
  if (!mdl) {
    free(xo), free(yo);
    return nbi_error(NB_ERR_OOM, "%s: Cbc_newModel failed", g->fn);
  }
  cbc.set_log_level(mdl, 0);
  for (int i = 0; i < n; i++)
    for (int s = 0; s < g->v[i].n_s; s++)
      cbc.add_col(mdl, "x", 0, 1, g->v[i].unary[s], 1, 0, NULL, NULL);
  for (int e = 0; e < g->n_e; e++) {
    const as_edge *ed = &g->e[e];
    size_t k = (size_t)g->v[ed->u].n_s * (size_t)g->v[ed->v].n_s;
    for (size_t q = 0; q < k; q++)
      cbc.add_col(mdl, "y", 0, 1, ed->c[q], 0, 0, NULL, NULL);
  }
  int maxs = 1;
  for (int i = 0; i < n; i++)
    maxs = g->v[i].n_s > maxs ? g->v[i].n_s : maxs;
  int *cols = malloc(sizeof *cols * (size_t)(maxs + 2));
  double *coef = malloc(sizeof *coef * (size_t)(maxs + 2));
  st = cols && coef ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  for (int i = 0; i < n && !st; i++) { /* one strategy per variable */
    for (int s = 0; s < g->v[i].n_s; s++)
      cols[s] = xo[i] + s, coef[s] = 1;
    cbc.add_row(mdl, "r", g->v[i].n_s, cols, coef, 'E', 1);
  }
  for (int e = 0; e < g->n_e && !st; e++) { /* y's marginals are the x */
    const as_edge *ed = &g->e[e];
    int nu = g->v[ed->u].n_s, nv = g->v[ed->v].n_s;
    for (int s = 0; s < nu; s++) {
      for (int t = 0; t < nv; t++)
        cols[t] = (int)yo[e] + s * nv + t, coef[t] = 1;
      cols[nv] = xo[ed->u] + s, coef[nv] = -1;
      cbc.add_row(mdl, "r", nv + 1, cols, coef, 'E', 0);
    }
    for (int t = 0; t < nv; t++) {
      for (int s = 0; s < nu; s++)
        cols[s] = (int)yo[e] + s * nv + t, coef[s] = 1;
      cols[nu] = xo[ed->v] + t, coef[nu] = -1;
      cbc.add_row(mdl, "r", nu + 1, cols, coef, 'E', 0);
    }
  }
  /* the warm start: the local search's x (CBC completes the continuous y) */
  int *si = st ? NULL : malloc(sizeof *si * (size_t)(n_x + 1));
  double *sv = st ? NULL : malloc(sizeof *sv * (size_t)(n_x + 1));
  if (!st && (!si || !sv)) st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  if (!st) {
    for (size_t c = 0; c < n_x; c++)
      si[c] = (int)c, sv[c] = 0;
    for (int i = 0; i < n; i++)
      sv[xo[i] + choice[i]] = 1;
    cbc.set_mip_start(mdl, (int)n_x, si, sv);
    cbc.set_max_seconds(mdl, max_s > 0 ? max_s : 60);
    cbc.solve(mdl);
    const double *x = cbc.col_solution(mdl);
    if (x) {
      int *trial = malloc(sizeof *trial * (size_t)(n + 1));
      bool ok = trial != NULL;
      for (int i = 0; i < n && ok; i++) {
        int best = -1;
        for (int s = 0; s < g->v[i].n_s; s++)
          if (x[xo[i] + s] > 0.5) best = s;
        ok = best >= 0;
        if (ok) trial[i] = best;
      }
      /* kept unless worse than the start (a stop before any solution) */
      if (ok && as_total(g, trial) <= as_total(g, choice) * (1 + 1e-12))
        memcpy(choice, trial, sizeof *trial * (size_t)n);
      free(trial);
    }
  }
  cbc.delete_model(mdl);
  free(si), free(sv), free(cols), free(coef), free(xo), free(yo);
  return st;
}
