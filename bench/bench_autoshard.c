/* bench/bench_autoshard.c — automatic sharding (src/autoshard/): the solve
 * time against the graph size, and the cost model's constants measured on
 * the virtual CPU mesh.
 *
 *   solve      a training step (loss, gradients, SGD update, parameters
 *              tied to their inputs' layouts) of an MLP of L blocks
 *              (batch 256, width 64, hidden 256, f32) on dp=2,tp=2, for L =
 *              1 .. 32: the traced ops, nb_auto_shard_plan's wall time
 *              (median of 3), the solver that ran and the plan's predicted
 *              collectives.
 *   constants  flops_per_s: a [512, 512] f32 matmul on one device; alpha and
 *              beta: an all-reduce over x=4 (nb_reshard of a partial sum) of
 *              4 KiB .. 4 MiB, fitted as alpha + bytes per device * beta
 *              (least squares). On the virtual mesh an all-reduce is a sum
 *              of buffers in one process: these are the numbers to pass in
 *              nb_auto_shard_opts when the plan runs there; MPI and NCCL
 *              meshes want their own.
 *   step       the step time of the solved plan against the hand-written
 *              Megatron layout and the unsharded step (bench/autoshard_step.h:
 *              a 2-block MLP training step, batch 32, width 256, hidden 1024,
 *              f32) on tp=2 and dp=2,tp=2: the median of 50 steps, the
 *              collectives of one step, the ratio solved / Megatron; the
 *              losses must agree (1e-4 relative) or the bench fails.
 *              bench/mpi/bench_mpi.c times the same over MPI ranks.
 *
 *   bench_autoshard           as above
 *   bench_autoshard --smoke   L = 1, 2; one repetition; two sizes; step with
 *                             batch 8, width 32, hidden 128, 3 steps
 *   bench_autoshard step      only the step case (--smoke after it: reduced) */
#include <math.h>
#include <nabla/nabla.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autoshard_step.h"
#include "bench_common.h"

enum { N = 256, D = 64, H = 256, MAXL = 32 };

typedef struct mlp {
  int L;
  nb_fn *vg;
} mlp;

