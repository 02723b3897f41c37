/* test/test_sharding_coll.c — collectives on physical shards
 * (src/sharding/collectives.c): every device's result against a reference
 * computed with plain loops over the devices' data (groups built here
 * constructively: a member of rank r has the device's coordinates with the
 * group's digits replaced by r's), on meshes 2, 2x2, 4x2 (with sub-axis
 * groups) and 2x2x2, f32 and f64, non-divisible sizes; nb_stats counts and
 * bytes; sharing of equal results; derivatives through nb_grad / nb_vjp_fn
 * (the VJP of all-gather is reduce-scatter, of all-reduce sum all-reduce
 * sum, ...); jit and vmap; argument errors; no tensor leaks. */
#include "common.h"

#include "../src/ops/rule_util.h"
#include "../src/sharding/sharding.h"
#include "host_blocks.h"

/* ---- meshes and groups (reference side) ------------------------------------ */

static nb_mesh tm_mesh(const char *text) {
  nb_mesh m = {.refcount = 1};
  const char *p = text;
  while (*p) {
    int len = 0;
    long long size = 0;
    cr_assert_eq(sscanf(p, "%*[a-z]%n=%lld", &len, &size), 1, "mesh %s", text);
    memcpy(m.name[m.n_axes], p, (size_t)len);
    m.size[m.n_axes++] = size;
    p = strchr(p, ',');
    if (!p) break;
    p++;
  }
  m.n_dev = 1;
  for (int i = 0; i < m.n_axes; i++)
    m.n_dev *= (int)m.size[i];
  snprintf(m.text, sizeof m.text, "%s", text);
  /* every device is the default device, where the tests make their blocks */
  static int table[64];
  static nb_device devs[64];
  for (int d = 0; d < 64; d++)
    table[d] = nbi_default_device(), devs[d] = nb_default_device();
  m.dev_table = table;
  m.dev = devs;
  return m;
}

typedef struct tgroup {
  int n_axes;
  nbi_axis ax[3];
} tgroup;

static int group_size(const tgroup *g) {
  int n = 1;
  for (int i = 0; i < g->n_axes; i++)
    n *= (int)g->ax[i].size;
  return n;
}

/* Digit of (sub-)axis a in a coordinate of its axis, and its place value. */
static int64_t place(const nb_mesh *m, const nbi_axis *a) {
  return m->size[a->axis] / (a->pre * a->size);
}

static int ref_rank(const nb_mesh *m, const tgroup *g, int dev) {
  int64_t c[NBI_MESH_MAX_AXES] = {0}, r = 0;
  coords_of(m, dev, c);
  for (int i = 0; i < g->n_axes; i++)
    r = r * g->ax[i].size + (c[g->ax[i].axis] / place(m, &g->ax[i])) % g->ax[i].size;
  return (int)r;
}

/* The device of rank r in dev's group. */
static int ref_member(const nb_mesh *m, const tgroup *g, int dev, int r) {
  int64_t c[NBI_MESH_MAX_AXES] = {0};
  coords_of(m, dev, c);
  for (int i = g->n_axes - 1; i >= 0; i--) {
    const nbi_axis *a = &g->ax[i];
    int64_t p = place(m, a), old = (c[a->axis] / p) % a->size, digit = r % a->size;
    r /= (int)a->size;
    c[a->axis] += (digit - old) * p;
  }
  return dev_of(m, c);
}

/* ---- collectives: the library call and the reference ----------------------------- */

enum { C_AR, C_AG, C_RS, C_A2A, C_PP, C_LS };
typedef struct tcoll {
  int kind;
  int op;         /* C_AR */
  int dim, dim2;  /* AG, RS, LS: dim; A2A: split dim, concat dim */
  int pairs_kind; /* C_PP: 0 cyclic shift r -> r + 1, 1 only (0 -> n - 1) */
} tcoll;

static int make_pairs(const tcoll *c, int n, int (*pairs)[2]) {
  if (c->pairs_kind == 1) {
    pairs[0][0] = 0, pairs[0][1] = n - 1;
    return 1;
  }
  for (int r = 0; r < n; r++)
    pairs[r][0] = r, pairs[r][1] = (r + 1) % n;
  return n;
}

static nb_status run_lib(const nb_mesh *m, const tgroup *g, const tcoll *c, nb_tensor *const *phys,
                         nb_tensor **out) {
  const char *fn = "test_coll";
  switch (c->kind) {
  case C_AR: return nbi_coll_all_reduce(fn, m, phys, g->ax, g->n_axes, c->op, out);
  case C_AG: return nbi_coll_all_gather(fn, m, phys, g->ax, g->n_axes, c->dim, out);
  case C_RS: return nbi_coll_reduce_scatter(fn, m, phys, g->ax, g->n_axes, c->dim, out);
  case C_A2A: return nbi_coll_all_to_all(fn, m, phys, g->ax, g->n_axes, c->dim, c->dim2, out);
  case C_PP: {
    int pairs[8][2];
    int np = make_pairs(c, group_size(g), pairs);
    return nbi_coll_ppermute(fn, m, phys, g->ax, g->n_axes, (const int(*)[2])pairs, np, out);
  }
  default: return nbi_local_slice(fn, m, phys, g->ax, g->n_axes, c->dim, out);
  }
}

