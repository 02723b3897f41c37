/* src/sharding/shard.c — sharded tensors: placing (nb_shard), resharding
 * (nb_reshard and the planner every op uses), per-op dispatch (the record
 * hook: propagation, then one node per device), reading (the gather hook).
 *
 * Physical arrays (nb_tensor *phys[n_dev]) built here hold borrowed handles
 * registered in the current scope; a logical tensor made from one retains
 * each entry. Devices whose blocks are equal share one tensor object: a
 * replicated value is one tensor (autodiff then sums its cotangents once,
 * and a replicated computation is recorded once). */
#include "sharding.h"
#include "../core/oprules.h"

#include <stdio.h>
#include <stdlib.h>

/* The sharding a logical tensor owns, with its canonical text. */
typedef struct sharding_box {
  nbi_sharding s;
  char text[512];
} sharding_box;

static const nbi_sharding *sharding_of(const nb_tensor *t) {
  return (const nbi_sharding *)t->sharding;
}

const nbi_sharding *nbi_sharding_of(const nb_tensor *t) { return sharding_of(t); }

static void hook_release(nb_tensor *t) { free(t->sharding); }
static void hook_mesh_release(nb_mesh *m) { nb_mesh_release(m); }
static nb_tensor *hook_record(int op, nb_dtype dt, const nb_shape *shape, nb_tensor *const *in,
                              int n_in, const nbi_attrs *attrs);
static nb_tensor *hook_gather(const char *fn, nb_tensor *t);

__attribute__((constructor)) static void install_hooks(void) {
  nbi_shard_hook = (nbi_shard_hooks){.record = hook_record,
                                     .gather = hook_gather,
                                     .release = hook_release,
                                     .mesh_release = hook_mesh_release,
                                     .apply_program = nbi_sharded_apply_program};
}

/* Graph mode (gprop.c) sets this around the record of a program node: the
 * sharding it chose for the node's result, which the record hook passes to
 * propagation as the result's constraint. The hook takes it (clears it) on
 * entry, so nothing it records itself sees it. */
_Thread_local const nbi_sharding *nbi_shard_record_out;

/* A logical tensor on m with sharding s over phys (each entry retained). */
nb_tensor *nbi_sharded_make(const char *fn, nb_mesh *m, const nbi_sharding *s,
                            const nb_shape *shape, nb_dtype dt, nb_tensor *const *phys) {
  sharding_box *b = malloc(sizeof *b);
  if (!b) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  b->s = *s;
  nbi_sharding_format(m, s, b->text, sizeof b->text);
  nb_tensor *t =
      nbi_sharded_new(shape, dt, nb_mesh_retain(m), (struct nbi_sharding *)b, phys, m->n_dev);
  if (!t) {
    nb_mesh_release(m);
    free(b);
    return NULL;
  }
  /* provenance (nb_backward) is the physical graph's; the logical tensor
   * says whether it has any, so nb_requires_grad and nb_backward see it */
  for (int d = 0; d < m->n_dev; d++) {
    nb_retain(phys[d]);
    if ((phys[d]->flags & (NBI_T_REQUIRES_GRAD | NBI_T_GRAD_PATH)) && !nbi_no_grad)
      t->flags |= NBI_T_GRAD_PATH;
  }
  return t;
}

/* ---- blocks ---------------------------------------------------------------------
 * Device d's block of a logical tensor under sharding s: start[] and the local
 * shape. cut() takes from src (device d's current block, starting at from[])
 * the part that is its block under s. */
static nb_tensor *cut(nb_tensor *src, const int64_t *from, const nb_shape *sh,
                      const int64_t *start) {
  int nd = sh->ndim;
  int64_t a[NB_MAX_DIMS], b[NB_MAX_DIMS], one[NB_MAX_DIMS];
  bool whole = true;
  for (int k = 0; k < nd; k++) {
    a[k] = start[k] - from[k];
    b[k] = a[k] + sh->dims[k];
    one[k] = 1;
    whole = whole && a[k] == 0 && sh->dims[k] == src->shape.dims[k];
  }
  return whole ? src : nb_slice(src, a, b, one);
}

