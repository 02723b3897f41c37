/* test/test_grad_shape.c — autodiff rules of the shape, index and linalg
 * primitives (reshape, permute, broadcast_to, slice, concat, pad, flip, take,
 * take_along_axis, scatter_add, scatter_add_along_axis, matmul) and of the
 * composites built from them (squeeze, transpose, stack, split, tile, repeat,
 * einsum). Each case runs tc_check_grad twice with TC_SECOND: on y = op(x),
 * and on y = op(x)^2, whose Hessian applies the derivative of each rule's own
 * graph (for a linear op alone the gradient does not depend on x, so its
 * second derivative would never reach the rule's rules). */
#include "../src/ops/index.h"
#include "../src/core/oprules.h"
#include "grad_check.h"

TestSuite(grad_shape, .init = tc_setup, .fini = tc_teardown);

/* ---- cases ------------------------------------------------------------------------ */

/* One function under test: apply() maps the differentiated inputs to y, reading
 * its static arguments from the case (integer indices are captured here, as
 * constants). square turns y into y * y. */
typedef struct op_case op_case;
struct op_case {
  nb_tensor *(*apply)(const op_case *c, nb_tensor *const *in, int n_in);
  bool square;
  int axis;
  nb_shape shape;
  nb_axes axes;
  int64_t starts[NB_MAX_DIMS], stops[NB_MAX_DIMS], steps[NB_MAX_DIMS];
  int64_t pads[2 * NB_MAX_DIMS];
  double value;
  nb_tensor *idx;
  const char *spec;
};

static nb_status case_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)n_out;
  const op_case *c = user;
  nb_tensor *y = c->apply(c, in, n_in);
  if (y && c->square) y = nb_mul(y, y);
  out[0] = y;
  return y ? NB_OK : nb_last_status();
}

/* Checks first and second derivatives of c at xs, as is and squared. */
static void check_case(const char *what, op_case c, int n_in, nb_tensor *const *xs) {
  char name[200];
  c.square = false;
  tc_check_grad(what, case_body, &c, n_in, xs, TC_SECOND);
  snprintf(name, sizeof name, "%s, squared", what);
  c.square = true;
  tc_check_grad(name, case_body, &c, n_in, xs, TC_SECOND);
}

/* An index tensor of dtype dt holding v (shape s). */
static nb_tensor *index_tensor(const int64_t *v, nb_shape s, nb_dtype dt) {
  double x[64];
  int64_t n = tc_numel(s);
  cr_assert(n <= 64);
  for (int64_t i = 0; i < n; i++)
    x[i] = (double)v[i];
  return tc_tensor(x, s, dt);
}

static nb_tensor *apply_reshape(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_reshape(in[0], c->shape);
}
static nb_tensor *apply_permute(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_permute(in[0], c->axes);
}
static nb_tensor *apply_broadcast(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_broadcast_to(in[0], c->shape);
}
static nb_tensor *apply_slice(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_slice(in[0], c->starts, c->stops, c->steps);
}
static nb_tensor *apply_concat(const op_case *c, nb_tensor *const *in, int n) {
  return nb_concat(in, n, c->axis);
}
static nb_tensor *apply_pad(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_pad(in[0], c->pads, c->value);
}
static nb_tensor *apply_flip(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_flip(in[0], c->axes);
}
static nb_tensor *apply_take(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_take(in[0], c->idx, c->axis);
}
static nb_tensor *apply_take_along(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_take_along_axis(in[0], c->idx, c->axis);
}
static nb_tensor *apply_scatter(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_scatter_add(in[0], c->idx, in[1], c->axis);
}
static nb_tensor *apply_scatter_along(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nbi_scatter_add_along_axis(in[0], c->idx, in[1], c->axis);
}
static nb_tensor *apply_matmul(const op_case *c, nb_tensor *const *in, int n) {
  (void)c;
  (void)n;
  return nb_matmul(in[0], in[1]);
}

/* ---- shape primitives -------------------------------------------------------------- */

