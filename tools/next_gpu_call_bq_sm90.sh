#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_bq_sm90.sh: the 128-row one-pass broadcast backward on
# wgmma (templates/broadcast_bwd_sm90.cu, 64 < n_q <= 128 on sm_90a), in
# two device calls on one warm machine:
#   A (about 5 minutes): carry [".devdeps", ".fa4/a"], command
#     `bash .fa4/a/stash.sh > /tmp/stash.log; bash tools/next_gpu_call_bq_sm90.sh`
#     the GPU suite's broadcast case (n_q 1-200 against float64, the
#     deterministic dQ bit-identical; n_q 128 now on the new kernel at both
#     head dims) and memcheck, racecheck through the CLI at n_q 100 (head
#     dim 128, and 64 causal with a window).
#   B (about 6 minutes), at once: carry [".devdeps", ".fa4/b"], command
#     `bash tools/next_gpu_call_bq_sm90.sh bench`: bench/broadcast_bench.py
#     at n_q 128 with the library built both ways (the plan's
#     sm90_bq_bwd_checked true: the new kernel; false: broadcast_bwd.cu),
#     beside FlashAttention-2, -4 and cuDNN (not flex: its compiles take
#     the call).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
P=generator/plan_jagged.c
if [ "${1:-}" = bench ]; then
  source .fa4/b/env.sh || echo "no fa4 stash: FlashAttention-4 will not run"
  cp $P /tmp/plan.orig
  T=templates/broadcast_bwd_sm90.cu
  cp $T /tmp/tmpl.orig
  lib() {  # name: build the library, keep a copy
    make -j16 build/libattngen.so > "$out/build-$1.log" 2>&1 || { tail -20 "$out/build-$1.log"; exit 1; }
    mkdir -p /tmp/b_$1 && cp -L build/libattngen.so /tmp/b_$1/
  }
  sed -i 's/sm90_bq_bwd_checked = true/sm90_bq_bwd_checked = false/' $P
  lib mma
  cp /tmp/plan.orig $P
  if [ -f tools/dev_bq_v1.cu ]; then  # 8fc8fbc's kernel: two warpgroups, one P, dS slot
    cp tools/dev_bq_v1.cu $T
    sed -i -e 's/sm90 ? 12 : m \/ 16/m \/ 16/' -e 's/(sm90 ? 8 : 4) \* m \* n/4 * m * n/' $P
    lib v1
    cp /tmp/plan.orig $P
    cp /tmp/tmpl.orig $T
  fi
  lib new
  for v in mma v1; do
    [ -f /tmp/b_$v/libattngen.so ] || continue
    echo "=== $v $(date +%T)"
    ATTNGEN_LIB=/tmp/b_$v/libattngen.so PYTHONPATH=bindings/python:$PYTHONPATH timeout 150 \
      python3 bench/broadcast_bench.py --nq 128 --peers fa2 --budget 110 --out "$out/$v" 2>&1 |
      grep -E "^\| B1152.*(bitwise|not met|met)|failed|Error" | cut -d'|' -f1-8 | head -10
  done
  echo "=== warp-specialized (the tree) $(date +%T)"
  ATTNGEN_LIB=/tmp/b_new/libattngen.so PYTHONPATH=bindings/python:$PYTHONPATH timeout 300 \
    python3 bench/broadcast_bench.py --nq 128 --peers fa2,fa4,cudnn --budget 250 --out "$out/new" 2>&1 |
    grep -E "^\| B1152.*(bitwise|not met|met)|^wrote|failed|Error" | head -12
  exit
fi
OUT=$out bash tools/gpu_session.sh build gpu-broadcast 2>&1 | tail -8
for run in "specs/pma_broadcast_d128.yaml 100" "tests/golden/broadcast_d64_fp16_causal_window.yaml 100"; do
  set -- $run
  for tool in memcheck racecheck; do
    log="$out/sanitize-$tool-$(basename "$1" .yaml)-$2.log"
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 build/attngen run "$1" --batch 6 \
      --seqlen 300 --min-seqlen 0 --n-q $2 --iters 0 > "$log" 2>&1
    echo "$tool $1 n_q $2: exit $?; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' "$log" | tr '\n' ' ')"
  done
done
