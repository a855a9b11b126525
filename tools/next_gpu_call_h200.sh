#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_h200.sh: the H200 figures that session 27 (2026-12-05)
# could not take, its device being an H100: the fused-rotary pipeline with
# table_reuse on (bench/RESULTS-rotary.md's headline is the H200's before
# it), the backward against the read-4-write-3 ceiling (issue 19's 92%),
# and the host-overhead parts with overhead.py's new host-alone column
# (issue 20's 15 us is about an H200's host). About 8 minutes:
#   device: carry [".devdeps"], command: bash tools/next_gpu_call_h200.sh
# Check the reply's device first: on an H100 these say nothing new.
# Ran on an H200 in session 31 (2026-12-06): bench/results/*-s31.md.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
export PYTHONPATH=bindings/python:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
make -j16 all > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "=== rotary pipeline $(date +%T)"
timeout 280 python3 bench/bench.py --quick --rotary --budget 230 --out "$out/qr" 2>&1 |
  grep -A8 "^Summary"
echo "=== backward against the ceilings $(date +%T)"
timeout 200 python3 bench/bench.py --quick --pass bwd --peers ceilings,attngen --budget 150 \
  --no-plot --out "$out/bwd" 2>&1 | grep -A8 "^Summary"
echo "=== overhead parts $(date +%T)"
timeout 90 python3 bench/overhead.py --parts --calls 2000 --out "$out/parts" 2>&1 | tail -20
