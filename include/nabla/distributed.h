/* nabla/distributed.h — many processes: the job mpirun started.
 *
 * Built with `make MPI=1` (Open MPI), nb_init_distributed joins the job: every
 * process learns its rank, the job's size and its rank among the processes of
 * its node (which picks its local GPU). Without MPI, or when the program was
 * not started by mpirun, the job is this one process: rank 0 of 1.
 *
 * Failure is an error, never a hang: MPI calls return codes (MPI_ERRORS_RETURN),
 * and every wait on a collective has a deadline (NABLA_COLLECTIVE_TIMEOUT_S,
 * default 300 s), after which the rank reports NB_ERR_DISTRIBUTED naming the
 * collective and the ranks not heard from, then aborts the job (MPI_Abort)
 * unless a handler was installed with nb_on_distributed_error. Before each
 * collective the ranks compare a signature of it (kind, element count, dtype):
 * a mismatch (a shape that differs between ranks) is reported on every rank.
 *
 * Meshes spanning the processes: nb_mesh_world (nabla/sharding.h). Each
 * process holds only its own devices' blocks; the collectives between ranks
 * go over MPI and give the values of the same program on one process's
 * virtual mesh. Reading a sharded tensor (nb_to_host, nb_item, nb_print)
 * gathers it on every rank, so every rank must read it; nb_print prints on
 * rank 0 only unless NABLA_PRINT_ALL_RANKS=1 (then every rank, after its
 * nb_rank_prefix()).
 */
#ifndef NABLA_DISTRIBUTED_H
#define NABLA_DISTRIBUTED_H

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Joins the job (MPI_Init_thread; argc/argv may be NULL). Idempotent. In a
 * build without MPI, NB_OK when the process is alone, NB_ERR_DISTRIBUTED when
 * mpirun started several (rebuild with `make MPI=1`). */
nb_status nb_init_distributed(int *argc, char ***argv);
int nb_rank(void);       /* 0 before nb_init_distributed or without MPI */
int nb_world_size(void); /* 1 before nb_init_distributed or without MPI */
int nb_local_rank(void); /* rank among the processes of this node */
/* Leaves the job (MPI_Finalize) after every rank reached it. Idempotent. */
nb_status nb_finalize(void);
/* "[rank r/n] " once the job has several processes, else "": a prefix for
 * log lines (printf("%sloss %g\n", nb_rank_prefix(), loss)). */
const char *nb_rank_prefix(void);

/* Called with the error instead of aborting the job when a collective fails
 * (deadline passed, signature mismatch, MPI error); the collective then
 * returns that status. NULL restores the default (report and MPI_Abort). */
typedef void (*nb_distributed_error_fn)(nb_status s, const char *message, void *user);
void nb_on_distributed_error(nb_distributed_error_fn fn, void *user);

#ifdef __cplusplus
}
#endif
#endif
