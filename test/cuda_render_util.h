/* test/cuda_render_util.h — the harness of test/test_cuda_render.c: random cases
 * (an nbi_group, host operand buffers laid out as views of F), their reference values
 * from the CPU backend's own kernels run member by member (the semantics: each member
 * is the node it describes, run alone), and the generator's kernels compiled for the
 * host through test/cuda_host_shim.h and run there. Built only with NABLA_CUDA. */
#ifndef NABLA_TEST_CUDA_RENDER_UTIL_H
#define NABLA_TEST_CUDA_RENDER_UTIL_H

#include "common.h"
#include "../src/core/oprules.h"

#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>

#include "../src/backends/cpu/cpu.h"
#include "../src/backends/cuda/cuda_be.h"

typedef struct cr_rng {
  uint64_t s;
} cr_rng;
static inline int cr_pick(cr_rng *r, int n) { return (int)(tc_uniform(&r->s, 0, 1) * n) % n; }

/* ---- cases ----------------------------------------------------------------------------- */
/* Operand layouts: contiguous, broadcast along random dims, transposed, every other
 * element, flipped along a dim, one value; LAY_ROWB (not drawn at random): the same
 * for every row (a weight or bias). */
enum { LAY_CONTIG, LAY_BCAST, LAY_TRANS, LAY_STRIDED, LAY_FLIP, LAY_SCALAR, LAY_COUNT, LAY_ROWB };

typedef struct tc_case {
  nbi_group g;
  nbi_view in[NBI_FUSE_MAX], out[NBI_FUSE_MAX];
  char *base[NBI_FUSE_MAX]; /* operand k's backing buffer (in[k].data points into it) */
  size_t base_bytes[NBI_FUSE_MAX];
  char *outb[NBI_FUSE_MAX];
  char what[96];
  char name[64];
  char *src;
  nbi_cuda_launch_cfg cfg;
  bool raw; /* src is no rendered kernel (no launcher) */
} tc_case;

static inline tc_case *case_new(nb_dtype dt, nb_shape F, int ra, const char *what) {
  tc_case *c = calloc(1, sizeof *c);
  cr_assert(c);
  c->g.kind = ra < 0 ? NBI_GROUP_ELEMENTWISE : NBI_GROUP_ROWS;
  c->g.dtype = dt;
  c->g.full = F;
  c->g.ra = ra < 0 ? F.ndim : ra;
  c->g.rows = 1;
  for (int d = 0; d < c->g.ra; d++)
    c->g.rows *= F.dims[d];
  c->g.cols = c->g.rows ? tc_numel(F) / c->g.rows : 0;
  snprintf(c->what, sizeof c->what, "%s", what);
  return c;
}

static inline void case_free(tc_case *c) {
  if (!c) return;
  for (int k = 0; k < NBI_FUSE_MAX; k++) {
    free(c->base[k]);
    free(c->outb[k]);
  }
  free(c->src);
  free(c);
}

/* Adds member (op, role, dtype; compute dtype cdt in ai[0]) reading srcs (>= 0:
 * members, < 0: operand -1 - s); returns its index. */
static inline int mem(tc_case *c, int op, int role, nb_dtype dt, nb_dtype cdt, int n_in, int s0,
                      int s1, int s2) {
  nbi_group *g = &c->g;
  int k = g->n_members++;
  cr_assert(k < NBI_FUSE_MAX);
  nbi_group_member *m = &g->m[k];
  memset(m, 0, sizeof *m);
  m->op = (int16_t)op;
  m->role = (uint8_t)role;
  m->dtype = dt;
  m->n_in = (uint8_t)n_in;
  m->src[0] = (int16_t)s0, m->src[1] = (int16_t)s1, m->src[2] = (int16_t)s2;
  m->out = -1;
  m->ai[0] = cdt;
  m->af[0] = 1;
  return k;
}

/* Reduction / axis attrs: sum's divisor af[0] (1: sum), var's std flag ai[1]; the mask
 * or axis in ai[0] is set from the group's shape. */
