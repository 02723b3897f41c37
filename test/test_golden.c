/* test/test_golden.c — grad / value_and_grad / jacrev / jacfwd / hessian, a third
 * derivative, and derivatives under vmap, jit and control flow (scan, cond,
 * fori_loop) of composite functions, against golden values computed by JAX
 * in float64 (test/golden/autodiff.txt, written by test/golden/gen_golden.py).
 * Each function here is the twin of the one with the same case name in the
 * generator; the inputs are read from the file, so both sides evaluate at the
 * same points. Results must match to 1e-9 relative. */
#include <inttypes.h>
#include <stdio.h>

#include "common.h"
#include "golden_file.h"

TestSuite(golden, .init = tc_setup, .fini = tc_teardown);

#define GD_TOL 1e-9

/* ---- the golden file ----------------------------------------------------------------
 * test/golden/autodiff.txt, read by golden_file.h (a case is a list of named records:
 * inputs and expected outputs, each a dtype, a shape and row-major values). */
#define GD_MAX_RECS GF_MAX_RECS
typedef gf_rec gd_rec;
typedef gf_case gd_case;

static gd_case *gd_load(const char *name) { return gf_load("autodiff.txt", name); }
#define gd_free gf_free
#define gd_find gf_find

/* The record as a tensor of its dtype. */
static nb_tensor *gd_tensor(const gd_case *c, const char *name) {
  return gf_tensor(c, name, NB_DTYPE_COUNT);
}

/* Asserts t is f64 with the record's shape and |t - want| <= GD_TOL (1 + |want|)
 * elementwise. `what` names the transform in messages. */
static void gd_expect(const gd_case *c, const char *what, const char *name, nb_tensor *t) {
  const gd_rec *r = gd_find(c, name);
  cr_assert(t, "%s %s %s: NULL result: %s", c->name, what, name, nb_last_error());
  char got_s[96], want_s[96];
  nb_shape s = nb_shape_of(t);
  nb_shape_str(s, got_s, sizeof got_s);
  nb_shape_str(r->shape, want_s, sizeof want_s);
  cr_assert(nbi_shape_eq(&s, &r->shape), "%s %s %s: shape %s, expected %s", c->name, what, name,
            got_s, want_s);
  cr_assert_eq(nb_dtype_of(t), NB_F64, "%s %s %s: dtype %s", c->name, what, name,
               nb_dtype_name(nb_dtype_of(t)));
  double *got = tc_read(t);
  for (int64_t i = 0; i < tc_numel(s); i++) {
    double want = r->v[i];
    cr_assert(fabs(got[i] - want) <= GD_TOL * (1 + fabs(want)),
              "%s %s %s element %lld: got %.17g, JAX %.17g", c->name, what, name, (long long)i,
              got[i], want);
  }
  free(got);
}

/* Calls f on the named inputs and checks its outputs against the named records;
 * releases f. */
static void gd_run(const gd_case *c, const char *what, nb_fn *f, const char *const *ins,
                   const char *const *outs) {
  cr_assert(f, "%s %s: %s", c->name, what, nb_last_error());
  int n_in = nb_fn_n_in(f), n_out = nb_fn_n_out(f);
  nb_tensor *in[GD_MAX_RECS], *out[GD_MAX_RECS];
  for (int i = 0; i < n_in; i++)
    in[i] = gd_tensor(c, ins[i]);
  cr_assert_eq(nb_call(f, in, out), NB_OK, "%s %s: %s", c->name, what, nb_last_error());
  for (int o = 0; o < n_out; o++)
    gd_expect(c, what, outs[o], out[o]);
  nb_fn_release(f);
}

#define GD_NAMES(...) ((const char *const[]){__VA_ARGS__})

/* Stores out[0] and reports the thread's error if the chain failed. */
static nb_status gd_ret(nb_tensor **out, nb_tensor *t) {
  out[0] = t;
  return t ? NB_OK : nb_last_status();
}

static nb_tensor *sum_all(nb_tensor *t) { return nb_sum(t, NB_ALL, false); }

/* ---- hessian of sum(sin(x)), x [2,3] -> [2,3,2,3] ------------------------------ */
static nb_status sum_sin_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                              int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, sum_all(nb_sin(in[0])));
}

