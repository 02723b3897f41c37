/* src/backends/cuda/cuda_ops.c — the CUDA backend's per-op table: which path
 * runs each op (run_op), which result dtypes it takes (supports), and the
 * plumbing the hand-written kernels share (modules, launches, scratch).
 *
 * Paths:
 *  - elementwise ops (unary, binary, where, cast, predicates): a one-member
 *    elementwise group (backend.h) run by the generator (cuda_render.c), so the
 *    formulas and NaN rules are the shared list's (../ew_formulas.h);
 *  - reductions over any axes: the input view permuted so the reduced axes
 *    trail (strides move with their dims, nothing is copied), then a one-member
 *    row group whose member reduces each row (ROW_REDUCE); empty reductions are
 *    fills with the CPU's identities (sum 0, mean NaN, prod 1, ...);
 *  - softmax / log_softmax / cumsum along any axis: the axis permuted last, a
 *    one-member row group (AXIS) into a contiguous buffer in that order, then a
 *    copy through the inverse permutation when the axis was not already last;
 *  - data movement (reshape copies, materialized views, identity copies,
 *    concat, pad): nbi_cuda_copy / nbi_cuda_fill on strided views;
 *  - matmul: cuBLASLt (cuda_gemm.c);
 *  - index and NN ops: hand-written kernels (cuda_ops_index.c, cuda_ops_nn.c).
 * The ops core runs itself (constants, placeholders, tuple gets, control flow,
 * calls, sharding constraints, collectives) have no entry: supports answers
 * false for them. */
#include "cuda_be.h"
#include "../../core/oprules.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* ---- modules, launches, scratch --------------------------------------------------------- */

/* Guards every module's source and function table. Held while a kernel
 * compiles (once per module, kernel and device), so concurrent first uses of
 * a kernel compile it once. */
static pthread_mutex_t module_lock = PTHREAD_MUTEX_INITIALIZER;

/* Kernel k of module m on device c (cuda_be.h): kept per device ordinal after
 * the first lookup; the module's source (preamble + body) is built once. */
/* m's source (preamble + body), built on the first call; NULL when out of
 * memory (recorded). Called with module_lock held. */
static const char *module_source(nbi_cuda_module *m) {
  if (m->source) return m->source;
  size_t a = strlen(nbi_cuda_preamble), b = strlen(m->body);
  m->source = malloc(a + b + 1);
  if (!m->source) {
    nbi_error(NB_ERR_OOM, "nabla: out of memory for the source of CUDA kernel %s", m->names[0]);
    return NULL;
  }
  memcpy(m->source, nbi_cuda_preamble, a);
  memcpy(m->source + a, m->body, b + 1);
  return m->source;
}

nb_status nbi_cuda_module_fn(nbi_cuda_ctx *c, nbi_cuda_module *m, int k, CUfunction *fn) {
  if (k < 0 || k >= m->n_names || m->n_names > NBI_CUDA_MODULE_KERNELS)
    return nbi_error(NB_ERR_INTERNAL, "nabla: CUDA kernel %d of a %d-kernel module", k, m->n_names);
  int dev = c->ordinal;
  bool keep = dev >= 0 && dev < NBI_MAX_DEVICES;
  nb_status st = NB_OK;
  pthread_mutex_lock(&module_lock);
  if (keep && m->fn[dev][k]) {
    *fn = m->fn[dev][k];
    pthread_mutex_unlock(&module_lock);
    return NB_OK;
  }
  const char *src = module_source(m);
  st = src ? nbi_cuda_function(c, src, m->names[k], fn) : NB_ERR_OOM;
  if (st == NB_OK && keep) m->fn[dev][k] = *fn;
  pthread_mutex_unlock(&module_lock);
  return st;
}

/* A copy of m's source when no kernel of it was loaded on c yet (prepare);
 * NULL otherwise or out of memory. */
static char *module_source_missing(nbi_cuda_ctx *c, nbi_cuda_module *m) {
  int dev = c->ordinal;
  char *copy = NULL;
  pthread_mutex_lock(&module_lock);
  bool loaded = false;
  for (int k = 0; k < m->n_names && dev >= 0 && dev < NBI_MAX_DEVICES && !loaded; k++)
    loaded = m->fn[dev][k] != NULL;
  const char *src = loaded ? NULL : module_source(m);
  if (src) copy = strdup(src);
  pthread_mutex_unlock(&module_lock);
  return copy;
}

enum { LAUNCH_BLOCK = 256, LAUNCH_MAX_BLOCKS = 1 << 16 };

