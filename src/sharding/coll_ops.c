/* src/sharding/coll_ops.c — collectives of nb_shard_map bodies as ops
 * (contract: include/nabla/sharding.h "Collectives"; their rows are in
 * src/ops/collective.def, the one op list; the records nbi_opdef_ALL_REDUCE
 * ... live here, linked by name from src/ops/registry.c).
 *
 * They sit in the sharding layer, not in src/ops: their public functions
 * parse axes against the mesh of the body being traced (smap.c) and the
 * interpreter's glue (nbi_coll_run) runs them as the collectives of
 * collectives.c, so ops would otherwise depend on sharding and back.
 *
 * A collective is recorded only while a shard_map body (or a transform of
 * one) is traced, i.e. while nbi_smap_mesh() names the body's mesh; the group
 * axes are checked against that mesh. The nodes never run as kernels: the
 * per-device interpreter (src/sharding/smap.c, nbi_smap_exec) runs them as
 * nbi_coll_* collectives across the devices' values. A realization that
 * reaches one (a body's collective inside a checkpoint or a control-flow body,
 * run by a nested realization) fails with NB_ERR_SHARDING. Every result is a
 * symbolic (traced) value: a device's value exists only in the interpreter.
 *
 * Attributes (every collective op):
 *   i[0], i[1]  PPERMUTE: its payload's hash (the pairs); 0 otherwise
 *   i[2]        number of group axes n (1 .. NBI_MESH_MAX_AXES)
 *   i[3 .. 3+n) the group's mesh axis indices, major first (whole axes)
 *   i[11]       the group size (product of the axes' sizes)
 *   i[12]       ALL_REDUCE: the reduction (NB_REDUCE_*);
 *               ALL_GATHER, REDUCE_SCATTER: the dimension (normalized);
 *               ALL_TO_ALL: the split dimension (normalized);
 *               PPERMUTE: the number of pairs
 *   i[13]       ALL_TO_ALL: the concat dimension (normalized)
 * PPERMUTE's payload (coll_pairs) holds the (source, destination) rank pairs.
 *
 * Rules are written with the same collectives, so they nest (second order,
 * vmap of grad): all_reduce SUM/MEAN -> itself; MAX/MIN -> the cotangent
 * summed over the group, given to the members that hold the extremum (ties
 * split evenly); all_gather <-> reduce_scatter; all_to_all(s, c) ->
 * all_to_all(c, s); ppermute -> ppermute of the inverted pairs; axis_index is
 * integer and non-differentiable. Batching: the batch is dim 0, so dims shift
 * by one; the collectives act on every example at once. */
#include <stdlib.h>

#include "sharding.h"
#include "../core/oprules.h"

#include "../ops/rule_util.h"

enum {
  A_N_AXES = 2,
  A_AXES = 3,
  A_GROUP = 11,
  A_ARG0 = 12, /* op / dim / split dim / number of pairs */
  A_ARG1 = 13, /* concat dim */
};

typedef struct coll_pairs {
  nbi_payload base;
  int n_pairs;
  int pairs[][2];
} coll_pairs;

static void pairs_destroy(nbi_payload *p) { free(p); }

/* The public function of a collective op. */
static const char *coll_name(int op) {
  switch (op) {
  case NBI_OP_ALL_REDUCE: return "nb_all_reduce";
  case NBI_OP_ALL_GATHER: return "nb_all_gather";
  case NBI_OP_REDUCE_SCATTER: return "nb_reduce_scatter";
  case NBI_OP_ALL_TO_ALL: return "nb_all_to_all";
  case NBI_OP_PPERMUTE: return "nb_ppermute";
  case NBI_OP_AXIS_INDEX: return "nb_axis_index";
  default: return NULL;
  }
}

/* ---- axes ------------------------------------------------------------------------ */

static bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* "tp", "dp,tp", "(dp, tp)" -> mesh axis indices (major first); count or -1. */
static int parse_axes(const char *fn, const nb_mesh *m, const char *text, int *ax) {
  if (!text) {
    nbi_error(NB_ERR_NULL, "%s: axes is NULL", fn);
    return -1;
  }
  const char *p = text, *end = text + strlen(text);
  while (p < end && (*p == ' ' || *p == '\t'))
    p++;
  while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
    end--;
  if (p < end && *p == '(') {
    if (end[-1] != ')') {
      nbi_error(NB_ERR_SHARDING, "%s: axes \"%s\": '(' without a closing ')'", fn, text);
      return -1;
    }
    p++, end--;
  }
  int n = 0;
  for (;;) {
    while (p < end && (*p == ' ' || *p == '\t'))
      p++;
    const char *s = p;
    while (p < end && name_char(*p))
      p++;
    if (p == s) {
      nbi_error(NB_ERR_SHARDING, "%s: axes \"%s\": expected an axis name at offset %d", fn, text,
                (int)(s - text));
      return -1;
    }
    int a = nbi_mesh_axis(m, s, (size_t)(p - s));
    if (a < 0) {
      nbi_error(NB_ERR_SHARDING, "%s: axes \"%s\": mesh %s has no axis \"%.*s\"", fn, text, m->text,
                (int)(p - s), s);
      return -1;
    }
    for (int k = 0; k < n; k++)
      if (ax[k] == a) {
        nbi_error(NB_ERR_SHARDING, "%s: axes \"%s\": axis \"%s\" is named twice", fn, text,
                  m->name[a]);
        return -1;
      }
    ax[n++] = a; /* at most n_axes distinct names */
    while (p < end && (*p == ' ' || *p == '\t'))
      p++;
    if (p == end) return n;
    if (*p != ',') {
      nbi_error(NB_ERR_SHARDING, "%s: axes \"%s\": unexpected '%c' at offset %d", fn, text, *p,
                (int)(p - text));
      return -1;
    }
    p++;
  }
}

/* The mesh of the body being traced, or an error naming fn. */
static nb_mesh *body_mesh(const char *fn) {
  nb_mesh *m = nbi_smap_mesh();
  if (!m) nbi_error(NB_ERR_SHARDING, "%s: collectives run only inside an nb_shard_map body", fn);
  return m;
}

/* ---- recording ------------------------------------------------------------------------ */

/* Records collective op on t (NULL for AXIS_INDEX) over the group of mesh axes
 * ax[0..n) of the body's mesh; arg0 / arg1 as the attribute slots (dims may
 * be negative), pairs for PPERMUTE. Validates everything, naming fn. */
