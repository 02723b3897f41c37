/* src/transforms/shard_map.c — nb_shard_map (jax.shard_map) and its op, SHARD_MAP.
 *
 * A call traces the body f on the local (per-device) shapes of its inputs,
 * with the mesh pushed (nbi_smap_push) so f's collectives record their ops;
 * captures become further inputs, replicated. Then:
 * - inputs that are plain or on the mesh: each is moved to its in spec
 *   (nbi_shard_to: cut locally, or resharded by collectives) and the body runs
 *   on every device at once (nbi_smap_exec, src/sharding/smap.c); outputs are
 *   tensors on the mesh with the out specs' layouts;
 * - traced inputs (an enclosing transform): one multi-output SHARD_MAP node
 *   on the logical inputs, whose payload (nbi_smap_payload) holds the body
 *   program and the layouts. Applied to values later (jit replay, a call on
 *   sharded values) its apply rule runs it as above; applied inside a kernel
 *   (a body program of checkpoint or control flow) it records its node
 *   again, and a realization that reaches the node runs its kernel, which
 *   does the same in a nested realization and gathers the outputs (such
 *   programs give plain values). nb_jit never plans an executable for a
 *   program holding a shard_map: its replay gives the direct call's layouts.
 *
 * The logical function of a shard_map is assemble o body-per-device o
 * distribute, where distribute copies input k's block to every device along
 * the axes in_s[k] does not name, and assemble concatenates blocks along the
 * sharded dimensions, sums over out_s[j]'s partial axes and takes the
 * (checked invariant) value along the axes out_s[j] does not name. Its rules
 * are shard_maps of the body's transforms:
 * - VJP: shard_map(vjp(body)) on (inputs, cotangents). Output j's cotangent
 *   arrives replicated over the axes out_s[j] does not name and is scaled by
 *   1 / (their size) inside the body, so that the per-device cotangents sum to
 *   it (the transpose of "take the invariant value": an all-reduce sum in
 *   the body transposes to an all-reduce sum, which gives it back whole).
 *   Over out_s[j]'s partial axes the cotangent is replicated as it is (the
 *   transpose of a sum is a copy). Input k's cotangent leaves with in_s[k]'s
 *   dimensions and partial over the axes in_s[k] does not name (the
 *   transpose of a copy is a sum, kept lazy).
 * - JVP: shard_map(jvp(body)), tangents laid out like their primals.
 * - batching: shard_map(vmap(body)), the batch dimension unsharded.
 * Every rule's shard_map records a new SHARD_MAP node, so they nest.
 */
#include "../ops/rule_util.h"
#include "../core/oprules.h"
#include "../core/program.h"
#include "../sharding/sharding.h"
#include "transforms.h"

#include <stdio.h>
#include <stdlib.h>

static const char *FN = "nb_shard_map";

/* ---- the function object ---------------------------------------------------------- */
/* in/out layouts come either as spec text (public: parsed at the call, when
 * the ranks are known) or as shardings (rules: ranks known). */
typedef struct smap_fn {
  nb_fn *f;
  nb_mesh *m;
  int n_in, n_out;
  char **in_spec, **out_spec; /* [n_in], [n_out] or NULL */
  nbi_sharding *in_s, *out_s; /* [n_in], [n_out] or NULL */
  double *ct_scale;           /* [n_in] or NULL: inputs multiplied by it before f */
} smap_fn;

static void smap_fn_destroy(void *user) {
  smap_fn *s = user;
  nb_fn_release(s->f);
  nb_mesh_release(s->m);
  for (int k = 0; s->in_spec && k < s->n_in; k++)
    free(s->in_spec[k]);
  for (int j = 0; s->out_spec && j < s->n_out; j++)
    free(s->out_spec[j]);
  free(s->in_spec);
  free(s->out_spec);
  free(s->in_s);
  free(s->out_s);
  free(s->ct_scale);
  free(s);
}

/* Parses the layout of value k (rank ndim) into *out: specs are closed
 * layouts; open flags and priorities mean nothing here and are dropped. */
