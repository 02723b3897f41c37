/* test/test_fusion_props.c — the fused planner's in-place rule holds for every
 * group shape (issue 14.1): a buffer is reused only when no member of the group,
 * earlier or later, still reads it for another row or element.
 *
 * A seeded generator builds random programs over a full shape F (2-D or 3-D,
 * often square or cubic so that a per-row value [R] can also be read as a
 * vector [C] broadcast across every row): elementwise chains, reductions along
 * the last axis, across rows and over everything, softmax / log_softmax /
 * cumsum along the last axis, transposes and broadcasts, so intermediates are
 * read across rows (y = f(x); sum(M * y, -1) + y), across a row (softmax-like)
 * and through broadcasts of reduced values. Each program runs
 *   - unfused (nbi_set_fusion(false), as NABLA_NO_FUSION=1),
 *   - fused, with every intermediate dropped before the realization (only the
 *     outputs are kept, so the planner may write over any intermediate),
 *   - fused inside an nb_fn body, called plainly and through nb_jit,
 * and every result is compared with the unfused one bit for bit and with a
 * float64 reference computed here, step by step, by a plain interpreter.
 * Shapes include sizes above NBI_PAR_MIN (the multithreaded kernels). */
#include "../src/backends/cpu/cpu.h"
#include "common.h"

/* ---- programs ------------------------------------------------------------------------ */
enum {
  P_UNARY,
  P_BINARY,
  P_REDUCE_LAST,
  P_REDUCE_FIRST,
  P_REDUCE_ALL,
  P_AXIS,
  P_TRANSPOSE,
  P_BROADCAST,
  P_KIND_COUNT
};
enum { N_UNARY = 9, N_BINARY = 6, N_REDUCE = 5, N_AXIS = 3 };
enum { MAX_IN = 6, MAX_STEPS = 28, MAX_VALUES = MAX_IN + MAX_STEPS, MAX_OUT = 4 };

typedef struct step {
  int kind, a, b, op; /* operands a, b (value ids), the op within its kind */
  bool keep;          /* reductions: keepdims */
} step;

typedef struct program {
  nb_dtype dt;
  nb_shape full;
  int n_in, n_steps, n_out;
  bool strided[MAX_IN]; /* input k is read through a transposed view */
  step steps[MAX_STEPS];
  int outs[MAX_OUT];
} program;

/* A float64 value of the reference interpreter. */
typedef struct dval {
  nb_shape s;
  double *v;
} dval;

static int pick(uint64_t *seed, int n) { return (int)tc_randint(seed, 0, n - 1); }

/* ---- the float64 reference ---------------------------------------------------------- */
static double unary_ref(int op, double x) {
  switch (op) {
  case 0: return -x;
  case 1: return tanh(x);
  case 2: return sin(x);
  case 3: return 1 / (1 + exp(-x));
  case 4: return 0.75 * x;
  case 5: return fabs(x);
  case 6: return exp(tanh(x));
  case 7: return x * x;
  default: return x > 0 ? x : 0;
  }
}

static double binary_ref(int op, double a, double b) {
  switch (op) {
  case 0: return a + b;
  case 1: return a - b;
  case 2: return a * b;
  case 3: return a > b ? a : b;
  case 4: return a > b ? a : b * 0.5;
  default: return a / (1 + fabs(b));
  }
}

/* The broadcast shape of a and b (false when they do not broadcast). */
static bool broadcast_shape(const nb_shape *a, const nb_shape *b, nb_shape *out) {
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  out->ndim = n;
  for (int d = 0; d < n; d++) {
    int da = d - (n - a->ndim), db = d - (n - b->ndim);
    int64_t x = da >= 0 ? a->dims[da] : 1, y = db >= 0 ? b->dims[db] : 1;
    if (x != y && x != 1 && y != 1) return false;
    out->dims[d] = x == 1 ? y : x;
  }
  return true;
}

/* Flat index into s of the element at multi-index ix of the broadcast shape o. */
static int64_t broadcast_index(const nb_shape *s, const nb_shape *o, const int64_t *ix) {
  int64_t i = 0;
  for (int d = 0; d < s->ndim; d++) {
    int od = d + o->ndim - s->ndim;
    i = i * s->dims[d] + (s->dims[d] == 1 ? 0 : ix[od]);
  }
  return i;
}

