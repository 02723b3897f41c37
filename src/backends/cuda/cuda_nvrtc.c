/* src/backends/cuda/cuda_nvrtc.c — NVRTC compilation, the kernel caches, module
 * loading and launches.
 *
 * A kernel is known by its source text. Three caches stand between a launch
 * and NVRTC:
 *  - functions: (device, hash of the source, kernel name) -> CUfunction, the
 *    hot path (one hash of the source and one lookup per call);
 *  - modules: (device, cache key) -> CUmodule, and images: cache key ->
 *    CUBIN / PTX, in memory for the process;
 *  - the disk: one file per cache key, so a new process skips NVRTC.
 * The cache key hashes the source, the options, NVRTC's version and the
 * target arch (never the output). Misses are serialized by one lock (NVRTC,
 * disk and module loading); lookups take a short table lock. */
#include "cuda_be.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Options beside the target; part of every cache key. No fast math: results
 * must keep IEEE semantics. No FMA contraction: like the CPU build
 * (-ffp-contract=off), a kernel gives the bits its source spells out, so a
 * formula computes the same on both backends (kernels that want a fused
 * multiply-add write fmaf / fma). */
static const char *const base_options[] = {"--std=c++17", "-default-device", "--fmad=false"};
#define N_BASE_OPTIONS 3

/* ---- hashing -----------------------------------------------------------------------------------
 */
static uint64_t rotl64(uint64_t x, int r) { return x << r | x >> (64 - r); }

/* A 64-bit avalanche (every input bit flips each output bit with p ~ 1/2). */
static uint64_t avalanche(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

/* 128-bit hash of n bytes: two lanes absorb 16 bytes per step, each through a
 * multiply and a rotation, and feed each other; the length and a final
 * avalanche of both lanes close it. Not cryptographic: a cache key. */
static void hash_bytes(const void *data, size_t n, uint64_t seed, uint64_t out[2]) {
  const unsigned char *p = data;
  uint64_t a = seed ^ 0x6a09e667f3bcc908ull, b = ~seed ^ 0xbb67ae8584caa73bull;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint64_t w0, w1;
    memcpy(&w0, p + i, 8);
    memcpy(&w1, p + i + 8, 8);
    a = rotl64((a ^ w0) * 0x9e3779b97f4a7c15ull, 29) + b;
    b = rotl64((b ^ w1) * 0xc2b2ae3d27d4eb4full, 31) + a;
  }
  uint64_t t[2] = {0, 0};
  memcpy(t, p + i, n - i);
  a = rotl64((a ^ t[0]) * 0x9e3779b97f4a7c15ull, 29) + b;
  b = rotl64((b ^ t[1]) * 0xc2b2ae3d27d4eb4full, 31) + a;
  a = avalanche(a ^ (uint64_t)n);
  b = avalanche(b + a);
  out[0] = avalanche(a + b);
  out[1] = b;
}

/* ---- targets ----------------------------------------------------------------------------------
 */
static int supported[64], n_supported, nvrtc_major, nvrtc_minor;
static pthread_once_t archs_once = PTHREAD_ONCE_INIT;

/* Reads NVRTC's version and the archs it compiles for (once). */
static void query_archs(void) {
  if (!nbi_nvrtc_load()) return;
  int n = 0;
  if (nbi_cu.nvrtcVersion(&nvrtc_major, &nvrtc_minor) != NVRTC_SUCCESS ||
      nbi_cu.nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 || n > 64)
    return;
  if (nbi_cu.nvrtcGetSupportedArchs(supported) == NVRTC_SUCCESS) n_supported = n;
}

/* How a kernel is compiled: the -arch option and whether it gives PTX. */
typedef struct target {
  bool ptx;
  char opt[32];
} target;

/* How arch is compiled: "-arch=sm_<arch>" (a CUBIN) when NVRTC lists it, else
 * "-arch=compute_<a>" (PTX the driver finishes) for the newest listed a below
 * arch. false when arch is older than every arch NVRTC knows. */
static bool pick_target(int arch, target *t) {
  pthread_once(&archs_once, query_archs);
  int best = -1;
  for (int i = 0; i < n_supported; i++) {
    if (supported[i] == arch) {
      t->ptx = false;
      snprintf(t->opt, sizeof t->opt, "-arch=sm_%d", arch);
      return true;
    }
    if (supported[i] < arch && supported[i] > best) best = supported[i];
  }
  if (best < 0) return false;
  t->ptx = true;
  snprintf(t->opt, sizeof t->opt, "-arch=compute_%d", best);
  return true;
}

