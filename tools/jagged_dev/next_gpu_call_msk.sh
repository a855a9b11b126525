#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_msk.sh: session 28's second jagged backward call (issue 17):
#   device: carry [".devdeps", ".devrun"], bash tools/jagged_dev/next_gpu_call_msk.sh
# .devrun/bwd_test_msk is the dev harness built here with
#   BWD_ONLY='^ws-(tma|msk) ' B=/tmp/jb2 sh tools/jagged_dev/bwd_build.sh
# 1. "ws-msk" (tools/jagged_dev/jagged_bwd_ws_m.cu: P without the no-key
#    case, the mask as one column range a key row) against float64 and
#    under memcheck, then timed beside "ws-tma" (the template, stmatrix on).
# 2. The product with stmatrix (ae67c63): the GPU suite's jagged cases and
#    compute-sanitizer over the jagged specs (tools/gpu_session.sh).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
H=.devrun/bwd_test_msk
M=("ws-msk bf16 d128 full blk128" "ws-msk bf16 d128 causal blk128" "ws-msk bf16 d64 full blk128"
   "ws-msk bf16 d64 causal blk128" "ws-msk bf16 d128 full win[100,0] blk128"
   "ws-msk f16 d64 full win[64,32] blk128" "ws-msk bf16 d64 causal win[128,0] blk128")
echo "=== check $(date +%T)"
timeout 90 $H checksm90 29 "${M[@]}" > "$out/msk-check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/msk-check.log" | tail -4
timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $H small 5 \
  "ws-msk bf16 d128 causal blk128" "ws-msk bf16 d64 causal win[128,0] blk128" > /tmp/san.log 2>&1
echo "memcheck rc $? $(grep -E 'ERROR SUMMARY|checks:' /tmp/san.log | tr '\n' ' ')"
echo "=== time $(date +%T)"
for v in "d128 causal" "d64 causal" "d128 full" "d64 full"; do
  timeout 60 $H time 9 "ws-tma bf16 $v blk128" "ws-msk bf16 $v blk128" 2>&1 | grep "^time"
done | tee "$out/msk-time.log" | sed 's/ *tokens [0-9]* *//'
echo "=== product $(date +%T)"
OUT=$out SANITIZE_ONLY=jagged bash tools/gpu_session.sh build gpu-jagged sanitize-jagged 2>&1 | tail -25
