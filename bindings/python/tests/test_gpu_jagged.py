# SPDX-License-Identifier: BSD-3-Clause
"""GPU tests of attngen.jagged_attention against a float64 reference.

Need torch with CUDA, a GPU and libattngen.so with the jagged pattern
(`make build/libattngen.so`, or ATTNGEN_LIB); skipped with the reason
otherwise. Outputs, logsumexp and gradients are poisoned with NaN before
each launch (`_poison`), so a row the kernels fail to write shows up.

The reference (attention64) loops over sequences in float64: masks aligned
at the bottom right (query i of Lq sees key j <= i + Lk - Lq when causal;
FlashAttention's window_size sides likewise), grouped-query attention by
repeat_interleave of the key heads, rows that see no key give 0 and
logsumexp -inf. Gradients come from float64 autograd through it.

The rotary tests rotate the float64 inputs before attention64 (gradients
with respect to the unrotated inputs, through the rotation): key j of a
sequence at position j, query i at i + Lk - Lq (computed positions), or
each token by its row of the caller's table (random angles, so a row read
from the wrong token or the wrong table shows).
"""
import math

import pytest

import attngen
from gpu_env import need_gpu_and_lib

torch = pytest.importorskip("torch", reason="torch is not installed")
from rope64 import random_table, rotate64  # noqa: E402 (needs torch)

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
GRAD_TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3}
LSE_TOL = 1e-2  # absolute, natural-log units


@pytest.fixture(scope="module", autouse=True)
def _need_gpu_and_lib():
    need_gpu_and_lib(torch, attngen, "ag_jagged_forward", "the jagged pattern")


@pytest.fixture(scope="module", autouse=True)
def _precompile(_need_gpu_and_lib):
    """Build the parametrized tests' kernels in parallel (NVRTC releases the
    GIL); a failure is left for the test itself to report."""
    import concurrent.futures as cf
    keys = set()
    for _, _, _, _, causal, window in CASES:
        c, w = attngen._validate.check_window_size(window, causal)
        for dim in (64, 128):
            for dt in ("bf16", "fp16"):
                for bwd in (False, True):
                    keys.add((dim, dt, c, w, bwd))
    items = [(key, None) for key in sorted(keys, key=repr)]
    for case in ROPE_CASES:
        c, w = attngen._validate.check_window_size(case[9], case[8])
        dt = "bf16" if case[10] == torch.bfloat16 else "fp16"
        for bwd in (False, True):
            items.append(((case[11], dt, c, w, bwd), rope_option(case)))
    dev = torch.cuda.current_device()

    def build(item):
        (dim, dt, c, w, bwd), rotary = item
        try:
            attngen.jagged_kernel_for(dim, dt, c, w, backward=bwd, rotary=rotary).handle(dev)
        except Exception:
            pass

    with cf.ThreadPoolExecutor(max_workers=8) as ex:
        list(ex.map(build, items))


def visible(lq, lk, causal, window_size, device="cpu"):
    """[lq, lk] bool: which keys each query sees (bottom-right aligned)."""
    i = torch.arange(lq, device=device).view(-1, 1)
    j = torch.arange(lk, device=device).view(1, -1)
    d = lk - lq
    vis = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if causal:
        vis &= j <= i + d
    left, right = window_size
    if left >= 0:
        vis &= j >= i + d - left
    if right >= 0:
        vis &= j <= i + d + right
    return vis


def attention64(q, k, v, cu_q, cu_k, causal=False, window_size=(-1, -1), scale=None):
    """(out [total_q, H, D], lse [H, total_q]) in float64, differentiable."""
    heads, dim = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        qb = q[q0:q1].transpose(0, 1)                                      # [H, lq, D]
        kb = k[k0:k1].repeat_interleave(group, dim=1).transpose(0, 1)      # [H, lk, D]
        vb = v[k0:k1].repeat_interleave(group, dim=1).transpose(0, 1)
        vis = visible(lq, lk, causal, window_size, q.device)               # [lq, lk]
        has = vis.any(-1, keepdim=True)                                    # [lq, 1]
        s = (qb @ kb.transpose(-1, -2)) * scale
        s = s.masked_fill(~vis, float("-inf")).masked_fill(~has, 0.0)
        p = torch.softmax(s, dim=-1) * has
        lse = torch.logsumexp(s, dim=-1).masked_fill(~has.view(1, -1), float("-inf"))
        outs.append((p @ vb).transpose(0, 1))
        lses.append(lse)
    if not outs:
        return q * 0, q.new_zeros(heads, q.shape[0])
    return torch.cat(outs), torch.cat(lses, dim=1)


