/* test/test_fusion.c — fused groups compute exactly what the unfused kernels
 * compute: property tests over random elementwise DAGs and over random DAGs of
 * elementwise ops and trailing-axis reductions (random ops, broadcasting and
 * strided inputs, f32 and f64, some intermediates held), realized with fusion
 * on and off; plus the kernel counts of a chain, layer_norm, softmax,
 * log_softmax and cross-entropy written as compositions. */
#include "common.h"

#include "../src/backends/cpu/vmath.h" /* nbi_isa_select */

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

/* x, then 10 scalar steps (each its own constant) and a product with w: 11
 * members and 12 outside operands; *mid: the 5th step. */
static nb_tensor *scalar_chain(nb_tensor *x, nb_tensor *w, nb_tensor **mid) {
  nb_tensor *t = x;
  for (int i = 0; i < 10; i++) {
    t = i % 2 ? nb_mul_scalar(t, 1 + i / 16.0) : nb_add_scalar(t, i / 8.0 - 0.3);
    if (i == 4) *mid = t;
  }
  return nb_mul(t, w);
}

Test(fusion, operand_limit_counts_only_stored_members) {
  /* the executor's iterator walks stored members and outside operands: 1 (or
   * 2, with a held intermediate) + 12 fit, so the chain is one kernel */
  int64_t n = 5000;
  nb_tensor *x = nb_randn(NB_SHAPE(n), NB_F32), *w = nb_randn(NB_SHAPE(n), NB_F32);
  cr_assert(nb_eval((nb_tensor *[]){x, w}, 2) == NB_OK);
  for (int held = 0; held < 2; held++) {
    float *want[2], *got[2];
    for (int fused = 0; fused < 2; fused++) {
      nbi_set_fusion(fused);
      nb_scope_begin();
      nb_tensor *mid = NULL, *y = scalar_chain(x, w, &mid), *outs[2] = {y, mid};
      nb_stats s0 = nb_get_stats();
      cr_assert(nb_eval(outs, 1 + held) == NB_OK, "%s", nb_last_error());
      nb_stats s1 = nb_get_stats();
      if (fused)
        cr_assert_eq(s1.kernels_run - s0.kernels_run, 1, "held %d: %llu kernels", held,
                     (unsigned long long)(s1.kernels_run - s0.kernels_run));
      float **v = fused ? got : want;
      for (int k = 0; k < 2; k++) {
        v[k] = malloc(sizeof(float) * (size_t)n);
        cr_assert(nb_to_host(outs[k], v[k], sizeof(float) * (size_t)n) == NB_OK);
      }
      nb_scope_end();
    }
    nbi_set_fusion(true);
    for (int k = 0; k < 2; k++) {
      cr_assert(memcmp(got[k], want[k], sizeof(float) * (size_t)n) == 0, "held %d: output %d", held,
                k);
      free(got[k]), free(want[k]);
    }
  }
}

/* ---- row groups: elementwise ops and reductions over trailing axes ------------ */
typedef struct row_case {
  nb_shape full;
  int ra; /* rows are dims [0, ra) */
} row_case;

static const row_case row_cases[] = {
    {{3, {4, 5, 6}}, 2}, {{3, {2, 3, 7}}, 1}, {{2, {5, 2}}, 1}, {{2, {64, 600}}, 1}, /* threads */
    {{2, {4, 9000}}, 1}, /* few long rows (the reduction kernel's split path) */
};

static nb_tensor *reduce(int k, nb_tensor *x, nb_axes axes, bool keep) {
  switch (k) {
  case 0: return nb_sum(x, axes, keep);
  case 1: return nb_max(x, axes, keep);
  case 2: return nb_min(x, axes, keep);
  case 3: return nb_mean(x, axes, keep);
  case 4: return nb_var(x, axes, keep);
  case 5: return nb_std(x, axes, keep);
  default: return nb_prod(x, axes, keep);
  }
}

