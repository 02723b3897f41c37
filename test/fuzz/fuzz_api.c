/* test/fuzz/fuzz_api.c — libFuzzer target over the public API (make fuzz, make fuzz-ci).
 *
 * The input is a program: each step reads an opcode byte, then its arguments,
 * and makes one public call: creation with any shapes and dtypes (empty, huge,
 * negative, more than 8 dims), every op with any axes and arguments, einsum
 * strings, indexing, reshape / slice / pad, scopes (begin, end, keep, retain,
 * release; unbalanced too), realization at any point (nb_eval, nb_item, nb_to_host,
 * nb_fprint, nb_graph_dot), imperative autodiff, devices, meshes and sharding specs
 * (from a grammar or raw bytes), small generated functions (fuzz_body: the bytes
 * of a program run on its inputs) under every transform (grad, value_and_grad,
 * vjp, jvp, jacrev, jacfwd, hessian, vmap with any axes, jit, checkpoint,
 * shard_map), nested and called, and control flow (cond, scan, fori_loop, a
 * while_loop that terminates). Bytes past the end read as zeros.
 *
 * Each input runs in a fresh thread (its scopes, plans and lazy set go when it
 * exits). The tensors the program can reach are a pool of slots, each remembering
 * the scope depth that holds it, so the program never touches a tensor a scope
 * released. Checked after every call: a NULL result or an error status comes with
 * a recorded error, a result or NB_OK with none, nb_call's outputs all NULL on
 * error; a crash, a sanitizer report or a leak is a library bug. Tensors above
 * POOL_NUMEL elements never enter the pool (lazy: never computed), and creation
 * asks only for small, empty or impossible (>= 2^42 elements) sizes, so no run
 * computes much; function calls whose Jacobian transforms would multiply sizes
 * take small inputs only. */
#include <pthread.h>

#include "fuzz.h"

FILE *fuzz_devnull;
bool fuzz_trace;

/* Huge creations must fail as NB_ERR_OOM, not abort in the sanitizer. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* ---- functions ------------------------------------------------------------------------------ */
/* A generated body: its inputs and captures are a pool, its bytes a program
 * run on it (errors of its calls are dropped, as a program that checks them
 * would); out[j] are pool slots after it ran. The first output is summed to a
 * scalar when the body's second byte is odd, so that grad applies. */
static nb_status fuzz_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  prog *g = user;
  pool p = {0};
  for (int k = 0; k < n_in; k++)
    pool_put(&p, in[k], 0);
  for (int k = 0; k < 2; k++)
    if (g->capt[k]) pool_put(&p, g->capt[k], 0);
  reader r = {g->code, (size_t)g->len, 0};
  uint8_t sel = u8(&r), reduce = u8(&r);
  fuzz_run_ops(g->st, &p, &r, BODY_STEPS, true);
  nb_clear_error();
  for (int j = 0; j < n_out; j++) {
    out[j] = p.s[(sel + j) % POOL].t;
    if (!out[j] && n_in > 0) out[j] = in[j % n_in];
    if (out[j] && j == 0 && reduce % 2)
      out[j] = nb_sum(nb_cast(out[j], reduce % 4 == 1 ? NB_F32 : NB_F64), NB_ALL, false);
    if (!out[j]) return nb_last_status() ? nb_last_status() : NB_ERR_ARG;
  }
  return NB_OK;
}

/* while_loop pieces that always end: in[0] is a counter the fuzzer made (an
 * i64 or f32 zero), the loop runs while in[0] < limit, and the body adds one to
 * it and updates the other carries by op, cast back to their dtypes. */
static nb_status while_cond(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_in, (void)n_out;
  out[0] = nb_lt_scalar(in[0], (double)((const prog *)user)->limit);
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status while_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)n_out;
  const prog *g = user;
  out[0] = nb_cast(nb_add_scalar(in[0], 1), nb_dtype_of(in[0]));
  for (int k = 1; k < n_in; k++) {
    nb_tensor *x = in[k];
    switch (g->op % 4) {
    case 0: x = nb_sin(x); break;
    case 1: x = nb_mul_scalar(x, 0.5); break;
    case 2: x = nb_flip(x, NB_ALL); break;
    default: break;
    }
    out[k] = nb_cast(x, nb_dtype_of(in[k]));
  }
  for (int k = 0; k < n_in; k++)
    if (!out[k]) return nb_last_status() ? nb_last_status() : NB_ERR_ARG;
  return NB_OK;
}

