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


def brute_block_lists(lens, block, causal):
    """Per (query block, key block): None (no visible pair), True (every
    pair of two whole blocks visible) or False (some)."""
    doc, pos = [], []
    for d, n in enumerate(lens):
        doc += [d] * n
        pos += list(range(n))
    total = len(doc)
    nb = -(-total // block)
    out = {}
    for i in range(nb):
        for j in range(nb):
            rows = range(i * block, min((i + 1) * block, total))
            cols = range(j * block, min((j + 1) * block, total))
            vis = [doc[r] == doc[c] and (not causal or c <= r) for r in rows for c in cols]
            if any(vis):
                out[(i, j)] = all(vis) and len(rows) == block and len(cols) == block
    return out


def test_doc_block_lists_against_brute_force():
    rng = random.Random(7)
    cases = [[300, 0, 1, 128, 256, 5, 77], [16] * 9, [0, 0], [64], [33, 0, 31, 1, 95]]
    cases += [[rng.choice([0, 1, 15, 16, 17, rng.randint(0, 70)]) for _ in range(rng.randint(1, 9))]
              for _ in range(60)]
    for lens in cases:
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        for causal in (False, True):
            got = J.doc_block_lists(cu, 16, causal)
            want = brute_block_lists(lens, 16, causal)
            nb = got["num_blocks"]
            assert nb == -(-cu[-1] // 16)
            have = {}
            for i in range(nb):
                for key, full in (("kv_full", True), ("kv_partial", False)):
                    for j in got[key][i]:
                        assert (i, j) not in have, (lens, causal, i, j)
                        have[(i, j)] = full
                        # the transposed lists hold the same pair
                        assert i in got["q_full" if full else "q_partial"][j]
            assert have == want, (lens, causal)
            assert sum(map(len, got["q_full"] + got["q_partial"])) == len(want)


def test_pad_lists_and_peers_arg():
    assert J.pad_lists([[1, 2], [], [3]]) == ([2, 0, 1], [[1, 2], [0, 0], [3, 0]])
    assert J.pad_lists([[], []]) == ([0, 0], [[0], [0]])
    assert J.parse_args([]).peers == ["fa2", "fa4"]
    assert J.parse_args(["--no-fa4"]).peers == ["fa2"]
    a = J.parse_args(["--peers", "fa2,cudnn,flex", "--fwd-only"])
    assert a.peers == ["fa2", "cudnn", "flex"] and a.fwd_only
    with pytest.raises(SystemExit):
        J.parse_args(["--peers", "fa2,nope"])


def test_markdown_extra_peer_columns():
    lens = J.lengths(8, 64)
    f = J.fwd_flops(lens, 128, 4, False)
    rec = {"label": "B8 H4 D128 L64", "flops_fwd": f, "flops_bwd": 2.5 * f,
           "times": {"attngen": {"fwd": 1.0}, "flex": {"fwd": 2.0, "bwd": 4.0}}}
    md = J.markdown([rec], {}, "cmd")
    head = [x for x in md.splitlines() if x.startswith("| shape")][0]
    assert head.rstrip(" |").endswith("flex fwd | flex bwd") and "cuDNN" not in head
    row = [x for x in md.splitlines() if x.startswith("| B8")][0]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[-2].startswith("2.000 (") and cells[-1].startswith("4.000 (")


def test_retime():
    """The second round: reverse order, peers without per-shape state only,
    the backward too unless forward-only, the lower medians kept."""
    import contextlib
    import types

    calls = []

    class T:
        def detach(self):
            return self

        def requires_grad_(self):
            return self

    class Peer:
        def __init__(self, name):
            self.name = name

        def context(self):
            return contextlib.nullcontext()

        def __call__(self, q, k, v, cu, max_len, causal):
            calls.append((self.name, "fwd"))
            return self.name

    class Stateful(Peer):
        def prepare(self, *a):
            return []

    def grad(out, leaves, dout, retain_graph=False):
        calls.append((out, "bwd"))

    torch = types.SimpleNamespace(no_grad=contextlib.nullcontext,
                                  autograd=types.SimpleNamespace(grad=grad))
    second = {("fa2", "fwd"): 1.2, ("fa2", "bwd"): 2.0, ("attngen", "fwd"): 0.4,
              ("attngen", "bwd"): 1.5, ("fa4", "fwd"): 0.9}

    def timer(fn):
        fn()
        return second[calls[-1]]

    peers = {n: Peer(n) for n in ("fa2", "attngen", "fa4")}
    peers["cudnn"] = Stateful("cudnn")
    times = {"fa2": {"fwd": 1.0, "bwd": 2.2}, "attngen": {"fwd": 0.5, "bwd": 1.4},
             "fa4": {"fwd": 0.8}, "cudnn": {"fwd": 3.0, "bwd": 5.0}}
    t = T()
    J.retime(peers, ("fa2", "attngen", "fa4", "cudnn"), t, t, t, None, 64, False, None, times,
             torch=torch, timer=timer)
    # fa4 forward only (no bwd recorded), then attngen and fa2 both passes
    # (each backward after the forward it differentiates); cudnn not at all
    assert calls == [("fa4", "fwd"), ("attngen", "fwd"), ("attngen", "fwd"), ("attngen", "bwd"),
                     ("fa2", "fwd"), ("fa2", "fwd"), ("fa2", "bwd")]
    assert times["fa4"] == {"fwd": 0.8, "fwd_rounds": [0.8, 0.9]}
    assert times["attngen"]["fwd"] == 0.4 and times["attngen"]["bwd"] == 1.4
    assert times["attngen"]["bwd_rounds"] == [1.4, 1.5]
    assert times["fa2"]["bwd"] == 2.0 and times["fa2"]["fwd"] == 1.0
    assert times["cudnn"] == {"fwd": 3.0, "bwd": 5.0}
    assert J.rounds_notes(times) == [
        "fa2: forward rounds 1.000 / 1.200 ms (the lower kept)",
        "fa2: backward rounds 2.200 / 2.000 ms (the lower kept)",
        "attngen: forward rounds 0.500 / 0.400 ms (the lower kept)",
        "attngen: backward rounds 1.400 / 1.500 ms (the lower kept)",
        "fa4: forward rounds 0.800 / 0.900 ms (the lower kept)"]
    calls.clear()
    times2 = {"attngen": {"fwd": 0.5, "bwd": 1.4}}
    J.retime(peers, ("attngen",), t, t, t, None, 64, False, None, times2, fwd_only=True,
             torch=torch, timer=timer)
    assert calls == [("attngen", "fwd")] and "bwd_rounds" not in times2["attngen"]
    assert J.parse_args([]).rounds == 2 and J.parse_args(["--rounds", "1"]).rounds == 1
    for bad in ("0", "3", "two"):
        with pytest.raises(SystemExit):
            J.parse_args(["--rounds", bad])


def test_retime_failure():
    """A peer whose second round fails keeps its first; the others go on; a
    CUDA failure is raised."""
    import contextlib
    import types

    class Peer:
        def __init__(self, exc=None):
            self.exc = exc

        def context(self):
            return contextlib.nullcontext()

        def __call__(self, *a):
            if self.exc:
                raise self.exc

    torch = types.SimpleNamespace(no_grad=contextlib.nullcontext)

    def timer(fn):
        fn()
        return 0.7

    peers = {"fa2": Peer(), "fa4": Peer(ValueError("bad head dim"))}
    times = {"fa2": {"fwd": 1.0}, "fa4": {"fwd": 0.8}}
    notes = J.retime(peers, ("fa2", "fa4"), None, None, None, None, 64, False, None, times,
                     fwd_only=True, torch=torch, timer=timer)
    assert notes == ["fa4: second round failed (one round kept): ValueError: bad head dim"]
    assert times == {"fa2": {"fwd": 0.7, "fwd_rounds": [1.0, 0.7]}, "fa4": {"fwd": 0.8}}
    peers["fa4"] = Peer(RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError):
        J.retime(peers, ("fa2", "fa4"), None, None, None, None, 64, False, None,
                 {"fa4": {"fwd": 0.8}}, fwd_only=True, torch=torch, timer=timer)
