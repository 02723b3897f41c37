/* src/backends/cuda/cuda_alloc.c — the caching device allocator.
 *
 * Memory is reserved from the device in segments and handed out in blocks.
 * Requests round up to 512 B. Small ones (<= 1 MiB) are carved from 2 MiB
 * segments, large ones from segments of their size rounded up to 2 MiB; the
 * two kinds never share a segment, so small blocks cannot pin large ranges.
 * Within a pool a request takes the best-fitting free block (smallest, then
 * lowest address) and splits off the rest as a new free block; a freed block
 * merges with free neighbours of its segment. A segment whose single block is
 * free is unused: trim and the out-of-memory retry give those back.
 *
 * Every block is used by the device's one stream, so a freed block may be
 * handed out again at once: later work on the stream runs after earlier work.
 * The segment source is pluggable (nbi_cuda_alloc_source) so the host tests
 * drive this file with a fake address space. One mutex guards everything. */
#include "cuda_be.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct seg seg;

typedef struct blk {
  CUdeviceptr addr;
  size_t size;
  struct blk *prev, *next; /* neighbours in the segment, by address */
  struct blk *hnext;       /* chain of the table of blocks handed out */
  seg *seg;
  bool free;
} blk;

struct seg {
  CUdeviceptr addr;
  size_t size;
  bool small;
  blk *first;
  seg *next;
};

/* Free blocks of one pool sorted by (size, addr). cap >= nblocks (every block
 * of the pool, free or not) so inserting a free block never allocates. */
typedef struct pool {
  blk **free;
  size_t n, cap, nblocks;
} pool;

struct nbi_cuda_alloc {
  pthread_mutex_t lock;
  nbi_cuda_alloc_source src;
  char name[32];
  pool small, large;
  seg *segs;
  blk **table; /* blocks handed out, by address (chained) */
  size_t table_cap, table_n;
  size_t allocated, reserved;
};

/* ---- sorted free lists --------------------------------------------------------------------- */
static bool blk_less(const blk *a, size_t size, CUdeviceptr addr) {
  return a->size < size || (a->size == size && a->addr < addr);
}