static prog *new_prog(state *st, reader *r, pool *p) {
  if (st->n_progs == MAX_PROGS) return NULL;
  prog *g = &st->progs[st->n_progs++];
  *g = (prog){.st = st};
  g->len = u8(r) % (PROG_BYTES + 1);
  for (int k = 0; k < g->len; k++)
    g->code[k] = u8(r);
  for (int k = 0; k < 2; k++)
    if (u8(r) % 4 == 0) g->capt[k] = nb_retain(pick(p, r));
  g->limit = u8(r) % 6;
  g->op = u8(r);
  return g;
}

static void fn_put(state *st, nb_fn *f, int jac) {
  if (!f) return;
  if (st->n_fns == MAX_FNS) {
    nb_fn_release(f);
    return;
  }
  st->fns[st->n_fns++] = (fn_slot){f, jac};
}

static fn_slot *pick_fn(state *st, reader *r) {
  uint8_t v = u8(r);
  return st->n_fns && v != 255 ? &st->fns[v % st->n_fns] : NULL;
}

/* Whether calling a function on these inputs stays small: each Jacobian
 * transform multiplies the work by the inputs' size. */
static bool call_small(int jac, nb_tensor *const *in, int n_in) {
  int64_t total = 0;
  for (int k = 0; k < n_in; k++)
    total += in[k] ? nb_numel(in[k]) : 0;
  return jac == 0 || (jac == 1 && total <= 32) || (jac == 2 && total <= 6) || total <= 2;
}

static nb_fn *shard_map_of(state *st, reader *r, nb_fn *f) {
  nb_mesh *m = pick_mesh(st, r);
  char specs[2][8][24];
  const char *in_s[MAX_ARITY], *out_s[MAX_ARITY];
  for (int k = 0; k < 8; k++) {
    spec_string(r, specs[0][k], sizeof specs[0][k]);
    spec_string(r, specs[1][k], sizeof specs[1][k]);
  }
  for (int k = 0; k < MAX_ARITY; k++)
    in_s[k] = k < 8 ? specs[0][k] : "_", out_s[k] = k < 8 ? specs[1][k] : "_";
  if (f && (nb_fn_n_in(f) > MAX_ARITY || nb_fn_n_out(f) > MAX_ARITY)) return NULL;
  nb_clear_error();
  return nb_shard_map(f, m, in_s, out_s);
}

