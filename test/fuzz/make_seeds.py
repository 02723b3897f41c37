#!/usr/bin/env python3
"""test/fuzz/make_seeds.py — writes the hand-made seeds of test/fuzz/corpus/ (seed-*).

Each seed is a program in the byte format fuzz_ops.c / fuzz_api.c decode, spelled
with the helpers below (they mirror the decoders; a change there changes what these
bytes mean, and the seeds are then only less useful, never invalid). The rest of the
corpus is what libFuzzer found from them, merged (-merge=1) to keep it small.

    python3 test/fuzz/make_seeds.py   # rewrites test/fuzz/corpus/seed-*
"""
import os

(CREATE, UNARY, BINARY, SCALAR, WHERE, REDUCE, AXIS, LINALG, SHAPE, JOIN, SLICE, INDEX, NN,
 DEVICE, REALIZE, QUERY, SCOPE, GRAD, FN, CALL, MESH, SHARD, COLL, SETTING, CUSTOM) = range(25)
SMALL = [1, 2, 3, 4, 1, 2, 0, 5, 8, 3, 6, 1]
DT = {"f32": 0, "f64": 2, "f16": 4, "bf16": 5, "i32": 6, "i64": 7, "bool": 8}
UNARY_OPS = ["neg", "abs", "sign", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "square",
             "sin", "cos", "tan", "tanh", "sigmoid", "relu", "gelu", "silu", "softplus", "erf",
             "floor", "ceil", "round", "reciprocal", "logical_not"]
BINARY_OPS = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "atan2", "mod", "eq",
              "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"]
REDUCTIONS = ["sum", "mean", "prod", "max", "min", "var", "std", "logsumexp", "any", "all"]
NOT_MAPPED = 237  # axis_arg's byte for NB_NOT_MAPPED


def axis(a):
    return [a + 4] if a != "not_mapped" else [NOT_MAPPED]


def axes(lst):  # None: NB_ALL
    return [0] if lst is None else [16 + len(lst)] + sum((axis(a) for a in lst), [])


def shape(dims):  # shape_like reading shape_arg
    return [0, len(dims)] + [SMALL.index(d) for d in dims]


def create(kind, dims, dt):
    return [CREATE] + shape(dims) + [DT[dt], {"zeros": 0, "ones": 1, "rand": 3, "randn": 4,
                                              "glorot": 5}[kind]]


def unary(i, op):
    return [UNARY, i, UNARY_OPS.index(op)]


def binary(i, j, op):
    return [BINARY, i, j, BINARY_OPS.index(op)]


def reduce(i, op, ax=None, keep=False):
    return [REDUCE, i] + axes(ax) + [int(keep), REDUCTIONS.index(op)]


def matmul(i, j):
    return [LINALG, 0, i, j]


def einsum(spec_ops, out, picks):  # spec_ops: letters per operand, out: letters or None
    letters = "abcdijkAB"
    b = [LINALG, 2, len(picks)] + picks + [0]
    for ops in spec_ops:
        b += [len(ops)] + [letters.index(ch) for ch in ops]
    b += [0] if out is None else [1, len(out)] + [letters.index(ch) for ch in out]
    return b + [0]


def index_tensor(dims, values):  # fuzz_ops.c index_tensor: a small i64 tensor
    v = [x + 4 for x in values] + [4] * (16 - len(values))
    return [0, len(dims)] + list(dims) + v + [0]


def evaluate(picks):
    return [REALIZE] + (picks + [0] * 4)[:4] + [len(picks) + 1, 0, 0]


def item(i):
    return [REALIZE, i, 0, 0, 0, 0, 2]


def fprint(i):
    return [REALIZE, i, 0, 0, 0, 0, 3, 0]


def scope(kind):
    return [SCOPE, 0, {"begin": 0, "end": 1}[kind]]


def body_fn(code, n_in, n_out, sel, reduce_to=None):
    """A generated function: code runs on the inputs (pool slots 0..n_in-1, results
    after them); output j is slot sel + j; reduce_to sums output 0 to a scalar."""
    prog = [sel, {None: 0, "f32": 1, "f64": 3}[reduce_to]] + code
    assert len(prog) <= 96
    return [FN, 0, len(prog)] + prog + [1, 1, 0, 0, n_in, n_out - 1]


