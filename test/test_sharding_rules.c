/* test/test_sharding_rules.c — factor rules (src/sharding/rules.c) and per-op
 * propagation (src/sharding/propagate.c) against SHARDING.md: its four worked
 * cases, the rule of every op, reshape refinement, broadcasting, reductions,
 * linearity of partial sums, priorities, explicit replication, constraints
 * (closed and open), conflicts, non-divisible sizes. Every expected sharding
 * is derived by hand in the comment next to it.
 *
 * Meshes are virtual CPU meshes; shardings are read with the library's spec
 * parser and compared as canonical text ("[x, _] partial(y)", sets in mesh
 * order; spec.c). */
#include "../src/ops/index.h"
#include "../src/core/oprules.h"
#include "../src/ops/nn.h"
#include "../src/sharding/sharding.h"
#include "common.h"

#include <stdio.h>

/* ---- meshes and specs from text (the library's parser and canonical text) ---- */

static nb_mesh *g_mesh[16];
static int g_n_mesh;

static void teardown(void) {
  while (g_n_mesh > 0)
    nb_mesh_release(g_mesh[--g_n_mesh]);
  tc_teardown();
}

TestSuite(sharding_rules, .init = tc_setup, .fini = teardown);

/* A virtual CPU mesh, released when the test ends. */
static nb_mesh *mesh(const char *axes) {
  cr_assert(g_n_mesh < 16);
  nb_mesh *m = nb_mesh_cpu(axes);
  cr_assert(m, "%s", nb_last_error());
  return g_mesh[g_n_mesh++] = m;
}

static nbi_sharding tm_spec(const nb_mesh *m, int ndim, const char *spec) {
  nbi_sharding s;
  cr_assert_eq(nbi_sharding_parse("test", m, spec, ndim, false, &s), NB_OK, "%s", nb_last_error());
  return s;
}

static const char *tm_str(const nb_mesh *m, const nbi_sharding *s, char *b, size_t cap) {
  nbi_sharding_format(m, s, b, cap);
  return b;
}

static void expect_sh(const nb_mesh *m, const nbi_sharding *got, const char *want,
                      const char *what) {
  char g[512], w[512];
  nbi_sharding ws = tm_spec(m, got->ndim, want);
  tm_str(m, got, g, sizeof g);
  tm_str(m, &ws, w, sizeof w);
  cr_expect_str_eq(g, w, "%s: got %s, expected %s", what, g, w);
}

/* ---- running a rule on recorded nodes ---------------------------------------- */

static nb_tensor *zeros(nb_shape s) {
  nb_tensor *t = nb_zeros(s, NB_F32);
  cr_assert(t, "%s", nb_last_error());
  return t;
}

static nb_tensor *izeros(nb_shape s) {
  nb_tensor *t = nb_zeros(s, NB_I64);
  cr_assert(t, "%s", nb_last_error());
  return t;
}

static void rule_of_node(const nb_tensor *y, int op, nbi_shard_rule *r) {
  cr_assert(y, "op failed: %s", nb_last_error());
  cr_assert_eq(y->op, op, "recorded %s, expected %s", nbi_op_table[y->op]->name,
               nbi_op_table[op]->name);
  nb_shape in[NBI_RULE_MAX_TENSORS];
  for (int k = 0; k < y->n_in; k++)
    in[k] = y->in[k]->shape;
  cr_assert_eq(nbi_shard_rule_of(y->op, &y->attrs, in, y->n_in, &y->shape, r), NB_OK, "%s: %s",
               nbi_op_table[op]->name, nb_last_error());
}

typedef struct prop_res {
  nbi_sharding tgt[NBI_RULE_MAX_TENSORS];
  nbi_sharding out;
} prop_res;

/* Propagates through node y: specs[k] the sharding of operand k (NULL: not
 * on the mesh), constraint the result's (NULL: none). */
static void prop_node(const nb_mesh *m, const nb_tensor *y, const char *const *specs,
                      const char *constraint, prop_res *res) {
  nbi_shard_rule r;
  rule_of_node(y, y->op, &r);
  nbi_sharding in[NBI_RULE_MAX_TENSORS], c;
  const nbi_sharding *inp[NBI_RULE_MAX_TENSORS];
  nb_shape shapes[NBI_RULE_MAX_TENSORS];
  for (int k = 0; k < y->n_in; k++) {
    shapes[k] = y->in[k]->shape;
    if (specs && specs[k]) in[k] = tm_spec(m, shapes[k].ndim, specs[k]);
    inp[k] = specs && specs[k] ? &in[k] : NULL;
  }
  if (constraint) c = tm_spec(m, y->shape.ndim, constraint);
  cr_assert_eq(
      nbi_propagate("test", m, &r, inp, shapes, constraint ? &c : NULL, res->tgt, &res->out), NB_OK,
      "%s", nb_last_error());
}

#define SPECS(...) ((const char *const[]){__VA_ARGS__})

/* The factor list of tensor t's dimension d, as sizes, e.g. {2, 4}. */
static void expect_dim(const nbi_shard_rule *r, int t, int d, int n, const int64_t *sizes) {
  cr_assert_eq(r->dim[t][d].n, n, "tensor %d dim %d: %d factors, expected %d", t, d, r->dim[t][d].n,
               n);
  for (int i = 0; i < n; i++)
    cr_expect_eq(r->size[r->dim[t][d].f[i]], sizes[i], "tensor %d dim %d factor %d size", t, d, i);
}
#define DIM(r, t, d, ...)                                                                          \
  expect_dim(r, t, d, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                   \
             (int64_t[]){__VA_ARGS__})

/* ---- the worked cases (SHARDING.md; mesh x=4, y=2; inputs closed) ------------ */

