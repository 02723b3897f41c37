/* bench/bench_sharding.c — a matmul on a virtual CPU mesh against the same
 * matmul on one device.
 *
 *   matmul  C = A @ B, f32, A [n, n] sharded over x (rows) on meshes x=1, 2,
 *           4, B replicated: each device computes its [n / shards, n] block.
 *           Reported: the median of realizing C (its shards), and the speedup
 *           over the unsharded product.
 * The virtual mesh runs its devices' kernels one after another on the same
 * OpenMP pool (each product uses both cores), so on this 2-core machine the
 * expected speedup is none: the same multiply-adds, in smaller products,
 * plus the per-shard dispatch. Speed from sharding needs real devices.
 *
 *   bench_sharding           n = 1024, 20 repetitions
 *   bench_sharding --smoke   n = 64, 2 repetitions */
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
  return nb_last_status() == NB_OK ? 0 : 1;
}
