/* test/diff_program.h — the differential test's programs (test/diff/README.md):
 * reading test/diff/programs.txt, drawing a program's input arrays from their
 * seeds, and running its ops with nabla. test/test_diff.c builds the transform
 * chains and compares. */
#ifndef NABLA_TEST_DIFF_PROGRAM_H
#define NABLA_TEST_DIFF_PROGRAM_H

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>

#include "common.h"

/* ---- the op set: one name per op the generator writes ---------------------------------- */
/* clang-format off */
#define DP_UNARY(X)                                                                                \
  X(neg) X(abs) X(sign) X(exp) X(expm1) X(log) X(log1p) X(sqrt) X(rsqrt) X(square) X(sin) X(cos)   \
  X(tan) X(tanh) X(sigmoid) X(relu) X(gelu) X(silu) X(softplus) X(erf) X(floor) X(ceil) X(round)   \
  X(reciprocal)
#define DP_BINARY(X)                                                                               \
  X(add) X(sub) X(mul) X(div) X(pow) X(maximum) X(minimum) X(atan2) X(gt) X(lt) X(ge) X(le)       \
  X(mse) X(outer) X(matmul)
#define DP_SCALAR(X)                                                                               \
  X(add_s, add_scalar) X(sub_s, sub_scalar) X(rsub_s, rsub_scalar) X(mul_s, mul_scalar)            \
  X(div_s, div_scalar) X(rdiv_s, rdiv_scalar) X(pow_s, pow_scalar)                                 \
  X(maximum_s, maximum_scalar) X(minimum_s, minimum_scalar)
#define DP_REDUCE(X) X(sum) X(mean) X(prod) X(max) X(min) X(var) X(std) X(logsumexp)
#define DP_OTHER(X)                                                                                \
  X(clip) X(where) X(softmax) X(log_softmax) X(cumsum) X(einsum) X(reshape) X(transpose)           \
  X(permute) X(squeeze) X(unsqueeze) X(broadcast_to) X(flatten) X(concat) X(stack) X(slice)        \
  X(pad) X(flip) X(repeat) X(tile) X(take) X(take_along_axis) X(scatter_add) X(layer_norm)         \
  X(rms_norm) X(cross_entropy) X(attention) X(conv2d) X(embedding)
/* clang-format on */

typedef enum dp_op {
#define DP_ENUM_(n) DP_##n,
#define DP_ENUM2_(n, f) DP_##n,
  DP_UNARY(DP_ENUM_) DP_BINARY(DP_ENUM_) DP_SCALAR(DP_ENUM2_) DP_REDUCE(DP_ENUM_) DP_OTHER(DP_ENUM_)
      DP_OP_COUNT
#undef DP_ENUM_
#undef DP_ENUM2_
} dp_op;

static const char *const dp_op_names[DP_OP_COUNT] = {
#define DP_NAME_(n) #n,
#define DP_NAME2_(n, f) #n,
    DP_UNARY(DP_NAME_) DP_BINARY(DP_NAME_) DP_SCALAR(DP_NAME2_) DP_REDUCE(DP_NAME_)
        DP_OTHER(DP_NAME_)
#undef DP_NAME_
#undef DP_NAME2_
};

/* ---- a program ------------------------------------------------------------------------ */
enum { DP_MAX_IDS = 8, DP_MAX_OUT = 32, DP_MAX_ARGS = 24 };
#define DP_END_ATTR INFINITY /* a slice's "E": NB_END */

typedef struct dp_step {
  dp_op op;
  int n_ids, ids[DP_MAX_IDS];
  int n_at;
  double *at;    /* attributes (numbers; "E" is DP_END_ATTR) */
  char spec[32]; /* einsum */
} dp_step;

typedef struct dp_slot { /* an input array: seed, range, shape */
  uint64_t seed;
  double lo, hi;
  nb_shape shape;
} dp_slot;

