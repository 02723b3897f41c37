/* test/test_custom.c — custom ops (include/nabla/custom.h): forward values
 * against reference loops (strided and broadcast inputs, several outputs, no
 * inputs), derivatives against finite differences to second order, Hessians
 * against closed forms, imperative backward, vmap with a user batching rule
 * and with the default loop, and the errors: registration, calls, kernels,
 * missing and malformed rules. */
#include "grad_check.h"

TestSuite(custom, .init = tc_setup, .fini = tc_teardown);

/* ---- the ops ------------------------------------------------------------------------------
 * tc_softsign(x) = x / (1 + |x|): VJP, JVP, batching rule (itself).
 * tc_sincos(x) = (sin x, cos x): VJP and JVP from the outputs, default batching.
 * tc_matvec(A, x) = A x for A [m,k], x [k]: VJP, JVP, default batching.
 * tc_log(x) = log x, failing on x <= 0 in its kernel; no rules at all.
 * tc_iota() = [0, 1, .., n-1] with n = *(int64_t *)user: no inputs.
 * Kernels are dtype-generic through nbi_load_f64 / nbi_store_f64. */
static nb_status same_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in, nb_shape *os,
                            nb_dtype *od, int n_out) {
  (void)u, (void)n_in;
  if (!nb_dtype_is_float(id[0]))
    return nb_set_error(NB_ERR_DTYPE, "tc op: input is %s, needs a float", nb_dtype_name(id[0]));
  for (int j = 0; j < n_out; j++)
    os[j] = is[0], od[j] = id[0];
  return NB_OK;
}

static nb_status softsign_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                              int n_out) {
  (void)u, (void)n_in, (void)n_out;
  for (int64_t i = 0; i < nbi_numel(&in[0].shape); i++) {
    double x = nbi_load_f64(in[0].data, in[0].dtype, i);
    nbi_store_f64(out[0].data, out[0].dtype, i, x / (1 + fabs(x)));
  }
  return NB_OK;
}

/* d softsign / dx = 1 / (1 + |x|)^2 */
static nb_tensor *softsign_deriv(nb_tensor *x) {
  return nb_reciprocal(nb_square(nb_add_scalar(nb_abs(x), 1)));
}

static nb_status softsign_vjp(void *u, nb_tensor *const *in, int n_in, nb_tensor *const *out,
                              nb_tensor *const *ct, int n_out, nb_tensor **gin) {
  (void)u, (void)n_in, (void)out, (void)n_out;
  gin[0] = nb_mul(ct[0], softsign_deriv(in[0]));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_status softsign_jvp(void *u, nb_tensor *const *in, nb_tensor *const *t, int n_in,
                              nb_tensor *const *out, int n_out, nb_tensor **tout) {
  (void)u, (void)n_in, (void)out, (void)n_out;
  tout[0] = nb_mul(t[0], softsign_deriv(in[0]));
  return tout[0] ? NB_OK : nb_last_status();
}

static int softsign_batch_calls;

/* elementwise: the op on the whole batch is the batched op */
static nb_status softsign_batch(void *u, nb_tensor *const *in, const bool *batched, int n_in,
                                int64_t B, nb_tensor **out, int n_out) {
  (void)u, (void)batched, (void)B;
  softsign_batch_calls++;
  return nb_custom_call(nb_custom_op_find("tc_softsign"), in, n_in, out, n_out);
}

static nb_status sincos_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                            int n_out) {
  (void)u, (void)n_in, (void)n_out;
  for (int64_t i = 0; i < nbi_numel(&in[0].shape); i++) {
    double x = nbi_load_f64(in[0].data, in[0].dtype, i);
    nbi_store_f64(out[0].data, out[0].dtype, i, sin(x));
    nbi_store_f64(out[1].data, out[1].dtype, i, cos(x));
  }
  return NB_OK;
}

/* d sin = cos, d cos = -sin: from the outputs */
static nb_status sincos_vjp(void *u, nb_tensor *const *in, int n_in, nb_tensor *const *out,
                            nb_tensor *const *ct, int n_out, nb_tensor **gin) {
  (void)u, (void)in, (void)n_in, (void)n_out;
  gin[0] = nb_sub(nb_mul(ct[0], out[1]), nb_mul(ct[1], out[0]));
  return gin[0] ? NB_OK : nb_last_status();
}

static nb_status sincos_jvp(void *u, nb_tensor *const *in, nb_tensor *const *t, int n_in,
                            nb_tensor *const *out, int n_out, nb_tensor **tout) {
  (void)u, (void)in, (void)n_in, (void)n_out;
  tout[0] = nb_mul(t[0], out[1]);
  tout[1] = nb_neg(nb_mul(t[0], out[0]));
  return tout[0] && tout[1] ? NB_OK : nb_last_status();
}

