#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""bench.py: attngen against every available peer on the same inputs, one table.

    python bench/bench.py --quick --out DIR     # < 2 min on an H200
    python bench/bench.py --out DIR             # full ads sweep, < 8 min
    python bench/bench.py --smoke --out DIR     # tiny shapes, checks the pipeline
    python bench/bench.py --quick --pass bwd    # the backward (fwd|bwd|both; default fwd)
    python bench/bench.py --quick --rotary      # forward+backward with rotary (experimental)

The orchestrator (this process; it never imports torch) runs each peer in a
worker subprocess of its own (`bench.py --worker NAME`), which runs all of the
peer's tasks (a shape and a pass each) and reports one JSON record per line.
A worker that dies (an illegal memory access kills the CUDA context) loses
only the task it was on: it is restarted on the remaining ones. Every shape is timed with CUDA
events (median of >= 20 after warm-up) and checked against a float64
reference on a sample of blocks; disagreeing results are flagged. Partial
results are written to --out after every record, the Markdown report after
every peer, the plot at the end. See bench/README.md.
"""

import argparse
import collections
import datetime
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from peers import OPT_IN as PEER_OPT_IN, ORDER as PEER_ORDER  # noqa: E402
from peers.ceilings import same_size_name  # noqa: E402
from peers.common import (ERR_FLAG, ROTARY_PEER_ENV, Task, ads_shapes,  # noqa: E402
                          quick_shapes, rotary_peer_kind, smoke_shapes)

T0 = time.perf_counter()


def log(msg):
    print("[%6.1fs] %s" % (time.perf_counter() - T0, msg), flush=True)


# =============================================================================
# worker (imports torch)
# =============================================================================

def _emit(rec):
    sys.stdout.write("@@" + json.dumps(rec) + "\n")
    sys.stdout.flush()


def _wlog(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _cuda_healthy():
    import torch
    try:
        torch.cuda.synchronize()
        x = torch.ones(4, device="cuda")
        return float((x + 1).sum().item()) == 8.0
    except Exception:
        return False


def _error_text(e):
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return ("%s: %s" % (type(e).__name__, first))[:400]


def _run_forward(peer, data, mode, rec, t0):
    import torch
    from peers.common import Reference, timed_iters
    ref = Reference(data)
    prep = peer.prepare(data, mode)
    rec["prepare_s"] = round(time.perf_counter() - t0, 3)
    with prep.context():
        out = prep.run(0)
        torch.cuda.synchronize()
        nan = bool(torch.isnan(out).any().item())
        err, nchecked = ref.error(prep.rows, out, prep.exact)
        del out
        med, lo, iters = timed_iters(prep.run, data.nsets, mode)
    rec.update(ok=True, ms=med, ms_min=lo, iters=iters, err=err, nan=nan,
               err_blocks=nchecked, exact=prep.exact, config=prep.config,
               note=prep.note, extra=prep.extra)


def _run_grad(peer, data, mode, rec, t0, pass_):
    """The backward (bwd) or the rotary pipeline (rot) of one shape: errors of
    dq, dk, dv (and of the output for rot) against float64, then the timing."""
    import torch
    from peers.common import Reference, timed_iters
    ref = Reference(data, grads=True, rotary=(pass_ == "rot"))
    prep = peer.prepare_backward(data, mode) if pass_ == "bwd" else peer.prepare_rotary(data, mode)
    rec["prepare_s"] = round(time.perf_counter() - t0, 3)
    with prep.context():
        if prep.pre is not None:
            prep.pre(0)
        if prep.check is not None:
            out, grads = prep.check(0)
        else:
            out, grads = None, prep.run(0)
        torch.cuda.synchronize()
        checked = list(grads) + ([out] if out is not None else [])
        nan = any(bool(torch.isnan(t).any().item()) for t in checked)
        errs, nchecked = ref.grad_errors(prep.rows, grads, prep.exact)
        if out is not None:
            errs["out"], _ = ref.error(prep.out_rows, out, prep.exact)
        del out, grads, checked
        med, lo, iters = timed_iters(prep.run, data.nsets, mode, pre=prep.pre)
    rec.update(ok=True, ms=med, ms_min=lo, iters=iters, err=max(errs.values()), errs=errs,
               nan=nan, err_blocks=nchecked, exact=prep.exact, config=prep.config,
               note=prep.note, extra=prep.extra)


def worker_main(args):
    import gc

    import torch

    from peers import load
    from peers.common import ShapeData, Unavailable, pass_stats

    with open(args.tasks) as f:
        tasks = [Task.from_dict(d) for d in json.load(f)]
    mode = args.mode
    if not torch.cuda.is_available():
        _emit({"type": "unavailable", "reason": "torch sees no CUDA device"})
        return 0

    if args.worker == "ceilings":
        from peers import ceilings
        _emit(dict(type="env", full=True, **ceilings.environment()))
        ceilings.measure(mode, _emit)
        ceilings.measure_same_size(tasks, mode, _emit)
        _emit({"type": "done"})
        return 0

    props = torch.cuda.get_device_properties(0)
    _emit({"type": "env", "gpu": props.name, "torch": torch.__version__, "cuda": torch.version.cuda})
    peer = load(args.worker)
    try:
        peer.setup(mode)
    except Unavailable as e:
        _emit({"type": "unavailable", "reason": str(e)})
        return 0
    if hasattr(peer, "precompile"):
        try:
            s = peer.precompile(tasks)
            _emit({"type": "info", "precompile_s": round(s, 2)})
        except Exception as e:
            _wlog("precompile failed: %s" % _error_text(e))

    data = None  # kept across the passes of one shape (tasks come grouped by shape)
    for task in tasks:
        shape, pass_ = task.shape, task.pass_
        _emit({"type": "start", "task": task.id, "shape": shape.id, "pass": pass_})
        _wlog("start %s" % task.label)
        rec = {"type": "result", "shape": shape.id, "pass": pass_, "peer": args.worker}
        broken = failed = False
        t0 = time.perf_counter()
        try:
            if data is not None and data.shape.id != shape.id:
                data.free()
                data = None
                gc.collect()
                torch.cuda.empty_cache()
            if data is None:
                data = ShapeData(shape)
            rec["stats"] = pass_stats(data.stats, pass_)
            if pass_ == "fwd":
                _run_forward(peer, data, mode, rec, t0)
            else:
                _run_grad(peer, data, mode, rec, t0, pass_)
        except Unavailable as e:
            rec.update(ok=False, error="unavailable: %s" % e)
        except Exception as e:
            failed = True
            rec.update(ok=False, error=_error_text(e))
            _wlog("".join(traceback.format_exception(type(e), e, e.__traceback__))[-3000:])
            broken = not _cuda_healthy()
        finally:
            if failed and data is not None:  # e.g. out of memory: start the next task afresh
                data.free()
                data = None
            gc.collect()
            try:
                torch.cuda.empty_cache()
            except Exception:
                broken = True
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        _emit(rec)
        if broken:
            _wlog("CUDA context unusable after this error; exiting so the harness restarts")
            sys.stdout.flush()
            os._exit(3)
    if data is not None:
        data.free()
    _emit({"type": "done"})
    return 0


# =============================================================================
# orchestrator (no torch)
# =============================================================================

PASS_NAMES = {"fwd": "forward", "bwd": "backward", "rot": "forward+backward with rotary"}


def task_key(rec):
    """The task id of a record ("<shape id>/<pass>"; records without a pass
    are forward ones)."""
    return "%s/%s" % (rec["shape"], rec.get("pass", "fwd"))


class State:
    """Everything measured so far; written to --out as it grows."""

    def __init__(self, args, shapes, mode, passes=("fwd",), worker_mode=None):
        self.args, self.shapes, self.mode = args, shapes, mode
        self.passes = list(passes)
        self.worker_mode = worker_mode or mode
        self.shape_by_id = {s.id: s for s in shapes}
        self.env = {}
        self.ceilings = {}
        self.results = {}          # (peer, shape_id) -> record
        self.unavailable = {}      # peer -> reason
        self.events = []           # crashes, timeouts, restarts
        self.worker_wall = {}      # peer -> seconds
        self.info = collections.defaultdict(dict)
        self.date = datetime.date.today().isoformat()
        self.command = "python " + shlex.join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:])

    def add(self, rec):
        rec.setdefault("pass", "fwd")
        self.results[(rec["peer"], rec["shape"], rec["pass"])] = rec

    def get(self, peer, shape_id, pass_):
        return self.results.get((peer, shape_id, pass_))

    def gpu_slug(self):
        name = self.env.get("gpu") or "unknown-gpu"
        name = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.I)
        return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"

    def stem(self):
        return "%s-%s-%s" % (self.date, self.gpu_slug(), self.mode)

    def to_json(self):
        return {
            "date": self.date, "mode": self.mode, "passes": self.passes,
            "command": self.command, "env": self.env,
            "ceilings": self.ceilings, "unavailable": self.unavailable, "events": self.events,
            "worker_wall_s": self.worker_wall, "info": self.info,
            "shapes": [dict(s.to_dict(), id=s.id, label=s.label) for s in self.shapes],
            "results": list(self.results.values()),
        }


def _reader(stream, tag, q):
    for line in iter(stream.readline, ""):
        q.put((tag, line.rstrip("\n")))
    q.put((tag, None))


def run_worker(state, name, tasks, deadline):
    """Run one peer over its tasks (shape, pass) in subprocesses, restarting
    after crashes."""
    remaining = list(tasks)
    restarts = 0
    t_start = time.perf_counter()
    workdir = os.path.join(state.args.out, ".work")
    os.makedirs(workdir, exist_ok=True)

    def fail(task_id, error):
        if name == "ceilings":  # it reports no task results; its events say what failed
            return
        shape_id, _, pass_ = task_id.rpartition("/")
        state.add({"type": "result", "peer": name, "shape": shape_id, "pass": pass_,
                   "ok": False, "error": error})

    while remaining:
        left = deadline - time.perf_counter()
        if left < 3:
            for t in remaining:
                fail(t.id, "not run: time budget spent")
            state.events.append("%s: %d task(s) not run (time budget)" % (name, len(remaining)))
            break
        task_file = os.path.join(workdir, "%s.json" % name)
        with open(task_file, "w") as f:
            json.dump([t.to_dict() for t in remaining], f)
        # ATTNGEN_BENCH_WORKER: another worker script (the harness's own CPU tests)
        script = os.environ.get("ATTNGEN_BENCH_WORKER") or os.path.abspath(__file__)
        cmd = [sys.executable, script, "--worker", name, "--tasks", task_file,
               "--mode", state.worker_mode]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO, env=env, start_new_session=True, bufsize=1)
        q = queue.Queue()
        threads = [threading.Thread(target=_reader, args=(proc.stdout, "out", q), daemon=True),
                   threading.Thread(target=_reader, args=(proc.stderr, "err", q), daemon=True)]
        for t in threads:
            t.start()
        open_streams, current, done, finished, started = 2, None, set(), False, False
        tail = collections.deque(maxlen=25)      # worker stdout noise
        err_tail = collections.deque(maxlen=25)  # worker stderr
        timed_out = False
        unavailable = False
        while open_streams:
            try:
                tag, line = q.get(timeout=max(0.1, deadline - time.perf_counter()))
            except queue.Empty:
                timed_out = True
                break
            if line is None:
                open_streams -= 1
                continue
            if tag == "out" and line.startswith("@@"):
                try:
                    rec = json.loads(line[2:])
                except ValueError:
                    tail.append(line)
                    continue
                kind = rec.get("type")
                if kind == "start":
                    current = rec.get("task") or task_key(rec)
                    started = True
                elif kind == "result":
                    done.add(task_key(rec))
                    current = None
                    state.add(rec)
                    _progress(state, rec)
                    write_json(state)
                elif kind == "unavailable":
                    unavailable = True
                    state.unavailable[name] = rec["reason"]
                    log("%s: unavailable: %s" % (name, rec["reason"]))
                    break
                elif kind == "env":
                    rec.pop("type")
                    if rec.pop("full", False):
                        state.env.update(rec)
                        log("env: %s" % ", ".join("%s=%s" % kv for kv in rec.items()))
                    else:
                        for k, v in rec.items():
                            state.env.setdefault(k, v)
                elif kind == "done":
                    finished = True
                    break
                elif kind == "ceiling":
                    state.ceilings[rec["name"]] = rec
                    _progress_ceiling(rec)
                    write_json(state)
                elif kind == "info":
                    rec.pop("type")
                    state.info[name].update(rec)
                    log("%s: %s" % (name, rec))
            else:
                (err_tail if tag == "err" else tail).append(line)
                if tag == "err" or line.strip():
                    print("    [%s] %s" % (name, line), flush=True)
            if time.perf_counter() > deadline:
                timed_out = True
                break
        if timed_out:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            rc = proc.wait(timeout=10 if (finished or unavailable) else 30)
        except subprocess.TimeoutExpired:  # e.g. stuck tearing down after "done"
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            rc = None
        if unavailable or finished:
            break
        if timed_out:
            if current:
                fail(current, "timed out (time budget)")
                done.add(current)
            for t in remaining:
                if t.id not in done:
                    fail(t.id, "not run: time budget spent")
            state.events.append("%s: killed at the time budget on %s" % (name, current or "-"))
            log("%s: time budget reached; worker killed" % name)
            break
        lines = [x for x in err_tail if x.strip()] or [x for x in tail if x.strip()]
        errs = [x for x in lines if re.search(r"error|Error|illegal|fault|Abort", x)]
        why = ((errs or lines or ["no output"])[-1]).strip()[:300]
        if not started:
            # Died before its first task (import error, no device, ...):
            # restarting would only fail the same way.
            for t in remaining:
                fail(t.id, "worker failed to start (exit %s): %s" % (rc, why))
            state.events.append("%s: worker failed to start (exit %s): %s" % (name, rc, why))
            log("%s: worker failed to start (exit %s): %s" % (name, rc, why))
            break
        if current is not None:
            msg = "worker died (exit %s) on this task: %s" % (rc, why)
            fail(current, msg)
            state.events.append("%s: worker died on %s (exit %s)" % (name, current, rc))
            log("%s: %s" % (name, msg))
            done.add(current)
        remaining = [t for t in remaining if t.id not in done]
        if remaining:
            if rc == 0 and current is None:
                # exited cleanly without covering everything: should not happen
                state.events.append("%s: worker exited early; %d task(s) left" % (name, len(remaining)))
            restarts += 1
            if restarts > 6:
                for t in remaining:
                    fail(t.id, "not run: worker kept dying")
                break
            state.events.append("%s: restarted on %d remaining task(s)" % (name, len(remaining)))
            log("%s: restarting on %d remaining task(s)" % (name, len(remaining)))
    state.worker_wall[name] = round(time.perf_counter() - t_start, 1)
    write_json(state)


def _progress(state, rec):
    sh = state.shape_by_id.get(rec["shape"])
    label = sh.label if sh else rec["shape"]
    if rec.get("pass", "fwd") != "fwd" or state.passes != ["fwd"]:
        label += " " + rec.get("pass", "fwd")
    if rec.get("ok"):
        st = rec.get("stats", {})
        tb = st.get("bytes", 0) / rec["ms"] / 1e9 if rec["ms"] else 0
        flag = "  FLAGGED" if _flagged(rec) else ""
        log("%-14s %-32s %8.3f ms %6.2f TB/s  err %.1e%s  (%s)" % (
            rec["peer"], label, rec["ms"], tb, rec.get("err", float("nan")), flag,
            rec.get("config", "")))
    else:
        log("%-14s %-32s FAILED: %s" % (rec["peer"], label, rec.get("error")))


def _progress_ceiling(rec):
    if rec.get("ok"):
        val = ("%.2f TB/s" % rec["tbps"]) if "tbps" in rec else ("%.0f TFLOP/s" % rec["tflops"])
        log("ceiling %-8s %8.3f ms  %s  (%s)" % (rec["name"], rec["ms"], val, rec.get("config", "")))
    else:
        log("ceiling %-8s FAILED: %s" % (rec["name"], rec.get("error")))


def _flagged(rec):
    return rec.get("ok") and (rec.get("nan") or not (rec.get("err", 0) <= ERR_FLAG))


# ---- report -------------------------------------------------------------------

def fwd_ceiling(state):
    vals = [state.ceilings[n]["tbps"] for n in ("copy", "r3w1")
            if state.ceilings.get(n, {}).get("ok")]
    return max(vals) if vals else None


def bwd_ceiling(state):
    """The read-4-write-3 stream kernel's bandwidth (the backward's traffic),
    else the copy's."""
    for n in ("r4w3", "copy"):
        if state.ceilings.get(n, {}).get("ok"):
            return state.ceilings[n]["tbps"]
    return None


