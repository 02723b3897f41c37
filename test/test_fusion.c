/* test/test_fusion.c — fused elementwise groups compute exactly what the
 * unfused kernels compute: a property test over random elementwise DAGs
 * (random ops, broadcasting inputs, f32 and f64, some intermediates held),
 * realized with fusion on and off; plus the kernel count a chain needs. */
#include "common.h"

typedef struct rng {
  uint64_t s;
} rng;

static int pick(rng *r, int n) { return (int)(tc_uniform(&r->s, 0, 1) * n) % n; }

enum { N_UNARY = 8, N_BINARY = 6 };

static nb_tensor *unary(int k, nb_tensor *x) {
  switch (k) {
  case 0: return nb_exp(nb_neg(nb_abs(x))); /* bounded */
  case 1: return nb_sin(x);
  case 2: return nb_tanh(x);
  case 3: return nb_relu(x);
  case 4: return nb_square(x);
  case 5: return nb_sigmoid(x);
  case 6: return nb_mul_scalar(x, 0.75);
  default: return nb_sqrt(nb_add_scalar(nb_abs(x), 1.0));
  }
}

static nb_tensor *binary(int k, nb_tensor *a, nb_tensor *b) {
  switch (k) {
  case 0: return nb_add(a, b);
  case 1: return nb_sub(a, b);
  case 2: return nb_mul(a, b);
  case 3: return nb_maximum(a, b);
  case 4: return nb_where(nb_gt(a, b), a, b);
  default: return nb_div(a, nb_add_scalar(nb_abs(b), 1.0));
  }
}

/* Builds one random DAG over inputs of shapes broadcasting to [4,5,6] and
 * returns up to 4 outputs (the last node and some held intermediates). */
static int build(rng *r, nb_dtype dt, nb_tensor **out) {
  static const nb_shape shapes[4] = {{3, {4, 5, 6}}, {1, {6}}, {2, {5, 1}}, {0, {0}}};
  nb_tensor *pool[40];
  int n = 0, n_out = 0;
  for (int k = 0; k < 4; k++) {
    int64_t numel = tc_numel(shapes[k]);
    double *x = malloc(sizeof *x * (size_t)numel);
    tc_fill(x, numel, -2, 2, &r->s);
    pool[n++] = tc_tensor(x, shapes[k], dt);
    free(x);
  }
  int steps = 6 + pick(r, 20);
  for (int s = 0; s < steps; s++) {
    nb_tensor *t = pick(r, 3) == 0 ? unary(pick(r, N_UNARY), pool[pick(r, n)])
                                   : binary(pick(r, N_BINARY), pool[pick(r, n)], pool[pick(r, n)]);
    cr_assert(t, "%s", nb_last_error());
    pool[n++] = t;
    if (n_out < 3 && pick(r, 5) == 0) out[n_out++] = t; /* held: must be stored */
  }
  out[n_out++] = pool[n - 1];
  return n_out;
}

Test(fusion, random_elementwise_dags_equal_unfused) {
  rng r = {.s = 12345};
  for (int trial = 0; trial < 200; trial++) {
    nb_dtype dt = trial % 2 ? NB_F64 : NB_F32;
    uint64_t seed = r.s;
    double *res[2][4];
    int64_t numel[4];
    int n_out = 0;
    for (int fused = 0; fused < 2; fused++) {
      nbi_set_fusion(fused);
      r.s = seed;
      nb_scope_begin();
      nb_tensor *out[4];
      n_out = build(&r, dt, out);
      cr_assert(nb_eval(out, n_out) == NB_OK, "%s", nb_last_error());
      for (int k = 0; k < n_out; k++) {
        res[fused][k] = tc_read(out[k]);
        numel[k] = nb_numel(out[k]);
      }
      nb_scope_end();
    }
    nbi_set_fusion(true);
    for (int k = 0; k < n_out; k++) {
      /* same row functions, same order: bit-identical */
      cr_assert(memcmp(res[0][k], res[1][k], sizeof(double) * (size_t)numel[k]) == 0,
                "trial %d output %d differs", trial, k);
      free(res[0][k]);
      free(res[1][k]);
    }
  }
}

Test(fusion, a_chain_is_one_kernel_and_needs_no_intermediate_buffers) {
  nbi_set_fusion(true);
  int64_t n = 1 << 16;
  nb_tensor *x = nb_rand(NB_SHAPE(n), NB_F32), *w = nb_rand(NB_SHAPE(n), NB_F32);
  cr_assert(nb_eval((nb_tensor *[]){x, w}, 2) == NB_OK);
  nb_scope_begin();
  /* the chain's temporaries live in an inner scope that ends before the
   * realization: only the graph holds them, so the group stores only y */
  nb_scope_begin();
  nb_tensor *y = nb_sub_scalar(nb_mul_scalar(nb_relu(nb_add(nb_mul_scalar(x, 1.5), w)), 0.5), 0.25);
  nb_keep(y);
  nb_scope_end();
  nb_reset_stats();
  nb_stats s0 = nb_get_stats();
  cr_assert(nb_eval(&y, 1) == NB_OK);
  nb_stats s1 = nb_get_stats();
  cr_assert_eq(s1.kernels_run - s0.kernels_run, 1, "five elementwise ops, one kernel");
  cr_assert_eq(s1.peak_bytes - s0.live_bytes, (uint64_t)n * 4,
               "only the output is allocated (peak grew by %llu bytes)",
               (unsigned long long)(s1.peak_bytes - s0.live_bytes));
  float *v = malloc(sizeof(float) * (size_t)n), *xs = malloc(sizeof(float) * (size_t)n),
        *ws = malloc(sizeof(float) * (size_t)n);
  nb_to_host(y, v, sizeof(float) * (size_t)n);
  nb_to_host(x, xs, sizeof(float) * (size_t)n);
  nb_to_host(w, ws, sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    float h = xs[i] * 1.5f + ws[i];
    cr_assert_eq(v[i], (h < 0 ? 0.0f : h) * 0.5f - 0.25f);
  }
  free(v), free(xs), free(ws);
  nb_scope_end();
}
