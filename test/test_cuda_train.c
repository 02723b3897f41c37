/* test/test_cuda_train.c — training on NB_CUDA(0) against the CPU: the README MLP in
 * both styles, its jitted step, and a long loop whose device memory stays flat.
 * Skips where no GPU is (nb_device_count(NB_DEVICE_CUDA) == 0). */
#include "common.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef NABLA_CUDA

TestSuite(cuda_train, .init = tc_setup, .fini = tc_teardown);

#define SKIP_WITHOUT_GPU()                                                                         \
  do {                                                                                             \
    if (nb_device_count(NB_DEVICE_CUDA) == 0) cr_skip_test("no CUDA device: %s", nbi_cuda_why());  \
  } while (0)
const char *nbi_cuda_why(void);
#include "../src/backends/cuda/cuda_be.h"
/* The loaded driver's cuMemcpyDtoDAsync, for the custom op's CUDA kernel. */
static void nbi_cuda_test_dtod(CUresult (**f)(CUdeviceptr, CUdeviceptr, size_t, CUstream)) {
  *f = nbi_cu.cuMemcpyDtoDAsync;
}

static const int64_t layers[5] = {1, 32, 64, 32, 1};

/* W0 b0 .. W3 b3 on the default device, the same values on every device. */
static void init_params(nb_tensor **p) {
  nb_seed(0);
  for (int i = 0; i < 4; i++) {
    p[2 * i] = nb_glorot_uniform(NB_SHAPE(layers[i], layers[i + 1]), NB_F32);
    p[2 * i + 1] = nb_zeros(NB_SHAPE(1, layers[i + 1]), NB_F32);
  }
}

static nb_tensor *forward_loss(nb_tensor *const *p, nb_tensor *x, nb_tensor *y) {
  nb_tensor *h = x;
  for (int i = 0; i < 4; i++) {
    h = nb_add(nb_matmul(h, p[2 * i]), p[2 * i + 1]);
    if (i < 3) h = nb_relu(h);
  }
  return nb_mean(nb_square(nb_sub(h, y)), NB_ALL, false);
}

static nb_status loss_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = forward_loss(in, in[8], in[9]);
  return out[0] ? NB_OK : nb_last_status();
}

enum { STEPS = 301 };

/* The README MLP, batch 256, SGD 0.01, on device d: losses every 50 steps, in
 * the functional style (jit when jit), else the imperative one. */
static void train(nb_device d, int style, double *losses) {
  cr_assert_eq(nb_set_default_device(d), NB_OK, "%s", nb_last_error());
  nb_seed(42);
  nb_tensor *p[10];
  p[8] = nb_rand(NB_SHAPE(256, 1), NB_F32);
  p[9] = nb_rand(NB_SHAPE(256, 1), NB_F32);
  init_params(p);
  nb_fn *f = nb_fn_create(loss_fn, NULL, 10, 1);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1, 2, 3, 4, 5, 6, 7));
  nb_fn *step = style == 1 ? nb_jit(vg) : vg;
  for (int i = 0; style == 2 && i < 8; i++)
    nb_set_requires_grad(p[i], true);
  for (int s = 0; s < STEPS; s++) {
    nb_scope_begin();
    nb_tensor *loss;
    if (style == 2) {
      loss = forward_loss(p, p[8], p[9]);
      cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
      for (int i = 0; i < 8; i++) {
        nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(nb_grad_of(p[i]), 0.01)));
        nb_zero_grad(p[i]);
      }
    } else {
      nb_tensor *o[9];
      cr_assert_eq(nb_call(step, p, o), NB_OK, "%s", nb_last_error());
      for (int i = 0; i < 8; i++)
        nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(o[1 + i], 0.01)));
      loss = o[0];
    }
    if (s % 50 == 0) losses[s / 50] = nb_item(loss);
    nb_scope_end();
  }
  cr_assert_eq(nb_last_status(), NB_OK, "%s", nb_last_error());
  if (step != vg) nb_fn_release(step);
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_set_default_device(NB_CPU);
}

