/* test/test_nn_extras.c — nb_gelu_tanh and causal attention against PyTorch
 * (float64 values and gradients in test/golden/nn.txt, written by
 * test/golden/gen_nn.py), and nb_scan_length (a scan without xs) against
 * the loop it stands for, through grad and vmap. */
#include "golden_file.h"

TestSuite(nn_extras, .init = tc_setup, .fini = tc_teardown);

#define NX_TOL 1e-12

/* ---- gelu_tanh ------------------------------------------------------------------------------- */
/* in: x, cot -> sum(gelu_tanh(x) * cot) */
static nb_status gelu_loss(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_mul(nb_gelu_tanh(in[0]), in[1]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

Test(nn_extras, gelu_tanh_matches_torch_values_and_gradient) {
  gf_case *c = gf_load("nn.txt", "gelu_tanh");
  nb_tensor *x = gf_tensor(c, "x", NB_DTYPE_COUNT), *cot = gf_tensor(c, "cot", NB_DTYPE_COUNT);
  gf_expect(c, "y", nb_gelu_tanh(x), NX_TOL);
  nb_fn *f = nb_fn_create(gelu_loss, NULL, 2, 1), *g = nb_grad(f, NB_AXES(0));
  nb_tensor *dx;
  cr_assert_eq(nb_call(g, (nb_tensor *[]){x, cot}, &dx), NB_OK, "%s", nb_last_error());
  gf_expect(c, "dx", dx, NX_TOL);
  /* f32 rounds once per op: 1e-6 of torch's f64 */
  gf_expect(c, "y", nb_gelu_tanh(gf_tensor(c, "x", NB_F32)), 1e-6);
  nb_fn_release(g);
  nb_fn_release(f);
  gf_free(c);
}

static nb_status gelu_rows(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  out[0] = nb_gelu_tanh(in[0]);
  return out[0] ? NB_OK : nb_last_status();
}

Test(nn_extras, gelu_tanh_under_vmap_and_jit_equals_the_plain_call) {
  gf_case *c = gf_load("nn.txt", "gelu_tanh");
  nb_tensor *x = nb_reshape(gf_tensor(c, "x", NB_DTYPE_COUNT), NB_SHAPE(8, 10));
  nb_fn *f = nb_fn_create(gelu_rows, NULL, 1, 1), *v = nb_vmap(f, NULL, NULL), *j = nb_jit(v);
  nb_tensor *y;
  cr_assert_eq(nb_call(j, &x, &y), NB_OK, "%s", nb_last_error());
  gf_expect(c, "y", nb_reshape(y, NB_SHAPE(80)), NX_TOL);
  nb_fn_release(j), nb_fn_release(v), nb_fn_release(f);
  gf_free(c);
}

Test(nn_extras, gelu_tanh_of_integers_is_f32_and_of_half_rounds_once) {
  nb_tensor *i = nb_from_data((int32_t[]){-2, 0, 3}, NB_SHAPE(3), NB_I32);
  nb_tensor *y = nb_gelu_tanh(i);
  cr_assert_eq(nb_dtype_of(y), NB_F32);
  double want[3];
  for (int k = 0; k < 3; k++) {
    double v = (double[]){-2, 0, 3}[k];
    want[k] = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  tc_assert_close_tol(y, want, NB_SHAPE(3), 1e-6);
  nb_tensor *h = nb_gelu_tanh(nb_cast(i, NB_F16));
  cr_assert_eq(nb_dtype_of(h), NB_F16);
  tc_assert_close_tol(h, want, NB_SHAPE(3), 1e-3);
  cr_assert_null(nb_gelu_tanh(nb_full(NB_SHAPE(2), 1, NB_BOOL)));
  tc_assert_error(NB_ERR_DTYPE, "nb_gelu_tanh");
}

/* ---- causal attention ------------------------------------------------------------------------ */
/* in: q, k, v, cot -> sum(attention_causal(q, k, v) * cot) */
static nb_status attn_loss(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_mul(nb_attention_causal(in[0], in[1], in[2]), in[3]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static void check_causal_case(const char *name) {
  gf_case *c = gf_load("nn.txt", name);
  nb_tensor *in[4] = {gf_tensor(c, "q", NB_DTYPE_COUNT), gf_tensor(c, "k", NB_DTYPE_COUNT),
                      gf_tensor(c, "v", NB_DTYPE_COUNT), gf_tensor(c, "cot", NB_DTYPE_COUNT)};
  gf_expect(c, "y", nb_attention_causal(in[0], in[1], in[2]), NX_TOL);
  nb_attention_params ap = {.causal = true};
  gf_expect(c, "y", nb_attention_ex(in[0], in[1], in[2], &ap), NX_TOL);
  nb_fn *f = nb_fn_create(attn_loss, NULL, 4, 1), *g = nb_grad(f, NB_AXES(0, 1, 2));
  nb_tensor *d[3];
  cr_assert_eq(nb_call(g, in, d), NB_OK, "%s", nb_last_error());
  gf_expect(c, "dq", d[0], NX_TOL);
  gf_expect(c, "dk", d[1], NX_TOL);
  gf_expect(c, "dv", d[2], NX_TOL);
  gf_expect(c, "y",
            nb_attention_causal(gf_tensor(c, "q", NB_F32), gf_tensor(c, "k", NB_F32),
                                gf_tensor(c, "v", NB_F32)),
            1e-5);
  nb_fn_release(g), nb_fn_release(f);
  gf_free(c);
}

Test(nn_extras, causal_attention_matches_torch_is_causal) { check_causal_case("attention_causal"); }
Test(nn_extras, causal_attention_with_fewer_queries_is_top_left_aligned) {
  check_causal_case("attention_causal_wide");
}
Test(nn_extras, causal_attention_with_more_queries_is_top_left_aligned) {
  check_causal_case("attention_causal_tall");
}

Test(nn_extras, causal_flag_equals_an_explicit_tril_mask_and_masked_weights_are_zero) {
  uint64_t seed = 5;
  double *qv = tc_rand_floats(2 * 4 * 3, NB_F64, &seed),
         *vv = tc_rand_floats(2 * 4 * 2, NB_F64, &seed);
  nb_tensor *q = tc_tensor(qv, NB_SHAPE(2, 4, 3), NB_F64),
            *v = tc_tensor(vv, NB_SHAPE(2, 4, 2), NB_F64);
  bool m[16];
  for (int i = 0; i < 16; i++)
    m[i] = i % 4 <= i / 4;
  nb_tensor *mask = nb_from_data(m, NB_SHAPE(4, 4), NB_BOOL);
  nb_tensor *a = nb_attention_causal(q, q, v), *b = nb_attention(q, q, v, mask);
  double *want = tc_read(b);
  tc_assert_close_tol(a, want, NB_SHAPE(2, 4, 2), 0);
  /* row 0 attends key 0 only: its output is v's row 0 exactly */
  double *got = tc_read(a);
  for (int bb = 0; bb < 2; bb++)
    for (int j = 0; j < 2; j++)
      cr_assert_eq(got[bb * 8 + j], vv[bb * 8 + j]);
  /* a user mask combines with causal: both must allow */
  bool even[4] = {true, false, true, true};
  nb_attention_params ap = {.mask = nb_from_data(even, NB_SHAPE(4), NB_BOOL), .causal = true};
  nb_tensor *both = nb_attention_ex(q, q, v, &ap);
  for (int i = 0; i < 16; i++)
    m[i] = i % 4 <= i / 4 && even[i % 4];
  double *masked = tc_read(nb_attention(q, q, v, nb_from_data(m, NB_SHAPE(4, 4), NB_BOOL)));
  tc_assert_close_tol(both, masked, NB_SHAPE(2, 4, 2), 0);
  free(masked);
  /* scale: 0 is 1 / sqrt(d), any other value replaces it */
  ap = (nb_attention_params){.causal = true, .scale = 1.0 / sqrt(3.0)};
  tc_assert_close_tol(nb_attention_ex(q, q, v, &ap), want, NB_SHAPE(2, 4, 2), 1e-15);
  ap.scale = NAN;
  cr_assert_null(nb_attention_ex(q, q, v, &ap));
  tc_assert_error(NB_ERR_ARG, "nb_attention: scale");
  free(got);
  free(want);
  free(qv);
  free(vv);
}

/* ---- nb_scan_length -------------------------------------------------------------------------- */
/* (c, s) -> (c * 0.9 + s, s + 1), y = c^2 */
static nb_status rec_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  out[0] = nb_add(nb_mul_scalar(in[0], 0.9), in[1]);
  out[1] = nb_add_scalar(in[1], 1);
  out[2] = nb_square(in[0]);
  return out[0] && out[1] && out[2] ? NB_OK : nb_last_status();
}

/* the loop by hand: c_T and the y_t */
static void rec_loop(double c, double s, int T, bool reverse, double *c_out, double *ys) {
  for (int i = 0; i < T; i++) {
    int t = reverse ? T - 1 - i : i;
    ys[t] = c * c;
    c = c * 0.9 + s, s = s + 1;
  }
  *c_out = c;
}

Test(nn_extras, scan_length_runs_the_body_length_times_and_stacks_ys) {
  nb_fn *body = nb_fn_create(rec_body, NULL, 2, 3);
  for (int rev = 0; rev < 2; rev++) {
    nb_tensor *init[2] = {nb_scalar(0.5, NB_F64), nb_scalar(0.25, NB_F64)}, *co[2], *ys;
    cr_assert_eq(nb_scan_length(body, init, 2, 6, rev, co, &ys), NB_OK, "%s", nb_last_error());
    double c, want[6];
    rec_loop(0.5, 0.25, 6, rev, &c, want);
    tc_assert_close_tol(co[0], &c, NB_SCALAR_SHAPE, NX_TOL);
    tc_assert_close_tol(co[1], (double[]){6.25}, NB_SCALAR_SHAPE, 0);
    tc_assert_close_tol(ys, want, NB_SHAPE(6), NX_TOL);
  }
  /* length 0: the carries come back, ys is empty */
  nb_tensor *init[2] = {nb_scalar(0.5, NB_F64), nb_scalar(0.25, NB_F64)}, *co[2], *ys;
  cr_assert_eq(nb_scan_length(body, init, 2, 0, false, co, &ys), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(co[0], (double[]){0.5}, NB_SCALAR_SHAPE, 0);
  cr_assert_eq(nb_shape_of(ys).ndim, 1);
  cr_assert_eq(nb_shape_of(ys).dims[0], 0);
  nb_fn_release(body);
}

/* in: c0 -> sum of the ys plus the final carry, through nb_scan_length(5) */
static nb_status scan_loss(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *init[2] = {in[0], nb_scalar(0.25, nb_dtype_of(in[0]))}, *co[2], *ys;
  nb_status st = nb_scan_length(user, init, 2, 5, false, co, &ys);
  if (st) return st;
  out[0] = nb_add(nb_sum(ys, NB_ALL, false), co[0]);
  return out[0] ? NB_OK : nb_last_status();
}

Test(nn_extras, scan_length_differentiates_and_vmaps) {
  nb_fn *body = nb_fn_create(rec_body, NULL, 2, 3);
  nb_fn *f = nb_fn_create(scan_loss, body, 1, 1), *g = nb_grad(f, NB_AXES(0));
  /* d/dc0 by central differences of the loop (the function is a polynomial of degree 2) */
  double x0 = 0.3, h = 1e-3, lo, hi, c, ys[5];
  rec_loop(x0 - h, 0.25, 5, false, &c, ys);
  lo = c + ys[0] + ys[1] + ys[2] + ys[3] + ys[4];
  rec_loop(x0 + h, 0.25, 5, false, &c, ys);
  hi = c + ys[0] + ys[1] + ys[2] + ys[3] + ys[4];
  double want = (hi - lo) / (2 * h);
  nb_tensor *x = nb_scalar(x0, NB_F64), *dx;
  cr_assert_eq(nb_call(g, &x, &dx), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(dx, &want, NB_SCALAR_SHAPE, 1e-9);
  /* vmap over three starting carries: each row is its own loop */
  nb_fn *v = nb_vmap(g, NULL, NULL);
  nb_tensor *xs = nb_from_data((double[]){-1, 0.3, 2}, NB_SHAPE(3), NB_F64), *dxs;
  cr_assert_eq(nb_call(v, &xs, &dxs), NB_OK, "%s", nb_last_error());
  double wants[3];
  for (int i = 0; i < 3; i++) {
    double a = (double[]){-1, 0.3, 2}[i];
    rec_loop(a - h, 0.25, 5, false, &c, ys);
    lo = c + ys[0] + ys[1] + ys[2] + ys[3] + ys[4];
    rec_loop(a + h, 0.25, 5, false, &c, ys);
    hi = c + ys[0] + ys[1] + ys[2] + ys[3] + ys[4];
    wants[i] = (hi - lo) / (2 * h);
  }
  tc_assert_close_tol(dxs, wants, NB_SHAPE(3), 1e-9);
  nb_fn_release(v), nb_fn_release(g), nb_fn_release(f), nb_fn_release(body);
}

/* () -> y = 7: a body without carries */
static nb_status const_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)user, (void)in, (void)n_in, (void)n_out;
  out[0] = nb_scalar(7, NB_F32);
  return out[0] ? NB_OK : nb_last_status();
}

Test(nn_extras, scan_length_without_carries_and_bad_arguments) {
  nb_fn *body = nb_fn_create(const_body, NULL, 0, 1);
  nb_tensor *ys;
  cr_assert_eq(nb_scan_length(body, NULL, 0, 3, false, NULL, &ys), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(ys, (double[]){7, 7, 7}, NB_SHAPE(3), 0);
  cr_assert_neq(nb_scan_length(body, NULL, 0, -1, false, NULL, &ys), NB_OK);
  tc_assert_error(NB_ERR_ARG, "nb_scan_length: length is -1");
  cr_assert_neq(nb_scan_length(NULL, NULL, 0, 3, false, NULL, &ys), NB_OK);
  tc_assert_error(NB_ERR_NULL, "nb_scan_length: body is NULL");
  nb_fn *two = nb_fn_create(rec_body, NULL, 2, 3);
  nb_tensor *init[2] = {nb_scalar(1, NB_F64), nb_scalar(2, NB_F64)}, *co[2], *ys2[2];
  cr_assert_neq(nb_scan_length(two, init, 1, 3, false, co, ys2), NB_OK);
  tc_assert_error(NB_ERR_ARG, "nb_scan_length: body takes 2 inputs");
  /* nb_scan without xs points to nb_scan_length */
  cr_assert_neq(nb_scan(two, init, 2, NULL, 0, false, co, ys2), NB_OK);
  tc_assert_error(NB_ERR_ARG, "nb_scan_length");
  nb_fn_release(two), nb_fn_release(body);
}
