/* src/backends/mpi/mpi.c — the job (nb_init_distributed, ranks) and the host
 * collectives between its processes (mpi_be.h), over Open MPI when built with
 * `make MPI=1` (NABLA_MPI); otherwise the job is this process alone.
 *
 * Two communicators duplicate MPI_COMM_WORLD (errors return codes): one for the
 * signatures, one for the data. A collective first sends its signature
 * (sequence number, kind, count, dtype, op) to every other rank and receives
 * theirs (point to point, so a rank that never arrives is named when the
 * deadline passes), compares them, then moves the data with the non-blocking
 * MPI call, polled until done or the deadline. O(ranks) signature messages per
 * call: meant for the few ranks of a CPU mesh. A group's all-reduce (groups of
 * up to 8) is point to point instead: up to 16 KiB its data rides in the
 * signature's message (fast_start), past that two rounds of chunks follow the
 * signature (split_start); both fold in group order, the virtual mesh's. */
#include "mpi_be.h"
#include "../../core/dist.h"

#include <nabla/distributed.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static nb_distributed_error_fn on_error;
static void *on_error_user;

void nb_on_distributed_error(nb_distributed_error_fn fn, void *user) {
  on_error = fn;
  on_error_user = user;
}

static int rank_, world_ = 1, local_rank_;
static char prefix[48];

/* ---- staging buffers (dist.h: nbi_dist_buffer) ---------------------------------------------
 * A collective's send and receive copies are fresh memory each call; at 256 KiB
 * and more malloc maps new pages, so every call paid a page fault and a
 * zeroing per 4 KiB, and an all-reduce took 9-10x MPI's own time (bench-mpi).
 * Freed buffers wait here for the next call of a similar size: STAGE_SLOTS of
 * them, at most STAGE_CAP bytes in all. */
enum { STAGE_SLOTS = 8 };
#define STAGE_CAP ((size_t)256 << 20)
typedef struct stage_hdr {
  size_t cap;    /* bytes after the header */
  size_t pad[7]; /* keeps the data 64-byte aligned after malloc's 16 */
} stage_hdr;
static pthread_mutex_t stage_lock = PTHREAD_MUTEX_INITIALIZER;
static stage_hdr *stage_free[STAGE_SLOTS];
static size_t stage_bytes;

void *nbi_dist_buffer(size_t bytes) {
  size_t want = bytes + 1;
  stage_hdr *h = NULL;
  pthread_mutex_lock(&stage_lock);
  int best = -1;
  for (int i = 0; i < STAGE_SLOTS; i++) {
    stage_hdr *f = stage_free[i];
    if (f && f->cap >= want && f->cap / 2 <= want && (best < 0 || f->cap < stage_free[best]->cap))
      best = i;
  }
  if (best >= 0) {
    h = stage_free[best];
    stage_free[best] = NULL;
    stage_bytes -= h->cap;
  }
  pthread_mutex_unlock(&stage_lock);
  if (!h && (h = malloc(sizeof *h + want))) h->cap = want;
  return h ? h + 1 : NULL;
}

void nbi_dist_buffer_free(void *p) {
  if (!p) return;
  stage_hdr *h = (stage_hdr *)p - 1, *drop = h;
  pthread_mutex_lock(&stage_lock);
  if (h->cap <= STAGE_CAP) {
    int slot = -1; /* an empty slot, else the smallest buffer if h is larger */
    for (int i = 0; i < STAGE_SLOTS && slot < 0; i++)
      if (!stage_free[i]) slot = i;
    for (int i = 0; i < STAGE_SLOTS && slot < 0; i++)
      if (stage_free[i]->cap < h->cap && (slot < 0 || stage_free[i]->cap < stage_free[slot]->cap))
        slot = i;
    if (slot >= 0) {
      stage_hdr *old = stage_free[slot];
      size_t after = stage_bytes - (old ? old->cap : 0) + h->cap;
      if (after <= STAGE_CAP) {
        drop = old;
        stage_free[slot] = h;
        stage_bytes = after;
      }
    }
  }
  pthread_mutex_unlock(&stage_lock);
  free(drop);
}

int nb_rank(void) { return rank_; }
int nb_world_size(void) { return world_; }
int nb_local_rank(void) { return local_rank_; }
const char *nb_rank_prefix(void) { return prefix; }

static void set_prefix(void) {
  if (world_ > 1)
    snprintf(prefix, sizeof prefix, "[rank %d/%d] ", rank_, world_);
  else
    prefix[0] = '\0';
}

#ifndef NABLA_MPI
/* Size of a job launched by mpirun, from its environment (0: not launched). */
static int launched_size(void) {
  const char *v = getenv("OMPI_COMM_WORLD_SIZE");
  if (!v) v = getenv("PMI_SIZE");
  return v ? atoi(v) : 0;
}

nb_status nb_init_distributed(int *argc, char ***argv) {
  (void)argc, (void)argv;
  if (launched_size() > 1)
    return nbi_error(NB_ERR_DISTRIBUTED,
                     "nb_init_distributed: started by mpirun with %d processes, but this nabla "
                     "was built without MPI (rebuild with `make MPI=1`)",
                     launched_size());
  set_prefix();
  return NB_OK;
}
nb_status nb_finalize(void) { return NB_OK; }

static nb_status alone(const void *send, void *recv, int64_t n, nb_dtype dt) {
  if (send != recv && n > 0) memmove(recv, send, (size_t)n * nb_dtype_size(dt));
  return NB_OK;
}
nb_status nbi_mpi_allreduce(void *buf, int64_t n, nb_dtype dt, int op) {
  (void)buf, (void)n, (void)dt, (void)op;
  return NB_OK;
}
nb_status nbi_mpi_allgather(const void *send, void *recv, int64_t n, nb_dtype dt) {
  return alone(send, recv, n, dt);
}
nb_status nbi_mpi_reduce_scatter(const void *send, void *recv, int64_t n, nb_dtype dt, int op) {
  (void)op;
  return alone(send, recv, n, dt);
}
nb_status nbi_mpi_alltoall(const void *send, void *recv, int64_t n, nb_dtype dt) {
  return alone(send, recv, n, dt);
}
nb_status nbi_mpi_permute(const void *send, void *recv, int64_t n, nb_dtype dt, int dest, int src) {
  if (dest > 0 || src > 0)
    return nbi_error(NB_ERR_DISTRIBUTED, "nabla: permute to rank %d from rank %d in a job of 1",
                     dest, src);
  return src == 0 ? alone(send, recv, n, dt) : NB_OK;
}
nb_status nbi_dist_exchange(const void *send, const int64_t *scount, void *recv,
                            const int64_t *rcount, int64_t sig) {
  (void)sig;
  if (scount[0] != rcount[0])
    return nbi_error(NB_ERR_INTERNAL, "nabla: exchange of %lld bytes receiving %lld",
                     (long long)scount[0], (long long)rcount[0]);
  if (scount[0] > 0 && send != recv) memmove(recv, send, (size_t)scount[0]);
  return NB_OK;
}

