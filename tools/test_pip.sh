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
# On a machine with a CUDA device and torch: the README's first Python
# example, run as printed against the installed package (from outside the
# checkout, so its sys.path line finds nothing), on inputs of its comment's
# shapes; both outputs checked against a float64 reference.
# A venv sees the system's site-packages but not the user's or PYTHONPATH's,
# where torch may live: python3's torch is appended by a .pth file, after
# the venv's own packages, so the installed attngen still comes first.
cuda='import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'
if ! "$tmp/venv/bin/python" -c "$cuda" >/dev/null 2>&1 &&
    tdir=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
      2>/dev/null); then
  "$tmp/venv/bin/python" -c 'import site; print(site.getsitepackages()[0])' >"$tmp/site"
  echo "$tdir" >"$(cat "$tmp/site")/zz_system_torch.pth"
fi
if ! "$tmp/venv/bin/python" -c "$cuda" >"$tmp/torch.log" 2>&1; then
  echo "SKIP test-pip README example: no torch with a CUDA device here ($(tail -1 "$tmp/torch.log"))"
  exit 0
fi
awk '/^```python$/{on=1;next} /^```$/{if(on)exit} on' "$root/README.md" >"$tmp/example.py"
env -u ATTNGEN_LIB "$tmp/venv/bin/python" - "$tmp/example.py" <<'PY'
import sys
import torch
g = torch.Generator(device="cuda").manual_seed(7)
lengths = [0, 1, 63, 64, 65, 300, 129]
offsets = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
total, H, D = int(offsets[-1]), 4, 128
q, k, v = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
env = {"q": q, "k": k, "v": v, "offsets": offsets}
src = open(sys.argv[1]).read()
outs = []
for line in src.splitlines():  # each `out = ...` line's result is checked
    exec(line, env)
    if line.startswith("out ="):
        outs.append(env["out"])
assert len(outs) == 2, src
ref = torch.empty(total, H, D, dtype=torch.float64, device="cuda")
for s, e in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
    for b in range(s, e, 64):
        x = slice(b, min(b + 64, e))
        qs, ks, vs = (t[x].double().transpose(0, 1) for t in (q, k, v))
        p = torch.softmax(qs @ ks.transpose(1, 2) / D ** 0.5, -1)
        ref[x] = (p @ vs).transpose(0, 1)
for out in outs:
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err
import attngen
import os
assert os.path.realpath(attngen.__file__).startswith(os.path.realpath(sys.prefix) + os.sep), \
    (attngen.__file__, sys.prefix)
print("test-pip: PASS (the README's first Python example ran on the installed package; rel error %.1e)" % err)
PY
