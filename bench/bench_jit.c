/* bench/bench_jit.c — the cost of calling a jitted function.
 *
 *   tiny   f(x) = tanh(2x + 1) on 4 floats: the per-call overhead of nb_jit
 *          (signature lookup, program replay, one realization from the plan
 *          cache), next to the same call made eagerly (nb_call + nb_eval).
 *   mlp    value_and_grad of the README MLP loss (batch 256), jitted vs not.
 *   per_kernel  a jitted chain of K tanh kernels on 4 floats, for K = 2 and 34;
 *          each tanh alternates between shapes [4] and [2, 2] (reshape is a
 *          zero-copy view), so no two of them fuse and each is its own kernel.
 *          (median(K=34) - median(K=2)) / 32 is what one more kernel costs a
 *          jitted call: dispatch, buffer, liveness, plus tanh of 4 floats.
 * For each: the first call and the median of the following calls. Each call
 * is one scope, its outputs realized. The eager form runs first, so the
 * jitted first call finds the kernels' one-time setup (OpenMP pool, oneDNN
 * primitives) done and measures what jit adds: tracing into a program and
 * planning the first realization.
 *
 *   bench_jit           100000 tiny calls, 1000 MLP calls
 *   bench_jit --smoke   a few calls (build check) */
#include <nabla/nabla.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"

static nb_status tiny(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_tanh(nb_add_scalar(nb_mul_scalar(in[0], 2.0), 1.0));
  return out[0] ? NB_OK : nb_last_status();
}

/* K tanh kernels alternating between [4] and [2, 2] (user = &K) */
static nb_status chain(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  int k = *(const int *)u;
  nb_tensor *y = in[0];
  for (int i = 0; i < k; i++)
    y = nb_tanh(nb_reshape(y, i % 2 ? NB_SHAPE(4) : NB_SHAPE(2, 2)));
  out[0] = nb_reshape(y, NB_SHAPE(4));
  return out[0] ? NB_OK : nb_last_status();
}

typedef struct result {
  double first_s, median_s;
  double first_plan_s; /* of the first call: planning its realization (nb_stats.plan_ns) */
} result;

/* Times n calls of f on in (outputs realized each call). */
static result time_calls(nb_fn *f, nb_tensor *const *in, int n, double *t) {
  int n_out = nb_fn_n_out(f);
  nb_tensor *out[16];
  result r = {0};
  for (int i = 0; i <= n; i++) {
    uint64_t p0 = i == 0 ? nb_get_stats().plan_ns : 0;
    double t0 = now_s();
    nb_scope_begin();
    nb_call(f, in, out);
    nb_eval(out, n_out);
    nb_scope_end();
    double dt = now_s() - t0;
    if (i == 0) {
      r.first_s = dt;
      r.first_plan_s = 1e-9 * (double)(nb_get_stats().plan_ns - p0);
    } else
      t[i - 1] = dt;
  }
  r.median_s = median(t, n);
  return r;
}

static void report(const char *c, const char *impl, result r, int n) {
  printf("{\"case\":\"%s\",\"impl\":\"%s\",\"calls\":%d,\"first_call_s\":%.6g,"
         "\"first_call_plan_s\":%.6g,\"median_s\":%.6g}\n",
         c, impl, n, r.first_s, r.first_plan_s, r.median_s);
}

int main(int argc, char **argv) {
  bool smoke = argc > 1 && strcmp(argv[1], "--smoke") == 0;
  int n_tiny = smoke ? 10 : 100000, n_mlp = smoke ? 3 : 1000;
  double *t = malloc(sizeof(double) * (size_t)n_tiny);

  nb_tensor *x = nb_rand(NB_SHAPE(4), NB_F32);
  nb_fn *f = nb_fn_create(tiny, NULL, 1, 1), *jf = nb_jit(f);
  result te = time_calls(f, &x, n_tiny, t), tj = time_calls(jf, &x, n_tiny, t);
  report("tiny_call", "nabla_jit", tj, n_tiny);
  report("tiny_call", "nabla_eager", te, n_tiny);

  /* per-kernel cost: the slope between a 2- and a 34-kernel jitted chain */
  static int ks[2] = {2, 34};
  result rk[2];
  for (int i = 0; i < 2; i++) {
    nb_fn *c = nb_fn_create(chain, &ks[i], 1, 1), *jc = nb_jit(c);
    rk[i] = time_calls(jc, &x, n_tiny, t);
    nb_stats before = nb_get_stats();
    nb_scope_begin();
    nb_tensor *o;
    nb_call(jc, &x, &o);
    nb_eval(&o, 1);
    nb_scope_end();
    if (nb_get_stats().kernels_run - before.kernels_run != (uint64_t)ks[i])
      fprintf(stderr, "bench_jit: the %d-kernel chain ran %llu kernels\n", ks[i],
              (unsigned long long)(nb_get_stats().kernels_run - before.kernels_run));
    nb_fn_release(jc);
    nb_fn_release(c);
  }
  double per_kernel = (rk[1].median_s - rk[0].median_s) / (ks[1] - ks[0]);
  printf("{\"case\":\"per_kernel\",\"impl\":\"nabla_jit\",\"calls\":%d,\"median_2_s\":%.6g,"
         "\"median_34_s\":%.6g,\"median_s\":%.6g}\n",
         n_tiny, rk[0].median_s, rk[1].median_s, per_kernel);

  nb_seed(0);
  nb_tensor *p[10];
  readme_mlp_init(p);
  nb_fn *loss = nb_fn_create(readme_mlp_loss_fn, NULL, 10, 1);
  nb_fn *vg = nb_value_and_grad(loss, NB_AXES(0, 1, 2, 3, 4, 5, 6, 7)), *jvg = nb_jit(vg);
  result me = time_calls(vg, p, n_mlp, t), mj = time_calls(jvg, p, n_mlp, t);
  report("mlp_value_and_grad", "nabla_jit", mj, n_mlp);
  report("mlp_value_and_grad", "nabla_traced_each_call", me, n_mlp);
  if (nb_last_status() != NB_OK) {
    fprintf(stderr, "bench_jit: %s\n", nb_last_error());
    return 1;
  }
  nb_stats s = nb_get_stats();
  printf("\njit calls (first call, its planning part, then median)\n%-22s %-22s %10s %10s %10s\n",
         "case", "impl", "first_us", "plan_us", "median_us");
  const char *cases[4] = {"tiny_call", "tiny_call", "mlp_value_and_grad", "mlp_value_and_grad"};
  const char *impls[4] = {"nabla_jit", "nabla_eager", "nabla_jit", "nabla_traced_each_call"};
  result rs[4] = {tj, te, mj, me};
  for (int i = 0; i < 4; i++)
    printf("%-22s %-22s %10.1f %10.1f %10.2f\n", cases[i], impls[i], rs[i].first_s * 1e6,
           rs[i].first_plan_s * 1e6, rs[i].median_s * 1e6);
  printf("per kernel (34- vs 2-kernel jitted chain): %.0f ns\n", per_kernel * 1e9);
  printf("jit cache: %llu hits, %llu misses\n", (unsigned long long)s.jit_cache_hits,
         (unsigned long long)s.jit_cache_misses);
  nb_fn_release(jvg);
  nb_fn_release(vg);
  nb_fn_release(loss);
  nb_fn_release(jf);
  nb_fn_release(f);
  free(t);
  return 0;
}
