# SPDX-License-Identifier: BSD-3-Clause
"""Shared pieces of the benchmark: shapes, passes and their lengths (no
torch), and, inside a worker process, the inputs, the timer, the float64
reference (output and gradients) on a sample of blocks, the interface every
peer implements and the autograd plumbing the backward and rotary passes of
the PyTorch peers share.

Everything that touches torch imports it inside the function, so the
orchestrator (bench.py without --worker) can import this module without
paying for torch.
"""

import os
import math
import time
import zlib

import numpy as np

ERR_FLAG = 2e-2        # a result whose sampled relative error exceeds this is flagged
L2_BYTES = 60 << 20    # H200 L2; the rotating input sets must exceed it
ROTATE_BELOW = 200 << 20  # one set smaller than this: rotate over several sets

# The passes a run can time (bench.py --pass, --rotary):
#   fwd  the forward alone
#   bwd  the backward alone: dq, dk, dv from q, k, v and dout (the forward ran
#        outside the timed region)
#   rot  forward + backward of attention with rotary embeddings on q and k
#        (interleaved pairs, per-token table), timed together
PASSES = ("fwd", "bwd", "rot")
ROTARY_BASE = 10000.0


# ---- shapes (pure Python) ---------------------------------------------------

class Shape:
    """One benchmark shape: batch sequences with lengths uniform in
    [(2s-1)*L, L], heads x head_dim, cut into blocks of `block` tokens."""

    def __init__(self, batch, heads, head_dim, max_len, sparsity, block=64, causal=False,
                 dtype="bf16", seed=0):
        self.batch, self.heads, self.head_dim = int(batch), int(heads), int(head_dim)
        self.max_len, self.sparsity, self.block = int(max_len), float(sparsity), int(block)
        self.causal, self.dtype, self.seed = bool(causal), dtype, int(seed)

    @property
    def id(self):
        return "b%d_h%d_d%d_l%d_s%g_blk%d_%s%s" % (
            self.batch, self.heads, self.head_dim, self.max_len, self.sparsity, self.block,
            self.dtype, "_causal" if self.causal else "")

    @property
    def label(self):
        s = "B%d H%d D%d L%d s%g" % (self.batch, self.heads, self.head_dim, self.max_len,
                                     self.sparsity)
        if self.block != 64:
            s += " blk%d" % self.block
        if self.causal:
            s += " causal"
        if self.dtype != "bf16":
            s += " " + self.dtype
        return s

    def to_dict(self):
        return {"batch": self.batch, "heads": self.heads, "head_dim": self.head_dim,
                "max_len": self.max_len, "sparsity": self.sparsity, "block": self.block,
                "causal": self.causal, "dtype": self.dtype, "seed": self.seed}

    @classmethod
    def from_dict(cls, d):
        return cls(**d)

    def lengths(self):
        """Sequence lengths, uniform integers in [(2s-1)L, L], from a seed fixed
        by (seed, batch, L, s): the same for every peer and every run."""
        lo = max(0, int(round((2 * self.sparsity - 1) * self.max_len)))
        key = "%d/%d/%d/%g" % (self.seed, self.batch, self.max_len, self.sparsity)
        rng = np.random.default_rng(zlib.crc32(key.encode()))
        return rng.integers(lo, self.max_len + 1, size=self.batch, dtype=np.int64)


def ads_shapes(causal=False):
    """The ads shapes: batch 1152, 4 heads, D 128 and 64, block 64,
    s in {0.5, 0.7, 1.0}, L in {512, 1024, 2048, 4096}."""
    return [Shape(1152, 4, d, L, s, 64, causal)
            for d in (128, 64) for s in (0.7, 0.5, 1.0) for L in (512, 1024, 2048, 4096)]


def quick_shapes(causal=False):
    return [Shape(1152, 4, d, L, 0.7, 64, causal) for d in (128, 64) for L in (1024, 4096)]


def smoke_shapes():
    """Tiny shapes that check the whole pipeline in seconds (not a benchmark)."""
    return [Shape(64, 4, 128, 300, 0.5, 64), Shape(64, 2, 64, 256, 0.5, 64, causal=True)]


