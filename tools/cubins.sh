#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# cubins.sh: every golden spec (tests/golden/*.yaml) and bundled spec
# (specs/*.yaml) compiled by NVRTC for sm_90a and sm_80 into DIR, the cache
# bypassed. A template refactor that
# claims to change no kernel is checked by running this before and after
# and comparing the two directories (`cmp` each pair; `tools/cubins.sh
# --same A B` does it).
# Usage: tools/cubins.sh DIR [ATTNGEN]   |   tools/cubins.sh --same DIR_A DIR_B
# (kernels moved within a source change the symbol order alone: then
# tools/cubin_code.py DIR_A DIR_B compares the code kernel by kernel)
set -eu
if [ "${1:-}" = --same ]; then
  a=$2 b=$3 rc=0
  for f in "$a"/*.cubin; do
    n=$(basename "$f")
    if [ ! -f "$b/$n" ]; then echo "only in $a: $n"; rc=1
    elif ! cmp -s "$f" "$b/$n"; then echo "differs: $n"; rc=1; fi
  done
  for f in "$b"/*.cubin; do [ -f "$a/$(basename "$f")" ] || { echo "only in $b: $(basename "$f")"; rc=1; }; done
  [ $rc -eq 0 ] && echo "same: $(ls "$a"/*.cubin | wc -l) cubins"
  exit $rc
fi
out=${1:?usage: tools/cubins.sh DIR [ATTNGEN]}
bin=${2:-build/attngen}
mkdir -p "$out"
export ATTNGEN_CACHE_DISABLE=1
pids=()
for spec in tests/golden/*.yaml specs/*.yaml; do
  name=$(basename "$(dirname "$spec")")_$(basename "$spec" .yaml)
  for arch in sm_90a sm_80; do
    # a spec that names its arch compiles for that one alone
    "$bin" compile "$spec" -o "$out/$name.$arch.cubin" --arch "$arch" 2>/dev/null &
    pids+=($!)
    if [ ${#pids[@]} -ge "${JOBS:-2}" ]; then wait "${pids[0]}" || true; pids=("${pids[@]:1}"); fi
  done
done
for p in "${pids[@]}"; do wait "$p" || true; done
echo "$(ls "$out"/*.cubin | wc -l) cubins in $out"
