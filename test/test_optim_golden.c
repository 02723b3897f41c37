/* test/test_optim_golden.c — nabla's optimizers (include/nabla/optim.h) step by
 * step against torch.optim over 100 steps (test/golden/optim.txt, written by
 * test/golden/gen_optim.py; the problem is described there): parameters after
 * steps 1, 2, 10, 50 and 100, relative (|got - want| <= tol (1 + |want|)) to
 * 1e-12 in f64 and 1e-6 in f32 (measured: at most 8.3e-16 and 6.8e-7, the
 * largest from AdamW's decay, which torch applies as p (1 - lr wd) and the
 * optax form as p + (update - lr wd p)). Each case runs the eager step
 * (nb_optim_step), the optax form (nb_optim_update + nb_apply_updates) and,
 * for the scheduled AdamW, a jitted function of trees that returns the new
 * parameters and state (nb_tree_axpy). Set NABLA_TEST_VERBOSE=1 for the
 * largest error of each case. */
#include "common.h"

TestSuite(optim_golden, .init = tc_setup, .fini = tc_teardown);

#define GO_TOL_F64 1e-12
#define GO_TOL_F32 1e-6
enum { GO_N = 31, GO_STEPS = 100, GO_CHECKS = 5 };
static const int GO_CHECK[GO_CHECKS] = {1, 2, 10, 50, 100};

static const struct {
  const char *name;
  int ndim;
  int64_t dims[2];
} GO_SHAPES[5] = {
    {"w", 2, {4, 3}}, {"b", 1, {3}}, {"h.0.w", 2, {2, 5}}, {"h.0.b", 1, {5}}, {"scale", 0, {0}}};

/* want[c][i]: the golden values after step GO_CHECK[c] */
static void go_read(const char *name, nb_dtype dt, double want[GO_CHECKS][GO_N]) {
  const char *src = __FILE__, *slash = strrchr(src, '/');
  char path[1024], word[64], cname[64], tag[8];
  snprintf(path, sizeof path, "%.*sgolden/optim.txt", slash ? (int)(slash - src + 1) : 0, src);
  FILE *f = fopen(path, "r");
  cr_assert(f, "cannot open %s (run the tests from the repository root)", path);
  bool found = false;
  while (!found && fscanf(f, "%63s", word) == 1) {
    if (word[0] == '#') {
      int ch;
      while ((ch = fgetc(f)) != '\n' && ch != EOF) {
      }
      continue;
    }
    if (strcmp(word, "case")) continue;
    cr_assert_eq(fscanf(f, "%63s %7s", cname, tag), 2);
    if (strcmp(cname, name) || strcmp(tag, nb_dtype_name(dt))) continue;
    found = true;
    for (int c = 0; c < GO_CHECKS; c++) {
      int t;
      cr_assert_eq(fscanf(f, "%63s %d", word, &t), 2);
      cr_assert(!strcmp(word, "step") && t == GO_CHECK[c], "%s: step %d", name, t);
      for (int i = 0; i < GO_N; i++)
        cr_assert_eq(fscanf(f, "%lf", &want[c][i]), 1, "%s: value %d", name, i);
    }
  }
  fclose(f);
  cr_assert(found, "optim.txt has no case %s %s", name, nb_dtype_name(dt));
}

/* The tree of the problem: p0[i] = ((5 i + 3) mod 11 - 5) / 4. a and s hold
 * the gradient's coefficients per entry (a[i] = (1 + i mod 3) / 4). */
static nb_tree *go_params(nb_dtype dt, nb_tensor **a) {
  nb_tree *p = nb_tree_create();
  int k = 0;
  for (int e = 0; e < 5; e++) {
    nb_shape s = {.ndim = GO_SHAPES[e].ndim, .dims = {GO_SHAPES[e].dims[0], GO_SHAPES[e].dims[1]}};
    int64_t n = tc_numel(s);
    double v[12], c[12];
    for (int64_t j = 0; j < n; j++, k++) {
      v[j] = ((5 * k + 3) % 11 - 5) / 4.0;
      c[j] = (1 + k % 3) / 4.0;
    }
    nb_tree_set(p, GO_SHAPES[e].name, tc_tensor(v, s, dt));
    a[e] = nb_retain(tc_tensor(c, s, dt));
  }
  return p;
}

