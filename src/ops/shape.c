/* src/ops/shape.c — op records (skeleton: kernels and public functions to come). */
#include "../core/nbi.h"

const nbi_op_def nbi_opdef_RESHAPE = {"reshape", 1, NULL, NULL};
const nbi_op_def nbi_opdef_PERMUTE = {"permute", 1, NULL, NULL};
const nbi_op_def nbi_opdef_BROADCAST_TO = {"broadcast_to", 1, NULL, NULL};
const nbi_op_def nbi_opdef_SLICE = {"slice", 1, NULL, NULL};
const nbi_op_def nbi_opdef_CONCAT = {"concat", -1, NULL, NULL};
const nbi_op_def nbi_opdef_PAD = {"pad", 1, NULL, NULL};
const nbi_op_def nbi_opdef_FLIP = {"flip", 1, NULL, NULL};
