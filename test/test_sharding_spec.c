/* test/test_sharding_spec.c — meshes (src/sharding/mesh.c) and shardings
 * (src/sharding/spec.c): mesh texts and device lists, the spec grammar with
 * its canonical text (round trips on random shardings) and every error class,
 * sub-axis coordinates and overlaps against a brute-force enumeration of the
 * split, mixed-radix shard indices, and local blocks covering the tensor once
 * per replica. */
#include "common.h"

#include "../src/sharding/sharding.h"

TestSuite(sharding_spec, .init = tc_setup, .fini = tc_teardown);

static nb_mesh *mesh_ok(const char *text) {
  nb_mesh *m = nb_mesh_cpu(text);
  cr_assert_not_null(m, "nb_mesh_cpu(\"%s\"): %s", text, nb_last_error());
  return m;
}

/* Device dev's coordinate on mesh axis a, by enumerating the row-major grid. */
static int64_t grid_coord(const nb_mesh *m, int dev, int a) {
  int64_t c[NBI_MESH_MAX_AXES] = {0};
  for (int d = 0; d < m->n_dev; d++) {
    if (d == dev) return c[a];
    for (int i = m->n_axes - 1; i >= 0; i--) { /* odometer, last axis fastest */
      if (++c[i] < m->size[i]) break;
      c[i] = 0;
    }
  }
  cr_assert_fail("device %d is not on the mesh", dev);
  return -1;
}

/* ---- meshes ------------------------------------------------------------------------------ */

Test(sharding_spec, mesh_texts_parse_to_axes_and_canonical_text) {
  static const struct {
    const char *text, *canon;
    int n_axes, n_dev;
  } cases[] = {
      {"x=4,y=2", "x=4,y=2", 2, 8},
      {"  x = 4 ,\ty=2 ", "x=4,y=2", 2, 8},
      {"x=1", "x=1", 1, 1},
      {"data_parallel_1=2,tp=04", "data_parallel_1=2,tp=4", 2, 8},
      {"a=2,b=2,c=2", "a=2,b=2,c=2", 3, 8},
      {"a=1,b=2,c=1,d=2,e=1,f=2,g=1,h=2", "a=1,b=2,c=1,d=2,e=1,f=2,g=1,h=2", 8, 16},
      {"Abcdefghijklmnopqrstuvwxyz01234=3", "Abcdefghijklmnopqrstuvwxyz01234=3", 1, 3},
      {"x=4096", "x=4096", 1, 4096},
      {"x=64,y=64", "x=64,y=64", 2, 4096},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    nb_mesh *m = mesh_ok(cases[k].text);
    cr_expect_str_eq(nb_mesh_str(m), cases[k].canon);
    cr_expect_eq(m->n_axes, cases[k].n_axes, "%s", cases[k].text);
    cr_expect_eq(nb_mesh_n_devices(m), cases[k].n_dev, "%s", cases[k].text);
    for (int i = 0; i < m->n_dev; i++)
      cr_expect(m->dev[i].kind == NB_DEVICE_CPU && m->dev[i].index == 0);
    nb_mesh_release(m);
  }
  nb_mesh *m = mesh_ok("x=4,y=2");
  cr_expect_str_eq(m->name[0], "x");
  cr_expect_str_eq(m->name[1], "y");
  cr_expect_eq(m->size[0], 4);
  cr_expect_eq(m->size[1], 2);
  cr_expect_eq(nbi_mesh_axis(m, "y", 1), 1);
  cr_expect_eq(nbi_mesh_axis(m, "xy", 1), 0, "only the first len characters count");
  cr_expect_eq(nbi_mesh_axis(m, "xy", 2), -1);
  cr_expect_eq(nbi_mesh_axis(m, "z", 1), -1);
  nbi_axis w = nbi_axis_whole(m, 0);
  cr_expect(w.axis == 0 && w.pre == 1 && w.size == 4);
  nb_mesh_release(m);
}

