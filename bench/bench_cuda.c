/* bench/bench_cuda.c — nabla on the GPU (NB_CUDA(0)) through the public API, against the
 * device-to-device copy ceiling measured in the same run (QUALITY.md: fused chain, softmax
 * and layer_norm >= 0.85x copy bandwidth; the MLP-784 and transformer steps are compared
 * with bench/peers/torch_cuda_bench.py's PyTorch CUDA lines, run on the same card).
 *
 *   copy_bw           the peer: cuMemcpyDtoDAsync of 256M f32 (1 GiB) from a random tensor
 *                     into a second buffer; bytes = read + written (2 GiB)
 *   fused_chain_256M  y = relu(x * 1.5 - 1) * 0.5 - 0.25 on x [256M] f32 (5 ops, scalars
 *                     only), recorded and realized as one nb_eval; bytes = x read + y written
 *   softmax_rows      nb_softmax(x, -1), x [65536, 1024] f32; bytes = x read + y written
 *   layer_norm_rows   nb_layer_norm(x, w, b, 1e-5), x [65536, 1024] f32, w and b [1024];
 *                     bytes = x read + y written (w and b, 8 KiB, not counted)
 *   mlp784_step       bench_train.c's 784-1024-1024-10 MLP, batch 256, relu, softmax
 *                     cross-entropy with integer labels, SGD lr 0.01, in bench_train's jit
 *                     style (one nb_jit'd nb_fn returning the loss and the updated
 *                     parameters, rebound with nb_assign); f32 (NB_PRECISION_HIGHEST, the
 *                     default) and a second line with TF32 (NB_PRECISION_HIGH)
 *   transformer_step  bench_train.c's transformer block (d 256, 4 heads, seq 128, batch 8,
 *                     pre-LN attention + 4x GELU MLP, loss = mean of the output), forward and
 *                     all 16 gradients: nb_jit of nb_value_and_grad (bench_train's jit style)
 *   launch_overhead   a jitted chain of K tanh kernels on 4 floats alternating between shapes
 *                     [4] and [2, 2] so no two fuse (bench_jit.c's per_kernel chain), K = 1
 *                     and K = 64; per kernel = (t64 - t1) / (kernels64 - kernels1), the kernel
 *                     counts measured with nb_stats.kernels_run (63 when nothing fuses)
 *
 * How time is measured:
 *  - copy_bw, fused_chain, softmax_rows, layer_norm_rows: device time with CUDA events
 *    (nbi_cu.cuEventRecord / cuEventElapsedTime on the device's compute stream, the stream
 *    every nabla kernel is queued on): each repetition between its own pair of events,
 *    repetitions queued back to back in blocks of PER_PASS as a program queues them (a
 *    nabla repetition records the ops and realizes them in a scope: graph, plan-cache
 *    lookup and a fresh output buffer from the caching allocator; its host work overlaps
 *    the GPU's work on the repetition before), the device synchronized after each block;
 *    one untimed warm-up per block; the cases take turns over PASSES passes. Reported: the
 *    median of PASSES x PER_PASS = 30 repetitions; GB/s = bytes / median (1 GB = 1e9 B);
 *    ratio = GB/s over copy_bw's.
 *  - mlp784_step, transformer_step: wall clock of each step, which ends by reading the loss
 *    with nb_item (a device synchronization, as bench_train.c and the PyTorch peer's
 *    loss.item() do): the median over STEPS steps after WARMUP. Also `pipelined_s`: the
 *    same number of steps queued back to back with only the last loss read, total / steps.
 *  - launch_overhead: wall clock of each call (nb_call of the jitted chain, nb_eval of its
 *    output, cuStreamSynchronize of the compute stream), median of LAUNCH_CALLS calls.
 * Inputs are random (nb_rand / nb_glorot_uniform), never zeros; zero biases as bench_train.
 *
 *   bench_cuda           full sizes (about 10 s of GPU work; NVRTC compiles on the first
 *                        run of a machine add to it, they are cached on disk afterwards)
 *   bench_cuda --smoke   tiny sizes, few repetitions (build, link and run check)
 *   bench_cuda --cpu     the same cases on NB_CPU, wall clock, memcpy as the copy peer: a
 *                        check of this program's logic on a machine without a GPU, not a
 *                        measurement (use with --smoke)
 *   bench_cuda --case NAME   only that case (copy_bw is always run for the ratios)
 *
 * One JSON line per case, then a table. A case that fails prints a JSON line with its error
 * and the others still run (exit status 1 at the end). Without `make CUDA=1`, or without a
 * GPU, it prints one line saying so and exits 0. */
