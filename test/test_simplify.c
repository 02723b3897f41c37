/* test/test_simplify.c — the planner's simplification (src/core/simplify.c)
 * and the jit's constant folding (src/core/program.c) change no value: random
 * DAGs full of duplicated subexpressions and no-op views give bit for bit the
 * results of the unsimplified plan (NABLA_NO_SIMPLIFY), while common
 * subexpressions, no-op reshapes / permutations and folded constants cost no
 * kernel. */
#include "common.h"
#include "../src/core/oprules.h"

typedef struct rng {
  uint64_t s;
} rng;

static int pick(rng *r, int n) { return (int)(tc_uniform(&r->s, 0, 1) * n) % n; }

static nb_tensor *unary(int k, nb_tensor *x) {
  switch (k) {
  case 0: return nb_exp(nb_neg(nb_abs(x)));
  case 1: return nb_sin(x);
  case 2: return nb_tanh(x);
  case 3: return nb_square(x);
  default: return nb_sum(x, NB_AXES(-1), true); /* a reduction: its own kernel */
  }
}

static nb_tensor *binary(int k, nb_tensor *a, nb_tensor *b) {
  switch (k) {
  case 0: return nb_add(a, b);
  case 1: return nb_sub(a, b);
  case 2: return nb_mul(a, b);
  default: return nb_where(nb_gt(a, b), a, b);
  }
}

/* An op that changes nothing (or two that undo each other) on x [4,5,6]. */
static nb_tensor *noop(int k, nb_tensor *x, nb_dtype dt) {
  switch (k) {
  case 0: return nb_reshape(nb_reshape(x, NB_SHAPE(20, 6)), NB_SHAPE(4, 5, 6));
  case 1: return nb_permute(nb_permute(x, NB_AXES(2, 0, 1)), NB_AXES(1, 2, 0));
  case 2: return nb_neg(nb_neg(x));
  case 3: return nb_cast(nb_cast(x, NB_F64), dt); /* f32 -> f64 -> f32 is exact */
  case 4: return nb_reshape(x, NB_SHAPE(4, 5, 6));
  default: return nb_broadcast_to(x, NB_SHAPE(4, 5, 6));
  }
}

typedef struct recipe {
  int kind, k, a, b;
} recipe;

/* A random DAG over [4,5,6] tensors in which a third of the steps repeat an
 * earlier step (operands of add / mul possibly swapped) and a sixth wrap a
 * value in no-ops; up to 4 outputs (some intermediates held). */
static int build(rng *r, nb_dtype dt, nb_tensor **out) {
  nb_tensor *pool[64];
  recipe rec[64];
  int n = 0, n_rec = 0, n_out = 0;
  for (int k = 0; k < 3; k++) {
    double x[120];
    tc_fill(x, 120, -2, 2, &r->s);
    pool[n++] = tc_tensor(x, NB_SHAPE(4, 5, 6), dt);
  }
  int steps = 8 + pick(r, 24);
  for (int s = 0; s < steps; s++) {
    int what = pick(r, 6);
    recipe c;
    if (what <= 1 && n_rec > 0) {
      c = rec[pick(r, n_rec)];
      if ((c.kind == 1 && (c.k == 0 || c.k == 2)) && pick(r, 2)) {
        int t = c.a; /* commutative: the same value with operands swapped */
        c.a = c.b;
        c.b = t;
      }
    } else if (what == 2) {
      c = (recipe){2, pick(r, 6), pick(r, n), 0};
    } else if (what == 3) {
      c = (recipe){0, pick(r, 5), pick(r, n), 0};
    } else {
      c = (recipe){1, pick(r, 4), pick(r, n), pick(r, n)};
    }
    nb_tensor *t = c.kind == 0   ? unary(c.k, pool[c.a])
                   : c.kind == 1 ? binary(c.k, pool[c.a], pool[c.b])
                                 : noop(c.k, pool[c.a], dt);
    cr_assert(t, "%s", nb_last_error());
    if (nb_ndim(t) == 3 && nb_shape_of(t).dims[2] != 6) continue; /* keep [4,5,6] */
    if (nb_shape_of(t).dims[2] == 1) t = nb_broadcast_to(t, NB_SHAPE(4, 5, 6));
    if (c.kind != 2) rec[n_rec++] = c;
    pool[n++] = t;
    if (n_out < 3 && pick(r, 5) == 0) out[n_out++] = t; /* held */
  }
  out[n_out++] = pool[n - 1];
  return n_out;
}

