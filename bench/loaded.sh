#!/bin/sh
# bench/loaded.sh — a training step on a busy machine (issue: threads under load).
# Times the MLP 784-1024-1024-10 step (batch 256; nabla jitted, bench_train; PyTorch
# eager, bench/peers/torch_bench.py when the venv exists) quiet, then while LOAD
# CPU-bound processes (default: one per core, `nproc`) spin beside it, and prints
# each median and the slowdown loaded/quiet. nabla runs twice: as shipped (its
# contention guard drops a contended thread's kernels to one thread, see
# nb_set_num_threads) and with NABLA_THREAD_GUARD=0 (always the full count).
# Usage: bench/loaded.sh BUILD_DIR [LOAD [REPS]] (make bench-loaded). Each
# number is the median over REPS runs (default 3) of each run's median step;
# loaded runs vary much more than quiet ones (a 2-thread team without the
# guard collapsed to 20x in some runs). The machine should be otherwise idle.
set -eu
build=${1:-build}
load=${2:-$(nproc)}
reps=${3:-3}
py=bench/peers/.venv/bin/python
case=mlp_784_1024_1024_10_step

median() { # the JSON line's median_s of the case (bench_train or the peer script)
  grep "\"case\": *\"$case\"" | sed -n 's/.*"median_s": *\([0-9.e+-]*\).*/\1/p' | head -1
}
nabla() { "$build/bench/bench_train" --case $case --style jit --steps 100 | median; }
nabla_noguard() { NABLA_THREAD_GUARD=0 nabla; }
torch() { "$py" bench/peers/torch_bench.py --case $case | median; }
reps() { # the median over $reps runs of $1
  i=0
  while [ $i -lt "$reps" ]; do $1; i=$((i + 1)); done | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

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

printf '%-14s %12s %12s %10s   (%d spinning processes, %d cores, median of %d runs)\n' impl quiet_ms \
  loaded_ms slowdown "$load" "$(nproc)" "$reps"
for impl in nabla nabla_noguard torch; do
  if [ $impl = torch ] && [ ! -x "$py" ]; then
    echo "torch: no bench/peers/.venv (bench/peers/setup.sh): skipped"
    continue
  fi
  q=$(reps $impl)
  spin_start
  l=$(reps $impl)
  spin_stop
  awk -v i=$impl -v q="$q" -v l="$l" 'BEGIN { printf "%-14s %12.2f %12.2f %9.2fx\n", i, q * 1e3, l * 1e3, l / q }'
done
