# SPDX-License-Identifier: BSD-3-Clause
"""CPU tests of attngen.jagged_attention: FlashAttention's window_size
mapped onto the spec (and the refusals), the spec text for each option
combination (and, when libattngen.so is built, what the C parser reads back
from it), argument validation, the ctypes mirrors of the jagged args
structs, and the wiring on the torch STUB (torch_stub.py): which kernel,
which pointers, sizes and stream reach ag_jagged_forward /
ag_jagged_backward, what autograd saves, which gradients come back. No
torch, no GPU.
"""
import ctypes
import itertools
import os
import re

import pytest

import attngen
import torch_stub as ts
from attngen import _errors, _lib, _spec, _validate, jagged, ops

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


# ---- window_size -> (causal, window) ------------------------------------------

@pytest.mark.parametrize("causal,window_size,expected", [
    (False, (-1, -1), (False, None)),
    (False, (0, 0), (False, (0, 0))),
    (False, (128, 32), (False, (128, 32))),
    (False, [7, 0], (False, (7, 0))),
    (False, (-1, 0), (True, None)),       # exactly the causal mask (torch varlen_attn's causal)
    (True, (-1, -1), (True, None)),
    (True, (-1, 0), (True, None)),
    (True, (256, -1), (True, (256, 0))),  # causal caps the right side
    (True, (256, 0), (True, (256, 0))),
    (True, (0, 0), (True, (0, 0))),
])
def test_window_mapping(causal, window_size, expected):
    assert _validate.check_window_size(window_size, causal) == expected


@pytest.mark.parametrize("causal,window_size", [
    (False, (-1, 5)), (False, (5, -1)), (False, (0, -1)), (False, (-1, 1)),
])
def test_window_one_side_unlimited_is_unsupported(causal, window_size):
    with pytest.raises(attngen.UnsupportedError, match="not supported"):
        _validate.check_window_size(window_size, causal)


@pytest.mark.parametrize("causal,window_size", [
    (True, (16, 1)), (True, (-1, 3)),                       # right > 0 under causal
    (False, (-2, 0)), (False, (0, -5)),                     # below -1
    (False, (1.5, 0)), (False, (True, 0)), (False, "ab"),   # not ints
    (False, (1, 2, 3)), (False, 5), (False, None),
])
def test_window_bad_values(causal, window_size):
    with pytest.raises(ValueError):
        _validate.check_window_size(window_size, causal)


def test_window_causal_must_be_bool():
    with pytest.raises(ValueError, match="causal"):
        _validate.check_window_size((-1, -1), 1)


# ---- spec text ------------------------------------------------------------------

def test_jagged_spec_text():
    assert attngen.dict_to_yaml(attngen.jagged_spec(128, "bf16")) == (
        "name: torch_jagged_d128_bf16\npattern: jagged\ncausal: false\nhead_dim: 128\n"
        "dtype: bf16\npasses: [forward]\n")
    assert attngen.dict_to_yaml(attngen.jagged_spec(64, "fp16", True, (256, 0), 0.05, True,
                                                    True)) == (
        "name: torch_jagged_d64_fp16_causal_w256_0_s0p_08678586\npattern: jagged\n"
        "causal: true\nwindow: [256, 0]\nhead_dim: 64\ndtype: fp16\nsoftmax_scale: 0.05\n"
        "deterministic: true\npasses: [forward, backward]\n")
    # past 48 characters: cut, with a hash of the whole name
    assert attngen.jagged_spec_name(64, "fp16", True, (256, 0), None, True, True) == \
        "torch_jagged_d64_fp16_causal_w256_0_det_grad"
    assert len(attngen.jagged_spec_name(64, "fp16", True, (256, 0), 0.05, True, True)) == 48
    with pytest.raises(ValueError):
        attngen.jagged_spec(64, "fp32")


_COMBOS = list(itertools.product(
    (64, 128), ("bf16", "fp16"), (False, True), (None, (0, 0), (64, 0), (32, 16)),
    (None, 0.125), (False, True), (False, True)))


def _valid(causal, window):
    return not (causal and window is not None and window[1] != 0)


def test_jagged_spec_every_combination():
    names = set()
    for d, dt, causal, window, scale, det, bwd in _COMBOS:
        if not _valid(causal, window):
            continue
        s = attngen.jagged_spec(d, dt, causal, window, scale, det, bwd)
        text = attngen.dict_to_yaml(s)
        assert "pattern: jagged\n" in text and "block_size" not in text
        assert ("causal: true\n" if causal else "causal: false\n") in text
        if window is not None:
            assert "window: [%d, %d]\n" % window in text
        assert ("window:" in text) == (window is not None)
        assert ("softmax_scale: 0.125\n" in text) == (scale is not None)
        assert ("softmax_scale" in text) == (scale is not None)
        assert ("deterministic: true\n" in text) == det
        assert "deterministic: false" not in text
        assert text.endswith("passes: [forward, backward]\n" if bwd else "passes: [forward]\n")
        assert re.fullmatch(r"[a-z][a-z0-9_]*", s["name"]) and len(s["name"]) <= 48
        names.add(s["name"])
    assert len(names) == sum(1 for c in _COMBOS if _valid(c[2], c[3]))  # all distinct


def _need_lib():
    try:
        _lib.lib()
    except attngen.LibraryNotFoundError as e:
        pytest.skip("libattngen.so not built: %s" % e)


def test_jagged_specs_through_the_c_parser():
    """Every spec jagged_attention may generate parses, and reads back as
    given (window, deterministic, passes, scale)."""
    _need_lib()
    for d, dt, causal, window, scale, det, bwd in _COMBOS:
        if not _valid(causal, window):
            continue
        _, info = attngen.parse_spec(attngen.jagged_spec(d, dt, causal, window, scale, det, bwd))
        assert info.pattern == "jagged"
        assert (info.head_dim, info.dtype, info.causal) == (d, dt, causal)
        assert info.window == window
        assert info.deterministic == det
        assert info.passes == (("forward", "backward") if bwd else ("forward",))
        assert info.softmax_scale == scale
        assert abs(info.scale - (scale or d ** -0.5)) < 1e-12


