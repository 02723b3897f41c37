/* test/test_gprop.c — graph-mode propagation (src/sharding/gprop.c) and
 * sharding constraints (src/sharding/constraint.c): a constraint spreads
 * backward and forward through a traced program, constraints inside nb_jit
 * and nb_grad'd functions, gradients laid out like their primals (data
 * parallel, Megatron) with exact collective counts, jit replays counting
 * their collectives on every call, the constraints' derivatives and batching,
 * nb_reshard of traced values, errors. Values are always those of the
 * unsharded computation. */
#include "grad_check.h"

#include "../src/sharding/sharding.h"

TestSuite(gprop, .init = tc_setup, .fini = tc_teardown);

typedef struct counts {
  uint64_t ar, ag, rs, a2a, perm;
} counts;

static counts since(const nb_stats *s0) {
  nb_stats s = nb_get_stats();
  return (counts){s.n_all_reduce - s0->n_all_reduce, s.n_all_gather - s0->n_all_gather,
                  s.n_reduce_scatter - s0->n_reduce_scatter, s.n_all_to_all - s0->n_all_to_all,
                  s.n_permute - s0->n_permute};
}

#define ASSERT_COUNTS(c, AR, AG, RS, A2A, PERM)                                                    \
  cr_assert((c).ar == (uint64_t)(AR) && (c).ag == (uint64_t)(AG) && (c).rs == (uint64_t)(RS) &&    \
                (c).a2a == (uint64_t)(A2A) && (c).perm == (uint64_t)(PERM),                        \
            "collectives: all-reduce %llu all-gather %llu reduce-scatter %llu all-to-all %llu "    \
            "permute %llu; expected %d %d %d %d %d",                                               \
            (unsigned long long)(c).ar, (unsigned long long)(c).ag, (unsigned long long)(c).rs,    \
            (unsigned long long)(c).a2a, (unsigned long long)(c).perm, (int)(AR), (int)(AG),       \
            (int)(RS), (int)(A2A), (int)(PERM))

#define ASSERT_SPEC(t, spec)                                                                       \
  do {                                                                                             \
    cr_assert((t), "%s", nb_last_error());                                                         \
    cr_assert_str_eq(nb_sharding_str(t), (spec));                                                  \
  } while (0)

static nb_tensor *rand_f64(nb_shape s, uint64_t *seed) {
  double *x = tc_rand_floats(tc_numel(s), NB_F64, seed);
  nb_tensor *t = tc_tensor(x, s, NB_F64);
  free(x);
  return t;
}

static nb_tensor *sharded(nb_tensor *t, nb_mesh *m, const char *spec) {
  nb_tensor *s = nb_shard(t, m, spec);
  cr_assert(s, "nb_shard %s: %s", spec, nb_last_error());
  return s;
}

/* got equals ref (both readable) to tol relative. */
static void assert_same(nb_tensor *got, nb_tensor *ref, double tol) {
  cr_assert(got && ref, "%s", nb_last_error());
  cr_assert(nbi_shape_eq(&got->shape, &ref->shape));
  double *r = tc_read(ref);
  tc_assert_close_tol(got, r, ref->shape, tol);
  free(r);
}

/* ---- a constraint spreads backward -------------------------------------------------- */
/* h = relu(x); y = nb_shard(h @ W, m, "tp, _"); returns (h, y) */
static nb_status relu_mm_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_mesh *m = u;
  out[0] = nb_relu(in[0]);
  out[1] = nb_shard(nb_matmul(out[0], in[1]), m, "tp, _");
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

