/* test/test_rows_large.c — fused row groups whose stored rows go out through
 * streaming stores (16 MiB and more, k_elementwise.c) compute the bits of the
 * unfused kernels and match a reference in double; row sums (k_reduce.c
 * row_sum) give the same bits on every ISA and match a sum in long double. */
#include "common.h"

#include "../src/backends/cpu/vmath.h"

TestSuite(rows_large, .init = tc_setup, .fini = tc_teardown);

/* layer_norm of [4096, 1024] f32 (a 16 MiB result), and of the same rows with
 * the centred rows held too (two streamed members): fused in one kernel, equal
 * to the unfused kernels, close to a reference in double. */
Test(rows_large, streamed_layer_norm_equals_unfused) {
  int64_t rows = 4096, n = 1024;
  uint64_t seed = 11;
  double *x = malloc(sizeof *x * (size_t)(rows * n)), w[1024], b[1024];
  tc_fill(x, rows * n, -3, 3, &seed);
  tc_fill(w, n, 0.5, 1.5, &seed);
  tc_fill(b, n, -1, 1, &seed);
  tc_round_to(x, rows * n, NB_F32);
  tc_round_to(w, n, NB_F32);
  tc_round_to(b, n, NB_F32);
  double *ref = malloc(sizeof *ref * (size_t)(rows * n));
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * n;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; j++)
      mean += xr[j];
    mean /= (double)n;
    for (int64_t j = 0; j < n; j++)
      var += (xr[j] - mean) * (xr[j] - mean);
    var /= (double)n;
    for (int64_t j = 0; j < n; j++)
      ref[r * n + j] = (xr[j] - mean) / sqrt(var + 1e-5) * w[j] + b[j];
  }
  nb_shape xs = {2, {rows, n}}, ps = {1, {n}};
  nb_tensor *xt = tc_tensor(x, xs, NB_F32), *wt = tc_tensor(w, ps, NB_F32),
            *bt = tc_tensor(b, ps, NB_F32);
  for (int held = 0; held < 2; held++) {
    double *res[2][2] = {{NULL, NULL}, {NULL, NULL}};
    for (int fused = 0; fused < 2; fused++) {
      nbi_set_fusion(fused);
      nb_scope_begin();
      nb_tensor *y = nb_layer_norm(xt, wt, bt, 1e-5);
      nb_tensor *xc = nb_sub(xt, nb_mean(xt, NB_AXES(-1), true));
      nb_tensor *outs[2] = {y, xc};
      nb_reset_stats();
      cr_assert_eq(nb_eval(outs, 1 + held), NB_OK, "%s", nb_last_error());
      if (fused && !held)
        cr_assert_eq(nb_get_stats().kernels_run, 1, "%llu kernels",
                     (unsigned long long)nb_get_stats().kernels_run);
      res[fused][0] = tc_read(y);
      if (held) res[fused][1] = tc_read(xc);
      nb_scope_end();
    }
    nbi_set_fusion(true);
    for (int k = 0; k <= held; k++) {
      cr_assert(memcmp(res[0][k], res[1][k], sizeof(double) * (size_t)(rows * n)) == 0,
                "held %d, output %d: fused differs from unfused", held, k);
      free(res[0][k]);
    }
    for (int64_t i = 0; i < rows * n; i++)
      cr_assert(fabs(res[1][0][i] - ref[i]) <= 1e-4 * (1 + fabs(ref[i])), "y[%lld] %g, want %g",
                (long long)i, res[1][0][i], ref[i]);
    free(res[1][0]);
    free(res[1][1]);
  }
  free(x);
  free(ref);
}

/* Row sums (and var's squared deviations) over rows of lengths around the
 * lane count: the same bits with every ISA and close to a sum
 * in long double. */
Test(rows_large, row_sums_same_bits_on_every_isa) {
  static const int64_t lens[] = {8, 31, 32, 33, 100, 1000, 4099};
  uint64_t seed = 5;
  nbi_isa was = nbi_isa_active();
  for (size_t c = 0; c < sizeof lens / sizeof *lens; c++) {
    int64_t rows = 3, n = lens[c];
    for (int k = 0; k < 2; k++) {
      nb_dtype dt = k ? NB_F64 : NB_F32;
      double *x = tc_rand_floats(rows * n, dt, &seed);
      nb_tensor *xt = tc_tensor(x, (nb_shape){2, {rows, n}}, dt);
      double *first[2] = {NULL, NULL};
      for (int isa = NBI_ISA_PORTABLE; isa < NBI_ISA_COUNT; isa++) {
        nbi_isa_select((nbi_isa)isa);
        nb_scope_begin();
        nb_tensor *s[2] = {nb_sum(xt, NB_AXES(-1), false), nb_var(xt, NB_AXES(-1), false)};
        cr_assert_eq(nb_eval(s, 2), NB_OK, "%s", nb_last_error());
        for (int q = 0; q < 2; q++) {
          double *got = tc_read(s[q]);
          if (!first[q]) {
            first[q] = got;
            continue;
          }
          cr_assert(memcmp(got, first[q], sizeof(double) * (size_t)rows) == 0,
                    "n %lld %s op %d: ISA %s differs", (long long)n, nb_dtype_name(dt), q,
                    nbi_isa_name((nbi_isa)isa));
          free(got);
        }
        nb_scope_end();
      }
      nbi_isa_select(was);
      for (int64_t r = 0; r < rows; r++) {
        long double want = 0;
        for (int64_t j = 0; j < n; j++)
          want += x[r * n + j];
        double tol = (dt == NB_F32 ? 1e-6 : 1e-13) * (double)n;
        cr_assert(fabsl(first[0][r] - want) <= tol, "n %lld %s row %lld: sum %.17g, want %.17Lg",
                  (long long)n, nb_dtype_name(dt), (long long)r, first[0][r], want);
      }
      free(first[0]);
      free(first[1]);
      free(x);
    }
  }
}
