/* test/fuzz/fuzz_ops.c — the libFuzzer target's calls (fuzz.h): one group of public
 * functions per opcode, its arguments read from the input. Each call runs in its
 * own scope; results small enough for the pool are kept (nb_keep) in the scope
 * around it, the rest go with the call's scope. */
#include "fuzz.h"

typedef struct ctx {
  state *st;
  pool *p;
  reader *r;
  int depth; /* the scope depth results are kept at */
  bool body; /* inside a generated function */
} ctx;

void fuzz_keep(pool *p, int depth, nb_tensor *t) {
  if (!t || nb_numel(t) > POOL_NUMEL) return;
  nb_clear_error();
  nb_tensor *k = nb_keep(t);
  CHECK(k == t, "nb_keep returned %p for %p", (void *)k, (void *)t);
  pool_put(p, t, depth);
}

/* Checks and keeps the result of one call (errors cleared just before it). */
#define RESULT(c, expr, name)                                                                      \
  do {                                                                                             \
    nb_clear_error();                                                                              \
    fuzz_keep((c)->p, (c)->depth, checked((expr), (name)));                                        \
  } while (0)
#define STATUS(expr, name) (nb_clear_error(), checked_status((expr), (name)))

static nb_tensor *T(ctx *c) { return pick(c->p, c->r); }

/* An index tensor: a pooled one, or a small integer tensor in [-4, 7]. */
static nb_tensor *index_tensor(ctx *c) {
  if (flag(c->r)) return T(c);
  nb_shape s = {.ndim = u8(c->r) % 3};
  int64_t v[16];
  for (int d = 0; d < s.ndim; d++)
    s.dims[d] = u8(c->r) % 5;
  for (int k = 0; k < 16; k++)
    v[k] = (int64_t)(u8(c->r) % 12) - 4;
  nb_tensor *t = nb_from_data(v, s, NB_I64);
  return flag(c->r) ? nb_cast(t, flag(c->r) ? NB_I32 : NB_F32) : t;
}

/* ---- creation ------------------------------------------------------------------------------- */
static void g_create(ctx *c) {
  reader *r = c->r;
  nb_shape s = shape_like(c->p, r);
  nb_dtype dt = dtype_arg(r);
  uint8_t k = u8(r) % 10;
  if (k < 7 && !creatable(&s)) return;
  switch (k) {
  case 0: RESULT(c, nb_zeros(s, dt), "nb_zeros"); break;
  case 1: RESULT(c, nb_ones(s, dt), "nb_ones"); break;
  case 2: RESULT(c, nb_full(s, scalar_arg(r), dt), "nb_full"); break;
  case 3: RESULT(c, nb_rand(s, dt), "nb_rand"); break;
  case 4: RESULT(c, nb_randn(s, dt), "nb_randn"); break;
  case 5: RESULT(c, nb_glorot_uniform(s, dt), "nb_glorot_uniform"); break;
  case 6: {
    static _Thread_local uint8_t buf[POOL_NUMEL * 8];
    for (size_t i = 0; i < sizeof buf && more(r); i++)
      buf[i] = u8(r);
    RESULT(c, nb_from_data(flag(r) ? NULL : buf, s, dt), "nb_from_data");
    break;
  }
  case 7: RESULT(c, nb_scalar(scalar_arg(r), dt), "nb_scalar"); break;
  case 8: {
    double a = scalar_arg(r), b = scalar_arg(r), step = scalar_arg(r);
    double n = ceil((b - a) / step);
    if (!(n <= POOL_NUMEL) && n < 0x1p42) return; /* a real allocation, too big to compute */
    RESULT(c, nb_arange(a, b, step, dt), "nb_arange");
    break;
  }
  default: nb_seed(u64(r)); break;
  }
}

/* ---- elementwise ---------------------------------------------------------------------------- */
static void g_unary(ctx *c) {
  static nb_tensor *(*const fns[])(nb_tensor *) = {
      nb_neg,     nb_abs,   nb_sign,       nb_exp,        nb_expm1,    nb_log, nb_log1p,
      nb_sqrt,    nb_rsqrt, nb_square,     nb_sin,        nb_cos,      nb_tan, nb_tanh,
      nb_sigmoid, nb_relu,  nb_gelu,       nb_silu,       nb_softplus, nb_erf, nb_floor,
      nb_ceil,    nb_round, nb_reciprocal, nb_logical_not};
  enum { N = sizeof fns / sizeof fns[0] };
  nb_tensor *t = T(c);
  uint8_t k = u8(c->r) % (N + 1);
  if (k == N)
    RESULT(c, nb_cast(t, dtype_arg(c->r)), "nb_cast");
  else
    RESULT(c, fns[k](t), "a unary op");
}