Test(grad_shape, reshape_with_inferred_dim) {
  uint64_t seed = 1;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 3, 4), -1, 1, &seed);
  check_case("reshape [2,3,4] -> [4,-1]",
             (op_case){.apply = apply_reshape, .shape = NB_SHAPE(4, -1)}, 1, &x);
  check_case("reshape [2,3,4] -> [-1]", (op_case){.apply = apply_reshape, .shape = NB_SHAPE(-1)}, 1,
             &x);
}

Test(grad_shape, reshape_to_and_from_0d) {
  uint64_t seed = 2;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(1, 1), -1, 1, &seed);
  check_case("reshape [1,1] -> 0-d", (op_case){.apply = apply_reshape, .shape = NB_SCALAR_SHAPE}, 1,
             &x);
  nb_tensor *s = tc_rand_f64(NB_SCALAR_SHAPE, -1, 1, &seed);
  check_case("reshape 0-d -> [1,1,1]",
             (op_case){.apply = apply_reshape, .shape = NB_SHAPE(1, 1, 1)}, 1, &s);
}

Test(grad_shape, reshape_random_shapes) {
  uint64_t seed = 3;
  for (int rep = 0; rep < 4; rep++) {
    nb_shape s = tc_rand_shape(&seed, 0, 4, 1, 3);
    nb_tensor *x = tc_rand_f64(s, -1, 1, &seed);
    int64_t n = tc_numel(s);
    nb_shape to = n % 2 == 0 ? NB_SHAPE(2, -1) : NB_SHAPE(-1, 1);
    check_case("reshape random", (op_case){.apply = apply_reshape, .shape = to}, 1, &x);
  }
}

Test(grad_shape, permute_3d_every_order) {
  uint64_t seed = 4;
  static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (int p = 0; p < 6; p++) {
    nb_shape s = tc_rand_shape(&seed, 3, 3, 1, 4);
    nb_tensor *x = tc_rand_f64(s, -1, 1, &seed);
    op_case c = {.apply = apply_permute, .axes = NB_AXES(perms[p][0], perms[p][1], perms[p][2])};
    check_case("permute 3-d", c, 1, &x);
  }
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 3, 4), -1, 1, &seed);
  check_case("permute with negative axes",
             (op_case){.apply = apply_permute, .axes = NB_AXES(-1, 0, -2)}, 1, &x);
}

Test(grad_shape, broadcast_to_added_and_stretched_dims) {
  uint64_t seed = 5;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(3, 1), -1, 1, &seed);
  check_case("broadcast [3,1] -> [2,3,4]",
             (op_case){.apply = apply_broadcast, .shape = NB_SHAPE(2, 3, 4)}, 1, &x);
  nb_tensor *s = tc_rand_f64(NB_SCALAR_SHAPE, -1, 1, &seed);
  check_case("broadcast 0-d -> [2,3]", (op_case){.apply = apply_broadcast, .shape = NB_SHAPE(2, 3)},
             1, &s);
  nb_tensor *y = tc_rand_f64(NB_SHAPE(1, 4, 1), -1, 1, &seed);
  check_case("broadcast [1,4,1] -> [3,4,2]",
             (op_case){.apply = apply_broadcast, .shape = NB_SHAPE(3, 4, 2)}, 1, &y);
  check_case("broadcast to its own shape",
             (op_case){.apply = apply_broadcast, .shape = NB_SHAPE(1, 4, 1)}, 1, &y);
}

/* One slice case on x [7, 6]. */
static void check_slice_2d(const char *what, nb_tensor *x, int64_t b0, int64_t e0, int64_t s0,
                           int64_t b1, int64_t e1, int64_t s1) {
  op_case c = {.apply = apply_slice, .starts = {b0, b1}, .stops = {e0, e1}, .steps = {s0, s1}};
  check_case(what, c, 1, &x);
}