static nb_tensor *input(rng *r, nb_shape s, nb_dtype dt, bool strided) {
  int64_t numel = tc_numel(s);
  double *x = malloc(sizeof *x * (size_t)numel);
  tc_fill(x, numel, -2, 2, &r->s);
  nb_tensor *t = strided ? tc_strided_tensor(x, s, dt) : tc_tensor(x, s, dt);
  free(x);
  return t;
}

/* A random DAG over full values (shape F), per-row values in keepdims form
 * (broadcast back over F) and per-row values without the reduced dims; returns
 * up to 4 outputs (the last node and some held intermediates). */
static int build_rows(rng *r, const row_case *c, nb_dtype dt, nb_tensor **out) {
  nb_shape f = c->full, kd = f, flat = {.ndim = c->ra}, last = {1, {f.dims[f.ndim - 1]}};
  for (int d = 0; d < f.ndim; d++) {
    if (d >= c->ra) kd.dims[d] = 1;
    if (d < c->ra) flat.dims[d] = f.dims[d];
  }
  nb_axes axes = {0};
  for (int d = c->ra; d < f.ndim; d++)
    axes.v[axes.n++] = d;
  nb_tensor *full[40], *keep[40], *row[40];
  int nf = 0, nk = 0, nr = 0, n_out = 0;
  full[nf++] = input(r, f, dt, false);
  full[nf++] = input(r, f, dt, true);          /* read through strides */
  nb_tensor *bias = input(r, last, dt, false); /* broadcast over the rows */
  keep[nk++] = input(r, kd, dt, false);        /* broadcast over the row */
  row[nr++] = input(r, flat, dt, false);
  nb_tensor *t = NULL;
  int steps = 6 + pick(r, 16);
  for (int s = 0; s < steps; s++) {
    int kind = pick(r, 8);
    if (kind == 0) { /* a reduction of a full value */
      bool kdim = pick(r, 2);
      t = reduce(pick(r, 7), full[pick(r, nf)], axes, kdim);
      if (kdim)
        keep[nk++] = t;
      else
        row[nr++] = t;
    } else if (kind == 1) { /* per-row arithmetic */
      bool kdim = pick(r, 2);
      nb_tensor **pool = kdim ? keep : row;
      int n = kdim ? nk : nr;
      t = pick(r, 2) ? unary(pick(r, N_UNARY), pool[pick(r, n)])
                     : binary(pick(r, N_BINARY), pool[pick(r, n)], pool[pick(r, n)]);
      pool[kdim ? nk++ : nr++] = t;
    } else if (kind == 2) { /* a per-row value broadcast back over the row */
      t = binary(pick(r, N_BINARY), full[pick(r, nf)], keep[pick(r, nk)]);
      full[nf++] = t;
    } else if (kind == 5) { /* one value from all rows, then ops on it */
      bool kdim = pick(r, 2);
      t = reduce(pick(r, 4), kdim ? keep[pick(r, nk)] : row[pick(r, nr)], NB_ALL, false);
      if (t && pick(r, 2)) t = unary(pick(r, N_UNARY), t);
      if (t && pick(r, 2)) t = binary(pick(r, N_BINARY), t, nb_reshape(t, NB_SHAPE(1, 1)));
    } else if (kind == 4) { /* axis ops along the last axis */
      nb_tensor *x = full[pick(r, nf)];
      int op = pick(r, 3);
      t = op == 0 ? nb_softmax(x, -1) : op == 1 ? nb_log_softmax(x, -1) : nb_cumsum(x, -1);
      full[nf++] = t;
    } else if (kind == 3) { /* views: flat per-row to keepdims, keepdims to full */
      t = pick(r, 2) ? nb_reshape(row[pick(r, nr)], kd) : nb_broadcast_to(keep[pick(r, nk)], f);
      if (t && nbi_shape_eq(&t->shape, &kd))
        keep[nk++] = t;
      else
        full[nf++] = t;
    } else {
      nb_tensor *b = pick(r, 4) ? full[pick(r, nf)] : bias;
      t = pick(r, 3) == 0 ? unary(pick(r, N_UNARY), full[pick(r, nf)])
                          : binary(pick(r, N_BINARY), full[pick(r, nf)], b);
      full[nf++] = t;
    }
    cr_assert(t, "%s", nb_last_error());
    if (n_out < 3 && pick(r, 5) == 0) out[n_out++] = t; /* held: must be stored */
    if (nf >= 38 || nk >= 38 || nr >= 38) break;
  }
  out[n_out++] = t;
  return n_out;
}

