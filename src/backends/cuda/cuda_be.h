/* src/backends/cuda/cuda_be.h — the CUDA backend's internal contract, shared by its
 * files (nothing outside src/backends/cuda includes it).
 *
 * Built only with `make CUDA=1`. The CUDA driver API (libcuda.so.1), NVRTC
 * (libnvrtc.so) and cuBLASLt (libcublasLt.so) are opened with dlopen at the first
 * device query, so one library binary runs with and without them: where any is
 * missing, or no GPU answers, nb_device_count(NB_DEVICE_CUDA) is 0 and asking
 * for NB_CUDA(i) is NB_ERR_DEVICE. The toolkit's headers give the types at
 * compile time only. No nvcc: every kernel, generated or hand-written, is CUDA C
 * compiled at run time by NVRTC (straight to SASS for the device's compute
 * capability; PTX only when the GPU is newer than NVRTC knows), cached in memory
 * and on disk (cuda_nvrtc.c).
 *
 * Files:
 *   cuda_api.c      the loader: function tables of the three libraries
 *   cuda_device.c   contexts, the compute stream, pinned staging, host I/O, sync
 *                   and deferred kernel errors, the vtable, device probing
 *   cuda_alloc.c    the caching device allocator
 *   cuda_nvrtc.c    NVRTC compilation, the in-memory and on-disk kernel caches,
 *                   module loading, launches
 *   cuda_copy.c     strided copy with dtype conversion, fill
 *   cuda_preamble.c the device-side preamble every kernel source starts with
 *   cuda_render.c   CUDA C from the planner's nbi_group descriptions and the
 *                   shared formula list (../ew_formulas.h): elementwise groups,
 *                   the kernel cache, nbi_cuda_run_group
 *   cuda_render_rows.c  row groups (reductions, axis ops, per-row and global
 *                   members); cuda_render.h is the two files' shared header
 *   cuda_gemm.c     cuBLASLt: MATMUL, GEMM epilogue groups
 *   cuda_gemm_kernels.c  cuda_gemm.c's own kernels: integer products, epilogue pass
 *   cuda_ops.c      the per-op kernel table (run_op, supports): each op's route
 *   cuda_ops_index.c  take, take_along_axis, scatter_add(_along_axis), one_hot
 *   cuda_ops_nn.c   conv2d and its gradients (im2col / col2im + GEMM), pooling
 * Every kernel opens with a comment giving its shapes (llm.c's habit). */
#ifndef NABLA_CUDA_BE_H
#define NABLA_CUDA_BE_H

#include "../backend.h"

#include <pthread.h>

#include <cublasLt.h>
#include <cuda.h>
#include <nvrtc.h>

/* ---- the loader (cuda_api.c) ----------------------------------------------------------
 * Function pointers of the driver API, NVRTC and cuBLASLt, filled by
 * nbi_cu_load (once, thread-safe). Each pointer has the type of the
 * toolkit's prototype. */
#define NBI_CU_FUNCS(X)                                                                            \
  X(cuInit)                                                                                        \
  X(cuDriverGetVersion)                                                                            \
  X(cuDeviceGetCount)                                                                              \
  X(cuDeviceGet)                                                                                   \
  X(cuDeviceGetName)                                                                               \
  X(cuDeviceGetAttribute)                                                                          \
  X(cuDeviceTotalMem)                                                                              \
  X(cuDevicePrimaryCtxRetain)                                                                      \
  X(cuDevicePrimaryCtxRelease)                                                                     \
  X(cuCtxSetCurrent)                                                                               \
  X(cuCtxGetCurrent)                                                                               \
  X(cuCtxSynchronize)                                                                              \
  X(cuStreamCreate)                                                                                \
  X(cuStreamDestroy)                                                                               \
  X(cuStreamSynchronize)                                                                           \
  X(cuEventCreate)                                                                                 \
  X(cuEventDestroy)                                                                                \
  X(cuEventRecord)                                                                                 \
  X(cuEventSynchronize)                                                                            \
  X(cuEventElapsedTime)                                                                            \
  X(cuMemAlloc)                                                                                    \
  X(cuMemFree)                                                                                     \
  X(cuMemAllocHost)                                                                                \
  X(cuMemFreeHost)                                                                                 \
  X(cuMemcpyHtoDAsync)                                                                             \
  X(cuMemcpyDtoHAsync)                                                                             \
  X(cuMemcpyDtoDAsync)                                                                             \
  X(cuMemcpyPeerAsync)                                                                             \
  X(cuMemsetD8Async)                                                                               \
  X(cuMemsetD16Async)                                                                              \
  X(cuMemsetD32Async)                                                                              \
  X(cuMemGetInfo)                                                                                  \
  X(cuModuleLoadData)                                                                              \
  X(cuModuleUnload)                                                                                \
  X(cuModuleGetFunction)                                                                           \
  X(cuFuncSetAttribute)                                                                            \
  X(cuLaunchKernel)                                                                                \
  X(cuGetErrorName)                                                                                \
  X(cuGetErrorString)

