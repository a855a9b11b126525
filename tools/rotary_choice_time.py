# SPDX-License-Identifier: BSD-3-Clause
"""rotary_choice_time.py: times the block-diagonal rotary specs that
generator/plan_block.c's choices change, through the Python binding on
data made on the GPU (`attngen run` fills its inputs on the host, minutes
at these sizes). One process per libattngen build (ATTNGEN_LIB), each
printing one line per (L, spec, pass):

    ATTNGEN_LIB=/tmp/lib_off.so python3 tools/rotary_choice_time.py off
    ATTNGEN_LIB=/tmp/lib_off.so python3 tools/rotary_choice_time.py off --compile-only

Shape: batch 1152, 4 heads, 64-token blocks, lengths uniform in
[0.4 L, L] (seed 7), L 1024 and 4096, bf16. Times are CUDA-event medians
of 20 calls after 3 warm-ups; TB/s counts Q, K, V (and the table) read
and O written (forward), Q, K, V, dO (and the table) read and dQ, dK, dV
written (backward). Correctness is the GPU suite's (tools/gpu_session.sh
gpu-rotary), not this script's."""
import os
import sys

_root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(_root, "bindings", "python"))
sys.path.insert(0, os.path.join(_root, "bench"))
from peers.common import cuda_time  # noqa: E402  (the harness's CUDA-event timing)

SPECS = [  # name, head_dim, positions, layout (None: no rotary)
    ("r128t", 128, "table", "interleaved"), ("r128h", 128, "table", "half"),
    ("r64t", 64, "table", "interleaved"), ("r64s", 64, "sequence", "interleaved"),
    ("r128s", 128, "sequence", "interleaved"), ("p128", 128, None, None),
    ("p64", 64, None, None)]
BATCH, HEADS = 1152, 4


def spec_dict(name, dim, positions, layout):
    d = {"name": name, "pattern": "block_diagonal", "block_size": 64, "head_dim": dim,
         "dtype": "bf16", "passes": ["forward", "backward"]}
    if positions:
        d["rotary"] = {"layout": layout, "apply_to": ["q", "k"], "positions": positions}
        if positions != "table":
            d["rotary"]["base"] = 10000.0
    return d


def timed(fn):
    """Median milliseconds of fn() over 20 calls after 3 warm-ups."""
    return cuda_time(lambda _: fn(), 1, 20)[0]


def main():
    label = sys.argv[1]
    compile_only = "--compile-only" in sys.argv
    import attngen
    kernels = {s[0]: attngen.load(spec_dict(*s)) for s in SPECS}
    if compile_only:
        print("%s: compiled %d specs" % (label, len(kernels)), flush=True)
        return
    import torch
    g = torch.Generator().manual_seed(7)
    for L in (1024, 4096):
        lengths = torch.randint(int(L * 0.4), L + 1, (BATCH,), generator=g)
        offsets = torch.zeros(BATCH + 1, dtype=torch.int32)
        offsets[1:] = torch.cumsum(lengths, 0)
        tokens = int(offsets[-1])
        offsets = offsets.cuda()
        for name, dim, positions, _ in SPECS:
            kern = kernels[name]
            q, k, v, do = (torch.randn(tokens, HEADS, dim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(4))
            table = None
            if positions == "table":
                ang = torch.rand(tokens, dim // 2, device="cuda") * 6.28
                table = torch.cat([ang.sin(), ang.cos()], 1).to(torch.bfloat16).contiguous()
            tb = table.numel() * 2 if table is not None else 0
            x = q.numel() * 2
            with torch.no_grad():
                f = timed(lambda: kern(q, k, v, offsets, rotary_table=table))
            b = timed(lambda: kern.backward(q, k, v, do, offsets, rotary_table=table))
            print("%s L%d %s: fwd %.4f ms %.2f TB/s  bwd %.4f ms %.2f TB/s" % (
                label, L, name, f, (4 * x + tb) / f / 1e9, b, (7 * x + tb) / b / 1e9), flush=True)
            del q, k, v, do, table
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