static nb_status layout_of(const smap_fn *s, bool input, int k, int ndim, nbi_sharding *out) {
  const nbi_sharding *given = input ? s->in_s : s->out_s;
  if (given) {
    *out = given[k];
    if (out->ndim != ndim)
      return nbi_error(NB_ERR_SHARDING, "%s: %s %d has rank %d but its layout has %d", FN,
                       input ? "input" : "output", k, ndim, out->ndim);
    return NB_OK;
  }
  const char *spec = input ? s->in_spec[k] : s->out_spec[k];
  if (nbi_sharding_parse(FN, s->m, spec, ndim, false, out)) return nb_last_status();
  for (int d = 0; d < ndim; d++) {
    out->dim[d].open = false, out->dim[d].priority = -1;
    for (int i = 0; i < out->dim[d].n; i++)
      if (out->dim[d].ax[i].size != s->m->size[out->dim[d].ax[i].axis])
        return nbi_error(NB_ERR_SHARDING,
                         "%s: %s_specs[%d] \"%s\" uses a sub-axis; shard_map specs name whole "
                         "mesh axes",
                         FN, input ? "in" : "out", k, spec);
  }
  for (int i = 0; i < out->n_partial; i++)
    if (out->partial[i].size != s->m->size[out->partial[i].axis])
      return nbi_error(NB_ERR_SHARDING,
                       "%s: out_specs[%d] \"%s\" uses a sub-axis; shard_map specs name whole "
                       "mesh axes",
                       FN, k, spec);
  out->n_repl = 0; /* every axis a spec does not use is replicated here anyway */
  if (input && out->n_partial)
    return nbi_error(NB_ERR_SHARDING,
                     "%s: in_specs[%d] \"%s\" lists partial axes (an input is a whole value; "
                     "partial(...) is for out_specs)",
                     FN, k, spec);
  return NB_OK;
}

/* ---- payloads ------------------------------------------------------------------------ */
static void payload_destroy(nbi_payload *p) {
  nbi_smap_payload *q = (nbi_smap_payload *)p;
  nbi_multi_fini(&q->m);
  nbi_program_release(q->prog);
  nb_mesh_release(q->mesh);
  free(q->in_s);
  free(q->out_s);
  free(q);
}

static void hash_layout(nbi_payload *b, const nb_mesh *m, const nbi_sharding *s) {
  char text[512];
  size_t n = nbi_sharding_format(m, s, text, sizeof text);
  for (size_t i = 0; i < n && i < sizeof text; i++)
    nbi_hash_mix(&b->h1, &b->h2, (uint64_t)(unsigned char)text[i]);
  nbi_hash_mix(&b->h1, &b->h2, (uint64_t)s->ndim);
}

/* A payload for prog on m with the given layouts (copied); the outputs'
 * logical shapes are the local ones times the shards. */
static nbi_smap_payload *payload_new(nbi_program *prog, nb_mesh *m, const nbi_sharding *in_s,
                                     const nbi_sharding *out_s) {
  nbi_smap_payload *q = calloc(1, sizeof *q);
  nb_shape *shapes = malloc(sizeof *shapes * (size_t)(prog->n_out + 1));
  if (q) {
    q->in_s = malloc(sizeof *q->in_s * (size_t)(prog->n_in + 1));
    q->out_s = malloc(sizeof *q->out_s * (size_t)(prog->n_out + 1));
  }
  if (!q || !shapes || !q->in_s || !q->out_s) {
    if (q) free(q->in_s), free(q->out_s);
    free(q);
    free(shapes);
    nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
    return NULL;
  }
  q->m.base =
      (nbi_payload){.refcount = 1, .destroy = payload_destroy, .h1 = prog->h1, .h2 = prog->h2};
  q->prog = nbi_program_retain(prog);
  q->mesh = nb_mesh_retain(m);
  memcpy(q->in_s, in_s, sizeof *in_s * (size_t)prog->n_in);
  memcpy(q->out_s, out_s, sizeof *out_s * (size_t)prog->n_out);
  nbi_hash_mix(&q->m.base.h1, &q->m.base.h2, (uint64_t)(uintptr_t)m);
  for (int k = 0; k < prog->n_in; k++)
    hash_layout(&q->m.base, m, &in_s[k]);
  for (int j = 0; j < prog->n_out; j++) {
    hash_layout(&q->m.base, m, &out_s[j]);
    shapes[j] = prog->out_shape[j];
    for (int d = 0; d < shapes[j].ndim; d++)
      shapes[j].dims[d] *= nbi_dim_shards(&out_s[j], d);
  }
  nb_status st = nbi_multi_init(FN, &q->m, prog->n_out, shapes, prog->out_dtype);
  free(shapes);
  if (st) {
    nbi_payload_release(&q->m.base);
    return NULL;
  }
  return q;
}

