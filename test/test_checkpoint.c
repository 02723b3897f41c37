/* test/test_checkpoint.c — nb_checkpoint: forward values and derivatives equal
 * those of the function itself (and finite differences, to second order),
 * lower peak memory for a checkpointed chain, imperative backward, vmap
 * around and inside a checkpoint, several outputs (an integer one and a
 * passed-through input), captures, errors. */
#include "grad_check.h"

#include "../src/ops/rule_util.h"

TestSuite(checkpoint, .init = tc_setup, .fini = tc_teardown);

/* ---- functions used below --------------------------------------------------------- */
/* f(x, w) = (sin(x) * w + exp(x * c)), c a captured constant */
static nb_status f_mix(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *c = u;
  out[0] = nb_add(nb_mul(nb_sin(in[0]), in[1]), nb_exp(nb_mul(in[0], c)));
  return out[0] ? NB_OK : nb_last_status();
}

typedef struct wrap {
  nb_fn *f;
  int n_in;
} wrap;

/* sum of g(in)[0], g = the wrapped function (plain or checkpointed) */
static nb_status f_sum_of(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const wrap *w = u;
  nb_tensor *y[1];
  nb_status st = nb_call(w->f, in, y);
  if (st) return st;
  out[0] = nb_sum(y[0], NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* out[0] of the wrapped function (for tc_check_grad) */
static nb_status f_first(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const wrap *w = u;
  nb_tensor *y[4];
  nb_status st = nb_call(w->f, in, y);
  out[0] = y[0];
  return st;
}

/* Six elementwise ops, each of whose derivative needs its input or output. */
static nb_status f_segment(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = in[0];
  h = nb_tanh(h);
  h = nb_sin(h);
  h = nb_sigmoid(h);
  h = nb_cos(h);
  h = nb_tanh(h);
  out[0] = nb_sin(h);
  return out[0] ? NB_OK : nb_last_status();
}

#define N_SEG 8

/* sum(seg(seg(seg(seg(x))))) with seg the wrapped function */
static nb_status f_chain(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const wrap *w = u;
  nb_tensor *h = in[0];
  for (int s = 0; s < N_SEG; s++) {
    nb_tensor *next;
    nb_status st = nb_call(w->f, &h, &next);
    if (st) return st;
    h = next;
  }
  out[0] = nb_sum(h, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* Three outputs: sin(x) * w, x itself, argmax(x) (i64). */
static nb_status f_three(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_mul(nb_sin(in[0]), in[1]);
  out[1] = in[0];
  out[2] = nb_argmax(in[0], 0, false);
  return out[0] && out[2] ? NB_OK : nb_last_status();
}

static void assert_same(nb_tensor *a, nb_tensor *b, double tol) {
  cr_assert(a && b, "%s", nb_last_error());
  cr_assert(nbi_shape_eq(&a->shape, &b->shape) && a->dtype == b->dtype);
  double *bv = tc_read(b);
  tc_assert_close_tol(a, bv, nb_shape_of(b), tol);
  free(bv);
}

/* ---- values and derivatives ---------------------------------------------------------- */
Test(checkpoint, forward_and_derivatives_equal_the_function) {
  uint64_t seed = 5;
  nb_tensor *c = tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed);
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
            *w = tc_rand_f64(NB_SHAPE(3), -1, 1, &seed);
  nb_fn *f = nb_fn_create(f_mix, c, 2, 1), *cf = nb_checkpoint(f);
  cr_assert(cf, "%s", nb_last_error());
  cr_assert_eq(nb_fn_n_in(cf), 2);
  cr_assert_eq(nb_fn_n_out(cf), 1);
  nb_tensor *in[2] = {x, w}, *y[1], *cy[1];
  /* plain call: just f */
  cr_assert_eq(nb_call(f, in, y), NB_OK);
  cr_assert_eq(nb_call(cf, in, cy), NB_OK);
  assert_same(cy[0], y[0], 0);
  /* value and gradients under a transform: the REMAT node */
  wrap wp = {f, 2}, wc = {cf, 2};
  nb_fn *sp = nb_fn_create(f_sum_of, &wp, 2, 1), *sc = nb_fn_create(f_sum_of, &wc, 2, 1);
  nb_fn *vgp = nb_value_and_grad(sp, NB_ALL), *vgc = nb_value_and_grad(sc, NB_ALL);
  nb_tensor *op[3], *oc[3];
  cr_assert_eq(nb_call(vgp, in, op), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(vgc, in, oc), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 3; i++)
    assert_same(oc[i], op[i], 1e-14);
  /* the gradient in closed form: d/dx = cos(x) w + c exp(x c), d/dw = sum_rows sin(x) */
  double *xv = tc_read(x), *wv = tc_read(w), *cv = tc_read(c), gx[6], gw[3] = {0};
  for (int i = 0; i < 6; i++) {
    gx[i] = cos(xv[i]) * wv[i % 3] + cv[i] * exp(xv[i] * cv[i]);
    gw[i % 3] += sin(xv[i]);
  }
  tc_assert_close_tol(oc[1], gx, NB_SHAPE(2, 3), 1e-12);
  tc_assert_close_tol(oc[2], gw, NB_SHAPE(3), 1e-12);
  free(xv), free(wv), free(cv);
  nb_fn *fs[] = {f, cf, sp, sc, vgp, vgc};
  for (int i = 0; i < 6; i++)
    nb_fn_release(fs[i]);
}

Test(checkpoint, derivatives_match_finite_differences_to_second_order) {
  uint64_t seed = 6;
  nb_tensor *c = tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed);
  nb_tensor *xs[2] = {tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(3), -1, 1, &seed)};
  nb_fn *f = nb_fn_create(f_mix, c, 2, 1), *cf = nb_checkpoint(f);
  wrap w = {cf, 2};
  /* vjp, jvp, and H v by jvp(grad) and grad(grad), all through the checkpoint */
  tc_check_grad("checkpoint(f_mix)", f_first, &w, 2, xs, TC_SECOND);
  /* a checkpoint of a checkpoint */
  nb_fn *ccf = nb_checkpoint(cf);
  wrap w2 = {ccf, 2};
  tc_check_grad("checkpoint(checkpoint(f_mix))", f_first, &w2, 2, xs, TC_SECOND);
  nb_fn_release(ccf);
  nb_fn_release(cf);
  nb_fn_release(f);
}

Test(checkpoint, hessian_and_jvp_equal_the_function) {
  uint64_t seed = 7;
  nb_tensor *c = tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed);
  nb_tensor *in[2] = {tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(3), -1, 1, &seed)};
  nb_fn *f = nb_fn_create(f_mix, c, 2, 1), *cf = nb_checkpoint(f);
  wrap wp = {f, 2}, wc = {cf, 2};
  nb_fn *sp = nb_fn_create(f_sum_of, &wp, 2, 1), *sc = nb_fn_create(f_sum_of, &wc, 2, 1);
  nb_fn *hp = nb_hessian(sp, NB_ALL), *hc = nb_hessian(sc, NB_ALL);
  nb_tensor *op[4], *oc[4];
  cr_assert_eq(nb_call(hp, in, op), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(hc, in, oc), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 4; i++)
    assert_same(oc[i], op[i], 1e-13);
  /* jvp of f itself */
  nb_fn *jp = nb_jvp_fn(f), *jc = nb_jvp_fn(cf);
  nb_tensor *jin[4] = {in[0], in[1], tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
                       tc_rand_f64(NB_SHAPE(3), -1, 1, &seed)};
  cr_assert_eq(nb_call(jp, jin, op), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(jc, jin, oc), NB_OK, "%s", nb_last_error());
  assert_same(oc[0], op[0], 1e-14);
  assert_same(oc[1], op[1], 1e-14);
  nb_fn *fs[] = {f, cf, sp, sc, hp, hc, jp, jc};
  for (int i = 0; i < 8; i++)
    nb_fn_release(fs[i]);
}

