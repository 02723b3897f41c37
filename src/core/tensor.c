/* src/core/tensor.c — tensor handles: lifetime (refcounts, scopes), creation of
 * data leaves, queries, and reading data back. */
#include "../backends/backend.h"
#include "oprules.h"
#include "program.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

/* ---- handle storage -------------------------------------------------------------
 * Freed handles are kept on a per-thread list (up to SPARE_MAX) for the next
 * tensor_new: a jitted training step makes and drops the same number of
 * handles each call without calling the allocator. A thread's list is freed
 * when the thread exits (spare_key), the main thread's at exit
 * (root_scope_cleanup). */
#if defined(__has_feature) /* clang marks AddressSanitizer builds only here */
#if __has_feature(address_sanitizer)
#define NBI_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(NBI_ASAN)
enum { SPARE_MAX = 0 }; /* AddressSanitizer sees every use after free */
#else
enum { SPARE_MAX = 256 };
#endif
typedef struct spare_list {
  nb_tensor *head; /* linked through in_inline[0] */
  int n;
} spare_list;
static _Thread_local spare_list spare;
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;

static void spare_drain(void *p) {
  spare_list *l = p;
  while (l->head) {
    nb_tensor *t = l->head;
    l->head = t->in_inline[0];
    free(t);
  }
  l->n = 0;
}
static void spare_key_make(void) { (void)pthread_key_create(&spare_key, spare_drain); }
static bool spare_closed; /* at exit: handles go straight back to the allocator */

/* ---- debug mode (NABLA_DEBUG) ------------------------------------------------ */
bool nbi_debug;
static pthread_mutex_t quarantine_lock = PTHREAD_MUTEX_INITIALIZER;
static nb_tensor *quarantine; /* dead handles, linked through in_inline[0] */

__attribute__((constructor)) static void debug_init(void) {
  const char *e = getenv("NABLA_DEBUG");
  nbi_debug = e && *e && strcmp(e, "0") != 0;
}

bool nbi_dead_report(const char *fn, const nb_tensor *t, int idx) {
  char which[32] = "";
  if (idx >= 0) snprintf(which, sizeof which, "input %d ", idx);
  nbi_error(NB_ERR_ARG,
            "%s: %s(tensor %p) was released: used after nb_release or after the scope that "
            "owned it ended (NABLA_DEBUG)",
            fn, which, (const void *)t);
  return true;
}

static void tensor_free(nb_tensor *t) {
  if (nbi_debug && !spare_closed) { /* never reused: later uses find it dead */
    t->magic = NBI_MAGIC_DEAD;
    pthread_mutex_lock(&quarantine_lock);
    t->in_inline[0] = quarantine;
    quarantine = t;
    pthread_mutex_unlock(&quarantine_lock);
    return;
  }
  if (spare.n == SPARE_MAX || spare_closed) {
    free(t);
    return;
  }
  if (spare.n == 0) { /* (re)arm the thread-exit drain */
    pthread_once(&spare_once, spare_key_make);
    (void)pthread_setspecific(spare_key, &spare);
  }
  t->in_inline[0] = spare.head;
  spare.head = t;
  spare.n++;
}

static void release(nb_tensor *t);

/* ---- scopes ------------------------------------------------------------------
 * A thread's scopes form a stack of frames; frame 0 is the root. Each frame owns
 * one reference to every tensor registered in it. */
typedef struct scope_frame {
  nb_tensor **items;
  size_t n, cap;
  int unopened; /* scopes begun on top of this one that could not get a frame */
} scope_frame;

static _Thread_local scope_frame *frames;
static _Thread_local int n_frames, cap_frames;
/* A scope whose nb_scope_begin ran out of memory still counts, so that begin and
 * end stay balanced: its tensors go to the frame below (released later, never
 * early), and its nb_scope_end only uncounts it. unopened_root counts those begun
 * before the root frame existed. */
static _Thread_local int unopened_root;

/* A thread's state dies with it: a worker thread that exits releases what its
 * scopes (the root one too) still hold and frees its lazy set (thread_exit,
 * through a key armed when the thread first registers a tensor). The main
 * thread's goes at process exit (root_scope_cleanup). */
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static void thread_exit(void *unused);
static void exit_key_make(void) { (void)pthread_key_create(&exit_key, thread_exit); }

static scope_frame *current_frame(void) {
  if (n_frames == 0) {
    frames = calloc(8, sizeof *frames);
    if (!frames) return NULL;
    cap_frames = 8;
    n_frames = 1;
    pthread_once(&exit_once, exit_key_make);
    (void)pthread_setspecific(exit_key, &exit_key); /* any non-NULL value arms it */
  }
  return &frames[n_frames - 1];
}

/* Room in f for one more tensor. */
static bool frame_reserve(scope_frame *f) {
  if (f->n < f->cap) return true;
  size_t cap = f->cap ? 2 * f->cap : 64;
  nb_tensor **items = realloc(f->items, cap * sizeof *items);
  if (!items) return false;
  f->items = items;
  f->cap = cap;
  return true;
}

static bool frame_push(scope_frame *f, nb_tensor *t) {
  if (!frame_reserve(f)) return false;
  f->items[f->n++] = t;
  return true;
}

/* Room in the current scope for one more tensor, so that a tensor made next
 * registers without failing. */
static bool scope_reserve(void) {
  scope_frame *f = current_frame();
  return f && frame_reserve(f);
}