/* out[d] (fresh blocks) from in[0..n_dev). */
static void run_ref(const nb_mesh *m, const tgroup *g, const tcoll *c, const hb *in, hb *out) {
  int n = group_size(g);
  hb parts[8];
  for (int d = 0; d < m->n_dev; d++) {
    int r = ref_rank(m, g, d);
    switch (c->kind) {
    case C_AR:
    case C_RS: {
      hb acc = hb_new(in[d].s);
      int64_t ne = tc_numel(acc.s);
      for (int64_t i = 0; i < ne; i++) {
        double v = in[ref_member(m, g, d, 0)].x[i];
        for (int s = 1; s < n; s++) {
          double w = in[ref_member(m, g, d, s)].x[i];
          v = c->kind == C_RS || c->op == NB_REDUCE_SUM || c->op == NB_REDUCE_MEAN ? v + w
              : c->op == NB_REDUCE_MAX                                             ? fmax(v, w)
                                                                                   : fmin(v, w);
        }
        acc.x[i] = c->kind == C_AR && c->op == NB_REDUCE_MEAN ? v / n : v;
      }
      if (c->kind == C_RS) {
        out[d] = hb_chunk(&acc, c->dim, n, r);
        free(acc.x);
      } else {
        out[d] = acc;
      }
      break;
    }
    case C_AG:
      for (int s = 0; s < n; s++)
        parts[s] = in[ref_member(m, g, d, s)];
      out[d] = hb_concat(parts, n, c->dim);
      break;
    case C_A2A:
      for (int s = 0; s < n; s++)
        parts[s] = hb_chunk(&in[ref_member(m, g, d, s)], c->dim, n, r);
      out[d] = hb_concat(parts, n, c->dim2);
      hb_free_all(parts, n);
      break;
    case C_PP: {
      int pairs[8][2], np = make_pairs(c, n, pairs), src = -1;
      for (int k = 0; k < np; k++)
        if (pairs[k][1] == r) src = pairs[k][0];
      if (src < 0) {
        out[d] = hb_new(in[d].s);
      } else {
        const hb *x = &in[ref_member(m, g, d, src)];
        out[d] = hb_slice(x, 0, 0, x->s.ndim ? x->s.dims[0] : 0);
      }
      break;
    }
    default: out[d] = hb_chunk(&in[d], c->dim, n, r);
    }
  }
}

/* Device d's input shape for collective c: blocks that the collective reads
 * as ceil chunks of a length-5 dimension get their rank's chunk. */
static nb_shape in_shape(const nb_mesh *m, const tgroup *g, const tcoll *c, int d) {
  int n = group_size(g), r = ref_rank(m, g, d);
  nb_shape s = c->kind == C_A2A ? NB_SHAPE(5, 6) : NB_SHAPE(5, 3);
  int cd = c->kind == C_AG ? c->dim : c->kind == C_A2A ? c->dim2 : -1;
  if (cd >= 0) s.dims[cd] = chunk_start(5, n, r + 1) - chunk_start(5, n, r);
  return s;
}

static void fill_inputs(const nb_mesh *m, const tgroup *g, const tcoll *c, nb_dtype dt,
                        uint64_t *seed, hb *in, nb_tensor **phys) {
  for (int d = 0; d < m->n_dev; d++) {
    in[d] = hb_new(in_shape(m, g, c, d));
    int64_t ne = tc_numel(in[d].s);
    tc_fill(in[d].x, ne, -1, 1, seed);
    tc_round_to(in[d].x, ne, dt);
    phys[d] = tc_tensor(in[d].x, in[d].s, dt);
  }
}

/* ---- the cases --------------------------------------------------------------------- */

typedef struct tcase {
  const char *mesh;
  tgroup g;
} tcase;

#define AX(a, p, s)                                                                                \
  { a, p, s }
