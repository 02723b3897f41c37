#!/bin/sh
# scripts/deps.sh — the one place that knows nabla's Debian packages. Installs
# the ones missing (needs root or sudo); does nothing when all are present.
set -e
# scripts/deps.sh digits DIR: prints the path of the handwritten-digits data
# (examples/digits.c), scikit-learn's digits.csv.gz from Debian's python3-sklearn:
# the installed file if there is one, else that one file taken from the package
# (apt-get download, no install, no root needed) into DIR.
if [ "${1:-}" = digits ]; then
  rel=usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
  if [ -f "/$rel" ]; then echo "/$rel"; exit 0; fi
  dir=${2:-build/data}
  if [ ! -f "$dir/digits.csv.gz" ]; then
    mkdir -p "$dir/pkg"
    (cd "$dir/pkg" && rm -f python3-sklearn_*.deb &&
      { apt-get download python3-sklearn >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null 2>&1 && apt-get download python3-sklearn >/dev/null; }; } &&
      dpkg-deb --fsys-tarfile python3-sklearn_*.deb | tar -x "./$rel") >&2 ||
      { echo "deps.sh: could not fetch python3-sklearn's digits.csv.gz" >&2; exit 1; }
    mv "$dir/pkg/$rel" "$dir/digits.csv.gz"
    rm -rf "$dir/pkg"
  fi
  echo "$dir/digits.csv.gz"
  exit 0
fi
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
