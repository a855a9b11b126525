#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Host overhead of attngen's Python entry points, side by side with a plain
Triton kernel and torch's varlen_attn (FlashAttention-2), in one process;
and how long a fresh process takes to have a cached kernel ready.

Run from the repository root after `make build/libattngen.so`:

    PYTHONPATH=bindings/python python3 bench/overhead.py --out bench/results/overhead

Per call: a host-bound shape (batch 2 sequences of 64 tokens, 1 head,
head_dim 64, bf16; every kernel here runs a few microseconds), N calls back
to back after a warm-up, wall time by time.perf_counter_ns around the loop
and one synchronize at its end, divided by N. When the host is the
bottleneck that is the host time per call; the device time per call (CUDA
events around one call, median; with an idle GPU it includes the launch's
host time) is printed beside it, and the host time with the GPU kept busy
(a torch.cuda._sleep queued before a shorter loop, so that no launch waits
for the device: the host's own cost per call even where the kernels are
the bottleneck). Rows:

- attngen.block_attention, Kernel.__call__, torch.ops.attngen.block_attention
  (the custom op that torch.compile traces), jagged_attention,
  broadcast_attention: forward, no grad; block and jagged through
  torch.compile(fullgraph=True) too;
- Kernel.backward (the backward kernel alone) and block / jagged
  forward + backward through autograd (`out.backward(dout)`);
- the same shape through a plain Triton block-diagonal kernel (bench/peers/
  triton_block.py; launch alone, and forward + backward through a minimal
  autograd.Function), varlen_attn forward and forward + backward, and
  torch.empty_like alone (the allocator's share of every row).

Fresh process: a subprocess imports torch, initializes CUDA and makes
the inputs (timed apart), then imports attngen and runs the first
block_attention call (each timed), with its kernel in the on-disk cache
(warm: a second process after one that compiled it) and with an empty
cache directory (cold).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

N_CALLS = 3000
LENS = (64, 64)
HEADS, DIM = 1, 64


def per_call_us(fn, n=N_CALLS, warmup=50):
    """Wall microseconds per fn() over n back-to-back calls."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    best = None
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        us = (time.perf_counter_ns() - t0) / n / 1e3
        best = us if best is None else min(best, us)
    return best


# Calls per loop with the GPU kept busy: under the launch queue's depth
# (about 1024 launches) for rows that launch up to 5 kernels a call.
BUSY_CALLS = 150


def host_us_busy(fn, n=BUSY_CALLS, warmup=20, sleep_cycles=200_000_000):
    """Host microseconds per fn() while the GPU runs a torch.cuda._sleep
    queued first (sleep_cycles clocks, 100-140 ms: longer than the loop),
    so that no call waits for the device; best of 5 loops of n calls. None
    when the sleep ended within a loop (an event recorded after it had
    completed by the loop's end): a call may have waited for the device,
    e.g. one that synchronizes."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    best = None
    for _ in range(5):
        torch.cuda._sleep(sleep_cycles)
        slept = torch.cuda.Event()
        slept.record()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        us = (time.perf_counter_ns() - t0) / n / 1e3
        waited = slept.query()
        torch.cuda.synchronize()
        if waited:
            return None
        best = us if best is None else min(best, us)
    return best


def device_us(fn, n=50):
    """Median device microseconds of one fn() (CUDA events)."""
    import torch
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def _us(x):
    return "-" if x is None else "%.1f" % x


def rows(torch, attngen):
    dev = "cuda"
    total = sum(LENS)
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, grad=False):
        t = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g)
        return t.requires_grad_(grad)

    q, k, v = (rand(total, HEADS, DIM) for _ in range(3))
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    dout = rand(total, HEADS, DIM)
    cu = torch.tensor([0, LENS[0], total], dtype=torch.int32, device=dev)
    qb = rand(16, HEADS, DIM)
    kernel = attngen.kernel_for(64, False, DIM, "bf16", None, backward=True)
    attngen.register_custom_ops()
    op = torch.ops.attngen.block_attention

    def fwd_bwd(f):
        def run():
            out = f()
            out.backward(dout)
        return run

    out = [
        ("attngen.block_attention (forward)", lambda: attngen.block_attention(q, k, v, cu)),
        ("Kernel.__call__ (forward)", lambda: kernel(q, k, v, cu)),
        ("torch.ops.attngen.block_attention (forward)",
         lambda: op(q, k, v, cu, 64, False, None, "", None, False)),
        ("attngen.jagged_attention (forward)", lambda: attngen.jagged_attention(q, k, v, cu)),
        ("attngen.broadcast_attention (forward, n_q 16)",
         lambda: attngen.broadcast_attention(qb, k, v, cu)),
        ("Kernel.backward (backward kernel alone)", lambda: kernel.backward(q, k, v, dout, cu)),
        ("attngen.block_attention forward + backward (autograd)",
         fwd_bwd(lambda: attngen.block_attention(qg, kg, vg, cu))),
        ("attngen.jagged_attention forward + backward (autograd)",
         fwd_bwd(lambda: attngen.jagged_attention(qg, kg, vg, cu))),
        ("torch.empty_like alone", lambda: torch.empty_like(q)),
    ]
    # the same calls through torch.compile (the custom ops; Inductor's
    # default mode): what a compiled model pays per call
    try:
        cblock = torch.compile(lambda a, b, c, d: attngen.block_attention(a, b, c, d),
                               fullgraph=True)
        cjag = torch.compile(lambda a, b, c, d: attngen.jagged_attention(a, b, c, d),
                             fullgraph=True)
        out += [
            ("torch.compile'd block_attention (forward)", lambda: cblock(q, k, v, cu)),
            ("torch.compile'd block_attention forward + backward",
             fwd_bwd(lambda: cblock(qg, kg, vg, cu))),
            ("torch.compile'd jagged_attention (forward)", lambda: cjag(q, k, v, cu)),
        ]
    except Exception as e:  # an older torch
        out.append(("torch.compile'd calls", "unavailable: %s" % str(e).splitlines()[0][:100]))
    out += triton_rows(torch, q, k, v, qg, kg, vg, dout, fwd_bwd)
    out += varlen_rows(torch, q, k, v, qg, kg, vg, cu, fwd_bwd)
    return out


