#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s43.sh: session 43's device call (carry [".devdeps"]); its
# log also into $OUT (no pipe on the command line).
#   rope (about 5 minutes): jagged_rotary.cuh's rotate_rows reading the
#     table words of 4 rows before rotating any (session 43; before, one
#     L2 round trip a row inside a CTA-wide barrier). r0 the tree's
#     template (HEAD's, which the caller writes to tools/jagged_rotary_r0.cuh
#     first: `git show HEAD:templates/jagged_rotary.cuh > tools/
#     jagged_rotary_r0.cuh`; the device's copy has no .git), r1 the working
#     tree's. Run in session 43 on an H100
#     (bench/results/2026-12-07-h100-rotary-angle-rows-s43.log). Float64 (forward and
#     backward) of r1 on broadcast table specs (head dim 128 interleaved,
#     64 interleaved and half; n_q 1, 20, 33, 130) and jagged self-attention
#     from tables (128 half, causal); memcheck of two runs; then r0 against
#     r1, forward and backward ms, batch 1152, 4 heads, keys [0, 1024]
#     (n_q 32, 128) and jagged [1, 1024]; last bench/broadcast_rotary.py on
#     r1's library (fused against the unfused route).
#   bqsm90 (about 3 minutes): .bq_fwd_sm90_rotary, the broadcast rotary
#     forward at head dim 128 for n_q > 64 on jagged_fwd_sm90.cu instead of
#     the 128-row mma.sync kernel: b0 the tree, b1 the choice on; float64
#     of b1 at n_q 65, 128, 200 (and 33: the 32-row variant beside it),
#     causal at 130, memcheck at 130; then the forward ms of b0 and b1 at
#     n_q 128, batch 1152, 4 heads, keys [0, 1024].
#   wsrope (about 7 minutes): .sm90_fwd_ws_rotary, rotary forwards on the
#     warp-specialized kernel (its loading warpgroup rotates each landed
#     tile; written in session 43, never run), w0 the tree, w1 the choice
#     on, b1 .bq_fwd_sm90_rotary on instead. A first float64 run of w1
#     under a short limit (a hang or a failure ends the call there, with a
#     memcheck of it); float64 of w1 on jagged (head dim 128 causal half
#     from tables, 64 interleaved q k v fp16 from tables, 64 causal
#     computed, 128 causal computed) and broadcast (n_q 65, 128, 200 at
#     both dims, causal computed on k), lengths with empty and length-1
#     sequences; memcheck and racecheck of w1 on two; then the forward ms
#     of w0, w1 (and b1 for the broadcast head dim 128), batch 1152, 4
#     heads, two rounds; last bench/broadcast_rotary.py on w1's library.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
exec > >(tee "$out/next_gpu_call_s43-${1:-}.log") 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
R=/tmp/rr
mkdir -p $R
rope_specs() {
  local d lay name
  for spec in "bq128:128:interleaved" "bq64:64:interleaved" "bq64half:64:half"; do
    IFS=: read -r name d lay <<< "$spec"
    printf 'name: %s\npattern: jagged\nquery: broadcast\nhead_dim: %s\ndtype: bf16\nrotary:\n  layout: %s\n  apply_to: [q, k]\n  positions: table\npasses: [forward, backward]\n' \
      $name $d $lay > $R/$name.yaml
  done
  printf 'name: jtab128\npattern: jagged\ncausal: true\nhead_dim: 128\ndtype: bf16\nrotary:\n  layout: half\n  apply_to: [q, k]\n  positions: table\npasses: [forward, backward]\n' \
    > $R/jtab128.yaml
}
# build_rope V: build/attngen and the library as variant V
build_rope() {
  make -j16 build/attngen build/libattngen.so > "$out/build-$1.log" 2>&1 || { tail -20 "$out/build-$1.log"; exit 1; }
  mkdir -p $R/$1 && cp build/attngen build/libattngen.so $R/$1/
}
# check V SPEC BATCH LO HI [NQ]: float64 of one run, forward and backward, one line
check() {
  local nq=""; [ -n "${6:-}" ] && nq="--n-q $6"
  echo "$1 $2 $3 [$4, $5] $nq: $(timeout 60 $R/$1/attngen run $R/$2.yaml --batch $3 --seqlen $5 --min-seqlen $4 $nq --iters 0 2>&1 | grep -E 'check:' | sed 's/.*rel error/rel error/' | tr '\n' ' ')"
}
# times SPEC LO HI NQ|-: forward and backward ms of r0 and r1, two rounds
times() {
  local nq=""; [ "$4" != - ] && nq="--n-q $4"
  local line="$1 [$2, $3] $nq:" r v
  for r in 1 2; do for v in r0 r1; do
    line="$line $v=$(timeout 90 $R/$v/attngen run $R/$1.yaml --batch 1152 --heads 4 --seqlen $3 --min-seqlen $2 $nq --iters 20 2>&1 |
      awk '/check:/ {c = c $NF "/"} /^ *time:/ {f = $2} /backward time:/ {for (i = 1; i < NF; i++) if ($i == "time:") b = $(i + 1)}
           END {print f "+" b (c ~ /^(PASS\/)*$/ ? "" : "(" c ")")}')"
  done; done
  echo "$line"
}
case "${1:-}" in
  rope)
    rope_specs
    T=templates/jagged_rotary.cuh
    cp $T /tmp/jagged_rotary.cuh.new
    trap 'cp /tmp/jagged_rotary.cuh.new $T' EXIT
    cp tools/jagged_rotary_r0.cuh $T || exit 1  # see the header
    build_rope r0
    cp /tmp/jagged_rotary.cuh.new $T
    build_rope r1
    ( for v in r0 r1; do for s in bq128 bq64 bq64half jtab128; do
        $R/$v/attngen compile $R/$s.yaml -o $R/$v/$s.cubin > /dev/null 2>&1 & done; done; wait )
    echo "=== float64 $(date +%T)"
    for nq in 1 20 33 130; do check r1 bq128 13 0 1300 $nq; done
    for nq in 20 130; do check r1 bq64 13 0 1300 $nq; check r1 bq64half 13 0 1300 $nq; done
    check r1 jtab128 13 0 1300
    check r1 jtab128 7 1 300
    echo "=== memcheck $(date +%T)"
    for a in "bq128 5 0 700 32" "jtab128 5 1 700"; do
      set -- $a
      nq=""; [ -n "${5:-}" ] && nq="--n-q $5"
      echo "memcheck $a: $(timeout 90 compute-sanitizer --tool memcheck $R/r1/attngen run $R/$1.yaml --batch $2 --seqlen $4 --min-seqlen $3 $nq --iters 0 2>&1 | grep -E 'ERROR SUMMARY|check:' | sed 's/.*rel error/rel error/' | tr '\n' ' ')"
    done
    echo "=== forward+backward ms, batch 1152, 4 heads $(date +%T)"
    times bq128 0 1024 32
    times bq128 0 1024 128
    times bq64 0 1024 32
    times bq64half 0 1024 128
    times jtab128 1 1024 -
    echo "=== broadcast_rotary.py on r1 $(date +%T)"
    ATTNGEN_LIB=$R/r1/libattngen.so PYTHONPATH=bindings/python${PYTHONPATH:+:$PYTHONPATH} \
      timeout 150 python3 bench/broadcast_rotary.py --out "$out/broadcast_rotary-r1.md"
    ;;
  bqsm90)
    rope_specs
    sed 's/^name: bq128/name: bq128c\ncausal: true/' $R/bq128.yaml > $R/bq128c.yaml
    source tools/fwd_ab.sh
    plan_save
    build_as b0
    plan_edit 's/^    \.bq_fwd_sm90_rotary = false,/    .bq_fwd_sm90_rotary = true,/' '^    \.bq_fwd_sm90_rotary = true,'
    build_as b1
    mkdir -p $R/b0 $R/b1 && cp /tmp/fi/b0/attngen $R/b0/ && cp /tmp/fi/b1/attngen $R/b1/
    ( for v in b0 b1; do $R/$v/attngen compile $R/bq128.yaml -o $R/$v/a.cubin > /dev/null 2>&1 & done
      $R/b1/attngen compile $R/bq128c.yaml -o $R/b1/c.cubin > /dev/null 2>&1 & wait )
    echo "=== float64 $(date +%T)"
    first=$(timeout 40 $R/b1/attngen run $R/bq128.yaml --batch 13 --seqlen 1300 --min-seqlen 0 \
            --n-q 128 --iters 0 2>&1 | grep -E 'check:' | tr '\n' ' ')
    echo "b1 bq128 n_q 128: $first"
    echo "$first" | grep -q PASS || exit 1
    for nq in 65 200 33; do check b1 bq128 13 0 1300 $nq; done
    check b1 bq128c 13 0 1300 130
    echo "memcheck b1 bq128 n_q 130: $(timeout 90 compute-sanitizer --tool memcheck $R/b1/attngen run $R/bq128.yaml --batch 5 --seqlen 700 --min-seqlen 0 --n-q 130 --iters 0 2>&1 | grep -E 'ERROR SUMMARY' | tr '\n' ' ')"
    echo "=== forward ms, n_q 128, batch 1152, 4 heads, keys [0, 1024] $(date +%T)"
    line=""
    for v in b0 b1; do
      line="$line $v=$(timeout 60 $R/$v/attngen run $R/bq128.yaml --batch 1152 --heads 4 --seqlen 1024 --min-seqlen 0 --n-q 128 --iters 20 2>&1 |
        awk '/check:/ {c = c $NF "/"} /^ *time:/ {f = $2} END {print f (c ~ /^(PASS\/)*$/ ? "" : "(" c ")")}')"
    done
    echo "$line"
    ;;
  wsrope)
    rope_specs
    printf 'name: jqkv64\npattern: jagged\nhead_dim: 64\ndtype: fp16\nrotary:\n  layout: interleaved\n  apply_to: [q, k, v]\n  positions: table\npasses: [forward]\n' > $R/jqkv64.yaml
    printf 'name: jseq64\npattern: jagged\ncausal: true\nhead_dim: 64\ndtype: bf16\nrotary:\n  layout: half\n  apply_to: [q, k]\n  positions: sequence\npasses: [forward]\n' > $R/jseq64.yaml
    cp specs/gem_jagged_d128_rope.yaml $R/jseq128.yaml
    printf 'name: bqc\npattern: jagged\nquery: broadcast\ncausal: true\nhead_dim: 128\ndtype: fp16\nrotary:\n  layout: half\n  apply_to: [k]\n  positions: sequence\npasses: [forward]\n' > $R/bqc.yaml
    source tools/fwd_ab.sh
    plan_save
    lib_as w0
    plan_edit 's/^    \.sm90_fwd_ws_rotary = false,/    .sm90_fwd_ws_rotary = true,/' '^    \.sm90_fwd_ws_rotary = true,'
    lib_as w1
    plan_edit 's/^    \.bq_fwd_sm90_rotary = false,/    .bq_fwd_sm90_rotary = true,/' '^    \.bq_fwd_sm90_rotary = true,'
    lib_as b1
    ( for v in w0 w1 b1; do for sp in bq128 bq64 bq64half jtab128 jqkv64 jseq64 jseq128 bqc; do
        $R/$v/attngen compile $R/$sp.yaml -o $R/$v/$sp.cubin > /dev/null 2>&1 & done; done; wait )
    echo "=== first run $(date +%T)"
    first=$(timeout 40 $R/w1/attngen run $R/jtab128.yaml --batch 13 --seqlen 1300 --min-seqlen 0 \
            --iters 0 2>&1 | grep -E 'check:' | tr '\n' ' ')
    echo "w1 jtab128: $first"
    if ! echo "$first" | grep -q PASS; then
      echo "memcheck: $(timeout 90 compute-sanitizer --tool memcheck $R/w1/attngen run $R/jtab128.yaml --batch 3 --seqlen 300 --min-seqlen 0 --iters 0 2>&1 | grep -E 'ERROR SUMMARY|Invalid|check:' | head -5 | tr '\n' ' ')"
      exit 1
    fi
    echo "=== float64 $(date +%T)"
    for sp in jqkv64 jseq64 jseq128; do check w1 $sp 13 0 1300; check w1 $sp 7 1 300; done
    check w1 jtab128 7 1 300
    for nq in 65 128 200; do check w1 bq128 13 0 1300 $nq; check w1 bq64half 13 0 1300 $nq; done
    check w1 bq64 13 0 1300 130
    check w1 bqc 13 0 1300 130
    check b1 bq128 13 0 1300 130
    echo "=== sanitizers $(date +%T)"
    for a in "memcheck jtab128 5 0 700" "racecheck jqkv64 5 0 700" "memcheck bq64half 5 0 700 130" "racecheck bq128 3 0 500 130"; do
      set -- $a
      nq=""; [ -n "${6:-}" ] && nq="--n-q $6"
      echo "$a: $(timeout 120 compute-sanitizer --tool $1 $R/w1/attngen run $R/$2.yaml --batch $3 --seqlen $5 --min-seqlen $4 $nq --iters 0 2>&1 | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' | sed 's/.*rel error/rel error/' | tr '\n' ' ')"
    done
    echo "=== forward ms, batch 1152, 4 heads $(date +%T)"
    fwd() {  # SPEC LO HI NQ|- "VARIANTS"
      local nq=""; [ "$4" != - ] && nq="--n-q $4"
      local line="$1 [$2, $3] $nq:" r v
      for r in 1 2; do for v in $5; do
        line="$line $v=$(timeout 60 $R/$v/attngen run $R/$1.yaml --batch 1152 --heads 4 --seqlen $3 --min-seqlen $2 $nq --iters 20 2>&1 |
          awk '/check:/ {c = c $NF "/"} /^ *time:/ {f = $2} END {print f (c ~ /^(PASS\/)*$/ ? "" : "(" c ")")}')"
      done; done
      echo "$line"
    }
    fwd bq128 0 1024 128 "w0 w1 b1"
    fwd bq64half 0 1024 128 "w0 w1"
    fwd jtab128 1 1024 - "w0 w1"
    fwd jseq128 1 4096 - "w0 w1"
    fwd jseq64 1 1024 - "w0 w1"
    echo "=== broadcast_rotary.py on w1 $(date +%T)"
    ATTNGEN_LIB=$R/w1/libattngen.so PYTHONPATH=bindings/python${PYTHONPATH:+:$PYTHONPATH} \
      timeout 150 python3 bench/broadcast_rotary.py --out "$out/broadcast_rotary-w1.md"
    ;;
  *)
    echo "usage: $0 rope | bqsm90 | wsrope" >&2
    exit 2
    ;;
esac
echo "=== done $(date +%T)"
