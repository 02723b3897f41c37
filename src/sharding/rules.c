/* src/sharding/rules.c — the factor rule of every op (SHARDING.md "Op rules";
 * contract in sharding.h).
 *
 * Conventions shared by every rule here:
 * - A dimension of size 1 gets no factor (it is never sharded; broadcasting
 *   stretches it). Every other dimension's factor sizes multiply to its size.
 * - A factor appears at most once per tensor. Tensors 0 .. n_in-1 are the
 *   operands, n_in the result.
 * - Dimensions an op's attributes index into (slice, pad, flip, concat,
 *   softmax/cumsum/argmax axes, gather axes, conv/pool windows) are
 *   need-replication or permutation factors: the op then runs per shard with
 *   its attributes unchanged. A dimension that appears on one side only and
 *   has no meaning as a block of the op (one_hot's depth, concat parts) gets
 *   a factor of its own on that side.
 * - Only reductions that are sums get reduction factors (reduce_sum, matmul's
 *   k, conv's input channels and bwd ops' summed dims); max, min, prod, any,
 *   all, var, logsumexp make their reduced dims need-replication instead (a
 *   partial result means a pending sum). Gathers (take) and scatters make the
 *   indexed dims need-replication: a shard's kernel sees global indices.
 * - linear (sharding.h) is conservative: NONE wherever a kept partial sum
 *   would not give the op's value. Rules see no dtypes: cast is NONE (a
 *   caller that knows it casts to a wider float may set UNARY), and ops whose
 *   compute dtype (attrs.i[0] of elementwise ops) is bool are NONE (add is
 *   or, mul is and there).
 * - Ops without a meaningful blockwise form (tuple_get, remat, custom_call,
 *   cond, while_loop, scan) get the all-replicated rule: each dimension of
 *   each tensor its own need-replication factor. */
#include "sharding.h"
#include "../core/oprules.h"

#include "../ops/nn.h"

/* A rule under construction; bad is set when the op's shapes or attrs do not
 * fit the rule, or the rule exceeds the struct's limits. */
typedef struct rb {
  nbi_shard_rule *r;
  bool bad;
  const char *why;
} rb;

static void rb_fail(rb *b, const char *why) {
  if (!b->bad) b->why = why;
  b->bad = true;
}

/* A new factor of that size and kind, or -1 for size 1 (no factor). */
static int rb_factor(rb *b, int64_t size, int kind) {
  if (size == 1) return -1;
  if (b->r->n_factors >= NBI_RULE_MAX_FACTORS) {
    rb_fail(b, "too many factors");
    return -1;
  }
  int f = b->r->n_factors++;
  b->r->size[f] = size;
  b->r->kind[f] = (uint8_t)kind;
  return f;
}

/* Appends factor f (ignored when < 0) to dimension d of tensor t. */
static void rb_put(rb *b, int t, int d, int f) {
  if (f < 0) return;
  if (d < 0 || d >= b->r->ndim[t]) {
    rb_fail(b, "dimension out of range");
    return;
  }
  nbi_rule_dim *rd = &b->r->dim[t][d];
  if (rd->n >= NBI_RULE_MAX_COMPOUND) {
    rb_fail(b, "too many factors in one dimension");
    return;
  }
  rd->f[rd->n++] = (int8_t)f;
}

/* A factor of its own (of that kind) for every dimension of tensor t. */
static void rb_own(rb *b, int t, const nb_shape *s, int kind) {
  for (int d = 0; d < s->ndim; d++)
    rb_put(b, t, d, rb_factor(b, s->dims[d], kind));
}

/* Elementwise with NumPy broadcasting: one pass factor per result dimension,
 * shared by every operand dimension (right-aligned) of the same size; operand
 * dimensions of size 1 get none. fo[d] receives the result dim's factor. */
static void rb_broadcast(rb *b, const nb_shape *in, int n_in, const nb_shape *out, int *fo) {
  for (int k = 0; k < n_in; k++)
    if (in[k].ndim > out->ndim) rb_fail(b, "operand rank above the result's");
  for (int d = 0; d < out->ndim; d++) {
    int f = rb_factor(b, out->dims[d], NBI_FACTOR_PASS);
    if (fo) fo[d] = f;
    rb_put(b, n_in, d, f);
    for (int k = 0; k < n_in; k++) {
      int dk = d - (out->ndim - in[k].ndim);
      if (dk < 0) continue;
      if (in[k].dims[dk] == out->dims[d])
        rb_put(b, k, dk, f);
      else if (in[k].dims[dk] != 1)
        rb_fail(b, "operand does not broadcast to the result");
    }
  }
}

/* Whether axis a (from attrs) is a dimension of a rank-nd tensor. */
static bool axis_ok(rb *b, int64_t a, int nd) {
  if (a >= 0 && a < nd) return true;
  rb_fail(b, "axis attribute out of range");
  return false;
}

/* ---- reductions and ops along an axis ------------------------------------------ */

/* Reduction over the dims in mask (attrs.i[0]): kept dims pass; reduced dims
 * get a factor of kind red (reduction for sums, need-replication otherwise)
 * that appears in the result only as a size-1 dim (keepdims), i.e. not at all. */