static const tcase cases[] = {
    {"x=2", {1, {AX(0, 1, 2)}}},
    {"x=2,y=2", {0, {{0}}}},
    {"x=2,y=2", {1, {AX(0, 1, 2)}}},
    {"x=2,y=2", {1, {AX(1, 1, 2)}}},
    {"x=2,y=2", {2, {AX(0, 1, 2), AX(1, 1, 2)}}},
    {"x=2,y=2", {2, {AX(1, 1, 2), AX(0, 1, 2)}}},
    {"x=4,y=2", {1, {AX(0, 1, 4)}}},
    {"x=4,y=2", {1, {AX(1, 1, 2)}}},
    {"x=4,y=2", {2, {AX(0, 1, 4), AX(1, 1, 2)}}},
    {"x=4,y=2", {1, {AX(0, 1, 2)}}},              /* x:(1)2 */
    {"x=4,y=2", {1, {AX(0, 2, 2)}}},              /* x:(2)2 */
    {"x=4,y=2", {2, {AX(0, 2, 2), AX(1, 1, 2)}}}, /* (x:(2)2, y) */
    {"x=4,y=2", {2, {AX(1, 1, 2), AX(0, 1, 2)}}}, /* (y, x:(1)2) */
    {"x=2,y=2,z=2", {1, {AX(1, 1, 2)}}},
    {"x=2,y=2,z=2", {2, {AX(0, 1, 2), AX(2, 1, 2)}}},
    {"x=2,y=2,z=2", {2, {AX(2, 1, 2), AX(0, 1, 2)}}},
    {"x=2,y=2,z=2", {3, {AX(0, 1, 2), AX(1, 1, 2), AX(2, 1, 2)}}},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* Runs c on every case in f32 and f64 and compares every device's result
 * with the reference; checks that equal results share objects as promised and
 * that nothing leaks. */
static void check_values(tcoll c) {
  uint64_t seed = 1234 + (uint64_t)c.kind * 77 + (uint64_t)c.op * 7 + (uint64_t)c.dim;
  nb_dtype dts[2] = {NB_F32, NB_F64};
  tcoll cref = c; /* the reference takes dims >= 0 (all inputs are 2-d) */
  cref.dim = c.dim < 0 ? c.dim + 2 : c.dim;
  cref.dim2 = c.dim2 < 0 ? c.dim2 + 2 : c.dim2;
  for (int k = 0; k < N_CASES; k++) {
    nb_mesh m = tm_mesh(cases[k].mesh);
    const tgroup *g = &cases[k].g;
    for (int t = 0; t < 2; t++) {
      uint64_t live = nbi_live_tensors();
      nb_scope_begin();
      hb in[8], ref[8];
      nb_tensor *phys[8], *out[8];
      fill_inputs(&m, g, &cref, dts[t], &seed, in, phys);
      cr_assert_eq(run_lib(&m, g, &c, phys, out), NB_OK, "case %d: %s", k, nb_last_error());
      run_ref(&m, g, &cref, in, ref);
      cr_assert_eq(nb_eval(out, m.n_dev), NB_OK, "%s", nb_last_error());
      for (int d = 0; d < m.n_dev; d++) {
        cr_assert_eq(nb_dtype_of(out[d]), dts[t]);
        tc_assert_close(out[d], ref[d].x, ref[d].s);
        if (c.kind == C_AR || c.kind == C_AG)
          cr_assert_eq(out[d], out[ref_member(&m, g, d, 0)], "case %d: device %d not shared", k, d);
        if (group_size(g) == 1 && c.kind != C_PP) cr_assert_eq(out[d], phys[d]);
      }
      hb_free_all(in, m.n_dev);
      hb_free_all(ref, m.n_dev);
      nb_scope_end();
      cr_assert_eq(nbi_live_tensors(), live, "case %d leaks tensors", k);
    }
  }
}

Test(sharding_coll, all_reduce_sum_max_min_mean) {
  for (int op = NB_REDUCE_SUM; op <= NB_REDUCE_MEAN; op++)
    check_values((tcoll){C_AR, op, 0, 0, 0});
}

Test(sharding_coll, all_gather_ragged_blocks) {
  check_values((tcoll){C_AG, 0, 0, 0, 0});
  check_values((tcoll){C_AG, 0, 1, 0, 0});
  check_values((tcoll){C_AG, 0, -1, 0, 0});
}

Test(sharding_coll, reduce_scatter_ceil_chunks) {
  check_values((tcoll){C_RS, 0, 0, 0, 0});
  check_values((tcoll){C_RS, 0, 1, 0, 0});
}

Test(sharding_coll, all_to_all) {
  check_values((tcoll){C_A2A, 0, 1, 0, 0});
  check_values((tcoll){C_A2A, 0, 0, 1, 0});
  check_values((tcoll){C_A2A, 0, 0, 0, 0});
  check_values((tcoll){C_A2A, 0, 1, 1, 0});
}

Test(sharding_coll, ppermute_shift_and_partial) {
  check_values((tcoll){C_PP, 0, 0, 0, 0});
  check_values((tcoll){C_PP, 0, 0, 0, 1});
}

Test(sharding_coll, local_slice) {
  check_values((tcoll){C_LS, 0, 0, 0, 0});
  check_values((tcoll){C_LS, 0, 1, 0, 0});
}

/* ---- counting -------------------------------------------------------------------- */

static nb_stats counted(const char *mesh, tgroup g, tcoll c, nb_dtype dt, nb_shape s) {
  nb_mesh m = tm_mesh(mesh);
  nb_tensor *phys[8], *out[8];
  for (int d = 0; d < m.n_dev; d++) {
    nb_shape sd = s;
    if (c.kind == C_AG) sd.dims[c.dim] = in_shape(&m, &g, &c, d).dims[c.dim];
    phys[d] = nb_zeros(sd, dt);
  }
  nb_reset_stats();
  cr_assert_eq(run_lib(&m, &g, &c, phys, out), NB_OK, "%s", nb_last_error());
  return nb_get_stats();
}

Test(sharding_coll, stats_counts_and_bytes) {
  /* all-reduce over x (4) of f32 [5,3] on x=4,y=2: 2 groups, B = 60 bytes,
   * 2 (n-1) B = 360 each. */
  nb_stats s = counted("x=4,y=2", (tgroup){1, {AX(0, 1, 4)}}, (tcoll){C_AR, NB_REDUCE_SUM, 0, 0, 0},
                       NB_F32, NB_SHAPE(5, 3));
  cr_assert_eq(s.n_all_reduce, 1);
  cr_assert_eq(s.n_all_gather + s.n_reduce_scatter + s.n_all_to_all + s.n_permute, 0);
  cr_assert_eq(s.collective_bytes, 2 * 360);
  /* all-gather over y (2) of f64 blocks [3,3] and [2,3]: B = 5*3*8 = 120,
   * (n-1) B = 120 per group, 4 groups. */
  s = counted("x=4,y=2", (tgroup){1, {AX(1, 1, 2)}}, (tcoll){C_AG, 0, 0, 0, 0}, NB_F64,
              NB_SHAPE(5, 3));
  cr_assert_eq(s.n_all_gather, 1);
  cr_assert_eq(s.collective_bytes, 4 * 120);
  /* reduce-scatter over (x, y) (8) of f32 [5,3]: one group, 7 * 60. */
  s = counted("x=4,y=2", (tgroup){2, {AX(0, 1, 4), AX(1, 1, 2)}}, (tcoll){C_RS, 0, 0, 0, 0}, NB_F32,
              NB_SHAPE(5, 3));
  cr_assert_eq(s.n_reduce_scatter, 1);
  cr_assert_eq(s.collective_bytes, 420);
  /* all-to-all over x (4) of f64 [4,6], split 1 (chunks 2,2,2,0), concat 0:
   * ranks 0-2 send 192 - 64 bytes, rank 3 all 192; 2 groups. */
  s = counted("x=4,y=2", (tgroup){1, {AX(0, 1, 4)}}, (tcoll){C_A2A, 0, 1, 0, 0}, NB_F64,
              NB_SHAPE(4, 6));
  cr_assert_eq(s.n_all_to_all, 1);
  cr_assert_eq(s.collective_bytes, 2 * (3 * 128 + 192));
  /* ppermute, cyclic over x (4), f32 [5,3]: 4 blocks of 60 bytes per group. */
  s = counted("x=4,y=2", (tgroup){1, {AX(0, 1, 4)}}, (tcoll){C_PP, 0, 0, 0, 0}, NB_F32,
              NB_SHAPE(5, 3));
  cr_assert_eq(s.n_permute, 1);
  cr_assert_eq(s.collective_bytes, 2 * 4 * 60);
  /* ppermute with the one pair (0, 1) over y (2): 4 groups of one 60-byte block. */
  s = counted("x=4,y=2", (tgroup){1, {AX(1, 1, 2)}}, (tcoll){C_PP, 0, 0, 0, 1}, NB_F32,
              NB_SHAPE(5, 3));
  cr_assert_eq(s.collective_bytes, 4 * 60);
  /* a local slice communicates nothing; a trivial group counts the call only. */
  s = counted("x=4,y=2", (tgroup){1, {AX(0, 1, 4)}}, (tcoll){C_LS, 0, 0, 0, 0}, NB_F32,
              NB_SHAPE(5, 3));
  cr_assert_eq(s.n_all_reduce + s.n_all_gather + s.n_reduce_scatter + s.n_all_to_all + s.n_permute,
               0);
  cr_assert_eq(s.collective_bytes, 0);
  s = counted("x=2,y=2", (tgroup){0, {{0}}}, (tcoll){C_AR, NB_REDUCE_SUM, 0, 0, 0}, NB_F32,
              NB_SHAPE(5, 3));
  cr_assert_eq(s.n_all_reduce, 1);
  cr_assert_eq(s.collective_bytes, 0);
}

/* ---- sharing across groups -------------------------------------------------------- */

Test(sharding_coll, replicated_inputs_share_results) {
  /* x=2,y=2: a block per x coordinate, replicated over y (two devices hold
   * one object). Gathering over x gives one object for all four devices;
   * reduce-scatter over x one object per rank. */
  nb_mesh *m = nb_mesh_cpu("x=2,y=2");
  cr_assert(m, "%s", nb_last_error());
  uint64_t live = nbi_live_tensors();
  nb_scope_begin();
  const double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {-1, 0.5, 2, 7, 8, 9};
  nb_tensor *ta = nb_from_data(a, NB_SHAPE(2, 3), NB_F64),
            *tb = nb_from_data(b, NB_SHAPE(2, 3), NB_F64);
  nb_tensor *phys[4] = {ta, ta, tb, tb}, *out[4];
  nbi_axis x = AX(0, 1, 2);
  cr_assert_eq(nbi_coll_all_gather("t", m, phys, &x, 1, 0, out), NB_OK);
  cr_assert(out[0] == out[1] && out[1] == out[2] && out[2] == out[3]);
  double cat[12];
  memcpy(cat, a, sizeof a), memcpy(cat + 6, b, sizeof b);
  tc_assert_close(out[3], cat, NB_SHAPE(4, 3));
  cr_assert_eq(nbi_coll_reduce_scatter("t", m, phys, &x, 1, 1, out), NB_OK);
  cr_assert(out[0] == out[1] && out[2] == out[3] && out[0] != out[2]);
  double r0[4] = {0, 2.5, 11, 13}, r1[2] = {5, 15};
  tc_assert_close(out[0], r0, NB_SHAPE(2, 2));
  tc_assert_close(out[2], r1, NB_SHAPE(2, 1));
  /* every device the same object: an all-reduce over both axes is 4 a. */
  nb_tensor *same[4] = {ta, ta, ta, ta};
  nbi_axis xy[2] = {AX(0, 1, 2), AX(1, 1, 2)};
  cr_assert_eq(nbi_coll_all_reduce("t", m, same, xy, 2, NB_REDUCE_SUM, out), NB_OK);
  double a4[6];
  for (int i = 0; i < 6; i++)
    a4[i] = 4 * a[i];
  tc_assert_close(out[2], a4, NB_SHAPE(2, 3));
  nb_scope_end();
  cr_assert_eq(nbi_live_tensors(), live);
  nb_mesh_release(m);
}

/* ---- derivatives ------------------------------------------------------------------ */

typedef struct gctx {
  const nb_mesh *m;
  const tgroup *g;
  tcoll c;
  nb_tensor *w[8]; /* loss = sum_d sum(w[d] * out[d]) */
} gctx;

static nb_status loss_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  gctx *x = u;
  nb_tensor *y[8];
  nb_status st = run_lib(x->m, x->g, &x->c, in, y);
  if (st) return st;
  nb_tensor *loss = NULL;
  for (int d = 0; d < x->m->n_dev; d++)
    loss = nbi_add_maybe(loss, nb_sum(nb_mul(x->w[d], y[d]), NB_ALL, false));
  out[0] = loss;
  return loss ? NB_OK : nb_last_status();
}

