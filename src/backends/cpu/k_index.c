/* src/backends/cpu/k_index.c — CPU kernels of the indexing family: gathers
 * (take, take_along_axis), their transposes (scatter_add, scatter_add along an
 * axis) and one_hot. Indices are validated in one pass before any data moves,
 * so a kernel either fails with NB_ERR_INDEX or writes every element. */
#include "k_index.h"

#include <stdlib.h>

#include "../../ops/index.h" /* the attribute slots: axis, caller */

/* Element off (in elements) of an integer index array. */
static inline int64_t index_at(const char *base, nb_dtype dt, int64_t off) {
  switch (dt) {
  case NB_I32: return ((const int32_t *)base)[off];
  case NB_I64: return ((const int64_t *)base)[off];
  default: return nbi_load_i64(base, dt, off); /* u8, i8, i16 */
  }
}

/* Checks that every index of idx lies in [-size, size) ([0, size) for the
 * composites whose indices count from 0: index.h); otherwise records
 * NB_ERR_INDEX naming the public function (fn, the op's own, or node n's
 * caller), the first offending extreme, the axis and its size. */
static nb_status check_indices(const nb_tensor *n, const char *fn, const nbi_view *idx,
                               int64_t size, int axis) {
  nbi_iter it;
  nbi_iter_init(&it, 1, (const nbi_view *[]){idx});
  int64_t rows = nbi_iter_rows(&it), m = it.dims[it.ndim - 1], s = it.strides[0][it.ndim - 1];
  int64_t lo = INT64_MAX, hi = INT64_MIN;
#pragma omp parallel for reduction(min                                                             \
                                   : lo) reduction(max                                             \
                                                   : hi) if (rows * m >= NBI_PAR_MIN && rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    int64_t off;
    nbi_iter_row(&it, r, &off);
    for (int64_t j = 0; j < m; j++) {
      int64_t v = index_at(idx->data, idx->dtype, off + j * s);
      lo = v < lo ? v : lo;
      hi = v > hi ? v : hi;
    }
  }
  int64_t low = nbi_index_low(n->attrs.i[NBI_INDEX_CALLER], size);
  if (rows * m == 0 || (lo >= low && hi < size)) return NB_OK;
  return nbi_index_range_error(n, fn, hi >= size ? hi : lo, axis, size);
}

/* Reads idx (valid for size) in row-major order into a fresh array of
 * normalized (non-negative) indices; NULL + NB_ERR_OOM on failure. */
static int64_t *normalized_indices(const char *fn, const nbi_view *idx, int64_t size, int64_t k) {
  int64_t *ix = malloc((size_t)(k ? k : 1) * sizeof *ix);
  if (!ix) {
    nbi_error(NB_ERR_OOM, "%s: out of memory for %lld indices", fn, (long long)k);
    return NULL;
  }
  nbi_iter it;
  nbi_iter_init(&it, 1, (const nbi_view *[]){idx});
  int64_t rows = nbi_iter_rows(&it), m = it.dims[it.ndim - 1], s = it.strides[0][it.ndim - 1];
  for (int64_t r = 0; r < rows; r++) {
    int64_t off;
    nbi_iter_row(&it, r, &off);
    for (int64_t j = 0; j < m; j++) {
      int64_t v = index_at(idx->data, idx->dtype, off + j * s);
      ix[r * m + j] = v < 0 ? v + size : v;
    }
  }
  return ix;
}

/* Copies one element of es (1, 2, 4 or 8) bytes; constant-size memcpy
 * compiles to a single load and store. */
static inline void copy_elem(char *dst, const char *src, size_t es) {
  switch (es) {
  case 1: *dst = *src; break;
  case 2: memcpy(dst, src, 2); break;
  case 4: memcpy(dst, src, 4); break;
  default: memcpy(dst, src, 8); break;
  }
}

static int64_t view_numel(const nbi_view *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++)
    n *= v->dims[d];
  return n;
}

/* Offset (elements) of row o of the dims [0, axis) of v, o in row-major order. */
static int64_t outer_offset(const nbi_view *v, int axis, int64_t o) {
  int64_t off = 0;
  for (int d = axis - 1; d >= 0; d--) {
    off += o % v->dims[d] * v->strides[d];
    o /= v->dims[d];
  }
  return off;
}