/* f over n items (cuda_be.h): blocks of LAUNCH_BLOCK threads, at most
 * LAUNCH_MAX_BLOCKS of them (the kernels loop grid-stride); nothing for n <= 0. */
nb_status nbi_cuda_launch_n(nbi_cuda_ctx *c, CUfunction f, int64_t n, void **args) {
  if (n <= 0) return NB_OK;
  int64_t blocks = (n + LAUNCH_BLOCK - 1) / LAUNCH_BLOCK;
  if (blocks > LAUNCH_MAX_BLOCKS) blocks = LAUNCH_MAX_BLOCKS;
  return nbi_cuda_launch(c, f, (unsigned)blocks, 1, LAUNCH_BLOCK, 0, args);
}

/* nbytes (at least 1) of c's memory; 0 with NB_ERR_OOM recorded. */
CUdeviceptr nbi_cuda_scratch(nbi_cuda_ctx *c, size_t nbytes) {
  return nbi_cuda_alloc_block(c->alloc, nbytes ? nbytes : 1);
}

/* The product of v's dims (1 for a 0-d view). */
int64_t nbi_cuda_view_numel(const nbi_view *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++)
    n *= v->dims[d];
  return n;
}

/* Gives v contiguous row-major strides for its own dims. */
static void set_contig(nbi_view *v) {
  int64_t st = 1;
  for (int d = v->ndim - 1; d >= 0; d--) {
    v->strides[d] = st;
    st *= v->dims[d] > 0 ? v->dims[d] : 1;
  }
}

/* v's elements as a contiguous dt array (cuda_be.h): v's memory, or a scratch
 * copy the caller frees (*owned); NULL on failure (recorded, nothing owned). */
char *nbi_cuda_contig(nbi_cuda_ctx *c, const nbi_view *v, nb_dtype dt, CUdeviceptr *owned) {
  *owned = 0;
  if (v->dtype == dt && nbi_view_is_contiguous(v)) return v->data;
  int64_t n = nbi_cuda_view_numel(v);
  CUdeviceptr p = nbi_cuda_scratch(c, (size_t)n * nb_dtype_size(dt));
  if (!p) return NULL;
  nbi_view dst = *v;
  dst.data = (char *)(uintptr_t)p;
  dst.dtype = dt;
  set_contig(&dst);
  if (n > 0 && nbi_cuda_copy(c, &dst, v) != NB_OK) {
    nbi_cuda_free_block(c->alloc, p);
    return NULL;
  }
  *owned = p;
  return dst.data;
}

/* ---- one-member groups ------------------------------------------------------------------- */

/* The structural key of g: every field above key (backend.h), hashed. */
static void group_key(nbi_group *g) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x6c62272e07bb0142ull, w;
  uint64_t head[] = {g->kind,
                     (uint64_t)g->dtype,
                     (uint64_t)g->full.ndim,
                     (uint64_t)g->ra,
                     (uint64_t)g->rows,
                     (uint64_t)g->cols,
                     (uint64_t)g->n_members,
                     (uint64_t)g->n_operands,
                     (uint64_t)g->n_outputs};
  for (size_t i = 0; i < sizeof head / sizeof head[0]; i++)
    nbi_hash_mix(&a, &b, head[i]);
  for (int d = 0; d < g->full.ndim; d++)
    nbi_hash_mix(&a, &b, (uint64_t)g->full.dims[d]);
  for (int k = 0; k < g->n_members; k++) {
    const nbi_group_member *m = &g->m[k];
    nbi_hash_mix(&a, &b,
                 (uint64_t)(uint16_t)m->op | (uint64_t)m->role << 16 | (uint64_t)m->n_in << 24 |
                     (uint64_t)m->dtype << 32);
    for (int j = 0; j < 3; j++)
      nbi_hash_mix(&a, &b, (uint64_t)(int64_t)m->src[j]);
    nbi_hash_mix(&a, &b, (uint64_t)(int64_t)m->out);
    nbi_hash_mix(&a, &b, (uint64_t)m->shape.ndim);
    for (int d = 0; d < m->shape.ndim; d++)
      nbi_hash_mix(&a, &b, (uint64_t)m->shape.dims[d]);
    for (int j = 0; j < NBI_GROUP_ATTRS; j++)
      nbi_hash_mix(&a, &b, (uint64_t)m->ai[j]);
    for (int j = 0; j < 2; j++) {
      memcpy(&w, &m->af[j], sizeof w);
      nbi_hash_mix(&a, &b, w);
    }
  }
  for (int k = 0; k < g->n_operands; k++)
    nbi_hash_mix(&a, &b, (uint64_t)g->operand[k].dtype | (uint64_t)g->operand[k].level << 8);
  g->key[0] = a;
  g->key[1] = b;
}

