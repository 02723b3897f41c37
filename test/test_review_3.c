/* test/test_review_3.c — review of issue 6's second session (shard_map,
 * collectives, graph-mode propagation): defects found, each a test. */
#include <math.h>

#include "common.h"

#include "../src/sharding/sharding.h"

TestSuite(review_3, .init = tc_setup, .fini = tc_teardown);

/* ---- a jitted function with a collective, called in bodies on two meshes ---- */
static nb_status psum_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_all_reduce(in[0], "x", NB_REDUCE_SUM);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status call_jitted(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  return nb_call((nb_fn *)u, in, out);
}

Test(review_3, jit_in_bodies_on_two_meshes) {
  nb_fn *g = nb_fn_create(psum_body, NULL, 1, 1), *jg = nb_jit(g);
  nb_fn *body = nb_fn_create(call_jitted, jg, 1, 1);
  double v[8];
  for (int k = 0; k < 8; k++)
    v[k] = k + 1;
  for (int i = 0; i < 2; i++) {
    nb_mesh *m = nb_mesh_cpu(i == 0 ? "x=2" : "x=4");
    int n = i == 0 ? 2 : 4; /* n blocks of 2: the same local shape on both */
    nb_tensor *x = i == 0 ? tc_tensor(v, NB_SHAPE(4), NB_F64) : tc_tensor(v, NB_SHAPE(8), NB_F64),
              *y;
    nb_fn *f = nb_shard_map(body, m, (const char *[]){"x"}, (const char *[]){"_"});
    cr_assert(f, "%s", nb_last_error());
    cr_assert_eq(nb_call(f, &x, &y), NB_OK, "mesh %d: %s", i, nb_last_error());
    double ref[2] = {0, 0};
    for (int k = 0; k < 2 * n; k++)
      ref[k % 2] += v[k];
    tc_assert_close(y, ref, NB_SHAPE(2));
    nb_fn_release(f);
    nb_mesh_release(m);
  }
  nb_fn_release(body), nb_fn_release(jg), nb_fn_release(g);
}

/* ---- probes ---- */
/* out0: sum over the group of sum(x^2) (invariant); out1: its int cast (invariant) */
static nb_status int_out_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_all_reduce(nb_sum(nb_square(in[0]), NB_ALL, false), "x", NB_REDUCE_SUM);
  out[1] = nb_cast(out[0], NB_I32);
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

static nb_status first_of(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *o[2];
  nb_status st = nb_call((nb_fn *)u, in, o);
  out[0] = st ? NULL : o[0];
  return st;
}

Test(review_3, probe_grad_with_an_int_output) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  nb_fn *body = nb_fn_create(int_out_body, NULL, 1, 2);
  nb_fn *f = nb_shard_map(body, m, (const char *[]){"x"}, (const char *[]){"", ""});
  nb_fn *l = nb_fn_create(first_of, f, 1, 1), *gl = nb_grad(l, NB_AXES(0));
  double v[4] = {1, -2, 3, 0.5}, ref[4];
  for (int k = 0; k < 4; k++)
    ref[k] = 2 * v[k];
  nb_tensor *x = tc_tensor(v, NB_SHAPE(4), NB_F64), *g;
  cr_assert_eq(nb_call(gl, &x, &g), NB_OK, "%s", nb_last_error());
  tc_assert_close(g, ref, NB_SHAPE(4));
  nb_fn *jl = nb_jvp_fn(f);
  nb_tensor *a[2] = {x, x}, *o[4];
  cr_assert_eq(nb_call(jl, a, o), NB_OK, "%s", nb_last_error());
  double t = 0;
  for (int k = 0; k < 4; k++)
    t += 2 * v[k] * v[k];
  tc_assert_close(o[2], &t, NB_SHAPE());
  nb_fn_release(jl), nb_fn_release(gl), nb_fn_release(l), nb_fn_release(f), nb_fn_release(body);
  nb_mesh_release(m);
}

/* y = x * w (w unbatched) + c (a capture), per device; out sharded like x */
static nb_tensor *cap;
static nb_status mulw_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_add(nb_mul(in[0], in[1]), nb_sum(cap, NB_ALL, false));
  return out[0] ? NB_OK : nb_last_status();
}

Test(review_3, probe_vmap_unbatched_input_and_capture) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  double cv[2] = {0.25, 0.5};
  cap = tc_tensor(cv, NB_SHAPE(2), NB_F64);
  nb_fn *body = nb_fn_create(mulw_body, NULL, 2, 1);
  nb_fn *f = nb_shard_map(body, m, (const char *[]){"x", "x"}, (const char *[]){"x"});
  nb_fn *vf = nb_vmap(f, (int[]){0, NB_NOT_MAPPED}, NULL);
  cr_assert(vf, "%s", nb_last_error());
  double xv[12], wv[4] = {1, 2, 3, 4}, ref[12];
  for (int k = 0; k < 12; k++)
    xv[k] = k - 5, ref[k] = xv[k] * wv[k % 4] + 0.75;
  nb_tensor *in[2] = {tc_tensor(xv, NB_SHAPE(3, 4), NB_F64), tc_tensor(wv, NB_SHAPE(4), NB_F64)},
            *y;
  cr_assert_eq(nb_call(vf, in, &y), NB_OK, "%s", nb_last_error());
  tc_assert_close(y, ref, NB_SHAPE(3, 4));
  nb_fn_release(vf), nb_fn_release(f), nb_fn_release(body);
  nb_mesh_release(m);
}

static nb_status no_in_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)in, (void)n_in, (void)n_out;
  out[0] = nb_mul_scalar(cap, 2);
  return out[0] ? NB_OK : nb_last_status();
}

