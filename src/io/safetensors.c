/* src/io/safetensors.c — nb_save_safetensors / nb_load_safetensors: trees to
 * and from the safetensors format (an 8-byte little-endian header length N,
 * N bytes of JSON header, then the data buffer; include/nabla/io.h).
 *
 * Saving writes <path>.tmp-<pid>-<n> (header padded with spaces to a multiple
 * of 8 bytes, as Python's package does; tensors in tree order, each one's
 * bytes row-major in its dtype), flushes it to disk and renames it over
 * path, so a reader never sees half a file and a file that loaded tensors
 * still map is replaced, not rewritten.
 *
 * Loading maps the file (MAP_PRIVATE, readable and writable: a write to a
 * loaded tensor's memory, an in-place step, stays in this process), checks
 * the header (st_header.c for the syntax; here: dtypes, shapes, sizes, the
 * offsets tiling the buffer, the file size) and makes one tensor per entry,
 * in the order of their data. When the calling thread's default device is
 * the CPU, a tensor whose data starts at a multiple of its element size in
 * the file wraps the mapping (no copy; one external buffer, nbi_buffer_wrap,
 * holds the mapping until the last such tensor is released); otherwise its
 * bytes are copied (nb_from_data). Little-endian hosts only (x86-64, ARM64
 * as Linux runs them); a big-endian host gets NB_ERR_IO. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SAVE "nb_save_safetensors"

static bool little_endian(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

/* ---- saving ---------------------------------------------------------------------------- */
typedef struct sbuf {
  char *p;
  size_t n, cap;
  bool oom;
} sbuf;

static void put(sbuf *b, const char *s, size_t len) {
  if (b->oom) return;
  if (b->n + len + 1 > b->cap) {
    size_t c = b->cap ? b->cap : 256;
    while (c < b->n + len + 1)
      c *= 2;
    char *q = realloc(b->p, c);
    if (!q) {
      b->oom = true;
      return;
    }
    b->p = q, b->cap = c;
  }
  memcpy(b->p + b->n, s, len);
  b->n += len;
  b->p[b->n] = 0;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

static void putf(sbuf *b, const char *fmt, long long v) {
  char t[32];
  int len = snprintf(t, sizeof t, fmt, v);
  put(b, t, (size_t)len);
}

/* s as a JSON string: quotes, backslashes and control characters escaped,
 * other bytes (UTF-8) as they are. */
static void put_json_string(sbuf *b, const char *s) {
  put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      put(b, e, 2);
    } else if (c < 0x20) {
      char e[8];
      snprintf(e, sizeof e, "\\u%04x", c);
      put(b, e, 6);
    } else {
      put(b, (const char *)&c, 1);
    }
  }
  put(b, "\"", 1);
}