/* Whether device d's block under `to` lies inside its block under `from`
 * along dimension k. */
static bool block_inside(const nb_mesh *m, const nbi_sharding *from, const nbi_sharding *to,
                         const nb_shape *shape, int d, int k) {
  nb_shape fs, ts;
  int64_t f0[NB_MAX_DIMS], t0[NB_MAX_DIMS];
  nbi_local_block(m, from, shape, d, &fs, f0);
  nbi_local_block(m, to, shape, d, &ts, t0);
  return ts.dims[k] == 0 || (t0[k] >= f0[k] && t0[k] + ts.dims[k] <= f0[k] + fs.dims[k]);
}

/* out[d] = device d's block under `to` cut from in[d] (its block under
 * `from`, which must contain it). Equal cuts of one object are shared. */
static nb_status cut_all(const nb_mesh *m, const nbi_sharding *from, const nbi_sharding *to,
                         const nb_shape *shape, nb_tensor *const *in, nb_tensor **out) {
  for (int d = 0; d < m->n_dev; d++) {
    nb_shape fs, ts;
    int64_t f0[NB_MAX_DIMS], t0[NB_MAX_DIMS];
    nbi_local_block(m, from, shape, d, &fs, f0);
    nbi_local_block(m, to, shape, d, &ts, t0);
    out[d] = NULL;
    if (!nbi_mesh_local(m, d)) { /* another process's block: none here */
      if (!(out[d] = nbi_remote_block(m, d, &ts, in[d]->dtype))) return nb_last_status();
      continue;
    }
    for (int e = 0; e < d && !out[d]; e++) {
      nb_shape es;
      int64_t e0[NB_MAX_DIMS];
      nbi_local_block(m, to, shape, e, &es, e0);
      if (in[e] == in[d] && nbi_mesh_local(m, e) && nbi_shape_eq(&es, &ts) &&
          !memcmp(e0, t0, sizeof(int64_t) * (size_t)shape->ndim))
        out[d] = out[e];
    }
    if (!out[d] && !(out[d] = cut(in[d], f0, &ts, t0))) return nb_last_status();
  }
  return nbi_place_all(m, out);
}

/* ---- resharding ------------------------------------------------------------------ */
static bool has_axis(const nbi_axis *list, int n, const nbi_axis *a) {
  for (int i = 0; i < n; i++)
    if (nbi_axis_eq(&list[i], a)) return true;
  return false;
}

/* Whether some dimension of s uses axis x (or a part overlapping it). */
static bool uses_axis(const nbi_sharding *s, const nbi_axis *x) {
  for (int k = 0; k < s->ndim; k++)
    for (int i = 0; i < s->dim[k].n; i++)
      if (nbi_axis_overlap(&s->dim[k].ax[i], x)) return true;
  return false;
}

/* Whether d's axes are p's followed by extra (n_extra of them, 0 or 1). */
static bool is_prefix_plus(const nbi_dim_sharding *p, const nbi_dim_sharding *d,
                           const nbi_axis *extra) {
  if (d->n != p->n + (extra ? 1 : 0)) return false;
  for (int i = 0; i < p->n; i++)
    if (!nbi_axis_eq(&p->ax[i], &d->ax[i])) return false;
  return !extra || nbi_axis_eq(&d->ax[p->n], extra);
}

/* An all-to-all applies: cur's dim i ends with an axis that `to` puts at
 * the end of dim j instead, both dims otherwise as `to` has them, and both
 * sizes divide by their shards (so blocks nest). */