/* take: in[0] is t (any strides), in[1] is idx (K elements, any shape and
 * strides); out is t.shape[:axis] + idx.shape + t.shape[axis+1:], contiguous,
 * seen as (outer, K, inner). out[o, k, :] = t[o, idx[k], :]. attrs.i[0] = axis. */
nb_status nbi_cpu_take(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  int axis = (int)n->attrs.i[0];
  const nbi_view *t = &in[0];
  int64_t size = t->dims[axis];
  nb_status st = check_indices(n, "nb_take", &in[1], size, axis);
  if (st) return st;
  int64_t outer = 1, k = view_numel(&in[1]);
  for (int d = 0; d < axis; d++)
    outer *= t->dims[d];
  nbi_view blk = {.dtype = t->dtype, .ndim = t->ndim - axis - 1}; /* t[o, i, :] */
  memcpy(blk.dims, t->dims + axis + 1, sizeof(int64_t) * (size_t)blk.ndim);
  memcpy(blk.strides, t->strides + axis + 1, sizeof(int64_t) * (size_t)blk.ndim);
  int64_t inner = view_numel(&blk);
  if (outer * k * inner == 0) return NB_OK;
  int64_t *ix = normalized_indices("nb_take", &in[1], size, k);
  if (!ix) return NB_ERR_OOM;
  size_t es = nb_dtype_size(t->dtype);
  bool contiguous = nbi_view_is_contiguous(&blk);
  nbi_view dblk = blk; /* the matching contiguous block of out */
  int64_t st_in = 1;
  for (int d = dblk.ndim - 1; d >= 0; d--) {
    dblk.strides[d] = st_in;
    st_in *= dblk.dims[d];
  }
#pragma omp parallel for schedule(static) if (outer * k * inner >= NBI_PAR_MIN)
  for (int64_t b = 0; b < outer * k; b++) {
    int64_t off = outer_offset(t, axis, b / k) + ix[b % k] * t->strides[axis];
    char *dst = out->data + b * inner * (int64_t)es;
    const char *src = t->data + off * (int64_t)es;
    if (inner == 1) {
      copy_elem(dst, src, es);
    } else if (contiguous) {
      memcpy(dst, src, (size_t)inner * es);
    } else {
      nbi_view s = blk, d = dblk;
      s.data = (char *)src;
      d.data = dst;
      nbi_copy_view(&d, &s);
    }
  }
  free(ix);
  return NB_OK;
}

/* One row of take_along_axis: m elements of size es; out at o (stride so),
 * indices at i (stride si), t at tb (stride st) plus index * ax elements. */
static void gather_row(char *o, int64_t so, const char *i, nb_dtype idt, int64_t si, const char *tb,
                       int64_t st, int64_t ax, int64_t size, size_t es, int64_t m) {
  for (int64_t j = 0; j < m; j++) {
    int64_t v = index_at(i, idt, j * si);
    v = v < 0 ? v + size : v;
    copy_elem(o + j * so * (int64_t)es, tb + (j * st + v * ax) * (int64_t)es, es);
  }
}

/* The view of t that, iterated over shape o (t's rank), gives the element
 * of t at index 0 along axis: dims of t with extent 1 broadcast (stride 0),
 * and axis has stride 0 (the index adds idx * t.strides[axis] per element). */
static nbi_view along_axis_base(const nbi_view *t, const nb_shape *o, int axis) {
  nbi_view b = *t;
  for (int d = 0; d < t->ndim; d++) {
    b.dims[d] = o->dims[d];
    if (d == axis || t->dims[d] != o->dims[d]) b.strides[d] = 0;
  }
  return b;
}

/* take_along_axis: in[0] is t, in[1] is idx, both of rank R with any strides;
 * out (contiguous) has shape O: idx's extent along axis, t's and idx's dims
 * broadcast elsewhere. out[i] = t[i with i[axis] = idx[i]], where t's and
 * idx's size-1 dims broadcast. attrs.i[0] = axis. */
