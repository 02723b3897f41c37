/* src/core/device.c — the process-wide device table, the public device API, and
 * host I/O through the backend seam (src/backends/backend.h).
 *
 * The table: entry 0 is the CPU, then NB_EMU(0..3) (registered when the table
 * opens: cheap, no resources until used), then the GPUs the CUDA backend finds
 * (`make CUDA=1`), probed at the first question about CUDA devices only, so a
 * CPU-only program never pays for cuInit. Entries never move or change once
 * registered; `count` is published after the entry is written, so readers need
 * no lock.
 *
 * Host I/O: every read or write of tensor data from the host goes through
 * nbi_host_read / nbi_host_write (whole views, any strides, with dtype
 * conversion). On the CPU they are nbi_copy_view; elsewhere a contiguous view
 * of the wanted dtype moves by one upload or download, anything else through a
 * contiguous temporary on the device and the backend's copy. */
#include "../backends/backend.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static nbi_device table[NBI_MAX_DEVICES];
static _Atomic int count;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;
#ifdef NABLA_CUDA
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
#endif

static const char *kind_name(nb_device_kind k) {
  switch (k) {
  case NB_DEVICE_CPU: return "cpu";
  case NB_DEVICE_CUDA: return "cuda";
  case NB_DEVICE_EMU: return "emu";
  }
  return "?";
}

int nbi_device_register(nb_device id, const nbi_backend *be, void *ctx) {
  pthread_mutex_lock(&table_lock);
  int i = atomic_load(&count);
  if (i < NBI_MAX_DEVICES) {
    table[i] = (nbi_device){.id = id, .be = be, .ctx = ctx};
    snprintf(table[i].name, sizeof table[i].name, "%s:%d", kind_name(id.kind), id.index);
    atomic_store(&count, i + 1);
  } else {
    i = -1;
  }
  pthread_mutex_unlock(&table_lock);
  return i;
}

static void table_open(void) {
  nbi_device_register(NB_CPU, &nbi_cpu_backend, NULL);
  nbi_emu_probe();
}

#ifdef NABLA_CUDA
static void cuda_open(void) { nbi_cuda_probe(); }
#endif

/* Opens the table, and the CUDA entries too when cuda is set. */
static void table_ready(bool cuda) {
  pthread_once(&table_once, table_open);
#ifdef NABLA_CUDA
  if (cuda) pthread_once(&cuda_once, cuda_open);
#else
  (void)cuda;
#endif
}

const nbi_device *nbi_device_at(int i) {
  table_ready(false);
  assert(i >= 0 && i < atomic_load(&count));
  return &table[i];
}

int nbi_device_count_all(void) {
  table_ready(false);
  return atomic_load(&count);
}

const char *nbi_device_name(int i) {
  return i >= 0 && i < nbi_device_count_all() ? table[i].name : "?";
}

nb_device nbi_device_public(int i) { return nbi_device_at(i)->id; }

void *nbi_device_native_stream(int i) {
  const nbi_device *d = nbi_device_at(i);
  return d->be->native_stream ? d->be->native_stream(d->ctx) : NULL;
}

static int find(nb_device d) {
  int n = atomic_load(&count);
  for (int i = 0; i < n; i++)
    if (table[i].id.kind == d.kind && table[i].id.index == d.index) return i;
  return -1;
}

int nbi_device_lookup(const char *fn, nb_device d) {
  table_ready(d.kind == NB_DEVICE_CUDA);
  int i = find(d);
  if (i >= 0) return i;
  if (d.kind == NB_DEVICE_CUDA) {
#ifdef NABLA_CUDA
    const char *why = nbi_cuda_why();
    nbi_error(NB_ERR_DEVICE, "%s: no device cuda:%d (%s)", fn, d.index,
              why && why[0] ? why : "the driver reports fewer GPUs");
#else
    nbi_error(NB_ERR_DEVICE, "%s: no device cuda:%d (nabla was built without CUDA: make CUDA=1)",
              fn, d.index);
#endif
  } else {
    nbi_error(NB_ERR_DEVICE, "%s: no device %s:%d", fn, kind_name(d.kind), d.index);
  }
  return -1;
}