#define NBI_NVRTC_FUNCS(X)                                                                         \
  X(nvrtcVersion)                                                                                  \
  X(nvrtcGetSupportedArchs)                                                                        \
  X(nvrtcGetNumSupportedArchs)                                                                     \
  X(nvrtcCreateProgram)                                                                            \
  X(nvrtcDestroyProgram)                                                                           \
  X(nvrtcCompileProgram)                                                                           \
  X(nvrtcGetProgramLogSize)                                                                        \
  X(nvrtcGetProgramLog)                                                                            \
  X(nvrtcGetCUBINSize)                                                                             \
  X(nvrtcGetCUBIN)                                                                                 \
  X(nvrtcGetPTXSize)                                                                               \
  X(nvrtcGetPTX)                                                                                   \
  X(nvrtcGetErrorString)

#define NBI_LT_FUNCS(X)                                                                            \
  X(cublasLtCreate)                                                                                \
  X(cublasLtDestroy)                                                                               \
  X(cublasLtGetVersion)                                                                            \
  X(cublasLtMatmul)                                                                                \
  X(cublasLtMatmulDescCreate)                                                                      \
  X(cublasLtMatmulDescDestroy)                                                                     \
  X(cublasLtMatmulDescSetAttribute)                                                                \
  X(cublasLtMatrixLayoutCreate)                                                                    \
  X(cublasLtMatrixLayoutDestroy)                                                                   \
  X(cublasLtMatrixLayoutSetAttribute)                                                              \
  X(cublasLtMatmulPreferenceCreate)                                                                \
  X(cublasLtMatmulPreferenceDestroy)                                                               \
  X(cublasLtMatmulPreferenceSetAttribute)                                                          \
  X(cublasLtMatmulAlgoGetHeuristic)

typedef struct nbi_cu_api {
#define NBI_CU_FIELD_(name) __typeof__(&name) name;
  NBI_CU_FUNCS(NBI_CU_FIELD_)
  NBI_NVRTC_FUNCS(NBI_CU_FIELD_)
  NBI_LT_FUNCS(NBI_CU_FIELD_)
#undef NBI_CU_FIELD_
  bool driver, nvrtc, lt; /* which libraries loaded */
  char why[256];          /* why not, for the skip message and NB_ERR_DEVICE */
} nbi_cu_api;
extern nbi_cu_api nbi_cu;

/* Loads what is there, once (later calls return the first answer): true when
 * the driver answered cuInit. NVRTC alone is enough for nbi_cuda_compile
 * (host-side tests run it where no GPU is). */
bool nbi_cu_load(void);
bool nbi_nvrtc_load(void);
/* Records NB_ERR_DEVICE "<what>: <driver error name>: <string>" and returns it;
 * NB_OK for CUDA_SUCCESS. */
nb_status nbi_cu_check(CUresult r, const char *what);
/* Writes "<what>: <driver error name>: <string>" into buf (n bytes, NUL
 * terminated) without recording an error (device probing explains itself in
 * nbi_cuda_why, not in the caller's error). */
void nbi_cu_describe(CUresult r, const char *what, char *buf, size_t n);

/* ---- a device (cuda_device.c) ---------------------------------------------------------- */
typedef struct nbi_cuda_alloc nbi_cuda_alloc; /* cuda_alloc.c */

