/* src/ops/linalg.c — linear algebra: matmul. */
#include "../core/nbi.h"
#include "../core/oprules.h"

#include "rule_util.h"

/* Records "nb_matmul: <what>: [a] @ [b]" as a shape error; returns NULL. */
static nb_tensor *matmul_shape_error(const char *what, nb_shape sa, nb_shape sb) {
  char ba[160], bb[160];
  nbi_error(NB_ERR_SHAPE, "nb_matmul: %s: %s @ %s", what, nb_shape_str(sa, ba, sizeof ba),
            nb_shape_str(sb, bb, sizeof bb));
  return NULL;
}

/* NumPy matmul. a [..., M, K] or [K], b [..., K, N] or [K]; batch dims broadcast;
 * result [batch..., M, N] without M (N) when a (b) is 1-D, in the promoted dtype.
 * MATMUL has no attributes: the kernel reads the 1-D cases from its inputs. */
nb_tensor *nb_matmul(nb_tensor *a, nb_tensor *b) {
  if (nbi_any_null("nb_matmul", (nb_tensor *[]){a, b}, 2)) return NULL;
  nb_shape sa = nb_shape_of(a), sb = nb_shape_of(b);
  if (sa.ndim == 0 || sb.ndim == 0)
    return matmul_shape_error("operands must be at least 1-D", sa, sb);
  int64_t ka = sa.dims[sa.ndim - 1], kb = sb.ndim == 1 ? sb.dims[0] : sb.dims[sb.ndim - 2];
  if (ka != kb) return matmul_shape_error("inner dimensions differ", sa, sb);
  nb_shape batch_a = {.ndim = sa.ndim > 2 ? sa.ndim - 2 : 0};
  nb_shape batch_b = {.ndim = sb.ndim > 2 ? sb.ndim - 2 : 0};
  memcpy(batch_a.dims, sa.dims, (size_t)batch_a.ndim * sizeof(int64_t));
  memcpy(batch_b.dims, sb.dims, (size_t)batch_b.ndim * sizeof(int64_t));
  nb_shape out = {.ndim = batch_a.ndim > batch_b.ndim ? batch_a.ndim : batch_b.ndim};
  for (int i = 0; i < out.ndim; i++) {
    int ia = batch_a.ndim - out.ndim + i, ib = batch_b.ndim - out.ndim + i;
    int64_t da = ia >= 0 ? batch_a.dims[ia] : 1, db = ib >= 0 ? batch_b.dims[ib] : 1;
    if (da != db && da != 1 && db != 1)
      return matmul_shape_error("batch dimensions do not broadcast", sa, sb);
    out.dims[i] = da == 1 ? db : da;
  }
  if (sa.ndim > 1) out.dims[out.ndim++] = sa.dims[sa.ndim - 2];
  if (sb.ndim > 1) out.dims[out.ndim++] = sb.dims[sb.ndim - 1];
  if (nbi_check_shape("nb_matmul", &out)) return NULL;
  nb_dtype dt = nb_promote_types(nb_dtype_of(a), nb_dtype_of(b));
  return nbi_record(NBI_OP_MATMUL, dt, &out, (nb_tensor *[]){a, b}, 2, NULL);
}

/* ---- autodiff rules ---------------------------------------------------------------- */

/* x as a matrix operand: itself when it has rank >= 2, else the 1-D [K] as
 * [1, K] (left operand) or [K, 1] (right operand), as NumPy promotes it. */
static nb_tensor *as_matrix(nb_tensor *x, bool left) {
  if (x->shape.ndim >= 2) return x;
  int64_t k = x->shape.dims[0];
  return nb_reshape(x, left ? (nb_shape){.ndim = 2, .dims = {1, k}}
                            : (nb_shape){.ndim = 2, .dims = {k, 1}});
}

/* y = a @ b, seen with matrix operands A [..., M, K], B [..., K, N] (as_matrix)
 * and G = gy as [batch..., M, N] (the dims a 1-D operand dropped put back):
 *   gA = G @ B^T [batch..., M, K],  gB = A^T @ G [batch..., K, N],
 * each summed over the batch dims its operand broadcast and cast to its dtype
 * (nbi_grad_fit). A 1-D a has gA [batch..., 1, K], which sums straight to [K];
 * a 1-D b has gB [batch..., K, 1], whose last dim goes before summing. */
