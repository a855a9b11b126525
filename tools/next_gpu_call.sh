#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call.sh: what session 21 prepared and could not run (no device was
# lent after its fourth call). One device call, about 6 minutes:
#   run ../shared/device/prepare here first; device: carry [".devdeps"],
#   command: bash tools/next_gpu_call.sh
# 1. Issue 20: bench/overhead.py --parts times each step of an eager block
#    forward and backward on the H200's host (the checks, the kernel lookup,
#    the allocations, the stream, the args struct, the C launch), then the
#    whole table with Triton and varlen_attn beside it: is the new eager fast
#    path (ops._fast_block_forward) under 15 us a call?
# 2. Issue 19: the backward's FlexAttention rows, through peers/flex.py's new
#    fallback (a mask of 128-token blocks), first the probe's "coarse" way
#    alone, then bench.py's backward with FA2 and attngen beside it.
# Logs to $OUT (at most 8 files come back).
source .devdeps/env.sh || exit 1
export PYTHONPATH=bindings/python:$PYTHONPATH
out=${OUT:-/tmp}
make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "=== overhead parts $(date +%T)"
python3 bench/overhead.py --parts --calls 2000 --out "$out/parts" 2>&1 | tail -18
echo "=== overhead $(date +%T)"
timeout 200 python3 bench/overhead.py --calls 2000 --out "$out/overhead" 2>&1 | tail -20
echo "=== flex probe $(date +%T)"
timeout 150 python3 bench/flex_probe.py --dim 128 --seqlen 1024 --ways coarse
echo "=== flex backward rows $(date +%T)"
timeout 240 python3 bench/bench.py --quick --pass bwd --peers attngen,varlen_fa2,flex \
  --budget 220 --no-plot --out "$out/flexbwd" 2>&1 | tail -25
