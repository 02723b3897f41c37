/* test/test_io.c — safetensors (include/nabla/io.h): files written by Python's
 * safetensors package (test/golden/st_*.safetensors, gen_safetensors.py)
 * load with the right names, dtypes, shapes, values and metadata; trees
 * round-trip bit for bit; loads wrap the memory map when they may and the
 * map outlives the file and the tree; a table of malformed files each gives
 * NB_ERR_IO naming the file and the problem. Set NABLA_TEST_ST_OUT=FILE to
 * keep the file io/save_for_python writes, for `gen_safetensors.py verify`. */
#include "common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(io, .init = tc_setup, .fini = tc_teardown);

/* ---- helpers ------------------------------------------------------------------------- */
/* test/golden/<name> */
static void golden_path(char *out, size_t cap, const char *name) {
  const char *src = __FILE__, *slash = strrchr(src, '/');
  snprintf(out, cap, "%.*sgolden/%s", slash ? (int)(slash - src + 1) : 0, src, name);
}

/* A fresh directory for one test's files, and a path in it. */
typedef struct tmpdir {
  char dir[64];
  char path[16][128];
  int n;
} tmpdir;

static void tmp_open(tmpdir *t) {
  snprintf(t->dir, sizeof t->dir, "/tmp/nabla_io_XXXXXX");
  cr_assert(mkdtemp(t->dir), "mkdtemp failed");
  t->n = 0;
}

static const char *tmp_path(tmpdir *t, const char *name) {
  cr_assert(t->n < 16);
  char dir[64];
  memcpy(dir, t->dir, sizeof dir);
  snprintf(t->path[t->n], sizeof t->path[0], "%s/%s", dir, name);
  return t->path[t->n++];
}

static void tmp_close(tmpdir *t) {
  for (int k = 0; k < t->n; k++)
    unlink(t->path[k]);
  cr_assert_eq(rmdir(t->dir), 0, "%s not empty", t->dir);
}

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert(f);
  cr_assert_eq(fwrite(p, 1, n, f), n);
  fclose(f);
}

/* The formulas of gen_safetensors.py (value): element i of a golden tensor. */
static void st_store(void *buf, nb_dtype dt, int64_t i) {
  uint64_t u = (uint64_t)i;
  switch (dt) {
  case NB_F32:
  case NB_F64:
  case NB_F16:
  case NB_BF16: nbi_store_f64(buf, dt, i, (double)((i * 7) % 23 - 11) / 8.0); break;
  case NB_I32:
    nbi_store_i64(buf, dt, i, (int64_t)((u * 1000003u) % 4294967296u) - 2147483648);
    break;
  case NB_I64:
    nbi_store_i64(buf, dt, i, (int64_t)((u * 0x9E3779B97F4A7C15ull) ^ (1ull << 63)));
    break;
  case NB_BOOL: nbi_store_i64(buf, dt, i, i % 3 == 0); break;
  case NB_U8: nbi_store_i64(buf, dt, i, (i * 37 + 11) % 256); break;
  case NB_I8: nbi_store_i64(buf, dt, i, (i * 37 + 11) % 256 - 128); break;
  case NB_I16: nbi_store_i64(buf, dt, i, (i * 4099 + 7) % 65536 - 32768); break;
  default: cr_assert_fail("st_store: dtype %s", nb_dtype_name(dt));
  }
}

/* A tensor of the golden formula. */
static nb_tensor *st_tensor(nb_shape s, nb_dtype dt) {
  int64_t n = tc_numel(s);
  void *buf = malloc((size_t)(n ? n : 1) * 8);
  for (int64_t i = 0; i < n; i++)
    st_store(buf, dt, i);
  nb_tensor *x = nb_from_data(buf, s, dt);
  free(buf);
  cr_assert(x, "%s", nb_last_error());
  return x;
}

