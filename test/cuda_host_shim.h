/* test/cuda_host_shim.h — runs CUDA kernels on the host, where no GPU is: for the
 * generator's tests (test/test_cuda_render.c) and the fake CUDA stack
 * (test/fake_cuda/, which compiles every module nabla loads through this header).
 *
 * A kernel source (src/backends/cuda: the preamble, then kernels) is compiled by the
 * host's C++ compiler after this header, into a shared object. It gives the CUDA
 * surface the preamble and nabla's kernels use:
 *  - __global__ / __device__ / __host__ / __forceinline__ / __launch_bounds__ vanish,
 *    __align__(n) is alignas(n);
 *  - __shared__ is `static thread_local`: one object per block (a block runs on one
 *    host thread, blocks of a launch on several); `extern __shared__ T name[];`
 *    (dynamic shared memory) becomes NB_SHIM_DYN_SMEM(name, T) in the fake's
 *    rewrite (test/fake_cuda/fake_host.c): the launch's dynamic shared memory;
 *  - the threads of a block are fibers on one host thread, switched at barriers:
 *    __syncthreads (and _count / _and / _or) waits for every live thread of the
 *    block, __syncwarp and the warp primitives (shuffles, votes) for every live
 *    thread of the warp. A barrier no thread can pass (threads of a warp split
 *    between a warp and a block barrier) fails the launch instead of hanging;
 *  - threadIdx / blockIdx / blockDim / gridDim (3-D), warpSize;
 *  - atomics (add, sub, exch, min, max, and, or, xor, CAS) as host atomics;
 *  - bit casts, __clz, __clzll, __popc, __popcll, __ffs, __ffsll, __brev, __umulhi,
 *    __umul64hi, __mulhi, __mul64hi, min / max over mixed integer and float types.
 * Device-only paths of the preamble (inline PTX) sit behind __CUDA_ARCH__, which the
 * host leaves undefined.
 *
 * Running a launch: nb_shim_exec(L, W) runs blocks of launch L, taking block numbers
 * from L->next (shared by every host thread that runs the launch), on the calling
 * thread with the resources of worker W (fiber stacks, dynamic shared memory,
 * scheduler scratch) until none is left. nb_shim_run(grid, block, body, arg) is the
 * one-thread form of test_cuda_render.c: grid blocks of `block` (1 to 1024) threads,
 * each running body(arg). A kernel's trampoline, from NB_SHIM_KERNEL(name), runs one
 * thread of kernel `name` with cuLaunchKernel's kernelParams.
 *
 * C++17, header-only, x86-64 fibers switch with a few instructions (elsewhere, or
 * with NB_SHIM_UCONTEXT defined, through <ucontext.h>). Include it once per shared
 * object. With NB_SHIM_ABI_ONLY it is C: the launch interface alone (the fake's
 * driver includes it so). With NB_SHIM_SCAN it is only markers, for the fake's
 * preprocessor pass that finds kernel names and launch bounds. */
#ifndef NABLA_CUDA_HOST_SHIM_H
#define NABLA_CUDA_HOST_SHIM_H

/* ---- the launch interface (C), shared with test/fake_cuda ------------------------------- */
#include <stddef.h>

#define NB_SHIM_ABI 2                            /* nb_shim_abi() of a matching object */
#define NB_SHIM_MAX_THREADS 1024                 /* threads per block */
#define NB_SHIM_SCRATCH ((size_t)64 << 10)       /* bytes of a worker's scheduler scratch */
#define NB_SHIM_DYN_SMEM_MAX ((size_t)227 << 10) /* dynamic shared memory per block */

#ifdef __cplusplus
extern "C" {
#endif
/* What one host thread runs blocks with: NB_SHIM_MAX_THREADS fiber stacks of
 * stack_bytes (a multiple of 16, at least 64 KiB) from `stacks` upwards,
 * NB_SHIM_DYN_SMEM_MAX bytes of dynamic shared memory and NB_SHIM_SCRATCH bytes of
 * scratch, both 16-byte aligned. Owned by the caller; one launch at a time. */
typedef struct nb_shim_worker {
  char *stacks;
  size_t stack_bytes;
  void *smem;
  void *scratch;
} nb_shim_worker;

/* A launch: grid and block dims (each >= 1, at most NB_SHIM_MAX_THREADS threads per
 * block), body(arg) runs one thread; blocks are numbered x fastest and taken from
 * *next (atomically) until grid's count. err (err_bytes) receives why a launch
 * failed. */
typedef struct nb_shim_launch {
  unsigned grid[3], block[3];
  void (*body)(void *);
  void *arg;
  unsigned long long *next;
  char *err;
  size_t err_bytes;
} nb_shim_launch;

typedef int (*nb_shim_exec_fn)(const nb_shim_launch *L, nb_shim_worker *W);
typedef int (*nb_shim_abi_fn)(void);
#ifdef __cplusplus
}
#endif

