/* src/ops/registry.c — the op table, generated from ops.def. */
#include "../core/nbi.h"
#include "../core/oprules.h"

/* Data leaves: never recorded, never computed. */
const nbi_op_def nbi_opdef_CONST = {.name = "const", .arity = 0, .flags = NBI_OPF_NO_KERNEL};

const nbi_op_def *const nbi_op_table[NBI_OP_COUNT] = {
#define NB_OP(id, name, arity, traits) [NBI_OP_##id] = &nbi_opdef_##id,
#include "ops.def"
#undef NB_OP
};

const uint32_t nbi_op_traits[NBI_OP_COUNT] = {
#define NB_OP(id, name, arity, traits) [NBI_OP_##id] = (traits),
#include "ops.def"
#undef NB_OP
};

/* A row added to ops.def without a record fails to link; this catches a
 * table that lost its size. */
_Static_assert(sizeof(nbi_op_table) / sizeof(nbi_op_table[0]) == NBI_OP_COUNT,
               "op table must cover every op in ops.def");
