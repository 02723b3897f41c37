/* test/fake_cuda/fake_module.c — the fake driver's kernels: images, modules, functions
 * and launches.
 *
 * An image is what the fake NVRTC gives (FK_IMAGE_MAGIC, the target, the C++ dialect,
 * then the source). cuModuleLoadData checks its target against the device as the
 * driver would (a CUBIN for sm_90 exactly, PTX for compute_XX with XX <= 90, anything
 * else CUDA_ERROR_NO_BINARY_FOR_GPU; a real CUBIN or PTX is CUDA_ERROR_INVALID_IMAGE,
 * with a note on stderr), then compiles its source for the host (fake_host.c: a cache
 * hit when the fake NVRTC compiled it) and opens the object. A function is a kernel's
 * trampoline in that object.
 *
 * cuLaunchKernel checks the launch as the driver does (CUDA_ERROR_INVALID_VALUE for a
 * zero or oversized grid or block dimension, dynamic shared memory above 48 KiB the
 * function was not opted in to with cuFuncSetAttribute or above 227 KiB;
 * CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES for more threads than its __launch_bounds__), then
 * runs it before returning: its blocks are shared by the calling thread and a pool of
 * NABLA_FAKE_CUDA_THREADS - 1 host threads (default: one per CPU, at most 32), each
 * running a block's threads as fibers (test/cuda_host_shim.h). Launches are
 * serialized. A launch whose threads deadlock at barriers fails with
 * CUDA_ERROR_LAUNCH_FAILED (the reason on stderr); a kernel that faults crashes the
 * process, where a debugger shows the kernel's frame. Parameters are taken from
 * kernelParams only (NULL for a kernel with parameters is CUDA_ERROR_INVALID_VALUE;
 * `extra`, the packed form, is CUDA_ERROR_NOT_SUPPORTED). */
#include "fake_cuda.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FK_EXPORT __attribute__((visibility("default")))

/* ---- images ----------------------------------------------------------------------------- */
char *fk_image_make(const char *src, bool ptx, int arch, const char *std, size_t *n) {
  size_t len = strlen(src), cap = len + 128;
  char *img = malloc(cap);
  if (!img) return NULL;
  int w = snprintf(img, cap, "%s%s_%d %s\n", FK_IMAGE_MAGIC, ptx ? "compute" : "sm", arch, std);
  memcpy(img + w, src, len + 1);
  *n = (size_t)w + len + 1;
  return img;
}

/* A parsed image: its target and dialect, and where its source starts. */
typedef struct image {
  bool ptx;
  int arch;
  char std[16];
  const char *src;
} image;

/* Parses img; CUDA_SUCCESS, or the driver's error for an image it cannot load. */
static CUresult image_parse(const void *img, image *out) {
  const char *s = img;
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  if (strncmp(s, FK_IMAGE_MAGIC, sizeof FK_IMAGE_MAGIC - 1) != 0) {
    static bool noted;
    if (!noted)
      fprintf(stderr, "nabla fake CUDA: cuModuleLoadData got an image of another compiler (a "
                      "real CUBIN or PTX?): set NABLA_CUDA_NVRTC to the fake library too, and "
                      "NABLA_CACHE_DIR to a folder of its own\n");
    noted = true;
    return CUDA_ERROR_INVALID_IMAGE;
  }
  s += sizeof FK_IMAGE_MAGIC - 1;
  char kind[16];
  int used = 0;
  if (sscanf(s, "%15[a-z]_%d %15s%n", kind, &out->arch, out->std, &used) != 3 || s[used] != '\n')
    return CUDA_ERROR_INVALID_IMAGE;
  out->ptx = !strcmp(kind, "compute");
  if (!out->ptx && strcmp(kind, "sm")) return CUDA_ERROR_INVALID_IMAGE;
  out->src = s + used + 1;
  if (out->ptx ? out->arch > FK_ARCH : out->arch != FK_ARCH) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  return CUDA_SUCCESS;
}

/* ---- modules and functions ---------------------------------------------------------------
 * Live modules are listed so that an unloaded one is an error; their functions stay
 * allocated (marked dead) until the library unloads, so that a stale CUfunction is
 * an error too. */
struct CUfunc_st {
  struct CUfunc_st *next;
  CUmodule mod; /* NULL once its module is unloaded */
  void (*body)(void *);
  unsigned bounds; /* __launch_bounds__, 0: none */
  unsigned params; /* how many parameters it takes */
  int max_dyn;     /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
  char name[];
};

