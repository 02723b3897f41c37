/* test/test_threads.c — the thread contract (README "Threads", tensor.h):
 * threads that train their own models never interfere (each result equals the
 * single-threaded one, bit for bit), one jitted function made by the main
 * thread may be called from several threads at once, and a thread's exit
 * releases what its scopes still hold. Worker threads never call Criterion's
 * asserts (they record; the main thread checks). Runs under `make test
 * TSAN=1` too. */
#include <pthread.h>

#include "common.h"

#include "../src/backends/cpu/cpu.h"

TestSuite(threads, .init = tc_setup, .fini = tc_teardown);

enum { STEPS = 12, MAX_THREADS = 4 };

static const int64_t widths[4] = {16, 48, 32, 4};

/* The MLP's loss: in = W0 b0 W1 b1 W2 b2 x y. */
static nb_tensor *mlp_loss(nb_tensor *const *p, nb_tensor *x, nb_tensor *y) {
  nb_tensor *h = x;
  for (int i = 0; i < 3; i++) {
    h = nb_add(nb_matmul(h, p[2 * i]), p[2 * i + 1]);
    if (i < 2) h = nb_tanh(h);
  }
  return nb_mean(nb_square(nb_sub(h, y)), NB_ALL, false);
}

static nb_status loss_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *scale = u; /* a capture: every thread reads the main thread's tensor */
  out[0] = nb_mul(mlp_loss(in, in[6], in[7]), scale);
  return out[0] ? NB_OK : nb_last_status();
}

typedef struct job {
  int style;     /* 0 functional, 1 jitted (own nb_jit), 2 nb_backward, 3 the shared jitted step */
  uint64_t seed; /* data and weights */
  int64_t batch;
  nb_fn *shared; /* style 3 */
  nb_tensor *scale;
  nb_device dev; /* the main thread's default device (NABLA_TEST_DEVICE) */
  double losses[STEPS];
  nb_status st;
  char err[256];
} job;

static void *train(void *arg) {
  job *jb = arg;
  nb_set_default_device(jb->dev);
  nb_seed(jb->seed);
  nb_scope_begin();
  nb_tensor *p[8];
  for (int i = 0; i < 3; i++) {
    p[2 * i] = nb_keep(nb_glorot_uniform(NB_SHAPE(widths[i], widths[i + 1]), NB_F32));
    p[2 * i + 1] = nb_keep(nb_zeros(NB_SHAPE(1, widths[i + 1]), NB_F32));
  }
  p[6] = nb_keep(nb_randn(NB_SHAPE(jb->batch, widths[0]), NB_F32));
  p[7] = nb_keep(nb_rand(NB_SHAPE(jb->batch, widths[3]), NB_F32));
  nb_scope_end();
  nb_fn *f = NULL, *vg = NULL, *step = jb->shared;
  if (jb->style != 3) {
    f = nb_fn_create(loss_body, jb->scale, 8, 1);
    vg = nb_value_and_grad(f, NB_AXES(0, 1, 2, 3, 4, 5));
    step = jb->style == 1 ? nb_jit(vg) : vg;
  }
  for (int i = 0; jb->style == 2 && i < 6; i++)
    nb_set_requires_grad(p[i], true);
  for (int s = 0; s < STEPS && !nb_last_status(); s++) {
    nb_scope_begin();
    nb_tensor *loss;
    if (jb->style == 2) {
      loss = nb_mul(mlp_loss(p, p[6], p[7]), jb->scale);
      if (nb_backward(loss) == NB_OK)
        for (int i = 0; i < 6; i++) {
          nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(nb_grad_of(p[i]), 0.05)));
          nb_zero_grad(p[i]);
        }
    } else {
      nb_tensor *o[7] = {0};
      loss = nb_call(step, p, o) == NB_OK ? o[0] : NULL;
      for (int i = 0; loss && i < 6; i++)
        nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(o[1 + i], 0.05)));
    }
    jb->losses[s] = loss ? nb_item(loss) : NAN;
    nb_scope_end();
  }
  jb->st = nb_last_status();
  if (jb->st) snprintf(jb->err, sizeof jb->err, "%s", nb_last_error());
  if (step && step != vg && step != jb->shared) nb_fn_release(step);
  nb_fn_release(vg);
  nb_fn_release(f);
  return NULL; /* a worker's exit releases its root scope (params, data) */
}

