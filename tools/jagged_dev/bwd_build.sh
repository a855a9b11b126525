#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# bwd_build.sh: build the jagged backward dev harness into build/jagged_bwd/
# (run from the repository root; NVCC may name the compiler).
set -e
NVCC=${NVCC:-nvcc}
B=${B:-build/jagged_bwd}  # BWD_ONLY (a regex on variant names) builds a subset
mkdir -p $B
python3 tools/jagged_dev/bwd_gen.py $B/variants.cuh
for f in reference jagged_reference jagged_bwd_reference; do
  gcc -O3 -mavx2 -mfma -std=c11 -Iinclude -Ireference -c reference/$f.c -o $B/$f.o
done
$NVCC -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -lineinfo -I$B -Iinclude -Ireference -Xptxas -v \
  tools/jagged_dev/bwd_test.cu $B/reference.o $B/jagged_reference.o $B/jagged_bwd_reference.o \
  -o $B/bwd_test -lm 2> $B/ptxas.log || { cat $B/ptxas.log; exit 1; }
grep -E "error|spill|C7512" $B/ptxas.log | grep -v " 0 bytes spill stores, 0 bytes spill loads" || true  # C7512: wgmma serialized