Test(golden, hessian_of_sum_sin) {
  gd_case *c = gd_load("hess_sum_sin");
  nb_fn *f = nb_fn_create(sum_sin_body, NULL, 1, 1);
  gd_run(c, "hessian", nb_hessian(f, NB_AXES(0)), GD_NAMES("x"), GD_NAMES("h"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- two-layer MLP ---------------------------------------------------------------
 * in: x [8,3], y [8,1], W1 [3,5], b1 [5], W2 [5,1], b2 [1]; params are inputs 2..5
 *   pred = tanh(relu(x @ W1 + b1) @ W2 + b2)   [8,1]
 *   loss = mean((pred - y)^2)                   [] */
static nb_tensor *mlp_pred(nb_tensor *const *in) {
  nb_tensor *h = nb_relu(nb_add(nb_matmul(in[0], in[2]), in[3]));
  return nb_tanh(nb_add(nb_matmul(h, in[4]), in[5]));
}

static nb_tensor *mlp_loss(nb_tensor *const *in, nb_tensor *pred) {
  return nb_mean(nb_square(nb_sub(pred, in[1])), NB_ALL, false);
}

static nb_status mlp_loss_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, mlp_loss(in, mlp_pred(in)));
}

/* out: loss, pred */
static nb_status mlp_both_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)user, (void)n_in, (void)n_out;
  out[1] = mlp_pred(in);
  out[0] = mlp_loss(in, out[1]);
  return out[0] ? NB_OK : nb_last_status();
}

#define MLP_INS GD_NAMES("x", "y", "W1", "b1", "W2", "b2")
#define MLP_PARAMS NB_AXES(2, 3, 4, 5)

Test(golden, mlp_loss_grad_wrt_all_params) {
  gd_case *c = gd_load("mlp");
  nb_fn *f = nb_fn_create(mlp_loss_body, NULL, 6, 1);
  gd_run(c, "call", nb_fn_retain(f), MLP_INS, GD_NAMES("loss"));
  gd_run(c, "grad", nb_grad(f, MLP_PARAMS), MLP_INS,
         GD_NAMES("grad_W1", "grad_b1", "grad_W2", "grad_b2"));
  gd_run(c, "value_and_grad", nb_value_and_grad(f, MLP_PARAMS), MLP_INS,
         GD_NAMES("loss", "grad_W1", "grad_b1", "grad_W2", "grad_b2"));
  nb_fn_release(f);
  gd_free(c);
}

/* Two outputs times four params: eight Jacobians, output-major. */
#define MLP_JACS                                                                                   \
  GD_NAMES("jac_loss_W1", "jac_loss_b1", "jac_loss_W2", "jac_loss_b2", "jac_pred_W1",              \
           "jac_pred_b1", "jac_pred_W2", "jac_pred_b2")

Test(golden, mlp_jacrev_two_outputs) {
  gd_case *c = gd_load("mlp");
  nb_fn *f = nb_fn_create(mlp_both_body, NULL, 6, 2);
  gd_run(c, "jacrev", nb_jacrev(f, MLP_PARAMS), MLP_INS, MLP_JACS);
  nb_fn_release(f);
  gd_free(c);
}

Test(golden, mlp_jacfwd_two_outputs) {
  gd_case *c = gd_load("mlp");
  nb_fn *f = nb_fn_create(mlp_both_body, NULL, 6, 2);
  gd_run(c, "jacfwd", nb_jacfwd(f, MLP_PARAMS), MLP_INS, MLP_JACS);
  nb_fn_release(f);
  gd_free(c);
}

/* ---- softmax(x @ W, -1): x [4,3], W [3,5] -> [4,5]; jacobians [4,5,4,3], [4,5,3,5] */
static nb_status softmax_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                              int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, nb_softmax(nb_matmul(in[0], in[1]), -1));
}

