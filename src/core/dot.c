/* src/core/dot.c — nb_graph_dot: the pending graph as the planner would run
 * it, written as Graphviz DOT.
 *
 * Steps are "n<i>" (i: topological index), realized inputs "l<k>". Each fused
 * group of two or more steps is one "subgraph cluster_<g>"; members stored
 * to a buffer are solid, members that live only in the kernel's tiles dashed.
 * Held steps (kept after the realization) have a double border. Steps that do
 * not run are grey and dotted: an alias (its value is another step's or
 * leaf's, a dotted edge points there) or dead code. */
#include "fuse.h"
#include "oprules.h"

#include <stdlib.h>

static void label(FILE *f, const nb_tensor *t) {
  char s[160];
  fprintf(f, "%s\\n%s %s", nbi_op_table[t->op]->name, nb_dtype_name(t->dtype),
          nb_shape_str(t->shape, s, sizeof s));
}

static void ref(FILE *f, const nb_tensor *t) {
  if (t->mark >= 0)
    fprintf(f, "n%d", t->mark);
  else
    fprintf(f, "l%d", -3 - t->mark);
}

/* pos[i]: step i's run position, or -1 when it does not run. */
static void write_dot(FILE *f, const nbi_plan_desc *d, int *pos) {
  fprintf(f, "digraph nabla {\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  for (int k = 0; k < d->n_leaves; k++) {
    fprintf(f, "  l%d [shape=ellipse, label=\"", k);
    label(f, d->leaves[k]);
    fprintf(f, "\"];\n");
  }
  for (int i = 0; i < d->n; i++)
    pos[i] = -1;
  for (int c = 0; c < d->n_run; c++)
    pos[d->run[c]] = c;
  /* fused groups: runs of run positions sharing group[] */
  for (int c = 0, cluster = 0; c < d->n_run; c++) {
    int first = c;
    c = nbi_fuse_group_end(d->group, d->n_run, c);
    if (c == first) continue;
    fprintf(f, "  subgraph cluster_%d {\n    label=\"fused kernel %d (%d ops)\";\n", cluster,
            cluster, c - first + 1);
    fprintf(f, "    style=rounded; color=blue;\n");
    for (int k = first; k <= c; k++)
      fprintf(f, "    n%d;\n", d->run[k]);
    fprintf(f, "  }\n");
    cluster++;
  }
  for (int i = 0; i < d->n; i++) {
    const nb_tensor *t = d->nodes[i];
    int c = pos[i];
    fprintf(f, "  n%d [label=\"#%d ", i, i);
    label(f, t);
    if (d->alias[i] != i) {
      fprintf(f, "\\nalias\", style=dotted, color=gray, fontcolor=gray");
    } else if (c < 0) {
      fprintf(f, "\\ndead\", style=dotted, color=gray, fontcolor=gray");
    } else {
      bool stored = d->store[c];
      fprintf(f, "%s\"%s", stored ? "" : "\\nin tile", stored ? "" : ", style=dashed");
    }
    if (d->held[i]) fprintf(f, ", peripheries=2");
    fprintf(f, "];\n");
  }
  for (int i = 0; i < d->n; i++) {
    const nb_tensor *t = d->nodes[i];
    for (int k = 0; k < t->n_in; k++) {
      fprintf(f, "  ");
      ref(f, t->in[k]);
      fprintf(f, " -> n%d;\n", i);
    }
    if (d->alias[i] != i) {
      int a = d->alias[i];
      fprintf(f, "  n%d -> %c%d [style=dotted, color=gray, label=\"same value\"];\n", i,
              a >= 0 ? 'n' : 'l', a >= 0 ? a : -3 - a);
    }
  }
  fprintf(f, "}\n");
}

nb_status nb_graph_dot(FILE *f, nb_tensor *const *ts, int n) {
  const char *fn = "nb_graph_dot";
  if (!f) return nbi_error(NB_ERR_NULL, "%s: f is NULL", fn);
  if (n < 0) return nbi_error(NB_ERR_ARG, "%s: n is %d (need n >= 0)", fn, n);
  if (n > 0 && !ts) return nbi_error(NB_ERR_NULL, "%s: ts is NULL", fn);
  if (n > 0 && nbi_any_null(fn, ts, n)) return nb_last_status();
  nbi_plan_desc d;
  nb_status st = nbi_plan_describe(ts, n, &d);
  if (st) return st;
  int *pos = malloc(sizeof(int) * (size_t)(d.n ? d.n : 1));
  bool ok = pos != NULL;
  if (ok) write_dot(f, &d, pos);
  free(pos);
  nbi_plan_describe_free(&d);
  if (!ok) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  if (fflush(f) != 0 || ferror(f)) return nbi_error(NB_ERR_ARG, "%s: writing to f failed", fn);
  return NB_OK;
}
