/* src/backends/cuda/cuda_device.c — CUDA devices: probing, contexts, the compute
 * stream, host I/O through pinned staging, sync with deferred kernel errors,
 * and the backend vtable.
 *
 * One device = the GPU's primary context, one non-blocking stream that every
 * kernel and copy of the device is queued on (so stream order is the only
 * order there is), a caching allocator, an error word kernels report bad
 * indices in, pinned staging for host transfers, and a cuBLASLt handle with
 * its workspace. Several host threads may use one device at once: the
 * driver's calls are thread-safe, and ctx->lock serializes the state here
 * (staging, the error word's read-back). */
#include "cuda_be.h"
#include "../../core/oprules.h"

#include "../../ops/index.h" /* the callers of index kernels' error codes */

#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define STAGE_MIN ((size_t)64 << 10) /* bytes per staging half, at least */
#define STAGE_MAX ((size_t)16 << 20) /* and at most: larger transfers go in chunks */
#define LT_WORKSPACE ((size_t)32 << 20)

/* The device's private state around the shared context (ctx points here). */
typedef struct cuda_dev {
  nbi_cuda_ctx c;
  /* Staging: c.pinned holds two halves of c.pinned_bytes / 2; ev[k] is
   * recorded after the last transfer through half k (pending[k] until it
   * has been waited for). */
  CUevent ev[2];
  bool pending[2];
  int64_t *err_host; /* pinned: the error words read back (NBI_CUDA_ERR_BYTES) */
} cuda_dev;

static cuda_dev *devices[NBI_MAX_DEVICES];
static int n_devices;
static char probe_why[256];

/* Makes c's context current on this thread unless it is. */
nb_status nbi_cuda_enter(nbi_cuda_ctx *c) {
  CUcontext cur = NULL;
  if (nbi_cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == c->ctx) return NB_OK;
  return nbi_cu_check(nbi_cu.cuCtxSetCurrent(c->ctx), "nabla: cuCtxSetCurrent");
}

/* ---- opening and closing a device
 * ---------------------------------------------------------------- */
/* Frees what dev_open made (d may be partly made). Errors are not reported:
 * this runs when opening failed (the first error explains) or at exit. */
static void dev_close(cuda_dev *d) {
  nbi_cuda_ctx *c = &d->c;
  if (c->ctx && nbi_cu.cuCtxSetCurrent(c->ctx) == CUDA_SUCCESS) {
    if (c->stream) (void)nbi_cu.cuStreamSynchronize(c->stream);
    if (c->lt) (void)nbi_cu.cublasLtDestroy(c->lt);
    if (c->lt_workspace) (void)nbi_cu.cuMemFree(c->lt_workspace);
    nbi_cuda_alloc_destroy(c->alloc);
    if (c->err_word) (void)nbi_cu.cuMemFree(c->err_word);
    if (d->err_host) (void)nbi_cu.cuMemFreeHost(d->err_host);
    if (c->pinned) (void)nbi_cu.cuMemFreeHost(c->pinned);
    for (int k = 0; k < 2; k++)
      if (d->ev[k]) (void)nbi_cu.cuEventDestroy(d->ev[k]);
    if (c->stream) (void)nbi_cu.cuStreamDestroy(c->stream);
    (void)nbi_cu.cuDevicePrimaryCtxRelease(c->dev);
    pthread_mutex_destroy(&c->lock);
  }
  free(d);
}

/* Writes why step `what` of opening device ordinal failed into probe_why. */
static bool opened(CUresult r, const char *what, int ordinal) {
  if (r == CUDA_SUCCESS) return true;
  char step[96];
  snprintf(step, sizeof step, "CUDA device %d: %s", ordinal, what);
  nbi_cu_describe(r, step, probe_why, sizeof probe_why);
  return false;
}

/* Opens CUDA device `ordinal` as NB_CUDA(index); NULL (probe_why says why)
 * when any step fails. */