/* x's bytes equal want's (dtype, shape and contents). */
static void assert_same(nb_tensor *x, nb_tensor *want, const char *name) {
  cr_assert(x, "%s missing", name);
  cr_assert_eq(nb_dtype_of(x), nb_dtype_of(want), "%s: dtype %s, want %s", name,
               nb_dtype_name(nb_dtype_of(x)), nb_dtype_name(nb_dtype_of(want)));
  nb_shape a = nb_shape_of(x), b = nb_shape_of(want);
  cr_assert(nbi_shape_eq(&a, &b), "%s: shape differs", name);
  size_t bytes = (size_t)nb_numel(x) * nb_dtype_size(nb_dtype_of(x));
  char *p = malloc(bytes + 1), *q = malloc(bytes + 1);
  cr_assert_eq(nb_to_host(x, p, bytes), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_to_host(want, q, bytes), NB_OK, "%s", nb_last_error());
  cr_assert(!memcmp(p, q, bytes), "%s: values differ", name);
  free(p), free(q);
}

/* Whether x wraps a memory map (an external buffer), not a copy. */
static bool wraps_map(nb_tensor *x) { return x->shard0.buf && x->shard0.buf->ext_free; }

static const char *meta_get(char **kv, int n, const char *key) {
  for (int k = 0; k < n; k++)
    if (!strcmp(kv[2 * k], key)) return kv[2 * k + 1];
  return NULL;
}

/* ---- files from Python ---------------------------------------------------------------- */
static const struct {
  const char *name;
  nb_dtype dt;
  int ndim;
  int64_t dims[3];
} GOLDEN_DTYPES[] = {
    {"x.f32", NB_F32, 2, {2, 3}},    {"x.f64", NB_F64, 1, {5}},
    {"x.f16", NB_F16, 3, {3, 1, 2}}, {"x.bf16", NB_BF16, 1, {7}},
    {"x.i32", NB_I32, 1, {4}},       {"x.i64", NB_I64, 2, {2, 2}},
    {"x.bool", NB_BOOL, 1, {9}},     {"scalar", NB_F32, 0, {0}},
    {"empty", NB_F32, 2, {0, 3}},    {"h.0.attn.w_q", NB_F32, 2, {4, 4}},
};
enum { N_GOLDEN_DTYPES = sizeof GOLDEN_DTYPES / sizeof GOLDEN_DTYPES[0] };

Test(io, golden_file_from_python) {
  char path[1024];
  golden_path(path, sizeof path, "st_dtypes.safetensors");
  char **kv;
  int n_kv;
  nb_tree *t = nb_load_safetensors_meta(path, &kv, &n_kv);
  cr_assert(t, "%s", nb_last_error());
  cr_assert_eq(nb_tree_len(t), N_GOLDEN_DTYPES);
  bool cpu = nb_default_device().kind == NB_DEVICE_CPU;
  for (int k = 0; k < N_GOLDEN_DTYPES; k++) {
    nb_shape s = {.ndim = GOLDEN_DTYPES[k].ndim};
    memcpy(s.dims, GOLDEN_DTYPES[k].dims, sizeof GOLDEN_DTYPES[k].dims);
    nb_tensor *x = nb_tree_get(t, GOLDEN_DTYPES[k].name);
    assert_same(x, st_tensor(s, GOLDEN_DTYPES[k].dt), GOLDEN_DTYPES[k].name);
    /* every non-empty tensor wraps the map on the CPU (Python aligns them) */
    if (tc_numel(s)) cr_assert_eq(wraps_map(x), cpu, "%s", GOLDEN_DTYPES[k].name);
    cr_assert(nb_device_of(x).kind == nb_default_device().kind);
  }
  /* tree order is the order of the data: offsets increase */
  cr_assert_eq(n_kv, 2);
  cr_assert_str_eq(meta_get(kv, n_kv, "format"), "pt");
  cr_assert_str_eq(meta_get(kv, n_kv, "note"),
                   "quote \" backslash \\ tab \t unicode \xc3\xa9\xe4\xb8\xad");
  free(kv);
  /* computing on wrapped tensors */
  nb_tensor *y = nb_sum(nb_mul(nb_tree_get(t, "x.f32"), nb_scalar(2, NB_F32)), NB_ALL, false);
  double want = 0;
  for (int i = 0; i < 6; i++)
    want += 2 * ((i * 7) % 23 - 11) / 8.0;
  cr_assert_eq(nb_item(y), want);
  nb_tree_release(t);
}