typedef struct dp_ref { /* an expected array */
  nb_shape shape;
  bool full;      /* all values, or projections and samples */
  double *v;      /* full: numel values */
  double scale;   /* projected: max |value| */
  uint64_t wseed; /* projection k's weights: uniform [-1, 1) from wseed + k */
  int n_proj, n_sample;
  double proj[8];
  int64_t *sample_idx;
  double *sample_v;
} dp_ref;

typedef struct dp_check {
  char chain[160];
  int n_args, args[DP_MAX_ARGS];
  int n_out, refs[DP_MAX_OUT]; /* -1: not compared */
} dp_check;

typedef struct dp_program {
  int index;
  nb_dtype dt;
  bool large;
  int n_in, n_steps, n_slots, n_refs, n_checks;
  dp_step *steps;
  dp_slot *slots;
  dp_ref *refs;
  dp_check *checks;
} dp_program;

typedef struct dp_file {
  double rtol[2]; /* f32, f64 */
  int n;
  dp_program *progs;
} dp_file;

/* ---- reading ----------------------------------------------------------------------------- */
typedef struct dp_reader {
  char *s;  /* the whole file, NUL-terminated; the cursor */
  int line; /* for messages */
  char sep; /* the character that ended the last token */
} dp_reader;

/* The next whitespace-separated token (NUL-terminated in place); "" at the end.
 * Comment lines (#...) are skipped. */
static char *dp_token(dp_reader *r) {
  for (;;) {
    while (*r->s && isspace((unsigned char)*r->s))
      r->line += *r->s++ == '\n';
    if (*r->s != '#') break;
    while (*r->s && *r->s != '\n')
      r->s++;
  }
  char *t = r->s;
  while (*r->s && !isspace((unsigned char)*r->s))
    r->s++;
  r->sep = *r->s;
  if (*r->s) {
    r->line += *r->s == '\n';
    *r->s++ = '\0';
  }
  return t;
}

static double dp_parse_number(const char *t, int line) {
  char *end;
  if (!strcmp(t, "E")) return DP_END_ATTR;
  double v = strtod(t, &end);
  cr_assert(*t && !*end, "programs.txt line %d: \"%s\" is not a number", line, t);
  return v;
}

static double dp_number(dp_reader *r) {
  char *t = dp_token(r);
  return dp_parse_number(t, r->line);
}

static int64_t dp_int(dp_reader *r) {
  double v = dp_number(r);
  cr_assert(v == floor(v), "programs.txt line %d: %g is not an integer", r->line, v);
  return (int64_t)v;
}

static void dp_expect(dp_reader *r, const char *word) {
  char *t = dp_token(r);
  cr_assert(!strcmp(t, word), "programs.txt line %d: \"%s\", expected \"%s\"", r->line, t, word);
}

static nb_shape dp_shape(dp_reader *r) {
  nb_shape s = {.ndim = (int)dp_int(r)};
  cr_assert(s.ndim >= 0 && s.ndim <= NB_MAX_DIMS, "line %d: rank %d", r->line, s.ndim);
  for (int d = 0; d < s.ndim; d++)
    s.dims[d] = dp_int(r);
  return s;
}

/* The rest of the line's tokens as attributes (an einsum's spec is a string). */
static void dp_attrs(dp_reader *r, dp_step *st) {
  int cap = 16;
  st->at = malloc(sizeof(double) * (size_t)cap);
  st->n_at = 0;
  while (r->sep != '\n' && *r->s) {
    while (*r->s == ' ' || *r->s == '\t')
      r->s++;
    if (*r->s == '\n' || !*r->s) break;
    char *t = dp_token(r);
    if (st->op == DP_einsum && !st->spec[0]) {
      snprintf(st->spec, sizeof st->spec, "%s", t);
      continue;
    }
    if (st->n_at == cap) st->at = realloc(st->at, sizeof(double) * (size_t)(cap *= 2));
    st->at[st->n_at++] = dp_parse_number(t, r->line);
  }
}

