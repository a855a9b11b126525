#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_build.sh: `attngen build` as a build system uses it: two bundled
# specs (a block-diagonal one and a broadcast one) for sm_80 and sm_90a
# into a temporary directory; the headers compile as C (-Wall -Wextra
# -Werror) and C++, and tests/install/use_build.c, linked with the generated
# _kernels.c files and libattngen.a, checks the embedded images against the
# cubins and the embedded specs (and loads both on a GPU when one is
# present); it links without -lnvrtc and runs with NVRTC made unloadable.
# Run from the top of the tree by `make test-build` (and so by
# `make test`).
set -euo pipefail
B=${B:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test-build: FAIL: $*" >&2; exit 1; }
"$B/attngen" build specs/ads_block64_d64_fp16.yaml specs/pma_broadcast_d128.yaml \
  -o "$tmp/gen" --arch sm_80,sm_90a >/dev/null
for f in ads_block64_d64.cu ads_block64_d64.h ads_block64_d64_kernels.c ads_block64_d64.sm_80.cubin \
         ads_block64_d64.sm_90a.cubin pma_broadcast.h pma_broadcast_kernels.c; do
  [ -s "$tmp/gen/$f" ] || fail "$f was not written"
done
"$B/attngen" emit specs/ads_block64_d64_fp16.yaml | cmp -s - "$tmp/gen/ads_block64_d64.cu" ||
  fail "NAME.cu differs from attngen emit's"
cc=${CC:-cc}
flags="-std=c11 -Wall -Wextra -Werror -Iinclude -I$tmp/gen"
for h in ads_block64_d64 pma_broadcast; do
  echo "#include \"$h.h\"" | "$cc" $flags -x c -fsyntax-only - || fail "$h.h does not compile as C"
  if command -v c++ >/dev/null; then
    echo "#include \"$h.h\"" | c++ -std=c++17 -Wall -Werror -Iinclude -I"$tmp/gen" -x c++ -fsyntax-only - ||
      fail "$h.h does not compile as C++"
  fi
done
# No -lnvrtc: NVRTC is loaded only by a compile, which this program never
# asks for; it runs with NVRTC made unloadable.
# shellcheck disable=SC2086
"$cc" $flags -o "$tmp/use_build" tests/install/use_build.c "$tmp/gen/ads_block64_d64_kernels.c" \
  "$tmp/gen/pma_broadcast_kernels.c" "$B/libattngen.a" \
  $(pkg-config --libs yaml-0.1 2>/dev/null || echo -lyaml) -ldl -lpthread -lm
if command -v ldd >/dev/null && grep -q nvrtc <<<"$(ldd "$tmp/use_build")"; then
  fail "the program needs libnvrtc"
fi
ATTNGEN_LIBNVRTC=/nonexistent/libnvrtc.so "$tmp/use_build" \
  "sm_80=$tmp/gen/ads_block64_d64.sm_80.cubin" "sm_90a=$tmp/gen/ads_block64_d64.sm_90a.cubin" ||
  fail "use_build failed"
echo "test-build: PASS (attngen build: headers as C and C++, embedded images, a program linked" \
  "without NVRTC that runs with none)"