void fuzz_make_fn(state *st, pool *p, reader *r) {
  uint8_t kind = u8(r) % 16;
  if (kind < 3) { /* kind 2: arities one lower, so invalid ones come up */
    prog *g = new_prog(st, r, p);
    if (!g) return;
    g->n_in = u8(r) % 6 - (kind == 2);
    g->n_out = 1 + u8(r) % 3 - (kind == 2);
    nb_clear_error();
    fn_put(st, nb_fn_create(fuzz_body, g, g->n_in, g->n_out), 0);
    CHECK((g->n_in >= 0 && g->n_out >= 1) == (nb_last_status() == NB_OK), "nb_fn_create(%d, %d)",
          g->n_in, g->n_out);
    return;
  }
  fn_slot *fs = pick_fn(st, r);
  nb_fn *f = fs ? fs->f : NULL;
  int jac = fs ? fs->jac : 0;
  nb_axes argnums = axes_arg(r);
  int ax_in[MAX_ARITY], ax_out[MAX_ARITY];
  for (int k = 0; k < MAX_ARITY; k++) {
    ax_in[k] = k < 4 ? axis_arg(r) : 0;
    ax_out[k] = k < 4 ? axis_arg(r) : 0;
  }
  nb_fn *g = NULL;
  if (kind == 14) {
    g = shard_map_of(st, r, f);
  } else {
    bool in_null = flag(r), out_null = flag(r);
    nb_clear_error();
    switch (kind) {
    case 3: g = nb_grad(f, argnums); break;
    case 4: g = nb_value_and_grad(f, argnums); break;
    case 5: g = nb_vjp_fn(f); break;
    case 6: g = nb_jvp_fn(f); break;
    case 7: g = nb_jacrev(f, argnums), jac += 1; break;
    case 8: g = nb_jacfwd(f, argnums), jac += 1; break;
    case 9: g = nb_hessian(f, argnums), jac += 2; break;
    case 10:
    case 11:
      if (f && (nb_fn_n_in(f) > MAX_ARITY || nb_fn_n_out(f) > MAX_ARITY)) return;
      g = nb_vmap(f, in_null ? NULL : ax_in, out_null ? NULL : ax_out);
      break;
    case 12: g = nb_jit(f); break;
    case 13: g = nb_checkpoint(f); break;
    default: /* reference counting and queries */
      if (f) {
        nb_fn_release(nb_fn_retain(f));
        CHECK(nb_fn_n_in(f) >= 0 && nb_fn_n_out(f) >= 1, "nb_fn arity %d -> %d", nb_fn_n_in(f),
              nb_fn_n_out(f));
      }
      CHECK(nb_fn_n_in(NULL) == -1 && nb_fn_n_out(NULL) == -1, "nb_fn_n_in(NULL)");
      return;
    }
  }
  CHECK(g || nb_last_status() != NB_OK, "transform %d returned NULL with no error recorded", kind);
  CHECK(!g || nb_last_status() == NB_OK, "transform %d returned a function with an error recorded",
        kind);
  fn_put(st, g, jac);
}

/* ---- calls and control flow ----------------------------------------------------------------- */
/* Keeps the n outputs of a successful call; out has room for MAX_ARITY. */
static void keep_all(pool *p, int depth, nb_tensor **out, int n) {
  for (int k = 0; k < n; k++)
    fuzz_keep(p, depth, out[k]);
}

/* The inputs of a call: n tensors of p, or fresh zero counters (while_loop). */
static void pick_inputs(pool *p, reader *r, nb_tensor **in, int n) {
  for (int k = 0; k < n && k < MAX_ARITY; k++)
    in[k] = pick(p, r);
}

