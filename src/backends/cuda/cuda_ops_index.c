/* src/backends/cuda/cuda_ops_index.c — CUDA kernels of the indexing family: take,
 * take_along_axis, scatter_add, scatter_add_along_axis, one_hot, with the CPU
 * kernels' semantics (../cpu/k_index.c): indices may be negative (counted from
 * the end, [-size, size); [0, size) for nb_cross_entropy's and nb_embedding's,
 * ../../ops/index.h); one outside that range writes NBI_CUDA_KERR_INDEX |
 * (op << 8) | (caller << 16) to the device's error word (the next sync reports
 * NB_ERR_INDEX naming the public function) and moves no data. An op whose result is
 * empty still checks its indices, as the CPU does.
 *
 * Gathers move elements as unsigned integers of their size (any dtype). Scatters
 * start from out = t and add in the accumulation type: f32 (f16 / bf16
 * accumulate in an f32 copy, rounded once at the end, as the CPU), f64, i32 /
 * i64 (wrapping: atomics, whose integer sums do not depend on order) and bool
 * (or). Floating-point scatter_add is deterministic and adds in the CPU's
 * order (one thread per output column, updates in index order) when there are
 * enough columns to fill the GPU or few updates per column; otherwise it uses
 * atomicAdd, whose sums differ from the CPU's only by reassociation (and from
 * run to run in the last bits). scatter_add_along_axis always runs one thread
 * per line of t along the axis, in the CPU's order. */
#include "cuda_be.h"
#include "../../core/oprules.h"

#include "../../ops/index.h" /* the attribute slots: axis, caller */

#include <assert.h>
#include <stdint.h>

/* ---- kernel sources ------------------------------------------------------------------------ */
/* clang-format off */
#define IX_COMMON \
    "/* Offsets are int64 elements. A walk maps a row-major flat index over up to 8\n" \
    " * dims to the element offsets of two operands (strides s0, s1). */\n" \
    "struct nbx_walk {\n" \
    "  int64_t n;\n" \
    "  int64_t dims[8];\n" \
    "  int64_t s0[8];\n" \
    "  int64_t s1[8];\n" \
    "};\n" \
    "\n" \
    "__device__ __forceinline__ void nbx_walk_off(const nbx_walk &w, int64_t flat,\n" \
    "                                            int64_t &o0, int64_t &o1) {\n" \
    "  for (int64_t d = w.n - 1; d >= 0; d--) {\n" \
    "    int64_t c = flat % w.dims[d];\n" \
    "    flat /= w.dims[d];\n" \
    "    o0 += c * w.s0[d];\n" \
    "    o1 += c * w.s1[d];\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "#define NBX_GRID_LOOP(i, n)                                          \\\n" \
    "  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;  \\\n" \
    "       i < (n); i += (int64_t)gridDim.x * blockDim.x)\n" \
    "\n" \
    "/* Index element off of an array of the index dtype `kind` (the host's\n" \
    " * index_kind: 0 i32, 1 i64, 2 u8, 3 i8, 4 i16). */\n" \
    "__device__ __forceinline__ int64_t nbx_index_at(const char *idx, int64_t kind,\n" \
    "                                               int64_t off) {\n" \
    "  switch (kind) {\n" \
    "  case 1: return ((const int64_t *)idx)[off];\n" \
    "  case 2: return (int64_t)((const uint8_t *)idx)[off];\n" \
    "  case 3: return (int64_t)((const int8_t *)idx)[off];\n" \
    "  case 4: return (int64_t)((const int16_t *)idx)[off];\n" \
    "  default: return (int64_t)((const int32_t *)idx)[off];\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* v normalized for an axis of `size` (v + size when negative), or -1 with\n" \
    " * code written to *err (first writer wins) when v is outside [-size, size)\n" \
    " * ([0, size) when code names a caller: bits 16..23, src/ops/index.h). The\n" \
    " * error's words 1 and 2 keep the largest v - size + 1 above the range and the\n" \
    " * largest low - v below it, word 3 the size, so the host names the same bad\n" \
    " * index as the CPU (the largest above, else the smallest below). */\n" \
    "__device__ __forceinline__ int64_t nbx_index_norm(int64_t v, int64_t size,\n" \
    "                                                 int *err, int64_t code) {\n" \
    "  int64_t low = (code >> 16) & 0xff ? 0 : -size;\n" \
    "  if (v < low || v >= size) {\n" \
    "    long long *w = (long long *)err;\n" \
    "    atomicCAS(err, 0, (int)code);\n" \
    "    if (v >= size) atomicMax(&w[1], (long long)(v - size + 1));\n" \
    "    else atomicMax(&w[2], (long long)(low - v));\n" \
    "    w[3] = size;\n" \
    "    return -1;\n" \
    "  }\n" \
    "  return v < 0 ? v + size : v;\n" \
    "}\n"

