#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_late_dq.sh: what session 23 could not run when its device
# time ran out. One device call, about 6 minutes:
#   run ../shared/device/prepare here first; device: carry [".devdeps", ".devrun"],
#   command: bash tools/next_gpu_call_late_dq.sh
# 1. bwd_late_dq (generator/plan_block.c), timed faster on 2026-12-05
#    (bench/results/2026-12-05-h200-rotary-choices.md) but checked only
#    with bwd_table_global beside it: turned on here, the GPU suite's
#    rotary case (every rotary spec against float64: case 13 is
#    specs/ads_block64_d128_rope.yaml's layout) and compute-sanitizer on
#    the ads spec. If both pass: set bwd_late_dq_checked, regenerate the
#    goldens (rope_interleaved_block_b64_d128_fp16_bwd changes), drop
#    known_serialized() in tests/check_nvrtc.c (the ads spec's C7511 ends).
# 2. Issue 20: bench/overhead.py --parts (the steps of an eager call).
# 3. Issue 17: the fused dQ harness (.devrun/bwd_test_fdq; tools/next_gpu_call.sh
#    says how to build it): against float64, then timed beside ws-tma.
# Logs to $OUT (at most 8 files come back).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
tree_plan=/tmp/plan_block.c.tree
cp generator/plan_block.c "$tree_plan"
trap 'cp "$tree_plan" generator/plan_block.c' EXIT
sed -i 's/static const bool bwd_late_dq_checked = false;/static const bool bwd_late_dq_checked = true;/' \
  generator/plan_block.c
rm -f build/generator/plan_block.o  # the device keeps build outputs between calls
make -j16 all build/check_attngen > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "block choices on: $(grep -c "_checked = true;" generator/plan_block.c) (fwd_table_slot, bwd_rotary_12_warps, bwd_late_dq)"
build/attngen emit specs/ads_block64_d128_rope.yaml | grep -q "dq_acc" || { echo "bwd_late_dq is not on"; exit 1; }
echo "=== gpu-rotary $(date +%T)"
OUT=$out timeout 240 tools/gpu_session.sh gpu-rotary
echo "=== sanitizers $(date +%T)"
S=/usr/local/cuda/bin/compute-sanitizer
for tool in memcheck racecheck; do
  timeout 60 $S --tool $tool --error-exitcode 9 build/attngen run specs/ads_block64_d128_rope.yaml \
    --batch 5 --seqlen 300 --min-seqlen 0 --iters 0 > /tmp/san.log 2>&1
  echo "ads rope $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check' /tmp/san.log | tr '\n' ' ')"
done
echo "=== overhead parts $(date +%T)"
PYTHONPATH=bindings/python:$PYTHONPATH timeout 70 python3 bench/overhead.py --parts --calls 2000 \
  --out "$out/parts" 2>&1 | tail -18
echo "=== fused dQ harness $(date +%T)"
F=.devrun/bwd_test_fdq
[ -x "$F" ] || { echo "no $F (tools/next_gpu_call.sh says how to build it)"; exit 0; }
V=("ws-fdq bf16 d128 full blk128" "ws-fdq bf16 d128 causal blk128" "ws-fdq f16 d128 full blk128")
timeout 60 "$F" checksm90 31 "${V[@]}" > "$out/fdq-check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/fdq-check.log" | tail -5
timeout 60 "$F" time 7 "ws-tma bf16 d128 full blk128" "ws-fdq bf16 d128 full blk128" \
  "ws-tma bf16 d128 causal blk128" "ws-fdq bf16 d128 causal blk128" 2>&1 | grep "^time" |
  sed 's/ *tokens [0-9]* *//'
