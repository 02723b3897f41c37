/* src/backends/cpu/threads.c — the kernels' threads: FTZ/DAZ in every thread,
 * the process-wide count (nb_set_num_threads), and the contention guard that
 * drops a thread's kernels to one OpenMP thread while the machine is
 * oversubscribed. */
#include "k_fused.h"

#include <cblas.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <xmmintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Flush-to-zero and denormals-are-zero: denormals cost ~100x per operation on
 * this hardware and carry no useful precision for learning. Set in the calling
 * thread (checked at every realization: cheap, and code between two may clear
 * it) and in every OpenMP worker of its pool: again whenever the team size
 * changed, since libgomp starts fresh workers when a team grows (and ends
 * surplus ones when it shrinks). OpenBLAS's own threads (f64 GEMM) are not
 * ours to set. */
enum { FTZ_DAZ = 0x8040 };
static void set_ftz_daz(void) { _mm_setcsr(_mm_getcsr() | FTZ_DAZ); }

static _Thread_local int ftz_team; /* team size the workers were set for */

/* ---- kernel threads (nb_set_num_threads) ----------------------------------
 * One process-wide count: every thread's kernels use that many OpenMP threads
 * (0: the default, OMP_NUM_THREADS or the cores, read once). OpenMP's count is
 * a per-thread setting, so each thread applies a change at its next
 * realization (nbi_cpu_init); OpenBLAS (f64 GEMM) has one global pool. */
static _Atomic int threads_wanted; /* 0: default */
static _Atomic int threads_default;

static int default_threads(void) {
  int d = threads_default;
  if (!d) {
#ifdef _OPENMP
    d = omp_get_max_threads(); /* before any nb_set_num_threads: the default */
#else
    d = 1;
#endif
    int zero = 0;
    if (!atomic_compare_exchange_strong(&threads_default, &zero, d)) d = threads_default;
  }
  return d;
}

nb_status nb_set_num_threads(int n) {
  if (n < 0 || n > 4096)
    return nbi_error(NB_ERR_ARG, "nb_set_num_threads: %d threads (0 for the default, 1 to 4096)",
                     n);
  (void)default_threads();
  threads_wanted = n;
  if (!nbi_cpu_sgemm_blas()) /* else OpenBLAS stays single-threaded (gemm.c) */
    openblas_set_num_threads(n ? n : default_threads());
  return NB_OK;
}

int nb_get_num_threads(void) {
  int n = threads_wanted;
  return n ? n : default_threads();
}

/* ---- contention guard -------------------------------------------------------
 * OpenMP teams synchronize at every region's barrier, and libgomp's workers
 * spin between regions. On an oversubscribed machine (another CPU-bound
 * process, or several application threads each running a team) a descheduled
 * member stalls the others at each barrier while the spinners burn the time
 * slices that would have run it: a 2-thread step measured 2.4x its quiet time
 * beside two spinning processes, and 20x in some runs, where one thread is
 * ~2.1x. The guard watches each calling thread's realizations: the share of
 * their wall time this thread was on a CPU (CLOCK_THREAD_CPUTIME_ID; a member
 * of a team mostly spins at barriers; libgomp and oneDNN put it to sleep after
 * a while, so a quiet machine measured 0.84-1.0 and one with two spinning
 * processes on its two cores 0.38-0.51). Below GUARD_SHARE over GUARD_STRIKES
 * windows of GUARD_WINDOW_NS in a row, this thread's kernels run on one
 * thread for a back-off time, then the full count is tried again (a probe
 * window); a probe that finds contention again doubles the back-off, up to
 * GUARD_BACKOFF_MAX_NS. Only threads whose count is above 1 are watched.
 * NABLA_THREAD_GUARD=0 turns it off (the count is then always used). nabla's
 * own kernels give the same bits on any team size; oneDNN may split a GEMM's
 * inner dimension differently on another count (last-bit differences, as
 * between two machines). */
#define GUARD_SHARE 0.65
enum {
  GUARD_WINDOW_NS = 20000000,          /* 20 ms of realization time per verdict */
  GUARD_STRIKES = 2,                   /* contended windows in a row that reduce */
  GUARD_BACKOFF_MIN_NS = 250000000,    /* first reduction: 0.25 s */
  GUARD_BACKOFF_MAX_NS = 4000000000LL, /* longest: 4 s between probes */
};