nb_tensor *nbi_scope_register(nb_tensor *t) {
  scope_frame *f = current_frame();
  if (f && frame_push(f, t)) return t;
  /* cannot track it: drop the reference rather than leak it */
  nbi_error(NB_ERR_OOM, "nabla: out of memory registering a tensor in its scope");
  nb_release(t);
  return NULL;
}

void nb_scope_begin(void) {
  scope_frame *top = current_frame();
  if (!top) {
    unopened_root++;
    nbi_error(NB_ERR_OOM, "nb_scope_begin: out of memory");
    return;
  }
  if (n_frames == cap_frames) {
    scope_frame *nf = realloc(frames, 2 * (size_t)cap_frames * sizeof *nf);
    if (!nf) {
      top->unopened++;
      nbi_error(NB_ERR_OOM, "nb_scope_begin: out of memory");
      return;
    }
    frames = nf;
    for (int i = cap_frames; i < 2 * cap_frames; i++)
      frames[i] = (scope_frame){0};
    cap_frames *= 2;
  }
  frames[n_frames].n = 0; /* reuses the array an earlier scope at this depth grew */
  frames[n_frames++].unopened = 0;
}

/* Releases f's tensors. Its array stays for the next scope at this depth
 * (a training loop's per-step scope allocates nothing), unless it grew past
 * SCOPE_KEEP items or free_all. */
enum { SCOPE_KEEP = 4096 };
static void frame_clear(scope_frame *f, bool free_all) {
  for (size_t i = f->n; i-- > 0;)
    release(f->items[i]);
  f->n = 0;
  if (free_all || f->cap > SCOPE_KEEP) {
    free(f->items);
    *f = (scope_frame){0};
  }
}

static _Thread_local int scope_floor; /* frames nb_scope_end may not close below */

int nbi_scope_depth(void) { return current_frame() ? n_frames : 0; }

int nbi_scope_floor_set(int floor) {
  int old = scope_floor;
  scope_floor = floor;
  return old;
}

int nbi_scope_unwind(int depth, nb_tensor *const *keep, int n) {
  if (n_frames <= depth) return 0;
  int closed = n_frames - depth;
  for (int k = 0; k < n; k++)
    if (keep[k]) NBI_REF_INC(keep[k]);
  while (n_frames > depth)
    frame_clear(&frames[--n_frames], false);
  for (int k = 0; k < n; k++)
    if (keep[k]) nbi_scope_register(keep[k]); /* the extra reference moves there */
  return closed;
}

nb_status nb_scope_end(void) {
  if (n_frames > 0 && frames[n_frames - 1].unopened > 0) {
    frames[n_frames - 1].unopened--;
    return NB_OK;
  }
  if (n_frames <= 1 && unopened_root > 0) {
    unopened_root--;
    return NB_OK;
  }
  if (n_frames <= 1)
    return nbi_error(NB_ERR_SCOPE, "nb_scope_end: no open scope (begin/end are unbalanced)");
  if (n_frames <= scope_floor)
    return nbi_error(NB_ERR_SCOPE,
                     "nb_scope_end: the scope was begun outside the function body being called "
                     "(nb_call): the body's nb_scope_begin/nb_scope_end are unbalanced");
  frame_clear(&frames[--n_frames], false);
  return NB_OK;
}

nb_tensor *nb_keep(nb_tensor *t) {
  if (!t || nbi_dead("nb_keep", t, -1)) return NULL;
  /* root scope: nothing encloses it; an unopened scope: its tensors are
   * already in the frame that encloses it */
  if (n_frames <= 1 || frames[n_frames - 1].unopened > 0) return t;
  if (!frame_push(&frames[n_frames - 2], t)) {
    nbi_error(NB_ERR_OOM, "nb_keep: out of memory");
    return NULL; /* t stays in its scope, released at its end */
  }
  NBI_REF_INC(t);
  return t;
}

nb_tensor *nbi_keep_moved(nb_tensor *t) {
  if (!t || nbi_dead("nb_keep", t, -1)) return NULL;
  if (n_frames <= 1 || frames[n_frames - 1].unopened > 0) return t;
  scope_frame *f = &frames[n_frames - 1];
  /* a function's outputs are mostly the last tensors its scope registered */
  for (size_t i = f->n, seen = 0; i-- > 0 && seen < 8; seen++) {
    if (f->items[i] != t) continue;
    if (!frame_push(&frames[n_frames - 2], t)) break; /* nb_keep reports it */
    memmove(&f->items[i], &f->items[i + 1], (f->n - i - 1) * sizeof *f->items);
    f->n--;
    return t; /* its scope's reference moved up: no count changed */
  }
  return nb_keep(t);
}

/* The lazy set is the thread's: its nodes belong to the thread that realized
 * them (tensors belong to the thread that made them). */
static _Thread_local nb_tensor **lazy_slot;
static _Thread_local size_t lazy_cap, lazy_n; /* lazy_cap: 0 or a power of two */

/* Releases the calling thread's scopes (root included) and frees its lazy set. */
static void thread_state_free(void) {
  while (n_frames > 1)
    frame_clear(&frames[--n_frames], true);
  for (int i = 0; i < cap_frames; i++)
    frame_clear(&frames[i], true);
  free(frames);
  frames = NULL;
  n_frames = cap_frames = unopened_root = 0;
  free(lazy_slot); /* lazy nodes still alive leave it unchecked from now on */
  lazy_slot = NULL;
  lazy_cap = lazy_n = 0;
}