Test(simplify, random_dags_with_duplicates_equal_the_unsimplified_plan_bitwise) {
  rng r = {.s = 777};
  uint64_t kernels[2] = {0, 0};
  for (int trial = 0; trial < 150; trial++) {
    nb_dtype dt = trial % 2 ? NB_F64 : NB_F32;
    bool fusion = trial % 3 != 0;
    uint64_t seed = r.s;
    double *res[2][4];
    int n_out = 0;
    for (int simp = 0; simp < 2; simp++) {
      nbi_set_simplify(simp);
      nbi_set_fusion(fusion);
      r.s = seed;
      nb_scope_begin();
      nb_tensor *out[4];
      n_out = build(&r, dt, out);
      nb_stats s0 = nb_get_stats();
      cr_assert(nb_eval(out, n_out) == NB_OK, "%s", nb_last_error());
      kernels[simp] += nb_get_stats().kernels_run - s0.kernels_run;
      for (int k = 0; k < n_out; k++) {
        cr_assert(nb_is_realized(out[k]));
        res[simp][k] = tc_read(out[k]);
      }
      nb_scope_end();
    }
    nbi_set_simplify(true);
    nbi_set_fusion(true);
    for (int k = 0; k < n_out; k++) {
      cr_assert(memcmp(res[0][k], res[1][k], sizeof(double) * 120) == 0,
                "trial %d output %d differs", trial, k);
      free(res[0][k]);
      free(res[1][k]);
    }
  }
  cr_assert(kernels[1] < kernels[0], "simplified plans run fewer kernels (%llu vs %llu)",
            (unsigned long long)kernels[1], (unsigned long long)kernels[0]);
}

static double *host(nb_tensor *t, int64_t n) {
  double *v = tc_read(t);
  cr_assert(v && nb_numel(t) == n);
  return v;
}

Test(simplify, a_common_subexpression_runs_once) {
  double a[12], b[12];
  uint64_t seed = 5;
  tc_fill(a, 12, -1, 1, &seed);
  tc_fill(b, 12, -1, 1, &seed);
  nb_tensor *x = tc_tensor(a, NB_SHAPE(3, 4), NB_F32), *w = tc_tensor(b, NB_SHAPE(4, 3), NB_F32);
  double *got[2];
  uint64_t kernels[2];
  for (int simp = 0; simp < 2; simp++) {
    nbi_set_simplify(simp);
    nb_scope_begin();
    /* two matmuls of the same operands, two equal products; only y and z are held */
    nb_scope_begin();
    nb_tensor *y = nb_keep(nb_add(nb_matmul(x, w), nb_matmul(x, w)));
    nb_tensor *z = nb_keep(nb_sub(nb_mul(y, y), nb_mul(y, y)));
    nb_scope_end();
    nb_stats s0 = nb_get_stats();
    cr_assert(nb_eval((nb_tensor *[]){y, z}, 2) == NB_OK, "%s", nb_last_error());
    kernels[simp] = nb_get_stats().kernels_run - s0.kernels_run;
    got[simp] = host(y, 9);
    double *zv = host(z, 9);
    for (int i = 0; i < 9; i++)
      cr_assert_eq(zv[i], 0.0);
    free(zv);
    nb_scope_end();
  }
  nbi_set_simplify(true);
  cr_assert_eq(kernels[0], 3, "unsimplified: two matmuls, one fused kernel (%llu)",
               (unsigned long long)kernels[0]);
  cr_assert_eq(kernels[1], 2, "simplified: one matmul (%llu)", (unsigned long long)kernels[1]);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      float s = 0;
      for (int k = 0; k < 4; k++)
        s += (float)a[i * 4 + k] * (float)b[k * 3 + j];
      cr_assert(fabs(got[1][i * 3 + j] - 2.0 * s) < 1e-5);
      cr_assert_eq(got[0][i * 3 + j], got[1][i * 3 + j]);
    }
  free(got[0]);
  free(got[1]);
}

