#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# fwd_ab.sh: sourced by the device scripts that time plan variants side
# by side (next_gpu_call_s34.sh, _s35.sh, _s36.sh, _s39.sh,
# next_gpu_call_fwd_items.sh).
#   fwd_specs: forward-only specs in /tmp/fi: j{128,64}{false,true} (jagged,
#     bf16, causal or not), b{128,64} (broadcast queries), jw64 (causal,
#     window [256, 0], fp16), jw128 (window [100, 60]); and bb{128,64}{false,
#     true}, broadcast with both passes.
#   fwd_times "VARIANTS" "TIMED": for each shape SPEC:LO:HI[:NQ] of TIMED,
#     the forward alone (batch 1152, 4 heads, lengths uniform in [LO, HI],
#     n_q NQ for broadcast specs; median of 20 CUDA-event timings, float64-
#     checked) by /tmp/fi/V/attngen for each V of VARIANTS in turn, $ROUNDS
#     rounds (default 1); one line a shape, "(FAIL)" after a failed check.
#   plan_save, plan_edit, build_as, lib_as, timed, float64, memcheck (moved here
#     from next_gpu_call_s36.sh in session 39), racecheck, compile_variants
#     (each says what it does): a plan choice's variants built side by
#     side, compiled and checked; they write logs to $out.

fwd_specs() {
  mkdir -p /tmp/fi
  for d in 128 64; do
    for c in false true; do
      printf 'name: jf%s%s\npattern: jagged\ncausal: %s\nhead_dim: %s\ndtype: bf16\narch: sm_90a\npasses: [forward]\n' \
        $d ${c:0:1} $c $d > /tmp/fi/j$d$c.yaml
      printf 'name: bb%s%s\npattern: jagged\nquery: broadcast\ncausal: %s\nhead_dim: %s\ndtype: bf16\narch: sm_90a\npasses: [forward, backward]\n' \
        $d ${c:0:1} $c $d > /tmp/fi/bb$d$c.yaml
    done
    printf 'name: bf%s\npattern: jagged\nquery: broadcast\nhead_dim: %s\ndtype: bf16\narch: sm_90a\npasses: [forward]\n' \
      $d $d > /tmp/fi/b$d.yaml
  done
  printf 'name: jw64\npattern: jagged\ncausal: true\nwindow: [256, 0]\nhead_dim: 64\ndtype: fp16\narch: sm_90a\npasses: [forward]\n' > /tmp/fi/jw64.yaml
  printf 'name: jw128\npattern: jagged\nwindow: [100, 60]\nhead_dim: 128\ndtype: bf16\narch: sm_90a\npasses: [forward]\n' > /tmp/fi/jw128.yaml
}

fwd_times() {
  local variants=$1 t s lo hi nqv nq line round v ms
  for t in $2; do
    IFS=: read s lo hi nqv <<< "$t"
    nq=""; [ -n "$nqv" ] && nq="--n-q $nqv"
    line="$s [$lo,$hi] $nq:"
    for round in $(seq ${ROUNDS:-1}); do
      for v in $variants; do
        ms=$(timeout 60 /tmp/fi/$v/attngen run /tmp/fi/$s.yaml --batch 1152 --heads 4 --seqlen $hi --min-seqlen $lo $nq --iters 20 2>&1 |
             awk '/check:/ {c=$NF} /  time:/ {t=$2} END {print t (c == "PASS" ? "" : "(" c ")")}')
        line="$line $v=$ms"
      done
    done
    echo "$line"
  done
}

