/* src/sharding/spec.c — tensor shardings: the spec grammar of
 * include/nabla/sharding.h parsed into nbi_sharding, validity checks, the
 * canonical text, equality, and the local block each device holds. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#include "sharding.h"

/* ---- axis lists ---------------------------------------------------------------------- */

/* Whether (sub-)axis a is valid on m: the split [pre, size, rest] divides the
 * axis, and a size-1 part is only a whole axis of size 1. */
static bool axis_valid(const nb_mesh *m, const nbi_axis *a) {
  if (a->axis < 0 || a->axis >= m->n_axes || a->pre < 1 || a->size < 1) return false;
  int64_t n = m->size[a->axis];
  if (a->pre > n || a->size > n || n % (a->pre * a->size) != 0) return false;
  return a->size > 1 || n == 1;
}

static bool axis_whole(const nb_mesh *m, const nbi_axis *a) {
  return a->pre == 1 && a->size == m->size[a->axis];
}

/* Merges runs of sub-axes that are consecutive parts of one axis (x:(1)2 then
 * x:(2)2 is x:(1)4): both lay devices out the same way. */
static int merge_runs(nbi_axis *ax, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (k > 0 && ax[k - 1].axis == ax[i].axis && ax[k - 1].pre * ax[k - 1].size == ax[i].pre)
      ax[k - 1].size *= ax[i].size;
    else
      ax[k++] = ax[i];
  }
  return k;
}

static int axis_cmp(const void *pa, const void *pb) {
  const nbi_axis *a = pa, *b = pb;
  if (a->axis != b->axis) return a->axis < b->axis ? -1 : 1;
  if (a->pre != b->pre) return a->pre < b->pre ? -1 : 1;
  return a->size < b->size ? -1 : a->size > b->size;
}

/* A set of (sub-)axes in mesh order with consecutive parts merged. */
static int normalize_set(nbi_axis *ax, int n) {
  qsort(ax, (size_t)n, sizeof *ax, axis_cmp);
  return merge_runs(ax, n);
}

/* ---- text -------------------------------------------------------------------------- */

typedef struct text_buf {
  char *buf;
  size_t cap, len; /* len: what the whole text needs */
} text_buf;

static void put(text_buf *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text_buf *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *dst = t->len < t->cap ? t->buf + t->len : NULL;
  int k = vsnprintf(dst, dst ? t->cap - t->len : 0, fmt, ap);
  va_end(ap);
  if (k > 0) t->len += (size_t)k;
}

static void put_axis(text_buf *t, const nb_mesh *m, const nbi_axis *a) {
  if (a->axis < 0 || a->axis >= m->n_axes)
    put(t, "?%d", a->axis);
  else if (axis_whole(m, a))
    put(t, "%s", m->name[a->axis]);
  else
    put(t, "%s:(%lld)%lld", m->name[a->axis], (long long)a->pre, (long long)a->size);
}

static void put_set(text_buf *t, const nb_mesh *m, const char *what, const nbi_axis *ax, int n) {
  if (n <= 0) return;
  nbi_axis sorted[NBI_MESH_MAX_AXES];
  n = n > NBI_MESH_MAX_AXES ? NBI_MESH_MAX_AXES : n;
  memcpy(sorted, ax, (size_t)n * sizeof *ax);
  qsort(sorted, (size_t)n, sizeof *sorted, axis_cmp);
  put(t, " %s(", what);
  for (int i = 0; i < n; i++) {
    if (i) put(t, ", ");
    put_axis(t, m, &sorted[i]);
  }
  put(t, ")");
}

size_t nbi_sharding_format(const nb_mesh *m, const nbi_sharding *s, char *buf, size_t cap) {
  text_buf t = {buf, cap, 0};
  if (buf && cap) buf[0] = '\0';
  put(&t, "[");
  for (int d = 0; d < s->ndim && d < NB_MAX_DIMS; d++) {
    const nbi_dim_sharding *ds = &s->dim[d];
    if (d) put(&t, ", ");
    if (ds->n <= 0) put(&t, "_");
    if (ds->n > 1) put(&t, "(");
    for (int i = 0; i < ds->n && i < NBI_MESH_MAX_AXES; i++) {
      if (i) put(&t, ", ");
      put_axis(&t, m, &ds->ax[i]);
    }
    if (ds->n > 1) put(&t, ")");
    if (ds->open) put(&t, "?");
    if (ds->priority >= 0) put(&t, "@%d", ds->priority);
  }
  put(&t, "]");
  put_set(&t, m, "replicated", s->repl, s->n_repl);
  put_set(&t, m, "partial", s->partial, s->n_partial);
  return t.len;
}

