# SPDX-License-Identifier: BSD-3-Clause
"""tools/emulate/keys_protocol.py, the model of broadcast_bwd_keys.cu's
barriers, runs clean over random CTAs, and fails where the protocol is
broken (a K, V slot refilled without waiting for its readers)."""
import importlib.util
import pathlib
import random

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _model():
    spec = importlib.util.spec_from_file_location(
        "keys_protocol", ROOT / "tools" / "emulate" / "keys_protocol.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_random_ctas_end_and_see_every_tile():
    m = _model()
    rng = random.Random(7)
    for _ in range(500):
        m.run(rng)


def test_a_broken_protocol_is_caught():
    src = (ROOT / "tools" / "emulate" / "keys_protocol.py").read_text()
    wait = ("                    if t >= stages:\n"
            "                        yield from wait(kv_empty[x], t // stages - 1)\n")
    assert wait in src
    broken = {}
    exec(compile(src.replace(wait, ""), "broken", "exec"), broken)
    rng = random.Random(7)
    with pytest.raises(AssertionError):
        for _ in range(500):
            broken["run"](rng)
