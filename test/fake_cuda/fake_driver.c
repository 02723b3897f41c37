/* test/fake_cuda/fake_driver.c — the fake CUDA driver: one device ("nabla fake GPU",
 * compute capability 9.0, 132 SMs, 227 KiB of opt-in shared memory), its primary
 * context, streams, events and memory.
 *
 * Device memory is host memory (256-byte aligned, filled with 0xff bytes when
 * allocated: NaN in every float dtype, so reads of memory never written show), and a
 * device pointer is its host address. The device holds NABLA_FAKE_CUDA_MEM bytes
 * (default 8 GiB; a number with an optional K, M or G suffix): cuMemAlloc past it is
 * CUDA_ERROR_OUT_OF_MEMORY, cuMemGetInfo counts from it. Copies and fills check that
 * their device side lies inside one allocation (CUDA_ERROR_INVALID_VALUE otherwise,
 * as the driver does), streams and events must be live, and every call but the
 * error names needs cuInit; memory, stream, event, module and launch calls need the
 * primary context current on the calling thread (CUDA_ERROR_INVALID_CONTEXT). Every
 * stream is synchronous: an operation is complete when its call returns. Events
 * record the host's monotonic clock. The entry points carry the names cuda.h maps
 * them to (cuMemAlloc_v2 ...), the names nabla's loader looks up. */
#include "fake_cuda.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FK_EXPORT __attribute__((visibility("default")))

static atomic_bool initialized;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* everything below */

/* ---- the device and its primary context ------------------------------------------------- */
struct CUctx_st {
  int retained; /* cuDevicePrimaryCtxRetain count */
};
static struct CUctx_st primary;
static _Thread_local CUcontext current;

CUresult fk_need_ctx(void) {
  if (!atomic_load(&initialized)) return CUDA_ERROR_NOT_INITIALIZED;
  if (current != &primary) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  int r = primary.retained;
  pthread_mutex_unlock(&lock);
  return r > 0 ? CUDA_SUCCESS : CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

/* CUDA_SUCCESS once cuInit ran. */
static CUresult need_init(void) {
  return atomic_load(&initialized) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* Bytes of device memory: NABLA_FAKE_CUDA_MEM, else FK_DEFAULT_MEMORY. */
static size_t total_memory(void) {
  const char *v = getenv("NABLA_FAKE_CUDA_MEM");
  if (!v || !v[0]) return FK_DEFAULT_MEMORY;
  char *end;
  unsigned long long n = strtoull(v, &end, 10);
  if (*end == 'K' || *end == 'k') n <<= 10;
  if (*end == 'M' || *end == 'm') n <<= 20;
  if (*end == 'G' || *end == 'g') n <<= 30;
  return n ? (size_t)n : FK_DEFAULT_MEMORY;
}
static size_t memory_total;

FK_EXPORT CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  if (!memory_total) memory_total = total_memory();
  pthread_mutex_unlock(&lock);
  atomic_store(&initialized, true);
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDriverGetVersion(int *version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetCount(int *count) {
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = need_init();
  *count = r == CUDA_SUCCESS ? 1 : 0;
  return r;
}

FK_EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
  CUresult r = need_init();
  if (r != CUDA_SUCCESS) return r;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *dev = 0;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  CUresult r = need_init();
  if (r != CUDA_SUCCESS) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  snprintf(name, (size_t)len, "%s", "nabla fake GPU (host threads)");
  return CUDA_SUCCESS;
}

/* The device's attributes: an H100-like sm_90 part. */
FK_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  CUresult r = need_init();
  if (r != CUDA_SUCCESS) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  int v;
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = FK_CC_MAJOR; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = FK_CC_MINOR; break;
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = FK_SM_COUNT; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = (int)FK_SMEM_OPTIN; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = (int)FK_SMEM_STATIC; break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 228 << 10; break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = FK_MAX_THREADS; break;
  case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
  case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 0x7fffffff; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
  case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
  case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
  case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
  case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
  case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 50 << 20; break;
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
  case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
  case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 2; break;
  case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
  case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 0; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = CU_COMPUTEMODE_DEFAULT; break;
  case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
  case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
  case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = 0; break;
  default: return CUDA_ERROR_INVALID_VALUE;
  }
  *pi = v;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
  CUresult r = need_init();
  if (r != CUDA_SUCCESS) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  *bytes = memory_total;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  CUresult r = need_init();
  if (r != CUDA_SUCCESS) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  primary.retained++;
  pthread_mutex_unlock(&lock);
  *pctx = &primary;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  CUresult r = need_init();
  if (r != CUDA_SUCCESS) return r;
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&lock);
  r = primary.retained > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  if (primary.retained > 0) primary.retained--;
  pthread_mutex_unlock(&lock);
  return r;
}