def cumsum(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def make(lq, lk, heads, kv_heads, dim, dtype, seed=0, grad=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    cq, ck = cumsum(lq), cumsum(lk)
    q = torch.randn(cq[-1], heads, dim, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(ck[-1], kv_heads, dim, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(ck[-1], kv_heads, dim, device="cuda", dtype=dtype, generator=g)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    tq = torch.tensor(cq, dtype=torch.int32, device="cuda")
    tk = torch.tensor(ck, dtype=torch.int32, device="cuda")
    return q, k, v, tq, tk, cq, ck


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def check_lse(lse, ref):
    lse, ref = lse.double().cpu(), ref.double().cpu()
    assert not torch.isnan(lse).any(), "logsumexp rows left unwritten"
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(lse) & (lse < 0), inf), "-inf rows differ"
    if (~inf).any():
        err = (lse[~inf] - ref[~inf]).abs().max().item()
        assert err <= LSE_TOL, "logsumexp error %.3g" % err


LQ = [0, 1, 17, 64, 130, 1, 255, 0, 300, 2]
LK_CROSS = [5, 0, 17, 100, 64, 3, 255, 1, 129, 2]

CASES = [
    # (name, lk (None: self), heads, kv_heads, causal, window_size)
    ("self", None, 4, 4, False, (-1, -1)),
    ("self_causal", None, 4, 4, True, (-1, -1)),
    ("cross", LK_CROSS, 4, 4, False, (-1, -1)),
    ("cross_causal", LK_CROSS, 4, 4, True, (-1, -1)),
    ("gqa_causal", None, 8, 2, True, (-1, -1)),
    ("gqa_cross", LK_CROSS, 6, 3, False, (-1, -1)),
    ("window", None, 4, 4, False, (32, 7)),
    ("causal_window", LK_CROSS, 4, 2, True, (48, -1)),
]


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_lse(case, dtype, dim):
    _, lk, heads, kv_heads, causal, window = case
    q, k, v, tq, tk, cq, ck = make(LQ, lk or LQ, heads, kv_heads, dim, dtype, seed=dim)
    out, lse = attngen.jagged_attention(q, k, v, tq, None if lk is None else tk,
                                        max_seqlen_q=max(LQ), causal=causal, window_size=window,
                                        return_lse=True, _poison=True)
    torch.cuda.synchronize()
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (heads, q.shape[0]) and lse.dtype == torch.float32
    assert not torch.isnan(out).any(), "output rows left unwritten"
    ref, ref_lse = attention64(*(t.double().cpu() for t in (q, k, v)), cq, ck, causal, window)
    err = rel(out, ref)
    assert err <= TOL[dtype], "relative error %.3g" % err
    check_lse(lse, ref_lse)


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradients(case, dtype, dim):
    _, lk, heads, kv_heads, causal, window = case
    q, k, v, tq, tk, cq, ck = make(LQ, lk or LQ, heads, kv_heads, dim, dtype, seed=dim + 1,
                                   grad=True)
    out = attngen.jagged_attention(q, k, v, tq, None if lk is None else tk, causal=causal,
                                   window_size=window, _poison=True)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    for g in (dq, dk, dv):
        assert not torch.isnan(g).any(), "gradient rows left unwritten"
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref, _ = attention64(*leaves, cq, ck, causal, window)
    assert rel(out.detach(), ref.detach()) <= TOL[dtype]
    rq, rk, rv = torch.autograd.grad(ref, leaves, dout.double().cpu())
    errs = [rel(dq, rq), rel(dk, rk), rel(dv, rv)]
    assert max(errs) <= GRAD_TOL[dtype], "dq, dk, dv relative errors %s" % errs


def test_deterministic_backward_is_bit_identical():
    q, k, v, tq, tk, _, _ = make(LQ, LK_CROSS, 8, 2, 128, torch.bfloat16, seed=5, grad=True)
    runs = []
    for _ in range(3):
        out = attngen.jagged_attention(q, k, v, tq, tk, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    name = attngen.jagged_kernel_for(128, "bf16", True, None, None, True, True).name
    assert name == "torch_jagged_d128_bf16_causal_det_grad"


def test_views_of_one_qkv_projection():
    """q, k, v as qkv.unbind(1) slices (as FlashAttention's varlen functions
    take them): copied, so the same bits as contiguous inputs, and the
    gradient reaches qkv (the deterministic backward: bit-comparable)."""
    lengths = [0, 1, 70, 129, 0, 300]
    cu = cumsum(lengths)
    g = torch.Generator(device="cuda").manual_seed(21)
    qkv = torch.randn(cu[-1], 3, 4, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    qkv.requires_grad_()
    tq = torch.tensor(cu, dtype=torch.int32, device="cuda")
    out = attngen.jagged_attention(*qkv.unbind(1), tq, causal=True, deterministic=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    q, k, v = (t.detach().contiguous().requires_grad_() for t in qkv.unbind(1))
    ref = attngen.jagged_attention(q, k, v, tq, causal=True, deterministic=True)
    ref.backward(dout)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    assert torch.equal(qkv.grad, torch.stack((q.grad, k.grad, v.grad), dim=1))


def test_softmax_scale_and_current_stream():
    q, k, v, tq, _, cq, _ = make([70, 5, 128], [70, 5, 128], 2, 2, 64, torch.float16, seed=3)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = attngen.jagged_attention(q, k, v, tq, softmax_scale=0.05, _poison=True)
    s.synchronize()
    ref, _ = attention64(*(t.double().cpu() for t in (q, k, v)), cq, cq, scale=0.05)
    assert rel(out, ref) <= TOL[torch.float16]


def test_empty_and_keyless():
    q, k, v, tq, tk, _, _ = make([0, 0], [3, 4], 2, 2, 64, torch.bfloat16, grad=True)
    out, lse = attngen.jagged_attention(q, k, v, tq, tk, return_lse=True)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out), allow_unused=True)
    assert torch.count_nonzero(dk) == 0 and torch.count_nonzero(dv) == 0
    q, k, v, tq, tk, _, _ = make([3, 2], [0, 0], 2, 2, 64, torch.bfloat16, grad=True)
    out, lse = attngen.jagged_attention(q, k, v, tq, tk, return_lse=True, _poison=True)
    assert torch.count_nonzero(out) == 0 and torch.isneginf(lse).all()


def test_matches_flash_attention_if_available():
    """Against torch's varlen_attn (FlashAttention-2) where there is one."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception as e:
        pytest.skip("torch.nn.attention.varlen.varlen_attn: %s" % e)
    import inspect
    lens = [1, 100, 513, 7, 256]
    q, k, v, tq, _, _, _ = make(lens, lens, 4, 4, 128, torch.bfloat16, seed=9)
    params = inspect.signature(varlen_attn).parameters
    kw = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    ref = varlen_attn(q, k, v, tq, tq, max(lens), max(lens), **kw)
    out = attngen.jagged_attention(q, k, v, tq, causal=True)
    torch.cuda.synchronize()
    assert rel(out, ref) <= 1e-2


# ---- rotary embeddings ------------------------------------------------------------

# Sequences of every kind: no queries, no keys, Lq > Lk (130 > 64, 200 > 77:
# under causal their first queries see no key and sit at negative
# positions), Lq < Lk, Lq == Lk.
ROPE_LQ = [0, 1, 37, 130, 64, 200, 3]
ROPE_LK = [5, 0, 37, 64, 100, 77, 3]

ROPE_CASES = [
    # (name, layout, apply_to, positions, base, cross, heads, kv_heads, causal, window_size,
    #  dtype, head_dim)
    ("half-qk-table-self-causal", "half", ("q", "k"), "table", None, False, 4, 4, True,
     (-1, -1), torch.bfloat16, 128),
    ("interleaved-qk-table-cross", "interleaved", ("q", "k"), "table", None, True, 4, 2, False,
     (-1, -1), torch.float16, 64),
    ("interleaved-qkv-table-cross-causal", "interleaved", ("q", "k", "v"), "table", None, True,
     4, 4, True, (-1, -1), torch.bfloat16, 64),
    ("half-k-table-cross-causal-window", "half", ("k",), "table", None, True, 6, 3, True,
     (48, -1), torch.float16, 128),
    ("half-qkv-sequence-self", "half", ("q", "k", "v"), "sequence", 10000.0, False, 4, 2, False,
     (-1, -1), torch.float16, 64),
    ("interleaved-qk-sequence-cross-causal", "interleaved", ("q", "k"), "sequence", 10000.0,
     True, 4, 4, True, (-1, -1), torch.bfloat16, 128),
    ("half-qk-sequence-cross-window-b5e5", "half", ("q", "k"), "sequence", 5e5, True, 4, 4,
     False, (32, 7), torch.bfloat16, 64),
    ("interleaved-qv-sequence-self-causal", "interleaved", ("q", "v"), "sequence", 10000.0,
     False, 2, 1, True, (-1, -1), torch.float16, 128),
]


def rope_option(case):
    """jagged_attention's rotary= for a ROPE_CASES entry."""
    _, layout, apply_to, positions, base = case[:5]
    rotary = {"layout": layout, "apply_to": list(apply_to), "positions": positions}
    if base is not None:
        rotary["base"] = base
    return rotary




def positions_table64(cu_q, cu_k, dim, base, queries):
    """float64 sin | cos of computed positions, one row per token: key j of
    a sequence at position j, query i at i + Lk - Lq (bottom-right aligned,
    negative when Lq > Lk); angle p * base^(-2i / D)."""
    pos = []
    for b in range(len(cu_q) - 1):
        lq, lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        pos += [i + lk - lq for i in range(lq)] if queries else list(range(lk))
    p = torch.tensor(pos, dtype=torch.float64).view(-1, 1)
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return torch.cat((torch.sin(p * inv), torch.cos(p * inv)), dim=-1)




@pytest.mark.parametrize("case", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rotary_forward_and_gradients(case):
    (_, layout, apply_to, positions, base, cross, heads, kv_heads, causal, window, dtype,
     dim) = case
    lk = ROPE_LK if cross else ROPE_LQ
    q, k, v, tq, tk, cq, ck = make(ROPE_LQ, lk, heads, kv_heads, dim, dtype, seed=300 + dim,
                                   grad=True)
    rotary = rope_option(case)
    tables = {}
    if positions == "table":
        table_q = random_table(cq[-1], dim, dtype, seed=dim)
        table_k = random_table(ck[-1], dim, dtype, seed=dim + 1) if cross else None
        tables = {"rotary_table": table_q, "rotary_table_k": table_k}
        # the values as stored, as the kernels read them; self-attention: one table
        tab_q64 = table_q.double().cpu()
        tab_k64 = (table_k if cross else table_q).double().cpu()
    else:
        tab_q64 = positions_table64(cq, ck, dim, base, queries=True)
        tab_k64 = positions_table64(cq, ck, dim, base, queries=False)
    cu_k = tk if cross else None
    out, lse = attngen.jagged_attention(q, k, v, tq, cu_k, causal=causal, window_size=window,
                                        rotary=rotary, return_lse=True, _poison=True, **tables)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    with torch.no_grad():  # the forward-only kernel
        out_fwd = attngen.jagged_attention(q, k, v, tq, cu_k, causal=causal, window_size=window,
                                           rotary=rotary, _poison=True, **tables)
    torch.cuda.synchronize()
    for name, t in (("output", out), ("forward-only output", out_fwd), ("dq", dq), ("dk", dk),
                    ("dv", dv)):
        assert not torch.isnan(t).any(), "%s rows left unwritten" % name
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    rotated = [rotate64(x, tab_q64 if n == "q" else tab_k64, layout) if n in apply_to else x
               for n, x in zip("qkv", leaves)]
    ref, ref_lse = attention64(*rotated, cq, ck, causal, window)
    for got in (out.detach(), out_fwd):
        err = rel(got, ref.detach())
        assert err <= TOL[dtype], "output: relative error %.3g" % err
    check_lse(lse, ref_lse.detach())
    rq, rk, rv = torch.autograd.grad(ref, leaves, dout.double().cpu())
    errs = [rel(dq, rq), rel(dk, rk), rel(dv, rv)]
    assert max(errs) <= GRAD_TOL[dtype], "dq, dk, dv relative errors %s" % errs


def test_rotary_table_errors_on_real_tensors():
    q, k, v, tq, tk, _, _ = make([5, 9], [7, 2], 2, 2, 64, torch.bfloat16)
    table_q = random_table(q.shape[0], 64, torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match="rotary_table_k is None"):
        attngen.jagged_attention(q, k, v, tq, tk, rotary="half", rotary_table=table_q)
    with pytest.raises(ValueError, match="rotary_table_k must be contiguous"):
        attngen.jagged_attention(q, k, v, tq, tk, rotary="half", rotary_table=table_q,
                                 rotary_table_k=torch.zeros(64, k.shape[0], dtype=q.dtype,
                                                            device="cuda").t())
    with pytest.raises(ValueError, match="positions 'block'"):
        attngen.jagged_attention(q, k, v, tq, tk, rotary={"layout": "half",
                                                          "positions": "block"})
