/* test/test_half.c — f16 and bf16 accumulate in f32 or wider (issue 14.2), as
 * PyTorch and Flax do: layer_norm / rms_norm statistics of |x| >= 256 (whose
 * squares overflow f16) give ±1, not 0; sums, means, cumulative sums, dot
 * products, convolutions, var/std, logsumexp, softmax and cross-entropy of
 * many values or of large values are the float64 result of the dtype's
 * inputs, rounded once (within one rounding of the dtype). */
#include "common.h"

TestSuite(half, .init = tc_setup, .fini = tc_teardown);

static const nb_dtype halves[2] = {NB_F16, NB_BF16};

/* Relative size of one rounding: 2^-11 for f16 (11-bit significand), 2^-8
 * for bf16; a result rounded once from the exact one is within that. */
static double rounding(nb_dtype dt) { return dt == NB_F16 ? 0x1p-11 : 0x1p-8; }

/* Asserts got is ref rounded once to dt (relative error within one rounding,
 * with room for the f32 steps before it; f16's subnormals, below 2^-14, are
 * 2^-24 apart). */
static void assert_rounded(const double *got, const double *ref, int64_t n, nb_dtype dt,
                           const char *what) {
  for (int64_t i = 0; i < n; i++)
    cr_assert(fabs(got[i] - ref[i]) <= 1.01 * fmax(rounding(dt) * fabs(ref[i]), 0x1p-25),
              "%s %s element %lld: got %.9g, exact %.9g", nb_dtype_name(dt), what, (long long)i,
              got[i], ref[i]);
}

/* n values uniform in [lo, hi) rounded to dt. */
static double *values(int64_t n, double lo, double hi, nb_dtype dt, uint64_t seed) {
  double *x = malloc(sizeof(double) * (size_t)n);
  tc_fill(x, n, lo, hi, &seed);
  tc_round_to(x, n, dt);
  return x;
}

/* Rows of d values of magnitude 256..1000 with random signs (squares and
 * variances beyond f16's 65504). */
static double *large_rows(int64_t rows, int64_t d, nb_dtype dt) {
  double *x = values(rows * d, 256, 1000, dt, 7);
  uint64_t s = 11;
  for (int64_t i = 0; i < rows * d; i++)
    if (tc_uniform(&s, 0, 1) < 0.5) x[i] = -x[i];
  return x;
}

/* (x - mean) / sqrt(var + eps) (rms: x / sqrt(mean(x^2) + eps)) of each row, in double. */
static void norm_ref(const double *x, int64_t rows, int64_t d, bool rms, double *y) {
  for (int64_t r = 0; r < rows; r++) {
    const double *xr = x + r * d;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; j++)
      mean += xr[j] / (double)d;
    if (rms) mean = 0;
    for (int64_t j = 0; j < d; j++)
      var += (xr[j] - mean) * (xr[j] - mean) / (double)d;
    for (int64_t j = 0; j < d; j++)
      y[r * d + j] = (xr[j] - mean) / sqrt(var + 1e-5);
  }
}

Test(half, layer_norm_and_rms_norm_of_large_values_are_normalized) {
  int64_t rows = 3, d = 2;
  for (int k = 0; k < 2; k++) {
    nb_dtype dt = halves[k];
    double x[6] = {-300, 300, -500, 500, 256, -1000}, y[6];
    tc_round_to(x, 6, dt);
    nb_tensor *t = tc_tensor(x, NB_SHAPE(rows, d), dt);
    double *ln = tc_read(nb_layer_norm(t, NULL, NULL, 1e-5)),
           *rn = tc_read(nb_rms_norm(t, NULL, 1e-5));
    for (int i = 0; i < 6; i++) {
      cr_assert_eq(ln[i], x[i] > 0 ? 1 : -1, "%s layer_norm element %d: %g (0 when var overflows)",
                   nb_dtype_name(dt), i, ln[i]);
    }
    norm_ref(x, rows, d, true, y);
    assert_rounded(rn, y, 6, dt, "rms_norm");
    free(ln), free(rn);
  }
}