Test(review_3, probe_no_inputs_and_bad_specs) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  double cv[2] = {0.25, 0.5}, ref[2] = {0.5, 1};
  cap = tc_tensor(cv, NB_SHAPE(2), NB_F64);
  nb_fn *body = nb_fn_create(no_in_body, NULL, 0, 1);
  nb_fn *f = nb_shard_map(body, m, NULL, (const char *[]){""});
  nb_tensor *y;
  cr_assert_eq(nb_call(f, NULL, &y), NB_OK, "%s", nb_last_error());
  tc_assert_close(y, ref, NB_SHAPE(2));
  nb_fn_release(f);
  f = nb_shard_map(body, m, NULL, (const char *[]){"x, x"});
  cr_assert_eq(nb_call(f, NULL, &y), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "nb_shard_map");
  nb_fn_release(f);
  f = nb_shard_map(body, m, NULL, (const char *[]){"zz"});
  cr_assert_eq(nb_call(f, NULL, &y), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "nb_shard_map");
  nb_fn_release(f);
  f = nb_shard_map(body, m, NULL, (const char *[]){"partial(zz)"});
  cr_assert_eq(nb_call(f, NULL, &y), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "nb_shard_map");
  nb_fn_release(f), nb_fn_release(body);
  nb_mesh_release(m);
}

/* y = sum over a of sum(x^2) (x's rows over a): invariant over a and b */
static nb_status sq_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *one = nb_full(NB_SHAPE(2), 1.0, NB_F64); /* a constant of the body */
  out[0] = nb_add(nb_all_reduce(nb_sum(nb_square(in[0]), NB_ALL, false), "a", NB_REDUCE_SUM),
                  nb_sum(nb_all_reduce(one, "a,b", NB_REDUCE_SUM), NB_ALL, false));
  return out[0] ? NB_OK : nb_last_status();
}

Test(review_3, probe_grad_partial_and_invariant_on_two_axes) {
  nb_mesh *m = nb_mesh_cpu("a=2,b=2");
  nb_fn *body = nb_fn_create(sq_body, NULL, 1, 1);
  double v[8], ref[8], s = 0;
  for (int k = 0; k < 8; k++)
    v[k] = 0.5 * k - 1, s += v[k] * v[k];
  nb_tensor *x = tc_tensor(v, NB_SHAPE(4, 2), NB_F64), *y, *g;
  for (int c = 0; c < 2; c++) {
    /* "" : y; "partial(b)": the sum of y over b, 2 y */
    double k = c == 0 ? 1 : 2, val = k * (s + 8);
    nb_fn *f = nb_shard_map(body, m, (const char *[]){"a, _"},
                            (const char *[]){c == 0 ? "" : "partial(b)"});
    nb_fn *gf = nb_grad(f, NB_AXES(0));
    cr_assert_eq(nb_call(f, &x, &y), NB_OK, "%s", nb_last_error());
    tc_assert_close(y, &val, NB_SHAPE());
    cr_assert_eq(nb_call(gf, &x, &g), NB_OK, "%s", nb_last_error());
    for (int i = 0; i < 8; i++)
      ref[i] = 2 * k * v[i];
    tc_assert_close(g, ref, NB_SHAPE(4, 2));
    nb_fn_release(gf), nb_fn_release(f);
  }
  nb_fn_release(body);
  nb_mesh_release(m);
}

static nb_status varying_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_mul_scalar(in[0], 2); /* varies over x, out spec "_" */
  return out[0] ? NB_OK : nb_last_status();
}

Test(review_3, probe_variance_error_under_jit_and_grad) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  nb_fn *body = nb_fn_create(varying_body, NULL, 1, 1);
  nb_fn *f = nb_shard_map(body, m, (const char *[]){"x"}, (const char *[]){"_"});
  nb_fn *jf = nb_jit(f);
  double v[4] = {1, 2, 3, 4};
  nb_tensor *x = tc_tensor(v, NB_SHAPE(4), NB_F64), *y;
  cr_assert_eq(nb_call(f, &x, &y), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "varies over mesh axis x");
  cr_assert_eq(nb_call(jf, &x, &y), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "varies over mesh axis x");
  nb_fn_release(jf), nb_fn_release(f), nb_fn_release(body);
  nb_mesh_release(m);
}

/* ---- shard_maps nested deeper than the mesh stack holds ---- */
typedef struct nest {
  nb_mesh *m;
  int depth;
} nest;

static nb_status nested_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nest *c = u;
  if (c->depth == 0) {
    out[0] = nb_add(in[0], nb_axis_index("x") ? in[0] : NULL);
    return out[0] ? NB_OK : nb_last_status();
  }
  nest inner = {c->m, c->depth - 1};
  nb_fn *body = nb_fn_create(nested_body, &inner, 1, 1);
  nb_fn *f = nb_shard_map(body, c->m, (const char *[]){"_"}, (const char *[]){"_"});
  nb_status st = nb_call(f, in, out);
  nb_fn_release(f), nb_fn_release(body);
  return st;
}

Test(review_3, shard_maps_nested_too_deep_fail) {
  nb_mesh *m = nb_mesh_cpu("x=1");
  double v[2] = {1, 2};
  nb_tensor *x = tc_tensor(v, NB_SHAPE(2), NB_F64), *y;
  nest c = {m, 40};
  nb_fn *body = nb_fn_create(nested_body, &c, 1, 1);
  cr_assert_neq(nb_call(body, &x, &y), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "nested more than");
  /* the stack is whole again: a collective outside a body is refused */
  cr_assert_null(nb_axis_index("x"));
  tc_assert_error(NB_ERR_SHARDING, "only inside an nb_shard_map body");
  nb_fn_release(body);
  nb_mesh_release(m);
}