#include <nabla/nabla.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/backends/backend.h"
#include "bench_common.h"

#ifdef NABLA_CUDA
#include "../src/backends/cuda/cuda_be.h"
#endif

#define PASSES 3
#define PER_PASS 10
#define LR 0.01
#define MAX_IN 20

static bool smoke, on_cpu;
static const char *dev_name = "cpu:0";

/* A case runs under run_guarded: a failure prints a JSON line with the error and goes on
 * with the next case (one GPU run reports every case that works). */
static jmp_buf case_jmp;
static bool case_armed;
static const char *case_now = "setup";

/* Prints a failed step; returns to run_guarded, or exits outside a case. */
static void die(const char *what, const char *why) {
  fprintf(stderr, "bench_cuda: %s: %s failed: %s\n", case_now, what, why ? why : "");
  if (!case_armed) exit(1);
  printf("{\"case\":\"%s\",\"error\":\"%s failed: ", case_now, what);
  for (const char *c = why ? why : ""; *c; c++) /* a JSON string */
    if (*c == '"' || *c == '\\')
      printf("\\%c", *c);
    else if ((unsigned char)*c >= 0x20)
      putchar(*c);
  printf("\"}\n");
  fflush(stdout);
  longjmp(case_jmp, 1);
}

/* Runs fn(user) as case `name`; false when it failed (die). */
static bool run_guarded(const char *name, void (*fn)(void *), void *user) {
  case_now = name;
  if (setjmp(case_jmp)) {
    case_armed = false;
    nb_clear_error();
    return false;
  }
  case_armed = true;
  fn(user);
  case_armed = false;
  return true;
}

/* ---- device timing ------------------------------------------------------------------------ */
#ifdef NABLA_CUDA
static nbi_cuda_ctx *cu; /* NULL when running on the CPU */
static CUevent ev0[PER_PASS], ev1[PER_PASS];

/* Exits with the driver error's name unless r is CUDA_SUCCESS. */
static void check_cu(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS) {
    const char *s = NULL;
    if (nbi_cu.cuGetErrorName) nbi_cu.cuGetErrorName(r, &s);
    die(what, s ? s : "CUDA error");
  }
}
#endif

/* Waits for every kernel queued so far (the CPU backend runs them before returning). */
static void device_sync(void) {
#ifdef NABLA_CUDA
  if (cu) check_cu(nbi_cu.cuStreamSynchronize(cu->stream), "cuStreamSynchronize");
#endif
}

typedef void (*rep_fn)(void *user);

/* Runs fn(user) count times (count <= PER_PASS) queued back to back; t[r] = seconds of
 * repetition r. CUDA: device time between a pair of events on the compute stream around
 * each repetition, the stream synchronized once after the block. CPU: wall clock. */
static void time_block(rep_fn fn, void *user, int count, double *t) {
#ifdef NABLA_CUDA
  if (cu) {
    for (int r = 0; r < count; r++) {
      check_cu(nbi_cu.cuEventRecord(ev0[r], cu->stream), "cuEventRecord");
      fn(user);
      check_cu(nbi_cu.cuEventRecord(ev1[r], cu->stream), "cuEventRecord");
    }
    check_cu(nbi_cu.cuEventSynchronize(ev1[count - 1]), "cuEventSynchronize");
    for (int r = 0; r < count; r++) {
      float ms = 0;
      check_cu(nbi_cu.cuEventElapsedTime(&ms, ev0[r], ev1[r]), "cuEventElapsedTime");
      t[r] = 1e-3 * ms;
    }
    return;
  }
#endif
  for (int r = 0; r < count; r++) {
    double t0 = now_s();
    fn(user);
    device_sync();
    t[r] = now_s() - t0;
  }
}

