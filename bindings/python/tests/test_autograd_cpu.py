# SPDX-License-Identifier: BSD-3-Clause
"""The binding's torch.autograd.Function under REAL torch autograd, on the
CPU: a stand-in kernel computes the block attention and its gradients with
torch ops, so the Function's contract with the autograd engine is checked
without a GPU (how many gradients it returns, for which inputs, what it
saves, what happens to a refused backward's error when .backward() runs
it, double backward). Skipped without torch; the launches themselves are covered by
test_backward_stub.py (wiring) and test_gpu.py (numbers).
"""
import math

import pytest

from attngen import _errors, ops

torch = pytest.importorskip("torch", reason="torch is not installed")


def attention(q, k, v, offsets, block):
    """Block-diagonal attention, differentiable, for the stand-in kernel."""
    d = q.shape[-1]
    pieces = []
    for s, e in zip(offsets[:-1], offsets[1:]):
        for b0 in range(s, e, block):
            b1 = min(b0 + block, e)
            qb, kb, vb = (t[b0:b1].transpose(0, 1) for t in (q, k, v))
            p = torch.softmax(qb @ kb.transpose(-1, -2) / math.sqrt(d), dim=-1)
            pieces.append((p @ vb).transpose(0, 1))
    return torch.cat(pieces) if pieces else q * 0


class StandInKernel:
    """What the Function calls on a Kernel: _forward_raw and _backward_raw,
    here in float64 torch ops on the CPU; records the calls."""

    def __init__(self, block=16, strided=False):
        self.block = block
        self.strided = strided  # what takes_row_strides answers
        self.calls = []

    def takes_row_strides(self, device_index=None):
        return self.strided

    _rows = ops.Kernel._rows  # the real choice of view, stride or copy

    def _forward_raw(self, q, k, v, offsets, batch, poison=False, rotary_table=None,
                     plain=False):
        self.calls.append(("forward", batch, poison, rotary_table,
                           tuple(t.is_contiguous() for t in (q, k, v)), plain))
        with torch.no_grad():
            return attention(q, k, v, offsets.tolist(), self.block)

    def _backward_raw(self, dout, q, k, v, offsets, batch, poison=False, rotary_table=None,
                      into=None, plain=False):
        self.calls.append(("backward", batch, poison, rotary_table, dout.is_contiguous(),
                           None if into is None else into[3],
                           None if into is None else all(bool(torch.isnan(t).all())
                                                         for t in into[:3])))
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            out = attention(*leaves, offsets.tolist(), self.block)
            grads = torch.autograd.grad(out, leaves, dout)
        if into is None:
            return grads
        for dst, g in zip(into[:3], grads):  # as the kernel writes them: in place
            dst.copy_(g)
        return into[:3]


@pytest.fixture
def fn(monkeypatch):
    monkeypatch.setattr(ops, "_autograd_cls", None)  # built on real torch
    monkeypatch.setattr(ops, "_device_index", lambda torch, t: 0)  # CPU tensors
    yield ops._function()
    ops._autograd_cls = None


def inputs(lengths=(0, 1, 15, 16, 17, 40), heads=2, d=8, grad=(True, True, True)):
    g = torch.Generator().manual_seed(0)
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, d, generator=g, dtype=torch.float64) for _ in range(3))
    for t, r in zip((q, k, v), grad):
        t.requires_grad_(r)
    offs = [0]
    for n in lengths:
        offs.append(offs[-1] + n)
    return q, k, v, torch.tensor(offs, dtype=torch.int32)


def test_gradients_flow_through_the_function(fn):
    kern = StandInKernel()
    q, k, v, off = inputs()
    out = fn.apply(q, k, v, off, kern, len(off) - 1, False, None, None)
    assert out.requires_grad and out.grad_fn is not None
    w = torch.randn_like(out)
    (out * w).sum().backward()
    # the same through plain autograd of the stand-in's math
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    (attention(q2, k2, v2, off.tolist(), 16) * w).sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert torch.allclose(a.grad, b.grad, atol=1e-12)
    assert [c[0] for c in kern.calls] == ["forward", "backward"]
    assert kern.calls[1][4] is True  # dout reached the kernel contiguous


def test_only_requested_gradients_and_strided_dout(fn):
    kern = StandInKernel()
    q, k, v, off = inputs(grad=(False, False, True))
    out = fn.apply(q, k, v, off, kern, len(off) - 1, True, None, None)
    dout = torch.randn(out.shape[1], out.shape[0], out.shape[2], dtype=out.dtype).transpose(0, 1)
    assert not dout.is_contiguous()
    out.backward(dout)
    assert q.grad is None and k.grad is None and v.grad is not None
    assert kern.calls[0][2] is True and kern.calls[1][2] is True  # poison reaches both passes
    assert kern.calls[1][4] is True