Test(grad_shape, slice_steps_1_2_neg1_neg2) {
  uint64_t seed = 6;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(7, 6), -1, 1, &seed);
  check_slice_2d("slice [1:5, 2:]", x, 1, 5, 1, 2, NB_END, 1);
  check_slice_2d("slice [::2, 1::2]", x, 0, NB_END, 2, 1, NB_END, 2);
  check_slice_2d("slice [::-1, 4:0:-1]", x, NB_END, NB_END, -1, 4, 0, -1);
  check_slice_2d("slice [5::-2, ::-2]", x, 5, NB_END, -2, -1, NB_END, -2);
  check_slice_2d("slice [1:6:3, -2:-7:-3]", x, 1, 6, 3, -2, -7, -3);
  check_slice_2d("slice [2:3, 1:2] (one element)", x, 2, 3, 1, 1, 2, 1);
  check_slice_2d("slice [6:5:-2, 3:5:4] (count 1, steps -2 and 4)", x, 6, 5, -2, 3, 5, 4);
}

Test(grad_shape, slice_empty_results) {
  uint64_t seed = 7;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(7, 6), -1, 1, &seed);
  check_slice_2d("slice [3:3, :] (empty)", x, 3, 3, 1, 0, NB_END, 1);
  check_slice_2d("slice [:, 2:5:-1] (empty)", x, 0, NB_END, 1, 2, 5, -1);
}

Test(grad_shape, slice_3d_random_steps) {
  uint64_t seed = 8;
  static const int64_t steps[] = {1, 2, -1, -2, 3};
  for (int rep = 0; rep < 5; rep++) {
    nb_shape s = tc_rand_shape(&seed, 3, 3, 3, 5);
    nb_tensor *x = tc_rand_f64(s, -1, 1, &seed);
    op_case c = {.apply = apply_slice};
    for (int d = 0; d < 3; d++) { /* every step on every axis over the 5 reps */
      c.steps[d] = steps[(rep + 2 * d) % 5];
      c.starts[d] = tc_randint(&seed, -s.dims[d], s.dims[d] - 1);
      c.stops[d] = tc_randint(&seed, 0, 1) ? NB_END : tc_randint(&seed, -s.dims[d], s.dims[d]);
    }
    check_case("slice 3-d random", c, 1, &x);
  }
}

Test(grad_shape, concat_three_tensors) {
  uint64_t seed = 9;
  nb_tensor *xs[3] = {tc_rand_f64(NB_SHAPE(2, 1, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 3, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 2, 3), -1, 1, &seed)};
  check_case("concat axis 1", (op_case){.apply = apply_concat, .axis = 1}, 3, xs);
  nb_tensor *ys[3] = {tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 1), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 2), -1, 1, &seed)};
  check_case("concat axis -1", (op_case){.apply = apply_concat, .axis = -1}, 3, ys);
  nb_tensor *zs[3] = {tc_rand_f64(NB_SHAPE(1, 2), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(0, 2), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(3, 2), -1, 1, &seed)};
  check_case("concat with an empty part", (op_case){.apply = apply_concat, .axis = 0}, 3, zs);
}

Test(grad_shape, pad) {
  uint64_t seed = 10;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(3, 2), -1, 1, &seed);
  check_case("pad [3,2] by (1,2),(0,3) with 1.5",
             (op_case){.apply = apply_pad, .pads = {1, 2, 0, 3}, .value = 1.5}, 1, &x);
  nb_tensor *y = tc_rand_f64(NB_SHAPE(2, 1, 3), -1, 1, &seed);
  check_case("pad 3-d", (op_case){.apply = apply_pad, .pads = {0, 1, 2, 0, 1, 1}}, 1, &y);
  nb_tensor *s = tc_rand_f64(NB_SCALAR_SHAPE, -1, 1, &seed);
  check_case("pad 0-d", (op_case){.apply = apply_pad}, 1, &s);
}