static inline int red(tc_case *c, int op, int role, nb_dtype dt, int src, double div, int sd) {
  int k = mem(c, op, role, dt, NB_F32, 1, src, 0, 0);
  nbi_group *g = &c->g;
  g->m[k].af[0] = div;
  g->m[k].ai[1] = sd;
  g->m[k].ai[0] = role == NBI_ROLE_AXIS ? g->full.ndim - 1 : 0;
  for (int d = g->ra; d < g->full.ndim && role == NBI_ROLE_ROW_REDUCE; d++)
    g->m[k].ai[0] |= (int64_t)1 << d;
  return k;
}

static inline void store(tc_case *c, int k) {
  if (c->g.m[k].out < 0) c->g.m[k].out = (int16_t)c->g.n_outputs++;
}

static inline void fill_value(cr_rng *r, char *p, nb_dtype dt, int64_t i, double lo, double hi,
                              double special) {
  double v = tc_uniform(&r->s, lo, hi);
  if (!nb_dtype_is_float(dt)) v = floor(v);
  if (dt == NB_BOOL) v = cr_pick(r, 2);
  if (nb_dtype_is_float(dt) && tc_uniform(&r->s, 0, 1) < special) {
    static const double sp[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e30, -1e30, 1e-30};
    v = sp[cr_pick(r, 8)];
  }
  nbi_store_f64(p, dt, i, v);
}

/* Adds operand k: dtype dt, read at level lv, as a view of F laid out by lay over a new
 * buffer of values in [lo, hi) (a share `special` of NaN, infinities, zeros, huge). */
static inline int opnd(tc_case *c, cr_rng *r, nb_dtype dt, int lv, int lay, double lo, double hi,
                       double special) {
  nbi_group *g = &c->g;
  int k = g->n_operands++, nd = g->full.ndim;
  g->operand[k].dtype = dt;
  g->operand[k].level = (uint8_t)lv;
  int64_t bd[NB_MAX_DIMS], st[NB_MAX_DIMS], order[NB_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    bd[d] = g->full.dims[d];
    if (lay == LAY_SCALAR || lv == NBI_ROLE_GLOBAL || (lv == NBI_ROLE_PER_ROW && d >= g->ra) ||
        (lay == LAY_BCAST && cr_pick(r, 5) < 2) || (lay == LAY_ROWB && d < g->ra))
      bd[d] = 1;
    order[d] = d;
  }
  if (lay == LAY_TRANS)
    for (int d = nd - 1; d > 0; d--) {
      int e = cr_pick(r, d + 1);
      int64_t t = order[d];
      order[d] = order[e], order[e] = t;
    }
  int64_t step = lay == LAY_STRIDED ? 2 : 1, n = step;
  for (int i = nd - 1; i >= 0; i--) {
    int d = (int)order[i];
    st[d] = n;
    n *= bd[d] ? bd[d] : 1;
  }
  size_t es = nb_dtype_size(dt);
  c->base_bytes[k] = (size_t)(n + 1) * es;
  c->base[k] = malloc(c->base_bytes[k]);
  cr_assert(c->base[k]);
  for (int64_t i = 0; i <= n; i++)
    fill_value(r, c->base[k], dt, i, lo, hi, special);
  nbi_view *v = &c->in[k];
  v->dtype = dt;
  v->ndim = nd;
  int64_t off = 0;
  int flip = -1;
  for (int d = 0; d < nd && lay == LAY_FLIP; d++)
    if (bd[d] > 1) flip = d;
  for (int d = 0; d < nd; d++) {
    v->dims[d] = g->full.dims[d];
    v->strides[d] = bd[d] == 1 ? 0 : st[d];
    if (d == flip) {
      off += (bd[d] - 1) * st[d];
      v->strides[d] = -st[d];
    }
  }
  v->data = c->base[k] + off * (int64_t)es;
  return k;
}

