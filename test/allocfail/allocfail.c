/* test/allocfail/allocfail.c — the allocation-failure sweep (make test-allocfail).
 *
 * The library's malloc, calloc, realloc, aligned_alloc, posix_memalign, strdup and
 * free reach the __wrap_ functions below (linked with -Wl,--wrap=...: every
 * reference in libnabla.a and in this file). Armed with N, they fail the Nth
 * allocation from then on (NULL / ENOMEM), alone or, in the persistent mode,
 * with every one after it; they count the blocks allocated and not yet freed.
 *
 * One training step of a small MLP (f64: x [8,3] -> tanh(x W1 + b1) W2 + b2,
 * mean squared error against y, SGD with lr 0.1) is written in each style the
 * library offers: imperative (nb_backward), functional (nb_value_and_grad), jitted
 * (nb_jit of the whole update), sharded (the batch over a virtual 2-device mesh),
 * shard_map (the same written per device, with an all-reduce), checkpointed (the
 * hidden layer under nb_checkpoint) and scanned (the loss an nb_scan over the
 * batch rows). Each style is swept cold (its nb_fns made inside
 * the step, so tracing is swept too) and warm (made and run once before: the
 * jit's program and the plans in place) with one failure, and cold in the
 * persistent mode (warm too with --persist alone). For each N = 1, 2, ...
 * until a step makes fewer than N allocations, a fresh thread (its own scopes,
 * plan cache and lazy set, released when it exits) runs:
 *   1. the step with allocation N failing: it must return NB_OK with the right
 *      numbers, or NB_ERR_OOM with that error recorded (no other status, no OK
 *      with an error recorded, no crash, scopes balanced);
 *   2. the same step again with fresh parameters and nothing failing: the right
 *      numbers (the library still works after the failure).
 * After the thread exits, every tensor handle, tensor byte and allocated block
 * must be back (nb_stats live_tensors / live_bytes and the wrappers' count as
 * before); on a difference LeakSanitizer reports the unreachable blocks.
 * Reference numbers come from a plain double C implementation of the step.
 *
 *   allocfail [STYLE...] [--once | --persist] [--from N] [--only N] [--verbose] [--stack]
 * The buffer cache is off (NABLA_CACHE_BYTES=0), so every tensor buffer is an
 * allocation. Prints the allocation indices swept per style and mode; exits 1 on
 * the first failure, naming the style, N, the mode and what went wrong; --stack
 * prints the stack of each failing allocation N (AddressSanitizer builds). */
#include <errno.h>
#include <math.h>
#include <nabla/nabla.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define AF_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AF_LSAN 1
#endif
#endif
#ifdef AF_LSAN
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#endif

/* ---- the failing allocator ------------------------------------------------------------------ */
void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
char *__real_strdup(const char *s);
void __real_free(void *p);

static atomic_bool armed;
static atomic_long n_calls;  /* allocations since armed */
static long fail_at;         /* the first call that fails (1-based) */
static bool persist;         /* --persist: every call from fail_at on fails */
static atomic_bool failed;   /* a call failed */
static bool show_stack;      /* --stack: print where the first one failed */
static atomic_long n_blocks; /* blocks allocated through the wrappers, not yet freed */

static bool fail_now(void) {
  if (!atomic_load(&armed)) return false;
  long k = atomic_fetch_add(&n_calls, 1) + 1;
  if (k < fail_at || (k > fail_at && !persist)) return false;
#ifdef AF_LSAN
  if (show_stack && k == fail_at) __sanitizer_print_stack_trace();
#endif
  atomic_store(&failed, true);
  errno = ENOMEM;
  return true;
}

static void *counted(void *p) {
  if (p) atomic_fetch_add(&n_blocks, 1);
  return p;
}

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : counted(__real_malloc(n)); }
void *__wrap_calloc(size_t k, size_t n) { return fail_now() ? NULL : counted(__real_calloc(k, n)); }
void *__wrap_realloc(void *p, size_t n) {
  if (fail_now()) return NULL;
  void *q = __real_realloc(p, n);
  return p ? q : counted(q);
}
void *__wrap_aligned_alloc(size_t a, size_t n) {
  return fail_now() ? NULL : counted(__real_aligned_alloc(a, n));
}
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
  if (fail_now()) return ENOMEM;
  int rc = __real_posix_memalign(p, a, n);
  if (!rc) counted(*p);
  return rc;
}
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : counted(__real_strdup(s)); }
void __wrap_free(void *p) {
  if (p) atomic_fetch_sub(&n_blocks, 1);
  __real_free(p);
}

