/* src/backends/cpu/cpu.c — CPU backend: aligned blocks and the vtable (its
 * kernel table: kernels.c; fused groups: k_fused.c; threads: threads.c). Tensor buffers come
 * from these blocks through the cache in src/core/alloc.c. */
#include "k_fused.h"

#include <stdlib.h>

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