static cuda_dev *dev_open(int ordinal, int index) {
  cuda_dev *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(probe_why, sizeof probe_why, "out of host memory opening CUDA device %d", ordinal);
    return NULL;
  }
  nbi_cuda_ctx *c = &d->c;
  c->index = index;
  c->ordinal = ordinal;
  c->table = -1;
  int major = 0, minor = 0, sms = 0, optin = 0;
  bool ok =
      opened(nbi_cu.cuDeviceGet(&c->dev, ordinal), "cuDeviceGet", ordinal) &&
      opened(nbi_cu.cuDeviceGetName(c->name, (int)sizeof c->name, c->dev), "cuDeviceGetName",
             ordinal) &&
      opened(
          nbi_cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev),
          "cuDeviceGetAttribute", ordinal) &&
      opened(
          nbi_cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev),
          "cuDeviceGetAttribute", ordinal) &&
      opened(nbi_cu.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, c->dev),
             "cuDeviceGetAttribute", ordinal) &&
      opened(nbi_cu.cuDeviceGetAttribute(
                 &optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, c->dev),
             "cuDeviceGetAttribute", ordinal) &&
      opened(nbi_cu.cuDevicePrimaryCtxRetain(&c->ctx, c->dev), "cuDevicePrimaryCtxRetain", ordinal);
  if (!ok) {
    c->ctx = NULL; /* nothing retained: dev_close must not release */
    dev_close(d);
    return NULL;
  }
  c->cc_major = major;
  c->cc_minor = minor;
  c->sm_count = sms;
  c->smem_optin = optin > 0 ? (size_t)optin : 48 * 1024;
  pthread_mutex_init(&c->lock, NULL);
  ok =
      opened(nbi_cu.cuCtxSetCurrent(c->ctx), "cuCtxSetCurrent", ordinal) &&
      opened(nbi_cu.cuStreamCreate(&c->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate",
             ordinal) &&
      opened(nbi_cu.cuEventCreate(&d->ev[0], CU_EVENT_DISABLE_TIMING), "cuEventCreate", ordinal) &&
      opened(nbi_cu.cuEventCreate(&d->ev[1], CU_EVENT_DISABLE_TIMING), "cuEventCreate", ordinal) &&
      opened(nbi_cu.cuMemAlloc(&c->err_word, 256), "cuMemAlloc (error word)", ordinal) &&
      opened(nbi_cu.cuMemsetD32Async(c->err_word, 0, 64, c->stream), "cuMemsetD32Async", ordinal) &&
      opened(nbi_cu.cuMemAllocHost((void **)&d->err_host, 64), "cuMemAllocHost", ordinal) &&
      opened(nbi_cu.cuMemAlloc(&c->lt_workspace, LT_WORKSPACE), "cuMemAlloc (cuBLASLt workspace)",
             ordinal) &&
      opened(nbi_cu.cuStreamSynchronize(c->stream), "cuStreamSynchronize", ordinal);
  if (ok) {
    cublasStatus_t s = nbi_cu.cublasLtCreate(&c->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
      c->lt = NULL;
      snprintf(probe_why, sizeof probe_why, "CUDA device %d: cublasLtCreate failed (status %d)",
               ordinal, (int)s);
      ok = false;
    }
  }
  if (ok) {
    c->lt_workspace_bytes = LT_WORKSPACE;
    c->alloc = nbi_cuda_alloc_create(c);
    if (!c->alloc) {
      snprintf(probe_why, sizeof probe_why, "out of host memory opening CUDA device %d", ordinal);
      ok = false;
    }
  }
  if (!ok) {
    dev_close(d);
    return NULL;
  }
  return d;
}

/* At exit: every device closed (the process is done with them). */
/* Set when the devices closed at exit: a block given back later (a tensor
 * that an application's own destructor releases) is left to the process's
 * end, as is everything after the driver's teardown. */
static _Atomic bool closed_all;

/* At exit, after core's destructors (default priority) released the main
 * thread's scopes and emptied the buffer cache, which give device blocks
 * back through cuda_free: an atexit handler ran before them, on a freed
 * allocator (the cuda:0-default suite hung there). */
__attribute__((destructor(101))) static void close_all(void) {
  atomic_store(&closed_all, true);
  for (int i = n_devices - 1; i >= 0; i--) {
    dev_close(devices[i]);
    devices[i] = NULL;
  }
  n_devices = 0;
}

/* Opens every GPU the driver reports as NB_CUDA(0..) in order and registers
 * it; a GPU that fails to open is skipped (nbi_cuda_why says why). Core
 * calls it once, under the device table's lock. */
