"""bench/peers/torch_bench.py: PyTorch eager (CPU, 2 threads) timing of the three
training steps bench/bench_mlp.c and bench/bench_train.c time for nabla:

  readme_mlp_step           [1,32,64,32,1], batch 256, f32, relu, MSE, SGD lr 0.01
  mlp_784_1024_1024_10_step 784-1024-1024-10, batch 256, relu, softmax cross-entropy
                            with integer labels, SGD lr 0.01
  transformer_block_fwd_bwd d_model 256, 4 heads, seq 128, batch 8: pre-LN attention
                            and a 4x GELU MLP with residuals; loss = mean of the output;
                            forward and every parameter's gradient, no update

Weights glorot-uniform, biases zero, layer-norm gains one. Each case: WARMUP untimed
steps, then the median of STEPS timed steps; the loss is read every step (.item()),
as nabla's benches do. One JSON line per case on stdout.

  python torch_bench.py [--smoke]
"""
import os
import sys

# Debian's torch uses OpenBLAS, which must pick its kernels before it is loaded; it
# misdetects AVX-512 Xeon guests, so it is told SkylakeX only where the CPU has avx512f
# (those kernels trap on AVX2-only CPUs such as AMD Zen 3). The Makefile does the same.
def _has_avx512f():
    try:
        with open("/proc/cpuinfo") as f:
            return any("avx512f" in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


if _has_avx512f():
    os.environ.setdefault("OPENBLAS_CORETYPE", "SkylakeX")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import STEPS, emit, time_steps  # noqa: E402

THREADS = 2
LR = 0.01


def setup_string():
    where = "Debian python3-torch" if torch.__file__.startswith("/usr/lib/python3/") else "pip wheel"
    blas = []
    if torch.backends.mkl.is_available():
        blas.append("MKL")
    if torch.backends.mkldnn.is_available():
        blas.append("oneDNN")
    if "openblas" in torch.__config__.show().lower():
        blas.append("OpenBLAS OPENBLAS_CORETYPE=" + os.environ.get("OPENBLAS_CORETYPE", ""))
    return (f"torch {torch.__version__} ({where}; {', '.join(blas) or 'no BLAS info'}), eager, "
            f"torch.set_num_threads({torch.get_num_threads()}), optim.SGD(foreach=True)")


def glorot(fan_out, fan_in):
    # nn.Linear layout [out, in]; the bound depends on fan_in + fan_out only.
    w = torch.empty(fan_out, fan_in)
    torch.nn.init.xavier_uniform_(w)
    return w.requires_grad_()


def linear_params(sizes):
    ps = []
    for i in range(len(sizes) - 1):
        ps += [glorot(sizes[i + 1], sizes[i]), torch.zeros(sizes[i + 1], requires_grad=True)]
    return ps


def mlp(ps, h):
    n = len(ps) // 2
    for i in range(n):
        h = F.linear(h, ps[2 * i], ps[2 * i + 1])
        if i < n - 1:
            h = F.relu(h)
    return h


def readme_mlp_case():
    ps = linear_params([1, 32, 64, 32, 1])
    x, y = torch.rand(256, 1), torch.rand(256, 1)
    return ps, lambda: F.mse_loss(mlp(ps, x), y), True


def mlp784_case():
    ps = linear_params([784, 1024, 1024, 10])
    x, labels = torch.rand(256, 784), torch.randint(0, 10, (256,))
    return ps, lambda: F.cross_entropy(mlp(ps, x), labels), True


D, HEADS, SEQ, BATCH, HIDDEN = 256, 4, 128, 8, 1024


def transformer_case():
    def ones():
        return torch.ones(D, requires_grad=True)

    def zeros(n=D):
        return torch.zeros(n, requires_grad=True)

    ps = [ones(), zeros()]  # ln1
    for _ in range(4):  # q, k, v, o
        ps += [glorot(D, D), zeros()]
    ps += [ones(), zeros(), glorot(HIDDEN, D), zeros(HIDDEN), glorot(D, HIDDEN), zeros()]
    x = torch.randn(BATCH, SEQ, D)

    def heads(t):
        return t.view(BATCH, SEQ, HEADS, D // HEADS).transpose(1, 2)

    def loss():
        g1, b1, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2, w1, c1, w2, c2 = ps
        h = F.layer_norm(x, (D,), g1, b1, 1e-5)
        q, k, v = heads(F.linear(h, wq, bq)), heads(F.linear(h, wk, bk)), heads(F.linear(h, wv, bv))
        a = F.scaled_dot_product_attention(q, k, v)
        a = a.transpose(1, 2).reshape(BATCH, SEQ, D)
        r = x + F.linear(a, wo, bo)
        h = F.layer_norm(r, (D,), g2, b2, 1e-5)
        out = r + F.linear(F.gelu(F.linear(h, w1, c1)), w2, c2)
        return out.mean()

    return ps, loss, False


# case name and builder; warm-up and timed steps are common.STEPS
CASES = [
    ("readme_mlp_step", readme_mlp_case),
    ("mlp_784_1024_1024_10_step", mlp784_case),
    ("transformer_block_fwd_bwd", transformer_case),
]


def main():
    smoke = "--smoke" in sys.argv[1:]
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    setup = setup_string()
    only = sys.argv[sys.argv.index("--case") + 1] if "--case" in sys.argv else None
    for name, build in CASES:
        if only and name != only:
            continue
        warmup, steps = STEPS[name]
        if smoke:
            warmup, steps = 1, 3
        ps, loss_fn, update = build()
        opt = torch.optim.SGD(ps, lr=LR, foreach=True)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn()
            loss.backward()
            if update:
                opt.step()
            return loss.item()

        median, value = time_steps(step, warmup, steps)
        emit(name, "pytorch", steps, median, value, setup)

if __name__ == "__main__":
    main()