/* ---- checks ---------------------------------------------------------------------------- */

/* Every (sub-)axis of s in one list: dimensions, then replicated, then partial. */
static int all_axes(const nbi_sharding *s, nbi_axis *out) {
  int k = 0;
  for (int d = 0; d < s->ndim; d++)
    for (int i = 0; i < s->dim[d].n; i++)
      out[k++] = s->dim[d].ax[i];
  for (int i = 0; i < s->n_repl; i++)
    out[k++] = s->repl[i];
  for (int i = 0; i < s->n_partial; i++)
    out[k++] = s->partial[i];
  return k;
}

/* No (sub-)axis of s used twice or overlapping another; the message quotes `quote`. */
static nb_status check_conflicts(const char *fn, const nb_mesh *m, const nbi_sharding *s,
                                 const char *quote) {
  nbi_axis ax[(NB_MAX_DIMS + 2) * NBI_MESH_MAX_AXES];
  int n = all_axes(s, ax);
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < i; j++) {
      if (!nbi_axis_overlap(&ax[i], &ax[j])) continue;
      char a[64], b[64];
      text_buf ta = {a, sizeof a, 0}, tb = {b, sizeof b, 0};
      put_axis(&ta, m, &ax[j]);
      put_axis(&tb, m, &ax[i]);
      if (nbi_axis_eq(&ax[i], &ax[j]))
        return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": axis %s used twice", fn, quote, a);
      return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": %s and %s overlap (both split axis %s)",
                       fn, quote, a, b, m->name[ax[i].axis]);
    }
  }
  return NB_OK;
}

nb_status nbi_sharding_check(const char *fn, const nb_mesh *m, const nbi_sharding *s) {
  if (!m || !s) return nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, m ? "sharding" : "mesh");
  if (s->ndim < 0 || s->ndim > NB_MAX_DIMS)
    return nbi_error(NB_ERR_SHARDING, "%s: sharding of rank %d (at most %d)", fn, s->ndim,
                     NB_MAX_DIMS);
  bool counts_ok = s->n_repl >= 0 && s->n_repl <= NBI_MESH_MAX_AXES && s->n_partial >= 0 &&
                   s->n_partial <= NBI_MESH_MAX_AXES;
  for (int d = 0; d < s->ndim; d++)
    counts_ok = counts_ok && s->dim[d].n >= 0 && s->dim[d].n <= NBI_MESH_MAX_AXES;
  if (!counts_ok)
    return nbi_error(NB_ERR_SHARDING,
                     "%s: sharding lists a negative number of axes or more than %d", fn,
                     NBI_MESH_MAX_AXES);
  char text[512];
  nbi_sharding_format(m, s, text, sizeof text);
  nbi_axis ax[(NB_MAX_DIMS + 2) * NBI_MESH_MAX_AXES];
  int n = all_axes(s, ax);
  for (int i = 0; i < n; i++) {
    if (axis_valid(m, &ax[i])) continue;
    if (ax[i].axis < 0 || ax[i].axis >= m->n_axes)
      return nbi_error(NB_ERR_SHARDING, "%s: \"%s\": axis index %d is not on mesh %s", fn, text,
                       ax[i].axis, m->text);
    return nbi_error(NB_ERR_SHARDING,
                     "%s: \"%s\": sub-axis (pre %lld, size %lld) does not split axis %s of size "
                     "%lld",
                     fn, text, (long long)ax[i].pre, (long long)ax[i].size, m->name[ax[i].axis],
                     (long long)m->size[ax[i].axis]);
  }
  return check_conflicts(fn, m, s, text);
}

/* ---- parsing ----------------------------------------------------------------------------- */

typedef struct parser {
  const char *fn, *spec, *p;
  const nb_mesh *m;
} parser;

static nb_status perr(parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static nb_status perr(parser *ps, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": %s", ps->fn, ps->spec, msg);
}

