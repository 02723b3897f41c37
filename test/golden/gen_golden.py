#!/usr/bin/env python3
"""Writes test/golden/autodiff.txt: derivatives of composite functions computed
with JAX in float64, read back by test/test_golden.c, which computes the same
functions with nabla's transforms and compares.

Run from anywhere (see test/golden/README.md for the environment):
    python3 test/golden/gen_golden.py

File format (whitespace separated, one record after another):
    # comment lines
    case <name>
    input  <name> <dtype> <ndim> <dims...>     followed by numel values
    output <name> <dtype> <ndim> <dims...>     followed by numel values
    end
dtype is f64 or i64; values are row-major, floats printed with %.17g so they
round-trip exactly. Inputs are the points the C test evaluates at; outputs are
what JAX computed there. Every function below has a twin in test_golden.c.
"""
import os
import sys

import numpy as np
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "autodiff.txt")

CASES = []  # (name, [(kind, tensor name, array)])


def case(name, inputs, outputs):
    recs = [("input", k, np.asarray(v)) for k, v in inputs]
    recs += [("output", k, np.asarray(v)) for k, v in outputs]
    CASES.append((name, recs))


def rng(seed):
    return np.random.RandomState(seed)


def same(a, b):
    """JAX's jacrev and jacfwd must agree before one copy is written."""
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


# ---- hessian of sum(sin(x)), x [2,3]: the seed example --------------------------
def sum_sin(x):
    return jnp.sum(jnp.sin(x))


x = rng(1).uniform(-2, 2, (2, 3))
case("hess_sum_sin", [("x", x)], [("h", jax.hessian(sum_sin)(x))])


# ---- two-layer MLP ---------------------------------------------------------------
# inputs (x[8,3], y[8,1], W1[3,5], b1[5], W2[5,1], b2[1]); params are argnums 2..5
#   h = relu(x @ W1 + b1); pred = tanh(h @ W2 + b2); loss = mean((pred - y)^2)
def mlp_pred(x, y, W1, b1, W2, b2):
    h = jax.nn.relu(x @ W1 + b1)
    return jnp.tanh(h @ W2 + b2)


def mlp_loss(x, y, W1, b1, W2, b2):
    return jnp.mean((mlp_pred(x, y, W1, b1, W2, b2) - y) ** 2)


def mlp_both(*a):  # two outputs: (loss, pred), for output-major Jacobians
    return mlp_loss(*a), mlp_pred(*a)


r = rng(2)
mlp_in = [
    ("x", r.normal(size=(8, 3))),
    ("y", r.normal(size=(8, 1)) * 0.5),
    ("W1", r.normal(size=(3, 5)) * 0.8),
    ("b1", r.normal(size=(5,)) * 0.3),
    ("W2", r.normal(size=(5, 1)) * 0.8),
    ("b2", r.normal(size=(1,)) * 0.3),
]
a = [v for _, v in mlp_in]
pre = a[0] @ a[2] + a[3]
assert np.min(np.abs(pre)) > 1e-3, "relu input too close to its kink"
assert 0 < np.sum(pre > 0) < pre.size, "relu should be partly active"
P = (2, 3, 4, 5)
PN = ("W1", "b1", "W2", "b2")
g = jax.grad(mlp_loss, argnums=P)(*a)
jr = jax.jacrev(mlp_both, argnums=P)(*a)
jf = jax.jacfwd(mlp_both, argnums=P)(*a)
same(jr, jf)
outs = [("loss", mlp_loss(*a))]
outs += [("grad_" + n, v) for n, v in zip(PN, g)]
for o, on in enumerate(("loss", "pred")):
    outs += [("jac_%s_%s" % (on, n), v) for n, v in zip(PN, jr[o])]
case("mlp", mlp_in, outs)


# ---- softmax(x @ W): jacrev and jacfwd wrt x and W --------------------------------
def softmax_mm(x, W):
    return jax.nn.softmax(x @ W, axis=-1)


r = rng(3)
x, W = r.normal(size=(4, 3)), r.normal(size=(3, 5))
jr = jax.jacrev(softmax_mm, argnums=(0, 1))(x, W)
jf = jax.jacfwd(softmax_mm, argnums=(0, 1))(x, W)
same(jr, jf)
case("softmax_matmul", [("x", x), ("W", W)], [("jac_x", jr[0]), ("jac_W", jr[1])])