static bool moves_to(const nbi_sharding *cur, const nbi_sharding *to, const nb_shape *shape, int i,
                     int j) {
  const nbi_dim_sharding *ci = &cur->dim[i], *cj = &cur->dim[j];
  if (ci->n == 0) return false;
  const nbi_axis *ax = &ci->ax[ci->n - 1];
  nbi_dim_sharding pi = *ci;
  pi.n--;
  return is_prefix_plus(&pi, &to->dim[i], NULL) && is_prefix_plus(cj, &to->dim[j], ax) &&
         shape->dims[i] % nbi_dim_shards(cur, i) == 0 &&
         shape->dims[j] % nbi_dim_shards(to, j) == 0;
}

/* A permute applies on dim k: cur's dim ends with axis a, `to`'s with b of
 * the same size, the rest equal, a unused by `to` and b by cur, sizes
 * dividing. pair = {a, b}. */
static bool swaps(const nb_mesh *m, const nbi_sharding *cur, const nbi_sharding *to,
                  const nb_shape *shape, int k, nbi_axis *pair) {
  (void)m;
  const nbi_dim_sharding *c = &cur->dim[k], *t = &to->dim[k];
  if (c->n == 0 || c->n != t->n) return false;
  pair[0] = c->ax[c->n - 1];
  pair[1] = t->ax[t->n - 1];
  if (pair[0].size != pair[1].size || nbi_axis_overlap(&pair[0], &pair[1])) return false;
  for (int i = 0; i + 1 < c->n; i++)
    if (!nbi_axis_eq(&c->ax[i], &t->ax[i])) return false;
  return !uses_axis(to, &pair[0]) && !uses_axis(cur, &pair[1]) &&
         shape->dims[k] % nbi_dim_shards(cur, k) == 0;
}

/* Moves phys (a logical tensor of shape `shape` under *cur) to `to`: pending
 * partial sums that `to` does not keep are reduced (a reduce-scatter when
 * `to` shards a dimension over the axis next, else one all-reduce over all
 * such axes), every dimension keeps the common prefix of its axes and
 * gathers the rest (all-gather; everything when the sizes do not divide),
 * then each device cuts its block (no communication). Before the gathers,
 * an axis moving between the ends of two dimensions is an all-to-all, and
 * the last axis of a dimension replaced by another of equal size a permute
 * (sizes dividing). */
