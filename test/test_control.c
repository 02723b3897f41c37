/* test/test_control.c — control flow (nb_cond, nb_while_loop, nb_scan,
 * nb_fori_loop): forward values against plain C loops, derivatives against
 * finite differences and closed forms (both modes, second order, captured
 * operands), the reverse-mode while error, vmap against a loop of unbatched
 * calls, control flow inside grad inside vmap, and imperative nb_backward. */
#include "grad_check.h"

TestSuite(control, .init = tc_setup, .fini = tc_teardown);

#define UNUSED_ARGS (void)u, (void)n_in, (void)n_out
#define BODY(name)                                                                                 \
  static nb_status name(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out)

/* The status of a body that wrote outs[0..n-1]. */
static nb_status outs_ok(nb_tensor **out, int n) {
  for (int j = 0; j < n; j++)
    if (!out[j]) return nb_last_status() ? nb_last_status() : NB_ERR_INTERNAL;
  return NB_OK;
}

/* Tensors a body captures from outside (through user). */
typedef struct ctx {
  nb_tensor *w, *v;
} ctx;

/* ---- cond -------------------------------------------------------------------------------- */
/* then: (x * 2 + y, x > 0 as i64);  else: (x - y * w, count 7) with w captured */
BODY(br_then) {
  UNUSED_ARGS;
  out[0] = nb_add(nb_mul_scalar(in[0], 2), in[1]);
  out[1] = nb_cast(nb_gt_scalar(in[0], 0), NB_I64);
  return outs_ok(out, 2);
}
BODY(br_else) {
  UNUSED_ARGS;
  const ctx *c = u;
  out[0] = nb_sub(in[0], nb_mul(in[1], c->w));
  out[1] = nb_broadcast_to(nb_scalar(7, NB_I64), nb_shape_of(in[0]));
  return outs_ok(out, 2);
}

Test(control, cond_takes_either_branch) {
  double xv[4] = {1.5, -2, 0.25, 3}, yv[4] = {0.5, 1, -1, 2}, wv[4] = {2, 3, 4, 5};
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(4), NB_F64), *y = tc_tensor(yv, NB_SHAPE(4), NB_F64);
  ctx c = {.w = tc_tensor(wv, NB_SHAPE(4), NB_F64)};
  nb_fn *t = nb_fn_create(br_then, NULL, 2, 2), *e = nb_fn_create(br_else, &c, 2, 2);
  for (int p = 0; p < 2; p++) {
    nb_tensor *out[2], *ops[2] = {x, y};
    cr_assert_eq(nb_cond(nb_scalar(p, NB_BOOL), t, e, ops, 2, out), NB_OK, "%s", nb_last_error());
    double r0[4], r1[4];
    for (int i = 0; i < 4; i++) {
      r0[i] = p ? 2 * xv[i] + yv[i] : xv[i] - yv[i] * wv[i];
      r1[i] = p ? xv[i] > 0 : 7;
    }
    cr_assert_eq(nb_dtype_of(out[1]), NB_I64);
    tc_assert_close(out[0], r0, NB_SHAPE(4));
    tc_assert_close(out[1], r1, NB_SHAPE(4));
  }
  /* a predicate computed from data, of shape (1, 1) */
  nb_tensor *out[2], *ops[2] = {x, y};
  nb_tensor *pred = nb_reshape(nb_lt_scalar(nb_sum(x, NB_ALL, false), 0), NB_SHAPE(1, 1));
  cr_assert_eq(nb_cond(pred, t, e, ops, 2, out), NB_OK, "%s", nb_last_error());
  double r0[4];
  for (int i = 0; i < 4; i++)
    r0[i] = xv[i] - yv[i] * wv[i]; /* sum(x) > 0: else */
  tc_assert_close(out[0], r0, NB_SHAPE(4));
  nb_fn_release(t);
  nb_fn_release(e);
}

BODY(br_vec3) {
  UNUSED_ARGS;
  out[0] = nb_add_scalar(in[0], 1);
  return outs_ok(out, 1);
}
BODY(br_sum) {
  UNUSED_ARGS;
  out[0] = nb_sum(in[0], NB_ALL, false);
  return outs_ok(out, 1);
}
BODY(br_f32) {
  UNUSED_ARGS;
  out[0] = nb_cast(in[0], NB_F32);
  return outs_ok(out, 1);
}

Test(control, cond_errors) {
  nb_tensor *x = nb_ones(NB_SHAPE(3), NB_F64), *out[1];
  nb_fn *a = nb_fn_create(br_vec3, NULL, 1, 1), *s = nb_fn_create(br_sum, NULL, 1, 1),
        *f = nb_fn_create(br_f32, NULL, 1, 1), *two = nb_fn_create(br_then, NULL, 2, 2);
  nb_tensor *yes = nb_scalar(1, NB_BOOL);
  cr_assert_neq(nb_cond(yes, a, s, &x, 1, out), NB_OK);
  cr_assert_null(out[0]);
  tc_assert_error(NB_ERR_SHAPE, "output 0 of else_fn is f64 []");
  cr_assert_neq(nb_cond(yes, a, f, &x, 1, out), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "f32 [3]");
  cr_assert_neq(nb_cond(nb_scalar(1, NB_F32), a, a, &x, 1, out), NB_OK);
  tc_assert_error(NB_ERR_ARG, "one-element bool");
  cr_assert_neq(nb_cond(nb_ones(NB_SHAPE(2), NB_BOOL), a, a, &x, 1, out), NB_OK);
  tc_assert_error(NB_ERR_ARG, "one-element bool");
  cr_assert_neq(nb_cond(yes, a, two, &x, 1, out), NB_OK);
  tc_assert_error(NB_ERR_ARG, "else_fn takes 2 inputs");
  cr_assert_neq(nb_cond(yes, NULL, a, &x, 1, out), NB_OK);
  tc_assert_error(NB_ERR_NULL, "then_fn is NULL");
  cr_assert_neq(nb_cond(NULL, a, a, &x, 1, out), NB_OK);
  tc_assert_error(NB_ERR_NULL, "nb_cond");
  nb_fn *fs[] = {a, s, f, two};
  for (int i = 0; i < 4; i++)
    nb_fn_release(fs[i]);
}

/* ---- while ------------------------------------------------------------------------------- */
/* Collatz: carry (n f64, steps i64); until n == 1 */
BODY(collatz_cond) {
  UNUSED_ARGS;
  out[0] = nb_ne_scalar(in[0], 1);
  return outs_ok(out, 1);
}
BODY(collatz_body) {
  UNUSED_ARGS;
  nb_tensor *n = in[0], *even = nb_eq_scalar(nb_mod(n, nb_scalar(2, NB_F64)), 0);
  out[0] = nb_where(even, nb_mul_scalar(n, 0.5), nb_add_scalar(nb_mul_scalar(n, 3), 1));
  out[1] = nb_add_scalar(in[1], 1);
  return outs_ok(out, 2);
}

static int64_t collatz_steps(int64_t n) {
  int64_t k = 0;
  for (; n != 1; k++)
    n = n % 2 ? 3 * n + 1 : n / 2;
  return k;
}