/* The cache key of a source whose hash is h, compiled for arch. */
static void key_of(const uint64_t h[2], int arch, uint64_t key[2]) {
  target t = {.ptx = false};
  if (!pick_target(arch, &t)) snprintf(t.opt, sizeof t.opt, "-arch=none_%d", arch);
  char text[256];
  int w = snprintf(text, sizeof text, "%016llx%016llx|%s|%s|%s|%s|nvrtc %d.%d|%d",
                   (unsigned long long)h[0], (unsigned long long)h[1], t.opt, base_options[0],
                   base_options[1], base_options[2], nvrtc_major, nvrtc_minor, arch);
  hash_bytes(text, w > 0 && (size_t)w < sizeof text ? (size_t)w : sizeof text - 1, 0x6b6579, key);
}

/* key as 32 hex digits + NUL. */
static void key_hex(const uint64_t key[2], char hex[33]) {
  snprintf(hex, 33, "%016llx%016llx", (unsigned long long)key[0], (unsigned long long)key[1]);
}

/* The cache key of (src, arch) in hex. */
void nbi_cuda_cache_key(const char *src, int arch, char key[33]) {
  uint64_t h[2], k[2];
  hash_bytes(src, strlen(src), 0, h);
  key_of(h, arch, k);
  key_hex(k, key);
}

/* ---- compilation -------------------------------------------------------------------------------
 */
/* Records NB_ERR_DEVICE for a failed NVRTC call. */
static nb_status nvrtc_fail(nvrtcResult r, const char *call) {
  const char *s = nbi_cu.nvrtcGetErrorString ? nbi_cu.nvrtcGetErrorString(r) : NULL;
  return nbi_error(NB_ERR_DEVICE, "nabla: %s failed: %s", call, s ? s : "unknown NVRTC error");
}

/* Records the failed compilation of what for t with NVRTC's log: from its
 * first error line, cut to fit the message. */
static nb_status compile_failed(nvrtcProgram prog, nvrtcResult r, const char *what,
                                const target *t) {
  size_t n = 0;
  char *log = NULL;
  if (nbi_cu.nvrtcGetProgramLogSize(prog, &n) == NVRTC_SUCCESS && n > 0 && (log = malloc(n + 1))) {
    if (nbi_cu.nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) n = 0;
    log[n] = '\0';
  }
  const char *from = log ? log : "";
  const char *err = strstr(from, "error");
  if (err) {
    while (err > from && err[-1] != '\n')
      err--;
    from = err;
  }
  size_t len = strlen(from);
  while (len > 0 && (from[len - 1] == '\n' || from[len - 1] == ' '))
    len--;
  const size_t keep = 640;
  const char *rs = nbi_cu.nvrtcGetErrorString(r);
  nbi_error(NB_ERR_DEVICE, "nabla: NVRTC could not compile %s (%s, %s): %.*s%s",
            what ? what : "a kernel", t->opt + 6, rs ? rs : "error", (int)(len < keep ? len : keep),
            from, len > keep ? " ..." : "");
  free(log);
  return NB_ERR_DEVICE;
}