#if defined(NB_SHIM_SCAN)
/* ---- the fake's scan: kernels and their launch bounds stay visible as markers ---- */
#define __global__ nb_shim_global_mark
#define __launch_bounds__(...) nb_shim_bounds_mark(__VA_ARGS__)
#define __device__
#define __host__
#define __forceinline__
#define __noinline__
#define __shared__
#define __constant__
#define __align__(n)
#define NB_SHIM_DYN_SMEM(name, ...)

#elif !defined(NB_SHIM_ABI_ONLY)
/* ---- the host's CUDA surface (C++) -------------------------------------------------- */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <math.h>
#include <pthread.h>
#include <sys/mman.h>
#include <type_traits>
#include <utility>
#if !defined(__x86_64__) || defined(NB_SHIM_UCONTEXT)
#define NB_SHIM_USE_UCONTEXT 1
#include <ucontext.h>
#endif

#define NB_HOST_SHIM 1
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __shared__ static thread_local
#define __constant__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct uint3 {
  unsigned x, y, z;
};
typedef uint3 dim3;
static thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;
static const int warpSize = 32;

namespace nb_shim {
enum { WARP = 32, MAX_WARPS = NB_SHIM_MAX_THREADS / WARP };
enum : unsigned { NEW, RUN, AT_BLOCK, AT_WARP, DONE };

/* One thread of the block: its saved stack pointer (or context), state, stack. */
struct fiber {
#ifdef NB_SHIM_USE_UCONTEXT
  ucontext_t *uc;
#else
  void *sp;
#endif
  unsigned state, stack;
};

/* The scheduler of the block running on this host thread (in the worker's scratch). */
struct sched {
  const nb_shim_launch *L;
  nb_shim_worker *W;
  unsigned n, cur, live, at_block;
  unsigned warp_live[MAX_WARPS], warp_at[MAX_WARPS];
  long long block_acc, block_result; /* __syncthreads_count / _and / _or: predicates */
  unsigned block_arrived;            /* threads that passed the last block barrier */
  unsigned free_stacks[NB_SHIM_MAX_THREADS], n_free;
  fiber f[NB_SHIM_MAX_THREADS];
  uint64_t slot[MAX_WARPS][WARP]; /* warp exchanges */
#ifdef NB_SHIM_USE_UCONTEXT
  ucontext_t self;
#else
  void *self;
#endif
};
static_assert(sizeof(sched) <= NB_SHIM_SCRATCH, "the scheduler fits a worker's scratch");
static thread_local sched *S;
} // namespace nb_shim

#ifndef NB_SHIM_USE_UCONTEXT
/* nb_shim_switch(save, to): saves the callee-saved registers on the current stack and
 * its pointer in *save, then resumes the context whose stack pointer is `to`.
 * nb_shim_start: where a new fiber's first switch returns to. */
extern "C" void nb_shim_switch(void **save, void *to) __attribute__((visibility("hidden")));
extern "C" void nb_shim_start(void) __attribute__((visibility("hidden")));
asm(".text\n"
    ".globl nb_shim_switch\n"
    ".hidden nb_shim_switch\n"
    ".type nb_shim_switch, @function\n"
    "nb_shim_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size nb_shim_switch, .-nb_shim_switch\n"
    ".globl nb_shim_start\n"
    ".hidden nb_shim_start\n"
    ".type nb_shim_start, @function\n"
    "nb_shim_start:\n"
    "  call nb_shim_fiber_main\n"
    "  ud2\n"
    ".size nb_shim_start, .-nb_shim_start\n");
#endif

namespace nb_shim {
/* Leaves the running fiber (its state already set) for the scheduler. */
static inline void yield_to_scheduler() {
  sched *s = S;
  fiber *f = &s->f[s->cur];
#ifdef NB_SHIM_USE_UCONTEXT
  swapcontext(f->uc, &s->self);
#else
  nb_shim_switch(&f->sp, s->self);
#endif
}
} // namespace nb_shim

