#!/bin/sh
# scripts/check_layers.sh — fails (exit 1) when a file under src/ includes
# across the layering (transforms -> sharding -> ops -> core -> backend
# interface; backends on core and the interface only; each src/*/README.md
# states its folder's rule), or when quoted includes form a cycle. `make test`
# runs it first (`make check-layers` alone). POSIX sh + find/grep/awk.
#
# Every `#include "..."` of src/**/*.{c,h,def} is resolved as the compiler
# does (relative to the including file, then include/) and checked against
# the rules below; <...> includes (system headers, <nabla/...>) are not read.
# Layers, from the top (a layer includes only itself and what it lists):
#   nn          src/nn/          core (modules built from the public API)
#   io          src/io/          core (the rest through the public API)
#   train       src/train/       transforms, sharding, ops, core
#   autoshard   src/autoshard/   transforms, sharding, ops, core
#   transforms  src/transforms/  sharding, ops, core
#   sharding    src/sharding/    ops, core
#   ops         src/ops/         core
#   core        src/core/        the op lists (src/ops/*.def), the backend
#                                interface (src/backends/*.h: backend.h, the
#                                backend-neutral ew_formulas.h)
#   interface   src/backends/*.h core, the op lists
#   backend X   src/backends/X/  the interface, core, ops headers (attribute
#                                slots such as src/ops/nn.h, the op lists)
#   NB_EMU      src/backends/emu/ as a backend, and src/backends/cpu/cpu.h
#                                (the emulated device runs the CPU's kernels)
# and every layer include/nabla. So ops, sharding and transforms never reach a
# device except through core; nothing outside src/backends/X includes
# src/backends/X (but the emulated device the CPU's cpu.h); core reaches sharding only through the hooks it declares
# (nbi_shard_hooks), which no include shows. A file in no layer fails too:
# give a new folder its rule here.
#
# ALLOW lists exceptions, "file included-file", one per line (none today: the
# last, core/fuse.c -> backends/cpu/k_gemm_epi.h, went when the planner began
# describing GEMM epilogues itself). An exception belongs to work in progress
# and goes as it lands: delete a line when its include goes (the script prints
# the lines no include uses; that note does not fail).
set -u
cd "$(dirname "$0")/.." || exit 2

ALLOW='
'

files=$(find src -type f \( -name '*.c' -o -name '*.h' -o -name '*.def' \) | LC_ALL=C sort)
[ -n "$files" ] || { echo "check_layers: no sources under src/" >&2; exit 2; }

# shellcheck disable=SC2086 # one word per path (no spaces in source paths)
grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $files /dev/null |
  NB_LAYER_ALLOW="$ALLOW" awk '
