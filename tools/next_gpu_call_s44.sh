#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s44.sh: session 44's device call (carry [".devdeps"]); its
# log also into $OUT (no pipe on the command line).
#   bqrope (about 6 minutes): .bq_sm90_rotary, the broadcast backward with
#     rotary embeddings for 64 < n_q <= 128 on the wgmma kernel
#     (broadcast_bwd_sm90.cu: each copying thread rotates the pieces of Q
#     and of each K, V tile it copied, the key warpgroup dK, dV back;
#     written in session 44, never run). q0 the tree, q1 the choice on. A
#     first float64 run of q1 under a short limit (a hang or a failure ends
#     the call there, with a memcheck of it); float64 of q1 (forward and
#     backward) at n_q 65, 100, 128 on broadcast specs from tables
#     (interleaved at head dims 128 and 64, half at 64), computed
#     positions (interleaved 128; half 64 on q alone), causal on k and v
#     (fp16), lengths [0, 1300] (empty sequences) and [1, 300] (length 1);
#     memcheck and racecheck of q1 on three; then forward + backward ms of
#     q0 and q1 (and q2: q1 with a loop tile rotated in the tile its copy
#     started in, kRotateLag 0), batch 1152, 4 heads, two rounds (and of a spec without
#     rotary, the same kernels in both: what rotary costs); last
#     bench/broadcast_rotary.py on q1's library.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
exec > >(tee "$out/next_gpu_call_s44-${1:-}.log") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
R=/tmp/rq
mkdir -p $R
# spec NAME DIM LAYOUT APPLY POSITIONS [CAUSAL DTYPE]
spec() {
  printf 'name: %s\npattern: jagged\nquery: broadcast\ncausal: %s\nhead_dim: %s\ndtype: %s\narch: sm_90a\nrotary:\n  layout: %s\n  apply_to: %s\n  positions: %s\npasses: [forward, backward]\n' \
    $1 ${6:-false} $2 ${7:-bf16} $3 "$4" $5 > $R/$1.yaml
}
# check V SPEC BATCH LO HI NQ: float64 of one run, forward and backward, one line
check() {
  echo "$1 $2 $3 [$4, $5] n_q $6: $(timeout 60 $R/$1/attngen run $R/$2.yaml --batch $3 --seqlen $5 --min-seqlen $4 --n-q $6 --iters 0 2>&1 | grep -E 'check:' | sed 's/.*rel error/rel error/' | tr '\n' ' ')"
}
# times SPEC LO HI NQ [VARIANTS]: forward + backward ms of q0 and q1 (or
# VARIANTS), two rounds
times() {
  local line="$1 [$2, $3] n_q $4:" r v
  for r in 1 2; do for v in ${5:-q0 q1}; do
    line="$line $v=$(timeout 90 $R/$v/attngen run $R/$1.yaml --batch 1152 --heads 4 --seqlen $3 --min-seqlen $2 --n-q $4 --iters 20 2>&1 |
      awk '/check:/ {c = c $NF "/"} /^ *time:/ {f = $2} /backward time:/ {for (i = 1; i < NF; i++) if ($i == "time:") b = $(i + 1)}
           END {print f "+" b (c ~ /^(PASS\/)*$/ ? "" : "(" c ")")}')"
  done; done
  echo "$line"
}
case "${1:-}" in
  bqrope)
    spec bq128 128 interleaved "[q, k]" table
    spec bq64 64 interleaved "[q, k]" table
    spec bq64half 64 half "[q, k]" table
    spec bq128s 128 interleaved "[q, k]" sequence
    spec bqkv 128 interleaved "[k, v]" table true fp16
    spec bq64q 64 half "[q]" sequence
    printf 'name: bqplain\npattern: jagged\nquery: broadcast\nhead_dim: 128\ndtype: bf16\narch: sm_90a\npasses: [forward, backward]\n' > $R/bqplain.yaml
    source tools/fwd_ab.sh
    plan_save
    lib_as q0
    plan_edit 's/^    \.bq_sm90_rotary = false,/    .bq_sm90_rotary = true,/' '^    \.bq_sm90_rotary = true,'
    lib_as q1
    # q2: q1 with each loop tile rotated in the tile its copy started in
    # (kRotateLag 0), the template put back after
    T=templates/broadcast_bwd_sm90.cu
    cp $T /tmp/bbs90.cu.orig
    trap 'cp /tmp/plan_jagged.c.orig $P; cp /tmp/bbs90.cu.orig $T; rm -f build/generator/plan_jagged.o' EXIT
    sed -i 's/^constexpr int kRotateLag = kStages >= 3 ? 1 : 0;/constexpr int kRotateLag = 0;/' $T
    grep -q '^constexpr int kRotateLag = 0;' $T || { echo "kRotateLag not found in $T"; exit 1; }
    plan_edit 's/^    \.bq_sm90_rotary = false,/    .bq_sm90_rotary = true,/' '^    \.bq_sm90_rotary = true,'
    lib_as q2
    cp /tmp/bbs90.cu.orig $T
    ( for v in q0 q1 q2; do for sp in bq128 bq64 bq64half bq128s bqkv bq64q bqplain; do
        $R/$v/attngen compile $R/$sp.yaml -o $R/$v/$sp.cubin > /dev/null 2>&1 & done; done; wait )
    echo "=== first run $(date +%T)"
    first=$(timeout 40 $R/q1/attngen run $R/bq128.yaml --batch 13 --seqlen 1300 --min-seqlen 0 \
            --n-q 128 --iters 0 2>&1 | grep -E 'check:' | tr '\n' ' ')
    echo "q1 bq128 n_q 128: $first"
    if ! echo "$first" | grep -q 'backward check:.*PASS'; then
      echo "memcheck: $(timeout 90 compute-sanitizer --tool memcheck $R/q1/attngen run $R/bq128.yaml --batch 3 --seqlen 300 --min-seqlen 0 --n-q 100 --iters 0 2>&1 | grep -E 'ERROR SUMMARY|Invalid|check:' | head -5 | tr '\n' ' ')"
      exit 1
    fi
    echo "=== float64 $(date +%T)"
    for nq in 65 100 128; do
      for sp in bq128 bq64 bq64half; do check q1 $sp 13 0 1300 $nq; done
    done
    for sp in bq128 bq64half bq128s bqkv bq64q; do check q1 $sp 7 1 300 128; done
    check q1 bq128s 13 0 1300 100
    check q1 bqkv 13 0 1300 100
    check q1 bq64q 13 0 1300 77
    check q2 bq128 13 0 1300 128
    check q2 bq64half 13 0 1300 100
    echo "=== sanitizers $(date +%T)"
    for a in "memcheck bq128 5 0 700 100" "racecheck bq64half 3 0 500 128" "memcheck bqkv 5 1 700 128" "racecheck bq128 3 0 500 65"; do
      set -- $a
      echo "$a: $(timeout 120 compute-sanitizer --tool $1 $R/q1/attngen run $R/$2.yaml --batch $3 --seqlen $5 --min-seqlen $4 --n-q $6 --iters 0 2>&1 | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' | sed 's/.*rel error/rel error/' | tr '\n' ' ')"
    done
    echo "=== forward + backward ms, batch 1152, 4 heads $(date +%T)"
    times bq128 0 1024 128 "q0 q1 q2"
    times bq64 0 1024 128 "q0 q1 q2"
    times bq64half 0 1024 128
    times bq128s 0 1024 100
    times bq128 2048 4096 128
    times bqplain 0 1024 128  # no rotary: the same kernels in q0 and q1, the cost of rotary
    echo "=== broadcast_rotary.py on q1 $(date +%T)"
    ATTNGEN_LIB=$R/q1/libattngen.so PYTHONPATH=bindings/python${PYTHONPATH:+:$PYTHONPATH} \
      timeout 150 python3 bench/broadcast_rotary.py --out "$out/broadcast_rotary-q1.md"
    ;;
  *)
    echo "usage: $0 bqrope" >&2
    exit 2
    ;;
esac
echo "=== done $(date +%T)"