Test(simplify, no_op_reshapes_and_permutations_cost_no_kernel) {
  double a[24];
  for (int i = 0; i < 24; i++)
    a[i] = i;
  nb_tensor *x = tc_tensor(a, NB_SHAPE(2, 3, 4), NB_F32);
  for (int simp = 0; simp < 2; simp++) {
    nbi_set_simplify(simp);
    nb_scope_begin();
    /* reshaping the transposed view needs a copy, unless the chain is a no-op;
     * only c is held (a held intermediate computes its own value) */
    nb_scope_begin();
    nb_tensor *t = nb_permute(x, NB_AXES(2, 0, 1));                               /* [4,2,3] view */
    nb_tensor *r = nb_reshape(nb_reshape(t, NB_SHAPE(8, 3)), NB_SHAPE(4, 2, 3));  /* = t */
    nb_tensor *p = nb_permute(nb_permute(r, NB_AXES(1, 2, 0)), NB_AXES(2, 0, 1)); /* = t */
    nb_tensor *c = nb_keep(nb_cast(nb_cast(p, NB_F64), NB_F32));                  /* = t */
    nb_scope_end();
    nb_stats s0 = nb_get_stats();
    cr_assert(nb_eval(&c, 1) == NB_OK, "%s", nb_last_error());
    uint64_t k = nb_get_stats().kernels_run - s0.kernels_run;
    if (simp)
      cr_assert_eq(k, 0, "the whole chain is a view of x (%llu kernels)", (unsigned long long)k);
    else
      cr_assert(k >= 1);
    double *v = host(c, 24);
    for (int i = 0; i < 4; i++)
      for (int j = 0; j < 2; j++)
        for (int l = 0; l < 3; l++)
          cr_assert_eq(v[(i * 2 + j) * 3 + l], a[(j * 3 + l) * 4 + i]);
    free(v);
    nb_scope_end();
  }
  nbi_set_simplify(true);
}

Test(simplify, held_aliases_come_out_realized_and_live_after_their_source_dies) {
  double a[6] = {1, -2, 3, -4, 5, -6};
  nb_tensor *x = tc_tensor(a, NB_SHAPE(2, 3), NB_F32);
  nb_scope_begin();
  nb_tensor *e1 = nb_exp(x), *e2 = nb_exp(x);             /* one aliases the other */
  nb_tensor *n2 = nb_neg(nb_neg(e1));                     /* an alias of the same value */
  nb_tensor *tt = nb_transpose(nb_transpose(nb_relu(x))); /* the relu */
  nb_keep(e2);
  nb_keep(n2);
  nb_keep(tt);
  nb_scope_end(); /* e1 and the inner ops are intermediates nobody holds */
  cr_assert(nb_eval((nb_tensor *[]){e2, n2, tt}, 3) == NB_OK, "%s", nb_last_error());
  cr_assert(nb_is_realized(e2) && nb_is_realized(n2) && nb_is_realized(tt));
  double *v1 = host(e2, 6), *v2 = host(n2, 6), *v3 = host(tt, 6);
  for (int i = 0; i < 6; i++) {
    cr_assert_eq(v1[i], (double)expf((float)a[i]));
    cr_assert_eq(v2[i], v1[i]);
    cr_assert_eq(v3[i], a[i] > 0 ? a[i] : 0);
  }
  free(v1), free(v2), free(v3);
  /* they are usable as inputs of a later graph */
  nb_tensor *s = nb_add(e2, n2);
  double *vs = host(s, 6);
  for (int i = 0; i < 6; i++)
    cr_assert_eq(vs[i], 2 * (double)expf((float)a[i]));
  free(vs);
}

/* ---- jit constant folding ------------------------------------------------------------ */
static nb_tensor *outer_w;

/* y = x * c + exp(w): c is built in the body from constants only (a reduction
 * of an arange: its own kernel), w is captured from outside. */