static void arm(long n) {
  atomic_store(&n_calls, 0);
  atomic_store(&failed, false);
  fail_at = n;
  atomic_store(&armed, true);
}
static void disarm(void) { atomic_store(&armed, false); }

/* ---- the model and its reference ------------------------------------------------------------ */
enum { B = 8, D = 3, H = 4, N_PARAMS = 4 };
#define LR 0.1
static const nb_shape param_shape[N_PARAMS] = {
    {2, {D, H}}, {1, {H}}, {2, {H, 1}}, {1, {1}}}; /* W1 b1 W2 b2 */
static const int64_t param_numel[N_PARAMS] = {D * H, H, H, 1};
static double init_p[N_PARAMS][D * H], data_x[B * D], data_y[B];

static void make_data(void) {
  uint64_t s = 12345;
  double *all[N_PARAMS + 2] = {init_p[0], init_p[1], init_p[2], init_p[3], data_x, data_y};
  const int64_t n[N_PARAMS + 2] = {D * H, H, H, 1, B * D, B};
  for (int k = 0; k < N_PARAMS + 2; k++)
    for (int64_t i = 0; i < n[k]; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      all[k][i] = (double)(s >> 11) * 0x1.0p-53 * 2 - 1;
    }
}

/* The step in double C: *loss and the updated parameters. */
static void reference_step(double *loss, double p[N_PARAMS][D * H]) {
  const double *w1 = init_p[0], *b1 = init_p[1], *w2 = init_p[2], *b2 = init_p[3];
  double h[B][H], r[B], g[N_PARAMS][D * H] = {{0}};
  double l = 0;
  for (int i = 0; i < B; i++) {
    double o = b2[0];
    for (int j = 0; j < H; j++) {
      double a = b1[j];
      for (int k = 0; k < D; k++)
        a += data_x[i * D + k] * w1[k * H + j];
      h[i][j] = tanh(a);
      o += h[i][j] * w2[j];
    }
    r[i] = o - data_y[i];
    l += r[i] * r[i];
  }
  *loss = l / B;
  for (int i = 0; i < B; i++) {
    double dout = 2 * r[i] / B;
    g[3][0] += dout;
    for (int j = 0; j < H; j++) {
      g[2][j] += h[i][j] * dout;
      double dpre = dout * w2[j] * (1 - h[i][j] * h[i][j]);
      g[1][j] += dpre;
      for (int k = 0; k < D; k++)
        g[0][k * H + j] += data_x[i * D + k] * dpre;
    }
  }
  for (int k = 0; k < N_PARAMS; k++)
    for (int64_t i = 0; i < param_numel[k]; i++)
      p[k][i] = init_p[k][i] - LR * g[k][i];
}
static double ref_loss, ref_p[N_PARAMS][D * H];

/* ---- the styles ----------------------------------------------------------------------------- */
/* A style's nb_fns (any may be NULL) and its mesh. */
typedef struct fns {
  nb_fn *f[4];
  nb_mesh *mesh;
} fns;

static void fns_release(fns *s) {
  for (int k = 0; k < 4; k++)
    nb_fn_release(s->f[k]);
  nb_mesh_release(s->mesh);
  *s = (fns){0};
}

/* tanh(x W1 + b1) W2 + b2 -> mean((. - y)^2); hidden: the hidden layer's nb_fn
 * (x, W1, b1) -> h, or NULL to record it inline. */
static nb_tensor *mlp_loss(nb_tensor *const *p, nb_tensor *x, nb_tensor *y, nb_fn *hidden) {
  nb_tensor *h = NULL;
  if (hidden) {
    nb_tensor *in[3] = {x, p[0], p[1]};
    if (nb_call(hidden, in, &h)) return NULL;
  } else {
    h = nb_tanh(nb_add(nb_matmul(x, p[0]), p[1]));
  }
  nb_tensor *out = nb_add(nb_matmul(h, p[2]), p[3]);
  return nb_mean(nb_square(nb_sub(out, y)), NB_ALL, false);
}

static nb_status hidden_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_tanh(nb_add(nb_matmul(in[0], in[1]), in[2]));
  return out[0] ? NB_OK : nb_last_status();
}