/* Runs jobs[0..n) concurrently (each in its own thread). */
static void run_threads(job *jobs, int n) {
  pthread_t th[MAX_THREADS];
  for (int i = 0; i < n; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, train, &jobs[i]), 0);
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
}

/* Each job alone, one after another in a fresh thread: the reference. */
static void run_alone(job *jobs, int n, job *ref) {
  for (int i = 0; i < n; i++) {
    ref[i] = jobs[i];
    run_threads(&ref[i], 1);
    cr_assert_eq(ref[i].st, NB_OK, "job %d alone: %s", i, ref[i].err);
  }
}

static void expect_same(const job *got, const job *ref, int n) {
  for (int i = 0; i < n; i++) {
    cr_assert_eq(got[i].st, NB_OK, "job %d (style %d): %s", i, got[i].style, got[i].err);
    for (int s = 0; s < STEPS; s++)
      cr_assert_eq(got[i].losses[s], ref[i].losses[s],
                   "job %d (style %d) step %d: %.9g threaded, %.9g alone", i, got[i].style, s,
                   got[i].losses[s], ref[i].losses[s]);
    cr_assert_lt(got[i].losses[STEPS - 1], got[i].losses[0], "job %d does not learn", i);
  }
}

static nb_tensor *make_scale(void) { return nb_retain(nb_scalar(1.5, NB_F32)); }

Test(threads, threads_training_their_own_models_match_single_threaded) {
  nb_tensor *scale = make_scale();
  for (int n = 2; n <= MAX_THREADS; n++) {
    job jobs[MAX_THREADS], ref[MAX_THREADS];
    for (int i = 0; i < n; i++)
      jobs[i] = (job){.style = i % 3,
                      .seed = 100 + (uint64_t)i,
                      .batch = 24 + 8 * i,
                      .scale = scale,
                      .dev = nb_default_device()};
    run_alone(jobs, n, ref);
    for (int round = 0; round < 3; round++) {
      run_threads(jobs, n);
      expect_same(jobs, ref, n);
    }
  }
  nb_release(scale);
}

Test(threads, one_jitted_function_shared_by_threads) {
  nb_tensor *scale = make_scale();
  nb_fn *f = nb_fn_create(loss_body, scale, 8, 1);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1, 2, 3, 4, 5));
  nb_fn *step = nb_jit(vg);
  /* the main thread traces the batch-32 signature first: the threads of that
   * batch run its cached entry, the others trace and cache theirs concurrently */
  job warm = {.style = 3,
              .seed = 7,
              .batch = 32,
              .shared = step,
              .scale = scale,
              .dev = nb_default_device()};
  train(&warm);
  cr_assert_eq(warm.st, NB_OK, "%s", warm.err);
  for (int n = 2; n <= MAX_THREADS; n++) {
    job jobs[MAX_THREADS], ref[MAX_THREADS];
    for (int i = 0; i < n; i++)
      jobs[i] = (job){.style = 3,
                      .seed = 200 + (uint64_t)i,
                      .batch = i % 2 ? 32 : 40 + 8 * i,
                      .shared = step,
                      .scale = scale,
                      .dev = nb_default_device()};
    run_alone(jobs, n, ref);
    for (int round = 0; round < 3; round++) {
      run_threads(jobs, n);
      expect_same(jobs, ref, n);
    }
  }
  /* the threaded results are the unjitted ones too */
  job plain = {.style = 0, .seed = 201, .batch = 32, .scale = scale, .dev = nb_default_device()},
      jit = plain;
  jit.style = 3, jit.shared = step;
  train(&plain);
  run_threads(&jit, 1);
  for (int s = 0; s < STEPS; s++)
    cr_expect(fabs(plain.losses[s] - jit.losses[s]) <= 1e-5 * fabs(plain.losses[s]),
              "step %d: %.9g plain, %.9g jitted", s, plain.losses[s], jit.losses[s]);
  nb_fn_release(step);
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_release(scale);
}

