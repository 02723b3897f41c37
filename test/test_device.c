/* test/test_device.c — the device seam: the device table, default devices, moves
 * between devices, errors naming devices, and the emulated device NB_EMU whose
 * memory faults when read around the backend.
 *
 * NABLA_TEST_DEVICE=emu:0 (or cuda:0) makes that device every thread's default
 * for the whole test binary (set before any test runs): `make test` runs the
 * suite once more that way, so every host access that bypasses the seam
 * crashes a test. */
#include "common.h"
#include "../src/core/oprules.h"

#include "../src/backends/cpu/cpu.h"

#include <signal.h>
#include <stdlib.h>

static nb_device parse_device(const char *s) {
  nb_device d = NB_CPU;
  if (!strncmp(s, "emu:", 4)) d = NB_EMU(atoi(s + 4));
  if (!strncmp(s, "cuda:", 5)) d = NB_CUDA(atoi(s + 5));
  return d;
}

__attribute__((constructor)) static void test_device_default(void) {
  const char *s = getenv("NABLA_TEST_DEVICE");
  if (!s || !*s) return;
  if (nb_set_default_device(parse_device(s))) {
    fprintf(stderr, "NABLA_TEST_DEVICE=%s: %s\n", s, nb_last_error());
    exit(2);
  }
}

TestSuite(device, .init = tc_setup, .fini = tc_teardown);

Test(device, table_counts) {
  cr_expect_eq(nb_device_count(NB_DEVICE_CPU), 1);
  cr_expect_eq(nb_device_count(NB_DEVICE_EMU), 4);
  cr_expect_geq(nb_device_count(NB_DEVICE_CUDA), 0);
  cr_expect_str_eq(nb_device_str(NB_EMU(2)), "emu:2");
  cr_expect_str_eq(nb_device_str(NB_CPU), "cpu:0");
}

Test(device, missing_device_is_an_error) {
  nb_device before = nb_default_device();
  cr_expect_eq(nb_set_default_device(NB_EMU(9)), NB_ERR_DEVICE);
  cr_expect(strstr(nb_last_error(), "emu:9") != NULL, "%s", nb_last_error());
  nb_clear_error();
  cr_expect_eq(nb_default_device().kind, before.kind);
  cr_expect_eq(nb_default_device().index, before.index);
  if (nb_device_count(NB_DEVICE_CUDA) == 0) {
    cr_expect_eq(nb_set_default_device(NB_CUDA(0)), NB_ERR_DEVICE);
    cr_expect(strstr(nb_last_error(), "cuda:0") != NULL, "%s", nb_last_error());
    nb_clear_error();
    cr_expect_null(nb_to_device(nb_zeros(NB_SHAPE(2), NB_F32), NB_CUDA(0)));
    cr_expect_eq(nb_last_status(), NB_ERR_DEVICE);
  }
}

Test(device, leaves_follow_the_default_device) {
  nb_device before = nb_default_device();
  cr_assert_eq(nb_set_default_device(NB_EMU(1)), NB_OK);
  nb_tensor *x = nb_arange(0, 6, 1, NB_F32);
  nb_device d = nb_device_of(x);
  cr_expect(d.kind == NB_DEVICE_EMU && d.index == 1);
  nb_tensor *y = nb_mul_scalar(nb_reshape(x, NB_SHAPE(2, 3)), 2.0);
  cr_expect_eq(nb_device_of(y).kind, NB_DEVICE_EMU);
  float v[6];
  cr_assert_eq(nb_to_host(y, v, sizeof v), NB_OK);
  for (int i = 0; i < 6; i++)
    cr_expect_eq(v[i], 2.0f * (float)i);
  nb_set_default_device(before);
}

Test(device, mixed_devices_are_an_eager_error_naming_both) {
  nb_tensor *a = nb_ones(NB_SHAPE(3), NB_F32);
  nb_tensor *b = nb_to_device(nb_ones(NB_SHAPE(3), NB_F32), NB_EMU(0));
  if (nb_device_of(a).kind == NB_DEVICE_EMU) a = nb_to_device(a, NB_EMU(3));
  cr_assert_null(nb_add(a, b));
  cr_expect_eq(nb_last_status(), NB_ERR_DEVICE);
  cr_expect(strstr(nb_last_error(), "nb_add") && strstr(nb_last_error(), "emu:0"), "%s",
            nb_last_error());
}

Test(device, to_device_moves_values_and_gradients) {
  double h[4] = {1, -2, 3, 0.5};
  nb_tensor *x = nb_to_device(nb_from_data(h, NB_SHAPE(4), NB_F64), NB_CPU);
  nb_tensor *e = nb_to_device(x, NB_EMU(2));
  nb_tensor *back = nb_to_device(nb_square(e), NB_CPU);
  double v[4];
  cr_assert_eq(nb_to_host(back, v, sizeof v), NB_OK);
  for (int i = 0; i < 4; i++)
    cr_expect_eq(v[i], h[i] * h[i]);
  /* its VJP moves the cotangent back */
  nb_set_requires_grad(x, true);
  nb_tensor *loss =
      nb_sum(nb_to_device(nb_square(nb_to_device(x, NB_EMU(2))), NB_CPU), NB_ALL, false);
  cr_assert_eq(nb_backward(loss), NB_OK);
  cr_assert_eq(nb_to_host(nb_grad_of(x), v, sizeof v), NB_OK);
  for (int i = 0; i < 4; i++)
    cr_expect_eq(v[i], 2 * h[i]);
}