Test(io, golden_small_ints_from_python) {
  char path[1024];
  golden_path(path, sizeof path, "st_small_ints.safetensors");
  char **kv;
  int n_kv;
  nb_tree *t = nb_load_safetensors_meta(path, &kv, &n_kv);
  cr_assert(t, "%s", nb_last_error());
  cr_assert(!kv && n_kv == 0); /* written without metadata */
  cr_assert_eq(nb_tree_len(t), 4);
  assert_same(nb_tree_get(t, "u8"), st_tensor(NB_SHAPE(300), NB_U8), "u8");
  assert_same(nb_tree_get(t, "i8"), st_tensor(NB_SHAPE(2, 150), NB_I8), "i8");
  assert_same(nb_tree_get(t, "i16"), st_tensor(NB_SHAPE(3, 5), NB_I16), "i16");
  assert_same(nb_tree_get(t, "u8_scalar"), st_tensor(NB_SCALAR_SHAPE, NB_U8), "u8_scalar");
  /* u8 data computes: the sum of 300 values in i64 */
  int64_t want = 0;
  for (int i = 0; i < 300; i++)
    want += (i * 37 + 11) % 256;
  cr_assert_eq(nb_item(nb_sum(nb_tree_get(t, "u8"), NB_ALL, false)), (double)want);
  nb_tree_release(t);
}

/* ---- round trips -------------------------------------------------------------------------- */
static nb_tree *every_dtype_tree(void) {
  nb_tree *t = nb_tree_create();
  const nb_dtype dts[] = {NB_F32, NB_F64,  NB_F16, NB_BF16, NB_I32,
                          NB_I64, NB_BOOL, NB_U8,  NB_I8,   NB_I16};
  uint64_t seed = 7;
  for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
    char name[32];
    snprintf(name, sizeof name, "layer.%zu.%s", k, nb_dtype_name(dts[k]));
    nb_shape s = NB_SHAPE(3, (int64_t)k + 1);
    double *v = dts[k] == NB_BOOL          ? tc_rand_ints(tc_numel(s), NB_I32, &seed, 2)
                : nbi_dtype_is_int(dts[k]) ? tc_rand_ints(tc_numel(s), dts[k], &seed, 100)
                                           : tc_rand_floats(tc_numel(s), dts[k], &seed);
    cr_assert_eq(nb_tree_set(t, name, tc_tensor(v, s, dts[k])), NB_OK);
    free(v);
  }
  cr_assert_eq(nb_tree_set(t, "zero_d", nb_scalar(-2.5, NB_F64)), NB_OK);
  cr_assert_eq(nb_tree_set(t, "empty", nb_zeros(NB_SHAPE(4, 0, 2), NB_I64)), NB_OK);
  cr_assert_eq(nb_tree_set(t, "quote\"back\\slash", nb_ones(NB_SHAPE(1), NB_F16)), NB_OK);
  /* a pending tensor: saving realizes it */
  cr_assert_eq(nb_tree_set(t, "pending", nb_exp(nb_arange(0, 5, 1, NB_F32))), NB_OK);
  return t;
}