#define IX_GATHER \
    "/* take: out is (outer, K, inner) contiguous; out[o, k, i] =\n" \
    " * t[ow(o) + iw(i) + norm(idx[kw(k)]) * ax], where ow walks t's dims before\n" \
    " * the axis and iw those after (s0: t's strides), kw walks idx (s0). */\n" \
    "struct nbx_take_args {\n" \
    "  int64_t K, inner, total, size, ax, ikind, code;\n" \
    "  nbx_walk ow, kw, iw;\n" \
    "};\n" \
    "\n" \
    "template <typename T>\n" \
    "__device__ void nbx_take_body(T *out, const T *t, const char *idx, int *err,\n" \
    "                             const nbx_take_args &a) {\n" \
    "  NBX_GRID_LOOP(e, a.total) {\n" \
    "    int64_t i = e % a.inner, k = e / a.inner % a.K, o = e / a.inner / a.K;\n" \
    "    int64_t to = 0, io = 0, unused = 0;\n" \
    "    nbx_walk_off(a.ow, o, to, unused);\n" \
    "    nbx_walk_off(a.iw, i, to, unused);\n" \
    "    nbx_walk_off(a.kw, k, io, unused);\n" \
    "    int64_t v = nbx_index_norm(nbx_index_at(idx, a.ikind, io), a.size, err, a.code);\n" \
    "    if (v >= 0) out[e] = t[to + v * a.ax];\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* take_along_axis: out is O (contiguous, total elements); w walks O with s0 =\n" \
    " * idx's strides broadcast over O and s1 = t's strides, 0 along the axis and\n" \
    " * where t's extent 1 broadcasts: out[e] = t[s1 part + norm(idx[s0 part]) * ax]. */\n" \
    "struct nbx_along_args {\n" \
    "  int64_t total, size, ax, ikind, code;\n" \
    "  nbx_walk w;\n" \
    "};\n" \
    "\n" \
    "template <typename T>\n" \
    "__device__ void nbx_along_body(T *out, const T *t, const char *idx, int *err,\n" \
    "                              const nbx_along_args &a) {\n" \
    "  NBX_GRID_LOOP(e, a.total) {\n" \
    "    int64_t io = 0, to = 0;\n" \
    "    nbx_walk_off(a.w, e, io, to);\n" \
    "    int64_t v = nbx_index_norm(nbx_index_at(idx, a.ikind, io), a.size, err, a.code);\n" \
    "    if (v >= 0) out[e] = t[to + v * a.ax];\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* one_hot: out is (K, depth) contiguous and already zero; kw walks idx (s0);\n" \
    " * out[k, idx[k]] = one (the dtype's bits of 1) when idx[k] is in [0, depth). */\n" \
    "struct nbx_one_hot_args {\n" \
    "  int64_t K, depth, ikind, one;\n" \
    "  nbx_walk kw;\n" \
    "};\n" \
    "\n" \
    "template <typename T>\n" \
    "__device__ void nbx_one_hot_body(T *out, const char *idx, const nbx_one_hot_args &a) {\n" \
    "  NBX_GRID_LOOP(k, a.K) {\n" \
    "    int64_t io = 0, unused = 0;\n" \
    "    nbx_walk_off(a.kw, k, io, unused);\n" \
    "    int64_t v = nbx_index_at(idx, a.ikind, io);\n" \
    "    if (v >= 0 && v < a.depth) out[k * a.depth + v] = (T)a.one;\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* Entry points per element size (bytes move as unsigned integers). */\n" \
    "#define NBX_GATHER_KERNELS(B, T)                                             \\\n" \
    "  extern \"C\" __global__ void nbx_take_##B(T *o, const T *t, const char *i,   \\\n" \
    "                                         int *e, nbx_take_args a) {          \\\n" \
    "    nbx_take_body(o, t, i, e, a);                                            \\\n" \
    "  }                                                                         \\\n" \
    "  extern \"C\" __global__ void nbx_along_##B(T *o, const T *t, const char *i,  \\\n" \
    "                                          int *e, nbx_along_args a) {        \\\n" \
    "    nbx_along_body(o, t, i, e, a);                                           \\\n" \
    "  }                                                                         \\\n" \
    "  extern \"C\" __global__ void nbx_one_hot_##B(T *o, const char *i,            \\\n" \
    "                                            nbx_one_hot_args a) {            \\\n" \
    "    nbx_one_hot_body(o, i, a);                                               \\\n" \
    "  }\n" \
    "NBX_GATHER_KERNELS(1, uint8_t)\n" \
    "NBX_GATHER_KERNELS(2, uint16_t)\n" \
    "NBX_GATHER_KERNELS(4, uint32_t)\n" \
    "NBX_GATHER_KERNELS(8, uint64_t)\n" \
    "\n" \
    "/* The index check alone (an op whose result is empty still checks its\n" \
    " * indices, as the CPU does): kw walks idx's K elements (s0). */\n" \
    "struct nbx_check_args {\n" \
    "  int64_t K, size, ikind, code;\n" \
    "  nbx_walk kw;\n" \
    "};\n" \
    "\n" \
    "extern \"C\" __global__ void nbx_check_index(const char *idx, int *err, nbx_check_args a) {\n" \
    "  NBX_GRID_LOOP(k, a.K) {\n" \
    "    int64_t io = 0, unused = 0;\n" \
    "    nbx_walk_off(a.kw, k, io, unused);\n" \
    "    nbx_index_norm(nbx_index_at(idx, a.ikind, io), a.size, err, a.code);\n" \
    "  }\n" \
    "}\n"

