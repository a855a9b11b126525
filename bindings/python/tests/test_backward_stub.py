# SPDX-License-Identifier: BSD-3-Clause
"""The backward's and rotary embeddings' wiring in attngen.ops, on the torch
STUB (torch_stub.py): which kernel a call takes (forward alone, or both
passes when an input requires grad; rotary options in the spec), what
reaches ag_block_forward / ag_block_backward (the pointers of the args
struct, the rotary table, the stream), which gradients come back, and the
error when the backward does not fit the options. No torch, no GPU: the C
parser, the kernel build and the C launches are faked, so these tests do
not depend on whether libattngen.so is built.
"""
import ctypes

import pytest

import torch_stub as ts
from attngen import _errors, _lib, _spec, ops

# What spec validation would say of a backward that does not fit (a limit of
# plan.c's, reported by generator/spec_check.c at `passes`), as
# ag_spec_load_string returns it. Every block size has a backward today, so
# the message is made up; the fallback it drives is what is tested.
LIMIT_DETAIL = ("<dict>:8:1: error: not supported yet: the backward pass at block_size 256 with "
                "head_dim 128 (...)\npasses: [forward, backward]\n^")


class Launches:
    """Stands in for _lib.call: records each C launch with a copy of its
    args struct's fields."""

    def __init__(self):
        self.calls = []

    def __call__(self, fn_name, *args, context=None):
        handle, args_ref, stream = args
        obj = _lib.args_of(fn_name, args_ref)
        fields = {f[0]: getattr(obj, f[0]) for f in type(obj)._fields_}
        self.calls.append({"fn": fn_name, "handle": handle, "args": fields,
                           "stream": stream or None, "context": context})

    def names(self):
        return [c["fn"] for c in self.calls]


@pytest.fixture
def env(monkeypatch):
    """FakeTorch, faked parse/build/launch, a fresh kernel cache. With
    env.plan_limit, the fake parser refuses specs with the backward pass as
    validation does for shapes the backward does not fit; env.parsed lists
    the spec dicts it was given."""
    torch = ts.FakeTorch(stream=0x5EED)
    launches = Launches()

    class Env:
        plan_limit = False
        has_bwd = True
        strided = False  # what Kernel.takes_row_strides answers
        grouped = False  # what Kernel.takes_kv_heads answers
        refuse_strides = False  # refuse `row_strides: true` as for a chunked backward

    e = Env()
    e.torch, e.launches, e.parsed = torch, launches, []

    def parse_spec(spec):
        e.parsed.append(spec)
        backward = "backward" in spec["passes"]
        if backward and e.plan_limit:
            raise _errors.make_error(_errors.AG_ERR_UNSUPPORTED, LIMIT_DETAIL,
                                     code_name="not supported yet")
        if spec.get("row_strides") and e.refuse_strides:
            raise _errors.make_error(_errors.AG_ERR_UNSUPPORTED, "row_strides with the backward "
                                     "of 256-token blocks", code_name="not supported yet")
        r = spec.get("rotary")
        rotary = None if r is None else {
            "layout": r["layout"], "apply_to": tuple(r.get("apply_to", ("q", "k"))),
            "positions": r.get("positions", "table"), "base": r.get("base", 10000.0)}
        info = _spec.SpecInfo(
            name=spec["name"], source="<dict>", pattern=spec["pattern"],
            block_size=spec["block_size"], causal=spec["causal"], head_dim=spec["head_dim"],
            dtype=spec["dtype"], softmax_scale=None, scale=spec["head_dim"] ** -0.5,
            passes=tuple(spec["passes"]), rotary=rotary)
        return None, info

    def handle(self, device_index=None):
        return "handle:%s:%s" % (self.spec.name, device_index)

    monkeypatch.setattr(ops, "_torch", lambda: torch)
    monkeypatch.setattr(ops, "_autograd_cls", None)  # rebuilt on FakeTorch
    monkeypatch.setattr(ops, "_kernels", {})
    monkeypatch.setattr(ops, "_fast_kernels", {})
    monkeypatch.setattr(ops, "parse_spec", parse_spec)
    monkeypatch.setattr(ops.Kernel, "handle", handle)
    monkeypatch.setattr(ops.Kernel, "takes_row_strides", lambda self, di=None: e.strided)
    monkeypatch.setattr(ops.Kernel, "takes_kv_heads", lambda self, di=None: e.grouped)
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


