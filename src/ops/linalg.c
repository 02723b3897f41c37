/* src/ops/linalg.c — linear algebra: matmul. */
#include "../backends/cpu/k_linalg.h"

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

const nbi_op_def nbi_opdef_MATMUL = {
    .name = "matmul", .arity = 2, .cpu = nbi_cpu_matmul, .view = NULL};
