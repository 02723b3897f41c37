/* test/mpi/test_mpi.c — the job and the host collectives between its processes
 * (src/backends/mpi), run by `make MPI=1 test-mpi` under mpirun with 2 and 4
 * processes. A standalone binary (test/mini_criterion.h): Criterion's runner
 * forks, which MPI processes must not. Every rank checks every value against
 * what it computes alone from the ranks' known inputs.
 *   test_mpi             the collectives, signature mismatches
 *   test_mpi deadline    rank 1 never arrives: rank 0 must report it and abort
 *                        the job within NABLA_COLLECTIVE_TIMEOUT_S */
#define TC_STANDALONE
#define TC_OWN_MAIN
#include <unistd.h>

#include "../../src/backends/mpi/mpi_be.h"
#include "../../src/core/dist.h"
#include "../common.h"

static int R, N; /* this rank, the job's size */

/* rank r's i-th value */
static double val(int r, int64_t i) {
  return (double)((r + 1) * 10 + (i % 7)) - 3.0 * (double)(i % 3);
}

TestSuite(mpi);

Test(mpi, ranks) {
  cr_assert_eq(nb_world_size(), N);
  cr_assert(R >= 0 && R < N);
  cr_assert(nb_local_rank() >= 0 && nb_local_rank() < N);
  int64_t mine = R, all[64];
  cr_assert_eq(nbi_mpi_allgather(&mine, all, 1, NB_I64), NB_OK, "%s", nb_last_error());
  for (int r = 0; r < N; r++)
    cr_assert_eq(all[r], r);
  char want[48];
  snprintf(want, sizeof want, "[rank %d/%d] ", R, N);
  cr_assert(N == 1 ? !*nb_rank_prefix() : strcmp(nb_rank_prefix(), want) == 0, "%s",
            nb_rank_prefix());
}

Test(mpi, all_reduce_every_dtype_and_op) {
  const nb_dtype dts[] = {NB_F32, NB_F64, NB_I32, NB_I64, NB_F16, NB_BF16};
  enum { n = 1000 };
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (int op = NBI_MPI_SUM; op <= NBI_MPI_MIN; op++) {
      nb_dtype dt = dts[d];
      char buf[n * 8];
      for (int64_t i = 0; i < n; i++)
        nbi_store_f64(buf, dt, i, val(R, i));
      cr_assert_eq(nbi_mpi_allreduce(buf, n, dt, op), NB_OK, "%s", nb_last_error());
      for (int64_t i = 0; i < n; i++) {
        double want = op == NBI_MPI_SUM ? 0 : val(0, i);
        for (int r = 0; r < N; r++) {
          char one[8];
          nbi_store_f64(one, dt, 0, val(r, i)); /* each rank's value as stored */
          double v = nbi_load_f64(one, dt, 0);
          want = op == NBI_MPI_SUM ? want + v : op == NBI_MPI_MAX ? fmax(want, v) : fmin(want, v);
        }
        char w[8];
        nbi_store_f64(w, dt, 0, want); /* rounded once */
        cr_assert_eq(nbi_load_f64(buf, dt, i), nbi_load_f64(w, dt, 0), "%s op %d [%lld]",
                     nb_dtype_name(dt), op, (long long)i);
      }
    }
}

Test(mpi, gather_scatter_all_to_all_permute) {
  enum { n = 37 };
  double send[64 * n], recv[64 * n];
  for (int64_t i = 0; i < N * n; i++)
    send[i] = val(R, i);
  cr_assert_eq(nbi_mpi_allgather(send, recv, n, NB_F64), NB_OK, "%s", nb_last_error());
  for (int r = 0; r < N; r++)
    for (int64_t i = 0; i < n; i++)
      cr_assert_eq(recv[r * n + i], val(r, i));
  cr_assert_eq(nbi_mpi_reduce_scatter(send, recv, n, NB_F64, NBI_MPI_SUM), NB_OK, "%s",
               nb_last_error());
  for (int64_t i = 0; i < n; i++) {
    double want = 0;
    for (int r = 0; r < N; r++)
      want += val(r, R * n + i);
    cr_assert_eq(recv[i], want);
  }
  cr_assert_eq(nbi_mpi_alltoall(send, recv, n, NB_F64), NB_OK, "%s", nb_last_error());
  for (int r = 0; r < N; r++)
    for (int64_t i = 0; i < n; i++)
      cr_assert_eq(recv[r * n + i], val(r, R * n + i));
  /* a ring: rank r sends to r + 1 */
  for (int64_t i = 0; i < n; i++)
    recv[i] = -1;
  int dest = N > 1 ? (R + 1) % N : 0, src = N > 1 ? (R + N - 1) % N : 0;
  cr_assert_eq(nbi_mpi_permute(send, recv, n, NB_F64, dest, src), NB_OK, "%s", nb_last_error());
  for (int64_t i = 0; i < n; i++)
    cr_assert_eq(recv[i], val(src, i));
}

static int handled;
static char handled_msg[1024];
static void record(nb_status s, const char *msg, void *u) {
  (void)u;
  handled += s == NB_ERR_DISTRIBUTED;
  snprintf(handled_msg, sizeof handled_msg, "%s", msg);
}

