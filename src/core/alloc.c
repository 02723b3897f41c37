/* src/core/alloc.c — tensor buffers: a caching allocator over each device's raw
 * blocks (the backend's alloc/free, src/backends/backend.h), one set of free
 * lists per device. A backend that caches its own blocks (own_cache: CUDA's
 * allocator splits and coalesces in stream order) is passed straight through.
 * When a backend is out of memory, the cached blocks of that device are freed
 * and the request tried once more.
 *
 * A request is rounded up to a size class: multiples of 64 bytes up to 256,
 * then four classes per power of two (2^k * 5/4, 6/4, 7/4, 8/4), so a block is
 * at most 25% larger than asked for and always a multiple of 64. A released
 * buffer (refcount 0) goes back on its class's free list, header and block
 * together, instead of to the system; the next request of that class takes it
 * (a cache hit: no malloc, no page faults). The free lists hold at most `cap`
 * bytes of blocks (env NABLA_CACHE_BYTES, bytes with an optional K/M/G suffix,
 * read at the first request; default 1 GiB; 0 disables caching; an unparsable
 * value keeps the default); a release that would exceed it frees the block.
 * Requests above 2^47 bytes bypass the cache. An external buffer
 * (nbi_buffer_wrap: a memory-mapped file) is never cached: its owner's
 * ext_free takes it back at refcount 0. nbi_buffer_cache_trim() empties
 * the lists; it runs at exit, after which releases free directly.
 *
 * Thread safety: one mutex guards the free lists and cached_bytes, so buffers
 * may be allocated and released from any thread; the counters are per thread
 * and live_bytes an atomic (stats.c). Refcounts are atomic (NBI_REF_INC/DEC):
 * the captures of a jitted function are shared by the threads that call it.
 * In front of the lists each thread keeps the last TL_BLOCKS small blocks
 * (at most TL_MAX_BYTES each) it released, and its next requests of their
 * class take them back without the lock: a tiny jitted call allocates and
 * releases one buffer, and the two lock round trips were a tenth of it once
 * a second thread existed. Those blocks are not counted in cached_bytes nor
 * held to the cap (a thread holds at most TL_BLOCKS * TL_MAX_BYTES there),
 * are used only while the cap is at least TL_MIN_CAP (so NABLA_CACHE_BYTES=0
 * still caches nothing), and go to the shared lists when the thread exits;
 * trimming or lowering the cap flushes the calling thread's.
 *
 * Under AddressSanitizer a cached block is poisoned, and the unused tail of a
 * block beyond the requested bytes too, so use-after-release and overruns are
 * still reported; handed-out blocks are filled with 0xff (NaN for floats), so a
 * kernel that relies on fresh memory reading as zero fails there. */
#include "../backends/backend.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define NBI_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NBI_ASAN 1
#endif
#endif
#ifdef NBI_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* A buffer header with its free-list link; nbi_buffer comes first, so the
 * pointer handed out converts back. */
typedef struct block {
  nbi_buffer b;
  struct block *next;
  int cls; /* size class (-1: uncached), set at allocation */
} block;

#define SMALL_BYTES 256 /* classes 64, 128, 192, 256 */
#define MAX_LOG 47      /* requests above 2^MAX_LOG bytes are not cached */
#define N_CLASSES (SMALL_BYTES / 64 + 4 * (MAX_LOG - 8))
#define DEFAULT_CAP ((size_t)1 << 30)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static block *free_list[NBI_MAX_DEVICES][N_CLASSES];
static size_t cached_bytes, cap_bytes; /* cap_bytes also read without the lock (relaxed) */
static bool configured, closed;        /* closed also read without the lock (relaxed) */

/* The calling thread's front (see the header). */
enum { TL_BLOCKS = 4, TL_MAX_BYTES = 64 << 10 };
#define TL_MIN_CAP ((size_t)64 << 20)
typedef struct tl_front {
  block *k[TL_BLOCKS];
  int n;
  bool registered; /* its thread-exit flush is set */
  bool exited;     /* flushed at thread exit: later releases (other exit
                      destructors) go to the shared lists */
} tl_front;
static _Thread_local tl_front tl;
static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;

/* Class index of a request of n bytes and its block size in *bytes; -1 for an
 * uncached request (*bytes = n rounded up to 64, or 0 when that overflows). */
static int size_class(size_t n, size_t *bytes) {
  if (n <= SMALL_BYTES) {
    size_t c = n ? (n - 1) / 64 : 0;
    *bytes = (c + 1) * 64;
    return (int)c;
  }
  if (n > (size_t)1 << MAX_LOG) {
    *bytes = n > SIZE_MAX - 63 ? 0 : (n + 63) & ~(size_t)63;
    return -1;
  }
  int k = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^k < n <= 2^(k+1), k >= 8 */
  size_t base = (size_t)1 << k, step = base >> 2;
  size_t j = (n - base + step - 1) / step; /* 1..4 */
  *bytes = base + j * step;
  return SMALL_BYTES / 64 + 4 * (k - 8) + (int)(j - 1);
}

