# SPDX-License-Identifier: BSD-3-Clause
"""GPU tests of attngen's torch.library custom ops (torch_ops.py):
torch.compile(fullgraph=True) forward and backward equal to eager, bit for
bit, for each pattern; torch.library.opcheck over every op; CUDA-graph
replay equal to eager; FlopCounterMode's counts equal to the useful FLOPs;
a compiled call on a side stream.

Need torch with CUDA, a GPU and libattngen.so; skipped with the reason
otherwise. The jagged cases ask for deterministic=True: the fast sm_90a
backward adds dq with atomics, whose last bits vary run to run, and these
tests compare bits.
"""
import itertools

import pytest

import attngen
from gpu_env import need_gpu_and_lib
from attngen import _flops

torch = pytest.importorskip("torch", reason="torch is not installed")

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _need_gpu_and_lib():
    need_gpu_and_lib(torch, attngen)
    attngen.register_custom_ops()


def _cu(lens):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32,
                        device="cuda")


def _rand(shape, dtype=torch.bfloat16, seed=0, grad=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    return t.requires_grad_(grad)


LENS = [0, 1, 63, 64, 65, 300, 7]
LENS_K = [5, 0, 64, 17, 130, 250, 7]


def _block_case():
    total = sum(LENS)
    q, k, v = (_rand((total, 4, 128), seed=s) for s in range(3))
    table = _rand((total, 128), seed=9, grad=False)
    return (q, k, v, _cu(LENS), table), dict(
        block_size=64, causal=True, rotary={"layout": "half"}), attngen.block_attention


def _jagged_case():
    q = _rand((sum(LENS), 8, 64), torch.float16, seed=1)
    k, v = (_rand((sum(LENS_K), 2, 64), torch.float16, seed=s) for s in (2, 3))
    return (q, k, v, _cu(LENS), _cu(LENS_K)), dict(
        causal=True, window_size=(48, 0), deterministic=True), attngen.jagged_attention


def _broadcast_case():
    q = _rand((32, 4, 128), seed=4)
    k, v = (_rand((sum(LENS_K), 4, 128), seed=s) for s in (5, 6))
    return (q, k, v, _cu(LENS_K)), dict(causal=True), attngen.broadcast_attention


def _invoke(fn, args, kwargs):
    """fn on args as the case built them (block: the table by keyword)."""
    if fn is attngen.block_attention:
        return fn(*args[:4], rotary_table=args[4], **kwargs)
    return fn(*args, **kwargs)


CASES = {"block": _block_case, "jagged": _jagged_case, "broadcast": _broadcast_case}


def _run(fn, args, kwargs):
    """(out, dq, dk, dv) of fn on fresh leaves of args' q, k, v."""
    leaves = [a.detach().clone().requires_grad_() for a in args[:3]]
    out = fn(leaves + list(args[3:]), kwargs)
    g = torch.Generator(device="cuda").manual_seed(7)
    out.backward(torch.randn(out.shape, device="cuda", dtype=out.dtype, generator=g))
    return [out.detach()] + [t.grad for t in leaves]


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_fullgraph_equals_eager(name):
    args, kwargs, fn = CASES[name]()
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: _invoke(fn, a, kwargs), fullgraph=True)
    eager = _run(lambda a, kw: _invoke(fn, a, kw), args, kwargs)
    got = _run(lambda a, kw: compiled(*a), args, kwargs)
    for what, a, b in zip(("out", "dq", "dk", "dv"), got, eager):
        assert torch.equal(a, b), "%s: compiled differs from eager" % what


