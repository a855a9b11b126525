"""peer_profile.py: launch the harness's plain Triton block-diagonal backward
on one ads shape (batch 1152, 4 heads, 64-token blocks, lengths uniform in
[0.4 L, L]) a few times, and print what its compiled kernel uses per CTA
(registers, spills, shared memory), for comparing it with attngen's under
a profiler:

    ncu --kernel-name block_attn_bwd --launch-skip 2 --launch-count 1 \\
        python bench/peer_profile.py --dim 64 --seqlen 1024

Times nothing; bench/bench.py is the benchmark."""
import argparse
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers.triton_block import bwd_kernel  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--launches", type=int, default=4)
    a = ap.parse_args()
    batch, heads, block = 1152, 4, 64
    rng = np.random.default_rng(42)
    lens = rng.integers(int(0.4 * a.seqlen), a.seqlen + 1, size=batch)
    starts, blens, token = [], [], 0
    for n in lens:
        for b in range(0, int(n), block):
            starts.append(token + b)
            blens.append(min(block, int(n) - b))
        token += int(n)
    dev = "cuda"
    q, k, v, do = (torch.randn(token, heads, a.dim, device=dev, dtype=torch.bfloat16)
                   for _ in range(4))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    st = torch.tensor(starts, device=dev, dtype=torch.int64)
    ln = torch.tensor(blens, device=dev, dtype=torch.int32)
    scale = 1.0 / math.sqrt(a.dim)
    fn = bwd_kernel()
    for _ in range(a.launches):
        h = fn[(len(starts), heads)](q, k, v, do, dq, dk, dv, st, ln, heads * a.dim, scale,
                                     scale * 1.4426950408889634, D=a.dim, BLOCK=block,
                                     CAUSAL=False, num_warps=a.warps, num_stages=a.stages)
    torch.cuda.synchronize()
    print("triton block_attn_bwd d%d: %d blocks x %d heads; registers %s, spills %s, "
          "shared memory %s bytes, %d warps" %
          (a.dim, len(starts), heads, getattr(h, "n_regs", "?"), getattr(h, "n_spills", "?"),
           getattr(getattr(h, "metadata", None), "shared", "?"), a.warps))


if __name__ == "__main__":
    main()