/* ---- running ------------------------------------------------------------------------ */
/* Runs q on operands ops (plain or sharded, none traced): each moved to its
 * layout on q's mesh, then the body on every device. outs: sharded, borrowed. */
static nb_status smap_run(const nbi_smap_payload *q, nb_tensor *const *ops, nb_tensor **outs) {
  int n = q->prog->n_in;
  nb_tensor **xs = malloc(sizeof *xs * (size_t)(n + 1));
  if (!xs) return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  nb_status st = NB_OK;
  for (int k = 0; k < n && !st; k++)
    if (!(xs[k] = nbi_shard_to(FN, ops[k], q->mesh, &q->in_s[k]))) st = nb_last_status();
  if (!st) st = nbi_smap_exec(FN, q->mesh, q->prog, xs, q->out_s, outs);
  free(xs);
  return st;
}

static bool any_traced(nb_tensor *const *ts, int n) {
  for (int k = 0; k < n; k++)
    if (ts[k]->flags & NBI_T_TRACED) return true;
  return false;
}

/* Records q's SHARD_MAP node on ops (traced) or runs it (plain or sharded). */
static nb_status smap_apply_payload(nbi_smap_payload *q, nb_tensor *const *ops, nb_tensor **outs) {
  if (any_traced(ops, q->prog->n_in))
    return nbi_record_multi(NBI_OP_SHARD_MAP, ops, q->prog->n_in, &q->m, NULL, outs);
  return smap_run(q, ops, outs);
}

/* ---- the call ---------------------------------------------------------------------- */
/* f with inputs scaled: in[k] * scale[k] where scale[k] != 1. */
static nb_status scaled_call(const smap_fn *s, nb_tensor *const *in, nb_tensor **out) {
  if (!s->ct_scale) return nb_call(s->f, in, out);
  nb_tensor **x = malloc(sizeof *x * (size_t)(s->n_in + 1));
  if (!x) return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  nb_status st = NB_OK;
  for (int k = 0; k < s->n_in && !st; k++) {
    x[k] = in[k];
    if (s->ct_scale[k] != 1.0 && !(x[k] = nb_mul_scalar(in[k], s->ct_scale[k])))
      st = nb_last_status();
  }
  if (!st) st = nb_call(s->f, x, out);
  free(x);
  return st;
}

static nb_status scaled_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                             int n_out) {
  (void)n_in, (void)n_out;
  return scaled_call(user, in, out);
}

