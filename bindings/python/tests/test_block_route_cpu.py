# SPDX-License-Identifier: BSD-3-Clause
"""Block attention through the jagged kernels (ATTNGEN_BLOCK_VIA_JAGGED),
on the CPU with real torch: the jagged offsets of the blocks against a
plain loop, and what block_attention hands jagged_attention when the route
is on (the launch itself is test_gpu_views.py's). Skipped without torch."""
import random

import pytest

from attngen import _validate, ops

torch = pytest.importorskip("torch", reason="torch is not installed")


def blocks_by_loop(offsets, block):
    """Every block's first token, then total_tokens up to batch +
    total // block entries, then total_tokens once more."""
    starts = [b for s, e in zip(offsets[:-1], offsets[1:]) for b in range(s, e, block)]
    total, batch = offsets[-1], len(offsets) - 1
    return starts + [total] * (batch + total // block - len(starts)) + [total]


def test_block_cu_seqlens_against_a_loop():
    rng = random.Random(7)
    cases = [([0], 64), ([0, 0], 64), ([0, 0, 0, 5], 16), ([0, 1], 256), ([0, 256, 512], 256)]
    # no sequence but tokens (malformed offsets the block path accepts): every
    # entry total_tokens, the fixed length still batch + total // block + 1
    got = ops.block_cu_seqlens(torch, torch.tensor([0], dtype=torch.int32), 300, 64)
    assert got.tolist() == [300] * 5
    for _ in range(300):
        block = rng.choice([16, 48, 64, 192, 256])
        lens = [rng.choice([0, 1, block - 1, block, block + 1, rng.randint(0, 3 * block)])
                for _ in range(rng.randint(0, 9))]
        offs = [0]
        for n in lens:
            offs.append(offs[-1] + n)
        cases.append((offs, block))
    for offs, block in cases:
        got = ops.block_cu_seqlens(torch, torch.tensor(offs, dtype=torch.int32), offs[-1], block)
        assert got.dtype == torch.int32
        assert got.tolist() == blocks_by_loop(offs, block), (offs, block)


@pytest.fixture
def route(monkeypatch):
    """The route on from 192 tokens, the tensor checks and jagged_attention
    stood in for (CPU tensors); yields the calls jagged_attention got."""
    from attngen import jagged
    calls = []

    def fake_jagged(q, k, v, cu, **kw):
        calls.append((q, k, v, cu, kw))
        return q * 0
    monkeypatch.setattr(ops, "_jagged_route_min_block", 192)
    monkeypatch.setattr(jagged, "jagged_attention", fake_jagged)
    monkeypatch.setattr(_validate, "check_block_attention_args", lambda *a, **kw: None)
    return calls


def test_route_hands_jagged_attention_the_blocks(route):
    q = k = v = torch.zeros(300, 2, 64, dtype=torch.bfloat16)
    off = torch.tensor([0, 40, 300], dtype=torch.int32)
    ops.block_attention(q, k, v, off, block_size=256, causal=True, softmax_scale=0.5)
    (_, _, _, cu, kw), = route
    assert cu.tolist() == [0, 40, 296, 300]  # 3 blocks: batch + 300 // 256 of them
    assert kw == {"causal": True, "softmax_scale": 0.5, "rotary": None, "rotary_table": None,
                  "_poison": False}


def test_route_maps_block_positions_to_sequence_ones(route):
    q = k = v = torch.zeros(300, 2, 64, dtype=torch.bfloat16)
    off = torch.tensor([0, 300], dtype=torch.int32)
    ops.block_attention(q, k, v, off, block_size=192,
                        rotary={"layout": "half", "positions": "block", "base": 500.0})
    assert route[-1][4]["rotary"] == {"layout": "half", "apply_to": ("q", "k"),
                                      "positions": "sequence", "base": 500.0}
    table = torch.zeros(300, 64, dtype=torch.bfloat16)
    ops.block_attention(q, k, v, off, block_size=192, rotary="interleaved", rotary_table=table)
    assert route[-1][4]["rotary"]["positions"] == "table" and \
        route[-1][4]["rotary_table"] is table


def test_route_leaves_what_it_does_not_take(route, monkeypatch):
    """Blocks under the route's size, and positions counted from the
    sequence's start (not the block's), stay on the block kernels."""
    assert not ops._via_jagged(128, None) and ops._via_jagged(192, None)
    assert not ops._via_jagged(256, {"positions": "sequence"})


def test_default_route_is_for_training_large_blocks_without_rotary(monkeypatch):
    """Without ATTNGEN_BLOCK_VIA_JAGGED: calls autograd records, blocks of
    192 tokens and up, no rotary (where the H200 measured the jagged
    backward faster and the jagged forward slower)."""
    monkeypatch.setattr(ops, "_jagged_route_min_block", None)
    assert ops._via_jagged(192, None, grad=True) and ops._via_jagged(256, None, grad=True)
    assert not ops._via_jagged(176, None, grad=True)
    assert not ops._via_jagged(256, None, grad=False)
    assert not ops._via_jagged(256, {"positions": "block"}, grad=True)


def test_route_env_value(monkeypatch):
    monkeypatch.setenv("ATTNGEN_BLOCK_VIA_JAGGED", " 192 ")
    assert ops._route_min_block() == 192
    monkeypatch.setenv("ATTNGEN_BLOCK_VIA_JAGGED", "")
    assert ops._route_min_block() is None
    monkeypatch.setenv("ATTNGEN_BLOCK_VIA_JAGGED", "big")
    with pytest.raises(ValueError, match="ATTNGEN_BLOCK_VIA_JAGGED must be a block size"):
        ops._route_min_block()


def test_qkvpacked_with_grad_takes_the_route_too(route):
    qkv = torch.zeros(300, 3, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    off = torch.tensor([0, 300], dtype=torch.int32)
    ops.block_attention_qkvpacked(qkv, off, block_size=256)
    (q, _, _, cu, _), = route
    assert cu.tolist() == [0, 256, 300] and q.shape == (300, 2, 64)


def test_block_attention_with_grad_takes_the_default_route(monkeypatch):
    from attngen import jagged
    calls = []
    monkeypatch.setattr(ops, "_jagged_route_min_block", None)
    monkeypatch.setattr(jagged, "jagged_attention", lambda q, k, v, cu, **kw: calls.append(cu))
    monkeypatch.setattr(_validate, "check_block_attention_args", lambda *a, **kw: None)
    monkeypatch.setattr(ops, "_fast_block_forward", lambda *a: None)
    q = torch.zeros(300, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    off = torch.tensor([0, 300], dtype=torch.int32)
    ops.block_attention(q, q, q, off, block_size=256)
    assert len(calls) == 1 and calls[0].tolist() == [0, 256, 300]
