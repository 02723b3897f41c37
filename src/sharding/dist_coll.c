/* src/sharding/dist_coll.c — the collectives of a mesh spanning processes
 * whose groups put each member on a rank of its own (contract: sharding.h,
 * "meshes spanning processes"). Each local member hands its block (or the
 * chunks the others need) to the matching MPI collective on its group's
 * ranks (nbi_dist_start: all-reduce, all-gather(v), reduce-scatter,
 * all-to-all(v), send/receive), so each moves what it must: an all-reduce
 * what MPI's algorithm moves (a ring: 2 (n-1)/n B per rank), a reduce-scatter
 * or all-to-all only the chunks that change hands, a ppermute one block.
 *
 * The result is the received data, reshaped and combined with the same public
 * ops as on the virtual mesh (nb_concat, nb_div_scalar): the same values bit
 * for bit, except float sums over groups of more than 2 ranks, which MPI may
 * associate differently ((a0 + a1) + (a2 + a3)): equal up to rounding. With
 * NABLA_MPI_EXACT=1 those go the whole-blocks way (collectives.c, fetch)
 * and are exact. Float maximum/minimum use MPI ops with nb_maximum's
 * semantics (exact).
 *
 * Overlap: the data moves while the program goes on. The result is a lazy
 * node (an internal custom op, "nabla.dist_wait") that waits for the transfer
 * when something realizes it, so the compute recorded between the collective
 * and its first consumer runs while the data moves (the gradients of several
 * parameters reduced as they are produced, waited for at the optimizer's
 * update). NABLA_MPI_OVERLAP=0 waits at once instead. */
#include "sharding.h"
#include "../core/dist.h"
#include "../core/oprules.h"

#include "../ops/rule_util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static bool env_on(const char *name, bool dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  return strcmp(v, "0") != 0;
}

bool nbi_dist_exact(void) { return env_on("NABLA_MPI_EXACT", false); }

/* ---- the wait node ------------------------------------------------------------------ */
typedef struct pending {
  nbi_dist_req *req;
  int64_t n; /* elements received */
  nb_dtype dt;
  nbi_buffer *hold; /* the buffer the request sends from (borrowed), or NULL */
} pending;

static nb_status wait_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in, nb_shape *os,
                            nb_dtype *od, int n_out) {
  (void)is, (void)id, (void)n_in, (void)n_out;
  const pending *p = u;
  os[0] = (nb_shape){.ndim = 1, .dims = {p->n}};
  od[0] = p->dt;
  return NB_OK;
}

static nb_status wait_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                          int n_out) {
  (void)in, (void)n_in, (void)n_out;
  pending *p = u;
  if (!p->req) return nbi_error(NB_ERR_INTERNAL, "nabla.dist_wait: waited for twice");
  nb_status st = nbi_dist_wait_into(p->req, out[0].data, (size_t)p->n * nb_dtype_size(p->dt));
  nbi_dist_free(p->req); /* the received copy is not needed any more */
  p->req = NULL;
  nbi_buffer_release(p->hold); /* nor the memory it sent from */
  p->hold = NULL;
  return st;
}

static void wait_release(void *u) {
  pending *p = u;
  nbi_dist_free(p->req);
  nbi_buffer_release(p->hold);
  free(p);
}

static const nb_custom_op *wait_op_;
static void register_wait(void) {
  wait_op_ = nb_custom_op_register(&(nb_custom_op_def){
      .name = "nabla.dist_wait", .n_in = 1, .n_out = 1, .infer = wait_infer, .cpu = wait_cpu});
}

/* A 1-D tensor of the n elements of dt req receives, on device dev; takes req
 * and hold (the buffer req sends from, or NULL), released when req is done. */
