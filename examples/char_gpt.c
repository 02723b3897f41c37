/* examples/char_gpt.c — a 2-layer character-level GPT trained on a text file.
 *
 * The model is nb_gpt (include/nabla/nn.h): token and position embeddings, two
 * pre-LayerNorm blocks of causal self-attention and a tanh-GELU MLP, a final
 * layer norm and an output projection, all in one parameter tree. One
 * training step is a jitted nb_value_and_grad of a function of trees (the
 * parameters; the batch with its integer tokens and a dropout key), then
 * AdamW with global-norm clipping and a linear-warmup + cosine learning rate
 * (include/nabla/optim.h). Half-way the whole training state (parameters,
 * optimizer state, step, key) goes to a checkpoint (nb_save_checkpoint, a
 * safetensors file), the run takes one more step, then drops everything,
 * loads the checkpoint (nb_load_checkpoint) and takes that step again: the
 * loss must be the same, bit for bit, and training goes on from the file.
 * At the end it samples text with nb_categorical.
 *
 *   char_gpt [--steps N] [--threads N] [TEXT]
 * TEXT defaults to /usr/share/common-licenses/GPL-3 (on every Debian system).
 * The default 60 steps take a few seconds (make demo); 2000 steps write
 * recognisable words. Exits 1 unless the loss fell and the resumed step
 * repeated the uninterrupted one. */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { BATCH = 16, CONTEXT = 32, SAMPLE_LEN = 240 };

static const nb_gpt_config CONFIG = {
    .context = CONTEXT,
    .n_layers = 2,
    .block = {.dim = 64, .n_heads = 4, .bias = true, .dropout = 0.1},
};

/* ---- data: the file's bytes as tokens ----------------------------------------------------------
 */
typedef struct text {
  int32_t *tokens; /* one per byte, an index into chars */
  int64_t n;
  char chars[256]; /* the distinct bytes, sorted */
  int vocab;
} text;

static int read_text(const char *path, text *t) {
  FILE *f = fopen(path, "rb");
  if (!f) return fprintf(stderr, "char_gpt: cannot open %s (pass a text file)\n", path), 1;
  unsigned char *buf = malloc(1 << 24);
  size_t n = buf ? fread(buf, 1, 1 << 24, f) : 0;
  fclose(f);
  if (n < 2 * CONTEXT) return fprintf(stderr, "char_gpt: %s is too short\n", path), free(buf), 1;
  int index[256] = {0};
  for (size_t i = 0; i < n; i++)
    index[buf[i]] = 1;
  t->vocab = 0;
  for (int c = 0; c < 256; c++)
    if (index[c]) t->chars[t->vocab] = (char)c, index[c] = t->vocab++;
  t->tokens = malloc(sizeof *t->tokens * n);
  for (size_t i = 0; i < n; i++)
    t->tokens[i] = index[buf[i]];
  t->n = (int64_t)n;
  free(buf);
  return 0;
}

/* A batch: BATCH windows at offsets from a 64-bit LCG; "y" is "x" shifted by one. */
static uint64_t lcg_next(uint64_t s) { return s * 6364136223846793005ull + 1442695040888963407ull; }
static nb_tree *batch_at(const text *t, uint64_t *lcg, nb_tensor *key) {
  int32_t x[BATCH][CONTEXT], y[BATCH][CONTEXT];
  for (int b = 0; b < BATCH; b++) {
    *lcg = lcg_next(*lcg);
    int64_t at = (int64_t)((*lcg >> 33) % (uint64_t)(t->n - CONTEXT - 1));
    for (int i = 0; i < CONTEXT; i++)
      x[b][i] = t->tokens[at + i], y[b][i] = t->tokens[at + i + 1];
  }
  nb_tree *batch = nb_tree_create();
  nb_tree_set(batch, "x", nb_from_data(x, NB_SHAPE(BATCH, CONTEXT), NB_I32));
  nb_tree_set(batch, "y", nb_from_data(y, NB_SHAPE(BATCH, CONTEXT), NB_I32));
  nb_tree_set(batch, "key", key);
  return batch;
}

