# SPDX-License-Identifier: BSD-3-Clause
"""Test setup: import attngen from this checkout (no install needed) and
the torch stub from this directory."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bindings/python
sys.path.insert(0, HERE)