static dp_op dp_op_of(const char *name, int line) {
  for (int k = 0; k < DP_OP_COUNT; k++)
    if (!strcmp(dp_op_names[k], name)) return (dp_op)k;
  cr_assert_fail("programs.txt line %d: unknown op %s", line, name);
  return DP_OP_COUNT;
}

static void dp_read_ref(dp_reader *r, dp_ref *ref, int rid) {
  cr_assert_eq(dp_int(r), rid, "line %d: refs out of order", r->line);
  ref->shape = dp_shape(r);
  char *mode = dp_token(r);
  int64_t n = tc_numel(ref->shape);
  ref->full = !strcmp(mode, "F");
  if (ref->full) {
    ref->v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
      ref->v[i] = dp_number(r);
    return;
  }
  cr_assert(!strcmp(mode, "P"), "line %d: ref mode %s", r->line, mode);
  ref->scale = dp_number(r);
  ref->wseed = (uint64_t)dp_int(r);
  ref->n_proj = (int)dp_int(r);
  cr_assert(ref->n_proj >= 0 && ref->n_proj <= 8, "line %d: projections", r->line);
  for (int k = 0; k < ref->n_proj; k++)
    ref->proj[k] = dp_number(r);
  ref->n_sample = (int)dp_int(r);
  ref->sample_idx = malloc(sizeof(int64_t) * (size_t)(ref->n_sample + 1));
  ref->sample_v = malloc(sizeof(double) * (size_t)(ref->n_sample + 1));
  for (int k = 0; k < ref->n_sample; k++) {
    ref->sample_idx[k] = dp_int(r);
    ref->sample_v[k] = dp_number(r);
  }
}

static void dp_read_program(dp_reader *r, dp_program *p) {
  p->index = (int)dp_int(r);
  char *dt = dp_token(r);
  cr_assert(!strcmp(dt, "f32") || !strcmp(dt, "f64"), "line %d: dtype %s", r->line, dt);
  p->dt = dt[1] == '3' ? NB_F32 : NB_F64;
  p->large = !strcmp(dp_token(r), "large");
  p->n_in = (int)dp_int(r);
  p->n_steps = (int)dp_int(r);
  p->n_slots = (int)dp_int(r);
  p->slots = calloc((size_t)p->n_slots + 1, sizeof *p->slots);
  p->steps = calloc((size_t)p->n_steps + 1, sizeof *p->steps);
  for (int k = 0; k < p->n_slots; k++) {
    dp_expect(r, "arr");
    cr_assert_eq(dp_int(r), k, "line %d: arrays out of order", r->line);
    p->slots[k].seed = (uint64_t)dp_int(r);
    p->slots[k].lo = dp_number(r);
    p->slots[k].hi = dp_number(r);
    p->slots[k].shape = dp_shape(r);
  }
  for (int k = 0; k < p->n_steps; k++) {
    dp_step *st = &p->steps[k];
    dp_expect(r, "op");
    st->op = dp_op_of(dp_token(r), r->line);
    st->n_ids = (int)dp_int(r);
    cr_assert(st->n_ids >= 0 && st->n_ids <= DP_MAX_IDS, "line %d: operands", r->line);
    for (int i = 0; i < st->n_ids; i++) {
      st->ids[i] = (int)dp_int(r);
      cr_assert(st->ids[i] >= 0 && st->ids[i] < p->n_in + k, "line %d: operand id", r->line);
    }
    dp_attrs(r, st);
  }
  int cap_refs = 16, cap_checks = 16;
  p->refs = calloc((size_t)cap_refs, sizeof *p->refs);
  p->checks = calloc((size_t)cap_checks, sizeof *p->checks);
  for (;;) {
    char *t = dp_token(r);
    if (!strcmp(t, "end")) break;
    if (!strcmp(t, "ref")) {
      if (p->n_refs == cap_refs)
        p->refs = realloc(p->refs, sizeof *p->refs * (size_t)(cap_refs *= 2));
      memset(&p->refs[p->n_refs], 0, sizeof *p->refs);
      dp_read_ref(r, &p->refs[p->n_refs], p->n_refs);
      p->n_refs++;
      continue;
    }
    cr_assert(!strcmp(t, "chk"), "line %d: \"%s\" in a program", r->line, t);
    if (p->n_checks == cap_checks)
      p->checks = realloc(p->checks, sizeof *p->checks * (size_t)(cap_checks *= 2));
    dp_check *c = &p->checks[p->n_checks++];
    snprintf(c->chain, sizeof c->chain, "%s", dp_token(r));
    c->n_args = (int)dp_int(r);
    cr_assert(c->n_args >= 0 && c->n_args <= DP_MAX_ARGS, "line %d: arguments", r->line);
    for (int k = 0; k < c->n_args; k++)
      c->args[k] = (int)dp_int(r);
    c->n_out = (int)dp_int(r);
    cr_assert(c->n_out >= 0 && c->n_out <= DP_MAX_OUT, "line %d: outputs", r->line);
    for (int k = 0; k < c->n_out; k++)
      c->refs[k] = (int)dp_int(r);
  }
}