/* Realizes a random DAG (seed *s: build_rows's for case c, build's when c is
 * NULL) with fusion off and on; asserts the results agree bit for bit (same
 * row functions, same order). */
static void fused_trial(rng *r, const row_case *c, nb_dtype dt, int trial) {
  uint64_t seed = r->s;
  double *res[2][4];
  int64_t numel[4];
  int n_out = 0;
  for (int fused = 0; fused < 2; fused++) {
    nbi_set_fusion(fused);
    r->s = seed;
    nb_scope_begin();
    nb_tensor *out[4];
    n_out = c ? build_rows(r, c, dt, out) : build(r, dt, out);
    cr_assert(nb_eval(out, n_out) == NB_OK, "%s", nb_last_error());
    for (int k = 0; k < n_out; k++) {
      res[fused][k] = tc_read(out[k]);
      numel[k] = nb_numel(out[k]);
    }
    nb_scope_end();
  }
  nbi_set_fusion(true);
  for (int k = 0; k < n_out; k++) {
    cr_assert(memcmp(res[0][k], res[1][k], sizeof(double) * (size_t)numel[k]) == 0,
              "trial %d output %d differs", trial, k);
    free(res[0][k]);
    free(res[1][k]);
  }
}

Test(fusion, random_elementwise_dags_equal_unfused) {
  rng r = {.s = 12345};
  for (int trial = 0; trial < 200; trial++)
    fused_trial(&r, NULL, trial % 2 ? NB_F64 : NB_F32, trial);
}

Test(fusion, random_row_reduction_dags_equal_unfused) {
  rng r = {.s = 777};
  int n_cases = (int)(sizeof row_cases / sizeof row_cases[0]);
  for (int trial = 0; trial < 240; trial++) {
    const row_case *c = &row_cases[trial < 200 ? trial % 3 : 3 + trial % 2];
    fused_trial(&r, c, trial % 2 ? NB_F64 : NB_F32, trial);
  }
  cr_assert_eq(n_cases, 5);
}

/* Realizes y = make(x...) with fusion on and off: one kernel fused, and the
 * same bits as the unfused kernels. */
typedef nb_tensor *(*row_fn)(nb_tensor *const *in);

static void one_kernel(row_fn make, nb_shape *shapes, int n_in, nb_dtype dt, const char *what) {
  rng r = {.s = 99};
  nb_tensor *in[4];
  for (int k = 0; k < n_in; k++)
    in[k] = input(&r, shapes[k], dt, false);
  double *res[2];
  int64_t numel = 0;
  for (int fused = 0; fused < 2; fused++) {
    nbi_set_fusion(fused);
    nb_scope_begin();
    nb_scope_begin(); /* the temporaries are dropped: only the graph holds them */
    nb_tensor *y = make(in);
    cr_assert(y, "%s", nb_last_error());
    nb_keep(y);
    nb_scope_end();
    nb_reset_stats();
    nb_stats s0 = nb_get_stats();
    cr_assert(nb_eval(&y, 1) == NB_OK, "%s", nb_last_error());
    nb_stats s1 = nb_get_stats();
    if (fused)
      cr_assert_eq(s1.kernels_run - s0.kernels_run, 1, "%s: %llu kernels", what,
                   (unsigned long long)(s1.kernels_run - s0.kernels_run));
    res[fused] = tc_read(y);
    numel = nb_numel(y);
    nb_scope_end();
  }
  nbi_set_fusion(true);
  cr_assert(memcmp(res[0], res[1], sizeof(double) * (size_t)numel) == 0, "%s differs", what);
  free(res[0]);
  free(res[1]);
}