/* ---- the bandwidth cases ------------------------------------------------------------------ */
enum { B_COPY, B_CHAIN, B_SOFTMAX, B_LAYER_NORM, N_BW };
static const char *const bw_names[N_BW] = {"copy_bw", "fused_chain", "softmax_rows",
                                           "layer_norm_rows"};
static char chain_name[32]; /* "fused_chain_256M" at full size */

typedef struct bw_data {
  int64_t n, rows, cols;
  nb_tensor *x;            /* [n], random, realized */
  nb_tensor *rx, *lw, *lb; /* [rows, cols], [cols], [cols] */
  void *copy_dst;          /* the copy peer's destination: n floats on the device */
  int kind;                /* the case a repetition runs */
} bw_data;

/* One repetition of d->kind: the copy, or the nabla ops recorded and realized in a scope. */
static void bw_rep(void *user) {
  bw_data *d = user;
  if (d->kind == B_COPY) {
    const char *src = nbi_tensor_view(d->x).data;
    size_t bytes = (size_t)d->n * sizeof(float);
#ifdef NABLA_CUDA
    if (cu) {
      check_cu(nbi_cu.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)d->copy_dst,
                                        (CUdeviceptr)(uintptr_t)src, bytes, cu->stream),
               "cuMemcpyDtoDAsync");
      return;
    }
#endif
    memcpy(d->copy_dst, src, bytes);
    return;
  }
  nb_scope_begin();
  nb_tensor *y;
  if (d->kind == B_CHAIN)
    y = nb_sub_scalar(nb_mul_scalar(nb_relu(nb_sub_scalar(nb_mul_scalar(d->x, 1.5), 1.0)), 0.5),
                      0.25);
  else if (d->kind == B_SOFTMAX)
    y = nb_softmax(d->rx, -1);
  else
    y = nb_layer_norm(d->rx, d->lw, d->lb, 1e-5);
  if (!y || nb_eval(&y, 1)) die(bw_names[d->kind], nb_last_error());
  nb_scope_end();
}

static double bw_bytes(const bw_data *d, int k) {
  return k <= B_CHAIN ? 2.0 * (double)d->n * sizeof(float)
                      : 2.0 * (double)d->rows * (double)d->cols * sizeof(float);
}

/* ---- the training steps (the definitions of bench_train.c) ---------------------------------- */
/* 784-1024-1024-10 MLP, batch 256: in = W0 b0 W1 b1 W2 b2, x [256, 784], labels [256] i32 */
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

/* Transformer block: in = g1 b1 wq bq wk bk wv bv wo bo g2 b2 w1 c1 w2 c2; x captured. */
enum { D = 256, HEADS = 4, SEQ = 128, BATCH = 8, HIDDEN = 1024 };
static nb_tensor *block_x;

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

typedef struct step_result {
  double median_s, pipelined_s, first_s, loss, kernels_per_step, realizations_per_step;
  double first_compile_s; /* of first_s: inside NVRTC */
  uint64_t first_compiles;
  int steps;
} step_result;

/* One step of the jitted program `call` on in[]: the MLP (update: rebinds the parameters to
 * its outputs) or the transformer (realizes the loss and every gradient). Reads the loss
 * when read_loss (a device synchronization). */