/* nb_grad of sum_d <w_d, coll(x)_d> against the reference: for the linear
 * collectives the reference's transpose applied to w, one basis vector at a
 * time; for max / min, the sum of the group's weights at the winning device. */
static void check_grad(tcoll c) {
  uint64_t seed = 99 + (uint64_t)c.kind * 13 + (uint64_t)c.op;
  for (int k = 0; k < N_CASES; k++) {
    nb_mesh m = tm_mesh(cases[k].mesh);
    const tgroup *g = &cases[k].g;
    uint64_t live = nbi_live_tensors();
    nb_scope_begin();
    hb in[8], w[8], ref[8];
    nb_tensor *phys[8], *grads[8];
    gctx ctx = {&m, g, c, {0}};
    fill_inputs(&m, g, &c, NB_F64, &seed, in, phys);
    run_ref(&m, g, &c, in, ref); /* output shapes for the weights */
    for (int d = 0; d < m.n_dev; d++) {
      w[d] = hb_new(ref[d].s);
      tc_fill(w[d].x, tc_numel(w[d].s), -1, 1, &seed);
      ctx.w[d] = tc_tensor(w[d].x, w[d].s, NB_F64);
    }
    hb_free_all(ref, m.n_dev);
    nb_fn *f = nb_fn_create(loss_body, &ctx, m.n_dev, 1), *gf = nb_grad(f, NB_ALL);
    cr_assert_eq(nb_call(gf, phys, grads), NB_OK, "case %d: %s", k, nb_last_error());
    bool linear = c.kind != C_AR || c.op == NB_REDUCE_SUM || c.op == NB_REDUCE_MEAN;
    for (int e = 0; e < m.n_dev; e++) {
      int64_t ne = tc_numel(in[e].s);
      double *want = calloc((size_t)ne + 1, sizeof *want);
      for (int64_t i = 0; i < ne; i++) {
        if (linear) {
          hb basis[8];
          for (int d = 0; d < m.n_dev; d++)
            basis[d] = hb_new(in[d].s);
          basis[e].x[i] = 1;
          run_ref(&m, g, &c, basis, ref);
          for (int d = 0; d < m.n_dev; d++)
            for (int64_t j = 0; j < tc_numel(ref[d].s); j++)
              want[i] += w[d].x[j] * ref[d].x[j];
          hb_free_all(basis, m.n_dev);
          hb_free_all(ref, m.n_dev);
        } else {
          int n = group_size(g), win = ref_member(&m, g, e, 0);
          for (int s = 1; s < n; s++) {
            int o = ref_member(&m, g, e, s);
            double v = in[o].x[i], best = in[win].x[i];
            if (c.op == NB_REDUCE_MAX ? v > best : v < best) win = o;
          }
          if (win == e)
            for (int s = 0; s < n; s++)
              want[i] += w[ref_member(&m, g, e, s)].x[i];
        }
      }
      tc_assert_close(grads[e], want, in[e].s);
      free(want);
    }
    nb_fn_release(gf);
    nb_fn_release(f);
    hb_free_all(in, m.n_dev);
    hb_free_all(w, m.n_dev);
    nb_scope_end();
    cr_assert_eq(nbi_live_tensors(), live, "case %d leaks tensors", k);
  }
}

