/* src/backends/cpu/kernels.c — the CPU backend's kernel table: which kernel
 * computes each op of ops.def, and the vtable's supports / run_op over it.
 *
 * Op records (src/ops) describe the math only; this table is where the CPU
 * says how it computes an op. Every op needs a K_<ID> row below (the X-macro
 * expansion fails to compile otherwise), so a new op cannot be left out by
 * accident. NULL rows are ops no CPU kernel computes: constants and
 * placeholders (never computed), views that always succeed (identity,
 * stop_gradient, tuple_get, sharding constraints: NBI_OPF_NO_KERNEL), and the
 * ops core runs itself on any device (nbi_op_def.exec: device moves, control
 * flow, checkpoint, custom calls, shard_map, collectives). */
#include "cpu.h"
#include "../../core/oprules.h"
#include "k_elementwise.h"
#include "k_index.h"
#include "k_linalg.h"
#include "k_nn.h"
#include "k_random.h"
#include "k_reduce.h"
#include "k_shape.h"

/* clang-format off */
#define K_CONST NULL
/* elementwise (k_elementwise.c): one kernel reads the op from the node */
#define K_NEG nbi_cpu_elementwise
#define K_ABS nbi_cpu_elementwise
#define K_SIGN nbi_cpu_elementwise
#define K_EXP nbi_cpu_elementwise
#define K_EXPM1 nbi_cpu_elementwise
#define K_LOG nbi_cpu_elementwise
#define K_LOG1P nbi_cpu_elementwise
#define K_SQRT nbi_cpu_elementwise
#define K_RSQRT nbi_cpu_elementwise
#define K_SQUARE nbi_cpu_elementwise
#define K_SIN nbi_cpu_elementwise
#define K_COS nbi_cpu_elementwise
#define K_TAN nbi_cpu_elementwise
#define K_TANH nbi_cpu_elementwise
#define K_SIGMOID nbi_cpu_elementwise
#define K_RELU nbi_cpu_elementwise
#define K_GELU nbi_cpu_elementwise
#define K_SILU nbi_cpu_elementwise
#define K_SOFTPLUS nbi_cpu_elementwise
#define K_ERF nbi_cpu_elementwise
#define K_FLOOR nbi_cpu_elementwise
#define K_CEIL nbi_cpu_elementwise
#define K_ROUND nbi_cpu_elementwise
#define K_RECIPROCAL nbi_cpu_elementwise
#define K_LOGICAL_NOT nbi_cpu_elementwise
#define K_CAST nbi_cpu_cast
#define K_ADD nbi_cpu_elementwise
#define K_SUB nbi_cpu_elementwise
#define K_MUL nbi_cpu_elementwise
#define K_DIV nbi_cpu_elementwise
#define K_POW nbi_cpu_elementwise
#define K_MAXIMUM nbi_cpu_elementwise
#define K_MINIMUM nbi_cpu_elementwise
#define K_ATAN2 nbi_cpu_elementwise
#define K_MOD nbi_cpu_elementwise
#define K_EQ nbi_cpu_elementwise
#define K_NE nbi_cpu_elementwise
#define K_LT nbi_cpu_elementwise
#define K_LE nbi_cpu_elementwise
#define K_GT nbi_cpu_elementwise
#define K_GE nbi_cpu_elementwise
#define K_LOGICAL_AND nbi_cpu_elementwise
#define K_LOGICAL_OR nbi_cpu_elementwise
#define K_WHERE nbi_cpu_elementwise
/* reductions and axis ops (k_reduce.c) */
#define K_REDUCE_SUM nbi_cpu_reduce
#define K_REDUCE_PROD nbi_cpu_reduce
#define K_REDUCE_MAX nbi_cpu_reduce
#define K_REDUCE_MIN nbi_cpu_reduce
#define K_REDUCE_ANY nbi_cpu_reduce
#define K_REDUCE_ALL nbi_cpu_reduce
#define K_REDUCE_VAR nbi_cpu_reduce
#define K_LOGSUMEXP nbi_cpu_reduce
#define K_ARGMAX nbi_cpu_reduce
#define K_ARGMIN nbi_cpu_reduce
#define K_SOFTMAX nbi_cpu_softmax
#define K_LOG_SOFTMAX nbi_cpu_softmax
#define K_CUMSUM nbi_cpu_cumsum
/* shape (k_shape.c): the view ops' kernels materialize the view when it
 * cannot alias its input */
