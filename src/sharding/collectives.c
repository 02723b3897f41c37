/* src/sharding/collectives.c — collectives on a logical tensor's physical
 * shards (contract: sharding.h, "collectives on physical shards").
 *
 * Each collective is a graph of ordinary public ops over the devices'
 * tensors (nb_add / nb_maximum / nb_minimum chains in rank order, nb_concat,
 * nb_slice, nb_div_scalar, zeros), so autodiff, vmap and jit see ordinary ops:
 * the VJP of an all-gather comes out as a reduce-scatter of the cotangents,
 * of an all-reduce sum as an all-reduce sum, of an all-to-all as the inverse
 * all-to-all, of a ppermute as the inverse ppermute.
 *
 * Groups: the devices whose coordinates differ only on `axes`; a device's rank
 * is the mixed-radix number of its coordinates on them (major first,
 * nbi_axis_coord); its group's leader is the device with those coordinates 0.
 *
 * Ownership: out[] entries are borrowed, like any op's result: each distinct
 * result object is registered once in the caller's current scope, however
 * many entries of out[] name it. Devices whose results are equal share one
 * object: every member of a group gets the same all-reduce / all-gather
 * result; two groups whose members hold the same objects rank by rank (a
 * tensor replicated over the other axes) share all their results; a trivial
 * group (size 1) gets its input object itself, and a ppermute destination the
 * source's object. A caller that stores out[d] beyond the scope retains it
 * once per entry it stores (and releases it once per entry).
 *
 * Counting (nb_stats): each successful call counts one collective of its kind
 * (also with trivial groups, which send nothing) and adds the bytes sent,
 * summed over all devices of all groups, for a group of n devices:
 *   all-reduce      2 (n-1) B   B = bytes of the tensor being reduced (every
 *                               member's local tensor; ring: 2 (n-1)/n B each)
 *   all-gather      (n-1) B     B = bytes of the concatenated result (each
 *                               block goes to the n-1 other members)
 *   reduce-scatter  (n-1) B     B = bytes of the tensor being reduced (ring:
 *                               each chunk passes n-1 hops)
 *   all-to-all      sum over members of (B_d - K_d), B_d the bytes of the
 *                   member's shard, K_d those of the chunk it keeps (its own
 *                   rank's): (n-1)/n B_d each when the split divides
 *   ppermute        sum over pairs with src != dst of the bytes of src's block
 * local slice counts nothing. Groups that share results with another group
 * still count (on real devices each group communicates). */
#include <stdlib.h>

#include "sharding.h"

#include "../ops/rule_util.h"

/* ---- groups ------------------------------------------------------------------ */

typedef struct groups {
  const nb_mesh *m;
  int n;          /* devices per group */
  int n_groups;   /* n_dev / n */
  int *member;    /* [n_groups * n]: the device of rank r in group g */
  int *rank;      /* [n_dev] */
  int *same_as;   /* [n_groups]: earliest group holding the same objects rank by rank */
  nb_dtype dtype; /* of every phys tensor */
  size_t elt;     /* its size in bytes */
} groups;

static void groups_free(groups *g) {
  free(g->member);
  *g = (groups){0};
}

/* Place value of (sub-)axis a's digit inside its axis's coordinate. */
static int64_t sub_stride(const nb_mesh *m, const nbi_axis *a) {
  return m->size[a->axis] / (a->pre * a->size);
}

static size_t bytes_of(const nb_tensor *t, size_t elt) {
  return (size_t)nbi_numel(&t->shape) * elt;
}

/* Checks the arguments every collective takes and builds the groups (*g owns
 * one allocation; groups_free releases it). Sets out[] to NULL. */
