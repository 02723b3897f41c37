/* src/train/optim.c — optimizers (nabla/optim.h): SGD, Adam, AdamW, Lion,
 * clipping by global norm, decayed weights, chains; init, update, apply.
 *
 * An update runs on groups: the floating-point parameters of one dtype,
 * device and decay mask (a sharded one alone), in tree order. Each group's
 * gradients are concatenated into one 1-D tensor (the tree's pack when the
 * gradients already are one), the parts transform that flat update in
 * order, and the result is handed out as a tree of slices of it, recorded
 * as a pack (src/transforms/tree.h). nb_apply_updates then adds each
 * group's flat update to the group's flat parameters (their pack after the
 * first step: nb_apply_updates rebinds them into the sum's buffer) in one
 * elementwise pass, and rebinds every parameter with nbi_assign_rebind_n:
 * one realization, whose roots are ordered so that the scalars (step count,
 * bias corrections, scheduled learning rate, clipping factor) are computed
 * before the group's elementwise steps, which then form one fused kernel.
 *
 * Arithmetic follows torch.optim's single-tensor CPU code (lerp for Adam's
 * first moment, addcmul / addcdiv orders); step-dependent scalars are f64
 * ops on the state's "count", cast to the group's dtype.
 */
#include "train.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../ops/rule_util.h"

enum okind { O_SGD, O_ADAM, O_LION, O_CLIP, O_DECAY, O_CHAIN };
enum { MAX_PARTS = 32 };

struct nb_optim {
  int32_t refcount;
  enum okind kind;
  double lr, b1, b2, eps, wd, momentum, max_norm;
  bool nesterov, decoupled; /* decoupled: AdamW */
  nb_schedule *sched;
  nb_decay_mask_fn mask;
  void *mask_user;
  int n_parts; /* O_CHAIN: the parts, flattened (a chain of chains is one chain) */
  nb_optim *parts[MAX_PARTS];
};

static bool has_lr(const nb_optim *o) {
  return o->kind == O_SGD || o->kind == O_ADAM || o->kind == O_LION;
}
static bool has_decay(const nb_optim *o) {
  return (o->kind == O_ADAM && o->decoupled) || o->kind == O_LION || o->kind == O_DECAY;
}
static bool decays(const nb_optim *o) { return has_decay(o) && o->wd != 0; }

/* ---- constructors ----------------------------------------------------------------------- */
static nb_optim *make(const char *fn, nb_optim v) {
  nb_optim *o = calloc(1, sizeof *o);
  if (!o) {
    nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
    return NULL;
  }
  *o = v;
  o->refcount = 1;
  return o;
}

/* NB_ERR_ARG naming fn when x is not finite or not in [lo, hi) (hi_closed: [lo, hi]). */
static bool check_range(const char *fn, const char *what, double x, double lo, double hi,
                        bool hi_closed) {
  if (isfinite(x) && x >= lo && (x < hi || (hi_closed && x == hi))) return true;
  nbi_error(NB_ERR_ARG, "%s: %s is %g (need %g <= %s %s %g)", fn, what, x, lo, what,
            hi_closed ? "<=" : "<", hi);
  return false;
}

nb_optim *nb_sgd(double lr, double momentum, bool nesterov) {
  const char *fn = "nb_sgd";
  if (!check_range(fn, "lr", lr, 0, INFINITY, false) ||
      !check_range(fn, "momentum", momentum, 0, 1, true))
    return NULL;
  if (nesterov && momentum == 0) {
    nbi_error(NB_ERR_ARG, "%s: nesterov needs momentum > 0", fn);
    return NULL;
  }
  return make(fn, (nb_optim){.kind = O_SGD, .lr = lr, .momentum = momentum, .nesterov = nesterov});
}

static nb_optim *adam(const char *fn, double lr, double b1, double b2, double eps, double wd,
                      bool decoupled) {
  if (!check_range(fn, "lr", lr, 0, INFINITY, false) || !check_range(fn, "b1", b1, 0, 1, false) ||
      !check_range(fn, "b2", b2, 0, 1, false) || !check_range(fn, "eps", eps, 0, INFINITY, false) ||
      !check_range(fn, "weight_decay", wd, 0, INFINITY, false))
    return NULL;
  return make(fn, (nb_optim){.kind = O_ADAM,
                             .lr = lr,
                             .b1 = b1,
                             .b2 = b2,
                             .eps = eps,
                             .wd = wd,
                             .decoupled = decoupled});
}

nb_optim *nb_adam(double lr, double b1, double b2, double eps) {
  return adam("nb_adam", lr, b1, b2, eps, 0, false);
}

nb_optim *nb_adamw(double lr, double b1, double b2, double eps, double weight_decay) {
  return adam("nb_adamw", lr, b1, b2, eps, weight_decay, true);
}