static void g_binary(ctx *c) {
  static nb_tensor *(*const fns[])(nb_tensor *, nb_tensor *) = {
      nb_add, nb_sub, nb_mul, nb_div, nb_pow, nb_maximum, nb_minimum,     nb_atan2,     nb_mod,
      nb_eq,  nb_ne,  nb_lt,  nb_le,  nb_gt,  nb_ge,      nb_logical_and, nb_logical_or};
  nb_tensor *a = T(c), *b = T(c);
  RESULT(c, fns[u8(c->r) % (sizeof fns / sizeof fns[0])](a, b), "a binary op");
}

static void g_scalar(ctx *c) {
  static nb_tensor *(*const fns[])(nb_tensor *, double) = {
      nb_add_scalar,  nb_sub_scalar, nb_rsub_scalar,    nb_mul_scalar,     nb_div_scalar,
      nb_rdiv_scalar, nb_pow_scalar, nb_maximum_scalar, nb_minimum_scalar, nb_eq_scalar,
      nb_ne_scalar,   nb_lt_scalar,  nb_le_scalar,      nb_gt_scalar,      nb_ge_scalar};
  nb_tensor *t = T(c);
  double s = scalar_arg(c->r);
  RESULT(c, fns[u8(c->r) % (sizeof fns / sizeof fns[0])](t, s), "a scalar op");
}

static void g_where(ctx *c) {
  nb_tensor *a = T(c), *b = T(c), *w = T(c);
  if (flag(c->r)) {
    RESULT(c, nb_where(a, b, w), "nb_where");
  } else {
    double lo = scalar_arg(c->r), hi = scalar_arg(c->r);
    RESULT(c, nb_clip(a, lo, hi), "nb_clip");
  }
}

/* ---- reductions and linear algebra ---------------------------------------------------------- */
static void g_reduce(ctx *c) {
  static nb_tensor *(*const fns[])(nb_tensor *, nb_axes, bool) = {
      nb_sum, nb_mean, nb_prod, nb_max, nb_min, nb_var, nb_std, nb_logsumexp, nb_any, nb_all};
  nb_tensor *t = T(c);
  nb_axes ax = axes_arg(c->r);
  bool keep = flag(c->r);
  RESULT(c, fns[u8(c->r) % 10](t, ax, keep), "a reduction");
}

static void g_axis(ctx *c) {
  nb_tensor *t = T(c);
  int axis = axis_arg(c->r);
  bool keep = flag(c->r);
  switch (u8(c->r) % 5) {
  case 0: RESULT(c, nb_argmax(t, axis, keep), "nb_argmax"); break;
  case 1: RESULT(c, nb_argmin(t, axis, keep), "nb_argmin"); break;
  case 2: RESULT(c, nb_softmax(t, axis), "nb_softmax"); break;
  case 3: RESULT(c, nb_log_softmax(t, axis), "nb_log_softmax"); break;
  default: RESULT(c, nb_cumsum(t, axis), "nb_cumsum"); break;
  }
}

static void g_linalg(ctx *c) {
  uint8_t k = u8(c->r) % 4;
  if (k == 0) {
    nb_tensor *a = T(c), *b = T(c);
    RESULT(c, nb_matmul(a, b), "nb_matmul");
  } else if (k == 1) {
    nb_tensor *a = T(c), *b = T(c);
    RESULT(c, nb_outer(a, b), "nb_outer");
  } else {
    nb_tensor *ts[8] = {0};
    uint8_t v = u8(c->r);
    int n = v < 240 ? v % 4 : (v % 2 ? 5 : -1);
    int64_t work = 1; /* the product of the operands' sizes bounds an einsum's work */
    for (int j = 0; j < n; j++) {
      ts[j] = T(c);
      int64_t m = ts[j] ? nb_numel(ts[j]) : 1;
      work *= m > 1 ? m : 1;
      if (work > (1 << 16)) return;
    }
    char spec[40];
    einsum_spec(c->r, spec, sizeof spec, n);
    RESULT(c, nb_einsum(flag(c->r) ? NULL : spec, ts, n), "nb_einsum");
  }
}

