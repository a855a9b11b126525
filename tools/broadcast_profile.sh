#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# broadcast_profile.sh: the broadcast-Q backward timed by the CLI (batch
# 1152, 4 heads, keys uniform in [0, 1024], n_q 32 and 128, head_dim 128
# and 64) and profiled by ncu at head_dim 128, n_q 32 (the one-pass kernel
# n_q picks: 32 rows since session 27): the details page
# and the stall picture by instruction (tools/jagged_dev/ncu_sass_top.py).
#   device: carry [".devdeps"], command: bash tools/broadcast_profile.sh [time]
# NCU_NQ, NCU_L, NCU_MIN, NCU_BATCH (default 32, 1024, 0, 1152): the
# profiled run's n_q, longest and shortest key length and batch; NCU_ONLY=1
# skips the timed runs (session 30: n_q 128 on broadcast_bwd_sm90.cu).
# Its ncu part ran on an H100 on 2026-12-05 (session 27; bench/results/
# 2026-12-05-h100-ncu-broadcast-bwd-m64-nq32*.txt), before the 32-row variant.
source .devdeps/env.sh || exit 1
out=${OUT:-/tmp}
make -j16 all > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
sed 's/head_dim: 128/head_dim: 64/; s/name: pma_broadcast/name: pma_broadcast64/' \
  specs/pma_broadcast_d128.yaml > /tmp/pma64.yaml
echo "=== timed $(date +%T)"
[ -n "${NCU_ONLY:-}" ] || for nq in 32 128; do
  for s in specs/pma_broadcast_d128.yaml /tmp/pma64.yaml; do
    echo "--- $s n_q $nq"
    timeout 120 build/attngen run $s --batch 1152 --heads 4 --seqlen 1024 --min-seqlen 0 \
      --n-q $nq --iters 20 2>&1 | grep -E "time:"
  done
done
[ "${1:-}" = time ] && exit 0
echo "=== ncu $(date +%T)"
N=/usr/local/cuda/bin/ncu
timeout 200 $N --set full --import-source no -k regex:bq_bwd_m -c 1 -f -o /tmp/bq \
  build/attngen run specs/pma_broadcast_d128.yaml --batch ${NCU_BATCH:-1152} --heads 4 \
  --seqlen ${NCU_L:-1024} --min-seqlen ${NCU_MIN:-0} --n-q ${NCU_NQ:-32} --iters 1 \
  > "$out/ncu-run.log" 2>&1
echo "ncu rc $?"; tail -3 "$out/ncu-run.log"
$N -i /tmp/bq.ncu-rep --page details > "$out/ncu-details.txt" 2>&1
$N -i /tmp/bq.ncu-rep --page source --csv --print-source sass > /tmp/bq-src.csv 2>&1
python3 tools/jagged_dev/ncu_sass_top.py /tmp/bq-src.csv 45 > "$out/ncu-sass-top.txt" 2>&1
grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Block Limit|Theoretical Occ|Waves Per SM|L2 Hit|Issue Slots Busy|Warp Cycles Per Issued" "$out/ncu-details.txt" | head -30
head -30 "$out/ncu-sass-top.txt"
