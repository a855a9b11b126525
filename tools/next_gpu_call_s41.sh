#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s41.sh: session 41's device call (carry [".devdeps"]); its
# log also into $OUT (no pipe on the command line).
#   rotary (about 5 minutes): broadcast-Q with rotary embeddings (new in
#     session 41: the mma.sync forwards, the one-pass mma.sync backwards
#     where a warp holds both halves of each pair, else the split backward,
#     whose _dq_sum rotates the summed dQ back). The GPU suite's broadcast case
#     (its two rotary cases: head dim 128 half layout from tables on q, k;
#     64 fp16 causal interleaved computed on q, k, v, grouped heads; n_q 1
#     to 200, keys 0, 1, 63..65, 1000, 4096; every gradient bit for bit
#     over five runs) and the non-rotary ones; memcheck and racecheck of
#     specs/pma_broadcast_d64_rope.yaml at n_q 20, 33 (the one-pass 32-
#     and 64-row kernels) and 130 (the split ones); then the
#     rotary spec against the same spec without rotary, batch 1152, 4
#     heads, n_q 32 and 128, keys [0, 1024] (what the split backward costs
#     against the one-pass one). Run in session 41 on an H100
#     (bench/results/2026-12-07-h100-broadcast-rotary-s41.log).
#   pyrotary (about 4 minutes): the binding's broadcast rotary on a GPU:
#     test_gpu_broadcast.py's rotary tests (float64 reference rotating,
#     then expanding q; torch.compile(fullgraph=True) equal to eager) and
#     its other non-parametrized tests, test_gpu_torch_ops.py (opcheck,
#     the ops' new signatures), test_broadcast_cpu.py on real torch.
#   unfused (about 3 minutes, any GPU): bench/broadcast_rotary.py, the fused
#     broadcast rotary against a Triton rotary pass over q and k before the
#     non-rotary kernels (RESULTS-broadcast.md's estimate by bytes, session
#     41), head dims 64 and 128, n_q 32 and 128, keys [0, 1024].
#   samesize200 (about 6 minutes, on an H200 only: it exits at once on
#     another GPU): issue 19's 92% and 95% against same-size streams on the
#     bar's machine (next_gpu_call_s38.sh samesize without hostlite); on
#     another GPU the block and jagged bindings' rotary GPU tests.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
exec > >(tee "$out/next_gpu_call_s41-${1:-}.log") 2>&1
tee_pid=$!
nvidia-smi --query-gpu=name --format=csv,noheader
case "${1:-}" in
  rotary)
    OUT=$out timeout 150 bash tools/gpu_session.sh build || exit 1
    printf 'name: pma_broadcast_d64\npattern: jagged\nquery: broadcast\nhead_dim: 64\ndtype: bf16\npasses: [forward, backward]\n' \
      > "$out/pma_d64.yaml"
    echo "=== timed, ms (batch 1152, 4 heads, keys [0, 1024]) $(date +%T)"
    for nq in 32 128; do
      for spec in specs/pma_broadcast_d64_rope.yaml "$out/pma_d64.yaml"; do
        timeout 100 build/attngen run "$spec" --batch 1152 --seqlen 1024 --min-seqlen 0 \
          --heads 4 --n-q $nq --iters 20 > "$out/run-$(basename "$spec" .yaml)-$nq.log" 2>&1
        echo "$(basename "$spec") n_q $nq rc $?: $(grep -E 'check|time' "$out/run-$(basename "$spec" .yaml)-$nq.log" | tr '\n' ' ')"
      done
    done
    echo "=== sanitize $(date +%T)"
    for nq in 20 33 130; do
      for tool in memcheck racecheck; do
        log="$out/sanitize-$tool-rope-$nq.log"
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 build/attngen run \
          specs/pma_broadcast_d64_rope.yaml --batch 6 --seqlen 300 --min-seqlen 0 --n-q $nq \
          --iters 0 > "$log" 2>&1
        echo "$tool n_q $nq: exit $?; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' "$log" | tr '\n' ' ')"
      done
    done
    echo "=== gpu-broadcast $(date +%T)"
    OUT=$out timeout 280 bash tools/gpu_session.sh gpu-broadcast
    grep -E "^gpu broadcast.*rotary" "$out/gpu-broadcast.log" | head -30
    ;;
  pyrotary)
    make -j16 all > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
    echo "=== binding GPU tests $(date +%T)"
    timeout 400 python3 -m pytest -q bindings/python/tests/test_gpu_broadcast.py \
      -k "rotary or many or bit_identical or scale or empty or expanded" \
      bindings/python/tests/test_gpu_torch_ops.py > "$out/pytest-gpu.log" 2>&1
    echo "rc $? $(grep -E 'passed|failed' "$out/pytest-gpu.log" | tail -1)"
    grep -E "^FAILED|Error" "$out/pytest-gpu.log" | head -12
    ;;
  unfused)
    make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
    export PYTHONPATH=bindings/python${PYTHONPATH:+:$PYTHONPATH}
    timeout 400 python3 bench/broadcast_rotary.py --out "$out/broadcast_rotary.md"
    echo "rc $?"
    ;;
  samesize200)
    if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
      # another GPU: the rotary GPU tests of the block and jagged bindings
      # instead (their references moved to tests/rope64.py)
      make -j16 all > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
      timeout 300 python3 -m pytest -q bindings/python/tests/test_gpu.py \
        bindings/python/tests/test_gpu_jagged.py -k rotary > "$out/pytest-rope.log" 2>&1
      echo "not an H200: rotary tests rc $? $(tail -1 "$out/pytest-rope.log")"
      grep -E "^FAILED" "$out/pytest-rope.log" | head
      exit 0
    fi
    make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
    timeout 360 python3 bench/bench.py --peers ceilings,attngen --pass both --budget 300 \
      --no-plot --out "$out/samesize" > "$out/samesize.log" 2>&1
    echo "rc $?"; tail -60 "$out/samesize.log"
    ;;
  *) echo "usage: $0 rotary|pyrotary|unfused|samesize200"; exit 2 ;;
esac
exec >&- 2>&-
wait "$tee_pid"