/* ---- shapes --------------------------------------------------------------------------------- */
static void g_shape(ctx *c) {
  reader *r = c->r;
  nb_tensor *t = T(c);
  switch (u8(r) % 7) {
  case 0: RESULT(c, nb_reshape(t, shape_like(c->p, r)), "nb_reshape"); break;
  case 1: RESULT(c, nb_transpose(t), "nb_transpose"); break;
  case 2: RESULT(c, nb_permute(t, axes_arg(r)), "nb_permute"); break;
  case 3: RESULT(c, nb_squeeze(t, axes_arg(r)), "nb_squeeze"); break;
  case 4: RESULT(c, nb_unsqueeze(t, axis_arg(r)), "nb_unsqueeze"); break;
  case 5: RESULT(c, nb_broadcast_to(t, shape_like(c->p, r)), "nb_broadcast_to"); break;
  default: {
    int a = axis_arg(r), b = axis_arg(r);
    RESULT(c, nb_flatten(t, a, b), "nb_flatten");
    break;
  }
  }
}

static void g_join(ctx *c) {
  reader *r = c->r;
  nb_tensor *ts[16] = {0};
  uint8_t v = u8(r);
  int n = v < 240 ? v % 5 : (v % 2 ? 16 : -1);
  for (int j = 0; j < n; j++)
    ts[j] = T(c);
  int axis = axis_arg(r);
  switch (u8(r) % 3) {
  case 0: RESULT(c, nb_concat(flag(r) ? NULL : ts, n, axis), "nb_concat"); break;
  case 1: RESULT(c, nb_stack(flag(r) ? NULL : ts, n, axis), "nb_stack"); break;
  default: {
    int64_t sizes[16];
    nb_tensor *out[16] = {0};
    for (int j = 0; j < 16; j++)
      sizes[j] = dim_arg(r);
    nb_status st = STATUS(nb_split(ts[0], flag(r) ? NULL : sizes, n, axis, out), "nb_split");
    for (int j = 0; j < n && !st; j++)
      fuzz_keep(c->p, c->depth, out[j]);
    break;
  }
  }
}

static void g_slice(ctx *c) {
  reader *r = c->r;
  nb_tensor *t = T(c);
  int64_t a[2 * NB_MAX_DIMS], b[NB_MAX_DIMS], s[NB_MAX_DIMS];
  switch (u8(r) % 5) {
  case 0:
    for (int d = 0; d < NB_MAX_DIMS; d++)
      a[d] = index_arg(r), b[d] = index_arg(r), s[d] = index_arg(r);
    RESULT(c, nb_slice(t, a, b, flag(r) ? NULL : s), "nb_slice");
    break;
  case 1:
    for (int d = 0; d < 2 * NB_MAX_DIMS; d++)
      a[d] = u8(r) < 224 ? u8(r) % 3 : dim_arg(r);
    RESULT(c, nb_pad(t, flag(r) ? NULL : a, scalar_arg(r)), "nb_pad");
    break;
  case 2: RESULT(c, nb_flip(t, axes_arg(r)), "nb_flip"); break;
  case 3: {
    int64_t reps = dim_arg(r);
    RESULT(c, nb_repeat(t, reps, axis_arg(r)), "nb_repeat");
    break;
  }
  default: RESULT(c, nb_tile(t, shape_arg(r)), "nb_tile"); break;
  }
}

static void g_index(ctx *c) {
  reader *r = c->r;
  nb_tensor *t = T(c), *idx = index_tensor(c);
  int axis = axis_arg(r);
  switch (u8(r) % 4) {
  case 0: RESULT(c, nb_take(t, idx, axis), "nb_take"); break;
  case 1: RESULT(c, nb_take_along_axis(t, idx, axis), "nb_take_along_axis"); break;
  case 2: {
    nb_tensor *upd = T(c);
    RESULT(c, nb_scatter_add(t, idx, upd, axis), "nb_scatter_add");
    break;
  }
  default: {
    int64_t n = dim_arg(r);
    RESULT(c, nb_one_hot(idx, n, dtype_arg(r)), "nb_one_hot");
    break;
  }
  }
}

