#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""bwd_gen.py: expand templates/jagged_bwd.cu for the jagged backward dev
harness (tools/jagged_dev/bwd_test.cu). A dev tool, not the generator: it
mimics expand.c's rules (@NAME@, '@include name@' lines, '@#' lines dropped,
an unknown placeholder is an error) and writes one header holding every
variant in its own namespace plus a table of them.

usage: bwd_gen.py OUT.cuh [fast]   (variants: see VARIANTS below)
"""
import math, re, sys, os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwd_patches  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TPL = os.path.join(ROOT, "templates")


def jagged_params(forward, rotary_table):
    """A jagged kernel's @PARAMS@, as generator/emit_params.c writes them
    for plan_jagged.c's role order."""
    t = "const unsigned short *__restrict__ "
    heads = ([t + "q", t + "k", t + "v", "unsigned short *__restrict__ o",
              "float *__restrict__ lse"] if forward else
             [t + "q", t + "k", t + "v", t + "o", t + "dout", "const float *__restrict__ lse",
              "unsigned short *__restrict__ dq", "unsigned short *__restrict__ dk",
              "unsigned short *__restrict__ dv", "float *__restrict__ di"])
    tables = [t + "rotary_table", t + "rotary_table_k"] if rotary_table else []
    tail = ["const int *__restrict__ cu_seqlens_q", "const int *__restrict__ cu_seqlens_k",
            "long long batch", "int heads", "int kv_heads", "long long total_q",
            "long long total_k", "long long num_tiles"]
    return ",\n    ".join(heads + tables + tail)


def expand(name, vals, seen=()):
    if "PARAMS" not in vals:
        on = vals.get("ROTARY_TABLE") not in (None, False, 0, "", "false", "0")
        vals = dict(vals, PARAMS=jagged_params(os.path.basename(name).startswith("jagged_fwd"), on))
    out = []
    stack = []  # one entry per open @if@: is its text kept
    for line in open(os.path.join(TPL, name)).read().split("\n"):
        if line.startswith("@#"):
            continue
        skip = not all(stack)
        m = re.fullmatch(r"@if ([A-Z0-9_]+)@", line.strip())
        if m:
            stack.append(not skip and vals[m.group(1)] not in (False, 0, "", "false"))
            continue
        if line.strip() == "@else@":
            stack[-1] = all(stack[:-1]) and not stack[-1]
            continue
        if line.strip() == "@endif@":
            stack.pop()
            continue
        if skip:
            continue
        m = re.fullmatch(r"@include ([A-Za-z0-9_.]+)@", line.strip())
        if m:
            out.append(expand(m.group(1), vals, seen + (name,)))
            continue
        def sub(mm):
            k = mm.group(1)
            if k not in vals:
                raise SystemExit(f"{name}: unknown placeholder @{k}@")
            return str(vals[k])
        out.append(re.sub(r"@([A-Z0-9_]+)@", sub, line))
    return "\n".join(out)


def flit(x):
    return repr(float(x)) + "f"


def smem_dq(d, bm, bn):
    return 4 * d * (bm + 2 * bn) + 8 * bm


def smem_dkv(d, bm, bn):
    return 4 * d * (bn + 2 * bm) + 16 * bm


# (dtype, head_dim, causal, window, left, right, block)
VARIANTS = []
for dt in ("bf16", "f16"):
    for d in (64, 128):
        for causal in (False, True):
            VARIANTS.append((dt, d, causal, False, -1, -1, 64))
for dt, d in (("bf16", 128), ("f16", 64)):
    VARIANTS.append((dt, d, False, True, 100, 0, 64))
    VARIANTS.append((dt, d, False, True, 64, 32, 64))
    VARIANTS.append((dt, d, True, True, 128, 0, 64))
# tile-size alternatives for timing (bf16, no window)
for d in (64, 128):
    for causal in (False, True):
        VARIANTS.append(("bf16", d, causal, False, -1, -1, 128))
# the fast (atomic dQ) variant: (..., block, fast)
VARIANTS = [v + (False,) for v in VARIANTS]
for d in (64, 128):
    for causal in (False, True):
        VARIANTS.append(("bf16", d, causal, False, -1, -1, 64, True))