static void thread_exit(void *unused) {
  (void)unused;
  thread_state_free();
}

/* Empties the main thread's root scope at exit so leak checkers see no leaks. */
__attribute__((destructor)) static void root_scope_cleanup(void) {
  thread_state_free();
  spare_closed = true;
  spare_drain(&spare);
  while (quarantine) {
    nb_tensor *t = quarantine;
    quarantine = t->in_inline[0];
    free(t);
  }
}

/* ---- lifetime -------------------------------------------------------------------- */
static _Atomic uint64_t live_tensors; /* every thread's */

/* ---- the lazy set ------------------------------------------------------------------
 * Held nodes a realization left pending (NBI_T_LAZY): nb_assign must find
 * every pending reader of the tensor it rebinds, also one no scope holds
 * any more. An open-addressing set of pointers (linear probing, deletion by
 * backward shift), at most half full (lazy_slot, lazy_cap, lazy_n above). */

static size_t lazy_home(const nb_tensor *t, size_t cap) {
  return (size_t)(((uintptr_t)t >> 4) * 0x9e3779b97f4a7c15ull) & (cap - 1);
}

static void lazy_insert(nb_tensor **slot, size_t cap, nb_tensor *t) {
  size_t i = lazy_home(t, cap);
  while (slot[i] && slot[i] != t)
    i = (i + 1) & (cap - 1);
  slot[i] = t;
}

nb_status nbi_lazy_reserve(int n) {
  size_t need = lazy_n + (size_t)(n > 0 ? n : 0);
  if (2 * need <= lazy_cap) return NB_OK;
  size_t cap = lazy_cap ? lazy_cap : 64;
  while (2 * need > cap)
    cap *= 2;
  nb_tensor **slot = calloc(cap, sizeof *slot);
  if (!slot) return nbi_error(NB_ERR_OOM, "nb_eval: out of memory tracking lazy nodes");
  for (size_t i = 0; i < lazy_cap; i++)
    if (lazy_slot[i]) lazy_insert(slot, cap, lazy_slot[i]);
  free(lazy_slot);
  lazy_slot = slot;
  lazy_cap = cap;
  return NB_OK;
}

void nbi_lazy_add(nb_tensor *t) {
  if (t->flags & NBI_T_LAZY) return;
  t->flags |= NBI_T_LAZY;
  lazy_insert(lazy_slot, lazy_cap, t);
  lazy_n++;
}

void nbi_lazy_remove(nb_tensor *t) {
  if (!(t->flags & NBI_T_LAZY)) return;
  t->flags &= ~(uint32_t)NBI_T_LAZY;
  if (!lazy_cap) return; /* the set is gone (exit) */
  size_t i = lazy_home(t, lazy_cap);
  while (lazy_slot[i] != t) {
    if (!lazy_slot[i]) return; /* not this thread's (a contract breach): never spin */
    i = (i + 1) & (lazy_cap - 1);
  }
  lazy_slot[i] = NULL;
  lazy_n--;
  /* backward shift: move later entries of the cluster into the hole when
   * their home is not cyclically in (hole, j] */
  for (size_t j = (i + 1) & (lazy_cap - 1); lazy_slot[j]; j = (j + 1) & (lazy_cap - 1)) {
    size_t h = lazy_home(lazy_slot[j], lazy_cap);
    bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
    if (stays) continue;
    lazy_slot[i] = lazy_slot[j];
    lazy_slot[j] = NULL;
    i = j;
  }
}

nb_tensor *nb_retain(nb_tensor *t) {
  if (t && nbi_dead("nb_retain", t, -1)) return NULL;
  if (t) NBI_REF_INC(t);
  return t;
}

static void tensor_drop_inputs(nb_tensor *t, nb_tensor ***stack, size_t *n, size_t *cap);
static void tensor_drop_shards(nb_tensor *t, nb_tensor ***stack, size_t *n, size_t *cap);

nbi_shard_hooks nbi_shard_hook;

/* Frees t and, iteratively (deep graphs must not overflow the C stack), every
 * input whose last reference it held. */
/* Debug mode: whether one of the thread's scopes holds t. */
static bool scope_holds(const nb_tensor *t) {
  for (int f = 0; f < n_frames; f++)
    for (size_t i = 0; i < frames[f].n; i++)
      if (frames[f].items[i] == t) return true;
  return false;
}

void nb_release(nb_tensor *t) {
  if (!t) return;
  if (nbi_debug) {
    if (nbi_dead("nb_release", t, -1)) return;
    if (t->refcount == 1 && scope_holds(t)) {
      nbi_error(NB_ERR_SCOPE,
                "nb_release: tensor %p belongs to a scope (made or nb_keep'd there): release "
                "only references you took with nb_retain (NABLA_DEBUG)",
                (void *)t);
      return;
    }
  }
  release(t);
}

