/* src/autoshard/plan.c — the public API of automatic sharding
 * (include/nabla/sharding.h): nb_auto_shard_plan (options defaulted, graph
 * built, solved), the plan's specs and prediction, nb_shard_plan_call (the
 * plan realized op by op) and nb_auto_shard_report.
 *
 * The prediction walks the plan as nb_shard_plan_call runs it: each value is
 * resharded once per distinct layout its readers need (the call caches the
 * moved tensors the same way), so the predicted collectives and bytes are the
 * ones nb_stats counts during the call. */
#include "autoshard.h"
#include "../core/oprules.h"
#include "../core/program.h"
#include "../transforms/tree.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct nb_shard_plan {
  int32_t refcount;
  as_graph g;
  char **in_spec, **out_spec; /* [n_fin], [n_out] */
  nb_shard_prediction pred;
  int mismatched;        /* ops the last call realized otherwise than planned */
  nbi_tree_flatfn *tree; /* nb_auto_shard_plan_trees: f's flat form and arrangements */
  int tree_n_out;        /* f's output trees */
};

static int vref(const as_graph *g, int32_t r) { return r >= 0 ? g->prog->n_in + r : -1 - r; }
static as_layout lay(const as_graph *g, int x) { return g->v[x].s[g->choice[x]].out; }

/* The layout output j is delivered in. */
static as_layout out_layout(const as_graph *g, int j) {
  if (g->tie && g->tie[j] >= 0) return as_unpartial(lay(g, g->tie[j]));
  return as_unpartial(lay(g, vref(g, g->prog->out[j])));
}

static as_layout target_of(const as_graph *g, int x, int k) {
  const as_var *v = &g->v[x];
  return v->tgt[(size_t)g->choice[x] * (size_t)v->n_in + (size_t)k];
}

/* ---- the prediction ------------------------------------------------------------------ */
typedef struct moved {
  int var;
  as_layout l;
  nb_tensor *t;
} moved;

typedef struct movelist {
  moved *m;
  int n, cap;
} movelist;

static int ml_find(const movelist *ml, int var, as_layout l) {
  for (int i = 0; i < ml->n; i++)
    if (ml->m[i].var == var && as_layout_eq(ml->m[i].l, l)) return i;
  return -1;
}

static bool ml_add(movelist *ml, int var, as_layout l, nb_tensor *t) {
  if (ml->n == ml->cap) {
    int cap = ml->cap ? 2 * ml->cap : 32;
    moved *nm = realloc(ml->m, sizeof *nm * (size_t)cap);
    if (!nm) return false;
    ml->m = nm, ml->cap = cap;
  }
  ml->m[ml->n++] = (moved){var, l, t};
  return true;
}

/* Value x moved to l (plain values are cut: free), once per layout. */
static void predict_move(const as_graph *g, movelist *ml, int x, as_layout l, as_coll *acc,
                         as_coll *per_op) {
  const as_var *v = &g->v[x];
  if (v->plain || as_layout_eq(lay(g, x), l) || ml_find(ml, x, l) >= 0) return;
  as_layout cur = lay(g, x), from = as_from(v, cur);
  if (!as_layout_eq(from, cur) && !as_layout_eq(from, l)) { /* reduced once first (move) */
    predict_move(g, ml, x, from, acc, per_op);
    cur = from;
  }
  as_coll one = {0};
  as_reshard(g, &v->shape, v->elt, cur, l, &one);
  for (int k = 0; k < 5; k++)
    acc->n[k] += one.n[k], per_op->n[k] += one.n[k];
  acc->bytes += one.bytes, per_op->bytes += one.bytes;
  acc->time += one.time, per_op->time += one.time;
  ml_add(ml, x, l, NULL);
}

/* The collectives of the whole call, and per node (ops, NULL: not wanted;
 * [n_nodes + 1], the last entry the outputs'). */
static as_coll predict(const as_graph *g, as_coll *ops) {
  const nbi_program *p = g->prog;
  as_coll acc = {0}, scratch;
  movelist ml = {0};
  for (int i = 0; i < p->n_nodes; i++) {
    int x = p->n_in + i;
    const as_var *v = &g->v[x];
    as_coll *po = ops ? &ops[i] : &scratch;
    if (v->plain) continue;
    for (int k = 0; k < v->n_in; k++)
      predict_move(g, &ml, v->in_var[k], target_of(g, x, k), &acc, po);
  }
  for (int j = 0; j < p->n_out; j++)
    predict_move(g, &ml, vref(g, p->out[j]), out_layout(g, j), &acc,
                 ops ? &ops[p->n_nodes] : &scratch);
  free(ml.m);
  return acc;
}

