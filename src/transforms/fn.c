/* src/transforms/fn.c — nb_fn handles, nb_call, tracing, and programs as
 * functions (nbi_trace_program, nbi_program_fn). It calls nothing else of
 * this folder: the transforms of programs (vjp / jvp / vmap of a body) are
 * program_xform.c's, above autodiff.c and vmap.c. */
#include "transforms.h"
#include "../core/oprules.h"
#include "../core/program.h"

#include <stdlib.h>

#include "../sharding/sharding.h"

nb_fn *nbi_fn_make(const char *fn, nb_fn_body body, void *user, void (*destroy)(void *), int n_in,
                   int n_out) {
  nb_fn *f = calloc(1, sizeof *f);
  if (!f) {
    if (destroy) destroy(user);
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  *f = (nb_fn){
      .refcount = 1, .n_in = n_in, .n_out = n_out, .body = body, .user = user, .destroy = destroy};
  return f;
}

nb_fn *nb_fn_create(nb_fn_body body, void *user, int n_in, int n_out) {
  if (!body) {
    nbi_error(NB_ERR_NULL, "nb_fn_create: body is NULL");
    return NULL;
  }
  if (n_in < 0 || n_out < 1) {
    nbi_error(NB_ERR_ARG, "nb_fn_create: n_in is %d and n_out %d (need n_in >= 0, n_out >= 1)",
              n_in, n_out);
    return NULL;
  }
  nb_fn *f = nbi_fn_make("nb_fn_create", body, user, NULL, n_in, n_out);
  if (f) f->user_body = true;
  return f;
}

nb_fn *nb_fn_retain(nb_fn *f) {
  if (f) NBI_REF_INC(f);
  return f;
}

void nb_fn_release(nb_fn *f) {
  if (!f || NBI_REF_DEC(f) > 0) return;
  if (f->destroy) f->destroy(f->user);
  free(f);
}

int nb_fn_n_in(const nb_fn *f) { return f ? f->n_in : -1; }
int nb_fn_n_out(const nb_fn *f) { return f ? f->n_out : -1; }

/* A transform's function on sharded values: its program, traced on unsharded
 * placeholders of the inputs' logical shapes (under nbi_trace_mesh: the
 * inputs' mesh), applied to the sharded inputs by graph-mode propagation
 * (src/sharding/gprop.c: a sharding for every value of the program, the
 * constraints it holds honoured, then each op recorded per device). A user's
 * body runs as it is: its ops see the sharded values directly. */
static nb_status call_sharded(nb_fn *f, nb_tensor *const *in, nb_tensor **out) {
  nbi_program *prog;
  nb_tensor **capt;
  int n_capt;
  /* traced under the inputs' mesh: nb_reshard of a traced value uses it,
   * gradients are laid out like their primals (src/sharding/constraint.c) */
  nb_mesh *old = nbi_trace_mesh(), *m = NULL;
  for (int k = 0; k < f->n_in && !m; k++)
    m = in[k]->mesh;
  nbi_trace_mesh_set(m);
  nb_status st = nbi_trace_program_like("nb_call", f, in, &prog, &capt, &n_capt);
  nbi_trace_mesh_set(old);
  if (st) return st;
  nb_tensor **args = malloc(sizeof *args * (size_t)(prog->n_in + 1));
  if (!args) st = nbi_error(NB_ERR_OOM, "nb_call: out of memory");
  for (int k = 0; k < prog->n_in && !st; k++)
    args[k] = k < f->n_in ? in[k] : capt[k - f->n_in];
  if (!st) st = nbi_program_apply("nb_call", prog, args, out);
  free(args);
  nbi_release_all(capt, n_capt);
  nbi_program_release(prog);
  return st;
}

static bool any_sharded(nb_tensor *const *in, int n) {
  for (int k = 0; k < n; k++)
    if (in[k]->mesh) return true;
  return false;
}

nb_status nb_call(nb_fn *f, nb_tensor *const *in, nb_tensor **out) {
  if (!f) return nbi_error(NB_ERR_NULL, "nb_call: f is NULL");
  if (!out) return nbi_error(NB_ERR_NULL, "nb_call: out is NULL");
  for (int k = 0; k < f->n_out; k++)
    out[k] = NULL;
  if (f->takes_trees)
    return nbi_error(NB_ERR_ARG, "nb_call: f takes trees (made by nb_fn_create_trees or a "
                                 "transform of one); call it with nb_call_trees");
  if (f->n_in > 0 && !in) return nbi_error(NB_ERR_NULL, "nb_call: in is NULL");
  for (int k = 0; k < f->n_in; k++)
    if (!in[k]) return nbi_error(NB_ERR_NULL, "nb_call: input %d is NULL", k);
  nb_tensor *local[32], **tmp = f->n_out <= 32 ? local : calloc((size_t)f->n_out, sizeof *tmp);
  if (!tmp) return nbi_error(NB_ERR_OOM, "nb_call: out of memory");
  for (int k = 0; k < f->n_out; k++)
    tmp[k] = NULL;
  for (int k = 0; k < f->n_in; k++)
    if (nbi_dead("nb_call", in[k], k)) {
      if (tmp != local) free(tmp);
      return nb_last_status();
    }
  nb_scope_begin();
  /* the body may not end the caller's scopes; scopes it leaves open are closed */
  int depth = nbi_scope_depth(), floor = nbi_scope_floor_set(depth);
  nb_status st = !f->user_body && any_sharded(in, f->n_in)
                     ? call_sharded(f, in, tmp)
                     : f->body(f->user, in, f->n_in, tmp, f->n_out);
  nbi_scope_floor_set(floor);
  int left_open = nbi_scope_unwind(depth, tmp, f->n_out);
  if (left_open && !st)
    st = nbi_error(NB_ERR_SCOPE, "nb_call: the function body left %d scope(s) open", left_open);
  if (st == NB_OK)
    for (int k = 0; k < f->n_out && !st; k++)
      if (!tmp[k]) {
        st = nb_last_status();
        if (!st) st = nbi_error(NB_ERR_ARG, "nb_call: the function left output %d NULL", k);
      }
  for (int k = 0; k < f->n_out && !st; k++)
    if (!(out[k] = nbi_keep_moved(tmp[k]))) st = NB_ERR_OOM;
  if (st) /* those kept already are released with the caller's scope */
    for (int k = 0; k < f->n_out; k++)
      out[k] = NULL;
  nb_scope_end();
  if (tmp != local) free(tmp);
  if (st && !nb_last_status())
    nbi_error(st, "nb_call: the function returned %s", nb_status_str(st));
  return st;
}

/* ---- tracing ------------------------------------------------------------------- */
nb_status nbi_trace_run(const char *fn, nb_fn *f, nb_tensor *const *in, nbi_trace *tr) {
  *tr = (nbi_trace){.n_in = f->n_in, .n_out = f->n_out, .top = true};
  tr->x = calloc((size_t)f->n_in + 1, sizeof *tr->x);
  tr->y = calloc((size_t)f->n_out, sizeof *tr->y);
  if (!tr->x || !tr->y) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  tr->seq0 = nbi_next_seq();
  for (int k = 0; k < f->n_in; k++) {
    if (in[k]->flags & NBI_T_TRACED) tr->top = false;
    if (!(tr->x[k] = nbi_identity(in[k]))) return nb_last_status();
    tr->x[k]->flags |= NBI_T_TRACED;
  }
  nbi_trace_depth++;
  nb_status st = nb_call(f, tr->x, tr->y);
  nbi_trace_depth--;
  return st;
}

void nbi_trace_free(nbi_trace *tr) {
  free(tr->x);
  free(tr->y);
  *tr = (nbi_trace){0};
}

nb_tensor *nbi_trace_result(const nbi_trace *tr, nb_tensor *t) {
  if (!t || !tr->top) return t;
  nb_tensor *r = nbi_identity(t);
  if (r) r->flags &= ~(uint32_t)NBI_T_TRACED;
  return r;
}

/* ---- programs as functions -------------------------------------------------------------- */
nb_status nbi_trace_program(const char *fn, nb_fn *f, const nb_shape *shapes,
                            const nb_dtype *dtypes, nbi_program **prog, nb_tensor ***capt,
                            int *n_capt) {
  *prog = NULL, *capt = NULL, *n_capt = 0;
  nb_tensor **x = calloc((size_t)(f->n_in + f->n_out) + 1, sizeof *x), **y = x + f->n_in;
  if (!x) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  nb_status st = NB_OK;
  nb_scope_begin();
  uint64_t seq0 = nbi_next_seq();
  for (int k = 0; k < f->n_in && !st; k++)
    if (!(x[k] = nbi_placeholder(&shapes[k], dtypes[k]))) st = nb_last_status();
  if (!st) {
    nbi_trace_depth++;
    st = nb_call(f, x, y);
    nbi_trace_depth--;
  }
  if (!st) st = nbi_program_build(fn, x, f->n_in, y, f->n_out, seq0, prog, capt, n_capt);
  nb_scope_end();
  free(x);
  return st;
}

nb_status nbi_trace_program_like(const char *fn, nb_fn *f, nb_tensor *const *in, nbi_program **prog,
                                 nb_tensor ***capt, int *n_capt) {
  nb_shape *s = malloc(sizeof *s * (size_t)(f->n_in + 1));
  nb_dtype *d = malloc(sizeof *d * (size_t)(f->n_in + 1));
  nb_status st = s && d ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int k = 0; k < f->n_in && !st; k++) {
    if (!in[k])
      st = nbi_error(NB_ERR_NULL, "%s: input %d is NULL", fn, k);
    else
      s[k] = in[k]->shape, d[k] = in[k]->dtype;
  }
  if (!st)
    st = nbi_trace_program(fn, f, s, d, prog, capt, n_capt);
  else
    *prog = NULL, *capt = NULL, *n_capt = 0;
  free(s);
  free(d);
  return st;
}

static nb_status program_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                              int n_out) {
  (void)n_in, (void)n_out;
  return nbi_program_apply("nb_call", user, in, out);
}

static void program_destroy(void *user) { nbi_program_release(user); }

nb_fn *nbi_program_fn(const char *fn, nbi_program *p) {
  return nbi_fn_make(fn, program_body, nbi_program_retain(p), program_destroy, p->n_in, p->n_out);
}

void nbi_release_all(nb_tensor **ts, int n) {
  for (int i = 0; i < n; i++)
    nb_release(ts[i]);
  free(ts);
}
