/* test/test_dot.c — nb_graph_dot writes the pending graph as the planner
 * would run it (Graphviz DOT): one node per step with its op, dtype and shape,
 * one cluster per fused kernel, simplified-away steps marked; it realizes and
 * changes nothing; bad arguments are errors. */
#include "common.h"

#include <math.h>

#include <stdio.h>

/* The DOT text for ts (tmpfile, read back; caller frees). */
static char *dot_of(nb_tensor *const *ts, int n) {
  FILE *f = tmpfile();
  cr_assert(f);
  cr_assert(nb_graph_dot(f, ts, n) == NB_OK, "%s", nb_last_error());
  long len = ftell(f);
  cr_assert(len > 0);
  rewind(f);
  char *s = malloc((size_t)len + 1);
  cr_assert(fread(s, 1, (size_t)len, f) == (size_t)len);
  s[len] = 0;
  fclose(f);
  return s;
}

static int count(const char *s, const char *needle) {
  int n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* Fused groups of two or more steps in the plan nbi_realize would run. */
static int groups_of(nb_tensor *const *ts, int n) {
  nbi_plan_desc d;
  cr_assert(nbi_plan_describe(ts, n, &d) == NB_OK);
  int g = 0;
  for (int c = 0; c < d.n_run; c++)
    if (d.group[c] != c && (c + 1 == d.n_run || d.group[c + 1] != d.group[c])) g++;
  nbi_plan_describe_free(&d);
  return g;
}

Test(dot, clusters_match_the_fused_groups_and_nodes_carry_their_labels) {
  for (int fusion = 0; fusion < 2; fusion++) {
    nbi_set_fusion(fusion);
    nb_scope_begin();
    nb_tensor *x = nb_rand(NB_SHAPE(8, 16), NB_F32), *w = nb_rand(NB_SHAPE(16, 4), NB_F32);
    /* [exp, sin, add] fuse; matmul alone; [relu, mul] fuse; a duplicate exp
     * aliases; only y and e are held */
    nb_scope_begin();
    nb_tensor *h = nb_add(nb_sin(nb_exp(x)), x);
    nb_tensor *m = nb_matmul(h, w);
    nb_tensor *y = nb_keep(nb_mul_scalar(nb_relu(m), 2.0));
    nb_tensor *e = nb_keep(nb_exp(x));
    nb_scope_end();
    nb_tensor *roots[2] = {y, e};
    nb_stats s0 = nb_get_stats();
    char *s = dot_of(roots, 2);
    nb_stats s1 = nb_get_stats();
    cr_assert_eq(s1.realizations, s0.realizations, "nothing is realized");
    cr_assert_eq(s1.kernels_run, s0.kernels_run);
    cr_assert(!nb_is_realized(y) && !nb_is_realized(e));
    int g = groups_of(roots, 2);
    cr_assert_eq(g, fusion ? 2 : 0);
    cr_assert_eq(count(s, "subgraph cluster_"), g, "%s", s);
    cr_assert(strncmp(s, "digraph nabla {", 15) == 0);
    cr_assert_eq(count(s, "\n}\n") + count(s, "\n  }\n"), 1 + g);
    /* 7 steps: exp sin add matmul relu mul exp(dup); 3 leaves: x w 2.0; 10
     * edges and the alias's */
    cr_assert_eq(count(s, "[label=\"#"), 7, "%s", s);
    cr_assert_eq(count(s, "shape=ellipse"), 3);
    cr_assert_eq(count(s, " -> "), 11);
    cr_assert_eq(count(s, "peripheries=2"), 2, "y and e are held");
    cr_assert(strstr(s, "matmul\\nf32 [8,4]"), "%s", s);
    cr_assert(strstr(s, "exp\\nf32 [8,16]"));
    cr_assert(strstr(s, "relu\\nf32 [8,4]"));
    cr_assert_eq(count(s, "\\nalias\""), 1, "the second exp is an alias");
    cr_assert_eq(count(s, "same value"), 1);
    /* sin and relu stay in tiles; exp is stored, since e (its alias) takes its buffer */
    cr_assert_eq(count(s, "\\nin tile\""), fusion ? 2 : 0, "%s", s);
    free(s);
    /* the graph is intact: it realizes to the right values afterwards */
    cr_assert(nb_eval(roots, 2) == NB_OK);
    double *ev = tc_read(e), *xv = tc_read(x);
    for (int i = 0; i < 128; i++)
      cr_assert(fabs(ev[i] - exp(xv[i])) <= 2.5e-7 * exp(xv[i]), "exp within 2 ulp of f32");
    free(ev), free(xv);
    nb_scope_end();
  }
  nbi_set_fusion(true);
}

Test(dot, realized_tensors_and_empty_lists_give_an_empty_graph) {
  nb_tensor *x = nb_ones(NB_SHAPE(3), NB_F32);
  char *s = dot_of(&x, 1);
  cr_assert_eq(count(s, "[label=\"#"), 0);
  cr_assert_eq(count(s, "shape=ellipse"), 1, "%s", s);
  free(s);
  s = dot_of(NULL, 0);
  cr_assert_eq(count(s, "label="), 0);
  free(s);
}

Test(dot, bad_arguments_are_errors) {
  nb_tensor *x = nb_exp(nb_ones(NB_SHAPE(3), NB_F32));
  FILE *f = tmpfile();
  cr_assert_eq(nb_graph_dot(NULL, &x, 1), NB_ERR_NULL);
  cr_assert(strstr(nb_last_error(), "nb_graph_dot"));
  nb_clear_error();
  cr_assert_eq(nb_graph_dot(f, NULL, 1), NB_ERR_NULL);
  nb_clear_error();
  cr_assert_eq(nb_graph_dot(f, &x, -1), NB_ERR_ARG);
  nb_clear_error();
  nb_tensor *two[2] = {x, NULL};
  cr_assert_eq(nb_graph_dot(f, two, 2), NB_ERR_NULL);
  nb_clear_error();
  cr_assert_eq(ftell(f), 0, "nothing written on error");
  fclose(f);
  cr_assert(!nb_is_realized(x));
}
