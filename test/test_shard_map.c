/* test/test_shard_map.c — nb_shard_map end to end: bodies per device with
 * explicit collectives against the unsharded math, data-parallel and
 * Megatron MLPs (exact collective counts), every transform composed with it
 * (grad, vjp, jvp, vmap, jit, checkpoint, second order), partial out specs,
 * and its errors. */
#include <math.h>

#include "common.h"

TestSuite(shard_map, .init = tc_setup, .fini = tc_teardown);

static nb_tensor *rand_t(nb_shape s, uint64_t *seed) {
  double *v = tc_rand_floats(tc_numel(s), NB_F64, seed);
  nb_tensor *t = tc_tensor(v, s, NB_F64);
  free(v);
  return t;
}

/* got and ref (any layouts) hold the same values within tol (relative). */
static void assert_same(nb_tensor *got, nb_tensor *ref, double tol, const char *what) {
  cr_assert(got && ref, "%s: %s", what, nb_last_error());
  cr_assert(nbi_shape_eq(&got->shape, &ref->shape), "%s: shapes differ", what);
  double *g = tc_read(got), *r = tc_read(ref);
  int64_t n = tc_numel(got->shape);
  for (int64_t i = 0; i < n; i++)
    cr_assert(fabs(g[i] - r[i]) <= tol * (1 + fabs(r[i])), "%s: [%lld] %.17g vs %.17g", what,
              (long long)i, g[i], r[i]);
  free(g), free(r);
}

static uint64_t n_coll(void) {
  nb_stats s = nb_get_stats();
  return s.n_all_reduce + s.n_all_gather + s.n_reduce_scatter + s.n_all_to_all + s.n_permute;
}

/* ---- a data-parallel loss: each device's batch rows, a mean over dp ------------------ */
enum { N = 8, D = 4, H = 6 };

/* sum(relu(x W)^2) / N over the global batch: per device the local sum,
 * then a sum over dp. */
static nb_status dp_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *l =
      nb_div_scalar(nb_sum(nb_square(nb_relu(nb_matmul(in[0], in[1]))), NB_ALL, false), (double)N);
  out[0] = nb_all_reduce(l, "dp", NB_REDUCE_SUM);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status ref_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] =
      nb_div_scalar(nb_sum(nb_square(nb_relu(nb_matmul(in[0], in[1]))), NB_ALL, false), (double)N);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_fn *dp_loss(nb_mesh *m) {
  nb_fn *body = nb_fn_create(dp_body, NULL, 2, 1);
  nb_fn *f = nb_shard_map(body, m, (const char *[]){"dp, _", "_, _"}, (const char *[]){""});
  nb_fn_release(body);
  cr_assert(f, "%s", nb_last_error());
  return f;
}

Test(shard_map, data_parallel_loss_equals_unsharded) {
  nb_mesh *m = nb_mesh_cpu("dp=2");
  uint64_t seed = 1;
  nb_tensor *in[2] = {rand_t(NB_SHAPE(N, D), &seed), rand_t(NB_SHAPE(D, H), &seed)}, *y, *r;
  nb_fn *f = dp_loss(m), *ref = nb_fn_create(ref_body, NULL, 2, 1);
  nb_reset_stats();
  cr_assert_eq(nb_call(f, in, &y), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_get_stats().n_all_reduce, 1);
  cr_assert_eq(n_coll(), 1);
  cr_assert(nb_mesh_of(y) == m);
  cr_assert_str_eq(nb_sharding_str(y), "[]");
  cr_assert_eq(nb_call(ref, in, &r), NB_OK);
  assert_same(y, r, 1e-12, "loss");
  /* sharded inputs already in layout: no data moves before the body */
  nb_tensor *sin[2] = {nb_shard(in[0], m, "dp, _"), nb_shard(in[1], m, "_, _")};
  nb_reset_stats();
  cr_assert_eq(nb_call(f, sin, &y), NB_OK, "%s", nb_last_error());
  cr_assert_eq(n_coll(), 1);
  assert_same(y, r, 1e-12, "loss (sharded inputs)");
  /* another layout is resharded first (an all-to-all moves dp from dim 1) */
  sin[0] = nb_shard(in[0], m, "_, dp");
  cr_assert_eq(nb_call(f, sin, &y), NB_OK, "%s", nb_last_error());
  assert_same(y, r, 1e-12, "loss (resharded input)");
  nb_fn_release(f), nb_fn_release(ref);
  nb_mesh_release(m);
}