bool nb_auto_shard_ilp_available(void) { return as_ilp_available(); }

/* ---- making a plan --------------------------------------------------------------------- */
static char *spec_text(const as_graph *g, as_layout l, int ndim) {
  nbi_sharding s = as_to_sharding(g, l, ndim);
  size_t n = nbi_sharding_format(g->m, &s, NULL, 0);
  char *t = malloc(n + 1);
  if (t) nbi_sharding_format(g->m, &s, t, n + 1);
  return t;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void nb_shard_plan_release(nb_shard_plan *p) {
  if (!p || --p->refcount > 0) return;
  for (int k = 0; p->in_spec && k < p->g.n_fin; k++)
    free(p->in_spec[k]);
  for (int j = 0; p->out_spec && p->g.prog && j < p->g.prog->n_out; j++)
    free(p->out_spec[j]);
  free(p->in_spec);
  free(p->out_spec);
  nbi_tree_flat_free(p->tree);
  as_free(&p->g);
  free(p);
}

nb_shard_plan *nb_auto_shard_plan(nb_fn *f, nb_mesh *m, nb_tensor *const *example_in,
                                  const nb_auto_shard_opts *opts) {
  const char *fn = "nb_auto_shard";
  if (!f || !m || (f->n_in > 0 && !example_in)) {
    nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, !f ? "f" : !m ? "the mesh" : "example_in");
    return NULL;
  }
  if (f->takes_trees) {
    nbi_error(NB_ERR_ARG, "%s: f takes trees; use nb_auto_shard_plan_trees", fn);
    return NULL;
  }
  for (int k = 0; k < f->n_in; k++)
    if (!example_in[k]) {
      nbi_error(NB_ERR_NULL, "%s: example input %d is NULL", fn, k);
      return NULL;
    }
  nb_auto_shard_opts o = opts ? *opts : (nb_auto_shard_opts){0};
  if (o.solver < NB_AUTO_SHARD_AUTO || o.solver > NB_AUTO_SHARD_ILP) {
    nbi_error(NB_ERR_ARG, "%s: solver %d (NB_AUTO_SHARD_AUTO, _DP, _LOCAL or _ILP)", fn, o.solver);
    return NULL;
  }
  if (!(o.flops_per_s > 0)) o.flops_per_s = 1e11;
  for (int a = 0; a < AS_MAXA; a++) {
    if (!(o.alpha_s[a] > 0)) o.alpha_s[a] = 1e-5;
    if (!(o.beta_s_per_byte[a] > 0)) o.beta_s_per_byte[a] = 1e-10;
  }
  if (!(o.max_bytes_per_device > 0)) {
    const char *env = getenv("NABLA_AUTOSHARD_MAX_BYTES");
    o.max_bytes_per_device = env ? strtod(env, NULL) : 0;
  }
  nb_shard_plan *p = calloc(1, sizeof *p);
  if (!p) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  p->refcount = 1;
  p->g.fn = fn;
  double t0 = now_s();
  nb_status st = as_build(&p->g, f, m, example_in, &o);
  if (!st) st = as_solve(&p->g, o.solver);
  double t1 = now_s();
  as_graph *g = &p->g;
  if (!st) {
    p->in_spec = calloc((size_t)g->n_fin + 1, sizeof *p->in_spec);
    p->out_spec = calloc((size_t)g->prog->n_out + 1, sizeof *p->out_spec);
    if (!p->in_spec || !p->out_spec) st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  }
  for (int k = 0; k < g->n_fin && !st; k++)
    if (!(p->in_spec[k] = spec_text(g, lay(g, k), g->v[k].shape.ndim)))
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int j = 0; !st && j < g->prog->n_out; j++)
    if (!(p->out_spec[j] = spec_text(g, out_layout(g, j), g->prog->out_shape[j].ndim)))
      st = nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  if (st) {
    nb_shard_plan_release(p);
    return NULL;
  }
  as_coll c = predict(g, NULL);
  nb_shard_prediction *pr = &p->pred;
  pr->n_all_reduce = c.n[0], pr->n_all_gather = c.n[1], pr->n_reduce_scatter = c.n[2];
  pr->n_all_to_all = c.n[3], pr->n_permute = c.n[4];
  pr->collective_bytes = c.bytes;
  pr->comm_s = c.time;
  for (int i = 0; i < g->n_v; i++)
    pr->compute_s += g->v[i].s[g->choice[i]].compute;
  pr->cost_s = as_total(g, g->choice);
  pr->bytes_per_device = as_peak_bytes(g, g->choice);
  pr->solver = g->solver;
  pr->solve_s = t1 - t0;
  pr->n_values = g->n_v;
  pr->n_choices = g->n_choices;
  return p;
}

