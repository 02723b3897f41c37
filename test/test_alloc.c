/* test/test_alloc.c — the caching buffer allocator (src/core/alloc.c): reuse of
 * released blocks, size-class rounding, the byte cap (set and from
 * NABLA_CACHE_BYTES), trimming, the nb_stats counters, and a training loop that
 * reaches zero system allocations per step with the same values as uncached. */
#include "common.h"

#include <pthread.h>

#include "../bench/bench_common.h" /* the README MLP */

TestSuite(alloc, .init = tc_setup, .fini = tc_teardown);

/* Releases the buffers of b[0..n-1]. */
static void release_all(nbi_buffer **b, int n) {
  for (int i = 0; i < n; i++)
    nbi_buffer_release(b[i]);
}

Test(alloc, released_block_serves_the_next_request_of_its_class) {
  nbi_buffer_cache_set_cap((size_t)1 << 20);
  nbi_buffer_cache_trim();
  nb_reset_stats();
  uint64_t live0 = nb_get_stats().live_bytes;
  nbi_buffer *a = nbi_buffer_alloc(0, 1000);
  cr_assert_not_null(a);
  nb_stats s = nb_get_stats();
  cr_expect_eq(s.live_bytes, live0 + 1000);
  cr_expect_eq(s.buffer_allocs, 1);
  cr_expect_eq(s.buffer_cache_hits, 0);
  void *data = a->data;
  nbi_buffer_release(a);
  s = nb_get_stats();
  cr_expect_eq(s.live_bytes, live0, "a cached block is not live");
  cr_expect_eq(s.cached_bytes, nbi_buffer_class_bytes(1000));

  nbi_buffer *b = nbi_buffer_alloc(0, 1000); /* same size */
  cr_assert_not_null(b);
  cr_expect_eq(b->data, data);
  cr_expect_eq(b->nbytes, 1000);
  cr_expect_eq(b->refcount, 1);
  nbi_buffer_release(b);
  nbi_buffer *c = nbi_buffer_alloc(0, 900); /* smaller, same class (897..1024) */
  cr_assert_not_null(c);
  cr_expect_eq(c->data, data);
  memset(c->data, 7, 900);
  s = nb_get_stats();
  cr_expect_eq(s.buffer_allocs, 3);
  cr_expect_eq(s.buffer_cache_hits, 2);
  cr_expect_eq(s.cached_bytes, 0);
  cr_expect_eq(s.live_bytes, live0 + 900);
  nbi_buffer_release(c);

  nb_reset_stats();
  s = nb_get_stats();
  cr_expect_eq(s.buffer_allocs, 0);
  cr_expect_eq(s.buffer_cache_hits, 0);
  cr_expect_eq(s.cached_bytes, nbi_buffer_class_bytes(1000), "reset keeps the cache level");
}

Test(alloc, retained_buffer_returns_to_the_cache_at_its_last_release) {
  nbi_buffer_cache_set_cap((size_t)1 << 20);
  nbi_buffer_cache_trim();
  nbi_buffer *a = nbi_buffer_alloc(0, 4096);
  cr_assert_not_null(a);
  nbi_buffer_retain(a);
  nbi_buffer_release(a);
  cr_expect_eq(nb_get_stats().cached_bytes, 0, "still held once");
  nbi_buffer_release(a);
  cr_expect_eq(nb_get_stats().cached_bytes, 4096);
}