/* in: W1 b1 W2 b2 x y -> the loss; u: the hidden layer's nb_fn or NULL */
static nb_status loss_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = mlp_loss(in, in[N_PARAMS], in[N_PARAMS + 1], u);
  return out[0] ? NB_OK : nb_last_status();
}

/* The data-parallel loss, per device (an nb_shard_map body): in = x and y blocks,
 * W1 b1 W2 b2; the squared errors of the block summed, all-reduced over dp, / B. */
static nb_status block_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *h = nb_tanh(nb_add(nb_matmul(in[0], in[2]), in[3]));
  nb_tensor *e = nb_sub(nb_add(nb_matmul(h, in[4]), in[5]), in[1]);
  out[0] = nb_div_scalar(nb_all_reduce(nb_sum(nb_square(e), NB_ALL, false), "dp", NB_SUM), B);
  return out[0] ? NB_OK : nb_last_status();
}

/* in: W1 b1 W2 b2 x y -> the loss, by the shard_map u */
static nb_status smap_loss_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *a[N_PARAMS + 2] = {in[N_PARAMS], in[N_PARAMS + 1], in[0], in[1], in[2], in[3]};
  return nb_call(u, a, out);
}

/* The scanned loss: a scan over the batch rows, carry = the sum of squared
 * errors so far; the body's user is the (traced) parameters. */
static nb_status row_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *const *p = u; /* in: carry [], x row [D], y row [1] */
  nb_tensor *h = nb_tanh(nb_add(nb_matmul(nb_unsqueeze(in[1], 0), p[0]), p[1]));
  nb_tensor *o = nb_reshape(nb_add(nb_matmul(h, p[2]), p[3]), NB_SHAPE(1));
  out[0] = nb_add(in[0], nb_sum(nb_square(nb_sub(o, in[2])), NB_ALL, false));
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status scan_loss_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_fn *body = nb_fn_create(row_body, (void *)in, 3, 1);
  if (!body) return nb_last_status();
  nb_tensor *init = nb_zeros(NB_SCALAR_SHAPE, NB_F64), *carry = NULL;
  nb_tensor *xs[2] = {in[N_PARAMS], in[N_PARAMS + 1]};
  nb_status st = init ? nb_scan(body, &init, 1, xs, 2, false, &carry, NULL) : nb_last_status();
  nb_fn_release(body);
  if (st) return st;
  out[0] = nb_div_scalar(carry, B);
  return out[0] ? NB_OK : nb_last_status();
}

/* in: W1 b1 W2 b2 x y -> loss, the updated W1 b1 W2 b2; u: value_and_grad of the loss */
static nb_status update_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  nb_tensor *o[1 + N_PARAMS];
  nb_status st = nb_call(u, in, o);
  if (st) return st;
  out[0] = o[0];
  for (int k = 0; k < N_PARAMS; k++)
    out[1 + k] = nb_sub(in[k], nb_mul_scalar(o[1 + k], LR));
  return nb_last_status();
}

static const nb_axes param_argnums = {N_PARAMS, {0, 1, 2, 3}};

/* f[0]: value_and_grad of loss_body with user u (f[1]: u, when it is an nb_fn). */
static nb_status make_vg(fns *s, nb_fn_body body, nb_fn *u) {
  nb_fn *loss = nb_fn_create(body, u, N_PARAMS + 2, 1);
  s->f[0] = nb_value_and_grad(loss, param_argnums);
  nb_fn_release(loss);
  s->f[1] = u;
  return s->f[0] ? NB_OK : nb_last_status();
}

static nb_status setup_none(fns *s) {
  (void)s;
  return NB_OK;
}
static nb_status setup_functional(fns *s) { return make_vg(s, loss_body, NULL); }
static nb_status setup_checkpoint(fns *s) {
  nb_fn *hidden = nb_fn_create(hidden_body, NULL, 3, 1);
  nb_fn *ck = nb_checkpoint(hidden);
  nb_fn_release(hidden);
  if (!ck) return nb_last_status();
  return make_vg(s, loss_body, ck);
}
static nb_status setup_scan(fns *s) { return make_vg(s, scan_loss_body, NULL); }
static nb_status setup_jit(fns *s) {
  nb_status st = make_vg(s, loss_body, NULL);
  if (st) return st;
  nb_fn *step = nb_fn_create(update_body, s->f[0], N_PARAMS + 2, 1 + N_PARAMS);
  s->f[2] = nb_jit(step);
  nb_fn_release(step);
  return s->f[2] ? NB_OK : nb_last_status();
}
static nb_status setup_sharded(fns *s) {
  if (!(s->mesh = nb_mesh_cpu("dp=2"))) return nb_last_status();
  return make_vg(s, loss_body, NULL);
}

