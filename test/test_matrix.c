/* test/test_matrix.c — every op of the library under every transform.
 *
 * One table, MX_ROWS: a row per public op (ops.h, nn.h, nb_detach, control
 * flow, checkpoint, custom calls), each a body applying the op to its inputs,
 * the inputs' shapes, dtypes and value ranges (away from kinks and poles), and
 * flags. Every row becomes eight tests, matrix::<row>_<check>, at random float64
 * inputs:
 *   _jit       the forward runs and is finite; nb_jit(f) equals eager f
 *              bitwise (first call and cached replay);
 *   _grad      vjp and jvp against central finite differences (tc_check_grad;
 *              Hessian-vector products too for smooth rows); rows without a
 *              derivative (integer/bool output, or no float input) must give
 *              zero cotangents and tangents; where finite differences cannot
 *              see the derivative (an f32 output, stop_gradient) vjp and jvp
 *              are checked against jacfwd's Jacobian instead;
 *   _vmap      nb_vmap(f) over B = 3 stacked examples equals a loop of f: in_axes
 *              all 0; input 0 NB_NOT_MAPPED with the others mapped at their last
 *              axis / axis 0 and out_axes -1; only input 0 mapped (at axis 1);
 *              and vmap of vmap (2 x 3 examples);
 *   _vmap_vjp  vmap(vjp(f)) and vmap(jvp(f)) equal loops of vjp and jvp;
 *   _jac       jacrev(f) and jacfwd(f) agree with each other and with the
 *              finite-difference Jacobian (rows without a derivative: both are
 *              NB_ERR_DTYPE errors);
 *   _jit_vmap_grad  jit(vmap(grad(s))) with s(x) = sum(u * f(x)), u a fixed
 *              random weight (sum of f, seeded unevenly), equals a loop of grad(s)
 *              (rows without a derivative: grad is an NB_ERR_DTYPE error);
 *   _fused     the forward and vjp(f) (a random cotangent) planned with the
 *              fusion pass equal the same run with every node alone, bit for
 *              bit;
 *   _sharded   the forward and vjp(f) with every input (and the cotangent)
 *              sharded by a random spec, on meshes 2, 2x2, 4x2 and 2x2x2,
 *              equal the unsharded values.
 * Forward-mode-only rows (nb_while_loop) skip vjp, jacrev and grad: jacfwd
 * stands in for grad, vmap(jvp) for vmap(vjp).
 * Integer and bool inputs (indices, masks, conditions) are batched like any other
 * input; derivative checks take them as captured constants.
 *
 * Two checks on the table itself: every primitive of nbi_op_table occurs in
 * some row's graph (walked from the row's outputs), except CONST / PLACEHOLDER
 * / TUPLE_GET and the internal primitives listed in mx_internal, which must
 * occur in the derivative graph of their forward op's row — so a new op
 * without a row fails; and every op has a batching rule. */
#include "grad_check.h"
#include "../src/core/oprules.h"
#include "../src/core/program.h"

#include "../src/sharding/sharding.h"

TestSuite(matrix, .init = tc_setup, .fini = tc_teardown);

#define MX_B 3        /* batch size of the vmap checks */
#define MX_MAX_IN 4   /* inputs of a row */
#define MX_MAX_ARGS 8 /* inputs of a transformed row (primals and seeds) */
#define MX_MAX_EX 6   /* examples: 2 x 3 for vmap of vmap */
#define MX_VMAP_TOL 1e-12
#define MX_JAC_TOL 1e-10

/* ---- rows ------------------------------------------------------------------------------- */
enum {
  MX_REAL,  /* uniform in [lo, hi) */
  MX_WHOLE, /* integers in [lo, hi] (indices; float ones make ties for comparisons) */
  MX_BOOL,  /* random true/false */
  MX_MASK,  /* random bools, the first entry along the last dim true */
};

typedef struct mx_arg {
  int kind;
  nb_dtype dt;
  nb_shape shape;
  double lo, hi;
} mx_arg;

enum {
  MX_SMOOTH = 1u << 0, /* also second derivatives (TC_SECOND) */
  MX_ND = 1u << 1,     /* no derivative: integer/bool output or no float input */
  MX_NOFD = 1u << 2,   /* finite differences do not apply (f32 rounding, stop_gradient):
                          vjp/jvp are checked against jacfwd instead */
  MX_FWD = 1u << 3,    /* forward mode only (nb_while_loop): no vjp, jacrev, grad */
  MX_SMAP = 1u << 4,   /* a shard_map: its output lives on the shard_map's own mesh */
};

typedef struct mx_row {
  const char *name;
  nb_fn_body body; /* called with user = the row */
  unsigned flags;
  int n_in;
  mx_arg in[MX_MAX_IN];
  /* for the generic bodies */
  nb_tensor *(*un)(nb_tensor *);
  nb_tensor *(*bin)(nb_tensor *, nb_tensor *);
  nb_tensor *(*sc)(nb_tensor *, double);
  double s;
} mx_row;

#define MX_S(...)                                                                                  \
  {                                                                                                \
    .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), .dims = { __VA_ARGS__ }     \
  }
#define R(lo, hi, ...)                                                                             \
  { MX_REAL, NB_F64, MX_S(__VA_ARGS__), lo, hi }
#define R0(lo, hi)                                                                                 \
  { MX_REAL, NB_F64, {.ndim = 0}, lo, hi }
#define BL0                                                                                        \
  { MX_BOOL, NB_BOOL, {.ndim = 0}, 0, 1 }
#define W(lo, hi, ...)                                                                             \
  { MX_WHOLE, NB_F64, MX_S(__VA_ARGS__), lo, hi }
#define IX(lo, hi, ...)                                                                            \
  { MX_WHOLE, NB_I64, MX_S(__VA_ARGS__), lo, hi }
#define BL(...)                                                                                    \
  { MX_BOOL, NB_BOOL, MX_S(__VA_ARGS__), 0, 1 }
#define MASK(...)                                                                                  \
  { MX_MASK, NB_BOOL, MX_S(__VA_ARGS__), 0, 1 }
#define IN(n, ...) .n_in = n, .in = {__VA_ARGS__}
#define X23 R(-1, 1, 2, 3)
#define SM MX_SMOOTH
#define ND MX_ND

