#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call.sh: the first device call prepared for the next session
# (written 2026-12-04, session 20): check the dev harness's "ws-tma"
# variants (templates/jagged_bwd_ws.cu's own TMA path, TMA_QDO: Q and dO by
# TMA, the maps of q and dout passed last as the product's launcher
# passes them), never run yet, against float64; then time them beside the
# same template without it ("ws-s2") and run the sanitizers on them. Build
# here first and carry the binary:
#   B=build/jagged_bwd BWD_ONLY='^ws-(tma|s2) (bf16|f16) d(128|64)' sh tools/jagged_dev/bwd_build.sh
#   mkdir -p .devrun && cp build/jagged_bwd/bwd_test .devrun/
#   device: carry [".devrun"], command: bash tools/jagged_dev/next_gpu_call.sh
# A hang (a transaction count that never completes) shows as the check's
# 200 s timeout: then look at the expect_tx bytes against the boxes.
# If ws-tma passes and wins, set plan_jagged.c's sm90_bwd_tma_checked, run
# tools/gpu_session.sh build gpu-jagged sanitize-jagged (SANITIZE_ONLY=
# jagged) on the product and time it with bench/jagged_bench.py. The
# forward's K and V by TMA (jagged_fwd_ws.cu under TMA_KV,
# sm90_fwd_tma_checked) has no harness variant: set its flag in a working
# copy and run gpu-jagged, gpu-broadcast and sanitize-jagged on it, and
# time it with bench/jagged_bench.py against the same build with the flag
# off.
B=${BWD_TEST:-.devrun/bwd_test}
out=${OUT:-/tmp}
V=("ws-tma bf16 d128 full blk128" "ws-tma bf16 d128 causal blk128" "ws-tma f16 d128 full blk128"
   "ws-tma bf16 d128 full win[100,0] blk128" "ws-tma bf16 d64 full blk128"
   "ws-tma bf16 d64 causal blk128" "ws-tma f16 d64 causal blk128")
echo "=== check $(date +%T)"
timeout 200 "$B" checksm90 31 "${V[@]}" > "$out/check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/check.log" | tail -5
grep -q "checks: 0 failed" "$out/check.log" || exit 3
echo "=== time $(date +%T)"
for seed in 7 8; do
  timeout 120 "$B" time $seed "ws-s2 bf16 d128 full blk128" "ws-tma bf16 d128 full blk128" \
    "ws-s2 bf16 d128 causal blk128" "ws-tma bf16 d128 causal blk128" \
    "ws-s2 bf16 d64 full blk128" "ws-tma bf16 d64 full blk128" >> "$out/time.log" 2>&1
done
grep "^time" "$out/time.log" | sed 's/ *tokens [0-9]* *//; s/(dq.*//'
S=/usr/local/cuda/bin/compute-sanitizer
timeout 60 $S --tool memcheck --error-exitcode 9 "$B" small 3 "${V[0]}" "${V[1]}" "${V[4]}" > "$out/memcheck.log" 2>&1
echo "memcheck rc $?"
timeout 60 $S --tool racecheck --error-exitcode 9 "$B" small 3 "${V[0]}" "${V[5]}" > "$out/racecheck.log" 2>&1
echo "racecheck rc $?"
