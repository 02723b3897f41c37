/* test/fake_cuda/fake_host.c — compiling a kernel source for the host: the fake's
 * stand-in for SASS.
 *
 * A source (nabla's preamble and kernels, CUDA C++) is compiled by the host's C++
 * compiler ($CXX, else c++; it may hold arguments, "ccache g++") after
 * test/cuda_host_shim.h, into a shared object cached on disk by a 128-bit hash of the
 * source, the shim's text and the command:
 *   1. `extern __shared__ T name[];` declarations become NB_SHIM_DYN_SMEM(name, T)
 *      (the launch's dynamic shared memory; the shim's __shared__ is a static object);
 *   2. a preprocessor pass with NB_SHIM_SCAN finds the extern "C" __global__ kernels
 *      at namespace scope and their __launch_bounds__;
 *   3. the compile proper: -O1 -fPIC -shared -ffp-contract=off (no contraction into
 *      FMA, as NVRTC's --fmad=false), the source under `#line 1 "nabla.cu"`, then per
 *      kernel its trampoline NB_SHIM_KERNEL(name) and `nb_shim_b_<name>`, its launch
 *      bound (0: none).
 * Objects are built in a private temporary folder of the cache and renamed into place,
 * so processes sharing the cache see whole files only. */
#include "fake_cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef NB_FAKE_SHIM
#error "build with -DNB_FAKE_SHIM='\"/abs/path/test/cuda_host_shim.h\"' (the Makefile does)"
#endif

extern char **environ;

/* ---- hashing ---------------------------------------------------------------------------- */
static uint64_t rotl(uint64_t x, int r) { return x << r | x >> (64 - r); }

static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fk_hash(const void *p, size_t n, uint64_t h[2]) {
  const unsigned char *s = p;
  uint64_t a = h[0] ^ 0x6a09e667f3bcc908ull, b = h[1] ^ 0xbb67ae8584caa73bull;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint64_t w0, w1;
    memcpy(&w0, s + i, 8);
    memcpy(&w1, s + i + 8, 8);
    a = rotl((a ^ w0) * 0x9e3779b97f4a7c15ull, 29) + b;
    b = rotl((b ^ w1) * 0xc2b2ae3d27d4eb4full, 31) + a;
  }
  uint64_t t[2] = {0, 0};
  memcpy(t, s + i, n - i);
  a = rotl((a ^ t[0]) * 0x9e3779b97f4a7c15ull, 29) + b;
  b = rotl((b ^ t[1]) * 0xc2b2ae3d27d4eb4full, 31) + a;
  h[0] = mix(a ^ (uint64_t)n);
  h[1] = mix(b + h[0]);
}

/* ---- files and processes ---------------------------------------------------------------- */
char *fk_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    len += fread(buf + len, 1, cap - len - 1, f);
    if (len < cap - 1) break;
    char *more = realloc(buf, cap * 2);
    if (!more) free(buf);
    buf = more;
    cap *= 2;
  }
  bool bad = ferror(f);
  fclose(f);
  if (!buf || bad) {
    free(buf);
    return NULL;
  }
  buf[len] = '\0';
  if (n) *n = len;
  return buf;
}

/* Writes the n bytes of the parts (NULL-terminated list of strings) to path; false on
 * error. */
static bool write_parts(const char *path, const char *const *parts) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = true;
  for (int i = 0; parts[i] && ok; i++)
    ok = fputs(parts[i], f) >= 0;
  return fclose(f) == 0 && ok;
}

int fk_run(char *const argv[], const char *log) {
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa) != 0) return -1;
  int rc = -1;
  pid_t pid;
  if (posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0) == 0 &&
      posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644) == 0 &&
      posix_spawn_file_actions_adddup2(&fa, 1, 2) == 0 &&
      posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ) == 0) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  posix_spawn_file_actions_destroy(&fa);
  return rc;
}