static nb_status loss_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const mlp *p = u;
  int np = 4 * p->L;
  nb_tensor *h = in[np];
  for (int i = 0; i < p->L; i++) {
    nb_tensor *const *w = in + 4 * i;
    h = nb_add(nb_matmul(nb_relu(nb_add(nb_matmul(h, w[0]), w[1])), w[2]), w[3]);
  }
  out[0] = nb_mean(nb_square(nb_sub(h, in[np + 1])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status step_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const mlp *p = u;
  int np = 4 * p->L;
  nb_tensor *o[1 + 4 * MAXL];
  nb_status st = nb_call(p->vg, in, o);
  if (st) return st;
  out[0] = o[0];
  for (int i = 0; i < np; i++)
    if (!(out[1 + i] = nb_sub(in[i], nb_mul_scalar(o[1 + i], 0.1)))) return nb_last_status();
  return NB_OK;
}

/* One case: median solve seconds (or -1), the plan's ops and prediction. */
static double solve_case(int L, bool share, int reps, int *ops, nb_shard_prediction *pr) {
  mlp p = {.L = L};
  int np = 4 * L, nin = np + 2, nout = np + 1;
  int argnums[4 * MAXL], tie[4 * MAXL + 1];
  nb_tensor *in[4 * MAXL + 2];
  nb_scope_begin();
  for (int i = 0; i < np; i++)
    argnums[i] = i, tie[1 + i] = i;
  tie[0] = -1;
  nb_fn *loss = nb_fn_create(loss_fn, &p, nin, 1);
  p.vg = nb_value_and_grad_argnums(loss, argnums, np);
  nb_fn *step = nb_fn_create(step_fn, &p, nin, nout);
  for (int i = 0; i < L; i++) {
    in[4 * i] = nb_zeros(NB_SHAPE(D, H), NB_F32);
    in[4 * i + 1] = nb_zeros(NB_SHAPE(H), NB_F32);
    in[4 * i + 2] = nb_zeros(NB_SHAPE(H, D), NB_F32);
    in[4 * i + 3] = nb_zeros(NB_SHAPE(D), NB_F32);
  }
  in[np] = nb_zeros(NB_SHAPE(N, D), NB_F32);
  in[np + 1] = nb_zeros(NB_SHAPE(N, D), NB_F32);
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  double t[8];
  for (int r = 0; r < reps; r++) {
    nb_shard_plan *plan = nb_auto_shard_plan(
        step, m, in, &(nb_auto_shard_opts){.out_like_in = tie, .no_layer_sharing = !share});
    if (!plan) break;
    *pr = nb_shard_plan_predict(plan);
    t[r] = pr->solve_s;
    FILE *null = fopen("/dev/null", "w");
    nb_auto_shard_report(null, plan, NULL);
    fclose(null);
    nb_shard_plan_release(plan);
  }
  /* the op count: the report's first line */
  char *rep = NULL;
  size_t n_rep = 0;
  FILE *f = open_memstream(&rep, &n_rep);
  nb_shard_plan *plan = nb_auto_shard_plan(
      step, m, in, &(nb_auto_shard_opts){.out_like_in = tie, .no_layer_sharing = !share});
  if (plan) nb_auto_shard_report(f, plan, NULL);
  fclose(f);
  const char *c = rep ? strstr(rep, ": ") : NULL;
  *ops = c ? atoi(c + 2) : 0;
  free(rep);
  nb_shard_plan_release(plan);
  nb_mesh_release(m);
  nb_fn_release(step);
  nb_fn_release(p.vg);
  nb_fn_release(loss);
  nb_scope_end();
  return nb_last_status() == NB_OK ? median(t, reps) : -1;
}

/* ---- a transformer (nb_block_apply of src/nn, L blocks) ----------------------------------- */
enum { TD = 256, TT = 16, TMAXP = 16, TMAXL = 12 };
typedef struct tfm {
  int L, np;
  nb_block_config c;
  const char *names[TMAXP];
  nb_fn *vg;
} tfm;

static nb_status tf_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const tfm *t = u;
  nb_tensor *h = in[t->np * t->L];
  for (int l = 0; l < t->L; l++) {
    nb_tree *p = nb_tree_create();
    for (int i = 0; i < t->np; i++)
      nb_tree_set(p, t->names[i], in[l * t->np + i]);
    h = nb_block_apply(p, &t->c, h, NULL);
    nb_tree_release(p);
  }
  out[0] = nb_mse(h, in[t->np * t->L + 1]);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status tf_step(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const tfm *t = u;
  nb_tensor *o[1 + TMAXP * TMAXL];
  nb_status st = nb_call(t->vg, in, o);
  if (st) return st;
  out[0] = o[0];
  for (int i = 0; i < t->np * t->L; i++)
    if (!(out[1 + i] = nb_sub(in[i], nb_mul_scalar(o[1 + i], 0.1)))) return nb_last_status();
  return NB_OK;
}

/* The traced ops: the report's first line. */
static int plan_ops(const nb_shard_plan *plan) {
  char *rep = NULL;
  size_t n_rep = 0;
  FILE *f = open_memstream(&rep, &n_rep);
  if (!f) return 0;
  nb_auto_shard_report(f, plan, NULL);
  fclose(f);
  const char *c = rep ? strstr(rep, ": ") : NULL;
  int ops = c ? atoi(c + 2) : 0;
  free(rep);
  return ops;
}

/* A training step of L transformer blocks (width 256, 4 heads, MLP 1024,
 * sequence 16, f32) on tp=2: median solve seconds (or -1), ops, prediction. */
static double tf_case(int L, bool share, int reps, int *ops, nb_shard_prediction *pr) {
  tfm t = {.L = L, .c = {.dim = TD, .n_heads = 4, .hidden = 4 * TD, .bias = true}};
  nb_scope_begin();
  nb_tree *params = nb_block_init(nb_key(1), &t.c, NB_F32);
  t.np = params ? nb_tree_len(params) : 0;
  int n = t.np * L, argnums[TMAXP * TMAXL], tie[TMAXP * TMAXL + 1];
  nb_tensor *in[TMAXP * TMAXL + 2];
  tie[0] = -1;
  for (int l = 0; l < L; l++)
    for (int i = 0; i < t.np; i++) {
      t.names[i] = nb_tree_name(params, i);
      in[l * t.np + i] = nb_tree_at(params, i);
      argnums[l * t.np + i] = tie[1 + l * t.np + i] = l * t.np + i;
    }
  in[n] = nb_zeros(NB_SHAPE(1, TT, TD), NB_F32);
  in[n + 1] = nb_zeros(NB_SHAPE(1, TT, TD), NB_F32);
  nb_fn *loss = nb_fn_create(tf_loss, &t, n + 2, 1);
  t.vg = nb_value_and_grad_argnums(loss, argnums, n);
  nb_fn *step = nb_fn_create(tf_step, &t, n + 2, n + 1);
  nb_mesh *m = nb_mesh_cpu("tp=2");
  double times[8];
  for (int r = 0; r < reps; r++) {
    nb_shard_plan *plan = nb_auto_shard_plan(
        step, m, in, &(nb_auto_shard_opts){.out_like_in = tie, .no_layer_sharing = !share});
    if (!plan) break;
    *pr = nb_shard_plan_predict(plan);
    times[r] = pr->solve_s;
    *ops = plan_ops(plan);
    nb_shard_plan_release(plan);
  }
  nb_mesh_release(m);
  nb_fn_release(step);
  nb_fn_release(t.vg);
  nb_fn_release(loss);
  nb_tree_release(params);
  nb_scope_end();
  return nb_last_status() == NB_OK ? median(times, reps) : -1;
}

/* Median seconds of a [n, n] f32 matmul on one device. */
static double matmul_s(int n, int reps) {
  nb_scope_begin();
  nb_tensor *a = nb_randn(NB_SHAPE(n, n), NB_F32), *b = nb_randn(NB_SHAPE(n, n), NB_F32);
  nb_eval((nb_tensor *[]){a, b}, 2);
  double t[16];
  for (int r = -1; r < reps; r++) {
    nb_scope_begin();
    double t0 = now_s();
    nb_tensor *c = nb_matmul(a, b);
    nb_eval(&c, 1);
    if (r >= 0) t[r] = now_s() - t0;
    nb_scope_end();
  }
  nb_scope_end();
  return median(t, reps);
}

/* Median seconds of an all-reduce of an f32 [n] partial sum over x=4. */
static double all_reduce_s(nb_mesh *m, int64_t n, int reps) {
  nb_scope_begin();
  nb_tensor *p = nb_shard(nb_ones(NB_SHAPE(n), NB_F32), m, "[_] partial(x)");
  nb_eval(&p, 1);
  double t[16];
  for (int r = -1; r < reps; r++) {
    nb_scope_begin();
    double t0 = now_s();
    nb_tensor *s = nb_reshard(p, "[_]");
    nb_eval(&s, 1);
    if (r >= 0) t[r] = now_s() - t0;
    nb_scope_end();
  }
  nb_scope_end();
  return nb_last_status() == NB_OK ? median(t, reps) : -1;
}

/* ---- step: solved plan vs hand-written Megatron vs unsharded ---------------------------- */
static int step_case(bool smoke) {
  static const char *const meshes[] = {"tp=2", "dp=2,tp=2"};
  int64_t n = smoke ? 8 : 32, d = smoke ? 32 : 256, h = smoke ? 128 : 1024;
  int reps = smoke ? 3 : 50;
  printf("step time, 2-block MLP training step (batch %lld, width %lld, hidden %lld, f32), median "
         "of %d steps:\n",
         (long long)n, (long long)d, (long long)h, reps);
  printf("mesh        variant      median ms  collectives  loss\n");
  int rc = 0;
  for (int mi = 0; mi < 2 && !rc; mi++) {
    nb_scope_begin();
    nb_mesh *m = nb_mesh_cpu(meshes[mi]);
    as_step s;
    nb_shard_plan *plan = NULL;
    double med[AS_N_VARIANTS], loss[AS_N_VARIANTS], t[64];
    uint64_t coll[AS_N_VARIANTS];
    if (!m || as_step_make(&s, n, d, h) || !(plan = as_step_solve(&s, m))) {
      fprintf(stderr, "step: %s\n", nb_last_error());
      rc = 1;
    }
    for (int v = 0; v < AS_N_VARIANTS && !rc; v++) {
      if (as_step_time(&s, m, plan, v, reps, NULL, t, &loss[v], &coll[v])) {
        fprintf(stderr, "step %s on %s: %s\n", AS_VARIANT[v], meshes[mi], nb_last_error());
        rc = 1;
      } else
        med[v] = median(t, reps);
    }
    for (int v = 0; v < AS_N_VARIANTS && !rc; v++) {
      double ratio = med[AS_SOLVED] / med[AS_MEGATRON];
      printf("{\"case\":\"autoshard_step\",\"mesh\":\"%s\",\"variant\":\"%s\",\"impl\":\"nabla\","
             "\"median_s\":%.6g,\"collectives\":%llu,\"loss\":%.8g,\"ratio_solved_megatron\":%.4g}"
             "\n",
             meshes[mi], AS_VARIANT[v], med[v], (unsigned long long)coll[v], loss[v], ratio);
    }
    if (!rc) {
      for (int v = 0; v < AS_N_VARIANTS; v++)
        printf("%-11s %-11s %10.3f %12llu  %.8f\n", meshes[mi], AS_VARIANT[v], med[v] * 1e3,
               (unsigned long long)coll[v], loss[v]);
      printf("%-11s solved/megatron %.3f; solved specs:", meshes[mi],
             med[AS_SOLVED] / med[AS_MEGATRON]);
      for (int k = 0; k < AS_NIN; k++)
        printf(" %s", nb_shard_plan_in_spec(plan, k));
      printf("\n");
      for (int v = 1; v < AS_N_VARIANTS; v++)
        if (fabs(loss[v] - loss[AS_SOLVED]) > 1e-4 * fmax(1e-30, fabs(loss[AS_UNSHARDED]))) {
          fprintf(stderr, "step on %s: loss %s %.9g vs solved %.9g\n", meshes[mi], AS_VARIANT[v],
                  loss[v], loss[AS_SOLVED]);
          rc = 1;
        }
    }
    nb_shard_plan_release(plan);
    if (m) as_step_free(&s);
    nb_mesh_release(m);
    nb_scope_end();
  }
  return rc;
}

int main(int argc, char **argv) {
  bool only_step = argc > 1 && !strcmp(argv[1], "step");
  bool smoke = argc > 1 + only_step && !strcmp(argv[1 + only_step], "--smoke");
  int reps = smoke ? 1 : 3;
  if (only_step) return step_case(smoke);
  static const int Ls[] = {1, 2, 4, 8, 16, 32};
  int n_L = smoke ? 2 : 6;
  printf("solve time, MLP training step on dp=2,tp=2 (batch %d, width %d, hidden %d), with and "
         "without layer sharing:\n",
         N, D, H);
  printf("blocks  ops  choices  shared ms  cost s      unshared ms  cost s      all-reduce "
         "all-gather reduce-scatter (shared)\n");
  for (int i = 0; i < n_L; i++) {
    int ops = 0;
    nb_shard_prediction pr = {0}, pu = {0};
    double t = solve_case(Ls[i], true, reps, &ops, &pr);
    double tu = solve_case(Ls[i], false, Ls[i] >= 16 ? 1 : reps, &ops, &pu);
    if (t < 0 || tu < 0) {
      fprintf(stderr, "solve: %s\n", nb_last_error());
      return 1;
    }
    printf("{\"case\":\"autoshard_solve\",\"size\":%d,\"ops\":%d,\"impl\":\"nabla\",\"median_s\":%."
           "6g}\n",
           Ls[i], ops, t);
    printf("{\"case\":\"autoshard_solve_unshared\",\"size\":%d,\"ops\":%d,\"impl\":\"nabla\","
           "\"median_s\":%.6g}\n",
           Ls[i], ops, tu);
    printf("%6d %5d %7d %10.1f  %.4e %11.1f  %.4e %10llu %10llu %14llu\n", Ls[i], ops, pr.n_choices,
           t * 1e3, pr.cost_s, tu * 1e3, pu.cost_s, (unsigned long long)pr.n_all_reduce,
           (unsigned long long)pr.n_all_gather, (unsigned long long)pr.n_reduce_scatter);
  }
  static const int TLs[] = {1, 2, 4, 8, 12};
  int n_TL = smoke ? 1 : 5;
  printf("solve time, transformer training step on tp=2 (nb_block_apply: width %d, 4 heads, MLP "
         "%d, sequence %d, f32):\n",
         TD, 4 * TD, TT);
  printf("blocks  ops  choices  shared ms  cost s      unshared ms  cost s      all-reduce "
         "all-gather (shared)\n");
  for (int i = 0; i < n_TL; i++) {
    int ops = 0;
    nb_shard_prediction pr = {0}, pu = {0};
    double t = tf_case(TLs[i], true, reps, &ops, &pr);
    double tu = tf_case(TLs[i], false, TLs[i] >= 4 ? 1 : reps, &ops, &pu);
    if (t < 0 || tu < 0) {
      fprintf(stderr, "transformer solve: %s\n", nb_last_error());
      return 1;
    }
    printf("{\"case\":\"autoshard_solve_transformer\",\"size\":%d,\"ops\":%d,\"impl\":\"nabla\","
           "\"median_s\":%.6g}\n",
           TLs[i], ops, t);
    printf("{\"case\":\"autoshard_solve_transformer_unshared\",\"size\":%d,\"ops\":%d,\"impl\":"
           "\"nabla\",\"median_s\":%.6g}\n",
           TLs[i], ops, tu);
    printf("%6d %5d %7d %10.1f  %.4e %11.1f  %.4e %10llu %10llu\n", TLs[i], ops, pr.n_choices,
           t * 1e3, pr.cost_s, tu * 1e3, pu.cost_s, (unsigned long long)pr.n_all_reduce,
           (unsigned long long)pr.n_all_gather);
  }
  int n = smoke ? 64 : 512;
  double mm = matmul_s(n, reps);
  double flops = 2.0 * n * n * n / mm;
  nb_mesh *m = nb_mesh_cpu("x=4");
  int n_sz = smoke ? 2 : 6;
  double xs[8], ys[8];
  for (int i = 0; i < n_sz; i++) {
    int64_t elems = (int64_t)1024 << (2 * i); /* 4 KiB .. 4 MiB */
    xs[i] = 2.0 * 3 / 4 * (double)elems * 4;  /* bytes per device: 2 (n-1)/n B */
    ys[i] = all_reduce_s(m, elems, reps);
  }
  double mx = 0, my = 0, sxx = 0, sxy = 0;
  for (int i = 0; i < n_sz; i++)
    mx += xs[i] / n_sz, my += ys[i] / n_sz;
  for (int i = 0; i < n_sz; i++)
    sxx += (xs[i] - mx) * (xs[i] - mx), sxy += (xs[i] - mx) * (ys[i] - my);
  double beta = sxx > 0 ? sxy / sxx : 0, alpha = my - beta * mx;
  nb_mesh_release(m);
  printf(
      "{\"case\":\"autoshard_constants\",\"impl\":\"nabla\",\"flops_per_s\":%.4g,\"alpha_s\":%.4g,"
      "\"beta_s_per_byte\":%.4g}\n",
      flops, alpha, beta);
  printf("virtual mesh constants: flops_per_s %.3g (matmul %d), alpha %.3g s, beta %.3g s/byte "
         "(%.2f GB/s); defaults 1e11, 1e-5, 1e-10\n",
         flops, n, alpha, beta, beta > 0 ? 1e-9 / beta : 0);
  return step_case(smoke);
}
