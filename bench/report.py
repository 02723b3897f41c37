"""bench/report.py: the combined table of nabla vs its Python peers, from the JSON lines
`make bench` collects (nabla's C benches and bench/peers/*.py, one run, one machine).

  python bench/report.py build/bench/results.jsonl

For each training-step case: nabla's median per style, its best style, PyTorch's and
JAX's medians, and peer / nabla (above 1: nabla is that many times faster). Then every
target of QUALITY.md with the run's ratio and whether it holds: GEMM against the best
of oneDNN/OpenBLAS (bench_gemm), the fused chain, softmax and layer_norm against the
STREAM triad (bench_bandwidth), the training steps against the peers, and the cost of
one more kernel in a jitted call (bench_jit). Lines that are not JSON objects are skipped.
A bench-only tool: nothing in the library or its tests uses Python.
"""
import json
import sys

CASES = [  # case, target (QUALITY.md, "Targets")
    ("readme_mlp_step", "nabla >= 5x faster than PyTorch, >= 1.5x faster than JAX"),
    ("mlp_784_1024_1024_10_step", ">= 1.1x PyTorch, >= 1.0x JAX"),
    ("transformer_block_fwd_bwd", ">= 1.0x PyTorch"),
]
STEP_TARGETS = [  # case, peer, minimum peer / nabla
    ("readme_mlp_step", "pytorch", 5.0), ("readme_mlp_step", "jax", 1.5),
    ("mlp_784_1024_1024_10_step", "pytorch", 1.1), ("mlp_784_1024_1024_10_step", "jax", 1.0),
    ("transformer_block_fwd_bwd", "pytorch", 1.0),
]
BANDWIDTH_TARGETS = {"chain": 0.8, "softmax": 0.7, "layer_norm": 0.7}  # x STREAM triad
GEMM_TARGET = 0.95  # x the best of oneDNN / OpenBLAS
STYLES = ["functional", "jit", "imperative"]


def main(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    nabla, peer, setups = {}, {}, {}
    for r in rows:
        if r.get("impl") == "nabla" and r.get("case") in dict(CASES):
            nabla.setdefault(r["case"], {})[r["style"]] = r["median_s"]
        elif r.get("impl") in ("pytorch", "jax"):
            peer[(r["case"], r["impl"])] = r["median_s"]
            setups[r["impl"]] = r.get("setup", "")

    def ms(v):
        return f"{v * 1e3:.3f}" if v else "-"

    print("\nTraining steps: nabla vs PyTorch and JAX (medians in ms, same run)")
    head = ["case"] + [f"nabla {s}" for s in STYLES] + ["nabla best", "PyTorch", "JAX",
                                                         "PyTorch / nabla", "JAX / nabla"]
    print("| " + " | ".join(head) + " |")
    print("|---" + "|---:" * (len(head) - 1) + "|")
    for case, _ in CASES:
        styles = nabla.get(case, {})
        best = min(styles.values()) if styles else None
        pt, jx = peer.get((case, "pytorch")), peer.get((case, "jax"))
        cells = [case] + [ms(styles.get(s)) for s in STYLES] + [ms(best), ms(pt), ms(jx)]
        cells += [f"{p / best:.2f}" if p and best else "-" for p in (pt, jx)]
        print("| " + " | ".join(cells) + " |")
    print("\nTargets (QUALITY.md), peer / nabla:")
    for case, target in CASES:
        print(f"  {case}: {target}")
    for impl, s in sorted(setups.items()):
        print(f"{impl}: {s}")
    targets(rows, nabla, peer)


def targets(rows, nabla, peer):
    """Every QUALITY.md target with this run's value; 'met' or 'MISSED'."""
    out = []

    def add(what, value, target, ok):
        out.append((what, value, target, "met" if ok else "MISSED"))

    for r in rows:
        if r.get("case") == "gemm" and r.get("impl") == "nabla" and "ratio" in r:
            add(f"gemm {r['size']} (x best of oneDNN/OpenBLAS)", f"{r['ratio']:.2f}",
                f">= {GEMM_TARGET}", r["ratio"] >= GEMM_TARGET)
        elif r.get("impl") == "nabla" and r.get("case") in BANDWIDTH_TARGETS and "ratio" in r:
            t = BANDWIDTH_TARGETS[r["case"]]
            add(f"{r['case']} {r.get('size', '')} (x STREAM triad)",
                f"{r['ratio']:.2f} ({r.get('kernels', '?')} kernels)", f">= {t}", r["ratio"] >= t)
        elif r.get("case") == "per_kernel" and "median_s" in r:
            add("one more kernel in a jitted call", f"{r['median_s'] * 1e9:.0f} ns",
                "hundreds of ns", r["median_s"] < 1e-6)
    for case, impl, t in STEP_TARGETS:
        styles, p = nabla.get(case, {}), peer.get((case, impl))
        if styles and p:
            ratio = p / min(styles.values())
            add(f"{case} ({impl} / nabla best)", f"{ratio:.2f}", f">= {t}", ratio >= t)
    if not out:
        return
    print("\nTargets (QUALITY.md), this run:")
    print("| target | value | required | |")
    print("|---|---:|---:|---|")
    for row in out:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RESULTS.jsonl")
    main(sys.argv[1])
