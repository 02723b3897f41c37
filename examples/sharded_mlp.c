/* examples/sharded_mlp.c — one MLP trained four ways on a virtual CPU mesh
 * dp=2,tp=2, with the same losses: unsharded; data parallel (the batch
 * sharded over dp, weights replicated); data + Megatron tensor parallel (W1
 * column-parallel, W2 row-parallel over tp), laid out by propagation; and the
 * same written per device with nb_shard_map and an explicit nb_all_reduce.
 * Each block's row-parallel product leaves a partial sum over tp, reduced by
 * one all-reduce per block in the forward pass; nb_stats shows the count and
 * the bytes. */
#include <math.h>
#include <nabla/nabla.h>
#include <stdio.h>

enum { BLOCKS = 2, N = 32, D = 16, H = 64, STEPS = 5, N_PARAMS = 4 * BLOCKS };

/* in = W1, b1, W2, b2 per block, then x, y -> mean((mlp(x) - y)^2) */
static nb_status loss_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = in[N_PARAMS];
  for (int i = 0; i < BLOCKS; i++) {
    nb_tensor *const *w = in + 4 * i;
    h = nb_add(nb_matmul(nb_relu(nb_add(nb_matmul(h, w[0]), w[1])), w[2]), w[3]);
  }
  out[0] = nb_mean(nb_square(nb_sub(h, in[N_PARAMS + 1])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* One block per device (nb_shard_map body): x [N/dp, D], W1 [D, H/tp],
 * b1 [H/tp], W2 [H/tp, D], b2 [D]; the row-parallel product's partial sums
 * are added over tp explicitly. */
static nb_status block_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_relu(nb_add(nb_matmul(in[0], in[1]), in[2]));
  out[0] = nb_add(nb_all_reduce(nb_matmul(h, in[3]), "tp", NB_REDUCE_SUM), in[4]);
  return out[0] ? NB_OK : nb_last_status();
}

/* loss_fn with each block a shard_map (u: the block's nb_fn) */
static nb_status loss_smap(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *h = in[N_PARAMS];
  for (int i = 0; i < BLOCKS; i++) {
    nb_tensor *a[5] = {h, in[4 * i], in[4 * i + 1], in[4 * i + 2], in[4 * i + 3]};
    nb_status st = nb_call(u, a, &h);
    if (st) return st;
  }
  out[0] = nb_mean(nb_square(nb_sub(h, in[N_PARAMS + 1])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* The parameters and data of one run, placed on mesh m with the given specs
 * (m NULL: plain tensors). Same values for every run (same seed). */
static void init(nb_tensor **in, nb_mesh *m, const char *const *wspec, const char *xspec) {
  nb_seed(42);
  for (int i = 0; i < BLOCKS; i++) {
    nb_shape s[4] = {NB_SHAPE(D, H), NB_SHAPE(H), NB_SHAPE(H, D), NB_SHAPE(D)};
    for (int j = 0; j < 4; j++) {
      nb_tensor *t = j % 2 == 0 ? nb_glorot_uniform(s[j], NB_F32) : nb_zeros(s[j], NB_F32);
      in[4 * i + j] = m ? nb_shard(t, m, wspec[j]) : t;
    }
  }
  nb_tensor *x = nb_randn(NB_SHAPE(N, D), NB_F32), *y = nb_tanh(nb_sum(x, NB_AXES(1), true));
  in[N_PARAMS] = m ? nb_shard(x, m, xspec) : x;
  in[N_PARAMS + 1] = m ? nb_shard(nb_broadcast_to(y, NB_SHAPE(N, D)), m, xspec)
                       : nb_broadcast_to(y, NB_SHAPE(N, D));
}

/* Trains STEPS steps of SGD on f's loss; losses[s] gets step s's loss. */
static int train(nb_fn *f, nb_tensor **in, double *losses) {
  nb_axes params = {.n = N_PARAMS};
  for (int i = 0; i < N_PARAMS; i++)
    params.v[i] = i;
  nb_fn *vg = nb_value_and_grad(f, params);
  for (int s = 0; s < STEPS; s++) {
    nb_scope_begin();
    nb_tensor *o[1 + N_PARAMS];
    if (nb_call(vg, in, o) != NB_OK) break;
    losses[s] = nb_item(o[0]);
    for (int i = 0; i < N_PARAMS; i++)
      nb_assign(in[i], nb_sub(in[i], nb_mul_scalar(o[1 + i], 0.1)));
    nb_scope_end();
  }
  nb_fn_release(vg);
  return nb_last_status() == NB_OK ? 0 : 1;
}

int main(void) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  static const char *const replicated[4] = {"_, _", "_", "_, _", "_"};
  static const char *const megatron[4] = {"_, tp", "tp", "tp, _", "_"};
  nb_tensor *plain[N_PARAMS + 2], *dp[N_PARAMS + 2], *tp[N_PARAMS + 2], *sm[N_PARAMS + 2];
  init(plain, NULL, NULL, NULL);
  init(dp, m, replicated, "dp, _");
  init(tp, m, megatron, "dp, _");
  init(sm, m, megatron, "dp, _");
  nb_fn *f = nb_fn_create(loss_fn, NULL, N_PARAMS + 2, 1),
        *body = nb_fn_create(block_body, NULL, 5, 1);
  static const char *const block_in[5] = {"dp, _", "_, tp", "tp", "tp, _", "_"};
  nb_fn *block = m ? nb_shard_map(body, m, block_in, (const char *const[]){"dp, _"}) : NULL;
  nb_fn *fs = block ? nb_fn_create(loss_smap, block, N_PARAMS + 2, 1) : NULL;
  if (!m || !fs || nb_last_status() != NB_OK) {
    fprintf(stderr, "setup: %s\n", nb_last_error());
    return 1;
  }
  double l_plain[STEPS], l_dp[STEPS], l_tp[STEPS], l_sm[STEPS];
  if (train(f, plain, l_plain) || train(f, dp, l_dp) || train(f, tp, l_tp) || train(fs, sm, l_sm)) {
    fprintf(stderr, "training: %s\n", nb_last_error());
    return 1;
  }
  printf("step   unsharded   data-parallel   data+tensor-parallel   shard_map\n");
  double worst = 0;
  for (int s = 0; s < STEPS; s++) {
    printf("%4d  %10.6f  %14.6f  %21.6f  %10.6f\n", s, l_plain[s], l_dp[s], l_tp[s], l_sm[s]);
    worst = fmax(worst, fmax(fabs(l_dp[s] - l_plain[s]), fabs(l_tp[s] - l_plain[s])));
    worst = fmax(worst, fabs(l_sm[s] - l_plain[s]));
  }
  printf("largest loss difference: %.3g (float reassociation only)\n", worst);
  printf("W1 of block 0: %s, W2: %s, x: %s\n", nb_sharding_str(tp[0]), nb_sharding_str(tp[2]),
         nb_sharding_str(tp[N_PARAMS]));

  /* the forward pass alone, recorded: its collectives */
  nb_reset_stats();
  nb_tensor *loss, *loss_sm;
  nb_call(f, tp, &loss);
  nb_stats st = nb_get_stats();
  nb_reset_stats();
  nb_call(fs, sm, &loss_sm);
  nb_stats st_sm = nb_get_stats();
  /* per block: a partial [N, D] f32 activation, all-reduced over tp (2
   * devices) within each dp group: ring all-reduce sends 2 (n-1)/n of the
   * local [N/2, D] block per device, the bandwidth minimum for an all-reduce */
  double minimum = BLOCKS * 2.0 /* dp groups */ * 2 /* devices */ * 2.0 * (2 - 1) / 2 * (N / 2.0) *
                   D * sizeof(float);
  printf("forward: %llu all-reduces (%d blocks), %llu all-gathers, %llu bytes sent "
         "(analytical minimum %.0f)\n",
         (unsigned long long)st.n_all_reduce, BLOCKS, (unsigned long long)st.n_all_gather,
         (unsigned long long)st.collective_bytes, minimum);
  printf("loss %.6f (its mean over the dp-sharded batch is a partial sum until read)\n",
         nb_item(loss));
  printf("shard_map forward: %llu all-reduces, %llu all-gathers, %llu bytes sent; loss %.6f\n",
         (unsigned long long)st_sm.n_all_reduce, (unsigned long long)st_sm.n_all_gather,
         (unsigned long long)st_sm.collective_bytes, nb_item(loss_sm));
  nb_fn_release(fs);
  nb_fn_release(block);
  nb_fn_release(body);
  nb_fn_release(f);
  nb_mesh_release(m);
  return worst < 1e-4 && st.n_all_reduce == BLOCKS && st_sm.n_all_reduce == BLOCKS ? 0 : 1;
}
