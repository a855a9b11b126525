#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call.sh: what session 21 prepared and could not run (no device was
# lent after its fourth call). One device call, about 8 minutes:
#   run ../shared/device/prepare here first; device: carry [".devdeps"],
#   command: bash tools/next_gpu_call.sh
# 1. Issue 20: bench/overhead.py --parts times each step of an eager block
#    forward and backward on the H200's host (the checks, the kernel lookup,
#    the allocations, the stream, the args struct, the C launch), then the
#    whole table with Triton and varlen_attn beside it: is the new eager fast
#    path (ops._fast_block_forward) under 15 us a call?
# 2. Issue 19: the backward's FlexAttention rows, through peers/flex.py's new
#    fallback (a mask of 128-token blocks), first the probe's "coarse" way
#    alone, then bench.py's backward with FA2 and attngen beside it.
# 3. Issue 17: the fused dQ (FUSED_DQ, sm90_bwd_fused_dq off), first in the
#    dev harness: against float64, then timed beside "ws-tma" (the shipped
#    template), then memcheck and racecheck. Build it here and carry it:
#      B=build/jagged_bwd_f BWD_ONLY='^ws-(fdq|tma) (bf16|f16) d128' sh tools/jagged_dev/bwd_build.sh
#      mkdir -p .devrun && cp build/jagged_bwd_f/bwd_test .devrun/bwd_test_fdq
#    (carry [".devdeps", ".devrun"]). A hang shows as the check's timeout:
#    a named barrier's count (160: a warpgroup and its dQ warp) or the
#    bulk load's expect_tx. dQ rows left unwritten show as "unwritten".
#    If it passes and wins: set jagged_checked.sm90_bwd_fused_dq (plan_jagged.c),
#    then gpu-jagged, sanitize-jagged and bench/jagged_bench.py with FA4 on
#    the product.
# Logs to $OUT (at most 8 files come back).
source .devdeps/env.sh || exit 1
export PYTHONPATH=bindings/python:$PYTHONPATH
out=${OUT:-/tmp}
make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "=== overhead parts $(date +%T)"
python3 bench/overhead.py --parts --calls 2000 --out "$out/parts" 2>&1 | tail -18
echo "=== overhead $(date +%T)"
timeout 200 python3 bench/overhead.py --calls 2000 --out "$out/overhead" 2>&1 | tail -20
echo "=== flex probe $(date +%T)"
timeout 150 python3 bench/flex_probe.py --dim 128 --seqlen 1024 --ways coarse
echo "=== flex backward rows $(date +%T)"
timeout 240 python3 bench/bench.py --quick --pass bwd --peers attngen,varlen_fa2,flex \
  --budget 220 --no-plot --out "$out/flexbwd" 2>&1 | tail -25
echo "=== fused dQ harness $(date +%T)"
F=.devrun/bwd_test_fdq
if [ -x "$F" ]; then
  V=("ws-fdq bf16 d128 full blk128" "ws-fdq bf16 d128 causal blk128" "ws-fdq f16 d128 full blk128"
     "ws-fdq f16 d128 causal blk128" "ws-fdq bf16 d128 full win[100,0] blk128")
  timeout 200 "$F" checksm90 31 "${V[@]}" > "$out/fdq-check.log" 2>&1
  echo "check rc $?"; grep -v "^ok" "$out/fdq-check.log" | tail -5
  if grep -q "checks: 0 failed" "$out/fdq-check.log"; then
    timeout 150 "$F" time 7 "ws-tma bf16 d128 full blk128" "ws-fdq bf16 d128 full blk128" \
      "ws-tma bf16 d128 causal blk128" "ws-fdq bf16 d128 causal blk128" 2>&1 | grep "^time" |
      sed 's/ *tokens [0-9]* *//'
    S=/usr/local/cuda/bin/compute-sanitizer
    timeout 60 $S --tool memcheck --error-exitcode 9 "$F" small 3 "${V[0]}" "${V[1]}" > "$out/fdq-memcheck.log" 2>&1
    echo "memcheck rc $?"
    timeout 60 $S --tool racecheck --error-exitcode 9 "$F" small 3 "${V[0]}" > "$out/fdq-racecheck.log" 2>&1
    echo "racecheck rc $?"
  fi
else
  echo "no $F: build it first (the header says how)"
fi
