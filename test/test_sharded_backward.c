/* test/test_sharded_backward.c — nb_backward through sharded tensors (on the
 * physical graph): data-parallel and Megatron MLPs on several meshes with
 * partial, replicated and sharded losses against the unsharded nb_backward,
 * the layout nb_grad_of gives, a PyTorch-style SGD loop with nb_assign and
 * nb_zero_grad against the unsharded loop, and the errors that remain. */
#include <math.h>

#include "common.h"

#include "../src/sharding/sharding.h"

TestSuite(sharded_backward, .init = tc_setup, .fini = tc_teardown);

enum { N = 8, D = 4, H = 8, NP = 4 };
static const nb_shape PSHAPE[NP] = {{2, {D, H}}, {1, {H}}, {2, {H, D}}, {1, {D}}};

/* How the loss is formed from the MLP's output h [N, D]. */
enum {
  LOSS_PARTIAL,    /* sum of squares: partial over the axes h's rows are sharded on */
  LOSS_REPLICATED, /* h gathered first: every device computes the whole loss */
  LOSS_ROWS,       /* per-row losses (sharded like the rows), then summed */
  LOSS_SHARDED,    /* the loss as a [1] tensor sharded over an axis */
  N_LOSS
};

static nb_tensor *mlp_loss(nb_tensor *x, nb_tensor *const *p, int kind, const char *axis) {
  nb_tensor *h = nb_relu(nb_add(nb_matmul(x, p[0]), p[1]));
  h = nb_tanh(nb_add(nb_matmul(h, p[2]), p[3]));
  bool sharded = nb_mesh_of(x) || nb_mesh_of(p[0]);
  switch (kind) {
  case LOSS_PARTIAL: return nb_sum(nb_square(h), NB_ALL, false);
  case LOSS_REPLICATED:
    if (sharded) h = nb_reshard(h, "_, _");
    return nb_mean(nb_square(h), NB_ALL, false);
  case LOSS_ROWS: return nb_sum(nb_sum(nb_square(h), NB_AXES(1), false), NB_ALL, false);
  default: {
    nb_tensor *l = nb_reshape(nb_mean(nb_square(h), NB_ALL, false), NB_SHAPE(1));
    return sharded ? nb_reshard(l, axis) : l;
  }
  }
}

typedef struct setup {
  const char *mesh, *xspec, *pspec[NP], *axis; /* axis: LOSS_SHARDED's */
} setup;

static const setup SETUPS[] = {
    /* data parallel: x's rows sharded, weights replicated */
    {"x=2", "x, _", {"_, _", "_", "_, _", "_"}, "x"},
    {"dp=2,tp=2", "dp, _", {"_, _", "_", "_, _", "_"}, "tp"},
    {"x=4,y=2", "x, _", {"_, _", "_", "_, _", "_"}, "y"},
    /* Megatron: W1 column-parallel, W2 row-parallel */
    {"x=2", "_, _", {"_, x", "x", "x, _", "_"}, "x"},
    {"dp=2,tp=2", "dp, _", {"_, tp", "tp", "tp, _", "_"}, "dp"},
    {"x=4,y=2", "x, _", {"_, y", "y", "y, _", "_"}, "x"},
    /* sub-axes: rows over x's major half, W over its minor half */
    {"x=4,y=2", "x:(1)2, _", {"_, x:(2)2", "x:(2)2", "x:(2)2, _", "_"}, "y"},
    /* rows over both axes, W over one */
    {"x=4,y=2", "(x, y), _", {"_, x", "x", "x, _", "y"}, "y"},
};

static double *rand_values(nb_shape s, uint64_t *seed) {
  return tc_rand_floats(tc_numel(s), NB_F64, seed);
}

/* The unsharded loss and nb_backward gradients (grads[j], caller frees). */
static double ref_backward(const double *xv, double *const *pv, int kind, double **grads) {
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(N, D), NB_F64), *p[NP];
  for (int j = 0; j < NP; j++)
    p[j] = nb_set_requires_grad(tc_tensor(pv[j], PSHAPE[j], NB_F64), true);
  nb_tensor *loss = mlp_loss(x, p, kind, NULL);
  cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
  for (int j = 0; j < NP; j++)
    grads[j] = tc_read(nb_grad_of(p[j]));
  return nb_item(loss);
}

