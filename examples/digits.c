/* examples/digits.c — handwritten digits: an MLP classifier on a classic dataset.
 *
 * The data is the UCI "optical recognition of handwritten digits" set as
 * scikit-learn ships it in Debian's python3-sklearn package
 * (sklearn/datasets/data/digits.csv.gz): 1797 images of 8x8 pixels, values 0-16,
 * each row 64 pixels then the label 0-9. `scripts/deps.sh digits DIR` finds the
 * file, or fetches that one package file (no install) into DIR; `make demo`
 * passes its path.
 *
 * The model is nb_mlp (include/nabla/nn.h) 64 -> 128 -> 10 with ReLU, trained
 * on 1500 images (a seeded shuffle of the file) with cross-entropy, AdamW and a cosine learning
 * rate: one jitted nb_value_and_grad of a function of trees per step of 50
 * images, each epoch reshuffled. The other 297 images are
 * the test set: accuracy is argmax(logits) == label averaged, in one graph.
 *
 *   digits [--epochs N] [FILE]      FILE: digits.csv.gz or an unpacked .csv
 *
 * Exits 1 unless the test accuracy reaches 90% (about 97% after the default 20
 * epochs, a second or two). */
#define _POSIX_C_SOURCE 200809L /* popen */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_IMAGES = 1797, N_TRAIN = 1500, PIXELS = 64, CLASSES = 10, BATCH = 50 };

static const char *const DEFAULT_PATH = "/usr/lib/python3/dist-packages/sklearn/datasets/data/"
                                        "digits.csv.gz";

/* ---- data ------------------------------------------------------------------------------------ */
typedef struct digits {
  float x[N_IMAGES][PIXELS]; /* pixels / 16: in [0, 1] */
  int32_t y[N_IMAGES];
} digits;

/* Reads N_IMAGES rows of 65 integers (gzip-compressed when the name ends in .gz). */
static int read_digits(const char *path, digits *d) {
  size_t len = strlen(path);
  bool gz = len > 3 && !strcmp(path + len - 3, ".gz");
  FILE *f;
  if (gz) {
    if (strchr(path, '\'')) return fprintf(stderr, "digits: a quote in %s\n", path), 1;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    f = popen(cmd, "r");
  } else {
    f = fopen(path, "r");
  }
  if (!f) return fprintf(stderr, "digits: cannot open %s\n", path), 1;
  bool ok = true;
  for (int r = 0; r < N_IMAGES && ok; r++)
    for (int j = 0; j <= PIXELS && ok; j++) {
      int v;
      ok = fscanf(f, " %d ,", &v) == 1 && v >= 0 && v <= 16 && (j < PIXELS || v < CLASSES);
      if (ok && j < PIXELS)
        d->x[r][j] = (float)v / 16.0f;
      else if (ok)
        d->y[r] = v;
    }
  if (gz)
    pclose(f);
  else
    fclose(f);
  if (!ok)
    return fprintf(stderr, "digits: %s: expected %d rows of 64 pixels and a label 0-9\n", path,
                   N_IMAGES),
           1;
  return 0;
}

/* A tree {"x" [n, 64] f32, "y" [n] i32} of the images order[0..n). */
static nb_tree *batch_of(const digits *d, const int *order, int n) {
  float(*x)[PIXELS] = malloc(sizeof *x * (size_t)n);
  int32_t *y = malloc(sizeof *y * (size_t)n);
  for (int i = 0; i < n; i++) {
    memcpy(x[i], d->x[order[i]], sizeof x[i]);
    y[i] = d->y[order[i]];
  }
  nb_tree *b = nb_tree_create();
  nb_tree_set(b, "x", nb_from_data(x, NB_SHAPE(n, PIXELS), NB_F32));
  nb_tree_set(b, "y", nb_from_data(y, NB_SHAPE(n), NB_I32));
  free(x), free(y);
  return b;
}

/* in: params, batch {"x", "y"} -> {"loss"} */
static nb_status loss_fn(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *logits = nb_mlp_apply(in[0], nb_tree_get(in[1], "x"), nb_relu);
  nb_tensor *loss = nb_cross_entropy(logits, nb_tree_get(in[1], "y"));
  if (!loss) return nb_last_status();
  out[0] = nb_tree_create();
  return nb_tree_set(out[0], "loss", loss);
}