#define IX_SCATTER \
    "/* Accumulation kinds (acc type A, update type U): add, used by a thread that\n" \
    " * owns the element, and atomic. f16 / bf16 accumulate in f32; integers wrap;\n" \
    " * bool is or. */\n" \
    "struct nbx_acc_f32 {\n" \
    "  typedef float A;\n" \
    "  typedef float U;\n" \
    "  static __device__ A add(A a, U u) { return a + u; }\n" \
    "  static __device__ void atomic(A *p, U u) { atomicAdd(p, u); }\n" \
    "};\n" \
    "struct nbx_acc_f64 {\n" \
    "  typedef double A;\n" \
    "  typedef double U;\n" \
    "  static __device__ A add(A a, U u) { return a + u; }\n" \
    "  static __device__ void atomic(A *p, U u) { atomicAdd(p, u); }\n" \
    "};\n" \
    "struct nbx_acc_f16 {\n" \
    "  typedef float A;\n" \
    "  typedef unsigned short U;\n" \
    "  static __device__ A add(A a, U u) { return a + nb_f16_to_f32(u); }\n" \
    "  static __device__ void atomic(A *p, U u) { atomicAdd(p, nb_f16_to_f32(u)); }\n" \
    "};\n" \
    "struct nbx_acc_bf16 {\n" \
    "  typedef float A;\n" \
    "  typedef unsigned short U;\n" \
    "  static __device__ A add(A a, U u) { return a + nb_bf16_to_f32(u); }\n" \
    "  static __device__ void atomic(A *p, U u) { atomicAdd(p, nb_bf16_to_f32(u)); }\n" \
    "};\n" \
    "struct nbx_acc_i32 {\n" \
    "  typedef int32_t A;\n" \
    "  typedef int32_t U;\n" \
    "  static __device__ A add(A a, U u) { return (A)((uint32_t)a + (uint32_t)u); }\n" \
    "  static __device__ void atomic(A *p, U u) {\n" \
    "    atomicAdd((unsigned int *)p, (unsigned int)u);\n" \
    "  }\n" \
    "};\n" \
    "struct nbx_acc_i64 {\n" \
    "  typedef int64_t A;\n" \
    "  typedef int64_t U;\n" \
    "  static __device__ A add(A a, U u) { return (A)((uint64_t)a + (uint64_t)u); }\n" \
    "  static __device__ void atomic(A *p, U u) {\n" \
    "    atomicAdd((unsigned long long *)p, (unsigned long long)u);\n" \
    "  }\n" \
    "};\n" \
    "/* u8, i8, i16: an i32 accumulator (its low bits wrap as the small dtype's) */\n" \
    "#define NBX_ACC_SMALL(S, T)                                                    \\\n" \
    "  struct nbx_acc_##S {                                                         \\\n" \
    "    typedef int32_t A;                                                         \\\n" \
    "    typedef T U;                                                               \\\n" \
    "    static __device__ A add(A a, U u) { return (A)((uint32_t)a + (uint32_t)(int32_t)u); } \\\n" \
    "    static __device__ void atomic(A *p, U u) {                                 \\\n" \
    "      atomicAdd((unsigned int *)p, (unsigned int)(int32_t)u);                  \\\n" \
    "    }                                                                          \\\n" \
    "  };\n" \
    "NBX_ACC_SMALL(u8, uint8_t)\n" \
    "NBX_ACC_SMALL(i8, int8_t)\n" \
    "NBX_ACC_SMALL(i16, int16_t)\n" \
    "struct nbx_acc_bool {\n" \
    "  typedef uint8_t A;\n" \
    "  typedef uint8_t U;\n" \
    "  static __device__ A add(A a, U u) { return (A)(a | u); }\n" \
    "  static __device__ void atomic(A *p, U u) {\n" \
    "    if (u) *p = 1; /* every writer stores the same 1 */\n" \
    "  }\n" \
    "};\n" \
    "\n" \
    "/* scatter_add: acc is (outer, n, inner) contiguous (t already copied in); the\n" \
    " * updates (outer, K, inner) are read through walks: ow over the dims before\n" \
    " * the axis and iw over those after (s0: the updates' strides), kw over idx's\n" \
    " * dims (s0: idx's strides, s1: the updates' strides of those dims).\n" \
    " *   ordered: one thread per (o, i) adds k = 0 .. K-1 in order (the CPU's\n" \
    " *            order: deterministic);\n" \
    " *   atomic:  one thread per (o, k, i), atomic adds. */\n" \
    "struct nbx_scatter_args {\n" \
    "  int64_t outer, n, K, inner, ikind, code;\n" \
    "  nbx_walk ow, kw, iw;\n" \
    "};\n" \
    "\n" \
    "template <typename Op>\n" \
    "__device__ void nbx_scatter_ordered_body(typename Op::A *acc, const typename Op::U *upd,\n" \
    "                                        const char *idx, int *err,\n" \
    "                                        const nbx_scatter_args &a) {\n" \
    "  NBX_GRID_LOOP(col, a.outer * a.inner) {\n" \
    "    int64_t o = col / a.inner, i = col % a.inner, uo = 0, unused = 0;\n" \
    "    nbx_walk_off(a.ow, o, uo, unused);\n" \
    "    nbx_walk_off(a.iw, i, uo, unused);\n" \
    "    typename Op::A *base = acc + o * a.n * a.inner + i;\n" \
    "    for (int64_t k = 0; k < a.K; k++) {\n" \
    "      int64_t io = 0, uk = uo;\n" \
    "      nbx_walk_off(a.kw, k, io, uk);\n" \
    "      int64_t v = nbx_index_norm(nbx_index_at(idx, a.ikind, io), a.n, err, a.code);\n" \
    "      if (v >= 0) base[v * a.inner] = Op::add(base[v * a.inner], upd[uk]);\n" \
    "    }\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "template <typename Op>\n" \
    "__device__ void nbx_scatter_atomic_body(typename Op::A *acc, const typename Op::U *upd,\n" \
    "                                       const char *idx, int *err,\n" \
    "                                       const nbx_scatter_args &a) {\n" \
    "  NBX_GRID_LOOP(e, a.outer * a.K * a.inner) {\n" \
    "    int64_t i = e % a.inner, k = e / a.inner % a.K, o = e / a.inner / a.K;\n" \
    "    int64_t uo = 0, io = 0, unused = 0;\n" \
    "    nbx_walk_off(a.ow, o, uo, unused);\n" \
    "    nbx_walk_off(a.iw, i, uo, unused);\n" \
    "    nbx_walk_off(a.kw, k, io, uo);\n" \
    "    int64_t v = nbx_index_norm(nbx_index_at(idx, a.ikind, io), a.n, err, a.code);\n" \
    "    if (v >= 0) Op::atomic(acc + (o * a.n + v) * a.inner + i, upd[uo]);\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* scatter_add_along_axis: acc has t's shape (contiguous). A line is t's\n" \
    " * elements that share every coordinate but the axis's: line L starts at\n" \
    " * (L / tin) * size * tin + L % tin and steps tin (tin: t's elements after the\n" \
    " * axis). lw walks t's dims but the axis, bw the dims where t has extent 1 and\n" \
    " * the updates' shape O more (s0: the updates' strides, s1: idx's strides\n" \
    " * broadcast over O); the axis has m positions (strides su, si). One thread per\n" \
    " * line adds its updates in O's row-major order (the CPU's order). */\n" \
    "struct nbx_along_scatter_args {\n" \
    "  int64_t lines, tin, size, m, su, si, bcount, ikind, code;\n" \
    "  nbx_walk lw, bw;\n" \
    "};\n" \
    "\n" \
    "template <typename Op>\n" \
    "__device__ void nbx_along_scatter_body(typename Op::A *acc, const typename Op::U *upd,\n" \
    "                                      const char *idx, int *err,\n" \
    "                                      const nbx_along_scatter_args &a) {\n" \
    "  NBX_GRID_LOOP(L, a.lines) {\n" \
    "    int64_t uo = 0, io = 0;\n" \
    "    nbx_walk_off(a.lw, L, uo, io);\n" \
    "    typename Op::A *base = acc + L / a.tin * a.size * a.tin + L % a.tin;\n" \
    "    for (int64_t b = 0; b < a.bcount; b++) {\n" \
    "      int64_t ub = uo, ib = io;\n" \
    "      nbx_walk_off(a.bw, b, ub, ib);\n" \
    "      for (int64_t j = 0; j < a.m; j++) {\n" \
    "        int64_t v = nbx_index_at(idx, a.ikind, ib + j * a.si);\n" \
    "        v = nbx_index_norm(v, a.size, err, a.code);\n" \
    "        if (v >= 0) base[v * a.tin] = Op::add(base[v * a.tin], upd[ub + j * a.su]);\n" \
    "      }\n" \
    "    }\n" \
    "  }\n" \
    "}\n" \
    "\n" \
    "/* Entry points per accumulation kind. */\n" \
    "#define NBX_SCATTER_KERNELS(S)                                                 \\\n" \
    "  extern \"C\" __global__ void nbx_scatter_ordered_##S(                          \\\n" \
    "      nbx_acc_##S::A *acc, const nbx_acc_##S::U *upd, const char *idx,          \\\n" \
    "      int *err, nbx_scatter_args a) {                                          \\\n" \
    "    nbx_scatter_ordered_body<nbx_acc_##S>(acc, upd, idx, err, a);               \\\n" \
    "  }                                                                           \\\n" \
    "  extern \"C\" __global__ void nbx_scatter_atomic_##S(                           \\\n" \
    "      nbx_acc_##S::A *acc, const nbx_acc_##S::U *upd, const char *idx,          \\\n" \
    "      int *err, nbx_scatter_args a) {                                          \\\n" \
    "    nbx_scatter_atomic_body<nbx_acc_##S>(acc, upd, idx, err, a);                \\\n" \
    "  }                                                                           \\\n" \
    "  extern \"C\" __global__ void nbx_along_scatter_##S(                            \\\n" \
    "      nbx_acc_##S::A *acc, const nbx_acc_##S::U *upd, const char *idx,          \\\n" \
    "      int *err, nbx_along_scatter_args a) {                                    \\\n" \
    "    nbx_along_scatter_body<nbx_acc_##S>(acc, upd, idx, err, a);                 \\\n" \
    "  }\n" \
    "NBX_SCATTER_KERNELS(f32)\n" \
    "NBX_SCATTER_KERNELS(f64)\n" \
    "NBX_SCATTER_KERNELS(f16)\n" \
    "NBX_SCATTER_KERNELS(bf16)\n" \
    "NBX_SCATTER_KERNELS(i32)\n" \
    "NBX_SCATTER_KERNELS(i64)\n" \
    "NBX_SCATTER_KERNELS(bool)\n" \
    "NBX_SCATTER_KERNELS(u8)\n" \
    "NBX_SCATTER_KERNELS(i8)\n" \
    "NBX_SCATTER_KERNELS(i16)\n"