static void rb_reduce(rb *b, const nb_shape *in, const nb_shape *out, uint64_t mask, int red) {
  int nred = 0;
  for (int d = 0; d < in->ndim; d++)
    nred += (int)((mask >> d) & 1u);
  bool keep = out->ndim == in->ndim;
  if (!keep && out->ndim != in->ndim - nred) {
    rb_fail(b, "reduction result rank does not match its axes");
    return;
  }
  int od = 0;
  for (int d = 0; d < in->ndim; d++) {
    bool reduced = (mask >> d) & 1u;
    if (reduced) {
      rb_put(b, 0, d, rb_factor(b, in->dims[d], red));
      if (keep) {
        if (out->dims[od] != 1) rb_fail(b, "kept reduced dimension is not 1");
        od++;
      }
      continue;
    }
    if (out->dims[od] != in->dims[d]) rb_fail(b, "reduction keeps a dimension's size");
    int f = rb_factor(b, in->dims[d], NBI_FACTOR_PASS);
    rb_put(b, 0, d, f);
    rb_put(b, 1, od++, f);
  }
}

/* ---- reshape: the common refinement of the two shapes ---------------------------- */

/* Walks both shapes major to minor, cutting each pair of current dims at the
 * smaller remaining size when it divides the larger: each cut is a factor of
 * the operand dim and the result dim it lies in (compound dims hold several).
 * Where neither remainder divides the other (or a dim would hold more factors
 * than NBI_RULE_MAX_COMPOUND), the rest of that group of dims (up to the next
 * point where both shapes' running products meet) is need-replication, each
 * side's part its own factor: the factors already cut stay valid, since they
 * lie wholly before that point on both sides. */
static void rb_reshape(rb *b, const nb_shape *in, const nb_shape *out) {
  int64_t nin = 1, nout = 1;
  bool zero = false;
  for (int d = 0; d < in->ndim; d++)
    nin *= in->dims[d], zero |= in->dims[d] == 0;
  for (int d = 0; d < out->ndim; d++)
    nout *= out->dims[d], zero |= out->dims[d] == 0;
  if (zero) { /* nothing to refine: every dim on its own */
    rb_own(b, 0, in, NBI_FACTOR_NEED_REPL);
    rb_own(b, 1, out, NBI_FACTOR_NEED_REPL);
    return;
  }
  if (nin != nout) {
    rb_fail(b, "reshape changes the element count");
    return;
  }
  int64_t cin[NB_MAX_DIMS], cout[NB_MAX_DIMS]; /* running products through dim d */
  for (int64_t d = 0, p = 1; d < in->ndim; d++)
    cin[d] = p *= in->dims[d];
  for (int64_t d = 0, p = 1; d < out->ndim; d++)
    cout[d] = p *= out->dims[d];
  int i = 0, j = 0; /* next dims to enter */
  int64_t ra = 1, ro = 1;
  for (;;) {
    while (ra == 1 && i < in->ndim)
      ra = in->dims[i++];
    while (ro == 1 && j < out->ndim)
      ro = out->dims[j++];
    if (ra == 1 && ro == 1) return;
    if (ra == 1 || ro == 1) {
      rb_fail(b, "reshape refinement ran out of dimensions");
      return;
    }
    int di = i - 1, dj = j - 1;
    int64_t g = ra < ro ? ra : ro, big = ra < ro ? ro : ra;
    int ni = b->r->dim[0][di].n, nj = b->r->dim[1][dj].n;
    bool room =
        (ni < NBI_RULE_MAX_COMPOUND - 1 || g == ra) && (nj < NBI_RULE_MAX_COMPOUND - 1 || g == ro);
    if (big % g == 0 && room) {
      int f = rb_factor(b, g, NBI_FACTOR_PASS);
      rb_put(b, 0, di, f);
      rb_put(b, 1, dj, f);
      ra /= g, ro /= g;
      continue;
    }
    /* The group ends at the first running product both shapes reach. */
    int64_t lo = cin[di] > cout[dj] ? cin[di] : cout[dj], end = nin;
    for (int a = di; a < in->ndim; a++) {
      if (cin[a] < lo) continue;
      bool both = false;
      for (int c = dj; c < out->ndim && !both; c++)
        both = cout[c] == cin[a];
      if (both) {
        end = cin[a];
        break;
      }
    }
    rb_put(b, 0, di, rb_factor(b, ra, NBI_FACTOR_NEED_REPL));
    while (i < in->ndim && cin[i - 1] < end) {
      rb_put(b, 0, i, rb_factor(b, in->dims[i], NBI_FACTOR_NEED_REPL));
      i++;
    }
    rb_put(b, 1, dj, rb_factor(b, ro, NBI_FACTOR_NEED_REPL));
    while (j < out->ndim && cout[j - 1] < end) {
      rb_put(b, 1, j, rb_factor(b, out->dims[j], NBI_FACTOR_NEED_REPL));
      j++;
    }
    ra = ro = 1;
  }
}

/* ---- shape ops ------------------------------------------------------------------ */