struct CUmod_st {
  struct CUmod_st *next;
  void *so;
  nb_shim_exec_fn exec;
  struct CUfunc_st *fns;
};

static pthread_mutex_t mod_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUmod_st *modules;
static struct CUfunc_st *dead_fns;

/* Whether m is a loaded module; under mod_lock. */
static bool module_live(CUmodule m) {
  for (struct CUmod_st *x = modules; x; x = x->next)
    if (x == m) return true;
  return false;
}

FK_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *img) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!module) return CUDA_ERROR_INVALID_VALUE;
  image im;
  if ((r = image_parse(img, &im)) != CUDA_SUCCESS) return r;
  char path[PATH_MAX];
  char *log = fk_host_compile(im.src, im.std, path);
  if (log) {
    fprintf(stderr,
            "nabla fake CUDA: cuModuleLoadData: the image's source does not compile "
            "for the host:\n%s\n",
            log);
    free(log);
    return im.ptx ? CUDA_ERROR_INVALID_PTX : CUDA_ERROR_INVALID_IMAGE;
  }
  void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr, "nabla fake CUDA: cuModuleLoadData: %s\n", dlerror());
    return CUDA_ERROR_SHARED_OBJECT_INIT_FAILED;
  }
  nb_shim_abi_fn abi;
  nb_shim_exec_fn exec;
  void *a = dlsym(so, "nb_shim_abi"), *e = dlsym(so, "nb_shim_exec");
  memcpy(&abi, &a, sizeof a);
  memcpy(&exec, &e, sizeof e);
  if (!abi || !exec || abi() != NB_SHIM_ABI) {
    dlclose(so);
    return CUDA_ERROR_INVALID_IMAGE;
  }
  struct CUmod_st *m = calloc(1, sizeof *m);
  if (!m) {
    dlclose(so);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  m->so = so;
  m->exec = exec;
  pthread_mutex_lock(&mod_lock);
  m->next = modules;
  modules = m;
  pthread_mutex_unlock(&mod_lock);
  *module = m;
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuModuleUnload(CUmodule m) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&mod_lock);
  bool live = false;
  for (struct CUmod_st **x = &modules; *x; x = &(*x)->next) {
    if (*x != m) continue;
    *x = m->next;
    live = true;
    break;
  }
  if (live) {
    while (m->fns) {
      struct CUfunc_st *f = m->fns;
      m->fns = f->next;
      f->mod = NULL;
      f->next = dead_fns;
      dead_fns = f;
    }
  }
  pthread_mutex_unlock(&mod_lock);
  if (!live) return CUDA_ERROR_INVALID_HANDLE;
  dlclose(m->so);
  free(m);
  return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule m, const char *name) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!hfunc || !name) return CUDA_ERROR_INVALID_VALUE;
  size_t len = strlen(name);
  char *sym = malloc(len + 16);
  if (!sym) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&mod_lock);
  struct CUfunc_st *f = NULL;
  if (!module_live(m)) {
    r = CUDA_ERROR_INVALID_HANDLE;
  } else {
    for (f = m->fns; f && strcmp(f->name, name); f = f->next) {
    }
    if (!f) {
      snprintf(sym, len + 16, "nb_shim_k_%s", name);
      void *body = dlsym(m->so, sym);
      snprintf(sym, len + 16, "nb_shim_b_%s", name);
      const unsigned *bounds = dlsym(m->so, sym);
      snprintf(sym, len + 16, "nb_shim_p_%s", name);
      const unsigned *params = dlsym(m->so, sym);
      f = body ? calloc(1, sizeof *f + len + 1) : NULL;
      r = !body ? CUDA_ERROR_NOT_FOUND : !f ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
      if (f) {
        memcpy(&f->body, &body, sizeof body);
        f->bounds = bounds ? *bounds : 0;
        f->params = params ? *params : 0;
        f->mod = m;
        memcpy(f->name, name, len + 1);
        f->next = m->fns;
        m->fns = f;
      }
    }
  }
  pthread_mutex_unlock(&mod_lock);
  free(sym);
  if (r == CUDA_SUCCESS) *hfunc = f;
  return r;
}

/* Whether f is a function of a loaded module; under mod_lock. */
static bool function_live(CUfunction f) {
  if (!f) return false;
  for (struct CUmod_st *m = modules; m; m = m->next)
    for (struct CUfunc_st *x = m->fns; x; x = x->next)
      if (x == f) return true;
  return false;
}

