#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# next_gpu_call_s36.sh: session 36's device calls.
#   host (about 5 minutes; carry [".devdeps"]): issue 20: the binding's
#     GPU tests of the block pattern (float64, autograd, torch.ops with
#     opcheck, CUDA graphs), then bench/overhead.py's parts and its table
#     (host us per call beside Triton and varlen_attn). Run once in session
#     36 on an H100 for the one-allocation backward, which measured slower
#     and was reverted (b03538b).
#   causal192 (about 3 minutes; carry [".devdeps"]): head dim 64's causal
#     forward on 192-row tiles (.sm90_fwd_ws192_causal): c0 the tree, c1
#     the choice on; float64 on three mixed runs and memcheck of c1, then
#     the forward alone, c0 and c1 in turn, two rounds.
#   route192 (about 3 minutes; carry [".devdeps"]): head dim 64's unmasked
#     short runs (mean 128 to 512 rows) on the tree's route, all on the
#     192-row tiles, and on the 128-row tiles of before, two rounds.
#   l2row (about 7 minutes; carry [".devdeps"]): head dim 64's TMA maps
#     with 128-byte L2 promotion (.tma_l2_row64) and the broadcast
#     forward's grid with the heads inner (.bq_fwd_heads_inner), alone and
#     together, against the tree: float64 checks and memcheck of both
#     together, the broadcast forward at n_q 128 and 32 (all four), the
#     jagged forward and backward (the L2 setting alone), two rounds; ncu's
#     DRAM bytes of the broadcast forward for all four.
#   hostlite (about 3 minutes; session 37): every binding GPU test (the
#     packed launch args reach all six entry points) and overhead parts.
#   short (under 3 minutes; session 37): the binding's GPU tests, float64
#     of the threaded self-check inputs, r0 against r1 on two broadcast shapes.
#   l2quick (about 4.5 minutes; carry [".devdeps"]; session 37): l2row
#     without ncu and the heads-inner-alone variant, two broadcast shapes.
# Say which card the reply names: issue 20's 15 us is about an H200's host.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
export PYTHONPATH=bindings/python:$PYTHONPATH
nvidia-smi --query-gpu=name --format=csv,noheader

# The variants' helpers (plan_save, plan_edit, build_as, timed, float64,
# memcheck): tools/fwd_ab.sh.
source tools/fwd_ab.sh

# l2_on, inner_on: .tma_l2_row64 (both passes) and .bq_fwd_heads_inner on
l2_on() {
  plan_edit 's/^    \.tma_l2_row64 = \{(true|false), (true|false)\},/    .tma_l2_row64 = {true, true},/' \
    '^    \.tma_l2_row64 = \{true, true\},'
}
inner_on() {
  plan_edit 's/^    \.bq_fwd_heads_inner = false,/    .bq_fwd_heads_inner = true,/' \
    '^    \.bq_fwd_heads_inner = true,'
}
# l2_specs: fwd_ab.sh's specs and t64 (head dim 64, forward and backward)
l2_specs() {
  source tools/fwd_ab.sh
  fwd_specs
  printf 'name: t64\npattern: jagged\nhead_dim: 64\ndtype: bf16\narch: sm_90a\npasses: [forward, backward]\n' > /tmp/fi/t64.yaml
}
# gpu_tests SECONDS [PYTEST ARGS]: the binding's GPU tests after `make all`
gpu_tests() {
  local limit=$1; shift
  make -j16 all > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  echo "=== binding GPU tests $(date +%T)"
  timeout "$limit" python3 -m pytest -q "$@" > "$out/pytest-gpu.log" 2>&1
  echo "rc $? $(grep -E 'passed|failed' "$out/pytest-gpu.log" | tail -1)"
  grep -E "^FAILED|Error" "$out/pytest-gpu.log" | head -8
}
if [ "${1:-}" = host ]; then
  gpu_tests 240 bindings/python/tests/test_gpu.py bindings/python/tests/test_gpu_torch_ops.py
  echo "=== overhead parts $(date +%T)"
  timeout 90 python3 bench/overhead.py --parts --calls 2000 --out "$out/parts" 2>&1 | grep -E "^\| |Fresh"
  echo "=== overhead $(date +%T)"
  timeout 150 python3 bench/overhead.py --calls 2000 --out "$out/overhead" 2>&1 | grep -E "^\| |Fresh"
  exit
