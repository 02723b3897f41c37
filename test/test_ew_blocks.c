/* test/test_ew_blocks.c — how the CPU elementwise executors walk their
 * operands: short rows run as blocks of rows (flat operands read in place,
 * broadcast and strided ones gathered row by row), long rows cut into pieces,
 * row offsets stepped across dims and thread ranges, where's condition,
 * operands converted on the way, and outputs large enough to be written with
 * streaming stores. Single ops and fused groups (fusion off and on) against
 * loops computed here in float, compared exactly. */
#include "common.h"

/* n floats in [-2, 2) (malloc'd). */
static float *rand_f32(int64_t n, uint64_t *seed) {
  float *v = malloc(sizeof *v * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++)
    v[i] = (float)tc_uniform(seed, -2, 2);
  return v;
}

/* An f32 tensor of shape s holding v (row-major); strided: read through a
 * transposed view. */
static nb_tensor *f32_tensor(const float *v, nb_shape s, bool strided) {
  if (!strided) {
    nb_tensor *t = nb_from_data(v, s, NB_F32);
    cr_assert(t, "%s", nb_last_error());
    return t;
  }
  int64_t n = tc_numel(s);
  double *x = malloc(sizeof *x * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++)
    x[i] = v[i];
  nb_tensor *t = tc_strided_tensor(x, s, NB_F32);
  free(x);
  return t;
}

/* Realizes t and asserts its n f32 values are exactly ref's. */
static void assert_f32(nb_tensor *t, const float *ref, int64_t n, const char *what) {
  cr_assert(t, "%s: %s", what, nb_last_error());
  cr_assert_eq(nb_eval(&t, 1), NB_OK, "%s: %s", what, nb_last_error());
  cr_assert_eq(nb_numel(t), n, "%s: %lld elements", what, (long long)nb_numel(t));
  float *got = malloc(sizeof *got * (size_t)(n ? n : 1));
  cr_assert_eq(nb_to_host(t, got, sizeof *got * (size_t)n), NB_OK, "%s", nb_last_error());
  for (int64_t i = 0; i < n; i++)
    cr_assert(got[i] == ref[i] || (got[i] != got[i] && ref[i] != ref[i]),
              "%s: element %lld is %.9g, expected %.9g", what, (long long)i, got[i], ref[i]);
  free(got);
}

static float relu(float v) { return v > 0 ? v : 0.0f; }

typedef struct rows_case {
  int64_t b, n; /* [b, n] */
} rows_case;

/* Blocks (n below a chunk, several rows per unit, some ragged), pieces (n above
 * a chunk), both parallel (over NBI_PAR_MIN elements) and not. */
static const rows_case cases[] = {{256, 32},  {37, 7},    {5001, 7}, {7000, 5},  {1, 1},
                                  {300, 255}, {100, 257}, {3, 1000}, {40, 1100}, {9, 1}};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

Test(ew_blocks, row_and_column_broadcasts_over_short_and_long_rows) {
  uint64_t seed = 11;
  for (int c = 0; c < N_CASES; c++) {
    int64_t b = cases[c].b, n = cases[c].n, numel = b * n;
    float *x = rand_f32(numel, &seed), *bias = rand_f32(n, &seed), *col = rand_f32(b, &seed);
    float *ref = malloc(sizeof *ref * (size_t)numel), *ref2 = malloc(sizeof *ref2 * (size_t)numel);
    for (int64_t i = 0; i < b; i++)
      for (int64_t j = 0; j < n; j++) {
        float v = x[i * n + j] * col[i];
        ref[i * n + j] = relu(v + bias[j]);
        ref2[i * n + j] = x[i * n + j] - bias[j];
      }
    for (int strided = 0; strided < 2; strided++)
      for (int fused = 0; fused < 2; fused++) {
        nbi_set_fusion(fused);
        nb_scope_begin();
        nb_tensor *xt = f32_tensor(x, NB_SHAPE(b, n), strided);
        nb_tensor *bt = f32_tensor(bias, NB_SHAPE(1, n), false);
        nb_tensor *ct = f32_tensor(col, NB_SHAPE(b, 1), false);
        char what[96];
        snprintf(what, sizeof what, "[%lld, %lld] strided %d fused %d", (long long)b, (long long)n,
                 strided, fused);
        assert_f32(nb_relu(nb_add(nb_mul(xt, ct), bt)), ref, numel, what);
        /* the bias as a 1-D [n] operand */
        assert_f32(nb_sub(xt, nb_reshape(bt, NB_SHAPE(n))), ref2, numel, what);
        nb_scope_end();
      }
    nbi_set_fusion(true);
    free(x), free(bias), free(col), free(ref), free(ref2);
  }
}

