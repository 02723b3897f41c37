/* src/ops/linalg.c — op records (skeleton: kernels and public functions to come). */
#include "../core/nbi.h"

const nbi_op_def nbi_opdef_MATMUL = {"matmul", 2, NULL, NULL};