/* Compiles src for t into img (malloc'd); what names it in errors. */
static nb_status compile_target(const char *src, const target *t, const char *what,
                                nbi_cuda_image *img) {
  nvrtcProgram prog;
  nvrtcResult r = nbi_cu.nvrtcCreateProgram(&prog, src, "nabla.cu", 0, NULL, NULL);
  if (r != NVRTC_SUCCESS) return nvrtc_fail(r, "nvrtcCreateProgram");
  const char *opts[N_BASE_OPTIONS + 1] = {t->opt};
  for (int i = 0; i < N_BASE_OPTIONS; i++)
    opts[i + 1] = base_options[i];
  nb_status st = NB_OK;
  r = nbi_cu.nvrtcCompileProgram(prog, N_BASE_OPTIONS + 1, opts);
  if (r != NVRTC_SUCCESS) {
    st = compile_failed(prog, r, what, t);
  } else {
    size_t n = 0;
    r = t->ptx ? nbi_cu.nvrtcGetPTXSize(prog, &n) : nbi_cu.nvrtcGetCUBINSize(prog, &n);
    if (r != NVRTC_SUCCESS) {
      st = nvrtc_fail(r, t->ptx ? "nvrtcGetPTXSize" : "nvrtcGetCUBINSize");
    } else if (n == 0 || !(img->data = malloc(n))) {
      st = nbi_error(n ? NB_ERR_OOM : NB_ERR_DEVICE, "nabla: NVRTC gave no image for %s (%zu B)",
                     what ? what : "a kernel", n);
    } else {
      r = t->ptx ? nbi_cu.nvrtcGetPTX(prog, img->data) : nbi_cu.nvrtcGetCUBIN(prog, img->data);
      if (r != NVRTC_SUCCESS) {
        free(img->data);
        img->data = NULL;
        st = nvrtc_fail(r, t->ptx ? "nvrtcGetPTX" : "nvrtcGetCUBIN");
      } else {
        img->size = n;
        img->ptx = t->ptx;
      }
    }
  }
  r = nbi_cu.nvrtcDestroyProgram(&prog);
  if (st == NB_OK && r != NVRTC_SUCCESS) {
    free(img->data);
    img->data = NULL;
    st = nvrtc_fail(r, "nvrtcDestroyProgram");
  }
  return st;
}

/* Compiles src for arch into img (data NULL on failure); what names the
 * kernel in errors (NULL: "a kernel"). */
static nb_status compile_what(const char *src, int arch, const char *what, nbi_cuda_image *img) {
  *img = (nbi_cuda_image){.data = NULL};
  if (!src) return nbi_error(NB_ERR_NULL, "nabla: no kernel source to compile");
  if (!nbi_nvrtc_load()) return nbi_error(NB_ERR_DEVICE, "nabla: NVRTC: %s", nbi_cu.why);
  target t;
  if (!pick_target(arch, &t))
    return nbi_error(NB_ERR_DEVICE, "nabla: NVRTC %d.%d cannot compile for sm_%d (too old)",
                     nvrtc_major, nvrtc_minor, arch);
  return compile_target(src, &t, what, img);
}

/* See cuda_be.h: CUBIN or PTX of src for arch, img->data malloc'd. */
nb_status nbi_cuda_compile(const char *src, int arch, nbi_cuda_image *img) {
  return compile_what(src, arch, NULL, img);
}

/* ---- statistics ---------------------------------------------------------------------------------
 */
static _Atomic uint64_t n_compiles, n_memory_hits, n_disk_hits, n_disk_writes;
static _Atomic uint64_t compile_ns, n_precompiles; /* time inside compile_what; ahead */

static uint64_t mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The counters since the process started (or the last reset). */
nbi_cuda_cache_stats nbi_cuda_cache_get_stats(void) {
  return (nbi_cuda_cache_stats){.compiles = atomic_load(&n_compiles),
                                .memory_hits = atomic_load(&n_memory_hits),
                                .disk_hits = atomic_load(&n_disk_hits),
                                .disk_writes = atomic_load(&n_disk_writes),
                                .precompiles = atomic_load(&n_precompiles),
                                .compile_s = (double)atomic_load(&compile_ns) * 1e-9};
}

/* ---- the disk cache -----------------------------------------------------------------------------
 */
static char cache_dir[4096];
static atomic_bool disk_off;
static atomic_flag warned = ATOMIC_FLAG_INIT;
static pthread_once_t dir_once = PTHREAD_ONCE_INIT;

/* Turns the disk cache off, saying why once per process. */
static void disk_disable(const char *why, const char *path, int err) {
  atomic_store(&disk_off, true);
  if (!atomic_flag_test_and_set(&warned))
    fprintf(stderr, "nabla: warning: kernel disk cache disabled: %s %s: %s\n", why, path,
            strerror(err));
}

/* Creates path and its missing parents (mode 0755 less the umask). */
static int make_dirs(char *path) {
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char saved = *p;
    *p = '\0';
    int r = mkdir(path, 0755);
    int err = errno;
    *p = saved;
    if (r != 0 && err != EEXIST) return err;
    if (saved == '\0') break;
  }
  struct stat st;
  if (stat(path, &st) != 0) return errno;
  return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

/* Picks the disk cache folder from the environment and creates it; turns
 * the disk cache off (one warning) when it cannot. */