nb_status nbi_cpu_take_along_axis(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  int axis = (int)n->attrs.i[0];
  const nbi_view *t = &in[0];
  int64_t size = t->dims[axis], ax = t->strides[axis];
  nb_status st = check_indices(n, "nb_take_along_axis", &in[1], size, axis);
  if (st) return st;
  nbi_view tb = along_axis_base(t, &n->shape, axis), ib = nbi_view_broadcast(&in[1], &n->shape);
  nbi_iter it;
  nbi_iter_init(&it, 3, (const nbi_view *[]){out, &ib, &tb});
  int64_t rows = nbi_iter_rows(&it), m = it.dims[it.ndim - 1];
  int64_t so = it.strides[0][it.ndim - 1], si = it.strides[1][it.ndim - 1];
  int64_t stt = it.strides[2][it.ndim - 1];
  size_t es = nb_dtype_size(t->dtype), ies = nb_dtype_size(ib.dtype);
#pragma omp parallel for schedule(static) if (rows * m >= NBI_PAR_MIN && rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    int64_t off[3];
    nbi_iter_row(&it, r, off);
    gather_row(out->data + off[0] * (int64_t)es, so, ib.data + off[1] * (int64_t)ies, ib.dtype, si,
               tb.data + off[2] * (int64_t)es, stt, ax, size, es, m);
  }
  return NB_OK;
}

/* ---- scatter_add -----------------------------------------------------------------------
 * acc += upd at scattered positions, in the accumulation type ACC (the dtype
 * itself; f32 for f16/bf16, whose updates are converted as they are read). */
#define SCATTER_CHUNK 64
#define ADD_NATIVE(a, b) ((a) + (b))
#define ADD_F16(a, b) ((a) + nbi_f16_to_f32(b))
#define ADD_BF16(a, b) ((a) + nbi_bf16_to_f32(b))
#define ADD_WRAP32(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define ADD_WRAP64(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define ADD_OR(a, b) ((uint8_t)((a) | (b)))
#define ADD_WRAP8(a, b) ((uint8_t)((uint8_t)(a) + (uint8_t)(b)))
#define ADD_WRAPS8(a, b) ((int8_t)(uint8_t)((uint8_t)(a) + (uint8_t)(b)))
#define ADD_WRAP16(a, b) ((int16_t)(uint16_t)((uint16_t)(a) + (uint16_t)(b)))

/* add_row_<name>: d[j] = COMBINE(d[j], s[j]) for j < m; d is the accumulator
 * (ACC), s the updates (UPD), both contiguous and disjoint. */
typedef void (*add_row_fn)(void *d, const void *s, int64_t m);
#define DEFINE_ADD_ROW(NAME, ACC, UPD, COMBINE)                                                    \
  static void add_row_##NAME(void *d, const void *s, int64_t m) {                                  \
    ACC *restrict a = d;                                                                           \
    const UPD *restrict u = s;                                                                     \
    for (int64_t j = 0; j < m; j++)                                                                \
      a[j] = COMBINE(a[j], u[j]);                                                                  \
  }
DEFINE_ADD_ROW(f32, float, float, ADD_NATIVE)
DEFINE_ADD_ROW(f64, double, double, ADD_NATIVE)
DEFINE_ADD_ROW(f16, float, uint16_t, ADD_F16)
DEFINE_ADD_ROW(bf16, float, uint16_t, ADD_BF16)
DEFINE_ADD_ROW(i32, int32_t, int32_t, ADD_WRAP32)
DEFINE_ADD_ROW(i64, int64_t, int64_t, ADD_WRAP64)
DEFINE_ADD_ROW(bool, uint8_t, uint8_t, ADD_OR)
DEFINE_ADD_ROW(u8, uint8_t, uint8_t, ADD_WRAP8)
DEFINE_ADD_ROW(i8, int8_t, int8_t, ADD_WRAPS8)
DEFINE_ADD_ROW(i16, int16_t, int16_t, ADD_WRAP16)

/* acc is (outer, n, inner) of aes-byte elements, upd is (outer, K, inner) of
 * ues-byte elements, both contiguous: acc[o, ix[q], :] += upd[o, q, :] with
 * `add`. Threads split (o, chunk of inner), so repeated indices accumulate in
 * q order within one thread: results do not depend on the thread count. */