# The variants: generator/plan_jagged.c edited, built, the CLI kept as
# /tmp/fi/V/attngen, the source put back (and back at exit too).
P=generator/plan_jagged.c
plan_save() {
  cp $P /tmp/plan_jagged.c.orig
  trap 'cp /tmp/plan_jagged.c.orig $P; rm -f build/generator/plan_jagged.o' EXIT
}
# plan_edit SED LINE: one edit (sed -E) that must leave LINE (grep -E) in it
plan_edit() {
  sed -i -E "$1" $P
  grep -qE "$2" $P || { echo "not found in $P after the edit: $2"; exit 1; }
}
# build_as V: the edited plan built as variant V, then the source restored
build_as() {
  rm -f build/generator/plan_jagged.o  # a warm machine may hold a newer one
  make -j16 build/attngen > "$out/build-$1.log" 2>&1 || { tail -20 "$out/build-$1.log"; exit 1; }
  mkdir -p /tmp/fi/$1 && cp build/attngen /tmp/fi/$1/
  cp /tmp/plan_jagged.c.orig $P
}
# lib_as V: the edited plan's CLI and library built as $R/V (R set by the
# caller), then the source restored
lib_as() {
  rm -f build/generator/plan_jagged.o
  make -j16 build/attngen build/libattngen.so > "$out/build-$1.log" 2>&1 || { tail -20 "$out/build-$1.log"; exit 1; }
  mkdir -p $R/$1 && cp build/attngen build/libattngen.so $R/$1/
  cp /tmp/plan_jagged.c.orig $P
}
# timed SPEC BATCH LO HI NQ(or -) "VARIANTS" PATTERN: one line, the time
# after "time:" on the output line PATTERN matches (the forward's "^  time:",
# the backward's "backward time:"), ms, of each variant in turn, two rounds;
# "(FAIL)" after a run whose float64 check failed
timed() {
  local nq=""; [ "$5" != - ] && nq="--n-q $5"
  local line="$1 batch $2 [$3, $4] $nq:" r v ms
  for r in 1 2; do for v in $6; do
    ms=$(timeout 90 /tmp/fi/$v/attngen run /tmp/fi/$1.yaml --batch $2 --heads 4 --seqlen $4 --min-seqlen $3 $nq --iters 20 2>&1 |
         awk -v pat="$7" '/check:/ {c=$NF} $0 ~ pat {for (i = 1; i < NF; i++) if ($i == "time:") t = $(i + 1)}
              END {print t (c == "PASS" ? "" : "(" c ")")}')
    line="$line $v=$ms"
  done; done
  echo "$line"
}
# float64 V SPEC BATCH HI LO [NQ]: variant V's float64 check of one run
# of /tmp/fi/SPEC.yaml, lengths in [LO, HI] (keys for a broadcast spec,
# n_q NQ), on one line
float64() {
  local nq=""; [ -n "${6:-}" ] && nq="--n-q $6"
  echo "$1 float64 $2 $3 [$5, $4] $nq: $(timeout 60 /tmp/fi/$1/attngen run /tmp/fi/$2.yaml --batch $3 --seqlen $4 --min-seqlen $5 $nq --iters 0 2>&1 | grep -E 'check:' | sed 's/.*rel error/rel error/' | tr '\n' ' ')"
}
# memcheck V SPEC BATCH HI LO [NQ]: the same run under compute-sanitizer's
# memcheck, its error summary and check on one line; racecheck: the same
# under racecheck (120 s)
sanitized() {
  local tool=$1 limit=$2; shift 2
  local nq=""; [ -n "${6:-}" ] && nq="--n-q $6"
  echo "$tool $1 $2 $3 [$5, $4] $nq: $(timeout $limit compute-sanitizer --tool $tool /tmp/fi/$1/attngen run /tmp/fi/$2.yaml --batch $3 --seqlen $4 --min-seqlen $5 $nq --iters 0 2>&1 | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' | sed 's/.*rel error/rel error/' | tr '\n' ' ')"
}
memcheck() { sanitized memcheck 90 "$@"; }
racecheck() { sanitized racecheck 120 "$@"; }
# compile_variants "VARIANTS" "SPECS": every variant's CLI compiles every
# /tmp/fi spec at once, filling the kernel cache the timed runs then hit;
# one line if any compile failed. In a subshell, so that its wait counts
# only these compiles (not a tee the caller's output may go through).
compile_variants() {
  ( pids=()
    for v in $1; do
      for sp in $2; do
        /tmp/fi/$v/attngen compile /tmp/fi/$sp.yaml -o /tmp/fi/$v/$sp.cubin &
        pids+=($!)
      done
    done
    rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc ) ||
    echo "a compile failed (the runs below say which)"
  echo "=== compiled $(date +%T)"
}