nb_optim *nb_lion(double lr, double b1, double b2, double weight_decay) {
  const char *fn = "nb_lion";
  if (!check_range(fn, "lr", lr, 0, INFINITY, false) || !check_range(fn, "b1", b1, 0, 1, false) ||
      !check_range(fn, "b2", b2, 0, 1, false) ||
      !check_range(fn, "weight_decay", weight_decay, 0, INFINITY, false))
    return NULL;
  return make(fn, (nb_optim){.kind = O_LION, .lr = lr, .b1 = b1, .b2 = b2, .wd = weight_decay});
}

nb_optim *nb_clip_by_global_norm(double max_norm) {
  const char *fn = "nb_clip_by_global_norm";
  if (!check_range(fn, "max_norm", max_norm, 0, INFINITY, false)) return NULL;
  if (max_norm == 0) {
    nbi_error(NB_ERR_ARG, "%s: max_norm is 0 (need > 0)", fn);
    return NULL;
  }
  return make(fn, (nb_optim){.kind = O_CLIP, .max_norm = max_norm});
}

nb_optim *nb_add_decayed_weights(double weight_decay) {
  const char *fn = "nb_add_decayed_weights";
  if (!check_range(fn, "weight_decay", weight_decay, 0, INFINITY, false)) return NULL;
  return make(fn, (nb_optim){.kind = O_DECAY, .wd = weight_decay});
}

nb_optim *nb_optim_chain(nb_optim *const *parts, int n) {
  const char *fn = "nb_optim_chain";
  if (n < 1 || n > MAX_PARTS) {
    nbi_error(NB_ERR_ARG, "%s: n is %d (need 1 to %d parts)", fn, n, MAX_PARTS);
    return NULL;
  }
  if (!parts) {
    nbi_error(NB_ERR_NULL, "%s: parts is NULL", fn);
    return NULL;
  }
  nb_optim c = {.kind = O_CHAIN};
  for (int k = 0; k < n; k++) {
    if (!parts[k]) {
      nbi_error(NB_ERR_NULL, "%s: parts[%d] is NULL", fn, k);
      return NULL;
    }
    int m = parts[k]->kind == O_CHAIN ? parts[k]->n_parts : 1;
    if (c.n_parts + m > MAX_PARTS) {
      nbi_error(NB_ERR_ARG, "%s: more than %d parts once nested chains are flattened", fn,
                MAX_PARTS);
      return NULL;
    }
    for (int j = 0; j < m; j++)
      c.parts[c.n_parts++] = parts[k]->kind == O_CHAIN ? parts[k]->parts[j] : parts[k];
  }
  nb_optim *o = make(fn, c);
  for (int k = 0; o && k < o->n_parts; k++)
    nb_optim_retain(o->parts[k]);
  return o;
}

nb_optim *nb_optim_retain(nb_optim *o) {
  if (o) o->refcount++;
  return o;
}

void nb_optim_release(nb_optim *o) {
  if (!o || --o->refcount > 0) return;
  for (int k = 0; k < o->n_parts; k++)
    nb_optim_release(o->parts[k]);
  nb_schedule_release(o->sched);
  free(o);
}

/* The parts an update runs: a chain's, or o alone. */
static int parts_of(nb_optim *o, nb_optim **out) {
  if (o->kind != O_CHAIN) {
    out[0] = o;
    return 1;
  }
  memcpy(out, o->parts, sizeof *out * (size_t)o->n_parts);
  return o->n_parts;
}

nb_status nb_optim_set_schedule(nb_optim *o, nb_schedule *s) {
  const char *fn = "nb_optim_set_schedule";
  if (!o || !s) return nbi_error(NB_ERR_NULL, "%s: %s is NULL", fn, o ? "s" : "o");
  nb_optim *p[MAX_PARTS];
  int n = parts_of(o, p), hit = 0;
  for (int k = 0; k < n; k++)
    if (has_lr(p[k])) {
      nb_schedule_release(p[k]->sched);
      p[k]->sched = nb_schedule_retain(s);
      hit++;
    }
  return hit ? NB_OK : nbi_error(NB_ERR_ARG, "%s: the optimizer has no learning rate", fn);
}

nb_status nb_optim_set_decay_mask(nb_optim *o, nb_decay_mask_fn mask, void *user) {
  const char *fn = "nb_optim_set_decay_mask";
  if (!o) return nbi_error(NB_ERR_NULL, "%s: o is NULL", fn);
  nb_optim *p[MAX_PARTS];
  int n = parts_of(o, p), hit = 0;
  for (int k = 0; k < n; k++)
    if (has_decay(p[k])) {
      p[k]->mask = mask;
      p[k]->mask_user = user;
      hit++;
    }
  return hit ? NB_OK : nbi_error(NB_ERR_ARG, "%s: the optimizer has no weight decay", fn);
}

bool nb_decay_matrices(void *user, const char *name, const nb_tensor *param) {
  (void)user, (void)name;
  return param && param->shape.ndim >= 2;
}