static void g_nn(ctx *c) {
  reader *r = c->r;
  nb_tensor *x = T(c), *a = flag(r) ? T(c) : NULL, *b = flag(r) ? T(c) : NULL;
  double eps = u8(r) < 200 ? 1e-5 : scalar_arg(r);
  switch (u8(r) % 9) {
  case 0: RESULT(c, nb_layer_norm(x, a, b, eps), "nb_layer_norm"); break;
  case 1: RESULT(c, nb_rms_norm(x, a, eps), "nb_rms_norm"); break;
  case 2: {
    nb_tensor *labels = flag(r) ? T(c) : index_tensor(c);
    RESULT(c, nb_cross_entropy(x, labels), "nb_cross_entropy");
    break;
  }
  case 3: RESULT(c, nb_mse(x, a), "nb_mse"); break;
  case 4: {
    double p = u8(r) < 200 ? (u8(r) % 10) / 10.0 : scalar_arg(r);
    RESULT(c, nb_dropout(x, p, flag(r)), "nb_dropout");
    break;
  }
  case 5: {
    nb_tensor *idx = index_tensor(c);
    RESULT(c, nb_embedding(x, idx), "nb_embedding");
    break;
  }
  case 6: {
    nb_tensor *v = T(c);
    RESULT(c, nb_attention(x, a ? a : x, v, b), "nb_attention");
    break;
  }
  case 7: {
    nb_conv2d_params cp;
    for (int k = 0; k < 2; k++) {
      cp.stride[k] = u8(r) < 224 ? u8(r) % 3 : axis_arg(r);
      cp.padding[k] = u8(r) < 224 ? u8(r) % 3 : axis_arg(r);
      cp.dilation[k] = u8(r) < 224 ? u8(r) % 3 : axis_arg(r);
    }
    cp.groups = u8(r) < 224 ? u8(r) % 3 : axis_arg(r);
    RESULT(c, nb_conv2d(x, a, b, flag(r) ? NULL : &cp), "nb_conv2d");
    break;
  }
  default: {
    int k[6];
    for (int j = 0; j < 6; j++)
      k[j] = u8(r) < 224 ? u8(r) % 4 : axis_arg(r);
    RESULT(c, nb_max_pool2d(x, k[0], k[1], k[2], k[3], k[4], k[5]), "nb_max_pool2d");
    break;
  }
  }
}

/* ---- devices, realization, queries ---------------------------------------------------------- */
static nb_device device_arg(reader *r) {
  uint8_t v = u8(r);
  return (nb_device){(nb_device_kind)(v % 4), (int)(u8(r) % 6) - 1};
}

static void g_device(ctx *c) {
  reader *r = c->r;
  nb_tensor *t = T(c);
  switch (u8(r) % 5) {
  case 0: RESULT(c, nb_detach(t), "nb_detach"); break;
  case 1: {
    nb_device d = device_arg(r);
    RESULT(c, nb_to_device(t, d), "nb_to_device");
    break;
  }
  case 2: {
    nb_device d = device_arg(r);
    nb_status st = STATUS(nb_set_default_device(d), "nb_set_default_device");
    if (!st) CHECK(nb_default_device().kind == d.kind, "nb_default_device after a set");
    break;
  }
  case 3: {
    nb_device d = nb_device_of(t);
    CHECK(nb_device_str(d) != NULL, "nb_device_str");
    CHECK(nb_device_count(d.kind) >= 1, "nb_device_count of a tensor's device kind");
    (void)nb_device_count((nb_device_kind)(u8(r) % 5));
    break;
  }
  default: nb_set_default_device(NB_CPU); break;
  }
}

static void g_realize(ctx *c) {
  reader *r = c->r;
  static _Thread_local uint8_t buf[POOL_NUMEL * 8];
  nb_tensor *ts[4];
  for (int j = 0; j < 4; j++)
    ts[j] = T(c);
  int n = (int)(u8(r) % 6) - 1;
  nb_tensor *t = ts[0];
  switch (u8(r) % 5) {
  case 0: STATUS(nb_eval(flag(r) ? NULL : ts, n), "nb_eval"); break;
  case 1: {
    int64_t m = t ? nb_numel(t) : 0;
    size_t want = t ? (size_t)m * nb_dtype_size(nb_dtype_of(t)) : 0;
    size_t nbytes = flag(r) ? want : u8(r) * 8u;
    STATUS(nb_to_host(t, flag(r) ? NULL : buf, nbytes), "nb_to_host");
    break;
  }
  case 2: {
    nb_clear_error();
    double v = nb_item(t);
    CHECK(nb_last_status() != NB_OK || (t && nb_numel(t) == 1), "nb_item of %lld elements gave %g",
          (long long)(t ? nb_numel(t) : -1), v);
    break;
  }
  case 3: nb_fprint(flag(r) ? NULL : fuzz_devnull, t); break;
  default: STATUS(nb_graph_dot(flag(r) ? NULL : fuzz_devnull, ts, n), "nb_graph_dot"); break;
  }
}