static nb_status setup_shard_map(fns *s) {
  if (!(s->mesh = nb_mesh_cpu("dp=2"))) return nb_last_status();
  static const char *const in_specs[N_PARAMS + 2] = {"dp, _", "dp, _", "_, _", "_", "_, _", "_"};
  nb_fn *body = nb_fn_create(block_body, NULL, N_PARAMS + 2, 1);
  nb_fn *smap = nb_shard_map(body, s->mesh, in_specs, (const char *const[]){""});
  nb_fn_release(body);
  if (!smap) return nb_last_status();
  return make_vg(s, smap_loss_body, smap);
}

/* The parameters (W1 b1 W2 b2) and data (x y) of one step: p[0..5]. */
static nb_status make_inputs(const fns *s, nb_tensor **p) {
  for (int k = 0; k < N_PARAMS; k++)
    p[k] = nb_from_data(init_p[k], param_shape[k], NB_F64);
  p[N_PARAMS] = nb_from_data(data_x, NB_SHAPE(B, D), NB_F64);
  p[N_PARAMS + 1] = nb_from_data(data_y, NB_SHAPE(B, 1), NB_F64);
  if (s->mesh) {
    static const char *const spec[N_PARAMS + 2] = {"_, _", "_", "_, _", "_", "dp, _", "dp, _"};
    for (int k = 0; k < N_PARAMS + 2; k++)
      p[k] = nb_shard(p[k], s->mesh, spec[k]);
  }
  return nb_last_status();
}

/* p[k] -= LR * g[k] for the four parameters. */
static nb_status apply_grads(nb_tensor **p, nb_tensor *const *g) {
  nb_status st = NB_OK;
  for (int k = 0; k < N_PARAMS && !st; k++)
    st = nb_assign(p[k], nb_sub(p[k], nb_mul_scalar(g[k], LR)));
  return st;
}

static nb_status step_imperative(const fns *s, nb_tensor **p, double *loss) {
  (void)s;
  for (int k = 0; k < N_PARAMS; k++)
    if (!nb_set_requires_grad(p[k], true)) return nb_last_status();
  nb_tensor *l = mlp_loss(p, p[N_PARAMS], p[N_PARAMS + 1], NULL);
  nb_status st = l ? nb_backward(l) : nb_last_status();
  nb_tensor *g[N_PARAMS];
  for (int k = 0; k < N_PARAMS && !st; k++)
    if (!(g[k] = nb_grad_of(p[k]))) st = nb_last_status() ? nb_last_status() : NB_ERR_INTERNAL;
  if (!st) st = apply_grads(p, g);
  for (int k = 0; k < N_PARAMS; k++)
    nb_zero_grad(p[k]);
  if (!st) *loss = nb_item(l);
  return st ? st : nb_last_status();
}

/* value_and_grad (s->f[0]) called on p, then the SGD update. */
static nb_status step_vg(const fns *s, nb_tensor **p, double *loss) {
  nb_tensor *o[1 + N_PARAMS];
  nb_status st = nb_call(s->f[0], p, o);
  if (!st) st = apply_grads(p, o + 1);
  if (!st) *loss = nb_item(o[0]);
  return st ? st : nb_last_status();
}

/* the jitted update (s->f[2]) called on p, its results assigned. */
static nb_status step_jit(const fns *s, nb_tensor **p, double *loss) {
  nb_tensor *o[1 + N_PARAMS];
  nb_status st = nb_call(s->f[2], p, o);
  for (int k = 0; k < N_PARAMS && !st; k++)
    st = nb_assign(p[k], o[1 + k]);
  if (!st) *loss = nb_item(o[0]);
  return st ? st : nb_last_status();
}

typedef struct style {
  const char *name;
  nb_status (*setup)(fns *s);
  nb_status (*step)(const fns *s, nb_tensor **p, double *loss);
} style;

static const style styles[] = {
    {"imperative", setup_none, step_imperative},
    {"functional", setup_functional, step_vg},
    {"jit", setup_jit, step_jit},
    {"sharded", setup_sharded, step_vg},
    {"shard_map", setup_shard_map, step_vg},
    {"checkpoint", setup_checkpoint, step_vg},
    {"scan", setup_scan, step_vg},
};
enum { N_STYLES = sizeof styles / sizeof styles[0] };