def part_rows(torch, attngen):
    """--parts: the steps of one eager block_attention forward and one
    Kernel.backward, each timed alone (what a call's host time is made of):
    argument checks, the kernel lookup, the allocations, the stream lookup,
    the ctypes argument struct and the packed bytes the launches build
    instead, and the C entry point with prebuilt args (the runtime's launch:
    cuLaunchKernel and the C checks)."""
    import ctypes

    from attngen import _lib, _validate, ops, torch_ops
    dev = "cuda"
    total = sum(LENS)
    q, k, v, dout = (torch.randn(total, HEADS, DIM, device=dev, dtype=torch.bfloat16)
                     for _ in range(4))
    cu = torch.tensor([0, LENS[0], total], dtype=torch.int32, device=dev)
    kernel = attngen.kernel_for(64, False, DIM, "bf16", None)
    bkernel = attngen.kernel_for(64, False, DIM, "bf16", None, backward=True)
    di = q.get_device()
    h, bh = kernel.handle(di), bkernel.handle(di)
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    stream = ops._stream(torch, q)
    fargs = _lib.AgBlockFwdArgs(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                                offsets=cu.data_ptr(), batch=2, heads=HEADS, total_tokens=total,
                                rotary_table=None)
    bargs = _lib.AgBlockBwdArgs(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(),
                                dout=dout.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(),
                                dv=dv.data_ptr(), offsets=cu.data_ptr(), batch=2, heads=HEADS,
                                total_tokens=total, rotary_table=None)
    fpacked = bytes(fargs)
    qshape, qstride, qdtype, qdevice = q.shape, q.stride(), q.dtype, q.device
    empty_op = torch.ops.aten.empty_like.default
    return [
        ("part: block_attention (whole forward)", lambda: attngen.block_attention(q, k, v, cu)),
        ("part: torch_ops.traced_torch()", torch_ops.traced_torch),
        ("part: fast_block_tensors (the fast path's checks)",
         lambda: _validate.fast_block_tensors(q, k, v, cu)),
        ("part: check_block_attention_args", lambda: _validate.check_block_attention_args(
            q, k, v, cu, None, 64, False, None, None, None)),
        ("part: kernel_for (cached)", lambda: ops.kernel_for(64, False, DIM, "bf16", None,
                                                             rotary=None)),
        ("part: _needs_grad", lambda: ops._needs_grad(q, k, v)),
        ("part: torch.empty_like", lambda: torch.empty_like(q)),
        # other ways to one new tensor like q (the backward makes three)
        ("part: q.new_empty(q.shape)", lambda: q.new_empty(qshape)),
        ("part: torch.empty(shape, dtype=, device=)", lambda: torch.empty(
            qshape, dtype=qdtype, device=qdevice)),
        ("part: torch.empty_strided", lambda: torch.empty_strided(
            qshape, qstride, dtype=qdtype, device=qdevice)),
        ("part: torch.ops.aten.empty_like.default", lambda: empty_op(q)),
        ("part: three at once: torch.empty((3, ...)).unbind(0)", lambda: torch.empty(
            (3,) + tuple(qshape), dtype=qdtype, device=qdevice).unbind(0)),
        ("part: _stream", lambda: ops._stream(torch, q)),
        ("part: _stream_of (by device index)", lambda: ops._stream_of(torch, di)),
        ("part: Kernel.handle (cached)", lambda: kernel.handle(di)),
        ("part: AgBlockFwdArgs(...)", lambda: _lib.AgBlockFwdArgs(
            q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
            offsets=cu.data_ptr(), batch=2, heads=HEADS, total_tokens=total, rotary_table=None)),
        ("part: _lib.PACK_BLOCK_FWD(...) (what the launch builds)", lambda: _lib.PACK_BLOCK_FWD(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), cu.data_ptr(), 2, HEADS,
            total, 0, 0, 0, 0, 0, 0, 0)),
        ("part: _lib.call ag_block_forward (prebuilt args)", lambda: _lib.call(
            "ag_block_forward", h, ctypes.byref(fargs), stream)),
        ("part: _lib.call ag_block_forward (prebuilt packed args)", lambda: _lib.call(
            "ag_block_forward", h, fpacked, stream)),
        ("part: Kernel._forward_raw", lambda: kernel._forward_raw(q, k, v, cu, 2)),
        ("part: Kernel.backward (whole)", lambda: bkernel.backward(q, k, v, dout, cu)),
        ("part: check_dout", lambda: _validate.check_dout(dout, q)),
        ("part: Kernel._backward_refusal", bkernel._backward_refusal),
        ("part: _lib.call ag_block_backward (prebuilt args)", lambda: _lib.call(
            "ag_block_backward", bh, ctypes.byref(bargs), stream)),
        ("part: Kernel._backward_raw", lambda: bkernel._backward_raw(dout, q, k, v, cu, 2)),
    ]


