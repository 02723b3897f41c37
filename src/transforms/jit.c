/* src/transforms/jit.c — nb_jit.
 *
 * A jitted function keeps a small LRU cache of programs keyed by the input
 * signature (each input's dtype and shape). A miss traces f on placeholders
 * into a program (nbi_trace_program); a hit replays the cached program on the
 * call's inputs, so f's C body does not run again. The tensors f captured
 * (closures, constants it made) are retained by the entry and passed as the
 * program's further inputs on every replay.
 *
 * At top level, when every argument is a plain value (realized on one device,
 * not traced, no nb_backward provenance), the entry's program is planned once
 * into an executable (nbi_exec: persistent pending nodes, simplification,
 * fusion and memory plan done) and each call just binds the arguments and
 * runs it: no nodes recorded, no graph collected or hashed, no plan looked up.
 * Arguments of another layout than the first call's, or with provenance, are
 * replayed and realized at once in one nb_eval (the plan cache makes that
 * cheap too). Under another transform the replay is just recorded into the
 * enclosing trace (that transform's rules see ordinary ops).
 *
 * A program that captured a traced tensor (a closure over an enclosing
 * transform's value) is valid for this call only: it is applied and not
 * cached.
 *
 * Captures are guarded. The tensors from outside that f reads (captured
 * through its user pointer: tensors older than the trace) are listed in the
 * entry. When there are any, every call first runs f's body on placeholders
 * (recording only) and walks what it returned to list the outside tensors it
 * reads now: the same tensors, in the same order, and the entry runs; other
 * ones (a pointer swapped since the trace), and that recording becomes the
 * entry's new program. So a call never computes with a tensor the body no
 * longer reads. A function that captures nothing never runs its body again.
 *
 * A call on sharded values traces the jitted function into the caller's
 * program (src/transforms/fn.c, call_sharded) under a trace mesh, which
 * changes what f records (gradients laid out like their primals, nb_reshard
 * of traced values): entries are keyed by that mesh too. A call inside an
 * nb_shard_map body records collectives over the body's mesh (their groups
 * are that mesh's axes): entries are keyed by the body's mesh as well.
 *
 * Threads: one jitted function may be called from several threads at once.
 * A mutex guards the cache (lookup, insertion, eviction, the clock); tracing
 * and running happen outside it. An entry in use is pinned (running) so no
 * thread evicts it; its executable runs one call at a time (exec_busy), a
 * concurrent call replays the program instead. Captures are realized when the
 * entry is cached: another thread's replay reads them as realized tensors
 * (through leaves of its own, src/core/tensor.c nbi_record; the refcounts
 * involved are atomic).
 */
#include "transforms.h"
#include "../core/program.h"
#include "tree.h"

#include <pthread.h>
#include <stdlib.h>

#include "../sharding/sharding.h"

#define JIT_CACHE 16

typedef struct jit_entry {
  nbi_program *prog; /* NULL: empty slot */
  nb_tensor **capt;  /* retained captures: the program's inputs after f's */
  int n_capt;
  nb_tensor **ext; /* retained: the outside tensors f read when traced (the guard) */
  int n_ext;
  nb_mesh *mesh;  /* retained: the trace mesh it was traced under (NULL: none) */
  nb_mesh *body;  /* retained: the shard_map body's mesh it was traced in (NULL: none) */
  nbi_exec *exec; /* the program planned once for top-level calls (NULL: not yet) */
  int running;    /* calls of this entry in progress (a nested call may not evict it);
                     atomic: raised under the lock, lowered without it */
  bool no_exec;   /* planning it failed: replay instead */
  bool exec_busy; /* a call runs exec (one at a time; others replay); atomic, set
                     under the lock, cleared without it */
  uint64_t last_used;
} jit_entry;

typedef struct jit_fn {
  nb_fn *f;
  jit_entry cache[JIT_CACHE];
  uint64_t clock;
  pthread_mutex_t lock; /* guards cache[] bookkeeping and clock */
} jit_fn;