/* ---- groups -------------------------------------------------------------------------------------
 */
typedef struct group {
  nb_dtype dt;
  int dev;
  uint32_t decay; /* bit k: part k decays these parameters */
  bool alone;     /* a sharded parameter */
  int n;
  int *idx; /* [n] entries of the tree, in order */
  nb_shape *shapes;
  int64_t numel;
} group;

typedef struct groups {
  group *g;
  int n;
} groups;

static void groups_free(groups *gs) {
  for (int i = 0; i < gs->n; i++) {
    free(gs->g[i].idx);
    free(gs->g[i].shapes);
  }
  free(gs->g);
  *gs = (groups){0};
}

/* The groups of ref's floating-point entries for parts p[0..n_p-1]. */
static nb_status groups_of(const char *fn, const nb_tree *ref, nb_optim *const *p, int n_p,
                           groups *gs) {
  *gs = (groups){0};
  gs->g = calloc((size_t)ref->n + 1, sizeof *gs->g);
  if (!gs->g) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  for (int i = 0; i < ref->n; i++) {
    nb_tensor *x = ref->ts[i];
    if (!nb_dtype_is_float(x->dtype)) continue;
    uint32_t bits = 0;
    for (int k = 0; k < n_p; k++)
      if (decays(p[k]) && (!p[k]->mask || p[k]->mask(p[k]->mask_user, ref->names[i], x)))
        bits |= 1u << k;
    group *g = NULL;
    for (int j = 0; j < gs->n && !g && !x->mesh; j++)
      if (!gs->g[j].alone && gs->g[j].dt == x->dtype && gs->g[j].dev == x->device &&
          gs->g[j].decay == bits)
        g = &gs->g[j];
    if (!g) {
      g = &gs->g[gs->n++];
      *g = (group){.dt = x->dtype, .dev = x->device, .decay = bits, .alone = x->mesh != NULL};
      g->idx = malloc(sizeof *g->idx * (size_t)(ref->n + 1));
      g->shapes = malloc(sizeof *g->shapes * (size_t)(ref->n + 1));
      if (!g->idx || !g->shapes) {
        groups_free(gs);
        return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
      }
    }
    g->idx[g->n] = i;
    g->shapes[g->n++] = x->shape;
    g->numel += nbi_numel(&x->shape);
  }
  return NB_OK;
}

/* ---- state names --------------------------------------------------------------------------------
 */
/* prefix + what (+ "." + group when g >= 0) into buf */
static const char *state_name(char *buf, size_t cap, bool chain, int part, const char *what,
                              int g) {
  char pre[16] = "";
  if (chain) snprintf(pre, sizeof pre, "%d.", part);
  if (g >= 0)
    snprintf(buf, cap, "%s%s.%d", pre, what, g);
  else
    snprintf(buf, cap, "%s%s", pre, what);
  return buf;
}

static int n_moments(const nb_optim *o) {
  switch (o->kind) {
  case O_SGD: return o->momentum > 0;
  case O_ADAM: return 2;
  case O_LION: return 1;
  default: return 0;
  }
}
static bool has_state(const nb_optim *o) { return has_lr(o); }
static const char *const MOMENT[2] = {"mu", "nu"};

nb_tree *nb_optim_init(nb_optim *o, const nb_tree *params) {
  const char *fn = "nb_optim_init";
  if (!o) {
    nbi_error(NB_ERR_NULL, "%s: o is NULL", fn);
    return NULL;
  }
  if (nbi_tree_check(fn, "params", params)) return NULL;
  nb_optim *p[MAX_PARTS];
  int n_p = parts_of(o, p);
  groups gs;
  if (groups_of(fn, params, p, n_p, &gs)) return NULL;
  nb_tree *s = nb_tree_create();
  nb_status st = s ? NB_OK : nb_last_status();
  char name[64];
  nb_scope_begin();
  for (int k = 0; k < n_p && !st; k++) {
    if (!has_state(p[k])) continue;
    bool chain = o->kind == O_CHAIN;
    nb_tensor *count = nbi_full_on(nbi_default_device(), &(nb_shape){0}, 0, NB_I64);
    st = count ? nb_tree_set(s, state_name(name, sizeof name, chain, k, "count", -1), count)
               : nb_last_status();
    for (int m = 0; m < n_moments(p[k]) && !st; m++)
      for (int j = 0; j < gs.n && !st; j++) {
        nb_shape flat = {.ndim = 1, .dims = {gs.g[j].numel}};
        nb_tensor *z = gs.g[j].alone ? nbi_zeros_like(nb_reshape(params->ts[gs.g[j].idx[0]], flat))
                                     : nbi_full_on(gs.g[j].dev, &flat, 0, gs.g[j].dt);
        st = z ? nb_tree_set(s, state_name(name, sizeof name, chain, k, MOMENT[m], j), z)
               : nb_last_status();
      }
  }
  nb_scope_end();
  groups_free(&gs);
  if (st) {
    nb_tree_release(s);
    return NULL;
  }
  return s;
}

