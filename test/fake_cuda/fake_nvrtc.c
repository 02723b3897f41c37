/* test/fake_cuda/fake_nvrtc.c — the fake NVRTC: a program's "image" is its source.
 *
 * nvrtcCompileProgram takes NVRTC's options (a target -arch / --gpu-architecture of
 * sm_XX or compute_XX for an arch of the list below, --std / -std, -D / -U, and the
 * flags nabla or a typical user passes: -default-device, --fmad, -lineinfo, -G, -w,
 * --use_fast_math, --ftz, --prec-div, --prec-sqrt, --restrict; these last only matter
 * to the real check below: the host compile always keeps IEEE semantics without
 * contraction). An unknown option is NVRTC_ERROR_INVALID_OPTION with NVRTC's
 * message in the log. Then:
 *  1. unless NABLA_FAKE_CUDA_NVRTC_CHECK=0, the real NVRTC (NABLA_FAKE_CUDA_REAL_NVRTC,
 *     else libnvrtc.so.13 of $CUDA_HOME/lib64, /usr/local/cuda/lib64 or the loader's
 *     path; skipped when there is none) compiles the program with the same options,
 *     so that code only a GPU compiler rejects fails here too; a success is
 *     remembered in the cache folder (a file per hash of the source and options);
 *  2. the source is compiled for the host (fake_host.c), the object cached for
 *     cuModuleLoadData.
 * A failure of either is NVRTC_ERROR_COMPILATION with that compiler's log. The image
 * (fk_image_make) is available as a CUBIN for sm_XX targets and as PTX for every
 * target. nvrtcVersion is 13.99, a version no real NVRTC has, so nabla's kernel cache
 * keys (which hash it) never mix fake images with real ones. Header sources
 * (nvrtcCreateProgram's headers) are not taken: NVRTC_ERROR_INVALID_INPUT. */
#include "fake_cuda.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FK_EXPORT __attribute__((visibility("default")))
#define FK_NVRTC_MAJOR 13
#define FK_NVRTC_MINOR 99

/* The library's mark: the real-NVRTC lookup skips a library that has it. */
FK_EXPORT const int nabla_fake_cuda = 1;

static const int archs[] = {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
#define N_ARCHS ((int)(sizeof archs / sizeof archs[0]))

bool fk_nvrtc_arch(int arch) {
  for (int i = 0; i < N_ARCHS; i++)
    if (archs[i] == arch) return true;
  return false;
}

struct _nvrtcProgram {
  char *src, *name;
  char *log;  /* the last compile's log ("" before) */
  char *code; /* after a successful compile: the source with the -D / -U lines */
  bool ptx;   /* the target was compute_XX */
  int arch;
  char std[16];
};

FK_EXPORT nvrtcResult nvrtcVersion(int *major, int *minor) {
  if (!major || !minor) return NVRTC_ERROR_INVALID_INPUT;
  *major = FK_NVRTC_MAJOR;
  *minor = FK_NVRTC_MINOR;
  return NVRTC_SUCCESS;
}

FK_EXPORT nvrtcResult nvrtcGetNumSupportedArchs(int *n) {
  if (!n) return NVRTC_ERROR_INVALID_INPUT;
  *n = N_ARCHS;
  return NVRTC_SUCCESS;
}

FK_EXPORT nvrtcResult nvrtcGetSupportedArchs(int *out) {
  if (!out) return NVRTC_ERROR_INVALID_INPUT;
  memcpy(out, archs, sizeof archs);
  return NVRTC_SUCCESS;
}

FK_EXPORT const char *nvrtcGetErrorString(nvrtcResult r) {
  switch (r) {
  case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
  case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
  case NVRTC_ERROR_PROGRAM_CREATION_FAILURE: return "NVRTC_ERROR_PROGRAM_CREATION_FAILURE";
  case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
  case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
  case NVRTC_ERROR_INVALID_OPTION: return "NVRTC_ERROR_INVALID_OPTION";
  case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
  case NVRTC_ERROR_BUILTIN_OPERATION_FAILURE: return "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE";
  case NVRTC_ERROR_INTERNAL_ERROR: return "NVRTC_ERROR_INTERNAL_ERROR";
  default: return "NVRTC_ERROR unknown";
  }
}

/* A malloc'd copy of s (NULL for NULL). */
static char *dup_str(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

FK_EXPORT nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
                                         int num_headers, const char *const *headers,
                                         const char *const *include_names) {
  (void)headers;
  (void)include_names;
  if (!prog) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!src || num_headers != 0) return NVRTC_ERROR_INVALID_INPUT;
  struct _nvrtcProgram *p = calloc(1, sizeof *p);
  if (!p) return NVRTC_ERROR_OUT_OF_MEMORY;
  p->src = dup_str(src);
  p->name = dup_str(name ? name : "default_program");
  p->log = dup_str("");
  if (!p->src || !p->name || !p->log) {
    free(p->src);
    free(p->name);
    free(p->log);
    free(p);
    return NVRTC_ERROR_OUT_OF_MEMORY;
  }
  *prog = p;
  return NVRTC_SUCCESS;
}

