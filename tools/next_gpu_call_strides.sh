#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_strides.sh: the block kernels with row strides (plan_block.c's
# row_strides choice, written 2026-12-05 without a GPU), checked and timed
# in four device calls, each within the 600 s limit by its step timeouts:
#   run ../shared/device/prepare here first; device: carry [".devdeps"],
#   command: bash tools/next_gpu_call_strides.sh check   (the row_strides
#            case and its sanitizers)
#   then:    bash tools/next_gpu_call_strides.sh py      (step 3)
#   then:    bash tools/next_gpu_call_strides.sh time    (step 1)
#   then:    bash tools/next_gpu_call_strides.sh suite   (the rest of step 2)
#   or:      bash tools/next_gpu_call_strides.sh retime  (step 1's backward
#            only, the two libraries alternated RUNS times (3), the shapes
#            bench.py --shapes SHAPES names (all): the 2026-12-05 runs put
#            head_dim 128 at +2.0/+2.1%)
# 1. Timed first (bench/bench.py --quick block rows, the tree's packed
#    kernels against the strided ones with packed strides): the bar is
#    within 2% at both head dims. Then bench/layouts_bench.py with each
#    library: forward + backward of contiguous q, k, v against views of
#    one qkv, block_attention_qkvpacked and grouped heads (issue 19 asks
#    the packed case timed against the contiguous one).
# 2. With the choice on: the GPU suite's block forward, block backward and
#    rotary cases (every one then runs the strided kernels with packed
#    strides, against float64), its row_strides case (q, k, v slices of one
#    qkv buffer, o and dout with padded rows, dq, dk, dv slices of one
#    gradient buffer: bit for bit equal to packed; and grouped-query heads,
#    kv_heads = heads / 2 and / 4, bit for bit equal to a run on repeated
#    key heads), and compute-sanitizer memcheck and racecheck on that case.
# 3. The binding's views and block_attention_qkvpacked (test_gpu_views.py) with
#    each library: the packed one copies the views, the strided one reads
#    them in place and writes the packed gradient; both bit for bit equal
#    to contiguous copies and within tolerance of float64; and grouped-query
#    heads against float64 (repeated key heads, or read in place).
# If all pass and the times hold: set row_strides_checked true, regenerate
# the goldens (every block golden gains the stride parameters), and say so
# in bench/NOTES.md; the binding can then pass tensor views' strides
# (issue 19).
source .devdeps/env.sh || exit 1
part=${1:?usage: tools/next_gpu_call_strides.sh check|py|time|suite|retime}
case $part in check|py|time|suite|retime) ;; *) echo "unknown part: $part (check|py|time|suite|retime)"; exit 2 ;; esac
out=${OUT:-/tmp}
export PYTHONPATH=bindings/python:$PYTHONPATH ATTNGEN_TEST_SKIP_HUGE=1
source tools/block_choices.sh
block_choices_keep
block_choices || exit 1
make -j16 all > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
cp -L build/libattngen.so /tmp/lib_tree.so
sass() {  # the head_dim 128 training spec's machine code, for a diff
  [ "$part" = retime ] || return 0
  build/attngen compile specs/ads_block64_d128_train.yaml --arch sm_90a -o /tmp/sass_$1.cubin &&
    cuobjdump -sass /tmp/sass_$1.cubin > "$out/sass-$1.txt" 2>&1
}
sass tree
block_choices row_strides || exit 1
make -j16 all build/check_attngen >> "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
cp -L build/libattngen.so /tmp/lib_on.so
sass on
build/attngen emit specs/ads_block64_d128_train.yaml | grep -q "int q_stride" ||
  { echo "row_strides is not on"; exit 1; }
if [ "$part" = time ]; then
  echo "=== timed: packed kernels, then strided ones $(date +%T)"
  for f in tree on; do
    ATTNGEN_LIB=/tmp/lib_$f.so timeout 170 python3 bench/bench.py --quick --pass both --budget 140 \
      --peers ceilings,attngen --out "$out/bench-$f" 2>&1 | tail -12
  done
  echo "=== layouts (contiguous, views, qkvpacked, grouped), each library $(date +%T)"
  for f in tree on; do
    ATTNGEN_LIB=/tmp/lib_$f.so timeout 60 python3 bench/layouts_bench.py --seqlen 1024 \
      --json "$out/layouts-$f.json" 2>&1 | tail -8
  done
  exit 0
fi
if [ "$part" = retime ]; then
  echo "=== backward, packed kernels and strided ones alternated $(date +%T)"
  for i in $(seq "${RUNS:-3}"); do
    for f in tree on; do
      echo "--- run $i: $f"
      ATTNGEN_LIB=/tmp/lib_$f.so timeout 90 python3 bench/bench.py --quick --pass bwd --budget 70 \
        --shapes "${SHAPES:-B}" \
        --peers attngen --out "/tmp/retime-$f-$i" --no-plot 2>&1 | grep -E "^B[0-9]" | tee -a "$out/retime.log"
    done
  done
  exit 0
fi
if [ "$part" = suite ]; then
  for c in gpu-forward gpu-backward gpu-rotary; do
    OUT=$out timeout 170 tools/gpu_session.sh $c
  done
  exit 0
fi
if [ "$part" = py ]; then
  echo "=== the binding's layouts, packed library then strided $(date +%T)"
  for f in tree on; do
    ATTNGEN_LIB=/tmp/lib_$f.so timeout 200 python3 -m pytest -q -s \
      bindings/python/tests/test_gpu_views.py -k "not large_blocks" \
      > "$out/pytest-views-$f.log" 2>&1
    echo "$f rc $? $(grep -E 'takes_row_strides|takes_kv_heads|passed|failed' "$out/pytest-views-$f.log" | sort | uniq -c | tr '\n' ' ')"
  done
  exit 0
fi
OUT=$out timeout 200 tools/gpu_session.sh gpu-strides
echo "=== sanitizers on the row_strides case $(date +%T)"
for tool in memcheck racecheck; do
  (cd tests && CK_RUN_SUITE=gpu CK_RUN_CASE=row_strides timeout 120 \
    /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 9 ../build/check_attngen) \
    > "$out/san-$tool.log" 2>&1
  echo "$tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Checks' "$out/san-$tool.log" | tr '\n' ' ')"
done