/* A fiber's life: its thread of the kernel, then back to the scheduler for good. */
extern "C" __attribute__((visibility("hidden"), used)) void nb_shim_fiber_main(void) {
  nb_shim::sched *s = nb_shim::S;
  s->L->body(s->L->arg);
  s = nb_shim::S;
  s->f[s->cur].state = nb_shim::DONE;
  nb_shim::yield_to_scheduler();
  __builtin_trap(); /* a finished fiber is never resumed */
}

namespace nb_shim {
/* Starts fiber i on a free stack. */
static void start(sched *s, unsigned i) {
  fiber *f = &s->f[i];
  f->stack = s->free_stacks[--s->n_free];
  char *base = s->W->stacks + (size_t)f->stack * s->W->stack_bytes;
  char *top = base + s->W->stack_bytes;
#ifdef NB_SHIM_USE_UCONTEXT
  top -= (sizeof(ucontext_t) + 63) / 64 * 64;
  f->uc = (ucontext_t *)(void *)top;
  getcontext(f->uc);
  f->uc->uc_stack.ss_sp = base;
  f->uc->uc_stack.ss_size = (size_t)(top - base);
  f->uc->uc_link = nullptr;
  makecontext(f->uc, (void (*)())nb_shim_fiber_main, 0);
#else
  /* six saved registers, then the return address nb_shim_start, so that the stack is
   * 16-byte aligned at its call */
  void **sp = (void **)(void *)(top - 72);
  for (int r = 0; r < 6; r++)
    sp[r] = nullptr;
  sp[6] = (void *)nb_shim_start;
  sp[7] = sp[8] = nullptr;
  f->sp = sp;
#endif
  f->state = RUN;
}

/* Runs fiber i until it finishes or waits. */
static void resume(sched *s, unsigned i) {
  const nb_shim_launch *L = s->L;
  unsigned bx = L->block[0], by = L->block[1];
  threadIdx = {i % bx, (i / bx) % by, i / (bx * by)};
  s->cur = i;
  fiber *f = &s->f[i];
#ifdef NB_SHIM_USE_UCONTEXT
  swapcontext(&s->self, f->uc);
#else
  nb_shim_switch(&s->self, f->sp);
#endif
  if (f->state == DONE) {
    s->free_stacks[s->n_free++] = f->stack;
    s->live--;
    s->warp_live[i / WARP]--;
  }
}

/* Runs the current block's n threads to the end; false (err written) when they wait
 * at barriers none of them can pass. */
static bool run_block(sched *s) {
  unsigned n = s->n, warps = (n + WARP - 1) / WARP;
  s->live = n;
  s->at_block = 0;
  s->block_acc = 0;
  for (unsigned w = 0; w < warps; w++) {
    s->warp_live[w] = w + 1 < warps || n % WARP == 0 ? WARP : n % WARP;
    s->warp_at[w] = 0;
  }
  for (unsigned i = 0; i < n; i++)
    s->f[i].state = NEW;
  for (;;) {
    for (unsigned i = 0; i < n; i++) {
      unsigned st = s->f[i].state;
      if (st == NEW) start(s, i);
      if (st == NEW || st == RUN) resume(s, i);
    }
    if (s->live == 0) return true;
    bool released = false;
    if (s->at_block == s->live) {
      s->block_result = s->block_acc;
      s->block_arrived = s->at_block;
      s->block_acc = 0;
      s->at_block = 0;
      for (unsigned i = 0; i < n; i++)
        if (s->f[i].state == AT_BLOCK) s->f[i].state = RUN;
      released = true;
    }
    for (unsigned w = 0; w < warps; w++) {
      if (s->warp_at[w] == 0 || s->warp_at[w] != s->warp_live[w]) continue;
      s->warp_at[w] = 0;
      for (unsigned i = w * WARP; i < n && i < (w + 1) * WARP; i++)
        if (s->f[i].state == AT_WARP) s->f[i].state = RUN;
      released = true;
    }
    if (!released) {
      const nb_shim_launch *L = s->L;
      if (L->err && L->err_bytes)
        snprintf(L->err, L->err_bytes,
                 "block (%u, %u, %u): %u of %u threads wait at barriers none of them can pass "
                 "(%u at __syncthreads)",
                 blockIdx.x, blockIdx.y, blockIdx.z, s->live, n, s->at_block);
      return false;
    }
  }
}

/* The running thread waits at its block's barrier; pred is added to the barrier's
 * count. Returns the count of the barrier it passed. */
static inline long long block_barrier(long long pred) {
  sched *s = S;
  s->f[s->cur].state = AT_BLOCK;
  s->at_block++;
  s->block_acc += pred;
  yield_to_scheduler();
  return S->block_result;
}

/* The running thread waits at its warp's barrier. */
static inline void warp_barrier() {
  sched *s = S;
  s->f[s->cur].state = AT_WARP;
  s->warp_at[s->cur / WARP]++;
  yield_to_scheduler();
}

/* Exchanges v across the calling thread's warp: returns lane src's value. */
template <typename T> static T exchange(T v, int src) {
  static_assert(sizeof(T) <= 8, "exchanged values are at most 8 bytes");
  sched *s = S;
  unsigned w = s->cur / WARP, lane = s->cur % WARP;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof v);
  s->slot[w][lane] = bits;
  warp_barrier();
  bits = S->slot[w][(unsigned)src % WARP];
  warp_barrier();
  T r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

/* The mask of the warp's lanes (within mask) whose pred is non-zero. */
static inline unsigned ballot(unsigned mask, int pred) {
  sched *s = S;
  unsigned w = s->cur / WARP, first = w * WARP;
  s->slot[w][s->cur % WARP] = pred != 0;
  warp_barrier();
  s = S;
  unsigned bits = 0;
  for (unsigned l = 0; l < WARP && first + l < s->n; l++)
    if ((mask >> l & 1u) && s->f[first + l].state != DONE && s->slot[w][l]) bits |= 1u << l;
  warp_barrier();
  return bits;
}

/* Kernel parameters: *(A *)p[i] for the kernel's parameter types A. */
template <class... A, size_t... I>
static inline void call_(void (*f)(A...), void **p, std::index_sequence<I...>) {
  f(*static_cast<std::remove_cv_t<A> *>(p[I])...);
}
template <class... A> static inline void call(void (*f)(A...), void *p) {
  call_(f, static_cast<void **>(p), std::index_sequence_for<A...>{});
}
/* The number of parameters of kernel f. */
template <class... A> static constexpr unsigned arity(void (*)(A...)) { return sizeof...(A); }

/* Dynamic shared memory of the running block, as an array of T. */
template <typename T> struct dyn_array {
  static T *base() { return static_cast<T *>(S->W->smem); }
  T &operator[](long long i) const { return base()[i]; }
  operator T *() const { return base(); }
  template <typename U> explicit operator U *() const { return reinterpret_cast<U *>(base()); }
};
} // namespace nb_shim

