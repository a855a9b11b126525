# SPDX-License-Identifier: BSD-3-Clause
"""CPU tests of attngen.broadcast_attention (one dense Q shared by every
sequence over jagged K and V): the spec text for each option combination
(and, when libattngen.so is built, what the C parser reads back from it),
argument validation and its InvalidArgumentError messages, the ctypes
mirrors of the broadcast args structs, and the wiring on the torch STUB
(torch_stub.py): which kernel, which pointers, sizes and stream reach
ag_broadcast_forward / ag_broadcast_backward, the workspace asked of
ag_broadcast_backward_workspace_bytes, what autograd saves, which gradients
come back. No torch, no GPU.
"""
import ctypes
import itertools
import os
import re

import pytest

import attngen
import torch_stub as ts
from attngen import _errors, _lib, _spec, _validate, broadcast, ops

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


# ---- spec text ------------------------------------------------------------------

def test_broadcast_spec_text():
    assert attngen.dict_to_yaml(attngen.jagged_spec(128, "bf16", broadcast=True)) == (
        "name: torch_broadcast_d128_bf16\npattern: jagged\nquery: broadcast\ncausal: false\n"
        "head_dim: 128\ndtype: bf16\npasses: [forward]\n")
    assert attngen.dict_to_yaml(attngen.jagged_spec(64, "fp16", True, (256, 0), None, True, True,
                                                    broadcast=True)) == (
        "name: torch_broadcast_d64_fp16_causal_w256_0_det_grad\npattern: jagged\n"
        "query: broadcast\ncausal: true\nwindow: [256, 0]\nhead_dim: 64\ndtype: fp16\n"
        "deterministic: true\npasses: [forward, backward]\n")
    assert attngen.dict_to_yaml(attngen.jagged_spec(128, "bf16", False, (32, 7), 0.125,
                                                    broadcast=True)) == (
        "name: torch_broadcast_d128_bf16_w32_7_s0p125\npattern: jagged\nquery: broadcast\n"
        "causal: false\nwindow: [32, 7]\nhead_dim: 128\ndtype: bf16\nsoftmax_scale: 0.125\n"
        "passes: [forward]\n")
    # past 48 characters: cut, with a hash of the whole name
    name = attngen.jagged_spec_name(64, "fp16", True, (256, 0), 0.05, True, True, broadcast=True)
    assert name == "torch_broadcast_d64_fp16_causal_w256_0__e753bb83" and len(name) == 48
    # the per-sequence spec is unchanged by the new argument
    assert attngen.jagged_spec(128, "bf16", broadcast=False) == attngen.jagged_spec(128, "bf16")
    assert "query" not in attngen.jagged_spec(128, "bf16")
    with pytest.raises(ValueError):
        attngen.jagged_spec(64, "fp32", broadcast=True)


_COMBOS = list(itertools.product(
    (64, 128), ("bf16", "fp16"), (False, True), (None, (0, 0), (64, 0), (32, 16)),
    (None, 0.125), (False, True), (False, True)))


def _valid(causal, window):
    return not (causal and window is not None and window[1] != 0)


def test_broadcast_spec_every_combination():
    names = set()
    for d, dt, causal, window, scale, det, bwd in _COMBOS:
        if not _valid(causal, window):
            continue
        s = attngen.jagged_spec(d, dt, causal, window, scale, det, bwd, broadcast=True)
        text = attngen.dict_to_yaml(s)
        assert text.startswith("name: torch_broadcast_d%d_%s" % (d, dt))
        assert "pattern: jagged\nquery: broadcast\n" in text and "block_size" not in text
        assert ("causal: true\n" if causal else "causal: false\n") in text
        assert ("window: [%d, %d]\n" % window in text) if window else "window:" not in text
        assert ("softmax_scale" in text) == (scale is not None)
        assert ("deterministic: true\n" in text) == det and "deterministic: false" not in text
        assert text.endswith("passes: [forward, backward]\n" if bwd else "passes: [forward]\n")
        assert re.fullmatch(r"[a-z][a-z0-9_]*", s["name"]) and len(s["name"]) <= 48
        # never the name of a per-sequence jagged spec (the kernel caches key on names)
        assert s["name"] != attngen.jagged_spec(d, dt, causal, window, scale, det, bwd)["name"]
        names.add(s["name"])
    assert len(names) == sum(1 for c in _COMBOS if _valid(c[2], c[3]))  # all distinct


def _need_lib():
    try:
        _lib.lib()
    except attngen.LibraryNotFoundError as e:
        pytest.skip("libattngen.so not built: %s" % e)