/* Drops a reference (scopes and nb_release come here). */
static void release(nb_tensor *t) {
  if (NBI_REF_DEC(t) > 0) return;
  nb_tensor *local[64], **stack = local;
  size_t n = 0, cap = 64;
  stack[n++] = t;
  while (n) {
    nb_tensor *x = stack[--n];
    nbi_lazy_remove(x);
    tensor_drop_inputs(x, &stack, &n, &cap);
    if (x->mesh) tensor_drop_shards(x, &stack, &n, &cap);
    for (int s = 0; s < x->n_shards; s++)
      if (x->shards[s].buf) nbi_buffer_release(x->shards[s].buf);
    if (x->shards != &x->shard0) free(x->shards);
    if (x->grad) release(x->grad); /* a leaf: recursion depth is one */
    nbi_payload_release(x->payload);
    tensor_free(x);
    live_tensors--;
  }
  if (stack != local) free(stack);
}

/* Drops one reference of x; pushes x on the release stack when it was the last. */
static void drop_ref(nb_tensor *x, nb_tensor ***stack, size_t *n, size_t *cap) {
  if (NBI_REF_DEC(x) > 0) return;
  if (*n == *cap) {
    size_t nc = *cap * 2;
    nb_tensor **ns = malloc(nc * sizeof *ns);
    if (!ns) { /* cannot grow: leak rather than crash */
      x->refcount = 1;
      return;
    }
    memcpy(ns, *stack, *n * sizeof *ns);
    if (*cap != 64) free(*stack);
    *stack = ns;
    *cap = nc;
  }
  (*stack)[(*n)++] = x;
}

static void tensor_drop_inputs(nb_tensor *t, nb_tensor ***stack, size_t *n, size_t *cap) {
  for (int i = 0; i < t->n_in; i++)
    drop_ref(t->in[i], stack, n, cap);
  if (t->in != t->in_inline) free(t->in);
  t->in = t->in_inline;
  t->n_in = 0;
}

/* A sharded tensor's parts: its physical tensors, sharding and mesh. */
static void tensor_drop_shards(nb_tensor *t, nb_tensor ***stack, size_t *n, size_t *cap) {
  for (int d = 0; d < t->n_phys; d++)
    if (t->phys[d]) drop_ref(t->phys[d], stack, n, cap);
  free(t->phys);
  t->phys = NULL;
  t->n_phys = 0;
  if (t->sharding && nbi_shard_hook.release) nbi_shard_hook.release(t);
  if (t->mesh && nbi_shard_hook.mesh_release) nbi_shard_hook.mesh_release(t->mesh);
  t->sharding = NULL;
  t->mesh = NULL;
}

/* Drops a realized tensor's graph edges (its value no longer needs them). */
void nbi_tensor_drop_graph(nb_tensor *t) {
  for (int i = 0; i < t->n_in; i++)
    release(t->in[i]);
  if (t->in != t->in_inline) free(t->in);
  t->in = t->in_inline;
  t->n_in = 0;
}

static _Atomic uint64_t next_seq = 1;
_Thread_local bool nbi_no_grad;

static _Atomic uint32_t next_thread_id = 1;
static _Thread_local uint32_t thread_id;
uint32_t nbi_thread_id(void) {
  if (!thread_id) thread_id = next_thread_id++;
  return thread_id;
}

static nb_tensor *tensor_new(const nb_shape *shape, nb_dtype dt, int op) {
  nb_tensor *t = spare.head;
  if (t) {
    spare.head = t->in_inline[0];
    spare.n--;
    memset(t, 0, sizeof *t);
  } else if (!(t = calloc(1, sizeof *t))) {
    return NULL;
  }
  t->seq = next_seq++;
  t->owner = nbi_thread_id();
  t->magic = NBI_MAGIC_LIVE;
  t->refcount = 1;
  t->shape = *shape;
  t->dtype = dt;
  t->op = op;
  t->mark = -1;
  t->aux = -1;
  t->in = t->in_inline;
  t->n_shards = 1;
  t->shards = &t->shard0;
  live_tensors++;
  return t;
}

uint64_t nbi_live_tensors(void) { return live_tensors; }
uint64_t nbi_next_seq(void) { return next_seq; }

/* A sharded tensor is realized but holds its physical tensors, which may be
 * pending (and the only holder once it left their scope): they count. */
static bool held_pending(const nb_tensor *t) {
  for (int d = 0; d < t->n_phys; d++)
    if (!(t->phys[d]->flags & (NBI_T_REALIZED | NBI_T_TRACED))) return true;
  return !(t->flags & (NBI_T_REALIZED | NBI_T_TRACED));
}

static nb_status pending_push(nb_tensor ***out, int *n, int *cap, nb_tensor *t, uint32_t skip) {
  nb_status st = NB_OK;
  for (int d = 0; d < t->n_phys && !st; d++)
    st = pending_push(out, n, cap, t->phys[d], skip);
  if (st || (t->flags & skip)) return st;
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 64;
    nb_tensor **na = realloc(*out, (size_t)nc * sizeof *na);
    if (!na) return nbi_error(NB_ERR_OOM, "nb_assign: out of memory");
    *out = na;
    *cap = nc;
  }
  (*out)[(*n)++] = t;
  return NB_OK;
}

bool nbi_any_held_pending(void) {
  for (int f = 0; f < n_frames; f++)
    for (size_t i = 0; i < frames[f].n; i++)
      if (held_pending(frames[f].items[i])) return true;
  return lazy_n > 0;
}