nb_status nbi_dist_start(const nbi_dist_call *c, void *send, nbi_dist_req **req) {
  if (!c || !c->send_borrowed) nbi_dist_buffer_free(send);
  *req = NULL;
  return nbi_error(NB_ERR_DISTRIBUTED, "nabla: a collective between processes in a nabla built "
                                       "without MPI (rebuild with `make MPI=1`)");
}
nb_status nbi_dist_wait(nbi_dist_req *r) {
  (void)r;
  return NB_ERR_DISTRIBUTED;
}
void *nbi_dist_recv(nbi_dist_req *r) {
  (void)r;
  return NULL;
}
nb_status nbi_dist_wait_into(nbi_dist_req *r, void *dst, size_t bytes) {
  (void)r, (void)dst, (void)bytes;
  return NB_ERR_DISTRIBUTED;
}
void nbi_dist_free(nbi_dist_req *r) { (void)r; }

#else /* NABLA_MPI */
#include <mpi.h>
#include <stdarg.h>
#include <sched.h>
#include <time.h>

static MPI_Comm sig_comm = MPI_COMM_NULL, data_comm = MPI_COMM_NULL;
static bool joined, we_initialized;
static uint64_t seq; /* collectives called so far (equal on every rank) */

static double timeout_s(void) {
  const char *v = getenv("NABLA_COLLECTIVE_TIMEOUT_S");
  double t = v ? atof(v) : 0;
  return t > 0 ? t : 300;
}

/* Reports a failed collective: to the handler, else on stderr and MPI_Abort. */
static nb_status fail(nb_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static nb_status fail(nb_status s, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  nbi_error(s, "%s%s", prefix, msg);
  if (on_error) {
    on_error(s, nb_last_error(), on_error_user);
    return s;
  }
  fprintf(stderr, "nabla: %s%s (NB_ERR_DISTRIBUTED): aborting the job\n", prefix, msg);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 3);
  return s;
}

static nb_status mpi_fail(const char *what, int rc) {
  char err[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, err, &len);
  return fail(NB_ERR_DISTRIBUTED, "%s: MPI error: %s", what, err);
}

nb_status nb_init_distributed(int *argc, char ***argv) {
  if (joined) return NB_OK;
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      return nbi_error(NB_ERR_DISTRIBUTED, "nb_init_distributed: MPI_Init_thread failed");
    we_initialized = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_free(&node);
  }
  if (MPI_Comm_dup(MPI_COMM_WORLD, &sig_comm) != MPI_SUCCESS ||
      MPI_Comm_dup(MPI_COMM_WORLD, &data_comm) != MPI_SUCCESS)
    return nbi_error(NB_ERR_DISTRIBUTED, "nb_init_distributed: MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(sig_comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(data_comm, MPI_ERRORS_RETURN);
  joined = true;
  set_prefix();
  return NB_OK;
}

static void free_groups(void), free_ops(void);

nb_status nb_finalize(void) {
  if (!joined) return NB_OK;
  MPI_Barrier(MPI_COMM_WORLD);
  free_groups();
  free_ops();
  MPI_Comm_free(&sig_comm);
  MPI_Comm_free(&data_comm);
  joined = false;
  if (we_initialized) MPI_Finalize();
  rank_ = 0, world_ = 1, local_rank_ = 0;
  set_prefix();
  return NB_OK;
}

static void nap(void) { nanosleep(&(struct timespec){0, 20000}, NULL); }

/* Polls reqs[0..n) until all are done or the deadline; on the deadline,
 * missing (if given) gets which are not done. */
static bool wait_all(MPI_Request *reqs, int n, double deadline, bool *missing, int *rc) {
  /* Open MPI moves a non-blocking collective's rounds only inside MPI calls,
   * so the wait keeps calling: without pause for the first 200 us (a short
   * collective is done by then), then yielding the core between polls (other
   * ranks or threads sharing it run) up to 0.1 s, and only then napping. A nap
   * is at least the timer slack (~60 us): napping after 200 us made every
   * all-reduce of 256 KiB or more 9-10x slower than MPI's own (bench-mpi). */
  double t0 = MPI_Wtime(), spin_until = t0 + 200e-6, yield_until = t0 + 0.1;
  for (;;) {
    int all = 1;
    *rc = MPI_Testall(n, reqs, &all, MPI_STATUSES_IGNORE);
    if (*rc != MPI_SUCCESS || all) return *rc == MPI_SUCCESS;
    if (MPI_Wtime() > deadline) {
      for (int i = 0; missing && i < n; i++) {
        int done = 0;
        MPI_Test(&reqs[i], &done, MPI_STATUS_IGNORE);
        missing[i] = !done;
      }
      return false;
    }
    double now = MPI_Wtime();
    if (now > yield_until)
      nap();
    else if (now > spin_until)
      sched_yield();
  }
}

enum { SIG_WORDS = 5 };
/* Small all-reduces of a group (nbi_dist_start) send their data in the
 * signature's message (FAST_MAX_BYTES at most, groups of FAST_MAX_MEMBERS):
 * one message round instead of a signature round and then MPI_Iallreduce,
 * whose non-blocking form also costs Open MPI twice its blocking one. Every
 * signature receive takes up to RECV_MAX bytes, so a rank whose program
 * differs (a fast message against a plain signature) is named, not truncated. */
enum { FAST_MAX_BYTES = 16384, FAST_MAX_MEMBERS = 8 };
#define SIG_BYTES ((size_t)SIG_WORDS * sizeof(int64_t))
#define RECV_MAX (SIG_BYTES + FAST_MAX_BYTES)
static const char *const kinds[] = {"all_reduce", "all_gather", "reduce_scatter",
                                    "all_to_all", "permute",    "exchange"};
enum { N_KINDS = sizeof kinds / sizeof kinds[0] };

/* "n elements of dt", or "n bytes" for the exchange (which moves bytes). */
static const char *amount(char *buf, size_t len, int kind, int64_t n, int64_t dt) {
  if (kind == 5)
    snprintf(buf, len, "%lld bytes", (long long)n);
  else
    snprintf(buf, len, "%lld elements of %s", (long long)n,
             dt >= 0 && dt < NB_DTYPE_COUNT ? nb_dtype_name((nb_dtype)dt) : "?");
  return buf;
}

/* Whether rank r's signature o is ours (mine: call kind of n elements of dt);
 * else the failure naming both calls. */