void fuzz_call(state *st, pool *p, reader *r, bool body) {
  int depth = body ? 0 : st->depth;
  nb_tensor *in[MAX_ARITY] = {0}, *out[MAX_ARITY] = {0}, *ys[MAX_ARITY] = {0};
  uint8_t kind = u8(r) % 8;
  if (kind < 3) { /* nb_call */
    fn_slot *fs = pick_fn(st, r);
    int n_in = fs ? nb_fn_n_in(fs->f) : 0, n_out = fs ? nb_fn_n_out(fs->f) : 0;
    if (n_in > MAX_ARITY || n_out > MAX_ARITY) return;
    pick_inputs(p, r, in, n_in);
    bool pass_in = flag(r);
    if (fs && !call_small(fs->jac, in, n_in)) return;
    if (st->call_depth >= MAX_CALL_DEPTH) return;
    st->call_depth++;
    nb_scope_begin();
    nb_clear_error();
    nb_status s = nb_call(fs ? fs->f : NULL, pass_in ? in : NULL, out);
    checked_outputs(s, out, fs ? n_out : 0, "nb_call");
    st->call_depth--;
    if (!s) keep_all(p, depth, out, n_out);
    nb_scope_end();
    return;
  }
  fn_slot *a = pick_fn(st, r), *b = pick_fn(st, r);
  nb_fn *fa = a ? a->f : NULL, *fb = b ? b->f : NULL;
  int jac = (a ? a->jac : 0) + (b ? b->jac : 0);
  int n = u8(r) % 4, n_xs = u8(r) % 3;
  pick_inputs(p, r, in, n + n_xs);
  if (!call_small(jac, in, n + n_xs) || st->call_depth >= MAX_CALL_DEPTH) return;
  int n_res = fb ? nb_fn_n_out(fb) : 0;
  if (n_res > MAX_ARITY || (fa && nb_fn_n_out(fa) > MAX_ARITY)) return;
  st->call_depth++;
  nb_scope_begin();
  nb_status s;
  switch (kind) {
  case 3: { /* pred: a pooled tensor or a bool scalar */
    nb_tensor *pred = flag(r) ? pick(p, r) : nb_scalar(u8(r) & 1, NB_BOOL);
    n_res = fa ? nb_fn_n_out(fa) : 0;
    nb_clear_error();
    s = nb_cond(pred, fa, fb, in, n, out);
    checked_outputs(s, out, n_res, "nb_cond");
    break;
  }
  case 4:
  case 5: {
    int n_carry = n, n_ys = n_res - n_carry;
    nb_clear_error();
    s = nb_scan(fb, in, n_carry, in + n, n_xs, flag(r), out, n_ys > 0 ? ys : NULL);
    checked_status(s, "nb_scan");
    if (!s) keep_all(p, depth, ys, n_ys > 0 ? n_ys : 0);
    n_res = n_carry;
    break;
  }
  case 6: {
    int64_t lo = (int64_t)(u8(r) % 8) - 2, hi = (int64_t)(u8(r) % 12) - 2;
    nb_clear_error();
    s = nb_fori_loop(lo, hi, fb, in, n, out);
    checked_status(s, "nb_fori_loop");
    n_res = n;
    break;
  }
  default: { /* a while_loop that ends: a fresh counter, then the pooled carries */
    prog *g = new_prog(st, r, p);
    if (!g) {
      s = NB_OK, n_res = 0;
      break;
    }
    memmove(in + 1, in, sizeof *in * (size_t)n);
    in[0] = flag(r) ? nb_scalar(0, NB_I64) : nb_scalar(0, NB_F32);
    nb_fn *c = nb_fn_create(while_cond, g, n + 1, 1),
          *bd = nb_fn_create(while_body, g, n + 1, n + 1);
    nb_clear_error();
    s = nb_while_loop(c, bd, in, n + 1, out);
    checked_outputs(s, out, c && bd ? n + 1 : 0, "nb_while_loop");
    nb_fn_release(c);
    nb_fn_release(bd);
    n_res = n + 1;
    break;
  }
  }
  st->call_depth--;
  if (!s) keep_all(p, depth, out, n_res);
  nb_scope_end();
}

/* ---- one input ------------------------------------------------------------------------------ */
typedef struct input {
  const uint8_t *data;
  size_t size;
} input;

/* Releases what the program still holds: its functions, the scopes it left
 * open, its own references, the bodies' captures, its meshes; process-wide
 * settings go back to their defaults. */
static void state_free(state *st) {
  nb_clear_error();
  for (int k = 0; k < st->n_fns; k++)
    nb_fn_release(st->fns[k].f);
  for (; st->depth > 0; st->depth--)
    CHECK(nb_scope_end() == NB_OK, "nb_scope_end with %d scopes open", st->depth);
  for (int k = 0; k < st->n_owned; k++)
    nb_release(st->owned[k]);
  for (int k = 0; k < st->n_progs; k++)
    for (int c = 0; c < 2; c++)
      nb_release(st->progs[k].capt[c]);
  for (int k = 0; k < st->n_meshes; k++)
    nb_mesh_release(st->meshes[k]);
  nb_set_matmul_precision(NB_PRECISION_HIGHEST);
}

static void *run_input(void *arg) {
  const input *in = arg;
  state *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  reader r = {in->data, in->size, 0};
  nb_seed(u64(&r));
  fuzz_run_ops(st, &st->top, &r, MAX_STEPS, false);
  state_free(st);
  free(st);
  return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  fuzz_devnull = fopen("/dev/null", "w");
  fuzz_register_ops();
  const char *e = getenv("FUZZ_TRACE");
  fuzz_trace = e && *e == '1';
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  input in = {data, size};
  int threads = nb_get_num_threads();
  pthread_t th;
  if (pthread_create(&th, NULL, run_input, &in) == 0) pthread_join(th, NULL);
  nb_set_num_threads(threads);
  nb_clear_error();
  return 0;
}