static nb_tensor *received(const char *fn, nbi_dist_req *req, int64_t n, nb_dtype dt, int dev,
                           nbi_buffer *hold) {
  nb_shape s = {.ndim = 1, .dims = {n}};
  if (env_on("NABLA_MPI_OVERLAP", true)) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_wait);
    nb_shape one = {.ndim = 0};
    nb_tensor *tick = nbi_leaf_alloc_on(fn, &one, NB_BOOL, dev); /* places the node on dev */
    pending *p = malloc(sizeof *p);
    if (!tick || !p || !wait_op_) {
      free(p);
      nbi_dist_free(req);
      nbi_buffer_release(hold);
      if (!wait_op_)
        nbi_error(NB_ERR_INTERNAL,
                  "%s: the internal op \"nabla.dist_wait\" is not registered "
                  "(a custom op of that name was registered first?)",
                  fn);
      else if (!nb_last_status())
        nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
      return NULL;
    }
    nbi_view tv = nbi_tensor_view(tick);
    bool zero = false;
    if (nbi_host_write(dev, &tv, &zero, NB_BOOL)) {
      free(p);
      nbi_dist_free(req);
      nbi_buffer_release(hold);
      return NULL;
    }
    *p = (pending){.req = req, .n = n, .dt = dt, .hold = hold};
    nb_tensor *y = NULL;
    return nbi_custom_call_user(wait_op_, &tick, 1, &y, 1, p, wait_release) ? NULL : y;
  }
  nb_status st = nbi_dist_wait(req);
  nb_tensor *t = st ? NULL : nbi_leaf_alloc_on(fn, &s, dt, dev);
  if (t && n) {
    nbi_view v = nbi_tensor_view(t);
    if (nbi_host_write(dev, &v, nbi_dist_recv(req), dt)) t = NULL;
  }
  nbi_dist_free(req);
  nbi_buffer_release(hold);
  return t;
}

/* ---- helpers -------------------------------------------------------------------------- */

static nb_shape chunk_shape(const nb_shape *s, int dim, int n, int r) {
  nb_shape c = *s;
  int64_t b, e;
  nbi_coll_chunk(s->dims[dim], n, r, &b, &e);
  c.dims[dim] = e - b;
  return c;
}

/* Copies ts[0..k) (realizing them) one after the other into a new buffer
 * (*buf; freed by the caller, also on failure). */
/* A collective may not carry a value nb_backward would differentiate. */
static nb_status sendable(const char *fn, const nb_mesh *m, const nb_tensor *t) {
  if (!t) return nb_last_status();
  if ((t->flags & (NBI_T_REQUIRES_GRAD | NBI_T_GRAD_PATH)) && !nbi_no_grad)
    return nbi_error(NB_ERR_DISTRIBUTED,
                     "%s: on mesh %s, which spans %d processes, a collective reached a value "
                     "nb_backward would differentiate: nb_backward does not run across "
                     "processes (differentiate with nb_grad or nb_value_and_grad, or compute "
                     "under nb_no_grad)",
                     fn, m->text, m->n_ranks);
  return NB_OK;
}

static nb_status pack(const char *fn, const nb_mesh *m, nb_tensor *const *ts, int k, void **buf) {
  size_t total = 0, off = 0;
  for (int i = 0; i < k; i++) {
    nb_status st = sendable(fn, m, ts[i]);
    if (st) return st;
    total += (size_t)nbi_numel(&ts[i]->shape) * nb_dtype_size(ts[i]->dtype);
  }
  if (!(*buf = nbi_dist_buffer(total))) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int i = 0; i < k; i++) {
    size_t b = (size_t)nbi_numel(&ts[i]->shape) * nb_dtype_size(ts[i]->dtype);
    nb_status st = b ? nb_to_host(ts[i], (char *)*buf + off, b) : NB_OK;
    if (st) return st;
    off += b;
  }
  return NB_OK;
}

/* Piece q of flat (1-D, pieces of shapes sh[0..n) one after the other)
 * reshaped to sh[q]. */