static nb_tensor *layer_norm(nb_tensor *const *in) {
  return nb_layer_norm(in[0], in[1], in[2], 1e-5);
}

static nb_tensor *softmax(nb_tensor *const *in) {
  nb_tensor *e = nb_exp(nb_sub(in[0], nb_max(in[0], NB_AXES(-1), true)));
  return nb_div(e, nb_sum(e, NB_AXES(-1), true));
}

static nb_tensor *log_softmax(nb_tensor *const *in) {
  nb_tensor *xs = nb_sub(in[0], nb_max(in[0], NB_AXES(-1), true));
  return nb_sub(xs, nb_log(nb_sum(nb_exp(xs), NB_AXES(-1), true)));
}

/* cross-entropy of each row against probability labels in[1] */
static nb_tensor *cross_entropy(nb_tensor *const *in) { return nb_cross_entropy(in[0], in[1]); }

static nb_tensor *cross_entropy_rows(nb_tensor *const *in) {
  return nb_neg(nb_sum(nb_mul(in[1], log_softmax(in)), NB_AXES(-1), false));
}

/* the same with the log_softmax op */
static nb_tensor *cross_entropy_op_rows(nb_tensor *const *in) {
  return nb_neg(nb_sum(nb_mul(in[1], nb_log_softmax(in[0], -1)), NB_AXES(-1), false));
}

/* softmax's backward: y * (g - sum(g * y)) with y the softmax of in[0] */
static nb_tensor *softmax_backward(nb_tensor *const *in) {
  nb_tensor *y = softmax(in);
  return nb_mul(y, nb_sub(in[1], nb_sum(nb_mul(in[1], y), NB_AXES(-1), true)));
}

Test(fusion, row_compositions_are_one_kernel) {
  for (int k = 0; k < 2; k++) {
    nb_dtype dt = k ? NB_F64 : NB_F32;
    nb_shape x = {2, {96, 512}}, w = {1, {512}}, x3 = {3, {4, 24, 300}};
    one_kernel(layer_norm, (nb_shape[]){x, w, w}, 3, dt, "layer_norm");
    one_kernel(layer_norm, (nb_shape[]){x3, {1, {300}}, {1, {300}}}, 3, dt, "layer_norm 3-d");
    one_kernel(softmax, &x, 1, dt, "softmax");
    one_kernel(log_softmax, &x, 1, dt, "log_softmax");
    one_kernel(cross_entropy_rows, (nb_shape[]){x, x}, 2, dt, "cross_entropy rows");
    one_kernel(softmax_backward, (nb_shape[]){x, x}, 2, dt, "softmax backward");
    one_kernel(cross_entropy_op_rows, (nb_shape[]){x, x}, 2, dt, "log_softmax op cross_entropy");
    one_kernel(cross_entropy, (nb_shape[]){x, x}, 2, dt, "cross_entropy");
  }
}

/* Sums of products: the CPU folds a product row that only the sum reads into
 * the sum (nbi_cpu_reduce_row_dot); the bits must stay the unfused ones at
 * every row length (the float pre-sums of 256 terms, 32-term blocks, the
 * zero-padded tail, under 8 terms the plain fold), with factors that are
 * operands, members, broadcast rows, or the same row (a square). */
static nb_tensor *dot_rows(nb_tensor *const *in) {
  return nb_sum(nb_mul(in[0], in[1]), NB_AXES(-1), false);
}

static nb_tensor *dot_member_bcast(nb_tensor *const *in) {
  return nb_mean(nb_mul(nb_tanh(in[0]), in[2]), NB_AXES(-1), true);
}