/* clang-format on */

/* ---- host side ------------------------------------------------------------------------------ */

/* The host images of the kernels' argument structs (int64 fields only, so the
 * layouts match the device's). */
typedef struct ix_walk {
  int64_t n;
  int64_t dims[8];
  int64_t s0[8];
  int64_t s1[8];
} ix_walk;
typedef struct take_args {
  int64_t K, inner, total, size, ax, ikind, code;
  ix_walk ow, kw, iw;
} take_args;
typedef struct along_args {
  int64_t total, size, ax, ikind, code;
  ix_walk w;
} along_args;
typedef struct one_hot_args {
  int64_t K, depth, ikind, one;
  ix_walk kw;
} one_hot_args;
typedef struct check_args {
  int64_t K, size, ikind, code;
  ix_walk kw;
} check_args;
typedef struct scatter_args {
  int64_t outer, n, K, inner, ikind, code;
  ix_walk ow, kw, iw;
} scatter_args;
typedef struct along_scatter_args {
  int64_t lines, tin, size, m, su, si, bcount, ikind, code;
  ix_walk lw, bw;
} along_scatter_args;

static const char *const gather_names[] = {
    "nbx_take_1",    "nbx_take_2",    "nbx_take_4",      "nbx_take_8",    "nbx_along_1",
    "nbx_along_2",   "nbx_along_4",   "nbx_along_8",     "nbx_one_hot_1", "nbx_one_hot_2",
    "nbx_one_hot_4", "nbx_one_hot_8", "nbx_check_index",
};
enum { K_TAKE = 0, K_ALONG = 4, K_ONE_HOT = 8, K_CHECK = 12 };
_Static_assert(sizeof gather_names / sizeof gather_names[0] == K_CHECK + 1,
               "take, along and one_hot per element size, then the check");
