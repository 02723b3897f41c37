/* src/transforms/checkpoint.c — nb_checkpoint (jax.checkpoint) and its op, REMAT.
 *
 * A checkpointed call whose inputs are traced (an enclosing transform) or need
 * gradients (imperative autodiff) traces f into a program (captures become
 * further inputs) and records one multi-output REMAT node on the inputs. Its
 * kernel runs the program in a nested realization: f's internals exist only
 * while the kernel runs, so the enclosing plan never holds them. Otherwise
 * (plain tensors) the call is just f: nothing would be saved.
 *
 * The rules hand the program to the transforms and checkpoint the result:
 * - VJP: checkpoint(vjp(program)) on (inputs, cotangents), keeping only the
 *   needed input cotangents: the backward of a segment recomputes the
 *   segment's internals inside one kernel, from the segment's inputs;
 * - JVP: checkpoint(jvp(program)) on (inputs, tangents), keeping the float
 *   output tangents;
 * - batching: checkpoint(vmap(program)), unbatched inputs not mapped.
 * So higher derivatives and batched derivatives stay checkpointed too.
 */
#include "transforms.h"
#include "../core/oprules.h"
#include "../core/program.h"
#include "tree.h"

#include "../ops/rule_util.h"

#include <stdlib.h>

static const char *FN = "nb_checkpoint";

/* ---- the REMAT payload and kernel ---------------------------------------------------- */
typedef struct remat {
  nbi_multi m; /* first: the outputs' types */
  nbi_program *prog;
} remat;

static void remat_destroy(nbi_payload *p) {
  remat *r = (remat *)p;
  nbi_multi_fini(&r->m);
  nbi_program_release(r->prog);
  free(r);
}

static nbi_program *prog_of(const nb_tensor *p) { return ((const remat *)p->payload)->prog; }

static nb_status remat_exec(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)in; /* the nested realization shares the inputs' storage itself */
  const nbi_program *p = prog_of(n);
  nb_tensor *local[8], **res = p->n_out <= 8 ? local : calloc((size_t)p->n_out, sizeof *res);
  if (!res) return nbi_error(NB_ERR_OOM, "nb_eval: out of memory");
  nb_status st = nbi_program_run("nb_eval", p, n->in, res);
  bool run_failed = st != NB_OK; /* then res holds nothing */
  for (int j = 0; j < p->n_out && !st; j++) {
    nbi_view dst = nbi_multi_out_view(n, out, j), src = nbi_tensor_view(res[j]);
    st = nbi_copy_between(n->device, &dst, res[j]->device, &src);
  }
  for (int j = 0; j < p->n_out && !run_failed; j++)
    nb_release(res[j]);
  if (res != local) free(res);
  return st;
}

/* Records the REMAT node of prog on in[0..n_in-1] then capt[0..n_capt-1]. */
static nb_status record_pack(nbi_program *prog, nb_tensor *const *in, int n_in,
                             nb_tensor *const *capt, int n_capt, nb_tensor **out) {
  remat *r = calloc(1, sizeof *r);
  nb_tensor **all = malloc(sizeof *all * (size_t)(n_in + n_capt + 1));
  if (!r || !all) {
    free(r);
    free(all);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  }
  r->m.base =
      (nbi_payload){.refcount = 1, .destroy = remat_destroy, .h1 = prog->h1, .h2 = prog->h2};
  r->prog = nbi_program_retain(prog);
  for (int k = 0; k < n_in; k++)
    all[k] = in[k];
  for (int k = 0; k < n_capt; k++)
    all[n_in + k] = capt[k];
  nb_status st = nbi_multi_init(FN, &r->m, prog->n_out, prog->out_shape, prog->out_dtype);
  if (!st) st = nbi_record_multi(NBI_OP_REMAT, all, n_in + n_capt, &r->m, NULL, out);
  nbi_payload_release(&r->m.base);
  free(all);
  return st;
}

/* Traces g on the types of in[0..g->n_in-1] and records its REMAT node on them. */
static nb_status remat_record(nb_fn *g, nb_tensor *const *in, nb_tensor **out) {
  nbi_program *prog;
  nb_tensor **capt;
  int n_capt;
  nb_status st = nbi_trace_program_like(FN, g, in, &prog, &capt, &n_capt);
  if (st) return st;
  st = record_pack(prog, in, g->n_in, capt, n_capt, out);
  nbi_program_release(prog);
  nbi_release_all(capt, n_capt);
  return st;
}

/* ---- nb_checkpoint ------------------------------------------------------------------------ */
static nb_status checkpoint_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                                 int n_out) {
  (void)n_out;
  nb_fn *f = user;
  bool record = false;
  for (int k = 0; k < n_in; k++)
    record |= (in[k]->flags & (NBI_T_TRACED | NBI_T_GRAD_PATH | NBI_T_REQUIRES_GRAD)) != 0;
  return record ? remat_record(f, in, out) : nb_call(f, in, out);
}

