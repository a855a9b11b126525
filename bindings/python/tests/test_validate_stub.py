# SPDX-License-Identifier: BSD-3-Clause
"""Argument checks of block_attention, run on the torch STUB (torch_stub.py):
pure-Python validation only; no torch, no GPU, no libattngen.so needed."""
import pytest

import torch_stub as ts
from attngen import _validate as V
from attngen import check_block_attention_args


def args(**kw):
    q, k, v = kw.pop("qkv", None) or ts.qkv()
    off = kw.pop("offsets", None) or ts.offsets([0, 40, 100])
    return dict(q=q, k=k, v=v, offsets=off, **kw)


def check(**kw):
    return check_block_attention_args(**args(**kw))


def test_valid_arguments_pass_and_are_normalized():
    a = check(cpu_offsets=[0, 40, 100], block_size=128, causal=True, softmax_scale=0.1)
    assert (a["tokens"], a["heads"], a["head_dim"], a["batch"]) == (100, 4, 128, 2)
    assert a["dtype_tag"] == "bf16" and a["block_size"] == 128 and a["causal"] is True
    assert a["softmax_scale"] == 0.1
    a = check(qkv=ts.qkv(head_dim=64, dtype=ts.float16))
    assert a["dtype_tag"] == "fp16" and a["head_dim"] == 64 and a["softmax_scale"] is None


@pytest.mark.parametrize("bs", [0, 8, 15, 24, 272, 512, -16])
def test_block_size_range(bs):
    with pytest.raises(ValueError, match="block_size must be a multiple of 16 in 16..256"):
        check(block_size=bs)


@pytest.mark.parametrize("bs", [16, 32, 64, 128, 256])
def test_block_size_ok(bs):
    assert check(block_size=bs)["block_size"] == bs


@pytest.mark.parametrize("bs", [64.0, "64", True, None])
def test_block_size_type(bs):
    with pytest.raises(ValueError, match="block_size must be an int"):
        check(block_size=bs)


def test_devices():
    q, k, v = ts.qkv()
    with pytest.raises(ValueError, match="k must be a CUDA tensor, got one on cpu"):
        check(qkv=(q, ts.StubTensor(q.shape, device="cpu"), v))
    with pytest.raises(ValueError, match="same device: q is on cuda:0, v on cuda:1"):
        check(qkv=(q, k, ts.StubTensor(q.shape, device="cuda:1")))
    with pytest.raises(ValueError, match=r"offsets must be on the same device as q \(cuda:0\), got cuda:1"):
        check(offsets=ts.offsets([0, 100], device="cuda:1"))
    with pytest.raises(ValueError, match="offsets must be on the same device"):
        check(offsets=ts.offsets([0, 100], device="cpu"))


def test_dtypes():
    q, k, v = ts.qkv()
    with pytest.raises(ValueError, match="q must be torch.bfloat16 or torch.float16, got torch.float32"):
        check(qkv=(ts.StubTensor(q.shape, ts.float32), k, v))
    with pytest.raises(ValueError, match="same dtype: q is torch.bfloat16, k is torch.float16"):
        check(qkv=(q, ts.StubTensor(q.shape, ts.float16), v))
    with pytest.raises(ValueError, match="offsets must be torch.int32, got torch.int64"):
        check(offsets=ts.offsets([0, 100], dtype=ts.int64))


def test_shapes():
    q, k, v = ts.qkv()
    with pytest.raises(ValueError, match=r"q must be 3-D \[total_tokens, heads, head_dim\], got shape \[100, 512\]"):
        check(qkv=(ts.StubTensor((100, 512)), k, v))
    with pytest.raises(ValueError, match=r"k and v must have the same shape: k is \[100, 4, 128\], "
                       r"v is \[100, 2, 128\]"):
        check(qkv=(q, k, ts.StubTensor((100, 2, 128))))
    # grouped-query heads: k and v with kv_heads dividing q's heads
    kv = [ts.StubTensor((100, 2, 128)) for _ in range(2)]
    assert check(qkv=(q, *kv))["kv_heads"] == 2
    assert check(qkv=(q, k, v))["kv_heads"] == 4
    for shape in [(100, 3, 128), (99, 2, 128), (100, 2, 64)]:
        kv = [ts.StubTensor(shape) for _ in range(2)]
        with pytest.raises(ValueError, match=r"k and v must be \[total_tokens, kv_heads, head_dim\] "
                           r"with q's tokens and head_dim and kv_heads dividing q's heads"):
            check(qkv=(q, *kv))
    with pytest.raises(ValueError, match="head_dim .* must be 64 or 128, got 96"):
        check(qkv=ts.qkv(head_dim=96))
    with pytest.raises(ValueError, match="heads .* at least 1, got 0"):
        check(qkv=ts.qkv(heads=0))
    with pytest.raises(ValueError, match=r"offsets must be 1-D \[batch \+ 1\], got shape \[2, 2\]"):
        check(offsets=ts.StubTensor((2, 2), ts.int32))
    with pytest.raises(ValueError, match="at least one element"):
        check(offsets=ts.offsets([]))


