/* src/sharding/mesh.c — device meshes: the "x=4,y=2" text, device lists
 * (virtual CPU devices), reference counts, and (sub-)axis coordinates. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#include "sharding.h"

#define MESH_MAX_DEVICES 4096

/* Parses the mesh text into m's axes (names, sizes, n_axes) and its canonical
 * text. Errors quote the text and point at the problem. */
static nb_status parse_axes(const char *fn, const char *text, nb_mesh *m) {
  const char *p = text;
  int64_t n_dev = 1;
  m->n_axes = 0;
  for (;;) {
    while (isspace((unsigned char)*p))
      p++;
    if (!isalpha((unsigned char)*p)) {
      if (!*p && m->n_axes == 0)
        return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": no axes", fn, text);
      return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": expected an axis name at column %d", fn,
                       text, (int)(p - text) + 1);
    }
    const char *name = p;
    while (isalnum((unsigned char)*p) || *p == '_')
      p++;
    size_t len = (size_t)(p - name);
    if (len >= NBI_AXIS_NAME_MAX)
      return nbi_error(NB_ERR_SHARDING,
                       "%s: \"%.200s\": axis name %.*s... is longer than %d characters", fn, text,
                       16, name, NBI_AXIS_NAME_MAX - 1);
    if (nbi_mesh_axis(m, name, len) >= 0)
      return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": axis %.*s appears twice", fn, text,
                       (int)len, name);
    if (m->n_axes == NBI_MESH_MAX_AXES)
      return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": more than %d axes", fn, text,
                       NBI_MESH_MAX_AXES);
    while (isspace((unsigned char)*p))
      p++;
    if (*p != '=')
      return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": expected '=' after axis %.*s", fn, text,
                       (int)len, name);
    p++;
    while (isspace((unsigned char)*p))
      p++;
    if (!isdigit((unsigned char)*p))
      return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": expected a size after %.*s=", fn, text,
                       (int)len, name);
    int64_t size = 0;
    while (isdigit((unsigned char)*p)) {
      if (size <= MESH_MAX_DEVICES) size = size * 10 + (*p - '0');
      p++;
    }
    if (size < 1)
      return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": axis %.*s has size 0 (sizes are >= 1)", fn,
                       text, (int)len, name);
    n_dev = size > MESH_MAX_DEVICES ? MESH_MAX_DEVICES + 1 : n_dev * size;
    if (n_dev > MESH_MAX_DEVICES)
      return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": more than %d devices", fn, text,
                       MESH_MAX_DEVICES);
    memcpy(m->name[m->n_axes], name, len);
    m->name[m->n_axes][len] = '\0';
    m->size[m->n_axes] = size;
    m->n_axes++;
    while (isspace((unsigned char)*p))
      p++;
    if (!*p) break;
    if (*p != ',')
      return nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\": expected ',' or the end at column %d", fn,
                       text, (int)(p - text) + 1);
    p++;
  }
  m->n_dev = (int)n_dev;
  size_t off = 0;
  for (int i = 0; i < m->n_axes; i++)
    off += (size_t)snprintf(m->text + off, sizeof m->text - off, "%s%s=%lld", i ? "," : "",
                            m->name[i], (long long)m->size[i]);
  return NB_OK;
}

static nb_mesh *mesh_new(const char *fn, const char *axes, const nb_device *devs, int n,
                         bool n_from_axes) {
  if (!axes) {
    nbi_error(NB_ERR_NULL, "%s: axes is NULL", fn);
    return NULL;
  }
  nb_mesh *m = calloc(1, sizeof *m);
  if (!m) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  if (parse_axes(fn, axes, m)) goto fail;
  if (n_from_axes) n = m->n_dev;
  if (n != m->n_dev) {
    nbi_error(NB_ERR_SHARDING, "%s: \"%.200s\" has %d devices, %d given", fn, axes, m->n_dev, n);
    goto fail;
  }
  m->dev = malloc((size_t)n * sizeof *m->dev);
  m->dev_table = malloc((size_t)n * sizeof *m->dev_table);
  if (!m->dev || !m->dev_table) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    m->dev[i] = devs ? devs[i] : NB_CPU;
    if ((m->dev_table[i] = nbi_device_lookup(fn, m->dev[i])) < 0) goto fail;
  }
  m->refcount = 1;
  m->n_ranks = 1;
  m->per_rank = n;
  return m;