def bw_ceiling(state, pass_):
    return fwd_ceiling(state) if pass_ == "fwd" else bwd_ceiling(state)


def mm_ceiling(state):
    c = state.ceilings.get("matmul", {})
    return c.get("tflops") if c.get("ok") else None


def _ms(x):
    return "%.4g" % x


def _f(x, fmt, none="—"):
    return none if x is None else fmt % x


def _multi(state):
    """Whether the report must say which pass a row is (anything but the
    forward alone)."""
    return state.passes != ["fwd"]


def shape_summary(state):
    """Per (shape, pass): attngen record, fastest valid peer (name, record),
    speedup. Returns (shape, pass, ag, best, speed) tuples."""
    out = []
    for s in state.shapes:
        for ps in state.passes:
            ag = state.get("attngen", s.id, ps)
            ag_ok = ag if ag and ag.get("ok") and not _flagged(ag) else None
            best = None
            for p in PEER_ORDER:
                if p.startswith("attngen"):  # attngen and its own alternatives
                    continue
                r = state.get(p, s.id, ps)
                if r and r.get("ok") and not _flagged(r) and (best is None or r["ms"] < best[1]["ms"]):
                    best = (p, r)
            speed = best[1]["ms"] / ag_ok["ms"] if (ag_ok and best) else None
            out.append((s, ps, ag, best, speed))
    return out