/* ---- the loss: a function of trees -------------------------------------------------------------
 */
/* in: params, batch {"x", "y", "key"} -> {"loss"} */
static nb_status loss_fn(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *logits = nb_gpt_apply(in[0], user, nb_tree_get(in[1], "x"), nb_tree_get(in[1], "key"));
  nb_tensor *loss = nb_cross_entropy(logits, nb_tree_get(in[1], "y"));
  if (!loss) return nb_last_status();
  out[0] = nb_tree_create();
  return nb_tree_set(out[0], "loss", loss);
}

/* The LCG's state before step `step`: the batch stream is a function of the
 * step, so a checkpoint (which holds the step) needs no more to resume it. */
static uint64_t lcg_at(int64_t step) {
  uint64_t s = 42;
  for (int64_t i = 0; i < step * BATCH; i++)
    s = lcg_next(s);
  return s;
}

/* One training step: a new dropout key split from *key (which moves on), the
 * batch, the jitted loss and gradients, the update of params and state in
 * place. The loss, or a negative number after printing the error. */
static double train_step(nb_fn *step_fn, nb_optim *opt, nb_tree *params, nb_tree *state,
                         nb_tensor **key, const text *t, uint64_t *lcg, int step) {
  nb_scope_begin();
  nb_tensor *k[2];
  nb_key_split(*key, 2, k); /* k[0] the next step's key, k[1] this step's dropout */
  nb_release(*key);
  *key = nb_retain(k[0]);
  nb_eval(key, 1); /* a value, not a chain of splits */
  nb_tree *batch = batch_at(t, lcg, k[1]), *out[2] = {NULL, NULL};
  double loss = -1;
  if (nb_call_trees(step_fn, (nb_tree *[]){params, batch}, out) ||
      nb_optim_step(opt, params, out[1], state))
    fprintf(stderr, "char_gpt: step %d: %s\n", step, nb_last_error());
  else
    loss = nb_item(nb_tree_get(out[0], "loss"));
  nb_tree_release(out[0]), nb_tree_release(out[1]), nb_tree_release(batch);
  nb_scope_end();
  return loss;
}

/* ---- sampling
 * ------------------------------------------------------------------------------------ */
