# SPDX-License-Identifier: BSD-3-Clause
"""CPU tests of bench.py's orchestration (no torch, no GPU): tasks of a
shape and a pass, worker crashes and restarts, unavailable peers and rows,
the reports of each pass, and the pure-Python pieces of peers/common.py.
The workers are bench/tests/fake_worker.py (ATTNGEN_BENCH_WORKER).

    python3 -m pytest -q bench/tests
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)

# bench.py, its workers and peers/common.py need numpy; without it these
# tests skip (and say so) instead of failing collection.
pytest.importorskip("numpy", reason="numpy is not installed")

from peers.common import BlockTable, Shape, Task, pass_stats, smoke_shapes  # noqa: E402


def run_bench(tmp_path, *args, plan=None, timeout=120):
    env = dict(os.environ, ATTNGEN_BENCH_WORKER=os.path.join(HERE, "fake_worker.py"),
               FAKE_WORKER_PLAN=json.dumps(plan or {}),
               FAKE_WORKER_STATE=str(tmp_path / "crashes.txt"))
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(BENCH, "bench.py"), "--out", str(out), "--no-plot",
           *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    js = [p for p in os.listdir(out) if p.endswith(".json")]
    assert len(js) == 1, os.listdir(out)
    with open(out / js[0]) as f:
        data = json.load(f)
    with open(out / js[0].replace(".json", ".md")) as f:
        md = f.read()
    return data, md, r.stdout, out


def results(data):
    return {(r["peer"], r["shape"], r["pass"]): r for r in data["results"]}


def test_pass_stats():
    sh = Shape(8, 2, 64, 200, 0.5, 64)
    st = BlockTable(sh.lengths(), 64).stats(2, 64, 2, False)
    one = st["tensor_bytes"]
    assert st["bytes"] == 4 * one
    assert pass_stats(st, "fwd") == st
    b = pass_stats(st, "bwd")
    assert b["bytes"] == 7 * one and b["flops"] == 2.5 * st["flops"]
    r = pass_stats(st, "rot")
    assert r["bytes"] == 11 * one + 2 * st["table_bytes"] and r["flops"] == 3.5 * st["flops"]
    assert st["table_bytes"] == one / 2  # [total, D] against [total, H=2, D]


def test_task_round_trip():
    sh = smoke_shapes()[1]
    t = Task(sh, "bwd")
    assert t.id == sh.id + "/bwd"
    assert Task.from_dict(json.loads(json.dumps(t.to_dict()))).id == t.id
    assert Task.from_dict(sh.to_dict()).pass_ == "fwd"  # a bare shape: the forward
    with pytest.raises(ValueError):
        Task(sh, "sideways")


def test_default_run_is_the_forward_alone(tmp_path):
    data, md, out, d = run_bench(tmp_path, "--smoke", "--peers", "ceilings,attngen,triton")
    assert data["mode"] == "smoke" and data["passes"] == ["fwd"]
    res = results(data)
    assert {k[2] for k in res} == {"fwd"}
    assert all(r["ok"] for r in res.values())
    # the forward report keeps its format: no pass column in the summary
    assert "| shape | blocks | attngen ms |" in md
    assert "Forward pass, non-causal" in md and "Backward pass" not in md


def test_same_size_streams_in_the_summary(tmp_path):
    """Each task's same-size stream (the ceilings worker gets every task) is
    listed, and attngen's time is given as a fraction of it: fake 0.8 ms
    against 1.0 forward, 1.6 against 2.0 backward."""
    data, md, out, d = run_bench(tmp_path, "--smoke", "--pass", "both", "--peers",
                                 "ceilings,attngen,triton")
    ids = {"same:%s/%s" % (s.id, p) for s in smoke_shapes() for p in ("fwd", "bwd")}
    assert ids <= set(data["ceilings"])
    assert "| shape | pass | blocks | attngen ms | attngen TB/s | %BW ceil | %same-size |" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| B64 ") and "| 80% |" in ln]
    assert len(rows) == 4  # two shapes, two passes, in the summary
    assert "Same-size streams" in md and md.count("| fake stream |") == 4


def test_a_failed_ceilings_worker_adds_no_task_rows(tmp_path):
    """The ceilings worker gets every task (for the same-size streams) but
    reports no task results: when it dies, an event says so and no row a
    task is recorded for it."""
    data, md, out, d = run_bench(tmp_path, "--smoke", "--pass", "both", "--peers",
                                 "ceilings,attngen", plan={"ceilings": "crash"})
    assert not [r for r in data["results"] if r["peer"] == "ceilings"]
    assert any(e.startswith("ceilings: worker failed") for e in data["events"])
    assert all(r["ok"] for r in data["results"] if r["peer"] == "attngen")
    assert "| %same-size |" in md and not data["ceilings"]


def test_both_passes_with_a_refused_backward_and_a_crash(tmp_path):
    sid = smoke_shapes()[1].id  # the smaller shape: it runs first, so tasks remain after it
    plan = {"attngen/bwd": "refused",                 # a refusal: a row, not a crash
            "sdpa_flash/%s/bwd" % sid: "crash",       # the worker dies on one task
            "flex": "unavailable"}
    data, md, out, d = run_bench(tmp_path, "--smoke", "--pass", "both", "--peers",
                                 "ceilings,attngen,sdpa_flash,triton,flex", plan=plan)
    assert data["mode"] == "smoke-fwd-bwd" and data["passes"] == ["fwd", "bwd"]
    res = results(data)
    shapes = [s.id for s in smoke_shapes()]
    for s in shapes:
        assert res[("attngen", s, "fwd")]["ok"]
        refused = res[("attngen", s, "bwd")]
        assert not refused["ok"] and refused["error"].startswith("unavailable: backward not supported")
        assert res[("triton", s, "bwd")]["ok"] and res[("triton", s, "fwd")]["ok"]
    crashed = res[("sdpa_flash", sid, "bwd")]
    assert not crashed["ok"] and "worker died" in crashed["error"]
    assert "illegal memory access" in crashed["error"]
    # the restarted worker did the remaining tasks, the crashed one only once
    other = [s for s in shapes if s != sid][0]
    assert res[("sdpa_flash", other, "fwd")]["ok"] and res[("sdpa_flash", other, "bwd")]["ok"]
    assert res[("sdpa_flash", sid, "fwd")]["ok"]
    assert open(tmp_path / "crashes.txt").read().split() == [sid + "/bwd"]
    assert any("restarted" in e for e in data["events"])
    assert "flex" in data["unavailable"]
    # the report: a pass column, both explanations, the refused row, gradient errors
    assert "| shape | pass | blocks | attngen ms |" in md
    assert "Backward pass (rows `bwd`)" in md and "read-4-write-3" in md
    assert "unavailable: backward not supported" in md
    assert "dq/dk/dv 1.0e-03/2.0e-03/5.0e-04 (max 2.0e-03)" in md
    assert "| unavailable |" in md  # attngen's summary cell for the refused backward
    # bwd TB/s: 7 tensors over the time; %BW against r4w3 (4.3 TB/s in the fake)
    tri = res[("triton", sid, "bwd")]
    tbps = tri["stats"]["bytes"] / tri["ms"] / 1e9
    assert "%.2f" % tbps in md
    # the index of a non-forward run does not replace RESULTS.md
    assert os.path.exists(d / "RESULTS-fwd-bwd.md") and not os.path.exists(d / "RESULTS.md")


def test_backward_only_and_speedups(tmp_path):
    data, md, out, d = run_bench(tmp_path, "--smoke", "--pass", "bwd", "--peers",
                                 "ceilings,attngen,triton,varlen_fa2")
    assert data["mode"] == "smoke-bwd"
    res = results(data)
    assert {k[2] for k in res} == {"bwd"}
    # attngen 2.0 ms, triton 2.2 ms: speedup 1.10x
    assert "**1.10x**" in md
    assert "Forward pass, non-causal" not in md


def test_rotary_pipeline_run(tmp_path):
    data, md, out, d = run_bench(tmp_path, "--smoke", "--rotary", "--peers",
                                 "attngen,triton", plan={"attngen/rot": "refused"})
    assert data["mode"] == "smoke-rotary" and data["passes"] == ["rot"]
    res = results(data)
    assert all(k[2] == "rot" for k in res)
    assert "Rotary pipeline (rows `rot`, EXPERIMENTAL)" in md
    assert "out/dq/dk/dv" in md


def test_a_worker_past_its_deadline_is_killed(tmp_path):
    sid = smoke_shapes()[0].id
    data, md, out, d = run_bench(tmp_path, "--smoke", "--pass", "bwd", "--peers", "triton",
                                 "--budget", "25", plan={"triton/%s/bwd" % sid: "slow"})
    res = results(data)
    r = res[("triton", sid, "bwd")]
    assert not r["ok"] and "timed out" in r["error"]
    assert any("killed at the time budget" in e for e in data["events"])


@pytest.mark.parametrize("value, why", [
    ("0", "must be a multiple of 16 in 16..256, got 0"),
    ("24", "must be a multiple of 16 in 16..256, got 24"),
    ("272", "must be a multiple of 16 in 16..256, got 272"),
    ("x", "invalid block size: 'x'"),
])
def test_bench_rejects_bad_block_sizes(value, why):
    # argparse's verdict before anything runs: exit 2, the reason.
    r = subprocess.run([sys.executable, os.path.join(BENCH, "bench.py"), "--smoke", "--block",
                        value], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "argument --block: " + why in r.stderr and "usage: bench.py" in r.stderr


def test_block_option_reaches_every_shape(tmp_path):
    data, md, out, d = run_bench(tmp_path, "--smoke", "--block", "128",
                                 "--peers", "ceilings,attngen")
    shapes = {r["shape"] for r in data["results"] if r["peer"] == "attngen"}
    assert shapes and all("_blk128_" in s for s in shapes)


def test_attngen_alternatives_run_when_named_and_are_no_peer(tmp_path):
    """attngen_jagged (the block route through the jagged kernels) runs
    only when --peers names it, shows in the tables beside attngen, and is
    never the fastest peer, though faster here (0.9 ms against 1.0)."""
    data, md, out, d = run_bench(tmp_path, "--smoke", "--peers", "ceilings,attngen,triton")
    assert not any(r["peer"] == "attngen_jagged" for r in data["results"])
    data, md, out, d = run_bench(tmp_path, "--smoke", "--peers",
                                 "ceilings,attngen,attngen_jagged,triton")
    assert any(r["peer"] == "attngen_jagged" and r["ok"] for r in data["results"])
    assert "| attngen_jagged |" in md and "0.90x" in md
    assert "attngen_jagged" not in out.split("Summary")[-1]  # triton is the fastest peer


@pytest.mark.parametrize("args, why", [
    (["--dim", "96"], "invalid choice: 96"),
    (["--seqlen", "0"], "must be at least 1, got 0"),
    (["--launches", "x"], "invalid positive value: 'x'"),
])
def test_peer_profile_rejects_bad_arguments(args, why):
    # Reported by argparse before torch is imported: exit 2, the reason.
    r = subprocess.run([sys.executable, os.path.join(BENCH, "peer_profile.py"), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert why in r.stderr and "usage: peer_profile.py" in r.stderr


def test_overhead_refuses_a_call_count_below_one(capsys):
    import overhead
    for bad in ("0", "-3", "x"):
        with pytest.raises(SystemExit) as e:
            overhead.main(["--calls", bad])
        assert e.value.code == 2
        assert "--calls" in capsys.readouterr().err


def test_overhead_host_time_behind_a_sleep(monkeypatch):
    """host_us_busy queues the sleep before each loop, times the calls
    alone, and says None for a call that waited (the sleep's event done
    by the loop's end)."""
    import types
    import overhead
    log = []
    state = {"ended": False}

    class Event:
        def record(self):
            log.append(("record",))

        def query(self):
            return state["ended"]

    cuda = types.SimpleNamespace(_sleep=lambda c: log.append(("sleep", c)),
                                 synchronize=lambda: log.append(("sync",)), Event=Event)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    calls = []
    us = overhead.host_us_busy(lambda: calls.append(1), n=10, warmup=2)
    assert us is not None and 0 <= us < 1000
    assert len(calls) == 2 + 5 * 10
    assert [e[0] for e in log].count("sleep") == 5
    assert log[0] == ("sync",) and log[1][0] == "sleep"  # warm-up, then sleep before a loop
    assert log[2] == ("record",)  # the event right behind the sleep
    state["ended"] = True
    assert overhead.host_us_busy(lambda: None, n=10, warmup=0) is None
    assert overhead._us(None) == "-" and overhead._us(12.34) == "12.3"