static void resolve_dir(void) {
  const char *env = getenv("NABLA_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"),
             *home = getenv("HOME");
  int w;
  if (env && env[0])
    w = snprintf(cache_dir, sizeof cache_dir, "%s", env);
  else if (xdg && xdg[0] == '/')
    w = snprintf(cache_dir, sizeof cache_dir, "%s/nabla/kernels", xdg);
  else if (home && home[0])
    w = snprintf(cache_dir, sizeof cache_dir, "%s/.cache/nabla/kernels", home);
  else
    w = snprintf(cache_dir, sizeof cache_dir, "%s", "");
  if (w <= 0 || (size_t)w >= sizeof cache_dir - 64) {
    disk_disable("no usable folder:", w > 0 ? "(path too long)" : "(HOME unset)", ENOENT);
    cache_dir[0] = '\0';
    return;
  }
  while (w > 1 && cache_dir[w - 1] == '/')
    cache_dir[--w] = '\0';
  int err = make_dirs(cache_dir);
  if (err) disk_disable("cannot create", cache_dir, err);
}

/* The disk cache folder, "" when the disk cache is off. */
const char *nbi_cuda_cache_dir(void) {
  pthread_once(&dir_once, resolve_dir);
  return atomic_load(&disk_off) ? "" : cache_dir;
}

/* A cache file: this header, then the image. */
typedef struct disk_header {
  char magic[8];   /* "NBKERNL1" */
  uint64_t size;   /* bytes of the image */
  uint64_t sum[2]; /* hash_bytes of the image */
  uint32_t ptx;    /* 1: PTX text, 0: CUBIN */
  uint32_t unused; /* 0 */
  char key[32];    /* the file's key (hex) */
} disk_header;
#define DISK_MAGIC "NBKERNL1"
#define DISK_MAX_IMAGE ((uint64_t)1 << 30)

/* Reads exactly n bytes; false on error or end of file. */
static bool read_all(int fd, void *buf, size_t n) {
  for (char *p = buf; n > 0;) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= (size_t)r;
  }
  return true;
}

/* Writes exactly n bytes; false on error. */
static bool write_all(int fd, const void *buf, size_t n) {
  for (const char *p = buf; n > 0;) {
    ssize_t r = write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= (size_t)r;
  }
  return true;
}

/* The image of key hex from the disk cache into img (malloc'd); false when
 * absent, unreadable, truncated or corrupt (the caller compiles and rewrites). */
static bool disk_read(const char *hex, nbi_cuda_image *img) {
  const char *dir = nbi_cuda_cache_dir();
  if (!dir[0]) return false;
  char path[4200];
  snprintf(path, sizeof path, "%s/%s.nbk", dir, hex);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  disk_header h;
  struct stat st;
  bool ok = fstat(fd, &st) == 0 && read_all(fd, &h, sizeof h) &&
            memcmp(h.magic, DISK_MAGIC, 8) == 0 && memcmp(h.key, hex, 32) == 0 && h.size > 0 &&
            h.size <= DISK_MAX_IMAGE && h.ptx <= 1 && h.unused == 0 &&
            (uint64_t)st.st_size == sizeof h + h.size;
  void *data = ok ? malloc((size_t)h.size) : NULL;
  ok = data && read_all(fd, data, (size_t)h.size);
  close(fd);
  if (ok) {
    uint64_t sum[2];
    hash_bytes(data, (size_t)h.size, 0, sum);
    ok = sum[0] == h.sum[0] && sum[1] == h.sum[1];
    /* PTX is loaded as text: it must end in its NUL */
    ok = ok && (!h.ptx || ((const char *)data)[h.size - 1] == '\0');
  }
  if (!ok) {
    free(data);
    return false;
  }
  *img = (nbi_cuda_image){.data = data, .size = (size_t)h.size, .ptx = h.ptx != 0};
  return true;
}

/* Writes img as key hex's file: a temporary file in the same folder renamed
 * into place, so readers see a whole file or none. A failure disables the
 * disk cache (one warning). */