/* permute: result dim d reads operand dim attrs.i[d]. */
static void rb_permute(rb *b, const nbi_attrs *a, const nb_shape *in, const nb_shape *out) {
  if (in->ndim != out->ndim) rb_fail(b, "permute changes the rank");
  uint32_t seen = 0;
  for (int d = 0; d < out->ndim && !b->bad; d++) {
    int64_t p = a->i[d];
    if (!axis_ok(b, p, in->ndim) || (seen >> (int)p & 1u)) {
      rb_fail(b, "permutation attribute is not a permutation");
      return;
    }
    seen |= 1u << p;
    if (in->dims[p] != out->dims[d]) rb_fail(b, "permute changes a dimension's size");
    int f = rb_factor(b, out->dims[d], NBI_FACTOR_PASS);
    rb_put(b, 0, (int)p, f);
    rb_put(b, 1, d, f);
  }
}

/* Dims a shape op leaves alone pass; the others (touched[d]) get permutation
 * factors: one shared when the size is kept, else one per side. */
static void rb_touched(rb *b, const nb_shape *in, const nb_shape *out, const bool *touched) {
  if (in->ndim != out->ndim) {
    rb_fail(b, "shape op changes the rank");
    return;
  }
  for (int d = 0; d < in->ndim; d++) {
    bool same = in->dims[d] == out->dims[d];
    if (!touched[d] && !same) rb_fail(b, "untouched dimension changes size");
    int kind = touched[d] ? NBI_FACTOR_PERMUTATION : NBI_FACTOR_PASS;
    int f = rb_factor(b, in->dims[d], kind);
    rb_put(b, 0, d, f);
    rb_put(b, 1, d, same ? f : rb_factor(b, out->dims[d], kind));
  }
}

/* concat along attrs.i[0]: other dims pass (shared by all); the axis is
 * need-replication, each tensor's part its own factor. */
static void rb_concat(rb *b, const nbi_attrs *a, const nb_shape *in, int n_in,
                      const nb_shape *out) {
  if (!axis_ok(b, a->i[0], out->ndim)) return;
  int ax = (int)a->i[0];
  for (int k = 0; k < n_in; k++)
    if (in[k].ndim != out->ndim) rb_fail(b, "concat operands differ in rank");
  if (b->bad) return;
  for (int d = 0; d < out->ndim; d++) {
    if (d == ax) {
      for (int k = 0; k <= n_in; k++)
        rb_put(b, k, d,
               rb_factor(b, k < n_in ? in[k].dims[d] : out->dims[d], NBI_FACTOR_NEED_REPL));
      continue;
    }
    int f = rb_factor(b, out->dims[d], NBI_FACTOR_PASS);
    for (int k = 0; k <= n_in; k++) {
      if (k < n_in && in[k].dims[d] != out->dims[d]) rb_fail(b, "concat operands differ");
      rb_put(b, k, d, f);
    }
  }
}

/* broadcast_to: operand dims (right-aligned) of the result's size pass;
 * stretched size-1 dims and added leading dims: the result's own factor. */
static void rb_broadcast_to(rb *b, const nb_shape *in, const nb_shape *out) {
  rb_broadcast(b, in, 1, out, NULL);
}

/* ---- indexing ------------------------------------------------------------------- */

/* take(t, idx, axis): t's other dims pass to the result around idx's dims,
 * which pass too; t's axis is need-replication (global indices). */
static void rb_take(rb *b, const nbi_attrs *a, const nb_shape *in, const nb_shape *out) {
  const nb_shape *t = &in[0], *ix = &in[1];
  if (!axis_ok(b, a->i[0], t->ndim)) return;
  int ax = (int)a->i[0];
  if (out->ndim != t->ndim - 1 + ix->ndim) {
    rb_fail(b, "take result rank");
    return;
  }
  for (int d = 0; d < t->ndim; d++) {
    if (d == ax) {
      rb_put(b, 0, d, rb_factor(b, t->dims[d], NBI_FACTOR_NEED_REPL));
      continue;
    }
    int od = d < ax ? d : d - 1 + ix->ndim;
    if (out->dims[od] != t->dims[d]) rb_fail(b, "take result shape");
    int f = rb_factor(b, t->dims[d], NBI_FACTOR_PASS);
    rb_put(b, 0, d, f);
    rb_put(b, 2, od, f);
  }
  for (int d = 0; d < ix->ndim; d++) {
    if (out->dims[ax + d] != ix->dims[d]) rb_fail(b, "take result shape");
    int f = rb_factor(b, ix->dims[d], NBI_FACTOR_PASS);
    rb_put(b, 1, d, f);
    rb_put(b, 2, ax + d, f);
  }
}

/* take_along_axis(t, idx, axis): outside the axis, t and idx broadcast to the
 * result (pass); t's axis is need-replication, idx's axis passes to the
 * result's. */