static const char *FN = "nb_jit";

/* running and exec_busy: raised under j->lock (where lookups and evictions
 * read them), lowered without it, so a fast call takes the lock once. An
 * entry whose count drops to 0 outside the lock is left for victim(). */
#define RUNNING(e) __atomic_load_n(&(e)->running, __ATOMIC_ACQUIRE)
#define PIN(e) ((void)__atomic_fetch_add(&(e)->running, 1, __ATOMIC_RELAXED))
#define UNPIN(e) __atomic_sub_fetch(&(e)->running, 1, __ATOMIC_RELEASE) /* the new count */
#define BUSY(e) __atomic_load_n(&(e)->exec_busy, __ATOMIC_ACQUIRE)
#define SET_BUSY(e, v) __atomic_store_n(&(e)->exec_busy, (v), __ATOMIC_RELEASE)

static void entry_clear(jit_entry *e) {
  nbi_exec_free(e->exec);
  if (e->mesh) nb_mesh_release(e->mesh);
  if (e->body) nb_mesh_release(e->body);
  nbi_program_release(e->prog);
  nbi_release_all(e->capt, e->n_capt);
  nbi_release_all(e->ext, e->n_ext);
  *e = (jit_entry){0};
}

static void jit_destroy(void *p) {
  jit_fn *j = p;
  for (int i = 0; i < JIT_CACHE; i++)
    entry_clear(&j->cache[i]);
  nb_fn_release(j->f);
  pthread_mutex_destroy(&j->lock);
  free(j);
}

static bool matches(const nbi_program *p, nb_tensor *const *in, int n_in) {
  for (int k = 0; k < n_in; k++)
    if (in[k]->dtype != p->in_dtype[k] || !nbi_shape_eq(&in[k]->shape, &p->in_shape[k]))
      return false;
  return true;
}

static jit_entry *lookup(jit_fn *j, nb_tensor *const *in) {
  nb_mesh *m = nbi_trace_mesh(), *b = nbi_smap_mesh();
  for (int i = 0; i < JIT_CACHE; i++)
    if (j->cache[i].prog && j->cache[i].mesh == m && j->cache[i].body == b &&
        matches(j->cache[i].prog, in, j->f->n_in))
      return &j->cache[i];
  return NULL;
}

/* An empty slot, else the least recently used entry not running; NULL when
 * every entry runs (nested calls). */
static jit_entry *victim(jit_fn *j) {
  jit_entry *v = NULL;
  for (int i = 0; i < JIT_CACHE; i++) {
    if (!j->cache[i].prog) return &j->cache[i];
    if (!RUNNING(&j->cache[i]) && (!v || j->cache[i].last_used < v->last_used)) v = &j->cache[i];
  }
  if (v) entry_clear(v);
  return v;
}

/* The call's inputs followed by e's captures: in local (room for LOCAL_ARGS)
 * when they fit, else malloc'd. */
enum { LOCAL_ARGS = 64 };
static nb_tensor **gather_args(const jit_entry *e, nb_tensor *const *in, int n_in,
                               nb_tensor **local) {
  nb_tensor **args =
      e->prog->n_in <= LOCAL_ARGS ? local : malloc(sizeof *args * (size_t)e->prog->n_in);
  if (!args) return NULL;
  for (int k = 0; k < n_in; k++)
    args[k] = in[k];
  for (int c = 0; c < e->n_capt; c++)
    args[n_in + c] = e->capt[c];
  return args;
}

/* A top-level call whose arguments are plain values (no trace, no
 * nb_backward provenance): it can run e's planned executable. */
static bool plain(nb_tensor *const *args, int n) {
  for (int k = 0; k < n; k++)
    if (args[k]->flags & (NBI_T_TRACED | NBI_T_REQUIRES_GRAD | NBI_T_GRAD_PATH)) return false;
  return true;
}