static dval dval_new(nb_shape s) {
  int64_t n = tc_numel(s);
  return (dval){s, calloc((size_t)(n ? n : 1), sizeof(double))};
}

/* Reduction op over the axes in mask (bit d: axis d) of x. */
static dval reduce_ref(int op, const dval *x, uint32_t mask, bool keep) {
  nb_shape ks = x->s, os = {0};
  for (int d = 0; d < x->s.ndim; d++) {
    if ((mask >> d) & 1u)
      ks.dims[d] = 1;
    else
      os.dims[os.ndim++] = x->s.dims[d];
  }
  dval r = dval_new(keep ? ks : os);
  int64_t nk = tc_numel(ks), n = tc_numel(x->s), cnt = n / nk, ix[NB_MAX_DIMS];
  double *acc = r.v, *sq = calloc((size_t)nk, sizeof(double));
  for (int64_t o = 0; o < nk; o++)
    acc[o] = op == 1 ? -INFINITY : op == 2 ? INFINITY : 0;
  for (int64_t i = 0; i < n; i++) {
    tc_unravel(i, &x->s, ix);
    for (int d = 0; d < x->s.ndim; d++)
      if ((mask >> d) & 1u) ix[d] = 0;
    int64_t o = tc_ravel(ix, &ks);
    double v = x->v[i];
    if (op == 1)
      acc[o] = v > acc[o] ? v : acc[o];
    else if (op == 2)
      acc[o] = v < acc[o] ? v : acc[o];
    else
      acc[o] += v, sq[o] += v * v;
  }
  for (int64_t o = 0; o < nk; o++) {
    if (op == 3) acc[o] = sq[o] / (double)cnt - (acc[o] / (double)cnt) * (acc[o] / (double)cnt);
    if (op == 3 && acc[o] < 0) acc[o] = 0;
  }
  free(sq);
  return r;
}

/* softmax (0), log_softmax (1), cumsum (2) along the last axis of x. */
static dval axis_ref(int op, const dval *x) {
  dval r = dval_new(x->s);
  int64_t c = x->s.dims[x->s.ndim - 1], rows = c ? tc_numel(x->s) / c : 0;
  for (int64_t i = 0; i < rows; i++) {
    const double *in = x->v + i * c;
    double *out = r.v + i * c, m = -INFINITY, s = 0;
    if (op == 2) {
      for (int64_t j = 0; j < c; j++)
        out[j] = (s += in[j]);
      continue;
    }
    for (int64_t j = 0; j < c; j++)
      m = in[j] > m ? in[j] : m;
    for (int64_t j = 0; j < c; j++)
      s += exp(in[j] - m);
    for (int64_t j = 0; j < c; j++)
      out[j] = op == 0 ? exp(in[j] - m) / s : in[j] - m - log(s);
  }
  return r;
}

static uint32_t last_axis(const nb_shape *s) { return 1u << (s->ndim - 1); }

/* Computes step st over the values v[] in float64. */
static dval step_ref(const program *p, const step *st, const dval *v) {
  const dval *a = &v[st->a], *b = &v[st->b];
  int64_t ix[NB_MAX_DIMS];
  dval r = {0};
  switch (st->kind) {
  case P_UNARY:
    r = dval_new(a->s);
    for (int64_t i = 0; i < tc_numel(a->s); i++)
      r.v[i] = unary_ref(st->op, a->v[i]);
    break;
  case P_BINARY: {
    nb_shape o;
    cr_assert(broadcast_shape(&a->s, &b->s, &o));
    r = dval_new(o);
    for (int64_t i = 0; i < tc_numel(o); i++) {
      tc_unravel(i, &o, ix);
      r.v[i] = binary_ref(st->op, a->v[broadcast_index(&a->s, &o, ix)],
                          b->v[broadcast_index(&b->s, &o, ix)]);
    }
    break;
  }
  case P_REDUCE_LAST: r = reduce_ref(st->op, a, last_axis(&a->s), st->keep); break;
  case P_REDUCE_FIRST: r = reduce_ref(st->op, a, 1u, st->keep); break;
  case P_REDUCE_ALL: r = reduce_ref(st->op, a, (1u << a->s.ndim) - 1u, false); break;
  case P_AXIS: r = axis_ref(st->op, a); break;
  case P_TRANSPOSE: {
    nb_shape o = a->s;
    int n = o.ndim;
    o.dims[n - 2] = a->s.dims[n - 1], o.dims[n - 1] = a->s.dims[n - 2];
    r = dval_new(o);
    for (int64_t i = 0; i < tc_numel(o); i++) {
      tc_unravel(i, &o, ix);
      int64_t t = ix[n - 2];
      ix[n - 2] = ix[n - 1], ix[n - 1] = t;
      r.v[i] = a->v[tc_ravel(ix, &a->s)];
    }
    break;
  }
  default: /* P_BROADCAST to F */
    r = dval_new(p->full);
    for (int64_t i = 0; i < tc_numel(p->full); i++) {
      tc_unravel(i, &p->full, ix);
      r.v[i] = a->v[broadcast_index(&a->s, &p->full, ix)];
    }
  }
  return r;
}