Test(sharding_coll, grad_all_reduce) {
  for (int op = NB_REDUCE_SUM; op <= NB_REDUCE_MEAN; op++)
    check_grad((tcoll){C_AR, op, 0, 0, 0});
}

Test(sharding_coll, grad_gather_scatter_all_to_all_permute_slice) {
  check_grad((tcoll){C_AG, 0, 0, 0, 0});
  check_grad((tcoll){C_AG, 0, 1, 0, 0});
  check_grad((tcoll){C_RS, 0, 0, 0, 0});
  check_grad((tcoll){C_A2A, 0, 1, 0, 0});
  check_grad((tcoll){C_A2A, 0, 0, 0, 0});
  check_grad((tcoll){C_PP, 0, 0, 0, 0});
  check_grad((tcoll){C_PP, 0, 0, 0, 1});
  check_grad((tcoll){C_LS, 0, 1, 0, 0});
}

/* The VJP of a collective (the function phys -> out[0..n_dev)) is its dual
 * collective of the cotangents. */
typedef struct vctx {
  const nb_mesh *m;
  const tgroup *g;
  tcoll c;
} vctx;

static nb_status coll_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  vctx *x = u;
  return run_lib(x->m, x->g, &x->c, in, out);
}

static void check_dual(const tcase *tc, tcoll fwd, tcoll dual) {
  nb_mesh m = tm_mesh(tc->mesh);
  const tgroup *g = &tc->g;
  int nd = m.n_dev;
  uint64_t seed = 5, live = nbi_live_tensors();
  nb_scope_begin();
  hb in[8], ct[8];
  nb_tensor *args[16], *res[16], *dual_out[8];
  fill_inputs(&m, g, &fwd, NB_F64, &seed, in, args);
  run_ref(&m, g, &fwd, in, ct);
  for (int d = 0; d < nd; d++) {
    tc_fill(ct[d].x, tc_numel(ct[d].s), -1, 1, &seed);
    args[nd + d] = tc_tensor(ct[d].x, ct[d].s, NB_F64);
  }
  vctx ctx = {&m, g, fwd};
  nb_fn *f = nb_fn_create(coll_body, &ctx, nd, nd), *v = nb_vjp_fn(f);
  cr_assert_eq(nb_call(v, args, res), NB_OK, "%s", nb_last_error());
  cr_assert_eq(run_lib(&m, g, &dual, args + nd, dual_out), NB_OK, "%s", nb_last_error());
  for (int d = 0; d < nd; d++) {
    double *want = tc_read(dual_out[d]);
    tc_assert_close(res[nd + d], want, nb_shape_of(dual_out[d]));
    free(want);
  }
  nb_fn_release(v);
  nb_fn_release(f);
  hb_free_all(in, nd);
  hb_free_all(ct, nd);
  nb_scope_end();
  cr_assert_eq(nbi_live_tensors(), live);
}