/* "column N" or "the end" for the parser's position. */
static const char *where(parser *ps, char *buf, size_t cap) {
  if (!*ps->p) return "the end";
  snprintf(buf, cap, "column %d", (int)(ps->p - ps->spec) + 1);
  return buf;
}

static nb_status expected(parser *ps, const char *what) {
  char b[32];
  return perr(ps, "expected %s at %s", what, where(ps, b, sizeof b));
}

static void skip_ws(parser *ps) {
  while (isspace((unsigned char)*ps->p))
    ps->p++;
}

static size_t ident_len(const char *p) {
  if (!isalpha((unsigned char)*p)) return 0;
  size_t n = 1;
  while (isalnum((unsigned char)p[n]) || p[n] == '_')
    n++;
  return n;
}

/* The modifier ("replicated" or "partial", then '(') starting at p: 1 / 2, else 0. */
static int modifier_at(const char *p) {
  size_t n = ident_len(p);
  int kind = n == 10 && !memcmp(p, "replicated", 10) ? 1
             : n == 7 && !memcmp(p, "partial", 7)    ? 2
                                                     : 0;
  if (!kind) return 0;
  p += n;
  while (isspace((unsigned char)*p))
    p++;
  return *p == '(' ? kind : 0;
}

/* A non-negative decimal number (at most 1e9). */
static nb_status parse_number(parser *ps, const char *what, int64_t *out) {
  skip_ws(ps);
  if (!isdigit((unsigned char)*ps->p)) return expected(ps, what);
  int64_t v = 0;
  while (isdigit((unsigned char)*ps->p)) {
    v = v * 10 + (*ps->p - '0');
    if (v > 1000000000) return perr(ps, "%s is too large", what);
    ps->p++;
  }
  *out = v;
  return NB_OK;
}

static nb_status expect_char(parser *ps, char c) {
  skip_ws(ps);
  if (*ps->p != c) {
    char what[8] = {'\'', c, '\'', '\0'};
    return expected(ps, what);
  }
  ps->p++;
  return NB_OK;
}

/* An axis name, or a sub-axis "name:(pre)size", checked against the mesh. */
static nb_status parse_axis(parser *ps, nbi_axis *out) {
  skip_ws(ps);
  const char *name = ps->p;
  size_t len = ident_len(name);
  if (!len) return expected(ps, "an axis name");
  ps->p += len;
  int i = nbi_mesh_axis(ps->m, name, len);
  if (i < 0) return perr(ps, "unknown axis %.*s (mesh %s)", (int)len, name, ps->m->text);
  *out = nbi_axis_whole(ps->m, i);
  skip_ws(ps);
  if (*ps->p != ':') return NB_OK;
  ps->p++;
  int64_t pre, size;
  nb_status st;
  if ((st = expect_char(ps, '(')) || (st = parse_number(ps, "a sub-axis pre-size", &pre)) ||
      (st = expect_char(ps, ')')) || (st = parse_number(ps, "a sub-axis size", &size)))
    return st;
  int64_t n = ps->m->size[i];
  if (pre < 1 || size < 1)
    return perr(ps, "sub-axis %.*s:(%lld)%lld: sizes are >= 1", (int)len, name, (long long)pre,
                (long long)size);
  if (size == 1)
    return perr(ps, "sub-axis %.*s:(%lld)1 has size 1 (use _ or leave it out)", (int)len, name,
                (long long)pre);
  if (pre > n || size > n || n % (pre * size) != 0)
    return perr(ps,
                "sub-axis %.*s:(%lld)%lld does not split axis %.*s of size %lld (%lld * %lld "
                "does not divide it)",
                (int)len, name, (long long)pre, (long long)size, (int)len, name, (long long)n,
                (long long)pre, (long long)size);
  out->pre = pre;
  out->size = size; /* pre 1, size n: the whole axis */
  return NB_OK;
}

