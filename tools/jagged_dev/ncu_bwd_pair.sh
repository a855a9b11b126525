#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# ncu_bwd_pair.sh [L] [D] [causal]: attngen's jagged backward and
# FlashAttention-4's on the same shape (tools/jagged_dev/profile_bwd_pair.py),
# each timed, then profiled by ncu (--set full, the call's kernels only),
# so that the main kernels' pipes, shared-memory traffic and stalls can be
# read side by side. FA4 needs its two-call stash (../shared/device/fa4).
#   device call 1: carry [".fa4/a"], bash .fa4/a/stash.sh
#   device call 2, at once: carry [".devdeps", ".fa4/b"],
#     bash tools/jagged_dev/ncu_bwd_pair.sh 4096 128
# Writes under $OUT: pair-details.txt (both reports' details pages),
# pair-metrics.txt (chosen raw metrics of the main kernels), pair-sass-*.txt
# (ncu_sass_top.py of each main kernel).
source .devdeps/env.sh || exit 1
source .fa4/b/env.sh || exit 1
out=${OUT:-/tmp}
L=${1:-4096} D=${2:-128} C=${3:-}
export PYTHONPATH=bindings/python:$PYTHONPATH
make -j16 build/libattngen.so > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
N=/usr/local/cuda/bin/ncu
M='regex:_kv|BackwardSm90|bwd_sm90|Bwd.*Sm90'
for w in attngen fa4; do
  echo "=== $w $(date +%T)"
  timeout 120 python3 tools/jagged_dev/profile_bwd_pair.py $w $L $D $C 2>&1 | tail -2
  timeout 200 $N --profile-from-start off --set full --import-source no -f -o /tmp/p_$w \
    python3 tools/jagged_dev/profile_bwd_pair.py $w $L $D $C > /tmp/ncu_$w.log 2>&1
  echo "ncu rc $?"; grep -E "==PROF==|==ERROR==" /tmp/ncu_$w.log | tail -3
  { echo "##### $w"; $N -i /tmp/p_$w.ncu-rep --page details; } >> "$out/pair-details.txt" 2>&1
  { echo "##### $w"; $N -i /tmp/p_$w.ncu-rep --page raw --csv -k "$M"; } > /tmp/raw_$w.csv 2>&1
  python3 - /tmp/raw_$w.csv $w >> "$out/pair-metrics.txt" <<'EOF'
import csv, sys, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
if len(rows) < 3:
    print("#####", sys.argv[2], "no main kernel rows"); sys.exit()
hdr, units = rows[0], rows[1]
want = re.compile(r"(tensor|pipe_shared|shared|lsu|hmma|gmma|issue_active|inst_executed\.avg\.per_cycle"
                  r"|l1tex__throughput|lts__t_sectors_op_red|lts__throughput|dram__throughput"
                  r"|sm__throughput|gpu__time_duration|smsp__cycles_active|warps_issue_stalled)")
for r in rows[2:]:
    print("#####", sys.argv[2], r[hdr.index("Kernel Name")][:100] if "Kernel Name" in hdr else "")
    for h, u, x in zip(hdr, units, r):
        if want.search(h) and x not in ("", "n/a"):
            print("  %-90s %14s %s" % (h, x, u))
EOF
  $N -i /tmp/p_$w.ncu-rep --page source --csv --print-source sass -k "$M" > /tmp/src_$w.csv 2>&1
  python3 tools/jagged_dev/ncu_sass_top.py /tmp/src_$w.csv 40 > "$out/pair-sass-$w.txt" 2>&1
  head -16 "$out/pair-sass-$w.txt"
done
grep -E "^#####|^  [a-zA-Z_]+ \(|Duration|Compute \(SM\) Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Registers Per|Shared Memory Configuration Size" \
  "$out/pair-details.txt" | head -60