#define K_RESHAPE nbi_cpu_reshape
#define K_PERMUTE nbi_cpu_view_copy
#define K_BROADCAST_TO nbi_cpu_view_copy
#define K_SLICE nbi_cpu_view_copy
#define K_CONCAT nbi_cpu_concat
#define K_PAD nbi_cpu_pad
#define K_FLIP nbi_cpu_view_copy
#define K_IDENTITY NULL
#define K_STOP_GRADIENT NULL
#define K_TO_DEVICE NULL
#define K_PLACEHOLDER NULL
#define K_TUPLE_GET NULL
/* indexing (k_index.c) */
#define K_TAKE nbi_cpu_take
#define K_TAKE_ALONG_AXIS nbi_cpu_take_along_axis
#define K_SCATTER_ADD nbi_cpu_scatter_add
#define K_SCATTER_ADD_ALONG_AXIS nbi_cpu_scatter_add_along_axis
#define K_ONE_HOT nbi_cpu_one_hot
#define K_RANDOM nbi_cpu_random
/* linear algebra and NN (k_linalg.c, k_nn.c) */
#define K_MATMUL nbi_cpu_matmul
#define K_CONV2D nbi_cpu_conv2d
#define K_MAX_POOL2D nbi_cpu_max_pool2d
#define K_CONV2D_BWD_DATA nbi_cpu_conv2d_bwd_data
#define K_CONV2D_BWD_FILTER nbi_cpu_conv2d_bwd_filter
#define K_MAX_POOL2D_BWD nbi_cpu_max_pool2d_bwd
#define K_MAX_POOL2D_SELECT nbi_cpu_max_pool2d_select
/* run by core on any device (exec) */
#define K_COND NULL
#define K_WHILE NULL
#define K_SCAN NULL
#define K_REMAT NULL
#define K_CUSTOM NULL
#define K_SHARD_MAP NULL
#define K_SHARD_CONSTRAINT NULL
#define K_SHARD_LIKE NULL
#define K_ALL_REDUCE NULL
#define K_ALL_GATHER NULL
#define K_REDUCE_SCATTER NULL
#define K_ALL_TO_ALL NULL
#define K_PPERMUTE NULL
#define K_AXIS_INDEX NULL
/* clang-format on */

static const nbi_kernel table[] = {
#define NB_OP(id, name, arity, traits) [NBI_OP_##id] = K_##id,
#include "../../ops/ops.def"
#undef NB_OP
};
_Static_assert(sizeof table / sizeof table[0] == NBI_OP_COUNT,
               "every op of ops.def has a CPU kernel row");

nbi_kernel nbi_cpu_kernel_of(int op) { return op >= 0 && op < NBI_OP_COUNT ? table[op] : NULL; }

/* The kernels take every dtype the ops' validation lets through (integer and
 * bool products, f16/bf16 widened to f32 and rounded once), so the answer
 * depends on the op only. */
bool nbi_cpu_supports(void *ctx, int op, nb_dtype dt) {
  (void)ctx;
  return op >= 0 && op < NBI_OP_COUNT && table[op] && (int)dt >= 0 && dt < NB_DTYPE_COUNT;
}

nb_status nbi_cpu_run_op(void *ctx, const nb_tensor *n, nbi_view *out, const nbi_view *in) {
  (void)ctx;
  return table[n->op](n, out, in);
}