/* Plans e's program once over slots standing for args (the first fast call):
 * leaves sharing the arguments' storage, so the plan sees their layouts. */
static void build_exec(jit_entry *e, nb_tensor *const *args) {
  int n = e->prog->n_in, n_out = e->prog->n_out;
  e->no_exec = true;
  /* a shard_map's replay puts its outputs on its mesh (as a direct call
   * does); an executable runs single-device values only */
  for (int i = 0; i < e->prog->n_nodes; i++)
    if (e->prog->nodes[i].op == NBI_OP_SHARD_MAP) return;
  nb_tensor *local[32], **t = n + n_out <= 32 ? local : malloc(sizeof *t * (size_t)(n + n_out));
  if (!t) return;
  nb_status before = nb_last_status();
  nb_scope_begin();
  bool ok = true;
  for (int k = 0; k < n && ok; k++)
    ok = (t[k] = nbi_leaf_share(args[k])) != NULL;
  if (ok && nbi_program_apply(FN, e->prog, t, t + n) == NB_OK &&
      (e->exec = nbi_exec_build(t, n, t + n, n_out)))
    e->no_exec = false;
  nb_scope_end();
  if (!before) nb_clear_error(); /* a failed plan is not the caller's error: it replays */
  if (t != local) free(t);
}

/* ---- tracing and the capture guard ------------------------------------------------------ */
/* A set of tensors by address (open addressing; the tensors' scratch fields
 * belong to sweeps and realizations that may be running). */
typedef struct tset {
  const nb_tensor **slot;
  size_t cap, n;
} tset;

static bool tset_add(tset *s, const nb_tensor *t, bool *added) {
  if (2 * (s->n + 1) > s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    const nb_tensor **slot = calloc(cap, sizeof *slot);
    if (!slot) return false;
    for (size_t i = 0; i < s->cap; i++)
      if (s->slot[i]) {
        size_t h = ((uintptr_t)s->slot[i] >> 4) & (cap - 1);
        while (slot[h])
          h = (h + 1) & (cap - 1);
        slot[h] = s->slot[i];
      }
    free(s->slot);
    s->slot = slot;
    s->cap = cap;
  }
  size_t h = ((uintptr_t)t >> 4) & (s->cap - 1);
  for (; s->slot[h]; h = (h + 1) & (s->cap - 1))
    if (s->slot[h] == t) {
      *added = false;
      return true;
    }
  s->slot[h] = t;
  s->n++;
  *added = true;
  return true;
}

/* The tensors older than seq0 that ys read (walking back from them through
 * nodes made since seq0), in order of discovery, retained into *ext. */
static nb_status outside_reads(nb_tensor *const *ys, int n_y, uint64_t seq0, nb_tensor ***ext,
                               int *n_ext) {
  tset seen = {0};
  nb_tensor **stack = NULL, **found = NULL;
  size_t sp = 0, cap = 0, nf = 0, cap_f = 0;
  bool ok = true, added;
  for (int j = n_y - 1; j >= 0 && ok; j--) {
    if (sp == cap) {
      cap = cap ? 2 * cap : 64;
      nb_tensor **g = realloc(stack, sizeof *g * cap);
      if (!(ok = g != NULL)) break;
      stack = g;
    }
    stack[sp++] = ys[j];
  }
  while (sp && ok) {
    nb_tensor *t = stack[--sp];
    if (!(ok = tset_add(&seen, t, &added)) || !added) continue;
    if (t->seq < seq0) {
      if (nf == cap_f) {
        cap_f = cap_f ? 2 * cap_f : 16;
        nb_tensor **g = realloc(found, sizeof *g * cap_f);
        if (!(ok = g != NULL)) break;
        found = g;
      }
      found[nf++] = nb_retain(t);
      continue;
    }
    for (int k = t->n_in - 1; k >= 0 && ok; k--) {
      if (sp == cap) {
        cap *= 2;
        nb_tensor **g = realloc(stack, sizeof *g * cap);
        if (!(ok = g != NULL)) break;
        stack = g;
      }
      stack[sp++] = t->in[k];
    }
  }
  free(seen.slot);
  free(stack);
  if (!ok) {
    nbi_release_all(found, (int)nf);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  }
  *ext = found;
  *n_ext = (int)nf;
  return NB_OK;
}

