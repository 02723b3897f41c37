/* test/test_smap.c — collectives of shard_map bodies (src/sharding/coll_ops.c)
 * and the per-device interpreter (src/sharding/smap.c).
 *
 * A body is traced as the shard_map does it (nbi_smap_push, nbi_trace_program
 * on local shapes, nbi_smap_pop) and run by nbi_smap_exec on inputs placed
 * with nb_shard. Every device's result is compared with a reference computed
 * here with plain loops over the devices' host blocks (groups built from the
 * devices' coordinates). Covered: every collective and reduction on meshes
 * x=2, x=2,y=2 and x=4,y=2 (single axes of a 2-D mesh, multi-axis groups in
 * both orders), negative dims, nb_stats counts and bytes against the formulas
 * of collectives.c, axis_index, sharing of nodes between devices with equal
 * inputs, the variance check, argument errors, collectives outside a body and
 * inside a checkpoint of a body; the rules: nb_grad, nb_vjp_fn, nb_jvp_fn and
 * nb_vmap of functions calling collectives inside a body (closed forms from
 * the block values), and grad of grad. */
#include "common.h"
#include "../src/core/program.h"

#include "../src/sharding/sharding.h"
#include "host_blocks.h"
#include "../src/transforms/transforms.h"

/* ---- groups (reference side) ------------------------------------------------- */

typedef struct tgroup {
  int n;
  int ax[2]; /* mesh axis indices, major first */
} tgroup;

static int gsize(const nb_mesh *m, const tgroup *g) {
  int n = 1;
  for (int k = 0; k < g->n; k++)
    n *= (int)m->size[g->ax[k]];
  return n;
}

static int rank_of(const nb_mesh *m, const tgroup *g, int d) {
  int64_t c[NBI_MESH_MAX_AXES], r = 0;
  coords_of(m, d, c);
  for (int k = 0; k < g->n; k++)
    r = r * m->size[g->ax[k]] + c[g->ax[k]];
  return (int)r;
}

static int member(const nb_mesh *m, const tgroup *g, int d, int r) {
  int64_t c[NBI_MESH_MAX_AXES];
  coords_of(m, d, c);
  for (int k = g->n - 1; k >= 0; k--) {
    c[g->ax[k]] = r % m->size[g->ax[k]];
    r /= (int)m->size[g->ax[k]];
  }
  return dev_of(m, c);
}

/* ---- host blocks ---------------------------------------------------------------------- */

static hb hb_copy(const hb *t) {
  hb y = hb_new(t->s);
  memcpy(y.x, t->x, sizeof(double) * (size_t)tc_numel(t->s));
  return y;
}

/* Device d's block of the logical host array X (shape S) under xs's sharding. */
static hb block_of(const double *X, nb_shape S, nb_tensor *xs, int d) {
  nb_shape ls;
  int64_t start[NB_MAX_DIMS], ix[NB_MAX_DIMS];
  nbi_local_block(xs->mesh, nbi_sharding_of(xs), &S, d, &ls, start);
  hb b = hb_new(ls);
  for (int64_t i = 0; i < tc_numel(ls); i++) {
    tc_unravel(i, &ls, ix);
    for (int k = 0; k < ls.ndim; k++)
      ix[k] += start[k];
    b.x[i] = X[tc_ravel(ix, &S)];
  }
  return b;
}

/* ---- collectives: the body and the reference ------------------------------------------ */

enum { K_AR, K_AG, K_RS, K_A2A, K_PP };
typedef struct cspec {
  int kind;
  int op;         /* K_AR */
  int d0, d1;     /* AG, RS: dim; A2A: split, concat (may be negative) */
  int pairs_kind; /* K_PP: 0 cyclic r -> r + 1, 1 only 0 -> n - 1 */
  const char *axes;
  int n; /* group size (pairs) */
} cspec;

static int make_pairs(int kind, int n, int (*p)[2]) {
  if (kind == 1) {
    p[0][0] = 0, p[0][1] = n - 1;
    return 1;
  }
  for (int r = 0; r < n; r++)
    p[r][0] = r, p[r][1] = (r + 1) % n;
  return n;
}

static nb_tensor *coll(const cspec *c, nb_tensor *x) {
  int pairs[8][2], np;
  switch (c->kind) {
  case K_AR: return nb_all_reduce(x, c->axes, c->op);
  case K_AG: return nb_all_gather(x, c->axes, c->d0);
  case K_RS: return nb_reduce_scatter(x, c->axes, c->d0);
  case K_A2A: return nb_all_to_all(x, c->axes, c->d0, c->d1);
  default:
    np = make_pairs(c->pairs_kind, c->n, pairs);
    return nb_ppermute(x, c->axes, (const int(*)[2])pairs, np);
  }
}

static nb_status coll_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = coll(u, in[0]);
  return out[0] ? NB_OK : nb_last_status();
}

static int norm(int d, int nd) { return d < 0 ? d + nd : d; }

/* The reference of c over group g for every device from the input blocks. */
static void ref_coll(const nb_mesh *m, const tgroup *g, const cspec *c, const hb *in, hb *out) {
  int n = gsize(m, g);
  hb parts[8];
  for (int d = 0; d < m->n_dev; d++) {
    int r = rank_of(m, g, d), nd = in[d].s.ndim;
    switch (c->kind) {
    case K_AR:
    case K_RS: {
      hb acc = hb_copy(&in[member(m, g, d, 0)]);
      for (int64_t i = 0; i < tc_numel(acc.s); i++) {
        for (int s = 1; s < n; s++) {
          double w = in[member(m, g, d, s)].x[i];
          acc.x[i] = c->kind == K_RS || c->op == NB_REDUCE_SUM || c->op == NB_REDUCE_MEAN
                         ? acc.x[i] + w
                     : c->op == NB_REDUCE_MAX ? fmax(acc.x[i], w)
                                              : fmin(acc.x[i], w);
        }
        if (c->kind == K_AR && c->op == NB_REDUCE_MEAN) acc.x[i] /= n;
      }
      if (c->kind == K_RS) {
        out[d] = hb_chunk(&acc, norm(c->d0, nd), n, r);
        free(acc.x);
      } else {
        out[d] = acc;
      }
      break;
    }
    case K_AG:
      for (int s = 0; s < n; s++)
        parts[s] = in[member(m, g, d, s)];
      out[d] = hb_concat(parts, n, norm(c->d0, nd));
      break;
    case K_A2A:
      for (int s = 0; s < n; s++)
        parts[s] = hb_chunk(&in[member(m, g, d, s)], norm(c->d0, nd), n, r);
      out[d] = hb_concat(parts, n, norm(c->d1, nd));
      hb_free_all(parts, n);
      break;
    default: {
      int pairs[8][2], np = make_pairs(c->pairs_kind, n, pairs), src = -1;
      for (int k = 0; k < np; k++)
        if (pairs[k][1] == r) src = pairs[k][0];
      out[d] = src < 0 ? hb_new(in[d].s) : hb_copy(&in[member(m, g, d, src)]);
    }
    }
  }
}

/* ---- running a body ------------------------------------------------------------------- */

/* Traces f on xs's local shapes with m pushed and runs it on xs (then the
 * captures) with out specs specs; out[j] borrowed in the current scope. */