typedef struct nbi_cuda_ctx {
  int index;   /* public index: NB_CUDA(index), "cuda:<index>" */
  int ordinal; /* CUDA device ordinal */
  int table;   /* index in core's device table */
  CUdevice dev;
  CUcontext ctx; /* the primary context */
  CUstream stream;
  int cc_major, cc_minor, sm_count;
  size_t smem_optin; /* shared memory a block may opt in to */
  char name[128];
  /* Deferred kernel errors: kernels that find a bad index write a code here
   * (atomicCAS from 0); sync reads and clears it. */
  CUdeviceptr err_word;
  /* Pinned staging for host I/O, grown on demand. */
  void *pinned;
  size_t pinned_bytes;
  nbi_cuda_alloc *alloc;
  /* cuBLASLt */
  cublasLtHandle_t lt;
  CUdeviceptr lt_workspace;
  size_t lt_workspace_bytes;
  pthread_mutex_t lock; /* serializes the context's mutable state */
} nbi_cuda_ctx;

/* The vtable of every CUDA device (ctx: its nbi_cuda_ctx). */
extern const nbi_backend nbi_cuda_backend;
/* Makes c's context current on the calling thread (cheap when it is). Every
 * vtable entry calls it first, so the functions it reaches (allocator,
 * kernel cache, launches, copies) run with c's context current. */
nb_status nbi_cuda_enter(nbi_cuda_ctx *c);
/* The deferred error codes a kernel may write to err_word (an int, first
 * writer wins: atomicCAS(err, 0, code)): code = kind | (op << 8) | (caller <<
 * 16), op the NBI_OP_* of the kernel and caller the public composite that made
 * an index op (src/ops/index.h; 0 for the op itself), so sync can name the
 * function ("nb_take: index out of range", "nb_cross_entropy: label out of
 * range", NB_ERR_INDEX). Every kernel that can fail takes `int *err` as a
 * parameter (c->err_word). Index errors also keep the bad index (words 1-3,
 * int64: largest excess above, largest deficit below, the axis' size) and put
 * the axis in bits 24..30, so the message names the index as the CPU's does. */
#define NBI_CUDA_ERR_BYTES 32
enum {
  NBI_CUDA_KERR_NONE = 0,
  NBI_CUDA_KERR_INDEX = 1, /* an index out of range (take, scatter, one_hot) */
};

/* ---- the caching allocator (cuda_alloc.c) -------------------------------------------------
 * Size classes for small blocks (<= 1 MiB, rounded to 512 B, carved from 2 MiB
 * segments), best-fit with splitting and coalescing of neighbours for large
 * ones (rounded to 2 MiB segments). Every block is used by the device's one
 * stream, so a freed block can be handed out again at once (stream order).
 * On cuMemAlloc failure every cached, unused segment is freed and the
 * allocation retried; a final failure records NB_ERR_OOM with requested,
 * allocated and reserved bytes. */
nbi_cuda_alloc *nbi_cuda_alloc_create(nbi_cuda_ctx *c);
void nbi_cuda_alloc_destroy(nbi_cuda_alloc *a);
CUdeviceptr nbi_cuda_alloc_block(nbi_cuda_alloc *a, size_t nbytes); /* 0 on OOM (recorded) */
void nbi_cuda_free_block(nbi_cuda_alloc *a, CUdeviceptr p);
void nbi_cuda_alloc_trim(nbi_cuda_alloc *a); /* frees every unused segment */
void nbi_cuda_alloc_stats(const nbi_cuda_alloc *a, size_t *allocated, size_t *reserved);
/* allocated: bytes of the blocks handed out (requests rounded up to 512 B);
 * reserved: bytes of the segments held from the device. */
#define NBI_CUDA_ALLOC_ROUND ((size_t)512)
#define NBI_CUDA_SMALL_MAX ((size_t)1 << 20) /* small blocks: <= 1 MiB */
#define NBI_CUDA_SEGMENT ((size_t)2 << 20)   /* small segments; large ones round to it */
/* Where segments come from, pluggable so that tests drive the allocator
 * without a GPU. reserve: NB_OK and *addr, NB_ERR_OOM (nothing recorded) when
 * the device is out of memory, or another status (recorded). release gives a
 * segment back. nbi_cuda_alloc_create's source is cuMemAlloc / cuMemFree on c
 * (waiting for c's stream before a free). Both run under the allocator's lock. */