/* Runs f's body on placeholders of in's types. With check (an entry of this
 * signature that reads outside tensors), *same tells whether the body reads
 * the same ones now; then nothing else is done. Otherwise (or when they
 * differ) the recording becomes fresh's program, captures and guard. */
static nb_status trace(jit_fn *j, nb_tensor *const *in, const jit_entry *check, jit_entry *fresh,
                       bool *same) {
  nb_fn *f = j->f;
  *same = false;
  nb_tensor **x = calloc((size_t)(f->n_in + f->n_out) + 1, sizeof *x), **y = x + f->n_in;
  if (!x) return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  nb_tensor **ext = NULL;
  int n_ext = 0;
  nb_status st = NB_OK;
  nb_scope_begin();
  uint64_t seq0 = nbi_next_seq();
  for (int k = 0; k < f->n_in && !st; k++)
    if (!(x[k] = nbi_placeholder(&in[k]->shape, in[k]->dtype))) st = nb_last_status();
  if (!st) {
    nbi_trace_depth++;
    st = nb_call(f, x, y);
    nbi_trace_depth--;
  }
  if (!st) st = outside_reads(y, f->n_out, seq0, &ext, &n_ext);
  if (!st && check && n_ext == check->n_ext) {
    *same = true;
    for (int c = 0; c < n_ext && *same; c++)
      *same = ext[c] == check->ext[c];
  }
  if (!st && !*same) {
    st = nbi_program_build(FN, x, f->n_in, y, f->n_out, seq0, &fresh->prog, &fresh->capt,
                           &fresh->n_capt);
    fresh->ext = ext, fresh->n_ext = n_ext;
    ext = NULL;
  }
  nb_scope_end();
  nbi_release_all(ext, ext ? n_ext : 0);
  free(x);
  return st;
}

/* Caches fresh (traced by this thread) unless its captures are traced or
 * another thread cached the same signature meanwhile; returns the entry to
 * use, pinned when cached. Called with j->lock held. */
static jit_entry *entry_insert(jit_fn *j, nb_tensor *const *in, jit_entry *fresh) {
  bool cacheable = true;
  for (int c = 0; c < fresh->n_capt; c++)
    if (fresh->capt[c]->flags & NBI_T_TRACED) cacheable = false;
  jit_entry *e = cacheable ? lookup(j, in) : NULL;
  bool same = e && e->n_ext == fresh->n_ext;
  for (int c = 0; same && c < e->n_ext; c++)
    same = e->ext[c] == fresh->ext[c];
  if (e && !same) e = NULL; /* a stale entry another call still runs: keep both */
  if (e) {                  /* another thread won the race: use its entry */
    entry_clear(fresh);
  } else if (cacheable && (e = victim(j))) {
    *e = *fresh;
    *fresh = (jit_entry){0};
  } else {
    return fresh;
  }
  PIN(e);
  return e;
}