/* Rank 0 reduces 4 elements, the others 5: every rank reports it. */
Test(mpi, a_mismatch_is_reported_on_every_rank) {
  if (N == 1) return;
  nb_on_distributed_error(record, NULL);
  float buf[5] = {1, 2, 3, 4, 5};
  nb_status st = nbi_mpi_allreduce(buf, R == 0 ? 4 : 5, NB_F32, NBI_MPI_SUM);
  cr_assert_eq(st, NB_ERR_DISTRIBUTED);
  cr_assert_eq(handled, 1);
  cr_assert(strstr(handled_msg, "all_reduce") && strstr(handled_msg, "differ"), "%s", handled_msg);
  cr_assert_eq(buf[0], 1.0f, "the data never moved");
  nb_clear_error();
  nb_on_distributed_error(NULL, NULL);
  /* the job goes on */
  cr_assert_eq(nbi_mpi_allreduce(buf, 5, NB_F32, NBI_MPI_SUM), NB_OK, "%s", nb_last_error());
  cr_assert_eq(buf[4], 5.0f * (float)N);
}

/* The exchange moves bytes: its mismatch says so (not "elements of bool"). */
Test(mpi, an_exchange_mismatch_counts_bytes) {
  if (N == 1) return;
  nb_on_distributed_error(record, NULL);
  int64_t *c = calloc((size_t)N, sizeof *c);
  char buf[1];
  nb_status st = nbi_dist_exchange(buf, c, buf, c, R == 0 ? 8 : 9);
  cr_assert_eq(st, NB_ERR_DISTRIBUTED);
  cr_assert(strstr(handled_msg, "exchange (call") && strstr(handled_msg, "bytes") &&
                !strstr(handled_msg, "bool"),
            "%s", handled_msg);
  free(c);
  nb_clear_error();
  nb_on_distributed_error(NULL, NULL);
}

/* A group's collective (nbi_dist_start on every rank's group): a mismatch is
 * reported on every member, then the group goes on; all-reduce, all-gather
 * and all-to-all of uneven parts and a ring permute give MPI's values. */