Test(sharding_spec, invalid_mesh_texts_are_sharding_errors) {
  static const struct {
    const char *text, *msg;
  } cases[] = {
      {"x=4,x=2", "nb_mesh_cpu: \"x=4,x=2\": axis x appears twice"},
      {"", "nb_mesh_cpu: \"\": no axes"},
      {"   ", "no axes"},
      {"x=0", "nb_mesh_cpu: \"x=0\": axis x has size 0 (sizes are >= 1)"},
      {"x", "expected '=' after axis x"},
      {"x 4", "expected '=' after axis x"},
      {"x=", "expected a size after x="},
      {"x=-2", "expected a size after x="},
      {"1x=2", "expected an axis name at column 1"},
      {"_x=2", "expected an axis name at column 1"},
      {"x=2,", "expected an axis name at column 5"},
      {"x=2,,y=2", "expected an axis name at column 5"},
      {"x=2;y=2", "expected ',' or the end at column 4"},
      {"x-y=2", "expected '=' after axis x"},
      {"x=2 y=2", "expected ',' or the end at column 5"},
      {"a=1,b=1,c=1,d=1,e=1,f=1,g=1,h=1,i=1", "more than 8 axes"},
      {"Abcdefghijklmnopqrstuvwxyz012345=2", "is longer than 31 characters"},
      {"x=4097", "more than 4096 devices"},
      {"x=64,y=128", "more than 4096 devices"},
      {"x=99999999999999999999999", "more than 4096 devices"},
      {"x=2,y=3000,z=0", "more than 4096 devices"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    cr_expect_null(nb_mesh_cpu(cases[k].text), "%s", cases[k].text);
    tc_assert_error(NB_ERR_SHARDING, cases[k].msg);
  }
  cr_expect_null(nb_mesh_cpu(NULL));
  tc_assert_error(NB_ERR_NULL, "nb_mesh_cpu: axes is NULL");
  cr_expect_eq(nb_mesh_n_devices(NULL), 0);
  tc_assert_error(NB_ERR_NULL, "nb_mesh_n_devices");
  cr_expect_str_eq(nb_mesh_str(NULL), "");
  tc_assert_error(NB_ERR_NULL, "nb_mesh_str");
  cr_expect_null(nb_mesh_retain(NULL));
  nb_mesh_release(NULL);
  cr_expect_eq(nb_last_status(), NB_OK);
}

Test(sharding_spec, mesh_create_takes_available_devices_and_rejects_others) {
  nb_device devs[4] = {NB_CPU, NB_CPU, NB_CPU, NB_CPU};
  nb_mesh *m = nb_mesh_create("x=2,y=2", devs, 4);
  cr_assert_not_null(m, "%s", nb_last_error());
  cr_expect_eq(nb_mesh_n_devices(m), 4);
  cr_expect_str_eq(nb_mesh_str(m), "x=2,y=2");
  devs[0] = NB_CUDA(0); /* the mesh holds its own copy */
  cr_expect_eq(m->dev[0].kind, NB_DEVICE_CPU);
  cr_expect_eq(nb_mesh_retain(m), m);
  cr_expect_eq(m->refcount, 2);
  nb_mesh_release(m);
  cr_expect_eq(m->refcount, 1);
  nb_mesh_release(m);

  nb_device bad[4] = {NB_CPU, NB_CUDA(31), NB_CPU, NB_CPU};
  cr_expect_null(nb_mesh_create("x=4", bad, 4));
  tc_assert_error(NB_ERR_DEVICE, "nb_mesh_create: no device cuda:31");
  bad[1] = (nb_device){NB_DEVICE_CPU, 3};
  cr_expect_null(nb_mesh_create("x=4", bad, 4));
  tc_assert_error(NB_ERR_DEVICE, "nb_mesh_create: no device cpu:3");
  bad[1] = (nb_device){(nb_device_kind)7, 0};
  cr_expect_null(nb_mesh_create("x=4", bad, 4));
  tc_assert_error(NB_ERR_DEVICE, "no device ?:0");
  nb_device emu[4] = {NB_EMU(0), NB_EMU(1), NB_EMU(2), NB_EMU(3)};
  nb_mesh *e = nb_mesh_create("x=4", emu, 4);
  cr_assert_not_null(e, "%s", nb_last_error());
  nb_mesh_release(e);
  cr_expect_null(nb_mesh_create("x=2,y=2", devs + 1, 3));
  tc_assert_error(NB_ERR_SHARDING, "nb_mesh_create: \"x=2,y=2\" has 4 devices, 3 given");
  cr_expect_null(nb_mesh_create("x=2,y=2", devs, -1));
  tc_assert_error(NB_ERR_SHARDING, "has 4 devices, -1 given");
  cr_expect_null(nb_mesh_create("x=2,y=2", NULL, 4));
  tc_assert_error(NB_ERR_NULL, "nb_mesh_create: devs is NULL");
  cr_expect_null(nb_mesh_create("x=2,x=2", devs, 4));
  tc_assert_error(NB_ERR_SHARDING, "nb_mesh_create: \"x=2,x=2\": axis x appears twice");

  /* nbi_mesh_new: NULL devices are virtual CPU devices, n still checked */
  m = nbi_mesh_new("nb_shard_map", "a=3", NULL, 3);
  cr_assert_not_null(m, "%s", nb_last_error());
  cr_expect_eq(m->n_dev, 3);
  nb_mesh_release(m);
  cr_expect_null(nbi_mesh_new("nb_shard_map", "a=3", NULL, 2));
  tc_assert_error(NB_ERR_SHARDING, "nb_shard_map: \"a=3\" has 3 devices, 2 given");
}

/* ---- spec grammar ----------------------------------------------------------------------- */

/* Parses spec (expecting success) and returns its canonical text in buf. */
static const char *canon(const nb_mesh *m, const char *spec, int ndim, bool open_rest, char *buf,
                         size_t cap, nbi_sharding *out) {
  nbi_sharding s;
  nb_status st = nbi_sharding_parse("nb_shard", m, spec, ndim, open_rest, &s);
  cr_assert_eq(st, NB_OK, "\"%s\" on %s: %s", spec, nb_mesh_str(m), nb_last_error());
  cr_assert_eq(nbi_sharding_check("nb_shard", m, &s), NB_OK, "%s", nb_last_error());
  size_t need = nbi_sharding_format(m, &s, buf, cap);
  cr_assert_eq(need, strlen(buf));
  if (out) *out = s;
  return buf;
}

Test(sharding_spec, specs_parse_to_their_canonical_text) {
  static const struct {
    const char *mesh, *spec;
    int ndim;
    bool open_rest;
    const char *canon;
  } cases[] = {
      {"x=4,y=2", "x, _", 2, false, "[x, _]"},
      {"x=4,y=2", "[x, _]", 2, false, "[x, _]"},
      {"x=4,y=2", "x", 2, false, "[x, _]"},
      {"x=4,y=2", "x", 3, true, "[x, _?, _?]"},
      {"x=4,y=2", "", 0, false, "[]"},
      {"x=4,y=2", "[]", 0, true, "[]"},
      {"x=4,y=2", "  ", 2, false, "[_, _]"},
      {"x=4,y=2", "[]", 2, true, "[_?, _?]"},
      {"x=4,y=2", "(x, y), _", 2, false, "[(x, y), _]"},
      {"x=4,y=2", "(y,x)", 1, false, "[(y, x)]"},
      {"x=4,y=2", "(x)", 1, false, "[x]"},
      {"x=4,y=2,z=2", "[(x, y), _?] partial(z)", 2, false, "[(x, y), _?] partial(z)"},
      {"x=4,y=2", "y@1, x?@0", 2, false, "[y@1, x?@0]"},
      {"x=4,y=2", "x@2?, _@0", 2, false, "[x?@2, _@0]"},
      {"x=4,y=2", "(x, y)? @ 7", 1, false, "[(x, y)?@7]"},
      {"x=4,y=2", "x:(1)4", 1, false, "[x]"},
      {"x=4,y=2", "x:(2)2, x:(1)2", 2, false, "[x:(2)2, x:(1)2]"},
      {"x=4,y=2", "(x:(1)2, x:(2)2)", 1, false, "[x]"},
      {"x=8,y=2", "(x:(1)2, x:(2)2), x:(4)2", 2, false, "[x:(1)4, x:(4)2]"},
      {"x=8,y=2", "(y, x:(2)2, x:(4)2)", 1, false, "[(y, x:(2)4)]"},
      {"x=4,y=2", "partial(y) replicated(x)", 1, false, "[_] replicated(x) partial(y)"},
      {"x=4,y=2", "replicated(y, x)", 1, false, "[_] replicated(x, y)"},
      {"x=4,y=2", "_, _ partial(y, x:(2)2)", 2, false, "[_, _] partial(x:(2)2, y)"},
      {"x=4,y=2", "[x:(2)2] partial(x:(1)2)", 1, false, "[x:(2)2] partial(x:(1)2)"},
      {"x=4,y=2", "partial(x:(2)2, x:(1)2)", 0, false, "[] partial(x)"},
      {"x=4,y=2", "[] partial(y)", 0, false, "[] partial(y)"},
      {"x=4,y=2", "partial(y)replicated(x)", 0, false, "[] replicated(x) partial(y)"},
      {"x=4,y=2", "  [ x : ( 2 ) 2 , ( y ) ]  replicated ( x:(1)2 )", 2, false,
       "[x:(2)2, y] replicated(x:(1)2)"},
      {"partial=2,replicated=2", "partial, replicated", 2, false, "[partial, replicated]"},
      {"partial=2,replicated=2", "partial partial(replicated)", 1, false,
       "[partial] partial(replicated)"},
      {"x=1", "x", 1, false, "[x]"},
      {"x=6,y=4", "x:(2)3, (y:(2)2, x:(1)2)", 2, false, "[x:(2)3, (y:(2)2, x:(1)2)]"},
  };
  char buf[256];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    nb_mesh *m = mesh_ok(cases[k].mesh);
    cr_expect_str_eq(
        canon(m, cases[k].spec, cases[k].ndim, cases[k].open_rest, buf, sizeof buf, NULL),
        cases[k].canon, "spec \"%s\"", cases[k].spec);
    nb_mesh_release(m);
  }
}

