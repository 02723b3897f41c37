/* examples/custom_op.c — a custom op that every transform can use: a fused
 * softsign(x) = x / (1 + |x|) with its own C kernel, derivative rules written
 * with nabla ops, and a batching rule. Its Hessian (jacfwd over jacrev of
 * sum(softsign(x))) is diagonal with -2 sign(x) / (1 + |x|)^3, checked here. */
#include <math.h>
#include <nabla/nabla.h>
#include <stdio.h>

/* Output type = input type; floats only. */
static nb_status softsign_infer(void *user, const nb_shape *in_shapes, const nb_dtype *in_dtypes,
                                int n_in, nb_shape *out_shapes, nb_dtype *out_dtypes, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  if (in_dtypes[0] != NB_F32 && in_dtypes[0] != NB_F64)
    return nb_set_error(NB_ERR_DTYPE, "softsign: input is %s (f32 or f64 only)",
                        nb_dtype_name(in_dtypes[0]));
  out_shapes[0] = in_shapes[0];
  out_dtypes[0] = in_dtypes[0];
  return NB_OK;
}

/* The kernel: contiguous row-major buffers. */
static nb_status softsign_cpu(void *user, const nb_custom_buffer *in, int n_in,
                              nb_custom_buffer *out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  int64_t n = 1;
  for (int d = 0; d < in[0].shape.ndim; d++)
    n *= in[0].shape.dims[d];
  if (in[0].dtype == NB_F32) {
    const float *x = in[0].data;
    float *y = out[0].data;
    for (int64_t i = 0; i < n; i++)
      y[i] = x[i] / (1 + fabsf(x[i]));
  } else {
    const double *x = in[0].data;
    double *y = out[0].data;
    for (int64_t i = 0; i < n; i++)
      y[i] = x[i] / (1 + fabs(x[i]));
  }
  return NB_OK;
}

/* d softsign / dx = 1 / (1 + |x|)^2, with nabla ops: differentiable again. */
static nb_tensor *softsign_deriv(nb_tensor *x) {
  return nb_reciprocal(nb_square(nb_add_scalar(nb_abs(x), 1)));
}

static nb_status softsign_vjp(void *user, nb_tensor *const *in, int n_in, nb_tensor *const *out,
                              nb_tensor *const *cotangents, int n_out, nb_tensor **in_cotangents) {
  (void)user, (void)n_in, (void)out, (void)n_out;
  in_cotangents[0] = nb_mul(cotangents[0], softsign_deriv(in[0]));
  return in_cotangents[0] ? NB_OK : nb_last_status();
}

static nb_status softsign_jvp(void *user, nb_tensor *const *in, nb_tensor *const *tangents,
                              int n_in, nb_tensor *const *out, int n_out,
                              nb_tensor **out_tangents) {
  (void)user, (void)n_in, (void)out, (void)n_out;
  out_tangents[0] = nb_mul(tangents[0], softsign_deriv(in[0]));
  return out_tangents[0] ? NB_OK : nb_last_status();
}

static const nb_custom_op *softsign_op; /* set when registered */

/* Elementwise, so the batched op is the op on the whole batch. */
static nb_status softsign_batch(void *user, nb_tensor *const *in, const bool *batched, int n_in,
                                int64_t batch, nb_tensor **out, int n_out) {
  (void)user, (void)batched, (void)batch;
  return nb_custom_call(softsign_op, in, n_in, out, n_out);
}

/* f(x) = sum(softsign(x)) */
static nb_status f_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *y;
  nb_status st = nb_custom_call(softsign_op, in, 1, &y, 1);
  if (st) return st;
  out[0] = nb_sum(y, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* g(x) = softsign(x) */
static nb_status g_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user;
  return nb_custom_call(softsign_op, in, n_in, out, n_out);
}

int main(void) {
  nb_custom_op_def def = {.name = "softsign",
                          .n_in = 1,
                          .n_out = 1,
                          .infer = softsign_infer,
                          .cpu = softsign_cpu,
                          .vjp = softsign_vjp,
                          .jvp = softsign_jvp,
                          .batch = softsign_batch,
                          .sharding = "... -> ..."};
  softsign_op = nb_custom_op_register(&def);
  if (!softsign_op) {
    fprintf(stderr, "error: %s\n", nb_last_error());
    return 1;
  }

  double xs[4] = {-1.5, -0.25, 0.5, 2.0};
  nb_tensor *x = nb_from_data(xs, NB_SHAPE(4), NB_F64), *y, *h[1];
  nb_custom_call(softsign_op, &x, 1, &y, 1);
  printf("x:\n");
  nb_print(x);
  printf("softsign(x):\n");
  nb_print(y);

  nb_fn *f = nb_fn_create(f_body, NULL, 1, 1), *hess = nb_hessian(f, NB_ALL);
  if (nb_call(hess, &x, h)) {
    fprintf(stderr, "error: %s\n", nb_last_error());
    return 1;
  }
  printf("hessian of sum(softsign(x)), diagonal -2 sign(x) / (1 + |x|)^3:\n");
  nb_print(h[0]);
  double hv[16], err = 0;
  nb_to_host(h[0], hv, sizeof hv);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) {
      double want = i == j ? -2 * (xs[i] > 0 ? 1 : -1) / pow(1 + fabs(xs[i]), 3) : 0;
      err = fmax(err, fabs(hv[4 * i + j] - want));
    }
  printf("max |hessian - closed form| = %.3g\n", err);

  /* vmap over rows, through the batching rule: one call on the whole batch */
  nb_tensor *xb = nb_from_data((double[]){1, -2, 3, -4, 5, -6}, NB_SHAPE(3, 2), NB_F64), *yb[1];
  nb_fn *per_row = nb_fn_create(g_body, NULL, 1, 1), *rows = nb_vmap(per_row, NULL, NULL);
  if (nb_call(rows, &xb, yb)) {
    fprintf(stderr, "error: %s\n", nb_last_error());
    return 1;
  }
  printf("vmap over the rows of [[1,-2],[3,-4],[5,-6]] (one kernel call for the batch):\n");
  nb_print(yb[0]);
  nb_fn_release(rows);
  nb_fn_release(per_row);
  nb_fn_release(hess);
  nb_fn_release(f);
  if (err > 1e-12 || nb_last_status()) {
    fprintf(stderr, "error: the Hessian differs from the closed form (%s)\n", nb_last_error());
    return 1;
  }
  return 0;
}