/* ---- an update
 * ------------------------------------------------------------------------------------ */
typedef struct ctx {
  const char *fn;
  const nb_tree *grads, *params;
  nb_tree *state;
  groups gs;
  nb_tensor **u;    /* [gs.n] the current update of each group (flat) */
  nb_tensor **pf;   /* [gs.n] the group's parameters (flat), made when first needed */
  nb_tree *news;    /* the new state entries, committed at the end */
  nb_tree *scalars; /* 0-d tensors the update reads: realized first */
  int n_scalars;
} ctx;

/* A 0-d tensor the groups read, listed for the realization order. */
static nb_tensor *scalar_note(ctx *c, nb_tensor *x) {
  if (!x) return NULL;
  char name[32];
  snprintf(name, sizeof name, "s%d", c->n_scalars++);
  return nbi_tree_push(c->fn, c->scalars, name, x) ? NULL : x;
}

/* x (a 0-d f64 scalar) on group g's device, in its dtype. */
static nb_tensor *gscalar(ctx *c, const group *g, nb_tensor *x) {
  if (x && x->device != g->dev) x = nb_to_device(x, nbi_device_public(g->dev));
  return scalar_note(c, x ? nb_cast(x, g->dt) : NULL);
}

static nb_tensor *params_flat(ctx *c, int j) {
  if (!c->pf[j]) {
    if (!c->params) {
      nbi_error(NB_ERR_NULL, "%s: params is NULL, but weight decay reads them", c->fn);
      return NULL;
    }
    c->pf[j] = nbi_tree_flat(c->fn, c->params, c->gs.g[j].idx, c->gs.g[j].n);
  }
  return c->pf[j];
}

/* The state entry part k names what (group g, or -1), checked against the
 * shape it must have. */
static nb_tensor *state_get(ctx *c, bool chain, int k, const char *what, int g,
                            const nb_shape *want, nb_dtype dt) {
  char name[64];
  state_name(name, sizeof name, chain, k, what, g);
  nb_tensor *x = nb_tree_get(c->state, name);
  if (!x) {
    nbi_error(NB_ERR_ARG,
              "%s: the state has no entry \"%s\" (make it with nb_optim_init of this "
              "optimizer for these parameters)",
              c->fn, name);
    return NULL;
  }
  if (!nbi_shape_eq(&x->shape, want) || x->dtype != dt) {
    char a[160], b[160];
    nbi_error(NB_ERR_SHAPE, "%s: state entry \"%s\" is %s %s, the parameters need %s %s", c->fn,
              name, nb_dtype_name(x->dtype), nb_shape_str(x->shape, a, sizeof a), nb_dtype_name(dt),
              nb_shape_str(*want, b, sizeof b));
    return NULL;
  }
  return x;
}

static nb_status state_put(ctx *c, bool chain, int k, const char *what, int g, nb_tensor *x) {
  char name[64];
  if (!x) return nb_last_status();
  return nbi_tree_push(c->fn, c->news, state_name(name, sizeof name, chain, k, what, g), x);
}

/* The global L2 norm of every group's update, computed in the groups' dtype
 * (f32 when they differ, f64 when one is f64), as a 0-d tensor on the first
 * group's device. */
static nb_tensor *global_norm(ctx *c) {
  nb_dtype acc = c->gs.g[0].dt;
  for (int j = 1; j < c->gs.n; j++)
    if (c->gs.g[j].dt != acc) acc = NB_F32;
  for (int j = 0; j < c->gs.n; j++)
    if (c->gs.g[j].dt == NB_F64) acc = NB_F64;
  nb_tensor *sum = NULL;
  for (int j = 0; j < c->gs.n; j++) {
    nb_tensor *s = nb_sum(nb_square(nb_cast(c->u[j], acc)), NB_ALL, false);
    if (s && s->device != c->gs.g[0].dev) s = nb_to_device(s, nbi_device_public(c->gs.g[0].dev));
    sum = sum ? nb_add(sum, s) : s;
  }
  return nb_sqrt(sum);
}

static nb_status run_clip(ctx *c, const nb_optim *o) {
  /* torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), at most 1 */
  nb_tensor *coef = scalar_note(
      c, nb_minimum_scalar(nb_rdiv_scalar(nb_add_scalar(global_norm(c), 1e-6), o->max_norm), 1.0));
  for (int j = 0; j < c->gs.n; j++) {
    nb_tensor *cj = coef && coef->device != c->gs.g[j].dev
                        ? nb_to_device(coef, nbi_device_public(c->gs.g[j].dev))
                        : coef;
    if (!(c->u[j] = nb_mul(c->u[j], scalar_note(c, nb_cast(cj, c->gs.g[j].dt)))))
      return nb_last_status();
  }
  return NB_OK;
}