def test_bundled_jagged_specs_parse():
    _need_lib()
    _, info = attngen.parse_spec(os.path.join(REPO, "specs", "jagged_window_d64_fp16.yaml"))
    assert (info.pattern, info.causal, info.window, info.head_dim, info.dtype) == (
        "jagged", True, (256, 0), 64, "fp16")
    _, info = attngen.parse_spec(os.path.join(REPO, "specs", "gem_jagged_d128_causal.yaml"))
    assert info.passes == ("forward", "backward") and info.window is None


def test_the_c_parser_refuses_a_causal_window_with_a_right_side():
    """What check_window_size refuses up front is refused by the C parser too."""
    _need_lib()
    with pytest.raises(attngen.SpecError, match="right side must be 0"):
        attngen.parse_spec(attngen.jagged_spec(64, "bf16", True, (8, 4)))


# ---- ctypes mirrors ---------------------------------------------------------------

def _header_fields(struct):
    header = open(os.path.join(REPO, "include", "attngen.h")).read()
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (struct, struct), header, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if decl:
            for part in decl.split(","):
                names.append(re.search(r"\**\s*([A-Za-z_][A-Za-z0-9_]*)\s*$", part.strip()).group(1))
    return names


def test_jagged_args_field_order_is_the_headers():
    assert _header_fields("ag_jagged_fwd_args") == [f[0] for f in _lib.AgJaggedFwdArgs._fields_]
    assert _header_fields("ag_jagged_bwd_args") == [f[0] for f in _lib.AgJaggedBwdArgs._fields_]
    assert {"ag_jagged_fwd_args", "ag_jagged_bwd_args"} <= set(_lib.MIRRORS)