Test(io, round_trip_every_dtype) {
  tmpdir d;
  tmp_open(&d);
  const char *p = tmp_path(&d, "a.safetensors");
  nb_tree *t = every_dtype_tree();
  const char *kv[] = {"k", "v", "empty", "", "ctl", "line\nbreak\x01"};
  cr_assert_eq(nb_save_safetensors(p, t, kv, 3), NB_OK, "%s", nb_last_error());
  char **got_kv;
  int n_kv;
  nb_tree *u = nb_load_safetensors_meta(p, &got_kv, &n_kv);
  cr_assert(u, "%s", nb_last_error());
  cr_assert_eq(nb_tree_len(u), nb_tree_len(t));
  for (int i = 0; i < nb_tree_len(t); i++) { /* tree order is kept */
    cr_assert_str_eq(nb_tree_name(u, i), nb_tree_name(t, i));
    assert_same(nb_tree_at(u, i), nb_tree_at(t, i), nb_tree_name(t, i));
  }
  cr_assert_eq(n_kv, 3);
  for (int k = 0; k < 3; k++) {
    cr_assert_str_eq(got_kv[2 * k], kv[2 * k]);
    cr_assert_str_eq(got_kv[2 * k + 1], kv[2 * k + 1]);
  }
  free(got_kv);
  /* the layout Python writes: header length a multiple of 8, padded with spaces */
  FILE *f = fopen(p, "rb");
  unsigned char len[8];
  cr_assert_eq(fread(len, 1, 8, f), 8u);
  uint64_t hn = 0;
  for (int k = 7; k >= 0; k--)
    hn = hn << 8 | len[k];
  cr_assert_eq(hn % 8, 0u);
  char *h = malloc(hn + 1);
  cr_assert_eq(fread(h, 1, hn, f), hn);
  h[hn] = 0;
  fclose(f);
  cr_assert(!strncmp(h, "{\"__metadata__\":{\"k\":\"v\"", 24), "%s", h);
  char *end = strrchr(h, '}');
  for (char *c = end + 1; *c; c++)
    cr_assert_eq(*c, ' ');
  free(h);
  /* an empty tree, and saving over a file whose tensors are alive */
  nb_tree *e = nb_tree_create();
  cr_assert_eq(nb_save_safetensors(p, e, NULL, 0), NB_OK);
  assert_same(nb_tree_at(u, 0), nb_tree_at(t, 0), "after overwrite");
  nb_tree *ee = nb_load_safetensors_meta(p, &got_kv, &n_kv);
  cr_assert(ee, "%s", nb_last_error());
  cr_assert_eq(nb_tree_len(ee), 0);
  cr_assert(!got_kv && n_kv == 0); /* no metadata */
  nb_tree_release(e), nb_tree_release(ee), nb_tree_release(u), nb_tree_release(t);
  tmp_close(&d);
}

/* The file gen_safetensors.py verify reads (its `verify` lists the same tensors). */
Test(io, save_for_python) {
  tmpdir d;
  tmp_open(&d);
  const char *env = getenv("NABLA_TEST_ST_OUT");
  const char *p = env ? env : tmp_path(&d, "for_python.safetensors");
  nb_tree *t = nb_tree_create();
  const struct {
    const char *name;
    nb_dtype dt;
    nb_shape s;
  } e[] = {{"a.f32", NB_F32, NB_SHAPE(2, 3)}, {"a.f64", NB_F64, NB_SHAPE(4)},
           {"a.f16", NB_F16, NB_SHAPE(3)},    {"a.bf16", NB_BF16, NB_SHAPE(2, 2)},
           {"a.i32", NB_I32, NB_SHAPE(5)},    {"a.i64", NB_I64, NB_SHAPE(3)},
           {"a.bool", NB_BOOL, NB_SHAPE(7)},  {"s", NB_F64, NB_SCALAR_SHAPE},
           {"b.u8", NB_U8, NB_SHAPE(9)},      {"b.i8", NB_I8, NB_SHAPE(9)},
           {"b.i16", NB_I16, NB_SHAPE(2, 3)}, {"e", NB_I32, NB_SHAPE(0)}};
  for (size_t k = 0; k < sizeof e / sizeof e[0]; k++)
    cr_assert_eq(nb_tree_set(t, e[k].name, st_tensor(e[k].s, e[k].dt)), NB_OK);
  const char *kv[] = {"writer", "nabla", "utf8", "\xc3\xa9"};
  cr_assert_eq(nb_save_safetensors(p, t, kv, 2), NB_OK, "%s", nb_last_error());
  nb_tree *u = nb_load_safetensors(p);
  cr_assert(u, "%s", nb_last_error());
  for (size_t k = 0; k < sizeof e / sizeof e[0]; k++)
    assert_same(nb_tree_get(u, e[k].name), nb_tree_get(t, e[k].name), e[k].name);
  nb_tree_release(u), nb_tree_release(t);
  tmp_close(&d);
}