Test(golden, softmax_matmul_jacrev_and_jacfwd) {
  gd_case *c = gd_load("softmax_matmul");
  nb_fn *f = nb_fn_create(softmax_body, NULL, 2, 1);
  gd_run(c, "jacrev", nb_jacrev(f, NB_AXES(0, 1)), GD_NAMES("x", "W"), GD_NAMES("jac_x", "jac_W"));
  gd_run(c, "jacfwd", nb_jacfwd(f, NB_AXES(0, 1)), GD_NAMES("x", "W"), GD_NAMES("jac_x", "jac_W"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- logsumexp(A @ x): A [5,4], x [4]; hessian wrt argnum 1 -> [4,4] ------------ */
static nb_status lse_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, nb_logsumexp(nb_matmul(in[0], in[1]), NB_ALL, false));
}

Test(golden, hessian_of_logsumexp_matvec) {
  gd_case *c = gd_load("hess_logsumexp");
  nb_fn *f = nb_fn_create(lse_body, NULL, 2, 1);
  gd_run(c, "hessian", nb_hessian(f, NB_AXES(1)), GD_NAMES("A", "x"), GD_NAMES("h"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- layer norm summed with weights: x [3,4], w [4] -----------------------------
 *   sum(w * (x - mean(x, -1)) / sqrt(var(x, -1) + 1e-5)); hessian wrt x [3,4,3,4] */
static nb_status layer_norm_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                 int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *x = in[0];
  nb_tensor *mu = nb_mean(x, NB_AXES(-1), true), *var = nb_var(x, NB_AXES(-1), true);
  nb_tensor *y = nb_div(nb_sub(x, mu), nb_sqrt(nb_add_scalar(var, 1e-5)));
  return gd_ret(out, sum_all(nb_mul(in[1], y)));
}

Test(golden, hessian_of_layer_norm) {
  gd_case *c = gd_load("hess_layer_norm");
  nb_fn *f = nb_fn_create(layer_norm_body, NULL, 2, 1);
  gd_run(c, "hessian", nb_hessian(f, NB_AXES(0)), GD_NAMES("x", "w"), GD_NAMES("h"));
  gd_run(c, "grad", nb_grad(f, NB_AXES(1)), GD_NAMES("x", "w"), GD_NAMES("grad_w"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- third derivative of sum(tanh(x)^3), x [3] -> [3,3,3] ----------------------- */
static nb_status tanh3_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, sum_all(nb_pow_scalar(nb_tanh(in[0]), 3)));
}

Test(golden, third_derivative_jacfwd_jacfwd_jacrev) {
  gd_case *c = gd_load("third_tanh3");
  nb_fn *f = nb_fn_create(tanh3_body, NULL, 1, 1);
  nb_fn *g = nb_jacrev(f, NB_AXES(0));
  nb_fn *h = nb_jacfwd(g, NB_AXES(0));
  gd_run(c, "jacfwd(jacfwd(jacrev))", nb_jacfwd(h, NB_AXES(0)), GD_NAMES("x"), GD_NAMES("d3"));
  nb_fn_release(h);
  nb_fn_release(g);
  nb_fn_release(f);
  gd_free(c);
}

Test(golden, third_derivative_jacfwd_of_hessian) {
  gd_case *c = gd_load("third_tanh3");
  nb_fn *f = nb_fn_create(tanh3_body, NULL, 1, 1);
  nb_fn *h = nb_hessian(f, NB_AXES(0));
  gd_run(c, "jacfwd(hessian)", nb_jacfwd(h, NB_AXES(0)), GD_NAMES("x"), GD_NAMES("d3"));
  nb_fn_release(h);
  nb_fn_release(f);
  gd_free(c);
}

/* ---- cross-entropy with integer labels ------------------------------------------
 * in: W [3,4], b [4], x [6,3], labels [6] (i64, not differentiated)
 *   loss = -mean_i sum_k one_hot(labels)[i,k] * log_softmax(x @ W + b)[i,k]
 * (JAX picks the label's entry with take_along_axis: the same value.) */
static nb_status xent_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *lp = nb_log_softmax(nb_add(nb_matmul(in[2], in[0]), in[1]), -1);
  nb_tensor *oh = nb_one_hot(in[3], nb_shape_of(in[0]).dims[1], NB_F64);
  return gd_ret(out, nb_neg(nb_mean(nb_sum(nb_mul(oh, lp), NB_AXES(-1), false), NB_ALL, false)));
}

Test(golden, cross_entropy_grad_with_integer_labels) {
  gd_case *c = gd_load("xent");
  nb_fn *f = nb_fn_create(xent_body, NULL, 4, 1);
  const char *const *ins = GD_NAMES("W", "b", "x", "labels");
  gd_run(c, "value_and_grad", nb_value_and_grad(f, NB_AXES(0, 1)), ins,
         GD_NAMES("loss", "grad_W", "grad_b"));
  gd_run(c, "grad", nb_grad(f, NB_AXES(0, 1)), ins, GD_NAMES("grad_W", "grad_b"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- broadcasting: x [3,1] * y [1,4] + exp(x) -> [3,4]; jacobians [3,4,3,1], [3,4,1,4] */
static nb_status bcast_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, nb_add(nb_mul(in[0], in[1]), nb_exp(in[0])));
}

Test(golden, broadcasting_jacfwd_and_jacrev) {
  gd_case *c = gd_load("broadcast");
  nb_fn *f = nb_fn_create(bcast_body, NULL, 2, 1);
  gd_run(c, "jacfwd", nb_jacfwd(f, NB_AXES(0, 1)), GD_NAMES("x", "y"), GD_NAMES("jac_x", "jac_y"));
  gd_run(c, "jacrev", nb_jacrev(f, NB_AXES(0, 1)), GD_NAMES("x", "y"), GD_NAMES("jac_x", "jac_y"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- sum(cumsum(x, 1) * x), x [3,4] ---------------------------------------------- */
static nb_status cumsum_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                             int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, sum_all(nb_mul(nb_cumsum(in[0], 1), in[0])));
}

Test(golden, cumsum_grad) {
  gd_case *c = gd_load("cumsum");
  nb_fn *f = nb_fn_create(cumsum_body, NULL, 1, 1);
  gd_run(c, "grad", nb_grad(f, NB_AXES(0)), GD_NAMES("x"), GD_NAMES("grad"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- max/min on distinct values: x, y [3,4] ----------------------------------------
 *   sum(max(x, 1)^2) + max(x) + sum(min(x, 0)) + sum(maximum(x, y)) */
static nb_status maxes_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *x = in[0];
  nb_tensor *t = nb_add(sum_all(nb_square(nb_max(x, NB_AXES(1), false))), nb_max(x, NB_ALL, false));
  t = nb_add(t, sum_all(nb_min(x, NB_AXES(0), false)));
  return gd_ret(out, nb_add(t, sum_all(nb_maximum(x, in[1]))));
}

Test(golden, max_min_reductions_grad) {
  gd_case *c = gd_load("max_reductions");
  nb_fn *f = nb_fn_create(maxes_body, NULL, 2, 1);
  gd_run(c, "grad", nb_grad(f, NB_AXES(0, 1)), GD_NAMES("x", "y"), GD_NAMES("grad_x", "grad_y"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- value_and_grad with argnums (2, 0): a, b [2,3], c [3] ------------------------
 *   sum(a * sin(b)) + sum(c^2 * a) + sum(c)^3; out: value, grad c, grad a */
static nb_status vg_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *a = in[0], *b = in[1], *c = in[2];
  nb_tensor *t = nb_add(sum_all(nb_mul(a, nb_sin(b))), sum_all(nb_mul(nb_square(c), a)));
  return gd_ret(out, nb_add(t, nb_pow_scalar(sum_all(c), 3)));
}

Test(golden, value_and_grad_keeps_argnums_order) {
  gd_case *c = gd_load("value_and_grad");
  nb_fn *f = nb_fn_create(vg_body, NULL, 3, 1);
  const char *const *ins = GD_NAMES("a", "b", "c");
  gd_run(c, "value_and_grad", nb_value_and_grad(f, NB_AXES(2, 0)), ins,
         GD_NAMES("value", "grad_c", "grad_a"));
  gd_run(c, "value_and_grad", nb_value_and_grad(f, NB_AXES(-1, -3)), ins,
         GD_NAMES("value", "grad_c", "grad_a"));
  gd_run(c, "grad", nb_grad(f, NB_AXES(2, 0)), ins, GD_NAMES("grad_c", "grad_a"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- hessian wrt two argnums of a vector function: a [2,3], b [3] --------------
 *   tanh(a @ b) * sum(a, 1) -> [2]
 *   blocks (a,a) [2,2,3,2,3], (a,b) [2,2,3,3], (b,a) [2,3,2,3], (b,b) [2,3,3] */
static nb_status hess2_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, nb_mul(nb_tanh(nb_matmul(in[0], in[1])), nb_sum(in[0], NB_AXES(1), false)));
}

Test(golden, hessian_two_argnums_blocks) {
  gd_case *c = gd_load("hess_two_argnums");
  nb_fn *f = nb_fn_create(hess2_body, NULL, 2, 1);
  gd_run(c, "hessian", nb_hessian(f, NB_AXES(0, 1)), GD_NAMES("a", "b"),
         GD_NAMES("h_aa", "h_ab", "h_ba", "h_bb"));
  nb_fn_release(f);
  gd_free(c);
}

/* ---- the seed example: jacfwd(jacrev(vmap(foo))), foo = sum(sin(row)), x [2,3] ------
 * vmap(foo) [2]; jacrev [2,2,3]; jacfwd of that [2,2,3,2,3] */
Test(golden, seed_jacfwd_jacrev_vmap) {
  gd_case *c = gd_load("seed_jacfwd_jacrev_vmap");
  nb_fn *f = nb_fn_create(sum_sin_body, NULL, 1, 1);
  nb_fn *v = nb_vmap(f, NULL, NULL), *jr = nb_jacrev(v, NB_AXES(0));
  gd_run(c, "jacfwd(jacrev(vmap))", nb_jacfwd(jr, NB_AXES(0)), GD_NAMES("x"), GD_NAMES("d2"));
  nb_fn_release(jr);
  nb_fn_release(v);
  nb_fn_release(f);
  gd_free(c);
}

/* ---- per-example gradients: vmap(grad(loss)) of a small MLP over a batch ------------
 * in: W1 [3,4], b1 [4], W2 [4,2], b2 [2] (not mapped), x [5,3], y [5,2] (mapped);
 * one example: mean((tanh(x @ W1 + b1) @ W2 + b2 - y)^2) with x [3], y [2] */
static nb_status ex_loss_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                              int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *h = nb_tanh(nb_add(nb_matmul(in[4], in[0]), in[1]));
  nb_tensor *pred = nb_add(nb_matmul(h, in[2]), in[3]);
  return gd_ret(out, nb_mean(nb_square(nb_sub(pred, in[5])), NB_ALL, false));
}

Test(golden, per_example_grads_vmap_of_grad) {
  gd_case *c = gd_load("per_example_grads");
  nb_fn *f = nb_fn_create(ex_loss_body, NULL, 6, 1), *g = nb_grad(f, NB_AXES(0, 1, 2, 3));
  const int in_axes[6] = {NB_NOT_MAPPED, NB_NOT_MAPPED, NB_NOT_MAPPED, NB_NOT_MAPPED, 0, 0};
  gd_run(c, "vmap(grad)", nb_vmap(g, in_axes, NULL), GD_NAMES("W1", "b1", "W2", "b2", "x", "y"),
         GD_NAMES("g_W1", "g_b1", "g_W2", "g_b2"));
  nb_fn_release(g);
  nb_fn_release(f);
  gd_free(c);
}

/* ---- jit(vmap(grad(f))), in_axes (0, not mapped): x [4,3], w [3] ----------------------
 * one example: sum(tanh(x * w)^2) + logsumexp(x * w), x [3]; grads wrt x and w */
static nb_status jvg_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *t = nb_mul(in[0], in[1]);
  return gd_ret(out, nb_add(sum_all(nb_square(nb_tanh(t))), nb_logsumexp(t, NB_ALL, false)));
}

Test(golden, jit_vmap_grad) {
  gd_case *c = gd_load("jit_vmap_grad");
  nb_fn *f = nb_fn_create(jvg_body, NULL, 2, 1), *g = nb_grad(f, NB_AXES(0, 1));
  nb_fn *v = nb_vmap(g, (const int[]){0, NB_NOT_MAPPED}, NULL), *j = nb_jit(v);
  for (int rep = 0; rep < 2; rep++) /* the trace, then the cached program */
    gd_run(c, rep ? "jit(vmap(grad)), cached" : "jit(vmap(grad))", nb_fn_retain(j),
           GD_NAMES("x", "w"), GD_NAMES("g_x", "g_w"));
  nb_fn_release(j);
  nb_fn_release(v);
  nb_fn_release(g);
  nb_fn_release(f);
  gd_free(c);
}

/* ---- jvp and vjp through nb_scan: c0 [2], xs [4,2] -> (carry [2], ys [4,2]) --------
 * step (c, x) -> (c x + 0.5 sin(x), y = c x), as lax.scan */
static nb_status scan_step_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)user, (void)n_in, (void)n_out;
  out[1] = nb_mul(in[0], in[1]);
  out[0] = nb_add(out[1], nb_mul_scalar(nb_sin(in[1]), 0.5));
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status scan_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  return nb_scan(user, &in[0], 1, &in[1], 1, false, &out[0], &out[1]);
}

Test(golden, scan_jvp_and_vjp) {
  gd_case *c = gd_load("scan");
  nb_fn *step = nb_fn_create(scan_step_body, NULL, 2, 2), *f = nb_fn_create(scan_body, step, 2, 2);
  gd_run(c, "jvp", nb_jvp_fn(f), GD_NAMES("c0", "xs", "t_c0", "t_xs"),
         GD_NAMES("carry", "ys", "t_carry", "t_ys"));
  gd_run(c, "vjp", nb_vjp_fn(f), GD_NAMES("c0", "xs", "g_carry", "g_ys"),
         GD_NAMES("carry", "ys", "g_c0", "g_xs"));
  nb_fn_release(f);
  nb_fn_release(step);
  gd_free(c);
}

/* ---- jvp and vjp through nb_cond, both branches: x, w [3] --------------------------
 *   sum(x) > 0 ? sin(x) w : x w^2 + cos(w) */
static nb_status cond_then_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, nb_mul(nb_sin(in[0]), in[1]));
}

static nb_status cond_else_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)user, (void)n_in, (void)n_out;
  return gd_ret(out, nb_add(nb_mul(in[0], nb_square(in[1])), nb_cos(in[1])));
}

static nb_status cond_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_fn *const *branches = user;
  nb_tensor *pred = nb_gt_scalar(sum_all(in[0]), 0);
  return nb_cond(pred, branches[0], branches[1], in, 2, out);
}

Test(golden, cond_jvp_and_vjp_both_branches) {
  gd_case *c = gd_load("cond");
  nb_fn *br[2] = {nb_fn_create(cond_then_body, NULL, 2, 1),
                  nb_fn_create(cond_else_body, NULL, 2, 1)};
  nb_fn *f = nb_fn_create(cond_body, br, 2, 1);
  gd_run(c, "jvp", nb_jvp_fn(f), GD_NAMES("x_then", "w", "t_x", "t_w"),
         GD_NAMES("y_then", "t_y_then"));
  gd_run(c, "vjp", nb_vjp_fn(f), GD_NAMES("x_then", "w", "g_y"),
         GD_NAMES("y_then", "g_x_then", "g_w_then"));
  gd_run(c, "jvp", nb_jvp_fn(f), GD_NAMES("x_else", "w", "t_x", "t_w"),
         GD_NAMES("y_else", "t_y_else"));
  gd_run(c, "vjp", nb_vjp_fn(f), GD_NAMES("x_else", "w", "g_y"),
         GD_NAMES("y_else", "g_x_else", "g_w_else"));
  nb_fn_release(f);
  nb_fn_release(br[0]);
  nb_fn_release(br[1]);
  gd_free(c);
}

/* ---- hessian through nb_fori_loop: x [3] -> [3,3] ----------------------------------
 *   for i in [0, 3): x = x + 0.1 (i + 1) sin(x) flip(x); then sum(x^2) */
static nb_status fori_step_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *s = nb_mul_scalar(nb_add_scalar(nb_cast(in[0], NB_F64), 1), 0.1);
  nb_tensor *x = in[1];
  return gd_ret(out, nb_add(x, nb_mul(s, nb_mul(nb_sin(x), nb_flip(x, NB_AXES(0))))));
}

static nb_status fori_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *x;
  nb_status st = nb_fori_loop(0, 3, user, in, 1, &x);
  return st ? st : gd_ret(out, sum_all(nb_square(x)));
}

Test(golden, hessian_through_fori_loop) {
  gd_case *c = gd_load("hess_fori_loop");
  nb_fn *step = nb_fn_create(fori_step_body, NULL, 2, 1), *f = nb_fn_create(fori_body, step, 1, 1);
  gd_run(c, "hessian", nb_hessian(f, NB_AXES(0)), GD_NAMES("x"), GD_NAMES("h"));
  nb_fn_release(f);
  nb_fn_release(step);
  gd_free(c);
}
