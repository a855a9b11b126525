# SPDX-License-Identifier: BSD-3-Clause
"""CPU tests of bench/broadcast_bench.py's pure-Python side: lengths,
visible query-key pairs (against brute force), FLOPs, the shape lists and
their flags, the bar and the budget, the flex block lists (against brute
force), the report, and that the module imports without torch.

    python3 -m pytest -q bench/tests/test_broadcast_bench.py
"""
import json
import os
import random
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)

import broadcast_bench as B  # noqa: E402


def brute_pairs(n_q, lk, causal):
    d = lk - n_q
    return sum(1 for i in range(n_q) for j in range(lk) if not causal or j <= i + d)


def test_visible_pairs():
    lens = [1, 7, 64, 1000]
    assert B.visible_pairs(32, lens) == 32 * sum(lens)
    rng = random.Random(5)
    for _ in range(200):
        n_q = rng.choice([1, 3, 32, 40])
        lk = [rng.randint(0, 90) for _ in range(3)]
        for causal in (False, True):
            assert B.visible_pairs(n_q, lk, causal) == sum(brute_pairs(n_q, x, causal)
                                                           for x in lk), (n_q, lk, causal)


def test_flops():
    lens = [3, 10]
    pairs = 32 * 13
    assert B.flops(32, lens, 128, 4) == 4 * 128 * 4 * pairs
    assert B.flops(32, lens, 128, 4, pass_="bwd") == 2.5 * 4 * 128 * 4 * pairs
    assert B.flops(32, lens, 128, 4, pass_="fwdbwd") == 3.5 * 4 * 128 * 4 * pairs
    cp = brute_pairs(32, 3, True) + brute_pairs(32, 10, True)
    assert B.flops(32, lens, 64, 2, causal=True) == 4 * 64 * 2 * cp
    assert B.tflops(1e12, 1000.0) == pytest.approx(1.0)
    assert B.tflops(1e12, None) is None


def test_lengths():
    a = B.lengths(1152, 1024, 0.5)
    assert len(a) == 1152 and min(a) >= 1 and max(a) <= 1024
    assert a == B.lengths(1152, 1024, 0.5)            # fixed seed
    assert a != B.lengths(1152, 1024, 0.5, seed=1)
    assert abs(sum(a) / len(a) - 512) < 40            # uniform in [1, L]
    assert B.lengths(100, 4096, 1.0) == [4096] * 100
    b = B.lengths(500, 4096, 0.75)
    assert min(b) >= 2048 and max(b) <= 4096
    assert B.cu_seqlens([3, 0, 2]) == [0, 3, 3, 5]


def test_shapes():
    full = B.shapes()
    assert len(full) == 16
    assert {(s["head_dim"], s["n_q"], s["max_len"], s["spread"]) for s in full} == {
        (d, q, L, s) for d in (128, 64) for q in (32, 128) for L in (1024, 4096)
        for s in (0.5, 1.0)}
    assert all(s["batch"] == 1152 and s["heads"] == 4 and not s["causal"] for s in full)
    # shortest L first, so a run cut by the budget covers every D and n_q
    assert [s["max_len"] for s in full] == [1024] * 8 + [4096] * 8
    quick = B.shapes(quick=True)
    assert len(quick) == 4 and {(s["max_len"], s["spread"]) for s in quick} == {(1024, 0.5)}
    assert len(B.shapes(quick=True, spreads=(1.0,), max_lens=(4096,))) == 4
    sub = B.shapes(head_dims=(64,), nqs=(128,), max_lens=(4096,), spreads=(1.0,))
    assert len(sub) == 1 and B.label(sub[0]) == "B1152 H4 D64 nq128 L4096 s1"
    assert B.label(B.shapes(causal=True)[0]) == "B1152 H4 D128 nq32 L1024 s0.5 causal"


def test_parse_list_and_args():
    assert B.parse_list("128,64") == (128, 64)
    assert B.parse_list(" 0.5, 1.0", float) == (0.5, 1.0)
    assert B.parse_list("") is None and B.parse_list(None) is None
    a = B.parse_args(["--quick", "--dims", "64", "--nq", "32,128", "--spread", "1.0",
                      "--budget", "300", "--out", "/tmp/x", "--peers", "fa2,flex"])
    assert a.quick and a.budget == 300 and a.out == "/tmp/x"
    assert B.parse_list(a.dims) == (64,) and B.parse_list(a.spread, float) == (1.0,)
    assert a.argv[0] == "--quick"
    with pytest.raises(SystemExit):
        B.parse_args(["--peers", "fa2,nope"])
    with pytest.raises(SystemExit):
        B.parse_args(["--dims", "x"])


