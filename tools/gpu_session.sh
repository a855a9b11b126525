#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# gpu_session.sh: what one call on the GPU machine runs, in order: build,
# the full test suite (GPU tests included), the demo, the plan-tuning table,
# and compute-sanitizer over small runs. Logs go to $OUT (or build/gpu).
# Usage: tools/gpu_session.sh [build] [test] [demo] [tune] [sanitize] [sanitize-tests]
#                             [gpu-forward] [gpu-backward] [gpu-rotary] [gpu-rotary-chunked]
#                             [gpu-strides]
#                             [tune-bwd] [gpu-jagged] [gpu-jagged-huge] [gpu-broadcast]
#                             [sanitize-jagged]
#   sanitize-tests: the GPU suite (but its tests past 2^31 elements) under
#   compute-sanitizer memcheck and racecheck; minutes.
#   gpu-forward, gpu-backward, gpu-rotary, gpu-rotary-chunked: one test case
#   of the GPU suite (the last: rotary in the backward walked in chunks);
#   gpu-strides: its row_strides case (the kernels of `row_strides: true`
#   specs against float64, strided runs against packed ones bit for bit,
#   grouped heads against repeated ones).
#   gpu-jagged: the jagged suite's GPU case (every jagged variant against
#   float64, the backward five times bit for bit; 155 s on a fresh H200 on
#   2026-12-04, and once over 200 s: give it 300); gpu-jagged-huge: its
#   forward and backward past 2^31 elements per tensor; sanitize-jagged: the
#   jagged specs of specs/ under memcheck and racecheck.
#   The GPU suite runs in parts that each fit one device call: gpu-forward,
#   gpu-backward, gpu-rotary, gpu-rotary-chunked, gpu-jagged (with
#   ATTNGEN_TEST_SKIP_HUGE=1 for the ones past 2^31 elements).
#   tune, tune-bwd: the plan-tuning table of the forward, of the backward
#   (TUNE_ARGS: more arguments, e.g. "--dim 64 1024").
set -u
out=${OUT:-build/gpu}
mkdir -p "$out"
steps=${*:-build test demo tune sanitize}
rc=0
for step in $steps; do
  echo "=== $step ($(date +%T))"
  case $step in
    build) make -j16 all build/check_attngen build/tune_block >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; } ;;
    test) make test 2>&1 | tee "$out/test.log" | grep -vE "^gpu (bf16|fp16)" ; [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
          grep -E "^gpu " "$out/test.log" | sort -k6 -g | tail -5 ;;
    demo) make demo 2>&1 | tee "$out/demo.log" | tail -20 ; [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    tune) build/tune_block ${TUNE_ARGS:-1024 4096} 2>&1 | tee "$out/tune.log" ;;
    tune-bwd) build/tune_block --bwd ${TUNE_ARGS:-1024 4096} 2>&1 | tee "$out/tune-bwd.log" ;;
    gpu-forward|gpu-backward|gpu-rotary|gpu-rotary-chunked|gpu-strides)
      case=${step#gpu-}
      case $case in rotary) ;; rotary-chunked) case=rotary_chunked ;; strides) case=row_strides ;;
        *) case=block_$case ;; esac
      (cd tests && CK_RUN_SUITE=gpu CK_RUN_CASE=$case ../build/check_attngen) >"$out/$step.log" 2>&1
      r=$?; echo "$step: exit $r; $(grep -E '^[0-9]+%: Checks' "$out/$step.log")"
      grep -E "huge|SKIP|Failure|Error" "$out/$step.log" | head -20
      grep -E "^gpu " "$out/$step.log" | awk '{for(i=1;i<=NF;i++) if($i ~ /^[0-9.]+e-0[0-9]$/) print $i}' | sort -g | tail -1 | sed 's/^/  largest error printed: /'
      [ $r -eq 0 ] || rc=1 ;;
    gpu-jagged|gpu-broadcast|gpu-jagged-huge)
      suite=${step#gpu-}; suite=${suite%-huge}
      case=${suite}_gpu; [ "$step" = gpu-jagged-huge ] && case=jagged_huge
      (cd tests && CK_RUN_SUITE=$suite CK_RUN_CASE=$case ../build/check_attngen) >"$out/$step.log" 2>&1
      r=$?; echo "$step: exit $r; $(grep -E '^[0-9]+%: Checks' "$out/$step.log")"
      grep -E "SKIP|Failure|Error|NOT REPEATABLE|^gpu jagged huge" "$out/$step.log" | head -20
      [ $r -eq 0 ] || rc=1 ;;
    sanitize-jagged)
      # the jagged specs (rotary from the sequence, and from tables on Q, K
      # and V in the backward alone); the broadcast spec with n_q 32, 64,
      # 100, 200: the 32-row forward
      # (one and two tiles) with the 64-row one-pass backward, the 128-row
      # ones, the split backward. SANITIZE_ONLY=broadcast: those alone;
      # SANITIZE_ONLY=jagged: the others alone.
      # Runs of mean length about 800 (the last two fields: longest and
      # shortest sequence) reach the main, warp-specialized forward; the
      # others (0..300) the short variants. The sm90 train and bwd goldens
      # (no mask) reach the warp-specialized backward; the head-dim-64
      # masked one (jagged_d64_bf16_sm90_bwd) jagged_bwd_sm90.cu at mean
      # 800 and the long warp-specialized variant at mean 1900; the
      # head-dim-128 causal one (jagged_d128_fp16_sm90_causal_bwd) the
      # warp-specialized backward with 64x128 dK, dV products. The window
      # spec at mean 1900 reaches the warp-specialized forward at head dim
      # 64 with a causal mask; head dim 64 causal without a window at mean
      # 3072 its 192-row long variant (.sm90_fwd_long192_causal); the
      # head-dim-64 broadcast forward at n_q 128 and 130 its several query
      # tiles a CTA (.bq_fwd_items, the last CTA's items cut short).
      printf 'name: j64c\npattern: jagged\ncausal: true\nhead_dim: 64\ndtype: bf16\narch: sm_90a\npasses: [forward]\n' \
        > "$out/j64_causal.yaml"
      for run in "$out/j64_causal.yaml 0 4096 2048" \
                 "../tests/golden/broadcast_d64_bf16_sm90_fwd.yaml 128 1300 0" \
                 "../tests/golden/broadcast_d64_bf16_sm90_fwd.yaml 130 1300 0" \
                 "gem_jagged_d128_causal.yaml 0" "jagged_window_d64_fp16.yaml 0" \
                 "jagged_window_d64_fp16.yaml 0 2600 1200" \
                 "../tests/golden/jagged_d128_fp16_sm90_causal_bwd.yaml 0 1300 300" \
                 "gem_jagged_d128_causal.yaml 0 1300 300" \
                 "../tests/golden/jagged_d64_bf16_sm90_fwd.yaml 0 1300 300" \
                 "../tests/golden/jagged_d128_bf16_sm90_train.yaml 0" \
                 "../tests/golden/jagged_d128_bf16_sm90_train.yaml 0 1300 300" \
                 "../tests/golden/jagged_d64_fp16_sm90_bwd.yaml 0 1300 300" \
                 "../tests/golden/jagged_d64_bf16_sm90_bwd.yaml 0 1300 300" \
                 "../tests/golden/jagged_d64_bf16_sm90_bwd.yaml 0 2600 1200" \
                 "gem_jagged_d128_rope.yaml 0" "../tests/golden/jagged_d64_fp16_rope_table_qkv_bwd.yaml 0" \
                 "pma_broadcast_d128.yaml 32" "pma_broadcast_d128.yaml 64" "pma_broadcast_d128.yaml 100" \
                 "pma_broadcast_d128.yaml 200"; do
        set -- $run
        [ "${SANITIZE_ONLY:-}" = broadcast ] && [ "$2" = 0 ] && continue
        [ "${SANITIZE_ONLY:-}" = jagged ] && [ "$2" != 0 ] && continue
        spec=specs/$1; [ -f "$spec" ] || spec=$1  # specs/'s, or a path ($out's)
        for tool in memcheck racecheck; do
          log="$out/sanitize-$tool-$(basename "$spec" .yaml)-$2-${3:-300}.log"
          compute-sanitizer --tool $tool --error-exitcode 9 build/attngen run "$spec" --batch 6 \
            --seqlen ${3:-300} --min-seqlen ${4:-0} --n-q $2 --iters 0 >"$log" 2>&1
          r=$?; echo "$tool $spec n_q $2 lengths ${4:-0}..${3:-300}: exit $r; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' "$log" | tr '\n' ' ')"
          [ $r -eq 0 ] || rc=1
        done
      done ;;
    sanitize)
      for spec in specs/*.yaml; do
        for tool in memcheck racecheck; do
          compute-sanitizer --tool $tool --error-exitcode 9 build/attngen run "$spec" --batch 6 \
            --seqlen 200 --min-seqlen 0 --iters 0 >"$out/sanitize-$tool-$(basename "$spec" .yaml).log" 2>&1
          r=$?; echo "$tool $spec: exit $r; $(grep -E 'ERROR SUMMARY|check:' "$out/sanitize-$tool-$(basename "$spec" .yaml).log" | tr '\n' ' ')"
          [ $r -eq 0 ] || rc=1
        done
      done ;;
    sanitize-tests)
      # memcheck and racecheck side by side (two processes on the one GPU:
      # nothing here is timed), each over the whole suite but its runs past
      # 2^31 elements.
      for tool in memcheck racecheck; do
        (cd tests && ATTNGEN_TEST_SKIP_HUGE=1 CK_RUN_SUITE=gpu compute-sanitizer --tool $tool \
          --target-processes all --error-exitcode 9 ../build/check_attngen) \
          >"$out/sanitize-tests-$tool.log" 2>&1 &
      done
      for tool in memcheck racecheck; do
        wait -n; r=$?
        [ $r -eq 0 ] || rc=1
      done
      for tool in memcheck racecheck; do
        echo "$tool gpu suite: $(grep -E '^[0-9]+%: Checks|ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-tests-$tool.log" | sort | uniq -c | tr '\n' ' ')"
      done ;;
  esac
done
exit $rc
