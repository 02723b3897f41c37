/* test/test_autodiff.c — the transforms and imperative autodiff as a whole:
 * nesting to third derivatives, Jacobian shapes, argnums, imperative backward
 * against functional grad, accumulation, detach, assign, flat memory over a
 * 10,000-step training loop, and the errors of issue 3. Per-op rules are
 * checked in test_grad_*.c. */
#include "grad_check.h"
#include "../src/core/oprules.h"
#include "../src/core/program.h"

TestSuite(autodiff, .init = tc_setup, .fini = tc_teardown);

/* ---- functions used below ---------------------------------------------------- */
static nb_status f_sum_sin(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_sin(in[0]), NB_ALL, false);
  return NB_OK;
}

static nb_status f_sin(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sin(in[0]);
  return NB_OK;
}

/* f(a, b) = sum(a * b^2), and a second output a + b */
static nb_status f_two(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in;
  out[0] = nb_sum(nb_mul(in[0], nb_square(in[1])), NB_ALL, false);
  if (n_out > 1) out[1] = nb_add(in[0], in[1]);
  return NB_OK;
}

/* The README MLP: in = W0 b0 W1 b1 W2 b2 W3 b3 x y */
static nb_tensor *mlp_loss(nb_tensor *const *p, nb_tensor *x, nb_tensor *y) {
  nb_tensor *h = x;
  for (int i = 0; i < 4; i++) {
    h = nb_add(nb_matmul(h, p[2 * i]), p[2 * i + 1]);
    if (i < 3) h = nb_relu(h);
  }
  return nb_mean(nb_square(nb_sub(h, y)), NB_ALL, false);
}

static nb_status f_mlp(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = mlp_loss(in, in[8], in[9]);
  return out[0] ? NB_OK : nb_last_status();
}

static const int64_t mlp_sizes[5] = {1, 8, 16, 8, 1};

static void mlp_params(nb_tensor **p, nb_dtype dt) {
  for (int i = 0; i < 4; i++) {
    p[2 * i] = nb_keep(nb_glorot_uniform(NB_SHAPE(mlp_sizes[i], mlp_sizes[i + 1]), dt));
    p[2 * i + 1] = nb_keep(nb_mul_scalar(nb_rand(NB_SHAPE(mlp_sizes[i + 1]), dt), 0.1));
  }
}