/* ---- the same steps with nabla ops ------------------------------------------------------ */
static nb_tensor *unary_nb(int op, nb_tensor *x) {
  switch (op) {
  case 0: return nb_neg(x);
  case 1: return nb_tanh(x);
  case 2: return nb_sin(x);
  case 3: return nb_sigmoid(x);
  case 4: return nb_mul_scalar(x, 0.75);
  case 5: return nb_abs(x);
  case 6: return nb_exp(nb_tanh(x));
  case 7: return nb_square(x);
  default: return nb_relu(x);
  }
}

static nb_tensor *binary_nb(int op, nb_tensor *a, nb_tensor *b) {
  switch (op) {
  case 0: return nb_add(a, b);
  case 1: return nb_sub(a, b);
  case 2: return nb_mul(a, b);
  case 3: return nb_maximum(a, b);
  case 4: return nb_where(nb_gt(a, b), a, nb_mul_scalar(b, 0.5));
  default: return nb_div(a, nb_add_scalar(nb_abs(b), 1));
  }
}

static nb_tensor *reduce_nb(int op, nb_tensor *x, nb_axes axes, bool keep) {
  switch (op) {
  case 0: return nb_mean(x, axes, keep);
  case 1: return nb_max(x, axes, keep);
  case 2: return nb_min(x, axes, keep);
  case 3: return nb_var(x, axes, keep);
  default: return nb_sum(x, axes, keep);
  }
}

static nb_tensor *step_nb(const program *p, const step *st, nb_tensor *const *v) {
  nb_tensor *a = v[st->a], *b = v[st->b];
  switch (st->kind) {
  case P_UNARY: return unary_nb(st->op, a);
  case P_BINARY: return binary_nb(st->op, a, b);
  case P_REDUCE_LAST: return reduce_nb(st->op, a, NB_AXES(-1), st->keep);
  case P_REDUCE_FIRST: return reduce_nb(st->op, a, NB_AXES(0), st->keep);
  case P_REDUCE_ALL: return reduce_nb(st->op, a, NB_ALL, false);
  case P_AXIS:
    return st->op == 0 ? nb_softmax(a, -1) : st->op == 1 ? nb_log_softmax(a, -1) : nb_cumsum(a, -1);
  case P_TRANSPOSE: return nb_transpose(a);
  default: return nb_broadcast_to(a, p->full);
  }
}

/* The reference's mean is a sum divided by the count: the same in mean_ref. */
static dval mean_fix(int op, dval r, const dval *x, uint32_t mask) {
  if (op != 0) return r;
  int64_t cnt = 1;
  for (int d = 0; d < x->s.ndim; d++)
    if ((mask >> d) & 1u) cnt *= x->s.dims[d];
  for (int64_t i = 0; i < tc_numel(r.s); i++)
    r.v[i] /= (double)cnt;
  return r;
}

/* ---- the generator ------------------------------------------------------------------------ */
/* Shapes: square and cubic ones make per-row values ([R]) and row vectors ([C])
 * the same shape, so a reduced value is read across rows; the last ones exceed
 * NBI_PAR_MIN elements (threads). */
