#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s34.sh: session 34's two back-to-back device calls (issue 17).
#   call 1, carry [".devdeps", ".fa4/a"]: bash .fa4/a/stash.sh; bash tools/next_gpu_call_s34.sh route
#     (about 4 minutes) head dim 64's short runs on the tree's routes and all
#     on the warp-specialized forward (4 tiles a CTA), timed in turn
#     (next_gpu_call_fwd_items.sh route), then the product's GPU suite's
#     jagged case.
#   call 2, at once, carry [".devdeps", ".fa4/b"]: bash tools/next_gpu_call_s34.sh fa4
#     (about 4 minutes) bench/jagged_bench.py on the tree (the 8 shapes of
#     bench/RESULTS-jagged.md beside FA2 and FA4), then head dim 64 at L 512
#     and 1024 forward-only beside FA4 with a library whose head-dim-64
#     forward takes the warp-specialized kernel on every run.
#   skip (about 5 minutes; carry [".devdeps"]): the plan choice
#     .sm90_fwd_skip_dead (templates/jagged_fwd_ws.cu's SKIP_DEAD) on, built
#     beside the tree with it off ("tree"): float64 checks of the "skip" build on mixed lengths
#     (partial tiles, sequences of 64 rows or fewer, causal, windows on both
#     sides, broadcast n_q 100, 130, 200), memcheck and racecheck on two of
#     them, then the forward alone timed, tree and skip in turn per shape.
#   suite (about 5 minutes; carry [".devdeps"]): with .sm90_fwd_skip_dead
#     on, the GPU suite's jagged and broadcast cases and sanitize-jagged.
#   route128 (about 2 minutes; carry [".devdeps", ".fa4/a"], after
#     `bash .fa4/a/stash.sh;`): the short variants against the
#     warp-specialized forward at L 384-768, head dim 128 (and 64 unmasked).
#   more (at once after route128; carry [".devdeps", ".fa4/b"]): L 512
#     and 2048 beside FA2 and FA4.
source .devdeps/env.sh || exit 1
source tools/fwd_ab.sh
out=${OUT:-/tmp}
# a warm machine may hold a plan_jagged.o newer than the synced source
rm -f build/generator/plan_jagged.o
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${1:-}" = route ]; then
  TIMED="j64true:1:1024 j64true:1:512 j64false:1:512 j64false:1:768 j64true:1:768" \
    timeout 200 bash tools/next_gpu_call_fwd_items.sh route 2>&1 | tail -12
  OUT=$out timeout 300 bash tools/gpu_session.sh build gpu-jagged 2>&1 | tail -4
  exit
fi
if [ "${1:-}" = fa4 ]; then
  source .fa4/b/env.sh || exit 1
  P=generator/plan_jagged.c
  cp $P /tmp/plan_jagged.c.orig
  trap 'cp /tmp/plan_jagged.c.orig $P' EXIT
  make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  PYTHONPATH=bindings/python:$PYTHONPATH timeout 330 python3 bench/jagged_bench.py --out "$out/jb" 2>&1 |
    grep -E "^\| B1152|^wrote|failed|Error" | head -24
  sed -i 's/^enum { SHORT_MEAN_ROWS = 384 };/enum { SHORT_MEAN_ROWS = 0 };/; s/^enum { CAUSAL64_MEAN_ROWS = 640 };/enum { CAUSAL64_MEAN_ROWS = 0 };/' $P
  rm -f build/generator/plan_jagged.o
  make -j16 build/libattngen.so > "$out/build-ws.log" 2>&1 || { tail -20 "$out/build-ws.log"; exit 1; }
  echo "=== head dim 64 forward, every run on the ws kernel"
  PYTHONPATH=bindings/python:$PYTHONPATH timeout 150 python3 bench/jagged_bench.py --more-lengths \
    --fwd-only --peers fa4 --shapes "D64,L512|L1024" --out "$out/jbws" 2>&1 |
    grep -E "^\| B1152|^wrote|failed|Error" | head -12
  exit
fi
P=generator/plan_jagged.c
# skip_set true|false: .sm90_fwd_skip_dead so in the plan's checked choices
# (on since 1d9c406: `skip` builds its `tree` with it off, for the A/B)
skip_set() {
  cp /tmp/plan_jagged.c.orig $P
  sed -i -E "s/^    \.sm90_fwd_skip_dead = (true|false),/    .sm90_fwd_skip_dead = $1,/" $P
  grep -q "^    \.sm90_fwd_skip_dead = $1," $P || { echo "the choice was not found"; exit 1; }
  rm -f build/generator/plan_jagged.o
}
if [ "${1:-}" = suite ]; then
  cp $P /tmp/plan_jagged.c.orig
  trap 'cp /tmp/plan_jagged.c.orig $P; rm -f build/generator/plan_jagged.o' EXIT
  skip_set true
  OUT=$out timeout 300 bash tools/gpu_session.sh build gpu-jagged gpu-broadcast 2>&1 | tail -4
  SANITIZE_ONLY=jagged OUT=$out timeout 240 bash tools/gpu_session.sh sanitize-jagged 2>&1 |
    grep -oE "ERROR SUMMARY: [0-9]+ errors|RACECHECK SUMMARY: [0-9]+ hazards|FAIL|exit [0-9]+" | sort | uniq -c
  exit