static nb_status run_decay(ctx *c, const nb_optim *o, int k) {
  for (int j = 0; j < c->gs.n; j++) {
    if (!(c->gs.g[j].decay >> k & 1)) continue;
    nb_tensor *pf = params_flat(c, j);
    if (!(c->u[j] = pf ? nb_add(c->u[j], nb_mul_scalar(pf, o->wd)) : NULL)) return nb_last_status();
  }
  return NB_OK;
}

/* torch.lerp(a, b, w) with a scalar weight, as its CPU kernel computes it:
 * a + w (b - a) for |w| < 0.5, else b - (b - a)(1 - w), w and 1 - w in
 * the tensors' dtype (f32 arithmetic for f32). */
static nb_tensor *lerp(nb_tensor *a, nb_tensor *b, double w, nb_dtype dt) {
  double wt = dt == NB_F32 ? (double)(float)w : w;
  if (fabs(wt) < 0.5) return nb_add(a, nb_mul_scalar(nb_sub(b, a), wt));
  double one_minus = dt == NB_F32 ? (double)(1.0f - (float)wt) : 1 - wt;
  return nb_sub(b, nb_mul_scalar(nb_sub(b, a), one_minus));
}

/* The step's scalars: on the host when the step count is a realized value
 * (eager steps: constants, no kernels, as torch reads its step), else f64
 * ops on the count (a traced step). */
typedef struct stepvals {
  bool host;
  double neg_lr, neg_step, bc2_sqrt, lr_wd;                /* host */
  nb_tensor *t_neg_lr, *t_neg_step, *t_bc2_sqrt, *t_lr_wd; /* 0-d f64 */
} stepvals;

static nb_status step_values(ctx *c, const nb_optim *o, nb_tensor *count, stepvals *v,
                             nb_tensor **next) {
  *v = (stepvals){.host = (count->flags & NBI_T_REALIZED) && !(count->flags & NBI_T_TRACED) &&
                          !count->mesh};
  nb_shape s0 = {0};
  if (v->host) {
    double n = nb_item(count); /* exact below 2^53 steps */
    if (isnan(n)) return nb_last_status();
    double lr = o->sched ? nb_schedule_value(o->sched, (int64_t)n) : o->lr, t = n + 1;
    v->neg_lr = -lr;
    v->neg_step = -(lr / (1 - pow(o->b1, t)));
    v->bc2_sqrt = sqrt(1 - pow(o->b2, t));
    v->lr_wd = lr * o->wd;
    *next = nbi_full_on(count->device, &s0, t, NB_I64);
    return *next ? NB_OK : nb_last_status();
  }
  *next = scalar_note(c, nb_add_scalar(count, 1));
  /* the schedule at the count before this step (optax); f64, as torch
   * computes these in Python floats */
  nb_tensor *t = nb_cast(*next, NB_F64);
  nb_tensor *lr =
      o->sched ? nb_schedule_at(o->sched, count) : nbi_full_on(count->device, &s0, o->lr, NB_F64);
  v->t_neg_lr = nb_neg(lr);
  v->t_lr_wd = nb_mul_scalar(lr, o->wd);
  if (o->kind == O_ADAM) {
    nb_tensor *one = nbi_full_on(count->device, &s0, 1, NB_F64);
    nb_tensor *b1 = nbi_full_on(count->device, &s0, o->b1, NB_F64);
    nb_tensor *b2 = nbi_full_on(count->device, &s0, o->b2, NB_F64);
    v->t_neg_step = nb_neg(nb_div(lr, nb_sub(one, nb_pow(b1, t))));
    v->t_bc2_sqrt = nb_sqrt(nb_sub(one, nb_pow(b2, t)));
  }
  return v->t_lr_wd ? NB_OK : nb_last_status();
}

/* One of the step's scalars for group g, in its dtype and on its device. */
static nb_tensor *gval(ctx *c, const group *g, const stepvals *v, double host, nb_tensor *graph) {
  if (v->host) return nbi_full_on(g->dev, &(nb_shape){0}, host, g->dt);
  return gscalar(c, g, graph);
}

