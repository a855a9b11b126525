#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Jagged (variable-length) self-attention: attngen.jagged_attention against
FlashAttention-2 varlen (torch's varlen_attn, as bench/peers/varlen.py
reaches it, else flash_attn.flash_attn_varlen_func) and, when importable,
FlashAttention-4 (flash_attn.cute.flash_attn_varlen_func), side by side in
one process, forward, backward and forward+backward timed separately with
CUDA events (median of 10 after 3 warm-up calls).

Run from the repository root after `make build/libattngen.so`:

    PYTHONPATH=bindings/python python3 bench/jagged_bench.py --out bench/results/jagged
    PYTHONPATH=bindings/python python3 bench/jagged_bench.py --quick --out /tmp/jq

Shapes: batch 1152, 4 heads, head_dim 128 and 64, lengths uniform in [1, L]
(--spread s: [(2s-1)L, L], at least 1) for L in {1024, 4096} (--more-lengths
adds 512 and 2048), causal and not: 8 shapes (--quick: L 1024 only, 4).
Inputs are standard normal bf16, with a fixed seed per shape.

Useful FLOPs: forward 4 * D * heads * (visible query-key pairs), the pairs
counted exactly from the lengths (L^2 per sequence, L(L+1)/2 causal);
backward 2.5x the forward; forward+backward 3.5x. Ratios are peer time /
attngen time (> 1: attngen is faster).

Correctness: once per shape attngen's output (and its dq, dk, dv) are
compared with FA2's (relative Frobenius error), and its output on a few
sampled sequences with a float64 reference; a row whose error exceeds
2e-2 is flagged with "!" so a fast wrong kernel cannot pass.

--rotary: rotary embeddings on q and k (half layout, each token at its
index in its sequence, base 10000) in every pass. attngen fuses them (a
spec with `rotary: {layout: half, positions: sequence}`); FA2 and FA4 run
after a separate rotary pass (fp32 math from cos/sin tables of the tokens'
positions, built once per shape outside the timed region, as a framework
caches them), autograd differentiating through both. The pass is a
bandwidth-bound Triton kernel (bench/peers/rope_triton.py; its own time
and TB/s on q and k are reported per shape, so the table says how near its
ceiling it runs), or with --rotary-peer compile a torch.compile'd one.
FLOPs and TFLOP/s count the attention alone; the float64 reference
rotates too.

