#!/bin/sh
# scripts/gpu_bundle.sh OUT.tar.xz BINARY... — packs binaries built here with the
# shared libraries they need from this machine's Debian packages (oneDNN, OpenBLAS,
# Criterion and their dependencies) into one compressed tarball, for a machine that
# has none of them (the GPU machines: CUDA and a driver, but no Debian -dev
# packages). The C library, libm, libstdc++ and libgcc_s stay the host's own; the
# CUDA libraries are opened at run time from the target's CUDA install.
#
# On the target:  mkdir -p /tmp/nb && tar xJf OUT.tar.xz -C /tmp/nb &&
#                 LD_LIBRARY_PATH=/tmp/nb/lib /tmp/nb/bin/BINARY
set -eu
[ $# -ge 2 ] || { echo "usage: $0 OUT.tar.xz BINARY..." >&2; exit 2; }
out=$1
shift
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in "$@"; do
  cp "$b" "$stage/bin/"
  strip "$stage/bin/$(basename "$b")" 2>/dev/null || true
  ldd "$b" | awk '/=>/ {print $3}' | while read -r lib; do
    case $(basename "$lib") in
    libc.so* | libm.so* | libstdc++* | libgcc_s* | libresolv* | libpthread* | libdl.so* | librt.so* | libcuda.so*) ;;
    *) [ -e "$stage/lib/$(basename "$lib")" ] || cp -L "$lib" "$stage/lib/" ;;
    esac
  done
done
tar cJf "$out" -C "$stage" bin lib
echo "gpu_bundle.sh: $out ($(du -h "$out" | cut -f1)): $(ls "$stage/bin" | tr '\n' ' ')"
