# SPDX-License-Identifier: BSD-3-Clause
"""CPU tests of bench/broadcast_ceiling.py: the least bytes of each pass
against a hand count, the verdicts on a made-up record whose floor is
known, and the H200 run of 2026-12-06 (session 31) read as the closing
note of session 32 states it.

    python3 -m pytest -q bench/tests/test_broadcast_ceiling.py
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
sys.path.insert(0, BENCH)

import broadcast_ceiling as C  # noqa: E402


def record(peer_fwd, ours_fwd, peer_bwd, ours_bwd):
    # 2 sequences of 1000 keys, 1 head of 64, 10 queries: K, V 256,000
    # bytes each; Q 1,280; O 2 * 10 * 64 * 2 = 2,560; logsumexp 80.
    return {"label": "toy", "total_k": 2000,
            "shape": {"batch": 2, "heads": 1, "head_dim": 64, "n_q": 10},
            "flops": {"fwd": 4 * 64 * 10 * 2000, "bwd": 2.5 * 4 * 64 * 10 * 2000},
            "times": {"fa2": {"fwd": peer_fwd, "bwd": peer_bwd},
                      "attngen": {"fwd": ours_fwd, "bwd": ours_bwd}}}


def test_least_bytes():
    r = record(1, 1, 1, 1)
    kv, q, o, lse = 256_000, 1_280, 2_560, 80
    assert C.least_bytes(r, "fwd") == q + 2 * kv + o + lse
    assert C.least_bytes(r, "bwd") == (q + 2 * kv + 2 * o + lse) + (q + 2 * kv)


def test_verdicts():
    r = record(1, 1, 1, 1)
    # 1 GB/s and a matmul rate that never binds: the floor in ms is
    # bytes / 1e9 * 1e3
    fwd_floor = C.least_bytes(r, "fwd") / 1e6
    bwd_floor = C.least_bytes(r, "bwd") / 1e6
    unit = 1e-3  # TB/s, TFLOP/s
    def run(peer_f, ours_f, peer_b, ours_b, meas=1.0):
        data = {"records": [record(peer_f, ours_f, peer_b, ours_b)]}
        return {x["pass"]: x for x in C.rows(data, unit, 1e9, unit * meas, 1e9)}
    out = run(1.4 * fwd_floor, 1.2 * fwd_floor, 1.9 * bwd_floor, 1.2 * bwd_floor)
    assert out["fwd"]["verdict"] == "impossible" and out["bwd"]["verdict"] == "impossible"
    assert abs(out["fwd"]["max_peak"] - 1.4) < 1e-9 and out["fwd"]["bound"] == "memory"
    assert abs(out["fwd"]["at_ceiling"] - 1 / 1.2) < 1e-9
    out = run(3 * fwd_floor, 2 * fwd_floor, 3 * bwd_floor, 1.4 * bwd_floor)
    assert out["fwd"]["verdict"] == "met" and out["bwd"]["verdict"] == "met"
    out = run(3 * fwd_floor, 2.5 * fwd_floor, 3 * bwd_floor, 2 * bwd_floor)
    assert out["fwd"]["verdict"] == "open" and out["bwd"]["verdict"] == "open"
    # possible at the peaks, not at rates measured at half of them
    out = run(2 * fwd_floor, 2 * fwd_floor, 3 * bwd_floor, 3 * bwd_floor, meas=0.5)
    assert out["fwd"]["verdict"] == "past the measured rates"
    # met is met, even past the measured rates (attngen beat them)
    out = run(2 * fwd_floor, 1.2 * fwd_floor, 3 * bwd_floor, 1.4 * bwd_floor, meas=0.5)
    assert out["fwd"]["verdict"] == "met" and out["bwd"]["verdict"] == "met"


def test_h200_session31():
    path = os.path.join(BENCH, "results", "2026-12-06-h200-broadcast-fa4-s31.json")
    out = C.rows(json.load(open(path)))
    assert len(out) == 32
    impossible = {(x["label"], x["pass"]) for x in out if x["verdict"] == "impossible"}
    assert len(impossible) == 11
    assert ("B1152 H4 D128 nq128 L4096 s1", "fwd") in impossible
    assert ("B1152 H4 D128 nq32 L4096 s1", "bwd") in impossible
    met = {(x["label"], x["pass"]) for x in out if x["verdict"] == "met"}
    assert ("B1152 H4 D64 nq32 L1024 s0.5", "bwd") in met
    assert all(x["bound"] == "memory" for x in out)


def test_matmul_bound():
    r = record(1, 1, 1, 1)
    out = C.rows({"records": [r]}, 1e9, 1e-3, 1e9, 1e-3)
    assert all(x["bound"] == "matmul" for x in out)
    fwd = [x for x in out if x["pass"] == "fwd"][0]
    # floor: FLOPs / 1 GFLOP/s, in ms
    assert abs(fwd["max_peak"] - 1.0 / (r["flops"]["fwd"] / 1e9 * 1e3)) < 1e-12


def test_bad_input(tmp_path):
    script = os.path.join(BENCH, "broadcast_ceiling.py")
    good = os.path.join(BENCH, "results", "2026-12-06-h200-broadcast-fa4-s31.json")
    bad_json = tmp_path / "x.json"
    bad_json.write_text("{}")
    cases = [([good, "--peak-bw", "0"], "--peak-bw must be a positive rate, not 0.0"),
             ([good, "--meas-mma", "-5"], "--meas-mma must be a positive rate, not -5.0"),
             ([good, "--meas-bw", "nan"], "--meas-bw must be a positive rate, not nan"),
             ([str(tmp_path / "none.json")], "is not a broadcast_bench.py JSON"),
             ([str(bad_json)], "is not a broadcast_bench.py JSON")]
    for args, message in cases:
        r = subprocess.run([sys.executable, script] + args, capture_output=True, text=True)
        assert r.returncode == 2 and message in r.stderr, (args, r.returncode, r.stderr)
    r = subprocess.run([sys.executable, script, good], capture_output=True, text=True)
    assert r.returncode == 0 and "11 of the 32" in r.stdout