static void checkpoint_destroy(void *user) { nb_fn_release(user); }

nb_fn *nb_checkpoint(nb_fn *f) {
  if (!f) {
    nbi_error(NB_ERR_NULL, "%s: f is NULL", FN);
    return NULL;
  }
  if (nbi_fn_is_tree(f)) return nbi_tree_checkpoint(f);
  return nbi_fn_make(FN, checkpoint_body, nb_fn_retain(f), checkpoint_destroy, f->n_in, f->n_out);
}

/* ---- rules ------------------------------------------------------------------------------ */
/* Zeros of output j's type (a cotangent the sweep left NULL). */
static nb_tensor *zeros_of_output(const nb_tensor *p, int j) {
  const nbi_multi *m = nbi_multi_of(p);
  return nbi_zeros_of(&m->shape[j], m->dtype[j]);
}

/* Records g's REMAT node on a (g's inputs) into res, and releases g. This is
 * checkpoint(g) applied, except that it records even when no input is traced
 * (a vmap at top level batches plain values): g's trace then sees only
 * placeholders, never the values of the sweep that runs this rule. */
static nb_status remat_release(nb_fn *g, nb_tensor *const *a, nb_tensor **res) {
  if (!g) return nb_last_status();
  nb_status st = remat_record(g, a, res);
  nb_fn_release(g);
  return st;
}

static nb_status remat_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin) {
  int n_in = p->n_in, n_out = nbi_multi_of(p)->n_out, n = 0;
  nb_tensor **a = calloc((size_t)(n_in + n_out + n_in) + 1, sizeof *a), **res = a + n_in + n_out;
  int *idx = malloc(sizeof *idx * (size_t)(n_in + 1));
  nb_status st = a && idx ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int k = 0; k < n_in && !st; k++) {
    a[k] = p->in[k];
    if (need[k]) idx[n++] = n_out + k;
  }
  for (int j = 0; j < n_out && !st && n; j++)
    if (!(a[n_in + j] = gys[j] ? gys[j] : zeros_of_output(p, j))) st = nb_last_status();
  if (!st && n)
    st = remat_release(nbi_program_xform(FN, prog_of(p), NBI_XF_VJP, NULL, idx, n), a, res);
  for (int k = 0, i = 0; k < n_in && !st; k++)
    if (need[k]) gin[k] = res[i++];
  free(a);
  free(idx);
  return st;
}

static nb_status remat_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts) {
  const nbi_multi *m = nbi_multi_of(p);
  int n_in = p->n_in, n_out = m->n_out, n = 0;
  nb_tensor **a = calloc((size_t)(2 * n_in + n_out) + 1, sizeof *a), **res = a + 2 * n_in;
  int *idx = malloc(sizeof *idx * (size_t)(n_out + 1));
  nb_status st = a && idx ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int k = 0; k < n_in && !st; k++) {
    a[k] = p->in[k];
    if (!(a[n_in + k] = tin[k] ? tin[k] : nbi_zeros_like(p->in[k]))) st = nb_last_status();
  }
  for (int j = 0; j < n_out && !st; j++)
    if (nb_dtype_is_float(m->dtype[j])) idx[n++] = n_out + j;
  if (!st && n)
    st = remat_release(nbi_program_xform(FN, prog_of(p), NBI_XF_JVP, NULL, idx, n), a, res);
  for (int j = 0, i = 0; j < n_out && !st; j++)
    touts[j] = nb_dtype_is_float(m->dtype[j]) ? res[i++] : NULL;
  free(a);
  free(idx);
  return st;
}

static nb_status remat_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                            nb_tensor **outs) {
  (void)B;
  int n_in = p->n_in;
  int *axes = malloc(sizeof *axes * (size_t)(n_in + 1));
  if (!axes) return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int k = 0; k < n_in; k++)
    axes[k] = batched[k] ? 0 : NB_NOT_MAPPED;
  nb_status st =
      remat_release(nbi_program_xform(FN, prog_of(p), NBI_XF_VMAP, axes, NULL, 0), bin, outs);
  free(axes);
  return st;
}

static int remat_programs(const nbi_payload *p, const nbi_program **out) {
  out[0] = ((const remat *)p)->prog;
  return 1;
}

const nbi_op_def nbi_opdef_REMAT = {.name = "remat",
                                    .arity = -1,
                                    .exec = remat_exec,
                                    .flags = NBI_OPF_MULTI,
                                    .vjp_multi = remat_vjp,
                                    .jvp_multi = remat_jvp,
                                    .vmap_multi = remat_vmap,
                                    .programs = remat_programs};