static void *leave_in_root_scope(void *arg) {
  (void)arg;
  nb_tensor *a = nb_ones(NB_SHAPE(256, 256), NB_F32);
  nb_tensor *b = nb_exp(nb_add(a, a)); /* pending: in the thread's lazy set */
  nb_scope_begin();                    /* an open scope left open too */
  nb_tensor *c = nb_matmul(b, a);
  nb_eval(&c, 1);
  return NULL;
}

Test(threads, thread_exit_releases_its_root_scope) {
  nb_stats before = nb_get_stats();
  for (int round = 0; round < 4; round++) {
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, leave_in_root_scope, NULL), 0);
    pthread_join(th, NULL);
  }
  nb_stats after = nb_get_stats();
  cr_assert_eq(after.live_tensors, before.live_tensors, "%llu tensors leaked by exited threads",
               (unsigned long long)(after.live_tensors - before.live_tensors));
  cr_assert_eq(after.live_bytes, before.live_bytes, "%llu bytes leaked by exited threads",
               (unsigned long long)(after.live_bytes - before.live_bytes));
}

static void *realize_many_structures(void *arg) {
  int *bad = arg;
  for (int i = 0; i < 200; i++) {
    nb_scope_begin();
    int64_t n = 1 + (i * 7) % 23;
    nb_tensor *x = nb_arange(0, (double)n, 1, NB_F32);
    for (int k = 0; k < i % 5; k++)
      x = k % 2 ? nb_sin(x) : nb_add_scalar(x, 1.0);
    double got = nb_item(nb_sum(x, NB_ALL, false));
    double want = 0;
    for (int64_t j = 0; j < n; j++) {
      double v = (double)j;
      for (int k = 0; k < i % 5; k++)
        v = k % 2 ? sin(v) : v + 1.0;
      want += v;
    }
    if (fabs(got - want) > 1e-4 * (1 + fabs(want))) (*bad)++;
    nb_scope_end();
  }
  return NULL;
}

/* Plans of different structures realized at once (the plan cache and the
 * lazy set are per thread). */
Test(threads, concurrent_realizations_of_different_graphs) {
  pthread_t th[MAX_THREADS];
  int bad[MAX_THREADS] = {0};
  for (int i = 0; i < MAX_THREADS; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, realize_many_structures, &bad[i]), 0);
  for (int i = 0; i < MAX_THREADS; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(bad[i], 0, "thread %d: %d wrong sums", i, bad[i]);
  }
}

/* Realizes `rounds` single-kernel graphs (arg: the count). */
static void *realize_rounds(void *arg) {
  int rounds = *(const int *)arg;
  for (int i = 0; i < rounds; i++) {
    nb_scope_begin();
    nb_tensor *y = nb_exp(nb_full(NB_SHAPE(8), 0.5, NB_F32));
    nb_eval(&y, 1);
    nb_scope_end();
  }
  return NULL;
}

/* nb_stats counts per thread (stats.c): the sum covers every thread, those
 * that exited too, and a reset zeroes it for all. */