/* ---- Megatron: column- then row-parallel, one all-reduce per block ------------------- */
enum { MB = 2 }; /* blocks */

static nb_status tp_block(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out; /* x [n, d], W1 [d, h/tp], b1 [h/tp], W2 [h/tp, d], b2 [d] */
  nb_tensor *h = nb_relu(nb_add(nb_matmul(in[0], in[1]), in[2]));
  out[0] = nb_add(nb_all_reduce(nb_matmul(h, in[3]), "tp", NB_REDUCE_SUM), in[4]);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_tensor *ref_block(nb_tensor *const *in) {
  nb_tensor *h = nb_relu(nb_add(nb_matmul(in[0], in[1]), in[2]));
  return nb_add(nb_matmul(h, in[3]), in[4]);
}

static nb_status ref_block_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = ref_block(in);
  return out[0] ? NB_OK : nb_last_status();
}

static const char *const TP_IN[5] = {"dp, _", "_, tp", "tp", "tp, _", "_"};

static nb_fn *tp_fn(nb_mesh *m) {
  nb_fn *body = nb_fn_create(tp_block, NULL, 5, 1);
  nb_fn *f = nb_shard_map(body, m, TP_IN, (const char *[]){"dp, _"});
  nb_fn_release(body);
  cr_assert(f, "%s", nb_last_error());
  return f;
}

/* mean(square(blocks(x))) with f (shard_map) or the reference. */
typedef struct mlp_ctx {
  nb_fn *block; /* NULL: the reference */
} mlp_ctx;

static nb_status mlp_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const mlp_ctx *c = u;
  nb_tensor *h = in[0];
  for (int b = 0; b < MB; b++) {
    nb_tensor *args[5] = {h, in[1 + 4 * b], in[2 + 4 * b], in[3 + 4 * b], in[4 + 4 * b]};
    if (c->block) {
      nb_status st = nb_call(c->block, args, &h);
      if (st) return st;
    } else {
      h = ref_block(args);
    }
  }
  out[0] = nb_mean(nb_square(h), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static void mlp_params(nb_tensor **in, uint64_t *seed) {
  in[0] = rand_t(NB_SHAPE(N, D), seed);
  for (int b = 0; b < MB; b++) {
    in[1 + 4 * b] = rand_t(NB_SHAPE(D, H + 2), seed);
    in[2 + 4 * b] = rand_t(NB_SHAPE(H + 2), seed);
    in[3 + 4 * b] = rand_t(NB_SHAPE(H + 2, D), seed);
    in[4 + 4 * b] = rand_t(NB_SHAPE(D), seed);
  }
}

/* The MLP's inputs placed with the block's in specs. */
static void shard_params(nb_tensor *const *in, nb_mesh *m, nb_tensor **sin) {
  sin[0] = nb_shard(in[0], m, TP_IN[0]);
  for (int b = 0; b < MB; b++)
    for (int j = 0; j < 4; j++)
      sin[1 + 4 * b + j] = nb_shard(in[1 + 4 * b + j], m, TP_IN[1 + j]);
  for (int k = 0; k < 1 + 4 * MB; k++)
    cr_assert(sin[k], "%s", nb_last_error());
}

Test(shard_map, megatron_mlp_one_all_reduce_per_block) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 2;
  nb_tensor *in[1 + 4 * MB];
  mlp_params(in, &seed);
  nb_fn *blk = tp_fn(m);
  mlp_ctx sc = {blk}, rc = {NULL};
  nb_fn *f = nb_fn_create(mlp_body, &sc, 1 + 4 * MB, 1),
        *r = nb_fn_create(mlp_body, &rc, 1 + 4 * MB, 1);
  nb_tensor *y, *ry;
  /* place the parameters first so the count is the forward pass alone */
  nb_tensor *sin[1 + 4 * MB];
  shard_params(in, m, sin);
  nb_reset_stats();
  cr_assert_eq(nb_call(f, sin, &y), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_get_stats().n_all_reduce, MB, "one all-reduce per block: %llu",
               (unsigned long long)nb_get_stats().n_all_reduce);
  cr_assert_eq(n_coll(), MB);
  cr_assert_eq(nb_call(r, in, &ry), NB_OK);
  assert_same(y, ry, 1e-12, "megatron loss");
  nb_fn_release(f), nb_fn_release(r), nb_fn_release(blk);
  nb_mesh_release(m);
}