Test(alloc, size_classes_never_under_allocate) {
  size_t prev = 0;
  for (size_t n = 0; n <= 70000; n++) {
    size_t c = nbi_buffer_class_bytes(n);
    cr_assert_geq(c, n, "n=%zu", n);
    cr_assert_eq(c % 64, 0, "n=%zu", n);
    cr_assert_geq(c, prev, "classes grow with n (n=%zu)", n);
    /* at most one 64-byte step up to 256, a quarter power of two above */
    cr_assert(n <= 256 ? c < n + 64 || (n == 0 && c == 64) : c - n < n / 4, "n=%zu c=%zu", n, c);
    prev = c;
  }
  uint64_t seed = 99;
  for (int i = 0; i < 2000; i++) {
    size_t n = (size_t)tc_uniform(&seed, 1, 0x1.0p46);
    size_t c = nbi_buffer_class_bytes(n);
    cr_assert(c >= n && c % 64 == 0 && c - n < n / 4, "n=%zu c=%zu", n, c);
  }
  for (int k = 9; k < 47; k++) {
    size_t p = (size_t)1 << k;
    cr_expect_eq(nbi_buffer_class_bytes(p), p, "a power of two is a class");
    cr_expect_eq(nbi_buffer_class_bytes(p + 1), p + p / 4);
  }
  /* above 2^47: uncached, 64-byte multiple; an overflowing size fails as a value */
  size_t big = ((size_t)1 << 50) + 1;
  cr_expect_eq(nbi_buffer_class_bytes(big), ((size_t)1 << 50) + 64);
  cr_expect_eq(nbi_buffer_class_bytes(SIZE_MAX), 0);
  nb_clear_error();
  cr_expect_null(nbi_buffer_alloc(0, SIZE_MAX));
  cr_expect_eq(nb_last_status(), NB_ERR_OOM);
  nb_clear_error();

  /* every requested byte of a reused block is writable and reads back */
  nbi_buffer_cache_set_cap((size_t)1 << 24);
  const size_t sizes[] = {1, 63, 64, 65, 255, 257, 1000, 4097, 100000, 1 << 20};
  for (int round = 0; round < 2; round++)
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      nbi_buffer *b = nbi_buffer_alloc(0, sizes[i]);
      cr_assert_not_null(b);
      cr_expect_eq((uintptr_t)b->data % 64, 0);
      unsigned char *d = b->data;
      for (size_t j = 0; j < sizes[i]; j++)
        d[j] = (unsigned char)(j * 31 + i);
      size_t bad = 0;
      for (size_t j = 0; j < sizes[i]; j++)
        bad += d[j] != (unsigned char)(j * 31 + i);
      cr_expect_eq(bad, 0);
      nbi_buffer_release(b);
    }
}

Test(alloc, cap_bounds_the_cached_bytes) {
  nbi_buffer_cache_set_cap(3 * 4096);
  nbi_buffer_cache_trim();
  nb_reset_stats();
  nbi_buffer *b[5];
  for (int i = 0; i < 5; i++)
    cr_assert_not_null(b[i] = nbi_buffer_alloc(0, 4096));
  release_all(b, 5);
  cr_expect_eq(nb_get_stats().cached_bytes, 3 * 4096, "two blocks past the cap were freed");
  for (int i = 0; i < 5; i++)
    cr_assert_not_null(b[i] = nbi_buffer_alloc(0, 4096));
  cr_expect_eq(nb_get_stats().buffer_cache_hits, 3);
  release_all(b, 5);

  cr_expect_eq(nbi_buffer_cache_set_cap(5000), 3 * 4096, "set_cap returns the old cap");
  cr_expect_leq(nb_get_stats().cached_bytes, 5000, "lowering the cap evicts");
  nbi_buffer *big = nbi_buffer_alloc(0, 8192);
  cr_assert_not_null(big);
  nbi_buffer_release(big);
  cr_expect_leq(nb_get_stats().cached_bytes, 5000, "a block over the cap is freed");

  nbi_buffer_cache_set_cap(0);
  cr_expect_eq(nb_get_stats().cached_bytes, 0);
  nb_reset_stats();
  for (int i = 0; i < 3; i++) {
    nbi_buffer *x = nbi_buffer_alloc(0, 4096);
    cr_assert_not_null(x);
    nbi_buffer_release(x);
  }
  nb_stats s = nb_get_stats();
  cr_expect_eq(s.buffer_allocs, 3);
  cr_expect_eq(s.buffer_cache_hits, 0, "cap 0 disables caching");
  cr_expect_eq(s.cached_bytes, 0);
}

