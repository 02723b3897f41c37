/* bench/bench_mlp.c — one training step of the README MLP ([1,32,64,32,1],
 * batch 256, f32, MSE, SGD lr 0.01), both autodiff styles:
 *   functional   nb_call(value_and_grad) + 8 nb_assign
 *   imperative   forward, nb_backward, 8 nb_assign + nb_zero_grad
 * Each step is one scope; the loss is read every step (nb_item), as a training
 * loop that logs would. Reported: median step time over STEPS steps after
 * WARMUP, and the share of it spent planning realizations (collect, hash, plan
 * cache) and executing kernels, from nb_stats; the rest is recording ops,
 * tracing and the autodiff sweeps.
 *
 *   bench_mlp           1000 timed steps per style
 *   bench_mlp --smoke   10 steps (build check)
 * Peers (PyTorch, JAX) for this step are issue 5's bench/peers scripts. */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"

int main(int argc, char **argv) {
  bool smoke = argc > 1 && strcmp(argv[1], "--smoke") == 0;
  int warmup = smoke ? 2 : 50, steps = smoke ? 10 : 1000;
  double *t = malloc(sizeof(double) * (size_t)steps);
  const char *styles[2] = {"functional", "imperative"};
  double med[2], plan_frac[2], exec_frac[2], loss_end[2];
  for (int style = 0; style < 2; style++) {
    nb_seed(0);
    nb_tensor *p[10];
    readme_mlp_init(p);
    nb_fn *f = nb_fn_create(readme_mlp_loss_fn, NULL, 10, 1);
    nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1, 2, 3, 4, 5, 6, 7));
    if (style == 1)
      for (int i = 0; i < 8; i++)
        nb_set_requires_grad(p[i], true);
    nb_stats s0 = {0};
    double total = 0;
    for (int step = -warmup; step < steps; step++) {
      if (step == 0) s0 = nb_get_stats();
      double t0 = now_s();
      nb_scope_begin();
      nb_tensor *loss;
      if (style == 0) {
        nb_tensor *o[9];
        nb_call(vg, p, o);
        for (int i = 0; i < 8; i++)
          nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(o[1 + i], 0.01)));
        loss = o[0];
      } else {
        loss = readme_mlp_loss(p, p[8], p[9]);
        nb_backward(loss);
        for (int i = 0; i < 8; i++) {
          nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(nb_grad_of(p[i]), 0.01)));
          nb_zero_grad(p[i]);
        }
      }
      loss_end[style] = nb_item(loss);
      nb_scope_end();
      double dt = now_s() - t0;
      if (step >= 0) t[step] = dt, total += dt;
    }
    if (nb_last_status() != NB_OK) {
      fprintf(stderr, "bench_mlp: %s\n", nb_last_error());
      return 1;
    }
    nb_stats s1 = nb_get_stats();
    plan_frac[style] = (double)(s1.plan_ns - s0.plan_ns) * 1e-9 / total;
    exec_frac[style] = (double)(s1.exec_ns - s0.exec_ns) * 1e-9 / total;
    med[style] = median(t, steps);
    printf("{\"case\":\"readme_mlp_step\",\"style\":\"%s\",\"impl\":\"nabla\",\"steps\":%d,"
           "\"median_s\":%.6g,\"plan_fraction\":%.3f,\"exec_fraction\":%.3f,"
           "\"realizations_per_step\":%.2f,\"kernels_per_step\":%.1f,\"final_loss\":%.6f}\n",
           styles[style], steps, med[style], plan_frac[style], exec_frac[style],
           (double)(s1.realizations - s0.realizations) / steps,
           (double)(s1.kernels_run - s0.kernels_run) / steps, loss_end[style]);
    nb_fn_release(vg);
    nb_fn_release(f);
  }
  printf("\nREADME MLP training step (median over %d steps)\n%-11s %10s %8s %8s %8s\n", steps,
         "style", "step_us", "plan", "exec", "other");
  for (int s = 0; s < 2; s++)
    printf("%-11s %10.1f %7.1f%% %7.1f%% %7.1f%%\n", styles[s], med[s] * 1e6, 100 * plan_frac[s],
           100 * exec_frac[s], 100 * (1 - plan_frac[s] - exec_frac[s]));
  free(t);
  return 0;
}
