/* src/backends/cpu/cpu.c — CPU backend: aligned buffers, thread setup, vtable. */
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

nbi_buffer *nbi_buffer_alloc(size_t nbytes) {
  nbi_buffer *b = malloc(sizeof *b);
  void *data = b ? nbi_cpu_backend.alloc(nbytes) : NULL;
  if (!data) {
    free(b);
    nbi_error(NB_ERR_OOM, "nabla: out of memory allocating %zu bytes", nbytes);
    return NULL;
  }
  *b = (nbi_buffer){.refcount = 1, .device = 0, .nbytes = nbytes, .data = data};
  nbi_stats_alloc(nbytes);
  return b;
}

void nbi_buffer_retain(nbi_buffer *b) {
  if (b) b->refcount++;
}

void nbi_buffer_release(nbi_buffer *b) {
  if (!b || --b->refcount > 0) return;
  nbi_stats_free(b->nbytes);
  nbi_cpu_backend.free(b->data);
  free(b);
}

/* Flush-to-zero and denormals-are-zero: denormals cost ~100x per operation on
 * this hardware and carry no useful precision for learning. Set in the calling
 * thread and in every OpenMP worker (the pool persists, so once is enough). */
static void set_ftz_daz(void) { _mm_setcsr(_mm_getcsr() | 0x8040); }

static _Thread_local bool cpu_ready;

void nbi_cpu_init(void) {
  if (cpu_ready) return;
  cpu_ready = true;
  set_ftz_daz();
#ifdef _OPENMP
#pragma omp parallel
  set_ftz_daz();
#endif
}
