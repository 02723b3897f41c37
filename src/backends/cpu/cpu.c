/* src/backends/cpu/cpu.c — CPU backend: aligned blocks, thread setup, vtable.
 * Tensor buffers come from these blocks through the cache in src/core/alloc.c. */
#include "../backend.h"

#include <stdlib.h>
#include <xmmintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static void *cpu_alloc(size_t nbytes) {
  size_t n = (nbytes + 63) & ~(size_t)63;
  return aligned_alloc(64, n ? n : 64);
}
static void cpu_free(void *p) { free(p); }
static void cpu_memcpy(void *dst, const void *src, size_t nbytes) { memcpy(dst, src, nbytes); }

static nb_status cpu_run_kernel(const nb_tensor *node, nbi_view *out, const nbi_view *in) {
  return nbi_op_table[node->op]->cpu(node, out, in);
}

const nbi_backend nbi_cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memcpy_to_host = cpu_memcpy,
    .gemm = nbi_cpu_gemm,
    .run_kernel = cpu_run_kernel,
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