# ---- hessian of logsumexp(A @ x) wrt x (argnum 1) ---------------------------------
def lse(A, x):
    return jax.scipy.special.logsumexp(A @ x)


r = rng(4)
A, x = r.normal(size=(5, 4)), r.normal(size=(4,))
case("hess_logsumexp", [("A", A), ("x", x)], [("h", jax.hessian(lse, argnums=1)(A, x))])


# ---- hessian of a layer norm summed with weights ----------------------------------
#   f(x, w) = sum(w * (x - mean(x, -1)) / sqrt(var(x, -1) + eps)), eps = 1e-5
def layer_norm(x, w):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return jnp.sum(w * (x - mu) / jnp.sqrt(var + 1e-5))


r = rng(5)
x, w = r.normal(size=(3, 4)), r.normal(size=(4,))
case("hess_layer_norm", [("x", x), ("w", w)],
     [("h", jax.hessian(layer_norm)(x, w)), ("grad_w", jax.grad(layer_norm, 1)(x, w))])


# ---- third derivative of sum(tanh(x)^3), x [3]: jacfwd(jacfwd(jacrev(f))) ---------
def tanh3(x):
    return jnp.sum(jnp.tanh(x) ** 3)


x = np.array([-0.7, 0.3, 1.1])
d3 = jax.jacfwd(jax.jacfwd(jax.jacrev(tanh3)))(x)
case("third_tanh3", [("x", x)], [("d3", d3)])


# ---- cross-entropy of log_softmax with integer labels -----------------------------
#   loss = -mean_i log_softmax(x @ W + b)[i, labels[i]]
def xent(W, b, x, labels):
    lp = jax.nn.log_softmax(x @ W + b, axis=-1)
    return -jnp.mean(jnp.take_along_axis(lp, labels[:, None], axis=1))


r = rng(6)
W, b, x = r.normal(size=(3, 4)), r.normal(size=(4,)) * 0.3, r.normal(size=(6, 3))
labels = np.array([0, 3, 1, 1, 2, 3], dtype=np.int64)
gW, gb = jax.grad(xent, argnums=(0, 1))(W, b, x, labels)
case("xent", [("W", W), ("b", b), ("x", x), ("labels", labels)],
     [("loss", xent(W, b, x, labels)), ("grad_W", gW), ("grad_b", gb)])


# ---- broadcasting: f(x, y) = x[3,1] * y[1,4] + exp(x) -----------------------------
def bcast(x, y):
    return x * y + jnp.exp(x)


r = rng(7)
x, y = r.normal(size=(3, 1)), r.normal(size=(1, 4))
jf = jax.jacfwd(bcast, argnums=(0, 1))(x, y)
same(jf, jax.jacrev(bcast, argnums=(0, 1))(x, y))
case("broadcast", [("x", x), ("y", y)], [("jac_x", jf[0]), ("jac_y", jf[1])])


# ---- grad of sum(cumsum(x, 1) * x) -------------------------------------------------
def cumsum_x(x):
    return jnp.sum(jnp.cumsum(x, axis=1) * x)


x = rng(8).normal(size=(3, 4))
case("cumsum", [("x", x)], [("grad", jax.grad(cumsum_x)(x))])


# ---- max/min reductions and maximum on distinct values -----------------------------
#   f(x, y) = sum(max(x, 1)^2) + max(x) + sum(min(x, 0)) + sum(maximum(x, y))
def maxes(x, y):
    return (jnp.sum(jnp.max(x, axis=1) ** 2) + jnp.max(x) + jnp.sum(jnp.min(x, axis=0))
            + jnp.sum(jnp.maximum(x, y)))


r = rng(9)
x = (r.permutation(12).reshape(3, 4) - 5.5) * 0.25 + r.uniform(-0.05, 0.05, (3, 4))
y = r.normal(size=(3, 4))
assert np.unique(x).size == x.size and np.min(np.abs(x - y)) > 1e-3
gx, gy = jax.grad(maxes, argnums=(0, 1))(x, y)
case("max_reductions", [("x", x), ("y", y)], [("grad_x", gx), ("grad_y", gy)])