Test(control, while_collatz_data_dependent_trip_count) {
  nb_fn *c = nb_fn_create(collatz_cond, NULL, 2, 1), *b = nb_fn_create(collatz_body, NULL, 2, 2);
  int64_t starts[] = {1, 6, 7, 27, 97};
  for (int i = 0; i < 5; i++) {
    nb_tensor *init[2] = {nb_scalar((double)starts[i], NB_F64), nb_scalar(0, NB_I64)}, *out[2];
    cr_assert_eq(nb_while_loop(c, b, init, 2, out), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_dtype_of(out[1]), NB_I64);
    cr_assert_eq(nb_item(out[0]), 1);
    cr_assert_eq((int64_t)nb_item(out[1]), collatz_steps(starts[i]), "start %lld",
                 (long long)starts[i]);
  }
  nb_fn_release(c);
  nb_fn_release(b);
}

/* Newton's iteration for sqrt(a), a captured: until every |x^2 - a| <= 1e-12 a */
BODY(newton_cond) {
  UNUSED_ARGS;
  const ctx *c = u;
  nb_tensor *r = nb_abs(nb_sub(nb_square(in[0]), c->w));
  out[0] = nb_any(nb_gt(r, nb_mul_scalar(c->w, 1e-12)), NB_ALL, false);
  return outs_ok(out, 1);
}
BODY(newton_body) {
  UNUSED_ARGS;
  const ctx *c = u;
  out[0] = nb_mul_scalar(nb_add(in[0], nb_div(c->w, in[0])), 0.5);
  out[1] = nb_add_scalar(in[1], 1);
  return outs_ok(out, 2);
}

Test(control, while_newton_sqrt) {
  double av[3] = {2, 10, 0.3};
  ctx cx = {.w = tc_tensor(av, NB_SHAPE(3), NB_F64)};
  nb_fn *c = nb_fn_create(newton_cond, &cx, 2, 1), *b = nb_fn_create(newton_body, &cx, 2, 2);
  nb_tensor *init[2] = {nb_ones(NB_SHAPE(3), NB_F64), nb_scalar(0, NB_I32)}, *out[2];
  cr_assert_eq(nb_while_loop(c, b, init, 2, out), NB_OK, "%s", nb_last_error());
  /* the same iteration in C */
  double x[3] = {1, 1, 1}, ref[3];
  int iters = 0;
  for (;;) {
    bool go = false;
    for (int i = 0; i < 3; i++)
      go |= fabs(x[i] * x[i] - av[i]) > 1e-12 * av[i];
    if (!go) break;
    for (int i = 0; i < 3; i++)
      x[i] = 0.5 * (x[i] + av[i] / x[i]);
    iters++;
  }
  for (int i = 0; i < 3; i++)
    ref[i] = sqrt(av[i]);
  tc_assert_close_tol(out[0], x, NB_SHAPE(3), 0);
  tc_assert_close(out[0], ref, NB_SHAPE(3));
  cr_assert_eq(nb_item(out[1]), iters);
  cr_assert_gt(iters, 3);
  nb_fn_release(c);
  nb_fn_release(b);
}

BODY(bad_cond_shape) {
  UNUSED_ARGS;
  out[0] = nb_gt_scalar(in[0], 0);
  return outs_ok(out, 1);
}
BODY(bad_body_dtype) {
  UNUSED_ARGS;
  out[0] = nb_cast(in[0], NB_F32);
  return outs_ok(out, 1);
}

Test(control, while_errors) {
  nb_tensor *x = nb_ones(NB_SHAPE(2), NB_F64), *out[1];
  nb_fn *c = nb_fn_create(bad_cond_shape, NULL, 1, 1),
        *b = nb_fn_create(bad_body_dtype, NULL, 1, 1);
  nb_fn *ok = nb_fn_create(br_vec3, NULL, 1, 1);
  cr_assert_neq(nb_while_loop(c, ok, &x, 1, out), NB_OK);
  cr_assert_null(out[0]);
  tc_assert_error(NB_ERR_ARG, "cond_fn must give a one-element bool tensor, not bool [2]");
  nb_tensor *s = nb_ones(NB_SCALAR_SHAPE, NB_F64);
  cr_assert_neq(nb_while_loop(c, b, &s, 1, out), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "output 0 of body_fn is f32 [] but carry 0 is f64 []");
  cr_assert_neq(nb_while_loop(c, ok, &x, 0, out), NB_OK);
  tc_assert_error(NB_ERR_ARG, "n is 0");
  cr_assert_neq(nb_while_loop(c, NULL, &x, 1, out), NB_OK);
  tc_assert_error(NB_ERR_NULL, "body_fn is NULL");
  nb_fn_release(c);
  nb_fn_release(b);
  nb_fn_release(ok);
}

/* ---- scan -------------------------------------------------------------------------------- */
/* (sum [3], prod [3], x [3], k i64) -> (sum + x, prod * x, running sum, 2k) */
BODY(cum_body) {
  UNUSED_ARGS;
  nb_tensor *s = nb_add(in[0], in[2]);
  out[0] = s;
  out[1] = nb_mul(in[1], in[2]);
  out[2] = s;
  out[3] = nb_mul_scalar(in[3], 2);
  return outs_ok(out, 4);
}

Test(control, scan_cumulative_sums_and_products_both_directions) {
  enum { T = 5, D = 3 };
  uint64_t seed = 7;
  double xv[T * D], kv[T];
  tc_fill(xv, T * D, 0.5, 1.5, &seed);
  for (int t = 0; t < T; t++)
    kv[t] = 10 * t + 1;
  nb_tensor *xs[2] = {tc_tensor(xv, NB_SHAPE(T, D), NB_F64), tc_tensor(kv, NB_SHAPE(T), NB_I64)};
  nb_fn *body = nb_fn_create(cum_body, NULL, 4, 4);
  for (int rev = 0; rev < 2; rev++) {
    nb_tensor *init[2] = {nb_zeros(NB_SHAPE(D), NB_F64), nb_ones(NB_SHAPE(D), NB_F64)};
    nb_tensor *co[2], *ys[2];
    cr_assert_eq(nb_scan(body, init, 2, xs, 2, rev, co, ys), NB_OK, "%s", nb_last_error());
    double s[D] = {0}, p[D] = {1, 1, 1}, run[T * D], k2[T];
    for (int i = 0; i < T; i++) {
      int t = rev ? T - 1 - i : i;
      for (int d = 0; d < D; d++) {
        s[d] += xv[t * D + d];
        p[d] *= xv[t * D + d];
        run[t * D + d] = s[d]; /* ys[t] is step t's output */
      }
      k2[t] = 2 * kv[t];
    }
    tc_assert_close(co[0], s, NB_SHAPE(D));
    tc_assert_close(co[1], p, NB_SHAPE(D));
    tc_assert_close(ys[0], run, NB_SHAPE(T, D));
    cr_assert_eq(nb_dtype_of(ys[1]), NB_I64);
    tc_assert_close(ys[1], k2, NB_SHAPE(T));
  }
  nb_fn_release(body);
}

/* a strided (transposed) xs, no carry: y_t = x_t * w (w captured) */
BODY(map_body) {
  UNUSED_ARGS;
  const ctx *c = u;
  out[0] = nb_mul(in[0], c->w);
  return outs_ok(out, 1);
}

