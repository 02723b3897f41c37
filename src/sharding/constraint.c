/* src/sharding/constraint.c — sharding constraints (CONTRACT STUB: the
 * graph-mode helper replaces this file). */
#include "sharding.h"

const nbi_op_def nbi_opdef_SHARD_CONSTRAINT = {.name = "sharding_constraint", .arity = 1};
const nbi_op_def nbi_opdef_SHARD_LIKE = {.name = "shard_like", .arity = 2};
