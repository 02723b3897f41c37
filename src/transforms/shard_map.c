/* src/transforms/shard_map.c — nb_shard_map (CONTRACT STUB: being written). */
#include "transforms.h"

const nbi_op_def nbi_opdef_SHARD_MAP = {.name = "shard_map", .arity = -1, .flags = NBI_OPF_MULTI};