def triton_rows(torch, q, k, v, qg, kg, vg, dout, fwd_bwd):
    try:
        from peers.triton_block import bwd_kernel, kernel
        fwd_k, bwd_k = kernel(), bwd_kernel()
    except Exception as e:
        return [("plain Triton kernel", "unavailable: %s" % e)]
    starts = torch.tensor([0, LENS[0]], dtype=torch.int64, device="cuda")
    lens = torch.tensor(LENS, dtype=torch.int32, device="cuda")
    scale = 1.0 / math.sqrt(DIM)
    grid = (len(LENS), HEADS)

    def forward(q_, k_, v_):
        o = torch.empty_like(q_)
        fwd_k[grid](q_, k_, v_, o, starts, lens, HEADS * DIM, scale * 1.4426950408889634, D=DIM,
                    BLOCK=64, CAUSAL=False, num_warps=4, num_stages=1)
        return o

    class TritonBlock(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q_, k_, v_):
            ctx.save_for_backward(q_, k_, v_)
            return forward(q_, k_, v_)

        @staticmethod
        def backward(ctx, do):
            q_, k_, v_ = ctx.saved_tensors
            dq, dk, dv = torch.empty_like(q_), torch.empty_like(k_), torch.empty_like(v_)
            bwd_k[grid](q_, k_, v_, do.contiguous(), dq, dk, dv, starts, lens, HEADS * DIM,
                        scale, scale * 1.4426950408889634, D=DIM, BLOCK=64, CAUSAL=False,
                        num_warps=4, num_stages=1)
            return dq, dk, dv

    rows = [("plain Triton kernel (forward launch)", lambda: forward(q, k, v))]
    try:
        TritonBlock.apply(qg, kg, vg).backward(dout)
        rows.append(("plain Triton kernel forward + backward (autograd)",
                     fwd_bwd(lambda: TritonBlock.apply(qg, kg, vg))))
    except Exception as e:  # the backward kernel's signature moved
        rows.append(("plain Triton kernel forward + backward (autograd)",
                     "unavailable: %s" % str(e).splitlines()[0][:100]))
    return rows


def varlen_rows(torch, q, k, v, qg, kg, vg, cu, fwd_bwd):
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception as e:
        return [("torch varlen_attn (FA2)", "unavailable: %s" % e)]
    m = max(LENS)
    return [("torch varlen_attn (FA2, forward)", lambda: varlen_attn(q, k, v, cu, cu, m, m)),
            ("torch varlen_attn (FA2) forward + backward (autograd)",
             fwd_bwd(lambda: varlen_attn(qg, kg, vg, cu, cu, m, m)))]


FIRST_CALL = r"""
import os, sys, time
t0 = time.perf_counter()
import torch
torch.cuda.init()
q = torch.randn(128, 1, 64, device="cuda", dtype=torch.bfloat16)
cu = torch.tensor([0, 64, 128], dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
t1 = time.perf_counter()
import attngen
t2 = time.perf_counter()
attngen.block_attention(q, q, q, cu)
torch.cuda.synchronize()
t3 = time.perf_counter()
print("%.3f %.3f %.3f" % ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
"""