static void disk_write(const char *hex, const nbi_cuda_image *img) {
  const char *dir = nbi_cuda_cache_dir();
  if (!dir[0]) return;
  char path[4200], tmp[4200];
  snprintf(path, sizeof path, "%s/%s.nbk", dir, hex);
  snprintf(tmp, sizeof tmp, "%s/.%s.XXXXXX", dir, hex);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    disk_disable("cannot write in", dir, errno);
    return;
  }
  disk_header h = {.size = img->size, .ptx = img->ptx};
  memcpy(h.magic, DISK_MAGIC, 8);
  memcpy(h.key, hex, 32);
  hash_bytes(img->data, img->size, 0, h.sum);
  bool ok = write_all(fd, &h, sizeof h) && write_all(fd, img->data, img->size);
  int err = errno;
  if (close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && rename(tmp, path) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    unlink(tmp);
    disk_disable("cannot write in", dir, err);
    return;
  }
  atomic_fetch_add(&n_disk_writes, 1);
}

/* ---- in-memory tables
 * ------------------------------------------------------------------------------ */
/* Chained hash tables of entries that start with this header; h picks the
 * chain, callers compare the rest. */
typedef struct entry {
  struct entry *next;
  uint64_t h;
} entry;

typedef struct table {
  entry **b;
  size_t cap, n;
} table;

/* Adds e (e->h set); false when out of host memory. */
static bool table_put(table *t, entry *e) {
  if (t->n >= t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    entry **b = calloc(cap, sizeof *b);
    if (!b) {
      if (!t->cap) return false;
    } else {
      for (size_t i = 0; i < t->cap; i++) {
        for (entry *x = t->b[i], *nx; x; x = nx) {
          nx = x->next;
          x->next = b[x->h & (cap - 1)];
          b[x->h & (cap - 1)] = x;
        }
      }
      free(t->b);
      t->b = b;
      t->cap = cap;
    }
  }
  e->next = t->b[e->h & (t->cap - 1)];
  t->b[e->h & (t->cap - 1)] = e;
  t->n++;
  return true;
}

/* The first entry of h's chain (callers compare keys), NULL if none. */
static entry *table_chain(const table *t, uint64_t h) {
  return t->cap ? t->b[h & (t->cap - 1)] : NULL;
}

typedef struct img_entry {
  entry e;
  uint64_t key[2];
  nbi_cuda_image img;
} img_entry;

typedef struct mod_entry {
  entry e;
  const nbi_cuda_ctx *c;
  uint64_t key[2];
  CUmodule mod;
} mod_entry;

typedef struct fn_entry {
  entry e;
  const nbi_cuda_ctx *c;
  uint64_t src[2]; /* hash of the source */
  CUfunction fn;
  char name[]; /* the kernel's name */
} fn_entry;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER; /* the tables */
static pthread_mutex_t miss_lock = PTHREAD_MUTEX_INITIALIZER;  /* NVRTC, disk, module loads */
static table images, modules, functions;

/* 64 bits of a kernel name's hash. */
static uint64_t name_hash(const char *name) {
  uint64_t h[2];
  hash_bytes(name, strlen(name), 0x6e616d65, h);
  return h[0];
}

/* The function table's hash of (device, source hash, name hash). */
static uint64_t fn_slot(const nbi_cuda_ctx *c, const uint64_t src[2], uint64_t name_h) {
  return avalanche(src[0] ^ name_h ^ (uint64_t)(uintptr_t)c);
}

/* The cached image of key, NULL if none; under table_lock. */
static const nbi_cuda_image *image_find(const uint64_t key[2]) {
  for (entry *e = table_chain(&images, key[0]); e; e = e->next) {
    img_entry *x = (img_entry *)e;
    if (x->key[0] == key[0] && x->key[1] == key[1]) return &x->img;
  }
  return NULL;
}

static CUfunction function_find(const nbi_cuda_ctx *c, const uint64_t src[2], const char *name,
                                uint64_t slot) {
  for (entry *e = table_chain(&functions, slot); e; e = e->next) {
    fn_entry *x = (fn_entry *)e;
    if (x->c == c && x->src[0] == src[0] && x->src[1] == src[1] && !strcmp(x->name, name))
      return x->fn;
  }
  return NULL;
}

/* Module of key loaded on c, NULL if none; under table_lock. */
static CUmodule module_find(const nbi_cuda_ctx *c, const uint64_t key[2]) {
  uint64_t slot = avalanche(key[0] ^ (uint64_t)(uintptr_t)c);
  for (entry *e = table_chain(&modules, slot); e; e = e->next) {
    mod_entry *x = (mod_entry *)e;
    if (x->c == c && x->key[0] == key[0] && x->key[1] == key[1]) return x->mod;
  }
  return NULL;
}