/* One entry: '_', an axis, or '(' axes ')', then '?' and '@N' in any order. */
static nb_status parse_entry(parser *ps, nbi_dim_sharding *ds) {
  *ds = (nbi_dim_sharding){.priority = -1};
  nb_status st;
  skip_ws(ps);
  if (*ps->p == '_') {
    ps->p++;
  } else if (*ps->p == '(') {
    ps->p++;
    skip_ws(ps);
    if (*ps->p == ')') return perr(ps, "empty () (write _ for an unsharded dimension)");
    for (;;) {
      nbi_axis a;
      if ((st = parse_axis(ps, &a))) return st;
      if (ds->n == NBI_MESH_MAX_AXES)
        return perr(ps, "more than %d axes in one entry", NBI_MESH_MAX_AXES);
      ds->ax[ds->n++] = a;
      skip_ws(ps);
      if (*ps->p == ')') break;
      if (*ps->p != ',') return expected(ps, "',' or ')'");
      ps->p++;
    }
    ps->p++;
  } else if (ident_len(ps->p)) {
    if ((st = parse_axis(ps, &ds->ax[0]))) return st;
    ds->n = 1;
  } else {
    return expected(ps, "an axis name, '_' or '('");
  }
  bool seen_open = false, seen_priority = false;
  for (;;) {
    skip_ws(ps);
    if (*ps->p == '?') {
      if (seen_open) return perr(ps, "'?' given twice in one entry");
      seen_open = ds->open = true;
      ps->p++;
    } else if (*ps->p == '@') {
      if (seen_priority) return perr(ps, "'@' given twice in one entry");
      seen_priority = true;
      ps->p++;
      int64_t pr;
      if ((st = parse_number(ps, "a priority", &pr))) return st;
      ds->priority = (int)pr;
    } else {
      break;
    }
  }
  ds->n = merge_runs(ds->ax, ds->n);
  return NB_OK;
}

/* "replicated(a, b)" or "partial(a, b)" at ps->p (modifier_at said so). */
static nb_status parse_modifier(parser *ps, int kind, nbi_sharding *out, bool seen[3]) {
  const char *word = kind == 1 ? "replicated" : "partial";
  if (seen[kind]) return perr(ps, "%s() given twice", word);
  seen[kind] = true;
  ps->p += strlen(word);
  skip_ws(ps);
  ps->p++; /* '(' */
  int *n = kind == 1 ? &out->n_repl : &out->n_partial;
  nbi_axis *ax = kind == 1 ? out->repl : out->partial;
  skip_ws(ps);
  if (*ps->p == ')') return perr(ps, "%s() names no axes", word);
  for (;;) {
    nbi_axis a;
    nb_status st = parse_axis(ps, &a);
    if (st) return st;
    if (*n == NBI_MESH_MAX_AXES)
      return perr(ps, "more than %d axes in %s()", NBI_MESH_MAX_AXES, word);
    ax[(*n)++] = a;
    skip_ws(ps);
    if (*ps->p == ')') break;
    if (*ps->p != ',') return expected(ps, "',' or ')'");
    ps->p++;
  }
  ps->p++;
  return NB_OK;
}

nb_status nbi_sharding_parse(const char *fn, const nb_mesh *m, const char *spec, int ndim,
                             bool open_rest, nbi_sharding *out) {
  if (!m) return nbi_error(NB_ERR_NULL, "%s: mesh is NULL", fn);
  if (!spec) return nbi_error(NB_ERR_NULL, "%s: spec is NULL", fn);
  if (ndim < 0 || ndim > NB_MAX_DIMS)
    return nbi_error(NB_ERR_ARG, "%s: rank %d is out of range [0, %d]", fn, ndim, NB_MAX_DIMS);
  parser ps = {fn, spec, spec, m};
  nbi_sharding s = nbi_sharding_replicated(ndim);
  nb_status st;
  skip_ws(&ps);
  bool bracket = *ps.p == '[';
  if (bracket) ps.p++;
  int n_entries = 0;
  skip_ws(&ps);
  /* entries: none when the text ends, closes or starts with a modifier */
  if (*ps.p && !(bracket && *ps.p == ']') && !(!bracket && modifier_at(ps.p))) {
    for (;;) {
      nbi_dim_sharding ds;
      if ((st = parse_entry(&ps, &ds))) return st;
      if (n_entries < ndim) s.dim[n_entries] = ds;
      n_entries++;
      skip_ws(&ps);
      if (*ps.p != ',') break;
      ps.p++;
    }
  }
  if (bracket && (st = expect_char(&ps, ']'))) return st;
  bool seen[3] = {false, false, false};
  for (;;) {
    skip_ws(&ps);
    if (!*ps.p) break;
    int kind = modifier_at(ps.p);
    if (!kind)
      return expected(&ps, n_entries && !bracket ? "',', replicated(...), partial(...) or the end"
                                                 : "replicated(...), partial(...) or the end");
    if ((st = parse_modifier(&ps, kind, &s, seen))) return st;
  }
  if (n_entries > ndim) return perr(&ps, "%d entries for a %d-d tensor", n_entries, ndim);
  for (int d = n_entries; d < ndim; d++)
    s.dim[d].open = open_rest;
  if ((st = check_conflicts(fn, m, &s, spec))) return st;
  s.n_repl = normalize_set(s.repl, s.n_repl);
  s.n_partial = normalize_set(s.partial, s.n_partial);
  *out = s;
  return NB_OK;
}