Test(control, scan_without_carry_over_strided_xs) {
  enum { T = 4, D = 3 };
  double xv[T * D], wv[D] = {1, -2, 0.5};
  for (int i = 0; i < T * D; i++)
    xv[i] = i + 1;
  ctx c = {.w = tc_tensor(wv, NB_SHAPE(D), NB_F64)};
  nb_tensor *x = tc_strided_tensor(xv, NB_SHAPE(T, D), NB_F64), *ys[1];
  nb_fn *body = nb_fn_create(map_body, &c, 1, 1);
  cr_assert_eq(nb_scan(body, NULL, 0, &x, 1, false, NULL, ys), NB_OK, "%s", nb_last_error());
  double ref[T * D];
  for (int i = 0; i < T * D; i++)
    ref[i] = xv[i] * wv[i % D];
  tc_assert_close(ys[0], ref, NB_SHAPE(T, D));
  /* zero steps: ys are empty */
  nb_tensor *e = nb_zeros(NB_SHAPE(0, D), NB_F64);
  cr_assert_eq(nb_scan(body, NULL, 0, &e, 1, false, NULL, ys), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_numel(ys[0]), 0);
  cr_assert_eq(nb_shape_of(ys[0]).dims[1], D);
  nb_fn_release(body);
}

Test(control, scan_errors) {
  nb_tensor *x = nb_ones(NB_SHAPE(3, 2), NB_F64), *y = nb_ones(NB_SHAPE(4, 2), NB_F64);
  nb_tensor *s = nb_scalar(0, NB_F64), *co[2], *ys[3];
  nb_fn *body = nb_fn_create(cum_body, NULL, 4, 4), *m = nb_fn_create(br_sum, NULL, 1, 1);
  nb_tensor *xs2[2] = {x, y}, *init[2] = {s, s};
  cr_assert_neq(nb_scan(body, init, 2, xs2, 2, false, co, ys), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "xs[1] has shape [4,2] but xs[0] has 3 steps");
  cr_assert_neq(nb_scan(m, NULL, 0, &s, 1, false, NULL, ys), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "xs[0] is 0-d");
  cr_assert_neq(nb_scan(m, NULL, 0, &x, 0, false, NULL, ys), NB_OK);
  tc_assert_error(NB_ERR_ARG, "n_xs 0");
  nb_fn *v = nb_fn_create(bad_body_dtype, NULL, 2, 1); /* (c, x) -> c as f32 */
  nb_tensor *c3 = nb_ones(NB_SHAPE(3), NB_F64);
  cr_assert_neq(nb_scan(v, &c3, 1, &x, 1, false, co, NULL), NB_OK);
  cr_assert_null(co[0]);
  tc_assert_error(NB_ERR_SHAPE, "output 0 of body is f32 [3] but carry 0 is f64 [3]");
  cr_assert_neq(nb_scan(body, &c3, 1, &x, 1, false, co, ys), NB_OK);
  tc_assert_error(NB_ERR_ARG, "body takes 4 inputs");
  nb_fn_release(v);
  nb_fn_release(body);
  nb_fn_release(m);
}

/* ---- fori_loop --------------------------------------------------------------------------- */
/* (i, acc, x) -> (acc * i, x * 0.5 + i) */
BODY(fori_body) {
  UNUSED_ARGS;
  nb_tensor *fi = nb_cast(in[0], NB_F64);
  out[0] = nb_mul(in[1], fi);
  out[1] = nb_add(nb_mul_scalar(in[2], 0.5), fi);
  return outs_ok(out, 2);
}

Test(control, fori_loop_matches_a_for_loop) {
  nb_fn *body = nb_fn_create(fori_body, NULL, 3, 2);
  int64_t ranges[3][2] = {{2, 6}, {-3, 4}, {5, 5}};
  for (int r = 0; r < 3; r++) {
    double xv[2] = {0.5, 4};
    nb_tensor *init[2] = {nb_scalar(1, NB_F64), tc_tensor(xv, NB_SHAPE(2), NB_F64)}, *out[2];
    cr_assert_eq(nb_fori_loop(ranges[r][0], ranges[r][1], body, init, 2, out), NB_OK, "%s",
                 nb_last_error());
    double acc = 1, x[2] = {0.5, 4};
    for (int64_t i = ranges[r][0]; i < ranges[r][1]; i++) {
      acc *= (double)i;
      for (int d = 0; d < 2; d++)
        x[d] = x[d] * 0.5 + (double)i;
    }
    cr_assert_float_eq(nb_item(out[0]), acc, 1e-12);
    tc_assert_close(out[1], x, NB_SHAPE(2));
  }
  nb_tensor *init[2] = {nb_scalar(1, NB_F64), nb_scalar(1, NB_F64)}, *out[2];
  cr_assert_neq(nb_fori_loop(0, 3, body, init, 1, out), NB_OK);
  tc_assert_error(NB_ERR_ARG, "body takes 3 inputs");
  nb_fn_release(body);
}

/* ---- derivatives --------------------------------------------------------------------------- */
/* f(x, w) = sum(cond(sum(x) > 0, sin(x) * w, x * x - w)^2): w captured by both branches */
BODY(cg_then) {
  UNUSED_ARGS;
  out[0] = nb_mul(nb_sin(in[0]), ((const ctx *)u)->w);
  return outs_ok(out, 1);
}
BODY(cg_else) {
  UNUSED_ARGS;
  out[0] = nb_sub(nb_square(in[0]), ((const ctx *)u)->w);
  return outs_ok(out, 1);
}
BODY(cond_loss) {
  UNUSED_ARGS;
  ctx c = {.w = in[1]};
  nb_fn *t = nb_fn_create(cg_then, &c, 1, 1), *e = nb_fn_create(cg_else, &c, 1, 1);
  nb_tensor *r[1];
  nb_status st = nb_cond(nb_gt_scalar(nb_sum(in[0], NB_ALL, false), 0), t, e, in, 1, r);
  nb_fn_release(t);
  nb_fn_release(e);
  if (st) return st;
  out[0] = nb_sum(nb_square(r[0]), NB_ALL, false);
  return outs_ok(out, 1);
}

Test(control, grad_through_cond_both_branches_and_captures) {
  uint64_t seed = 11;
  nb_tensor *w = tc_rand_f64(NB_SHAPE(3), -1, 1, &seed);
  nb_tensor *pos = tc_rand_f64(NB_SHAPE(3), 0.2, 1, &seed);
  nb_tensor *neg = tc_rand_f64(NB_SHAPE(3), -1, -0.2, &seed);
  tc_check_grad("cond, then", cond_loss, NULL, 2, (nb_tensor *[]){pos, w}, TC_SECOND);
  tc_check_grad("cond, else", cond_loss, NULL, 2, (nb_tensor *[]){neg, w}, TC_SECOND);
  /* the gradient of the branch taken, in closed form */
  nb_fn *f = nb_fn_create(cond_loss, NULL, 2, 1), *g = nb_grad(f, NB_ALL);
  nb_fn_release(f);
  nb_tensor *gr[2];
  cr_assert_eq(nb_call(g, (nb_tensor *[]){neg, w}, gr), NB_OK, "%s", nb_last_error());
  double *x = tc_read(neg), *wv = tc_read(w), gx[3], gw[3];
  for (int i = 0; i < 3; i++) {
    double r = x[i] * x[i] - wv[i];
    gx[i] = 2 * r * 2 * x[i];
    gw[i] = -2 * r;
  }
  tc_assert_close(gr[0], gx, NB_SHAPE(3));
  tc_assert_close(gr[1], gw, NB_SHAPE(3));
  free(x);
  free(wv);
  nb_fn_release(g);
}

