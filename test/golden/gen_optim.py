#!/usr/bin/env python3
"""Writes test/golden/optim.txt: parameter trajectories of torch.optim
optimizers over 100 steps, read back by test/test_optim_golden.c, which runs
nabla's optimizers (include/nabla/optim.h) on the same problem and compares.

Run from anywhere (see test/golden/README.md for the environment):
    python3 test/golden/gen_optim.py

The problem needs no data from the file: every value is exact in binary.
Parameters (a tree, in this order):
    w [4,3], b [3], h.0.w [2,5], h.0.b [5], scale []
element i of the concatenation of all of them (i = 0..30) starts at
    p0[i] = ((5 i + 3) mod 11 - 5) / 4
and at step t (t = 1..100) its gradient is
    g = p * a[i] + s(t, i),  a[i] = (1 + i mod 3) / 4,
    s(t, i) = ((7 t + 13 i) mod 17 - 8) / 8,
computed in the parameters' dtype (a mul then an add, as the C test does).

File format (whitespace separated):
    # comment lines
    case <name> <dtype f32|f64>
    step <t>            then the 31 parameter values after step t, in order
    end
Values are printed with %.17g. The C test names each case's optimizer.
"""
import math
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "optim.txt")

SHAPES = [("w", (4, 3)), ("b", (3,)), ("h.0.w", (2, 5)), ("h.0.b", (5,)), ("scale", ())]
N = sum(math.prod(s) for _, s in SHAPES)
STEPS = 100
CHECK = [1, 2, 10, 50, 100]


def make_params(dtype):
    flat = [((5 * i + 3) % 11 - 5) / 4 for i in range(N)]
    out, k = [], 0
    for _, shape in SHAPES:
        n = math.prod(shape)
        out.append(torch.tensor(flat[k:k + n], dtype=dtype).reshape(shape).requires_grad_(False))
        k += n
    return out


def grads(params, t):
    """g = p * a + s, per element, in the parameters' dtype."""
    out, k = [], 0
    for p in params:
        n = p.numel()
        a = torch.tensor([(1 + (k + j) % 3) / 4 for j in range(n)], dtype=p.dtype).reshape(p.shape)
        s = torch.tensor([((7 * t + 13 * (k + j)) % 17 - 8) / 8 for j in range(n)],
                         dtype=p.dtype).reshape(p.shape)
        out.append(p.detach() * a + s)
        k += n
    return out


def is_matrix(i):
    return len(SHAPES[i][1]) >= 2


def warmup_cosine(init, peak, warmup, steps, end):
    """optax.warmup_cosine_decay_schedule"""
    def f(t):
        if t < warmup:
            return init + (peak - init) * t / warmup
        c = min(t - warmup, steps - warmup)
        alpha = end / peak
        return peak * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * c / (steps - warmup))) + alpha)
    return f


def cosine(init, steps, alpha):
    def f(t):
        c = min(t, steps)
        return init * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * c / steps)) + alpha)
    return f


def run_torch(params, make_opt, sched=None, clip=None):
    """Steps a torch optimizer: make_opt(params) -> optimizer; sched(t) -> lr
    (LambdaLR with base lr 1: lr = sched(t) at step t = 0, 1, ...)."""
    opt = make_opt(params)
    if sched is not None:
        for grp in opt.param_groups:
            grp["lr"] = 1.0
            grp["initial_lr"] = 1.0
        lrs = torch.optim.lr_scheduler.LambdaLR(opt, sched)
    out = {}
    for t in range(1, STEPS + 1):
        for p, g in zip(params, grads(params, t)):
            p.grad = g
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        if sched is not None:
            lrs.step()
        if t in CHECK:
            out[t] = torch.cat([p.detach().reshape(-1) for p in params]).to(torch.float64).tolist()
    return out


def run_lion(params, lr, b1, b2, wd):
    """Lion as optax.lion computes it (torch.optim has none)."""
    mu = [torch.zeros_like(p) for p in params]
    out = {}
    for t in range(1, STEPS + 1):
        for i, (p, g) in enumerate(zip(params, grads(params, t))):
            c = g * (1 - b1) + mu[i] * b1
            mu[i] = g * (1 - b2) + mu[i] * b2
            u = (torch.sign(c) + p * wd) * (-lr)
            p.add_(u)
        if t in CHECK:
            out[t] = torch.cat([p.reshape(-1) for p in params]).to(torch.float64).tolist()
    return out


def decay_groups(params, wd):
    """torch param groups: weight decay on matrices only (nb_decay_matrices)"""
    return [{"params": [p for i, p in enumerate(params) if is_matrix(i)], "weight_decay": wd},
            {"params": [p for i, p in enumerate(params) if not is_matrix(i)], "weight_decay": 0.0}]


CASES = [
    ("sgd", lambda ps: run_torch(ps, lambda p: torch.optim.SGD(p, lr=0.1))),
    ("sgd_momentum", lambda ps: run_torch(ps, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))),
    ("sgd_nesterov", lambda ps: run_torch(
        ps, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True))),
    ("sgd_weight_decay", lambda ps: run_torch(
        ps, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5, weight_decay=0.01))),
    ("adam", lambda ps: run_torch(
        ps, lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.9, 0.999), eps=1e-8))),
    ("adamw_masked", lambda ps: run_torch(
        ps, lambda p: torch.optim.AdamW(decay_groups(p, 0.1), lr=0.01, betas=(0.9, 0.95),
                                        eps=1e-8))),
    ("lion", lambda ps: run_lion(ps, 1e-3, 0.9, 0.99, 0.1)),
    ("adam_cosine", lambda ps: run_torch(
        ps, lambda p: torch.optim.Adam(p, lr=1.0, betas=(0.9, 0.999), eps=1e-8),
        sched=cosine(0.02, 80, 0.1))),
    ("clip_adamw_warmup_cosine", lambda ps: run_torch(
        ps, lambda p: torch.optim.AdamW(decay_groups(p, 0.1), lr=1.0, betas=(0.9, 0.95),
                                        eps=1e-8),
        sched=warmup_cosine(0.0, 0.03, 10, 100, 0.003), clip=1.0)),
]


def main():
    lines = ["# Golden optimizer trajectories for test/test_optim_golden.c, generated by",
             "# test/golden/gen_optim.py with torch %s. Do not edit by hand." % torch.__version__]
    for name, run in CASES:
        for dtype, tag in ((torch.float64, "f64"), (torch.float32, "f32")):
            traj = run(make_params(dtype))
            lines.append("case %s %s" % (name, tag))
            for t in CHECK:
                lines.append("step %d" % t)
                vals = traj[t]
                for k in range(0, len(vals), 4):
                    lines.append(" ".join("%.17g" % v for v in vals[k:k + 4]))
            lines.append("end")
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