def test_broadcast_specs_through_the_c_parser():
    """Every spec broadcast_attention may generate parses (no 'not supported
    yet'), and reads back as given, with query broadcast."""
    _need_lib()
    for d, dt, causal, window, scale, det, bwd in _COMBOS:
        if not _valid(causal, window):
            continue
        _, info = attngen.parse_spec(attngen.jagged_spec(d, dt, causal, window, scale, det, bwd,
                                                         broadcast=True))
        assert (info.pattern, info.query) == ("jagged", "broadcast")
        assert (info.head_dim, info.dtype, info.causal) == (d, dt, causal)
        assert info.window == window and info.deterministic == det
        assert info.passes == (("forward", "backward") if bwd else ("forward",))
        assert info.softmax_scale == scale
        assert "query='broadcast'" in repr(info)
    _, info = attngen.parse_spec(attngen.jagged_spec(128, "bf16"))
    assert info.query == "per_sequence" and "query" not in repr(info)


def test_bundled_broadcast_spec_parses():
    _need_lib()
    _, info = attngen.parse_spec(os.path.join(REPO, "specs", "pma_broadcast_d128.yaml"))
    assert (info.pattern, info.query, info.head_dim, info.dtype, info.passes) == (
        "jagged", "broadcast", 128, "bf16", ("forward", "backward"))


def test_the_c_parser_refuses_broadcast_on_blocks():
    _need_lib()
    spec = attngen.block_spec(64, 128, "bf16")
    spec["query"] = "broadcast"
    with pytest.raises(attngen.SpecError, match="broadcast applies only to pattern jagged"):
        attngen.parse_spec(spec)


# ---- ctypes mirrors ---------------------------------------------------------------

def _header_fields(struct):
    header = open(os.path.join(REPO, "include", "attngen.h")).read()
    m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (struct, struct), header, re.S)
    if m is None:
        pytest.skip("include/attngen.h has no %s" % struct)
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if decl:
            for part in decl.split(","):
                names.append(re.search(r"\**\s*([A-Za-z_][A-Za-z0-9_]*)\s*$", part.strip()).group(1))
    return names


def test_broadcast_args_field_order_is_the_headers():
    assert _header_fields("ag_broadcast_fwd_args") == \
        [f[0] for f in _lib.AgBroadcastFwdArgs._fields_]
    assert _header_fields("ag_broadcast_bwd_args") == \
        [f[0] for f in _lib.AgBroadcastBwdArgs._fields_]
    assert _lib.MIRRORS["ag_broadcast_fwd_args"] is _lib.AgBroadcastFwdArgs
    assert _lib.MIRRORS["ag_broadcast_bwd_args"] is _lib.AgBroadcastBwdArgs


def test_broadcast_args_layout_by_hand():
    """LP64: every field a pointer or an int64, 8 bytes, in order, no
    padding (test_ctypes_mirrors_match_the_c_header checks the same against
    a compiled probe of the header)."""
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        pytest.skip("not an LP64 platform")
    for cls, n in ((_lib.AgBroadcastFwdArgs, 14), (_lib.AgBroadcastBwdArgs, 19)):
        assert len(cls._fields_) == n
        assert ctypes.sizeof(cls) == 8 * n
        for i, f in enumerate(cls._fields_):
            assert getattr(cls, f[0]).offset == 8 * i, f[0]


