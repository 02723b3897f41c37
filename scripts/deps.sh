#!/bin/sh
# scripts/deps.sh — the one place that knows nabla's Debian packages. Installs
# the ones missing (needs root or sudo); does nothing when all are present.
set -e
PKGS="build-essential g++ clang libomp-dev pkg-config libdnnl-dev libopenblas-dev libcriterion-dev"
# scripts/deps.sh mpi: Open MPI too (make MPI=1)
[ "${1:-}" = mpi ] && PKGS="$PKGS libopenmpi-dev openmpi-bin"
# scripts/deps.sh cbc: COIN-OR CBC (EPL), the optional ILP backend of
# nb_auto_shard, loaded with dlopen at run time (nabla builds without it)
[ "${1:-}" = cbc ] && PKGS="$PKGS coinor-libcbc-dev"
missing=""
for p in $PKGS; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "deps.sh: installing$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