static nb_tensor *coll_record(const char *fn, int op, nb_tensor *t, const int *ax, int n,
                              int64_t arg0, int64_t arg1, const int (*pairs)[2], int n_pairs) {
  nb_mesh *m = body_mesh(fn);
  if (!m) return NULL;
  if (op != NBI_OP_AXIS_INDEX && nbi_any_null(fn, &t, 1)) return NULL;
  if (t && t->mesh) {
    nbi_error(NB_ERR_SHARDING,
              "%s: t is a sharded tensor (a shard_map body works on its local blocks)", fn);
    return NULL;
  }
  if (n < 1 || n > m->n_axes) {
    nbi_error(NB_ERR_SHARDING, "%s: %d group axes on mesh %s", fn, n, m->text);
    return NULL;
  }
  nbi_attrs a = {0};
  int64_t g = 1;
  a.i[A_N_AXES] = n;
  for (int k = 0; k < n; k++) {
    if (ax[k] < 0 || ax[k] >= m->n_axes) {
      nbi_error(NB_ERR_SHARDING, "%s: axis index %d is not an axis of mesh %s", fn, ax[k], m->text);
      return NULL;
    }
    for (int j = 0; j < k; j++)
      if (ax[j] == ax[k]) {
        nbi_error(NB_ERR_SHARDING, "%s: axis \"%s\" is named twice", fn, m->name[ax[k]]);
        return NULL;
      }
    a.i[A_AXES + k] = ax[k];
    g *= m->size[ax[k]];
  }
  a.i[A_GROUP] = g;
  if (op == NBI_OP_AXIS_INDEX) {
    nb_shape s = {.ndim = 0};
    nb_tensor *y = nbi_record(op, NB_I32, &s, NULL, 0, &a);
    if (y) y->flags |= NBI_T_TRACED;
    return y;
  }
  nb_shape s = t->shape;
  char sh[160];
  nb_dtype dt = t->dtype;
  switch (op) {
  case NBI_OP_ALL_REDUCE:
    if (arg0 < NB_REDUCE_SUM || arg0 > NB_REDUCE_MEAN) {
      nbi_error(NB_ERR_ARG, "%s: unknown reduction %lld (NB_REDUCE_SUM, _MAX, _MIN or _MEAN)", fn,
                (long long)arg0);
      return NULL;
    }
    if (dt == NB_BOOL || (arg0 == NB_REDUCE_MEAN && !nb_dtype_is_float(dt))) {
      nbi_error(NB_ERR_DTYPE, "%s: %s of a %s tensor (needs a %s dtype)", fn,
                arg0 == NB_REDUCE_MEAN ? "mean" : "reduction", nb_dtype_name(dt),
                arg0 == NB_REDUCE_MEAN ? "floating" : "numeric");
      return NULL;
    }
    a.i[A_ARG0] = arg0;
    break;
  case NBI_OP_ALL_GATHER:
  case NBI_OP_REDUCE_SCATTER: {
    int d;
    if (nbi_norm_axis(fn, (int)arg0, s.ndim, &d)) return NULL;
    if (op == NBI_OP_REDUCE_SCATTER) {
      if (dt == NB_BOOL) {
        nbi_error(NB_ERR_DTYPE, "%s: sum of a bool tensor (needs a numeric dtype)", fn);
        return NULL;
      }
      if (s.dims[d] % g != 0) {
        nbi_error(NB_ERR_SHAPE, "%s: dim %d of shape %s does not divide into %lld chunks", fn, d,
                  nb_shape_str(s, sh, sizeof sh), (long long)g);
        return NULL;
      }
      s.dims[d] /= g;
    } else {
      s.dims[d] *= g;
    }
    a.i[A_ARG0] = d;
    break;
  }
  case NBI_OP_ALL_TO_ALL: {
    int sd, cd;
    if (nbi_norm_axis(fn, (int)arg0, s.ndim, &sd) || nbi_norm_axis(fn, (int)arg1, s.ndim, &cd))
      return NULL;
    if (s.dims[sd] % g != 0) {
      nbi_error(NB_ERR_SHAPE, "%s: split dim %d of shape %s does not divide into %lld chunks", fn,
                sd, nb_shape_str(s, sh, sizeof sh), (long long)g);
      return NULL;
    }
    s.dims[sd] /= g;
    s.dims[cd] *= g;
    a.i[A_ARG0] = sd;
    a.i[A_ARG1] = cd;
    break;
  }
  case NBI_OP_PPERMUTE: {
    if (n_pairs < 0 || (n_pairs > 0 && !pairs)) {
      nbi_error(n_pairs < 0 ? NB_ERR_ARG : NB_ERR_NULL, "%s: %d pairs%s", fn, n_pairs,
                n_pairs > 0 ? " but pairs is NULL" : "");
      return NULL;
    }
    if (n_pairs > g) {
      nbi_error(NB_ERR_ARG, "%s: %d pairs in a group of %lld ranks", fn, n_pairs, (long long)g);
      return NULL;
    }
    for (int k = 0; k < n_pairs; k++) {
      int src = pairs[k][0], dst = pairs[k][1];
      if (src < 0 || src >= g || dst < 0 || dst >= g) {
        nbi_error(NB_ERR_INDEX, "%s: pair %d (%d, %d) is out of range for a group of %lld", fn, k,
                  src, dst, (long long)g);
        return NULL;
      }
      for (int j = 0; j < k; j++)
        if (pairs[j][0] == src || pairs[j][1] == dst) {
          nbi_error(NB_ERR_ARG, "%s: rank %d is the %s of pairs %d and %d", fn,
                    pairs[j][0] == src ? src : dst, pairs[j][0] == src ? "source" : "destination",
                    j, k);
          return NULL;
        }
    }
    break;
  }
  default: nbi_error(NB_ERR_INTERNAL, "%s: op %d is not a collective", fn, op); return NULL;
  }
  if (nbi_check_shape(fn, &s)) return NULL;
  coll_pairs *pp = NULL;
  if (op == NBI_OP_PPERMUTE) {
    pp = malloc(sizeof *pp + sizeof pp->pairs[0] * (size_t)(n_pairs ? n_pairs : 1));
    if (!pp) {
      nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
      return NULL;
    }
    *pp = (coll_pairs){.base = {.refcount = 1, .destroy = pairs_destroy}, .n_pairs = n_pairs};
    uint64_t h1 = 0x5050524d55544531ull, h2 = 0x70706572ull;
    nbi_hash_mix(&h1, &h2, (uint64_t)n_pairs);
    for (int k = 0; k < n_pairs; k++) {
      pp->pairs[k][0] = pairs[k][0];
      pp->pairs[k][1] = pairs[k][1];
      nbi_hash_mix(&h1, &h2, (uint64_t)pairs[k][0] << 32 | (uint32_t)pairs[k][1]);
    }
    pp->base.h1 = h1, pp->base.h2 = h2;
    a.i[0] = (int64_t)h1, a.i[1] = (int64_t)h2;
    a.i[A_ARG0] = n_pairs;
  }
  nb_tensor *y = nbi_record(op, dt, &s, &t, 1, &a);
  if (y) {
    y->flags |= NBI_T_TRACED;
    if (pp) nbi_set_payload(y, &pp->base);
  }
  nbi_payload_release(pp ? &pp->base : NULL);
  return y;
}

