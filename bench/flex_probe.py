# SPDX-License-Identifier: BSD-3-Clause
"""flex_probe.py: why FlexAttention's backward fails in the harness. Every
`bwd | flex` row of bench/results since 2026-11-30 reads NoValidChoicesError
(issue 19), while FlexAttention's backward is said to run on the H200 in
the default compile mode. This tries its forward + backward on one ads
shape (batch 1152, 4 heads, 64-token blocks, lengths uniform in [0.4 L, L],
the harness's block table, padded to one sequence of nblocks * 64 tokens)
several ways and prints, for each, OK with a median time or the error's
first line. Every way takes the harness's block mask
(BlockMask.from_kv_blocks: create_block_mask would evaluate nblocks^2
block pairs here) and torch.compile's default mode:

  harness   as peers/flex.py: sizes marked dynamic, the backward's tiles
            as kernel_options (BLOCK_M/N 64, BLOCK_M1 32, BLOCK_N1 64, ...)
  dyn       sizes marked dynamic, no kernel_options
  static    static sizes (dynamic=False), no kernel_options
  static-opts  static sizes, the harness's kernel_options
  coarse    sizes marked dynamic, no kernel_options, the mask in blocks of
            128 tokens (two pattern blocks each, masked by the mask_mod;
            peers/flex.py's last fallback)

Each way in its own process (a failed compile can leave dynamo's caches in
a state that changes the next). Prints; writes nothing.

    python bench/flex_probe.py --dim 128 --seqlen 1024 [--ways static,doc]"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers.common import BlockTable, Shape  # noqa: E402
from peers.flex import block_lists_mask  # noqa: E402

WAYS = ("harness", "dyn", "static", "static-opts", "coarse")


def one(way, dim, seqlen):
    import time

    import torch
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    shape = Shape(1152, 4, dim, seqlen, 0.7)
    t = BlockTable(shape.lengths(), shape.block)
    nb, bs, H, dev = t.nblocks, shape.block, shape.heads, "cuda"
    S = nb * bs
    blen = torch.from_numpy(t.lens).to(device=dev, dtype=torch.int32)
    bm, sized = block_lists_mask(BlockMask, blen, bs, False, 128 if way == "coarse" else None)
    opts = None
    if way in ("harness", "static-opts"):
        opts = dict(BLOCK_M=bs, BLOCK_N=bs, BLOCK_M1=min(32, bs), BLOCK_N1=min(64, bs),
                    BLOCK_M2=min(64, bs), BLOCK_N2=min(32, bs))
    dynamic = way in ("harness", "dyn", "coarse")
    flex = torch.compile(flex_attention, dynamic=None if dynamic else False)
    q, k, v, do = (torch.randn(1, H, S, dim, device=dev, dtype=torch.bfloat16,
                               requires_grad=i < 3) for i in range(4))
    if dynamic:
        for x in (q, k, v):
            torch._dynamo.maybe_mark_dynamic(x, 2)
        for x, d in sized:
            torch._dynamo.maybe_mark_dynamic(x, d)

    def step():
        out = flex(q, k, v, block_mask=bm, kernel_options=opts)
        return torch.autograd.grad(out, (q, k, v), do)

    try:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        print("%-11s OK: forward + backward %.3f ms (median of 5; first call %.1f s)" %
              (way, sorted(times)[2], first))
    except Exception as e:
        print("%-11s FAILED: %s: %s" % (way, type(e).__name__, str(e).splitlines()[0][:200]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, choices=(64, 128), default=128)
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        one(a.one, a.dim, a.seqlen)
        return
    for way in a.ways.split(","):
        if way not in WAYS:
            sys.exit("unknown way %r (one of %s)" % (way, ", ".join(WAYS)))
        r = subprocess.run([sys.executable, __file__, "--one", way, "--dim", str(a.dim),
                            "--seqlen", str(a.seqlen)], capture_output=True, text=True,
                           timeout=300)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith(way)]
        print(lines[-1] if lines else "%-11s no result (exit %d): %s" %
              (way, r.returncode, (r.stderr.strip().splitlines() or ["?"])[-1][:200]))


if __name__ == "__main__":
    main()