def test_the_layout_picks_the_row_strides_kernels(env):
    """Contiguous q, k, v take the packed kernels; a view whose rows alone
    are spaced, or k and v with fewer heads, the row_strides spec's (`_rs`,
    `row_strides: true`), with and without grad; where that spec is refused
    (the chunked backward of large blocks) the packed kernels, which copy."""
    row = 3 * 4 * 64
    def view():
        return ts.StubTensor((100, 4, 64), ptr=next(ts._ptrs), contiguous=False,
                             strides=(row, 64, 1))
    q, k, v, off = tensors(grad=(False,) * 3)
    ops.block_attention(q, k, v, off)
    env.strided = True  # as the `_rs` kernels answer
    ops.block_attention(view(), k, v, off)
    qg, kg, vg, _ = tensors()
    ops.block_attention(view(), kg, vg, off)
    handles = [c["handle"] for c in env.launches.calls]
    assert handles == ["handle:torch_block64_d64_bf16:0", "handle:torch_block64_d64_bf16_rs:0",
                       "handle:torch_block64_d64_bf16_rs_grad:0"]
    assert [s.get("row_strides", False) for s in env.parsed] == [False, True, True]
    assert env.launches.calls[1]["args"]["q_stride"] == row
    env.refuse_strides, env.strided = True, False
    env.launches.calls.clear()
    ops.block_attention(view(), kg, vg, off, block_size=32)
    (call,) = env.launches.calls
    assert call["handle"] == "handle:torch_block32_d64_bf16_grad:0"
    assert call["args"]["q_stride"] == 0  # copied


def test_grad_mode_off_records_no_graph(env):
    env.torch.grad_enabled = False
    q, k, v, off = tensors()
    out = ops.block_attention(q, k, v, off)
    assert out.grad_fn is None
    assert env.launches.names() == ["ag_block_forward"]
    assert env.launches.calls[0]["handle"] == "handle:torch_block64_d64_bf16:0"


def test_forward_and_backward_launch_one_module(env):
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
    q, k, v, off = tensors(grad=(False, True, False))
    out = ops.block_attention(q, k, v, off)
    dq, dk, dv = ts.run_backward(out, dout_like(q))[:3]
    assert dq is None and dk is not None and dv is None
    assert env.launches.names() == ["ag_block_forward", "ag_block_backward"]


def test_dout_is_made_contiguous_and_aligned(env):
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
    q, k, v, off = tensors()
    out = ops.block_attention(q, k, v, off, _poison=True)
    assert str(out.fill) == "nan"
    for g in ts.run_backward(out, dout_like(q))[:3]:
        assert str(g.fill) == "nan"


def test_empty_batch_launches_nothing(env):
    q, k, v, off = tensors(tokens=0, lengths=(0, 0))
    out = ops.block_attention(q, k, v, off)
    grads = ts.run_backward(out, dout_like(q))[:3]
    assert env.launches.calls == []
    assert all(g.shape == (0, 4, 64) for g in grads)


def test_backward_plan_limit_falls_back_to_the_forward(env):
    env.plan_limit = True
    q, k, v, off = tensors(head_dim=128)
    # (128: from 192 tokens a call with grad takes the jagged kernels)
    out = ops.block_attention(q, k, v, off, block_size=128)
    assert env.launches.calls[0]["handle"] == "handle:torch_block128_d128_bf16:0"
    with pytest.raises(_errors.UnsupportedError) as ei:
        ts.run_backward(out, dout_like(q))
    msg = str(ei.value)
    assert msg.startswith(ops.BACKWARD_LEAD + ": ")
    assert "block_size 256 with head_dim 128" in msg and LIMIT_DETAIL in msg
    assert isinstance(ei.value, NotImplementedError) and ei.value.detail == LIMIT_DETAIL
    assert env.launches.names() == ["ag_block_forward"]  # no backward launched
    # a second attempt raises a new exception with the same text
    with pytest.raises(_errors.UnsupportedError) as ei2:
        ts.run_backward(out, dout_like(q))
    assert ei2.value is not ei.value and str(ei2.value) == msg