/* [6, r, 7] against [6, 1, 7] and [r, 1]: no dims merge, so blocks of rows
 * cross the boundaries of dim 0 (the odometer carries), and with r = 2000 the
 * threads start their ranges mid-way. */
Test(ew_blocks, blocks_cross_outer_dims) {
  uint64_t seed = 5;
  static const int64_t rs[] = {50, 2000};
  for (int k = 0; k < 2; k++) {
    int64_t r = rs[k], numel = 6 * r * 7;
    float *x = rand_f32(numel, &seed), *y = rand_f32(6 * 7, &seed), *z = rand_f32(r, &seed);
    float *ref = malloc(sizeof *ref * (size_t)numel);
    for (int64_t a = 0; a < 6; a++)
      for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < 7; j++) {
          float v = y[a * 7 + j] * 2.0f;
          v = x[(a * r + i) * 7 + j] - v;
          ref[(a * r + i) * 7 + j] = v * z[i];
        }
    for (int fused = 0; fused < 2; fused++) {
      nbi_set_fusion(fused);
      nb_scope_begin();
      nb_tensor *xt = f32_tensor(x, NB_SHAPE(6, r, 7), fused); /* strided once */
      nb_tensor *yt = f32_tensor(y, NB_SHAPE(6, 1, 7), false);
      nb_tensor *zt = f32_tensor(z, NB_SHAPE(r, 1), false);
      assert_f32(nb_mul(nb_sub(xt, nb_mul_scalar(yt, 2.0)), zt), ref, numel, "3-d");
      nb_scope_end();
    }
    nbi_set_fusion(true);
    free(x), free(y), free(z), free(ref);
  }
}

/* where with its condition full, broadcast along rows, and strided. */
Test(ew_blocks, where_conditions_in_blocks) {
  uint64_t seed = 9;
  for (int c = 0; c < N_CASES; c++) {
    int64_t b = cases[c].b, n = cases[c].n, numel = b * n;
    float *x = rand_f32(numel, &seed), *bias = rand_f32(n, &seed), *col = rand_f32(b, &seed);
    float *r_row = malloc(sizeof(float) * (size_t)numel),
          *r_full = malloc(sizeof(float) * (size_t)numel);
    for (int64_t i = 0; i < b; i++)
      for (int64_t j = 0; j < n; j++) {
        float v = x[i * n + j];
        r_row[i * n + j] = bias[j] > 0 ? v : col[i];
        r_full[i * n + j] = v > bias[j] ? v + 1.0f : bias[j];
      }
    for (int strided = 0; strided < 2; strided++)
      for (int fused = 0; fused < 2; fused++) {
        nbi_set_fusion(fused);
        nb_scope_begin();
        nb_tensor *xt = f32_tensor(x, NB_SHAPE(b, n), false);
        nb_tensor *bt = f32_tensor(bias, NB_SHAPE(1, n), false);
        nb_tensor *ct = f32_tensor(col, NB_SHAPE(b, 1), false);
        nb_tensor *cond_row = nb_gt_scalar(bt, 0.0);
        nb_tensor *cond = nb_gt(xt, bt);
        if (strided) { /* the same condition, read through a transposed view */
          nb_tensor *tt = nb_transpose(nb_lt(nb_transpose(bt), nb_transpose(xt)));
          cr_assert_eq(nb_eval(&tt, 1), NB_OK);
          cond = tt;
        }
        assert_f32(nb_where(cond_row, xt, ct), r_row, numel, "row condition");
        assert_f32(nb_where(cond, nb_add_scalar(xt, 1.0), bt), r_full, numel, "full condition");
        nb_scope_end();
      }
    nbi_set_fusion(true);
    free(x), free(bias), free(col), free(r_row), free(r_full);
  }
}

/* Operands converted per block: an i32 row added to f32 and to f16 (computed
 * in f16: the integer is first rounded to f16), and a cast of a strided f16
 * tensor with short rows. */