const char *nb_shard_plan_in_spec(const nb_shard_plan *p, int k) {
  return p && k >= 0 && k < p->g.n_fin ? p->in_spec[k] : NULL;
}
const char *nb_shard_plan_out_spec(const nb_shard_plan *p, int j) {
  return p && j >= 0 && j < p->g.prog->n_out ? p->out_spec[j] : NULL;
}
nb_shard_prediction nb_shard_plan_predict(const nb_shard_plan *p) {
  return p ? p->pred : (nb_shard_prediction){0};
}

nb_status nb_auto_shard(nb_fn *f, nb_mesh *m, nb_tensor *const *example_in, char **in_specs_out,
                        char **out_specs_out) {
  if (!f || !in_specs_out || !out_specs_out)
    return nbi_error(NB_ERR_NULL, "nb_auto_shard: %s is NULL",
                     !f              ? "f"
                     : !in_specs_out ? "in_specs_out"
                                     : "out_specs_out");
  nb_auto_shard_opts o = {.in_specs = (const char *const *)in_specs_out};
  nb_shard_plan *p = nb_auto_shard_plan(f, m, example_in, &o);
  if (!p) return nb_last_status();
  int n_in = f->n_in, n_out = f->n_out;
  char **ins = calloc((size_t)n_in + 1, sizeof *ins),
       **outs = calloc((size_t)n_out + 1, sizeof *outs);
  bool ok = ins && outs;
  for (int k = 0; k < n_in && ok; k++)
    if (!in_specs_out[k]) ok = (ins[k] = strdup(p->in_spec[k])) != NULL;
  for (int j = 0; j < n_out && ok; j++)
    ok = (outs[j] = strdup(p->out_spec[j])) != NULL;
  if (ok) {
    for (int k = 0; k < n_in; k++)
      if (!in_specs_out[k]) in_specs_out[k] = ins[k];
    for (int j = 0; j < n_out; j++)
      out_specs_out[j] = outs[j];
  } else {
    for (int k = 0; ins && k < n_in; k++)
      free(ins[k]);
    for (int j = 0; outs && j < n_out; j++)
      free(outs[j]);
  }
  free(ins);
  free(outs);
  nb_shard_plan_release(p);
  return ok ? NB_OK : nbi_error(NB_ERR_OOM, "nb_auto_shard: out of memory");
}

/* ---- functions of trees --------------------------------------------------------------- */
nb_shard_plan *nb_auto_shard_plan_trees(nb_fn *f, nb_mesh *m, nb_tree *const *example_in,
                                        const nb_auto_shard_opts *opts) {
  const char *fn = "nb_auto_shard_plan_trees";
  if (!f || !m || (f->n_in > 0 && !example_in)) {
    nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, !f ? "f" : !m ? "the mesh" : "example_in");
    return NULL;
  }
  if (!f->takes_trees) {
    nbi_error(NB_ERR_ARG, "%s: f takes tensors; use nb_auto_shard_plan", fn);
    return NULL;
  }
  nbi_tree_flatfn *t = nbi_tree_flatten_fn(fn, f, example_in);
  if (!t) return NULL;
  int n = 0;
  for (int k = 0; k < f->n_in; k++)
    n += nb_tree_len(example_in[k]);
  nb_tensor **xs = calloc((size_t)n + 1, sizeof *xs);
  nb_shard_plan *p = NULL;
  if (!xs)
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  else if (!nbi_tree_flat_inputs(fn, t, example_in, xs))
    p = nb_auto_shard_plan(nbi_tree_flat_fn(t), m, xs, opts);
  free(xs);
  if (p)
    p->tree = t, p->tree_n_out = f->n_out;
  else
    nbi_tree_flat_free(t);
  return p;
}