Test(sharding_rules, worked_case_1_matmul_partial) {
  /* m = 8 (A0, C0) takes x from A, k = 32 (A1, B0) takes y from both, n = 16
   * takes nothing: C = [x, _], and k's y becomes C's partial axis. */
  nb_mesh *m = mesh("x=4,y=2");
  nb_tensor *c = nb_matmul(zeros(NB_SHAPE(8, 32)), zeros(NB_SHAPE(32, 16)));
  prop_res r;
  prop_node(m, c, SPECS("[x, y]", "[y, _]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _] partial(y)", "C");
  expect_sh(m, &r.tgt[0], "[x, y]", "A's target");
  expect_sh(m, &r.tgt[1], "[y, _]", "B's target");
}

Test(sharding_rules, worked_case_2_conflict_larger_tensor_wins) {
  /* m wants x (from A, 256 elements), n wants x (from B, 512): C holds both,
   * so x goes to n (larger source) and m stays unsharded; A is gathered. */
  nb_mesh *m = mesh("x=4,y=2");
  nb_tensor *c = nb_matmul(zeros(NB_SHAPE(8, 32)), zeros(NB_SHAPE(32, 16)));
  prop_res r;
  prop_node(m, c, SPECS("[x, _]", "[_, x]"), NULL, &r);
  expect_sh(m, &r.out, "[_, x]", "C");
  expect_sh(m, &r.tgt[0], "[_, _]", "A's target");
  expect_sh(m, &r.tgt[1], "[_, x]", "B's target");
}

Test(sharding_rules, worked_case_3_prefix_extends) {
  /* dim 0's factor: X says (x, y), Y says x; equal prefix x, Y's shorter list
   * does not block y: (x, y) for Z and for Y (a local slice). */
  nb_mesh *m = mesh("x=4,y=2");
  nb_tensor *z = nb_add(zeros(NB_SHAPE(16, 4)), zeros(NB_SHAPE(16, 4)));
  prop_res r;
  prop_node(m, z, SPECS("[(x, y), _]", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[(x, y), _]", "Z");
  expect_sh(m, &r.tgt[0], "[(x, y), _]", "X's target");
  expect_sh(m, &r.tgt[1], "[(x, y), _]", "Y's target");
}

Test(sharding_rules, worked_case_4_reshape_sub_axes) {
  /* [8] -> [2, 4] is (i j) -> (i), (j), i = 2, j = 4. x (4) does not divide
   * i: its major half x:(1)2 completes i and the minor half x:(2)2 goes to j.
   * The operand keeps x (the two halves merge back). */
  nb_mesh *m = mesh("x=4,y=2");
  nb_tensor *y = nb_reshape(zeros(NB_SHAPE(8)), NB_SHAPE(2, 4));
  prop_res r;
  prop_node(m, y, SPECS("[x]"), NULL, &r);
  expect_sh(m, &r.out, "[x:(1)2, x:(2)2]", "reshape result");
  expect_sh(m, &r.tgt[0], "[x]", "reshape operand");
  /* x = 3 shares no factor with i = 2: nothing projects, the input is
   * gathered. */
  nb_mesh *m3 = mesh("x=3");
  prop_node(m3, y, SPECS("[x]"), NULL, &r);
  expect_sh(m3, &r.out, "[_, _]", "reshape result on x=3");
  expect_sh(m3, &r.tgt[0], "[_]", "reshape operand on x=3");
}

/* ---- every op has a consistent rule ------------------------------------------- */

/* A recorded node of op (NULL for the ops tested on synthetic shapes). */
static nb_tensor *sample(int op) {
  nb_tensor *x = zeros(NB_SHAPE(4, 6)), *v = zeros(NB_SHAPE(6));
  nb_tensor *img = zeros(NB_SHAPE(2, 4, 6, 6)), *w = zeros(NB_SHAPE(3, 4, 3, 3));
  nbi_attrs at = {0};
  at.i[0] = NB_F32;
  switch (op) {
  case NBI_OP_CONST: return x;
  case NBI_OP_PLACEHOLDER: return nbi_placeholder(&(nb_shape){2, {3, 5}}, NB_F32);
  case NBI_OP_CAST: return nb_cast(x, NB_F64);
  case NBI_OP_WHERE:
    return nbi_record(op, NB_F32, &x->shape, (nb_tensor *[]){nb_gt(v, v), x, v}, 3, &at);
  case NBI_OP_REDUCE_SUM: return nb_mean(x, NB_AXES(1), false);
  case NBI_OP_REDUCE_PROD: return nb_prod(x, NB_AXES(0), true);
  case NBI_OP_REDUCE_MAX: return nb_max(x, NB_ALL, false);
  case NBI_OP_REDUCE_MIN: return nb_min(x, NB_AXES(1), true);
  case NBI_OP_REDUCE_ANY: return nb_any(x, NB_AXES(0), false);
  case NBI_OP_REDUCE_ALL: return nb_all(x, NB_AXES(1), false);
  case NBI_OP_REDUCE_VAR: return nb_std(x, NB_AXES(1), false);
  case NBI_OP_LOGSUMEXP: return nb_logsumexp(x, NB_AXES(0), true);
  case NBI_OP_ARGMAX: return nb_argmax(x, 1, false);
  case NBI_OP_ARGMIN: return nb_argmin(x, 0, true);
  case NBI_OP_SOFTMAX: return nb_softmax(x, 1);
  case NBI_OP_LOG_SOFTMAX: return nb_log_softmax(x, 0);
  case NBI_OP_CUMSUM: return nb_cumsum(x, 1);
  case NBI_OP_RESHAPE: return nb_reshape(x, NB_SHAPE(2, 12));
  case NBI_OP_PERMUTE: return nb_transpose(x);
  case NBI_OP_BROADCAST_TO: return nb_broadcast_to(v, NB_SHAPE(5, 6));
  case NBI_OP_SLICE:
    return nb_slice(x, (int64_t[]){1, 0}, (int64_t[]){3, NB_END}, (int64_t[]){1, 1});
  case NBI_OP_CONCAT: return nb_concat((nb_tensor *[]){x, x, x}, 3, 1);
  case NBI_OP_PAD: return nb_pad(x, (int64_t[]){0, 0, 1, 2}, 0);
  case NBI_OP_FLIP: return nb_flip(x, NB_AXES(0));
  case NBI_OP_IDENTITY: return nbi_identity(x);
  case NBI_OP_STOP_GRADIENT: return nb_detach(x);
  case NBI_OP_TAKE: return nb_take(x, izeros(NB_SHAPE(2, 5)), 1);
  case NBI_OP_TAKE_ALONG_AXIS: return nb_take_along_axis(x, izeros(NB_SHAPE(1, 3)), 1);
  case NBI_OP_SCATTER_ADD: return nb_scatter_add(x, izeros(NB_SHAPE(5)), zeros(NB_SHAPE(4, 5)), 1);
  case NBI_OP_SCATTER_ADD_ALONG_AXIS:
    return nbi_scatter_add_along_axis(x, izeros(NB_SHAPE(4, 2)), zeros(NB_SHAPE(4, 2)), 1);
  case NBI_OP_ONE_HOT: return nb_one_hot(izeros(NB_SHAPE(4)), 5, NB_F32);
  case NBI_OP_MATMUL: return nb_matmul(zeros(NB_SHAPE(3, 1, 4, 6)), zeros(NB_SHAPE(5, 6, 2)));
  case NBI_OP_CONV2D: return nb_conv2d(img, w, zeros(NB_SHAPE(3)), NULL);
  case NBI_OP_MAX_POOL2D: return nb_max_pool2d(img, 2, 2, 0, 0, 0, 0);
  case NBI_OP_CONV2D_BWD_DATA: {
    nb_tensor *c = nb_conv2d(img, w, NULL, NULL);
    return nbi_conv2d_bwd_data(c, w, &c->attrs, 6, 6);
  }
  case NBI_OP_CONV2D_BWD_FILTER: {
    nb_tensor *c = nb_conv2d(img, w, NULL, NULL);
    return nbi_conv2d_bwd_filter(img, c, &c->attrs, 3, 3);
  }
  case NBI_OP_MAX_POOL2D_BWD: {
    nb_tensor *p = nb_max_pool2d(img, 2, 2, 0, 0, 0, 0);
    return nbi_max_pool2d_bwd(img, p, &p->attrs);
  }
  case NBI_OP_MAX_POOL2D_SELECT: {
    nb_tensor *p = nb_max_pool2d(img, 2, 2, 0, 0, 0, 0);
    return nbi_max_pool2d_select(img, img, &p->attrs);
  }
  case NBI_OP_SHARD_CONSTRAINT: return nbi_record(op, NB_F32, &x->shape, &x, 1, NULL);
  case NBI_OP_SHARD_LIKE:
    return nbi_record(op, NB_F32, &x->shape, (nb_tensor *[]){x, zeros(NB_SHAPE(4, 6))}, 2, NULL);
  case NBI_OP_TUPLE_GET:
  case NBI_OP_REMAT:
  case NBI_OP_CUSTOM:
  case NBI_OP_COND:
  case NBI_OP_WHILE:
  case NBI_OP_SCAN:
  case NBI_OP_SHARD_MAP: /* shard_map and the collectives of its bodies never run per op */
  case NBI_OP_ALL_REDUCE:
  case NBI_OP_ALL_GATHER:
  case NBI_OP_REDUCE_SCATTER:
  case NBI_OP_ALL_TO_ALL:
  case NBI_OP_PPERMUTE:
  case NBI_OP_AXIS_INDEX: return NULL;
  default: { /* elementwise: unary on x, binary broadcasting x with v */
    int ar = nbi_op_table[op]->arity;
    cr_assert(ar == 1 || ar == 2, "op %s has no sample", nbi_op_table[op]->name);
    return nbi_record(op, NB_F32, &x->shape, (nb_tensor *[]){x, v}, ar, &at);
  }
  }
}

/* Checks the rule's structure against the shapes: factor indices valid, a
 * factor at most once per tensor, every dim's factor sizes multiply to its
 * size (size-1 dims have none), reduction factors absent from the result,
 * every factor used somewhere. */
static void check_rule(const char *name, const nbi_shard_rule *r, const nb_shape *in, int n_in,
                       const nb_shape *out) {
  cr_assert_eq(r->n_in, n_in, "%s", name);
  cr_assert_eq(r->n_out, 1, "%s", name);
  bool used[NBI_RULE_MAX_FACTORS] = {false};
  for (int t = 0; t <= n_in; t++) {
    const nb_shape *s = t < n_in ? &in[t] : out;
    cr_assert_eq(r->ndim[t], s->ndim, "%s tensor %d rank", name, t);
    bool seen[NBI_RULE_MAX_FACTORS] = {false};
    for (int d = 0; d < s->ndim; d++) {
      int64_t prod = 1;
      for (int i = 0; i < r->dim[t][d].n; i++) {
        int f = r->dim[t][d].f[i];
        cr_assert(f >= 0 && f < r->n_factors, "%s: factor index", name);
        cr_assert(!seen[f], "%s: factor %d twice in tensor %d", name, f, t);
        seen[f] = used[f] = true;
        cr_assert(r->size[f] != 1, "%s: a size-1 factor", name);
        if (t == n_in)
          cr_assert_neq(r->kind[f], NBI_FACTOR_REDUCTION, "%s: reduction factor in the result",
                        name);
        prod *= r->size[f];
      }
      cr_assert_eq(prod, s->dims[d], "%s: tensor %d dim %d: factors give %lld, size %lld", name, t,
                   d, (long long)prod, (long long)s->dims[d]);
    }
  }
  for (int f = 0; f < r->n_factors; f++)
    cr_assert(used[f], "%s: factor %d unused", name, f);
}

/* Operand and result shapes of the ops without a sample node. */
static void synthetic(int op, nb_shape *in, int *n_in, nb_shape *out) {
  in[0] = (nb_shape){2, {3, 4}};
  in[1] = (nb_shape){1, {5}};
  *out = (nb_shape){3, {2, 1, 7}};
  int ar = nbi_op_table[op]->arity;
  *n_in = op == NBI_OP_TUPLE_GET ? 1 : ar >= 0 ? ar : 2;
}

Test(sharding_rules, every_op_has_a_consistent_rule) {
  /* the samples record every op with whatever dtypes its rule reads: on the CPU,
   * which records them all (a GPU default device refuses, say, an f32 logical_not) */
  cr_assert_eq(nb_set_default_device(NB_CPU), NB_OK);
  for (int op = 0; op < NBI_OP_COUNT; op++) {
    const char *name = nbi_op_table[op]->name;
    nb_tensor *y = sample(op);
    nb_shape in[NBI_RULE_MAX_TENSORS], out;
    int n_in;
    nbi_attrs at = {0};
    if (y) {
      cr_assert_eq(y->op, op, "sample of %s recorded %s", name, nbi_op_table[y->op]->name);
      n_in = y->n_in;
      for (int k = 0; k < n_in; k++)
        in[k] = y->in[k]->shape;
      out = y->shape;
      at = y->attrs;
    } else {
      synthetic(op, in, &n_in, &out);
    }
    nbi_shard_rule r;
    cr_assert_eq(nbi_shard_rule_of(op, &at, in, n_in, &out, &r), NB_OK, "%s: %s", name,
                 nb_last_error());
    check_rule(name, &r, in, n_in, &out);
    if (!y) /* all-replicated: nothing may be sharded */
      for (int f = 0; f < r.n_factors; f++)
        cr_expect_eq(r.kind[f], NBI_FACTOR_NEED_REPL, "%s", name);
  }
}

Test(sharding_rules, rule_errors) {
  nb_shape s = {1, {4}};
  nbi_shard_rule r;
  cr_expect_eq(nbi_shard_rule_of(-1, NULL, &s, 1, &s, &r), NB_ERR_INTERNAL);
  nb_clear_error();
  cr_expect_eq(nbi_shard_rule_of(NBI_OP_COUNT, NULL, &s, 1, &s, &r), NB_ERR_INTERNAL);
  nb_clear_error();
  /* arity: exp takes one operand */
  cr_expect_eq(nbi_shard_rule_of(NBI_OP_EXP, NULL, (nb_shape[]){s, s}, 2, &s, &r), NB_ERR_INTERNAL);
  nb_clear_error();
  /* a concat of 8 operands has 9 tensors: the caller replicates */
  nb_shape many[8] = {s, s, s, s, s, s, s, s};
  nb_shape o = {1, {32}};
  nbi_attrs a = {0};
  cr_expect_eq(nbi_shard_rule_of(NBI_OP_CONCAT, &a, many, 8, &o, &r), NB_ERR_INTERNAL);
  nb_clear_error();
  /* shapes the op cannot have: permute axis out of range, reshape count */
  a.i[0] = 5;
  cr_expect_eq(nbi_shard_rule_of(NBI_OP_PERMUTE, &a, &s, 1, &s, &r), NB_ERR_INTERNAL);
  nb_clear_error();
  cr_expect_eq(nbi_shard_rule_of(NBI_OP_RESHAPE, NULL, &s, 1, &(nb_shape){1, {5}}, &r),
               NB_ERR_INTERNAL);
  cr_expect(strstr(nb_last_error(), "reshape"), "%s", nb_last_error());
  nb_clear_error();
}

/* ---- the rules' shapes ---------------------------------------------------------- */

Test(sharding_rules, reshape_refinement) {
  nbi_shard_rule r;
  /* [8, 6] -> [48]: (i), (j) -> (i j), i = 8, j = 6 */
  rule_of_node(nb_reshape(zeros(NB_SHAPE(8, 6)), NB_SHAPE(48)), NBI_OP_RESHAPE, &r);
  DIM(&r, 0, 0, 8);
  DIM(&r, 0, 1, 6);
  DIM(&r, 1, 0, 8, 6);
  cr_expect_eq(r.dim[1][0].f[0], r.dim[0][0].f[0]);
  cr_expect_eq(r.dim[1][0].f[1], r.dim[0][1].f[0]);
  /* [8, 4] -> [2, 16]: (i j), (k) -> (i), (j k), i = 2, j = 4, k = 4 */
  rule_of_node(nb_reshape(zeros(NB_SHAPE(8, 4)), NB_SHAPE(2, 16)), NBI_OP_RESHAPE, &r);
  cr_expect_eq(r.n_factors, 3);
  DIM(&r, 0, 0, 2, 4);
  DIM(&r, 0, 1, 4);
  DIM(&r, 1, 0, 2);
  DIM(&r, 1, 1, 4, 4);
  cr_expect_eq(r.dim[1][0].f[0], r.dim[0][0].f[0]);
  cr_expect_eq(r.dim[1][1].f[0], r.dim[0][0].f[1]);
  cr_expect_eq(r.dim[1][1].f[1], r.dim[0][1].f[0]);
  for (int f = 0; f < r.n_factors; f++)
    cr_expect_eq(r.kind[f], NBI_FACTOR_PASS);
  cr_expect_eq(r.linear, NBI_LINEAR_UNARY);
  /* [12, 5] -> [4, 15]: 12 = 4 * 3, 15 = 3 * 5: (a b), (c) -> (a), (b c) */
  rule_of_node(nb_reshape(zeros(NB_SHAPE(12, 5)), NB_SHAPE(4, 15)), NBI_OP_RESHAPE, &r);
  DIM(&r, 0, 0, 4, 3);
  DIM(&r, 0, 1, 5);
  DIM(&r, 1, 0, 4);
  DIM(&r, 1, 1, 3, 5);
  /* [6, 4] -> [4, 6]: 6 and 4 do not divide each other: the group (the whole
   * shape, 24 = 24) is need-replication, each side's dims their own. */
  rule_of_node(nb_reshape(zeros(NB_SHAPE(6, 4)), NB_SHAPE(4, 6)), NBI_OP_RESHAPE, &r);
  cr_expect_eq(r.n_factors, 4);
  DIM(&r, 0, 0, 6);
  DIM(&r, 0, 1, 4);
  DIM(&r, 1, 0, 4);
  DIM(&r, 1, 1, 6);
  for (int f = 0; f < r.n_factors; f++)
    cr_expect_eq(r.kind[f], NBI_FACTOR_NEED_REPL);
  /* [3, 6, 4] -> [3, 4, 6]: the first group (3 = 3) still passes */
  rule_of_node(nb_reshape(zeros(NB_SHAPE(3, 6, 4)), NB_SHAPE(3, 4, 6)), NBI_OP_RESHAPE, &r);
  DIM(&r, 0, 0, 3);
  cr_expect_eq(r.dim[1][0].f[0], r.dim[0][0].f[0]);
  cr_expect_eq(r.kind[r.dim[0][0].f[0]], NBI_FACTOR_PASS);
  cr_expect_eq(r.kind[r.dim[0][1].f[0]], NBI_FACTOR_NEED_REPL);
  /* size-1 dims get no factor: [2, 1, 3] -> [6] is (i), (), (j) -> (i j) */
  rule_of_node(nb_reshape(zeros(NB_SHAPE(2, 1, 3)), NB_SHAPE(6)), NBI_OP_RESHAPE, &r);
  cr_expect_eq(r.dim[0][1].n, 0);
  DIM(&r, 1, 0, 2, 3);
  /* [2, 2, 2, 2, 2] -> [32]: at most 4 factors per dim: three of 2 pass, then
   * the rest of the group (4 on the result, 2 and 2 on the operand) is
   * need-replication. */
  rule_of_node(nb_reshape(zeros(NB_SHAPE(2, 2, 2, 2, 2)), NB_SHAPE(32)), NBI_OP_RESHAPE, &r);
  DIM(&r, 1, 0, 2, 2, 2, 4);
  for (int d = 0; d < 3; d++)
    cr_expect_eq(r.dim[1][0].f[d], r.dim[0][d].f[0]);
  cr_expect_eq(r.kind[r.dim[1][0].f[3]], NBI_FACTOR_NEED_REPL);
  cr_expect_eq(r.kind[r.dim[0][3].f[0]], NBI_FACTOR_NEED_REPL);
  cr_expect_neq(r.dim[0][3].f[0], r.dim[0][4].f[0]);
}

Test(sharding_rules, rule_kinds) {
  nbi_shard_rule r;
  /* matmul with batch broadcasting: [3, 1, 4, 6] @ [5, 6, 2] -> [3, 5, 4, 2]:
   * A's size-1 batch dim has no factor; k = 6 is the reduction. */
  rule_of_node(nb_matmul(zeros(NB_SHAPE(3, 1, 4, 6)), zeros(NB_SHAPE(5, 6, 2))), NBI_OP_MATMUL, &r);
  cr_expect_eq(r.dim[0][1].n, 0);
  cr_expect_eq(r.dim[0][0].f[0], r.dim[2][0].f[0]);
  cr_expect_eq(r.dim[1][0].f[0], r.dim[2][1].f[0]);
  cr_expect_eq(r.dim[0][3].f[0], r.dim[1][1].f[0]);
  cr_expect_eq(r.kind[r.dim[0][3].f[0]], NBI_FACTOR_REDUCTION);
  cr_expect_eq(r.kind[r.dim[2][2].f[0]], NBI_FACTOR_PASS);
  cr_expect_eq(r.linear, NBI_LINEAR_MULTI);
  /* 1-D operands: [6] @ [6] -> []: only k */
  rule_of_node(nb_matmul(zeros(NB_SHAPE(6)), zeros(NB_SHAPE(6))), NBI_OP_MATMUL, &r);
  cr_expect_eq(r.n_factors, 1);
  cr_expect_eq(r.kind[0], NBI_FACTOR_REDUCTION);
  /* conv2d: in channels are a reduction without a bias, need-replication
   * with one (the bias would be summed once per shard) */
  nb_tensor *img = zeros(NB_SHAPE(2, 4, 6, 6)), *w = zeros(NB_SHAPE(3, 4, 3, 3));
  rule_of_node(nb_conv2d(img, w, NULL, NULL), NBI_OP_CONV2D, &r);
  cr_expect_eq(r.kind[r.dim[0][1].f[0]], NBI_FACTOR_REDUCTION);
  cr_expect_eq(r.kind[r.dim[0][2].f[0]], NBI_FACTOR_NEED_REPL);
  cr_expect_eq(r.dim[1][0].f[0], r.dim[2][1].f[0]);
  cr_expect_eq(r.linear, NBI_LINEAR_MULTI);
  rule_of_node(nb_conv2d(img, w, zeros(NB_SHAPE(3)), NULL), NBI_OP_CONV2D, &r);
  cr_expect_eq(r.kind[r.dim[0][1].f[0]], NBI_FACTOR_NEED_REPL);
  cr_expect_eq(r.dim[2][0].f[0], r.dim[3][1].f[0]);
  cr_expect_eq(r.linear, NBI_LINEAR_NONE);
  /* reductions: sum's reduced dim is a reduction factor, max's need-replication */
  nb_tensor *x = zeros(NB_SHAPE(4, 6));
  rule_of_node(nb_sum(x, NB_AXES(1), true), NBI_OP_REDUCE_SUM, &r);
  cr_expect_eq(r.kind[r.dim[0][1].f[0]], NBI_FACTOR_REDUCTION);
  cr_expect_eq(r.dim[1][1].n, 0);
  cr_expect_eq(r.linear, NBI_LINEAR_UNARY);
  rule_of_node(nb_max(x, NB_AXES(1), false), NBI_OP_REDUCE_MAX, &r);
  cr_expect_eq(r.kind[r.dim[0][1].f[0]], NBI_FACTOR_NEED_REPL);
  cr_expect_eq(r.linear, NBI_LINEAR_NONE);
  /* slice: the sliced dim is a permutation factor per side, the other passes */
  rule_of_node(nb_slice(x, (int64_t[]){0, 1}, (int64_t[]){NB_END, 5}, (int64_t[]){1, 2}),
               NBI_OP_SLICE, &r);
  cr_expect_eq(r.dim[0][0].f[0], r.dim[1][0].f[0]);
  cr_expect_eq(r.kind[r.dim[0][1].f[0]], NBI_FACTOR_PERMUTATION);
  cr_expect_neq(r.dim[0][1].f[0], r.dim[1][1].f[0]);
  /* broadcast_to [6] -> [5, 6]: the new dim is the result's own factor */
  rule_of_node(nb_broadcast_to(zeros(NB_SHAPE(6)), NB_SHAPE(5, 6)), NBI_OP_BROADCAST_TO, &r);
  cr_expect_eq(r.dim[0][0].f[0], r.dim[1][1].f[0]);
  cr_expect_eq(r.size[r.dim[1][0].f[0]], 5);
  cr_expect_eq(r.kind[r.dim[1][0].f[0]], NBI_FACTOR_PASS);
  /* linearity by op */
  rule_of_node(nb_add(x, x), NBI_OP_ADD, &r);
  cr_expect_eq(r.linear, NBI_LINEAR_SUM);
  rule_of_node(nb_mul(x, x), NBI_OP_MUL, &r);
  cr_expect_eq(r.linear, NBI_LINEAR_MULTI);
  rule_of_node(nb_div(x, x), NBI_OP_DIV, &r);
  cr_expect_eq(r.linear, NBI_LINEAR_FIRST);
  rule_of_node(nb_neg(x), NBI_OP_NEG, &r);
  cr_expect_eq(r.linear, NBI_LINEAR_UNARY);
  rule_of_node(nb_exp(x), NBI_OP_EXP, &r);
  cr_expect_eq(r.linear, NBI_LINEAR_NONE);
  nb_tensor *bx = nb_gt(x, x);
  rule_of_node(nb_add(bx, bx), NBI_OP_ADD, &r); /* or on bool */
  cr_expect_eq(r.linear, NBI_LINEAR_NONE);
}

/* ---- propagation ------------------------------------------------------------------ */

Test(sharding_rules, reshape_propagation) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  /* [8, 4] -> [2, 16] = (i j), (k) -> (i), (j k), i = 2, j = 4, k = 4.
   * Operand [x, y]: x (4) splits into x:(1)2 (completes i) and x:(2)2 (on
   * j); y goes to k. j holds only 2 of its 4 in the result's compound dim
   * (j k), so k cannot follow (strided): k loses y, the operand is gathered
   * on dim 1. */
  nb_tensor *y = nb_reshape(zeros(NB_SHAPE(8, 4)), NB_SHAPE(2, 16));
  prop_node(m, y, SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x:(1)2, x:(2)2]", "[8,4]->[2,16] result");
  expect_sh(m, &r.tgt[0], "[x, _]", "[8,4]->[2,16] operand");
  /* [8, 6] -> [48] = (i), (j) -> (i j): x takes 4 of i's 8, so j cannot
   * follow in the result's dim: [x]; the operand loses y. */
  y = nb_reshape(zeros(NB_SHAPE(8, 6)), NB_SHAPE(48));
  prop_node(m, y, SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x]", "[8,6]->[48] result");
  expect_sh(m, &r.tgt[0], "[x, _]", "[8,6]->[48] operand");
  /* with (x, y) on dim 0, i = 8 is complete: [(x, y)] */
  prop_node(m, y, SPECS("[(x, y), _]"), NULL, &r);
  expect_sh(m, &r.out, "[(x, y)]", "[8,6]->[48] result, full i");
  expect_sh(m, &r.tgt[0], "[(x, y), _]", "[8,6]->[48] operand, full i");
  /* the other way: [48] [(x, y)] -> [8, 6]: (i j) with i = 8; x and y divide
   * i (8 / 4 = 2, 2 / 2 = 1): [(x, y), _] */
  y = nb_reshape(zeros(NB_SHAPE(48)), NB_SHAPE(8, 6));
  prop_node(m, y, SPECS("[(x, y)]"), NULL, &r);
  expect_sh(m, &r.out, "[(x, y), _]", "[48]->[8,6] result");
  expect_sh(m, &r.tgt[0], "[(x, y)]", "[48]->[8,6] operand");
  /* [6] [x] -> [2, 3] (non-divisible): i = 2 takes x:(1)2; x:(2)2 (2) does not
   * divide j = 3, which shares the operand's dim with i, so j gets nothing
   * and the operand keeps only the major half. */
  y = nb_reshape(zeros(NB_SHAPE(6)), NB_SHAPE(2, 3));
  prop_node(m, y, SPECS("[x]"), NULL, &r);
  expect_sh(m, &r.out, "[x:(1)2, _]", "[6]->[2,3] result");
  expect_sh(m, &r.tgt[0], "[x:(1)2]", "[6]->[2,3] operand");
  /* [6, 4] -> [4, 6] is need-replication throughout: everything gathered */
  y = nb_reshape(zeros(NB_SHAPE(6, 4)), NB_SHAPE(4, 6));
  prop_node(m, y, SPECS("[y, x]"), NULL, &r);
  expect_sh(m, &r.out, "[_, _]", "[6,4]->[4,6] result");
  expect_sh(m, &r.tgt[0], "[_, _]", "[6,4]->[4,6] operand");
}

Test(sharding_rules, elementwise_broadcasting) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  /* [4, 1] + [1, 8] -> [4, 8]: dim 0's factor only in X, dim 1's only in Y */
  nb_tensor *z = nb_add(zeros(NB_SHAPE(4, 1)), zeros(NB_SHAPE(1, 8)));
  prop_node(m, z, SPECS("[x, _]", "[_, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x, y]", "outer sum");
  expect_sh(m, &r.tgt[0], "[x, _]", "X");
  expect_sh(m, &r.tgt[1], "[_, y]", "Y");
  /* [16, 4] + [4]: Y (rank 1) right-aligns with dim 1 */
  z = nb_add(zeros(NB_SHAPE(16, 4)), zeros(NB_SHAPE(4)));
  prop_node(m, z, SPECS("[x, _]", "[y]"), NULL, &r);
  expect_sh(m, &r.out, "[x, y]", "row broadcast");
  expect_sh(m, &r.tgt[0], "[x, y]", "X gets y on dim 1 (a local slice)");
  expect_sh(m, &r.tgt[1], "[y]", "Y");
  /* an operand not on the mesh (NULL) is replicated: it is sliced to fit */
  prop_node(m, z, SPECS("[x, _]", NULL), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "with a plain operand");
  expect_sh(m, &r.tgt[1], "[_]", "plain operand");
  /* where(c, a, b) broadcasting three ways: c [8, 1], a [8, 4], b [4] */
  nb_tensor *c = nb_gt(zeros(NB_SHAPE(8, 1)), zeros(NB_SHAPE(8, 1)));
  z = nb_where(c, zeros(NB_SHAPE(8, 4)), zeros(NB_SHAPE(4)));
  prop_node(m, z, SPECS("[x, _]", NULL, "[y]"), NULL, &r);
  expect_sh(m, &r.out, "[x, y]", "where");
  expect_sh(m, &r.tgt[1], "[x, y]", "where's a");
}

Test(sharding_rules, conflicts_resolved_by_size) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  /* X [16, 4] on dim 0 (i) and Y [4] on j both want x; X holds both factors.
   * X (64 elements) beats Y (4): i gets x, j nothing, Y is gathered. */
  nb_tensor *z = nb_add(zeros(NB_SHAPE(16, 4)), zeros(NB_SHAPE(4)));
  prop_node(m, z, SPECS("[x, _]", "[x]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "larger X wins");
  expect_sh(m, &r.tgt[1], "[_]", "Y gathered");
  /* operands swapped: still the larger tensor's factor */
  z = nb_add(zeros(NB_SHAPE(4)), zeros(NB_SHAPE(16, 4)));
  prop_node(m, z, SPECS("[x]", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "larger Y wins");
  expect_sh(m, &r.tgt[0], "[_]", "X gathered");
  /* one factor, two proposals: X [8, 4] says y, Y [2, 8, 4] (64 > 32) says
   * x for the shared dim of 8: Y's x wins, X is resharded y -> x. */
  z = nb_add(zeros(NB_SHAPE(8, 4)), zeros(NB_SHAPE(2, 8, 4)));
  prop_node(m, z, SPECS("[y, _]", "[_, x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[_, x, _]", "mismatch: larger wins");
  expect_sh(m, &r.tgt[0], "[x, _]", "X resharded");
  expect_sh(m, &r.tgt[1], "[_, x, _]", "Y kept");
  /* equal sizes: the lower operand index wins */
  z = nb_add(zeros(NB_SHAPE(8, 4)), zeros(NB_SHAPE(8, 4)));
  prop_node(m, z, SPECS("[y, _]", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[y, _]", "tie: operand 0");
  expect_sh(m, &r.tgt[1], "[y, _]", "tie: operand 1 resharded");
}

Test(sharding_rules, priorities) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  /* the smaller X with priority 0 beats the larger Y with none */
  nb_tensor *z = nb_add(zeros(NB_SHAPE(8, 4)), zeros(NB_SHAPE(2, 8, 4)));
  prop_node(m, z, SPECS("[y@0, _]", "[_, x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[_, y, _]", "priority 0 wins");
  expect_sh(m, &r.tgt[0], "[y@0, _]", "X keeps its flags");
  expect_sh(m, &r.tgt[1], "[_, y, _]", "Y resharded");
  /* lower number wins: @1 over @2 */
  prop_node(m, z, SPECS("[y@2, _]", "[_, x@1, _]"), NULL, &r);
  expect_sh(m, &r.out, "[_, x, _]", "@1 beats @2");
  expect_sh(m, &r.tgt[0], "[x@2, _]", "X resharded");
  /* priorities order cross-factor conflicts too: Y [4] x@0 beats X [16, 4]
   * (larger) x on the other factor */
  z = nb_add(zeros(NB_SHAPE(16, 4)), zeros(NB_SHAPE(4)));
  prop_node(m, z, SPECS("[x, _]", "[x@0]"), NULL, &r);
  expect_sh(m, &r.out, "[_, x]", "priority over size");
  expect_sh(m, &r.tgt[0], "[_, x]", "X resharded");
  /* a lower-priority list still extends an agreeing prefix (shorter lists
   * never block) */
  z = nb_add(zeros(NB_SHAPE(16, 4)), zeros(NB_SHAPE(16, 4)));
  prop_node(m, z, SPECS("[x@0, _]", "[(x, y), _]"), NULL, &r);
  expect_sh(m, &r.out, "[(x, y), _]", "extension");
}

Test(sharding_rules, explicit_replication) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  nb_tensor *z = nb_add(zeros(NB_SHAPE(8, 4)), zeros(NB_SHAPE(8, 4)));
  /* X replicates x explicitly, Y proposes x, equal priority: replication
   * wins, nothing is sharded and Y is gathered */
  prop_node(m, z, SPECS("[_?, _] replicated(x)", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[_, _]", "replication wins");
  expect_sh(m, &r.tgt[0], "[_?, _] replicated(x)", "X");
  expect_sh(m, &r.tgt[1], "[_, _]", "Y gathered");
  /* with priority 0 on Y the proposal wins; X is sharded and loses the
   * replicated axis it now uses */
  prop_node(m, z, SPECS("[_?, _] replicated(x)", "[x@0, _]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "priority beats replication");
  expect_sh(m, &r.tgt[0], "[x?, _]", "X sharded");
  /* replication of another axis does not interfere and is kept */
  prop_node(m, z, SPECS("[_, _] replicated(y)", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "other axis");
  expect_sh(m, &r.tgt[0], "[x, _] replicated(y)", "X keeps replicated(y)");
}

Test(sharding_rules, constraints_closed_and_open) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  nb_tensor *e = nb_exp(zeros(NB_SHAPE(8, 4)));
  /* a closed constraint is exact: dim 1 stays unsharded, X is gathered on it */
  prop_node(m, e, SPECS("[x, y]"), "[x, _]", &r);
  expect_sh(m, &r.out, "[x, _]", "closed constraint");
  expect_sh(m, &r.tgt[0], "[x, _]", "operand fitted to it");
  /* an open dim may take more: y from the operand */
  prop_node(m, e, SPECS("[x, y]"), "[x, _?]", &r);
  expect_sh(m, &r.out, "[x, y?]", "open constraint");
  expect_sh(m, &r.tgt[0], "[x, y]", "operand kept");
  /* the constraint beats the operand, and extends it */
  prop_node(m, e, SPECS("[y, _]"), "[x, _]", &r);
  expect_sh(m, &r.out, "[x, _]", "constraint wins");
  expect_sh(m, &r.tgt[0], "[x, _]", "operand resharded");
  prop_node(m, e, SPECS("[x, _]"), "[(x, y), _]", &r);
  expect_sh(m, &r.out, "[(x, y), _]", "constraint extends");
  expect_sh(m, &r.tgt[0], "[(x, y), _]", "operand sliced");
  /* operands' closed dims do not block (aggressive, case 3); open ones are
   * extended alike and keep their flag */
  nb_tensor *z = nb_add(zeros(NB_SHAPE(16, 4)), zeros(NB_SHAPE(16, 4)));
  prop_node(m, z, SPECS("[x?, _]", "[(x, y), _]"), NULL, &r);
  expect_sh(m, &r.tgt[0], "[(x, y)?, _]", "open operand extended");
  /* a constraint on a compound result dim: [8] -> [2, 4] constrained to
   * [_, _] leaves the operand gathered */
  nb_tensor *y = nb_reshape(zeros(NB_SHAPE(8)), NB_SHAPE(2, 4));
  prop_node(m, y, SPECS("[x]"), "[_, _]", &r);
  expect_sh(m, &r.out, "[_, _]", "reshape constrained");
  expect_sh(m, &r.tgt[0], "[_]", "reshape operand gathered");
  /* and a constraint alone shards a constant's result */
  prop_node(m, zeros(NB_SHAPE(8, 4)), NULL, "[x, y]", &r);
  expect_sh(m, &r.out, "[x, y]", "constant");
}

Test(sharding_rules, reductions_make_partials) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  nb_tensor *x = zeros(NB_SHAPE(8, 4));
  /* sum over dim 1 sharded on y: the result holds partial sums over y */
  prop_node(m, nb_sum(x, NB_AXES(1), false), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x] partial(y)", "sum");
  expect_sh(m, &r.tgt[0], "[x, y]", "sum operand");
  prop_node(m, nb_sum(x, NB_AXES(1), true), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _] partial(y)", "sum keepdims");
  prop_node(m, nb_mean(x, NB_AXES(0), false), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[y] partial(x)", "mean over dim 0");
  prop_node(m, nb_sum(x, NB_ALL, false), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[] partial(x, y)", "sum of all");
  /* max, var, logsumexp, argmax: the reduced dim is gathered instead */
  prop_node(m, nb_max(x, NB_AXES(1), false), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x]", "max");
  expect_sh(m, &r.tgt[0], "[x, _]", "max operand gathered on dim 1");
  prop_node(m, nb_var(x, NB_AXES(1), false), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x]", "var");
  prop_node(m, nb_logsumexp(x, NB_AXES(0), false), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[y]", "logsumexp");
  expect_sh(m, &r.tgt[0], "[_, y]", "logsumexp operand");
  prop_node(m, nb_argmax(x, 1, false), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x]", "argmax");
  /* softmax / cumsum along dim 1: need-replication there */
  prop_node(m, nb_softmax(x, 1), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "softmax");
  expect_sh(m, &r.tgt[0], "[x, _]", "softmax operand");
  prop_node(m, nb_cumsum(x, 0), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[_, y]", "cumsum");
}

Test(sharding_rules, linearity_of_partials) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  nb_tensor *a = zeros(NB_SHAPE(8, 4)), *b = zeros(NB_SHAPE(8, 4));
  /* add: partial(y) + partial(y) stays partial(y) (sum of sums) */
  prop_node(m, nb_add(a, b), SPECS("[x, _] partial(y)", "[x, _] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[x, _] partial(y)", "add of partials");
  expect_sh(m, &r.tgt[0], "[x, _] partial(y)", "add: a keeps partial");
  expect_sh(m, &r.tgt[1], "[x, _] partial(y)", "add: b keeps partial");
  /* add: partial(y) + full: a is reduced first, the result is not partial */
  prop_node(m, nb_add(a, b), SPECS("[x, _] partial(y)", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "add of partial and full");
  expect_sh(m, &r.tgt[0], "[x, _]", "add: a all-reduced");
  /* ... and the reduced axis is free again: b's y shards dim 1, a's target
   * shards it too (a reduce-scatter) */
  prop_node(m, nb_sub(a, b), SPECS("[x, _] partial(y)", "[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x, y]", "sub: y reused");
  expect_sh(m, &r.tgt[0], "[x, y]", "sub: a reduce-scattered");
  /* mul: one partial operand stays partial */
  prop_node(m, nb_mul(a, b), SPECS("[x, _] partial(y)", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _] partial(y)", "mul with one partial");
  expect_sh(m, &r.tgt[0], "[x, _] partial(y)", "mul: a keeps partial");
  expect_sh(m, &r.tgt[1], "[x, _]", "mul: b");
  /* mul: both partial on y: the smaller one (c, [4]) is reduced, a keeps it */
  nb_tensor *c = zeros(NB_SHAPE(4));
  prop_node(m, nb_mul(a, c), SPECS("[x, _] partial(y)", "[_] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[x, _] partial(y)", "mul of two partials");
  expect_sh(m, &r.tgt[0], "[x, _] partial(y)", "mul: larger keeps");
  expect_sh(m, &r.tgt[1], "[_]", "mul: smaller all-reduced");
  /* mul: partial on different axes: sum_i a_i * sum_j b_j over devices (i, j) */
  prop_node(m, nb_mul(a, b), SPECS("[_, _] partial(x)", "[_, _] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[_, _] partial(x, y)", "mul over two axes");
  /* div: a partial numerator stays, a partial divisor is reduced */
  prop_node(m, nb_div(a, b), SPECS("[x, _] partial(y)", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _] partial(y)", "div numerator");
  prop_node(m, nb_div(a, b), SPECS("[x, _]", "[x, _] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "div divisor");
  expect_sh(m, &r.tgt[1], "[x, _]", "div: divisor all-reduced");
  /* unary: neg keeps, exp reduces */
  prop_node(m, nb_neg(a), SPECS("[x, _] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[x, _] partial(y)", "neg");
  prop_node(m, nb_exp(a), SPECS("[x, _] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "exp");
  expect_sh(m, &r.tgt[0], "[x, _]", "exp: operand all-reduced");
  /* views keep partials; a sum adds its own reduction axes */
  prop_node(m, nb_transpose(a), SPECS("[x, _] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[_, x] partial(y)", "transpose");
  prop_node(m, nb_sum(a, NB_AXES(0), false), SPECS("[x, _] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[_] partial(x, y)", "sum of a partial");
  /* pad: with 0 it stays linear, with 1 it is not (1 per shard) */
  int64_t pads[4] = {0, 0, 1, 1};
  prop_node(m, nb_pad(a, pads, 0), SPECS("[x, _] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[x, _] partial(y)", "pad 0");
  prop_node(m, nb_pad(a, pads, 1), SPECS("[x, _] partial(y)"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "pad 1");
  /* matmul with a partial left operand: stays partial, plus k's axes */
  nb_tensor *mm = nb_matmul(zeros(NB_SHAPE(8, 32)), zeros(NB_SHAPE(32, 16)));
  prop_node(m, mm, SPECS("[_, x] partial(y)", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[_, _] partial(x, y)", "matmul of a partial");
  /* a kept partial axis cannot shard a dim: B's y on n is dropped */
  prop_node(m, mm, SPECS("[_, _] partial(y)", "[_, y]"), NULL, &r);
  expect_sh(m, &r.out, "[_, _] partial(y)", "kept partial blocks y");
  expect_sh(m, &r.tgt[1], "[_, _]", "B gathered");
}

Test(sharding_rules, non_divisible_sizes) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  /* [5] over x = 4: ceil chunks 2, 2, 1, 0 are allowed for a factor alone
   * in its dims */
  nb_tensor *z = nb_add(zeros(NB_SHAPE(5)), zeros(NB_SHAPE(5)));
  prop_node(m, z, SPECS("[x]", "[_]"), NULL, &r);
  expect_sh(m, &r.out, "[x]", "add [5]");
  expect_sh(m, &r.tgt[1], "[x]", "add [5] other operand");
  /* matmul k = 5 over x: partial over x, B sliced on k */
  nb_tensor *mm = nb_matmul(zeros(NB_SHAPE(6, 5)), zeros(NB_SHAPE(5, 3)));
  prop_node(m, mm, SPECS("[_, x]", NULL), NULL, &r);
  expect_sh(m, &r.out, "[_, _] partial(x)", "matmul k = 5");
  expect_sh(m, &r.tgt[1], "[x, _]", "matmul B");
  /* 3 devices on a dim of 2 (one shard empty) */
  nb_mesh *m3 = mesh("x=3");
  prop_node(m3, nb_exp(zeros(NB_SHAPE(2, 7))), SPECS("[x, _]"), NULL, &r);
  expect_sh(m3, &r.out, "[x, _]", "exp [2] over 3");
}

Test(sharding_rules, shape_and_index_ops) {
  nb_mesh *m = mesh("x=4,y=2");
  prop_res r;
  nb_tensor *x = zeros(NB_SHAPE(8, 4));
  /* permute maps factors: [x, y] -> [y, x] */
  prop_node(m, nb_transpose(x), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[y, x]", "transpose");
  /* slice on dim 1 (permutation factor): dim 1 gathered, dim 0 passes */
  nb_tensor *s = nb_slice(x, (int64_t[]){0, 1}, (int64_t[]){NB_END, 3}, (int64_t[]){1, 1});
  prop_node(m, s, SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "slice");
  expect_sh(m, &r.tgt[0], "[x, _]", "slice operand");
  /* flip dim 0 */
  prop_node(m, nb_flip(x, NB_AXES(0)), SPECS("[x, y]"), NULL, &r);
  expect_sh(m, &r.out, "[_, y]", "flip");
  /* concat along 0: dim 1 passes, dim 0 gathered */
  nb_tensor *c = nb_concat((nb_tensor *[]){x, x}, 2, 0);
  prop_node(m, c, SPECS("[x, y]", "[_, y]"), NULL, &r);
  expect_sh(m, &r.out, "[_, y]", "concat");
  expect_sh(m, &r.tgt[0], "[_, y]", "concat operand");
  /* broadcast_to [4] -> [3, 4]: the new dim gets nothing */
  prop_node(m, nb_broadcast_to(zeros(NB_SHAPE(4)), NB_SHAPE(3, 4)), SPECS("[x]"), NULL, &r);
  expect_sh(m, &r.out, "[_, x]", "broadcast_to");
  /* take along dim 0 with idx [6]: t's dim 0 gathered, its dim 1 passes,
   * idx's dim passes to the result's dim 0 */
  nb_tensor *t = nb_take(x, izeros(NB_SHAPE(6)), 0);
  prop_node(m, t, SPECS("[x, y]", "[x]"), NULL, &r);
  expect_sh(m, &r.out, "[x, y]", "take");
  expect_sh(m, &r.tgt[0], "[_, y]", "take: table");
  expect_sh(m, &r.tgt[1], "[x]", "take: indices");
  /* one_hot: the new dim is need-replication */
  prop_node(m, nb_one_hot(izeros(NB_SHAPE(6)), 10, NB_F32), SPECS("[x]"), NULL, &r);
  expect_sh(m, &r.out, "[x, _]", "one_hot");
  /* matmul with a batch: [2, 8, 32] @ [32, 16] */
  nb_tensor *mm = nb_matmul(zeros(NB_SHAPE(2, 8, 32)), zeros(NB_SHAPE(32, 16)));
  prop_node(m, mm, SPECS("[y, _, x]", "[x, _]"), NULL, &r);
  expect_sh(m, &r.out, "[y, _, _] partial(x)", "batched matmul");
  /* conv2d: batch and out channels pass, in channels reduce, windows gathered */
  nb_tensor *img = zeros(NB_SHAPE(2, 4, 6, 6)), *w = zeros(NB_SHAPE(6, 4, 3, 3));
  nb_tensor *cv = nb_conv2d(img, w, NULL, NULL);
  prop_node(m, cv, SPECS("[y, x, _, _]", "[_, x, _, _]"), NULL, &r);
  expect_sh(m, &r.out, "[y, _, _, _] partial(x)", "conv2d");
  prop_node(m, cv, SPECS("[_, _, x, _]", "[y, _, _, _]"), NULL, &r);
  expect_sh(m, &r.out, "[_, y, _, _]", "conv2d spatial");
  expect_sh(m, &r.tgt[0], "[_, _, _, _]", "conv2d input gathered");
  /* with a bias the in channels are gathered instead */
  cv = nb_conv2d(img, w, zeros(NB_SHAPE(6)), NULL);
  prop_node(m, cv, SPECS("[y, x, _, _]", "[_, x, _, _]", NULL), NULL, &r);
  expect_sh(m, &r.out, "[y, _, _, _]", "conv2d with bias");
  expect_sh(m, &r.tgt[1], "[_, _, _, _]", "conv2d weight");
  /* max pool: N, C pass */
  prop_node(m, nb_max_pool2d(img, 2, 2, 0, 0, 0, 0), SPECS("[x, y, _, _]"), NULL, &r);
  expect_sh(m, &r.out, "[x, y, _, _]", "max_pool2d");
}

/* ---- invariants over every op and several meshes ---------------------------- */

/* A valid sharding: known (sub-)axes, none used twice or overlapping. */
static void check_valid(const nb_mesh *m, const nbi_sharding *s, const char *what) {
  char b[512];
  cr_assert_eq(nbi_sharding_check("test", m, s), NB_OK, "%s: %s: %s", what,
               tm_str(m, s, b, sizeof b), nb_last_error());
}

static bool same_axes(const nbi_dim_sharding *a, const nbi_dim_sharding *b) {
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (!nbi_axis_eq(&a->ax[i], &b->ax[i])) return false;
  return true;
}

/* The shardings agree with the rule: for every factor alone in its dims,
 * every tensor's dim holding it has the same axes; need-replication and
 * permutation dims are unsharded; a reduction factor's axes are partial in
 * the result. */
static void check_agrees(const nbi_shard_rule *r, const prop_res *res, const char *what) {
  int nt = r->n_in + 1;
  for (int f = 0; f < r->n_factors; f++) {
    const nbi_dim_sharding *first = NULL;
    bool alone = true;
    for (int t = 0; t < nt; t++)
      for (int d = 0; d < r->ndim[t]; d++)
        for (int i = 0; i < r->dim[t][d].n; i++)
          if (r->dim[t][d].f[i] == f && r->dim[t][d].n != 1) alone = false;
    if (!alone) continue;
    for (int t = 0; t < nt; t++) {
      const nbi_sharding *s = t < r->n_in ? &res->tgt[t] : &res->out;
      for (int d = 0; d < r->ndim[t]; d++) {
        if (r->dim[t][d].n != 1 || r->dim[t][d].f[0] != f) continue;
        const nbi_dim_sharding *ds = &s->dim[d];
        if (r->kind[f] == NBI_FACTOR_NEED_REPL || r->kind[f] == NBI_FACTOR_PERMUTATION)
          cr_assert_eq(ds->n, 0, "%s: a %s dim is sharded", what,
                       r->kind[f] == NBI_FACTOR_NEED_REPL ? "need-replication" : "permutation");
        if (!first) first = ds;
        cr_assert(same_axes(first, ds), "%s: factor %d sharded differently across tensors", what,
                  f);
        if (r->kind[f] == NBI_FACTOR_REDUCTION)
          for (int i = 0; i < ds->n; i++) {
            bool found = false;
            for (int j = 0; j < res->out.n_partial; j++) {
              const nbi_axis *p = &res->out.partial[j], *a = &ds->ax[i];
              found |=
                  p->axis == a->axis && p->pre <= a->pre && a->pre * a->size <= p->pre * p->size;
            }
            cr_assert(found, "%s: a reduction factor's axis is not partial in the result", what);
          }
      }
    }
  }
}

Test(sharding_rules, every_op_on_every_mesh) {
  const char *meshes[] = {"x=1", "x=2", "x=2,y=2", "x=4,y=2", "x=2,y=2,z=2"};
  nb_mesh *ms[5];
  for (int i = 0; i < 5; i++)
    ms[i] = mesh(meshes[i]);
  for (int op = 0; op < NBI_OP_COUNT; op++) {
    nb_tensor *y = sample(op);
    if (!y || y->n_in == 0) continue;
    nbi_shard_rule rule;
    rule_of_node(y, op, &rule);
    for (size_t mi = 0; mi < sizeof meshes / sizeof *meshes; mi++) {
      nb_mesh *m = ms[mi];
      /* every operand dim over every axis, then all operands' leading dims
       * over all axes in turn, and the same with a partial on the last axis */
      for (int k = 0; k < y->n_in; k++)
        for (int d = 0; d < y->in[k]->shape.ndim; d++)
          for (int a = 0; a < m->n_axes; a++)
            for (int partial = 0; partial < 2; partial++) {
              if (partial && (a == m->n_axes - 1 || m->size[m->n_axes - 1] == 1)) continue;
              nbi_sharding in[NBI_RULE_MAX_TENSORS];
              const nbi_sharding *inp[NBI_RULE_MAX_TENSORS];
              nb_shape shapes[NBI_RULE_MAX_TENSORS];
              for (int q = 0; q < y->n_in; q++) {
                shapes[q] = y->in[q]->shape;
                in[q] = tm_spec(m, shapes[q].ndim, "");
                int dd = q == k ? d : 0;
                if (shapes[q].ndim > 0 && m->size[a] > 1) {
                  in[q].dim[dd].ax[0] = (nbi_axis){a, 1, m->size[a]};
                  in[q].dim[dd].n = 1;
                }
                if (partial) {
                  in[q].partial[0] = (nbi_axis){m->n_axes - 1, 1, m->size[m->n_axes - 1]};
                  in[q].n_partial = 1;
                }
                inp[q] = &in[q];
              }
              prop_res res;
              char what[160];
              snprintf(what, sizeof what, "%s on %s (operand %d dim %d axis %d%s)",
                       nbi_op_table[op]->name, meshes[mi], k, d, a, partial ? ", partial" : "");
              cr_assert_eq(nbi_propagate("test", m, &rule, inp, shapes, NULL, res.tgt, &res.out),
                           NB_OK, "%s: %s", what, nb_last_error());
              for (int q = 0; q < y->n_in; q++)
                check_valid(m, &res.tgt[q], what);
              check_valid(m, &res.out, what);
              check_agrees(&rule, &res, what);
            }
      /* backward: a constraint on each result dim over each axis, operands
       * replicated; a pass factor alone in its dims must take it */
      int res_t = y->n_in;
      for (int d = 0; d < y->shape.ndim; d++)
        for (int a = 0; a < m->n_axes; a++) {
          if (m->size[a] == 1) continue;
          nbi_sharding c = tm_spec(m, y->shape.ndim, ""), in[NBI_RULE_MAX_TENSORS];
          c.dim[d].ax[0] = (nbi_axis){a, 1, m->size[a]};
          c.dim[d].n = 1;
          const nbi_sharding *inp[NBI_RULE_MAX_TENSORS];
          nb_shape shapes[NBI_RULE_MAX_TENSORS];
          for (int q = 0; q < y->n_in; q++) {
            shapes[q] = y->in[q]->shape;
            in[q] = tm_spec(m, shapes[q].ndim, "");
            inp[q] = &in[q];
          }
          prop_res res;
          char what[160];
          snprintf(what, sizeof what, "%s on %s (result dim %d over axis %d)",
                   nbi_op_table[op]->name, meshes[mi], d, a);
          cr_assert_eq(nbi_propagate("test", m, &rule, inp, shapes, &c, res.tgt, &res.out), NB_OK,
                       "%s: %s", what, nb_last_error());
          for (int q = 0; q < y->n_in; q++)
            check_valid(m, &res.tgt[q], what);
          check_valid(m, &res.out, what);
          check_agrees(&rule, &res, what);
          if (rule.dim[res_t][d].n != 1) continue;
          int f = rule.dim[res_t][d].f[0];
          bool alone = rule.kind[f] == NBI_FACTOR_PASS;
          for (int t = 0; t <= y->n_in; t++)
            for (int e = 0; e < rule.ndim[t]; e++)
              for (int i = 0; i < rule.dim[t][e].n; i++)
                alone = alone && (rule.dim[t][e].f[i] != f || rule.dim[t][e].n == 1);
          if (alone) cr_expect(same_axes(&res.out.dim[d], &c.dim[d]), "%s: not honoured", what);
        }
    }
  }
}

Test(sharding_rules, zero_size_dims) {
  nb_mesh *m = mesh("x=4,y=2");
  nbi_shard_rule r;
  /* [0, 3] -> [3, 0]: nothing to refine, every dim its own need-replication
   * factor (sizes 0 and 3) */
  nb_tensor *y = nb_reshape(zeros(NB_SHAPE(0, 3)), NB_SHAPE(3, 0));
  rule_of_node(y, NBI_OP_RESHAPE, &r);
  DIM(&r, 0, 0, 0);
  DIM(&r, 1, 1, 0);
  for (int f = 0; f < r.n_factors; f++)
    cr_expect_eq(r.kind[f], NBI_FACTOR_NEED_REPL);
  prop_res res;
  prop_node(m, y, SPECS("[x, y]"), NULL, &res);
  expect_sh(m, &res.out, "[_, _]", "empty reshape");
  /* an empty dim alone in its dims may stay sharded (every shard empty) */
  prop_node(m, nb_exp(zeros(NB_SHAPE(0, 4))), SPECS("[x, y]"), NULL, &res);
  expect_sh(m, &res.out, "[x, y]", "exp of an empty tensor");
}

Test(sharding_rules, propagate_rejects_bad_input) {
  nb_mesh *m = mesh("x=4,y=2");
  nbi_shard_rule r;
  rule_of_node(nb_exp(zeros(NB_SHAPE(8, 4))), NBI_OP_EXP, &r);
  nb_shape s = {2, {8, 4}};
  nbi_sharding bad = tm_spec(m, 2, "[x, _]"), tgt, out;
  bad.dim[0].ax[0].axis = 7; /* no such axis */
  const nbi_sharding *in[1] = {&bad};
  cr_expect_eq(nbi_propagate("nb_test", m, &r, in, &s, NULL, &tgt, &out), NB_ERR_SHARDING);
  cr_expect(strstr(nb_last_error(), "nb_test"), "%s", nb_last_error());
  nb_clear_error();
  nbi_sharding rank1 = tm_spec(m, 1, "[x]");
  in[0] = &rank1;
  cr_expect_eq(nbi_propagate("nb_test", m, &r, in, &s, NULL, &tgt, &out), NB_ERR_INTERNAL);
  nb_clear_error();
}