typedef struct nbi_cuda_alloc_source {
  nb_status (*reserve)(void *user, size_t nbytes, CUdeviceptr *addr);
  void (*release)(void *user, CUdeviceptr addr, size_t nbytes);
  void *user;
} nbi_cuda_alloc_source;
/* An allocator over src; name ("cuda:0") is quoted by its OOM message. NULL
 * when out of host memory (nothing recorded). */
nbi_cuda_alloc *nbi_cuda_alloc_create_with(const nbi_cuda_alloc_source *src, const char *name);

/* ---- NVRTC and the kernel caches (cuda_nvrtc.c) --------------------------------------------
 * A kernel is identified by its full source text, the options, the NVRTC
 * version and the target arch: the cache key is a hash of those (never of the
 * output). Compiled images are cached in memory (per process) and on disk,
 * one file per kernel under $NABLA_CACHE_DIR, else $XDG_CACHE_HOME/nabla/kernels,
 * else ~/.cache/nabla/kernels, written to a temporary file and renamed into
 * place; an unwritable folder disables the disk cache with one warning on
 * stderr. */
typedef struct nbi_cuda_image {
  void *data; /* CUBIN (SASS) or PTX text */
  size_t size;
  bool ptx;
} nbi_cuda_image;
/* Compiles src for arch (e.g. 90: compute capability 9.0) with NVRTC: SASS
 * when NVRTC knows the arch, else PTX for the newest arch it knows. Compile
 * errors: NB_ERR_DEVICE with NVRTC's log in the message, never a crash.
 * Needs only NVRTC (no GPU). img->data is malloc'd. */
nb_status nbi_cuda_compile(const char *src, int arch, nbi_cuda_image *img);
/* The cache key of (src, arch) with the options nbi_cuda_compile uses, as 32
 * hex digits + NUL. */
void nbi_cuda_cache_key(const char *src, int arch, char key[33]);
/* The disk cache folder in use ("" when disabled). */
const char *nbi_cuda_cache_dir(void);
/* The image of (src, arch): memory cache, then disk cache, then NVRTC (what,
 * e.g. the kernel's name, is quoted by a compile error). *img stays owned by
 * the cache. Needs only NVRTC. */
nb_status nbi_cuda_image_get(const char *src, int arch, const char *what,
                             const nbi_cuda_image **img);
/* Function `name` of the module compiled from src on device c: memory cache,
 * then disk cache, then NVRTC. src is hashed once per call; a function
 * already loaded on c costs that hash and one table lookup. */
nb_status nbi_cuda_function(nbi_cuda_ctx *c, const char *src, const char *name, CUfunction *fn);
/* Launches f on c's stream; args as cuLaunchKernel's kernelParams. A zero grid
 * launches nothing; smem above 48 KiB is opted in (up to c->smem_optin). */
nb_status nbi_cuda_launch(nbi_cuda_ctx *c, CUfunction f, unsigned grid_x, unsigned grid_y,
                          unsigned block_x, unsigned smem, void **args);
/* Compiles the sources srcs[0..n-1] (NULL entries skipped) for c's GPU whose
 * images neither memory nor disk holds, on up to 16 threads at once (no more
 * than the CPUs), and keeps the images as a launch's compile would, so their
 * launches only load them. Failures are dropped: the launch compiles again and
 * reports. */
void nbi_cuda_precompile(nbi_cuda_ctx *c, char *const *srcs, int n);
/* Counters for tests and benches. */
typedef struct nbi_cuda_cache_stats {
  uint64_t compiles, memory_hits, disk_hits, disk_writes;
  uint64_t precompiles; /* of compiles: by nbi_cuda_precompile, before a plan ran */
  double compile_s;     /* wall seconds inside NVRTC, summed over compiling threads */
} nbi_cuda_cache_stats;
nbi_cuda_cache_stats nbi_cuda_cache_get_stats(void);
/* Test hook: forgets the in-memory images (functions already loaded on
 * devices stay) and zeroes the counters, as a new process would start. */
void nbi_cuda_cache_reset(void);

