# SPDX-License-Identifier: BSD-3-Clause
"""GPU tests of the block pattern's tensor layouts: q, k, v as views of one
projection output, block_attention_qkvpacked (the same bits as contiguous
copies, and within tolerance of float64: test_gpu.py's checks), and
grouped-query heads (k, v with fewer heads than q) against float64. Apart
from test_gpu.py so that a device call can run them without building that
file's 48 kernels first (tools/next_gpu_call_strides.sh runs them with each
library).
"""
import pytest

import attngen
from gpu_env import need_gpu_and_lib

torch = pytest.importorskip("torch", reason="torch is not installed")

from test_gpu import (GRAD_TOL, TOL, attention64, block_errors, check, check_grads,  # noqa: E402
                      grad_errors)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _need_gpu_and_lib():
    need_gpu_and_lib(torch, attngen)


def offsets_of(lengths):
    """(offsets on the GPU, the same as a list, total tokens)."""
    off_list = [0]
    for n in lengths:
        off_list.append(off_list[-1] + n)
    return (torch.tensor(off_list, dtype=torch.int32, device="cuda"), off_list, off_list[-1])

def check_grouped(out, dout, q, k, v, off_list, block, causal):
    """out and q.grad, k.grad, v.grad (k, v of fewer heads) against float64
    autograd through each key head repeated for its group: no poison left,
    the relative errors within the dtype's tolerances, gradients in k's and
    v's shape."""
    dtype = q.dtype
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    group = q.shape[1] // k.shape[1]
    ref = attention64(leaves[0], leaves[1].repeat_interleave(group, 1),
                      leaves[2].repeat_interleave(group, 1), off_list, block, causal)
    ref_grads = torch.autograd.grad(ref, leaves, dout.double().cpu())
    assert not torch.isnan(out).any()
    overall, worst = block_errors(out.detach(), ref.detach(), off_list, block)
    assert overall <= TOL[dtype] and worst <= 3 * TOL[dtype], (overall, worst)
    assert k.grad.shape == k.shape and v.grad.shape == v.shape
    for name, err in zip(("dq", "dk", "dv"), grad_errors((q.grad, k.grad, v.grad), ref_grads)):
        assert err <= GRAD_TOL[dtype], "%s: %.3g" % (name, err)



@pytest.mark.parametrize("head_dim,causal,pad", [(64, False, 0), (128, True, 0), (64, True, 64),
                                                 (128, False, 8)])