Test(alloc, trim_empties_the_cache) {
  nbi_buffer_cache_set_cap((size_t)1 << 24);
  nbi_buffer *b[6];
  for (int i = 0; i < 6; i++)
    cr_assert_not_null(b[i] = nbi_buffer_alloc(0, (size_t)1000 << i));
  release_all(b, 6);
  cr_expect_gt(nb_get_stats().cached_bytes, 0);
  nbi_buffer_cache_trim();
  cr_expect_eq(nb_get_stats().cached_bytes, 0);
  nb_reset_stats();
  nbi_buffer *x = nbi_buffer_alloc(0, 1000);
  cr_assert_not_null(x);
  cr_expect_eq(nb_get_stats().buffer_cache_hits, 0);
  nbi_buffer_release(x);
}

static void *front_thread(void *arg) {
  (void)arg;
  nbi_buffer *b = nbi_buffer_alloc(0, 2000);
  if (b) nbi_buffer_release(b); /* into this thread's front */
  return b;
}

/* Each thread keeps its last few small released blocks (up to 64 KiB each) in
 * a front the shared lists do not count; its next requests of their class
 * take them back, and its exit hands them to the shared lists. */
Test(alloc, thread_front_serves_small_blocks_and_flushes_at_exit) {
  nbi_buffer_cache_set_cap((size_t)1 << 30);
  nbi_buffer_cache_trim();
  nb_reset_stats();
  nbi_buffer *a = nbi_buffer_alloc(0, 1000);
  cr_assert_not_null(a);
  void *data = a->data;
  nbi_buffer_release(a);
  nb_stats s = nb_get_stats();
  cr_expect_eq(s.cached_bytes, 0, "in the front, not the shared lists");
  nbi_buffer *b = nbi_buffer_alloc(0, 900); /* same class */
  cr_assert_not_null(b);
  cr_expect_eq(b->data, data);
  cr_expect_eq(b->nbytes, 900);
  s = nb_get_stats();
  cr_expect_eq(s.buffer_allocs, 2);
  cr_expect_eq(s.buffer_cache_hits, 1);
  nbi_buffer_release(b);

  /* a block over 64 KiB goes to the shared lists */
  nbi_buffer *big = nbi_buffer_alloc(0, 100000);
  cr_assert_not_null(big);
  nbi_buffer_release(big);
  cr_expect_eq(nb_get_stats().cached_bytes, nbi_buffer_class_bytes(100000));

  /* another thread's front reaches the shared lists when it exits */
  pthread_t t;
  void *r = NULL;
  cr_assert_eq(pthread_create(&t, NULL, front_thread, NULL), 0);
  cr_assert_eq(pthread_join(t, &r), 0);
  cr_assert_not_null(r);
  cr_expect_eq(nb_get_stats().cached_bytes,
               nbi_buffer_class_bytes(100000) + nbi_buffer_class_bytes(2000));
  nbi_buffer *c = nbi_buffer_alloc(0, 2000); /* from the shared list */
  cr_assert_not_null(c);
  cr_expect_eq(nb_get_stats().cached_bytes, nbi_buffer_class_bytes(100000));
  nbi_buffer_release(c);

  /* trim empties this thread's front too; a cap under 64 MiB turns it off */
  nbi_buffer_cache_trim();
  cr_expect_eq(nb_get_stats().cached_bytes, 0);
  nb_reset_stats();
  nbi_buffer *d = nbi_buffer_alloc(0, 1000);
  cr_assert_not_null(d);
  cr_expect_eq(nb_get_stats().buffer_cache_hits, 0, "trimmed");
  nbi_buffer_cache_set_cap((size_t)1 << 20);
  nbi_buffer_release(d);
  cr_expect_eq(nb_get_stats().cached_bytes, nbi_buffer_class_bytes(1000), "shared list");
  nbi_buffer_cache_set_cap(0);
  cr_expect_eq(nb_get_stats().cached_bytes, 0);
}

/* NABLA_CACHE_BYTES is read at the first request of the process (each test runs
 * in a fresh one). */
static void env_off(void) {
  setenv("NABLA_CACHE_BYTES", "0", 1);
  tc_setup();
}
static void env_8k(void) {
  setenv("NABLA_CACHE_BYTES", "8K", 1);
  tc_setup();
}