static nb_tensor *piece(nb_tensor *flat, const nb_shape *sh, int q) {
  int64_t off = 0;
  for (int i = 0; i < q; i++)
    off += nbi_numel(&sh[i]);
  int64_t b[1] = {off}, e[1] = {off + nbi_numel(&sh[q])};
  nb_tensor *s = flat->shape.dims[0] == e[0] - b[0] ? flat : nb_slice(flat, b, e, NULL);
  return s ? nb_reshape(s, sh[q]) : NULL;
}

/* The n pieces of flat (shapes sh[]) concatenated along dim a; a reshape when
 * the pieces lie that way already (every dim before a is 1). */
static nb_tensor *concat_pieces(nb_tensor *flat, const nb_shape *sh, int n, int a) {
  if (!flat) return NULL;
  nb_shape whole = sh[0];
  bool flat_ok = true;
  for (int q = 1; q < n; q++)
    whole.dims[a] += sh[q].dims[a];
  for (int k = 0; k < a; k++)
    flat_ok = flat_ok && whole.dims[k] == 1;
  if (flat_ok || n == 1) return n == 1 ? piece(flat, sh, 0) : nb_reshape(flat, whole);
  nb_tensor **ps = malloc(sizeof *ps * (size_t)n);
  if (!ps) {
    nbi_error(NB_ERR_OOM, "nabla: out of memory");
    return NULL;
  }
  bool ok = true;
  for (int q = 0; q < n && ok; q++)
    ok = (ps[q] = piece(flat, sh, q)) != NULL;
  nb_tensor *y = ok ? nb_concat(ps, n, a) : NULL;
  free(ps);
  return y;
}

/* The per-group state of one collective. */
typedef struct dctx {
  const char *fn;
  const nbi_dgroups *g;
  nb_tensor *const *phys;
  int *ranks;   /* [n]: world ranks of the current group */
  nb_shape *sh; /* [n] */
  int64_t *cnt; /* [2 n]: scount, rcount */
  int64_t sig;  /* elements of the group's blocks */
} dctx;

static int member(const dctx *c, int gi, int r) { return c->g->member[gi * c->g->n + r]; }

/* Loads group gi's ranks, block shapes and signature; the local member's
 * rank in the group, or -1. */
static int load(dctx *c, int gi) {
  int me = -1;
  c->sig = 0;
  for (int r = 0; r < c->g->n; r++) {
    int d = member(c, gi, r);
    c->ranks[r] = nbi_mesh_rank_of(c->g->m, d);
    c->sh[r] = c->phys[d]->shape;
    c->sig += nbi_numel(&c->sh[r]);
    if (nbi_mesh_local(c->g->m, d)) me = r;
  }
  return me;
}

typedef nb_status (*member_fn)(dctx *c, int gi, int me, nb_tensor **out);
typedef nb_shape (*shape_fn)(const dctx *c, int r, const void *arg);

/* Runs fn for the local member of every group (in group order, the same on
 * every rank) and gives the remote members remote blocks of shape_of. */
static nb_status each_group(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys,
                            member_fn run, shape_fn shape_of, const void *arg, nb_tensor **out) {
  int n = g->n;
  dctx c = {.fn = fn, .g = g, .phys = phys};
  c.ranks = malloc(sizeof *c.ranks * (size_t)n);
  c.sh = malloc(sizeof *c.sh * (size_t)n);
  c.cnt = malloc(sizeof *c.cnt * 2 * (size_t)n);
  nb_status st = c.ranks && c.sh && c.cnt ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int gi = 0; gi < g->n_groups && !st; gi++) {
    int me = load(&c, gi);
    if (me >= 0) st = run(&c, gi, me, out);
    for (int r = 0; r < n && !st; r++) {
      int d = member(&c, gi, r);
      if (r == me) continue;
      nb_shape s = shape_of(&c, r, arg);
      if (!(out[d] = nbi_remote_block(g->m, d, &s, g->dtype))) st = nb_last_status();
    }
  }
  free(c.ranks), free(c.sh), free(c.cnt);
  return st;
}