size_t nbi_buffer_class_bytes(size_t nbytes) {
  size_t bytes;
  size_class(nbytes, &bytes);
  return bytes;
}

/* NABLA_CACHE_BYTES: decimal bytes, optional K/M/G (binary) suffix. */
static size_t parse_cap(const char *s) {
  if (!s || !*s) return DEFAULT_CAP;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || *s == '-') return DEFAULT_CAP;
  int shift = 0;
  switch (*end) {
  case 'k':
  case 'K': shift = 10, end++; break;
  case 'm':
  case 'M': shift = 20, end++; break;
  case 'g':
  case 'G': shift = 30, end++; break;
  default: break;
  }
  if (*end || (shift && v > (SIZE_MAX >> shift))) return DEFAULT_CAP;
  return (size_t)v << shift;
}

static void configure(void) {
  if (configured) return;
  configured = true;
  __atomic_store_n(&cap_bytes, parse_cap(getenv("NABLA_CACHE_BYTES")), __ATOMIC_RELAXED);
}

/* Only CPU memory is host memory the sanitizer (and memset) may touch. */
static bool host_memory(int dev) { return dev == 0; }

/* The block size a buffer of nbytes takes on dev: its class's size, or exactly
 * what was asked on a device that caches itself. */
static size_t block_bytes(const nbi_device *d, size_t nbytes) {
  size_t bytes;
  size_class(nbytes, &bytes);
  return d->be->own_cache ? nbytes : bytes;
}

static void block_free(block *k) {
  const nbi_device *d = nbi_device_at(k->b.device);
  size_t bytes = block_bytes(d, k->b.nbytes);
  if (host_memory(k->b.device)) UNPOISON(k->b.data, bytes);
  d->be->free(d->ctx, k->b.data, bytes ? bytes : 1);
  free(k);
}

/* Frees cached blocks of device dev (every device when dev < 0), largest
 * classes first, until at most limit bytes stay cached. */
static void evict_to(int dev, size_t limit) {
  for (int v = 0; v < NBI_MAX_DEVICES; v++) {
    if (dev >= 0 && v != dev) continue;
    for (int c = N_CLASSES - 1; c >= 0 && cached_bytes > limit; c--)
      while (free_list[v][c] && cached_bytes > limit) {
        block *k = free_list[v][c];
        free_list[v][c] = k->next;
        cached_bytes -= nbi_buffer_class_bytes(k->b.nbytes);
        block_free(k);
      }
  }
}

/* Hands block k out for a request of nbytes (its fields filled, memory
 * unpoisoned). */
static nbi_buffer *hand_out(block *k, int dev, size_t nbytes, size_t bytes, int c) {
  k->b.refcount = 1;
  k->b.device = dev;
  k->b.nbytes = nbytes;
  k->b.ext_free = NULL;
  k->b.ext_ctx = NULL;
  k->next = NULL;
  k->cls = c;
  if (host_memory(dev)) {
    UNPOISON(k->b.data, nbytes);
    POISON((char *)k->b.data + nbytes, bytes - nbytes);
#ifdef NBI_ASAN
    memset(k->b.data, 0xff, nbytes);
#endif
  }
  return &k->b;
}

nbi_buffer *nbi_buffer_alloc(int dev, size_t nbytes) {
  const nbi_device *d = nbi_device_at(dev);
  size_t bytes;
  int c = d->be->own_cache ? -1 : size_class(nbytes, &bytes);
  if (d->be->own_cache) bytes = nbytes ? nbytes : 1;
  for (int i = tl.n - 1; c >= 0 && i >= 0; i--) /* this thread's front, newest first */
    if (tl.k[i]->cls == c && tl.k[i]->b.device == dev) {
      block *k = tl.k[i];
      tl.k[i] = tl.k[--tl.n];
      nbi_stats_alloc(nbytes, true);
      return hand_out(k, dev, nbytes, bytes, c);
    }
  block *k = NULL;
  bool hit = false;
  pthread_mutex_lock(&lock);
  configure();
  if (c >= 0 && free_list[dev][c]) {
    k = free_list[dev][c];
    free_list[dev][c] = k->next;
    cached_bytes -= bytes;
    hit = true;
  } else if (bytes) {
    k = malloc(sizeof *k);
    void *data = k ? d->be->alloc(d->ctx, bytes) : NULL;
    if (k && !data && cached_bytes) { /* out of memory: free what this device caches, retry */
      evict_to(dev, 0);
      data = d->be->alloc(d->ctx, bytes);
    }
    if (!data) {
      free(k);
      k = NULL;
    } else {
      k->b.data = data;
    }
  }
  pthread_mutex_unlock(&lock);
  if (!k) {
    nbi_error(NB_ERR_OOM, "nabla: out of memory allocating %zu bytes on %s", nbytes, d->name);
    return NULL;
  }
  nbi_stats_alloc(nbytes, hit);
  return hand_out(k, dev, nbytes, bytes, c);
}