static nb_status make_groups(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                             const nbi_axis *axes, int n_axes, nb_tensor **out, groups *g) {
  *g = (groups){0};
  if (!m || !phys || !out || (n_axes > 0 && !axes))
    return nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn,
                     !m      ? "the mesh"
                     : !phys ? "phys"
                     : !out  ? "out"
                             : "axes");
  if (m->n_dev < 1 || m->n_axes < 0 || m->n_axes > NBI_MESH_MAX_AXES)
    return nbi_error(NB_ERR_SHARDING, "%s: invalid mesh", fn);
  for (int d = 0; d < m->n_dev; d++)
    out[d] = NULL;
  if (n_axes < 0 || n_axes > NBI_MESH_MAX_AXES)
    return nbi_error(NB_ERR_SHARDING, "%s: %d axes (at most %d)", fn, n_axes, NBI_MESH_MAX_AXES);
  int64_t n = 1;
  for (int i = 0; i < n_axes; i++) {
    const nbi_axis *a = &axes[i];
    if (a->axis < 0 || a->axis >= m->n_axes || a->pre < 1 || a->size < 1 ||
        a->pre > m->size[a->axis] / a->size || m->size[a->axis] % (a->pre * a->size) != 0)
      return nbi_error(NB_ERR_SHARDING, "%s: axes[%d] is not a (sub-)axis of mesh %s", fn, i,
                       m->text);
    for (int j = 0; j < i; j++) {
      const nbi_axis *b = &axes[j];
      if (nbi_axis_overlap(a, b))
        return nbi_error(NB_ERR_SHARDING, "%s: axes[%d] and axes[%d] overlap", fn, j, i);
    }
    n *= a->size;
  }
  for (int d = 0; d < m->n_dev; d++) {
    if (!phys[d]) return nbi_error(NB_ERR_NULL, "%s: phys[%d] is NULL", fn, d);
    if (phys[d]->mesh)
      return nbi_error(NB_ERR_SHARDING, "%s: phys[%d] is a sharded tensor, not a device's", fn, d);
    if (phys[d]->dtype != phys[0]->dtype)
      return nbi_error(NB_ERR_DTYPE, "%s: phys[%d] is %s but phys[0] is %s", fn, d,
                       nb_dtype_name(phys[d]->dtype), nb_dtype_name(phys[0]->dtype));
  }
  if (m->n_dev % n != 0)
    return nbi_error(NB_ERR_SHARDING, "%s: groups of %lld do not divide mesh %s", fn, (long long)n,
                     m->text);
  g->m = m;
  g->n = (int)n;
  g->n_groups = m->n_dev / g->n;
  g->dtype = phys[0]->dtype;
  g->elt = nb_dtype_size(g->dtype);
  int nd = m->n_dev;
  int *mem = malloc((size_t)(3 * nd + g->n_groups) * sizeof *mem);
  if (!mem) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  g->member = mem;
  g->rank = mem + nd;
  int *of_key = mem + 2 * nd; /* group id of a leader device, or -1 */
  g->same_as = mem + 3 * nd;
  for (int d = 0; d < nd; d++) {
    of_key[d] = -1;
    g->member[d] = -1;
  }
  int next = 0;
  for (int d = 0; d < nd; d++) {
    int64_t c[NBI_MESH_MAX_AXES];
    for (int i = 0; i < m->n_axes; i++) {
      nbi_axis whole = nbi_axis_whole(m, i);
      c[i] = nbi_axis_coord(m, &whole, d);
    }
    int64_t r = 0;
    for (int i = 0; i < n_axes; i++) { /* the rank; the leader: the group's digits zeroed */
      int64_t digit = nbi_axis_coord(m, &axes[i], d);
      r = r * axes[i].size + digit;
      c[axes[i].axis] -= digit * sub_stride(m, &axes[i]);
    }
    int64_t key = 0;
    for (int i = 0; i < m->n_axes; i++)
      key = key * m->size[i] + c[i];
    if (of_key[key] < 0) {
      if (next == g->n_groups) break; /* more leaders than groups: caught below */
      of_key[key] = next++;
    }
    int gi = of_key[key];
    if (g->member[gi * g->n + r] >= 0) break; /* two devices of one rank: caught below */
    g->member[gi * g->n + r] = d;
    g->rank[d] = (int)r;
  }
  for (int k = 0; k < nd; k++) {
    if (g->member[k] < 0) {
      groups_free(g);
      return nbi_error(NB_ERR_SHARDING, "%s: the axes do not split mesh %s into groups", fn,
                       m->text);
    }
  }
  for (int gi = 0; gi < g->n_groups; gi++) {
    g->same_as[gi] = gi;
    /* across processes every group combines its own fetched blocks */
    for (int gj = 0; gj < gi && g->same_as[gi] == gi && m->n_ranks == 1; gj++) {
      if (g->same_as[gj] != gj) continue;
      bool eq = true;
      for (int r = 0; r < g->n && eq; r++)
        eq = phys[g->member[gi * g->n + r]] == phys[g->member[gj * g->n + r]];
      if (eq) g->same_as[gi] = gj;
    }
  }
  return NB_OK;
}