/* RNN: h' = tanh(W h + x_t), y_t = h' * v; loss = sum(ys^2) + sum(h_T) */
typedef struct rnn {
  bool reverse;
} rnn;
BODY(rnn_step) {
  UNUSED_ARGS;
  const ctx *c = u;
  nb_tensor *h = nb_tanh(nb_add(nb_matmul(c->w, in[0]), in[1]));
  out[0] = h;
  out[1] = nb_mul(h, c->v);
  return outs_ok(out, 2);
}
BODY(rnn_loss) {
  UNUSED_ARGS;
  const rnn *r = u;
  ctx c = {.w = in[2], .v = in[3]};
  nb_fn *step = nb_fn_create(rnn_step, &c, 2, 2);
  nb_tensor *h[1], *ys[1];
  nb_status st = nb_scan(step, in, 1, in + 1, 1, r->reverse, h, ys);
  nb_fn_release(step);
  if (st) return st;
  out[0] = nb_add(nb_sum(nb_square(ys[0]), NB_ALL, false), nb_sum(h[0], NB_ALL, false));
  return outs_ok(out, 1);
}

Test(control, grad_through_scan_both_directions_second_order) {
  enum { T = 4, H = 3 };
  uint64_t seed = 5;
  nb_tensor *h0 = tc_rand_f64(NB_SHAPE(H), -1, 1, &seed);
  nb_tensor *xs = tc_rand_f64(NB_SHAPE(T, H), -1, 1, &seed);
  nb_tensor *W = tc_rand_f64(NB_SHAPE(H, H), -0.8, 0.8, &seed);
  nb_tensor *v = tc_rand_f64(NB_SHAPE(H), -1, 1, &seed);
  for (int rev = 0; rev < 2; rev++) {
    rnn r = {.reverse = rev};
    tc_check_grad(rev ? "scan reverse" : "scan", rnn_loss, &r, 4, (nb_tensor *[]){h0, xs, W, v},
                  TC_SECOND);
  }
}

/* x^4 as a scan (carry c *= x, x captured, 4 steps): grad 4x^3, grad of grad 12x^2 */
BODY(pow_step) {
  UNUSED_ARGS;
  out[0] = nb_mul(in[0], ((const ctx *)u)->w);
  return outs_ok(out, 1);
}
BODY(pow4) {
  UNUSED_ARGS;
  ctx c = {.w = in[0]};
  nb_fn *step = nb_fn_create(pow_step, &c, 2, 1);
  nb_tensor *steps = nb_zeros(NB_SHAPE(4), NB_F64);
  nb_status st = nb_scan(step, (nb_tensor *[]){nb_ones(nb_shape_of(in[0]), NB_F64)}, 1, &steps, 1,
                         false, out, NULL);
  nb_fn_release(step);
  return st;
}

Test(control, grad_of_grad_through_scan) {
  nb_fn *f = nb_fn_create(pow4, NULL, 1, 1), *g = nb_grad(f, NB_ALL), *gg = nb_grad(g, NB_ALL);
  nb_fn *ggg = nb_grad(gg, NB_ALL);
  double xs[] = {0.7, -1.3, 2};
  for (int i = 0; i < 3; i++) {
    double x = xs[i];
    nb_tensor *in = nb_scalar(x, NB_F64), *o[1];
    cr_assert_eq(nb_call(f, &in, o), NB_OK, "%s", nb_last_error());
    cr_assert_float_eq(nb_item(o[0]), pow(x, 4), 1e-12);
    cr_assert_eq(nb_call(g, &in, o), NB_OK, "%s", nb_last_error());
    cr_assert_float_eq(nb_item(o[0]), 4 * pow(x, 3), 1e-12);
    cr_assert_eq(nb_call(gg, &in, o), NB_OK, "%s", nb_last_error());
    cr_assert_float_eq(nb_item(o[0]), 12 * x * x, 1e-11);
    cr_assert_eq(nb_call(ggg, &in, o), NB_OK, "%s", nb_last_error());
    cr_assert_float_eq(nb_item(o[0]), 24 * x, 1e-11);
  }
  nb_fn *fs[] = {f, g, gg, ggg};
  for (int i = 0; i < 4; i++)
    nb_fn_release(fs[i]);
}

/* fori: x <- sin(x * w) + 0.1 i, 5 times, w captured; loss = sum(x * x) */
BODY(fg_body) {
  UNUSED_ARGS;
  nb_tensor *fi = nb_mul_scalar(nb_cast(in[0], NB_F64), 0.1);
  out[0] = nb_add(nb_sin(nb_mul(in[1], ((const ctx *)u)->w)), fi);
  return outs_ok(out, 1);
}
BODY(fori_loss) {
  UNUSED_ARGS;
  ctx c = {.w = in[1]};
  nb_fn *body = nb_fn_create(fg_body, &c, 2, 1);
  nb_tensor *x[1];
  nb_status st = nb_fori_loop(1, 6, body, in, 1, x);
  nb_fn_release(body);
  if (st) return st;
  out[0] = nb_sum(nb_square(x[0]), NB_ALL, false);
  return outs_ok(out, 1);
}

/* a scan without carry: loss = sum(scan(x_t * w)^2) with w captured, reversed */
BODY(map_loss) {
  UNUSED_ARGS;
  ctx c = {.w = in[1]};
  nb_fn *body = nb_fn_create(map_body, &c, 1, 1);
  nb_tensor *ys[1];
  nb_status st = nb_scan(body, NULL, 0, in, 1, true, NULL, ys);
  nb_fn_release(body);
  if (st) return st;
  out[0] = nb_sum(nb_square(ys[0]), NB_ALL, false);
  return outs_ok(out, 1);
}

Test(control, grad_through_scan_without_carry) {
  uint64_t seed = 9;
  nb_tensor *xs = tc_rand_f64(NB_SHAPE(4, 3), -1, 1, &seed);
  nb_tensor *w = tc_rand_f64(NB_SHAPE(3), -1, 1, &seed);
  tc_check_grad("scan without carry", map_loss, NULL, 2, (nb_tensor *[]){xs, w}, TC_SECOND);
}

Test(control, grad_through_fori_loop) {
  uint64_t seed = 3;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 2), -1, 1, &seed);
  nb_tensor *w = tc_rand_f64(NB_SHAPE(2, 2), 0.5, 1.5, &seed);
  tc_check_grad("fori_loop", fori_loss, NULL, 2, (nb_tensor *[]){x, w}, TC_SECOND);
}

/* while: x <- x * a + sin(x) while sum(x^2) < 50 (a captured); out = x */
BODY(grow_cond) {
  UNUSED_ARGS;
  out[0] = nb_lt_scalar(nb_sum(nb_square(in[0]), NB_ALL, false), 50);
  return outs_ok(out, 1);
}
BODY(grow_body) {
  UNUSED_ARGS;
  out[0] = nb_add(nb_mul(in[0], ((const ctx *)u)->w), nb_sin(in[0]));
  out[1] = nb_add_scalar(in[1], 1);
  return outs_ok(out, 2);
}
BODY(grow) {
  UNUSED_ARGS;
  ctx c = {.w = in[1]};
  nb_fn *cf = nb_fn_create(grow_cond, NULL, 2, 1), *bf = nb_fn_create(grow_body, &c, 2, 2);
  nb_tensor *r[2];
  nb_status st = nb_while_loop(cf, bf, (nb_tensor *[]){in[0], nb_scalar(0, NB_I64)}, 2, r);
  nb_fn_release(cf);
  nb_fn_release(bf);
  out[0] = r[0];
  if (n_out > 1) out[1] = r[1];
  return st;
}

