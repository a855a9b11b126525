"""The backward's wiring in attngen.ops, on the torch STUB (torch_stub.py):
which kernel a call takes (forward alone, or both passes when an input
requires grad), what reaches ag_block_forward / ag_block_backward (the
pointers of the args struct, the stream), which gradients come back, and
the error while spec validation still gates the backward. No torch, no GPU:
the C parser, the kernel build and the C launches are faked, so these tests
do not depend on whether libattngen.so is built or the gate is lifted.
"""
import ctypes

import pytest

import torch_stub as ts
from attngen import _errors, _lib, _spec, ops

# The diagnostic spec validation gives while the backward is gated
# (generator/spec_check.c), as ag_spec_load_string returns it.
GATE_DETAIL = ("<dict>:8:1: error: not supported yet: the backward pass\n"
               "passes: [forward, backward]\n^")


class Launches:
    """Stands in for _lib.call: records each C launch with a copy of its
    args struct's fields."""

    def __init__(self):
        self.calls = []

    def __call__(self, fn_name, *args, context=None):
        handle, args_ref, stream = args
        fields = {f[0]: getattr(args_ref._obj, f[0]) for f in type(args_ref._obj)._fields_}
        self.calls.append({"fn": fn_name, "handle": handle, "args": fields,
                           "stream": stream.value, "context": context})

    def names(self):
        return [c["fn"] for c in self.calls]


@pytest.fixture
def env(monkeypatch):
    """FakeTorch, faked parse/build/launch, a fresh kernel cache. env.gated
    says whether the fake parser refuses backward specs (the gate)."""
    torch = ts.FakeTorch(stream=0x5EED)
    launches = Launches()

    class Env:
        gated = True
        plan_limit = False   # the grad kernel's build fails like plan.c's limit
        has_bwd = True

    e = Env()
    e.torch, e.launches = torch, launches

    def parse_spec(spec):
        backward = "backward" in spec["passes"]
        if backward and e.gated:
            raise _errors.make_error(_errors.AG_ERR_UNSUPPORTED, GATE_DETAIL,
                                     code_name="not supported yet")
        info = _spec.SpecInfo(
            name=spec["name"], source="<dict>", pattern=spec["pattern"],
            block_size=spec["block_size"], causal=spec["causal"], head_dim=spec["head_dim"],
            dtype=spec["dtype"], softmax_scale=None, scale=spec["head_dim"] ** -0.5,
            passes=tuple(spec["passes"]), rotary=spec.get("_rotary"))
        return None, info

    def handle(self, device_index=None):
        if e.plan_limit and "backward" in self.spec.passes:
            raise _errors.make_error(
                _errors.AG_ERR_UNSUPPORTED,
                "not supported yet: the backward pass at block_size 256 with head_dim 128 "
                "(...)", code_name="not supported yet",
                context="attngen: building kernel '%s' for device 0" % self.spec.name)
        return "handle:%s:%s" % (self.spec.name, device_index)

    monkeypatch.setattr(ops, "_torch", lambda: torch)
    monkeypatch.setattr(ops, "_autograd_cls", None)  # rebuilt on FakeTorch
    monkeypatch.setattr(ops, "_kernels", {})
    monkeypatch.setattr(ops, "parse_spec", parse_spec)
    monkeypatch.setattr(ops.Kernel, "handle", handle)
    monkeypatch.setattr(_lib, "call", launches)
    monkeypatch.setattr(_lib, "has", lambda name: name != "ag_block_backward" or e.has_bwd)
    yield e
    ops._autograd_cls = None  # never leave a class built on the stub behind


def tensors(tokens=100, heads=4, head_dim=64, grad=(True, True, True), lengths=(40, 60)):
    q, k, v = (ts.StubTensor((tokens, heads, head_dim), ptr=next(ts._ptrs), requires_grad=g)
               for g in grad)
    offs = [0]
    for n in lengths:
        offs.append(offs[-1] + n)
    off = ts.StubTensor((len(offs),), ts.int32, ptr=next(ts._ptrs), values=offs)
    return q, k, v, off