Test(checkpoint, several_outputs_an_integer_one_and_an_input_passed_through) {
  uint64_t seed = 8;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(5), -1, 1, &seed),
            *w = tc_rand_f64(NB_SHAPE(5), -1, 1, &seed);
  nb_fn *f = nb_fn_create(f_three, NULL, 2, 3), *cf = nb_checkpoint(f);
  /* vjp with cotangents for the float outputs (the integer one gets zeros) */
  nb_fn *vp = nb_vjp_fn(f), *vc = nb_vjp_fn(cf);
  nb_tensor *vin[5] = {x, w, tc_rand_f64(NB_SHAPE(5), -1, 1, &seed),
                       tc_rand_f64(NB_SHAPE(5), -1, 1, &seed), nb_zeros(NB_SCALAR_SHAPE, NB_I64)};
  nb_tensor *op[5], *oc[5];
  cr_assert_eq(nb_call(vp, vin, op), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(vc, vin, oc), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 5; i++)
    assert_same(oc[i], op[i], 1e-14);
  /* d/dx = cos(x) w u0 + u1, d/dw = sin(x) u0 */
  double *xv = tc_read(x), *wv = tc_read(w), *u0 = tc_read(vin[2]), *u1 = tc_read(vin[3]);
  double gx[5], gw[5];
  for (int i = 0; i < 5; i++)
    gx[i] = cos(xv[i]) * wv[i] * u0[i] + u1[i], gw[i] = sin(xv[i]) * u0[i];
  tc_assert_close_tol(oc[3], gx, NB_SHAPE(5), 1e-14);
  tc_assert_close_tol(oc[4], gw, NB_SHAPE(5), 1e-14);
  /* jvp: tangents of the float outputs; zeros for the integer one */
  nb_fn *jp = nb_jvp_fn(f), *jc = nb_jvp_fn(cf);
  nb_tensor *jin[4] = {x, w, vin[2], vin[3]}, *jop[6], *joc[6];
  cr_assert_eq(nb_call(jp, jin, jop), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(jc, jin, joc), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 6; i++)
    assert_same(joc[i], jop[i], 1e-14);
  double am = 0;
  for (int i = 1; i < 5; i++)
    if (xv[i] > xv[(int)am]) am = i;
  tc_assert_close_tol(joc[2], &am, NB_SCALAR_SHAPE, 0);
  free(xv), free(wv), free(u0), free(u1);
  nb_fn *fs[] = {f, cf, vp, vc, jp, jc};
  for (int i = 0; i < 6; i++)
    nb_fn_release(fs[i]);
}