static void rb_take_along(rb *b, const nbi_attrs *a, const nb_shape *in, const nb_shape *out) {
  const nb_shape *t = &in[0], *ix = &in[1];
  if (t->ndim != ix->ndim || out->ndim != t->ndim) {
    rb_fail(b, "take_along_axis ranks");
    return;
  }
  if (!axis_ok(b, a->i[0], t->ndim)) return;
  int ax = (int)a->i[0];
  for (int d = 0; d < t->ndim; d++) {
    if (d == ax) {
      rb_put(b, 0, d, rb_factor(b, t->dims[d], NBI_FACTOR_NEED_REPL));
      int f = rb_factor(b, out->dims[d], NBI_FACTOR_PASS);
      if (ix->dims[d] != out->dims[d]) rb_fail(b, "take_along_axis result shape");
      rb_put(b, 1, d, f);
      rb_put(b, 2, d, f);
      continue;
    }
    int f = rb_factor(b, out->dims[d], NBI_FACTOR_PASS);
    rb_put(b, 2, d, f);
    for (int k = 0; k < 2; k++) {
      if (in[k].dims[d] == out->dims[d])
        rb_put(b, k, d, f);
      else if (in[k].dims[d] != 1)
        rb_fail(b, "take_along_axis operands do not broadcast");
    }
  }
}

/* scatter_add(t, idx, upd, axis) -> t's shape: t's other dims pass to the
 * result and to upd's matching dims; the axis and the index dims (upd's and
 * idx's, summed into t) are need-replication: a shard holding part of them
 * would add t again per shard. */
static void rb_scatter(rb *b, const nbi_attrs *a, const nb_shape *in, const nb_shape *out) {
  const nb_shape *t = &in[0], *ix = &in[1], *u = &in[2];
  if (!axis_ok(b, a->i[0], t->ndim)) return;
  int ax = (int)a->i[0];
  if (u->ndim != t->ndim - 1 + ix->ndim || out->ndim != t->ndim) {
    rb_fail(b, "scatter_add ranks");
    return;
  }
  for (int d = 0; d < t->ndim; d++) {
    if (out->dims[d] != t->dims[d]) rb_fail(b, "scatter_add result shape");
    int kind = d == ax ? NBI_FACTOR_NEED_REPL : NBI_FACTOR_PASS;
    int f = rb_factor(b, t->dims[d], kind);
    rb_put(b, 0, d, f);
    rb_put(b, 3, d, f);
    if (d == ax) continue;
    int ud = d < ax ? d : d - 1 + ix->ndim;
    if (u->dims[ud] != t->dims[d]) rb_fail(b, "scatter_add updates shape");
    rb_put(b, 2, ud, f);
  }
  for (int d = 0; d < ix->ndim; d++) {
    if (u->dims[ax + d] != ix->dims[d]) rb_fail(b, "scatter_add updates shape");
    int f = rb_factor(b, ix->dims[d], NBI_FACTOR_NEED_REPL);
    rb_put(b, 1, d, f);
    rb_put(b, 2, ax + d, f);
  }
}

/* scatter_add_along_axis(t, idx, upd, axis) -> t's shape: where t, idx and
 * upd share a dim's size it passes; the axis, and dims where t has size 1 and
 * upd more (upd sums into it), are need-replication. */
static void rb_scatter_along(rb *b, const nbi_attrs *a, const nb_shape *in, const nb_shape *out) {
  const nb_shape *t = &in[0], *ix = &in[1], *u = &in[2];
  int nd = t->ndim;
  if (ix->ndim != nd || u->ndim != nd || out->ndim != nd) {
    rb_fail(b, "scatter_add_along_axis ranks");
    return;
  }
  if (!axis_ok(b, a->i[0], nd)) return;
  int ax = (int)a->i[0];
  for (int d = 0; d < nd; d++) {
    if (out->dims[d] != t->dims[d]) rb_fail(b, "scatter_add_along_axis result shape");
    if (d == ax || t->dims[d] != u->dims[d]) {
      int f = rb_factor(b, t->dims[d], NBI_FACTOR_NEED_REPL);
      rb_put(b, 0, d, f);
      rb_put(b, 3, d, f);
      int g = rb_factor(b, u->dims[d], NBI_FACTOR_NEED_REPL);
      rb_put(b, 2, d, g);
      if (ix->dims[d] == u->dims[d])
        rb_put(b, 1, d, g);
      else if (ix->dims[d] != 1)
        rb_fail(b, "scatter_add_along_axis idx shape");
      continue;
    }
    int f = rb_factor(b, t->dims[d], NBI_FACTOR_PASS);
    rb_put(b, 0, d, f);
    rb_put(b, 2, d, f);
    rb_put(b, 3, d, f);
    if (ix->dims[d] == t->dims[d])
      rb_put(b, 1, d, f);
    else if (ix->dims[d] != 1)
      rb_fail(b, "scatter_add_along_axis idx shape");
  }
}

/* one_hot(idx, n): idx's dims pass; the new last dim is the result's own
 * need-replication factor (positions are compared with global indices). */
static void rb_one_hot(rb *b, const nb_shape *in, const nb_shape *out) {
  if (out->ndim != in->ndim + 1) {
    rb_fail(b, "one_hot rank");
    return;
  }
  for (int d = 0; d < in->ndim; d++) {
    if (in->dims[d] != out->dims[d]) rb_fail(b, "one_hot shape");
    int f = rb_factor(b, in->dims[d], NBI_FACTOR_PASS);
    rb_put(b, 0, d, f);
    rb_put(b, 1, d, f);
  }
  rb_put(b, 1, in->ndim, rb_factor(b, out->dims[in->ndim], NBI_FACTOR_NEED_REPL));
}