/* Test hook: frees the in-memory images and zeroes the counters. */
void nbi_cuda_cache_reset(void) {
  pthread_mutex_lock(&miss_lock);
  pthread_mutex_lock(&table_lock);
  for (size_t i = 0; i < images.cap; i++) {
    for (entry *e = images.b[i], *nx; e; e = nx) {
      nx = e->next;
      free(((img_entry *)e)->img.data);
      free(e);
    }
  }
  free(images.b);
  images = (table){.b = NULL};
  pthread_mutex_unlock(&table_lock);
  pthread_mutex_unlock(&miss_lock);
  atomic_store(&n_compiles, 0);
  atomic_store(&compile_ns, 0);
  atomic_store(&n_precompiles, 0);
  atomic_store(&n_memory_hits, 0);
  atomic_store(&n_disk_hits, 0);
  atomic_store(&n_disk_writes, 0);
}

/* compile_what, timed and counted. */
static nb_status compile_counted(const char *src, int arch, const char *what, nbi_cuda_image *img) {
  uint64_t t0 = mono_ns();
  nb_status st = compile_what(src, arch, what, img);
  atomic_fetch_add(&compile_ns, mono_ns() - t0);
  atomic_fetch_add(&n_compiles, 1);
  return st;
}

/* Keeps x (its image read from disk or compiled) as key's image, unless
 * another thread kept one first: then x is freed and that one is returned.
 * NULL (x freed) when the table cannot grow. */
static const nbi_cuda_image *image_adopt(const uint64_t key[2], img_entry *x) {
  memcpy(x->key, key, sizeof x->key);
  x->e.h = key[0];
  pthread_mutex_lock(&table_lock);
  const nbi_cuda_image *have = image_find(key);
  bool put = !have && table_put(&images, &x->e);
  pthread_mutex_unlock(&table_lock);
  if (put) return &x->img;
  free(x->img.data);
  free(x);
  return have;
}

/* The image of key (source src) from memory, disk or NVRTC; called under
 * miss_lock. *hit says which served it: 0 memory, 1 disk, 2 NVRTC. */
static nb_status image_by_key(const char *src, int arch, const uint64_t key[2], const char *what,
                              const nbi_cuda_image **out, int *hit) {
  pthread_mutex_lock(&table_lock);
  const nbi_cuda_image *found = image_find(key);
  pthread_mutex_unlock(&table_lock);
  if (found) {
    *out = found;
    *hit = 0;
    return NB_OK;
  }
  char hex[33];
  key_hex(key, hex);
  img_entry *x = calloc(1, sizeof *x);
  if (!x) return nbi_error(NB_ERR_OOM, "nabla: out of host memory for the kernel cache");
  if (disk_read(hex, &x->img)) {
    *hit = 1;
  } else {
    nb_status st = compile_counted(src, arch, what, &x->img);
    if (st != NB_OK) {
      free(x);
      return st;
    }
    disk_write(hex, &x->img);
    *hit = 2;
  }
  *out = image_adopt(key, x);
  return *out ? NB_OK : nbi_error(NB_ERR_OOM, "nabla: out of host memory for the kernel cache");
}

/* Counts a lookup served from memory (hit 0) or disk (1); compiles (2) are
 * counted where NVRTC runs. */
static void count_hit(int hit) {
  if (hit == 0) atomic_fetch_add(&n_memory_hits, 1);
  if (hit == 1) atomic_fetch_add(&n_disk_hits, 1);
}

nb_status nbi_cuda_image_get(const char *src, int arch, const char *what,
                             const nbi_cuda_image **img) {
  if (!src) return nbi_error(NB_ERR_NULL, "nabla: no kernel source to compile");
  uint64_t h[2], key[2];
  hash_bytes(src, strlen(src), 0, h);
  key_of(h, arch, key);
  pthread_mutex_lock(&miss_lock);
  int hit = 0;
  nb_status st = image_by_key(src, arch, key, what, img, &hit);
  pthread_mutex_unlock(&miss_lock);
  if (st == NB_OK) count_hit(hit);
  return st;
}

/* ---- compiling ahead, in parallel ------------------------------------------------------
 * nbi_cuda_precompile: the images of srcs that neither memory nor disk holds,
 * compiled by up to PRE_THREADS threads at once, then kept as a compile at
 * launch would keep them. */