VARIANTS.append(("f16", 64, True, True, 128, 0, 64, True))
VARIANTS.append(("f16", 128, False, True, 64, 32, 64, True))
# the sm_90a (wgmma) fast variant: fast == 2, 128 keys a CTA
SM90 = []
for dt in ("bf16", "f16"):
    for d in (64, 128):
        for causal in (False, True):
            SM90.append((dt, d, causal, False, -1, -1, 128, 2))
SM90.append(("bf16", 128, False, True, 100, 0, 128, 2))
SM90.append(("f16", 64, False, True, 64, 32, 128, 2))
SM90.append(("bf16", 64, True, True, 128, 0, 128, 2))
# head dim 64 with one warpgroup a CTA (64 keys, two CTAs an SM)
for causal in (False, True):
    SM90.append(("bf16", 64, causal, False, -1, -1, 64, 2))
SM90.append(("f16", 64, False, True, 64, 32, 64, 2))
SM90.append(("bf16", 64, True, True, 128, 0, 64, 2))
# (The column-range mask of jagged_bwd_ws.cu was timed here as "sm90q",
# bwd_patches.py's "sm90q" of jagged_bwd_sm90.cu; it ships since session
# 29: bench/results/2026-12-06-h100-jagged-bwd-s29.log.)
# A 9th field names another template (relative to templates/) to time
# against the shipped one: such variants are named "sm90q ...". The
# dQ-first order of templates/jagged_bwd_sm90.cu was measured this way
# (bench/RESULTS-jagged.md, 2026-12-02).
# A 10th field (a dict of knobs with TAG) named variants of a copy of the
# template with knobs, tools/jagged_dev/jagged_bwd_sm90_x.cu (removed once
# its winner, three CTAs an SM at head dim 64, moved into the template;
# it is in git at cc065d5): bench/results/2026-12-03-h200-jagged-bwd-d64-occupancy.md.
# ATTNGEN_DEV_ALL=1 keeps every variant; by default the bf16 split ones
# (to time against) and the sm_90a ones
if not os.environ.get("ATTNGEN_DEV_ALL"):
    VARIANTS = [v for v in VARIANTS if v[0] == "bf16" and not v[3] and v[6] == 64 and not v[7]]
VARIANTS += SM90
# The warp-specialized backward (templates/jagged_bwd_ws.cu), named "ws-s2 ...":
# 128 keys a CTA, two computing warpgroups and a loading one; STAGES Q/dO
# stages (the 9th field, a template, and the 10th, its knobs). Its dQ
# accumulator in tiles won over a bulk add a row (the s2t against s2 rows
# of bench/results/2026-12-03-h200-jagged-bwd-ws-harness.log); three stages
# at head dim 64 (s3) gained nothing.
WS = "jagged_bwd_ws.cu"
for dt in ("bf16", "f16"):
    for d in (64, 128):
        for causal in (False, True):
            VARIANTS.append((dt, d, causal, False, -1, -1, 128, 2, WS, {"STAGES": 2, "TAG": "s2"}))
# head dim 64 with 128-row query steps (BLOCK_M 128), named "ws-m128 ..."
M128 = {"STAGES": 2, "TAG": "m128", "BLOCK_M": 128}
for dt in ("bf16", "f16"):
    for causal in (False, True):
        VARIANTS.append((dt, 64, causal, False, -1, -1, 128, 2, WS, M128))