/* ---- transforms of a shard_map ------------------------------------------------------ */
Test(shard_map, grad_equals_unsharded_grad) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 3;
  nb_tensor *in[1 + 4 * MB];
  mlp_params(in, &seed);
  nb_fn *blk = tp_fn(m);
  mlp_ctx sc = {blk}, rc = {NULL};
  nb_fn *f = nb_fn_create(mlp_body, &sc, 1 + 4 * MB, 1),
        *r = nb_fn_create(mlp_body, &rc, 1 + 4 * MB, 1);
  nb_fn *gf = nb_grad(f, NB_ALL), *gr = nb_grad(r, NB_ALL);
  nb_tensor *g[1 + 4 * MB], *ref[1 + 4 * MB];
  cr_assert_eq(nb_call(gr, in, ref), NB_OK, "%s", nb_last_error());
  /* plain inputs: the shard_maps run inside the gradient's kernels */
  cr_assert_eq(nb_call(gf, in, g), NB_OK, "%s", nb_last_error());
  for (int k = 0; k < 1 + 4 * MB; k++)
    assert_same(g[k], ref[k], 1e-11, "grad (plain inputs)");
  /* sharded inputs: the gradient program runs sharded */
  nb_tensor *sin[1 + 4 * MB];
  shard_params(in, m, sin);
  cr_assert_eq(nb_call(gf, sin, g), NB_OK, "%s", nb_last_error());
  for (int k = 0; k < 1 + 4 * MB; k++) {
    cr_assert(nb_mesh_of(g[k]) == m, "gradient %d is on the mesh", k);
    assert_same(g[k], ref[k], 1e-11, "grad (sharded inputs)");
  }
  nb_fn_release(gf), nb_fn_release(gr), nb_fn_release(f), nb_fn_release(r), nb_fn_release(blk);
  nb_mesh_release(m);
}

static void block_params(nb_tensor **in, uint64_t *seed) {
  in[0] = rand_t(NB_SHAPE(N, D), seed);
  nb_shape ws[4] = {NB_SHAPE(D, H + 2), NB_SHAPE(H + 2), NB_SHAPE(H + 2, D), NB_SHAPE(D)};
  for (int j = 0; j < 4; j++)
    in[1 + j] = rand_t(ws[j], seed);
}

Test(shard_map, jvp_and_vjp_equal_unsharded) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 4;
  nb_tensor *args[10], *out[6], *rout[6];
  block_params(args, &seed);
  for (int k = 0; k < 5; k++)
    args[5 + k] = rand_t(args[k]->shape, &seed);
  nb_fn *f = tp_fn(m), *rf = nb_fn_create(ref_block_body, NULL, 5, 1);
  nb_fn *jf = nb_jvp_fn(f), *vf = nb_vjp_fn(f), *rjf = nb_jvp_fn(rf), *rvf = nb_vjp_fn(rf);
  cr_assert_eq(nb_call(jf, args, out), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(rjf, args, rout), NB_OK);
  assert_same(out[0], rout[0], 1e-12, "jvp primal");
  assert_same(out[1], rout[1], 1e-12, "jvp tangent");
  args[5] = rand_t(NB_SHAPE(N, D), &seed); /* a cotangent */
  cr_assert_eq(nb_call(vf, args, out), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(rvf, args, rout), NB_OK);
  for (int k = 0; k < 6; k++)
    assert_same(out[k], rout[k], 1e-12, "vjp");
  nb_fn *fs[] = {f, rf, jf, vf, rjf, rvf};
  for (int i = 0; i < 6; i++)
    nb_fn_release(fs[i]);
  nb_mesh_release(m);
}

/* vmap over a leading batch of x: the body is batched, the batch unsharded. */
typedef struct xonly_ctx {
  nb_tensor *p[5];
  nb_fn *f;
} xonly_ctx;

static nb_status x_only(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const xonly_ctx *c = u;
  nb_tensor *args[5] = {in[0], c->p[1], c->p[2], c->p[3], c->p[4]};
  return nb_call(c->f, args, out);
}

