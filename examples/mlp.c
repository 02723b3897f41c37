/* examples/mlp.c — the README MLP trained both ways, side by side.
 *
 * Layers [1, 32, 64, 32, 1], glorot-uniform weights, zero biases [1, n], a batch of
 * 256 U[0,1) inputs and targets, mean squared error, SGD with lr 0.01, 1001 steps.
 *  - JAX style: a pure loss function, nb_value_and_grad, parameters rebound with
 *    nb_assign.
 *  - PyTorch style: parameters require grad, nb_backward accumulates into .grad,
 *    nb_assign updates in place, nb_zero_grad resets.
 * Both start from the same seed, so they print the same losses.
 *
 *   mlp [DEVICE]    DEVICE: cpu (the default), cuda:0 (a CUDA build on a GPU), emu:0 */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_LAYERS 4
static const int64_t layers[N_LAYERS + 1] = {1, 32, 64, 32, 1};

/* params: W0 b0 W1 b1 W2 b2 W3 b3, kept in the caller's scope. */
static void init_params(nb_tensor **params) {
  nb_seed(0);
  for (int i = 0; i < N_LAYERS; i++) {
    params[2 * i] = nb_glorot_uniform(NB_SHAPE(layers[i], layers[i + 1]), NB_F32);
    params[2 * i + 1] = nb_zeros(NB_SHAPE(1, layers[i + 1]), NB_F32);
  }
}

/* x [256,1] -> relu(x W0 + b0) ... -> x W3 + b3 [256,1]; mean((pred - y)^2) */
static nb_tensor *forward_loss(nb_tensor *const *params, nb_tensor *x, nb_tensor *y) {
  nb_tensor *h = x;
  for (int i = 0; i < N_LAYERS; i++) {
    h = nb_add(nb_matmul(h, params[2 * i]), params[2 * i + 1]);
    if (i < N_LAYERS - 1) h = nb_relu(h);
  }
  return nb_mean(nb_square(nb_sub(h, y)), NB_ALL, false);
}

/* in: W0 b0 .. W3 b3 x y -> out[0]: the loss */
static nb_status loss_fn(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  out[0] = forward_loss(in, in[8], in[9]);
  return out[0] ? NB_OK : nb_last_status();
}

static int train_functional(nb_tensor *x, nb_tensor *y, double *losses) {
  nb_tensor *params[10];
  init_params(params);
  params[8] = x;
  params[9] = y;
  nb_fn *loss = nb_fn_create(loss_fn, NULL, 10, 1);
  nb_fn *vg = nb_value_and_grad(loss, NB_AXES(0, 1, 2, 3, 4, 5, 6, 7));
  nb_fn_release(loss);
  for (int step = 0; step <= 1000; step++) {
    nb_scope_begin();
    nb_tensor *o[9]; /* o[0] the loss, o[1..8] the gradients */
    if (nb_call(vg, params, o)) break;
    for (int i = 0; i < 8; i++)
      nb_assign(params[i], nb_sub(params[i], nb_mul_scalar(o[1 + i], 0.01)));
    if (step % 100 == 0) losses[step / 100] = nb_item(o[0]);
    nb_scope_end();
  }
  nb_fn_release(vg);
  return nb_last_status() != NB_OK;
}

static int train_imperative(nb_tensor *x, nb_tensor *y, double *losses) {
  nb_tensor *params[8];
  init_params(params);
  for (int i = 0; i < 8; i++)
    nb_set_requires_grad(params[i], true);
  for (int step = 0; step <= 1000; step++) {
    nb_scope_begin();
    nb_tensor *loss = forward_loss(params, x, y);
    nb_backward(loss);
    for (int i = 0; i < 8; i++) {
      nb_assign(params[i], nb_sub(params[i], nb_mul_scalar(nb_grad_of(params[i]), 0.01)));
      nb_zero_grad(params[i]);
    }
    if (step % 100 == 0) losses[step / 100] = nb_item(loss);
    nb_scope_end();
  }
  return nb_last_status() != NB_OK;
}

int main(int argc, char **argv) {
  if (argc > 1) { /* every leaf (data, parameters) is made on the default device */
    const char *d = argv[1];
    nb_device dev = !strncmp(d, "cuda:", 5) ? NB_CUDA(atoi(d + 5))
                    : !strncmp(d, "emu:", 4) ? NB_EMU(atoi(d + 4))
                                             : NB_CPU;
    if (nb_set_default_device(dev)) {
      fprintf(stderr, "error: %s\n", nb_last_error());
      return 1;
    }
  }
  nb_seed(42);
  nb_tensor *x = nb_rand(NB_SHAPE(256, 1), NB_F32), *y = nb_rand(NB_SHAPE(256, 1), NB_F32);
  double fl[11], il[11];
  if (train_functional(x, y, fl) || train_imperative(x, y, il)) {
    fprintf(stderr, "error: %s\n", nb_last_error());
    return 1;
  }
  printf("README MLP [1,32,64,32,1], batch 256, SGD lr 0.01, on %s\n",
         nb_device_str(nb_default_device()));
  printf("step  value_and_grad   backward\n");
  for (int i = 0; i <= 10; i++)
    printf("%4d  %14.6f  %9.6f\n", i * 100, fl[i], il[i]);
  return 0;
}
