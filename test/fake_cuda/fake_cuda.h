/* test/fake_cuda/fake_cuda.h — internals of the fake CUDA stack (test/fake_cuda/README.md):
 * one shared library, libnbfakecuda.so, exporting the CUDA driver API, NVRTC and
 * cuBLASLt symbols nabla's loader looks up (src/backends/cuda/cuda_api.c), so that the
 * CUDA backend runs on a machine without a GPU, with real values:
 *   fake_driver.c   the device, its primary context, streams, events, memory (host
 *                   malloc), error names
 *   fake_module.c   kernel images, the host compilation of their source through
 *                   test/cuda_host_shim.h (cached on disk), modules, functions, launches
 *                   on a pool of host threads
 *   fake_nvrtc.c    NVRTC: programs whose "image" is their source
 *   fake_cublaslt.c cuBLASLt: D = alpha op(A) op(B) + beta C (+ bias) on the host
 * Every call completes before it returns (streams are synchronous). */
#ifndef NABLA_FAKE_CUDA_H
#define NABLA_FAKE_CUDA_H

#define NB_SHIM_ABI_ONLY 1
#include "../cuda_host_shim.h" /* the launch interface of host-compiled kernels */

#include <cublasLt.h>
#include <cuda.h>
#include <nvrtc.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the device (fake_driver.c) ---------------------------------------------------------- */
#define FK_CC_MAJOR 9
#define FK_CC_MINOR 0
#define FK_ARCH (FK_CC_MAJOR * 10 + FK_CC_MINOR)
#define FK_SM_COUNT 132
#define FK_SMEM_STATIC ((size_t)48 << 10)   /* a block's shared memory without opting in */
#define FK_SMEM_OPTIN ((size_t)227 << 10)   /* and the most it may opt in to */
#define FK_MAX_THREADS 1024                 /* per block */
#define FK_DEFAULT_MEMORY ((size_t)8 << 30) /* device memory unless NABLA_FAKE_CUDA_MEM says */

/* CUDA_SUCCESS when cuInit ran and the calling thread's current context is the
 * device's (retained) primary context; else the driver's error for it. */
CUresult fk_need_ctx(void);
/* Whether stream s may be used: the default streams (NULL, CU_STREAM_LEGACY,
 * CU_STREAM_PER_THREAD) or one made by cuStreamCreate and not destroyed. */
bool fk_stream_ok(CUstream s);
/* Whether [p, p + n) lies inside one device allocation or pinned host allocation (the
 * memory a kernel or cuBLASLt may touch under unified addressing); n 0 checks p. */
bool fk_device_range(const void *p, size_t n);

/* ---- hashing and the disk cache (fake_module.c) ------------------------------------------ */
/* 128-bit hash of n bytes continued from h (start with h = {0, 0}). Not
 * cryptographic: cache keys. */
void fk_hash(const void *p, size_t n, uint64_t h[2]);
/* The folder compiled kernels are cached in ($NABLA_FAKE_CUDA_DIR, else
 * /tmp/nabla-fake-cuda-<uid>), created on first use; NULL (why in err) when it cannot
 * be. */
const char *fk_cache_dir(char *err, size_t err_n);
/* Runs argv (argv[0] found on PATH) with stdin from /dev/null and stdout and stderr
 * into the file log; its exit status, or -1 when it could not be run. */
int fk_run(char *const argv[], const char *log);
/* The contents of file path (NUL terminated, *n its length without the NUL), malloc'd;
 * NULL when it cannot be read. */
char *fk_read_file(const char *path, size_t *n);

/* ---- kernel images and host modules (fake_module.c) --------------------------------------- */
/* An image from the fake NVRTC: a header line naming the target, then the CUDA source
 * (with the -D options as #defines), NUL terminated. It loads with cuModuleLoadData on
 * a device of a matching arch; its source is then compiled for the host. */
#define FK_IMAGE_MAGIC "//nabla-fake-cuda-image 1 "
/* The image of source src (NUL terminated) for target "sm_<arch>" (ptx false) or
 * "compute_<arch>", in C++ dialect std ("c++17"); malloc'd, *n its size with the NUL. */
char *fk_image_make(const char *src, bool ptx, int arch, const char *std, size_t *n);
/* Compiles src (C++ dialect std) for the host into the disk cache, or finds it there:
 * NULL on success, else the compiler's log (malloc'd; a message when it could not
 * run). Writes the library's path (PATH_MAX bytes) when path is not NULL. */
char *fk_host_compile(const char *src, const char *std, char *path);

/* Runs fn(arg, i) for i < n on the launch pool's host threads and the calling one (in
 * no given order; one such job or launch at a time); returns when all are done. */
void fk_parallel_for(unsigned long long n, void (*fn)(void *arg, unsigned long long i), void *arg);

/* ---- NVRTC's own (fake_nvrtc.c) ---------------------------------------------------------- */
/* Whether NVRTC compiles for arch (a real sm_XX the fake lists). */
bool fk_nvrtc_arch(int arch);

#endif