/* ---- linear algebra and NN -------------------------------------------------------- */

/* matmul (NumPy): batch dims broadcast (pass, right-aligned; size-1 operand
 * batch dims get none), m and n pass, k is a reduction; 1-D operands have no
 * m (n). */
static void rb_matmul(rb *b, const nb_shape *in, const nb_shape *out) {
  const nb_shape *A = &in[0], *B = &in[1];
  if (A->ndim < 1 || B->ndim < 1) {
    rb_fail(b, "matmul operands must be at least 1-D");
    return;
  }
  int ba = A->ndim > 2 ? A->ndim - 2 : 0, bb = B->ndim > 2 ? B->ndim - 2 : 0;
  int nb = ba > bb ? ba : bb;
  int has_m = A->ndim > 1, has_n = B->ndim > 1;
  if (out->ndim != nb + has_m + has_n) {
    rb_fail(b, "matmul result rank");
    return;
  }
  for (int d = 0; d < nb; d++) {
    int f = rb_factor(b, out->dims[d], NBI_FACTOR_PASS);
    rb_put(b, 2, d, f);
    int da = d - (nb - ba), db = d - (nb - bb);
    if (da >= 0) {
      if (A->dims[da] == out->dims[d])
        rb_put(b, 0, da, f);
      else if (A->dims[da] != 1)
        rb_fail(b, "matmul batch dims do not broadcast");
    }
    if (db >= 0) {
      if (B->dims[db] == out->dims[d])
        rb_put(b, 1, db, f);
      else if (B->dims[db] != 1)
        rb_fail(b, "matmul batch dims do not broadcast");
    }
  }
  int64_t K = A->dims[A->ndim - 1];
  int kb = B->ndim == 1 ? 0 : B->ndim - 2;
  if (B->dims[kb] != K) rb_fail(b, "matmul inner dims differ");
  int fk = rb_factor(b, K, NBI_FACTOR_REDUCTION);
  rb_put(b, 0, A->ndim - 1, fk);
  rb_put(b, 1, kb, fk);
  if (has_m) {
    if (out->dims[nb] != A->dims[A->ndim - 2]) rb_fail(b, "matmul m");
    int f = rb_factor(b, A->dims[A->ndim - 2], NBI_FACTOR_PASS);
    rb_put(b, 0, A->ndim - 2, f);
    rb_put(b, 2, nb, f);
  }
  if (has_n) {
    if (out->dims[out->ndim - 1] != B->dims[B->ndim - 1]) rb_fail(b, "matmul n");
    int f = rb_factor(b, B->dims[B->ndim - 1], NBI_FACTOR_PASS);
    rb_put(b, 1, B->ndim - 1, f);
    rb_put(b, 2, out->ndim - 1, f);
  }
}

static bool all_4d(rb *b, const nb_shape *in, int n, const nb_shape *out) {
  bool ok = out->ndim == 4;
  for (int k = 0; k < n; k++)
    ok = ok && in[k].ndim == 4;
  if (!ok) rb_fail(b, "NCHW ops take 4-D tensors");
  return ok;
}

/* A factor of its own for dims 2, 3 (spatial: windows) of tensor t. */
static void rb_spatial(rb *b, int t, const nb_shape *s) {
  for (int d = 2; d < 4; d++)
    rb_put(b, t, d, rb_factor(b, s->dims[d], NBI_FACTOR_NEED_REPL));
}

/* A factor shared by dim dt of the listed tensors (ts[k], ds[k]) of size n. */
static void rb_shared(rb *b, int kind, int64_t n, int cnt, const int *ts, const int *ds,
                      const nb_shape *const *shapes) {
  int f = rb_factor(b, n, kind);
  for (int k = 0; k < cnt; k++) {
    if (shapes[k]->dims[ds[k]] != n) rb_fail(b, "NCHW operands disagree on a dimension");
    rb_put(b, ts[k], ds[k], f);
  }
}

/* conv2d(x [N,C,H,W], w [O,C/G,KH,KW], bias [O]?) -> [N,O,OH,OW]: N and O pass
 * (with bias: O also in it), C is a reduction (need-replication with a bias,
 * which a partial sum would add per shard, or with groups > 1, whose channel
 * dims are coupled through the groups: O and C/G need-replication then);
 * windows need-replication. */