def _err_text(r):
    """The error cell: the max relative error, and for gradient passes each
    gradient's (dq/dk/dv, and out for the rotary pipeline)."""
    err = "%.1e" % r["err"]
    errs = r.get("errs")
    if errs:
        names = [n for n in ("out", "dq", "dk", "dv") if n in errs]
        err = "%s %s %s" % ("/".join(names), "/".join("%.1e" % errs[n] for n in names),
                            "(max %.1e)" % r["err"])
    if r.get("nan"):
        err += " NaN"
    if _flagged(r):
        err = "**FLAGGED** " + err
    if r.get("exact") == "full_blocks":
        err += " (full blocks)"
    return err


def table_rows(state):
    """The main table: one row per (shape, pass, implementation)."""
    mm = mm_ceiling(state)
    rows = []
    for s in state.shapes:
        for ps in state.passes:
            bw = bw_ceiling(state, ps)
            ag = state.get("attngen", s.id, ps)
            ag_ms = ag["ms"] if ag and ag.get("ok") and not _flagged(ag) else None
            for p in PEER_ORDER:
                r = state.get(p, s.id, ps)
                if r is None:
                    continue
                if not r.get("ok"):
                    rows.append([s.label, ps, p, "—", "—", "—", "—", "—", "—", "—",
                                 "ERROR: " + str(r.get("error", ""))[:160]])
                    continue
                st = r.get("stats", {})
                tbps = st.get("bytes", 0) / r["ms"] / 1e9
                tflops = st.get("flops", 0) / r["ms"] / 1e9
                speed = "%.2fx" % (r["ms"] / ag_ms) if (ag_ms and p != "attngen") else "—"
                note = r.get("config", "")
                if r.get("note"):
                    note += "; " + r["note"]
                ex = r.get("extra") or {}
                for key in ("block_mask_ms", "first_call_s", "first_build_s"):
                    if key in ex:
                        note += "; %s=%s" % (key, ex[key])
                rows.append([s.label, ps, p, _ms(r["ms"]), "%.2f" % tbps,
                             _f(tbps / bw * 100 if bw else None, "%.0f%%"), "%.1f" % tflops,
                             _f(tflops / mm * 100 if mm else None, "%.1f%%"), _err_text(r),
                             speed, note])
    return rows


