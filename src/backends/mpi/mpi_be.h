/* src/backends/mpi/mpi_be.h — collectives between the processes of the job on
 * host buffers: the transport the sharding layer's collectives take across
 * processes (CPU shards). Each call is collective: every rank calls it with the
 * same kind, count and dtype, in the same order. Before the data moves, the
 * ranks exchange a signature of the call (sequence number, kind, count, dtype,
 * op): a mismatch is NB_ERR_DISTRIBUTED on every rank. Every wait has the
 * deadline NABLA_COLLECTIVE_TIMEOUT_S; see include/nabla/distributed.h for what
 * happens on failure. In a process alone (no MPI, or a job of one) every call
 * is a local copy. Data moves with non-blocking MPI calls (MPI_I*), waited for
 * before returning; the calls that return before the data arrives (overlap)
 * are nbi_dist_start / nbi_dist_wait (src/core/nbi.h). */
#ifndef NABLA_BACKENDS_MPI_BE_H
#define NABLA_BACKENDS_MPI_BE_H

#include "../../core/nbi.h"
#include "../../core/dist.h"

enum { NBI_MPI_SUM, NBI_MPI_MAX, NBI_MPI_MIN };

/* buf[0..n) reduced over the ranks in place (op: NBI_MPI_*). */
nb_status nbi_mpi_allreduce(void *buf, int64_t n, nb_dtype dt, int op);
/* recv[r * n + i] = rank r's send[i]. */
nb_status nbi_mpi_allgather(const void *send, void *recv, int64_t n, nb_dtype dt);
/* recv[i] = op over ranks r of r's send[rank * n + i]. */
nb_status nbi_mpi_reduce_scatter(const void *send, void *recv, int64_t n, nb_dtype dt, int op);
/* recv[r * n + i] = rank r's send[rank * n + i]. */
nb_status nbi_mpi_alltoall(const void *send, void *recv, int64_t n, nb_dtype dt);
/* Sends send[0..n) to rank dest and receives recv[0..n) from rank src (-1: none;
 * recv is then left as it is). */
nb_status nbi_mpi_permute(const void *send, void *recv, int64_t n, nb_dtype dt, int dest, int src);

#endif
