/* src/core/oprules.h — the op registry (one record per ops.def row, traits) and
 * the rules ops carry: autodiff (VJP/JVP), batching (vmap), multi-output ops,
 * program apply rules. Included by the files that record, transform or run ops. */
#ifndef NABLA_OPRULES_H
#define NABLA_OPRULES_H

#include "nbi.h"

/* ---- op registry ------------------------------------------------------------------ */
/* Op traits, the fourth column of an ops.def row: what several passes (the
 * simplifier, fusion, sharding rules) need to know about an op, in one place. */
enum {
  NBI_TR_LEAF = 1u << 0,        /* no operands: a value (const, placeholder) */
  NBI_TR_EW = 1u << 1,          /* elementwise with broadcasting (fusion class) */
  NBI_TR_REDUCE = 1u << 2,      /* along axes: reductions of the axes of mask attrs.i[0],
                                   and with NBI_TR_AXIS softmax, cumsum (row class) */
  NBI_TR_COMMUTATIVE = 1u << 3, /* two operands swap without changing a bit */
  NBI_TR_ALIAS = 1u << 4,       /* the value is operand 0's (identity-like) */
  NBI_TR_ACT = 1u << 5,         /* an activation a GEMM epilogue can apply */
  /* linearity, for partial sums kept through an op (sharding) */
  NBI_TR_LIN_UNARY = 1u << 6, /* f(a + b) = f(a) + f(b) of its one operand */
  NBI_TR_LIN_SUM = 1u << 7,   /* add/sub: partial when all operands are */
  NBI_TR_LIN_MULTI = 1u << 8, /* mul: partial when exactly one operand is */
  NBI_TR_LIN_FIRST = 1u << 9, /* div: partial when only operand 0 is */
  /* with NBI_TR_REDUCE: along the one axis attrs.i[0], the result shaped as its
   * operand (softmax, log_softmax, cumsum) */
  NBI_TR_AXIS = 1u << 10,
  /* operand 0's elements in row-major order under another shape (reshape) or
   * repeated (broadcast_to), nothing computed: a fused group copies it, as it
   * does an NBI_TR_ALIAS op */
  NBI_TR_VIEW = 1u << 11,
};

typedef enum nbi_op {
#define NB_OP(id, name, arity, traits) NBI_OP_##id,
#include "../ops/ops.def"
#undef NB_OP
  NBI_OP_COUNT
} nbi_op;

/* The kernel contract: computes node `n`: in[k] views its realized inputs (any
 * strides), out is a freshly allocated contiguous buffer of n's shape and
 * dtype, all on n's device. Returns NB_OK or records an error (e.g. index out
 * of range) and returns its status. Each backend keeps its own table of
 * kernels by op (the CPU's: src/backends/cpu/kernels.c); op records hold only
 * the kernels core runs itself (nbi_op_def.exec). */
typedef nb_status (*nbi_kernel)(const nb_tensor *n, nbi_view *out, const nbi_view *in);
/* Optional zero-copy path: sets out->data/strides to alias in[0]'s memory and
 * returns true, or returns false to fall back to the kernel. */
typedef bool (*nbi_view_fn)(const nb_tensor *n, const nbi_view *in, nbi_view *out);

/* ---- autodiff rules ----------------------------------------------------------------
 * Written with public nabla ops, so rules are themselves differentiable and
 * every transform applies to them (higher derivatives, vmap later). A rule
 * reads the primal node y: its inputs y->in[k], attrs, shape, and y itself
 * (exp's derivative is y). Rules never read data.
 *
 * VJP: gy has y's shape and dtype. For each k with need[k], set gin[k] to the
 * cotangent of y->in[k], with exactly that input's shape and dtype (sum
 * broadcast dims back and cast: nbi_grad_fit, src/ops/rule_util.h), or leave
 * it NULL for "zero".
 * need[k] is false for integer/bool inputs. Return NB_OK, or an error status
 * (an op failed: the error is already recorded).
 * JVP: tin[k] is the tangent of y->in[k] (its shape and dtype) or NULL for
 * zero (never all NULL). Return y's tangent (y's shape and dtype) or NULL for
 * zero; on failure return NULL with the error recorded (callers check
 * nb_last_status()). */
typedef nb_status (*nbi_vjp_rule)(nb_tensor *y, nb_tensor *gy, const bool *need, nb_tensor **gin);
typedef nb_tensor *(*nbi_jvp_rule)(nb_tensor *y, nb_tensor *const *tin);

/* ---- batching rules (vmap) ----------------------------------------------------------
 * bin[k] is the batched value of y->in[k] when batched[k]: y->in[k]'s shape
 * with one more leading dim of size B (the batch is always dim 0). Otherwise
 * bin[k] is y->in[k] itself, the same for every example. At least one input is
 * batched. The rule returns y's batched value: shape (B, *y->shape), y's
 * dtype (src/transforms/vmap.c checks), or NULL with the error recorded.
 * Rules use public ops and work on the whole batch at once (a batched matmul
 * is one matmul): no loop over B, except where documented at the rule.
 * Helpers for rules: nbi_bat_* (src/ops/rule_util.h). */
typedef nb_tensor *(*nbi_vmap_rule)(nb_tensor *y, nb_tensor *const *bin, const bool *batched,
                                    int64_t B);