FK_EXPORT nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog) {
  if (!prog || !*prog) return NVRTC_ERROR_INVALID_PROGRAM;
  struct _nvrtcProgram *p = *prog;
  free(p->src);
  free(p->name);
  free(p->log);
  free(p->code);
  free(p);
  *prog = NULL;
  return NVRTC_SUCCESS;
}

/* Replaces p's log by a copy of text (the empty log when out of memory). */
static void set_log(struct _nvrtcProgram *p, const char *text) {
  char *l = dup_str(text);
  free(p->log);
  p->log = l;
}

/* ---- options ---------------------------------------------------------------------------- */
/* The options that are flags, and those that take =value (any value). */
static const char *const flag_options[] = {"-default-device",
                                           "--device-as-default-execution-space",
                                           "-lineinfo",
                                           "--generate-line-info",
                                           "-G",
                                           "--device-debug",
                                           "-w",
                                           "--disable-warnings",
                                           "--use_fast_math",
                                           "-use_fast_math",
                                           "-restrict",
                                           "--restrict",
                                           "-extra-device-vectorization",
                                           "--extra-device-vectorization"};
static const char *const value_options[] = {
    "--fmad=",    "-fmad=",       "--ftz=",      "-ftz=",   "--prec-div=",
    "-prec-div=", "--prec-sqrt=", "-prec-sqrt=", "--dopt=", "-dopt="};

/* What the options say: target, dialect and the #define / #undef lines (malloc'd). */
typedef struct options {
  bool ptx, have_arch;
  int arch;
  char std[16];
  char *defines;
} options;

/* Appends "#<what> <def with = as a blank>\n" to o->defines; false when out of memory. */
static bool add_define(options *o, const char *what, const char *def) {
  size_t old = o->defines ? strlen(o->defines) : 0, n = old + strlen(def) + 16;
  char *d = realloc(o->defines, n);
  if (!d) return false;
  if (!old) d[0] = '\0';
  int w = snprintf(d + old, n - old, "#%s %s\n", what, def);
  char *eq = strchr(d + old + strlen(what) + 2, '=');
  if (eq && w > 0) *eq = ' ';
  o->defines = d;
  return true;
}

/* Parses the target of an -arch value ("sm_90", "compute_90"); false when NVRTC does
 * not know it. */
static bool parse_arch(const char *v, options *o) {
  int arch = 0, used = 0;
  bool ptx = !strncmp(v, "compute_", 8);
  if (!ptx && strncmp(v, "sm_", 3)) return false;
  if (sscanf(v + (ptx ? 8 : 3), "%d%n", &arch, &used) != 1 || v[(ptx ? 8 : 3) + used]) return false;
  if (!fk_nvrtc_arch(arch)) return false;
  o->ptx = ptx;
  o->arch = arch;
  o->have_arch = true;
  return true;
}

/* Parses opts into o; NVRTC_ERROR_INVALID_OPTION (NVRTC's message in msg) on a bad one. */
static nvrtcResult parse_options(int n, const char *const *opts, options *o, char *msg,
                                 size_t msg_n) {
  *o = (options){.ptx = true, .arch = 75, .std = "c++17"}; /* NVRTC's default target */
  for (int i = 0; i < n; i++) {
    const char *a = opts[i], *v = NULL;
    if (!a) return NVRTC_ERROR_INVALID_OPTION;
    bool known = false;
    for (size_t k = 0; k < sizeof flag_options / sizeof flag_options[0] && !known; k++)
      known = !strcmp(a, flag_options[k]);
    for (size_t k = 0; k < sizeof value_options / sizeof value_options[0] && !known; k++)
      known = !strncmp(a, value_options[k], strlen(value_options[k]));
    if (known) continue;
    if (!strncmp(a, "-arch=", 6) || !strncmp(a, "--gpu-architecture=", 19)) {
      v = strchr(a, '=') + 1;
    } else if ((!strcmp(a, "-arch") || !strcmp(a, "--gpu-architecture")) && i + 1 < n) {
      v = opts[++i];
    }
    if (v) {
      if (!parse_arch(v, o)) {
        snprintf(msg, msg_n, "nvrtc: error: invalid value for --gpu-architecture (-arch)\n");
        return NVRTC_ERROR_INVALID_OPTION;
      }
      continue;
    }
    if (!strncmp(a, "--std=", 6) || !strncmp(a, "-std=", 5)) {
      const char *s = strchr(a, '=') + 1;
      if (strcmp(s, "c++03") && strcmp(s, "c++11") && strcmp(s, "c++14") && strcmp(s, "c++17") &&
          strcmp(s, "c++20")) {
        snprintf(msg, msg_n, "nvrtc: error: invalid value for --std (-std): %s\n", s);
        return NVRTC_ERROR_INVALID_OPTION;
      }
      snprintf(o->std, sizeof o->std, "%s", s);
      continue;
    }
    const char *def = !strncmp(a, "--define-macro=", 15) ? a + 15
                      : !strncmp(a, "-D", 2)             ? a + 2
                                                         : NULL;
    const char *undef = !strncmp(a, "--undefine-macro=", 17) ? a + 17
                        : !strncmp(a, "-U", 2)               ? a + 2
                                                             : NULL;
    if ((def && def[0]) || (undef && undef[0])) {
      if (!add_define(o, def ? "define" : "undef", def ? def : undef))
        return NVRTC_ERROR_OUT_OF_MEMORY;
      continue;
    }
    snprintf(msg, msg_n, "nvrtc: error: unrecognized option %s\n", a);
    return NVRTC_ERROR_INVALID_OPTION;
  }
  return NVRTC_SUCCESS;
}