def test_jagged_args_layout_by_hand():
    """x86-64 / aarch64 LP64: every field is a pointer or an int64, 8 bytes,
    in order, no padding (test_ctypes_mirrors_match_the_c_header checks the
    same against a compiled probe of the header)."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        pytest.skip("not an LP64 platform")
    for cls, n in ((_lib.AgJaggedFwdArgs, 16), (_lib.AgJaggedBwdArgs, 21)):
        assert len(cls._fields_) == n
        assert ctypes.sizeof(cls) == 8 * n
        for i, f in enumerate(cls._fields_):
            assert getattr(cls, f[0]).offset == 8 * i, f[0]
    # ag_spec: `deterministic` and `row_strides` (bools) follow `arch`, `at`
    # has 14 ag_pos
    S = _lib.AgSpec
    assert S.deterministic.offset == S.arch.offset + 4
    assert S.row_strides.offset == S.deterministic.offset + 1
    assert S.at.offset == S.deterministic.offset + 4  # padded to ag_pos's int alignment
    assert ctypes.sizeof(_lib._AgSpecAt) == 14 * 8
    assert ctypes.sizeof(S) == 512


def test_jagged_prototypes_declared():
    for name in ("ag_jagged_forward", "ag_jagged_backward", "ag_jagged_backward_workspace_bytes"):
        assert name in _lib._PROTOTYPES
    _need_lib()
    if not _lib.has("ag_jagged_backward_workspace_bytes"):
        pytest.skip("this libattngen.so predates the jagged pattern")
    restype, argtypes = _lib._PROTOTYPES["ag_jagged_backward_workspace_bytes"]
    assert restype is ctypes.c_size_t
    assert argtypes == [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    # no kernel (NULL): 0, as the header says; needs no GPU
    assert jagged.workspace_bytes(None, 4, 1000) == 0


# ---- validation (stub tensors) -----------------------------------------------------

def jtensors(lq=(3, 0, 5), lk=None, heads=4, kv_heads=None, head_dim=64, dtype=ts.bfloat16,
             grad=(False, False, False)):
    lk = lq if lk is None else lk
    kv_heads = heads if kv_heads is None else kv_heads
    tq, tk = sum(lq), sum(lk)
    q = ts.StubTensor((tq, heads, head_dim), dtype, ptr=next(ts._ptrs), requires_grad=grad[0])
    k = ts.StubTensor((tk, kv_heads, head_dim), dtype, ptr=next(ts._ptrs), requires_grad=grad[1])
    v = ts.StubTensor((tk, kv_heads, head_dim), dtype, ptr=next(ts._ptrs), requires_grad=grad[2])

    def cu(lens):
        vals = [0]
        for n in lens:
            vals.append(vals[-1] + n)
        return ts.StubTensor((len(vals),), ts.int32, ptr=next(ts._ptrs), values=vals)

    return q, k, v, cu(lq), (None if lk is lq else cu(lk))


def _check(*args, **kw):
    return _validate.check_jagged_attention_args(*args, **kw)


def test_validation_accepts_gqa_and_cross_attention():
    q, k, v, cq, ck = jtensors(lq=(3, 0, 5), lk=(7, 1, 0), heads=8, kv_heads=2)
    a = _check(q, k, v, cq, ck)
    assert (a["total_q"], a["total_k"], a["heads"], a["kv_heads"], a["batch"]) == (8, 8, 8, 2, 3)
    assert a["cu_seqlens_k"] is ck and a["dtype_tag"] == "bf16" and a["window"] is None
    q, k, v, cq, _ = jtensors(dtype=ts.float16)
    a = _check(q, k, v, cq)
    assert a["cu_seqlens_k"] is cq and a["dtype_tag"] == "fp16"


@pytest.mark.parametrize("mutate,match", [
    (lambda t: t.update(q=ts.StubTensor((8, 4, 64), device="cpu")), "q must be a CUDA tensor"),
    (lambda t: t.update(k=ts.StubTensor((8, 4, 64), device="cuda:1")), "same device"),
    (lambda t: t.update(q=ts.StubTensor((8, 4, 64), ts.float32)), "bfloat16 or torch.float16"),
    (lambda t: t.update(v=ts.StubTensor((8, 4, 64), ts.float16)), "same dtype"),
    (lambda t: t.update(q=ts.StubTensor((8, 256))), "3-D"),
    (lambda t: t.update(v=ts.StubTensor((8, 2, 64))), "k and v must have the same shape"),
    (lambda t: t.update(q=ts.StubTensor((8, 4, 128))), "same head_dim"),
    (lambda t: t.update(q=ts.StubTensor((8, 4, 96)), k=ts.StubTensor((8, 4, 96)),
                        v=ts.StubTensor((8, 4, 96))), "64 or 128"),
    (lambda t: t.update(k=ts.StubTensor((8, 3, 64)), v=ts.StubTensor((8, 3, 64))),
     "must divide heads"),
    (lambda t: t.update(k=ts.StubTensor((8, 4, 64), contiguous=False)), "k must be contiguous"),
    (lambda t: t.update(q=ts.StubTensor((8, 4, 64), ptr=0x7F0000000002)), "aligned"),
    (lambda t: t.update(cq=ts.StubTensor((4,), ts.int64, values=[0, 3, 3, 8])), "int32"),
    (lambda t: t.update(cq=ts.StubTensor((4,), ts.int32, device="cpu", values=[0, 3, 3, 8])),
     "cu_seqlens_q must be on the same device"),
    (lambda t: t.update(cq=ts.StubTensor((2, 2), ts.int32)), "1-D"),
    (lambda t: t.update(cq=ts.StubTensor((0,), ts.int32)), "at least one"),
    (lambda t: t.update(ck=ts.StubTensor((3,), ts.int32, values=[0, 3, 8])), "same length"),
    (lambda t: t.update(ck=ts.StubTensor((4,), ts.int32, device="cuda:1")),
     "cu_seqlens_k must be on the same device"),
    (lambda t: t.update(k=ts.StubTensor((9, 4, 64)), v=ts.StubTensor((9, 4, 64))),
     "cu_seqlens_k is None"),
    (lambda t: t.update(q=[1, 2]), "q must be a torch.Tensor"),
])
def test_validation_refusals(mutate, match):
    q, k, v, cq, _ = jtensors()
    t = {"q": q, "k": k, "v": v, "cq": cq, "ck": None}
    mutate(t)
    with pytest.raises(ValueError, match=match):
        _check(t["q"], t["k"], t["v"], t["cq"], t["ck"])


def test_option_refusals():
    q, k, v, cq, _ = jtensors()
    with pytest.raises(attngen.UnsupportedError, match="dropout"):
        _check(q, k, v, cq, dropout_p=0.1)
    with pytest.raises(attngen.UnsupportedError, match="window_size"):
        _check(q, k, v, cq, window_size=(32, -1))
    with pytest.raises(ValueError, match="causal"):
        _check(q, k, v, cq, causal=True, window_size=(32, 8))
    with pytest.raises(ValueError, match="softmax_scale"):
        _check(q, k, v, cq, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="deterministic"):
        _check(q, k, v, cq, deterministic=1)
    assert isinstance(attngen.UnsupportedError("x"), NotImplementedError)


# ---- wiring on the torch stub --------------------------------------------------------

class Launches:
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


class FakeLib:
    @staticmethod
    def ag_jagged_backward_workspace_bytes(handle, heads, total_q):
        return 4 * heads * total_q


@pytest.fixture
def env(monkeypatch):
    torch = ts.FakeTorch(stream=0x5EED)
    launches = Launches()

    class Env:
        refuse_backward = False

    e = Env()
    e.torch, e.launches, e.parsed = torch, launches, []

    def parse_spec(spec):
        e.parsed.append(spec)
        if "backward" in spec["passes"] and e.refuse_backward:
            raise _errors.make_error(_errors.AG_ERR_UNSUPPORTED, "<dict>:9:1: error: nope",
                                     code_name="not supported yet")
        w = spec.get("window")
        r = spec.get("rotary")
        rotary = None if r is None else {
            "layout": r["layout"], "apply_to": tuple(r.get("apply_to", ("q", "k"))),
            "positions": r.get("positions", "table"), "base": r.get("base", 10000.0)}
        info = _spec.SpecInfo(
            name=spec["name"], source="<dict>", pattern=spec["pattern"], block_size=0,
            causal=spec["causal"], head_dim=spec["head_dim"], dtype=spec["dtype"],
            softmax_scale=spec.get("softmax_scale"), scale=spec["head_dim"] ** -0.5,
            passes=tuple(spec["passes"]), window=None if w is None else tuple(w),
            deterministic=spec.get("deterministic", False), rotary=rotary)
        return None, info

    def handle(self, device_index=None):
        return "handle:%s:%s" % (self.spec.name, device_index)

    monkeypatch.setattr(ops, "_torch", lambda: torch)
    monkeypatch.setattr(jagged, "_torch", lambda: torch)
    monkeypatch.setattr(jagged, "_autograd_cls", None)
    monkeypatch.setattr(jagged, "_kernels", {})
    monkeypatch.setattr(jagged, "_fast_kernels", {})
    monkeypatch.setattr(ops, "parse_spec", parse_spec)
    monkeypatch.setattr(ops.Kernel, "handle", handle)
    monkeypatch.setattr(_lib, "call", launches)
    monkeypatch.setattr(_lib, "has", lambda name: True)
    monkeypatch.setattr(_lib, "lib", lambda: FakeLib)
    yield e
    jagged._autograd_cls = None


def test_forward_no_grad(env):
    q, k, v, cq, _ = jtensors(lq=(3, 0, 5), heads=8, kv_heads=2)
    out = attngen.jagged_attention(q, k, v, cq, max_seqlen_q=5, max_seqlen_k=5, causal=True)
    assert out.shape == q.shape and out.grad_fn is None and out.data_ptr() != q.data_ptr()
    (call,) = env.launches.calls
    assert call["fn"] == "ag_jagged_forward"
    assert call["handle"] == "handle:torch_jagged_d64_bf16_causal:0"
    assert env.parsed[-1]["passes"] == ["forward"] and "deterministic" not in env.parsed[-1]
    a = call["args"]
    assert list(a) == [f[0] for f in _lib.AgJaggedFwdArgs._fields_]
    assert (a["q"], a["k"], a["v"], a["o"]) == (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                out.data_ptr())
    assert a["cu_seqlens_q"] == a["cu_seqlens_k"] == cq.data_ptr()  # self-attention
    assert (a["batch"], a["heads"], a["kv_heads"], a["total_q"], a["total_k"]) == (3, 8, 2, 8, 8)
    assert a["lse"] is not None and a["host_cu_seqlens_q"] is None and a["host_cu_seqlens_k"] is None
    assert a["rotary_table"] is None and a["rotary_table_k"] is None  # no rotary: no table
    assert call["stream"] == 0x5EED


def test_forward_return_lse_and_cross_attention(env):
    q, k, v, cq, ck = jtensors(lq=(3, 1), lk=(0, 6), head_dim=128, dtype=ts.float16)
    out, lse = attngen.jagged_attention(q, k, v, cq, ck, 3, 6, window_size=(4, 2),
                                        softmax_scale=0.1, deterministic=True, return_lse=True)
    assert lse.shape == (4, 4) and lse.dtype == ts.float32
    (call,) = env.launches.calls
    a = call["args"]
    assert a["lse"] == lse.data_ptr() and a["o"] == out.data_ptr()
    assert (a["cu_seqlens_q"], a["cu_seqlens_k"]) == (cq.data_ptr(), ck.data_ptr())
    assert (a["total_q"], a["total_k"], a["batch"]) == (4, 6, 2)
    spec = env.parsed[-1]
    assert spec["window"] == [4, 2] and spec["causal"] is False and spec["deterministic"] is True
    assert spec["softmax_scale"] == 0.1 and spec["dtype"] == "fp16" and spec["head_dim"] == 128


def test_torch_varlen_causal_window_becomes_causal(env):
    q, k, v, cq, _ = jtensors()
    attngen.jagged_attention(q, k, v, cq, window_size=(-1, 0))
    assert env.parsed[-1]["causal"] is True and "window" not in env.parsed[-1]
    attngen.jagged_attention(q, k, v, cq, causal=True, window_size=(16, -1))
    assert env.parsed[-1]["window"] == [16, 0]


def test_forward_and_backward(env):
    q, k, v, cq, ck = jtensors(lq=(3, 0, 5), lk=(2, 4, 1), heads=4, kv_heads=2,
                               grad=(True, True, True))
    out = attngen.jagged_attention(q, k, v, cq, ck, causal=True)
    (fwd,) = env.launches.calls
    assert fwd["handle"] == "handle:torch_jagged_d64_bf16_causal_grad:0"
    assert env.parsed[-1]["passes"] == ["forward", "backward"]
    ctx = out.grad_fn[1]
    lse_ptr = fwd["args"]["lse"]
    saved = ctx.saved_tensors
    assert saved[:4] == (q, k, v, out) and saved[5:] == (cq, ck, None, None)  # no tables
    assert saved[4].data_ptr() == lse_ptr and saved[4].shape == (4, 8)
    assert len(ctx.non_differentiable) == 1 and ctx.non_differentiable[0] is saved[4]
    dout = ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs))
    dq, dk, dv, *rest = ts.run_backward(out, dout)
    assert rest == [None] * 8
    fwd, bwd = env.launches.calls
    assert bwd["fn"] == "ag_jagged_backward" and bwd["handle"] == fwd["handle"]
    a = bwd["args"]
    assert list(a) == [f[0] for f in _lib.AgJaggedBwdArgs._fields_]
    assert (a["q"], a["k"], a["v"], a["o"], a["dout"], a["lse"]) == (
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(), lse_ptr)
    assert (a["dq"], a["dk"], a["dv"]) == (dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert a["workspace"] is not None
    assert len({a[n] for n in ("q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv",
                               "workspace")}) == 10
    assert (a["cu_seqlens_q"], a["cu_seqlens_k"]) == (cq.data_ptr(), ck.data_ptr())
    assert (a["batch"], a["heads"], a["kv_heads"], a["total_q"], a["total_k"]) == (3, 4, 2, 8, 7)
    assert a["rotary_table"] is None and a["rotary_table_k"] is None
    assert bwd["stream"] == 0x5EED


def test_only_requested_gradients(env):
    q, k, v, cq, _ = jtensors(grad=(False, True, False))
    out = attngen.jagged_attention(q, k, v, cq)
    dq, dk, dv = ts.run_backward(out, ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs)))[:3]
    assert dq is None and dk is not None and dv is None


def test_grad_mode_off_uses_the_forward_kernel(env):
    env.torch.grad_enabled = False
    q, k, v, cq, _ = jtensors(grad=(True, True, True))
    out = attngen.jagged_attention(q, k, v, cq)
    assert out.grad_fn is None and env.parsed[-1]["passes"] == ["forward"]


def test_dout_made_contiguous(env):
    q, k, v, cq, _ = jtensors(grad=(True, True, True))
    out = attngen.jagged_attention(q, k, v, cq)
    strided = ts.StubTensor(q.shape, q.dtype, contiguous=False, ptr=next(ts._ptrs))
    ts.run_backward(out, strided)
    assert env.launches.calls[-1]["args"]["dout"] != strided.data_ptr()


def test_backward_refusal_is_raised_at_backward(env):
    env.refuse_backward = True
    q, k, v, cq, _ = jtensors(grad=(True, True, True))
    out = attngen.jagged_attention(q, k, v, cq)
    assert env.launches.calls[0]["handle"] == "handle:torch_jagged_d64_bf16:0"
    with pytest.raises(attngen.UnsupportedError, match="jagged backward pass is not supported"):
        ts.run_backward(out, ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs)))


def test_empty_inputs_launch_nothing(env):
    # no queries at all
    q, k, v, cq, ck = jtensors(lq=(0, 0), lk=(3, 2), grad=(True, True, True))
    out, lse = attngen.jagged_attention(q, k, v, cq, ck, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    dq, dk, dv = ts.run_backward(out, ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs)))[:3]
    assert dk.fill == 0.0 and dv.fill == 0.0 and dk.shape == k.shape
    # no keys: output 0, lse -inf, no launch
    q, k, v, cq, ck = jtensors(lq=(2, 3), lk=(0, 0), grad=(True, True, True))
    out, lse = attngen.jagged_attention(q, k, v, cq, ck, return_lse=True)
    assert out.fill == 0.0 and lse.fill == float("-inf")
    dq = ts.run_backward(out, ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs)))[0]
    assert dq.fill == 0.0
    assert env.launches.calls == []


def test_poison(env):
    q, k, v, cq, _ = jtensors(grad=(True, True, True))
    out, lse = attngen.jagged_attention(q, k, v, cq, return_lse=True, _poison=True)
    assert str(out.fill) == "nan" and str(lse.fill) == "nan"
    for g in ts.run_backward(out, ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs)))[:3]:
        assert str(g.fill) == "nan"


def test_kernel_cache_reuses_kernels(env):
    q, k, v, cq, _ = jtensors()
    attngen.jagged_attention(q, k, v, cq, causal=True)
    attngen.jagged_attention(q, k, v, cq, causal=True, window_size=(-1, 0))
    attngen.jagged_attention(q, k, v, cq, window_size=(-1, 0))
    assert len(env.parsed) == 1  # the same spec, parsed once


def test_signature_is_flash_attn_varlen_funcs():
    import inspect
    params = list(inspect.signature(attngen.jagged_attention).parameters)
    assert params[:7] == ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                          "max_seqlen_k"]
    for name in ("causal", "window_size", "softmax_scale", "deterministic", "return_lse",
                 "rotary", "rotary_table", "rotary_table_k", "dropout_p"):
        assert name in params
    assert params.index("rotary_table_k") == params.index("rotary_table") + 1
    kinds = inspect.signature(attngen.jagged_attention).parameters
    assert kinds["rotary_table_k"].kind is inspect.Parameter.KEYWORD_ONLY
    assert kinds["rotary_table_k"].default is None
    assert "jagged_attention" in attngen.__all__


# ---- rotary embeddings ------------------------------------------------------------

HALF_QK_TABLE = {"layout": "half", "apply_to": ("q", "k"), "positions": "table", "base": None}


def test_jagged_spec_with_rotary_text():
    assert attngen.dict_to_yaml(attngen.jagged_spec(128, "bf16", True, backward=True,
                                                    rotary=HALF_QK_TABLE)) == (
        "name: torch_jagged_d128_bf16_causal_ropeh_qk_t_grad\npattern: jagged\ncausal: true\n"
        "head_dim: 128\ndtype: bf16\nrotary:\n  layout: half\n  apply_to: [q, k]\n"
        "  positions: table\npasses: [forward, backward]\n")
    seq = _validate.check_jagged_rotary({"layout": "interleaved", "positions": "sequence",
                                         "apply_to": ["v", "k", "q"], "base": 5e5})
    s = attngen.jagged_spec(64, "fp16", False, None, None, True, rotary=seq)
    assert s["rotary"] == {"layout": "interleaved", "apply_to": ["q", "k", "v"],
                           "positions": "sequence", "base": 500000.0}
    assert s["name"] == "torch_jagged_d64_fp16_ropei_qkv_s_b500000_det"
    assert list(s) == ["name", "pattern", "causal", "head_dim", "dtype", "deterministic",
                       "rotary", "passes"]
    # past 48 characters: cut, with a hash of the whole name
    long_name = attngen.jagged_spec(64, "fp16", False, (32, 0), None, True, rotary=seq)["name"]
    assert len(long_name) == 48 and long_name.startswith("torch_jagged_d64_fp16_w32_0_ropei_")
    # rotary is part of the name (the kernel cache keys on names), and absent without it
    assert attngen.jagged_spec(64, "bf16")["name"] != \
        attngen.jagged_spec(64, "bf16", rotary=HALF_QK_TABLE)["name"]
    assert "rotary" not in attngen.jagged_spec(64, "bf16")
    assert len(attngen.jagged_spec_name(64, "fp16", True, (256, 0), 0.05, True, True,
                                        rotary=seq)) == 48


def test_jagged_rotary_specs_through_the_c_parser():
    """Every rotary option jagged_attention takes makes a spec the C parser
    reads back as given, broadcast queries' too; positions 'block' it
    refuses (as the binding does up front)."""
    _need_lib()
    for layout in ("interleaved", "half"):
        for positions, base in (("table", None), ("sequence", 10000.0), ("sequence", 5e5)):
            rotary = _validate.check_jagged_rotary(
                {"layout": layout, "apply_to": ["v", "q"], "positions": positions,
                 **({} if base is None else {"base": base})})
            for bwd in (False, True):
                _, info = attngen.parse_spec(attngen.jagged_spec(64, "bf16", True,
                                                                 backward=bwd, rotary=rotary))
                assert info.pattern == "jagged"
                assert info.rotary == {"layout": layout, "apply_to": ("q", "v"),
                                       "positions": positions, "base": base or 10000.0}
    block = {"layout": "half", "apply_to": ("q", "k"), "positions": "block", "base": 1e4}
    with pytest.raises(attngen.SpecError, match="positions block applies only"):
        attngen.parse_spec(attngen.jagged_spec(64, "bf16", rotary=block))
    _, info = attngen.parse_spec(attngen.jagged_spec(64, "bf16", broadcast=True,
                                                     rotary=HALF_QK_TABLE))
    assert info.query == "broadcast" and info.rotary["layout"] == "half"
    k = attngen.jagged_kernel_for(128, "bf16", True, None, None, False, True,
                                  rotary={"layout": "half"})
    assert k.name == "torch_jagged_d128_bf16_causal_ropeh_qk_t_grad"
    assert k.spec.rotary["positions"] == "table" and k.spec.passes == ("forward", "backward")


def jtables(q, k, dtype=None, rows_q=None, rows_k=None):
    dim = q.shape[2]
    tq = ts.StubTensor((q.shape[0] if rows_q is None else rows_q, dim), dtype or q.dtype,
                       ptr=next(ts._ptrs))
    tk = ts.StubTensor((k.shape[0] if rows_k is None else rows_k, dim), dtype or q.dtype,
                       ptr=next(ts._ptrs))
    return tq, tk


def test_rotary_validation_accepts():
    # cross-attention: both tables
    q, k, v, cq, ck = jtensors(lq=(3, 0, 5), lk=(7, 1, 0), heads=4, kv_heads=2)
    tq, tk = jtables(q, k)
    a = _check(q, k, v, cq, ck, rotary={"layout": "half"}, rotary_table=tq, rotary_table_k=tk)
    assert a["rotary"] == HALF_QK_TABLE
    assert a["rotary_table"] is tq and a["rotary_table_k"] is tk
    # self-attention: the queries' table serves the keys
    q, k, v, cq, _ = jtensors(dtype=ts.float16)
    tq, _ = jtables(q, k)
    a = _check(q, k, v, cq, rotary="interleaved", rotary_table=tq)
    assert a["rotary"]["layout"] == "interleaved" and a["rotary_table_k"] is None
    # cross-attention with as many keys as queries: allowed (the caller's choice)
    q, k, v, cq, ck = jtensors(lq=(3, 5), lk=(5, 3))
    tq, _ = jtables(q, k)
    assert _check(q, k, v, cq, ck, rotary="half", rotary_table=tq)["rotary_table_k"] is None
    # computed positions: no table
    a = _check(q, k, v, cq, ck, rotary={"layout": "half", "positions": "sequence",
                                        "apply_to": ["k", "v"]})
    assert a["rotary"] == {"layout": "half", "apply_to": ("k", "v"), "positions": "sequence",
                           "base": 10000.0}
    assert a["rotary_table"] is None and a["rotary_table_k"] is None
    # no rotary
    a = _check(q, k, v, cq, ck)
    assert a["rotary"] is None and a["rotary_table"] is None and a["rotary_table_k"] is None
    # no tokens at all: the tables' alignment is not checked (no pointer is read)
    q, k, v, cq, ck = jtensors(lq=(0, 0), lk=(0, 0))
    tq = ts.StubTensor((0, 64), ptr=0x7F0000000002)
    _check(q, k, v, cq, ck, rotary="half", rotary_table=tq)


SEQ = {"layout": "half", "positions": "sequence"}


@pytest.mark.parametrize("kw,match", [
    (lambda tq, tk: dict(rotary={"layout": "half", "positions": "block"}),
     "positions 'block' apply only to the block-diagonal pattern"),
    (lambda tq, tk: dict(rotary={"layout": "half", "positions": "block"}, rotary_table=tq),
     "positions 'block'"),
    (lambda tq, tk: dict(rotary="half"), "need rotary_table=\\[total_q, head_dim\\]"),
    (lambda tq, tk: dict(rotary="half", rotary_table_k=tk), "need rotary_table="),
    (lambda tq, tk: dict(rotary="half", rotary_table=tq),
     "rotary_table_k is None .* k has 8 tokens and q 9"),
    (lambda tq, tk: dict(rotary=SEQ, rotary_table=tq, rotary_table_k=tk),
     "rotary_table is only taken with rotary positions 'table'"),
    (lambda tq, tk: dict(rotary=SEQ, rotary_table_k=tk),
     "rotary_table_k is only taken with rotary positions 'table'"),
    (lambda tq, tk: dict(rotary_table=tq), "rotary_table is only taken"),
    (lambda tq, tk: dict(rotary_table_k=tk), "rotary_table_k is only taken"),
    (lambda tq, tk: dict(rotary="half", rotary_table=tk, rotary_table_k=tk),
     r"rotary_table must be \[total_q, head_dim\] = \[9, 64\], got \[8, 64\]"),
    (lambda tq, tk: dict(rotary="half", rotary_table=tq, rotary_table_k=tq),
     r"rotary_table_k must be \[total_k, head_dim\] = \[8, 64\], got \[9, 64\]"),
    (lambda tq, tk: dict(rotary="half", rotary_table=tq,
                         rotary_table_k=ts.StubTensor((8, 64), ts.float16)),
     r"rotary_table_k must have q's dtype \(torch.bfloat16\)"),
    (lambda tq, tk: dict(rotary="half", rotary_table=ts.StubTensor((9, 64), ts.float32),
                         rotary_table_k=tk), "rotary_table must have q's dtype"),
    (lambda tq, tk: dict(rotary="half", rotary_table=tq,
                         rotary_table_k=ts.StubTensor((8, 64), device="cpu")),
     "rotary_table_k must be on the same device as q"),
    (lambda tq, tk: dict(rotary="half", rotary_table=ts.StubTensor((9, 64), device="cuda:1"),
                         rotary_table_k=tk), "rotary_table must be on the same device"),
    (lambda tq, tk: dict(rotary="half", rotary_table=tq,
                         rotary_table_k=ts.StubTensor((8, 64), contiguous=False)),
     "rotary_table_k must be contiguous"),
    (lambda tq, tk: dict(rotary="half", rotary_table=tq,
                         rotary_table_k=ts.StubTensor((8, 64), ptr=0x7F0000000008)),
     "rotary_table_k's data pointer .* 16-byte aligned"),
    (lambda tq, tk: dict(rotary="half", rotary_table=tq, rotary_table_k=[[0.0] * 64] * 8),
     "rotary_table_k must be a torch.Tensor"),
    (lambda tq, tk: dict(rotary={"layout": "diagonal"}), "layout must be 'interleaved' or"),
    (lambda tq, tk: dict(rotary={"layout": "half", "base": 1e4}, rotary_table=tq,
                         rotary_table_k=tk), "base applies only"),
    (lambda tq, tk: dict(rotary={"layout": "half", "apply_to": []}, rotary_table=tq,
                         rotary_table_k=tk), "non-empty"),
])
def test_rotary_validation_refusals(kw, match):
    q, k, v, cq, ck = jtensors(lq=(4, 5), lk=(6, 2))
    tq, tk = jtables(q, k)
    with pytest.raises(ValueError, match=match):
        _check(q, k, v, cq, ck, **kw(tq, tk))


def test_rotary_block_positions_refused_by_the_kernel_helpers_too():
    with pytest.raises(ValueError, match="positions 'block'"):
        attngen.jagged_kernel_for(64, "bf16", rotary={"layout": "half", "positions": "block"})
    with pytest.raises(ValueError, match="positions 'block'"):
        _validate.check_jagged_rotary({"layout": "interleaved", "positions": "block",
                                       "base": 500.0})
    assert _validate.check_jagged_rotary(None) is None


def test_rotary_tables_reach_both_passes(env):
    q, k, v, cq, ck = jtensors(lq=(3, 0, 5), lk=(2, 4, 1), heads=4, kv_heads=2,
                               grad=(True, True, True))
    tq, tk = jtables(q, k)
    out = attngen.jagged_attention(q, k, v, cq, ck, causal=True,
                                   rotary={"layout": "interleaved", "apply_to": ["k", "q", "v"]},
                                   rotary_table=tq, rotary_table_k=tk)
    spec = env.parsed[-1]
    assert spec["rotary"] == {"layout": "interleaved", "apply_to": ["q", "k", "v"],
                              "positions": "table"}
    assert spec["passes"] == ["forward", "backward"]
    assert spec["name"] == "torch_jagged_d64_bf16_causal_ropei_qkv_t_grad"
    (fwd,) = env.launches.calls
    assert fwd["handle"] == "handle:torch_jagged_d64_bf16_causal_ropei_qkv_t_grad:0"
    assert (fwd["args"]["rotary_table"], fwd["args"]["rotary_table_k"]) == (tq.data_ptr(),
                                                                            tk.data_ptr())
    saved = out.grad_fn[1].saved_tensors
    assert saved[:4] == (q, k, v, out) and saved[5:] == (cq, ck, tq, tk)
    dq, dk, dv, *rest = ts.run_backward(out, ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs)))
    # offsets, kernel, batch, poison, refusal; the two tables get no gradient
    assert rest == [None] * 8
    assert dq is not None and dk is not None and dv is not None
    fwd, bwd = env.launches.calls
    assert bwd["fn"] == "ag_jagged_backward" and bwd["handle"] == fwd["handle"]
    assert (bwd["args"]["rotary_table"], bwd["args"]["rotary_table_k"]) == (tq.data_ptr(),
                                                                            tk.data_ptr())
    assert (bwd["args"]["dq"], bwd["args"]["dk"]) == (dq.data_ptr(), dk.data_ptr())


def test_rotary_self_attention_one_table_without_grad(env):
    q, k, v, cq, _ = jtensors(lq=(3, 0, 5))
    tq, _ = jtables(q, k)
    out, lse = attngen.jagged_attention(q, k, v, cq, rotary="half", rotary_table=tq,
                                        return_lse=True)
    assert out.grad_fn is None
    spec = env.parsed[-1]
    assert spec["passes"] == ["forward"] and spec["rotary"]["positions"] == "table"
    (call,) = env.launches.calls
    assert call["handle"] == "handle:torch_jagged_d64_bf16_ropeh_qk_t:0"
    a = call["args"]
    assert list(a) == [f[0] for f in _lib.AgJaggedFwdArgs._fields_]
    # the keys' table left to the C default (the queries')
    assert a["rotary_table"] == tq.data_ptr() and a["rotary_table_k"] is None
    assert a["cu_seqlens_q"] == a["cu_seqlens_k"] == cq.data_ptr()


def test_rotary_computed_positions_take_no_table_and_key_the_cache(env):
    q, k, v, cq, ck = jtensors(lq=(3, 5), lk=(9, 1), grad=(True, False, False))
    seq = {"layout": "half", "positions": "sequence", "base": 5e5, "apply_to": ("q", "k", "v")}
    out = attngen.jagged_attention(q, k, v, cq, ck, rotary=seq)
    spec = env.parsed[-1]
    assert spec["rotary"] == {"layout": "half", "apply_to": ["q", "k", "v"],
                              "positions": "sequence", "base": 500000.0}
    assert spec["name"] == "torch_jagged_d64_bf16_ropeh_qkv_s_b500000_grad"
    dq = ts.run_backward(out, ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs)))[0]
    assert dq is not None
    for call in env.launches.calls:
        assert call["args"]["rotary_table"] is None and call["args"]["rotary_table_k"] is None
    # the same options written otherwise: the cached kernel
    attngen.jagged_attention(q, k, v, cq, ck, rotary={"layout": "half", "positions": "sequence",
                                                      "base": 500000, "apply_to": ["v", "k", "q"]})
    assert len(env.parsed) == 1
    # other rotary options, or none: other kernels
    attngen.jagged_attention(q, k, v, cq, ck, rotary={"layout": "half", "positions": "sequence"})
    attngen.jagged_attention(q, k, v, cq, ck)
    assert len(env.parsed) == 3
    assert env.parsed[1]["rotary"]["base"] == 10000.0 and "rotary" not in env.parsed[2]


def test_rotary_errors_launch_nothing(env):
    q, k, v, cq, ck = jtensors(lq=(3, 5), lk=(9, 1), grad=(True, True, True))
    tq, tk = jtables(q, k)
    with pytest.raises(ValueError, match="rotary_table_k is None"):
        attngen.jagged_attention(q, k, v, cq, ck, rotary="half", rotary_table=tq)
    with pytest.raises(ValueError, match="positions 'block'"):
        attngen.jagged_attention(q, k, v, cq, ck, rotary={"layout": "half",
                                                          "positions": "block"})
    with pytest.raises(ValueError, match="only taken with rotary positions 'table'"):
        attngen.jagged_attention(q, k, v, cq, ck, rotary=SEQ, rotary_table=tq,
                                 rotary_table_k=tk)
    assert env.launches.calls == [] and env.parsed == []


def test_broadcast_rotary_tables_checked_up_front():
    """broadcast_attention takes rotary embeddings (test_broadcast_cpu.py);
    its tables are checked before any kernel: the queries' is [n_q,
    head_dim], not jagged_attention's [total_q, head_dim]."""
    q = ts.StubTensor((4, 2, 64), ptr=next(ts._ptrs))
    k = ts.StubTensor((8, 2, 64), ptr=next(ts._ptrs))
    v = ts.StubTensor((8, 2, 64), ptr=next(ts._ptrs))
    ck = ts.StubTensor((3,), ts.int32, ptr=next(ts._ptrs), values=[0, 3, 8])
    with pytest.raises(attngen.InvalidArgumentError, match=r"\[n_q, head_dim\] = \[4, 64\]"):
        attngen.broadcast_attention(q, k, v, ck, rotary="half",
                                    rotary_table=ts.StubTensor((8, 64), ptr=next(ts._ptrs)),
                                    rotary_table_k=ts.StubTensor((8, 64), ptr=next(ts._ptrs)))


