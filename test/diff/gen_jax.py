#!/usr/bin/env python3
"""Writes test/diff/programs.txt: random programs over nabla's op set, each
evaluated by JAX in float64 under forward, jit, grad, vjp, jvp, Hessian-vector
products, vmap (of f, grad, jvp and hvp), jacfwd, jacrev, hessian and the
imperative backward; test/test_diff.c (suite `diff`) decodes every program, runs
it with nabla's transforms in the program's dtype (f32 or f64) and compares.

    bench/peers/.venv/bin/python test/diff/gen_jax.py [--programs N] [--seed S]

The format is described in test/diff/README.md. Inputs are not stored: each
array is drawn from a seed with the splitmix64 generator that test/common.h's
tc_uniform implements (reproduced below bit for bit) and rounded to the
program's dtype. Expected arrays of more than FULL_MAX elements are stored as
random projections (weights drawn from a seed) and sampled elements.

A program is kept only if it is well conditioned at its dtype: every value is
finite and bounded, no non-smooth op (abs, relu, max, comparisons, floor...) is
evaluated within a margin of its kink at any point a check evaluates it at, and
moving every input by a few roundings of the dtype (2^-21 relative for f32,
2^-50 for f64, two random draws) moves every check's outputs by less than a
quarter of the dtype's tolerance, and so does computing them with JAX in f32
(f32 programs: that also measures the rounding of intermediates, as in a
softmax over 40000 logits whose entropy gradient cancels).
"""
import argparse
import os
import sys

import numpy as np

# compiling dominates the run time (one XLA program per program and dtype):
# the cheapest compiler settings, which do not change what is computed
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                      "--xla_llvm_disable_expensive_passes=true")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax.scipy.special as jss  # noqa: E402
from jax import lax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")

HERE = os.path.dirname(os.path.abspath(__file__))
RTOL = {"f32": 2e-4, "f64": 1e-9}  # the C test reads these from the file
FULL_MAX = 48  # arrays up to this many elements are stored whole
N_PROJ, N_SAMPLE = 4, 16
BATCH = {"small": 3, "large": 2}

# ---- splitmix64 (test/common.h tc_uniform) ---------------------------------------------
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def uniform(seed, n, lo, hi):
    """n values in [lo, hi): the C side's tc_uniform called n times from seed."""
    with np.errstate(over="ignore"):
        i = np.arange(1, n + 1, dtype=np.uint64)
        z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64)
    return lo + (hi - lo) * u * 2.0**-53


def draw(seed, shape, lo, hi, dt):
    x = uniform(seed, int(np.prod(shape, dtype=np.int64)), lo, hi).reshape(shape)
    return x.astype(np.float32).astype(np.float64) if dt == "f32" else x


# ---- the op set: name -> JAX function of (args, attrs) ---------------------------------
def _red(f):
    def g(a, at):
        keep, n = int(at[0]), int(at[1])
        axes = None if n < 0 else tuple(int(v) for v in at[2 : 2 + n])
        return f(a[0], axis=axes, keepdims=bool(keep))

    return g


def _slice(a, at):
    nd = int(at[0])
    sl = []
    for d in range(nd):
        s, e, st = at[1 + 3 * d : 4 + 3 * d]
        sl.append(slice(int(s), None if e == "E" else int(e), int(st)))
    return a[0][tuple(sl)]


def _pad(a, at):
    nd = int(at[0])
    p = [(int(at[1 + 2 * d]), int(at[2 + 2 * d])) for d in range(nd)]
    return jnp.pad(a[0], p, constant_values=float(at[1 + 2 * nd]))


def _const_i64(at, k):
    """An i64 constant written in attrs from position k: ndim dims values."""
    nd = int(at[k])
    dims = tuple(int(v) for v in at[k + 1 : k + 1 + nd])
    n = int(np.prod(dims, dtype=np.int64))
    vals = np.array([int(v) for v in at[k + 1 + nd : k + 1 + nd + n]], dtype=np.int64)
    return vals.reshape(dims)


def _norm_idx(idx, n):
    return np.where(idx < 0, idx + n, idx)


def _take(a, at):
    ax = int(at[0]) % a[0].ndim
    return jnp.take(a[0], _norm_idx(_const_i64(at, 1), a[0].shape[ax]), axis=ax)


def _take_along(a, at):
    ax = int(at[0]) % a[0].ndim
    return jnp.take_along_axis(a[0], _norm_idx(_const_i64(at, 1), a[0].shape[ax]), axis=ax)


def _scatter_add(a, at):
    ax = int(at[0]) % a[0].ndim
    idx = _norm_idx(_const_i64(at, 1), a[0].shape[ax])
    return a[0].at[(slice(None),) * ax + (idx,)].add(a[1])


def _layer_norm(a, at):
    eps, hw, hb = float(at[0]), int(at[1]), int(at[2])
    x = a[0]
    xc = x - jnp.mean(x, -1, keepdims=True)
    y = xc / jnp.sqrt(jnp.mean(xc * xc, -1, keepdims=True) + eps)
    if hw:
        y = y * a[1]
    if hb:
        y = y + a[1 + hw]
    return y


def _rms_norm(a, at):
    eps, hw = float(at[0]), int(at[1])
    y = a[0] / jnp.sqrt(jnp.mean(a[0] * a[0], -1, keepdims=True) + eps)
    return y * a[1] if hw else y


def _cross_entropy(a, at):
    logp = jax.nn.log_softmax(a[0], -1)
    if int(at[0]) == 0:
        return -jnp.mean(jnp.sum(a[1] * logp, -1))
    lab = _const_i64(at, 1)
    return -jnp.mean(jnp.take_along_axis(logp, lab[..., None], -1))


def _attention(a, at):
    q, k, v = a
    s = jnp.matmul(q, jnp.swapaxes(k, -1, -2)) * float(1.0 / np.sqrt(q.shape[-1]))
    if int(at[0]):
        lq, lk = q.shape[-2], k.shape[-2]
        mask = np.arange(lk)[None, :] <= np.arange(lq)[:, None]
        s = jnp.where(mask, s, jnp.finfo(s.dtype).min)
    return jnp.matmul(jax.nn.softmax(s, -1), v)