static void g_query(ctx *c) {
  reader *r = c->r;
  nb_tensor *t = T(c), *u = T(c);
  char buf[64];
  size_t cap = u8(r) % 65;
  nb_shape s = nb_shape_of(t);
  CHECK(t ? s.ndim >= 0 : s.ndim == -1, "nb_shape_of");
  CHECK(nb_ndim(t) == s.ndim, "nb_ndim");
  CHECK(t || nb_numel(t) == -1, "nb_numel(NULL)");
  nb_shape_str(flag(r) ? s : shape_arg(r), cap ? buf : NULL, cap);
  nb_dtype a = t ? nb_dtype_of(t) : dtype_arg(r), b = u ? nb_dtype_of(u) : dtype_arg(r);
  CHECK(nb_dtype_name(a) != NULL, "nb_dtype_name");
  (void)nb_dtype_size(a), (void)nb_dtype_is_float(b), (void)nb_promote_types(a, b);
  (void)nb_is_realized(t), (void)nb_requires_grad(t);
  CHECK(nb_status_str((nb_status)(u8(r) % 20)) != NULL, "nb_status_str");
  CHECK(nb_sharding_str(t) != NULL || t == NULL, "nb_sharding_str");
  nb_mesh *m = nb_mesh_of(t);
  if (m) CHECK(nb_mesh_str(m) && nb_mesh_n_devices(m) >= 1, "a tensor's mesh");
  nb_stats st = nb_get_stats();
  CHECK(st.peak_bytes >= st.live_bytes || st.peak_bytes == 0, "nb_stats peak %llu < live %llu",
        (unsigned long long)st.peak_bytes, (unsigned long long)st.live_bytes);
}

/* ---- scopes, at top level: the pool follows what each scope holds --------------------------- */
static void forget(state *st, nb_tensor *t) { /* the fuzzer's own references to t are gone */
  for (int k = 0; k < st->n_owned; k++)
    if (st->owned[k] == t) return;
  for (int k = 0; k < POOL; k++)
    if (st->top.s[k].t == t && st->top.s[k].depth < 0) st->top.s[k] = (slot){0};
}

static void g_scope(ctx *c) {
  state *st = c->st;
  reader *r = c->r;
  slot *sl = &st->top.s[u8(r) % POOL];
  switch (u8(r) % 5) {
  case 0:
    nb_clear_error();
    nb_scope_begin();
    CHECK(nb_last_status() == NB_OK, "nb_scope_begin");
    st->depth++;
    break;
  case 1: {
    nb_status s = STATUS(nb_scope_end(), "nb_scope_end");
    CHECK((s == NB_OK) == (st->depth > 0), "nb_scope_end with %d scopes open gave %s", st->depth,
          nb_status_str(s));
    if (s) break;
    st->depth--;
    for (int k = 0; k < POOL; k++)
      if (st->top.s[k].depth > st->depth) st->top.s[k] = (slot){0};
    break;
  }
  case 2: /* the enclosing scope holds it too */
    if (!sl->t) break;
    nb_clear_error();
    CHECK(nb_keep(sl->t) == sl->t, "nb_keep");
    pool_put(&st->top, sl->t, st->depth > 0 ? st->depth - 1 : 0);
    break;
  case 3:
    if (!sl->t || st->n_owned == MAX_OWNED) break;
    st->owned[st->n_owned++] = nb_retain(sl->t);
    pool_put(&st->top, sl->t, -1);
    break;
  default:
    if (!st->n_owned) break;
    nb_tensor *t = st->owned[--st->n_owned];
    nb_release(t);
    forget(st, t);
    break;
  }
}