# ---- the eager fast path ----------------------------------------------------

def _count_full_checks(monkeypatch):
    seen = []
    full = jagged._validate.check_jagged_attention_args

    def counted(*a, **kw):
        seen.append(1)
        return full(*a, **kw)

    monkeypatch.setattr(jagged._validate, "check_jagged_attention_args", counted)
    return seen


def test_a_repeated_eager_jagged_call_takes_the_fast_path(env, monkeypatch):
    """The second call with the same options skips the option checks and
    the kernel lookup and launches what the first did (self and cross
    attention, return_lse both ways)."""
    seen = _count_full_checks(monkeypatch)
    q, k, v, cq, ck = jtensors(lq=(3, 1), lk=(0, 6), heads=4, kv_heads=2)
    kw = dict(causal=True, window_size=(8, 0), softmax_scale=0.25)
    out1, lse1 = attngen.jagged_attention(q, k, v, cq, ck, return_lse=True, **kw)
    out2 = attngen.jagged_attention(q, k, v, cq, ck, **kw)
    assert len(seen) == 1
    a, b = env.launches.calls
    assert a["handle"] == b["handle"] and b["stream"] == 0x5EED
    assert b["args"]["o"] == out2.data_ptr() and b["args"]["lse"] not in (None, lse1.data_ptr())
    for f in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "batch", "heads", "kv_heads",
              "total_q", "total_k", "rotary_table", "rotary_table_k"):
        assert a["args"][f] == b["args"][f], f
    # self-attention (cu_seqlens_k None) is its own fast call
    qs, ks, vs, cqs, _ = jtensors(lq=(3, 5), heads=4, kv_heads=2)
    attngen.jagged_attention(qs, ks, vs, cqs, **kw)
    out, lse = attngen.jagged_attention(qs, ks, vs, cqs, return_lse=True, **kw)
    assert len(seen) == 1  # the same options: already checked
    c = env.launches.calls[-1]["args"]
    assert c["cu_seqlens_q"] == c["cu_seqlens_k"] == cqs.data_ptr() and c["lse"] == lse.data_ptr()