static nb_status run_body(nb_mesh *m, nb_fn *f, nb_tensor *const *xs, const char *const *specs,
                          nb_tensor **out) {
  int n_in = nb_fn_n_in(f), n_out = nb_fn_n_out(f);
  nb_shape ls[4];
  nb_dtype dts[4];
  for (int k = 0; k < n_in; k++) {
    ls[k] = xs[k]->mesh ? xs[k]->phys[0]->shape : xs[k]->shape;
    dts[k] = nb_dtype_of(xs[k]);
  }
  nbi_program *prog;
  nb_tensor **capt;
  int n_capt;
  cr_assert_eq(nbi_smap_push("test", m), NB_OK);
  nb_status st = nbi_trace_program("test_smap", f, ls, dts, &prog, &capt, &n_capt);
  nbi_smap_pop();
  cr_assert_null(nbi_smap_mesh());
  if (st) return st;
  nb_tensor *all[8];
  cr_assert(n_in + n_capt <= 8);
  for (int k = 0; k < n_in; k++)
    all[k] = xs[k];
  for (int k = 0; k < n_capt; k++)
    all[n_in + k] = capt[k];
  nbi_sharding os[4];
  for (int j = 0; j < n_out; j++)
    cr_assert_eq(nbi_sharding_parse("test", m, specs[j], prog->out_shape[j].ndim, false, &os[j]),
                 NB_OK, "%s", nb_last_error());
  st = nbi_smap_exec("test_smap", m, prog, all, os, out);
  nbi_release_all(capt, n_capt);
  nbi_program_release(prog);
  return st;
}

/* The logical shape whose blocks under spec on m are `local`. */
static nb_shape logical_of(nb_mesh *m, const char *spec, nb_shape local) {
  nbi_sharding s;
  cr_assert_eq(nbi_sharding_parse("test", m, spec, local.ndim, false, &s), NB_OK, "%s",
               nb_last_error());
  for (int k = 0; k < local.ndim; k++)
    local.dims[k] *= nbi_dim_shards(&s, k);
  return local;
}

/* A host array of shape S (random, or small integers when ints) and its
 * tensor placed under spec on m; blocks[d] are the devices' host blocks. */
static nb_tensor *placed(nb_mesh *m, const char *spec, nb_shape S, uint64_t *seed, bool ints,
                         double **X, hb *blocks) {
  int64_t n = tc_numel(S);
  *X = ints ? tc_rand_ints(n, NB_F64, seed, 2) : tc_rand_floats(n, NB_F64, seed);
  nb_tensor *xs = nb_shard(tc_tensor(*X, S, NB_F64), m, spec);
  cr_assert(xs, "nb_shard: %s", nb_last_error());
  for (int d = 0; d < m->n_dev; d++)
    blocks[d] = block_of(*X, S, xs, d);
  return xs;
}

/* ---- the cases -------------------------------------------------------------------------- */

typedef struct tcase {
  const char *mesh, *in_spec, *out_spec, *axes;
  tgroup g;
} tcase;

static const tcase cases[] = {
    {"x=2", "x, _", "x", "x", {1, {0}}},
    {"x=2,y=2", "x, y", "(x, y)", "x", {1, {0}}},
    {"x=2,y=2", "x, y", "(x, y)", "y", {1, {1}}},
    {"x=2,y=2", "x, y", "(x, y)", "x,y", {2, {0, 1}}},
    {"x=2,y=2", "y, x", "(x, y)", "(y, x)", {2, {1, 0}}},
    {"x=4,y=2", "x, y", "(x, y)", "x", {1, {0}}},
    {"x=4,y=2", "x, y", "(x, y)", "y", {1, {1}}},
    {"x=4,y=2", "(x, y), _", "(x, y)", " ( x , y ) ", {2, {0, 1}}},
    {"x=4,y=2", "y, x", "(x, y)", "y,x", {2, {1, 0}}},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* Bytes sent by c (collectives.c's formulas) for local blocks of B bytes. */
static uint64_t expected_bytes(const cspec *c, int n, int n_dev, uint64_t B) {
  uint64_t groups = (uint64_t)(n_dev / n);
  switch (c->kind) {
  case K_AR: return groups * 2 * (uint64_t)(n - 1) * B;
  case K_AG: return groups * (uint64_t)(n - 1) * (uint64_t)n * B;
  case K_RS: return groups * (uint64_t)(n - 1) * B;
  case K_A2A: return (uint64_t)n_dev * (B - B / (uint64_t)n);
  default: {
    int pairs[8][2], np = make_pairs(c->pairs_kind, n, pairs);
    uint64_t moved = 0;
    for (int k = 0; k < np; k++)
      moved += pairs[k][0] != pairs[k][1];
    return groups * moved * B;
  }
  }
}

static uint64_t count_of(const nb_stats *s, int kind) {
  switch (kind) {
  case K_AR: return s->n_all_reduce;
  case K_AG: return s->n_all_gather;
  case K_RS: return s->n_reduce_scatter;
  case K_A2A: return s->n_all_to_all;
  default: return s->n_permute;
  }
}

/* Runs collective c in a body on every case (blocks of shape (8, 4), f64)
 * and compares every device's result, the stats and that nothing leaks. */
static void check_coll(cspec c, bool ints) {
  uint64_t seed = 99 + (uint64_t)c.kind * 31 + (uint64_t)c.op;
  for (int k = 0; k < N_CASES; k++) {
    const tcase *tc = &cases[k];
    uint64_t live = nbi_live_tensors();
    nb_mesh *m = nb_mesh_cpu(tc->mesh);
    cr_assert(m);
    nb_scope_begin();
    hb in[8], ref[8];
    double *X;
    nb_tensor *xs =
        placed(m, tc->in_spec, logical_of(m, tc->in_spec, NB_SHAPE(8, 4)), &seed, ints, &X, in);
    c.axes = tc->axes;
    c.n = gsize(m, &tc->g);
    nb_fn *f = nb_fn_create(coll_body, &c, 1, 1);
    nb_tensor *out;
    nb_reset_stats();
    cr_assert_eq(run_body(m, f, &xs, &tc->out_spec, &out), NB_OK, "case %d: %s", k,
                 nb_last_error());
    nb_stats st = nb_get_stats();
    cr_assert_eq(count_of(&st, c.kind), 1, "case %d", k);
    cr_assert_eq(st.n_all_reduce + st.n_all_gather + st.n_reduce_scatter + st.n_all_to_all +
                     st.n_permute,
                 1);
    cr_assert_eq(st.collective_bytes, expected_bytes(&c, c.n, m->n_dev, 8 * 4 * 8),
                 "case %d: %llu bytes", k, (unsigned long long)st.collective_bytes);
    cr_assert_eq(nb_mesh_of(out), m);
    ref_coll(m, &tc->g, &c, in, ref);
    for (int d = 0; d < m->n_dev; d++)
      tc_assert_close(out->phys[d], ref[d].x, ref[d].s);
    /* the logical value: the devices' blocks under the out spec, in order */
    nb_shape os = logical_of(m, tc->out_spec, ref[0].s);
    cr_assert(nbi_shape_eq(&out->shape, &os));
    hb_free_all(in, m->n_dev);
    hb_free_all(ref, m->n_dev);
    free(X);
    nb_fn_release(f);
    nb_scope_end();
    nb_mesh_release(m);
    cr_assert_eq(nbi_live_tensors(), live, "case %d leaks tensors", k);
  }
}

Test(smap, all_reduce_every_op) {
  for (int op = NB_REDUCE_SUM; op <= NB_REDUCE_MEAN; op++)
    check_coll((cspec){.kind = K_AR, .op = op}, false);
}

Test(smap, all_gather_both_dims_negative) {
  check_coll((cspec){.kind = K_AG, .d0 = 0}, false);
  check_coll((cspec){.kind = K_AG, .d0 = -1}, false);
}

Test(smap, reduce_scatter) {
  check_coll((cspec){.kind = K_RS, .d0 = -2}, false);
  check_coll((cspec){.kind = K_RS, .d0 = 0}, false);
}

Test(smap, all_to_all) {
  check_coll((cspec){.kind = K_A2A, .d0 = 0, .d1 = -1}, false);
  check_coll((cspec){.kind = K_A2A, .d0 = -2, .d1 = 0}, false);
}

Test(smap, ppermute_cyclic_and_partial) {
  check_coll((cspec){.kind = K_PP, .pairs_kind = 0}, false);
  check_coll((cspec){.kind = K_PP, .pairs_kind = 1}, false);
}

/* ---- axis_index --------------------------------------------------------------------------- */

static nb_status index_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *r = nb_axis_index(u);
  cr_assert(r, "%s", nb_last_error());
  cr_assert_eq(nb_dtype_of(r), NB_I32);
  cr_assert_eq(nb_ndim(r), 0);
  out[0] = nb_reshape(r, NB_SHAPE(1));
  /* the rank also mixes with the input: x + rank */
  out[1] = nb_add(in[0], nb_cast(r, NB_F64));
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

Test(smap, axis_index) {
  uint64_t seed = 5;
  for (int k = 0; k < N_CASES; k++) {
    const tcase *tc = &cases[k];
    nb_mesh *m = nb_mesh_cpu(tc->mesh);
    nb_scope_begin();
    hb in[8];
    double *X;
    nb_tensor *xs =
        placed(m, tc->in_spec, logical_of(m, tc->in_spec, NB_SHAPE(8, 4)), &seed, false, &X, in);
    nb_fn *f = nb_fn_create(index_body, (void *)tc->axes, 1, 2);
    nb_tensor *out[2];
    /* the rank varies over the group's axes: out spec (x, y) names them all */
    const char *specs[2] = {m->n_axes == 1 ? "x" : "(x, y)", tc->out_spec};
    cr_assert_eq(run_body(m, f, &xs, specs, out), NB_OK, "case %d: %s", k, nb_last_error());
    double *ranks = tc_read(out[0]); /* device d's rank at position d (dim 0 over (x, y)) */
    for (int d = 0; d < m->n_dev; d++) {
      int r = rank_of(m, &tc->g, d);
      cr_assert_eq(ranks[d], r, "case %d device %d", k, d);
      for (int64_t i = 0; i < tc_numel(in[d].s); i++)
        in[d].x[i] += r;
      tc_assert_close(out[1]->phys[d], in[d].x, in[d].s);
    }
    free(ranks);
    hb_free_all(in, m->n_dev);
    free(X);
    nb_fn_release(f);
    nb_scope_end();
    nb_mesh_release(m);
  }
}

/* ---- sharing, variance ---------------------------------------------------------------- */

static nb_status affine_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_add_scalar(nb_mul_scalar(nb_exp(in[0]), 2), 1);
  return out[0] ? NB_OK : nb_last_status();
}

Test(smap, equal_inputs_share_nodes) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  nb_scope_begin();
  uint64_t seed = 7;
  hb in[4];
  double *X;
  /* replicated: one node for all devices; "x, _": one per x coordinate */
  const char *specs[2] = {"_, _", "x, _"};
  for (int t = 0; t < 2; t++) {
    nb_tensor *xs =
        placed(m, specs[t], logical_of(m, specs[t], NB_SHAPE(3, 4)), &seed, false, &X, in);
    nb_fn *f = nb_fn_create(affine_body, NULL, 1, 1);
    nb_tensor *out;
    cr_assert_eq(run_body(m, f, &xs, &specs[t], &out), NB_OK, "%s", nb_last_error());
    for (int d = 0; d < 4; d++) {
      for (int e = 0; e < 4; e++) {
        bool same_in = xs->phys[d] == xs->phys[e];
        cr_assert_eq(out->phys[d] == out->phys[e], same_in, "spec %s devices %d %d", specs[t], d,
                     e);
      }
      for (int64_t i = 0; i < tc_numel(in[d].s); i++)
        in[d].x[i] = 2 * exp(in[d].x[i]) + 1;
      tc_assert_close(out->phys[d], in[d].x, in[d].s);
    }
    cr_assert(t == 0 ? out->phys[0] == out->phys[3] : out->phys[0] == out->phys[1]);
    cr_assert(t == 0 || out->phys[0] != out->phys[2]);
    hb_free_all(in, 4);
    free(X);
    nb_fn_release(f);
  }
  nb_scope_end();
  nb_mesh_release(m);
}