def _conv2d(a, at):
    s0, s1, p0, p1, d0, d1, g, hb = (int(v) for v in at[:8])
    y = lax.conv_general_dilated(
        a[0], a[1], (s0, s1), [(p0, p0), (p1, p1)], rhs_dilation=(d0, d1),
        dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=g,
        precision=lax.Precision.HIGHEST)
    return y + a[2][None, :, None, None] if hb else y


def _ints(at, k=0):
    n = int(at[k])
    return tuple(int(v) for v in at[k + 1 : k + 1 + n])


UNARY = {
    "neg": jnp.negative, "abs": jnp.abs, "sign": jnp.sign, "exp": jnp.exp, "expm1": jnp.expm1,
    "log": jnp.log, "log1p": jnp.log1p, "sqrt": jnp.sqrt, "rsqrt": lambda x: 1 / jnp.sqrt(x),
    "square": jnp.square, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "tanh": jnp.tanh,
    "sigmoid": jax.nn.sigmoid, "relu": jax.nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False), "silu": jax.nn.silu,
    "softplus": jax.nn.softplus, "erf": jss.erf, "floor": jnp.floor, "ceil": jnp.ceil,
    "round": jnp.round, "reciprocal": lambda x: 1 / x,
}
BINARY = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide,
    "pow": jnp.power, "maximum": jnp.maximum, "minimum": jnp.minimum, "atan2": jnp.arctan2,
}
SCALAR = {
    "add_s": lambda x, s: x + s, "sub_s": lambda x, s: x - s, "rsub_s": lambda x, s: s - x,
    "mul_s": lambda x, s: x * s, "div_s": lambda x, s: x / s, "rdiv_s": lambda x, s: s / x,
    "pow_s": lambda x, s: x**s, "maximum_s": jnp.maximum, "minimum_s": jnp.minimum,
}
COMPARE = {"gt": jnp.greater, "lt": jnp.less, "ge": jnp.greater_equal, "le": jnp.less_equal}
REDUCE = {
    "sum": jnp.sum, "mean": jnp.mean, "prod": jnp.prod, "max": jnp.max, "min": jnp.min,
    "var": jnp.var, "std": jnp.std, "logsumexp": jss.logsumexp,
}

OPS = {}
OPS.update({k: (lambda f: lambda a, at: f(a[0]))(f) for k, f in UNARY.items()})
OPS.update({k: (lambda f: lambda a, at: f(a[0], a[1]))(f) for k, f in BINARY.items()})
OPS.update({k: (lambda f: lambda a, at: f(a[0], float(at[0])))(f) for k, f in SCALAR.items()})
OPS.update({k: (lambda f: lambda a, at: f(a[0], a[1]))(f) for k, f in COMPARE.items()})
OPS.update({k: _red(f) for k, f in REDUCE.items()})
OPS.update({
    "clip": lambda a, at: jnp.clip(a[0], float(at[0]), float(at[1])),
    "where": lambda a, at: jnp.where(a[0], a[1], a[2]),
    "softmax": lambda a, at: jax.nn.softmax(a[0], int(at[0])),
    "log_softmax": lambda a, at: jax.nn.log_softmax(a[0], int(at[0])),
    "cumsum": lambda a, at: jnp.cumsum(a[0], int(at[0])),
    "matmul": lambda a, at: jnp.matmul(a[0], a[1], precision=lax.Precision.HIGHEST),
    "einsum": lambda a, at: jnp.einsum(at[0], *a, precision=lax.Precision.HIGHEST),
    "outer": lambda a, at: jnp.outer(a[0], a[1]),
    "reshape": lambda a, at: jnp.reshape(a[0], _ints(at)),
    "transpose": lambda a, at: jnp.swapaxes(a[0], -1, -2),
    "permute": lambda a, at: jnp.transpose(a[0], _ints(at)),
    "squeeze": lambda a, at: jnp.squeeze(a[0], None if int(at[0]) < 0 else _ints(at)),
    "unsqueeze": lambda a, at: jnp.expand_dims(a[0], int(at[0])),
    "broadcast_to": lambda a, at: jnp.broadcast_to(a[0], _ints(at)),
    "flatten": lambda a, at: jnp.reshape(
        a[0], a[0].shape[: int(at[0]) % max(a[0].ndim, 1)] + (-1,)
        + a[0].shape[int(at[1]) % max(a[0].ndim, 1) + 1 :]),
    "concat": lambda a, at: jnp.concatenate(a, int(at[0])),
    "stack": lambda a, at: jnp.stack(a, int(at[0])),
    "slice": _slice, "pad": _pad,
    "flip": lambda a, at: jnp.flip(a[0], _ints(at)),
    "repeat": lambda a, at: jnp.repeat(a[0], int(at[0]), int(at[1])),
    "tile": lambda a, at: jnp.tile(a[0], _ints(at)),
    "take": _take, "take_along_axis": _take_along, "scatter_add": _scatter_add,
    "layer_norm": _layer_norm, "rms_norm": _rms_norm, "cross_entropy": _cross_entropy,
    "mse": lambda a, at: jnp.mean(jnp.square(a[0] - a[1])),
    "attention": _attention, "conv2d": _conv2d,
    "embedding": lambda a, at: jnp.take(a[0], _const_i64(at, 0), axis=0),
})


def run_ops(ops, n_in, xs):
    """The program's output: its ops over inputs xs, every float value kept in
    the inputs' dtype (as nabla's ops keep it)."""
    v = list(xs)
    base = xs[0].dtype if xs else jnp.float64
    for name, ids, at in ops:
        y = OPS[name]([v[i] for i in ids], at)
        if jnp.issubdtype(y.dtype, jnp.floating) and y.dtype != base:
            y = y.astype(base)
        v.append(y)
    return v[-1] if len(v) > n_in else v[0]


