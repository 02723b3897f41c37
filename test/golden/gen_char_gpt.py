#!/usr/bin/env python3
"""Writes test/golden/char_gpt.txt and test/golden/char_gpt_init.safetensors:
50 training steps of a tiny char-level GPT in PyTorch (float32, CPU, dropout
off), read back by test/test_char_gpt.c, which loads the initial weights with
nb_load_safetensors, trains nabla's nb_gpt (include/nabla/nn.h) from them on
the same batches with the same optimizer and requires the same losses to 1e-4.

Run from anywhere (environment: test/golden/README.md):
    bench/peers/.venv/bin/python test/golden/gen_char_gpt.py

The model is gen_nn.gpt (GPT-2's architecture written in nabla's layout:
linear weights [in, out]). The trained leaves hold PyTorch's layout, as a
model's state_dict would: nn.Linear weights [out, in] (attention projections,
MLP layers, lm_head), applied through their transposes; embeddings and norms
are the same in both. The weights file is what a PyTorch user would export
for nabla: safetensors.torch.save_file of the initial weights under nb_gpt's
tree names, the Linear weights transposed to [in, out] here in Python. Both sides take batches from one 64-bit LCG over the
token sequence: state = state * 6364136223846793005 + 1442695040888963407
(mod 2^64), offset = (state >> 33) mod (n - T - 1), x = tokens[offset :
offset + T], y = tokens[offset + 1 : offset + T + 1], BATCH windows per step.
The optimizer: clip_grad_norm_(1.0), then AdamW (betas 0.9 / 0.95, eps 1e-8,
weight decay 0.1 on rank >= 2 parameters only) with optax's warmup-cosine
learning rate (0 -> 1e-2 over 5 steps, cosine to 1e-3 at step 50; the rate
at update t, t = 0, 1, ..., is the schedule at t).

char_gpt.txt has autodiff.txt's format (test/golden/README.md): case
char_gpt with the records config (i64: vocab, context, dim, n_layers,
n_heads, batch, steps), tokens (i64) and the output losses (f64 [steps]: the
loss of each step's batch before its update).
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_nn  # noqa: E402  (the torch twin of nb_gpt)

OUT = os.path.join(HERE, "char_gpt.txt")
WEIGHTS = os.path.join(HERE, "char_gpt_init.safetensors")
TEXT = ("It was the best of times, it was the worst of times, it was the age of "
        "wisdom, it was the age of foolishness, it was the epoch of belief, it was "
        "the epoch of incredulity, it was the season of Light, it was the season of "
        "Darkness, it was the spring of hope, it was the winter of despair.")
CONTEXT, DIM, LAYERS, HEADS, BATCH, STEPS = 8, 16, 2, 2, 4, 50
PEAK, WARMUP, END = 1e-2, 5, 1e-3
MASK64 = (1 << 64) - 1


def schedule(step):
    """optax.warmup_cosine_decay_schedule(0, PEAK, WARMUP, STEPS, END)."""
    if step < WARMUP:
        return PEAK * step / WARMUP
    t = min(step - WARMUP, STEPS - WARMUP) / (STEPS - WARMUP)
    return END + (PEAK - END) * 0.5 * (1 + math.cos(math.pi * t))


def is_linear_weight(name):
    """nn.Linear weights: [out, in] in PyTorch, [in, out] in nabla."""
    parts = name.split(".")
    return name == "lm_head.w" or (len(parts) > 2 and parts[-2] == "attn" and
                                   parts[-1].startswith("w_")) or \
        (len(parts) > 3 and parts[-3] == "mlp" and parts[-1] == "w")


def nabla_layout(params):
    return {n: p.t() if is_linear_weight(n) else p for n, p in params.items()}


def main():
    torch.manual_seed(0)
    chars = sorted(set(TEXT))
    tokens = [chars.index(ch) for ch in TEXT]
    vocab = len(chars)
    rng = np.random.default_rng(7)
    shapes = ([("wte.w", (vocab, DIM)), ("wpe.w", (CONTEXT, DIM))] +
              sum((gen_nn.block_shapes(f"h.{i}.", DIM, 4 * DIM) for i in range(LAYERS)), []) +
              [("ln_f.w", (DIM,)), ("ln_f.b", (DIM,)), ("lm_head.w", (DIM, vocab))])
    params = {}
    for name, shape in shapes:
        if name.endswith(".b") or name.split(".")[-1].startswith("b_"):
            v = rng.uniform(-0.1, 0.1, shape)
        elif name.rsplit(".", 2)[-2] in ("ln_1", "ln_2", "ln_f"):
            v = 1 + 0.1 * rng.standard_normal(shape)
        else:
            fan_in = shape[0] if name != "wte.w" and name != "wpe.w" else 1
            v = rng.standard_normal(shape) * (0.02 if fan_in == 1 else 1 / math.sqrt(fan_in))
        if is_linear_weight(name):  # drawn [in, out], held as nn.Linear.weight [out, in]
            v = v.T
        params[name] = torch.tensor(np.ascontiguousarray(v), dtype=torch.float32).requires_grad_()
    decay = [p for n, p in params.items() if p.dim() >= 2]
    no_decay = [p for n, p in params.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=0.0, betas=(0.9, 0.95), eps=1e-8)
    init = {n: p.detach().clone() for n, p in params.items()}
    tok = torch.tensor(tokens)
    state, losses = 42, []
    for step in range(STEPS):
        xs, ys = [], []
        for _ in range(BATCH):
            state = (state * 6364136223846793005 + 1442695040888963407) & MASK64
            at = (state >> 33) % (len(tokens) - CONTEXT - 1)
            xs.append(tok[at:at + CONTEXT])
            ys.append(tok[at + 1:at + CONTEXT + 1])
        x, y = torch.stack(xs), torch.stack(ys)
        logits = gen_nn.gpt(nabla_layout(params), x, LAYERS, HEADS)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        for g in opt.param_groups:
            g["lr"] = schedule(step)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses
    c = gen_nn.Case("char_gpt")
    c.add("input", "config", torch.tensor([vocab, CONTEXT, DIM, LAYERS, HEADS, BATCH, STEPS]))
    c.add("input", "tokens", tok)
    c.add("output", "losses", torch.tensor(losses, dtype=torch.float64))
    with open(OUT, "w") as f:
        f.write("# test/golden/char_gpt.txt — written by test/golden/gen_char_gpt.py "
                "(torch %s, float32); do not edit\n" % torch.__version__)
        c.write(f)
    save_file({n: v.contiguous() for n, v in nabla_layout(init).items()}, WEIGHTS,
              metadata={"written_by": "test/golden/gen_char_gpt.py", "torch": torch.__version__})
    print("wrote", OUT, "and", WEIGHTS, "losses", losses[0], "->", losses[-1])


if __name__ == "__main__":
    main()