FK_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  CUresult r = need_init();
  if (r != CUDA_SUCCESS) return r;
  if (ctx && ctx != &primary) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&lock);
  int retained = primary.retained;
  pthread_mutex_unlock(&lock);
  if (ctx && retained == 0) { /* a teardown-order bug: fail loudly */
    fprintf(stderr, "fake CUDA: the primary context is made current after its release\n");
    abort();
  }
  current = ctx;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
  CUresult r = need_init();
  if (r != CUDA_SUCCESS) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = current;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuCtxSynchronize(void) { return fk_need_ctx(); }

/* ---- handles: streams and events ------------------------------------------------------------
 * Live handles are kept in a list so that a destroyed or foreign one is an error, not
 * a crash. */
typedef struct handle {
  struct handle *next;
  int kind; /* 's' stream, 'e' event */
} handle;

struct CUstream_st {
  handle h;
  unsigned flags;
};

struct CUevent_st {
  handle h;
  unsigned flags;
  bool recorded;
  double ms; /* the host's monotonic clock when recorded */
};

static handle *live_handles;

/* Whether h is live and of kind; under lock. */
static bool handle_live(const void *h, int kind) {
  for (const handle *x = live_handles; x; x = x->next)
    if ((const void *)x == h) return x->kind == kind;
  return false;
}

/* Removes h from the live list; false when it is not there (under lock). */
static bool handle_remove(const void *h, int kind) {
  for (handle **x = &live_handles; *x; x = &(*x)->next) {
    if ((const void *)*x != h) continue;
    if ((*x)->kind != kind) return false;
    *x = (*x)->next;
    return true;
  }
  return false;
}

bool fk_stream_ok(CUstream s) {
  if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return true;
  pthread_mutex_lock(&lock);
  bool ok = handle_live(s, 's');
  pthread_mutex_unlock(&lock);
  return ok;
}

/* CUDA_SUCCESS when the context is current and stream s usable. */
static CUresult need_stream(CUstream s) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  return fk_stream_ok(s) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FK_EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!ps || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
  struct CUstream_st *s = calloc(1, sizeof *s);
  if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
  s->h.kind = 's';
  s->flags = flags;
  pthread_mutex_lock(&lock);
  s->h.next = live_handles;
  live_handles = &s->h;
  pthread_mutex_unlock(&lock);
  *ps = s;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuStreamDestroy(CUstream s) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&lock);
  bool ok = s && handle_remove(s, 's');
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_INVALID_HANDLE;
  free(s);
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuStreamSynchronize(CUstream s) { return need_stream(s); }

FK_EXPORT CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!pe || (flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  struct CUevent_st *e = calloc(1, sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  e->h.kind = 'e';
  e->flags = flags;
  pthread_mutex_lock(&lock);
  e->h.next = live_handles;
  live_handles = &e->h;
  pthread_mutex_unlock(&lock);
  *pe = e;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuEventDestroy(CUevent e) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&lock);
  bool ok = e && handle_remove(e, 'e');
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_INVALID_HANDLE;
  free(e);
  return CUDA_SUCCESS;
}

/* Milliseconds of the host's monotonic clock. */
static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

FK_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  CUresult r = need_stream(s);
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&lock);
  bool ok = handle_live(e, 'e');
  if (ok) {
    e->recorded = true;
    e->ms = now_ms();
  }
  pthread_mutex_unlock(&lock);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FK_EXPORT CUresult cuEventSynchronize(CUevent e) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&lock);
  bool ok = handle_live(e, 'e');
  pthread_mutex_unlock(&lock);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* The time between two recorded events; CUDA_ERROR_INVALID_HANDLE when either was made
 * with CU_EVENT_DISABLE_TIMING or never recorded, as the driver. */
