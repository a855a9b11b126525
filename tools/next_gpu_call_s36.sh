#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s36.sh: session 36's device calls.
#   host (about 5 minutes; carry [".devdeps"]): issue 20's block backward
#     with dq, dk, dv as slices of one allocation (ops.py _backward_raw):
#     the binding's GPU tests of the block pattern (float64, autograd,
#     torch.ops with opcheck, CUDA graphs), then bench/overhead.py's parts
#     and its table (host us per call beside Triton and varlen_attn).
# Say which card the reply names: issue 20's 15 us is about an H200's host.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
export PYTHONPATH=bindings/python:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader
make -j16 all > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
if [ "${1:-}" = host ]; then
  echo "=== binding GPU tests $(date +%T)"
  timeout 240 python3 -m pytest -q bindings/python/tests/test_gpu.py bindings/python/tests/test_gpu_torch_ops.py \
    > "$out/pytest-gpu.log" 2>&1
  echo "rc $? $(grep -E 'passed|failed' "$out/pytest-gpu.log" | tail -1)"
  grep -E "^FAILED|Error" "$out/pytest-gpu.log" | head -8
  echo "=== overhead parts $(date +%T)"
  timeout 90 python3 bench/overhead.py --parts --calls 2000 --out "$out/parts" 2>&1 | grep -E "^\| |Fresh"
  echo "=== overhead $(date +%T)"
  timeout 150 python3 bench/overhead.py --calls 2000 --out "$out/overhead" 2>&1 | grep -E "^\| |Fresh"
  exit
fi
echo "usage: $0 host"; exit 2
