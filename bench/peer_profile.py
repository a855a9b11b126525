# SPDX-License-Identifier: BSD-3-Clause
"""peer_profile.py: launch the harness's plain Triton block-diagonal backward
on one ads shape (batch 1152, 4 heads, 64-token blocks, lengths uniform in
[0.4 L, L], the harness's own lengths and block table) a few times, and
print what its compiled kernel uses per CTA (registers, spills, shared
memory), for comparing it with attngen's under a profiler:

    ncu --kernel-name block_attn_bwd --launch-skip 2 --launch-count 1 \\
        python bench/peer_profile.py --dim 64 --seqlen 1024

Times nothing; bench/bench.py is the benchmark."""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers.common import BlockTable, Shape  # noqa: E402


def positive(text):
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1, got %d" % n)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, choices=(64, 128), default=64)
    ap.add_argument("--seqlen", type=positive, default=1024, help="L, the longest sequence")
    ap.add_argument("--warps", type=int, choices=(1, 2, 4, 8), default=4)
    ap.add_argument("--stages", type=positive, default=1)
    ap.add_argument("--launches", type=positive, default=4)
    a = ap.parse_args()

    import torch  # after the arguments, so that bad ones are reported without it
    from peers.triton_block import bwd_kernel

    shape = Shape(1152, 4, a.dim, a.seqlen, 0.7)
    table = BlockTable(shape.lengths(), shape.block)
    dev = "cuda"
    q, k, v, do = (torch.randn(table.total, shape.heads, a.dim, device=dev,
                               dtype=torch.bfloat16) for _ in range(4))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    starts = torch.from_numpy(table.starts).to(device=dev, dtype=torch.int64)
    lens = torch.from_numpy(table.lens).to(device=dev, dtype=torch.int32)
    scale = 1.0 / math.sqrt(a.dim)
    fn = bwd_kernel()
    for _ in range(a.launches):
        h = fn[(table.nblocks, shape.heads)](q, k, v, do, dq, dk, dv, starts, lens,
                                             shape.heads * a.dim, scale,
                                             scale * 1.4426950408889634, D=a.dim,
                                             BLOCK=shape.block, CAUSAL=False,
                                             num_warps=a.warps, num_stages=a.stages)
    torch.cuda.synchronize()
    print("triton block_attn_bwd d%d: %d blocks x %d heads; registers %s, spills %s, "
          "shared memory %s bytes, %d warps" %
          (a.dim, table.nblocks, shape.heads, getattr(h, "n_regs", "?"),
           getattr(h, "n_spills", "?"), getattr(getattr(h, "metadata", None), "shared", "?"),
           a.warps))


if __name__ == "__main__":
    main()
