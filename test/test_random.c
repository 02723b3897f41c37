/* test/test_random.c — explicit random keys (nabla/random.h): the Threefry
 * block against its published known answer, determinism (same key, same
 * numbers, on any thread count), independence of split keys, distributions
 * (moments, frequencies), jit and vmap taking keys as arguments, and the
 * seeded generator refusing to draw inside a trace. */
#include "common.h"

TestSuite(random, .init = tc_setup, .fini = tc_teardown);

static double *draw(nb_tensor *t) { return tc_read(t); }

/* Random123's known answer for Threefry-2x32-20, key (0, 0), counter (0, 0):
 * 0x6b200159 0x99ba4efe; nb_key_split's first word is that block's first. */
Test(random, threefry_known_answer) {
  nb_tensor *k[1];
  cr_assert_eq(nb_key_split(nb_key(0), 1, k), NB_OK, "%s", nb_last_error());
  double *w = draw(k[0]);
  cr_assert_eq((uint32_t)w[0], 0x6b200159u, "%08x", (uint32_t)w[0]);
  free(w);
}

Test(random, same_key_same_numbers_on_any_thread_count) {
  nb_tensor *key = nb_key(42);
  nb_shape s = NB_SHAPE(300, 700);
  double *a = draw(nb_random_uniform(key, s, NB_F32));
  nb_set_num_threads(1);
  double *b = draw(nb_random_uniform(key, s, NB_F32));
  nb_set_num_threads(0);
  double *c = draw(nb_random_uniform(nb_key(43), s, NB_F32));
  int differ = 0;
  for (int64_t i = 0; i < tc_numel(s); i++) {
    cr_assert_eq(a[i], b[i], "element %lld", (long long)i);
    differ += a[i] != c[i];
  }
  cr_assert_gt(differ, tc_numel(s) * 99 / 100);
  free(a), free(b), free(c);
}

Test(random, uniform_every_float_dtype) {
  const nb_dtype dts[] = {NB_F32, NB_F64, NB_F16, NB_BF16};
  enum { n = 200000 };
  for (size_t d = 0; d < 4; d++) {
    double *u = draw(nb_random_uniform(nb_key(d), NB_SHAPE(n), dts[d]));
    double m = 0, v = 0;
    for (int i = 0; i < n; i++) {
      cr_assert(u[i] >= 0 && u[i] < 1, "%s: %g", nb_dtype_name(dts[d]), u[i]);
      m += u[i];
    }
    m /= n;
    for (int i = 0; i < n; i++)
      v += (u[i] - m) * (u[i] - m);
    v /= n;
    double step = dts[d] == NB_BF16 ? 1.0 / 256 : dts[d] == NB_F16 ? 1.0 / 2048 : 0;
    cr_expect(fabs(m - (0.5 - step / 2)) < 0.004, "%s mean %g", nb_dtype_name(dts[d]), m);
    cr_expect(fabs(v - 1.0 / 12) < 0.002, "%s variance %g", nb_dtype_name(dts[d]), v);
    free(u);
  }
}

Test(random, split_keys_are_distinct_and_independent) {
  nb_tensor *k[4];
  cr_assert_eq(nb_key_split(nb_key(1), 4, k), NB_OK, "%s", nb_last_error());
  double *w[4];
  for (int i = 0; i < 4; i++)
    w[i] = draw(k[i]);
  for (int i = 0; i < 4; i++)
    for (int j = i + 1; j < 4; j++)
      cr_assert(w[i][0] != w[j][0] || w[i][1] != w[j][1], "keys %d and %d", i, j);
  /* draws from two split keys are uncorrelated */
  enum { n = 100000 };
  double *a = draw(nb_random_normal(k[0], NB_SHAPE(n), NB_F64));
  double *b = draw(nb_random_normal(k[1], NB_SHAPE(n), NB_F64));
  double c = 0;
  for (int i = 0; i < n; i++)
    c += a[i] * b[i];
  cr_expect(fabs(c / n) < 0.02, "correlation %g", c / n);
  for (int i = 0; i < 4; i++)
    free(w[i]);
  free(a), free(b);
}

Test(random, normal_bernoulli_categorical_dropout) {
  enum { n = 200000 };
  double *z = draw(nb_random_normal(nb_key(5), NB_SHAPE(n), NB_F32));
  double m = 0, v = 0, m4 = 0;
  for (int i = 0; i < n; i++)
    m += z[i];
  m /= n;
  for (int i = 0; i < n; i++)
    v += (z[i] - m) * (z[i] - m), m4 += pow(z[i] - m, 4);
  v /= n, m4 /= n;
  cr_expect(fabs(m) < 0.01 && fabs(v - 1) < 0.02 && fabs(m4 / (v * v) - 3) < 0.1,
            "mean %g variance %g kurtosis %g", m, v, m4 / (v * v));
  double *bern = draw(nb_cast(nb_random_bernoulli(nb_key(6), 0.3, NB_SHAPE(n)), NB_F64));
  double f = 0;
  for (int i = 0; i < n; i++)
    f += bern[i];
  cr_expect(fabs(f / n - 0.3) < 0.005, "bernoulli frequency %g", f / n);
  /* categorical: frequencies follow softmax(logits) */
  const double lg[3] = {0.0, 1.0, -1.0};
  nb_tensor *logits = nb_broadcast_to(tc_tensor(lg, NB_SHAPE(1, 3), NB_F32), NB_SHAPE(n, 3));
  double *c = draw(nb_categorical(nb_key(7), logits, 1));
  double cnt[3] = {0}, z3 = exp(0.0) + exp(1.0) + exp(-1.0);
  for (int i = 0; i < n; i++)
    cnt[(int)c[i]]++;
  for (int k = 0; k < 3; k++)
    cr_expect(fabs(cnt[k] / n - exp(lg[k]) / z3) < 0.006, "class %d: %g vs %g", k, cnt[k] / n,
              exp(lg[k]) / z3);
  /* dropout with a key: p of the elements zeroed, the rest scaled */
  double *d = draw(nb_dropout_key(nb_ones(NB_SHAPE(n), NB_F32), nb_key(8), 0.25));
  double zeros = 0;
  for (int i = 0; i < n; i++) {
    cr_assert(d[i] == 0 || fabs(d[i] - 1 / 0.75) < 1e-6, "%g", d[i]);
    zeros += d[i] == 0;
  }
  cr_expect(fabs(zeros / n - 0.25) < 0.005, "dropped %g", zeros / n);
  free(z), free(bern), free(c), free(d);
}