/* Checks a metadata string is valid UTF-8 (JSON requires it). */
static bool utf8_ok(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    unsigned c = u[i];
    size_t len = c < 0x80             ? 1
                 : (c & 0xe0) == 0xc0 ? 2
                 : (c & 0xf0) == 0xe0 ? 3
                 : (c & 0xf8) == 0xf0 ? 4
                                      : 0;
    if (!len || i + len > n) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; k < len; k++) {
      if ((u[i + k] & 0xc0) != 0x80) return false;
      cp = cp << 6 | (u[i + k] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

static nb_status check_save_args(const char *path, const nb_tree *t, const char *const *kv,
                                 int n_kv) {
  if (!path) return nbi_error(NB_ERR_NULL, SAVE ": path is NULL");
  if (!t) return nbi_error(NB_ERR_NULL, SAVE ": tree is NULL");
  if (n_kv < 0) return nbi_error(NB_ERR_ARG, SAVE ": n_metadata is %d (must be >= 0)", n_kv);
  if (n_kv > 0 && !kv)
    return nbi_error(NB_ERR_NULL, SAVE ": metadata_kv is NULL with n_metadata %d", n_kv);
  for (int k = 0; k < 2 * n_kv; k++) {
    if (!kv[k])
      return nbi_error(NB_ERR_NULL, SAVE ": metadata %s %d is NULL", k % 2 ? "value" : "key",
                       k / 2);
    if (!utf8_ok(kv[k]))
      return nbi_error(NB_ERR_ARG, SAVE ": metadata %s %d is not valid UTF-8",
                       k % 2 ? "value" : "key", k / 2);
    if (k % 2 == 0)
      for (int j = 0; j < k; j += 2)
        if (!strcmp(kv[j], kv[k]))
          return nbi_error(NB_ERR_ARG, SAVE ": metadata key \"%s\" appears twice", kv[k]);
  }
  int n = nb_tree_len(t);
  for (int i = 0; i < n; i++) {
    const char *name = nb_tree_name(t, i);
    nb_tensor *x = nb_tree_at(t, i);
    if (!strcmp(name, "__metadata__"))
      return nbi_error(NB_ERR_ARG, SAVE ": the name \"__metadata__\" is reserved by the format");
    if (!utf8_ok(name)) return nbi_error(NB_ERR_ARG, SAVE ": name \"%s\" is not valid UTF-8", name);
    if (!nbi_st_dtype_str(nb_dtype_of(x)))
      return nbi_error(NB_ERR_DTYPE, SAVE ": \"%s\" has dtype %s, which safetensors lacks", name,
                       nb_dtype_name(nb_dtype_of(x)));
  }
  return NB_OK;
}

/* The header (JSON padded with spaces to a multiple of 8 bytes) into b. */
static void build_header(sbuf *b, const nb_tree *t, const char *const *kv, int n_kv) {
  put(b, "{", 1);
  bool first = true;
  if (n_kv > 0) {
    puts_(b, "\"__metadata__\":{");
    for (int k = 0; k < n_kv; k++) {
      if (k) put(b, ",", 1);
      put_json_string(b, kv[2 * k]);
      put(b, ":", 1);
      put_json_string(b, kv[2 * k + 1]);
    }
    put(b, "}", 1);
    first = false;
  }
  uint64_t off = 0;
  for (int i = 0; i < nb_tree_len(t); i++) {
    nb_tensor *x = nb_tree_at(t, i);
    nb_shape s = nb_shape_of(x);
    uint64_t bytes = (uint64_t)nb_numel(x) * nb_dtype_size(nb_dtype_of(x));
    if (!first) put(b, ",", 1);
    first = false;
    put_json_string(b, nb_tree_name(t, i));
    puts_(b, ":{\"dtype\":\"");
    puts_(b, nbi_st_dtype_str(nb_dtype_of(x)));
    puts_(b, "\",\"shape\":[");
    for (int d = 0; d < s.ndim; d++)
      putf(b, d ? ",%lld" : "%lld", (long long)s.dims[d]);
    putf(b, "],\"data_offsets\":[%lld,", (long long)off);
    off += bytes;
    putf(b, "%lld]}", (long long)off);
  }
  put(b, "}", 1);
  while (!b->oom && b->n % 8)
    put(b, " ", 1);
}

static nb_status io_error(const char *fn, const char *path, const char *what) {
  return nbi_error(NB_ERR_IO, "%s: %s: %s", fn, path, what);
}

static nb_status write_all(FILE *f, const void *p, size_t n) {
  return n && fwrite(p, 1, n, f) != n ? NB_ERR_IO : NB_OK;
}

static nb_status save_body(FILE *f, const char *path, const nb_tree *t, const sbuf *hdr) {
  unsigned char len[8];
  for (int k = 0; k < 8; k++)
    len[k] = (unsigned char)((uint64_t)hdr->n >> (8 * k));
  if (write_all(f, len, 8) || write_all(f, hdr->p, hdr->n)) return NB_ERR_IO;
  void *host = NULL;
  size_t host_cap = 0;
  nb_status st = NB_OK;
  for (int i = 0; i < nb_tree_len(t) && !st; i++) {
    nb_tensor *x = nb_tree_at(t, i);
    size_t bytes = (size_t)nb_numel(x) * nb_dtype_size(nb_dtype_of(x));
    if (!bytes) continue;
    if (bytes > host_cap) {
      free(host);
      host_cap = bytes;
      if (!(host = malloc(bytes))) {
        st = nbi_error(NB_ERR_OOM, SAVE ": %s: out of memory (%zu bytes for \"%s\")", path, bytes,
                       nb_tree_name(t, i));
        break;
      }
    }
    st = nb_to_host(x, host, bytes);
    if (!st && write_all(f, host, bytes)) st = NB_ERR_IO;
  }
  free(host);
  return st;
}

nb_status nb_save_safetensors(const char *path, const nb_tree *t, const char *const *metadata_kv,
                              int n_metadata) {
  nb_status st = check_save_args(path, t, metadata_kv, n_metadata);
  if (st) return st;
  if (!little_endian()) return io_error(SAVE, path, "big-endian hosts are not supported");
  nb_tree *tt = (nb_tree *)t;
  const char *outer = nbi_error_context_begin(SAVE);
  st = nb_tree_eval(&tt, 1);
  nbi_error_context_end(outer);
  if (st) return st;
  sbuf hdr = {0};
  build_header(&hdr, t, metadata_kv, n_metadata);
  if (hdr.oom) {
    free(hdr.p);
    return nbi_error(NB_ERR_OOM, SAVE ": %s: out of memory building the header", path);
  }
  static int counter;
  char *tmp = malloc(strlen(path) + 64);
  if (!tmp) {
    free(hdr.p);
    return nbi_error(NB_ERR_OOM, SAVE ": out of memory");
  }
  sprintf(tmp, "%s.tmp-%ld-%d", path, (long)getpid(),
          __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
  if (!f) {
    int e = errno;
    if (fd >= 0) close(fd);
    st = nbi_error(NB_ERR_IO, SAVE ": %s: cannot create %s: %s", path, tmp, strerror(e));
    free(tmp), free(hdr.p);
    return st;
  }
  outer = nbi_error_context_begin(SAVE);
  st = save_body(f, path, t, &hdr);
  nbi_error_context_end(outer);
  free(hdr.p);
  int e = st == NB_ERR_IO ? errno : 0;
  if (!st && (fflush(f) || fsync(fileno(f)))) st = NB_ERR_IO, e = errno;
  if (fclose(f) && !st) st = NB_ERR_IO, e = errno;
  if (!st && rename(tmp, path)) st = NB_ERR_IO, e = errno;
  if (st) {
    unlink(tmp);
    if (st == NB_ERR_IO) nbi_error(NB_ERR_IO, SAVE ": %s: write failed: %s", path, strerror(e));
  }
  free(tmp);
  return st;
}

/* ---- loading --------------------------------------------------------------------------- */
#define LOAD "nb_load_safetensors"

typedef struct mapping {
  void *base;
  size_t len;
  bool mapped; /* mmap (else malloc) */
} mapping;

static void mapping_free(void *ctx) {
  mapping *m = ctx;
  if (m->mapped)
    munmap(m->base, m->len);
  else
    free(m->base);
  free(m);
}

/* The whole file into a new mapping (mmap, or read into memory where mmap
 * fails); NULL + error. */
static mapping *map_file(const char *path, int fd, size_t size) {
  mapping *m = malloc(sizeof *m);
  if (!m) {
    nbi_error(NB_ERR_OOM, LOAD ": %s: out of memory", path);
    return NULL;
  }
  m->len = size;
  m->mapped = true;
  m->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (m->base != MAP_FAILED) return m;
  m->mapped = false;
  m->base = aligned_alloc(64, (size + 63) & ~(size_t)63);
  if (!m->base) {
    free(m);
    nbi_error(NB_ERR_OOM, LOAD ": %s: out of memory reading %zu bytes", path, size);
    return NULL;
  }
  for (size_t got = 0; got < size;) {
    ssize_t r = pread(fd, (char *)m->base + got, size - got, (off_t)got);
    if (r <= 0) {
      int e = r < 0 ? errno : EIO;
      mapping_free(m);
      nbi_error(NB_ERR_IO, LOAD ": %s: read failed: %s", path, strerror(e));
      return NULL;
    }
    got += (size_t)r;
  }
  return m;
}

static int by_offset(const void *a, const void *b) {
  const nbi_st_entry *x = *(const nbi_st_entry *const *)a, *y = *(const nbi_st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

/* A tree name: 1 to 255 bytes, dot-separated parts non-empty. */
static bool tree_name_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 255) return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] == '.' && (i == 0 || i + 1 == n || s[i + 1] == '.')) return false;
  return true;
}

/* Checks every entry against the format and nabla; fills order[] with the
 * entries sorted by their data, dts[] with their dtypes (indexed like the
 * entries). Returns false with the problem in err. */
static bool validate(const nbi_st_header *hd, uint64_t buf_bytes, nbi_st_entry **order,
                     nb_dtype *dts, char *err, size_t cap) {
  for (int k = 0; k < hd->n; k++) {
    const nbi_st_entry *e = &hd->e[k];
    nb_dtype dt = nbi_st_dtype_of(e->dtype);
    if (dt == NB_DTYPE_COUNT) {
      snprintf(err, cap, "tensor \"%.200s\": %s dtype \"%s\"", e->name,
               nbi_st_dtype_known(e->dtype) ? "nabla has no tensors of" : "unknown", e->dtype);
      return false;
    }
    dts[k] = dt;
    if (e->ndim > NB_MAX_DIMS) {
      snprintf(err, cap, "tensor \"%.200s\" has %d dimensions (nabla holds at most %d)", e->name,
               e->ndim, NB_MAX_DIMS);
      return false;
    }
    nb_shape s = {.ndim = e->ndim};
    memcpy(s.dims, e->dims, sizeof s.dims);
    int64_t numel = e->dims_overflow ? -1 : nbi_numel(&s);
    if (numel < 0) {
      snprintf(err, cap, "tensor \"%.200s\": shape too large", e->name);
      return false;
    }
    if (e->begin > e->end) {
      snprintf(err, cap, "tensor \"%.200s\": data_offsets [%llu, %llu] are reversed", e->name,
               (unsigned long long)e->begin, (unsigned long long)e->end);
      return false;
    }
    uint64_t want = (uint64_t)numel * nb_dtype_size(dt);
    if (e->end - e->begin != want) {
      snprintf(err, cap,
               "tensor \"%.200s\": data_offsets [%llu, %llu] span %llu bytes but %s of %lld "
               "elements needs %llu",
               e->name, (unsigned long long)e->begin, (unsigned long long)e->end,
               (unsigned long long)(e->end - e->begin), e->dtype, (long long)numel,
               (unsigned long long)want);
      return false;
    }
    if (!tree_name_ok(e->name)) {
      snprintf(err, cap,
               "tensor name \"%.200s\" is not a tree name (1 to 255 bytes, dots between non-empty "
               "parts)",
               e->name);
      return false;
    }
    order[k] = &hd->e[k];
  }
  qsort(order, (size_t)hd->n, sizeof *order, by_offset);
  uint64_t at = 0;
  for (int k = 0; k < hd->n; k++) {
    const nbi_st_entry *e = order[k];
    if (e->begin != at) {
      if (e->begin > at)
        snprintf(err, cap,
                 "gap in the data: bytes [%llu, %llu) belong to no tensor (next: \"%.200s\")",
                 (unsigned long long)at, (unsigned long long)e->begin, e->name);
      else
        snprintf(err, cap,
                 "tensor \"%.200s\" overlaps another: data_offsets start at %llu, before %llu",
                 e->name, (unsigned long long)e->begin, (unsigned long long)at);
      return false;
    }
    at = e->end;
  }
  if (at != buf_bytes) {
    snprintf(err, cap,
             "%s: the tensors cover %llu bytes of data but the file holds %llu after the header",
             at < buf_bytes ? "trailing bytes" : "file too short", (unsigned long long)at,
             (unsigned long long)buf_bytes);
    return false;
  }
  return true;
}

/* One entry's tensor: wraps the mapping in place when allowed, else copies. */
static nb_tensor *entry_tensor(const nbi_st_entry *e, nb_dtype dt, nbi_buffer *buf, uint64_t data0,
                               bool wrap, const char *path) {
  nb_shape s = {.ndim = e->ndim};
  memcpy(s.dims, e->dims, sizeof s.dims);
  uint64_t at = data0 + e->begin, bytes = e->end - e->begin;
  size_t es = nb_dtype_size(dt);
  const unsigned char *src = (const unsigned char *)buf->data + at;
  if (dt == NB_BOOL)
    for (uint64_t j = 0; j < bytes; j++)
      if (src[j] > 1) {
        nbi_error(NB_ERR_IO, LOAD ": %s: tensor \"%s\": BOOL element %llu is %u (must be 0 or 1)",
                  path, e->name, (unsigned long long)j, src[j]);
        return NULL;
      }
  if (wrap && bytes && at % es == 0) return nbi_leaf_wrap(LOAD, buf, (int64_t)(at / es), &s, dt);
  if (bytes && ((uintptr_t)src % es)) { /* misaligned: through an aligned copy */
    void *tmp = malloc(bytes);
    if (!tmp) {
      nbi_error(NB_ERR_OOM, LOAD ": %s: out of memory", path);
      return NULL;
    }
    memcpy(tmp, src, bytes);
    nb_tensor *x = nb_from_data(tmp, s, dt);
    free(tmp);
    return x;
  }
  return nb_from_data(src, s, dt);
}

static nb_tree *load(const char *path, int fd, size_t size, char ***meta_out, int *n_meta_out) {
  char err[512];
  if (size < 8) {
    snprintf(err, sizeof err, "file is %zu bytes, shorter than the 8-byte header length", size);
    io_error(LOAD, path, err);
    return NULL;
  }
  mapping *m = map_file(path, fd, size);
  if (!m) return NULL;
  const unsigned char *b = m->base;
  uint64_t hn = 0;
  for (int k = 7; k >= 0; k--)
    hn = hn << 8 | b[k];
  if (hn > NBI_ST_MAX_HEADER || hn > size - 8) {
    snprintf(err, sizeof err, "header length %llu %s", (unsigned long long)hn,
             hn > NBI_ST_MAX_HEADER ? "exceeds the format's limit of 100000000 bytes"
                                    : "exceeds the file's size");
    mapping_free(m);
    io_error(LOAD, path, err);
    return NULL;
  }
  nbi_buffer *buf = nbi_buffer_wrap(m->base, m->len, mapping_free, m);
  if (!buf) {
    mapping_free(m);
    return NULL;
  }
  nbi_st_header hd;
  nb_tree *tree = NULL;
  nbi_st_entry **order = NULL;
  nb_dtype *dts = NULL;
  if (!nbi_st_parse((const char *)b + 8, (size_t)hn, &hd, err, sizeof err)) {
    io_error(LOAD, path, err);
    goto out_buf;
  }
  order = malloc(sizeof *order * (size_t)(hd.n + 1));
  dts = malloc(sizeof *dts * (size_t)(hd.n + 1));
  if (!order || !dts) {
    nbi_error(NB_ERR_OOM, LOAD ": %s: out of memory", path);
    goto out;
  }
  if (!validate(&hd, size - 8 - hn, order, dts, err, sizeof err)) {
    io_error(LOAD, path, err);
    goto out;
  }
  tree = nb_tree_create();
  if (!tree) goto out;
  bool wrap = nb_default_device().kind == NB_DEVICE_CPU;
  for (int k = 0; k < hd.n; k++) {
    const nbi_st_entry *e = order[k];
    nb_tensor *x = entry_tensor(e, dts[e - hd.e], buf, 8 + hn, wrap, path);
    if (!x || nb_tree_set(tree, e->name, x)) {
      nb_tree_release(tree);
      tree = NULL;
      goto out;
    }
  }
  if (meta_out) { /* one block: the pointers, then the strings */
    size_t bytes = sizeof(char *) * (size_t)(2 * hd.n_meta);
    for (int k = 0; k < 2 * hd.n_meta; k++)
      bytes += strlen(hd.meta[k]) + 1;
    char **kv = hd.n_meta ? malloc(bytes) : NULL;
    if (hd.n_meta && !kv) {
      nbi_error(NB_ERR_OOM, LOAD ": %s: out of memory", path);
      nb_tree_release(tree);
      tree = NULL;
      goto out;
    }
    char *str = (char *)(kv + 2 * hd.n_meta);
    for (int k = 0; k < 2 * hd.n_meta; k++) {
      size_t len = strlen(hd.meta[k]) + 1;
      memcpy(str, hd.meta[k], len);
      kv[k] = str;
      str += len;
    }
    *meta_out = kv;
    *n_meta_out = hd.n_meta;
  }
out:
  nbi_st_header_free(&hd);
out_buf:
  free(order);
  free(dts);
  nbi_buffer_release(buf); /* the mapping lives on in the tensors that wrap it */
  return tree;
}

nb_tree *nb_load_safetensors_meta(const char *path, char ***metadata_kv, int *n_metadata) {
  if (metadata_kv) *metadata_kv = NULL;
  if (n_metadata) *n_metadata = 0;
  if (!path) {
    nbi_error(NB_ERR_NULL, LOAD ": path is NULL");
    return NULL;
  }
  if (!metadata_kv != !n_metadata) {
    nbi_error(NB_ERR_NULL, LOAD ": metadata_kv and n_metadata are both NULL or both not");
    return NULL;
  }
  if (!little_endian()) {
    io_error(LOAD, path, "big-endian hosts are not supported");
    return NULL;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    io_error(LOAD, path, strerror(errno));
    return NULL;
  }
  struct stat sb;
  nb_tree *t = NULL;
  if (fstat(fd, &sb))
    io_error(LOAD, path, strerror(errno));
  else if (!S_ISREG(sb.st_mode))
    io_error(LOAD, path, "not a regular file");
  else if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX / 2)
    io_error(LOAD, path, "file too large");
  else
    t = load(path, fd, (size_t)sb.st_size, metadata_kv, n_metadata);
  close(fd);
  return t;
}

nb_tree *nb_load_safetensors(const char *path) {
  return nb_load_safetensors_meta(path, NULL, NULL);
}
