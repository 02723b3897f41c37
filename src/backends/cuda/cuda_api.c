/* src/backends/cuda/cuda_api.c — the loader: the CUDA driver API, NVRTC and
 * cuBLASLt opened with dlopen, their function tables filled once.
 *
 * Driver entry points are versioned: cuda.h #defines cuMemAlloc to
 * cuMemAlloc_v2 and so on, and the table's fields carry those expanded
 * names. Each is resolved by dlsym of exactly that expanded name, the symbol
 * a program linked with -lcuda against the same header would call, so the
 * ABI always matches the prototype it is called through. A driver too old to
 * export one of them is reported as missing (nbi_cu.why), never called.
 *
 * NABLA_CUDA_DRIVER, NABLA_CUDA_NVRTC and NABLA_CUDA_CUBLASLT name a file to open
 * instead of the usual library (an unusual install, or test/fake_cuda's library,
 * which runs the backend on the host). */
#include "cuda_be.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

nbi_cu_api nbi_cu;

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t why_lock = PTHREAD_MUTEX_INITIALIZER;
static void *driver_lib, *nvrtc_lib, *lt_lib;

/* Sets nbi_cu.why unless a reason is already there (the first one explains). */
static void set_why(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_why(const char *fmt, ...) {
  pthread_mutex_lock(&why_lock);
  if (!nbi_cu.why[0]) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nbi_cu.why, sizeof nbi_cu.why, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&why_lock);
}

/* Opens the first of names[0..n-1] found: as given (the loader's search
 * path), then in each of the folders dirs[0..n_dirs-1] (NULL entries
 * skipped). NULL when none is; err then holds dlerror()'s first message. */
static void *open_first(const char *const *names, int n, const char *const *dirs, int n_dirs,
                        char *err, size_t err_n) {
  err[0] = '\0';
  for (int pass = -1; pass < n_dirs; pass++) {
    for (int i = 0; i < n; i++) {
      char path[4096];
      if (pass < 0) {
        snprintf(path, sizeof path, "%s", names[i]);
      } else {
        if (!dirs[pass] || !dirs[pass][0] || strchr(names[i], '/')) continue;
        int w = snprintf(path, sizeof path, "%s/%s", dirs[pass], names[i]);
        if (w < 0 || (size_t)w >= sizeof path) continue;
      }
      void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (h) return h;
      if (!err[0]) {
        const char *e = dlerror();
        snprintf(err, err_n, "%s", e ? e : names[i]);
      }
    }
  }
  return NULL;
}

/* The toolkit's library folders: $CUDA_HOME/lib64, then /usr/local/cuda/lib64. */
static void *open_toolkit_lib(const char *const *names, int n, char *err, size_t err_n) {
  const char *home = getenv("CUDA_HOME");
  char dir[4096] = "";
  if (home && home[0]) snprintf(dir, sizeof dir, "%s/lib64", home);
  const char *const dirs[] = {dir, "/usr/local/cuda/lib64"};
  return open_first(names, n, dirs, 2, err, err_n);
}

/* The toolkit library of names[0..n-1], or exactly the file the environment variable
 * env names when it is set (another build of the library, or a fake for tests). */
static void *open_toolkit_or(const char *env, const char *const *names, int n, char *err,
                             size_t err_n) {
  const char *forced = getenv(env);
  const char *const one[] = {forced};
  if (forced && forced[0]) return open_first(one, 1, NULL, 0, err, err_n);
  return open_toolkit_lib(names, n, err, err_n);
}

/* Resolves symbol `sym` of lib into *slot (a function pointer field). */
static bool resolve(void *lib, const char *sym, void *slot, const char *lib_name) {
  void *p = dlsym(lib, sym);
  if (!p) {
    set_why("%s lacks %s (a CUDA 13 driver / toolkit is needed)", lib_name, sym);
    return false;
  }
  memcpy(slot, &p, sizeof p);
  return true;
}

/* The expanded (versioned) spelling of a macro'd name, as a string. */
#define NBI_STR_(x) #x
#define NBI_SYM_(x) NBI_STR_(x)

/* Opens libnvrtc (NABLA_CUDA_NVRTC names another file) and fills the NVRTC table;
 * sets nbi_cu.nvrtc. */
