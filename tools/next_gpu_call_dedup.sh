#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_dedup.sh: session 31's shared template pieces (issue 15:
# the sm_90a forward on jagged_fwd_wgmma.cuh's softmax and output stage,
# the forwards' tile lookup and row offsets in jagged_fwd_span.cuh, one
# row copy (copy_rows.cuh) for four loaders, one key-tile lookup and query
# step (jagged_bwd_tile.cuh) for the three key-tile walks), whose kernels'
# machine code changed, checked and timed on the GPU in two calls on one
# warm machine:
#   check (carry [".devdeps"]): build, gpu-jagged, gpu-broadcast.
#   time (carry [".devdeps", ".dedup_base"]), at once: sanitize-jagged;
#     then the tree's library beside one built from .dedup_base/templates
#     (a copy of the templates before the change, made on the workstation:
#     `mkdir -p .dedup_base && git archive BASE templates | tar -x -C
#     .dedup_base`), each in its own process, in turn ROUNDS times (1):
#     jagged_bench --quick, with --rotary at head dim 128, and
#     broadcast_bench at n_q 128 and 200, L 4096, FA2 beside each.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${1:-}" = time ]; then
  [ -d .dedup_base/templates ] || { echo "no .dedup_base: carry it"; exit 1; }
  OUT=$out timeout 270 bash tools/gpu_session.sh build sanitize-jagged 2>&1 | tail -24
  mkdir -p /tmp/lib_new /tmp/lib_base
  cp -L build/libattngen.so /tmp/lib_new/
  rm -rf /tmp/basetree && mkdir -p /tmp/basetree &&
    tar --exclude=./build --exclude=./.fa4 --exclude=./.dedup_base -cf - . | tar -xf - -C /tmp/basetree &&
    rm -rf /tmp/basetree/templates && cp -r .dedup_base/templates /tmp/basetree/ &&
    (cd /tmp/basetree && make -j16 build/libattngen.so > "$out/build-base.log" 2>&1) &&
    cp -L /tmp/basetree/build/libattngen.so /tmp/lib_base/ || { tail -20 "$out/build-base.log"; exit 1; }
  for round in $(seq ${ROUNDS:-1}); do
    for lib in base new; do
      echo "=== $lib round $round $(date +%T)"
      export ATTNGEN_LIB=/tmp/lib_$lib/libattngen.so PYTHONPATH=bindings/python:$PYTHONPATH
      timeout 90 python3 bench/jagged_bench.py --quick --peers fa2 --out "$out/j-$lib-$round" 2>&1 |
        grep -E "^\| B|failed|Error" | head -6
      timeout 60 python3 bench/jagged_bench.py --quick --rotary --shapes D128 --peers fa2 \
        --out "$out/jr-$lib-$round" 2>&1 | grep -E "^\| B|failed|Error" | head -4
      timeout 80 python3 bench/broadcast_bench.py --nq 128,200 --lengths 4096 --spread 0.5 --peers fa2 \
        --budget 60 --out "$out/b-$lib-$round" 2>&1 | grep -E "^\| B|failed|Error" | head -6
    done
  done
  exit
fi
OUT=$out timeout 100 bash tools/gpu_session.sh build 2>&1 | tail -3
OUT=$out timeout 290 bash tools/gpu_session.sh gpu-jagged 2>&1 | tail -6
OUT=$out timeout 170 bash tools/gpu_session.sh gpu-broadcast 2>&1 | tail -6