/* ---- public functions ------------------------------------------------------------------- */

/* Parses axes against the body's mesh (first checking there is one). */
static int public_axes(const char *fn, const char *axes, int *ax) {
  nb_mesh *m = body_mesh(fn);
  return m ? parse_axes(fn, m, axes, ax) : -1;
}

nb_tensor *nb_all_reduce(nb_tensor *t, const char *axes, nb_reduce_op op) {
  int ax[NBI_MESH_MAX_AXES] = {0}, n = public_axes("nb_all_reduce", axes, ax);
  return n < 0 ? NULL : coll_record("nb_all_reduce", NBI_OP_ALL_REDUCE, t, ax, n, op, 0, NULL, 0);
}

nb_tensor *nb_all_gather(nb_tensor *t, const char *axes, int dim) {
  int ax[NBI_MESH_MAX_AXES] = {0}, n = public_axes("nb_all_gather", axes, ax);
  return n < 0 ? NULL : coll_record("nb_all_gather", NBI_OP_ALL_GATHER, t, ax, n, dim, 0, NULL, 0);
}

nb_tensor *nb_reduce_scatter(nb_tensor *t, const char *axes, int dim) {
  int ax[NBI_MESH_MAX_AXES] = {0}, n = public_axes("nb_reduce_scatter", axes, ax);
  return n < 0 ? NULL
               : coll_record("nb_reduce_scatter", NBI_OP_REDUCE_SCATTER, t, ax, n, dim, 0, NULL, 0);
}

nb_tensor *nb_all_to_all(nb_tensor *t, const char *axes, int split_dim, int concat_dim) {
  int ax[NBI_MESH_MAX_AXES] = {0}, n = public_axes("nb_all_to_all", axes, ax);
  return n < 0 ? NULL
               : coll_record("nb_all_to_all", NBI_OP_ALL_TO_ALL, t, ax, n, split_dim, concat_dim,
                             NULL, 0);
}

nb_tensor *nb_ppermute(nb_tensor *t, const char *axes, const int (*pairs)[2], int n_pairs) {
  int ax[NBI_MESH_MAX_AXES] = {0}, n = public_axes("nb_ppermute", axes, ax);
  return n < 0 ? NULL : coll_record("nb_ppermute", NBI_OP_PPERMUTE, t, ax, n, 0, 0, pairs, n_pairs);
}

nb_tensor *nb_axis_index(const char *axes) {
  int ax[NBI_MESH_MAX_AXES] = {0}, n = public_axes("nb_axis_index", axes, ax);
  return n < 0 ? NULL : coll_record("nb_axis_index", NBI_OP_AXIS_INDEX, NULL, ax, n, 0, 0, NULL, 0);
}

/* ---- rules --------------------------------------------------------------------------------
 * They record the same kind of collectives over y's group (its attrs), on the
 * mesh pushed while the rule runs (a body's trace, or the trace of its VJP,
 * JVP or batching); coll_record checks there is one. */

static int group_of(const nb_tensor *y, int *ax) {
  int n = (int)y->attrs.i[A_N_AXES];
  for (int k = 0; k < n; k++)
    ax[k] = (int)y->attrs.i[A_AXES + k];
  return n;
}