enum { PRE_THREADS = 16 };

typedef struct pre_job {
  char *const *srcs;
  const uint64_t (*keys)[2];
  const int *missing;
  int n_missing, arch;
  _Atomic int next;
} pre_job;

/* Compiles the sources the job lists, one at a time, until none is left. A
 * failure is dropped (the launch compiles again and reports it); so is this
 * thread's record of it, with the thread. */
static void *pre_worker(void *arg) {
  pre_job *j = arg;
  for (int i; (i = atomic_fetch_add(&j->next, 1)) < j->n_missing;) {
    int k = j->missing[i];
    img_entry *x = calloc(1, sizeof *x);
    if (!x) continue;
    atomic_fetch_add(&n_precompiles, 1);
    if (compile_counted(j->srcs[k], j->arch, NULL, &x->img) != NB_OK) {
      free(x);
      continue;
    }
    char hex[33];
    key_hex(j->keys[k], hex);
    disk_write(hex, &x->img);
    image_adopt(j->keys[k], x);
  }
  return NULL;
}

void nbi_cuda_precompile(nbi_cuda_ctx *c, char *const *srcs, int n) {
  if (!c || n <= 0 || !nbi_nvrtc_load()) return;
  int arch = c->cc_major * 10 + c->cc_minor;
  uint64_t(*keys)[2] = malloc(sizeof *keys * (size_t)n);
  int *missing = malloc(sizeof *missing * (size_t)n), n_missing = 0;
  if (!keys || !missing) {
    free(keys);
    free(missing);
    return;
  }
  for (int k = 0; k < n; k++) {
    if (!srcs[k]) continue;
    uint64_t h[2];
    hash_bytes(srcs[k], strlen(srcs[k]), 0, h);
    key_of(h, arch, keys[k]);
    bool dup = false;
    for (int i = 0; i < n_missing && !dup; i++)
      dup = !memcmp(keys[missing[i]], keys[k], sizeof keys[k]);
    pthread_mutex_lock(&table_lock);
    bool have = dup || image_find(keys[k]);
    pthread_mutex_unlock(&table_lock);
    if (have) continue;
    char hex[33];
    key_hex(keys[k], hex);
    img_entry *x = calloc(1, sizeof *x);
    if (x && disk_read(hex, &x->img)) {
      atomic_fetch_add(&n_disk_hits, 1);
      image_adopt(keys[k], x);
      continue;
    }
    free(x);
    missing[n_missing++] = k;
  }
  pre_job j = {.srcs = srcs,
               .keys = (const uint64_t(*)[2])keys,
               .missing = missing,
               .n_missing = n_missing,
               .arch = arch};
  atomic_init(&j.next, 0);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = n_missing < PRE_THREADS ? n_missing : PRE_THREADS;
  if (cpus > 0 && nt > cpus) nt = (int)cpus;
  pthread_t th[PRE_THREADS]; /* workers of their own: the caller's error state stays */
  int started = 0;
  for (int i = 0; i < nt; i++)
    if (pthread_create(&th[started], NULL, pre_worker, &j) == 0) started++;
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  free(keys);
  free(missing);
}

/* Loads the module of (src, key) on c, or finds it; under miss_lock. */
static nb_status module_get(nbi_cuda_ctx *c, const char *src, const uint64_t key[2],
                            const char *name, CUmodule *mod, int *hit) {
  pthread_mutex_lock(&table_lock);
  *mod = module_find(c, key);
  pthread_mutex_unlock(&table_lock);
  if (*mod) {
    *hit = 0;
    return NB_OK;
  }
  const nbi_cuda_image *img;
  nb_status st = image_by_key(src, c->cc_major * 10 + c->cc_minor, key, name, &img, hit);
  if (st != NB_OK) return st;
  mod_entry *x = calloc(1, sizeof *x);
  if (!x) return nbi_error(NB_ERR_OOM, "nabla: out of host memory for the kernel cache");
  CUresult r = nbi_cu.cuModuleLoadData(&x->mod, img->data);
  if (r != CUDA_SUCCESS) {
    free(x);
    char what[160];
    snprintf(what, sizeof what, "nabla: loading the module of %s on cuda:%d (%s)", name, c->index,
             img->ptx ? "PTX" : "CUBIN");
    return nbi_cu_check(r, what);
  }
  x->c = c;
  memcpy(x->key, key, sizeof x->key);
  x->e.h = avalanche(key[0] ^ (uint64_t)(uintptr_t)c);
  pthread_mutex_lock(&table_lock);
  bool put = table_put(&modules, &x->e);
  pthread_mutex_unlock(&table_lock);
  if (!put) {
    nbi_cu.cuModuleUnload(x->mod);
    free(x);
    return nbi_error(NB_ERR_OOM, "nabla: out of host memory for the kernel cache");
  }
  *mod = x->mod;
  return NB_OK;
}

