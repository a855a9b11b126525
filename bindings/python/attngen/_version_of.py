# SPDX-License-Identifier: BSD-3-Clause
"""The binding's version, from its one source: include/attngen.h's
AG_VERSION_STRING. An installed package carries it in _version.py (written
by setup.py from the header); in a checkout it is read from the header."""

import os
import re


def binding_version():
    try:
        from ._version import __version__ as v  # an installed package
        return v
    except ImportError:
        pass
    header = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "include",
                          "attngen.h")
    try:
        with open(header) as f:
            m = re.search(r'^#define AG_VERSION_STRING "([0-9.]+)"', f.read(), re.M)
        if m:
            return m.group(1)
    except OSError:
        pass
    return "0+unknown"
