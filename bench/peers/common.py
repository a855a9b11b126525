"""Shared pieces of the benchmark: shapes and their lengths (no torch), and,
inside a worker process, the inputs, the timer, the float64 reference on a
sample of blocks and the interface every peer implements.

Everything that touches torch imports it inside the function, so the
orchestrator (bench.py without --worker) can import this module without
paying for torch.
"""

import math
import time
import zlib

import numpy as np

ERR_FLAG = 2e-2        # a result whose sampled relative error exceeds this is flagged
L2_BYTES = 60 << 20    # H200 L2; the rotating input sets must exceed it
ROTATE_BELOW = 200 << 20  # one set smaller than this: rotate over several sets


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

    def free(self):
        self.sets = None
        self._padded = None
        self._pmap = None


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


class Unavailable(Exception):
    """The peer cannot run in this environment at all (reported once)."""


class Peer:
    name = "peer"
    description = ""

    def setup(self, mode):
        """Once per process; raise Unavailable(reason) when the peer cannot run."""

    def prepare(self, data, mode):
        raise NotImplementedError


def packed_rows(out, idx):
    return out[idx]


def cuda_time(fn, nsets, iters, warmup=3):
    """Median and min milliseconds of fn(i) over `iters` timed calls (CUDA
    events around each call, rotating over nsets input sets) after `warmup`
    untimed calls."""
    import torch
    for i in range(warmup):
        fn(i % nsets)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for i, (a, b) in enumerate(ev):
        a.record()
        fn((i + warmup) % nsets)
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in ev)
    return times[len(times) // 2], times[0], times


def timed_iters(fn, nsets, mode, min_iters=20):
    """Time fn with enough iterations: at least min_iters, more for short
    kernels (about 0.1 s of timed work in quick mode, 0.25 s in full)."""
    import torch
    t0 = time.perf_counter()
    fn(0)
    torch.cuda.synchronize()
    est = max(time.perf_counter() - t0, 1e-5)
    target = 0.1 if mode == "quick" else 0.25
    iters = int(min(200, max(min_iters, target / est)))
    med, lo, _ = cuda_time(fn, nsets, iters)
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
    """float64 block-diagonal attention on a sample of blocks of set 0."""

    def __init__(self, data, seed=0):
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
        q, k, v = (t[self.rows].view(ns, bs, H, D).double().transpose(1, 2) for t in data.sets[0])
        scale = 1.0 / math.sqrt(D)
        s = q @ k.transpose(-1, -2) * scale                       # [ns, H, bs, bs]
        keep = self.valid[:, None, None, :].expand(ns, 1, bs, bs)
        if sh.causal:
            keep = keep & torch.ones(bs, bs, dtype=torch.bool, device=dev).tril()
        s = s.masked_fill(~keep, float("-inf"))
        self.out = (torch.softmax(s, dim=-1) @ v).transpose(1, 2)  # [ns, bs, H, D]

    def error(self, rows_fn, out, exact="all"):
        """Max over sampled blocks of ||o - ref||_F / ||ref||_F (valid rows only)."""
        import torch
        if len(self.blocks) == 0:
            return 0.0, 0
        ns, bs = self.valid.shape
        got = rows_fn(out, self.rows).double().reshape(ns, bs, *self.out.shape[2:])
        m = self.valid[:, :, None, None]
        diff = ((got - self.out) * m).flatten(1).norm(dim=1)
        ref = (self.out * m).flatten(1).norm(dim=1).clamp_min(1e-300)
        rel = diff / ref
        sel = torch.from_numpy(self.full).to(rel.device) if exact == "full_blocks" else None
        if sel is not None:
            if not bool(sel.any()):
                return 0.0, 0
            rel = rel[sel]
        rel = torch.nan_to_num(rel, nan=float("inf"))
        return float(rel.max().item()), int(rel.numel())