/* First index whose block is not less than (size, addr). */
static size_t pool_lower(const pool *p, size_t size, CUdeviceptr addr) {
  size_t lo = 0, hi = p->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (blk_less(p->free[mid], size, addr))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Adds free block b to p in order; room was reserved (pool_reserve_one). */
static void pool_insert(pool *p, blk *b) {
  size_t i = pool_lower(p, b->size, b->addr);
  memmove(p->free + i + 1, p->free + i, (p->n - i) * sizeof *p->free);
  p->free[i] = b;
  p->n++;
}

/* Takes free block b (pooled with its current size) out of p. */
static void pool_remove(pool *p, blk *b) {
  size_t i = pool_lower(p, b->size, b->addr);
  if (i >= p->n || p->free[i] != b) return; /* not pooled: cannot happen */
  memmove(p->free + i, p->free + i + 1, (p->n - i - 1) * sizeof *p->free);
  p->n--;
}

/* Makes room for one more block in p; false when out of host memory. */
static bool pool_reserve_one(pool *p) {
  if (p->nblocks < p->cap) return true;
  size_t cap = p->cap ? p->cap * 2 : 64;
  blk **f = realloc(p->free, cap * sizeof *f);
  if (!f) return false;
  p->free = f;
  p->cap = cap;
  return true;
}

/* ---- blocks handed out, by address ---------------------------------------------------------- */
static size_t slot_of(const nbi_cuda_alloc *a, CUdeviceptr addr) {
  return (size_t)(((uint64_t)addr >> 9) * 0x9e3779b97f4a7c15ull >> 20) & (a->table_cap - 1);
}

/* Doubles the table when it is full; keeps the old one when out of memory. */
static void table_grow(nbi_cuda_alloc *a) {
  if (a->table_n < a->table_cap) return;
  size_t cap = a->table_cap * 2;
  blk **t = calloc(cap, sizeof *t);
  if (!t) return;
  blk **old = a->table;
  size_t old_cap = a->table_cap;
  a->table = t;
  a->table_cap = cap;
  for (size_t i = 0; i < old_cap; i++) {
    for (blk *b = old[i], *nx; b; b = nx) {
      nx = b->hnext;
      size_t s = slot_of(a, b->addr);
      b->hnext = t[s];
      t[s] = b;
    }
  }
  free(old);
}

/* Records b as handed out. */
static void table_add(nbi_cuda_alloc *a, blk *b) {
  table_grow(a);
  size_t s = slot_of(a, b->addr);
  b->hnext = a->table[s];
  a->table[s] = b;
  a->table_n++;
}

/* Removes and returns the block handed out at addr; NULL when there is none. */
static blk *table_take(nbi_cuda_alloc *a, CUdeviceptr addr) {
  for (blk **pp = &a->table[slot_of(a, addr)]; *pp; pp = &(*pp)->hnext) {
    if ((*pp)->addr == addr) {
      blk *b = *pp;
      *pp = b->hnext;
      b->hnext = NULL;
      a->table_n--;
      return b;
    }
  }
  return NULL;
}

/* ---- segments
 * ------------------------------------------------------------------------------------ */
/* What seg_new did. */
typedef enum seg_result {
  SEG_OK,
  SEG_DEVICE_OOM, /* the source is out of memory; nothing recorded */
  SEG_FAILED,     /* out of host memory or a device error; recorded */
} seg_result;

/* Reserves a segment of size bytes for the small or large pool; its one block
 * (*out) is free and not pooled. */
static seg_result seg_new(nbi_cuda_alloc *a, size_t size, bool small, blk **out) {
  pool *p = small ? &a->small : &a->large;
  seg *s = malloc(sizeof *s);
  blk *b = malloc(sizeof *b);
  if (!s || !b || !pool_reserve_one(p)) {
    free(s);
    free(b);
    nbi_error(NB_ERR_OOM, "nabla: out of host memory in the %s allocator", a->name);
    return SEG_FAILED;
  }
  CUdeviceptr addr = 0;
  nb_status st = a->src.reserve(a->src.user, size, &addr);
  if (st != NB_OK) {
    free(s);
    free(b);
    return st == NB_ERR_OOM ? SEG_DEVICE_OOM : SEG_FAILED;
  }
  *s = (seg){.addr = addr, .size = size, .small = small, .first = b, .next = a->segs};
  *b = (blk){.addr = addr, .size = size, .seg = s, .free = true};
  a->segs = s;
  a->reserved += size;
  p->nblocks++;
  *out = b;
  return SEG_OK;
}

/* Gives every unused segment back to the source. */
static void release_unused(nbi_cuda_alloc *a) {
  for (seg **pp = &a->segs; *pp;) {
    seg *s = *pp;
    if (!s->first->free || s->first->next) {
      pp = &s->next;
      continue;
    }
    pool *p = s->small ? &a->small : &a->large;
    pool_remove(p, s->first);
    p->nblocks--;
    *pp = s->next;
    a->reserved -= s->size;
    a->src.release(a->src.user, s->addr, s->size);
    free(s->first);
    free(s);
  }
}

/* ---- the allocator ----------------------------------------------------------------------------
 */
nbi_cuda_alloc *nbi_cuda_alloc_create_with(const nbi_cuda_alloc_source *src, const char *name) {
  nbi_cuda_alloc *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->table_cap = 256;
  a->table = calloc(a->table_cap, sizeof *a->table);
  if (!a->table) {
    free(a);
    return NULL;
  }
  a->src = *src;
  snprintf(a->name, sizeof a->name, "%s", name ? name : "cuda");
  pthread_mutex_init(&a->lock, NULL);
  return a;
}

/* Gives every segment back (blocks still handed out included) and frees a;
 * NULL is ignored. */
void nbi_cuda_alloc_destroy(nbi_cuda_alloc *a) {
  if (!a) return;
  for (seg *s = a->segs, *nx; s; s = nx) {
    nx = s->next;
    for (blk *b = s->first, *bn; b; b = bn) {
      bn = b->next;
      free(b);
    }
    a->src.release(a->src.user, s->addr, s->size);
    free(s);
  }
  free(a->small.free);
  free(a->large.free);
  free(a->table);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

/* Takes the best-fitting free block of size >= size out of p; NULL if none. */
static blk *take_best(pool *p, size_t size) {
  size_t i = pool_lower(p, size, 0);
  if (i >= p->n) return NULL;
  blk *b = p->free[i];
  memmove(p->free + i, p->free + i + 1, (p->n - i - 1) * sizeof *p->free);
  p->n--;
  return b;
}

/* Cuts b (free, not pooled) to size and pools the rest as a new free block
 * after it; keeps b whole when the host is out of memory for the rest. */
static void split(pool *p, blk *b, size_t size) {
  if (b->size == size || !pool_reserve_one(p)) return;
  blk *r = malloc(sizeof *r);
  if (!r) return;
  *r = (blk){.addr = b->addr + size,
             .size = b->size - size,
             .prev = b,
             .next = b->next,
             .seg = b->seg,
             .free = true};
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  p->nblocks++;
  pool_insert(p, r);
}

/* A block of at least nbytes (0 counts as 1): the best-fitting free block of
 * its pool, else a new segment (after giving unused ones back if the device
 * is out of memory). 0 with the error recorded on failure. */
CUdeviceptr nbi_cuda_alloc_block(nbi_cuda_alloc *a, size_t nbytes) {
  size_t want = nbytes ? nbytes : 1;
  if (want > SIZE_MAX - NBI_CUDA_SEGMENT) {
    nbi_error(NB_ERR_OOM, "nabla: CUDA out of memory on %s: requested %zu bytes (too large)",
              a->name, nbytes);
    return 0;
  }
  size_t size = (want + NBI_CUDA_ALLOC_ROUND - 1) / NBI_CUDA_ALLOC_ROUND * NBI_CUDA_ALLOC_ROUND;
  bool small = size <= NBI_CUDA_SMALL_MAX;
  pool *p = small ? &a->small : &a->large;
  pthread_mutex_lock(&a->lock);
  blk *b = take_best(p, size);
  if (!b) {
    size_t seg_size = small ? NBI_CUDA_SEGMENT
                            : (size + NBI_CUDA_SEGMENT - 1) / NBI_CUDA_SEGMENT * NBI_CUDA_SEGMENT;
    seg_result st = seg_new(a, seg_size, small, &b);
    if (st == SEG_DEVICE_OOM) { /* give the cache back and retry */
      release_unused(a);
      st = seg_new(a, seg_size, small, &b);
    }
    if (st != SEG_OK) {
      if (st == SEG_DEVICE_OOM)
        nbi_error(NB_ERR_OOM,
                  "nabla: CUDA out of memory on %s: requested %zu bytes, allocated %zu, "
                  "reserved %zu",
                  a->name, nbytes, a->allocated, a->reserved);
      pthread_mutex_unlock(&a->lock);
      return 0;
    }
  }
  split(p, b, size);
  b->free = false;
  table_add(a, b);
  a->allocated += b->size;
  CUdeviceptr addr = b->addr;
  pthread_mutex_unlock(&a->lock);
  return addr;
}

/* Returns the block at addr to its pool, merged with free neighbours; 0 is
 * ignored, an address not handed out records NB_ERR_INTERNAL. */
void nbi_cuda_free_block(nbi_cuda_alloc *a, CUdeviceptr addr) {
  if (!addr) return;
  pthread_mutex_lock(&a->lock);
  blk *b = table_take(a, addr);
  if (!b) {
    pthread_mutex_unlock(&a->lock);
    nbi_error(NB_ERR_INTERNAL, "nabla: %s: free of 0x%llx, which is not an allocated block",
              a->name, (unsigned long long)addr);
    return;
  }
  pool *p = b->seg->small ? &a->small : &a->large;
  a->allocated -= b->size;
  b->free = true;
  blk *prev = b->prev, *next = b->next;
  if (prev && prev->free) { /* b merges into prev */
    pool_remove(p, prev);
    prev->size += b->size;
    prev->next = next;
    if (next) next->prev = prev;
    free(b);
    p->nblocks--;
    b = prev;
  }
  if (next && next->free) { /* next merges into b */
    pool_remove(p, next);
    b->size += next->size;
    b->next = next->next;
    if (next->next) next->next->prev = b;
    free(next);
    p->nblocks--;
  }
  pool_insert(p, b); /* a segment's first block is never the one merged away */
  pthread_mutex_unlock(&a->lock);
}

/* Gives every unused segment back to the source. */
void nbi_cuda_alloc_trim(nbi_cuda_alloc *a) {
  pthread_mutex_lock(&a->lock);
  release_unused(a);
  pthread_mutex_unlock(&a->lock);
}

/* Bytes handed out and bytes reserved (either pointer may be NULL). */
void nbi_cuda_alloc_stats(const nbi_cuda_alloc *a, size_t *allocated, size_t *reserved) {
  nbi_cuda_alloc *m = (nbi_cuda_alloc *)a; /* the lock is the only mutable part */
  pthread_mutex_lock(&m->lock);
  if (allocated) *allocated = a->allocated;
  if (reserved) *reserved = a->reserved;
  pthread_mutex_unlock(&m->lock);
}

/* ---- the device's own source: cuMemAlloc / cuMemFree -------------------------------------------
 */
static nb_status device_reserve(void *user, size_t nbytes, CUdeviceptr *addr) {
  (void)user;
  CUresult r = nbi_cu.cuMemAlloc(addr, nbytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return NB_ERR_OOM;
  return nbi_cu_check(r, "nabla: cuMemAlloc");
}

/* A segment may still be read by queued kernels through blocks freed in
 * stream order: wait for the stream before giving it back. */
static void device_release(void *user, CUdeviceptr addr, size_t nbytes) {
  (void)nbytes;
  nbi_cuda_ctx *c = user;
  if (nbi_cu_check(nbi_cu.cuStreamSynchronize(c->stream), "nabla: cuStreamSynchronize") != NB_OK)
    return; /* a failed stream keeps its memory: freeing under it is unsafe */
  nbi_cu_check(nbi_cu.cuMemFree(addr), "nabla: cuMemFree");
}

/* The allocator of device c, named "cuda:<index>" in its messages. */
nbi_cuda_alloc *nbi_cuda_alloc_create(nbi_cuda_ctx *c) {
  char name[32];
  snprintf(name, sizeof name, "cuda:%d", c->index);
  nbi_cuda_alloc_source src = {.reserve = device_reserve, .release = device_release, .user = c};
  return nbi_cuda_alloc_create_with(&src, name);
}
