/* bench/bench_train.c — training steps with nabla, the same as bench/peers/'s PyTorch and
 * JAX scripts time (f32, glorot-uniform weights, zero biases, layer-norm gains one):
 *   mlp_784_1024_1024_10_step  784-1024-1024-10, batch 256, relu, softmax cross-entropy
 *                              with integer labels, SGD lr 0.01
 *   transformer_block_fwd_bwd  d_model 256, 4 heads, seq 128, batch 8: pre-LN attention
 *                              and a 4x GELU MLP with residuals; loss = mean of the
 *                              output; forward and all 16 parameter gradients, no update
 *   readme_mlp_step            the README MLP, jitted style only (bench_mlp has the others)
 * Styles:
 *   functional   nb_call of nb_value_and_grad (the transformer: argnums NB_ALL, its 16
 *                parameters), then nb_assign updates (MLPs) or nb_eval of every
 *                gradient (transformer)
 *   jit          the whole step under nb_jit, as the JAX peer jits it: for the MLPs an
 *                nb_fn returning the loss and the updated parameters (value_and_grad,
 *                then p - lr * g), whose outputs nb_assign rebinds; for the transformer
 *                nb_jit of value_and_grad
 *   imperative   forward, nb_backward, then nb_assign + nb_zero_grad per parameter
 * Each step is one scope and reads the loss (nb_item). Reported: median step time over
 * STEPS steps after WARMUP (the steps the peer scripts use), one JSON line per case and
 * style, then a table.
 *
 *   bench_train           full run
 *   bench_train --smoke   one step per case and style (build check)
 *   bench_train [--case NAME] [--style NAME] [--steps N]
 *                         only that case / style, N timed steps (for profiling) */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

#define LR 0.01
#define MAX_IN 20
enum { FUNCTIONAL = 1, JIT = 2, IMPERATIVE = 4 };
static const char *const style_names[3] = {"functional", "jit", "imperative"};

typedef struct train_case {
  const char *name;
  int n_params, n_data; /* in = params, then data */
  void (*init)(nb_tensor **in);
  nb_fn_body loss; /* in -> loss (a 0-d f32) */
  bool update;     /* SGD step (true) or gradients only */
  int warmup, steps, styles;
} train_case;

/* ---- 784-1024-1024-10 MLP, batch 256 ----------------------------------------------- */
static void mlp784_init(nb_tensor **in) {
  static const int64_t sz[4] = {784, 1024, 1024, 10};
  for (int i = 0; i < 3; i++) {
    in[2 * i] = nb_glorot_uniform(NB_SHAPE(sz[i], sz[i + 1]), NB_F32);
    in[2 * i + 1] = nb_zeros(NB_SHAPE(sz[i + 1]), NB_F32);
  }
  in[6] = nb_rand(NB_SHAPE(256, 784), NB_F32);
  int32_t labels[256];
  uint32_t s = 12345;
  for (int i = 0; i < 256; i++)
    s = s * 1664525u + 1013904223u, labels[i] = (int32_t)((s >> 16) % 10);
  in[7] = nb_from_data(labels, NB_SHAPE(256), NB_I32);
}

static nb_status mlp784_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = in[6];
  for (int i = 0; i < 3; i++) {
    h = nb_add(nb_matmul(h, in[2 * i]), in[2 * i + 1]);
    if (i < 2) h = nb_relu(h);
  }
  out[0] = nb_cross_entropy(h, in[7]);
  return out[0] ? NB_OK : nb_last_status();
}

/* ---- transformer block ---------------------------------------------------------------- */
enum { D = 256, HEADS = 4, SEQ = 128, BATCH = 8, HIDDEN = 1024 };
/* The block's input: captured by the loss body (not differentiated). */
static nb_tensor *block_x;

