/* test/test_diff.c — the differential test against JAX (issue 14.1; test/diff/README.md).
 * test/diff/programs.txt holds random programs over nabla's op set (written by
 * test/diff/gen_jax.py) with the values JAX computed in float64 for each check:
 * a chain of transforms over the program f (inputs -> one output) or over
 * g(x, ct) = sum(f(x) * ct), e.g. "f", "f.jit", "g.grad", "g.grad.jvp" (a
 * Hessian-vector product), "g.grad.vmap:0,n:1,0", "f.jacrev.jit",
 * "g.hessian"; "f.eager" runs the ops at top level and "g.bwd" is the
 * imperative nb_backward. Each program runs in its dtype (f32 or f64), small
 * ones under every transform, large ones (above NBI_PAR_MIN elements, the
 * multithreaded kernels) under all but the Jacobians; results must match to
 * the file's tolerance per dtype (|got - want| <= rtol (|want| + max|want|);
 * projections of large arrays within the rounding such errors can give). */
#include "diff_program.h"

TestSuite(diff, .init = tc_setup, .fini = tc_teardown);

/* ---- functions: f, g and the transforms ------------------------------------------------- */
static nb_status f_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = dp_run(user, in);
  return out[0] ? NB_OK : nb_last_status();
}

/* g(x..., ct) = sum(f(x) * ct) */
static nb_status g_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_out;
  nb_tensor *y = dp_run(user, in);
  out[0] = nb_sum(nb_mul(y, in[n_in - 1]), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_axes dp_first(int n) {
  nb_axes a = {.n = n};
  for (int k = 0; k < n; k++)
    a.v[k] = k;
  return a;
}

/* "vmap:0,n,-1:1,0" -> in_axes (NB_NOT_MAPPED for n) and out_axes. */
static void parse_vmap(const char *t, int *in_axes, int n_in, int *out_axes, int n_out) {
  const char *s = strchr(t, ':');
  cr_assert(s, "vmap token %s", t);
  s++;
  for (int k = 0; k < n_in; k++) {
    if (*s == 'n') {
      in_axes[k] = NB_NOT_MAPPED;
      s++;
    } else {
      char *end;
      in_axes[k] = (int)strtol(s, &end, 10);
      s = end;
    }
    cr_assert(*s == (k + 1 < n_in ? ',' : ':'), "vmap token %s: %d in_axes expected", t, n_in);
    s++;
  }
  for (int k = 0; k < n_out; k++) {
    char *end;
    out_axes[k] = (int)strtol(s, &end, 10);
    s = end;
    cr_assert(*s == (k + 1 < n_out ? ',' : '\0'), "vmap token %s: %d out_axes expected", t, n_out);
    s++;
  }
}

/* The nb_fn of chain (its base and transforms; "eager"/"bwd" are not built). */
static nb_fn *build_chain(const dp_program *p, const char *chain) {
  char buf[160];
  snprintf(buf, sizeof buf, "%s", chain);
  char *save = NULL, *tok = strtok_r(buf, ".", &save);
  bool g = tok[0] == 'g';
  nb_fn *fn = nb_fn_create(g ? g_body : f_body, (void *)p, p->n_in + g, 1);
  nb_axes argnums = dp_first(p->n_in);
  while (fn && (tok = strtok_r(NULL, ".", &save))) {
    nb_fn *next = NULL;
    if (!strcmp(tok, "jit"))
      next = nb_jit(fn);
    else if (!strcmp(tok, "grad"))
      next = nb_grad(fn, argnums);
    else if (!strcmp(tok, "vjp"))
      next = nb_vjp_fn(fn);
    else if (!strcmp(tok, "jvp"))
      next = nb_jvp_fn(fn);
    else if (!strcmp(tok, "jacfwd"))
      next = nb_jacfwd(fn, argnums);
    else if (!strcmp(tok, "jacrev"))
      next = nb_jacrev(fn, argnums);
    else if (!strcmp(tok, "hessian"))
      next = nb_hessian(fn, argnums);
    else if (!strncmp(tok, "vmap:", 5)) {
      int in_axes[DP_MAX_ARGS], out_axes[DP_MAX_OUT];
      parse_vmap(tok, in_axes, nb_fn_n_in(fn), out_axes, nb_fn_n_out(fn));
      next = nb_vmap(fn, in_axes, out_axes);
    } else
      cr_assert_fail("program %d: unknown transform %s in %s", p->index, tok, chain);
    nb_fn_release(fn);
    fn = next;
  }
  return fn;
}

/* "f.eager": the ops at top level; "g.bwd": g at top level on leaves that
 * require grad, then nb_backward; outputs the gradients (zeros for leaves the
 * loss does not reach, and for all of them when only ops without derivative,
 * such as round, lead to the loss: it then keeps no provenance, and
 * nb_backward refuses a loss that does not require grad). */
static nb_status run_imperative(const dp_program *p, bool bwd, nb_tensor *const *args,
                                nb_tensor **out) {
  if (!bwd) {
    out[0] = dp_run(p, args);
    return out[0] ? NB_OK : nb_last_status();
  }
  nb_tensor *x[DP_MAX_ARGS];
  for (int k = 0; k < p->n_in; k++)
    x[k] = nb_set_requires_grad(nb_detach(args[k]), true);
  nb_tensor *y = dp_run(p, x);
  nb_tensor *loss = nb_sum(nb_mul(y, args[p->n_in]), NB_ALL, false);
  if (!loss) return nb_last_status();
  nb_status st = nb_requires_grad(loss) ? nb_backward(loss) : NB_OK;
  if (st != NB_OK) return st;
  for (int k = 0; k < p->n_in; k++) {
    out[k] = nb_grad_of(x[k]);
    if (!out[k]) out[k] = nb_zeros(nb_shape_of(args[k]), p->dt);
  }
  return NB_OK;
}

/* ---- comparing -------------------------------------------------------------------------- */
typedef struct tally {
  int programs, checks, outputs, passed, failed;
  double worst;       /* the largest error seen, as a fraction of its tolerance */
  char first[4][400]; /* the first failures */
} tally;

static void fail(tally *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(tally *t, const char *fmt, ...) {
  if (t->failed < 4) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->first[t->failed], sizeof t->first[0], fmt, ap);
    va_end(ap);
  }
  t->failed++;
}