static nb_status body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *c = nb_sum(nb_reshape(nb_arange(0, 16, 1, NB_F32), NB_SHAPE(8, 2)), NB_AXES(1), false);
  c = nb_add_scalar(nb_mul_scalar(c, 0.5), 1);
  out[0] = nb_add(nb_mul(in[0], c), nb_exp(outer_w));
  return out[0] ? NB_OK : nb_last_status();
}

Test(simplify, jit_folds_constants_once_and_reads_captures_every_call) {
  double xs[8], ws[8];
  uint64_t seed = 9;
  tc_fill(xs, 8, -1, 1, &seed);
  tc_fill(ws, 8, -1, 1, &seed);
  nb_tensor *x = tc_tensor(xs, NB_SHAPE(8), NB_F32);
  uint64_t kernels[2];
  nbi_set_fusion(false); /* kernels are counted unfused: row fusion would run c's reduction
                            in the same kernel as its scaling either way */
  for (int simp = 0; simp < 2; simp++) {
    nbi_set_simplify(simp);
    outer_w = nb_retain(tc_tensor(ws, NB_SHAPE(8), NB_F32));
    nb_fn *f = nb_fn_create(body, NULL, 1, 1);
    nb_fn *j = nb_jit(f);
    nb_tensor *y;
    for (int call = 0; call < 3; call++) {
      nb_scope_begin();
      if (call == 2) /* a capture from outside is read when the call runs */
        cr_assert(nb_assign(outer_w, nb_mul_scalar(outer_w, 2)) == NB_OK, "%s", nb_last_error());
      nb_stats s0 = nb_get_stats();
      cr_assert(nb_call(j, &x, &y) == NB_OK, "%s", nb_last_error());
      if (call == 1) kernels[simp] = nb_get_stats().kernels_run - s0.kernels_run;
      double *v = host(y, 8);
      for (int i = 0; i < 8; i++) {
        float c = (float)(4 * i + 1) * 0.5f + 1; /* (2i + 2i+1) / 2 + 1 */
        float w = (float)ws[i] * (call == 2 ? 2 : 1);
        cr_assert(fabs(v[i] - ((float)xs[i] * c + expf(w))) < 1e-5, "call %d elem %d", call, i);
      }
      free(v);
      nb_scope_end();
    }
    nb_fn_release(j);
    nb_fn_release(f);
    nb_release(outer_w);
  }
  nbi_set_simplify(true);
  nbi_set_fusion(true);
  /* unfused: sum, mul, add of c are folded; exp, mul, add remain */
  cr_assert_eq(kernels[1] + 3, kernels[0], "the folded reduction is gone (%llu vs %llu kernels)",
               (unsigned long long)kernels[1], (unsigned long long)kernels[0]);
}