Test(sharded_backward, gradients_equal_the_unsharded_ones) {
  uint64_t seed = 11;
  for (size_t si = 0; si < sizeof SETUPS / sizeof *SETUPS; si++) {
    const setup *su = &SETUPS[si];
    nb_mesh *m = nb_mesh_cpu(su->mesh);
    cr_assert(m, "%s", nb_last_error());
    for (int kind = 0; kind < N_LOSS; kind++) {
      nb_scope_begin();
      double *xv = rand_values(NB_SHAPE(N, D), &seed), *pv[NP], *ref[NP];
      for (int j = 0; j < NP; j++)
        pv[j] = rand_values(PSHAPE[j], &seed);
      double ref_loss = ref_backward(xv, pv, kind, ref);
      nb_tensor *x = nb_shard(tc_tensor(xv, NB_SHAPE(N, D), NB_F64), m, su->xspec), *p[NP];
      for (int j = 0; j < NP; j++) {
        p[j] = nb_shard(tc_tensor(pv[j], PSHAPE[j], NB_F64), m, su->pspec[j]);
        cr_assert(nb_set_requires_grad(p[j], true), "%s", nb_last_error());
        cr_assert(nb_requires_grad(p[j]));
      }
      cr_assert(!nb_requires_grad(x));
      nb_tensor *loss = mlp_loss(x, p, kind, su->axis);
      cr_assert(loss, "%s %d: %s", su->mesh, kind, nb_last_error());
      cr_assert(nb_mesh_of(loss) == m);
      cr_assert(nb_requires_grad(loss));
      const char *ls = nb_sharding_str(loss);
      if (kind == LOSS_PARTIAL && strchr(su->xspec, 'x'))
        cr_assert(strstr(ls, "partial"), "%s: loss %s", su->mesh, ls);
      if (kind == LOSS_REPLICATED) cr_assert(!strstr(ls, "partial"), "loss %s", ls);
      if (kind == LOSS_SHARDED) cr_assert(strstr(ls, su->axis), "loss %s", ls);
      cr_assert_eq(nb_backward(loss), NB_OK, "%s %d: %s", su->mesh, kind, nb_last_error());
      double got = nb_item(loss);
      cr_assert(fabs(got - ref_loss) <= 1e-12 * (1 + fabs(ref_loss)), "%.17g vs %.17g", got,
                ref_loss);
      for (int j = 0; j < NP; j++) {
        nb_tensor *g = nb_grad_of(p[j]);
        cr_assert(g, "%s %d: grad %d: %s", su->mesh, kind, j, nb_last_error());
        /* the gradient is laid out like its leaf */
        cr_assert(nb_mesh_of(g) == m);
        cr_assert_str_eq(nb_sharding_str(g), nb_sharding_str(p[j]), "%s %d: grad %d", su->mesh,
                         kind, j);
        tc_assert_close_tol(g, ref[j], PSHAPE[j], 1e-12);
        free(ref[j]);
        free(pv[j]);
      }
      free(xv);
      nb_scope_end();
    }
    nb_mesh_release(m);
  }
}

/* Weights kept unsharded (requires-grad ordinary tensors) with sharded data:
 * every device's use of the one tensor adds into its .grad. */
Test(sharded_backward, unsharded_leaves_with_sharded_data) {
  uint64_t seed = 12;
  nb_mesh *m = nb_mesh_cpu("x=4,y=2");
  double *xv = rand_values(NB_SHAPE(N, D), &seed), *pv[NP], *ref[NP];
  for (int j = 0; j < NP; j++)
    pv[j] = rand_values(PSHAPE[j], &seed);
  ref_backward(xv, pv, LOSS_PARTIAL, ref);
  nb_tensor *x = nb_shard(tc_tensor(xv, NB_SHAPE(N, D), NB_F64), m, "(x, y), _"), *p[NP];
  for (int j = 0; j < NP; j++)
    p[j] = nb_set_requires_grad(tc_tensor(pv[j], PSHAPE[j], NB_F64), true);
  nb_tensor *loss = mlp_loss(x, p, LOSS_PARTIAL, NULL);
  cr_assert(nb_requires_grad(loss));
  cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
  for (int j = 0; j < NP; j++) {
    nb_tensor *g = nb_grad_of(p[j]);
    cr_assert(g && !nb_mesh_of(g));
    tc_assert_close_tol(g, ref[j], PSHAPE[j], 1e-12);
    free(ref[j]);
    free(pv[j]);
  }
  free(xv);
  nb_mesh_release(m);
}

/* A leaf whose devices hold one block in distinct objects (built here from
 * the physical tensors; each device computes its own): each object gets
 * its own part of the gradient, and nb_grad_of sums them into the leaf's
 * layout. */