/* The common device-side preamble of every generated and hand-written kernel
 * (cuda_preamble.c). Kernel sources are "extern \"C\" __global__" functions
 * compiled as CUDA C++ by NVRTC without any system header, so the preamble
 * defines everything they use:
 *   int8_t .. uint64_t;  NB_INF, NB_NAN;
 *   float nb_f16_to_f32(unsigned short), unsigned short nb_f32_to_f16(float),
 *   float nb_bf16_to_f32(unsigned short), unsigned short nb_f32_to_bf16(float)
 *     (round to nearest even, as src/core/dtype.c; NaN stays NaN);
 *   int32_t nb_sat_i32(double), int64_t nb_sat_i64(double) (truncation toward
 *     zero, saturating, NaN -> 0, as the CPU's casts);
 *   the formula list's names (../ew_formulas.h): wrap_add / wrap_sub /
 *     wrap_mul, int_pow, int_mod, floor_mod / floor_modf, vm_<f>f (float) and
 *     dm_<f> (double) for exp expm1 log log1p tanh sigmoid silu gelu softplus
 *     erf; FN / VM / T are defined by each rendered kernel per domain;
 *   warp and block reductions (shuffles, then shared memory) for sum, max, min
 *     over float, double and int64.
 * It works both under NVRTC and, through test/cuda_host_shim.h, compiled by
 * the host's C++ compiler for the host-side tests. */
extern const char nbi_cuda_preamble[];

/* ---- the generator (cuda_render.c) ---------------------------------------------------------
 * Renders group g (an elementwise group, a row group, or a single op treated
 * as a one-member group) as CUDA C: returns malloc'd source (NULL + error on
 * failure) and writes the kernel's name; launch writes how to launch it for
 * g's sizes. The source depends only on g's structure and operand layout
 * classes, never on addresses. */
#define NBI_CUDA_PARAM_WORDS 512 /* 4 KiB: the classic kernel parameter limit */
typedef struct nbi_cuda_launch_cfg {
  unsigned grid, block, smem;
  /* Row groups with global members: a second kernel, `<name>_g`, of grid2 blocks of
   * block2 threads, launched after the first (0: none). */
  unsigned grid2, block2;
  /* The one kernel parameter of both kernels: a struct of n_words 8-byte words
   * (pointers, int64 and double), passed as kernelParams = {words}. */
  unsigned n_words;
  uint64_t words[NBI_CUDA_PARAM_WORDS];
} nbi_cuda_launch_cfg;
/* render_group sizes grids for 132 multiprocessors (an H100; run_group for its own
 * device). Zero-size work needs no launch: grid (and grid2) are then 0. */
char *nbi_cuda_render_group(const nbi_group *g, const nbi_view *out, const nbi_view *in,
                            char name[64], nbi_cuda_launch_cfg *launch);
/* c may be NULL: the structural answer alone (no device limits). */
bool nbi_cuda_group_ok(const nbi_cuda_ctx *c, const nbi_group *g);
/* Renders (once per g->key, layout classes and device: a small thread-safe table
 * keeps the CUfunctions), then launches on c's stream. g->key must identify g's
 * structure (a zero key is never cached: rendered every call). */
nb_status nbi_cuda_run_group(nbi_cuda_ctx *c, const nbi_group *g, nbi_view *out,
                             const nbi_view *in);

/* For a plan's prepare: the source of g's kernel (its views as the run will
 * see them, or as predicted) when the function table lacks it, else NULL
 * (also when it cannot be rendered: the launch reports that). Malloc'd. */
char *nbi_cuda_group_source(nbi_cuda_ctx *c, const nbi_group *g, const nbi_view *out,
                            const nbi_view *in);
/* Before a plan's first run (backend.h's prepare): the kernels of its groups
 * and of its single ops (generated ones, and the modules of the hand-written
 * ones) that are missing, compiled by nbi_cuda_precompile. Best effort:
 * nothing is reported (the launch compiles what is still missing and reports
 * that). */
void nbi_cuda_prepare(nbi_cuda_ctx *c, const nbi_prepare_list *l);

/* ---- cuBLASLt (cuda_gemm.c) --------------------------------------------------------------- */
/* The MATMUL op (batched, broadcasting batch dims, any operand strides that
 * cuBLASLt can express, else operands are first copied contiguous). */
