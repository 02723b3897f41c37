/* examples/trees.c — a classifier trained with parameter trees and an optimizer.
 *
 * Three interleaved spirals (600 points in 2-D, integer labels 0..2), an MLP
 * 2-64-64-3 held in one tree ("l0.w", "l0.b", ...), its batch in another tree
 * (float "x", i64 "labels": an integer leaf is passed through, never
 * differentiated). The loss is a function of trees; nb_jit(nb_value_and_grad)
 * gives the loss and a gradient tree shaped like the parameters; AdamW with
 * clipping and a warmup-cosine schedule updates every tensor in one fused pass
 * (nb_optim_step). Prints the loss and the accuracy every 200 steps. */
#include <math.h>
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>

enum { N_POINTS = 600, N_CLASSES = 3, HIDDEN = 64, STEPS = 1000 };
static const int64_t WIDTH[4] = {2, HIDDEN, HIDDEN, N_CLASSES};

static nb_tree *init_params(void) {
  nb_seed(1);
  nb_tree *p = nb_tree_create();
  char name[16];
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "l%d.w", i);
    nb_tree_set(p, name, nb_glorot_uniform(NB_SHAPE(WIDTH[i], WIDTH[i + 1]), NB_F32));
    snprintf(name, sizeof name, "l%d.b", i);
    nb_tree_set(p, name, nb_zeros(NB_SHAPE(WIDTH[i + 1]), NB_F32));
  }
  return p;
}

static nb_tree *spirals(void) {
  float x[N_POINTS][2];
  int64_t labels[N_POINTS];
  for (int i = 0; i < N_POINTS; i++) {
    int c = i % N_CLASSES;
    double r = (double)(i / N_CLASSES) / (N_POINTS / N_CLASSES);
    double a = 4.0 * r + 2.0 * M_PI * c / N_CLASSES + 0.15 * sin(37.0 * i);
    x[i][0] = (float)(r * cos(a)), x[i][1] = (float)(r * sin(a));
    labels[i] = c;
  }
  nb_tree *b = nb_tree_create();
  nb_tree_set(b, "x", nb_from_data(x, NB_SHAPE(N_POINTS, 2), NB_F32));
  nb_tree_set(b, "labels", nb_from_data(labels, NB_SHAPE(N_POINTS), NB_I64));
  return b;
}

static nb_tensor *logits_of(const nb_tree *p, nb_tensor *x) {
  char w[16], b[16];
  for (int i = 0; i < 3; i++) {
    snprintf(w, sizeof w, "l%d.w", i);
    snprintf(b, sizeof b, "l%d.b", i);
    x = nb_add(nb_matmul(x, nb_tree_get(p, w)), nb_tree_get(p, b));
    if (i < 2) x = nb_tanh(x);
  }
  return x;
}

/* in: params, batch -> out[0]: {"loss"}, out[1]: {"logits"} */
static nb_status loss_fn(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)user, (void)n_in, (void)n_out;
  nb_tensor *logits = logits_of(in[0], nb_tree_get(in[1], "x"));
  nb_tensor *loss = nb_cross_entropy(logits, nb_tree_get(in[1], "labels"));
  if (!loss) return nb_last_status();
  out[0] = nb_tree_create();
  out[1] = nb_tree_create();
  nb_tree_set(out[0], "loss", loss);
  return nb_tree_set(out[1], "logits", logits);
}

int main(void) {
  nb_tree *params = init_params(), *batch = spirals();
  nb_fn *loss = nb_fn_create_trees(loss_fn, NULL, 2, 2);
  nb_fn *vg = nb_value_and_grad(loss, NB_AXES(0)); /* (loss, logits, grads) */
  nb_fn *step_fn = nb_jit(vg);
  nb_fn_release(vg);
  nb_fn_release(loss);

  nb_optim *parts[2] = {nb_clip_by_global_norm(1.0), nb_adamw(1e-2, 0.9, 0.99, 1e-8, 1e-4)};
  nb_optim *opt = nb_optim_chain(parts, 2);
  nb_optim_release(parts[0]);
  nb_optim_release(parts[1]);
  nb_schedule *lr = nb_schedule_warmup_cosine(0, 1e-2, 50, STEPS, 1e-3);
  nb_optim_set_schedule(opt, lr);
  nb_schedule_release(lr);
  nb_optim_set_decay_mask(opt, nb_decay_matrices, NULL); /* no decay on biases */
  nb_tree *state = nb_optim_init(opt, params);

  for (int step = 0; step <= STEPS; step++) {
    nb_scope_begin();
    nb_tree *in[2] = {params, batch}, *out[3];
    if (nb_call_trees(step_fn, in, out) || nb_optim_step(opt, params, out[2], state)) {
      fprintf(stderr, "step %d: %s\n", step, nb_last_error());
      return 1;
    }
    if (step % 200 == 0) {
      nb_tensor *pred = nb_argmax(nb_tree_get(out[1], "logits"), -1, false);
      nb_tensor *hit = nb_eq(pred, nb_tree_get(batch, "labels"));
      double acc = nb_item(nb_mean(nb_cast(hit, NB_F32), NB_ALL, false));
      printf("step %4d  loss %.4f  accuracy %.3f\n", step, nb_item(nb_tree_get(out[0], "loss")),
             acc);
    }
    for (int k = 0; k < 3; k++)
      nb_tree_release(out[k]);
    nb_scope_end();
  }
  nb_tree_release(state);
  nb_optim_release(opt);
  nb_fn_release(step_fn);
  nb_tree_release(batch);
  nb_tree_release(params);
  return nb_last_status() != NB_OK;
}
