#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s35.sh: session 35's device calls (issues 17 and 18): the
# warp-specialized forward's exponentials partly on the FMA pipe (plan
# choice .sm90_fwd_exp2_fma_every, exp2_fma in jagged_fwd_wgmma.cuh).
#   fma (about 7 minutes; carry [".devdeps"], or [".devdeps", ".fa4/a"]
#     after `bash .fa4/a/stash.sh;` when call 2 follows): CLIs built for
#     each of $VARIANTS (eN: the choice at N at both head dims, e0 the
#     tree's plan; wN: the same with .sm90_fwd_ws192, head dim 64's
#     unmasked forward on three computing warpgroups); float64 checks of
#     $CHECKED on mixed runs (partial tiles, short sequences, causal, windows
#     on both sides, fp16, broadcast n_q 130 and 128); memcheck on one; the
#     forward alone timed (each run float64-checked too), the variants in
#     turn per shape; then ncu's pipe utilisation of the head-dim-64 L 4096
#     forward for $NCU_V.
#   fa4 N64 N128 [WS192] (at once after `fma`; carry [".devdeps", ".fa4/b"]):
#     those choices in the plan, then bench/jagged_bench.py's eight shapes
#     beside FA2 and FA4 and the broadcast bar shapes at head dim 64.
#   suite N64 N128 [WS192] (about 5 minutes; carry [".devdeps"]): the
#     choices set, the GPU suite's jagged and broadcast cases and
#     sanitize-jagged.
# plan_jagged.c is restored at the end.
source .devdeps/env.sh || exit 1
source tools/fwd_ab.sh
out=${OUT:-/tmp}
P=generator/plan_jagged.c
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
cp $P /tmp/plan_jagged.c.orig
trap 'cp /tmp/plan_jagged.c.orig $P; rm -f build/generator/plan_jagged.o' EXIT

# fma_set N64 N128 [WS192]: .sm90_fwd_exp2_fma_every (and .sm90_fwd_ws192,
# default false) in the plan's checked choices
fma_set() {
  local w=${3:-false}
  cp /tmp/plan_jagged.c.orig $P
  sed -i -E "s/^    \.sm90_fwd_exp2_fma_every = \{[0-9]+, [0-9]+\},/    .sm90_fwd_exp2_fma_every = {$1, $2},/; s/^    \.sm90_fwd_ws192 = (true|false),/    .sm90_fwd_ws192 = $w,/" $P
  grep -q "^    \.sm90_fwd_exp2_fma_every = {$1, $2}," $P && grep -q "^    \.sm90_fwd_ws192 = $w," $P ||
    { echo "the choices were not found"; exit 1; }
  rm -f build/generator/plan_jagged.o  # a warm machine may hold a newer one
}
# variant names: eN (N at both head dims, two computing warpgroups), wN
# (the same with .sm90_fwd_ws192: three at head dim 64 without a mask)
variant_set() {
  case $1 in e*) fma_set ${1#e} ${1#e} false ;; w*) fma_set ${1#w} ${1#w} true ;; esac
}

if [ "${1:-}" = fa4 ]; then
  source .fa4/b/env.sh || exit 1
  fma_set ${2:-3} ${3:-0} ${4:-false}
  make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  PYTHONPATH=bindings/python:$PYTHONPATH timeout 330 python3 bench/jagged_bench.py --out "$out/jb" 2>&1 |
    grep -E "^\| B1152|^wrote|failed|Error" | head -24
  PYTHONPATH=bindings/python:$PYTHONPATH timeout 200 python3 bench/broadcast_bench.py --nq 128 \
    --peers fa4,cudnn --dims 64 --out "$out/bb" 2>&1 | grep -E "^\| |^wrote|failed|Error" | head -16
  exit
fi
if [ "${1:-}" = suite ]; then
  fma_set ${2:-3} ${3:-0} ${4:-false}
  OUT=$out timeout 300 bash tools/gpu_session.sh build gpu-jagged gpu-broadcast 2>&1 | tail -4
  SANITIZE_ONLY=jagged OUT=$out timeout 240 bash tools/gpu_session.sh sanitize-jagged 2>&1 |
    grep -oE "ERROR SUMMARY: [0-9]+ errors|RACECHECK SUMMARY: [0-9]+ hazards|FAIL|exit [0-9]+" | sort | uniq -c
  exit
fi
[ "${1:-}" = fma ] || { echo "usage: $0 fma|fa4 N64 N128|suite N64 N128"; exit 2; }

fwd_specs
VARIANTS=${VARIANTS:-e0 e2 e3 e4}
for v in $VARIANTS; do
  variant_set $v
  make -j16 build/attngen > "$out/build-$v.log" 2>&1 || { tail -20 "$out/build-$v.log"; exit 1; }
  mkdir -p /tmp/fi/$v && cp build/attngen /tmp/fi/$v/
done
for v in $VARIANTS; do
  echo "$v: $(/tmp/fi/$v/attngen emit /tmp/fi/j64false.yaml 2>&1 | grep -E 'FMA pipe|take$|query rows of one head' | head -3 | tr -s ' ' | tr '\n' ';')"
done
echo "=== checks $(date +%T)"
for v in ${CHECKED:-e2 e4}; do
  line=""
  CASES=${CHECKS:-"j128false:16:1500:0 j128true:16:1500:0 j64false:16:1500:0 j64true:40:900:0 jw64:16:3000:0 jw128:16:1500:0 b64:20:1300:0:130 b128:12:2000:0:128"}
  for c in $CASES; do
    c=${c//:/ }
    set -- $c
    nq=""; [ -n "${5:-}" ] && nq="--n-q $5"
    r=$(timeout 60 /tmp/fi/$v/attngen run /tmp/fi/$1.yaml --batch $2 --seqlen $3 --min-seqlen $4 $nq --iters 0 2>&1 |
        grep -E "check:|FAIL|rror" | head -2)
    case "$r" in *PASS*) line="$line ok(${r##*rel error }" ;; *) line="$line $1/$3/${5:-}:[$r]" ;; esac
  done
  echo "$v checks:$line" | sed 's/ \.\.\. PASS/)/g'
done
r=$(timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/fi/${MEMCHECK_V:=e3}/attngen run /tmp/fi/${MEMCHECK_SPEC:=j64true}.yaml \
    --batch 12 --seqlen 1300 --min-seqlen 0 --iters 0 2>&1 | grep -E "ERROR SUMMARY|check:" | tr '\n' ' ')
echo "memcheck $MEMCHECK_V $MEMCHECK_SPEC: $r"
echo "=== times (ms, forward, batch 1152, 4 heads; variants $VARIANTS in turn) $(date +%T)"
fwd_times "$VARIANTS" "${TIMED:-j64false:1:1024 j64true:1:1024 j64false:1:4096 j64true:1:4096 b64:4096:4096:128 b64:2048:4096:128 j128false:1:1024 j128false:1:4096}"
echo "=== ncu, j64false batch 264 [1,4096], ${NCU_V:=e0 e3} $(date +%T)"
N=/usr/local/cuda/bin/ncu
M=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
for v in $NCU_V; do
  timeout 120 $N --metrics $M -k regex:_fwd$ -c 1 /tmp/fi/$v/attngen run /tmp/fi/j64false.yaml \
    --batch 264 --heads 4 --seqlen 4096 --min-seqlen 1 --iters 1 2>&1 |
    grep -E "^\s+(sm__|gpu__)" | awk -v v=$v '{print v, $1, $(NF)}'
done
