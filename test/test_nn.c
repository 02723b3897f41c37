/* test/test_nn.c — nn helpers and einsum against float64 reference loops. */
#include "common.h"

TestSuite(nn, .init = tc_setup, .fini = tc_teardown);

static double *rnd(int64_t n, uint64_t seed, double lo, double hi) {
  double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
  tc_fill(x, n, lo, hi, &seed);
  return x;
}

Test(nn, layer_norm_matches_reference_with_and_without_affine) {
  const int R = 5, D = 7;
  double *x = rnd(R * D, 1, -2, 2), *w = rnd(D, 2, 0.5, 1.5), *b = rnd(D, 3, -1, 1);
  double ref[5 * 7], ref_plain[5 * 7];
  for (int r = 0; r < R; r++) {
    double m = 0, v = 0;
    for (int d = 0; d < D; d++) m += x[r * D + d] / D;
    for (int d = 0; d < D; d++) v += (x[r * D + d] - m) * (x[r * D + d] - m) / D;
    for (int d = 0; d < D; d++) {
      ref_plain[r * D + d] = (x[r * D + d] - m) / sqrt(v + 1e-5);
      ref[r * D + d] = ref_plain[r * D + d] * w[d] + b[d];
    }
  }
  for (int dt = NB_F32; dt <= NB_F64; dt++) {
    nb_tensor *xt = tc_tensor(x, NB_SHAPE(R, D), dt);
    tc_assert_close_tol(nb_layer_norm(xt, tc_tensor(w, NB_SHAPE(D), dt),
                                      tc_tensor(b, NB_SHAPE(D), dt), 1e-5),
                        ref, NB_SHAPE(R, D), dt == NB_F64 ? 1e-12 : 1e-5);
    tc_assert_close_tol(nb_layer_norm(xt, NULL, NULL, 1e-5), ref_plain, NB_SHAPE(R, D),
                        dt == NB_F64 ? 1e-12 : 1e-5);
  }
  cr_assert_null(nb_layer_norm(tc_tensor(x, NB_SHAPE(R, D), NB_F32),
                               tc_tensor(w, NB_SHAPE(D - 1), NB_F32), NULL, 1e-5));
  tc_assert_error(NB_ERR_SHAPE, "nb_layer_norm: weight of shape [6] does not match");
  free(x), free(w), free(b);
}

Test(nn, rms_norm_matches_reference) {
  const int R = 3, D = 8;
  double *x = rnd(R * D, 4, -2, 2), *w = rnd(D, 5, 0.5, 1.5), ref[3 * 8];
  for (int r = 0; r < R; r++) {
    double ms = 0;
    for (int d = 0; d < D; d++) ms += x[r * D + d] * x[r * D + d] / D;
    for (int d = 0; d < D; d++) ref[r * D + d] = x[r * D + d] / sqrt(ms + 1e-6) * w[d];
  }
  tc_assert_close(nb_rms_norm(tc_tensor(x, NB_SHAPE(R, D), NB_F64),
                              tc_tensor(w, NB_SHAPE(D), NB_F64), 1e-6),
                  ref, NB_SHAPE(R, D));
  free(x), free(w);
}

Test(nn, cross_entropy_with_class_indices_and_probabilities) {
  const int N = 6, C = 5;
  double *z = rnd(N * C, 6, -3, 3), *p = rnd(N * C, 7, 0, 1);
  int64_t y[6] = {0, 4, 2, 2, 1, 3};
  double ref_idx = 0, ref_prob = 0;
  for (int n = 0; n < N; n++) {
    double mx = -INFINITY, s = 0, ps = 0;
    for (int c = 0; c < C; c++) mx = fmax(mx, z[n * C + c]);
    for (int c = 0; c < C; c++) s += exp(z[n * C + c] - mx);
    for (int c = 0; c < C; c++) ps += p[n * C + c];
    for (int c = 0; c < C; c++) p[n * C + c] /= ps;
    double lse = mx + log(s);
    ref_idx += (lse - z[n * C + y[n]]) / N;
    for (int c = 0; c < C; c++) ref_prob += p[n * C + c] * (lse - z[n * C + c]) / N;
  }
  nb_tensor *zt = tc_tensor(z, NB_SHAPE(N, C), NB_F64);
  tc_assert_close(nb_cross_entropy(zt, nb_from_data(y, NB_SHAPE(N), NB_I64)), &ref_idx,
                  NB_SCALAR_SHAPE);
  tc_assert_close(nb_cross_entropy(zt, tc_tensor(p, NB_SHAPE(N, C), NB_F64)), &ref_prob,
                  NB_SCALAR_SHAPE);
  cr_assert_null(nb_cross_entropy(zt, nb_from_data(y, NB_SHAPE(3, 2), NB_I64)));
  tc_assert_error(NB_ERR_SHAPE, "nb_cross_entropy: class labels [3,2]");
  free(z), free(p);
}