@pytest.mark.parametrize("change", ["list window", "int causal", "cross without cu_k",
                                    "cu_k of another length", "requires grad", "rotary",
                                    "int deterministic"])
def test_the_jagged_fast_path_leaves_the_rest_to_the_full_one(env, monkeypatch, change):
    seen = _count_full_checks(monkeypatch)
    q, k, v, cq, ck = jtensors(lq=(3, 1), lk=(2, 6))
    attngen.jagged_attention(q, k, v, cq, ck)
    assert len(seen) == 1
    args, kw = [q, k, v, cq, ck], {}
    raises = None
    if change == "list window":
        kw["window_size"] = [-1, -1]
    elif change == "int causal":
        kw["causal"], raises = 1, ValueError
    elif change == "cross without cu_k":
        args, raises = args[:4], ValueError  # total_k 8 != total_q 4
    elif change == "cu_k of another length":
        args[4], raises = ts.offsets([0, 2, 6, 8]), ValueError
    elif change == "requires grad":
        args[0] = ts.StubTensor(q.shape, q.dtype, ptr=next(ts._ptrs), requires_grad=True)
    elif change == "rotary":
        kw["rotary"], raises = "half", ValueError  # positions table without a table
    elif change == "int deterministic":
        kw["deterministic"], raises = 1, ValueError
    if raises:
        with pytest.raises(raises):
            attngen.jagged_attention(*args, **kw)
    else:
        attngen.jagged_attention(*args, **kw)
    assert len(seen) == 2