Test(control, jvp_through_while_loop) {
  double xv[3] = {0.3, -0.5, 0.8}, av[3] = {1.3, 1.1, 1.2}, vx[3] = {0.7, -0.2, 0.4},
         va[3] = {-0.3, 0.5, 0.1};
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(3), NB_F64), *a = tc_tensor(av, NB_SHAPE(3), NB_F64);
  nb_fn *f = nb_fn_create(grow, NULL, 2, 2), *j = nb_jvp_fn(f);
  nb_tensor *o[4];
  cr_assert_eq(nb_call(j,
                       (nb_tensor *[]){x, a, tc_tensor(vx, NB_SHAPE(3), NB_F64),
                                       tc_tensor(va, NB_SHAPE(3), NB_F64)},
                       o),
               NB_OK, "%s", nb_last_error());
  /* the iteration count is data-dependent and stays put under a small step */
  double h = 1e-6, fp[3], fm[3], fd[3];
  int64_t n_iter = (int64_t)nb_item(o[1]);
  cr_assert_gt(n_iter, 2);
  cr_assert_eq(nb_dtype_of(o[3]), NB_I64);
  cr_assert_eq(nb_item(o[3]), 0); /* the integer carry has a zero tangent */
  for (int sgn = 0; sgn < 2; sgn++) {
    double s = sgn ? -h : h, xp[3], ap[3];
    for (int i = 0; i < 3; i++)
      xp[i] = xv[i] + s * vx[i], ap[i] = av[i] + s * va[i];
    nb_tensor *r[2];
    cr_assert_eq(nb_call(f,
                         (nb_tensor *[]){tc_tensor(xp, NB_SHAPE(3), NB_F64),
                                         tc_tensor(ap, NB_SHAPE(3), NB_F64)},
                         r),
                 NB_OK);
    cr_assert_eq((int64_t)nb_item(r[1]), n_iter);
    double *v = tc_read(r[0]);
    memcpy(sgn ? fm : fp, v, sizeof fp);
    free(v);
  }
  for (int i = 0; i < 3; i++)
    fd[i] = (fp[i] - fm[i]) / (2 * h);
  double *jv = tc_read(o[2]);
  tc_assert_vec_close("while jvp", "vs finite differences", jv, fd, 3, 1e-6);
  free(jv);
  nb_fn_release(j);
  nb_fn_release(f);
}

Test(control, reverse_mode_through_while_is_an_error) {
  nb_fn *f = nb_fn_create(grow, NULL, 2, 1), *g = nb_vjp_fn(f);
  nb_tensor *x = nb_full(NB_SHAPE(3), 0.5, NB_F64), *a = nb_full(NB_SHAPE(3), 1.2, NB_F64), *o[3];
  cr_assert_neq(nb_call(g, (nb_tensor *[]){x, a, nb_ones(NB_SHAPE(3), NB_F64)}, o), NB_OK);
  cr_assert_null(o[0]);
  tc_assert_error(NB_ERR_ARG, "nb_while_loop: reverse-mode differentiation needs a static trip "
                              "count; use nb_fori_loop or nb_scan");
  /* imperative backward reports the same */
  nb_set_requires_grad(a, true);
  nb_tensor *r[1];
  cr_assert_eq(grow(NULL, (nb_tensor *[]){x, a}, 2, r, 1), NB_OK, "%s", nb_last_error());
  cr_assert_neq(nb_backward(nb_sum(r[0], NB_ALL, false)), NB_OK);
  tc_assert_error(NB_ERR_ARG, "needs a static trip count");
  cr_assert_null(nb_grad_of(a));
  nb_fn_release(g);
  nb_fn_release(f);
}

/* imperative: W and v require grad; the RNN loss; nb_backward vs nb_grad */
Test(control, backward_through_scan_with_requires_grad_leaves) {
  enum { T = 5, H = 3 };
  uint64_t seed = 21;
  nb_tensor *h0 = tc_rand_f64(NB_SHAPE(H), -1, 1, &seed);
  nb_tensor *xs = tc_rand_f64(NB_SHAPE(T, H), -1, 1, &seed);
  nb_tensor *W = nb_set_requires_grad(tc_rand_f64(NB_SHAPE(H, H), -0.8, 0.8, &seed), true);
  nb_tensor *v = nb_set_requires_grad(tc_rand_f64(NB_SHAPE(H), -1, 1, &seed), true);
  rnn r = {.reverse = false};
  nb_tensor *loss[1];
  cr_assert_eq(rnn_loss(&r, (nb_tensor *[]){h0, xs, W, v}, 4, loss, 1), NB_OK, "%s",
               nb_last_error());
  double l = nb_item(loss[0]);
  cr_assert_eq(nb_backward(loss[0]), NB_OK, "%s", nb_last_error());
  nb_fn *f = nb_fn_create(rnn_loss, &r, 4, 1), *vg = nb_value_and_grad(f, NB_AXES(2, 3));
  nb_tensor *o[3];
  cr_assert_eq(nb_call(vg, (nb_tensor *[]){h0, xs, W, v}, o), NB_OK, "%s", nb_last_error());
  cr_assert_float_eq(nb_item(o[0]), l, 1e-12);
  double *gw = tc_read(o[1]), *gv = tc_read(o[2]);
  tc_assert_close(nb_grad_of(W), gw, NB_SHAPE(H, H));
  tc_assert_close(nb_grad_of(v), gv, NB_SHAPE(H));
  free(gw);
  free(gv);
  nb_fn_release(vg);
  nb_fn_release(f);
}

/* nesting: a scan whose step branches, c' = cond(x_t > 0, c * x_t * w, c + sin(x_t)), with an
 * integer step counter in the carry; loss = sum(c_T) + sum(ys) */
BODY(nest_then) {
  UNUSED_ARGS;
  out[0] = nb_mul(nb_mul(in[0], in[1]), ((const ctx *)u)->w);
  return outs_ok(out, 1);
}
BODY(nest_else) {
  UNUSED_ARGS;
  out[0] = nb_add(in[0], nb_sin(in[1]));
  return outs_ok(out, 1);
}
BODY(nest_step) {
  UNUSED_ARGS;
  nb_fn *t = nb_fn_create(nest_then, u, 2, 1), *e = nb_fn_create(nest_else, NULL, 2, 1);
  nb_tensor *pred = nb_gt_scalar(nb_sum(in[2], NB_ALL, false), 0), *r[1];
  nb_status st = nb_cond(pred, t, e, (nb_tensor *[]){in[0], in[2]}, 2, r);
  nb_fn_release(t);
  nb_fn_release(e);
  if (st) return st;
  out[0] = r[0];
  out[1] = nb_add_scalar(in[1], 1);
  out[2] = nb_mul(r[0], nb_cast(in[1], NB_F64));
  return outs_ok(out, 3);
}
BODY(nest_loss) {
  UNUSED_ARGS;
  ctx c = {.w = in[2]};
  nb_fn *step = nb_fn_create(nest_step, &c, 3, 3);
  nb_tensor *co[2], *ys[1];
  nb_status st =
      nb_scan(step, (nb_tensor *[]){in[0], nb_scalar(1, NB_I32)}, 2, in + 1, 1, false, co, ys);
  nb_fn_release(step);
  if (st) return st;
  out[0] = nb_add(nb_sum(co[0], NB_ALL, false), nb_sum(ys[0], NB_ALL, false));
  return outs_ok(out, 1);
}