class Task:
    """One unit of a worker's work: a shape and a pass."""

    def __init__(self, shape, pass_="fwd"):
        if pass_ not in PASSES:
            raise ValueError("unknown pass %r (known: %s)" % (pass_, ", ".join(PASSES)))
        self.shape, self.pass_ = shape, pass_

    @property
    def id(self):
        return "%s/%s" % (self.shape.id, self.pass_)

    @property
    def label(self):
        return "%s [%s]" % (self.shape.label, self.pass_)

    def to_dict(self):
        return {"shape": self.shape.to_dict(), "pass": self.pass_}

    @classmethod
    def from_dict(cls, d):
        if "shape" not in d:  # a bare shape (older task files): the forward
            return cls(Shape.from_dict(d), "fwd")
        return cls(Shape.from_dict(d["shape"]), d.get("pass", "fwd"))


def pass_stats(stats, pass_):
    """The byte and FLOP counts of one pass, from BlockTable.stats (which
    counts the forward):
      fwd  Q, K, V read, O written (4 tensors); 4·n²·D·H FLOP per block
      bwd  Q, K, V, dO read, dQ, dK, dV written (7 tensors; Di is recomputed
           from P and dP, so O is not read); 2.5x the forward's FLOP
           (QKᵀ again, then dV, dP, dQ, dK)
      rot  the forward and the backward fused with rotary: 11 tensors plus the
           table [total, D] read twice; 3.5x the forward's FLOP
    """
    out = dict(stats)
    one = stats["tensor_bytes"]
    if pass_ == "bwd":
        out["bytes"] = 7.0 * one
        out["flops"] = 2.5 * stats["flops"]
    elif pass_ == "rot":
        out["bytes"] = 11.0 * one + 2.0 * stats["table_bytes"]
        out["flops"] = 3.5 * stats["flops"]
    return out


class BlockTable:
    """The blocks of a packed batch: start token and valid length of each,
    in order, empty sequences contributing none."""

    def __init__(self, lengths, block):
        lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        per_seq = (lengths + block - 1) // block
        self.nblocks = int(per_seq.sum())
        seq_of_block = np.repeat(np.arange(len(lengths)), per_seq)
        first_block = np.concatenate([[0], np.cumsum(per_seq)[:-1]]) if len(lengths) else per_seq
        j = np.arange(self.nblocks) - np.repeat(first_block, per_seq)  # index within sequence
        self.starts = self.offsets[:-1][seq_of_block] + j * block
        ends = self.offsets[1:][seq_of_block]
        self.lens = np.minimum(block, ends - self.starts).astype(np.int64)
        self.block = block
        self.total = int(self.offsets[-1])

    def cu_seqlens(self):
        """One cumulative entry per block (for varlen kernels)."""
        return np.concatenate([self.starts, [self.total]]).astype(np.int64)

    def padded_index(self):
        """For each packed token, its row in the padded [nblocks * block] layout."""
        rep = np.repeat(np.arange(self.nblocks), self.lens)
        within = np.arange(self.total) - np.repeat(self.starts, self.lens)
        return rep * self.block + within

    def stats(self, heads, head_dim, elem_bytes, causal):
        n = self.lens.astype(np.float64)
        pairs = n * (n + 1) / 2 if causal else n * n
        return {
            "total_tokens": self.total,
            "nblocks": self.nblocks,
            "partial_blocks": int((self.lens < self.block).sum()),
            # forward traffic: Q, K, V read once, O written once
            "bytes": 4.0 * self.total * heads * head_dim * elem_bytes,
            "tensor_bytes": float(self.total * heads * head_dim * elem_bytes),
            "table_bytes": float(self.total * head_dim * elem_bytes),  # rotary [total, D]
            # useful flops: QK^T and PV over unmasked pairs, 2 flops per MAC
            "flops": float(4.0 * head_dim * heads * pairs.sum()),
        }


# ---- in a worker (torch) ----------------------------------------------------

def torch_dtype(name):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