/* ---- autodiff ------------------------------------------------------------------------------- */
static void g_grad(ctx *c) {
  reader *r = c->r;
  nb_tensor *t = T(c), *u = T(c);
  switch (u8(r) % 5) {
  case 0: {
    nb_clear_error();
    nb_tensor *g = nb_set_requires_grad(t, flag(r));
    CHECK(g == t || (!g && nb_last_status()), "nb_set_requires_grad");
    break;
  }
  case 1: /* the sum of a pooled tensor, so that the loss has one element */
    if (flag(r) && t) t = nb_sum(t, NB_ALL, false);
    STATUS(nb_backward(t), "nb_backward");
    break;
  case 2: {
    nb_clear_error();
    nb_tensor *g = nb_grad_of(t); /* NULL with no error: no gradient yet */
    CHECK(t || !g, "nb_grad_of(NULL)");
    fuzz_keep(c->p, c->depth, g);
    break;
  }
  case 3: nb_zero_grad(t); break;
  default: STATUS(nb_assign(t, u), "nb_assign"); break;
  }
}

/* ---- meshes, sharding, collectives ---------------------------------------------------------- */
static void g_mesh(ctx *c) {
  state *st = c->st;
  reader *r = c->r;
  if (st->n_meshes == MAX_MESHES) return;
  char axes[40];
  mesh_string(r, axes, sizeof axes);
  nb_mesh *m;
  nb_clear_error();
  if (flag(r)) {
    m = nb_mesh_cpu(flag(r) ? NULL : axes);
  } else {
    nb_device devs[8];
    for (int k = 0; k < 8; k++)
      devs[k] = flag(r) ? NB_CPU : u8(r) < 200 ? NB_EMU(u8(r) % 4) : device_arg(r);
    int n = (int)(u8(r) % 10) - 1;
    m = nb_mesh_create(axes, flag(r) ? NULL : devs, n);
  }
  CHECK(m || nb_last_status(), "a mesh NULL with no error recorded");
  if (m && nb_mesh_n_devices(m) > 8) { /* a valid mesh too big to compute on */
    nb_mesh_release(m);
    m = NULL;
  }
  if (m) st->meshes[st->n_meshes++] = m;
}

static void g_shard(ctx *c) {
  reader *r = c->r;
  nb_tensor *t = T(c);
  char spec[40];
  spec_string(r, spec, sizeof spec);
  if (flag(r)) {
    nb_mesh *m = pick_mesh(c->st, r);
    RESULT(c, nb_shard(t, m, flag(r) ? NULL : spec), "nb_shard");
  } else {
    RESULT(c, nb_reshard(t, flag(r) ? NULL : spec), "nb_reshard");
  }
}

static void g_coll(ctx *c) {
  reader *r = c->r;
  static const char *const groups[] = {"x", "y", "dp", "tp", "dp,tp", "(x, y)", "", "q,q"};
  char raw[16];
  raw_string(r, raw, sizeof raw);
  const char *axes = u8(r) < 224 ? groups[u8(r) % 8] : flag(r) ? NULL : raw;
  nb_tensor *t = T(c);
  int a = axis_arg(r), b = axis_arg(r);
  switch (u8(r) % 6) {
  case 0: RESULT(c, nb_all_reduce(t, axes, (nb_reduce_op)(u8(r) % 5)), "nb_all_reduce"); break;
  case 1: RESULT(c, nb_all_gather(t, axes, a), "nb_all_gather"); break;
  case 2: RESULT(c, nb_reduce_scatter(t, axes, a), "nb_reduce_scatter"); break;
  case 3: RESULT(c, nb_all_to_all(t, axes, a, b), "nb_all_to_all"); break;
  case 4: {
    int pairs[4][2];
    for (int k = 0; k < 4; k++)
      pairs[k][0] = (int)(u8(r) % 5) - 1, pairs[k][1] = (int)(u8(r) % 5) - 1;
    int n = (int)(u8(r) % 6) - 1;
    RESULT(c, nb_ppermute(t, axes, flag(r) ? NULL : (const int(*)[2])pairs, n), "nb_ppermute");
    break;
  }
  default: RESULT(c, nb_axis_index(axes), "nb_axis_index"); break;
  }
}

/* Process-wide settings (top level only; put back after each input). */
static void g_setting(ctx *c) {
  reader *r = c->r;
  switch (u8(r) % 3) {
  case 0: nb_set_matmul_precision((nb_precision)(u8(r) % 2)); break;
  case 1: STATUS(nb_set_num_threads((int)(u8(r) % 4) - 1), "nb_set_num_threads"); break;
  default: nb_reset_stats(); break;
  }
}

