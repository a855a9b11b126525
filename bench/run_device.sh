#!/usr/bin/env bash
# run_device.sh: what one call on the GPU machine runs for the binding and
# the benchmark. Builds libattngen.so, then runs the chosen steps, each under
# its own time limit so that one stuck step still leaves the others' output.
# Everything is written to OUTDIR (logs, the report .md/.json/.png and
# RESULTS.md); copy OUTDIR/<date>-*.{md,json,png} to bench/results/ and
# OUTDIR/RESULTS.md to bench/RESULTS.md to commit them.
#
# Usage: bench/run_device.sh OUTDIR [STEP...]
#   STEP: tests  the binding's pytest suite (GPU tests included), ~1 min
#         smoke  the harness on tiny shapes (pipeline check), ~1 min
#         quick  the harness, 4 ads shapes (< 2 min)
#         full   the harness, 24 ads shapes (< 8 min; run it alone)
#   default: tests quick
set -u
out=${1:?usage: bench/run_device.sh OUTDIR [tests|smoke|quick|full]...}
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
    *) echo "unknown step '$step'"; rc=2 ;;
  esac
done
ls -la "$out"
exit $rc