Test(sharding_spec, parsed_fields) {
  nb_mesh *m = mesh_ok("x=4,y=2,z=2");
  nbi_sharding s;
  char buf[128];
  canon(m, "[(y, x:(2)2)?@3, _, z] replicated(x:(1)2)", 4, true, buf, sizeof buf, &s);
  cr_expect_eq(s.ndim, 4);
  cr_expect_eq(s.dim[0].n, 2);
  cr_expect(nbi_axis_eq(&s.dim[0].ax[0], &(nbi_axis){1, 1, 2}));
  cr_expect(nbi_axis_eq(&s.dim[0].ax[1], &(nbi_axis){0, 2, 2}));
  cr_expect(s.dim[0].open);
  cr_expect_eq(s.dim[0].priority, 3);
  cr_expect(s.dim[1].n == 0 && !s.dim[1].open && s.dim[1].priority == -1);
  cr_expect(s.dim[2].n == 1 && nbi_axis_eq(&s.dim[2].ax[0], &(nbi_axis){2, 1, 2}));
  cr_expect(s.dim[3].n == 0 && s.dim[3].open && s.dim[3].priority == -1, "unlisted: open");
  cr_expect_eq(s.n_repl, 1);
  cr_expect(nbi_axis_eq(&s.repl[0], &(nbi_axis){0, 1, 2}));
  cr_expect_eq(s.n_partial, 0);
  cr_expect_eq(nbi_dim_shards(&s, 0), 4);
  cr_expect_eq(nbi_dim_shards(&s, 1), 1);
  cr_expect_eq(nbi_dim_shards(&s, 2), 2);
  nb_mesh_release(m);
}