Test(gprop, constraint_shards_an_intermediate_backward) {
  nb_mesh *m = nb_mesh_cpu("tp=2");
  uint64_t seed = 1;
  nb_tensor *x = rand_f64(NB_SHAPE(8, 4), &seed), *w = rand_f64(NB_SHAPE(4, 6), &seed);
  nb_fn *f = nb_fn_create(relu_mm_body, m, 2, 2), *j = nb_jit(f);
  nb_tensor *ref[2], *got[2], *plain[2];
  cr_assert_eq(nb_call(f, (nb_tensor *[]){x, w}, ref), NB_OK, "%s", nb_last_error());
  /* jit on one device: the constraint is the identity */
  cr_assert_eq(nb_call(j, (nb_tensor *[]){x, w}, plain), NB_OK, "%s", nb_last_error());
  cr_assert_null(nb_mesh_of(plain[1]));
  assert_same(plain[1], ref[1], 0);
  nb_stats s0 = nb_get_stats();
  nb_tensor *sx = sharded(x, m, "_, _"), *sw = sharded(w, m, "_, _");
  cr_assert_eq(nb_call(j, (nb_tensor *[]){sx, sw}, got), NB_OK, "%s", nb_last_error());
  ASSERT_SPEC(got[0], "[tp, _]"); /* relu ran on row blocks: the constraint reached it */
  ASSERT_SPEC(got[1], "[tp, _]");
  ASSERT_COUNTS(since(&s0), 0, 0, 0, 0, 0);
  assert_same(got[0], ref[0], 0);
  assert_same(got[1], ref[1], 1e-12);
  nb_fn_release(j);
  nb_fn_release(f);
  nb_mesh_release(m);
}

/* ---- gradients laid out like their primals ------------------------------------------- */
/* mean(square(act(x @ W1) @ W2)): act tanh (u NULL) or relu */
static nb_status mlp_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *h = nb_matmul(in[0], in[1]);
  h = u ? nb_relu(h) : nb_tanh(h);
  out[0] = nb_mean(nb_square(nb_matmul(h, in[2])), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

typedef struct mlp_case {
  const char *x, *w1, *w2;   /* input specs */
  const char *g1, *g2;       /* expected gradient layouts */
  int ar, ag, rs, a2a, perm; /* expected collectives of one call */
  bool relu;
} mlp_case;

/* grad (argnums 1, 2) of the MLP loss on sharded inputs, eagerly through
 * call_sharded and through nb_jit (three calls): layouts and counts exact,
 * values those of the unsharded gradient. */
static void check_mlp_grad(const mlp_case *c) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 11;
  nb_tensor *x = rand_f64(NB_SHAPE(8, 4), &seed), *w1 = rand_f64(NB_SHAPE(4, 6), &seed),
            *w2 = rand_f64(NB_SHAPE(6, 4), &seed);
  nb_fn *f = nb_fn_create(mlp_body, c->relu ? (void *)1 : NULL, 3, 1),
        *g = nb_grad(f, NB_AXES(1, 2)), *j = nb_jit(g);
  nb_tensor *ref[2], *got[2];
  cr_assert_eq(nb_call(g, (nb_tensor *[]){x, w1, w2}, ref), NB_OK, "%s", nb_last_error());
  nb_tensor *in[3] = {sharded(x, m, c->x), sharded(w1, m, c->w1), sharded(w2, m, c->w2)};
  for (int call = 0; call < 4; call++) {
    nb_stats s0 = nb_get_stats();
    cr_assert_eq(nb_call(call ? j : g, in, got), NB_OK, "call %d: %s", call, nb_last_error());
    counts n = since(&s0);
    ASSERT_SPEC(got[0], c->g1);
    ASSERT_SPEC(got[1], c->g2);
    ASSERT_COUNTS(n, c->ar, c->ag, c->rs, c->a2a, c->perm);
    assert_same(got[0], ref[0], 1e-12);
    assert_same(got[1], ref[1], 1e-12);
  }
  nb_fn_release(j);
  nb_fn_release(g);
  nb_fn_release(f);
  nb_mesh_release(m);
}

Test(gprop, data_parallel_grad_is_replicated_one_all_reduce_per_weight) {
  check_mlp_grad(&(mlp_case){"dp, _", "_, _", "_, _", "[_, _]", "[_, _]", 2, 0, 0, 0, 0, false});
}

Test(gprop, megatron_grad_keeps_the_weights_layouts) {
  check_mlp_grad(&(mlp_case){"dp, _", "_, tp", "tp, _", "[_, tp]", "[tp, _]", 3, 0, 0, 0, 0, true});
}

/* jit's cache keeps traces made under a trace mesh (with gradients laid out
 * like their primals) apart from the others. */
