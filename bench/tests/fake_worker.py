#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""A stand-in for `bench.py --worker NAME` that needs no torch and no GPU:
it reads the task file and reports made-up records in the worker protocol
(@@-prefixed JSON lines), so the orchestrator's process handling, task
bookkeeping and reports can be tested on a CPU (bench/tests/test_harness.py).

FAKE_WORKER_PLAN (JSON) picks what each peer does on a task, keyed
"peer" or "peer/pass" or "peer/<shape id>/<pass>": "ok" (default), "crash"
(the process dies mid-task, as an illegal memory access would make it),
"unavailable" (the whole peer), "refused" (the row says unavailable, as
attngen's backward does for a shape validation refuses), "nan", "slow"
(sleeps far past any budget).
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from peers.common import BlockTable, Task, pass_stats  # noqa: E402


def emit(rec):
    sys.stdout.write("@@" + json.dumps(rec) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--tasks")
    ap.add_argument("--mode")
    args = ap.parse_args()
    plan = json.loads(os.environ.get("FAKE_WORKER_PLAN", "{}"))
    crashed_file = os.environ.get("FAKE_WORKER_STATE")
    with open(args.tasks) as f:
        tasks = [Task.from_dict(d) for d in json.load(f)]
    name = args.worker
    if name == "ceilings":
        emit({"type": "env", "full": True, "gpu": "NVIDIA Fake", "torch": "0.0"})
        if plan.get("ceilings") == "crash":  # dies before any ceiling, as a bad driver would
            sys.stderr.write("RuntimeError: CUDA error: unknown error\n")
            sys.stderr.flush()
            os._exit(134)
        for n, tb in (("copy", 4.2), ("r3w1", 4.5), ("r4w3", 4.3)):
            emit({"type": "ceiling", "name": n, "ok": True, "ms": 1.0, "tbps": tb, "config": "x"})
        emit({"type": "ceiling", "name": "matmul", "ok": True, "ms": 1.0, "tflops": 700.0})
        for t in tasks:  # same-size streams: 0.8 ms for a forward, 1.6 for a backward
            if t.pass_ in ("fwd", "bwd"):
                ms = 0.8 if t.pass_ == "fwd" else 1.6
                emit({"type": "ceiling", "name": "same:" + t.id, "ok": True, "ms": ms,
                      "tbps": 4.0, "config": "fake stream"})
        emit({"type": "done"})
        return 0
    emit({"type": "env", "gpu": "NVIDIA Fake", "torch": "0.0", "cuda": "0"})
    if plan.get(name) == "unavailable":
        emit({"type": "unavailable", "reason": "fake: not installed"})
        return 0
    for t in tasks:
        sh = t.shape
        what = plan.get("%s/%s/%s" % (name, sh.id, t.pass_)) or plan.get("%s/%s" % (name, t.pass_)) \
            or plan.get(name) or "ok"
        emit({"type": "start", "task": t.id, "shape": sh.id, "pass": t.pass_})
        if what == "crash":
            # crash once per task (a restarted worker gets past it only if the
            # orchestrator dropped the task, which is what is tested)
            sys.stderr.write("RuntimeError: CUDA error: an illegal memory access was encountered\n")
            sys.stderr.flush()
            if crashed_file:
                with open(crashed_file, "a") as f:
                    f.write(t.id + "\n")
            os._exit(134)
        if what == "slow":
            time.sleep(3600)
        table = BlockTable(sh.lengths(), sh.block)
        stats = pass_stats(table.stats(sh.heads, sh.head_dim, 2, sh.causal), t.pass_)
        rec = {"type": "result", "peer": name, "shape": sh.id, "pass": t.pass_, "stats": stats}
        if what == "refused":
            rec.update(ok=False, error="unavailable: backward not supported (<dict>:8:1: error: "
                       "not supported yet: the backward pass at block_size 256 with head_dim 128 "
                       "(...))")
        else:
            ms = {"attngen": 1.0, "triton": 1.1, "attngen_jagged": 0.9}.get(name, 1.5) * \
                (2.0 if t.pass_ != "fwd" else 1.0)
            rec.update(ok=True, ms=ms, ms_min=ms, iters=20, err=1e-3, nan=(what == "nan"),
                       err_blocks=64, exact="all", config="fake", note="", extra={})
            if t.pass_ != "fwd":
                rec["errs"] = {"dq": 1e-3, "dk": 2e-3, "dv": 5e-4}
                if t.pass_ == "rot":
                    rec["errs"]["out"] = 3e-4
                rec["err"] = max(rec["errs"].values())
        emit(rec)
    emit({"type": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