static double one_step(nb_fn *call, nb_tensor **in, int np, bool update, bool read_loss) {
  double loss = 0;
  nb_scope_begin();
  nb_tensor *o[MAX_IN + 1];
  if (nb_call(call, in, o)) die("a training step", nb_last_error());
  if (update) {
    for (int i = 0; i < np; i++)
      if (nb_assign(in[i], o[1 + i])) die("nb_assign", nb_last_error());
  } else if (nb_eval(o, 1 + np)) {
    die("nb_eval", nb_last_error());
  }
  if (read_loss) {
    loss = nb_item(o[0]);
    if (nb_last_status()) die("nb_item", nb_last_error());
  }
  nb_scope_end();
  return loss;
}

/* Times the MLP-784 step (transformer false) or the transformer block. */
/* NVRTC's compiles and seconds so far in this process (zeros without CUDA). */
static void nvrtc_so_far(uint64_t *n, double *secs) {
#ifdef NABLA_CUDA
  nbi_cuda_cache_stats c = nbi_cuda_cache_get_stats();
  *n = c.compiles, *secs = c.compile_s;
#else
  *n = 0, *secs = 0;
#endif
}

static step_result run_steps(bool transformer) {
  int np = transformer ? 16 : 6, n_in = transformer ? 16 : 8;
  int warmup = smoke ? 1 : transformer ? 5 : 10, steps = smoke ? 3 : transformer ? 30 : 50;
  step_result r = {.steps = steps};
  nb_seed(0);
  nb_scope_begin(); /* holds the parameters and data */
  nb_tensor *in[MAX_IN + 1];
  if (transformer)
    block_init(in);
  else
    mlp784_init(in);
  if (nb_eval(in, n_in)) die("making the parameters", nb_last_error());
  nb_fn *f = nb_fn_create(transformer ? block_loss : mlp784_loss, NULL, n_in, 1), *step_fn = NULL;
  nb_fn *vg =
      transformer ? nb_value_and_grad(f, NB_ALL) : nb_value_and_grad(f, NB_AXES(0, 1, 2, 3, 4, 5));
  sgd_step sgd = {vg, np};
  if (!transformer) step_fn = nb_fn_create(sgd_body, &sgd, n_in, 1 + np);
  nb_fn *call = nb_jit(transformer ? vg : step_fn);
  if (!call) die("nb_jit", nb_last_error());
  double *t = malloc(sizeof(double) * (size_t)steps);
  nb_stats s0 = {0};
  for (int step = -warmup; step < steps; step++) {
    if (step == 0) s0 = nb_get_stats();
    uint64_t n0, n1;
    double c0, c1;
    nvrtc_so_far(&n0, &c0);
    double t0 = now_s();
    r.loss = one_step(call, in, np, !transformer, true);
    double dt = now_s() - t0;
    if (step == -warmup) {
      nvrtc_so_far(&n1, &c1);
      r.first_s = dt;
      r.first_compile_s = c1 - c0;
      r.first_compiles = n1 - n0;
    }
    if (step >= 0) t[step] = dt;
  }
  nb_stats s1 = nb_get_stats();
  r.kernels_per_step = (double)(s1.kernels_run - s0.kernels_run) / steps;
  r.realizations_per_step = (double)(s1.realizations - s0.realizations) / steps;
  r.median_s = median(t, steps);
  double t0 = now_s();
  for (int step = 0; step < steps; step++)
    one_step(call, in, np, !transformer, step == steps - 1);
  r.pipelined_s = (now_s() - t0) / steps;
  free(t);
  nb_fn_release(call);
  nb_fn_release(step_fn);
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_scope_end();
  return r;
}

/* ---- launch overhead ---------------------------------------------------------------------- */
/* K tanh kernels alternating between [4] and [2, 2] (user = &K) */
static nb_status tanh_chain(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  int k = *(const int *)u;
  nb_tensor *y = in[0];
  for (int i = 0; i < k; i++)
    y = nb_tanh(nb_reshape(y, i % 2 ? NB_SHAPE(4) : NB_SHAPE(2, 2)));
  out[0] = nb_reshape(y, NB_SHAPE(4));
  return out[0] ? NB_OK : nb_last_status();
}