/* dir/name into out (PATH_MAX bytes); an empty string when it does not fit. */
static void path_join(char *out, const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  out[0] = '\0';
  if (a + b + 2 > PATH_MAX) return;
  memcpy(out, dir, a);
  out[a] = '/';
  memcpy(out + a + 1, name, b + 1);
}

/* ---- the cache folder ------------------------------------------------------------------- */
static char cache_dir[PATH_MAX - 64];
static char cache_err[256];
static pthread_once_t dir_once = PTHREAD_ONCE_INIT;

/* Creates path and its missing parents. */
static int make_dirs(const char *path) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s", path);
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != '\0') continue;
    char c = *s;
    *s = '\0';
    if (mkdir(p, 0755) != 0 && errno != EEXIST) return errno;
    if (c == '\0') return 0;
    *s = c;
  }
}

/* pthread_once routine: picks and creates the cache folder. */
static void resolve_dir(void) {
  const char *env = getenv("NABLA_FAKE_CUDA_DIR");
  int w = env && env[0] ? snprintf(cache_dir, sizeof cache_dir, "%s", env)
                        : snprintf(cache_dir, sizeof cache_dir, "/tmp/nabla-fake-cuda-%u",
                                   (unsigned)getuid());
  if (w <= 0 || (size_t)w >= sizeof cache_dir) {
    snprintf(cache_err, sizeof cache_err, "the kernel folder's path is too long");
    cache_dir[0] = '\0';
    return;
  }
  int e = make_dirs(cache_dir);
  if (e) {
    snprintf(cache_err, sizeof cache_err, "cannot create %.160s: %s", cache_dir, strerror(e));
    cache_dir[0] = '\0';
  }
}

const char *fk_cache_dir(char *err, size_t err_n) {
  pthread_once(&dir_once, resolve_dir);
  if (!cache_dir[0] && err) snprintf(err, err_n, "%s", cache_err);
  return cache_dir[0] ? cache_dir : NULL;
}

/* ---- the compiler and the shim ---------------------------------------------------------- */
#define MAX_CXX_ARGS 16
static char cxx_buf[1024], shim_path[PATH_MAX];
static char *cxx_argv[MAX_CXX_ARGS + 1];
static char *shim_text;
static int cxx_argc;
static pthread_once_t tools_once = PTHREAD_ONCE_INIT;

/* pthread_once routine: $CXX split at blanks (else c++), the shim's path
 * (NABLA_FAKE_CUDA_SHIM, else the one of the build) and text. */
static void resolve_tools(void) {
  const char *cxx = getenv("CXX");
  snprintf(cxx_buf, sizeof cxx_buf, "%s", cxx && cxx[0] ? cxx : "c++");
  for (char *save = NULL, *t = strtok_r(cxx_buf, " \t", &save); t && cxx_argc < MAX_CXX_ARGS;
       t = strtok_r(NULL, " \t", &save))
    cxx_argv[cxx_argc++] = t;
  const char *shim = getenv("NABLA_FAKE_CUDA_SHIM");
  snprintf(shim_path, sizeof shim_path, "%s", shim && shim[0] ? shim : NB_FAKE_SHIM);
  shim_text = fk_read_file(shim_path, NULL);
}