/* A dp-sharded value returned with out spec "_": an error; reduced over dp
 * first (or listed partial) it is fine and its logical value is the sum. */
static nb_status reduce_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const char *axes = u;
  out[0] = axes ? nb_all_reduce(nb_square(in[0]), axes, NB_REDUCE_SUM) : nb_square(in[0]);
  return out[0] ? NB_OK : nb_last_status();
}

Test(smap, variance_check) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  nb_scope_begin();
  uint64_t seed = 8;
  hb in[4];
  double *X;
  nb_shape S = NB_SHAPE(4, 3);
  nb_tensor *xs = placed(m, "dp, _", S, &seed, false, &X, in);
  nb_fn *plain = nb_fn_create(reduce_body, NULL, 1, 1);
  nb_fn *reduced_tp = nb_fn_create(reduce_body, "tp", 1, 1);
  nb_fn *reduced_dp = nb_fn_create(reduce_body, "dp", 1, 1);
  nb_tensor *out = NULL;
  const char *repl = "_, _", *part = "[_, _] partial(dp)", *dp = "dp, _";
  cr_assert_neq(run_body(m, plain, &xs, &repl, &out), NB_OK);
  cr_assert_null(out);
  tc_assert_error(NB_ERR_SHARDING, "test_smap: output 0 varies over mesh axis dp, which its out "
                                   "spec does not name");
  /* all_reduce over tp leaves the dp variance */
  cr_assert_neq(run_body(m, reduced_tp, &xs, &repl, &out), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "varies over mesh axis dp");
  /* named by the out spec: the blocks are the output's rows */
  cr_assert_eq(run_body(m, plain, &xs, &dp, &out), NB_OK, "%s", nb_last_error());
  /* reduced over dp: replicated, the logical value is the sum of the blocks */
  cr_assert_eq(run_body(m, reduced_dp, &xs, &repl, &out), NB_OK, "%s", nb_last_error());
  double ref[6];
  for (int i = 0; i < 6; i++)
    ref[i] = in[0].x[i] * in[0].x[i] + in[2].x[i] * in[2].x[i];
  tc_assert_close(out, ref, NB_SHAPE(2, 3));
  /* listed partial: the pending sum over dp reads the same */
  cr_assert_eq(run_body(m, plain, &xs, &part, &out), NB_OK, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(out), "[_, _] partial(dp)");
  tc_assert_close(out, ref, NB_SHAPE(2, 3));
  hb_free_all(in, 4);
  free(X);
  nb_fn_release(plain);
  nb_fn_release(reduced_tp);
  nb_fn_release(reduced_dp);
  nb_scope_end();
  nb_mesh_release(m);
}

static nb_status shift_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  int pairs[2][2] = {{0, 1}, {1, 0}};
  out[0] = nb_ppermute(in[0], "tp", (const int(*)[2])pairs, 2);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status gather_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_all_gather(in[0], "dp", 0);
  return out[0] ? NB_OK : nb_last_status();
}