static nb_status reshard_phys(const char *fn, const nb_mesh *m, nbi_sharding cur,
                              const nbi_sharding *to, const nb_shape *shape, nb_tensor *const *phys,
                              nb_tensor **out) {
  int n = m->n_dev;
  nb_tensor **a = malloc(sizeof *a * (size_t)n), **b = malloc(sizeof *b * (size_t)n);
  nb_status st = a && b ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  if (!st) memcpy(a, phys, sizeof *a * (size_t)n);
  /* 1. partial sums `to` does not keep: a reduce-scatter for an axis `to`
   *    shards a dimension over next, one all-reduce over all the others */
  nbi_axis red[NBI_MESH_MAX_AXES];
  int n_red = 0;
  for (int i = 0; i < cur.n_partial && !st;) {
    nbi_axis ax = cur.partial[i];
    if (has_axis(to->partial, to->n_partial, &ax)) {
      i++;
      continue;
    }
    int rs_dim = -1; /* the dim `to` shards over ax right after cur's axes */
    for (int k = 0; k < cur.ndim && rs_dim < 0; k++) {
      const nbi_dim_sharding *c = &cur.dim[k], *t = &to->dim[k];
      bool prefix = t->n == c->n + 1 && nbi_axis_eq(&t->ax[c->n], &ax);
      for (int j = 0; j < c->n && prefix; j++)
        prefix = nbi_axis_eq(&c->ax[j], &t->ax[j]);
      if (prefix && shape->dims[k] % (nbi_dim_shards(to, k)) == 0) rs_dim = k;
    }
    if (rs_dim >= 0) {
      st = nbi_coll_reduce_scatter(fn, m, a, &ax, 1, rs_dim, b);
      if (st) break;
      cur.dim[rs_dim].ax[cur.dim[rs_dim].n++] = ax;
      memcpy(a, b, sizeof *a * (size_t)n);
    } else {
      red[n_red++] = ax;
    }
    cur.partial[i] = cur.partial[--cur.n_partial];
  }
  if (n_red && !st) {
    st = nbi_coll_all_reduce(fn, m, a, red, n_red, NB_REDUCE_SUM, b);
    if (!st) memcpy(a, b, sizeof *a * (size_t)n);
  }
  /* 2a. an axis moving from the end of one dimension to the end of another
   *     (the rest of both already as `to` wants, sizes dividing): all-to-all */
  for (int i = 0; i < cur.ndim && !st; i++)
    for (int j = 0; j < cur.ndim && !st; j++)
      if (i != j && moves_to(&cur, to, shape, i, j)) {
        nbi_axis ax = cur.dim[i].ax[cur.dim[i].n - 1];
        st = nbi_coll_all_to_all(fn, m, a, &ax, 1, j, i, b);
        if (st) break;
        memcpy(a, b, sizeof *a * (size_t)n);
        cur.dim[i].n--;
        cur.dim[j].ax[cur.dim[j].n++] = ax;
      }
  /* 2b. the last axis of a dimension replaced by another of its size that
   *     neither uses elsewhere: a permute (devices swap their coordinates) */
  for (int k = 0; k < cur.ndim && !st; k++) {
    nbi_axis pair[2];
    if (!swaps(m, &cur, to, shape, k, pair)) continue;
    int64_t sz = pair[0].size, np = sz * sz;
    int(*pairs)[2] = malloc(sizeof *pairs * (size_t)np);
    if (!pairs) {
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
      break;
    }
    /* ranks over (old, new): the device at (i, j) needs block j, which the
     * device at (j, i) holds */
    for (int64_t i = 0; i < sz; i++)
      for (int64_t j = 0; j < sz; j++)
        pairs[i * sz + j][0] = (int)(j * sz + i), pairs[i * sz + j][1] = (int)(i * sz + j);
    st = nbi_coll_ppermute(fn, m, a, pair, 2, (const int(*)[2])pairs, (int)np, b);
    free(pairs);
    if (st) break;
    memcpy(a, b, sizeof *a * (size_t)n);
    cur.dim[k].ax[cur.dim[k].n - 1] = pair[1];
  }
  /* 2. per dimension: gather what is not a prefix of the target (or does not
   *    contain the target blocks: non-divisible sizes) */
  for (int k = 0; k < cur.ndim && !st; k++) {
    nbi_dim_sharding *c = &cur.dim[k];
    const nbi_dim_sharding *t = &to->dim[k];
    int p = 0;
    while (p < c->n && p < t->n && nbi_axis_eq(&c->ax[p], &t->ax[p]))
      p++;
    if (p == c->n) {
      bool inside = true;
      for (int d = 0; d < n && inside; d++)
        inside = block_inside(m, &cur, to, shape, d, k);
      if (inside) continue;
      p = 0;
    }
    /* gathering only the suffix leaves the prefix's blocks when the ceil
     * chunks nest (the dimension divides by all its shards); else gather all */
    if (p > 0 && shape->dims[k] % nbi_dim_shards(&cur, k) != 0) p = 0;
    st = nbi_coll_all_gather(fn, m, a, c->ax + p, c->n - p, k, b);
    if (st) break;
    memcpy(a, b, sizeof *a * (size_t)n);
    c->n = p;
  }
  /* 3. cut the target blocks; a partial axis `to` adds: rank 0 keeps the value */
  if (!st) st = cut_all(m, &cur, to, shape, a, out);
  for (int i = 0; i < to->n_partial && !st; i++) {
    if (has_axis(cur.partial, cur.n_partial, &to->partial[i])) continue;
    for (int d = 0; d < n && !st; d++)
      if (nbi_axis_coord(m, &to->partial[i], d) != 0 && nbi_mesh_local(m, d) &&
          !(out[d] = nbi_full_on(m->dev_table[d], &out[d]->shape, 0, out[d]->dtype)))
        st = nb_last_status();
  }
  free(a);
  free(b);
  return st;
}