fi
if [ "${1:-}" = causal192 ]; then
  source tools/fwd_ab.sh
  fwd_specs
  plan_save
  build_as c0
  plan_edit 's/^    \.sm90_fwd_ws192_causal = false,/    .sm90_fwd_ws192_causal = true,/' \
    '^    \.sm90_fwd_ws192_causal = true,'
  build_as c1
  for v in c0 c1; do
    echo "$v: $(/tmp/fi/$v/attngen emit /tmp/fi/j64true.yaml 2>&1 | grep -m1 'query rows of one head' | tr -s ' ')"
  done
  for c in "40 900 0" "8 3000 0" "16 200 0"; do
    float64 c1 j64true $c
  done
  memcheck c1 j64true 12 1300 0
  echo "=== causal forward alone, ms (4 heads) $(date +%T)"
  timed j64true 264 1 4096 - "c0 c1" "^  time:"
  timed j64true 264 2048 4096 - "c0 c1" "^  time:"
  timed j64true 1152 1 1024 - "c0 c1" "^  time:"
  exit
fi
if [ "${1:-}" = causal_sweep ]; then
  # session 38: where head dim 64's causal forward starts to gain from the
  # 192-row tiles (c1 lost at lengths in [1, 1024], won at [1, 4096]):
  # lengths [1, HI] and [HI / 2, HI], c0 the tree, c1 the choice on
  source tools/fwd_ab.sh
  fwd_specs
  plan_save
  build_as c0
  plan_edit 's/^    \.sm90_fwd_ws192_causal = false,/    .sm90_fwd_ws192_causal = true,/' \
    '^    \.sm90_fwd_ws192_causal = true,'
  build_as c1
  float64 c1 j64true 24 2000 0
  for hi in 1024 1536 2048 3072; do
    timed j64true $((1152 * 1024 / hi)) 1 $hi - "c0 c1" "^  time:"
    timed j64true $((1152 * 1024 / hi)) $((hi / 2)) $hi - "c0 c1" "^  time:"
  done
  exit
fi
if [ "${1:-}" = long192 ]; then
  # session 38 (about 6 minutes; carry [".devdeps"]): .sm90_fwd_long192_causal,
  # head dim 64 causal on a third forward variant (192-row tiles from a
  # mean of 2,048 rows): t0 the tree, t1 the choice on; float64 of t1 on
  # runs either side of the mean, memcheck, the GPU suite's jagged case
  # with t1's plan, then the forward alone, t0 against t1
  source tools/fwd_ab.sh
  fwd_specs
  plan_save
  build_as t0
  plan_edit 's/^    \.sm90_fwd_long192_causal = false,/    .sm90_fwd_long192_causal = true,/' \
    '^    \.sm90_fwd_long192_causal = true,'
  echo "t1 plan: $(cp $P /tmp/plan_t1.c; make -j16 build/attngen > /dev/null 2>&1; build/attngen emit /tmp/fi/j64true.yaml | grep -c 'runs when the mean query length >= 2048') long variant(s)"
  build_as t1
  for c in "j64true 8 4096 2048" "j64true 12 4096 1" "j64true 40 900 0" "j64true 16 3000 1200"; do
    float64 t1 $c
  done
  # (cross lengths past the 2,048 mean, lq != lk and rows with no key: the
  # GPU suite's jagged case below, "long cross (mean 2412)")
  memcheck t1 j64true 6 4096 2048
  cp /tmp/plan_t1.c $P
  OUT=$out timeout 200 bash tools/gpu_session.sh build gpu-jagged 2>&1 | grep -E "Checks|exit" | head -3
  cp /tmp/plan_jagged.c.orig $P
  echo "=== causal forward alone, ms (4 heads) $(date +%T)"
  timed j64true 264 1 4096 - "t0 t1" "^  time:"
  timed j64true 264 2048 4096 - "t0 t1" "^  time:"
  timed j64true 384 1536 3072 - "t0 t1" "^  time:"
  timed j64true 1152 1 1024 - "t0 t1" "^  time:"
  exit
