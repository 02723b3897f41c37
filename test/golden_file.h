/* test/golden_file.h — reads the golden files of test/golden/ in the format
 * of autodiff.txt (test/golden/README.md): a case is named records (inputs
 * and expected outputs), each a dtype (f64 or i64), a shape and row-major
 * values. gf_load(file, case) reads one case; the file sits in test/golden/
 * beside this header (the path comes from __FILE__, as `make test` builds
 * from the repository root). */
#ifndef NABLA_TEST_GOLDEN_FILE_H
#define NABLA_TEST_GOLDEN_FILE_H

#include <inttypes.h>
#include <stdio.h>

#include "common.h"

#define GF_MAX_RECS 160

typedef struct gf_rec {
  char name[64];
  bool output;
  nb_dtype dt; /* NB_F64 or NB_I64 */
  nb_shape shape;
  double *v; /* numel(shape) values (malloc'd) */
} gf_rec;

typedef struct gf_case {
  char name[64];
  int n;
  gf_rec rec[GF_MAX_RECS];
} gf_case;

static inline void gf_read_rec(FILE *f, const char *case_name, gf_rec *r) {
  char dt[8];
  cr_assert_eq(fscanf(f, "%63s %7s %d", r->name, dt, &r->shape.ndim), 3, "%s: bad record header",
               case_name);
  cr_assert(!strcmp(dt, "f64") || !strcmp(dt, "i64"), "%s/%s: dtype %s", case_name, r->name, dt);
  r->dt = dt[0] == 'f' ? NB_F64 : NB_I64;
  cr_assert(r->shape.ndim >= 0 && r->shape.ndim <= NB_MAX_DIMS, "%s/%s: rank", case_name, r->name);
  for (int d = 0; d < r->shape.ndim; d++)
    cr_assert_eq(fscanf(f, "%" SCNd64, &r->shape.dims[d]), 1, "%s/%s: dims", case_name, r->name);
  int64_t n = tc_numel(r->shape);
  r->v = malloc((size_t)(n ? n : 1) * sizeof *r->v);
  for (int64_t i = 0; i < n; i++)
    cr_assert_eq(fscanf(f, "%lf", &r->v[i]), 1, "%s/%s: value %lld", case_name, r->name,
                 (long long)i);
}

/* Case `name` of test/golden/<file> (caller frees with gf_free). */
static inline gf_case *gf_load(const char *file, const char *name) {
  const char *src = __FILE__, *slash = strrchr(src, '/');
  char path[1024], word[64];
  snprintf(path, sizeof path, "%.*sgolden/%s", slash ? (int)(slash - src + 1) : 0, src, file);
  FILE *f = fopen(path, "r");
  cr_assert(f, "cannot open %s (run the tests from the repository root)", path);
  gf_case *c = calloc(1, sizeof *c);
  bool in_case = false;
  while (fscanf(f, "%63s", word) == 1) {
    if (word[0] == '#') {
      int ch;
      while ((ch = fgetc(f)) != EOF && ch != '\n') {
      }
    } else if (!strcmp(word, "case")) {
      cr_assert_eq(fscanf(f, "%63s", c->name), 1);
      in_case = !strcmp(c->name, name);
    } else if (!strcmp(word, "input") || !strcmp(word, "output")) {
      gf_rec r;
      gf_read_rec(f, c->name, &r);
      r.output = word[0] == 'o';
      if (in_case) {
        cr_assert(c->n < GF_MAX_RECS, "%s: too many records", c->name);
        c->rec[c->n++] = r;
      } else {
        free(r.v);
      }
    } else if (!strcmp(word, "end")) {
      if (in_case) break;
    } else {
      cr_assert_fail("%s: unexpected word \"%s\"", file, word);
    }
  }
  fclose(f);
  cr_assert(in_case, "%s has no case %s", file, name);
  return c;
}

static inline void gf_free(gf_case *c) {
  for (int i = 0; i < c->n; i++)
    free(c->rec[i].v);
  free(c);
}

static inline const gf_rec *gf_find(const gf_case *c, const char *name) {
  for (int i = 0; i < c->n; i++)
    if (!strcmp(c->rec[i].name, name)) return &c->rec[i];
  cr_assert_fail("case %s has no record %s", c->name, name);
  return NULL;
}

/* The record as a tensor of dtype dt (its own dtype when dt is NB_DTYPE_COUNT). */
static inline nb_tensor *gf_tensor(const gf_case *c, const char *name, nb_dtype dt) {
  const gf_rec *r = gf_find(c, name);
  return tc_tensor(r->v, r->shape, dt == NB_DTYPE_COUNT ? r->dt : dt);
}

/* Asserts t has the record's shape and |t - want| <= tol (1 + |want|). */
static inline void gf_expect(const gf_case *c, const char *name, nb_tensor *t, double tol) {
  const gf_rec *r = gf_find(c, name);
  cr_assert(t, "%s/%s: NULL result: %s", c->name, name, nb_last_error());
  tc_assert_close_tol(t, r->v, r->shape, tol);
}

#endif
