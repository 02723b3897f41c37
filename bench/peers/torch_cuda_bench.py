"""bench/peers/torch_cuda_bench.py: PyTorch on the GPU, the peer of bench/bench_cuda.c.
The same cases, shapes, ops and losses, on the same card in a separate run:

  copy_bw           dst.copy_(src), 256M f32 (1 GiB); bytes = read + written
  fused_chain_256M  y = relu(x * 1.5 - 1) * 0.5 - 0.25 on x [256M] f32 (x drawn as in
                    bench_cuda.c: a random row of 16M + half a random value per block of
                    16M); bytes = x read + y written; eager runs 5 kernels, compiled 1
  softmax_rows      torch.softmax(x, -1), x [65536, 1024] f32; bytes = x read + y written
  layer_norm_rows   F.layer_norm(x, (1024,), w, b, 1e-5); bytes = x read + y written
  mlp784_step       784-1024-1024-10 MLP, batch 256, relu, cross-entropy with integer
                    labels, SGD lr 0.01 (torch.optim.SGD, fused=True where it exists, else
                    foreach=True), f32 and tf32
  transformer_step  d 256, 4 heads, seq 128, batch 8, pre-LN attention
                    (F.scaled_dot_product_attention) + 4x GELU MLP with residuals, loss =
                    mean of the output; forward and all 16 parameter gradients, no update
                    (bench/peers/torch_bench.py's transformer_case on the GPU)
  launch_overhead   eager: K tanh ops on 4 floats (views alternating [4] / [2, 2]), K = 1
                    and 64; per op = (t64 - t1) / 63, each call synchronized

Implementations ("impl" and "peer" both name it): torch_eager, and torch_compile
(torch.compile, default mode, of the loss function (its backward through AOTAutograd) or of
the op; the optimizer step stays eager). A compile failure is reported as an "error" line
and the script goes on. TF32 is off (matmul fp32 precision "ieee") except in the lines with
"precision": "tf32"; torch._dynamo.reset() before each compiled variant.

Timing: the bandwidth cases with torch.cuda.Event pairs around each repetition, in blocks of
10 queued back to back, synchronized after each block, one warm-up per block, the cases
taking turns over 3 passes: the median of 30. Training steps: wall clock of each step, which
ends with loss.item() (a synchronization, as bench_cuda.c's nb_item): the median of STEPS
steps after the warm-up (longer for torch.compile); pipelined_s = the same number of steps
queued with only the last loss read, total / steps. ratio (bandwidth) = GB/s over this
run's copy_bw.

  python torch_cuda_bench.py [--smoke] [--no-compile] [--case PREFIX] [--cpu]

--smoke: tiny sizes, few steps (a run check). --cpu: the same code on the CPU with the wall
clock (a logic check where there is no GPU, not a measurement). Without torch or without a
GPU (and no --cpu) it prints one skip line and exits 0. One JSON line per case and
implementation, then a table.
"""
import json
import sys
import time

ARGS = sys.argv[1:]
SMOKE = "--smoke" in ARGS
NO_COMPILE = "--no-compile" in ARGS
ON_CPU = "--cpu" in ARGS
ONLY = ARGS[ARGS.index("--case") + 1] if "--case" in ARGS and ARGS.index("--case") + 1 < len(ARGS) else None


def skip(why):
    print(json.dumps({"case": "torch_cuda_bench", "skipped": why}), flush=True)
    print(f"torch_cuda_bench: skipped ({why})")
    sys.exit(0)


try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001 - any import failure means: no peer here
    skip(f"no torch: {e}")

if not ON_CPU and not torch.cuda.is_available():
    skip("torch.cuda is not available")

DEV = torch.device("cpu" if ON_CPU else "cuda")
DEVICE_NAME = "cpu" if ON_CPU else torch.cuda.get_device_name(0)
LR = 0.01
PASSES, PER_PASS = (1, 1) if SMOKE else (3, 10)
N = (1 << 16) if SMOKE else (256 << 20)
ROWS, COLS = (64, 128) if SMOKE else (65536, 1024)
CHAIN = "fused_chain_%d%s" % ((N >> 20, "M") if N >= 1 << 20 else (N >> 10, "K"))
LINES = []  # every JSON record, for the table