/* op over y's group on t with the given arguments. */
static nb_tensor *again(const nb_tensor *y, int op, nb_tensor *t, int64_t arg0, int64_t arg1) {
  int ax[NBI_MESH_MAX_AXES] = {0}, n = group_of(y, ax);
  if (!t) return NULL;
  return coll_record(coll_name(op), op, t, ax, n, arg0, arg1, NULL, 0);
}

static const coll_pairs *pairs_of(const nb_tensor *y) { return (const coll_pairs *)y->payload; }

static nb_tensor *permute_again(const nb_tensor *y, nb_tensor *t, bool invert) {
  int ax[NBI_MESH_MAX_AXES] = {0}, n = group_of(y, ax);
  const coll_pairs *pp = pairs_of(y);
  if (!t) return NULL;
  if (!pp) {
    nbi_error(NB_ERR_INTERNAL, "nb_ppermute: node without its pairs");
    return NULL;
  }
  int(*inv)[2] = malloc(sizeof *inv * (size_t)(pp->n_pairs ? pp->n_pairs : 1));
  if (!inv) {
    nbi_error(NB_ERR_OOM, "nb_ppermute: out of memory");
    return NULL;
  }
  for (int k = 0; k < pp->n_pairs; k++) {
    inv[k][0] = pp->pairs[k][invert ? 1 : 0];
    inv[k][1] = pp->pairs[k][invert ? 0 : 1];
  }
  nb_tensor *r = coll_record("nb_ppermute", NBI_OP_PPERMUTE, t, ax, n, 0, 0, (const int(*)[2])inv,
                             pp->n_pairs);
  free(inv);
  return r;
}

static nb_status status_of(const nb_tensor *r) { return r ? NB_OK : nb_last_status(); }

/* MAX / MIN: where x holds the group's extremum y, as x's dtype. */
static nb_tensor *extremum_mask(nb_tensor *y) { return nb_cast(nb_eq(y->in[0], y), y->dtype); }

/* all_reduce MAX/MIN: the group's sum of v spread over the members holding
 * the extremum, evenly over ties: sum(v) * mask / sum(mask). */
static nb_tensor *tie_split(nb_tensor *y, nb_tensor *v, nb_tensor *mask) {
  nb_tensor *sv = again(y, NBI_OP_ALL_REDUCE, v, NB_REDUCE_SUM, 0);
  nb_tensor *sm = again(y, NBI_OP_ALL_REDUCE, mask, NB_REDUCE_SUM, 0);
  return sv && sm ? nb_div(nb_mul(sv, mask), sm) : NULL;
}

static nb_status all_reduce_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  int op = (int)y->attrs.i[A_ARG0];
  if (op == NB_REDUCE_SUM || op == NB_REDUCE_MEAN)
    gin[0] = again(y, NBI_OP_ALL_REDUCE, gy, op, 0);
  else
    gin[0] = tie_split(y, gy, extremum_mask(y));
  return status_of(gin[0]);
}

static nb_tensor *all_reduce_jvp(nb_tensor *y, nb_tensor *const *tin) {
  int op = (int)y->attrs.i[A_ARG0];
  if (op == NB_REDUCE_SUM || op == NB_REDUCE_MEAN)
    return again(y, NBI_OP_ALL_REDUCE, tin[0], op, 0);
  /* the tangent of the members holding the extremum, averaged over ties */
  nb_tensor *mask = extremum_mask(y);
  nb_tensor *sv = again(y, NBI_OP_ALL_REDUCE, nb_mul(tin[0], mask), NB_REDUCE_SUM, 0);
  nb_tensor *sm = again(y, NBI_OP_ALL_REDUCE, mask, NB_REDUCE_SUM, 0);
  return sv && sm ? nb_div(sv, sm) : NULL;
}

static nb_tensor *all_reduce_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                  int64_t B) {
  (void)batched, (void)B;
  return again(y, NBI_OP_ALL_REDUCE, bin[0], y->attrs.i[A_ARG0], 0);
}

/* all_gather(dim): the cotangent of a member's block is the group's sum of
 * the cotangents, its chunk: reduce_scatter(dim). */
static nb_status all_gather_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = again(y, NBI_OP_REDUCE_SCATTER, gy, y->attrs.i[A_ARG0], 0);
  return status_of(gin[0]);
}

static nb_tensor *all_gather_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return again(y, NBI_OP_ALL_GATHER, tin[0], y->attrs.i[A_ARG0], 0);
}

