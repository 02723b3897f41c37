/* src/backends/cpu/cpu.c — CPU backend: aligned blocks, thread setup, vtable
 * (its kernel table: kernels.c; fused groups: k_fused.c). Tensor buffers come
 * from these blocks through the cache in src/core/alloc.c. */
#include "k_fused.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <xmmintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static void *cpu_alloc(void *ctx, size_t nbytes) {
  (void)ctx;
  size_t n = (nbytes + 63) & ~(size_t)63;
  return aligned_alloc(64, n ? n : 64);
}
static void cpu_free(void *ctx, void *p, size_t nbytes) {
  (void)ctx, (void)nbytes;
  free(p);
}
static nb_status cpu_upload(void *ctx, void *dst, const void *src, size_t nbytes) {
  (void)ctx;
  if (nbytes) memcpy(dst, src, nbytes);
  return NB_OK;
}
static nb_status cpu_copy(void *ctx, nbi_view *dst, const nbi_view *src) {
  (void)ctx;
  nbi_copy_view(dst, src);
  return NB_OK;
}
static nb_status cpu_fill(void *ctx, nbi_view *dst, double value) {
  (void)ctx;
  nbi_fill_view(dst, value);
  return NB_OK;
}
static nb_status cpu_sync(void *ctx) { /* kernels run synchronously and report at once */
  (void)ctx;
  return NB_OK;
}

const nbi_backend nbi_cpu_backend = {
    .name = "cpu",
    .kind = NB_DEVICE_CPU,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_upload,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .sync = cpu_sync,
    .supports = nbi_cpu_supports,
    .run_op = nbi_cpu_run_op,
    .group_ok = nbi_cpu_group_ok,
    .run_group = nbi_cpu_run_group,
};

/* Flush-to-zero and denormals-are-zero: denormals cost ~100x per operation on
 * this hardware and carry no useful precision for learning. Set in the calling
 * thread (checked at every realization: cheap, and code between two may clear
 * it) and in every OpenMP worker of its pool: again whenever the team size
 * changed, since libgomp starts fresh workers when a team grows (and ends
 * surplus ones when it shrinks). OpenBLAS's own threads (f64 GEMM) are not
 * ours to set. */
enum { FTZ_DAZ = 0x8040 };
static void set_ftz_daz(void) { _mm_setcsr(_mm_getcsr() | FTZ_DAZ); }

static _Thread_local int ftz_team; /* team size the workers were set for */

/* ---- kernel threads (nb_set_num_threads) ----------------------------------
 * One process-wide count: every thread's kernels use that many OpenMP threads
 * (0: the default, OMP_NUM_THREADS or the cores, read once). OpenMP's count is
 * a per-thread setting, so each thread applies a change at its next
 * realization (nbi_cpu_init); OpenBLAS (f64 GEMM) has one global pool. */
static _Atomic int threads_wanted; /* 0: default */
static _Atomic int threads_default;

static int default_threads(void) {
  int d = threads_default;
  if (!d) {
#ifdef _OPENMP
    d = omp_get_max_threads(); /* before any nb_set_num_threads: the default */
#else
    d = 1;
#endif
    int zero = 0;
    if (!atomic_compare_exchange_strong(&threads_default, &zero, d)) d = threads_default;
  }
  return d;
}

nb_status nb_set_num_threads(int n) {
  if (n < 0 || n > 4096)
    return nbi_error(NB_ERR_ARG, "nb_set_num_threads: %d threads (0 for the default, 1 to 4096)",
                     n);
  (void)default_threads();
  threads_wanted = n;
  openblas_set_num_threads(n ? n : default_threads());
  return NB_OK;
}

int nb_get_num_threads(void) {
  int n = threads_wanted;
  return n ? n : default_threads();
}

void nbi_cpu_init(void) {
  if ((_mm_getcsr() & FTZ_DAZ) != FTZ_DAZ) set_ftz_daz();
#ifdef _OPENMP
  int want = nb_get_num_threads();
  if (omp_get_max_threads() != want) omp_set_num_threads(want);
  int team = omp_get_max_threads();
  if (team == ftz_team) return;
  ftz_team = team;
#pragma omp parallel
  set_ftz_daz();
#endif
}