Test(gprop, jit_cache_is_keyed_by_the_trace_mesh) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 12;
  nb_tensor *x = rand_f64(NB_SHAPE(8, 4), &seed), *w1 = rand_f64(NB_SHAPE(4, 6), &seed),
            *w2 = rand_f64(NB_SHAPE(6, 4), &seed);
  nb_fn *f = nb_fn_create(mlp_body, NULL, 3, 1), *g = nb_grad(f, NB_AXES(1, 2)), *j = nb_jit(g);
  nb_tensor *plain[3] = {x, w1, w2},
            *sh[3] = {sharded(x, m, "dp, _"), sharded(w1, m, "_, _"), sharded(w2, m, "_, _")};
  nb_tensor *ref[2], *got[2];
  cr_assert_eq(nb_call(g, plain, ref), NB_OK, "%s", nb_last_error());
  static const bool use_mesh[4] = {false, true, false, true};
  static const uint64_t hits[4] = {0, 0, 1, 1};
  for (int call = 0; call < 4; call++) {
    nb_stats s0 = nb_get_stats();
    cr_assert_eq(nb_call(j, use_mesh[call] ? sh : plain, got), NB_OK, "%s", nb_last_error());
    nb_stats s1 = nb_get_stats();
    cr_assert_eq(s1.jit_cache_hits - s0.jit_cache_hits, hits[call], "call %d", call);
    cr_assert_eq(s1.jit_cache_misses - s0.jit_cache_misses, 1 - hits[call], "call %d", call);
    for (int k = 0; k < 2; k++) {
      cr_assert((nb_mesh_of(got[k]) == m) == use_mesh[call], "call %d", call);
      assert_same(got[k], ref[k], 1e-12);
    }
  }
  nb_fn_release(j);
  nb_fn_release(g);
  nb_fn_release(f);
  nb_mesh_release(m);
}

/* ---- constraints in traced functions -------------------------------------------------- */
/* loss(x, W) = sum(tanh(nb_shard(x @ W, m, spec))^2) */
typedef struct cst {
  nb_mesh *m;
  const char *spec;
} cst;

static nb_status constrained_loss(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                  int n_out) {
  (void)n_in, (void)n_out;
  const cst *c = u;
  nb_tensor *h = nb_shard(nb_matmul(in[0], in[1]), c->m, c->spec);
  out[0] = nb_sum(nb_square(nb_tanh(h)), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* h = x @ W constrained to [_, tp] inside a grad'd function with x and W
 * replicated: the backward runs column-sharded too, so the gradients come
 * out partial over tp where they sum over h's columns (x's: one all-reduce)
 * and column-sharded where they do not (W's, laid out like W: gathered). */
Test(gprop, constraint_inside_a_grad) {
  nb_mesh *m = nb_mesh_cpu("tp=2");
  uint64_t seed = 13;
  nb_tensor *x = rand_f64(NB_SHAPE(6, 4), &seed), *w = rand_f64(NB_SHAPE(4, 8), &seed);
  cst c = {m, "_, tp"};
  nb_fn *f = nb_fn_create(constrained_loss, &c, 2, 1), *g = nb_grad(f, NB_ALL);
  nb_tensor *ref[2], *got[2];
  cr_assert_eq(nb_call(g, (nb_tensor *[]){x, w}, ref), NB_OK, "%s", nb_last_error());
  /* one device: the constraint and its transpose are views; values by hand */
  double *xv = tc_read(x), *wv = tc_read(w), gx[24] = {0}, gw[32] = {0};
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 8; j++) {
      double h = 0;
      for (int k = 0; k < 4; k++)
        h += xv[i * 4 + k] * wv[k * 8 + j];
      double t = tanh(h), d = 2 * t * (1 - t * t);
      for (int k = 0; k < 4; k++) {
        gx[i * 4 + k] += d * wv[k * 8 + j];
        gw[k * 8 + j] += d * xv[i * 4 + k];
      }
    }
  tc_assert_close_tol(ref[0], gx, NB_SHAPE(6, 4), 1e-12);
  tc_assert_close_tol(ref[1], gw, NB_SHAPE(4, 8), 1e-12);
  nb_stats s0 = nb_get_stats();
  cr_assert_eq(nb_call(g, (nb_tensor *[]){sharded(x, m, "_, _"), sharded(w, m, "_, _")}, got),
               NB_OK, "%s", nb_last_error());
  counts n = since(&s0);
  ASSERT_SPEC(got[0], "[_, _]");
  ASSERT_SPEC(got[1], "[_, _]");
  ASSERT_COUNTS(n, 1, 1, 0, 0, 0);
  assert_same(got[0], ref[0], 1e-12);
  assert_same(got[1], ref[1], 1e-12);
  free(xv), free(wv);
  nb_fn_release(g);
  nb_fn_release(f);
  nb_mesh_release(m);
}

/* x * 2 returned under a constraint: the output has the constraint's layout
 * (a closed value is resharded when the op's result differs). */
static nb_status doubled_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const cst *c = u;
  out[0] = nb_shard(nb_mul(in[0], nb_scalar(2.0, NB_F64)), c->m, c->spec);
  return out[0] ? NB_OK : nb_last_status();
}

