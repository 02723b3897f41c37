/* examples/transforms.c — the transform algebra in C (README "Transforms"):
 *   1. per-example gradients: nb_vmap(nb_grad(loss)) over a batch;
 *   2. the Mojo seed example: nb_jacfwd(nb_jacrev(nb_vmap(sum(sin(x)))));
 *   3. a jitted training step: nb_jit(nb_value_and_grad(loss)) + nb_assign;
 *   4. nb_scan: a linear recurrence h = a*h + x_t, and its gradient.
 * Run by `make demo`. */
#include <nabla/nabla.h>
#include <stdio.h>

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    if ((x) != NB_OK) {                                                                            \
      fprintf(stderr, "error: %s\n", nb_last_error());                                             \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

/* loss(w, b, x, y) = (tanh(x . w + b) - y)^2 for ONE example: x [3], y []. */
static nb_status loss1(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *pred = nb_tanh(nb_add(nb_matmul(in[2], in[0]), in[1]));
  out[0] = nb_square(nb_sub(pred, in[3]));
  return out[0] ? NB_OK : nb_last_status();
}

/* foo(x) = sum(sin(x)) */
static nb_status foo(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_sin(in[0]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* mean loss over a batch: x [N,3], y [N] */
static nb_status batch_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *pred = nb_tanh(nb_add(nb_matmul(in[2], in[0]), in[1]));
  out[0] = nb_mean(nb_square(nb_sub(pred, in[3])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* scan body: (h, a, x_t) -> (h' = a*h + x_t, y_t = h') with a carried unchanged */
static nb_status step(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_add(nb_mul(in[1], in[0]), in[2]);
  out[0] = h;
  out[1] = in[1];
  out[2] = h;
  return h ? NB_OK : nb_last_status();
}

/* total(a, xs) = sum of the scanned states */
static nb_status scan_total(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_in, (void)n_out;
  nb_fn *body = u;
  nb_tensor *init[2] = {nb_scalar(0.0, NB_F32), in[0]}, *carry[2], *ys;
  nb_status st = nb_scan(body, init, 2, &in[1], 1, false, carry, &ys);
  if (st) return st;
  out[0] = nb_sum(ys, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

int main(void) {
  nb_seed(0);
  nb_tensor *w = nb_randn(NB_SHAPE(3), NB_F32), *b = nb_zeros(NB_SHAPE(), NB_F32);
  nb_tensor *x = nb_randn(NB_SHAPE(4, 3), NB_F32), *y = nb_rand(NB_SHAPE(4), NB_F32);

  /* 1. per-example gradients: grad of the one-example loss, vmapped over the batch
   *    (the parameters are shared: NB_NOT_MAPPED) */
  nb_fn *l1 = nb_fn_create(loss1, NULL, 4, 1);
  nb_fn *g1 = nb_grad(l1, NB_AXES(0));
  int in_axes[4] = {NB_NOT_MAPPED, NB_NOT_MAPPED, 0, 0};
  nb_fn *per_example = nb_vmap(g1, in_axes, NULL);
  nb_tensor *args[4] = {w, b, x, y}, *gw;
  CHECK(nb_call(per_example, args, &gw));
  printf("per-example gradients of w, shape [4,3]:\n");
  nb_print(gw);

  /* 2. jacfwd(jacrev(vmap(foo))) on x [2,3]: shape [2,2,3,2,3] */
  nb_fn *f = nb_fn_create(foo, NULL, 1, 1), *vf = nb_vmap(f, NULL, NULL);
  nb_fn *jac = nb_jacrev(vf, NB_ALL), *hess = nb_jacfwd(jac, NB_ALL);
  nb_tensor *x2 = nb_randn(NB_SHAPE(2, 3), NB_F32), *h;
  CHECK(nb_call(hess, &x2, &h));
  nb_shape hs = nb_shape_of(h);
  printf("jacfwd(jacrev(vmap(foo))) has %d dims: [%lld,%lld,%lld,%lld,%lld]\n", hs.ndim,
         (long long)hs.dims[0], (long long)hs.dims[1], (long long)hs.dims[2],
         (long long)hs.dims[3], (long long)hs.dims[4]);

  /* 3. a jitted training step: traced once, then replayed */
  nb_fn *bl = nb_fn_create(batch_loss, NULL, 4, 1);
  nb_fn *vg = nb_value_and_grad(bl, NB_AXES(0, 1)), *train = nb_jit(vg);
  for (int it = 0; it <= 200; it++) {
    nb_scope_begin();
    nb_tensor *o[3]; /* loss, grad w, grad b */
    CHECK(nb_call(train, args, o));
    CHECK(nb_assign(w, nb_sub(w, nb_mul_scalar(o[1], 0.1))));
    CHECK(nb_assign(b, nb_sub(b, nb_mul_scalar(o[2], 0.1))));
    if (it % 50 == 0) printf("jitted step %3d  loss %.5f\n", it, nb_item(o[0]));
    nb_scope_end();
  }
  nb_stats s = nb_get_stats();
  printf("jit cache: %llu hit(s), %llu miss(es)\n", (unsigned long long)s.jit_cache_hits,
         (unsigned long long)s.jit_cache_misses);

  /* 4. scan: h_t = a*h_{t-1} + x_t over 5 steps, total = sum_t h_t, and d total / d a */
  nb_fn *body = nb_fn_create(step, NULL, 3, 3);
  nb_fn *total = nb_fn_create(scan_total, body, 2, 1);
  nb_fn *dtotal = nb_value_and_grad(total, NB_AXES(0));
  float xs_data[5] = {1, 2, 3, 4, 5};
  nb_tensor *sargs[2] = {nb_scalar(0.5, NB_F32), nb_from_data(xs_data, NB_SHAPE(5), NB_F32)};
  nb_tensor *tv[2];
  CHECK(nb_call(dtotal, sargs, tv));
  printf("scan: total %.4f, d total / d a %.4f\n", nb_item(tv[0]), nb_item(tv[1]));

  nb_fn_release(dtotal);
  nb_fn_release(total);
  nb_fn_release(body);
  nb_fn_release(train);
  nb_fn_release(vg);
  nb_fn_release(bl);
  nb_fn_release(hess);
  nb_fn_release(jac);
  nb_fn_release(vf);
  nb_fn_release(f);
  nb_fn_release(per_example);
  nb_fn_release(g1);
  nb_fn_release(l1);
  return 0;
}
