/* test/test_tree.c — parameter trees (nabla/tree.h): the container, nesting by
 * dotted names, maps and arithmetic against C reference loops, and functions
 * of trees under nb_grad / nb_value_and_grad / nb_jit / nb_vmap /
 * nb_checkpoint (gradients checked against closed forms and against the
 * flat transforms, which test_golden.c holds to JAX). */
#include "common.h"

TestSuite(tree, .init = tc_setup, .fini = tc_teardown);

static nb_tensor *vec(const double *x, int64_t n, nb_dtype dt) {
  return tc_tensor(x, NB_SHAPE(n), dt);
}

static nb_tensor *rand_t(nb_shape s, nb_dtype dt, uint64_t seed) {
  int64_t n = tc_numel(s);
  double *x = tc_rand_floats(n, dt, &seed);
  nb_tensor *t = tc_tensor(x, s, dt);
  free(x);
  return t;
}

static void assert_same_values(nb_tensor *a, nb_tensor *b, double tol) {
  cr_assert(a && b, "%s", nb_last_error());
  cr_assert(nbi_shape_eq(&a->shape, &b->shape));
  int64_t n = nb_numel(a);
  double *x = tc_read(a), *y = tc_read(b);
  for (int64_t i = 0; i < n; i++)
    cr_assert(fabs(x[i] - y[i]) <= tol * (1 + fabs(y[i])), "element %lld: %.17g vs %.17g",
              (long long)i, x[i], y[i]);
  free(x);
  free(y);
}

/* ---- the container ------------------------------------------------------------------ */
Test(tree, keeps_insertion_order_and_replaces_in_place) {
  nb_tree *t = nb_tree_create();
  double a[2] = {1, 2}, b[3] = {3, 4, 5}, c[1] = {6};
  cr_assert(nb_tree_set(t, "h.0.w", vec(a, 2, NB_F32)) == NB_OK);
  cr_assert(nb_tree_set(t, "h.0.b", vec(b, 3, NB_F32)) == NB_OK);
  cr_assert(nb_tree_set(t, "wte", vec(c, 1, NB_F64)) == NB_OK);
  cr_assert_eq(nb_tree_len(t), 3);
  cr_assert_str_eq(nb_tree_name(t, 1), "h.0.b");
  cr_assert_eq(nb_tree_find(t, "wte"), 2);
  cr_assert_eq(nb_tree_find(t, "nope"), -1);
  cr_assert_null(nb_tree_get(t, "nope"));
  cr_assert_eq(nb_last_status(), NB_OK, "a missing name is not an error");
  nb_tensor *w2 = vec(c, 1, NB_F32);
  cr_assert(nb_tree_set(t, "h.0.w", w2) == NB_OK);
  cr_assert_eq(nb_tree_len(t), 3);
  cr_assert_eq(nb_tree_at(t, 0), w2, "replacing keeps the place");
  cr_assert_eq(nb_tree_numel(t), 5);
  cr_assert(nb_tree_remove(t, "h.0.b") == NB_OK);
  cr_assert_str_eq(nb_tree_name(t, 1), "wte");
  cr_assert_eq(nb_tree_find(t, "wte"), 1);
  nb_tree_release(t);
}

Test(tree, holds_many_entries_with_a_working_index) {
  nb_tree *t = nb_tree_create();
  char name[32];
  for (int i = 0; i < 1000; i++) {
    snprintf(name, sizeof name, "layer.%d.w", i);
    cr_assert(nb_tree_set(t, name, nb_scalar(i, NB_F32)) == NB_OK);
  }
  cr_assert_eq(nb_tree_len(t), 1000);
  for (int i = 0; i < 1000; i += 37) {
    snprintf(name, sizeof name, "layer.%d.w", i);
    cr_assert_eq(nb_tree_find(t, name), i);
    cr_assert_eq(nb_item(nb_tree_get(t, name)), i);
  }
  nb_tree_release(t);
}