static const nb_shape fulls[] = {
    {2, {2, 2}},       {2, {5, 5}},    {2, {7, 3}},    {2, {3, 8}},     {3, {4, 4, 4}},
    {3, {2, 6, 6}},    {2, {40, 40}},  {3, {3, 5, 7}}, {2, {192, 192}}, {2, {256, 256}},
    {3, {40, 40, 40}}, {2, {64, 700}}, {2, {9000, 4}}, {2, {4, 9000}},
};
enum { N_SMALL_FULLS = 8 };

static bool value_ok(const dval *r, const nb_shape *full) {
  if (r->s.ndim > full->ndim || tc_numel(r->s) > tc_numel(*full)) return false;
  for (int64_t i = 0; i < tc_numel(r->s); i++)
    if (!isfinite(r->v[i]) || fabs(r->v[i]) > 64) return false;
  return true;
}

/* The reference value of step st over v (mean divides its sum by the count). */
static dval eval_step(const program *p, const step *st, const dval *v) {
  dval r = step_ref(p, st, v);
  const nb_shape *sa = &v[st->a].s;
  if (st->kind == P_REDUCE_LAST || st->kind == P_REDUCE_FIRST || st->kind == P_REDUCE_ALL)
    r = mean_fix(st->op, r, &v[st->a],
                 st->kind == P_REDUCE_LAST    ? last_axis(sa)
                 : st->kind == P_REDUCE_FIRST ? 1u
                                              : (1u << sa->ndim) - 1u);
  return r;
}

/* Whether step st is valid over v (its operands' shapes fit the op). */
static bool step_valid(const program *p, const step *st, const dval *v) {
  const nb_shape *sa = &v[st->a].s, *sb = &v[st->b].s;
  nb_shape o;
  switch (st->kind) {
  case P_UNARY: return true;
  case P_BINARY: return broadcast_shape(sa, sb, &o);
  case P_REDUCE_LAST:
  case P_REDUCE_FIRST: return sa->ndim >= 1 && tc_numel(*sa) >= 2;
  case P_REDUCE_ALL: return sa->ndim >= 1;
  case P_AXIS: return sa->ndim >= 1 && sa->dims[sa->ndim - 1] >= 2;
  case P_TRANSPOSE: return sa->ndim >= 2;
  default:
    return broadcast_shape(sa, &p->full, &o) && nbi_shape_eq(&o, &p->full) &&
           !nbi_shape_eq(sa, &p->full);
  }
}

/* Appends step st to p if it is valid and keeps values bounded: v[*n] gets
 * its reference. Returns the new value's id, or -1 (nothing appended). */
static int emit(program *p, dval *v, int *n, step st) {
  if (p->n_steps == MAX_STEPS || st.a < 0 || st.b < 0 || !step_valid(p, &st, v)) return -1;
  dval r = eval_step(p, &st, v);
  if (!value_ok(&r, &p->full)) {
    free(r.v);
    return -1;
  }
  p->steps[p->n_steps++] = st;
  v[*n] = r;
  return (*n)++;
}

/* A random existing value of shape s (-1 when none). */
static int value_of_shape(uint64_t *seed, const dval *v, int n, const nb_shape *s) {
  int ids[MAX_VALUES], m = 0;
  for (int k = 0; k < n; k++)
    if (nbi_shape_eq(&v[k].s, s)) ids[m++] = k;
  return m ? ids[pick(seed, m)] : -1;
}

/* Motifs: short sequences that read an intermediate y across rows and then
 * combine their result with y again, the shapes under which a member that
 * writes over y corrupts an earlier member's later rows. A step that fails
 * (unbounded values, a full program) ends the motif early. */