Test(gprop, constraint_on_an_output_is_honoured) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  uint64_t seed = 14;
  nb_tensor *x = rand_f64(NB_SHAPE(8, 4), &seed);
  double *xv = tc_read(x), want[32];
  for (int i = 0; i < 32; i++)
    want[i] = 2 * xv[i];
  static const struct {
    const char *in, *out;
    int ar, ag, rs, a2a, perm;
  } cases[] = {{"x, _", "_, x", 0, 0, 0, 1, 0},
               {"x, _", "(x, y), _", 0, 0, 0, 0, 0},
               {"(x, y), _", "_, _", 0, 1, 0, 0, 0},
               {"_, _", "y, x", 0, 0, 0, 0, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    cst c = {m, cases[i].out};
    nb_fn *f = nb_fn_create(doubled_body, &c, 1, 1), *j = nb_jit(f);
    nb_tensor *sx = sharded(x, m, cases[i].in), *y;
    nb_stats s0 = nb_get_stats();
    cr_assert_eq(nb_call(j, &sx, &y), NB_OK, "%s", nb_last_error());
    counts n = since(&s0);
    char spec[64];
    snprintf(spec, sizeof spec, "[%s]", cases[i].out);
    ASSERT_SPEC(y, spec);
    ASSERT_COUNTS(n, cases[i].ar, cases[i].ag, cases[i].rs, cases[i].a2a, cases[i].perm);
    tc_assert_close_tol(y, want, NB_SHAPE(8, 4), 0);
    nb_fn_release(j);
    nb_fn_release(f);
  }
  free(xv);
  nb_mesh_release(m);
}

/* The reshard planner gathers only the dimensions whose blocks change. */
Test(gprop, reshard_gathers_only_the_changed_dimension) {
  nb_mesh *m = nb_mesh_cpu("tp=2");
  uint64_t seed = 15;
  nb_tensor *x = rand_f64(NB_SHAPE(4, 8), &seed);
  nb_tensor *s = sharded(x, m, "_, tp");
  nb_stats s0 = nb_get_stats();
  nb_tensor *r = nb_reshard(s, "_, _");
  ASSERT_SPEC(r, "[_, _]");
  ASSERT_COUNTS(since(&s0), 0, 1, 0, 0, 0);
  assert_same(r, x, 0);
  nb_mesh_release(m);
}

/* ---- derivatives and batching of the constraints ---------------------------------------- */
/* sin(shard_like(nb_shard(a * b, m, "x, _") * a, b)) */
static nb_status both_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *z = nb_shard(nb_mul(in[0], in[1]), u, "x, _");
  out[0] = nb_sin(nbi_shard_like(nb_mul(z, in[0]), in[1]));
  return out[0] ? NB_OK : nb_last_status();
}

Test(gprop, constraint_derivatives_match_finite_differences) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  uint64_t seed = 16;
  nb_tensor *xs[2] = {tc_rand_f64(NB_SHAPE(4, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(4, 3), -1, 1, &seed)};
  tc_check_grad("constraints", both_body, m, 2, xs, TC_SECOND);
  nb_mesh_release(m);
}