/* ---- memory ---------------------------------------------------------------------------- */
/* Peak bytes (above what was live before) of the gradient of the chain, and
 * the gradient into g (n floats). */
static uint64_t chain_grad_peak(nb_fn *seg, nb_tensor *x, float *g, int64_t n) {
  wrap w = {seg, 1};
  nb_fn *chain = nb_fn_create(f_chain, &w, 1, 1), *gf = nb_grad(chain, NB_ALL);
  nb_scope_begin();
  nb_reset_stats();
  uint64_t before = nb_get_stats().live_bytes;
  nb_tensor *out[1];
  cr_assert_eq(nb_call(gf, &x, out), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_to_host(out[0], g, sizeof(float) * (size_t)n), NB_OK, "%s", nb_last_error());
  uint64_t peak = nb_get_stats().peak_bytes - before;
  nb_scope_end();
  nb_fn_release(gf);
  nb_fn_release(chain);
  return peak;
}

Test(checkpoint, a_checkpointed_chain_lowers_peak_memory) {
  const int64_t n = 1 << 20; /* 4 MiB per f32 value */
  nb_tensor *x =
      nb_keep(nb_sub(nb_mul_scalar(nb_rand(NB_SHAPE(n), NB_F32), 2), nb_scalar(1, NB_F32)));
  cr_assert_eq(nb_eval(&x, 1), NB_OK);
  nb_fn *seg = nb_fn_create(f_segment, NULL, 1, 1), *cseg = nb_checkpoint(seg);
  float *g0 = malloc(sizeof(float) * (size_t)n), *g1 = malloc(sizeof(float) * (size_t)n);
  uint64_t plain = chain_grad_peak(seg, x, g0, n), ckpt = chain_grad_peak(cseg, x, g1, n);
  /* Measured: without checkpoints the peak grows by 3 values of 4 MiB per
   * segment (the backward keeps, until its turn, half of each segment's 6
   * forward values or the partial derivatives made from them): 26 values for
   * 8 segments. With them it grows by one value per segment (the segment's
   * input) plus one segment's recomputation at a time: 13 values. The header
   * promises "the segments' inputs plus one segment's internals", i.e. at
   * most 8 + 6 values, and that is well under 60% of the plain peak. */
  const uint64_t value = sizeof(float) * (uint64_t)n;
  cr_assert(ckpt <= (N_SEG + 6) * value, "peak with checkpoints %.1f values",
            (double)ckpt / (double)value);
  cr_assert(ckpt * 10 < plain * 6, "peak with checkpoints %.1f values, without %.1f",
            (double)ckpt / (double)value, (double)plain / (double)value);
  double err = 0;
  for (int64_t i = 0; i < n; i++)
    err = fmax(err, fabs((double)g0[i] - g1[i]) / (1 + fabs((double)g0[i])));
  cr_assert(err <= 1e-6, "the gradients differ by %g", err);
  /* and the gradient is right: a few elements against the chain rule */
  float *xv = malloc(sizeof(float) * (size_t)n);
  cr_assert_eq(nb_to_host(x, xv, sizeof(float) * (size_t)n), NB_OK);
  for (int64_t i = 0; i < n; i += n / 7) {
    double h = xv[i], d = 1;
    for (int s = 0; s < N_SEG; s++) {
      double a = tanh(h), b = sin(a), c = 1 / (1 + exp(-b)), e = cos(c), f = tanh(e);
      d *= (1 - a * a) * cos(a) * c * (1 - c) * -sin(c) * (1 - f * f) * cos(f);
      h = sin(f);
    }
    cr_assert(fabs(g1[i] - d) <= 1e-5 * (1 + fabs(d)), "element %lld: %g, chain rule %g",
              (long long)i, g1[i], d);
  }
  free(xv);
  free(g0);
  free(g1);
  nb_fn_release(cseg);
  nb_fn_release(seg);
}