/* `extern __shared__ T name[];`, as the fake rewrites it. */
#define NB_SHIM_DYN_SMEM(name, ...) static const nb_shim::dyn_array<__VA_ARGS__> name

/* The trampoline of kernel `name` (the fake generates one per kernel): one thread with
 * cuLaunchKernel's kernelParams; and the kernel's number of parameters. */
#define NB_SHIM_KERNEL(name)                                                                       \
  extern "C" void nb_shim_k_##name(void *params) { nb_shim::call(name, params); }                  \
  extern "C" const unsigned nb_shim_p_##name = nb_shim::arity(name);

extern "C" int nb_shim_abi(void) { return NB_SHIM_ABI; }

/* See the header comment: blocks of L from L->next on this thread with W. */
extern "C" int nb_shim_exec(const nb_shim_launch *L, nb_shim_worker *W) {
  using namespace nb_shim;
  unsigned gx = L->grid[0], gy = L->grid[1], gz = L->grid[2];
  unsigned n = L->block[0] * L->block[1] * L->block[2];
  if (!gx || !gy || !gz || !n || n > NB_SHIM_MAX_THREADS || !W || !W->scratch) {
    if (L->err && L->err_bytes) snprintf(L->err, L->err_bytes, "bad launch configuration");
    return -1;
  }
  sched *s = static_cast<sched *>(W->scratch), *outer = S;
  s->L = L;
  s->W = W;
  s->n = n;
  s->n_free = NB_SHIM_MAX_THREADS;
  for (unsigned k = 0; k < NB_SHIM_MAX_THREADS; k++)
    s->free_stacks[k] = NB_SHIM_MAX_THREADS - 1 - k;
  S = s;
  blockDim = {L->block[0], L->block[1], L->block[2]};
  gridDim = {gx, gy, gz};
  unsigned long long total = (unsigned long long)gx * gy * gz;
  int rc = 0;
  for (;;) {
    unsigned long long b = __atomic_fetch_add(L->next, 1ull, __ATOMIC_RELAXED);
    if (b >= total) break;
    blockIdx = {(unsigned)(b % gx), (unsigned)(b / gx % gy), (unsigned)(b / gx / gy)};
    if (!run_block(s)) {
      rc = -1;
      __atomic_store_n(L->next, total, __ATOMIC_RELAXED); /* the others stop too */
      break;
    }
  }
  S = outer;
  return rc;
}