static nb_status sig_compare(int kind, const int64_t *mine, const int64_t *o, int64_t n,
                             nb_dtype dt, int r) {
  if (memcmp(o, mine, SIG_BYTES) == 0) return NB_OK;
  char a[64], b[64];
  return fail(NB_ERR_DISTRIBUTED,
              "%s (call %llu, %s): rank %d called %s (call %lld, %s): the ranks' programs differ",
              kinds[kind], (unsigned long long)mine[0], amount(a, sizeof a, kind, n, dt), r,
              o[1] >= 0 && o[1] < N_KINDS ? kinds[o[1]] : "?", (long long)o[0],
              amount(b, sizeof b, (int)o[1], o[2], o[3]));
}

/* The signature exchange of collective kind (n elements of dt, op), the
 * *seqp-th call of its communicator; peers: the ranks it talks to (NULL:
 * all). */
static nb_status check_signature_on(uint64_t *seqp, int kind, int64_t n, nb_dtype dt, int op,
                                    const bool *peers) {
  int64_t mine[SIG_WORDS] = {(int64_t)++ * seqp, kind, n, dt, op};
  char *theirs = nbi_dist_buffer(RECV_MAX * (size_t)world_);
  MPI_Request *reqs = malloc(sizeof *reqs * 2 * (size_t)world_);
  bool *missing = calloc((size_t)world_, sizeof *missing);
  if (!theirs || !reqs || !missing) {
    nbi_dist_buffer_free(theirs), free(reqs), free(missing);
    return nbi_error(NB_ERR_OOM, "nabla: %s: out of memory", kinds[kind]);
  }
  int nr = 0;
  int *who = malloc(sizeof *who * (size_t)world_);
  int n_recv = 0;
  for (int r = 0; r < world_ && who; r++) {
    if (r == rank_ || (peers && !peers[r])) continue;
    MPI_Irecv(theirs + RECV_MAX * (size_t)r, (int)RECV_MAX, MPI_BYTE, r, 7, sig_comm,
              &reqs[n_recv]);
    who[n_recv++] = r;
  }
  nr = n_recv;
  for (int r = 0; r < world_ && who; r++) {
    if (r == rank_ || (peers && !peers[r])) continue;
    MPI_Isend(mine, (int)SIG_BYTES, MPI_BYTE, r, 7, sig_comm, &reqs[nr++]);
  }
  nb_status st = NB_OK;
  int rc = MPI_SUCCESS;
  double t = timeout_s();
  if (!who) {
    st = nbi_error(NB_ERR_OOM, "nabla: %s: out of memory", kinds[kind]);
  } else if (!wait_all(reqs, nr, MPI_Wtime() + t, missing, &rc)) {
    if (rc != MPI_SUCCESS) {
      st = mpi_fail(kinds[kind], rc);
    } else {
      char list[256] = "";
      size_t len = 0;
      for (int i = 0; i < n_recv; i++)
        if (missing[i] && len + 12 < sizeof list)
          len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "", who[i]);
      st = fail(NB_ERR_DISTRIBUTED,
                "%s (call %llu): no word from rank(s) %s within %.0f s "
                "(NABLA_COLLECTIVE_TIMEOUT_S)",
                kinds[kind], (unsigned long long)mine[0], len ? list : "?", t);
    }
  } else {
    for (int i = 0; i < n_recv && !st; i++) {
      int64_t o[SIG_WORDS];
      memcpy(o, theirs + RECV_MAX * (size_t)who[i], sizeof o);
      st = sig_compare(kind, mine, o, n, dt, who[i]);
    }
  }
  free(who), nbi_dist_buffer_free(theirs), free(reqs), free(missing);
  return st;
}

static nb_status check_signature(int kind, int64_t n, nb_dtype dt, int op, const bool *peers) {
  return check_signature_on(&seq, kind, n, dt, op, peers);
}

