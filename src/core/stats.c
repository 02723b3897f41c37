/* src/core/stats.c — nb_stats: the event counters, kept per thread and summed
 * when read.
 *
 * Every realization bumps a few counters (kernels, plans, jit calls, times).
 * One process-wide block bumped with atomic adds cost each call a few locked
 * instructions on a cache line every thread writes: threads running their own
 * models slowed one another down through it, and the adds were a tenth of a
 * tiny jitted call. So each thread counts in a block of its own (a relaxed
 * atomic load and store: plain moves, and no data race with a reader);
 * nb_get_stats sums the blocks under the registry lock, plus the counts of
 * threads that have exited (folded in by the thread-exit destructor), minus the
 * baseline nb_reset_stats took: a reset writes no other thread's block.
 * live_bytes and peak_bytes are process-wide (atomic adds: the allocator
 * bumps them, from any thread, outside its lock); cached_bytes is the buffer
 * cache's own (alloc.c). */
#include "nbi.h"
#include "plan.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#define NBI_X86 1
#include <cpuid.h>
#include <x86intrin.h>
#else
#define NBI_X86 0
#endif

/* The counters of nb_stats this file keeps per thread. */
static const size_t counter_at[] = {
    offsetof(nb_stats, plan_cache_hits),   offsetof(nb_stats, plan_cache_misses),
    offsetof(nb_stats, kernels_run),       offsetof(nb_stats, n_all_reduce),
    offsetof(nb_stats, n_all_gather),      offsetof(nb_stats, n_reduce_scatter),
    offsetof(nb_stats, n_all_to_all),      offsetof(nb_stats, n_permute),
    offsetof(nb_stats, collective_bytes),  offsetof(nb_stats, realizations),
    offsetof(nb_stats, plan_ns),           offsetof(nb_stats, exec_ns),
    offsetof(nb_stats, jit_cache_hits),    offsetof(nb_stats, jit_cache_misses),
    offsetof(nb_stats, thread_reductions), offsetof(nb_stats, buffer_allocs),
    offsetof(nb_stats, buffer_cache_hits)};
enum { N_COUNTERS = sizeof counter_at / sizeof counter_at[0] };

typedef struct stat_block {
  nb_stats c; /* only the counters are used */
  struct stat_block *prev, *next;
} stat_block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static stat_block *blocks;              /* live threads' blocks */
static nb_stats retired, baseline;      /* exited threads' sums; the last reset's */
static uint64_t live_bytes, peak_bytes; /* atomic */
static _Thread_local stat_block *mine;
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static uint64_t *counter(nb_stats *s, int k) { return (uint64_t *)((char *)s + counter_at[k]); }

/* A thread's exit: its counts join the retired ones. */
static void block_retire(void *arg) {
  stat_block *b = arg;
  pthread_mutex_lock(&lock);
  for (int k = 0; k < N_COUNTERS; k++)
    *counter(&retired, k) += __atomic_load_n(counter(&b->c, k), __ATOMIC_RELAXED);
  if (b->prev)
    b->prev->next = b->next;
  else
    blocks = b->next;
  if (b->next) b->next->prev = b->prev;
  pthread_mutex_unlock(&lock);
  free(b);
}

static void exit_key_make(void) { (void)pthread_key_create(&exit_key, block_retire); }

/* This thread's block, registered on first use; NULL when out of memory (the
 * event is then not counted). */
static stat_block *block_mine(void) {
  if (mine) return mine;
  stat_block *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  (void)pthread_once(&exit_once, exit_key_make);
  pthread_mutex_lock(&lock);
  b->next = blocks;
  if (blocks) blocks->prev = b;
  blocks = b;
  pthread_mutex_unlock(&lock);
  (void)pthread_setspecific(exit_key, b);
  return mine = b;
}

/* Adds v to counter field F of this thread's block. */
#define STAT_BUMP(F, v)                                                                            \
  do {                                                                                             \
    stat_block *b_ = block_mine();                                                                 \
    if (b_)                                                                                        \
      __atomic_store_n(&b_->c.F, __atomic_load_n(&b_->c.F, __ATOMIC_RELAXED) + (v),                \
                       __ATOMIC_RELAXED);                                                          \
  } while (0)

/* ---- durations ---------------------------------------------------------------
 * plan_ns and exec_ns are summed in ticks (nbi_ticks) and converted when read,
 * at the rate the counter ran since the library was loaded (both clocks read
 * then and at each nb_get_stats). A duration whose end reads before its start
 * (a thread moved between cores) counts 0. */
