#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_jagged.sh: what session 28 (2026-12-06, two calls on an
# H100, eight failed starts) left for the jagged backward (issue 17), in one
# call of about 8 minutes (under the 10-minute limit):
#   device: carry [".devdeps"], command: bash tools/next_gpu_call_jagged.sh
#   then, in a second call: bash tools/next_gpu_call_jagged.sh product
# 1. The dev harness (built here: ws-tma is the template, with stmatrix and
#    the column-range mask since 6afc2f8):
#    - "ws-kt" (the loader's KeyTile handed over in shared memory,
#      bwd_patches.py's "kt") against float64, memcheck,
#      racecheck, then timed beside ws-tma;
#    - "ws-poly4", "ws-poly2" (a quarter or half of P's exp2 as a
#      polynomial on the FMA pipe, bwd_patches.py's "poly";
#      relative error 5.6e-5 on [-126, 0.5] by a CPU emulation of the same
#      float steps) against float64, then timed beside ws-tma;
#    - "sm90q" (jagged_bwd_sm90.cu with the same column-range mask,
#      bwd_patches.py's "sm90q"; the product's short head-dim-64
#      masked route and its rotary specs) against float64, timed beside sm90;
#    - head dim 64 causal: the warp-specialized kernel (ws-tma, m128)
#      beside jagged_bwd_sm90.cu's (sm90, 64 keys, three CTAs an SM, the
#      product's short route) at L 1024, 1536, 2048: the product's
#      threshold (plan_jagged.c, long_min_rows) was set before the new
#      mask; move it to the crossover.
# 2. ("product", a second call of about 2 minutes) the product with the
#    column-range mask (6afc2f8): the GPU suite's jagged cases.
# 3. ("fa4", on an H200: the first call also carries .fa4/a and begins with
#    `bash .fa4/a/stash.sh;`, this one carries [".devdeps", ".fa4/b"] at
#    once after it) bench/jagged_bench.py, the product beside FA2 and FA4
#    on the 8 shapes of bench/RESULTS-jagged.md (session 21's command), to
#    restate that table; then, with time left, tools/jagged_dev/ncu_bwd_pair.sh.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${1:-}" = fa4 ]; then
  source .fa4/b/env.sh || exit 1
  make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  PYTHONPATH=bindings/python timeout 560 python3 bench/jagged_bench.py --out "$out/jb" 2>&1 |
    grep -E "^\| B1152|^wrote|failed|Error" | head -24
  exit
fi
if [ "${1:-}" = product ]; then
  OUT=$out bash tools/gpu_session.sh build gpu-jagged 2>&1 | tail -5
  exit
fi
BWD_ONLY='^(ws-(tma|kt|poly[24]) |sm90q |sm90 bf16 (d64 causal blk64|d128 causal blk128))' B=/tmp/jb sh tools/jagged_dev/bwd_build.sh \
  > "$out/harness-build.log" 2>&1 || { tail -20 "$out/harness-build.log"; exit 1; }
H=/tmp/jb/bwd_test
K=("ws-kt bf16 d128 full blk128" "ws-kt bf16 d128 causal blk128" "ws-kt bf16 d64 full blk128"
   "ws-kt bf16 d64 causal blk128" "ws-kt bf16 d128 full win[100,0] blk128"
   "ws-kt f16 d64 full win[64,32] blk128")
echo "=== ws-kt check $(date +%T)"
timeout 90 $H checksm90 30 "${K[@]}" > "$out/kt-check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/kt-check.log" | tail -4
for tool in memcheck racecheck; do
  timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 9 $H small 5 \
    "ws-kt bf16 d128 causal blk128" "ws-kt bf16 d64 full blk128" > /tmp/san.log 2>&1
  echo "$tool rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|checks:' /tmp/san.log | tr '\n' ' ')"
done
echo "=== ws-kt time $(date +%T)"
for v in "d128 full" "d128 causal" "d64 full" "d64 causal"; do
  timeout 60 $H time 11 "ws-tma bf16 $v blk128" "ws-kt bf16 $v blk128" 2>&1 | grep "^time"
done | tee "$out/kt-time.log" | sed 's/ *tokens [0-9]* *//'
echo "=== ws-poly $(date +%T)"
P=()
for e in 4 2; do
  for v in "d128 full" "d128 causal" "d64 full" "d64 causal"; do P+=("ws-poly$e bf16 $v blk128"); done
  P+=("ws-poly$e f16 d64 full win[64,32] blk128")
done
timeout 90 $H checksm90 31 "${P[@]}" > "$out/poly-check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/poly-check.log" | tail -4
for v in "d128 full" "d128 causal" "d64 full" "d64 causal"; do
  timeout 60 $H time 13 "ws-tma bf16 $v blk128" "ws-poly4 bf16 $v blk128" "ws-poly2 bf16 $v blk128" \
    2>&1 | grep "^time"
done | tee "$out/poly-time.log" | sed 's/ *tokens [0-9]* *//'
echo "=== sm90q $(date +%T)"
timeout 90 $H checksm90 32 "sm90q bf16 d64 causal blk64" "sm90q bf16 d64 causal win[128,0] blk64" \
  "sm90q f16 d64 full win[64,32] blk64" "sm90q bf16 d128 causal blk128" \
  "sm90q bf16 d128 full win[100,0] blk128" > "$out/sm90q-check.log" 2>&1
echo "check rc $?"; grep -v "^ok" "$out/sm90q-check.log" | tail -4
timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 9 $H small 5 \
  "sm90q bf16 d64 causal blk64" "sm90q bf16 d128 causal blk128" > /tmp/san.log 2>&1
echo "memcheck rc $? $(grep -E 'ERROR SUMMARY|checks:' /tmp/san.log | tr '\n' ' ')"
timeout 60 $H time 14 "sm90 bf16 d128 causal blk128" "sm90q bf16 d128 causal blk128" 2>&1 |
  grep "^time" | tee "$out/sm90q-time.log" | sed 's/ *tokens [0-9]* *//'
echo "=== d64 causal route $(date +%T)"
BWD_LENGTHS="1024 1536 2048" timeout 120 $H time 12 "sm90 bf16 d64 causal blk64" \
  "sm90q bf16 d64 causal blk64" "ws-tma bf16 d64 causal blk128" 2>&1 | grep "^time" | tee "$out/d64-route.log" |
  sed 's/ *tokens [0-9]* *//'