# ---- value_and_grad with argnums (2, 0): gradients in argnums order ----------------
#   f(a[2,3], b[2,3], c[3]) = sum(a * sin(b)) + sum(c^2 * a) + sum(c)^3
def vg_fn(a, b, c):
    return jnp.sum(a * jnp.sin(b)) + jnp.sum(c ** 2 * a) + jnp.sum(c) ** 3


r = rng(10)
a, b, c = r.normal(size=(2, 3)), r.normal(size=(2, 3)), r.normal(size=(3,))
val, (gc, ga) = jax.value_and_grad(vg_fn, argnums=(2, 0))(a, b, c)
case("value_and_grad", [("a", a), ("b", b), ("c", c)],
     [("value", val), ("grad_c", gc), ("grad_a", ga)])


# ---- hessian wrt two argnums, vector output -----------------------------------------
#   f(a[2,3], b[3]) = tanh(a @ b) * sum(a, 1)            -> [2]
#   blocks (a,a) [2,2,3,2,3], (a,b) [2,2,3,3], (b,a) [2,3,2,3], (b,b) [2,3,3]
def hess2(a, b):
    return jnp.tanh(a @ b) * jnp.sum(a, axis=1)


r = rng(11)
a, b = r.normal(size=(2, 3)) * 0.7, r.normal(size=(3,)) * 0.7
H = jax.hessian(hess2, argnums=(0, 1))(a, b)
case("hess_two_argnums", [("a", a), ("b", b)],
     [("h_aa", H[0][0]), ("h_ab", H[0][1]), ("h_ba", H[1][0]), ("h_bb", H[1][1])])


# ---- the seed example: jacfwd(jacrev(vmap(foo))), foo(x) = sum(sin(x)) per row --------
#   x [2,3]; vmap(foo) [2]; jacrev [2,2,3]; jacfwd of that [2,2,3,2,3]
def foo(x):
    return jnp.sum(jnp.sin(x))


x = rng(12).uniform(-2, 2, (2, 3))
d2 = jax.jacfwd(jax.jacrev(jax.vmap(foo)))(x)
assert d2.shape == (2, 2, 3, 2, 3)
same(d2, jax.jacrev(jax.jacfwd(jax.vmap(foo)))(x))
case("seed_jacfwd_jacrev_vmap", [("x", x)], [("d2", d2)])


# ---- per-example gradients: vmap(grad(loss)) of a small MLP over a batch ----------------
#   params W1 [3,4], b1 [4], W2 [4,2], b2 [2] (unbatched); x [5,3], y [5,2] (batched)
#   loss(W1, b1, W2, b2, x, y) = mean((tanh(x @ W1 + b1) @ W2 + b2 - y)^2) for one example
def ex_loss(W1, b1, W2, b2, x, y):
    return jnp.mean((jnp.tanh(x @ W1 + b1) @ W2 + b2 - y) ** 2)


r = rng(13)
pe_in = [
    ("W1", r.normal(size=(3, 4)) * 0.7),
    ("b1", r.normal(size=(4,)) * 0.3),
    ("W2", r.normal(size=(4, 2)) * 0.7),
    ("b2", r.normal(size=(2,)) * 0.3),
    ("x", r.normal(size=(5, 3))),
    ("y", r.normal(size=(5, 2))),
]
a = [v for _, v in pe_in]
pe = jax.vmap(jax.grad(ex_loss, argnums=(0, 1, 2, 3)), in_axes=(None, None, None, None, 0, 0))(*a)
for i, g_i in enumerate(zip(*[list(t) for t in pe])):  # the loop of grad agrees
    same(g_i, jax.grad(ex_loss, argnums=(0, 1, 2, 3))(*a[:4], a[4][i], a[5][i]))
case("per_example_grads", pe_in, [("g_" + n, v) for n, v in zip(("W1", "b1", "W2", "b2"), pe)])


# ---- jit(vmap(grad(f))) with in_axes (0, None): x [4,3] batched, w [3] shared -----------
#   f(x, w) = sum(tanh(x * w)^2) + logsumexp(x * w) for one example x [3]
def jvg_f(x, w):
    return jnp.sum(jnp.tanh(x * w) ** 2) + jax.scipy.special.logsumexp(x * w)


r = rng(14)
x, w = r.normal(size=(4, 3)), r.normal(size=(3,))
gx, gw = jax.jit(jax.vmap(jax.grad(jvg_f, argnums=(0, 1)), in_axes=(0, None)))(x, w)
case("jit_vmap_grad", [("x", x), ("w", w)], [("g_x", gx), ("g_w", gw)])


