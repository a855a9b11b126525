#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_large_blocks.sh: blocks past 128 tokens through the jagged
# kernels (the binding's ATTNGEN_BLOCK_VIA_JAGGED route, written 2026-12-05
# without a GPU), checked and timed in one device call of about 8 minutes:
#   run ../shared/device/prepare here first; device: carry [".devdeps"],
#   command: bash tools/next_gpu_call_large_blocks.sh
# 1. test_gpu_views.py's large-block cases: the route against float64,
#    forward and gradients (192- and 256-token blocks, causal, grouped
#    heads).
# 2. bench.py --quick --pass both at 256- and 192-token blocks: attngen's
#    block kernels (the chunked backward), the route (peer attngen_jagged:
#    the jagged forward with the blocks' offsets built on the device, and
#    the jagged backward kernels alone), FlashAttention-2 varlen and cuDNN,
#    side by side. Issue 19's bar: >= 1.2x the fastest shipped peer.
# If the route wins: set ops._jagged_route_min_block's default (the
# smallest block size where it wins) in bindings/python/attngen/ops.py,
# record the run in bench/RESULTS-bwd.md, and consider the plan-level route
# (a block spec's kernels from the jagged templates) for the C API.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
export PYTHONPATH=bindings/python:$PYTHONPATH
make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
echo "=== the route against float64 $(date +%T)"
timeout 150 python3 -m pytest -q -s bindings/python/tests/test_gpu_views.py -k large_blocks \
  > "$out/pytest-large-blocks.log" 2>&1
echo "rc $? $(tail -1 "$out/pytest-large-blocks.log")"
for b in 256 192; do
  echo "=== timed: ${b}-token blocks $(date +%T)"
  timeout 190 python3 bench/bench.py --quick --pass both --block $b --budget 160 \
    --peers ceilings,attngen,attngen_jagged,varlen_fa2,sdpa_cudnn --out "$out/bench-b$b" 2>&1 |
    tail -14
done