class ShapeData:
    """The inputs of one shape on the GPU: offsets, the block table and one
    or more sets of packed Q, K, V (rotated through while timing so that the
    data read exceeds L2)."""

    def __init__(self, shape, device="cuda"):
        import torch
        self.shape = shape
        self.device = device
        self.dtype = torch_dtype(shape.dtype)
        self.lengths = shape.lengths()
        self.table = BlockTable(self.lengths, shape.block)
        self.total = self.table.total
        self.offsets_list = self.table.offsets.tolist()
        self.offsets = torch.tensor(self.offsets_list, dtype=torch.int32, device=device)
        H, D = shape.heads, shape.head_dim
        one = self.total * H * D * 2
        set_bytes = 4 * one  # Q, K, V and the output
        self.nsets = 1 if set_bytes >= ROTATE_BELOW else max(3, math.ceil(3 * L2_BYTES / max(set_bytes, 1)))
        self.nsets = min(self.nsets, 16)
        self.sets = []
        for i in range(self.nsets):
            g = torch.Generator(device=device).manual_seed(zlib.crc32(("%s/%d" % (shape.id, i)).encode()))
            self.sets.append(tuple(torch.randn(self.total, H, D, device=device, dtype=self.dtype,
                                               generator=g) for _ in range(3)))
        self.stats = self.table.stats(H, D, 2, shape.causal)
        self.stats["nsets"] = self.nsets
        self._padded = None
        self._pmap = None
        self._douts = None
        self._padded_douts = None
        self._table = None

    def padded_map(self):
        """LongTensor: packed row -> row of the padded [nblocks * block] layout."""
        import torch
        if self._pmap is None:
            self._pmap = torch.from_numpy(self.table.padded_index()).to(self.device)
        return self._pmap

    def padded_sets(self):
        """The sets in a padded layout [nblocks * block, H, D]: block i occupies
        rows [i*block, (i+1)*block), zero beyond its valid length."""
        import torch
        if self._padded is None:
            pm = self.padded_map()
            rows = self.table.nblocks * self.shape.block
            out = []
            for qkv in self.sets:
                padded = []
                for t in qkv:
                    p = torch.zeros(rows, t.shape[1], t.shape[2], device=t.device, dtype=t.dtype)
                    p.index_copy_(0, pm, t)
                    padded.append(p)
                out.append(tuple(padded))
            self._padded = out
        return self._padded

    def padded(self, t):
        """One packed tensor [total, ...] in the padded layout [nblocks *
        block, ...] (zeros past each block's valid length)."""
        import torch
        pm = self.padded_map()
        rows = self.table.nblocks * self.shape.block
        p = torch.zeros((rows,) + tuple(t.shape[1:]), device=t.device, dtype=t.dtype)
        p.index_copy_(0, pm, t)
        return p

    def dout_sets(self):
        """One output gradient dO per input set (packed [total, H, D], standard
        normal, seeded like the inputs)."""
        import torch
        if self._douts is None:
            H, D = self.shape.heads, self.shape.head_dim
            out = []
            for i in range(self.nsets):
                g = torch.Generator(device=self.device).manual_seed(
                    zlib.crc32(("%s/dout/%d" % (self.shape.id, i)).encode()))
                out.append(torch.randn(self.total, H, D, device=self.device, dtype=self.dtype,
                                       generator=g))
            self._douts = out
        return self._douts

    def padded_douts(self):
        if self._padded_douts is None:
            self._padded_douts = [self.padded(d) for d in self.dout_sets()]
        return self._padded_douts

    def rotary_table(self):
        """The per-token rotary table [total, D] in the inputs' dtype: sin of
        the angles in columns [0, D/2), cos in [D/2, D), angle_i = position ·
        base^(-2i/D) with the token's position within its sequence (the
        layout of ag_block_fwd_args.rotary_table and of Meta's sinu_pos)."""
        import torch
        if self._table is None:
            D = self.shape.head_dim
            lens = np.asarray(self.lengths, dtype=np.int64)
            starts = self.table.offsets[:-1]
            pos = np.arange(self.total, dtype=np.int64) - np.repeat(starts, lens)
            p = torch.from_numpy(pos).to(self.device, torch.float64)
            inv = ROTARY_BASE ** (-torch.arange(0, D, 2, device=self.device,
                                                dtype=torch.float64) / D)
            ang = p[:, None] * inv[None, :]
            self._table = torch.cat([ang.sin(), ang.cos()], dim=1).to(self.dtype).contiguous()
        return self._table

    def free(self):
        self.sets = None
        self._padded = None
        self._pmap = None
        self._douts = None
        self._padded_douts = None
        self._table = None