void nbi_cuda_probe(void) {
  if (n_devices || !nbi_cu_load()) return;
  int count = 0;
  CUresult r = nbi_cu.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) {
    nbi_cu_describe(r, "cuDeviceGetCount", probe_why, sizeof probe_why);
    return;
  }
  if (count <= 0) {
    snprintf(probe_why, sizeof probe_why, "the CUDA driver reports no GPU");
    return;
  }
  for (int i = 0; i < count && n_devices < NBI_MAX_DEVICES; i++) {
    cuda_dev *d = dev_open(i, n_devices);
    if (!d) continue;
    int t = nbi_device_register(NB_CUDA(n_devices), &nbi_cuda_backend, &d->c);
    if (t < 0) {
      snprintf(probe_why, sizeof probe_why, "the device table is full (CUDA device %d)", i);
      dev_close(d);
      break;
    }
    d->c.table = t;
    devices[n_devices++] = d;
  }
}

/* Why there is no CUDA device ("" when there is one). */
const char *nbi_cuda_why(void) {
  if (!nbi_cu_load()) return nbi_cu.why;
  if (probe_why[0]) return probe_why;
  return n_devices ? "" : "no CUDA device was probed";
}

/* ---- pinned staging
 * -------------------------------------------------------------------------------- */
static char *stage(cuda_dev *d, int k) { return (char *)d->c.pinned + k * (d->c.pinned_bytes / 2); }

/* Waits until staging half k is free; under c.lock. */
static nb_status stage_wait(cuda_dev *d, int k) {
  if (!d->pending[k]) return NB_OK;
  d->pending[k] = false;
  return nbi_cu_check(nbi_cu.cuEventSynchronize(d->ev[k]), "nabla: cuEventSynchronize (transfer)");
}

/* Grows staging so each half holds min(n, STAGE_MAX) bytes; under c.lock. */
static nb_status stage_reserve(cuda_dev *d, size_t n) {
  nbi_cuda_ctx *c = &d->c;
  size_t want = n < STAGE_MAX ? n : STAGE_MAX, half = STAGE_MIN;
  if (c->pinned_bytes / 2 >= want) return NB_OK;
  while (half < want)
    half *= 2;
  nb_status st = stage_wait(d, 0);
  if (st == NB_OK) st = stage_wait(d, 1);
  if (st != NB_OK) return st;
  if (c->pinned) {
    void *old = c->pinned;
    c->pinned = NULL;
    c->pinned_bytes = 0;
    st = nbi_cu_check(nbi_cu.cuMemFreeHost(old), "nabla: cuMemFreeHost");
    if (st != NB_OK) return st;
  }
  void *p = NULL;
  CUresult r = nbi_cu.cuMemAllocHost(&p, 2 * half);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    return nbi_error(NB_ERR_OOM, "nabla: cuda:%d: out of pinned host memory (%zu bytes)", c->index,
                     2 * half);
  st = nbi_cu_check(r, "nabla: cuMemAllocHost");
  if (st != NB_OK) return st;
  c->pinned = p;
  c->pinned_bytes = 2 * half;
  return NB_OK;
}

/* ---- deferred kernel errors ----------------------------------------------------------------- */
/* Waits for the stream, then reads and clears the error word and returns the
 * error it holds (recorded). Kernels write the word with atomicCAS from 0, so
 * the first error stays until read; a word read as non-zero is cleared
 * after reading: an error found meanwhile by a kernel of another thread was
 * dropped by its CAS anyway. */