Test(smap, variance_of_collectives) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=2");
  nb_scope_begin();
  uint64_t seed = 9;
  hb in[4];
  double *X;
  nb_tensor *xs = placed(m, "dp, _", NB_SHAPE(4, 3), &seed, false, &X, in);
  nb_fn *shift = nb_fn_create(shift_body, NULL, 1, 1);
  nb_fn *gather = nb_fn_create(gather_body, NULL, 1, 1);
  nb_tensor *out = NULL;
  const char *dp = "dp, _", *repl = "_, _", *both = "dp, tp";
  /* ppermute over tp adds tp */
  cr_assert_neq(run_body(m, shift, &xs, &dp, &out), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "output 0 varies over mesh axis tp");
  cr_assert_eq(run_body(m, shift, &xs, &both, &out), NB_OK, "%s", nb_last_error());
  /* all_gather over dp removes dp: replicated, the whole input */
  cr_assert_eq(run_body(m, gather, &xs, &repl, &out), NB_OK, "%s", nb_last_error());
  tc_assert_close(out, X, NB_SHAPE(4, 3));
  hb_free_all(in, 4);
  free(X);
  nb_fn_release(shift);
  nb_fn_release(gather);
  nb_scope_end();
  nb_mesh_release(m);
}

/* ---- errors ---------------------------------------------------------------------------- */

Test(smap, collectives_outside_a_body) {
  nb_scope_begin();
  nb_tensor *x = nb_zeros(NB_SHAPE(4), NB_F32);
  int pairs[1][2] = {{0, 1}};
  cr_assert_null(nb_all_reduce(x, "x", NB_REDUCE_SUM));
  tc_assert_error(NB_ERR_SHARDING,
                  "nb_all_reduce: collectives run only inside an nb_shard_map body");
  cr_assert_null(nb_all_gather(x, "x", 0));
  tc_assert_error(NB_ERR_SHARDING, "nb_all_gather: collectives run only inside");
  cr_assert_null(nb_reduce_scatter(x, "x", 0));
  tc_assert_error(NB_ERR_SHARDING, "nb_reduce_scatter: collectives run only inside");
  cr_assert_null(nb_all_to_all(x, "x", 0, 0));
  tc_assert_error(NB_ERR_SHARDING, "nb_all_to_all: collectives run only inside");
  cr_assert_null(nb_ppermute(x, "x", (const int(*)[2])pairs, 1));
  tc_assert_error(NB_ERR_SHARDING, "nb_ppermute: collectives run only inside");
  cr_assert_null(nb_axis_index("x"));
  tc_assert_error(NB_ERR_SHARDING, "nb_axis_index: collectives run only inside");
  nb_scope_end();
}

Test(smap, argument_errors) {
  nb_mesh *m = nb_mesh_cpu("dp=2,tp=4");
  nb_scope_begin();
  nb_tensor *x = nb_zeros(NB_SHAPE(4, 6), NB_F32);
  nb_tensor *xi = nb_zeros(NB_SHAPE(4, 6), NB_I32);
  cr_assert_eq(nbi_smap_push("test", m), NB_OK);
  cr_assert_eq(nbi_smap_mesh(), m);
  /* axes text */
  cr_assert_null(nb_all_reduce(NULL, "dp", NB_REDUCE_SUM));
  tc_assert_error(NB_ERR_NULL, "nb_all_reduce");
  cr_assert_null(nb_all_reduce(x, NULL, NB_REDUCE_SUM));
  tc_assert_error(NB_ERR_NULL, "nb_all_reduce: axes is NULL");
  cr_assert_null(nb_all_reduce(x, "zz", NB_REDUCE_SUM));
  tc_assert_error(NB_ERR_SHARDING, "nb_all_reduce: axes \"zz\": mesh dp=2,tp=4 has no axis \"zz\"");
  cr_assert_null(nb_all_gather(x, "dp,dp", 0));
  tc_assert_error(NB_ERR_SHARDING, "nb_all_gather: axes \"dp,dp\": axis \"dp\" is named twice");
  cr_assert_null(nb_all_gather(x, "(dp, tp", 0));
  tc_assert_error(NB_ERR_SHARDING, "without a closing ')'");
  cr_assert_null(nb_all_gather(x, "dp;tp", 0));
  tc_assert_error(NB_ERR_SHARDING, "unexpected ';'");
  cr_assert_null(nb_all_gather(x, "", 0));
  tc_assert_error(NB_ERR_SHARDING, "expected an axis name");
  cr_assert_null(nb_all_gather(x, "dp,", 0));
  tc_assert_error(NB_ERR_SHARDING, "expected an axis name");
  cr_assert_null(nb_axis_index("tp,zz"));
  tc_assert_error(NB_ERR_SHARDING, "nb_axis_index: axes \"tp,zz\"");
  /* reductions and dtypes */
  cr_assert_null(nb_all_reduce(x, "dp", (nb_reduce_op)7));
  tc_assert_error(NB_ERR_ARG, "nb_all_reduce: unknown reduction 7");
  cr_assert_null(nb_all_reduce(xi, "dp", NB_REDUCE_MEAN));
  tc_assert_error(NB_ERR_DTYPE, "nb_all_reduce: mean of a i32 tensor");
  cr_assert_null(nb_all_reduce(nb_cast(x, NB_BOOL), "dp", NB_REDUCE_MAX));
  tc_assert_error(NB_ERR_DTYPE, "nb_all_reduce");
  cr_assert_null(nb_reduce_scatter(nb_cast(x, NB_BOOL), "dp", 0));
  tc_assert_error(NB_ERR_DTYPE, "nb_reduce_scatter");
  /* dims */
  cr_assert_null(nb_all_gather(x, "dp", 2));
  tc_assert_error(NB_ERR_AXIS, "nb_all_gather");
  cr_assert_null(nb_all_gather(x, "dp", -3));
  tc_assert_error(NB_ERR_AXIS, "nb_all_gather");
  cr_assert_eq(nb_shape_of(nb_reduce_scatter(x, "tp", 0)).dims[0], 1); /* 4 rows over 4 */
  cr_assert_null(nb_reduce_scatter(x, "tp", -1));
  tc_assert_error(NB_ERR_SHAPE, "nb_reduce_scatter: dim 1 of shape");
  cr_assert_null(nb_reduce_scatter(x, "dp,tp", 0));
  tc_assert_error(NB_ERR_SHAPE, "does not divide into 8 chunks");
  cr_assert_null(nb_all_to_all(x, "tp", 1, 0));
  tc_assert_error(NB_ERR_SHAPE, "nb_all_to_all: split dim 1 of shape");
  cr_assert_null(nb_all_to_all(x, "tp", 0, 2));
  tc_assert_error(NB_ERR_AXIS, "nb_all_to_all");
  /* pairs */
  int bad_range[1][2] = {{0, 4}}, neg[1][2] = {{-1, 0}}, two_src[2][2] = {{1, 0}, {1, 2}},
      two_dst[2][2] = {{0, 3}, {1, 3}};
  cr_assert_null(nb_ppermute(x, "tp", (const int(*)[2])bad_range, 1));
  tc_assert_error(NB_ERR_INDEX, "nb_ppermute: pair 0 (0, 4) is out of range for a group of 4");
  cr_assert_null(nb_ppermute(x, "tp", (const int(*)[2])neg, 1));
  tc_assert_error(NB_ERR_INDEX, "nb_ppermute: pair 0 (-1, 0)");
  cr_assert_null(nb_ppermute(x, "tp", (const int(*)[2])two_src, 2));
  tc_assert_error(NB_ERR_ARG, "nb_ppermute: rank 1 is the source of pairs 0 and 1");
  cr_assert_null(nb_ppermute(x, "tp", (const int(*)[2])two_dst, 2));
  tc_assert_error(NB_ERR_ARG, "nb_ppermute: rank 3 is the destination of pairs 0 and 1");
  cr_assert_null(nb_ppermute(x, "tp", NULL, 1));
  tc_assert_error(NB_ERR_NULL, "nb_ppermute: 1 pairs but pairs is NULL");
  cr_assert_null(nb_ppermute(x, "tp", (const int(*)[2])bad_range, -1));
  tc_assert_error(NB_ERR_ARG, "nb_ppermute: -1 pairs");
  /* a sharded tensor in a body */
  nb_tensor *xs = nb_shard(x, m, "dp, _");
  cr_assert_null(nb_all_reduce(xs, "dp", NB_REDUCE_SUM));
  tc_assert_error(NB_ERR_SHARDING, "nb_all_reduce: t is a sharded tensor");
  /* valid calls give the documented shapes */
  nb_tensor *y = nb_all_to_all(x, "(tp)", 0, -1);
  cr_assert(y, "%s", nb_last_error());
  cr_assert_eq(nb_shape_of(y).dims[0], 1);
  cr_assert_eq(nb_shape_of(y).dims[1], 24);
  cr_assert(nb_shape_of(nb_all_gather(x, "tp, dp", -2)).dims[0] == 32);
  cr_assert(nb_shape_of(nb_reduce_scatter(x, "dp", 1)).dims[1] == 3);
  cr_assert_eq(nb_ppermute(x, "tp", NULL, 0)->shape.dims[1], 6);
  /* their values exist only per device: reading one is an error, not a run */
  double buf[24];
  cr_assert_neq(nb_to_host(y, buf, sizeof buf), NB_OK);
  nb_clear_error();
  nbi_smap_pop();
  cr_assert_null(nbi_smap_mesh());
  nb_scope_end();
  nb_mesh_release(m);
}