nbi_buffer *nbi_buffer_wrap(void *data, size_t nbytes, void (*ext_free)(void *), void *ext_ctx) {
  block *k = malloc(sizeof *k);
  if (!k) {
    nbi_error(NB_ERR_OOM, "nabla: out of memory wrapping %zu bytes", nbytes);
    return NULL;
  }
  *k = (block){.b = {.refcount = 1,
                     .device = 0,
                     .nbytes = nbytes,
                     .data = data,
                     .ext_free = ext_free,
                     .ext_ctx = ext_ctx},
               .cls = -1};
  nbi_stats_alloc(nbytes, false);
  return &k->b;
}

void nbi_buffer_retain(nbi_buffer *b) {
  if (b) NBI_REF_INC(b);
}

/* Puts k on its class's shared list, or frees it past the cap. Called with
 * lock held. */
static void give_back_locked(block *k) {
  size_t bytes = nbi_buffer_class_bytes(k->b.nbytes);
  if (!closed && k->cls >= 0 && bytes <= cap_bytes - cached_bytes) {
    if (host_memory(k->b.device)) POISON(k->b.data, bytes);
    k->next = free_list[k->b.device][k->cls];
    free_list[k->b.device][k->cls] = k;
    cached_bytes += bytes;
  } else {
    block_free(k);
  }
}

/* Moves the calling thread's front to the shared lists. */
static void tl_flush(void) {
  if (!tl.n) return;
  pthread_mutex_lock(&lock);
  while (tl.n)
    give_back_locked(tl.k[--tl.n]);
  pthread_mutex_unlock(&lock);
}

static void tl_exit(void *arg) {
  (void)arg;
  tl_flush();
  tl.exited = true;
}
static void tl_key_make(void) { (void)pthread_key_create(&tl_key, tl_exit); }

/* Keeps k in this thread's front when it is small and there is room. */
static bool tl_keep(block *k) {
  if (k->cls < 0 || tl.n == TL_BLOCKS || tl.exited || __atomic_load_n(&closed, __ATOMIC_RELAXED) ||
      __atomic_load_n(&cap_bytes, __ATOMIC_RELAXED) < TL_MIN_CAP)
    return false;
  size_t bytes = nbi_buffer_class_bytes(k->b.nbytes);
  if (bytes > TL_MAX_BYTES) return false;
  if (!tl.registered) { /* the flush at thread exit (any non-NULL value runs it) */
    (void)pthread_once(&tl_once, tl_key_make);
    if (pthread_setspecific(tl_key, &tl)) return false;
    tl.registered = true;
  }
  if (host_memory(k->b.device)) POISON(k->b.data, bytes);
  tl.k[tl.n++] = k;
  return true;
}

void nbi_buffer_release(nbi_buffer *b) {
  if (!b || NBI_REF_DEC(b) > 0) return;
  block *k = (block *)b;
  nbi_stats_free(b->nbytes);
  if (b->ext_free) { /* external memory: its owner frees it */
    b->ext_free(b->ext_ctx);
    free(k);
    return;
  }
  if (tl_keep(k)) return;
  pthread_mutex_lock(&lock);
  give_back_locked(k);
  pthread_mutex_unlock(&lock);
}

void nbi_buffer_cache_trim(void) {
  tl_flush();
  pthread_mutex_lock(&lock);
  evict_to(-1, 0);
  pthread_mutex_unlock(&lock);
}

size_t nbi_buffer_cache_set_cap(size_t cap) {
  tl_flush();
  pthread_mutex_lock(&lock);
  configure();
  size_t old = cap_bytes;
  __atomic_store_n(&cap_bytes, cap, __ATOMIC_RELAXED);
  evict_to(-1, cap);
  pthread_mutex_unlock(&lock);
  return old;
}

void nbi_buffer_cache_stats(nb_stats *s) {
  pthread_mutex_lock(&lock);
  s->cached_bytes = cached_bytes;
  pthread_mutex_unlock(&lock);
}

/* At exit: hand every cached block back, so leak checkers see none, and free
 * whatever is released later (other destructors) directly. */
__attribute__((destructor)) static void buffer_cache_cleanup(void) {
  tl_flush();
  pthread_mutex_lock(&lock);
  evict_to(-1, 0);
  __atomic_store_n(&closed, true, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&lock);
}
