# SPDX-License-Identifier: BSD-3-Clause
"""setup.py: `pip install ./bindings/python` builds libattngen.so with the
repository's Makefile and bundles it in the package (attngen/libattngen.so),
so that the installed package needs no ATTNGEN_LIB; the version comes from
include/attngen.h (AG_VERSION_STRING), the one source of it, and is written
to attngen/_version.py. Outside a checkout (an sdist without the C tree)
set ATTNGEN_LIB to a built libattngen.so to bundle that one instead.
Everything else is in pyproject.toml."""

import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
HEADER = os.path.join(ROOT, "include", "attngen.h")


def header_version():
    """AG_VERSION_STRING of include/attngen.h, or None outside a checkout."""
    try:
        with open(HEADER) as f:
            m = re.search(r'^#define AG_VERSION_STRING "([0-9.]+)"', f.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def version():
    """The header's version; without the C tree, the ag_version() of
    ATTNGEN_LIB's library, the one that will be bundled."""
    v = header_version()
    if v:
        return v
    env = os.environ.get("ATTNGEN_LIB")
    if env and os.path.exists(env):
        import ctypes
        fn = ctypes.CDLL(env).ag_version
        fn.restype = ctypes.c_char_p
        return fn().decode()
    raise SystemExit("attngen: no include/attngen.h above %s to take the version from: build "
                     "from a checkout, or set ATTNGEN_LIB to a built libattngen.so" % HERE)


def built_library():
    """The libattngen.so to bundle: $ATTNGEN_LIB, else the checkout's,
    built (or brought up to date) with make."""
    env = os.environ.get("ATTNGEN_LIB")
    if env:
        if not os.path.exists(env):
            raise SystemExit("attngen: ATTNGEN_LIB=%s does not exist" % env)
        return env
    if not os.path.exists(os.path.join(ROOT, "Makefile")) or not header_version():
        raise SystemExit("attngen: no checkout of the C tree above %s: build libattngen.so and "
                         "set ATTNGEN_LIB to it" % HERE)
    jobs = str(os.cpu_count() or 1)
    cmd = ["make", "-C", ROOT, "-j" + jobs, "build/libattngen.so"]
    print("attngen: " + " ".join(cmd))
    subprocess.check_call(cmd)
    return os.path.join(ROOT, "build", "libattngen.so")


class BuildWithLibrary(build_py):
    """build_py, then the library and _version.py into the built package."""

    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "attngen")
        os.makedirs(pkg, exist_ok=True)
        # the real file, not the symlink chain of the build tree
        shutil.copyfile(os.path.realpath(built_library()), os.path.join(pkg, "libattngen.so"))
        with open(os.path.join(pkg, "_version.py"), "w") as f:
            f.write('"""Written by setup.py from include/attngen.h."""\n__version__ = "%s"\n'
                    % version())


class BinaryDistribution(Distribution):
    """The package carries a native library: a platform wheel, not a pure
    one."""

    def has_ext_modules(self):
        return True


setup(version=version(), cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