/* vjp and jvp of the same body on sharded values (graph mode) equal the
 * plain ones; cotangents come out laid out like their primals. */
Test(gprop, constraint_derivatives_on_sharded_values) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  uint64_t seed = 17;
  nb_tensor *a = rand_f64(NB_SHAPE(4, 3), &seed), *b = rand_f64(NB_SHAPE(4, 3), &seed),
            *u = rand_f64(NB_SHAPE(4, 3), &seed), *v = rand_f64(NB_SHAPE(4, 3), &seed);
  nb_fn *f = nb_fn_create(both_body, m, 2, 1), *vj = nb_vjp_fn(f), *jv = nb_jvp_fn(f);
  nb_tensor *ref[3], *got[3];
  cr_assert_eq(nb_call(vj, (nb_tensor *[]){a, b, u}, ref), NB_OK, "%s", nb_last_error());
  cr_assert_eq(
      nb_call(vj,
              (nb_tensor *[]){sharded(a, m, "_, y"), sharded(b, m, "y, _"), sharded(u, m, "_, _")},
              got),
      NB_OK, "%s", nb_last_error());
  ASSERT_SPEC(got[0], "[y, _]"); /* the output: laid out like b */
  ASSERT_SPEC(got[1], "[_, y]");
  ASSERT_SPEC(got[2], "[y, _]");
  for (int k = 0; k < 3; k++)
    assert_same(got[k], ref[k], 1e-12);
  cr_assert_eq(nb_call(jv, (nb_tensor *[]){a, b, u, v}, ref), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(jv,
                       (nb_tensor *[]){sharded(a, m, "x, _"), sharded(b, m, "_, _"),
                                       sharded(u, m, "_, x"), sharded(v, m, "y, _")},
                       got),
               NB_OK, "%s", nb_last_error());
  for (int k = 0; k < 2; k++)
    assert_same(got[k], ref[k], 1e-12);
  nb_fn_release(jv);
  nb_fn_release(vj);
  nb_fn_release(f);
  nb_mesh_release(m);
}

/* a per-example x of shape (8,) constrained to "x": batched, the batch
 * dimension stays unsharded */
static nb_status twice_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = nb_shard(nb_mul(in[0], nb_scalar(2.0, NB_F64)), u, "x");
  return out[0] ? NB_OK : nb_last_status();
}

Test(gprop, constraint_batching_prepends_an_unsharded_dimension) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  uint64_t seed = 18;
  nb_tensor *x = rand_f64(NB_SHAPE(3, 8), &seed), *y[1], *z[1];
  double *xv = tc_read(x), want[24];
  for (int i = 0; i < 24; i++)
    want[i] = 2 * xv[i];
  nb_fn *f = nb_fn_create(twice_body, m, 1, 1), *vf = nb_vmap(f, NULL, NULL);
  cr_assert_eq(nb_call(vf, &x, y), NB_OK, "%s", nb_last_error());
  tc_assert_close_tol(y[0], want, NB_SHAPE(3, 8), 0);
  nb_stats s0 = nb_get_stats();
  nb_tensor *sx = sharded(x, m, "_, _");
  cr_assert_eq(nb_call(vf, &sx, z), NB_OK, "%s", nb_last_error());
  ASSERT_SPEC(z[0], "[_, x]");
  ASSERT_COUNTS(since(&s0), 0, 0, 0, 0, 0);
  tc_assert_close_tol(z[0], want, NB_SHAPE(3, 8), 0);
  free(xv);
  nb_fn_release(vf);
  nb_fn_release(f);
  nb_mesh_release(m);
}

/* vmap(grad) and jvp(grad) on sharded values: the gradients' shard_like is
 * batched and differentiated; values equal the plain ones. */