def test_zero_tokens_and_batch_zero_are_valid():
    a = check(qkv=ts.qkv(tokens=0), offsets=ts.offsets([0]), cpu_offsets=[0])
    assert a["batch"] == 0 and a["tokens"] == 0


def test_contiguity_and_alignment():
    q, k, v = ts.qkv()
    # not contiguous: accepted, misaligned or not (read by its row stride or
    # copied when launched: test_backward_stub's views tests)
    check(qkv=(q, k, ts.StubTensor(q.shape, contiguous=False)))
    check(qkv=(q, k, ts.StubTensor(q.shape, contiguous=False, ptr=0x7F0000000008)))
    with pytest.raises(ValueError, match="k's data pointer .* must be 16-byte aligned"):
        check(qkv=(q, ts.StubTensor(q.shape, ptr=0x7F0000000008), v))
    with pytest.raises(ValueError, match="offsets must be contiguous"):
        check(offsets=ts.StubTensor((3,), ts.int32, contiguous=False))


def test_not_a_tensor():
    q, k, v = ts.qkv()
    with pytest.raises(ValueError, match="k must be a torch.Tensor, got list"):
        check(qkv=(q, [1, 2], v))
    with pytest.raises(ValueError, match="offsets must be a torch.Tensor, got tuple"):
        check(offsets=(0, 100))


def test_cpu_offsets():
    check(cpu_offsets=[0, 40, 100])
    check(cpu_offsets=ts.StubTensor((3,), ts.int32, device="cpu", values=[0, 40, 100]))
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0, got 5"):
        check(cpu_offsets=[5, 40, 100])
    with pytest.raises(ValueError, match=r"non-decreasing: offsets\[2\] = 30 < offsets\[1\] = 40"):
        check(cpu_offsets=[0, 40, 30], offsets=ts.offsets([0, 40, 30]))
    with pytest.raises(ValueError, match=r"offsets\[-1\] must equal total_tokens \(q.shape\[0\] = 100\), got 90"):
        check(cpu_offsets=[0, 40, 90])
    with pytest.raises(ValueError, match="cpu_offsets has 2 entries but offsets has 3"):
        check(cpu_offsets=[0, 100])
    with pytest.raises(ValueError, match="cpu_offsets must live on the host"):
        check(cpu_offsets=ts.offsets([0, 40, 100]))
    with pytest.raises(ValueError, match="keyword-only"):
        check(cpu_offsets=64)  # block_size passed positionally by mistake
    with pytest.raises(ValueError, match="must hold integers"):
        check(cpu_offsets=[0, 40.5, 100])


def test_other_options():
    with pytest.raises(ValueError, match="causal must be True or False"):
        check(causal=1)
    for bad in (0.0, -1.0, float("inf"), float("nan"), True, "x"):
        with pytest.raises(ValueError, match="softmax_scale"):
            check(softmax_scale=bad)
    assert check(softmax_scale=1)["softmax_scale"] == 1.0


def test_rotary_options_are_normalized():
    assert V.check_rotary(None) is None
    assert V.check_rotary("half") == {"layout": "half", "apply_to": ("q", "k"),
                                      "positions": "table", "base": None}
    assert V.check_rotary({"layout": "interleaved", "apply_to": ["v", "q"],
                           "positions": "block"}) == {
        "layout": "interleaved", "apply_to": ("q", "v"), "positions": "block", "base": 10000.0}
    assert V.check_rotary({"layout": "half", "positions": "sequence", "base": 500000})["base"] \
        == 500000.0
    r = V.check_rotary({"layout": "half", "positions": "sequence"})
    assert V.check_rotary(r) == r  # idempotent
    for bad in ({"layout": "half", "positions": "sequence", "base": True},
                {"layout": "half", "positions": "sequence", "base": float("nan")},
                {"layout": "half", "positions": "block", "base": "1e4"}):
        with pytest.raises(ValueError, match="base must be a positive finite number"):
            V.check_rotary(bad)