Test(grad_shape, flip) {
  uint64_t seed = 11;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 3, 4), -1, 1, &seed);
  check_case("flip axes 0, 2", (op_case){.apply = apply_flip, .axes = NB_AXES(0, 2)}, 1, &x);
  check_case("flip every axis", (op_case){.apply = apply_flip, .axes = NB_ALL}, 1, &x);
  check_case("flip axis -2", (op_case){.apply = apply_flip, .axes = NB_AXES(-2)}, 1, &x);
}

/* ---- indexing ---------------------------------------------------------------------- */

Test(grad_shape, take_2d_idx_with_negative_and_repeated_indices) {
  uint64_t seed = 12;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(3, 5, 2), -1, 1, &seed);
  const int64_t iv[] = {0, -1, 2, 4, -5, 2};
  nb_tensor *idx = index_tensor(iv, NB_SHAPE(2, 3), NB_I64);
  check_case("take axis 1, idx [2,3]", (op_case){.apply = apply_take, .axis = 1, .idx = idx}, 1,
             &x);
  const int64_t jv[] = {1, -2, 1};
  check_case(
      "take axis -1, i32 idx [3]",
      (op_case){.apply = apply_take, .axis = -1, .idx = index_tensor(jv, NB_SHAPE(3), NB_I32)}, 1,
      &x);
  nb_tensor *y = tc_rand_f64(NB_SHAPE(5), -1, 1, &seed);
  check_case(
      "take from 1-D, i32 idx [3,2]",
      (op_case){.apply = apply_take, .axis = 0, .idx = index_tensor(iv, NB_SHAPE(3, 2), NB_I32)}, 1,
      &y);
  nb_tensor *s = index_tensor(iv + 1, NB_SCALAR_SHAPE, NB_I64);
  check_case("take with a 0-d index", (op_case){.apply = apply_take, .axis = 1, .idx = s}, 1, &x);
}

Test(grad_shape, take_along_axis_broadcasting_idx) {
  uint64_t seed = 13;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(3, 4, 2), -1, 1, &seed);
  const int64_t iv[] = {0, 3, -1, 1, 1, 2, -4, 0};
  check_case("take_along_axis idx [1,4,2] on axis 1",
             (op_case){.apply = apply_take_along,
                       .axis = 1,
                       .idx = index_tensor(iv, NB_SHAPE(1, 4, 2), NB_I64)},
             1, &x);
  check_case("take_along_axis idx [3,2,1] on axis -2",
             (op_case){.apply = apply_take_along,
                       .axis = -2,
                       .idx = index_tensor(iv, NB_SHAPE(3, 2, 1), NB_I32)},
             1, &x);
  /* t broadcasts too: its size-1 dim 0 meets idx's 3 */
  nb_tensor *t = tc_rand_f64(NB_SHAPE(1, 4, 2), -1, 1, &seed);
  check_case("take_along_axis with t broadcast",
             (op_case){.apply = apply_take_along,
                       .axis = 1,
                       .idx = index_tensor(iv, NB_SHAPE(3, 2, 1), NB_I64)},
             1, &t);
}