static nb_status smap_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in;
  const smap_fn *s = user;
  nb_shape *local = malloc(sizeof *local * (size_t)(s->n_in + 1));
  nb_dtype *dts = malloc(sizeof *dts * (size_t)(s->n_in + 1));
  nbi_sharding *in_s = malloc(sizeof *in_s * (size_t)(s->n_in + 1)), *all_in = NULL, *out_s = NULL;
  nb_tensor **ops = NULL, **capt = NULL;
  nbi_program *prog = NULL;
  nb_fn *g = NULL;
  int n_capt = 0;
  nb_status st = local && dts && in_s ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int k = 0; k < s->n_in && !st; k++) {
    const nb_tensor *x = in[k]; /* on another mesh: gathered, then placed (nbi_shard_to) */
    if ((st = layout_of(s, true, k, x->shape.ndim, &in_s[k]))) break;
    local[k] = x->shape, dts[k] = x->dtype;
    for (int d = 0; d < x->shape.ndim && !st; d++) {
      int64_t n = nbi_dim_shards(&in_s[k], d);
      if (x->shape.dims[d] % n) {
        char b[512];
        nbi_sharding_format(s->m, &in_s[k], b, sizeof b);
        st = nbi_error(NB_ERR_SHARDING,
                       "%s: input %d: dimension %d (size %lld) does not divide into its %lld "
                       "shards of %s",
                       FN, k, d, (long long)x->shape.dims[d], (long long)n, b);
      }
      local[k].dims[d] /= n;
    }
  }
  /* the body on local shapes, collectives naming s->m's axes */
  if (!st) {
    g = s->ct_scale ? nbi_fn_make(FN, scaled_body, (void *)s, NULL, s->n_in, s->n_out) : s->f;
    if (!g) st = nb_last_status();
  }
  if (!st && !(st = nbi_smap_push(FN, s->m))) {
    /* the body is per device: no call on sharded values is being traced in
     * it (gradients there are not laid out like sharded primals) */
    nb_mesh *outer = nbi_trace_mesh();
    nbi_trace_mesh_set(NULL);
    st = nbi_trace_program(FN, g, local, dts, &prog, &capt, &n_capt);
    nbi_trace_mesh_set(outer);
    nbi_smap_pop();
  }
  if (g && g != s->f) nb_fn_release(g);
  int n_ops = s->n_in + n_capt;
  if (!st) {
    all_in = malloc(sizeof *all_in * (size_t)(n_ops + 1));
    out_s = malloc(sizeof *out_s * (size_t)(s->n_out + 1));
    ops = malloc(sizeof *ops * (size_t)(n_ops + 1));
    if (!all_in || !out_s || !ops) st = nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  }
  for (int k = 0; k < n_ops && !st; k++) {
    ops[k] = k < s->n_in ? in[k] : capt[k - s->n_in];
    all_in[k] = k < s->n_in ? in_s[k] : nbi_sharding_replicated(ops[k]->shape.ndim);
  }
  for (int j = 0; j < s->n_out && !st; j++)
    st = layout_of(s, false, j, prog->out_shape[j].ndim, &out_s[j]);
  nbi_smap_payload *q = st ? NULL : payload_new(prog, s->m, all_in, out_s);
  if (!st && !q) st = nb_last_status();
  if (q) {
    st = smap_apply_payload(q, ops, out);
    nbi_payload_release(&q->m.base);
  }
  (void)n_out;
  nbi_program_release(prog);
  if (capt) nbi_release_all(capt, n_capt);
  free(local);
  free(dts);
  free(in_s);
  free(all_in);
  free(out_s);
  free(ops);
  return st;
}

/* An nb_fn for f on m; takes over f's reference and the arrays. */
static nb_fn *smap_make(smap_fn *s) {
  return nbi_fn_make(FN, smap_body, s, smap_fn_destroy, s->n_in, s->n_out);
}