static nb_status matvec_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in,
                              nb_shape *os, nb_dtype *od, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  if (is[0].ndim != 2 || is[1].ndim != 1 || is[0].dims[1] != is[1].dims[0]) {
    char a[64], b[64];
    return nb_set_error(NB_ERR_SHAPE, "tc_matvec: cannot multiply %s by %s",
                        nb_shape_str(is[0], a, sizeof a), nb_shape_str(is[1], b, sizeof b));
  }
  if (id[0] != id[1] || !nb_dtype_is_float(id[0]))
    return nb_set_error(NB_ERR_DTYPE, "tc_matvec: dtypes %s and %s", nb_dtype_name(id[0]),
                        nb_dtype_name(id[1]));
  os[0] = NB_SHAPE(is[0].dims[0]);
  od[0] = id[0];
  return NB_OK;
}

static nb_status matvec_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                            int n_out) {
  (void)u, (void)n_in, (void)n_out;
  int64_t m = in[0].shape.dims[0], k = in[0].shape.dims[1];
  for (int64_t i = 0; i < m; i++) {
    double acc = 0;
    for (int64_t j = 0; j < k; j++)
      acc += nbi_load_f64(in[0].data, in[0].dtype, i * k + j) *
             nbi_load_f64(in[1].data, in[1].dtype, j);
    nbi_store_f64(out[0].data, out[0].dtype, i, acc);
  }
  return NB_OK;
}

/* dA = g x^T, dx = A^T g */
static nb_status matvec_vjp(void *u, nb_tensor *const *in, int n_in, nb_tensor *const *out,
                            nb_tensor *const *ct, int n_out, nb_tensor **gin) {
  (void)u, (void)n_in, (void)out, (void)n_out;
  gin[0] = nb_outer(ct[0], in[1]);
  gin[1] = nb_matmul(nb_transpose(in[0]), ct[0]);
  return gin[0] && gin[1] ? NB_OK : nb_last_status();
}

static nb_status matvec_jvp(void *u, nb_tensor *const *in, nb_tensor *const *t, int n_in,
                            nb_tensor *const *out, int n_out, nb_tensor **tout) {
  (void)u, (void)n_in, (void)out, (void)n_out;
  tout[0] = nb_add(nb_matmul(t[0], in[1]), nb_matmul(in[0], t[1]));
  return tout[0] ? NB_OK : nb_last_status();
}

static nb_status log_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                         int n_out) {
  (void)u, (void)n_in, (void)n_out;
  for (int64_t i = 0; i < nbi_numel(&in[0].shape); i++) {
    double x = nbi_load_f64(in[0].data, in[0].dtype, i);
    if (x <= 0)
      return nb_set_error(NB_ERR_ARG, "tc_log: element %lld is %g (needs > 0)", (long long)i, x);
    nbi_store_f64(out[0].data, out[0].dtype, i, log(x));
  }
  return NB_OK;
}

static nb_status iota_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in, nb_shape *os,
                            nb_dtype *od, int n_out) {
  (void)is, (void)id, (void)n_in, (void)n_out;
  os[0] = NB_SHAPE(*(const int64_t *)u);
  od[0] = NB_I64;
  return NB_OK;
}

static nb_status iota_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                          int n_out) {
  (void)u, (void)in, (void)n_in, (void)n_out;
  for (int64_t i = 0; i < out[0].shape.dims[0]; i++)
    ((int64_t *)out[0].data)[i] = i;
  return NB_OK;
}

static int64_t iota_n = 5;

/* The op of that name, registered on first use (each test runs in its own process). */
static const nb_custom_op *op(const char *name) {
  const nb_custom_op *o = nb_custom_op_find(name);
  if (o) return o;
  nb_custom_op_def d = {.name = name, .n_in = 1, .n_out = 1, .infer = same_infer};
  if (!strcmp(name, "tc_softsign")) {
    d.cpu = softsign_cpu, d.vjp = softsign_vjp, d.jvp = softsign_jvp, d.batch = softsign_batch;
    d.sharding = "... -> ...";
  } else if (!strcmp(name, "tc_sincos")) {
    d.n_out = 2, d.cpu = sincos_cpu, d.vjp = sincos_vjp, d.jvp = sincos_jvp;
    d.sharding = "... -> ..., ...";
  } else if (!strcmp(name, "tc_matvec")) {
    d.n_in = 2, d.infer = matvec_infer, d.cpu = matvec_cpu, d.vjp = matvec_vjp;
    d.jvp = matvec_jvp, d.sharding = "m k, k -> m";
  } else if (!strcmp(name, "tc_log")) {
    d.cpu = log_cpu;
  } else {
    d.n_in = 0, d.infer = iota_infer, d.cpu = iota_cpu, d.user = &iota_n;
  }
  o = nb_custom_op_register(&d);
  cr_assert(o, "registering %s: %s", name, nb_last_error());
  return o;
}