static nbi_cuda_module gather_module = {
    .body = IX_COMMON IX_GATHER,
    .names = gather_names,
    .n_names = (int)(sizeof gather_names / sizeof gather_names[0]),
};

/* Scatter kernels: three per accumulation kind, kinds in nb_dtype order
 * (f32, f64, f16, bf16, i32, i64, bool, u8, i8, i16). */
static const char *const scatter_names[] = {
#define SCATTER_NAMES(S) "nbx_scatter_ordered_" S, "nbx_scatter_atomic_" S, "nbx_along_scatter_" S,
    SCATTER_NAMES("f32") SCATTER_NAMES("f64") SCATTER_NAMES("f16") SCATTER_NAMES("bf16")
        SCATTER_NAMES("i32") SCATTER_NAMES("i64") SCATTER_NAMES("bool") SCATTER_NAMES("u8")
            SCATTER_NAMES("i8") SCATTER_NAMES("i16")
#undef SCATTER_NAMES
};
enum { K_ORDERED = 0, K_ATOMIC = 1, K_ALONG_SCATTER = 2 };
static nbi_cuda_module scatter_module = {
    .body = IX_COMMON IX_SCATTER,
    .names = scatter_names,
    .n_names = (int)(sizeof scatter_names / sizeof scatter_names[0]),
};

/* Every index op checks its indices with the gather module's kernel. */
int nbi_cuda_index_modules(int op, nbi_cuda_module **m) {
  m[0] = &gather_module;
  if (op != NBI_OP_SCATTER_ADD && op != NBI_OP_SCATTER_ADD_ALONG_AXIS) return 1;
  m[1] = &scatter_module;
  return 2;
}
_Static_assert(sizeof scatter_names / sizeof scatter_names[0] == 3 * NB_DTYPE_COUNT,
               "three scatter kernels per dtype");
_Static_assert(NB_F32 == 0 && NB_F64 == 1 && NB_F16 == 2 && NB_BF16 == 3 && NB_I32 == 4 &&
                   NB_I64 == 5 && NB_BOOL == 6 && NB_U8 == 7 && NB_I8 == 8 && NB_I16 == 9,
               "scatter kernels are listed in nb_dtype order");

/* Floating-point scatter_add runs the ordered kernel (deterministic: each
 * output column's updates in index order, as the CPU) when it has at least
 * this many columns to spread over the GPU, or at most this many updates per
 * column; else atomics (the same sums up to reassociation). */
