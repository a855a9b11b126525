#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call.sh: the first device call prepared for the next session
# (written 2026-12-04): check the dev harness's "ws-n128" variants (dV, dK
# as one m64n128k16 a k-step: tools/jagged_dev/jagged_bwd_wsn.cu, never run
# yet) against float64, then time them beside the template ("ws-s2") and
# run the sanitizers on them. Build here first and carry the binary:
#   B=build/jagged_bwd BWD_ONLY='^ws-(n128|s2) (bf16|f16) d128' sh tools/jagged_dev/bwd_build.sh
#   mkdir -p .devrun && cp build/jagged_bwd/bwd_test .devrun/
#   device: carry [".devrun"], command: bash tools/jagged_dev/next_gpu_call.sh
# If ws-n128 wins, fold issue_dkv_n128 into templates/jagged_bwd_wgmma.cuh
# (and the product's GPU suite); else delete the dev copy.
B=${BWD_TEST:-.devrun/bwd_test}
out=${OUT:-/tmp}
V=("ws-n128 bf16 d128 full blk128" "ws-n128 bf16 d128 causal blk128" "ws-n128 f16 d128 full blk128"
   "ws-n128 bf16 d128 full win[100,0] blk128")
echo "=== check $(date +%T)"
timeout 150 "$B" checksm90 29 "${V[@]}" > "$out/check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/check.log" | tail -5
grep -q "checks: 0 failed" "$out/check.log" || exit 3
echo "=== time $(date +%T)"
for seed in 7 8 9; do
  timeout 60 "$B" time $seed "ws-s2 bf16 d128 full blk128" "ws-n128 bf16 d128 full blk128" \
    "ws-s2 bf16 d128 causal blk128" "ws-n128 bf16 d128 causal blk128" >> "$out/time.log" 2>&1
done
grep "^time" "$out/time.log" | sed 's/ *tokens [0-9]* *//; s/(dq.*//'
S=/usr/local/cuda/bin/compute-sanitizer
timeout 60 $S --tool memcheck --error-exitcode 9 "$B" small 3 "${V[0]}" "${V[1]}" > "$out/memcheck.log" 2>&1
echo "memcheck rc $?"
timeout 60 $S --tool racecheck --error-exitcode 9 "$B" small 3 "${V[0]}" > "$out/racecheck.log" 2>&1
echo "racecheck rc $?"
