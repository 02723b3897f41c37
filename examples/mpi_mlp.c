/* examples/mpi_mlp.c — one MLP trained data parallel and tensor parallel
 * (Megatron: W1 column-parallel, W2 row-parallel) on a mesh spanning the
 * processes of an mpirun job. The same program runs alone (a job of one
 * process: the mesh is that process's virtual devices) or as 2 or 4 processes:
 *
 *   make MPI=1 build-mpi/examples/mpi_mlp
 *   mpirun -np 2 build-mpi/examples/mpi_mlp     # each rank holds one dp row
 *   mpirun -np 4 build-mpi/examples/mpi_mlp     # each rank holds one device
 *
 * Every rank prints nothing but rank 0 the losses: the same at every size. */
#include <nabla/nabla.h>
#include <stdio.h>

static nb_status loss_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_relu(nb_matmul(in[0], in[1])); /* x @ W1 */
  out[0] = nb_mean(nb_square(nb_sub(nb_matmul(h, in[2]), in[3])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static void train(nb_mesh *m, const char *w1_spec, const char *w2_spec) {
  nb_scope_begin();
  nb_seed(0); /* every rank draws the same values, then keeps its blocks */
  nb_tensor *x = nb_shard(nb_randn(NB_SHAPE(64, 16), NB_F32), m, "dp, _");
  nb_tensor *y = nb_shard(nb_randn(NB_SHAPE(64, 16), NB_F32), m, "dp, _");
  nb_tensor *w1 = nb_shard(nb_glorot_uniform(NB_SHAPE(16, 64), NB_F32), m, w1_spec);
  nb_tensor *w2 = nb_shard(nb_glorot_uniform(NB_SHAPE(64, 16), NB_F32), m, w2_spec);
  nb_fn *f = nb_fn_create(loss_body, NULL, 4, 1), *vg = nb_value_and_grad(f, NB_AXES(1, 2));
  for (int step = 0; step < 50; step++) {
    nb_tensor *o[3]; /* loss, dW1, dW2 (laid out like W1, W2) */
    if (nb_call(vg, (nb_tensor *[]){x, w1, w2, y}, o) != NB_OK) break;
    w1 = nb_sub(w1, nb_mul_scalar(o[1], 0.05));
    w2 = nb_sub(w2, nb_mul_scalar(o[2], 0.05));
    nb_eval((nb_tensor *[]){w1, w2}, 2);
    double loss = nb_item(o[0]); /* a collective: every rank reads it */
    if (step % 10 == 0 && nb_rank() == 0)
      printf("  W1 [%s], W2 [%s]: step %2d loss %.6f\n", w1_spec, w2_spec, step, loss);
  }
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_scope_end();
}

int main(int argc, char **argv) {
  if (nb_init_distributed(&argc, &argv) != NB_OK) {
    fprintf(stderr, "%s\n", nb_last_error());
    return 1;
  }
  nb_mesh *m = nb_mesh_world("dp=2,tp=2"); /* 4 devices over the job's processes */
  if (!m) {
    fprintf(stderr, "%s%s\n", nb_rank_prefix(), nb_last_error());
    nb_finalize();
    return 1;
  }
  if (nb_rank() == 0) printf("mesh %s over %d process(es)\n", nb_mesh_str(m), nb_world_size());
  train(m, "_, _", "_, _");   /* data parallel: weights replicated */
  train(m, "_, tp", "tp, _"); /* + Megatron: one all-reduce over tp per block */
  printf("%sdone\n", nb_rank_prefix());
  nb_mesh_release(m);
  nb_finalize();
  return nb_last_status() == NB_OK ? 0 : 1;
}