static nb_status matmul_vjp(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin) {
  nb_tensor *a = y->in[0], *b = y->in[1];
  nb_shape gs = y->shape;
  if (b->shape.ndim == 1) gs.dims[gs.ndim++] = 1;
  if (a->shape.ndim == 1) { /* [..., N] -> [..., 1, N] */
    gs.dims[gs.ndim] = gs.dims[gs.ndim - 1];
    gs.dims[gs.ndim - 1] = 1;
    gs.ndim++;
  }
  nb_tensor *g = nb_reshape(gy, gs);
  if (need[0]) {
    gin[0] = nbi_grad_fit(nb_matmul(g, nb_transpose(as_matrix(b, false))), a);
    if (!gin[0]) return nb_last_status();
  }
  if (need[1]) {
    nb_tensor *gb = nb_matmul(nb_transpose(as_matrix(a, true)), g);
    if (gb && b->shape.ndim == 1) {
      nb_shape s = gb->shape;
      s.ndim--;
      gb = nb_reshape(gb, s);
    }
    gin[1] = nbi_grad_fit(gb, b);
    if (!gin[1]) return nb_last_status();
  }
  return NB_OK;
}

/* ty = ta @ b + a @ tb (missing tangents are zero). */
static nb_tensor *matmul_jvp(nb_tensor *y, nb_tensor *const *tin) {
  nb_tensor *l = tin[0] ? nb_matmul(tin[0], y->in[1]) : NULL;
  nb_tensor *r = tin[1] ? nb_matmul(y->in[0], tin[1]) : NULL;
  if ((tin[0] && !l) || (tin[1] && !r)) return NULL;
  return nbi_add_maybe(l, r);
}

/* ---- batching rule ----------------------------------------------------------------- */

/* One matmul for the whole batch, never a loop over it:
 * - a batched against a shared matrix b [K, N]: every row of every example
 *   is a row of one product, (B*...*M, K) @ b, reshaped to (B, *y);
 * - a batched 1-D operand (B, K) against a shared one: the examples are the
 *   rows (a) or the columns (b) of one product, (B, K) @ b -> [..., B, N] or
 *   a @ (K, B) -> [..., M, B], and the batch dim moves to the front;
 * - otherwise a batched 1-D operand becomes the matrix (B, 1, K) (a) or
 *   (B, K, 1) (b), and each batched operand gets singleton dims after its
 *   batch dim until it has as many leading dims as the wider operand
 *   (nbi_bat_align): B then lines up with B (or with nothing, where a shared
 *   operand broadcasts along it) and each example's leading dims broadcast
 *   right-aligned as they do unbatched. The size-1 dims the 1-D promotion
 *   added go in the final reshape to (B, *y). */
static nb_tensor *matmul_vmap(nb_tensor *y, nb_tensor *const *bin, const bool *batched, int64_t B) {
  int ra = y->in[0]->shape.ndim, rb = y->in[1]->shape.ndim;
  nb_tensor *a = bin[0], *b = bin[1];
  int64_t k = y->in[0]->shape.dims[ra - 1];
  nb_shape s = {.ndim = y->shape.ndim + 1, .dims = {B}};
  memcpy(s.dims + 1, y->shape.dims, sizeof(int64_t) * (size_t)y->shape.ndim);
  if (batched[0] && !batched[1] && rb == 2) {
    nb_shape rows = {.ndim = 2, .dims = {1, k}};
    for (int d = 0; d < a->shape.ndim - 1; d++)
      rows.dims[0] *= a->shape.dims[d];
    return nb_reshape(nb_matmul(nb_reshape(a, rows), b), s);
  }
  if (batched[0] && !batched[1] && ra == 1)
    return nbi_bat_moveaxis(nb_matmul(a, b), rb >= 2 ? rb - 2 : 0, 0);
  if (batched[1] && !batched[0] && rb == 1)
    return nbi_bat_moveaxis(nb_matmul(a, nb_transpose(b)), ra >= 2 ? ra - 1 : 0, 0);
  if (batched[0] && ra == 1) a = nb_reshape(a, (nb_shape){.ndim = 3, .dims = {B, 1, k}});
  if (batched[1] && rb == 1) b = nb_reshape(b, (nb_shape){.ndim = 3, .dims = {B, k, 1}});
  int lead = (ra > rb ? ra : rb) - 2; /* leading dims of the wider operand */
  if (lead < 0) lead = 0;
  nb_tensor *r =
      nb_matmul(nbi_bat_align(a, batched[0], lead + 2), nbi_bat_align(b, batched[1], lead + 2));
  return r ? nb_reshape(r, s) : NULL;
}

const nbi_op_def nbi_opdef_MATMUL = {.name = "matmul",
                                     .arity = 2,
                                     .view = NULL,
                                     .vjp = matmul_vjp,
                                     .jvp = matmul_jvp,
                                     .vmap = matmul_vmap};