Test(threads, stats_count_every_thread_and_survive_its_exit) {
  int rounds = 50;
  realize_rounds(&rounds); /* warm: plans cached on this thread */
  nb_reset_stats();
  nb_stats zero = nb_get_stats();
  cr_assert_eq(zero.kernels_run, 0);
  cr_assert_eq(zero.realizations, 0);
  pthread_t th[MAX_THREADS];
  for (int i = 0; i < MAX_THREADS; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, realize_rounds, &rounds), 0);
  for (int i = 0; i < MAX_THREADS; i++)
    pthread_join(th[i], NULL); /* their blocks are retired now */
  realize_rounds(&rounds);
  nb_stats s = nb_get_stats();
  uint64_t want = (uint64_t)rounds * (MAX_THREADS + 1);
  cr_assert_eq(s.realizations, want, "%llu realizations, want %llu",
               (unsigned long long)s.realizations, (unsigned long long)want);
  cr_assert_eq(s.kernels_run, want, "%llu kernels, want %llu", (unsigned long long)s.kernels_run,
               (unsigned long long)want);
  cr_assert_eq(s.plan_cache_hits + s.plan_cache_misses, want);
  nb_reset_stats();
  s = nb_get_stats();
  cr_assert_eq(s.realizations, 0);
  cr_assert_eq(s.kernels_run, 0);
}

/* nb_set_num_threads: one process-wide count, applied at each thread's next
 * realization; results agree with the default count. */
Test(threads, set_num_threads) {
  int def = nb_get_num_threads();
  cr_assert(def >= 1, "default %d", def);
  cr_assert_eq(nb_set_num_threads(-1), NB_ERR_ARG);
  cr_assert(strstr(nb_last_error(), "nb_set_num_threads"), "%s", nb_last_error());
  nb_clear_error();
  nb_seed(5);
  nb_tensor *a = nb_randn(NB_SHAPE(300, 700), NB_F32);
  double ref = nb_item(nb_sum(nb_matmul(a, nb_transpose(a)), NB_ALL, false));
  cr_assert_eq(nb_set_num_threads(1), NB_OK);
  cr_assert_eq(nb_get_num_threads(), 1);
  double one = nb_item(nb_sum(nb_matmul(a, nb_transpose(a)), NB_ALL, false));
  cr_assert_eq(nb_set_num_threads(0), NB_OK);
  cr_assert_eq(nb_get_num_threads(), def);
  cr_expect(fabs(one - ref) <= 1e-4 * fabs(ref), "1 thread %.9g, default %.9g", one, ref);
  cr_assert_eq(nb_last_status(), NB_OK, "%s", nb_last_error());
}

typedef struct foreign_use {
  nb_tensor *pending, *realized;
  nb_status st_pending;
  double sum_realized;
  char err[256];
} foreign_use;

static void *use_foreign(void *arg) {
  foreign_use *u = arg;
  nb_tensor *r = nb_mul(u->pending, u->pending);
  u->st_pending = r ? NB_OK : nb_last_status();
  snprintf(u->err, sizeof u->err, "%s", nb_last_error());
  nb_clear_error();
  u->sum_realized = nb_item(nb_sum(nb_mul(u->realized, u->realized), NB_ALL, false));
  return NULL;
}

/* Another thread's realized tensor is read; its pending one is a clear error. */
Test(threads, another_threads_tensors) {
  foreign_use u = {0};
  nb_tensor *a = nb_arange(0, 10, 1, NB_F32);
  u.pending = nb_add(a, a);
  u.realized = nb_add_scalar(a, 1.0);
  cr_assert_eq(nb_eval(&u.realized, 1), NB_OK);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, use_foreign, &u), 0);
  pthread_join(th, NULL);
  cr_assert_eq(u.st_pending, NB_ERR_ARG, "%s", u.err);
  cr_assert(strstr(u.err, "nb_mul") && strstr(u.err, "another thread"), "%s", u.err);
  cr_assert_eq(u.sum_realized, 385.0);                           /* sum of (i+1)^2, i < 10 */
  cr_assert_eq(nb_item(nb_sum(u.pending, NB_ALL, false)), 90.0); /* still fine here */
}

/* ---- the contention guard (src/backends/cpu/threads.c) ----------------------
 * Its state machine fed synthetic realizations: (wall, this thread's CPU) in
 * ms at a clock in ms. The guard's constants: windows of 20 ms, a share of
 * 0.65, two windows in a row, back-off 0.25 s doubling to 4 s. */