static int dist_op(int op) {
  return op == NB_REDUCE_MAX ? NBI_DIST_MAX : op == NB_REDUCE_MIN ? NBI_DIST_MIN : NBI_DIST_SUM;
}

/* ---- the collectives ---------------------------------------------------------------- */
typedef struct args {
  int op, a, sa, ca;
  const int *src_of, *dest_of;
} args;

static nb_shape same_shape(const dctx *c, int r, const void *arg) {
  (void)arg;
  return c->sh[r];
}

static _Thread_local const args *cur; /* the running collective's arguments */

/* What a member sends: its own buffer when the host can read it in place
 * (nbi_host_borrow: realized, contiguous, on the CPU; *hold then keeps it
 * until the messages are done), else a packed copy (*hold NULL). On failure
 * nothing is held. */
static nb_status send_from(const dctx *c, nb_tensor *x, void **send, nbi_buffer **hold) {
  const void *in_place = NULL;
  *send = NULL, *hold = NULL;
  nb_status st = sendable(c->fn, c->g->m, x);
  if (!st) st = nbi_realize(&x, 1);
  if (st) return st;
  if (nbi_host_borrow(x, &in_place, hold)) {
    *send = (void *)in_place;
    return NB_OK;
  }
  if ((st = pack(c->fn, c->g->m, &x, 1, send))) {
    nbi_dist_buffer_free(*send);
    *send = NULL;
  }
  return st;
}

/* An all-reduce sends from the member's own buffer (send_from), and its wait
 * folds and receives into the result's buffer (nbi_dist_wait_into): no
 * staging copy either way (two 1 MiB copies were a third of a 1 MiB call). */
static nb_status ar_member(dctx *c, int gi, int me, nb_tensor **out) {
  int d = member(c, gi, me);
  void *send;
  nbi_buffer *hold;
  nb_status st = send_from(c, c->phys[d], &send, &hold);
  if (st) return st;
  int64_t n = nbi_numel(&c->sh[me]);
  nbi_dist_req *q;
  nbi_dist_call call = {.kind = NBI_DIST_ALL_REDUCE,
                        .ranks = c->ranks,
                        .n = c->g->n,
                        .dtype = c->g->dtype,
                        .op = dist_op(cur->op),
                        .count = n,
                        .sig = c->sig,
                        .send_borrowed = hold != NULL};
  if ((st = nbi_dist_start(&call, send, &q))) {
    nbi_buffer_release(hold);
    return st;
  }
  nb_tensor *y = received(c->fn, q, n, c->g->dtype, c->g->m->dev_table[d], hold);
  if (y) y = nb_reshape(y, c->sh[me]);
  if (y && cur->op == NB_REDUCE_MEAN) y = nb_div_scalar(y, c->g->n);
  return (out[d] = y) ? NB_OK : nb_last_status();
}

nb_status nbi_dist_all_reduce(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys, int op,
                              nb_tensor **out) {
  args a = {.op = op};
  cur = &a;
  return each_group(fn, g, phys, ar_member, same_shape, NULL, out);
}

static nb_shape gathered_shape(const dctx *c, int r, const void *arg) {
  (void)r, (void)arg;
  nb_shape s = c->sh[0];
  for (int q = 1; q < c->g->n; q++)
    s.dims[cur->a] += c->sh[q].dims[cur->a];
  return s;
}

