/* src/ops/reduce.c — op records (skeleton: kernels and public functions to come). */
#include "../core/nbi.h"

const nbi_op_def nbi_opdef_REDUCE_SUM = {"reduce_sum", 1, NULL, NULL};
const nbi_op_def nbi_opdef_REDUCE_PROD = {"reduce_prod", 1, NULL, NULL};
const nbi_op_def nbi_opdef_REDUCE_MAX = {"reduce_max", 1, NULL, NULL};
const nbi_op_def nbi_opdef_REDUCE_MIN = {"reduce_min", 1, NULL, NULL};
const nbi_op_def nbi_opdef_REDUCE_ANY = {"reduce_any", 1, NULL, NULL};
const nbi_op_def nbi_opdef_REDUCE_ALL = {"reduce_all", 1, NULL, NULL};
const nbi_op_def nbi_opdef_ARGMAX = {"argmax", 1, NULL, NULL};
const nbi_op_def nbi_opdef_ARGMIN = {"argmin", 1, NULL, NULL};
const nbi_op_def nbi_opdef_CUMSUM = {"cumsum", 1, NULL, NULL};