/* Applies op `name` to in[0..n_in-1]: the body of an nb_fn (user = the name);
 * a one-output function returns output `pick` (user "tc_sincos:1" picks 1). */
static nb_status f_op(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  char name[32];
  snprintf(name, sizeof name, "%s", (const char *)u);
  char *colon = strchr(name, ':');
  int pick = colon ? atoi(colon + 1) : -1;
  if (colon) *colon = '\0';
  const nb_custom_op *o = op(name);
  nb_tensor *all[4];
  nb_status st = nb_custom_call(o, in, n_in, pick >= 0 ? all : out, pick >= 0 ? 2 : n_out);
  if (!st && pick >= 0) out[0] = all[pick];
  return st;
}

/* sum(s * c) with (s, c) = sincos(x): sum(sin(2x)) / 2 */
static nb_status f_sincos_prod(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *sc[2];
  nb_status st = nb_custom_call(op("tc_sincos"), in, 1, sc, 2);
  if (st) return st;
  out[0] = nb_sum(nb_mul(sc[0], sc[1]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* sum(softsign(x)) */
static nb_status f_softsign_sum(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *y;
  nb_status st = nb_custom_call(op("tc_softsign"), in, 1, &y, 1);
  if (st) return st;
  out[0] = nb_sum(y, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* ---- forward ------------------------------------------------------------------------------- */
Test(custom, forward_matches_reference_loops) {
  uint64_t seed = 1;
  for (int d = 0; d < 2; d++) {
    nb_dtype dt = d ? NB_F32 : NB_F64;
    double *xv = tc_rand_floats(12, dt, &seed), r[12], r2[12];
    nb_tensor *x = tc_tensor(xv, NB_SHAPE(3, 4), dt), *y[2];
    cr_assert_eq(nb_custom_call(op("tc_softsign"), &x, 1, y, 1), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_dtype_of(y[0]), dt);
    for (int i = 0; i < 12; i++)
      r[i] = xv[i] / (1 + fabs(xv[i]));
    tc_assert_close(y[0], r, NB_SHAPE(3, 4));
    cr_assert_eq(nb_custom_call(op("tc_sincos"), &x, 1, y, 2), NB_OK, "%s", nb_last_error());
    for (int i = 0; i < 12; i++)
      r[i] = sin(xv[i]), r2[i] = cos(xv[i]);
    tc_assert_close(y[0], r, NB_SHAPE(3, 4));
    tc_assert_close(y[1], r2, NB_SHAPE(3, 4));
    free(xv);
  }
  /* a strided A (a transposed view) and a broadcast x reach the kernel contiguous */
  double av[12], xs = 0.5, r[4];
  tc_fill(av, 12, -1, 1, &seed);
  nb_tensor *a = tc_strided_tensor(av, NB_SHAPE(4, 3), NB_F64);
  nb_tensor *x = nb_broadcast_to(nb_scalar(xs, NB_F64), NB_SHAPE(3)), *in[2] = {a, x}, *y[1];
  cr_assert_eq(nb_custom_call(op("tc_matvec"), in, 2, y, 1), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 4; i++)
    r[i] = (av[3 * i] + av[3 * i + 1] + av[3 * i + 2]) * xs;
  tc_assert_close(y[0], r, NB_SHAPE(4));
  /* the op applies lazily, inside larger expressions */
  nb_tensor *z = nb_add_scalar(nb_mul_scalar(y[0], 2), 1);
  for (int i = 0; i < 4; i++)
    r[i] = 2 * r[i] + 1;
  tc_assert_close(z, r, NB_SHAPE(4));
  /* no inputs */
  cr_assert_eq(nb_custom_call(op("tc_iota"), NULL, 0, y, 1), NB_OK, "%s", nb_last_error());
  double io[5] = {0, 1, 2, 3, 4};
  tc_assert_close(y[0], io, NB_SHAPE(5));
  cr_assert_eq(nb_dtype_of(y[0]), NB_I64);
  /* empty input */
  nb_tensor *e = nb_zeros(NB_SHAPE(0, 2), NB_F32);
  cr_assert_eq(nb_custom_call(op("tc_softsign"), &e, 1, y, 1), NB_OK, "%s", nb_last_error());
  tc_assert_close(y[0], NULL, NB_SHAPE(0, 2));
}

Test(custom, registry_finds_ops_and_keeps_copies) {
  char name[16] = "tc_copyname";
  const nb_custom_op *o = nb_custom_op_register(&(nb_custom_op_def){.name = name,
                                                                    .n_in = 1,
                                                                    .n_out = 1,
                                                                    .infer = same_infer,
                                                                    .cpu = softsign_cpu,
                                                                    .sharding = "i j -> j i"});
  cr_assert(o, "%s", nb_last_error());
  strcpy(name, "changed"); /* the registry copied the name */
  cr_assert_eq(nb_custom_op_find("tc_copyname"), o);
  cr_assert_null(nb_custom_op_find("changed"));
  cr_assert_null(nb_custom_op_find(NULL));
  cr_assert_str_eq(nb_custom_op_name(o), "tc_copyname");
  cr_assert_str_eq(nb_custom_op_sharding(o), "i j -> j i");
  cr_assert_null(nb_custom_op_sharding(op("tc_log")));
  cr_assert_null(nb_custom_op_name(NULL));
  cr_assert_eq(nb_last_status(), NB_OK);
}

/* ---- derivatives ---------------------------------------------------------------------------- */
Test(custom, derivatives_match_finite_differences) {
  uint64_t seed = 2;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 3), -2, 2, &seed);
  tc_check_grad("softsign", f_op, "tc_softsign", 1, &x, TC_SECOND);
  tc_check_grad("sincos[0]", f_op, "tc_sincos:0", 1, &x, TC_SECOND);
  tc_check_grad("sincos[1]", f_op, "tc_sincos:1", 1, &x, TC_SECOND);
  tc_check_grad("sum(sin * cos)", f_sincos_prod, NULL, 1, &x, TC_SECOND);
  nb_tensor *ax[2] = {tc_rand_f64(NB_SHAPE(3, 4), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(4), -1, 1, &seed)};
  tc_check_grad("matvec", f_op, "tc_matvec", 2, ax, TC_SECOND);
}

Test(custom, hessians_match_closed_forms) {
  uint64_t seed = 3;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(4), -2, 2, &seed), *h[1];
  double *xv = tc_read(x), r[16];
  /* sum(softsign): diagonal -2 sign(x) / (1 + |x|)^3 */
  nb_fn *f = nb_fn_create(f_softsign_sum, NULL, 1, 1), *hf = nb_hessian(f, NB_ALL);
  cr_assert_eq(nb_call(hf, &x, h), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 16; i++)
    r[i] = i % 5 ? 0 : -2 * (xv[i / 5] > 0 ? 1 : -1) / pow(1 + fabs(xv[i / 5]), 3);
  tc_assert_close_tol(h[0], r, NB_SHAPE(4, 4), 1e-13);
  /* sum(sin x cos x) = sum(sin 2x) / 2: diagonal -2 sin(2x), through the
   * outputs the VJP uses (the forward sweep runs the op's JVP) */
  nb_fn *g = nb_fn_create(f_sincos_prod, NULL, 1, 1), *hg = nb_hessian(g, NB_ALL);
  cr_assert_eq(nb_call(hg, &x, h), NB_OK, "%s", nb_last_error());
  for (int i = 0; i < 16; i++)
    r[i] = i % 5 ? 0 : -2 * sin(2 * xv[i / 5]);
  tc_assert_close_tol(h[0], r, NB_SHAPE(4, 4), 1e-13);
  free(xv);
  nb_fn_release(hg);
  nb_fn_release(g);
  nb_fn_release(hf);
  nb_fn_release(f);
}

Test(custom, imperative_backward) {
  double xs[3] = {-1.5, 0.25, 2};
  nb_tensor *x = nb_set_requires_grad(tc_tensor(xs, NB_SHAPE(3), NB_F64), true), *y;
  cr_assert_eq(nb_custom_call(op("tc_softsign"), &x, 1, &y, 1), NB_OK);
  cr_assert_eq(nb_backward(nb_sum(nb_square(y), NB_ALL, false)), NB_OK, "%s", nb_last_error());
  double r[3];
  for (int i = 0; i < 3; i++) /* d/dx softsign^2 = 2 s / (1 + |x|)^2 */
    r[i] = 2 * (xs[i] / (1 + fabs(xs[i]))) / pow(1 + fabs(xs[i]), 2);
  tc_assert_close_tol(nb_grad_of(x), r, NB_SHAPE(3), 1e-14);
}

/* ---- vmap ----------------------------------------------------------------------------------- */
Test(custom, vmap_with_a_batching_rule) {
  uint64_t seed = 4;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(3, 5), -2, 2, &seed), *y[1];
  double *xv = tc_read(x), r[15];
  nb_fn *f = nb_fn_create(f_op, "tc_softsign", 1, 1), *v = nb_vmap(f, (int[]){1}, (int[]){1});
  softsign_batch_calls = 0;
  cr_assert_eq(nb_call(v, &x, y), NB_OK, "%s", nb_last_error());
  cr_assert_eq(softsign_batch_calls, 1); /* one call on the whole batch */
  for (int i = 0; i < 15; i++)
    r[i] = xv[i] / (1 + fabs(xv[i]));
  tc_assert_close_tol(y[0], r, NB_SHAPE(3, 5), 1e-15);
  free(xv);
  nb_fn_release(v);
  nb_fn_release(f);
}

Test(custom, vmap_with_the_default_loop) {
  uint64_t seed = 5;
  /* sincos over axis 1: two batched outputs */
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 3), -2, 2, &seed), *y[2];
  double *xv = tc_read(x), r[12], r2[12];
  nb_fn *f = nb_fn_create(f_op, "tc_sincos", 1, 2);
  nb_fn *v = nb_vmap(f, (int[]){1}, (int[]){0, 1});
  cr_assert_eq(nb_call(v, &x, y), NB_OK, "%s", nb_last_error());
  for (int b = 0; b < 3; b++) /* y[0] is (3, 2): batch first; y[1] is (2, 3) */
    for (int i = 0; i < 2; i++)
      r[b * 2 + i] = sin(xv[i * 3 + b]), r2[i * 3 + b] = cos(xv[i * 3 + b]);
  tc_assert_close_tol(y[0], r, NB_SHAPE(3, 2), 1e-15);
  tc_assert_close_tol(y[1], r2, NB_SHAPE(2, 3), 1e-15);
  /* matvec with A shared and a batch of 4 vectors x (rows of X) */
  nb_tensor *a = tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
            *X = tc_rand_f64(NB_SHAPE(4, 3), -1, 1, &seed);
  double *av = tc_read(a), *Xv = tc_read(X);
  nb_fn *mv = nb_fn_create(f_op, "tc_matvec", 2, 1);
  nb_fn *vm = nb_vmap(mv, (int[]){NB_NOT_MAPPED, 0}, NULL);
  nb_tensor *in[2] = {a, X};
  cr_assert_eq(nb_call(vm, in, y), NB_OK, "%s", nb_last_error());
  for (int b = 0; b < 4; b++)
    for (int i = 0; i < 2; i++) {
      r[b * 2 + i] = 0;
      for (int k = 0; k < 3; k++)
        r[b * 2 + i] += av[i * 3 + k] * Xv[b * 3 + k];
    }
  tc_assert_close_tol(y[0], r, NB_SHAPE(4, 2), 1e-14);
  /* and its gradient through the per-example calls (sum of all outputs):
   * d/dA = sum_b 1 x_b^T, d/dX[b] = A^T 1 */
  nb_fn *fs = nb_fn_create(f_op, "tc_matvec", 2, 1);
  nb_fn *vs = nb_vmap(fs, (int[]){NB_NOT_MAPPED, 0}, NULL);
  nb_fn *vjp = nb_vjp_fn(vs);
  nb_tensor *vin[3] = {a, X, nb_ones(NB_SHAPE(4, 2), NB_F64)}, *vo[3];
  cr_assert_eq(nb_call(vjp, vin, vo), NB_OK, "%s", nb_last_error());
  double ga[6] = {0}, gx[12];
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 3; k++)
      for (int b = 0; b < 4; b++)
        ga[i * 3 + k] += Xv[b * 3 + k];
  for (int b = 0; b < 4; b++)
    for (int k = 0; k < 3; k++)
      gx[b * 3 + k] = av[k] + av[3 + k];
  tc_assert_close_tol(vo[1], ga, NB_SHAPE(2, 3), 1e-14);
  tc_assert_close_tol(vo[2], gx, NB_SHAPE(4, 3), 1e-14);
  /* an empty batch */
  nb_tensor *e = nb_zeros(NB_SHAPE(0, 3), NB_F64), *ein[2] = {a, e};
  cr_assert_eq(nb_call(vm, ein, y), NB_OK, "%s", nb_last_error());
  tc_assert_close(y[0], NULL, NB_SHAPE(0, 2));
  free(xv), free(av), free(Xv);
  nb_fn *all[] = {f, v, mv, vm, fs, vs, vjp};
  for (int i = 0; i < 7; i++)
    nb_fn_release(all[i]);
}

