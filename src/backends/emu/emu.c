/* src/backends/emu/emu.c — NB_EMU(0..3): an emulated device that proves the seam.
 *
 * Its memory is host memory the core cannot dereference: a block's address as
 * core sees it is the real address plus EMU_OFFSET, which makes it
 * non-canonical on x86-64 (and far outside any mapping elsewhere), so any read
 * or write that bypasses the backend faults at once instead of silently
 * working. Only this file translates addresses back. Kernels are the CPU's,
 * run on translated views; kernel errors are deferred to the next sync, as an
 * asynchronous device reports them. Fused groups are the CPU's too: its answer
 * (group_ok), its executors on translated views, so a program groups and runs
 * here as on the CPU. */
#include "../backend.h"
#include "../cpu/cpu.h" /* the CPU kernel table */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define EMU_DEVICES 4
#define EMU_OFFSET ((uintptr_t)1 << 62)

typedef struct emu_ctx {
  int index;
  pthread_mutex_t lock;
  nb_status deferred; /* first kernel error since the last sync */
  char message[512];
} emu_ctx;

static emu_ctx ctxs[EMU_DEVICES];

static void *real_of(const void *p) { return (void *)((uintptr_t)p - EMU_OFFSET); }
static void *fake_of(const void *p) { return (void *)((uintptr_t)p + EMU_OFFSET); }

/* v with its data translated to the real address. */
static nbi_view real_view(const nbi_view *v) {
  nbi_view r = *v;
  r.data = real_of(v->data);
  return r;
}

static void *emu_alloc(void *ctx, size_t nbytes) {
  (void)ctx;
  void *p = aligned_alloc(64, (nbytes + 63) & ~(size_t)63);
  return p ? fake_of(p) : NULL;
}
static void emu_free(void *ctx, void *p, size_t nbytes) {
  (void)ctx, (void)nbytes;
  if (p) free(real_of(p));
}
static nb_status emu_upload(void *ctx, void *dst, const void *src, size_t nbytes) {
  (void)ctx;
  memcpy(real_of(dst), src, nbytes);
  return NB_OK;
}
static nb_status emu_sync(void *ctx);
static nb_status emu_download(void *ctx, void *dst, const void *src, size_t nbytes) {
  nb_status st = emu_sync(ctx); /* the kernels before it have run: report theirs */
  if (!st) memcpy(dst, real_of(src), nbytes);
  return st;
}
static nb_status emu_copy(void *ctx, nbi_view *dst, const nbi_view *src) {
  (void)ctx;
  nbi_view d = real_view(dst), s = real_view(src);
  nbi_copy_view(&d, &s);
  return NB_OK;
}
static nb_status emu_fill(void *ctx, nbi_view *dst, double value) {
  (void)ctx;
  nbi_view d = real_view(dst);
  nbi_fill_view(&d, value);
  return NB_OK;
}

static nb_status emu_sync(void *ctx) {
  emu_ctx *c = ctx;
  pthread_mutex_lock(&c->lock);
  nb_status st = c->deferred;
  char msg[sizeof c->message];
  memcpy(msg, c->message, sizeof msg);
  c->deferred = NB_OK;
  pthread_mutex_unlock(&c->lock);
  return st ? nbi_error(st, "%s", msg) : NB_OK;
}

/* The CPU's kernel table (src/backends/cpu/kernels.c) answers. */
static bool emu_supports(void *ctx, int op, nb_dtype dt) {
  (void)ctx;
  return nbi_cpu_supports(NULL, op, dt);
}

/* The thread's error before a kernel runs, restored after it (defer). */
typedef struct emu_saved {
  nb_status st;
  char message[512];
} emu_saved;

static emu_saved save_error(void) {
  emu_saved s = {.st = nb_last_status()};
  if (s.st) snprintf(s.message, sizeof s.message, "%s", nb_last_error());
  return s;
}

/* A kernel's status st, as an asynchronous device gives it: a failure is kept
 * for the next sync (the first since the last one) and the thread's error is
 * restored to before (saved), so the call itself succeeds. */
static nb_status defer(emu_ctx *c, nb_status st, const emu_saved *before) {
  if (!st) return NB_OK;
  pthread_mutex_lock(&c->lock);
  if (!c->deferred) {
    c->deferred = st;
    snprintf(c->message, sizeof c->message, "%s", nb_last_error());
  }
  pthread_mutex_unlock(&c->lock);
  nb_clear_error();
  if (before->st) nbi_error(before->st, "%s", before->message);
  return NB_OK;
}

/* Runs the CPU kernel on translated views, its failure deferred. */
static nb_status emu_run_op(void *ctx, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  nbi_view o = real_view(out), local[4],
           *r = n->n_in <= 4 ? local : malloc(sizeof *r * (size_t)n->n_in);
  if (!r) return nbi_error(NB_ERR_OOM, "nb_eval: out of memory");
  for (int k = 0; k < n->n_in; k++)
    r[k] = real_view(&in[k]);
  emu_saved before = save_error();
  nb_status st = nbi_cpu_run_op(NULL, n, &o, r);
  if (r != local) free(r);
  return defer(ctx, st, &before);
}

/* Fused groups: the CPU's answer, and its executors on translated views (a
 * failure deferred, as a kernel's). */
static bool emu_group_ok(void *ctx, const nbi_group *g) {
  (void)ctx;
  return nbi_cpu_backend.group_ok(NULL, g);
}
static nb_status emu_run_group(void *ctx, const nbi_group *g, nbi_view *out, const nbi_view *in) {
  nbi_view o[NBI_FUSE_MAX], r[NBI_FUSE_MAX];
  for (int j = 0; j < g->n_outputs; j++)
    o[j] = real_view(&out[j]);
  for (int k = 0; k < g->n_operands; k++)
    r[k] = real_view(&in[k]);
  emu_saved before = save_error();
  return defer(ctx, nbi_cpu_backend.run_group(NULL, g, o, r), &before);
}

static const nbi_backend emu_backend = {
    .name = "emu",
    .kind = NB_DEVICE_EMU,
    .alloc = emu_alloc,
    .free = emu_free,
    .upload = emu_upload,
    .download = emu_download,
    .copy = emu_copy,
    .fill = emu_fill,
    .sync = emu_sync,
    .supports = emu_supports,
    .run_op = emu_run_op,
    .group_ok = emu_group_ok,
    .run_group = emu_run_group,
};

void nbi_emu_probe(void) {
  for (int i = 0; i < EMU_DEVICES; i++) {
    ctxs[i].index = i;
    pthread_mutex_init(&ctxs[i].lock, NULL);
    nbi_device_register(NB_EMU(i), &emu_backend, &ctxs[i]);
  }
}
