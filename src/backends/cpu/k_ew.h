/* src/backends/cpu/k_ew.h — the machinery the CPU's elementwise executors
 * share: the single-op kernels (k_elementwise.c) and the fused-group executors
 * (k_fused.c). Domains and dtype conversions, the row-function tables, chunk
 * operands, and walks (units of elements over an nbi_iter, streaming stores).
 * Internal to src/backends/cpu.
 *
 * Every function here is static to each file that includes it, with no inline
 * hint (EW_STATIC), except the walk's per-unit steps and setup (EW_OUTLINE:
 * never inlined). Each file now calls those from one place only, so the
 * compiler would inline them into the unit loops; it did not when one file
 * held both executors, and the inlined loop ran the 5-op f32 chain of
 * bench_bandwidth 1.4x slower on one thread (the row functions' loads
 * stalled), so they keep the shape they had. */
#ifndef NABLA_K_EW_H
#define NABLA_K_EW_H

#include "cpu.h"
#include "../../core/oprules.h"

#include <math.h>
#include <omp.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "vmath.h"

#define EW_STATIC static __attribute__((unused))
#define EW_OUTLINE static __attribute__((unused, noinline))

/* ---- domains and conversions ---------------------------------------------------- */
typedef enum domain { DOM_F32, DOM_F64, DOM_I64, DOM_COUNT } domain;

EW_STATIC const nb_dtype domain_dtype[DOM_COUNT] = {NB_F32, NB_F64, NB_I64};

EW_STATIC domain domain_of(nb_dtype dt) {
  if (dt == NB_F64) return DOM_F64;
  return nb_dtype_is_float(dt) ? DOM_F32 : DOM_I64;
}

/* Float -> integer: truncation toward zero, saturating, NaN -> 0 (u8, i8,
 * i16: saturating to i64, then wrapping, as PyTorch's casts on x86). */