/* ---- one run -------------------------------------------------------------------------------- */
typedef struct run {
  const style *st;
  bool warm;
  long fail_at;  /* 0: no failure */
  long n_allocs; /* allocations the armed step made */
  bool hit;      /* the failure happened */
  nb_status got; /* what the failing step returned */
  char err[200]; /* and the error it recorded */
  char why[1200];
} run;

/* Compares the step's loss and parameters with the reference (r->why says how
 * they differ). */
static bool check_numbers(run *r, const char *what, nb_tensor *const *p, double loss) {
  if (!(fabs(loss - ref_loss) <= 1e-12 * fabs(ref_loss))) {
    snprintf(r->why, sizeof r->why, "%s: loss %.17g, expected %.17g", what, loss, ref_loss);
    return false;
  }
  for (int k = 0; k < N_PARAMS; k++) {
    double v[D * H];
    nb_status st = nb_to_host(p[k], v, sizeof(double) * (size_t)param_numel[k]);
    if (st) {
      snprintf(r->why, sizeof r->why, "%s: reading parameter %d: %s", what, k, nb_last_error());
      return false;
    }
    for (int64_t i = 0; i < param_numel[k]; i++)
      if (!(fabs(v[i] - ref_p[k][i]) <= 1e-12 * (1 + fabs(ref_p[k][i])))) {
        snprintf(r->why, sizeof r->why, "%s: parameter %d[%lld] is %.17g, expected %.17g", what, k,
                 (long long)i, v[i], ref_p[k][i]);
        return false;
      }
  }
  return true;
}

/* One step of r's style in a scope: (cold: the style's functions,) fresh inputs
 * and the step, armed with r->fail_at when armed_step; its numbers checked when it
 * succeeds. */
static bool one_step(run *r, fns *s, bool armed_step) {
  bool ok = true;
  nb_tensor *p[N_PARAMS + 2];
  nb_scope_begin();
  nb_status st = NB_OK;
  double loss = NAN;
  if (armed_step) arm(r->fail_at);
  if (armed_step && !r->warm) st = r->st->setup(s); /* the mesh first: the inputs go on it */
  if (!st) st = make_inputs(s, p);
  if (!st) st = r->st->step(s, p, &loss);
  if (armed_step) {
    disarm();
    r->n_allocs = atomic_load(&n_calls);
    r->hit = atomic_load(&failed);
  }
  nb_status rec = nb_last_status();
  if (armed_step) {
    r->got = st;
    snprintf(r->err, sizeof r->err, "%s", nb_last_error());
  }
  const char *what = armed_step ? "the failing step" : "the next step";
  if (st != rec) {
    snprintf(r->why, sizeof r->why, "%s returned %s while %s is recorded (%s)", what,
             nb_status_str(st), nb_status_str(rec), nb_last_error());
    ok = false;
  } else if (st != NB_OK && !(armed_step && r->hit && st == NB_ERR_OOM)) {
    snprintf(r->why, sizeof r->why, "%s failed with %s: %s", what, nb_status_str(st),
             nb_last_error());
    ok = false;
  } else if (st == NB_OK) {
    ok = check_numbers(r, what, p, loss);
  }
  nb_clear_error();
  if (nb_scope_end() != NB_OK) {
    snprintf(r->why, sizeof r->why, "%s left the scopes unbalanced: %s", what, nb_last_error());
    ok = false;
  }
  return ok;
}

static void *run_thread(void *arg) {
  run *r = arg;
  fns s = {0};
  bool ok = true;
  nb_clear_error();
  if (r->warm) {
    if (r->st->setup(&s)) {
      snprintf(r->why, sizeof r->why, "setup: %s", nb_last_error());
      ok = false;
    }
    ok = ok && one_step(r, &s, false);
  }
  ok = ok && one_step(r, &s, true);
  if (ok) { /* the same functions (warm) or new ones (cold): the library still works */
    if (!r->warm) {
      fns_release(&s);
      ok = r->st->setup(&s) == NB_OK;
      if (!ok) snprintf(r->why, sizeof r->why, "setup after the failure: %s", nb_last_error());
    }
    ok = ok && one_step(r, &s, false);
  }
  fns_release(&s);
  nb_clear_error();
  return ok ? NULL : r;
}

