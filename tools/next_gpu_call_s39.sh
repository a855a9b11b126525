#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s39.sh: session 39's device calls (carry [".devdeps"]).
#   Both modes time first and check after (session 40: starts were scarce,
#   so a call cut short still brings back the timings; the GPU suite had
#   already passed on bqsmall's plan).
#   bqsmall (8 minutes on session 40's H100, which ran it: 3-39% slower,
#   left off; bench/results/2026-12-07-h100-bqsmall-s40.log): .bq_sm90_small, the
#     broadcast backward for n_q <= 64 on the 128-row wgmma kernel (its
#     second query warpgroup computing on rows of zeros) instead of the 32-
#     and 64-row mma.sync kernels: s0 the tree, s1 the choice on; float64
#     of s1 at n_q 1, 16, 32, 33, 64 (both head dims, causal at 32 and 20),
#     memcheck and racecheck at n_q 32 (with SUITE=1 the GPU suite's
#     broadcast case on s1's plan), after the backward alone, s0 against s1,
#     two rounds (batch 1152, 4 heads, keys [0, 1024] and [512, 1024] at
#     n_q 32, head dim 128 at n_q 16 and 64 and causal; batch 264, keys
#     4096). Run it with `bash tools/next_gpu_call_s39.sh bqsmall`, no pipe.
#   bqfwdsmall (about 6-8 minutes: bqsmall took 8): .bq_fwd_ws_small, the
#     broadcast forward for n_q <= 64 on the warp-specialized kernel
#     instead of the 32-row mma.sync tiles: f0 the tree, f1 the choice
#     on; float64 of f1 at n_q
#     1, 16, 32, 64 (both head dims; causal at 32 and 20), memcheck and
#     racecheck at n_q 32, after the forward alone, f0 against f1, two
#     rounds (batch 1152, 4 heads, n_q 32, keys [0, 1024], 1024 and 4096;
#     head dim 64 at n_q 16 and 64).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
# everything also into a file under $OUT, which comes back even when the
# call runs out of time (session 39's first bqsmall call printed nothing:
# its output went through `tail`, which a timeout killed first)
exec > >(tee "$out/next_gpu_call_s39.log") 2>&1
tee_pid=$!
nvidia-smi --query-gpu=name --format=csv,noheader
source tools/fwd_ab.sh
case "${1:-}" in
  bqsmall)
    fwd_specs
    plan_save
    build_as s0
    plan_edit 's/^    \.bq_sm90_small = false,/    .bq_sm90_small = true,/' '^    \.bq_sm90_small = true,'
    cp $P /tmp/plan_s1.c
    build_as s1
    # (one at a time the compiles took most of session 39's call)
    compile_variants "s0 s1" "bb128false bb64false bb128true bb64true"
    echo "=== backward alone, ms (4 heads) $(date +%T)"
    for d in 128 64; do
      timed bb${d}false 1152 0 1024 32 "s0 s1" "backward time:"
      timed bb${d}false 1152 512 1024 32 "s0 s1" "backward time:"
    done
    timed bb128false 1152 0 1024 16 "s0 s1" "backward time:"
    timed bb128false 1152 0 1024 64 "s0 s1" "backward time:"
    timed bb128false 264 4096 4096 32 "s0 s1" "backward time:"
    timed bb128true 1152 0 1024 32 "s0 s1" "backward time:"
    for nq in 1 16 32 33 64; do
      for d in 128 64; do float64 s1 bb${d}false 13 1300 0 $nq; done
    done
    float64 s1 bb128true 13 1300 0 32
    float64 s1 bb64true 13 1300 0 20
    memcheck s1 bb128false 9 1300 0 32
    racecheck s1 bb64false 9 1300 0 32
    # (the GPU suite's broadcast case on s1's plan passed in session 39:
    # 7 checks, n_q 1 to 200, causal, windows, grouped heads, 100,000
    # sequences; rerun with SUITE=1)
    if [ -n "${SUITE:-}" ]; then
      cp /tmp/plan_s1.c $P
      OUT=$out timeout 200 bash tools/gpu_session.sh build gpu-broadcast 2>&1 | grep -E "Checks|exit" | head -3
      cp /tmp/plan_jagged.c.orig $P
    fi
    ;;
  bqfwdsmall)
    fwd_specs
    plan_save
    build_as f0
    plan_edit 's/^    \.bq_fwd_ws_small = false,/    .bq_fwd_ws_small = true,/' '^    \.bq_fwd_ws_small = true,'
    build_as f1
    compile_variants "f0 f1" "b128 b64 bb128true bb64true"
    echo "=== forward alone, ms (4 heads) $(date +%T)"
    for d in 128 64; do
      timed b$d 1152 0 1024 32 "f0 f1" "^  time:"
      timed b$d 1152 1024 1024 32 "f0 f1" "^  time:"
      timed b$d 1152 4096 4096 32 "f0 f1" "^  time:"
    done
    timed b64 1152 0 1024 16 "f0 f1" "^  time:"
    timed b64 1152 0 1024 64 "f0 f1" "^  time:"
    for nq in 1 16 32 64; do
      for d in 128 64; do float64 f1 b$d 13 1300 0 $nq; done
    done
    float64 f1 bb128true 13 1300 0 32
    float64 f1 bb64true 13 1300 0 20
    memcheck f1 b64 9 1300 0 32
    racecheck f1 b64 9 1300 0 32
    ;;
  *) echo "usage: $0 bqsmall|bqfwdsmall"; exit 2 ;;
esac
# the log's last lines written before the call ends
exec >&- 2>&-
wait "$tee_pid"