/* ---- errors --------------------------------------------------------------------------------- */
Test(custom, registration_errors) {
  nb_custom_op_def ok = {
      .name = "tc_reg", .n_in = 1, .n_out = 1, .infer = same_infer, .cpu = softsign_cpu};
  cr_assert_null(nb_custom_op_register(NULL));
  tc_assert_error(NB_ERR_NULL, "nb_custom_op_register: def is NULL");
  nb_custom_op_def d = ok;
  d.name = NULL;
  cr_assert_null(nb_custom_op_register(&d));
  tc_assert_error(NB_ERR_ARG, "needs a name");
  d = ok, d.name = "";
  cr_assert_null(nb_custom_op_register(&d));
  tc_assert_error(NB_ERR_ARG, "needs a name");
  d = ok, d.n_out = 0;
  cr_assert_null(nb_custom_op_register(&d));
  tc_assert_error(NB_ERR_ARG, "n_out = 0");
  d = ok, d.n_in = -1;
  cr_assert_null(nb_custom_op_register(&d));
  tc_assert_error(NB_ERR_ARG, "n_in = -1");
  d = ok, d.infer = NULL;
  cr_assert_null(nb_custom_op_register(&d));
  tc_assert_error(NB_ERR_ARG, "inference");
  d = ok, d.cpu = NULL;
  cr_assert_null(nb_custom_op_register(&d));
  tc_assert_error(NB_ERR_ARG, "CPU kernel");
  /* malformed sharding rules */
  const char *bad[][2] = {
      {"m k, k n -> m n", "has 2 operands but the op has 1 inputs"},
      {"m -> m, m", "has 2 results but the op has 1 outputs"},
      {"m k", "exactly one \"->\""},
      {"m -> m -> m", "exactly one \"->\""},
      {"m k -> n", "factor \"n\" of result 0 appears in no operand"},
      {"m m -> m", "factor \"m\" appears twice in operand 0"},
      {"m 2 -> m", "unexpected '2'"},
      {"m ... -> m", "\"...\" may only start operand 0"},
      {"m -> ... m", "result 0 has \"...\" but no operand has"},
  };
  for (int i = 0; i < 9; i++) {
    d = ok, d.sharding = bad[i][0];
    cr_assert_null(nb_custom_op_register(&d), "rule %s", bad[i][0]);
    tc_assert_error(NB_ERR_ARG, bad[i][1]);
  }
  /* the good one, then a duplicate */
  d = ok, d.sharding = " ... m_1 ->  ... m_1 ";
  cr_assert(nb_custom_op_register(&d), "%s", nb_last_error());
  cr_assert_null(nb_custom_op_register(&ok));
  tc_assert_error(NB_ERR_ARG, "an op named \"tc_reg\" is already registered");
  /* an op without inputs takes an empty operand list */
  nb_custom_op_def z = {.name = "tc_reg0",
                        .n_in = 0,
                        .n_out = 1,
                        .infer = iota_infer,
                        .cpu = iota_cpu,
                        .user = &iota_n,
                        .sharding = " -> i"};
  cr_assert_null(nb_custom_op_register(&z));
  tc_assert_error(NB_ERR_ARG, "factor \"i\" of result 0 appears in no operand");
  z.sharding = "-> ";
  cr_assert(nb_custom_op_register(&z), "%s", nb_last_error());
}