Test(sharding_coll, vjp_is_the_dual_collective) {
  for (int k = 0; k < N_CASES; k++) {
    const tcase *tc = &cases[k];
    check_dual(tc, (tcoll){C_AG, 0, 0, 0, 0}, (tcoll){C_RS, 0, 0, 0, 0});
    check_dual(tc, (tcoll){C_AR, NB_REDUCE_SUM, 0, 0, 0}, (tcoll){C_AR, NB_REDUCE_SUM, 0, 0, 0});
    /* all-to-all (split 1, concat 0) on ceil-chunked rows: the inverse swaps
     * the dims */
    check_dual(tc, (tcoll){C_A2A, 0, 1, 0, 0}, (tcoll){C_A2A, 0, 0, 1, 0});
  }
}

/* ---- jit and vmap ------------------------------------------------------------------- */

Test(sharding_coll, jit_and_vmap_see_ordinary_ops) {
  nb_mesh m = tm_mesh("x=4,y=2");
  tgroup g = {2, {AX(0, 2, 2), AX(1, 1, 2)}};
  tcoll c = {C_RS, 0, 1, 0, 0};
  vctx ctx = {&m, &g, c};
  uint64_t seed = 11, live = nbi_live_tensors();
  nb_scope_begin();
  hb in[8], ref[8];
  nb_tensor *phys[8], *out[8];
  fill_inputs(&m, &g, &c, NB_F32, &seed, in, phys);
  run_ref(&m, &g, &c, in, ref);
  nb_fn *f = nb_fn_create(coll_body, &ctx, 8, 8), *j = nb_jit(f);
  for (int rep = 0; rep < 2; rep++) {
    nb_reset_stats();
    cr_assert_eq(nb_call(j, phys, out), NB_OK, "%s", nb_last_error());
    for (int d = 0; d < 8; d++)
      tc_assert_close(out[d], ref[d].x, ref[d].s);
    /* counted when traced, not when the program replays */
    cr_assert_eq(nb_get_stats().n_reduce_scatter, rep == 0 ? 1 : 0);
  }
  /* vmap over a leading batch of 3: example b of the result is the
   * collective of example b. */
  nb_tensor *batched[8];
  for (int d = 0; d < 8; d++) {
    nb_tensor *ex[3] = {phys[d], nb_mul_scalar(phys[d], 2), nb_neg(phys[d])};
    batched[d] = nb_stack(ex, 3, 0);
  }
  nb_fn *v = nb_vmap(f, NULL, NULL);
  cr_assert_eq(nb_call(v, batched, out), NB_OK, "%s", nb_last_error());
  const double scale[3] = {1, 2, -1};
  for (int d = 0; d < 8; d++) {
    nb_shape s = ref[d].s;
    int64_t ne = tc_numel(s);
    double *want = malloc((size_t)(3 * ne + 1) * sizeof *want);
    for (int b = 0; b < 3; b++)
      for (int64_t i = 0; i < ne; i++)
        want[b * ne + i] = scale[b] * ref[d].x[i];
    tc_assert_close(out[d], want, NB_SHAPE(3, s.dims[0], s.dims[1]));
    free(want);
  }
  nb_fn_release(v);
  nb_fn_release(j);
  nb_fn_release(f);
  hb_free_all(in, 8);
  hb_free_all(ref, 8);
  nb_scope_end();
  cr_assert_eq(nbi_live_tensors(), live);
}