/* ---- nesting ---------------------------------------------------------------------- */
Test(autodiff, third_derivative_of_sin_every_way) {
  double xs[3] = {0.3, -1.2, 2.0};
  nb_tensor *x = tc_tensor(xs, NB_SHAPE(3), NB_F64);
  nb_fn *f = nb_fn_create(f_sum_sin, NULL, 1, 1);
  nb_fn *g1 = nb_grad(f, NB_ALL), *g2 = nb_jacfwd(g1, NB_ALL), *g3 = nb_jacfwd(g2, NB_ALL);
  nb_fn *h = nb_hessian(f, NB_ALL), *h3 = nb_jacrev(h, NB_ALL);
  nb_tensor *o[1];
  cr_assert_eq(nb_call(g3, &x, o), NB_OK, "%s", nb_last_error());
  double want[27] = {0}, want2[9] = {0};
  for (int i = 0; i < 3; i++)
    want[i * 9 + i * 3 + i] = -cos(xs[i]), want2[i * 4] = -sin(xs[i]);
  tc_assert_close_tol(o[0], want, NB_SHAPE(3, 3, 3), 1e-12);
  cr_assert_eq(nb_call(h3, &x, o), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(o[0], want, NB_SHAPE(3, 3, 3), 1e-12);
  cr_assert_eq(nb_call(h, &x, o), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(o[0], want2, NB_SHAPE(3, 3), 1e-12);
  /* elementwise third derivative by grad(grad(grad)) on a scalar */
  nb_tensor *s = nb_scalar(0.7, NB_F64);
  nb_fn *a = nb_grad(f, NB_ALL), *b = nb_grad(a, NB_ALL), *c = nb_grad(b, NB_ALL);
  cr_assert_eq(nb_call(c, &s, o), NB_OK, "%s", nb_last_error());
  cr_assert_float_eq(nb_item(o[0]), -cos(0.7), 1e-12);
  /* forward over forward over reverse via jvp_fn */
  nb_fn *j = nb_jvp_fn(b);
  nb_tensor *jin[2] = {s, nb_scalar(2, NB_F64)}, *jo[2];
  cr_assert_eq(nb_call(j, jin, jo), NB_OK, "%s", nb_last_error());
  cr_assert_float_eq(nb_item(jo[0]), -sin(0.7), 1e-12);
  cr_assert_float_eq(nb_item(jo[1]), -2 * cos(0.7), 1e-12);
  nb_fn *fs[] = {f, g1, g2, g3, h, h3, a, b, c, j};
  for (int i = 0; i < 10; i++)
    nb_fn_release(fs[i]);
}

Test(autodiff, jacobian_shapes_follow_jax) {
  uint64_t seed = 5;
  nb_tensor *x[2] = {tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
                     tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed)};
  nb_fn *f = nb_fn_create(f_two, NULL, 2, 2);
  nb_fn *jr = nb_jacrev(f, NB_AXES(0, 1)), *jf = nb_jacfwd(f, NB_AXES(1));
  cr_assert_eq(nb_fn_n_out(jr), 4);
  cr_assert_eq(nb_fn_n_out(jf), 2);
  nb_tensor *o[4], *p[2];
  cr_assert_eq(nb_call(jr, x, o), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(jf, x, p), NB_OK, "%s", nb_last_error());
  /* out0 is a scalar: d out0 / d x has x's shape; out1 is [2,3]: [2,3,2,3] */
  nb_shape s0 = nb_shape_of(o[0]), s3 = nb_shape_of(o[3]), q1 = nb_shape_of(p[1]);
  cr_assert(s0.ndim == 2 && s0.dims[0] == 2 && s0.dims[1] == 3);
  cr_assert(s3.ndim == 4 && s3.dims[0] == 2 && s3.dims[3] == 3);
  cr_assert(q1.ndim == 4);
  /* d(a+b)/db is the identity, both ways; d out0/d b = 2 a b */
  double *a = tc_read(x[0]), *b = tc_read(x[1]), eye[36] = {0}, g[6];
  for (int i = 0; i < 6; i++)
    eye[i * 7] = 1, g[i] = 2 * a[i] * b[i];
  tc_assert_close_tol(o[3], eye, NB_SHAPE(2, 3, 2, 3), 1e-12);
  tc_assert_close_tol(p[1], eye, NB_SHAPE(2, 3, 2, 3), 1e-12);
  tc_assert_close_tol(o[1], g, NB_SHAPE(2, 3), 1e-12);
  tc_assert_close_tol(p[0], g, NB_SHAPE(2, 3), 1e-12);
  free(a);
  free(b);
  nb_fn_release(f);
  nb_fn_release(jr);
  nb_fn_release(jf);
}

Test(autodiff, value_and_grad_argnums_order_and_dtype) {
  double av[2] = {1.5, -2}, bv[2] = {0.5, 3};
  nb_tensor *x[2] = {tc_tensor(av, NB_SHAPE(2), NB_F32), tc_tensor(bv, NB_SHAPE(2), NB_F32)};
  nb_fn *f = nb_fn_create(f_two, NULL, 2, 1);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(-1, 0));
  cr_assert_eq(nb_fn_n_out(vg), 3);
  nb_tensor *o[3];
  cr_assert_eq(nb_call(vg, x, o), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_dtype_of(o[1]), NB_F32);
  double val[1] = {1.5 * 0.25 + -2 * 9}, gb[2] = {2 * 1.5 * 0.5, 2 * -2 * 3.0}, ga[2] = {0.25, 9};
  tc_assert_close(o[0], val, NB_SCALAR_SHAPE);
  tc_assert_close(o[1], gb, NB_SHAPE(2)); /* argnums order: b first */
  tc_assert_close(o[2], ga, NB_SHAPE(2));
  nb_fn_release(f);
  nb_fn_release(vg);
}