def times(ag, **peers):
    t = {"attngen": dict(zip(B.PASSES, ag))}
    for k, v in peers.items():
        t[k] = dict(zip(B.PASSES, v))
    return t


def test_run_order():
    assert B.run_order() == list(B.IMPLS) and B.run_order()[0] == "fa2"
    swapped = B.run_order(det_first=True)
    assert swapped[0] == "fa2" and swapped.index("attngen_det") < swapped.index("attngen")
    assert sorted(swapped) == sorted(B.IMPLS)
    assert B.parse_args(["--det-first"]).det_first and not B.parse_args([]).det_first


def test_fastest_and_bar():
    t = times((1.0, 2.0, 3.0), fa2=(2.0, 5.0, 7.0), fa4=(1.6, 4.5, None), flex=(3.0, 3.9, 9.0))
    assert B.fastest(t, "fwd") == ("fa4", 1.6)
    assert B.fastest(t, "bwd") == ("flex", 3.9)
    assert B.fastest(t, "fwdbwd") == ("fa2", 7.0)
    assert B.fastest(t, "fwd", exclude=("fa4",)) == ("fa2", 2.0)
    bar = B.evaluate_bar(t)
    assert bar["fwd"]["ratio"] == pytest.approx(1.6) and bar["fwd"]["met"]
    assert bar["bwd"]["ratio"] == pytest.approx(1.95) and bar["bwd"]["met"] is False
    assert bar["met"] is False
    assert B.bar_text(bar) == "not met (bwd 1.95x < 2x)"
    ok = B.evaluate_bar(times((1.0, 2.0, 3.0), fa2=(1.5, 4.0, 6.0)))
    assert ok["met"] and B.bar_text(ok) == "met"
    # attngen itself is never "the fastest peer"
    assert B.fastest(times((0.1, 0.1, 0.1)), "fwd") == (None, None)
    none = B.evaluate_bar(times((1.0, 2.0, 3.0)))
    assert none["met"] is None and B.bar_text(none).startswith("n/a")
    fail = B.evaluate_bar({"fa2": {"fwd": 1.0, "bwd": 1.0}})
    assert fail["met"] is None
    both = B.evaluate_bar(times((2.0, 2.0, 4.0), fa2=(1.0, 1.0, 2.0)))
    assert B.bar_text(both) == "not met (fwd 0.50x < 1.5x, bwd 0.50x < 2x)"


def test_should_start():
    assert B.should_start(1e9, None)
    assert B.should_start(0.0, 100.0)
    assert B.should_start(50.0, 100.0, 40.0)
    assert not B.should_start(70.0, 100.0, 40.0)
    assert not B.should_start(100.0, 100.0)


