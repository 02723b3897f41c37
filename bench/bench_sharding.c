/* bench/bench_sharding.c — a matmul on a virtual CPU mesh against the same
 * matmul on one device, and a small sharded MLP step against the same step
 * unsharded.
 *
 *   matmul  C = A @ B, f32, A [n, n] sharded over x (rows) on meshes x=1, 2,
 *           4, B replicated: each device computes its [n / shards, n] block.
 *           Reported: the median of realizing C (its shards), and the speedup
 *           over the unsharded product. Each block is large enough to use
 *           both cores itself, so its steps run one after another either way.
 *   mlp     value and gradient of mean((relu(x @ W1) @ W2 - y)^2) on x=4,
 *           W1 [128, 256] column-parallel, W2 [256, 128] row-parallel, x, y
 *           [64, 128] replicated (per-device products of 0.5M multiply-adds:
 *           each kernel runs on one thread). Reported: the median step time,
 *           sharded and unsharded, repetitions alternating.
 * On this 2-core machine the sharded matmul cannot beat the unsharded one:
 * the same multiply-adds, in smaller products, plus the per-shard dispatch.
 *
 *   bench_sharding           n = 1024, 20 repetitions; mlp 200 repetitions
 *   bench_sharding --smoke   n = 64, 2 repetitions; mlp 2 repetitions */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

static double run(nb_tensor *a, nb_tensor *b, nb_mesh *m, int reps) {
  nb_scope_begin();
  nb_tensor *sa = m ? nb_shard(a, m, "x, _") : a, *sb = m ? nb_shard(b, m, "_, _") : b;
  nb_eval((nb_tensor *[]){sa, sb}, 2);
  double *t = malloc(sizeof(double) * (size_t)reps);
  for (int r = -1; r < reps; r++) {
    nb_scope_begin();
    double t0 = now_s();
    nb_tensor *c = nb_matmul(sa, sb);
    nb_eval(&c, 1);
    if (r >= 0) t[r] = now_s() - t0;
    nb_scope_end();
  }
  double med = nb_last_status() == NB_OK ? median(t, reps) : -1;
  free(t);
  nb_scope_end();
  return med;
}

enum { MLP_B = 64, MLP_D = 128, MLP_H = 256 };

static nb_status mlp_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *y = nb_matmul(nb_relu(nb_matmul(in[2], in[0])), in[1]);
  out[0] = nb_mean(nb_square(nb_sub(y, in[3])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* Median seconds of one value-and-gradient step of the MLP, sharded on x=4
 * (med[0]) and unsharded (med[1]), repetitions alternating. */
static void run_mlp(int reps, double *med) {
  nb_mesh *m = nb_mesh_cpu("x=4");
  nb_scope_begin();
  nb_tensor *plain[4] = {
      nb_glorot_uniform(NB_SHAPE(MLP_D, MLP_H), NB_F32),
      nb_glorot_uniform(NB_SHAPE(MLP_H, MLP_D), NB_F32),
      nb_rand(NB_SHAPE(MLP_B, MLP_D), NB_F32),
      nb_rand(NB_SHAPE(MLP_B, MLP_D), NB_F32),
  };
  nb_tensor *in[4] = {nb_shard(plain[0], m, "_, x"), nb_shard(plain[1], m, "x, _"),
                      nb_shard(plain[2], m, "_, _"), nb_shard(plain[3], m, "_, _")};
  nb_eval(in, 4);
  nb_fn *f = nb_fn_create(mlp_loss, NULL, 4, 1);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1));
  double *t = malloc(sizeof(double) * 2 * (size_t)reps);
  for (int r = -2; r < 2 * reps; r++) {
    int unsharded = (r + 2) % 2;
    nb_scope_begin();
    double t0 = now_s();
    nb_tensor *o[3];
    if (nb_call(vg, unsharded ? plain : in, o) == NB_OK) nb_eval(o, 3);
    if (r >= 0) t[unsharded * reps + r / 2] = now_s() - t0;
    nb_scope_end();
  }
  med[0] = nb_last_status() == NB_OK ? median(t, reps) : -1;
  med[1] = nb_last_status() == NB_OK ? median(t + reps, reps) : -1;
  free(t);
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_scope_end();
  nb_mesh_release(m);
}

int main(int argc, char **argv) {
  bool smoke = argc > 1 && strcmp(argv[1], "--smoke") == 0;
  int64_t n = smoke ? 64 : 1024;
  int reps = smoke ? 2 : 20;
  nb_tensor *a = nb_rand(NB_SHAPE(n, n), NB_F32), *b = nb_rand(NB_SHAPE(n, n), NB_F32);
  double base = run(a, b, NULL, reps);
  static const char *const meshes[] = {"x=1", "x=2", "x=4"};
  double med[3];
  for (int i = 0; i < 3; i++) {
    nb_mesh *m = nb_mesh_cpu(meshes[i]);
    med[i] = run(a, b, m, reps);
    nb_mesh_release(m);
    printf("{\"case\":\"sharded_matmul\",\"impl\":\"nabla\",\"mesh\":\"%s\",\"n\":%lld,"
           "\"median_s\":%g,\"unsharded_s\":%g}\n",
           meshes[i], (long long)n, med[i], base);
  }
  printf("\nmatmul %lldx%lld f32 on a virtual CPU mesh (rows over x), median ms\n", (long long)n,
         (long long)n);
  printf("%-10s %10s %9s\n", "mesh", "ms", "speedup");
  printf("%-10s %10.3f %9s\n", "unsharded", base * 1e3, "1.00");
  for (int i = 0; i < 3; i++)
    printf("%-10s %10.3f %9.2f\n", meshes[i], med[i] * 1e3, base / med[i]);
  double mlp[2];
  run_mlp(smoke ? 2 : 200, mlp);
  printf("{\"case\":\"sharded_mlp_grad\",\"impl\":\"nabla\",\"mesh\":\"x=4\",\"median_s\":%g,"
         "\"unsharded_s\":%g}\n",
         mlp[0], mlp[1]);
  printf("\nMLP value and grad (B %d, D %d, H %d), median ms\n", MLP_B, MLP_D, MLP_H);
  printf("%-10s %10.3f\n%-10s %10.3f %9.2fx\n", "unsharded", mlp[1] * 1e3, "x=4", mlp[0] * 1e3,
         mlp[1] / mlp[0]);
  return nb_last_status() == NB_OK ? 0 : 1;
}