/* Whether got (realized values, shape gs) matches ref within rtol; *why
 * describes a mismatch; *worst grows to the largest error / tolerance seen. */
static bool matches(const dp_ref *ref, nb_shape gs, const double *got, double rtol, char *why,
                    size_t cap, double *worst) {
  char a[160], b[160];
  if (!nbi_shape_eq(&gs, &ref->shape)) {
    snprintf(why, cap, "shape %s, expected %s", nb_shape_str(gs, a, sizeof a),
             nb_shape_str(ref->shape, b, sizeof b));
    return false;
  }
  int64_t n = tc_numel(ref->shape);
  if (ref->full) {
    double scale = 0;
    for (int64_t i = 0; i < n; i++)
      scale = fmax(scale, fabs(ref->v[i]));
    for (int64_t i = 0; i < n; i++) {
      double lim = rtol * (fabs(ref->v[i]) + scale);
      if (lim > 0) *worst = fmax(*worst, fabs(got[i] - ref->v[i]) / lim);
      if (!(fabs(got[i] - ref->v[i]) <= lim)) {
        snprintf(why, cap, "element %lld is %.10g, expected %.10g", (long long)i, got[i],
                 ref->v[i]);
        return false;
      }
    }
    return true;
  }
  for (int k = 0; k < ref->n_sample; k++) {
    int64_t i = ref->sample_idx[k];
    double want = ref->sample_v[k], lim = rtol * (fabs(want) + ref->scale);
    if (lim > 0) *worst = fmax(*worst, fabs(got[i] - want) / lim);
    if (!(fabs(got[i] - want) <= lim)) {
      snprintf(why, cap, "element %lld is %.10g, expected %.10g", (long long)i, got[i], want);
      return false;
    }
  }
  /* sum_i w_i (got_i - want_i) with weights independent of the errors: at
   * most 6 standard deviations of |error_i| <= 2 rtol max|want| */
  double *w = malloc(sizeof(double) * (size_t)n);
  bool ok = true;
  for (int k = 0; k < ref->n_proj && ok; k++) {
    dp_uniform(ref->wseed + (uint64_t)k, n, -1, 1, w);
    double s = 0, c = 0, w2 = 0;
    for (int64_t i = 0; i < n; i++) { /* Kahan */
      double y = w[i] * got[i] - c, t = s + y;
      c = (t - s) - y;
      s = t;
      w2 += w[i] * w[i];
    }
    double lim = rtol * (fabs(ref->proj[k]) + 12 * ref->scale * sqrt(w2));
    if (lim > 0) *worst = fmax(*worst, fabs(s - ref->proj[k]) / lim);
    if (!(fabs(s - ref->proj[k]) <= lim)) {
      snprintf(why, cap, "projection %d is %.10g, expected %.10g (tolerance %.3g)", k, s,
               ref->proj[k], lim);
      ok = false;
    }
  }
  free(w);
  return ok;
}