static void scatter_blocks(char *acc, size_t aes, const char *upd, size_t ues, const int64_t *ix,
                           int64_t outer, int64_t n, int64_t k, int64_t inner, add_row_fn add) {
  int64_t chunks = (inner + SCATTER_CHUNK - 1) / SCATTER_CHUNK;
#pragma omp parallel for schedule(static) if (outer * k * inner >= NBI_PAR_MIN)
  for (int64_t p = 0; p < outer * chunks; p++) {
    int64_t o = p / chunks, j0 = p % chunks * SCATTER_CHUNK;
    int64_t m = j0 + SCATTER_CHUNK < inner ? SCATTER_CHUNK : inner - j0;
    for (int64_t q = 0; q < k; q++)
      add(acc + ((o * n + ix[q]) * inner + j0) * (int64_t)aes,
          upd + ((o * k + q) * inner + j0) * (int64_t)ues, m);
  }
}

/* For f16/bf16 outputs: a float copy of out to accumulate in (NULL + OOM
 * error on failure); for other dtypes, out's own data. */
static void *accumulator(const char *fn, const nbi_view *out, int64_t numel) {
  if (out->dtype != NB_F16 && out->dtype != NB_BF16) return out->data;
  float *acc = malloc((size_t)(numel ? numel : 1) * sizeof *acc);
  if (!acc) {
    nbi_error(NB_ERR_OOM, "%s: out of memory for a %lld-element accumulator", fn, (long long)numel);
    return NULL;
  }
  for (int64_t i = 0; i < numel; i++)
    acc[i] = (float)nbi_load_f64(out->data, out->dtype, i);
  return acc;
}

/* Stores a float accumulator back into a contiguous f16/bf16 out and frees it. */
static void accumulator_finish(const nbi_view *out, void *acc, int64_t numel) {
  if (acc == out->data) return;
  for (int64_t i = 0; i < numel; i++)
    nbi_store_f64(out->data, out->dtype, i, ((float *)acc)[i]);
  free(acc);
}

/* scatter_add: in[0] is t (any strides), in[1] is idx (K elements), in[2] is
 * updates, t.shape[:axis] + idx.shape + t.shape[axis+1:] (any strides); out has
 * t's shape, contiguous, seen as (outer, n, inner), updates as (outer, K,
 * inner). out = t; out[o, idx[k], :] += updates[o, k, :]. attrs.i[0] = axis. */
nb_status nbi_cpu_scatter_add(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  const char *fn = "nb_scatter_add";
  int axis = (int)n->attrs.i[0];
  int64_t size = out->dims[axis];
  nb_status st = check_indices(n, fn, &in[1], size, axis);
  if (st) return st;
  nbi_copy_view(out, &in[0]);
  int64_t outer = 1, inner = 1, k = view_numel(&in[1]), numel = view_numel(out);
  for (int d = 0; d < axis; d++)
    outer *= out->dims[d];
  for (int d = axis + 1; d < out->ndim; d++)
    inner *= out->dims[d];
  if (outer * k * inner == 0) return NB_OK;
  size_t es = nb_dtype_size(out->dtype);
  nbi_view upd = in[2];
  void *upd_copy = NULL;
  if (!nbi_view_is_contiguous(&upd)) {
    upd_copy = malloc((size_t)(outer * k * inner) * es);
    if (!upd_copy) return nbi_error(NB_ERR_OOM, "%s: out of memory copying the updates", fn);
    nbi_view c = upd;
    c.data = upd_copy;
    int64_t s = 1;
    for (int d = c.ndim - 1; d >= 0; d--) {
      c.strides[d] = s;
      s *= c.dims[d];
    }
    nbi_copy_view(&c, &upd);
    upd.data = upd_copy;
  }
  int64_t *ix = normalized_indices(fn, &in[1], size, k);
  void *acc = ix ? accumulator(fn, out, numel) : NULL;
  if (!acc) {
    free(ix);
    free(upd_copy);
    return NB_ERR_OOM;
  }
  static const add_row_fn adds[NB_DTYPE_COUNT] = {
      [NB_F32] = add_row_f32,   [NB_F64] = add_row_f64, [NB_F16] = add_row_f16,
      [NB_BF16] = add_row_bf16, [NB_I32] = add_row_i32, [NB_I64] = add_row_i64,
      [NB_BOOL] = add_row_bool, [NB_U8] = add_row_u8,   [NB_I8] = add_row_i8,
      [NB_I16] = add_row_i16,
  };
  bool half = out->dtype == NB_F16 || out->dtype == NB_BF16;
  scatter_blocks(acc, half ? sizeof(float) : es, upd.data, es, ix, outer, size, k, inner,
                 adds[out->dtype]);
  accumulator_finish(out, acc, numel);
  free(ix);
  free(upd_copy);
  return NB_OK;
}