Test(nn, mse_matches_reference) {
  double *a = rnd(12, 8, -1, 1), *b = rnd(4, 9, -1, 1), ref = 0;
  for (int i = 0; i < 12; i++) ref += (a[i] - b[i % 4]) * (a[i] - b[i % 4]) / 12;
  tc_assert_close(nb_mse(tc_tensor(a, NB_SHAPE(3, 4), NB_F64), tc_tensor(b, NB_SHAPE(4), NB_F64)),
                  &ref, NB_SCALAR_SHAPE);
  free(a), free(b);
}

Test(nn, dropout_zeroes_about_p_and_rescales_the_rest) {
  const int64_t n = 20000;
  nb_tensor *x = nb_ones(NB_SHAPE(n), NB_F32);
  double *y = tc_read(nb_dropout(x, 0.25, true));
  int64_t zeros = 0;
  for (int64_t i = 0; i < n; i++) {
    if (y[i] == 0) zeros++;
    else cr_assert_float_eq(y[i], 1 / 0.75, 1e-6);
  }
  cr_assert(fabs((double)zeros / n - 0.25) < 0.02, "zero fraction %g", (double)zeros / n);
  free(y);
  double *same = tc_read(nb_dropout(x, 0.25, false));
  for (int64_t i = 0; i < n; i++) cr_assert_eq(same[i], 1);
  free(same);
  cr_assert_null(nb_dropout(x, 1.0, true));
  tc_assert_error(NB_ERR_ARG, "nb_dropout: p = 1");
}

Test(nn, embedding_gathers_rows) {
  double *tab = rnd(5 * 3, 10, -1, 1), ref[4 * 3];
  int32_t idx[4] = {4, 0, 4, 2};
  for (int i = 0; i < 4; i++)
    for (int d = 0; d < 3; d++) ref[i * 3 + d] = tab[idx[i] * 3 + d];
  tc_assert_close(nb_embedding(tc_tensor(tab, NB_SHAPE(5, 3), NB_F32),
                               nb_from_data(idx, NB_SHAPE(2, 2), NB_I32)),
                  ref, NB_SHAPE(2, 2, 3));
  cr_assert_null(nb_embedding(tc_tensor(tab, NB_SHAPE(15), NB_F32),
                              nb_from_data(idx, NB_SHAPE(4), NB_I32)));
  tc_assert_error(NB_ERR_SHAPE, "nb_embedding");
  free(tab);
}

Test(nn, attention_matches_reference_with_causal_mask) {
  const int B = 2, L = 4, D = 3;
  double *q = rnd(B * L * D, 11, -1, 1), *k = rnd(B * L * D, 12, -1, 1),
         *v = rnd(B * L * D, 13, -1, 1), ref[2 * 4 * 3], ref_m[2 * 4 * 3];
  bool mask[4 * 4];
  for (int i = 0; i < L; i++)
    for (int j = 0; j < L; j++) mask[i * L + j] = j <= i;
  for (int masked = 0; masked < 2; masked++) {
    double *out = masked ? ref_m : ref;
    for (int b = 0; b < B; b++)
      for (int i = 0; i < L; i++) {
        double s[4], mx = -INFINITY, sum = 0;
        for (int j = 0; j < L; j++) {
          s[j] = 0;
          for (int d = 0; d < D; d++) s[j] += q[(b * L + i) * D + d] * k[(b * L + j) * D + d];
          s[j] /= sqrt((double)D);
          if (masked && !mask[i * L + j]) s[j] = -INFINITY;
          mx = fmax(mx, s[j]);
        }
        for (int j = 0; j < L; j++) sum += (s[j] = exp(s[j] - mx));
        for (int d = 0; d < D; d++) {
          double acc = 0;
          for (int j = 0; j < L; j++) acc += s[j] / sum * v[(b * L + j) * D + d];
          out[(b * L + i) * D + d] = acc;
        }
      }
  }
  nb_tensor *qt = tc_tensor(q, NB_SHAPE(B, L, D), NB_F64), *kt = tc_tensor(k, NB_SHAPE(B, L, D), NB_F64),
            *vt = tc_tensor(v, NB_SHAPE(B, L, D), NB_F64);
  tc_assert_close(nb_attention(qt, kt, vt, NULL), ref, NB_SHAPE(B, L, D));
  tc_assert_close(nb_attention(qt, kt, vt, nb_from_data(mask, NB_SHAPE(L, L), NB_BOOL)), ref_m,
                  NB_SHAPE(B, L, D));
  cr_assert_null(nb_attention(qt, tc_tensor(k, NB_SHAPE(B, L, D - 1), NB_F64), vt, NULL));
  tc_assert_error(NB_ERR_SHAPE, "nb_attention");
  free(q), free(k), free(v);
}

