"""bench/report.py: the combined table of nabla vs its Python peers, from the JSON lines
`make bench` collects (nabla's C benches and bench/peers/*.py, one run, one machine).

  python bench/report.py build/bench/results.jsonl

For each training-step case: nabla's median per style, its best style, PyTorch's and
JAX's medians, and peer / nabla (above 1: nabla is that many times faster), beside the
target from the design's QUALITY.md. Lines that are not JSON objects are skipped.
A bench-only tool: nothing in the library or its tests uses Python.
"""
import json
import sys

CASES = [  # case, target (QUALITY.md, "Targets")
    ("readme_mlp_step", "nabla >= 5x faster than PyTorch, >= 1.5x faster than JAX"),
    ("mlp_784_1024_1024_10_step", ">= 1.1x PyTorch, >= 1.0x JAX"),
    ("transformer_block_fwd_bwd", ">= 1.0x PyTorch"),
]
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RESULTS.jsonl")
    main(sys.argv[1])