--peers (default fa2,fa4) adds cuDNN and FlexAttention, the issue's other
peers: cudnn is SDPA's cuDNN backend on q, k, v padded to [batch, L] (the
pad and gather timed; no varlen cuDNN path exists on sm90), flex is
torch.compile(flex_attention) with a document BlockMask built from the
offsets (doc_block_lists), its compile time noted per shape. Each is
checked against FA2 (out and gradients, in the row's notes). --fwd-only
times the forward alone (tuning runs).

The pure-Python helpers (lengths, visible_pairs, flops, shapes, the flex
block lists) import
without torch (bench/tests/test_jagged_bench.py tests them on the CPU).
"""

import argparse
import datetime
import json
import math
import os
import random
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

BATCH = 1152
HEADS = 4
LENGTHS = (1024, 4096)
MORE_LENGTHS = (512, 2048)
HEAD_DIMS = (128, 64)
ERR_FLAG = 2e-2
ROPE_BASE = 10000.0
ROPE = {"layout": "half", "apply_to": ["q", "k"], "positions": "sequence", "base": ROPE_BASE}
BWD_FACTOR = 2.5
PEERS = ("fa2", "fa4", "cudnn", "flex")     # --peers picks among these
EXTRA_PEERS = ("cudnn", "flex")              # columns only when they ran
NAMES = {"fa2": "FA2", "fa4": "FA4", "cudnn": "cuDNN", "flex": "flex"}
WARMUP, ITERS = 3, 10


# ---- shapes and FLOPs (pure Python) -------------------------------------------

def lengths(batch, max_len, spread=None, seed=0):
    """Sequence lengths, uniform integers in [1, L], or in [(2s-1)L, L] (at
    least 1) with spread s; fixed by (seed, batch, L, spread)."""
    lo = 1 if spread is None else max(1, int(round((2 * float(spread) - 1) * max_len)))
    if lo > max_len:
        raise ValueError("spread %r gives an empty range [%d, %d]" % (spread, lo, max_len))
    rng = random.Random("%d/%d/%d/%r" % (seed, batch, max_len, spread))
    return [rng.randint(lo, max_len) for _ in range(batch)]


def visible_pairs(lens_q, lens_k=None, causal=False):
    """Query-key pairs that attention computes, summed over sequences:
    Lq*Lk each, or with the bottom-right-aligned causal mask (query i sees
    key j <= i + Lk - Lq) sum_i clamp(i + Lk - Lq + 1, 0, Lk), which is
    L(L+1)/2 for self-attention."""
    lens_k = lens_q if lens_k is None else lens_k
    total = 0
    for lq, lk in zip(lens_q, lens_k):
        lq, lk = int(lq), int(lk)
        if not causal:
            total += lq * lk
            continue
        d = lk - lq
        # rows i with i + d + 1 >= lk see all lk keys; rows with i + d + 1 <= 0 see none
        full_from = max(0, min(lq, lk - d - 1))      # first row seeing every key
        none_until = max(0, min(lq, -d))             # rows [0, none_until) see no key
        # rows [none_until, full_from): i + d + 1 keys, an arithmetic series
        a, b = none_until, full_from
        if b > a:
            total += (b - a) * (d + 1) + (a + b - 1) * (b - a) // 2
        total += (lq - max(full_from, none_until)) * lk
    return total


def fwd_flops(lens, head_dim, heads, causal):
    return 4 * head_dim * heads * visible_pairs(lens, causal=causal)


def bwd_flops(lens, head_dim, heads, causal):
    return BWD_FACTOR * fwd_flops(lens, head_dim, heads, causal)


def shapes(quick=False, more_lengths=False, spread=None, batch=BATCH, heads=HEADS,
           head_dims=HEAD_DIMS):
    """The shape dicts to run: D x L x causal (L 1024 alone with quick)."""
    ls = (1024,) if quick else tuple(sorted(LENGTHS + (MORE_LENGTHS if more_lengths else ())))
    out = []
    for d in head_dims:
        for L in ls:
            for causal in (False, True):
                out.append({"batch": batch, "heads": heads, "head_dim": d, "max_len": L,
                            "spread": spread, "causal": causal})
    return out


def label(sh):
    s = "B%d H%d D%d L%d" % (sh["batch"], sh["heads"], sh["head_dim"], sh["max_len"])
    if sh.get("spread") is not None:
        s += " s%g" % sh["spread"]
    return s + (" causal" if sh["causal"] else "")


def tflops(flops, ms):
    return None if not ms else flops / (ms * 1e-3) / 1e12


# ---- FlexAttention document block lists (pure Python) --------------------------

FLEX_BLOCK = 128


def doc_block_lists(cu, block=FLEX_BLOCK, causal=False):
    """The BlockMask lists of a document mask over packed self-attention
    (queries and keys share the offsets cu), in blocks of `block` tokens:
    for each query block the key blocks it must visit, split into full
    blocks (every pair visible: both blocks whole inside one sequence and,
    when causal, the key block wholly at or before the query block's first
    row; no mask_mod evaluated) and partial ones; and the transposed lists
    (for each key block the query blocks that visit it), which the backward
    reads. Built from the offsets in O(blocks visited), not from the
    total^2 pairs create_block_mask would evaluate."""
    import bisect
    cu = [int(x) for x in cu]
    total = cu[-1] if cu else 0
    nb = -(-total // block)
    kv_full = [[] for _ in range(nb)]
    kv_partial = [[] for _ in range(nb)]
    q_full = [[] for _ in range(nb)]
    q_partial = [[] for _ in range(nb)]
    for i in range(nb):
        qs, qe = i * block, min((i + 1) * block, total)
        d0 = bisect.bisect_right(cu, qs) - 1
        d1 = bisect.bisect_right(cu, qe - 1) - 1
        seen = {}
        for d in range(d0, d1 + 1):
            s, e = cu[d], cu[d + 1]
            if e <= s:
                continue
            kend = min(e, qe) if causal else e
            whole_q = d0 == d1 and qe - qs == block
            for j in range(s // block, (kend - 1) // block + 1):
                ks, ke = j * block, (j + 1) * block
                full = whole_q and ks >= s and ke <= e and (not causal or ke - 1 <= qs)
                seen[j] = full and j not in seen
        for j in sorted(seen):
            (kv_full if seen[j] else kv_partial)[i].append(j)
            (q_full if seen[j] else q_partial)[j].append(i)
    return {"kv_full": kv_full, "kv_partial": kv_partial, "q_full": q_full,
            "q_partial": q_partial, "num_blocks": nb}


def pad_lists(lists):
    """(counts, rows): each list's length and the lists padded with 0 to
    one width (at least 1), as BlockMask's num_blocks / indices want."""
    width = max([1] + [len(x) for x in lists])
    return [len(x) for x in lists], [list(x) + [0] * (width - len(x)) for x in lists]


# ---- report (pure Python) -------------------------------------------------------

def _cell(ms, fl):
    if ms is None:
        return "—"
    t = tflops(fl, ms)
    return "%.3f (%.0f)" % (ms, t) if t is not None else "%.3f" % ms


def _ratio(peer_ms, ag_ms):
    if not peer_ms or not ag_ms:
        return "—"
    return "%.2fx" % (peer_ms / ag_ms)


def _err(x):
    if x is None:
        return "—"
    return ("%.1e" % x) + (" !" if x > ERR_FLAG else "")


def markdown(records, env, command):
    rope = env.get("rotary")
    lines = ["# attngen jagged attention vs FlashAttention varlen%s" %
             (" with rotary embeddings" if rope else ""), "",
             "Command (from the repository root):", "", "    " + command, ""]
    lines += ["- %s: %s" % (k, v) for k, v in env.items()] + [""]
    lines += ["Times in ms, (TFLOP/s) in brackets; FLOPs: forward 4·D·H·(visible pairs), "
              "backward 2.5x, forward+backward 3.5x. Ratio: FA2 time / attngen time "
              "(> 1: attngen faster). Errors: attngen vs FA2 (out; max of dq, dk, dv), and "
              "out vs a float64 reference on sampled sequences; ! flags > %g." % ERR_FLAG, ""]
    if rope:
        lines += ["Rotary: %s" % rope, ""]
    extra = [p for p in EXTRA_PEERS if any(p in r["times"] for r in records)]
    head = ["shape", "attngen fwd", "FA2 fwd", "ratio", "attngen bwd", "FA2 bwd", "ratio",
            "attngen fwd+bwd", "FA2 fwd+bwd", "ratio", "FA4 fwd", "FA4 bwd",
            "err out", "err grads", "err ref64"]
    for p in extra:
        head += ["%s fwd" % NAMES[p], "%s bwd" % NAMES[p]]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in records:
        f, b = r["flops_fwd"], r["flops_bwd"]
        t = {p: r["times"].get(p, {}) for p in ("attngen", "fa2", "fa4") + EXTRA_PEERS}
        row = [r["label"],
               _cell(t["attngen"].get("fwd"), f), _cell(t["fa2"].get("fwd"), f),
               _ratio(t["fa2"].get("fwd"), t["attngen"].get("fwd")),
               _cell(t["attngen"].get("bwd"), b), _cell(t["fa2"].get("bwd"), b),
               _ratio(t["fa2"].get("bwd"), t["attngen"].get("bwd")),
               _cell(t["attngen"].get("fwdbwd"), f + b), _cell(t["fa2"].get("fwdbwd"), f + b),
               _ratio(t["fa2"].get("fwdbwd"), t["attngen"].get("fwdbwd")),
               _cell(t["fa4"].get("fwd"), f), _cell(t["fa4"].get("bwd"), b),
               _err(r.get("err_out")), _err(r.get("err_grads")), _err(r.get("err_ref64"))]
        for p in extra:
            row += [_cell(t[p].get("fwd"), f), _cell(t[p].get("bwd"), b)]
        lines.append("| " + " | ".join(row) + " |")
    notes = [(r["label"], n) for r in records for n in r.get("notes", [])]
    if notes:
        lines += ["", "Notes:", ""] + ["- %s: %s" % (lbl, n) for lbl, n in notes]
    return "\n".join(lines) + "\n"


# ---- the GPU side (imports torch) -------------------------------------------------

def _time(fn, warmup=WARMUP, iters=ITERS):
    from peers.common import cuda_time
    med, _, _ = cuda_time(lambda i: fn(), 1, iters, warmup=warmup)
    return med


def _rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class Fa2:
    """FlashAttention-2 varlen: torch's varlen_attn as bench/peers/varlen.py
    calls it (the flash backend pinned), else flash_attn's."""

    def __init__(self):
        import contextlib
        self.context = contextlib.nullcontext
        try:
            from peers.varlen import VarlenPeer, _varlen_kwargs
            p = VarlenPeer()
            p.setup("full")
            self.fn, self._kw = p.fn, _varlen_kwargs
            if p.context is not None:
                self.context = p.context
            self.name = "torch varlen_attn %s" % p.signature
            self.kind = "torch"
        except Exception as e:
            try:
                from flash_attn import flash_attn_varlen_func
            except Exception as e2:
                raise RuntimeError("no FA2: torch varlen_attn: %s; flash_attn: %s" % (e, e2))
            self.fn = flash_attn_varlen_func
            self.kind = "flash_attn"
            import flash_attn
            self.name = "flash_attn %s flash_attn_varlen_func" % getattr(flash_attn,
                                                                           "__version__", "?")

    def __call__(self, q, k, v, cu, max_len, causal):
        if self.kind == "torch":
            return self.fn(q, k, v, cu, cu, max_len, max_len, **self._kw(self.fn, causal))
        return self.fn(q, k, v, cu, cu, max_len, max_len, causal=causal)


class Fa4:
    def __init__(self):
        from flash_attn.cute import flash_attn_varlen_func
        self.fn = flash_attn_varlen_func
        self.name = "flash_attn.cute.flash_attn_varlen_func"
        import contextlib
        self.context = contextlib.nullcontext

    def __call__(self, q, k, v, cu, max_len, causal):
        out = self.fn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len,
                      max_seqlen_k=max_len, causal=causal)
        return out[0] if isinstance(out, tuple) else out