/* ---- multi-output ops ------------------------------------------------------------------
 * Nodes have one output. An op with several (control flow, checkpoint, custom
 * calls; flag NBI_OPF_MULTI) records one "pack" node p whose buffer holds all
 * its outputs, each contiguous at a 64-byte aligned byte offset, and one
 * TUPLE_GET node per output that views its slice (zero-copy). p has dtype
 * bool, shape (total bytes), and a payload that starts with nbi_multi (the
 * outputs' types and offsets). Users only ever see the TUPLE_GET nodes.
 * The sweeps (src/transforms) treat p and its gets as one op: its rules take
 * and give one value per output (NULL = zero, and unbatched for vmap):
 * - vjp_multi: gys[j] cotangent of output j (never all NULL); set gin[k] for
 *   need[k] as nbi_vjp_rule;
 * - jvp_multi: tin as nbi_jvp_rule; write touts[j] (NULL = zero);
 * - vmap_multi: as nbi_vmap_rule; write outs[j] batched (B first). */
typedef nb_status (*nbi_vjp_multi_rule)(nb_tensor *p, nb_tensor *const *gys, const bool *need,
                                        nb_tensor **gin);
typedef nb_status (*nbi_jvp_multi_rule)(nb_tensor *p, nb_tensor *const *tin, nb_tensor **touts);
typedef nb_status (*nbi_vmap_multi_rule)(nb_tensor *p, nb_tensor *const *bin, const bool *batched,
                                         int64_t B, nb_tensor **outs);

enum {
  /* No derivative flows through the op: integer/bool results (comparisons,
   * argmax, one_hot), piecewise-constant ones (floor, sign), stop_gradient.
   * Such an op has no rules; every other op with a float result must have
   * both (test_autodiff checks the table). */
  NBI_OPF_NONDIFF = 1u << 0,
  /* A pack node of a multi-output op: rules are the *_multi ones. */
  NBI_OPF_MULTI = 1u << 1,
  /* The kernel checks its data and can fail (an index out of range). On a
   * device whose kernels run asynchronously the failure surfaces at the next
   * sync, so a realization that ran such a step there syncs before it
   * returns: the error comes from nb_eval, as on the CPU, and no node is
   * marked realized with a value its kernel never wrote. */
  NBI_OPF_CHECKED = 1u << 2,
  /* No kernel ever computes it: a view that always succeeds (identity,
   * stop_gradient, tuple_get, sharding constraints), a symbolic trace input
   * (placeholder) or a data leaf (const). Recording it asks no backend
   * whether it supports it. */
  NBI_OPF_NO_KERNEL = 1u << 3,
};

/* ---- program apply rules ----------------------------------------------------------------
 * Optional per op: how nbi_program_apply (jit replay, calls on sharded values,
 * bodies run as programs) records program node pn on new inputs in, instead
 * of nbi_record (+ pn's payload): shard_map runs its body on sharded inputs
 * at once, a sharding constraint reshards. Writes the node's outputs: out[0]
 * for a single-output op; one per output for a multi-output op (the
 * program's TUPLE_GET nodes of the pack then stand for out[j], so the rule
 * may give tensors that are not gets of a pack). Borrowed (current scope). */
struct nbi_prog_node;
typedef nb_status (*nbi_apply_rule)(const struct nbi_prog_node *pn, nb_tensor *const *in,
                                    nb_tensor **out);

typedef struct nbi_op_def {
  const char *name;
  int arity; /* -1: variadic (concat) */
  nbi_view_fn view;
  /* Ops core runs itself on any device (control flow, checkpoint, custom
   * calls, shard_map, device moves): the kernel contract, views on the
   * node's device, data reached only through the host I/O helpers and
   * nested realizations. NULL: a backend runs the op from its own kernel
   * table (run_op), asked first whether it can (supports). */
  nbi_kernel exec;
  nbi_vjp_rule vjp;
  nbi_jvp_rule jvp;
  uint32_t flags; /* NBI_OPF_* */
  nbi_vmap_rule vmap;
  nbi_vjp_multi_rule vjp_multi;
  nbi_jvp_multi_rule jvp_multi;
  nbi_vmap_multi_rule vmap_multi;
  nbi_apply_rule apply; /* NULL: nbi_record */
  /* Multi-output ops that run programs (checkpoint, control flow,
   * shard_map): writes the programs payload p nests to out[0..1] and returns
   * their number (cond: then, else; while: cond, body; the others: one). */
  int (*programs)(const nbi_payload *p, const struct nbi_program **out);
} nbi_op_def;

/* One record per op, defined next to the op's public function, named
 * nbi_opdef_<ID>; the registry table in src/ops/registry.c points at all. */
#define NB_OP(id, name, arity, traits) extern const nbi_op_def nbi_opdef_##id;
#include "../ops/ops.def"
#undef NB_OP
extern const nbi_op_def *const nbi_op_table[NBI_OP_COUNT];
extern const uint32_t nbi_op_traits[NBI_OP_COUNT]; /* NBI_TR_*, from ops.def */

/* A new node with t's value (src/ops/identity.c). */
nb_tensor *nbi_identity(nb_tensor *t);
/* True while a backward sweep builds its graph on this thread: new nodes then
 * record no provenance (torch.no_grad). */
extern _Thread_local bool nbi_no_grad;

#endif