/* ---- placing ------------------------------------------------------------------------ */
/* t's phys on m under a replicated layout (every device holds t itself). */
static nb_tensor **replicated_phys(const nb_mesh *m, nb_tensor *t) {
  nb_tensor **p = malloc(sizeof *p * (size_t)m->n_dev);
  for (int d = 0; p && d < m->n_dev; d++)
    p[d] = t;
  return p;
}

/* phys of a plain tensor t placed with s: each device's block sliced from t;
 * for partial axes the rank-0 device of each group holds it, others zeros. */
static nb_status place(const char *fn, const nb_mesh *m, const nbi_sharding *s, nb_tensor *t,
                       nb_tensor **out) {
  nbi_sharding repl = nbi_sharding_replicated(t->shape.ndim);
  nb_tensor **same = replicated_phys(m, t);
  if (!same) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  nbi_sharding full = *s;
  full.n_partial = 0;
  nb_status st = cut_all(m, &repl, &full, &t->shape, same, out);
  free(same);
  /* a device whose block is all of t holds a view of it, not t itself: t
   * stays the caller's (nb_assign may rebind it; the placed value may not
   * change) */
  nb_tensor *whole = NULL;
  for (int d = 0; d < m->n_dev && !st; d++) {
    if (out[d] != t) continue;
    if (!whole && !(whole = nb_reshape(t, t->shape))) st = nb_last_status();
    out[d] = whole;
  }
  for (int d = 0; d < m->n_dev && !st; d++) {
    bool first = true; /* rank 0 on every partial axis */
    for (int i = 0; i < s->n_partial; i++)
      first = first && nbi_axis_coord(m, &s->partial[i], d) == 0;
    if (!first && nbi_mesh_local(m, d) &&
        !(out[d] = nbi_full_on(m->dev_table[d], &out[d]->shape, 0, t->dtype)))
      st = nb_last_status();
  }
  return st;
}

nb_mesh *nb_mesh_of(const nb_tensor *t) { return t ? t->mesh : NULL; }

const char *nb_sharding_str(const nb_tensor *t) {
  return t && t->sharding ? ((const sharding_box *)t->sharding)->text : "";
}

nb_tensor *nbi_shard_to(const char *fn, nb_tensor *t, nb_mesh *m, const nbi_sharding *s) {
  if (t->mesh && t->mesh != m && !(t = hook_gather(fn, t))) return NULL; /* through one tensor */
  nb_tensor **out = malloc(sizeof *out * (size_t)m->n_dev);
  if (!out) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  nb_status st;
  if (t->mesh == m)
    st = reshard_phys(fn, m, *sharding_of(t), s, &t->shape, t->phys, out);
  else
    st = place(fn, m, s, t, out);
  nb_tensor *r = st ? NULL : nbi_sharded_make(fn, m, s, &t->shape, t->dtype, out);
  free(out);
  return r;
}

nb_tensor *nb_shard(nb_tensor *t, nb_mesh *m, const char *spec) {
  static const char *FN = "nb_shard";
  if (!t || !m || !spec) {
    nbi_error(NB_ERR_NULL, "%s: %s is NULL", FN, !t ? "t" : !m ? "mesh" : "spec");
    return NULL;
  }
  nbi_sharding s;
  if (nbi_sharding_parse(FN, m, spec, t->shape.ndim, false, &s)) return NULL;
  if (t->flags & NBI_T_TRACED) return nbi_shard_constraint(FN, t, m, &s);
  return nbi_shard_to(FN, t, m, &s);
}

