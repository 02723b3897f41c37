/* src/core/shape.c — shape arithmetic, broadcasting and axis normalization. */
#include "nbi.h"

#include <stdio.h>

/* The product of the non-zero dims must stay within NBI_MAX_NUMEL too, also
 * when a zero dim makes the tensor empty: strides (products of trailing dims,
 * nbi_contig_strides) and offsets are then bounded for every accepted shape. */
int64_t nbi_numel(const nb_shape *s) {
  bool zero = false;
  int64_t n = 1;
  for (int i = 0; i < s->ndim; i++) {
    if (s->dims[i] < 0) return -1;
    if (s->dims[i] == 0) {
      zero = true;
      continue;
    }
    if (s->dims[i] > NBI_MAX_NUMEL / n) return -1;
    n *= s->dims[i];
  }
  return zero ? 0 : n;
}

char *nb_shape_str(nb_shape s, char *buf, size_t cap) {
  if (!buf || cap == 0) return buf;
  size_t k = 0;
  buf[0] = '\0';
  if (s.ndim < 0 || s.ndim > NB_MAX_DIMS) {
    snprintf(buf, cap, "<bad ndim %d>", s.ndim);
    return buf;
  }
  k += (size_t)snprintf(buf + k, cap - k, "[");
  for (int i = 0; i < s.ndim && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)s.dims[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

nb_status nbi_check_shape(const char *fn, const nb_shape *s) {
  char b[160];
  if (s->ndim < 0 || s->ndim > NB_MAX_DIMS)
    return nbi_error(NB_ERR_SHAPE, "%s: rank %d outside [0, %d]", fn, s->ndim, NB_MAX_DIMS);
  for (int i = 0; i < s->ndim; i++)
    if (s->dims[i] < 0)
      return nbi_error(NB_ERR_SHAPE, "%s: negative dimension in shape %s", fn,
                       nb_shape_str(*s, b, sizeof b));
  if (nbi_numel(s) < 0)
    return nbi_error(NB_ERR_OVERFLOW, "%s: shape %s has more than 2^48 elements", fn,
                     nb_shape_str(*s, b, sizeof b));
  return NB_OK;
}

bool nbi_shape_eq(const nb_shape *a, const nb_shape *b) {
  if (a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

nb_status nbi_broadcast_shapes(const char *fn, const nb_shape *a, const nb_shape *b,
                               nb_shape *out) {
  int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
  nb_shape r = {.ndim = nd};
  for (int i = 0; i < nd; i++) {
    int ia = a->ndim - nd + i, ib = b->ndim - nd + i;
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) {
      char sa[160], sb[160];
      return nbi_error(NB_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)",
                       fn, nb_shape_str(*a, sa, sizeof sa), nb_shape_str(*b, sb, sizeof sb), i,
                       (long long)da, (long long)db);
    }
    r.dims[i] = da == 1 ? db : da;
  }
  *out = r;
  return NB_OK;
}

nb_status nbi_norm_axis(const char *fn, int axis, int ndim, int *out) {
  int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim)
    return nbi_error(NB_ERR_AXIS, "%s: axis %d out of range for rank %d", fn, axis, ndim);
  *out = a;
  return NB_OK;
}

nb_status nbi_axes_mask(const char *fn, nb_axes axes, int ndim, uint32_t *mask) {
  if (axes.n == -1) {
    *mask = ndim >= 32 ? 0xffffffffu : (1u << ndim) - 1;
    return NB_OK;
  }
  if (axes.n < 0 || axes.n > NB_MAX_DIMS)
    return nbi_error(NB_ERR_AXIS, "%s: %d axes given (at most %d)", fn, axes.n, NB_MAX_DIMS);
  uint32_t m = 0;
  for (int i = 0; i < axes.n; i++) {
    int a;
    if (nbi_norm_axis(fn, axes.v[i], ndim, &a)) return NB_ERR_AXIS;
    if (m & (1u << a)) return nbi_error(NB_ERR_AXIS, "%s: axis %d repeated", fn, axes.v[i]);
    m |= 1u << a;
  }
  *mask = m;
  return NB_OK;
}

void nbi_contig_strides(const nb_shape *s, int64_t *strides) {
  int64_t st = 1;
  for (int i = s->ndim - 1; i >= 0; i--) {
    strides[i] = st;
    st *= s->dims[i] > 0 ? s->dims[i] : 1;
  }
}