enum { ORDERED_MIN_COLUMNS = 16384, ORDERED_MAX_RUN = 512 };

/* Appends a dim of extent dim and strides s0, s1 to w (extent-1 dims move
 * nothing and are left out). A walk spans one tensor's dims: at most 8. */
static void walk_push(ix_walk *w, int64_t dim, int64_t s0, int64_t s1) {
  assert(w->n < 8 || dim == 1);
  if (dim == 1 || w->n >= 8) return;
  w->dims[w->n] = dim;
  w->s0[w->n] = s0;
  w->s1[w->n] = s1;
  w->n++;
}

/* log2 of an element size (1, 2, 4, 8): the kernel variant moving it. */
static int size_variant(nb_dtype dt) {
  size_t es = nb_dtype_size(dt);
  return es == 1 ? 0 : es == 2 ? 1 : es == 4 ? 2 : 3;
}

/* A device address (a view's data) as the CUdeviceptr a kernel argument takes. */
static CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

/* The deferred error code of an index kernel of node n (cuda_be.h): its op,
 * and for take / take_along_axis / the scatters the public composite that
 * called it (../../ops/index.h), whose indices must be >= 0. */
_Static_assert(NBI_OP_COUNT <= 256, "an op must fit bits 8..15 of a kernel error code");
static int64_t index_code(const nb_tensor *n) {
  int64_t caller = n->op == NBI_OP_ONE_HOT ? NBI_INDEX_OWN : n->attrs.i[NBI_INDEX_CALLER];
  int64_t axis = n->op == NBI_OP_ONE_HOT ? 0 : n->attrs.i[NBI_INDEX_AXIS];
  return NBI_CUDA_KERR_INDEX | (n->op << 8) | (caller << 16) | ((axis & 0x7f) << 24);
}

/* Rejects index views of a non-integer dtype (the ops' validation already did). */
static nb_status index_dtype_ok(const nb_tensor *n, const nbi_view *idx) {
  if (nbi_dtype_is_int(idx->dtype)) return NB_OK;
  return nbi_error(NB_ERR_DTYPE, "nb_%s: indices must be integers, got %s",
                   nbi_op_table[n->op]->name, nb_dtype_name(idx->dtype));
}

/* The kernels' code for an index dtype (nbx_index_at). */
static int64_t index_kind(nb_dtype dt) {
  switch (dt) {
  case NB_I64: return 1;
  case NB_U8: return 2;
  case NB_I8: return 3;
  case NB_I16: return 4;
  default: return 0;
  }
}

/* Checks every index of idx against an axis of `size` (no data moves): what
 * an op whose result is empty still does, as the CPU kernels check first. */
static nb_status check_indices(nbi_cuda_ctx *c, const nb_tensor *n, const nbi_view *idx,
                               int64_t size) {
  check_args a = {.K = nbi_cuda_view_numel(idx),
                  .size = size,
                  .ikind = index_kind(idx->dtype),
                  .code = index_code(n)};
  if (a.K == 0) return NB_OK;
  for (int d = 0; d < idx->ndim; d++)
    walk_push(&a.kw, idx->dims[d], idx->strides[d], 0);
  CUfunction f;
  nb_status st = nbi_cuda_module_fn(c, &gather_module, K_CHECK, &f);
  if (st) return st;
  CUdeviceptr pi = dptr(idx->data), err = c->err_word;
  return nbi_cuda_launch_n(c, f, a.K, (void *[]){&pi, &err, &a});
}

/* take: in[0] t (any strides), in[1] idx (K elements, any shape and strides);
 * out (outer, K, inner) contiguous = t[o, idx[k], i]. attrs.i[0] = axis. */
nb_status nbi_cuda_take(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  const nbi_view *t = &in[0], *idx = &in[1];
  int axis = (int)n->attrs.i[0];
  nb_status st = index_dtype_ok(n, idx);
  if (st) return st;
  take_args a = {.K = nbi_cuda_view_numel(idx),
                 .inner = 1,
                 .size = t->dims[axis],
                 .ax = t->strides[axis],
                 .ikind = index_kind(idx->dtype),
                 .code = index_code(n)};
  int64_t outer = 1;
  for (int d = 0; d < axis; d++) {
    outer *= t->dims[d];
    walk_push(&a.ow, t->dims[d], t->strides[d], 0);
  }
  for (int d = 0; d < idx->ndim; d++)
    walk_push(&a.kw, idx->dims[d], idx->strides[d], 0);
  for (int d = axis + 1; d < t->ndim; d++) {
    a.inner *= t->dims[d];
    walk_push(&a.iw, t->dims[d], t->strides[d], 0);
  }
  a.total = outer * a.K * a.inner;
  if (a.total == 0) return check_indices(c, n, idx, a.size);
  CUfunction f;
  if ((st = nbi_cuda_module_fn(c, &gather_module, K_TAKE + size_variant(t->dtype), &f))) return st;
  CUdeviceptr po = dptr(out->data), pt = dptr(t->data), pi = dptr(idx->data), err = c->err_word;
  return nbi_cuda_launch_n(c, f, a.total, (void *[]){&po, &pt, &pi, &err, &a});
}