/* ---- the real NVRTC's check --------------------------------------------------------------- */
static struct real_nvrtc {
  void *lib;
  nvrtcResult (*version)(int *, int *);
  nvrtcResult (*create)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                        const char *const *);
  nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*log_size)(nvrtcProgram, size_t *);
  nvrtcResult (*log)(nvrtcProgram, char *);
  nvrtcResult (*destroy)(nvrtcProgram *);
  int major, minor;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t real_lock = PTHREAD_MUTEX_INITIALIZER;

/* Resolves sym of lib into the function pointer at slot; false when missing. */
static bool real_sym(void *lib, const char *sym, void *slot) {
  void *p = dlsym(lib, sym);
  memcpy(slot, &p, sizeof p);
  return p != NULL;
}

/* pthread_once routine: opens the real NVRTC unless the check is off or none is found. */
static void load_real(void) {
  const char *off = getenv("NABLA_FAKE_CUDA_NVRTC_CHECK");
  if (off && !strcmp(off, "0")) return;
  const char *forced = getenv("NABLA_FAKE_CUDA_REAL_NVRTC"), *home = getenv("CUDA_HOME");
  char paths[4][PATH_MAX];
  int n = 0;
  if (forced && forced[0]) snprintf(paths[n++], PATH_MAX, "%s", forced);
  if (home && home[0]) snprintf(paths[n++], PATH_MAX, "%s/lib64/libnvrtc.so.13", home);
  snprintf(paths[n++], PATH_MAX, "%s", "/usr/local/cuda/lib64/libnvrtc.so.13");
  snprintf(paths[n++], PATH_MAX, "%s", "libnvrtc.so.13");
  for (int i = 0; i < n && !real.lib; i++) {
    void *lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) continue;
    bool ok = !dlsym(lib, "nabla_fake_cuda") && real_sym(lib, "nvrtcVersion", &real.version) &&
              real_sym(lib, "nvrtcCreateProgram", &real.create) &&
              real_sym(lib, "nvrtcCompileProgram", &real.compile) &&
              real_sym(lib, "nvrtcGetProgramLogSize", &real.log_size) &&
              real_sym(lib, "nvrtcGetProgramLog", &real.log) &&
              real_sym(lib, "nvrtcDestroyProgram", &real.destroy) &&
              real.version(&real.major, &real.minor) == NVRTC_SUCCESS;
    if (ok)
      real.lib = lib;
    else
      dlclose(lib);
  }
}

/* The marker file of a passed check of (src, opts) in the cache folder; false when
 * there is no folder. */
static bool check_marker(const char *src, int n, const char *const *opts, char *path) {
  const char *dir = fk_cache_dir(NULL, 0);
  if (!dir) return false;
  uint64_t h[2] = {(uint64_t)real.major << 32 | (uint32_t)real.minor, 0x6e7672746321ull};
  for (int i = 0; i < n; i++)
    fk_hash(opts[i], strlen(opts[i]) + 1, h);
  fk_hash(src, strlen(src), h);
  snprintf(path, PATH_MAX, "%s/%016llx%016llx.nvrtc-ok", dir, (unsigned long long)h[0],
           (unsigned long long)h[1]);
  return true;
}

/* Compiles the program with the real NVRTC: NULL when it compiles (or there is no
 * real NVRTC, or it cannot judge these options), else its log (malloc'd). */