def dout_like(q, **kw):
    return ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs), **kw)


# ---- which kernel -----------------------------------------------------------

def test_no_grad_uses_the_forward_only_kernel(env):
    q, k, v, off = tensors(grad=(False, False, False))
    out = ops.block_attention(q, k, v, off, block_size=32)
    assert out.grad_fn is None and out.shape == q.shape and out.data_ptr() != q.data_ptr()
    (call,) = env.launches.calls
    assert call["fn"] == "ag_block_forward"
    assert call["handle"] == "handle:torch_block32_d64_bf16:0"
    a = call["args"]
    assert (a["q"], a["k"], a["v"], a["o"], a["offsets"]) == (
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), off.data_ptr())
    assert (a["batch"], a["heads"], a["total_tokens"]) == (2, 4, 100)
    assert a["rotary_table"] is None and a["host_offsets"] is None
    assert call["stream"] == 0x5EED


def test_grad_mode_off_records_no_graph(env):
    env.torch.grad_enabled = False
    q, k, v, off = tensors()
    out = ops.block_attention(q, k, v, off)
    assert out.grad_fn is None
    assert env.launches.names() == ["ag_block_forward"]
    assert env.launches.calls[0]["handle"] == "handle:torch_block64_d64_bf16:0"


def test_gate_on_forward_runs_and_backward_names_the_gate(env):
    q, k, v, off = tensors(grad=(True, False, False))
    out = ops.block_attention(q, k, v, off, causal=True)
    # the forward ran, on the forward-only kernel
    assert env.launches.names() == ["ag_block_forward"]
    assert env.launches.calls[0]["handle"] == "handle:torch_block64_d64_bf16_causal:0"
    with pytest.raises(_errors.UnsupportedError) as ei:
        ts.run_backward(out, dout_like(q))
    msg = str(ei.value)
    assert msg.startswith("attngen: the backward pass is not enabled yet: ")
    assert GATE_DETAIL in msg  # the C message, passed through
    assert "compute-sanitizer" in msg and "torch.no_grad()" in msg
    assert isinstance(ei.value, NotImplementedError)
    assert ei.value.code == _errors.AG_ERR_UNSUPPORTED
    assert env.launches.names() == ["ag_block_forward"]  # no backward launched
    # a second backward attempt raises a new exception with the same text
    with pytest.raises(_errors.UnsupportedError) as ei2:
        ts.run_backward(out, dout_like(q))
    assert ei2.value is not ei.value and str(ei2.value) == msg


def test_gate_on_kernel_for_backward_raises_and_is_cached(env):
    for _ in range(2):
        with pytest.raises(_errors.UnsupportedError, match="backward pass is not enabled yet"):
            ops.kernel_for(64, False, 128, "bf16", None, backward=True)
    refusal = ops._kernels[(64, False, 128, "bf16", None, True)]
    assert isinstance(refusal, ops._Refused)
    # the forward-only kernel is unaffected
    assert ops.kernel_for(64, False, 128, "bf16").spec.passes == ("forward",)