# ---- the generator ---------------------------------------------------------------------
class Program:
    def __init__(self, rng, dt, size, in_shapes, idx):
        self.rng, self.dt, self.size, self.idx = rng, dt, size, idx
        self.n_in = len(in_shapes)
        self.in_shapes = [tuple(s) for s in in_shapes]
        self.B = BATCH[size]
        self.seed = 1_000_003 * (idx + 1)
        # vmap: in_axes per input (None: not mapped; at least one mapped)
        self.in_axes = [None if rng.rand() < 0.3 else int(rng.randint(-len(s) - 1, len(s) + 1))
                        for s in self.in_shapes]
        if all(a is None for a in self.in_axes):
            self.in_axes[0] = 0
        self.slots = []  # (seed, lo, hi, shape)
        self.x = [self.slot(s, -2, 2) for s in self.in_shapes]
        self.xb = [self.slot(self.batched(s, a), -2, 2) if a is not None else self.x[k]
                   for k, (s, a) in enumerate(zip(self.in_shapes, self.in_axes))]
        # the points every op is evaluated at: x and the B examples of xb
        self.points = [[self.value(self.x[k]) for k in range(self.n_in)]]
        for b in range(self.B):
            pt = []
            for k in range(self.n_in):
                if self.in_axes[k] is None:
                    pt.append(self.value(self.x[k]))
                else:
                    pt.append(np.take(self.value(self.xb[k]), b, axis=self.in_axes[k]))
            self.points.append(pt)
        self.vals = [[pt[k] for pt in self.points] for k in range(self.n_in)]
        self.bools = [False] * self.n_in
        self.ops = []

    def batched(self, shape, axis):
        a = axis % (len(shape) + 1)
        return shape[:a] + (self.B,) + shape[a:]

    def slot(self, shape, lo, hi):
        self.slots.append((self.seed + len(self.slots), lo, hi, tuple(shape)))
        return len(self.slots) - 1

    def value(self, k):
        seed, lo, hi, shape = self.slots[k]
        return draw(seed, shape, lo, hi, self.dt)

    def shape(self, i):
        return self.vals[i][0].shape

    def margin(self, scale=1.0):
        return (1e-4 if self.dt == "f32" else 1e-8) * max(1.0, scale)


def maxabs(vs):
    return max((float(np.max(np.abs(v))) if v.size else 0.0) for v in vs)


def top2_gap(v, axes, largest):
    """Smallest gap between the two extreme values of each reduced slice."""
    nd = v.ndim
    axes = tuple(range(nd)) if axes is None else tuple(a % nd for a in axes)
    rest = [d for d in range(nd) if d not in axes]
    r = int(np.prod([v.shape[a] for a in axes], dtype=np.int64))
    if r < 2 or v.size == 0:
        return np.inf
    w = np.sort(np.transpose(v, rest + list(axes)).reshape(-1, r), axis=1)
    g = w[:, -1] - w[:, -2] if largest else w[:, 1] - w[:, 0]
    return float(np.min(g))


def smooth_ok(p, name, args, at):
    """Whether each point is away from the op's kinks and within its domain."""
    m = p.margin(maxabs(args) if args else 1.0)
    x = args[0] if args else None
    if name in ("abs", "sign", "relu"):
        return np.min(np.abs(x), initial=np.inf) >= m
    if name in ("floor", "ceil"):
        return np.min(np.abs(x - np.round(x)), initial=np.inf) >= m
    if name == "round":
        return np.min(np.abs(x - np.floor(x) - 0.5), initial=np.inf) >= m
    if name in ("maximum", "minimum") or name in COMPARE:
        return np.min(np.abs(args[0] - args[1]), initial=np.inf) >= m
    if name in ("maximum_s", "minimum_s"):
        return np.min(np.abs(x - float(at[0])), initial=np.inf) >= m
    if name == "clip":
        return min(np.min(np.abs(x - float(at[0])), initial=np.inf),
                   np.min(np.abs(x - float(at[1])), initial=np.inf)) >= m
    if name in ("max", "min"):
        n = int(at[1])
        axes = None if n < 0 else tuple(int(v) for v in at[2 : 2 + n])
        return top2_gap(x, axes, name == "max") >= m
    if name in ("log", "sqrt", "rsqrt"):
        return np.min(x, initial=np.inf) >= 0.1
    if name == "log1p":
        return np.min(x, initial=np.inf) >= -0.9
    if name in ("reciprocal", "rdiv_s"):
        return np.min(np.abs(x), initial=np.inf) >= 0.3
    if name == "div":
        return np.min(np.abs(args[1]), initial=np.inf) >= 0.3
    if name == "pow":
        return (np.min(args[0], initial=np.inf) >= 0.2
                and np.max(np.abs(args[1]), initial=-np.inf) <= 3)
    if name == "pow_s":
        return float(at[0]) == int(float(at[0])) or np.min(x, initial=np.inf) >= 0.2
    if name == "tan":
        return np.max(np.abs(x), initial=-np.inf) <= 1.2
    if name in ("exp", "expm1"):
        return np.max(x, initial=-np.inf) <= 4
    if name == "atan2":
        return np.min(args[0] ** 2 + args[1] ** 2, initial=np.inf) >= 0.05
    if name == "std":
        n = int(at[1])
        axes = None if n < 0 else tuple(int(v) for v in at[2 : 2 + n])
        return np.min(np.var(x, axis=axes), initial=np.inf) >= 0.02
    if name == "prod":
        return np.min(np.abs(x), initial=np.inf) >= 0.1
    return True