/* f(x_0..x_11) = sum_k (k + 1) * sum(x_k^2): more inputs than an argnums list holds */
static nb_status f_twelve(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_out;
  nb_tensor *acc = NULL;
  for (int k = 0; k < n_in; k++) {
    nb_tensor *t = nb_mul_scalar(nb_sum(nb_square(in[k]), NB_ALL, false), k + 1);
    acc = acc ? nb_add(acc, t) : t;
  }
  out[0] = acc;
  return NB_OK;
}

Test(autodiff, grad_nb_all_covers_more_than_eight_inputs) {
  enum { N = 12 };
  nb_tensor *x[N], *g[N];
  double v[N][3];
  for (int k = 0; k < N; k++) {
    for (int i = 0; i < 3; i++)
      v[k][i] = 0.25 * k - 0.5 * i;
    x[k] = tc_tensor(v[k], NB_SHAPE(3), NB_F64);
  }
  nb_fn *f = nb_fn_create(f_twelve, NULL, N, 1);
  nb_fn *gf = nb_grad(f, NB_ALL);
  cr_assert(gf, "%s", nb_last_error());
  cr_assert_eq(nb_fn_n_out(gf), N);
  cr_assert_eq(nb_call(gf, x, g), NB_OK, "%s", nb_last_error());
  for (int k = 0; k < N; k++) {
    double ref[3];
    for (int i = 0; i < 3; i++)
      ref[i] = 2.0 * (k + 1) * v[k][i];
    tc_assert_close_tol(g[k], ref, NB_SHAPE(3), 1e-12);
  }
  nb_fn_release(f);
  nb_fn_release(gf);
}

static nb_status f_captured(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *c = u; /* a constant: no gradient flows to it */
  out[0] = nb_sum(nb_mul(nb_mul(in[0], c), nb_detach(in[0])), NB_ALL, false);
  return NB_OK;
}

Test(autodiff, captured_constants_and_detach_get_no_gradient) {
  double xv[3] = {1, 2, 3}, cv[3] = {2, 2, 2};
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(3), NB_F64), *c = tc_tensor(cv, NB_SHAPE(3), NB_F64);
  nb_fn *f = nb_fn_create(f_captured, c, 1, 1), *g = nb_grad(f, NB_ALL);
  nb_tensor *o[1];
  cr_assert_eq(nb_call(g, &x, o), NB_OK, "%s", nb_last_error());
  double want[3] = {2, 4, 6}; /* d/dx (x*c*stop(x)) = c * x */
  tc_assert_close(o[0], want, NB_SHAPE(3));
  nb_fn_release(f);
  nb_fn_release(g);
}

static nb_status f_int_input(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_mul(in[0], nb_cast(in[1], NB_F64));
  return NB_OK;
}

Test(autodiff, integer_inputs_get_zero_cotangents_and_no_tangent) {
  double xv[2] = {1, 2}, iv[2] = {3, 4};
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(2), NB_F64), *i = tc_tensor(iv, NB_SHAPE(2), NB_I32);
  nb_fn *f = nb_fn_create(f_int_input, NULL, 2, 1), *v = nb_vjp_fn(f), *j = nb_jvp_fn(f);
  nb_tensor *vin[3] = {x, i, nb_ones(NB_SHAPE(2), NB_F64)}, *vo[3];
  cr_assert_eq(nb_call(v, vin, vo), NB_OK, "%s", nb_last_error());
  double gx[2] = {3, 4}, gi[2] = {0, 0};
  tc_assert_close(vo[1], gx, NB_SHAPE(2));
  cr_assert_eq(nb_dtype_of(vo[2]), NB_I32);
  tc_assert_close(vo[2], gi, NB_SHAPE(2));
  nb_tensor *jin[4] = {x, i, nb_ones(NB_SHAPE(2), NB_F64), nb_ones(NB_SHAPE(2), NB_I32)}, *jo[2];
  cr_assert_eq(nb_call(j, jin, jo), NB_OK, "%s", nb_last_error());
  tc_assert_close(jo[1], gx, NB_SHAPE(2));
  nb_fn_release(f);
  nb_fn_release(v);
  nb_fn_release(j);
}