nb_fn *nb_shard_map(nb_fn *f, nb_mesh *m, const char *const *in_specs,
                    const char *const *out_specs) {
  if (!f || !m || (!in_specs && f->n_in > 0) || !out_specs) {
    nbi_error(NB_ERR_NULL, "%s: %s is NULL", FN,
              !f           ? "f"
              : !m         ? "the mesh"
              : !out_specs ? "out_specs"
                           : "in_specs");
    return NULL;
  }
  for (int k = 0; k < f->n_in; k++)
    if (!in_specs[k]) {
      nbi_error(NB_ERR_NULL, "%s: in_specs[%d] is NULL", FN, k);
      return NULL;
    }
  for (int j = 0; j < f->n_out; j++)
    if (!out_specs[j]) {
      nbi_error(NB_ERR_NULL, "%s: out_specs[%d] is NULL", FN, j);
      return NULL;
    }
  smap_fn *s = calloc(1, sizeof *s);
  if (!s) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
    return NULL;
  }
  s->f = nb_fn_retain(f);
  s->m = nb_mesh_retain(m);
  s->n_in = f->n_in, s->n_out = f->n_out;
  s->in_spec = calloc((size_t)f->n_in + 1, sizeof *s->in_spec);
  s->out_spec = calloc((size_t)f->n_out + 1, sizeof *s->out_spec);
  bool ok = s->in_spec && s->out_spec;
  for (int k = 0; ok && k < f->n_in; k++)
    ok = (s->in_spec[k] = strdup(in_specs[k])) != NULL;
  for (int j = 0; ok && j < f->n_out; j++)
    ok = (s->out_spec[j] = strdup(out_specs[j])) != NULL;
  if (!ok) {
    smap_fn_destroy(s);
    nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
    return NULL;
  }
  return smap_make(s);
}

/* ---- the op ------------------------------------------------------------------------ */
static const nbi_smap_payload *payload_of(const nb_tensor *p) {
  return (const nbi_smap_payload *)p->payload;
}

static nb_status smap_exec(const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)in; /* the nested realization shares the inputs' storage itself */
  const nbi_smap_payload *q = payload_of(n);
  int n_in = q->prog->n_in, n_out = q->m.n_out;
  nb_tensor **t = calloc((size_t)(n_in + 2 * n_out) + 1, sizeof *t), **res = t + n_in,
            **g = res + n_out;
  if (!t) return nbi_error(NB_ERR_OOM, "nb_eval: out of memory");
  nb_status st = NB_OK;
  nb_scope_begin();
  for (int k = 0; k < n_in && !st; k++)
    if (!(t[k] = nbi_leaf_share(n->in[k]))) st = nb_last_status();
  if (!st) st = smap_run(q, t, res);
  for (int j = 0; j < n_out && !st; j++)
    if (!(g[j] = nbi_readable(FN, res[j]))) st = nb_last_status();
  if (!st) st = nbi_realize(g, n_out);
  for (int j = 0; j < n_out && !st; j++) {
    nbi_view dst = nbi_multi_out_view(n, out, j), src = nbi_tensor_view(g[j]);
    st = nbi_copy_between(n->device, &dst, g[j]->device, &src);
  }
  nb_scope_end();
  free(t);
  return st;
}

/* Applied to values that are not traced (jit's replay, a call on sharded
 * values) it runs at once, like a direct call: its outputs are on the mesh.
 * Traced values, or plain values inside a kernel (a body program run by
 * checkpoint or control flow, which must give plain values), record its
 * node; the kernel runs it and gathers the outputs. */
static nb_status smap_apply(const nbi_prog_node *pn, nb_tensor *const *in, nb_tensor **out) {
  nbi_smap_payload *q = (nbi_smap_payload *)pn->payload;
  bool sharded = false;
  for (int k = 0; k < pn->n_in; k++)
    sharded |= in[k]->mesh != NULL;
  if (!any_traced(in, pn->n_in) && (sharded || nbi_realize_depth() == 0))
    return smap_run(q, in, out);
  return nbi_record_multi(NBI_OP_SHARD_MAP, in, pn->n_in, &q->m, NULL, out);
}

/* ---- rules ------------------------------------------------------------------------- */
/* s without partial axes. */
static nbi_sharding whole(const nbi_sharding *s) {
  nbi_sharding r = *s;
  r.n_partial = 0;
  return r;
}

/* s plus partial over every mesh axis it does not use. */
static nbi_sharding partial_rest(const nb_mesh *m, const nbi_sharding *s) {
  nbi_sharding r = whole(s);
  uint32_t used = nbi_sharding_axes(&r, false);
  for (int a = 0; a < m->n_axes; a++)
    if (!(used >> a & 1u) && m->size[a] > 1) r.partial[r.n_partial++] = nbi_axis_whole(m, a);
  return r;
}