/* A collective inside nb_checkpoint inside the body: rejected before running. */
static nb_status psum_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_all_reduce(in[0], "x", NB_REDUCE_SUM);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status call_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  return nb_call(u, in, out);
}

Test(smap, collective_inside_checkpoint_rejected) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  nb_scope_begin();
  uint64_t seed = 10;
  hb in[2];
  double *X;
  nb_tensor *xs = placed(m, "x", NB_SHAPE(4), &seed, false, &X, in);
  nb_fn *inner = nb_fn_create(psum_fn, NULL, 1, 1);
  nb_fn *ck = nb_checkpoint(inner);
  nb_fn *body = nb_fn_create(call_body, ck, 1, 1);
  const char *spec = "_";
  nb_tensor *out = NULL;
  nb_reset_stats();
  cr_assert_neq(run_body(m, body, &xs, &spec, &out), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "test_smap: nb_all_reduce inside a checkpoint in the shard_map "
                                   "body: collectives must be at the body's top level");
  cr_assert_null(out);
  cr_assert_eq(nb_get_stats().n_all_reduce, 0);
  /* the same collective at the top level runs */
  cr_assert_eq(run_body(m, inner, &xs, &spec, &out), NB_OK, "%s", nb_last_error());
  double ref[2] = {in[0].x[0] + in[1].x[0], in[0].x[1] + in[1].x[1]};
  tc_assert_close(out, ref, NB_SHAPE(2));
  hb_free_all(in, 2);
  free(X);
  nb_fn_release(body);
  nb_fn_release(ck);
  nb_fn_release(inner);
  nb_scope_end();
  nb_mesh_release(m);
}

/* ---- rules ------------------------------------------------------------------------------ */

/* Losses of one local input: sum(c(x)^2) or, with cube, sum(c(x)^3) / 3, or
 * plain sum(c(x)). */
typedef struct loss {
  cspec c;
  int power; /* 1, 2 or 3 */
} loss;

static nb_status loss_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const loss *l = u;
  nb_tensor *y = coll(&l->c, in[0]);
  if (l->power == 2) y = nb_square(y);
  if (l->power == 3) y = nb_div_scalar(nb_mul(y, nb_square(y)), 3);
  out[0] = nb_sum(y, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

/* Runs body fn g (one input) on every case with blocks of shape local; out
 * spec names every axis; ref(m, g, in, d, out_block) writes device d's
 * expected block. */
static void (*g_keep_free)(void *) = free; /* frees what make() kept */
typedef void (*ref_fn)(const nb_mesh *m, const tgroup *g, const hb *in, int d, hb *out,
                       const void *u);

static void check_body(nb_fn *(*make)(cspec *c, void **keep), cspec base, nb_shape local, bool ints,
                       ref_fn ref, int n_cases) {
  uint64_t seed = 4242;
  for (int k = 0; k < n_cases; k++) {
    const tcase *tc = &cases[k];
    uint64_t live = nbi_live_tensors();
    nb_mesh *m = nb_mesh_cpu(tc->mesh);
    nb_scope_begin();
    hb in[8];
    double *X;
    nb_tensor *xs = placed(m, tc->in_spec, logical_of(m, tc->in_spec, local), &seed, ints, &X, in);
    cspec c = base;
    c.axes = tc->axes;
    c.n = gsize(m, &tc->g);
    void *keep = NULL;
    nb_fn *f = make(&c, &keep);
    cr_assert(f, "%s", nb_last_error());
    nb_tensor *out;
    cr_assert_eq(run_body(m, f, &xs, &tc->out_spec, &out), NB_OK, "case %d: %s", k,
                 nb_last_error());
    for (int d = 0; d < m->n_dev; d++) {
      hb e;
      ref(m, &tc->g, in, d, &e, &c);
      tc_assert_close(out->phys[d], e.x, e.s);
      free(e.x);
    }
    hb_free_all(in, m->n_dev);
    free(X);
    nb_fn_release(f);
    g_keep_free(keep);
    nb_scope_end();
    nb_mesh_release(m);
    cr_assert_eq(nbi_live_tensors(), live, "case %d leaks tensors", k);
  }
}

/* nb_grad of loss_fn(power) */
static int g_power;
static nb_fn *make_grad(cspec *c, void **keep) {
  loss *l = malloc(sizeof *l);
  *l = (loss){*c, g_power};
  *keep = l;
  nb_fn *f = nb_fn_create(loss_fn, l, 1, 1);
  nb_fn *g = nb_grad(f, NB_AXES(0));
  nb_fn_release(f);
  return g;
}

/* d/dx_d sum(all_gather(x)^2) = reduce_scatter of 2 G over the group = 2 n x_d */
static void ref_grad_gather_sq(const nb_mesh *m, const tgroup *g, const hb *in, int d, hb *out,
                               const void *u) {
  (void)u;
  int n = gsize(m, g);
  *out = hb_copy(&in[d]);
  for (int64_t i = 0; i < tc_numel(out->s); i++)
    out->x[i] *= 2.0 * n;
}

/* d/dx_d sum(psum(x)^2) = psum(2 S) = 2 n S; pmean: 2 mean (pmean of 2 mean) */
static void ref_grad_reduce_sq(const nb_mesh *m, const tgroup *g, const hb *in, int d, hb *out,
                               const void *u) {
  const cspec *c = u;
  int n = gsize(m, g);
  *out = hb_new(in[d].s);
  for (int64_t i = 0; i < tc_numel(out->s); i++) {
    double s = 0;
    for (int r = 0; r < n; r++)
      s += in[member(m, g, d, r)].x[i];
    out->x[i] = c->op == NB_REDUCE_SUM ? 2.0 * n * s : 2.0 * s / n;
  }
}

/* d/dx_d sum(pmax(x)): n (the members' cotangents, 1 each) split over the
 * members holding the maximum. */
static void ref_grad_extremum(const nb_mesh *m, const tgroup *g, const hb *in, int d, hb *out,
                              const void *u) {
  const cspec *c = u;
  int n = gsize(m, g);
  *out = hb_new(in[d].s);
  for (int64_t i = 0; i < tc_numel(out->s); i++) {
    double e = in[member(m, g, d, 0)].x[i];
    for (int r = 1; r < n; r++) {
      double v = in[member(m, g, d, r)].x[i];
      e = c->op == NB_REDUCE_MAX ? fmax(e, v) : fmin(e, v);
    }
    int ties = 0;
    for (int r = 0; r < n; r++)
      ties += in[member(m, g, d, r)].x[i] == e;
    out->x[i] = in[d].x[i] == e ? (double)n / ties : 0;
  }
}

Test(smap, grad_all_gather_is_reduce_scatter) {
  g_power = 2;
  check_body(make_grad, (cspec){.kind = K_AG, .d0 = -1}, NB_SHAPE(8, 4), false, ref_grad_gather_sq,
             N_CASES);
}

Test(smap, grad_all_reduce_sum_mean) {
  g_power = 2;
  check_body(make_grad, (cspec){.kind = K_AR, .op = NB_REDUCE_SUM}, NB_SHAPE(8, 4), false,
             ref_grad_reduce_sq, N_CASES);
  check_body(make_grad, (cspec){.kind = K_AR, .op = NB_REDUCE_MEAN}, NB_SHAPE(8, 4), false,
             ref_grad_reduce_sq, N_CASES);
}

Test(smap, grad_all_reduce_max_min_ties) {
  g_power = 1;
  /* small integers: many ties between members */
  check_body(make_grad, (cspec){.kind = K_AR, .op = NB_REDUCE_MAX}, NB_SHAPE(8, 4), true,
             ref_grad_extremum, N_CASES);
  check_body(make_grad, (cspec){.kind = K_AR, .op = NB_REDUCE_MIN}, NB_SHAPE(8, 4), true,
             ref_grad_extremum, N_CASES);
}

/* nb_vjp_fn of a collective with cotangent w (a fixed function of x: w = x^2
 * + 1 per device) gives the transposed collective of w. */
static nb_status vjp_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const cspec *c = u;
  nb_fn *f = nb_fn_create(coll_body, (void *)c, 1, 1);
  nb_fn *v = nb_vjp_fn(f);
  nb_tensor *y = coll(c, in[0]); /* for the cotangent's shape */
  cr_assert(y, "%s", nb_last_error());
  nb_tensor *w = nb_add_scalar(nb_square(y), 1);
  nb_tensor *args[2] = {in[0], w}, *res[2] = {NULL, NULL};
  nb_status st = nb_call(v, args, res);
  nb_fn_release(v);
  nb_fn_release(f);
  out[0] = res[1];
  return st;
}