/* ---- imperative ---------------------------------------------------------------------- */
Test(autodiff, backward_equals_functional_grad) {
  nb_tensor *p[10];
  mlp_params(p, NB_F64);
  p[8] = nb_rand(NB_SHAPE(16, 1), NB_F64);
  p[9] = nb_rand(NB_SHAPE(16, 1), NB_F64);
  nb_fn *f = nb_fn_create(f_mlp, NULL, 10, 1);
  nb_fn *g = nb_grad(f, NB_AXES(0, 1, 2, 3, 4, 5, 6, 7));
  nb_tensor *fg[8];
  cr_assert_eq(nb_call(g, p, fg), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 8; i++)
    nb_set_requires_grad(p[i], true);
  nb_tensor *loss = mlp_loss(p, p[8], p[9]);
  cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
  cr_assert(nb_is_realized(loss));
  for (int i = 0; i < 8; i++) {
    nb_tensor *gi = nb_grad_of(p[i]);
    cr_assert(gi, "no grad for param %d", i);
    double *want = tc_read(fg[i]);
    tc_assert_close_tol(gi, want, nb_shape_of(p[i]), 1e-12);
    free(want);
  }
  /* x and y did not require grad */
  cr_assert_null(nb_grad_of(p[8]));
  nb_fn_release(f);
  nb_fn_release(g);
}

Test(autodiff, backward_accumulates_and_zero_grad_resets) {
  double wv[3] = {1, -2, 0.5};
  nb_tensor *w = nb_set_requires_grad(tc_tensor(wv, NB_SHAPE(3), NB_F32), true);
  for (int rep = 0; rep < 2; rep++)
    cr_assert_eq(nb_backward(nb_sum(nb_square(w), NB_ALL, false)), NB_OK, "%s", nb_last_error());
  double twice[3] = {4, -8, 2};
  tc_assert_close(nb_grad_of(w), twice, NB_SHAPE(3));
  nb_zero_grad(w);
  cr_assert_null(nb_grad_of(w));
  cr_assert_eq(nb_backward(nb_sum(nb_mul_scalar(w, 3), NB_ALL, false)), NB_OK);
  double three[3] = {3, 3, 3};
  tc_assert_close(nb_grad_of(w), three, NB_SHAPE(3));
}

Test(autodiff, provenance_is_kept_only_where_needed_and_freed) {
  nb_tensor *a = nb_rand(NB_SHAPE(4), NB_F32);
  nb_tensor *w = nb_set_requires_grad(nb_rand(NB_SHAPE(4), NB_F32), true);
  nb_tensor *plain = nb_exp(a);
  nb_tensor *h = nb_mul(nb_exp(w), a);
  cr_assert(!nb_requires_grad(plain));
  cr_assert(nb_requires_grad(h));
  cr_assert(!nb_requires_grad(nb_detach(h)));
  cr_assert(!nb_requires_grad(nb_argmax(h, 0, false))); /* integer result */
  nb_eval((nb_tensor *[]){plain, h}, 2);
  cr_assert_eq(plain->n_in, 0); /* realized without provenance: edges dropped */
  cr_assert_gt(h->n_in, 0);     /* kept for backward */
  nb_tensor *loss = nb_sum(h, NB_ALL, false);
  cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
  cr_assert_eq(h->n_in, 0);
  cr_assert_eq(loss->n_in, 0);
  /* a second backward through the freed graph is an error */
  cr_assert_neq(nb_backward(loss), NB_OK);
  tc_assert_error(NB_ERR_STATE, "already freed");
}

