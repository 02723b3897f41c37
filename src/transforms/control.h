/* src/transforms/control.h — what control.c (payload, kernels, the public
 * functions, the op records) and control_rules.c (argument adapters, the
 * derivative and batching rules) share. Private to those two files. */
#ifndef NABLA_TRANSFORMS_CONTROL_H
#define NABLA_TRANSFORMS_CONTROL_H

#include "transforms.h"
#include "../core/oprules.h"
#include "../core/program.h"

typedef struct ctl {
  nbi_multi m;          /* outputs: cond/while carries; scan carries then ys */
  nbi_program *prog[2]; /* cond: then, else; while: cond, body; scan: body */
  int n_ops;            /* cond: operands; while, scan: carries */
  int n_xs;             /* scan: scanned inputs */
  int n_capt[2];        /* captures of prog[0], prog[1] */
  bool reverse;         /* scan direction */
  int64_t T;            /* scan: number of steps */
} ctl;

static const ctl *ctl_of(const nb_tensor *p) { return (const ctl *)p->payload; }

/* ---- adapters: a function that reorders the arguments of another --------------------------
 * Inner input k is outer input in[k].idx (A_ARG) or a tensor the adapter holds
 * (A_HELD: an operand of the primal op, a zero, a batched capture); held
 * tensors become captures of the trace that uses the adapter. Outer output j
 * is inner output out[j].idx (A_OUT), an outer input (A_ARG) or a held tensor,
 * plus outer input out[j].plus when that is >= 0 (accumulators). */
enum { A_ARG, A_HELD, A_OUT };
typedef struct asrc {
  int kind, idx, plus;
} asrc;

typedef struct adapt {
  nb_fn *f;
  asrc *in;  /* [f->n_in] */
  asrc *out; /* [n_out], up to cap_out */
  nb_tensor **held;
  int n_out, cap_out, n_held, cap_held;
  bool bad; /* a held tensor failed to build: the error is recorded */
} adapt;

int nbi_ctl_capt_base(const nb_tensor *p, int b);
void *nbi_ctl_xcalloc(const char *fn, size_t n, size_t size, nb_status *st);
nb_shape nbi_ctl_row_shape(const nb_shape *s);
void nbi_ctl_put(nb_tensor **dst, nb_tensor *const *src, int n);
nb_tensor *nbi_ctl_mask_for(nb_tensor *m, int64_t B, int rank);
void nbi_ctl_a_in(adapt *a, int k, int outer);
nb_status nbi_ctl_while_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts);
nb_status nbi_ctl_while_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                             nb_tensor **outs);
adapt *nbi_ctl_adapt_new(const char *fn, nb_fn *f, int cap_out, int cap_held);
nb_status nbi_ctl_cond_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts);
nb_status nbi_ctl_cond_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                            nb_tensor **outs);
nb_status nbi_ctl_scan_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin);
void nbi_ctl_a_out(adapt *a, int kind, int idx, int plus);
nb_status nbi_ctl_scan_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched, int64_t B,
                            nb_tensor **outs);
nb_status nbi_ctl_while_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin);
nb_fn *nbi_ctl_adapt_fn(const char *fn, adapt *a, int n_in);
nb_status nbi_ctl_cond_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin);
nb_status nbi_ctl_scan_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts);

#endif