def test_a_refused_backward_surfaces_through_the_engine(fn):
    """Options the backward kernel does not fit: the forward ran, and
    .backward() raises the refusal recorded at forward time, with the C
    message, launching nothing."""
    kern = StandInKernel()
    q, k, v, off = inputs()
    limit = _errors.make_error(_errors.AG_ERR_UNSUPPORTED,
                               "<dict>:8:1: error: not supported yet: the backward pass at "
                               "block_size 256 with head_dim 128 (...)\n"
                               "passes: [forward, backward]\n^", code_name="not supported yet")
    refused = ops._Refused.from_error(limit, ops.BACKWARD_LEAD)
    out = fn.apply(q, k, v, off, kern, len(off) - 1, False, refused, None)
    assert out.requires_grad
    with pytest.raises(_errors.UnsupportedError) as ei:
        out.sum().backward()
    assert str(ei.value).startswith(ops.BACKWARD_LEAD + ": not supported yet: <dict>:8:1:")
    assert ei.value.detail == limit.detail
    assert [c[0] for c in kern.calls] == ["forward"]


def test_double_backward_is_refused(fn):
    kern = StandInKernel()
    q, k, v, off = inputs()
    out = fn.apply(q, k, v, off, kern, len(off) - 1, False, None, None)
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        gq.sum().backward()


def test_rotary_table_is_saved_and_gets_no_gradient(fn):
    kern = StandInKernel()
    q, k, v, off = inputs()
    table = torch.randn(q.shape[0], q.shape[2], dtype=q.dtype, requires_grad=True)
    out = fn.apply(q, k, v, off, kern, len(off) - 1, False, None, table)
    out.sum().backward()
    assert kern.calls[0][3] is table and kern.calls[1][3] is not None
    assert table.grad is None


def packed_inputs(lengths=(0, 1, 15, 16, 17, 40), heads=2, d=8):
    """qkv [total, 3, heads, d] requiring grad, and the offsets."""
    q, k, v, off = inputs(lengths, heads, d, grad=(False, False, False))
    return torch.stack((q, k, v), dim=1).requires_grad_(), off


@pytest.mark.parametrize("strided", [False, True])
def test_views_of_one_qkv_are_read_in_place_or_copied_once(fn, strided):
    """q, k, v as qkv.unbind(1) (rows spaced by 3 * heads * d): a kernel
    that takes row strides gets the views; another gets contiguous copies,
    made once for both passes. The gradients are qkv's either way."""
    kern = StandInKernel(strided=strided)
    qkv, off = packed_inputs()
    q, k, v = qkv.unbind(1)
    out = fn.apply(q, k, v, off, kern, len(off) - 1, False, None, None)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    ref = qkv.detach().clone().requires_grad_()
    (attention(*ref.unbind(1), off.tolist(), 16) * w).sum().backward()
    assert torch.allclose(qkv.grad, ref.grad, atol=1e-12)
    assert kern.calls[0][4] == ((False,) * 3 if strided else (True,) * 3)
    assert kern.calls[0][5] is not strided  # copies are plain; read in place, not


@pytest.mark.parametrize("strided", [False, True])
def test_qkvpacked_returns_one_packed_gradient(fn, strided):
    """block_attention_qkvpacked's Function: dqkv is one tensor like qkv;
    a kernel that takes row strides writes dq, dk, dv into its slices (row
    stride 3 * heads * d), another's gradients are stacked."""
    kern = StandInKernel(strided=strided)
    qkv, off = packed_inputs()
    out = fn.packed.apply(qkv, off, kern, len(off) - 1, False, None, None)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    ref = qkv.detach().clone().requires_grad_()
    (attention(*ref.unbind(1), off.tolist(), 16) * w).sum().backward()
    assert qkv.grad.shape == qkv.shape and qkv.grad.is_contiguous()
    assert torch.allclose(qkv.grad, ref.grad, atol=1e-12)
    heads, d = qkv.shape[2], qkv.shape[3]
    assert kern.calls[1][5] == ((3 * heads * d,) * 3 if strided else None)
    assert kern.calls[0][4] == ((False,) * 3 if strided else (True,) * 3)


def test_qkvpacked_poison_and_refusal(fn):
    """poison reaches both passes, and the packed gradient the kernel writes
    into starts as NaN; a refused backward raises its recorded error."""
    kern = StandInKernel(strided=True)
    qkv, off = packed_inputs()
    out = fn.packed.apply(qkv, off, kern, len(off) - 1, True, None, None)
    out.sum().backward()
    assert kern.calls[0][2] is True and kern.calls[1][2] is True
    assert kern.calls[1][6] is True  # dq, dk, dv slices all NaN before the launch
    limit = _errors.make_error(_errors.AG_ERR_UNSUPPORTED, "no backward",
                               code_name="not supported yet")
    qkv2, _ = packed_inputs()
    out = fn.packed.apply(qkv2, off, kern, len(off) - 1, False,
                          ops._Refused.from_error(limit, ops.BACKWARD_LEAD), None)
    with pytest.raises(_errors.UnsupportedError, match="no backward"):
        out.sum().backward()