bool nbi_thread_guard_reduced(nbi_thread_guard *g, uint64_t now) {
  if (g->reduced && now >= g->resume_at) { /* time is up: probe the full count */
    g->reduced = false;
    g->probing = true;
    g->win_wall = g->win_cpu = 0;
  }
  return g->reduced;
}

void nbi_thread_guard_feed(nbi_thread_guard *g, uint64_t now, uint64_t wall, uint64_t cpu) {
  if (g->reduced) return; /* one thread: nothing to judge until the probe */
  g->win_wall += wall;
  g->win_cpu += cpu < wall ? cpu : wall;
  if (g->win_wall < GUARD_WINDOW_NS) return;
  bool contended = (double)g->win_cpu < GUARD_SHARE * (double)g->win_wall;
  g->win_wall = g->win_cpu = 0;
  if (!contended) {
    g->strikes = 0;
    g->backoff = 0;
    g->probing = false;
    return;
  }
  /* a probe fails at once; otherwise GUARD_STRIKES windows in a row */
  if (!g->probing && ++g->strikes < GUARD_STRIKES) return;
  uint64_t b = g->probing && g->backoff ? g->backoff : GUARD_BACKOFF_MIN_NS;
  g->reduced = true;
  g->resume_at = now + b;
  g->backoff = b * 2 > GUARD_BACKOFF_MAX_NS ? GUARD_BACKOFF_MAX_NS : b * 2;
  g->strikes = 0;
  g->probing = false;
  nbi_stats_contended();
}

static uint64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int guard_enabled(void) {
  static _Atomic int on = -1; /* -1: NABLA_THREAD_GUARD not read yet */
  int v = on;
  if (v < 0) {
    const char *e = getenv("NABLA_THREAD_GUARD");
    on = v = !(e && e[0] == '0' && !e[1]);
  }
  return v;
}

static _Thread_local nbi_thread_guard guard;
static _Thread_local int guard_depth;                  /* nesting of nbi_cpu_init / nbi_cpu_done */
static _Thread_local uint64_t guard_wall0, guard_cpu0; /* at the outermost init; 0: unwatched */
/* Reading this thread's CPU clock is a system call (~0.4 us): realizations
 * shorter than GUARD_SHORT_NS (a small eager op, a tiny jitted step) are
 * watched one in GUARD_SAMPLE, so the guard costs them ~3 ns each. While
 * reduced, the end of the back-off is looked for one realization in
 * GUARD_RESUME_CHECK (a monotonic clock read is ~20 ns in a VM; the back-off
 * is 0.25 s or more). */
enum { GUARD_SHORT_NS = 200000, GUARD_SAMPLE = 256, GUARD_RESUME_CHECK = 16 };
static _Thread_local bool guard_short;           /* the last watched realization was short */
static _Thread_local unsigned guard_skip;        /* realizations since the last watched one */
static _Thread_local unsigned guard_since_check; /* reduced: realizations since a clock read */

int nbi_cpu_team(void) {
  int want = nb_get_num_threads();
  return want > 1 && guard_enabled() && guard.reduced ? 1 : want;
}

void nbi_cpu_init(void) {
  if ((_mm_getcsr() & FTZ_DAZ) != FTZ_DAZ) set_ftz_daz();
  if (guard_depth++ == 0) {
    guard_wall0 = 0;
    if (nb_get_num_threads() > 1 && guard_enabled()) {
      bool watch = !guard_short || ++guard_skip >= GUARD_SAMPLE;
      bool check = guard.reduced && ++guard_since_check >= GUARD_RESUME_CHECK;
      if (watch || check) { /* the clock only when it is needed */
        guard_since_check = 0;
        uint64_t now = clock_ns(CLOCK_MONOTONIC);
        (void)nbi_thread_guard_reduced(&guard, now);
        if (watch) {
          guard_skip = 0;
          guard_wall0 = now;
          guard_cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        }
      }
    }
  }
#ifdef _OPENMP
  int want = nbi_cpu_team();
  if (omp_get_max_threads() != want) omp_set_num_threads(want);
  int team = omp_get_max_threads();
  if (team == ftz_team) return;
  ftz_team = team;
#pragma omp parallel
  set_ftz_daz();
#endif
}

void nbi_cpu_done(void) {
  if (guard_depth <= 0 || --guard_depth > 0 || !guard_wall0) return;
  uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - guard_cpu0, now = clock_ns(CLOCK_MONOTONIC);
  guard_short = now - guard_wall0 < GUARD_SHORT_NS;
  nbi_thread_guard_feed(&guard, now, now - guard_wall0, cpu);
  guard_wall0 = 0;
}