/* One call of the jitted chain, its output realized, the device synchronized. */
static void chain_call(nb_fn *jc, nb_tensor *x) {
  nb_scope_begin();
  nb_tensor *o;
  if (nb_call(jc, &x, &o) || nb_eval(&o, 1)) die("launch_overhead", nb_last_error());
  nb_scope_end();
  device_sync();
}

typedef struct launch_result {
  double median_s[2];
  uint64_t kernels[2];
  int calls;
} launch_result;

static launch_result run_launch(void) {
  static int ks[2] = {1, 64};
  launch_result r = {.calls = smoke ? 20 : 2000};
  double *t = malloc(sizeof(double) * (size_t)r.calls);
  nb_scope_begin();
  nb_tensor *x = nb_rand(NB_SHAPE(4), NB_F32);
  if (!x || nb_eval(&x, 1)) die("launch_overhead input", nb_last_error());
  for (int i = 0; i < 2; i++) {
    nb_fn *c = nb_fn_create(tanh_chain, &ks[i], 1, 1), *jc = nb_jit(c);
    for (int w = 0; w < 20; w++) /* trace, plan, compile, warm */
      chain_call(jc, x);
    nb_stats before = nb_get_stats();
    chain_call(jc, x);
    r.kernels[i] = nb_get_stats().kernels_run - before.kernels_run;
    for (int k = 0; k < r.calls; k++) {
      double t0 = now_s();
      chain_call(jc, x);
      t[k] = now_s() - t0;
    }
    r.median_s[i] = median(t, r.calls);
    nb_fn_release(jc);
    nb_fn_release(c);
  }
  nb_scope_end();
  free(t);
  return r;
}

/* ---- the bandwidth section ----------------------------------------------------------------- */
typedef struct bw_results {
  bool run[N_BW], done;
  double med[N_BW], gbps[N_BW];
  uint64_t kernels[N_BW], extra_mib[N_BW];
  bw_data d;
} bw_results;

static void size_str(const bw_data *d, int k, char *buf, size_t cap) {
  if (k <= B_CHAIN)
    snprintf(buf, cap, "%lld", (long long)d->n);
  else
    snprintf(buf, cap, "%lldx%lld", (long long)d->rows, (long long)d->cols);
}

static const char *bw_case_name(int k) { return k == B_CHAIN ? chain_name : bw_names[k]; }

/* Makes the inputs, times the cases that res->run selects (they take turns over the passes)
 * and prints their JSON lines. */
