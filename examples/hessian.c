/* examples/hessian.c — transforms compose: the Hessian of sum(sin(x)) for x of
 * shape (2, 3) as jacfwd(jacrev(f)). Its shape is out.shape + in.shape +
 * in.shape = (2, 3, 2, 3), with -sin(x) on the diagonal. */
#include <nabla/nabla.h>
#include <stdio.h>

static nb_status foo(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  out[0] = nb_sum(nb_sin(in[0]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

int main(void) {
  nb_seed(3);
  nb_fn *f = nb_fn_create(foo, NULL, 1, 1);
  nb_fn *jac = nb_jacrev(f, NB_ALL);    /* first derivative: cos(x), shape (2,3) */
  nb_fn *hess = nb_jacfwd(jac, NB_ALL); /* second derivative: (2,3,2,3) */
  nb_tensor *x = nb_randn(NB_SHAPE(2, 3), NB_F32), *h[1], *g[1];
  printf("x:\n");
  nb_print(x);
  if (nb_call(jac, &x, g) || nb_call(hess, &x, h)) {
    fprintf(stderr, "error: %s\n", nb_last_error());
    return 1;
  }
  printf("jacrev: cos(x)\n");
  nb_print(g[0]);
  char b[64];
  printf("hessian, shape %s (diagonal = -sin(x)):\n", nb_shape_str(nb_shape_of(h[0]), b, sizeof b));
  nb_print(h[0]);
  printf("-sin(x):\n");
  nb_print(nb_neg(nb_sin(x)));
  nb_fn_release(hess);
  nb_fn_release(jac);
  nb_fn_release(f);
  return nb_last_status() != NB_OK;
}