static nb_status jit_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  jit_fn *j = user;
  jit_entry fresh = {0};
  /* the fast path takes the lock once: here (find, pin, claim the
   * executable); after running it releases both with atomic stores */
  bool claimed = false; /* e's executable claimed for this call (exec_busy) */
  pthread_mutex_lock(&j->lock);
  jit_entry *e = lookup(j, in);
  if (e) PIN(e); /* pinned: no thread (nor a nested call) evicts it */
  if (e && !e->n_ext) {
    e->last_used = ++j->clock;
    if (!e->no_exec && !BUSY(e)) claimed = true, SET_BUSY(e, true);
  }
  pthread_mutex_unlock(&j->lock);
  nb_status st = NB_OK;
  if (e && e->n_ext) { /* the guard: does f still read the tensors it captured? */
    bool same;
    st = trace(j, in, e, &fresh, &same);
    if (st) {
      (void)UNPIN(e);
      entry_clear(&fresh);
      return st;
    }
    if (!same) { /* its captures are stale: fresh (already traced) replaces it */
      pthread_mutex_lock(&j->lock);
      if (UNPIN(e) == 0) entry_clear(e);
      pthread_mutex_unlock(&j->lock);
      e = NULL;
    }
  }
  nbi_stats_jit(e != NULL);
  if (!e) {
    bool same;
    if (!fresh.prog && (st = trace(j, in, NULL, &fresh, &same))) {
      entry_clear(&fresh);
      return st;
    }
    if (nbi_trace_mesh()) fresh.mesh = nb_mesh_retain(nbi_trace_mesh());
    if (nbi_smap_mesh()) fresh.body = nb_mesh_retain(nbi_smap_mesh());
    /* a cached entry is read by every calling thread: its captures must be
     * data, not this thread's pending nodes */
    bool traced = false;
    for (int c = 0; c < fresh.n_capt; c++)
      traced |= (fresh.capt[c]->flags & NBI_T_TRACED) != 0;
    if (!traced && fresh.n_capt && (st = nbi_realize(fresh.capt, fresh.n_capt))) {
      entry_clear(&fresh);
      return st;
    }
    pthread_mutex_lock(&j->lock);
    e = entry_insert(j, in, &fresh);
    pthread_mutex_unlock(&j->lock);
  }
  bool cached = e != &fresh;
  nb_tensor *local[LOCAL_ARGS], **args = gather_args(e, in, n_in, local);
  bool run_exec = claimed && args && plain(args, e->prog->n_in);
  if (claimed && !run_exec) { /* claimed for nothing: give it back */
    SET_BUSY(e, false);
  }
  if (!args) {
    if (cached) (void)UNPIN(e);
    entry_clear(&fresh);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  }
  if (!claimed && cached && plain(args, e->prog->n_in)) {
    pthread_mutex_lock(&j->lock);
    e->last_used = ++j->clock;
    if (!e->no_exec && !BUSY(e)) run_exec = true, SET_BUSY(e, true);
    pthread_mutex_unlock(&j->lock);
  }
  if (run_exec) {
    if (!e->exec) build_exec(e, args);
    bool fits = e->exec && nbi_exec_fits(e->exec, args);
    if (fits) st = nbi_exec_run(e->exec, args, out);
    SET_BUSY(e, false); /* before the unpin: an evicted entry is idle */
    if (fits) UNPIN(e);
    if (fits) {
      if (args != local) free(args);
      return st;
    }
  }
  st = nbi_program_apply(FN, e->prog, args, out);
  if (args != local) free(args);
  if (cached) (void)UNPIN(e);
  entry_clear(&fresh);
  if (st) return st;
  for (int k = 0; k < n_out; k++)
    if (out[k]->flags & NBI_T_TRACED) return NB_OK; /* recorded into an enclosing trace */
  return nbi_realize(out, n_out);
}

nb_fn *nb_jit(nb_fn *f) {
  if (!f) {
    nbi_error(NB_ERR_NULL, "%s: f is NULL", FN);
    return NULL;
  }
  if (nbi_fn_is_tree(f)) return nbi_tree_jit(f);
  jit_fn *j = calloc(1, sizeof *j);
  if (!j) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
    return NULL;
  }
  pthread_mutex_init(&j->lock, NULL);
  j->f = nb_fn_retain(f);
  return nbi_fn_make(FN, jit_body, j, jit_destroy, f->n_in, f->n_out);
}
