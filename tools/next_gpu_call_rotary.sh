#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_rotary.sh: the block-diagonal rotary layouts session 22
# wrote while no device was lent (issue 19: fused rotary costs 25-40% over
# attention alone, where reading the table twice adds about 5% to the
# bytes). Two device calls of about 8 minutes each (one would pass the
# 600 s limit):
#   run ../shared/device/prepare here first; device: carry [".devdeps"],
#   commands: bash tools/next_gpu_call_rotary.sh check   (step 1)
#             bash tools/next_gpu_call_rotary.sh time    (steps 2 and 3)
# Run on 2026-12-05 (session 23; bench/results/2026-12-05-h200-rotary-choices.md):
# fwd_table_slot and bwd_rotary_12_warps are now on in the tree, bwd_table_global
# off (slower), bwd_late_dq off until tools/next_gpu_call_block.sh checks it;
# "off" below means the tree's choices. The four plan choices of
# generator/plan_block.c:
#   fwd_table_slot       head_dim 128, 64-token blocks, table positions: the
#                        forward's table rows in one slot (112 KiB, two CTAs
#                        an SM) instead of one a stage (128 KiB, one CTA);
#   bwd_rotary_12_warps  head_dim 64, blocks up to 64 tokens: the rotary
#                        backward capped at 170 registers (three CTAs an SM)
#                        instead of 255 (two);
#   bwd_table_global     head_dim 128, 64-token blocks, table positions,
#                        interleaved pairs on q and k (other layouts spill or
#                        serialize wgmma at 168 registers): the backward
#                        reads the table's rows where they are (64 KiB,
#                        three CTAs of 168 registers, 32 bytes of spills)
#                        instead of 16 KiB of them in its
#                        stage (80 KiB, two CTAs of 255).
#   bwd_late_dq          head_dim 128, Q rotated: dQ rotated back and stored
#                        after P and dS are, which ends the serialized wgmma
#                        (ptxas C7511) of the shipped interleaved backward.
# tools/rotary_choice_time.py times the forward and the backward apart, so
# r128t's forward shows fwd_table_slot; its backward is timed three ways:
# the tree's, with bwd_late_dq alone, and with all four choices.
# 1. Correct with all four on: the GPU suite's rotary case (every rotary spec
#    of the suite against float64), then compute-sanitizer memcheck and
#    racecheck over `attngen run` of the changed specs.
# 2. Timed off, late (bwd_late_dq alone) and on, tools/rotary_choice_time.py
#    (CUDA events, data made on the GPU: `attngen run` fills 3 GB inputs on
#    the host, which took the whole 600 s call on 2026-12-05) at batch 1152,
#    4 heads, lengths uniform in [0.4 L, L], L 1024 and 4096: the rotary
#    specs the choices change and the same pattern without rotary.
# 3. With all four on and `time bench`, the issue's headline: bench.py
#    --quick --rotary (the fused pipeline against the fair unfused one).
# Keep a choice if it is correct and faster: set its field of plan_block.c's
# block_checked to true, update tests/check_rotary.c's plan_values (its
# head_dim 128 forward figures: 114688 bytes, two CTAs, with
# fwd_table_slot; its comparison of the rotary backward's plan with the
# plain one, with bwd_late_dq), regenerate the
# goldens (cd tests && AG_UPDATE_GOLDENS=1 AG_SUITES=emit
# ../build/check_attngen: fwd_table_slot changes rope_table_b64_d128_bf16
# and rope_half_table_b64_d128_bf16_causal, bwd_rotary_12_warps
# rope_half_sequence_d64_fp16_bwd, bwd_late_dq the head_dim 128 rotary
# backwards; bwd_table_global takes only interleaved pairs on q and k,
# which no golden has), run make test (with the first three on it passed
# on the CPU on 2026-12-05 but for plan_values), drop the known C7511 of
# tests/check_nvrtc.c once bwd_late_dq is on, and record the figures in
# bench/.
# Logs to $OUT (at most 8 files come back).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
mkdir -p "$out"
specs=/tmp/rotary_specs
mkdir -p "$specs"
spec() { # name dim positions [dtype]
  { echo "name: $1"; echo "pattern: block_diagonal"; echo "block_size: 64"
    echo "head_dim: $2"; echo "dtype: ${4:-bf16}"
    if [ "$3" != none ]; then
      echo "rotary:"; echo "  layout: interleaved"; echo "  apply_to: [q, k]"
      echo "  positions: $3"; [ "$3" = table ] || echo "  base: 10000.0"
    fi
    echo "passes: [forward, backward]"; } > "$specs/$1.yaml"
}
spec r128t 128 table; spec r64t 64 table; spec r64s 64 sequence; spec r128s 128 sequence
sed 's/interleaved/half/' "$specs/r128t.yaml" | sed 's/name: r128t/name: r128h/' > "$specs/r128h.yaml"
spec p128 128 none; spec p64 64 none
part=${1:-}
case $part in check|time) ;; *) echo "usage: $0 check|time [bench]"; exit 2 ;; esac
source tools/block_choices.sh
block_choices_keep
flags() { # off (the tree's) | late (bwd_late_dq too) | all (the four)
  case $1 in
    off) block_choices ;;
    late) block_choices bwd_late_dq ;;
    all) block_choices bwd_late_dq fwd_table_slot bwd_rotary_12_warps bwd_table_global ;;
  esac
}
if [ "$part" = time ]; then
  for f in off late; do
    flags $f || exit 1
    make -j16 build/attngen build/libattngen.so >> "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
    cp build/attngen /tmp/attngen_$f
    cp -L build/libattngen.so /tmp/lib_$f.so
  done
  # the off binary must plan the tree's layouts
  /tmp/attngen_off emit "$specs/r128t.yaml" | grep -q "dq_acc" && { echo "off build is not off"; exit 1; }
  /tmp/attngen_late emit "$specs/r128t.yaml" | grep -q "dq_acc" || { echo "late build is not late"; exit 1; }