/* ---- errors -------------------------------------------------------------------------- */

static void expect_fail(nb_status got, nb_status want, const char *needle, nb_tensor **out, int n) {
  cr_assert_eq(got, want, "status %s (%s)", nb_status_str(got), nb_last_error());
  tc_assert_error(want, needle);
  for (int d = 0; d < n; d++)
    cr_assert_null(out[d]);
}

Test(sharding_coll, argument_errors) {
  nb_mesh m = tm_mesh("x=2,y=2");
  nb_tensor *a = nb_zeros(NB_SHAPE(2, 3), NB_F32), *b = nb_zeros(NB_SHAPE(3, 3), NB_F32);
  nb_tensor *phys[4] = {a, a, a, a}, *out[4];
  nbi_axis x = AX(0, 1, 2), y = AX(1, 1, 2), bad = AX(2, 1, 2), big = AX(0, 1, 4);
  nbi_axis over[2] = {AX(0, 1, 2), AX(0, 1, 2)}, unnested[2] = {AX(0, 1, 2), AX(0, 3, 2)};
  nb_clear_error();
  expect_fail(nbi_coll_all_reduce("nb_all_reduce", &m, phys, &bad, 1, NB_REDUCE_SUM, out),
              NB_ERR_SHARDING, "nb_all_reduce: axes[0] is not a (sub-)axis of mesh x=2,y=2", out,
              4);
  expect_fail(nbi_coll_all_reduce("nb_all_reduce", &m, phys, &big, 1, NB_REDUCE_SUM, out),
              NB_ERR_SHARDING, "not a (sub-)axis", out, 4);
  expect_fail(nbi_coll_all_gather("nb_all_gather", &m, phys, over, 2, 0, out), NB_ERR_SHARDING,
              "nb_all_gather: axes[0] and axes[1] overlap", out, 4);
  /* x:(1)2 and x:(3)2 of x=6 do not nest: their coordinates are not independent */
  nb_mesh m6 = tm_mesh("x=6");
  nb_tensor *six[6] = {a, a, a, a, a, a}, *out6[6];
  expect_fail(nbi_coll_all_gather("nb_all_gather", &m6, six, unnested, 2, 0, out6), NB_ERR_SHARDING,
              "nb_all_gather: axes[0] and axes[1] overlap", out6, 6);
  expect_fail(nbi_coll_all_gather("nb_all_gather", &m, phys, &x, 1, 2, out), NB_ERR_AXIS,
              "nb_all_gather", out, 4);
  expect_fail(nbi_coll_all_reduce("nb_all_reduce", &m, phys, &x, 1, 9, out), NB_ERR_ARG,
              "nb_all_reduce: reduction 9", out, 4);
  nb_tensor *mixed[4] = {a, a, b, b};
  expect_fail(nbi_coll_all_reduce("nb_all_reduce", &m, mixed, &x, 1, NB_REDUCE_SUM, out),
              NB_ERR_SHAPE,
              "nb_all_reduce: devices 0 and 2 of one group hold shapes [2,3] and [3,3]", out, 4);
  /* along dim 0 the gather takes blocks of different lengths; not along 1 */
  cr_assert_eq(nbi_coll_all_gather("nb_all_gather", &m, mixed, &x, 1, 0, out), NB_OK);
  expect_fail(nbi_coll_all_gather("nb_all_gather", &m, mixed, &x, 1, 1, out), NB_ERR_SHAPE,
              "nb_all_gather: devices 0 and 2", out, 4);
  nb_tensor *holes[4] = {a, NULL, a, a};
  expect_fail(nbi_coll_reduce_scatter("nb_reduce_scatter", &m, holes, &y, 1, 0, out), NB_ERR_NULL,
              "nb_reduce_scatter: phys[1] is NULL", out, 4);
  nb_tensor *f64 = nb_zeros(NB_SHAPE(2, 3), NB_F64), *dts[4] = {a, f64, a, a};
  expect_fail(nbi_local_slice("nb_shard", &m, dts, &y, 1, 0, out), NB_ERR_DTYPE,
              "nb_shard: phys[1] is f64 but phys[0] is f32", out, 4);
  nb_tensor *ia = nb_zeros(NB_SHAPE(2), NB_I32), *ints[4] = {ia, ia, ia, ia};
  expect_fail(nbi_coll_all_reduce("nb_all_reduce", &m, ints, &x, 1, NB_REDUCE_MEAN, out),
              NB_ERR_DTYPE, "nb_all_reduce: mean of i32 shards", out, 4);
  cr_assert_eq(nbi_coll_all_reduce("nb_all_reduce", &m, ints, &x, 1, NB_REDUCE_MAX, out), NB_OK);
  const int dup[2][2] = {{0, 1}, {1, 1}}, far[1][2] = {{0, 2}};
  expect_fail(nbi_coll_ppermute("nb_ppermute", &m, phys, &x, 1, dup, 2, out), NB_ERR_ARG,
              "nb_ppermute: rank 1 is the destination of two pairs", out, 4);
  expect_fail(nbi_coll_ppermute("nb_ppermute", &m, phys, &x, 1, far, 1, out), NB_ERR_INDEX,
              "nb_ppermute: pair 0 (0, 2) is out of range for groups of 2", out, 4);
  expect_fail(nbi_coll_all_to_all("nb_all_to_all", &m, phys, &x, 1, 0, -3, out), NB_ERR_AXIS,
              "nb_all_to_all", out, 4);
  expect_fail(nbi_coll_all_reduce("nb_all_reduce", NULL, phys, &x, 1, NB_REDUCE_SUM, out),
              NB_ERR_NULL, "nb_all_reduce: the mesh is NULL", out, 0);
  /* a 0-d tensor reduces but has no dimension to gather */
  nb_tensor *z = nb_scalar(1, NB_F32), *zs[4] = {z, z, z, z};
  cr_assert_eq(nbi_coll_all_reduce("nb_all_reduce", &m, zs, &y, 1, NB_REDUCE_SUM, out), NB_OK);
  cr_assert_float_eq(nb_item(out[0]), 2.0, 0);
  expect_fail(nbi_coll_all_gather("nb_all_gather", &m, zs, &y, 1, 0, out), NB_ERR_AXIS,
              "nb_all_gather", out, 4);
}