static void motif(uint64_t *seed, program *p, dval *v, int *n) {
  nb_shape row = {1, {p->full.dims[p->full.ndim - 1]}}, per_row = p->full;
  per_row.ndim--;
  int kind = pick(seed, 3), full_a = value_of_shape(seed, v, *n, &p->full);
  int full_b = value_of_shape(seed, v, *n, &p->full);
  if (kind == 0) { /* y = f(a); t = sum(M * y, -1) + y: y a row vector read by every row */
    int a = value_of_shape(seed, v, *n, pick(seed, 2) ? &row : &per_row);
    int y = emit(p, v, n, (step){.kind = P_UNARY, .a = a, .op = pick(seed, N_UNARY)});
    int t =
        emit(p, v, n, (step){.kind = P_BINARY, .a = full_a, .b = y, .op = pick(seed, N_BINARY)});
    int r = emit(p, v, n, (step){.kind = P_REDUCE_LAST, .a = t, .op = pick(seed, N_REDUCE)});
    emit(p, v, n, (step){.kind = P_BINARY, .a = r, .b = y, .op = pick(seed, N_BINARY)});
  } else if (kind == 1) { /* softmax-like: y read by a row reduction and again per element */
    int y = emit(p, v, n, (step){.kind = P_UNARY, .a = full_a, .op = pick(seed, N_UNARY)});
    int m = emit(p, v, n, (step){.kind = P_REDUCE_LAST, .a = y, .op = 1, .keep = true});
    int d = emit(p, v, n, (step){.kind = P_BINARY, .a = y, .b = m, .op = 1});
    int e = emit(p, v, n, (step){.kind = P_UNARY, .a = d, .op = 6});
    int s = emit(p, v, n, (step){.kind = P_REDUCE_LAST, .a = e, .op = 4, .keep = true});
    int z = emit(p, v, n, (step){.kind = P_BINARY, .a = e, .b = s, .op = pick(seed, N_BINARY)});
    emit(p, v, n, (step){.kind = P_BINARY, .a = z, .b = y, .op = pick(seed, N_BINARY)});
  } else { /* a reduced value broadcast across rows, then combined with its source */
    int y = emit(p, v, n, (step){.kind = P_UNARY, .a = full_a, .op = pick(seed, N_UNARY)});
    int r = emit(
        p, v, n,
        (step){.kind = P_REDUCE_LAST, .a = y, .op = pick(seed, N_REDUCE), .keep = pick(seed, 2)});
    int u = emit(p, v, n, (step){.kind = P_UNARY, .a = r, .op = pick(seed, N_UNARY)});
    int z =
        emit(p, v, n, (step){.kind = P_BINARY, .a = full_b, .b = u, .op = pick(seed, N_BINARY)});
    int w = emit(p, v, n, (step){.kind = P_BINARY, .a = z, .b = y, .op = pick(seed, N_BINARY)});
    int q = emit(p, v, n, (step){.kind = P_REDUCE_LAST, .a = w, .op = pick(seed, N_REDUCE)});
    emit(p, v, n, (step){.kind = P_BINARY, .a = q, .b = u, .op = pick(seed, N_BINARY)});
  }
}

/* Appends one random step over the values so far (retrying until one is
 * valid and bounded). */
static void random_step(uint64_t *seed, program *p, dval *v, int *n) {
  for (;;) {
    int recent = *n > 4 ? *n - 4 : 0; /* favour recent values: long dependency chains */
    step st = {.kind = pick(seed, P_KIND_COUNT + 3),
               .a = pick(seed, 3) ? recent + pick(seed, *n - recent) : pick(seed, *n),
               .b = pick(seed, *n)};
    if (st.kind >= P_KIND_COUNT) st.kind = P_BINARY; /* binaries read two values: more often */
    st.op = pick(seed, st.kind == P_UNARY    ? N_UNARY
                       : st.kind == P_BINARY ? N_BINARY
                       : st.kind == P_AXIS   ? N_AXIS
                                             : N_REDUCE);
    st.keep = pick(seed, 2);
    if (emit(p, v, n, st) >= 0) return;
  }
}

/* Builds program p from *seed: inputs of shapes F (two, one strided), F
 * again, the row vector [C], the per-row values [F without its last dim] and
 * their keepdims form; random steps and motifs; outputs: the last value and
 * a few held intermediates. v receives every value's reference (caller
 * frees). */