def transform(kind, fn, argnums=None, in_axes=(0, 0, 0, 0), out_axes=(0, 0, 0, 0), null=(0, 0)):
    k = {"grad": 3, "value_and_grad": 4, "vjp": 5, "jvp": 6, "jacrev": 7, "jacfwd": 8,
         "hessian": 9, "vmap": 10, "jit": 12, "checkpoint": 13}[kind]
    b = [FN, k, fn] + axes(argnums)
    for a, o in zip(in_axes, out_axes):
        b += axis(a) + axis(o)
    return b + list(null)


def spec(entries):  # sharding spec from the grammar: "_" or an axis name per entry
    names = ["x", "y", "dp", "tp", "z", "q"]
    b = [0, 0, len(entries)]
    for e in entries:
        b += [0] if e == "_" else [2, names.index(e)]
        b += [1, 1]
    return b + [1]


def shard_map(fn, mesh, in_specs, out_specs):
    b = [FN, 14, fn] + axes(None) + [4] * 8 + [mesh]
    for k in range(8):
        b += spec(in_specs[k] if k < len(in_specs) else [])
        b += spec(out_specs[k] if k < len(out_specs) else [])
    return b


def call(fn, picks):
    return [CALL, 0, fn] + picks + [1]


def mesh_cpu(axes_sizes):  # [("x", 2), ...]
    names = ["x", "y", "dp", "tp", "z", "q"]
    sizes = {1: 0, 2: 1, 3: 3, 4: 4}
    b = [MESH, 0, len(axes_sizes) - 1]
    for n, s in axes_sizes:
        b += [names.index(n), sizes[s]]
    return b + [1, 0]


def shard(i, mesh, entries):
    return [SHARD, i] + spec(entries) + [1, mesh, 0]


def reshard(i, entries):
    return [SHARD, i] + spec(entries) + [0, 0]


SEED = [1, 2, 3, 4, 5, 6, 7, 8]