static void bench_bw(void *user) {
  bw_results *res = user;
  bw_data *d = &res->d;
  nb_seed(1);
  nb_scope_begin();
  /* x: random on the device; drawn as [16, n/16] = a random row + a random value per row
   * block, so the host draws n/16 + 16 values instead of n (256M draws take seconds). */
  nb_tensor *xr = nb_rand(NB_SHAPE(d->n / 16), NB_F32), *xb = nb_rand(NB_SHAPE(16, 1), NB_F32);
  d->x = nb_reshape(nb_add(xr, nb_mul_scalar(xb, 0.5)), NB_SHAPE(d->n));
  d->rx = nb_rand(NB_SHAPE(d->rows, d->cols), NB_F32);
  d->lw = nb_rand(NB_SHAPE(d->cols), NB_F32);
  d->lb = nb_rand(NB_SHAPE(d->cols), NB_F32);
  nb_tensor *inputs[] = {d->x, d->rx, d->lw, d->lb};
  if (!d->x || !d->rx || !d->lw || !d->lb || nb_eval(inputs, 4))
    die("making the inputs", nb_last_error());
  size_t bytes = (size_t)d->n * sizeof(float);
  d->copy_dst = NULL;
#ifdef NABLA_CUDA
  if (cu) {
    d->copy_dst = (void *)(uintptr_t)nbi_cuda_alloc_block(cu->alloc, bytes);
    if (!d->copy_dst) die("allocating the copy's destination", nb_last_error());
  }
#endif
  if (!d->copy_dst && !(d->copy_dst = malloc(bytes))) die("allocating", "out of memory");
  int per_pass = smoke ? 1 : PER_PASS, passes = smoke ? 1 : PASSES, rounds = per_pass * passes;
  double times[N_BW][PASSES * PER_PASS];
  for (int pass = 0; pass < passes; pass++)
    for (int k = 0; k < N_BW; k++) {
      if (!res->run[k]) continue;
      case_now = bw_case_name(k);
      d->kind = k;
      bw_rep(d); /* warm-up */
      time_block(bw_rep, d, per_pass, times[k] + pass * per_pass);
    }
  for (int k = 0; k < N_BW; k++) {
    if (!res->run[k]) continue;
    case_now = bw_case_name(k);
    res->med[k] = median(times[k], rounds);
    res->gbps[k] = bw_bytes(d, k) / res->med[k] * 1e-9;
    if (k == B_COPY) continue;
    /* kernels of one realization; buffer memory it holds at its peak beyond its inputs */
    device_sync();
    nb_reset_stats();
    nb_stats s0 = nb_get_stats();
    d->kind = k;
    bw_rep(d);
    device_sync();
    nb_stats s1 = nb_get_stats();
    res->kernels[k] = s1.kernels_run - s0.kernels_run;
    res->extra_mib[k] = (s1.peak_bytes - s0.live_bytes) >> 20;
  }
  for (int k = 0; k < N_BW; k++) {
    if (!res->run[k]) continue;
    char size[48];
    size_str(d, k, size, sizeof size);
    printf("{\"case\":\"%s\",\"size\":\"%s\",\"impl\":\"%s\",\"median_s\":%.6g,\"gbps\":%.1f,"
           "\"peer\":\"%s\",\"ratio\":%.3f,",
           bw_case_name(k), size,
           k != B_COPY ? "nabla"
           : on_cpu    ? "memcpy"
                       : "cuMemcpyDtoDAsync",
           res->med[k], res->gbps[k], on_cpu ? "memcpy" : "cuda_memcpy_dtod",
           res->gbps[k] / res->gbps[B_COPY]);
    if (k != B_COPY)
      printf("\"kernels\":%llu,\"peak_extra_mib\":%llu,", (unsigned long long)res->kernels[k],
             (unsigned long long)res->extra_mib[k]);
    printf("\"bytes\":%.0f,\"runs\":%d,\"clock\":\"%s\",\"device\":\"%s\"}\n", bw_bytes(d, k),
           rounds, on_cpu ? "wall" : "cuda_events", dev_name);
    fflush(stdout);
  }
#ifdef NABLA_CUDA
  if (cu)
    nbi_cuda_free_block(cu->alloc, (CUdeviceptr)(uintptr_t)d->copy_dst);
  else
#endif
    free(d->copy_dst);
  nb_scope_end();
  res->done = true;
}

/* ---- the step and launch sections --------------------------------------------------------- */
enum { S_MLP, S_MLP_TF32, S_TRANSFORMER, N_STEPS };
static const char *const step_case[N_STEPS] = {"mlp784_step", "mlp784_step", "transformer_step"};
static const char *const step_prec[N_STEPS] = {"f32", "tf32", "f32"};

typedef struct step_job {
  int s;
  step_result r;
} step_job;

static void bench_step(void *user) {
  step_job *j = user;
  nb_set_matmul_precision(j->s == S_MLP_TF32 ? NB_PRECISION_HIGH : NB_PRECISION_HIGHEST);
  step_result r = run_steps(j->s == S_TRANSFORMER);
  nb_set_matmul_precision(NB_PRECISION_HIGHEST);
  printf("{\"case\":\"%s\",\"precision\":\"%s\",\"impl\":\"nabla\",\"style\":\"jit\","
         "\"median_s\":%.6g,\"pipelined_s\":%.6g,\"first_step_s\":%.4g,"
         "\"first_step_nvrtc_s\":%.4g,\"first_step_compiles\":%llu,\"steps\":%d,"
         "\"kernels_per_step\":%.1f,\"realizations_per_step\":%.2f,\"final_loss\":%.6f,"
         "\"clock\":\"wall, loss read each step\",\"device\":\"%s\"}\n",
         step_case[j->s], step_prec[j->s], r.median_s, r.pipelined_s, r.first_s, r.first_compile_s,
         (unsigned long long)r.first_compiles, r.steps, r.kernels_per_step, r.realizations_per_step,
         r.loss, dev_name);
  fflush(stdout);
  j->r = r;
}