/* The tensor of rank r in group gi. */
static nb_tensor *at(const groups *g, nb_tensor *const *phys, int gi, int r) {
  return phys[g->member[gi * g->n + r]];
}

/* at() moved to the device of rank `to` of group gi (on devices of their own,
 * the group combines its members' values there). */
static nb_tensor *at_on(const groups *g, nb_tensor *const *phys, int gi, int r, int to) {
  return nbi_place(g->m, g->member[gi * g->n + to], at(g, phys, gi, r));
}

/* Every member of group gi gets the same shape (all dims when except < 0). */
static nb_status same_shapes(const char *fn, const groups *g, nb_tensor *const *phys, int gi,
                             int except) {
  const nb_shape *s0 = &at(g, phys, gi, 0)->shape;
  for (int r = 1; r < g->n; r++) {
    const nb_shape *s = &at(g, phys, gi, r)->shape;
    bool ok = s->ndim == s0->ndim;
    for (int k = 0; k < s0->ndim && ok; k++)
      ok = k == except || s->dims[k] == s0->dims[k];
    if (!ok) {
      char a[96], b[96];
      return nbi_error(NB_ERR_SHAPE, "%s: devices %d and %d of one group hold shapes %s and %s", fn,
                       g->member[gi * g->n], g->member[gi * g->n + r],
                       nb_shape_str(*s0, a, sizeof a), nb_shape_str(*s, b, sizeof b));
    }
  }
  return NB_OK;
}

/* dim of every phys tensor (all of one rank), normalized. */
static nb_status norm_dim(const char *fn, const nb_mesh *m, nb_tensor *const *phys, int dim,
                          int *out) {
  int nd = phys[0]->shape.ndim;
  for (int d = 1; d < m->n_dev; d++)
    if (phys[d]->shape.ndim != nd)
      return nbi_error(NB_ERR_SHAPE, "%s: phys[%d] has %d dims but phys[0] has %d", fn, d,
                       phys[d]->shape.ndim, nd);
  return nbi_norm_axis(fn, dim, nd, out);
}

/* Ceil chunk r of n along a dimension of size len: [*start, *stop) (sharding.h). */
void nbi_coll_chunk(int64_t len, int n, int r, int64_t *start, int64_t *stop) {
  int64_t c = (len + n - 1) / n;
  *start = r * c < len ? r * c : len;
  *stop = (r + 1) * c < len ? (r + 1) * c : len;
}

/* Chunk r of n of t along dim (t itself when it is the whole tensor; sharding.h). */
nb_tensor *nbi_coll_chunk_of(nb_tensor *t, int dim, int n, int r) {
  int64_t starts[NB_MAX_DIMS] = {0}, stops[NB_MAX_DIMS];
  for (int k = 0; k < t->shape.ndim; k++)
    stops[k] = t->shape.dims[k];
  nbi_coll_chunk(t->shape.dims[dim], n, r, &starts[dim], &stops[dim]);
  if (starts[dim] == 0 && stops[dim] == t->shape.dims[dim]) return t;
  return nb_slice(t, starts, stops, NULL);
}

