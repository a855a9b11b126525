#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# build_all.sh OUTDIR [PATTERN]: build every variant of variants.txt (whose
# name matches PATTERN, a grep regex) into OUTDIR, two at a time.
here=$(cd "$(dirname "$0")" && pwd)
out=$1 pat=${2:-.}
grep -v '^#' "$here/variants.txt" | awk '{print $1}' | grep -E "$pat" | \
  xargs -P "${JOBS:-2}" -I{} sh -c "opts=\$(grep '^{} ' '$here/variants.txt' | cut -d' ' -f2-); \
    '$here/build.sh' '$out' {} \$opts >/dev/null || echo 'BUILD FAILED: {}'"
for f in "$out"/*.ptxas; do
  printf '%s: ' "$(basename "$f" .ptxas)"
  grep -A3 "Compiling entry function 'jagged" "$f" | grep -oE "[0-9]+ bytes spill stores|Used [0-9]+ registers" | tr '\n' ' '
  echo
done
