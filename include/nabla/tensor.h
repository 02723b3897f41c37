/* nabla/tensor.h — tensors, dtypes, shapes, errors, scopes, realization, stats.
 *
 * Threading: a tensor belongs to the thread that made it. Errors, scopes, the
 * pending graph, the plan cache and the random generator are thread-local, so
 * threads working on their own tensors never interfere. Another thread's
 * realized tensor may be read (as a constant); a pending one is an NB_ERR_ARG
 * error until its thread realizes it. An nb_fn (jitted or not) may be called
 * from several threads at once. A thread's exit releases what its scopes (root
 * included) still hold. Each kernel runs on nb_get_num_threads() OpenMP threads.
 */
#ifndef NABLA_TENSOR_H
#define NABLA_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NB_VERSION_MAJOR 0
#define NB_VERSION_MINOR 1
#define NB_VERSION_PATCH 0

/* ---- status codes: one list, one strerror (libuv style) ------------------ */
#define NB_STATUS_MAP(X)                                                                           \
  X(OK, "ok")                                                                                      \
  X(ERR_NULL, "NULL argument")                                                                     \
  X(ERR_SHAPE, "shape mismatch")                                                                   \
  X(ERR_DTYPE, "unsupported dtype")                                                                \
  X(ERR_AXIS, "axis out of range")                                                                 \
  X(ERR_ARG, "invalid argument")                                                                   \
  X(ERR_INDEX, "index out of range")                                                               \
  X(ERR_OOM, "out of memory")                                                                      \
  X(ERR_OVERFLOW, "size overflow")                                                                 \
  X(ERR_DEVICE, "device unavailable")                                                              \
  X(ERR_SCOPE, "scope misuse")                                                                     \
  X(ERR_STATE, "invalid state")                                                                    \
  X(ERR_SHARDING, "invalid sharding")                                                              \
  X(ERR_DISTRIBUTED, "distributed job failure")                                                    \
  X(ERR_INTERNAL, "internal error")                                                                \
  X(ERR_IO, "I/O error")

typedef enum nb_status {
#define NB_STATUS_ENUM_(name, msg) NB_##name,
  NB_STATUS_MAP(NB_STATUS_ENUM_)
#undef NB_STATUS_ENUM_
      NB_STATUS_COUNT
} nb_status;

/* Short fixed description of a status code ("shape mismatch"). Never NULL. */
const char *nb_status_str(nb_status s);
/* Status of the first error since the last nb_clear_error() on this thread. */
nb_status nb_last_status(void);
/* Message of that error, naming the function and the offending values, e.g.
 * "nb_matmul: inner dimensions differ: [2,3] @ [4,5]". "" when no error. */
const char *nb_last_error(void);
void nb_clear_error(void);
/* Records status s with a printf-style message as the thread's error (read
 * back by nb_last_status / nb_last_error) unless an error is already
 * recorded (the first error is kept); returns s. NB_OK records nothing.
 * Meant for callbacks (custom op kernels and rules, nb_fn bodies):
 *   return nb_set_error(NB_ERR_ARG, "my_log: element %lld is %g (needs > 0)", i, v); */
nb_status nb_set_error(nb_status s, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- dtypes ---------------------------------------------------------------- */
typedef enum nb_dtype {
  NB_F32 = 0, /* the default */
  NB_F64,
  NB_F16,
  NB_BF16,
  NB_I32,
  NB_I64,
  NB_BOOL,
  NB_U8, /* unsigned and narrow signed integers (safetensors U8, I8, I16) */
  NB_I8,
  NB_I16,
  NB_DTYPE_COUNT
} nb_dtype;

const char *nb_dtype_name(nb_dtype dt); /* "f32"...; "?" if out of range */
size_t nb_dtype_size(nb_dtype dt);      /* bytes per element; 0 if out of range */
bool nb_dtype_is_float(nb_dtype dt);
/* Result dtype of a binary op on a and b, PyTorch's rules: bool < integers <
 * floats; two integers give the narrowest one holding both ranges (u8 with
 * i8 gives i16, u8 with i16 gives i16, i8 with i32 gives i32); an integer
 * with a float gives the float; f16 with bf16 gives f32. Integer arithmetic
 * wraps in the result dtype (two's complement), as in C and PyTorch. */
nb_dtype nb_promote_types(nb_dtype a, nb_dtype b);

/* ---- shapes and axes ------------------------------------------------------- */
#define NB_MAX_DIMS 8
typedef struct nb_shape {
  int ndim;
  int64_t dims[NB_MAX_DIMS];
} nb_shape;
typedef struct nb_axes {
  int n; /* -1 means all axes (NB_ALL) */
  int v[NB_MAX_DIMS];
} nb_axes;

/* NB_SHAPE(2, 3) and NB_AXES(0, -1) are compound literals (C only). A 0-d shape
 * is NB_SCALAR_SHAPE; NB_ALL selects every axis; NB_NO_AXES selects none. */
#define NB_SHAPE(...)                                                                              \
  ((nb_shape){.ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),                   \
              .dims = {__VA_ARGS__}})