static const char *leaf_spec(const nb_shard_plan *p, bool out, int tree, const char *name) {
  int i = p && p->tree ? nbi_tree_flat_leaf(p->tree, out, tree, name) : -1;
  return i < 0 ? NULL : out ? p->out_spec[i] : p->in_spec[i];
}
const char *nb_shard_plan_in_leaf_spec(const nb_shard_plan *p, int tree, const char *name) {
  return leaf_spec(p, false, tree, name);
}
const char *nb_shard_plan_out_leaf_spec(const nb_shard_plan *p, int tree, const char *name) {
  return leaf_spec(p, true, tree, name);
}

nb_status nb_shard_plan_call_trees(nb_shard_plan *p, nb_tree *const *in, nb_tree **out) {
  const char *fn = "nb_shard_plan_call_trees";
  if (!p || !out) return nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, !p ? "the plan" : "out");
  if (!p->tree) return nbi_error(NB_ERR_ARG, "%s: the plan is not of a function of trees", fn);
  nb_fn *flat = nbi_tree_flat_fn(p->tree);
  for (int j = 0; j < p->tree_n_out; j++)
    out[j] = NULL;
  nb_tensor **xs = calloc((size_t)flat->n_in + 1, sizeof *xs),
            **ys = calloc((size_t)flat->n_out + 1, sizeof *ys);
  nb_status st = xs && ys ? NB_OK : nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  if (!st) st = nbi_tree_flat_inputs(fn, p->tree, in, xs);
  if (!st) st = nb_shard_plan_call(p, xs, ys);
  if (!st) st = nbi_tree_flat_outputs(fn, p->tree, ys, out);
  free(xs);
  free(ys);
  return st;
}

/* ---- running a plan ------------------------------------------------------------------- */
typedef struct runner {
  nb_shard_plan *p;
  movelist ml;
  nb_tensor **args;
} runner;

/* Value x (tensor t) in layout l: t itself when it has it, else moved once. */
static nb_tensor *move(runner *r, int x, nb_tensor *t, as_layout l) {
  const as_graph *g = &r->p->g;
  nbi_sharding s = as_to_sharding(g, l, t->shape.ndim);
  if (t->mesh == g->m && nbi_sharding_eq(nbi_sharding_of(t), &s)) return t;
  int i = ml_find(&r->ml, x, l);
  if (i >= 0) return r->ml.m[i].t;
  /* a shared value's pending sums are reduced once, then it moves from there */
  as_layout cur = lay(g, x), from = as_from(&g->v[x], cur);
  if (!as_layout_eq(from, cur) && !as_layout_eq(from, l) && !(t = move(r, x, t, from))) return NULL;
  nb_tensor *u = nbi_shard_to(g->fn, t, g->m, &s);
  if (u && !ml_add(&r->ml, x, l, u)) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
    return NULL;
  }
  return u;
}

