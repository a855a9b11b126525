#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s42.sh: session 42's device call (carry [".devdeps"]); its
# log also into $OUT (no pipe on the command line).
#   keys (about 8 minutes): .bq_sm90_keys, the broadcast backward for n_q
#     <= 64 on the key-stationary wgmma kernel (templates/
#     broadcast_bwd_keys.cu, written in session 42, never run before):
#     k0 the tree (choice off: the 32- and 64-row mma.sync kernels), k1
#     the choice on. Checks first, as the kernel is new: one float64 run
#     under a short limit (a hang ends the call's checks there), then
#     float64 at n_q 1, 16, 32, 33, 64 at both head dims, causal at 32
#     and 20, memcheck and racecheck at n_q 32 and 64; then the backward
#     alone, k0 against k1, two rounds (batch 1152, 4 heads, keys [0,
#     1024] and [512, 1024] at n_q 32, head dim 128 at n_q 16 and 64 and
#     causal; batch 264 of 4096 keys at n_q 32); with SUITE=1 the GPU
#     suite's broadcast case on k1's plan last.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
exec > >(tee "$out/next_gpu_call_s42-${1:-}.log") 2>&1
tee_pid=$!
nvidia-smi --query-gpu=name --format=csv,noheader
source tools/fwd_ab.sh
case "${1:-}" in
  keys)
    fwd_specs
    plan_save
    build_as k0
    plan_edit 's/^    \.bq_sm90_keys = false,/    .bq_sm90_keys = true,/' '^    \.bq_sm90_keys = true,'
    cp $P /tmp/plan_k1.c
    build_as k1
    compile_variants "k0 k1" "bb128false bb64false bb128true bb64true"
    echo "=== first run $(date +%T)"
    first=$(timeout 40 /tmp/fi/k1/attngen run /tmp/fi/bb128false.yaml --batch 13 --seqlen 1300 \
            --min-seqlen 0 --n-q 32 --iters 0 2>&1 | grep -E 'check:' | tr '\n' ' ')
    echo "k1 bb128false n_q 32: rc ${PIPESTATUS[0]} $first"
    if ! echo "$first" | grep -q PASS; then
      echo "=== the first run did not pass: memcheck of it, then stop"
      memcheck k1 bb128false 3 300 0 32
      exit 1
    fi
    echo "=== float64 $(date +%T)"
    for nq in 1 16 32 33 64; do
      for d in 128 64; do float64 k1 bb${d}false 13 1300 0 $nq; done
    done
    float64 k1 bb128true 13 1300 0 32
    float64 k1 bb64true 13 1300 0 20
    float64 k1 bb128false 1152 1024 0 32
    echo "=== sanitizers $(date +%T)"
    memcheck k1 bb128false 9 1300 0 32
    memcheck k1 bb64true 9 1300 0 64
    racecheck k1 bb64false 9 1300 0 32
    racecheck k1 bb128true 5 700 0 64
    echo "=== backward alone, ms (4 heads) $(date +%T)"
    for d in 128 64; do
      timed bb${d}false 1152 0 1024 32 "k0 k1" "backward time:"
      timed bb${d}false 1152 512 1024 32 "k0 k1" "backward time:"
    done
    timed bb128false 1152 0 1024 16 "k0 k1" "backward time:"
    timed bb128false 1152 0 1024 64 "k0 k1" "backward time:"
    timed bb128false 264 4096 4096 32 "k0 k1" "backward time:"
    timed bb64false 264 4096 4096 32 "k0 k1" "backward time:"
    timed bb128true 1152 0 1024 32 "k0 k1" "backward time:"
    if [ -n "${SUITE:-}" ]; then
      cp /tmp/plan_k1.c $P
      OUT=$out timeout 200 bash tools/gpu_session.sh build gpu-broadcast 2>&1 | grep -E "Checks|exit" | head -3
      cp /tmp/plan_jagged.c.orig $P
    fi
    ;;
  quick)
    # keys cut to about 6 minutes (session 42's budget after a machine was
    # taken back mid-call): float64 at n_q 1, 32, 33, 64 (head dim 128),
    # 16 and 64 (64), causal at 20; memcheck at n_q 32; the backward alone,
    # k0 against k1, at n_q 32 (keys [0, 1024], both head dims; 264 of
    # 4096 keys at head dim 128)
    fwd_specs
    plan_save
    build_as k0
    plan_edit 's/^    \.bq_sm90_keys = false,/    .bq_sm90_keys = true,/' '^    \.bq_sm90_keys = true,'
    build_as k1
    compile_variants "k0 k1" "bb128false bb64false bb128true"
    first=$(timeout 40 /tmp/fi/k1/attngen run /tmp/fi/bb128false.yaml --batch 13 --seqlen 1300 \
            --min-seqlen 0 --n-q 32 --iters 0 2>&1 | grep -E 'check:' | tr '\n' ' ')
    echo "k1 bb128false n_q 32: $first"
    if ! echo "$first" | grep -q PASS; then
      memcheck k1 bb128false 3 300 0 32
      exit 1
    fi
    for nq in 1 33 64; do float64 k1 bb128false 13 1300 0 $nq; done
    for nq in 16 64; do float64 k1 bb64false 13 1300 0 $nq; done
    float64 k1 bb128true 13 1300 0 20
    timed bb128false 1152 0 1024 32 "k0 k1" "backward time:"
    timed bb64false 1152 0 1024 32 "k0 k1" "backward time:"
    timed bb128false 264 4096 4096 32 "k0 k1" "backward time:"
    memcheck k1 bb128false 5 700 0 32
    ;;
  mini)
    # quick cut to about 4 minutes (466 s of device time left): head dim
    # 128 float64 at n_q 1, 32, 64 and 64's at 16; the backward alone at
    # n_q 32 beside the tree; memcheck at n_q 32
    fwd_specs
    plan_save
    build_as k0
    plan_edit 's/^    \.bq_sm90_keys = false,/    .bq_sm90_keys = true,/' '^    \.bq_sm90_keys = true,'
    build_as k1
    ( /tmp/fi/k0/attngen compile /tmp/fi/bb128false.yaml -o /tmp/fi/k0/a.cubin &
      /tmp/fi/k1/attngen compile /tmp/fi/bb128false.yaml -o /tmp/fi/k1/a.cubin &
      /tmp/fi/k1/attngen compile /tmp/fi/bb64false.yaml -o /tmp/fi/k1/b.cubin & wait )
    echo "=== compiled $(date +%T)"
    first=$(timeout 40 /tmp/fi/k1/attngen run /tmp/fi/bb128false.yaml --batch 13 --seqlen 1300 \
            --min-seqlen 0 --n-q 32 --iters 0 2>&1 | grep -E 'check:' | tr '\n' ' ')
    echo "k1 bb128false n_q 32: $first"
    if ! echo "$first" | grep -q PASS; then
      memcheck k1 bb128false 3 300 0 32
      exit 1
    fi
    timed bb128false 1152 0 1024 32 "k0 k1" "backward time:"
    for nq in 1 64; do float64 k1 bb128false 13 1300 0 $nq; done
    float64 k1 bb64false 13 1300 0 16
    timed bb128false 264 4096 4096 32 "k0 k1" "backward time:"
    memcheck k1 bb128false 5 700 0 32
    ;;
  micro)
    # the last 286 s: the choice on alone (no tree build beside it), one
    # float64 run at n_q 32 and one at 64, then the backward timed at n_q
    # 32 against session 40's figure for the tree on an H100 (1.195 ms)
    fwd_specs
    plan_save
    plan_edit 's/^    \.bq_sm90_keys = false,/    .bq_sm90_keys = true,/' '^    \.bq_sm90_keys = true,'
    build_as k1
    echo "=== built $(date +%T)"
    float64 k1 bb128false 13 1300 0 32
    timed bb128false 1152 0 1024 32 "k1" "backward time:"
    float64 k1 bb128false 13 1300 0 64
    ;;
  *)
    echo "usage: $0 keys | quick | mini | micro" >&2
    exit 2
    ;;
esac
echo "=== done $(date +%T)"
