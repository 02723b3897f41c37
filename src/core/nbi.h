/* src/core/nbi.h — internal contract shared by core, ops and backends.
 * Public names are nb_*, internal ones nbi_* (or static). */
#ifndef NABLA_NBI_H
#define NABLA_NBI_H

#include <nabla/nabla.h>
#include <stdarg.h>
#include <string.h>

/* ---- errors ---------------------------------------------------------------
 * nbi_error records the thread's first error (later ones are ignored until
 * nb_clear_error) and returns the status so callers can `return nbi_error(...)`.
 * Messages start with the public function's name: "nb_matmul: ...". */
nb_status nbi_error(nb_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A public function built from other public ones (nb_mse from nb_sub, ...)
 * runs its body between these, so an error an inner op records names the
 * function the user called first: "nb_mse: nb_sub: shapes [2,3] and [4,5] do
 * not broadcast". The outermost such function wins; begin returns the
 * context to restore:
 *   const char *outer = nbi_error_context_begin("nb_mse");
 *   nb_tensor *r = ...;
 *   nbi_error_context_end(outer);
 * Errors found later, at realization, name their function by other means
 * (the index ops' caller attribute, src/ops/index.h). */
const char *nbi_error_context_begin(const char *fn);
void nbi_error_context_end(const char *outer);
/* true if any of the n tensors is NULL (and records NB_ERR_NULL naming fn and
 * the argument position unless an earlier error is already recorded). */
bool nbi_any_null(const char *fn, nb_tensor *const *ts, int n);

/* ---- dtypes ------------------------------------------------------------- */
bool nbi_dtype_valid(nb_dtype dt);
bool nbi_dtype_is_int(nb_dtype dt); /* i32, i64, u8, i8, i16 (not bool) */
float nbi_f16_to_f32(uint16_t h);
uint16_t nbi_f32_to_f16(float f); /* round to nearest even */
float nbi_bf16_to_f32(uint16_t h);
uint16_t nbi_f32_to_bf16(float f); /* round to nearest even */
/* Element i of a typed array read as double / int64 (exact for every integer
 * dtype), and stored from double (float dtypes: rounding; ints: truncation
 * toward zero, saturating; u8/i8/i16: truncation then wrapping; bool: != 0)
 * / int64 (i32: saturating; u8/i8/i16: wrapping, as a PyTorch cast). */
double nbi_load_f64(const void *p, nb_dtype dt, int64_t i);
int64_t nbi_load_i64(const void *p, nb_dtype dt, int64_t i);
void nbi_store_f64(void *p, nb_dtype dt, int64_t i, double v);
void nbi_store_i64(void *p, nb_dtype dt, int64_t i, int64_t v);

/* ---- hashing ----------------------------------------------------------------
 * Structural hashes (plans, programs, payloads) mix 64-bit words into two
 * independent lanes (multiply-xorshift), one word at a time. */
static inline void nbi_hash_mix(uint64_t *a, uint64_t *b, uint64_t w) {
  *a = (*a ^ w) * 0x100000001b3ull;
  *a ^= *a >> 32;
  *b = (*b + w + 1) * 0x9e3779b97f4a7c15ull;
  *b ^= *b >> 29;
}

/* ---- reference counts -------------------------------------------------------
 * Every refcount (tensors, buffers, payloads, programs, functions, meshes) is
 * changed atomically: a jitted function, its program and its captures are
 * shared by the threads that call it. */
#define NBI_REF_INC(x) ((void)__atomic_fetch_add(&(x)->refcount, 1, __ATOMIC_RELAXED))
#define NBI_REF_DEC(x) __atomic_sub_fetch(&(x)->refcount, 1, __ATOMIC_ACQ_REL) /* new count */

/* ---- shapes ----------------------------------------------------------------- */
#define NBI_MAX_NUMEL ((int64_t)1 << 48) /* larger requests are NB_ERR_OVERFLOW */
/* numel of s, or -1 on overflow past NBI_MAX_NUMEL / negative dims. */
int64_t nbi_numel(const nb_shape *s);
/* Checks ndim in [0, NB_MAX_DIMS], dims >= 0, numel <= NBI_MAX_NUMEL; records
 * an error naming fn otherwise. */
nb_status nbi_check_shape(const char *fn, const nb_shape *s);
bool nbi_shape_eq(const nb_shape *a, const nb_shape *b);
/* NumPy broadcast of a and b into out; error naming fn on mismatch. */
nb_status nbi_broadcast_shapes(const char *fn, const nb_shape *a, const nb_shape *b, nb_shape *out);
/* Normalizes a possibly negative axis for a rank; error naming fn if out of range. */
nb_status nbi_norm_axis(const char *fn, int axis, int ndim, int *out);
/* Axes (NB_ALL allowed) -> bitmask over ndim; error on range or duplicates. */
nb_status nbi_axes_mask(const char *fn, nb_axes axes, int ndim, uint32_t *mask);
/* Contiguous row-major strides (elements) of s. */
void nbi_contig_strides(const nb_shape *s, int64_t *strides);

/* ---- buffers, views, storage ------------------------------------------------ */
typedef struct nbi_buffer {
  int32_t refcount;
  int device; /* index into the backend table; 0 = CPU */
  size_t nbytes;
  void *data; /* 64-byte aligned */
  /* An external buffer (nbi_buffer_wrap): memory the allocator does not own,
   * handed back by calling ext_free(ext_ctx) at refcount 0. NULL otherwise. */
  void (*ext_free)(void *ext_ctx);
  void *ext_ctx;
} nbi_buffer;

/* A strided window of a buffer: what kernels read and write. Strides and the
 * data pointer are in elements of dtype / bytes resp.; data already includes the
 * offset. A stride of 0 broadcasts; negative strides appear for flips. */
typedef struct nbi_view {
  char *data;
  nb_dtype dtype;
  int ndim;
  int64_t dims[NB_MAX_DIMS];
  int64_t strides[NB_MAX_DIMS];
} nbi_view;

/* Where one shard of a realized tensor lives: a buffer, an element offset, strides. */
typedef struct nbi_storage {
  nbi_buffer *buf; /* NULL while not realized */
  int64_t offset;
  int64_t strides[NB_MAX_DIMS];
} nbi_storage;

/* Buffers come from a caching allocator (src/core/alloc.c): size classes, one
 * free list per class, a byte cap (env NABLA_CACHE_BYTES, default 1 GiB). */
/* A buffer on device dev (an index of the device table, src/backends/backend.h). */
nbi_buffer *nbi_buffer_alloc(int dev, size_t nbytes); /* NULL + NB_ERR_OOM on failure */
void nbi_buffer_retain(nbi_buffer *b);
/* A CPU buffer over nbytes of memory the caller owns at data (64-byte aligned:
 * a memory map's start), one reference; at refcount 0 ext_free(ext_ctx) is
 * called instead of caching the memory (src/io's memory-mapped files). It
 * counts in live_bytes while it lives. NULL + NB_ERR_OOM on failure (ext_free
 * is then not called). */
nbi_buffer *nbi_buffer_wrap(void *data, size_t nbytes, void (*ext_free)(void *), void *ext_ctx);
void nbi_buffer_release(nbi_buffer *b);       /* at refcount 0: back to the cache or freed */
size_t nbi_buffer_class_bytes(size_t nbytes); /* block size serving a request; 0: too big */
void nbi_buffer_cache_trim(void);             /* frees every cached block */
size_t nbi_buffer_cache_set_cap(size_t cap);  /* returns the old cap; evicts down to cap */
void nbi_buffer_cache_stats(nb_stats *s);     /* fills cached_bytes */

bool nbi_view_is_contiguous(const nbi_view *v);
/* Copies src into dst elementwise (same dims), converting dtype; either may be
 * strided. Multithreaded for large sizes. */
void nbi_copy_view(nbi_view *dst, const nbi_view *src);
/* Fills dst with value converted to its dtype. */
void nbi_fill_view(nbi_view *dst, double value);
/* Returns v with its dims broadcast to s (stride 0 on broadcast dims; leading
 * dims added). s must be a valid broadcast target of v. */
nbi_view nbi_view_broadcast(const nbi_view *v, const nb_shape *s);

/* ---- host I/O through the seam (src/core/device.c) ----------------
 * Every place outside the backends that reads or writes tensor data from the
 * host goes through these: nb_to_host, nb_item, nb_from_data, creation, the
 * RNG, printing, constant folding, control-flow predicates, checkpoint and
 * shard_map copies, autodiff bases, custom ops. */
/* dst (host, contiguous, v's dims and dst_dt) = view v on device dev. */
nb_status nbi_host_read(int dev, const nbi_view *v, void *dst, nb_dtype dst_dt);
/* view v on device dev = src (host, contiguous, v's dims, src_dt). */
nb_status nbi_host_write(int dev, nbi_view *v, const void *src, nb_dtype src_dt);
/* t's data in place, read-only, when the host can read it: t realized, one
 * contiguous shard on a CPU device. *p then points at its first element and
 * *hold is t's buffer, retained (release it when done: while held, no plan
 * writes over it in place). False otherwise (read a copy with nbi_host_read). */
bool nbi_host_borrow(const nb_tensor *t, const void **p, nbi_buffer **hold);
/* Element 0 of v as double (one small download). */
nb_status nbi_host_scalar(int dev, const nbi_view *v, double *out);
/* dst = src on one device (copy with conversion), and fill. */
nb_status nbi_dev_copy(int dev, nbi_view *dst, const nbi_view *src);
/* dst (on dst_dev) = src (on src_dev), same dims: one device's copy, or through
 * the host between two devices. */
nb_status nbi_copy_between(int dst_dev, nbi_view *dst, int src_dev, const nbi_view *src);
nb_status nbi_dev_fill(int dev, nbi_view *dst, double value);
nb_status nbi_dev_sync(int dev);

/* ---- op attributes ---------------------------------------------------------- */
#define NBI_MAX_IATTR 32
#define NBI_MAX_FATTR 4
/* Plain data, zero-initialized, hashed and compared bytewise: each op documents
 * the meaning of its slots next to its definition. */
typedef struct nbi_attrs {
  int64_t i[NBI_MAX_IATTR];
  double f[NBI_MAX_FATTR];
} nbi_attrs;

/* ---- payloads ------------------------------------------------------------------
 * An object a node carries beyond its attrs: the body programs of control flow,
 * a custom op's definition. Reference counted; a node retains its payload and
 * releases it when freed. Every concrete payload embeds this header first.
 * Plans hash attrs, not payloads: a node that has one stores its structural
 * hash (h1, h2) in attrs.i[0..1], so two nodes whose payloads hash equal must
 * compute the same function (programs hash their whole structure). */
typedef struct nbi_payload {
  int32_t refcount;
  void (*destroy)(struct nbi_payload *p); /* frees the concrete payload */
  uint64_t h1, h2;                        /* structural hash */
} nbi_payload;
/* Sets a node's payload just recorded (retained), on its physical tensors too
 * when the node is sharded (src/sharding records one node per device). */
void nbi_set_payload(nb_tensor *t, nbi_payload *p);
nbi_payload *nbi_payload_retain(nbi_payload *p); /* NULL is ignored */
void nbi_payload_release(nbi_payload *p);        /* NULL is ignored */

/* ---- tensors ------------------------------------------------------------------ */
enum {
  NBI_T_REALIZED = 1u << 0, /* shards hold the data */
  NBI_T_TRACED = 1u << 1,   /* symbolic (transforms); data may not be read */
  /* Imperative autodiff (src/transforms/backward.c): */
  NBI_T_REQUIRES_GRAD = 1u << 2, /* a leaf nb_backward accumulates into */
  NBI_T_GRAD_PATH = 1u << 3,     /* depends on a leaf: keeps its graph edges
                                    (provenance) even when realized */
  NBI_T_GRAD_FREED = 1u << 4,    /* provenance freed by a backward */
  /* A held node a realization left pending (src/core/plan.c, "Memory
   * policy"); tracked in the lazy set while it lives (src/core/tensor.c). */
  NBI_T_LAZY = 1u << 5,
  /* The block of a device another process of the job holds (a mesh spanning
   * ranks, src/sharding): shape and dtype only, never read (nbi_remote_leaf). */
  NBI_T_REMOTE = 1u << 6,
  /* A pending node that carries no live provenance and whose inputs are
   * frozen pending nodes, private leaves (shares of the buffers of the dsts
   * and requires-grad leaves it read) or tensors whose frozen_src is set: an
   * nb_assign whose dsts have neither cannot change its value, so its walk
   * passes over it (src/core/assign.c, freeze_lazy). */
  NBI_T_FROZEN = 1u << 7,
};

/* The fields graph walks read (refcount to in) come first: they share one
 * cache line. */
struct nb_tensor {
  int32_t refcount;
  uint32_t flags;
  int op;         /* NBI_OP_* that produces it (NBI_OP_CONST for data leaves) */
  nb_dtype dtype;
  int device;     /* device table index (src/backends/backend.h): where its data lives */
  int n_in;
  int32_t mark;   /* scratch for graph passes (realization); -1 when idle */
  int32_t aux;    /* scratch for transform sweeps (src/transforms); -1 when idle */
  int n_phys;     /* see mesh below */
  uint32_t owner; /* the thread that made it (nbi_thread_id); see nbi_record */
  /* Realized, and frozen nodes may read it (NBI_T_FROZEN). Not a flag: it
   * is set on realized tensors, which other threads may read meanwhile, and
   * only the owner thread's nb_assign reads or writes this byte. */
  uint8_t frozen_src;
  uint32_t magic; /* NBI_MAGIC_LIVE; NBI_MAGIC_DEAD once released (NABLA_DEBUG) */
  uint64_t seq;   /* creation order (process-wide, increasing): a node can only
                     depend on nodes with a smaller seq */
  nb_tensor **in; /* retained inputs while pending; in_inline when n_in <= 3 */
  nb_tensor *in_inline[3];
  nb_shape shape;
  nbi_attrs attrs;
  /* A sharded tensor (src/sharding) has a mesh (retained), a sharding
   * (owned, freed by the sharding layer's release hook) and one physical
   * single-device tensor per device (phys[0..n_phys), one reference per
   * entry; entries may repeat). It is marked realized and has no storage of
   * its own: readers gather it (nbi_shard_hooks), realizations realize its
   * physical tensors. */
  struct nb_mesh *mesh;
  struct nbi_sharding *sharding;
  nb_tensor **phys;
  /* Data: one storage per shard of the tensor's mesh. A single-device tensor
   * (mesh NULL) has one shard: shards == &shard0. */
  int n_shards;
  nbi_storage *shards;
  nbi_storage shard0;
  nb_tensor *grad;      /* accumulated gradient of a requires-grad leaf (owned) */
  nbi_payload *payload; /* retained; multi-output ops and custom calls */
};

/* The sharding layer's entry points into core (set by src/sharding when the
 * first mesh is made; core does not depend on sharding):
 *  record: nbi_record of an op one of whose inputs is sharded (per-op
 *    propagation, resharding, one node per device);
 *  gather: t's (sharded) logical value as a single-device tensor, for
 *    readers: new in the current scope (pending partial sums reduced), or,
 *    when t is whole on every device, its device-0 tensor itself (borrowed);
 *  release: frees t's sharding when t dies (core releases mesh and phys). */
struct nbi_program;
typedef struct nbi_shard_hooks {
  nb_tensor *(*record)(int op, nb_dtype dt, const nb_shape *shape, nb_tensor *const *in, int n_in,
                       const nbi_attrs *attrs);
  nb_tensor *(*gather)(const char *fn, nb_tensor *t);
  void (*release)(nb_tensor *t);
  void (*mesh_release)(struct nb_mesh *m);
  /* nbi_program_apply when an input is sharded: graph-mode propagation over
   * the whole program, then each node applied with its chosen sharding. */
  nb_status (*apply_program)(const char *fn, const struct nbi_program *p, nb_tensor *const *in,
                             nb_tensor **out);
} nbi_shard_hooks;
extern nbi_shard_hooks nbi_shard_hook;
/* What a reader reads: t, or a sharded t gathered into one tensor (in the
 * current scope). NULL + error on failure. */
nb_tensor *nbi_readable(const char *fn, nb_tensor *t);

/* View of shard 0 of a realized tensor. */
nbi_view nbi_tensor_view(const nb_tensor *t);

/* Makes a pending node: checks nothing (the op's public function has already
 * validated), retains the inputs, registers the result in the current scope.
 * attrs may be NULL (all zero). Returns NULL + NB_ERR_OOM on failure. */
nb_tensor *nbi_record(int op, nb_dtype dt, const nb_shape *shape, nb_tensor *const *in, int n_in,
                      const nbi_attrs *attrs);
/* Makes a realized leaf holding a fresh contiguous buffer (contents
 * uninitialized), registered in the current scope. */
nb_tensor *nbi_leaf_alloc(const char *fn, const nb_shape *shape, nb_dtype dt);
/* The same on device dev (a device table index). */
nb_tensor *nbi_leaf_alloc_on(const char *fn, const nb_shape *shape, nb_dtype dt, int dev);
/* A realized CPU leaf of shape s and dtype dt over b's memory from element
 * offset (contiguous, b retained), registered in the current scope: the caller
 * has checked that numel(s) elements of dt from offset lie within b. */
nb_tensor *nbi_leaf_wrap(const char *fn, nbi_buffer *b, int64_t offset, const nb_shape *s,
                         nb_dtype dt);
/* The calling thread's default device (table index; nb_set_default_device),
 * the index of a public device (-1 + NB_ERR_DEVICE naming fn when there is
 * none), and a device's name for messages ("cuda:0"). src/core/device.c. */
int nbi_default_device(void);
/* Makes dev the device new leaves go to on this thread (nbi_default_device)
 * until nbi_device_pop(the returned token): the sweeps run each node's rules
 * so, so the constants a rule makes (nb_scalar, zeros) sit beside its node. */
int nbi_device_push(int dev);
void nbi_device_pop(int token);
/* A realized leaf of shape s filled with value, on device dev. */
nb_tensor *nbi_full_on(int dev, const nb_shape *s, double value, nb_dtype dt);
int nbi_device_lookup(const char *fn, nb_device d);
const char *nbi_device_name(int i);
/* Device i's public identity, and the native queue its backend gives custom
 * kernels (CUDA: the CUstream; NULL elsewhere). */
nb_device nbi_device_public(int i);
void *nbi_device_native_stream(int i);
/* NABLA_DEBUG=1 (read at load): released handles are quarantined, never
 * reused, and marked dead, so a use after release (nb_release, or the end of
 * the owning scope) is an error naming the function and the handle instead of
 * memory corruption; nb_release of a reference a scope owns is refused. */
enum { NBI_MAGIC_LIVE = 0x6e61626c, NBI_MAGIC_DEAD = 0x64656164 };
extern bool nbi_debug;
bool nbi_dead_report(const char *fn, const nb_tensor *t, int idx);
/* True (error recorded) when t is a released handle: debug mode only. idx: the
 * input's position, or -1. */
static inline bool nbi_dead(const char *fn, const nb_tensor *t, int idx) {
  return nbi_debug && t->magic != NBI_MAGIC_LIVE && nbi_dead_report(fn, t, idx);
}
/* Scope depth and floor around a user function body (nb_call): the body may
 * not end a scope it did not begin (nb_scope_end below the floor is
 * NB_ERR_SCOPE); scopes it left open are closed by nbi_scope_unwind, which
 * keeps keep[0..n) alive in the scope left current. */
int nbi_scope_depth(void);
int nbi_scope_floor_set(int floor);                             /* returns the previous floor */
int nbi_scope_unwind(int depth, nb_tensor *const *keep, int n); /* scopes it closed */
/* Traced functions being run by this thread (nbi_trace_run nests them): the
 * seeded generator refuses to draw inside one (its numbers would be constants
 * of the trace; keys are the way, include/nabla/random.h). */
extern _Thread_local int nbi_trace_depth;
/* The calling thread's number (1, 2, ... in order of first use): tensors
 * record it as their owner. */
uint32_t nbi_thread_id(void);
/* Registers t (one reference, the scope's from now on) in the current scope and
 * returns it; when the scope cannot grow, releases that reference and returns
 * NULL with NB_ERR_OOM. */
nb_tensor *nbi_scope_register(nb_tensor *t);
/* nb_keep for a tensor the current scope registered among its last few: its
 * entry moves to the enclosing scope (no refcount change); else nb_keep. */
nb_tensor *nbi_keep_moved(nb_tensor *t);
/* Releases a tensor's graph inputs (after realization, when nothing needs them). */
void nbi_tensor_drop_graph(nb_tensor *t);
/* A realized leaf that shares t's shard-0 storage (buffer retained, same
 * offset and strides), registered in the current scope: how a kernel hands
 * its inputs to a nested realization (src/core/program.c). t must hold data
 * (realized, or an intermediate of the realization running t's consumer). */
nb_tensor *nbi_leaf_share(nb_tensor *t);
/* The same, taking t's buffer reference instead of a new one: t is left
 * without storage (a jitted call's roots hand their values to its outputs). */
nb_tensor *nbi_leaf_take(nb_tensor *t);
/* A sharded tensor (see struct nb_tensor) of that logical shape and dtype,
 * registered in the current scope. Takes over a mesh reference, the sharding
 * (freed by the release hook) and one reference per entry of phys (the array
 * is copied). NULL + NB_ERR_OOM (nothing taken over) on failure. */
nb_tensor *nbi_sharded_new(const nb_shape *shape, nb_dtype dt, struct nb_mesh *m,
                           struct nbi_sharding *sh, nb_tensor *const *phys, int n_phys);
/* A remote block (NBI_T_REMOTE): a realized leaf of that shape and dtype on
 * device dev whose storage is one element (NaN, or 0 for integers) repeated
 * (strides 0): it holds no memory of its size, and reading it by mistake
 * shows NaN. Registered in the current scope. NULL + error on failure. */
nb_tensor *nbi_remote_leaf(const nb_shape *shape, nb_dtype dt, int dev);
/* nb_custom_call (src/ops/custom.c) whose callbacks (infer, kernels) get this
 * call's user instead of the op's: taken over, release(user) when the node
 * goes (or at once when the call fails). */
nb_status nbi_custom_call_user(const struct nb_custom_op *op, nb_tensor *const *in, int n_in,
                               nb_tensor **out, int n_out, void *user, void (*release)(void *));
/* A symbolic input of a trace: a pending, traced node of op PLACEHOLDER with
 * that shape and dtype. It is never realized (it has no value); transforms
 * replace it (vmap by a batched value, jit by the call's arguments). */
nb_tensor *nbi_placeholder(const nb_shape *shape, nb_dtype dt);
uint64_t nbi_live_tensors(void);
/* The seq the next tensor will get: nodes made from now on have seq >= it. */
uint64_t nbi_next_seq(void);
/* Appends every tensor that is neither realized nor traced and is registered
 * in the calling thread's scopes (or is a physical tensor of a sharded one
 * registered there) or is a lazy node (NBI_T_LAZY) to *out
 * (malloc'd array grown as needed; a tensor may appear twice); frozen ones
 * (NBI_T_FROZEN) only when !skip_frozen. */
nb_status nbi_held_pending(nb_tensor ***out, int *n, int *cap, bool skip_frozen);
/* Whether nbi_held_pending would append anything (allocates nothing). */
bool nbi_any_held_pending(void);
/* The lazy set: nbi_lazy_reserve makes room for n more (error naming
 * nb_eval on OOM), nbi_lazy_add then cannot fail; a lazy node leaves the set
 * when it is realized (nbi_lazy_remove) or freed. */
nb_status nbi_lazy_reserve(int n);
void nbi_lazy_add(nb_tensor *t);
void nbi_lazy_remove(nb_tensor *t);

/* ---- fusion (src/core/fuse.c) ---------------------------------------------------------
 * The planner runs runs of consecutive steps as one kernel:
 *  - elementwise groups: elementwise steps of one dtype and one shape;
 *  - row groups: the same plus reductions of the trailing axes of that "full"
 *    shape F (keepdims or not) and elementwise steps on the reduced "per-row"
 *    shape, whose values later members broadcast back over F (keepdims shape);
 *    axis ops along the last axis (softmax, log_softmax, cumsum) are full
 *    members. A row group may end with global members, computed once after the
 *    rows: a reduction of all rows of a per-row member (a loss's mean over the
 *    batch) and elementwise ops on such single values;
 *  - GEMM epilogues: a 2-D [matmul, add row bias, activation].
 * View ops join a group as copies. Which ops may join is read from the op's
 * traits (ops.def: NBI_TR_EW, NBI_TR_REDUCE with or without NBI_TR_AXIS,
 * NBI_TR_ALIAS / NBI_TR_VIEW); whether a device runs a group, and so how far a
 * group grows, is the device backend's answer for the group's neutral
 * description (src/backends/backend.h, "fused groups": group_ok). Values used
 * only inside a group are never materialized. */
#define NBI_FUSE_MAX 16 /* members of a group; also its operands and its outputs */
/* On unless the environment sets NABLA_NO_FUSION=1; tests compare both. */
bool nbi_fusion_enabled(void);
void nbi_set_fusion(bool on);

/* ---- simplification (src/core/simplify.c) -------------------------------------------
 * Before grouping, the planner finds steps whose value another step or leaf
 * already has (common subexpressions, no-op views and casts); they do not run
 * and share their source's storage. Same arguments as nbi_fuse_plan (fuse.h); writes
 * alias[i] (the mark of the step or leaf whose value step i has; i when i
 * computes) and needed[i] (held, or read by a needed step that computes).
 * On unless the environment sets NABLA_NO_SIMPLIFY=1; tests compare both. */
bool nbi_simplify_enabled(void);
void nbi_set_simplify(bool on);

void nbi_simplify_plan(nb_tensor *const *nodes, int n, const bool *held, int *alias, bool *needed);

/* The plan nbi_realize would run for ts, built fresh (nothing is cached, run
 * or changed) for nb_graph_dot. nodes and leaves are in topological order;
 * while the description lives, every node's mark is its index and every
 * leaf's is -3 - its index. Release with nbi_plan_describe_free. */
typedef struct nbi_plan_desc {
  int n, n_leaves;
  nb_tensor **nodes, **leaves;
  bool *held;  /* [n] */
  int *alias;  /* [n] as nbi_simplify_plan */
  int n_run;   /* steps that compute, in the order they run: */
  int *run;    /* [n_run] step index */
  int *group;  /* [n_run] first run position of its fused group */
  bool *store; /* [n_run] the value gets a buffer (else it lives in tiles) */
  void *internal;
} nbi_plan_desc;
nb_status nbi_plan_describe(nb_tensor *const *ts, int n, nbi_plan_desc *d);
void nbi_plan_describe_free(nbi_plan_desc *d);

/* ---- realization, stats ------------------------------------------------------ */
/* Reentrant: a kernel may realize a new graph (nbi_program_run) while its
 * own realization runs; nested realizations count in nb_stats like any other
 * but their time is not added to plan_ns/exec_ns twice. */
nb_status nbi_realize(nb_tensor *const *ts, int n);
/* nb_backward's realization (single-device ts): as nbi_realize, except that
 * nodes with provenance (NBI_T_GRAD_PATH, not requires-grad leaves, not
 * roots) that scopes hold are planned as temporaries, freed after their last
 * use, and left lazy: the forward's intermediates die as the backward
 * consumes them, and one read later recomputes it. Non-root nodes made since
 * seq0 (the backward graph, held by nb_backward's own scope only) are
 * temporaries too. */
nb_status nbi_realize_backward(nb_tensor *const *ts, int n, uint64_t seq0);
/* Realizations (and executable runs) in progress on this thread: > 0 while a
 * kernel runs, e.g. one running a body program (nbi_program_run). */
int nbi_realize_depth(void);
/* A planned executable: the pending graph ending in roots, planned once and
 * run on new inputs with no graph work (nb_jit's fast path). slots are
 * realized leaves standing for the inputs (their layouts are planned for);
 * the graph's other leaves stay fixed. nbi_exec_build retains slots and roots
 * and releases the slots' storage (bound per run); NULL when out of memory (no error recorded: the
 * caller takes the slow path). nbi_exec_fits: in[k] (one per slot) can be bound to slot k:
 * realized, single-device, same dtype, shape and strides, and x is not running. nbi_exec_run: binds
 * them, runs the plan and returns each root's value as a fresh realized leaf in the current scope;
 * the nodes stay pending and empty. Requires nbi_exec_fits. */
typedef struct nbi_exec nbi_exec;
nbi_exec *nbi_exec_build(nb_tensor *const *slots, int n_slots, nb_tensor *const *roots,
                         int n_roots);
bool nbi_exec_fits(const nbi_exec *x, nb_tensor *const *in);
nb_status nbi_exec_run(nbi_exec *x, nb_tensor *const *in, nb_tensor **out);
void nbi_exec_free(nbi_exec *x);
/* nb_assign's realization (src/core/assign.c): realizes val together with every
 * pending tensor held by the thread's scopes that reads dst (transitively), so
 * none of them can see dst's next value; lazy readers read a leaf sharing
 * dst's current buffer instead (or run too, while nb_backward may still need
 * their provenance). dst's current value dies in it: an elementwise step may
 * write over dst's buffer (if the realization then fails, dst keeps its
 * buffer but its values are unspecified). */
nb_status nbi_realize_assign(nb_tensor *dst, nb_tensor *val);
/* The same for several: realizes val[0..n_val-1] with every held pending
 * tensor that reads one of dst[0..n_dst-1], in one plan (distinct dsts; a
 * dst that is also one of the vals keeps its value in the plan). */
nb_status nbi_realize_assign_n(nb_tensor *const *dst, int n_dst, nb_tensor *const *val, int n_val);
/* nb_assign's rebind of a single-device dst (src/core/assign.c): realizes
 * val with dst's pending readers (nbi_realize_assign), then dst becomes a
 * realized leaf sharing val's storage, keeping only its requires-grad flag
 * (its graph edges are dropped, it leaves the lazy set). dst and val have no
 * mesh and one shape and dtype, and are untraced (nb_assign checks; the
 * sharding layer calls it per physical tensor). Error status on failure
 * (dst then keeps its buffer, as nbi_realize_assign says). */
nb_status nbi_assign_rebind(nb_tensor *dst, nb_tensor *val);
/* nb_assign_n's rebind: realizes val[0..n-1] and extra[0..n_extra-1] with the
 * dsts' pending readers in one plan (nbi_realize_assign_n), then rebinds each
 * dst[k] to val[k] as nbi_assign_rebind does. The dsts are distinct. */
nb_status nbi_assign_rebind_n(nb_tensor *const *dst, nb_tensor *const *val, int n,
                              nb_tensor *const *extra, int n_extra);
void nbi_stats_jit(bool hit);
/* One collective of kind NBI_COLL_* sending bytes (summed over devices). */
enum {
  NBI_COLL_ALL_REDUCE,
  NBI_COLL_ALL_GATHER,
  NBI_COLL_REDUCE_SCATTER,
  NBI_COLL_ALL_TO_ALL,
  NBI_COLL_PERMUTE
};
void nbi_stats_collective(int kind, uint64_t bytes);
void nbi_stats_alloc(size_t nbytes, bool cache_hit); /* a buffer request served */
void nbi_stats_free(size_t nbytes);
void nbi_stats_kernel(void);
void nbi_stats_contended(void); /* the contention guard reduced a thread to one */

/* ---- threads ------------------------------------------------------------------ */
/* Around each realization's kernels (nested calls count, the outermost pair
 * is watched): init sets the OpenMP pool and FTZ/DAZ in every thread; done
 * feeds the contention guard (src/backends/cpu/threads.c). */
void nbi_cpu_init(void);
void nbi_cpu_done(void);

#endif