def emit(p, name, ids, at=()):
    """Appends op (name, ids, attrs) if valid at every point; returns its id."""
    at = list(at)
    if any(i is None for i in ids) or len(at) > 1100:
        return None
    outs = []
    for k in range(len(p.points)):
        args = [p.vals[i][k] for i in ids]
        if not smooth_ok(p, name, args, at):
            return None
        try:
            y = np.asarray(OPS[name]([jnp.asarray(a) for a in args], at))
        except Exception:  # shapes or attributes the op refuses
            return None
        if y.dtype != np.bool_ and (not np.all(np.isfinite(y)) or maxabs([y]) > 1e3):
            return None
        outs.append(y)
    limit = 64 if p.size == "small" else 400_000
    if outs[0].size > limit or outs[0].size == 0 and p.rng.rand() < 0.8 or outs[0].ndim > 6:
        return None
    p.ops.append((name, list(ids), at))
    p.vals.append(outs)
    p.bools.append(outs[0].dtype == np.bool_)
    return len(p.vals) - 1


def pick(p, pred=lambda s: True, recent=True):
    """A random float value whose shape satisfies pred (recent ones favoured)."""
    ids = [i for i in range(len(p.vals)) if not p.bools[i] and pred(p.shape(i))]
    if not ids:
        return None
    if recent and p.rng.rand() < 0.6:
        ids = ids[-4:]
    return ids[p.rng.randint(len(ids))]


def positive(p, i):
    """A value >= 0.5 derived from i (i itself when it already is >= 0.1)."""
    if min(float(np.min(v, initial=np.inf)) for v in p.vals[i]) >= 0.1:
        return i
    j = emit(p, "square", [i])
    return emit(p, "add_s", [j], [0.5]) if j is not None else None


def away_from_zero(p, i):
    """A value of magnitude >= 0.3 derived from i (i itself when it is)."""
    if min(float(np.min(np.abs(v), initial=np.inf)) for v in p.vals[i]) >= 0.3:
        return i
    return positive(p, i)


def random_axes(p, nd, allow_all=True):
    if nd == 0 or (allow_all and p.rng.rand() < 0.2):
        return -1, []
    k = p.rng.randint(1, nd + 1)
    axes = sorted(p.rng.choice(nd, k, replace=False).tolist())
    return k, [a - nd if p.rng.rand() < 0.3 else a for a in axes]


def broadcastable(a, b):
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def g_unary(p):
    i = pick(p)
    name = p.rng.choice(list(UNARY))
    if name in ("log", "sqrt", "rsqrt", "log1p"):
        i = positive(p, i)
    elif name in ("reciprocal",):
        i = away_from_zero(p, i)
    elif name in ("tan", "exp", "expm1"):
        i = emit(p, "tanh", [i]) if p.rng.rand() < 0.5 else i
    return emit(p, name, [i]) if i is not None else None


def g_binary(p):
    a = pick(p)
    b = pick(p, lambda s: broadcastable(s, p.shape(a)), recent=False)
    name = p.rng.choice(list(BINARY))
    if name == "div":
        b = away_from_zero(p, b)
    if name == "pow":
        a = positive(p, a)
        b = emit(p, "tanh", [b]) if b is not None else None
    if a is None or b is None:
        return None
    return emit(p, name, [a, b] if p.rng.rand() < 0.8 else [b, a] if name != "pow" else [a, b])


def g_scalar(p):
    i = pick(p)
    name = p.rng.choice(list(SCALAR) + ["clip"])
    s = float(np.round(p.rng.uniform(-1.5, 1.5), 2))
    if name == "clip":
        lo = float(np.round(p.rng.uniform(-1.5, 0), 2))
        return emit(p, "clip", [i], [lo, lo + float(np.round(p.rng.uniform(0.5, 2), 2))])
    if name == "div_s" and abs(s) < 0.3:
        s = 0.75
    if name == "rdiv_s":
        i = away_from_zero(p, i)
    if name == "pow_s":
        s = float(p.rng.choice([2, 3, -1, 0.5, 1.5]))
        if s != int(s) or s < 0:
            i = positive(p, i)
    return emit(p, name, [i], [s]) if i is not None else None


def g_where(p):
    a = pick(p)
    b = pick(p, lambda s: broadcastable(s, p.shape(a)), recent=False)
    c = emit(p, p.rng.choice(list(COMPARE)), [a, b])
    if c is None:
        return None
    x = pick(p, lambda s: broadcastable(s, p.shape(c)))
    y = pick(p, lambda s: broadcastable(s, p.shape(c)) and broadcastable(s, p.shape(x)),
             recent=False)
    return emit(p, "where", [c, x, y]) if y is not None else None


def g_reduce(p):
    i = pick(p, lambda s: len(s) >= 1)
    if i is None:
        return None
    name = p.rng.choice(list(REDUCE))
    n, axes = random_axes(p, len(p.shape(i)))
    if name == "prod":  # products of few factors stay bounded
        if p.size != "small":
            return None
    return emit(p, name, [i], [int(p.rng.rand() < 0.5), n] + axes)


def g_axis(p):
    i = pick(p, lambda s: len(s) >= 1)
    if i is None:
        return None
    nd = len(p.shape(i))
    return emit(p, p.rng.choice(["softmax", "log_softmax", "cumsum"]), [i],
                [int(p.rng.randint(-nd, nd))])


def g_matmul(p):
    a = pick(p, lambda s: len(s) >= 1)
    if a is None:
        return None
    sa = p.shape(a)
    kdim = sa[-1]
    r = p.rng.rand()
    if r < 0.15:
        b = pick(p, lambda s: len(s) == 1 and s[0] == kdim, recent=False)
        return emit(p, "matmul", [a, b]) if b is not None else None
    if r < 0.25 and len(sa) == 1:
        b = pick(p, lambda s: len(s) == 1, recent=False)
        return emit(p, "outer", [a, b])
    b = pick(p, lambda s: len(s) >= 2 and s[-2] == kdim, recent=False)
    if b is None:  # a transposed self-product
        if len(sa) < 2:
            return None
        t = emit(p, "transpose", [a])
        return emit(p, "matmul", [a, t] if p.rng.rand() < 0.5 else [t, a]) if t else None
    return emit(p, "matmul", [a, b])