def test_views_of_one_projection_and_qkvpacked(head_dim, causal, pad):
    """q, k, v as column slices of one projection output [tokens, 3 * heads
    * head_dim + pad] (rows spaced; pad > 0: wider than the three), through
    block_attention and block_attention_qkvpacked, forward and backward:
    the same bits as contiguous copies through the same kernels (a
    `row_strides: true` spec's, which block_attention takes for views: read
    in place, the packed gradient written in place), and that against
    float64; block_attention on the contiguous copies (the packed kernels)
    against float64 too."""
    lengths = [0, 1, 63, 64, 65, 200, 0, 37]
    heads, dtype = 3, torch.bfloat16
    off, off_list, total = offsets_of(lengths)
    g = torch.Generator(device="cuda").manual_seed(40 + head_dim + pad)
    width = 3 * heads * head_dim + pad
    proj = torch.randn(total, width, device="cuda", dtype=dtype, generator=g)
    qkv = proj[:, :3 * heads * head_dim].view(total, 3, heads, head_dim)
    kernel = attngen.kernel_for(64, causal, head_dim, "bf16", backward=True, row_strides=True)
    print("takes_row_strides:", kernel.takes_row_strides())
    assert kernel.takes_row_strides() and kernel.name.endswith("_rs_grad")

    q, k, v = (t.contiguous() for t in qkv.unbind(1))
    for t in (q, k, v):
        t.requires_grad_()
    out = kernel(q, k, v, off, _poison=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    qc, kc, vc = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out_c = attngen.block_attention(qc, kc, vc, off, causal=causal, _poison=True)
    out_c.backward(dout)

    leaf = proj.detach().clone().requires_grad_()
    views = leaf[:, :3 * heads * head_dim].view(total, 3, heads, head_dim)
    out_v = attngen.block_attention(*views.unbind(1), off, causal=causal, _poison=True)
    out_v.backward(dout)
    torch.cuda.synchronize()
    assert torch.equal(out_v, out)
    stacked = torch.stack((q.grad, k.grad, v.grad), dim=1)
    assert torch.equal(leaf.grad[:, :3 * heads * head_dim].view_as(stacked), stacked)
    assert not leaf.grad[:, 3 * heads * head_dim:].any()  # the pad columns get zero

    packed = qkv.detach().clone().requires_grad_()
    out_p = attngen.block_attention_qkvpacked(packed, off, causal=causal, _poison=True)
    out_p.backward(dout)
    torch.cuda.synchronize()
    assert torch.equal(out_p, out)
    assert packed.grad.shape == packed.shape and torch.equal(packed.grad, stacked)

    check(out.detach(), q, k, v, off_list, 64, causal)
    check_grads(q, k, v, dout, off_list, 64, causal)
    check(out_c.detach(), qc, kc, vc, off_list, 64, causal)
    check_grads(qc, kc, vc, dout, off_list, 64, causal)


@pytest.mark.parametrize("head_dim,causal,heads,kv_heads,dtype", [
    (64, False, 6, 2, torch.bfloat16), (128, True, 4, 1, torch.bfloat16),
    (64, True, 5, 1, torch.float16), (128, False, 6, 3, torch.float16)])
def test_grouped_query_heads(head_dim, causal, heads, kv_heads, dtype):
    """k and v with kv_heads dividing q's heads (query head h reads key head
    h // (heads // kv_heads)): forward and gradients against float64 (k's
    and v's gradients summed over each group), poisoned outputs, partial,
    empty and one-token blocks. Groups of 3 (a head_dim 64 tile's two query
    heads then read two key heads) and 5 heads (a tile past the last head)."""
    lengths = [0, 1, 63, 64, 65, 200, 0, 37]
    off, off_list, total = offsets_of(lengths)
    g = torch.Generator(device="cuda").manual_seed(60 + heads + kv_heads + head_dim)
    q = torch.randn(total, heads, head_dim, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(total, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
            for _ in range(2))
    for t in (q, k, v):
        t.requires_grad_()
    kernel = attngen.kernel_for(64, causal, head_dim, "bf16" if dtype == torch.bfloat16
                                else "fp16", backward=True, row_strides=True)
    print("takes_kv_heads:", kernel.takes_kv_heads())
    assert kernel.takes_kv_heads()
    out = attngen.block_attention(q, k, v, off, causal=causal, _poison=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    torch.cuda.synchronize()
    check_grouped(out, dout, q, k, v, off_list, 64, causal)


@pytest.mark.parametrize("head_dim,heads,kv_heads", [(64, 6, 2), (128, 4, 1)])
def test_grouped_heads_as_views_of_one_projection(head_dim, heads, kv_heads):
    """Meta's layout: q, k, v column slices of one projection output
    [tokens, (heads + 2 kv_heads) head_dim] with fewer key heads: the same
    bits as contiguous q, k, v (row strides and kv_heads read in place, or
    copies and repeated key heads), gradients into the projection's slices."""
    lengths = [0, 1, 63, 64, 65, 200, 0, 37]
    off, off_list, total = offsets_of(lengths)
    g = torch.Generator(device="cuda").manual_seed(90 + heads + head_dim)
    qw, kw = heads * head_dim, kv_heads * head_dim
    proj = torch.randn(total, qw + 2 * kw, device="cuda", dtype=torch.bfloat16, generator=g)
    proj.requires_grad_()
    q = proj[:, :qw].view(total, heads, head_dim)
    k = proj[:, qw:qw + kw].view(total, kv_heads, head_dim)
    v = proj[:, qw + kw:].view(total, kv_heads, head_dim)
    out = attngen.block_attention(q, k, v, off, causal=True, _poison=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    qc, kc, vc = (t.detach().contiguous().requires_grad_() for t in (q, k, v))
    ref = attngen.block_attention(qc, kc, vc, off, causal=True)
    ref.backward(dout)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    assert torch.equal(proj.grad, torch.cat((qc.grad.flatten(1), kc.grad.flatten(1),
                                             vc.grad.flatten(1)), dim=1))
    check(out.detach(), qc.detach(), kc.detach().repeat_interleave(heads // kv_heads, 1),
          vc.detach().repeat_interleave(heads // kv_heads, 1), off_list, 64, True)


@pytest.mark.parametrize("block,head_dim,causal,heads,kv_heads", [
    (256, 128, False, 3, 3), (192, 64, True, 4, 2), (256, 64, True, 2, 1)])
def test_large_blocks_through_the_jagged_kernels(monkeypatch, block, head_dim, causal, heads,
                                                 kv_heads):
    """ATTNGEN_BLOCK_VIA_JAGGED's route (each block one jagged sequence)
    against float64: forward and gradients, poisoned outputs, partial,
    empty and one-token blocks, grouped heads."""
    from attngen import ops
    monkeypatch.setattr(ops, "_jagged_route_min_block", 192)
    lengths = [0, 1, block - 1, block, block + 1, 2 * block + 5, 0, 37]
    off, off_list, total = offsets_of(lengths)
    g = torch.Generator(device="cuda").manual_seed(80 + block + head_dim)
    q = torch.randn(total, heads, head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(total, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=g) for _ in range(2))
    for t in (q, k, v):
        t.requires_grad_()
    out = attngen.block_attention(q, k, v, off, block_size=block, causal=causal, _poison=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    torch.cuda.synchronize()
    check_grouped(out, dout, q, k, v, off_list, block, causal)


@pytest.mark.parametrize("rotary", [{"layout": "half", "positions": "block"},
                                    {"layout": "interleaved", "positions": "table"}])
def test_large_blocks_with_rotary_through_the_jagged_kernels(monkeypatch, rotary):
    """The route with rotary embeddings (the position in the block becomes
    the jagged sequence's; a table stays a table): forward and gradients
    against the block kernels' own (each checked against float64 in
    test_gpu.py and the GPU suite), to bf16 tolerance."""
    from attngen import ops
    lengths = [0, 1, 191, 192, 193, 389, 0, 37]
    off, off_list, total = offsets_of(lengths)
    g = torch.Generator(device="cuda").manual_seed(70)
    q, k, v = (torch.randn(total, 2, 64, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    table = None
    if rotary["positions"] == "table":
        ang = torch.rand(total, 32, device="cuda", generator=g) * 6.0
        table = torch.cat((ang.sin(), ang.cos()), dim=1).to(torch.bfloat16)
    dout = torch.randn_like(q)
    runs = []
    for route in (None, 192):
        monkeypatch.setattr(ops, "_jagged_route_min_block", route)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = attngen.block_attention(*leaves, off, block_size=192, causal=True, rotary=rotary,
                                      rotary_table=table, _poison=True)
        out.backward(dout)
        runs.append((out.detach(), *(t.grad for t in leaves)))
    torch.cuda.synchronize()
    for name, a, b in zip(("out", "dq", "dk", "dv"), runs[0], runs[1]):
        assert not torch.isnan(b).any(), name
        err = ((a.double() - b.double()).norm() / a.double().norm()).item()
        assert err <= GRAD_TOL[torch.bfloat16], "%s: %.3g" % (name, err)


@pytest.mark.parametrize("head_dim", [128, 64])
def test_views_with_a_rotary_table(head_dim):
    """The row_strides kernels with rotary embeddings from a table
    (interleaved pairs on q and k; at head_dim 128 the backward rotates dQ
    back late, plan_block.c's bwd_late_dq): views of one projection give
    the same bits as contiguous copies through the same kernels, the
    gradient one packed tensor, and agree with the packed kernels' (checked
    against float64 in test_gpu.py) within tolerance."""
    lengths = [0, 1, 63, 64, 65, 200, 0, 37]
    heads, dtype = 2, torch.bfloat16
    off, off_list, total = offsets_of(lengths)
    g = torch.Generator(device="cuda").manual_seed(70 + head_dim)
    proj = torch.randn(total, 3 * heads * head_dim, device="cuda", dtype=dtype, generator=g)
    angles = torch.rand(total, head_dim // 2, device="cuda", generator=g) * 50
    table = torch.cat((angles.sin(), angles.cos()), dim=1).to(dtype)
    rotary = {"layout": "interleaved", "apply_to": ["q", "k"], "positions": "table"}
    rs = attngen.kernel_for(64, False, head_dim, "bf16", backward=True, rotary=rotary,
                            row_strides=True)
    assert rs.takes_row_strides()

    leaf = proj.detach().clone().requires_grad_()
    views = leaf.view(total, 3, heads, head_dim).unbind(1)
    out_v = attngen.block_attention(*views, off, rotary=rotary, rotary_table=table,
                                    _poison=True)
    dout = torch.randn_like(out_v)
    out_v.backward(dout)
    q, k, v = (t.contiguous().requires_grad_() for t in proj.view(total, 3, heads,
                                                                   head_dim).unbind(1))
    out = rs(q, k, v, off, rotary_table=table, _poison=True)
    out.backward(dout)
    qc, kc, vc = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out_c = attngen.block_attention(qc, kc, vc, off, rotary=rotary, rotary_table=table)
    out_c.backward(dout)
    torch.cuda.synchronize()
    assert torch.equal(out_v, out)
    stacked = torch.stack((q.grad, k.grad, v.grad), dim=1)
    assert torch.equal(leaf.grad.view_as(stacked), stacked)

    def rel(a, b):
        a, b = a.double(), b.double()
        return ((a - b).norm() / b.norm()).item()

    assert not torch.isnan(out).any()
    assert rel(out, out_c) <= 2 * TOL[dtype]
    for name, a, b in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                          (qc.grad, kc.grad, vc.grad)):
        assert not torch.isnan(a).any(), name
        assert rel(a, b) <= 2 * GRAD_TOL[dtype], name