SEEDS = {
    # a two-layer loss under every transform, called and realized
    "transforms": SEED + create("randn", [4, 3], "f64") + create("randn", [3, 2], "f64")
    + body_fn(matmul(0, 1) + unary(2, "tanh"), 2, 1, 3, "f64")
    + transform("value_and_grad", 0) + transform("jit", 1)
    + transform("vmap", 0, in_axes=(0, "not_mapped", 0, 0)) + transform("jacrev", 0)
    + transform("checkpoint", 0) + transform("grad", 5) + transform("jvp", 0)
    + call(1, [0, 1]) + call(2, [0, 1]) + call(2, [0, 1]) + call(3, [0, 1]) + call(4, [0, 1])
    + call(6, [0, 1]) + evaluate([2, 3, 4, 5]) + fprint(2),
    # second derivatives of a small function
    "hessian": SEED + create("randn", [2], "f64") + create("randn", [2], "f64")
    + body_fn(binary(0, 1, "mul") + unary(2, "sin"), 2, 1, 3, "f64")
    + transform("hessian", 0) + transform("jacfwd", 0) + transform("vjp", 0)
    + call(1, [0, 1]) + call(2, [0, 1]) + evaluate([2, 3, 4]),
    # PyTorch style: requires grad, backward, the update by nb_assign, in a scope
    "imperative": SEED + create("randn", [3, 2], "f32") + create("rand", [4, 3], "f32")
    + [GRAD, 0, 0, 0, 1] + scope("begin") + matmul(1, 0) + unary(2, "square") + reduce(3, "sum")
    + [GRAD, 4, 0, 1] + [GRAD, 0, 0, 2] + binary(0, 5, "sub") + [GRAD, 0, 6, 4]
    + item(4) + scope("end") + fprint(0),
    # a batch sharded over a 2-device mesh: ops, a reshard, a sharded value_and_grad
    "sharding": SEED + mesh_cpu([("x", 2)]) + create("randn", [4, 3], "f32")
    + create("randn", [3, 2], "f32") + shard(0, 0, ["x", "_"]) + matmul(2, 1)
    + reduce(3, "sum") + reshard(3, ["_", "_"]) + evaluate([3, 4, 5])
    + body_fn(matmul(0, 1) + unary(2, "relu"), 2, 1, 3, "f32") + transform("value_and_grad", 0)
    + call(1, [2, 1]) + evaluate([6, 7]),
    # shard_map with an all-reduce over the mesh axis
    "shard_map": SEED + mesh_cpu([("x", 2)]) + create("randn", [4, 3], "f32")
    + body_fn([COLL, 0, 0, 0, 4, 4, 0, 0], 1, 1, 1) + shard_map(0, 0, [["x", "_"]], [["_", "_"]])
    + call(1, [0]) + evaluate([1]),
    # scan, fori_loop, cond and a while_loop
    "control": SEED + create("randn", [5, 3], "f32") + create("zeros", [3], "f32")
    + body_fn(binary(0, 1, "add") + unary(1, "sin"), 2, 2, 2)
    + body_fn(binary(1, 1, "add"), 2, 1, 2)
    + body_fn(unary(0, "cos"), 1, 1, 1)
    + [CALL, 4, 0, 0, 1, 1, 1, 0, 0] + [CALL, 6, 1, 1, 1, 0, 1, 0, 6]
    + [CALL, 3, 2, 2, 1, 0, 1, 0, 1] + [CALL, 7, 2, 2, 1, 0, 1, 0, 1, 1, 3, 0, 0]
    + evaluate([2, 3, 4, 5]),
    # indexing and nn helpers on small tensors
    "nn": SEED + create("randn", [4, 5], "f32") + create("randn", [1, 1, 4, 4], "f32")
    + create("randn", [1, 1, 2, 2], "f32")
    + [INDEX, 0] + index_tensor([3], [0, 2, 1]) + axis(1) + [0]
    + [INDEX, 0] + index_tensor([4, 1], [1, 0, 3, 2]) + axis(1) + [1]
    + [INDEX, 0] + index_tensor([2], [4, -1]) + axis(0) + [3, 1, 0]
    + [NN, 0, 0, 0, 0, 2, 0] + index_tensor([4], [1, 0, 4, 2])
    + [NN, 0, 0, 0, 0, 0] + [NN, 1, 1, 2, 0, 0, 7, 0, 1, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0]
    + [NN, 1, 0, 0, 0, 8, 0, 2, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0]
    + [AXIS, 0, 3, 0, 2] + [AXIS, 0, 3, 0, 4] + evaluate([3, 4, 5, 6]) + evaluate([7, 8, 9, 10]),
    # the emulated device as default: creation, ops and reads through the seam
    "emu": SEED + [DEVICE, 0, 2, 2, 1] + create("randn", [3, 3], "f32") + matmul(0, 0)
    + einsum(["ij", "jk"], "ik", [0, 1]) + reduce(2, "logsumexp", [1]) + fprint(3),
}


def op_seed(inputs, code, n_in=None):
    """An op under the transforms: the inputs made (create() lists), a body that
    runs code on them (its result in the slot after the inputs) summed to a
    scalar, then value_and_grad, jvp, vmap over axis 0, jit and a Jacobian of it,
    each called on the inputs (jvp: the inputs as their own tangents)."""
    n = len(inputs) if n_in is None else n_in
    picks = list(range(n))
    b = SEED + sum(inputs, []) + body_fn(code, n, 1, n, "f64")
    b += transform("value_and_grad", 0) + transform("jvp", 0) + transform("vmap", 0)
    b += transform("jit", 0) + transform("jacfwd", 0)
    b += call(1, picks) + call(2, picks + picks) + call(3, picks) + call(4, picks)
    b += call(4, picks) + call(5, picks)
    return b + evaluate([n, n + 1, n + 2, n + 3]) + evaluate([n + 4, n + 5, n + 6, n + 7])


