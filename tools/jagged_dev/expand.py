#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""expand.py: dev-only expansion of a template of templates/ into plain CUDA C,
mirroring the generator's engine for what the jagged templates use: lines
`@include NAME@` inline templates/NAME, lines starting with `@#` are dropped,
`@if NAME@` blocks kept or dropped, `@NAME@` is substituted; a placeholder
without a value is an error (bwd_gen.py's expand).

  expand.py --dtype bf16 --head-dim 128 --block-m 128 --block-n 64 --warps 4 \
      --stages 2 --min-ctas 2 --causal 0 --window 0 --left -1 --right -1 \
      [--scale S] [--template jagged_fwd.cu] [--name NAME] -o out.cuh

Also writes `#define JV_*` lines at the top for the dev harness (dtype,
scale, window), which the generator's output would not have."""
import argparse, math, os, re, sys

TDIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "templates")


def expand(name, values):
    """bwd_gen.py's expansion (with @if NAME@ / @else@ / @endif@)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bwd_gen
    return bwd_gen.expand(name, values) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--template", default="jagged_fwd.cu")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-m", type=int, default=128)
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--min-ctas", type=int, default=1)
    ap.add_argument("--causal", type=int, default=0)
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--left", type=int, default=-1)
    ap.add_argument("--right", type=int, default=-1)
    ap.add_argument("--scale", type=float, default=0.0, help="0: 1/sqrt(head_dim)")
    ap.add_argument("--name", default="jagged_fwd_kernel")
    ap.add_argument("--no-skip", action="store_true",
                    help="experiment: turn off the warps' tile skipping (text edit)")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    scale = a.scale if a.scale > 0 else 1.0 / math.sqrt(a.head_dim)
    smem = (a.block_m + 2 * a.stages * a.block_n) * a.head_dim * 2
    mma, pair = ("bf16", "bf16x2") if a.dtype == "bf16" else ("f16", "f16x2")
    values = {
        "KERNEL_NAME": a.name, "HEAD_DIM": a.head_dim, "BLOCK_M": a.block_m,
        "BLOCK_N": a.block_n, "WARPS": a.warps, "STAGES": a.stages, "MIN_CTAS": a.min_ctas,
        "SMEM_BYTES": smem, "SCALE_LOG2": "%.9ef" % (scale * math.log2(math.e)),
        "SCALE_TEXT": "%.9g" % scale, "MMA_TYPE": mma, "PAIR_TYPE": pair,
        "CAUSAL": "true" if a.causal else "false", "WINDOW": "true" if a.window else "false",
        "WINDOW_LEFT": a.left, "WINDOW_RIGHT": a.right, "BROADCAST": "false",
        "ROTARY": "false", "ROTARY_TABLE": "false", "ROTARY_HALF": "false", "TMA_KV": "false",
    }
    body = expand(a.template, values)
    if a.no_skip:
        for old, new in (("constexpr bool kWarpSkip = kHeadDim <= 64;",
                          "constexpr bool kWarpSkip = false;"),):
            if old not in body:
                sys.exit(f"--no-skip: {old!r} not found")
            body = body.replace(old, new)
    head = (f"#define JV_FP16 {1 if a.dtype == 'fp16' else 0}\n"
            f"#define JV_SCALE {scale!r}\n#define JV_CAUSAL {a.causal}\n"
            f"#define JV_WINDOW {a.window}\n#define JV_LEFT {a.left}\n#define JV_RIGHT {a.right}\n"
            f"#define JV_KERNEL {a.name}\n#define JV_DESC \"{a.dtype} d{a.head_dim} m{a.block_m} "
            f"n{a.block_n} w{a.warps} s{a.stages} c{a.min_ctas} causal{a.causal} "
            f"win{a.window}[{a.left},{a.right}]\"\n")
    with open(a.output, "w") as f:
        f.write(head + body)


if __name__ == "__main__":
    main()