class Prepared:
    """A peer ready to run one shape.

    run(i) launches on set i (asynchronously) and returns the output;
    rows(out, idx) returns the output rows of packed token indices idx as
    [len(idx), H, D]; `exact` is "all" or "full_blocks" (the rows the peer
    computes exactly); `config`, `note` and `extra` go into the report;
    `context()` is entered around all runs (e.g. an SDPA backend choice).
    """

    def __init__(self, run, rows, config="", note="", extra=None, exact="all", context=None):
        self.run, self.rows = run, rows
        self.config, self.note = config, note
        self.extra = extra or {}
        self.exact = exact
        self._context = context

    def context(self):
        import contextlib
        return self._context() if self._context else contextlib.nullcontext()


class PreparedGrad(Prepared):
    """A peer ready to run the backward (pass bwd) or the rotary pipeline
    (pass rot) of one shape.

    run(i) launches on set i and returns (dq, dk, dv) in the peer's layout;
    rows(g, idx) maps a gradient to packed token rows like Prepared.rows;
    pre(i), when not None, runs before each run(i) outside the timed region
    (e.g. a forward whose graph the backward consumes); check(i), when not
    None, returns (out, (dq, dk, dv)) for the error check (the rotary
    pipeline, whose output is checked too); out_rows maps that output.
    """

    def __init__(self, run, rows, pre=None, check=None, out_rows=None, **kw):
        super().__init__(run, rows, **kw)
        self.pre, self.check, self.out_rows = pre, check, out_rows or rows


class Differentiable:
    """What the autograd-based peers share for the backward and rotary
    passes: attention(q, k, v) -> out on tensors in `layout` ("packed"
    [total, H, D], or "padded" [nblocks * block, H, D]), differentiable;
    dout_view(d) turns a gradient in that layout into out's shape; out_rows
    maps out to packed rows (as Prepared.rows). context() is entered around
    every call (e.g. an SDPA backend choice)."""

    def __init__(self, attention, layout, out_rows, dout_view=None, config="", note="",
                 exact="all", context=None, extra=None):
        if layout not in ("packed", "padded"):
            raise ValueError("layout must be packed or padded, got %r" % (layout,))
        self.attention, self.layout = attention, layout
        self.out_rows = out_rows
        self.dout_view = dout_view or (lambda d: d)
        self.config, self.note, self.exact = config, note, exact
        self.extra = extra or {}
        self._context = context

    def context(self):
        import contextlib
        return self._context() if self._context else contextlib.nullcontext()


class Unavailable(Exception):
    """The peer cannot run in this environment at all (reported once), or,
    raised from one pass's prepare, cannot run that pass (that row)."""


class Peer:
    name = "peer"
    description = ""

    def setup(self, mode):
        """Once per process; raise Unavailable(reason) when the peer cannot run."""

    def prepare(self, data, mode):
        raise NotImplementedError

    def differentiable(self, data, mode):
        """A Differentiable for the shape; peers differentiated through
        PyTorch autograd implement this and get prepare_backward and
        prepare_rotary from it."""
        raise Unavailable("%s has no backward in this harness" % self.name)

    def prepare_backward(self, data, mode):
        return autograd_backward(data, self.differentiable(data, mode))

    def prepare_rotary(self, data, mode):
        return autograd_rotary(data, self.differentiable(data, mode))


def is_cuda_failure(e):
    """Whether an exception says the CUDA context may be gone (then the
    worker must not try anything else)."""
    text = str(e)
    return "CUDA error" in text or "illegal" in text or "CUDA_ERROR" in text


def layout_rows(data, layout):
    """rows(t, idx) for a tensor in a layout: packed rows idx as [len, H, D]."""
    if layout == "packed":
        return packed_rows
    pmap = data.padded_map()
    return lambda t, idx: t[pmap[idx]]


def _grad_inputs(data, layout):
    """Per set: q, k, v as new autograd leaves (sharing the storage of the
    inputs, which stay untouched for the other passes) and the dout, in the
    layout."""
    sets = data.sets if layout == "packed" else data.padded_sets()
    douts = data.dout_sets() if layout == "packed" else data.padded_douts()
    leaves = [tuple(t.detach().requires_grad_() for t in s) for s in sets]
    return leaves, douts


