#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# run_device.sh: what one call on the GPU machine runs for the binding and
# the benchmark. Builds libattngen.so, then runs the chosen steps, each under
# its own time limit so that one stuck step still leaves the others' output.
# Everything is written to OUTDIR (logs, the report .md/.json/.png and
# RESULTS.md, or RESULTS-bwd.md for the backward steps); copy
# OUTDIR/<date>-*.{md,json,png} to bench/results/ and OUTDIR/RESULTS*.md to
# bench/ to commit them.
#
# Usage: bench/run_device.sh OUTDIR [STEP...]
#   STEP: tests         the binding's pytest suite (GPU tests included) and the
#                       harness's CPU tests, ~1-2 min
#         smoke         the harness on tiny shapes (pipeline check), ~1 min
#         quick         the harness, 4 ads shapes (< 2 min)
#         full          the harness, 24 ads shapes (< 8 min; run it alone)
#         smoke-bwd     the backward on tiny shapes (pipeline check), ~1 min
#         quick-bwd     the backward, 4 ads shapes (< 2.5 min)
#         full-bwd      the backward, 24 ads shapes (< 8 min; run it alone)
#         quick-rotary  EXPERIMENTAL: fwd+bwd with rotary, 4 ads shapes (< 5 min)
#   default: tests quick
set -u
out=${1:?usage: bench/run_device.sh OUTDIR [tests|smoke|quick|full|smoke-bwd|quick-bwd|full-bwd|quick-rotary]...}
shift
steps=${*:-tests quick}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
rc=0

echo "=== build ($(date +%T))"
if ! make -j16 build/libattngen.so >"$out/build.log" 2>&1; then
  echo "build failed (attngen will be reported unavailable; peers still run):"
  tail -20 "$out/build.log"
  rc=1
fi

for step in $steps; do
  echo "=== $step ($(date +%T))"
  case $step in
    tests)
      timeout -k 10 300 "$py" -m pytest -q -rs bindings/python/tests 2>&1 | tee "$out/pytest.log" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      timeout -k 10 120 "$py" -m pytest -q bench/tests 2>&1 | tee "$out/pytest-bench.log" | tail -5
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    smoke)
      timeout -k 10 150 "$py" bench/bench.py --smoke --out "$out" 2>&1 | tee "$out/bench-smoke.log" | tail -60
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    quick)
      timeout -k 10 220 "$py" bench/bench.py --quick --out "$out" 2>&1 | tee "$out/bench-quick.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    full)
      timeout -k 10 540 "$py" bench/bench.py --out "$out" 2>&1 | tee "$out/bench-full.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    smoke-bwd)
      timeout -k 10 150 "$py" bench/bench.py --smoke --pass bwd --out "$out" 2>&1 | tee "$out/bench-smoke-bwd.log" | tail -60
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    quick-bwd)
      timeout -k 10 220 "$py" bench/bench.py --quick --pass bwd --out "$out" 2>&1 | tee "$out/bench-quick-bwd.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    full-bwd)
      timeout -k 10 540 "$py" bench/bench.py --pass bwd --out "$out" 2>&1 | tee "$out/bench-full-bwd.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    quick-rotary)
      timeout -k 10 360 "$py" bench/bench.py --quick --rotary --out "$out" 2>&1 | tee "$out/bench-quick-rotary.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    *) echo "unknown step '$step'"; rc=2 ;;
  esac
done
ls -la "$out"
exit $rc