/* ---- step 1: dynamic shared memory ------------------------------------------------------ */
/* Whether c may be part of an identifier. */
static bool ident_char(char c) {
  return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* src with each `extern __shared__ [__align__(n)] T name[];` as
 * `NB_SHIM_DYN_SMEM(name, T);` (others left for the compiler to reject); malloc'd. */
static char *rewrite_dyn_smem(const char *src) {
  static const char key[] = "extern __shared__";
  size_t n = strlen(src);
  char *out = malloc(2 * n + 64);
  if (!out) return NULL;
  size_t o = 0;
  const char *p = src;
  for (const char *k; (k = strstr(p, key));) {
    const char *semi = strchr(k, ';');
    memcpy(out + o, p, (size_t)(k - p));
    o += (size_t)(k - p);
    p = k;
    const char *lb = semi ? semi : k;
    while (lb > k && *lb != '[')
      lb--;
    const char *rb = lb;
    while (*rb && *rb != ']' && rb < semi)
      rb++;
    bool empty = lb > k && *rb == ']';
    for (const char *q = lb + 1; empty && q < rb; q++)
      empty = *q == ' ' || *q == '\t';
    for (const char *q = rb + 1; empty && q < semi; q++)
      empty = *q == ' ' || *q == '\t';
    const char *ne = lb;
    while (ne > k && (ne[-1] == ' ' || ne[-1] == '\t'))
      ne--;
    const char *nb = ne;
    while (nb > k && ident_char(nb[-1]))
      nb--;
    const char *ts = k + sizeof key - 1;
    while (*ts == ' ' || *ts == '\t' || *ts == '\n')
      ts++;
    if (!strncmp(ts, "__align__", 9)) { /* the shim aligns dynamic memory to 16 bytes */
      const char *c = strchr(ts, ')');
      ts = c && c < nb ? c + 1 : ts;
    }
    if (!empty || nb == ne || ts >= nb) { /* not that form: unchanged */
      memcpy(out + o, key, sizeof key - 1);
      o += sizeof key - 1;
      p = k + sizeof key - 1;
      continue;
    }
    o += (size_t)sprintf(out + o, "NB_SHIM_DYN_SMEM(%.*s, %.*s);", (int)(ne - nb), nb,
                         (int)(nb - ts), ts);
    p = semi + 1;
  }
  strcpy(out + o, p);
  return out;
}

/* ---- step 2: finding the kernels -------------------------------------------------------- */
typedef struct kernel {
  char name[128];
  unsigned bounds;
} kernel;

/* The next token of preprocessed text at *p (skipping blanks): its start and length
 * (0 at the end); string and character literals are one token. */
static const char *next_token(const char **p, size_t *len) {
  const char *s = *p;
  while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
    s++;
  const char *e = s;
  if (!*s) {
  } else if (*s == '"' || *s == '\'') {
    for (e = s + 1; *e && *e != *s; e++)
      if (*e == '\\' && e[1]) e++;
    if (*e) e++;
  } else if (ident_char(*s)) {
    while (ident_char(*e))
      e++;
  } else {
    e = s + 1;
  }
  *p = e;
  *len = (size_t)(e - s);
  return s;
}

static bool tok_is(const char *t, size_t n, const char *s) {
  return n == strlen(s) && !memcmp(t, s, n);
}

/* The kernels of preprocessed text pre (marked by the scan's shim) into ks (at most
 * max); their count. A kernel counts when declared extern "C" (or inside extern "C"
 * braces) at namespace scope. */
static int find_kernels(const char *pre, kernel *ks, int max) {
  char scope[256]; /* 'C': extern "C" { ... }, 'O': any other braces */
  int depth = 0, n = 0;
  const char *prev[2] = {"", ""};
  size_t prev_n[2] = {0, 0};
  for (const char *p = pre;;) {
    size_t len;
    const char *t = next_token(&p, &len);
    if (!len) break;
    if (tok_is(t, len, "{")) {
      bool ext = tok_is(prev[0], prev_n[0], "extern") && tok_is(prev[1], prev_n[1], "\"C\"");
      if (depth < (int)sizeof scope) scope[depth] = ext ? 'C' : 'O';
      depth++;
    } else if (tok_is(t, len, "}")) {
      depth -= depth > 0;
    } else if (tok_is(t, len, "nb_shim_global_mark")) {
      bool ext = tok_is(prev[0], prev_n[0], "extern") && tok_is(prev[1], prev_n[1], "\"C\"");
      bool ns = depth <= (int)sizeof scope;
      for (int d = 0; d < depth && ns; d++)
        ns = scope[d] == 'C';
      ext = ext || (depth > 0 && ns);
      kernel k = {.name = "", .bounds = 0};
      for (;;) { /* up to the parameter list */
        t = next_token(&p, &len);
        if (!len || tok_is(t, len, "(") || tok_is(t, len, ";") || tok_is(t, len, "{")) break;
        if (tok_is(t, len, "nb_shim_bounds_mark")) {
          next_token(&p, &len); /* ( */
          t = next_token(&p, &len);
          k.bounds = (unsigned)strtoul(t, NULL, 0);
          for (int par = 1; par > 0 && len;) {
            t = next_token(&p, &len);
            par += tok_is(t, len, "(") - tok_is(t, len, ")");
          }
        } else if (ident_char(*t) && len < sizeof k.name) {
          memcpy(k.name, t, len);
          k.name[len] = '\0';
        }
      }
      bool dup = false;
      for (int i = 0; i < n && !dup; i++)
        dup = !strcmp(ks[i].name, k.name);
      if (ext && ns && k.name[0] && tok_is(t, len, "(") && !dup && n < max) ks[n++] = k;
    }
    prev[0] = prev[1], prev_n[0] = prev_n[1];
    prev[1] = t, prev_n[1] = len;
  }
  return n;
}

/* ---- step 3: the compile ---------------------------------------------------------------- */
/* The first bytes of file path as a malloc'd message after prefix (a fallback text when
 * it cannot be read). */
static char *log_message(const char *prefix, const char *path) {
  size_t n = 0;
  char *text = fk_read_file(path, &n);
  const size_t keep = 8000;
  size_t len = strlen(prefix) + (text ? (n < keep ? n : keep) : 32) + 8;
  char *msg = malloc(len);
  if (msg)
    snprintf(msg, len, "%s%.*s%s", prefix, (int)(text ? (n < keep ? n : keep) : 0),
             text ? text : "", text ? "" : "(no output)");
  free(text);
  return msg;
}

/* A malloc'd copy of a message. */
static char *message(const char *fmt, const char *a, const char *b) {
  size_t len = strlen(fmt) + strlen(a) + strlen(b) + 1;
  char *m = malloc(len);
  if (m) snprintf(m, len, fmt, a, b);
  return m;
}

/* Removes the build folder tmp and its files. */
static void remove_build(const char *tmp) {
  static const char *const files[] = {"scan.cpp", "scan.ii", "scan.log", "k.cpp", "k.so", "k.log"};
  char f[PATH_MAX];
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    path_join(f, tmp, files[i]);
    unlink(f);
  }
  rmdir(tmp);
}