def test_kernel_for_caches_validations_refusal(env):
    env.plan_limit = True
    for _ in range(2):
        with pytest.raises(_errors.UnsupportedError, match="block_size 256 with head_dim 128"):
            ops.kernel_for(256, False, 128, "bf16", None, backward=True)
    refusal = ops._kernels[(256, False, 128, "bf16", None, True, None, False)]
    assert isinstance(refusal, ops._Refused)
    assert len(env.parsed) == 1  # asked once
    # the forward-only kernel is unaffected
    assert ops.kernel_for(256, False, 128, "bf16").spec.passes == ("forward",)


def test_library_without_ag_block_backward(env):
    env.has_bwd = False
    q, k, v, off = tensors()
    out = ops.block_attention(q, k, v, off)
    with pytest.raises(_errors.UnsupportedError, match="has no ag_block_backward"):
        ts.run_backward(out, dout_like(q))


# ---- rotary embeddings through block_attention ------------------------------

ROPE = {"layout": "interleaved", "apply_to": ["k", "q"]}


def test_rotary_table_reaches_both_passes_of_one_module(env):
    q, k, v, off = tensors(head_dim=128)
    table = ts.StubTensor((100, 128), ptr=next(ts._ptrs))
    out = ops.block_attention(q, k, v, off, rotary=ROPE, rotary_table=table)
    spec = env.parsed[-1]
    assert spec["rotary"] == {"layout": "interleaved", "apply_to": ["q", "k"],
                              "positions": "table"}
    assert spec["passes"] == ["forward", "backward"]
    assert spec["name"] == "torch_block64_d128_bf16_ropei_qk_t_grad"
    dq, dk, dv, *rest = ts.run_backward(out, dout_like(q))
    assert rest == [None] * 6  # offsets, kernel, batch, poison, refusal; the table gets none
    fwd, bwd = env.launches.calls
    assert fwd["handle"] == bwd["handle"] == "handle:torch_block64_d128_bf16_ropei_qk_t_grad:0"
    assert fwd["args"]["rotary_table"] == bwd["args"]["rotary_table"] == table.data_ptr()
    assert out.grad_fn[1].saved_tensors == (q, k, v, off, table)


def test_rotary_without_grad_and_computed_positions(env):
    q, k, v, off = tensors(grad=(False, False, False))
    seq = {"layout": "half", "positions": "sequence", "base": 5e5, "apply_to": ("q", "k", "v")}
    ops.block_attention(q, k, v, off, rotary=seq)
    spec = env.parsed[-1]
    assert spec["rotary"] == {"layout": "half", "apply_to": ["q", "k", "v"],
                              "positions": "sequence", "base": 500000.0}
    assert spec["passes"] == ["forward"]
    (call,) = env.launches.calls
    assert call["handle"] == "handle:torch_block64_d64_bf16_ropeh_qkv_s_b500000:0"
    assert call["args"]["rotary_table"] is None
    # the same options written otherwise: the cached kernel
    ops.block_attention(q, k, v, off, rotary={"layout": "half", "positions": "sequence",
                                              "base": 500000, "apply_to": ["v", "k", "q"]})
    assert len(env.parsed) == 1
    # a layout name alone: q and k, positions from the table
    table = ts.StubTensor((100, 64), ptr=next(ts._ptrs))
    ops.block_attention(q, k, v, off, rotary="half", rotary_table=table)
    assert env.parsed[-1]["rotary"] == {"layout": "half", "apply_to": ["q", "k"],
                                        "positions": "table"}
    assert env.launches.calls[-1]["args"]["rotary_table"] == table.data_ptr()