nb_tensor *nb_reshard(nb_tensor *t, const char *spec) {
  static const char *FN = "nb_reshard";
  if (!t || !spec) {
    nbi_error(NB_ERR_NULL, "%s: %s is NULL", FN, !t ? "t" : "spec");
    return NULL;
  }
  /* a traced value: a constraint on the mesh of the sharded call being traced */
  nb_mesh *m = t->mesh ? t->mesh : (t->flags & NBI_T_TRACED) ? nbi_trace_mesh() : NULL;
  if (!m) {
    nbi_error(NB_ERR_SHARDING, "%s: the tensor is on no mesh (use nb_shard)", FN);
    return NULL;
  }
  nbi_sharding s;
  if (nbi_sharding_parse(FN, m, spec, t->shape.ndim, false, &s)) return NULL;
  if (t->flags & NBI_T_TRACED) return nbi_shard_constraint(FN, t, m, &s);
  return nbi_shard_to(FN, t, m, &s);
}

/* ---- assignment -------------------------------------------------------------------------- */
nb_status nbi_sharded_assign(nb_tensor *dst, nb_tensor *val) {
  static const char *FN = "nb_assign";
  nb_mesh *m = dst->mesh;
  if (val->mesh && val->mesh != m)
    return nbi_error(NB_ERR_SHARDING, "%s: src is on mesh %s but dst on %s", FN,
                     nb_mesh_str(val->mesh), nb_mesh_str(m));
  nb_scope_begin();
  /* dst keeps its layout: src moved onto it, computed now (a training loop
   * must not grow a chain of pending steps) */
  nb_tensor *v = nbi_shard_to(FN, val, m, sharding_of(dst));
  nb_status st = v ? nbi_realize(&v, 1) : nb_last_status();
  if (!st && (dst->flags & NBI_T_REQUIRES_GRAD)) {
    /* a trainable leaf keeps its physical objects (they carry requires-grad
     * and their .grad): each distinct one takes its device's new block */
    for (int d = 0; d < m->n_dev && !st; d++) {
      bool seen = false;
      for (int e = 0; e < d && !seen; e++)
        seen = dst->phys[e] == dst->phys[d];
      if (!seen && nbi_mesh_local(m, d)) st = nbi_assign_rebind(dst->phys[d], v->phys[d]);
    }
  } else if (!st) {
    for (int d = 0; d < m->n_dev; d++) {
      nb_retain(v->phys[d]);
      nb_release(dst->phys[d]);
      dst->phys[d] = v->phys[d];
    }
  }
  nb_scope_end();
  return st;
}

/* ---- reading ---------------------------------------------------------------------------- */
static nb_tensor *hook_gather(const char *fn, nb_tensor *t) {
  const nb_mesh *m = t->mesh;
  nbi_sharding repl = nbi_sharding_replicated(t->shape.ndim);
  nb_tensor **out = malloc(sizeof *out * (size_t)m->n_dev);
  if (!out) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  nb_status st = reshard_phys(fn, m, *sharding_of(t), &repl, &t->shape, t->phys, out);
  nb_tensor *r = st ? NULL : out[nbi_mesh_first_local(m)];
  free(out);
  return r;
}

