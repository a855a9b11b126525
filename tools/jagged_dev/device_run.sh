#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# device_run.sh BIN [tests] [bench] [san]: run on the GPU machine what
# build_all.sh built into BIN; logs under $OUT (or /tmp). A short table last.
bin=$1; shift
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > "$out/gpu.txt" 2>&1
for what in "$@"; do
case $what in
tests)
  for t in "$bin"/t_* "$bin"/b_*; do
    case $t in *.cuh|*.ptxas) continue;; esac
    "$t" test 2>&1 | tee -a "$out/tests.log" | tail -1
  done;;
bench)
  for t in "$bin"/t_bf16_d128_none "$bin"/t_bf16_d128_causal "$bin"/t_bf16_d64_none \
           "$bin"/t_bf16_d64_causal "$bin"/b_*; do
    case $t in *.cuh|*.ptxas) continue;; esac
    for L in 1024 4096; do "$t" bench $L 2>&1 | tee -a "$out/bench.log" | grep -v '^$' | tail -1; done
  done;;
san)
  s=/usr/local/cuda/bin/compute-sanitizer
  for t in ${SAN_BINS:-"$bin"/t_bf16_d128_cw128}; do
    timeout ${SAN_TIMEOUT:-100} $s --tool memcheck --error-exitcode 9 "$t" quick > "$out/memcheck_$(basename $t).log" 2>&1
    echo "memcheck $(basename $t) rc $? : $(grep -E 'ERROR SUMMARY|cases failed' "$out/memcheck_$(basename $t).log" | tr '\n' ' ')"
    timeout ${SAN_TIMEOUT:-100} $s --tool racecheck --error-exitcode 9 "$t" quick > "$out/racecheck_$(basename $t).log" 2>&1
    echo "racecheck $(basename $t) rc $? : $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|cases failed' "$out/racecheck_$(basename $t).log" | tr '\n' ' ')"
  done;;
esac
done
cat "$out/gpu.txt"