Test(custom, call_errors) {
  nb_tensor *x = nb_ones(NB_SHAPE(3), NB_F32), *in2[2] = {x, x}, *y[2] = {x, x};
  cr_assert_neq(nb_custom_call(NULL, &x, 1, y, 1), NB_OK);
  cr_assert_null(y[0]);
  tc_assert_error(NB_ERR_NULL, "nb_custom_call: op is NULL");
  cr_assert_neq(nb_custom_call(op("tc_softsign"), in2, 2, y, 1), NB_OK);
  tc_assert_error(NB_ERR_ARG, "op \"tc_softsign\" takes 1 inputs and gives 1 outputs");
  cr_assert_neq(nb_custom_call(op("tc_sincos"), &x, 1, y, 1), NB_OK);
  tc_assert_error(NB_ERR_ARG, "n_out = 1");
  nb_tensor *nul = NULL;
  cr_assert_neq(nb_custom_call(op("tc_softsign"), &nul, 1, y, 1), NB_OK);
  tc_assert_error(NB_ERR_NULL, "input 0 is NULL");
  cr_assert_neq(nb_custom_call(op("tc_softsign"), NULL, 1, y, 1), NB_OK);
  tc_assert_error(NB_ERR_NULL, "in is NULL");
  cr_assert_neq(nb_custom_call(op("tc_softsign"), &x, 1, NULL, 1), NB_OK);
  tc_assert_error(NB_ERR_NULL, "out is NULL");
  /* inference errors are eager and keep the callback's message */
  nb_tensor *a = nb_ones(NB_SHAPE(2, 4), NB_F32), *mv[2] = {a, x};
  cr_assert_neq(nb_custom_call(op("tc_matvec"), mv, 2, y, 1), NB_OK);
  cr_assert_null(y[0]);
  tc_assert_error(NB_ERR_SHAPE, "tc_matvec: cannot multiply [2,4] by [3]");
  nb_tensor *i = nb_zeros(NB_SHAPE(2), NB_I32);
  cr_assert_neq(nb_custom_call(op("tc_softsign"), &i, 1, y, 1), NB_OK);
  tc_assert_error(NB_ERR_DTYPE, "tc op: input is i32");
}

