"""The training step of bench/bench_gpt.c in PyTorch: the same GPT (GPT-2's
architecture: vocabulary 65, context 64, width 128, 2 layers, 4 heads, MLP 512,
tanh GELU, biases, dropout off), batch 16, f32, cross-entropy, clip_grad_norm_
then AdamW, the loss read every step; on 1 then 2 threads. One JSON line per
thread count, as bench_gpt.c prints (`make bench-gpt`)."""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CONTEXT, DIM, LAYERS, HEADS, BATCH = 65, 64, 128, 2, 4, 16
WARMUP, STEPS = 5, 30


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc, self.fc_proj = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, HEADS, D // HEADS).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, DIM), nn.Embedding(CONTEXT, DIM)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f, self.lm_head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def run(threads, warmup, steps):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    times, loss = [], None
    for i in range(-warmup, steps):
        x = torch.randint(0, VOCAB, (BATCH, CONTEXT))
        y = torch.randint(0, VOCAB, (BATCH, CONTEXT))
        t0 = time.perf_counter()
        out = model(x)
        l = F.cross_entropy(out.reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        l.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = l.item()
        if i >= 0:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], loss


def main():
    smoke = "--smoke" in sys.argv
    for threads in ([1] if smoke else [1, 2]):
        s, loss = run(1, 0, 2) if smoke else run(threads, WARMUP, STEPS)
        print(json.dumps({"case": "gpt_char_step", "impl": "pytorch", "threads": threads,
                          "steps": 2 if smoke else STEPS, "median_s": round(s, 6),
                          "tokens_per_s": round(BATCH * CONTEXT / s),
                          "final_loss": round(loss, 4),
                          "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
