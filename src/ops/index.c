/* src/ops/index.c — op records (skeleton: kernels and public functions to come). */
#include "../core/nbi.h"

const nbi_op_def nbi_opdef_TAKE = {"take", 2, NULL, NULL};
const nbi_op_def nbi_opdef_TAKE_ALONG_AXIS = {"take_along_axis", 2, NULL, NULL};
const nbi_op_def nbi_opdef_SCATTER_ADD = {"scatter_add", 3, NULL, NULL};
const nbi_op_def nbi_opdef_SCATTER_ADD_ALONG_AXIS = {"scatter_add_along_axis", 3, NULL, NULL};
