/* src/ops/nn.c — op records (skeleton: kernels and public functions to come). */
#include "../core/nbi.h"

const nbi_op_def nbi_opdef_CONV2D = {"conv2d", -1, NULL, NULL};
const nbi_op_def nbi_opdef_MAX_POOL2D = {"max_pool2d", 1, NULL, NULL};