Test(tree, rejects_bad_names_and_null_arguments) {
  nb_tree *t = nb_tree_create();
  nb_tensor *x = nb_scalar(1, NB_F32);
  const char *bad[] = {"", ".a", "a.", "a..b"};
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(nb_tree_set(t, bad[i], x), NB_ERR_ARG);
    tc_assert_error(NB_ERR_ARG, "nb_tree_set");
  }
  cr_assert_eq(nb_tree_set(t, "a", NULL), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "nb_tree_set: the tensor for \"a\" is NULL");
  cr_assert_eq(nb_tree_set(NULL, "a", x), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "nb_tree_set");
  cr_assert_null(nb_tree_at(t, 0));
  tc_assert_error(NB_ERR_INDEX, "nb_tree_at: index 0 is out of range");
  cr_assert_eq(nb_tree_remove(t, "zz"), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "nb_tree_remove: the tree has no entry \"zz\"");
  cr_assert_eq(nb_tree_len(NULL), -1);
  nb_tree_release(t);
}

Test(tree, nests_by_dotted_names) {
  nb_tree *block = nb_tree_create(), *gpt = nb_tree_create();
  cr_assert(nb_tree_set(block, "attn.w_q", nb_scalar(1, NB_F32)) == NB_OK);
  cr_assert(nb_tree_set(block, "mlp.w1", nb_scalar(2, NB_F32)) == NB_OK);
  cr_assert(nb_tree_set_tree(gpt, "h.0", block) == NB_OK);
  cr_assert(nb_tree_set_tree(gpt, "h.1", block) == NB_OK);
  cr_assert(nb_tree_set(gpt, "h.10.x", nb_scalar(3, NB_F32)) == NB_OK);
  cr_assert_eq(nb_tree_len(gpt), 5);
  cr_assert_str_eq(nb_tree_name(gpt, 2), "h.1.attn.w_q");
  nb_tree *h1 = nb_tree_subtree(gpt, "h.1");
  cr_assert_eq(nb_tree_len(h1), 2, "\"h.1\" does not match \"h.10\"");
  cr_assert_str_eq(nb_tree_name(h1, 1), "mlp.w1");
  cr_assert(nb_tree_same_structure(h1, block, true));
  nb_tree *h = nb_tree_subtree(gpt, "h");
  cr_assert_eq(nb_tree_len(h), 5);
  cr_assert_str_eq(nb_tree_name(h, 0), "0.attn.w_q");
  nb_tree_release(h);
  nb_tree_release(h1);
  nb_tree_release(gpt);
  nb_tree_release(block);
}

/* ---- maps and arithmetic -------------------------------------------------------------------- */
static nb_tensor *twice(void *user, const char *name, nb_tensor *x) {
  (void)name;
  ++*(int *)user;
  return nb_mul_scalar(x, 2);
}

static nb_tensor *sum_of(void *user, const char *name, nb_tensor *const *xs, int n) {
  (void)user, (void)name;
  nb_tensor *s = xs[0];
  for (int k = 1; k < n; k++)
    s = nb_add(s, xs[k]);
  return s;
}

static nb_tensor *fail_on_b(void *user, const char *name, nb_tensor *x) {
  (void)user;
  return strcmp(name, "b") ? x : NULL;
}

Test(tree, map_and_zip_apply_name_by_name) {
  double a[2] = {1, 2}, b[3] = {3, 4, 5};
  nb_tree *t = nb_tree_create(), *u = nb_tree_create();
  nb_tree_set(t, "a", vec(a, 2, NB_F64));
  nb_tree_set(t, "b", vec(b, 3, NB_F64));
  nb_tree_set(u, "a", vec(b, 2, NB_F64));
  nb_tree_set(u, "b", vec(b, 3, NB_F64));
  int calls = 0;
  nb_tree *m = nb_tree_map(t, twice, &calls);
  cr_assert_eq(calls, 2);
  tc_assert_close(nb_tree_get(m, "b"), (double[]){6, 8, 10}, NB_SHAPE(3));
  nb_tree *zs[3] = {t, u, m};
  nb_tree *z = nb_tree_zip(zs, 3, sum_of, NULL);
  tc_assert_close(nb_tree_get(z, "a"), (double[]){1 + 3 + 2, 2 + 4 + 4}, NB_SHAPE(2));
  tc_assert_close(nb_tree_get(z, "b"), (double[]){3 + 3 + 6, 4 + 4 + 8, 5 + 5 + 10}, NB_SHAPE(3));
  cr_assert_null(nb_tree_map(t, fail_on_b, NULL));
  tc_assert_error(NB_ERR_ARG, "nb_tree_map: the callback returned NULL for \"b\"");
  nb_tree *other = nb_tree_create();
  nb_tree_set(other, "a", vec(a, 2, NB_F64));
  nb_tree_set(other, "c", vec(a, 2, NB_F64));
  nb_tree *bad[2] = {t, other};
  cr_assert_null(nb_tree_zip(bad, 2, sum_of, NULL));
  tc_assert_error(NB_ERR_ARG, "nb_tree_zip: the trees differ at entry 1: \"b\" and \"c\"");
  nb_tree_release(other);
  nb_tree_release(z);
  nb_tree_release(m);
  nb_tree_release(u);
  nb_tree_release(t);
}