/* in: g1 b1 wq bq wk bk wv bv wo bo g2 b2 w1 c1 w2 c2 */
static void block_init(nb_tensor **in) {
  int k = 0;
  in[k++] = nb_ones(NB_SHAPE(D), NB_F32), in[k++] = nb_zeros(NB_SHAPE(D), NB_F32);
  for (int i = 0; i < 4; i++)
    in[k++] = nb_glorot_uniform(NB_SHAPE(D, D), NB_F32), in[k++] = nb_zeros(NB_SHAPE(D), NB_F32);
  in[k++] = nb_ones(NB_SHAPE(D), NB_F32), in[k++] = nb_zeros(NB_SHAPE(D), NB_F32);
  in[k++] = nb_glorot_uniform(NB_SHAPE(D, HIDDEN), NB_F32);
  in[k++] = nb_zeros(NB_SHAPE(HIDDEN), NB_F32);
  in[k++] = nb_glorot_uniform(NB_SHAPE(HIDDEN, D), NB_F32);
  in[k++] = nb_zeros(NB_SHAPE(D), NB_F32);
  if (!block_x) block_x = nb_retain(nb_randn(NB_SHAPE(BATCH * SEQ, D), NB_F32));
}

static nb_tensor *linear(nb_tensor *h, nb_tensor *w, nb_tensor *b) {
  return nb_add(nb_matmul(h, w), b);
}

/* [B*S, D] -> [B, H, S, D/H] */
static nb_tensor *heads(nb_tensor *t) {
  return nb_permute(nb_reshape(t, NB_SHAPE(BATCH, SEQ, HEADS, D / HEADS)), NB_AXES(0, 2, 1, 3));
}