/* SAMPLE_LEN characters from the model, starting at the text's first; key is consumed. */
static void sample(const nb_tree *params, const nb_gpt_config *c, const text *t, nb_tensor *key) {
  int32_t ctx[SAMPLE_LEN + 1] = {t->tokens[0]};
  int n = 1;
  printf("---- sample\n%c", t->chars[ctx[0]]);
  for (; n <= SAMPLE_LEN - 1; n++) {
    nb_scope_begin();
    int start = n > CONTEXT ? n - CONTEXT : 0, len = n - start;
    nb_tensor *idx = nb_from_data(ctx + start, NB_SHAPE(1, len), NB_I32), *k[2];
    nb_tensor *logits = nb_gpt_apply(params, c, idx, NULL); /* [1, len, vocab] */
    int64_t lo[3] = {0, len - 1, 0}, hi[3] = {1, len, NB_END};
    nb_key_split(key, 2, k);
    nb_release(key);
    key = nb_retain(k[0]);
    nb_eval(&key, 1);
    /* temperature 0.8: sharper than the model's own distribution */
    nb_tensor *next = nb_categorical(k[1], nb_div_scalar(nb_slice(logits, lo, hi, NULL), 0.8), -1);
    ctx[n] = (int32_t)nb_item(next);
    nb_scope_end();
    putchar(t->chars[ctx[n]]);
  }
  printf("\n----\n");
  nb_release(key);
}

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  const char *path = "/usr/share/common-licenses/GPL-3";
  int steps = 60;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      nb_set_num_threads(atoi(argv[++i]));
    else
      path = argv[i];
  }
  text t;
  if (steps < 2 || read_text(path, &t)) return 1;
  nb_gpt_config c = CONFIG;
  c.vocab = t.vocab;
  printf("char_gpt: %s, %lld characters, %d distinct; %d steps of %d x %d tokens\n", path,
         (long long)t.n, t.vocab, steps, BATCH, CONTEXT);

  nb_tensor *key = nb_retain(nb_key(1337)), *k[2];
  nb_key_split(key, 2, k);
  nb_tree *params = nb_gpt_init(k[0], &c, NB_F32);
  nb_release(key);
  key = nb_retain(k[1]);
  if (!params) return fprintf(stderr, "char_gpt: %s\n", nb_last_error()), 1;
  printf("model: %lld parameters in %d tensors\n", (long long)nb_tree_numel(params),
         nb_tree_len(params));

  nb_fn *loss = nb_fn_create_trees(loss_fn, &c, 2, 1);
  nb_fn *vg = nb_value_and_grad(loss, NB_AXES(0)); /* -> {"loss"}, grads */
  nb_fn *step_fn = nb_jit(vg);
  nb_fn_release(vg), nb_fn_release(loss);

  nb_optim *parts[2] = {nb_clip_by_global_norm(1.0), nb_adamw(3e-3, 0.9, 0.95, 1e-8, 0.1)};
  nb_optim *opt = nb_optim_chain(parts, 2);
  nb_optim_release(parts[0]), nb_optim_release(parts[1]);
  nb_schedule *lr = nb_schedule_warmup_cosine(0, 3e-3, steps / 10, steps, 3e-4);
  nb_optim_set_schedule(opt, lr);
  nb_optim_set_decay_mask(opt, nb_decay_matrices, NULL); /* no decay on biases and norms */
  nb_tree *state = nb_optim_init(opt, params);

  char ckpt[512];
  snprintf(ckpt, sizeof ckpt, "%s/char_gpt_%d.safetensors",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)(seconds() * 1000) % 100000);
  uint64_t lcg = lcg_at(0);
  double first = 0, last = 0, t0 = seconds(), tokens = 0;
  for (int step = 0; step < steps; step++) {
    if (step == steps / 2) {
      /* save everything, take this step as a run that never stopped would, drop it all,
       * load the file and take the step again: the same loss, bit for bit */
      if (nb_save_checkpoint(ckpt, params, state, step, key))
        return fprintf(stderr, "char_gpt: %s\n", nb_last_error()), 1;
      double want = train_step(step_fn, opt, params, state, &key, &t, &lcg, step);
      nb_tree_release(params), nb_tree_release(state), nb_release(key);
      int64_t at;
      nb_status st = nb_load_checkpoint(ckpt, &params, &state, &at, &key);
      remove(ckpt); /* the loaded tensors keep their memory map */
      if (st) return fprintf(stderr, "char_gpt: %s\n", nb_last_error()), 1;
      key = nb_retain(key);
      step = (int)at;
      lcg = lcg_at(at);
      double got = train_step(step_fn, opt, params, state, &key, &t, &lcg, step);
      printf("step %4d | checkpoint %s saved and loaded: loss %.6f, uninterrupted %.6f\n", step,
             ckpt, got, want);
      if (want < 0 || got != want)
        return fprintf(stderr, "char_gpt: the resumed step differs from the uninterrupted one\n"),
               1;
      tokens += BATCH * CONTEXT;
      last = got;
      continue;
    }
    last = train_step(step_fn, opt, params, state, &key, &t, &lcg, step);
    if (last < 0) return 1;
    tokens += BATCH * CONTEXT;
    if (step == 0) first = last;
    if (step % 10 == 0 || step == steps - 1)
      printf("step %4d | loss %.4f | lr %.2e | %.0f tokens/s\n", step, last,
             nb_schedule_value(lr, step), tokens / (seconds() - t0));
  }
  sample(params, &c, &t, key);
  key = NULL;
  printf("loss %.4f -> %.4f\n", first, last);

  nb_schedule_release(lr);
  nb_tree_release(state);
  nb_optim_release(opt);
  nb_fn_release(step_fn);
  nb_tree_release(params);
  nb_release(key);
  free(t.tokens);
  return !(last < first) || nb_last_status() != NB_OK;
}