/* ---- the public API -------------------------------------------------------------------- */
int nb_device_count(nb_device_kind k) {
  table_ready(k == NB_DEVICE_CUDA);
  int n = 0, all = atomic_load(&count);
  for (int i = 0; i < all; i++)
    n += table[i].id.kind == k;
  return n;
}

static _Thread_local int default_dev; /* table index */
/* While rules of a node run (src/transforms/sweep.c), the constants they make
 * belong on that node's device: 1 + the device then, 0 when unset. */
static _Thread_local int rule_dev;

int nbi_default_device(void) { return rule_dev ? rule_dev - 1 : default_dev; }

int nbi_device_push(int dev) {
  int prev = rule_dev;
  rule_dev = dev + 1;
  return prev;
}
void nbi_device_pop(int prev) { rule_dev = prev; }

nb_status nb_set_default_device(nb_device d) {
  int i = nbi_device_lookup("nb_set_default_device", d);
  if (i < 0) return NB_ERR_DEVICE;
  default_dev = i;
  return NB_OK;
}

nb_device nb_default_device(void) { return nbi_device_at(default_dev)->id; }

const char *nb_device_str(nb_device d) {
  int i = find(d);
  return i >= 0 ? table[i].name : kind_name(d.kind);
}

nb_device nb_device_of(const nb_tensor *t) {
  if (!t) return NB_CPU;
  if (t->n_phys > 0) t = t->phys[0];
  return nbi_device_at(t->device)->id;
}

static _Atomic int matmul_precision = NB_PRECISION_HIGHEST;
void nb_set_matmul_precision(nb_precision p) {
  atomic_store(&matmul_precision,
               p == NB_PRECISION_HIGH ? NB_PRECISION_HIGH : NB_PRECISION_HIGHEST);
}
nb_precision nb_get_matmul_precision(void) { return (nb_precision)atomic_load(&matmul_precision); }
nb_precision nbi_matmul_precision(void) { return nb_get_matmul_precision(); }

/* ---- host I/O -------------------------------------------------------------------------- */
/* A contiguous view of v's dims and dtype dt at data. */
static nbi_view contiguous_like(const nbi_view *v, nb_dtype dt, void *data) {
  nbi_view c = {.data = data, .dtype = dt, .ndim = v->ndim};
  memcpy(c.dims, v->dims, sizeof c.dims);
  nb_shape s = {.ndim = v->ndim};
  memcpy(s.dims, v->dims, sizeof s.dims);
  nbi_contig_strides(&s, c.strides);
  return c;
}

static int64_t view_numel(const nbi_view *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++)
    n *= v->dims[d];
  return n;
}

/* A temporary block of nbytes on device d (raw: outside the buffer cache, which
 * counts tensor memory only); NULL + NB_ERR_OOM. */
static void *temp_alloc(const nbi_device *d, size_t nbytes, const char *fn) {
  void *p = d->be->alloc(d->ctx, nbytes ? nbytes : 1);
  if (!p) nbi_error(NB_ERR_OOM, "%s: out of memory on %s (%zu bytes)", fn, d->name, nbytes);
  return p;
}

nb_status nbi_host_read(int dev, const nbi_view *v, void *dst, nb_dtype dst_dt) {
  nbi_view h = contiguous_like(v, dst_dt, dst);
  int64_t n = view_numel(v);
  if (n == 0) return NB_OK;
  const nbi_device *d = nbi_device_at(dev);
  if (d->id.kind == NB_DEVICE_CPU) {
    nbi_copy_view(&h, v);
    return NB_OK;
  }
  size_t nbytes = (size_t)n * nb_dtype_size(dst_dt);
  if (v->dtype == dst_dt && nbi_view_is_contiguous(v))
    return d->be->download(d->ctx, dst, v->data, nbytes);
  void *tmp = temp_alloc(d, nbytes, "nb_to_host");
  if (!tmp) return NB_ERR_OOM;
  nbi_view t = contiguous_like(v, dst_dt, tmp);
  nb_status st = d->be->copy(d->ctx, &t, v);
  if (!st) st = d->be->download(d->ctx, dst, tmp, nbytes);
  d->be->free(d->ctx, tmp, nbytes ? nbytes : 1);
  return st;
}

