#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s38.sh: session 38's device calls, each under 10 minutes,
# each step under its own time limit and logged to $OUT (carry [".devdeps"]).
#   first: next_gpu_call_s36.sh's short (the packed launch args and the
#     threaded self-check inputs on a GPU), then its l2quick (issue 18's
#     head-dim-64 broadcast forward with the 128-byte L2 promotion).
#   samesize: bench.py, attngen and the ceilings alone, forward and backward
#     over the 24 ads shapes, with the same-size streams (issue 19's 95%
#     and 92% bars measured against a stream of the pass's own size), then
#     next_gpu_call_s36.sh's hostlite (issue 20's parts on this host).
#   masks: next_gpu_call_s36.sh's causal192, then route192.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
# step NAME SECONDS COMMAND...: one step, its whole log in $out/NAME.log,
# its last lines here
step() {
  local name=$1 limit=$2; shift 2
  echo "=== $name $(date +%T)"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  echo "rc $?"
  tail -"${TAILN:-45}" "$out/$name.log"
}
case "${1:-}" in
  first)
    step short 290 bash tools/next_gpu_call_s36.sh short
    step l2quick 290 bash tools/next_gpu_call_s36.sh l2quick
    ;;
  samesize)
    make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
    TAILN=56 step samesize 330 python3 bench/bench.py --peers ceilings,attngen --pass both --budget 320 \
      --no-plot --out "$out/samesize"
    step hostlite 230 bash tools/next_gpu_call_s36.sh hostlite
    ;;
  masks)
    step causal192 280 bash tools/next_gpu_call_s36.sh causal192
    step route192 280 bash tools/next_gpu_call_s36.sh route192
    ;;
  *) echo "usage: $0 first|samesize|masks"; exit 2 ;;
esac