fi
flags all || exit 1
make -j16 all build/check_attngen >> "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "=== plans with the choices on $(date +%T)"
for s in r128t r128h r64t r64s; do echo "$s:"; build/attngen emit "$specs/$s.yaml" | grep -E "^ \*  .*(shared memory|capped|resident)"; done
if [ "$part" = check ]; then
  echo "=== gpu-rotary (choices on) $(date +%T)"
  OUT=$out timeout 240 tools/gpu_session.sh gpu-rotary
  echo "=== sanitizers (choices on) $(date +%T)"
  S=/usr/local/cuda/bin/compute-sanitizer
  for s in r128t r128h r64t r64s; do
    for tool in memcheck racecheck; do
      log=/tmp/san-$s-$tool.log  # failures appended to one file (8 files come back)
      timeout 60 $S --tool $tool --error-exitcode 9 build/attngen run "$specs/$s.yaml" --batch 5 \
        --seqlen 300 --min-seqlen 0 --iters 0 > "$log" 2>&1
      rc=$?
      echo "$s $tool rc $rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log")"
      [ $rc -eq 0 ] || cat "$log" >> "$out/san-failed.log"
    done
  done
  exit 0
fi
cp -L build/libattngen.so /tmp/lib_all.so
echo "=== compile, three builds at once $(date +%T)"
for f in off late all; do
  ATTNGEN_LIB=/tmp/lib_$f.so timeout 300 python3 tools/rotary_choice_time.py $f --compile-only &
done
wait
echo "=== timed: off, late, all $(date +%T)"
for f in off late all; do
  ATTNGEN_LIB=/tmp/lib_$f.so timeout 150 python3 tools/rotary_choice_time.py $f 2>&1 | tee -a "$out/timed.log"
done
[ "${2:-}" = bench ] || exit 0
echo "=== bench.py --quick --rotary (choices on) $(date +%T)"
export PYTHONPATH=bindings/python:$PYTHONPATH
timeout 200 python3 bench/bench.py --quick --rotary --skip flex --budget 180 --no-plot \
  --out "$out/rotary" 2>&1 | tail -12