typedef struct launch_job {
  launch_result r;
  double per_kernel;
} launch_job;

static void bench_launch(void *user) {
  launch_job *j = user;
  launch_result r = run_launch();
  uint64_t dk = r.kernels[1] > r.kernels[0] ? r.kernels[1] - r.kernels[0] : 1;
  j->per_kernel = (r.median_s[1] - r.median_s[0]) / (double)dk;
  printf("{\"case\":\"launch_overhead\",\"impl\":\"nabla\",\"style\":\"jit\",\"median_s\":%.6g,"
         "\"median_1_s\":%.6g,\"median_64_s\":%.6g,\"kernels_1\":%llu,\"kernels_64\":%llu,"
         "\"calls\":%d,\"clock\":\"wall, synchronized each call\",\"device\":\"%s\"}\n",
         j->per_kernel, r.median_s[0], r.median_s[1], (unsigned long long)r.kernels[0],
         (unsigned long long)r.kernels[1], r.calls, dev_name);
  fflush(stdout);
  j->r = r;
}

/* ---- main --------------------------------------------------------------------------------- */
/* only selects cases by prefix ("mlp784" selects both MLP lines); NULL selects all. */
static bool wanted(const char *only, const char *name) {
  return !only || strncmp(only, name, strlen(only)) == 0;
}