Test(sharding_spec, spec_errors_name_fn_quote_the_spec_and_point_at_the_problem) {
  static const struct {
    const char *mesh, *spec;
    int ndim;
    const char *msg;
  } cases[] = {
      /* unknown axes */
      {"x=4,y=2", "z, _", 2, "nb_shard: \"z, _\": unknown axis z (mesh x=4,y=2)"},
      {"x=4,y=2", "(x, w)", 2, "unknown axis w (mesh x=4,y=2)"},
      {"x=4,y=2", "x replicated(q)", 2, "unknown axis q"},
      {"x=4,y=2", "x, partial(y)", 2, "unknown axis partial"},
      {"x=4,y=2", "X", 1, "unknown axis X"},
      /* an axis used twice */
      {"x=4,y=2", "x, x", 2, "nb_shard: \"x, x\": axis x used twice"},
      {"x=4,y=2", "(x, y, x)", 2, "axis x used twice"},
      {"x=4,y=2", "x replicated(x)", 2, "axis x used twice"},
      {"x=4,y=2", "x partial(x)", 2, "axis x used twice"},
      {"x=4,y=2", "replicated(y) partial(y)", 2, "axis y used twice"},
      {"x=4,y=2", "partial(y, y)", 2, "axis y used twice"},
      {"x=4,y=2", "x:(1)2, x:(1)2", 2, "axis x:(1)2 used twice"},
      /* overlapping sub-axes */
      {"x=4,y=2", "x:(1)2, x", 2, "x:(1)2 and x overlap (both split axis x)"},
      {"x=8", "x:(1)4, x:(2)4", 2, "x:(1)4 and x:(2)4 overlap"},
      {"x=8", "x:(2)2 partial(x:(1)4)", 2, "x:(2)2 and x:(1)4 overlap"},
      {"x=6", "x:(1)2, x:(3)2", 2, "x:(1)2 and x:(3)2 overlap"},
      /* bad sub-axes */
      {"x=4,y=2", "x:(3)2", 1,
       "sub-axis x:(3)2 does not split axis x of size 4 (3 * 2 does not divide it)"},
      {"x=4,y=2", "x:(1)8", 1, "sub-axis x:(1)8 does not split axis x of size 4"},
      {"x=4,y=2", "x:(8)1", 1, "sub-axis x:(8)1 has size 1"},
      {"x=4,y=2", "x:(2)1", 1, "sub-axis x:(2)1 has size 1 (use _ or leave it out)"},
      {"x=1", "x:(1)1", 1, "sub-axis x:(1)1 has size 1"},
      {"x=4,y=2", "x:(0)2", 1, "sub-axis x:(0)2: sizes are >= 1"},
      {"x=4,y=2", "x:(2)0", 1, "sub-axis x:(2)0: sizes are >= 1"},
      {"x=4,y=2", "replicated(y:(1)3)", 1, "sub-axis y:(1)3 does not split axis y of size 2"},
      /* entries and rank */
      {"x=4,y=2", "x, _, _", 2, "nb_shard: \"x, _, _\": 3 entries for a 2-d tensor"},
      {"x=4,y=2", "x", 0, "1 entries for a 0-d tensor"},
      {"a=4,b=4,c=4,d=4,e=4", "(a:(2)2, a:(1)2, b:(2)2, b:(1)2, c:(2)2, c:(1)2, d:(2)2, d:(1)2, e)",
       1, "more than 8 axes in one entry"},
      /* malformed text */
      {"x=4,y=2", "x,,y", 2, "nb_shard: \"x,,y\": expected an axis name, '_' or '(' at column 3"},
      {"x=4,y=2", "x,", 2, "expected an axis name, '_' or '(' at the end"},
      {"x=4,y=2", ", x", 2, "expected an axis name, '_' or '(' at column 1"},
      {"x=4,y=2", "(x, y", 2, "expected ',' or ')' at the end"},
      {"x=4,y=2", "(x y)", 2, "expected ',' or ')' at column 4"},
      {"x=4,y=2", "(x, _)", 2, "expected an axis name at column 5"},
      {"x=4,y=2", "()", 2, "empty () (write _ for an unsharded dimension)"},
      {"x=4,y=2", "[x", 2, "expected ']' at the end"},
      {"x=4,y=2", "[x] y", 2, "expected replicated(...), partial(...) or the end at column 5"},
      {"x=4,y=2", "x y", 2, "expected ',', replicated(...), partial(...) or the end at column 3"},
      {"x=4,y=2", "x]", 2, "expected ',', replicated(...), partial(...) or the end at column 2"},
      {"x=4,y=2", "_x", 2, "at column 2"},
      {"x=4,y=2", "x??", 2, "'?' given twice in one entry"},
      {"x=4,y=2", "x@1?@2", 2, "'@' given twice in one entry"},
      {"x=4,y=2", "x@", 2, "expected a priority at the end"},
      {"x=4,y=2", "x@-1", 2, "expected a priority at column 3"},
      {"x=4,y=2", "x@99999999999", 2, "a priority is too large"},
      {"x=4,y=2", "x:(2", 2, "expected ')' at the end"},
      {"x=4,y=2", "x:2)2", 2, "expected '(' at column 3"},
      {"x=4,y=2", "x:(a)2", 2, "expected a sub-axis pre-size at column 4"},
      {"x=4,y=2", "x:(2)", 2, "expected a sub-axis size at the end"},
      {"x=4,y=2", "replicated(x) replicated(y)", 2, "replicated() given twice"},
      {"x=4,y=2", "partial(x) partial(y)", 2, "partial() given twice"},
      {"x=4,y=2", "replicated()", 2, "replicated() names no axes"},
      {"x=4,y=2", "partial(x", 2, "expected ',' or ')' at the end"},
      {"x=4,y=2", "partial(x) x", 2, "expected replicated(...), partial(...) or the end"},
      {"x=4,y=2", "[x] [y]", 2, "at column 5"},
      {"x=4,y=2", "x\x01", 2, "at column 2"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    nb_mesh *m = mesh_ok(cases[k].mesh);
    nbi_sharding s = nbi_sharding_replicated(1);
    nb_status st = nbi_sharding_parse("nb_shard", m, cases[k].spec, cases[k].ndim, false, &s);
    cr_expect_eq(st, NB_ERR_SHARDING, "\"%s\" parsed", cases[k].spec);
    cr_expect_eq(s.ndim, 1, "out untouched on error");
    tc_assert_error(NB_ERR_SHARDING, cases[k].msg);
    nb_mesh_release(m);
  }
  nb_mesh *m = mesh_ok("x=2");
  nbi_sharding s;
  cr_expect_eq(nbi_sharding_parse("nb_reshard", m, NULL, 1, false, &s), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "nb_reshard: spec is NULL");
  cr_expect_eq(nbi_sharding_parse("nb_reshard", NULL, "x", 1, false, &s), NB_ERR_NULL);
  tc_assert_error(NB_ERR_NULL, "nb_reshard: mesh is NULL");
  cr_expect_eq(nbi_sharding_parse("nb_reshard", m, "x", 9, false, &s), NB_ERR_ARG);
  tc_assert_error(NB_ERR_ARG, "rank 9 is out of range");
  nb_mesh_release(m);
}

/* ---- random shardings: canonical text round trips ---------------------------------------- */

/* Every valid (sub-)axis of m: whole axes, and splits pre * size | n with size >= 2. */
static int all_sub_axes(const nb_mesh *m, nbi_axis *out, int cap) {
  int k = 0;
  for (int a = 0; a < m->n_axes; a++) {
    int64_t n = m->size[a];
    if (n == 1 && k < cap) out[k++] = (nbi_axis){a, 1, 1};
    for (int64_t pre = 1; pre <= n; pre++)
      for (int64_t size = 2; size <= n; size++)
        if (n % (pre * size) == 0 && k < cap) out[k++] = (nbi_axis){a, pre, size};
  }
  return k;
}

static bool conflicts(const nbi_axis *a, const nbi_axis *used, int n_used) {
  for (int i = 0; i < n_used; i++)
    if (nbi_axis_overlap(a, &used[i])) return true;
  return false;
}

/* Whether a would merge with a neighbour in a list (b ends where a starts or the reverse). */
static bool adjacent(const nbi_axis *a, const nbi_axis *b) {
  return a->axis == b->axis && (a->pre * a->size == b->pre || b->pre * b->size == a->pre);
}

/* Sorts a set of (sub-)axes in mesh order (axis, then pre). */
static void sort_set(nbi_axis *ax, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && (ax[j].axis < ax[j - 1].axis ||
                              (ax[j].axis == ax[j - 1].axis && ax[j].pre < ax[j - 1].pre));
         j--) {
      nbi_axis t = ax[j];
      ax[j] = ax[j - 1];
      ax[j - 1] = t;
    }
}

/* A random valid sharding in normal form (no neighbours that parsing would
 * merge, sets in mesh order), with random flags. */
static nbi_sharding random_sharding(const nb_mesh *m, int ndim, int tries, uint64_t *seed) {
  nbi_axis cand[512], used[64];
  int n_cand = all_sub_axes(m, cand, 512), n_used = 0;
  nbi_sharding s = nbi_sharding_replicated(ndim);
  for (int t = 0; t < tries; t++) {
    nbi_axis a = cand[tc_randint(seed, 0, n_cand - 1)];
    if (conflicts(&a, used, n_used)) continue;
    int where = (int)tc_randint(seed, -2, ndim - 1); /* -2 replicated, -1 partial */
    nbi_axis *list = where == -2 ? s.repl : where == -1 ? s.partial : s.dim[where].ax;
    int *n = where == -2 ? &s.n_repl : where == -1 ? &s.n_partial : &s.dim[where].n;
    if (*n == NBI_MESH_MAX_AXES) continue;
    bool merges = false;
    if (where < 0)
      for (int i = 0; i < *n; i++)
        merges = merges || adjacent(&a, &list[i]);
    else if (*n > 0)
      merges = list[*n - 1].axis == a.axis && list[*n - 1].pre * list[*n - 1].size == a.pre;
    if (merges) continue;
    list[(*n)++] = a;
    used[n_used++] = a;
  }
  for (int d = 0; d < ndim; d++) {
    s.dim[d].open = tc_randint(seed, 0, 1);
    s.dim[d].priority = tc_randint(seed, 0, 2) ? -1 : (int)tc_randint(seed, 0, 12);
  }
  sort_set(s.repl, s.n_repl);
  sort_set(s.partial, s.n_partial);
  return s;
}

