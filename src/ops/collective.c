/* src/ops/collective.c — collectives of nb_shard_map bodies (CONTRACT STUB:
 * the collective helper replaces this file). */
#include "../core/nbi.h"

const nbi_op_def nbi_opdef_ALL_REDUCE = {.name = "all_reduce", .arity = 1};
const nbi_op_def nbi_opdef_ALL_GATHER = {.name = "all_gather", .arity = 1};
const nbi_op_def nbi_opdef_REDUCE_SCATTER = {.name = "reduce_scatter", .arity = 1};
const nbi_op_def nbi_opdef_ALL_TO_ALL = {.name = "all_to_all", .arity = 1};
const nbi_op_def nbi_opdef_PPERMUTE = {.name = "ppermute", .arity = 1};
const nbi_op_def nbi_opdef_AXIS_INDEX = {.name = "axis_index", .arity = 0};