/* The worker of this object for nb_shim_run, made at its first launch (NULL when out of
 * memory) and unmapped when the object is unloaded. */
static void *nb_shim_own_mem;
static const size_t nb_shim_own_stack = (size_t)128 << 10;
static const size_t nb_shim_own_bytes =
    NB_SHIM_MAX_THREADS * nb_shim_own_stack + NB_SHIM_DYN_SMEM_MAX + NB_SHIM_SCRATCH;
static nb_shim_worker *nb_shim_own_worker() {
  static nb_shim_worker w;
  if (!nb_shim_own_mem) {
    void *p = mmap(nullptr, nb_shim_own_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    nb_shim_own_mem = p;
    size_t n = NB_SHIM_MAX_THREADS * nb_shim_own_stack;
    w.stacks = static_cast<char *>(p);
    w.stack_bytes = nb_shim_own_stack;
    w.smem = w.stacks + n;
    w.scratch = w.stacks + n + NB_SHIM_DYN_SMEM_MAX;
  }
  return &w;
}
__attribute__((destructor)) static void nb_shim_own_unmap() {
  if (nb_shim_own_mem) munmap(nb_shim_own_mem, nb_shim_own_bytes);
}

/* grid blocks of `block` threads, each running body(arg), on the calling thread;
 * 0, or -1 when block is not in 1..1024, memory is short or barriers deadlock. One
 * launch at a time per object. */
extern "C" int nb_shim_run(unsigned grid, unsigned block, void (*body)(void *), void *arg) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  if (block == 0 || block > NB_SHIM_MAX_THREADS) return -1;
  if (grid == 0) return 0;
  pthread_mutex_lock(&mu);
  nb_shim_worker *w = nb_shim_own_worker();
  unsigned long long next = 0;
  char err[256] = "";
  nb_shim_launch L = {{grid, 1, 1}, {block, 1, 1}, body, arg, &next, err, sizeof err};
  int rc = w ? nb_shim_exec(&L, w) : -1;
  pthread_mutex_unlock(&mu);
  return rc;
}

/* ---- barriers and warp primitives ---- */
static inline void __syncthreads() { nb_shim::block_barrier(0); }
static inline int __syncthreads_count(int pred) { return (int)nb_shim::block_barrier(pred != 0); }
static inline int __syncthreads_and(int pred) {
  long long n = nb_shim::block_barrier(pred != 0);
  return n == (long long)nb_shim::S->block_arrived;
}
static inline int __syncthreads_or(int pred) { return nb_shim::block_barrier(pred != 0) != 0; }
static inline void __syncwarp(unsigned = 0xffffffffu) { nb_shim::warp_barrier(); }
/* Lane of the calling thread. Shuffles with width < 32 work in groups of width lanes,
 * as CUDA's: a source outside the group gives the caller's own value. */
static inline int nb_shim_lane() { return (int)(nb_shim::S->cur % nb_shim::WARP); }
template <typename T> static inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  int lane = nb_shim_lane();
  return nb_shim::exchange(v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  int lane = nb_shim_lane(), t = lane ^ mask;
  return nb_shim::exchange(v, t / width > lane / width ? lane : t);
}
template <typename T>
static inline T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = nb_shim_lane();
  return nb_shim::exchange(v, (lane & (width - 1)) >= (int)delta ? lane - (int)delta : lane);
}
template <typename T>
static inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  int lane = nb_shim_lane();
  return nb_shim::exchange(v, (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : lane);
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  return nb_shim::ballot(mask, pred);
}
static inline int __any_sync(unsigned mask, int pred) { return nb_shim::ballot(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return nb_shim::ballot(mask, !pred) == 0; }
static inline unsigned __activemask() { return 0xffffffffu; }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* ---- atomics ---- */
template <typename T> static inline T nb_shim_atomic_float(T *p, T v, int op) {
  T old, now;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do {
    now = op == 0 ? old + v : op == 1 ? (v < old ? v : old) : (v > old ? v : old);
  } while (!__atomic_compare_exchange(p, &old, &now, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return old;
}
static inline float atomicAdd(float *p, float v) { return nb_shim_atomic_float(p, v, 0); }
static inline double atomicAdd(double *p, double v) { return nb_shim_atomic_float(p, v, 0); }
#define NB_SHIM_INT_ATOMICS(T)                                                                     \
  static inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }      \
  static inline T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }      \
  static inline T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }    \
  static inline T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }      \
  static inline T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }        \
  static inline T atomicXor(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }      \
  static inline T atomicMin(T *p, T v) {                                                           \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                  \
    while (v < old &&                                                                              \
           !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {  \
    }                                                                                              \
    return old;                                                                                    \
  }                                                                                                \
  static inline T atomicMax(T *p, T v) {                                                           \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                                  \
    while (v > old &&                                                                              \
           !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {  \
    }                                                                                              \
    return old;                                                                                    \
  }                                                                                                \
  static inline T atomicCAS(T *p, T cmp, T v) {                                                    \
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);            \
    return cmp;                                                                                    \
  }
NB_SHIM_INT_ATOMICS(int)
NB_SHIM_INT_ATOMICS(unsigned)
NB_SHIM_INT_ATOMICS(long long)
NB_SHIM_INT_ATOMICS(unsigned long long)
static inline float atomicExch(float *p, float v) {
  float old;
  __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST);
  return old;
}
static inline float atomicMin(float *p, float v) { return nb_shim_atomic_float(p, v, 1); }
static inline float atomicMax(float *p, float v) { return nb_shim_atomic_float(p, v, 2); }