nb_status nbi_held_pending(nb_tensor ***out, int *n, int *cap, bool skip_frozen) {
  /* a frozen node that was realized since is realized: skipped either way */
  uint32_t skip = NBI_T_REALIZED | NBI_T_TRACED | (skip_frozen ? NBI_T_FROZEN : 0);
  nb_status st = NB_OK;
  for (int f = 0; f < n_frames && !st; f++)
    for (size_t i = 0; i < frames[f].n && !st; i++) {
      nb_tensor *t = frames[f].items[i];
      if (!t->n_phys && (t->flags & skip)) continue; /* most are: no call */
      st = pending_push(out, n, cap, t, skip);
    }
  for (size_t i = 0; i < lazy_cap && !st; i++)
    if (lazy_slot[i] && !(lazy_slot[i]->flags & skip)) st = pending_push(out, n, cap, lazy_slot[i], skip);
  return st;
}

/* The device a node of op on in[0..n_in-1] lives on: its inputs' (all on one,
 * else NB_ERR_DEVICE naming the op and both devices), the target of a device
 * move (attrs.i[0]), or the thread's default for an op without inputs; its
 * backend must support the op (an eager NB_ERR_DEVICE otherwise). -1 on error. */
static int record_device(int op, nb_dtype dt, nb_tensor *const *in, int n_in,
                         const nbi_attrs *attrs) {
  int dev = n_in > 0 ? in[0]->device : nbi_default_device();
  if (op == NBI_OP_TO_DEVICE) return (int)attrs->i[0];
  for (int k = 1; k < n_in; k++)
    if (in[k]->device != dev) {
      nbi_error(NB_ERR_DEVICE,
                "nb_%s: inputs are on different devices: %s (input 0) and %s (input %d)",
                nbi_op_table[op]->name, nbi_device_name(dev), nbi_device_name(in[k]->device), k);
      return -1;
    }
  const nbi_op_def *def = nbi_op_table[op];
  /* The CPU runs every op with a kernel; elsewhere, an op that runs a kernel
   * (not one core runs itself, not a view that never copies) asks the backend. */
  if (dev != 0 && !def->exec && !(def->flags & NBI_OPF_NO_KERNEL)) {
    const nbi_device *d = nbi_device_at(dev);
    if (!d->be->supports(d->ctx, op, dt)) {
      nbi_error(NB_ERR_DEVICE, "nb_%s: not supported on %s for %s results", def->name, d->name,
                nb_dtype_name(dt));
      return -1;
    }
  }
  return dev;
}

/* Another thread's tensor x as an input of a node this thread records: graph
 * passes write scratch marks into the tensors they visit, so no graph may hold
 * another thread's tensor while that thread may be realizing it. A realized
 * one is read through a leaf of this thread on the same storage (a constant
 * here: reading shared weights from several threads is fine); one with
 * nb_backward provenance is used as it is (a model handed to this thread to
 * train, which its maker no longer touches: README "Threads"); a pending one
 * is an error. NULL (error recorded) on failure. */
static nb_tensor *own_input(int op, nb_tensor *x) {
  if (x->flags & (NBI_T_REQUIRES_GRAD | NBI_T_GRAD_PATH | NBI_T_TRACED) || x->mesh) return x;
  if (x->flags & NBI_T_REALIZED) return nbi_leaf_share(x);
  nbi_error(NB_ERR_ARG,
            "nb_%s: an input is a pending tensor of another thread (realize it with nb_eval in "
            "the thread that made it before sharing it)",
            nbi_op_table[op]->name);
  return NULL;
}

static nb_tensor *record(int op, nb_dtype dt, const nb_shape *shape, nb_tensor *const *in, int n_in,
                         const nbi_attrs *attrs);

nb_tensor *nbi_record(int op, nb_dtype dt, const nb_shape *shape, nb_tensor *const *in, int n_in,
                      const nbi_attrs *attrs) {
  if (nbi_numel(shape) < 0) { /* e.g. [0, 2^47, 1] + [3]: every shape obeys nbi_numel's bound */
    char b[160];
    nbi_error(NB_ERR_OVERFLOW, "nb_%s: the result's shape %s has more than 2^48 elements",
              nbi_op_table[op]->name, nb_shape_str(*shape, b, sizeof b));
    return NULL;
  }
  uint32_t me = nbi_thread_id();
  int foreign = 0;
  for (int i = 0; i < n_in; i++) {
    if (nbi_debug) {
      char fn[64];
      snprintf(fn, sizeof fn, "nb_%s", nbi_op_table[op]->name);
      if (nbi_dead(fn, in[i], i)) return NULL;
    }
    foreign += in[i]->owner != me;
  }
  if (!foreign) return record(op, dt, shape, in, n_in, attrs);
  nb_tensor *local[8], **own = n_in <= 8 ? local : malloc(sizeof *own * (size_t)n_in);
  if (!own) {
    nbi_error(NB_ERR_OOM, "nb_%s: out of memory", nbi_op_table[op]->name);
    return NULL;
  }
  bool ok = true;
  for (int i = 0; i < n_in && ok; i++)
    ok = (own[i] = in[i]->owner == me ? in[i] : own_input(op, in[i])) != NULL;
  nb_tensor *t = ok ? record(op, dt, shape, own, n_in, attrs) : NULL;
  if (own != local) free(own);
  return t;
}