# ---- jvp and vjp through lax.scan: a cumulative-product-like recurrence -----------------
#   body(c, x) = (c * x + 0.5 sin(x), c * x); c0 [2], xs [4,2] -> (carry [2], ys [4,2])
def scan_body(c, x):
    return c * x + 0.5 * jnp.sin(x), c * x


def scan_f(c0, xs):
    return jax.lax.scan(scan_body, c0, xs)


r = rng(15)
c0, xs = r.uniform(0.5, 1.5, (2,)), r.uniform(0.5, 1.5, (4, 2))
tc0, txs = r.normal(size=(2,)), r.normal(size=(4, 2))
gc, gys = r.normal(size=(2,)), r.normal(size=(4, 2))
(carry, ys), (tcarry, tys) = jax.jvp(scan_f, (c0, xs), (tc0, txs))
_, pull = jax.vjp(scan_f, c0, xs)
gc0, gxs = pull((gc, gys))
case("scan", [("c0", c0), ("xs", xs), ("t_c0", tc0), ("t_xs", txs), ("g_carry", gc), ("g_ys", gys)],
     [("carry", carry), ("ys", ys), ("t_carry", tcarry), ("t_ys", tys), ("g_c0", gc0),
      ("g_xs", gxs)])


# ---- jvp and vjp through lax.cond, both branches -----------------------------------------
#   f(x, w) = cond(sum(x) > 0, sin(x) * w, x * w^2 + cos(w)); x, w [3]
def cond_f(x, w):
    return jax.lax.cond(jnp.sum(x) > 0, lambda x, w: jnp.sin(x) * w,
                        lambda x, w: x * w ** 2 + jnp.cos(w), x, w)


r = rng(16)
w, tx, tw, gy = r.normal(size=(3,)), r.normal(size=(3,)), r.normal(size=(3,)), r.normal(size=(3,))
cond_in, cond_out = [("w", w), ("t_x", tx), ("t_w", tw), ("g_y", gy)], []
for branch, x in (("then", np.array([0.9, -0.2, 0.6])), ("else", np.array([-0.8, 0.3, -0.4]))):
    assert (np.sum(x) > 0) == (branch == "then")
    y, ty = jax.jvp(cond_f, (x, w), (tx, tw))
    _, pull = jax.vjp(cond_f, x, w)
    gx, gw = pull(gy)
    cond_in.append(("x_" + branch, x))
    cond_out += [(n + "_" + branch, v) for n, v in
                 (("y", y), ("t_y", ty), ("g_x", gx), ("g_w", gw))]
case("cond", cond_in, cond_out)


# ---- hessian through lax.fori_loop --------------------------------------------------------
#   x <- x + 0.1 (i + 1) sin(x) * x[::-1] for i in 0..2, then sum(x^2); x [3] -> h [3,3]
def fori_f(x):
    x = jax.lax.fori_loop(0, 3, lambda i, x: x + 0.1 * (i + 1) * jnp.sin(x) * x[::-1], x)
    return jnp.sum(x ** 2)


x = rng(17).normal(size=(3,))
case("hess_fori_loop", [("x", x)], [("h", jax.hessian(fori_f)(x))])


# ---- write ----------------------------------------------------------------------------
def fmt(v):
    return "%.17g" % v


def write(path):
    lines = [
        "# Golden derivatives for test/test_golden.c, generated by test/golden/gen_golden.py",
        "# with JAX %s (float64). Do not edit by hand." % jax.__version__,
    ]
    for name, recs in CASES:
        lines.append("case " + name)
        for kind, tname, v in recs:
            if np.issubdtype(v.dtype, np.integer):
                dt, vals = "i64", ["%d" % e for e in v.reshape(-1)]
            else:
                dt, vals = "f64", [fmt(e) for e in np.asarray(v, np.float64).reshape(-1)]
            lines.append(" ".join([kind, tname, dt, str(v.ndim)] + [str(d) for d in v.shape]))
            for i in range(0, len(vals), 4):
                lines.append(" ".join(vals[i:i + 4]))
        lines.append("end")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


write(OUT)
print("wrote %s (%d bytes, %d cases)" % (OUT, os.path.getsize(OUT), len(CASES)), file=sys.stderr)
