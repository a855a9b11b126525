# SPDX-License-Identifier: BSD-3-Clause
"""GPU tests of attngen.broadcast_attention against a float64 reference.

Need torch with CUDA, a GPU and libattngen.so with broadcast-Q attention
(`make build/libattngen.so`, or ATTNGEN_LIB); skipped with the reason
otherwise. Outputs, logsumexp and gradients are poisoned with NaN before
each launch (`_poison`), so a row the kernels fail to write shows up.

The reference (broadcast64) expands the one q to every sequence (q repeated
batch times, sequence b's queries at rows b * n_q) and runs a per-sequence
float64 attention over it: masks aligned at the bottom right with Lq = n_q
(query i of a sequence of Lk keys sees key j <= i + Lk - n_q when causal;
FlashAttention's window_size sides likewise), grouped-query attention by
repeat_interleave of the key heads, rows that see no key give 0 and
logsumexp -inf. Gradients come from float64 autograd through it, so the
expansion sums q's gradient over the batch, which attngen's dq must equal.
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
    need_gpu_and_lib(torch, attngen, "ag_broadcast_forward", "broadcast-Q attention")


@pytest.fixture(scope="module", autouse=True)
def _precompile(_need_gpu_and_lib):
    """Build the parametrized tests' kernels in parallel (NVRTC releases the
    GIL); a failure is left for the test itself to report."""
    import concurrent.futures as cf
    keys = set()
    for _, _, _, causal, window in CASES:
        c, w = attngen._validate.check_window_size(window, causal)
        for dim in (64, 128):
            for dt in ("bf16", "fp16"):
                for bwd in (False, True):
                    keys.add((dim, dt, c, w, bwd))
    dev = torch.cuda.current_device()

    def build(key):
        dim, dt, c, w, bwd = key
        try:
            attngen.broadcast_kernel_for(dim, dt, c, w, backward=bwd).handle(dev)
        except Exception:
            pass

    with cf.ThreadPoolExecutor(max_workers=8) as ex:
        list(ex.map(build, sorted(keys, key=repr)))


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
    """(out [total_q, H, D], lse [H, total_q]) of per-sequence attention in
    float64, differentiable (as test_gpu_jagged.py's)."""
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


def broadcast64(q, k, v, cu_k, causal=False, window_size=(-1, -1), scale=None):
    """The broadcast reference: q [n_q, H, D] expanded to every sequence
    (rows b * n_q onwards), then attention64. Its gradient with respect to q
    is the sum over the batch (autograd through the expansion)."""
    n_q, heads, dim = q.shape
    batch = len(cu_k) - 1
    qx = q.unsqueeze(0).expand(batch, n_q, heads, dim).reshape(batch * n_q, heads, dim)
    return attention64(qx, k, v, [b * n_q for b in range(batch + 1)], cu_k, causal,
                       window_size, scale)


def cumsum(lengths):
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def make(n_q, lk, heads, kv_heads, dim, dtype, seed=0, grad=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ck = cumsum(lk)
    q = torch.randn(n_q, heads, dim, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(ck[-1], kv_heads, dim, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(ck[-1], kv_heads, dim, device="cuda", dtype=dtype, generator=g)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    tk = torch.tensor(ck, dtype=torch.int32, device="cuda")
    return q, k, v, tk, ck


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


# Key lengths of the batch: empty sequences, length-1 ones, lengths below,
# at and above every n_q (so causal rows that see no key occur), past one
# 64-key tile.
LK = [0, 1, 17, 64, 130, 1, 255, 0, 300, 2]
N_Q = [1, 16, 64, 128, 200]

CASES = [
    # (name, heads, kv_heads, causal, window_size)
    ("plain", 4, 4, False, (-1, -1)),
    ("causal", 4, 4, True, (-1, -1)),
    ("gqa", 8, 2, False, (-1, -1)),
    ("gqa_causal", 6, 3, True, (-1, -1)),
    ("window", 4, 4, False, (32, 7)),
    ("causal_window", 4, 2, True, (48, -1)),
]


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n_q", N_Q, ids=["nq%d" % n for n in N_Q])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_lse(case, n_q, dtype, dim):
    _, heads, kv_heads, causal, window = case
    q, k, v, tk, ck = make(n_q, LK, heads, kv_heads, dim, dtype, seed=dim + n_q)
    out, lse = attngen.broadcast_attention(q, k, v, tk, max_seqlen_k=max(LK), causal=causal,
                                           window_size=window, return_lse=True, _poison=True)
    torch.cuda.synchronize()
    batch = len(LK)
    assert out.shape == (batch * n_q, heads, dim) and out.dtype == q.dtype
    assert lse.shape == (heads, batch * n_q) and lse.dtype == torch.float32
    assert not torch.isnan(out).any(), "output rows left unwritten"
    ref, ref_lse = broadcast64(*(t.double().cpu() for t in (q, k, v)), ck, causal, window)
    err = rel(out, ref)
    assert err <= TOL[dtype], "relative error %.3g" % err
    check_lse(lse, ref_lse)


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n_q", N_Q, ids=["nq%d" % n for n in N_Q])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradients(case, n_q, dtype, dim):
    _, heads, kv_heads, causal, window = case
    q, k, v, tk, ck = make(n_q, LK, heads, kv_heads, dim, dtype, seed=dim + n_q + 1, grad=True)
    out = attngen.broadcast_attention(q, k, v, tk, causal=causal, window_size=window,
                                      _poison=True)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    for g in (dq, dk, dv):
        assert not torch.isnan(g).any(), "gradient rows left unwritten"
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref, _ = broadcast64(*leaves, ck, causal, window)
    assert rel(out.detach(), ref.detach()) <= TOL[dtype]
    rq, rk, rv = torch.autograd.grad(ref, leaves, dout.double().cpu())
    errs = [rel(dq, rq), rel(dk, rk), rel(dv, rv)]
    assert max(errs) <= GRAD_TOL[dtype], "dq, dk, dv relative errors %s" % errs


def test_many_sequences_sum_dq():
    """A batch of hundreds of short sequences: dq is summed over many
    slabs of sequences."""
    g = torch.Generator().manual_seed(11)
    lk = torch.randint(0, 40, (300,), generator=g).tolist()
    q, k, v, tk, ck = make(16, lk, 8, 2, 128, torch.bfloat16, seed=12, grad=True)
    out = attngen.broadcast_attention(q, k, v, tk, causal=True, _poison=True)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    ref, _ = broadcast64(*leaves, ck, True)
    assert rel(out.detach(), ref.detach()) <= TOL[torch.bfloat16]
    rq, rk, rv = torch.autograd.grad(ref, leaves, dout.double().cpu())
    errs = [rel(dq, rq), rel(dk, rk), rel(dv, rv)]
    assert max(errs) <= GRAD_TOL[torch.bfloat16], "dq, dk, dv relative errors %s" % errs


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_is_bit_identical(deterministic):
    g = torch.Generator().manual_seed(21)
    lk = torch.randint(0, 300, (64,), generator=g).tolist()
    q, k, v, tk, _ = make(128, lk, 8, 2, 128, torch.bfloat16, seed=5, grad=True)
    dout = None
    runs = []
    for _ in range(5):
        out = attngen.broadcast_attention(q, k, v, tk, causal=True, deterministic=deterministic)
        if dout is None:
            dout = torch.randn_like(out)
        runs.append(torch.autograd.grad(out, (q, k, v), dout))
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    name = attngen.broadcast_kernel_for(128, "bf16", True, None, None, deterministic, True).name
    assert name == "torch_broadcast_d128_bf16_causal%s_grad" % ("_det" if deterministic else "")


def test_softmax_scale_and_current_stream():
    q, k, v, tk, ck = make(33, [70, 5, 128], 2, 2, 64, torch.float16, seed=3)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = attngen.broadcast_attention(q, k, v, tk, softmax_scale=0.05, _poison=True)
    s.synchronize()
    ref, _ = broadcast64(*(t.double().cpu() for t in (q, k, v)), ck, scale=0.05)
    assert rel(out, ref) <= TOL[torch.float16]


def test_empty_and_keyless():
    # no queries: empty output and lse, zero key gradients
    q, k, v, tk, _ = make(0, [3, 4], 2, 2, 64, torch.bfloat16, grad=True)
    out, lse = attngen.broadcast_attention(q, k, v, tk, return_lse=True)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out), allow_unused=True)
    assert torch.count_nonzero(dk) == 0 and torch.count_nonzero(dv) == 0
    # no keys in any sequence: zero rows, lse -inf, dq 0
    q, k, v, tk, _ = make(5, [0, 0], 2, 2, 64, torch.bfloat16, grad=True)
    out, lse = attngen.broadcast_attention(q, k, v, tk, return_lse=True, _poison=True)
    assert out.shape == (10, 2, 64)
    assert torch.count_nonzero(out) == 0 and torch.isneginf(lse).all()
    (dq,) = torch.autograd.grad(out, (q,), torch.ones_like(out))
    assert dq.shape == q.shape and torch.count_nonzero(dq) == 0
    # no sequences
    q, k, v, tk, _ = make(5, [], 2, 2, 64, torch.bfloat16)
    out = attngen.broadcast_attention(q, k, v, tk)
    assert out.shape == (0, 2, 64)


def test_matches_jagged_attention_on_expanded_q():
    """The same numbers as jagged_attention over q expanded to every
    sequence (the expansion broadcast_attention never makes)."""
    lk = [5, 0, 200, 64, 1]
    n_q = 48
    q, k, v, tk, ck = make(n_q, lk, 4, 2, 128, torch.bfloat16, seed=8)
    out, lse = attngen.broadcast_attention(q, k, v, tk, causal=True, return_lse=True)
    qx = q.repeat(len(lk), 1, 1)
    tq = torch.arange(0, (len(lk) + 1) * n_q, n_q, dtype=torch.int32, device="cuda")
    ref, ref_lse = attngen.jagged_attention(qx, k, v, tq, tk, causal=True, return_lse=True)
    torch.cuda.synchronize()
    assert rel(out, ref) <= TOL[torch.bfloat16]
    check_lse(lse, ref_lse)


# ---- rotary embeddings ------------------------------------------------------------



def computed_table64(positions, dim, base):
    p = torch.tensor(positions, dtype=torch.float64).view(-1, 1)
    inv = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return torch.cat((torch.sin(p * inv), torch.cos(p * inv)), dim=-1)




ROPE_CASES = [
    # (name, layout, apply_to, positions, n_q, heads, kv_heads, causal, dtype, dim)
    ("half-qk-table", "half", ("q", "k"), "table", 48, 4, 4, False, torch.bfloat16, 128),
    ("interleaved-qkv-sequence-causal-gqa", "interleaved", ("q", "k", "v"), "sequence", 130, 4,
     2, True, torch.float16, 64),
    ("interleaved-k-table-causal", "interleaved", ("k",), "table", 16, 4, 4, True,
     torch.bfloat16, 64),
]


@pytest.mark.parametrize("case", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rotary_forward_and_gradients(case):
    """Query row i of q rotated at the fixed position i (or by row i of the
    queries' table) in every sequence, key j at j in its sequence (or its
    row of the keys' table): the float64 reference rotates, then expands
    q; dq is the sum over the batch of the unrotated q's gradient."""
    _, layout, apply_to, positions, n_q, heads, kv_heads, causal, dtype, dim = case
    q, k, v, tk, ck = make(n_q, LK, heads, kv_heads, dim, dtype, seed=400 + dim, grad=True)
    rotary = {"layout": layout, "apply_to": list(apply_to), "positions": positions}
    tables = {}
    if positions == "table":
        table_q = random_table(n_q, dim, dtype, seed=dim) if "q" in apply_to else None
        table_k = random_table(ck[-1], dim, dtype, seed=dim + 1)
        tables = {"rotary_table": table_q, "rotary_table_k": table_k}
        tab_q64 = None if table_q is None else table_q.double().cpu()
        tab_k64 = table_k.double().cpu()
    else:
        tab_q64 = computed_table64(range(n_q), dim, 10000.0)
        tab_k64 = computed_table64([j for b in range(len(LK)) for j in range(LK[b])], dim,
                                   10000.0)
    out, lse = attngen.broadcast_attention(q, k, v, tk, causal=causal, rotary=rotary,
                                           return_lse=True, _poison=True, **tables)
    dout = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    with torch.no_grad():  # the forward-only kernel
        out_fwd = attngen.broadcast_attention(q, k, v, tk, causal=causal, rotary=rotary,
                                              _poison=True, **tables)
    torch.cuda.synchronize()
    for name, t in (("output", out), ("forward-only output", out_fwd), ("dq", dq), ("dk", dk),
                    ("dv", dv)):
        assert not torch.isnan(t).any(), "%s rows left unwritten" % name
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    rotated = [rotate64(x, tab_q64 if n == "q" else tab_k64, layout) if n in apply_to else x
               for n, x in zip("qkv", leaves)]
    ref, ref_lse = broadcast64(*rotated, ck, causal)
    for got in (out.detach(), out_fwd):
        err = rel(got, ref.detach())
        assert err <= TOL[dtype], "output: relative error %.3g" % err
    check_lse(lse, ref_lse.detach())
    rq, rk, rv = torch.autograd.grad(ref, leaves, dout.double().cpu())
    errs = [rel(dq, rq), rel(dk, rk), rel(dv, rv)]
    assert max(errs) <= GRAD_TOL[dtype], "dq, dk, dv relative errors %s" % errs


def test_rotary_under_torch_compile():
    """torch.compile(fullgraph=True) of a rotary broadcast call: the custom
    op with its tables, output and gradients equal to eager."""
    q, k, v, tk, ck = make(32, LK, 4, 4, 64, torch.bfloat16, seed=9, grad=True)
    table_q = random_table(32, 64, torch.bfloat16, seed=3)
    table_k = random_table(ck[-1], 64, torch.bfloat16, seed=4)

    def f(q, k, v):
        return attngen.broadcast_attention(q, k, v, tk, rotary="half", rotary_table=table_q,
                                           rotary_table_k=table_k)

    out = f(q, k, v)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    cf = torch.compile(f, fullgraph=True)
    out_c = cf(q, k, v)
    grads_c = torch.autograd.grad(out_c, (q, k, v), dout)
    torch.cuda.synchronize()
    assert torch.equal(out, out_c)
    for g, gc in zip(grads, grads_c):
        assert torch.equal(g, gc)