def brute_lists(cu, kb, causal):
    batch, total = len(cu) - 1, cu[-1]
    nkv = -(-total // kb)
    partial = [set() for _ in range(batch)]
    full = [set() for _ in range(batch)]
    for b in range(batch):
        for j in range(nkv):
            keys = set(range(j * kb, min((j + 1) * kb, total)))
            seq = set(range(cu[b], cu[b + 1]))
            if keys & seq:
                inside = len(keys) == kb and keys <= seq and not causal
                (full if inside else partial)[b].add(j)
    return partial, full, nkv


def test_flex_block_lists():
    rng = random.Random(11)
    for trial in range(60):
        lens = [rng.choice([0, 1, 5, 16, 31, 32, 33, 64, 100]) for _ in range(rng.randint(1, 9))]
        cu = B.cu_seqlens(lens)
        kb = rng.choice([16, 32])
        for causal in (False, True):
            got = B.flex_block_lists(cu, kb, causal)
            partial, full, nkv = brute_lists(cu, kb, causal)
            assert got["num_kv_blocks"] == nkv
            assert [set(x) for x in got["kv_partial"]] == partial, (lens, kb, causal)
            assert [set(x) for x in got["kv_full"]] == full, (lens, kb, causal)
            for lst in got["kv_partial"] + got["kv_full"]:
                assert lst == sorted(lst)
            # the transposed lists hold the same pairs
            for name, q in (("kv_partial", "q_partial"), ("kv_full", "q_full")):
                pairs = {(b, j) for b, js in enumerate(got[name]) for j in js}
                tpairs = {(b, j) for j, bs in enumerate(got[q]) for b in bs}
                assert pairs == tpairs
                assert len(got[q]) == nkv
    # a sequence aligned to the blocks: all full but the unaligned tail
    got = B.flex_block_lists([0, 256, 300], 128)
    assert got["kv_full"] == [[0, 1], []] and got["kv_partial"] == [[], [2]]
    assert got["q_full"] == [[0], [0], []] and got["q_partial"] == [[], [], [1]]


def test_pad_lists():
    assert B.pad_lists([[3, 4], [], [7]]) == ([2, 0, 1], [[3, 4], [0, 0], [7, 0]])
    assert B.pad_lists([[], []]) == ([0, 0], [[0], [0]])


def record(lbl="B8 H4 D128 nq32 L64 s0.5"):
    lens = B.lengths(8, 64, 0.5)
    fl = {p: B.flops(32, lens, 128, 4, pass_=p) for p in B.PASSES}
    t = times((1.0, 2.0, 3.0), fa2=(1.5, 4.5, 6.0), fa4=(2.0, 3.0, None))
    t["attngen_det"] = {"fwd": 1.0, "bwd": 2.2, "fwdbwd": 3.2, "bitwise_repeat": True,
                        "first_call_s": 4.25}
    return {"label": lbl, "flops": fl, "times": t, "bar": B.evaluate_bar(t),
            "errors": {"attngen": {"out": 3e-3, "dq": 1e-3, "dk": 5e-2, "dv": 2e-3,
                                   "ref64": 2e-3},
                       "fa4": {"out": 1e-3, "ref64": float("nan")}},
            "err_out": 3e-3, "err_grads": 5e-2, "err_ref64": 2e-3,
            "notes": ["flex failed: x"]}


def cells(md, first, second=None):
    for line in md.splitlines():
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if c[0] == first and (second is None or (len(c) > 1 and c[1] == second)):
            return c
    raise AssertionError("no row %r %r in\n%s" % (first, second, md))


def test_markdown():
    rec = record()
    sh = B.shapes(quick=True)[0]
    md = B.markdown([rec], {"gpu": "test"}, "cmd", skipped=[(sh, "not run: budget")])
    row = cells(md, rec["label"])
    # attngen fwd | fastest fwd | ratio | bwd | fastest | ratio | fwdbwd | fastest | ratio | det | bar
    assert row[2].startswith("FA2 1.500") and row[3] == "1.50x"
    assert row[5].startswith("FA4 3.000") and row[6] == "1.50x"
    assert row[9] == "2.00x"
    assert row[10].startswith("2.200") and row[10].endswith("bitwise")
    assert row[11] == "not met (bwd 1.50x < 2x)"
    assert row[12] == "3.0e-03" and row[13] == "5.0e-02 !" and row[14] == "2.0e-03"
    fa2 = cells(md, rec["label"], "FA2")
    assert fa2[3] == "1.50x" and fa2[5] == "2.25x" and fa2[7] == "2.00x"
    fa4 = cells(md, rec["label"], "FA4")
    assert fa4[6] == "—" and fa4[7] == "—" and fa4[10] == "nan !"
    det = cells(md, rec["label"], "attngen det")
    assert det[5] == "1.10x" and det[11] == "4.2"
    ag = cells(md, rec["label"], "attngen")
    assert ag[3] == "—" and ag[9] == "5.0e-02 !"
    assert "flex failed: x" in md and "- gpu: test" in md
    assert "%s: not run: budget" % B.label(sh) in md
    json.dumps(rec)  # records are plain JSON


def test_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
            "sys.path.insert(0, %r)\n"
            "import broadcast_bench as B\n"
            "print(len(B.shapes()), B.visible_pairs(4, [4], causal=True))\n" % BENCH)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["16", "10"]


