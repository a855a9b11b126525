#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_block.sh: the block-diagonal plan choices session 23 left
# off (generator/plan_block.c), checked and timed in one device call of
# about 8 minutes, then the owed host-overhead and fused-dQ steps.
# Ran on 2026-12-05 (session 26, 256 s; bench/results/
# 2026-12-05-h200-next-gpu-call-block.log): bwd_late_dq is now on,
# fwd_rotary_2_stages stays off (slower), the fused dQ stays off (slower);
# kept to re-run the same checks on a later choice:
#   run ../shared/device/prepare here first; device: carry [".devdeps", ".devrun"],
#   command: bash tools/next_gpu_call_block.sh
# 1. With bwd_late_dq and fwd_rotary_2_stages on (after step 2): the GPU suite's rotary
#    case (every rotary spec against float64; its last case is
#    specs/ads_block64_d128_rope.yaml's layout, and four cases are head_dim
#    64 forwards of 64-token blocks), then compute-sanitizer on the ads spec
#    and a head_dim 64 table spec.
#    - bwd_late_dq was timed faster on 2026-12-05
#      (bench/results/2026-12-05-h200-rotary-choices.md) but checked only
#      with bwd_table_global beside it.
#    - fwd_rotary_2_stages was written after the device time ran out.
# 2. tools/rotary_choice_time.py, the tree's choices against both on.
#    (The timing runs first, before the suite: it is the step that must
#    not be cut off by the 600 s limit, as on 2026-12-05.)
#    Keep what is correct and faster: set its *_checked constant,
#    regenerate the goldens (cd tests && AG_UPDATE_GOLDENS=1 AG_SUITES=emit
#    ../build/check_attngen: bwd_late_dq changes
#    rope_interleaved_block_b64_d128_fp16_bwd, fwd_rotary_2_stages
#    rope_half_sequence_d64_fp16_bwd), update tests/check_rotary.c's
#    plan_values (with fwd_rotary_2_stages its head_dim 64 forward: two
#    stages, 2 * (3 * 64 * 256 + 64 * 128) bytes, two CTAs), and with
#    bwd_late_dq drop known_serialized() in tests/check_nvrtc.c (the ads
#    spec's C7511 ends).
# 3. Issue 20: bench/overhead.py --parts (the steps of an eager call).
# 4. Issue 17: the fused dQ harness (.devrun/bwd_test_fdq;
#    tools/next_gpu_call.sh says how to build it), against float64, then
#    timed beside ws-tma.
# Logs to $OUT (at most 8 files come back).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
export PYTHONPATH=bindings/python:$PYTHONPATH
source tools/block_choices.sh
block_choices_keep
block_choices || exit 1
make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
cp -L build/libattngen.so /tmp/lib_tree.so
block_choices bwd_late_dq fwd_rotary_2_stages || exit 1
make -j16 all build/check_attngen >> "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
cp -L build/libattngen.so /tmp/lib_on.so
build/attngen emit specs/ads_block64_d128_rope.yaml | grep -q "dq_acc" || { echo "bwd_late_dq is not on"; exit 1; }
printf 'name: r64t\npattern: block_diagonal\nblock_size: 64\nhead_dim: 64\ndtype: bf16\nrotary:\n  layout: interleaved\n  apply_to: [q, k]\n  positions: table\npasses: [forward, backward]\n' > /tmp/r64t.yaml
build/attngen emit /tmp/r64t.yaml | grep -q "constexpr int kStages = 2;" || { echo "fwd_rotary_2_stages is not on"; exit 1; }
echo "=== timed: the tree's choices, then bwd_late_dq and fwd_rotary_2_stages on $(date +%T)"
for f in tree on; do
  ATTNGEN_LIB=/tmp/lib_$f.so timeout 200 python3 tools/rotary_choice_time.py $f --compile-only &
done
wait
for f in tree on; do
  ATTNGEN_LIB=/tmp/lib_$f.so timeout 100 python3 tools/rotary_choice_time.py $f 2>&1 | tee -a "$out/timed.log"
done
echo "=== gpu-rotary (choices on) $(date +%T)"
OUT=$out timeout 240 tools/gpu_session.sh gpu-rotary
echo "=== sanitizers (choices on) $(date +%T)"
S=/usr/local/cuda/bin/compute-sanitizer
for s in specs/ads_block64_d128_rope.yaml /tmp/r64t.yaml; do
  for tool in memcheck racecheck; do
    timeout 60 $S --tool $tool --error-exitcode 9 build/attngen run $s --batch 5 --seqlen 300 \
      --min-seqlen 0 --iters 0 > /tmp/san.log 2>&1
    echo "$s $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check' /tmp/san.log | tr '\n' ' ')"
  done
done
echo "=== overhead parts $(date +%T)"
timeout 70 python3 bench/overhead.py --parts --calls 2000 --out "$out/parts" 2>&1 | tail -18
echo "=== fused dQ harness $(date +%T)"
F=.devrun/bwd_test_fdq
[ -x "$F" ] || { echo "no $F (tools/next_gpu_call.sh says how to build it)"; exit 0; }
V=("ws-fdq bf16 d128 full blk128" "ws-fdq bf16 d128 causal blk128" "ws-fdq f16 d128 full blk128")
timeout 60 "$F" checksm90 31 "${V[@]}" > "$out/fdq-check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/fdq-check.log" | tail -5
timeout 60 "$F" time 7 "ws-tma bf16 d128 full blk128" "ws-fdq bf16 d128 full blk128" \
  "ws-tma bf16 d128 causal blk128" "ws-fdq bf16 d128 causal blk128" 2>&1 | grep "^time" |
  sed 's/ *tokens [0-9]* *//'