Test(gprop, shard_like_under_vmap_and_jvp) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 19;
  nb_tensor *x = rand_f64(NB_SHAPE(3, 8, 4), &seed), *w1 = rand_f64(NB_SHAPE(4, 6), &seed),
            *w2 = rand_f64(NB_SHAPE(6, 4), &seed), *t1 = rand_f64(NB_SHAPE(4, 6), &seed),
            *t2 = rand_f64(NB_SHAPE(6, 4), &seed);
  nb_fn *f = nb_fn_create(mlp_body, NULL, 3, 1), *g = nb_grad(f, NB_AXES(1, 2));
  nb_fn *vg = nb_vmap(g, (int[]){0, NB_NOT_MAPPED, NB_NOT_MAPPED}, NULL);
  nb_tensor *ref[2], *got[2];
  cr_assert(vg, "%s", nb_last_error());
  cr_assert_eq(nb_call(vg, (nb_tensor *[]){x, w1, w2}, ref), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(vg,
                       (nb_tensor *[]){sharded(x, m, "_, dp, _"), sharded(w1, m, "_, tp"),
                                       sharded(w2, m, "tp, _")},
                       got),
               NB_OK, "%s", nb_last_error());
  ASSERT_SPEC(got[0], "[_, _, tp]");
  ASSERT_SPEC(got[1], "[_, tp, _]");
  for (int k = 0; k < 2; k++)
    assert_same(got[k], ref[k], 1e-12);
  nb_fn *jg = nb_jvp_fn(g);
  nb_tensor *x0 =
      nb_reshape(nb_slice(x, (int64_t[]){0, 0, 0}, (int64_t[]){1, 8, 4}, (int64_t[]){1, 1, 1}),
                 NB_SHAPE(8, 4));
  nb_tensor *zx = nb_zeros(NB_SHAPE(8, 4), NB_F64), *jref[4], *jgot[4];
  cr_assert_eq(nb_call(jg, (nb_tensor *[]){x0, w1, w2, zx, t1, t2}, jref), NB_OK, "%s",
               nb_last_error());
  cr_assert_eq(nb_call(jg,
                       (nb_tensor *[]){sharded(x0, m, "dp, _"), sharded(w1, m, "_, tp"),
                                       sharded(w2, m, "tp, _"), zx, sharded(t1, m, "_, tp"),
                                       sharded(t2, m, "tp, _")},
                       jgot),
               NB_OK, "%s", nb_last_error());
  for (int k = 0; k < 4; k++)
    assert_same(jgot[k], jref[k], 1e-12);
  nb_fn_release(jg);
  nb_fn_release(vg);
  nb_fn_release(g);
  nb_fn_release(f);
  nb_mesh_release(m);
}

/* nbi_shard_like outside traces: the identity on one device; on a mesh, g
 * moved to x's dimension layout, its partial sums reduced. */
Test(gprop, shard_like_on_values) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  uint64_t seed = 20;
  nb_tensor *g = rand_f64(NB_SHAPE(4, 6), &seed), *x = rand_f64(NB_SHAPE(4, 6), &seed);
  nb_tensor *r = nbi_shard_like(g, x);
  cr_assert(r && !nb_mesh_of(r), "%s", nb_last_error());
  assert_same(r, g, 0);
  nb_tensor *sg = sharded(g, m, "_, _ partial(y)"), *sx = sharded(x, m, "y, x");
  nb_stats s0 = nb_get_stats();
  r = nbi_shard_like(sg, sx);
  ASSERT_SPEC(r, "[y, x]");
  ASSERT_COUNTS(since(&s0), 0, 0, 1, 0, 0); /* the partial sum reduce-scattered over y */
  assert_same(r, g, 1e-15);
  r = nbi_shard_like(sx, g); /* x on no mesh: replicated */
  ASSERT_SPEC(r, "[_, _]");
  assert_same(r, x, 0);
  cr_assert_null(nbi_shard_like(g, nb_zeros(NB_SHAPE(6, 4), NB_F64)));
  tc_assert_error(NB_ERR_SHAPE, "laid out like");
  nb_mesh_release(m);
}

/* ---- nb_reshard of traced values, errors ----------------------------------------------------- */
static nb_status reshard_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_reshard(nb_exp(in[0]), "_, x");
  return out[0] ? NB_OK : nb_last_status();
}