HEAD_MAIN = ["shape", "pass", "impl", "ms", "TB/s", "%BW ceil", "TFLOP/s", "%MM ceil",
             "max rel err", "attngen speedup", "config / notes"]
HEAD_SUM = ["shape", "blocks", "attngen ms", "attngen TB/s", "%BW ceil", "%same-size",
            "fastest peer", "peer ms", "speedup"]


def head_sum(state):
    return HEAD_SUM[:1] + ["pass"] + HEAD_SUM[1:] if _multi(state) else HEAD_SUM


def same_size_record(state, shape, pass_):
    """The same-size stream's record of (shape, pass), measured or failed;
    None where not measured."""
    return state.ceilings.get(same_size_name(Task(shape, pass_).id))


def same_size(state, shape, pass_):
    """The same-size stream's record of (shape, pass) when measured."""
    c = same_size_record(state, shape, pass_)
    return c if c and c.get("ok") else None


def summary_rows(state):
    rows = []
    for s, ps, ag, best, speed in shape_summary(state):
        bw = bw_ceiling(state, ps)
        same = same_size(state, s, ps)
        st = (ag or {}).get("stats") or (best[1].get("stats") if best else {}) or {}
        nb = st.get("nblocks")
        if ag and ag.get("ok"):
            tb = st.get("bytes", 0) / ag["ms"] / 1e9
            ag_ms = _ms(ag["ms"]) + (" FLAGGED" if _flagged(ag) else "")
            ag_tb, ag_frac = "%.2f" % tb, _f(tb / bw * 100 if bw else None, "%.0f%%")
            ag_same = _f(same["ms"] / ag["ms"] * 100 if same else None, "%.0f%%")
        elif ag and str(ag.get("error", "")).startswith("unavailable"):
            ag_ms, ag_tb, ag_frac, ag_same = "unavailable", "—", "—", "—"
        else:
            ag_ms, ag_tb, ag_frac, ag_same = ("error" if ag else "—"), "—", "—", "—"
        row = [s.label, _f(nb, "%d"), ag_ms, ag_tb, ag_frac, ag_same,
               best[0] if best else "—", _ms(best[1]["ms"]) if best else "—",
               _f(speed, "**%.2fx**")]
        if _multi(state):
            row.insert(1, ps)
        rows.append(row)
    return rows