fi
if [ "${1:-}" = skip ]; then
  cp $P /tmp/plan_jagged.c.orig
  trap 'cp /tmp/plan_jagged.c.orig $P; rm -f build/generator/plan_jagged.o' EXIT
  mkdir -p /tmp/fi/tree /tmp/fi/skip
  fwd_specs
  skip_set false
  make -j16 build/attngen > "$out/build-tree.log" 2>&1 || { tail -20 "$out/build-tree.log"; exit 1; }
  cp build/attngen /tmp/fi/tree/
  skip_set true
  make -j16 build/attngen > "$out/build-skip.log" 2>&1 || { tail -20 "$out/build-skip.log"; exit 1; }
  cp build/attngen /tmp/fi/skip/
  /tmp/fi/skip/attngen describe /tmp/fi/j128true.yaml 2>&1 | grep -i "no product" | head -1
  echo "=== checks (skip build) $(date +%T)"
  line=""
  for c in "j128false 16 1500 0" "j128true 16 1500 0" "j64false 16 1500 0" "j64true 16 1500 0" \
           "j128true 40 900 0" "j64true 40 900 0" "jw64 16 3000 0" "jw128 16 1500 0" \
           "b128 20 1300 0 100" "b128 20 1300 0 130" "b64 20 1300 0 200" "b64 20 1300 0 130"; do
    set -- $c
    nq=""; [ -n "${5:-}" ] && nq="--n-q $5"
    r=$(timeout 60 /tmp/fi/skip/attngen run /tmp/fi/$1.yaml --batch $2 --seqlen $3 --min-seqlen $4 $nq --iters 0 2>&1 |
        grep -E "check:|FAIL|rror" | head -2)
    case "$r" in *PASS*) line="$line ok" ;; *) line="$line $1/$3/${5:-}:[$r]" ;; esac
  done
  echo "checks:$line"
  for t in memcheck racecheck; do
    for c in "j128true 12 1300 0" "b128 6 1300 0 130"; do
      set -- $c
      nq=""; [ -n "${5:-}" ] && nq="--n-q $5"
      r=$(timeout 90 compute-sanitizer --tool $t --error-exitcode 9 /tmp/fi/skip/attngen run /tmp/fi/$1.yaml \
          --batch $2 --seqlen $3 --min-seqlen $4 $nq --iters 0 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|check:" | tr '\n' ' ')
      echo "$t $1 ${5:-}: $r"
    done
  done
  echo "=== times (ms, forward, batch 1152, 4 heads; tree then skip) $(date +%T)"
  fwd_times "tree skip" "${TIMED:-j128false:1:1024 j128true:1:1024 j64false:1:1024 j64true:1:1024 j128false:1:4096 j128true:1:4096 j64true:1:4096 b128:512:1024:200 b64:512:1024:130 b128:2048:4096:128}"
  exit
fi
if [ "${1:-}" = route128 ]; then
  # head dim 128's short runs: the short variant (jagged_fwd_sm90.cu, 64-row
  # tiles, up to a mean of 384 rows) against the warp-specialized forward
  # (with SKIP_DEAD) on every run
  TIMED="j128false:1:512 j128true:1:512 j128false:1:768 j128true:1:768 j128false:1:384 j128true:1:384 j64false:1:512 j64false:1:768" \
    timeout 250 bash tools/next_gpu_call_fwd_items.sh route 2>&1 | tail -9
  exit
fi
if [ "${1:-}" = more ]; then
  # at once after a call that ran `bash .fa4/a/stash.sh`; carry .fa4/b:
  # L 512 and 2048 beside FA2 and FA4 (bench/jagged_bench.py --more-lengths)
  source .fa4/b/env.sh || exit 1
  make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  PYTHONPATH=bindings/python:$PYTHONPATH timeout 400 python3 bench/jagged_bench.py --more-lengths \
    --shapes "L512|L2048" --out "$out/jbmore" 2>&1 | grep -E "^\| B1152|^wrote|failed|Error" | head -12
  exit
fi
echo "usage: $0 route|fa4|skip|suite|route128|more"; exit 2