def wanted(name):
    return ONLY is None or name.startswith(ONLY)


def emit(rec):
    rec.setdefault("device", DEVICE_NAME)
    LINES.append(rec)
    print(json.dumps(rec), flush=True)


def set_tf32(on):
    """TF32 for f32 matrix products on (tf32) or off (ieee); returns a description."""
    m = torch.backends.cuda.matmul
    if hasattr(m, "fp32_precision"):  # torch >= 2.9: the new API (the old one warns)
        m.fp32_precision = "tf32" if on else "ieee"
        return f"torch.backends.cuda.matmul.fp32_precision={m.fp32_precision}"
    m.allow_tf32 = on
    return f"torch.backends.cuda.matmul.allow_tf32={m.allow_tf32}"


def dynamo_reset():
    import torch._dynamo  # noqa: F401 - loaded lazily by torch.compile

    torch._dynamo.reset()


def sync():
    if not ON_CPU:
        torch.cuda.synchronize()


# ---- bandwidth ------------------------------------------------------------------------------
def time_block(fn, count):
    """count calls of fn queued back to back, each between its own pair of CUDA events;
    seconds of each (CPU: wall clock)."""
    if ON_CPU:
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
    for e0, e1 in ev:
        e0.record()
        fn()
        e1.record()
    ev[-1][1].synchronize()
    return [1e-3 * e0.elapsed_time(e1) for e0, e1 in ev]


def chain(x):
    return torch.relu(x * 1.5 - 1.0) * 0.5 - 0.25