/* SGD, Adam(W), Lion: the parts with a step count and a learning rate. */
static nb_status run_stateful(ctx *c, const nb_optim *o, bool chain, int k) {
  nb_tensor *count = state_get(c, chain, k, "count", -1, &(nb_shape){0}, NB_I64), *next = NULL;
  if (!count) return nb_last_status();
  stepvals v;
  nb_status st = step_values(c, o, count, &v, &next);
  if (!st) st = state_put(c, chain, k, "count", -1, next);
  for (int j = 0; j < c->gs.n && !st; j++) {
    group *g = &c->gs.g[j];
    nb_shape flat = {.ndim = 1, .dims = {g->numel}};
    bool dec = g->decay >> k & 1;
    nb_tensor *G = c->u[j], *U = NULL;
    nb_tensor *M = n_moments(o) > 0 ? state_get(c, chain, k, "mu", j, &flat, g->dt) : NULL;
    if (n_moments(o) > 0 && !M) return nb_last_status();
    if (o->kind == O_SGD) {
      nb_tensor *d = G;
      if (o->momentum > 0) {
        nb_tensor *B = nb_add(nb_mul_scalar(M, o->momentum), G);
        st = state_put(c, chain, k, "mu", j, B);
        d = o->nesterov ? nb_add(G, nb_mul_scalar(B, o->momentum)) : B;
      }
      U = st ? NULL : nb_mul(d, gval(c, g, &v, v.neg_lr, v.t_neg_lr));
    } else if (o->kind == O_ADAM) {
      nb_tensor *V = state_get(c, chain, k, "nu", j, &flat, g->dt);
      if (!V) return nb_last_status();
      nb_tensor *M2 = lerp(M, G, 1 - o->b1, g->dt);
      nb_tensor *V2 = nb_add(nb_mul_scalar(V, o->b2), nb_mul(nb_mul_scalar(G, 1 - o->b2), G));
      st = state_put(c, chain, k, "mu", j, M2);
      if (!st) st = state_put(c, chain, k, "nu", j, V2);
      nb_tensor *denom =
          nb_add_scalar(nb_div(nb_sqrt(V2), gval(c, g, &v, v.bc2_sqrt, v.t_bc2_sqrt)), o->eps);
      U = st ? NULL : nb_div(nb_mul(M2, gval(c, g, &v, v.neg_step, v.t_neg_step)), denom);
      if (U && dec) {
        nb_tensor *pf = params_flat(c, j);
        U = pf ? nb_sub(U, nb_mul(pf, gval(c, g, &v, v.lr_wd, v.t_lr_wd))) : NULL;
      }
    } else { /* Lion */
      nb_tensor *cm = nb_add(nb_mul_scalar(G, 1 - o->b1), nb_mul_scalar(M, o->b1));
      nb_tensor *M2 = nb_add(nb_mul_scalar(G, 1 - o->b2), nb_mul_scalar(M, o->b2));
      st = state_put(c, chain, k, "mu", j, M2);
      nb_tensor *dir = nb_sign(cm);
      if (!st && dec) {
        nb_tensor *pf = params_flat(c, j);
        dir = pf ? nb_add(dir, nb_mul_scalar(pf, o->wd)) : NULL;
      }
      U = st ? NULL : nb_mul(dir, gval(c, g, &v, v.neg_lr, v.t_neg_lr));
    }
    if (!st && !(c->u[j] = U)) st = nb_last_status();
  }
  return st;
}

static void ctx_free(ctx *c) {
  groups_free(&c->gs);
  free(c->u);
  nb_tree_release(c->news);
  nb_tree_release(c->scalars);
}