/* A shard_map of g (reference taken) on q's mesh with those layouts (copied)
 * and input scales (copied; NULL: none), called on a[0..g->n_in-1]. */
static nb_status call_rule(const nbi_smap_payload *q, nb_fn *g, const nbi_sharding *in_s,
                           const nbi_sharding *out_s, const double *scale, nb_tensor *const *a,
                           nb_tensor **res) {
  if (!g) return nb_last_status();
  smap_fn *s = calloc(1, sizeof *s);
  int n_in = g->n_in, n_out = g->n_out;
  if (s) {
    s->in_s = malloc(sizeof *s->in_s * (size_t)(n_in + 1));
    s->out_s = malloc(sizeof *s->out_s * (size_t)(n_out + 1));
    s->ct_scale = scale ? malloc(sizeof *s->ct_scale * (size_t)(n_in + 1)) : NULL;
  }
  if (!s || !s->in_s || !s->out_s || (scale && !s->ct_scale)) {
    if (s) free(s->in_s), free(s->out_s), free(s->ct_scale);
    free(s);
    nb_fn_release(g);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  }
  s->f = g;
  s->m = nb_mesh_retain(q->mesh);
  s->n_in = n_in, s->n_out = n_out;
  memcpy(s->in_s, in_s, sizeof *in_s * (size_t)n_in);
  memcpy(s->out_s, out_s, sizeof *out_s * (size_t)n_out);
  if (scale) memcpy(s->ct_scale, scale, sizeof *scale * (size_t)n_in);
  nb_fn *h = smap_make(s);
  if (!h) return nb_last_status();
  nb_status st = nb_call(h, a, res);
  nb_fn_release(h);
  return st;
}

static nb_tensor *zeros_of_output(const nb_tensor *p, int j) {
  const nbi_multi *m = nbi_multi_of(p);
  return nbi_zeros_of(&m->shape[j], m->dtype[j]);
}

/* VJP: shard_map(select(vjp(body))) on (operands, cotangents); see the top. */
static nb_status smap_vjp(nb_tensor *p, nb_tensor *const *gys, const bool *need, nb_tensor **gin) {
  const nbi_smap_payload *q = payload_of(p);
  const nb_mesh *m = q->mesh;
  int n_in = p->n_in, n_out = q->m.n_out, n = 0, nt = n_in + n_out;
  nb_tensor **a = calloc((size_t)(nt + n_in) + 1, sizeof *a), **res = a + nt;
  int *idx = malloc(sizeof *idx * (size_t)(n_in + 1));
  nbi_sharding *in_s = malloc(sizeof *in_s * (size_t)(nt + 1)),
               *out_s = malloc(sizeof *out_s * (size_t)(n_in + 1));
  double *scale = malloc(sizeof *scale * (size_t)(nt + 1));
  nb_status st =
      a && idx && in_s && out_s && scale ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int k = 0; k < n_in && !st; k++) {
    a[k] = p->in[k];
    in_s[k] = q->in_s[k];
    scale[k] = 1;
    if (need[k]) out_s[n] = partial_rest(m, &q->in_s[k]), idx[n++] = n_out + k;
  }
  for (int j = 0; j < n_out && !st && n; j++) {
    if (!(a[n_in + j] = gys[j] ? gys[j] : zeros_of_output(p, j))) st = nb_last_status();
    in_s[n_in + j] = whole(&q->out_s[j]);
    int64_t rest = 1; /* the axes output j is invariant over */
    uint32_t named = nbi_sharding_axes(&q->out_s[j], true);
    for (int ax = 0; ax < m->n_axes; ax++)
      if (!(named >> ax & 1u)) rest *= m->size[ax];
    scale[n_in + j] = 1.0 / (double)rest;
  }
  if (!st && n) {
    st = call_rule(q, nbi_program_xform(FN, q->prog, NBI_XF_VJP, NULL, idx, n), in_s, out_s, scale,
                   a, res);
  }
  for (int k = 0, i = 0; k < n_in && !st; k++)
    if (need[k]) gin[k] = res[i++];
  free(a);
  free(idx);
  free(in_s);
  free(out_s);
  free(scale);
  return st;
}