static char *real_check(const struct _nvrtcProgram *p, int n, const char *const *opts) {
  pthread_once(&real_once, load_real);
  if (!real.lib) return NULL;
  char marker[PATH_MAX];
  bool have = check_marker(p->src, n, opts, marker);
  if (have && access(marker, F_OK) == 0) return NULL;
  pthread_mutex_lock(&real_lock);
  nvrtcProgram rp;
  char *log = NULL;
  nvrtcResult r = real.create(&rp, p->src, p->name, 0, NULL, NULL);
  if (r == NVRTC_SUCCESS) {
    r = real.compile(rp, n, opts);
    size_t len = 0;
    if (r == NVRTC_ERROR_COMPILATION && real.log_size(rp, &len) == NVRTC_SUCCESS &&
        (log = malloc(len + 64))) {
      int w = snprintf(log, len + 64, "the real NVRTC %d.%d: ", real.major, real.minor);
      if (real.log(rp, log + w) != NVRTC_SUCCESS) log[w] = '\0';
    }
    real.destroy(&rp);
  }
  pthread_mutex_unlock(&real_lock);
  if (r == NVRTC_SUCCESS && have) {
    FILE *f = fopen(marker, "w");
    if (f) fclose(f);
  }
  return log;
}

/* ---- compiling -------------------------------------------------------------------------- */
FK_EXPORT nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int n, const char *const *opts) {
  if (!prog) return NVRTC_ERROR_INVALID_PROGRAM;
  if (n < 0 || (n > 0 && !opts)) return NVRTC_ERROR_INVALID_INPUT;
  struct _nvrtcProgram *p = prog;
  free(p->code);
  p->code = NULL;
  char msg[256] = "";
  options o;
  nvrtcResult r = parse_options(n, opts, &o, msg, sizeof msg);
  if (r != NVRTC_SUCCESS) {
    set_log(p, msg);
    free(o.defines);
    return r;
  }
  char *log = real_check(p, n, opts);
  size_t dl = o.defines ? strlen(o.defines) : 0, sl = strlen(p->src);
  char *code = log ? NULL : malloc(dl + sl + 16);
  if (code) {
    if (dl) memcpy(code, o.defines, dl);
    snprintf(code + dl, sl + 16, "%s%s", dl ? "#line 1\n" : "", p->src);
    log = fk_host_compile(code, o.std, NULL);
  }
  free(o.defines);
  if (log) {
    set_log(p, log);
    free(log);
    free(code);
    return NVRTC_ERROR_COMPILATION;
  }
  set_log(p, "");
  if (!code) return NVRTC_ERROR_OUT_OF_MEMORY;
  p->code = code;
  p->ptx = o.ptx;
  p->arch = o.arch;
  snprintf(p->std, sizeof p->std, "%s", o.std);
  return NVRTC_SUCCESS;
}

FK_EXPORT nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *size) {
  if (!prog) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!size) return NVRTC_ERROR_INVALID_INPUT;
  *size = (prog->log ? strlen(prog->log) : 0) + 1;
  return NVRTC_SUCCESS;
}

FK_EXPORT nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log) {
  if (!prog) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!log) return NVRTC_ERROR_INVALID_INPUT;
  strcpy(log, prog->log ? prog->log : "");
  return NVRTC_SUCCESS;
}

/* The image of a compiled program as a CUBIN (cubin true: an sm_XX target only) or
 * PTX (the target's compute_XX), into buf (NULL: its size into *size). */
static nvrtcResult get_image(nvrtcProgram prog, bool cubin, char *buf, size_t *size) {
  if (!prog) return NVRTC_ERROR_INVALID_PROGRAM;
  if (!prog->code || (cubin && prog->ptx)) return NVRTC_ERROR_INVALID_INPUT;
  size_t n;
  char *img = fk_image_make(prog->code, !cubin, prog->arch, prog->std, &n);
  if (!img) return NVRTC_ERROR_OUT_OF_MEMORY;
  if (size) *size = n;
  if (buf) memcpy(buf, img, n);
  free(img);
  return NVRTC_SUCCESS;
}

FK_EXPORT nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *size) {
  return size ? get_image(prog, true, NULL, size) : NVRTC_ERROR_INVALID_INPUT;
}

FK_EXPORT nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin) {
  return cubin ? get_image(prog, true, cubin, NULL) : NVRTC_ERROR_INVALID_INPUT;
}

FK_EXPORT nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *size) {
  return size ? get_image(prog, false, NULL, size) : NVRTC_ERROR_INVALID_INPUT;
}

FK_EXPORT nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx) {
  return ptx ? get_image(prog, false, ptx, NULL) : NVRTC_ERROR_INVALID_INPUT;
}