static void compare_styles(int style) {
  double cpu[STEPS / 50 + 1], gpu[STEPS / 50 + 1];
  train(NB_CPU, style, cpu);
  train(NB_CUDA(0), style, gpu);
  for (int i = 0; i <= STEPS / 50; i++)
    cr_expect(fabs(cpu[i] - gpu[i]) <= 1e-4 * fabs(cpu[i]) + 1e-6,
              "style %d step %d: cpu %.8g cuda %.8g", style, i * 50, cpu[i], gpu[i]);
}

Test(cuda_train, readme_mlp_functional_losses_match_the_cpu) {
  SKIP_WITHOUT_GPU();
  compare_styles(0);
}

Test(cuda_train, readme_mlp_jitted_losses_match_the_cpu) {
  SKIP_WITHOUT_GPU();
  compare_styles(1);
}

Test(cuda_train, readme_mlp_backward_losses_match_the_cpu) {
  SKIP_WITHOUT_GPU();
  compare_styles(2);
}

/* 10,000 jitted steps: after the first few, no buffer is added on the device. */
Test(cuda_train, ten_thousand_steps_keep_device_memory_flat) {
  SKIP_WITHOUT_GPU();
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK);
  nb_seed(42);
  nb_tensor *p[10];
  p[8] = nb_rand(NB_SHAPE(256, 1), NB_F32);
  p[9] = nb_rand(NB_SHAPE(256, 1), NB_F32);
  init_params(p);
  nb_fn *f = nb_fn_create(loss_fn, NULL, 10, 1);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1, 2, 3, 4, 5, 6, 7));
  nb_fn *step = nb_jit(vg);
  uint64_t live_at_100 = 0, peak_at_100 = 0;
  double first = 0, last = 0;
  for (int s = 0; s < 10000; s++) {
    nb_scope_begin();
    nb_tensor *o[9];
    cr_assert_eq(nb_call(step, p, o), NB_OK, "%s", nb_last_error());
    for (int i = 0; i < 8; i++)
      nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(o[1 + i], 0.01)));
    if (s == 0) first = nb_item(o[0]);
    if (s == 9999) last = nb_item(o[0]);
    nb_scope_end();
    if (s == 100) {
      nb_stats st = nb_get_stats();
      live_at_100 = st.live_bytes, peak_at_100 = st.peak_bytes;
    }
  }
  nb_stats st = nb_get_stats();
  cr_expect_eq(st.live_bytes, live_at_100, "live bytes grew from %llu to %llu",
               (unsigned long long)live_at_100, (unsigned long long)st.live_bytes);
  cr_expect_eq(st.peak_bytes, peak_at_100, "peak grew from %llu to %llu",
               (unsigned long long)peak_at_100, (unsigned long long)st.peak_bytes);
  cr_expect(last < first, "the loss fell: %g -> %g", first, last);
  nb_fn_release(step);
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_set_default_device(NB_CPU);
}

/* A program with a while loop, a checkpoint and a custom-free composite runs on
 * CUDA with its predicate read by one sync per iteration: values as the CPU. */
static nb_status cond_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_lt(nb_sum(in[0], NB_ALL, false), nb_scalar(100.0, NB_F32));
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status double_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_mul_scalar(in[0], 2.0);
  return out[0] ? NB_OK : nb_last_status();
}

Test(cuda_train, while_loop_and_checkpoint_run_on_cuda) {
  SKIP_WITHOUT_GPU();
  float res[2][4];
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(nb_set_default_device(k ? NB_CUDA(0) : NB_CPU), NB_OK);
    float h[4] = {0.5f, 1.0f, 1.5f, 2.0f};
    nb_tensor *x = nb_from_data(h, NB_SHAPE(4), NB_F32), *o;
    nb_fn *c = nb_fn_create(cond_body, NULL, 1, 1), *b = nb_fn_create(double_body, NULL, 1, 1);
    nb_fn *cb = nb_checkpoint(b);
    cr_assert_eq(nb_while_loop(c, cb, &x, 1, &o), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_device_of(o).kind, k ? NB_DEVICE_CUDA : NB_DEVICE_CPU);
    cr_assert_eq(nb_to_host(o, res[k], sizeof res[k]), NB_OK, "%s", nb_last_error());
    nb_fn_release(c), nb_fn_release(b), nb_fn_release(cb);
  }
  nb_set_default_device(NB_CPU);
  for (int i = 0; i < 4; i++)
    cr_expect_eq(res[0][i], res[1][i]);
}