Test(half, layer_norm_of_large_rows_matches_float64) {
  int64_t rows = 8, d = 96;
  for (int k = 0; k < 2; k++) {
    nb_dtype dt = halves[k];
    double *x = large_rows(rows, d, dt), *y = malloc(sizeof(double) * (size_t)(rows * d));
    nb_tensor *t = tc_tensor(x, NB_SHAPE(rows, d), dt);
    for (int rms = 0; rms < 2; rms++) {
      norm_ref(x, rows, d, rms, y);
      nb_tensor *out = rms ? nb_rms_norm(t, NULL, 1e-5) : nb_layer_norm(t, NULL, NULL, 1e-5);
      cr_assert_eq(nb_dtype_of(out), dt);
      double *got = tc_read(out);
      assert_rounded(got, y, rows * d, dt, rms ? "rms_norm" : "layer_norm");
      free(got);
    }
    free(x), free(y);
  }
}

/* The gradient of sum(layer_norm(x) * g) in f16/bf16 is the f32 one rounded:
 * finite where the f16 statistics overflowed. */
Test(half, layer_norm_gradient_of_large_values_matches_f32) {
  int64_t rows = 4, d = 32, n = rows * d;
  for (int k = 0; k < 2; k++) {
    nb_dtype dt = halves[k];
    double *x = large_rows(rows, d, dt), *g = values(n, -1, 1, dt, 3);
    double *res[2];
    for (int wide = 0; wide < 2; wide++) {
      nb_dtype ct = wide ? NB_F32 : dt;
      nb_tensor *xt = nb_set_requires_grad(tc_tensor(x, NB_SHAPE(rows, d), ct), true);
      nb_tensor *loss =
          nb_sum(nb_mul(nb_layer_norm(xt, NULL, NULL, 1e-5), tc_tensor(g, NB_SHAPE(rows, d), ct)),
                 NB_ALL, false);
      cr_assert_eq(nb_backward(loss), NB_OK, "%s", nb_last_error());
      res[wide] = tc_read(nb_grad_of(xt));
    }
    double scale = 0;
    for (int64_t i = 0; i < n; i++)
      scale = fmax(scale, fabs(res[1][i]));
    for (int64_t i = 0; i < n; i++)
      cr_assert(fabs(res[0][i] - res[1][i]) <= 2 * rounding(dt) * scale,
                "%s element %lld: %g vs f32 %g", nb_dtype_name(dt), (long long)i, res[0][i],
                res[1][i]);
    free(x), free(g), free(res[0]), free(res[1]);
  }
}

/* Sums, means and cumulative sums of 50000 values (far past f16's 2048 and
 * bf16's 256, where a same-dtype accumulator stops growing). */
Test(half, sums_of_many_values_round_once) {
  int64_t n = 50000;
  for (int k = 0; k < 2; k++) {
    nb_dtype dt = halves[k];
    double *x = values(n, 0, 1, dt, 5), *pre = malloc(sizeof(double) * (size_t)n), s = 0;
    for (int64_t i = 0; i < n; i++)
      pre[i] = s += x[i];
    nb_tensor *t = tc_tensor(x, NB_SHAPE(n), dt);
    double *sum = tc_read(nb_sum(t, NB_ALL, false)), *mean = tc_read(nb_mean(t, NB_ALL, false));
    double *cum = tc_read(nb_cumsum(t, 0)), want_mean = s / (double)n;
    assert_rounded(sum, &s, 1, dt, "sum");
    assert_rounded(mean, &want_mean, 1, dt, "mean");
    assert_rounded(cum, pre, n, dt, "cumsum");
    /* rows: [50, 1000] summed along each axis */
    nb_tensor *m = nb_reshape(t, NB_SHAPE(50, 1000));
    double *rs = tc_read(nb_sum(m, NB_AXES(1), false)), *cs = tc_read(nb_sum(m, NB_AXES(0), false));
    double rref[50] = {0}, cref[1000] = {0};
    for (int64_t i = 0; i < n; i++)
      rref[i / 1000] += x[i], cref[i % 1000] += x[i];
    assert_rounded(rs, rref, 50, dt, "row sums");
    assert_rounded(cs, cref, 1000, dt, "column sums");
    free(x), free(pre), free(sum), free(mean), free(cum), free(rs), free(cs);
  }
}

/* Dot products of 20000 terms through matmul and einsum, and a convolution
 * with 512 * 3 * 3 taps per output. */