int main(int argc, char **argv) {
  const char *only = NULL;
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--smoke") == 0)
      smoke = true;
    else if (strcmp(argv[a], "--cpu") == 0)
      on_cpu = true;
    else if (strcmp(argv[a], "--case") == 0 && a + 1 < argc)
      only = argv[++a];
    else {
      fprintf(stderr, "usage: bench_cuda [--smoke] [--cpu] [--case NAME]\n");
      return 2;
    }
  }
  if (!on_cpu) {
#ifndef NABLA_CUDA
    printf("{\"case\":\"bench_cuda\",\"skipped\":\"built without CUDA=1\"}\n");
    printf("bench_cuda: skipped (build with make CUDA=1)\n");
    return 0;
#else
    if (nb_device_count(NB_DEVICE_CUDA) == 0) {
      printf("{\"case\":\"bench_cuda\",\"skipped\":\"no CUDA device\"}\n");
      printf("bench_cuda: skipped (no CUDA device: %s)\n", nbi_cuda_why());
      return 0;
    }
    int dev = nbi_device_lookup("bench_cuda", NB_CUDA(0));
    if (dev < 0 || nb_set_default_device(NB_CUDA(0))) die("opening cuda:0", nb_last_error());
    cu = (nbi_cuda_ctx *)nbi_device_at(dev)->ctx;
    if (nbi_cuda_enter(cu)) die("making cuda:0 current", nb_last_error());
    for (int r = 0; r < PER_PASS; r++) {
      check_cu(nbi_cu.cuEventCreate(&ev0[r], CU_EVENT_DEFAULT), "cuEventCreate");
      check_cu(nbi_cu.cuEventCreate(&ev1[r], CU_EVENT_DEFAULT), "cuEventCreate");
    }
    dev_name = cu->name;
#endif
  }
  nb_set_matmul_precision(NB_PRECISION_HIGHEST); /* TF32 off unless a case asks */
  double t_start = now_s();

  static bw_results bw;
  bw.d = (bw_data){.n = smoke ? (int64_t)1 << 16 : (int64_t)256 << 20,
                   .rows = smoke ? 64 : 65536,
                   .cols = smoke ? 128 : 1024};
  snprintf(chain_name, sizeof chain_name, "fused_chain_%lld%s",
           (long long)(bw.d.n >= (1 << 20) ? bw.d.n >> 20 : bw.d.n >> 10),
           bw.d.n >= (1 << 20) ? "M" : "K");
  bool any_bw = false;
  for (int k = 0; k < N_BW; k++) {
    bw.run[k] = k == B_COPY || wanted(only, bw_case_name(k));
    any_bw |= wanted(only, bw_case_name(k));
  }
  int failed = 0;
  if (any_bw) failed += !run_guarded("bandwidth", bench_bw, &bw);
  step_job steps[N_STEPS] = {{0}};
  for (int s = 0; s < N_STEPS; s++) {
    steps[s].s = s;
    if (wanted(only, step_case[s])) failed += !run_guarded(step_case[s], bench_step, &steps[s]);
  }
  launch_job launch = {0};
  if (wanted(only, "launch_overhead"))
    failed += !run_guarded("launch_overhead", bench_launch, &launch);

  /* -- table -- */
  printf("\nbench_cuda on %s%s (%.1f s in all); ratio = GB/s over copy_bw's (target >= 0.85)\n",
         dev_name, smoke ? ", --smoke" : "", now_s() - t_start);
  if (any_bw)
    printf("%-18s %14s %11s %9s %7s %8s\n", "case", "size", "median_ms", "GB/s", "ratio",
           "kernels");
  for (int k = 0; k < N_BW && bw.done; k++) {
    if (!bw.run[k]) continue;
    char size[48];
    size_str(&bw.d, k, size, sizeof size);
    printf("%-18s %14s %11.3f %9.1f %7.3f", bw_case_name(k), size, bw.med[k] * 1e3, bw.gbps[k],
           bw.gbps[k] / bw.gbps[B_COPY]);
    if (k == B_COPY)
      printf(" %8s\n", "-");
    else
      printf(" %8llu\n", (unsigned long long)bw.kernels[k]);
  }
  if (any_bw && !bw.done) printf("(bandwidth cases failed: see the error line)\n");
  printf("\n%-18s %5s %11s %13s %10s %9s %8s\n", "step", "prec", "median_ms", "pipelined_ms",
         "kernels", "first_s", "nvrtc_s");
  for (int s = 0; s < N_STEPS; s++)
    if (steps[s].r.steps)
      printf("%-18s %5s %11.3f %13.3f %10.1f %9.2f %8.2f (%llu kernels compiled)\n", step_case[s],
             step_prec[s], steps[s].r.median_s * 1e3, steps[s].r.pipelined_s * 1e3,
             steps[s].r.kernels_per_step, steps[s].r.first_s, steps[s].r.first_compile_s,
             (unsigned long long)steps[s].r.first_compiles);
    else if (wanted(only, step_case[s]))
      printf("%-18s %5s %11s\n", step_case[s], step_prec[s], "failed");
  if (launch.r.calls)
    printf("\nlaunch_overhead: %.2f us per kernel (K=1: %.2f us, %llu kernels; K=64: %.2f us, %llu "
           "kernels)\n",
           launch.per_kernel * 1e6, launch.r.median_s[0] * 1e6,
           (unsigned long long)launch.r.kernels[0], launch.r.median_s[1] * 1e6,
           (unsigned long long)launch.r.kernels[1]);
  else if (wanted(only, "launch_overhead"))
    printf("\nlaunch_overhead: failed\n");
#ifdef NABLA_CUDA
  if (cu)
    for (int r = 0; r < PER_PASS; r++) {
      nbi_cu.cuEventDestroy(ev0[r]);
      nbi_cu.cuEventDestroy(ev1[r]);
    }
#endif
  nb_release(block_x);
  if (failed) printf("\nbench_cuda: %d case(s) failed (their error lines above)\n", failed);
  return failed ? 1 : 0;
}
