/* bench/mpi/bench_mpi.c — collectives between the processes of an mpirun job
 * through nabla's sharding layer against the same MPI primitives called
 * directly, and the MLP training step on a mesh spanning the ranks. Built and
 * run by `make MPI=1 bench-mpi` (bench/mpi/run.sh: 1, 2 and 4 ranks).
 *
 *   coll   for B = 1 KiB .. max (x4): f32 tensors of B bytes on the mesh x=N
 *          (one device per rank).
 *            all-reduce  nabla: a "_ partial(x)" tensor resharded to "_" and
 *                        realized; direct: MPI_Allreduce (in place) of B bytes.
 *            all-gather  nabla: an "x" tensor resharded to "_"; direct:
 *                        MPI_Allgather of B / N bytes per rank.
 *            reduce-scatter  nabla: a "_ partial(x)" tensor resharded to
 *                        "x"; direct: MPI_Reduce_scatter_block of B bytes.
 *          Each nabla collective is one MPI collective on the ranks of its
 *          group (src/sharding/dist_coll.c), so the two should be close.
 *          Reported: the median time over the repetitions (a barrier before
 *          each) and the bus bandwidth B / t, nabla and direct (blocking; and
 *          the MPI_I* form waited for at once, which nabla calls).
 *   mlp    value and gradient of mean((tanh(x @ W1) @ W2 - y)^2) plus the SGD
 *          update, W1 [256, 512], W2 [512, 256], f32, data parallel on dp=N
 *          (x, y sharded by rows, weights replicated): strong scaling (batch
 *          256 in all) and weak (batch 256 per rank), with the gradients'
 *          all-reduces overlapping the rest of the backward pass (default)
 *          and waited at once (NABLA_MPI_OVERLAP=0). Reported: the median
 *          step time.
 *   autoshard_step  the 2-block MLP training step of bench/autoshard_step.h
 *          (batch 32, width 256, hidden 1024, f32) on tp=N (one device per
 *          rank) and, with 2 or 4 ranks, dp=2,tp=2 spanning the ranks: the
 *          plan nb_auto_shard_plan solved (nb_shard_plan_call) against the
 *          hand-written Megatron layout and the unsharded step (every rank
 *          computing all of it). Reported: the median step time (slowest
 *          rank), the collectives of one step, the ratio solved / Megatron;
 *          the losses must agree (1e-4 relative) or the bench fails.
 *
 *   bench_mpi [--smoke] [--max-mib M] [--reps R] [--step-only]
 * (--step-only: only autoshard_step)
 * Rank 0 prints one JSON line per measurement (as the other benches do). */
#include <math.h>
#include <mpi.h>
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../autoshard_step.h"
#include "../bench_common.h"

static int R, N;