FK_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  bool ok = handle_live(start, 'e') && handle_live(end, 'e') && start->recorded && end->recorded &&
            !((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING);
  if (ok) *ms = (float)(end->ms - start->ms);
  pthread_mutex_unlock(&lock);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- memory ----------------------------------------------------------------------------------
 * Allocations sorted by address, for the range checks of copies. */
typedef struct block {
  uintptr_t base;
  size_t size;
  bool host; /* pinned host memory (cuMemAllocHost) */
} block;

static block *blocks;
static size_t n_blocks, cap_blocks, device_used;

/* Index of the first block whose base is above p; under lock. */
static size_t block_after(uintptr_t p) {
  size_t lo = 0, hi = n_blocks;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (blocks[mid].base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

bool fk_device_range(const void *p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&lock);
  size_t i = block_after(a);
  bool ok = i > 0 && a - blocks[i - 1].base < blocks[i - 1].size + (n == 0) &&
            n <= blocks[i - 1].size - (a - blocks[i - 1].base);
  pthread_mutex_unlock(&lock);
  return ok;
}

/* Allocates size bytes aligned to align, poisoned, recorded as device or host memory;
 * counts device memory against the total. */
static CUresult block_alloc(size_t size, size_t align, bool host, void **out) {
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  bool fits = host || size <= memory_total - device_used;
  bool room = true;
  if (fits && n_blocks == cap_blocks) {
    size_t cap = cap_blocks ? 2 * cap_blocks : 256;
    block *b = realloc(blocks, cap * sizeof *b);
    if (b) blocks = b, cap_blocks = cap;
    room = b != NULL;
  }
  if (fits && room && !host) device_used += size;
  pthread_mutex_unlock(&lock);
  if (!fits || !room) return CUDA_ERROR_OUT_OF_MEMORY;
  void *p = NULL;
  if (posix_memalign(&p, align, size) != 0) {
    pthread_mutex_lock(&lock);
    if (!host) device_used -= size;
    pthread_mutex_unlock(&lock);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  memset(p, 0xff, size);
  pthread_mutex_lock(&lock);
  size_t i = block_after((uintptr_t)p);
  memmove(blocks + i + 1, blocks + i, (n_blocks - i) * sizeof *blocks);
  blocks[i] = (block){.base = (uintptr_t)p, .size = size, .host = host};
  n_blocks++;
  pthread_mutex_unlock(&lock);
  *out = p;
  return CUDA_SUCCESS;
}

/* Frees the allocation starting at p of the given kind. */
static CUresult block_free(uintptr_t p, bool host) {
  pthread_mutex_lock(&lock);
  size_t i = block_after(p);
  bool ok = i > 0 && blocks[i - 1].base == p && blocks[i - 1].host == host;
  if (ok) {
    if (!host) device_used -= blocks[i - 1].size;
    memmove(blocks + i - 1, blocks + i, (n_blocks - i) * sizeof *blocks);
    n_blocks--;
  }
  pthread_mutex_unlock(&lock);
  if (!ok) return CUDA_ERROR_INVALID_VALUE;
  free((void *)p);
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  void *p = NULL;
  r = block_alloc(bytesize, 256, false, &p);
  if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr)(uintptr_t)p;
  return r;
}

FK_EXPORT CUresult cuMemFree(CUdeviceptr dptr) {
  CUresult r = fk_need_ctx();
  return r != CUDA_SUCCESS ? r : block_free((uintptr_t)dptr, false);
}

FK_EXPORT CUresult cuMemAllocHost(void **pp, size_t bytesize) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!pp) return CUDA_ERROR_INVALID_VALUE;
  return block_alloc(bytesize, 4096, true, pp);
}

FK_EXPORT CUresult cuMemFreeHost(void *p) {
  CUresult r = fk_need_ctx();
  return r != CUDA_SUCCESS ? r : block_free((uintptr_t)p, true);
}

FK_EXPORT CUresult cuMemGetInfo(size_t *free_bytes, size_t *total) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&lock);
  *free_bytes = memory_total - device_used;
  *total = memory_total;
  pthread_mutex_unlock(&lock);
  return CUDA_SUCCESS;
}