/* Field-by-field equality, flags included. */
static void assert_same(const nbi_sharding *a, const nbi_sharding *b, const char *text) {
  cr_assert_eq(a->ndim, b->ndim, "%s", text);
  for (int d = 0; d < a->ndim; d++) {
    cr_assert_eq(a->dim[d].n, b->dim[d].n, "%s dim %d", text, d);
    for (int i = 0; i < a->dim[d].n; i++)
      cr_assert(nbi_axis_eq(&a->dim[d].ax[i], &b->dim[d].ax[i]), "%s dim %d", text, d);
    cr_assert_eq(a->dim[d].open, b->dim[d].open, "%s dim %d", text, d);
    cr_assert_eq(a->dim[d].priority, b->dim[d].priority, "%s dim %d", text, d);
  }
  cr_assert_eq(a->n_repl, b->n_repl, "%s", text);
  for (int i = 0; i < a->n_repl; i++)
    cr_assert(nbi_axis_eq(&a->repl[i], &b->repl[i]), "%s", text);
  cr_assert_eq(a->n_partial, b->n_partial, "%s", text);
  for (int i = 0; i < a->n_partial; i++)
    cr_assert(nbi_axis_eq(&a->partial[i], &b->partial[i]), "%s", text);
}

static const char *const MESHES[] = {"x=1",         "x=2",         "x=2,y=2", "x=4,y=2",
                                     "x=2,y=2,z=2", "x=8",         "x=6,y=4", "x=12,y=2",
                                     "p=16,q=3",    "a=4,b=1,c=6", "d=36"};
#define N_MESHES ((int)(sizeof MESHES / sizeof MESHES[0]))

Test(sharding_spec, canonical_text_round_trips_on_random_shardings) {
  uint64_t seed = 7;
  char text[512], again[512];
  int sharded = 0;
  for (int k = 0; k < N_MESHES; k++) {
    nb_mesh *m = mesh_ok(MESHES[k]);
    for (int trial = 0; trial < 300; trial++) {
      int ndim = (int)tc_randint(&seed, 0, 5);
      nbi_sharding s = random_sharding(m, ndim, (int)tc_randint(&seed, 0, 10), &seed);
      cr_assert_eq(nbi_sharding_check("nb_shard", m, &s), NB_OK, "%s", nb_last_error());
      size_t need = nbi_sharding_format(m, &s, text, sizeof text);
      cr_assert_lt(need, sizeof text);
      nbi_sharding p;
      cr_assert_eq(nbi_sharding_parse("nb_shard", m, text, ndim, false, &p), NB_OK, "%s: %s", text,
                   nb_last_error());
      assert_same(&s, &p, text);
      cr_assert(nbi_sharding_eq(&s, &p));
      nbi_sharding_format(m, &p, again, sizeof again);
      cr_assert_str_eq(text, again);
      /* without brackets and with the modifiers swapped: the same sharding */
      char *mods = strchr(text, ']');
      *mods = '\0';
      char *rep = strstr(mods + 1, "replicated("), *par = strstr(mods + 1, "partial(");
      if (par) par[-1] = '\0';
      char swapped[3 * sizeof text];
      snprintf(swapped, sizeof swapped, "%s %s %s", text + 1, par ? par : "", rep ? rep : "");
      cr_assert_eq(nbi_sharding_parse("nb_shard", m, swapped, ndim, false, &p), NB_OK, "%s: %s",
                   swapped, nb_last_error());
      assert_same(&s, &p, swapped);
      for (int d = 0; d < ndim; d++)
        sharded += s.dim[d].n > 0;
    }
    nb_mesh_release(m);
  }
  cr_expect_gt(sharded, 1000, "the generator shards dimensions");
}

/* Random text from the grammar's characters: parses or fails with a sharding error. */
Test(sharding_spec, random_text_parses_or_fails_cleanly) {
  static const char alphabet[] = "xyz_(),[]?@:0123 4partilcedr";
  nb_mesh *m = mesh_ok("x=4,y=2,z=2");
  uint64_t seed = 99;
  int ok = 0;
  char spec[24], text[512];
  for (int trial = 0; trial < 20000; trial++) {
    int len = (int)tc_randint(&seed, 0, (int)sizeof spec - 1);
    for (int i = 0; i < len; i++)
      spec[i] = alphabet[tc_randint(&seed, 0, (int)sizeof alphabet - 2)];
    spec[len] = '\0';
    nbi_sharding s;
    nb_status st = nbi_sharding_parse("nb_shard", m, spec, 3, trial % 2, &s);
    if (st == NB_OK) {
      ok++;
      cr_assert_eq(nbi_sharding_check("nb_shard", m, &s), NB_OK, "%s: %s", spec, nb_last_error());
      nbi_sharding_format(m, &s, text, sizeof text);
      nbi_sharding p;
      cr_assert_eq(nbi_sharding_parse("nb_shard", m, text, 3, false, &p), NB_OK, "%s", text);
      assert_same(&s, &p, text);
    } else {
      cr_assert_eq(st, NB_ERR_SHARDING, "%s: %s", spec, nb_last_error());
      cr_assert(strncmp(nb_last_error(), "nb_shard: \"", 11) == 0, "%s", nb_last_error());
      nb_clear_error();
    }
  }
  cr_expect_gt(ok, 20, "some random texts are valid");
  nb_mesh_release(m);
}