/* ---- the memory map ------------------------------------------------------------------------ */
Test(io, map_outlives_tree_and_file) {
  tmpdir d;
  tmp_open(&d);
  const char *p = tmp_path(&d, "m.safetensors");
  nb_tree *t = nb_tree_create();
  nb_tensor *w = st_tensor(NB_SHAPE(64, 33), NB_F32);
  cr_assert_eq(nb_tree_set(t, "w", w), NB_OK);
  cr_assert_eq(nb_tree_set(t, "b", st_tensor(NB_SHAPE(3), NB_I64)), NB_OK);
  cr_assert_eq(nb_save_safetensors(p, t, NULL, 0), NB_OK);
  uint64_t live0 = nb_get_stats().live_bytes;
  nb_scope_begin(); /* the loaded tensors are also in the caller's scope */
  nb_tree *u = nb_load_safetensors(p);
  cr_assert(u, "%s", nb_last_error());
  nb_tensor *x = nb_retain(nb_tree_get(u, "w"));
  bool cpu = nb_default_device().kind == NB_DEVICE_CPU;
  cr_assert_eq(wraps_map(x), cpu);
  if (cpu) { /* one map for the whole file, counted once */
    cr_assert_eq(x->shard0.buf, nb_tree_get(u, "b")->shard0.buf);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(nb_get_stats().live_bytes - live0, (uint64_t)sb.st_size);
  }
  nb_tree_release(u);
  nb_scope_end();
  cr_assert_eq(unlink(p), 0); /* the map keeps the data */
  d.n = 0;
  assert_same(x, w, "w after the tree and the file went");
  /* writing a wrapped tensor changes this process's copy only */
  nb_scope_begin();
  cr_assert_eq(nb_assign(x, nb_add(x, nb_scalar(1, NB_F32))), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_item(nb_sum(nb_sub(x, w), NB_ALL, false)), 64 * 33);
  nb_scope_end();
  nb_release(x); /* the last reference to the map */
  if (cpu) cr_assert_eq(nb_get_stats().live_bytes, live0);
  nb_tree_release(t);
  tmp_close(&d);
}

Test(io, unaligned_data_is_copied) {
  /* header of 9 bytes + an 8-byte length: the f32 data starts at byte 17 + 1 */
  tmpdir d;
  tmp_open(&d);
  const char *p = tmp_path(&d, "u.safetensors");
  const char *h = "{\"b\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]},"
                  "\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[1,13]}}";
  size_t hn = strlen(h);
  unsigned char file[512] = {0};
  for (int k = 0; k < 8; k++)
    file[k] = (unsigned char)((uint64_t)hn >> (8 * k));
  memcpy(file + 8, h, hn);
  file[8 + hn] = 1;
  float v[3] = {1.5f, -2.25f, 1e30f};
  memcpy(file + 8 + hn + 1, v, sizeof v);
  write_bytes(p, file, 8 + hn + 13);
  nb_tree *t = nb_load_safetensors(p);
  cr_assert(t, "%s", nb_last_error());
  nb_tensor *x = nb_tree_get(t, "x");
  bool aligned = (8 + hn + 1) % 4 == 0;
  cr_assert_eq(wraps_map(x), aligned && nb_default_device().kind == NB_DEVICE_CPU);
  float got[3];
  cr_assert_eq(nb_to_host(x, got, sizeof got), NB_OK);
  cr_assert(!memcmp(got, v, sizeof v));
  cr_assert_eq(nb_item(nb_tree_get(t, "b")), 1);
  cr_assert_str_eq(nb_tree_name(t, 0), "b"); /* data order */
  nb_tree_release(t);
  tmp_close(&d);
}

/* ---- malformed files ---------------------------------------------------------------------- */
/* A file of an 8-byte length (hn, or the header's length when hn < 0), the
 * header, then data_bytes bytes of 0x01. */
