/* examples/first.c — the README's first example: build a small graph, print it.
 *   cc first.c $(pkg-config --cflags --libs nabla) -o first */
#include <nabla/nabla.h>

int main(void) {
  nb_seed(0);
  nb_tensor *x = nb_arange(0, 6, 1, NB_F32);    /* [0 1 2 3 4 5]      */
  nb_tensor *m = nb_reshape(x, NB_SHAPE(2, 3)); /* [[0 1 2] [3 4 5]]  */
  nb_tensor *w = nb_ones(NB_SHAPE(3, 2), NB_F32);
  nb_tensor *y = nb_relu(nb_sub_scalar(nb_matmul(m, w), 4)); /* lazy: nothing computed yet */
  nb_print(y);                                               /* realizes: [[0, 0], [8, 8]] */
  nb_print(nb_softmax(y, -1));
  if (nb_last_status() != NB_OK) {
    fprintf(stderr, "error: %s\n", nb_last_error());
    return 1;
  }
  return 0;
}