def _first_line(e):
    text = str(e).strip()
    return "%s: %s" % (type(e).__name__, text.splitlines()[0][:300] if text else "")


def _is_cuda_failure(e):
    text = str(e)
    return "CUDA error" in text or "illegal" in text or "CUDA_ERROR" in text


class Cudnn:
    """SDPA's cuDNN backend on q, k, v padded to [batch, H, max_len, D]
    (torch reaches cuDNN's varlen path on sm100+ only): the pad copies and
    the gather of the output rows are inside the timed calls, autograd
    differentiates through them. Non-causal: a key-padding mask (boolean,
    else additive -inf if cuDNN refuses it); causal: SDPA's top-left
    is_causal, exact for self-attention (a valid query never sees a padded
    key). With equal lengths the tensors are views (no copy, no mask)."""

    def __init__(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
        self.sdpa_kernel, self.be, self.F = sdpa_kernel, SDPBackend.CUDNN_ATTENTION, F
        self.name = ("SDPA CUDNN_ATTENTION on q, k, v padded to [batch, max_len] (pad and "
                     "gather timed; no varlen cuDNN path on sm90)")

    def context(self):
        return self.sdpa_kernel([self.be])

    def prepare(self, q, cu_list, lens, max_len, causal):
        import torch
        B, L, dev = len(lens), max_len, q.device
        self.B, self.L = B, L
        self.uniform = all(n == L for n in lens)
        self.mask = self.idx = None
        self.causal = causal
        if self.uniform:
            return ["cudnn: equal lengths: viewed as [batch, %d] (no copy, no mask)" % L]
        lt = torch.tensor(lens, dtype=torch.int64, device=dev)
        starts = torch.tensor(cu_list[:-1], dtype=torch.int64, device=dev)
        pos = torch.arange(cu_list[-1], device=dev) - torch.repeat_interleave(starts, lt)
        self.idx = torch.repeat_interleave(torch.arange(B, device=dev) * L, lt) + pos
        note = "cudnn: padded to %d (copies timed)" % L
        if causal:
            return [note + ", is_causal (top left; exact for self-attention)"]
        self.mask = (torch.arange(L, device=dev)[None, :] < lt[:, None]).view(B, 1, 1, L)
        try:
            with self.context():
                self(q, q, q, None, L, causal)
                torch.cuda.synchronize()
            return [note + ", boolean key-padding mask"]
        except RuntimeError as e:
            if _is_cuda_failure(e):
                raise
            self.mask = torch.zeros(B, 1, 1, L, dtype=q.dtype, device=dev).masked_fill(
                ~self.mask, float("-inf"))
            return [note + ", additive -inf mask (boolean refused: %s)" % _first_line(e)[:120]]

    def release(self):
        self.mask = self.idx = None

    def _pad(self, t):
        B, L = self.B, self.L
        if self.uniform:
            return t.view(B, L, *t.shape[1:]).transpose(1, 2)
        p = t.new_zeros(B * L, *t.shape[1:]).index_copy(0, self.idx, t)
        return p.view(B, L, *t.shape[1:]).transpose(1, 2)

    def __call__(self, q, k, v, cu, max_len, causal):
        o = self.F.scaled_dot_product_attention(self._pad(q), self._pad(k), self._pad(v),
                                                attn_mask=self.mask,
                                                is_causal=causal and self.mask is None)
        o = o.transpose(1, 2).reshape(self.B * self.L, *q.shape[1:])
        return o if self.uniform else o.index_select(0, self.idx)


class Flex:
    """torch.compile(flex_attention) (default mode) on the packed tokens as
    one sequence [1, H, total, D] (a view), with a document BlockMask of
    128 x 128 blocks built from the offsets (doc_block_lists) instead of
    create_block_mask (which would evaluate total^2 pairs): full blocks
    skip the mask_mod, partial ones compare document ids (and positions,
    causal). Compiled once per shape (the first forward + backward, time
    noted); kernel tiles are the compiler's choice."""

    def __init__(self):
        import torch
        from torch.nn.attention.flex_attention import BlockMask, flex_attention
        self.BlockMask = BlockMask
        cfg = torch._dynamo.config
        for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                     "accumulated_cache_size_limit"):
            if hasattr(cfg, knob):
                setattr(cfg, knob, max(getattr(cfg, knob), 256))
        try:  # the compiled backward must accept retain_graph=True
            torch._functorch.config.donated_buffer = False
        except AttributeError:
            pass
        self.flex = torch.compile(flex_attention)
        self.name = "torch.compile(flex_attention), document BlockMask (128 x 128 blocks)"
        self.bm = None

    def context(self):
        import contextlib
        return contextlib.nullcontext()

    def prepare(self, q, cu_list, lens, max_len, causal):
        import torch
        notes = [self.build_mask(q.device, cu_list, lens, causal)]
        t1 = time.perf_counter()
        leaves = [t.detach().requires_grad_() for t in (q, q, q)]
        out = self(*leaves, None, max_len, causal)
        torch.autograd.grad(out, leaves, torch.ones_like(out))
        torch.cuda.synchronize()
        notes.append("flex: first fwd+bwd (compile) %.1f s" % (time.perf_counter() - t1))
        return notes

    def build_mask(self, dev, cu_list, lens, causal):
        """Sets self.bm for the shape; returns a note."""
        import torch
        t0 = time.perf_counter()
        lists = doc_block_lists(cu_list, FLEX_BLOCK, causal)
        nb = lists["num_blocks"]

        def tensors(key):
            counts, padded = pad_lists(lists[key])
            num = torch.tensor(counts, dtype=torch.int32, device=dev).view(1, 1, nb)
            small = torch.tensor(padded, dtype=torch.int32, device=dev).view(nb, -1)
            idx = torch.zeros(nb, max(nb, small.shape[1]), dtype=torch.int32, device=dev)
            idx[:, :small.shape[1]] = small
            return num, idx.view(1, 1, nb, -1)

        kv_num, kv_idx = tensors("kv_partial")
        fkv_num, fkv_idx = tensors("kv_full")
        q_num, q_idx = tensors("q_partial")
        fq_num, fq_idx = tensors("q_full")
        doc = torch.full((nb * FLEX_BLOCK,), -1, dtype=torch.int32, device=dev)
        lt = torch.tensor(lens, dtype=torch.int64, device=dev)
        doc[:cu_list[-1]] = torch.repeat_interleave(
            torch.arange(len(lens), dtype=torch.int32, device=dev), lt)

        def mask_mod(b, h, q_i, kv_i):
            ok = (doc[q_i] == doc[kv_i]) & (doc[q_i] >= 0)
            return ok & (kv_i <= q_i) if causal else ok

        bm = self.BlockMask.from_kv_blocks(kv_num, kv_idx, fkv_num, fkv_idx,
                                           BLOCK_SIZE=(FLEX_BLOCK, FLEX_BLOCK),
                                           mask_mod=mask_mod,
                                           seq_lengths=(cu_list[-1], cu_list[-1]),
                                           compute_q_blocks=False)
        bm.q_num_blocks, bm.q_indices = q_num, q_idx
        bm.full_q_num_blocks, bm.full_q_indices = fq_num, fq_idx
        self.bm = bm
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return ("flex: block mask built in %.0f ms (%d blocks of %d, %d full and %d partial "
                "block pairs)" % ((time.perf_counter() - t0) * 1e3, nb, FLEX_BLOCK,
                                  sum(map(len, lists["kv_full"])),
                                  sum(map(len, lists["kv_partial"]))))

    def release(self):
        self.bm = None

    @staticmethod
    def _view(x):
        return x.permute(1, 0, 2).unsqueeze(0)

    def __call__(self, q, k, v, cu, max_len, causal):
        out = self.flex(self._view(q), self._view(k), self._view(v), block_mask=self.bm)
        return out[0].permute(1, 0, 2)