/* ---- imperative autodiff ------------------------------------------------------------------ */
Test(checkpoint, imperative_backward_through_checkpoints) {
  uint64_t seed = 9;
  nb_tensor *c = tc_rand_f64(NB_SHAPE(4), -1, 1, &seed);
  double xs[4], ws[4];
  tc_fill(xs, 4, -1, 1, &seed);
  tc_fill(ws, 4, -1, 1, &seed);
  nb_fn *f = nb_fn_create(f_mix, c, 2, 1), *cf = nb_checkpoint(f);
  nb_tensor *g[2][2];
  for (int v = 0; v < 2; v++) {
    nb_tensor *x = nb_set_requires_grad(tc_tensor(xs, NB_SHAPE(4), NB_F64), true);
    nb_tensor *w = nb_set_requires_grad(tc_tensor(ws, NB_SHAPE(4), NB_F64), true);
    nb_tensor *in[2] = {x, w}, *y[1], *y2[1];
    nb_fn *use = v ? cf : f;
    cr_assert_eq(nb_call(use, in, y), NB_OK, "%s", nb_last_error());
    nb_tensor *in2[2] = {y[0], w};
    cr_assert_eq(nb_call(use, in2, y2), NB_OK, "%s", nb_last_error());
    nb_tensor *loss = nb_sum(nb_square(y2[0]), NB_ALL, false);
    cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
    g[v][0] = nb_grad_of(x);
    g[v][1] = nb_grad_of(w);
    cr_assert(g[v][0] && g[v][1]);
    /* one backward per forward, as without checkpoints */
    cr_assert_neq(nb_backward(loss), NB_OK);
    tc_assert_error(NB_ERR_STATE, "already freed");
  }
  assert_same(g[1][0], g[0][0], 1e-14);
  assert_same(g[1][1], g[0][1], 1e-14);
  nb_fn_release(cf);
  nb_fn_release(f);
}

/* ---- vmap ---------------------------------------------------------------------------------
 * The ops inside are custom ops with batching rules: ck_cube(x) = x^3 and its
 * derivative ck_cube_vjp(x, g) = 3 x^2 g, both elementwise (their batching
 * rule is the op itself on the batch). */
static nb_status ew_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in, nb_shape *os,
                          nb_dtype *od, int n_out) {
  (void)u, (void)n_out;
  for (int k = 1; k < n_in; k++)
    if (!nbi_shape_eq(&is[k], &is[0]) || id[k] != id[0])
      return nb_set_error(NB_ERR_SHAPE, "ck: inputs differ");
  if (id[0] != NB_F64) return nb_set_error(NB_ERR_DTYPE, "ck: f64 only");
  os[0] = is[0], od[0] = id[0];
  return NB_OK;
}

