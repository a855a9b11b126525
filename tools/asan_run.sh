#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# asan_run.sh: run the CPU tests built with ASan+UBSan (make asan), from
# tests/, with the sanitizer options the Makefile passes in the
# environment. Every report goes to $ASAN_REPORTS/san.<pid>.
#
# One failure is retried, once: LeakSanitizer's own stop-the-world tracer
# crashing at a test process's exit ("Tracer caught signal 11 ...
# LeakSanitizer has encountered a fatal error"), a known intermittent fault
# of the sanitizer runtime (google/sanitizers#1353), not a finding. It is
# retried only when every failed test ended with ASan's exit code and every
# report is that crash alone; the failed test cases then run again, and
# their verdict stands. Any other report or failure fails at once.
# Usage: tools/asan_run.sh CHECK_BINARY   (ASAN_REPORTS, ASAN_EXIT set)
set -u
bin=$1
reports=${ASAN_REPORTS:?}
exit_code=${ASAN_EXIT:?}
log=$reports/run.log
"$bin" 2>&1 | tee "$log"
show() { tail -n 80 "$reports"/san.* 2>/dev/null; }
# The run's status: Check prints a summary line; its failures follow.
if ! grep -qE '^[0-9]+%: Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$log"; then
  echo "asan: the test run did not finish"; show; exit 1
fi
failed=$(grep -E ':[FE]:' "$log")
if [ -z "$failed" ] && ! ls "$reports"/san.* >/dev/null 2>&1; then
  exit 0
fi
tracer_only=yes
for f in "$reports"/san.*; do
  [ -e "$f" ] || continue
  if grep -q 'Tracer caught signal' "$f" && ! grep -qE 'ERROR: |runtime error|SUMMARY' "$f"; then
    continue
  fi
  tracer_only=no
done
if [ "$tracer_only" = yes ] && [ -n "$failed" ] &&
    ! echo "$failed" | grep -v "Early exit with return value $exit_code" | grep -q .; then
  cases=$(echo "$failed" | awk -F: '{print $4}' | sort -u)
  echo "asan: LeakSanitizer's tracer crashed at exit in: $(echo $cases) (a sanitizer-runtime" \
       "fault, google/sanitizers#1353); running those test cases again, once"
  mkdir -p "$reports/first" && mv "$reports"/san.* "$reports/first/"
  for c in $cases; do
    CK_RUN_CASE=$c "$bin" >"$reports/retry-$c.log" 2>&1
    tail -n 3 "$reports/retry-$c.log"
    if grep -qE ':[FE]:' "$reports/retry-$c.log" || ls "$reports"/san.* >/dev/null 2>&1; then
      echo "asan: $c failed again"; cat "$reports/retry-$c.log" | grep -E ':[FE]:'; show; exit 1
    fi
  done
  echo "asan: the retried test cases passed"
  exit 0
fi
echo "asan: failures or sanitizer reports:"
[ -n "$failed" ] && echo "$failed"
show
exit 1