Test(sharded_backward, grad_of_distinct_objects_is_their_sum) {
  uint64_t seed = 13;
  nb_mesh *m = tc_mesh_here("x=2,y=2", 4); /* the blocks are made on the default device */
  nb_shape s = NB_SHAPE(4, 6);
  double *wv = rand_values(s, &seed), *xv = rand_values(s, &seed);
  double *ref = malloc(sizeof *ref * 24); /* d/dw sum((w x)^2) = 2 w x^2 */
  for (int i = 0; i < 24; i++)
    ref[i] = 2 * wv[i] * xv[i] * xv[i];
  nbi_sharding ws;
  cr_assert_eq(nbi_sharding_parse("test", m, "x, _", 2, false, &ws), NB_OK);
  nb_tensor *phys[4];
  for (int d = 0; d < 4; d++) { /* device d's rows, its own object */
    int64_t r0 = 2 * nbi_dim_index(m, &ws, 0, d);
    phys[d] = tc_tensor(wv + r0 * 6, NB_SHAPE(2, 6), NB_F64);
  }
  nb_tensor *w = nbi_sharded_make("test", m, &ws, &s, NB_F64, phys);
  cr_assert(w, "%s", nb_last_error());
  tc_assert_close_tol(w, wv, s, 0);
  cr_assert(nb_set_requires_grad(w, true));
  nb_tensor *x = nb_shard(tc_tensor(xv, s, NB_F64), m, "_, y");
  nb_tensor *loss = nb_sum(nb_square(nb_mul(w, x)), NB_ALL, false);
  cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
  nb_tensor *g = nb_grad_of(w);
  cr_assert(g, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(g), nb_sharding_str(w));
  tc_assert_close_tol(g, ref, s, 1e-12);
  /* an assign keeps the four objects trainable */
  cr_assert_eq(nb_assign(w, nb_sub(w, g)), NB_OK, "%s", nb_last_error());
  for (int d = 0; d < 4; d++)
    cr_assert(w->phys[d] == phys[d] && nb_requires_grad(phys[d]));
  for (int i = 0; i < 24; i++)
    wv[i] -= ref[i];
  tc_assert_close_tol(w, wv, s, 1e-12);
  free(ref);
  free(wv);
  free(xv);
  nb_mesh_release(m);
}

/* PyTorch-style SGD: loss = f(W); backward; W <- W - lr * grad; zero_grad.
 * Five steps give the unsharded losses and weights. */
static void sgd(nb_mesh *m, const setup *su, const double *xv, double *const *pv, double *losses,
                double **final) {
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(N, D), NB_F64), *p[NP];
  char layout[NP][128];
  if (m) x = nb_shard(x, m, su->xspec);
  for (int j = 0; j < NP; j++) {
    p[j] = tc_tensor(pv[j], PSHAPE[j], NB_F64);
    if (m) p[j] = nb_shard(p[j], m, su->pspec[j]);
    cr_assert(nb_set_requires_grad(p[j], true), "%s", nb_last_error());
    snprintf(layout[j], sizeof layout[j], "%s", nb_sharding_str(p[j]));
  }
  for (int step = 0; step < 5; step++) {
    nb_scope_begin();
    nb_tensor *loss = mlp_loss(x, p, step % 2 ? LOSS_REPLICATED : LOSS_PARTIAL, NULL);
    cr_assert_eq(nb_backward(loss), NB_OK, "step %d: %s", step, nb_last_error());
    losses[step] = nb_item(loss);
    for (int j = 0; j < NP; j++) {
      nb_tensor *g = nb_grad_of(p[j]);
      cr_assert(g, "step %d: %s", step, nb_last_error());
      cr_assert_eq(nb_assign(p[j], nb_sub(p[j], nb_mul_scalar(g, 0.1))), NB_OK, "%s",
                   nb_last_error());
      cr_assert(nb_requires_grad(p[j]), "the leaf stays trainable");
      nb_zero_grad(p[j]);
      cr_assert_null(nb_grad_of(p[j]));
    }
    nb_scope_end();
  }
  for (int j = 0; j < NP; j++) {
    if (m) /* the leaf keeps its layout */
      cr_assert_str_eq(nb_sharding_str(p[j]), layout[j]);
    final[j] = tc_read(p[j]);
  }
}