def test_broadcast_prototypes_declared():
    for name in ("ag_broadcast_forward", "ag_broadcast_backward",
                 "ag_broadcast_backward_workspace_bytes"):
        assert name in _lib._PROTOTYPES
    restype, argtypes = _lib._PROTOTYPES["ag_broadcast_backward_workspace_bytes"]
    assert restype is ctypes.c_size_t
    assert argtypes == [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    _need_lib()
    if not _lib.has("ag_broadcast_backward_workspace_bytes"):
        pytest.skip("this libattngen.so predates broadcast-Q attention")
    # no kernel (NULL): 0, as the header says; needs no GPU
    assert broadcast.workspace_bytes(None, 4, 16, 8) == 0


# ---- validation (stub tensors) -----------------------------------------------------

def btensors(n_q=16, lk=(3, 0, 5, 1), heads=4, kv_heads=None, head_dim=64, dtype=ts.bfloat16,
             grad=(False, False, False)):
    kv_heads = heads if kv_heads is None else kv_heads
    tk = sum(lk)
    q = ts.StubTensor((n_q, heads, head_dim), dtype, ptr=next(ts._ptrs), requires_grad=grad[0])
    k = ts.StubTensor((tk, kv_heads, head_dim), dtype, ptr=next(ts._ptrs), requires_grad=grad[1])
    v = ts.StubTensor((tk, kv_heads, head_dim), dtype, ptr=next(ts._ptrs), requires_grad=grad[2])
    vals = [0]
    for n in lk:
        vals.append(vals[-1] + n)
    ck = ts.StubTensor((len(vals),), ts.int32, ptr=next(ts._ptrs), values=vals)
    return q, k, v, ck


def _check(*args, **kw):
    return _validate.check_broadcast_attention_args(*args, **kw)


def test_validation_accepts_gqa():
    q, k, v, ck = btensors(n_q=200, lk=(7, 1, 0), heads=8, kv_heads=2)
    a = _check(q, k, v, ck)
    assert (a["n_q"], a["total_k"], a["heads"], a["kv_heads"], a["batch"], a["rows"]) == (
        200, 8, 8, 2, 3, 600)
    assert a["dtype_tag"] == "bf16" and a["window"] is None and a["causal"] is False
    assert a["head_dim"] == 64 and a["deterministic"] is False
    q, k, v, ck = btensors(n_q=1, head_dim=128, dtype=ts.float16)
    a = _check(q, k, v, ck, causal=True, window_size=(16, -1), softmax_scale=0.5,
               deterministic=True)
    assert (a["dtype_tag"], a["head_dim"], a["causal"], a["window"]) == ("fp16", 128, True, (16, 0))
    assert a["softmax_scale"] == 0.5 and a["deterministic"] is True
    # q's rows are independent of the keys': n_q 0 and no keys at all are fine
    q, k, v, ck = btensors(n_q=0, lk=(0, 0))
    assert _check(q, k, v, ck)["rows"] == 0


@pytest.mark.parametrize("mutate,match", [
    (lambda t: t.update(q=ts.StubTensor((16, 4, 64), device="cpu")), "q must be a CUDA tensor"),
    (lambda t: t.update(k=ts.StubTensor((9, 4, 64), device="cuda:1")), "same device"),
    (lambda t: t.update(q=ts.StubTensor((16, 4, 64), ts.float32)), "bfloat16 or torch.float16"),
    (lambda t: t.update(v=ts.StubTensor((9, 4, 64), ts.float16)), "same dtype"),
    (lambda t: t.update(q=ts.StubTensor((16, 256))), r"q must be 3-D \[n_q, heads, head_dim\]"),
    (lambda t: t.update(q=ts.StubTensor((2, 16, 4, 64))), "3-D"),
    (lambda t: t.update(k=ts.StubTensor((9, 256))), r"k must be 3-D \[total_k, kv_heads"),
    (lambda t: t.update(v=ts.StubTensor((9, 2, 64))), "k and v must have the same shape"),
    (lambda t: t.update(q=ts.StubTensor((16, 4, 128))), "same head_dim"),
    (lambda t: t.update(q=ts.StubTensor((16, 4, 96)), k=ts.StubTensor((9, 4, 96)),
                        v=ts.StubTensor((9, 4, 96))), "64 or 128"),
    (lambda t: t.update(k=ts.StubTensor((9, 3, 64)), v=ts.StubTensor((9, 3, 64))),
     "must divide heads"),
    (lambda t: t.update(q=ts.StubTensor((16, 0, 64))), "heads"),
    (lambda t: t.update(q=ts.StubTensor((16, 4, 64), contiguous=False)), "q must be contiguous"),
    (lambda t: t.update(v=ts.StubTensor((9, 4, 64), contiguous=False)), "v must be contiguous"),
    (lambda t: t.update(q=ts.StubTensor((16, 4, 64), ptr=0x7F0000000002)), "aligned"),
    (lambda t: t.update(ck=ts.StubTensor((5,), ts.int64, values=[0, 3, 3, 8, 9])), "int32"),
    (lambda t: t.update(ck=ts.StubTensor((5,), ts.int32, device="cpu", values=[0, 3, 3, 8, 9])),
     "cu_seqlens_k must be on the same device"),
    (lambda t: t.update(ck=ts.StubTensor((2, 2), ts.int32)), "1-D"),
    (lambda t: t.update(ck=ts.StubTensor((0,), ts.int32)), "at least one"),
    (lambda t: t.update(ck=ts.StubTensor((5,), ts.int32, contiguous=False)), "contiguous"),
    (lambda t: t.update(ck=None), "cu_seqlens_k must be a torch.Tensor"),
    (lambda t: t.update(q=[1, 2]), "q must be a torch.Tensor"),
])
def test_validation_refusals(mutate, match):
    q, k, v, ck = btensors()
    t = {"q": q, "k": k, "v": v, "ck": ck}
    mutate(t)
    with pytest.raises(attngen.InvalidArgumentError, match=match) as info:
        _check(t["q"], t["k"], t["v"], t["ck"])
    assert isinstance(info.value, ValueError)
    assert info.value.code == _errors.AG_ERR_INVALID_ARGUMENT


def test_output_rows_must_fit_int32():
    q, k, v, ck = btensors(n_q=1 << 16, lk=(1,) * ((1 << 15) - 1))
    assert _check(q, k, v, ck)["rows"] == 2 ** 31 - (1 << 16)
    q, k, v, ck = btensors(n_q=1 << 16, lk=(1,) * (1 << 15))
    with pytest.raises(attngen.InvalidArgumentError, match=r"batch \* n_q .* 2\^31 - 1"):
        _check(q, k, v, ck)


def test_option_refusals():
    q, k, v, ck = btensors()
    with pytest.raises(attngen.InvalidArgumentError, match=r"need rotary_table=\[n_q, head_dim\]"):
        _check(q, k, v, ck, rotary="interleaved")
    with pytest.raises(attngen.InvalidArgumentError, match="only taken with rotary positions"):
        _check(q, k, v, ck, rotary_table=ts.StubTensor((16, 64)))
    with pytest.raises(attngen.InvalidArgumentError, match="positions 'block'"):
        _check(q, k, v, ck, rotary={"layout": "half", "positions": "block"})
    with pytest.raises(attngen.UnsupportedError, match="window_size"):
        _check(q, k, v, ck, window_size=(32, -1))
    with pytest.raises(attngen.InvalidArgumentError, match="causal"):
        _check(q, k, v, ck, causal=True, window_size=(32, 8))
    with pytest.raises(attngen.InvalidArgumentError, match="causal must be True or False"):
        _check(q, k, v, ck, causal=1)
    with pytest.raises(attngen.InvalidArgumentError, match="window_size must be a pair"):
        _check(q, k, v, ck, window_size=5)
    with pytest.raises(attngen.InvalidArgumentError, match="-1 .unlimited. or >= 0"):
        _check(q, k, v, ck, window_size=(-2, 0))
    with pytest.raises(attngen.InvalidArgumentError, match="softmax_scale"):
        _check(q, k, v, ck, softmax_scale=-1.0)
    with pytest.raises(attngen.InvalidArgumentError, match="deterministic"):
        _check(q, k, v, ck, deterministic=1)


def _table(rows, head_dim=64, dtype=ts.bfloat16):
    return ts.StubTensor((rows, head_dim), dtype, ptr=next(ts._ptrs))


def test_rotary_tables_validation():
    """With positions "table": the queries' table [n_q, head_dim] where q is
    rotated, the keys' [total_k, head_dim] where k or v is, and no other;
    computed positions take none."""
    q, k, v, ck = btensors(n_q=16, lk=(3, 0, 5, 1))
    a = _check(q, k, v, ck, rotary="half", rotary_table=_table(16), rotary_table_k=_table(9))
    assert a["rotary"]["layout"] == "half" and a["rotary"]["positions"] == "table"
    assert a["rotary"]["apply_to"] == ("q", "k")
    with pytest.raises(attngen.InvalidArgumentError, match=r"need rotary_table_k=\[total_k"):
        _check(q, k, v, ck, rotary="half", rotary_table=_table(16))
    with pytest.raises(attngen.InvalidArgumentError,
                       match=r"rotary_table must be \[n_q, head_dim\] = \[16, 64\]"):
        _check(q, k, v, ck, rotary="half", rotary_table=_table(9), rotary_table_k=_table(9))
    with pytest.raises(attngen.InvalidArgumentError,
                       match=r"rotary_table_k must be \[total_k, head_dim\] = \[9, 64\]"):
        _check(q, k, v, ck, rotary="half", rotary_table=_table(16), rotary_table_k=_table(16))
    with pytest.raises(attngen.InvalidArgumentError, match="q's dtype"):
        _check(q, k, v, ck, rotary="half", rotary_table=_table(16, dtype=ts.float16),
               rotary_table_k=_table(9))
    keys = {"layout": "interleaved", "apply_to": ["k"]}
    assert _check(q, k, v, ck, rotary=keys, rotary_table_k=_table(9))["rotary"]["apply_to"] == \
        ("k",)
    with pytest.raises(attngen.InvalidArgumentError, match="rotary_table is not read"):
        _check(q, k, v, ck, rotary=keys, rotary_table=_table(16), rotary_table_k=_table(9))
    seq = {"layout": "half", "positions": "sequence", "apply_to": ["q", "k", "v"]}
    assert _check(q, k, v, ck, rotary=seq)["rotary"]["base"] == 10000.0
    with pytest.raises(attngen.InvalidArgumentError, match="only taken with rotary positions"):
        _check(q, k, v, ck, rotary=seq, rotary_table_k=_table(9))


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


class FakeLib:
    workspace_calls = []
    workspace_answer = None  # None: a made-up size from the arguments

    @classmethod
    def ag_broadcast_backward_workspace_bytes(cls, handle, batch, n_q, heads):
        cls.workspace_calls.append((handle, batch, n_q, heads))
        if cls.workspace_answer is not None:
            return cls.workspace_answer
        return 4 * (heads * batch * n_q + 7 * n_q * heads * 64)


@pytest.fixture
def env(monkeypatch):
    torch = ts.FakeTorch(stream=0x5EED)
    launches = Launches()

    class Env:
        refuse_backward = False
        missing = ()

    e = Env()
    e.torch, e.launches, e.parsed = torch, launches, []

    def parse_spec(spec):
        e.parsed.append(spec)
        if "backward" in spec["passes"] and e.refuse_backward:
            raise _errors.make_error(_errors.AG_ERR_UNSUPPORTED, "<dict>:9:1: error: nope",
                                     code_name="not supported yet")
        w = spec.get("window")
        info = _spec.SpecInfo(
            name=spec["name"], source="<dict>", pattern=spec["pattern"], block_size=0,
            causal=spec["causal"], head_dim=spec["head_dim"], dtype=spec["dtype"],
            softmax_scale=spec.get("softmax_scale"), scale=spec["head_dim"] ** -0.5,
            passes=tuple(spec["passes"]), window=None if w is None else tuple(w),
            deterministic=spec.get("deterministic", False),
            query=spec.get("query", "per_sequence"))
        return None, info

    def handle(self, device_index=None):
        return "handle:%s:%s" % (self.spec.name, device_index)

    FakeLib.workspace_calls = []
    FakeLib.workspace_answer = None
    monkeypatch.setattr(ops, "_torch", lambda: torch)
    monkeypatch.setattr(broadcast, "_torch", lambda: torch)
    monkeypatch.setattr(broadcast, "_autograd_cls", None)
    monkeypatch.setattr(broadcast, "_kernels", {})
    monkeypatch.setattr(ops, "parse_spec", parse_spec)
    monkeypatch.setattr(ops.Kernel, "handle", handle)
    monkeypatch.setattr(_lib, "call", launches)
    monkeypatch.setattr(_lib, "has", lambda name: name not in e.missing)
    monkeypatch.setattr(_lib, "lib", lambda: FakeLib)
    yield e
    broadcast._autograd_cls = None


def test_forward_no_grad(env):
    q, k, v, ck = btensors(n_q=16, lk=(3, 0, 5, 1), heads=8, kv_heads=2)
    out = attngen.broadcast_attention(q, k, v, ck, max_seqlen_k=5, causal=True)
    assert out.shape == (4 * 16, 8, 64) and out.dtype == q.dtype and out.grad_fn is None
    assert out.data_ptr() != q.data_ptr()
    (call,) = env.launches.calls
    assert call["fn"] == "ag_broadcast_forward"
    assert call["handle"] == "handle:torch_broadcast_d64_bf16_causal:0"
    spec = env.parsed[-1]
    assert spec["query"] == "broadcast" and spec["pattern"] == "jagged"
    assert spec["passes"] == ["forward"] and "deterministic" not in spec
    a = call["args"]
    assert list(a) == [f[0] for f in _lib.AgBroadcastFwdArgs._fields_]
    assert (a["q"], a["k"], a["v"], a["o"]) == (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                out.data_ptr())
    assert a["cu_seqlens_k"] == ck.data_ptr()
    assert (a["batch"], a["n_q"], a["heads"], a["kv_heads"], a["total_k"]) == (4, 16, 8, 2, 9)
    assert a["lse"] is not None and a["host_cu_seqlens_k"] is None
    assert call["stream"] == 0x5EED
    assert "broadcast forward" in call["context"][0] % call["context"][1:]


def test_forward_return_lse_and_options(env):
    q, k, v, ck = btensors(n_q=5, lk=(0, 6), head_dim=128, dtype=ts.float16)
    out, lse = attngen.broadcast_attention(q, k, v, ck, window_size=(4, 2), softmax_scale=0.1,
                                           deterministic=True, return_lse=True)
    assert out.shape == (10, 4, 128) and out.dtype == ts.float16
    assert lse.shape == (4, 10) and lse.dtype == ts.float32
    (call,) = env.launches.calls
    a = call["args"]
    assert a["lse"] == lse.data_ptr() and a["o"] == out.data_ptr()
    assert (a["n_q"], a["total_k"], a["batch"]) == (5, 6, 2)
    spec = env.parsed[-1]
    assert spec["window"] == [4, 2] and spec["causal"] is False and spec["deterministic"] is True
    assert spec["softmax_scale"] == 0.1 and spec["dtype"] == "fp16" and spec["head_dim"] == 128
    assert spec["name"] == "torch_broadcast_d128_fp16_w4_2_s0p1_det"


def test_torch_varlen_causal_window_becomes_causal(env):
    q, k, v, ck = btensors()
    attngen.broadcast_attention(q, k, v, ck, window_size=(-1, 0))
    assert env.parsed[-1]["causal"] is True and "window" not in env.parsed[-1]
    attngen.broadcast_attention(q, k, v, ck, causal=True, window_size=(16, -1))
    assert env.parsed[-1]["window"] == [16, 0]


def test_forward_and_backward(env):
    q, k, v, ck = btensors(n_q=16, lk=(2, 0, 4, 1), heads=4, kv_heads=2,
                           grad=(True, True, True))
    out = attngen.broadcast_attention(q, k, v, ck, causal=True)
    (fwd,) = env.launches.calls
    assert fwd["handle"] == "handle:torch_broadcast_d64_bf16_causal_grad:0"
    assert env.parsed[-1]["passes"] == ["forward", "backward"]
    ctx = out.grad_fn[1]
    lse_ptr = fwd["args"]["lse"]
    saved = ctx.saved_tensors
    assert saved[:4] == (q, k, v, out) and saved[5] is ck
    assert saved[4].data_ptr() == lse_ptr and saved[4].shape == (4, 64)
    assert len(ctx.non_differentiable) == 1 and ctx.non_differentiable[0] is saved[4]
    dout = ts.StubTensor(out.shape, out.dtype, ptr=next(ts._ptrs))
    dq, dk, dv, *rest = ts.run_backward(out, dout)
    assert rest == [None] * 7
    fwd, bwd = env.launches.calls
    assert bwd["fn"] == "ag_broadcast_backward" and bwd["handle"] == fwd["handle"]
    a = bwd["args"]
    assert list(a) == [f[0] for f in _lib.AgBroadcastBwdArgs._fields_]
    assert (a["q"], a["k"], a["v"], a["o"], a["dout"], a["lse"]) == (
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(), lse_ptr)
    assert (a["dq"], a["dk"], a["dv"]) == (dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
    # dq is q's shape: the sum over the batch, never an expanded [batch * n_q, ...]
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert a["workspace"] is not None
    assert len({a[n] for n in ("q", "k", "v", "o", "dout", "lse", "dq", "dk", "dv",
                               "workspace")}) == 10
    assert a["cu_seqlens_k"] == ck.data_ptr() and a["host_cu_seqlens_k"] is None
    assert (a["batch"], a["n_q"], a["heads"], a["kv_heads"], a["total_k"]) == (4, 16, 4, 2, 7)
    assert bwd["stream"] == 0x5EED
    # the workspace is the library's answer for this kernel and these sizes
    assert FakeLib.workspace_calls == [(fwd["handle"], 4, 16, 4)]


def test_rotary_forward_and_backward(env):
    """rotary: the spec's rotary mapping, the tables in both launches' args
    (the keys' alone where q is not rotated), saved for the backward, and
    a kernel of its own in the cache."""
    q, k, v, ck = btensors(n_q=16, lk=(2, 0, 4, 1), heads=4, grad=(True, True, True))
    tq, tk = _table(16), _table(7)
    out = attngen.broadcast_attention(q, k, v, ck, rotary="interleaved", rotary_table=tq,
                                      rotary_table_k=tk)
    spec = env.parsed[-1]
    assert spec["rotary"] == {"layout": "interleaved", "apply_to": ["q", "k"],
                              "positions": "table"}
    assert spec["query"] == "broadcast" and spec["passes"] == ["forward", "backward"]
    (fwd,) = env.launches.calls
    assert (fwd["args"]["rotary_table"], fwd["args"]["rotary_table_k"]) == (
        tq.data_ptr(), tk.data_ptr())
    dout = ts.StubTensor(out.shape, out.dtype, ptr=next(ts._ptrs))
    dq, dk, dv, *rest = ts.run_backward(out, dout)
    assert rest == [None] * 7 and dq.shape == q.shape
    _, bwd = env.launches.calls
    assert bwd["handle"] == fwd["handle"]
    assert (bwd["args"]["rotary_table"], bwd["args"]["rotary_table_k"]) == (
        tq.data_ptr(), tk.data_ptr())
    # keys alone, computed positions: no table; another kernel
    q, k, v, ck = btensors(n_q=16, lk=(2, 0, 4, 1), heads=4)
    attngen.broadcast_attention(q, k, v, ck, rotary={"layout": "half", "apply_to": ["k"],
                                                     "positions": "sequence"})
    call = env.launches.calls[-1]
    assert call["args"]["rotary_table"] is None and call["args"]["rotary_table_k"] is None
    assert env.parsed[-1]["rotary"]["positions"] == "sequence"
    assert call["handle"] != fwd["handle"]
    assert attngen.broadcast_kernel_for(64, "bf16", rotary="half") is \
        attngen.broadcast_kernel_for(64, "bf16", rotary={"layout": "half"})


def test_workspace_is_sized_by_the_library(env, monkeypatch):
    sizes = []
    real_empty = env.torch.empty

    def empty(shape, dtype=None, device=None):
        if dtype == ts.float32 and len(shape) == 1:
            sizes.append(shape[0])
        return real_empty(shape, dtype, device)

    monkeypatch.setattr(env.torch, "empty", empty)
    FakeLib.workspace_answer = 4 * 1001
    q, k, v, ck = btensors(grad=(True, False, False))
    out = attngen.broadcast_attention(q, k, v, ck)
    ts.run_backward(out, ts.StubTensor(out.shape, out.dtype, ptr=next(ts._ptrs)))
    assert sizes == [1001]


def test_workspace_zero_is_an_error(env):
    """0 bytes means the library does not take the kernel as a broadcast
    one with the backward: refused rather than launched with no scratch."""
    FakeLib.workspace_answer = 0
    q, k, v, ck = btensors(grad=(True, True, True))
    out = attngen.broadcast_attention(q, k, v, ck)
    with pytest.raises(attngen.InvalidArgumentError, match="not a broadcast-Q kernel"):
        ts.run_backward(out, ts.StubTensor(out.shape, out.dtype, ptr=next(ts._ptrs)))
    assert [c["fn"] for c in env.launches.calls] == ["ag_broadcast_forward"]


def test_only_requested_gradients(env):
    q, k, v, ck = btensors(grad=(False, True, False))
    out = attngen.broadcast_attention(q, k, v, ck)
    dq, dk, dv = ts.run_backward(out, ts.StubTensor(out.shape, out.dtype,
                                                    ptr=next(ts._ptrs)))[:3]
    assert dq is None and dk is not None and dv is None
    q, k, v, ck = btensors(grad=(True, False, False))
    out = attngen.broadcast_attention(q, k, v, ck)
    dq, dk, dv = ts.run_backward(out, ts.StubTensor(out.shape, out.dtype,
                                                    ptr=next(ts._ptrs)))[:3]
    assert dq is not None and dq.shape == q.shape and dk is None and dv is None


def test_grad_mode_off_uses_the_forward_kernel(env):
    env.torch.grad_enabled = False
    q, k, v, ck = btensors(grad=(True, True, True))
    out = attngen.broadcast_attention(q, k, v, ck)
    assert out.grad_fn is None and env.parsed[-1]["passes"] == ["forward"]


def test_dout_made_contiguous(env):
    q, k, v, ck = btensors(grad=(True, True, True))
    out = attngen.broadcast_attention(q, k, v, ck)
    strided = ts.StubTensor(out.shape, out.dtype, contiguous=False, ptr=next(ts._ptrs))
    ts.run_backward(out, strided)
    assert env.launches.calls[-1]["args"]["dout"] != strided.data_ptr()


def test_backward_refusal_is_raised_at_backward(env):
    env.refuse_backward = True
    q, k, v, ck = btensors(grad=(True, True, True))
    out = attngen.broadcast_attention(q, k, v, ck)
    assert env.launches.calls[0]["handle"] == "handle:torch_broadcast_d64_bf16:0"
    with pytest.raises(attngen.UnsupportedError, match="broadcast-Q backward pass is not supported"):
        ts.run_backward(out, ts.StubTensor(out.shape, out.dtype, ptr=next(ts._ptrs)))


def test_old_library_is_refused_clearly(env):
    env.missing = ("ag_broadcast_forward", "ag_broadcast_backward",
                   "ag_broadcast_backward_workspace_bytes")
    q, k, v, ck = btensors()
    with pytest.raises(attngen.UnsupportedError,
                       match="no ag_broadcast_forward .built before broadcast-Q attention"):
        attngen.broadcast_attention(q, k, v, ck)
    env.missing = ("ag_broadcast_backward",)
    q, k, v, ck = btensors(grad=(True, True, True))
    out = attngen.broadcast_attention(q, k, v, ck)
    with pytest.raises(attngen.UnsupportedError, match="no ag_broadcast_backward "):
        ts.run_backward(out, ts.StubTensor(out.shape, out.dtype, ptr=next(ts._ptrs)))


def test_empty_inputs_launch_nothing(env):
    # no queries: empty output, every gradient 0
    q, k, v, ck = btensors(n_q=0, lk=(3, 2), grad=(True, True, True))
    out, lse = attngen.broadcast_attention(q, k, v, ck, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    dq, dk, dv = ts.run_backward(out, ts.StubTensor(out.shape, out.dtype,
                                                    ptr=next(ts._ptrs)))[:3]
    assert dk.fill == 0.0 and dv.fill == 0.0 and dk.shape == k.shape and dq.shape == q.shape
    # no sequences
    q, k, v, ck = btensors(n_q=8, lk=(), grad=(True, True, True))
    out, lse = attngen.broadcast_attention(q, k, v, ck, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    dq = ts.run_backward(out, ts.StubTensor(out.shape, out.dtype, ptr=next(ts._ptrs)))[0]
    assert dq.fill == 0.0 and dq.shape == q.shape
    # no keys in any sequence: output 0, lse -inf, dq 0
    q, k, v, ck = btensors(n_q=8, lk=(0, 0, 0), grad=(True, True, True))
    out, lse = attngen.broadcast_attention(q, k, v, ck, return_lse=True)
    assert out.shape == (24, 4, 64) and out.fill == 0.0 and lse.fill == float("-inf")
    dq = ts.run_backward(out, ts.StubTensor(out.shape, out.dtype, ptr=next(ts._ptrs)))[0]
    assert dq.fill == 0.0 and dq.shape == q.shape
    assert env.launches.calls == [] and FakeLib.workspace_calls == []


def test_poison(env):
    q, k, v, ck = btensors(grad=(True, True, True))
    out, lse = attngen.broadcast_attention(q, k, v, ck, return_lse=True, _poison=True)
    assert str(out.fill) == "nan" and str(lse.fill) == "nan"
    for g in ts.run_backward(out, ts.StubTensor(out.shape, out.dtype, ptr=next(ts._ptrs)))[:3]:
        assert str(g.fill) == "nan"


def test_kernel_cache_reuses_kernels(env):
    q, k, v, ck = btensors()
    attngen.broadcast_attention(q, k, v, ck, causal=True)
    attngen.broadcast_attention(q, k, v, ck, causal=True, window_size=(-1, 0))
    attngen.broadcast_attention(q, k, v, ck, window_size=(-1, 0))
    assert len(env.parsed) == 1  # the same spec, parsed once
    assert attngen.broadcast_kernel_for(64, "bf16", True) is \
        attngen.broadcast_kernel_for(64, "bf16", True, None)
    # a broadcast kernel is never the jagged kernel of the same options
    assert attngen.broadcast_kernel_for(64, "bf16").name != \
        attngen.jagged_spec_name(64, "bf16")


def test_signature_and_exports():
    import inspect
    sig = inspect.signature(attngen.broadcast_attention)
    params = list(sig.parameters)
    assert params[:4] == ["q", "k", "v", "cu_seqlens_k"]
    for name in ("max_seqlen_k", "window_size", "causal", "softmax_scale", "deterministic",
                 "return_lse"):
        assert sig.parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["window_size"].default == (-1, -1)
    assert sig.parameters["return_lse"].default is False
    for name in ("broadcast_attention", "broadcast_kernel_for", "check_broadcast_attention_args"):
        assert name in attngen.__all__ and hasattr(attngen, name)
    assert "broadcast_attention" in attngen.__doc__


def test_views_are_copied(env):
    """q that is not contiguous (a slice of a larger tensor) is copied
    before the checks: the launch reads the copy."""
    q, k, v, ck = btensors(n_q=16, lk=(3, 0, 5, 1), heads=8, kv_heads=2)
    view = ts.StubTensor(q.shape, ptr=next(ts._ptrs), contiguous=False)
    attngen.broadcast_attention(view, k, v, ck)
    (call,) = env.launches.calls
    assert call["args"]["q"] not in (view.data_ptr(), 0)
    assert call["args"]["k"] == k.data_ptr()