/* Bodies: one output, out[0] = expr of in[]. */
#define MX_BODY(fname, expr)                                                                       \
  static nb_status fname(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {    \
    (void)u, (void)n_in, (void)n_out;                                                              \
    out[0] = (expr);                                                                               \
    return out[0] ? NB_OK : nb_last_status();                                                      \
  }

static nb_status mx_unary(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = ((const mx_row *)u)->un(in[0]);
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status mx_binary(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  out[0] = ((const mx_row *)u)->bin(in[0], in[1]);
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status mx_scalar(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_in, (void)n_out;
  const mx_row *r = u;
  out[0] = r->sc(in[0], r->s);
  return out[0] ? NB_OK : nb_last_status();
}

MX_BODY(b_cast_f32, nb_cast(in[0], NB_F32))
MX_BODY(b_cast_i64, nb_cast(in[0], NB_I64))
MX_BODY(b_cast_from_i64, nb_cast(in[0], NB_F64))
MX_BODY(b_where, nb_where(in[0], in[1], in[2]))
MX_BODY(b_clip, nb_clip(in[0], -1, 1))
MX_BODY(b_sum, nb_sum(in[0], NB_AXES(0, 2), false))
MX_BODY(b_mean, nb_mean(in[0], NB_AXES(0), true))
MX_BODY(b_prod, nb_prod(in[0], NB_AXES(-1), false))
MX_BODY(b_max, nb_max(in[0], NB_AXES(1), false))
MX_BODY(b_min, nb_min(in[0], NB_ALL, false))
MX_BODY(b_var, nb_var(in[0], NB_AXES(1), false))
MX_BODY(b_std, nb_std(in[0], NB_AXES(0), true))
MX_BODY(b_logsumexp, nb_logsumexp(in[0], NB_AXES(1), false))
MX_BODY(b_argmax, nb_argmax(in[0], 1, false))
MX_BODY(b_argmin, nb_argmin(in[0], 0, true))
MX_BODY(b_any, nb_any(in[0], NB_AXES(1), false))
MX_BODY(b_all, nb_all(in[0], NB_AXES(0), false))
MX_BODY(b_softmax, nb_softmax(in[0], -1))
MX_BODY(b_log_softmax, nb_log_softmax(in[0], 0))
MX_BODY(b_cumsum, nb_cumsum(in[0], 1))
MX_BODY(b_einsum, nb_einsum("bij,jk->bki", in, 2))
MX_BODY(b_einsum_diag, nb_einsum("ii->i", in, 1))
MX_BODY(b_reshape, nb_reshape(in[0], NB_SHAPE(3, -1)))
MX_BODY(b_permute, nb_permute(in[0], NB_AXES(2, 0, 1)))
MX_BODY(b_squeeze, nb_squeeze(in[0], NB_AXES(1)))
MX_BODY(b_unsqueeze, nb_unsqueeze(in[0], -1))
MX_BODY(b_broadcast_to, nb_broadcast_to(in[0], NB_SHAPE(2, 3, 4)))
MX_BODY(b_flatten, nb_flatten(in[0], 0, 1))
MX_BODY(b_concat, nb_concat(in, 2, 1))
MX_BODY(b_stack, nb_stack(in, 2, 1))
MX_BODY(b_slice, nb_slice(in[0], (int64_t[]){0, 2}, (int64_t[]){NB_END, -4}, (int64_t[]){2, -1}))
MX_BODY(b_pad, nb_pad(in[0], (int64_t[]){1, 0, 0, 2}, 0.5))
MX_BODY(b_flip, nb_flip(in[0], NB_AXES(0, 1)))
MX_BODY(b_repeat, nb_repeat(in[0], 2, 1))
MX_BODY(b_tile, nb_tile(in[0], NB_SHAPE(2, 1, 2)))
MX_BODY(b_take, nb_take(in[0], in[1], 1))
MX_BODY(b_take_along_axis, nb_take_along_axis(in[0], in[1], 1))
MX_BODY(b_scatter_add, nb_scatter_add(in[0], in[1], in[2], 0))
MX_BODY(b_one_hot, nb_one_hot(in[0], 4, NB_F64))
MX_BODY(b_random_uniform, nb_random_uniform(in[0], NB_SHAPE(3, 2), NB_F64))
MX_BODY(b_random_normal, nb_random_normal(in[0], NB_SHAPE(2, 3), NB_F64))
MX_BODY(b_embedding, nb_embedding(in[0], in[1]))
MX_BODY(b_layer_norm, nb_layer_norm(in[0], in[1], in[2], 1e-5))
MX_BODY(b_layer_norm_plain, nb_layer_norm(in[0], NULL, NULL, 1e-5))
MX_BODY(b_rms_norm, nb_rms_norm(in[0], in[1], 1e-5))
MX_BODY(b_dropout_eval, nb_dropout(in[0], 0.5, false))
MX_BODY(b_conv2d, nb_conv2d(in[0], in[1], in[2], &(nb_conv2d_params){{2, 1}, {1, 0}, {1, 1}, 1}))
MX_BODY(b_conv2d_groups,
        nb_conv2d(in[0], in[1], NULL, &(nb_conv2d_params){{1, 1}, {0, 1}, {2, 1}, 2}))
MX_BODY(b_max_pool2d, nb_max_pool2d(in[0], 2, 2, 2, 2, 0, 0))
MX_BODY(b_max_pool2d_pad, nb_max_pool2d(in[0], 3, 3, 2, 2, 1, 1))
MX_BODY(b_attention, nb_attention(in[0], in[1], in[2], in[3]))
MX_BODY(b_attention_nomask, nb_attention(in[0], in[1], in[2], NULL))
MX_BODY(b_detach, nb_mul(in[0], nb_detach(nb_sin(in[0]))))
/* to another device (an emulated one) and back: values and derivatives move along */
static nb_tensor *round_trip(nb_tensor *x) {
  nb_device home = nb_device_of(x),
            away = home.kind == NB_DEVICE_EMU && home.index == 3 ? NB_EMU(2) : NB_EMU(3);
  return nb_to_device(nb_sin(nb_to_device(x, away)), home);
}
MX_BODY(b_to_device, round_trip(in[0]))
MX_BODY(b_identity, in[0])

/* split [2,4] into [2,1] and [2,3]; one output: their broadcast product */
static nb_status b_split(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *p[2];
  nb_status st = nb_split(in[0], (int64_t[]){1, 3}, 2, 1, p);
  if (st) return st;
  out[0] = nb_mul(p[0], p[1]);
  return out[0] ? NB_OK : nb_last_status();
}

/* ---- control flow: bodies traced into the ops' programs --------------------------------- */
static nb_fn *mx_fn_of(nb_fn_body body, int n_in, int n_out) {
  nb_fn *f = nb_fn_create(body, NULL, n_in, n_out);
  cr_assert(f, "%s", nb_last_error());
  return f;
}

/* cond branches on (x, w): sin(x) w, and x w^2 + cos(w) */
MX_BODY(cf_then, nb_mul(nb_sin(in[0]), in[1]))
MX_BODY(cf_else, nb_add(nb_mul(in[0], nb_square(in[1])), nb_cos(in[1])))

static nb_status mx_cond(nb_tensor *pred, nb_tensor *const *ops, nb_tensor **out) {
  nb_fn *t = mx_fn_of(cf_then, 2, 1), *e = mx_fn_of(cf_else, 2, 1);
  nb_status st = nb_cond(pred, t, e, ops, 2, out);
  nb_fn_release(t);
  nb_fn_release(e);
  return st;
}

/* in: pred (a 0-d bool input), x, w */
static nb_status b_cond(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return mx_cond(in[0], in + 1, out);
}

/* in: x, w; pred = sum(x) > 0, computed from the data */
static nb_status b_cond_data_pred(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                  int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return mx_cond(nb_gt_scalar(nb_sum(in[0], NB_ALL, false), 0), in, out);
}

/* while sum(x) < 4: x = x w + 0.1 (w carried unchanged); the trip count
 * depends on the data, so examples of a batch stop at different steps */
MX_BODY(wl_cond, nb_lt_scalar(nb_sum(in[0], NB_ALL, false), 4))
static nb_status wl_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_add_scalar(nb_mul(in[0], in[1]), 0.1);
  out[1] = in[1];
  return out[0] ? NB_OK : nb_last_status();
}

static nb_status b_while_loop(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_fn *c = mx_fn_of(wl_cond, 2, 1), *b = mx_fn_of(wl_body, 2, 2);
  nb_tensor *o[2];
  nb_status st = nb_while_loop(c, b, in, 2, o);
  out[0] = o[0];
  nb_fn_release(c);
  nb_fn_release(b);
  return st;
}

/* scan step on (carry c, x): (c x + 0.5 sin(x), y = c x); reverse step on
 * (c, a, b): (c a + sin(b), y = c b). One output: ys * final carry. */
static nb_status sc_step(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[1] = nb_mul(in[0], in[1]);
  out[0] = nb_add(out[1], nb_mul_scalar(nb_sin(in[1]), 0.5));
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status sc_step_rev(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  out[0] = nb_add(nb_mul(in[0], in[1]), nb_sin(in[2]));
  out[1] = nb_mul(in[0], in[2]);
  return out[0] && out[1] ? NB_OK : nb_last_status();
}

static nb_status mx_scan(nb_fn_body step, nb_tensor *const *in, int n_xs, bool reverse,
                         nb_tensor **out) {
  nb_fn *b = mx_fn_of(step, 1 + n_xs, 2);
  nb_tensor *carry, *ys;
  nb_status st = nb_scan(b, in, 1, in + 1, n_xs, reverse, &carry, &ys);
  nb_fn_release(b);
  if (st) return st;
  out[0] = nb_mul(ys, carry);
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status b_scan(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return mx_scan(sc_step, in, 1, false, out);
}
static nb_status b_scan_reverse(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return mx_scan(sc_step_rev, in, 2, true, out);
}

/* for i in [0, 3): x = x + 0.1 (i + 1) sin(x) w (w carried unchanged) */
static nb_status fl_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *s = nb_mul_scalar(nb_add_scalar(nb_cast(in[0], NB_F64), 1), 0.1);
  out[0] = nb_add(in[1], nb_mul(s, nb_mul(nb_sin(in[1]), in[2])));
  out[1] = in[2];
  return out[0] ? NB_OK : nb_last_status();
}
static nb_status b_fori_loop(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_fn *b = mx_fn_of(fl_body, 3, 2);
  nb_tensor *o[2];
  nb_status st = nb_fori_loop(0, 3, b, in, 2, o);
  out[0] = o[0];
  nb_fn_release(b);
  return st;
}

/* ---- checkpoint and custom calls ----------------------------------------------------- */
/* sin(x) w + exp(x w), checkpointed: a REMAT node under the transforms */
MX_BODY(ck_inner, nb_add(nb_mul(nb_sin(in[0]), in[1]), nb_exp(nb_mul(in[0], in[1]))))
static nb_status b_checkpoint(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_fn *f = mx_fn_of(ck_inner, 2, 1), *c = nb_checkpoint(f);
  nb_status st = nb_call(c, in, out);
  nb_fn_release(c);
  nb_fn_release(f);
  return st;
}

/* shard_map bodies on a 2-device mesh with each collective: the row's value
 * is the logical function, so every check applies as to any op. */
static nb_fn *mx_smap(nb_fn_body body, int n_in, const char *const *in_specs,
                      const char *out_spec) {
  static nb_mesh *m;
  if (!m) m = nb_mesh_cpu("x=2"); /* kept for the process: rows are called many times */
  nb_fn *b = mx_fn_of(body, n_in, 1), *f = nb_shard_map(b, m, in_specs, &out_spec);
  nb_fn_release(b);
  cr_assert(f, "%s", nb_last_error());
  return f;
}

static nb_status mx_call_smap(nb_fn_body body, int n_in, const char *const *in_specs,
                              const char *out_spec, nb_tensor *const *in, nb_tensor **out) {
  nb_fn *f = mx_smap(body, n_in, in_specs, out_spec);
  nb_status st = nb_call(f, in, out);
  nb_fn_release(f);
  return st;
}

/* every reduction: sum(a) + mean(a) * max(w) - min(w), a = sin(x) w */
MX_BODY(sm_reduce_in,
        nb_sub(nb_add(nb_all_reduce(nb_mul(nb_sin(in[0]), in[1]), "x", NB_REDUCE_SUM),
                      nb_mul(nb_all_reduce(nb_mul(nb_sin(in[0]), in[1]), "x", NB_REDUCE_MEAN),
                             nb_all_reduce(in[1], "x", NB_REDUCE_MAX))),
               nb_all_reduce(nb_exp(in[0]), "x", NB_REDUCE_MIN)))
static nb_status b_all_reduce(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return mx_call_smap(sm_reduce_in, 2, (const char *[]){"x, _", "x, _"}, "_, _", in, out);
}

MX_BODY(sm_gather_in, nb_all_gather(nb_mul(nb_sin(in[0]), in[1]), "x", -2))
static nb_status b_all_gather(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return mx_call_smap(sm_gather_in, 2, (const char *[]){"x, _", "x, _"}, "_, _", in, out);
}

/* replicated inputs made device-dependent by the rank, then summed and cut */
MX_BODY(sm_scatter_in,
        nb_reduce_scatter(nb_mul(nb_mul(nb_sin(in[0]), in[1]),
                                 nb_add_scalar(nb_cast(nb_axis_index("x"), NB_F64), 1)),
                          "x", 0))
static nb_status b_reduce_scatter(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                  int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return mx_call_smap(sm_scatter_in, 2, (const char *[]){"_, _", "_, _"}, "x, _", in, out);
}

MX_BODY(sm_a2a_in, nb_all_to_all(nb_mul(nb_sin(in[0]), in[1]), "x", 1, 0))
static nb_status b_all_to_all(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return mx_call_smap(sm_a2a_in, 2, (const char *[]){"x, _", "x, _"}, "_, x", in, out);
}

MX_BODY(sm_perm_in,
        nb_ppermute(nb_mul(nb_sin(in[0]), in[1]), "x", (const int[][2]){{0, 1}, {1, 0}}, 2))
static nb_status b_ppermute(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return mx_call_smap(sm_perm_in, 2, (const char *[]){"x, _", "x, _"}, "x, _", in, out);
}

/* Custom ops on float64 x, w of one shape: "mx_sinmul" gives y0 = sin(x) w
 * with a batching rule; "mx_sinmul2" also y1 = x w and has none (the default
 * per-example loop). Rules are written with nabla ops. */
static nb_status cu_infer(void *u, const nb_shape *is, const nb_dtype *id, int n_in, nb_shape *os,
                          nb_dtype *od, int n_out) {
  (void)u, (void)n_in;
  if (id[0] != NB_F64 || id[1] != NB_F64 || !nbi_shape_eq(&is[0], &is[1]))
    return nb_set_error(NB_ERR_ARG, "mx_sinmul: needs two float64 inputs of one shape");
  for (int j = 0; j < n_out; j++)
    os[j] = is[0], od[j] = NB_F64;
  return NB_OK;
}

static nb_status cu_cpu(void *u, const nb_custom_buffer *in, int n_in, nb_custom_buffer *out,
                        int n_out) {
  (void)u, (void)n_in;
  const double *x = in[0].data, *w = in[1].data;
  for (int64_t i = 0; i < tc_numel(in[0].shape); i++) {
    ((double *)out[0].data)[i] = sin(x[i]) * w[i];
    if (n_out > 1) ((double *)out[1].data)[i] = x[i] * w[i];
  }
  return NB_OK;
}

static nb_status cu_vjp(void *u, nb_tensor *const *in, int n_in, nb_tensor *const *out,
                        nb_tensor *const *ct, int n_out, nb_tensor **gin) {
  (void)u, (void)n_in, (void)out;
  nb_tensor *x = in[0], *w = in[1];
  gin[0] = nb_mul(ct[0], nb_mul(nb_cos(x), w));
  gin[1] = nb_mul(ct[0], nb_sin(x));
  if (n_out > 1) {
    gin[0] = nb_add(gin[0], nb_mul(ct[1], w));
    gin[1] = nb_add(gin[1], nb_mul(ct[1], x));
  }
  return gin[0] && gin[1] ? NB_OK : nb_last_status();
}

static nb_status cu_jvp(void *u, nb_tensor *const *in, nb_tensor *const *t, int n_in,
                        nb_tensor *const *out, int n_out, nb_tensor **tout) {
  (void)u, (void)n_in, (void)out;
  nb_tensor *x = in[0], *w = in[1];
  tout[0] = nb_add(nb_mul(t[0], nb_mul(nb_cos(x), w)), nb_mul(t[1], nb_sin(x)));
  if (n_out > 1) tout[1] = nb_add(nb_mul(t[0], w), nb_mul(t[1], x));
  return tout[0] && (n_out < 2 || tout[1]) ? NB_OK : nb_last_status();
}

/* One call on the whole batch; an unbatched input is broadcast along it. */
static nb_status cu_batch(void *u, nb_tensor *const *in, const bool *batched, int n_in,
                          int64_t batch, nb_tensor **out, int n_out) {
  (void)u;
  nb_tensor *b[2];
  for (int k = 0; k < n_in; k++) {
    nb_shape s = {.ndim = in[k]->shape.ndim + 1, .dims = {batch}};
    memcpy(s.dims + 1, in[k]->shape.dims, sizeof(int64_t) * (size_t)in[k]->shape.ndim);
    b[k] = batched[k] ? in[k] : nb_broadcast_to(in[k], s);
  }
  return nb_custom_call(nb_custom_op_find("mx_sinmul"), b, n_in, out, n_out);
}

static const nb_custom_op *mx_custom_op(int n_out) {
  const char *name = n_out == 1 ? "mx_sinmul" : "mx_sinmul2";
  const nb_custom_op *op = nb_custom_op_find(name);
  if (!op) {
    op = nb_custom_op_register(
        &(nb_custom_op_def){.name = name,
                            .n_in = 2,
                            .n_out = n_out,
                            .infer = cu_infer,
                            .cpu = cu_cpu,
                            .vjp = cu_vjp,
                            .jvp = cu_jvp,
                            .batch = n_out == 1 ? cu_batch : NULL,
                            .sharding = n_out == 1 ? "..., ... -> ..." : "..., ... -> ..., ..."});
  }
  cr_assert(op, "%s: %s", name, nb_last_error());
  return op;
}

static nb_status b_custom(void *u, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)u, (void)n_in, (void)n_out;
  return nb_custom_call(mx_custom_op(1), in, 2, out, 1);
}

/* two outputs, combined: y0 + y1^2 */
static nb_status b_custom_default_batching(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                           int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *y[2];
  nb_status st = nb_custom_call(mx_custom_op(2), in, 2, y, 2);
  if (st) return st;
  out[0] = nb_add(y[0], nb_square(y[1]));
  return out[0] ? NB_OK : nb_last_status();
}

/* a sharding constraint (src/sharding/constraint.c): nb_reshard on a value
 * of a mesh or traced under one (a call on sharded values); traced on one
 * device, nb_shard on a mesh of the row's own (recorded; the identity where
 * the program runs on one device); eager on one device it is left out
 * (nb_shard would place the value on the mesh) */
static nb_status b_sharding_constraint(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                       int n_out) {
  (void)u, (void)n_in, (void)n_out;
  nb_tensor *y = nb_sin(in[0]), *z = y;
  if (y && (nb_mesh_of(y) || ((y->flags & NBI_T_TRACED) && nbi_trace_mesh()))) {
    z = nb_reshard(y, "a, _");
  } else if (y && (y->flags & NBI_T_TRACED)) {
    nb_mesh *m = nb_mesh_cpu("a=2");
    z = nb_shard(y, m, "a, _");
    nb_mesh_release(m);
  }
  out[0] = nb_mul(z, in[0]);
  return out[0] ? NB_OK : nb_last_status();
}

/* a value laid out like another (how gradients under a trace mesh get their
 * primals' layouts): x0 * x1 like x1 */
MX_BODY(b_shard_like, nbi_shard_like(nb_mul(in[0], in[1]), in[1]))

/* The table. X(name, body, flags, fields...): each row is a test name and the
 * designated initializers of its mx_row. Rows of the generic bodies: */
#define MX_UN(X, name, flags, ...) X(name, mx_unary, flags, .un = nb_##name, IN(1, __VA_ARGS__))
#define MX_BIN(X, name, flags, ...) X(name, mx_binary, flags, .bin = nb_##name, IN(2, __VA_ARGS__))
#define MX_SC(X, name, flags, v, ...)                                                              \
  X(name, mx_scalar, flags, .sc = nb_##name, .s = v, IN(1, __VA_ARGS__))

#define MX_ROWS(X)                                                                                 \
  /* elementwise unary */                                                                          \
  MX_UN(X, neg, SM, X23)                                                                           \
  MX_UN(X, abs, 0, X23)                                                                            \
  MX_UN(X, sign, 0, X23)                                                                           \
  MX_UN(X, exp, SM, X23)                                                                           \
  MX_UN(X, expm1, SM, X23)                                                                         \
  MX_UN(X, log, SM, R(0.5, 2, 2, 3))                                                               \
  MX_UN(X, log1p, SM, R(-0.5, 1, 2, 3))                                                            \
  MX_UN(X, sqrt, SM, R(0.5, 2, 2, 3))                                                              \
  MX_UN(X, rsqrt, SM, R(0.5, 2, 2, 3))                                                             \
  MX_UN(X, square, SM, X23)                                                                        \
  MX_UN(X, sin, SM, R(-2, 2, 2, 3))                                                                \
  MX_UN(X, cos, SM, R(-2, 2, 2, 3))                                                                \
  MX_UN(X, tan, SM, X23)                                                                           \
  MX_UN(X, tanh, SM, R(-2, 2, 2, 3))                                                               \
  MX_UN(X, sigmoid, SM, R(-2, 2, 2, 3))                                                            \
  MX_UN(X, relu, 0, X23)                                                                           \
  MX_UN(X, gelu, SM, R(-2, 2, 2, 3))                                                               \
  MX_UN(X, silu, SM, R(-2, 2, 2, 3))                                                               \
  MX_UN(X, softplus, SM, R(-2, 2, 2, 3))                                                           \
  MX_UN(X, erf, SM, R(-2, 2, 2, 3))                                                                \
  MX_UN(X, floor, 0, R(-2.5, 2.5, 2, 3))                                                           \
  MX_UN(X, ceil, 0, R(-2.5, 2.5, 2, 3))                                                            \
  MX_UN(X, round, 0, R(-2.5, 2.5, 2, 3))                                                           \
  MX_UN(X, reciprocal, SM, R(0.5, 2, 2, 3))                                                        \
  MX_UN(X, logical_not, ND, BL(2, 3))                                                              \
  X(cast_f32, b_cast_f32, MX_NOFD, IN(1, X23))                                                     \
  X(to_device, b_to_device, SM, IN(1, X23))                                                        \
  X(cast_i64, b_cast_i64, ND, IN(1, W(-3, 3, 2, 3)))                                               \
  X(cast_from_i64, b_cast_from_i64, ND, IN(1, IX(-3, 3, 2, 3)))                                    \
  /* elementwise binary: [2,3] with [3] (broadcast), plus other broadcasts */                      \
  MX_BIN(X, add, SM, X23, R(-1, 1, 3))                                                             \
  MX_BIN(X, sub, SM, X23, R(-1, 1, 3))                                                             \
  MX_BIN(X, mul, SM, X23, R(-1, 1, 3))                                                             \
  MX_BIN(X, div, SM, X23, R(0.5, 2, 3))                                                            \
  MX_BIN(X, pow, SM, R(0.5, 2, 2, 3), R(-1.5, 1.5, 3))                                             \
  MX_BIN(X, maximum, 0, X23, R(-1, 1, 3))                                                          \
  MX_BIN(X, minimum, 0, X23, R(-1, 1, 3))                                                          \
  MX_BIN(X, atan2, SM, X23, R(0.3, 1.5, 3))                                                        \
  MX_BIN(X, mod, 0, R(-3, 3, 2, 3), R(0.7, 1.3, 3))                                                \
  MX_BIN(X, eq, ND, W(-1, 1, 2, 3), W(-1, 1, 3))                                                   \
  MX_BIN(X, ne, ND, W(-1, 1, 2, 3), W(-1, 1, 3))                                                   \
  MX_BIN(X, lt, ND, W(-1, 1, 2, 3), W(-1, 1, 3))                                                   \
  MX_BIN(X, le, ND, W(-1, 1, 2, 3), W(-1, 1, 3))                                                   \
  MX_BIN(X, gt, ND, W(-1, 1, 2, 3), W(-1, 1, 3))                                                   \
  MX_BIN(X, ge, ND, W(-1, 1, 2, 3), W(-1, 1, 3))                                                   \
  MX_BIN(X, logical_and, ND, BL(2, 3), BL(2, 3))                                                   \
  MX_BIN(X, logical_or, ND, BL(2, 3), BL(3))                                                       \
  X(mul_0d, mx_binary, SM, .bin = nb_mul, IN(2, X23, R0(-1, 1)))                                   \
  X(add_outer_bcast, mx_binary, SM, .bin = nb_add, IN(2, R(-1, 1, 2, 1), R(-1, 1, 1, 3)))          \
  /* scalar forms */                                                                               \
  MX_SC(X, add_scalar, SM, 0.5, X23)                                                               \
  MX_SC(X, sub_scalar, SM, 0.5, X23)                                                               \
  MX_SC(X, rsub_scalar, SM, 0.5, X23)                                                              \
  MX_SC(X, mul_scalar, SM, -1.5, X23)                                                              \
  MX_SC(X, div_scalar, SM, 0.7, X23)                                                               \
  MX_SC(X, rdiv_scalar, SM, 1.5, R(0.5, 2, 2, 3))                                                  \
  MX_SC(X, pow_scalar, SM, 2.5, R(0.5, 2, 2, 3))                                                   \
  MX_SC(X, maximum_scalar, 0, 0.1, X23)                                                            \
  MX_SC(X, minimum_scalar, 0, 0.1, X23)                                                            \
  MX_SC(X, eq_scalar, ND, 1, W(-2, 2, 2, 3))                                                       \
  MX_SC(X, ne_scalar, ND, 1, W(-2, 2, 2, 3))                                                       \
  MX_SC(X, lt_scalar, ND, 1, W(-2, 2, 2, 3))                                                       \
  MX_SC(X, le_scalar, ND, 1, W(-2, 2, 2, 3))                                                       \
  MX_SC(X, gt_scalar, ND, 1, W(-2, 2, 2, 3))                                                       \
  MX_SC(X, ge_scalar, ND, 1, W(-2, 2, 2, 3))                                                       \
  X(where, b_where, SM, IN(3, BL(2, 3), X23, R(-1, 1, 3)))                                         \
  X(clip, b_clip, 0, IN(1, R(-2, 2, 2, 3)))                                                        \
  /* reductions */                                                                                 \
  X(sum, b_sum, SM, IN(1, R(-1, 1, 2, 3, 2)))                                                      \
  X(mean, b_mean, SM, IN(1, X23))                                                                  \
  X(prod, b_prod, SM, IN(1, R(0.5, 1.5, 2, 3)))                                                    \
  X(max, b_max, 0, IN(1, X23))                                                                     \
  X(min, b_min, 0, IN(1, X23))                                                                     \
  X(var, b_var, SM, IN(1, X23))                                                                    \
  X(std, b_std, SM, IN(1, X23))                                                                    \
  X(logsumexp, b_logsumexp, SM, IN(1, X23))                                                        \
  X(argmax, b_argmax, ND, IN(1, X23))                                                              \
  X(argmin, b_argmin, ND, IN(1, X23))                                                              \
  X(any, b_any, ND, IN(1, BL(2, 3)))                                                               \
  X(all, b_all, ND, IN(1, BL(2, 3)))                                                               \
  X(softmax, b_softmax, SM, IN(1, X23))                                                            \
  X(log_softmax, b_log_softmax, SM, IN(1, X23))                                                    \
  X(cumsum, b_cumsum, SM, IN(1, X23))                                                              \
  /* linear algebra */                                                                             \
  X(matmul, mx_binary, SM, .bin = nb_matmul, IN(2, X23, R(-1, 1, 3, 2)))                           \
  X(matmul_vec_mat, mx_binary, SM, .bin = nb_matmul, IN(2, R(-1, 1, 3), R(-1, 1, 3, 2)))           \
  X(matmul_mat_vec, mx_binary, SM, .bin = nb_matmul, IN(2, X23, R(-1, 1, 3)))                      \
  X(matmul_batched, mx_binary, SM, .bin = nb_matmul, IN(2, R(-1, 1, 2, 2, 3), R(-1, 1, 3, 2)))     \
  X(einsum, b_einsum, SM, IN(2, R(-1, 1, 2, 2, 3), R(-1, 1, 3, 2)))                                \
  X(einsum_diag, b_einsum_diag, SM, IN(1, R(-1, 1, 3, 3)))                                         \
  X(outer, mx_binary, SM, .bin = nb_outer, IN(2, R(-1, 1, 3), R(-1, 1, 2, 2)))                     \
  /* shapes and views */                                                                           \
  X(reshape, b_reshape, SM, IN(1, X23))                                                            \
  MX_UN(X, transpose, SM, R(-1, 1, 2, 3, 2))                                                       \
  X(permute, b_permute, SM, IN(1, R(-1, 1, 2, 3, 2)))                                              \
  X(squeeze, b_squeeze, SM, IN(1, R(-1, 1, 2, 1, 3)))                                              \
  X(unsqueeze, b_unsqueeze, SM, IN(1, X23))                                                        \
  X(broadcast_to, b_broadcast_to, SM, IN(1, R(-1, 1, 3, 1)))                                       \
  X(flatten, b_flatten, SM, IN(1, R(-1, 1, 2, 3, 2)))                                              \
  X(concat, b_concat, SM, IN(2, X23, R(-1, 1, 2, 1)))                                              \
  X(stack, b_stack, SM, IN(2, X23, X23))                                                           \
  X(split, b_split, SM, IN(1, R(-1, 1, 2, 4)))                                                     \
  X(slice, b_slice, SM, IN(1, R(-1, 1, 4, 3)))                                                     \
  X(pad, b_pad, SM, IN(1, X23))                                                                    \
  X(flip, b_flip, SM, IN(1, X23))                                                                  \
  X(repeat, b_repeat, SM, IN(1, X23))                                                              \
  X(tile, b_tile, SM, IN(1, X23))                                                                  \
  /* indexing */                                                                                   \
  X(take, b_take, SM, IN(2, R(-1, 1, 3, 4), IX(-4, 3, 2, 2)))                                      \
  X(take_along_axis, b_take_along_axis, SM, IN(2, R(-1, 1, 3, 4), IX(0, 3, 3, 2)))                 \
  X(scatter_add, b_scatter_add, SM, IN(3, R(-1, 1, 4, 3), IX(0, 3, 3), R(-1, 1, 3, 3)))            \
  X(one_hot, b_one_hot, ND, IN(1, IX(-1, 4, 2, 3)))                                                \
  X(random_uniform, b_random_uniform, ND, IN(1, IX(0, 1000, 2)))                                   \
  X(random_normal, b_random_normal, ND, IN(1, IX(0, 1000, 2)))                                     \
  X(embedding, b_embedding, SM, IN(2, R(-1, 1, 5, 3), IX(0, 4, 2, 2)))                             \
  /* neural-net helpers */                                                                         \
  X(layer_norm, b_layer_norm, SM, IN(3, R(-1, 1, 2, 4), R(-1, 1, 4), R(-1, 1, 4)))                 \
  X(layer_norm_plain, b_layer_norm_plain, SM, IN(1, R(-1, 1, 2, 4)))                               \
  X(rms_norm, b_rms_norm, SM, IN(2, R(-1, 1, 2, 4), R(-1, 1, 4)))                                  \
  X(cross_entropy, mx_binary, SM, .bin = nb_cross_entropy, IN(2, R(-1, 1, 3, 4), IX(0, 3, 3)))     \
  X(cross_entropy_probs, mx_binary, SM, .bin = nb_cross_entropy,                                   \
    IN(2, R(-1, 1, 3, 4), R(0, 1, 3, 4)))                                                          \
  X(mse, mx_binary, SM, .bin = nb_mse, IN(2, X23, X23))                                            \
  X(dropout_eval, b_dropout_eval, SM, IN(1, X23))                                                  \
  X(conv2d, b_conv2d, SM, IN(3, R(-1, 1, 1, 2, 4, 4), R(-1, 1, 3, 2, 2, 2), R(-1, 1, 3)))          \
  X(conv2d_groups, b_conv2d_groups, SM, IN(2, R(-1, 1, 1, 4, 4, 4), R(-1, 1, 4, 2, 2, 2)))         \
  X(max_pool2d, b_max_pool2d, 0, IN(1, R(-1, 1, 1, 2, 4, 4)))                                      \
  X(max_pool2d_pad, b_max_pool2d_pad, 0, IN(1, R(-1, 1, 1, 1, 5, 5)))                              \
  X(attention, b_attention, SM, IN(4, R(-1, 1, 2, 3), R(-1, 1, 4, 3), R(-1, 1, 4, 2), MASK(2, 4))) \
  X(attention_nomask, b_attention_nomask, SM,                                                      \
    IN(3, R(-1, 1, 2, 2, 3), R(-1, 1, 2, 4, 3), R(-1, 1, 2, 4, 2)))                                \
  /* transforms' own ops: stop_gradient, and an output that is an input (identity) */              \
  X(detach, b_detach, MX_NOFD, IN(1, X23))                                                         \
  X(identity, b_identity, SM, IN(1, X23))                                                          \
  /* control flow */                                                                               \
  X(cond, b_cond, SM, IN(3, BL0, R(-1, 1, 3), R(-1, 1, 3)))                                        \
  X(cond_data_pred, b_cond_data_pred, SM, IN(2, R(-1, 1, 3), R(-1, 1, 3)))                         \
  X(while_loop, b_while_loop, MX_FWD, IN(2, R(0.1, 0.5, 3), R(1.2, 1.6, 3)))                       \
  X(scan, b_scan, SM, IN(2, R(0.5, 1.5, 2), R(0.5, 1.5, 4, 2)))                                    \
  X(scan_reverse, b_scan_reverse, SM, IN(3, R(0.5, 1.5, 2), R(0.5, 1.5, 3, 2), R(-1, 1, 3, 2)))    \
  X(fori_loop, b_fori_loop, SM, IN(2, R(-1, 1, 3), R(-1, 1, 3)))                                   \
  /* calls as one node: checkpoint, custom ops (with and without a batching rule) */               \
  X(checkpoint, b_checkpoint, SM, IN(2, X23, X23))                                                 \
  X(custom_op, b_custom, SM, IN(2, X23, X23))                                                      \
  X(custom_op_default_batching, b_custom_default_batching, SM, IN(2, X23, X23))                    \
  /* shard_map on x=2 with each collective (and axis_index) */                                     \
  X(all_reduce, b_all_reduce, MX_SMAP, IN(2, R(-1, 1, 4, 3), R(-1, 1, 4, 3)))                      \
  X(all_gather, b_all_gather, SM | MX_SMAP, IN(2, R(-1, 1, 4, 3), R(-1, 1, 4, 3)))                 \
  X(reduce_scatter, b_reduce_scatter, SM | MX_SMAP, IN(2, R(-1, 1, 4, 3), R(-1, 1, 4, 3)))         \
  X(all_to_all, b_all_to_all, SM | MX_SMAP, IN(2, R(-1, 1, 4, 4), R(-1, 1, 4, 4)))                 \
  X(ppermute, b_ppermute, SM | MX_SMAP, IN(2, R(-1, 1, 4, 3), R(-1, 1, 4, 3)))                     \
  /* sharding constraints */                                                                       \
  X(sharding_constraint, b_sharding_constraint, SM, IN(1, X23))                                    \
  X(shard_like, b_shard_like, SM, IN(2, X23, X23))

#define MX_ENUM(name, ...) MX_ROW_##name,
enum { MX_ROWS(MX_ENUM) MX_N_ROWS };
#undef MX_ENUM

#define MX_INIT(name_, body_, flags_, ...)                                                         \
  {.name = #name_, .body = body_, .flags = flags_, __VA_ARGS__},
static const mx_row mx_rows[MX_N_ROWS] = {MX_ROWS(MX_INIT)};
#undef MX_INIT

/* ---- helpers ---------------------------------------------------------------------------- */
static uint64_t mx_seed(const mx_row *r, uint64_t salt) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (const char *c = r->name; *c; c++)
    h = (h ^ (uint8_t)*c) * 1099511628211ull;
  return h;
}

static nb_tensor *mx_arg_tensor(const mx_arg *a, uint64_t *seed) {
  int64_t n = tc_numel(a->shape), last = a->shape.ndim ? a->shape.dims[a->shape.ndim - 1] : 1;
  double *x = malloc(sizeof *x * (size_t)(n + 1));
  for (int64_t i = 0; i < n; i++) {
    switch (a->kind) {
    case MX_REAL: x[i] = tc_uniform(seed, a->lo, a->hi); break;
    case MX_WHOLE: x[i] = (double)tc_randint(seed, (int64_t)a->lo, (int64_t)a->hi); break;
    default:
      x[i] = (double)tc_randint(seed, 0, 1);
      if (a->kind == MX_MASK && i % last == 0) x[i] = 1;
    }
  }
  nb_tensor *t = tc_tensor(x, a->shape, a->dt);
  free(x);
  return t;
}

/* A random tensor of t's shape and dtype (cotangents, tangents, weights). */
static nb_tensor *mx_like(nb_tensor *t, uint64_t *seed) {
  mx_arg a = {MX_REAL, nb_dtype_of(t), nb_shape_of(t), -1, 1};
  if (!nb_dtype_is_float(a.dt)) a.kind = a.dt == NB_BOOL ? MX_BOOL : MX_WHOLE;
  return mx_arg_tensor(&a, seed);
}

static void mx_example(const mx_row *r, uint64_t *seed, nb_tensor **xs) {
  for (int k = 0; k < r->n_in; k++)
    xs[k] = mx_arg_tensor(&r->in[k], seed);
}

static nb_fn *mx_fn(const mx_row *r) {
  nb_fn *f = nb_fn_create(r->body, (void *)r, r->n_in, 1);
  cr_assert(f, "%s: %s", r->name, nb_last_error());
  return f;
}

static void mx_call(const char *what, const char *part, nb_fn *f, nb_tensor *const *in,
                    nb_tensor **out) {
  cr_assert(f, "%s: %s: making the function: %s", what, part, nb_last_error());
  nb_status st = nb_call(f, in, out);
  cr_assert_eq(st, NB_OK, "%s: %s: %s", what, part, nb_last_error());
}

static double *mx_read(const char *what, const char *part, nb_tensor *t) {
  cr_assert(t, "%s: %s: NULL result: %s", what, part, nb_last_error());
  return tc_read(t);
}

/* The float inputs of a row: their indices, as argnums. */
static nb_axes mx_float_args(const mx_row *r) {
  nb_axes a = {.n = 0};
  for (int k = 0; k < r->n_in; k++)
    if (nb_dtype_is_float(r->in[k].dt)) a.v[a.n++] = k;
  return a;
}

/* Asserts that got batches want[0..n-1] (one value per example, n = the product
 * of bdims[0..nbd-1]) with the batch dims inserted at position axis: got has
 * want's dtype and shape with those dims, and element by element
 * |got - want| <= tol (1 + |want|) (tol 0: equal; NaN matches NaN). */
static void mx_assert_batch(const char *what, const char *part, nb_tensor *got,
                            nb_tensor *const *want, const int64_t *bdims, int nbd, int axis,
                            double tol) {
  cr_assert(got, "%s: %s: NULL result: %s", what, part, nb_last_error());
  nb_shape es = nb_shape_of(want[0]), bs = {.ndim = nbd}, gs = {.ndim = es.ndim + nbd};
  int64_t n = 1;
  for (int d = 0; d < nbd; d++)
    n *= bs.dims[d] = bdims[d];
  for (int d = 0, e = 0; d < gs.ndim; d++)
    gs.dims[d] = d >= axis && d < axis + nbd ? bdims[d - axis] : es.dims[e++];
  char a[96], b[96];
  cr_assert(nbi_shape_eq(&got->shape, &gs), "%s: %s: shape %s, want %s", what, part,
            nb_shape_str(got->shape, a, sizeof a), nb_shape_str(gs, b, sizeof b));
  cr_assert_eq(nb_dtype_of(got), nb_dtype_of(want[0]), "%s: %s: dtype %s, want %s", what, part,
               nb_dtype_name(nb_dtype_of(got)), nb_dtype_name(nb_dtype_of(want[0])));
  double *g = tc_read(got);
  int64_t m = tc_numel(es), ix[NB_MAX_DIMS], bix[NB_MAX_DIMS], full[NB_MAX_DIMS];
  for (int64_t e = 0; e < n; e++) {
    double *w = mx_read(what, part, want[e]);
    tc_unravel(e, &bs, bix);
    for (int64_t i = 0; i < m; i++) {
      tc_unravel(i, &es, ix);
      for (int d = 0, k = 0; d < gs.ndim; d++)
        full[d] = d >= axis && d < axis + nbd ? bix[d - axis] : ix[k++];
      double gv = g[tc_ravel(full, &gs)], wv = w[i];
      bool ok = tol == 0 ? gv == wv || (isnan(gv) && isnan(wv))
                         : fabs(gv - wv) <= tol * (1 + fabs(wv)) || (isnan(gv) && isnan(wv));
      cr_assert(ok, "%s: %s: example %lld element %lld: got %.17g, want %.17g", what, part,
                (long long)e, (long long)i, gv, wv);
    }
    free(w);
  }
  free(g);
}

/* Calls bf (the batched function) on the examples ex[0..n-1] stacked per
 * in_axes (NULL: all 0; NB_NOT_MAPPED inputs take ex[0][k]) and f on each
 * example, and asserts bf's outputs batch f's at out axis oa. */
static void mx_batched_vs_loop(const char *what, const char *part, nb_fn *bf, nb_fn *f,
                               nb_tensor *(*ex)[MX_MAX_ARGS], int n, const int *in_axes, int oa) {
  int n_in = nb_fn_n_in(f), n_out = nb_fn_n_out(f);
  nb_tensor *in[MX_MAX_ARGS], *col[MX_MAX_EX], *out[MX_MAX_ARGS], *lo[MX_MAX_EX][MX_MAX_ARGS];
  for (int k = 0; k < n_in; k++) {
    int ax = in_axes ? in_axes[k] : 0;
    if (ax == NB_NOT_MAPPED) {
      in[k] = ex[0][k];
      continue;
    }
    for (int e = 0; e < n; e++)
      col[e] = ex[e][k];
    in[k] = nb_stack(col, n, ax);
    cr_assert(in[k], "%s: stacking input %d: %s", what, k, nb_last_error());
  }
  mx_call(what, part, bf, in, out);
  for (int e = 0; e < n; e++) {
    nb_tensor *ein[MX_MAX_ARGS];
    for (int k = 0; k < n_in; k++)
      ein[k] = in_axes && in_axes[k] == NB_NOT_MAPPED ? ex[0][k] : ex[e][k];
    mx_call(what, "the loop", f, ein, lo[e]);
  }
  for (int j = 0; j < n_out; j++) {
    char p[128];
    snprintf(p, sizeof p, "%s, output %d", part, j);
    for (int e = 0; e < n; e++)
      col[e] = lo[e][j];
    int ndim = nb_ndim(col[0]) + 1, a = oa < 0 ? oa + ndim : oa;
    mx_assert_batch(what, p, out[j], col, (int64_t[]){n}, 1, a, MX_VMAP_TOL);
  }
}

/* ---- derivatives with the non-float inputs captured --------------------------------------
 * The finite-difference harness perturbs every input as float64, so the
 * derivative checks see a row as a function of its float inputs only; the
 * others (indices, masks, conditions) are fixed at the example's values. */
typedef struct mx_closure {
  const mx_row *r;
  nb_tensor *fixed[MX_MAX_IN];
  nb_axes args; /* the float inputs */
} mx_closure;

static nb_status mx_closure_body(void *u, nb_tensor *const *in, int n_in, nb_tensor **out,
                                 int n_out) {
  const mx_closure *c = u;
  nb_tensor *full[MX_MAX_IN];
  for (int k = 0; k < c->r->n_in; k++)
    full[k] = c->fixed[k];
  for (int a = 0; a < n_in; a++)
    full[c->args.v[a]] = in[a];
  return c->r->body((void *)c->r, full, c->r->n_in, out, n_out);
}

/* Fills c for row r at the example xs and writes its float inputs to fx;
 * returns the closure as a function of those. */
static nb_fn *mx_closure_fn(mx_closure *c, const mx_row *r, nb_tensor *const *xs, nb_tensor **fx) {
  *c = (mx_closure){.r = r, .args = mx_float_args(r)};
  for (int k = 0; k < r->n_in; k++)
    c->fixed[k] = xs[k];
  for (int a = 0; a < c->args.n; a++)
    fx[a] = xs[c->args.v[a]];
  nb_fn *f = nb_fn_create(mx_closure_body, c, c->args.n, 1);
  cr_assert(f, "%s: %s", r->name, nb_last_error());
  return f;
}

/* The m x total matrix of Jacobian blocks jac[a] (d y / d x[a], shape
 * y.shape + x[a].shape), columns input-major as tc_fd_jacobian's. */
static double *mx_jac_matrix(const char *what, const char *part, nb_tensor *const *jac,
                             nb_tensor *const *x, int n, nb_tensor *y, int64_t total) {
  int64_t m = nb_numel(y), off = 0;
  double *J = calloc((size_t)(m * total + 1), sizeof *J);
  for (int a = 0; a < n; a++) {
    nb_shape want = nb_shape_of(y), xs = nb_shape_of(x[a]);
    for (int d = 0; d < xs.ndim; d++)
      want.dims[want.ndim++] = xs.dims[d];
    cr_assert(jac[a], "%s: %s: NULL Jacobian: %s", what, part, nb_last_error());
    char s1[96], s2[96];
    cr_assert(nbi_shape_eq(&jac[a]->shape, &want), "%s: %s: block %d has shape %s, want %s", what,
              part, a, nb_shape_str(jac[a]->shape, s1, sizeof s1),
              nb_shape_str(want, s2, sizeof s2));
    int64_t na = nb_numel(x[a]);
    double *b = tc_read(jac[a]);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < na; j++)
        J[i * total + off + j] = b[i * na + j];
    free(b);
    off += na;
  }
  return J;
}

static int64_t mx_total(nb_tensor *const *x, int n) {
  int64_t t = 0;
  for (int a = 0; a < n; a++)
    t += nb_numel(x[a]);
  return t;
}

/* Tolerance of a derivative compared with another of the same value in
 * output dtype dt: float64 rounding, or that of a narrower output. */
static double mx_deriv_tol(nb_dtype dt) { return dt == NB_F64 ? MX_JAC_TOL : tc_tol(dt); }

/* ---- the seven checks ------------------------------------------------------------------- */
enum {
  MX_JIT,
  MX_GRAD,
  MX_VMAP,
  MX_VMAP_VJP,
  MX_JAC,
  MX_JIT_VMAP_GRAD,
  MX_FUSED,
  MX_SHARDED,
  MX_N_CHECKS
};
static const char *const mx_check_names[MX_N_CHECKS] = {"jit", "grad",          "vmap",  "vmap_vjp",
                                                        "jac", "jit_vmap_grad", "fused", "sharded"};

/* 1. the forward runs and is finite; jit(f) equals eager f exactly. */
static void mx_check_jit(const mx_row *r, const char *what) {
  uint64_t seed = mx_seed(r, 1);
  nb_tensor *xs[MX_MAX_IN], *e[1], *j[1];
  mx_example(r, &seed, xs);
  nb_fn *f = mx_fn(r), *jf = nb_jit(f);
  mx_call(what, "eager", f, xs, e);
  double *v = mx_read(what, "eager", e[0]);
  nb_dtype dt = nb_dtype_of(e[0]);
  if (nb_dtype_is_float(dt))
    for (int64_t i = 0; i < nb_numel(e[0]); i++)
      cr_assert(isfinite(v[i]), "%s: output element %lld is %g", what, (long long)i, v[i]);
  bool nd = !nb_dtype_is_float(dt) || mx_float_args(r).n == 0;
  cr_assert_eq(nd, (r->flags & MX_ND) != 0,
               "%s: the row's MX_ND flag is wrong (output %s, %d float inputs)", what,
               nb_dtype_name(dt), mx_float_args(r).n);
  for (int rep = 0; rep < 2; rep++) {
    mx_call(what, "jit", jf, xs, j);
    cr_assert(nb_is_realized(j[0]), "%s: a top-level jit realizes its output", what);
    mx_assert_batch(what, rep ? "jit (cached) vs eager" : "jit vs eager", j[0], e, NULL, 0, 0, 0);
  }
  free(v);
  nb_fn_release(jf);
  nb_fn_release(f);
}

/* A row without a derivative: zero cotangents for every input, zero tangent. */
static void mx_check_zero_derivatives(const char *what, nb_fn *f, nb_tensor *const *xs, int n_in,
                                      nb_tensor *y, uint64_t *seed) {
  nb_tensor *in[MX_MAX_ARGS], *out[MX_MAX_ARGS];
  for (int k = 0; k < n_in; k++)
    in[k] = xs[k];
  in[n_in] = mx_like(y, seed);
  nb_fn *g = nb_vjp_fn(f);
  mx_call(what, "vjp", g, in, out);
  for (int k = 0; k < n_in; k++) {
    tc_assert_like(what, out[1 + k], xs[k]);
    double *c = tc_read(out[1 + k]);
    for (int64_t i = 0; i < nb_numel(xs[k]); i++)
      cr_assert_eq(c[i], 0, "%s: cotangent %d element %lld is %g, want 0", what, k, (long long)i,
                   c[i]);
    free(c);
  }
  for (int k = 0; k < n_in; k++)
    in[n_in + k] = mx_like(xs[k], seed);
  nb_fn *h = nb_jvp_fn(f);
  mx_call(what, "jvp", h, in, out);
  tc_assert_like(what, out[1], y);
  double *t = tc_read(out[1]);
  for (int64_t i = 0; i < nb_numel(y); i++)
    cr_assert_eq(t[i], 0, "%s: tangent element %lld is %g, want 0", what, (long long)i, t[i]);
  free(t);
  nb_fn_release(h);
  nb_fn_release(g);
}

/* jvp (and vjp when reverse) of cf at fx against J (m x total): J v and J^T u
 * for random tangents v and cotangent u, to tol; src names where J came from. */
static void mx_check_against_jacobian(const char *what, const char *src, nb_fn *cf,
                                      nb_tensor *const *fx, int n, nb_tensor *y, const double *J,
                                      bool reverse, double tol, uint64_t *seed) {
  int64_t m = nb_numel(y), total = mx_total(fx, n);
  nb_tensor *in[MX_MAX_ARGS], *out[MX_MAX_ARGS];
  char part[96];
  double *want = calloc((size_t)(m + total + 1), sizeof *want);
  double *got = calloc((size_t)(m + total + 1), sizeof *got);
  for (int a = 0; a < n; a++)
    in[a] = fx[a];
  if (reverse) {
    in[n] = mx_like(y, seed);
    double *u = tc_read(in[n]);
    for (int64_t c = 0; c < total; c++)
      for (int64_t i = 0; i < m; i++)
        want[c] += J[i * total + c] * u[i];
    nb_fn *g = nb_vjp_fn(cf);
    mx_call(what, "vjp", g, in, out);
    tc_read_concat(what, out + 1, fx, n, got);
    snprintf(part, sizeof part, "vjp vs %s", src);
    tc_assert_vec_close(what, part, got, want, total, tol);
    free(u);
    nb_fn_release(g);
  }
  double *v = calloc((size_t)total + 1, sizeof *v);
  for (int a = 0; a < n; a++)
    in[n + a] = mx_like(fx[a], seed);
  tc_read_concat(what, in + n, fx, n, v);
  for (int64_t i = 0; i < m; i++) {
    want[i] = 0;
    for (int64_t c = 0; c < total; c++)
      want[i] += J[i * total + c] * v[c];
  }
  nb_fn *h = nb_jvp_fn(cf);
  mx_call(what, "jvp", h, in, out);
  tc_read_concat(what, out + 1, &y, 1, got);
  snprintf(part, sizeof part, "jvp vs %s", src);
  tc_assert_vec_close(what, part, got, want, m, tol);
  free(v);
  free(got);
  free(want);
  nb_fn_release(h);
}

/* 2. vjp and jvp against finite differences. */
static void mx_check_grad(const mx_row *r, const char *what) {
  uint64_t seed = mx_seed(r, 2);
  nb_tensor *xs[MX_MAX_IN], *y[1], *fx[MX_MAX_IN];
  mx_example(r, &seed, xs);
  nb_fn *f = mx_fn(r);
  mx_call(what, "forward", f, xs, y);
  if (r->flags & MX_ND) {
    mx_check_zero_derivatives(what, f, xs, r->n_in, y[0], &seed);
    nb_fn_release(f);
    return;
  }
  mx_closure c;
  nb_fn *cf = mx_closure_fn(&c, r, xs, fx);
  int n = c.args.n;
  if (r->flags & MX_NOFD) {
    /* against the Jacobian of jacfwd: reverse and forward mode agree */
    nb_tensor *jac[MX_MAX_IN];
    nb_fn *jf = nb_jacfwd(cf, NB_ALL);
    mx_call(what, "jacfwd", jf, fx, jac);
    double *J = mx_jac_matrix(what, "jacfwd", jac, fx, n, y[0], mx_total(fx, n));
    mx_check_against_jacobian(what, "jacfwd", cf, fx, n, y[0], J, true,
                              mx_deriv_tol(nb_dtype_of(y[0])), &seed);
    free(J);
    nb_fn_release(jf);
  } else if (r->flags & MX_FWD) {
    double *host[MX_MAX_IN] = {0};
    for (int a = 0; a < n; a++)
      host[a] = tc_read(fx[a]);
    double *J = tc_fd_jacobian(cf, fx, n, host, nb_numel(y[0]), mx_total(fx, n));
    mx_check_against_jacobian(what, "finite differences", cf, fx, n, y[0], J, false, TC_FD_TOL,
                              &seed);
    free(J);
    for (int a = 0; a < n; a++)
      free(host[a]);
  } else {
    tc_check_grad(what, mx_closure_body, &c, n, fx, (r->flags & MX_SMOOTH) ? TC_SECOND : 0);
  }
  nb_fn_release(cf);
  nb_fn_release(f);
}

/* 3. vmap(f) equals a loop of f, for several in_axes / out_axes, and nested. */
static void mx_check_vmap(const mx_row *r, const char *what) {
  uint64_t seed = mx_seed(r, 3);
  nb_tensor *ex[MX_MAX_EX][MX_MAX_ARGS];
  for (int e = 0; e < MX_MAX_EX; e++)
    mx_example(r, &seed, ex[e]);
  nb_fn *f = mx_fn(r), *v = nb_vmap(f, NULL, NULL);
  mx_batched_vs_loop(what, "vmap, in_axes 0", v, f, ex, MX_B, NULL, 0);

  /* input 0 unmapped (when there are others), the others at their last axis or
   * axis 0 alternately; the batch axis of the output last */
  int ax[MX_MAX_IN];
  for (int k = 0; k < r->n_in; k++)
    ax[k] = k == 0 && r->n_in > 1 ? NB_NOT_MAPPED : k % 2 == 0 && k ? 0 : -1;
  nb_fn *v2 = nb_vmap(f, ax, (int[]){-1});
  mx_batched_vs_loop(what, "vmap, in_axes (not mapped, -1, 0, -1), out_axes -1", v2, f, ex, MX_B,
                     ax, -1);

  /* only input 0 mapped, at axis 1 (0 for a 0-d example) */
  for (int k = 0; k < r->n_in; k++)
    ax[k] = k ? NB_NOT_MAPPED : r->in[0].shape.ndim ? 1 : 0;
  nb_fn *v3 = nb_vmap(f, ax, NULL);
  mx_batched_vs_loop(what, "vmap, in_axes (1, not mapped..)", v3, f, ex, MX_B, ax, 0);

  /* vmap of vmap over 2 x 3 examples */
  nb_fn *vv = nb_vmap(v, NULL, NULL);
  nb_tensor *in[MX_MAX_IN], *out[1], *lo[MX_MAX_EX][1], *want[MX_MAX_EX];
  for (int k = 0; k < r->n_in; k++) {
    nb_tensor *outer[2], *inner[MX_B];
    for (int o = 0; o < 2; o++) {
      for (int i = 0; i < MX_B; i++)
        inner[i] = ex[o * MX_B + i][k];
      outer[o] = nb_stack(inner, MX_B, 0);
    }
    in[k] = nb_stack(outer, 2, 0);
    cr_assert(in[k], "%s: stacking: %s", what, nb_last_error());
  }
  mx_call(what, "vmap(vmap)", vv, in, out);
  for (int e = 0; e < MX_MAX_EX; e++) {
    mx_call(what, "the loop", f, ex[e], lo[e]);
    want[e] = lo[e][0];
  }
  mx_assert_batch(what, "vmap(vmap)", out[0], want, (int64_t[]){2, MX_B}, 2, 0, MX_VMAP_TOL);
  nb_fn *fs[] = {vv, v3, v2, v, f};
  for (int i = 0; i < 5; i++)
    nb_fn_release(fs[i]);
}

/* 4. vmap(vjp(f)) and vmap(jvp(f)) equal loops of vjp and jvp. */
static void mx_check_vmap_vjp(const mx_row *r, const char *what) {
  uint64_t seed = mx_seed(r, 4);
  nb_tensor *ex[MX_B][MX_MAX_ARGS], *y[1];
  nb_fn *f = mx_fn(r);
  for (int e = 0; e < MX_B; e++)
    mx_example(r, &seed, ex[e]);
  mx_call(what, "forward", f, ex[0], y);
  if (!(r->flags & MX_FWD)) {
    for (int e = 0; e < MX_B; e++)
      ex[e][r->n_in] = mx_like(y[0], &seed);
    nb_fn *g = nb_vjp_fn(f), *vg = nb_vmap(g, NULL, NULL);
    mx_batched_vs_loop(what, "vmap(vjp)", vg, g, ex, MX_B, NULL, 0);
    nb_fn_release(vg);
    nb_fn_release(g);
  }
  for (int e = 0; e < MX_B; e++)
    for (int k = 0; k < r->n_in; k++)
      ex[e][r->n_in + k] = mx_like(ex[e][k], &seed);
  nb_fn *h = nb_jvp_fn(f), *vh = nb_vmap(h, NULL, NULL);
  mx_batched_vs_loop(what, "vmap(jvp)", vh, h, ex, MX_B, NULL, 0);
  nb_fn_release(vh);
  nb_fn_release(h);
  nb_fn_release(f);
}

/* Asserts that calling f on in fails with NB_ERR_DTYPE naming fn. */
static void mx_assert_dtype_error(const char *what, const char *fn, nb_fn *f,
                                  nb_tensor *const *in) {
  nb_tensor *out[MX_MAX_ARGS];
  cr_assert(f, "%s: %s: %s", what, fn, nb_last_error());
  cr_assert_neq(nb_call(f, in, out), NB_OK, "%s: %s of a row without a derivative succeeded", what,
                fn);
  cr_assert_eq(nb_last_status(), NB_ERR_DTYPE, "%s: %s: %s", what, fn, nb_last_error());
  cr_assert(strstr(nb_last_error(), fn), "%s: message \"%s\" lacks %s", what, nb_last_error(), fn);
  nb_clear_error();
}

/* 5. jacrev and jacfwd agree with each other and with finite differences. */
static void mx_check_jac(const mx_row *r, const char *what) {
  uint64_t seed = mx_seed(r, 5);
  nb_tensor *xs[MX_MAX_IN], *y[1], *fx[MX_MAX_IN], *jfo[MX_MAX_IN], *jro[MX_MAX_IN];
  mx_example(r, &seed, xs);
  nb_fn *f = mx_fn(r);
  mx_call(what, "forward", f, xs, y);
  if (r->flags & MX_ND) {
    nb_fn *jr = nb_jacrev(f, NB_ALL), *jf = nb_jacfwd(f, NB_ALL);
    mx_assert_dtype_error(what, "nb_jacrev", jr, xs);
    mx_assert_dtype_error(what, "nb_jacfwd", jf, xs);
    nb_fn_release(jr);
    nb_fn_release(jf);
    nb_fn_release(f);
    return;
  }
  mx_closure c;
  nb_fn *cf = mx_closure_fn(&c, r, xs, fx);
  int n = c.args.n;
  int64_t m = nb_numel(y[0]), total = mx_total(fx, n);
  nb_fn *jf = nb_jacfwd(f, c.args);
  mx_call(what, "jacfwd", jf, xs, jfo);
  double *Jf = mx_jac_matrix(what, "jacfwd", jfo, fx, n, y[0], total);
  if (!(r->flags & MX_NOFD)) {
    double *host[MX_MAX_IN] = {0};
    for (int a = 0; a < n; a++)
      host[a] = tc_read(fx[a]);
    double *J = tc_fd_jacobian(cf, fx, n, host, m, total);
    tc_assert_vec_close(what, "jacfwd vs finite differences", Jf, J, m * total, TC_FD_TOL);
    free(J);
    for (int a = 0; a < n; a++)
      free(host[a]);
  }
  if (!(r->flags & MX_FWD)) {
    nb_fn *jr = nb_jacrev(f, c.args);
    mx_call(what, "jacrev", jr, xs, jro);
    double *Jr = mx_jac_matrix(what, "jacrev", jro, fx, n, y[0], total);
    tc_assert_vec_close(what, "jacrev vs jacfwd", Jr, Jf, m * total,
                        mx_deriv_tol(nb_dtype_of(y[0])));
    free(Jr);
    nb_fn_release(jr);
  }
  free(Jf);
  nb_fn_release(jf);
  nb_fn_release(cf);
  nb_fn_release(f);
}

/* 6. jit(vmap(grad(s))), s(x) = sum(u * f(x)), equals a loop of grad(s). */
static void mx_check_jit_vmap_grad(const mx_row *r, const char *what) {
  uint64_t seed = mx_seed(r, 6);
  nb_tensor *ex[MX_B][MX_MAX_ARGS], *y[1];
  for (int e = 0; e < MX_B; e++)
    mx_example(r, &seed, ex[e]);
  nb_fn *f = mx_fn(r);
  mx_call(what, "forward", f, ex[0], y);
  tc_inner_product ip = {f, mx_like(y[0], &seed)};
  nb_fn *s = nb_fn_create(tc_inner_body, &ip, r->n_in, 1);
  if (r->flags & MX_ND) {
    nb_fn *g = nb_grad(s, NB_ALL);
    mx_assert_dtype_error(what, "nb_grad", g, ex[0]);
    nb_fn_release(g);
  } else {
    nb_axes args = mx_float_args(r);
    nb_fn *g = r->flags & MX_FWD ? nb_jacfwd(s, args) : nb_grad(s, args);
    nb_fn *v = nb_vmap(g, NULL, NULL), *j = nb_jit(v);
    mx_batched_vs_loop(what, "jit(vmap(grad))", j, g, ex, MX_B, NULL, 0);
    mx_batched_vs_loop(what, "jit(vmap(grad)), cached", j, g, ex, MX_B, NULL, 0);
    nb_fn_release(j);
    nb_fn_release(v);
    nb_fn_release(g);
  }
  nb_fn_release(s);
  nb_fn_release(f);
}

/* 7. fused == unfused: f's forward and, where it has one, vjp(f) at a random
 * cotangent, each realized in one plan with the fusion pass on and off. */
static void mx_check_fused(const mx_row *r, const char *what) {
  uint64_t seed = mx_seed(r, 7);
  nb_tensor *xs[MX_MAX_ARGS], *y[1];
  mx_example(r, &seed, xs);
  nb_fn *f = mx_fn(r), *g = NULL;
  mx_call(what, "forward", f, xs, y);
  int n_out = 1;
  if (!(r->flags & (MX_FWD | MX_ND))) {
    xs[r->n_in] = mx_like(y[0], &seed);
    g = nb_vjp_fn(f);
    n_out = 1 + r->n_in;
  }
  nb_fn *h = g ? g : f;
  double *v[2][1 + MX_MAX_IN] = {{0}};
  int64_t n[1 + MX_MAX_IN] = {0};
  for (int fused = 0; fused < 2; fused++) {
    nbi_set_fusion(fused);
    nb_tensor *o[1 + MX_MAX_IN];
    nb_scope_begin();
    mx_call(what, fused ? "fused" : "unfused", h, xs, o);
    cr_assert_eq(nb_eval(o, n_out), NB_OK, "%s: %s", what, nb_last_error());
    for (int j = 0; j < n_out; j++) {
      n[j] = nb_numel(o[j]);
      v[fused][j] = mx_read(what, "realized", o[j]);
    }
    nb_scope_end();
  }
  nbi_set_fusion(true);
  for (int j = 0; j < n_out; j++) {
    for (int64_t i = 0; i < n[j]; i++)
      cr_assert(memcmp(&v[0][j][i], &v[1][j][i], sizeof(double)) == 0 ||
                    (isnan(v[0][j][i]) && isnan(v[1][j][i])),
                "%s: output %d element %lld: unfused %.17g, fused %.17g", what, j, (long long)i,
                v[0][j][i], v[1][j][i]);
    free(v[0][j]);
    free(v[1][j]);
  }
  nb_fn_release(g);
  nb_fn_release(f);
}

/* A random spec for ndim dimensions over mesh axes a, b, c (the first n_axes):
 * each dimension unsharded, or over one or two axes no other uses. */
static void mx_random_spec(int ndim, int n_axes, uint64_t *seed, char *spec) {
  static const char *const axes[] = {"a", "b", "c"};
  bool used[3] = {0};
  spec[0] = 0;
  for (int d = 0; d < ndim; d++) {
    char e[16] = "_";
    int a = (int)tc_randint(seed, -1, n_axes - 1);
    if (a >= 0 && !used[a]) {
      used[a] = true;
      int b = (int)tc_randint(seed, -1, n_axes - 1);
      if (b >= 0 && !used[b] && tc_randint(seed, 0, 1)) {
        used[b] = true;
        snprintf(e, sizeof e, "(%s, %s)", axes[a], axes[b]);
      } else {
        snprintf(e, sizeof e, "%s", axes[a]);
      }
    }
    strcat(spec, d ? ", " : "");
    strcat(spec, e);
  }
}

/* 8. sharded == unsharded: on each mesh of 2, 2x2, 4x2 and 2x2x2, every
 * input placed with a random spec (each dimension unsharded, or over one or
 * two unused axes; sizes need not divide), f's forward and, where it has
 * one, vjp(f) at a random cotangent equal the unsharded values (up to float
 * reassociation: sums over shards). */
static void mx_check_sharded_on(const mx_row *r, const char *what, int mi) {
  static const char *const meshes[] = {"a=2", "a=2,b=2", "a=4,b=2", "a=2,b=2,c=2"};
  uint64_t seed = mx_seed(r, 8 + (uint64_t)mi);
  int n_axes = mi == 0 ? 1 : mi == 3 ? 3 : 2;
  nb_mesh *m = nb_mesh_cpu(meshes[mi]);
  cr_assert(m, "%s: %s", what, nb_last_error());
  nb_tensor *xs[MX_MAX_ARGS], *sx[MX_MAX_ARGS], *y[1];
  mx_example(r, &seed, xs);
  char specs[MX_MAX_IN + 1][96];
  for (int k = 0; k < r->n_in; k++) {
    mx_random_spec(nb_ndim(xs[k]), n_axes, &seed, specs[k]);
    sx[k] = nb_shard(xs[k], m, specs[k]);
    cr_assert(sx[k], "%s: input %d spec \"%s\": %s", what, k, specs[k], nb_last_error());
  }
  nb_fn *f = mx_fn(r), *g = NULL;
  mx_call(what, "forward", f, xs, y);
  int n_out = 1;
  if (!(r->flags & (MX_FWD | MX_ND))) {
    xs[r->n_in] = mx_like(y[0], &seed);
    mx_random_spec(nb_ndim(xs[r->n_in]), n_axes, &seed, specs[r->n_in]);
    sx[r->n_in] = nb_shard(xs[r->n_in], m, specs[r->n_in]);
    cr_assert(sx[r->n_in], "%s: cotangent spec \"%s\": %s", what, specs[r->n_in], nb_last_error());
    g = nb_vjp_fn(f);
    n_out = 1 + r->n_in;
  }
  nb_fn *h = g ? g : f;
  nb_tensor *o[2][1 + MX_MAX_IN];
  mx_call(what, "unsharded", h, xs, o[0]);
  char part[(MX_MAX_IN + 1) * 100 + 32] = "sharded";
  for (int k = 0; k < r->n_in + (g != NULL); k++)
    snprintf(part + strlen(part), sizeof part - strlen(part), " [%s]", specs[k]);
  mx_call(what, part, h, sx, o[1]);
  for (int j = 0; j < n_out; j++) {
    if (j == 0) /* (a cotangent may be computed from the plain cotangent seed alone) */
      cr_assert(r->flags & MX_SMAP ? nb_mesh_of(o[1][j]) != NULL : nb_mesh_of(o[1][j]) == m,
                "%s: %s: the output is not on the mesh", what, part);
    double *u = mx_read(what, "unsharded", o[0][j]), *v = mx_read(what, part, o[1][j]);
    for (int64_t i = 0; i < nb_numel(o[0][j]); i++)
      cr_assert(fabs(u[i] - v[i]) <= 1e-10 * (1 + fabs(u[i])) || (isnan(u[i]) && isnan(v[i])),
                "%s: %s on %s: output %d element %lld: unsharded %.17g, sharded %.17g", what, part,
                meshes[mi], j, (long long)i, u[i], v[i]);
    free(u);
    free(v);
  }
  nb_fn_release(g);
  nb_fn_release(f);
  nb_mesh_release(m);
}

static void mx_check_sharded(const mx_row *r, const char *what) {
  for (int mi = 0; mi < 4; mi++) {
    nb_scope_begin();
    mx_check_sharded_on(r, what, mi);
    nb_scope_end();
  }
}

/* Whether row r calls a custom op with a CPU kernel only: on a GPU default device
 * (tc_on_gpu) such a call is an eager NB_ERR_DEVICE by design (test_custom.c), so
 * those rows skip there. */
static bool mx_cpu_only(const mx_row *r) {
  return tc_on_gpu() && (r->body == b_custom || r->body == b_custom_default_batching);
}

static void mx_check(int row, int check) {
  const mx_row *r = &mx_rows[row];
  if (mx_cpu_only(r)) cr_skip_test("row %s: its custom op has no CUDA kernel", r->name);
  char what[96];
  snprintf(what, sizeof what, "row %s (check %s)", r->name, mx_check_names[check]);
  switch (check) {
  case MX_JIT: mx_check_jit(r, what); break;
  case MX_GRAD: mx_check_grad(r, what); break;
  case MX_VMAP: mx_check_vmap(r, what); break;
  case MX_VMAP_VJP: mx_check_vmap_vjp(r, what); break;
  case MX_JAC: mx_check_jac(r, what); break;
  case MX_FUSED: mx_check_fused(r, what); break;
  case MX_SHARDED: mx_check_sharded(r, what); break;
  default: mx_check_jit_vmap_grad(r, what); break;
  }
}

#define MX_TESTS(name, ...)                                                                        \
  Test(matrix, name##_jit) { mx_check(MX_ROW_##name, MX_JIT); }                                    \
  Test(matrix, name##_grad) { mx_check(MX_ROW_##name, MX_GRAD); }                                  \
  Test(matrix, name##_vmap) { mx_check(MX_ROW_##name, MX_VMAP); }                                  \
  Test(matrix, name##_vmap_vjp) { mx_check(MX_ROW_##name, MX_VMAP_VJP); }                          \
  Test(matrix, name##_jac) { mx_check(MX_ROW_##name, MX_JAC); }                                    \
  Test(matrix, name##_jit_vmap_grad) { mx_check(MX_ROW_##name, MX_JIT_VMAP_GRAD); }                \
  Test(matrix, name##_fused) { mx_check(MX_ROW_##name, MX_FUSED); }                                \
  Test(matrix, name##_sharded) { mx_check(MX_ROW_##name, MX_SHARDED); }
MX_ROWS(MX_TESTS)
#undef MX_TESTS

/* ---- the table itself ----------------------------------------------------------------- */
/* Marks the op of every node reachable from t (pending graphs keep their inputs). */
/* Marks the ops of program p and of the programs its nodes nest. */
static void mx_walk_program(const nbi_program *p, bool *seen, int depth) {
  for (int i = 0; i < p->n_nodes && depth < 16; i++) {
    const nbi_prog_node *pn = &p->nodes[i];
    seen[pn->op] = true;
    const nbi_program *sub[2];
    int ns = pn->payload && nbi_op_table[pn->op]->programs
                 ? nbi_op_table[pn->op]->programs(pn->payload, sub)
                 : 0;
    for (int k = 0; k < ns; k++)
      mx_walk_program(sub[k], seen, depth + 1);
  }
}

/* Marks every op of t's graph, and of the programs its nodes run (bodies of
 * checkpoint, control flow, shard_map). */
static void mx_walk(nb_tensor *t, bool *seen) {
  int n = 0, cap = 64, nv = 0, capv = 64;
  nb_tensor **stack = malloc(sizeof *stack * (size_t)cap),
            **vis = malloc(sizeof *vis * (size_t)capv);
  stack[n++] = t;
  while (n) {
    nb_tensor *c = stack[--n];
    bool done = false;
    for (int i = 0; i < nv && !done; i++)
      done = vis[i] == c;
    if (done) continue;
    if (nv == capv) vis = realloc(vis, sizeof *vis * (size_t)(capv *= 2));
    vis[nv++] = c;
    seen[c->op] = true;
    const nbi_program *sub[2];
    int ns = c->payload && nbi_op_table[c->op]->programs
                 ? nbi_op_table[c->op]->programs(c->payload, sub)
                 : 0;
    for (int k = 0; k < ns; k++)
      mx_walk_program(sub[k], seen, 0);
    for (int k = 0; k < c->n_in; k++) {
      if (n == cap) stack = realloc(stack, sizeof *stack * (size_t)(cap *= 2));
      stack[n++] = c->in[k];
    }
  }
  free(stack);
  free(vis);
}

/* Primitives no public function records directly: each is reached through the
 * derivative of its forward op's row (or, for identity, by every transform's
 * trace), so the coverage check finds it in that row's vjp/jvp graph. */
static const struct {
  int op, via; /* via: the forward op whose rules record it; -1: the transforms */
} mx_internal[] = {
    {NBI_OP_SCATTER_ADD_ALONG_AXIS, NBI_OP_TAKE_ALONG_AXIS},
    {NBI_OP_CONV2D_BWD_DATA, NBI_OP_CONV2D},
    {NBI_OP_CONV2D_BWD_FILTER, NBI_OP_CONV2D},
    {NBI_OP_MAX_POOL2D_BWD, NBI_OP_MAX_POOL2D},
    {NBI_OP_MAX_POOL2D_SELECT, NBI_OP_MAX_POOL2D},
    {NBI_OP_IDENTITY, -1},
};

Test(matrix, every_op_has_a_row) {
  bool fwd[NBI_OP_COUNT] = {0}, der[NBI_OP_COUNT] = {0};
  for (int i = 0; i < MX_N_ROWS; i++) {
    const mx_row *r = &mx_rows[i];
    uint64_t seed = mx_seed(r, 7);
    if (mx_cpu_only(r)) { /* CUSTOM stays covered by the CPU run of this test */
      fwd[NBI_OP_CUSTOM] = der[NBI_OP_CUSTOM] = true;
      continue;
    }
    nb_scope_begin();
    nb_tensor *xs[MX_MAX_ARGS], *y[1], *out[MX_MAX_ARGS];
    mx_example(r, &seed, xs);
    nb_fn *f = mx_fn(r);
    mx_call(r->name, "forward", f, xs, y);
    mx_walk(y[0], fwd);
    /* traced, ops such as checkpoint's record their node (eagerly they just run) */
    nb_fn *h = nb_jvp_fn(f);
    for (int k = 0; k < r->n_in; k++)
      xs[r->n_in + k] = mx_like(xs[k], &seed);
    mx_call(r->name, "jvp", h, xs, out);
    mx_walk(out[0], fwd);
    nb_fn_release(h);
    if (!(r->flags & MX_ND)) {
      mx_walk(out[1], der);
      if (!(r->flags & MX_FWD)) {
        nb_fn *g = nb_vjp_fn(f);
        xs[r->n_in] = mx_like(y[0], &seed);
        mx_call(r->name, "vjp", g, xs, out);
        for (int k = 0; k < r->n_in; k++)
          mx_walk(out[1 + k], der);
        nb_fn_release(g);
      }
    }
    nb_fn_release(f);
    nb_scope_end();
  }
  for (int op = 0; op < NBI_OP_COUNT; op++) {
    const char *name = nbi_op_table[op]->name;
    if (op == NBI_OP_CONST || op == NBI_OP_PLACEHOLDER || op == NBI_OP_TUPLE_GET) continue;
    int internal = -1;
    for (size_t i = 0; i < sizeof mx_internal / sizeof mx_internal[0]; i++)
      if (mx_internal[i].op == op) internal = (int)i;
    if (internal < 0) {
      cr_expect(fwd[op], "op %s occurs in no row of test_matrix.c's table: add a row", name);
      continue;
    }
    int via = mx_internal[internal].via;
    cr_expect(der[op], "internal op %s occurs in no derivative graph of the table's rows", name);
    cr_expect(via < 0 || fwd[via], "internal op %s: no row has its forward op %s", name,
              via < 0 ? "" : nbi_op_table[via]->name);
  }
}

Test(matrix, every_op_has_a_batching_rule) {
  for (int op = 0; op < NBI_OP_COUNT; op++) {
    const nbi_op_def *d = nbi_op_table[op];
    if (op == NBI_OP_CONST || op == NBI_OP_PLACEHOLDER || op == NBI_OP_TUPLE_GET) continue;
    if (d->flags & NBI_OPF_MULTI)
      cr_expect(d->vmap_multi != NULL, "multi-output op %s has no batching rule (.vmap_multi)",
                d->name);
    else
      cr_expect(d->vmap != NULL, "op %s has no batching rule (.vmap)", d->name);
  }
}
