/* test/fuzz/fuzz.h — the libFuzzer target's shared parts (fuzz_api.c, fuzz_ops.c):
 * reading arguments from the input, strings (einsum, meshes, sharding specs), the
 * program's state (tensor pool, functions, meshes) and the checks made after
 * every call. */
#ifndef NABLA_FUZZ_H
#define NABLA_FUZZ_H

#include <float.h>
#include <limits.h>
#include <math.h>
#include <nabla/nabla.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "fuzz_api: " __VA_ARGS__);                                                   \
      fprintf(stderr, " (last error: %s)\n", nb_last_error());                                     \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

enum {
  POOL = 16,          /* tensor slots */
  POOL_NUMEL = 256,   /* larger tensors are never kept */
  MAX_STEPS = 96,     /* calls per input at top level */
  BODY_STEPS = 16,    /* calls per run of a generated body */
  MAX_FNS = 12,       /* functions per input */
  MAX_PROGS = 12,     /* generated bodies per input */
  MAX_MESHES = 4,     /* meshes per input */
  MAX_OWNED = 16,     /* nb_retain references per input */
  MAX_ARITY = 64,     /* functions with more inputs or outputs are not called */
  PROG_BYTES = 96,    /* bytes of a generated body */
  MAX_CALL_DEPTH = 3, /* nb_call nesting through bodies */
};

/* ---- reading the input ---------------------------------------------------------------------- */
typedef struct reader {
  const uint8_t *p;
  size_t n, i;
} reader;

static inline uint8_t u8(reader *r) { return r->i < r->n ? r->p[r->i++] : 0; }
static inline bool more(const reader *r) { return r->i < r->n; }
static inline bool flag(reader *r) { return u8(r) & 1; }
static inline uint64_t u64(reader *r) {
  uint64_t v = 0;
  for (int k = 0; k < 8; k++)
    v |= (uint64_t)u8(r) << (8 * k);
  return v;
}

/* An axis: mostly in [-4, 7], sometimes far out. */
static inline int axis_arg(reader *r) {
  static const int odd[] = {INT_MIN, INT_MAX, -9, 8, 9, NB_NOT_MAPPED, -100, 1 << 20};
  uint8_t v = u8(r);
  return v < 232 ? (int)(v % 12) - 4 : odd[v % 8];
}

/* A dimension or count: mostly small, sometimes zero, negative or huge. */
static inline int64_t dim_arg(reader *r) {
  static const int64_t small[] = {1, 2, 3, 4, 1, 2, 0, 5, 8, 3, 6, 1};
  static const int64_t odd[] = {-1,        (int64_t)1 << 20, (int64_t)1 << 40, INT64_MAX,
                                INT64_MIN, (int64_t)1 << 47, (int64_t)1 << 62, -2};
  uint8_t v = u8(r);
  return v < 224 ? small[v % 12] : odd[v % 8];
}

/* A slice bound or step: small, or one of the extremes. */
static inline int64_t index_arg(reader *r) {
  static const int64_t odd[] = {
      NB_END, INT64_MIN, INT64_MIN + 1, -((int64_t)1 << 40), (int64_t)1 << 40, INT64_MAX - 1,
      -1,     0};
  uint8_t v = u8(r);
  return v < 224 ? (int64_t)(v % 13) - 6 : odd[v % 8];
}