static MPI_Datatype mpi_type(nb_dtype dt) {
  switch (dt) {
  case NB_F32: return MPI_FLOAT;
  case NB_F64: return MPI_DOUBLE;
  case NB_I32: return MPI_INT32_T;
  case NB_I64: return MPI_INT64_T;
  case NB_BOOL: return MPI_UINT8_T;
  case NB_U8: return MPI_UINT8_T;
  case NB_I8: return MPI_INT8_T;
  case NB_I16: return MPI_INT16_T;
  default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(int op) {
  return op == NBI_MPI_MAX ? MPI_MAX : op == NBI_MPI_MIN ? MPI_MIN : MPI_SUM;
}

/* Waits for the data phase of a collective. */
static nb_status finish(int kind, MPI_Request *reqs, int n) {
  int rc = MPI_SUCCESS;
  double t = timeout_s();
  if (wait_all(reqs, n, MPI_Wtime() + t, NULL, &rc)) return NB_OK;
  if (rc != MPI_SUCCESS) return mpi_fail(kinds[kind], rc);
  return fail(NB_ERR_DISTRIBUTED, "%s (call %llu): the data did not arrive within %.0f s",
              kinds[kind], (unsigned long long)seq, t);
}

static bool too_big(int64_t n, nb_dtype dt) {
  return n < 0 || (double)n * (double)nb_dtype_size(dt) > (double)(1u << 31) - 1;
}

/* f16/bf16 reductions: staged as f32 (and rounded once at the end). */
static nb_status reduce_half(void *buf, int64_t n, nb_dtype dt, int op, const void *send,
                             int64_t n_send, bool scatter) {
  float *w = malloc(sizeof *w * (size_t)(n_send > 0 ? n_send : 1));
  float *r = scatter ? malloc(sizeof *r * (size_t)(n > 0 ? n : 1)) : w;
  if (!w || !r) {
    free(w);
    if (r != w) free(r);
    return nbi_error(NB_ERR_OOM, "nabla: %s: out of memory",
                     scatter ? "reduce_scatter" : "all_reduce");
  }
  for (int64_t i = 0; i < n_send; i++)
    w[i] = (float)nbi_load_f64(send, dt, i);
  nb_status st =
      scatter ? nbi_mpi_reduce_scatter(w, r, n, NB_F32, op) : nbi_mpi_allreduce(w, n, NB_F32, op);
  for (int64_t i = 0; !st && i < n; i++)
    nbi_store_f64(buf, dt, i, r[i]);
  free(w);
  if (r != w) free(r);
  return st;
}

nb_status nbi_mpi_allreduce(void *buf, int64_t n, nb_dtype dt, int op) {
  if (!joined || world_ == 1) return NB_OK;
  if (dt == NB_F16 || dt == NB_BF16) return reduce_half(buf, n, dt, op, buf, n, false);
  if (too_big(n, dt) || mpi_type(dt) == MPI_DATATYPE_NULL)
    return nbi_error(NB_ERR_DTYPE, "nabla: all_reduce of %lld %s over MPI", (long long)n,
                     nb_dtype_name(dt));
  nb_status st = check_signature(0, n, dt, op, NULL);
  if (st) return st;
  MPI_Request r;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(dt), mpi_op(op), data_comm, &r);
  return rc != MPI_SUCCESS ? mpi_fail("all_reduce", rc) : finish(0, &r, 1);
}

nb_status nbi_mpi_allgather(const void *send, void *recv, int64_t n, nb_dtype dt) {
  size_t es = nb_dtype_size(dt);
  if (!joined || world_ == 1) {
    if (n > 0 && send != recv) memmove(recv, send, (size_t)n * es);
    return NB_OK;
  }
  if (too_big(n * world_, dt))
    return nbi_error(NB_ERR_OVERFLOW, "nabla: all_gather of %lld elements", (long long)n);
  nb_status st = check_signature(1, n, dt, 0, NULL);
  if (st) return st;
  MPI_Request r;
  int rc = MPI_Iallgather(send, (int)((size_t)n * es), MPI_BYTE, recv, (int)((size_t)n * es),
                          MPI_BYTE, data_comm, &r);
  return rc != MPI_SUCCESS ? mpi_fail("all_gather", rc) : finish(1, &r, 1);
}

nb_status nbi_mpi_reduce_scatter(const void *send, void *recv, int64_t n, nb_dtype dt, int op) {
  if (!joined || world_ == 1) {
    if (n > 0 && send != recv) memmove(recv, send, (size_t)n * nb_dtype_size(dt));
    return NB_OK;
  }
  if (dt == NB_F16 || dt == NB_BF16) return reduce_half(recv, n, dt, op, send, n * world_, true);
  if (too_big(n * world_, dt) || mpi_type(dt) == MPI_DATATYPE_NULL)
    return nbi_error(NB_ERR_DTYPE, "nabla: reduce_scatter of %lld %s over MPI", (long long)n,
                     nb_dtype_name(dt));
  nb_status st = check_signature(2, n, dt, op, NULL);
  if (st) return st;
  MPI_Request r;
  int rc = MPI_Ireduce_scatter_block(send, recv, (int)n, mpi_type(dt), mpi_op(op), data_comm, &r);
  return rc != MPI_SUCCESS ? mpi_fail("reduce_scatter", rc) : finish(2, &r, 1);
}

nb_status nbi_mpi_alltoall(const void *send, void *recv, int64_t n, nb_dtype dt) {
  size_t es = nb_dtype_size(dt);
  if (!joined || world_ == 1) {
    if (n > 0 && send != recv) memmove(recv, send, (size_t)n * es);
    return NB_OK;
  }
  if (too_big(n * world_, dt))
    return nbi_error(NB_ERR_OVERFLOW, "nabla: all_to_all of %lld elements", (long long)n);
  nb_status st = check_signature(3, n, dt, 0, NULL);
  if (st) return st;
  MPI_Request r;
  int rc = MPI_Ialltoall(send, (int)((size_t)n * es), MPI_BYTE, recv, (int)((size_t)n * es),
                         MPI_BYTE, data_comm, &r);
  return rc != MPI_SUCCESS ? mpi_fail("all_to_all", rc) : finish(3, &r, 1);
}

nb_status nbi_mpi_permute(const void *send, void *recv, int64_t n, nb_dtype dt, int dest, int src) {
  size_t es = nb_dtype_size(dt);
  if (dest >= world_ || src >= world_)
    return nbi_error(NB_ERR_DISTRIBUTED, "nabla: permute to rank %d from rank %d in a job of %d",
                     dest, src, world_);
  if (!joined || world_ == 1) {
    if (src == 0 && n > 0 && send != recv) memmove(recv, send, (size_t)n * es);
    return NB_OK;
  }
  if (too_big(n, dt))
    return nbi_error(NB_ERR_OVERFLOW, "nabla: permute of %lld elements", (long long)n);
  bool *peers = calloc((size_t)world_, sizeof *peers);
  if (!peers) return nbi_error(NB_ERR_OOM, "nabla: permute: out of memory");
  if (dest >= 0) peers[dest] = true;
  if (src >= 0) peers[src] = true;
  nb_status st = check_signature(4, n, dt, 0, peers);
  free(peers);
  if (st) return st;
  MPI_Request r[2];
  int k = 0, rc = MPI_SUCCESS;
  if (src >= 0) rc = MPI_Irecv(recv, (int)((size_t)n * es), MPI_BYTE, src, 9, data_comm, &r[k++]);
  if (rc == MPI_SUCCESS && dest >= 0)
    rc = MPI_Isend(send, (int)((size_t)n * es), MPI_BYTE, dest, 9, data_comm, &r[k++]);
  return rc != MPI_SUCCESS ? mpi_fail("permute", rc) : finish(4, r, k);
}

/* The sharding layer's exchange (nbi.h): MPI_Ialltoallv of bytes, counts and
 * displacements as int (a part over 2 GiB is an error). */
nb_status nbi_dist_exchange(const void *send, const int64_t *scount, void *recv,
                            const int64_t *rcount, int64_t sig) {
  if (!joined || world_ == 1) {
    if (scount[0] != rcount[0])
      return nbi_error(NB_ERR_INTERNAL, "nabla: exchange of %lld bytes receiving %lld",
                       (long long)scount[0], (long long)rcount[0]);
    if (scount[0] > 0 && send != recv) memmove(recv, send, (size_t)scount[0]);
    return NB_OK;
  }
  int *c = malloc(sizeof *c * 4 * (size_t)world_);
  if (!c) return nbi_error(NB_ERR_OOM, "nabla: exchange: out of memory");
  int *sc = c, *sd = c + world_, *rc_ = c + 2 * world_, *rd = c + 3 * world_;
  int64_t so = 0, ro = 0;
  for (int r = 0; r < world_; r++) {
    sc[r] = (int)scount[r], sd[r] = (int)so, rc_[r] = (int)rcount[r], rd[r] = (int)ro;
    so += scount[r], ro += rcount[r];
    if (scount[r] < 0 || rcount[r] < 0 || so > INT32_MAX || ro > INT32_MAX) {
      free(c);
      return nbi_error(NB_ERR_OVERFLOW,
                       "nabla: a collective moves more than 2 GiB to or from one process");
    }
  }
  nb_status st = check_signature(5, sig, NB_BOOL, 0, NULL);
  if (!st) {
    MPI_Request r;
    int rc = MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc_, rd, MPI_BYTE, data_comm, &r);
    st = rc != MPI_SUCCESS ? mpi_fail("exchange", rc) : finish(5, &r, 1);
  }
  free(c);
  return st;
}