Test(sharding_spec, format_truncates_and_reports_the_length_needed) {
  nb_mesh *m = mesh_ok("x=4,y=2");
  nbi_sharding s;
  char full[64], small[8];
  canon(m, "x, _ partial(y:(1)2)", 2, false, full, sizeof full, &s); /* y:(1)2 is y */
  cr_expect_str_eq(full, "[x, _] partial(y)");
  nb_clear_error();
  cr_expect_eq(nbi_sharding_parse("nb_shard", m, "x partial(y)", 2, true, &s), NB_OK);
  size_t need = nbi_sharding_format(m, &s, full, sizeof full);
  cr_expect_str_eq(full, "[x, _?] partial(y)");
  cr_expect_eq(need, strlen("[x, _?] partial(y)"));
  cr_expect_eq(nbi_sharding_format(m, &s, small, sizeof small), need);
  cr_expect_str_eq(small, "[x, _?]");
  cr_expect_eq(nbi_sharding_format(m, &s, NULL, 0), need);
  nbi_sharding r = nbi_sharding_replicated(3);
  nbi_sharding_format(m, &r, full, sizeof full);
  cr_expect_str_eq(full, "[_, _, _]");
  cr_expect(r.ndim == 3 && r.n_repl == 0 && r.n_partial == 0);
  for (int d = 0; d < 3; d++)
    cr_expect(r.dim[d].n == 0 && !r.dim[d].open && r.dim[d].priority == -1);
  nb_mesh_release(m);
}

/* ---- checks and equality ------------------------------------------------------------------- */

Test(sharding_spec, check_rejects_invalid_shardings_built_by_hand) {
  nb_mesh *m = mesh_ok("x=4,y=2");
  nbi_sharding s = nbi_sharding_replicated(2);
  cr_expect_eq(nbi_sharding_check("nb_reshard", m, &s), NB_OK);
  s.dim[0].n = 1;
  s.dim[0].ax[0] = (nbi_axis){5, 1, 2};
  cr_expect_eq(nbi_sharding_check("nb_reshard", m, &s), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "nb_reshard: \"[?5, _]\": axis index 5 is not on mesh x=4,y=2");
  s.dim[0].ax[0] = (nbi_axis){0, 3, 2};
  cr_expect_eq(nbi_sharding_check("nb_reshard", m, &s), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "sub-axis (pre 3, size 2) does not split axis x of size 4");
  s.dim[0].ax[0] = (nbi_axis){0, 2, 1};
  cr_expect_eq(nbi_sharding_check("nb_reshard", m, &s), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "does not split axis x");
  s.dim[0].ax[0] = nbi_axis_whole(m, 1);
  s.dim[1].n = 1;
  s.dim[1].ax[0] = nbi_axis_whole(m, 1);
  cr_expect_eq(nbi_sharding_check("nb_reshard", m, &s), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "nb_reshard: \"[y, y]\": axis y used twice");
  s.dim[1].ax[0] = (nbi_axis){0, 2, 2};
  s.n_partial = 1;
  s.partial[0] = (nbi_axis){0, 1, 4};
  cr_expect_eq(nbi_sharding_check("nb_reshard", m, &s), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "\"[y, x:(2)2] partial(x)\": x:(2)2 and x overlap");
  s.partial[0] = (nbi_axis){0, 1, 2};
  cr_expect_eq(nbi_sharding_check("nb_reshard", m, &s), NB_OK, "%s", nb_last_error());
  s.n_repl = -1;
  cr_expect_eq(nbi_sharding_check("nb_reshard", m, &s), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "more than 8");
  s.n_repl = 0;
  s.ndim = 9;
  cr_expect_eq(nbi_sharding_check("nb_reshard", m, &s), NB_ERR_SHARDING);
  tc_assert_error(NB_ERR_SHARDING, "sharding of rank 9");
  nb_mesh_release(m);
}

Test(sharding_spec, equality_compares_layouts_not_flags) {
  nb_mesh *m = mesh_ok("x=4,y=2,z=2");
  static const struct {
    const char *a, *b;
    bool eq;
  } cases[] = {
      {"x, _", "[x, _]", true},
      {"x, _", "x?@2, _?", true},
      {"x, _", "x, _ replicated(y)", true},
      {"x, _", "_, x", false},
      {"x, _", "x:(1)2, _", false},
      {"(x, y), _", "(y, x), _", false},
      {"(x, y), _", "(x, y), _ partial(z)", false},
      {"x partial(y, z)", "x partial(z, y)", true},
      {"x partial(y)", "x partial(z)", false},
      {"_, _", "_", true},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    nbi_sharding a, b;
    cr_assert_eq(nbi_sharding_parse("nb_shard", m, cases[k].a, 2, false, &a), NB_OK);
    cr_assert_eq(nbi_sharding_parse("nb_shard", m, cases[k].b, 2, false, &b), NB_OK);
    cr_expect_eq(nbi_sharding_eq(&a, &b), cases[k].eq, "%s vs %s", cases[k].a, cases[k].b);
    cr_expect_eq(nbi_sharding_eq(&b, &a), cases[k].eq, "%s vs %s", cases[k].b, cases[k].a);
  }
  /* consecutive parts built by hand equal the merged axis; partial in any order */
  nbi_sharding a = nbi_sharding_replicated(1), b = nbi_sharding_replicated(1);
  a.dim[0].n = 2;
  a.dim[0].ax[0] = (nbi_axis){0, 1, 2};
  a.dim[0].ax[1] = (nbi_axis){0, 2, 2};
  a.n_partial = 2;
  a.partial[0] = nbi_axis_whole(m, 2);
  a.partial[1] = nbi_axis_whole(m, 1);
  b.dim[0].n = 1;
  b.dim[0].ax[0] = nbi_axis_whole(m, 0);
  b.n_partial = 2;
  b.partial[0] = nbi_axis_whole(m, 1);
  b.partial[1] = nbi_axis_whole(m, 2);
  cr_expect(nbi_sharding_eq(&a, &b));
  cr_expect_eq(a.dim[0].n, 2, "eq leaves its arguments alone");
  cr_expect_eq(a.partial[0].axis, 2);
  b.ndim = 2;
  cr_expect_not(nbi_sharding_eq(&a, &b));
  nb_mesh_release(m);
}

/* ---- coordinates, overlaps, indices, blocks ----------------------------------------------- */

/* Coordinate of c (in [0, n)) on the middle part of the split [pre, size, n/(pre size)],
 * by enumerating the split row-major. */
static int64_t split_coord(int64_t n, int64_t pre, int64_t size, int64_t c) {
  int64_t rest = n / (pre * size), k = 0;
  for (int64_t p = 0; p < pre; p++)
    for (int64_t s = 0; s < size; s++)
      for (int64_t r = 0; r < rest; r++, k++)
        if (k == c) return s;
  cr_assert_fail("coordinate %lld outside the axis", (long long)c);
  return -1;
}

