#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_bq_sm90.sh: the 128-row one-pass broadcast backward on
# wgmma (templates/broadcast_bwd_sm90.cu, 64 < n_q <= 128 on sm_90a), in
# two device calls on one warm machine:
#   A (about 2 minutes): carry [".devdeps", ".fa4/a"], command
#     `bash .fa4/a/stash.sh > /tmp/stash.log; bash tools/next_gpu_call_bq_sm90.sh`
#     the GPU suite's broadcast case (n_q 1-200 against float64, the
#     deterministic dQ bit-identical; n_q 128 on this kernel at both head
#     dims) and memcheck, racecheck through the CLI at n_q 100 (head dim
#     128, and 64 causal with a window).
#   B (about 4 minutes), at once: carry [".devdeps", ".fa4/b"], command
#     `bash tools/next_gpu_call_bq_sm90.sh bench`: bench/broadcast_bench.py
#     at n_q 128 beside FlashAttention-2, -4 and cuDNN (not flex: its
#     compiles take the call), then ncu on the kernel at head dim 128, n_q
#     128, 264 sequences of 4096 keys (tools/broadcast_profile.sh).
#   variants (about 3 minutes; carry [".devdeps"]): the edits of (default dkq)
#     tools/bq_dev/variants.py beside the tree's kernel.
# Session 30's calls (8fc8fbc, 4bb1cac, then the mbarrier K, V ring with
# FA2 and cuDNN beside, no FA4) timed the mma.sync kernel and the earlier
# versions against untracked copies of them: git log -p this file. Session
# 31 ran modes variants ("pairs": 0.95-1.03x, not taken) and bench (FA4
# beside, then ncu) on the mbarrier ring, on an H100
# (bench/RESULTS-broadcast.md).
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
lib() {  # name: build the library, keep a copy
  make -j16 build/libattngen.so > "$out/build-$1.log" 2>&1 || { tail -20 "$out/build-$1.log"; exit 1; }
  mkdir -p /tmp/b_$1 && cp -L build/libattngen.so /tmp/b_$1/
}
bq() {  # name peers budget: the benchmark at n_q 128 with library /tmp/b_name
  ATTNGEN_LIB=/tmp/b_$1/libattngen.so PYTHONPATH=bindings/python:$PYTHONPATH timeout $(($3 + 50)) \
    python3 bench/broadcast_bench.py --nq 128 --peers $2 --budget $3 --out "$out/$1" 2>&1 |
    grep -E "^\| B1152.*(bitwise|not met|met)|^wrote|failed|Error" | head -12
}
if [ "${1:-}" = variants ]; then
  # VARIANTS (default "dkq"): tools/bq_dev/variants.py's edits, each
  # checked against float64 through the CLI (n_q 100, both head dims),
  # then timed beside the tree's kernel (FA2 beside); about 3 minutes.
  T=templates/broadcast_bwd_sm90.cu
  cp $T /tmp/tmpl.orig
  for v in ${VARIANTS:-dkq}; do
    cp /tmp/tmpl.orig $T
    python3 tools/bq_dev/variants.py $v || exit 1
    make -j16 all > "$out/build-$v.log" 2>&1 || { tail -20 "$out/build-$v.log"; exit 1; }
    mkdir -p /tmp/b_$v && cp -L build/libattngen.so /tmp/b_$v/
    for spec in specs/pma_broadcast_d128.yaml tests/golden/broadcast_d64_fp16_causal_window.yaml; do
      echo "$v $spec: $(timeout 60 build/attngen run $spec --batch 6 --seqlen 300 --min-seqlen 0 \
        --n-q 100 --iters 0 2>&1 | grep -E 'check:' | tr '\n' ' ')"
    done
  done
  cp /tmp/tmpl.orig $T
  lib new
  for v in new ${VARIANTS:-dkq}; do
    echo "=== $v $(date +%T)"
    bq $v fa2 90
  done
  exit
fi
if [ "${1:-}" = bench ]; then
  source .fa4/b/env.sh || echo "no fa4 stash: FlashAttention-4 will not run"
  lib new
  echo "=== the tree's kernel $(date +%T)"
  bq new fa2,fa4,cudnn 250
  echo "=== ncu $(date +%T)"
  NCU_ONLY=1 NCU_NQ=128 NCU_L=4096 NCU_MIN=4096 NCU_BATCH=264 OUT=$out timeout 280 \
    bash tools/broadcast_profile.sh 2>&1 | tail -45
  exit
fi
OUT=$out timeout 150 bash tools/gpu_session.sh build gpu-broadcast 2>&1 | tail -8
[ ${PIPESTATUS[0]} -eq 0 ] || { echo "gpu-broadcast failed or timed out"; exit 1; }
for run in "specs/pma_broadcast_d128.yaml 100" "tests/golden/broadcast_d64_fp16_causal_window.yaml 100"; do
  set -- $run
  for tool in memcheck racecheck; do
    log="$out/sanitize-$tool-$(basename "$1" .yaml)-$2.log"
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 build/attngen run "$1" --batch 6 \
      --seqlen 300 --min-seqlen 0 --n-q $2 --iters 0 > "$log" 2>&1
    echo "$tool $1 n_q $2: exit $?; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' "$log" | tr '\n' ' ')"
  done
done