EINSUMS = [("ij,jk->ik", 2), ("ij->ji", 2), ("ij,ij->i", 2), ("i,j->ij", 1), ("bij,bjk->bik", 3),
           ("ii->i", 2), ("ijk->kj", 3), ("ij,kj->ik", 2)]


def g_einsum(p):
    spec, nd = EINSUMS[p.rng.randint(len(EINSUMS))]
    lhs, rhs = spec.split("->")
    terms = lhs.split(",")
    a = pick(p, lambda s: len(s) == len(terms[0]))
    if a is None:
        return None
    sizes = dict(zip(terms[0], p.shape(a)))
    if len(set(terms[0])) < len(terms[0]) and len(set(p.shape(a))) > 1:
        return None
    ids = [a]
    for t in terms[1:]:
        b = pick(p, lambda s: len(s) == len(t) and all(
            sizes.get(c, s[d]) == s[d] for d, c in enumerate(t)), recent=False)
        if b is None:
            return None
        ids.append(b)
    return emit(p, "einsum", ids, [spec])


def g_shape(p):
    i = pick(p)
    s = p.shape(i)
    nd = len(s)
    r = p.rng.randint(14)
    rng = p.rng
    if r == 0 and nd >= 1:  # reshape to a random factorization
        n = int(np.prod(s))
        dims, left = [], n
        for f in (2, 3, 5, 7, 4):
            while left % f == 0 and rng.rand() < 0.5 and len(dims) < 4:
                dims.append(f)
                left //= f
        dims.append(left)
        rng.shuffle(dims)
        if rng.rand() < 0.3:
            dims[rng.randint(len(dims))] = -1
        return emit(p, "reshape", [i], [len(dims)] + dims)
    if r == 1 and nd >= 2:
        return emit(p, "transpose", [i])
    if r == 2 and nd >= 2:
        perm = rng.permutation(nd).tolist()
        return emit(p, "permute", [i], [nd] + perm)
    if r == 3 and 1 in s:
        if rng.rand() < 0.5:
            return emit(p, "squeeze", [i], [-1])
        return emit(p, "squeeze", [i], [1, s.index(1)])
    if r == 4 and nd < 5:
        return emit(p, "unsqueeze", [i], [int(rng.randint(-nd - 1, nd + 1))])
    if r == 5:
        ext = [int(rng.randint(1, 4))] if nd < 4 else []
        tgt = ext + [d if d != 1 else int(rng.randint(1, 4)) for d in s]
        return emit(p, "broadcast_to", [i], [len(tgt)] + tgt)
    if r == 6 and nd >= 2:
        a = int(rng.randint(0, nd - 1))
        return emit(p, "flatten", [i], [a, int(rng.randint(a, nd))])
    if r in (7, 8) and nd >= 1:
        ax = int(rng.randint(-nd, nd))
        if r == 7:
            j = pick(p, lambda t: len(t) == nd and all(
                t[d] == s[d] for d in range(nd) if d != ax % nd), recent=False)
            ids = [i, j] + ([i] if rng.rand() < 0.3 else [])
            return emit(p, "concat", ids, [ax])
        j = pick(p, lambda t: t == s, recent=False)
        return emit(p, "stack", [i, j], [int(rng.randint(-nd - 1, nd + 1))])
    if r == 9 and nd >= 1:
        at = [nd]
        for d in range(nd):
            n = s[d]
            st = int(rng.choice([1, 1, 2, -1, -2, 3]))
            a = int(rng.randint(-n - 1, n + 1))
            e = "E" if rng.rand() < 0.3 else int(rng.randint(-n - 2, n + 2))
            at += [a, e, st]
        return emit(p, "slice", [i], at)
    if r == 10 and nd >= 1:
        pads = [int(v) for v in rng.randint(0, 3, 2 * nd)]
        return emit(p, "pad", [i], [nd] + pads + [float(np.round(rng.uniform(-1, 1), 2))])
    if r == 11 and nd >= 1:
        k, axes = random_axes(p, nd, allow_all=False)
        return emit(p, "flip", [i], [k] + axes)
    if r == 12 and nd >= 1:
        return emit(p, "repeat", [i], [int(rng.randint(1, 4)), int(rng.randint(-nd, nd))])
    if r == 13 and nd >= 1:
        reps = [int(v) for v in rng.randint(1, 3, nd)]
        return emit(p, "tile", [i], [nd] + reps)
    return None


def const_idx(rng, shape, n, negative=True):
    v = rng.randint(0, n, size=shape)
    if negative:
        v = np.where(rng.rand(*shape) < 0.3, v - n, v) if len(shape) else v
    return [len(shape)] + list(shape) + [int(x) for x in np.ravel(v)]


def g_index(p):
    i = pick(p, lambda s: len(s) >= 1 and min(s) >= 1)
    if i is None:
        return None
    s = p.shape(i)
    nd = len(s)
    ax = int(p.rng.randint(-nd, nd))
    n = s[ax]
    r = p.rng.randint(3)
    if r == 0:
        ishape = tuple(int(d) for d in p.rng.randint(1, 4, p.rng.randint(0, 3)))
        return emit(p, "take", [i], [ax] + const_idx(p.rng, ishape, n))
    ishape = list(s)
    ishape[ax] = int(p.rng.randint(1, 4))
    if r == 1:
        return emit(p, "take_along_axis", [i], [ax] + const_idx(p.rng, tuple(ishape), n))
    ishape = tuple(int(d) for d in p.rng.randint(1, 4, p.rng.randint(1, 3)))
    ushape = s[: ax % nd] + ishape + s[ax % nd + 1 :]
    u = pick(p, lambda t: t == ushape, recent=False)
    if u is None:
        u = emit(p, "take", [i], [ax] + const_idx(p.rng, ishape, n))
    if u is None:
        return None
    return emit(p, "scatter_add", [i, u], [ax] + const_idx(p.rng, ishape, n))


