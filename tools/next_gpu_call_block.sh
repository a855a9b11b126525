#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_block.sh: a block-diagonal plan choice of
# generator/plan_block.c checked and timed in one device call of about 8
# minutes, then the host-overhead parts and the fused-dQ harness:
#   run ../shared/device/prepare here first; device: carry [".devdeps", ".devrun"],
#   command: bash tools/next_gpu_call_block.sh
# Ran on 2026-12-05 (session 26, 256 s; bench/results/
# 2026-12-05-h200-next-gpu-call-block.log) with bwd_late_dq (now on) and
# fwd_rotary_2_stages (slower, off). Now it checks table_reuse (session
# 26, not run): a block's rotary table rows loaded once for all its head
# groups, in the forward's slot (head_dim 128) or stages (64) and the
# backward's stages; at 4 heads of 128 the table adds 25% to the
# forward's bytes and 14% to the backward's when read per head.
# 1. Timed first (tools/rotary_choice_time.py, the tree's choices against
#    table_reuse on), so the 600 s limit cannot cut it off.
# 2. With it on: the GPU suite's rotary case (every rotary spec against
#    float64), then compute-sanitizer memcheck and racecheck on
#    specs/ads_block64_d128_rope.yaml (the slot) and a head_dim 64 table
#    spec (the stages).
#    Keep it if it is correct and faster: set block_checked.table_reuse,
#    regenerate the goldens (cd tests && AG_UPDATE_GOLDENS=1 AG_SUITES=emit
#    ../build/check_attngen: every block golden with a table changes) and
#    restate bench/RESULTS-rotary.md with `bench.py --quick --rotary`.
# 3. Issue 20: bench/overhead.py --parts.
# 4. Issue 17: the fused dQ harness (.devrun/bwd_test_fdq), if carried.
# Logs to $OUT (at most 8 files come back).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
export PYTHONPATH=bindings/python:$PYTHONPATH
source tools/block_choices.sh
block_choices_keep
block_choices || exit 1
make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
cp -L build/libattngen.so /tmp/lib_tree.so
block_choices table_reuse || exit 1
make -j16 all build/check_attngen >> "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
cp -L build/libattngen.so /tmp/lib_on.so
build/attngen emit specs/ads_block64_d128_rope.yaml | grep -q "ring\[1\].token0 != ring\[0\].token0" ||
  { echo "table_reuse is not on"; exit 1; }
printf 'name: r64t\npattern: block_diagonal\nblock_size: 64\nhead_dim: 64\ndtype: bf16\nrotary:\n  layout: interleaved\n  apply_to: [q, k]\n  positions: table\npasses: [forward, backward]\n' > /tmp/r64t.yaml
build/attngen emit /tmp/r64t.yaml | grep -q "last_token0" || { echo "table_reuse is not on"; exit 1; }
echo "=== timed: the tree's choices, then table_reuse on $(date +%T)"
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
