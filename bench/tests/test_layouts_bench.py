# SPDX-License-Identifier: BSD-3-Clause
"""layouts_bench.py's four calls on the CPU with a stand-in attngen (real
torch autograd): each runs forward and backward on its own leaves, the
views and packed calls differentiate one qkv, the grouped call has half
the key heads. Skipped without torch."""
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import layouts_bench  # noqa: E402


class StandIn:
    """block_attention as q + mean of k and v over heads (differentiable),
    qkvpacked on qkv's slices; records the heads each call saw."""

    def __init__(self):
        self.seen = []

    def block_attention(self, q, k, v, offsets, causal=False):
        self.seen.append((q.shape[1], k.shape[1], q.is_contiguous()))
        return q + (k + v).mean(1, keepdim=True)

    def block_attention_qkvpacked(self, qkv, offsets, causal=False):
        return self.block_attention(*qkv.unbind(1), offsets, causal=causal)


def test_the_four_layouts_run_forward_and_backward():
    ag = StandIn()
    qkv = torch.randn(10, 3, 4, 8)
    dout = torch.randn(10, 4, 8)
    calls = layouts_bench.layout_calls(torch, ag, qkv, dout, None, False)
    assert list(calls) == list(layouts_bench.LAYOUTS)
    for name in layouts_bench.LAYOUTS:
        out = calls[name]()
        assert out.shape == (10, 4, 8)
    assert ag.seen == [(4, 4, True), (4, 4, False), (4, 4, False), (4, 2, True)]