/* The gradients at step t: p * a + s(t, i), s = ((7 t + 13 i) mod 17 - 8) / 8. */
static nb_tree *go_grads(nb_tree *p, nb_tensor *const *a, int t) {
  nb_tree *g = nb_tree_create();
  int k = 0;
  for (int e = 0; e < 5; e++) {
    nb_tensor *x = nb_tree_at(p, e);
    int64_t n = nb_numel(x);
    double v[12];
    for (int64_t j = 0; j < n; j++, k++)
      v[j] = ((7 * t + 13 * k) % 17 - 8) / 8.0;
    nb_tensor *s = tc_tensor(v, nb_shape_of(x), nb_dtype_of(x));
    nb_tree_set(g, GO_SHAPES[e].name, nb_add(nb_mul(x, a[e]), s));
  }
  return g;
}

static nb_optim *go_optim(const char *name) {
  nb_optim *o = NULL;
  if (!strcmp(name, "sgd")) return nb_sgd(0.1, 0, false);
  if (!strcmp(name, "sgd_momentum")) return nb_sgd(0.05, 0.9, false);
  if (!strcmp(name, "sgd_nesterov")) return nb_sgd(0.05, 0.9, true);
  if (!strcmp(name, "sgd_weight_decay")) {
    nb_optim *parts[2] = {nb_add_decayed_weights(0.01), nb_sgd(0.05, 0.5, false)};
    o = nb_optim_chain(parts, 2);
    nb_optim_release(parts[0]);
    nb_optim_release(parts[1]);
    return o;
  }
  if (!strcmp(name, "adam")) return nb_adam(0.01, 0.9, 0.999, 1e-8);
  if (!strcmp(name, "adamw_masked")) {
    o = nb_adamw(0.01, 0.9, 0.95, 1e-8, 0.1);
    cr_assert(nb_optim_set_decay_mask(o, nb_decay_matrices, NULL) == NB_OK);
    return o;
  }
  if (!strcmp(name, "lion")) return nb_lion(1e-3, 0.9, 0.99, 0.1);
  if (!strcmp(name, "adam_cosine")) {
    o = nb_adam(1.0, 0.9, 0.999, 1e-8);
    nb_schedule *s = nb_schedule_cosine(0.02, 80, 0.1);
    cr_assert(nb_optim_set_schedule(o, s) == NB_OK);
    nb_schedule_release(s);
    return o;
  }
  if (!strcmp(name, "clip_adamw_warmup_cosine")) {
    nb_optim *parts[2] = {nb_clip_by_global_norm(1.0), nb_adamw(1.0, 0.9, 0.95, 1e-8, 0.1)};
    o = nb_optim_chain(parts, 2);
    nb_optim_release(parts[0]);
    nb_optim_release(parts[1]);
    nb_schedule *s = nb_schedule_warmup_cosine(0.0, 0.03, 10, 100, 0.003);
    cr_assert(nb_optim_set_schedule(o, s) == NB_OK);
    cr_assert(nb_optim_set_decay_mask(o, nb_decay_matrices, NULL) == NB_OK);
    nb_schedule_release(s);
    return o;
  }
  cr_assert_fail("no optimizer named %s", name);
  return NULL;
}

/* Largest relative error of p's values against want. */
static double go_error(nb_tree *p, const double *want) {
  double err = 0;
  int k = 0;
  for (int e = 0; e < 5; e++) {
    double *v = tc_read(nb_tree_at(p, e));
    for (int64_t j = 0; j < nb_numel(nb_tree_at(p, e)); j++, k++) {
      double d = fabs(v[j] - want[k]) / (1 + fabs(want[k]));
      if (d > err || isnan(d)) err = isnan(d) ? INFINITY : d;
    }
    free(v);
  }
  return err;
}

enum { GO_EAGER, GO_OPTAX, GO_JIT };
static const char *const GO_MODE[3] = {"nb_optim_step", "update + apply", "jit"};