static void generate(uint64_t *seed, program *p, nb_shape full, nb_dtype dt, dval *v) {
  *p = (program){.dt = dt, .full = full};
  nb_shape row = {1, {full.dims[full.ndim - 1]}}, per_row = full, keep = full;
  per_row.ndim--;
  keep.dims[keep.ndim - 1] = 1;
  const nb_shape ins[MAX_IN] = {full, full, full, row, per_row, keep};
  p->n_in = MAX_IN;
  for (int k = 0; k < MAX_IN; k++) {
    v[k] = dval_new(ins[k]);
    tc_fill(v[k].v, tc_numel(ins[k]), -2, 2, seed);
    tc_round_to(v[k].v, tc_numel(ins[k]), dt);
    p->strided[k] = k == 1;
  }
  int n = p->n_in, target = 8 + pick(seed, MAX_STEPS - 16);
  while (p->n_steps < target) {
    int before = n;
    if (pick(seed, 3) == 0)
      motif(seed, p, v, &n);
    else
      random_step(seed, p, v, &n);
    if (n > before && p->n_out < MAX_OUT - 1 && pick(seed, 10) == 0)
      p->outs[p->n_out++] = n - 1; /* held */
  }
  p->outs[p->n_out++] = n - 1;
}

/* ---- running --------------------------------------------------------------------------- */
static nb_tensor *make_input(const program *p, const dval *v, int k) {
  return p->strided[k] ? tc_strided_tensor(v[k].v, v[k].s, p->dt)
                       : tc_tensor(v[k].v, v[k].s, p->dt);
}

/* Runs the steps over values val[0..n_in-1] (the inputs); writes the outputs. */
static bool run_steps(const program *p, nb_tensor **val, nb_tensor **out) {
  for (int s = 0; s < p->n_steps; s++)
    if (!(val[p->n_in + s] = step_nb(p, &p->steps[s], val))) return false;
  for (int k = 0; k < p->n_out; k++)
    out[k] = val[p->outs[k]];
  return true;
}

static nb_status body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  const program *p = user;
  nb_tensor *val[MAX_VALUES];
  (void)n_out;
  for (int k = 0; k < n_in; k++)
    val[k] = in[k];
  return run_steps(p, val, out) ? NB_OK : nb_last_status();
}

enum { MODE_UNFUSED, MODE_DROPPED, MODE_CALL, MODE_JIT, MODE_COUNT };
static const char *const mode_names[MODE_COUNT] = {"unfused", "fused, intermediates dropped",
                                                   "fused in nb_call", "fused in nb_jit"};

/* Runs p in mode m on inputs in; res[k] gets output k as doubles. */
static void run_mode(const program *p, int m, nb_tensor *const *in, double **res) {
  nbi_set_fusion(m != MODE_UNFUSED);
  nb_scope_begin();
  nb_tensor *out[MAX_OUT], *val[MAX_VALUES];
  if (m == MODE_UNFUSED || m == MODE_DROPPED) {
    nb_scope_begin(); /* the intermediates die with this scope: only the graph holds them */
    memcpy(val, in, sizeof(nb_tensor *) * (size_t)p->n_in);
    cr_assert(run_steps(p, val, out), "%s", nb_last_error());
    for (int k = 0; k < p->n_out; k++)
      nb_keep(out[k]);
    nb_scope_end();
    cr_assert_eq(nb_eval(out, p->n_out), NB_OK, "%s", nb_last_error());
  } else {
    nb_fn *f = nb_fn_create(body, (void *)p, p->n_in, p->n_out), *g = m == MODE_JIT ? nb_jit(f) : f;
    /* a jitted function's second call runs the executable planned at the first */
    for (int call = 0; call < (m == MODE_JIT ? 2 : 1); call++)
      cr_assert_eq(nb_call(g, in, out), NB_OK, "%s", nb_last_error());
    if (g != f) nb_fn_release(g);
    nb_fn_release(f);
  }
  for (int k = 0; k < p->n_out; k++)
    res[k] = tc_read(out[k]);
  nb_scope_end();
  nbi_set_fusion(true);
}

/* Largest |ref| over the program's values: the scale of its rounding errors. */
static double program_scale(const program *p, const dval *v) {
  double s = 1;
  for (int k = 0; k < p->n_in + p->n_steps; k++)
    for (int64_t i = 0; i < tc_numel(v[k].s); i++)
      s = fmax(s, fabs(v[k].v[i]));
  return s;
}