VARIANTS.append(("f16", 64, False, True, 64, 32, 128, 2, WS, M128))
VARIANTS.append(("bf16", 64, True, True, 128, 0, 128, 2, WS, M128))
# Tried on the H200 on 2026-12-04 as dev copies of the template (not kept;
# bench/results/2026-12-04-h200-jagged-bwd-ws-staged-stores.log), TFLOP/s at
# L 1024 / 4096 against the 64-row kernel:
# - 80-row steps at head dim 128 (FlashAttention-4's tile; d6dfcc6's
#   jagged_bwd_ws80.cu): correct, 0.87-0.92x.
# - the step's products reordered (dKV before the dS^T barrier; dV as soon
#   as P^T is made, dK before or after the barrier): 0.95-1.0x.
# - the next tile's K, V prefetched to L2 by the loader: 0.84-0.95x (the
#   24-register loader spills).
# - a bulk dQ add a warp instead of a warpgroup: 0.96-1.03x.
# - dK, dV stored 16 bytes a lane through the staging rows: 1.02-1.06x,
#   0.98x at L 4096 causal; now in the template.
# - dV and dK as one m64n128k16 a k-step at head dim 128 (0961eb0's
#   jagged_bwd_wsn.cu, "ws-n128"): causal 1.05-1.15x at L 1024 (0.98-1.0x
#   at 4096), 0.96-0.98x without a mask at L 1024 (0.98-1.01x at 4096); now
#   in the template for masked specs (DKV_N128).
# - the step's LSE and D read before the waits ("ws-early"): 0.94-0.99x
#   without a mask, causal 1.00-1.11x at L 1024 but 0.97x at 4096
#   (bench/results/2026-12-04-h200-jagged-bwd-ws-n128.log).
# Q and dO by TMA: the template's own path (TMA_QDO, off in the product
# until checked), named "ws-tma ..."; its kernels take the maps of q and
# dout last, which bwd_test.cu encodes (encode_rows_map) and passes.
TMA = {"STAGES": 2, "TAG": "tma", "TMA": True}
for dt in ("bf16", "f16"):
    for causal in (False, True):
        VARIANTS.append((dt, 128, causal, False, -1, -1, 128, 2, WS, TMA))
        VARIANTS.append((dt, 64, causal, False, -1, -1, 128, 2, WS, dict(TMA, BLOCK_M=128)))
VARIANTS.append(("bf16", 128, False, True, 100, 0, 128, 2, WS, TMA))
# head dim 64 with a window, on 128-row steps (the product's long route),
# against the "sm90 ... blk64" rows (its short route): where the route's
# threshold (plan_jagged.c, long_min_rows) stands for a band
VARIANTS.append(("bf16", 64, True, True, 128, 0, 128, 2, WS, dict(TMA, BLOCK_M=128)))
VARIANTS.append(("f16", 64, False, True, 64, 32, 128, 2, WS, dict(TMA, BLOCK_M=128)))
# dQ rounded in _kv by two dQ warps (FUSED_DQ, off in the product until
# checked; head dim 128 with TMA), named "ws-fdq ...": no _dq launched.
FDQ = {"STAGES": 2, "TAG": "fdq", "TMA": True, "FUSED": True}
for dt in ("bf16", "f16"):
    for causal in (False, True):
        VARIANTS.append((dt, 128, causal, False, -1, -1, 128, 2, WS, FDQ))
VARIANTS.append(("bf16", 128, False, True, 100, 0, 128, 2, WS, FDQ))
VARIANTS.append(("bf16", 128, False, True, 100, 0, 128, 2, WS, {"STAGES": 2, "TAG": "s2"}))
# Session 28's "ws-stm" (dS^T by stmatrix) and "ws-msk" (the column-range
# mask) are in the template since ae67c63 and 6afc2f8; their copies are in
# git at 3f8a1bd. The variants below are edits to the shipped template
# (tools/jagged_dev/bwd_patches.py; knob PATCH), each timed beside ws-tma.
# ("ws-kt", the loader's KeyTile handed over in shared memory, ships
# since session 29: bench/results/2026-12-06-h100-jagged-bwd-s29.log.)
# Part of P's exp2 as a polynomial on the FMA pipe (MUFU.EX2 issues 16
# a clock an SM: the traced P phase), chunks j % POLY == POLY - 1 (POLY 4:
# a quarter, 2: half), "ws-poly4", "ws-poly2".
for every in (4, 2):
    PL = dict(TMA, TAG="poly%d" % every, PATCH="poly", POLY=every)
    for causal in (False, True):
        VARIANTS.append(("bf16", 128, causal, False, -1, -1, 128, 2, WS, PL))
        VARIANTS.append(("bf16", 64, causal, False, -1, -1, 128, 2, WS, dict(PL, BLOCK_M=128)))
    VARIANTS.append(("f16", 64, False, True, 64, 32, 128, 2, WS, dict(PL, BLOCK_M=128)))