nb_status nbi_host_write(int dev, nbi_view *v, const void *src, nb_dtype src_dt) {
  nbi_view h = contiguous_like(v, src_dt, (void *)src);
  int64_t n = view_numel(v);
  if (n == 0) return NB_OK;
  const nbi_device *d = nbi_device_at(dev);
  if (d->id.kind == NB_DEVICE_CPU) {
    nbi_copy_view(v, &h);
    return NB_OK;
  }
  size_t nbytes = (size_t)n * nb_dtype_size(src_dt);
  if (v->dtype == src_dt && nbi_view_is_contiguous(v))
    return d->be->upload(d->ctx, v->data, src, nbytes);
  void *tmp = temp_alloc(d, nbytes, "nabla");
  if (!tmp) return NB_ERR_OOM;
  nbi_view t = contiguous_like(v, src_dt, tmp);
  nb_status st = d->be->upload(d->ctx, tmp, src, nbytes);
  if (!st) st = d->be->copy(d->ctx, v, &t);
  d->be->free(d->ctx, tmp, nbytes ? nbytes : 1);
  return st;
}

bool nbi_host_borrow(const nb_tensor *t, const void **p, nbi_buffer **hold) {
  if (!(t->flags & NBI_T_REALIZED) || t->mesh || t->n_shards != 1 || !t->shard0.buf ||
      nbi_device_at(t->device)->id.kind != NB_DEVICE_CPU)
    return false;
  nbi_view v = nbi_tensor_view(t);
  if (!nbi_view_is_contiguous(&v)) return false;
  nbi_buffer_retain(t->shard0.buf);
  *hold = t->shard0.buf;
  *p = v.data;
  return true;
}

nb_status nbi_host_scalar(int dev, const nbi_view *v, double *out) {
  nbi_view one = *v;
  for (int k = 0; k < one.ndim; k++)
    one.dims[k] = 1;
  return nbi_host_read(dev, &one, out, NB_F64);
}

nb_status nbi_dev_copy(int dev, nbi_view *dst, const nbi_view *src) {
  const nbi_device *d = nbi_device_at(dev);
  return d->be->copy(d->ctx, dst, src);
}

nb_status nbi_copy_between(int dst_dev, nbi_view *dst, int src_dev, const nbi_view *src) {
  if (dst_dev == src_dev) return nbi_dev_copy(dst_dev, dst, src);
  int64_t n = view_numel(src);
  if (n == 0) return NB_OK;
  if (dst_dev == 0 && nbi_view_is_contiguous(dst))
    return nbi_host_read(src_dev, src, dst->data, dst->dtype);
  if (src_dev == 0 && nbi_view_is_contiguous(src))
    return nbi_host_write(dst_dev, dst, src->data, src->dtype);
  size_t nbytes = (size_t)n * nb_dtype_size(dst->dtype);
  void *tmp = malloc(nbytes);
  if (!tmp) return nbi_error(NB_ERR_OOM, "nabla: out of memory staging %zu bytes", nbytes);
  nb_status st = nbi_host_read(src_dev, src, tmp, dst->dtype);
  if (!st) st = nbi_host_write(dst_dev, dst, tmp, dst->dtype);
  free(tmp);
  return st;
}

nb_status nbi_dev_fill(int dev, nbi_view *dst, double value) {
  const nbi_device *d = nbi_device_at(dev);
  return d->be->fill(d->ctx, dst, value);
}

nb_status nbi_dev_sync(int dev) {
  const nbi_device *d = nbi_device_at(dev);
  return d->be->sync(d->ctx);
}
