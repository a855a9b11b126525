#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_strides.sh: the block kernels of specs with `row_strides:
# true` (each tensor's row stride and kv_heads as parameters), checked and
# timed in device calls that each fit the 600 s limit:
#   run ../shared/device/prepare here first; device: carry [".devdeps"],
#   command: bash tools/next_gpu_call_strides.sh check   (the GPU suite's
#            row_strides case: the `_rs` kernels against float64, strided
#            runs bit for bit against packed ones, grouped heads bit for
#            bit against repeated ones; memcheck and racecheck on it)
#   then:    bash tools/next_gpu_call_strides.sh py      (the binding's
#            views, qkvpacked and grouped heads, test_gpu_views.py; the
#            torch.library ops, test_gpu_torch_ops.py, grouped heads under
#            torch.compile on the `_rs` kernels)
#   then:    bash tools/next_gpu_call_strides.sh time    (layouts_bench.py:
#            contiguous q, k, v on the packed kernels against views, one
#            packed qkv and grouped heads on the `_rs` ones)
# History: written as a plan choice (plan_block.c's row_strides_checked,
# session 24), checked on the H200 with the choice on (session 25,
# bench/results/2026-12-05-h200-gpu-strides.log, -row-strides-*), re-timed
# in session 26 (-row-strides-retime.log: the backward at head_dim 128
# +2.0-2.1% on packed tensors over four runs), and so made the spec's to
# ask (`row_strides: true`) instead of every spec's cost.
source .devdeps/env.sh || exit 1
part=${1:?usage: tools/next_gpu_call_strides.sh check|py|time}
case $part in check|py|time) ;; *) echo "unknown part: $part (check|py|time)"; exit 2 ;; esac
out=${OUT:-/tmp}
export PYTHONPATH=bindings/python:$PYTHONPATH ATTNGEN_TEST_SKIP_HUGE=1
make -j16 all build/check_attngen > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
if [ "$part" = time ]; then
  echo "=== layouts (contiguous, views, qkvpacked, grouped) $(date +%T)"
  for d in 128 64; do
    timeout 100 python3 bench/layouts_bench.py --dim $d --seqlen 1024 \
      --json "$out/layouts-d$d.json" 2>&1 | tail -4
  done
  exit 0
fi
if [ "$part" = py ]; then
  echo "=== the binding's layouts $(date +%T)"
  timeout 300 python3 -m pytest -q -s bindings/python/tests/test_gpu_views.py \
    -k "not large_blocks" > "$out/pytest-views.log" 2>&1
  echo "rc $? $(grep -E 'passed|failed' "$out/pytest-views.log" | tail -1)"
  timeout 200 python3 -m pytest -q bindings/python/tests/test_gpu_torch_ops.py \
    > "$out/pytest-torch-ops.log" 2>&1
  echo "torch ops rc $? $(grep -E 'passed|failed' "$out/pytest-torch-ops.log" | tail -1)"
  exit 0
fi
OUT=$out timeout 240 tools/gpu_session.sh gpu-strides
echo "=== sanitizers on the row_strides case $(date +%T)"
for tool in memcheck racecheck; do
  (cd tests && CK_RUN_SUITE=gpu CK_RUN_CASE=row_strides timeout 150 \
    /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 9 ../build/check_attngen) \
    > "$out/san-$tool.log" 2>&1
  echo "$tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Checks' "$out/san-$tool.log" | tr '\n' ' ')"
done