def rope_tables(cu_list, head_dim, device):
    """cos and sin [total, 1, D/2] fp32 of every token's angles: token t of a
    sequence at its index p there, pair i at p * base^(-2i/D)."""
    import torch
    lens = torch.tensor([b - a for a, b in zip(cu_list, cu_list[1:])], device=device)
    starts = torch.tensor(cu_list[:-1], device=device)
    total = cu_list[-1]
    pos = torch.arange(total, device=device) - torch.repeat_interleave(starts, lens)
    inv = ROPE_BASE ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = pos.float()[:, None] * inv[None, :]
    return ang.cos()[:, None, :].contiguous(), ang.sin()[:, None, :].contiguous()


def _rope_half(x, cos, sin):
    """The half-layout rotation of x [T, H, D] in fp32, rounded back once."""
    import torch
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d].float(), x[..., d:].float()
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).to(x.dtype)


class Roped:
    """A peer after a separate rotary pass on q and k: the Triton kernel of
    bench/peers/rope_triton.py (kind "triton") or a torch.compile'd one
    ("compile"); tables set per shape."""

    def __init__(self, inner, kind="triton"):
        import torch
        self.inner = inner
        self.kind = kind
        self.context = inner.context
        if kind == "triton":
            from peers import rope_triton
            self.rope = lambda x, cos, sin: rope_triton.function().apply(
                x, cos.view(cos.shape[0], -1), sin.view(sin.shape[0], -1))
            self.name = "Triton rotary (bench/peers/rope_triton.py), then " + inner.name
        else:
            self.rope = torch.compile(_rope_half, dynamic=True)
            self.name = "torch.compile'd rotary, then " + inner.name
        self.tables = None

    def __call__(self, q, k, v, cu, max_len, causal):
        cos, sin = self.tables
        return self.inner(self.rope(q, cos, sin), self.rope(k, cos, sin), v, cu, max_len, causal)

    def rotary_alone(self, q, k):
        """The rotary pass on q and k alone: (ms, TB/s over the bytes it must
        move: q and k read and written, the tables read)."""
        cos, sin = self.tables
        ms = _time(lambda: (self.rope(q, cos, sin), self.rope(k, cos, sin)))
        moved = 4 * q.numel() * q.element_size() + 2 * 2 * cos.numel() * cos.element_size()
        return ms, moved / (ms * 1e-3) / 1e12