static nb_status silent_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in,
                              nb_shape *os, nb_dtype *od, int n_out) {
  (void)u, (void)is, (void)id, (void)n_in, (void)os, (void)od, (void)n_out;
  return NB_ERR_SHAPE; /* no message */
}

static nb_status silent_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                            int n_out) {
  (void)u, (void)in, (void)n_in, (void)out, (void)n_out;
  return NB_ERR_INTERNAL; /* no message */
}

static nb_status no_dtype_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in,
                                nb_shape *os, nb_dtype *od, int n_out) {
  (void)u, (void)id, (void)n_in, (void)od, (void)n_out;
  os[0] = is[0]; /* forgets the dtype */
  return NB_OK;
}

Test(custom, callback_errors_name_the_op) {
  nb_tensor *x = nb_ones(NB_SHAPE(3), NB_F32), *y[1];
  const nb_custom_op *s = nb_custom_op_register(&(nb_custom_op_def){
      .name = "tc_silent", .n_in = 1, .n_out = 1, .infer = silent_infer, .cpu = silent_cpu});
  cr_assert_neq(nb_custom_call(s, &x, 1, y, 1), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "the shape inference of op \"tc_silent\" returned shape mismatch");
  const nb_custom_op *k = nb_custom_op_register(&(nb_custom_op_def){
      .name = "tc_silent_kernel", .n_in = 1, .n_out = 1, .infer = same_infer, .cpu = silent_cpu});
  cr_assert_eq(nb_custom_call(k, &x, 1, y, 1), NB_OK);
  cr_assert_eq(nb_eval(y, 1), NB_ERR_INTERNAL);
  tc_assert_error(NB_ERR_INTERNAL, "the CPU kernel of op \"tc_silent_kernel\" returned");
  const nb_custom_op *n = nb_custom_op_register(&(nb_custom_op_def){
      .name = "tc_no_dtype", .n_in = 1, .n_out = 1, .infer = no_dtype_infer, .cpu = silent_cpu});
  cr_assert_neq(nb_custom_call(n, &x, 1, y, 1), NB_OK);
  tc_assert_error(NB_ERR_DTYPE, "op \"tc_no_dtype\" gave no valid dtype for output 0");
}