static nb_status mse(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_tanh(nb_matmul(in[1], in[0]));
  out[0] = nb_mean(nb_square(nb_sub(h, in[2])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

Test(simplify, jitted_gradients_equal_the_unsimplified_ones_bitwise) {
  double w[12], x[20], y[15];
  uint64_t seed = 3;
  tc_fill(w, 12, -1, 1, &seed);
  tc_fill(x, 20, -1, 1, &seed);
  tc_fill(y, 15, -1, 1, &seed);
  nb_tensor *in[3] = {tc_tensor(w, NB_SHAPE(4, 3), NB_F64), tc_tensor(x, NB_SHAPE(5, 4), NB_F64),
                      tc_tensor(y, NB_SHAPE(5, 3), NB_F64)};
  double *got[2][2];
  for (int simp = 0; simp < 2; simp++) {
    nbi_set_simplify(simp);
    nb_fn *f = nb_fn_create(mse, NULL, 3, 1);
    nb_fn *vg = nb_value_and_grad(f, NB_AXES(0));
    nb_fn *j = nb_jit(vg);
    nb_tensor *o[2];
    for (int call = 0; call < 2; call++)
      cr_assert(nb_call(j, in, o) == NB_OK, "%s", nb_last_error());
    got[simp][0] = host(o[0], 1);
    got[simp][1] = host(o[1], 12);
    nb_fn_release(j), nb_fn_release(vg), nb_fn_release(f);
  }
  nbi_set_simplify(true);
  cr_assert_eq(got[0][0][0], got[1][0][0]);
  cr_assert(memcmp(got[0][1], got[1][1], sizeof(double) * 12) == 0);
  for (int s = 0; s < 2; s++)
    free(got[s][0]), free(got[s][1]);
}

/* y0 = (x * 1) @ w, y1 = x + (+0), y2 = x + (-0), y3 = x / 1 - 0 with the
 * constants made in the body. */
static nb_status unit_ops(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *x = in[0];
  out[0] = nb_matmul(nb_mul(nb_ones(NB_SHAPE(2, 3), NB_F32), x), in[1]);
  out[1] = nb_add(x, nb_zeros(NB_SHAPE(3), NB_F32));
  out[2] = nb_add(x, nb_full(NB_SHAPE(2, 3), -0.0, NB_F32));
  out[3] = nb_sub_scalar(nb_div_scalar(x, 1.0), 0.0);
  for (int j = 0; j < 4; j++)
    if (!out[j]) return nb_last_status();
  return NB_OK;
}

Test(simplify, jit_drops_exact_unit_operations_only) {
  double xs[6] = {-0.0, 0.0, 1.5, -2.25, 3, -4}, ws[12];
  uint64_t seed = 11;
  tc_fill(ws, 12, -1, 1, &seed);
  nb_tensor *in[2] = {tc_tensor(xs, NB_SHAPE(2, 3), NB_F32), tc_tensor(ws, NB_SHAPE(3, 4), NB_F32)};
  double *got[2][4];
  uint64_t kernels[2];
  for (int simp = 0; simp < 2; simp++) {
    nbi_set_simplify(simp);
    nb_fn *f = nb_fn_create(unit_ops, NULL, 2, 4);
    nb_fn *j = nb_jit(f);
    nb_tensor *o[4];
    for (int call = 0; call < 2; call++) {
      nb_stats s0 = nb_get_stats();
      cr_assert(nb_call(j, in, o) == NB_OK, "%s", nb_last_error());
      kernels[simp] = nb_get_stats().kernels_run - s0.kernels_run;
    }
    got[simp][0] = host(o[0], 8);
    for (int k = 1; k < 4; k++)
      got[simp][k] = host(o[k], 6);
    nb_fn_release(j), nb_fn_release(f);
  }
  nbi_set_simplify(true);
  cr_assert(kernels[1] < kernels[0], "x * 1 and x / 1 - 0 run no kernel (%llu vs %llu)",
            (unsigned long long)kernels[1], (unsigned long long)kernels[0]);
  for (int k = 0; k < 4; k++) {
    int n = k ? 6 : 8;
    cr_assert(memcmp(got[0][k], got[1][k], sizeof(double) * (size_t)n) == 0, "output %d", k);
  }
  cr_assert(!signbit(got[1][1][0]), "-0 + 0 is +0: x + 0 is not dropped");
  cr_assert(signbit(got[1][2][0]) && signbit(got[1][3][0]), "-0 + -0 and -0 / 1 - 0 are -0");
  for (int s = 0; s < 2; s++)
    for (int k = 0; k < 4; k++)
      free(got[s][k]);
}

/* The op traits of ops.def rows (NBI_TR_*) that passes rely on hold: ops the
 * simplifier may swap the operands of commute bit for bit (with NaNs and
 * signed zeros), linear ones are linear, families match their .def files,
 * fusion's axis and view traits sit on ops of the right shape. */
Test(simplify, op_traits_hold) {
  static const double xa[] = {1.5, -0.0, NAN, 3.0, -2.25, 0.0, 1e30, -7.0};
  static const double xb[] = {-2.0, 0.0, 1.0, NAN, -2.25, -0.0, 1e-30, 7.0};
  nb_tensor *a = tc_tensor(xa, NB_SHAPE(8), NB_F32), *b = tc_tensor(xb, NB_SHAPE(8), NB_F32);
  nb_tensor *pa = nb_gt(a, nb_zeros(NB_SHAPE(8), NB_F32)),
            *pb = nb_lt(b, nb_zeros(NB_SHAPE(8), NB_F32));
  struct {
    int op;
    nb_tensor *(*f)(nb_tensor *, nb_tensor *);
    bool boolean;
  } comm[] = {{NBI_OP_ADD, nb_add, false},
              {NBI_OP_MUL, nb_mul, false},
              {NBI_OP_EQ, nb_eq, false},
              {NBI_OP_NE, nb_ne, false},
              {NBI_OP_LOGICAL_AND, nb_logical_and, true},
              {NBI_OP_LOGICAL_OR, nb_logical_or, true}};
  int n_comm = 0;
  for (int op = 0; op < NBI_OP_COUNT; op++)
    n_comm += (nbi_op_traits[op] & NBI_TR_COMMUTATIVE) != 0;
  cr_assert_eq(n_comm, (int)(sizeof comm / sizeof comm[0]),
               "a commutative op without a check here");
  for (size_t i = 0; i < sizeof comm / sizeof comm[0]; i++) {
    cr_assert(nbi_op_traits[comm[i].op] & NBI_TR_COMMUTATIVE);
    nb_tensor *x = comm[i].boolean ? pa : a, *y = comm[i].boolean ? pb : b;
    nb_tensor *ab = nb_cast(comm[i].f(x, y), NB_F32), *ba = nb_cast(comm[i].f(y, x), NB_F32);
    float r1[8], r2[8];
    cr_assert_eq(nb_to_host(ab, r1, sizeof r1), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_to_host(ba, r2, sizeof r2), NB_OK, "%s", nb_last_error());
    cr_assert(memcmp(r1, r2, sizeof r1) == 0, "%s does not commute bit for bit",
              nbi_op_table[comm[i].op]->name);
  }
  /* maximum/minimum return the first of two NaNs or zeros: not commutative */
  cr_assert(!(nbi_op_traits[NBI_OP_MAXIMUM] & NBI_TR_COMMUTATIVE));
  for (int op = 0; op < NBI_OP_COUNT; op++) {
    uint32_t t = nbi_op_traits[op];
    int lin = !!(t & NBI_TR_LIN_UNARY) + !!(t & NBI_TR_LIN_SUM) + !!(t & NBI_TR_LIN_MULTI) +
              !!(t & NBI_TR_LIN_FIRST);
    cr_assert_leq(lin, 1, "%s has several linearity traits", nbi_op_table[op]->name);
    cr_assert(!((t & NBI_TR_EW) && (t & NBI_TR_REDUCE)), "%s", nbi_op_table[op]->name);
    cr_assert(!(t & NBI_TR_LEAF) || nbi_op_table[op]->arity == 0, "%s", nbi_op_table[op]->name);
    cr_assert(!(t & NBI_TR_ALIAS) || nbi_op_table[op]->arity == 1, "%s", nbi_op_table[op]->name);
    /* fusion classes: an axis op is a reduce-family op; a view one operand, no alias */
    cr_assert(!(t & NBI_TR_AXIS) || (t & NBI_TR_REDUCE), "%s", nbi_op_table[op]->name);
    cr_assert(!(t & NBI_TR_VIEW) || (nbi_op_table[op]->arity == 1 && !(t & NBI_TR_ALIAS)), "%s",
              nbi_op_table[op]->name);
  }
  /* the elementwise family is exactly elementwise.def, the reductions reduce.def */
  int ew[] =
      {
#define NB_OP(id, name, arity, traits) NBI_OP_##id,
#include "../src/ops/elementwise.def"
      },
      red[] = {
#include "../src/ops/reduce.def"
#undef NB_OP
      };
  int n_ew = 0, n_red = 0;
  for (int op = 0; op < NBI_OP_COUNT; op++)
    n_ew += (nbi_op_traits[op] & NBI_TR_EW) != 0, n_red += (nbi_op_traits[op] & NBI_TR_REDUCE) != 0;
  cr_assert_eq(n_ew, (int)(sizeof ew / sizeof ew[0]));
  cr_assert_eq(n_red, (int)(sizeof red / sizeof red[0]));
  for (size_t i = 0; i < sizeof ew / sizeof ew[0]; i++)
    cr_assert(nbi_op_traits[ew[i]] & NBI_TR_EW);
  for (size_t i = 0; i < sizeof red / sizeof red[0]; i++)
    cr_assert(nbi_op_traits[red[i]] & NBI_TR_REDUCE);
}