/* Elements of member k's value: F for full and axis members, rows for per-row ones, 1
 * for global ones. */
static inline int64_t member_numel(const nbi_group *g, int k) {
  int r = g->m[k].role;
  if (r == NBI_ROLE_FULL || r == NBI_ROLE_AXIS) return tc_numel(g->full);
  if (r == NBI_ROLE_GLOBAL || r == NBI_ROLE_GLOBAL_REDUCE) return 1;
  return g->rows;
}

/* Output buffers (filled with 0xA5 bytes) and the structural key. */
static inline void case_finish(tc_case *c) {
  nbi_group *g = &c->g;
  for (int k = 0; k < g->n_members; k++) {
    int o = g->m[k].out;
    if (o < 0) continue;
    int64_t n = member_numel(g, k);
    size_t es = nb_dtype_size(g->m[k].dtype);
    c->outb[o] = malloc((size_t)(n ? n : 1) * es);
    cr_assert(c->outb[o]);
    memset(c->outb[o], 0xA5, (size_t)(n ? n : 1) * es);
    nbi_view *v = &c->out[o];
    memset(v, 0, sizeof *v);
    v->data = c->outb[o];
    v->dtype = g->m[k].dtype;
    v->ndim = 1;
    v->dims[0] = n;
    v->strides[0] = 1;
  }
  uint64_t a = 0x9e3779b97f4a7c15ull, b = 0xcbf29ce484222325ull;
  const uint64_t *w = (const uint64_t *)(const void *)g;
  for (size_t i = 0; i < offsetof(nbi_group, key) / 8; i++)
    nbi_hash_mix(&a, &b, w[i]);
  g->key[0] = a, g->key[1] = b;
}

/* ---- the reference: each member run alone by the CPU kernels ------------------------------ */
/* A view of value buffer p (dtype dt) of a member of role src_role as read by a member of
 * role reader (over F, over the rows R = F[0, ra), or 0-d). */
static inline nbi_view value_view(const nbi_group *g, char *p, nb_dtype dt, int src_role,
                                  int over) {
  nbi_view v = {.data = p, .dtype = dt};
  int nd = over == 0 ? g->full.ndim : over == 1 ? g->ra : 0;
  v.ndim = nd;
  bool full = src_role == NBI_ROLE_FULL || src_role == NBI_ROLE_AXIS;
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; d--) {
    v.dims[d] = g->full.dims[d];
    bool row_dim = d < g->ra;
    v.strides[d] = full || row_dim ? s : 0;
    if (full || row_dim) s *= g->full.dims[d];
  }
  return v;
}

/* Where a member of this role writes its value (out_over) and reads its inputs
 * (in_over): 0 over F, 1 over the rows, 2 one value. */
static inline int out_over(int role) {
  if (role == NBI_ROLE_PER_ROW || role == NBI_ROLE_ROW_REDUCE) return 1;
  if (role == NBI_ROLE_GLOBAL || role == NBI_ROLE_GLOBAL_REDUCE) return 2;
  return 0;
}
static inline int in_over(int role) {
  if (role == NBI_ROLE_PER_ROW || role == NBI_ROLE_GLOBAL_REDUCE) return 1;
  if (role == NBI_ROLE_GLOBAL) return 2;
  return 0;
}

static inline bool is_view_op(int op) {
  return op == NBI_OP_RESHAPE || op == NBI_OP_BROADCAST_TO || op == NBI_OP_IDENTITY ||
         op == NBI_OP_STOP_GRADIENT;
}