@pytest.mark.parametrize("which", ["misaligned v", "k on the host", "fp16 v", "kv_heads 4",
                                   "k's head_dim 128", "v of another shape",
                                   "int64 cu_seqlens_k", "cu_seqlens_q on another device"])
def test_every_jagged_fast_check_sends_bad_tensors_to_the_full_path(env, monkeypatch, which):
    seen = _count_full_checks(monkeypatch)
    q, k, v, cq, ck = jtensors(lq=(3, 1), lk=(2, 6), heads=6, kv_heads=2)
    attngen.jagged_attention(q, k, v, cq, ck)
    attngen.jagged_attention(q, k, v, cq, ck)
    assert len(seen) == 1
    ks, kh = k.shape, k.shape[1]
    if which == "misaligned v":
        v = ts.StubTensor(ks, ptr=0x7F0000000004)
    elif which == "k on the host":
        k = ts.StubTensor(ks, ptr=next(ts._ptrs), device="cpu")
    elif which == "fp16 v":
        v = ts.StubTensor(ks, ts.float16, ptr=next(ts._ptrs))
    elif which == "kv_heads 4":
        k, v = (ts.StubTensor((ks[0], 4, 64), ptr=next(ts._ptrs)) for _ in range(2))
    elif which == "k's head_dim 128":
        k, v = (ts.StubTensor((ks[0], kh, 128), ptr=next(ts._ptrs)) for _ in range(2))
    elif which == "v of another shape":
        v = ts.StubTensor((ks[0] + 1, kh, 64), ptr=next(ts._ptrs))
    elif which == "int64 cu_seqlens_k":
        ck = ts.offsets([0, 2, 8], dtype=ts.int64)
    elif which == "cu_seqlens_q on another device":
        cq = ts.offsets([0, 3, 4], device="cuda:1")
    with pytest.raises(ValueError):
        attngen.jagged_attention(q, k, v, cq, ck)
    assert len(seen) == 2 and len(env.launches.calls) == 2


def test_views_are_copied_before_the_checks(env, monkeypatch):
    """A k that is not contiguous (a slice of one qkv projection, say) is
    copied before the full path's checks, which then pass: the launch reads
    the copy, as FlashAttention's varlen functions take such views."""
    seen = _count_full_checks(monkeypatch)
    q, k, v, cq, ck = jtensors(lq=(3, 1), lk=(2, 6), heads=6, kv_heads=2)
    view = ts.StubTensor(k.shape, ptr=next(ts._ptrs), contiguous=False)
    attngen.jagged_attention(q, view, v, cq, ck)
    assert len(seen) == 1
    (call,) = env.launches.calls
    assert call["args"]["k"] not in (view.data_ptr(), 0)
    assert call["args"]["q"] == q.data_ptr() and call["args"]["v"] == v.data_ptr()