/* ---- collectives of a group of ranks (nbi.h, nbi_dist_start) --------------------------
 * One communicator per rank list (MPI_Comm_create_group over data_comm, made
 * the first time the list is used, after the signature check proved its
 * members in the same call; the sharding layer starts its groups' calls in
 * the same global order on every rank, so the creations never wait in a
 * cycle), with its own call sequence. */
typedef struct gcomm {
  int n, *ranks;
  MPI_Comm comm;
  uint64_t seq;
} gcomm;
static gcomm *gcomms;
static int n_gcomms, cap_gcomms;

static gcomm *group_of(const int *ranks, int n) {
  for (int i = 0; i < n_gcomms; i++)
    if (gcomms[i].n == n && !memcmp(gcomms[i].ranks, ranks, sizeof *ranks * (size_t)n))
      return &gcomms[i];
  if (n_gcomms == cap_gcomms) {
    int cap = cap_gcomms ? 2 * cap_gcomms : 8;
    gcomm *g = realloc(gcomms, sizeof *g * (size_t)cap);
    if (!g) return NULL;
    gcomms = g, cap_gcomms = cap;
  }
  int *r = malloc(sizeof *r * (size_t)n);
  if (!r) return NULL;
  memcpy(r, ranks, sizeof *r * (size_t)n);
  gcomms[n_gcomms] = (gcomm){.n = n, .ranks = r, .comm = MPI_COMM_NULL};
  return &gcomms[n_gcomms++];
}

static nb_status group_comm(gcomm *g) {
  if (g->comm != MPI_COMM_NULL) return NB_OK;
  MPI_Group world, sub;
  int rc = MPI_Comm_group(data_comm, &world);
  if (rc == MPI_SUCCESS) {
    rc = MPI_Group_incl(world, g->n, g->ranks, &sub);
    MPI_Group_free(&world);
  }
  if (rc == MPI_SUCCESS) {
    rc = MPI_Comm_create_group(data_comm, sub, 11, &g->comm);
    MPI_Group_free(&sub);
  }
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
  return rc == MPI_SUCCESS ? NB_OK : mpi_fail("a group's communicator", rc);
}

static void free_groups(void) {
  for (int i = 0; i < n_gcomms; i++) {
    if (gcomms[i].comm != MPI_COMM_NULL) MPI_Comm_free(&gcomms[i].comm);
    free(gcomms[i].ranks);
  }
  free(gcomms);
  gcomms = NULL, n_gcomms = cap_gcomms = 0;
}

/* Float maximum / minimum as nb_maximum / nb_minimum (src/backends/ew_formulas.h):
 * NaN propagates, ties keep the later operand. Not commutative, so MPI
 * combines in rank order (a0 op a1 op ...): the virtual mesh's values. */
#define MAXMIN_LOOP(T, CMP)                                                                        \
  do {                                                                                             \
    const T *a = in;                                                                               \
    T *b = io;                                                                                     \
    for (int i = 0; i < *len; i++)                                                                 \
      b[i] = (a[i] CMP b[i] || a[i] != a[i]) ? a[i] : b[i];                                        \
  } while (0)
static void float_max(void *in, void *io, int *len, MPI_Datatype *dt) {
  if (*dt == MPI_FLOAT)
    MAXMIN_LOOP(float, >);
  else
    MAXMIN_LOOP(double, >);
}
static void float_min(void *in, void *io, int *len, MPI_Datatype *dt) {
  if (*dt == MPI_FLOAT)
    MAXMIN_LOOP(float, <);
  else
    MAXMIN_LOOP(double, <);
}
static MPI_Op op_fmax = MPI_OP_NULL, op_fmin = MPI_OP_NULL;

static MPI_Op dist_op(int op, nb_dtype dt) {
  bool fl = dt == NB_F32 || dt == NB_F64;
  if (op == NBI_DIST_MAX) {
    if (!fl) return MPI_MAX;
    if (op_fmax == MPI_OP_NULL) MPI_Op_create(float_max, 0, &op_fmax);
    return op_fmax;
  }
  if (op == NBI_DIST_MIN) {
    if (!fl) return MPI_MIN;
    if (op_fmin == MPI_OP_NULL) MPI_Op_create(float_min, 0, &op_fmin);
    return op_fmin;
  }
  return MPI_SUM;
}

static void free_ops(void) {
  if (op_fmax != MPI_OP_NULL) MPI_Op_free(&op_fmax);
  if (op_fmin != MPI_OP_NULL) MPI_Op_free(&op_fmin);
}

struct nbi_dist_req {
  MPI_Request r[2];
  int nr, kind;
  uint64_t seq;
  void *send, *recv;
  int *cnt; /* counts and displacements of the v-calls (live until done) */
  bool waited;
  bool send_borrowed; /* send is the caller's (not freed here) */
  void *dst;          /* fast / split: where the result goes (nbi_dist_wait_into), else recv */
  nb_status st;
  /* a small all-reduce (fast_start): every member's signature and data land in
   * stage[i * msg] (msg bytes: SIG_BYTES, then count elements); the reduction
   * in group order happens at the wait */
  bool fast;
  bool split; /* a larger all-reduce in two rounds of messages (split_start) */
  int phase;  /* split: 1 while the chunks travel, 2 while the reduced ones do */
  char *stage;
  size_t msg;
  MPI_Request *rv;
  int nrv, n, me, op;
  int *peer;      /* [nrv / 2]: the member each receive is from */
  MPI_Comm comm_; /* split: the group's communicator */
  int *ranks;
  nb_dtype dt;
  int64_t count;
};

void *nbi_dist_recv(nbi_dist_req *r) { return r ? r->recv : NULL; }

/* ---- small all-reduces: the data in the signature's message --------------------------- */
static bool fast_ok(const nbi_dist_call *c) {
  return c->kind == NBI_DIST_ALL_REDUCE && c->n <= FAST_MAX_MEMBERS && c->count >= 0 &&
         (size_t)c->count * nb_dtype_size(c->dtype) <= FAST_MAX_BYTES;
}

/* A point-to-point all-reduce's request (fast_start, split_start): the call's
 * group and element type, a stage of stage_bytes, room for 2 n requests and
 * the members each receive is from. */
static nb_status p2p_init(nbi_dist_req *q, const nbi_dist_call *c, int me, size_t stage_bytes) {
  int n = c->n;
  q->n = n, q->me = me, q->op = c->op, q->dt = c->dtype, q->count = c->count;
  q->stage = nbi_dist_buffer(stage_bytes);
  q->rv = malloc(sizeof *q->rv * 2 * (size_t)n);
  q->peer = malloc(sizeof *q->peer * (size_t)n);
  q->ranks = malloc(sizeof *q->ranks * (size_t)n);
  if (!q->stage || !q->rv || !q->peer || !q->ranks)
    return nbi_error(NB_ERR_OOM, "nabla: all_reduce: out of memory");
  memcpy(q->ranks, c->ranks, sizeof *q->ranks * (size_t)n);
  return NB_OK;
}