Test(half, products_accumulate_in_f32) {
  int64_t n = 20000;
  for (int k = 0; k < 2; k++) {
    nb_dtype dt = halves[k];
    double *a = values(n, 0, 1, dt, 21), *b = values(n, 0, 1, dt, 22), dot = 0;
    for (int64_t i = 0; i < n; i++)
      dot += a[i] * b[i];
    nb_tensor *ta = tc_tensor(a, NB_SHAPE(n), dt), *tb = tc_tensor(b, NB_SHAPE(n), dt);
    double *mm = tc_read(nb_matmul(nb_reshape(ta, NB_SHAPE(1, n)), nb_reshape(tb, NB_SHAPE(n, 1))));
    double *es = tc_read(nb_einsum("i,i->", (nb_tensor *[]){ta, tb}, 2));
    assert_rounded(mm, &dot, 1, dt, "matmul");
    assert_rounded(es, &dot, 1, dt, "einsum");
    nb_tensor *x =
        nb_reshape(nb_slice(ta, (int64_t[]){0}, (int64_t[]){4608}, NULL), NB_SHAPE(1, 512, 3, 3));
    nb_tensor *w =
        nb_reshape(nb_slice(tb, (int64_t[]){0}, (int64_t[]){4608}, NULL), NB_SHAPE(1, 512, 3, 3));
    double conv = 0, *cv = tc_read(nb_conv2d(x, w, NULL, NULL));
    for (int64_t i = 0; i < 4608; i++)
      conv += a[i] * b[i];
    assert_rounded(cv, &conv, 1, dt, "conv2d");
    free(a), free(b), free(mm), free(es), free(cv);
  }
}

/* var and std of large values and of values with a large mean; logsumexp,
 * softmax, log_softmax and cross-entropy of large logits. */
Test(half, statistics_and_softmax_of_large_values) {
  int64_t n = 4096;
  for (int k = 0; k < 2; k++) {
    nb_dtype dt = halves[k];
    double *x = large_rows(1, n, dt), *c = values(n, 1000, 1004, dt, 9);
    double m = 0, v = 0, mc = 0, vc = 0;
    for (int64_t i = 0; i < n; i++)
      m += x[i] / (double)n, mc += c[i] / (double)n;
    for (int64_t i = 0; i < n; i++)
      v += (x[i] - m) * (x[i] - m) / (double)n, vc += (c[i] - mc) * (c[i] - mc) / (double)n;
    double sd = sqrt(v), sdc = sqrt(vc);
    nb_tensor *tx = tc_tensor(x, NB_SHAPE(n), dt), *tc = tc_tensor(c, NB_SHAPE(n), dt);
    double *gs = tc_read(nb_std(tx, NB_ALL, false)), *gvc = tc_read(nb_var(tc, NB_ALL, false));
    double *gsc = tc_read(nb_std(tc, NB_ALL, false));
    assert_rounded(gs, &sd, 1, dt, "std of |x| >= 256");
    assert_rounded(gvc, &vc, 1, dt, "var around 1000");
    assert_rounded(gsc, &sdc, 1, dt, "std around 1000");
    /* logits around 1000: max-shifted in f32 */
    double mx = -INFINITY, se = 0, *sm = malloc(sizeof(double) * (size_t)n);
    double *lsm = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
      mx = fmax(mx, c[i]);
    for (int64_t i = 0; i < n; i++)
      se += exp(c[i] - mx);
    double lse = mx + log(se), xent = 0;
    for (int64_t i = 0; i < n; i++) {
      sm[i] = exp(c[i] - mx) / se;
      lsm[i] = c[i] - lse;
      xent -= lsm[i] / (double)n * (i % 2 ? 0 : 2); /* labels: 2/n on even classes */
    }
    double *glse = tc_read(nb_logsumexp(tc, NB_ALL, false)), *gsm = tc_read(nb_softmax(tc, 0));
    double *glsm = tc_read(nb_log_softmax(tc, 0));
    double *lab = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
      lab[i] = i % 2 ? 0 : 2.0 / (double)n;
    tc_round_to(lab, n, dt);
    cr_assert_eq(lab[0], 2.0 / (double)n, "labels exact in %s", nb_dtype_name(dt));
    double *gx = tc_read(nb_cross_entropy(tc, tc_tensor(lab, NB_SHAPE(n), dt)));
    assert_rounded(glse, &lse, 1, dt, "logsumexp");
    assert_rounded(gsm, sm, n, dt, "softmax");
    assert_rounded(glsm, lsm, n, dt, "log_softmax");
    /* the per-class terms are rounded before their sum: room for n of them */
    cr_assert(fabs(gx[0] - xent) <= 4 * rounding(dt) * fabs(xent), "%s cross_entropy %g, exact %g",
              nb_dtype_name(dt), gx[0], xent);
    free(x), free(c), free(sm), free(lsm), free(lab), free(gs), free(gvc), free(gsc), free(glse),
        free(gsm), free(glsm), free(gx);
  }
}
