#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call.sh: the first device call prepared for the next session
# (written 2026-12-04): check the dev harness's "ws-n128" (dV, dK as one
# m64n128k16 a k-step), "ws-early" (the step's LSE and D read before the
# waits) and "ws-ne" (both) variants of tools/jagged_dev/jagged_bwd_wsn.cu,
# never run yet, against float64; then time them beside the template
# ("ws-s2") and run the sanitizers on them. Build here first and carry the
# binary:
#   B=build/jagged_bwd BWD_ONLY='^ws-(n128|early|ne|s2) (bf16|f16) d128' sh tools/jagged_dev/bwd_build.sh
#   mkdir -p .devrun && cp build/jagged_bwd/bwd_test .devrun/
#   device: carry [".devrun"], command: bash tools/jagged_dev/next_gpu_call.sh
# Fold what wins into templates/jagged_bwd_ws.cu (issue_dkv_n128 into
# jagged_bwd_wgmma.cuh) and run the product's GPU suite; delete the rest.
B=${BWD_TEST:-.devrun/bwd_test}
out=${OUT:-/tmp}
V=("ws-n128 bf16 d128 full blk128" "ws-n128 bf16 d128 causal blk128" "ws-n128 f16 d128 full blk128"
   "ws-n128 bf16 d128 full win[100,0] blk128" "ws-early bf16 d128 causal blk128"
   "ws-early f16 d128 full blk128" "ws-ne bf16 d128 full blk128" "ws-ne bf16 d128 full win[100,0] blk128")
echo "=== check $(date +%T)"
timeout 200 "$B" checksm90 29 "${V[@]}" > "$out/check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/check.log" | tail -5
grep -q "checks: 0 failed" "$out/check.log" || exit 3
echo "=== time $(date +%T)"
for seed in 7 8 9; do
  timeout 90 "$B" time $seed "ws-s2 bf16 d128 full blk128" "ws-n128 bf16 d128 full blk128" \
    "ws-early bf16 d128 full blk128" "ws-ne bf16 d128 full blk128" \
    "ws-s2 bf16 d128 causal blk128" "ws-n128 bf16 d128 causal blk128" \
    "ws-early bf16 d128 causal blk128" "ws-ne bf16 d128 causal blk128" >> "$out/time.log" 2>&1
done
grep "^time" "$out/time.log" | sed 's/ *tokens [0-9]* *//; s/(dq.*//'
S=/usr/local/cuda/bin/compute-sanitizer
timeout 60 $S --tool memcheck --error-exitcode 9 "$B" small 3 "${V[0]}" "${V[1]}" "${V[6]}" > "$out/memcheck.log" 2>&1
echo "memcheck rc $?"
timeout 60 $S --tool racecheck --error-exitcode 9 "$B" small 3 "${V[0]}" "${V[6]}" > "$out/racecheck.log" 2>&1
echo "racecheck rc $?"
