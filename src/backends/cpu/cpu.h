/* src/backends/cpu/cpu.h — the CPU backend's kernel table, its threading
 * thresholds, and helpers shared by CPU kernels. */
#ifndef NABLA_CPU_H
#define NABLA_CPU_H

#include "../backend.h"
#include "../../core/oprules.h"

/* ---- the kernel table (kernels.c) ---------------------------------------------------------
 * The CPU kernel of op (nbi_kernel contract), or NULL when the CPU has none:
 * constants, placeholders, views that always succeed, the ops core runs itself
 * (exec), and ops out of range. Every other op of ops.def has one. */
nbi_kernel nbi_cpu_kernel_of(int op);
/* The vtable's supports and run_op (ctx unused, NULL allowed): whether op has
 * a kernel (for every valid result dtype dt), and running node n's kernel,
 * which requires that it has one. The emulated device (src/backends/emu)
 * answers and runs as the CPU does, on translated views. */
bool nbi_cpu_supports(void *ctx, int op, nb_dtype dt);
nb_status nbi_cpu_run_op(void *ctx, const nb_tensor *n, nbi_view *out, const nbi_view *in);

/* ---- threads ------------------------------------------------------------------------------ */
/* Elements below which a loop stays single-threaded. */
#define NBI_PAR_MIN 32768
/* Multiply-adds below which a GEMM runs on the calling thread: an OpenMP
 * region's fork and barrier cost more than half of such a product's work, and
 * far more when other processes hold the CPUs (gemm.c, k_gemm_epi.c). */
#define NBI_GEMM_SERIAL_MACS (1 << 20)
/* The contention guard's state, one per calling thread (threads.c): whether
 * this thread's kernels run on one OpenMP thread for now. feed judges one
 * realization (its wall and this thread's CPU ns, ended at now); reduced, at a
 * realization's start, ends a reduction whose back-off is over (a probe). */
typedef struct nbi_thread_guard {
  uint64_t win_wall, win_cpu; /* the current window's realizations (ns) */
  uint64_t resume_at;         /* reduced: when the full count is tried again */
  uint64_t backoff;           /* the next reduction's length; 0: the shortest */
  int strikes;                /* contended windows in a row */
  bool reduced, probing;
} nbi_thread_guard;
bool nbi_thread_guard_reduced(nbi_thread_guard *g, uint64_t now);
void nbi_thread_guard_feed(nbi_thread_guard *g, uint64_t now, uint64_t wall, uint64_t cpu);
/* Whether f32 GEMMs go to OpenBLAS rather than oneDNN now (gemm.c: where
 * oneDNN runs AVX2 code and OpenBLAS is still single-threaded as nabla set
 * it; env NABLA_SGEMM=onednn|openblas). Every caller (GEMM, epilogues,
 * matmul's primitive choice) asks this one predicate. */
bool nbi_cpu_sgemm_blas(void);
/* C = alpha op(A) @ op(B) + beta C (f32 or f64, row-major, 32-bit sizes) as
 * single-threaded OpenBLAS calls on column (or row) blocks over this thread's
 * OpenMP team: the same bits on any team. */
void nbi_cpu_blas_split(nb_dtype dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                        double beta, void *c, int64_t ldc);
/* OpenMP threads this thread's kernels use now: nb_get_num_threads(), or 1
 * while the guard finds this thread contended. */
int nbi_cpu_team(void);

/* ---- row iteration ------------------------------------------------------------------------
 * Row iteration over views that share one index space (broadcast them first
 * with nbi_view_broadcast). Dims that are contiguous for every operand are
 * merged and size-1 dims dropped, so the last dim is the longest inner run.
 * A row is one pass over the last dim; rows are independent, so kernels
 * parallelize over them:
 *
 *   nbi_iter it; nbi_iter_init(&it, 2, (const nbi_view *[]){&out, &in});
 *   int64_t rows = nbi_iter_rows(&it), n = it.dims[it.ndim - 1];
 *   for (int64_t r = 0; r < rows; r++) {
 *     int64_t off[2]; nbi_iter_row(&it, r, off);
 *     ... element j of op k is at off[k] + j * it.strides[k][it.ndim - 1]
 *   }
 */
/* The most views one iteration walks: also the most outputs and operands an
 * elementwise group may have together here (k_fused.c, the CPU's group_ok). */
#define NBI_ITER_MAX_OPS 16
typedef struct nbi_iter {
  int ndim; /* >= 1 */
  int n_ops;
  int64_t dims[NB_MAX_DIMS];
  int64_t strides[NBI_ITER_MAX_OPS][NB_MAX_DIMS];
} nbi_iter;

void nbi_iter_init(nbi_iter *it, int n_ops, const nbi_view *const *views);
int64_t nbi_iter_rows(const nbi_iter *it);
void nbi_iter_row(const nbi_iter *it, int64_t row, int64_t *offs);

/* A position in a walk over consecutive rows: the row's index over dims
 * [0, ndim - 1) and every operand's element offset. nbi_iter_seek places it
 * at a row (a division per dim); nbi_iter_next steps to the next row (an
 * odometer: additions only). */
typedef struct nbi_iter_pos {
  int64_t idx[NB_MAX_DIMS];
  int64_t off[NBI_ITER_MAX_OPS];
} nbi_iter_pos;

void nbi_iter_seek(const nbi_iter *it, int64_t row, nbi_iter_pos *p);
static inline void nbi_iter_next(const nbi_iter *it, nbi_iter_pos *p) {
  for (int d = it->ndim - 2; d >= 0; d--) {
    for (int k = 0; k < it->n_ops; k++)
      p->off[k] += it->strides[k][d];
    if (++p->idx[d] < it->dims[d] || d == 0) return;
    for (int k = 0; k < it->n_ops; k++)
      p->off[k] -= it->dims[d] * it->strides[k][d];
    p->idx[d] = 0;
  }
}
/* Whether operand k is flat: row r starts r * n elements after row 0 and runs
 * with stride 1 (n: the row length), or every stride is 0 (one value). A
 * block of consecutive rows of a flat operand is then one run. */
bool nbi_iter_flat(const nbi_iter *it, int k);

#endif