static inline nb_status cpu_node(int op, nb_dtype dt, const nbi_view *outv, int n_in,
                                 const int64_t *ai, const double *af, nbi_view *out,
                                 const nbi_view *in) {
  nb_tensor node, fin[3], *pin[3];
  memset(&node, 0, sizeof node);
  node.op = op;
  node.dtype = dt;
  node.n_in = n_in;
  node.in = pin;
  node.shape.ndim = outv->ndim;
  memcpy(node.shape.dims, outv->dims, sizeof node.shape.dims);
  for (int q = 0; q < n_in; q++) {
    memset(&fin[q], 0, sizeof fin[q]);
    fin[q].dtype = in[q].dtype;
    fin[q].shape.ndim = in[q].ndim;
    memcpy(fin[q].shape.dims, in[q].dims, sizeof fin[q].shape.dims);
    pin[q] = &fin[q];
  }
  for (int a = 0; a < NBI_GROUP_ATTRS; a++)
    node.attrs.i[a] = ai[a];
  node.attrs.f[0] = af[0], node.attrs.f[1] = af[1];
  if (is_view_op(op)) {
    nbi_copy_view(out, &in[0]);
    return NB_OK;
  }
  return nbi_cpu_run_op(NULL, &node, out, in);
}

/* val[k] (malloc'd): member k's value, contiguous, member_numel elements. */
static inline void reference(const tc_case *c, char **val) {
  const nbi_group *g = &c->g;
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    int64_t n = member_numel(g, k);
    val[k] = calloc((size_t)(n ? n : 1), 8);
    cr_assert(val[k]);
    int over = in_over(m->role);
    nbi_view in[3], out = value_view(g, val[k], m->dtype, m->role, out_over(m->role));
    for (int q = 0; q < m->n_in; q++) {
      int s = m->src[q];
      if (s >= 0) {
        in[q] = value_view(g, val[s], g->m[s].dtype, g->m[s].role, over);
        continue;
      }
      in[q] = c->in[-1 - s]; /* over F; the rows' part for per-row readers, element 0 for one */
      in[q].ndim = over == 0 ? g->full.ndim : over == 1 ? g->ra : 0;
    }
    int64_t ai[NBI_GROUP_ATTRS];
    memcpy(ai, m->ai, sizeof ai);
    if (m->role == NBI_ROLE_ROW_REDUCE) {
      ai[0] = 0;
      for (int d = g->ra; d < g->full.ndim; d++)
        ai[0] |= (int64_t)1 << d;
    } else if (m->role == NBI_ROLE_GLOBAL_REDUCE) {
      ai[0] = ((int64_t)1 << g->ra) - 1;
    }
    nb_status st = cpu_node(m->op, m->dtype, &out, m->n_in, ai, m->af, &out, in);
    cr_assert_eq(st, NB_OK, "%s: CPU member %d: %s", c->what, k, nb_last_error());
  }
}

/* Compares output slot j (member k) with its reference: NaN for NaN, infinities and
 * integers exactly, floats within the dtype's tolerance (QUALITY.md) relative to
 * 1 + |ref|. A cumsum's element j sums j + 1 terms in another order than the CPU's
 * sequential loop: its rounding differences grow with the partial sums, as sqrt(j + 1)
 * (they only show in f64, which accumulates in its own precision). Returns false (and
 * reports) on the first mismatch. */
static inline bool compare(const tc_case *c, int k, const char *got, const char *ref,
                           const char *where) {
  const nbi_group_member *m = &c->g.m[k];
  int64_t n = member_numel(&c->g, k);
  double tol = tc_tol(m->dtype);
  for (int64_t i = 0; i < n; i++) {
    double a = nbi_load_f64(got, m->dtype, i), b = nbi_load_f64(ref, m->dtype, i);
    double lim = tol * (1 + fabs(b));
    if (m->op == NBI_OP_CUMSUM) lim *= sqrt((double)(i % (c->g.cols ? c->g.cols : 1)) + 1);
    bool ok = isnan(b) ? isnan(a) : isinf(b) ? a == b : fabs(a - b) <= lim;
    if (!ok) {
      cr_log_error("%s (%s): member %d (%s, %s) element %lld of %lld: got %.17g, expected %.17g",
                   c->what, where, k, nbi_op_table[m->op]->name, nb_dtype_name(m->dtype),
                   (long long)i, (long long)n, a, b);
      return false;
    }
  }
  return true;
}

