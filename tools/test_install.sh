#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# test_install.sh: `make install` into a temporary DESTDIR with
# PREFIX=/usr/local, then, as a user of the installed tree would, build
# tests/install/emit_spec.c with only pkg-config (the shared library, then
# --static) and run it on a bundled spec (no GPU needed); check the SONAME,
# that no RUNPATH names the build tree, that the installed CLI runs, and that
# `make uninstall` removes every file it installed. Run from the top of the
# tree by `make test-install` (and so by `make test`).
set -euo pipefail
make=${MAKE:-make}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test-install: FAIL: $*" >&2; exit 1; }
prefix=/usr/local
root=$tmp/root
"$make" --no-print-directory -s install DESTDIR="$root" PREFIX=$prefix >/dev/null
lib=$root$prefix/lib
# the version and the SONAME as the Makefile makes them: the major, or
# before 1.0 major.minor
ver=$(sed -n 's/^#define AG_VERSION_STRING "\([0-9.]*\)".*/\1/p' include/attngen.h)
major=${ver%%.*}
minor=${ver#*.}; minor=${minor%%.*}
if [ "$major" = 0 ]; then so=libattngen.so.$major.$minor; else so=libattngen.so.$major; fi
for f in bin/attngen lib/libattngen.a lib/libattngen.so.$ver include/attngen.h \
         lib/pkgconfig/attngen.pc; do
  [ -f "$root$prefix/$f" ] || fail "$prefix/$f was not installed"
done
[ "$(readlink "$lib/$so")" = libattngen.so.$ver ] || fail "$so link"
[ "$(readlink "$lib/libattngen.so")" = "$so" ] || fail "libattngen.so link"
if command -v readelf >/dev/null; then
  dyn=$(readelf -d "$lib/libattngen.so.$ver")
  grep -qF "Library soname: [$so]" <<<"$dyn" || fail "SONAME is not $so"
  for f in "$lib/libattngen.so.$ver" "$root$prefix/bin/attngen"; do
    paths=$(readelf -d "$f" | grep -E 'R(UN)?PATH' || true)
    if grep -qF "$PWD" <<<"$paths"; then
      fail "$f has a RUNPATH into the build tree"
    fi
  done
fi
# As a user would: the .pc's paths are /usr/local/...; the sysroot variable
# points pkg-config at the staged copy.
export PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root
pkg-config --exists attngen || fail "pkg-config does not find attngen"
[ "$(pkg-config --modversion attngen)" = "$ver" ] || fail "pkg-config --modversion"
cc=${CC:-cc}
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror -o "$tmp/emit_shared" tests/install/emit_spec.c \
  $(pkg-config --cflags --libs attngen)
# shellcheck disable=SC2046
# Static: the same line with libattngen.a picked over the .so.
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror -o "$tmp/emit_static" tests/install/emit_spec.c \
  $(pkg-config --cflags attngen) \
  $(pkg-config --static --libs attngen | sed 's/-lattngen/-Wl,-Bstatic -lattngen -Wl,-Bdynamic/')
spec=specs/ads_block64_d64_fp16.yaml
LD_LIBRARY_PATH=$lib "$tmp/emit_shared" "$spec" || fail "the shared-library program failed"
if command -v ldd >/dev/null; then
  # (captured first: grep -q can close the pipe before ldd is done, and
  # with pipefail ldd's SIGPIPE would read as a failure)
  deps=$(LD_LIBRARY_PATH=$lib ldd "$tmp/emit_shared")
  grep -qF "$so => $lib/" <<<"$deps" || fail "the program does not load the installed $so"
  deps=$(ldd "$tmp/emit_static")
  if grep -q libattngen <<<"$deps"; then fail "the static program needs libattngen.so"; fi
fi
"$tmp/emit_static" "$spec" >/dev/null || fail "the static program failed"
"$root$prefix/bin/attngen" check "$spec" >/dev/null || fail "the installed attngen check failed"
"$make" --no-print-directory -s uninstall DESTDIR="$root" PREFIX=$prefix >/dev/null
left=$(find "$root" ! -type d)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "test-install: PASS (install, pkg-config shared and static builds, run, uninstall)"
