#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# test_pip.sh: `pip install ./bindings/python` into a fresh virtual
# environment (setup.py builds libattngen.so with make and bundles it), then,
# from outside the checkout and with ATTNGEN_LIB unset, the installed package
# loads its bundled library, whose ag_version() is the package's
# __version__. Offline: --no-build-isolation with the system's setuptools.
# Skips (exit 0, saying why) where python3 has no venv or setuptools.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
# pyproject's [project] table needs setuptools 61; it builds wheels itself
# from 70.1, before that with `wheel`
if ! python3 -c 'import importlib.util as u, setuptools, sys
v = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
sys.exit(0 if v >= (61, 0) and (v >= (70, 1) or u.find_spec("wheel")) else 1)' 2>/dev/null; then
  echo "SKIP test-pip: python3 has no setuptools >= 61 that builds wheels (pip install wheel)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! python3 -m venv --system-site-packages "$tmp/venv" >/dev/null 2>&1; then
  echo "SKIP test-pip: python3 -m venv does not work here (python3-venv missing)"; exit 0
fi
"$tmp/venv/bin/python" -m pip install -q --no-build-isolation --no-deps "$root/bindings/python" \
  >"$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; echo "test-pip: FAIL: pip install"; exit 1; }
cd "$tmp"
env -u ATTNGEN_LIB "$tmp/venv/bin/python" - <<'PY'
import os
import attngen
from attngen import _lib
lib = _lib.lib()
pkg = os.path.dirname(os.path.abspath(attngen.__file__))
assert os.path.dirname(os.path.abspath(lib._name)) == pkg, (lib._name, pkg)
assert "site-packages" in pkg, pkg
got = lib.ag_version().decode()
assert got == attngen.__version__, (got, attngen.__version__)
print("test-pip: PASS (pip install ./bindings/python bundles libattngen.so %s; the installed "
      "package loads it with no ATTNGEN_LIB)" % got)
PY