/* ---- ops on sharded tensors --------------------------------------------------------------- */
static nb_tensor *hook_record(int op, nb_dtype dt, const nb_shape *shape, nb_tensor *const *in,
                              int n_in, const nbi_attrs *attrs) {
  const nbi_sharding *want = nbi_shard_record_out;
  nbi_shard_record_out = NULL;
  if (want && want->ndim != shape->ndim) want = NULL;
  char fn[64];
  snprintf(fn, sizeof fn, "nb_%s", nbi_op_table[op]->name);
  nb_mesh *m = NULL;
  for (int k = 0; k < n_in; k++) {
    if (!in[k]->mesh) continue;
    if (m && in[k]->mesh != m) {
      nbi_error(NB_ERR_SHARDING, "%s: inputs on different meshes (%s and %s)", fn, nb_mesh_str(m),
                nb_mesh_str(in[k]->mesh));
      return NULL;
    }
    m = in[k]->mesh;
  }
  int n = m->n_dev;
  nbi_attrs a = attrs ? *attrs : (nbi_attrs){0};
  nbi_shard_rule *rule = malloc(sizeof *rule);
  nbi_sharding *target = malloc(sizeof *target * (size_t)(n_in ? n_in : 1)), out_s;
  const nbi_sharding **from = malloc(sizeof *from * (size_t)(n_in ? n_in : 1));
  nb_shape *shapes = malloc(sizeof *shapes * (size_t)(n_in ? n_in : 1));
  nb_tensor **phys = malloc(sizeof *phys * (size_t)n * (size_t)(n_in + 1)), **ins = NULL;
  nb_tensor *r = NULL;
  nb_status st = rule && target && from && shapes && phys
                     ? NB_OK
                     : nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int k = 0; k < n_in && !st; k++) {
    from[k] = in[k]->mesh ? sharding_of(in[k]) : NULL;
    shapes[k] = in[k]->shape;
  }
  nb_status before = nb_last_status();
  if (!st && nbi_shard_rule_of(op, &a, shapes, n_in, shape, rule) != NB_OK) {
    /* no rule can describe it (too many operands): everything replicated */
    if (!before) nb_clear_error();
    for (int k = 0; k < n_in; k++)
      target[k] = nbi_sharding_replicated(shapes[k].ndim);
    out_s = nbi_sharding_replicated(shape->ndim);
  } else if (!st) {
    st = nbi_propagate(fn, m, rule, from, shapes, want, target, &out_s);
  }
  /* operands to their targets: phys + k n .. */
  for (int k = 0; k < n_in && !st; k++) {
    nb_tensor **pk = phys + (size_t)k * (size_t)n, **src = NULL;
    nbi_sharding cur = from[k] ? *from[k] : nbi_sharding_replicated(shapes[k].ndim);
    if (!from[k] && !(src = replicated_phys(m, in[k])))
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    if (!st) st = reshard_phys(fn, m, cur, &target[k], &shapes[k], from[k] ? in[k]->phys : src, pk);
    free(src);
  }
  /* one node per device on its blocks; devices with the same inputs share it */
  nb_tensor **res = phys + (size_t)n_in * (size_t)n;
  if (!st && !(ins = malloc(sizeof *ins * (size_t)(n_in ? n_in : 1))))
    st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int d = 0; d < n && !st; d++) {
    nb_shape local;
    int64_t start[NB_MAX_DIMS];
    nbi_local_block(m, &out_s, shape, d, &local, start);
    res[d] = NULL;
    if (!nbi_mesh_local(m, d)) { /* another process computes it */
      if (!(res[d] = nbi_remote_block(m, d, &local, dt))) st = nb_last_status();
      continue;
    }
    for (int e = 0; e < d && !res[d]; e++) {
      bool same = nbi_mesh_local(m, e) && nbi_shape_eq(&res[e]->shape, &local);
      for (int k = 0; k < n_in && same; k++)
        same = phys[(size_t)k * (size_t)n + (size_t)e] == phys[(size_t)k * (size_t)n + (size_t)d];
      if (same) res[d] = res[e];
    }
    if (res[d]) continue;
    for (int k = 0; k < n_in; k++)
      ins[k] = phys[(size_t)k * (size_t)n + (size_t)d];
    if (!(res[d] = nbi_record(op, dt, &local, ins, n_in, &a))) st = nb_last_status();
  }
  if (!st) r = nbi_sharded_make(fn, m, &out_s, shape, dt, res);
  free(ins);
  free(rule);
  free(target);
  free(from);
  free(shapes);
  free(phys);
  return r;
}