#define MAX_KERNELS 512

/* The compile's options after -std (part of every cache key). */
static const char *const compile_flags[] = {
    "-O1", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing", "-w", NULL};

/* Builds src (rewritten) with std into tmp/k.so; NULL or the failure's log. */
static char *build(const char *tmp, const char *src, const char *std) {
  char scan_cpp[PATH_MAX], scan_ii[PATH_MAX], scan_log[PATH_MAX], k_cpp[PATH_MAX], k_so[PATH_MAX],
      k_log[PATH_MAX], stdopt[32], head[PATH_MAX + 64];
  path_join(scan_cpp, tmp, "scan.cpp");
  path_join(scan_ii, tmp, "scan.ii");
  path_join(scan_log, tmp, "scan.log");
  path_join(k_cpp, tmp, "k.cpp");
  path_join(k_so, tmp, "k.so");
  path_join(k_log, tmp, "k.log");
  snprintf(stdopt, sizeof stdopt, "-std=%s", std);
  snprintf(head, sizeof head, "#include \"%s\"\n#line 1 \"nabla.cu\"\n", shim_path);
  const char *scan_parts[] = {"#define NB_SHIM_SCAN 1\n", head, src, "\n", NULL};
  if (!write_parts(scan_cpp, scan_parts))
    return message("nabla fake CUDA: cannot write %s%s", scan_cpp, "");
  char *argv[MAX_CXX_ARGS + 16];
  int a = 0;
  for (int i = 0; i < cxx_argc; i++)
    argv[a++] = cxx_argv[i];
  char *scan_args[] = {"-E", "-P", "-x", "c++", stdopt, scan_cpp, "-o", scan_ii, NULL};
  memcpy(argv + a, scan_args, sizeof scan_args);
  if (fk_run(argv, scan_log) != 0) return log_message("host preprocessor: ", scan_log);
  char *pre = fk_read_file(scan_ii, NULL);
  if (!pre) return message("nabla fake CUDA: cannot read %s%s", scan_ii, "");
  kernel *ks = malloc(MAX_KERNELS * sizeof *ks);
  int nk = ks ? find_kernels(pre, ks, MAX_KERNELS) : 0;
  free(pre);
  size_t tl = 64 + (size_t)nk * 400;
  char *tramp = ks ? malloc(tl) : NULL;
  if (!tramp) {
    free(ks);
    return message("nabla fake CUDA: out of memory%s%s", "", "");
  }
  size_t o = (size_t)snprintf(tramp, tl, "\n#line 1 \"nabla-fake-trampolines\"\n");
  for (int i = 0; i < nk; i++)
    o += (size_t)snprintf(tramp + o, tl - o,
                          "NB_SHIM_KERNEL(%s)\nextern \"C\" const unsigned nb_shim_b_%s = %u;\n",
                          ks[i].name, ks[i].name, ks[i].bounds);
  free(ks);
  const char *parts[] = {head, src, tramp, NULL};
  bool wrote = write_parts(k_cpp, parts);
  free(tramp);
  if (!wrote) return message("nabla fake CUDA: cannot write %s%s", k_cpp, "");
  a = cxx_argc;
  argv[a++] = stdopt;
  for (int i = 0; compile_flags[i]; i++)
    argv[a++] = (char *)compile_flags[i];
  char *out_args[] = {"-o", k_so, k_cpp, NULL};
  memcpy(argv + a, out_args, sizeof out_args);
  if (fk_run(argv, k_log) != 0) return log_message("", k_log);
  return NULL;
}

char *fk_host_compile(const char *src, const char *std, char *path_out) {
  pthread_once(&tools_once, resolve_tools);
  if (!cxx_argc) return message("nabla fake CUDA: no host C++ compiler%s%s", "", "");
  if (!shim_text)
    return message("nabla fake CUDA: cannot read the shim %s%s (NABLA_FAKE_CUDA_SHIM)", shim_path,
                   "");
  char err[512];
  const char *dir = fk_cache_dir(err, sizeof err);
  if (!dir) return message("nabla fake CUDA: %s%s", err, "");
  char *code = rewrite_dyn_smem(src);
  if (!code) return message("nabla fake CUDA: out of memory%s%s", "", "");
  uint64_t h[2] = {NB_SHIM_ABI, 0};
  fk_hash(shim_text, strlen(shim_text), h);
  fk_hash(cxx_buf, sizeof cxx_buf, h); /* the command (blanks are NULs after strtok) */
  for (int i = 0; compile_flags[i]; i++)
    fk_hash(compile_flags[i], strlen(compile_flags[i]) + 1, h);
  fk_hash(std, strlen(std), h);
  fk_hash(code, strlen(code), h);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%016llx%016llx.so", dir, (unsigned long long)h[0],
           (unsigned long long)h[1]);
  if (path_out) snprintf(path_out, PATH_MAX, "%s", path);
  char *log = NULL;
  if (access(path, R_OK) != 0) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.build-XXXXXX", dir);
    if (!mkdtemp(tmp)) {
      log = message("nabla fake CUDA: cannot create a folder in %s: %s", dir, strerror(errno));
    } else {
      log = build(tmp, code, std);
      char so[PATH_MAX];
      path_join(so, tmp, "k.so");
      if (!log && rename(so, path) != 0)
        log = message("nabla fake CUDA: cannot write %s: %s", path, strerror(errno));
      remove_build(tmp);
    }
  }
  free(code);
  return log;
}