/* ---- custom ops: registered once (fuzz_register_ops), called anywhere --------------------- */
static const nb_custom_op *twice_op, *pair_op;

static int64_t elems(const nb_shape *s) {
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++)
    n *= s->dims[d];
  return n;
}

static nb_status float_only(const char *name, nb_dtype dt) {
  if (dt == NB_F32 || dt == NB_F64) return NB_OK;
  return nb_set_error(NB_ERR_DTYPE, "%s: f32 or f64 only, got %s", name, nb_dtype_name(dt));
}

/* fuzz_twice: out = 2 x, with every rule (elementwise sharding) */
static nb_status twice_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in,
                             nb_shape *os, nb_dtype *od, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  os[0] = is[0], od[0] = id[0];
  return float_only("fuzz_twice", id[0]);
}
static nb_status twice_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                           int n_out) {
  (void)u, (void)n_in, (void)n_out;
  for (int64_t i = 0, n = elems(&in[0].shape); i < n; i++)
    if (in[0].dtype == NB_F32)
      ((float *)out[0].data)[i] = 2 * ((const float *)in[0].data)[i];
    else
      ((double *)out[0].data)[i] = 2 * ((const double *)in[0].data)[i];
  return NB_OK;
}
static nb_status twice_vjp(void *u, nb_tensor *const *in, int n_in, nb_tensor *const *out,
                           nb_tensor *const *ct, int n_out, nb_tensor **in_ct) {
  (void)u, (void)in, (void)n_in, (void)out, (void)n_out;
  in_ct[0] = nb_mul_scalar(ct[0], 2);
  return in_ct[0] ? NB_OK : nb_last_status();
}
static nb_status twice_jvp(void *u, nb_tensor *const *in, nb_tensor *const *tan, int n_in,
                           nb_tensor *const *out, int n_out, nb_tensor **out_tan) {
  (void)u, (void)in, (void)n_in, (void)out, (void)n_out;
  out_tan[0] = nb_mul_scalar(tan[0], 2);
  return out_tan[0] ? NB_OK : nb_last_status();
}
static nb_status twice_batch(void *u, nb_tensor *const *in, const bool *batched, int n_in,
                             int64_t batch, nb_tensor **out, int n_out) {
  (void)u, (void)batched, (void)batch;
  return nb_custom_call(twice_op, in, n_in, out, n_out);
}

/* fuzz_pair: (a, b) of one shape -> (a - b, the sum of a); no rules (transforms fail,
 * or loop over the batch) */
static nb_status pair_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in, nb_shape *os,
                            nb_dtype *od, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  if (is[0].ndim != is[1].ndim || elems(&is[0]) != elems(&is[1]) || id[0] != id[1])
    return nb_set_error(NB_ERR_SHAPE, "fuzz_pair: the operands differ");
  os[0] = is[0], od[0] = id[0];
  os[1] = (nb_shape){0}, od[1] = id[0];
  return float_only("fuzz_pair", id[0]);
}
static nb_status pair_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                          int n_out) {
  (void)u, (void)n_in, (void)n_out;
  double sum = 0;
  bool f32 = in[0].dtype == NB_F32;
  for (int64_t i = 0, n = elems(&in[0].shape); i < n; i++) {
    double a = f32 ? ((const float *)in[0].data)[i] : ((const double *)in[0].data)[i];
    double b = f32 ? ((const float *)in[1].data)[i] : ((const double *)in[1].data)[i];
    if (f32)
      ((float *)out[0].data)[i] = (float)(a - b);
    else
      ((double *)out[0].data)[i] = a - b;
    sum += a;
  }
  if (f32)
    *(float *)out[1].data = (float)sum;
  else
    *(double *)out[1].data = sum;
  return NB_OK;
}

void fuzz_register_ops(void) {
  twice_op = nb_custom_op_register(&(nb_custom_op_def){.name = "fuzz_twice",
                                                       .n_in = 1,
                                                       .n_out = 1,
                                                       .infer = twice_infer,
                                                       .cpu = twice_cpu,
                                                       .vjp = twice_vjp,
                                                       .jvp = twice_jvp,
                                                       .batch = twice_batch,
                                                       .sharding = "... -> ..."});
  pair_op = nb_custom_op_register(&(nb_custom_op_def){
      .name = "fuzz_pair", .n_in = 2, .n_out = 2, .infer = pair_infer, .cpu = pair_cpu});
  nb_clear_error();
}