static void write_st(const char *path, int64_t hn, const char *header, size_t data_bytes) {
  size_t n = strlen(header);
  unsigned char *b = malloc(8 + n + data_bytes + 1);
  uint64_t len = hn < 0 ? n : (uint64_t)hn;
  for (int k = 0; k < 8; k++)
    b[k] = (unsigned char)(len >> (8 * k));
  memcpy(b + 8, header, n);
  memset(b + 8 + n, 1, data_bytes);
  write_bytes(path, b, 8 + n + data_bytes);
  free(b);
}

#define T1(name, dt, shape, off)                                                                   \
  "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}"

Test(io, malformed_files_are_io_errors) {
  static const struct {
    const char *what;
    int64_t hn; /* -1: the header's length */
    const char *header;
    size_t data;
    const char *want;
  } cases[] = {
      {"ok (control)", -1, "{" T1("a", "F32", "[2]", "[0,8]") "}", 8, NULL},
      {"truncated data", -1, "{" T1("a", "F32", "[2]", "[0,8]") "}", 5, "file too short"},
      {"trailing bytes", -1, "{" T1("a", "F32", "[2]", "[0,8]") "}", 9, "trailing bytes"},
      {"header too big", 100000001, "{}", 0, "exceeds the format's limit of 100000000"},
      {"header longer than the file", 400, "{}", 0, "exceeds the file's size"},
      {"overlap", -1, "{" T1("a", "F32", "[2]", "[0,8]") "," T1("b", "F32", "[2]", "[4,12]") "}",
       12, "overlaps another"},
      {"gap", -1, "{" T1("a", "F32", "[1]", "[0,4]") "," T1("b", "F32", "[1]", "[8,12]") "}", 12,
       "gap in the data: bytes [4, 8)"},
      {"not starting at 0", -1, "{" T1("a", "F32", "[1]", "[4,8]") "}", 8, "gap in the data"},
      {"wrong size", -1, "{" T1("a", "F32", "[3]", "[0,8]") "}", 8,
       "span 8 bytes but F32 of 3 elements needs 12"},
      {"reversed offsets", -1, "{" T1("a", "F32", "[0]", "[8,0]") "}", 8, "reversed"},
      {"bad JSON: unterminated", -1, "{\"a\":{\"dtype\":\"F32\",", 0, "header byte"},
      {"bad JSON: trailing comma", -1, "{" T1("a", "F32", "[2]", "[0,8]") ",}", 8, "expected '\"'"},
      {"bad JSON: garbage after", -1, "{} x", 0, "bytes after the header's object"},
      {"bad JSON: not an object", -1, "[]", 0, "expected '{'"},
      {"bad JSON: empty header", -1, "", 0, "found the end of the header"},
      {"bad JSON: leading zero", -1, "{" T1("a", "F32", "[02]", "[0,8]") "}", 8, "leading zero"},
      {"bad JSON: fraction", -1, "{" T1("a", "F32", "[2.0]", "[0,8]") "}", 8, "not an integer"},
      {"bad JSON: negative", -1, "{" T1("a", "F32", "[-2]", "[0,8]") "}", 8, "negative number"},
      {"bad JSON: raw control char", -1, "{\"a\x01\":{}}", 0, "control character"},
      {"bad JSON: invalid UTF-8", -1, "{\"a\xff\":{}}", 0, "invalid UTF-8"},
      {"bad JSON: lone surrogate", -1, "{\"\\ud800\":{}}", 0, "unpaired surrogate"},
      {"bad JSON: NUL escape", -1, "{\"a\\u0000\":{}}", 0, "NUL character"},
      {"bad JSON: bad escape", -1, "{\"a\\q\":{}}", 0, "invalid escape"},
      {"bad dtype", -1, "{" T1("a", "F33", "[2]", "[0,8]") "}", 8, "unknown dtype \"F33\""},
      {"dtype nabla lacks", -1, "{" T1("a", "U16", "[2]", "[0,4]") "}", 4,
       "nabla has no tensors of dtype \"U16\""},
      {"F8", -1, "{" T1("a", "F8_E4M3", "[2]", "[0,2]") "}", 2,
       "nabla has no tensors of dtype \"F8_E4M3\""},
      {"unknown field", -1,
       "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":1}}", 4,
       "unknown field \"x\""},
      {"missing field", -1, "{\"a\":{\"dtype\":\"F32\",\"shape\":[]}}", 4,
       "lacks \"data_offsets\""},
      {"duplicate field", -1, "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\"}}", 0,
       "duplicate field"},
      {"three offsets", -1, "{" T1("a", "F32", "[1]", "[0,4,8]") "}", 4, "exactly two integers"},
      {"duplicate name", -1,
       "{" T1("a", "F32", "[1]", "[0,4]") "," T1("a", "F32", "[1]", "[4,8]") "}", 8,
       "tensor \"a\" appears twice"},
      {"duplicate metadata", -1, "{\"__metadata__\":{},\"__metadata__\":{}}", 0,
       "duplicate __metadata__"},
      {"metadata not a string", -1, "{\"__metadata__\":{\"k\":1}}", 0, "expected '\"'"},
      {"nine dims", -1, "{" T1("a", "F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4, "9 dimensions"},
      {"huge dims", -1, "{" T1("a", "F32", "[4294967296,4294967296]", "[0,4]") "}", 4,
       "shape too large"},
      {"dim past 2^63", -1, "{" T1("a", "F32", "[99999999999999999999]", "[0,4]") "}", 4,
       "shape too large"},
      {"offset past 2^63", -1, "{" T1("a", "F32", "[1]", "[0,99999999999999999999]") "}", 4,
       "beyond 2^63"},
      {"bad tree name", -1, "{" T1("a..b", "F32", "[1]", "[0,4]") "}", 4, "not a tree name"},
      {"bool byte 2", -1, "{" T1("a", "BOOL", "[1]", "[0,1]") "}", 0, "must be 0 or 1"},
  };
  tmpdir d;
  tmp_open(&d);
  const char *p = tmp_path(&d, "bad.safetensors");
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    if (!strcmp(cases[k].what, "bool byte 2")) {
      const char *h = "{" T1("a", "BOOL", "[1]", "[0,1]") "}";
      size_t n = strlen(h);
      unsigned char b[128] = {(unsigned char)n};
      memcpy(b + 8, h, n);
      b[8 + n] = 2;
      write_bytes(p, b, 8 + n + 1);
    } else {
      write_st(p, cases[k].hn, cases[k].header, cases[k].data);
    }
    nb_tree *t = nb_load_safetensors(p);
    if (!cases[k].want) {
      cr_assert(t, "%s: %s", cases[k].what, nb_last_error());
      nb_tree_release(t);
      continue;
    }
    cr_assert_null(t, "%s: loaded", cases[k].what);
    cr_assert_eq(nb_last_status(), NB_ERR_IO, "%s: status %s (%s)", cases[k].what,
                 nb_status_str(nb_last_status()), nb_last_error());
    cr_assert(strstr(nb_last_error(), p), "%s: message \"%s\" lacks the path", cases[k].what,
              nb_last_error());
    cr_assert(strstr(nb_last_error(), cases[k].want), "%s: message \"%s\" lacks \"%s\"",
              cases[k].what, nb_last_error(), cases[k].want);
    nb_clear_error();
  }
  /* files that are not safetensors files at all */
  write_bytes(p, "abc", 3);
  cr_assert_null(nb_load_safetensors(p));
  tc_assert_error(NB_ERR_IO, "shorter than the 8-byte header length");
  write_bytes(p, "", 0);
  cr_assert_null(nb_load_safetensors(p));
  tc_assert_error(NB_ERR_IO, "file is 0 bytes");
  cr_assert_null(nb_load_safetensors(d.dir));
  tc_assert_error(NB_ERR_IO, "not a regular file");
  cr_assert_null(nb_load_safetensors("/nonexistent/nabla.safetensors"));
  tc_assert_error(NB_ERR_IO, "No such file");
  cr_assert_null(nb_load_safetensors(NULL));
  tc_assert_error(NB_ERR_NULL, "path is NULL");
  tmp_close(&d);
}