Test(sharded_backward, sgd_loop_matches_the_unsharded_loop) {
  uint64_t seed = 14;
  for (size_t si = 0; si < sizeof SETUPS / sizeof *SETUPS; si++) {
    const setup *su = &SETUPS[si];
    nb_mesh *m = nb_mesh_cpu(su->mesh);
    double *xv = rand_values(NB_SHAPE(N, D), &seed), *pv[NP], ref_l[5], got_l[5], *ref_w[NP],
           *got_w[NP];
    for (int j = 0; j < NP; j++)
      pv[j] = rand_values(PSHAPE[j], &seed);
    sgd(NULL, su, xv, pv, ref_l, ref_w);
    sgd(m, su, xv, pv, got_l, got_w);
    for (int k = 0; k < 5; k++)
      cr_assert(fabs(got_l[k] - ref_l[k]) <= 1e-12 * (1 + fabs(ref_l[k])),
                "%s step %d: %.17g vs %.17g", su->mesh, k, got_l[k], ref_l[k]);
    for (int k = 1; k < 5; k++) /* it trains */
      cr_assert(ref_l[k] != ref_l[0]);
    for (int j = 0; j < NP; j++) {
      for (int64_t i = 0; i < tc_numel(PSHAPE[j]); i++)
        cr_assert(fabs(got_w[j][i] - ref_w[j][i]) <= 1e-12, "%s w%d[%lld]", su->mesh, j,
                  (long long)i);
      free(ref_w[j]);
      free(got_w[j]);
      free(pv[j]);
    }
    free(xv);
    nb_mesh_release(m);
  }
}

/* Gradients accumulate over two backward passes until nb_zero_grad; a
 * second backward through freed provenance is the usual error. */
Test(sharded_backward, accumulation_and_freed_provenance) {
  uint64_t seed = 15;
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  const setup *su = &SETUPS[4];
  double *xv = rand_values(NB_SHAPE(N, D), &seed), *pv[NP], *ref[NP];
  for (int j = 0; j < NP; j++)
    pv[j] = rand_values(PSHAPE[j], &seed);
  ref_backward(xv, pv, LOSS_PARTIAL, ref);
  nb_tensor *x = nb_shard(tc_tensor(xv, NB_SHAPE(N, D), NB_F64), m, su->xspec), *p[NP];
  for (int j = 0; j < NP; j++)
    p[j] =
        nb_set_requires_grad(nb_shard(tc_tensor(pv[j], PSHAPE[j], NB_F64), m, su->pspec[j]), true);
  cr_assert_null(nb_grad_of(p[0]));
  cr_assert_eq(nb_last_status(), NB_OK);
  nb_tensor *loss = mlp_loss(x, p, LOSS_PARTIAL, NULL);
  cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_backward(loss), NB_ERR_STATE);
  tc_assert_error(NB_ERR_STATE, "already freed");
  cr_assert_eq(nb_backward(mlp_loss(x, p, LOSS_ROWS, NULL)), NB_OK, "%s", nb_last_error());
  for (int j = 0; j < NP; j++) {
    for (int64_t i = 0; i < tc_numel(PSHAPE[j]); i++)
      ref[j][i] *= 2;
    tc_assert_close_tol(nb_grad_of(p[j]), ref[j], PSHAPE[j], 1e-12);
    nb_zero_grad(p[j]);
    cr_assert_null(nb_grad_of(p[j]));
    free(ref[j]);
    free(pv[j]);
  }
  /* a loss one leaf does not reach: that leaf's gradient is zeros, laid out like it */
  nb_tensor *part = nb_sum(nb_square(p[0]), NB_ALL, false);
  cr_assert_eq(nb_backward(part), NB_OK, "%s", nb_last_error());
  cr_assert_null(nb_grad_of(p[1]));
  free(xv);
  nb_mesh_release(m);
}

/* What stays an error: a partial leaf, a loss with no requires-grad input,
 * a non-scalar loss. set_requires_grad(false) clears the physical flags. */
Test(sharded_backward, errors) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  nb_tensor *t = nb_ones(NB_SHAPE(4, 4), NB_F64);
  nb_tensor *pt = nb_shard(t, m, "x, _ partial(y)");
  cr_assert_null(nb_set_requires_grad(pt, true));
  tc_assert_error(NB_ERR_SHARDING, "partial");
  nb_tensor *s = nb_shard(t, m, "x, y");
  cr_assert_eq(nb_backward(nb_sum(s, NB_ALL, false)), NB_ERR_STATE);
  tc_assert_error(NB_ERR_STATE, "does not depend");
  cr_assert(nb_set_requires_grad(s, true));
  cr_assert_eq(nb_backward(nb_square(s)), NB_ERR_SHAPE);
  tc_assert_error(NB_ERR_SHAPE, "one element");
  cr_assert(nb_set_requires_grad(s, false));
  cr_assert(!nb_requires_grad(nb_square(s)));
  cr_assert(!nb_requires_grad(s));
  nb_tensor *i = nb_shard(nb_zeros(NB_SHAPE(4), NB_I32), m, "x");
  cr_assert_null(nb_set_requires_grad(i, true));
  cr_assert_eq(nb_last_status(), NB_ERR_DTYPE);
  nb_clear_error();
  nb_mesh_release(m);
}
