# SPDX-License-Identifier: BSD-3-Clause
"""broadcast_rotary.py: broadcast-Q attention with rotary embeddings, fused
(attngen.broadcast_attention(rotary=...)) against the fair unfused route a
user could build from attngen itself: the Triton rotary pass of
bench/peers/rope_triton.py over q (n_q rows) and k, then the non-rotary
broadcast_attention, autograd rotating dq and dk back. Both use the same
tables (query row i's and each key's, sin | cos), so they compute the same
function; the script checks that the outputs and gradients agree. Batch
1152, 4 heads, keys uniform in [0, L], bf16, tables on q and k (the
interleaved layout: the layout every one-pass kernel rotates in); the
rotary pass alone with its bytes over time; CUDA events, median of
--iters.

    python bench/broadcast_rotary.py --dims 64,128 --nq 32,128 --seqlen 1024

Prints a markdown table (and writes it with --out). bench/RESULTS-broadcast.md
estimates the unfused route by bytes (session 41); this measures it."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rotary_parts import timed  # noqa: E402


def make(n_q, lens, heads, dim, seed):
    """q, k, v (requiring grad), cu_seqlens_k and the two tables [rows, dim]
    (sin | cos of random angles, bf16) on the GPU."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = int(lens.sum())
    q = torch.randn(n_q, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.cumsum(lens.cuda(), 0)

    def table(rows):
        a = (torch.rand(rows, dim // 2, device="cuda", generator=g) - 0.5) * 6.2831853
        return torch.cat((a.sin(), a.cos()), dim=-1).to(torch.bfloat16)

    return [t.requires_grad_() for t in (q, k, v)], cu, table(n_q), table(total)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--nq", default="32,128")
    ap.add_argument("--seqlen", type=int, default=1024, help="keys uniform in [0, L]")
    ap.add_argument("--batch", type=int, default=1152)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None, help="also write the table to this .md file")
    a = ap.parse_args(argv)
    import torch
    import attngen
    from peers import rope_triton

    rope = rope_triton.function()
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(0, a.seqlen + 1, (a.batch,), generator=gen, dtype=torch.int32)
    lines = ["| D | n_q | pass | fused ms | unfused ms | fused / unfused | rotary pass ms (TB/s) |",
             "|---|---|---|---|---|---|---|"]
    rotary = {"layout": "interleaved", "apply_to": ["q", "k"], "positions": "table"}
    for dim in [int(x) for x in a.dims.split(",")]:
        for n_q in [int(x) for x in a.nq.split(",")]:
            (q, k, v), cu, tq, tk = make(n_q, lens, a.heads, dim, seed=dim + n_q)
            h = dim // 2

            def fused():
                return attngen.broadcast_attention(q, k, v, cu, rotary=rotary, rotary_table=tq,
                                                   rotary_table_k=tk)

            def unfused():
                qr = rope.apply(q, tq[:, h:], tq[:, :h], "interleaved")
                kr = rope.apply(k, tk[:, h:], tk[:, :h], "interleaved")
                return attngen.broadcast_attention(qr, kr, v, cu)

            out_f, out_u = fused(), unfused()
            dout = torch.randn_like(out_f)
            g_f = torch.autograd.grad(out_f, (q, k, v), dout)
            g_u = torch.autograd.grad(out_u, (q, k, v), dout)
            errs = [((x.float() - y.float()).norm() / y.float().norm()).item()
                    for x, y in zip((out_f,) + g_f, (out_u,) + g_u)]
            assert max(errs) < 2e-2, "fused and unfused differ: %s" % errs
            with torch.no_grad():
                fwd = (timed(fused, a.iters), timed(unfused, a.iters))

            def both(fn):
                def run():
                    torch.autograd.grad(fn(), (q, k, v), dout)
                return run

            fb = (timed(both(fused), a.iters), timed(both(unfused), a.iters))
            kd = k.detach()
            pass_ms = timed(lambda: rope_triton.rotate(kd, tk[:, h:], tk[:, :h],
                                                       layout="interleaved"), a.iters)
            tbs = rope_triton.bytes_moved(kd, tk[:, :h]) / pass_ms / 1e9
            for name, (f, u) in (("forward", fwd), ("forward + backward", fb)):
                lines.append("| %d | %d | %s | %.3f | %.3f | %.2f | %.3f (%.2f) |"
                             % (dim, n_q, name, f, u, f / u, pass_ms, tbs))
            print(lines[-2] + "\n" + lines[-1], flush=True)
    text = "\n".join(["%s, batch %d, %d heads, keys uniform in [0, %d], bf16, interleaved tables "
                      "on q and k, median of %d" % (torch.cuda.get_device_name(), a.batch,
                                                    a.heads, a.seqlen, a.iters), ""] + lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