def g_nn(p):
    r = p.rng.randint(6)
    i = pick(p, lambda s: len(s) >= 1 and s[-1] >= 2)
    if i is None:
        return None
    s = p.shape(i)
    if r == 0 or r == 1:
        w = pick(p, lambda t: t == (s[-1],), recent=False) if p.rng.rand() < 0.7 else None
        b = pick(p, lambda t: t == (s[-1],), recent=False) if p.rng.rand() < 0.7 else None
        if r == 0:
            return emit(p, "layer_norm", [i] + [x for x in (w, b) if x is not None],
                        [1e-5, int(w is not None), int(b is not None)])
        return emit(p, "rms_norm", [i] + ([w] if w is not None else []), [1e-5, int(w is not None)])
    if r == 2:
        if p.rng.rand() < 0.5:
            lab = pick(p, lambda t: t == s, recent=False)
            sm = emit(p, "softmax", [lab], [-1])
            return emit(p, "cross_entropy", [i, sm], [0]) if sm is not None else None
        return emit(p, "cross_entropy", [i], [1] + const_idx(p.rng, s[:-1], s[-1], False))
    if r == 3:
        j = pick(p, lambda t: t == s, recent=False)
        return emit(p, "mse", [i, j])
    if r == 4 and len(s) >= 2:
        k = pick(p, lambda t: len(t) == len(s) and t[-1] == s[-1] and broadcastable(
            t[:-2], s[:-2]), recent=False)
        v = pick(p, lambda t: len(t) >= 2 and t[-2] == p.shape(k)[-2] and broadcastable(
            t[:-2], s[:-2]), recent=False)
        if k is None or v is None:
            return None
        causal = int(p.rng.rand() < 0.5 and p.shape(k)[-2] == s[-2])
        return emit(p, "attention", [i, k, v], [causal])
    if r == 5 and len(s) == 2 and min(s) >= 1:
        ishape = tuple(int(d) for d in p.rng.randint(1, 4, p.rng.randint(1, 3)))
        return emit(p, "embedding", [i], const_idx(p.rng, ishape, s[0], False))
    return None


