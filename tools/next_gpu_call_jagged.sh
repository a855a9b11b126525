#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_jagged.sh: the jagged backward's calls (issue 17).
#   device: carry [".devdeps"], command: bash tools/next_gpu_call_jagged.sh [MODE]
#   (fa4: a first call carries [".devdeps", ".fa4/a"] and begins with
#   `bash .fa4/a/stash.sh;`, the fa4 call, at once, carries [".devdeps", ".fa4/b"])
# (default, about 5 minutes) the product's GPU suite (jagged case) and
#    sanitize-jagged (memcheck, racecheck) on f81c8fa's two changes, which
#    ran only in the dev harness: the loader's KeyTile handed over in shared
#    memory (jagged_bwd_ws.cu) and head dim 64's route past a mean of 96.
#    Then, on an H200 with the FA4 stash (first call: carry [".devdeps",
#    ".fa4/a"], `bash .fa4/a/stash.sh; bash tools/next_gpu_call_jagged.sh`),
#    mode fa4 at once: the table of bench/RESULTS-jagged.md on the H200.
# (Session 29's mode kt, head dim 64's routes at L 64-256 and ws-kt
#    against the template in three rounds, is in git at 67c9df6; ws-kt is
#    the template since f81c8fa.)
# route (session 29's first call, about 5 minutes): head dim 64 with a mask, the product's two routes
#    side by side in the dev harness: jagged_bwd_sm90.cu on 64 keys, three
#    CTAs an SM ("sm90 ... blk64", the short route, now with the
#    column-range mask) against the warp-specialized kernel on 128-row
#    steps ("ws-tma ... blk128", the long route): causal at L 256, 512,
#    768, 1024, and with the windows at L 1024 and 4096, to place
#    plan_jagged.c's long_min_rows (96 since, with L 64-256 added);
#    the two new window rows checked against float64 first.
#    Then the product's GPU suite (jagged case): the new mask in
#    jagged_bwd_sm90.cu and the new threshold.
# fa4 (on the same warm machine, about 1 minute) bench/jagged_bench.py,
#    the product beside FA2 and FA4 on the 8 shapes of
#    bench/RESULTS-jagged.md. ("product" alone: the GPU suite's jagged case.)
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${1:-}" = fa4 ]; then
  source .fa4/b/env.sh || exit 1
  make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  PYTHONPATH=bindings/python:$PYTHONPATH timeout 560 python3 bench/jagged_bench.py --out "$out/jb" 2>&1 |
    grep -E "^\| B1152|^wrote|failed|Error" | head -24
  exit
fi
if [ "${1:-}" = product ]; then
  OUT=$out bash tools/gpu_session.sh build gpu-jagged 2>&1 | tail -5
  exit
fi
if [ "${1:-}" = route ]; then
  BWD_ONLY='^(sm90 (bf16 d64 causal (win\[128,0\] )?blk64|f16 d64 full win\[64,32\] blk64)|ws-tma (bf16 d64 causal (win\[128,0\] )?|f16 d64 full win\[64,32\] )blk128)' \
    B=/tmp/jb sh tools/jagged_dev/bwd_build.sh > "$out/harness-build.log" 2>&1 ||
    { tail -20 "$out/harness-build.log"; exit 1; }
  H=/tmp/jb/bwd_test
  echo "=== check $(date +%T)"
  timeout 90 $H checksm90 40 "ws-tma bf16 d64 causal win[128,0] blk128" "ws-tma f16 d64 full win[64,32] blk128" \
    "sm90 bf16 d64 causal win[128,0] blk64" "sm90 bf16 d64 causal blk64" > "$out/route-check.log" 2>&1
  echo "check rc $?"; grep -v "^ok" "$out/route-check.log" | tail -4
  echo "=== d64 causal route $(date +%T)"
  BWD_LENGTHS="256 512 768 1024" timeout 150 $H time 41 "sm90 bf16 d64 causal blk64" \
    "ws-tma bf16 d64 causal blk128" 2>&1 | grep "^time" | tee "$out/d64-route.log" | sed 's/ *tokens [0-9]* *//'
  echo "=== d64 window route $(date +%T)"
  BWD_LENGTHS="1024 4096" timeout 150 $H time 42 "sm90 bf16 d64 causal win[128,0] blk64" \
    "ws-tma bf16 d64 causal win[128,0] blk128" "sm90 f16 d64 full win[64,32] blk64" \
    "ws-tma f16 d64 full win[64,32] blk128" 2>&1 | grep "^time" | tee "$out/d64-window-route.log" |
    sed 's/ *tokens [0-9]* *//'
  echo "=== product $(date +%T)"
  OUT=$out bash tools/gpu_session.sh build gpu-jagged 2>&1 | tail -5
  exit
fi
if [ -z "${1:-}" ]; then
  OUT=$out bash tools/gpu_session.sh build gpu-jagged 2>&1 | tail -5
  SANITIZE_ONLY=jagged OUT=$out timeout 300 bash tools/gpu_session.sh sanitize-jagged 2>&1 | tail -30
  exit
fi