static nb_fn *make_vjp(cspec *c, void **keep) {
  cspec *k = malloc(sizeof *k);
  *k = *c;
  *keep = k;
  return nb_fn_create(vjp_body, k, 1, 1);
}

/* The transpose applied to w_j = y_j^2 + 1 (y the forward collective). */
static void ref_vjp(const nb_mesh *m, const tgroup *g, const hb *in, int d, hb *out,
                    const void *u) {
  const cspec *c = u;
  hb y[8], w[8], t[8];
  ref_coll(m, g, c, in, y);
  for (int e = 0; e < m->n_dev; e++) {
    w[e] = hb_copy(&y[e]);
    for (int64_t i = 0; i < tc_numel(w[e].s); i++)
      w[e].x[i] = y[e].x[i] * y[e].x[i] + 1;
  }
  cspec tr = *c;
  if (c->kind == K_AG) tr.kind = K_RS;
  if (c->kind == K_RS) tr.kind = K_AG;
  if (c->kind == K_A2A) tr.d0 = c->d1, tr.d1 = c->d0;
  if (c->kind == K_PP) {
    /* inverse pairs: the test's pair sets inverted by hand */
    int n = gsize(m, g);
    for (int e = 0; e < m->n_dev; e++) {
      int r = rank_of(m, g, e), pairs[8][2], np = make_pairs(c->pairs_kind, n, pairs), dst = -1;
      for (int k = 0; k < np; k++)
        if (pairs[k][0] == r) dst = pairs[k][1];
      t[e] = dst < 0 ? hb_new(w[e].s) : hb_copy(&w[member(m, g, e, dst)]);
    }
  } else {
    ref_coll(m, g, &tr, w, t);
  }
  *out = hb_copy(&t[d]);
  hb_free_all(y, m->n_dev);
  hb_free_all(w, m->n_dev);
  hb_free_all(t, m->n_dev);
}

Test(smap, vjp_of_every_collective) {
  check_body(make_vjp, (cspec){.kind = K_AG, .d0 = 0}, NB_SHAPE(8, 4), false, ref_vjp, N_CASES);
  check_body(make_vjp, (cspec){.kind = K_RS, .d0 = 0}, NB_SHAPE(8, 4), false, ref_vjp, N_CASES);
  check_body(make_vjp, (cspec){.kind = K_A2A, .d0 = 0, .d1 = 1}, NB_SHAPE(8, 4), false, ref_vjp,
             N_CASES);
  check_body(make_vjp, (cspec){.kind = K_PP, .pairs_kind = 0}, NB_SHAPE(8, 4), false, ref_vjp,
             N_CASES);
  check_body(make_vjp, (cspec){.kind = K_PP, .pairs_kind = 1}, NB_SHAPE(8, 4), false, ref_vjp,
             N_CASES);
  check_body(make_vjp, (cspec){.kind = K_AR, .op = NB_REDUCE_SUM}, NB_SHAPE(8, 4), false, ref_vjp,
             N_CASES);
}

/* nb_jvp_fn with tangent t = cos(x): linear collectives give c(t); pmax gives
 * the tangent of the member holding the max, averaged over ties. */
static nb_status jvp_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const cspec *c = u;
  nb_fn *f = nb_fn_create(coll_body, (void *)c, 1, 1);
  nb_fn *j = nb_jvp_fn(f);
  nb_tensor *args[2] = {in[0], nb_cos(in[0])}, *res[2] = {NULL, NULL};
  nb_status st = nb_call(j, args, res);
  nb_fn_release(j);
  nb_fn_release(f);
  out[0] = res[1];
  return st;
}

static nb_fn *make_jvp(cspec *c, void **keep) {
  cspec *k = malloc(sizeof *k);
  *k = *c;
  *keep = k;
  return nb_fn_create(jvp_body, k, 1, 1);
}