/* ---- compiling for the host ------------------------------------------------------------------ */
typedef int (*tc_launch)(unsigned grid, unsigned block, void *params);

typedef struct tc_lib {
  void *so;
  char dir[PATH_MAX];
} tc_lib;

/* The folder of this header (the shim's), absolute. */
static inline void shim_dir(char *out) {
  char f[PATH_MAX];
  snprintf(f, sizeof f, "%s", __FILE__);
  char *d = dirname(f);
  if (!realpath(d, out)) snprintf(out, PATH_MAX, "%s", d);
}

/* Kernel text of a rendered source (without the preamble). */
static inline const char *kernel_text(const char *src) {
  size_t n = strlen(nbi_cuda_preamble);
  cr_assert(!strncmp(src, nbi_cuda_preamble, n), "a rendered source starts with the preamble");
  return src + n;
}

/* Writes cases[0..n) (rendered) as one translation unit: the preamble, each kernel in
 * its own namespace, and extern "C" launchers nbh_<i> / nbh_<i>g. shim: for the host. */
static inline char *batch_source(tc_case **cs, int n, bool shim) {
  size_t cap = strlen(nbi_cuda_preamble) + 4096;
  for (int i = 0; i < n; i++)
    cap += strlen(cs[i]->src) + 1024;
  char *s = malloc(cap);
  cr_assert(s);
  size_t len = 0;
  if (shim) len += (size_t)sprintf(s + len, "#include \"cuda_host_shim.h\"\n");
  len += (size_t)sprintf(s + len, "%s", nbi_cuda_preamble);
  for (int i = 0; i < n; i++) {
    const char *nm = cs[i]->name;
    int first = i; /* the same kernel twice in a batch: defined once */
    for (int j = 0; j < i && first == i; j++)
      if (!cs[i]->raw && !strcmp(cs[j]->name, nm)) first = j;
    if (first != i && !shim) continue;
    if (first != i) {
      len += (size_t)sprintf(s + len,
                             "extern \"C\" int nbh_%d(unsigned g, unsigned b, void *p) "
                             "{ return nbh_%d(g, b, p); }\n",
                             i, first);
      if (cs[i]->cfg.block2)
        len += (size_t)sprintf(s + len,
                               "extern \"C\" int nbh_%dg(unsigned g, unsigned b, void *p) "
                               "{ return nbh_%dg(g, b, p); }\n",
                               i, first);
      continue;
    }
    len += (size_t)sprintf(s + len, "namespace nbt%d {\n%s\n", i, kernel_text(cs[i]->src));
    if (shim && !cs[i]->raw) {
      len +=
          (size_t)sprintf(s + len, "static void run(void *a) { %s(*(const nb_params *)a); }\n", nm);
      if (cs[i]->cfg.block2)
        len += (size_t)sprintf(s + len,
                               "static void run_g(void *a) { %s_g(*(const nb_params *)a); }\n", nm);
    }
    len += (size_t)sprintf(s + len, "}\n");
    if (shim && !cs[i]->raw) {
      len += (size_t)sprintf(s + len,
                             "extern \"C\" int nbh_%d(unsigned g, unsigned b, void *p) "
                             "{ return nb_shim_run(g, b, nbt%d::run, p); }\n",
                             i, i);
      if (cs[i]->cfg.block2)
        len += (size_t)sprintf(s + len,
                               "extern \"C\" int nbh_%dg(unsigned g, unsigned b, void *p) "
                               "{ return nb_shim_run(g, b, nbt%d::run_g, p); }\n",
                               i, i);
    }
  }
  return s;
}

/* Renders every case (asserting success). */
static inline void render_all(tc_case **cs, int n) {
  for (int i = 0; i < n; i++) {
    tc_case *c = cs[i];
    cr_assert(nbi_cuda_group_ok(NULL, &c->g), "%s: group_ok refuses it", c->what);
    c->src = nbi_cuda_render_group(&c->g, c->out, c->in, c->name, &c->cfg);
    cr_assert(c->src, "%s: render: %s", c->what, nb_last_error());
  }
}