/* ---- across processes --------------------------------------------------------------
 * On a mesh spanning ranks (sharding.h, "meshes spanning processes") a
 * collective first fetches, in one exchange, every block of another rank that
 * a member here combines, then runs the same ops as in one process on the
 * blocks it now holds (*ph: phys with those blocks fetched; phys itself on a
 * mesh in one process). src_of (ppermute) names the one rank each rank reads;
 * NULL: each member reads every member's block. The results of remote devices
 * are then remote blocks (nbi_localize). */
static nb_status fetch(const char *fn, const groups *g, nb_tensor *const *phys, const int *src_of,
                       nb_tensor *const **ph, nb_tensor ***owned) {
  const nb_mesh *m = g->m;
  *ph = phys;
  *owned = NULL;
  if (m->n_ranks <= 1) return NB_OK;
  int R = m->n_ranks;
  bool *need = calloc((size_t)m->n_dev * (size_t)R, sizeof *need);
  nb_tensor **got = malloc(sizeof *got * (size_t)m->n_dev);
  if (!need || !got) {
    free(need), free(got);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  }
  for (int gi = 0; gi < g->n_groups; gi++)
    for (int r = 0; r < g->n; r++) {
      int u = nbi_mesh_rank_of(m, g->member[gi * g->n + r]);
      for (int q = 0; q < g->n; q++) {
        int s = g->member[gi * g->n + q];
        if ((!src_of || src_of[r] == q) && nbi_mesh_rank_of(m, s) != u)
          need[(size_t)s * (size_t)R + (size_t)u] = true;
      }
    }
  bool any = false; /* every rank computes the same matrix: all skip alike */
  for (size_t i = 0; i < (size_t)m->n_dev * (size_t)R && !any; i++)
    any = need[i];
  nb_status st = any ? nbi_fetch_blocks(fn, m, phys, need, got) : NB_OK;
  free(need);
  if (!any) {
    free(got);
    return NB_OK;
  }
  if (st) {
    free(got);
    return st;
  }
  *ph = *owned = got;
  return NB_OK;
}

/* Whether the collective goes as its groups' MPI collectives (dist_coll.c):
 * on a mesh spanning processes whose groups have every member on a rank of
 * its own. Reductions: of F32, F64, I32, I64 (MPI's types); float sums over
 * more than 2 ranks, which MPI may associate differently, only without
 * NABLA_MPI_EXACT=1. Otherwise the whole-blocks way (fetch). */
static bool native(const groups *g, bool reduces, int op, nbi_dgroups *dg) {
  const nb_mesh *m = g->m;
  if (m->n_ranks <= 1 || g->n < 2) return false;
  nb_dtype dt = g->dtype;
  bool fl = dt == NB_F32 || dt == NB_F64;
  if (reduces && !fl && dt != NB_I32 && dt != NB_I64) return false;
  if (reduces && fl && (op == NB_REDUCE_SUM || op == NB_REDUCE_MEAN) && g->n > 2 &&
      nbi_dist_exact())
    return false;
  for (int gi = 0; gi < g->n_groups; gi++)
    for (int r = 0; r < g->n; r++)
      for (int q = 0; q < r; q++)
        if (nbi_mesh_rank_of(m, g->member[gi * g->n + r]) ==
            nbi_mesh_rank_of(m, g->member[gi * g->n + q]))
          return false;
  *dg = (nbi_dgroups){.m = m, .n = g->n, .n_groups = g->n_groups, .member = g->member, .dtype = dt};
  return true;
}

/* ---- running one collective ----------------------------------------------------
 * The results are built in a scope of their own: on success every distinct
 * object of out[] is kept once into the caller's scope; on failure the scope
 * drops everything and out[] is all NULL. */

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (nb_tensor *const *)a, y = (uintptr_t) * (nb_tensor *const *)b;
  return x < y ? -1 : x > y;
}