def test_help_runs_without_torch():
    r = subprocess.run([sys.executable, os.path.join(BENCH, "broadcast_bench.py"), "--help"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "--budget" in r.stdout and "--nq" in r.stdout


def test_rotary_script_help_runs_without_torch():
    """broadcast_rotary.py (fused against unfused rotary) imports torch only
    when it runs."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "sys.argv = ['broadcast_rotary.py', '--help']\n"
            "sys.path.insert(0, %r)\n"
            "import broadcast_rotary\n"
            "broadcast_rotary.main()\n" % BENCH)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "--nq" in r.stdout and "--seqlen" in r.stdout


# ---- the GPU side's plumbing on the CPU (skipped without torch) -------------------

class CpuEvent:
    """torch.cuda.Event's timing interface on the host clock."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        import time
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def varlen_reference(torch, q, k, v, cu_q, cu_k, causal):
    """Attention per sequence in fp32 (bottom-right causal), differentiable."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    outs = []
    for b in range(len(cq) - 1):
        qs, ks, vs = q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        s = torch.einsum("qhd,khd->hqk", qs.float(), ks.float()) / qs.shape[-1] ** 0.5
        if causal:
            lq, lk = qs.shape[0], ks.shape[0]
            i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
            s = s.masked_fill(j > i + lk - lq, float("-inf"))
        p = torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
        outs.append(torch.einsum("hqk,khd->qhd", p, vs.float()).to(q.dtype))
    return torch.cat(outs)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_dry_run(tmp_path, monkeypatch, causal):
    """run() end to end on CPU tensors: CUDA events and synchronize stood in
    for, attngen and FA2 replaced by a per-sequence reference, FA4 by one
    whose backward fails (its forward time and output check must remain),
    cuDNN's padding and key-padding mask through SDPA's default CPU
    backend; the report, the JSON, the error checks and the budget."""
    import contextlib
    import types
    torch = pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("numpy", reason="numpy is not installed")
    import jagged_bench as J

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", CpuEvent)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="cpu", multi_processor_count=0))
    monkeypatch.setattr(B, "DEVICE", "cpu")

    def broadcast_attention(q, k, v, cu_k, *, max_seqlen_k=None, window_size=(-1, -1),
                            causal=False, softmax_scale=None, deterministic=False,
                            return_lse=False):
        n_q, batch = q.shape[0], cu_k.numel() - 1
        cu_q = torch.arange(0, (batch + 1) * n_q, n_q, dtype=torch.int32)
        return varlen_reference(torch, B.expand_q(q, batch), k, v, cu_q, cu_k, causal)

    fake = types.ModuleType("attngen")
    fake.broadcast_attention = broadcast_attention
    fake._lib = types.SimpleNamespace(lib=lambda: types.SimpleNamespace(_name="fake"))
    monkeypatch.setitem(sys.modules, "attngen", fake)

    class Fa2:
        kind, name, context = "flash_attn", "reference fa2", contextlib.nullcontext

        def fn(self, q, k, v, cq, ck, mq, mk, causal=False):
            return varlen_reference(torch, q, k, v, cq, ck, causal)

    monkeypatch.setattr(J, "Fa2", Fa2)

    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("no backward here")

    def fa4(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
            max_seqlen_k=None, causal=False):
        out = varlen_reference(torch, q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
        return NoBackward.apply(out), None

    fa = types.ModuleType("flash_attn")
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func = fa4
    fa.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", fa)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    monkeypatch.setattr(B.Cudnn, "context", lambda self: contextlib.nullcontext())
    orig = B.shapes
    monkeypatch.setattr(B, "shapes", lambda *a, **k: [dict(s, batch=4, heads=2)
                                                      for s in orig(*a, **k)])

    out = tmp_path / "out"
    argv = ["--lengths", "40", "--spread", "0.5,1.0", "--dims", "64", "--nq", "16",
            "--peers", "fa2,fa4,cudnn", "--iters", "2", "--warmup", "1"]
    if causal:
        argv.append("--causal")
    assert B.main(argv + ["--out", str(out)]) == 0
    data = json.loads((out / "broadcast_bench.json").read_text())
    md = (out / "broadcast_bench.md").read_text()
    assert len(data["records"]) == 2 and data["not_run"] == []
    for r in data["records"]:
        t, e = r["times"], r["errors"]
        for key in ("fa2", "attngen", "attngen_det"):
            assert all(t[key].get(p) for p in B.PASSES), (key, t[key])
        assert t["attngen"]["bitwise_repeat"] is True
        # the reference attngen equals the reference FA2 exactly
        assert e["attngen"]["out"] == 0.0 and e["attngen"]["dq"] == 0.0
        for key in ("fa2", "attngen", "fa4"):
            assert e[key]["ref64"] < 1e-2
        # FA4: forward timed and checked, backward failed and noted
        assert t["fa4"].get("fwd") and "bwd" not in t["fa4"] and e["fa4"]["out"] == 0.0
        assert any(n.startswith("fa4 failed") for n in r["notes"])
        if causal:
            assert "cudnn" not in t and any("cudnn: not run causal" in n for n in r["notes"])
        else:
            assert all(t["cudnn"].get(p) for p in B.PASSES)
            assert max(e["cudnn"][g] for g in ("out", "dq", "dk", "dv")) < 1e-2
        assert r["bar"]["fwd"]["peer"] in ("fa2", "fa4", "cudnn")
        assert r["visible_pairs"] == B.visible_pairs(16, B.lengths(4, 40, r["shape"]["spread"]),
                                                     causal)
    assert "## Summary" in md and "- gpu: cpu" in md
    # the budget: nothing fits in a budget of 0, and that is reported
    assert B.main(argv + ["--out", str(out), "--budget", "0"]) == 0
    data = json.loads((out / "broadcast_bench.json").read_text())
    assert data["records"] == [] and len(data["not_run"]) == 2


def test_retime_forward():
    """The second round runs in reverse order, over those with a forward
    time only, and keeps the lower median with both recorded."""
    import contextlib

    class Impl:
        def __init__(self, name, calls):
            self.name, self.calls = name, calls

        def context(self):
            return contextlib.nullcontext()

        def __call__(self, q, k, v):
            self.calls.append(self.name)

    class Inp:
        q = k = v = None

    calls = []
    impls = {n: Impl(n, calls) for n in ("fa2", "attngen", "attngen_det", "fa4")}
    times = {"fa2": {"fwd": 1.0}, "attngen": {"fwd": 0.5, "bwd": 2.0},
             "attngen_det": {"fwd": 0.6}, "fa4": {"bwd": 3.0}}
    second = {"fa2": 1.2, "attngen": 0.55, "attngen_det": 0.5}

    def timer(fn):
        fn()
        return second[calls[-1]]

    B.retime_forward(impls, ["fa2", "attngen", "attngen_det", "fa4", "cudnn"], Inp(), times,
                     timer=timer, no_grad=contextlib.nullcontext)
    assert calls == ["attngen_det", "attngen", "fa2"]
    assert times["fa2"] == {"fwd": 1.0, "fwd_rounds": [1.0, 1.2]}
    assert times["attngen"]["fwd"] == 0.5 and times["attngen"]["fwd_rounds"] == [0.5, 0.55]
    assert times["attngen_det"]["fwd"] == 0.5 and times["attngen_det"]["fwd_rounds"] == [0.6, 0.5]
    assert times["fa4"] == {"bwd": 3.0}
    assert B.rounds_notes({"x": {"fwd_rounds": [1.0, 1.04]}, "y": {"fwd": 1.0}}) == []
    assert B.parse_args([]).fwd_rounds == 2 and B.parse_args(["--fwd-rounds", "1"]).fwd_rounds == 1
    for bad in ("0", "3", "two"):
        with pytest.raises(SystemExit):
            B.parse_args(["--fwd-rounds", bad])
    assert B.rounds_notes(times) == [
        "fa2: forward rounds 1.000 / 1.200 ms (the lower kept)",
        "attngen: forward rounds 0.500 / 0.550 ms (the lower kept)",
        "attngen_det: forward rounds 0.600 / 0.500 ms (the lower kept)"]


def test_retime_forward_failure():
    """One implementation's failed second round leaves it its first and the
    others go on; a CUDA failure is raised."""
    import contextlib

    class Impl:
        def __init__(self, exc=None):
            self.exc = exc

        def context(self):
            return contextlib.nullcontext()

        def __call__(self, q, k, v):
            if self.exc:
                raise self.exc

    class Inp:
        q = k = v = None

    impls = {"fa2": Impl(), "attngen": Impl(), "cudnn": Impl(RuntimeError("no plan"))}
    times = {"fa2": {"fwd": 1.0}, "attngen": {"fwd": 0.5}, "cudnn": {"fwd": 2.0}}

    def timer(fn):
        fn()
        return 0.9

    notes = B.retime_forward(impls, ["fa2", "attngen", "cudnn"], Inp(), times, timer=timer,
                             no_grad=contextlib.nullcontext)
    assert notes == ["cudnn: second forward round failed (one round kept): RuntimeError: no plan"]
    assert times["cudnn"] == {"fwd": 2.0}
    assert times["fa2"]["fwd"] == 0.9 and times["attngen"]["fwd_rounds"] == [0.5, 0.9]
    impls["cudnn"] = Impl(RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError):
        B.retime_forward(impls, ["fa2", "cudnn"], Inp(), {"cudnn": {"fwd": 1.0}}, timer=timer,
                         no_grad=contextlib.nullcontext)
