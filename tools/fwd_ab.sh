#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# fwd_ab.sh: sourced by the device scripts that time forward variants side
# by side (next_gpu_call_s34.sh, next_gpu_call_s35.sh,
# next_gpu_call_fwd_items.sh).
#   fwd_specs: forward-only specs in /tmp/fi: j{128,64}{false,true} (jagged,
#     bf16, causal or not), b{128,64} (broadcast queries), jw64 (causal,
#     window [256, 0], fp16), jw128 (window [100, 60]).
#   fwd_times "VARIANTS" "TIMED": for each shape SPEC:LO:HI[:NQ] of TIMED,
#     the forward alone (batch 1152, 4 heads, lengths uniform in [LO, HI],
#     n_q NQ for broadcast specs; median of 20 CUDA-event timings, float64-
#     checked) by /tmp/fi/V/attngen for each V of VARIANTS in turn, $ROUNDS
#     rounds (default 1); one line a shape, "(FAIL)" after a failed check.

fwd_specs() {
  mkdir -p /tmp/fi
  for d in 128 64; do
    for c in false true; do
      printf 'name: jf%s%s\npattern: jagged\ncausal: %s\nhead_dim: %s\ndtype: bf16\narch: sm_90a\npasses: [forward]\n' \
        $d ${c:0:1} $c $d > /tmp/fi/j$d$c.yaml
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