/* ---- bits and integer intrinsics ---- */
static inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
static inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, 4);
  return i;
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
static inline double __longlong_as_double(long long i) {
  double d;
  std::memcpy(&d, &i, 8);
  return d;
}
static inline long long __double_as_longlong(double d) {
  long long i;
  std::memcpy(&i, &d, 8);
  return i;
}
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x) {
  x = (x >> 1 & 0x55555555u) | (x & 0x55555555u) << 1;
  x = (x >> 2 & 0x33333333u) | (x & 0x33333333u) << 2;
  x = (x >> 4 & 0x0f0f0f0fu) | (x & 0x0f0f0f0fu) << 4;
  return __builtin_bswap32(x);
}
static inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline long long __mul64hi(long long a, long long b) {
  return (long long)(((__int128)a * b) >> 64);
}

/* ---- rounding-mode intrinsics (the host rounds to nearest even) ---- */
/* x rounded to float toward zero (dir 0), up (1) or down (-1). */
static inline float nb_shim_d2f(double x, int dir) {
  float f = (float)x;
  if (f != f || (double)f == x) return f;
  bool above = (double)f > x;
  if (dir == 0 && above == (x > 0)) return nextafterf(f, 0.0f);
  if (dir > 0 && !above) return nextafterf(f, INFINITY);
  if (dir < 0 && above) return nextafterf(f, -INFINITY);
  return f;
}
static inline float __double2float_rn(double x) { return (float)x; }
static inline float __double2float_rz(double x) { return nb_shim_d2f(x, 0); }
static inline float __double2float_ru(double x) { return nb_shim_d2f(x, 1); }
static inline float __double2float_rd(double x) { return nb_shim_d2f(x, -1); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline double rsqrt(double a) { return 1.0 / sqrt(a); }
static inline float __saturatef(float a) { return a > 1.0f ? 1.0f : a > 0.0f ? a : 0.0f; }
static inline int __float2int_rz(float a) { return (int)a; }
static inline int __float2int_rn(float a) { return (int)nearbyintf(a); }
static inline int __double2int_rz(double a) { return (int)a; }
static inline long long __float2ll_rz(float a) { return (long long)a; }
static inline long long __double2ll_rz(double a) { return (long long)a; }
static inline float __int2float_rn(int a) { return (float)a; }
static inline float __ll2float_rn(long long a) { return (float)a; }
static inline double __ll2double_rn(long long a) { return (double)a; }

/* CUDA's min / max take mixed arithmetic types (the usual conversions); over floats
 * they are fmin / fmax (a NaN operand gives the other). */
template <typename A, typename B> static inline auto min(A a, B b) -> decltype(a + b) {
  typedef decltype(a + b) R;
  if constexpr (std::is_floating_point<R>::value)
    return std::fmin((R)a, (R)b);
  else
    return (R)b < (R)a ? (R)b : (R)a;
}
template <typename A, typename B> static inline auto max(A a, B b) -> decltype(a + b) {
  typedef decltype(a + b) R;
  if constexpr (std::is_floating_point<R>::value)
    return std::fmax((R)a, (R)b);
  else
    return (R)a < (R)b ? (R)b : (R)a;
}
#endif

#endif