class Attngen:
    def __init__(self, deterministic=False, rotary=None):
        sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
        import attngen
        attngen._lib.lib()
        self.attngen = attngen
        self.deterministic = deterministic
        self.rotary = rotary
        self.name = "attngen.jagged_attention%s%s (%s)" % (
            ", deterministic=True" if deterministic else "",
            ", rotary=%s" % (rotary,) if rotary else "", attngen._lib.lib()._name)
        import contextlib
        self.context = contextlib.nullcontext

    def __call__(self, q, k, v, cu, max_len, causal):
        kw = {"rotary": self.rotary} if self.rotary else {}
        return self.attngen.jagged_attention(q, k, v, cu, cu, max_seqlen_q=max_len,
                                             max_seqlen_k=max_len, causal=causal,
                                             deterministic=self.deterministic, **kw)


def measure(peer, q, k, v, cu, max_len, causal, dout, res, keep=False, fwd_only=False):
    """Fills res with the median ms of fwd, bwd (autograd.grad of one
    recorded forward, retain_graph) and fwdbwd for one peer, in that order,
    so a pass that fails leaves the earlier ones; returns (when keep) its
    output and gradients for the error check."""
    import torch
    kept = {}
    with peer.context():
        with torch.no_grad():
            res["fwd"] = _time(lambda: peer(q, k, v, cu, max_len, causal))
            if keep:
                kept["out"] = peer(q, k, v, cu, max_len, causal)
        if fwd_only:
            return kept
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        out = peer(qg, kg, vg, cu, max_len, causal)

        def bwd():
            return torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)

        res["bwd"] = _time(bwd)
        if keep:
            kept["grads"] = bwd()
        del out

        def fwdbwd():
            o = peer(qg, kg, vg, cu, max_len, causal)
            return torch.autograd.grad(o, (qg, kg, vg), dout)

        res["fwdbwd"] = _time(fwdbwd)
    torch.cuda.synchronize()
    return kept