static nb_tensor *centered_sumsq(nb_tensor *const *in) {
  nb_tensor *c = nb_sub(in[0], nb_mean(in[0], NB_AXES(-1), true));
  return nb_mul(c, nb_sum(nb_square(c), NB_AXES(-1), true));
}

static nb_tensor *product_read_twice(nb_tensor *const *in) { /* not folded: the add reads it */
  nb_tensor *p = nb_mul(in[0], in[1]);
  return nb_add(nb_sum(p, NB_AXES(-1), true), p);
}

Test(fusion, product_sums_equal_unfused_at_every_row_length) {
  int64_t lens[] = {3, 8, 9, 31, 32, 255, 256, 257, 300, 1029};
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
      nb_dtype dt = k ? NB_F64 : NB_F32;
      nb_shape x = {2, {40, lens[i]}}, w = {1, {lens[i]}};
      nb_shape sh[3] = {x, x, w};
      one_kernel(dot_rows, sh, 3, dt, "sum(a * b)");
      one_kernel(dot_member_bcast, sh, 3, dt, "mean(tanh(a) * w)");
      one_kernel(centered_sumsq, sh, 1, dt, "c * sum(square(c))");
      one_kernel(product_read_twice, sh, 2, dt, "sum(p) + p");
    }
}

/* Cross-entropy rows: an f32 log_softmax row that only the label product
 * reads is formed in registers inside the product sum
 * (nbi_cpu_reduce_row_dot_lsm, never stored); the bits must stay the unfused
 * ones on every ISA, at every row length, with the labels on either side of
 * the product, a member as the logits, and rows holding NaN or infinities. */
static nb_tensor *ce_logp_first(nb_tensor *const *in) {
  return nb_mean(nb_mul(nb_log_softmax(in[0], -1), in[1]), NB_AXES(-1), false);
}

static nb_tensor *ce_member_logits(nb_tensor *const *in) {
  return nb_sum(nb_mul(in[1], nb_log_softmax(nb_tanh(in[0]), -1)), NB_AXES(-1), false);
}

/* rows of x (n wide) as cross_entropy_op_rows, fused and not; NaN where NaN */
static void ce_special_rows(int64_t n) {
  float *x = malloc(sizeof(float) * 4 * (size_t)n);
  rng r = {.s = 7};
  for (int64_t j = 0; j < 4 * n; j++)
    x[j] = (float)(4 * tc_uniform(&r.s, -1, 1));
  x[1 * n + n / 2] = NAN;
  for (int64_t j = 0; j < n; j++)
    x[2 * n + j] = -INFINITY;
  x[3 * n + n - 1] = INFINITY;
  nb_tensor *in[2] = {nb_from_data(x, NB_SHAPE(4, n), NB_F32),
                      nb_softmax(input(&r, (nb_shape){2, {4, n}}, NB_F32, false), -1)};
  double *res[2];
  for (int fused = 0; fused < 2; fused++) {
    nbi_set_fusion(fused);
    nb_scope_begin();
    res[fused] = tc_read(cross_entropy_op_rows(in));
    nb_scope_end();
  }
  nbi_set_fusion(true);
  for (int i = 0; i < 4; i++)
    cr_assert(isnan(res[0][i]) ? isnan(res[1][i]) : res[0][i] == res[1][i],
              "n=%lld row %d: %g unfused, %g fused", (long long)n, i, res[0][i], res[1][i]);
  cr_assert(isnan(res[1][1]) && isnan(res[1][2]), "NaN and -inf rows give NaN");
  free(res[0]), free(res[1]), free(x);
}

