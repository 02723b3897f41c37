#!/bin/sh
# bench/loaded.sh — a training step on a busy machine (issue: threads under load).
# Times the MLP 784-1024-1024-10 step (batch 256; nabla jitted, bench_train; PyTorch
# eager, bench/peers/torch_bench.py when the venv exists) quiet, then while LOAD
# CPU-bound processes (default: one per core, `nproc`) spin beside it, and prints
# each median and the slowdown loaded/quiet. Usage: bench/loaded.sh BUILD_DIR [LOAD]
# (make bench-loaded). Numbers are medians of the steps of one run each; the
# machine should be otherwise idle.
set -eu
build=${1:-build}
load=${2:-$(nproc)}
py=bench/peers/.venv/bin/python
case=mlp_784_1024_1024_10_step

median() { # the JSON line's median_s of the case (bench_train or the peer script)
  grep "\"case\": *\"$case\"" | sed -n 's/.*"median_s": *\([0-9.e+-]*\).*/\1/p' | head -1
}
nabla() { "$build/bench/bench_train" --case $case --style jit --steps 100 | median; }
torch() { "$py" bench/peers/torch_bench.py --case $case | median; }

spin_pids=""
spin_start() {
  i=0
  while [ $i -lt "$load" ]; do
    sh -c 'while :; do :; done' &
    spin_pids="$spin_pids $!"
    i=$((i + 1))
  done
}
spin_stop() { [ -n "$spin_pids" ] && kill $spin_pids 2>/dev/null; spin_pids=""; }
trap spin_stop EXIT INT TERM

printf '%-10s %12s %12s %10s   (%d spinning processes, %d cores)\n' impl quiet_ms loaded_ms slowdown \
  "$load" "$(nproc)"
for impl in nabla torch; do
  if [ $impl = torch ] && [ ! -x "$py" ]; then
    echo "torch: no bench/peers/.venv (bench/peers/setup.sh): skipped"
    continue
  fi
  q=$($impl)
  spin_start
  l=$($impl)
  spin_stop
  awk -v i=$impl -v q="$q" -v l="$l" 'BEGIN { printf "%-10s %12.2f %12.2f %9.2fx\n", i, q * 1e3, l * 1e3, l / q }'
done
