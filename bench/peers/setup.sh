#!/bin/sh
# bench/peers/setup.sh — creates bench/peers/.venv (git-ignored) with the peers that
# `make bench` compares nabla against: PyTorch (CPU) and JAX (CPU), plus numpy.
# Idempotent: does nothing when the venv already imports both. Never run by
# `make test`; nothing in the library or its tests needs Python.
#
# PyTorch, best setup first:
#   1. the CPU wheel from PyTorch's own index (oneDNN + MKL, no CUDA libraries);
#   2. the PyPI wheel (the same CPU kernels; pulls in the CUDA runtime wheels,
#      unused here, a few GB);
#   3. Debian's python3-torch (OpenBLAS; run it with OPENBLAS_CORETYPE=SkylakeX),
#      installed with apt, seen through --system-site-packages.
# PEERS_TORCH=cpu-index|pypi|debian forces one of them.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv"
py=/usr/bin/python3 # Debian's: the only one that can see python3-torch in route 3

ok() { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import torch, jax, numpy' 2>/dev/null; }
if ok; then
  echo "setup.sh: $venv already has torch and jax"
  exit 0
fi

# install ROUTE: a fresh venv with torch from ROUTE, then numpy and JAX.
install() {
  rm -rf "$venv"
  case $1 in
  debian)
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-torch python3-venv &&
      "$py" -m venv --system-site-packages "$venv" &&
      # numpy < 2 keeps the ABI Debian's torch was built against; pip picks the
      # newest JAX that accepts it.
      "$venv/bin/pip" install -q 'numpy<2' jax jaxlib
    ;;
  cpu-index)
    "$py" -m venv "$venv" &&
      "$venv/bin/pip" install -q --timeout 20 --retries 1 torch --index-url https://download.pytorch.org/whl/cpu &&
      "$venv/bin/pip" install -q numpy jax jaxlib
    ;;
  pypi)
    "$py" -m venv "$venv" && "$venv/bin/pip" install -q torch numpy jax jaxlib ;;
  *)
    echo "setup.sh: PEERS_TORCH=$1: expected cpu-index, pypi or debian" >&2
    return 1
    ;;
  esac
}

if [ -n "${PEERS_TORCH:-}" ]; then
  install "$PEERS_TORCH"
else
  for route in cpu-index pypi debian; do
    echo "setup.sh: trying PyTorch from: $route"
    if install $route && ok; then break; fi
  done
fi
ok || { echo "setup.sh: the venv does not import torch, jax and numpy" >&2; exit 1; }
"$venv/bin/python" -c 'import torch, jax, numpy; print("setup.sh: torch", torch.__version__, "jax", jax.__version__, "numpy", numpy.__version__)'