static void rb_conv2d(rb *b, const nbi_attrs *a, const nb_shape *in, int n_in,
                      const nb_shape *out) {
  if (!all_4d(b, in, 2, out)) return;
  bool bias = n_in == 3, grouped = a->i[NBI_CONV_GROUPS] != 1;
  if (bias && in[2].ndim != 1) {
    rb_fail(b, "conv2d bias must be 1-D");
    return;
  }
  const nb_shape *x = &in[0], *w = &in[1];
  rb_shared(b, NBI_FACTOR_PASS, x->dims[0], 2, (int[]){0, n_in}, (int[]){0, 0},
            (const nb_shape *const[]){x, out});
  int ko = grouped ? NBI_FACTOR_NEED_REPL : NBI_FACTOR_PASS;
  if (bias)
    rb_shared(b, ko, w->dims[0], 3, (int[]){1, n_in, 2}, (int[]){0, 1, 0},
              (const nb_shape *const[]){w, out, &in[2]});
  else
    rb_shared(b, ko, w->dims[0], 2, (int[]){1, n_in}, (int[]){0, 1},
              (const nb_shape *const[]){w, out});
  if (grouped) {
    rb_put(b, 0, 1, rb_factor(b, x->dims[1], NBI_FACTOR_NEED_REPL));
    rb_put(b, 1, 1, rb_factor(b, w->dims[1], NBI_FACTOR_NEED_REPL));
  } else {
    rb_shared(b, bias ? NBI_FACTOR_NEED_REPL : NBI_FACTOR_REDUCTION, x->dims[1], 2, (int[]){0, 1},
              (int[]){1, 1}, (const nb_shape *const[]){x, w});
  }
  rb_spatial(b, 0, x);
  rb_spatial(b, 1, w);
  rb_spatial(b, n_in, out);
}

/* conv2d_bwd_data(dy [N,O,OH,OW], w [O,C/G,KH,KW]) -> dx [N,C,H,W]: N passes,
 * O is a reduction, C passes (both need-replication with groups > 1). */
static void rb_conv_bwd_data(rb *b, const nbi_attrs *a, const nb_shape *in, const nb_shape *out) {
  if (!all_4d(b, in, 2, out)) return;
  bool grouped = a->i[NBI_CONV_GROUPS] != 1;
  const nb_shape *dy = &in[0], *w = &in[1];
  rb_shared(b, NBI_FACTOR_PASS, dy->dims[0], 2, (int[]){0, 2}, (int[]){0, 0},
            (const nb_shape *const[]){dy, out});
  if (grouped) {
    rb_put(b, 0, 1, rb_factor(b, dy->dims[1], NBI_FACTOR_NEED_REPL));
    rb_put(b, 1, 0, rb_factor(b, w->dims[0], NBI_FACTOR_NEED_REPL));
    rb_put(b, 1, 1, rb_factor(b, w->dims[1], NBI_FACTOR_NEED_REPL));
    rb_put(b, 2, 1, rb_factor(b, out->dims[1], NBI_FACTOR_NEED_REPL));
  } else {
    rb_shared(b, NBI_FACTOR_REDUCTION, dy->dims[1], 2, (int[]){0, 1}, (int[]){1, 0},
              (const nb_shape *const[]){dy, w});
    rb_shared(b, NBI_FACTOR_PASS, w->dims[1], 2, (int[]){1, 2}, (int[]){1, 1},
              (const nb_shape *const[]){w, out});
  }
  rb_spatial(b, 0, dy);
  rb_spatial(b, 1, w);
  rb_spatial(b, 2, out);
}

/* conv2d_bwd_filter(x [N,C,H,W], dy [N,O,OH,OW]) -> dw [O,C/G,KH,KW]: N is a
 * reduction, O and C pass (need-replication with groups > 1). */
static void rb_conv_bwd_filter(rb *b, const nbi_attrs *a, const nb_shape *in, const nb_shape *out) {
  if (!all_4d(b, in, 2, out)) return;
  bool grouped = a->i[NBI_CONV_GROUPS] != 1;
  const nb_shape *x = &in[0], *dy = &in[1];
  rb_shared(b, NBI_FACTOR_REDUCTION, x->dims[0], 2, (int[]){0, 1}, (int[]){0, 0},
            (const nb_shape *const[]){x, dy});
  if (grouped) {
    rb_put(b, 0, 1, rb_factor(b, x->dims[1], NBI_FACTOR_NEED_REPL));
    rb_put(b, 1, 1, rb_factor(b, dy->dims[1], NBI_FACTOR_NEED_REPL));
    rb_put(b, 2, 0, rb_factor(b, out->dims[0], NBI_FACTOR_NEED_REPL));
    rb_put(b, 2, 1, rb_factor(b, out->dims[1], NBI_FACTOR_NEED_REPL));
  } else {
    rb_shared(b, NBI_FACTOR_PASS, dy->dims[1], 2, (int[]){1, 2}, (int[]){1, 0},
              (const nb_shape *const[]){dy, out});
    rb_shared(b, NBI_FACTOR_PASS, x->dims[1], 2, (int[]){0, 2}, (int[]){1, 1},
              (const nb_shape *const[]){x, out});
  }
  rb_spatial(b, 0, x);
  rb_spatial(b, 1, dy);
  rb_spatial(b, 2, out);
}

/* Pooling family on n_in NCHW operands: N and C pass through every tensor;
 * spatial dims are need-replication, shared by the tensors of equal spatial
 * size as tensor `like` (the pooled or the unpooled side). */