static bool use_tsc;
static uint64_t tsc0, ns0;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#if NBI_X86
__attribute__((constructor)) static void ticks_init(void) {
  unsigned a, b, c, d;
  /* invariant TSC: CPUID 0x80000007 EDX bit 8 (constant rate, runs in sleep states) */
  use_tsc = __get_cpuid(0x80000007, &a, &b, &c, &d) && (d >> 8 & 1);
  ns0 = mono_ns();
  tsc0 = __rdtsc();
}
uint64_t nbi_ticks(void) { return use_tsc ? __rdtsc() : mono_ns(); }
#else
uint64_t nbi_ticks(void) { return mono_ns(); }
#endif

static uint64_t ticks_to_ns(uint64_t t) {
  if (!use_tsc) return t;
  uint64_t dns = mono_ns() - ns0, dt = nbi_ticks() - tsc0;
  return dt ? (uint64_t)((double)t * ((double)dns / (double)dt)) : 0;
}

/* The counters summed over every thread since the process started. Called
 * with lock held. */
static nb_stats sum_locked(void) {
  nb_stats s = retired;
  for (stat_block *b = blocks; b; b = b->next)
    for (int k = 0; k < N_COUNTERS; k++)
      *counter(&s, k) += __atomic_load_n(counter(&b->c, k), __ATOMIC_RELAXED);
  return s;
}

nb_stats nb_get_stats(void) {
  pthread_mutex_lock(&lock);
  nb_stats t = sum_locked(), s = {0};
  for (int k = 0; k < N_COUNTERS; k++)
    *counter(&s, k) = *counter(&t, k) - *counter(&baseline, k);
  pthread_mutex_unlock(&lock);
  s.plan_ns = ticks_to_ns(s.plan_ns);
  s.exec_ns = ticks_to_ns(s.exec_ns);
  s.live_bytes = __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
  s.peak_bytes = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
  s.live_tensors = nbi_live_tensors();
  nbi_buffer_cache_stats(&s);
  return s;
}

void nb_reset_stats(void) {
  pthread_mutex_lock(&lock);
  baseline = sum_locked();
  pthread_mutex_unlock(&lock);
  __atomic_store_n(&peak_bytes, __atomic_load_n(&live_bytes, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

/* From any thread (alloc.c): live_bytes is one atomic add; peak_bytes moves
 * up only (a compare-and-swap when a new peak is reached). */
void nbi_stats_alloc(size_t nbytes, bool cache_hit) {
  STAT_BUMP(buffer_allocs, 1);
  if (cache_hit) STAT_BUMP(buffer_cache_hits, 1);
  uint64_t live = __atomic_add_fetch(&live_bytes, nbytes, __ATOMIC_RELAXED);
  uint64_t peak = __atomic_load_n(&peak_bytes, __ATOMIC_RELAXED);
  while (live > peak && !__atomic_compare_exchange_n(&peak_bytes, &peak, live, true,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}
void nbi_stats_free(size_t nbytes) { __atomic_sub_fetch(&live_bytes, nbytes, __ATOMIC_RELAXED); }

void nbi_stats_kernel(void) { STAT_BUMP(kernels_run, 1); }
void nbi_stats_contended(void) { STAT_BUMP(thread_reductions, 1); }
void nbi_stats_collective(int kind, uint64_t bytes) {
  switch (kind) {
  case NBI_COLL_ALL_REDUCE: STAT_BUMP(n_all_reduce, 1); break;
  case NBI_COLL_ALL_GATHER: STAT_BUMP(n_all_gather, 1); break;
  case NBI_COLL_REDUCE_SCATTER: STAT_BUMP(n_reduce_scatter, 1); break;
  case NBI_COLL_ALL_TO_ALL: STAT_BUMP(n_all_to_all, 1); break;
  case NBI_COLL_PERMUTE: STAT_BUMP(n_permute, 1); break;
  default: return;
  }
  STAT_BUMP(collective_bytes, bytes);
}
void nbi_stats_jit(bool hit) {
  if (hit)
    STAT_BUMP(jit_cache_hits, 1);
  else
    STAT_BUMP(jit_cache_misses, 1);
}
void nbi_stats_plan(bool cache_hit) {
  if (cache_hit)
    STAT_BUMP(plan_cache_hits, 1);
  else
    STAT_BUMP(plan_cache_misses, 1);
}
void nbi_stats_exec_ticks(uint64_t t0, uint64_t t1) { STAT_BUMP(exec_ns, t1 > t0 ? t1 - t0 : 0); }
void nbi_stats_plan_ticks(uint64_t t0, uint64_t t1) { STAT_BUMP(plan_ns, t1 > t0 ? t1 - t0 : 0); }
void nbi_stats_realization(void) { STAT_BUMP(realizations, 1); }
