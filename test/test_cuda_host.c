/* test/test_cuda_host.c — the CUDA backend's host-side parts, without a GPU
 * (`make test CUDA=1`; alone: `make CUDA=1 test-cuda-host`): the loader's
 * symbol table against the toolkit's stub driver, NVRTC compilation (CUBIN
 * for a known arch, PTX past the newest, errors with NVRTC's log), cache keys,
 * the disk cache (one file per kernel, hits across a memory reset, corrupt
 * files recompiled, an unwritable folder warns once), every copy and fill
 * kernel compiling, and the caching allocator driven by a fake address space
 * (rounding, carving, best fit, splitting, coalescing, trim, the OOM retry and
 * message, exact statistics, threads). Each Criterion test runs in its own
 * process, so environment variables set here reach a fresh loader. */
#ifdef NABLA_CUDA

#include "common.h"

#include "../src/backends/cuda/cuda_be.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(cuda_host, .init = tc_setup, .fini = tc_teardown);

#define MIB ((size_t)1 << 20)

/* A fresh empty folder under /tmp (path written to dir). */
static void temp_dir(char dir[256]) {
  snprintf(dir, 256, "/tmp/nabla-cuda-host-XXXXXX");
  cr_assert_not_null(mkdtemp(dir), "mkdtemp failed");
}

/* Entries of dir whose names end in suffix (and, with prefix_dot, start with '.'). */
static int count_files(const char *dir, const char *suffix, bool prefix_dot) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "cannot open %s", dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t k = strlen(e->d_name), s = strlen(suffix);
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (prefix_dot && e->d_name[0] != '.') continue;
    if (k >= s && !strcmp(e->d_name + k - s, suffix)) n++;
  }
  closedir(d);
  return n;
}

/* Skips the test where NVRTC is not installed. */
static void need_nvrtc(void) {
  if (!nbi_nvrtc_load()) cr_skip_test("NVRTC not available: %s", nbi_cu.why);
}

static const char *small_kernel =
    "extern \"C\" __global__ void nb_scale(float *x, float a, int n) {\n"
    "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) x[i] *= a;\n"
    "}\n";

/* ---- the loader ------------------------------------------------------------------------------ */
Test(cuda_host, every_driver_symbol_resolves_against_the_toolkit_stub) {
  const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (access(stub, R_OK) != 0) cr_skip_test("no stub driver at %s", stub);
  setenv("NABLA_CUDA_DRIVER", stub, 1);
  cr_assert_not(nbi_cu_load(), "the stub driver must not answer cuInit");
  cr_assert(strstr(nbi_cu.why, "cuInit"), "why: \"%s\" (every symbol should have resolved)",
            nbi_cu.why);
#define CHECK_FIELD_(name) cr_assert_not_null((void *)nbi_cu.name, "%s unresolved", #name);
  NBI_CU_FUNCS(CHECK_FIELD_)
#undef CHECK_FIELD_
  cr_assert_not(nbi_cu.driver);
}

