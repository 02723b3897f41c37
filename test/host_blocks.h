/* test/host_blocks.h — reference side of the sharding tests
 * (test_sharding_coll.c, test_smap.c): device coordinates on a mesh (mixed
 * radix, the first axis major) and host arrays of doubles cut into chunks
 * (ceil-sized, as nbi_local_block) and concatenated, with plain loops.
 * Include after common.h and src/sharding/sharding.h. */
#ifndef NABLA_TEST_HOST_BLOCKS_H
#define NABLA_TEST_HOST_BLOCKS_H

/* Device dev's coordinates on m into c[0..n_axes), and back. */
static inline void coords_of(const nb_mesh *m, int dev, int64_t *c) {
  for (int i = m->n_axes - 1; i >= 0; i--) {
    c[i] = dev % m->size[i];
    dev /= (int)m->size[i];
  }
}

static inline int dev_of(const nb_mesh *m, const int64_t *c) {
  int64_t d = 0;
  for (int i = 0; i < m->n_axes; i++)
    d = d * m->size[i] + c[i];
  return (int)d;
}

/* ---- host blocks ----------------------------------------------------------------- */

typedef struct hb {
  nb_shape s;
  double *x;
} hb;

static inline hb hb_new(nb_shape s) {
  int64_t n = tc_numel(s);
  return (hb){s, calloc((size_t)(n ? n : 1), sizeof(double))};
}

static inline int64_t chunk_start(int64_t len, int n, int r) {
  int64_t c = (len + n - 1) / n;
  return r * c < len ? r * c : len;
}

/* x[start:stop] along dim. */
static inline hb hb_slice(const hb *t, int dim, int64_t start, int64_t stop) {
  nb_shape s = t->s;
  s.dims[dim] = stop - start;
  hb y = hb_new(s);
  int64_t ix[NB_MAX_DIMS];
  for (int64_t i = 0; i < tc_numel(s); i++) {
    tc_unravel(i, &s, ix);
    ix[dim] += start;
    y.x[i] = t->x[tc_ravel(ix, &t->s)];
  }
  return y;
}

static inline hb hb_chunk(const hb *t, int dim, int n, int r) {
  return hb_slice(t, dim, chunk_start(t->s.dims[dim], n, r), chunk_start(t->s.dims[dim], n, r + 1));
}

static inline hb hb_concat(const hb *ts, int n, int dim) {
  nb_shape s = ts[0].s;
  s.dims[dim] = 0;
  for (int k = 0; k < n; k++)
    s.dims[dim] += ts[k].s.dims[dim];
  hb y = hb_new(s);
  int64_t ix[NB_MAX_DIMS];
  for (int64_t i = 0; i < tc_numel(s); i++) {
    tc_unravel(i, &s, ix);
    int k = 0;
    while (ix[dim] >= ts[k].s.dims[dim])
      ix[dim] -= ts[k++].s.dims[dim];
    y.x[i] = ts[k].x[tc_ravel(ix, &ts[k].s)];
  }
  return y;
}

static inline void hb_free_all(hb *t, int n) {
  for (int k = 0; k < n; k++)
    free(t[k].x);
}

#endif
