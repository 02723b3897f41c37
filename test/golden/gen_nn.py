#!/usr/bin/env python3
"""Writes test/golden/nn.txt: PyTorch (float64, CPU) values of the tanh GELU,
causal attention and the modules of include/nabla/nn.h on fixed weights, read
back by test/test_nn_modules.c (suite nn_modules).

Run from anywhere (environment: test/golden/README.md):
    bench/peers/.venv/bin/python test/golden/gen_nn.py

Format: that of autodiff.txt (test/golden/README.md): `case <name>`, records
`input|output <name> <f64|i64> <ndim> <dims...>` followed by the values
(%.17g), `end`. A record named "p.<entry>" is the module's parameter
<entry> in nabla's layout (a linear weight is [in, out], torch's weight
transposed); the C test builds the parameter tree from them.
"""
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "nn.txt")
torch.set_default_dtype(torch.float64)
rng = np.random.default_rng(17)


def randn(*shape, scale=1.0):
    return torch.tensor(rng.standard_normal(shape) * scale)


class Case:
    def __init__(self, name):
        self.name, self.recs = name, []

    def add(self, kind, name, t):
        t = torch.as_tensor(t).detach()
        self.recs.append((kind, name, t))

    def write(self, f):
        f.write(f"case {self.name}\n")
        for kind, name, t in self.recs:
            dt = "i64" if t.dtype == torch.int64 else "f64"
            dims = " ".join(str(d) for d in t.shape)
            f.write(f"{kind} {name} {dt} {t.dim()}{' ' if dims else ''}{dims}\n")
            vals = t.reshape(-1).tolist()
            for i in range(0, len(vals), 6):
                f.write(" ".join(("%d" % v) if dt == "i64" else ("%.17g" % v)
                                 for v in vals[i:i + 6]) + "\n")
        f.write("end\n")


def grads_of(out, inputs, cot):
    return torch.autograd.grad((out * cot).sum(), inputs)


# ---- the modules in torch, with nabla's parameter names and layouts ----------------------------
def linear(p, pre, x, w="w", b="b"):
    y = x @ p[f"{pre}{w}"]
    return y + p[f"{pre}{b}"] if f"{pre}{b}" in p else y


def layer_norm(p, pre, x, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], p[f"{pre}w"], p.get(f"{pre}b"), eps)


