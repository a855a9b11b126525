#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_broadcast.sh: the one-pass broadcast backward's 32-row
# variant (n_q <= 32) with more K, V stages, checked and timed in one
# device call (about 4 minutes):
#   device: carry [".devdeps"], command: bash tools/next_gpu_call_broadcast.sh
# Builds the library, the CLI and the GPU suite for three settings of
# generator/plan_jagged.c's bq_m32_* (warps, stages at head_dim 64 / 128):
#   tree: the plan's (8, 2 / 4, 2: two CTAs an SM at both head dims)
#   s3:   8, 3 / 8, 3 (head_dim 128 then one CTA an SM of 8 warps)
#   s4:   8, 4 / 8, 4
# 1. bench/broadcast_bench.py at n_q 32 (FA2 beside, for scale) with each
#    library: backward times, bit-identical deterministic rows.
# 2. s3 and s4: the GPU suite's broadcast case (n_q 1, 16, 32 among others
#    against float64, bit-identical repeats) and memcheck and racecheck
#    through the CLI at n_q 32 and 7, both head dims.
# Keep a setting that is correct and faster: set bq_m32_* in plan_jagged.c,
# regenerate the goldens, restate bench/RESULTS-broadcast.md.
# History: session 27 (2026-12-05, an H100) ran the warp counts with two
# stages (bench/results/2026-12-05-h100-broadcast-m32.log, the CLI's
# float64 checks at batch 1152 took 7 of its 9 minutes: this version times
# through the benchmark instead).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
P=generator/plan_jagged.c
cp $P /tmp/plan_jagged.c.orig
set_choice() {  # warps64 stages64 warps128 stages128
  sed -i -e "s/bq_m32_warps_d64 = [0-9]*, bq_m32_warps_d128 = [0-9]*;/bq_m32_warps_d64 = $1, bq_m32_warps_d128 = $3;/" \
    -e "s/bq_m32_stages_d64 = [0-9]*, bq_m32_stages_d128 = [0-9]*;/bq_m32_stages_d64 = $2, bq_m32_stages_d128 = $4;/" $P
}
build() {  # name
  make -j16 all build/check_attngen >> "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  mkdir -p /tmp/b_$1 && cp -L build/libattngen.so build/attngen build/check_attngen /tmp/b_$1/
}
for c in "s3 8 3 8 3" "s4 8 4 8 4" "tree"; do
  set -- $c
  if [ $1 = tree ]; then cp /tmp/plan_jagged.c.orig $P; else set_choice $2 $3 $4 $5; fi
  build $1
  grep -q "bq_m32_stages_d64" $P || { echo "plan_jagged.c has no bq_m32 choices"; exit 1; }
done
cp /tmp/plan_jagged.c.orig $P
echo "=== timed: broadcast_bench n_q 32, s 0.5 $(date +%T)"
for b in tree s3 s4 tree; do
  echo "--- $b"
  ATTNGEN_LIB=/tmp/b_$b/libattngen.so PYTHONPATH=bindings/python:$PYTHONPATH timeout 100 \
    python3 bench/broadcast_bench.py --nq 32 --spread 0.5 --peers fa2 --budget 80 \
    --out /tmp/bb-$b > /dev/null 2>&1
  grep -A12 "^## Summary" /tmp/bb-$b/broadcast_bench.md | grep "^| B1152" | cut -d'|' -f2,6,7,8,12
done | tee "$out/timed.log"
sed 's/head_dim: 128/head_dim: 64/; s/name: pma_broadcast/name: pma_broadcast64/' \
  specs/pma_broadcast_d128.yaml > /tmp/pma64.yaml
for b in s3 s4; do
  echo "=== $b: gpu-broadcast $(date +%T)"
  (cd tests && CK_RUN_SUITE=broadcast CK_RUN_CASE=broadcast_gpu timeout 150 /tmp/b_$b/check_attngen) \
    > "$out/gpu-broadcast-$b.log" 2>&1
  echo "rc $? $(grep -E '^[0-9]+%: Checks' "$out/gpu-broadcast-$b.log")"
  grep -E "Failure|Error|NOT REPEATABLE" "$out/gpu-broadcast-$b.log" | head -5
  for s in specs/pma_broadcast_d128.yaml /tmp/pma64.yaml; do
    for nq in 32 7; do
      for tool in memcheck racecheck; do
        timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 9 \
          /tmp/b_$b/attngen run $s --batch 9 --seqlen 300 --min-seqlen 0 --n-q $nq --iters 0 \
          > /tmp/san.log 2>&1
        echo "$b $(basename $s .yaml) n_q $nq $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|backward check' /tmp/san.log | tr '\n' ' ')"
      done
    done
  done
done | tee "$out/checks.log"