def same_size_rows(state):
    """One row a (shape, pass) whose same-size stream was measured."""
    rows = []
    for s in state.shapes:
        for ps in state.passes:
            c = same_size_record(state, s, ps)
            if not c:
                continue
            if not c.get("ok"):
                rows.append([s.label, ps, "—", "—", "ERROR: " + c.get("error", "")])
            else:
                rows.append([s.label, ps, "%.4f" % c["ms"], "%.2f" % c["tbps"],
                             c.get("config", "")])
    return rows


def ceiling_rows(state):
    rows = []
    for n in ("copy", "r3w1", "r4w3", "matmul"):
        c = state.ceilings.get(n)
        if not c:
            rows.append([n, "—", "—", "—", "not measured"])
        elif not c.get("ok"):
            rows.append([n, "—", "—", "—", "ERROR: " + c.get("error", "")])
        else:
            rows.append([n, "%.3f" % c["ms"], _f(c.get("tbps"), "%.2f"), _f(c.get("tflops"), "%.0f"),
                         c.get("config", "")])
    return rows


def md_table(head, rows):
    esc = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def text_table(head, rows, maxw=60):
    cells = [[str(c).replace("**", "")[:maxw] for c in r] for r in [head] + rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(head))]
    out = []
    for j, r in enumerate(cells):
        out.append("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
        if j == 0:
            out.append("  ".join("-" * x for x in w))
    return "\n".join(out)


def env_lines(state):
    e = state.env
    keys = ["gpu", "capability", "sm_count", "memory_gib", "l2_mib", "torch", "cuda", "cudnn",
            "triton", "python", "flash_impls", "flash_impl_active"]
    return ["- %s: %s" % (k, e.get(k)) for k in keys if k in e] or ["- (environment not recorded)"]


def write_json(state):
    os.makedirs(state.args.out, exist_ok=True)
    path = os.path.join(state.args.out, state.stem() + ".json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state.to_json(), f, indent=1, default=str)
    os.replace(tmp, path)


def write_markdown(state, final=False):
    stem = state.stem()
    lines = ["# attngen benchmark: %s, %s, %s" % (state.date, state.env.get("gpu", "unknown GPU"), state.mode), ""]
    if not final:
        lines += ["**Partial results** (the run was still going when this was written).", ""]
    lines += ["Command (from the repository root):", "", "    " + state.command, ""]
    lines += env_lines(state) + [""]
    if "fwd" in state.passes:
        lines += ["Forward pass, non-causal unless the shape says causal; times are the median of "
                  ">= 20 CUDA-event-timed calls after warm-up, rotating input sets larger than L2. "
                  "TB/s counts Q, K, V read once and O written once (packed bytes, the same for every "
                  "implementation); TFLOP/s counts 4·n²·D·H per block of n valid rows (unmasked pairs "
                  "only when causal). %%BW ceil is against the better of copy and read-3-write-1; %%MM "
                  "ceil against the bf16 8192³ matmul. Errors: max over a sample of blocks of the "
                  "relative Frobenius error against float64; above %.0e (or any NaN) a row is "
                  "FLAGGED and not counted as the fastest peer. Speedup = fastest unflagged peer's "
                  "time / attngen's time." % ERR_FLAG, ""]
    if "bwd" in state.passes:
        lines += ["Backward pass (rows `bwd`): dQ, dK, dV from Q, K, V and a given dO, timed "
                  "alone (CUDA events, median of >= 20 calls after warm-up): attngen's backward "
                  "kernel through the binding (`Kernel.backward`), the Triton peer's backward "
                  "kernel, and for the PyTorch peers `torch.autograd.grad(out, (q, k, v), dO, "
                  "retain_graph=True)` after one untimed forward (or, where a backward refuses "
                  "retain_graph, a forward re-run before each timed call, outside the events; "
                  "noted). TB/s counts 7 tensors (Q, K, V, dO read, dQ, dK, dV written); TFLOP/s "
                  "counts 2.5x the forward's useful FLOPs; %%BW ceil is against the read-4-write-3 "
                  "stream kernel. Errors: per gradient (dq/dk/dv), the max over sampled blocks of "
                  "the relative Frobenius error against float64 autograd (a block's denominator "
                  "floored at 1%% of the sample's RMS block norm, as one-token blocks have dq = dk "
                  "= 0); above %.0e (or any NaN) the row is FLAGGED." % ERR_FLAG, ""]
    if "rot" in state.passes:
        lines += ["Rotary pipeline (rows `rot`, EXPERIMENTAL): forward and backward of attention "
                  "with rotary embeddings on Q and K (interleaved pairs, a per-token sin/cos table "
                  "[total, D]), timed together. Peers apply %s before their attention and "
                  "autograd differentiates through both; attngen uses a spec with `rotary: {layout: "
                  "interleaved, apply_to: [q, k], positions: table}` (fused into both kernels). "
                  "TB/s counts 11 tensors and the table twice; "
                  "TFLOP/s 3.5x the forward's; %%BW ceil against read-4-write-3. Errors: output "
                  "and each gradient against float64 with the same rotary." % (
                      "a bandwidth-bound Triton rotary (peers/rope_triton.py, fp32 math; "
                      "--rotary-peer compile: a torch.compile'd PyTorch one)"
                      if rotary_peer_kind() == "triton" else
                      "a PyTorch rotary (torch.compile'd, fp32 math; eager if compiling fails)"),
                  ""]
    lines += ["## Summary", "", md_table(head_sum(state), summary_rows(state)), ""]
    if os.path.exists(os.path.join(state.args.out, stem + ".png")):
        lines += ["![attngen speedup over the fastest peer](%s.png)" % stem, ""]
    lines += ["## Ceilings (same run)", "", md_table(["ceiling", "ms", "TB/s", "TFLOP/s", "config"],
                                                     ceiling_rows(state)), ""]
    same = same_size_rows(state)
    if same:
        lines += ["Same-size streams (the summary's %same-size: this stream's time over "
                  "attngen's): the pass's least bytes, and nothing else, moved by the stream "
                  "kernel of its traffic (read-3-write-1 for the forward, read-4-write-3 for the "
                  "backward) over tensors of exactly the shape's tokens x heads x head_dim; "
                  "unlike the 4 GiB ceilings, it pays the launch and the last wave a pass of this "
                  "size pays.", "",
                  md_table(["shape", "pass", "ms", "TB/s", "config"], same), ""]
    lines += ["## All results", "", md_table(HEAD_MAIN, table_rows(state)), ""]
    lines += ["## Peers", ""]
    for p in PEER_ORDER:
        if p in state.unavailable:
            lines.append("- %s: **unavailable**: %s" % (p, state.unavailable[p]))
        elif any(k[0] == p for k in state.results):
            n_ok = sum(1 for k, r in state.results.items() if k[0] == p and r.get("ok"))
            n = sum(1 for k in state.results if k[0] == p)
            lines.append("- %s: %d/%d %s ran (worker wall %.0f s)%s" % (
                p, n_ok, n, "tasks" if _multi(state) else "shapes", state.worker_wall.get(p, 0),
                ("; " + json.dumps(state.info[p])) if state.info.get(p) else ""))
        else:
            lines.append("- %s: not run" % p)
    if state.events:
        lines += ["", "Events:", ""] + ["- " + e for e in state.events]
    lines += ["", "Raw records: `%s.json`." % stem, ""]
    path = os.path.join(state.args.out, stem + ".md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(path + ".tmp", path)
    return path


def write_results_index(state, md_path):
    """bench/RESULTS.md (or <out>/RESULTS.md when --out is elsewhere): points
    to the latest report and holds its headline table. Links assume the
    report files live in bench/results/."""
    stem = state.stem()
    target = state.args.results_md
    if target is None:
        # The forward's index is RESULTS.md; runs with other passes get their
        # own (RESULTS-bwd.md, RESULTS-fwd-bwd.md, RESULTS-rotary.md), so a
        # backward run never replaces the forward's headline.
        name = "RESULTS.md" if not _multi(state) else "RESULTS-%s.md" % pass_suffix(state.passes)
        default_out = os.path.join(HERE, "results")
        same = os.path.abspath(state.args.out) == os.path.abspath(default_out)
        target = os.path.join(HERE, name) if same else os.path.join(state.args.out, name)
    what = ", ".join(PASS_NAMES[p] for p in state.passes)
    lines = ["# Benchmark results", "",
             "Latest: [results/%s.md](results/%s.md) (%s, %s, %s mode). Produced by `%s`; "
             "see bench/README.md." % (stem, stem, state.date, state.env.get("gpu", "unknown GPU"),
                                       state.mode, state.command), "",
             "Headline (%s, attngen vs the fastest peer that agreed with float64):" % what, "",
             md_table(head_sum(state), summary_rows(state)), ""]
    if os.path.exists(os.path.join(state.args.out, stem + ".png")):
        lines += ["![speedup](results/%s.png)" % stem, ""]
    bw = fwd_ceiling(state)
    if bw and "fwd" in state.passes:
        lines += ["Forward bandwidth ceiling in that run: %.2f TB/s." % bw, ""]
    bw = bwd_ceiling(state)
    if bw and ("bwd" in state.passes or "rot" in state.passes):
        lines += ["Backward (read-4-write-3) bandwidth ceiling in that run: %.2f TB/s." % bw, ""]
    with open(target + ".tmp", "w") as f:
        f.write("\n".join(lines))
    os.replace(target + ".tmp", target)
    return target


def write_plot(state):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log("plot skipped: matplotlib unavailable (%s)" % e)
        return None
    summ = shape_summary(state)
    multi = _multi(state)
    labels = [s.label.replace("B1152 H4 ", "") + (" " + ps if multi else "")
              for s, ps, _, _, _ in summ]
    vals = [sp or 0.0 for _, _, _, _, sp in summ]
    names = [b[0] if b else "n/a" for _, _, _, b, _ in summ]
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(labels) + 2), 4.5))
    colors = ["#2a7" if v >= 1 else "#c44" for v in vals]
    ax.bar(range(len(vals)), vals, color=colors)
    ax.axhline(1.0, color="k", lw=0.8)
    for i, (v, n) in enumerate(zip(vals, names)):
        ax.text(i, v + 0.02, "%s\n%.2fx" % (n, v) if v else "n/a", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(vals)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("attngen speedup over the fastest peer")
    ax.set_title("attngen %s, %s, %s (%s)" % (
        ", ".join(PASS_NAMES[p] for p in state.passes), state.env.get("gpu", "?"), state.mode,
        state.date))
    ax.set_ylim(0, max(vals + [1.2]) * 1.25)
    fig.tight_layout()
    path = os.path.join(state.args.out, state.stem() + ".png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---- main -----------------------------------------------------------------------

def block_size(text):
    """--block's value: a multiple of 16 in 16..256 (a spec's block_size)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("invalid block size: %r" % text)
    if n < 16 or n > 256 or n % 16:
        raise argparse.ArgumentTypeError("must be a multiple of 16 in 16..256, got %d" % n)
    return n


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    m = ap.add_mutually_exclusive_group()
    m.add_argument("--quick", action="store_true", help="4 shapes (about 2 min)")
    m.add_argument("--smoke", action="store_true", help="tiny shapes: checks the pipeline only")
    ap.add_argument("--causal", action="store_true", help="the same shapes, causal")
    ap.add_argument("--block", type=block_size, default=64,
                    help="tokens per diagonal block of every shape: a multiple of 16 in "
                         "16..256, as specs allow (default 64)")
    ap.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "both"), default="fwd",
                    help="what to time: the forward (default), the backward (dq, dk, dv "
                         "from q, k, v and dout), or both")
    ap.add_argument("--rotary", action="store_true",
                    help="EXPERIMENTAL: time forward+backward with rotary embeddings on q and k "
                         "(peers: a PyTorch rotary before their attention; attngen: a fused "
                         "rotary spec); replaces --pass")
    ap.add_argument("--rotary-peer", choices=("triton", "compile"), default=None,
                    help="with --rotary: the peers' rotary pass, a bandwidth-bound Triton kernel "
                         "(peers/rope_triton.py; default) or a torch.compile'd PyTorch one")
    ap.add_argument("--peers", help="comma-separated subset of: ceilings," + ",".join(PEER_ORDER))
    ap.add_argument("--skip", help="comma-separated peers to leave out")
    ap.add_argument("--shapes", help="only shapes whose label contains each comma-separated "
                                     "word, e.g. 'D128,L4096'")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="output directory")
    ap.add_argument("--results-md", help="where to write the RESULTS.md index (default: "
                                         "bench/RESULTS.md with the default --out, else OUT/RESULTS.md)")
    ap.add_argument("--budget", type=float, help="seconds for the whole run (default per pass: "
                                                 "150 quick, 450 full, 90 smoke; --rotary counts "
                                                 "as two passes)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--tasks", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="full", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def select_passes(args):
    if args.rotary:
        return ["rot"]
    return {"fwd": ["fwd"], "bwd": ["bwd"], "both": ["fwd", "bwd"]}[args.pass_]


def pass_suffix(passes):
    """The part of the mode (and of file names) that says the passes: empty
    for the forward alone, so forward runs keep their names."""
    return {("fwd",): "", ("bwd",): "bwd", ("fwd", "bwd"): "fwd-bwd",
            ("rot",): "rotary"}[tuple(passes)]


def select(args):
    mode = "quick" if args.quick else "smoke" if args.smoke else "full"
    shapes = (quick_shapes(args.causal) if mode == "quick" else
              smoke_shapes() if mode == "smoke" else ads_shapes(args.causal))
    for s in shapes:
        s.block = args.block
    if args.shapes:
        words = [w.strip() for w in args.shapes.split(",") if w.strip()]
        shapes = [s for s in shapes if all(w in s.label for w in words)]
    names = ["ceilings"] + PEER_ORDER
    if args.peers:
        want = [p.strip() for p in args.peers.split(",") if p.strip()]
        bad = [p for p in want if p not in names]
        if bad:
            raise SystemExit("unknown peer(s): %s (known: %s)" % (", ".join(bad), ", ".join(names)))
        names = [n for n in names if n in want]
    else:
        names = [n for n in names if n not in PEER_OPT_IN]
    if args.skip:
        skip = {p.strip() for p in args.skip.split(",")}
        names = [n for n in names if n not in skip]
    if mode != "smoke" and args.causal:
        mode += "-causal"
    return mode, shapes, names


def orchestrate(args):
    worker_mode, shapes, names = select(args)
    passes = select_passes(args)
    mode = worker_mode + ("-" + pass_suffix(passes) if pass_suffix(passes) else "")
    per_pass = 150.0 if worker_mode.startswith("quick") else 90.0 if worker_mode == "smoke" else 450.0
    # the rotary pipeline is a forward and a backward: twice a pass's budget
    budget = args.budget or per_pass * sum(2 if p == "rot" else 1 for p in passes)
    os.makedirs(args.out, exist_ok=True)
    state = State(args, shapes, mode, passes, worker_mode)
    log("attngen bench: mode %s, %d shape(s), pass(es) %s, peers %s, budget %.0f s, out %s" % (
        mode, len(shapes), ",".join(passes), ",".join(names), budget, args.out))
    if not shapes:
        raise SystemExit("no shape selected")
    # Biggest last within each worker, so a time-out or crash costs the least;
    # the passes of one shape run together (they share its inputs).
    shapes_run = sorted(shapes, key=lambda s: (s.batch * s.max_len * s.sparsity * s.heads * s.head_dim))
    tasks = [Task(s, p) for s in shapes_run for p in passes]
    end = T0 + budget - 6.0  # keep a few seconds for the report
    for i, name in enumerate(names):
        later = len(names) - i - 1
        now = time.perf_counter()
        if now > end - 3.0:
            state.events.append("%s: not run (time budget spent)" % name)
            log("%s: not run (time budget spent)" % name)
            continue
        # Each worker may use up to 2.5x its fair share of what is left, but
        # always leaves the later ones a few seconds each.
        share = (end - now) / (later + 1)
        deadline = min(end - 4.0 * later, now + max(2.5 * share, 20.0))
        deadline = max(deadline, min(end, now + 8.0))
        if name == "varlen_fa3" and state.env.get("flash_impls") is not None \
                and "FA3" not in (state.env.get("flash_impls") or []):
            state.unavailable[name] = ("FA3 is not registered in this torch "
                                       "(list_flash_attention_impls() = %s)" % state.env.get("flash_impls"))
            log("%s: unavailable: %s" % (name, state.unavailable[name]))
            continue
        log("--- %s" % name)
        run_worker(state, name, tasks, deadline)
        write_markdown(state)
    shutil.rmtree(os.path.join(args.out, ".work"), ignore_errors=True)
    png = None if args.no_plot else write_plot(state)
    md = write_markdown(state, final=True)
    idx = write_results_index(state, md) if mode != "smoke" else None
    print()
    print("Ceilings:")
    print(text_table(["ceiling", "ms", "TB/s", "TFLOP/s", "config"], ceiling_rows(state)))
    print()
    print("All results:")
    print(text_table(HEAD_MAIN, table_rows(state)))
    print()
    print("Summary (attngen vs fastest unflagged peer):")
    print(text_table(head_sum(state), summary_rows(state)))
    for p, why in state.unavailable.items():
        print("unavailable: %s: %s" % (p, why))
    for e in state.events:
        print("event: %s" % e)
    print()
    log("wrote %s, %s.json%s%s" % (md, os.path.join(args.out, state.stem()),
                                    ", " + png if png else "", ", " + idx if idx else ""))
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.rotary_peer:  # read by peers/common.py here and in the workers, which inherit it
        os.environ[ROTARY_PEER_ENV] = args.rotary_peer
    if args.worker:
        return worker_main(args)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
