/* src/backends/backend.h — the device seam: the backend vtable, the process-wide
 * device table, and the backend-neutral description of a fused group.
 *
 * Core reaches device memory and kernels only through this file. A device is an
 * entry of the device table (index 0 is the CPU); every tensor and buffer names
 * its device by that index. A backend is a vtable plus one context per device:
 * CPU (src/backends/cpu), the emulated device NB_EMU (src/backends/emu: memory
 * the core cannot dereference, CPU kernels behind it) and CUDA
 * (src/backends/cuda, `make CUDA=1`).
 *
 * Contracts shared by every entry below:
 *  - ctx is the device's context (nbi_device.ctx);
 *  - views (nbi_view) passed to a backend point into that device's memory:
 *    data is a device address (never dereferenced by core), strides are in
 *    elements (0 broadcasts, negative flips);
 *  - a kernel may be queued and run later (asynchronous devices): nothing a
 *    backend returns from a queued call reports errors found while the kernel
 *    runs; sync returns them (the first one since the last sync);
 *  - errors are recorded with nbi_error (message naming the public function
 *    when known) and returned. */
#ifndef NABLA_BACKEND_H
#define NABLA_BACKEND_H

#include "../core/nbi.h"
#include "../core/oprules.h"

/* ---- fused groups: the planner's backend-neutral description ----------------------
 * src/core/fuse.c groups runs of steps (elementwise chains, row groups with their
 * reductions and axis ops, GEMM epilogues) and describes each group with one
 * nbi_group. The description depends only on the graph's structure (ops, dtypes,
 * shapes, attrs, edges), never on data or addresses, so it is cached with the plan
 * (built once when the plan is made; a run only builds the views) and its key can
 * key generated code. Every device runs its groups from the description alone
 * (the CPU too: src/backends/cpu/k_fused.c).
 *
 * Members are the group's steps in topological order. A member reads other
 * members (src >= 0) or outside operands (src < 0: operand -1 - src). Roles:
 *  - FULL: an elementwise op (or a view op: reshape / broadcast_to / identity /
 *    stop_gradient, a copy of its input) on the group's full shape F; or an
 *    axis op (softmax, log_softmax, cumsum along F's last axis: role AXIS);
 *  - ROW_REDUCE: a reduction of a FULL value over F's trailing axes [ra, ndim)
 *    giving one value per row (rows = prod F[0..ra), cols = prod F[ra..ndim));
 *  - PER_ROW: an elementwise op (or view) on per-row values; a FULL member that
 *    reads a PER_ROW or ROW_REDUCE value broadcasts it along the row;
 *  - GLOBAL_REDUCE: a reduction of all rows of a PER_ROW / ROW_REDUCE value to
 *    one value (a loss's mean over the batch), computed after every row;
 *  - GLOBAL: an elementwise op (or view) on single values, after the rows.
 * Elementwise groups have only FULL members (F = their common shape, ra = ndim,
 * rows = 1 treated as one flat range).
 *
 * Operands are outside values, each given at run time as a view of F's dims
 * (nbi_view with ndim = F.ndim): a FULL reader reads element (row, col); a
 * PER_ROW / ROW_REDUCE-level reader reads (row, col 0) (its view has stride 0
 * along [ra, ndim)); a GLOBAL reader reads element 0 (every stride 0). Core
 * builds these views (broadcasting, per-row shapes laid over F's row axes), so
 * backends index every operand the same way.
 *
 * Outputs: a member with out >= 0 is stored: its value goes to out view number
 * `out` (contiguous, of the member's own shape; FULL: F; PER_ROW / ROW_REDUCE:
 * rows values; GLOBAL*: one value). Unstored members live in registers or
 * scratch only.
 *
 * GEMM epilogues (kind NBI_GROUP_GEMM): member 0 is the MATMUL (2-D), then up
 * to four aliases (IDENTITY / STOP_GRADIENT of outside values: a traced
 * parameter's wrapper), the ADD of a row bias ([N] or [1, N]) to the product,
 * and optionally one activation (RELU, GELU, TANH, SIGMOID, SILU) of the sum;
 * all roles FULL, F the product's shape. Operands are views at their own
 * shapes (not broadcast): A and B (the product's inputs), then the bias or
 * the value an alias reads. */