/* A realization's fused groups have their kernels compiled before it runs
 * (backend.h's prepare; on several threads): the launches then compile nothing. plan_values: groups of shapes
 * and ops no other test uses, new to the process; a kernel cache on disk from
 * an earlier run may hold them, and then nothing compiles at all. */
static void plan_values(nb_tensor *x, nb_tensor *w, nb_tensor **y, nb_tensor **c) {
  nb_tensor *a = nb_softmax(nb_mul(nb_tanh(x), w), -1);
  nb_tensor *b = nb_logsumexp(nb_add_scalar(nb_square(x), 0.25), NB_AXES(1), true);
  *c = nb_var(nb_sub(x, nb_mul(x, w)), NB_AXES(1), false);
  *y = nb_add(nb_mul(a, b), nb_expm1(nb_mul_scalar(x, 0.125)));
}

/* Realizes outs[0..n) in one plan and checks that every kernel it compiled
 * was compiled ahead (nbi_cuda_precompile), none at a launch. */
static void eval_compiled_ahead(nb_tensor **outs, int n) {
  nbi_cuda_cache_stats s0 = nbi_cuda_cache_get_stats();
  cr_assert_eq(nb_eval(outs, n), NB_OK, "%s", nb_last_error());
  nbi_cuda_cache_stats s1 = nbi_cuda_cache_get_stats();
  cr_assert_eq(s1.compiles - s0.compiles, s1.precompiles - s0.precompiles,
               "%llu kernels compiled, %llu of them ahead",
               (unsigned long long)(s1.compiles - s0.compiles),
               (unsigned long long)(s1.precompiles - s0.precompiles));
}

Test(cuda_train, a_plan_compiles_its_group_kernels_before_it_runs) {
  SKIP_WITHOUT_GPU();
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK);
  nb_tensor *x = nb_randn(NB_SHAPE(7, 93), NB_F64), *w = nb_randn(NB_SHAPE(93), NB_F64);
  cr_assert_eq(nb_eval((nb_tensor *[]){x, w}, 2), NB_OK, "%s", nb_last_error());
  nb_tensor *outs[2];
  plan_values(x, w, &outs[0], &outs[1]);
  eval_compiled_ahead(outs, 2);
  /* the same values as the CPU's */
  nb_set_default_device(NB_CPU);
  nb_tensor *ref[2];
  plan_values(nb_to_device(x, NB_CPU), nb_to_device(w, NB_CPU), &ref[0], &ref[1]);
  double *ry = tc_read(ref[0]), *rc = tc_read(ref[1]);
  tc_assert_close_tol(nb_to_device(outs[0], NB_CPU), ry, NB_SHAPE(7, 93), 1e-12);
  tc_assert_close_tol(nb_to_device(outs[1], NB_CPU), rc, NB_SHAPE(7), 1e-12);
  free(ry), free(rc);
}

/* The same for steps that run alone: generated single ops (a reduction over
 * the leading axis, softmax and cumsum along an axis) and the hand-written
 * kernels' modules (take and one_hot: the gather module). */
static void single_values(nb_tensor *x, nb_tensor *idx, nb_tensor **o) {
  o[0] = nb_sum(x, NB_AXES(0), false);
  o[1] = nb_softmax(x, 0);
  o[2] = nb_cumsum(x, 1);
  o[3] = nb_take(x, idx, 1);
  o[4] = nb_one_hot(idx, 41, NB_F64);
}

Test(cuda_train, a_plan_compiles_its_single_op_kernels_before_it_runs) {
  SKIP_WITHOUT_GPU();
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK);
  int64_t ih[3] = {40, 0, 17};
  nb_tensor *x = nb_randn(NB_SHAPE(5, 41), NB_F64), *idx = nb_from_data(ih, NB_SHAPE(3), NB_I64);
  cr_assert_eq(nb_eval((nb_tensor *[]){x, idx}, 2), NB_OK, "%s", nb_last_error());
  nb_tensor *outs[5];
  single_values(x, idx, outs);
  eval_compiled_ahead(outs, 5);
  nb_set_default_device(NB_CPU);
  nb_tensor *ref[5];
  single_values(nb_to_device(x, NB_CPU), nb_to_device(idx, NB_CPU), ref);
  for (int k = 0; k < 5; k++) {
    double *r = tc_read(ref[k]);
    tc_assert_close_tol(nb_to_device(outs[k], NB_CPU), r, nb_shape_of(ref[k]), 1e-12);
    free(r);
  }
}

