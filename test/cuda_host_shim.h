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
 *    block are real threads (one per thread of the block, made once per launch, every
 *    block run by the same threads), __syncthreads a barrier across them;
 *  - warp shuffles go through one slot per lane and a barrier across the warp's 32
 *    threads (before and after the exchange), so every lane of a warp must reach each
 *    shuffle, as CUDA's full-mask shuffles require;
 *  - bit casts, __clz, __clzll, __umulhi.
 * Device-only paths of the preamble (inline PTX) sit behind __CUDA_ARCH__, which the
 * host leaves undefined. nb_shim_run(grid, block, body, arg) runs body(arg) as a
 * launch of grid blocks of block threads (block a multiple of 32, at most 1024);
 * it returns 0, or -1 when the threads could not be made. C++17, header-only: include
 * it once per shared object. */
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
enum { WARP = 32, MAX_WARPS = 32 };
struct launch {
  unsigned grid, block;
  void (*body)(void *);
  void *arg;
  pthread_barrier_t block_bar;
  pthread_barrier_t warp_bar[MAX_WARPS];
  uint64_t slot[MAX_WARPS][WARP];
  pthread_mutex_t mu; /* the start gate: threads run once every one is made */
  pthread_cond_t cv;
  bool open;
};
static launch *current; /* the launch running (one at a time) */
struct thread_arg {
  launch *l;
  unsigned t;
};

static void *thread_main(void *p) {
  thread_arg *a = (thread_arg *)p;
  pthread_mutex_lock(&a->l->mu);
  while (!a->l->open)
    pthread_cond_wait(&a->l->cv, &a->l->mu);
  pthread_mutex_unlock(&a->l->mu);
  threadIdx = {a->t, 0, 0};
  blockDim = {a->l->block, 1, 1};
  gridDim = {a->l->grid, 1, 1};
  for (unsigned b = 0; b < a->l->grid; b++) {
    blockIdx = {b, 0, 0};
    a->l->body(a->l->arg);
    pthread_barrier_wait(&a->l->block_bar); /* the next block reuses __shared__ */
  }
  return nullptr;
}

/* Exchanges v across the calling thread's warp: returns lane src's value. */
template <typename T> static T exchange(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
  launch *l = current;
  unsigned w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  l->slot[w][lane] = bits;
  pthread_barrier_wait(&l->warp_bar[w]);
  bits = l->slot[w][(unsigned)src % WARP];
  pthread_barrier_wait(&l->warp_bar[w]);
  T r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}
} // namespace nb_shim

extern "C" int nb_shim_run(unsigned grid, unsigned block, void (*body)(void *), void *arg) {
  using namespace nb_shim;
  if (block == 0 || block % WARP || block / WARP > MAX_WARPS) return -1;
  static launch l;
  l.grid = grid;
  l.block = block;
  l.body = body;
  l.arg = arg;
  l.open = false;
  current = &l;
  pthread_mutex_init(&l.mu, nullptr);
  pthread_cond_init(&l.cv, nullptr);
  pthread_barrier_init(&l.block_bar, nullptr, block);
  for (unsigned w = 0; w < block / WARP; w++)
    pthread_barrier_init(&l.warp_bar[w], nullptr, WARP);
  static pthread_t th[WARP * MAX_WARPS];
  static thread_arg ta[WARP * MAX_WARPS];
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  unsigned made = 0;
  for (; made < block; made++) {
    ta[made] = {&l, made};
    if (pthread_create(&th[made], &attr, thread_main, &ta[made])) break;
  }
  int rc = made < block ? -1 : 0;
  pthread_mutex_lock(&l.mu);
  if (rc) l.grid = 0; /* a partial block cannot run: its barriers would never open */
  l.open = true;
  pthread_cond_broadcast(&l.cv);
  pthread_mutex_unlock(&l.mu);
  for (unsigned t = 0; t < made; t++)
    pthread_join(th[t], nullptr);
  pthread_attr_destroy(&attr);
  pthread_barrier_destroy(&l.block_bar);
  for (unsigned w = 0; w < block / WARP; w++)
    pthread_barrier_destroy(&l.warp_bar[w]);
  pthread_cond_destroy(&l.cv);
  pthread_mutex_destroy(&l.mu);
  current = nullptr;
  return rc;
}

static inline void __syncthreads() { pthread_barrier_wait(&nb_shim::current->block_bar); }
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