static nb_tensor *all_gather_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                  int64_t B) {
  (void)batched, (void)B;
  return again(y, NBI_OP_ALL_GATHER, bin[0], y->attrs.i[A_ARG0] + 1, 0);
}

/* reduce_scatter(dim): every member's cotangent is the concatenation of the
 * chunks' cotangents: all_gather(dim). */
static nb_status reduce_scatter_vjp(nb_tensor *y, nb_tensor *gy, const bool *need,
                                    nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = again(y, NBI_OP_ALL_GATHER, gy, y->attrs.i[A_ARG0], 0);
  return status_of(gin[0]);
}

static nb_tensor *reduce_scatter_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return again(y, NBI_OP_REDUCE_SCATTER, tin[0], y->attrs.i[A_ARG0], 0);
}

static nb_tensor *reduce_scatter_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                      int64_t B) {
  (void)batched, (void)B;
  return again(y, NBI_OP_REDUCE_SCATTER, bin[0], y->attrs.i[A_ARG0] + 1, 0);
}

/* all_to_all(split s, concat c) is a permutation of the group's data; its
 * inverse (and transpose) is all_to_all(split c, concat s). */
static nb_status all_to_all_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = again(y, NBI_OP_ALL_TO_ALL, gy, y->attrs.i[A_ARG1], y->attrs.i[A_ARG0]);
  return status_of(gin[0]);
}

static nb_tensor *all_to_all_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return again(y, NBI_OP_ALL_TO_ALL, tin[0], y->attrs.i[A_ARG0], y->attrs.i[A_ARG1]);
}

static nb_tensor *all_to_all_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                  int64_t B) {
  (void)batched, (void)B;
  return again(y, NBI_OP_ALL_TO_ALL, bin[0], y->attrs.i[A_ARG0] + 1, y->attrs.i[A_ARG1] + 1);
}

/* ppermute: the transpose sends each destination's cotangent back to its
 * source (sources that sent nothing get zeros). */
static nb_status ppermute_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  if (!need[0]) return NB_OK;
  gin[0] = permute_again(y, gy, true);
  return status_of(gin[0]);
}

static nb_tensor *ppermute_jvp(nb_tensor *y, nb_tensor *const *tin) {
  return permute_again(y, tin[0], false);
}

static nb_tensor *ppermute_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                int64_t B) {
  (void)batched, (void)B;
  return permute_again(y, bin[0], false);
}

/* axis_index has no inputs, so vmap never batches it; were it asked to, every
 * example has the same rank. */
static nb_tensor *axis_index_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                  int64_t B) {
  (void)bin, (void)batched;
  return nbi_bat_expand(y, false, B);
}

/* ---- running a collective node across the devices (smap.c) ----------------------------
 * Contract: src/sharding/sharding.h (the interpreter is their only caller). */

/* The group of a collective's attrs: its mesh axis indices into ax (at most
 * NBI_MESH_MAX_AXES); returns their number. */
int nbi_coll_group(const nbi_attrs *a, int *ax) {
  int n = (int)a->i[A_N_AXES];
  if (n < 0 || n > NBI_MESH_MAX_AXES) return -1;
  for (int k = 0; k < n; k++)
    ax[k] = (int)a->i[A_AXES + k];
  return n;
}

/* Runs collective node (op, a, payload) on device values phys[0..n_dev) of m
 * (unused by AXIS_INDEX) into out[0..n_dev): nbi_coll_* over the group's
 * whole axes; AXIS_INDEX: each device's rank as an int32 scalar constant
 * (devices of one rank share it). Results are borrowed in the current scope. */