#define NB_AXES(...)                                                                               \
  ((nb_axes){.n = (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), .v = {__VA_ARGS__}})
#define NB_SCALAR_SHAPE ((nb_shape){.ndim = 0})
#define NB_ALL ((nb_axes){.n = -1})
#define NB_NO_AXES ((nb_axes){.n = 0})

/* ---- devices ----------------------------------------------------------------
 * Every tensor lives on one device. NB_CPU is always there; NB_CUDA(i) exists in a
 * build with CUDA=1 on a machine with a GPU (the CUDA libraries are opened at
 * run time); NB_EMU(i) (i < 4) is an emulated device for tests: memory the core
 * cannot read directly, CPU kernels behind the backend interface, so every
 * access that bypasses the device seam crashes instead of silently working.
 * Leaves are made on the calling thread's default device; an op's result lives
 * on its inputs' device, and inputs on different devices are an eager
 * NB_ERR_DEVICE naming the op and both devices. */
typedef enum nb_device_kind {
  NB_DEVICE_CPU = 0,
  NB_DEVICE_CUDA = 1,
  NB_DEVICE_EMU = 2
} nb_device_kind;
typedef struct nb_device {
  nb_device_kind kind;
  int index;
} nb_device;
#define NB_CPU ((nb_device){NB_DEVICE_CPU, 0})
#define NB_CUDA(i) ((nb_device){NB_DEVICE_CUDA, (i)})
#define NB_EMU(i) ((nb_device){NB_DEVICE_EMU, (i)})
/* Devices of a kind this process can use: 1 for the CPU, 0 for CUDA without a
 * GPU or without a CUDA build, 4 for NB_EMU. */
int nb_device_count(nb_device_kind k);
/* The calling thread's default device for new leaves (nb_zeros, nb_from_data,
 * nb_rand, ...). A device that is not available fails with NB_ERR_DEVICE and
 * leaves the default unchanged. */
nb_status nb_set_default_device(nb_device d);
nb_device nb_default_device(void);
/* "cpu:0", "cuda:1", "emu:0" (static storage). */
const char *nb_device_str(nb_device d);

/* Matrix products in f32: HIGHEST computes in f32 (the default); HIGH allows
 * reduced-precision inputs where the device has them (TF32 on CUDA tensor cores:
 * about 1e-3 relative). Process-wide. */
typedef enum nb_precision { NB_PRECISION_HIGHEST = 0, NB_PRECISION_HIGH = 1 } nb_precision;
void nb_set_matmul_precision(nb_precision p);

/* Threads each CPU kernel uses (one process-wide count, like PyTorch's
 * set_num_threads): n >= 1, or 0 for the default (OMP_NUM_THREADS, else the
 * cores). Every thread's next realization applies it. It is the most a thread
 * uses: a thread that finds itself descheduled for over a fifth of its
 * realizations' time (other busy processes, or more application threads than
 * cores) runs its kernels on one thread for 0.25-4 s, then tries the count
 * again (nb_stats.thread_reductions counts these; env NABLA_THREAD_GUARD=0
 * turns the guard off). NB_ERR_ARG for n < 0. */
nb_status nb_set_num_threads(int n);
int nb_get_num_threads(void);
nb_precision nb_get_matmul_precision(void);

/* ---- tensors and scopes ------------------------------------------------------ */
typedef struct nb_tensor nb_tensor;

/* Every function returning a new nb_tensor* registers it in the innermost open
 * scope of the calling thread. nb_scope_end releases everything registered since
 * the matching nb_scope_begin, except tensors passed to nb_keep (moved to the
 * enclosing scope). A root scope always exists and is emptied at process exit.
 * nb_retain adds a reference that outlives scopes; nb_release drops one you own.
 * Out of memory: a scope nb_scope_begin could not open still counts (NB_ERR_OOM is
 * recorded; its tensors are released with the enclosing scope), so begin and end
 * stay balanced; nb_keep returns NULL with NB_ERR_OOM and t stays in its scope. */
void nb_scope_begin(void);
nb_status nb_scope_end(void); /* NB_ERR_SCOPE if no scope is open */
nb_tensor *nb_keep(nb_tensor *t);
nb_tensor *nb_retain(nb_tensor *t);
void nb_release(nb_tensor *t);

/* ---- creation ---------------------------------------------------------------- */
nb_tensor *nb_zeros(nb_shape s, nb_dtype dt);
nb_tensor *nb_ones(nb_shape s, nb_dtype dt);
nb_tensor *nb_full(nb_shape s, double value, nb_dtype dt);
nb_tensor *nb_scalar(double value, nb_dtype dt); /* 0-d tensor */
/* [start, stop) by step, NumPy rules: ceil((stop - start) / step) elements. */
nb_tensor *nb_arange(double start, double stop, double step, nb_dtype dt);
/* Copies numel(s) elements of dt, row-major, from src. */
nb_tensor *nb_from_data(const void *src, nb_shape s, nb_dtype dt);
/* Random tensors from the thread's generator: deterministic given nb_seed. */
void nb_seed(uint64_t seed);
nb_tensor *nb_rand(nb_shape s, nb_dtype dt);  /* U[0,1), float dtypes */
nb_tensor *nb_randn(nb_shape s, nb_dtype dt); /* N(0,1), float dtypes */
/* U(-a, a), a = sqrt(6 / (fan_in + fan_out)); fan_in = dims[ndim-2] * receptive,
 * fan_out = dims[ndim-1] * receptive (as Keras/JAX for a [in, out] weight). */