function norm(path, n, parts, out, m, i) {
  n = split(path, parts, "/")
  m = 0
  for (i = 1; i <= n; i++) {
    if (parts[i] == "" || parts[i] == ".") continue
    if (parts[i] == ".." && m > 0 && out[m] != "..") { m--; continue }
    out[++m] = parts[i]
  }
  path = ""
  for (i = 1; i <= m; i++) path = path (i > 1 ? "/" : "") out[i]
  return path
}
function exists(path, line, r) {
  r = (getline line < path)
  if (r >= 0) close(path)
  return r >= 0
}
# The layer of a path: transforms, sharding, ops, core, iface (a header
# directly in src/backends), be:X (src/backends/X/...), public (include/nabla),
# opslist (src/ops/*.def, a pseudo-layer core and backends may include), or "".
function layer(p, a) {
  if (p ~ /^include\/nabla\//) return "public"
  if (p ~ /^src\/(core|ops|sharding|transforms|train|nn|autoshard|io)\//) { split(p, a, "/"); return a[2] }
  if (p ~ /^src\/backends\/[^\/]+$/) return "iface"
  if (p ~ /^src\/backends\/[^\/]+\//) { split(p, a, "/"); return "be:" a[3] }
  return ""
}
function allowed(from, p, to) {
  to = layer(p)
  if (to == "public" || to == from) return 1
  if (from == "nn") return to == "core"
  if (from == "train") return to == "transforms" || to == "sharding" || to == "ops" || to == "core"
  if (from == "autoshard") return to == "transforms" || to == "sharding" || to == "ops" || to == "core"
  if (from == "io") return to == "core"
  if (from == "transforms") return to == "sharding" || to == "ops" || to == "core"
  if (from == "sharding") return to == "ops" || to == "core"
  if (from == "ops") return to == "core"
  if (from == "core") return to == "iface" || p ~ /^src\/ops\/[^\/]+\.def$/
  if (from == "iface") return to == "core" || p ~ /^src\/ops\/[^\/]+\.def$/
  if (from == "be:emu" && p == "src/backends/cpu/cpu.h") return 1
  if (from ~ /^be:/)
    return to == "iface" || to == "core" || p ~ /^src\/ops\/[^\/]+\.(h|def)$/
  return 0
}
function rule(from) {
  if (from == "nn") return "nn may include only nn, core"
  if (from == "train") return "train may include only train, transforms, sharding, ops, core"
  if (from == "autoshard") return "autoshard may include only autoshard, transforms, sharding, ops, core"
  if (from == "io") return "io may include only io, core (everything else through include/nabla)"
  if (from == "transforms") return "transforms may include only transforms, sharding, ops, core"
  if (from == "sharding") return "sharding may include only sharding, ops, core"
  if (from == "ops") return "ops may include only ops, core"
  if (from == "core")
    return "core may include only core, the op lists (src/ops/*.def), the backend interface (src/backends/*.h)"
  if (from == "iface") return "the backend interface may include only itself, core, the op lists"
  if (from ~ /^be:/)
    return "src/backends/" substr(from, 4) "/ may include only itself, the backend interface, core, ops headers" \
      (from == "be:emu" ? ", src/backends/cpu/cpu.h" : "")
  return "file in no layer (give its folder a rule in scripts/check_layers.sh)"
}
# Depth-first search for include cycles; state: 1 on the stack, 2 done.
function visit(f, k, g, j, cyc) {
  state[f] = 1
  stack[++depth] = f
  for (k = 1; k <= nout[f]; k++) {
    g = out[f, k]
    if (state[g] == 1) {
      cyc = g
      for (j = depth; j >= 1 && stack[j] != g; j--) cyc = stack[j] " -> " cyc
      print "include cycle: " g " -> " cyc
      bad++
    } else if (state[g] == 0) visit(g)
  }
  depth--
  state[f] = 2
}
BEGIN {
  n = split(ENVIRON["NB_LAYER_ALLOW"], lines, "\n")
  for (i = 1; i <= n; i++) {
    if (lines[i] ~ /^[ \t]*(#|$)/) continue
    split(lines[i], w, " ")
    allow[w[1] SUBSEP w[2]] = 1
    allow_text[w[1] SUBSEP w[2]] = w[1] " " w[2]
  }
}
{
  c1 = index($0, ":"); file = substr($0, 1, c1 - 1)
  rest = substr($0, c1 + 1); c2 = index(rest, ":"); lno = substr(rest, 1, c2 - 1)
  text = substr(rest, c2 + 1)
  sub(/^[^"]*"/, "", text); sub(/".*$/, "", text)
  dir = file; sub(/\/[^\/]*$/, "", dir)
  target = norm(dir "/" text)
  if (!exists(target)) {
    alt = norm("include/" text)
    if (!exists(alt)) { print file ":" lno ": includes \"" text "\", which resolves to no file"; bad++; next }
    target = alt
  }
  if (!seen_edge[file, target]++) { out[file, ++nout[file]] = target; node[file] = node[target] = 1 }
  from = layer(file)
  if (from != "" && allowed(from, target)) next
  if ((file SUBSEP target) in allow) { used[file SUBSEP target] = 1; next }
  print file ":" lno ": includes " target ": " rule(from)
  bad++
}
END {
  for (f in node) if (state[f] == 0) visit(f)
  for (k in allow)
    if (!(k in used)) print "check_layers: allow-list entry no longer needed (delete it): " allow_text[k]
  if (bad) { print "check_layers: " bad " problem(s): includes across the layering, unresolved or in a cycle (the rules: scripts/check_layers.sh)"; exit 1 }
}'