nb_status nbi_coll_run(const char *fn, const nb_mesh *m, int op, const nbi_attrs *a,
                       const nbi_payload *payload, nb_tensor *const *phys, nb_tensor **out) {
  int ax[NBI_MESH_MAX_AXES] = {0}, n = nbi_coll_group(a, ax);
  int64_t g = 1;
  bool ok = n >= 1 && n <= m->n_axes;
  nbi_axis axes[NBI_MESH_MAX_AXES];
  for (int k = 0; k < n && ok; k++) {
    ok = ax[k] >= 0 && ax[k] < m->n_axes;
    if (ok) {
      axes[k] = nbi_axis_whole(m, ax[k]);
      g *= m->size[ax[k]];
    }
  }
  if (!ok || g != a->i[A_GROUP])
    return nbi_error(NB_ERR_SHARDING, "%s: the body's %s was traced on another mesh than %s", fn,
                     coll_name(op) ? coll_name(op) : "collective", m->text);
  switch (op) {
  case NBI_OP_ALL_REDUCE: return nbi_coll_all_reduce(fn, m, phys, axes, n, (int)a->i[A_ARG0], out);
  case NBI_OP_ALL_GATHER: return nbi_coll_all_gather(fn, m, phys, axes, n, (int)a->i[A_ARG0], out);
  case NBI_OP_REDUCE_SCATTER:
    return nbi_coll_reduce_scatter(fn, m, phys, axes, n, (int)a->i[A_ARG0], out);
  case NBI_OP_ALL_TO_ALL:
    return nbi_coll_all_to_all(fn, m, phys, axes, n, (int)a->i[A_ARG0], (int)a->i[A_ARG1], out);
  case NBI_OP_PPERMUTE: {
    const coll_pairs *pp = (const coll_pairs *)payload;
    if (!pp) return nbi_error(NB_ERR_INTERNAL, "%s: a ppermute node without its pairs", fn);
    return nbi_coll_ppermute(fn, m, phys, axes, n, (const int(*)[2])pp->pairs, pp->n_pairs, out);
  }
  case NBI_OP_AXIS_INDEX: {
    nb_tensor **of_rank = calloc((size_t)g, sizeof *of_rank);
    if (!of_rank) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    nb_status st = NB_OK;
    for (int d = 0; d < m->n_dev && !st; d++) {
      int64_t r = 0;
      for (int k = 0; k < n; k++)
        r = r * axes[k].size + nbi_axis_coord(m, &axes[k], d);
      if (!of_rank[r] && !(of_rank[r] = nb_scalar((double)r, NB_I32))) st = nb_last_status();
      out[d] = of_rank[r];
    }
    if (!st) st = nbi_place_all(m, out); /* each device's rank on its device */
    free(of_rank);
    return st;
  }
  default: return nbi_error(NB_ERR_INTERNAL, "%s: op %d is not a collective", fn, op);
  }
}

/* ---- kernel: collectives never run as one node --------------------------------------- */
static nb_status coll_exec(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)out, (void)in;
  return nbi_error(NB_ERR_SHARDING,
                   "%s: a collective ran outside the per-device execution of an nb_shard_map body "
                   "(collectives must be at the body's top level: not inside a checkpoint, "
                   "control flow, or a program run on its own)",
                   coll_name(n->op));
}

const nbi_op_def nbi_opdef_ALL_REDUCE = {.name = "all_reduce",
                                         .arity = 1,
                                         .exec = coll_exec,
                                         .vjp = all_reduce_vjp,
                                         .jvp = all_reduce_jvp,
                                         .vmap = all_reduce_vmap};
const nbi_op_def nbi_opdef_ALL_GATHER = {.name = "all_gather",
                                         .arity = 1,
                                         .exec = coll_exec,
                                         .vjp = all_gather_vjp,
                                         .jvp = all_gather_jvp,
                                         .vmap = all_gather_vmap};
const nbi_op_def nbi_opdef_REDUCE_SCATTER = {.name = "reduce_scatter",
                                             .arity = 1,
                                             .exec = coll_exec,
                                             .vjp = reduce_scatter_vjp,
                                             .jvp = reduce_scatter_jvp,
                                             .vmap = reduce_scatter_vmap};
const nbi_op_def nbi_opdef_ALL_TO_ALL = {.name = "all_to_all",
                                         .arity = 1,
                                         .exec = coll_exec,
                                         .vjp = all_to_all_vjp,
                                         .jvp = all_to_all_jvp,
                                         .vmap = all_to_all_vmap};
const nbi_op_def nbi_opdef_PPERMUTE = {.name = "ppermute",
                                       .arity = 1,
                                       .exec = coll_exec,
                                       .vjp = ppermute_vjp,
                                       .jvp = ppermute_jvp,
                                       .vmap = ppermute_vmap};
const nbi_op_def nbi_opdef_AXIS_INDEX = {.name = "axis_index",
                                         .arity = 0,
                                         .exec = coll_exec,
                                         .flags = NBI_OPF_NONDIFF,
                                         .vmap = axis_index_vmap};
