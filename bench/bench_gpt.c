/* bench/bench_gpt.c — one training step of a small char-level GPT (nb_gpt of
 * include/nabla/nn.h: vocabulary 65, context 64, width 128, 2 layers, 4 heads,
 * batch 16, dropout off, f32): the jitted nb_value_and_grad of
 * examples/char_gpt.c plus clipping + AdamW (nb_optim_step), the loss read
 * every step. Runs on 1 then 2 threads in one process; bench/peers/torch_gpt.py
 * is the same step in PyTorch (`make bench-gpt` runs both in one go). One
 * JSON line per thread count; --smoke: 2 steps, one thread (a build check). */
#include <stdio.h>
#include <string.h>

#include "bench_common.h"

enum { VOCAB = 65, CONTEXT = 64, BATCH = 16, WARMUP = 5, STEPS = 30 };

static const nb_gpt_config CFG = {.vocab = VOCAB,
                                  .context = CONTEXT,
                                  .n_layers = 2,
                                  .block = {.dim = 128, .n_heads = 4, .bias = true}};

static nb_status loss_fn(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *logits = nb_gpt_apply(in[0], user, nb_tree_get(in[1], "x"), NULL);
  nb_tensor *loss = nb_cross_entropy(logits, nb_tree_get(in[1], "y"));
  if (!loss) return nb_last_status();
  out[0] = nb_tree_create();
  return nb_tree_set(out[0], "loss", loss);
}

/* Median seconds per step over `steps` steps after `warmup`; *loss the last loss. */
static double run(int threads, int warmup, int steps, double *loss) {
  nb_set_num_threads(threads);
  nb_tree *params = nb_gpt_init(nb_key(0), &CFG, NB_F32);
  nb_fn *f = nb_fn_create_trees(loss_fn, (void *)&CFG, 2, 1);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0)), *step = nb_jit(vg);
  nb_optim *parts[2] = {nb_clip_by_global_norm(1.0), nb_adamw(1e-3, 0.9, 0.95, 1e-8, 0.1)};
  nb_optim *opt = nb_optim_chain(parts, 2);
  nb_optim_set_decay_mask(opt, nb_decay_matrices, NULL);
  nb_tree *state = nb_optim_init(opt, params);
  uint64_t lcg = 1;
  int32_t x[BATCH * CONTEXT], y[BATCH * CONTEXT];
  double *t = malloc(sizeof *t * (size_t)steps);
  for (int i = -warmup; i < steps; i++) {
    for (int k = 0; k < BATCH * CONTEXT;
         k++) { /* random tokens: the cost does not depend on them */
      lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
      x[k] = (int32_t)((lcg >> 33) % VOCAB), y[k] = (int32_t)((lcg >> 40) % VOCAB);
    }
    double t0 = now_s();
    nb_scope_begin();
    nb_tree *batch = nb_tree_create(), *out[2];
    nb_tree_set(batch, "x", nb_from_data(x, NB_SHAPE(BATCH, CONTEXT), NB_I32));
    nb_tree_set(batch, "y", nb_from_data(y, NB_SHAPE(BATCH, CONTEXT), NB_I32));
    if (nb_call_trees(step, (nb_tree *[]){params, batch}, out) ||
        nb_optim_step(opt, params, out[1], state)) {
      fprintf(stderr, "bench_gpt: %s\n", nb_last_error());
      exit(1);
    }
    *loss = nb_item(nb_tree_get(out[0], "loss"));
    nb_tree_release(out[0]), nb_tree_release(out[1]), nb_tree_release(batch);
    nb_scope_end();
    if (i >= 0) t[i] = now_s() - t0;
  }
  double m = median(t, steps);
  free(t);
  nb_tree_release(state);
  nb_optim_release(parts[0]), nb_optim_release(parts[1]), nb_optim_release(opt);
  nb_fn_release(step), nb_fn_release(vg), nb_fn_release(f);
  nb_tree_release(params);
  return m;
}

int main(int argc, char **argv) {
  bool smoke = argc > 1 && !strcmp(argv[1], "--smoke");
  for (int threads = 1; threads <= (smoke ? 1 : 2); threads++) {
    double loss = 0, s = smoke ? run(1, 0, 2, &loss) : run(threads, WARMUP, STEPS, &loss);
    printf("{\"case\":\"gpt_char_step\",\"impl\":\"nabla\",\"threads\":%d,\"steps\":%d,"
           "\"median_s\":%.6f,\"tokens_per_s\":%.0f,\"final_loss\":%.4f}\n",
           threads, smoke ? 2 : STEPS, s, BATCH * CONTEXT / s, loss);
  }
  return 0;
}
