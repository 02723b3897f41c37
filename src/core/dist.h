/* src/core/dist.h — the byte and collective transport between the processes of a job
 * (src/backends/mpi implements it; alone, without MPI, a local copy). Included
 * by the sharding layer's process collectives and the MPI backend only. */
#ifndef NABLA_DIST_H
#define NABLA_DIST_H

#include "nbi.h"

/* Bytes between the processes of the job (src/backends/mpi implements it;
 * alone, without MPI, it copies this process's own part): send holds, rank by
 * rank in order, scount[r] bytes for rank r; recv gets rcount[r] bytes from
 * each rank r, in rank order. Collective over every rank of the job (each
 * calls it, in the same order); sig is a number every rank passes equal (the
 * size of the whole exchange), compared first like every collective's
 * signature (include/nabla/distributed.h: deadline, errors). scount and
 * rcount have nb_world_size() entries. */
nb_status nbi_dist_exchange(const void *send, const int64_t *scount, void *recv,
                            const int64_t *rcount, int64_t sig);
/* ---- collectives of a group of the job's processes (src/backends/mpi) ------------
 * The transport of a sharding collective whose groups put their members on
 * distinct ranks (src/sharding/dist_coll.c): the matching MPI non-blocking
 * collective on a communicator of the group's ranks (made once per rank list,
 * cached; its own call sequence). Every member starts the same call (kind,
 * dtype, op, sig) on its group in the same order; the signature is compared
 * with the peers first (include/nabla/distributed.h: deadline, errors). Counts
 * are elements of dtype:
 *   ALL_REDUCE      count elements, reduced with op (NBI_DIST_SUM/MAX/MIN;
 *                   float MAX/MIN as nb_maximum/nb_minimum: NaN propagates,
 *                   ties keep the later rank's value; F32, F64, I32, I64)
 *   ALL_GATHER      rcount[q] elements from member q (its whole send), in order
 *   REDUCE_SCATTER  send holds rcount[q] elements for each member q in order;
 *                   this member receives its part reduced with op
 *   ALL_TO_ALL      scount[q] elements to member q, rcount[q] from it, in order
 *   PERMUTE         count elements to member dest, rcount[0] from member src
 *                   (-1: none; dest or src may be this member itself: a copy)
 * The received elements (nbi_dist_recv) are valid once nbi_dist_wait returned
 * NB_OK. A request must be freed (nbi_dist_free waits for it first). */
enum {
  NBI_DIST_ALL_REDUCE,
  NBI_DIST_ALL_GATHER,
  NBI_DIST_REDUCE_SCATTER,
  NBI_DIST_ALL_TO_ALL,
  NBI_DIST_PERMUTE
};
enum { NBI_DIST_SUM, NBI_DIST_MAX, NBI_DIST_MIN };
typedef struct nbi_dist_call {
  int kind;
  const int *ranks; /* [n]: the group's world ranks in group order */
  int n;
  nb_dtype dtype;
  int op;
  int64_t count;
  const int64_t *scount, *rcount; /* [n] (PERMUTE: rcount[0]) */
  int dest, src;                  /* PERMUTE: group positions, -1: none */
  int64_t sig;                    /* equal on every member (e.g. the group's total) */
  bool send_borrowed; /* send is the caller's memory (a tensor's buffer, nbi_host_borrow),
                         alive and unchanged until nbi_dist_free, which does not free it */
} nbi_dist_call;
typedef struct nbi_dist_req nbi_dist_req;
/* Staging memory for collectives: bytes (+1) that nbi_dist_buffer_free gives
 * back to a small cache the next call of a similar size reuses (fresh pages
 * cost a fault and a zeroing each). NULL when out of memory. */
void *nbi_dist_buffer(size_t bytes);
void nbi_dist_buffer_free(void *p);
/* Starts c with send (from nbi_dist_buffer; taken over, freed with the
 * request, also on failure; or borrowed: c->send_borrowed). NB_OK and *req,
 * or an error (the job's failure path). */
nb_status nbi_dist_start(const nbi_dist_call *c, void *send, nbi_dist_req **req);
/* Waits for r until done or the deadline; the same status on every call. */
nb_status nbi_dist_wait(nbi_dist_req *r);
void *nbi_dist_recv(nbi_dist_req *r);
/* nbi_dist_wait, then what r received (bytes) in dst: a group's all-reduce
 * folds and receives straight into dst (no receive copy); other calls copy
 * from their receive buffer. */
nb_status nbi_dist_wait_into(nbi_dist_req *r, void *dst, size_t bytes);
/* Waits for r if it was not (the buffers must outlive the transfer), frees it. */
void nbi_dist_free(nbi_dist_req *r);

#endif