def g_conv(p):
    x = pick(p, lambda s: len(s) == 4)
    if x is None:
        return None
    n, c, h, w = p.shape(x)
    wt = pick(p, lambda s: len(s) == 4 and s[0] > 0 and s[1] > 0 and c % s[1] == 0
              and s[0] % (c // s[1]) == 0, recent=False)
    if wt is None or wt == x:
        return None
    o, cg, kh, kw = p.shape(wt)
    g = c // cg
    s0, s1 = (int(v) for v in p.rng.randint(1, 3, 2))
    p0, p1 = (int(v) for v in p.rng.randint(0, 2, 2))
    d0, d1 = (int(v) for v in p.rng.randint(1, 3, 2))
    if (h + 2 * p0 - d0 * (kh - 1) - 1) < 0 or (w + 2 * p1 - d1 * (kw - 1) - 1) < 0:
        return None
    b = pick(p, lambda s: s == (o,), recent=False)
    return emit(p, "conv2d", [x, wt] + ([b] if b is not None else []),
                [s0, s1, p0, p1, d0, d1, g, int(b is not None)])


def g_rows_motif(p):
    """y = f(a); reduce(M * y, -1) + y: an intermediate read by every row of a
    row reduction and again by the op that consumes the reduction (the shape
    of issue 14.1's planner bug)."""
    a = pick(p, lambda s: len(s) >= 1 and s[-1] >= 2)
    if a is None:
        return None
    y = emit(p, p.rng.choice(["neg", "tanh", "sin", "square", "sigmoid"]), [a])
    if y is None:
        return None
    n = p.shape(y)[-1]
    m = pick(p, lambda s: len(s) >= 2 and s[-1] == n and broadcastable(s, p.shape(y)),
             recent=False)
    if m is None:
        return None
    t = emit(p, p.rng.choice(["mul", "add", "sub"]), [m, y])
    r = emit(p, p.rng.choice(["sum", "mean", "max", "logsumexp"]), [t], [0, 1, -1]) \
        if t is not None else None
    if r is None:
        return None
    return emit(p, p.rng.choice(["add", "mul", "sub"]), [r, y])


# op generators and their weights
GENS = [(g_rows_motif, 3), (g_unary, 24), (g_binary, 22), (g_scalar, 8), (g_where, 4),
        (g_reduce, 12), (g_axis, 5), (g_matmul, 6), (g_einsum, 2), (g_shape, 10), (g_index, 3),
        (g_nn, 4), (g_conv, 3)]


def themed_inputs(rng, size):
    """Input shapes: random small ones, or a theme (rows, matmul, conv, attention)."""
    if size == "small":
        t = rng.randint(6)
        if t == 0:
            return [(3, 4), (4,), (4,)]
        if t == 1:
            return [(2, 3), (3, 2)]
        if t == 2:
            return [(1, 2, 3, 3), (2, 2, 2, 2), (2,)]
        if t == 3:
            return [(2, 3, 2), (2, 3, 2)]
        shapes = []
        for _ in range(rng.randint(1, 4)):
            nd = rng.randint(0, 4)
            shapes.append(tuple(int(d) for d in rng.choice([1, 2, 3, 4], nd)))
        return shapes
    t = rng.randint(5)
    if t == 0:
        return [(192, 256), (256,), (256,)]
    if t == 1:
        return [(200, 180), (180, 160)]
    if t == 2:
        return [(4, 8, 32, 32), (8, 8, 3, 3), (8,)]
    if t == 3:
        return [(4, 64, 128), (4, 64, 128)]
    return [(40000,), (200, 200)]


def build(idx, rng, dt, size):
    while True:
        p = Program(rng, dt, size, themed_inputs(rng, size), idx)
        if size == "small" and sum(int(np.prod(s)) for s in p.in_shapes) > 24:
            continue
        n_ops = rng.randint(6, 18) if size == "small" else rng.randint(5, 12)
        tries = 0
        while len(p.ops) < n_ops and tries < 200:
            tries += 1
            gens, weights = zip(*GENS)
            g = gens[rng.choice(len(gens), p=np.array(weights) / sum(weights))]
            g(p)  # appends one op or more, or nothing
        if not p.ops or p.bools[-1] or p.vals[-1][0].size == 0:
            continue
        return p


# ---- transforms: the same chains as the C test ------------------------------------------
def tup(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def base_fn(p, which):
    n = p.n_in
    if which == "f":
        return lambda *a: (run_ops(p.ops, n, a),)
    return lambda *a: (jnp.sum(run_ops(p.ops, n, a[:n]) * a[n]),)


def apply_chain(p, chain):
    """The JAX function of chain (tokens after the base), its input and output counts."""
    toks = chain.split(".")
    fn = base_fn(p, toks[0])
    n_in, n_out = p.n_in + (toks[0] == "g"), 1
    argn = tuple(range(p.n_in))
    for t in toks[1:]:
        if t == "jit":
            continue
        if t == "grad":
            fn = (lambda f: lambda *a: tup(jax.grad(lambda *b: f(*b)[0], argn)(*a)))(fn)
            n_out = len(argn)
        elif t == "vjp":
            fn = (lambda f, ni: lambda *a: (lambda o, pb: tuple(o) + tuple(pb(tuple(a[ni:]))))(
                *jax.vjp(f, *a[:ni])))(fn, n_in)
            n_in, n_out = n_in + n_out, n_out + n_in
        elif t == "jvp":
            fn = (lambda f, ni: lambda *a: (lambda o, t: tuple(o) + tuple(t))(
                *jax.jvp(f, tuple(a[:ni]), tuple(a[ni:]))))(fn, n_in)
            n_in, n_out = 2 * n_in, 2 * n_out
        elif t in ("jacfwd", "jacrev"):
            jac = jax.jacfwd if t == "jacfwd" else jax.jacrev
            fn = (lambda f, no: lambda *a: tuple(
                blk for o in tup(jac(lambda *b: f(*b) if no > 1 else f(*b)[0], argn)(*a))
                for blk in tup(o)) if no > 1 else tup(jac(lambda *b: f(*b)[0], argn)(*a)))(
                fn, n_out)
            n_out = n_out * len(argn)
        elif t == "hessian":
            fn = (lambda f: lambda *a: tuple(
                blk for row in jax.hessian(lambda *b: f(*b)[0], argn)(*a) for blk in row))(fn)
            n_out = len(argn) ** 2
        elif t.startswith("vmap"):
            ia, oa = parse_vmap(t)
            fn = jax.vmap(fn, in_axes=tuple(ia), out_axes=tuple(oa))
        else:
            raise ValueError(t)
    return fn, n_in, n_out


def parse_vmap(t):
    _, ia, oa = t.split(":")
    conv = lambda s: None if s == "n" else int(s)
    return [conv(v) for v in ia.split(",")], [int(v) for v in oa.split(",")]


def vmap_token(p, in_axes, out_ranks):
    """"vmap:<in_axes>:<out_axes>" with random out_axes for outputs of out_ranks."""
    oa = [int(p.rng.randint(-r - 1, r + 1)) for r in out_ranks]
    return "vmap:%s:%s" % (",".join("n" if a is None else str(a) for a in in_axes),
                           ",".join(str(a) for a in oa))


def checks(p):
    """(chain, argument slots) of every check of program p."""
    n, rng = p.n_in, p.rng
    out = p.vals[-1][0]
    ct = p.slot(out.shape, -1, 1)
    t = [p.slot(s, -1, 1) for s in p.in_shapes]
    tct = p.slot(out.shape, -1, 1)
    X = list(range(n))
    C = [("f", X), ("f.eager", X), ("f.jit", X), ("g.grad", X + [ct]), ("g.grad.jit", X + [ct]),
         ("g.bwd", X + [ct]), ("f.vjp", X + [ct]), ("f.jvp", X + t), ("f.jvp.jit", X + t),
         ("g.grad.jvp", X + [ct] + t + [tct]), ("g.grad.jvp.jit", X + [ct] + t + [tct])]
    # vmap over the batched inputs xb (in_axes fixed per program); ct and the
    # tangents batched on axis 0 or not mapped
    ia = p.in_axes
    ct_axis = None if rng.rand() < 0.4 else 0
    ctb = p.slot(((p.B,) + out.shape) if ct_axis == 0 else out.shape, -1, 1)
    tb = [p.slot((p.B,) + s, -1, 1) for s in p.in_shapes]
    ranks_in = [len(s) for s in p.in_shapes]
    C.append(("f." + vmap_token(p, ia, [out.ndim]), p.xb))
    C.append(("f." + vmap_token(p, ia, [out.ndim]) + ".jit", p.xb))
    C.append(("g.grad." + vmap_token(p, ia + [ct_axis], ranks_in), p.xb + [ctb]))
    C.append(("f.jvp." + vmap_token(p, ia + [0] * n, [out.ndim] * 2), p.xb + tb))
    C.append(("g.grad.jvp." + vmap_token(p, ia + [ct_axis] + [0] * n + [None], ranks_in * 2),
              p.xb + [ctb] + tb + [tct]))
    if p.size == "small":
        C += [("f.jacfwd", X), ("f.jacrev", X), ("f.jacrev.jit", X), ("g.hessian", X + [ct]),
              ("g.grad.jacfwd", X + [ct]), ("g.grad.jacrev", X + [ct])]
    return C


def compile_checks(p, C):
    """Every check as one jitted function of all slots (compiling dominates the
    run time: one XLA program per program is cheapest)."""
    fns = []
    for chain, slots in C:
        toks = chain.split(".")
        if toks[1:2] == ["eager"]:
            chain = toks[0]
        if toks[1:2] == ["bwd"]:
            chain = toks[0] + ".grad"
        fns.append((apply_chain(p, chain)[0], slots))
    return jax.jit(lambda *a: [fn(*[a[s] for s in slots]) for fn, slots in fns])


def evaluate(run, p, rel=0.0, seed=0, dt=jnp.float64):
    """The checks' outputs (as float64 arrays) computed in dt at the slots'
    values, each scaled by (1 + rel * u), u uniform in [-1, 1) (a perturbation
    of rounding size)."""
    args = []
    for k in range(len(p.slots)):
        x = p.value(k)
        if rel:
            x = x * (1 + rel * uniform(seed + k, x.size, -1, 1).reshape(x.shape))
        args.append(jnp.asarray(x, dtype=dt))
    return [[np.asarray(o, dtype=np.float64) for o in outs] for outs in run(*args)]


def close(got, ref, rtol):
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    return got.shape == ref.shape and bool(
        np.all(np.abs(got - ref) <= rtol * (np.abs(ref) + scale) + 1e-300))


# ---- output ------------------------------------------------------------------------------
def fmt(v, dt):
    return ("%.9g" if dt == "f32" else "%.17g") % v


def fmt_attr(a):
    if isinstance(a, str):
        return a
    if isinstance(a, float):
        return repr(a)
    return str(int(a))


def write_ref(f, rid, arr, dt, wseed):
    dims = " ".join(str(d) for d in arr.shape)
    head = "ref %d %d%s%s" % (rid, arr.ndim, " " if arr.ndim else "", dims)
    flat = np.ravel(arr)
    if flat.size <= FULL_MAX:
        f.write("%s F %s\n" % (head, " ".join(fmt(v, dt) for v in flat)))
        return
    scale = float(np.max(np.abs(flat)))
    parts = [head, "P", fmt(scale, dt), str(wseed), str(N_PROJ)]
    for k in range(N_PROJ):
        w = uniform(wseed + k, flat.size, -1, 1)
        parts.append(fmt(float(np.dot(w, flat)), "f64"))
    rs = np.random.RandomState(wseed % (2**31))
    idx = np.sort(rs.choice(flat.size, min(N_SAMPLE, flat.size), replace=False))
    parts.append(str(len(idx)))
    for i in idx:
        parts += [str(int(i)), fmt(flat[i], dt)]
    f.write(" ".join(parts) + "\n")


def emit_program(f, p, idx, stats):
    C = checks(p)
    refs = []  # (array) stored once; later equal arrays point at the first
    lines = []
    run = compile_checks(p, C)
    high = evaluate(run, p)
    # conditioning: inputs moved by a few roundings of the dtype must move every
    # output by well under the tolerance (it also finds points near a kink)
    rel = 2.0**-21 if p.dt == "f32" else 2.0**-50
    shaken = [evaluate(run, p, rel, p.seed * 13 + 1000 * r) for r in range(2)]
    if p.dt == "f32":  # and JAX's own f32 meets a quarter of the tolerance
        shaken.append(evaluate(run, p, dt=jnp.float32))
    for k, ((chain, slots), outs) in enumerate(zip(C, high)):
        if any(not np.all(np.isfinite(o)) or (o.size and np.max(np.abs(o)) > 1e6) for o in outs):
            stats["rejected: unbounded derivatives"] += 1
            return False
        if not all(close(a, b, RTOL[p.dt] / 4) for sh in shaken for a, b in zip(sh[k], outs)):
            stats["rejected: ill-conditioned at the dtype"] += 1
            return False
        rids = []
        for o in outs:
            rid = next((k for k, r in enumerate(refs) if r.shape == o.shape and np.allclose(
                r, o, rtol=1e-13, atol=1e-13 * (1 + float(np.max(np.abs(o)) if o.size else 0)))),
                None)
            if rid is None:
                refs.append(o)
                rid = len(refs) - 1
            rids.append(rid)
        lines.append((chain, slots, rids))
    f.write("prog %d %s %s %d %d %d\n" % (idx, p.dt, p.size, p.n_in, len(p.ops), len(p.slots)))
    for k, (seed, lo, hi, shape) in enumerate(p.slots):
        f.write("arr %d %d %s %s %d%s%s\n" % (k, seed, repr(float(lo)), repr(float(hi)),
                                             len(shape), " " if shape else "",
                                             " ".join(str(d) for d in shape)))
    for name, ids, at in p.ops:
        f.write("op %s %d %s%s%s\n" % (name, len(ids), " ".join(str(i) for i in ids),
                                      " " if at else "", " ".join(fmt_attr(a) for a in at)))
    for rid, r in enumerate(refs):
        write_ref(f, rid, r, p.dt, p.seed * 7 + rid)
    for chain, slots, rids in lines:
        f.write("chk %s %d %s %d %s\n" % (chain, len(slots), " ".join(str(s) for s in slots),
                                          len(rids), " ".join(str(r) for r in rids)))
        stats["checks"] += len(rids)
    f.write("end\n")
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=320)
    ap.add_argument("--large", type=int, default=40, help="how many of them are large")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--out", default=os.path.join(HERE, "programs.txt"))
    args = ap.parse_args()
    rng = np.random.RandomState(args.seed)
    stats = {"checks": 0, "rejected: unbounded derivatives": 0,
             "rejected: ill-conditioned at the dtype": 0}
    with open(args.out, "w") as f:
        f.write("# nabla differential test: written by test/diff/gen_jax.py --programs %d "
                "--large %d --seed %d (JAX %s); format in test/diff/README.md\n"
                % (args.programs, args.large, args.seed, jax.__version__))
        f.write("tolerance f32 %s f64 %s\n" % (repr(RTOL["f32"]), repr(RTOL["f64"])))
        k = 0
        while k < args.programs:
            size = "large" if k >= args.programs - args.large else "small"
            dt = "f64" if k % 2 else "f32"
            p = build(k, rng, dt, size)
            if emit_program(f, p, k, stats):
                k += 1
                if k % 20 == 0:
                    print("%d programs, %d checks" % (k, stats["checks"]), file=sys.stderr)
    print(stats, file=sys.stderr)


if __name__ == "__main__":
    main()