static void rb_pool(rb *b, const nb_shape *in, int n_in, const nb_shape *out) {
  if (!all_4d(b, in, n_in, out)) return;
  const nb_shape *all[NBI_RULE_MAX_TENSORS];
  int ts[NBI_RULE_MAX_TENSORS], ds[NBI_RULE_MAX_TENSORS];
  for (int k = 0; k <= n_in; k++)
    all[k] = k < n_in ? &in[k] : out, ts[k] = k;
  for (int d = 0; d < 2; d++) {
    for (int k = 0; k <= n_in; k++)
      ds[k] = d;
    rb_shared(b, NBI_FACTOR_PASS, out->dims[d], n_in + 1, ts, ds, all);
  }
  for (int d = 2; d < 4; d++) {
    bool done[NBI_RULE_MAX_TENSORS] = {false};
    for (int k = 0; k <= n_in; k++) {
      if (done[k]) continue;
      int f = rb_factor(b, all[k]->dims[d], NBI_FACTOR_NEED_REPL);
      for (int q = k; q <= n_in; q++)
        if (!done[q] && all[q]->dims[d] == all[k]->dims[d]) rb_put(b, q, d, f), done[q] = true;
    }
  }
}

/* ---- the table ------------------------------------------------------------------ */

/* Kept-partial behaviour of an elementwise op on compute dtype attrs.i[0]. */
static uint8_t op_linear(int op) {
  uint32_t t = nbi_op_traits[op];
  return t & NBI_TR_LIN_UNARY   ? NBI_LINEAR_UNARY
         : t & NBI_TR_LIN_SUM   ? NBI_LINEAR_SUM
         : t & NBI_TR_LIN_MULTI ? NBI_LINEAR_MULTI
         : t & NBI_TR_LIN_FIRST ? NBI_LINEAR_FIRST
                                : NBI_LINEAR_NONE;
}
static uint8_t ew_linear(int op, const nbi_attrs *a) {
  return a->i[0] == NB_BOOL ? NBI_LINEAR_NONE : op_linear(op);
}

static void rb_op(rb *b, int op, const nbi_attrs *a, const nb_shape *in, int n_in,
                  const nb_shape *out) {
  nbi_shard_rule *r = b->r;
  switch (op) {
  case NBI_OP_CONST:
  case NBI_OP_PLACEHOLDER: /* no operands: the result may take any layout */
    rb_own(b, 0, out, NBI_FACTOR_PASS);
    return;
  case NBI_OP_IDENTITY:
  case NBI_OP_STOP_GRADIENT:
  case NBI_OP_SHARD_CONSTRAINT: /* graph mode closes its result at the constraint */
    if (in[0].ndim != out->ndim) rb_fail(b, "identity changes the rank");
    rb_broadcast(b, in, 1, out, NULL);
    r->linear = op_linear(op);
    return;
#define NB_OP(ID, name, arity, traits) case NBI_OP_##ID:
#include "../ops/elementwise.def"
#undef NB_OP
    rb_broadcast(b, in, n_in, out, NULL);
    r->linear = ew_linear(op, a);
    return;
  case NBI_OP_SHARD_LIKE: /* g, x and the result share one layout, never partial */
    if (n_in != 2 || !nbi_shape_eq(&in[0], out) || !nbi_shape_eq(&in[1], out))
      rb_fail(b, "shard_like of different shapes");
    rb_broadcast(b, in, 2, out, NULL);
    return;
  case NBI_OP_REDUCE_SUM:
    rb_reduce(b, in, out, (uint64_t)a->i[0], NBI_FACTOR_REDUCTION);
    r->linear = NBI_LINEAR_UNARY;
    return;
  case NBI_OP_REDUCE_PROD:
  case NBI_OP_REDUCE_MAX:
  case NBI_OP_REDUCE_MIN:
  case NBI_OP_REDUCE_ANY:
  case NBI_OP_REDUCE_ALL:
  case NBI_OP_REDUCE_VAR:
  case NBI_OP_LOGSUMEXP:
  case NBI_OP_ARGMAX:
  case NBI_OP_ARGMIN: rb_reduce(b, in, out, (uint64_t)a->i[0], NBI_FACTOR_NEED_REPL); return;
  case NBI_OP_SOFTMAX:
  case NBI_OP_LOG_SOFTMAX:
  case NBI_OP_CUMSUM: {
    int fo[NB_MAX_DIMS];
    if (in[0].ndim != out->ndim) rb_fail(b, "op along an axis changes the rank");
    rb_broadcast(b, in, 1, out, fo);
    if (!axis_ok(b, a->i[0], out->ndim)) return;
    int f = fo[(int)a->i[0]];
    if (f >= 0) r->kind[f] = NBI_FACTOR_NEED_REPL;
    if (op == NBI_OP_CUMSUM) r->linear = NBI_LINEAR_UNARY;
    return;
  }
  case NBI_OP_RESHAPE:
    rb_reshape(b, in, out);
    r->linear = NBI_LINEAR_UNARY;
    return;
  case NBI_OP_PERMUTE:
    rb_permute(b, a, in, out);
    r->linear = NBI_LINEAR_UNARY;
    return;
  case NBI_OP_BROADCAST_TO:
    rb_broadcast_to(b, in, out);
    r->linear = NBI_LINEAR_UNARY;
    return;
  case NBI_OP_SLICE: {
    bool touched[NB_MAX_DIMS] = {false};
    for (int d = 0; d < in[0].ndim && d < out->ndim; d++)
      touched[d] = a->i[d] != 0 || a->i[NB_MAX_DIMS + d] != 1 || out->dims[d] != in[0].dims[d];
    rb_touched(b, in, out, touched);
    r->linear = NBI_LINEAR_UNARY;
    return;
  }
  case NBI_OP_PAD: {
    bool touched[NB_MAX_DIMS] = {false};
    for (int d = 0; d < in[0].ndim; d++)
      touched[d] = a->i[2 * d] != 0 || a->i[2 * d + 1] != 0;
    rb_touched(b, in, out, touched);
    /* padding with v adds v on every shard of a partial sum */
    r->linear = a->f[0] == 0 ? NBI_LINEAR_UNARY : NBI_LINEAR_NONE;
    return;
  }
  case NBI_OP_FLIP: {
    bool touched[NB_MAX_DIMS] = {false};
    for (int d = 0; d < in[0].ndim; d++)
      touched[d] = (a->i[0] >> d) & 1;
    rb_touched(b, in, out, touched);
    r->linear = NBI_LINEAR_UNARY;
    return;
  }
  case NBI_OP_CONCAT:
    rb_concat(b, a, in, n_in, out);
    r->linear = NBI_LINEAR_SUM;
    return;
  case NBI_OP_TAKE:
    rb_take(b, a, in, out);
    r->linear = NBI_LINEAR_FIRST;
    return;
  case NBI_OP_TAKE_ALONG_AXIS:
    rb_take_along(b, a, in, out);
    r->linear = NBI_LINEAR_FIRST;
    return;
  case NBI_OP_SCATTER_ADD: rb_scatter(b, a, in, out); return;
  case NBI_OP_SCATTER_ADD_ALONG_AXIS: rb_scatter_along(b, a, in, out); return;
  case NBI_OP_ONE_HOT: rb_one_hot(b, in, out); return;
  case NBI_OP_MATMUL:
    rb_matmul(b, in, out);
    r->linear = NBI_LINEAR_MULTI;
    return;
  case NBI_OP_CONV2D:
    rb_conv2d(b, a, in, n_in, out);
    r->linear = n_in == 2 ? NBI_LINEAR_MULTI : NBI_LINEAR_NONE;
    return;
  case NBI_OP_CONV2D_BWD_DATA:
    rb_conv_bwd_data(b, a, in, out);
    r->linear = NBI_LINEAR_MULTI;
    return;
  case NBI_OP_CONV2D_BWD_FILTER:
    rb_conv_bwd_filter(b, a, in, out);
    r->linear = NBI_LINEAR_MULTI;
    return;
  case NBI_OP_MAX_POOL2D:
  case NBI_OP_MAX_POOL2D_BWD:
  case NBI_OP_MAX_POOL2D_SELECT: rb_pool(b, in, n_in, out); return;
  default: /* tuple_get, remat, custom_call, cond, while_loop, scan */
    for (int k = 0; k < n_in; k++)
      rb_own(b, k, &in[k], NBI_FACTOR_NEED_REPL);
    rb_own(b, n_in, out, NBI_FACTOR_NEED_REPL);
    return;
  }
}