static void ref_jvp(const nb_mesh *m, const tgroup *g, const hb *in, int d, hb *out,
                    const void *u) {
  const cspec *c = u;
  hb t[8], y[8];
  for (int e = 0; e < m->n_dev; e++) {
    t[e] = hb_copy(&in[e]);
    for (int64_t i = 0; i < tc_numel(t[e].s); i++)
      t[e].x[i] = cos(in[e].x[i]);
  }
  if (c->kind == K_AR && (c->op == NB_REDUCE_MAX || c->op == NB_REDUCE_MIN)) {
    int n = gsize(m, g);
    *out = hb_new(in[d].s);
    for (int64_t i = 0; i < tc_numel(out->s); i++) {
      double e = in[member(m, g, d, 0)].x[i], num = 0;
      for (int r = 1; r < n; r++) {
        double v = in[member(m, g, d, r)].x[i];
        e = c->op == NB_REDUCE_MAX ? fmax(e, v) : fmin(e, v);
      }
      int ties = 0;
      for (int r = 0; r < n; r++)
        if (in[member(m, g, d, r)].x[i] == e) ties++, num += t[member(m, g, d, r)].x[i];
      out->x[i] = num / ties;
    }
  } else {
    ref_coll(m, g, c, t, y);
    *out = hb_copy(&y[d]);
    hb_free_all(y, m->n_dev);
  }
  hb_free_all(t, m->n_dev);
}

Test(smap, jvp_of_collectives) {
  check_body(make_jvp, (cspec){.kind = K_A2A, .d0 = -2, .d1 = -1}, NB_SHAPE(8, 4), false, ref_jvp,
             N_CASES);
  check_body(make_jvp, (cspec){.kind = K_AG, .d0 = 1}, NB_SHAPE(8, 4), false, ref_jvp, N_CASES);
  check_body(make_jvp, (cspec){.kind = K_RS, .d0 = 0}, NB_SHAPE(8, 4), false, ref_jvp, N_CASES);
  check_body(make_jvp, (cspec){.kind = K_PP, .pairs_kind = 0}, NB_SHAPE(8, 4), false, ref_jvp,
             N_CASES);
  check_body(make_jvp, (cspec){.kind = K_AR, .op = NB_REDUCE_MEAN}, NB_SHAPE(8, 4), false, ref_jvp,
             N_CASES);
  check_body(make_jvp, (cspec){.kind = K_AR, .op = NB_REDUCE_MAX}, NB_SHAPE(8, 4), true, ref_jvp,
             N_CASES);
  check_body(make_jvp, (cspec){.kind = K_AR, .op = NB_REDUCE_MIN}, NB_SHAPE(8, 4), true, ref_jvp,
             N_CASES);
}

/* nb_vmap over dim 1 of a (8, 3, 4) block: each example (8, 4) gets the
 * collective; the batch axis comes back at position 1. */
static nb_fn *make_vmap(cspec *c, void **keep) {
  cspec *k = malloc(sizeof *k);
  *k = *c;
  *keep = k;
  nb_fn *f = nb_fn_create(coll_body, k, 1, 1);
  int ia[1] = {1}, oa[1] = {1};
  nb_fn *v = nb_vmap(f, ia, oa);
  nb_fn_release(f);
  return v;
}

static void ref_vmap(const nb_mesh *m, const tgroup *g, const hb *in, int d, hb *out,
                     const void *u) {
  const cspec *c = u;
  int B = (int)in[0].s.dims[1];
  hb ex[8], y[8], ys[3];
  memset(ys, 0, sizeof ys);
  for (int b = 0; b < B; b++) {
    for (int e = 0; e < m->n_dev; e++) {
      hb t = hb_chunk(&in[e], 1, B, b); /* (8, 1, 4) */
      ex[e] = (hb){NB_SHAPE(t.s.dims[0], t.s.dims[2]), t.x};
    }
    ref_coll(m, g, c, ex, y);
    ys[b] = (hb){NB_SHAPE(y[d].s.dims[0], 1, y[d].s.dims[1]), hb_copy(&y[d]).x};
    hb_free_all(ex, m->n_dev);
    hb_free_all(y, m->n_dev);
  }
  *out = hb_concat(ys, B, 1);
  hb_free_all(ys, B);
}

Test(smap, vmap_of_collectives) {
  nb_shape local = NB_SHAPE(8, 3, 4);
  check_body(make_vmap, (cspec){.kind = K_AG, .d0 = -1}, local, false, ref_vmap, N_CASES);
  check_body(make_vmap, (cspec){.kind = K_RS, .d0 = 0}, local, false, ref_vmap, N_CASES);
  check_body(make_vmap, (cspec){.kind = K_A2A, .d0 = 0, .d1 = 1}, local, false, ref_vmap, N_CASES);
  check_body(make_vmap, (cspec){.kind = K_PP, .pairs_kind = 1}, local, false, ref_vmap, N_CASES);
  check_body(make_vmap, (cspec){.kind = K_AR, .op = NB_REDUCE_MAX}, local, false, ref_vmap,
             N_CASES);
}

/* Second order: K(x) = sum(grad(F)(x)) with F = sum(all_gather(x)^3) / 3.
 * grad F on device d = reduce_scatter(G^2) = n x_d^2; its gradient through
 * the rules (all_gather of ones, then reduce_scatter of 2 G) is 2 n x_d. */
static nb_status sum_of_grad(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *gx;
  nb_status st = nb_call(u, in, &gx);
  if (st) return st;
  out[0] = nb_sum(gx, NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

typedef struct second {
  loss l;
  nb_fn *f, *gf, *k;
} second;

static void second_free(void *p) {
  second *s = p;
  if (!s) return;
  nb_fn_release(s->k);
  nb_fn_release(s->gf);
  nb_fn_release(s->f);
  free(s);
}

static nb_fn *make_grad_grad(cspec *c, void **keep) {
  second *s = calloc(1, sizeof *s);
  s->l = (loss){*c, 3};
  s->f = nb_fn_create(loss_fn, &s->l, 1, 1);
  s->gf = nb_grad(s->f, NB_AXES(0));
  s->k = nb_fn_create(sum_of_grad, s->gf, 1, 1);
  *keep = s;
  return nb_grad(s->k, NB_AXES(0));
}

Test(smap, grad_of_grad_all_gather) {
  g_keep_free = second_free;
  check_body(make_grad_grad, (cspec){.kind = K_AG, .d0 = 0}, NB_SHAPE(8, 4), false,
             ref_grad_gather_sq, N_CASES);
  g_keep_free = free;
}

/* nb_cond in a body: a collective in either branch (the second program of
 * the payload too) is rejected; branches without collectives run per device
 * (the pack and its gets recorded once per device). */
static nb_status exp_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_exp(in[0]);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status neg_fn(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_neg(in[0]);
  return out[0] ? NB_OK : nb_last_status();
}

typedef struct branches {
  nb_fn *then_fn, *else_fn;
} branches;

/* cond(sum(x) > 0, then, else)(x), then all_reduce over x (top level). */
static nb_status cond_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const branches *b = u;
  nb_tensor *pred = nb_gt_scalar(nb_sum(in[0], NB_ALL, false), 0), *r;
  nb_status st = nb_cond(pred, b->then_fn, b->else_fn, in, 1, &r);
  if (st) return st;
  out[0] = nb_all_reduce(r, "x", NB_REDUCE_SUM);
  return out[0] ? NB_OK : nb_last_status();
}

Test(smap, control_flow_in_a_body) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  nb_scope_begin();
  uint64_t seed = 11;
  hb in[2];
  double *X;
  nb_tensor *xs = placed(m, "x", NB_SHAPE(6), &seed, false, &X, in);
  nb_fn *ex = nb_fn_create(exp_fn, NULL, 1, 1), *ng = nb_fn_create(neg_fn, NULL, 1, 1),
        *ps = nb_fn_create(psum_fn, NULL, 1, 1);
  branches ok = {ex, ng}, bad_then = {ps, ng}, bad_else = {ex, ps};
  nb_fn *f_ok = nb_fn_create(cond_body, &ok, 1, 1),
        *f_then = nb_fn_create(cond_body, &bad_then, 1, 1),
        *f_else = nb_fn_create(cond_body, &bad_else, 1, 1);
  const char *spec = "_";
  nb_tensor *out = NULL;
  cr_assert_neq(run_body(m, f_then, &xs, &spec, &out), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "nb_all_reduce inside an nb_cond branch in the shard_map body");
  cr_assert_neq(run_body(m, f_else, &xs, &spec, &out), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "nb_all_reduce inside an nb_cond branch");
  cr_assert_eq(run_body(m, f_ok, &xs, &spec, &out), NB_OK, "%s", nb_last_error());
  double ref[3] = {0, 0, 0};
  for (int d = 0; d < 2; d++) {
    double s = 0;
    for (int i = 0; i < 3; i++)
      s += in[d].x[i];
    for (int i = 0; i < 3; i++)
      ref[i] += s > 0 ? exp(in[d].x[i]) : -in[d].x[i];
  }
  tc_assert_close(out, ref, NB_SHAPE(3));
  hb_free_all(in, 2);
  free(X);
  nb_fn_release(f_ok);
  nb_fn_release(f_then);
  nb_fn_release(f_else);
  nb_fn_release(ex);
  nb_fn_release(ng);
  nb_fn_release(ps);
  nb_scope_end();
  nb_mesh_release(m);
}