static nb_tensor *record(int op, nb_dtype dt, const nb_shape *shape, nb_tensor *const *in, int n_in,
                         const nbi_attrs *attrs) {
  if (nbi_shard_hook.record)
    for (int i = 0; i < n_in; i++) {
      if (!in[i]->mesh) continue;
      bool traced = false;
      for (int k = 0; k < n_in; k++)
        traced |= (in[k]->flags & NBI_T_TRACED) != 0;
      if (!traced) return nbi_shard_hook.record(op, dt, shape, in, n_in, attrs);
      /* a sharded tensor a traced function captured (its arguments are
       * traced, never sharded): read whole, a constant of the trace */
      nb_tensor *local[8], **whole = n_in <= 8 ? local : malloc(sizeof *whole * (size_t)n_in);
      if (!whole) {
        nbi_error(NB_ERR_OOM, "nb_%s: out of memory", nbi_op_table[op]->name);
        return NULL;
      }
      nb_tensor *r = NULL;
      bool ok = true;
      for (int k = 0; k < n_in && ok; k++)
        ok = (whole[k] = in[k]->mesh ? nbi_readable("nb_eval", in[k]) : in[k]) != NULL;
      if (ok) r = record(op, dt, shape, whole, n_in, attrs);
      if (whole != local) free(whole);
      return r;
    }
  int dev = record_device(op, dt, in, n_in, attrs);
  if (dev < 0) return NULL;
  nb_tensor *t = scope_reserve() ? tensor_new(shape, dt, op) : NULL;
  if (!t) {
    nbi_error(NB_ERR_OOM, "nb_%s: out of memory", nbi_op_table[op]->name);
    return NULL;
  }
  if (n_in > 3) {
    t->in = malloc((size_t)n_in * sizeof *t->in);
    if (!t->in) {
      tensor_free(t);
      live_tensors--;
      nbi_error(NB_ERR_OOM, "nb_%s: out of memory", nbi_op_table[op]->name);
      return NULL;
    }
  }
  uint32_t inherit = 0;
  for (int i = 0; i < n_in; i++) {
    t->in[i] = nb_retain(in[i]);
    inherit |= in[i]->flags;
  }
  t->n_in = n_in;
  t->device = dev;
  /* Symbolic inputs make a symbolic result; inputs that need gradients make a
   * result that keeps its provenance, unless the op has no derivative. */
  t->flags |= inherit & NBI_T_TRACED;
  if ((inherit & (NBI_T_REQUIRES_GRAD | NBI_T_GRAD_PATH)) && !nbi_no_grad &&
      !(nbi_op_table[op]->flags & NBI_OPF_NONDIFF) &&
      (nb_dtype_is_float(dt) || (nbi_op_table[op]->flags & NBI_OPF_MULTI)))
    t->flags |= NBI_T_GRAD_PATH;
  if (attrs) t->attrs = *attrs;
  nbi_scope_register(t);
  return t;
}

nb_tensor *nbi_leaf_alloc(const char *fn, const nb_shape *shape, nb_dtype dt) {
  return nbi_leaf_alloc_on(fn, shape, dt, nbi_default_device());
}