/* A group of kind `kind` whose one member runs node n with role `role` over
 * the full shape `full` (ra, rows, cols as backend.h), reading operand k for
 * its input k (each read at level FULL) and storing to output slot 0. The
 * member's own shape is `shape`; its attrs are n's, except that ai[0] becomes
 * `ai0` when ai0 >= 0 (reductions and axis ops: restated for `full`). */
static void group_one(nbi_group *g, uint8_t kind, const nb_tensor *n, const nbi_view *in,
                      uint8_t role, const nb_shape *full, int ra, const nb_shape *shape,
                      int64_t ai0) {
  memset(g, 0, sizeof *g);
  g->kind = kind;
  g->dtype = n->dtype; /* the member's result dtype (an elementwise op's compute
                          dtype stays in its ai[0], as in the node) */
  g->full = *full;
  g->ra = ra;
  g->rows = 1;
  g->cols = 1;
  for (int d = 0; d < full->ndim; d++)
    *(d < ra ? &g->rows : &g->cols) *= full->dims[d];
  g->n_members = 1;
  g->n_operands = n->n_in;
  g->n_outputs = 1;
  nbi_group_member *m = &g->m[0];
  m->op = (int16_t)n->op;
  m->role = role;
  m->n_in = (uint8_t)n->n_in;
  m->dtype = n->dtype;
  for (int k = 0; k < n->n_in; k++) {
    m->src[k] = (int16_t)(-1 - k);
    g->operand[k] = (nbi_group_operand){.dtype = in[k].dtype, .level = NBI_ROLE_FULL};
  }
  m->out = 0;
  m->shape = *shape;
  for (int j = 0; j < NBI_GROUP_ATTRS; j++)
    m->ai[j] = n->attrs.i[j];
  if (ai0 >= 0) m->ai[0] = ai0;
  m->af[0] = n->attrs.f[0];
  m->af[1] = n->attrs.f[1];
  group_key(g);
}

/* Runs g through the generator, naming n's op when the generator cannot. */
static nb_status run_group(nbi_cuda_ctx *c, const nbi_group *g, const nb_tensor *n, nbi_view *out,
                           const nbi_view *in) {
  if (!nbi_cuda_group_ok(c, g)) {
    char sb[160];
    return nbi_error(
        NB_ERR_DEVICE,
        "nb_%s: the CUDA code generator cannot run it (%s, shape %s: %lld rows of %lld)",
        nbi_op_table[n->op]->name, nb_dtype_name(n->dtype), nb_shape_str(g->full, sb, sizeof sb),
        (long long)g->rows, (long long)g->cols);
  }
  return nbi_cuda_run_group(c, g, out, in);
}

/* v's dims as a shape. */
static nb_shape shape_of_view(const nbi_view *v) {
  nb_shape s = {.ndim = v->ndim};
  memcpy(s.dims, v->dims, sizeof(int64_t) * (size_t)v->ndim);
  return s;
}

/* A single op's one-member group and the views it runs on: built by ew_group,
 * reduce_group or axis_group, for its launch and for prepare (op_sources). */
typedef struct op_group {
  nbi_group g;
  nbi_view out, in[3];
  bool scratch; /* out is a contiguous scratch (run_axis copies it into the op's out) */
} op_group;

/* Elementwise ops: out (n's shape) = op(in[k] broadcast to it), one
 * elementwise group of one FULL member (attrs.i[0]: the compute dtype). */
static nb_status ew_group(const nb_tensor *n, const nbi_view *out, const nbi_view *in,
                          op_group *o) {
  if (n->n_in < 1 || n->n_in > 3)
    return nbi_error(NB_ERR_INTERNAL, "nb_%s: %d inputs for an elementwise op",
                     nbi_op_table[n->op]->name, n->n_in);
  for (int k = 0; k < n->n_in; k++)
    o->in[k] = nbi_view_broadcast(&in[k], &n->shape);
  o->out = *out;
  o->scratch = false;
  group_one(&o->g, NBI_GROUP_ELEMENTWISE, n, in, NBI_ROLE_FULL, &n->shape, n->shape.ndim,
            &n->shape, -1);
  return NB_OK;
}