static nb_status run_node(runner *r, nbi_apply *a, int i) {
  as_graph *g = &r->p->g;
  const nbi_prog_node *pn = &g->prog->nodes[i];
  int x = g->prog->n_in + i;
  const as_var *v = &g->v[x];
  if (v->plain) return nbi_apply_node(a, i);
  nb_tensor *local[8], **ins = pn->n_in <= 8 ? local : malloc(sizeof *ins * (size_t)pn->n_in);
  if (!ins) return nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
  nb_status st = NB_OK;
  for (int k = 0; k < pn->n_in && !st; k++) {
    nb_tensor *t = nbi_apply_ref(a, pn->in[k]);
    ins[k] = k < v->n_in ? move(r, v->in_var[k], t, target_of(g, x, k)) : t;
    if (!ins[k]) st = nb_last_status();
  }
  if (!st && v->opaque) { /* its apply rule or record sees the moved operands */
    nb_tensor **saved = malloc(sizeof *saved * (size_t)(pn->n_in + 1));
    if (!saved) st = nbi_error(NB_ERR_OOM, "%s: out of memory", g->fn);
    for (int k = 0; k < pn->n_in && !st; k++) {
      int32_t ref = pn->in[k];
      nb_tensor **slot = ref >= 0 ? &a->t[ref] : &r->args[-1 - ref];
      saved[k] = *slot;
      *slot = ins[k];
    }
    if (!st) st = nbi_apply_node(a, i);
    for (int k = pn->n_in - 1; k >= 0 && saved; k--) {
      int32_t ref = pn->in[k];
      *(ref >= 0 ? &a->t[ref] : &r->args[-1 - ref]) = saved[k];
    }
    free(saved);
  } else if (!st) {
    as_layout l = v->s[g->choice[x]].out;
    nbi_sharding want = as_to_sharding(g, l, pn->shape.ndim);
    nbi_shard_record_out = &want;
    nb_tensor *t = nbi_record(pn->op, pn->dtype, &pn->shape, ins, pn->n_in, &pn->attrs);
    nbi_shard_record_out = NULL;
    if (!t) {
      st = nb_last_status();
    } else {
      nbi_set_payload(t, pn->payload);
      if (!t->mesh || !nbi_sharding_eq(nbi_sharding_of(t), &want)) {
        r->p->mismatched++;
        t = nbi_shard_to(g->fn, t, g->m, &want);
        if (!t) st = nb_last_status();
      }
      a->t[i] = t;
    }
  }
  if (ins != local) free(ins);
  return st;
}

nb_status nb_shard_plan_call(nb_shard_plan *p, nb_tensor *const *in, nb_tensor **out) {
  if (!p || !out || (p->g.n_fin > 0 && !in))
    return nbi_error(NB_ERR_NULL, "nb_shard_plan_call: %s is NULL",
                     !p     ? "the plan"
                     : !out ? "out"
                            : "in");
  as_graph *g = &p->g;
  const nbi_program *prog = g->prog;
  for (int j = 0; j < prog->n_out; j++)
    out[j] = NULL;
  for (int k = 0; k < g->n_fin; k++)
    if (!in[k]) return nbi_error(NB_ERR_NULL, "nb_shard_plan_call: input %d is NULL", k);
  runner r = {.p = p};
  if (!(r.args = calloc((size_t)prog->n_in + 1, sizeof *r.args)))
    return nbi_error(NB_ERR_OOM, "nb_shard_plan_call: out of memory");
  p->mismatched = 0;
  nb_status st = NB_OK;
  nb_scope_begin();
  for (int k = 0; k < prog->n_in && !st; k++) {
    if (k >= g->n_fin) {
      r.args[k] = g->capt[k - g->n_fin];
      continue;
    }
    if (in[k]->mesh && in[k]->mesh != g->m)
      st =
          nbi_error(NB_ERR_SHARDING, "nb_shard_plan_call: input %d is on mesh %s, the plan's is %s",
                    k, nb_mesh_str(in[k]->mesh), nb_mesh_str(g->m));
    else if (!(r.args[k] = move(&r, k, in[k], lay(g, k))))
      st = nb_last_status();
  }
  nbi_apply a;
  bool begun = false;
  if (!st) st = nbi_apply_begin(&a, "nb_shard_plan_call", prog, r.args);
  begun = !st;
  for (int i = 0; i < prog->n_nodes && !st; i++)
    st = run_node(&r, &a, i);
  for (int j = 0; j < prog->n_out && !st; j++) {
    int32_t ref = prog->out[j];
    nb_tensor *t = move(&r, vref(g, ref), nbi_apply_ref(&a, ref), out_layout(g, j));
    if (t && ref < 0) t = nbi_identity(t); /* a new tensor, as nbi_apply_all gives */
    if (!(out[j] = t)) st = nb_last_status();
  }
  for (int j = 0; j < prog->n_out && !st; j++)
    if (!nb_keep(out[j])) st = nb_last_status();
  nb_scope_end();
  if (begun) nbi_apply_end(&a);
  if (st)
    for (int j = 0; j < prog->n_out; j++)
      out[j] = NULL;
  free(r.ml.m);
  free(r.args);
  return st;
}

/* ---- the report ------------------------------------------------------------------------- */
static void print_counts(FILE *f, const char *what, const uint64_t *n, uint64_t bytes) {
  fprintf(f,
          "  %-10s all-reduce %llu, all-gather %llu, reduce-scatter %llu, all-to-all %llu, "
          "permute %llu; %llu bytes sent\n",
          what, (unsigned long long)n[0], (unsigned long long)n[1], (unsigned long long)n[2],
          (unsigned long long)n[3], (unsigned long long)n[4], (unsigned long long)bytes);
}