static nb_status finish(const char *fn, int n_dev, nb_tensor **out, bool ok, groups *g, int kind,
                        uint64_t bytes) {
  if (ok) ok = nbi_place_all(g->m, out) == NB_OK; /* each result on its own device */
  if (ok) ok = nbi_localize(g->m, out) == NB_OK;  /* remote devices: remote blocks */
  groups_free(g);
  nb_tensor **sorted = ok ? malloc((size_t)n_dev * sizeof *sorted) : NULL;
  if (ok && !sorted) ok = nbi_error(NB_ERR_OOM, "%s: out of memory", fn) == NB_OK;
  if (ok) {
    memcpy(sorted, out, (size_t)n_dev * sizeof *sorted);
    qsort(sorted, (size_t)n_dev, sizeof *sorted, cmp_ptr);
    for (int d = 0; d < n_dev && ok; d++) /* out of memory: released with the scope */
      if ((d == 0 || sorted[d] != sorted[d - 1]) && !nb_keep(sorted[d])) ok = false;
    free(sorted);
  }
  nb_scope_end();
  if (!ok) {
    for (int d = 0; d < n_dev; d++)
      out[d] = NULL;
    nb_status s = nb_last_status();
    return s != NB_OK ? s : nbi_error(NB_ERR_INTERNAL, "%s: a collective step failed", fn);
  }
  if (kind >= 0) nbi_stats_collective(kind, bytes);
  return NB_OK;
}

/* Copies the results of the groups that share another group's objects. */
static void copy_shared(const groups *g, nb_tensor **out) {
  for (int gi = 0; gi < g->n_groups; gi++) {
    int src = g->same_as[gi];
    if (src == gi) continue;
    for (int r = 0; r < g->n; r++)
      out[g->member[gi * g->n + r]] = out[g->member[src * g->n + r]];
  }
}

/* Sum (or max, min) of group gi in rank order. */
static nb_tensor *reduce_group(const groups *g, nb_tensor *const *phys, int gi, int op) {
  nb_tensor *acc = at_on(g, phys, gi, 0, 0);
  for (int r = 1; r < g->n && acc; r++) {
    nb_tensor *x = at_on(g, phys, gi, r, 0);
    acc = op == NB_REDUCE_MAX   ? nb_maximum(acc, x)
          : op == NB_REDUCE_MIN ? nb_minimum(acc, x)
                                : nb_add(acc, x);
  }
  if (acc && op == NB_REDUCE_MEAN && g->n > 1) acc = nb_div_scalar(acc, g->n);
  return acc;
}

/* ---- the collectives ------------------------------------------------------------- */

nb_status nbi_coll_all_reduce(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                              const nbi_axis *axes, int n_axes, int op, nb_tensor **out) {
  groups g;
  nb_status st = make_groups(fn, m, phys, axes, n_axes, out, &g);
  if (st) return st;
  if (op < NB_REDUCE_SUM || op > NB_REDUCE_MEAN)
    st = nbi_error(NB_ERR_ARG, "%s: reduction %d", fn, op);
  if (!st && op == NB_REDUCE_MEAN && !nb_dtype_is_float(g.dtype))
    st = nbi_error(NB_ERR_DTYPE, "%s: mean of %s shards (needs a floating dtype)", fn,
                   nb_dtype_name(g.dtype));
  uint64_t bytes = 0;
  for (int gi = 0; gi < g.n_groups && !st; gi++) {
    st = same_shapes(fn, &g, phys, gi, -1);
    bytes += 2 * (uint64_t)(g.n - 1) * bytes_of(at(&g, phys, gi, 0), g.elt);
  }
  if (st) {
    groups_free(&g);
    return st;
  }
  nb_scope_begin();
  nbi_dgroups dg;
  if (native(&g, true, op, &dg)) {
    bool done = nbi_dist_all_reduce(fn, &dg, phys, op, out) == NB_OK;
    return finish(fn, m->n_dev, out, done, &g, NBI_COLL_ALL_REDUCE, bytes);
  }
  nb_tensor **fetched; /* blocks of other processes (NULL: none) */
  bool ok = fetch(fn, &g, phys, NULL, &phys, &fetched) == NB_OK;
  for (int gi = 0; gi < g.n_groups && ok; gi++) {
    if (g.same_as[gi] != gi) continue;
    nb_tensor *y = reduce_group(&g, phys, gi, op);
    ok = y != NULL;
    for (int r = 0; r < g.n; r++)
      out[g.member[gi * g.n + r]] = y;
  }
  if (ok) copy_shared(&g, out);
  free(fetched);
  return finish(fn, m->n_dev, out, ok, &g, NBI_COLL_ALL_REDUCE, bytes);
}