nb_status nbi_shard_rule_of(int op, const nbi_attrs *a, const nb_shape *in_shapes, int n_in,
                            const nb_shape *out, nbi_shard_rule *r) {
  const char *fn = "nbi_shard_rule_of";
  if (!r || !out || (n_in > 0 && !in_shapes) || n_in < 0)
    return nbi_error(NB_ERR_INTERNAL, "%s: NULL argument", fn);
  memset(r, 0, sizeof *r);
  if (op < 0 || op >= NBI_OP_COUNT) return nbi_error(NB_ERR_INTERNAL, "%s: op %d unknown", fn, op);
  const char *name = nbi_op_table[op]->name;
  int arity = nbi_op_table[op]->arity;
  bool arity_ok = arity >= 0            ? n_in == arity
                  : op == NBI_OP_CONV2D ? n_in == 2 || n_in == 3
                  : op == NBI_OP_CONCAT ? n_in >= 1
                                        : true;
  if (!arity_ok) return nbi_error(NB_ERR_INTERNAL, "%s: %s with %d operands", fn, name, n_in);
  if (n_in + 1 > NBI_RULE_MAX_TENSORS)
    return nbi_error(NB_ERR_INTERNAL, "%s: %s with %d operands (at most %d)", fn, name, n_in,
                     NBI_RULE_MAX_TENSORS - 1);
  for (int k = 0; k <= n_in; k++) {
    const nb_shape *s = k < n_in ? &in_shapes[k] : out;
    if (s->ndim < 0 || s->ndim > NB_MAX_DIMS)
      return nbi_error(NB_ERR_INTERNAL, "%s: %s: rank %d", fn, name, s->ndim);
    r->ndim[k] = s->ndim;
  }
  nbi_attrs zero = {0};
  rb b = {.r = r};
  r->n_in = n_in;
  r->n_out = 1;
  r->linear = NBI_LINEAR_NONE;
  rb_op(&b, op, a ? a : &zero, in_shapes, n_in, out);
  if (b.bad) {
    nbi_error(NB_ERR_INTERNAL, "%s: %s: %s", fn, name, b.why);
    memset(r, 0, sizeof *r);
    return NB_ERR_INTERNAL;
  }
  return NB_OK;
}
