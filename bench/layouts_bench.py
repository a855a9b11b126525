# SPDX-License-Identifier: BSD-3-Clause
"""layouts_bench.py: block attention forward + backward through autograd on
the ads quick shapes (batch 1152, 4 heads, 64-token blocks, lengths uniform
in [0.4 L, L]), with q, k, v laid out as a model hands them over:

  contiguous  three contiguous [T, H, D] tensors, their gradients
  views       block_attention on q, k, v = qkv.unbind(1) of one [T, 3, H,
              D] tensor: recognised as one qkv, the packed path below
  qkvpacked   block_attention_qkvpacked(qkv): one packed gradient
  grouped     k, v with H / 2 heads (grouped-query attention)

Issue 19 asks the packed case timed against the contiguous one.
Contiguous q, k, v run the packed kernels; the other layouts the kernels
of a spec with `row_strides: true` (block_attention picks them by the
layout), which read views and grouped key heads in place and write the
packed gradient (where a library has none, views are copied and the
gradient stacked: the row's "row strides" column says which). Each row
is the median of CUDA-event times of 20 calls after 3 warm-ups, every
layout on the same values.

    python3 bench/layouts_bench.py [--dim 128] [--seqlen 1024] [--json OUT]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))

LAYOUTS = ("contiguous", "views", "qkvpacked", "grouped")


def layout_calls(torch, attngen, qkv, dout, offsets, causal):
    """{layout: fn()}: each runs forward and backward through autograd on
    its own leaves (made here, outside the timing) and returns the output."""
    T, _, H, D = qkv.shape
    q, k, v = (t.contiguous().requires_grad_() for t in qkv.unbind(1))
    packed = qkv.detach().clone().requires_grad_()
    kg, vg = (t[:, ::2].contiguous().requires_grad_() for t in (k.detach(), v.detach()))

    def contiguous():
        out = attngen.block_attention(q, k, v, offsets, causal=causal)
        torch.autograd.grad(out, (q, k, v), dout)
        return out

    def views():
        out = attngen.block_attention(*packed.unbind(1), offsets, causal=causal)
        torch.autograd.grad(out, packed, dout)
        return out

    def qkvpacked():
        out = attngen.block_attention_qkvpacked(packed, offsets, causal=causal)
        torch.autograd.grad(out, packed, dout)
        return out

    def grouped():
        out = attngen.block_attention(q, kg, vg, offsets, causal=causal)
        torch.autograd.grad(out, (q, kg, vg), dout)
        return out

    return {"contiguous": contiguous, "views": views, "qkvpacked": qkvpacked,
            "grouped": grouped}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dim", type=int, choices=(64, 128), nargs="+", default=[128, 64])
    ap.add_argument("--seqlen", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--json", help="write the rows here too")
    a = ap.parse_args(argv)

    import torch
    import attngen
    from peers.common import BlockTable, Shape, cuda_time

    rows = []
    for dim in a.dim:
        for L in a.seqlen:
            shape = Shape(1152, 4, dim, L, 0.7, 64, a.causal)
            table = BlockTable(shape.lengths(), shape.block)
            T, H = table.total, shape.heads
            offsets = torch.tensor(table.offsets, dtype=torch.int32, device="cuda")
            g = torch.Generator(device="cuda").manual_seed(dim + L)
            qkv = torch.randn(T, 3, H, dim, device="cuda", dtype=torch.bfloat16, generator=g)
            dout = torch.randn(T, H, dim, device="cuda", dtype=torch.bfloat16, generator=g)
            calls = layout_calls(torch, attngen, qkv, dout, offsets, a.causal)
            base = None
            for name in LAYOUTS:
                kernel = attngen.kernel_for(64, a.causal, dim, "bf16", backward=True,
                                            row_strides=name != "contiguous")
                ms = cuda_time(lambda i, f=calls[name]: f(), 1, 20)[0]
                base = base or ms
                row = {"shape": shape.label, "layout": name, "ms": round(ms, 4),
                       "vs_contiguous": round(base / ms, 3),
                       "row_strides": kernel.takes_row_strides(),
                       "kv_heads": kernel.takes_kv_heads()}
                rows.append(row)
                print("%-22s %-11s %8.3f ms  %.3fx contiguous  (row strides %s, kv_heads %s)"
                      % (row["shape"], name, ms, base / ms, row["row_strides"],
                         row["kv_heads"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "gpu": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    main()