Test(tree, axpy_and_global_norm_pass_integer_leaves_through) {
  double x[3] = {1, -2, 3}, y[3] = {0.5, 0.25, -1}, k[2] = {7, 9};
  nb_tree *tx = nb_tree_create(), *ty = nb_tree_create();
  nb_tree_set(tx, "w", vec(x, 3, NB_F32));
  nb_tree_set(tx, "tok", vec(k, 2, NB_I64));
  nb_tree_set(ty, "w", vec(y, 3, NB_F32));
  nb_tree_set(ty, "tok", vec(k, 2, NB_I64));
  nb_tree *r = nb_tree_axpy(-0.5, tx, ty);
  tc_assert_close(nb_tree_get(r, "w"), (double[]){0, 1.25, -2.5}, NB_SHAPE(3));
  cr_assert_eq(nb_tree_get(r, "tok"), nb_tree_get(ty, "tok"), "integers pass through");
  nb_tensor *n = nb_tree_global_norm(tx);
  cr_assert_eq(nb_ndim(n), 0);
  cr_assert_float_eq(nb_item(n), sqrt(1 + 4 + 9), 1e-6);
  nb_tree *z = nb_tree_zeros_like(tx);
  cr_assert_eq(nb_dtype_of(nb_tree_get(z, "tok")), NB_I64);
  cr_assert_eq(nb_item(nb_tree_global_norm(z)), 0);
  nb_tree_release(z);
  nb_tree_release(r);
  nb_tree_release(ty);
  nb_tree_release(tx);
}

/* ---- functions of trees -----------------------------------------------------------------------
 */
enum { N_LAYERS = 6 }; /* 12 tensors: more than an nb_axes list holds */

/* in[0]: params {"l<i>.w" [3,3], "l<i>.b" [3]}; in[1]: batch {"x" f [B,3],
 * "labels" i64 [B]}. out[0]: {"loss"}, out[1]: {"logits"}. A tanh MLP with
 * cross-entropy over 3 classes. */
static nb_status mlp_body(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  if (user) ++*(int *)user;
  nb_tensor *h = nb_tree_get(in[1], "x");
  char w[32], b[32];
  for (int i = 0; i < N_LAYERS; i++) {
    snprintf(w, sizeof w, "l%d.w", i);
    snprintf(b, sizeof b, "l%d.b", i);
    h = nb_add(nb_matmul(h, nb_tree_get(in[0], w)), nb_tree_get(in[0], b));
    if (i + 1 < N_LAYERS) h = nb_tanh(h);
  }
  nb_tensor *lab = nb_tree_get(in[1], "labels");
  nb_tensor *lp = nb_log_softmax(h, -1);
  nb_tensor *pick = nb_take_along_axis(lp, nb_unsqueeze(lab, -1), -1);
  nb_tensor *loss = nb_neg(nb_mean(pick, NB_ALL, false));
  out[0] = nb_tree_create();
  out[1] = nb_tree_create();
  if (!loss) return nb_last_status();
  nb_tree_set(out[0], "loss", loss);
  nb_tree_set(out[1], "logits", h);
  return NB_OK;
}

/* The same model as a function of 14 tensors: 12 params, x, labels. */
static nb_status mlp_flat(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *h = in[12];
  for (int i = 0; i < N_LAYERS; i++) {
    h = nb_add(nb_matmul(h, in[2 * i]), in[2 * i + 1]);
    if (i + 1 < N_LAYERS) h = nb_tanh(h);
  }
  nb_tensor *lp = nb_log_softmax(h, -1);
  nb_tensor *pick = nb_take_along_axis(lp, nb_unsqueeze(in[13], -1), -1);
  out[0] = nb_neg(nb_mean(pick, NB_ALL, false));
  return out[0] ? NB_OK : nb_last_status();
}