Test(autodiff, assign_updates_in_place_and_keeps_old_values_for_pending_work) {
  double wv[2] = {1, 2};
  nb_tensor *w = nb_set_requires_grad(tc_tensor(wv, NB_SHAPE(2), NB_F32), true);
  nb_tensor *before = nb_sum(w, NB_ALL, false); /* pending when w is assigned */
  nb_backward(nb_sum(nb_square(w), NB_ALL, false));
  nb_tensor *upd = nb_sub(w, nb_mul_scalar(nb_grad_of(w), 0.25));
  cr_assert_eq(nb_assign(w, upd), NB_OK, "%s", nb_last_error());
  double want[2] = {0.5, 1};
  tc_assert_close(w, want, NB_SHAPE(2));
  cr_assert_float_eq(nb_item(before), 3, 1e-6); /* the old value */
  cr_assert(nb_requires_grad(w));
  cr_assert(nb_grad_of(w)); /* assign keeps .grad */
  /* f64 source is converted to dst's dtype */
  double v64[2] = {7, 8};
  cr_assert_eq(nb_assign(w, tc_tensor(v64, NB_SHAPE(2), NB_F64)), NB_OK);
  cr_assert_eq(nb_dtype_of(w), NB_F32);
  tc_assert_close(w, v64, NB_SHAPE(2));
  cr_assert_neq(nb_assign(w, nb_ones(NB_SHAPE(3), NB_F32)), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "nb_assign");
}

/* ---- training loops with flat memory -------------------------------------------------- */
Test(autodiff, ten_thousand_steps_keep_memory_flat, .timeout = 120) {
  nb_tensor *p[10];
  mlp_params(p, NB_F32);
  p[8] = nb_rand(NB_SHAPE(32, 1), NB_F32);
  p[9] = nb_sin(nb_mul_scalar(p[8], 6));
  nb_eval(&p[9], 1);
  nb_fn *f = nb_fn_create(f_mlp, NULL, 10, 1);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1, 2, 3, 4, 5, 6, 7));
  nb_fn_release(f);
  uint64_t live_t = 0, live_b = 0;
  double first = 0, last = 0;
  for (int step = 0; step < 10000; step++) {
    nb_scope_begin();
    nb_tensor *o[9];
    if (step % 2 == 0) { /* functional step */
      cr_assert_eq(nb_call(vg, p, o), NB_OK, "%s", nb_last_error());
      for (int i = 0; i < 8; i++)
        nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(o[1 + i], 0.05)));
    } else { /* imperative step */
      for (int i = 0; i < 8; i++)
        nb_set_requires_grad(p[i], true);
      o[0] = mlp_loss(p, p[8], p[9]);
      cr_assert_eq(nb_backward(o[0]), NB_OK, "%s", nb_last_error());
      for (int i = 0; i < 8; i++) {
        nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(nb_grad_of(p[i]), 0.05)));
        nb_zero_grad(p[i]);
        nb_set_requires_grad(p[i], false);
      }
    }
    if (step == 0) first = nb_item(o[0]);
    if (step == 9999) last = nb_item(o[0]);
    nb_scope_end();
    nb_stats s = nb_get_stats();
    if (step == 100) live_t = s.live_tensors, live_b = s.live_bytes;
    if (step > 100) {
      cr_assert_eq(s.live_tensors, live_t, "step %d: %llu live tensors, %llu at step 100", step,
                   (unsigned long long)s.live_tensors, (unsigned long long)live_t);
      cr_assert_eq(s.live_bytes, live_b, "step %d: live bytes grew", step);
    }
  }
  cr_assert_lt(last, first, "loss %g -> %g", first, last);
  nb_fn_release(vg);
}

/* ---- errors ----------------------------------------------------------------------------- */
static nb_status f_reads(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  double v = nb_item(nb_sum(in[0], NB_ALL, false));
  out[0] = nb_mul_scalar(in[0], v);
  return nb_last_status();
}

