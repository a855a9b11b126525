# SPDX-License-Identifier: BSD-3-Clause
"""CPU tests of bench/jagged_bench.py's pure-Python side: lengths, visible
query-key pairs (against brute force), FLOPs, the shape lists, the report,
and that the module imports without torch.

    python3 -m pytest -q bench/tests/test_jagged_bench.py
"""
import os
import random
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)

import jagged_bench as J  # noqa: E402


def brute_pairs(lq, lk, causal):
    d = lk - lq
    return sum(1 for i in range(lq) for j in range(lk) if not causal or j <= i + d)


def test_visible_pairs_self_attention():
    lens = [0, 1, 2, 7, 64, 1000]
    assert J.visible_pairs(lens) == sum(n * n for n in lens)
    assert J.visible_pairs(lens, causal=True) == sum(n * (n + 1) // 2 for n in lens)
    for n in lens:
        assert J.visible_pairs([n], causal=True) == brute_pairs(n, n, True)


def test_visible_pairs_cross_attention_bottom_right():
    rng = random.Random(3)
    for _ in range(300):
        lq, lk = rng.randint(0, 40), rng.randint(0, 40)
        for causal in (False, True):
            assert J.visible_pairs([lq], [lk], causal) == brute_pairs(lq, lk, causal), (lq, lk)


def test_flops():
    lens = [3, 10]
    pairs = 9 + 100
    assert J.fwd_flops(lens, 128, 4, False) == 4 * 128 * 4 * pairs
    cpairs = 6 + 55
    assert J.fwd_flops(lens, 64, 2, True) == 4 * 64 * 2 * cpairs
    assert J.bwd_flops(lens, 64, 2, True) == 2.5 * J.fwd_flops(lens, 64, 2, True)
    assert J.tflops(1e12, 1000.0) == pytest.approx(1.0)
    assert J.tflops(1e12, None) is None


def test_lengths():
    a = J.lengths(1152, 1024)
    assert len(a) == 1152 and min(a) >= 1 and max(a) <= 1024
    assert a == J.lengths(1152, 1024)            # fixed seed
    assert a != J.lengths(1152, 1024, seed=1)
    b = J.lengths(500, 4096, spread=0.75)
    assert min(b) >= 2048 and max(b) <= 4096
    c = J.lengths(100, 512, spread=1.0)
    assert c == [512] * 100
    assert min(J.lengths(200, 64, spread=0.5)) >= 1
    # the mean is about L/2 for uniform [1, L]
    assert abs(sum(a) / len(a) - 512) < 40


def test_shapes():
    full = J.shapes()
    assert len(full) == 8
    assert {(s["head_dim"], s["max_len"], s["causal"]) for s in full} == {
        (d, L, c) for d in (128, 64) for L in (1024, 4096) for c in (False, True)}
    assert all(s["batch"] == 1152 and s["heads"] == 4 for s in full)
    quick = J.shapes(quick=True)
    assert len(quick) == 4 and {s["max_len"] for s in quick} == {1024}
    more = J.shapes(more_lengths=True)
    assert len(more) == 16 and {s["max_len"] for s in more} == {512, 1024, 2048, 4096}
    assert J.label(full[1]) == "B1152 H4 D128 L1024 causal"
    assert J.label(J.shapes(spread=0.7)[0]) == "B1152 H4 D128 L1024 s0.7"


def test_markdown():
    lens = J.lengths(8, 64)
    rec = {"label": "B8 H4 D128 L64", "flops_fwd": J.fwd_flops(lens, 128, 4, False),
           "flops_bwd": J.bwd_flops(lens, 128, 4, False),
           "times": {"attngen": {"fwd": 1.0, "bwd": 2.0, "fwdbwd": 3.0},
                     "fa2": {"fwd": 1.5, "bwd": 3.0}},
           "err_out": 3e-3, "err_grads": 5e-2, "notes": ["fa4 failed: x"]}
    md = J.markdown([rec], {"gpu": "test"}, "cmd")
    row = [x for x in md.splitlines() if x.startswith("| B8")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "1.50x" and cells[6] == "1.50x" and cells[9] == "—"
    assert cells[13] == "5.0e-02 !" and cells[12] == "3.0e-03"
    assert "fa4 failed: x" in md and "- gpu: test" in md


def test_parse_args():
    a = J.parse_args(["--quick", "--spread", "0.7", "--out", "/tmp/x"])
    assert a.quick and a.spread == 0.7 and a.out == "/tmp/x" and not a.more_lengths
    assert not a.deterministic and J.parse_args(["--deterministic"]).deterministic


def test_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "sys.path.insert(0, %r)\n"
            "import jagged_bench as J\n"
            "print(len(J.shapes()), J.visible_pairs([4], causal=True))\n" % BENCH)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["8", "10"]