static nb_tree *mlp_params(nb_dtype dt) {
  nb_tree *p = nb_tree_create();
  char name[32];
  for (int i = 0; i < N_LAYERS; i++) {
    snprintf(name, sizeof name, "l%d.w", i);
    nb_tree_set(p, name, rand_t(NB_SHAPE(3, 3), dt, 100 + (uint64_t)i));
    snprintf(name, sizeof name, "l%d.b", i);
    nb_tree_set(p, name, rand_t(NB_SHAPE(3), dt, 200 + (uint64_t)i));
  }
  return p;
}

static nb_tree *mlp_batch(int64_t B, nb_dtype dt, uint64_t seed) {
  nb_tree *b = nb_tree_create();
  nb_tree_set(b, "x", rand_t(NB_SHAPE(B, 3), dt, seed));
  double *lab = malloc(sizeof *lab * (size_t)B);
  for (int64_t i = 0; i < B; i++)
    lab[i] = (double)((i * 7 + (int64_t)seed) % 3);
  nb_tree_set(b, "labels", tc_tensor(lab, NB_SHAPE(B), NB_I64));
  free(lab);
  return b;
}

/* in: the 12 params, x, labels as the flat function takes them */
static void flat_args(nb_tree *p, nb_tree *b, nb_tensor **in) {
  for (int i = 0; i < 12; i++)
    in[i] = nb_tree_at(p, i);
  in[12] = nb_tree_get(b, "x");
  in[13] = nb_tree_get(b, "labels");
}

Test(tree, grad_of_a_tree_function_matches_the_flat_gradient) {
  nb_tree *p = mlp_params(NB_F64), *b = mlp_batch(5, NB_F64, 1);
  nb_fn *f = nb_fn_create_trees(mlp_body, NULL, 2, 2);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0));
  cr_assert(vg, "%s", nb_last_error());
  cr_assert(nb_fn_takes_trees(vg));
  cr_assert_eq(nb_fn_n_out(vg), 3, "loss tree, logits tree, gradient tree");
  nb_tree *in[2] = {p, b}, *out[3];
  cr_assert(nb_call_trees(vg, in, out) == NB_OK, "%s", nb_last_error());
  cr_assert(nb_tree_same_structure(out[2], p, true), "the gradient is shaped like the params");
  /* reference: the flat function, argnums listing all 12 params */
  int args[12];
  for (int i = 0; i < 12; i++)
    args[i] = i;
  nb_fn *ff = nb_fn_create(mlp_flat, NULL, 14, 1), *fvg = nb_value_and_grad_argnums(ff, args, 12);
  nb_tensor *fin[14], *fout[13];
  flat_args(p, b, fin);
  cr_assert(nb_call(fvg, fin, fout) == NB_OK, "%s", nb_last_error());
  assert_same_values(nb_tree_get(out[0], "loss"), fout[0], 1e-12);
  for (int i = 0; i < 12; i++)
    assert_same_values(nb_tree_at(out[2], i), fout[1 + i], 1e-12);
  for (int k = 0; k < 3; k++)
    nb_tree_release(out[k]);
  nb_fn_release(fvg);
  nb_fn_release(ff);
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_tree_release(b);
  nb_tree_release(p);
}

/* loss = sum_i c_i * sum(w_i^2) over a tree of 20 tensors: d/dw_i = 2 c_i w_i */
static nb_status quad_body(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *s = nb_scalar(0, NB_F64);
  for (int i = 0; i < nb_tree_len(in[0]); i++) {
    nb_tensor *w = nb_tree_at(in[0], i);
    if (nb_dtype_is_float(nb_dtype_of(w)))
      s = nb_add(s, nb_mul_scalar(nb_sum(nb_square(w), NB_ALL, false), i + 1));
  }
  out[0] = nb_tree_create();
  return nb_tree_set(out[0], "loss", s);
}

Test(tree, grad_covers_any_number_of_tensors_and_zeros_integer_leaves) {
  nb_tree *p = nb_tree_create();
  char name[32];
  for (int i = 0; i < 20; i++) {
    snprintf(name, sizeof name, "w%d", i);
    nb_tree_set(p, name, rand_t(NB_SHAPE(2, (int64_t)(i % 3) + 1), NB_F64, (uint64_t)i));
  }
  nb_tree_set(p, "step", nb_scalar(4, NB_I64));
  nb_fn *f = nb_fn_create_trees(quad_body, NULL, 1, 1), *g = nb_grad(f, NB_ALL);
  nb_tree *out;
  cr_assert(nb_call_trees(g, &p, &out) == NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_tree_len(out), 21);
  for (int i = 0; i < 20; i++) {
    nb_tensor *w = nb_tree_at(p, i);
    int64_t n = nb_numel(w);
    double *x = tc_read(w), *ref = malloc(sizeof *ref * (size_t)n);
    for (int64_t k = 0; k < n; k++)
      ref[k] = 2.0 * (i + 1) * x[k];
    tc_assert_close(nb_tree_at(out, i), ref, nb_shape_of(w));
    free(x);
    free(ref);
  }
  nb_tensor *z = nb_tree_get(out, "step");
  cr_assert_eq(nb_dtype_of(z), NB_I64);
  cr_assert_eq(nb_item(z), 0);
  nb_tree_release(out);
  nb_fn_release(g);
  nb_fn_release(f);
  nb_tree_release(p);
}