Test(shard_map, vmap_equals_a_loop) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 5;
  enum { NB = 3 };
  xonly_ctx ctx;
  block_params(ctx.p, &seed);
  nb_tensor **p = ctx.p;
  ctx.f = tp_fn(m);
  nb_fn *g = nb_fn_create(x_only, &ctx, 1, 1), *vg = nb_vmap(g, (int[]){0}, NULL);
  nb_tensor *xs = rand_t(NB_SHAPE(NB, N, D), &seed), *y;
  cr_assert_eq(nb_call(vg, &xs, &y), NB_OK, "%s", nb_last_error());
  cr_assert_eq(y->shape.ndim, 3);
  for (int b = 0; b < NB; b++) {
    nb_tensor *xb =
        nb_slice(xs, (int64_t[]){b, 0, 0}, (int64_t[]){b + 1, N, D}, (int64_t[]){1, 1, 1});
    nb_tensor *args[5] = {nb_reshape(xb, NB_SHAPE(N, D)), p[1], p[2], p[3], p[4]};
    nb_tensor *yb =
        nb_slice(y, (int64_t[]){b, 0, 0}, (int64_t[]){b + 1, N, D}, (int64_t[]){1, 1, 1});
    assert_same(nb_reshape(yb, NB_SHAPE(N, D)), ref_block(args), 1e-12, "vmap row");
  }
  nb_fn_release(g), nb_fn_release(vg), nb_fn_release(ctx.f);
  nb_mesh_release(m);
}

Test(shard_map, jit_runs_every_call_and_counts) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 6;
  nb_tensor *in[5], *sin[5], *y, *r;
  block_params(in, &seed);
  for (int k = 0; k < 5; k++)
    sin[k] = nb_shard(in[k], m, TP_IN[k]);
  nb_fn *f = tp_fn(m), *jf = nb_jit(f);
  r = ref_block(in);
  for (int call = 0; call < 3; call++) {
    nb_reset_stats();
    cr_assert_eq(nb_call(jf, sin, &y), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nb_get_stats().n_all_reduce, 1, "call %d", call);
    assert_same(y, r, 1e-12, "jit (sharded inputs)");
    cr_assert_eq(nb_call(jf, in, &y), NB_OK, "%s", nb_last_error());
    assert_same(y, r, 1e-12, "jit (plain inputs)");
    /* the direct call's layout, jitted or not */
    cr_assert(nb_mesh_of(y) == m, "call %d", call);
    cr_assert_str_eq(nb_sharding_str(y), "[dp, _]");
  }
  nb_fn_release(f), nb_fn_release(jf);
  nb_mesh_release(m);
}

Test(shard_map, checkpoint_of_a_shard_map) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  uint64_t seed = 7;
  nb_tensor *in[1 + 4 * MB], *g[1 + 4 * MB], *ref[1 + 4 * MB];
  mlp_params(in, &seed);
  nb_fn *blk = tp_fn(m), *cblk = nb_checkpoint(blk);
  mlp_ctx sc = {cblk}, rc = {NULL};
  nb_fn *f = nb_fn_create(mlp_body, &sc, 1 + 4 * MB, 1),
        *r = nb_fn_create(mlp_body, &rc, 1 + 4 * MB, 1);
  nb_fn *gf = nb_grad(f, NB_ALL), *gr = nb_grad(r, NB_ALL);
  cr_assert_eq(nb_call(gr, in, ref), NB_OK);
  cr_assert_eq(nb_call(gf, in, g), NB_OK, "%s", nb_last_error());
  for (int k = 0; k < 1 + 4 * MB; k++)
    assert_same(g[k], ref[k], 1e-11, "grad through checkpoint(shard_map)");
  nb_fn *fs[] = {blk, cblk, f, r, gf, gr};
  for (int i = 0; i < 6; i++)
    nb_fn_release(fs[i]);
  nb_mesh_release(m);
}

/* Second order: f(x) = sum over devices of sum(x_local^3) (an all-reduce);
 * its Hessian is diag(6 x). */
static nb_status cube_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *c = nb_sum(nb_mul(in[0], nb_square(in[0])), NB_ALL, false);
  out[0] = nb_all_reduce(c, "x", NB_SUM); /* API.md's short name */
  return out[0] ? NB_OK : nb_last_status();
}