def retime(peers, order, q, k, v, cu, max_len, causal, dout, times, fwd_only=False,
           torch=None, timer=None):
    """A second round of timings, the peers in reverse order after every
    one has run its passes, for those that hold no per-shape state
    (prepare/release: FA2, attngen, FA4): each res in `times` gets
    "fwd_rounds" (and "bwd_rounds") with both medians and keeps the lower.
    broadcast_bench (session 39) timed the implementation run just after
    attngen's passes 5-17% slower in its forward, whichever it was; here
    FA4 runs in that place. Returns notes for the peers whose second round
    failed (each keeps its first); a CUDA failure is raised. torch, timer:
    for tests."""
    if torch is None:
        import torch
    if timer is None:
        timer = _time
    failed = []
    for key in reversed(order):
        res, peer = times.get(key), peers.get(key)
        if peer is None or not res or "fwd" not in res or hasattr(peer, "prepare"):
            continue
        try:
            with peer.context():
                with torch.no_grad():
                    t = timer(lambda: peer(q, k, v, cu, max_len, causal))
                res["fwd_rounds"] = [res["fwd"], t]
                res["fwd"] = min(res["fwd"], t)
                if fwd_only or "bwd" not in res:
                    continue
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                out = peer(qg, kg, vg, cu, max_len, causal)
                t = timer(lambda: torch.autograd.grad(out, (qg, kg, vg), dout,
                                                      retain_graph=True))
                del out
                res["bwd_rounds"] = [res["bwd"], t]
                res["bwd"] = min(res["bwd"], t)
        except Exception as e:  # this one keeps what it has; the others go on
            if _is_cuda_failure(e):
                raise
            failed.append("%s: second round failed (one round kept): %s" % (key, _first_line(e)))
    return failed


def rounds_notes(times, apart=1.05):
    """Notes for the implementations whose two medians of a pass (the
    "fwd_rounds" or "bwd_rounds" a second round left) are more than `apart`
    times apart (what the second round caught); broadcast_bench's too."""
    notes = []
    for key, res in times.items():
        for pas, word in (("fwd", "forward"), ("bwd", "backward")):
            a, b = res.get(pas + "_rounds") or (None, None)
            if a and b and max(a, b) > apart * min(a, b):
                notes.append("%s: %s rounds %.3f / %.3f ms (the lower kept)" % (key, word, a, b))
    return notes


def precompile(attngen, todo, deterministic=False, rotary=None):
    """Build attngen's kernels for the shapes (forward-only and both passes)
    in parallel; NVRTC releases the GIL. Failures surface in the runs."""
    import concurrent.futures as cf
    import torch
    keys = sorted({(sh["head_dim"], sh["causal"], bwd) for sh in todo for bwd in (False, True)})
    dev = torch.cuda.current_device()

    def build(key):
        d, causal, bwd = key
        try:
            attngen.jagged_kernel_for(d, "bf16", causal, None, None, deterministic,
                                      bwd, rotary=rotary).handle(dev)
        except Exception as e:
            return "%s: %s" % (key, e)
        return None

    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=8) as ex:
        errs = [e for e in ex.map(build, keys) if e]
    for e in errs:
        print("  precompile failed: %s" % str(e).splitlines()[0])
    return time.perf_counter() - t0