static nb_status take_kernel_error(cuda_dev *d) {
  nbi_cuda_ctx *c = &d->c;
  char what[96];
  snprintf(what, sizeof what, "nabla: cuda:%d: a queued kernel or copy failed", c->index);
  nb_status st = nbi_cu_check(nbi_cu.cuStreamSynchronize(c->stream), what);
  if (st != NB_OK) return st;
  pthread_mutex_lock(&c->lock);
  memset(d->err_host, 0, NBI_CUDA_ERR_BYTES);
  st = nbi_cu_check(
      nbi_cu.cuMemcpyDtoHAsync(d->err_host, c->err_word, NBI_CUDA_ERR_BYTES, c->stream),
      "nabla: cuMemcpyDtoHAsync (error word)");
  if (st == NB_OK) st = nbi_cu_check(nbi_cu.cuStreamSynchronize(c->stream), what);
  int code = st == NB_OK ? (int)d->err_host[0] : 0;
  if (code != 0)
    st = nbi_cu_check(nbi_cu.cuMemsetD32Async(c->err_word, 0, NBI_CUDA_ERR_BYTES / 4, c->stream),
                      "nabla: cuMemsetD32Async (error word)");
  int64_t above = d->err_host[1], below = d->err_host[2], size = d->err_host[3];
  pthread_mutex_unlock(&c->lock);
  if (st != NB_OK || code == 0) return st;
  int kind = code & 0xff, op = (int)(((unsigned)code >> 8) & 0xff);
  int caller = (int)(((unsigned)code >> 16) & 0xff), axis = (int)(((unsigned)code >> 24) & 0x7f);
  if (kind == NBI_CUDA_KERR_INDEX && op >= 0 && op < NBI_OP_COUNT && nbi_op_table[op]) {
    /* the CPU's choice (k_index.c): the largest index above the range, else
     * the smallest below it */
    int64_t v = above > 0 ? size + above - 1 : nbi_index_low(caller, size) - below;
    char own[48];
    snprintf(own, sizeof own, "nb_%s", nbi_op_table[op]->name);
    return nbi_index_range_error_as(caller, own, v, axis, size);
  }
  return nbi_error(NB_ERR_INTERNAL, "nabla: cuda:%d: a kernel reported error code 0x%x", c->index,
                   (unsigned)code);
}

/* ---- the vtable
 * ----------------------------------------------------------------------------------- */
static void *cuda_alloc(void *ctx, size_t nbytes) {
  nbi_cuda_ctx *c = ctx;
  if (atomic_load(&closed_all) || nbi_cuda_enter(c) != NB_OK) return NULL;
  return (void *)(uintptr_t)nbi_cuda_alloc_block(c->alloc, nbytes);
}

/* Gives block p back (stream order makes reuse safe). */
static void cuda_free(void *ctx, void *p, size_t nbytes) {
  (void)nbytes;
  nbi_cuda_ctx *c = ctx;
  if (atomic_load(&closed_all) || nbi_cuda_enter(c) != NB_OK) return;
  nbi_cuda_free_block(c->alloc, (CUdeviceptr)(uintptr_t)p);
}

/* The allocator's counters. */
static void cuda_mem_info(void *ctx, size_t *allocated, size_t *reserved) {
  nbi_cuda_alloc_stats(((nbi_cuda_ctx *)ctx)->alloc, allocated, reserved);
}

static void *cuda_native_stream(void *ctx) { return (void *)((nbi_cuda_ctx *)ctx)->stream; }

/* Host -> device in chunks through the two staging halves, alternating, so
 * filling one overlaps the other's transfer. Returns once the bytes are
 * staged (the caller may reuse host_src); the transfer itself is queued. */
static nb_status cuda_upload(void *ctx, void *dev_dst, const void *host_src, size_t nbytes) {
  cuda_dev *d = ctx;
  nbi_cuda_ctx *c = &d->c;
  if (nbytes == 0) return NB_OK;
  nb_status st = nbi_cuda_enter(c);
  if (st != NB_OK) return st;
  pthread_mutex_lock(&c->lock);
  st = stage_reserve(d, nbytes);
  size_t half = c->pinned_bytes / 2;
  for (size_t off = 0, k = 0; st == NB_OK && off < nbytes; k ^= 1) {
    size_t n = nbytes - off < half ? nbytes - off : half;
    st = stage_wait(d, (int)k);
    if (st != NB_OK) break;
    memcpy(stage(d, (int)k), (const char *)host_src + off, n);
    st = nbi_cu_check(nbi_cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dev_dst + off,
                                               stage(d, (int)k), n, c->stream),
                      "nabla: cuMemcpyHtoDAsync");
    if (st == NB_OK)
      st = nbi_cu_check(nbi_cu.cuEventRecord(d->ev[k], c->stream), "nabla: cuEventRecord");
    if (st == NB_OK) d->pending[k] = true;
    off += n;
  }
  pthread_mutex_unlock(&c->lock);
  return st;
}

/* Device -> host in chunks: chunk i+1 is queued before chunk i is copied out
 * of its staging half. Waiting for the last chunk waits for everything
 * queued before the download (stream order); then, like sync, it returns the
 * error a kernel reported. */