Test(fusion, cross_entropy_rows_equal_unfused_on_every_isa) {
  int64_t lens[] = {8, 9, 31, 32, 255, 256, 257, 300, 1029};
  for (int isa = 0; isa < NBI_ISA_COUNT; isa++) {
    if (nbi_isa_select((nbi_isa)isa) != (nbi_isa)isa) continue;
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
      nb_shape x = {2, {40, lens[i]}};
      one_kernel(cross_entropy_op_rows, (nb_shape[]){x, x}, 2, NB_F32, "labels * log_softmax");
      one_kernel(ce_logp_first, (nb_shape[]){x, x}, 2, NB_F32, "mean(log_softmax * labels)");
      one_kernel(ce_member_logits, (nb_shape[]){x, x}, 2, NB_F32, "log_softmax(tanh(x))");
      ce_special_rows(lens[i]);
    }
  }
  nbi_isa_select(NBI_ISA_COUNT);
}

/* Backward passes of layer_norm and cross-entropy: gradients fused equal the
 * unfused ones bit for bit, in far fewer kernels (reductions over the feature
 * axis join the elementwise ops around them). */
static void grad_trial(int which, nb_dtype dt) {
  rng r = {.s = 4242};
  nb_shape xs = {2, {48, 200}}, ws = {1, {200}};
  nb_tensor *x0 = input(&r, xs, dt, false), *w = input(&r, ws, dt, false),
            *b = input(&r, ws, dt, false), *g = input(&r, xs, dt, false);
  nb_tensor *labels = nb_softmax(input(&r, xs, dt, false), -1);
  double *res[2];
  uint64_t kernels[2];
  for (int fused = 0; fused < 2; fused++) {
    nbi_set_fusion(fused);
    nb_scope_begin();
    nb_tensor *x = nb_set_requires_grad(nb_detach(x0), true);
    nb_tensor *loss = which ? nb_cross_entropy(x, labels)
                            : nb_sum(nb_mul(nb_layer_norm(x, w, b, 1e-5), g), NB_ALL, false);
    nb_reset_stats();
    nb_stats s0 = nb_get_stats();
    cr_assert(nb_backward(loss) == NB_OK, "%s", nb_last_error());
    nb_stats s1 = nb_get_stats();
    kernels[fused] = s1.kernels_run - s0.kernels_run;
    res[fused] = tc_read(nb_grad_of(x));
    nb_scope_end();
  }
  nbi_set_fusion(true);
  cr_assert(memcmp(res[0], res[1], sizeof(double) * (size_t)tc_numel(xs)) == 0,
            "gradient %d differs", which);
  cr_assert(kernels[1] * 2 < kernels[0], "gradient %d: %llu kernels fused, %llu unfused", which,
            (unsigned long long)kernels[1], (unsigned long long)kernels[0]);
  free(res[0]);
  free(res[1]);
}

Test(fusion, layer_norm_and_cross_entropy_gradients_equal_unfused) {
  for (int k = 0; k < 4; k++)
    grad_trial(k % 2, k < 2 ? NB_F32 : NB_F64);
}

/* A row group's member must not write over an input another member reads
 * across rows: y = -x; out = sum(M * y, axis 1) + y inside a function (y an
 * intermediate nothing keeps) gave [-22, -116] when the add wrote over y while
 * the product still read all of y for the second row. */
static nb_status rows_read_across(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                  int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *y = nb_neg(in[1]);
  out[0] = nb_add(nb_sum(nb_mul(in[0], y), NB_AXES(1), false), y);
  return out[0] ? NB_OK : nb_last_status();
}

Test(fusion, row_group_never_writes_over_an_input_read_across_rows) {
  double M[4] = {1, 2, 3, 4}, x[2] = {1, 10}, want[2] = {-22, -53};
  nb_tensor *in[2] = {tc_tensor(M, NB_SHAPE(2, 2), NB_F64), tc_tensor(x, NB_SHAPE(2), NB_F64)};
  nb_fn *f = nb_fn_create(rows_read_across, NULL, 2, 1), *jf = nb_jit(f);
  nb_tensor *o[1];
  cr_assert_eq(nb_call(jf, in, o), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(o[0], want, NB_SHAPE(2), 0);
  cr_assert_eq(nb_call(f, in, o), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(o[0], want, NB_SHAPE(2), 0);
  nb_fn_release(jf);
  nb_fn_release(f);
}