Test(cuda_host, a_missing_driver_is_explained) {
  setenv("NABLA_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  cr_assert_not(nbi_cu_load());
  cr_assert(strstr(nbi_cu.why, "no CUDA driver"), "why: \"%s\"", nbi_cu.why);
  nbi_cu_load(); /* once: the same answer */
  cr_assert(strstr(nbi_cu.why, "no CUDA driver"));
}

Test(cuda_host, cu_check_formats_errors_and_passes_success) {
  cr_assert_eq(nbi_cu_check(CUDA_SUCCESS, "nabla: nothing"), NB_OK);
  cr_assert_eq(nb_last_status(), NB_OK);
  cr_assert_eq(nbi_cu_check(CUDA_ERROR_INVALID_VALUE, "nabla: cuTest"), NB_ERR_DEVICE);
  tc_assert_error(NB_ERR_DEVICE, "nabla: cuTest: ");
}

Test(cuda_host, nvrtc_lists_sm_90) {
  need_nvrtc();
  int n = 0;
  cr_assert_eq(nbi_cu.nvrtcGetNumSupportedArchs(&n), NVRTC_SUCCESS);
  int archs[64];
  cr_assert(n > 0 && n <= 64);
  cr_assert_eq(nbi_cu.nvrtcGetSupportedArchs(archs), NVRTC_SUCCESS);
  bool has90 = false;
  for (int i = 0; i < n; i++)
    has90 = has90 || archs[i] == 90;
  cr_assert(has90, "NVRTC does not list sm_90");
}

/* ---- compilation
 * --------------------------------------------------------------------------------- */
Test(cuda_host, a_known_arch_compiles_to_cubin) {
  need_nvrtc();
  nbi_cuda_image img;
  cr_assert_eq(nbi_cuda_compile(small_kernel, 90, &img), NB_OK, "%s", nb_last_error());
  cr_assert_not(img.ptx);
  cr_assert_gt(img.size, 4);
  cr_assert(!memcmp(img.data, "\177ELF", 4), "a CUBIN is an ELF file");
  free(img.data);
}

Test(cuda_host, an_arch_newer_than_nvrtc_knows_compiles_to_ptx) {
  need_nvrtc();
  nbi_cuda_image img;
  cr_assert_eq(nbi_cuda_compile(small_kernel, 1000, &img), NB_OK, "%s", nb_last_error());
  cr_assert(img.ptx);
  cr_assert_gt(img.size, 1);
  const char *text = img.data;
  cr_assert_eq(text[img.size - 1], '\0', "PTX is loaded as NUL-terminated text");
  cr_assert(strstr(text, ".target sm_"), "PTX names its target");
  cr_assert(strstr(text, "nb_scale"));
  free(img.data);
}

Test(cuda_host, an_arch_older_than_nvrtc_knows_is_a_device_error) {
  need_nvrtc();
  nbi_cuda_image img;
  cr_assert_eq(nbi_cuda_compile(small_kernel, 20, &img), NB_ERR_DEVICE);
  cr_assert_null(img.data);
  tc_assert_error(NB_ERR_DEVICE, "cannot compile for sm_20");
}

Test(cuda_host, a_syntax_error_gives_nvrtcs_log) {
  need_nvrtc();
  const char *bad = "extern \"C\" __global__ void nb_bad(float *x) {\n"
                    "  x[0] = undefined_thing + 1;\n"
                    "}\n";
  nbi_cuda_image img;
  cr_assert_eq(nbi_cuda_compile(bad, 90, &img), NB_ERR_DEVICE);
  cr_assert_null(img.data);
  const char *msg = nb_last_error();
  cr_assert(strstr(msg, "nabla.cu(2)"), "message lacks the log's line: %s", msg);
  cr_assert(strstr(msg, "undefined_thing"), "message lacks the log's text: %s", msg);
  nb_clear_error();
  cr_assert_eq(nbi_cuda_compile(NULL, 90, &img), NB_ERR_NULL);
  nb_clear_error();
}

Test(cuda_host, a_long_log_is_cut_to_fit_the_message) {
  need_nvrtc();
  char src[8192] = "extern \"C\" __global__ void nb_bad(float *x) {\n";
  for (int i = 0; i < 60; i++)
    snprintf(src + strlen(src), sizeof src - strlen(src), "  x[%d] = missing_%d;\n", i, i);
  strcat(src, "}\n");
  nbi_cuda_image img;
  cr_assert_eq(nbi_cuda_compile(src, 90, &img), NB_ERR_DEVICE);
  const char *msg = nb_last_error();
  cr_assert(strstr(msg, "missing_0"), "%s", msg);
  cr_assert(strstr(msg, " ..."), "a cut log ends in ...: %s", msg);
  cr_assert_lt(strlen(msg), 1023);
  nb_clear_error();
}

Test(cuda_host, cache_keys_follow_source_and_arch) {
  need_nvrtc();
  char a[33], b[33], c[33], d[33];
  nbi_cuda_cache_key(small_kernel, 90, a);
  nbi_cuda_cache_key(small_kernel, 90, b);
  cr_assert_str_eq(a, b);
  cr_assert_eq(strlen(a), 32);
  for (int i = 0; i < 32; i++)
    cr_assert(strchr("0123456789abcdef", a[i]), "key %s is not hex", a);
  nbi_cuda_cache_key(small_kernel, 80, c);
  cr_assert_str_neq(a, c);
  char *other = strdup(small_kernel);
  other[strlen(other) - 3] = ' '; /* one character differs */
  nbi_cuda_cache_key(other, 90, d);
  cr_assert_str_neq(a, d);
  free(other);
}

/* ---- the disk cache
 * ---------------------------------------------------------------------------------- */
Test(cuda_host, the_disk_cache_keeps_one_file_per_kernel_and_serves_a_new_process) {
  need_nvrtc();
  char dir[256];
  temp_dir(dir);
  setenv("NABLA_CACHE_DIR", dir, 1);
  cr_assert_str_eq(nbi_cuda_cache_dir(), dir);
  const nbi_cuda_image *img;
  cr_assert_eq(nbi_cuda_image_get(small_kernel, 90, "nb_scale", &img), NB_OK, "%s",
               nb_last_error());
  nbi_cuda_cache_stats s = nbi_cuda_cache_get_stats();
  cr_assert_eq(s.compiles, 1);
  cr_assert_eq(s.disk_writes, 1);
  cr_assert_eq(count_files(dir, ".nbk", false), 1);
  cr_assert_eq(count_files(dir, "", true), 0, "no temporary file is left");
  char key[33], path[400];
  nbi_cuda_cache_key(small_kernel, 90, key);
  snprintf(path, sizeof path, "%s/%s.nbk", dir, key);
  cr_assert_eq(access(path, R_OK), 0, "the file is named by the key: %s", path);
  void *first = malloc(img->size);
  size_t first_size = img->size;
  memcpy(first, img->data, img->size);

  cr_assert_eq(nbi_cuda_image_get(small_kernel, 90, "nb_scale", &img), NB_OK);
  cr_assert_eq(nbi_cuda_cache_get_stats().memory_hits, 1);

  nbi_cuda_cache_reset(); /* as a new process */
  cr_assert_eq(nbi_cuda_image_get(small_kernel, 90, "nb_scale", &img), NB_OK);
  s = nbi_cuda_cache_get_stats();
  cr_assert_eq(s.disk_hits, 1);
  cr_assert_eq(s.compiles, 0);
  cr_assert_eq(s.disk_writes, 0);
  cr_assert_eq(img->size, first_size);
  cr_assert(!memcmp(img->data, first, first_size), "the disk gives the compiled bytes back");
  free(first);

  cr_assert_eq(nbi_cuda_image_get(small_kernel, 80, "nb_scale", &img), NB_OK);
  cr_assert_eq(count_files(dir, ".nbk", false), 2, "another arch is another file");
}

/* Damages the cache file of (small_kernel, 90) in dir: truncation or a flipped byte. */
static void damage(const char *dir, bool truncate_it) {
  char key[33], path[400];
  nbi_cuda_cache_key(small_kernel, 90, key);
  snprintf(path, sizeof path, "%s/%s.nbk", dir, key);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  if (truncate_it) {
    cr_assert_eq(truncate(path, st.st_size - 7), 0);
    return;
  }
  int fd = open(path, O_RDWR);
  cr_assert_geq(fd, 0);
  unsigned char byte;
  off_t at = st.st_size - 20;
  cr_assert_eq(pread(fd, &byte, 1, at), 1);
  byte ^= 0x5a;
  cr_assert_eq(pwrite(fd, &byte, 1, at), 1);
  close(fd);
}

static void recompiles_after_damage(bool truncate_it) {
  need_nvrtc();
  char dir[256];
  temp_dir(dir);
  setenv("NABLA_CACHE_DIR", dir, 1);
  const nbi_cuda_image *img;
  cr_assert_eq(nbi_cuda_image_get(small_kernel, 90, "nb_scale", &img), NB_OK);
  damage(dir, truncate_it);
  nbi_cuda_cache_reset();
  cr_assert_eq(nbi_cuda_image_get(small_kernel, 90, "nb_scale", &img), NB_OK, "%s",
               nb_last_error());
  nbi_cuda_cache_stats s = nbi_cuda_cache_get_stats();
  cr_assert_eq(s.disk_hits, 0, "a damaged file is not used");
  cr_assert_eq(s.compiles, 1);
  cr_assert_eq(s.disk_writes, 1, "and it is rewritten");
  nbi_cuda_cache_reset();
  cr_assert_eq(nbi_cuda_image_get(small_kernel, 90, "nb_scale", &img), NB_OK);
  cr_assert_eq(nbi_cuda_cache_get_stats().disk_hits, 1, "the rewritten file serves");
}

Test(cuda_host, a_truncated_cache_file_is_recompiled_and_rewritten) {
  recompiles_after_damage(true);
}

Test(cuda_host, a_corrupt_cache_file_is_recompiled_and_rewritten) {
  recompiles_after_damage(false);
}

/* Runs two compilations with stderr captured; returns what was written (malloc'd). */
static char *compile_twice_capturing_stderr(void) {
  char log[] = "/tmp/nabla-cuda-stderr-XXXXXX";
  int fd = mkstemp(log);
  cr_assert_geq(fd, 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  const nbi_cuda_image *img;
  nb_status a = nbi_cuda_image_get(small_kernel, 90, "nb_scale", &img);
  nb_status b = nbi_cuda_image_get(small_kernel, 80, "nb_scale", &img);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  cr_assert_eq(a, NB_OK, "%s", nb_last_error());
  cr_assert_eq(b, NB_OK, "%s", nb_last_error());
  char *text = calloc(1, 4096);
  cr_assert_geq(pread(fd, text, 4095, 0), 0);
  close(fd);
  unlink(log);
  return text;
}

Test(cuda_host, an_unusable_cache_folder_warns_once_and_compiles_anyway) {
  need_nvrtc();
  char dir[256], file[300], below[400];
  temp_dir(dir);
  snprintf(file, sizeof file, "%s/file", dir);
  FILE *f = fopen(file, "w");
  cr_assert_not_null(f);
  fclose(f);
  snprintf(below, sizeof below, "%s/sub", file); /* under a regular file: even root cannot */
  setenv("NABLA_CACHE_DIR", below, 1);
  char *err = compile_twice_capturing_stderr();
  const char *w = strstr(err, "warning");
  cr_assert_not_null(w, "no warning: \"%s\"", err);
  cr_assert_null(strstr(w + 1, "warning"), "more than one warning: \"%s\"", err);
  cr_assert(strstr(err, below), "the warning names the folder: \"%s\"", err);
  free(err);
  cr_assert_str_eq(nbi_cuda_cache_dir(), "");
  cr_assert_eq(nbi_cuda_cache_get_stats().compiles, 2);
  cr_assert_eq(nbi_cuda_cache_get_stats().disk_writes, 0);
}

Test(cuda_host, the_cache_folder_defaults_to_xdg_cache_home) {
  char dir[256], want[400];
  temp_dir(dir);
  unsetenv("NABLA_CACHE_DIR");
  setenv("XDG_CACHE_HOME", dir, 1);
  snprintf(want, sizeof want, "%s/nabla/kernels", dir);
  cr_assert_str_eq(nbi_cuda_cache_dir(), want);
  struct stat st;
  cr_assert(stat(want, &st) == 0 && S_ISDIR(st.st_mode), "the folders are created");
}

Test(cuda_host, the_cache_folder_falls_back_to_home) {
  char dir[256], want[400];
  temp_dir(dir);
  unsetenv("NABLA_CACHE_DIR");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", dir, 1);
  snprintf(want, sizeof want, "%s/.cache/nabla/kernels", dir);
  cr_assert_str_eq(nbi_cuda_cache_dir(), want);
}

/* ---- copy and fill kernels
 * ------------------------------------------------------------------------------ */
Test(cuda_host, every_copy_and_fill_kernel_compiles, .timeout = 300) {
  need_nvrtc();
  char dir[256];
  temp_dir(dir);
  setenv("NABLA_CACHE_DIR", dir, 1);
  for (int fill = 0; fill < 2; fill++) {
    for (int s = 0; s < NB_DTYPE_COUNT; s++) {
      for (int d = 0; d < NB_DTYPE_COUNT; d++) {
        if (fill && s != d) continue;
        char *src = nbi_cuda_copy_source(fill, (nb_dtype)s, (nb_dtype)d);
        cr_assert_not_null(src);
        nbi_cuda_image img;
        nb_status st = nbi_cuda_compile(src, 90, &img);
        cr_assert_eq(st, NB_OK, "%s %s -> %s: %s", fill ? "fill" : "copy",
                     nb_dtype_name((nb_dtype)s), nb_dtype_name((nb_dtype)d), nb_last_error());
        free(img.data);
        free(src);
      }
    }
  }
}

/* ---- the allocator over a fake address space
 * ------------------------------------------------------------ */
/* Segments come from an address counter (never dereferenced) with a byte
 * budget; consecutive segments leave a gap so they can never merge. */
typedef struct fake_dev {
  CUdeviceptr next;
  size_t budget, used;
  int reserves, releases;
} fake_dev;

static nb_status fake_reserve(void *user, size_t n, CUdeviceptr *addr) {
  fake_dev *f = user;
  if (f->used + n > f->budget) return NB_ERR_OOM;
  *addr = f->next;
  f->next += n + 2 * MIB;
  f->used += n;
  f->reserves++;
  return NB_OK;
}

static void fake_release(void *user, CUdeviceptr addr, size_t n) {
  fake_dev *f = user;
  (void)addr;
  f->used -= n;
  f->releases++;
}

static nbi_cuda_alloc *fake_alloc(fake_dev *f, size_t budget) {
  *f = (fake_dev){.next = 0x100000000ull, .budget = budget};
  nbi_cuda_alloc_source src = {.reserve = fake_reserve, .release = fake_release, .user = f};
  nbi_cuda_alloc *a = nbi_cuda_alloc_create_with(&src, "fake:0");
  cr_assert_not_null(a);
  return a;
}

static void expect_stats(nbi_cuda_alloc *a, size_t allocated, size_t reserved) {
  size_t al = 0, re = 0;
  nbi_cuda_alloc_stats(a, &al, &re);
  cr_assert_eq(al, allocated, "allocated %zu, expected %zu", al, allocated);
  cr_assert_eq(re, reserved, "reserved %zu, expected %zu", re, reserved);
}

Test(cuda_host, small_blocks_round_to_512_and_share_a_2_mib_segment) {
  fake_dev f;
  nbi_cuda_alloc *a = fake_alloc(&f, 64 * MIB);
  CUdeviceptr p = nbi_cuda_alloc_block(a, 1);
  CUdeviceptr q = nbi_cuda_alloc_block(a, 1000);
  CUdeviceptr r = nbi_cuda_alloc_block(a, 0);
  cr_assert(p && q && r);
  expect_stats(a, 512 + 1024 + 512, 2 * MIB);
  cr_assert_eq(f.reserves, 1);
  cr_assert_eq(q, p + 512, "carved after the first");
  cr_assert_eq(r, q + 1024);
  cr_assert_eq(p % 512, 0);
  nbi_cuda_free_block(a, q);
  expect_stats(a, 1024, 2 * MIB);
  CUdeviceptr s = nbi_cuda_alloc_block(a, 700); /* best fit: q's 1024-byte hole */
  cr_assert_eq(s, q);
  expect_stats(a, 1024 + 1024, 2 * MIB);
  nbi_cuda_alloc_destroy(a);
  cr_assert_eq(f.releases, f.reserves);
  cr_assert_eq(f.used, 0);
}

Test(cuda_host, large_blocks_take_segments_rounded_to_2_mib_and_are_reused) {
  fake_dev f;
  nbi_cuda_alloc *a = fake_alloc(&f, 64 * MIB);
  CUdeviceptr p = nbi_cuda_alloc_block(a, 3 * MIB);
  cr_assert(p);
  expect_stats(a, 3 * MIB, 4 * MIB);
  nbi_cuda_free_block(a, p);
  expect_stats(a, 0, 4 * MIB);
  CUdeviceptr q = nbi_cuda_alloc_block(a, MIB + 512); /* large, fits the freed segment */
  cr_assert_eq(q, p);
  cr_assert_eq(f.reserves, 1);
  expect_stats(a, MIB + 512, 4 * MIB);
  CUdeviceptr s = nbi_cuda_alloc_block(a, 512 * 1024); /* small: its own pool */
  cr_assert_eq(f.reserves, 2);
  expect_stats(a, MIB + 512 + 512 * 1024, 6 * MIB);
  nbi_cuda_free_block(a, q);
  nbi_cuda_free_block(a, s);
  nbi_cuda_alloc_destroy(a);
  cr_assert_eq(f.used, 0);
}

Test(cuda_host, freed_neighbours_coalesce) {
  fake_dev f;
  nbi_cuda_alloc *a = fake_alloc(&f, 64 * MIB);
  CUdeviceptr p = nbi_cuda_alloc_block(a, 8 * MIB);
  nbi_cuda_free_block(a, p);
  CUdeviceptr x = nbi_cuda_alloc_block(a, 2 * MIB), y = nbi_cuda_alloc_block(a, 2 * MIB),
              z = nbi_cuda_alloc_block(a, 2 * MIB);
  cr_assert_eq(x, p);
  cr_assert_eq(y, p + 2 * MIB);
  cr_assert_eq(z, p + 4 * MIB);
  expect_stats(a, 6 * MIB, 8 * MIB);
  nbi_cuda_free_block(a, y);
  nbi_cuda_free_block(a, x); /* x + y: one free 4 MiB block at p */
  CUdeviceptr w = nbi_cuda_alloc_block(a, 4 * MIB);
  cr_assert_eq(w, p, "the merged block serves 4 MiB (the other hole is only 2 MiB)");
  nbi_cuda_free_block(a, w);
  nbi_cuda_free_block(a, z); /* everything merges back */
  CUdeviceptr all = nbi_cuda_alloc_block(a, 8 * MIB);
  cr_assert_eq(all, p);
  cr_assert_eq(f.reserves, 1);
  nbi_cuda_free_block(a, all);
  nbi_cuda_alloc_trim(a);
  expect_stats(a, 0, 0);
  cr_assert_eq(f.releases, 1);
  nbi_cuda_alloc_destroy(a);
}

Test(cuda_host, trim_keeps_segments_in_use) {
  fake_dev f;
  nbi_cuda_alloc *a = fake_alloc(&f, 64 * MIB);
  CUdeviceptr p = nbi_cuda_alloc_block(a, 4096);
  CUdeviceptr q = nbi_cuda_alloc_block(a, 4 * MIB);
  CUdeviceptr r = nbi_cuda_alloc_block(a, 6 * MIB);
  nbi_cuda_free_block(a, q);
  nbi_cuda_alloc_trim(a);
  expect_stats(a, 4096 + 6 * MIB, 2 * MIB + 6 * MIB);
  cr_assert_eq(f.releases, 1);
  nbi_cuda_free_block(a, p);
  nbi_cuda_free_block(a, r);
  nbi_cuda_alloc_trim(a);
  expect_stats(a, 0, 0);
  cr_assert_eq(f.used, 0);
  nbi_cuda_alloc_destroy(a);
}

Test(cuda_host, out_of_memory_frees_the_cache_and_retries) {
  fake_dev f;
  nbi_cuda_alloc *a = fake_alloc(&f, 8 * MIB);
  nbi_cuda_free_block(a, nbi_cuda_alloc_block(a, 3 * MIB / 2)); /* a cached 2 MiB large segment */
  nbi_cuda_free_block(a, nbi_cuda_alloc_block(a, 1024));        /* and a cached small one */
  expect_stats(a, 0, 4 * MIB);
  CUdeviceptr p = nbi_cuda_alloc_block(a, 7 * MIB); /* 8 MiB: only after giving both back */
  cr_assert(p, "%s", nb_last_error());
  cr_assert_eq(nb_last_status(), NB_OK);
  cr_assert_eq(f.releases, 2);
  expect_stats(a, 7 * MIB, 8 * MIB);
  nbi_cuda_free_block(a, p);
  nbi_cuda_alloc_destroy(a);
}

Test(cuda_host, out_of_memory_reports_requested_allocated_and_reserved) {
  fake_dev f;
  nbi_cuda_alloc *a = fake_alloc(&f, 8 * MIB);
  CUdeviceptr held = nbi_cuda_alloc_block(a, 3 * MIB / 2);
  cr_assert(held);
  CUdeviceptr p = nbi_cuda_alloc_block(a, 7 * MIB);
  cr_assert_eq(p, 0);
  tc_assert_error(NB_ERR_OOM, "nabla: CUDA out of memory on fake:0: requested 7340032 bytes, "
                              "allocated 1572864, reserved 2097152");
  cr_assert_eq(nbi_cuda_alloc_block(a, SIZE_MAX), 0);
  tc_assert_error(NB_ERR_OOM, "out of memory on fake:0");
  expect_stats(a, 3 * MIB / 2, 2 * MIB);
  nbi_cuda_free_block(a, held);
  nbi_cuda_alloc_destroy(a);
}

Test(cuda_host, freeing_an_unknown_block_is_an_error_not_a_crash) {
  fake_dev f;
  nbi_cuda_alloc *a = fake_alloc(&f, 8 * MIB);
  nbi_cuda_free_block(a, 0); /* ignored */
  cr_assert_eq(nb_last_status(), NB_OK);
  CUdeviceptr p = nbi_cuda_alloc_block(a, 100);
  nbi_cuda_free_block(a, p + 512);
  tc_assert_error(NB_ERR_INTERNAL, "not an allocated block");
  nbi_cuda_free_block(a, p);
  nbi_cuda_free_block(a, p); /* twice */
  tc_assert_error(NB_ERR_INTERNAL, "not an allocated block");
  expect_stats(a, 0, 2 * MIB);
  nbi_cuda_alloc_destroy(a);
}

/* Live blocks of the random workload. */
typedef struct live {
  CUdeviceptr addr;
  size_t size; /* rounded */
} live;

static int live_cmp(const void *x, const void *y) {
  const live *a = x, *b = y;
  return a->addr < b->addr ? -1 : a->addr > b->addr;
}

Test(cuda_host, a_random_workload_keeps_blocks_disjoint_and_stats_exact) {
  fake_dev f;
  nbi_cuda_alloc *a = fake_alloc(&f, (size_t)1 << 40);
  enum { SLOTS = 64 };
  live held[SLOTS] = {{0, 0}};
  uint64_t seed = 42;
  size_t want = 0, peak_after_warmup = 0, at_warmup = 0;
  for (int step = 0; step < 20000; step++) {
    int k = (int)tc_randint(&seed, 0, SLOTS - 1);
    if (held[k].addr) {
      nbi_cuda_free_block(a, held[k].addr);
      want -= held[k].size;
      held[k] = (live){0, 0};
    } else {
      size_t n = tc_uniform(&seed, 0, 1) < 0.8 ? (size_t)tc_randint(&seed, 1, 1 << 20)
                                               : (size_t)tc_randint(&seed, 1 << 20, 24 << 20);
      held[k].addr = nbi_cuda_alloc_block(a, n);
      cr_assert(held[k].addr, "%s", nb_last_error());
      held[k].size = (n + 511) / 512 * 512;
      want += held[k].size;
    }
    size_t al, re;
    nbi_cuda_alloc_stats(a, &al, &re);
    cr_assert_eq(al, want, "step %d: allocated %zu, expected %zu", step, al, want);
    if (step == 5000) at_warmup = re;
    if (step > 5000 && re > peak_after_warmup) peak_after_warmup = re;
    if (step % 997 == 0) {
      live sorted[SLOTS];
      int n = 0;
      for (int i = 0; i < SLOTS; i++)
        if (held[i].addr) sorted[n++] = held[i];
      qsort(sorted, (size_t)n, sizeof *sorted, live_cmp);
      for (int i = 1; i < n; i++)
        cr_assert_geq(sorted[i].addr, sorted[i - 1].addr + sorted[i - 1].size,
                      "step %d: blocks overlap", step);
    }
  }
  cr_assert_leq(peak_after_warmup, at_warmup + at_warmup / 2,
                "reserved grew from %zu to %zu after warm-up", at_warmup, peak_after_warmup);
  for (int i = 0; i < SLOTS; i++)
    nbi_cuda_free_block(a, held[i].addr);
  expect_stats(a, 0, f.used);
  nbi_cuda_alloc_trim(a);
  expect_stats(a, 0, 0);
  cr_assert_eq(f.reserves, f.releases);
  nbi_cuda_alloc_destroy(a);
}

typedef struct worker {
  nbi_cuda_alloc *a;
  uint64_t seed;
  bool ok;
} worker;

static void *churn(void *arg) {
  worker *w = arg;
  CUdeviceptr mine[16] = {0};
  w->ok = true;
  for (int i = 0; i < 4000; i++) {
    int k = (int)tc_randint(&w->seed, 0, 15);
    if (mine[k]) {
      nbi_cuda_free_block(w->a, mine[k]);
      mine[k] = 0;
    } else {
      mine[k] = nbi_cuda_alloc_block(w->a, (size_t)tc_randint(&w->seed, 1, 3 << 20));
      w->ok = w->ok && mine[k];
    }
  }
  for (int k = 0; k < 16; k++)
    nbi_cuda_free_block(w->a, mine[k]);
  return NULL;
}

Test(cuda_host, threads_share_the_allocator) {
  fake_dev f;
  nbi_cuda_alloc *a = fake_alloc(&f, (size_t)1 << 40);
  pthread_t t[4];
  worker w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){.a = a, .seed = 100 + (uint64_t)i};
    cr_assert_eq(pthread_create(&t[i], NULL, churn, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    cr_assert(w[i].ok, "thread %d failed to allocate", i);
  }
  expect_stats(a, 0, f.used);
  nbi_cuda_alloc_trim(a);
  expect_stats(a, 0, 0);
  nbi_cuda_alloc_destroy(a);
}

#endif