/* Runs check c of p and tallies its outputs. */
static void run_check(const dp_program *p, const dp_check *c, double rtol, tally *t) {
  nb_scope_begin();
  nb_tensor *args[DP_MAX_ARGS], *out[DP_MAX_OUT] = {0};
  for (int k = 0; k < c->n_args; k++)
    args[k] = dp_slot_tensor(p, c->args[k]);
  const char *dot = strchr(c->chain, '.');
  bool eager = dot && !strcmp(dot, ".eager"), bwd = dot && !strcmp(dot, ".bwd");
  nb_status st;
  int n_out = c->n_out;
  if (eager || bwd) {
    st = run_imperative(p, bwd, args, out);
  } else {
    nb_fn *fn = build_chain(p, c->chain);
    st = fn ? nb_call(fn, args, out) : nb_last_status();
    if (fn && nb_fn_n_out(fn) != n_out) {
      fail(t, "program %d (%s) %s: %d outputs, expected %d", p->index, nb_dtype_name(p->dt),
           c->chain, nb_fn_n_out(fn), n_out);
      n_out = 0;
    }
    nb_fn_release(fn);
  }
  t->checks++;
  if (st != NB_OK) {
    fail(t, "program %d (%s) %s: %s", p->index, nb_dtype_name(p->dt), c->chain, nb_last_error());
    nb_clear_error();
    n_out = 0;
  }
  for (int k = 0; k < n_out; k++) {
    if (c->refs[k] < 0) continue;
    t->outputs++;
    double *got = tc_read(out[k]);
    char why[240];
    if (matches(&p->refs[c->refs[k]], nb_shape_of(out[k]), got, rtol, why, sizeof why, &t->worst))
      t->passed++;
    else
      fail(t, "program %d (%s, %s) %s output %d: %s", p->index, nb_dtype_name(p->dt),
           p->large ? "large" : "small", c->chain, k, why);
    free(got);
  }
  nb_scope_end();
}

/* Runs every check of the programs of dtype dt and size class large. */
static void run_programs(nb_dtype dt, bool large) {
  dp_file df = dp_load();
  tally t = {0};
  for (int i = 0; i < df.n; i++) {
    const dp_program *p = &df.progs[i];
    if (p->dt != dt || p->large != large) continue;
    t.programs++;
    for (int k = 0; k < p->n_checks; k++)
      run_check(p, &p->checks[k], df.rtol[dt == NB_F64], &t);
  }
  dp_free(&df);
  cr_log_info("diff %s %s: %d programs, %d checks, %d of %d outputs match JAX (largest error %.3g "
              "of the tolerance)",
              nb_dtype_name(dt), large ? "large" : "small", t.programs, t.checks, t.passed,
              t.outputs, t.worst);
  for (int k = 0; k < t.failed && k < 4; k++)
    cr_log_error("%s", t.first[k]);
  cr_assert_gt(t.programs, 0, "no %s %s programs in test/diff/programs.txt", nb_dtype_name(dt),
               large ? "large" : "small");
  cr_assert_eq(t.failed, 0, "%d of %d outputs (%d checks) differ from JAX; first: %s", t.failed,
               t.outputs, t.checks, t.first[0]);
}

Test(diff, small_programs_f32) { run_programs(NB_F32, false); }
Test(diff, small_programs_f64) { run_programs(NB_F64, false); }
Test(diff, large_programs_f32) { run_programs(NB_F32, true); }
Test(diff, large_programs_f64) { run_programs(NB_F64, true); }