enum {
  NBI_GROUP_ELEMENTWISE,
  NBI_GROUP_ROWS,
  NBI_GROUP_GEMM,
};
enum {
  NBI_ROLE_FULL,
  NBI_ROLE_AXIS,
  NBI_ROLE_ROW_REDUCE,
  NBI_ROLE_PER_ROW,
  NBI_ROLE_GLOBAL_REDUCE,
  NBI_ROLE_GLOBAL,
};
#define NBI_GROUP_ATTRS 4 /* attrs.i[0..3] and attrs.f[0..1] are copied */

typedef struct nbi_group_member {
  int16_t op;     /* NBI_OP_* */
  uint8_t role;   /* NBI_ROLE_* */
  uint8_t n_in;   /* 0..3 */
  nb_dtype dtype; /* the member's result dtype */
  int16_t src[3]; /* >= 0: member index (earlier); < 0: operand -1 - src */
  int16_t out;    /* output slot, or -1 (not stored) */
  nb_shape shape; /* the member's own shape */
  int64_t ai[NBI_GROUP_ATTRS];
  double af[2];
} nbi_group_member;

typedef struct nbi_group_operand {
  nb_dtype dtype;
  uint8_t level; /* NBI_ROLE_FULL, NBI_ROLE_PER_ROW or NBI_ROLE_GLOBAL: how it is read */
} nbi_group_operand;

typedef struct nbi_group {
  uint8_t kind;   /* NBI_GROUP_* */
  nb_dtype dtype; /* the members' compute dtype (the first member's) */
  nb_shape full;  /* F */
  int ra;         /* row groups: first row axis; elementwise: F.ndim */
  int64_t rows, cols;
  int n_members, n_operands, n_outputs;
  nbi_group_member m[NBI_FUSE_MAX];
  nbi_group_operand operand[NBI_FUSE_MAX];
  uint64_t key[2]; /* structural hash of everything above */
} nbi_group;

/* ---- the backend vtable --------------------------------------------------------------- */
struct nbi_prepare_list; /* below */
/* Where prepare's predicted views point (aligned, never dereferenced). */
#define NBI_PREDICTED_DATA ((uintptr_t)1 << 20)
typedef struct nbi_backend {
  const char *name; /* "cpu", "emu", "cuda" */
  nb_device_kind kind;

  /* Raw blocks of device memory, at least 64-byte aligned; NULL when out of
   * memory (no error recorded: core's allocator reports, after trimming its
   * cache and retrying). free takes the size alloc was asked for, and may come
   * while queued kernels still use the block: the backend keeps that safe (a
   * block is reused only after them, e.g. in stream order). */
  void *(*alloc)(void *ctx, size_t nbytes);
  void (*free)(void *ctx, void *p, size_t nbytes);
  /* The backend caches blocks itself (CUDA: splitting, coalescing, stream
   * order): core's buffer cache passes its requests straight through. */
  bool own_cache;
  /* Optional: bytes handed out and bytes reserved from the device, for OOM
   * messages and tests. */
  void (*mem_info)(void *ctx, size_t *allocated, size_t *reserved);
  /* Optional: the native queue kernels of custom ops are given (CUDA: the
   * device's CUstream); NULL for the CPU. */
  void *(*native_stream)(void *ctx);

  /* Host I/O of contiguous bytes (dst/src on the host are plain memory). A
   * download waits for the kernels queued before it and, like sync, returns
   * the first error they found (so reading a value reports a failed kernel). */
  nb_status (*upload)(void *ctx, void *dev_dst, const void *host_src, size_t nbytes);
  nb_status (*download)(void *ctx, void *host_dst, const void *dev_src, size_t nbytes);

  /* dst = src elementwise (same dims), converting dtypes as nbi_copy_view
   * does; either may be strided. fill: every element of dst = value converted
   * to dst's dtype. Both views are on this device. */
  nb_status (*copy)(void *ctx, nbi_view *dst, const nbi_view *src);
  nb_status (*fill)(void *ctx, nbi_view *dst, double value);

  /* Waits for every queued kernel; returns the first error an asynchronous
   * kernel found since the last sync (e.g. an index out of range), recorded. */
  nb_status (*sync)(void *ctx);

  /* Whether op can run on this device for a result of dtype dt (and inputs as
   * the op's validation allowed): asked when the op is recorded, so a missing
   * kernel is an eager NB_ERR_DEVICE, never a failure at realization. */
  bool (*supports)(void *ctx, int op, nb_dtype dt);

  /* Runs node n alone from the backend's own kernel table: in[k] views n's
   * realized inputs (any strides), out is a fresh contiguous buffer of n's
   * shape and dtype on this device (nbi.h, nbi_kernel has the contract). */
  nb_status (*run_op)(void *ctx, const nb_tensor *n, nbi_view *out, const nbi_view *in);

  /* Fused groups: whether the device can run group g (operand counts, row
   * lengths, dtypes: the device's limits are its answers), and running it:
   * in[k] is operand k's view (see above), out[j] output slot j's buffer.
   * group_ok is asked while the planner grows a group (each step that would
   * join: the group so far, stored as if it ended there), for a GEMM epilogue
   * it matched, and for each final group; a refused step does not join, a
   * refused epilogue runs as ordinary steps, a refused final group runs step
   * by step. */
  bool (*group_ok)(void *ctx, const nbi_group *g);
  nb_status (*run_group)(void *ctx, const nbi_group *g, nbi_view *out, const nbi_view *in);

  /* Optional (NULL: nothing to do): called once before a plan first runs,
   * with its groups on this device and their views: out[k] / in[k] as
   * run_group will get them where the tensors exist already, else as core
   * predicts them (contiguous, at an aligned placeholder address that must
   * never be dereferenced); and with the steps that run alone there
   * (run_op's nodes, view ops and ops core runs itself aside), their views
   * predicted the same way: op_out[k], op_in[k][0..ops[k]->n_in). A backend
   * that compiles code per group or op compiles it here, all at once;
   * nothing is reported (run_group and run_op report). */
  void (*prepare)(void *ctx, const struct nbi_prepare_list *l);
} nbi_backend;

