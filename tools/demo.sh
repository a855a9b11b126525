#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# demo.sh: the README's main job. For every spec in specs/: validate it,
# emit its CUDA C (one file with the kernel of each pass the spec names),
# compile it with NVRTC for sm_90a, and, where a GPU is present, run each
# pass on random data against the float64 reference (`attngen run` checks
# the forward, then the backward of specs that have it).
set -u
bin=${1:-build/attngen}
out=build/specs
mkdir -p "$out"
fail=0 ran=0 skipped=0
for spec in specs/*.yaml; do
  name=$(basename "$spec" .yaml)
  "$bin" check "$spec" >/dev/null || { fail=1; continue; }
  "$bin" emit "$spec" -o "$out/$name.cu" || { fail=1; continue; }
  "$bin" compile "$spec" --arch sm_90a -o "$out/$name.sm_90a.cubin" || { fail=1; continue; }
  echo "$spec: emitted $out/$name.cu, compiled $out/$name.sm_90a.cubin"
  "$bin" run "$spec" --batch 64 --seqlen 1000
  case $? in
    0) ran=$((ran + 1)) ;;
    3) skipped=$((skipped + 1)) ;;
    *) fail=1 ;;
  esac
done
echo "demo: $ran run and checked on a GPU, $skipped without a GPU (generated and compiled only)"
exit $fail
