"""Shared by the peer scripts: time a training step and print its JSON line."""
import json
import time

# case -> (warm-up steps, timed steps); bench_mlp.c / bench_train.c use the same
STEPS = {
    "readme_mlp_step": (50, 1000),
    "mlp_784_1024_1024_10_step": (10, 100),
    "transformer_block_fwd_bwd": (5, 50),
}


def time_steps(step, warmup, steps):
    """Runs step() warmup + steps times; returns (median seconds of the timed
    steps, the value the last call returned)."""
    times, value = [], None
    for i in range(-warmup, steps):
        t0 = time.perf_counter()
        value = step()
        dt = time.perf_counter() - t0
        if i >= 0:
            times.append(dt)
    times.sort()
    return times[len(times) // 2], value


def emit(case, impl, steps, median_s, final_loss, setup):
    print(json.dumps({"case": case, "impl": impl, "steps": steps, "median_s": median_s,
                      "final_loss": final_loss, "setup": setup}), flush=True)