/* A checkpointed part without collectives runs per device (REMAT pack and
 * its gets per device) next to a top-level collective. */
static nb_status ck_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *r;
  nb_status st = nb_call(u, in, &r);
  if (st) return st;
  out[0] = nb_all_gather(r, "x", 0);
  return out[0] ? NB_OK : nb_last_status();
}

Test(smap, checkpoint_without_collectives_runs) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  nb_scope_begin();
  uint64_t seed = 12;
  hb in[4];
  double *X;
  nb_tensor *xs = placed(m, "x, y", NB_SHAPE(4, 4), &seed, false, &X, in);
  nb_fn *ex = nb_fn_create(exp_fn, NULL, 1, 1), *ck = nb_checkpoint(ex);
  nb_fn *f = nb_fn_create(ck_body, ck, 1, 1);
  const char *spec = "_, y";
  nb_tensor *out;
  cr_assert_eq(run_body(m, f, &xs, &spec, &out), NB_OK, "%s", nb_last_error());
  double ref[16];
  for (int i = 0; i < 16; i++)
    ref[i] = exp(X[i]);
  tc_assert_close(out, ref, NB_SHAPE(4, 4));
  hb_free_all(in, 4);
  free(X);
  nb_fn_release(f);
  nb_fn_release(ck);
  nb_fn_release(ex);
  nb_scope_end();
  nb_mesh_release(m);
}

/* A program holding a collective run on its own (not by the interpreter):
 * the kernel refuses with a clear error. */
Test(smap, kernel_refuses_outside_the_interpreter) {
  nb_mesh *m = nb_mesh_cpu("x=2");
  nb_scope_begin();
  nb_fn *ps = nb_fn_create(psum_fn, NULL, 1, 1);
  nbi_program *prog;
  nb_tensor **capt;
  int n_capt;
  cr_assert_eq(nbi_smap_push("test", m), NB_OK);
  cr_assert_eq(
      nbi_trace_program("test", ps, &NB_SHAPE(3), &(nb_dtype){NB_F32}, &prog, &capt, &n_capt),
      NB_OK, "%s", nb_last_error());
  nbi_smap_pop();
  nb_tensor *x = nb_ones(NB_SHAPE(3), NB_F32), *y = NULL;
  cr_assert_neq(nbi_program_run("test", prog, &x, &y), NB_OK);
  tc_assert_error(NB_ERR_SHARDING, "nb_all_reduce: a collective ran outside the per-device "
                                   "execution of an nb_shard_map body");
  cr_assert_null(y);
  nbi_release_all(capt, n_capt);
  nbi_program_release(prog);
  nb_fn_release(ps);
  nb_scope_end();
  nb_mesh_release(m);
}

/* The identity body hands the inputs' blocks through; the interpreter's own
 * argument errors. */
static nb_status id_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = in[0];
  return NB_OK;
}

Test(smap, identity_body_and_exec_errors) {
  nb_mesh *m = nb_mesh_cpu("x=2,y=2"), *m2 = nb_mesh_cpu("x=2,y=2");
  nb_scope_begin();
  uint64_t seed = 13;
  hb in[4];
  double *X;
  nb_tensor *xs = placed(m, "y, x", NB_SHAPE(4, 6), &seed, false, &X, in);
  nb_fn *f = nb_fn_create(id_body, NULL, 1, 1);
  const char *spec = "y, x";
  nb_tensor *out = NULL;
  cr_assert_eq(run_body(m, f, &xs, &spec, &out), NB_OK, "%s", nb_last_error());
  cr_assert_str_eq(nb_sharding_str(out), "[y, x]");
  for (int d = 0; d < 4; d++)
    cr_assert_eq(out->phys[d], xs->phys[d]);
  tc_assert_close(out, X, NB_SHAPE(4, 6));
  /* errors of nbi_smap_exec itself */
  nbi_program *prog;
  nb_tensor **capt;
  int n_capt;
  cr_assert_eq(nbi_smap_push("test", m), NB_OK);
  cr_assert_eq(
      nbi_trace_program("test", f, &NB_SHAPE(2, 3), &(nb_dtype){NB_F64}, &prog, &capt, &n_capt),
      NB_OK);
  nbi_smap_pop();
  nbi_sharding os;
  cr_assert_eq(nbi_sharding_parse("test", m, "y, x", 2, false, &os), NB_OK);
  nb_tensor *other = nb_shard(nb_zeros(NB_SHAPE(4, 6), NB_F64), m2, "y, x");
  nb_tensor *uneven = nb_shard(nb_zeros(NB_SHAPE(4, 5), NB_F64), m, "y, x");
  nb_tensor *f32 = nb_shard(nb_zeros(NB_SHAPE(4, 6), NB_F32), m, "y, x");
  cr_assert_eq(nbi_smap_exec("t", m, prog, &other, &os, &out), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "t: input 0 is on mesh x=2,y=2, not x=2,y=2");
  cr_assert_null(out);
  cr_assert_eq(nbi_smap_exec("t", m, prog, &uneven, &os, &out), NB_ERR_SHAPE);
  tc_assert_error(
      NB_ERR_SHAPE,
      "t: input 0's block on device 2 has shape [2,2] but the body was traced on [2,3]");
  cr_assert_eq(nbi_smap_exec("t", m, prog, &f32, &os, &out), NB_ERR_DTYPE);
  tc_assert_error(NB_ERR_DTYPE, "t: input 0 is f32 but the body takes f64");
  nb_tensor *null_in = NULL;
  cr_assert_eq(nbi_smap_exec("t", m, prog, &null_in, &os, &out), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "t: input 0 is NULL");
  nbi_sharding one = nbi_sharding_replicated(1);
  cr_assert_eq(nbi_smap_exec("t", m, prog, &xs, &one, &out), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "t: output 0 has 2 dims but its sharding 1");
  cr_assert_eq(nbi_smap_exec("t", m, NULL, &xs, &os, &out), NB_ERR_NULL);
  nb_clear_error();
  nbi_release_all(capt, n_capt);
  nbi_program_release(prog);
  hb_free_all(in, 4);
  free(X);
  nb_fn_release(f);
  nb_scope_end();
  nb_mesh_release(m);
  nb_mesh_release(m2);
}
