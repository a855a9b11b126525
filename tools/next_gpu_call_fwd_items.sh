#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_fwd_items.sh: the plan choice .fwd_items / .fwd_q_tiles
# (generator/plan_jagged.c, plan_forward_items: the warp-specialized jagged
# and broadcast forward computing several query tiles a CTA), written in
# session 33 without a GPU. One device call; carry [".devdeps"], command
# `bash tools/next_gpu_call_fwd_items.sh [time|check ITEMS QTILES ...|route]`:
# time (default, 6 to 9 minutes): one CLI (`attngen run`, float64-checked,
#   then timed: median of 20 after 3 warm-up calls) per setting
#   ITEMS:QTILES of $VARIANTS (default "1:1 2:2 4:2 4:1"; 1:1 is the
#   tree's plan), each first on small mixed batches (jagged head dim 128 and
#   64, causal, a window, broadcast n_q 200 and 128 with empty sequences),
#   then the forward alone on the timed shapes (batch 1152, 4 heads, bf16:
#   jagged lengths uniform in [1, L], broadcast key lengths in [(2s-1)L, L]),
#   the settings in turn within each shape.
# check ITEMS QTILES (about 6 minutes): that setting in the plan, built,
#   then the GPU suite's jagged and broadcast cases and sanitize-jagged
#   (memcheck and racecheck); also a broadcast spec under both sanitizers.
# route (about 2 minutes): head dim 64's short runs on the tree's routes
#   and all on the warp-specialized forward, timed in turn.
# plan_jagged.c is restored at the end.
source .devdeps/env.sh || exit 1
source tools/fwd_ab.sh
out=${OUT:-/tmp}
P=generator/plan_jagged.c
nvidia-smi --query-gpu=name --format=csv,noheader
cp $P /tmp/plan_jagged.c.orig
trap 'cp /tmp/plan_jagged.c.orig $P; rm -f build/generator/plan_jagged.o' EXIT

# set ITEMS QTILES (at both head dims, or ITEMS64 QTILES64 ITEMS128
# QTILES128) in the plan's checked choices
setting() {
  local i64=$1 q64=$2 i128=${3:-$1} q128=${4:-$2}
  cp /tmp/plan_jagged.c.orig $P
  sed -i -E "s/^    \.fwd_items = \{[0-9]+, [0-9]+\},/    .fwd_items = {$i64, $i128},/; s/^    \.fwd_q_tiles = \{[0-9]+, [0-9]+\},/    .fwd_q_tiles = {$q64, $q128},/" $P
  grep -q "^    \.fwd_items = {$i64, $i128}," $P && grep -q "^    \.fwd_q_tiles = {$q64, $q128}," $P ||
    { echo "the choices were not found in $P"; return 1; }
  rm -f build/generator/plan_jagged.o
}

specs() { fwd_specs; }  # forward-only specs in /tmp/fi (fwd_ab.sh)

if [ "${1:-time}" = check ]; then
  specs
  # the tree's plan and the setting's, each an attngen of its own, timed at
  # the end
  setting 1 1 1 1 && make -j16 build/attngen > "$out/build-tree.log" 2>&1 &&
    mkdir -p /tmp/fi/tree && cp build/attngen /tmp/fi/tree/ || { tail -20 "$out/build-tree.log"; exit 1; }
  setting "${@:2}" || exit 1
  OUT=$out timeout 420 bash tools/gpu_session.sh build gpu-jagged gpu-broadcast sanitize-jagged 2>&1 |
    grep -vE "^(ok|gpu jagged|gpu broadcast) " | tail -25
  mkdir -p /tmp/fi/set && cp build/attngen /tmp/fi/set/
  for t in memcheck racecheck; do
    timeout 60 compute-sanitizer --tool $t --error-exitcode 9 build/attngen run /tmp/fi/b64.yaml \
      --batch 6 --seqlen 1300 --min-seqlen 0 --n-q 200 --iters 0 > "$out/bq-$t.log" 2>&1
    echo "broadcast d64 n_q 200 $t: exit $?; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' "$out/bq-$t.log" | tr '\n' ' ')"
  done
  VARIANTS="tree set"
  T=${TIMED:-"j64false:1:1024 j64false:1:4096 j64true:1:4096 b64:512:1024 b64:2048:4096"}