static nb_status run_elementwise(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                 const nbi_view *in) {
  if (nbi_cuda_view_numel(out) == 0) return NB_OK;
  op_group o;
  nb_status st = ew_group(n, out, in, &o);
  return st ? st : run_group(c, &o.g, n, out, o.in);
}

/* The value of a reduction over nothing (the CPU's initial states and
 * finishers), or false for the ops that have none. */
static bool empty_reduction_value(const nb_tensor *n, double *v) {
  switch (n->op) {
  case NBI_OP_REDUCE_SUM: *v = n->attrs.f[0] > 0 ? 0.0 : NAN; return true; /* mean of 0: NaN */
  case NBI_OP_REDUCE_PROD:
  case NBI_OP_REDUCE_ALL: *v = 1; return true;
  case NBI_OP_REDUCE_ANY: *v = 0; return true;
  case NBI_OP_REDUCE_VAR: *v = NAN; return true;
  case NBI_OP_LOGSUMEXP: *v = -INFINITY; return true;
  default: return false;
  }
}

/* Reductions: in[0] (any strides) reduced over the axes of the mask
 * attrs.i[0]; out holds one value per combination of kept axes (keepdims or
 * not: the same values). The view is permuted to (kept..., reduced...) and
 * reduced row by row. *cols: the length of the rows (0: a fill, no group). */
static void reduce_group(const nb_tensor *n, const nbi_view *out, const nbi_view *in, op_group *o,
                         int64_t *cols) {
  const nbi_view *x = &in[0];
  uint32_t mask = (uint32_t)n->attrs.i[0];
  nbi_view f = *x;
  int nd = x->ndim, k = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int d = 0; d < nd; d++)
      if ((int)((mask >> d) & 1u) == pass) {
        f.dims[k] = x->dims[d];
        f.strides[k++] = x->strides[d];
      }
  int ra = 0;
  for (int d = 0; d < nd; d++)
    ra += !((mask >> d) & 1u);
  nb_shape full = shape_of_view(&f);
  *cols = 1;
  for (int d = ra; d < nd; d++)
    *cols *= full.dims[d];
  uint32_t trailing = (uint32_t)(((uint64_t)1 << nd) - 1) & ~(uint32_t)(((uint64_t)1 << ra) - 1);
  o->in[0] = f;
  o->out = *out;
  o->scratch = false;
  group_one(&o->g, NBI_GROUP_ROWS, n, in, NBI_ROLE_ROW_REDUCE, &full, ra, &n->shape, trailing);
}

static nb_status run_reduce(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                            const nbi_view *in) {
  if (nbi_cuda_view_numel(out) == 0) return NB_OK;
  op_group o;
  int64_t cols;
  reduce_group(n, out, in, &o, &cols);
  if (cols == 0) {
    double v;
    if (!empty_reduction_value(n, &v))
      return nbi_error(NB_ERR_SHAPE, "nb_%s: zero-size reduction has no identity",
                       nbi_op_table[n->op]->name);
    return nbi_cuda_fill(c, out, v);
  }
  return run_group(c, &o.g, n, out, o.in);
}

/* softmax / log_softmax / cumsum along axis attrs.i[0]: in[0] (any strides)
 * and out share n's shape. The axis is permuted last (F); the group writes a
 * contiguous F, which is out itself when the axis is last, else scratch
 * (o->scratch: o->out has no data yet) copied into out through the same
 * permutation of out's strides (*fo). */
static nb_status axis_group(const nb_tensor *n, const nbi_view *out, const nbi_view *in,
                            op_group *o, nbi_view *fo) {
  int axis = (int)n->attrs.i[0], nd = out->ndim;
  if (axis < 0 || axis >= nd)
    return nbi_error(NB_ERR_INTERNAL, "nb_%s: axis %d of a rank-%d tensor",
                     nbi_op_table[n->op]->name, axis, nd);
  nbi_view f = in[0]; /* f and *fo: with the axis moved last */
  *fo = *out;
  for (int d = axis; d < nd - 1; d++) {
    f.dims[d] = in[0].dims[d + 1];
    f.strides[d] = in[0].strides[d + 1];
    fo->dims[d] = out->dims[d + 1];
    fo->strides[d] = out->strides[d + 1];
  }
  f.dims[nd - 1] = fo->dims[nd - 1] = in[0].dims[axis];
  f.strides[nd - 1] = in[0].strides[axis];
  fo->strides[nd - 1] = out->strides[axis];
  nb_shape full = shape_of_view(&f);
  group_one(&o->g, NBI_GROUP_ROWS, n, in, NBI_ROLE_AXIS, &full, nd - 1, &full, nd - 1);
  o->in[0] = f;
  o->scratch = axis != nd - 1;
  o->out = o->scratch ? *fo : *out;
  if (o->scratch) {
    o->out.data = (char *)(uintptr_t)NBI_PREDICTED_DATA;
    set_contig(&o->out);
  }
  return NB_OK;
}