nb_status nbi_coll_all_gather(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                              const nbi_axis *axes, int n_axes, int dim, nb_tensor **out) {
  groups g;
  nb_status st = make_groups(fn, m, phys, axes, n_axes, out, &g);
  int a = 0;
  if (st) return st;
  st = norm_dim(fn, m, phys, dim, &a);
  uint64_t bytes = 0;
  for (int gi = 0; gi < g.n_groups && !st; gi++) {
    st = same_shapes(fn, &g, phys, gi, a);
    uint64_t b = 0;
    for (int r = 0; r < g.n; r++)
      b += bytes_of(at(&g, phys, gi, r), g.elt);
    bytes += (uint64_t)(g.n - 1) * b;
  }
  if (st) {
    groups_free(&g);
    return st;
  }
  nb_scope_begin();
  nbi_dgroups dg;
  if (native(&g, false, 0, &dg)) {
    bool done = nbi_dist_all_gather(fn, &dg, phys, a, out) == NB_OK;
    return finish(fn, m->n_dev, out, done, &g, NBI_COLL_ALL_GATHER, bytes);
  }
  nb_tensor **fetched; /* blocks of other processes (NULL: none) */
  bool ok = fetch(fn, &g, phys, NULL, &phys, &fetched) == NB_OK;
  nb_tensor **blocks = malloc((size_t)g.n * sizeof *blocks);
  if (!blocks) ok = nbi_error(NB_ERR_OOM, "%s: out of memory", fn) == NB_OK;
  for (int gi = 0; gi < g.n_groups && ok; gi++) {
    if (g.same_as[gi] != gi) continue;
    for (int r = 0; r < g.n && ok; r++)
      ok = (blocks[r] = at_on(&g, phys, gi, r, 0)) != NULL;
    nb_tensor *y = !ok ? NULL : g.n == 1 ? blocks[0] : nb_concat(blocks, g.n, a);
    ok = y != NULL;
    for (int r = 0; r < g.n; r++)
      out[g.member[gi * g.n + r]] = y;
  }
  free(blocks);
  if (ok) copy_shared(&g, out);
  free(fetched);
  return finish(fn, m->n_dev, out, ok, &g, NBI_COLL_ALL_GATHER, bytes);
}

nb_status nbi_coll_reduce_scatter(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                                  const nbi_axis *axes, int n_axes, int dim, nb_tensor **out) {
  groups g;
  nb_status st = make_groups(fn, m, phys, axes, n_axes, out, &g);
  int a = 0;
  if (st) return st;
  st = norm_dim(fn, m, phys, dim, &a);
  uint64_t bytes = 0;
  for (int gi = 0; gi < g.n_groups && !st; gi++) {
    st = same_shapes(fn, &g, phys, gi, -1);
    bytes += (uint64_t)(g.n - 1) * bytes_of(at(&g, phys, gi, 0), g.elt);
  }
  if (st) {
    groups_free(&g);
    return st;
  }
  nb_scope_begin();
  nbi_dgroups dg;
  if (native(&g, true, NB_REDUCE_SUM, &dg)) {
    bool done = nbi_dist_reduce_scatter(fn, &dg, phys, a, out) == NB_OK;
    return finish(fn, m->n_dev, out, done, &g, NBI_COLL_REDUCE_SCATTER, bytes);
  }
  nb_tensor **fetched; /* blocks of other processes (NULL: none) */
  bool ok = fetch(fn, &g, phys, NULL, &phys, &fetched) == NB_OK;
  for (int gi = 0; gi < g.n_groups && ok; gi++) {
    if (g.same_as[gi] != gi) continue;
    nb_tensor *sum = reduce_group(&g, phys, gi, NB_REDUCE_SUM);
    ok = sum != NULL;
    for (int r = 0; r < g.n && ok; r++) {
      nb_tensor *y = nbi_coll_chunk_of(sum, a, g.n, r);
      ok = y != NULL;
      out[g.member[gi * g.n + r]] = y;
    }
  }
  if (ok) copy_shared(&g, out);
  free(fetched);
  return finish(fn, m->n_dev, out, ok, &g, NBI_COLL_REDUCE_SCATTER, bytes);
}

