/* examples/tour.c — a tour of nabla's forward ops: creation, broadcasting,
 * dtype promotion, laziness (the graph is realized when printed), views,
 * reductions, nn helpers and error messages. */
#include <nabla/nabla.h>

static void section(const char *title) { printf("\n== %s\n", title); }

int main(void) {
  nb_seed(42);

  section("broadcasting: [3,1] + [4] -> [3,4]");
  nb_tensor *col = nb_reshape(nb_arange(0, 3, 1, NB_F32), NB_SHAPE(3, 1));
  nb_tensor *row = nb_arange(0, 40, 10, NB_F32);
  nb_print(nb_add(col, row));

  section("promotion: i32 * f16 -> f16; weak scalars keep the tensor's dtype");
  nb_tensor *i = nb_arange(1, 4, 1, NB_I32);
  nb_print(nb_mul(i, nb_full(NB_SHAPE(3), 0.5, NB_F16)));
  nb_print(nb_add_scalar(i, 10)); /* stays i32 */

  section("laziness: ops record a graph; printing realizes it");
  nb_stats s0 = nb_get_stats();
  nb_tensor *x = nb_randn(NB_SHAPE(4, 5), NB_F32);
  nb_tensor *y = nb_tanh(nb_add_scalar(nb_mul_scalar(x, 2), 1));
  nb_tensor *z = nb_sum(y, NB_AXES(1), false);
  printf("after recording: realized=%d, kernels run=%llu\n", nb_is_realized(z),
         (unsigned long long)(nb_get_stats().kernels_run - s0.kernels_run));
  nb_print(z);
  printf("after printing:  realized=%d, kernels run=%llu\n", nb_is_realized(z),
         (unsigned long long)(nb_get_stats().kernels_run - s0.kernels_run));

  section("views: transpose, slice, flip share memory");
  nb_tensor *m = nb_reshape(nb_arange(0, 12, 1, NB_I64), NB_SHAPE(3, 4));
  nb_print(nb_transpose(m));
  nb_print(nb_slice(m, (int64_t[]){0, 1}, (int64_t[]){NB_END, NB_END}, (int64_t[]){2, 2}));
  nb_print(nb_flip(m, NB_AXES(1)));

  section("reductions and nn helpers");
  nb_print(nb_max(m, NB_AXES(0), false));
  nb_print(nb_argmax(nb_cast(m, NB_F32), -1, false));
  nb_print(nb_softmax(nb_cast(m, NB_F32), -1));
  nb_print(nb_layer_norm(nb_cast(m, NB_F32), NULL, NULL, 1e-5));
  nb_print(nb_einsum("ij,kj->ik", (nb_tensor *[]){m, m}, 2));

  section("errors are values with messages, checked when the op is called");
  nb_tensor *bad = nb_matmul(nb_ones(NB_SHAPE(2, 3), NB_F32), nb_ones(NB_SHAPE(4, 5), NB_F32));
  nb_tensor *chained = nb_relu(nb_sum(bad, NB_ALL, false)); /* NULL flows through */
  printf("result %s; status \"%s\": %s\n", chained ? "non-NULL" : "NULL",
         nb_status_str(nb_last_status()), nb_last_error());
  nb_clear_error();
  nb_sum(m, NB_AXES(2), false);
  printf("%s\n", nb_last_error());
  nb_clear_error();
  nb_add(nb_ones(NB_SHAPE(2, 3), NB_F32), nb_ones(NB_SHAPE(4), NB_F32));
  printf("%s\n", nb_last_error());
  nb_clear_error();
  return 0;
}