static nb_status update(const char *fn, nb_optim *o, const nb_tree *grads, nb_tree *state,
                        const nb_tree *params, nb_tree **updates) {
  nb_optim *p[MAX_PARTS];
  int n_p = parts_of(o, p);
  bool chain = o->kind == O_CHAIN, need_params = false;
  for (int k = 0; k < n_p; k++)
    need_params |= decays(p[k]);
  if (need_params && !params)
    return nbi_error(NB_ERR_NULL, "%s: params is NULL, but weight decay reads them", fn);
  nb_status st = params ? nbi_tree_same_names(fn, grads, params) : NB_OK;
  for (int i = 0; params && i < grads->n && !st; i++) {
    const nb_tensor *g = grads->ts[i], *x = params->ts[i];
    if (nb_dtype_is_float(x->dtype) &&
        (!nbi_shape_eq(&g->shape, &x->shape) || !nb_dtype_is_float(g->dtype))) {
      char a[160], b[160];
      st = nbi_error(NB_ERR_SHAPE, "%s: the gradient of \"%s\" is %s %s, the parameter %s %s", fn,
                     grads->names[i], nb_dtype_name(g->dtype), nb_shape_str(g->shape, a, sizeof a),
                     nb_dtype_name(x->dtype), nb_shape_str(x->shape, b, sizeof b));
    }
  }
  if (st) return st;
  ctx c = {.fn = fn, .grads = grads, .params = params, .state = state};
  st = groups_of(fn, params ? params : grads, p, n_p, &c.gs);
  if (st) return st;
  c.u = calloc(2 * (size_t)c.gs.n + 1, sizeof *c.u);
  c.pf = c.u + c.gs.n;
  c.news = nb_tree_create();
  c.scalars = nb_tree_create();
  if (!c.u || !c.news || !c.scalars) {
    ctx_free(&c);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  }
  for (int j = 0; j < c.gs.n && !st; j++) {
    nb_tensor *gf = nbi_tree_flat(fn, grads, c.gs.g[j].idx, c.gs.g[j].n);
    if (!(c.u[j] = gf ? nb_cast(gf, c.gs.g[j].dt) : NULL)) st = nb_last_status();
  }
  for (int k = 0; k < n_p && !st && c.gs.n; k++) {
    switch (p[k]->kind) {
    case O_CLIP: st = run_clip(&c, p[k]); break;
    case O_DECAY: st = run_decay(&c, p[k], k); break;
    default: st = run_stateful(&c, p[k], chain, k); break;
    }
  }
  /* parts with state but no floating-point parameters still count steps */
  for (int k = 0; k < n_p && !st && !c.gs.n; k++)
    if (has_state(p[k])) st = run_stateful(&c, p[k], chain, k);
  nb_tree *u = st ? NULL : nb_tree_copy(grads);
  if (!st && !u) st = nb_last_status();
  for (int i = 0; u && i < u->n && !st; i++) /* entries no group covers: zeros */
    if (!nb_dtype_is_float((params ? params : grads)->ts[i]->dtype)) {
      nb_tensor *z = nbi_zeros_like(u->ts[i]);
      if (!z)
        st = nb_last_status();
      else
        nbi_tree_replace(u, i, z);
    }
  for (int j = 0; j < c.gs.n && !st; j++)
    st = nbi_tree_unflat(fn, u, c.gs.g[j].idx, c.gs.g[j].n, c.gs.g[j].shapes, c.u[j]);
  /* the realization order: scalars, then the new state, then the updates */
  for (int i = 0; i < c.scalars->n && !st; i++)
    st = nbi_tree_extra_add(fn, u, c.scalars->ts[i]);
  for (int i = 0; i < c.news->n && !st; i++)
    st = nbi_tree_extra_add(fn, u, c.news->ts[i]);
  for (int j = 0; j < c.gs.n && !st; j++)
    if (c.gs.g[j].n > 1) st = nbi_tree_extra_add(fn, u, c.u[j]);
  if (!st) /* commit the new state */
    for (int i = 0; i < c.news->n && !st; i++)
      st = nb_tree_set(state, c.news->names[i], c.news->ts[i]);
  ctx_free(&c);
  if (st) {
    nb_tree_release(u);
    return st;
  }
  *updates = u;
  return NB_OK;
}

nb_status nb_optim_update(nb_optim *o, const nb_tree *grads, nb_tree *state, const nb_tree *params,
                          nb_tree **updates) {
  const char *fn = "nb_optim_update";
  if (!updates) return nbi_error(NB_ERR_NULL, "%s: updates is NULL", fn);
  *updates = NULL;
  if (!o) return nbi_error(NB_ERR_NULL, "%s: o is NULL", fn);
  nb_status st = nbi_tree_check(fn, "grads", grads);
  if (!st) st = nbi_tree_check(fn, "state", state);
  return st ? st : update(fn, o, grads, state, params, updates);
}

/* ---- applying updates ---------------------------------------------------------------------------
 */
static int cmp_entry(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)(*(nb_tensor *const *)a), y = (uintptr_t)(*(nb_tensor *const *)b);
  return x < y ? -1 : x > y;
}

/* NB_ERR_ARG when one tensor is bound to two names of t (tied weights:
 * nb_assign_n would rebind it twice). */
static nb_status check_distinct(const char *fn, const nb_tree *t) {
  nb_tensor **v = malloc(sizeof *v * (size_t)(t->n + 1));
  if (!v) return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  memcpy(v, t->ts, sizeof *v * (size_t)t->n);
  qsort(v, (size_t)t->n, sizeof *v, cmp_entry);
  const nb_tensor *dup = NULL;
  for (int i = 1; i < t->n && !dup; i++)
    if (v[i] == v[i - 1]) dup = v[i];
  free(v);
  if (!dup) return NB_OK;
  int a = -1, b = -1;
  for (int i = 0; i < t->n && b < 0; i++)
    if (t->ts[i] == dup) *(a < 0 ? &a : &b) = i;
  return nbi_error(NB_ERR_ARG,
                   "%s: \"%s\" and \"%s\" are the same tensor (keep tied parameters "
                   "under one name)",
                   fn, t->names[a], t->names[b]);
}