/* JVP: shard_map(select(jvp(body))) on (operands, tangents). */
static nb_status smap_jvp(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts) {
  const nbi_smap_payload *q = payload_of(p);
  int n_in = p->n_in, n_out = q->m.n_out, n = 0;
  nb_tensor **a = calloc((size_t)(2 * n_in + n_out) + 1, sizeof *a), **res = a + 2 * n_in;
  int *idx = malloc(sizeof *idx * (size_t)(n_out + 1));
  nbi_sharding *in_s = malloc(sizeof *in_s * (size_t)(2 * n_in + 1)),
               *out_s = malloc(sizeof *out_s * (size_t)(n_out + 1));
  nb_status st = a && idx && in_s && out_s ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int k = 0; k < n_in && !st; k++) {
    a[k] = p->in[k];
    in_s[k] = in_s[n_in + k] = q->in_s[k];
    if (!(a[n_in + k] = tin[k] ? tin[k] : nbi_zeros_like(p->in[k]))) st = nb_last_status();
  }
  for (int j = 0; j < n_out && !st; j++)
    if (nb_dtype_is_float(q->m.dtype[j])) out_s[n] = q->out_s[j], idx[n++] = n_out + j;
  if (!st && n) {
    st = call_rule(q, nbi_program_xform(FN, q->prog, NBI_XF_JVP, NULL, idx, n), in_s, out_s, NULL,
                   a, res);
  }
  for (int j = 0, i = 0; j < n_out && !st; j++)
    touts[j] = nb_dtype_is_float(q->m.dtype[j]) ? res[i++] : NULL;
  free(a);
  free(idx);
  free(in_s);
  free(out_s);
  return st;
}

/* Batching: shard_map(vmap(body)), the batch dim (0) unsharded. */
static nb_status smap_vmap(nb_tensor *p, nb_tensor *const *bin, const bool *batched_in, int64_t B,
                           nb_tensor **outs) {
  (void)B;
  const nbi_smap_payload *q = payload_of(p);
  int n_in = p->n_in, n_out = q->m.n_out;
  int *axes = malloc(sizeof *axes * (size_t)(n_in + 1));
  nbi_sharding *in_s = malloc(sizeof *in_s * (size_t)(n_in + 1)),
               *out_s = malloc(sizeof *out_s * (size_t)(n_out + 1));
  nb_status st = axes && in_s && out_s ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", FN);
  for (int k = 0; k < n_in && !st; k++) {
    axes[k] = batched_in[k] ? 0 : NB_NOT_MAPPED;
    in_s[k] = batched_in[k] ? nbi_sharding_batched(&q->in_s[k]) : q->in_s[k];
  }
  for (int j = 0; j < n_out && !st; j++)
    out_s[j] = nbi_sharding_batched(&q->out_s[j]);
  if (!st) {
    st = call_rule(q, nbi_program_xform(FN, q->prog, NBI_XF_VMAP, axes, NULL, 0), in_s, out_s, NULL,
                   bin, outs);
  }
  free(axes);
  free(in_s);
  free(out_s);
  return st;
}

static int smap_programs(const nbi_payload *p, const nbi_program **out) {
  out[0] = ((const nbi_smap_payload *)p)->prog;
  return 1;
}

const nbi_op_def nbi_opdef_SHARD_MAP = {.name = "shard_map",
                                        .arity = -1,
                                        .exec = smap_exec,
                                        .flags = NBI_OPF_MULTI,
                                        .vjp_multi = smap_vjp,
                                        .jvp_multi = smap_jvp,
                                        .vmap_multi = smap_vmap,
                                        .apply = smap_apply,
                                        .programs = smap_programs};