Test(control, grad_through_cond_nested_in_scan) {
  uint64_t seed = 8;
  nb_tensor *c0 = tc_rand_f64(NB_SHAPE(2), -1, 1, &seed);
  double xv[5 * 2] = {0.5, 0.3, -0.4, -0.6, 0.9, -0.2, -0.7, 0.1, 0.3, 0.4};
  nb_tensor *xs = tc_tensor(xv, NB_SHAPE(5, 2), NB_F64);
  nb_tensor *w = tc_rand_f64(NB_SHAPE(2), 0.5, 1.5, &seed);
  tc_check_grad("cond in scan", nest_loss, NULL, 3, (nb_tensor *[]){c0, xs, w}, TC_SECOND);
  /* forward value against the same loop in C */
  double c[2], *cv = tc_read(c0), *wv = tc_read(w), total = 0;
  memcpy(c, cv, sizeof c);
  for (int t = 0; t < 5; t++) {
    bool pos = xv[2 * t] + xv[2 * t + 1] > 0;
    for (int d = 0; d < 2; d++) {
      double x = xv[2 * t + d];
      c[d] = pos ? c[d] * x * wv[d] : c[d] + sin(x);
      total += c[d] * (t + 1);
    }
  }
  total += c[0] + c[1];
  nb_tensor *o[1];
  cr_assert_eq(nest_loss(NULL, (nb_tensor *[]){c0, xs, w}, 3, o, 1), NB_OK, "%s", nb_last_error());
  cr_assert_float_eq(nb_item(o[0]), total, 1e-12);
  free(cv);
  free(wv);
}

/* ---- vmap ------------------------------------------------------------------------------------
 * Each batched result is compared with a loop of the unbatched function over
 * the examples (rows of the host data). */

/* Row b of a (B, ...) host array as a tensor of the example's shape. */
static nb_tensor *row_of(const double *x, nb_shape s, int64_t b, nb_dtype dt) {
  nb_shape r = {.ndim = s.ndim - 1};
  memcpy(r.dims, s.dims + 1, sizeof(int64_t) * (size_t)r.ndim);
  return tc_tensor(x + b * tc_numel(r), r, dt);
}

/* Asserts out (B, ...) row b equals the unbatched result r. */
static void assert_row(nb_tensor *out, int64_t b, nb_tensor *r, double tol) {
  double *all = tc_read(out), *one = tc_read(r);
  int64_t n = nb_numel(r);
  cr_assert_eq(nb_shape_of(out).dims[0] * n, nb_numel(out));
  for (int64_t i = 0; i < n; i++)
    cr_assert(fabs(all[b * n + i] - one[i]) <= tol * (1 + fabs(one[i])),
              "row %lld element %lld: %.17g vs %.17g", (long long)b, (long long)i, all[b * n + i],
              one[i]);
  free(all);
  free(one);
}

/* f(pred, x, y) = cond(pred, then, else, x, y)[0], w captured (unbatched) */
BODY(vcond) {
  UNUSED_ARGS;
  nb_fn *t = nb_fn_create(br_then, NULL, 2, 2), *e = nb_fn_create(br_else, u, 2, 2);
  nb_tensor *r[2];
  nb_status st = nb_cond(in[0], t, e, in + 1, 2, r);
  nb_fn_release(t);
  nb_fn_release(e);
  out[0] = r[0];
  out[1] = r[1];
  return st;
}

/* the same with the predicate computed per example: sum(x) > 0 */
BODY(vcond_data) {
  UNUSED_ARGS;
  nb_tensor *ins[3] = {nb_gt_scalar(nb_sum(in[0], NB_ALL, false), 0), in[0], in[1]};
  return vcond(u, ins, 3, out, 2);
}

Test(control, vmap_cond_unbatched_and_batched_pred) {
  enum { B = 5, D = 3 };
  uint64_t seed = 31;
  double xv[B * D], yv[B * D], wv[D] = {2, -1, 0.5};
  tc_fill(xv, B * D, -1, 1, &seed);
  tc_fill(yv, B * D, -1, 1, &seed);
  ctx c = {.w = tc_tensor(wv, NB_SHAPE(D), NB_F64)};
  nb_tensor *x = tc_tensor(xv, NB_SHAPE(B, D), NB_F64), *y = tc_tensor(yv, NB_SHAPE(B, D), NB_F64);
  /* unbatched pred, y unbatched too (its row 0 for every example) */
  nb_fn *f = nb_fn_create(vcond, &c, 3, 2);
  nb_fn *vf = nb_vmap(f, (int[]){NB_NOT_MAPPED, 0, NB_NOT_MAPPED}, NULL);
  nb_tensor *y0 = row_of(yv, NB_SHAPE(B, D), 0, NB_F64);
  for (int p = 0; p < 2; p++) {
    nb_tensor *pred = nb_scalar(p, NB_BOOL), *o[2];
    cr_assert_eq(nb_call(vf, (nb_tensor *[]){pred, x, y0}, o), NB_OK, "%s", nb_last_error());
    for (int64_t b = 0; b < B; b++) {
      nb_tensor *r[2];
      cr_assert_eq(nb_call(f, (nb_tensor *[]){pred, row_of(xv, NB_SHAPE(B, D), b, NB_F64), y0}, r),
                   NB_OK);
      assert_row(o[0], b, r[0], 1e-15);
      assert_row(o[1], b, r[1], 0);
    }
  }
  /* batched pred: each example takes its own branch */
  nb_fn *g = nb_fn_create(vcond_data, &c, 2, 2), *vg = nb_vmap(g, NULL, NULL);
  nb_tensor *o[2];
  cr_assert_eq(nb_call(vg, (nb_tensor *[]){x, y}, o), NB_OK, "%s", nb_last_error());
  int n_then = 0;
  for (int64_t b = 0; b < B; b++) {
    nb_tensor *r[2], *xb = row_of(xv, NB_SHAPE(B, D), b, NB_F64);
    cr_assert_eq(nb_call(g, (nb_tensor *[]){xb, row_of(yv, NB_SHAPE(B, D), b, NB_F64)}, r), NB_OK);
    n_then += nb_item(nb_sum(xb, NB_ALL, false)) > 0;
    assert_row(o[0], b, r[0], 1e-15);
    assert_row(o[1], b, r[1], 0);
  }
  cr_assert(n_then > 0 && n_then < B, "the data takes both branches (%d of %d then)", n_then, B);
  nb_fn *fs[] = {f, vf, g, vg};
  for (int i = 0; i < 4; i++)
    nb_fn_release(fs[i]);
}

/* Collatz from a batch of starts: per-example trip counts */
BODY(collatz) {
  UNUSED_ARGS;
  nb_fn *c = nb_fn_create(collatz_cond, NULL, 2, 1), *b = nb_fn_create(collatz_body, NULL, 2, 2);
  nb_status st = nb_while_loop(c, b, (nb_tensor *[]){in[0], nb_scalar(0, NB_I64)}, 2, out);
  nb_fn_release(c);
  nb_fn_release(b);
  return st;
}

/* Newton for sqrt(a) with a batched and captured by both cond and body */
BODY(newton) {
  UNUSED_ARGS;
  ctx c = {.w = in[0]};
  nb_fn *cf = nb_fn_create(newton_cond, &c, 2, 1), *bf = nb_fn_create(newton_body, &c, 2, 2);
  nb_status st = nb_while_loop(
      cf, bf, (nb_tensor *[]){nb_ones(nb_shape_of(in[0]), NB_F64), nb_scalar(0, NB_I32)}, 2, out);
  nb_fn_release(cf);
  nb_fn_release(bf);
  return st;
}