static void g_custom(ctx *c) {
  reader *r = c->r;
  nb_tensor *in[4] = {T(c), T(c), T(c), T(c)}, *out[4] = {0};
  int n_in = (int)(u8(r) % 4), n_out = (int)(u8(r) % 3);
  switch (u8(r) % 5) {
  case 0:
  case 1: n_in = 1, n_out = 1; /* fall through */
  case 2: {
    const nb_custom_op *op = u8(r) % 4 ? twice_op : pair_op;
    if (op == pair_op && flag(r)) n_in = n_out = 2;
    nb_status st = STATUS(nb_custom_call(op, in, n_in, out, n_out), "nb_custom_call");
    for (int j = 0; j < n_out && !st; j++)
      fuzz_keep(c->p, c->depth, out[j]);
    break;
  }
  case 3: { /* a name already taken: every check before that one runs on the input's rule */
    char rule[40];
    raw_string(r, rule, sizeof rule);
    bool raw = flag(r);
    nb_clear_error();
    const nb_custom_op *op =
        nb_custom_op_register(&(nb_custom_op_def){.name = "fuzz_twice",
                                                  .n_in = n_in,
                                                  .n_out = n_out,
                                                  .infer = twice_infer,
                                                  .cpu = twice_cpu,
                                                  .sharding = raw ? rule : "a b, b c -> a c"});
    CHECK(!op && nb_last_status() != NB_OK, "a second custom op named fuzz_twice registered");
    break;
  }
  default: {
    const nb_custom_op *op = nb_custom_op_find(flag(r) ? "fuzz_pair" : "no such op");
    CHECK(!op || (nb_custom_op_name(op) && !nb_custom_op_sharding(op)), "nb_custom_op_find");
    CHECK(!nb_custom_op_name(NULL), "nb_custom_op_name(NULL)");
    break;
  }
  }
}

/* ---- the program ---------------------------------------------------------------------------- */
enum {
  G_CREATE,
  G_UNARY,
  G_BINARY,
  G_SCALAR,
  G_WHERE,
  G_REDUCE,
  G_AXIS,
  G_LINALG,
  G_SHAPE,
  G_JOIN,
  G_SLICE,
  G_INDEX,
  G_NN,
  G_DEVICE,
  G_REALIZE,
  G_QUERY,
  G_SCOPE,
  G_GRAD,
  G_FN,
  G_CALL,
  G_MESH,
  G_SHARD,
  G_COLL,
  G_SETTING,
  G_CUSTOM,
  N_GROUPS
};

static void (*const groups[N_GROUPS])(ctx *) = {
    [G_CREATE] = g_create, [G_UNARY] = g_unary,   [G_BINARY] = g_binary,   [G_SCALAR] = g_scalar,
    [G_WHERE] = g_where,   [G_REDUCE] = g_reduce, [G_AXIS] = g_axis,       [G_LINALG] = g_linalg,
    [G_SHAPE] = g_shape,   [G_JOIN] = g_join,     [G_SLICE] = g_slice,     [G_INDEX] = g_index,
    [G_NN] = g_nn,         [G_DEVICE] = g_device, [G_REALIZE] = g_realize, [G_QUERY] = g_query,
    [G_GRAD] = g_grad,     [G_MESH] = g_mesh,     [G_SHARD] = g_shard,     [G_COLL] = g_coll,
    [G_CUSTOM] = g_custom,
};

void fuzz_run_ops(state *st, pool *p, reader *r, int max_steps, bool body) {
  for (int step = 0; step < max_steps && more(r); step++) {
    ctx c = {st, p, r, body ? 0 : st->depth, body};
    uint8_t g = u8(r) % N_GROUPS;
    if (fuzz_trace)
      fprintf(stderr, "%s%d: group %d (byte %zu)\n", body ? "    body " : "", step, g, r->i - 1);
    if (g == G_SCOPE) {
      if (!body) g_scope(&c); /* bodies keep their scopes balanced */
      continue;
    }
    if (g == G_SETTING) {
      if (!body) g_setting(&c);
      continue;
    }
    if (g == G_FN) {
      fuzz_make_fn(st, p, r);
      continue;
    }
    if (g == G_CALL) {
      fuzz_call(st, p, r, body);
      continue;
    }
    nb_scope_begin();
    groups[g](&c);
    nb_scope_end();
  }
}