/* A process that ends with CUDA tensors in its root scope and in the buffer
 * cache exits cleanly: core's destructors give their blocks back before the
 * devices close. An atexit handler used to close them first, so the blocks
 * went back to freed allocators: a use after free whose symptom varied (the
 * cuda:0-default suite hung in a freed lock at exit now and then; ASan sees
 * it every time). The parent runs this binary again on the helper test
 * below, which only acts in that child (NABLA_TEST_EXIT_CHILD), and waits
 * for it up to 120 s. */
Test(cuda_exit_child, holds_cuda_tensors_at_exit) {
  if (!getenv("NABLA_TEST_EXIT_CHILD"))
    cr_skip_test("the child of cuda_train::a_process_holding_cuda_tensors_exits");
  SKIP_WITHOUT_GPU();
  cr_assert_eq(nb_set_default_device(NB_CUDA(0)), NB_OK);
  nb_tensor *x = nb_randn(NB_SHAPE(64, 33), NB_F32);
  nb_tensor *y = nb_softmax(nb_mul_scalar(x, 2.0), 0);
  cr_assert_eq(nb_eval(&y, 1), NB_OK, "%s", nb_last_error());
  nb_scope_begin();
  cr_assert_eq(nb_eval((nb_tensor *[]){nb_exp(y)}, 1), NB_OK); /* its block goes to the cache */
  nb_scope_end();
  /* x and y stay in the root scope */
}

Test(cuda_train, a_process_holding_cuda_tensors_exits) {
  SKIP_WITHOUT_GPU();
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  cr_assert(len > 0);
  exe[len] = '\0';
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) { /* exec at once: the parent's CUDA state is not the child's */
    setenv("NABLA_TEST_EXIT_CHILD", "1", 1);
    unsetenv("BXFI_MAP"); /* else it starts as this worker's twin (Criterion's sandbox) */
    execl(exe, exe, "--jobs", "1", "--filter", "cuda_exit_child/*", (char *)NULL);
    _exit(127);
  }
  int status = 0;
  bool done = false;
  for (int i = 0; i < 1200 && !done; i++) {
    done = waitpid(pid, &status, WNOHANG) == pid;
    if (!done) usleep(100000);
  }
  if (!done) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  cr_assert(done, "the child did not exit within 120 s");
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child ended with status %d",
            status);
}

/* A custom op with a CUDA kernel runs it on CUDA tensors (device pointers, the
 * device's stream); the same op without one is refused when called there. The
 * op is an identity whose CUDA kernel copies on the stream (a user's kernel
 * would launch its own code there). */
static nb_status ident_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in,
                             nb_shape *os, nb_dtype *od, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  os[0] = is[0], od[0] = id[0];
  return NB_OK;
}
static nb_status ident_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                           int n_out) {
  (void)u, (void)n_in, (void)n_out;
  memcpy(out[0].data, in[0].data, (size_t)tc_numel(in[0].shape) * nb_dtype_size(in[0].dtype));
  return NB_OK;
}
static int cuda_kernel_calls;
static nb_status ident_cuda(void *u, void *stream, const nb_custom_buffer *in, int n_in,
                            nb_custom_buffer *out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  cuda_kernel_calls++;
  size_t n = (size_t)tc_numel(in[0].shape) * nb_dtype_size(in[0].dtype);
  /* the driver nabla opened (nbi_cu) is internal; the test reaches the same
   * function through the loaded library's symbol */
  CUresult (*copy)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = NULL;
  nbi_cuda_test_dtod(&copy);
  return copy && copy((CUdeviceptr)(uintptr_t)out[0].data, (CUdeviceptr)(uintptr_t)in[0].data, n,
                      (CUstream)stream) == CUDA_SUCCESS
             ? NB_OK
             : NB_ERR_DEVICE;
}

