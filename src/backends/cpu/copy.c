/* src/backends/cpu/copy.c — strided iteration, copies with dtype conversion,
 * fills, broadcast views. */
#include "cpu.h"

#include <omp.h>
#include <stdlib.h>

void nbi_iter_init(nbi_iter *it, int n_ops, const nbi_view *const *views) {
  const nbi_view *v0 = views[0];
  it->n_ops = n_ops;
  int nd = 0;
  for (int d = 0; d < v0->ndim; d++) {
    if (v0->dims[d] == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < n_ops && merge; k++)
      merge = it->strides[k][nd - 1] == views[k]->strides[d] * v0->dims[d];
    if (merge) {
      it->dims[nd - 1] *= v0->dims[d];
      for (int k = 0; k < n_ops; k++)
        it->strides[k][nd - 1] = views[k]->strides[d];
      continue;
    }
    it->dims[nd] = v0->dims[d];
    for (int k = 0; k < n_ops; k++)
      it->strides[k][nd] = views[k]->strides[d];
    nd++;
  }
  if (nd == 0) { /* 0-d or all size-1: one element */
    it->dims[0] = 1;
    for (int k = 0; k < n_ops; k++)
      it->strides[k][0] = 1;
    nd = 1;
  }
  for (int d = 0; d < v0->ndim; d++)
    if (v0->dims[d] == 0) it->dims[0] = 0; /* empty: no rows */
  it->ndim = nd;
}

int64_t nbi_iter_rows(const nbi_iter *it) {
  int64_t r = 1;
  for (int d = 0; d < it->ndim - 1; d++)
    r *= it->dims[d];
  return it->dims[it->ndim - 1] == 0 ? 0 : r;
}

void nbi_iter_seek(const nbi_iter *it, int64_t row, nbi_iter_pos *p) {
  for (int k = 0; k < it->n_ops; k++)
    p->off[k] = 0;
  for (int d = it->ndim - 2; d >= 0; d--) {
    p->idx[d] = row % it->dims[d];
    row /= it->dims[d];
    for (int k = 0; k < it->n_ops; k++)
      p->off[k] += p->idx[d] * it->strides[k][d];
  }
}

void nbi_iter_row(const nbi_iter *it, int64_t row, int64_t *offs) {
  nbi_iter_pos p;
  nbi_iter_seek(it, row, &p);
  memcpy(offs, p.off, (size_t)it->n_ops * sizeof *offs);
}

bool nbi_iter_flat(const nbi_iter *it, int k) {
  bool zero = true, flat = it->strides[k][it->ndim - 1] == 1;
  int64_t run = it->dims[it->ndim - 1];
  for (int d = it->ndim - 1; d >= 0; d--) {
    zero = zero && it->strides[k][d] == 0;
    if (d < it->ndim - 1) {
      flat = flat && it->strides[k][d] == run;
      run *= it->dims[d];
    }
  }
  return zero || flat;
}

bool nbi_view_is_contiguous(const nbi_view *v) {
  int64_t st = 1;
  for (int d = v->ndim - 1; d >= 0; d--) {
    if (v->dims[d] != 1 && v->strides[d] != st) return false;
    st *= v->dims[d];
  }
  return true;
}

nbi_view nbi_view_broadcast(const nbi_view *v, const nb_shape *s) {
  nbi_view r = *v;
  r.ndim = s->ndim;
  int lead = s->ndim - v->ndim;
  for (int d = 0; d < s->ndim; d++) {
    int src = d - lead;
    r.dims[d] = s->dims[d];
    r.strides[d] = (src < 0 || v->dims[src] != s->dims[d]) ? 0 : v->strides[src];
  }
  return r;
}

/* One row of a copy: same dtype moves bytes; integers and bools convert through
 * int64 (exact), everything else through double. */
static void copy_row(char *dst, nb_dtype ddt, int64_t ds, const char *src, nb_dtype sdt, int64_t ss,
                     int64_t n) {
  if (ddt == sdt) {
    size_t es = nb_dtype_size(ddt);
    if (ds == 1 && ss == 1) {
      memcpy(dst, src, (size_t)n * es);
      return;
    }
    switch (es) {
    case 1:
      for (int64_t j = 0; j < n; j++)
        dst[j * ds] = src[j * ss];
      return;
    case 2:
      for (int64_t j = 0; j < n; j++)
        ((uint16_t *)dst)[j * ds] = ((const uint16_t *)src)[j * ss];
      return;
    case 4:
      for (int64_t j = 0; j < n; j++)
        ((uint32_t *)dst)[j * ds] = ((const uint32_t *)src)[j * ss];
      return;
    default:
      for (int64_t j = 0; j < n; j++)
        ((uint64_t *)dst)[j * ds] = ((const uint64_t *)src)[j * ss];
      return;
    }
  }
  if (ddt == NB_F32 && sdt == NB_F64) {
    for (int64_t j = 0; j < n; j++)
      ((float *)dst)[j * ds] = (float)((const double *)src)[j * ss];
    return;
  }
  if (ddt == NB_F64 && sdt == NB_F32) {
    for (int64_t j = 0; j < n; j++)
      ((double *)dst)[j * ds] = ((const float *)src)[j * ss];
    return;
  }
  if (!nb_dtype_is_float(ddt) && !nb_dtype_is_float(sdt)) {
    for (int64_t j = 0; j < n; j++)
      nbi_store_i64(dst, ddt, j * ds, nbi_load_i64(src, sdt, j * ss));
    return;
  }
  for (int64_t j = 0; j < n; j++)
    nbi_store_f64(dst, ddt, j * ds, nbi_load_f64(src, sdt, j * ss));
}

void nbi_copy_view(nbi_view *dst, const nbi_view *src) {
  nbi_iter it;
  nbi_iter_init(&it, 2, (const nbi_view *[]){dst, src});
  int64_t rows = nbi_iter_rows(&it), n = it.dims[it.ndim - 1];
  int64_t ds = it.strides[0][it.ndim - 1], ss = it.strides[1][it.ndim - 1];
  size_t de = nb_dtype_size(dst->dtype), se = nb_dtype_size(src->dtype);
  /* each thread seeks to its first row once, then steps row to row (a permuted
   * copy has many short rows: a division per dim per row would cost more than
   * moving them) */
#pragma omp parallel if (rows * n >= NBI_PAR_MIN && rows > 1)
  {
    int nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
    nbi_iter_pos p;
    if (r0 < r1) nbi_iter_seek(&it, r0, &p);
    for (int64_t r = r0; r < r1; r++) {
      copy_row(dst->data + p.off[0] * (int64_t)de, dst->dtype, ds,
               src->data + p.off[1] * (int64_t)se, src->dtype, ss, n);
      if (r + 1 < r1) nbi_iter_next(&it, &p);
    }
  }
}

void nbi_fill_view(nbi_view *dst, double value) {
  char one[8];
  nbi_store_f64(one, dst->dtype, 0, value);
  nbi_view src = *dst;
  src.data = one;
  for (int d = 0; d < src.ndim; d++)
    src.strides[d] = 0;
  nbi_copy_view(dst, &src);
}