static inline double scalar_arg(reader *r) {
  static const double table[] = {0,    1,     -1,  0.5,      2,         -2.5,   3,       1e-3,
                                 1e30, -1e30, NAN, INFINITY, -INFINITY, 1e-310, DBL_MAX, 7};
  uint8_t v = u8(r);
  if (v < 240) return table[v % 16];
  uint64_t bits = u64(r);
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

static inline nb_dtype dtype_arg(reader *r) {
  static const nb_dtype valid[] = {NB_F32, NB_F32, NB_F64,  NB_F64, NB_F16, NB_BF16,
                                   NB_I32, NB_I64, NB_BOOL, NB_U8,  NB_I8,  NB_I16};
  uint8_t v = u8(r);
  if (v < 240) return valid[v % 12];
  return (nb_dtype)(NB_DTYPE_COUNT + v % 3);
}

static inline nb_shape shape_arg(reader *r) {
  static const int odd[] = {5, 6, 7, 8, 9, -1, 100, 8};
  uint8_t v = u8(r);
  nb_shape s = {.ndim = v < 224 ? v % 5 : odd[v % 8]};
  for (int d = 0; d < NB_MAX_DIMS && d < s.ndim; d++)
    s.dims[d] = dim_arg(r);
  return s;
}

static inline nb_axes axes_arg(reader *r) {
  uint8_t v = u8(r);
  nb_axes a = {.n = v < 16 ? -1 : v < 240 ? v % 4 : (v % 2 ? 9 : -2)};
  for (int k = 0; k < NB_MAX_DIMS && k < a.n; k++)
    a.v[k] = axis_arg(r);
  return a;
}

/* Elements of s, -1 when it is invalid or beyond int64. */
static inline int64_t numel_of(const nb_shape *s) {
  if (s->ndim < 0 || s->ndim > NB_MAX_DIMS) return -1;
  int64_t n = 1;
  bool zero = false;
  for (int d = 0; d < s->ndim; d++) {
    if (s->dims[d] < 0) return -1;
    if (s->dims[d] == 0) {
      zero = true;
      continue;
    }
    if (s->dims[d] > INT64_MAX / n) return -1;
    n *= s->dims[d];
  }
  return zero ? 0 : n;
}

/* Whether a creation of shape s may run: small, empty, invalid, or so large
 * (>= 2^42 elements) that allocating it fails at once. */
static inline bool creatable(const nb_shape *s) {
  int64_t n = numel_of(s);
  return n <= POOL_NUMEL || n >= ((int64_t)1 << 42);
}

/* ---- strings: einsum, meshes, specs --------------------------------------------------------- */
/* Up to cap-1 raw bytes, NUL-terminated. */
static inline void raw_string(reader *r, char *buf, size_t cap) {
  size_t n = u8(r) % cap;
  for (size_t k = 0; k < n; k++)
    buf[k] = (char)u8(r);
  buf[n] = '\0';
}

static const char *const axis_names[] = {"x", "y", "dp", "tp", "z", "q"};

static inline void einsum_spec(reader *r, char *buf, size_t cap, int n_ops) {
  if (u8(r) >= 224) {
    raw_string(r, buf, cap);
    return;
  }
  static const char letters[] = "abcdijkAB";
  size_t k = 0;
  for (int o = 0; o < n_ops && k + 8 < cap; o++) {
    if (o) buf[k++] = ',';
    int len = u8(r) % 5;
    for (int j = 0; j < len; j++)
      buf[k++] = letters[u8(r) % 9];
  }
  if (flag(r)) {
    buf[k++] = '-';
    buf[k++] = '>';
    int len = u8(r) % 4;
    for (int j = 0; j < len && k + 1 < cap; j++)
      buf[k++] = letters[u8(r) % 9];
  }
  buf[k] = '\0';
}

static inline void mesh_string(reader *r, char *buf, size_t cap) {
  if (u8(r) >= 232) {
    raw_string(r, buf, cap);
    return;
  }
  static const char *const sizes[] = {"1", "2", "2", "3", "4", "0", "-1", "99999999999"};
  int n = 1 + u8(r) % 3;
  size_t k = 0;
  buf[0] = '\0';
  for (int a = 0; a < n; a++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%s=%s", a ? "," : "", axis_names[u8(r) % 6],
                          sizes[u8(r) % 8]);
}

/* A sharding spec: entries from the grammar (sharding.h) or raw bytes. */
static inline void spec_string(reader *r, char *buf, size_t cap) {
  if (u8(r) >= 224) {
    raw_string(r, buf, cap);
    return;
  }
  size_t k = 0;
  bool brackets = flag(r);
  int n = u8(r) % 5;
#define PUT(...) (k += (size_t)snprintf(buf + k, k < cap ? cap - k : 0, __VA_ARGS__))
  buf[0] = '\0';
  if (brackets) PUT("[");
  for (int e = 0; e < n && k < cap; e++) {
    if (e) PUT(", ");
    switch (u8(r) % 6) {
    case 0:
    case 1: PUT("_"); break;
    case 2:
    case 3: PUT("%s", axis_names[u8(r) % 6]); break;
    case 4: PUT("(%s, %s)", axis_names[u8(r) % 6], axis_names[u8(r) % 6]); break;
    default: PUT("%s:(%d)%d", axis_names[u8(r) % 6], 1 + u8(r) % 4, 1 + u8(r) % 4); break;
    }
    if (u8(r) % 4 == 0) PUT("?");
    if (u8(r) % 8 == 0) PUT("@%d", (int)(u8(r) % 4) - 1);
  }
  if (brackets) PUT("]");
  if (u8(r) % 4 == 0) PUT(" %s(%s)", flag(r) ? "partial" : "replicated", axis_names[u8(r) % 6]);
#undef PUT
  if (k >= cap) buf[cap - 1] = '\0';
}

/* ---- the program's state -------------------------------------------------------------------- */
/* A tensor the program may use: the scope depth that holds it (the fuzzer's
 * count of open scopes when it was registered), or -1 for a reference the
 * fuzzer owns (nb_retain). */
typedef struct slot {
  nb_tensor *t;
  int depth;
} slot;

typedef struct pool {
  slot s[POOL];
  int next; /* the slot the next tensor takes (round robin) */
} pool;

struct state;

/* A generated function body: its bytes, arity, and the tensors it captures
 * (retained by the fuzzer for the input's lifetime). */
typedef struct prog {
  uint8_t code[PROG_BYTES];
  int len, n_in, n_out;
  nb_tensor *capt[2];
  struct state *st;
  int64_t limit; /* while_loop bodies: the trip count */
  int op;        /* while_loop bodies: the update applied to the carries */
} prog;

/* A function with the number of Jacobian transforms around it: each multiplies
 * the work of a call by its inputs' size. */
typedef struct fn_slot {
  nb_fn *f;
  int jac;
} fn_slot;

typedef struct state {
  pool top;
  int depth; /* scopes the program opened and did not end */
  fn_slot fns[MAX_FNS];
  int n_fns;
  prog progs[MAX_PROGS];
  int n_progs;
  nb_mesh *meshes[MAX_MESHES];
  int n_meshes;
  nb_tensor *owned[MAX_OWNED];
  int n_owned;
  int call_depth;
} state;

static inline void pool_put(pool *p, nb_tensor *t, int depth) {
  if (!t) return;
  int64_t n = nb_numel(t);
  if (n < 0 || n > POOL_NUMEL) return;
  p->s[p->next] = (slot){t, depth};
  p->next = (p->next + 1) % POOL;
}

/* A tensor of the pool: the (v mod n)th of the n it holds (NULL for v = 255
 * and when it is empty). */
static inline nb_tensor *pick(pool *p, reader *r) {
  uint8_t v = u8(r);
  int n = 0;
  for (int k = 0; k < POOL; k++)
    n += p->s[k].t != NULL;
  if (v == 255 || n == 0) return NULL;
  for (int k = 0, j = v % n; k < POOL; k++)
    if (p->s[k].t && j-- == 0) return p->s[k].t;
  return NULL;
}

/* A shape: read from the input, or (first byte odd) a pooled tensor's, so that
 * ops on tensors made from it tend to fit. */
static inline nb_shape shape_like(pool *p, reader *r) {
  if (!(u8(r) & 1)) return shape_arg(r);
  nb_tensor *t = pick(p, r);
  return t ? nb_shape_of(t) : shape_arg(r);
}

/* FUZZ_TRACE=1 in the environment: each checked call is printed (to read what
 * an input does). */
extern bool fuzz_trace;

/* ---- checks --------------------------------------------------------------------------------- */
/* A call returning a tensor: NULL with an error recorded, or a sound tensor
 * with none (errors are cleared before each call). */
static inline nb_tensor *checked(nb_tensor *t, const char *what) {
  if (fuzz_trace) {
    char b[160];
    fprintf(stderr, "  %s -> %s %s %s\n", what, t ? nb_dtype_name(nb_dtype_of(t)) : "NULL",
            t ? nb_shape_str(nb_shape_of(t), b, sizeof b) : "", nb_last_error());
  }
  if (!t) {
    CHECK(nb_last_status() != NB_OK, "%s returned NULL with no error recorded", what);
    return NULL;
  }
  CHECK(nb_last_status() == NB_OK, "%s returned a tensor with an error recorded", what);
  nb_shape s = nb_shape_of(t);
  CHECK(s.ndim >= 0 && s.ndim <= NB_MAX_DIMS, "%s: result of rank %d", what, s.ndim);
  CHECK(nb_numel(t) == numel_of(&s), "%s: numel %lld for its shape", what, (long long)nb_numel(t));
  CHECK(nb_dtype_of(t) < NB_DTYPE_COUNT, "%s: result dtype %d", what, (int)nb_dtype_of(t));
  return t;
}

static inline nb_status checked_status(nb_status st, const char *what) {
  if (fuzz_trace) fprintf(stderr, "  %s -> %s %s\n", what, nb_status_str(st), nb_last_error());
  CHECK((st == NB_OK) == (nb_last_status() == NB_OK), "%s returned %s with %s recorded", what,
        nb_status_str(st), nb_status_str(nb_last_status()));
  return st;
}

/* nb_call-like results: every output NULL on error, none NULL on success. */
static inline void checked_outputs(nb_status st, nb_tensor **out, int n, const char *what) {
  checked_status(st, what);
  for (int k = 0; k < n; k++)
    CHECK(st ? out[k] == NULL : out[k] != NULL, "%s: output %d is %s after %s", what, k,
          out[k] ? "set" : "NULL", nb_status_str(st));
}

static inline nb_mesh *pick_mesh(state *st, reader *r) {
  uint8_t v = u8(r);
  return st->n_meshes && v != 255 ? st->meshes[v % st->n_meshes] : NULL;
}

/* ---- the two halves ------------------------------------------------------------------------- */
extern FILE *fuzz_devnull; /* where nb_fprint and nb_graph_dot write */

/* Runs up to max_steps calls read from r on the tensors of p (body: inside a
 * generated function, where scopes stay balanced and process-wide settings are
 * left alone). */
void fuzz_run_ops(state *st, pool *p, reader *r, int max_steps, bool body);
/* A new function (a generated body or a transform of a pooled one) into st. */
void fuzz_make_fn(state *st, pool *p, reader *r);
/* Calls a pooled function, or runs cond / scan / fori_loop / while_loop. */
void fuzz_call(state *st, pool *p, reader *r, bool body);
/* Registers the custom ops the programs call (once, at start-up). */
void fuzz_register_ops(void);
/* Keeps t, made inside the current call's own scope, in the scope around it and
 * in p when it is small enough; larger results go with the call's scope. */
void fuzz_keep(pool *p, int depth, nb_tensor *t);

#endif
