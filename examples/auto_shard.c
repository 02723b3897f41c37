/* examples/auto_shard.c — nabla finds the sharding itself: a training step of
 * a 2-block MLP (loss, gradients, SGD update) solved by nb_auto_shard_plan on
 * a virtual CPU mesh, for a small batch with a large hidden size on tp=4
 * (it finds Megatron: W1 column-parallel, W2 row-parallel) and a large batch
 * with small weights on dp=4 (data parallel), then a two-block transformer
 * (nb_block_apply of src/nn, f64) on tp=2 written as a function of trees
 * (nb_auto_shard_plan_trees), where it splits the attention heads over tp
 * (w_q, w_k, w_v column-parallel, w_o row-parallel) and the two blocks share
 * one set of choices. Each plan trains a few steps with nb_shard_plan_call
 * (nb_shard_plan_call_trees); the losses are those of the unsharded step, and
 * the report shows the predicted collectives next to the measured ones. */
#include <math.h>
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BLOCKS = 2, NP = 4 * BLOCKS, NIN = NP + 2, NOUT = 1 + NP, STEPS = 5 };

static nb_status loss_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = in[NP];
  for (int i = 0; i < BLOCKS; i++) {
    nb_tensor *const *w = in + 4 * i;
    h = nb_add(nb_matmul(nb_relu(nb_add(nb_matmul(h, w[0]), w[1])), w[2]), w[3]);
  }
  out[0] = nb_mean(nb_square(nb_sub(h, in[NP + 1])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* loss and the parameters after one SGD step (u: value_and_grad of the loss) */
static nb_status step_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *o[1 + NP];
  nb_status st = nb_call(u, in, o);
  if (st) return st;
  out[0] = o[0];
  for (int i = 0; i < NP; i++)
    if (!(out[1 + i] = nb_sub(in[i], nb_mul_scalar(o[1 + i], 0.05)))) return nb_last_status();
  return NB_OK;
}

/* Trains STEPS steps with f (plan NULL: unsharded nb_call); losses[s]. The
 * inputs are replaced by the updated parameters each step. */
static int train(nb_fn *f, nb_shard_plan *plan, nb_tensor **in, double *losses) {
  for (int s = 0; s < STEPS; s++) {
    nb_tensor *o[NOUT];
    nb_status st = plan ? nb_shard_plan_call(plan, in, o) : nb_call(f, in, o);
    if (st) return 1;
    losses[s] = nb_item(o[0]);
    for (int i = 0; i < NP; i++)
      in[i] = o[1 + i];
  }
  return 0;
}

static int run(const char *axes, int64_t n, int64_t d, int64_t h, nb_fn *step) {
  nb_mesh *m = nb_mesh_cpu(axes);
  nb_tensor *in[NIN], *plain[NIN];
  nb_seed(7);
  for (int i = 0; i < BLOCKS; i++) {
    in[4 * i] = nb_glorot_uniform(NB_SHAPE(d, h), NB_F32);
    in[4 * i + 1] = nb_zeros(NB_SHAPE(h), NB_F32);
    in[4 * i + 2] = nb_glorot_uniform(NB_SHAPE(h, d), NB_F32);
    in[4 * i + 3] = nb_zeros(NB_SHAPE(d), NB_F32);
  }
  in[NP] = nb_randn(NB_SHAPE(n, d), NB_F32);
  in[NP + 1] = nb_tanh(in[NP]);
  for (int k = 0; k < NIN; k++)
    plain[k] = in[k];
  int tie[NOUT] = {-1};
  for (int i = 0; i < NP; i++)
    tie[1 + i] = i; /* updated parameters keep their layout */
  nb_shard_plan *plan = nb_auto_shard_plan(step, m, in, &(nb_auto_shard_opts){.out_like_in = tie});
  if (!plan) {
    fprintf(stderr, "nb_auto_shard_plan: %s\n", nb_last_error());
    return 1;
  }
  printf("== batch %lld, width %lld, hidden %lld on %s\n", (long long)n, (long long)d, (long long)h,
         axes);
  /* one step measured against the prediction */
  nb_tensor *o[NOUT];
  nb_reset_stats();
  if (nb_shard_plan_call(plan, in, o) != NB_OK) return 1;
  nb_stats st = nb_get_stats();
  nb_auto_shard_report(stdout, plan, &st);
  double l_plan[STEPS], l_plain[STEPS];
  if (train(step, plan, in, l_plan) || train(step, NULL, plain, l_plain)) {
    fprintf(stderr, "training: %s\n", nb_last_error());
    return 1;
  }
  double worst = 0;
  printf("step   unsharded   auto-sharded\n");
  for (int s = 0; s < STEPS; s++) {
    printf("%4d  %10.6f  %13.6f\n", s, l_plain[s], l_plan[s]);
    worst = fmax(worst, fabs(l_plain[s] - l_plan[s]) / fmax(1e-30, fabs(l_plain[s])));
  }
  printf("largest relative loss difference: %.2g\n\n", worst);
  nb_shard_plan_release(plan);
  nb_mesh_release(m);
  return worst < 1e-4 ? 0 : 1;
}

/* ---- a two-block transformer: a function of trees ----------------------------------------
 * The parameters are one nb_tree ("h.0.attn.w_q", ...: nb_block_init's trees
 * under "h.0" and "h.1"), the batch another ({"x", "y"}); the step is a
 * function of trees, planned by nb_auto_shard_plan_trees and run by
 * nb_shard_plan_call_trees, and specs are looked up by leaf name. */
enum { TL = 2 };
typedef struct tfm {
  nb_block_config c;
  nb_fn *vg; /* value and gradient of tf_loss with respect to the parameters */
} tfm;

/* in: params, batch -> {"loss"} */
static nb_status tf_loss(void *u, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  const tfm *t = u;
  nb_tensor *h = nb_tree_get(in[1], "x");
  for (int l = 0; l < TL; l++) {
    char prefix[16];
    snprintf(prefix, sizeof prefix, "h.%d", l);
    nb_tree *p = nb_tree_subtree(in[0], prefix);
    h = nb_block_apply(p, &t->c, h, NULL);
    nb_tree_release(p);
  }
  out[0] = nb_tree_create();
  return nb_tree_set(out[0], "loss", nb_mse(h, nb_tree_get(in[1], "y")));
}

/* in: params, batch -> {"loss"}, params after one SGD step (lr 0.05) */
static nb_status tf_step(void *u, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  const tfm *t = u;
  nb_tree *o[2];
  nb_status st = nb_call_trees(t->vg, in, o);
  if (st) return st;
  out[0] = o[0];
  out[1] = nb_tree_axpy(-0.05, o[1], in[0]);
  nb_tree_release(o[1]);
  return out[1] ? NB_OK : nb_last_status();
}

static int run_transformer(void) {
  tfm t = {.c = {.dim = 256, .n_heads = 4, .hidden = 1024, .bias = true}};
  nb_tensor *keys[TL];
  nb_key_split(nb_key(11), TL, keys);
  nb_tree *params = nb_tree_create(), *batch = nb_tree_create();
  for (int l = 0; l < TL; l++) {
    char prefix[16];
    snprintf(prefix, sizeof prefix, "h.%d", l);
    nb_tree *b = nb_block_init(keys[l], &t.c, NB_F64);
    if (!b || nb_tree_set_tree(params, prefix, b)) return 1;
    nb_tree_release(b);
  }
  nb_seed(3);
  nb_tensor *x = nb_randn(NB_SHAPE(1, 16, 256), NB_F64);
  nb_tree_set(batch, "x", x);
  nb_tree_set(batch, "y", nb_tanh(x));
  int n = nb_tree_len(params);
  /* out_like_in counts leaves: output leaf 0 is the loss, 1 + i the updated
   * parameter i, which keeps input leaf i's layout */
  int *tie = malloc(sizeof *tie * (size_t)(n + 1));
  tie[0] = -1;
  for (int i = 0; i < n; i++)
    tie[1 + i] = i;
  nb_fn *loss = nb_fn_create_trees(tf_loss, &t, 2, 1);
  t.vg = nb_value_and_grad(loss, NB_AXES(0));
  nb_fn *step = nb_fn_create_trees(tf_step, &t, 2, 2);
  nb_mesh *m = nb_mesh_cpu("tp=2");
  nb_shard_plan *plan = nb_auto_shard_plan_trees(step, m, (nb_tree *[]){params, batch},
                                                 &(nb_auto_shard_opts){.out_like_in = tie});
  free(tie);
  if (!plan) {
    fprintf(stderr, "nb_auto_shard_plan_trees: %s\n", nb_last_error());
    return 1;
  }
  printf("== two transformer blocks (width 256, 4 heads, MLP 1024, sequence 16) on tp=2\n");
  printf("block 0's parameters:");
  for (int i = 0, first = 1; i < n; i++) {
    const char *name = nb_tree_name(params, i);
    if (!strncmp(name, "h.0.", 4))
      printf("%s %s %s", first ? "" : ",", name + 4, nb_shard_plan_in_leaf_spec(plan, 0, name));
    first &= strncmp(name, "h.0.", 4) != 0;
  }
  printf("\n");
  nb_tree *o[2];
  nb_reset_stats();
  if (nb_shard_plan_call_trees(plan, (nb_tree *[]){params, batch}, o) != NB_OK) return 1;
  nb_stats st = nb_get_stats();
  nb_auto_shard_report(stdout, plan, &st);
  nb_tree_release(o[0]), nb_tree_release(o[1]);
  double worst = 0;
  nb_tree *pa = nb_tree_retain(params), *pb = nb_tree_retain(params);
  printf("step   unsharded   auto-sharded\n");
  for (int s = 0; s < STEPS; s++) {
    nb_tree *a[2], *b[2];
    if (nb_shard_plan_call_trees(plan, (nb_tree *[]){pa, batch}, a) != NB_OK ||
        nb_call_trees(step, (nb_tree *[]){pb, batch}, b) != NB_OK) {
      fprintf(stderr, "training: %s\n", nb_last_error());
      return 1;
    }
    double la = nb_item(nb_tree_get(a[0], "loss")), lb = nb_item(nb_tree_get(b[0], "loss"));
    printf("%4d  %10.6f  %13.6f\n", s, lb, la);
    worst = fmax(worst, fabs(la - lb) / fmax(1e-30, fabs(lb)));
    nb_tree_release(pa), nb_tree_release(pb), nb_tree_release(a[0]), nb_tree_release(b[0]);
    pa = a[1], pb = b[1];
  }
  printf("largest relative loss difference: %.2g\n\n", worst);
  nb_tree_release(pa), nb_tree_release(pb);
  nb_shard_plan_release(plan);
  nb_mesh_release(m);
  nb_fn_release(step);
  nb_fn_release(t.vg);
  nb_fn_release(loss);
  nb_tree_release(params), nb_tree_release(batch);
  return worst < 1e-4 ? 0 : 1;
}

int main(void) {
  nb_fn *loss = nb_fn_create(loss_fn, NULL, NIN, 1);
  nb_axes params = {.n = NP};
  for (int i = 0; i < NP; i++)
    params.v[i] = i;
  nb_fn *vg = nb_value_and_grad(loss, params);
  nb_fn *step = nb_fn_create(step_fn, vg, NIN, NOUT);
  int bad = run("tp=4", 8, 64, 2048, step) || run("dp=4", 4096, 32, 32, step) || run_transformer();
  nb_fn_release(step);
  nb_fn_release(vg);
  nb_fn_release(loss);
  return bad;
}