def autograd_backward(data, diff):
    """The backward pass of a Differentiable: the forward runs once per input
    set outside the timed region; the timed call is
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True). When a
    backward refuses retain_graph (e.g. a compiled one with donated
    buffers), the forward is re-run before each timed backward instead
    (PreparedGrad.pre, still outside the timed region; noted)."""
    import torch
    leaves, douts = _grad_inputs(data, diff.layout)
    dviews = [diff.dout_view(d) for d in douts]
    with diff.context():
        outs = [diff.attention(*qkv) for qkv in leaves]

    def run(i):
        return torch.autograd.grad(outs[i], leaves[i], dviews[i], retain_graph=True)

    note, pre = diff.note, None
    try:
        with diff.context():
            run(0)
    except RuntimeError as e:
        if is_cuda_failure(e) or not ("retain_graph" in str(e) or "donated" in str(e)):
            raise
        outs = None
        fresh = {}

        def forward_again(i):
            with diff.context():
                fresh[i] = diff.attention(*leaves[i])

        def run(i):  # noqa: F811
            return torch.autograd.grad(fresh.pop(i), leaves[i], dviews[i])

        pre = forward_again
        note = (note + "; " if note else "") + \
            "forward re-run (untimed) before each backward: retain_graph refused (%s)" % \
            str(e).splitlines()[0][:100]
    return PreparedGrad(run, layout_rows(data, diff.layout), pre=pre, config=diff.config,
                        note=note, exact=diff.exact, context=diff.context, extra=diff.extra)


def make_rotary():
    """rotary(x, sin, cos): rotary embeddings on interleaved pairs, (x[2i],
    x[2i+1]) rotated by angle_i, in fp32 and cast back to x's dtype; x [T, H,
    D], sin and cos [T, D/2] (the two halves of the table)."""
    import torch

    def rotary(x, sin, cos):
        x2 = x.float().unflatten(-1, (-1, 2))
        a, b = x2[..., 0], x2[..., 1]
        s, c = sin.float()[:, None, :], cos.float()[:, None, :]
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(x.dtype)

    return rotary


_rotary_fn = None

# Which rotary the peers' pipelines apply (bench.py --rotary-peer sets it
# for its workers): "triton", a bandwidth-bound Triton pass
# (peers/rope_triton.py, the fair unfused peer), or "compile", a
# torch.compile'd PyTorch one.
ROTARY_PEER_ENV = "ATTNGEN_BENCH_ROTARY_PEER"


def rotary_peer_kind():
    kind = os.environ.get(ROTARY_PEER_ENV, "triton")
    if kind not in ("triton", "compile"):
        raise ValueError("%s must be triton or compile, got %r" % (ROTARY_PEER_ENV, kind))
    return kind


def rotary_function(compiled=True):
    """(function, description): rotary(x, sin, cos) as rotary_peer_kind()
    says: the Triton pass (interleaved pairs, fp32 math, sin and cos read
    from the 16-bit table's halves), or the PyTorch rotary compiled with
    torch.compile (one fused kernel each way: the fastest PyTorch rotary a
    user would write); eager PyTorch when compiling fails or
    compiled=False."""
    global _rotary_fn
    if not compiled:
        return make_rotary(), "rotary: eager PyTorch (interleaved pairs, fp32 math)"
    if _rotary_fn is None:
        import torch
        if rotary_peer_kind() == "triton":
            from . import rope_triton
            rope = rope_triton.function()
            _rotary_fn = (lambda x, sin, cos: rope.apply(x, cos, sin, "interleaved"),
                          "rotary: a bandwidth-bound Triton pass (peers/rope_triton.py; "
                          "interleaved pairs, fp32 math)")
            return _rotary_fn
        try:
            _rotary_fn = (torch.compile(make_rotary(), dynamic=True),
                          "rotary: torch.compile'd PyTorch (interleaved pairs, fp32 math)")
        except Exception as e:
            _rotary_fn = (make_rotary(), "rotary: eager PyTorch (torch.compile failed: %s)"
                          % str(e).splitlines()[0][:80])
    return _rotary_fn