/* scatter_row_<name>: one row of scatter_add along an axis: m updates at upd
 * (UPD, stride su), indices at i (stride si), accumulator elements at acc
 * (ACC, stride sa) plus index * ax. */
typedef void (*scatter_row_fn)(void *acc, int64_t sa, const void *upd, int64_t su, const char *i,
                               nb_dtype idt, int64_t si, int64_t ax, int64_t size, int64_t m);
#define DEFINE_SCATTER_ROW(NAME, ACC, UPD, COMBINE)                                                \
  static void scatter_row_##NAME(void *acc, int64_t sa, const void *upd, int64_t su,               \
                                 const char *i, nb_dtype idt, int64_t si, int64_t ax,              \
                                 int64_t size, int64_t m) {                                        \
    ACC *a = acc;                                                                                  \
    const UPD *u = upd;                                                                            \
    for (int64_t j = 0; j < m; j++) {                                                              \
      int64_t v = index_at(i, idt, j * si);                                                        \
      ACC *d = a + j * sa + (v < 0 ? v + size : v) * ax;                                           \
      *d = COMBINE(*d, u[j * su]);                                                                 \
    }                                                                                              \
  }
DEFINE_SCATTER_ROW(f32, float, float, ADD_NATIVE)
DEFINE_SCATTER_ROW(f64, double, double, ADD_NATIVE)
DEFINE_SCATTER_ROW(f16, float, uint16_t, ADD_F16)
DEFINE_SCATTER_ROW(bf16, float, uint16_t, ADD_BF16)
DEFINE_SCATTER_ROW(i32, int32_t, int32_t, ADD_WRAP32)
DEFINE_SCATTER_ROW(i64, int64_t, int64_t, ADD_WRAP64)
DEFINE_SCATTER_ROW(bool, uint8_t, uint8_t, ADD_OR)
DEFINE_SCATTER_ROW(u8, uint8_t, uint8_t, ADD_WRAP8)
DEFINE_SCATTER_ROW(i8, int8_t, int8_t, ADD_WRAPS8)
DEFINE_SCATTER_ROW(i16, int16_t, int16_t, ADD_WRAP16)

/* Moves dim `axis` of v to the end (iteration then keeps an axis within a row). */
static void move_axis_last(nbi_view *v, int axis) {
  int64_t dim = v->dims[axis], stride = v->strides[axis];
  for (int d = axis; d < v->ndim - 1; d++) {
    v->dims[d] = v->dims[d + 1];
    v->strides[d] = v->strides[d + 1];
  }
  v->dims[v->ndim - 1] = dim;
  v->strides[v->ndim - 1] = stride;
}

/* scatter_add_along_axis: in[0] is t (rank R), in[1] is idx (rank R), in[2] is
 * updates of shape O (as take_along_axis(t, idx, axis)'s output), any strides;
 * out has t's shape, contiguous. out = t; out[i with i[axis] = idx[i]] +=
 * updates[i] for every i in O; along dims where t has extent 1 and O more,
 * updates sum into the one element. attrs.i[0] = axis. Iteration keeps axis
 * inside a row, so rows touch disjoint elements of out (and run in parallel)
 * unless t broadcasts, in which case the loop stays serial. */