/* take_along_axis: in[0] t, in[1] idx, both of rank R (any strides); out is O
 * (n's shape, contiguous): out[p] = t[p with p[axis] = idx[p]], t's and idx's
 * extent-1 dims broadcasting. attrs.i[0] = axis. */
nb_status nbi_cuda_take_along_axis(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                   const nbi_view *in) {
  const nbi_view *t = &in[0];
  int axis = (int)n->attrs.i[0];
  nb_status st = index_dtype_ok(n, &in[1]);
  if (st) return st;
  along_args a = {.total = nbi_cuda_view_numel(out),
                  .size = t->dims[axis],
                  .ax = t->strides[axis],
                  .ikind = index_kind(in[1].dtype),
                  .code = index_code(n)};
  if (a.total == 0) return check_indices(c, n, &in[1], a.size);
  nbi_view ib = nbi_view_broadcast(&in[1], &n->shape);
  for (int d = 0; d < n->shape.ndim; d++) {
    bool fixed = d == axis || t->dims[d] != n->shape.dims[d];
    walk_push(&a.w, n->shape.dims[d], ib.strides[d], fixed ? 0 : t->strides[d]);
  }
  CUfunction f;
  if ((st = nbi_cuda_module_fn(c, &gather_module, K_ALONG + size_variant(t->dtype), &f))) return st;
  CUdeviceptr po = dptr(out->data), pt = dptr(t->data), pi = dptr(ib.data), err = c->err_word;
  return nbi_cuda_launch_n(c, f, a.total, (void *[]){&po, &pt, &pi, &err, &a});
}

/* The buffer a scatter accumulates in: out itself, or for f16 / bf16 an f32
 * copy of out's shape, for u8 / i8 / i16 an i32 one (wrapping sums whose low
 * bits are the small dtype's wrapping sums; the copy back wraps) (*owned, for
 * the caller to free). acc->data is NULL on failure (recorded). */
static nbi_view accumulator(nbi_cuda_ctx *c, const nbi_view *out, CUdeviceptr *owned) {
  nbi_view acc = *out;
  *owned = 0;
  bool half = out->dtype == NB_F16 || out->dtype == NB_BF16;
  bool small = out->dtype == NB_U8 || out->dtype == NB_I8 || out->dtype == NB_I16;
  if (!half && !small) return acc;
  *owned = nbi_cuda_scratch(c, (size_t)nbi_cuda_view_numel(out) * 4);
  acc.data = (char *)(uintptr_t)*owned;
  acc.dtype = half ? NB_F32 : NB_I32;
  return acc;
}

/* Runs a scatter: acc = t (converted), the kernel `run` (when it has work),
 * out = acc when acc is a stand-in; frees the stand-in. */
static nb_status scatter_run(nbi_cuda_ctx *c, nbi_view *out, const nbi_view *t, CUfunction f,
                             int64_t work, void **args, nbi_view *acc, CUdeviceptr owned) {
  nb_status st = NB_OK;
  if (nbi_cuda_view_numel(out) > 0) st = nbi_cuda_copy(c, acc, t);
  if (st == NB_OK) st = nbi_cuda_launch_n(c, f, work, args);
  if (st == NB_OK && owned && nbi_cuda_view_numel(out) > 0) st = nbi_cuda_copy(c, out, acc);
  if (owned) nbi_cuda_free_block(c->alloc, owned);
  return st;
}

/* scatter_add: in[0] t, in[1] idx (K elements), in[2] updates of shape
 * t.shape[:axis] + idx.shape + t.shape[axis+1:] (any strides); out (t's shape,
 * contiguous, seen as (outer, n, inner)) = t, then out[o, idx[k], i] +=
 * updates[o, k, i]. attrs.i[0] = axis. */
nb_status nbi_cuda_scatter_add(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                               const nbi_view *in) {
  const nbi_view *idx = &in[1], *upd = &in[2];
  int axis = (int)n->attrs.i[0];
  nb_status st = index_dtype_ok(n, idx);
  if (st) return st;
  if (upd->ndim != out->ndim - 1 + idx->ndim)
    return nbi_error(NB_ERR_INTERNAL, "nb_scatter_add: updates of rank %d for t %d-d, idx %d-d",
                     upd->ndim, out->ndim, idx->ndim);
  scatter_args a = {.outer = 1,
                    .n = out->dims[axis],
                    .K = nbi_cuda_view_numel(idx),
                    .inner = 1,
                    .ikind = index_kind(idx->dtype),
                    .code = index_code(n)};
  for (int d = 0; d < axis; d++) {
    a.outer *= out->dims[d];
    walk_push(&a.ow, upd->dims[d], upd->strides[d], 0);
  }
  for (int d = 0; d < idx->ndim; d++)
    walk_push(&a.kw, idx->dims[d], idx->strides[d], upd->strides[axis + d]);
  for (int d = axis + idx->ndim; d < upd->ndim; d++) {
    a.inner *= upd->dims[d];
    walk_push(&a.iw, upd->dims[d], upd->strides[d], 0);
  }
  if (a.outer * a.K * a.inner == 0) {
    st = nbi_cuda_view_numel(out) > 0 ? nbi_cuda_copy(c, out, &in[0]) : NB_OK;
    return st ? st : check_indices(c, n, idx, a.n);
  }
  bool ordered = nb_dtype_is_float(out->dtype) &&
                 (a.outer * a.inner >= ORDERED_MIN_COLUMNS || a.K <= ORDERED_MAX_RUN);
  CUfunction f;
  int k = 3 * (int)out->dtype + (ordered ? K_ORDERED : K_ATOMIC);
  if ((st = nbi_cuda_module_fn(c, &scatter_module, k, &f))) return st;
  CUdeviceptr owned;
  nbi_view acc = accumulator(c, out, &owned);
  if (!acc.data) return NB_ERR_OOM;
  CUdeviceptr pa = dptr(acc.data), pu = dptr(upd->data), pi = dptr(idx->data), err = c->err_word;
  int64_t work = ordered ? a.outer * a.inner : a.outer * a.K * a.inner;
  return scatter_run(c, out, &in[0], f, work, (void *[]){&pa, &pu, &pi, &err, &a}, &acc, owned);
}