Test(control, vmap_while_batched_predicate_per_example_trip_counts) {
  enum { B = 5 };
  double starts[B] = {6, 1, 27, 7, 2};
  nb_fn *f = nb_fn_create(collatz, NULL, 1, 2), *vf = nb_vmap(f, NULL, NULL);
  nb_tensor *o[2];
  cr_assert_eq(nb_call(vf, (nb_tensor *[]){tc_tensor(starts, NB_SHAPE(B), NB_F64)}, o), NB_OK, "%s",
               nb_last_error());
  double ones[B] = {1, 1, 1, 1, 1}, steps[B];
  for (int b = 0; b < B; b++)
    steps[b] = (double)collatz_steps((int64_t)starts[b]);
  tc_assert_close(o[0], ones, NB_SHAPE(B));
  tc_assert_close(o[1], steps, NB_SHAPE(B));
  /* captured batched operand, vector carry per example */
  enum { D = 2 };
  double av[B * D] = {2, 3, 0.5, 100, 9, 16, 0.01, 1, 7, 5};
  nb_fn *g = nb_fn_create(newton, NULL, 1, 2), *vg = nb_vmap(g, NULL, NULL);
  cr_assert_eq(nb_call(vg, (nb_tensor *[]){tc_tensor(av, NB_SHAPE(B, D), NB_F64)}, o), NB_OK, "%s",
               nb_last_error());
  bool differ = false;
  for (int64_t b = 0; b < B; b++) {
    nb_tensor *r[2];
    cr_assert_eq(nb_call(g, (nb_tensor *[]){row_of(av, NB_SHAPE(B, D), b, NB_F64)}, r), NB_OK);
    assert_row(o[0], b, r[0], 0);
    assert_row(o[1], b, r[1], 0);
    differ |= nb_item(r[1]) != nb_item(nb_max(o[1], NB_ALL, false));
  }
  cr_assert(differ, "the examples need different iteration counts");
  nb_fn *fs[] = {f, vf, g, vg};
  for (int i = 0; i < 4; i++)
    nb_fn_release(fs[i]);
}

/* cum_body scan over (x [T, D], k [T]) from (s0, p0): outputs carry 0, 1 and ys 0, 1 */
typedef struct scan_opts {
  bool reverse;
} scan_opts;
BODY(cum_scan) {
  UNUSED_ARGS;
  const scan_opts *so = u;
  nb_fn *body = nb_fn_create(cum_body, NULL, 4, 4);
  nb_status st = nb_scan(body, in, 2, in + 2, 2, so->reverse, out, out + 2);
  nb_fn_release(body);
  return st;
}

Test(control, vmap_scan_batched_xs_and_carries) {
  enum { B = 3, T = 4, D = 2 };
  uint64_t seed = 41;
  double s0[B * D], p0[B * D], xv[B * T * D], kv[T] = {1, 5, 9, 13};
  tc_fill(s0, B * D, -1, 1, &seed);
  tc_fill(p0, B * D, 0.5, 1.5, &seed);
  tc_fill(xv, B * T * D, 0.5, 1.5, &seed);
  nb_tensor *S0 = tc_tensor(s0, NB_SHAPE(B, D), NB_F64);
  nb_tensor *X = tc_tensor(xv, NB_SHAPE(B, T, D), NB_F64), *K = tc_tensor(kv, NB_SHAPE(T), NB_I64);
  for (int rev = 0; rev < 2; rev++) {
    scan_opts so = {.reverse = rev};
    nb_fn *f = nb_fn_create(cum_scan, &so, 4, 4);
    /* carry 0 batched, carry 1 not; x batched, k not */
    nb_fn *vf = nb_vmap(f, (int[]){0, NB_NOT_MAPPED, 0, NB_NOT_MAPPED}, NULL);
    nb_tensor *p1 = row_of(p0, NB_SHAPE(B, D), 1, NB_F64), *o[4];
    cr_assert_eq(nb_call(vf, (nb_tensor *[]){S0, p1, X, K}, o), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_shape_of(o[2]).dims[1], T);
    for (int64_t b = 0; b < B; b++) {
      nb_tensor *r[4];
      cr_assert_eq(nb_call(f,
                           (nb_tensor *[]){row_of(s0, NB_SHAPE(B, D), b, NB_F64), p1,
                                           row_of(xv, NB_SHAPE(B, T, D), b, NB_F64), K},
                           r),
                   NB_OK);
      for (int j = 0; j < 4; j++)
        assert_row(o[j], b, r[j], 1e-15);
    }
    /* x mapped along axis 1 of a (T, B, D) layout, outputs' batch axis last */
    double xt[T * B * D];
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++)
          xt[(t * B + b) * D + d] = xv[(b * T + t) * D + d];
    nb_fn *vf1 = nb_vmap(f, (int[]){0, NB_NOT_MAPPED, 1, NB_NOT_MAPPED}, (int[]){0, 0, 0, -1});
    nb_tensor *o1[4];
    cr_assert_eq(
        nb_call(vf1, (nb_tensor *[]){S0, p1, tc_tensor(xt, NB_SHAPE(T, B, D), NB_F64), K}, o1),
        NB_OK, "%s", nb_last_error());
    double *a = tc_read(o[2]);
    tc_assert_close(o1[2], a, NB_SHAPE(B, T, D));
    cr_assert(nbi_shape_eq(&o1[3]->shape, &NB_SHAPE(T, B)));
    free(a);
    nb_fn_release(vf1);
    nb_fn_release(vf);
    nb_fn_release(f);
  }
}

/* per-example gradients: vmap(grad(loss)) with loss a scan of h' = tanh(h * w + x_t) */
BODY(ew_step) {
  UNUSED_ARGS;
  nb_tensor *h = nb_tanh(nb_add(nb_mul(in[0], ((const ctx *)u)->w), in[1]));
  out[0] = h;
  out[1] = nb_square(h);
  return outs_ok(out, 2);
}
BODY(ew_loss) {
  UNUSED_ARGS;
  ctx c = {.w = in[1]};
  nb_fn *step = nb_fn_create(ew_step, &c, 2, 2);
  nb_tensor *h[1], *ys[1];
  nb_status st = nb_scan(step, in, 1, in + 2, 1, false, h, ys);
  nb_fn_release(step);
  if (st) return st;
  out[0] = nb_add(nb_sum(ys[0], NB_ALL, false), nb_sum(nb_sin(h[0]), NB_ALL, false));
  return outs_ok(out, 1);
}

/* sum(f(in)[0]) for the nb_fn f in user */
BODY(sum_of) {
  UNUSED_ARGS;
  nb_tensor *r[1];
  nb_status st = nb_call((nb_fn *)u, in, r);
  if (st) return st;
  out[0] = nb_sum(r[0], NB_ALL, false);
  return outs_ok(out, 1);
}