Test(grad_shape, scatter_add_t_and_updates) {
  uint64_t seed = 14;
  const int64_t iv[] = {1, -1, 1, 0};
  nb_tensor *xs[2] = {tc_rand_f64(NB_SHAPE(4, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 2, 3), -1, 1, &seed)};
  check_case(
      "scatter_add axis 0, idx [2,2]",
      (op_case){.apply = apply_scatter, .axis = 0, .idx = index_tensor(iv, NB_SHAPE(2, 2), NB_I64)},
      2, xs);
  nb_tensor *ys[2] = {tc_rand_f64(NB_SHAPE(4, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(4, 4), -1, 1, &seed)};
  check_case(
      "scatter_add axis 1, i32 idx [4]",
      (op_case){.apply = apply_scatter, .axis = 1, .idx = index_tensor(iv, NB_SHAPE(4), NB_I32)}, 2,
      ys);
}

Test(grad_shape, scatter_add_along_axis_t_and_updates) {
  uint64_t seed = 15;
  const int64_t iv[] = {0, 2, 2, -1, 1, 0};
  nb_tensor *xs[2] = {tc_rand_f64(NB_SHAPE(3, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(3, 2), -1, 1, &seed)};
  check_case("scatter_add_along_axis axis 1",
             (op_case){.apply = apply_scatter_along,
                       .axis = 1,
                       .idx = index_tensor(iv, NB_SHAPE(3, 2), NB_I64)},
             2, xs);
  /* t [1,3] with idx [2,3] along axis 1: updates [2,3] sum into t's one row */
  nb_tensor *ys[2] = {tc_rand_f64(NB_SHAPE(1, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed)};
  check_case("scatter_add_along_axis with broadcast t",
             (op_case){.apply = apply_scatter_along,
                       .axis = 1,
                       .idx = index_tensor(iv, NB_SHAPE(2, 3), NB_I32)},
             2, ys);
}

/* ---- matmul ------------------------------------------------------------------------ */

static void check_matmul(const char *what, nb_shape sa, nb_shape sb, uint64_t seed) {
  nb_tensor *xs[2] = {tc_rand_f64(sa, -1, 1, &seed), tc_rand_f64(sb, -1, 1, &seed)};
  check_case(what, (op_case){.apply = apply_matmul}, 2, xs);
}

Test(grad_shape, matmul_1d_cases) {
  check_matmul("matmul [4] @ [4]", NB_SHAPE(4), NB_SHAPE(4), 16);
  check_matmul("matmul [4] @ [4,3]", NB_SHAPE(4), NB_SHAPE(4, 3), 17);
  check_matmul("matmul [3,4] @ [4]", NB_SHAPE(3, 4), NB_SHAPE(4), 18);
  check_matmul("matmul [3] @ [2,3,2]", NB_SHAPE(3), NB_SHAPE(2, 3, 2), 19);
  check_matmul("matmul [2,2,3] @ [3]", NB_SHAPE(2, 2, 3), NB_SHAPE(3), 20);
}

Test(grad_shape, matmul_2d_and_batched_broadcasting) {
  check_matmul("matmul [3,4] @ [4,2]", NB_SHAPE(3, 4), NB_SHAPE(4, 2), 21);
  check_matmul("matmul [2,1,3,4] @ [5,4,2]", NB_SHAPE(2, 1, 3, 4), NB_SHAPE(5, 4, 2), 22);
  check_matmul("matmul [1,2,3] @ [2,3,1]", NB_SHAPE(1, 2, 3), NB_SHAPE(2, 3, 1), 23);
}

Test(grad_shape, matmul_random_shapes) {
  uint64_t seed = 24;
  for (int rep = 0; rep < 4; rep++) {
    int64_t m = tc_randint(&seed, 1, 3), k = tc_randint(&seed, 1, 3), n = tc_randint(&seed, 1, 3);
    int64_t b = tc_randint(&seed, 1, 2);
    nb_shape sa = rep % 2 ? NB_SHAPE(b, m, k) : NB_SHAPE(m, k);
    nb_shape sb = rep / 2 ? NB_SHAPE(b, k, n) : NB_SHAPE(k, n);
    check_matmul("matmul random", sa, sb, seed + (uint64_t)rep);
  }
}

/* ---- composites through their primitives ------------------------------------------ */

static nb_tensor *apply_squeeze_unsqueeze(const op_case *c, nb_tensor *const *in, int n) {
  (void)c;
  (void)n;
  return nb_unsqueeze(nb_squeeze(in[0], NB_AXES(1)), -1);
}
static nb_tensor *apply_transpose(const op_case *c, nb_tensor *const *in, int n) {
  (void)c;
  (void)n;
  return nb_transpose(in[0]);
}
static nb_tensor *apply_stack(const op_case *c, nb_tensor *const *in, int n) {
  return nb_stack(in, n, c->axis);
}
/* split into sizes 1, 3, 2 along axis 1, put back together in another order */
static nb_tensor *apply_split(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  nb_tensor *parts[3];
  if (nb_split(in[0], (const int64_t[]){1, 3, 2}, 3, c->axis, parts)) return NULL;
  return nb_concat((nb_tensor *[]){parts[2], parts[0], parts[1]}, 3, c->axis);
}
static nb_tensor *apply_tile(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_tile(in[0], c->shape);
}
static nb_tensor *apply_repeat(const op_case *c, nb_tensor *const *in, int n) {
  (void)n;
  return nb_repeat(in[0], 3, c->axis);
}
static nb_tensor *apply_einsum(const op_case *c, nb_tensor *const *in, int n) {
  return nb_einsum(c->spec, in, n);
}

Test(grad_shape, squeeze_unsqueeze_transpose) {
  uint64_t seed = 25;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 1, 3), -1, 1, &seed);
  check_case("squeeze then unsqueeze", (op_case){.apply = apply_squeeze_unsqueeze}, 1, &x);
  check_case("transpose", (op_case){.apply = apply_transpose}, 1, &x);
}

Test(grad_shape, stack_split) {
  uint64_t seed = 26;
  nb_tensor *xs[3] = {tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed)};
  check_case("stack axis 1", (op_case){.apply = apply_stack, .axis = 1}, 3, xs);
  check_case("stack axis -1", (op_case){.apply = apply_stack, .axis = -1}, 3, xs);
  nb_tensor *y = tc_rand_f64(NB_SHAPE(2, 6), -1, 1, &seed);
  check_case("split", (op_case){.apply = apply_split, .axis = 1}, 1, &y);
}