Test(gprop, reshard_of_a_traced_value_uses_the_calls_mesh) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  uint64_t seed = 21;
  nb_tensor *x = rand_f64(NB_SHAPE(4, 6), &seed), *y;
  nb_fn *f = nb_fn_create(reshard_body, NULL, 1, 1), *j = nb_jit(f);
  nb_tensor *ref = nb_exp(x), *sx = sharded(x, m, "x, _");
  nb_stats s0 = nb_get_stats();
  cr_assert_eq(nb_call(j, &sx, &y), NB_OK, "%s", nb_last_error());
  ASSERT_SPEC(y, "[_, x]");
  ASSERT_COUNTS(since(&s0), 0, 0, 0, 1, 0); /* exp ran on row blocks, then one all-to-all */
  assert_same(y, ref, 0);
  /* traced on one device there is no mesh to reshard on */
  cr_assert_neq(nb_call(j, &x, &y), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "nb_reshard: the tensor is on no mesh");
  nb_fn_release(j);
  nb_fn_release(f);
  nb_mesh_release(m);
}

static nb_status bad_spec_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                               int n_out) {
  (void)n_in, (void)n_out;
  out[0] = nb_shard(nb_exp(in[0]), u, "z, _");
  return out[0] ? NB_OK : nb_last_status();
}

Test(gprop, errors) {
  nb_mesh *m = nb_mesh_cpu("x=2"), *m2 = nb_mesh_cpu("y=2");
  uint64_t seed = 22;
  nb_tensor *x = rand_f64(NB_SHAPE(4, 6), &seed), *y;
  /* a spec the mesh cannot parse: at the call, traced or not */
  nb_fn *f = nb_fn_create(bad_spec_body, m, 1, 1), *j = nb_jit(f);
  cr_assert_neq(nb_call(j, &x, &y), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "nb_shard");
  nb_fn_release(j);
  nb_fn_release(f);
  /* a constraint on another mesh than the values' */
  cst c = {m2, "y, _"};
  f = nb_fn_create(doubled_body, &c, 1, 1), j = nb_jit(f);
  nb_tensor *sx = sharded(x, m, "x, _");
  cr_assert_neq(nb_call(j, &sx, &y), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "a sharding constraint on mesh y=2 applied to values on x=2");
  /* ... which on one device is the identity */
  cr_assert_eq(nb_call(j, &x, &y), NB_OK, "%s", nb_last_error());
  cr_assert_null(nb_mesh_of(y));
  nb_fn_release(j);
  nb_fn_release(f);
  nb_mesh_release(m2);
  nb_mesh_release(m);
}

/* Backward through a chain of views: h = exp(x) (8, 6); y = nb_shard(
 * reshape(transpose(h), (2, 24)), m, "x, _"): y's rows are blocks of h's columns, so
 * h comes out column-sharded and nothing moves. */
static nb_status chain_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = nb_exp(in[0]);
  out[1] = nb_shard(nb_reshape(nb_transpose(out[0]), NB_SHAPE(2, 24)), u, "x, _");
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

Test(gprop, constraint_reaches_back_through_views) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  uint64_t seed = 23;
  nb_tensor *x = rand_f64(NB_SHAPE(8, 6), &seed), *ref[2], *got[2];
  nb_fn *f = nb_fn_create(chain_body, m, 1, 2), *j = nb_jit(f);
  cr_assert_eq(nb_call(f, &x, ref), NB_OK, "%s", nb_last_error());
  nb_tensor *sx = sharded(x, m, "_, _");
  nb_stats s0 = nb_get_stats();
  cr_assert_eq(nb_call(j, &sx, got), NB_OK, "%s", nb_last_error());
  ASSERT_SPEC(got[0], "[_, x]");
  ASSERT_SPEC(got[1], "[x, _]");
  ASSERT_COUNTS(since(&s0), 0, 0, 0, 0, 0);
  /* a GPU reduces in another order: the last bit may differ */
  assert_same(got[0], ref[0], tc_on_gpu() ? 1e-15 : 0);
  assert_same(got[1], ref[1], tc_on_gpu() ? 1e-15 : 0);
  nb_fn_release(j);
  nb_fn_release(f);
  nb_mesh_release(m);
}