def ref64_error(out, q, k, v, lens, causal, picks=4, seed=0, rope=False):
    """Relative error of `out` against float64 attention on a few sequences
    (the longest, the shortest and random ones), computed on the GPU; with
    `rope`, q and k rotated first (bench's ROPE, in float64)."""
    import torch
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    rng = random.Random(seed)
    idx = {max(range(len(lens)), key=lambda i: lens[i]), min(range(len(lens)), key=lambda i: lens[i])}
    while len(idx) < min(picks, len(lens)):
        idx.add(rng.randrange(len(lens)))
    num = den = 0.0
    scale = 1.0 / math.sqrt(q.shape[-1])
    for b in sorted(idx):
        s, e = cu[b], cu[b + 1]
        qb, kb, vb = (t[s:e].double() for t in (q, k, v))
        if rope:
            d = q.shape[-1]
            inv = ROPE_BASE ** (-torch.arange(0, d, 2, device=q.device, dtype=torch.float64) / d)
            ang = torch.arange(e - s, device=q.device, dtype=torch.float64)[:, None] * inv
            c, sn = ang.cos()[:, None, :], ang.sin()[:, None, :]
            qb, kb = ((torch.cat((x[..., :d // 2] * c - x[..., d // 2:] * sn,
                                  x[..., :d // 2] * sn + x[..., d // 2:] * c), -1)) for x in (qb, kb))
        qb, kb, vb = (t.transpose(0, 1) for t in (qb, kb, vb))
        sc = qb @ kb.transpose(-1, -2) * scale
        if causal:
            n = e - s
            sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool, device=sc.device).triu(1),
                                float("-inf"))
        ref = (torch.softmax(sc, -1) @ vb).transpose(0, 1)
        num += (out[s:e].double() - ref).norm().item() ** 2
        den += ref.norm().item() ** 2
    return math.sqrt(num) / max(math.sqrt(den), 1e-300)


def environment():
    import torch
    env = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
           "torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["gpu"] = p.name
        env["sm_count"] = p.multi_processor_count
    try:
        import flash_attn
        env["flash_attn"] = getattr(flash_attn, "__version__", "?")
    except Exception:
        env["flash_attn"] = "not importable"
    return env


def run(args):
    import torch
    if not torch.cuda.is_available():
        print("jagged_bench: no CUDA device", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    env = environment()
    peers = {}
    for key, cls in (("attngen", Attngen), ("fa2", Fa2), ("fa4", Fa4), ("cudnn", Cudnn),
                     ("flex", Flex)):
        if key != "attngen" and key not in args.peers:
            continue
        try:
            if key == "attngen":
                peers[key] = cls(args.deterministic, ROPE if args.rotary else None)
            elif args.rotary and key in EXTRA_PEERS:
                raise RuntimeError("not run with --rotary")
            else:
                peers[key] = Roped(cls(), args.rotary_peer) if args.rotary else cls()
            env["peer_" + key] = peers[key].name
        except Exception as e:
            msg = "%s unavailable: %s: %s" % (key, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            print("note: " + msg)
            env["peer_" + key] = msg
    if "attngen" not in peers:
        print("jagged_bench: attngen is unavailable", file=sys.stderr)
        return 2
    command = "PYTHONPATH=bindings/python python3 bench/jagged_bench.py " + " ".join(args.argv)
    todo = shapes(args.quick, args.more_lengths, args.spread)
    if args.shapes:
        words = args.shapes.split(",")
        todo = [s for s in todo if all(any(alt in label(s) for alt in w.split("|"))
                                       for w in words)]
    records = []
    os.makedirs(args.out, exist_ok=True)
    if args.rotary:
        env["rotary"] = ("on q and k, half layout, positions in the sequence, base %g; attngen "
                         "fused, FA2 and FA4 after a %s rotary pass" %
                         (ROPE_BASE, "Triton" if args.rotary_peer == "triton" else
                          "torch.compile'd"))
    if args.rounds > 1:
        env["timing"] = ("FA2, attngen and FA4: the lower median of two rounds, the second "
                         "after every peer's passes, in reverse order")
    env["attngen_compile_s"] = round(precompile(peers["attngen"].attngen, todo,
                                                args.deterministic,
                                                ROPE if args.rotary else None), 1)
    print("attngen kernels built in %.1fs" % env["attngen_compile_s"], flush=True)

    def write():
        with open(os.path.join(args.out, "jagged_bench.json"), "w") as f:
            json.dump({"env": env, "command": command, "records": records}, f, indent=1)
        with open(os.path.join(args.out, "jagged_bench.md"), "w") as f:
            f.write(markdown(records, env, command))

    dtype = torch.bfloat16
    for sh in todo:
        t0 = time.perf_counter()
        lens = lengths(sh["batch"], sh["max_len"], sh["spread"], seed=args.seed)
        D, H, L, causal = sh["head_dim"], sh["heads"], sh["max_len"], sh["causal"]
        rec = {"label": label(sh), "shape": sh, "total_tokens": sum(lens),
               "visible_pairs": visible_pairs(lens, causal=causal),
               "flops_fwd": fwd_flops(lens, D, H, causal),
               "flops_bwd": bwd_flops(lens, D, H, causal), "times": {}, "notes": []}
        cu_list = [0]
        for n in lens:
            cu_list.append(cu_list[-1] + n)
        g = torch.Generator(device="cuda").manual_seed(1000 + D + L + causal)
        total = cu_list[-1]
        q, k, v, dout = (torch.randn(total, H, D, device="cuda", dtype=dtype, generator=g)
                         for _ in range(4))
        cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
        if args.rotary:
            tables = rope_tables(cu_list, D, "cuda")
            for p in peers.values():
                if isinstance(p, Roped):
                    p.tables = tables
            roped = [p for p in peers.values() if isinstance(p, Roped)]
            if roped:
                try:
                    ms, tbs = roped[0].rotary_alone(q, k)
                    rec["rotary_peer_ms"], rec["rotary_peer_tbs"] = ms, tbs
                    rec["notes"].append("the peers' rotary pass on q and k alone: %.3f ms, "
                                        "%.2f TB/s of the bytes it must move" % (ms, tbs))
                except Exception as e:
                    rec["notes"].append("rotary pass alone failed: %s: %s" %
                                        (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
        kept = {}
        for key in ("fa2", "attngen", "fa4") + EXTRA_PEERS:
            if key not in peers:
                continue
            res = rec["times"].setdefault(key, {})
            try:
                if hasattr(peers[key], "prepare"):
                    rec["notes"] += peers[key].prepare(q, cu_list, lens, L, causal)
                kept[key] = measure(peers[key], q, k, v, cu, L, causal, dout, res,
                                    keep=key in ("fa2", "attngen") + EXTRA_PEERS,
                                    fwd_only=args.fwd_only)
                if key in EXTRA_PEERS:  # checked against FA2 now, not kept (memory)
                    x, f2 = kept.pop(key), kept.get("fa2", {})
                    if "out" in x and "out" in f2:
                        e = {"out": _rel(x["out"], f2["out"])}
                        if "grads" in x and "grads" in f2:
                            e["grads"] = max(_rel(a, b) for a, b in zip(x["grads"], f2["grads"]))
                        rec.setdefault("peer_err", {})[key] = e
                        rec["notes"].append("%s vs FA2: err out %s grads %s" % (
                            key, _err(e["out"]), _err(e.get("grads"))))
                    del x
            except Exception as e:
                text = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[0]
                                   if str(e).strip() else "")
                rec["notes"].append("%s failed: %s" % (key, text))
                print("  %s failed on %s: %s" % (key, rec["label"], text))
                if args.verbose:
                    traceback.print_exc()
                if key == "fa4":
                    peers.pop("fa4")
                    rec["notes"].append("FA4 dropped for the remaining shapes")
                if "CUDA error" in str(e) or "illegal" in str(e):
                    records.append(rec)
                    write()
                    print("jagged_bench: CUDA context may be gone; stopping", file=sys.stderr)
                    return 1
            finally:
                if hasattr(peers.get(key), "release"):
                    peers[key].release()
            torch.cuda.empty_cache()
        if args.rounds > 1:
            try:
                rec["notes"] += retime(peers, ("fa2", "attngen", "fa4") + EXTRA_PEERS, q, k, v,
                                       cu, L, causal, dout, rec["times"], fwd_only=args.fwd_only)
            except Exception as e:
                rec["notes"].append("second round failed: %s" % _first_line(e))
                records.append(rec)
                write()
                print("jagged_bench: CUDA context may be gone; stopping", file=sys.stderr)
                return 1
            rec["notes"] += rounds_notes(rec["times"])
        a = kept.get("attngen", {})
        f2 = kept.get("fa2", {})
        try:
            if "out" in a and "out" in f2:
                rec["err_out"] = _rel(a["out"], f2["out"])
            if "grads" in a and "grads" in f2:
                rec["err_grads"] = max(_rel(x, y) for x, y in zip(a["grads"], f2["grads"]))
            if "out" in a:
                rec["err_ref64"] = ref64_error(a["out"], q, k, v, lens, causal, rope=args.rotary)

        except Exception as e:
            rec["notes"].append("error check failed: %s: %s" % (type(e).__name__, e))
        del kept, a, f2, q, k, v, dout
        torch.cuda.empty_cache()
        rec["seconds"] = time.perf_counter() - t0
        records.append(rec)
        write()
        ta = rec["times"].get("attngen", {})
        tf = rec["times"].get("fa2", {})
        print("[%6.1fs] %-26s attngen fwd %s bwd %s | FA2 fwd %s bwd %s | err out %s grads %s "
              "ref64 %s" % (time.perf_counter() - t_start, rec["label"],
                            _cell(ta.get("fwd"), rec["flops_fwd"]),
                            _cell(ta.get("bwd"), rec["flops_bwd"]),
                            _cell(tf.get("fwd"), rec["flops_fwd"]),
                            _cell(tf.get("bwd"), rec["flops_bwd"]),
                            _err(rec.get("err_out")), _err(rec.get("err_grads")),
                            _err(rec.get("err_ref64"))), flush=True)
    print()
    print(markdown(records, env, command))
    print("wrote %s/jagged_bench.{json,md} in %.0fs" % (args.out, time.perf_counter() - t_start))
    return 0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="L 1024 only (D 128 and 64, causal and not)")
    p.add_argument("--more-lengths", action="store_true", help="add L 512 and 2048")
    p.add_argument("--spread", type=float, default=None,
                   help="lengths uniform in [(2s-1)L, L] instead of [1, L]")
    p.add_argument("--shapes", default="",
                   help="comma-separated words the shape label must contain; a word may "
                        "list alternatives separated by | (D128,L512|L1024)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-fa4", action="store_true", help="skip FlashAttention-4")
    p.add_argument("--peers", default="fa2,fa4",
                   help="comma-separated peers among %s (cuDNN and flex: not with --rotary)"
                        % ",".join(PEERS))
    p.add_argument("--fwd-only", action="store_true", help="time the forward alone")
    p.add_argument("--rounds", type=int, default=2, choices=(1, 2),
                   help="timing rounds: 2 (default) times FA2, attngen and FA4 again after "
                        "every peer's passes, in reverse order, and keeps the lower medians")
    p.add_argument("--deterministic", action="store_true",
                   help="time attngen's deterministic backward (two kernels, no atomics) "
                        "instead of the fast one")
    p.add_argument("--rotary", action="store_true",
                   help="rotary embeddings on q and k: fused in attngen, a torch.compile'd "
                        "rotary before FA2 and FA4")
    p.add_argument("--rotary-peer", choices=("triton", "compile"), default="triton",
                   help="with --rotary: the peers' rotary pass, Triton (bandwidth-bound) or "
                        "torch.compile'd")
    p.add_argument("--out", default=os.path.join(HERE, "results", "jagged"))
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    args.peers = [x for x in args.peers.split(",") if x]
    bad = [x for x in args.peers if x not in PEERS]
    if bad:
        p.error("--peers: unknown %s (choose among %s)" % (",".join(bad), ",".join(PEERS)))
    if args.no_fa4 and "fa4" in args.peers:
        args.peers.remove("fa4")
    args.argv = list(argv)
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