static nb_status apply(const char *fn, nb_tree *params, const nb_tree *updates) {
  nb_status st = nbi_tree_same_names(fn, params, updates);
  if (!st) st = check_distinct(fn, params);
  if (st) return st;
  int n = params->n;
  nb_tensor **dst = calloc(3 * (size_t)n + (size_t)updates->n_extra + 1, sizeof *dst);
  nb_tensor **val = dst + n, **extra = val + n;
  bool *done = calloc((size_t)n + 1, 1);
  nb_tree *flats = nb_tree_create(); /* each packed group's new flat parameters */
  if (!dst || !done || !flats) {
    free(dst), free(done), nb_tree_release(flats);
    return nbi_error(NB_ERR_OOM, "%s: out of memory", fn);
  }
  int n_dst = 0, n_extra = 0;
  for (int i = 0; i < updates->n_extra; i++)
    extra[n_extra++] = updates->extra[i];
  nb_scope_begin();
  for (int i = 0; i < n && !st; i++) {
    const nb_tensor *p = params->ts[i], *u = updates->ts[i];
    if (nb_dtype_is_float(p->dtype) && !nbi_shape_eq(&p->shape, &u->shape)) {
      char a[160], b[160];
      st = nbi_error(NB_ERR_SHAPE, "%s: the update of \"%s\" has shape %s, the parameter %s", fn,
                     params->names[i], nb_shape_str(u->shape, a, sizeof a),
                     nb_shape_str(p->shape, b, sizeof b));
    }
  }
  /* whole groups: P' = P + U once, each parameter a part of it */
  for (int q = 0; q < updates->n_packs && !st; q++) {
    const nbi_tree_pack *pk = &updates->packs[q];
    if (!nbi_tree_pack_find(updates, pk->idx, pk->n)) continue;
    const nb_tensor *p0 = params->ts[pk->idx[0]];
    bool ok = nb_dtype_is_float(p0->dtype);
    for (int k = 0; k < pk->n && ok; k++) {
      const nb_tensor *p = params->ts[pk->idx[k]];
      ok = p->dtype == p0->dtype && p->device == p0->device && !p->mesh;
    }
    if (!ok) continue;
    nb_tensor *pf = nbi_tree_flat(fn, params, pk->idx, pk->n);
    nb_tensor *np = pf ? nb_add(pf, nb_cast(pk->flat, p0->dtype)) : NULL;
    char name[32];
    snprintf(name, sizeof name, "%d", q);
    st = np ? nbi_tree_push(fn, flats, name, np) : nb_last_status();
    for (int k = 0; k < pk->n && !st; k++) {
      int64_t a = pk->off[k], b = pk->off[k + 1];
      nb_tensor *part = nb_reshape(nb_slice(np, &a, &b, NULL), params->ts[pk->idx[k]]->shape);
      if (!part) st = nb_last_status();
      dst[n_dst] = params->ts[pk->idx[k]], val[n_dst++] = part;
      done[pk->idx[k]] = true;
    }
    extra[n_extra++] = np;
  }
  for (int i = 0; i < n && !st; i++) { /* the rest, tensor by tensor */
    nb_tensor *p = params->ts[i];
    if (done[i] || !nb_dtype_is_float(p->dtype) || p->mesh) continue;
    nb_tensor *s = nb_add(p, nb_cast(updates->ts[i], p->dtype));
    if (!s) st = nb_last_status();
    dst[n_dst] = p, val[n_dst++] = s;
  }
  if (!st && (n_dst || n_extra)) st = nbi_assign_rebind_n(dst, val, n_dst, extra, n_extra);
  for (int i = 0; i < n && !st; i++) /* sharded parameters keep their layouts */
    if (params->ts[i]->mesh && nb_dtype_is_float(params->ts[i]->dtype))
      st = nb_assign(params->ts[i], nb_add(params->ts[i], updates->ts[i]));
  /* the packed groups now live in their flat tensors' buffers */
  for (int q = 0; q < updates->n_packs && !st; q++) {
    const nbi_tree_pack *pk = &updates->packs[q];
    char name[32];
    snprintf(name, sizeof name, "%d", q);
    nb_tensor *np = nb_tree_get(flats, name);
    if (np) st = nbi_tree_pack_add(fn, params, pk->idx, pk->n, np);
  }
  nb_scope_end();
  nb_tree_release(flats);
  free(dst);
  free(done);
  return st;
}

nb_status nb_apply_updates(nb_tree *params, const nb_tree *updates) {
  const char *fn = "nb_apply_updates";
  nb_status st = nbi_tree_check(fn, "params", params);
  if (!st) st = nbi_tree_check(fn, "updates", updates);
  return st ? st : apply(fn, params, updates);
}

nb_status nb_optim_step(nb_optim *o, nb_tree *params, const nb_tree *grads, nb_tree *state) {
  const char *fn = "nb_optim_step";
  if (!o) return nbi_error(NB_ERR_NULL, "%s: o is NULL", fn);
  nb_status st = nbi_tree_check(fn, "params", params);
  if (!st) st = nbi_tree_check(fn, "grads", grads);
  if (!st) st = nbi_tree_check(fn, "state", state);
  if (st) return st;
  nb_tree *u = NULL;
  nb_scope_begin();
  st = update(fn, o, grads, state, params, &u);
  if (!st) st = apply(fn, params, u);
  nb_tree_release(u);
  nb_scope_end();
  return st;
}