def first_call_ms(cache_dir):
    env = dict(os.environ, ATTNGEN_CACHE_DIR=cache_dir)
    r = subprocess.run([sys.executable, "-c", FIRST_CALL], capture_output=True, text=True,
                       env=env, timeout=300)
    if r.returncode:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "failed")
    torch_ms, import_ms, call_ms = map(float, r.stdout.split())
    return torch_ms, import_ms, call_ms


def fresh_process_starts(attngen):
    """How long fresh processes take to a first call, cold and warm. An
    installed package has its bytecode compiled (pip does it at install):
    so has this tree's for the fresh processes, whatever
    PYTHONDONTWRITEBYTECODE says (compiling attngen's modules on import
    costs ~10 ms, which no installed copy pays)."""
    import compileall
    compileall.compile_dir(os.path.dirname(attngen.__file__), quiet=1)
    starts = {}
    with tempfile.TemporaryDirectory() as cold:
        try:
            tm, cold_import, cold_call = first_call_ms(cold)
            # the first run left the cubin there
            _, warm_import, warm_call = first_call_ms(cold)
            starts = {"torch_and_cuda_init_ms": tm,
                      "cold_import_ms": cold_import, "cold_first_call_ms": cold_call,
                      "warm_import_ms": warm_import, "warm_first_call_ms": warm_call}
            print("fresh process: torch import + CUDA init + inputs %.1f ms; then import attngen "
                  "%.1f ms and its first call %.1f ms cold (compiles); %.1f + %.1f ms warm "
                  "(cubin on disk)" % (tm, cold_import, cold_call, warm_import, warm_call),
                  flush=True)
        except Exception as e:
            starts = {"error": str(e)}
            print("fresh process: ERROR %s" % e)
    return starts


def _positive(text):
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1, got %d" % n)
    return n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(HERE, "results", "overhead"))
    p.add_argument("--calls", type=_positive, default=N_CALLS,
                   help="calls per timing (default %d)" % N_CALLS)
    p.add_argument("--parts", action="store_true",
                   help="time the steps of the block forward and backward instead (no fresh "
                        "process runs)")
    args = p.parse_args(argv)
    import torch
    import attngen
    results = []
    for name, fn in (part_rows if args.parts else rows)(torch, attngen):
        if isinstance(fn, str):
            results.append({"name": name, "error": fn})
            print("%-58s %s" % (name, fn), flush=True)
            continue
        try:
            host = per_call_us(fn, args.calls)
            devt = device_us(fn)
            busy = host_us_busy(fn)
            results.append({"name": name, "us_per_call": host, "device_us": devt,
                            "host_us_gpu_busy": busy})
            print("%-58s %7.1f us per call (device %6.1f us, host alone %s)"
                  % (name, host, devt, _us(busy)), flush=True)
        except Exception as e:
            results.append({"name": name, "error": str(e).splitlines()[0][:200]})
            print("%-58s ERROR %s" % (name, results[-1]["error"]), flush=True)
    starts = {}
    if not args.parts:
        starts = fresh_process_starts(attngen)
    os.makedirs(args.out, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "shape": {"lens": LENS, "heads": HEADS, "head_dim": DIM, "dtype": "bf16"},
            "calls": args.calls, "command": " ".join(["bench/overhead.py"] + (argv or sys.argv[1:]))}
    with open(os.path.join(args.out, "overhead.json"), "w") as f:
        json.dump({"meta": meta, "rows": results, "fresh_process": starts}, f, indent=1)
    with open(os.path.join(args.out, "overhead.md"), "w") as f:
        f.write("# Host overhead per call (%s, %s, torch %s)\n\n" % (meta["date"], meta["gpu"],
                                                                   meta["torch"]))
        f.write("`%s`; shape %s\n\nus per call: back to back, one synchronize at the end; "
                "device us: CUDA events around one call; host us (GPU busy): back to back "
                "behind a torch.cuda._sleep, the host's own cost (- where a call waited)."
                "\n\n| call | us per call | device us | host us (GPU busy) |\n|---|---|---|---|\n"
                % (meta["command"], meta["shape"]))
        for r in results:
            if "error" in r:
                f.write("| %s | %s | | |\n" % (r["name"], r["error"]))
            else:
                f.write("| %s | %.1f | %.1f | %s |\n" % (r["name"], r["us_per_call"],
                                                        r["device_us"],
                                                        _us(r.get("host_us_gpu_busy"))))
        f.write("\nFresh process: %s\n" % json.dumps(starts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