Test(grad_shape, tile_repeat) {
  uint64_t seed = 27;
  nb_tensor *x = tc_rand_f64(NB_SHAPE(2, 3), -1, 1, &seed);
  check_case("tile (2, 1, 2)", (op_case){.apply = apply_tile, .shape = NB_SHAPE(2, 1, 2)}, 1, &x);
  check_case("repeat axis 0", (op_case){.apply = apply_repeat, .axis = 0}, 1, &x);
  check_case("repeat axis 1", (op_case){.apply = apply_repeat, .axis = 1}, 1, &x);
}

Test(grad_shape, einsum) {
  uint64_t seed = 28;
  nb_tensor *ab[2] = {tc_rand_f64(NB_SHAPE(2, 3, 4), -1, 1, &seed),
                      tc_rand_f64(NB_SHAPE(2, 2, 4), -1, 1, &seed)};
  check_case("einsum bij,bkj->bik", (op_case){.apply = apply_einsum, .spec = "bij,bkj->bik"}, 2,
             ab);
  nb_tensor *sq = tc_rand_f64(NB_SHAPE(3, 3), -1, 1, &seed);
  check_case("einsum ii-> (trace)", (op_case){.apply = apply_einsum, .spec = "ii->"}, 1, &sq);
  check_case("einsum ij->ji", (op_case){.apply = apply_einsum, .spec = "ij->ji"}, 1, &sq);
}

/* ---- dtypes and the op table ------------------------------------------------------- */