Test(shard_map, hessian_through_a_collective) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  uint64_t seed = 8;
  nb_tensor *x = rand_t(NB_SHAPE(4), &seed), *hs;
  nb_fn *body = nb_fn_create(cube_body, NULL, 1, 1);
  nb_fn *f = nb_shard_map(body, m, (const char *[]){"x"}, (const char *[]){""});
  nb_fn *h = nb_hessian(f, NB_AXES(0));
  cr_assert(h, "%s", nb_last_error());
  cr_assert_eq(nb_call(h, &x, &hs), NB_OK, "%s", nb_last_error());
  double *xv = tc_read(x), ref[16] = {0};
  for (int i = 0; i < 4; i++)
    ref[i * 4 + i] = 6 * xv[i];
  tc_assert_close_tol(hs, ref, NB_SHAPE(4, 4), 1e-12);
  free(xv);
  nb_fn_release(body), nb_fn_release(f), nb_fn_release(h);
  nb_mesh_release(m);
}

/* ---- layouts of the outputs -------------------------------------------------------- */
/* x [n, k/tp] @ w [k/tp, d] per device: a partial sum over tp, kept lazy. */
static nb_status partial_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_matmul(in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}

Test(shard_map, partial_out_spec_stays_lazy) {
  nb_mesh *m = nb_mesh_cpu("tp=2");
  uint64_t seed = 9;
  nb_tensor *a = rand_t(NB_SHAPE(3, 8), &seed), *b = rand_t(NB_SHAPE(8, 5), &seed), *y;
  nb_fn *body = nb_fn_create(partial_body, NULL, 2, 1);
  nb_fn *f = nb_shard_map(body, m, (const char *[]){"_, tp", "tp, _"},
                          (const char *[]){"_, _ partial(tp)"});
  nb_reset_stats();
  cr_assert_eq(nb_call(f, (nb_tensor *[]){a, b}, &y), NB_OK, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(y), "[_, _] partial(tp)");
  cr_assert_eq(n_coll(), 0);
  assert_same(y, nb_matmul(a, b), 1e-12, "partial sum read back"); /* reading all-reduces */
  cr_assert_eq(nb_get_stats().n_all_reduce, 1);
  /* the VJP of a partial output: the cotangent is copied to every device */
  nb_fn *g = nb_vjp_fn(f);
  nb_tensor *ct = rand_t(NB_SHAPE(3, 5), &seed), *o[3];
  cr_assert_eq(nb_call(g, (nb_tensor *[]){a, b, ct}, o), NB_OK, "%s", nb_last_error());
  assert_same(o[1], nb_matmul(ct, nb_transpose(b)), 1e-12, "da");
  assert_same(o[2], nb_matmul(nb_transpose(a), ct), 1e-12, "db");
  nb_fn_release(body), nb_fn_release(f), nb_fn_release(g);
  nb_mesh_release(m);
}

/* all_gather in the body and its VJP (a reduce-scatter): f(x) = sum(c * G^2)
 * where G = all_gather(x) is the whole x on every device and c is device-
 * independent, summed over x's devices and divided by their count. */
static nb_status gather_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *g = nb_all_gather(in[0], "x", 0);
  out[0] = nb_mul(in[1], nb_square(g)); /* invariant over x: c is replicated */
  return out[0] ? NB_OK : nb_last_status();
}

Test(shard_map, all_gather_output_and_its_gradient) {
  nb_mesh *m = nb_mesh_cpu("x=4");
  uint64_t seed = 10;
  nb_tensor *x = rand_t(NB_SHAPE(8, 3), &seed), *c = rand_t(NB_SHAPE(8, 3), &seed), *y;
  nb_fn *body = nb_fn_create(gather_body, NULL, 2, 1);
  nb_fn *f = nb_shard_map(body, m, (const char *[]){"x, _", "_, _"}, (const char *[]){"_, _"});
  nb_reset_stats();
  cr_assert_eq(nb_call(f, (nb_tensor *[]){x, c}, &y), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_get_stats().n_all_gather, 1);
  assert_same(y, nb_mul(c, nb_square(x)), 1e-12, "gathered");
  nb_fn *g = nb_vjp_fn(f);
  nb_tensor *ct = rand_t(NB_SHAPE(8, 3), &seed), *o[3];
  cr_assert_eq(nb_call(g, (nb_tensor *[]){x, c, ct}, o), NB_OK, "%s", nb_last_error());
  assert_same(o[1], nb_mul_scalar(nb_mul(nb_mul(ct, c), x), 2), 1e-12, "dx");
  assert_same(o[2], nb_mul(ct, nb_square(x)), 1e-12, "dc");
  nb_fn_release(body), nb_fn_release(f), nb_fn_release(g);
  nb_mesh_release(m);
}

