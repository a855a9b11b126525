# SPDX-License-Identifier: BSD-3-Clause
"""order_probe.py: why broadcast_bench's second attngen forward times
5-17% slower than the first, whichever variant runs second (bench/
RESULTS-broadcast.md, session 39). Times one shape's broadcast forward
(default and deterministic, the same kernel) at points of a fixed
sequence: cold, after the other variant's forward, after a backward loop,
after torch.cuda.empty_cache(), after 2 s idle; with the SM clock and
power read by nvidia-smi at each point. CUDA events, median of 10 after 3
warm-ups, as the harness times.

    PYTHONPATH=bindings/python python3 tools/order_probe.py [--dim 128 --nq 32 --L 1024]
"""
import argparse
import subprocess
import sys
import time

import torch

sys.path.insert(0, "bench")
from peers.common import cuda_time  # noqa: E402
import attngen  # noqa: E402


def gpu_state():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,"
                            "temperature.gpu,clocks_throttle_reasons.active",
                            "--format=csv,noheader"], capture_output=True, text=True,
                           timeout=10)
        return r.stdout.strip()
    except Exception as e:  # noqa: BLE001
        return "nvidia-smi: %s" % e


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--nq", type=int, default=32)
    ap.add_argument("--L", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1152)
    a = ap.parse_args()
    torch.manual_seed(0)
    H, D, B, L, nq = 4, a.dim, a.batch, a.L, a.nq
    dev = "cuda"
    q = torch.randn(nq, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B * L, H, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B * L, H, D, device=dev, dtype=torch.bfloat16)
    dout = torch.randn(B * nq, H, D, device=dev, dtype=torch.bfloat16)
    cu = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * L

    def fwd(det):
        return lambda i: attngen.broadcast_attention(q, k, v, cu, max_seqlen_k=L,
                                                     deterministic=det)

    def timed(label, det):
        with torch.no_grad():
            med, lo, _ = cuda_time(fwd(det), 1, 10, warmup=3)
        print("%-44s %s fwd %.4f ms (min %.4f)  [%s]" % (
            label, "det" if det else "def", med, lo, gpu_state()), flush=True)
        return med

    def backward_loop(det, n=20):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        for _ in range(n):
            out = attngen.broadcast_attention(*leaves, cu, max_seqlen_k=L, deterministic=det)
            torch.autograd.grad(out, leaves, dout)
        torch.cuda.synchronize()

    print("shape: batch %d, heads %d, D %d, n_q %d, keys %d each; %s" % (
        B, H, D, nq, L, torch.cuda.get_device_name()))
    for det in (False, True):  # compile both first
        with torch.no_grad():
            fwd(det)(0)
    torch.cuda.synchronize()
    time.sleep(2)
    timed("1 cold", False)
    timed("2 the other variant", True)
    timed("3 the first again", False)
    backward_loop(False)
    timed("4 after 20 fwd+bwd (default)", False)
    timed("5 the other variant", True)
    torch.cuda.empty_cache()
    timed("6 after empty_cache", False)
    time.sleep(2)
    timed("7 after 2 s idle", False)
    backward_loop(True)
    timed("8 after 20 fwd+bwd (det)", True)
    timed("9 the default", False)
    hold = [torch.empty(B * L, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3)]
    timed("10 with 3 K-sized tensors held", False)
    del hold
    torch.cuda.empty_cache()
    timed("11 released", False)
    for i in range(4):
        timed("12.%d again" % i, i % 2 == 1)


if __name__ == "__main__":
    main()