/* sum(a[::-1] @ b)^2 with a slice, a flip and a concat on the way */
static nb_status f32_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out, int n_out) {
  (void)user;
  (void)n_in;
  (void)n_out;
  nb_tensor *a = nb_slice(in[0], (const int64_t[]){NB_END, 0}, (const int64_t[]){NB_END, NB_END},
                          (const int64_t[]){-1, 1});
  nb_tensor *b = nb_concat((nb_tensor *[]){in[1], nb_flip(in[1], NB_ALL)}, 2, 1);
  nb_tensor *m = nb_matmul(a, b);
  out[0] = nb_sum(nb_mul(m, m), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_shape, f32_inputs_give_f32_gradients) {
  uint64_t seed = 29;
  double av[12], bv[8];
  tc_fill(av, 12, -1, 1, &seed);
  tc_fill(bv, 8, -1, 1, &seed);
  nb_tensor *xs32[2] = {tc_tensor(av, NB_SHAPE(3, 4), NB_F32),
                        tc_tensor(bv, NB_SHAPE(4, 2), NB_F32)};
  nb_tensor *xs64[2] = {tc_tensor(av, NB_SHAPE(3, 4), NB_F64),
                        tc_tensor(bv, NB_SHAPE(4, 2), NB_F64)};
  tc_round_to(av, 12, NB_F32);
  tc_round_to(bv, 8, NB_F32);
  nb_fn *f = nb_fn_create(f32_body, NULL, 2, 1);
  nb_fn *g = nb_grad(f, NB_ALL);
  cr_assert(g, "%s", nb_last_error());
  nb_tensor *g32[2], *g64[2];
  cr_assert_eq(nb_call(g, xs32, g32), NB_OK, "%s", nb_last_error());
  cr_assert_eq(nb_call(g, xs64, g64), NB_OK, "%s", nb_last_error());
  for (int k = 0; k < 2; k++) {
    tc_assert_like("f32 gradient", g32[k], xs32[k]);
    double *want = tc_read(g64[k]);
    tc_assert_close_tol(g32[k], want, nb_shape_of(xs32[k]), 1e-4);
    free(want);
  }
  nb_fn_release(g);
  nb_fn_release(f);
}

/* concat of an f32 and an f64 tensor is f64; each gradient keeps its input's dtype */
static nb_status mixed_body(void *user, nb_tensor *const *in, int n_in, nb_tensor **out,
                            int n_out) {
  (void)user;
  (void)n_in;
  (void)n_out;
  nb_tensor *c = nb_concat(in, 2, 0);
  out[0] = nb_sum(nb_mul(c, c), NB_ALL, false);
  return out[0] ? NB_OK : nb_last_status();
}

Test(grad_shape, concat_of_mixed_dtypes_keeps_each_dtype) {
  const double av[] = {1, -2, 3}, bv[] = {0.5, 4};
  nb_tensor *xs[2] = {tc_tensor(av, NB_SHAPE(3), NB_F32), tc_tensor(bv, NB_SHAPE(2), NB_F64)};
  nb_fn *f = nb_fn_create(mixed_body, NULL, 2, 1);
  nb_fn *g = nb_grad(f, NB_ALL);
  nb_tensor *gs[2];
  cr_assert_eq(nb_call(g, xs, gs), NB_OK, "%s", nb_last_error());
  tc_assert_like("f32 part", gs[0], xs[0]);
  tc_assert_like("f64 part", gs[1], xs[1]);
  tc_assert_close(gs[0], (const double[]){2, -4, 6}, NB_SHAPE(3));
  tc_assert_close(gs[1], (const double[]){1, 8}, NB_SHAPE(2));
  nb_fn_release(g);
  nb_fn_release(f);
}

Test(grad_shape, op_table_has_rules_or_is_nondiff) {
  static const int ops[] = {
      NBI_OP_RESHAPE,
      NBI_OP_PERMUTE,
      NBI_OP_BROADCAST_TO,
      NBI_OP_SLICE,
      NBI_OP_CONCAT,
      NBI_OP_PAD,
      NBI_OP_FLIP,
      NBI_OP_TAKE,
      NBI_OP_TAKE_ALONG_AXIS,
      NBI_OP_SCATTER_ADD,
      NBI_OP_SCATTER_ADD_ALONG_AXIS,
      NBI_OP_ONE_HOT,
      NBI_OP_MATMUL,
  };
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    const nbi_op_def *d = nbi_op_table[ops[k]];
    bool nondiff = d->flags & NBI_OPF_NONDIFF;
    cr_assert(nondiff ? !d->vjp && !d->jvp : d->vjp && d->jvp, "op %s: vjp %p, jvp %p, flags %u",
              d->name, (void *)d->vjp, (void *)d->jvp, d->flags);
  }
  cr_assert(nbi_op_table[NBI_OP_ONE_HOT]->flags & NBI_OPF_NONDIFF);
}