fi
if [ "${1:-}" = bqitems ]; then
  # session 38 (about 4 minutes; carry [".devdeps"]): .bq_fwd_items at head
  # dim 64 (the broadcast forward's query tiles several a CTA): b0 the
  # tree, b1 the choice on; float64 of b1 at n_q 1, 16, 128, 130 and 200,
  # memcheck at 130, the GPU suite's broadcast case on b1's plan, then the
  # forward alone, b0 against b1
  l2_specs
  plan_save
  build_as b0
  plan_edit 's/^    \.bq_fwd_items = \{false, false\},/    .bq_fwd_items = {true, false},/' \
    '^    \.bq_fwd_items = \{true, false\},'
  cp $P /tmp/plan_b1.c
  build_as b1
  echo "b1 plan: $(/tmp/fi/b1/attngen emit /tmp/fi/b64.yaml | grep -m1 -E 'query tiles a CTA in turn' | tr -s ' ')"
  # batches of 21 and 13: the last CTA's four items cut short
  for nq in 1 16 128 130 200; do float64 b1 b64 21 1300 0 $nq; done
  memcheck b1 b64 13 1300 0 130
  cp /tmp/plan_b1.c $P
  OUT=$out timeout 200 bash tools/gpu_session.sh build gpu-broadcast 2>&1 | grep -E "Checks|exit" | head -3
  cp /tmp/plan_jagged.c.orig $P
  echo "=== broadcast forward alone, ms (4 heads) $(date +%T)"
  timed b64 1152 512 1024 128 "b0 b1" "^  time:"
  timed b64 1152 1024 1024 128 "b0 b1" "^  time:"
  timed b64 528 2048 4096 128 "b0 b1" "^  time:"
  timed b64 1152 512 1024 32 "b0 b1" "^  time:"
  exit
fi
if [ "${1:-}" = route192 ]; then
  # head dim 64's unmasked short runs: the tree (192-row tiles past a mean
  # of SHORT_MEAN_ROWS, the mma.sync forward below), all on the 192-row
  # tiles (threshold 0), and the 128-row tiles of before (ws192 off)
  source tools/fwd_ab.sh
  fwd_specs
  plan_save
  build_as tree
  plan_edit 's/^enum \{ SHORT_MEAN_ROWS = [0-9]* \};/enum { SHORT_MEAN_ROWS = 0 };/' \
    '^enum \{ SHORT_MEAN_ROWS = 0 \};'
  build_as all192
  plan_edit 's/^    \.sm90_fwd_ws192 = true,/    .sm90_fwd_ws192 = false,/' '^    \.sm90_fwd_ws192 = false,'
  build_as items128
  ROUNDS=2 fwd_times "tree all192 items128" "j64false:1:256 j64false:1:512 j64false:1:768 j64false:1:1024 j64false:256:512"
  exit
fi
if [ "${1:-}" = l2row ]; then
  # r0 the tree; r1 head dim 64's TMA maps with 128-byte L2 promotion
  # (.tma_l2_row64, both passes); r2 the broadcast forward's grid with the
  # heads inner (.bq_fwd_heads_inner); r3 both
  l2_specs
  plan_save
  build_as r0
  l2_on; build_as r1
  inner_on; build_as r2
  l2_on; inner_on; build_as r3
  echo "r3 plan: $(/tmp/fi/r3/attngen emit /tmp/fi/b64.yaml | grep -cE 'L2 fetches of 128 bytes|heads side by side') of 2 lines"
  for c in "j64false 16 1500 0" "b64 20 1300 0 128" "b64 20 1300 0 130" "b128 12 2000 0 200" "t64 16 1500 0"; do
    float64 r3 $c
  done
  memcheck r3 b64 12 1300 0 130  # a partial second query tile
  echo "=== broadcast forward alone, ms (4 heads) $(date +%T)"
  # (the host's random K and V take most of a run: the batches are cut
  # where the lengths are long, and the call stays under 10 minutes)
  for t in "b64 1152 512 1024 128" "b64 528 2048 4096 128" "b64 528 1 4096 128" \
           "b128 528 2048 4096 128"; do
    timed $t "r0 r1 r2 r3" "^  time:"
  done
  timed b64 1152 512 1024 32 "r0 r3" "^  time:"
  echo "=== jagged forward alone, then the backward (t64), ms $(date +%T)"
  timed j64false 264 1 4096 - "r0 r1" "^  time:"
  timed t64 1152 1 1024 - "r0 r1" "backward time:"
  echo "=== ncu: the broadcast forward's DRAM bytes, b64 batch 264 keys [2048, 4096] n_q 128 $(date +%T)"
  for v in r0 r1 r2 r3; do
    timeout 60 /usr/local/cuda/bin/ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
      -k regex:_fwd$ -c 1 /tmp/fi/$v/attngen run /tmp/fi/b64.yaml --batch 264 --heads 4 --seqlen 4096 \
      --min-seqlen 2048 --n-q 128 --iters 1 2>&1 | grep -E "^\s+(dram__|gpu__)" | awk -v v=$v '{print v, $1, $(NF-1), $NF}'
  done
  exit