/* Reads test/diff/programs.txt (next to this header's directory). */
static dp_file dp_load(void) {
  const char *src = __FILE__, *slash = strrchr(src, '/');
  char path[1024];
  snprintf(path, sizeof path, "%.*sdiff/programs.txt", slash ? (int)(slash - src + 1) : 0, src);
  FILE *f = fopen(path, "rb");
  cr_assert(f, "cannot open %s (run the tests from the repository root)", path);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)size + 1);
  cr_assert_eq(fread(text, 1, (size_t)size, f), (size_t)size);
  text[size] = '\0';
  fclose(f);
  dp_reader r = {.s = text, .line = 1};
  dp_file df = {0};
  dp_expect(&r, "tolerance");
  dp_expect(&r, "f32");
  df.rtol[0] = dp_number(&r);
  dp_expect(&r, "f64");
  df.rtol[1] = dp_number(&r);
  int cap = 64;
  df.progs = calloc((size_t)cap, sizeof *df.progs);
  for (char *t = dp_token(&r); *t; t = dp_token(&r)) {
    cr_assert(!strcmp(t, "prog"), "programs.txt line %d: \"%s\"", r.line, t);
    if (df.n == cap) df.progs = realloc(df.progs, sizeof *df.progs * (size_t)(cap *= 2));
    memset(&df.progs[df.n], 0, sizeof *df.progs);
    dp_read_program(&r, &df.progs[df.n++]);
  }
  free(text);
  return df;
}

static void dp_free(dp_file *df) {
  for (int i = 0; i < df->n; i++) {
    dp_program *p = &df->progs[i];
    for (int k = 0; k < p->n_steps; k++)
      free(p->steps[k].at);
    for (int k = 0; k < p->n_refs; k++) {
      free(p->refs[k].v);
      free(p->refs[k].sample_idx);
      free(p->refs[k].sample_v);
    }
    free(p->steps), free(p->slots), free(p->refs), free(p->checks);
  }
  free(df->progs);
}

/* ---- arrays ------------------------------------------------------------------------------ */
/* n values uniform in [lo, hi) from seed (tc_uniform's sequence; gen_jax.py's uniform). */
static void dp_uniform(uint64_t seed, int64_t n, double lo, double hi, double *out) {
  for (int64_t i = 0; i < n; i++)
    out[i] = tc_uniform(&seed, lo, hi);
}