static double med_all(double *t, int reps) {
  double m = median(t, reps), worst = 0; /* the slowest rank's median */
  MPI_Allreduce(&m, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, N_COLL };
static const char *const COLL[] = {"all_reduce", "all_gather", "reduce_scatter"};

/* nabla: the collective reshard of a B-byte f32 tensor. */
static double nabla_coll(nb_mesh *m, int64_t n, int kind, int reps) {
  nb_scope_begin();
  nb_tensor *h = nb_full(NB_SHAPE(n), 1.0, NB_F32);
  nb_tensor *s = nb_shard(h, m, kind == ALL_GATHER ? "x" : "_ partial(x)");
  nb_eval(&s, 1);
  double *t = malloc(sizeof *t * (size_t)reps);
  for (int r = -1; r < reps; r++) {
    nb_scope_begin();
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    nb_tensor *y = nb_reshard(s, kind == REDUCE_SCATTER ? "x" : "_");
    nb_eval(&y, 1);
    if (r >= 0) t[r] = now_s() - t0;
    nb_scope_end();
  }
  double v = nb_last_status() == NB_OK ? med_all(t, reps) : -1;
  if (v < 0 && R == 0) fprintf(stderr, "bench_mpi: %s\n", nb_last_error());
  free(t);
  nb_scope_end();
  return v;
}

/* The same MPI collective called directly: blocking, or (nonblocking) its
 * MPI_I* form waited for at once (what nabla calls: Open MPI runs the two
 * with different algorithms). */
static double direct_coll(int64_t n, int kind, bool nonblocking, int reps) {
  float *a = malloc(sizeof *a * (size_t)n), *b = malloc(sizeof *b * (size_t)n);
  for (int64_t i = 0; i < n; i++)
    a[i] = 1, b[i] = 0;
  double *t = malloc(sizeof *t * (size_t)reps);
  for (int r = -1; r < reps; r++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    MPI_Request q;
    if (kind == ALL_REDUCE && nonblocking)
      MPI_Iallreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
    else if (kind == ALL_REDUCE)
      MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (kind == ALL_GATHER && nonblocking)
      MPI_Iallgather(a, (int)(n / N), MPI_FLOAT, b, (int)(n / N), MPI_FLOAT, MPI_COMM_WORLD, &q);
    else if (kind == ALL_GATHER)
      MPI_Allgather(a, (int)(n / N), MPI_FLOAT, b, (int)(n / N), MPI_FLOAT, MPI_COMM_WORLD);
    else if (nonblocking)
      MPI_Ireduce_scatter_block(a, b, (int)(n / N), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
    else
      MPI_Reduce_scatter_block(a, b, (int)(n / N), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (nonblocking) MPI_Wait(&q, MPI_STATUS_IGNORE);
    if (r >= 0) t[r] = now_s() - t0;
  }
  double v = med_all(t, reps);
  free(a), free(b), free(t);
  return v;
}

/* Overlap: an all-reduce of B bytes started, an independent matmul, then both
 * realized; with the overlap the transfer runs during the matmul. */
static double overlap_case(nb_mesh *m, int64_t n, int64_t k, bool comm, bool compute, int reps) {
  nb_scope_begin();
  nb_tensor *s = nb_shard(nb_full(NB_SHAPE(n), 1.0, NB_F32), m, "_ partial(x)");
  nb_tensor *a = nb_rand(NB_SHAPE(k, k), NB_F32);
  nb_eval((nb_tensor *[]){s, a}, 2);
  double *t = malloc(sizeof *t * (size_t)reps);
  for (int r = -1; r < reps; r++) {
    nb_scope_begin();
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    nb_tensor *y[2] = {comm ? nb_reshard(s, "_") : NULL, compute ? nb_matmul(a, a) : NULL};
    if (compute) nb_eval(&y[1], 1);
    if (comm) nb_eval(&y[0], 1);
    if (r >= 0) t[r] = now_s() - t0;
    nb_scope_end();
  }
  double v = med_all(t, reps);
  free(t);
  nb_scope_end();
  return v;
}

static nb_status loss_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_tanh(nb_matmul(in[0], in[1]));
  out[0] = nb_mean(nb_square(nb_sub(nb_matmul(h, in[2]), in[3])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static double mlp_step(nb_mesh *m, int64_t batch, int reps) {
  nb_scope_begin();
  nb_seed(1);
  nb_tensor *x = nb_shard(nb_rand(NB_SHAPE(batch, 256), NB_F32), m, "dp, _"),
            *y = nb_shard(nb_rand(NB_SHAPE(batch, 256), NB_F32), m, "dp, _"),
            *w1 = nb_shard(nb_mul_scalar(nb_randn(NB_SHAPE(256, 512), NB_F32), 0.05), m, "_, _"),
            *w2 = nb_shard(nb_mul_scalar(nb_randn(NB_SHAPE(512, 256), NB_F32), 0.05), m, "_, _");
  nb_fn *f = nb_fn_create(loss_body, NULL, 4, 1), *vg = nb_value_and_grad(f, NB_AXES(1, 2));
  nb_tensor *keep[2] = {nb_retain(w1), nb_retain(w2)};
  double *t = malloc(sizeof *t * (size_t)reps);
  for (int r = -1; r < reps; r++) {
    nb_scope_begin();
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    nb_tensor *o[3];
    nb_call(vg, (nb_tensor *[]){x, keep[0], keep[1], y}, o);
    nb_tensor *n1 = nb_sub(keep[0], nb_mul_scalar(o[1], 0.1)),
              *n2 = nb_sub(keep[1], nb_mul_scalar(o[2], 0.1));
    nb_eval((nb_tensor *[]){n1, n2, o[0]}, 3);
    if (r >= 0) t[r] = now_s() - t0;
    nb_release(keep[0]), nb_release(keep[1]);
    keep[0] = nb_retain(n1), keep[1] = nb_retain(n2);
    nb_scope_end();
  }
  double v = nb_last_status() == NB_OK ? med_all(t, reps) : -1;
  if (v < 0 && R == 0) fprintf(stderr, "bench_mpi: %s\n", nb_last_error());
  nb_release(keep[0]), nb_release(keep[1]);
  nb_fn_release(vg), nb_fn_release(f);
  free(t);
  nb_scope_end();
  return v;
}

static void barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }

/* The autoshard_step case on one mesh spanning the ranks; 0 or 1 (failed). */
static int autoshard_step(const char *axes, bool smoke, int reps) {
  int64_t n = smoke ? 8 : 32, d = smoke ? 32 : 256, h = smoke ? 128 : 1024;
  nb_scope_begin();
  nb_mesh *m = nb_mesh_world(axes);
  as_step s;
  nb_shard_plan *plan = NULL;
  double med[AS_N_VARIANTS], loss[AS_N_VARIANTS];
  uint64_t coll[AS_N_VARIANTS];
  double *t = malloc(sizeof *t * (size_t)reps);
  int rc = 0;
  if (!t || !m || as_step_make(&s, n, d, h) || !(plan = as_step_solve(&s, m))) rc = 1;
  for (int v = 0; v < AS_N_VARIANTS && !rc; v++) {
    if (as_step_time(&s, m, plan, v, reps, barrier, t, &loss[v], &coll[v]))
      rc = 1;
    else
      med[v] = med_all(t, reps);
  }
  if (rc && R == 0) fprintf(stderr, "bench_mpi: autoshard_step on %s: %s\n", axes, nb_last_error());
  for (int v = 0; v < AS_N_VARIANTS && !rc && R == 0; v++)
    printf("{\"bench\": \"mpi_autoshard_step\", \"ranks\": %d, \"mesh\": \"%s\", \"variant\": "
           "\"%s\", \"batch\": %lld, \"width\": %lld, \"hidden\": %lld, \"median_s\": %.4e, "
           "\"collectives\": %llu, \"loss\": %.8g, \"ratio_solved_megatron\": %.4g}\n",
           N, axes, AS_VARIANT[v], (long long)n, (long long)d, (long long)h, med[v],
           (unsigned long long)coll[v], loss[v], med[AS_SOLVED] / med[AS_MEGATRON]);
  for (int v = 1; v < AS_N_VARIANTS && !rc; v++)
    if (fabs(loss[v] - loss[AS_SOLVED]) > 1e-4 * fmax(1e-30, fabs(loss[AS_UNSHARDED]))) {
      if (R == 0)
        fprintf(stderr, "bench_mpi: autoshard_step on %s: loss %s %.9g vs solved %.9g\n", axes,
                AS_VARIANT[v], loss[v], loss[AS_SOLVED]);
      rc = 1;
    }
  if (plan && R == 0) {
    printf("autoshard_step on %s (%d ranks): solved specs", axes, N);
    for (int k = 0; k < AS_NIN; k++)
      printf(" %s", nb_shard_plan_in_spec(plan, k));
    printf("\n");
  }
  nb_shard_plan_release(plan);
  if (m) as_step_free(&s);
  nb_mesh_release(m);
  free(t);
  nb_scope_end();
  return rc;
}

int main(int argc, char **argv) {
  if (nb_init_distributed(&argc, &argv) != NB_OK) {
    fprintf(stderr, "%s\n", nb_last_error());
    return 2;
  }
  R = nb_rank(), N = nb_world_size();
  bool smoke = false, step_only = false;
  int64_t max_mib = 64;
  int reps = 10;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--smoke")) smoke = true;
    if (!strcmp(argv[i], "--step-only")) step_only = true;
    if (!strcmp(argv[i], "--max-mib") && i + 1 < argc) max_mib = atoll(argv[++i]);
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
  }
  if (smoke) max_mib = 0, reps = 2;
  char axes[32];
  if (!step_only) {
    snprintf(axes, sizeof axes, "x=%d", N);
    nb_mesh *m = nb_mesh_world(axes);
    double fx[16], fy[16]; /* all-reduce: bytes per rank 2 (N-1)/N B, nabla's seconds */
    int nf = 0;
    for (int64_t b = 1024; b <= (max_mib > 0 ? max_mib << 20 : 4096); b *= 4) {
      int64_t n = b / 4;
      if (n % N) continue;
      int k = b >= (16 << 20) ? (reps > 3 ? 3 : reps) : reps;
      for (int kind = 0; kind < N_COLL; kind++) {
        double tn = nabla_coll(m, n, kind, k), td = direct_coll(n, kind, false, k),
               ti = direct_coll(n, kind, true, k);
        if (kind == 0 && b >= 4096 && b <= (4 << 20) && nf < 16 && tn > 0)
          fx[nf] = 2.0 * (N - 1) / N * (double)b, fy[nf++] = tn;
        if (R == 0)
          printf("{\"bench\": \"mpi_%s\", \"ranks\": %d, \"bytes\": %lld, \"nabla_s\": %.3e, "
                 "\"mpi_s\": %.3e, \"mpi_nonblocking_s\": %.3e, \"nabla_GBps\": %.3f, "
                 "\"mpi_GBps\": %.3f}\n",
                 COLL[kind], N, (long long)b, tn, td, ti, (double)b / tn / 1e9,
                 (double)b / td / 1e9);
      }
    }
    if (N > 1 && nf >= 2 && R == 0) {
      /* the cost model's constants for this transport (nb_auto_shard_opts
       * alpha_s / beta_s_per_byte) over 4 KiB .. 4 MiB: least squares of the
       * relative error (weights 1 / t^2), so the small sizes fix alpha (plain
       * least squares let the large ones drive it below zero) */
      double w = 0, mx = 0, my = 0, sxx = 0, sxy = 0;
      for (int i = 0; i < nf; i++)
        w += 1 / (fy[i] * fy[i]);
      for (int i = 0; i < nf; i++)
        mx += fx[i] / (fy[i] * fy[i]) / w, my += 1 / fy[i] / w;
      for (int i = 0; i < nf; i++) {
        double wi = 1 / (fy[i] * fy[i]);
        sxx += wi * (fx[i] - mx) * (fx[i] - mx), sxy += wi * (fx[i] - mx) * (fy[i] - my);
      }
      double beta = sxx > 0 ? sxy / sxx : 0, alpha = my - beta * mx;
      printf("{\"bench\": \"autoshard_constants\", \"transport\": \"mpi\", \"ranks\": %d, "
             "\"alpha_s\": %.4g, \"beta_s_per_byte\": %.4g}\n",
             N, alpha, beta);
    }
    if (N > 1) {
      int64_t n = smoke ? 256 : 4 << 20, k = smoke ? 64 : 1024; /* 16 MiB of f32 */
      int kr = smoke ? 2 : reps;
      double tc = overlap_case(m, n, k, true, false, kr),
             tm = overlap_case(m, n, k, false, true, kr);
      setenv("NABLA_MPI_OVERLAP", "1", 1);
      double on = overlap_case(m, n, k, true, true, kr);
      setenv("NABLA_MPI_OVERLAP", "0", 1);
      double off = overlap_case(m, n, k, true, true, kr);
      unsetenv("NABLA_MPI_OVERLAP");
      if (R == 0)
        printf("{\"bench\": \"mpi_overlap\", \"ranks\": %d, \"bytes\": %lld, \"matmul\": %lld, "
               "\"all_reduce_ms\": %.3f, \"matmul_ms\": %.3f, \"both_overlap_ms\": %.3f, "
               "\"both_no_overlap_ms\": %.3f}\n",
               N, (long long)(n * 4), (long long)k, tc * 1e3, tm * 1e3, on * 1e3, off * 1e3);
    }
    nb_mesh_release(m);
    snprintf(axes, sizeof axes, "dp=%d", N);
    m = nb_mesh_world(axes);
    int mreps = smoke ? 2 : 20;
    for (int overlap = 1; overlap >= 0; overlap--) {
      setenv("NABLA_MPI_OVERLAP", overlap ? "1" : "0", 1);
      double strong = mlp_step(m, smoke ? 16 : 256, mreps),
             weak = mlp_step(m, (smoke ? 16 : 256) * N, mreps);
      if (R == 0)
        printf("{\"bench\": \"mpi_mlp_step\", \"ranks\": %d, \"overlap\": %s, \"strong_batch\": "
               "%d, \"strong_ms\": %.3f, \"weak_batch\": %d, \"weak_ms\": %.3f}\n",
               N, overlap ? "true" : "false", smoke ? 16 : 256, strong * 1e3,
               (smoke ? 16 : 256) * N, weak * 1e3);
    }
    unsetenv("NABLA_MPI_OVERLAP");
    nb_mesh_release(m);
  }
  snprintf(axes, sizeof axes, "tp=%d", N);
  int rc = autoshard_step(axes, smoke, smoke ? 3 : 50);
  if (!rc && (N == 2 || N == 4)) rc = autoshard_step("dp=2,tp=2", smoke, smoke ? 3 : 50);
  fflush(stdout);
  nb_finalize();
  return rc;
}