static nb_status cube_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                          int n_out) {
  (void)u, (void)n_in, (void)n_out;
  const double *x = in[0].data;
  double *y = out[0].data;
  for (int64_t i = 0; i < nbi_numel(&in[0].shape); i++)
    y[i] = x[i] * x[i] * x[i];
  return NB_OK;
}

static nb_status cube_vjp_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                              int n_out) {
  (void)u, (void)n_in, (void)n_out;
  const double *x = in[0].data, *g = in[1].data;
  double *y = out[0].data;
  for (int64_t i = 0; i < nbi_numel(&in[0].shape); i++)
    y[i] = 3 * x[i] * x[i] * g[i];
  return NB_OK;
}

/* user is the op's name */
static nb_status ew_batch(void *u, nb_tensor *const *in, const bool *batched, int n_in, int64_t B,
                          nb_tensor **out, int n_out) {
  nb_tensor *b[2];
  for (int k = 0; k < n_in; k++)
    b[k] = nbi_bat_expand(in[k], batched[k], B);
  return nb_custom_call(nb_custom_op_find(u), b, n_in, out, n_out);
}

static const nb_custom_op *ck_op(const char *name);

static nb_status cube_vjp(void *u, nb_tensor *const *in, int n_in, nb_tensor *const *out,
                          nb_tensor *const *ct, int n_out, nb_tensor **gin) {
  (void)u, (void)n_in, (void)out, (void)n_out;
  nb_tensor *a[2] = {in[0], ct[0]};
  return nb_custom_call(ck_op("ck_cube_vjp"), a, 2, gin, 1);
}

static nb_status cube_jvp(void *u, nb_tensor *const *in, nb_tensor *const *t, int n_in,
                          nb_tensor *const *out, int n_out, nb_tensor **tout) {
  (void)u, (void)n_in, (void)out, (void)n_out;
  nb_tensor *a[2] = {in[0], t[0]};
  return nb_custom_call(ck_op("ck_cube_vjp"), a, 2, tout, 1);
}

/* The op of that name, registered on first use. */
static const nb_custom_op *ck_op(const char *name) {
  const nb_custom_op *op = nb_custom_op_find(name);
  if (op) return op;
  if (!strcmp(name, "ck_cube"))
    op = nb_custom_op_register(&(nb_custom_op_def){.name = name,
                                                   .n_in = 1,
                                                   .n_out = 1,
                                                   .infer = ew_infer,
                                                   .cpu = cube_cpu,
                                                   .vjp = cube_vjp,
                                                   .jvp = cube_jvp,
                                                   .batch = ew_batch,
                                                   .sharding = "... -> ...",
                                                   .user = (void *)"ck_cube"});
  else
    op = nb_custom_op_register(&(nb_custom_op_def){.name = name,
                                                   .n_in = 2,
                                                   .n_out = 1,
                                                   .infer = ew_infer,
                                                   .cpu = cube_vjp_cpu,
                                                   .batch = ew_batch,
                                                   .user = (void *)"ck_cube_vjp"});
  cr_assert(op, "%s", nb_last_error());
  return op;
}

/* f(x) = cube(x) */
static nb_status f_cube(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u;
  return nb_custom_call(ck_op("ck_cube"), in, n_in, out, n_out);
}

static void check_cubes(nb_tensor *t, const double *x, int64_t n, int power, double scale) {
  double *r = malloc(sizeof *r * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    r[i] = scale * pow(x[i], power);
  tc_assert_close_tol(t, r, nb_shape_of(t), 1e-14);
  free(r);
}

Test(checkpoint, checkpoint_inside_vmap) {
  if (tc_on_gpu()) cr_skip_test("its custom op has no CUDA kernel");
  uint64_t seed = 10;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(3, 4), -1, 1, &seed); /* a batch of 4 along axis 1 */
  double *xv = tc_read(x);
  nb_fn *f = nb_fn_create(f_cube, NULL, 1, 1), *cf = nb_checkpoint(f);
  nb_fn *v = nb_vmap(cf, (int[]){1}, (int[]){1});
  nb_tensor *y[1];
  cr_assert_eq(nb_call(v, &x, y), NB_OK, "%s", nb_last_error());
  check_cubes(y[0], xv, 12, 3, 1);
  /* its gradient (sum over everything): 3 x^2 */
  wrap w = {v, 1};
  nb_fn *s = nb_fn_create(f_sum_of, &w, 1, 1), *g = nb_grad(s, NB_ALL);
  cr_assert_eq(nb_call(g, &x, y), NB_OK, "%s", nb_last_error());
  check_cubes(y[0], xv, 12, 2, 3);
  /* vmap of the gradient of a checkpoint: per example grad(sum(cube)) */
  wrap wc = {cf, 1};
  nb_fn *sc = nb_fn_create(f_sum_of, &wc, 1, 1), *gc = nb_grad(sc, NB_ALL);
  nb_fn *vg = nb_vmap(gc, NULL, NULL);
  cr_assert_eq(nb_call(vg, &x, y), NB_OK, "%s", nb_last_error());
  check_cubes(y[0], xv, 12, 2, 3);
  free(xv);
  nb_fn *fs[] = {f, cf, v, s, g, sc, gc, vg};
  for (int i = 0; i < 8; i++)
    nb_fn_release(fs[i]);
}

