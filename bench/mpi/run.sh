#!/bin/sh
# bench/mpi/run.sh BUILD [args] — bench/mpi/bench_mpi.c under mpirun with 1, 2
# and 4 processes (one OpenMP thread each: the ranks share the machine's cores),
# its JSON lines to stdout and BUILD/bench/mpi.jsonl. `make MPI=1 bench-mpi`.
set -eu
build=$1
shift
bin=$build/bench/bench_mpi
out=$build/bench/mpi.jsonl
: > "$out"
for np in 1 2 4; do
  OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS -np $np \
    "$bin" "$@" | tee -a "$out"
done