static nb_status noise_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_add(in[0], nb_random_normal(in[1], nb_shape_of(in[0]), NB_F32));
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status seeded_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_add(in[0], nb_randn(nb_shape_of(in[0]), NB_F32));
  return out[0] ? NB_OK : nb_last_status();
}

/* A jitted function draws new numbers for each key it is given, the same for
 * the same key; vmap over keys gives each its own draw. */
Test(random, keys_through_jit_and_vmap) {
  nb_fn *f = nb_fn_create(noise_body, NULL, 2, 1), *j = nb_jit(f);
  nb_tensor *x = nb_zeros(NB_SHAPE(8), NB_F32), *o1[1], *o2[1], *o3[1], *ref[1];
  cr_assert_eq(nb_call(j, (nb_tensor *[]){x, nb_key(1)}, o1), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(j, (nb_tensor *[]){x, nb_key(2)}, o2), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(j, (nb_tensor *[]){x, nb_key(1)}, o3), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(f, (nb_tensor *[]){x, nb_key(1)}, ref), NB_OK, "%s", nb_last_error());
  double *a = draw(o1[0]), *b = draw(o2[0]), *c = draw(o3[0]), *r = draw(ref[0]);
  int same = 0;
  for (int i = 0; i < 8; i++) {
    same += a[i] == b[i];
    cr_assert_eq(a[i], c[i]);
    cr_assert_eq(a[i], r[i]);
  }
  cr_assert_lt(same, 2, "a new key drew the same numbers");
  /* vmap over a stack of keys */
  nb_tensor *keys = nb_stack((nb_tensor *[]){nb_key(1), nb_key(2)}, 2, 0);
  nb_fn *v = nb_vmap(f, (int[]){NB_NOT_MAPPED, 0}, NULL);
  nb_tensor *vo[1];
  cr_assert_eq(nb_call(v, (nb_tensor *[]){x, keys}, vo), NB_OK, "%s", nb_last_error());
  double *vv = draw(vo[0]);
  for (int i = 0; i < 8; i++) {
    cr_assert_eq(vv[i], a[i]);
    cr_assert_eq(vv[8 + i], b[i]);
  }
  free(a), free(b), free(c), free(r), free(vv);
  nb_fn_release(v);
  nb_fn_release(j);
  /* the seeded generator inside a trace: an error pointing to keys */
  nb_fn *g = nb_fn_create(seeded_body, NULL, 1, 1), *gj = nb_jit(g);
  cr_assert_eq(nb_call(gj, &x, o1), NB_ERR_STATE);
  cr_assert(strstr(nb_last_error(), "nb_randn") && strstr(nb_last_error(), "key"), "%s",
            nb_last_error());
  nb_clear_error();
  cr_assert_eq(nb_call(g, &x, o1), NB_OK, "eager use stays: %s", nb_last_error());
  nb_fn_release(gj);
  nb_fn_release(g);
  nb_fn_release(f);
}

Test(random, errors) {
  cr_assert_null(nb_random_uniform(nb_zeros(NB_SHAPE(3), NB_F32), NB_SHAPE(2), NB_F32));
  cr_assert(strstr(nb_last_error(), "nb_random_uniform") && strstr(nb_last_error(), "i64 [2]"),
            "%s", nb_last_error());
  nb_clear_error();
  cr_assert_null(nb_random_uniform(nb_key(1), NB_SHAPE(2), NB_I32));
  cr_assert_eq(nb_last_status(), NB_ERR_DTYPE);
  nb_clear_error();
  cr_assert_null(nb_random_bernoulli(nb_key(1), 1.5, NB_SHAPE(2)));
  cr_assert_eq(nb_last_status(), NB_ERR_ARG);
  nb_clear_error();
  nb_tensor *k[2];
  cr_assert_eq(nb_key_split(nb_key(1), 0, k), NB_ERR_ARG);
  nb_clear_error();
  cr_assert_null(nb_categorical(nb_key(1), nb_zeros(NB_SHAPE(2, 3), NB_F32), 2));
  cr_assert_eq(nb_last_status(), NB_ERR_AXIS);
  nb_clear_error();
}
