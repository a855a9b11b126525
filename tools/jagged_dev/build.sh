#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# build.sh OUTDIR NAME [expand.py options...]: expand the template and build
# the harness for one variant as OUTDIR/NAME (and OUTDIR/NAME.cuh).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$here/../..
out=$1 name=$2
shift 2
mkdir -p "$out"
python3 "$here/expand.py" "$@" -o "$out/$name.cuh"
${NVCC:-nvcc} -O3 -gencode arch=compute_90a,code=${ARCH:-sm_90a} -std=c++17 -I"$root/include" -I"$root/reference" \
  -I"$out" -DJV_KERNEL_FILE="\"$name.cuh\"" -Xptxas -v "$here/fwd_test.cu" \
  "$root/reference/jagged_reference.c" "$root/reference/reference.c" -o "$out/$name" \
  2>"$out/$name.ptxas"
grep -E "registers|spill" "$out/$name.ptxas" | grep -A1 -B0 "spill" | tr -s ' ' | tr '\n' ' ' \
  | sed "s|^|$name: |"; echo