Test(io, save_errors) {
  tmpdir d;
  tmp_open(&d);
  const char *p = tmp_path(&d, "s.safetensors");
  nb_tree *t = nb_tree_create();
  cr_assert_eq(nb_tree_set(t, "a", nb_zeros(NB_SHAPE(2), NB_F32)), NB_OK);
  cr_assert_eq(nb_save_safetensors(NULL, t, NULL, 0), NB_ERR_NULL);
  nb_clear_error();
  cr_assert_eq(nb_save_safetensors(p, NULL, NULL, 0), NB_ERR_NULL);
  nb_clear_error();
  cr_assert_eq(nb_save_safetensors(p, t, NULL, 1), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "metadata_kv is NULL");
  const char *dup[] = {"k", "1", "k", "2"};
  cr_assert_eq(nb_save_safetensors(p, t, dup, 2), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "metadata key \"k\" appears twice");
  const char *bad[] = {"k", "\xff"};
  cr_assert_eq(nb_save_safetensors(p, t, bad, 1), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "not valid UTF-8");
  cr_assert_eq(nb_save_safetensors("/nonexistent/dir/x.safetensors", t, NULL, 0), NB_ERR_IO);
  tc_assert_error(NB_ERR_IO, "No such file or directory");
  cr_assert_eq(nb_tree_set(t, "__metadata__", nb_zeros(NB_SHAPE(2), NB_F32)), NB_OK);
  cr_assert_eq(nb_save_safetensors(p, t, NULL, 0), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "reserved");
  cr_assert_eq(access(p, F_OK), -1); /* nothing written, no temporary left */
  nb_tree_release(t);
  tmp_close(&d);
}