Test(checkpoint, vmap_inside_checkpoint) {
  if (tc_on_gpu()) cr_skip_test("its custom op has no CUDA kernel");
  uint64_t seed = 11;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(5, 2), -1, 1, &seed);
  double *xv = tc_read(x);
  nb_fn *f = nb_fn_create(f_cube, NULL, 1, 1), *v = nb_vmap(f, NULL, NULL), *cv = nb_checkpoint(v);
  nb_tensor *y[1];
  cr_assert_eq(nb_call(cv, &x, y), NB_OK, "%s", nb_last_error());
  check_cubes(y[0], xv, 10, 3, 1);
  /* under grad the checkpoint records its node: the vmapped program inside */
  wrap w = {cv, 1};
  nb_fn *s = nb_fn_create(f_sum_of, &w, 1, 1), *g = nb_grad(s, NB_ALL);
  cr_assert_eq(nb_call(g, &x, y), NB_OK, "%s", nb_last_error());
  check_cubes(y[0], xv, 10, 2, 3);
  /* jvp: 3 x^2 t */
  nb_fn *j = nb_jvp_fn(cv);
  nb_tensor *t = tc_rand_f64(NB_SHAPE(5, 2), -1, 1, &seed), *jin[2] = {x, t}, *jo[2];
  cr_assert_eq(nb_call(j, jin, jo), NB_OK, "%s", nb_last_error());
  double *tv = tc_read(t), r[10];
  for (int i = 0; i < 10; i++)
    r[i] = 3 * xv[i] * xv[i] * tv[i];
  tc_assert_close_tol(jo[1], r, NB_SHAPE(5, 2), 1e-14);
  free(tv);
  free(xv);
  nb_fn *fs[] = {f, v, cv, s, g, j};
  for (int i = 0; i < 6; i++)
    nb_fn_release(fs[i]);
}

/* ---- errors ----------------------------------------------------------------------------- */
static nb_status f_bad(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_matmul(in[0], in[0]); /* [3] @ [3] is fine, [2,3] @ [2,3] is not */
  return out[0] ? NB_OK : nb_last_status();
}

Test(checkpoint, errors) {
  cr_assert_null(nb_checkpoint(NULL));
  tc_assert_error(NB_ERR_NULL, "nb_checkpoint: f is NULL");
  nb_fn *f = nb_fn_create(f_bad, NULL, 1, 1), *cf = nb_checkpoint(f);
  wrap w = {cf, 1};
  nb_fn *s = nb_fn_create(f_sum_of, &w, 1, 1), *g = nb_grad(s, NB_ALL);
  nb_tensor *x = nb_ones(NB_SHAPE(2, 3), NB_F32), *y[1] = {x};
  /* the body's error while tracing comes back, with its message */
  cr_assert_neq(nb_call(g, &x, y), NB_OK);
  cr_assert_null(y[0]);
  tc_assert_error(NB_ERR_SHAPE, "nb_matmul");
  cr_assert_neq(nb_call(cf, &x, y), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "nb_matmul");
  /* fine on a vector */
  nb_tensor *v = nb_ones(NB_SHAPE(3), NB_F32);
  cr_assert_eq(nb_call(g, &v, y), NB_OK, "%s", nb_last_error());
  double two[3] = {2, 2, 2};
  tc_assert_close(y[0], two, NB_SHAPE(3));
  nb_fn_release(g);
  nb_fn_release(s);
  nb_fn_release(cf);
  nb_fn_release(f);
}