nb_tensor *nbi_leaf_alloc_on(const char *fn, const nb_shape *shape, nb_dtype dt, int dev) {
  if (!nbi_dtype_valid(dt)) {
    nbi_error(NB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dt);
    return NULL;
  }
  if (nbi_check_shape(fn, shape)) return NULL;
  size_t nbytes = (size_t)nbi_numel(shape) * nb_dtype_size(dt);
  if (!scope_reserve()) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  nbi_buffer *b = nbi_buffer_alloc(dev, nbytes);
  if (!b) return NULL;
  nb_tensor *t = tensor_new(shape, dt, NBI_OP_CONST);
  if (!t) {
    nbi_buffer_release(b);
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  t->shard0.buf = b;
  t->device = dev;
  nbi_contig_strides(shape, t->shard0.strides);
  t->flags |= NBI_T_REALIZED;
  nbi_scope_register(t);
  return t;
}

nb_tensor *nbi_leaf_wrap(const char *fn, nbi_buffer *b, int64_t offset, const nb_shape *s,
                         nb_dtype dt) {
  if (!nbi_dtype_valid(dt)) {
    nbi_error(NB_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dt);
    return NULL;
  }
  if (nbi_check_shape(fn, s)) return NULL;
  nb_tensor *t = scope_reserve() ? tensor_new(s, dt, NBI_OP_CONST) : NULL;
  if (!t) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  nbi_buffer_retain(b);
  t->shard0.buf = b;
  t->shard0.offset = offset;
  t->device = b->device;
  nbi_contig_strides(s, t->shard0.strides);
  t->flags |= NBI_T_REALIZED;
  nbi_scope_register(t);
  return t;
}

static nb_tensor *leaf_of(nb_tensor *t, bool take) {
  nb_tensor *l = scope_reserve() ? tensor_new(&t->shape, t->dtype, NBI_OP_CONST) : NULL;
  if (!l) {
    nbi_error(NB_ERR_OOM, "nb_eval: out of memory");
    return NULL;
  }
  l->shard0 = t->shard0;
  l->device = t->device;
  if (take)
    t->shard0.buf = NULL;
  else if (l->shard0.buf)
    nbi_buffer_retain(l->shard0.buf);
  l->flags |= NBI_T_REALIZED;
  nbi_scope_register(l);
  return l;
}

nb_tensor *nbi_leaf_share(nb_tensor *t) { return leaf_of(t, false); }
nb_tensor *nbi_leaf_take(nb_tensor *t) { return leaf_of(t, true); }

nb_tensor *nbi_sharded_new(const nb_shape *shape, nb_dtype dt, struct nb_mesh *m,
                           struct nbi_sharding *sh, nb_tensor *const *phys, int n_phys) {
  nb_tensor *t = scope_reserve() ? tensor_new(shape, dt, NBI_OP_CONST) : NULL;
  nb_tensor **p = t ? malloc(sizeof *p * (size_t)(n_phys ? n_phys : 1)) : NULL;
  if (!p) {
    if (t) tensor_free(t), live_tensors--;
    nbi_error(NB_ERR_OOM, "nb_shard: out of memory");
    return NULL;
  }
  memcpy(p, phys, sizeof *p * (size_t)n_phys);
  t->flags |= NBI_T_REALIZED;
  t->mesh = m;
  t->sharding = sh;
  t->phys = p;
  t->n_phys = n_phys;
  t->device = n_phys ? phys[0]->device : 0; /* where scalars combined with it go */
  nbi_scope_register(t);
  return t;
}

nb_tensor *nbi_placeholder(const nb_shape *shape, nb_dtype dt) {
  nb_tensor *t = nbi_record(NBI_OP_PLACEHOLDER, dt, shape, NULL, 0, NULL);
  if (t) t->flags |= NBI_T_TRACED;
  return t;
}

void nbi_set_payload(nb_tensor *t, nbi_payload *p) {
  t->payload = nbi_payload_retain(p);
  for (int d = 0; d < t->n_phys; d++)
    if (!t->phys[d]->payload) t->phys[d]->payload = nbi_payload_retain(p);
}

nbi_payload *nbi_payload_retain(nbi_payload *p) {
  if (p) NBI_REF_INC(p);
  return p;
}

void nbi_payload_release(nbi_payload *p) {
  if (p && NBI_REF_DEC(p) == 0) p->destroy(p);
}

/* The view is returned through a stack slot; built field by field, data,
 * dtype and ndim land there as three narrow stores that the 16-byte copy out
 * reloads at once, which store forwarding cannot serve: a stall on every call
 * (kernels take many views). Written as two 8-byte halves (64-bit targets),
 * they stay in registers (one 16-byte store). */
nbi_view nbi_tensor_view(const nb_tensor *t) {
  char *data = t->shard0.buf ? (char *)t->shard0.buf->data +
                                   t->shard0.offset * (int64_t)nb_dtype_size(t->dtype)
                             : NULL;
  nbi_view v;
#if UINTPTR_MAX == UINT64_MAX
  _Static_assert(offsetof(nbi_view, dtype) == 8 && offsetof(nbi_view, ndim) == 12 &&
                     sizeof(nb_dtype) == 4,
                 "nbi_view's head is data, dtype, ndim in 16 bytes");
  int32_t kind[2] = {(int32_t)t->dtype, t->shape.ndim};
  int64_t head[2];
  memcpy(&head[0], &data, 8);
  memcpy(&head[1], kind, 8);
  memcpy(&v, head, sizeof head);
#else
  v.data = data;
  v.dtype = t->dtype;
  v.ndim = t->shape.ndim;
#endif
  memcpy(v.dims, t->shape.dims, sizeof v.dims);
  memcpy(v.strides, t->shard0.strides, sizeof v.strides);
  return v;
}

/* ---- creation --------------------------------------------------------------------- */
/* nb_full on device dev, errors naming fn. */
static nb_tensor *full_on(const char *fn, int dev, const nb_shape *s, double value, nb_dtype dt) {
  nb_tensor *t = nbi_leaf_alloc_on(fn, s, dt, dev);
  if (!t) return NULL;
  nbi_view v = nbi_tensor_view(t);
  if (nbi_numel(s) && nbi_dev_fill(t->device, &v, value)) return NULL; /* t stays in the scope */
  return t;
}

nb_tensor *nbi_full_on(int dev, const nb_shape *s, double value, nb_dtype dt) {
  return full_on("nb_full", dev, s, value, dt);
}

nb_tensor *nbi_remote_leaf(const nb_shape *shape, nb_dtype dt, int dev) {
  if (nbi_check_shape("nb_shard", shape)) return NULL;
  nb_tensor *t = full_on("nb_shard", dev, &NB_SCALAR_SHAPE, nb_dtype_is_float(dt) ? NAN : 0, dt);
  if (!t) return NULL;
  t->shape = *shape;
  memset(t->shard0.strides, 0, sizeof t->shard0.strides);
  t->flags |= NBI_T_REMOTE;
  return t;
}

nb_tensor *nb_full(nb_shape s, double value, nb_dtype dt) {
  return full_on("nb_full", nbi_default_device(), &s, value, dt);
}

nb_tensor *nb_zeros(nb_shape s, nb_dtype dt) {
  return full_on("nb_zeros", nbi_default_device(), &s, 0.0, dt);
}
nb_tensor *nb_ones(nb_shape s, nb_dtype dt) {
  return full_on("nb_ones", nbi_default_device(), &s, 1.0, dt);
}
nb_tensor *nb_scalar(double value, nb_dtype dt) {
  return full_on("nb_scalar", nbi_default_device(), &NB_SCALAR_SHAPE, value, dt);
}

nb_tensor *nb_arange(double start, double stop, double step, nb_dtype dt) {
  if (step == 0 || step != step || start != start || stop != stop) {
    nbi_error(NB_ERR_ARG,
              "nb_arange: step must be a non-zero number (got start %g, stop %g, step %g)", start,
              stop, step);
    return NULL;
  }
  double count = ceil((stop - start) / step);
  if (!(count <= (double)NBI_MAX_NUMEL)) {
    nbi_error(NB_ERR_OVERFLOW, "nb_arange: %g elements is too many", count);
    return NULL;
  }
  nb_shape s = {.ndim = 1, .dims = {count > 0 ? (int64_t)count : 0}};
  nb_tensor *t = nbi_leaf_alloc("nb_arange", &s, dt);
  if (!t) return NULL;
  double *v = malloc(sizeof *v * (size_t)(s.dims[0] ? s.dims[0] : 1));
  if (!v) {
    nbi_error(NB_ERR_OOM, "nb_arange: out of memory");
    return NULL;
  }
  for (int64_t i = 0; i < s.dims[0]; i++)
    v[i] = start + (double)i * step;
  nbi_view view = nbi_tensor_view(t);
  nb_status st = nbi_host_write(t->device, &view, v, NB_F64);
  free(v);
  return st ? NULL : t;
}

nb_tensor *nb_from_data(const void *src, nb_shape s, nb_dtype dt) {
  if (!src) {
    nbi_error(NB_ERR_NULL, "nb_from_data: src is NULL");
    return NULL;
  }
  nb_tensor *t = nbi_leaf_alloc("nb_from_data", &s, dt);
  if (!t) return NULL;
  nbi_view v = nbi_tensor_view(t);
  return nbi_host_write(t->device, &v, src, dt) ? NULL : t;
}

/* ---- queries ------------------------------------------------------------------------ */
nb_shape nb_shape_of(const nb_tensor *t) {
  if (!t) return (nb_shape){.ndim = -1};
  return t->shape;
}
int nb_ndim(const nb_tensor *t) { return t ? t->shape.ndim : -1; }
int64_t nb_numel(const nb_tensor *t) { return t ? nbi_numel(&t->shape) : -1; }
nb_dtype nb_dtype_of(const nb_tensor *t) { return t ? t->dtype : NB_DTYPE_COUNT; }
bool nb_is_realized(const nb_tensor *t) {
  if (!t || !(t->flags & NBI_T_REALIZED)) return false;
  for (int d = 0; d < t->n_phys; d++)
    if (!(t->phys[d]->flags & NBI_T_REALIZED)) return false;
  return true;
}

nb_tensor *nbi_readable(const char *fn, nb_tensor *t) {
  if (!t->mesh) return t;
  if (!nbi_shard_hook.gather) {
    nbi_error(NB_ERR_INTERNAL, "%s: a sharded tensor without the sharding layer", fn);
    return NULL;
  }
  return nbi_shard_hook.gather(fn, t);
}

/* ---- reading data ------------------------------------------------------------------- */
static nb_status check_readable(const char *fn, nb_tensor *t) {
  if (!t) return nbi_error(NB_ERR_NULL, "%s: tensor is NULL", fn);
  if (nbi_dead(fn, t, -1)) return nb_last_status();
  if (t->flags & NBI_T_TRACED)
    return nbi_error(NB_ERR_STATE, "%s: cannot read a traced value; use nb_cond / nb_while_loop",
                     fn);
  return NB_OK;
}

nb_status nb_to_host(nb_tensor *t, void *dst, size_t nbytes) {
  nb_status st = check_readable("nb_to_host", t);
  if (st) return st;
  if (!dst) return nbi_error(NB_ERR_NULL, "nb_to_host: dst is NULL");
  size_t need = (size_t)nbi_numel(&t->shape) * nb_dtype_size(t->dtype);
  if (nbytes != need)
    return nbi_error(NB_ERR_ARG, "nb_to_host: nbytes is %zu but the %s tensor needs %zu", nbytes,
                     nb_dtype_name(t->dtype), need);
  nb_scope_begin();
  nb_tensor *r = nbi_readable("nb_to_host", t);
  st = r ? nbi_realize(&r, 1) : nb_last_status();
  if (!st) {
    nbi_view src = nbi_tensor_view(r);
    st = nbi_host_read(r->device, &src, dst, r->dtype);
  }
  nb_scope_end();
  return st;
}

double nb_item(nb_tensor *t) {
  if (check_readable("nb_item", t)) return NAN;
  if (nbi_numel(&t->shape) != 1) {
    char b[160];
    nbi_error(NB_ERR_SHAPE, "nb_item: tensor of shape %s has %lld elements, not 1",
              nb_shape_str(t->shape, b, sizeof b), (long long)nbi_numel(&t->shape));
    return NAN;
  }
  nb_scope_begin();
  nb_tensor *r = nbi_readable("nb_item", t);
  double x = NAN;
  if (r && !nbi_realize(&r, 1)) {
    nbi_view v = nbi_tensor_view(r);
    if (nbi_host_scalar(r->device, &v, &x)) x = NAN;
  }
  nb_scope_end();
  return x;
}

nb_status nb_eval(nb_tensor *const *ts, int n) {
  if (n < 0) return nbi_error(NB_ERR_ARG, "nb_eval: n is %d", n);
  if (n > 0 && !ts) return nbi_error(NB_ERR_NULL, "nb_eval: ts is NULL");
  for (int i = 0; i < n; i++) {
    nb_status st = check_readable("nb_eval", ts[i]);
    if (st) return st;
  }
  return nbi_realize(ts, n);
}