/* Every truncation of a valid file, and random byte changes in its header:
 * each load either succeeds or fails with NB_ERR_IO (never a crash; under
 * make test SAN=1 never a sanitizer report). */
Test(io, mutated_files_never_crash) {
  char path[1024];
  golden_path(path, sizeof path, "st_dtypes.safetensors");
  FILE *f = fopen(path, "rb");
  cr_assert(f);
  unsigned char orig[4096];
  size_t n = fread(orig, 1, sizeof orig, f);
  fclose(f);
  cr_assert(n > 8 && n < sizeof orig);
  size_t hn = orig[0] | (size_t)orig[1] << 8;
  tmpdir d;
  tmp_open(&d);
  const char *p = tmp_path(&d, "m.safetensors");
  uint64_t seed = 99;
  int loaded = 0, failed = 0;
  for (int k = 0; k < (int)n + 600; k++) {
    unsigned char b[4096];
    size_t len = n;
    memcpy(b, orig, n);
    if (k < (int)n) {
      len = (size_t)k; /* a truncation */
    } else {
      int flips = 1 + (int)tc_randint(&seed, 0, 3);
      for (int j = 0; j < flips; j++) {
        size_t at = (size_t)tc_randint(&seed, 0, (int64_t)(8 + hn));
        static const char pick[] = "{}[]\",:0123456789-.eE \\u\x80\xff\x01";
        b[at] = tc_randint(&seed, 0, 2) ? (unsigned char)pick[tc_randint(&seed, 0, sizeof pick - 2)]
                                        : (unsigned char)tc_randint(&seed, 0, 256);
      }
    }
    write_bytes(p, b, len);
    nb_scope_begin();
    nb_tree *t = nb_load_safetensors(p);
    if (t) {
      loaded++;
      cr_assert(nb_tree_eval(&t, 1) == NB_OK, "%s", nb_last_error());
      nb_tree_release(t);
    } else {
      failed++;
      cr_assert_eq(nb_last_status(), NB_ERR_IO, "case %d: %s: %s", k,
                   nb_status_str(nb_last_status()), nb_last_error());
      nb_clear_error();
    }
    nb_scope_end();
  }
  cr_assert(failed > (int)n && loaded > 0, "loaded %d, failed %d", loaded, failed);
  tmp_close(&d);
}