#define MS 1000000ull

static void feed_ms(nbi_thread_guard *g, uint64_t *now, double wall, double cpu) {
  *now += (uint64_t)(wall * MS);
  nbi_thread_guard_feed(g, *now, (uint64_t)(wall * MS), (uint64_t)(cpu * MS));
}

Test(threads, contention_guard_reduces_only_when_contended) {
  nbi_thread_guard g = {0};
  uint64_t now = 1000 * MS;
  /* quiet: 200 realizations of 1 ms on a CPU 90% of the time */
  for (int i = 0; i < 200; i++) {
    cr_assert(!nbi_thread_guard_reduced(&g, now));
    feed_ms(&g, &now, 1, 0.9);
  }
  /* one contended window between quiet ones: no reduction */
  feed_ms(&g, &now, 20, 8);
  feed_ms(&g, &now, 20, 19);
  feed_ms(&g, &now, 20, 8);
  cr_assert(!nbi_thread_guard_reduced(&g, now));
  /* CPU time above the wall (clock granularity) counts as the wall */
  feed_ms(&g, &now, 20, 30);
  /* two contended windows in a row (0.4 and 0.6 of the wall): reduced for 0.25 s */
  feed_ms(&g, &now, 20, 8);
  cr_assert(!nbi_thread_guard_reduced(&g, now));
  for (int i = 0; i < 4; i++)
    feed_ms(&g, &now, 5, 3); /* short realizations fill a window */
  cr_assert(nbi_thread_guard_reduced(&g, now));
  uint64_t start = now;
  /* while reduced nothing is judged; the probe comes 0.25 s later */
  feed_ms(&g, &now, 100, 10);
  cr_assert(nbi_thread_guard_reduced(&g, start + 249 * MS));
  cr_assert(!nbi_thread_guard_reduced(&g, start + 250 * MS));
  now = start + 250 * MS;
  /* a failed probe reduces at once, for twice as long each time up to 4 s */
  uint64_t want[] = {500, 1000, 2000, 4000, 4000};
  for (int k = 0; k < 5; k++) {
    feed_ms(&g, &now, 20, 5);
    uint64_t at = now;
    cr_assert(nbi_thread_guard_reduced(&g, at + (want[k] - 1) * MS), "probe %d", k);
    cr_assert(!nbi_thread_guard_reduced(&g, at + want[k] * MS), "probe %d", k);
    now = at + want[k] * MS;
  }
  /* a probe that finds the CPU again ends it: the next contention starts at 0.25 s */
  feed_ms(&g, &now, 20, 19);
  cr_assert(!nbi_thread_guard_reduced(&g, now));
  feed_ms(&g, &now, 20, 5);
  feed_ms(&g, &now, 20, 5);
  cr_assert(nbi_thread_guard_reduced(&g, now));
  cr_assert(!nbi_thread_guard_reduced(&g, now + 250 * MS));
}

/* The guard's stats counter and NABLA_THREAD_GUARD: a quiet run of this
 * suite's MLP (at most a few windows) keeps the full count unless the machine
 * is busy, and the kernels' thread count is the one asked for. */
Test(threads, contention_guard_keeps_the_count_asked_for) {
  int before = nb_get_num_threads();
  cr_assert_eq(nb_set_num_threads(3), NB_OK);
  nb_tensor *x = nb_full(NB_SHAPE(64, 64), 1.0, NB_F32);
  nb_tensor *y = nb_sum(nb_matmul(x, x), NB_ALL, false);
  cr_assert_eq(nb_item(y), 64.0 * 64 * 64);
  int team = nbi_cpu_team();
  cr_assert(team == 3 || (team == 1 && nb_get_stats().thread_reductions > 0), "team %d", team);
  cr_assert_eq(nb_set_num_threads(0), NB_OK);
  cr_assert_eq(nb_get_num_threads(), before);
}