def bandwidth():
    torch.manual_seed(1)
    x = (torch.rand(16, N // 16, device=DEV) + 0.5 * torch.rand(16, 1, device=DEV)).reshape(N)
    dst = torch.empty_like(x)
    rx = torch.rand(ROWS, COLS, device=DEV)
    lw, lb = torch.rand(COLS, device=DEV), torch.rand(COLS, device=DEV)
    flat, rows = 2.0 * N * 4, 2.0 * ROWS * COLS * 4
    # (case, impl, make the callable (may compile), bytes)
    jobs = [("copy_bw", "torch_eager", lambda: (lambda: dst.copy_(x)), flat)]
    ops = [
        (CHAIN, lambda: chain(x), chain, (x,), flat),
        ("softmax_rows", lambda: torch.softmax(rx, -1), lambda t: torch.softmax(t, -1), (rx,), rows),
        ("layer_norm_rows", lambda: F.layer_norm(rx, (COLS,), lw, lb, 1e-5),
         lambda t, w, b: F.layer_norm(t, (COLS,), w, b, 1e-5), (rx, lw, lb), rows),
    ]
    for name, eager, _, _, nbytes in ops:
        if wanted(name):
            jobs.append((name, "torch_eager", (lambda f: lambda: f)(eager), nbytes))
    if not NO_COMPILE:
        for name, _, fn, args, nbytes in ops:
            if wanted(name):
                def make(fn=fn, args=args):
                    dynamo_reset()
                    c = torch.compile(fn)
                    for _ in range(3):  # compile and warm up
                        c(*args)
                    sync()
                    return lambda: c(*args)
                jobs.append((name, "torch_compile", make, nbytes))
    calls, times = [], []
    for name, impl, make, nbytes in jobs:
        try:
            calls.append(make())
        except Exception as e:  # noqa: BLE001 - a compile failure is a result
            emit({"case": name, "impl": impl, "peer": impl, "error": f"{type(e).__name__}: {e}"[:1000]})
            calls.append(None)
        times.append([])
    for _ in range(PASSES):
        for k, fn in enumerate(calls):
            if fn is None:
                continue
            fn()  # warm-up
            times[k] += time_block(fn, PER_PASS)
    copy_gbps = None
    for (name, impl, _, nbytes), fn, t in zip(jobs, calls, times):
        if fn is None:
            continue
        t.sort()
        med = t[len(t) // 2]
        gbps = nbytes / med * 1e-9
        if name == "copy_bw":
            copy_gbps = gbps
        size = str(N) if name in ("copy_bw", CHAIN) else f"{ROWS}x{COLS}"
        emit({"case": name, "size": size, "impl": impl, "peer": impl, "median_s": med,
              "gbps": round(gbps, 1), "ratio_to": "torch copy_bw", "ratio": round(gbps / copy_gbps, 3),
              "bytes": nbytes, "runs": len(t), "clock": "wall" if ON_CPU else "cuda_events"})


# ---- training steps ---------------------------------------------------------------------------
def glorot(fan_out, fan_in):
    w = torch.empty(fan_out, fan_in, device=DEV)  # nn.Linear layout [out, in]
    torch.nn.init.xavier_uniform_(w)
    return w.requires_grad_()


def zeros(n):
    return torch.zeros(n, device=DEV, requires_grad=True)


def mlp784_case():
    sizes = [784, 1024, 1024, 10]
    ps = []
    for i in range(3):
        ps += [glorot(sizes[i + 1], sizes[i]), zeros(sizes[i + 1])]
    x = torch.rand(256, 784, device=DEV)
    labels = torch.randint(0, 10, (256,), device=DEV)

    def loss_fn():
        h = x
        for i in range(3):
            h = F.linear(h, ps[2 * i], ps[2 * i + 1])
            if i < 2:
                h = F.relu(h)
        return F.cross_entropy(h, labels)

    return ps, loss_fn, True


D, HEADS, SEQ, BATCH, HIDDEN = 256, 4, 128, 8, 1024


def transformer_case():
    def ones():
        return torch.ones(D, device=DEV, requires_grad=True)

    ps = [ones(), zeros(D)]  # ln1
    for _ in range(4):  # q, k, v, o
        ps += [glorot(D, D), zeros(D)]
    ps += [ones(), zeros(D), glorot(HIDDEN, D), zeros(HIDDEN), glorot(D, HIDDEN), zeros(D)]
    x = torch.randn(BATCH, SEQ, D, device=DEV)

    def heads(t):
        return t.view(BATCH, SEQ, HEADS, D // HEADS).transpose(1, 2)

    def loss_fn():
        g1, b1, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2, w1, c1, w2, c2 = ps
        h = F.layer_norm(x, (D,), g1, b1, 1e-5)
        q, k, v = heads(F.linear(h, wq, bq)), heads(F.linear(h, wk, bk)), heads(F.linear(h, wv, bv))
        a = F.scaled_dot_product_attention(q, k, v)
        a = a.transpose(1, 2).reshape(BATCH, SEQ, D)
        r = x + F.linear(a, wo, bo)
        h = F.layer_norm(r, (D,), g2, b2, 1e-5)
        out = r + F.linear(F.gelu(F.linear(h, w1, c1)), w2, c2)
        return out.mean()

    return ps, loss_fn, False


def make_optimizer(ps):
    if not ON_CPU:
        try:
            return torch.optim.SGD(ps, lr=LR, fused=True), "SGD(fused=True)"
        except (TypeError, RuntimeError, ValueError):
            pass
    return torch.optim.SGD(ps, lr=LR, foreach=True), "SGD(foreach=True)"


# case name, builder, (warm-up, timed steps) as bench_cuda.c
STEP_CASES = {"mlp784_step": (mlp784_case, 10, 50), "transformer_step": (transformer_case, 5, 30)}


def run_step_case(name, impl, precision):
    build, warmup, steps = STEP_CASES[name]
    if impl == "torch_compile":
        warmup = max(2 * warmup, 10)
    if SMOKE:
        warmup, steps = (3 if impl == "torch_compile" else 1), 3
    tf32 = set_tf32(precision == "tf32") if not ON_CPU else "cpu"
    torch.manual_seed(0)
    ps, loss_fn, update = build()
    if impl == "torch_compile":
        dynamo_reset()
        loss_fn = torch.compile(loss_fn)
    opt, opt_name = make_optimizer(ps)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        if update:
            opt.step()
        return loss

    try:
        t0 = time.perf_counter()
        step().item()
        first = time.perf_counter() - t0
        for _ in range(warmup - 1):
            step().item()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            value = step().item()
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(steps):
            loss = step()
        loss.item()
        pipelined = (time.perf_counter() - t0) / steps
    except Exception as e:  # noqa: BLE001 - a compile failure is a result
        emit({"case": name, "precision": precision, "impl": impl, "peer": impl,
              "error": f"{type(e).__name__}: {e}"[:1000]})
        return
    finally:
        if not ON_CPU:
            set_tf32(False)
    times.sort()
    emit({"case": name, "precision": precision, "impl": impl, "peer": impl,
          "median_s": times[len(times) // 2], "pipelined_s": pipelined, "first_step_s": first,
          "steps": steps, "final_loss": value, "clock": "wall, loss read each step",
          "setup": f"torch {torch.__version__}, {opt_name}, {tf32}"})


# ---- launch overhead ---------------------------------------------------------------------------
def launch_overhead():
    x = torch.rand(4, device=DEV)
    calls = 20 if SMOKE else 500
    med = {}
    for k in (1, 64):
        def f():
            y = x
            for i in range(k):
                y = torch.tanh(y.view(4) if i % 2 else y.view(2, 2))
            return y.view(4)

        for _ in range(20):
            f()
        sync()
        t = []
        for _ in range(calls):
            t0 = time.perf_counter()
            f()
            sync()
            t.append(time.perf_counter() - t0)
        t.sort()
        med[k] = t[len(t) // 2]
    emit({"case": "launch_overhead", "impl": "torch_eager", "peer": "torch_eager",
          "median_s": (med[64] - med[1]) / 63, "median_1_s": med[1], "median_64_s": med[64],
          "calls": calls, "clock": "wall, synchronized each call"})


# ---- main ---------------------------------------------------------------------------------------
def main():
    t_start = time.perf_counter()
    if not ON_CPU:
        set_tf32(False)
    if any(wanted(c) for c in ("copy_bw", CHAIN, "softmax_rows", "layer_norm_rows")):
        bandwidth()
    impls = ["torch_eager"] + ([] if NO_COMPILE else ["torch_compile"])
    for impl in impls:  # eager first: a slow or failing compile cannot hide the eager lines
        for name, precisions in (("mlp784_step", ("f32", "tf32")), ("transformer_step", ("f32",))):
            if wanted(name):
                for p in precisions:
                    run_step_case(name, impl, p)
        if impl == "torch_eager" and wanted("launch_overhead"):
            launch_overhead()

    print(f"\ntorch_cuda_bench on {DEVICE_NAME}, torch {torch.__version__}"
          f"{', --smoke' if SMOKE else ''} ({time.perf_counter() - t_start:.1f} s in all); "
          "ratio = GB/s over torch's copy_bw")
    print(f"{'case':<18} {'impl':<14} {'prec':>5} {'median_ms':>11} {'GB/s':>9} {'ratio':>7} "
          f"{'pipelined_ms':>13}")
    for r in LINES:
        head = f"{r['case']:<18} {r['impl']:<14} {r.get('precision', ''):>5}"
        if "error" in r:
            print(f"{head} failed: {r['error'][:60]}")
        elif r["case"] == "launch_overhead":
            print(f"{head} {r['median_s'] * 1e3:11.4f}   (per op; K=1 {r['median_1_s'] * 1e6:.1f} us, "
                  f"K=64 {r['median_64_s'] * 1e6:.1f} us)")
        elif "gbps" in r:
            print(f"{head} {r['median_s'] * 1e3:11.3f} {r['gbps']:9.1f} {r['ratio']:7.3f}")
        else:
            print(f"{head} {r['median_s'] * 1e3:11.3f} {'':>9} {'':>7} {r['pipelined_s'] * 1e3:13.3f}")

if __name__ == "__main__":
    main()