/* Compiles cases[0..n) for the host with $CXX (else c++) into a temp folder, in parts
 * compiled in parallel; returns the loaded objects (one per part). */
static inline void host_compile(tc_case **cs, int n, int parts, tc_lib *libs) {
  char inc[PATH_MAX], cmd[8192] = "";
  shim_dir(inc);
  const char *cxx = getenv("CXX") && getenv("CXX")[0] ? getenv("CXX") : "c++";
  char dir[] = "/tmp/nb_cuda_render_XXXXXX";
  cr_assert(mkdtemp(dir), "mkdtemp");
  size_t len = 0;
  for (int p = 0; p < parts; p++) {
    int i0 = n * p / parts, i1 = n * (p + 1) / parts;
    char *src = batch_source(cs + i0, i1 - i0, true);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/part%d.cpp", dir, p);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(src, f);
    fclose(f);
    free(src);
    len += (size_t)snprintf(cmd + len, sizeof cmd - len,
                            "%s -std=c++17 -O1 -fPIC -shared -w -pthread -I%s -o %s/part%d.so "
                            "%s/part%d.cpp > %s/part%d.log 2>&1 & ",
                            cxx, inc, dir, p, dir, p, dir, p);
  }
  snprintf(cmd + len, sizeof cmd - len, "wait");
  cr_assert_eq(system(cmd), 0, "host compile");
  for (int p = 0; p < parts; p++) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/part%d.so", dir, p);
    libs[p].so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!libs[p].so) {
      snprintf(path, sizeof path, "head -c 3000 %s/part%d.log", dir, p);
      cr_assert_eq(system(path), 0);
      cr_assert_fail("host compile of part %d failed: %s", p, dlerror());
    }
  }
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

/* Runs case i (index within its part) from lib: the row / elementwise kernel, then the
 * global one. */
static inline void host_run(tc_lib *lib, int i, tc_case *c) {
  char sym[32];
  snprintf(sym, sizeof sym, "nbh_%d", i);
  tc_launch run = (tc_launch)(uintptr_t)dlsym(lib->so, sym);
  cr_assert(run, "%s: no %s", c->what, sym);
  if (c->cfg.grid) cr_assert_eq(run(c->cfg.grid, c->cfg.block, c->cfg.words), 0);
  if (c->cfg.block2) {
    snprintf(sym, sizeof sym, "nbh_%dg", i);
    run = (tc_launch)(uintptr_t)dlsym(lib->so, sym);
    cr_assert(run, "%s: no %s", c->what, sym);
    cr_assert_eq(run(c->cfg.grid2, c->cfg.block2, c->cfg.words), 0);
  }
}

/* Renders, compiles, runs every case on the host and compares every stored member with
 * the CPU; frees the cases. Returns how many mismatched. */
static inline int check_on_host(tc_case **cs, int n) {
  render_all(cs, n);
  int parts = n < 8 ? 1 : n < 64 ? 4 : 8;
  tc_lib libs[8];
  host_compile(cs, n, parts, libs);
  int bad = 0;
  for (int p = 0; p < parts; p++) {
    int i0 = n * p / parts, i1 = n * (p + 1) / parts;
    for (int i = i0; i < i1; i++) {
      tc_case *c = cs[i];
      host_run(&libs[p], i - i0, c);
      char *val[NBI_FUSE_MAX];
      reference(c, val);
      bool ok = true;
      for (int k = 0; k < c->g.n_members && ok; k++)
        if (c->g.m[k].out >= 0) ok = compare(c, k, c->outb[c->g.m[k].out], val[k], "host");
      if (!ok) {
        bad++;
        fprintf(stderr, "---- %s: %s\n", c->what, kernel_text(c->src));
      }
      for (int k = 0; k < c->g.n_members; k++)
        free(val[k]);
      case_free(c);
    }
    dlclose(libs[p].so);
  }
  return bad;
}

#endif