X45 = create("randn", [4, 5], "f64")
OP_SEEDS = {
    "take": op_seed([X45], [INDEX, 0] + index_tensor([3], [0, 2, -1]) + axis(1) + [0]),
    "take_along": op_seed([X45], [INDEX, 0] + index_tensor([4, 1], [1, 0, 3, 2]) + axis(1) + [1]),
    "scatter_add": op_seed([X45, create("randn", [3, 5], "f64")],
                           [INDEX, 0] + index_tensor([3], [0, 2, 0]) + axis(0) + [2, 1]),
    "conv2d": op_seed([create("randn", [2, 2, 4, 4], "f64"), create("randn", [3, 2, 2, 2], "f64")],
                      [NN, 0, 1, 1, 0, 0, 7, 0, 1, 0, 1, 0, 1, 0, 2, 0, 1, 0, 1, 0, 1, 0]),
    "conv2d_groups": op_seed([create("randn", [2, 2, 4, 4], "f64"),
                              create("randn", [2, 1, 3, 3], "f64")],
                             [NN, 0, 1, 1, 0, 0, 7, 0, 2, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 2, 0]),
    "max_pool2d": op_seed([create("randn", [2, 2, 4, 4], "f64")],
                          [NN, 0, 0, 0, 0, 8, 0, 2, 0, 3, 0, 1, 0, 2, 0, 1, 0, 1]),
    "layer_norm": op_seed([X45, create("randn", [5], "f64"), create("randn", [5], "f64")],
                          [NN, 0, 1, 1, 1, 2, 0, 0]),
    "rms_norm": op_seed([X45, create("randn", [5], "f64")], [NN, 0, 1, 1, 0, 0, 1]),
    "cross_entropy": op_seed([X45], [NN, 0, 0, 0, 0, 2, 0] + index_tensor([4], [1, 0, 4, 2])),
    "attention": op_seed([create("randn", [2, 3, 4], "f64"), create("randn", [2, 5, 4], "f64"),
                          create("randn", [2, 5, 3], "f64")], [NN, 0, 1, 1, 0, 0, 6, 2]),
    "embedding": op_seed([X45], [NN, 0, 0, 0, 0, 5] + index_tensor([2, 3], [0, 3, 1, 1, 2, 0])),
    "softmax": op_seed([X45], [AXIS, 0] + axis(-1) + [0, 2]),
    "log_softmax": op_seed([X45], [AXIS, 0] + axis(0) + [0, 3]),
    "cumsum": op_seed([X45], [AXIS, 0] + axis(1) + [0, 4]),
    "prod": op_seed([X45], reduce(0, "prod", [1])),
    "max": op_seed([X45], reduce(0, "max", [0], True)),
    "var": op_seed([X45], reduce(0, "var", [1])),
    "logsumexp": op_seed([X45], reduce(0, "logsumexp", [0, 1])),
    "slice": op_seed([X45], [SLICE, 0, 0, 7, 9, 7, 5, 224, 5] + [6, 6, 7] * 6 + [0]),
    "pad": op_seed([X45], [SLICE, 0, 1] + [0, 1, 0, 2, 0, 0, 0, 1] + [0, 0] * 12 + [0, 1]),
    "flip": op_seed([X45], [SLICE, 0, 2] + axes([1])),
    "repeat": op_seed([X45], [SLICE, 0, 3, 1] + axis(0)),
    "tile": op_seed([X45], [SLICE, 0, 4, 2, 1, 0]),
    "concat": op_seed([X45, create("randn", [4, 2], "f64")], [JOIN, 2, 0, 1] + axis(1) + [0, 0]),
    "stack": op_seed([X45, X45], [JOIN, 2, 0, 1] + axis(0) + [1, 0]),
    "einsum": op_seed([X45, create("randn", [5, 3], "f64")],
                      einsum(["ij", "jk"], "ki", [0, 1])),
    "pow_atan2": op_seed([X45, create("rand", [4, 5], "f64")],
                         binary(1, 0, "pow") + binary(2, 0, "atan2")),
    "where_clip": op_seed([X45, create("randn", [4, 5], "f64")],
                          binary(0, 1, "gt") + [WHERE, 2, 0, 1, 1]),
    "custom_twice": op_seed([X45], [CUSTOM, 0, 0, 0, 0, 0, 0, 0, 1]),
    "custom_pair": op_seed([X45, create("randn", [4, 5], "f64")],
                           [CUSTOM, 0, 1, 0, 0, 0, 0, 2, 0, 1]),
    "permute_reshape": op_seed([create("randn", [2, 3, 4], "f64")],
                               [SHAPE, 0, 2] + axes([2, 0, 1]) + [SHAPE, 1, 0] + shape([4, 6])),
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, prog in list(SEEDS.items()) + [("op-" + k, v) for k, v in OP_SEEDS.items()]:
        with open(os.path.join(out, "seed-" + name), "wb") as f:
            f.write(bytes(prog))


if __name__ == "__main__":
    main()