/* The share of the batch's images whose largest logit is their label. */
static double accuracy(const nb_tree *params, const nb_tree *batch) {
  nb_scope_begin();
  nb_tensor *logits = nb_mlp_apply(params, nb_tree_get(batch, "x"), nb_relu);
  nb_tensor *hit = nb_eq(nb_argmax(logits, -1, false), nb_cast(nb_tree_get(batch, "y"), NB_I64));
  double acc = nb_item(nb_mean(nb_cast(hit, NB_F32), NB_ALL, false));
  nb_scope_end();
  return acc;
}

/* Fisher-Yates over order[0..n) from a 64-bit LCG. */
static void shuffle(int *order, int n, uint64_t *lcg) {
  for (int i = n - 1; i > 0; i--) {
    *lcg = *lcg * 6364136223846793005ull + 1442695040888963407ull;
    int j = (int)((*lcg >> 33) % (uint64_t)(i + 1)), t = order[i];
    order[i] = order[j], order[j] = t;
  }
}

int main(int argc, char **argv) {
  const char *path = DEFAULT_PATH;
  int epochs = 20;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--epochs") && i + 1 < argc)
      epochs = atoi(argv[++i]);
    else
      path = argv[i];
  }
  static digits d;
  if (epochs < 1 || read_digits(path, &d)) {
    fprintf(stderr, "digits: get the data with `sh scripts/deps.sh digits build/data` "
                    "(prints the file's path) or `apt-get install python3-sklearn`\n");
    return 1;
  }
  int order[N_IMAGES];
  for (int i = 0; i < N_IMAGES; i++)
    order[i] = i;
  uint64_t lcg = 2024;
  shuffle(order, N_IMAGES, &lcg); /* a seeded split: the file is ordered by writer */
  nb_tree *test = batch_of(&d, order + N_TRAIN, N_IMAGES - N_TRAIN);

  int64_t widths[] = {PIXELS, 128, CLASSES};
  nb_tree *params = nb_mlp_init(nb_key(7), widths, 2, true, NB_F32);
  if (!params) return fprintf(stderr, "digits: %s\n", nb_last_error()), 1;
  nb_fn *loss = nb_fn_create_trees(loss_fn, NULL, 2, 1);
  nb_fn *vg = nb_value_and_grad(loss, NB_AXES(0)); /* -> {"loss"}, grads */
  nb_fn *step_fn = nb_jit(vg);
  nb_fn_release(vg), nb_fn_release(loss);

  int steps_per_epoch = N_TRAIN / BATCH, steps = epochs * steps_per_epoch;
  nb_optim *opt = nb_adamw(1e-2, 0.9, 0.999, 1e-8, 1e-4);
  nb_schedule *lr = nb_schedule_warmup_cosine(0, 1e-2, steps_per_epoch, steps, 1e-4);
  nb_optim_set_schedule(opt, lr);
  nb_tree *state = nb_optim_init(opt, params);
  printf("digits: %s: %d training and %d test images; %d epochs of %d steps of %d\n", path, N_TRAIN,
         N_IMAGES - N_TRAIN, epochs, steps_per_epoch, BATCH);
  printf("before training: test accuracy %.1f%%\n", 100 * accuracy(params, test));

  double acc = 0;
  for (int e = 0; e < epochs; e++) {
    shuffle(order, N_TRAIN, &lcg); /* the training images only */
    double sum = 0;
    for (int s = 0; s < steps_per_epoch; s++) {
      nb_scope_begin();
      nb_tree *batch = batch_of(&d, order + s * BATCH, BATCH), *out[2] = {NULL, NULL};
      nb_status st = nb_call_trees(step_fn, (nb_tree *[]){params, batch}, out);
      if (!st) st = nb_optim_step(opt, params, out[1], state);
      if (!st) sum += nb_item(nb_tree_get(out[0], "loss"));
      nb_tree_release(out[0]), nb_tree_release(out[1]), nb_tree_release(batch);
      nb_scope_end();
      if (st) return fprintf(stderr, "digits: %s\n", nb_last_error()), 1;
    }
    acc = accuracy(params, test);
    if (e % 5 == 4 || e == epochs - 1 || e == 0)
      printf("epoch %3d | train loss %.4f | test accuracy %.1f%%\n", e + 1, sum / steps_per_epoch,
             100 * acc);
  }

  nb_schedule_release(lr);
  nb_tree_release(state);
  nb_optim_release(opt);
  nb_fn_release(step_fn);
  nb_tree_release(params);
  nb_tree_release(test);
  if (acc < 0.9) return fprintf(stderr, "digits: test accuracy below 90%%\n"), 1;
  return nb_last_status() != NB_OK;
}
