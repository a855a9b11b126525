#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_bq_fwd.sh: the plan choice .sm90_bq_fwd_deep
# (generator/plan_jagged.c: the broadcast warp-specialized forward at head
# dim 64 with six K, V stages instead of three), written in session 32 and
# run once on an H100 (correct; within +-2.4% of three stages: bench/results/
# 2026-12-06-h100-broadcast-fwd-deep-s32.md), not yet on the H200. One
# device call of 5 to 8 minutes; carry [".devdeps"],
# command `bash tools/next_gpu_call_bq_fwd.sh`:
#   1. the tree's library (the choice off) built and kept;
#   2. the choice turned on in the working copy, built: the GPU suite's
#      broadcast case, then memcheck and racecheck through the CLI at head
#      dim 64, n_q 100, keys in [300, 1300] (the 128-row forward);
#   3. broadcast_bench.py at head dim 64, n_q 128 (FA2 beside), each
#      library in its own process, two rounds in turn.
# plan_jagged.c is restored at the end. If the deep build is correct and
# faster, set the choice true, regenerate the goldens and record the run
# in bench/RESULTS-broadcast.md.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
P=generator/plan_jagged.c
nvidia-smi --query-gpu=name --format=csv,noheader
cp $P /tmp/plan_jagged.c.orig
# the object goes each time: a carried copy's time stamp can make make keep
# an object built from the other setting
trap 'cp /tmp/plan_jagged.c.orig $P; rm -f build/generator/plan_jagged.o' EXIT
rm -f build/generator/plan_jagged.o
make -j16 all > "$out/build-base.log" 2>&1 || { tail -20 "$out/build-base.log"; exit 1; }
mkdir -p /tmp/b_base && cp -L build/libattngen.so /tmp/b_base/
sed -i 's/    \.sm90_bq_fwd_deep = false,/    .sm90_bq_fwd_deep = true,/' $P
grep -q '\.sm90_bq_fwd_deep = true,' $P || { echo "the choice was not found in $P"; exit 1; }
rm -f build/generator/plan_jagged.o
OUT=$out timeout 200 bash tools/gpu_session.sh build gpu-broadcast 2>&1 | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "the deep build or its gpu-broadcast case failed"; exit 1; }
mkdir -p /tmp/b_deep && cp -L build/libattngen.so /tmp/b_deep/
sed 's/head_dim: 128/head_dim: 64/; s/name: pma_broadcast/name: pma_broadcast64/' \
  specs/pma_broadcast_d128.yaml > /tmp/pma64.yaml
for t in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $t --error-exitcode 9 build/attngen run /tmp/pma64.yaml \
    --batch 6 --seqlen 1300 --min-seqlen 300 --n-q 100 --iters 0 > "$out/sanitize-$t.log" 2>&1
  echo "$t: exit $?; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' "$out/sanitize-$t.log" | tr '\n' ' ')"
done
for r in 1 2; do
  for v in base deep; do
    echo "=== $v round $r $(date +%T)"
    ATTNGEN_LIB=/tmp/b_$v/libattngen.so PYTHONPATH=bindings/python:$PYTHONPATH timeout 70 \
      python3 bench/broadcast_bench.py --dims 64 --nq 128 --peers fa2 --budget 50 \
      --out "$out/bq-$v-$r" 2>&1 | grep -E "^\| B1152|failed|Error" | cut -d'|' -f2-5
  done
done
