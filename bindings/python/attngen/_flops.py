# SPDX-License-Identifier: BSD-3-Clause
"""Useful FLOPs of attngen's three patterns, counted as the benchmarks
count them: 4 * head_dim * heads per visible (query, key) pair for the
forward (QK^T and PV, 2 FLOPs a multiply-add), 2.5 times that for the
backward (five products). Used by the FLOP formulas that torch_ops
registers for torch.utils.flop_counter.FlopCounterMode.

Lengths come from the offsets' values: each count reads them back to the
host (a synchronization, as torch's own formulas for varlen attention do).
"""

FWD_FLOPS_PER_PAIR = 4  # times head_dim * heads
BWD_FACTOR = 2.5


def _lengths(torch, offsets):
    o = offsets.detach().to("cpu", torch.int64)
    return o[1:] - o[:-1]


def block_pairs(torch, offsets, block_size, causal):
    """Visible pairs of block-diagonal attention: each sequence cut into
    blocks of block_size from its start (the last may be partial), each
    block attending to itself (lower triangle with the diagonal when causal)."""
    lens = _lengths(torch, offsets)
    full, rest = lens // block_size, lens % block_size
    if causal:
        per_full = block_size * (block_size + 1) // 2
        return int((full * per_full + rest * (rest + 1) // 2).sum())
    return int((full * block_size * block_size + rest * rest).sum())


def jagged_pairs(torch, lens_q, lens_k, causal, window):
    """Visible pairs of jagged attention for per-sequence lengths (int64
    CPU tensors): query i of a sequence sees key j in [i + d - left, i + d +
    right] within [0, Lk), d = Lk - Lq; causal caps right at 0; window None
    leaves left (and, without causal, right) unbounded."""
    lens_q, lens_k = lens_q.to(torch.int64), lens_k.to(torch.int64)
    total_q = int(lens_q.sum())
    if total_q == 0:
        return 0
    seq = torch.repeat_interleave(torch.arange(lens_q.numel()), lens_q)
    starts = torch.cumsum(lens_q, 0) - lens_q
    i = torch.arange(total_q) - starts[seq]
    lk = lens_k[seq]
    centre = i + lk - lens_q[seq]
    lo = torch.zeros_like(i) if window is None else (centre - int(window[0])).clamp(min=0)
    if causal:
        right = 0
    elif window is not None:
        right = int(window[1])
    else:
        right = None
    hi = lk - 1 if right is None else torch.minimum(centre + right, lk - 1)
    return int((hi - lo + 1).clamp(min=0).sum())


def block_forward(torch, q, offsets, block_size, causal):
    _, heads, head_dim = q.shape
    return FWD_FLOPS_PER_PAIR * head_dim * heads * block_pairs(torch, offsets, block_size, causal)


def jagged_forward(torch, q, cu_q, cu_k, causal, window):
    _, heads, head_dim = q.shape
    pairs = jagged_pairs(torch, _lengths(torch, cu_q), _lengths(torch, cu_k), causal, window)
    return FWD_FLOPS_PER_PAIR * head_dim * heads * pairs


def broadcast_forward(torch, q, cu_k, causal, window):
    n_q, heads, head_dim = q.shape
    lens_k = _lengths(torch, cu_k)
    lens_q = torch.full_like(lens_k, n_q)
    pairs = jagged_pairs(torch, lens_q, lens_k, causal, window)
    return FWD_FLOPS_PER_PAIR * head_dim * heads * pairs


def backward(forward_flops):
    return int(BWD_FACTOR * forward_flops)