/* Sends this member's signature and data to every other member and posts the
 * receives of theirs (q->send holds the data). */
static nb_status fast_start(nbi_dist_req *q, const nbi_dist_call *c, gcomm *g, int me) {
  int n = c->n;
  size_t es = nb_dtype_size(c->dtype);
  q->fast = true;
  q->msg = SIG_BYTES + (size_t)c->count * es;
  nb_status st = p2p_init(q, c, me, RECV_MAX * (size_t)n);
  if (st) return st;
  int64_t sig[SIG_WORDS] = {(int64_t)++g->seq, c->kind, c->sig, c->dtype, c->op};
  q->seq = g->seq;
  char *mine = q->stage + RECV_MAX * (size_t)me;
  memcpy(mine, sig, SIG_BYTES);
  if (c->count) memcpy(mine + SIG_BYTES, q->send, (size_t)c->count * es);
  int rc = MPI_SUCCESS, k = 0;
  for (int i = 0; i < n && rc == MPI_SUCCESS; i++)
    if (i != me) {
      rc = MPI_Irecv(q->stage + RECV_MAX * (size_t)i, (int)RECV_MAX, MPI_BYTE, c->ranks[i], 7,
                     sig_comm, &q->rv[k]);
      q->peer[k++] = i;
    }
  for (int i = 0; i < n && rc == MPI_SUCCESS; i++)
    if (i != me) rc = MPI_Isend(mine, (int)q->msg, MPI_BYTE, c->ranks[i], 7, sig_comm, &q->rv[k++]);
  q->nrv = k;
  return rc == MPI_SUCCESS ? NB_OK : mpi_fail("all_reduce", rc);
}

/* acc = acc op x over n elements of dt, as the group path's MPI ops: sums wrap
 * for integers, float max/min propagate NaN and keep x on ties (dist_op). */
#define FAST_FOLD(T, U)                                                                            \
  do {                                                                                             \
    T *a = acc;                                                                                    \
    const T *b = x;                                                                                \
    for (int64_t i = 0; i < n; i++) {                                                              \
      if (op == NBI_DIST_MAX)                                                                      \
        a[i] = (a[i] > b[i] || a[i] != a[i]) ? a[i] : b[i];                                        \
      else if (op == NBI_DIST_MIN)                                                                 \
        a[i] = (a[i] < b[i] || a[i] != a[i]) ? a[i] : b[i];                                        \
      else                                                                                         \
        a[i] = (T)((U)a[i] + (U)b[i]);                                                             \
    }                                                                                              \
  } while (0)
static void fast_fold(void *acc, const void *x, int64_t n, nb_dtype dt, int op) {
  switch (dt) {
  case NB_F32: FAST_FOLD(float, float); break;
  case NB_F64: FAST_FOLD(double, double); break;
  case NB_I32: FAST_FOLD(int32_t, uint32_t); break;
  case NB_I64: FAST_FOLD(int64_t, uint64_t); break;
  case NB_I16: FAST_FOLD(int16_t, uint16_t); break;
  case NB_I8: FAST_FOLD(int8_t, uint8_t); break;
  default: FAST_FOLD(uint8_t, uint8_t); break; /* u8, bool */
  }
}

/* Waits for q's point-to-point messages (q->rv; the first n - 1 are the
 * receives, from members q->peer[]) until the deadline; on the deadline the
 * members not heard from are named. */
static nb_status p2p_wait(nbi_dist_req *q, double deadline) {
  int rc = MPI_SUCCESS;
  bool *missing = calloc((size_t)q->nrv + 1, sizeof *missing);
  if (!missing) return nbi_error(NB_ERR_OOM, "nabla: all_reduce: out of memory");
  nb_status st = NB_OK;
  if (!wait_all(q->rv, q->nrv, deadline, missing, &rc)) {
    if (rc != MPI_SUCCESS) {
      st = mpi_fail("all_reduce", rc);
    } else {
      char list[256] = "", round[16] = "";
      size_t len = 0;
      for (int k = 0; k < q->n - 1; k++)
        if (missing[k] && len + 12 < sizeof list)
          len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? ", " : "",
                                  q->ranks[q->peer[k]]);
      if (q->split) snprintf(round, sizeof round, ", round %d", q->phase);
      st = fail(NB_ERR_DISTRIBUTED,
                "all_reduce (call %llu of its group%s): no word from rank(s) %s within %.0f s "
                "(NABLA_COLLECTIVE_TIMEOUT_S)",
                (unsigned long long)q->seq, round, len ? list : "?", timeout_s());
    }
  }
  free(missing);
  return st;
}

/* The wait of a small all-reduce: every message in by the deadline, every
 * signature ours, then the members' data folded in group order into recv. */
static nb_status fast_finish(nbi_dist_req *q) {
  nb_status st = p2p_wait(q, MPI_Wtime() + timeout_s());
  const int64_t *mine = (const int64_t *)(const void *)(q->stage + RECV_MAX * (size_t)q->me);
  for (int i = 0; i < q->n && !st; i++) {
    int64_t o[SIG_WORDS];
    memcpy(o, q->stage + RECV_MAX * (size_t)i, sizeof o);
    st = sig_compare(0, mine, o, q->count, q->dt, q->ranks[i]);
  }
  if (st) return st;
  size_t bytes = (size_t)q->count * nb_dtype_size(q->dt);
  void *res = q->dst ? q->dst : q->recv;
  if (bytes) memcpy(res, q->stage + SIG_BYTES, bytes);
  for (int i = 1; i < q->n; i++)
    fast_fold(res, q->stage + RECV_MAX * (size_t)i + SIG_BYTES, q->count, q->dt, q->op);
  return NB_OK;
}

/* ---- larger all-reduces: two rounds of point-to-point messages --------------------------
 * Open MPI's MPI_Iallreduce ran at 1.5-2x the time of its blocking MPI_Allreduce
 * (2 ranks, 64 KiB - 4 MiB), where a plain exchange of messages matched the
 * blocking call. So a group all-reduce past FAST_MAX_BYTES (groups of up to
 * FAST_MAX_MEMBERS) splits the elements into n chunks: each member sends chunk
 * i to member i and receives its own chunk from everyone (round 1), folds them
 * in group order (as the one-message path does: the same values at every
 * size), then sends its reduced chunk to everyone and receives theirs (round
 * 2): 2 (n - 1) / n of the data sent per member, as a ring. Round 1 is posted
 * by nbi_dist_start, round 2 by the wait. */