Test(control, vmap_of_grad_and_grad_of_vmap_through_scan) {
  enum { B = 4, T = 3, D = 2 };
  uint64_t seed = 51;
  double hv[B * D], wv[B * D], xv[T * D];
  tc_fill(hv, B * D, -1, 1, &seed);
  tc_fill(wv, B * D, -1, 1, &seed);
  tc_fill(xv, T * D, -1, 1, &seed);
  nb_tensor *X = tc_tensor(xv, NB_SHAPE(T, D), NB_F64);
  nb_fn *f = nb_fn_create(ew_loss, NULL, 3, 1), *g = nb_grad(f, NB_AXES(0, 1));
  nb_fn *vg = nb_vmap(g, (int[]){0, 0, NB_NOT_MAPPED}, NULL);
  nb_tensor *o[2];
  cr_assert_eq(nb_call(vg,
                       (nb_tensor *[]){tc_tensor(hv, NB_SHAPE(B, D), NB_F64),
                                       tc_tensor(wv, NB_SHAPE(B, D), NB_F64), X},
                       o),
               NB_OK, "%s", nb_last_error());
  for (int64_t b = 0; b < B; b++) {
    nb_tensor *r[2];
    cr_assert_eq(nb_call(g,
                         (nb_tensor *[]){row_of(hv, NB_SHAPE(B, D), b, NB_F64),
                                         row_of(wv, NB_SHAPE(B, D), b, NB_F64), X},
                         r),
                 NB_OK, "%s", nb_last_error());
    assert_row(o[0], b, r[0], 1e-14);
    assert_row(o[1], b, r[1], 1e-14);
  }
  /* grad of vmap: the gradient of the summed per-example losses has the
   * per-example gradients as rows */
  nb_fn *vf = nb_vmap(f, (int[]){0, 0, NB_NOT_MAPPED}, NULL);
  nb_fn *tot = nb_fn_create(sum_of, vf, 3, 1), *gt = nb_grad(tot, NB_AXES(0, 1));
  nb_tensor *o2[2];
  cr_assert_eq(nb_call(gt,
                       (nb_tensor *[]){tc_tensor(hv, NB_SHAPE(B, D), NB_F64),
                                       tc_tensor(wv, NB_SHAPE(B, D), NB_F64), X},
                       o2),
               NB_OK, "%s", nb_last_error());
  for (int j = 0; j < 2; j++) {
    double *a = tc_read(o[j]);
    tc_assert_close(o2[j], a, NB_SHAPE(B, D));
    free(a);
  }
  nb_fn_release(gt);
  nb_fn_release(tot);
  nb_fn_release(vf);
  nb_fn_release(vg);
  nb_fn_release(g);
  nb_fn_release(f);
}

/* forward mode of a batched while: jvp(vmap(f)) against jvp of each example */
Test(control, jvp_of_vmapped_while_loop) {
  enum { B = 3, D = 3 };
  double xv[B * D] = {0.3, -0.5, 0.8, 1.1, 0.2, -0.1, 2.0, 1.5, -1.0};
  double av[D] = {1.3, 1.1, 1.2}, vx[B * D], va[D] = {-0.3, 0.5, 0.1};
  uint64_t seed = 61;
  tc_fill(vx, B * D, -1, 1, &seed);
  nb_tensor *a = tc_tensor(av, NB_SHAPE(D), NB_F64), *ta = tc_tensor(va, NB_SHAPE(D), NB_F64);
  nb_fn *f = nb_fn_create(grow, NULL, 2, 2), *vf = nb_vmap(f, (int[]){0, NB_NOT_MAPPED}, NULL);
  nb_fn *jv = nb_jvp_fn(vf), *j = nb_jvp_fn(f);
  nb_tensor *o[4];
  cr_assert_eq(nb_call(jv,
                       (nb_tensor *[]){tc_tensor(xv, NB_SHAPE(B, D), NB_F64), a,
                                       tc_tensor(vx, NB_SHAPE(B, D), NB_F64), ta},
                       o),
               NB_OK, "%s", nb_last_error());
  double counts[B];
  for (int64_t b = 0; b < B; b++) {
    nb_tensor *r[4];
    cr_assert_eq(nb_call(j,
                         (nb_tensor *[]){row_of(xv, NB_SHAPE(B, D), b, NB_F64), a,
                                         row_of(vx, NB_SHAPE(B, D), b, NB_F64), ta},
                         r),
                 NB_OK, "%s", nb_last_error());
    for (int k = 0; k < 4; k++)
      assert_row(o[k], b, r[k], 1e-13);
    counts[b] = nb_item(r[1]);
  }
  cr_assert(counts[0] != counts[2], "per-example trip counts differ");
  nb_fn *fs[] = {f, vf, jv, j};
  for (int i = 0; i < 4; i++)
    nb_fn_release(fs[i]);
}

/* per-example RNN gradients (batched matmul inside the step) */
Test(control, vmap_of_grad_of_rnn_scan) {
  enum { B = 3, T = 4, H = 3 };
  uint64_t seed = 71;
  double hv[B * H], xv[B * T * H];
  tc_fill(hv, B * H, -1, 1, &seed);
  tc_fill(xv, B * T * H, -1, 1, &seed);
  nb_tensor *W = tc_rand_f64(NB_SHAPE(H, H), -0.8, 0.8, &seed);
  nb_tensor *v = tc_rand_f64(NB_SHAPE(H), -1, 1, &seed);
  for (int rev = 0; rev < 2; rev++) {
    rnn r = {.reverse = rev};
    nb_fn *f = nb_fn_create(rnn_loss, &r, 4, 1), *g = nb_grad(f, NB_ALL);
    nb_fn *vg = nb_vmap(g, (int[]){0, 0, NB_NOT_MAPPED, NB_NOT_MAPPED}, NULL);
    nb_tensor *o[4];
    cr_assert_eq(nb_call(vg,
                         (nb_tensor *[]){tc_tensor(hv, NB_SHAPE(B, H), NB_F64),
                                         tc_tensor(xv, NB_SHAPE(B, T, H), NB_F64), W, v},
                         o),
                 NB_OK, "%s", nb_last_error());
    for (int64_t b = 0; b < B; b++) {
      nb_tensor *gr[4];
      cr_assert_eq(nb_call(g,
                           (nb_tensor *[]){row_of(hv, NB_SHAPE(B, H), b, NB_F64),
                                           row_of(xv, NB_SHAPE(B, T, H), b, NB_F64), W, v},
                           gr),
                   NB_OK, "%s", nb_last_error());
      for (int k = 0; k < 4; k++)
        assert_row(o[k], b, gr[k], 1e-13);
    }
    nb_fn_release(vg);
    nb_fn_release(g);
    nb_fn_release(f);
  }
}

/* repeated forward + backward through scans leaves no tensors behind */
Test(control, repeated_grads_keep_memory_flat) {
  uint64_t seed = 81;
  nb_tensor *h0 = tc_rand_f64(NB_SHAPE(3), -1, 1, &seed);
  nb_tensor *xs = tc_rand_f64(NB_SHAPE(6, 3), -1, 1, &seed);
  nb_tensor *W = tc_rand_f64(NB_SHAPE(3, 3), -0.8, 0.8, &seed);
  nb_tensor *v = tc_rand_f64(NB_SHAPE(3), -1, 1, &seed);
  rnn r = {.reverse = false};
  nb_fn *f = nb_fn_create(rnn_loss, &r, 4, 1), *g = nb_value_and_grad(f, NB_ALL);
  uint64_t live = 0;
  double first = 0;
  for (int it = 0; it < 30; it++) {
    nb_scope_begin();
    nb_tensor *o[5];
    cr_assert_eq(nb_call(g, (nb_tensor *[]){h0, xs, W, v}, o), NB_OK, "%s", nb_last_error());
    double l = nb_item(o[0]);
    if (it == 0) first = l;
    cr_assert_eq(l, first);
    nb_scope_end();
    if (it == 1) live = nb_get_stats().live_tensors;
    if (it > 1) cr_assert_eq(nb_get_stats().live_tensors, live, "iteration %d", it);
  }
  nb_fn_release(g);
  nb_fn_release(f);
}