Test(ew_blocks, conversions_in_blocks) {
  uint64_t seed = 21;
  for (int c = 0; c < N_CASES; c++) {
    int64_t b = cases[c].b, n = cases[c].n, numel = b * n;
    double *x = malloc(sizeof *x * (size_t)numel), *iv = tc_rand_ints(n, NB_I32, &seed, 3000);
    tc_fill(x, numel, -4, 4, &seed);
    tc_round_to(x, numel, NB_F16);
    float *r32 = malloc(sizeof(float) * (size_t)numel),
          *r16 = malloc(sizeof(float) * (size_t)numel),
          *rcast = malloc(sizeof(float) * (size_t)numel);
    char h[2];
    for (int64_t i = 0; i < b; i++)
      for (int64_t j = 0; j < n; j++) {
        float v = (float)x[i * n + j];
        r32[i * n + j] = v + (float)iv[j];
        nbi_store_f64(h, NB_F16, 0, iv[j]); /* the integer as f16 */
        float s = v + (float)nbi_load_f64(h, NB_F16, 0);
        nbi_store_f64(h, NB_F16, 0, s);
        r16[i * n + j] = (float)nbi_load_f64(h, NB_F16, 0);
        rcast[i * n + j] = v;
      }
    for (int fused = 0; fused < 2; fused++) {
      nbi_set_fusion(fused);
      nb_scope_begin();
      nb_tensor *x32 = tc_tensor(x, NB_SHAPE(b, n), NB_F32);
      nb_tensor *x16 = tc_strided_tensor(x, NB_SHAPE(b, n), NB_F16);
      nb_tensor *it = tc_tensor(iv, NB_SHAPE(1, n), NB_I32);
      assert_f32(nb_add(x32, it), r32, numel, "f32 + i32");
      nb_tensor *s16 = nb_add(x16, it);
      cr_assert_eq(nb_dtype_of(s16), NB_F16);
      assert_f32(nb_cast(s16, NB_F32), r16, numel, "f16 + i32");
      assert_f32(nb_cast(x16, NB_F32), rcast, numel, "cast");
      nb_scope_end();
    }
    nbi_set_fusion(true);
    free(x), free(iv), free(r32), free(r16), free(rcast);
  }
}

/* Outputs of 16 MiB and more go out through streaming stores: a single op
 * with blocks of 51 rows of 5 (units that start off a 16-byte boundary), a
 * fused group storing an intermediate too, and an f64 op over one long row. */
Test(ew_blocks, large_outputs) {
  uint64_t seed = 3;
  int64_t b = 838861, n = 5, numel = b * n; /* 16777220 bytes of f32 */
  float *x = rand_f32(numel, &seed), *bias = rand_f32(n, &seed);
  float *r_add = malloc(sizeof(float) * (size_t)numel),
        *r_h = malloc(sizeof(float) * (size_t)numel), *r_y = malloc(sizeof(float) * (size_t)numel);
  for (int64_t i = 0; i < b; i++)
    for (int64_t j = 0; j < n; j++) {
      float v = x[i * n + j];
      r_add[i * n + j] = v + bias[j];
      r_h[i * n + j] = v * 2.0f;
      r_y[i * n + j] = relu(r_h[i * n + j] + bias[j]);
    }
  for (int fused = 0; fused < 2; fused++) {
    nbi_set_fusion(fused);
    nb_scope_begin();
    nb_tensor *xt = f32_tensor(x, NB_SHAPE(b, n), false);
    nb_tensor *bt = f32_tensor(bias, NB_SHAPE(1, n), false);
    assert_f32(nb_add(xt, bt), r_add, numel, "x + bias");
    nb_tensor *h = nb_mul_scalar(xt, 2.0), *y = nb_relu(nb_add(h, bt));
    cr_assert_eq(nb_eval((nb_tensor *[]){h, y}, 2), NB_OK, "%s", nb_last_error());
    assert_f32(h, r_h, numel, "held intermediate");
    assert_f32(y, r_y, numel, "group result");
    nb_scope_end();
  }
  nbi_set_fusion(true);
  free(x), free(bias), free(r_add), free(r_h), free(r_y);

  int64_t m = (int64_t)1 << 21; /* 16 MiB of f64 */
  double *d = malloc(sizeof *d * (size_t)m);
  tc_fill(d, m, -1, 1, &seed);
  nb_scope_begin();
  nb_tensor *t = nb_sub_scalar(nb_mul_scalar(tc_tensor(d, NB_SHAPE(m), NB_F64), 3.0), 1.0);
  cr_assert_eq(nb_eval(&t, 1), NB_OK, "%s", nb_last_error());
  double *got = tc_read(t);
  for (int64_t i = 0; i < m; i++)
    cr_assert_eq(got[i], d[i] * 3.0 - 1.0, "f64 element %lld", (long long)i);
  free(got);
  nb_scope_end();
  free(d);
}