static int64_t chunk_at(int64_t count, int n, int i) { return count * i / n; }

static nb_status split_start(nbi_dist_req *q, const nbi_dist_call *c, gcomm *g, int me) {
  int n = c->n;
  size_t es = nb_dtype_size(c->dtype);
  q->split = true, q->phase = 1;
  int64_t mine = chunk_at(c->count, n, me + 1) - chunk_at(c->count, n, me);
  q->msg = (size_t)mine * es; /* one slot of the stage: a member's copy of my chunk */
  nb_status st = p2p_init(q, c, me, q->msg * (size_t)n);
  if (st) return st;
  q->comm_ = g->comm;
  int rc = MPI_SUCCESS, k = 0;
  for (int i = 0; i < n && rc == MPI_SUCCESS; i++)
    if (i != me) {
      rc = MPI_Irecv(q->stage + q->msg * (size_t)i, (int)q->msg, MPI_BYTE, i, 21, g->comm,
                     &q->rv[k]);
      q->peer[k++] = i;
    }
  for (int i = 0; i < n && rc == MPI_SUCCESS; i++)
    if (i != me) {
      int64_t a = chunk_at(c->count, n, i), b = chunk_at(c->count, n, i + 1);
      rc = MPI_Isend((char *)q->send + (size_t)a * es, (int)((size_t)(b - a) * es), MPI_BYTE, i, 21,
                     g->comm, &q->rv[k++]);
    }
  q->nrv = k;
  return rc == MPI_SUCCESS ? NB_OK : mpi_fail("all_reduce", rc);
}

/* The wait of a split all-reduce: round 1 in, my chunk folded in group order
 * into recv, round 2 out and in. */
static nb_status split_finish(nbi_dist_req *q) {
  double deadline = MPI_Wtime() + timeout_s();
  nb_status st = p2p_wait(q, deadline);
  if (st) return st;
  size_t es = nb_dtype_size(q->dt);
  int n = q->n, me = q->me;
  int64_t a = chunk_at(q->count, n, me), len = chunk_at(q->count, n, me + 1) - a;
  char *res = q->dst ? q->dst : q->recv, *out = res + (size_t)a * es;
  for (int i = 0; i < n; i++) {
    const char *part =
        i == me ? (const char *)q->send + (size_t)a * es : q->stage + q->msg * (size_t)i;
    if (i == 0)
      memcpy(out, part, (size_t)len * es);
    else
      fast_fold(out, part, len, q->dt, q->op);
  }
  q->phase = 2;
  int rc = MPI_SUCCESS, k = 0;
  for (int i = 0; i < n && rc == MPI_SUCCESS; i++)
    if (i != me) {
      int64_t b0 = chunk_at(q->count, n, i), b1 = chunk_at(q->count, n, i + 1);
      rc = MPI_Irecv(res + (size_t)b0 * es, (int)((size_t)(b1 - b0) * es), MPI_BYTE, i, 22,
                     q->comm_, &q->rv[k]);
      q->peer[k++] = i;
    }
  for (int i = 0; i < n && rc == MPI_SUCCESS; i++)
    if (i != me)
      rc = MPI_Isend(out, (int)((size_t)len * es), MPI_BYTE, i, 22, q->comm_, &q->rv[k++]);
  q->nrv = k;
  if (rc != MPI_SUCCESS) return mpi_fail("all_reduce", rc);
  return p2p_wait(q, deadline);
}

nb_status nbi_dist_wait(nbi_dist_req *q) {
  if (!q) return nbi_error(NB_ERR_NULL, "nabla: nbi_dist_wait of NULL");
  if (q->waited) return q->st;
  q->waited = true;
  if (q->fast) return q->st = fast_finish(q);
  if (q->split) return q->st = split_finish(q);
  int rc = MPI_SUCCESS;
  double t = timeout_s();
  if (q->nr == 0 || wait_all(q->r, q->nr, MPI_Wtime() + t, NULL, &rc))
    q->st = NB_OK;
  else if (rc != MPI_SUCCESS)
    q->st = mpi_fail(kinds[q->kind], rc);
  else
    q->st = fail(NB_ERR_DISTRIBUTED,
                 "%s (call %llu of its group): the data did not arrive "
                 "within %.0f s (NABLA_COLLECTIVE_TIMEOUT_S)",
                 kinds[q->kind], (unsigned long long)q->seq, t);
  return q->st;
}

nb_status nbi_dist_wait_into(nbi_dist_req *q, void *dst, size_t bytes) {
  if (q && !q->waited && (q->fast || q->split)) { /* folded and received in place */
    q->dst = dst;
    nb_status st = nbi_dist_wait(q);
    q->dst = NULL;
    return st;
  }
  nb_status st = nbi_dist_wait(q);
  if (!st && bytes) memcpy(dst, nbi_dist_recv(q), bytes);
  return st;
}

void nbi_dist_free(nbi_dist_req *q) {
  if (!q) return;
  if (!q->waited && joined) {
    nb_status keep = nb_last_status();
    char msg[512];
    if (keep) snprintf(msg, sizeof msg, "%s", nb_last_error());
    nbi_dist_wait(q); /* MPI still writes into recv until done */
    if (keep) nbi_error(keep, "%s", msg);
  }
  if (!q->send_borrowed) nbi_dist_buffer_free(q->send);
  nbi_dist_buffer_free(q->recv);
  nbi_dist_buffer_free(q->stage);
  free(q->cnt);
  free(q->rv);
  free(q->peer);
  free(q->ranks);
  free(q);
}

static int64_t sum_of(const int64_t *c, int n) {
  int64_t s = 0;
  for (int i = 0; i < n; i++)
    s += c[i];
  return s;
}

/* Fills cnt[0..n) with c[]*es and disp[0..n) with their running sums (bytes);
 * false when one does not fit an int. */
static bool byte_counts(const int64_t *c, int n, size_t es, int *cnt, int *disp) {
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    int64_t b = c[i] * (int64_t)es;
    if (c[i] < 0 || b > INT32_MAX || off > INT32_MAX) return false;
    cnt[i] = (int)b, disp[i] = (int)off;
    off += b;
  }
  return off <= INT32_MAX;
}

