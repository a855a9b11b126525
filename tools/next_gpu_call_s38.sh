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
#   record_jagged, record_broadcast (on an H200; each under 9 minutes;
#     first `bash .fa4/a/stash.sh` carrying [".devdeps", ".fa4/a"], then at
#     once each of these carrying [".devdeps", ".fa4/b"], the machine kept
#     warm between them): the tree's tables of record beside
#     FlashAttention-4: bench/jagged_bench.py's eight shapes (issue 17), then
#     bench/broadcast_bench.py's sixteen (issue 18; FA2, FA4, cuDNN) and the
#     head-dim-128 n_q-32 shapes again with --det-first and FA2 alone (the
#     harness's order effect, bench/NOTES.md session 38).
#   alloc (about 2 minutes; carry [".devdeps", ".ab"], after `mkdir -p .ab;
#     git show a82a797~1:bindings/python/attngen/ops.py > .ab/ops_before.py`):
#     issue 20's block backward with one allocation (the tree) against three
#     empty_like (.ab/ops_before.py), overhead.py's parts, two rounds each,
#     then the binding's backward GPU tests on the tree. On an H200 if one
#     comes: the bar's host.
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
  record_jagged|record_broadcast)
    source .fa4/b/env.sh || exit 1
    make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
    export PYTHONPATH=bindings/python${PYTHONPATH:+:$PYTHONPATH}
    if [ "$1" = record_jagged ]; then
      TAILN=30 step jagged 520 python3 bench/jagged_bench.py --out "$out/jb"
    else
      TAILN=24 step broadcast 400 python3 bench/broadcast_bench.py --peers fa2,fa4,cudnn \
        --budget 380 --out "$out/bb"
      TAILN=10 step broadcast-det-first 110 python3 bench/broadcast_bench.py --peers fa2 \
        --dims 128 --nq 32 --det-first --budget 100 --out "$out/bb-det-first"
    fi
    ;;
  alloc)
    [ -f .ab/ops_before.py ] || { echo ".ab/ops_before.py is missing (see the header)"; exit 1; }
    make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
    export PYTHONPATH=bindings/python${PYTHONPATH:+:$PYTHONPATH}
    P=bindings/python/attngen/ops.py
    cp $P /tmp/ops_tree.py
    trap 'cp /tmp/ops_tree.py $P' EXIT
    for r in 1 2; do for v in tree before; do
      if [ $v = tree ]; then cp /tmp/ops_tree.py $P; else cp .ab/ops_before.py $P; fi
      echo "== $v, round $r"
      timeout 60 python3 bench/overhead.py --parts --calls 2000 --out "$out/parts-$v-$r" 2>&1 |
        grep -E "Kernel.backward|_backward_raw|torch.empty_like \||three at once|whole forward"
    done; done
    cp /tmp/ops_tree.py $P
    step gpu-backward 200 python3 -m pytest -q bindings/python/tests/test_gpu.py \
      bindings/python/tests/test_gpu_torch_ops.py -k "backward or grad"
    ;;
  *) echo "usage: $0 first|samesize|masks|record_jagged|record_broadcast|alloc"; exit 2 ;;
esac