/* Function name of src on c: the function table (hot path: one hash of src,
 * one lookup), else under miss_lock the module (loaded from an image of
 * memory, disk or NVRTC) and cuModuleGetFunction. c's context is current. */
nb_status nbi_cuda_function(nbi_cuda_ctx *c, const char *src, const char *name, CUfunction *fn) {
  if (!src || !name) return nbi_error(NB_ERR_NULL, "nabla: nbi_cuda_function: NULL source or name");
  uint64_t h[2];
  hash_bytes(src, strlen(src), 0, h);
  uint64_t slot = fn_slot(c, h, name_hash(name));
  pthread_mutex_lock(&table_lock);
  *fn = function_find(c, h, name, slot);
  pthread_mutex_unlock(&table_lock);
  if (*fn) {
    atomic_fetch_add(&n_memory_hits, 1);
    return NB_OK;
  }
  pthread_mutex_lock(&miss_lock);
  pthread_mutex_lock(&table_lock); /* another thread may have loaded it meanwhile */
  *fn = function_find(c, h, name, slot);
  pthread_mutex_unlock(&table_lock);
  int hit = 0;
  nb_status st = NB_OK;
  if (!*fn) {
    uint64_t key[2];
    key_of(h, c->cc_major * 10 + c->cc_minor, key);
    CUmodule mod;
    st = module_get(c, src, key, name, &mod, &hit);
    size_t len = strlen(name);
    fn_entry *x = st == NB_OK ? calloc(1, sizeof *x + len + 1) : NULL;
    if (st == NB_OK && !x)
      st = nbi_error(NB_ERR_OOM, "nabla: out of host memory for the kernel cache");
    if (st == NB_OK) {
      char what[160];
      snprintf(what, sizeof what, "nabla: kernel %s on cuda:%d", name, c->index);
      st = nbi_cu_check(nbi_cu.cuModuleGetFunction(&x->fn, mod, name), what);
    }
    if (st == NB_OK) {
      x->c = c;
      memcpy(x->src, h, sizeof x->src);
      memcpy(x->name, name, len + 1);
      x->e.h = slot;
      pthread_mutex_lock(&table_lock);
      if (!table_put(&functions, &x->e))
        st = nbi_error(NB_ERR_OOM, "nabla: out of host memory for the kernel cache");
      pthread_mutex_unlock(&table_lock);
    }
    if (st == NB_OK)
      *fn = x->fn;
    else
      free(x);
  }
  pthread_mutex_unlock(&miss_lock);
  if (st == NB_OK) count_hit(hit);
  return st;
}

nb_status nbi_cuda_launch(nbi_cuda_ctx *c, CUfunction f, unsigned grid_x, unsigned grid_y,
                          unsigned block_x, unsigned smem, void **args) {
  if (grid_x == 0 || grid_y == 0) return NB_OK;
  if (block_x == 0 || block_x > 1024 || grid_x > 0x7fffffffu || grid_y > 65535)
    return nbi_error(NB_ERR_INTERNAL, "nabla: cuda:%d: bad launch: grid %ux%u, block %u", c->index,
                     grid_x, grid_y, block_x);
  if (smem > 48 * 1024) {
    if (smem > c->smem_optin)
      return nbi_error(NB_ERR_INTERNAL,
                       "nabla: cuda:%d: a kernel asks for %u B of shared memory (limit %zu)",
                       c->index, smem, c->smem_optin);
    nb_status st = nbi_cu_check(
        nbi_cu.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem),
        "nabla: cuFuncSetAttribute");
    if (st != NB_OK) return st;
  }
  return nbi_cu_check(
      nbi_cu.cuLaunchKernel(f, grid_x, grid_y, 1, block_x, 1, 1, smem, c->stream, args, NULL),
      "nabla: cuLaunchKernel");
}