nb_status nbi_coll_all_to_all(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                              const nbi_axis *axes, int n_axes, int split_dim, int concat_dim,
                              nb_tensor **out) {
  groups g;
  nb_status st = make_groups(fn, m, phys, axes, n_axes, out, &g);
  int sa = 0, ca = 0;
  if (st) return st;
  st = norm_dim(fn, m, phys, split_dim, &sa);
  if (!st) st = norm_dim(fn, m, phys, concat_dim, &ca);
  for (int gi = 0; gi < g.n_groups && !st; gi++)
    st = same_shapes(fn, &g, phys, gi, ca);
  uint64_t bytes = 0;
  for (int d = 0; d < m->n_dev && !st; d++) {
    const nb_shape *s = &phys[d]->shape;
    int64_t b, e;
    nbi_coll_chunk(s->dims[sa], g.n, g.rank[d], &b, &e);
    int64_t kept = s->dims[sa] ? nbi_numel(s) / s->dims[sa] * (e - b) : 0;
    bytes += bytes_of(phys[d], g.elt) - (uint64_t)kept * g.elt;
  }
  if (st) {
    groups_free(&g);
    return st;
  }
  nb_scope_begin();
  nbi_dgroups dg;
  if (native(&g, false, 0, &dg)) {
    bool done = nbi_dist_all_to_all(fn, &dg, phys, sa, ca, out) == NB_OK;
    return finish(fn, m->n_dev, out, done, &g, NBI_COLL_ALL_TO_ALL, bytes);
  }
  nb_tensor **fetched; /* blocks of other processes (NULL: none) */
  bool ok = fetch(fn, &g, phys, NULL, &phys, &fetched) == NB_OK;
  nb_tensor **pieces = malloc((size_t)g.n * sizeof *pieces);
  if (!pieces) ok = nbi_error(NB_ERR_OOM, "%s: out of memory", fn) == NB_OK;
  for (int gi = 0; gi < g.n_groups && ok; gi++) {
    if (g.same_as[gi] != gi) continue;
    for (int r = 0; r < g.n && ok; r++) {
      for (int s = 0; s < g.n && ok; s++)
        ok = (pieces[s] = nbi_place(m, g.member[gi * g.n + r],
                                    nbi_coll_chunk_of(at(&g, phys, gi, s), sa, g.n, r))) != NULL;
      nb_tensor *y = !ok ? NULL : g.n == 1 ? pieces[0] : nb_concat(pieces, g.n, ca);
      ok = y != NULL;
      out[g.member[gi * g.n + r]] = y;
    }
  }
  free(pieces);
  if (ok) copy_shared(&g, out);
  free(fetched);
  return finish(fn, m->n_dev, out, ok, &g, NBI_COLL_ALL_TO_ALL, bytes);
}