fail:
  free(m->dev);
  free(m->dev_table);
  free(m);
  return NULL;
}

nb_mesh *nbi_mesh_new(const char *fn, const char *axes, const nb_device *devs, int n) {
  return mesh_new(fn, axes, devs, n, !devs && n <= 0);
}

nb_mesh *nb_mesh_cpu(const char *axes) { return mesh_new("nb_mesh_cpu", axes, NULL, 0, true); }

nb_mesh *nb_mesh_create(const char *axes, const nb_device *devs, int n) {
  if (!devs) {
    nbi_error(NB_ERR_NULL, "nb_mesh_create: devs is NULL");
    return NULL;
  }
  return mesh_new("nb_mesh_create", axes, devs, n, false);
}

nb_mesh *nb_mesh_retain(nb_mesh *m) {
  if (m) NBI_REF_INC(m);
  return m;
}

void nb_mesh_release(nb_mesh *m) {
  if (!m || NBI_REF_DEC(m) > 0) return;
  free(m->dev);
  free(m->dev_table);
  free(m);
}

nb_tensor *nbi_place(const nb_mesh *m, int d, nb_tensor *t) {
  if (!t || t->device == m->dev_table[d]) return t;
  return nb_to_device(t, m->dev[d]);
}

nb_status nbi_place_all(const nb_mesh *m, nb_tensor **t) {
  int n = m->n_dev;
  bool moves = false;
  for (int d = 0; d < n && !moves; d++)
    moves = t[d]->device != m->dev_table[d];
  if (!moves) return NB_OK;
  nb_tensor **was = malloc(sizeof *was * (size_t)n);
  if (!was) return nbi_error(NB_ERR_OOM, "nb_shard: out of memory");
  memcpy(was, t, sizeof *was * (size_t)n);
  nb_status st = NB_OK;
  for (int d = 0; d < n && !st; d++) {
    int e = 0; /* an earlier device with the same object and physical device */
    while (e < d && !(was[e] == was[d] && m->dev_table[e] == m->dev_table[d]))
      e++;
    t[d] = e < d ? t[e] : nbi_place(m, d, was[d]);
    if (!t[d]) st = nb_last_status();
  }
  free(was);
  return st;
}

int nb_mesh_n_devices(const nb_mesh *m) {
  if (!m) {
    nbi_error(NB_ERR_NULL, "nb_mesh_n_devices: mesh is NULL");
    return 0;
  }
  return m->n_dev;
}

const char *nb_mesh_str(const nb_mesh *m) {
  if (!m) {
    nbi_error(NB_ERR_NULL, "nb_mesh_str: mesh is NULL");
    return "";
  }
  return m->text;
}

int nbi_mesh_axis(const nb_mesh *m, const char *name, size_t len) {
  for (int i = 0; i < m->n_axes; i++)
    if (strlen(m->name[i]) == len && memcmp(m->name[i], name, len) == 0) return i;
  return -1;
}

int64_t nbi_axis_coord(const nb_mesh *m, const nbi_axis *a, int dev) {
  int64_t stride = 1; /* devices between consecutive coordinates of axis a->axis */
  for (int i = m->n_axes - 1; i > a->axis; i--)
    stride *= m->size[i];
  int64_t n = m->size[a->axis];
  int64_t coord = ((int64_t)dev / stride) % n;
  return coord / (n / (a->pre * a->size)) % a->size;
}

/* Two (sub-)axes of one axis are independent when one ends (pre * size) where
 * the other's major part (pre) is a multiple of that end: their coordinates are
 * then disjoint digits of one mixed-radix split of the axis. Anything else
 * (overlapping ranges, or splits that do not nest, such as x:(1)2 and x:(3)2 of
 * x=6) shares coordinates. */
bool nbi_axis_overlap(const nbi_axis *a, const nbi_axis *b) {
  if (a->axis != b->axis) return false;
  if (nbi_axis_eq(a, b)) return true;
  int64_t end_a = a->pre * a->size, end_b = b->pre * b->size;
  return !(b->pre % end_a == 0 || a->pre % end_b == 0);
}

bool nbi_axis_eq(const nbi_axis *a, const nbi_axis *b) {
  return a->axis == b->axis && a->pre == b->pre && a->size == b->size;
}

nbi_axis nbi_axis_whole(const nb_mesh *m, int i) {
  return (nbi_axis){.axis = i, .pre = 1, .size = m->size[i]};
}