def _op_args(name):
    """(forward op, its args, backward op, its args) with real tensors."""
    args, kwargs, _ = CASES[name]()
    ops = torch.ops.attngen
    if name == "block":
        q, k, v, off, table = args
        rt = attngen.torch_ops.rotary_text(attngen._validate.check_rotary(kwargs["rotary"]))
        fwd = (q, k, v, off, 64, True, None, rt, table, True)
        dout = torch.randn_like(q.detach())
        bwd = (dout, q.detach(), k.detach(), v.detach(), off, 64, True, None, rt, table)
        return ops.block_attention.default, fwd, ops.block_attention_backward.default, bwd
    if name == "jagged":
        q, k, v, cq, ck = args
        fwd = (q, k, v, cq, ck, True, 48, 0, None, True, "", None, None, True)
        out, lse = ops.jagged_attention(*[a.detach() if torch.is_tensor(a) else a for a in fwd])
        dout = torch.randn_like(out)
        bwd = (dout, q.detach(), k.detach(), v.detach(), out, lse, cq, ck, True, 48, 0, None,
               True, "", None, None)
        return ops.jagged_attention.default, fwd, ops.jagged_attention_backward.default, bwd
    q, k, v, ck = args
    fwd = (q, k, v, ck, True, -1, -1, None, False, "", None, None, True)
    out, lse = ops.broadcast_attention(*[a.detach() if torch.is_tensor(a) else a for a in fwd])
    dout = torch.randn_like(out)
    bwd = (dout, q.detach(), k.detach(), v.detach(), out, lse, ck, True, -1, -1, None, False, "",
           None, None)
    return ops.broadcast_attention.default, fwd, ops.broadcast_attention_backward.default, bwd


@pytest.mark.parametrize("name", sorted(CASES))
def test_opcheck(name):
    fwd_op, fwd, bwd_op, bwd = _op_args(name)
    torch.library.opcheck(fwd_op, fwd)
    torch.library.opcheck(bwd_op, bwd)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_graph_replay_equals_eager(name):
    args, kwargs, fn = CASES[name]()
    static = [a.detach().clone() if torch.is_tensor(a) else a for a in args]

    def call():
        return _invoke(fn, static, kwargs)

    call()  # compiles and loads the kernel before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for i in range(3):  # fresh q, k, v into the captured buffers
        g = torch.Generator(device="cuda").manual_seed(100 + i)
        for t in static[:3]:
            t.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype, generator=g))
        graph.replay()
        assert torch.equal(out, call())


@pytest.mark.parametrize("name", sorted(CASES))
def test_flop_counter_counts_useful_flops(name):
    from torch.utils.flop_counter import FlopCounterMode
    args, kwargs, fn = CASES[name]()
    with FlopCounterMode(display=False) as counter:
        _run(lambda a, kw: _invoke(fn, a, kw), args, kwargs)
    if name == "block":
        fwd = _flops.block_forward(torch, args[0], args[3], 64, True)
    elif name == "jagged":
        fwd = _flops.jagged_forward(torch, args[0], args[3], args[4], True, (48, 0))
    else:
        fwd = _flops.broadcast_forward(torch, args[0], args[3], True, None)
    assert fwd > 0
    assert counter.get_total_flops() == fwd + _flops.backward(fwd)


def test_compiled_call_on_a_side_stream():
    args, kwargs, fn = CASES["jagged"]()
    q, k, v, cq, ck = (a.detach() for a in args)
    want = fn(q, k, v, cq, ck, **kwargs)
    compiled = torch.compile(lambda *a: fn(*a, **kwargs), fullgraph=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = compiled(q, k, v, cq, ck)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)


def test_compiled_grouped_heads_take_the_row_strides_kernels():
    """Under torch.compile the block op picks the kernels eager
    block_attention picks for the layout: k and v with fewer heads read in
    place by a `row_strides: true` spec's kernels (`_rs`), so compiled and
    eager agree bit for bit, forward and gradients."""
    from attngen import ops
    total = sum(LENS)
    q = _rand((total, 4, 128), seed=11)
    k, v = (_rand((total, 2, 128), seed=s) for s in (12, 13))
    args, kwargs = (q, k, v, _cu(LENS)), dict(block_size=64, causal=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: attngen.block_attention(*a, **kwargs), fullgraph=True)
    eager = _run(lambda a, kw: attngen.block_attention(*a, **kw), args, kwargs)
    got = _run(lambda a, kw: compiled(*a), args, kwargs)
    for what, a, b in zip(("out", "dq", "dk", "dv"), got, eager):
        assert torch.equal(a, b), "%s: compiled differs from eager" % what
    assert any(key[-1] for key in ops._kernels), "no row_strides kernel was asked for"