typedef struct nbi_prepare_list {
  int n_groups;
  const nbi_group *const *g;
  const nbi_view *const *out, *const *in;
  int n_ops;
  const nb_tensor *const *ops;
  const nbi_view *op_out;
  const nbi_view *const *op_in;
} nbi_prepare_list;

/* ---- the device table ---------------------------------------------------------------- */
#define NBI_MAX_DEVICES 32

typedef struct nbi_device {
  nb_device id;          /* public identity: kind and index */
  const nbi_backend *be; /* its backend */
  void *ctx;             /* the backend's per-device context */
  char name[16];         /* "cpu:0", "cuda:1", "emu:3" */
} nbi_device;

/* Entry i of the table (0 <= i < nbi_device_count_all()); entry 0 is the CPU. */
const nbi_device *nbi_device_at(int i);
int nbi_device_count_all(void);
/* The table index of a public device, opening it on first use (the backend's
 * init); -1 + NB_ERR_DEVICE naming fn when it does not exist. */
int nbi_device_lookup(const char *fn, nb_device d);
/* The name of table entry i, for messages ("cuda:0"). */
const char *nbi_device_name(int i);

/* Backends register their devices when the table opens (src/core/device.c
 * calls each built-in backend's probe, once, under the table's lock). register
 * returns the new index, or -1 when the table is full. */
int nbi_device_register(nb_device id, const nbi_backend *be, void *ctx);
void nbi_emu_probe(void); /* src/backends/emu: NB_EMU(0..3) */
#ifdef NABLA_CUDA
/* src/backends/cuda: one entry per GPU the driver reports (none when the CUDA
 * libraries or a GPU are missing; nbi_cuda_why() then says why). */
void nbi_cuda_probe(void);
const char *nbi_cuda_why(void);
#endif

/* nb_set_matmul_precision's setting (src/core/device.c), read by GEMM kernels. */
nb_precision nbi_matmul_precision(void);

extern const nbi_backend nbi_cpu_backend;

/* GEMM through oneDNN (f32) and OpenBLAS (f64); see src/backends/cpu/gemm.c. */
nb_status nbi_cpu_gemm(nb_dtype dt, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc);

#endif