Test(device, emu_kernel_errors_are_reported_at_the_next_read) {
  nb_tensor *x = nb_to_device(nb_arange(0, 4, 1, NB_F32), NB_EMU(0));
  int64_t bad[2] = {1, 7};
  nb_tensor *i = nb_to_device(nb_from_data(bad, NB_SHAPE(2), NB_I64), NB_EMU(0));
  nb_tensor *y = nb_take(x, i, 0);
  cr_assert_not_null(y);
  float v[2];
  nb_status st = nb_to_host(y, v, sizeof v);
  cr_expect_eq(st, NB_ERR_INDEX, "%s", nb_status_str(st));
  cr_expect(strstr(nb_last_error(), "nb_take") != NULL, "%s", nb_last_error());
}

/* Recording skips the support question on the CPU (device 0) and for ops that
 * run no kernel (NBI_OPF_NO_KERNEL) or that core runs (exec): that holds only
 * while the CPU's table has a kernel for exactly every other op. The emulated
 * device answers as the CPU does. */
Test(device, cpu_kernel_table_covers_every_op_that_runs_a_kernel) {
  int emu = nbi_device_lookup("test", NB_EMU(0));
  cr_assert_geq(emu, 0);
  const nbi_device *d = nbi_device_at(emu);
  for (int op = 0; op < NBI_OP_COUNT; op++) {
    const nbi_op_def *def = nbi_op_table[op];
    bool runs = !def->exec && !(def->flags & NBI_OPF_NO_KERNEL);
    cr_expect_eq(nbi_cpu_kernel_of(op) != NULL, runs, "%s: CPU kernel %s", def->name,
                 runs ? "missing" : "for an op that runs none");
    for (int dt = 0; dt < NB_DTYPE_COUNT; dt++) {
      cr_expect_eq(nbi_cpu_backend.supports(NULL, op, (nb_dtype)dt), runs, "%s", def->name);
      cr_expect_eq(d->be->supports(d->ctx, op, (nb_dtype)dt), runs, "%s on emu", def->name);
    }
  }
  cr_expect_null(nbi_cpu_kernel_of(-1));
  cr_expect_null(nbi_cpu_kernel_of(NBI_OP_COUNT));
  cr_expect(!nbi_cpu_supports(NULL, NBI_OP_ADD, NB_DTYPE_COUNT));
}

/* An emu buffer's address is not host memory: reading it around the backend faults
 * (under AddressSanitizer, which reports the fault and exits with status 1). */
#if defined(__SANITIZE_ADDRESS__)
#define EMU_FAULT .exit_code = 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_FAULT .exit_code = 1
#endif
#endif
#ifndef EMU_FAULT
#define EMU_FAULT .signal = SIGSEGV
#endif
Test(device, emu_memory_faults_when_read_directly, EMU_FAULT) {
  nb_tensor *x = nb_to_device(nb_ones(NB_SHAPE(4), NB_F32), NB_EMU(0));
  nb_eval(&x, 1);
  nbi_view v = nbi_tensor_view(x);
  volatile float f = *(volatile float *)v.data;
  (void)f;
}

/* A sharded program on a mesh of four emulated devices: each shard lives on its
 * device, collectives move values between devices, and the values (and the
 * gradients) equal the unsharded program's. */
static nb_tensor *mlp_loss(nb_tensor *x, nb_tensor *w1, nb_tensor *w2) {
  nb_tensor *h = nb_tanh(nb_matmul(x, w1));
  return nb_mean(nb_square(nb_matmul(h, w2)), NB_ALL, false);
}

Test(device, sharded_program_on_emulated_devices_equals_unsharded) {
  nb_device devs[4] = {NB_EMU(0), NB_EMU(1), NB_EMU(2), NB_EMU(3)};
  nb_mesh *m = nb_mesh_create("dp=2,tp=2", devs, 4);
  cr_assert_not_null(m, "%s", nb_last_error());
  nb_seed(7);
  nb_tensor *x = nb_randn(NB_SHAPE(8, 6), NB_F64), *w1 = nb_randn(NB_SHAPE(6, 4), NB_F64),
            *w2 = nb_randn(NB_SHAPE(4, 3), NB_F64);
  nb_tensor *xs = nb_shard(x, m, "dp, _"), *w1s = nb_shard(w1, m, "_, tp"),
            *w2s = nb_shard(w2, m, "tp, _");
  cr_assert(xs && w1s && w2s, "%s", nb_last_error());
  for (int d = 0; d < 4; d++) {
    nb_device pd = nb_device_of(xs->phys[d]);
    cr_expect(pd.kind == NB_DEVICE_EMU && pd.index == d, "shard %d on %s", d, nb_device_str(pd));
  }
  double ref, got;
  cr_assert(!isnan(ref = nb_item(mlp_loss(x, w1, w2))), "%s", nb_last_error());
  cr_assert(!isnan(got = nb_item(mlp_loss(xs, w1s, w2s))), "%s", nb_last_error());
  cr_expect(fabs(got - ref) <= 1e-12 * fabs(ref), "sharded %.17g, unsharded %.17g", got, ref);
  /* gradients through the moves between devices */
  nb_set_requires_grad(w1s, true);
  nb_set_requires_grad(w1, true);
  cr_assert_eq(nb_backward(mlp_loss(xs, w1s, w2s)), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_backward(mlp_loss(x, w1, w2)), NB_OK, "%s", nb_last_error());
  double a[24], b[24];
  cr_assert_eq(nb_to_host(nb_grad_of(w1s), a, sizeof a), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_to_host(nb_grad_of(w1), b, sizeof b), NB_OK);
  for (int i = 0; i < 24; i++)
    cr_expect(fabs(a[i] - b[i]) <= 1e-12 * (1 + fabs(b[i])), "grad %d: %g vs %g", i, a[i], b[i]);
  nb_mesh_release(m);
}
