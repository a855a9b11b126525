#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_broadcast.sh: the one-pass broadcast backward's 32-row
# variant (generator/plan_jagged.c's fused_m32_warps_d128 and _d64, set
# alike here: 0 = none, n_q <= 32 on the 64-row kernel; 4 or 8 warps
# splitting each row group's keys) timed by the CLI against the 64-row
# kernel, then checked with 4 warps:
# the GPU suite's broadcast case (n_q 1, 16, 32 among others, float64,
# bit-identical repeats) and compute-sanitizer memcheck and racecheck.
#   device: carry [".devdeps", ".devrun"], command: bash tools/next_gpu_call_broadcast.sh [bench]
# (bench: then bench/broadcast_bench.py at n_q 32 beside FA2 and cuDNN)
# Ran on an H100 on 2026-12-05 (session 27, 535 s: the CLI's float64 checks
# at batch 1152 take most of it; bench/results/2026-12-05-h100-broadcast-m32.log).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
P=generator/plan_jagged.c
cp $P /tmp/plan_jagged.c.orig
for w in 0 8 4; do
  sed -i "s/fused_m32_warps_d128 = [0-9]*, fused_m32_warps_d64 = [0-9]*;/fused_m32_warps_d128 = $w, fused_m32_warps_d64 = $w;/" $P
  make -j16 all build/check_attngen >> "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  cp build/attngen /tmp/attngen_w$w
done
cp /tmp/plan_jagged.c.orig $P
sed 's/head_dim: 128/head_dim: 64/; s/name: pma_broadcast/name: pma_broadcast64/' \
  specs/pma_broadcast_d128.yaml > /tmp/pma64.yaml
echo "=== timed (H4, batch 1152, keys uniform in [0, L]) $(date +%T)"
for L in 1024 4096; do
  for s in specs/pma_broadcast_d128.yaml /tmp/pma64.yaml; do
    for nq in 32 16; do
      [ $L = 4096 ] && [ $nq = 16 ] && continue
      for w in 0 4 8; do
        r=$(timeout 100 /tmp/attngen_w$w run $s --batch 1152 --heads 4 --seqlen $L --min-seqlen 0 \
          --n-q $nq --iters 20 2>&1)
        echo "$(basename $s .yaml) L$L n_q $nq w$w: $(echo "$r" | grep -oE 'backward time: [0-9.]+ ms' ) \
$(echo "$r" | grep -oE 'backward check: rel error dq [0-9.e-]+' ) $(echo "$r" | grep -c PASS) pass"
      done
    done
  done
done | tee "$out/timed.log"
# The 64- and 128-row kernels changed in source (the key split's constants,
# 1 there): the tree's against the commit before (.devrun/attngen_old, if
# carried: the CLI built at 652bebb).
for s in specs/pma_broadcast_d128.yaml /tmp/pma64.yaml; do
  for nq in 64 128; do
    for b in .devrun/attngen_old /tmp/attngen_w4; do
      [ -x $b ] || continue
      r=$(timeout 100 $b run $s --batch 1152 --heads 4 --seqlen 1024 --min-seqlen 0 --n-q $nq \
        --iters 20 2>&1)
      echo "$(basename $s .yaml) L1024 n_q $nq $b: $(echo "$r" | grep -oE 'backward time: [0-9.]+ ms' )"
    done
  done
done | tee -a "$out/timed.log"
echo "=== gpu-broadcast (4 warps) $(date +%T)"
OUT=$out timeout 200 tools/gpu_session.sh gpu-broadcast
echo "=== sanitizers (4 warps) $(date +%T)"
S=/usr/local/cuda/bin/compute-sanitizer
for s in specs/pma_broadcast_d128.yaml /tmp/pma64.yaml; do
  for nq in 32 7; do
    for tool in memcheck racecheck; do
      timeout 60 $S --tool $tool --error-exitcode 9 /tmp/attngen_w4 run $s --batch 9 --seqlen 300 \
        --min-seqlen 0 --n-q $nq --iters 0 > /tmp/san.log 2>&1
      echo "$s n_q $nq $tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check' /tmp/san.log | tr '\n' ' ')"
    done
  done
done | tee "$out/sanitizers.log"
[ "${1:-}" = bench ] || exit 0
echo "=== broadcast_bench n_q 32, FA2 and cuDNN beside (4 warps) $(date +%T)"
make -j16 build/libattngen.so >> "$out/build.log" 2>&1
PYTHONPATH=bindings/python:$PYTHONPATH timeout 260 python3 bench/broadcast_bench.py --nq 32 \
  --peers fa2,cudnn --budget 220 --out "$out/bb" 2>&1 | tail -14