Test(autodiff, errors) {
  nb_tensor *x = nb_rand(NB_SHAPE(2, 3), NB_F32), *o[2];
  nb_fn *f = nb_fn_create(f_sin, NULL, 1, 1);
  /* grad of a non-scalar */
  nb_fn *g = nb_grad(f, NB_ALL);
  cr_assert_neq(nb_call(g, &x, o), NB_OK);
  cr_assert_null(o[0]);
  tc_assert_error(NB_ERR_SHAPE, "one-element");
  /* argnums out of range, repeated, empty */
  cr_assert_null(nb_grad(f, NB_AXES(1)));
  tc_assert_error(NB_ERR_ARG, "out of range");
  nb_fn *f2 = nb_fn_create(f_two, NULL, 2, 1);
  cr_assert_null(nb_jacrev(f2, NB_AXES(0, -2)));
  tc_assert_error(NB_ERR_ARG, "repeated");
  cr_assert_null(nb_jacfwd(f2, NB_NO_AXES));
  tc_assert_error(NB_ERR_ARG, "empty");
  cr_assert_null(nb_grad(NULL, NB_ALL));
  tc_assert_error(NB_ERR_NULL, "nb_grad");
  /* differentiating an integer input */
  nb_fn *fss = nb_fn_create(f_sum_sin, NULL, 1, 1), *gs = nb_grad(fss, NB_ALL);
  nb_tensor *xi = nb_ones(NB_SHAPE(2), NB_I32);
  cr_assert_neq(nb_call(gs, &xi, o), NB_OK);
  tc_assert_error(NB_ERR_DTYPE, "floating-point");
  /* backward without requires_grad, on a non-scalar, on an int tensor */
  cr_assert_neq(nb_backward(nb_sum(x, NB_ALL, false)), NB_OK);
  tc_assert_error(NB_ERR_STATE, "requires grad");
  nb_set_requires_grad(x, true);
  cr_assert_neq(nb_backward(nb_sin(x)), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "one element");
  cr_assert_null(nb_set_requires_grad(xi, true));
  tc_assert_error(NB_ERR_DTYPE, "floating-point");
  /* reading a traced value inside a transform */
  nb_fn *r = nb_fn_create(f_reads, NULL, 1, 1), *gr = nb_jvp_fn(r);
  nb_tensor *jin[2] = {x, x};
  cr_assert_neq(nb_call(gr, jin, o), NB_OK);
  tc_assert_error(NB_ERR_STATE, "cannot read a traced value; use nb_cond / nb_while_loop");
  /* the same function is fine when called plainly */
  cr_assert_eq(nb_call(r, &x, o), NB_OK, "%s", nb_last_error());
  /* a wrong cotangent shape */
  nb_fn *v = nb_vjp_fn(f);
  nb_tensor *vin[2] = {x, nb_ones(NB_SHAPE(3), NB_F32)};
  cr_assert_neq(nb_call(v, vin, o), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "cotangent 0");
  /* NULL inputs to nb_call */
  nb_tensor *nul[1] = {NULL};
  cr_assert_neq(nb_call(f, nul, o), NB_OK);
  tc_assert_error(NB_ERR_NULL, "input 0");
  cr_assert_null(nb_fn_create(NULL, NULL, 1, 1));
  tc_assert_error(NB_ERR_NULL, "body");
  nb_fn *fs[] = {f, f2, g, fss, gs, r, gr, v};
  for (int i = 0; i < 8; i++)
    nb_fn_release(fs[i]);
}

Test(autodiff, every_op_has_rules_or_is_nondifferentiable) {
  for (int op = 1; op < NBI_OP_COUNT; op++) {
    const nbi_op_def *d = nbi_op_table[op];
    if (op == NBI_OP_TUPLE_GET) continue; /* the sweeps treat it with its pack */
    if (d->flags & NBI_OPF_MULTI)
      cr_assert(d->vjp_multi && d->jvp_multi, "multi-output op %s lacks VJP/JVP rules", d->name);
    else
      cr_assert((d->vjp && d->jvp) || (d->flags & NBI_OPF_NONDIFF),
                "op %s has no VJP/JVP rule and is not marked non-differentiable", d->name);
  }
}