nb_status nbi_cuda_matmul(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* A GEMM epilogue group (kind NBI_GROUP_GEMM) as one cuBLASLt call with the
 * BIAS / RELU_BIAS / GELU_BIAS epilogue; gemm_ok says which it can take. */
bool nbi_cuda_gemm_ok(const nbi_cuda_ctx *c, const nbi_group *g);
nb_status nbi_cuda_gemm_group(nbi_cuda_ctx *c, const nbi_group *g, nbi_view *out,
                              const nbi_view *in);
/* C[b] = A[b] @ B[b] (row-major, strided batches; batch stride 0 broadcasts), for
 * kernels that need a product (conv2d through im2col): dt f32 / f64 / f16 / bf16
 * (f32 accumulate). */
nb_status nbi_cuda_gemm(nbi_cuda_ctx *c, nb_dtype dt, bool trans_a, bool trans_b, int64_t m,
                        int64_t n, int64_t k, const void *a, int64_t lda, int64_t stride_a,
                        const void *b, int64_t ldb, int64_t stride_b, void *cc, int64_t ldc,
                        int64_t stride_c, int64_t batch);
/* Counters of cuda_gemm.c's heuristic cache (all devices), for tests and benches:
 * cublasLtMatmulAlgoGetHeuristic queries made, and products served from the cache. */
typedef struct nbi_cuda_gemm_stats {
  uint64_t queries, hits;
} nbi_cuda_gemm_stats;
nbi_cuda_gemm_stats nbi_cuda_gemm_get_stats(void);
/* cuda_gemm_kernels.c, cuda_gemm.c's own kernels (errors recorded):
 * C[bi] (m x n, rows contiguous, c[bi*sc + i*n + j]) = A[bi] @ B[bi] for bi < batch,
 * element (i, p) of A[bi] at a[bi*sa + i*sar + p*sac] and (p, j) of B[bi] at
 * b[bi*sb + p*sbr + j*sbc] (elements): int64 operands and result (wrapping sums),
 * or with is_bool uint8 ones (or of ands). */
nb_status nbi_cuda_int_gemm(nbi_cuda_ctx *c, bool is_bool, int64_t m, int64_t n, int64_t k,
                            int64_t batch, const void *a, int64_t sa, int64_t sar, int64_t sac,
                            const void *b, int64_t sb, int64_t sbr, int64_t sbc, void *cc,
                            int64_t sc);
/* Whether op is an activation of GEMM epilogue groups (relu, gelu, tanh, sigmoid,
 * silu). */
bool nbi_cuda_gemm_epi_act(int op);
/* The pass after a GEMM epilogue group's product, over n contiguous elements of
 * dtype dt (f32, f64, f16, bf16) in rows of cols: s = src[i] (+ bias[i % cols]
 * when bias is given), sum[i] = s when sum is given, act[i] = act_op(s) when act is
 * given (act_op as ../ew_formulas.h computes it). sum or act may be src. */
nb_status nbi_cuda_gemm_epi_pass(nbi_cuda_ctx *c, nb_dtype dt, int act_op, const void *src,
                                 const void *bias, void *sum, void *act, int64_t n, int64_t cols);

/* ---- copies (cuda_copy.c) ---------------------------------------------------------------- */
/* Strided copy with dtype conversion (as nbi_copy_view) and fill (views on c). */
nb_status nbi_cuda_copy(nbi_cuda_ctx *c, nbi_view *dst, const nbi_view *src);
nb_status nbi_cuda_fill(nbi_cuda_ctx *c, nbi_view *dst, double value);
/* The CUDA C of the module copying src to dst (src == dst: moving raw
 * elements of that size) or, with fill, filling dst; malloc'd (NULL when out
 * of memory). For tests: every module compiles without a GPU. */
char *nbi_cuda_copy_source(bool fill, nb_dtype src, nb_dtype dst);

/* ---- the op table (cuda_ops.c, cuda_ops_index.c, cuda_ops_nn.c) ------------------------------
 * supports: whether op has a CUDA path for a result of dtype dt (every op and
 * dtype the CPU kernels cover; none for the ops core runs itself: constants,
 * placeholders, tuple gets, control flow, calls, sharding and collectives).
 * run_op: node n from the table, with backend.h's run_op contract (in[k] any
 * strides on this device, out a fresh contiguous buffer of n's shape and dtype);
 * kernels are queued on c's stream, index errors surface at the next sync. */
bool nbi_cuda_supports(void *ctx, int op, nb_dtype dt);
nb_status nbi_cuda_run_op(void *ctx, const nb_tensor *n, nbi_view *out, const nbi_view *in);

/* The hand-written kernels' plumbing, shared by the cuda_ops*.c files. A module
 * is one CUDA C source (compiled after nbi_cuda_preamble) holding several
 * kernels; each kernel's CUfunction is looked up once per device and kept. */
#define NBI_CUDA_MODULE_KERNELS 32
typedef struct nbi_cuda_module {
  const char *body;         /* the source after the preamble */
  const char *const *names; /* kernel names, n_names of them */
  int n_names;
  char *source; /* preamble + body, built on first use */
  /* CUfunctions by device ordinal and kernel, filled on first use */
  CUfunction fn[NBI_MAX_DEVICES][NBI_CUDA_MODULE_KERNELS];
} nbi_cuda_module;
/* Kernel k of m on device c (compiled on first use); NB_ERR_DEVICE (NVRTC's
 * log) or NB_ERR_OOM recorded on failure. */
nb_status nbi_cuda_module_fn(nbi_cuda_ctx *c, nbi_cuda_module *m, int k, CUfunction *fn);
/* The modules the hand-written kernels of op use (for prepare): m[0..return). */
int nbi_cuda_index_modules(int op, nbi_cuda_module **m);
int nbi_cuda_nn_modules(int op, nbi_cuda_module **m);
int nbi_cuda_random_modules(int op, nbi_cuda_module **m);
/* Launches f over n work items with 256-thread blocks (nothing when n <= 0: no
 * empty grid): kernels loop grid-stride over int64 indices, so any n fits the
 * capped grid. */
nb_status nbi_cuda_launch_n(nbi_cuda_ctx *c, CUfunction f, int64_t n, void **args);
/* Device scratch of nbytes (>= 1) from c's allocator: 0 with NB_ERR_OOM
 * recorded on failure. Freed with nbi_cuda_free_block (stream-ordered, so at
 * once after the kernels that use it are queued). */
CUdeviceptr nbi_cuda_scratch(nbi_cuda_ctx *c, size_t nbytes);
/* v's elements as a contiguous array of dtype dt: v's own memory when it
 * already is one, else a scratch copy (converted by nbi_cuda_copy) written to
 * *owned for the caller to free (0 when none). NULL on failure (recorded). */
char *nbi_cuda_contig(nbi_cuda_ctx *c, const nbi_view *v, nb_dtype dt, CUdeviceptr *owned);
/* Number of elements of a view. */
int64_t nbi_cuda_view_numel(const nbi_view *v);

/* Index family (cuda_ops_index.c): take, take_along_axis, scatter_add,
 * scatter_add_along_axis, one_hot, with the CPU kernels' semantics
 * (k_index.c); indices out of range write NBI_CUDA_KERR_INDEX to err_word. */
nb_status nbi_cuda_take(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in);
nb_status nbi_cuda_take_along_axis(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                   const nbi_view *in);
nb_status nbi_cuda_scatter_add(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                               const nbi_view *in);
nb_status nbi_cuda_scatter_add_along_axis(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                          const nbi_view *in);
nb_status nbi_cuda_one_hot(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* RANDOM (cuda_random.c): the CPU kernel's Threefry numbers, bit for bit. */
nb_status nbi_cuda_random(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in);

/* NN family (cuda_ops_nn.c), NCHW, with k_nn.c's semantics: convolution by
 * im2col / col2im + nbi_cuda_gemm, max pooling and its derivative ops. */
nb_status nbi_cuda_conv2d(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in);
nb_status nbi_cuda_conv2d_bwd_data(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                   const nbi_view *in);
nb_status nbi_cuda_conv2d_bwd_filter(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                     const nbi_view *in);
nb_status nbi_cuda_max_pool2d(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                              const nbi_view *in);
nb_status nbi_cuda_max_pool2d_bwd(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                  const nbi_view *in);
nb_status nbi_cuda_max_pool2d_select(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                     const nbi_view *in);

#endif