/* scatter_add_along_axis: in[0] t (rank R), in[1] idx (rank R), in[2] updates
 * of shape O (take_along_axis(t, idx, axis)'s), any strides; out (t's shape,
 * contiguous) = t, then out[p with p[axis] = idx[p]] += updates[p] for every
 * p in O, summing into t's extent-1 dims where O is wider. attrs.i[0] = axis. */
nb_status nbi_cuda_scatter_add_along_axis(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out,
                                          const nbi_view *in) {
  const nbi_view *upd = &in[2];
  int axis = (int)n->attrs.i[0], nd = out->ndim;
  nb_status st = index_dtype_ok(n, &in[1]);
  if (st) return st;
  nb_shape o = {.ndim = upd->ndim};
  memcpy(o.dims, upd->dims, sizeof o.dims);
  nbi_view ib = nbi_view_broadcast(&in[1], &o);
  along_scatter_args a = {.tin = 1,
                          .size = out->dims[axis],
                          .m = o.dims[axis],
                          .su = upd->strides[axis],
                          .si = ib.strides[axis],
                          .bcount = 1,
                          .ikind = index_kind(ib.dtype),
                          .code = index_code(n)};
  for (int d = axis + 1; d < nd; d++)
    a.tin *= out->dims[d];
  a.lines = a.size > 0 ? nbi_cuda_view_numel(out) / a.size : 0;
  for (int d = 0; d < nd; d++) {
    if (d == axis) continue;
    walk_push(&a.lw, out->dims[d], upd->strides[d], ib.strides[d]);
    if (out->dims[d] == 1 && o.dims[d] != 1) {
      a.bcount *= o.dims[d];
      walk_push(&a.bw, o.dims[d], upd->strides[d], ib.strides[d]);
    }
  }
  if (a.lines * a.bcount * a.m == 0) {
    st = nbi_cuda_view_numel(out) > 0 ? nbi_cuda_copy(c, out, &in[0]) : NB_OK;
    return st ? st : check_indices(c, n, &in[1], a.size);
  }
  CUfunction f;
  if ((st = nbi_cuda_module_fn(c, &scatter_module, 3 * (int)out->dtype + K_ALONG_SCATTER, &f)))
    return st;
  CUdeviceptr owned;
  nbi_view acc = accumulator(c, out, &owned);
  if (!acc.data) return NB_ERR_OOM;
  CUdeviceptr pa = dptr(acc.data), pu = dptr(upd->data), pi = dptr(ib.data), err = c->err_word;
  return scatter_run(c, out, &in[0], f, a.lines, (void *[]){&pa, &pu, &pi, &err, &a}, &acc, owned);
}

/* one_hot: in[0] idx (any shape and strides, any integer dtype); out is idx.shape +
 * [depth], contiguous: 0 except out[k, idx[k]] = 1 where idx[k] is in [0,
 * depth) (other rows stay 0: no error). */
nb_status nbi_cuda_one_hot(nbi_cuda_ctx *c, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  const nbi_view *idx = &in[0];
  nb_status st = index_dtype_ok(n, idx);
  if (st || nbi_cuda_view_numel(out) == 0) return st;
  one_hot_args a = {.K = nbi_cuda_view_numel(idx),
                    .depth = out->dims[out->ndim - 1],
                    .ikind = index_kind(idx->dtype)};
  char one[8] = {0};
  nbi_store_f64(one, out->dtype, 0, 1.0);
  memcpy(&a.one, one, sizeof a.one); /* the low bytes hold the element's bits */
  for (int d = 0; d < idx->ndim; d++)
    walk_push(&a.kw, idx->dims[d], idx->strides[d], 0);
  CUfunction f;
  if ((st = nbi_cuda_module_fn(c, &gather_module, K_ONE_HOT + size_variant(out->dtype), &f)))
    return st;
  if ((st = nbi_cuda_fill(c, out, 0))) return st;
  CUdeviceptr po = dptr(out->data), pi = dptr(idx->data);
  return nbi_cuda_launch_n(c, f, a.K, (void *[]){&po, &pi, &a});
}