static void load_nvrtc(void) {
  static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so"};
  char err[512];
  nvrtc_lib = open_toolkit_or("NABLA_CUDA_NVRTC", names, 2, err, sizeof err);
  if (!nvrtc_lib) {
    set_why("NVRTC not found (libnvrtc.so.13: %s)", err);
    return;
  }
  bool ok = true;
#define NBI_RESOLVE_(name) ok = ok && resolve(nvrtc_lib, NBI_SYM_(name), &nbi_cu.name, "libnvrtc");
  NBI_NVRTC_FUNCS(NBI_RESOLVE_)
#undef NBI_RESOLVE_
  int major = 0, minor = 0;
  if (ok && nbi_cu.nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) {
    set_why("nvrtcVersion failed");
    ok = false;
  }
  nbi_cu.nvrtc = ok;
}

/* Opens libcublasLt (NABLA_CUDA_CUBLASLT names another file) and fills its table;
 * sets nbi_cu.lt. */
static void load_lt(void) {
  static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so"};
  char err[512];
  lt_lib = open_toolkit_or("NABLA_CUDA_CUBLASLT", names, 2, err, sizeof err);
  if (!lt_lib) {
    set_why("cuBLASLt not found (libcublasLt.so.13: %s)", err);
    return;
  }
  bool ok = true;
#define NBI_RESOLVE_(name) ok = ok && resolve(lt_lib, NBI_SYM_(name), &nbi_cu.name, "libcublasLt");
  NBI_LT_FUNCS(NBI_RESOLVE_)
#undef NBI_RESOLVE_
  nbi_cu.lt = ok;
}

/* Opens the driver (the loader's path, then the usual container folders;
 * NABLA_CUDA_DRIVER names another file, for unusual installs and tests),
 * fills its table and calls cuInit; then NVRTC and
 * cuBLASLt. nbi_cu.driver: cuInit answered and all three are there. */
static void load_driver(void) {
  nbi_nvrtc_load();
  pthread_once(&lt_once, load_lt);
  const char *forced = getenv("NABLA_CUDA_DRIVER");
  const char *const usual[] = {"libcuda.so.1", "libcuda.so"};
  const char *const one[] = {forced};
  /* where containers and WSL mount the driver when the loader is not told */
  const char *const dirs[] = {"/usr/local/nvidia/lib64", "/usr/lib/wsl/lib"};
  char err[512];
  driver_lib = forced && forced[0] ? open_first(one, 1, NULL, 0, err, sizeof err)
                                   : open_first(usual, 2, dirs, 2, err, sizeof err);
  if (!driver_lib) {
    set_why("no CUDA driver (libcuda.so.1: %s)", err);
    return;
  }
  bool ok = true;
#define NBI_RESOLVE_(name) ok = ok && resolve(driver_lib, NBI_SYM_(name), &nbi_cu.name, "libcuda");
  NBI_CU_FUNCS(NBI_RESOLVE_)
#undef NBI_RESOLVE_
  if (!ok) return;
  CUresult r = nbi_cu.cuInit(0);
  if (r != CUDA_SUCCESS) {
    char msg[256];
    nbi_cu_describe(r, "cuInit", msg, sizeof msg);
    set_why("%s", msg);
    return;
  }
  nbi_cu.driver = nbi_cu.nvrtc && nbi_cu.lt;
}

/* NVRTC alone (host-side compilation needs no driver); true when it loaded. */
bool nbi_nvrtc_load(void) {
  pthread_once(&nvrtc_once, load_nvrtc);
  return nbi_cu.nvrtc;
}

/* Everything, once; true when the driver answered cuInit and NVRTC and
 * cuBLASLt are there. */
bool nbi_cu_load(void) {
  pthread_once(&driver_once, load_driver);
  return nbi_cu.driver;
}

/* "<what>: <name>: <description>" of r into buf; names come from the driver
 * when it loaded, else the number is given. */
void nbi_cu_describe(CUresult r, const char *what, char *buf, size_t n) {
  const char *name = NULL, *str = NULL;
  /* the table may be partly filled when the driver failed to load */
  if (nbi_cu.cuGetErrorName && nbi_cu.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  if (nbi_cu.cuGetErrorString && nbi_cu.cuGetErrorString(r, &str) != CUDA_SUCCESS) str = NULL;
  if (name)
    snprintf(buf, n, "%s: %s: %s", what, name, str ? str : "no description");
  else
    snprintf(buf, n, "%s: CUDA error %d", what, (int)r);
}

/* NB_OK for success; else records NB_ERR_DEVICE described as above. */
nb_status nbi_cu_check(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return NB_OK;
  char msg[512];
  nbi_cu_describe(r, what, msg, sizeof msg);
  return nbi_error(NB_ERR_DEVICE, "%s", msg);
}