def attention(p, pre, x, heads):
    *lead, T, d = x.shape
    def split(t):
        return t.reshape(*lead, T, heads, d // heads).transpose(-3, -2)
    q, k, v = (split(linear(p, pre, x, f"w_{n}", f"b_{n}")) for n in "qkv")
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = y.transpose(-3, -2).reshape(*lead, T, d)
    return linear(p, pre, y, "w_o", "b_o")


def mlp(p, pre, x, n):
    for i in range(n):
        x = linear(p, f"{pre}{i}.", x)
        if i + 1 < n:
            x = F.gelu(x, approximate="tanh")
    return x


def block(p, pre, x, heads):
    x = x + attention(p, pre + "attn.", layer_norm(p, pre + "ln_1.", x), heads)
    return x + mlp(p, pre + "mlp.", layer_norm(p, pre + "ln_2.", x), 2)


def gpt(p, idx, layers, heads):
    T = idx.shape[-1]
    x = p["wte.w"][idx] + p["wpe.w"][torch.arange(T)]
    for i in range(layers):
        x = block(p, f"h.{i}.", x, heads)
    return layer_norm(p, "ln_f.", x) @ p["lm_head.w"]


def params(c, shapes, scale=0.5):
    p = {}
    for name, shape in shapes:
        norm_scale = (name.rsplit(".", 2)[-2:-1] in (["ln_1"], ["ln_2"], ["ln_f"]) and
                      name.endswith(".w")) or (c.name.endswith("norm") and name == "w")
        if norm_scale:  # near 1, as trained norms are
            p[name] = (1 + randn(*shape, scale=0.2)).requires_grad_()
        else:
            p[name] = randn(*shape, scale=scale).requires_grad_()
        c.add("input", "p." + name, p[name])
    return p


def attn_shapes(pre, d):
    return [(f"{pre}w_{n}", (d, d)) for n in "qkvo"] + [(f"{pre}b_{n}", (d,)) for n in "qkvo"]


def block_shapes(pre, d, h):
    return ([(f"{pre}ln_1.w", (d,)), (f"{pre}ln_1.b", (d,))] + attn_shapes(pre + "attn.", d) +
            [(f"{pre}ln_2.w", (d,)), (f"{pre}ln_2.b", (d,)),
             (f"{pre}mlp.0.w", (d, h)), (f"{pre}mlp.0.b", (h,)),
             (f"{pre}mlp.1.w", (h, d)), (f"{pre}mlp.1.b", (d,))])


def main():
    cases = []

    # tanh GELU: values and the derivative of sum(y * c)
    c = Case("gelu_tanh")
    x = torch.cat([torch.linspace(-7, 7, 57), randn(23, scale=2.0)]).requires_grad_()
    cot = randn(80)
    y = F.gelu(x, approximate="tanh")
    c.add("input", "x", x), c.add("input", "cot", cot), c.add("output", "y", y)
    c.add("output", "dx", grads_of(y, [x], cot)[0])
    cases.append(c)

    # causal attention, square, wide (Lq < Lk) and tall (Lq > Lk): top-left aligned
    for name, lq, lk in [("attention_causal", 5, 5), ("attention_causal_wide", 3, 5),
                         ("attention_causal_tall", 5, 3)]:
        c = Case(name)
        q = randn(2, 3, lq, 4).requires_grad_()
        k = randn(2, 3, lk, 4).requires_grad_()
        v = randn(2, 3, lk, 6).requires_grad_()
        cot = randn(2, 3, lq, 6)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert torch.isfinite(y).all()
        for n, t in [("q", q), ("k", k), ("v", v), ("cot", cot)]:
            c.add("input", n, t)
        c.add("output", "y", y)
        for n, g in zip(["dq", "dk", "dv"], grads_of(y, [q, k, v], cot)):
            c.add("output", n, g)
        cases.append(c)

    # modules on fixed weights: output, and the gradients of sum(y * cot) wrt x (float inputs)
    # and every parameter ("g.<entry>")
    def module_case(name, shapes, x, fn):
        c = Case(name)
        p = params(c, shapes)
        c.add("input", "x", x)
        y = fn(p, x)
        cot = randn(*y.shape)
        c.add("input", "cot", cot)
        c.add("output", "y", y)
        names = list(p)
        gs = grads_of(y, [p[n] for n in names], cot)
        for n, g in zip(names, gs):
            c.add("output", "g." + n, g)
        if x.dtype == torch.float64:
            c.add("output", "dx", grads_of(fn(p, x), [x], cot)[0])
        cases.append(c)


    module_case("linear", [("w", (4, 5)), ("b", (5,))], randn(3, 4).requires_grad_(),
                lambda p, x: linear(p, "", x))
    module_case("layer_norm", [("w", (6,)), ("b", (6,))], randn(3, 6, scale=2.0).requires_grad_(),
                lambda p, x: layer_norm(p, "", x))
    module_case("rms_norm", [("w", (6,))], randn(3, 6, scale=2.0).requires_grad_(),
                lambda p, x: F.rms_norm(x, (6,), p["w"], 1e-6))
    module_case("mlp", [("0.w", (4, 8)), ("0.b", (8,)), ("1.w", (8, 3)), ("1.b", (3,))],
                randn(2, 4).requires_grad_(), lambda p, x: mlp(p, "", x, 2))
    module_case("self_attention", attn_shapes("", 8), randn(2, 5, 8).requires_grad_(),
                lambda p, x: attention(p, "", x, 2))
    module_case("block", block_shapes("", 8, 16), randn(2, 5, 8).requires_grad_(),
                lambda p, x: block(p, "", x, 2))
    gpt_shapes = ([("wte.w", (11, 8)), ("wpe.w", (6, 8))] + block_shapes("h.0.", 8, 32) +
                  block_shapes("h.1.", 8, 32) +
                  [("ln_f.w", (8,)), ("ln_f.b", (8,)), ("lm_head.w", (8, 11))])
    module_case("gpt", gpt_shapes, torch.tensor(rng.integers(0, 11, (2, 6))),
                lambda p, x: gpt(p, x, 2, 2))

    with open(OUT, "w") as f:
        f.write("# test/golden/nn.txt — written by test/golden/gen_nn.py (torch %s, float64); "
                "do not edit\n" % torch.__version__)
        for c in cases:
            c.write(f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