FK_EXPORT CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attrib, int value) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&mod_lock);
  if (!function_live(f)) {
    r = CUDA_ERROR_INVALID_HANDLE;
  } else if (attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (value < 0 || (size_t)value > FK_SMEM_OPTIN)
      r = CUDA_ERROR_INVALID_VALUE;
    else
      f->max_dyn = value;
  } else if (attrib == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT) {
    if (value < -1 || value > 100) r = CUDA_ERROR_INVALID_VALUE;
  } else {
    r = CUDA_ERROR_INVALID_VALUE; /* read-only, or nothing the fake models */
  }
  pthread_mutex_unlock(&mod_lock);
  return r;
}

/* ---- the pool of host threads ----------------------------------------------------------- */
#define MAX_WORKERS 32
#define STACK_BYTES ((size_t)256 << 10)

typedef struct worker {
  nb_shim_worker w;
  pthread_t th;
} worker;

static struct pool {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  worker w[MAX_WORKERS]; /* w[0]: the launching thread's */
  int n, made;           /* workers wanted; made (0: not yet) */
  uint64_t gen;
  int wanted, pending, failed;
  nb_shim_exec_fn exec;
  const nb_shim_launch *L;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER,
          .go = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};
static pthread_mutex_t launch_lock = PTHREAD_MUTEX_INITIALIZER;

/* Maps w's memory: stacks with a guard page below each, dynamic shared memory and
 * scratch; false when out of memory. */
static bool worker_map(worker *w) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t stacks = NB_SHIM_MAX_THREADS * STACK_BYTES;
  size_t bytes = stacks + NB_SHIM_DYN_SMEM_MAX + NB_SHIM_SCRATCH;
  char *p =
      mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  for (size_t i = 0; i < NB_SHIM_MAX_THREADS; i++)
    (void)mprotect(p + i * STACK_BYTES, page, PROT_NONE);
  w->w = (nb_shim_worker){.stacks = p,
                          .stack_bytes = STACK_BYTES,
                          .smem = p + stacks,
                          .scratch = p + stacks + NB_SHIM_DYN_SMEM_MAX};
  return true;
}

/* A pool thread: runs its share of each launch it is wanted for. */
static void *pool_main(void *arg) {
  int i = (int)(intptr_t)arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    while (pool.gen == seen)
      pthread_cond_wait(&pool.go, &pool.mu);
    seen = pool.gen;
    if (i >= pool.wanted) continue;
    nb_shim_exec_fn exec = pool.exec;
    const nb_shim_launch *L = pool.L;
    pthread_mutex_unlock(&pool.mu);
    int rc = exec(L, &pool.w[i].w);
    pthread_mutex_lock(&pool.mu);
    pool.failed |= rc != 0;
    if (--pool.pending == 0) pthread_cond_signal(&pool.done);
  }
  return NULL;
}

/* Makes the pool on first use (under launch_lock): NABLA_FAKE_CUDA_THREADS workers,
 * else one per CPU, at most MAX_WORKERS; false when not even w[0] could be made. */
static bool pool_ready(void) {
  if (pool.made) return true;
  const char *v = getenv("NABLA_FAKE_CUDA_THREADS");
  long n = v && v[0] ? strtol(v, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
  n = n < 1 ? 1 : n > MAX_WORKERS ? MAX_WORKERS : n;
  if (!worker_map(&pool.w[0])) return false;
  pool.made = 1;
  for (int i = 1; i < n; i++) {
    if (!worker_map(&pool.w[i])) break;
    if (pthread_create(&pool.w[i].th, NULL, pool_main, (void *)(intptr_t)i) != 0) {
      munmap(pool.w[i].w.stacks,
             NB_SHIM_MAX_THREADS * STACK_BYTES + NB_SHIM_DYN_SMEM_MAX + NB_SHIM_SCRATCH);
      break;
    }
    pool.made++;
  }
  pool.n = pool.made;
  return true;
}

/* Runs L with exec on the pool and the calling thread; 0, or -1 (L->err says why). */
static int pool_run(nb_shim_exec_fn exec, const nb_shim_launch *L, unsigned long long blocks) {
  int want = blocks < (unsigned long long)pool.n ? (int)blocks : pool.n;
  if (want > 1) {
    pthread_mutex_lock(&pool.mu);
    pool.exec = exec;
    pool.L = L;
    pool.wanted = want;
    pool.pending = want - 1;
    pool.failed = 0;
    pool.gen++;
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.mu);
  }
  int rc = exec(L, &pool.w[0].w);
  if (want > 1) {
    pthread_mutex_lock(&pool.mu);
    while (pool.pending > 0)
      pthread_cond_wait(&pool.done, &pool.mu);
    rc |= pool.failed ? -1 : 0;
    pthread_mutex_unlock(&pool.mu);
  }
  return rc;
}