/* Slot k of p as a tensor of p's dtype. */
static nb_tensor *dp_slot_tensor(const dp_program *p, int k) {
  const dp_slot *s = &p->slots[k];
  int64_t n = tc_numel(s->shape);
  double *x = malloc(sizeof(double) * (size_t)(n ? n : 1));
  dp_uniform(s->seed, n, s->lo, s->hi, x);
  nb_tensor *t = tc_tensor(x, s->shape, p->dt);
  free(x);
  return t;
}

/* ---- running the ops ------------------------------------------------------------------- */
static nb_axes dp_axes(const double *at, int n) { /* n < 0: every axis */
  nb_axes a = {.n = n < 0 ? -1 : n};
  for (int k = 0; k < n; k++)
    a.v[k] = (int)at[k];
  return a;
}

static nb_shape dp_attr_shape(const double *at) { /* ndim, dims */
  nb_shape s = {.ndim = (int)at[0]};
  for (int d = 0; d < s.ndim; d++)
    s.dims[d] = (int64_t)at[1 + d];
  return s;
}

/* An i64 constant written in attributes from at: ndim, dims, values. *used
 * gets the count of attributes it took. */
static nb_tensor *dp_const_i64(const double *at, int *used) {
  nb_shape s = dp_attr_shape(at);
  int64_t n = tc_numel(s), *v = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++)
    v[i] = (int64_t)at[1 + s.ndim + i];
  if (used) *used = 1 + s.ndim + (int)n;
  nb_tensor *t = nb_from_data(v, s, NB_I64);
  free(v);
  return t;
}

/* The [Lq, Lk] mask j <= i. */
static nb_tensor *dp_causal(int64_t lq, int64_t lk) {
  bool *m = malloc((size_t)(lq * lk > 0 ? lq * lk : 1));
  for (int64_t i = 0; i < lq; i++)
    for (int64_t j = 0; j < lk; j++)
      m[i * lk + j] = j <= i;
  nb_tensor *t = nb_from_data(m, NB_SHAPE(lq, lk), NB_BOOL);
  free(m);
  return t;
}