Test(tree, jit_of_value_and_grad_replays_and_sees_new_batches) {
  nb_tree *p = mlp_params(NB_F64);
  int calls = 0;
  nb_fn *f = nb_fn_create_trees(mlp_body, &calls, 2, 2), *vg = nb_value_and_grad(f, NB_AXES(0));
  nb_fn *jvg = nb_jit(vg), *ff = nb_fn_create(mlp_flat, NULL, 14, 1);
  nb_fn *fvg = nb_value_and_grad_argnums(ff, (int[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 12);
  nb_reset_stats();
  for (int it = 0; it < 4; it++) {
    nb_scope_begin();
    nb_tree *b = mlp_batch(4, NB_F64, 10 + (uint64_t)it), *in[2] = {p, b}, *out[3];
    cr_assert(nb_call_trees(jvg, in, out) == NB_OK, "%s", nb_last_error());
    nb_tensor *fin[14], *fout[13];
    flat_args(p, b, fin);
    cr_assert(nb_call(fvg, fin, fout) == NB_OK);
    assert_same_values(nb_tree_get(out[0], "loss"), fout[0], 1e-12);
    assert_same_values(nb_tree_get(out[2], "l3.w"), fout[7], 1e-12);
    for (int k = 0; k < 3; k++)
      nb_tree_release(out[k]);
    nb_tree_release(b);
    nb_scope_end();
  }
  /* the body ran to learn the outputs' names, to trace the jit once, and for
   * the flat reference never */
  cr_assert_eq(calls, 2, "body calls: %d", calls);
  cr_assert_eq(nb_get_stats().jit_cache_misses, 1);
  cr_assert_eq(nb_get_stats().jit_cache_hits, 3);
  nb_fn_release(fvg);
  nb_fn_release(ff);
  nb_fn_release(jvg);
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_tree_release(p);
}

Test(tree, vmap_of_grad_gives_per_example_gradients) {
  nb_tree *p = mlp_params(NB_F64), *b = mlp_batch(3, NB_F64, 7);
  nb_fn *f = nb_fn_create_trees(mlp_body, NULL, 2, 2), *g = nb_grad(f, NB_AXES(0));
  nb_fn *pg = nb_vmap(g, (int[]){NB_NOT_MAPPED, 0}, NULL);
  cr_assert(pg, "%s", nb_last_error());
  nb_tree *in[2] = {p, b}, *out;
  cr_assert(nb_call_trees(pg, in, &out) == NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_shape_of(nb_tree_get(out, "l0.w")).dims[0], 3);
  for (int64_t e = 0; e < 3; e++) { /* example e alone, as a batch of one */
    nb_scope_begin();
    nb_tree *one = nb_tree_create();
    int64_t s0[2] = {e, 0}, s1[2] = {e + 1, NB_END}, l0 = e, l1 = e + 1;
    nb_tree_set(one, "x", nb_slice(nb_tree_get(b, "x"), s0, s1, NULL));
    nb_tree_set(one, "labels", nb_slice(nb_tree_get(b, "labels"), &l0, &l1, NULL));
    nb_tree *in1[2] = {p, one}, *g1;
    cr_assert(nb_call_trees(g, in1, &g1) == NB_OK, "%s", nb_last_error());
    for (int i = 0; i < 12; i++) {
      nb_tensor *row = nb_squeeze(nb_slice(nb_tree_at(out, i), (int64_t[]){e, 0, 0},
                                           (int64_t[]){e + 1, NB_END, NB_END}, NULL),
                                  NB_AXES(0));
      assert_same_values(row, nb_tree_at(g1, i), 1e-12);
    }
    nb_tree_release(g1);
    nb_tree_release(one);
    nb_scope_end();
  }
  nb_tree_release(out);
  nb_fn_release(pg);
  nb_fn_release(g);
  nb_fn_release(f);
  nb_tree_release(b);
  nb_tree_release(p);
}

Test(tree, checkpoint_of_a_tree_function_keeps_values_and_gradients) {
  nb_tree *p = mlp_params(NB_F64), *b = mlp_batch(4, NB_F64, 3);
  nb_fn *f = nb_fn_create_trees(mlp_body, NULL, 2, 2), *c = nb_checkpoint(f);
  nb_fn *g = nb_grad(f, NB_AXES(0)), *gc = nb_grad(c, NB_AXES(0));
  nb_tree *in[2] = {p, b}, *o1, *o2;
  cr_assert(nb_call_trees(g, in, &o1) == NB_OK, "%s", nb_last_error());
  cr_assert(nb_call_trees(gc, in, &o2) == NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 12; i++)
    assert_same_values(nb_tree_at(o2, i), nb_tree_at(o1, i), 1e-12);
  nb_tree_release(o2);
  nb_tree_release(o1);
  nb_fn_release(gc);
  nb_fn_release(g);
  nb_fn_release(c);
  nb_fn_release(f);
  nb_tree_release(b);
  nb_tree_release(p);
}

/* NB_ALL over a flat function with an integer input: zeros, not an error. */
Test(tree, nb_all_passes_integer_inputs_of_a_flat_function) {
  nb_tree *p = mlp_params(NB_F64), *b = mlp_batch(4, NB_F64, 5);
  nb_fn *ff = nb_fn_create(mlp_flat, NULL, 14, 1), *g = nb_grad(ff, NB_ALL);
  nb_tensor *in[14], *out[14];
  flat_args(p, b, in);
  cr_assert(nb_call(g, in, out) == NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_dtype_of(out[13]), NB_I64);
  cr_assert_eq(nb_item(nb_sum(nb_abs(out[13]), NB_ALL, false)), 0);
  /* an explicit list naming the integer input is still an error */
  nb_fn *bad = nb_grad_argnums(ff, (int[]){0, 13}, 2);
  cr_assert_eq(nb_call(bad, in, out), NB_ERR_DTYPE);
  tc_assert_error(NB_ERR_DTYPE, "input 13 is i64");
  nb_fn_release(bad);
  nb_fn_release(g);
  nb_fn_release(ff);
  nb_tree_release(b);
  nb_tree_release(p);
}

static nb_status rename_body(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  int *calls = user;
  out[0] = nb_tree_create();
  /* a different output name on every call: its structure is not a function
   * of its inputs' */
  return nb_tree_set(out[0], ++*calls % 2 ? "a" : "b",
                     nb_sum(nb_square(nb_tree_at(in[0], 0)), NB_ALL, false));
}

Test(tree, errors_name_the_function_and_the_problem) {
  nb_tree *p = mlp_params(NB_F64);
  nb_fn *f = nb_fn_create_trees(mlp_body, NULL, 2, 2);
  nb_tensor *x = nb_scalar(1, NB_F32), *o[2];
  cr_assert_eq(nb_call(f, &x, o), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "call it with nb_call_trees");
  cr_assert_null(nb_jacrev(f, NB_AXES(0)));
  tc_assert_error(NB_ERR_ARG, "nb_jacrev: f takes trees");
  cr_assert_null(nb_grad(f, NB_AXES(2)));
  tc_assert_error(NB_ERR_ARG, "nb_grad: argnums[0] = 2 is out of range (f takes 2 trees)");
  nb_tree *none = NULL, *two[2] = {p, NULL}, *out[2];
  cr_assert_eq(nb_call_trees(f, two, out), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "nb_call_trees: input tree 1 is NULL");
  nb_fn *flat = nb_fn_create(mlp_flat, NULL, 14, 1);
  cr_assert_eq(nb_call_trees(flat, &none, out), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "nb_call_trees: f takes tensors");
  int calls = 0;
  nb_fn *r = nb_fn_create_trees(rename_body, &calls, 1, 1), *gr = nb_grad(r, NB_ALL);
  nb_tree *g;
  cr_assert_eq(nb_call_trees(gr, &p, &g), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "other names or dtypes");
  nb_fn_release(gr);
  nb_fn_release(r);
  nb_fn_release(flat);
  nb_fn_release(f);
  nb_tree_release(p);
}