/* ---- host work on the pool ------------------------------------------------------------ */
typedef struct par_job {
  void (*fn)(void *arg, unsigned long long i);
  void *arg;
  unsigned long long n;
} par_job;

/* An exec of the pool that runs a par_job's items (L->arg) instead of blocks. */
static int par_exec(const nb_shim_launch *L, nb_shim_worker *W) {
  (void)W;
  const par_job *j = L->arg;
  for (;;) {
    unsigned long long i = __atomic_fetch_add(L->next, 1ull, __ATOMIC_RELAXED);
    if (i >= j->n) return 0;
    j->fn(j->arg, i);
  }
}

void fk_parallel_for(unsigned long long n, void (*fn)(void *arg, unsigned long long i), void *arg) {
  par_job job = {fn, arg, n};
  unsigned long long next = 0;
  nb_shim_launch L = {.arg = &job, .next = &next};
  pthread_mutex_lock(&launch_lock);
  if (pool_ready()) {
    pool_run(par_exec, &L, n);
  } else {
    for (unsigned long long i = 0; i < n; i++)
      fn(arg, i);
  }
  pthread_mutex_unlock(&launch_lock);
}

/* ---- launches ------------------------------------------------------------------------------ */
FK_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                  unsigned int bx, unsigned int by, unsigned int bz,
                                  unsigned int smem, CUstream s, void **params, void **extra) {
  CUresult r = fk_need_ctx();
  if (r != CUDA_SUCCESS) return r;
  if (!fk_stream_ok(s)) return CUDA_ERROR_INVALID_HANDLE;
  if (extra) return CUDA_ERROR_NOT_SUPPORTED;
  pthread_mutex_lock(&mod_lock);
  bool live = function_live(f);
  void (*body)(void *) = live ? f->body : NULL;
  unsigned bounds = live ? f->bounds : 0, n_params = live ? f->params : 0;
  int max_dyn = live ? f->max_dyn : 0;
  nb_shim_exec_fn exec = live ? f->mod->exec : NULL;
  pthread_mutex_unlock(&mod_lock);
  if (!live) return CUDA_ERROR_INVALID_HANDLE;
  if (n_params > 0 && !params) return CUDA_ERROR_INVALID_VALUE;
  unsigned long long threads = (unsigned long long)bx * by * bz;
  if (!gx || !gy || !gz || !bx || !by || !bz || gx > 0x7fffffffu || gy > 65535 || gz > 65535 ||
      bx > 1024 || by > 1024 || bz > 64 || threads > FK_MAX_THREADS)
    return CUDA_ERROR_INVALID_VALUE;
  if (bounds && threads > bounds) return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  if (smem > FK_SMEM_OPTIN || (smem > FK_SMEM_STATIC && smem > (unsigned)max_dyn))
    return CUDA_ERROR_INVALID_VALUE;
  char err[256] = "";
  unsigned long long next = 0;
  nb_shim_launch L = {.grid = {gx, gy, gz},
                      .block = {bx, by, bz},
                      .body = body,
                      .arg = params,
                      .next = &next,
                      .err = err,
                      .err_bytes = sizeof err};
  pthread_mutex_lock(&launch_lock);
  int rc = pool_ready() ? pool_run(exec, &L, (unsigned long long)gx * gy * gz) : -2;
  pthread_mutex_unlock(&launch_lock);
  if (rc == -2) return CUDA_ERROR_OUT_OF_MEMORY;
  if (rc != 0) {
    fprintf(stderr, "nabla fake CUDA: kernel %s (grid %ux%ux%u, block %ux%ux%u): %s\n", f->name, gx,
            gy, gz, bx, by, bz, err[0] ? err : "failed");
    return CUDA_ERROR_LAUNCH_FAILED;
  }
  return CUDA_SUCCESS;
}

/* Frees the dead functions when the library unloads. */
__attribute__((destructor)) static void free_dead(void) {
  while (dead_fns) {
    struct CUfunc_st *f = dead_fns;
    dead_fns = f->next;
    free(f);
  }
}