Test(alloc, env_zero_disables_the_cache, .init = env_off, .fini = tc_teardown) {
  nb_tensor *x = nb_ones(NB_SHAPE(1000), NB_F32);
  for (int i = 0; i < 3; i++) {
    nb_tensor *y = nb_mul_scalar(x, 2.0);
    cr_assert_float_eq(nb_item(nb_sum(y, NB_ALL, false)), 2000.0, 1e-9);
  }
  nb_stats s = nb_get_stats();
  cr_expect_gt(s.buffer_allocs, 3);
  cr_expect_eq(s.buffer_cache_hits, 0);
  cr_expect_eq(s.cached_bytes, 0);
  cr_expect_eq(nbi_buffer_cache_set_cap(0), 0, "the cap read from the environment");
}

Test(alloc, env_sets_the_cap, .init = env_8k, .fini = tc_teardown) {
  nbi_buffer *b[3];
  for (int i = 0; i < 3; i++)
    cr_assert_not_null(b[i] = nbi_buffer_alloc(0, 4096));
  release_all(b, 3);
  cr_expect_eq(nb_get_stats().cached_bytes, 8192);
  cr_expect_eq(nbi_buffer_cache_set_cap(0), 8192);
}

/* 50 functional SGD steps of the README MLP; losses[i] after step i, the final
 * parameters into w (sizes 32+32+2048+64+2048+32+32+1). Returns, over steps
 * 5..49, the buffer requests and the cache hits. */
static void train(double *losses, double *w, uint64_t *requests, uint64_t *hits) {
  nb_scope_begin();
  nb_seed(0);
  nb_tensor *p[10];
  readme_mlp_init(p);
  nb_fn *f = nb_fn_create(readme_mlp_loss_fn, NULL, 10, 1);
  nb_fn *vg = nb_value_and_grad(f, NB_AXES(0, 1, 2, 3, 4, 5, 6, 7));
  nb_stats s0 = {0};
  for (int step = 0; step < 50; step++) {
    if (step == 5) s0 = nb_get_stats();
    nb_scope_begin();
    nb_tensor *o[9];
    cr_assert_eq(nb_call(vg, p, o), NB_OK);
    for (int i = 0; i < 8; i++)
      nb_assign(p[i], nb_sub(p[i], nb_mul_scalar(o[1 + i], 0.01)));
    losses[step] = nb_item(o[0]);
    nb_scope_end();
  }
  nb_stats s1 = nb_get_stats();
  *requests = s1.buffer_allocs - s0.buffer_allocs;
  *hits = s1.buffer_cache_hits - s0.buffer_cache_hits;
  int64_t k = 0;
  for (int i = 0; i < 8; i++) {
    double *v = tc_read(p[i]);
    for (int64_t j = 0; j < nb_numel(p[i]); j++)
      w[k++] = v[j];
    free(v);
  }
  nb_fn_release(vg);
  nb_fn_release(f);
  nb_scope_end();
}

Test(alloc, training_loop_runs_without_system_allocations) {
  enum { NW = 32 + 32 + 2048 + 64 + 2048 + 32 + 32 + 1 };
  static double loss_off[50], loss_on[50], w_off[NW], w_on[NW];
  uint64_t req, hits;
  nbi_buffer_cache_set_cap(0);
  train(loss_off, w_off, &req, &hits);
  cr_expect_gt(req, 0);
  cr_expect_eq(hits, 0);

  nbi_buffer_cache_set_cap((size_t)1 << 30);
  train(loss_on, w_on, &req, &hits);
  cr_expect_gt(req, 45 * 8, "at least one buffer per update per step");
  cr_expect_eq(hits, req, "after warm-up every buffer comes from the cache");
  cr_expect_lt(loss_on[49], loss_on[0], "the loss goes down");
  for (int i = 0; i < 50; i++)
    cr_expect_float_eq(loss_on[i], loss_off[i], 1e-6 * fabs(loss_off[i]), "step %d", i);
  for (int i = 0; i < NW; i++)
    cr_expect_float_eq(w_on[i], w_off[i], 1e-6 * (1 + fabs(w_off[i])), "w[%d]", i);
}