/* ---- einsum --------------------------------------------------------------------- */
Test(nn, einsum_matmul_batch_transpose_and_reductions) {
  double *a = rnd(2 * 3 * 4, 14, -1, 1), *b = rnd(2 * 4 * 5, 15, -1, 1);
  double ref[2 * 3 * 5] = {0}, tr[4 * 3], total = 0;
  for (int n = 0; n < 2; n++)
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 5; j++)
        for (int k = 0; k < 4; k++) ref[(n * 3 + i) * 5 + j] += a[(n * 3 + i) * 4 + k] * b[(n * 4 + k) * 5 + j];
  nb_tensor *at = tc_tensor(a, NB_SHAPE(2, 3, 4), NB_F64), *bt = tc_tensor(b, NB_SHAPE(2, 4, 5), NB_F64);
  tc_assert_close(nb_einsum("bij,bjk->bik", (nb_tensor *[]){at, bt}, 2), ref, NB_SHAPE(2, 3, 5));
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) tr[k * 3 + i] = a[i * 4 + k];
  nb_tensor *a0 = tc_tensor(a, NB_SHAPE(3, 4), NB_F64);
  tc_assert_close(nb_einsum("ij->ji", &a0, 1), tr, NB_SHAPE(4, 3));
  tc_assert_close(nb_einsum("ji", &a0, 1), tr, NB_SHAPE(4, 3)); /* implicit: sorted letters */
  for (int i = 0; i < 12; i++) total += a[i];
  tc_assert_close(nb_einsum("ij->", &a0, 1), &total, NB_SCALAR_SHAPE);
  free(a), free(b);
}

Test(nn, einsum_trace_diagonal_outer_and_three_operands) {
  double *m = rnd(16, 16, -1, 1), *u = rnd(3, 17, -1, 1), *w = rnd(2, 18, -1, 1);
  double trace = 0, diag[4], outer[6];
  for (int i = 0; i < 4; i++) trace += m[i * 5], diag[i] = m[i * 5];
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) outer[i * 2 + j] = u[i] * w[j];
  nb_tensor *mt = tc_tensor(m, NB_SHAPE(4, 4), NB_F64), *ut = tc_tensor(u, NB_SHAPE(3), NB_F64),
            *wt = tc_tensor(w, NB_SHAPE(2), NB_F64);
  tc_assert_close(nb_einsum("ii->", &mt, 1), &trace, NB_SCALAR_SHAPE);
  tc_assert_close(nb_einsum("ii->i", &mt, 1), diag, NB_SHAPE(4));
  tc_assert_close(nb_einsum("i,j->ij", (nb_tensor *[]){ut, wt}, 2), outer, NB_SHAPE(3, 2));
  tc_assert_close(nb_outer(ut, wt), outer, NB_SHAPE(3, 2));
  /* u^T M[:3,:3]... as a chain: x_i M_ij M_jk y_k over a 4x4 M with x = y = ones */
  double ones[4] = {1, 1, 1, 1}, chain = 0;
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++)
      for (int k = 0; k < 4; k++) chain += m[i * 4 + j] * m[j * 4 + k];
  nb_tensor *o = tc_tensor(ones, NB_SHAPE(4), NB_F64);
  tc_assert_close(nb_einsum("i,ij,jk,k->", (nb_tensor *[]){o, mt, mt, o}, 4), &chain,
                  NB_SCALAR_SHAPE);
  free(m), free(u), free(w);
}

Test(nn, einsum_rejects_bad_specs) {
  nb_tensor *a = nb_ones(NB_SHAPE(2, 3), NB_F32), *b = nb_ones(NB_SHAPE(4, 5), NB_F32);
  cr_assert_null(nb_einsum("ij,jk->ik", (nb_tensor *[]){a, b}, 2));
  tc_assert_error(NB_ERR_SHAPE, "letter 'j' has sizes 3 and 4");
  cr_assert_null(nb_einsum("ijk->i", &a, 1));
  tc_assert_error(NB_ERR_SHAPE, "operand 0 has 3 letters");
  cr_assert_null(nb_einsum("ij->iz", &a, 1));
  tc_assert_error(NB_ERR_ARG, "output letter 'z'");
  cr_assert_null(nb_einsum("ij,jk->ik", &a, 1));
  tc_assert_error(NB_ERR_ARG, "unexpected ','");
  cr_assert_null(nb_einsum(NULL, &a, 1));
  tc_assert_error(NB_ERR_NULL, "nb_einsum: spec is NULL");
  cr_assert_null(nb_einsum("ij", &a, 0));
  tc_assert_error(NB_ERR_ARG, "0 operands");
}