static nb_status run_axis(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  int64_t numel = nbi_cuda_view_numel(out);
  if (numel == 0) return NB_OK;
  op_group o;
  nbi_view fo;
  nb_status st = axis_group(n, out, in, &o, &fo);
  if (st) return st;
  if (!o.scratch) return run_group(c, &o.g, n, out, o.in);
  CUdeviceptr tmp = nbi_cuda_scratch(c, (size_t)numel * nb_dtype_size(out->dtype));
  if (!tmp) return NB_ERR_OOM;
  o.out.data = (char *)(uintptr_t)tmp;
  st = run_group(c, &o.g, n, &o.out, o.in);
  if (st == NB_OK) st = nbi_cuda_copy(c, &fo, &o.out);
  nbi_cuda_free_block(c->alloc, tmp);
  return st;
}

/* ---- data movement ----------------------------------------------------------------------- */

/* reshape (the copy path: in[0]'s strides allow no view): reading in[0] in
 * row-major order is writing out in row-major order, so out is seen with
 * in[0]'s dims and contiguous strides. */
static nb_status run_reshape(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                             const nbi_view *in) {
  (void)n;
  if (nbi_cuda_view_numel(out) == 0) return NB_OK;
  nbi_view dst = in[0];
  dst.data = out->data;
  dst.dtype = out->dtype;
  set_contig(&dst);
  return nbi_cuda_copy(c, &dst, &in[0]);
}

/* permute / broadcast_to / slice / flip / identity / stop_gradient: the op's
 * view function (address arithmetic only) gives the strided window of in[0]
 * that out is a copy of. */
static nb_status run_view_copy(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                               const nbi_view *in) {
  if (nbi_cuda_view_numel(out) == 0) return NB_OK;
  nbi_view src = *out;
  src.dtype = in[0].dtype;
  if (!nbi_op_table[n->op]->view || !nbi_op_table[n->op]->view(n, &in[0], &src))
    return nbi_error(NB_ERR_INTERNAL, "nb_%s: no view of its input", nbi_op_table[n->op]->name);
  return nbi_cuda_copy(c, out, &src);
}

/* concat along attrs.i[0]: each input copied (converting to out's promoted
 * dtype) into its window of out. */
static nb_status run_concat(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                            const nbi_view *in) {
  if (nbi_cuda_view_numel(out) == 0) return NB_OK;
  int axis = (int)n->attrs.i[0];
  int64_t es = (int64_t)nb_dtype_size(out->dtype), start = 0;
  for (int k = 0; k < n->n_in; k++) {
    nbi_view dst = *out;
    dst.dims[axis] = in[k].dims[axis];
    dst.data = out->data + start * out->strides[axis] * es;
    start += in[k].dims[axis];
    if (nbi_cuda_view_numel(&dst) == 0) continue;
    nb_status st = nbi_cuda_copy(c, &dst, &in[k]);
    if (st) return st;
  }
  return NB_OK;
}

/* pad: attrs.i[2d], i[2d+1] = before / after along d, attrs.f[0] the value:
 * out filled, then in[0] copied into its interior. */
static nb_status run_pad(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  if (nbi_cuda_view_numel(out) == 0) return NB_OK;
  nb_status st = nbi_cuda_fill(c, out, n->attrs.f[0]);
  if (st || nbi_cuda_view_numel(&in[0]) == 0) return st;
  int64_t off = 0;
  for (int d = 0; d < in[0].ndim; d++)
    off += n->attrs.i[2 * d] * out->strides[d];
  nbi_view dst = *out;
  memcpy(dst.dims, in[0].dims, sizeof dst.dims);
  dst.data = out->data + off * (int64_t)nb_dtype_size(out->dtype);
  return nbi_cuda_copy(c, &dst, &in[0]);
}

/* matmul: cuBLASLt (cuda_gemm.c); an empty inner dimension gives zeros. */
static nb_status run_matmul(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                            const nbi_view *in) {
  if (nbi_cuda_view_numel(out) == 0) return NB_OK;
  if (in[0].ndim >= 1 && in[0].dims[in[0].ndim - 1] == 0) return nbi_cuda_fill(c, out, 0);
  return nbi_cuda_matmul(c, n, out, in);
}

