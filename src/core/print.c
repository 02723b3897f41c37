/* src/core/print.c — nb_print / nb_fprint: NumPy-like text, summarized with
 * "..." (first and last 3 entries per dimension) past 1000 elements. */
#include "nbi.h"

#include <nabla/distributed.h>

#include <stdlib.h>

#define PRINT_EDGE 3

static void print_elem(FILE *f, const nbi_view *v, int64_t off) {
  switch (v->dtype) {
  case NB_BOOL: fputs(nbi_load_i64(v->data, v->dtype, off) ? "true" : "false", f); break;
  case NB_I32:
  case NB_I64:
  case NB_U8:
  case NB_I8:
  case NB_I16: fprintf(f, "%lld", (long long)nbi_load_i64(v->data, v->dtype, off)); break;
  default: fprintf(f, "%.6g", nbi_load_f64(v->data, v->dtype, off)); break;
  }
}

static void print_rec(FILE *f, const nbi_view *v, int dim, int64_t off, bool summarize) {
  if (dim == v->ndim) {
    print_elem(f, v, off);
    return;
  }
  fputc('[', f);
  int64_t n = v->dims[dim];
  for (int64_t i = 0; i < n; i++) {
    if (summarize && n > 2 * PRINT_EDGE && i == PRINT_EDGE) {
      fputs(dim == v->ndim - 1 ? "..., " : "...,\n", f);
      i = n - PRINT_EDGE;
    }
    print_rec(f, v, dim + 1, off + i * v->strides[dim], summarize);
    if (i + 1 < n) {
      fputc(',', f);
      if (dim == v->ndim - 1)
        fputc(' ', f);
      else {
        fputc('\n', f);
        for (int k = 0; k <= dim; k++)
          fputc(' ', f);
      }
    }
  }
  fputc(']', f);
}

void nb_fprint(FILE *f, nb_tensor *t) {
  if (!f) {
    nbi_error(NB_ERR_NULL, "nb_fprint: FILE is NULL");
    return;
  }
  if (!t) {
    fputs("<NULL tensor>\n", f);
    return;
  }
  if (t->flags & NBI_T_TRACED) {
    char b[160];
    fprintf(f, "<traced %s %s>\n", nb_dtype_name(t->dtype), nb_shape_str(t->shape, b, sizeof b));
    return;
  }
  nb_scope_begin();
  nb_tensor *r = nbi_readable("nb_fprint", t);
  if (!r || nbi_realize(&r, 1)) {
    fprintf(f, "<error: %s>\n", nb_last_error());
  } else {
    /* the values come to the host first (nbi_host_read): the tensor may live
     * on a device */
    nbi_view v = nbi_tensor_view(r);
    size_t nbytes = (size_t)nbi_numel(&r->shape) * nb_dtype_size(r->dtype);
    if (nbytes == 0) { /* empty: one "[]", however long its other dims (NumPy's form) */
      char b[160];
      fprintf(f, "[] (%s %s)\n", nb_dtype_name(t->dtype), nb_shape_str(t->shape, b, sizeof b));
      nb_scope_end();
      return;
    }
    void *host = malloc(nbytes ? nbytes : 1);
    if (!host || nbi_host_read(r->device, &v, host, r->dtype)) {
      fprintf(f, "<error: %s>\n", host ? nb_last_error() : "out of memory");
    } else {
      v.data = host;
      nbi_contig_strides(&r->shape, v.strides);
      char b[160];
      print_rec(f, &v, 0, 0, nbi_numel(&t->shape) > 1000);
      fprintf(f, " (%s %s)\n", nb_dtype_name(t->dtype), nb_shape_str(t->shape, b, sizeof b));
    }
    free(host);
  }
  nb_scope_end();
}

/* In a job of several processes rank 0 prints, unless NABLA_PRINT_ALL_RANKS=1
 * (each rank then prints, after its nb_rank_prefix()). A sharded tensor is
 * gathered on every rank all the same: the gather is a collective. */
void nb_print(nb_tensor *t) {
  if (nb_world_size() > 1) {
    const char *all = getenv("NABLA_PRINT_ALL_RANKS");
    if (all && atoi(all) > 0) {
      fputs(nb_rank_prefix(), stdout);
    } else if (nb_rank() != 0) {
      if (t && t->mesh && !(t->flags & NBI_T_TRACED)) {
        nb_scope_begin();
        nb_tensor *r = nbi_readable("nb_print", t);
        if (r) nbi_realize(&r, 1);
        nb_scope_end();
      }
      return;
    }
  }
  nb_fprint(stdout, t);
}