/* ---- errors -------------------------------------------------------------------------- */
static nb_status ident_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_mul_scalar(in[0], 2);
  return out[0] ? NB_OK : nb_last_status();
}

Test(shard_map, errors_are_clear) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2"), *other = nb_mesh_cpu("z=4");
  uint64_t seed = 11;
  nb_fn *body = nb_fn_create(ident_body, NULL, 1, 1);
  const char *in_x[] = {"x, _"}, *out_x[] = {"x, _"};
  cr_assert_null(nb_shard_map(NULL, m, in_x, out_x));
  tc_assert_error(NB_ERR_NULL, "f is NULL");
  cr_assert_null(nb_shard_map(body, NULL, in_x, out_x));
  tc_assert_error(NB_ERR_NULL, "mesh");
  cr_assert_null(nb_shard_map(body, m, in_x, NULL));
  tc_assert_error(NB_ERR_NULL, "out_specs");
  cr_assert_null(nb_shard_map(body, m, (const char *[]){NULL}, out_x));
  tc_assert_error(NB_ERR_NULL, "in_specs[0]");
  nb_tensor *y, *x = rand_t(NB_SHAPE(5, 4), &seed);
  /* a dimension that does not divide */
  nb_fn *f = nb_shard_map(body, m, in_x, out_x);
  cr_assert_neq(nb_call(f, &x, &y), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "does not divide");
  nb_fn_release(f);
  x = rand_t(NB_SHAPE(4, 4), &seed);
  /* a bad spec (unknown axis), reported at the call */
  f = nb_shard_map(body, m, (const char *[]){"w, _"}, out_x);
  cr_assert_neq(nb_call(f, &x, &y), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "w");
  nb_fn_release(f);
  /* a sub-axis */
  f = nb_shard_map(body, m, (const char *[]){"x:(1)1, _"}, out_x);
  cr_assert_neq(nb_call(f, &x, &y), NB_OK);
  nb_fn_release(f);
  nb_clear_error();
  /* partial axes in an in spec */
  f = nb_shard_map(body, m, (const char *[]){"x, _ partial(y)"}, out_x);
  cr_assert_neq(nb_call(f, &x, &y), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "partial");
  nb_fn_release(f);
  /* an output that varies over an axis its spec does not name */
  f = nb_shard_map(body, m, in_x, (const char *[]){"_, _"});
  cr_assert_neq(nb_call(f, &x, &y), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "varies");
  nb_fn_release(f);
  /* the happy path after all that; an input on another mesh is moved over */
  f = nb_shard_map(body, m, in_x, out_x);
  nb_tensor *xo = nb_shard(x, other, "z, _");
  cr_assert_eq(nb_call(f, &xo, &y), NB_OK, "%s", nb_last_error());
  assert_same(y, nb_mul_scalar(x, 2), 0, "from another mesh");
  cr_assert_eq(nb_call(f, &x, &y), NB_OK, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(y), "[x, _]");
  assert_same(y, nb_mul_scalar(x, 2), 0, "doubled");
  nb_fn_release(f), nb_fn_release(body);
  nb_mesh_release(m), nb_mesh_release(other);
}

/* A body is per device: inside it no sharded call is traced, so nb_reshard
 * of a body value is refused the same way on plain and on sharded inputs. */
static nb_status reshard_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_reshard(in[0], "x");
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status sum_of(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *y;
  nb_status st = nb_call(u, in, &y);
  out[0] = st ? NULL : nb_sum(y, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

Test(shard_map, no_sharded_trace_inside_a_body) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  uint64_t seed = 12;
  nb_fn *body = nb_fn_create(reshard_body, NULL, 1, 1);
  nb_fn *f = nb_shard_map(body, m, (const char *[]){"x"}, (const char *[]){"x"});
  nb_fn *s = nb_fn_create(sum_of, f, 1, 1), *g = nb_grad(s, NB_AXES(0));
  nb_tensor *x = rand_t(NB_SHAPE(4), &seed), *o;
  cr_assert_neq(nb_call(g, &x, &o), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "no mesh");
  nb_tensor *sx = nb_shard(x, m, "x");
  cr_assert_neq(nb_call(g, &sx, &o), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "no mesh");
  nb_fn_release(g), nb_fn_release(s), nb_fn_release(f), nb_fn_release(body);
  nb_mesh_release(m);
}