fi
if [ "${1:-}" = hostlite ]; then
  # session 37: host without the full overhead table (the binding's GPU
  # tests and overhead.py's parts only: about 3 minutes)
  gpu_tests 240 bindings/python/tests/test_gpu*.py
  echo "=== overhead parts $(date +%T)"
  timeout 80 python3 bench/overhead.py --parts --calls 2000 --out "$out/parts" 2>&1 | grep -E "^\| |Fresh"
  exit
fi
if [ "${1:-}" = short ]; then
  # session 37, under 3 minutes: every binding GPU test (the packed launch
  # args), float64 runs of the threaded self-check inputs (jagged forward and
  # backward, broadcast n_q 130, a rotary table), and the one broadcast
  # shape of l2quick, the tree (r0) against the 128-byte L2 promotion (r1)
  gpu_tests 80 -x bindings/python/tests/test_gpu*.py
  l2_specs
  printf 'name: r64\npattern: jagged\nhead_dim: 64\ndtype: bf16\narch: sm_90a\npasses: [forward, backward]\nrotary:\n  layout: half\n' > /tmp/fi/r64.yaml
  plan_save
  build_as r0
  l2_on; build_as r1
  for c in "t64 16 1500 0" "b64 20 1300 0 130" "r64 12 900 0"; do
    float64 r0 $c
  done
  float64 r1 b64 20 1300 0 130
  echo "=== broadcast forward alone, ms $(date +%T)"
  SECONDS=0
  timed b64 1152 512 1024 128 "r0 r1" "^  time:"
  echo "(4 runs in ${SECONDS} s)"
  timed b64 528 2048 4096 128 "r0 r1" "^  time:"
  exit
fi
if [ "${1:-}" = l2quick ]; then
  # session 37: l2row cut to fit a short budget (about 4.5 minutes): r0 the
  # tree, r1 the 128-byte L2 promotion, r3 with the heads inner too; no
  # ncu, no heads-inner-alone variant
  l2_specs
  plan_save
  build_as r0
  l2_on; build_as r1
  l2_on; inner_on; build_as r3
  for c in "j64false 16 1500 0" "b64 20 1300 0 128" "b64 20 1300 0 130" "b128 12 2000 0 200" "t64 16 1500 0"; do
    float64 r3 $c
  done
  memcheck r3 b64 12 1300 0 130  # a partial second query tile
  echo "=== broadcast forward alone, ms (4 heads) $(date +%T)"
  timed b64 1152 512 1024 128 "r0 r1 r3" "^  time:"
  timed b64 528 2048 4096 128 "r0 r1 r3" "^  time:"
  echo "=== jagged forward alone, then the backward (t64), ms $(date +%T)"
  timed j64false 264 1 4096 - "r0 r1" "^  time:"
  timed t64 1152 1 1024 - "r0 r1" "backward time:"
  exit
fi
echo "usage: $0 host|hostlite|short|causal192|causal_sweep|long192|bqitems|route192|l2row|l2quick"; exit 2