static nb_tensor *dp_run_step(const dp_step *st, nb_tensor *const *a) {
  const double *at = st->at;
  switch (st->op) {
#define DP_CASE1_(n)                                                                               \
  case DP_##n: return nb_##n(a[0]);
    DP_UNARY(DP_CASE1_)
#undef DP_CASE1_
#define DP_CASE2_(n)                                                                               \
  case DP_##n: return nb_##n(a[0], a[1]);
    DP_BINARY(DP_CASE2_)
#undef DP_CASE2_
#define DP_CASES_(n, f)                                                                            \
  case DP_##n: return nb_##f(a[0], at[0]);
    DP_SCALAR(DP_CASES_)
#undef DP_CASES_
#define DP_CASER_(n)                                                                               \
  case DP_##n: return nb_##n(a[0], dp_axes(at + 2, (int)at[1]), at[0] != 0);
    DP_REDUCE(DP_CASER_)
#undef DP_CASER_
  case DP_clip: return nb_clip(a[0], at[0], at[1]);
  case DP_where: return nb_where(a[0], a[1], a[2]);
  case DP_softmax: return nb_softmax(a[0], (int)at[0]);
  case DP_log_softmax: return nb_log_softmax(a[0], (int)at[0]);
  case DP_cumsum: return nb_cumsum(a[0], (int)at[0]);
  case DP_einsum: return nb_einsum(st->spec, a, st->n_ids);
  case DP_reshape: return nb_reshape(a[0], dp_attr_shape(at));
  case DP_transpose: return nb_transpose(a[0]);
  case DP_permute: return nb_permute(a[0], dp_axes(at + 1, (int)at[0]));
  case DP_squeeze: return nb_squeeze(a[0], dp_axes(at + 1, (int)at[0]));
  case DP_unsqueeze: return nb_unsqueeze(a[0], (int)at[0]);
  case DP_broadcast_to: return nb_broadcast_to(a[0], dp_attr_shape(at));
  case DP_flatten: return nb_flatten(a[0], (int)at[0], (int)at[1]);
  case DP_concat: return nb_concat(a, st->n_ids, (int)at[0]);
  case DP_stack: return nb_stack(a, st->n_ids, (int)at[0]);
  case DP_slice: {
    int64_t starts[NB_MAX_DIMS], stops[NB_MAX_DIMS], steps[NB_MAX_DIMS];
    for (int d = 0; d < (int)at[0]; d++) {
      starts[d] = (int64_t)at[1 + 3 * d];
      stops[d] = isinf(at[2 + 3 * d]) ? NB_END : (int64_t)at[2 + 3 * d];
      steps[d] = (int64_t)at[3 + 3 * d];
    }
    return nb_slice(a[0], starts, stops, steps);
  }
  case DP_pad: {
    int nd = (int)at[0];
    int64_t pads[2 * NB_MAX_DIMS];
    for (int k = 0; k < 2 * nd; k++)
      pads[k] = (int64_t)at[1 + k];
    return nb_pad(a[0], pads, at[1 + 2 * nd]);
  }
  case DP_flip: return nb_flip(a[0], dp_axes(at + 1, (int)at[0]));
  case DP_repeat: return nb_repeat(a[0], (int64_t)at[0], (int)at[1]);
  case DP_tile: return nb_tile(a[0], dp_attr_shape(at));
  case DP_take: return nb_take(a[0], dp_const_i64(at + 1, NULL), (int)at[0]);
  case DP_take_along_axis: return nb_take_along_axis(a[0], dp_const_i64(at + 1, NULL), (int)at[0]);
  case DP_scatter_add: return nb_scatter_add(a[0], dp_const_i64(at + 1, NULL), a[1], (int)at[0]);
  case DP_layer_norm:
    return nb_layer_norm(a[0], at[1] != 0 ? a[1] : NULL, at[2] != 0 ? a[1 + (at[1] != 0)] : NULL,
                         at[0]);
  case DP_rms_norm: return nb_rms_norm(a[0], at[1] != 0 ? a[1] : NULL, at[0]);
  case DP_cross_entropy:
    return nb_cross_entropy(a[0], at[0] == 0 ? a[1] : dp_const_i64(at + 1, NULL));
  case DP_attention: {
    nb_shape q = nb_shape_of(a[0]), k = nb_shape_of(a[1]);
    nb_tensor *mask = at[0] != 0 ? dp_causal(q.dims[q.ndim - 2], k.dims[k.ndim - 2]) : NULL;
    return nb_attention(a[0], a[1], a[2], mask);
  }
  case DP_conv2d: {
    nb_conv2d_params cp = {
        {(int)at[0], (int)at[1]}, {(int)at[2], (int)at[3]}, {(int)at[4], (int)at[5]}, (int)at[6]};
    return nb_conv2d(a[0], a[1], at[7] != 0 ? a[2] : NULL, &cp);
  }
  case DP_embedding: return nb_embedding(a[0], dp_const_i64(at, NULL));
  default: return NULL;
  }
}

/* The program's output over inputs in[0..n_in-1] (NULL with the error set). */
static nb_tensor *dp_run(const dp_program *p, nb_tensor *const *in) {
  nb_tensor **v = malloc(sizeof(nb_tensor *) * (size_t)(p->n_in + p->n_steps));
  for (int k = 0; k < p->n_in; k++)
    v[k] = in[k];
  nb_tensor *out = p->n_steps ? NULL : in[0];
  for (int s = 0; s < p->n_steps; s++) {
    nb_tensor *a[DP_MAX_IDS];
    for (int i = 0; i < p->steps[s].n_ids; i++)
      a[i] = v[p->steps[s].ids[i]];
    out = v[p->n_in + s] = dp_run_step(&p->steps[s], a);
    if (!out) break;
  }
  free(v);
  return out;
}

#endif
