/* examples/single_layer.c — imperative autodiff on one layer (PyTorch style).
 * relu(input @ weight + bias), squared error against a label, one backward pass,
 * one SGD update in place. */
#include <nabla/nabla.h>
#include <stdio.h>

int main(void) {
  nb_seed(7);
  nb_tensor *weight = nb_set_requires_grad(nb_randn(NB_SHAPE(3, 4), NB_F32), true);
  nb_tensor *bias = nb_set_requires_grad(nb_randn(NB_SHAPE(2, 4), NB_F32), true);
  nb_tensor *label = nb_randn(NB_SHAPE(2, 4), NB_F32);
  nb_tensor *input = nb_randn(NB_SHAPE(2, 3), NB_F32);

  /* forward: logits [2,4], loss = sum((logits - label)^2) */
  nb_tensor *logits = nb_relu(nb_add(nb_matmul(input, weight), bias));
  nb_tensor *loss = nb_sum(nb_square(nb_sub(logits, label)), NB_ALL, false);

  nb_backward(loss); /* weight.grad, bias.grad */
  printf("loss: %f\n", nb_item(loss));
  printf("d loss / d weight:\n");
  nb_print(nb_grad_of(weight));

  /* SGD: weight -= 0.01 * weight.grad (same handle, still requires grad) */
  nb_assign(weight, nb_sub(weight, nb_mul_scalar(nb_grad_of(weight), 0.01)));
  nb_assign(bias, nb_sub(bias, nb_mul_scalar(nb_grad_of(bias), 0.01)));
  printf("weight:\n");
  nb_print(weight);
  printf("bias:\n");
  nb_print(bias);
  nb_tensor *after = nb_sum(
      nb_square(nb_sub(nb_relu(nb_add(nb_matmul(input, weight), bias)), label)), NB_ALL, false);
  printf("loss after one step: %f\n", nb_item(after));
  if (nb_last_status() != NB_OK) {
    fprintf(stderr, "error: %s\n", nb_last_error());
    return 1;
  }
  return 0;
}