nb_tensor *nb_glorot_uniform(nb_shape s, nb_dtype dt);

/* ---- queries ------------------------------------------------------------------ */
nb_shape nb_shape_of(const nb_tensor *t); /* ndim -1 if t is NULL */
int nb_ndim(const nb_tensor *t);          /* -1 if t is NULL */
int64_t nb_numel(const nb_tensor *t);     /* -1 if t is NULL */
nb_dtype nb_dtype_of(const nb_tensor *t); /* NB_DTYPE_COUNT if t is NULL */
bool nb_is_realized(const nb_tensor *t);  /* data computed and held */
/* The device t lives on (NB_CPU if t is NULL; a sharded tensor's first device). */
nb_device nb_device_of(const nb_tensor *t);
/* t on device d: a new tensor (t itself when it is already there), recorded like
 * an op (lazy) and differentiable: its VJP moves the cotangent back to t's
 * device, its JVP moves the tangent. NB_ERR_DEVICE when d is not available. */
nb_tensor *nb_to_device(nb_tensor *t, nb_device d);
/* Writes "[2,3]" into buf (always NUL-terminated); returns buf. */
char *nb_shape_str(nb_shape s, char *buf, size_t cap);

/* ---- realization ---------------------------------------------------------------- */
/* Realizes all of ts as one planned graph. */
nb_status nb_eval(nb_tensor *const *ts, int n);
/* Realizes t and copies its elements, row-major, as t's dtype into dst; nbytes
 * must equal numel * dtype size. A tensor on a mesh spanning the processes of
 * a job (nb_mesh_world) is gathered on every rank: each rank must call it (so
 * for nb_item and nb_print too). */
nb_status nb_to_host(nb_tensor *t, void *dst, size_t nbytes);
/* Value of a one-element tensor as double; NaN and an error otherwise. */
double nb_item(nb_tensor *t);
/* Realizes and prints t (NumPy-like layout, summarized when large). In a job
 * of several processes only rank 0 prints, unless NABLA_PRINT_ALL_RANKS=1. */
void nb_print(nb_tensor *t);
void nb_fprint(FILE *f, nb_tensor *t);
/* Writes the pending graph of ts, as nb_eval(ts, n) would plan it, to f as
 * Graphviz DOT (`dot -Tsvg g.dot > g.svg`): one node per step (op, dtype,
 * shape), realized inputs as ellipses, fused kernels as clusters (a dashed
 * member lives in the kernel's tiles only), steps the simplifier drops
 * (aliases of an equal value, dead code) grey and dotted. Realizes nothing,
 * changes nothing. NB_ERR_NULL for a NULL f, ts or tensor; NB_ERR_ARG for
 * n < 0 or when f cannot be written. */
nb_status nb_graph_dot(FILE *f, nb_tensor *const *ts, int n);

/* ---- statistics ------------------------------------------------------------------- */
typedef struct nb_stats {
  uint64_t plan_cache_hits, plan_cache_misses; /* realization plans */
  uint64_t kernels_run;
  uint64_t n_all_reduce, n_all_gather, n_reduce_scatter, n_all_to_all, n_permute;
  uint64_t collective_bytes;
  uint64_t live_bytes, peak_bytes; /* bytes of tensor buffers held, all devices */
  uint64_t live_tensors;           /* tensor handles alive */
  uint64_t realizations;           /* graphs realized (nb_eval, reads, backward, assign) */
  uint64_t plan_ns;                /* realizing: collecting, hashing, planning (ns) */
  uint64_t exec_ns;                /* realizing: running kernels, freeing buffers (ns) */
  uint64_t jit_cache_hits;         /* nb_jit calls that reused a traced program */
  uint64_t jit_cache_misses;       /* nb_jit calls that traced (first call per signature) */
  /* Buffer cache (env NABLA_CACHE_BYTES caps it, default 1 GiB, 0 disables): a
   * released buffer is kept for the next request of its size class. */
  uint64_t buffer_allocs;     /* buffer requests (node outputs, data leaves, ...) */
  uint64_t buffer_cache_hits; /* requests served from the cache, no system allocation */
  uint64_t cached_bytes;      /* bytes in free cached blocks (not part of live_bytes; each
                                 thread's own few small released blocks not counted) */
  /* Times a thread's kernels dropped to one OpenMP thread because the machine
   * was oversubscribed (see nb_set_num_threads). */
  uint64_t thread_reductions;
} nb_stats;
nb_stats nb_get_stats(void);
void nb_reset_stats(void); /* zeroes counters; peak = live */

#ifdef __cplusplus
}
#endif
#endif