fi

if [ "${1:-time}" = route ]; then
  # head dim 64's short runs: the tree's routes (the mma.sync forward up to
  # a mean of 384 rows, 640 causal) against the warp-specialized forward
  # (4 tiles a CTA) for every run (both thresholds 0)
  specs
  # (a warm machine may hold a plan_jagged.o newer than the synced source)
  rm -f build/generator/plan_jagged.o
  make -j16 build/attngen > "$out/build-tree.log" 2>&1 || { tail -20 "$out/build-tree.log"; exit 1; }
  mkdir -p /tmp/fi/tree /tmp/fi/ws && cp build/attngen /tmp/fi/tree/
  sed -i 's/^enum { SHORT_MEAN_ROWS = 384 };/enum { SHORT_MEAN_ROWS = 0 };/; s/^enum { CAUSAL64_MEAN_ROWS = 640 };/enum { CAUSAL64_MEAN_ROWS = 0 };/' $P
  rm -f build/generator/plan_jagged.o
  make -j16 build/attngen > "$out/build-ws.log" 2>&1 || { tail -20 "$out/build-ws.log"; exit 1; }
  cp build/attngen /tmp/fi/ws/
  VARIANTS="tree ws"
  T=${TIMED:-"j64true:1:1024 j64true:1:512 j64false:1:512 j64false:1:256"}
fi

A() { timeout 60 /tmp/fi/$1/attngen run "${@:2}" 2>&1; }
if [ "${1:-time}" = time ]; then
specs
VARIANTS=${VARIANTS:-"1:1 2:2 4:2 4:1"}
for v in $VARIANTS; do
  setting ${v%:*} ${v#*:} || exit 1
  make -j16 build/attngen > "$out/build-${v/:/-}.log" 2>&1 || { tail -20 "$out/build-${v/:/-}.log"; exit 1; }
  mkdir -p /tmp/fi/$v && cp build/attngen /tmp/fi/$v/
  echo "=== $v built $(date +%T)"
done
echo "=== checks $(date +%T)"
for v in $VARIANTS; do
  line="$v:"
  for c in "j128false --batch 16 --seqlen 1500 --min-seqlen 0" "j128true --batch 16 --seqlen 1500 --min-seqlen 0" \
           "j64false --batch 16 --seqlen 1500 --min-seqlen 0" "jw64 --batch 16 --seqlen 3000 --min-seqlen 0" \
           "b128 --batch 20 --seqlen 1300 --min-seqlen 0 --n-q 200" "b64 --batch 20 --seqlen 1300 --min-seqlen 0 --n-q 128"; do
    set -- $c
    r=$(A $v /tmp/fi/$1.yaml ${@:2} --iters 0 | grep -E "check:|FAIL|rror" | head -2)
    case "$r" in *PASS*) line="$line ok" ;; *) line="$line $1:[$r]" ;; esac
  done
  echo "$line"
done
T=${TIMED:-"j128false:1:1024 j128true:1:1024 j64false:1:1024 j128false:1:4096 j128true:1:4096 b64:512:1024 b64:1024:1024 b128:512:1024 b64:2048:4096"}
fi
echo "=== times (ms, forward) $(date +%T)"
for t in $T; do
  IFS=: read s lo hi <<< "$t"
  nq=""; [ "${s:0:1}" = b ] && nq="--n-q 128"
  line="$s [$lo,$hi]:"
  for v in $VARIANTS; do
    ms=$(A $v /tmp/fi/$s.yaml --batch 1152 --heads 4 --seqlen $hi --min-seqlen $lo $nq --iters 20 |
         awk '/check:/ {c=$NF} /  time:/ {t=$2} END {print t (c == "PASS" ? "" : "(" c ")")}')
    line="$line $v=$ms"
  done
  echo "$line"
done