# The template traced (clock64 at each phase of 256 steps of CTA 0, the
# per-warpgroup means printed at its end), named "ws-trace ...": where a
# step's time goes (bench/NOTES.md, session 28).
TRC = dict(TMA, TAG="trace", PATCH="trace")
for causal in (False, True):
    VARIANTS.append(("bf16", 128, causal, False, -1, -1, 128, 2, WS, TRC))
    VARIANTS.append(("bf16", 64, causal, False, -1, -1, 128, 2, WS, dict(TRC, BLOCK_M=128)))
VARIANTS.append(("f16", 64, False, True, 64, 32, 128, 2, WS, {"STAGES": 2, "TAG": "s2"}))
VARIANTS.append(("bf16", 64, True, True, 128, 0, 128, 2, WS, {"STAGES": 2, "TAG": "s2"}))


def smem_ws(d, bn, stages, bm=64):
    """jagged_bwd_ws.cu's @SMEM_BYTES@ (plan_jagged.c's ws_smem_bytes)."""
    kv_slots = 2 if d == 64 else 1
    return 4 * d * (kv_slots * bn + stages * bm) + 4 * bn * bm + 8 * stages * bm + bn // 64 * 64 * 64 * 4


def sm90_min_ctas(d, bn):
    return 3 if d == 64 and bn == 64 else 1  # as plan_jagged.c