nb_status nbi_coll_ppermute(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                            const nbi_axis *axes, int n_axes, const int (*pairs)[2], int n_pairs,
                            nb_tensor **out) {
  groups g;
  nb_status st = make_groups(fn, m, phys, axes, n_axes, out, &g);
  if (st) return st;
  int *src_of = NULL; /* [n]: the rank each rank receives from, or -1 */
  if (n_pairs < 0 || (n_pairs > 0 && !pairs))
    st = nbi_error(n_pairs < 0 ? NB_ERR_ARG : NB_ERR_NULL, "%s: %d pairs%s", fn, n_pairs,
                   n_pairs > 0 ? " but pairs is NULL" : "");
  else if (!(src_of = malloc((size_t)g.n * sizeof *src_of)))
    st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int r = 0; !st && r < g.n; r++)
    src_of[r] = -1;
  for (int k = 0; k < n_pairs && !st; k++) {
    int s = pairs[k][0], t = pairs[k][1];
    if (s < 0 || s >= g.n || t < 0 || t >= g.n)
      st = nbi_error(NB_ERR_INDEX, "%s: pair %d (%d, %d) is out of range for groups of %d", fn, k,
                     s, t, g.n);
    else if (src_of[t] >= 0)
      st = nbi_error(NB_ERR_ARG, "%s: rank %d is the destination of two pairs", fn, t);
    else
      src_of[t] = s;
  }
  uint64_t bytes = 0;
  for (int gi = 0; gi < g.n_groups && !st; gi++)
    for (int r = 0; r < g.n; r++)
      if (src_of[r] >= 0 && src_of[r] != r) bytes += bytes_of(at(&g, phys, gi, src_of[r]), g.elt);
  if (st) {
    free(src_of);
    groups_free(&g);
    return st;
  }
  nb_scope_begin();
  nbi_dgroups dg;
  bool once = true; /* no rank is the source of two (the MPI path sends one block) */
  for (int r = 0; r < g.n && once; r++)
    for (int q = 0; q < r && once; q++)
      once = src_of[r] < 0 || src_of[r] != src_of[q];
  if (once && native(&g, false, 0, &dg)) {
    bool done = nbi_dist_ppermute(fn, &dg, phys, src_of, out) == NB_OK;
    free(src_of);
    return finish(fn, m->n_dev, out, done, &g, NBI_COLL_PERMUTE, bytes);
  }
  nb_tensor **fetched; /* blocks of other processes (NULL: none) */
  bool ok = fetch(fn, &g, phys, src_of, &phys, &fetched) == NB_OK;
  /* Devices no pair names get zeros of their own block's shape: one object
   * per distinct shape. */
  nb_tensor **zeros = malloc((size_t)m->n_dev * sizeof *zeros);
  int n_zeros = 0;
  if (!zeros) ok = nbi_error(NB_ERR_OOM, "%s: out of memory", fn) == NB_OK;
  for (int gi = 0; gi < g.n_groups && ok; gi++) {
    if (g.same_as[gi] != gi) continue;
    for (int r = 0; r < g.n && ok; r++) {
      nb_tensor *y = NULL;
      if (src_of[r] >= 0) {
        y = at(&g, phys, gi, src_of[r]);
      } else {
        const nb_shape *s = &at(&g, phys, gi, r)->shape;
        for (int z = 0; z < n_zeros && !y; z++)
          if (nbi_shape_eq(&zeros[z]->shape, s)) y = zeros[z];
        if (!y && (y = nbi_zeros_of(s, g.dtype))) zeros[n_zeros++] = y;
      }
      ok = y != NULL;
      out[g.member[gi * g.n + r]] = y;
    }
  }
  free(zeros);
  free(src_of);
  if (ok) copy_shared(&g, out);
  free(fetched);
  return finish(fn, m->n_dev, out, ok, &g, NBI_COLL_PERMUTE, bytes);
}

nb_status nbi_local_slice(const char *fn, const nb_mesh *m, nb_tensor *const *phys,
                          const nbi_axis *axes, int n_axes, int dim, nb_tensor **out) {
  groups g;
  nb_status st = make_groups(fn, m, phys, axes, n_axes, out, &g);
  int a = 0;
  if (st) return st;
  st = norm_dim(fn, m, phys, dim, &a);
  if (st) {
    groups_free(&g);
    return st;
  }
  nb_scope_begin();
  bool ok = true;
  for (int gi = 0; gi < g.n_groups && ok; gi++) {
    if (g.same_as[gi] != gi) continue;
    for (int r = 0; r < g.n && ok; r++) {
      nb_tensor *y = nbi_coll_chunk_of(at(&g, phys, gi, r), a, g.n, r);
      ok = y != NULL;
      out[g.member[gi * g.n + r]] = y;
    }
  }
  if (ok) copy_shared(&g, out);
  return finish(fn, m->n_dev, out, ok, &g, -1, 0);
}