nb_status nbi_cpu_scatter_add_along_axis(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  const char *fn = "nb_scatter_add_along_axis";
  int axis = (int)n->attrs.i[0];
  int64_t size = out->dims[axis], ax = out->strides[axis], numel = view_numel(out);
  nb_status st = check_indices(n, fn, &in[1], size, axis);
  if (st) return st;
  nbi_copy_view(out, &in[0]);
  const nbi_view *upd = &in[2];
  nb_shape o = {.ndim = upd->ndim};
  memcpy(o.dims, upd->dims, sizeof o.dims);
  bool broadcast = false;
  for (int d = 0; d < out->ndim; d++)
    broadcast |= d != axis && out->dims[d] != o.dims[d];
  void *acc = accumulator(fn, out, numel);
  if (!acc) return NB_ERR_OOM;
  nbi_view av = *out, uv = *upd, iv = nbi_view_broadcast(&in[1], &o);
  av.data = acc;
  av = along_axis_base(&av, &o, axis);
  move_axis_last(&av, axis);
  move_axis_last(&uv, axis);
  move_axis_last(&iv, axis);
  nbi_iter it;
  nbi_iter_init(&it, 3, (const nbi_view *[]){&uv, &iv, &av});
  int64_t rows = nbi_iter_rows(&it), m = it.dims[it.ndim - 1];
  int64_t su = it.strides[0][it.ndim - 1], si = it.strides[1][it.ndim - 1];
  int64_t sa = it.strides[2][it.ndim - 1];
  static const scatter_row_fn rows_by_dtype[NB_DTYPE_COUNT] = {
      [NB_F32] = scatter_row_f32,   [NB_F64] = scatter_row_f64, [NB_F16] = scatter_row_f16,
      [NB_BF16] = scatter_row_bf16, [NB_I32] = scatter_row_i32, [NB_I64] = scatter_row_i64,
      [NB_BOOL] = scatter_row_bool, [NB_U8] = scatter_row_u8,   [NB_I8] = scatter_row_i8,
      [NB_I16] = scatter_row_i16,
  };
  scatter_row_fn row = rows_by_dtype[out->dtype];
  bool half = out->dtype == NB_F16 || out->dtype == NB_BF16;
  size_t es = nb_dtype_size(out->dtype), aes = half ? sizeof(float) : es;
  size_t ies = nb_dtype_size(iv.dtype);
#pragma omp parallel for schedule(static) if (!broadcast && rows * m >= NBI_PAR_MIN && rows > 1)
  for (int64_t r = 0; r < rows; r++) {
    int64_t off[3];
    nbi_iter_row(&it, r, off);
    row((char *)acc + off[2] * (int64_t)aes, sa, upd->data + off[0] * (int64_t)es, su,
        iv.data + off[1] * (int64_t)ies, iv.dtype, si, ax, size, m);
  }
  accumulator_finish(out, acc, numel);
  return NB_OK;
}

/* one_hot: in[0] is idx (any shape and strides, i32/i64); out is idx.shape +
 * [n], contiguous: out[i, :] is 0 except out[i, idx[i]] = 1 when idx[i] is in
 * [0, n) (outside it the row stays 0). The memset dominates; the one store per
 * index stays serial. */
nb_status nbi_cpu_one_hot(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)n;
  int64_t depth = out->dims[out->ndim - 1], numel = view_numel(out);
  memset(out->data, 0, (size_t)numel * nb_dtype_size(out->dtype)); /* 0 is all-zero bits */
  if (numel == 0) return NB_OK;
  nbi_iter it;
  nbi_iter_init(&it, 1, (const nbi_view *[]){&in[0]});
  int64_t rows = nbi_iter_rows(&it), m = it.dims[it.ndim - 1], s = it.strides[0][it.ndim - 1];
  for (int64_t r = 0; r < rows; r++) {
    int64_t off;
    nbi_iter_row(&it, r, &off);
    for (int64_t j = 0; j < m; j++) {
      int64_t v = index_at(in[0].data, in[0].dtype, off + j * s);
      if (v >= 0 && v < depth) nbi_store_f64(out->data, out->dtype, (r * m + j) * depth + v, 1.0);
    }
  }
  return NB_OK;
}