def test_grouped_heads_repeat_and_sum_match_autograd(monkeypatch):
    """The grouped-query fallback on real tensors: query head h reads key
    head h // group (repeat_interleave), and _sum_groups of a per-query-head
    gradient is what autograd gives k through that repeat."""
    monkeypatch.setattr(ops.Kernel, "takes_kv_heads", lambda self, di=None: False)
    kern = ops.Kernel(None, None)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(10, 6, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(10, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2))
    ke, ve, launch_kv = kern._grouped(q, k, v, 0)
    assert launch_kv == 6 and ke.shape == q.shape and ke.is_contiguous()
    for h in range(6):
        assert torch.equal(ke[:, h], k[:, h // 3].detach())
    ge = torch.randn(10, 6, 8, generator=g, dtype=torch.float64)
    (want,) = torch.autograd.grad(ke, k, ge)
    assert torch.allclose(ops._sum_groups(ge, 2), want, atol=1e-12)
    assert ops._sum_groups(ge, 6) is ge
    same = kern._grouped(q, q, q, 0)
    assert same[0] is q and same[2] == 6


def test_packed_base_finds_one_qkv_and_nothing_else():
    T, H, D = 6, 2, 8
    x = torch.randn(T, 3 * H * D, dtype=torch.float64, requires_grad=True)
    proj = x * 1  # a projection output: non-leaf, contiguous
    q, k, v = proj.view(T, 3, H, D).unbind(1)
    base = ops._packed_base(q, k, v)
    assert base is not None and base.shape == (T, 3, H, D) and base.data_ptr() == proj.data_ptr()
    cols = [proj[:, i * H * D:(i + 1) * H * D].view(T, H, D) for i in range(3)]
    assert ops._packed_base(*cols) is not None  # column slices, the same memory
    assert ops._packed_base(k, q, v) is None  # not in q, k, v order
    assert ops._packed_base(q, k, v.clone()) is None  # v elsewhere
    wide = torch.randn(T, 3 * H * D + 8, dtype=torch.float64)  # padded rows
    assert ops._packed_base(*(wide[:, i * H * D:(i + 1) * H * D].view(T, H, D)
                              for i in range(3))) is None
    a = torch.randn(T, 3, H, D, dtype=torch.float64)
    views = a.unbind(1)
    views[0].requires_grad_()  # q alone: its gradient must reach q, not a
    assert ops._packed_base(*views) is None
    a.requires_grad_()
    assert ops._packed_base(*a.unbind(1)) is not None  # a leaf's views too
    assert ops._packed_base(*(t.contiguous() for t in a.unbind(1))) is None
    q2, k2, v2 = a.unbind(1)
    q2.retain_grad()  # asked for q's own gradient
    assert ops._packed_base(q2, k2, v2) is None
    q3, k3, v3 = a.unbind(1)
    k3.register_hook(lambda g: g)  # a hook on k must see k's gradient
    assert ops._packed_base(q3, k3, v3) is None
    empty = torch.randn(0, 3, H, D, dtype=torch.float64, requires_grad=True)
    assert ops._packed_base(*empty.unbind(1)) is None


@pytest.mark.parametrize("strided", [False, True])
def test_block_attention_on_views_of_one_qkv_takes_the_packed_gradient(monkeypatch, strided):
    """block_attention on qkv.unbind(1) with grad: the packed Function on
    qkv itself (its gradient in place where the kernel takes row strides,
    no stack), the same gradient as contiguous inputs'."""
    monkeypatch.setattr(ops, "_autograd_cls", None)
    monkeypatch.setattr(ops, "_device_index", lambda torch_, t: 0)
    kern = StandInKernel(strided=strided)
    asked = []
    monkeypatch.setattr(ops, "_grad_kernel",
                        lambda opts, rotary, di, rs=False: asked.append(rs) or (kern, None))
    monkeypatch.setattr(ops, "_fast_block_forward", lambda *a: None)
    monkeypatch.setattr(ops.torch_ops, "traced_torch", lambda: None)
    monkeypatch.setattr(ops._validate, "check_block_attention_args", lambda q, *a: {
        "block_size": 16, "causal": False, "head_dim": q.shape[2], "dtype_tag": "bf16",
        "softmax_scale": None, "rotary": None, "rotary_table": None, "batch": 6})
    qkv, off = packed_inputs()
    out = ops.block_attention(*qkv.unbind(1), off)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    ref = qkv.detach().clone().requires_grad_()
    (attention(*ref.unbind(1), off.tolist(), 16) * w).sum().backward()
    assert torch.allclose(qkv.grad, ref.grad, atol=1e-12)
    assert [c[0] for c in kern.calls] == ["forward", "backward"]
    heads, d = qkv.shape[2], qkv.shape[3]
    assert kern.calls[1][5] == ((3 * heads * d,) * 3 if strided else None)
    assert asked == [True]  # views of one qkv: the row_strides kernels asked for
    ops._autograd_cls = None
