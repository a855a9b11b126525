#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""broadcast_ceiling.py: how far issue 18's bars (forward >= 1.5x, backward
>= 2x the fastest peer) can be reached at all, from a broadcast_bench.py
JSON (the shapes' sizes and every implementation's times).

For each shape and pass it takes the least work any kernel must do, the
useful FLOPs (the bench's count: forward 4 D H per visible pair, backward
2.5x that: S, dP, dV, dK, dQ with nothing recomputed) and the least bytes
(forward: Q, K and V read once, O and the logsumexp written; backward: Q,
K, V, O, dO and the logsumexp read once, dQ, dK, dV written; no scratch),
and the time floor max(FLOPs / matmul rate, bytes / bandwidth). The
fastest peer's time over that floor is the largest ratio any kernel could
show against it: where it is below the bar, the bar cannot be met.

Two ceilings: the GPU's data-sheet peaks (H200: 4.8 TB/s, 989 TFLOP/s
dense bf16), which nothing reaches, and the rates measured on the same
H200 (bench/NOTES.md: a copy kernel's 4.5 TB/s, cuBLAS-class matmul 785
TFLOP/s). The defaults are the H200's: give the four rates for another
GPU (an H100 SXM: --peak-bw 3.35 --peak-mma 989, and its measured ones).
The model counts 16-bit elements (bf16, fp16) and heads == kv_heads, as
the bench runs.

usage: bench/broadcast_ceiling.py RESULTS.json [--peak-bw TB/s] [--peak-mma TFLOP/s]
                                  [--meas-bw TB/s] [--meas-mma TFLOP/s]
"""
import argparse
import json
import sys

PEERS = ("fa2", "fa4", "cudnn", "flex")
BARS = {"fwd": 1.5, "bwd": 2.0}


def least_bytes(rec, pass_):
    s = rec["shape"]
    h, d, nq, b = s["heads"], s["head_dim"], s["n_q"], s["batch"]
    tk = rec["total_k"]
    kv = 2 * h * d * tk  # one of K, V (bf16)
    q = 2 * h * d * nq  # the one dense Q (or dQ)
    o = 2 * h * d * b * nq  # O (or dO)
    lse = 4 * h * b * nq
    if pass_ == "fwd":
        return q + 2 * kv + o + lse
    return q + 2 * kv + 2 * o + lse + q + 2 * kv  # reads, then dQ, dK, dV


def rows(data, peak_bw=4.8, peak_mma=989.0, meas_bw=4.5, meas_mma=785.0):
    """One dict per (shape, pass) with a peer and attngen timed: the
    fastest peer and its time (ms), attngen's, the largest ratios possible
    at the peaks and at the measured rates, the bound, attngen's share of
    the measured floor, and the verdict against the bar."""
    out = []
    for rec in data["records"]:
        t = rec["times"]
        for p in ("fwd", "bwd"):
            peers = [(t[k][p], k) for k in PEERS if k in t and t[k].get(p)]
            if not peers or not t.get("attngen", {}).get(p):
                continue
            best, who = min(peers)
            ours = t["attngen"][p]
            flops, nbytes = rec["flops"][p], least_bytes(rec, p)

            def floor_ms(bw, mma):
                return max(flops / (mma * 1e12), nbytes / (bw * 1e12)) * 1e3

            fp, fm = floor_ms(peak_bw, peak_mma), floor_ms(meas_bw, meas_mma)
            bar = BARS[p]
            if ours * bar <= best:
                verdict = "met"
            elif best / fp < bar:
                verdict = "impossible"
            elif best / fm < bar:
                verdict = "past the measured rates"
            else:
                verdict = "open"
            out.append({"label": rec["label"], "pass": p, "peer": who, "peer_ms": best,
                        "ms": ours, "bar": bar, "max_peak": best / fp, "max_meas": best / fm,
                        "bound": "memory" if nbytes / meas_bw > flops / meas_mma else "matmul",
                        "at_ceiling": fm / ours, "verdict": verdict})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("--peak-bw", type=float, default=4.8)
    ap.add_argument("--peak-mma", type=float, default=989.0)
    ap.add_argument("--meas-bw", type=float, default=4.5)
    ap.add_argument("--meas-mma", type=float, default=785.0)
    a = ap.parse_args()
    for name in ("peak_bw", "peak_mma", "meas_bw", "meas_mma"):
        if not getattr(a, name) > 0:
            ap.error("--%s must be a positive rate, not %s" % (name.replace("_", "-"),
                                                               getattr(a, name)))
    try:
        with open(a.json) as f:
            data = json.load(f)
        data["records"], data["env"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        ap.error("%s is not a broadcast_bench.py JSON: %s" % (a.json, e))
    gpu = data["env"].get("gpu", "?")
    if "H200" not in gpu and (a.peak_bw, a.meas_bw) == (4.8, 4.5):
        print("warning: the default rates are an H200's; this run is from %s" % gpu,
              file=sys.stderr)
    print("From %s (%s, %s). Least bytes and useful FLOPs over the data-sheet peaks "
          "(%.1f TB/s, %.0f TFLOP/s) and the measured rates (%.1f TB/s, %.0f TFLOP/s)."
          % (a.json, data["env"].get("gpu", "?"), data["env"].get("date", "?"),
             a.peak_bw, a.peak_mma, a.meas_bw, a.meas_mma))
    print("Columns: fastest peer (ms), attngen (ms), attngen's ratio, the largest ratio "
          "any kernel could reach at the peaks / at the measured rates, what bounds it, and "
          "attngen's time as a share of the measured floor (100%: at the ceiling).")
    print()
    print("| shape | pass | fastest peer | attngen | ratio | bar | max at peaks | "
          "max at measured | bound | attngen at | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    out = rows(data, a.peak_bw, a.peak_mma, a.meas_bw, a.meas_mma)
    for r in out:
        print("| %s | %s | %s %.3f | %.3f | %.2fx | %.1fx | %.2fx | %.2fx | %s | %.0f%% | %s |"
              % (r["label"], r["pass"], "cuDNN" if r["peer"] == "cudnn" else r["peer"].upper(),
                 r["peer_ms"], r["ms"], r["peer_ms"] / r["ms"], r["bar"], r["max_peak"],
                 r["max_meas"], r["bound"], 100 * r["at_ceiling"],
                 "impossible (past the data-sheet peak)" if r["verdict"] == "impossible"
                 else r["verdict"]))
    print()
    print("%d of the %d (shape, pass) bars cannot be met by any kernel on this GPU."
          % (sum(r["verdict"] == "impossible" for r in out), len(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