static nb_status ag_member(dctx *c, int gi, int me, nb_tensor **out) {
  int d = member(c, gi, me), n = c->g->n;
  void *send;
  nbi_buffer *hold;
  nb_status st = send_from(c, c->phys[d], &send, &hold);
  if (st) return st;
  int64_t *rc = c->cnt + n;
  for (int q = 0; q < n; q++)
    rc[q] = nbi_numel(&c->sh[q]);
  nbi_dist_req *qr;
  nbi_dist_call call = {.kind = NBI_DIST_ALL_GATHER,
                        .ranks = c->ranks,
                        .n = n,
                        .dtype = c->g->dtype,
                        .rcount = rc,
                        .sig = c->sig,
                        .send_borrowed = hold != NULL};
  if ((st = nbi_dist_start(&call, send, &qr))) {
    nbi_buffer_release(hold);
    return st;
  }
  nb_tensor *y = concat_pieces(
      received(c->fn, qr, c->sig, c->g->dtype, c->g->m->dev_table[d], hold), c->sh, n, cur->a);
  return (out[d] = y) ? NB_OK : nb_last_status();
}

nb_status nbi_dist_all_gather(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys, int a,
                              nb_tensor **out) {
  args x = {.a = a};
  cur = &x;
  return each_group(fn, g, phys, ag_member, gathered_shape, NULL, out);
}

static nb_shape scattered_shape(const dctx *c, int r, const void *arg) {
  (void)arg;
  return chunk_shape(&c->sh[0], cur->a, c->g->n, r);
}

/* Packs the chunks of block d along dim for every member (scount). */
static nb_status pack_chunks(dctx *c, int d, int dim, void **send) {
  int n = c->g->n;
  nb_tensor **ch = malloc(sizeof *ch * (size_t)n);
  if (!ch) return nbi_error(NB_ERR_OOM, "%s: out of memory", c->fn);
  nb_status st = NB_OK;
  for (int q = 0; q < n && !st; q++) {
    if (!(ch[q] = nbi_coll_chunk_of(c->phys[d], dim, n, q)))
      st = nb_last_status();
    else
      c->cnt[q] = nbi_numel(&ch[q]->shape);
  }
  if (!st) st = pack(c->fn, c->g->m, ch, n, send);
  free(ch);
  return st;
}

static nb_status rs_member(dctx *c, int gi, int me, nb_tensor **out) {
  int d = member(c, gi, me), n = c->g->n;
  void *send = NULL;
  nb_status st = pack_chunks(c, d, cur->a, &send);
  if (st) {
    nbi_dist_buffer_free(send);
    return st;
  }
  nbi_dist_req *q;
  nbi_dist_call call = {.kind = NBI_DIST_REDUCE_SCATTER,
                        .ranks = c->ranks,
                        .n = n,
                        .dtype = c->g->dtype,
                        .op = NBI_DIST_SUM,
                        .rcount = c->cnt,
                        .sig = c->sig};
  if ((st = nbi_dist_start(&call, send, &q))) return st;
  nb_tensor *y = received(c->fn, q, c->cnt[me], c->g->dtype, c->g->m->dev_table[d], NULL);
  if (y) y = nb_reshape(y, chunk_shape(&c->sh[me], cur->a, n, me));
  return (out[d] = y) ? NB_OK : nb_last_status();
}

nb_status nbi_dist_reduce_scatter(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys,
                                  int a, nb_tensor **out) {
  args x = {.a = a};
  cur = &x;
  return each_group(fn, g, phys, rs_member, scattered_shape, NULL, out);
}

/* The shape member r ends up with: the chunks r of every member's block
 * along sa, concatenated along ca. */
static nb_shape a2a_shape(const dctx *c, int r, const void *arg) {
  (void)arg;
  nb_shape s = chunk_shape(&c->sh[0], cur->sa, c->g->n, r);
  for (int q = 1; q < c->g->n; q++)
    s.dims[cur->ca] += chunk_shape(&c->sh[q], cur->sa, c->g->n, r).dims[cur->ca];
  return s;
}

