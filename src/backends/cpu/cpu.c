/* src/backends/cpu/cpu.c — CPU backend: aligned blocks, thread setup, vtable
 * (its kernel table: kernels.c; fused groups: k_fused.c). Tensor buffers come
 * from these blocks through the cache in src/core/alloc.c. */
#include "k_fused.h"

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

void nbi_cpu_init(void) {
  if ((_mm_getcsr() & FTZ_DAZ) != FTZ_DAZ) set_ftz_daz();
#ifdef _OPENMP
  int team = omp_get_max_threads();
  if (team == ftz_team) return;
  ftz_team = team;
#pragma omp parallel
  set_ftz_daz();
#endif
}
