/* test/cuda_host_shim.h — runs the CUDA generator's kernels on the host, for the
 * tests (test/test_cuda_render.c), where no GPU is.
 *
 * A rendered source (src/backends/cuda/cuda_render.c: the preamble, then kernels) is
 * compiled by the host's C++ compiler after this header, into a shared object the test
 * loads. It gives the small CUDA surface the preamble and the kernels use:
 *  - __global__ / __device__ / __forceinline__ / __launch_bounds__ vanish;
 *  - __shared__ is `static`: one object for the whole block (blocks run one after
 *    another);
 *  - threadIdx / blockIdx / blockDim / gridDim are thread-locals: the threads of a
 *    block are real threads, __syncthreads a barrier across them. A pool of threads is
 *    made at the first launch and kept (joined when the object is unloaded); a launch
 *    runs its grid's blocks one after another on the first blockDim of them;
 *  - warp shuffles go through one slot per lane and a barrier across the warp's 32
 *    threads (before and after the exchange), so every lane of a warp must reach each
 *    shuffle, as CUDA's full-mask shuffles require;
 *  - bit casts, __clz, __clzll, __umulhi.
 * Device-only paths of the preamble (inline PTX) sit behind __CUDA_ARCH__, which the
 * host leaves undefined. nb_shim_run(grid, block, body, arg) runs body(arg) as a
 * launch of grid blocks of block threads (block a multiple of 32, at most 1024) and
 * returns 0, or -1 when the threads could not be made. One launch at a time. C++17,
 * header-only: include it once per shared object. */
#ifndef NABLA_CUDA_HOST_SHIM_H
#define NABLA_CUDA_HOST_SHIM_H

#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <pthread.h>

#define NB_HOST_SHIM 1
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct uint3 {
  unsigned x, y, z;
};
static thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;

namespace nb_shim {
enum { WARP = 32, MAX_WARPS = 32, MAX_THREADS = WARP * MAX_WARPS };

/* The pool and the launch it runs; guarded by mu. */
struct pool {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t go = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
  pthread_t th[MAX_THREADS];
  unsigned made = 0;
  uint64_t generation = 0; /* bumped per launch (and at exit) */
  bool exiting = false;
  unsigned finished = 0; /* threads done with the current launch */
  /* the launch */
  unsigned grid = 0, block = 0;
  void (*body)(void *) = nullptr;
  void *arg = nullptr;
  pthread_barrier_t block_bar;
  pthread_barrier_t warp_bar[MAX_WARPS];
  uint64_t slot[MAX_WARPS][WARP];
};
static pool P;

static void *worker(void *p) {
  unsigned t = (unsigned)(uintptr_t)p;
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&P.mu);
    while (P.generation == seen)
      pthread_cond_wait(&P.go, &P.mu);
    seen = P.generation;
    bool exiting = P.exiting, part = t < P.block;
    pthread_mutex_unlock(&P.mu);
    if (exiting) return nullptr;
    if (!part) continue;
    threadIdx = {t, 0, 0};
    blockDim = {P.block, 1, 1};
    gridDim = {P.grid, 1, 1};
    for (unsigned b = 0; b < P.grid; b++) {
      blockIdx = {b, 0, 0};
      P.body(P.arg);
      pthread_barrier_wait(&P.block_bar); /* the next block reuses __shared__ */
    }
    pthread_mutex_lock(&P.mu);
    if (++P.finished == P.block) pthread_cond_signal(&P.done);
    pthread_mutex_unlock(&P.mu);
  }
}

/* Joins the pool when the object is unloaded (its threads run the object's code). */
__attribute__((destructor)) static void stop() {
  pthread_mutex_lock(&P.mu);
  P.exiting = true;
  P.generation++;
  pthread_cond_broadcast(&P.go);
  pthread_mutex_unlock(&P.mu);
  for (unsigned t = 0; t < P.made; t++)
    pthread_join(P.th[t], nullptr);
}

/* Exchanges v across the calling thread's warp: returns lane src's value. */
template <typename T> static T exchange(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
  unsigned w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  P.slot[w][lane] = bits;
  pthread_barrier_wait(&P.warp_bar[w]);
  bits = P.slot[w][(unsigned)src % WARP];
  pthread_barrier_wait(&P.warp_bar[w]);
  T r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}
} // namespace nb_shim

extern "C" int nb_shim_run(unsigned grid, unsigned block, void (*body)(void *), void *arg) {
  using namespace nb_shim;
  if (block == 0 || block % WARP || block > MAX_THREADS) return -1;
  if (grid == 0) return 0;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  while (P.made < block) {
    if (pthread_create(&P.th[P.made], &attr, worker, (void *)(uintptr_t)P.made)) break;
    P.made++;
  }
  pthread_attr_destroy(&attr);
  if (P.made < block) return -1;
  pthread_barrier_init(&P.block_bar, nullptr, block);
  for (unsigned w = 0; w < block / WARP; w++)
    pthread_barrier_init(&P.warp_bar[w], nullptr, WARP);
  pthread_mutex_lock(&P.mu);
  P.grid = grid;
  P.block = block;
  P.body = body;
  P.arg = arg;
  P.finished = 0;
  P.generation++;
  pthread_cond_broadcast(&P.go);
  while (P.finished < block)
    pthread_cond_wait(&P.done, &P.mu);
  pthread_mutex_unlock(&P.mu);
  pthread_barrier_destroy(&P.block_bar);
  for (unsigned w = 0; w < block / WARP; w++)
    pthread_barrier_destroy(&P.warp_bar[w]);
  return 0;
}

static inline void __syncthreads() { pthread_barrier_wait(&nb_shim::P.block_bar); }
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int mask) {
  return nb_shim::exchange(v, (int)(threadIdx.x % nb_shim::WARP) ^ mask);
}
template <typename T> static inline T __shfl_up_sync(unsigned, T v, int delta) {
  int lane = (int)(threadIdx.x % nb_shim::WARP);
  return nb_shim::exchange(v, lane >= delta ? lane - delta : lane);
}
template <typename T> static inline T __shfl_sync(unsigned, T v, int src) {
  return nb_shim::exchange(v, src);
}

static inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
static inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}

#endif