def test_gate_lifted_forward_and_backward_launch_one_module(env):
    env.gated = False
    q, k, v, off = tensors(head_dim=128)
    out = ops.block_attention(q, k, v, off, [0, 40, 100], block_size=16)
    (fwd,) = env.launches.calls
    assert fwd["fn"] == "ag_block_forward"
    assert fwd["handle"] == "handle:torch_block16_d128_bf16_grad:0"
    assert fwd["args"]["o"] == out.data_ptr()
    dout = dout_like(q)
    dq, dk, dv, *rest = ts.run_backward(out, dout)
    assert rest == [None] * 6  # offsets, kernel, batch, poison, refusal, rotary table
    fwd, bwd = env.launches.calls
    assert bwd["fn"] == "ag_block_backward"
    assert bwd["handle"] == fwd["handle"]  # the same kernel object: one module, both passes
    a = bwd["args"]
    assert list(a) == [f[0] for f in _lib.AgBlockBwdArgs._fields_]
    assert (a["q"], a["k"], a["v"], a["dout"]) == (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                   dout.data_ptr())
    assert (a["dq"], a["dk"], a["dv"]) == (dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
    assert len({a["dq"], a["dk"], a["dv"], a["q"], a["k"], a["v"], a["dout"]}) == 7
    assert (a["offsets"], a["batch"], a["heads"], a["total_tokens"]) == (off.data_ptr(), 2, 4, 100)
    assert a["rotary_table"] is None and a["host_offsets"] is None
    assert bwd["stream"] == 0x5EED
    for g in (dq, dk, dv):
        assert g.shape == q.shape and g.dtype == q.dtype and g.is_contiguous()
        assert g.fill is None  # empty_like, not poisoned
    # saved for the backward: q, k, v, offsets (and the table slot); no output
    ctx = out.grad_fn[1]
    assert ctx.saved_tensors == (q, k, v, off, None)


def test_gradients_only_for_inputs_that_require_them(env):
    env.gated = False
    q, k, v, off = tensors(grad=(False, True, False))
    out = ops.block_attention(q, k, v, off)
    dq, dk, dv = ts.run_backward(out, dout_like(q))[:3]
    assert dq is None and dk is not None and dv is None
    assert env.launches.names() == ["ag_block_forward", "ag_block_backward"]


def test_dout_is_made_contiguous_and_aligned(env):
    env.gated = False
    q, k, v, off = tensors()
    out = ops.block_attention(q, k, v, off)
    strided = dout_like(q, contiguous=False)
    ts.run_backward(out, strided)
    passed = env.launches.calls[-1]["args"]["dout"]
    assert passed != strided.data_ptr() and passed % 16 == 0
    misaligned = dout_like(q)
    misaligned._ptr += 2
    ts.run_backward(out, misaligned)
    passed = env.launches.calls[-1]["args"]["dout"]
    assert passed != misaligned.data_ptr() and passed % 16 == 0
    fine = dout_like(q)
    ts.run_backward(out, fine)
    assert env.launches.calls[-1]["args"]["dout"] == fine.data_ptr()  # no copy


def test_poison_reaches_the_gradients(env):
    env.gated = False
    q, k, v, off = tensors()
    out = ops.block_attention(q, k, v, off, _poison=True)
    assert str(out.fill) == "nan"
    for g in ts.run_backward(out, dout_like(q))[:3]:
        assert str(g.fill) == "nan"


def test_empty_batch_launches_nothing(env):
    env.gated = False
    q, k, v, off = tensors(tokens=0, lengths=(0, 0))
    out = ops.block_attention(q, k, v, off)
    grads = ts.run_backward(out, dout_like(q))[:3]
    assert env.launches.calls == []
    assert all(g.shape == (0, 4, 64) for g in grads)


def test_backward_plan_limit_falls_back_to_the_forward(env):
    env.gated, env.plan_limit = False, True
    q, k, v, off = tensors(head_dim=128)
    out = ops.block_attention(q, k, v, off, block_size=256)
    assert env.launches.calls[0]["handle"] == "handle:torch_block256_d128_bf16:0"
    with pytest.raises(_errors.UnsupportedError) as ei:
        ts.run_backward(out, dout_like(q))
    msg = str(ei.value)
    assert msg.startswith("attngen: the backward pass is not supported for these options: ")
    assert "block_size 256 with head_dim 128" in msg


def test_library_without_ag_block_backward(env):
    env.gated, env.has_bwd = False, False
    q, k, v, off = tensors()
    out = ops.block_attention(q, k, v, off)
    with pytest.raises(_errors.UnsupportedError, match="has no ag_block_backward"):
        ts.run_backward(out, dout_like(q))


# ---- Kernel objects ----------------------------------------------------------

def _kernel(env, passes=("forward", "backward"), rotary=None, head_dim=64):
    spec = _spec.block_spec(64, head_dim, "bf16", backward="backward" in passes)
    spec["passes"] = list(passes)
    spec["name"] = "k_" + "_".join(passes)
    if rotary:
        spec["_rotary"] = rotary
    box, info = ops.parse_spec(spec)
    return ops.Kernel(box, info)


def test_kernel_backward_runs_the_kernel_alone(env):
    env.gated = False
    kern = _kernel(env)
    q, k, v, off = tensors(grad=(False, False, False))
    dout = dout_like(q)
    dq, dk, dv = kern.backward(q, k, v, dout, off, [0, 40, 100])
    (call,) = env.launches.calls
    assert call["fn"] == "ag_block_backward" and call["handle"] == "handle:k_forward_backward:0"
    assert call["args"]["dout"] == dout.data_ptr() and call["args"]["dq"] == dq.data_ptr()
    with pytest.raises(ValueError, match=r"dout must have q's shape \[100, 4, 64\]"):
        kern.backward(q, k, v, ts.StubTensor((100, 4, 128)), off)
    with pytest.raises(ValueError, match="dout must be contiguous"):
        kern.backward(q, k, v, dout_like(q, contiguous=False), off)
    with pytest.raises(ValueError, match="dout must have q's dtype"):
        kern.backward(q, k, v, ts.StubTensor(q.shape, ts.float16), off)
    with pytest.raises(ValueError, match="cpu_offsets"):
        kern.backward(q, k, v, dout, off, [0, 40])


def test_kernel_without_the_backward_pass(env):
    kern = _kernel(env, passes=("forward",))
    q, k, v, off = tensors()
    with pytest.raises(_errors.UnsupportedError, match=r"has no backward pass \(passes: forward\)"):
        kern.backward(q, k, v, dout_like(q), off)
    out = kern(q, k, v, off)  # the forward still runs under autograd
    assert env.launches.names() == ["ag_block_forward"]
    with pytest.raises(NotImplementedError, match="passes: \\[forward, backward\\]"):
        ts.run_backward(out, dout_like(q))


def test_rotary_table_is_passed_to_both_passes(env):
    env.gated = False
    kern = _kernel(env, rotary={"layout": "interleaved", "apply_to": ("q", "k"),
                                "positions": "table", "base": 10000.0})
    q, k, v, off = tensors()
    table = ts.StubTensor((100, 64), ptr=next(ts._ptrs))
    with pytest.raises(ValueError, match="pass rotary_table"):
        kern(q, k, v, off)
    out = kern(q, k, v, off, rotary_table=table)
    ts.run_backward(out, dout_like(q))
    assert [c["args"]["rotary_table"] for c in env.launches.calls] == [table.data_ptr()] * 2
    kern.backward(q, k, v, dout_like(q), off, rotary_table=table)
    assert env.launches.calls[-1]["args"]["rotary_table"] == table.data_ptr()
    with pytest.raises(ValueError, match=r"rotary_table must be \[total_tokens, head_dim\]"):
        kern(q, k, v, off, rotary_table=ts.StubTensor((100, 128)))
    plain = _kernel(env)
    with pytest.raises(ValueError, match="takes no rotary_table"):
        plain(q, k, v, off, rotary_table=table)


def test_bwd_args_struct_round_trips_pointers():
    """The ctypes struct keeps 64-bit pointers and sizes intact."""
    a = _lib.AgBlockBwdArgs(q=0x7F0000000010, dout=0x7F00000000F0, dv=0x10, offsets=0x20,
                            batch=1 << 40, heads=3, total_tokens=(1 << 33) + 5, rotary_table=None)
    assert (a.q, a.dout, a.dv, a.offsets) == (0x7F0000000010, 0x7F00000000F0, 0x10, 0x20)
    assert (a.batch, a.heads, a.total_tokens) == (1 << 40, 3, (1 << 33) + 5)
    assert a.k is None and a.host_offsets is None and a.rotary_table is None
    assert ctypes.sizeof(a) == 13 * 8