Test(mpi, group_calls) {
  if (N == 1) return;
  int *ranks = malloc(sizeof *ranks * (size_t)N);
  int64_t *sc = malloc(sizeof *sc * (size_t)N), *rc = malloc(sizeof *rc * (size_t)N);
  for (int i = 0; i < N; i++)
    ranks[i] = N - 1 - i; /* group order: reversed ranks */
  int me = N - 1 - R;
  nb_on_distributed_error(record, NULL);
  nbi_dist_req *q;
  nbi_dist_call c = {.kind = NBI_DIST_ALL_REDUCE,
                     .ranks = ranks,
                     .n = N,
                     .dtype = NB_I64,
                     .count = 2,
                     .sig = R == 0 ? 2 : 3};
  /* a small all-reduce sends its data with the signature: the mismatch shows at the wait */
  nb_status st = nbi_dist_start(&c, nbi_dist_buffer(16), &q);
  if (st == NB_OK) {
    st = nbi_dist_wait(q);
    nbi_dist_free(q);
  }
  cr_assert_eq(st, NB_ERR_DISTRIBUTED);
  cr_assert(strstr(handled_msg, "all_reduce") && strstr(handled_msg, "differ"), "%s", handled_msg);
  nb_clear_error();
  nb_on_distributed_error(NULL, NULL);
  /* all-reduce (max) */
  int64_t *v = nbi_dist_buffer(16);
  v[0] = R, v[1] = -R;
  c.sig = 2, c.op = NBI_DIST_MAX;
  cr_assert_eq(nbi_dist_start(&c, v, &q), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nbi_dist_wait(q), NB_OK, "%s", nb_last_error());
  int64_t *got = nbi_dist_recv(q);
  cr_assert(got[0] == N - 1 && got[1] == 0, "%lld %lld", (long long)got[0], (long long)got[1]);
  nbi_dist_free(q);
  /* all-reduce (sum) past the one-message size (two rounds of messages), and under it */
  int64_t cnts[] = {4096, 4099, 3}; /* two rounds (chunks of any size), one message */
  for (int t = 0; t < 3; t++) {
    int64_t cnt = cnts[t];
    v = nbi_dist_buffer(sizeof *v * (size_t)cnt);
    for (int64_t i = 0; i < cnt; i++)
      v[i] = R * 1000 + i;
    c.count = cnt, c.sig = cnt * N, c.op = NBI_DIST_SUM;
    cr_assert_eq(nbi_dist_start(&c, v, &q), NB_OK, "%s", nb_last_error());
    cr_assert_eq(nbi_dist_wait(q), NB_OK, "%s", nb_last_error());
    got = nbi_dist_recv(q);
    for (int64_t i = 0; i < cnt; i++)
      cr_assert_eq(got[i], 1000 * (int64_t)N * (N - 1) / 2 + N * i, "%lld at %lld",
                   (long long)got[i], (long long)i);
    nbi_dist_free(q);
  }
  c.count = 2;
  /* all-gather: member i sends i + 1 elements of value i */
  int64_t total = 0;
  for (int i = 0; i < N; i++)
    total += rc[i] = i + 1;
  v = nbi_dist_buffer(sizeof *v * (size_t)(me + 1));
  for (int i = 0; i <= me; i++)
    v[i] = me;
  c = (nbi_dist_call){.kind = NBI_DIST_ALL_GATHER,
                      .ranks = ranks,
                      .n = N,
                      .dtype = NB_I64,
                      .rcount = rc,
                      .sig = total};
  cr_assert_eq(nbi_dist_start(&c, v, &q), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nbi_dist_wait(q), NB_OK, "%s", nb_last_error());
  got = nbi_dist_recv(q);
  for (int i = 0, k = 0; i < N; i++)
    for (int j = 0; j <= i; j++, k++)
      cr_assert_eq(got[k], i, "all_gather [%d]", k);
  nbi_dist_free(q);
  /* all-to-all: member i sends j + 1 elements of 10 i + j to member j */
  int64_t ns = 0;
  for (int j = 0; j < N; j++)
    ns += sc[j] = j + 1, rc[j] = me + 1;
  v = nbi_dist_buffer(sizeof *v * (size_t)ns);
  for (int j = 0, k = 0; j < N; j++)
    for (int e = 0; e <= j; e++)
      v[k++] = 10 * me + j;
  c = (nbi_dist_call){.kind = NBI_DIST_ALL_TO_ALL,
                      .ranks = ranks,
                      .n = N,
                      .dtype = NB_I64,
                      .scount = sc,
                      .rcount = rc,
                      .sig = 7};
  cr_assert_eq(nbi_dist_start(&c, v, &q), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nbi_dist_wait(q), NB_OK, "%s", nb_last_error());
  got = nbi_dist_recv(q);
  for (int i = 0, k = 0; i < N; i++)
    for (int e = 0; e <= me; e++, k++)
      cr_assert_eq(got[k], 10 * i + me, "all_to_all [%d]", k);
  nbi_dist_free(q);
  /* a ring: member i sends to i + 1 */
  v = nbi_dist_buffer(sizeof *v);
  v[0] = 100 + me;
  rc[0] = 1;
  c = (nbi_dist_call){.kind = NBI_DIST_PERMUTE,
                      .ranks = ranks,
                      .n = N,
                      .dtype = NB_I64,
                      .count = 1,
                      .rcount = rc,
                      .dest = (me + 1) % N,
                      .src = (me + N - 1) % N,
                      .sig = N};
  cr_assert_eq(nbi_dist_start(&c, v, &q), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nbi_dist_wait(q), NB_OK, "%s", nb_last_error());
  cr_assert_eq(*(int64_t *)nbi_dist_recv(q), 100 + (me + N - 1) % N);
  nbi_dist_free(q);
  cr_assert_eq(nbi_dist_start(&c, memset(nbi_dist_buffer(8), 0, 8), &q), NB_OK, "%s",
               nb_last_error());
  nbi_dist_free(q); /* freed unwaited: waits first */
  free(ranks), free(sc), free(rc);
}

int main(int argc, char **argv) {
  if (nb_init_distributed(&argc, &argv) != NB_OK) {
    fprintf(stderr, "%s\n", nb_last_error());
    return 2;
  }
  R = nb_rank(), N = nb_world_size();
  if (argc > 1 && strcmp(argv[1], "deadline") == 0) {
    if (R == 1) sleep(60); /* never arrives in time */
    float x = 1;
    nbi_mpi_allreduce(&x, 1, NB_F32, NBI_MPI_SUM); /* rank 0 aborts the job here */
    return 0;
  }
  int rc = tcm_main();
  nb_finalize();
  if (R == 0) fprintf(stderr, "test_mpi: %d ranks: %s\n", N, rc ? "FAILED" : "ok");
  return rc;
}

/* Staging buffers (dist.h): a freed buffer comes back for the next request of
 * a similar size (at most twice as large as asked), never for a larger one,
 * and its memory is whole. */
Test(mpi, staging_buffers_are_reused) {
  char *a = nbi_dist_buffer(1 << 20);
  cr_assert(a != NULL);
  memset(a, 7, 1 << 20);
  nbi_dist_buffer_free(a);
  char *b = nbi_dist_buffer((1 << 20) - 100);
  cr_assert_eq(b, a, "a freed 1 MiB buffer serves a request of 1 MiB - 100");
  cr_assert_eq(b[(1 << 20) - 101], 7);
  char *c = nbi_dist_buffer(3 << 20);
  cr_assert(c != NULL && c != a);
  memset(c, 1, 3 << 20);
  nbi_dist_buffer_free(b);
  char *d = nbi_dist_buffer(1000); /* far smaller: a fresh buffer, not the 1 MiB one */
  cr_assert(d != NULL && d != a);
  nbi_dist_buffer_free(c);
  nbi_dist_buffer_free(d);
  nbi_dist_buffer_free(NULL);
}