Test(cuda_train, custom_op_runs_its_cuda_kernel_on_cuda_tensors) {
  SKIP_WITHOUT_GPU();
  nb_custom_op_def with = {.name = "cuda_ident",
                           .n_in = 1,
                           .n_out = 1,
                           .infer = ident_infer,
                           .cpu = ident_cpu,
                           .cuda = ident_cuda};
  nb_custom_op_def without = with;
  without.name = "cpu_only_ident";
  without.cuda = NULL;
  const nb_custom_op *a = nb_custom_op_register(&with), *b = nb_custom_op_register(&without);
  cr_assert(a && b, "%s", nb_last_error());
  float h[5] = {1, -2, 3.5f, 4, 0.25f}, r[5];
  nb_tensor *x = nb_to_device(nb_from_data(h, NB_SHAPE(5), NB_F32), NB_CUDA(0)), *y;
  cr_assert_eq(nb_custom_call(a, &x, 1, &y, 1), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_device_of(y).kind, NB_DEVICE_CUDA);
  cr_assert_eq(nb_to_host(nb_mul_scalar(y, 2.0), r, sizeof r), NB_OK, "%s", nb_last_error());
  cr_expect_eq(cuda_kernel_calls, 1);
  for (int i = 0; i < 5; i++)
    cr_expect_eq(r[i], 2 * h[i]);
  cr_expect_eq(nb_custom_call(b, &x, 1, &y, 1), NB_ERR_DEVICE);
  cr_expect(strstr(nb_last_error(), "no CUDA kernel") != NULL, "%s", nb_last_error());
}

/* A sharded program on a mesh of one CUDA device and the CPU: the values and a
 * gradient of the unsharded program. */
static nb_tensor *mesh_loss(nb_tensor *x, nb_tensor *w1, nb_tensor *w2) {
  nb_tensor *h = nb_tanh(nb_matmul(x, w1));
  return nb_mean(nb_square(nb_matmul(h, w2)), NB_ALL, false);
}

Test(cuda_train, sharded_program_on_a_cuda_and_cpu_mesh_equals_unsharded) {
  SKIP_WITHOUT_GPU();
  nb_device devs[2] = {NB_CUDA(0), NB_CPU};
  nb_mesh *m = nb_mesh_create("x=2", devs, 2);
  cr_assert_not_null(m, "%s", nb_last_error());
  nb_seed(7);
  nb_tensor *x = nb_randn(NB_SHAPE(8, 6), NB_F64), *w1 = nb_randn(NB_SHAPE(6, 4), NB_F64),
            *w2 = nb_randn(NB_SHAPE(4, 3), NB_F64);
  for (int layout = 0; layout < 2; layout++) { /* data parallel, then Megatron */
    nb_tensor *xs = nb_shard(x, m, layout ? "_, _" : "x, _");
    nb_tensor *w1s = nb_shard(w1, m, layout ? "_, x" : "_, _");
    nb_tensor *w2s = nb_shard(w2, m, layout ? "x, _" : "_, _");
    cr_assert(xs && w1s && w2s, "%s", nb_last_error());
    double ref = nb_item(mesh_loss(x, w1, w2)), got = nb_item(mesh_loss(xs, w1s, w2s));
    cr_expect(fabs(got - ref) <= 1e-12 * fabs(ref), "layout %d: %.17g vs %.17g (%s)", layout, got,
              ref, nb_last_error());
    nb_set_requires_grad(w1s, true);
    nb_set_requires_grad(w1, true);
    cr_assert_eq(nb_backward(mesh_loss(xs, w1s, w2s)), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_backward(mesh_loss(x, w1, w2)), NB_OK, "%s", nb_last_error());
    double a[24], b[24];
    cr_assert_eq(nb_to_host(nb_grad_of(w1s), a, sizeof a), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_to_host(nb_grad_of(w1), b, sizeof b), NB_OK);
    for (int i = 0; i < 24; i++)
      cr_expect(fabs(a[i] - b[i]) <= 1e-12 * (1 + fabs(b[i])), "layout %d grad %d", layout, i);
    nb_zero_grad(w1);
  }
  nb_mesh_release(m);
}

#endif