/* ---- the table ------------------------------------------------------------------------------
 * One route per op of ops.def: the path and the result dtypes it takes. Every
 * op needs a ROUTE_<ID> below (the X-macro expansion fails to compile
 * otherwise), so a new op cannot be left out by accident. */
typedef nb_status (*op_path)(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                             const nbi_view *in);
typedef struct op_route {
  op_path run;     /* NULL: no CUDA kernel (core runs the op itself) */
  uint32_t dtypes; /* bit d: result dtype d */
  /* the modules its hand-written kernels use (prepare compiles them) */
  int (*modules)(int op, nbi_cuda_module **m);
} op_route;

#define DT(d) (1u << (d))
#define DT_FLOAT (DT(NB_F32) | DT(NB_F64) | DT(NB_F16) | DT(NB_BF16))
#define DT_ALL (DT_FLOAT | DT(NB_I32) | DT(NB_I64) | DT(NB_BOOL))
#define DT_NUM (DT_ALL & ~DT(NB_BOOL))
/* u8, i8, i16: every kernel takes them as inputs (generated kernels widen them
 * on load; sums, products and cumsums count in i64 as the CPU's); an elementwise
 * route that takes i64 results takes them as results too. */
#define DT_SMALL (DT(NB_U8) | DT(NB_I8) | DT(NB_I16))
#define DT_ANY (DT_ALL | DT_SMALL)

#define R_NONE                                                                                     \
  { NULL, 0, NULL }
#define R_EW(dts)                                                                                  \
  { run_elementwise, (dts) | ((dts)&DT(NB_I64) ? DT_SMALL : 0), NULL }
#define R_RED(dts)                                                                                 \
  { run_reduce, dts, NULL }
#define R_AXIS(dts)                                                                                \
  { run_axis, dts, NULL }
#define R_VIEW                                                                                     \
  { run_view_copy, DT_ANY, NULL }