/* Generates and checks one program; returns the number of compared outputs. */
static int check_program(uint64_t *seed, nb_shape full, nb_dtype dt, int trial) {
  program p;
  dval v[MAX_VALUES];
  generate(seed, &p, full, dt, v);
  nb_scope_begin();
  nb_tensor *in[MAX_IN];
  for (int k = 0; k < p.n_in; k++)
    in[k] = make_input(&p, v, k);
  double *res[MODE_COUNT][MAX_OUT];
  for (int m = 0; m < MODE_COUNT; m++)
    run_mode(&p, m, in, res[m]);
  nb_scope_end();
  /* f32 rounds each step; errors grow with the values' scale and with the
   * rows' lengths (reductions, cumsum) */
  double tol = (dt == NB_F64 ? 1e-11 : 2e-4) * program_scale(&p, v);
  for (int k = 0; k < p.n_out; k++) {
    const dval *ref = &v[p.outs[k]];
    int64_t n = tc_numel(ref->s);
    for (int m = 1; m < MODE_COUNT; m++)
      cr_assert(memcmp(res[m][k], res[MODE_UNFUSED][k], sizeof(double) * (size_t)n) == 0,
                "program %d (%s, full %lld elements), output %d: %s differs from unfused", trial,
                nb_dtype_name(dt), (long long)tc_numel(full), k, mode_names[m]);
    for (int64_t i = 0; i < n; i++)
      cr_assert(fabs(res[MODE_DROPPED][k][i] - ref->v[i]) <= tol,
                "program %d (%s), output %d element %lld: got %.17g, float64 reference %.17g",
                trial, nb_dtype_name(dt), k, (long long)i, res[MODE_DROPPED][k][i], ref->v[i]);
    for (int m = 0; m < MODE_COUNT; m++)
      free(res[m][k]);
  }
  for (int k = 0; k < p.n_in + p.n_steps; k++)
    free(v[k].v);
  return p.n_out;
}

Test(fusion_props, small_programs_read_intermediates_across_rows) {
  uint64_t seed = 0x5eed0001;
  int outputs = 0;
  for (int trial = 0; trial < 320; trial++)
    outputs +=
        check_program(&seed, fulls[trial % N_SMALL_FULLS], trial % 2 ? NB_F64 : NB_F32, trial);
  cr_assert_geq(outputs, 320);
}

Test(fusion_props, threaded_programs_read_intermediates_across_rows) {
  uint64_t seed = 0x5eed0002;
  int n_large = (int)(sizeof fulls / sizeof fulls[0]) - N_SMALL_FULLS, outputs = 0;
  for (int trial = 0; trial < 24; trial++) {
    nb_shape f = fulls[N_SMALL_FULLS + trial % n_large];
    cr_assert_geq(tc_numel(f), NBI_PAR_MIN);
    outputs += check_program(&seed, f, trial % 2 ? NB_F64 : NB_F32, trial);
  }
  cr_assert_geq(outputs, 24);
}

/* The exact program of the issue, in every mode: y = -x; sum(M * y, 1) + y. */
Test(fusion_props, issue_program_in_every_mode) {
  program p = {.dt = NB_F64, .full = {2, {2, 2}}, .n_in = 2, .n_steps = 4, .n_out = 1};
  p.steps[0] = (step){.kind = P_UNARY, .a = 1, .op = 0};          /* v2 = -x */
  p.steps[1] = (step){.kind = P_BINARY, .a = 0, .b = 2, .op = 2}; /* v3 = M * v2 */
  p.steps[2] = (step){.kind = P_REDUCE_LAST, .a = 3, .op = 4};    /* v4 = sum(v3, -1) */
  p.steps[3] = (step){.kind = P_BINARY, .a = 4, .b = 2, .op = 0}; /* v5 = v4 + v2 */
  p.outs[0] = 5;
  double M[4] = {1, 2, 3, 4}, x[2] = {1, 10}, want[2] = {-22, -53};
  nb_tensor *in[2] = {tc_tensor(M, NB_SHAPE(2, 2), NB_F64), tc_tensor(x, NB_SHAPE(2), NB_F64)};
  for (int m = 0; m < MODE_COUNT; m++) {
    double *res[1];
    run_mode(&p, m, in, res);
    for (int i = 0; i < 2; i++)
      cr_assert_eq(res[0][i], want[i], "%s: element %d is %g, expected %g", mode_names[m], i,
                   res[0][i], want[i]);
    free(res[0]);
  }
}