EW_STATIC int32_t sat_i32(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return INT32_MAX;
  if (v <= -2147483648.0) return INT32_MIN;
  return (int32_t)v;
}
EW_STATIC int64_t sat_i64(double v) {
  if (v != v) return 0;
  if (v >= 9223372036854775807.0) return INT64_MAX; /* the literal is 2^63 */
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

/* The f32 nearest x by round-to-odd: x itself when representable, else its
 * neighbour toward zero with the last mantissa bit set. Rounding that to f16 or
 * bf16 (nearest even) equals rounding x directly, which a plain (float) step
 * would not guarantee (double rounding). */
EW_STATIC float f64_to_f32_odd(double x) {
  float f = (float)x;
  if ((double)f == x || isnan(f) || isinf(f)) return f;
  if (fabs((double)f) > fabs(x)) f = nextafterf(f, 0.0f);
  uint32_t u;
  memcpy(&u, &f, 4);
  u |= 1;
  memcpy(&f, &u, 4);
  return f;
}

/* The same for a 64-bit integer, done on the integer: keep the top 24
 * significant bits, fold the rest into a sticky last bit. */
EW_STATIC float i64_to_f32_odd(int64_t v) {
  uint64_t m = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  int sh = m >> 24 ? 40 - __builtin_clzll(m) : 0; /* bits beyond 24 significant */
  if (sh > 0) {
    uint64_t lost = m & ((1ull << sh) - 1);
    m = (m >> sh) | (lost != 0);
  }
  float f = (float)m * (float)(1ull << sh); /* both exact */
  return v < 0 ? -f : f;
}

/* d[j] = src[j * s] converted to the domain's type, j < n; s may be any stride. */
#define GATHER(TYPE, EXPR)                                                                         \
  {                                                                                                \
    const TYPE *p = (const TYPE *)src;                                                             \
    for (int64_t j = 0; j < n; j++) {                                                              \
      TYPE v = p[j * s];                                                                           \
      d[j] = EXPR;                                                                                 \
    }                                                                                              \
  }                                                                                                \
  break;

EW_STATIC void load_f32(float *restrict d, const char *src, nb_dtype dt, int64_t s, int64_t n) {
  switch (dt) {
  case NB_F32: GATHER(float, v)
  case NB_F64: GATHER(double, (float)v)
  case NB_F16: GATHER(uint16_t, nbi_f16_to_f32(v))
  case NB_BF16: GATHER(uint16_t, nbi_bf16_to_f32(v))
  case NB_I32: GATHER(int32_t, (float)v)
  case NB_I64: GATHER(int64_t, (float)v)
  case NB_U8: GATHER(uint8_t, (float)v)
  case NB_I8: GATHER(int8_t, (float)v)
  case NB_I16: GATHER(int16_t, (float)v)
  default: GATHER(uint8_t, (float)(v != 0)) /* bool */
  }
}

EW_STATIC void load_f64(double *restrict d, const char *src, nb_dtype dt, int64_t s, int64_t n) {
  switch (dt) {
  case NB_F32: GATHER(float, v)
  case NB_F64: GATHER(double, v)
  case NB_F16: GATHER(uint16_t, nbi_f16_to_f32(v))
  case NB_BF16: GATHER(uint16_t, nbi_bf16_to_f32(v))
  case NB_I32: GATHER(int32_t, v)
  case NB_I64: GATHER(int64_t, (double)v)
  case NB_U8: GATHER(uint8_t, v)
  case NB_I8: GATHER(int8_t, v)
  case NB_I16: GATHER(int16_t, v)
  default: GATHER(uint8_t, v != 0) /* bool */
  }
}

EW_STATIC void load_i64(int64_t *restrict d, const char *src, nb_dtype dt, int64_t s, int64_t n) {
  switch (dt) {
  case NB_I32: GATHER(int32_t, v)
  case NB_I64: GATHER(int64_t, v)
  case NB_BOOL: GATHER(uint8_t, v != 0)
  case NB_U8: GATHER(uint8_t, v)
  case NB_I8: GATHER(int8_t, v)
  case NB_I16: GATHER(int16_t, v)
  default: /* float dtypes: truncation toward zero, saturating */
    for (int64_t j = 0; j < n; j++)
      d[j] = sat_i64(nbi_load_f64(src, dt, j * s));
    break;
  }
}
#undef GATHER

EW_STATIC void load(domain dom, void *d, const char *src, nb_dtype dt, int64_t s, int64_t n) {
  switch (dom) {
  case DOM_F32: load_f32(d, src, dt, s, n); break;
  case DOM_F64: load_f64(d, src, dt, s, n); break;
  default: load_i64(d, src, dt, s, n); break;
  }
}

/* dst[j] = x[j] converted to dt, both contiguous, j < n. */
#define SCATTER(TYPE, EXPR)                                                                        \
  {                                                                                                \
    TYPE *p = (TYPE *)dst;                                                                         \
    for (int64_t j = 0; j < n; j++) {                                                              \
      p[j] = EXPR;                                                                                 \
    }                                                                                              \
  }                                                                                                \
  break;

EW_STATIC void store_f32(char *dst, nb_dtype dt, const float *restrict x, int64_t n) {
  switch (dt) {
  case NB_F32: SCATTER(float, x[j])
  case NB_F64: SCATTER(double, x[j])
  case NB_F16: SCATTER(uint16_t, nbi_f32_to_f16(x[j]))
  case NB_BF16: SCATTER(uint16_t, nbi_f32_to_bf16(x[j]))
  case NB_I32: SCATTER(int32_t, sat_i32(x[j]))
  case NB_I64: SCATTER(int64_t, sat_i64(x[j]))
  case NB_U8: SCATTER(uint8_t, (uint8_t)(uint64_t)sat_i64(x[j]))
  case NB_I8: SCATTER(int8_t, (int8_t)(uint8_t)(uint64_t)sat_i64(x[j]))
  case NB_I16: SCATTER(int16_t, (int16_t)(uint16_t)(uint64_t)sat_i64(x[j]))
  default: SCATTER(uint8_t, x[j] != 0) /* bool */
  }
}

EW_STATIC void store_f64(char *dst, nb_dtype dt, const double *restrict x, int64_t n) {
  switch (dt) {
  case NB_F32: SCATTER(float, (float)x[j])
  case NB_F64: SCATTER(double, x[j])
  case NB_F16: SCATTER(uint16_t, nbi_f32_to_f16(f64_to_f32_odd(x[j])))
  case NB_BF16: SCATTER(uint16_t, nbi_f32_to_bf16(f64_to_f32_odd(x[j])))
  case NB_I32: SCATTER(int32_t, sat_i32(x[j]))
  case NB_I64: SCATTER(int64_t, sat_i64(x[j]))
  case NB_U8: SCATTER(uint8_t, (uint8_t)(uint64_t)sat_i64(x[j]))
  case NB_I8: SCATTER(int8_t, (int8_t)(uint8_t)(uint64_t)sat_i64(x[j]))
  case NB_I16: SCATTER(int16_t, (int16_t)(uint16_t)(uint64_t)sat_i64(x[j]))
  default: SCATTER(uint8_t, x[j] != 0) /* bool */
  }
}

/* Integers narrow by wrapping (two's complement), as NumPy and JAX. */
EW_STATIC void store_i64(char *dst, nb_dtype dt, const int64_t *restrict x, int64_t n) {
  switch (dt) {
  case NB_F32: SCATTER(float, (float)x[j])
  case NB_F64: SCATTER(double, (double)x[j])
  case NB_F16: SCATTER(uint16_t, nbi_f32_to_f16(i64_to_f32_odd(x[j])))
  case NB_BF16: SCATTER(uint16_t, nbi_f32_to_bf16(i64_to_f32_odd(x[j])))
  case NB_I32: SCATTER(int32_t, (int32_t)(uint32_t)(uint64_t)x[j])
  case NB_I64: SCATTER(int64_t, x[j])
  case NB_U8: SCATTER(uint8_t, (uint8_t)(uint64_t)x[j])
  case NB_I8: SCATTER(int8_t, (int8_t)(uint8_t)(uint64_t)x[j])
  case NB_I16: SCATTER(int16_t, (int16_t)(uint16_t)(uint64_t)x[j])
  default: SCATTER(uint8_t, x[j] != 0) /* bool */
  }
}
#undef SCATTER

EW_STATIC void store(domain dom, char *dst, nb_dtype dt, const void *x, int64_t n) {
  switch (dom) {
  case DOM_F32: store_f32(dst, dt, x, n); break;
  case DOM_F64: store_f64(dst, dt, x, n); break;
  default: store_i64(dst, dt, x, n); break;
  }
}

/* ---- row functions (k_elementwise.c): see there for their contract --------------- */
typedef void (*unary_row)(void *restrict o, const void *restrict a, int64_t sa, int64_t n);
typedef void (*binary_row)(void *restrict o, const void *restrict a, int64_t sa,
                           const void *restrict b, int64_t sb, int64_t n);
typedef void (*where_row)(void *restrict o, const uint8_t *restrict c, int64_t sc,
                          const void *restrict a, int64_t sa, const void *restrict b, int64_t sb,
                          int64_t n);

/* The row functions of one ISA, indexed [domain][op] (NULL: none); where by
 * domain. nbi_ew_rows_by_isa[nbi_isa_active()] is the active ISA's table;
 * every ISA has the same ops, so the portable table answers which ops have a
 * row function. */
typedef struct ew_rows {
  unary_row un[DOM_COUNT][NBI_OP_COUNT];
  binary_row bin[DOM_COUNT][NBI_OP_COUNT];
  where_row where[DOM_COUNT];
} ew_rows;
extern const ew_rows nbi_ew_rows_by_isa[NBI_ISA_COUNT];
/* Ops whose row function writes bool directly (comparisons, logical ops). */
extern const bool nbi_ew_is_pred[NBI_OP_COUNT];

/* ---- driver ---------------------------------------------------------------------------- */
enum { CHUNK = 512, FUSE_CHUNK = 256 };
_Static_assert(FUSE_CHUNK <= CHUNK, "a fused unit fits a chunk buffer");

/* What one kernel call does, shared read-only by the threads. */
typedef struct ew_plan {
  int n_in; /* 1, 2, or 3 (where) */
  bool is_where, is_cast;
  nb_dtype cdt;    /* compute dtype */
  domain dom;      /* its domain */
  int64_t des;     /* the domain's element size (walks) */
  bool direct_out; /* the row function writes out itself */
  nb_dtype out_dt;
  unary_row un; /* the active ISA's row function, looked up once per call */
  binary_row bin;
  where_row where;
} ew_plan;

typedef union chunk_buf {
  float f[CHUNK];
  double d[CHUNK];
  int64_t i[CHUNK];
} chunk_buf;

/* d[0..n) = src[j * s] converted to the domain's type. An integer operand of an
 * f16/bf16 computation is first rounded to that dtype, as if cast to it. */
EW_STATIC void convert(const ew_plan *pl, void *d, const char *src, nb_dtype dt, int64_t s,
                       int64_t n) {
  if (pl->dom == DOM_F32 && dt != pl->cdt && pl->cdt != NB_F32) {
    int64_t wide[CHUNK];
    uint16_t half[CHUNK];
    load_i64(wide, src, dt, s, n);
    store_i64((char *)half, pl->cdt, wide, n);
    load_f32(d, (const char *)half, pl->cdt, 1, n);
  } else {
    load(pl->dom, d, src, dt, s, n);
  }
}

/* Points *p at operand values in the domain's type: in place when src already
 * has that type and stride 0 or 1, else converted into buf (one value for a
 * broadcast operand). Returns the stride of *p (0 or 1). */
EW_STATIC int64_t operand(const ew_plan *pl, const char *src, nb_dtype dt, int64_t s, int64_t n,
                          void *buf, const void **p) {
  if (dt == domain_dtype[pl->dom] && (s == 0 || s == 1)) {
    *p = src;
    return s;
  }
  convert(pl, buf, src, dt, s, s == 0 ? 1 : n);
  *p = buf;
  return s == 0 ? 0 : 1;
}

/* ---- walks -------------------------------------------------------------------------------
 * Both executors cut an nbi_iter's rows (n elements each) into units of at most
 * `chunk` elements: pieces of one row when n >= chunk, else blocks of chunk / n
 * whole rows (one row per unit when an output is not flat), so the row
 * functions run on a chunk's worth of elements however short the rows. Over a
 * block, a flat operand (nbi_iter_flat) is one run read in place; any other is
 * gathered row by row into a buffer. Outputs have stride 1 along the row. Each
 * thread takes one contiguous range of units and steps through it with
 * nbi_iter_next (one division per dim per range, not per unit). */
typedef struct ew_walk {
  _Alignas(64) nbi_iter it; /* own cache lines: the threads only read them */
  int64_t rows, n, chunk;
  int64_t b;       /* rows per unit: > 1 for blocks */
  int64_t per_row; /* units per row: > 1 for pieces */
  int64_t units;
  char *base[NBI_ITER_MAX_OPS];
  nb_dtype dt[NBI_ITER_MAX_OPS];
  int64_t es[NBI_ITER_MAX_OPS]; /* element size */
  int64_t s[NBI_ITER_MAX_OPS];  /* stride along the row */
  bool flat[NBI_ITER_MAX_OPS];
  bool same_row[NBI_ITER_MAX_OPS]; /* every row is row 0 (a broadcast row) */
  bool stream;                     /* outputs go out by stream_out */
} ew_walk;

/* Outputs of STREAM_MIN bytes or more (per call, all together; far beyond the
 * L2s) that the row functions write in the domain's type are computed into
 * scratch and copied out with streaming stores. Regular stores to such an
 * output miss the caches, and as stores retire in order, the scratch stores
 * of the next members queue behind them until the store buffer fills and the
 * row functions stall (measured: a 5-op f32 chain ran at 0.5x a STREAM triad;
 * streamed, above 0.8x). Streamed lines need no read for ownership either. */
enum { STREAM_MIN = 16 << 20 };

EW_STATIC void stream_out(char *restrict d, const char *restrict src, int64_t bytes) {
#if defined(__SSE2__)
  int64_t j = (int64_t)(-(uintptr_t)d & 15); /* to a 16-byte boundary */
  j = j < bytes ? j : bytes;
  memcpy(d, src, (size_t)j);
  for (; j + 16 <= bytes; j += 16)
    _mm_stream_si128((__m128i *)(d + j), _mm_loadu_si128((const __m128i *)(src + j)));
  memcpy(d + j, src + j, (size_t)(bytes - j));
#else
  memcpy(d, src, (size_t)bytes);
#endif
}

/* After a thread's streamed stores (if stream): orders them before what
 * follows (the region's end, where other threads may read them). */
EW_STATIC void stream_end(bool stream) {
#if defined(__SSE2__)
  if (stream) _mm_sfence();
#else
  (void)stream;
#endif
}

/* views[0..n_out) are the outputs. */
EW_OUTLINE void walk_init(ew_walk *w, int n_ops, const nbi_view *const *views, int n_out,
                          int64_t chunk) {
  nbi_iter_init(&w->it, n_ops, views);
  int last = w->it.ndim - 1;
  w->rows = nbi_iter_rows(&w->it);
  w->n = w->it.dims[last];
  w->chunk = chunk;
  bool block = w->n < chunk;
  int64_t out_bytes = 0;
  for (int q = 0; q < n_ops; q++) {
    w->base[q] = views[q]->data;
    w->dt[q] = views[q]->dtype;
    w->es[q] = (int64_t)nb_dtype_size(w->dt[q]);
    w->s[q] = w->it.strides[q][last];
    w->flat[q] = nbi_iter_flat(&w->it, q);
    w->same_row[q] = true;
    for (int d = 0; d < last; d++)
      w->same_row[q] = w->same_row[q] && w->it.strides[q][d] == 0;
    if (q < n_out && !w->flat[q]) block = false;
    if (q < n_out) out_bytes += w->es[q];
  }
  w->stream = w->rows * w->n * out_bytes >= STREAM_MIN;
  w->b = block && w->n > 0 ? chunk / w->n : 1;
  w->per_row = w->n > chunk ? (w->n + chunk - 1) / chunk : 1;
  w->units = (w->rows + w->b - 1) / w->b * w->per_row;
}

/* A unit of a walk: nr rows from row r (at pos), or piece c of row r. */
typedef struct ew_unit {
  nbi_iter_pos pos;
  int64_t r, c;
  int64_t nr, j0, len; /* rows, first element in the row, elements */
} ew_unit;

EW_STATIC void unit_set(const ew_walk *w, ew_unit *u) {
  u->nr = w->rows - u->r < w->b ? w->rows - u->r : w->b;
  u->j0 = u->c * w->chunk;
  u->len = w->b > 1 ? u->nr * w->n : (w->n - u->j0 < w->chunk ? w->n - u->j0 : w->chunk);
}

EW_STATIC void unit_seek(const ew_walk *w, ew_unit *u, int64_t k) {
  u->r = k / w->per_row * w->b;
  u->c = k % w->per_row;
  nbi_iter_seek(&w->it, u->r, &u->pos);
  unit_set(w, u);
}

EW_OUTLINE void unit_next(const ew_walk *w, ew_unit *u) {
  if (++u->c == w->per_row) {
    u->c = 0;
    int d = w->it.ndim - 2;                                /* the rows' innermost dim */
    if (d >= 0 && u->pos.idx[d] + u->nr < w->it.dims[d]) { /* no carry */
      u->pos.idx[d] += u->nr;
      for (int q = 0; q < w->it.n_ops; q++)
        u->pos.off[q] += u->nr * w->it.strides[q][d];
    } else {
      for (int64_t i = 0; i < u->nr; i++)
        nbi_iter_next(&w->it, &u->pos);
    }
    u->r += u->nr;
  }
  unit_set(w, u);
}

/* Operand q's first element in unit u. */
static inline char *unit_at(const ew_walk *w, const ew_unit *u, int q) {
  return w->base[q] + (u->pos.off[q] + u->j0 * w->s[q]) * w->es[q];
}

/* d[0..n) = src[j * s]: converted to the domain's type, or bytes as they are
 * (cond: a where's bool condition). */
EW_STATIC void fetch(const ew_plan *pl, bool cond, void *d, const char *src, nb_dtype dt, int64_t s,
                     int64_t n) {
  if (!cond) {
    convert(pl, d, src, dt, s, n);
    return;
  }
  for (int64_t j = 0; j < n; j++)
    ((uint8_t *)d)[j] = (uint8_t)src[j * s];
}

/* Operand q of unit u for a row function, as operand() gives it (cond: read
 * as bytes). A non-flat operand of a block is gathered into buf row by row (a
 * broadcast row: once, then copied). Returns the stride of *p (0 or 1). */
EW_OUTLINE int64_t unit_operand(const ew_plan *pl, const ew_walk *w, const ew_unit *u, int q,
                                bool cond, void *buf, const void **p) {
  int64_t s = w->s[q], n = w->n;
  const char *src = unit_at(w, u, q);
  *p = buf;
  if (u->nr == 1 || w->flat[q]) {
    if (!cond) return operand(pl, src, w->dt[q], s, u->len, buf, p);
    if (s == 0 || s == 1) {
      *p = src;
      return s;
    }
    fetch(pl, true, buf, src, w->dt[q], s, u->len);
    return 1;
  }
  int64_t row = n * (cond ? 1 : pl->des); /* bytes */
  if (w->same_row[q]) {
    fetch(pl, cond, buf, src, w->dt[q], s, n);
    for (int64_t i = 1; i < u->nr; i *= 2)
      memcpy((char *)buf + i * row, buf, (size_t)((i < u->nr - i ? i : u->nr - i) * row));
    return 1;
  }
  nbi_iter_pos pos = u->pos;
  for (int64_t i = 0; i < u->nr; i++) {
    fetch(pl, cond, (char *)buf + i * row, w->base[q] + pos.off[q] * w->es[q], w->dt[q], s, n);
    nbi_iter_next(&w->it, &pos);
  }
  return 1;
}

/* Runs BODY for units [u0, u1) of w, the unit in U: a thread's part. */
#define WALK_RANGE(w, u0, u1, U, BODY)                                                             \
  do {                                                                                             \
    ew_unit U;                                                                                     \
    for (int64_t k_ = (u0); k_ < (u1); k_++) {                                                     \
      if (k_ == (u0))                                                                              \
        unit_seek((w), &U, k_);                                                                    \
      else                                                                                         \
        unit_next((w), &U);                                                                        \
      BODY;                                                                                        \
    }                                                                                              \
  } while (0)

/* This thread's share [*u0, *u1) of units, contiguous. */
EW_STATIC void thread_range(int64_t units, int64_t *u0, int64_t *u1) {
  int t = omp_get_thread_num(), nt = omp_get_num_threads();
  *u0 = units * t / nt;
  *u1 = units * (t + 1) / nt;
}

#endif