/* clang-format off */
#define ROUTE_CONST R_NONE
#define ROUTE_NEG R_EW(DT_NUM)
#define ROUTE_ABS R_EW(DT_ALL)
#define ROUTE_SIGN R_EW(DT_ALL)
#define ROUTE_EXP R_EW(DT_FLOAT)
#define ROUTE_EXPM1 R_EW(DT_FLOAT)
#define ROUTE_LOG R_EW(DT_FLOAT)
#define ROUTE_LOG1P R_EW(DT_FLOAT)
#define ROUTE_SQRT R_EW(DT_FLOAT)
#define ROUTE_RSQRT R_EW(DT_FLOAT)
#define ROUTE_SQUARE R_EW(DT_ALL)
#define ROUTE_SIN R_EW(DT_FLOAT)
#define ROUTE_COS R_EW(DT_FLOAT)
#define ROUTE_TAN R_EW(DT_FLOAT)
#define ROUTE_TANH R_EW(DT_FLOAT)
#define ROUTE_SIGMOID R_EW(DT_FLOAT)
#define ROUTE_RELU R_EW(DT_ALL)
#define ROUTE_GELU R_EW(DT_FLOAT)
#define ROUTE_SILU R_EW(DT_FLOAT)
#define ROUTE_SOFTPLUS R_EW(DT_FLOAT)
#define ROUTE_ERF R_EW(DT_FLOAT)
#define ROUTE_FLOOR R_EW(DT_ALL)
#define ROUTE_CEIL R_EW(DT_ALL)
#define ROUTE_ROUND R_EW(DT_ALL)
#define ROUTE_RECIPROCAL R_EW(DT_FLOAT)
#define ROUTE_LOGICAL_NOT R_EW(DT(NB_BOOL))
#define ROUTE_CAST R_EW(DT_ALL)
#define ROUTE_ADD R_EW(DT_ALL)
#define ROUTE_SUB R_EW(DT_NUM)
#define ROUTE_MUL R_EW(DT_ALL)
#define ROUTE_DIV R_EW(DT_FLOAT)
#define ROUTE_POW R_EW(DT_ALL)
#define ROUTE_MAXIMUM R_EW(DT_ALL)
#define ROUTE_MINIMUM R_EW(DT_ALL)
#define ROUTE_ATAN2 R_EW(DT_FLOAT)
#define ROUTE_MOD R_EW(DT_ALL)
#define ROUTE_EQ R_EW(DT(NB_BOOL))
#define ROUTE_NE R_EW(DT(NB_BOOL))
#define ROUTE_LT R_EW(DT(NB_BOOL))
#define ROUTE_LE R_EW(DT(NB_BOOL))
#define ROUTE_GT R_EW(DT(NB_BOOL))
#define ROUTE_GE R_EW(DT(NB_BOOL))
#define ROUTE_LOGICAL_AND R_EW(DT(NB_BOOL))
#define ROUTE_LOGICAL_OR R_EW(DT(NB_BOOL))
#define ROUTE_WHERE R_EW(DT_ALL)
#define ROUTE_REDUCE_SUM R_RED(DT_NUM)      /* bool sums give i32; means are float */
#define ROUTE_REDUCE_PROD R_RED(DT_NUM)
#define ROUTE_REDUCE_MAX R_RED(DT_ANY)
#define ROUTE_REDUCE_MIN R_RED(DT_ANY)
#define ROUTE_REDUCE_ANY R_RED(DT(NB_BOOL))
#define ROUTE_REDUCE_ALL R_RED(DT(NB_BOOL))
#define ROUTE_REDUCE_VAR R_RED(DT_FLOAT)
#define ROUTE_LOGSUMEXP R_RED(DT_FLOAT)
#define ROUTE_ARGMAX R_RED(DT(NB_I64))
#define ROUTE_ARGMIN R_RED(DT(NB_I64))
#define ROUTE_SOFTMAX R_AXIS(DT_FLOAT)
#define ROUTE_LOG_SOFTMAX R_AXIS(DT_FLOAT)
#define ROUTE_CUMSUM R_AXIS(DT_NUM)
#define ROUTE_RESHAPE {run_reshape, DT_ANY, NULL}
#define ROUTE_PERMUTE R_VIEW
#define ROUTE_BROADCAST_TO R_VIEW
#define ROUTE_SLICE R_VIEW
#define ROUTE_CONCAT {run_concat, DT_ANY, NULL}
#define ROUTE_PAD {run_pad, DT_ANY, NULL}
#define ROUTE_FLIP R_VIEW
#define ROUTE_IDENTITY R_VIEW
#define ROUTE_STOP_GRADIENT R_VIEW
#define ROUTE_PLACEHOLDER R_NONE
#define ROUTE_RANDOM {nbi_cuda_random, DT_FLOAT | DT(NB_I64), nbi_cuda_random_modules}
#define ROUTE_TUPLE_GET R_NONE
#define ROUTE_TAKE {nbi_cuda_take, DT_ANY, nbi_cuda_index_modules}
#define ROUTE_TAKE_ALONG_AXIS {nbi_cuda_take_along_axis, DT_ANY, nbi_cuda_index_modules}
#define ROUTE_SCATTER_ADD {nbi_cuda_scatter_add, DT_ANY, nbi_cuda_index_modules}
#define ROUTE_SCATTER_ADD_ALONG_AXIS {nbi_cuda_scatter_add_along_axis, DT_ANY, nbi_cuda_index_modules}
#define ROUTE_ONE_HOT {nbi_cuda_one_hot, DT_ANY, nbi_cuda_index_modules}
#define ROUTE_CONV2D {nbi_cuda_conv2d, DT_FLOAT, nbi_cuda_nn_modules}
#define ROUTE_MAX_POOL2D {nbi_cuda_max_pool2d, DT_FLOAT, nbi_cuda_nn_modules}
#define ROUTE_CONV2D_BWD_DATA {nbi_cuda_conv2d_bwd_data, DT_FLOAT, nbi_cuda_nn_modules}
#define ROUTE_CONV2D_BWD_FILTER {nbi_cuda_conv2d_bwd_filter, DT_FLOAT, nbi_cuda_nn_modules}
#define ROUTE_MAX_POOL2D_BWD {nbi_cuda_max_pool2d_bwd, DT_FLOAT, nbi_cuda_nn_modules}
#define ROUTE_MAX_POOL2D_SELECT {nbi_cuda_max_pool2d_select, DT_FLOAT, nbi_cuda_nn_modules}
#define ROUTE_MATMUL {run_matmul, DT_ANY, NULL}
#define ROUTE_TO_DEVICE R_NONE
#define ROUTE_COND R_NONE
#define ROUTE_WHILE R_NONE
#define ROUTE_SCAN R_NONE
#define ROUTE_REMAT R_NONE
#define ROUTE_CUSTOM R_NONE
#define ROUTE_SHARD_MAP R_NONE
#define ROUTE_SHARD_CONSTRAINT R_NONE
#define ROUTE_SHARD_LIKE R_NONE
#define ROUTE_ALL_REDUCE R_NONE
#define ROUTE_ALL_GATHER R_NONE
#define ROUTE_REDUCE_SCATTER R_NONE
#define ROUTE_ALL_TO_ALL R_NONE
#define ROUTE_PPERMUTE R_NONE
#define ROUTE_AXIS_INDEX R_NONE
/* clang-format on */