static nb_status cuda_download(void *ctx, void *host_dst, const void *dev_src, size_t nbytes) {
  cuda_dev *d = ctx;
  nbi_cuda_ctx *c = &d->c;
  if (nbytes == 0) return NB_OK;
  nb_status st = nbi_cuda_enter(c);
  if (st != NB_OK) return st;
  pthread_mutex_lock(&c->lock);
  st = stage_reserve(d, nbytes);
  size_t half = c->pinned_bytes / 2, prev_off = 0, prev_n = 0;
  int prev_k = -1;
  for (size_t off = 0, k = 0; st == NB_OK && off < nbytes; k ^= 1) {
    size_t n = nbytes - off < half ? nbytes - off : half;
    st = stage_wait(d, (int)k);
    if (st == NB_OK)
      st = nbi_cu_check(nbi_cu.cuMemcpyDtoHAsync(
                            stage(d, (int)k), (CUdeviceptr)(uintptr_t)dev_src + off, n, c->stream),
                        "nabla: cuMemcpyDtoHAsync");
    if (st == NB_OK)
      st = nbi_cu_check(nbi_cu.cuEventRecord(d->ev[k], c->stream), "nabla: cuEventRecord");
    if (st != NB_OK) break;
    d->pending[k] = true;
    if (prev_k >= 0) {
      st = stage_wait(d, prev_k);
      if (st != NB_OK) break;
      memcpy((char *)host_dst + prev_off, stage(d, prev_k), prev_n);
    }
    prev_k = (int)k;
    prev_off = off;
    prev_n = n;
    off += n;
  }
  if (st == NB_OK && prev_k >= 0) {
    st = stage_wait(d, prev_k);
    if (st == NB_OK) memcpy((char *)host_dst + prev_off, stage(d, prev_k), prev_n);
  }
  pthread_mutex_unlock(&c->lock);
  /* what the kernels that computed these bytes found (the transfers are done,
   * so this waits only for work queued since) */
  return st != NB_OK ? st : take_kernel_error(d);
}

/* Waits for the device's stream; the error a kernel reported, if any. */
static nb_status cuda_sync(void *ctx) {
  nb_status st = nbi_cuda_enter(ctx);
  return st != NB_OK ? st : take_kernel_error(ctx);
}

/* Copy through cuda_copy.c. The vtable's entries make the context current,
 * then pass on. */
static nb_status cuda_copy(void *ctx, nbi_view *dst, const nbi_view *src) {
  nb_status st = nbi_cuda_enter(ctx);
  return st != NB_OK ? st : nbi_cuda_copy(ctx, dst, src);
}

/* Fill through cuda_copy.c. */
static nb_status cuda_fill(void *ctx, nbi_view *dst, double value) {
  nb_status st = nbi_cuda_enter(ctx);
  return st != NB_OK ? st : nbi_cuda_fill(ctx, dst, value);
}

/* One op from cuda_ops.c's table. */
static nb_status cuda_run_op(void *ctx, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  nb_status st = nbi_cuda_enter(ctx);
  return st != NB_OK ? st : nbi_cuda_run_op(ctx, n, out, in);
}

/* GEMM epilogues go to cuda_gemm.c, every other group to cuda_render.c. */
static bool cuda_group_ok(void *ctx, const nbi_group *g) {
  return g->kind == NBI_GROUP_GEMM ? nbi_cuda_gemm_ok(ctx, g) : nbi_cuda_group_ok(ctx, g);
}

/* Runs a group where group_ok sent it. */
static nb_status cuda_run_group(void *ctx, const nbi_group *g, nbi_view *out, const nbi_view *in) {
  nb_status st = nbi_cuda_enter(ctx);
  if (st != NB_OK) return st;
  return g->kind == NBI_GROUP_GEMM ? nbi_cuda_gemm_group(ctx, g, out, in)
                                   : nbi_cuda_run_group(ctx, g, out, in);
}

/* A plan's groups and steps before its first run: their kernels compiled in
 * parallel. */
static void cuda_prepare(void *ctx, const nbi_prepare_list *l) {
  if (nbi_cuda_enter(ctx) == NB_OK) nbi_cuda_prepare(ctx, l);
}

const nbi_backend nbi_cuda_backend = {
    .name = "cuda",
    .kind = NB_DEVICE_CUDA,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .own_cache = true,
    .mem_info = cuda_mem_info,
    .native_stream = cuda_native_stream,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .fill = cuda_fill,
    .sync = cuda_sync,
    .supports = nbi_cuda_supports,
    .run_op = cuda_run_op,
    .group_ok = cuda_group_ok,
    .run_group = cuda_run_group,
    .prepare = cuda_prepare,
};