static nb_status a2a_member(dctx *c, int gi, int me, nb_tensor **out) {
  int d = member(c, gi, me), n = c->g->n;
  void *send = NULL;
  nb_status st = pack_chunks(c, d, cur->sa, &send);
  nb_shape *from = st ? NULL : malloc(sizeof *from * (size_t)n);
  if (!st && !from) st = nbi_error(NB_ERR_OOM, "%s: out of memory", c->fn);
  if (st) {
    nbi_dist_buffer_free(send);
    return st;
  }
  int64_t *rc = c->cnt + n, total = 0;
  for (int q = 0; q < n; q++) {
    from[q] = chunk_shape(&c->sh[q], cur->sa, n, me);
    total += rc[q] = nbi_numel(&from[q]);
  }
  nbi_dist_req *q;
  nbi_dist_call call = {.kind = NBI_DIST_ALL_TO_ALL,
                        .ranks = c->ranks,
                        .n = n,
                        .dtype = c->g->dtype,
                        .scount = c->cnt,
                        .rcount = rc,
                        .sig = c->sig};
  nb_tensor *y = NULL;
  if (!(st = nbi_dist_start(&call, send, &q)))
    y = concat_pieces(received(c->fn, q, total, c->g->dtype, c->g->m->dev_table[d], NULL), from, n,
                      cur->ca);
  free(from);
  if (st) return st;
  return (out[d] = y) ? NB_OK : nb_last_status();
}

nb_status nbi_dist_all_to_all(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys,
                              int split, int concat, nb_tensor **out) {
  args x = {.sa = split, .ca = concat};
  cur = &x;
  return each_group(fn, g, phys, a2a_member, a2a_shape, NULL, out);
}

static nb_shape permuted_shape(const dctx *c, int r, const void *arg) {
  (void)arg;
  return c->sh[cur->src_of[r] >= 0 ? cur->src_of[r] : r];
}

static nb_status pp_member(dctx *c, int gi, int me, nb_tensor **out) {
  int d = member(c, gi, me), src = cur->src_of[me], dest = cur->dest_of[me];
  if (src == me) src = -1, dest = -1; /* keeps its own block: nothing moves */
  void *send = NULL;
  nb_status st = dest >= 0 ? pack(c->fn, c->g->m, &c->phys[d], 1, &send) : NB_OK;
  if (st) {
    nbi_dist_buffer_free(send);
    return st;
  }
  int64_t rc = src >= 0 ? nbi_numel(&c->sh[src]) : 0;
  nbi_dist_req *q;
  nbi_dist_call call = {.kind = NBI_DIST_PERMUTE,
                        .ranks = c->ranks,
                        .n = c->g->n,
                        .dtype = c->g->dtype,
                        .count = dest >= 0 ? nbi_numel(&c->sh[me]) : 0,
                        .rcount = &rc,
                        .dest = dest,
                        .src = src,
                        .sig = c->sig};
  if ((st = nbi_dist_start(&call, send, &q))) return st;
  nb_tensor *y;
  if (src >= 0) {
    y = received(c->fn, q, rc, c->g->dtype, c->g->m->dev_table[d], NULL);
    if (y) y = nb_reshape(y, c->sh[src]);
  } else {
    nbi_dist_free(q);
    y = cur->src_of[me] == me ? c->phys[d] : nbi_zeros_of(&c->sh[me], c->g->dtype);
  }
  return (out[d] = y) ? NB_OK : nb_last_status();
}

nb_status nbi_dist_ppermute(const char *fn, const nbi_dgroups *g, nb_tensor *const *phys,
                            const int *src_of, nb_tensor **out) {
  int n = g->n;
  int *dest_of = malloc(sizeof *dest_of * (size_t)n);
  if (!dest_of) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int r = 0; r < n; r++)
    dest_of[r] = -1;
  for (int r = 0; r < n; r++)
    if (src_of[r] >= 0) dest_of[src_of[r]] = r;
  args x = {.src_of = src_of, .dest_of = dest_of};
  cur = &x;
  nb_status st = each_group(fn, g, phys, pp_member, permuted_shape, NULL, out);
  free(dest_of);
  return st;
}