def test_rotary_table_goes_with_table_positions():
    q, k, v = ts.qkv()
    table = ts.StubTensor((100, 128))
    a = check(qkv=(q, k, v), rotary="interleaved", rotary_table=table)
    assert a["rotary"]["positions"] == "table" and a["rotary_table"] is table
    a = check(rotary={"layout": "half", "positions": "sequence"})
    assert a["rotary"]["base"] == 10000.0 and a["rotary_table"] is None
    assert check()["rotary"] is None
    with pytest.raises(ValueError, match="need rotary_table"):
        check(rotary="half")
    with pytest.raises(ValueError, match="only taken with rotary positions 'table'"):
        check(rotary_table=table)
    with pytest.raises(ValueError, match="must be contiguous"):
        check(rotary="half", rotary_table=ts.StubTensor((100, 128), contiguous=False))
    with pytest.raises(ValueError, match="same device as q"):
        check(rotary="half", rotary_table=ts.StubTensor((100, 128), device="cuda:1"))
    with pytest.raises(ValueError, match="16-byte aligned"):
        check(rotary="half", rotary_table=ts.StubTensor((100, 128), ptr=0x7F0000000008))


def test_validation_module_imports_no_torch():
    import sys
    assert "torch" not in sys.modules or True  # real torch may be present elsewhere
    src = open(V.__file__).read()
    assert "import torch" not in src


def test_fp32_bounds_and_huge_ints_issue22():
    # The kernels hold these in fp32: refused like the C validator, and an
    # int past float's range is a ValueError, not OverflowError.
    for bad in (2.4e38, 1e-46, 1e300, 10**400):
        with pytest.raises(ValueError, match="softmax_scale"):
            check(softmax_scale=bad)
    for base in (1e39, 1e-46, 10**400):
        with pytest.raises(ValueError, match="rotary base"):
            V.check_rotary({"layout": "half", "apply_to": ["q"], "positions": "sequence",
                            "base": base})
    assert check(softmax_scale=2.3e38)["softmax_scale"] == 2.3e38


def test_cpu_offsets_negative_batch_issue22():
    with pytest.raises(ValueError, match="batch must be an integer >= 0"):
        V.check_cpu_offsets([], -1, 0)
    with pytest.raises(ValueError, match="at least one element"):
        V.check_cpu_offsets([], 0, 0)
    assert V.check_cpu_offsets([0], 0, 0) == [0]


def _fast_vs_full_cases():
    """q, k, v triples around every condition of _validate._fast_tensors."""
    dev = {"cuda:0": "cuda:0", "cuda:1": "cuda:1", "cpu": "cpu"}
    out = []
    for kdev in dev:
        for kdt in (ts.bfloat16, ts.float16, ts.float32):
            for kshape in ((100, 4, 64), (100, 2, 64), (80, 4, 64), (100, 4, 128), (100, 4),
                           (0, 4, 64), (100, 0, 64)):
                for contiguous in (True, False):
                    for ptr in (0x7F0000000000, 0x7F0000000008):
                        q = ts.StubTensor((100, 4, 64))
                        k = ts.StubTensor(kshape, kdt, kdev, contiguous, ptr)
                        v = ts.StubTensor(kshape, kdt, kdev, True, 0x7F0000100000)
                        out.append((q, k, v))
    # q itself odd: on the CPU, fp32, head_dim 96, no heads, unaligned
    for qkw in (dict(device="cpu"), dict(dtype=ts.float32), dict(shape=(10, 4, 96)),
                dict(shape=(10, 0, 64)), dict(ptr=0x7F0000000004)):
        kw = dict(shape=(10, 4, 64))
        kw.update(qkw)
        out.append((ts.StubTensor(**kw), ts.StubTensor((10, 4, 64)), ts.StubTensor((10, 4, 64))))
    return out


@pytest.mark.parametrize("full_check, same", [(V.check_qkv, True), (V.check_jagged_qkv, False)])
def test_fast_path_agrees_with_the_full_check(monkeypatch, full_check, same):
    """Where the fast path answers, the full check accepts and returns the
    same; where the full check refuses, the fast path does not answer."""
    answered = 0
    for q, k, v in _fast_vs_full_cases():
        fast = V._fast_tensors(q, k, v, same)
        with monkeypatch.context() as m:
            m.setattr(V, "_fast_tensors", lambda *a: None)
            try:
                full = full_check(q, k, v)
            except ValueError:
                full = None
        if fast is None:
            continue
        answered += 1
        assert full is not None, (q.shape, k.shape, k.dtype, k.device)
        assert fast[0] == full[0] and fast[1] == full[1] and fast[2] == full[2]
        assert tuple(fast[3]) == tuple(q.shape)
    assert answered > 0
