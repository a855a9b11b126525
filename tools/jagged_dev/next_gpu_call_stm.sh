#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_stm.sh: session 28's jagged backward call (issue 17), after
# the FA4 stash call (../shared/device/fa4: carry .fa4/a, bash .fa4/a/stash.sh):
#   device: carry [".devdeps", ".fa4/b", ".devrun"],
#           bash tools/jagged_dev/next_gpu_call_stm.sh [nopair]
# .devrun/bwd_test_stm is the dev harness built here with
#   BWD_ONLY='^ws-(tma|stm|trace) bf16' B=/tmp/jb sh tools/jagged_dev/bwd_build.sh
# 1. "ws-stm" (dS^T stored by stmatrix, tools/jagged_dev/jagged_bwd_ws_x.cu)
#    against float64 and under memcheck and racecheck, then timed beside
#    "ws-tma" (the template) at L 1024 and 4096, two seeds.
# 2. "ws-trace": where a step's clocks go (jagged_bwd_ws_t.cu), by phase.
# 3. ncu of attngen's and FA4's backward at L 4096, head dim 128
#    (tools/jagged_dev/ncu_bwd_pair.sh).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
H=.devrun/bwd_test_stm
S=("ws-stm bf16 d128 full blk128" "ws-stm bf16 d128 causal blk128" "ws-stm bf16 d64 full blk128"
   "ws-stm bf16 d64 causal blk128" "ws-stm bf16 d128 full win[100,0] blk128")
echo "=== check $(date +%T)"
timeout 90 $H checksm90 28 "${S[@]}" > "$out/stm-check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/stm-check.log" | tail -4
for tool in memcheck racecheck; do
  timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 9 $H small 5 \
    "ws-stm bf16 d128 causal blk128" "ws-stm bf16 d64 full blk128" > /tmp/san.log 2>&1
  echo "$tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|checks:' /tmp/san.log | tr '\n' ' ')"
done
echo "=== time $(date +%T)"
for seed in 7 8; do
  for v in "d128 full" "d128 causal" "d64 full" "d64 causal"; do
    timeout 60 $H time $seed "ws-tma bf16 $v blk128" "ws-stm bf16 $v blk128" 2>&1 | grep "^time"
  done
done | tee "$out/stm-time.log" | sed 's/ *tokens [0-9]* *//'
echo "=== trace $(date +%T)"
for v in "d128 full" "d128 causal" "d64 full" "d64 causal"; do
  for L in 1024 4096; do
    BWD_LENGTHS=$L timeout 60 $H time 7 "ws-trace bf16 $v blk128" > /tmp/tr.log 2>&1
    cat /tmp/tr.log >> "$out/trace.log"
    grep "^time" /tmp/tr.log | sed 's/ *tokens [0-9]* *//'; grep "^trace" /tmp/tr.log | tail -2
  done
done
[ "${1:-}" = nopair ] && exit 0  # the pair in a later call (it needs .fa4/b)
echo "=== ncu pair $(date +%T)"
bash tools/jagged_dev/ncu_bwd_pair.sh 4096 128