/* ---- layouts ------------------------------------------------------------------------------ */

nbi_sharding nbi_sharding_replicated(int ndim) {
  nbi_sharding s;
  memset(&s, 0, sizeof s);
  s.ndim = ndim;
  for (int d = 0; d < NB_MAX_DIMS; d++)
    s.dim[d].priority = -1;
  return s;
}

uint32_t nbi_sharding_axes(const nbi_sharding *s, bool partial_too) {
  uint32_t v = 0;
  for (int k = 0; k < s->ndim; k++)
    for (int i = 0; i < s->dim[k].n; i++)
      v |= 1u << s->dim[k].ax[i].axis;
  for (int i = 0; partial_too && i < s->n_partial; i++)
    v |= 1u << s->partial[i].axis;
  return v;
}

nbi_sharding nbi_sharding_batched(const nbi_sharding *s) {
  nbi_sharding b = *s;
  int n = s->ndim < NB_MAX_DIMS ? s->ndim : NB_MAX_DIMS - 1;
  b.ndim = n + 1;
  memset(&b.dim[0], 0, sizeof b.dim[0]);
  b.dim[0].priority = -1;
  memcpy(&b.dim[1], &s->dim[0], sizeof s->dim[0] * (size_t)n);
  return b;
}

static bool lists_eq(const nbi_axis *a, int na, const nbi_axis *b, int nb) {
  if (na != nb) return false;
  for (int i = 0; i < na; i++)
    if (!nbi_axis_eq(&a[i], &b[i])) return false;
  return true;
}

bool nbi_sharding_eq(const nbi_sharding *a, const nbi_sharding *b) {
  if (a->ndim != b->ndim) return false;
  nbi_axis x[NBI_MESH_MAX_AXES], y[NBI_MESH_MAX_AXES];
  for (int d = 0; d < a->ndim; d++) {
    memcpy(x, a->dim[d].ax, (size_t)a->dim[d].n * sizeof *x);
    memcpy(y, b->dim[d].ax, (size_t)b->dim[d].n * sizeof *y);
    if (!lists_eq(x, merge_runs(x, a->dim[d].n), y, merge_runs(y, b->dim[d].n))) return false;
  }
  memcpy(x, a->partial, (size_t)a->n_partial * sizeof *x);
  memcpy(y, b->partial, (size_t)b->n_partial * sizeof *y);
  return lists_eq(x, normalize_set(x, a->n_partial), y, normalize_set(y, b->n_partial));
}

int64_t nbi_dim_shards(const nbi_sharding *s, int d) {
  int64_t n = 1;
  for (int i = 0; i < s->dim[d].n; i++)
    n *= s->dim[d].ax[i].size;
  return n;
}

int64_t nbi_dim_index(const nb_mesh *m, const nbi_sharding *s, int d, int dev) {
  int64_t idx = 0;
  for (int i = 0; i < s->dim[d].n; i++)
    idx = idx * s->dim[d].ax[i].size + nbi_axis_coord(m, &s->dim[d].ax[i], dev);
  return idx;
}

void nbi_local_block(const nb_mesh *m, const nbi_sharding *s, const nb_shape *logical, int dev,
                     nb_shape *local, int64_t *start) {
  local->ndim = logical->ndim;
  for (int d = 0; d < logical->ndim; d++) {
    int64_t n = logical->dims[d], shards = nbi_dim_shards(s, d);
    int64_t chunk = (n + shards - 1) / shards, i = nbi_dim_index(m, s, d, dev);
    int64_t lo = i * chunk < n ? i * chunk : n, hi = (i + 1) * chunk < n ? (i + 1) * chunk : n;
    local->dims[d] = hi - lo;
    if (start) start[d] = lo;
  }
}