def autograd_rotary(data, diff):
    """The rotary pipeline of a Differentiable: rotary applied to q and k by
    PyTorch (rotary_function), then the peer's attention; forward and
    backward (torch.autograd.grad through both) timed together."""
    import torch
    leaves, douts = _grad_inputs(data, diff.layout)
    dviews = [diff.dout_view(d) for d in douts]
    table = data.rotary_table()
    if diff.layout == "padded":
        table = data.padded(table)
    D = data.shape.head_dim
    sin, cos = table[:, :D // 2], table[:, D // 2:]
    rot, how = rotary_function()

    def forward(i):
        q, k, v = leaves[i]
        return diff.attention(rot(q, sin, cos), rot(k, sin, cos), v)

    def check(i):
        out = forward(i)
        return out, torch.autograd.grad(out, leaves[i], dviews[i])

    try:
        with diff.context():
            check(0)
    except Exception as e:
        if is_cuda_failure(e) or "eager" in how:
            raise
        global _rotary_fn
        rot, how = rotary_function(compiled=False)
        how += " (the compiled one failed: %s)" % str(e).splitlines()[0][:80]
        _rotary_fn = (rot, how)

    def run(i):
        return check(i)[1]

    note = "; ".join(x for x in (how, diff.note) if x)
    return PreparedGrad(run, layout_rows(data, diff.layout), check=check,
                        out_rows=diff.out_rows, config=diff.config, note=note,
                        exact=diff.exact, context=diff.context, extra=diff.extra)


def packed_rows(out, idx):
    return out[idx]


def cuda_time(fn, nsets, iters, warmup=3, pre=None):
    """Median and min milliseconds of fn(i) over `iters` timed calls (CUDA
    events around each call, rotating over nsets input sets) after `warmup`
    untimed calls. pre(i), when given, runs before each call, before the
    first event: its GPU work is queued ahead of the timed region, so the
    events bracket fn(i) alone."""
    import torch
    for i in range(warmup):
        if pre is not None:
            pre(i % nsets)
        fn(i % nsets)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for i, (a, b) in enumerate(ev):
        if pre is not None:
            pre((i + warmup) % nsets)
        a.record()
        fn((i + warmup) % nsets)
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in ev)
    return times[len(times) // 2], times[0], times


def timed_iters(fn, nsets, mode, min_iters=20, pre=None):
    """Time fn with enough iterations: at least min_iters, more for short
    kernels (about 0.1 s of timed work in quick mode, 0.25 s in full)."""
    import torch
    if pre is not None:
        pre(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(0)
    torch.cuda.synchronize()
    est = max(time.perf_counter() - t0, 1e-5)
    target = 0.1 if mode == "quick" else 0.25
    iters = int(min(200, max(min_iters, target / est)))
    med, lo, _ = cuda_time(fn, nsets, iters, pre=pre)
    return med, lo, iters


def sample_blocks(table, count_full=40, count_partial=24, seed=0):
    """Indices of a sample of blocks: some full, some partial (if any)."""
    rng = np.random.default_rng(seed)
    full = np.nonzero(table.lens == table.block)[0]
    part = np.nonzero(table.lens < table.block)[0]
    pick = []
    for pool, n in ((full, count_full), (part, count_partial)):
        if len(pool):
            pick.append(rng.choice(pool, size=min(n, len(pool)), replace=False))
    return np.sort(np.concatenate(pick)) if pick else np.zeros(0, dtype=np.int64)


class Reference:
    """float64 block-diagonal attention on a sample of blocks of set 0: the
    output and, with grads=True, dq, dk, dv by autograd for set 0's dout;
    with rotary=True, rotary embeddings (the shape's table, interleaved
    pairs) are applied to q and k first and the gradients are those of the
    unrotated inputs."""

    def __init__(self, data, seed=0, grads=False, rotary=False):
        import torch
        sh = data.shape
        self.blocks = sample_blocks(data.table, seed=seed)
        bs, H, D = sh.block, sh.heads, sh.head_dim
        ns = len(self.blocks)
        starts = data.table.starts[self.blocks]
        lens = data.table.lens[self.blocks]
        self.lens = lens
        self.full = lens == bs
        pos = np.arange(bs)
        valid = pos[None, :] < lens[:, None]                     # [ns, bs]
        rows = (starts[:, None] + np.minimum(pos[None, :], lens[:, None] - 1))  # clamp pads
        dev = data.device
        self.rows = torch.from_numpy(rows.reshape(-1)).to(dev)   # [ns*bs]
        self.valid = torch.from_numpy(valid).to(dev)             # [ns, bs]
        self.grads = None
        if ns == 0:
            self.out = torch.zeros(0, bs, H, D, dtype=torch.float64, device=dev)
            return
        q, k, v = (t[self.rows].view(ns, bs, H, D).double() for t in data.sets[0])
        if grads:
            q, k, v = (t.requires_grad_() for t in (q, k, v))
        qr, kr = q, k
        if rotary:
            tab = data.rotary_table()[self.rows].double().view(ns, bs, 1, D)
            qr, kr = (_rotary64(t, tab) for t in (q, k))
        scale = 1.0 / math.sqrt(D)
        s = qr.transpose(1, 2) @ kr.transpose(1, 2).transpose(-1, -2) * scale  # [ns, H, bs, bs]
        keep = self.valid[:, None, None, :].expand(ns, 1, bs, bs)
        if sh.causal:
            keep = keep & torch.ones(bs, bs, dtype=torch.bool, device=dev).tril()
        s = s.masked_fill(~keep, float("-inf"))
        out = (torch.softmax(s, dim=-1) @ v.transpose(1, 2)).transpose(1, 2)  # [ns, bs, H, D]
        if grads:
            # padded positions get no output gradient: they are not tokens
            dout = data.dout_sets()[0][self.rows].view(ns, bs, H, D).double()
            dout = dout * self.valid[:, :, None, None]
            self.grads = tuple(g.detach() for g in torch.autograd.grad(out, (q, k, v), dout))
        self.out = out.detach()

    def _select(self, rel, exact):
        import torch
        if exact == "full_blocks":
            sel = torch.from_numpy(self.full).to(rel.device)
            if not bool(sel.any()):
                return 0.0, 0
            rel = rel[sel]
        rel = torch.nan_to_num(rel, nan=float("inf"))
        return float(rel.max().item()), int(rel.numel())

    def _got(self, rows_fn, t):
        ns, bs = self.valid.shape
        return rows_fn(t, self.rows).double().reshape(ns, bs, *self.out.shape[2:])

    def error(self, rows_fn, out, exact="all"):
        """Max over sampled blocks of ||o - ref||_F / ||ref||_F (valid rows only)."""
        if len(self.blocks) == 0:
            return 0.0, 0
        got = self._got(rows_fn, out)
        m = self.valid[:, :, None, None]
        diff = ((got - self.out) * m).flatten(1).norm(dim=1)
        ref = (self.out * m).flatten(1).norm(dim=1).clamp_min(1e-300)
        return self._select(diff / ref, exact)

    def grad_errors(self, rows_fn, grads, exact="all"):
        """For dq, dk, dv: the max over sampled blocks of the relative
        Frobenius error (valid rows only). The denominator of a block is
        floored at 1% of the RMS over the sample of the blocks' reference
        norms: a one-token block has dq = dk = 0 exactly, where any rounding
        would otherwise read as an infinite relative error. Returns
        ({"dq": e, "dk": e, "dv": e}, blocks checked)."""
        if len(self.blocks) == 0:
            return {"dq": 0.0, "dk": 0.0, "dv": 0.0}, 0
        m = self.valid[:, :, None, None]
        errs, n = {}, 0
        for name, got_t, ref in zip(("dq", "dk", "dv"), grads, self.grads):
            got = self._got(rows_fn, got_t)
            diff = ((got - ref) * m).flatten(1).norm(dim=1)
            refn = (ref * m).flatten(1).norm(dim=1)
            floor = max(0.01 * float(refn.pow(2).mean().sqrt().item()), 1e-300)
            errs[name], n = self._select(diff / refn.clamp_min(floor), exact)
        return errs, n


def _rotary64(x, tab):
    """Interleaved-pair rotary in float64: x [ns, bs, H, D], tab [ns, bs, 1, D]
    (sin in the first half of the columns, cos in the second)."""
    import torch
    D = x.shape[-1]
    s, c = tab[..., :D // 2], tab[..., D // 2:]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