/* Runs r in a fresh thread; "" in r->why when everything held. */
static bool run_once(run *r) {
  nb_stats before = nb_get_stats();
  long blocks_before = atomic_load(&n_blocks);
  pthread_t th;
  r->why[0] = '\0';
  if (pthread_create(&th, NULL, run_thread, r)) {
    snprintf(r->why, sizeof r->why, "pthread_create failed");
    return false;
  }
  void *res;
  pthread_join(th, &res);
  if (res) return false;
  nb_stats after = nb_get_stats();
  long blocks = atomic_load(&n_blocks) - blocks_before;
  if (after.live_tensors == before.live_tensors && after.live_bytes == before.live_bytes &&
      blocks == 0)
    return true;
  snprintf(r->why, sizeof r->why,
           "leak: %lld tensor handles, %lld buffer bytes and %ld allocated blocks more than "
           "before the thread%s",
           (long long)(after.live_tensors - before.live_tensors),
           (long long)(after.live_bytes - before.live_bytes), blocks,
#ifdef AF_LSAN
           __lsan_do_recoverable_leak_check() ? " (LeakSanitizer's report above)" : ""
#else
           ""
#endif
  );
  return false;
}

/* Sweeps style k (cold or warm) for N = from.. (only N when only); 0 when all held. */
static int sweep(int k, bool warm, long from, long only, bool verbose) {
  run r = {.st = &styles[k], .warm = warm};
  const char *mode = persist ? "from the Nth on" : "the Nth alone";
  long n = only ? only : from, last = 0;
  for (;; n++) {
    r.fail_at = n;
    bool ok = run_once(&r);
    if (verbose)
      fprintf(stderr, "%s %s, %s, N=%ld: %s (the step: %s %s)\n", r.st->name,
              warm ? "warm" : "cold", mode, n, ok ? "ok" : r.why, nb_status_str(r.got), r.err);
    if (!ok) {
      fprintf(stderr, "allocfail: %s (%s), allocation %ld failing (%s): %s\n", r.st->name,
              warm ? "warm" : "cold", n, mode, r.why);
      return 1;
    }
    if (!r.hit || only) break;
    last = n;
  }
  if (only)
    printf("allocfail: %-10s %s, failing %s: N = %ld held\n", r.st->name, warm ? "warm" : "cold",
           mode, only);
  else
    printf("allocfail: %-10s %s, failing %s: N = %ld..%ld swept (the step makes %ld "
           "allocations)\n",
           r.st->name, warm ? "warm" : "cold", mode, from, last, r.n_allocs);
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  setenv("NABLA_CACHE_BYTES", "0", 1);
  long from = 1, only = 0;
  bool verbose = false, pick[N_STYLES] = {0}, any_pick = false, mode_once = true,
       mode_persist = true;
  for (int a = 1; a < argc; a++) {
    if (!strcmp(argv[a], "--from") && a + 1 < argc) {
      from = atol(argv[++a]);
    } else if (!strcmp(argv[a], "--only") && a + 1 < argc) {
      only = atol(argv[++a]);
    } else if (!strcmp(argv[a], "--verbose")) {
      verbose = true;
    } else if (!strcmp(argv[a], "--stack")) {
      show_stack = true;
    } else if (!strcmp(argv[a], "--once")) {
      mode_persist = false;
    } else if (!strcmp(argv[a], "--persist")) {
      mode_once = false;
    } else {
      int k = 0;
      while (k < N_STYLES && strcmp(argv[a], styles[k].name))
        k++;
      if (k == N_STYLES) {
        fprintf(stderr, "allocfail: unknown style or option '%s'\n", argv[a]);
        return 2;
      }
      pick[k] = any_pick = true;
    }
  }
  make_data();
  reference_step(&ref_loss, ref_p);
  for (int k = 0; k < N_STYLES; k++) {
    if (any_pick && !pick[k]) continue;
    for (int warm = 0; warm < 2; warm++) {
      run r = {.st = &styles[k], .warm = warm};
      if (!run_once(&r)) { /* no failure: the step itself must hold */
        fprintf(stderr, "allocfail: %s (%s), no failure injected: %s\n", r.st->name,
                warm ? "warm" : "cold", r.why);
        return 1;
      }
      for (int m = 0; m < 2; m++) {
        if (!(m ? mode_persist && (!warm || !mode_once) : mode_once)) continue;
        persist = m;
        if (sweep(k, warm, from, only, verbose)) return 1;
      }
    }
  }
  return 0;
}
