# SPDX-License-Identifier: BSD-3-Clause
"""rotary_parts.py: the unfused rotary pipeline of bench.py --rotary, taken
apart on one ads shape (batch 1152, 4 heads, 64-token blocks, lengths
uniform in [0.4 L, L], the harness's own lengths and block table): the
Triton rotary pass alone (both layouts, with its bytes over time), the
plain Triton block attention's forward and backward alone, and the whole
pipeline (rotary on q and k, attention, autograd backward) timed with CUDA
events and then once under torch.profiler, whose per-kernel table says
where its time goes.

    python bench/rotary_parts.py --dim 128 --seqlen 4096

Prints; writes nothing. bench/bench.py is the benchmark."""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers.common import BlockTable, Shape  # noqa: E402


def timed(fn, iters=10, warmup=3):
    """Median milliseconds of fn() over `iters` calls, CUDA events."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in ev)[iters // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, choices=(64, 128), default=128)
    ap.add_argument("--seqlen", type=int, default=4096, help="L, the longest sequence")
    ap.add_argument("--fwd-cfg", default="4,2", help="Triton forward num_warps,num_stages")
    ap.add_argument("--bwd-cfg", default="4,3", help="Triton backward num_warps,num_stages")
    a = ap.parse_args()

    import torch
    from peers import rope_triton
    from peers.triton_block import bwd_kernel, kernel

    shape = Shape(1152, 4, a.dim, a.seqlen, 0.7)
    table = BlockTable(shape.lengths(), shape.block)
    dev, H, D = "cuda", shape.heads, a.dim
    T = table.total
    q, k, v, do = (torch.randn(T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
    ang = torch.rand(T, D // 2, device=dev) * 6.0
    tab = torch.cat((ang.sin(), ang.cos()), dim=1).to(torch.bfloat16)  # sin | cos [T, D]
    sin, cos = tab[:, :D // 2], tab[:, D // 2:]
    print("shape: batch 1152, 4 heads, D %d, L %d, s 0.7: %d tokens, %d blocks" %
          (D, a.seqlen, T, table.nblocks))

    for layout in ("interleaved", "half"):
        # against float64 on the first 4096 tokens: pairs (2i, 2i + 1) or (i, i + D/2)
        n = min(T, 4096)
        x = q[:n].double()
        c64, s64 = cos[:n].double()[:, None, :], sin[:n].double()[:, None, :]
        x1, x2 = (x[..., 0::2], x[..., 1::2]) if layout == "interleaved" else \
            (x[..., :D // 2], x[..., D // 2:])
        y1, y2 = x1 * c64 - x2 * s64, x1 * s64 + x2 * c64
        want = torch.stack((y1, y2), -1).flatten(-2) if layout == "interleaved" else \
            torch.cat((y1, y2), -1)
        got = rope_triton.rotate(q, cos, sin, layout=layout)[:n].double()
        back = rope_triton.rotate(rope_triton.rotate(q, cos, sin, layout=layout), cos, sin,
                                  inverse=True, layout=layout)[:n].double()
        print("rotary %-11s max error %.2e, inverse round trip %.2e" %
              (layout, (got - want).abs().max().item(), (back - x).abs().max().item()))
        ms = timed(lambda: rope_triton.rotate(q, cos, sin, layout=layout))
        gb = rope_triton.bytes_moved(q, cos) / 1e9
        print("rotary %-11s one tensor: %7.3f ms, %.2f GB, %.2f TB/s" %
              (layout, ms, gb, gb / ms))
    copy_ms = timed(lambda: q.clone())
    gb = 2 * q.numel() * q.element_size() / 1e9
    print("copy (clone) one tensor:      %7.3f ms, %.2f GB, %.2f TB/s" % (copy_ms, gb, gb / copy_ms))

    starts = torch.from_numpy(table.starts).to(device=dev, dtype=torch.int64)
    lens = torch.from_numpy(table.lens).to(device=dev, dtype=torch.int32)
    scale = 1.0 / math.sqrt(D)
    fcfg = tuple(int(x) for x in a.fwd_cfg.split(","))
    bcfg = tuple(int(x) for x in a.bwd_cfg.split(","))
    fk, bk = kernel(), bwd_kernel()
    grid = (table.nblocks, H)

    def fwd(q_, k_, v_):
        o = torch.empty_like(q_)
        fk[grid](q_, k_, v_, o, starts, lens, H * D, scale * 1.4426950408889634, D=D,
                 BLOCK=shape.block, CAUSAL=False, num_warps=fcfg[0], num_stages=fcfg[1])
        return o

    def bwd(q_, k_, v_, do_):
        dq, dk, dv = torch.empty_like(q_), torch.empty_like(k_), torch.empty_like(v_)
        bk[grid](q_, k_, v_, do_, dq, dk, dv, starts, lens, H * D, scale,
                 scale * 1.4426950408889634, D=D, BLOCK=shape.block, CAUSAL=False,
                 num_warps=bcfg[0], num_stages=bcfg[1])
        return dq, dk, dv

    f_ms = timed(lambda: fwd(q, k, v))
    b_ms = timed(lambda: bwd(q, k, v, do))
    print("triton attention forward %7.3f ms, backward %7.3f ms (cfg %s / %s)" %
          (f_ms, b_ms, fcfg, bcfg))

    class Attn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q_, k_, v_):
            ctx.save_for_backward(q_, k_, v_)
            return fwd(q_, k_, v_)

        @staticmethod
        def backward(ctx, d):
            return bwd(*ctx.saved_tensors, d.contiguous())

    rope = rope_triton.function()
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def pipeline(layout="interleaved"):
        ql, kl, vl = leaves
        out = Attn.apply(rope.apply(ql, cos, sin, layout), rope.apply(kl, cos, sin, layout), vl)
        return torch.autograd.grad(out, leaves, do)

    for layout in ("interleaved", "half"):
        print("pipeline (%s): rotary q, k + attention, forward and backward: %7.3f ms" %
              (layout, timed(lambda: pipeline(layout))))

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        pipeline()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))


if __name__ == "__main__":
    main()