def test_rotary_argument_errors(env):
    q, k, v, off = tensors()
    table = ts.StubTensor((100, 64), ptr=next(ts._ptrs))
    cases = [
        (dict(rotary="interleaved"), "need rotary_table"),
        (dict(rotary_table=table), "only taken with rotary positions 'table'"),
        (dict(rotary={"layout": "half", "positions": "block"}, rotary_table=table), "only taken"),
        (dict(rotary={"layout": "diagonal"}), "layout must be 'interleaved' or 'half'"),
        (dict(rotary={"apply_to": ["q"]}), "layout must be"),
        (dict(rotary={"layout": "half", "apply_to": []}, rotary_table=table), "non-empty"),
        (dict(rotary={"layout": "half", "apply_to": ["q", "q"]}, rotary_table=table), "distinct"),
        (dict(rotary={"layout": "half", "apply_to": "qk"}, rotary_table=table), "must be a list"),
        (dict(rotary={"layout": "half", "base": 1e4}, rotary_table=table), "base applies only"),
        (dict(rotary={"layout": "half", "positions": "block", "base": -1.0}), "positive finite"),
        (dict(rotary={"layout": "half", "positions": "rope"}), "positions must be"),
        (dict(rotary={"layout": "half", "postions": "block"}), "unknown key postions"),
        (dict(rotary=["half"]), "rotary must be None"),
        (dict(rotary="half", rotary_table=ts.StubTensor((100, 64), ts.float16)), "q's dtype"),
        (dict(rotary="half", rotary_table=ts.StubTensor((99, 64))), r"\[total_tokens, head_dim\]"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            ops.block_attention(q, k, v, off, **kw)
    assert env.launches.calls == [] and env.parsed == []


# ---- Kernel objects ----------------------------------------------------------

def _kernel(env, passes=("forward", "backward"), rotary=None, head_dim=64):
    spec = _spec.block_spec(64, head_dim, "bf16", backward="backward" in passes, rotary=rotary)
    spec["passes"] = list(passes)
    spec["name"] = "k_" + "_".join(passes)
    box, info = ops.parse_spec(spec)
    return ops.Kernel(box, info)


def test_kernel_backward_runs_the_kernel_alone(env):
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
    kern = _kernel(env, rotary={"layout": "interleaved", "apply_to": ("q", "k"),
                                "positions": "table", "base": None})
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
    assert a.dq_stride == 0 and a.dv_stride == 0  # packed unless set
    assert a.kv_heads == 0  # heads unless set
    assert ctypes.sizeof(a) == 21 * 8


# ---- the eager fast path ----------------------------------------------------

def _count_full_checks(monkeypatch):
    """Counts the full path's argument checks (block_attention's)."""
    seen = []
    full = ops._validate.check_block_attention_args

    def counted(*a, **kw):
        seen.append(1)
        return full(*a, **kw)

    monkeypatch.setattr(ops._validate, "check_block_attention_args", counted)
    return seen


def test_a_repeated_eager_call_takes_the_fast_path(env, monkeypatch):
    """The second call with the same options skips the option checks and
    the kernel lookup, and launches exactly what the first did."""
    seen = _count_full_checks(monkeypatch)
    q, k, v, off = tensors(grad=(False, False, False))
    first = ops.block_attention(q, k, v, off, block_size=32, causal=True)
    second = ops.block_attention(q, k, v, off, block_size=32, causal=True)
    assert len(seen) == 1
    a, b = env.launches.calls
    assert a["fn"] == b["fn"] == "ag_block_forward"
    assert a["handle"] == b["handle"] and a["stream"] == b["stream"] == 0x5EED
    assert a["args"]["o"] == first.data_ptr() and b["args"]["o"] == second.data_ptr()
    for f in ("q", "k", "v", "offsets", "batch", "heads", "total_tokens", "rotary_table",
              "host_offsets"):
        assert a["args"][f] == b["args"][f], f
    # other options, another head_dim: the full path first, then fast
    q2, k2, v2, off2 = tensors(head_dim=128, grad=(False, False, False))
    ops.block_attention(q2, k2, v2, off2, block_size=32, causal=True)
    ops.block_attention(q2, k2, v2, off2, block_size=32, causal=True)
    assert len(seen) == 2 and len(env.launches.calls) == 4


@pytest.mark.parametrize("change", ["numpy-like block size", "int causal", "int scale",
                                    "cpu_offsets", "not contiguous", "requires grad",
                                    "traced", "bad block size"])
def test_the_fast_path_leaves_what_it_does_not_know_to_the_full_one(env, monkeypatch, change):
    seen = _count_full_checks(monkeypatch)
    q, k, v, off = tensors(grad=(False, False, False))
    ops.block_attention(q, k, v, off, block_size=32, causal=False, softmax_scale=0.5)
    assert len(seen) == 1

    class Index:  # an integer type that is not int (numpy's, torch's)
        def __index__(self):
            return 32

    kw = dict(block_size=32, causal=False, softmax_scale=0.5)
    args = [q, k, v, off]
    if change == "numpy-like block size":
        kw["block_size"] = Index()
    elif change == "int causal":
        kw["causal"] = 0
    elif change == "int scale":
        kw["softmax_scale"] = 1
    elif change == "cpu_offsets":
        args.append([0, 40, 100])
    elif change == "not contiguous":
        args[1] = ts.StubTensor(k.shape, ptr=next(ts._ptrs), contiguous=False)
    elif change == "requires grad":
        args[2] = ts.StubTensor(v.shape, ptr=next(ts._ptrs), requires_grad=True)
    elif change == "traced":
        monkeypatch.setattr(ops.torch_ops, "traced_torch", lambda: None)
        env.torch._C._len_torch_dispatch_stack = lambda: 1
    elif change == "bad block size":
        kw["block_size"] = 33
    if change in ("int causal", "bad block size"):
        with pytest.raises(ValueError):
            ops.block_attention(*args, **kw)
    else:
        ops.block_attention(*args, **kw)
    assert len(seen) == 2  # the full path ran (and raised where it should)


def test_kernel_call_checks_stay_whole_on_the_fast_check(env):
    """Kernel.__call__ and .backward check their tensors in one pass too;
    a dtype or head_dim the kernel is not for is still refused."""
    kernel = ops.kernel_for(32, False, 64, "bf16", None, backward=True)
    q, k, v, off = tensors(grad=(False, False, False))
    out = kernel(q, k, v, off)
    dq, dk, dv = kernel.backward(q, k, v, dout_like(q), off)
    assert env.launches.names() == ["ag_block_forward", "ag_block_backward"]
    assert env.launches.calls[1]["args"]["dq"] == dq.data_ptr()
    assert out.shape == dq.shape == q.shape
    q2, k2, v2, off2 = tensors(head_dim=128, grad=(False, False, False))
    with pytest.raises(ValueError, match="head_dim 64"):
        kernel(q2, k2, v2, off2)
    h = [ts.StubTensor(q.shape, ts.float16, ptr=next(ts._ptrs)) for _ in range(3)]
    with pytest.raises(ValueError, match="bf16"):
        kernel(*h, off)


def _bad_block_inputs(which):
    """q, k, v, offsets with one thing the fast check must refuse."""
    q, k, v, off = tensors(grad=(False, False, False))
    if which == "misaligned k":
        k = ts.StubTensor(k.shape, ptr=0x7F0000000008)
    elif which == "v on the host":
        v = ts.StubTensor(v.shape, ptr=next(ts._ptrs), device="cpu")
    elif which == "offsets on another device":
        off = ts.offsets([0, 40, 100], device="cuda:1")
    elif which == "int64 offsets":
        off = ts.offsets([0, 40, 100], dtype=ts.int64)
    elif which == "2-D offsets":
        off = ts.StubTensor((3, 1), ts.int32, ptr=next(ts._ptrs))
    elif which == "fp16 k":
        k = ts.StubTensor(k.shape, ts.float16, ptr=next(ts._ptrs))
    elif which == "v of another shape":
        v = ts.StubTensor((100, 4, 128), ptr=next(ts._ptrs))
    elif which == "head_dim 96":
        q, k, v = (ts.StubTensor((100, 4, 96), ptr=next(ts._ptrs)) for _ in range(3))
    return q, k, v, off


@pytest.mark.parametrize("which", ["misaligned k", "v on the host", "offsets on another device",
                                   "int64 offsets", "2-D offsets", "fp16 k",
                                   "v of another shape", "head_dim 96"])
def test_every_fast_check_sends_bad_tensors_to_the_full_path(env, monkeypatch, which):
    """Each tensor check of the fast path refuses what the full checks
    refuse, so the full path runs and raises (block_attention, and a
    Kernel's call and backward)."""
    seen = _count_full_checks(monkeypatch)
    good = tensors(grad=(False, False, False))
    ops.block_attention(*good)  # the options checked once: fast from now
    ops.block_attention(*good)
    assert len(seen) == 1
    bad = _bad_block_inputs(which)
    with pytest.raises(ValueError):
        ops.block_attention(*bad)
    assert len(seen) == 2
    kernel = ops.kernel_for(64, False, 64, "bf16", None, backward=True)
    with pytest.raises(ValueError):
        kernel(*bad)
    with pytest.raises(ValueError):
        kernel.backward(bad[0], bad[1], bad[2], dout_like(good[0]), bad[3])
    assert env.launches.names() == ["ag_block_forward"] * 2


def test_a_rotary_call_does_not_fill_the_plain_fast_path(env):
    """The fast key leaves rotary out: a rotary call must not leave its
    kernel where a plain call with the same options finds it."""
    q, k, v, off = tensors(grad=(False, False, False))
    rot = {"layout": "half", "positions": "sequence"}
    ops.block_attention(q, k, v, off, rotary=rot)
    ops.block_attention(q, k, v, off)
    ops.block_attention(q, k, v, off)
    first, plain, fast = (c["handle"] for c in env.launches.calls)
    assert plain == fast == "handle:torch_block64_d64_bf16:0" and first != plain


def test_option_types_the_fast_key_does_not_stand_for(env, monkeypatch):
    """A bool scale equal to a cached 1.0 and an int subclass equal to a
    cached block size hash alike but take the full path: the bool is
    refused there, the int subclass accepted."""
    seen = _count_full_checks(monkeypatch)
    q, k, v, off = tensors(grad=(False, False, False))
    ops.block_attention(q, k, v, off, block_size=32, softmax_scale=1.0)
    ops.block_attention(q, k, v, off, block_size=32, softmax_scale=1.0)
    assert len(seen) == 1
    with pytest.raises(ValueError):
        ops.block_attention(q, k, v, off, block_size=32, softmax_scale=True)
    assert len(seen) == 2
    ops.block_attention(q, k, v, off, block_size=32, softmax_scale=1)
    assert len(seen) == 3

    class MyInt(int):
        pass

    ops.block_attention(q, k, v, off, block_size=MyInt(32), softmax_scale=1.0)
    assert len(seen) == 4


# ---- views of one projection output, and the packed qkv ----------------------

def packed(tokens=100, heads=4, head_dim=64, lengths=(40, 60), **kw):
    """qkv [tokens, 3, heads, head_dim] and its offsets."""
    qkv = ts.StubTensor((tokens, 3, heads, head_dim), ptr=next(ts._ptrs), **kw)
    _, _, _, off = tensors(tokens, heads, head_dim, (False,) * 3, lengths)
    return qkv, off


@pytest.mark.parametrize("strided", [False, True])
def test_views_are_read_by_their_row_stride_or_copied(env, strided):
    """q, k, v = qkv.unbind(1): a kernel that takes row strides gets the
    views' pointers and their stride 3 * heads * head_dim (the output
    packed); another gets contiguous copies and packed strides. Forward
    and backward alike."""
    env.strided = strided
    qkv, off = packed()
    q, k, v = qkv.unbind(1)
    kernel = ops.kernel_for(64, False, 64, "bf16", None, backward=True)
    out = kernel(q, k, v, off)
    dq, dk, dv = kernel.backward(q, k, v, dout_like(q), off)
    fwd, bwd = (c["args"] for c in env.launches.calls)
    row = 3 * 4 * 64
    if strided:
        assert (fwd["q"], fwd["k"], fwd["v"]) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
        assert (fwd["q_stride"], fwd["k_stride"], fwd["v_stride"], fwd["o_stride"]) == \
            (row, row, row, 0)
        assert (bwd["q"], bwd["k"], bwd["v"]) == (q.data_ptr(), k.data_ptr(), v.data_ptr())
        assert (bwd["q_stride"], bwd["k_stride"], bwd["v_stride"]) == (row, row, row)
    else:
        views = {q.data_ptr(), k.data_ptr(), v.data_ptr()}
        assert not views & {fwd["q"], fwd["k"], fwd["v"], bwd["q"], bwd["k"], bwd["v"]}
        assert all(fwd[n] == 0 for n in ("q_stride", "k_stride", "v_stride", "o_stride"))
    assert all(bwd[n] == 0 for n in ("dout_stride", "dq_stride", "dk_stride", "dv_stride"))
    assert out.is_contiguous() and all(g.is_contiguous() for g in (dq, dk, dv))


@pytest.mark.parametrize("layout", ["heads spaced", "stride not a multiple of 8",
                                    "misaligned", "rows overlap"])
def test_views_a_kernel_cannot_read_are_copied(env, layout):
    """Views whose heads or head_dim are not dense, whose row stride the
    launcher would refuse, or whose data is misaligned are copied even for
    a kernel that takes row strides."""
    env.strided = True
    shape = (100, 4, 64)
    strides = {"heads spaced": (4 * 128, 128, 1), "stride not a multiple of 8": (4 * 64 + 4, 64, 1),
               "misaligned": (3 * 4 * 64, 64, 1), "rows overlap": (64, 64, 1)}[layout]
    ptr = next(ts._ptrs) + (8 if layout == "misaligned" else 0)
    q = ts.StubTensor(shape, ptr=ptr, contiguous=False, strides=strides)
    _, k, v, off = tensors(grad=(False,) * 3)
    ops.block_attention(q, k, v, off)
    (call,) = env.launches.calls
    assert call["args"]["q"] != q.data_ptr() and call["args"]["q_stride"] == 0
    assert call["args"]["k"] == k.data_ptr()
    # a layout no row stride reads: the packed kernels, not the `_rs` ones
    assert call["handle"] == "handle:torch_block64_d64_bf16:0"


def test_views_through_autograd_are_copied_once(env):
    """A kernel without row strides: the Function copies the views once and
    both passes read those copies."""
    qkv, off = packed(requires_grad=True)
    q, k, v = qkv.unbind(1)
    for t in (q, k, v):
        t.requires_grad = True
    out = ops.block_attention(q, k, v, off)
    ts.run_backward(out, dout_like(out))
    fwd, bwd = (c["args"] for c in env.launches.calls)
    assert (fwd["q"], fwd["k"], fwd["v"]) == (bwd["q"], bwd["k"], bwd["v"])
    assert fwd["q"] != q.data_ptr()


@pytest.mark.parametrize("strided", [False, True])
def test_qkvpacked_backward_writes_one_packed_gradient(env, strided):
    """block_attention_qkvpacked: the forward reads qkv's slices (in place
    or copied); the backward returns one dqkv like qkv, its slices written
    by the kernel at row stride 3 * heads * head_dim, or stacked from
    packed gradients when the kernel takes no row strides."""
    env.strided = strided
    qkv, off = packed(requires_grad=True)
    out = ops.block_attention_qkvpacked(qkv, off, causal=True)
    assert out.shape == (100, 4, 64)
    # the row_strides spec's kernels (`_rs`), asked for by the layout
    assert env.launches.calls[0]["handle"] == "handle:torch_block64_d64_bf16_causal_rs_grad:0"
    (dqkv, *rest) = ts.run_backward(out, dout_like(out))
    assert all(r is None for r in rest) and dqkv.shape == qkv.shape
    bwd = env.launches.calls[1]["args"]
    row = 3 * 4 * 64
    if strided:
        assert dqkv.stacked_from is None
        assert (bwd["dq"], bwd["dk"], bwd["dv"]) == tuple(
            dqkv.data_ptr() + i * 4 * 64 * 2 for i in range(3))
        assert (bwd["dq_stride"], bwd["dk_stride"], bwd["dv_stride"]) == (row, row, row)
        assert bwd["q"] == qkv.data_ptr() and bwd["q_stride"] == row
    else:
        assert [t.data_ptr() for t in dqkv.stacked_from] == [bwd["dq"], bwd["dk"], bwd["dv"]]
        assert bwd["dq_stride"] == bwd["q_stride"] == 0


def test_qkvpacked_without_grad_and_bad_shapes(env):
    """Without grad it is block_attention on the slices (no Function); a
    qkv that is not [tokens, 3, heads, head_dim] is refused by name."""
    qkv, off = packed()
    out = ops.block_attention_qkvpacked(qkv, off)
    assert out.grad_fn is None and env.launches.names() == ["ag_block_forward"]
    for shape in [(100, 4, 64), (100, 2, 4, 64), (100, 3, 4, 64, 1)]:
        with pytest.raises(ValueError, match=r"qkv must be 4-D \[total_tokens, 3, heads, "):
            ops.block_attention_qkvpacked(ts.StubTensor(shape), off)
    with pytest.raises(ValueError, match="qkv must be a torch.Tensor, got list"):
        ops.block_attention_qkvpacked([1, 2, 3], off)
    with pytest.raises(ValueError, match="qkv's data pointer .* must be 16-byte aligned"):
        ops.block_attention_qkvpacked(ts.StubTensor((100, 3, 4, 64), ptr=0x7F0000000008), off)


# ---- grouped-query heads ---------------------------------------------------------

def test_grouped_heads_are_repeated_for_a_kernel_without_them(env):
    """k, v with kv_heads dividing q's heads, a kernel that takes the same
    heads only: each key head is repeated for its group before the launch,
    and the backward sums the per-query-head dk, dv over each group into
    k's and v's shape."""
    q, _, _, off = tensors(heads=8, grad=(False,) * 3)
    k, v = (ts.StubTensor((100, 2, 64), ptr=next(ts._ptrs)) for _ in range(2))
    kernel = ops.kernel_for(64, False, 64, "bf16", None, backward=True)
    out = kernel(q, k, v, off)
    dq, dk, dv = kernel.backward(q, k, v, dout_like(q), off)
    fwd, bwd = (c["args"] for c in env.launches.calls)
    assert fwd["heads"] == 8 and fwd["k"] not in (k.data_ptr(), 0)
    assert out.shape == q.shape and dq.shape == q.shape
    assert dk.shape == k.shape and dv.shape == v.shape
    base, dim = dk.summed_from
    assert dim == 2 and base.shape == (100, 2, 4, 64)
    assert base.viewed_from.data_ptr() == bwd["dk"] and base.viewed_from.shape == (100, 8, 64)


def test_grouped_heads_through_block_attention_and_autograd(env):
    """block_attention with 2 key heads for 8 query heads, inputs requiring
    grad: both passes launch with repeated key heads, and the gradients
    come back in k's and v's shape."""
    q, _, _, off = tensors(heads=8, grad=(True, False, False))
    k, v = (ts.StubTensor((100, 2, 64), ptr=next(ts._ptrs), requires_grad=True)
            for _ in range(2))
    out = ops.block_attention(q, k, v, off)
    dq, dk, dv, *rest = ts.run_backward(out, dout_like(out))
    assert env.launches.names() == ["ag_block_forward", "ag_block_backward"]
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert env.launches.calls[1]["args"]["heads"] == 8


def test_grouped_heads_in_place_for_a_kernel_that_takes_them(env):
    """A kernel that takes kv_heads: k and v reach the launches as they
    are, with kv_heads in both args structs; the backward's per-query-head
    dk, dv ([tokens, heads, head_dim]) are summed into k's and v's shape."""
    env.grouped = True
    q, _, _, off = tensors(heads=8, grad=(False,) * 3)
    k, v = (ts.StubTensor((100, 2, 64), ptr=next(ts._ptrs)) for _ in range(2))
    kernel = ops.kernel_for(64, False, 64, "bf16", None, backward=True)
    kernel(q, k, v, off)
    dq, dk, dv = kernel.backward(q, k, v, dout_like(q), off)
    fwd, bwd = (c["args"] for c in env.launches.calls)
    for a in (fwd, bwd):
        assert (a["k"], a["v"], a["heads"], a["kv_heads"]) == (k.data_ptr(), v.data_ptr(), 8, 2)
    base, _ = dk.summed_from
    assert dk.shape == k.shape and base.viewed_from.shape == (100, 8, 64)
    assert base.viewed_from.data_ptr() == bwd["dk"]
    # as many key heads as query heads: kv_heads left 0
    q2, k2, v2, off2 = tensors(grad=(False,) * 3)
    kernel(q2, k2, v2, off2)
    assert env.launches.calls[-1]["args"]["kv_heads"] == 0