nb_status nbi_dist_start(const nbi_dist_call *c, void *send, nbi_dist_req **req) {
  *req = NULL;
  nbi_dist_req *q = calloc(1, sizeof *q);
  const char *fn = c && c->kind >= 0 && c->kind < 5 ? kinds[c->kind] : "collective";
  if (!q) {
    if (!c || !c->send_borrowed) nbi_dist_buffer_free(send);
    return nbi_error(NB_ERR_OOM, "nabla: %s: out of memory", fn);
  }
  q->send = send, q->kind = c ? c->kind : 0, q->send_borrowed = c && c->send_borrowed;
  nb_status st = NB_OK;
  int me = -1, n = c ? c->n : 0;
  for (int i = 0; i < n && c->ranks; i++)
    if (c->ranks[i] == rank_) me = i;
  size_t es = c ? nb_dtype_size(c->dtype) : 1;
  bool reduces = c && (c->kind == NBI_DIST_ALL_REDUCE || c->kind == NBI_DIST_REDUCE_SCATTER);
  if (!joined || !c || c->kind < 0 || c->kind > NBI_DIST_PERMUTE || n < 1 || !c->ranks || me < 0 ||
      (reduces && mpi_type(c->dtype) == MPI_DATATYPE_NULL))
    st = nbi_error(NB_ERR_INTERNAL, "nabla: %s between processes: a bad call", fn);
  bool *peers = st ? NULL : calloc((size_t)world_, sizeof *peers);
  gcomm *g = st ? NULL : group_of(c->ranks, n);
  q->cnt = st ? NULL : malloc(sizeof *q->cnt * 4 * (size_t)n + 1);
  if (!st && (!peers || !g || !q->cnt)) st = nbi_error(NB_ERR_OOM, "nabla: %s: out of memory", fn);
  int64_t recv_n = 0;
  for (int i = 0; i < n && !st; i++) {
    if (c->ranks[i] < 0 || c->ranks[i] >= world_)
      st = nbi_error(NB_ERR_INTERNAL, "nabla: %s: rank %d in a job of %d", fn, c->ranks[i], world_);
    else if (i != me && (c->kind != NBI_DIST_PERMUTE || i == c->dest || i == c->src))
      peers[c->ranks[i]] = true;
  }
  if (!st) {
    switch (c->kind) {
    case NBI_DIST_ALL_REDUCE: recv_n = c->count; break;
    case NBI_DIST_REDUCE_SCATTER: recv_n = c->rcount[me]; break;
    case NBI_DIST_PERMUTE: recv_n = c->src >= 0 ? c->rcount[0] : 0; break;
    default: recv_n = sum_of(c->rcount, n);
    }
    if (recv_n < 0 || (double)recv_n * (double)es > (double)INT32_MAX)
      st = nbi_error(NB_ERR_OVERFLOW, "nabla: %s: more than 2 GiB to one process", fn);
  }
  if (!st && !(q->recv = nbi_dist_buffer((size_t)recv_n * es)))
    st = nbi_error(NB_ERR_OOM, "nabla: %s: out of memory", fn);
  if (!st && fast_ok(c)) { /* the signature and the data in one message */
    free(peers);
    st = fast_start(q, c, g, me);
    if (st) {
      if (q->nrv) q->stage = NULL; /* MPI may still write there: left to the job's end */
      q->waited = true;
      nbi_dist_free(q);
      return st;
    }
    *req = q;
    return NB_OK;
  }
  if (!st) st = check_signature_on(&g->seq, c->kind, c->sig, c->dtype, c->op, peers);
  q->seq = g ? g->seq : 0;
  if (!st) st = group_comm(g);
  free(peers);
  int rc = MPI_SUCCESS;
  int *cnt = q->cnt, *sd = cnt + n, *rcn = cnt + 2 * n, *rd = cnt + 3 * n;
  MPI_Datatype t = st ? MPI_DATATYPE_NULL : mpi_type(c->dtype);
  if (!st) switch (c->kind) {
    case NBI_DIST_ALL_REDUCE:
      if (n <= FAST_MAX_MEMBERS) {
        st = split_start(q, c, g, me);
        if (st && q->nrv) q->stage = NULL; /* MPI may still write there: left to the job's end */
      } else {
        rc = MPI_Iallreduce(send, q->recv, (int)c->count, t, dist_op(c->op, c->dtype), g->comm,
                            &q->r[q->nr++]);
      }
      break;
    case NBI_DIST_REDUCE_SCATTER:
      for (int i = 0; i < n; i++)
        if (c->rcount[i] < 0 || c->rcount[i] > INT32_MAX) st = NB_ERR_OVERFLOW;
      for (int i = 0; i < n; i++)
        cnt[i] = (int)c->rcount[i];
      if (!st)
        rc = MPI_Ireduce_scatter(send, q->recv, cnt, t, dist_op(c->op, c->dtype), g->comm,
                                 &q->r[q->nr++]);
      break;
    case NBI_DIST_ALL_GATHER:
      if (!byte_counts(c->rcount, n, es, rcn, rd))
        st = NB_ERR_OVERFLOW;
      else
        rc = MPI_Iallgatherv(send, rcn[me], MPI_BYTE, q->recv, rcn, rd, MPI_BYTE, g->comm,
                             &q->r[q->nr++]);
      break;
    case NBI_DIST_ALL_TO_ALL:
      if (!byte_counts(c->scount, n, es, cnt, sd) || !byte_counts(c->rcount, n, es, rcn, rd))
        st = NB_ERR_OVERFLOW;
      else
        rc = MPI_Ialltoallv(send, cnt, sd, MPI_BYTE, q->recv, rcn, rd, MPI_BYTE, g->comm,
                            &q->r[q->nr++]);
      break;
    case NBI_DIST_PERMUTE: {
      int64_t sb = c->count * (int64_t)es;
      if (c->count < 0 || sb > INT32_MAX) {
        st = NB_ERR_OVERFLOW;
      } else if (c->src == me) { /* a copy of this member's own block */
        if (c->dest != me)
          st = NB_ERR_INTERNAL;
        else if (sb)
          memcpy(q->recv, send, (size_t)sb);
      } else {
        if (c->src >= 0)
          rc = MPI_Irecv(q->recv, (int)(recv_n * (int64_t)es), MPI_BYTE, c->src, 9, g->comm,
                         &q->r[q->nr++]);
        if (rc == MPI_SUCCESS && c->dest >= 0)
          rc = MPI_Isend(send, (int)sb, MPI_BYTE, c->dest, 9, g->comm, &q->r[q->nr++]);
      }
      break;
    }
    }
  if (st == NB_ERR_OVERFLOW || st == NB_ERR_INTERNAL)
    st = nbi_error(st, "nabla: %s: a part over 2 GiB or a bad permutation", fn);
  if (!st && rc != MPI_SUCCESS) st = mpi_fail(fn, rc);
  if (st) {
    q->waited = true; /* nothing in flight that completes: free at once */
    nbi_dist_free(q);
    return st;
  }
  *req = q;
  return NB_OK;
}
#endif
