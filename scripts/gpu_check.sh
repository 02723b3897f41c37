#!/bin/bash
# scripts/gpu_check.sh — the GPU machine's side of a device check: unpacks the
# bundle scripts/gpu_bundle.sh made here (.gpu/bundle.tar.xz: the CUDA build's test
# binary, examples and benches with their Debian libraries), then runs, in order
# of value, with a time limit each, logs under $OUT (or ./gpu-out):
#   1. the CUDA suites (runtime, ops, gemm, generator, training);
#   2. the op x transform matrix and the other suites with NB_CUDA(0) as the
#      default device;
#   3. the README MLP example on cuda:0;
#   4. the benchmarks: bench_cuda_gemm, bench_cuda, and the PyTorch peer (TORCH_ARGS,
#      e.g. --no-compile);
#   t. stages 1 and 2 side by side (JOBS split between them): the order a lease
#      favours is "3 4 t", the quiet GPU for the timings first;
#   p. the device probes built here into .gpu/ (bench/probe_*.cu, nvcc), if any.
# The logs come back as one $OUT/logs.tgz (the device tool returns at most 8 files)
# and the NVRTC kernel cache as $OUT/kernels.tar.xz: copied to .gpu/kernels.tar.xz,
# the next run starts with it.
# STAGES (e.g. "1 4") picks stages; JOBS the test processes; ON_CUDA_FILTER replaces
# stage 2's suite filter (the whole of stage 2 takes about 15 minutes on an H100, more
# than a lease: run it in parts).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$here/gpu-out}
logs=/tmp/nb/logs
mkdir -p "$out" "$logs"
tar xJf "$here/.gpu/bundle.tar.xz" -C /tmp/nb || exit 1
# a kernel cache an earlier run brought back (keys hold NVRTC's version and the arch)
[ -f "$here/.gpu/kernels.tar.xz" ] && tar xJf "$here/.gpu/kernels.tar.xz" -C /tmp/nb
export LD_LIBRARY_PATH=/tmp/nb/lib:/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NABLA_CACHE_DIR=/tmp/nb/kernels
stages=${STAGES:-1 2 3 4}
jobs=${JOBS:-16}
bin=/tmp/nb/bin
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$logs/gpu.txt"
run() { # name seconds command...
  local name=$1 secs=$2
  shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc, $((SECONDS - t0)) s"
  grep -E '\[FAIL\]|Synthesis|CRASH' "$logs/$name.log" | head -40
  return 0
}
suites() { run cuda_suites ${SUITES_SECS:-200} "$bin/nabla_tests" --jobs "$1" \
  --filter '@(cuda|cuda_ops|cuda_gemm|cuda_train|cuda_gpu)/*'; }
on_cuda() { NABLA_TEST_DEVICE=cuda:0 run on_cuda ${ON_CUDA_SECS:-200} "$bin/nabla_tests" --jobs "$1" --verbose \
  --filter "${ON_CUDA_FILTER:-!(cuda*|custom|lazy|fusion|gemm_epi|gemm_small|par_exec|dot|rows_large|graph|jit_exec|simplify|alloc|device)/*}"; }
for s in $stages; do
  case $s in
  1) suites "$jobs" ;;
  2) on_cuda "$jobs" ;;
  t) suites $((jobs / 4)) & on_cuda $((jobs - jobs / 4)); wait
     echo "on_cuda: $(grep -c '^\[PASS\]' "$logs/on_cuda.log") passed" ;;
  p) for probe in "$here"/.gpu/probe_*; do
       [ -x "$probe" ] && run "$(basename "$probe")" 60 "$probe" && cat "$logs/$(basename "$probe").log"
     done ;;
  3) run mlp_cuda 60 "$bin/mlp" cuda:0; tail -4 "$logs/mlp_cuda.log"
     run mlp_cpu 60 "$bin/mlp" cpu; tail -2 "$logs/mlp_cpu.log" ;;
  4) run bench_cuda_gemm 120 "$bin/bench_cuda_gemm"; tail -12 "$logs/bench_cuda_gemm.log"
     run bench_cuda 120 "$bin/bench_cuda"; tail -14 "$logs/bench_cuda.log"
     PYTHONUNBUFFERED=1 run torch_cuda ${TORCH_SECS:-150} python3 "$here/bench/peers/torch_cuda_bench.py" ${TORCH_ARGS:-}
     tail -14 "$logs/torch_cuda.log" ;;
  esac
done
XZ_OPT=-T0 tar cJf "$out/kernels.tar.xz" -C /tmp/nb kernels 2>/dev/null
tar czf "$out/logs.tgz" -C /tmp/nb logs