static nb_status block_loss(void *u, nb_tensor *const *p, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *x = block_x;
  nb_tensor *h = nb_layer_norm(x, p[0], p[1], 1e-5);
  nb_tensor *a = nb_attention(heads(linear(h, p[2], p[3])), heads(linear(h, p[4], p[5])),
                              heads(linear(h, p[6], p[7])), NULL);
  a = nb_reshape(nb_permute(a, NB_AXES(0, 2, 1, 3)), NB_SHAPE(BATCH * SEQ, D));
  nb_tensor *r = nb_add(x, linear(a, p[8], p[9]));
  h = nb_layer_norm(r, p[10], p[11], 1e-5);
  nb_tensor *o = nb_add(r, linear(nb_gelu(linear(h, p[12], p[13])), p[14], p[15]));
  out[0] = nb_mean(o, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* ---- the README MLP (bench_common.h) ---------------------------------------------------- */
static void readme_init(nb_tensor **in) { readme_mlp_init(in); }

static const train_case cases[] = {
    {"readme_mlp_step", 8, 2, readme_init, readme_mlp_loss_fn, true, 50, 1000, JIT},
    {"mlp_784_1024_1024_10_step", 6, 2, mlp784_init, mlp784_loss, true, 10, 100,
     FUNCTIONAL | JIT | IMPERATIVE},
    {"transformer_block_fwd_bwd", 16, 0, block_init, block_loss, false, 5, 50,
     FUNCTIONAL | JIT | IMPERATIVE},
};
enum { N_CASES = sizeof cases / sizeof cases[0] };

/* The function a functional step calls: out = loss, then one gradient per parameter
 * (the parameters come first; a case without data differentiates every input). */
static nb_fn *make_value_and_grad(const train_case *c, nb_fn *f) {
  if (c->n_data == 0) return nb_value_and_grad(f, NB_ALL);
  nb_axes arg = {.n = c->n_params};
  for (int i = 0; i < c->n_params; i++)
    arg.v[i] = i;
  return nb_value_and_grad(f, arg);
}

/* The jitted SGD step: in = params, then data; out = loss, then the updated params. */
typedef struct sgd_step {
  nb_fn *vg;
  int n_params;
} sgd_step;

static nb_status sgd_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const sgd_step *st = u;
  nb_tensor *o[MAX_IN + 1];
  nb_status s = nb_call(st->vg, in, o);
  if (s) return s;
  out[0] = o[0];
  for (int i = 0; i < st->n_params; i++)
    out[1 + i] = nb_sub(in[i], nb_mul_scalar(o[1 + i], LR));
  return nb_last_status();
}

/* One timed run of case c in style s; returns the median step time (s), or -1. */
static double run(const train_case *c, int s, bool smoke, int n_steps, double *loss_out) {
  int warmup = smoke ? 0 : c->warmup, steps = smoke ? 1 : n_steps > 0 ? n_steps : c->steps;
  int np = c->n_params, n_in = np + c->n_data;
  nb_seed(0);
  nb_scope_begin(); /* holds this run's parameters and data */
  nb_tensor *in[MAX_IN + 1];
  c->init(in);
  nb_fn *f = nb_fn_create(c->loss, NULL, n_in, 1);
  nb_fn *vg = NULL, *step_fn = NULL, *jvg = NULL, *call = NULL;
  sgd_step sgd = {0};
  if (s != IMPERATIVE) {
    vg = make_value_and_grad(c, f);
    call = vg;
    if (s == JIT && c->update) {
      sgd = (sgd_step){vg, np};
      step_fn = nb_fn_create(sgd_body, &sgd, n_in, 1 + np);
      call = jvg = nb_jit(step_fn);
    } else if (s == JIT) {
      call = jvg = nb_jit(vg);
    }
  } else {
    for (int i = 0; i < np; i++)
      nb_set_requires_grad(in[i], true);
  }
  double *t = malloc(sizeof(double) * (size_t)steps);
  for (int step = -warmup; step < steps && nb_last_status() == NB_OK; step++) {
    double t0 = now_s();
    nb_scope_begin();
    nb_tensor *o[MAX_IN + 1];
    if (s == IMPERATIVE) {
      nb_call(f, in, o);
      nb_backward(o[0]);
      for (int i = 0; i < np; i++)
        o[1 + i] = nb_grad_of(in[i]);
    } else {
      nb_call(call, in, o);
    }
    if (c->update && jvg) { /* the jitted step returned the updated parameters */
      for (int i = 0; i < np; i++)
        nb_assign(in[i], o[1 + i]);
    } else if (c->update) {
      for (int i = 0; i < np; i++)
        nb_assign(in[i], nb_sub(in[i], nb_mul_scalar(o[1 + i], LR)));
    } else {
      nb_eval(o, 1 + np);
    }
    *loss_out = nb_item(o[0]);
    if (s == IMPERATIVE)
      for (int i = 0; i < np; i++)
        nb_zero_grad(in[i]);
    nb_scope_end();
    double dt = now_s() - t0;
    if (step >= 0) t[step] = dt;
  }
  double med = nb_last_status() == NB_OK ? median(t, steps) : -1;
  free(t);
  nb_fn_release(jvg);
  nb_fn_release(step_fn);
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_scope_end();
  return med;
}

int main(int argc, char **argv) {
  bool smoke = false;
  const char *only_case = NULL, *only_style = NULL;
  int n_steps = 0;
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--smoke") == 0)
      smoke = true;
    else if (strcmp(argv[a], "--case") == 0 && a + 1 < argc)
      only_case = argv[++a];
    else if (strcmp(argv[a], "--style") == 0 && a + 1 < argc)
      only_style = argv[++a];
    else if (strcmp(argv[a], "--steps") == 0 && a + 1 < argc)
      n_steps = atoi(argv[++a]);
    else {
      fprintf(stderr, "usage: bench_train [--smoke] [--case NAME] [--style NAME] [--steps N]\n");
      return 2;
    }
  }
  double med[N_CASES][3];
  for (int c = 0; c < N_CASES; c++)
    for (int s = 0; s < 3; s++) {
      med[c][s] = 0;
      if (!(cases[c].styles & (1 << s))) continue;
      if (only_case && strcmp(only_case, cases[c].name) != 0) continue;
      if (only_style && strcmp(only_style, style_names[s]) != 0) continue;
      double loss = 0;
      med[c][s] = run(&cases[c], 1 << s, smoke, n_steps, &loss);
      if (med[c][s] < 0) {
        fprintf(stderr, "bench_train: %s, %s: %s\n", cases[c].name, style_names[s],
                nb_last_error());
        return 1;
      }
      printf("{\"case\":\"%s\",\"style\":\"%s\",\"impl\":\"nabla\",\"steps\":%d,\"median_s\":%.6g,"
             "\"final_loss\":%.6f}\n",
             cases[c].name, style_names[s],
             smoke         ? 1
             : n_steps > 0 ? n_steps
                           : cases[c].steps,
             med[c][s], loss);
      fflush(stdout);
    }
  printf("\nTraining steps, median ms\n%-27s %11s %11s %11s\n", "case", style_names[0],
         style_names[1], style_names[2]);
  for (int c = 0; c < N_CASES; c++) {
    printf("%-27s", cases[c].name);
    for (int s = 0; s < 3; s++)
      if (med[c][s] > 0)
        printf(" %11.3f", med[c][s] * 1e3);
      else
        printf(" %11s", "-");
    printf("\n");
  }
  nb_release(block_x);
  return 0;
}
