#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""profile_bwd_pair.py: one jagged backward (batch 1152, 4 heads, lengths
uniform in [1, L], bf16, the jagged bench's inputs) by attngen or by
FlashAttention-4, warmed up, then once more between
torch.cuda.profiler.start() and stop(), so that
`ncu --profile-from-start off` sees exactly that call's kernels:

    ncu --profile-from-start off --set full -o REP \\
        python3 tools/jagged_dev/profile_bwd_pair.py attngen|fa4 [L] [D] [causal]

Prints the call's time (jagged_bench's CUDA-event median) when run without ncu.
Times nothing else; bench/jagged_bench.py is the benchmark."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "bindings", "python"))


def main():
    which = sys.argv[1]
    L = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    D = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    causal = len(sys.argv) > 4 and sys.argv[4] == "causal"
    import torch
    import jagged_bench as jb

    if which == "fa4":
        peer = jb.Fa4()
    elif which == "attngen":
        peer = jb.Attngen()
    else:
        raise SystemExit("usage: profile_bwd_pair.py attngen|fa4 [L] [D] [causal]")
    g = torch.Generator().manual_seed(1234)
    lens = [int(x) for x in torch.randint(1, L + 1, (jb.BATCH,), generator=g)]
    cu_list = [0]
    for n in lens:
        cu_list.append(cu_list[-1] + n)
    total = cu_list[-1]
    dev = "cuda"
    q, k, v, dout = (torch.randn(total, jb.HEADS, D, generator=g).to(dev, torch.bfloat16)
                     for _ in range(4))
    cu = torch.tensor(cu_list, dtype=torch.int32, device=dev)
    qg, kg, vg = (t.requires_grad_() for t in (q, k, v))
    out = peer(qg, kg, vg, cu, L, causal)

    def bwd():
        return torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)

    ms = jb._time(bwd)  # the bench's CUDA-event median (warm-ups included)
    torch.cuda.profiler.start()
    bwd()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("%s L %d D %d%s: backward %.3f ms (median of %d)"
          % (which, L, D, " causal" if causal else "", ms, jb.ITERS))


if __name__ == "__main__":
    main()