static const op_route routes[] = {
#define NB_OP(id, name, arity, traits) [NBI_OP_##id] = ROUTE_##id,
#include "../../ops/ops.def"
#undef NB_OP
};
_Static_assert(sizeof routes / sizeof routes[0] == NBI_OP_COUNT,
               "every op of ops.def has a CUDA route");

bool nbi_cuda_supports(void *ctx, int op, nb_dtype dt) {
  (void)ctx;
  if (op < 0 || op >= NBI_OP_COUNT || (int)dt < 0 || dt >= NB_DTYPE_COUNT) return false;
  return routes[op].run && (routes[op].dtypes & DT(dt));
}

nb_status nbi_cuda_run_op(void *ctx, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  nbi_cuda_ctx *c = ctx;
  if (!c || !n || !out || (n->n_in > 0 && !in))
    return nbi_error(NB_ERR_INTERNAL, "nabla: CUDA run_op called with a NULL argument");
  if (n->op < 0 || n->op >= NBI_OP_COUNT)
    return nbi_error(NB_ERR_INTERNAL, "nabla: CUDA run_op of unknown op %d", n->op);
  const char *name = nbi_op_table[n->op]->name;
  if (!nbi_cuda_supports(ctx, n->op, out->dtype))
    return nbi_error(NB_ERR_DEVICE, "nb_%s: no CUDA kernel for a %s result", name,
                     nb_dtype_name(out->dtype));
  nb_status st = nbi_cuda_enter(c);
  if (st) return st;
  return routes[n->op].run(c, n, out, in);
}

/* ---- prepare --------------------------------------------------------------------------- */
/* The source of single op n's kernel when the function table lacks it (a
 * generated op), or a copy of each of its modules' sources that no kernel was
 * loaded from yet (a hand-written op): appended to srcs[*m..max). */
static void op_sources(nbi_cuda_ctx *c, const nb_tensor *n, const nbi_view *out,
                       const nbi_view *in, char **srcs, int *m, int max) {
  const op_route *r = &routes[n->op];
  if (!r->run || !(r->dtypes & DT(out->dtype)) || *m >= max) return;
  if (r->modules) {
    nbi_cuda_module *mods[2];
    int k = r->modules(n->op, mods);
    for (int j = 0; j < k && *m < max; j++)
      if ((srcs[*m] = module_source_missing(c, mods[j]))) ++*m;
    return;
  }
  if (nbi_cuda_view_numel(out) == 0) return;
  op_group o;
  nbi_view fo;
  int64_t cols = 1;
  nb_status st = NB_ERR_ARG;
  if (r->run == run_elementwise)
    st = ew_group(n, out, in, &o);
  else if (r->run == run_reduce)
    reduce_group(n, out, in, &o, &cols), st = NB_OK;
  else if (r->run == run_axis)
    st = axis_group(n, out, in, &o, &fo);
  if (st || cols == 0 || !nbi_cuda_group_ok(c, &o.g)) return;
  if ((srcs[*m] = nbi_cuda_group_source(c, &o.g, &o.out, o.in))) ++*m;
  /* the scratch goes to out through a strided copy (whose image precompile
   * skips when memory or disk has it) */
  if (o.scratch && *m < max && (srcs[*m] = nbi_cuda_copy_source(false, out->dtype, out->dtype)))
    ++*m;
}

void nbi_cuda_prepare(nbi_cuda_ctx *c, const nbi_prepare_list *l) {
  int max = l->n_groups + 2 * l->n_ops;
  char **srcs = calloc((size_t)(max > 0 ? max : 1), sizeof *srcs);
  if (!srcs) return;
  nb_status before = nb_last_status();
  int m = 0;
  for (int k = 0; k < l->n_groups; k++)
    if ((srcs[m] = nbi_cuda_group_source(c, l->g[k], l->out[k], l->in[k]))) m++;
  for (int k = 0; k < l->n_ops; k++)
    op_sources(c, l->ops[k], &l->op_out[k], l->op_in[k], srcs, &m, max);
  if (before == NB_OK && nb_last_status() != NB_OK) nb_clear_error(); /* best effort */
  nbi_cuda_precompile(c, srcs, m);
  for (int k = 0; k < m; k++)
    free(srcs[k]);
  free(srcs);
}