def smem_sm90(d, bn, bm=64, knobs=None):
    sl = 2
    stage, stride = (1, 68) if sm90_min_ctas(d, bn) == 3 else (2, 72)
    if knobs:
        sl, stride = knobs["SLOTS"], knobs["STAGE_STRIDE"]
        stage = 0 if knobs["DQ_RED"] else knobs["STAGE_SLOTS"]
    return 4 * d * (bn + sl * bm) + 2 * bn * bm + 8 * sl * bm + stage * (bn // 64) * 64 * stride * 4


def main():
    out = sys.argv[1]
    parts = ["// generated by tools/jagged_dev/bwd_gen.py; do not edit\n"]
    table = []
    only = re.compile(os.environ.get("BWD_ONLY", ""))  # a regex on the variant names
    for i, v in enumerate(VARIANTS):
        dt, d, causal, window, left, right, blk, fast = v[:8]
        tpl = v[8] if len(v) > 8 else None
        knobs = v[9] if len(v) > 9 else None
        prefix = (f"ws-{knobs['TAG']} " if tpl == WS else f"sm90x-{knobs['TAG']} " if knobs else
                  "sm90q " if tpl else {0: "", 1: "fast ", 2: "sm90 "}[int(fast)])
        label = (f'{prefix}{dt} d{d} {"causal" if causal else "full"}'
                 f'{f" win[{left},{right}]" if window else ""} blk{blk}')
        if not only.search(label):
            continue
        warps = blk // 16
        sd, sk = smem_dq(d, blk, blk), smem_dkv(d, blk, blk)
        min_ctas = 1 if blk > 64 else max(1, min(2, (227 * 1024) // (max(sd, sk) + 2 * blk * blk)))
        scale = 1.0 / math.sqrt(d)
        name = f"jbwd{i}"
        vals = dict(KERNEL_NAME=name, HEAD_DIM=d, BLOCK_M=blk, BLOCK_N=blk, WARPS=warps,
                    MIN_CTAS=min_ctas, SMEM_BYTES_DQ=sd, SMEM_BYTES_DKV=sk, SCALE=flit(scale),
                    SCALE_LOG2=flit(scale * math.log2(math.e)), SCALE_TEXT=f"1/sqrt({d})",
                    MMA_TYPE=dt, PAIR_TYPE=dt + "x2", CAUSAL="true" if causal else "false",
                    WINDOW="true" if window else "false", WINDOW_LEFT=left, WINDOW_RIGHT=right,
                    BROADCAST=0, SUM_THREADS=256, ROTARY="false", ROTARY_TABLE="false")
        if tpl == WS:
            bm = knobs.get("BLOCK_M", 64)
            sk = smem_ws(d, blk, knobs["STAGES"], bm)
            vals.update(BLOCK_M=bm, BLOCK_N=blk, SMEM_BYTES=sk, ROWS_THREADS=256, WGMMA_N128=bm == 128,
                        STAGES=knobs["STAGES"], ROTARY_HALF="false")
            vals["DKV_N128"] = d == 128 and (causal or window)  # as plan_backward_ws
            vals["FUSED_DQ"] = "true" if knobs.get("FUSED") else "false"
            if knobs.get("FUSED"):
                sk += 2 * 64 * 64 * 4  # the dQ warps' buffers
                vals["SMEM_BYTES"] = sk
            tma = knobs.get("TMA", False)
            vals["TMA_QDO"] = "true" if tma else "false"
            if tma:  # the maps last, as plan_jagged.c's add_tma_params
                vals["PARAMS"] = (jagged_params(False, False) +
                                  ",\n    const __grid_constant__ ag_tmap tmap_q"
                                  ",\n    const __grid_constant__ ag_tmap tmap_dout")
            for key in ("WARPS", "MIN_CTAS", "SMEM_BYTES_DQ", "SMEM_BYTES_DKV", "BROADCAST",
                        "SUM_THREADS"):
                del vals[key]
            sd = 0
            warps = blk // 16 + 4  # a loading warpgroup and 128 * blk / 64 computing threads
        elif fast == 2:
            sk = smem_sm90(d, blk, knobs=knobs)
            vals.update(BLOCK_M=64, BLOCK_N=blk, SMEM_BYTES=sk, ROWS_THREADS=256, DKV_N128=False,
                        FUSED_DQ="false")
            for key in ("WARPS", "MIN_CTAS", "SMEM_BYTES_DQ", "SMEM_BYTES_DKV", "BROADCAST",
                        "SUM_THREADS"):
                del vals[key]
            vals["MIN_CTAS"] = sm90_min_ctas(d, blk)  # the template's (not the split kernels')
            if knobs:
                vals.update({k: x for k, x in knobs.items() if k != "TAG"})
            sd = 0
            warps = blk // 16  # 128 * blk / 64 threads
        patch = knobs.get("PATCH") if tpl == WS and knobs else None
        if tpl and tpl.startswith("patch:"):
            patch = tpl[len("patch:"):]
        if patch:  # an edited template (bwd_patches.py), with its own knobs as placeholders
            if tpl == WS:
                vals.update({k: x for k, x in knobs.items()
                             if k not in ("TAG", "PATCH", "STAGES", "TMA", "FUSED", "BLOCK_M")})
            path = os.path.join(os.path.dirname(os.path.abspath(out)), "patched_%s.cu" % patch)
            with open(path, "w") as f:
                f.write(bwd_patches.patched(TPL, patch))
        src = os.path.relpath(path, TPL) if patch else tpl
        text = expand(src or {0: "jagged_bwd.cu", 1: "../tools/jagged_dev/jagged_bwd_fast.cu", 2: "jagged_bwd_sm90.cu"}[int(fast)], vals)
        parts.append(f"namespace v{i} {{\n" + text + f"\n}}  // namespace v{i}\n")
        tma_rows = bm if tpl == WS and knobs.get("TMA") else 0
        cast = "(KFn)" if tma_rows else ""  # TMA entry points take two more parameters
        table.append(f'  {{"{label}", {int(dt == "bf16")}, {d}, '
                     f'{int(causal)}, {int(window)}, {left}, {right}, {blk}, {warps * 32}, {sd}, {sk}, ' +
                     (f'nullptr, nullptr, 2, {cast}v{i}::{name}_pre, {cast}v{i}::{name}_kv, {cast}v{i}::{name}_dq, {tma_rows}, {int(bool(knobs and knobs.get("FUSED")))}}},' if fast == 2 else
                      f'v{i}::{name}_dq, v{i}::{name}_dkv, {int(fast)}, ' +
                     (f'v{i}::{name}_fast_pre, v{i}::{name}_fast_dkv, v{i}::{name}_fast_post}},' if fast
                      else 'nullptr, nullptr, nullptr},')))
    parts.append("static const Variant kVariants[] = {\n" + "\n".join(table) + "\n};\n")
    parts.append(f"static const int kNumVariants = {len(table)};\n")
    open(out, "w").write("\n".join(parts))


if __name__ == "__main__":
    main()