Test(custom, kernel_errors_propagate_with_their_message) {
  double xs[4] = {1, 2, -3, 4};
  nb_tensor *x = tc_tensor(xs, NB_SHAPE(4), NB_F64), *y;
  cr_assert_eq(nb_custom_call(op("tc_log"), &x, 1, &y, 1), NB_OK); /* lazy: no error yet */
  nb_tensor *z = nb_add_scalar(y, 1);
  double out[4];
  cr_assert_eq(nb_to_host(z, out, sizeof out), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "tc_log: element 2 is -3 (needs > 0)");
  cr_assert(!nb_is_realized(z));
  /* the input is untouched and a valid call still works afterwards */
  tc_assert_unchanged(x, xs, NB_SHAPE(4));
  double ok[2] = {1, exp(1)}, r[2] = {0, 1};
  nb_tensor *x2 = tc_tensor(ok, NB_SHAPE(2), NB_F64);
  cr_assert_eq(nb_custom_call(op("tc_log"), &x2, 1, &y, 1), NB_OK);
  tc_assert_close(y, r, NB_SHAPE(2));
}

Test(custom, missing_rules_are_errors_when_needed) {
  double xs[2] = {1, 2};
  nb_tensor *x = tc_tensor(xs, NB_SHAPE(2), NB_F64), *o[2];
  nb_fn *f = nb_fn_create(f_op, "tc_log", 1, 1), *g = nb_vjp_fn(f), *j = nb_jvp_fn(f);
  nb_tensor *in[2] = {x, x};
  cr_assert_neq(nb_call(g, in, o), NB_OK);
  tc_assert_error(NB_ERR_STATE, "custom op \"tc_log\" has no VJP rule");
  cr_assert_neq(nb_call(j, in, o), NB_OK);
  tc_assert_error(NB_ERR_STATE, "custom op \"tc_log\" has no JVP rule");
  /* not needed: the derivative does not flow through the op */
  nb_tensor *d = nb_detach(x);
  nb_tensor *loss = nb_sum(
      nb_square(nb_set_requires_grad(tc_tensor(xs, NB_SHAPE(2), NB_F64), true)), NB_ALL, false);
  nb_tensor *y;
  cr_assert_eq(nb_custom_call(op("tc_log"), &d, 1, &y, 1), NB_OK);
  cr_assert_eq(nb_backward(nb_add(loss, nb_sum(y, NB_ALL, false))), NB_OK, "%s", nb_last_error());
  /* and forward-mode evaluation of the op itself needs no rule */
  double r[2] = {0, log(2)};
  tc_assert_close(y, r, NB_SHAPE(2));
  nb_fn_release(j);
  nb_fn_release(g);
  nb_fn_release(f);
}