nb_status nb_auto_shard_report(FILE *f, const nb_shard_plan *p, const nb_stats *measured) {

  if (!f || !p)
    return nbi_error(NB_ERR_NULL, "nb_auto_shard_report: %s is NULL", !f ? "out" : "the plan");
  const as_graph *g = &p->g;
  const nbi_program *prog = g->prog;
  const nb_shard_prediction *pr = &p->pred;
  char sh[160];
  fprintf(f, "auto-shard plan on mesh %s: %d ops, solver %s, solved in %.3f ms\n",
          nb_mesh_str(g->m), prog->n_nodes,
          pr->solver == NB_AUTO_SHARD_DP    ? "exact DP (tree)"
          : pr->solver == NB_AUTO_SHARD_ILP ? "ILP (CBC)"
                                            : "local search",
          pr->solve_s * 1e3);
  if (pr->n_choices < pr->n_values)
    fprintf(f, "  repeated layers share choices: %d values, %d choices solved for\n", pr->n_values,
            pr->n_choices);
  for (int k = 0; k < g->n_fin; k++)
    fprintf(f, "  input  %2d %-8s %-18s %s\n", k, nb_dtype_name(prog->in_dtype[k]),
            nb_shape_str(prog->in_shape[k], sh, sizeof sh), p->in_spec[k]);
  for (int j = 0; j < prog->n_out; j++)
    fprintf(f, "  output %2d %-8s %-18s %s\n", j, nb_dtype_name(prog->out_dtype[j]),
            nb_shape_str(prog->out_shape[j], sh, sizeof sh), p->out_spec[j]);
  as_coll *ops = calloc((size_t)prog->n_nodes + 1, sizeof *ops);
  if (!ops) return nbi_error(NB_ERR_OOM, "nb_auto_shard_report: out of memory");
  predict(g, ops);
  fprintf(f, "  collectives before ops (node: op, result layout):\n");
  int shown = 0;
  for (int i = 0; i <= prog->n_nodes; i++) {
    const as_coll *c = &ops[i];
    if (!(c->n[0] + c->n[1] + c->n[2] + c->n[3] + c->n[4])) continue;
    if (shown++ >= 40) continue;
    char lbuf[160] = "outputs";
    if (i < prog->n_nodes) {
      char *t = spec_text(g, lay(g, prog->n_in + i), prog->nodes[i].shape.ndim);
      snprintf(lbuf, sizeof lbuf, "%4d: %s %s", i, nbi_op_table[prog->nodes[i].op]->name,
               t ? t : "?");
      free(t);
    }
    fprintf(f, "    %-40s AR %llu AG %llu RS %llu A2A %llu PERM %llu, %llu bytes\n", lbuf,
            (unsigned long long)c->n[0], (unsigned long long)c->n[1], (unsigned long long)c->n[2],
            (unsigned long long)c->n[3], (unsigned long long)c->n[4], (unsigned long long)c->bytes);
  }
  if (shown > 40) fprintf(f, "    ... %d more\n", shown - 40);
  free(ops);
  uint64_t pn[5] = {pr->n_all_reduce, pr->n_all_gather, pr->n_reduce_scatter, pr->n_all_to_all,
                    pr->n_permute};
  print_counts(f, "predicted", pn, pr->collective_bytes);
  if (measured) {
    uint64_t mn[5] = {measured->n_all_reduce, measured->n_all_gather, measured->n_reduce_scatter,
                      measured->n_all_to_all, measured->n_permute};
    print_counts(f, "measured", mn, measured->collective_bytes);
  }
  fprintf(f,
          "  model: %.3g s per step (compute %.3g s, collectives %.3g s); memory per device "
          "%.0f bytes\n",
          pr->cost_s, pr->compute_s, pr->comm_s, pr->bytes_per_device);
  if (p->mismatched)
    fprintf(f, "  note: the last call realized %d op(s) in another layout (then moved)\n",
            p->mismatched);
  return ferror(f) ? nbi_error(NB_ERR_ARG, "nb_auto_shard_report: the stream could not be written")
                   : NB_OK;
}