Test(sharding_spec, sub_axis_coordinates_match_the_enumerated_split) {
  int checked = 0;
  for (int k = 0; k < N_MESHES; k++) {
    nb_mesh *m = mesh_ok(MESHES[k]);
    nbi_axis ax[512];
    int n = all_sub_axes(m, ax, 512);
    for (int i = 0; i < n; i++) {
      for (int dev = 0; dev < m->n_dev; dev++) {
        int64_t c = grid_coord(m, dev, ax[i].axis);
        int64_t want = split_coord(m->size[ax[i].axis], ax[i].pre, ax[i].size, c);
        cr_assert_eq(nbi_axis_coord(m, &ax[i], dev), want, "%s axis %d:(%lld)%lld device %d",
                     MESHES[k], ax[i].axis, (long long)ax[i].pre, (long long)ax[i].size, dev);
        checked++;
      }
    }
    nb_mesh_release(m);
  }
  cr_expect_gt(checked, 1000);
}

/* Whether the boundaries of two splits of an axis of size n, sorted, form a
 * divisibility chain 1 | .. | n: the two parts are then digits of one
 * mixed-radix split of the axis. */
static bool splits_nest(int64_t n, const nbi_axis *a, const nbi_axis *b) {
  int64_t v[6] = {1, a->pre, a->pre * a->size, b->pre, b->pre * b->size, n};
  for (int i = 1; i < 6; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
      int64_t t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  for (int i = 1; i < 6; i++)
    if (v[i] % v[i - 1]) return false;
  return true;
}

/* Two parts of one axis overlap unless their ranges [pre, pre * size) are
 * disjoint and their splits nest. Parts that do not overlap have independent
 * coordinates (every pair of coordinates occurs equally often); on prime-power
 * axes independence is exactly non-overlap. An axis always overlaps itself. */
Test(sharding_spec, overlap_is_shared_range_or_splits_that_do_not_nest) {
  static const char *const axes[] = {"x=2",  "x=4",  "x=6",  "x=8",  "x=9",  "x=12",
                                     "x=16", "x=18", "x=24", "x=27", "x=36", "x=1"};
  int independent = 0;
  for (size_t k = 0; k < sizeof axes / sizeof axes[0]; k++) {
    nb_mesh *m = mesh_ok(axes[k]);
    nbi_axis ax[512];
    int n = all_sub_axes(m, ax, 512);
    int64_t N = m->size[0];
    bool prime_power = N == 2 || N == 4 || N == 8 || N == 16 || N == 9 || N == 27;
    for (int i = 0; i < n; i++) {
      cr_expect(nbi_axis_overlap(&ax[i], &ax[i]));
      for (int j = 0; j < n; j++) {
        if (i == j) continue;
        const nbi_axis *a = &ax[i], *b = &ax[j];
        bool disjoint = a->pre * a->size <= b->pre || b->pre * b->size <= a->pre;
        bool overlap = nbi_axis_overlap(a, b);
        cr_expect_eq(overlap, !(disjoint && splits_nest(N, a, b)),
                     "%s: x:(%lld)%lld and x:(%lld)%lld", axes[k], (long long)a->pre,
                     (long long)a->size, (long long)b->pre, (long long)b->size);
        cr_expect_eq(overlap, nbi_axis_overlap(b, a));
        int64_t count[64][64] = {{0}};
        for (int dev = 0; dev < m->n_dev; dev++)
          count[nbi_axis_coord(m, a, dev)][nbi_axis_coord(m, b, dev)]++;
        bool uniform = N % (a->size * b->size) == 0;
        for (int64_t p = 0; p < a->size && uniform; p++)
          for (int64_t q = 0; q < b->size && uniform; q++)
            uniform = count[p][q] == N / (a->size * b->size);
        if (!overlap) cr_expect(uniform, "%s: parts that do not overlap are independent", axes[k]);
        if (prime_power) cr_expect_eq(overlap, !uniform, "%s", axes[k]);
        independent += !overlap;
      }
    }
    nb_mesh_release(m);
  }
  cr_expect_gt(independent, 100);
  nb_mesh *m = mesh_ok("x=4,y=4");
  cr_expect_not(nbi_axis_overlap(&(nbi_axis){0, 1, 4}, &(nbi_axis){1, 1, 4}), "different axes");
  cr_expect_not(nbi_axis_eq(&(nbi_axis){0, 1, 2}, &(nbi_axis){0, 2, 2}));
  nb_mesh_release(m);
}

/* Every ordered list of distinct whole axes of a mesh as one dimension's sharding:
 * the shard index is the mixed-radix number of the grid coordinates, major first. */
Test(sharding_spec, shard_indices_are_mixed_radix_major_first) {
  static const char *const meshes[] = {"x=2", "x=2,y=2", "x=4,y=2", "x=2,y=2,z=2", "x=1,y=3"};
  int lists = 0;
  for (size_t k = 0; k < sizeof meshes / sizeof meshes[0]; k++) {
    nb_mesh *m = mesh_ok(meshes[k]);
    int na = m->n_axes;
    /* lists as sequences of axis indices: enumerate all length-L sequences, keep distinct */
    for (int len = 0; len <= na; len++) {
      int total = 1;
      for (int i = 0; i < len; i++)
        total *= na;
      for (int code = 0; code < total; code++) {
        int seq[NBI_MESH_MAX_AXES], c = code;
        bool distinct = true;
        for (int i = 0; i < len; i++, c /= na) {
          seq[i] = c % na;
          for (int j = 0; j < i; j++)
            distinct = distinct && seq[j] != seq[i];
        }
        if (!distinct) continue;
        nbi_sharding s = nbi_sharding_replicated(2);
        s.dim[1].n = len;
        int64_t shards = 1;
        for (int i = 0; i < len; i++) {
          s.dim[1].ax[i] = nbi_axis_whole(m, seq[i]);
          shards *= m->size[seq[i]];
        }
        cr_assert_eq(nbi_sharding_check("nb_shard", m, &s), NB_OK);
        cr_expect_eq(nbi_dim_shards(&s, 1), shards);
        cr_expect_eq(nbi_dim_shards(&s, 0), 1);
        int64_t hits[64] = {0};
        for (int dev = 0; dev < m->n_dev; dev++) {
          int64_t want = 0;
          for (int i = 0; i < len; i++)
            want = want * m->size[seq[i]] + grid_coord(m, dev, seq[i]);
          cr_expect_eq(nbi_dim_index(m, &s, 1, dev), want, "%s device %d", meshes[k], dev);
          cr_expect_eq(nbi_dim_index(m, &s, 0, dev), 0);
          hits[want]++;
        }
        for (int64_t i = 0; i < shards; i++)
          cr_expect_eq(hits[i], m->n_dev / shards, "every shard index equally often");
        lists++;
      }
    }
    nb_mesh_release(m);
  }
  cr_expect_eq(lists, 2 + 5 + 5 + 16 + 5);
  /* a worked case: mesh x=4,y=2, "(y, x)": device 5 = (x 2, y 1) has index 1 * 4 + 2 */
  nb_mesh *m = mesh_ok("x=4,y=2");
  nbi_sharding s;
  cr_assert_eq(nbi_sharding_parse("nb_shard", m, "(y, x)", 1, false, &s), NB_OK);
  cr_expect_eq(nbi_dim_index(m, &s, 0, 5), 6);
  cr_assert_eq(nbi_sharding_parse("nb_shard", m, "(x, y)", 1, false, &s), NB_OK);
  cr_expect_eq(nbi_dim_index(m, &s, 0, 5), 5);
  cr_assert_eq(nbi_sharding_parse("nb_shard", m, "(x:(2)2, y, x:(1)2)", 1, false, &s), NB_OK);
  /* device 5: x = 2 = (x:(1)2 1, x:(2)2 0), y = 1: index (0 * 2 + 1) * 2 + 1 */
  cr_expect_eq(nbi_dim_index(m, &s, 0, 5), 3);
  nb_mesh_release(m);
}

Test(sharding_spec, local_blocks_take_ceil_chunks_with_short_or_empty_tails) {
  nb_mesh *m = mesh_ok("x=4,y=2");
  nbi_sharding s;
  cr_assert_eq(nbi_sharding_parse("nb_shard", m, "x, y", 2, false, &s), NB_OK);
  static const struct {
    int64_t n, lo[4], len[4];
  } cases[] = {
      {8, {0, 2, 4, 6}, {2, 2, 2, 2}}, {10, {0, 3, 6, 9}, {3, 3, 3, 1}},
      {9, {0, 3, 6, 9}, {3, 3, 3, 0}}, {2, {0, 1, 2, 2}, {1, 1, 0, 0}},
      {0, {0, 0, 0, 0}, {0, 0, 0, 0}}, {5, {0, 2, 4, 5}, {2, 2, 1, 0}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    nb_shape logical = NB_SHAPE(cases[k].n, 3), local;
    for (int dev = 0; dev < 8; dev++) {
      int64_t start[2] = {-1, -1};
      nbi_local_block(m, &s, &logical, dev, &local, start);
      int cx = dev / 2, cy = dev % 2;
      cr_expect_eq(local.ndim, 2);
      cr_expect_eq(start[0], cases[k].lo[cx], "n %lld device %d", (long long)cases[k].n, dev);
      cr_expect_eq(local.dims[0], cases[k].len[cx], "n %lld device %d", (long long)cases[k].n, dev);
      cr_expect_eq(start[1], cy ? 2 : 0, "3 over y=2: [0, 2) and [2, 3)");
      cr_expect_eq(local.dims[1], cy ? 1 : 2);
    }
  }
  nb_shape scalar = NB_SCALAR_SHAPE, local;
  nbi_sharding r = nbi_sharding_replicated(0);
  nbi_local_block(m, &r, &scalar, 3, &local, NULL);
  cr_expect_eq(local.ndim, 0);
  nb_mesh_release(m);
}

/* Random shardings on the test meshes and random shapes (divisible or not,
 * smaller than the shard count, empty): devices with equal shard indices hold
 * equal blocks, and each element is held by exactly n_dev / (shards of the
 * tensor) devices, once per replica group. */
Test(sharding_spec, local_blocks_cover_the_tensor_once_per_replica) {
  uint64_t seed = 31;
  for (int k = 0; k < N_MESHES; k++) {
    nb_mesh *m = mesh_ok(MESHES[k]);
    if (m->n_dev > 48) {
      nb_mesh_release(m);
      continue;
    }
    for (int trial = 0; trial < 60; trial++) {
      nb_shape logical = tc_rand_shape(&seed, 0, 3, 0, 13);
      nbi_sharding s = random_sharding(m, logical.ndim, 8, &seed);
      int64_t groups = 1, numel = tc_numel(logical);
      for (int d = 0; d < logical.ndim; d++)
        groups *= nbi_dim_shards(&s, d);
      cr_assert_eq(m->n_dev % groups, 0);
      int *cover = calloc((size_t)(numel ? numel : 1), sizeof *cover);
      for (int dev = 0; dev < m->n_dev; dev++) {
        nb_shape local;
        int64_t start[NB_MAX_DIMS], ix[NB_MAX_DIMS];
        nbi_local_block(m, &s, &logical, dev, &local, start);
        for (int d = 0; d < logical.ndim; d++) {
          cr_assert(start[d] >= 0 && local.dims[d] >= 0 &&
                    start[d] + local.dims[d] <= logical.dims[d]);
          int64_t chunk = (logical.dims[d] + nbi_dim_shards(&s, d) - 1) / nbi_dim_shards(&s, d);
          cr_assert(local.dims[d] <= chunk);
        }
        int64_t n_local = tc_numel(local);
        for (int64_t e = 0; e < n_local; e++) {
          tc_unravel(e, &local, ix);
          for (int d = 0; d < logical.ndim; d++)
            ix[d] += start[d];
          cover[tc_ravel(ix, &logical)]++;
        }
        /* devices with equal indices on every dimension hold the same block */
        for (int other = 0; other < dev; other++) {
          bool same = true;
          for (int d = 0; d < logical.ndim; d++)
            same = same && nbi_dim_index(m, &s, d, other) == nbi_dim_index(m, &s, d, dev);
          if (!same) continue;
          nb_shape ol;
          int64_t ostart[NB_MAX_DIMS];
          nbi_local_block(m, &s, &logical, other, &ol, ostart);
          for (int d = 0; d < logical.ndim; d++)
            cr_assert(ol.dims[d] == local.dims[d] && ostart[d] == start[d]);
        }
      }
      for (int64_t e = 0; e < numel; e++)
        cr_assert_eq(cover[e], m->n_dev / groups, "%s element %lld held %d times, want %lld",
                     MESHES[k], (long long)e, cover[e], (long long)(m->n_dev / groups));
      free(cover);
    }
    nb_mesh_release(m);
  }
}