/* rules that give the wrong types */
static nb_status bad_vjp(void *u, nb_tensor *const *in, int n_in, nb_tensor *const *out,
                         nb_tensor *const *ct, int n_out, nb_tensor **gin) {
  (void)u, (void)in, (void)n_in, (void)out, (void)n_out;
  gin[0] = nb_sum(ct[0], NB_ALL, false); /* a scalar for a vector input */
  return NB_OK;
}

static nb_status bad_batch(void *u, nb_tensor *const *in, const bool *batched, int n_in, int64_t B,
                           nb_tensor **out, int n_out) {
  (void)u, (void)batched, (void)n_in, (void)B, (void)n_out;
  out[0] = nb_cast(in[0], NB_F32); /* the wrong dtype */
  return NB_OK;
}

static nb_status failing_vjp(void *u, nb_tensor *const *in, int n_in, nb_tensor *const *out,
                             nb_tensor *const *ct, int n_out, nb_tensor **gin) {
  (void)u, (void)in, (void)n_in, (void)out, (void)ct, (void)n_out, (void)gin;
  return nb_set_error(NB_ERR_ARG, "tc_bad: this VJP refuses");
}

Test(custom, malformed_rules_are_errors_naming_the_op) {
  double xs[2] = {1, 2};
  nb_tensor *x = tc_tensor(xs, NB_SHAPE(2), NB_F64), *o[2], *in[2] = {x, x};
  nb_custom_op_def d = {.name = "tc_bad",
                        .n_in = 1,
                        .n_out = 1,
                        .infer = same_infer,
                        .cpu = softsign_cpu,
                        .vjp = bad_vjp,
                        .batch = bad_batch};
  cr_assert(nb_custom_op_register(&d), "%s", nb_last_error());
  d.name = "tc_bad2", d.vjp = failing_vjp;
  cr_assert(nb_custom_op_register(&d), "%s", nb_last_error());
  nb_fn *f = nb_fn_create(f_op, "tc_bad", 1, 1), *g = nb_vjp_fn(f), *v = nb_vmap(f, NULL, NULL);
  cr_assert_neq(nb_call(g, in, o), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "the VJP rule of op \"tc_bad\" gave f64 [] for input cotangent 0, "
                                "which must be f64 [2]");
  nb_tensor *X = nb_ones(NB_SHAPE(3, 2), NB_F64);
  cr_assert_neq(nb_call(v, &X, o), NB_OK);
  tc_assert_error(NB_ERR_SHAPE, "the batching rule of op \"tc_bad\" gave f32 [3,2] for output 0");
  nb_fn *f2 = nb_fn_create(f_op, "tc_bad2", 1, 1), *g2 = nb_vjp_fn(f2);
  cr_assert_neq(nb_call(g2, in, o), NB_OK);
  tc_assert_error(NB_ERR_ARG, "tc_bad: this VJP refuses");
  nb_fn *fs[] = {f, g, v, f2, g2};
  for (int i = 0; i < 5; i++)
    nb_fn_release(fs[i]);
}

Test(custom, set_error_keeps_the_first_error) {
  cr_assert_eq(nb_set_error(NB_OK, "nothing %d", 1), NB_OK);
  cr_assert_eq(nb_last_status(), NB_OK);
  cr_assert_eq(nb_set_error(NB_ERR_INDEX, "first %d", 7), NB_ERR_INDEX);
  cr_assert_eq(nb_set_error(NB_ERR_ARG, "second"), NB_ERR_ARG);
  tc_assert_error(NB_ERR_INDEX, "first 7");
}