/* A training step as a function of trees: (params, state, grads) -> (new
 * params, new state). */
static nb_status go_step_body(void *user, nb_tree *const *in, int n_in, nb_tree **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tree *state = nb_tree_copy(in[1]), *u = NULL;
  nb_status st = nb_optim_update(user, in[2], state, in[0], &u);
  out[0] = st ? NULL : nb_tree_axpy(1, u, in[0]);
  out[1] = state;
  nb_tree_release(u);
  if (!out[0]) {
    nb_tree_release(state);
    out[1] = NULL;
    return nb_last_status() ? nb_last_status() : st;
  }
  return NB_OK;
}

static double go_run(const char *name, nb_dtype dt, int mode) {
  double want[GO_CHECKS][GO_N];
  go_read(name, dt, want);
  nb_tensor *a[5];
  nb_tree *p = go_params(dt, a);
  nb_optim *o = go_optim(name);
  cr_assert(o, "%s: %s", name, nb_last_error());
  nb_tree *state = nb_optim_init(o, p);
  cr_assert(state, "%s: %s", name, nb_last_error());
  nb_fn *body = mode == GO_JIT ? nb_fn_create_trees(go_step_body, o, 3, 2) : NULL;
  nb_fn *step = body ? nb_jit(body) : NULL;
  nb_fn_release(body); /* the jitted function holds it */
  double worst = 0;
  for (int t = 1, c = 0; t <= GO_STEPS; t++) {
    nb_scope_begin();
    nb_tree *g = go_grads(p, a, t);
    if (mode == GO_EAGER) {
      cr_assert(nb_optim_step(o, p, g, state) == NB_OK, "%s: %s", name, nb_last_error());
    } else if (mode == GO_OPTAX) {
      nb_tree *u;
      cr_assert(nb_optim_update(o, g, state, p, &u) == NB_OK, "%s: %s", name, nb_last_error());
      cr_assert(nb_apply_updates(p, u) == NB_OK, "%s: %s", name, nb_last_error());
      nb_tree_release(u);
    } else {
      nb_tree *in[3] = {p, state, g}, *out[2];
      cr_assert(nb_call_trees(step, in, out) == NB_OK, "%s: %s", name, nb_last_error());
      nb_tree_release(p);
      nb_tree_release(state);
      p = out[0], state = out[1];
    }
    nb_tree_release(g);
    if (t == GO_CHECK[c]) {
      double e = go_error(p, want[c]);
      cr_assert(e <= (dt == NB_F64 ? GO_TOL_F64 : GO_TOL_F32),
                "%s %s (%s): relative error %.3g after step %d", name, nb_dtype_name(dt),
                GO_MODE[mode], e, t);
      if (e > worst) worst = e;
      c++;
    }
    nb_scope_end();
  }
  if (getenv("NABLA_TEST_VERBOSE"))
    fprintf(stderr, "optim golden %-26s %s %-15s max relative error %.3g\n", name,
            nb_dtype_name(dt), GO_MODE[mode], worst);
  nb_fn_release(step);
  nb_tree_release(state);
  nb_tree_release(p);
  nb_optim_release(o);
  for (int e = 0; e < 5; e++)
    nb_release(a[e]);
  return worst;
}

#define GO_CASE(name)                                                                              \
  Test(optim_golden, name) {                                                                       \
    go_run(#name, NB_F64, GO_EAGER);                                                               \
    go_run(#name, NB_F32, GO_EAGER);                                                               \
    go_run(#name, NB_F64, GO_OPTAX);                                                               \
  }

GO_CASE(sgd)
GO_CASE(sgd_momentum)
GO_CASE(sgd_nesterov)
GO_CASE(sgd_weight_decay)
GO_CASE(adam)
GO_CASE(adamw_masked)
GO_CASE(lion)
GO_CASE(adam_cosine)
GO_CASE(clip_adamw_warmup_cosine)

Test(optim_golden, jitted_step_with_schedule_and_clipping) {
  go_run("clip_adamw_warmup_cosine", NB_F64, GO_JIT);
  go_run("clip_adamw_warmup_cosine", NB_F32, GO_JIT);
}