/* A copy of n bytes whose device sides (dst_dev, src_dev) are checked. */
static CUresult copy(void *dst, bool dst_dev, const void *src, bool src_dev, size_t n, CUstream s) {
  CUresult r = need_stream(s);
  if (r != CUDA_SUCCESS) return r;
  if (n == 0) return CUDA_SUCCESS;
  if (!dst || !src || (dst_dev && !fk_device_range(dst, n)) ||
      (src_dev && !fk_device_range(src, n)))
    return CUDA_ERROR_INVALID_VALUE;
  memmove(dst, src, n);
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  return copy((void *)(uintptr_t)dst, true, src, false, n, s);
}

FK_EXPORT CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy(dst, false, (const void *)(uintptr_t)src, true, n, s);
}

FK_EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return copy((void *)(uintptr_t)dst, true, (const void *)(uintptr_t)src, true, n, s);
}

FK_EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
                                     CUcontext src_ctx, size_t n, CUstream s) {
  if (dst_ctx != &primary || src_ctx != &primary) return CUDA_ERROR_INVALID_CONTEXT;
  return cuMemcpyDtoDAsync(dst, src, n, s);
}

/* n elements of es bytes at dst (aligned to es) set to the low es bytes of v. */
static CUresult fill(CUdeviceptr dst, unsigned v, size_t es, size_t n, CUstream s) {
  CUresult r = need_stream(s);
  if (r != CUDA_SUCCESS) return r;
  if (n == 0) return CUDA_SUCCESS;
  char *p = (char *)(uintptr_t)dst;
  if ((uintptr_t)p % es != 0 || n > SIZE_MAX / es || !fk_device_range(p, n * es))
    return CUDA_ERROR_INVALID_VALUE;
  if (es == 1) {
    memset(p, (int)(v & 0xff), n);
  } else if (es == 2) {
    uint16_t w = (uint16_t)v;
    for (size_t i = 0; i < n; i++)
      memcpy(p + 2 * i, &w, 2);
  } else {
    uint32_t w = v;
    for (size_t i = 0; i < n; i++)
      memcpy(p + 4 * i, &w, 4);
  }
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t n, CUstream s) {
  return fill(dst, uc, 1, n, s);
}

FK_EXPORT CUresult cuMemsetD16Async(CUdeviceptr dst, unsigned short us, size_t n, CUstream s) {
  return fill(dst, us, 2, n, s);
}

FK_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n, CUstream s) {
  return fill(dst, ui, 4, n, s);
}

/* ---- error names -------------------------------------------------------------------------- */
typedef struct err_name {
  CUresult r;
  const char *name, *text;
} err_name;

#define FK_ERR(code, text)                                                                         \
  { code, #code, text }
static const err_name errors[] = {
    FK_ERR(CUDA_SUCCESS, "no error"),
    FK_ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    FK_ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    FK_ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    FK_ERR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    FK_ERR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    FK_ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    FK_ERR(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    FK_ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    FK_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    FK_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU,
           "no kernel image is available for execution on the device"),
    FK_ERR(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    FK_ERR(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
    FK_ERR(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    FK_ERR(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed"),
    FK_ERR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    FK_ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    FK_ERR(CUDA_ERROR_NOT_READY, "device not ready"),
    FK_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    FK_ERR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    FK_ERR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    FK_ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    FK_ERR(CUDA_ERROR_UNKNOWN, "unknown error"),
};

/* The entry of r, NULL when the fake does not know it. */
static const err_name *find_error(CUresult r) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].r == r) return &errors[i];
  return NULL;
}

FK_EXPORT CUresult cuGetErrorName(CUresult error, const char **pstr) {
  const err_name *e = find_error(error);
  if (!pstr) return CUDA_ERROR_INVALID_VALUE;
  *pstr = e ? e->name : NULL;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FK_EXPORT CUresult cuGetErrorString(CUresult error, const char **pstr) {
  const err_name *e = find_error(error);
  if (!pstr) return CUDA_ERROR_INVALID_VALUE;
  *pstr = e ? e->text : NULL;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
