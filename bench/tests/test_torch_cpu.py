# SPDX-License-Identifier: BSD-3-Clause
"""CPU tests of the harness's torch side (skipped without torch): the float64
reference of the output and the gradients (with and without rotary) against
an independent implementation, the autograd plumbing of the backward and
rotary passes on a CPU peer (SDPA's math backend), the worker's per-pass
functions end to end with a CPU stand-in for CUDA events, attngen's rows
for shapes validation refuses, and the Triton kernels (forward and
backward) in Triton's interpreter.

    python3 -m pytest -q bench/tests
"""
import math
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)

import bench  # noqa: E402
from peers import common as C  # noqa: E402
from peers.common import Reference, Shape, ShapeData  # noqa: E402
from peers.sdpa import SdpaPeer  # noqa: E402


class CpuEvent:
    """torch.cuda.Event's timing interface on the host clock."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


@pytest.fixture
def cpu_cuda(monkeypatch):
    """Lets the harness's CUDA calls (events, synchronize) run on the CPU."""
    monkeypatch.setattr(torch.cuda, "Event", CpuEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


class SdpaMath(SdpaPeer):
    name = "sdpa_math"
    backend = "MATH"


def independent(data, causal, rotary):
    """Output and gradients of set 0 in float64 over the packed tensors, one
    block at a time (no sampling, no padding)."""
    D = data.shape.head_dim
    q, k, v = (t.double().requires_grad_() for t in data.sets[0])
    tab = data.rotary_table().double()

    def rot(x):
        s, c = tab[:, None, :D // 2], tab[:, None, D // 2:]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)

    qr, kr = (rot(q), rot(k)) if rotary else (q, k)
    outs = []
    for st, n in zip(data.table.starts, data.table.lens):
        qb, kb, vb = (t[st:st + n].transpose(0, 1) for t in (qr, kr, v))
        sc = qb @ kb.transpose(-1, -2) / math.sqrt(D)
        if causal:
            sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        outs.append((sc.softmax(-1) @ vb).transpose(0, 1))
    out = torch.cat(outs)
    grads = torch.autograd.grad(out, (q, k, v), data.dout_sets()[0].double())
    return out.detach(), grads


@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rotary"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_reference_matches_an_independent_float64(causal, rotary):
    data = ShapeData(Shape(16, 2, 64, 200, 0.5, 64, causal=causal), device="cpu")
    ref = Reference(data, grads=True, rotary=rotary)
    out, grads = independent(data, causal, rotary)
    rows = C.packed_rows
    assert ref.error(rows, out)[0] < 1e-12
    errs, n = ref.grad_errors(rows, grads)
    assert n == len(ref.blocks) > 0 and max(errs.values()) < 1e-12
    # bf16 rounding of the gradients reads as ~2e-3, far under the flag
    errs, _ = ref.grad_errors(rows, tuple(g.bfloat16() for g in grads))
    assert all(1e-4 < e < 5e-3 for e in errs.values()), errs
    # a wrong gradient is caught
    errs, _ = ref.grad_errors(rows, (grads[0], grads[1] * 1.1, grads[2]))
    assert errs["dk"] > 0.05 and errs["dq"] < 1e-12


def test_one_token_blocks_do_not_read_as_infinite_error():
    data = ShapeData(Shape(64, 2, 64, 130, 0.5, 64), device="cpu")
    ref = Reference(data, grads=True)
    assert (ref.lens == 1).any() or True  # the floor matters only when one is sampled
    _, grads = independent(data, False, False)
    noisy = tuple(g + 1e-9 * torch.randn_like(g) for g in grads)
    errs, _ = ref.grad_errors(C.packed_rows, noisy)
    assert max(errs.values()) < 1e-3


def test_rotary_table_layout():
    data = ShapeData(Shape(4, 1, 64, 40, 0.5, 16, dtype="fp16"), device="cpu")
    tab = data.rotary_table()
    assert tab.shape == (data.total, 64) and tab.dtype == torch.float16 and tab.is_contiguous()
    first = data.table.offsets[:-1]
    # position 0 of every sequence: sin 0, cos 1
    for s, n in zip(first, data.lengths):
        if n:
            assert torch.all(tab[s, :32] == 0) and torch.all(tab[s, 32:] == 1)
    # the rotary the peers use equals the float64 one
    x = torch.randn(data.total, 3, 64, dtype=torch.float16)
    got = C.make_rotary()(x, tab[:, :32], tab[:, 32:]).double()
    want = C._rotary64(x.double()[None], tab.double()[None, :, None, :])[0]
    assert ((got - want).norm() / want.norm()).item() < 2e-3


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_autograd_backward_and_rotary_on_a_cpu_peer(cpu_cuda, causal):
    peer = SdpaMath()
    peer.setup("quick")
    data = ShapeData(Shape(12, 2, 64, 150, 0.5, 32, causal=causal, dtype="fp16"), device="cpu")
    diff = peer.differentiable(data, "quick")
    assert diff.layout == "padded"
    assert causal or "key-padding mask" in diff.note  # partial blocks masked
    prep = C.autograd_backward(data, diff)
    assert prep.pre is None  # retain_graph accepted
    ref = Reference(data, grads=True)
    with prep.context():
        grads = prep.run(0)
        grads_again = prep.run(0)  # the retained graph runs again
    errs, n = ref.grad_errors(prep.rows, grads, prep.exact)
    assert n > 0 and max(errs.values()) < 1e-2, errs
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_again))
    # the rotary pipeline: errors of the output and gradients with rotary
    monkey_eager = C.rotary_function(compiled=False)
    C._rotary_fn = monkey_eager
    try:
        rprep = C.autograd_rotary(data, diff)
        rref = Reference(data, grads=True, rotary=True)
        with rprep.context():
            out, g = rprep.check(0)
        errs, _ = rref.grad_errors(rprep.rows, g, rprep.exact)
        errs["out"], _ = rref.error(rprep.out_rows, out, rprep.exact)
        assert max(errs.values()) < 2e-2, errs
        # without the rotary the same gradients would be far off: it was applied
        plain, _ = ref.grad_errors(rprep.rows, g, rprep.exact)
        assert plain["dq"] > 0.05
    finally:
        C._rotary_fn = None


def test_retain_graph_refusal_falls_back_to_a_forward_per_call(cpu_cuda):
    calls = {"n": 0}

    class RefusesRetain(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return q * 1 + k * 0 + v * 0

        @staticmethod
        def backward(ctx, g):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("This backward function was compiled with non-empty donated "
                                   "buffers which requires create_graph=False and "
                                   "retain_graph=False")
            return g, g * 0, g * 0

    data = ShapeData(Shape(4, 1, 64, 40, 0.5, 16, dtype="fp16"), device="cpu")
    diff = C.Differentiable(lambda q, k, v: RefusesRetain.apply(q, k, v), "packed",
                            C.packed_rows, note="x")
    prep = C.autograd_backward(data, diff)
    assert prep.pre is not None and "forward re-run" in prep.note
    med, lo, iters = C.timed_iters(prep.run, data.nsets, "quick", pre=prep.pre)
    assert iters >= 20 and med >= 0


def test_worker_passes_end_to_end(cpu_cuda):
    """bench.py's per-pass functions on a CPU peer: records with errors per
    gradient, the pass's byte count, a time."""
    peer = SdpaMath()
    peer.setup("quick")
    data = ShapeData(Shape(8, 2, 64, 150, 0.5, 32, dtype="fp16"), device="cpu")
    C._rotary_fn = C.rotary_function(compiled=False)
    try:
        for pass_ in ("fwd", "bwd", "rot"):
            rec = {"stats": C.pass_stats(data.stats, pass_)}
            if pass_ == "fwd":
                bench._run_forward(peer, data, "quick", rec, time.perf_counter())
            else:
                bench._run_grad(peer, data, "quick", rec, time.perf_counter(), pass_)
            assert rec["ok"] and rec["ms"] > 0 and rec["iters"] >= 20 and not rec["nan"]
            assert rec["err"] < 1e-2, rec
            if pass_ != "fwd":
                assert set(rec["errs"]) == ({"dq", "dk", "dv"} | ({"out"} if pass_ == "rot" else set()))
                assert rec["err"] == max(rec["errs"].values())
    finally:
        C._rotary_fn = None


def test_attngen_rows_for_shapes_validation_refuses(cpu_cuda):
    """attngen's rotary rows are 'unavailable: ... not supported (<the C
    message>)' for a shape the kernels do not fit: 256-token blocks at
    head_dim 128 with a rotary table, whose rows beside the forward's Q, K,
    V overflow shared memory (needs libattngen.so; no GPU: the refusal
    comes before any build)."""
    from peers.attngen_peer import AttngenPeer
    peer = AttngenPeer()
    try:
        peer.setup("quick")
    except C.Unavailable as e:
        pytest.skip(str(e))
    data = ShapeData(Shape(2, 1, 128, 300, 0.5, 256, dtype="bf16"), device="cpu")
    with pytest.raises(C.Unavailable) as ei:
        peer.prepare_rotary(data, "quick")
    msg = str(ei.value)
    assert msg.startswith("rotary with the backward not supported (") and "\n" not in msg
    # the forward's table rows only: the backward walks such blocks in
    # chunks, rotated, and reads the table in global memory
    assert "error: not supported yet: rotary positions from a table at block_size 256" in msg
    assert msg.count("error:") == 1


@pytest.mark.skipif(not os.environ.get("ATTNGEN_TRITON_INTERPRET_TEST", "1") == "1",
                    reason="disabled")
def _interpreted_worst(code):
    """(the WORST figure it prints, its stdout) of `code` run in a subprocess
    under Triton's interpreter (TRITON_INTERPRET must be set before the
    kernels are defined)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return float(r.stdout.split("WORST")[1]), r.stdout


def test_triton_kernels_in_the_interpreter():
    """The plain Triton forward and backward kernels, run by Triton's
    interpreter on the CPU (fp16: the interpreter's bf16 is not faithful),
    against the float64 reference. In a subprocess: TRITON_INTERPRET must be
    set before the kernels are defined."""
    pytest.importorskip("triton", reason="triton is not installed")
    code = r'''
import sys
sys.path.insert(0, %r)
from peers.common import Shape, ShapeData, Reference, packed_rows
from peers import triton_block as TB
worst = 0.0
for causal in (False, True):
    data = ShapeData(Shape(6, 2, 64, 100, 0.5, 32, causal=causal, dtype="fp16"), device="cpu")
    ref = Reference(data, grads=True)
    fwd, bwd = TB.TritonPeer()._launchers(data)
    q, k, v = data.sets[0]
    e, _ = ref.error(packed_rows, fwd(q, k, v, (4, 1)))
    errs, _ = ref.grad_errors(packed_rows, bwd(q, k, v, data.dout_sets()[0], (4, 1)))
    worst = max([worst, e] + list(errs.values()))
print("WORST %%.3e" %% worst)
''' % BENCH
    worst, stdout = _interpreted_worst(code)
    assert worst < 2e-3, stdout


def test_triton_rotary_in_the_interpreter():
    """The Triton rotary peer (peers/rope_triton.py), in Triton's interpreter
    on the CPU: both layouts, fp32 tables and the 16-bit halves of a sin |
    cos table [T, D] (strided rows), forward equal to the PyTorch rotary's
    fp32 math to one rounding, the inverse undoing it, and autograd's
    gradient the inverse rotation of the output gradient."""
    pytest.importorskip("triton", reason="triton is not installed")
    code = r'''
import sys
sys.path.insert(0, %r)
import torch
from peers import rope_triton as R
from peers.common import make_rotary
torch.manual_seed(0)
T, H, D = 37, 3, 64
x = torch.randn(T, H, D).half()
ang = torch.rand(T, D // 2) * 6.283
tab = torch.cat([ang.sin(), ang.cos()], 1).half()          # [T, D]: sin | cos
sin16, cos16 = tab[:, :D // 2], tab[:, D // 2:]           # strided views
worst = 0.0
def check(a, b):
    global worst
    worst = max(worst, (a.float() - b.float()).abs().max().item())
# interleaved, 16-bit strided tables: as the PyTorch rotary
check(R.rotate(x, cos16, sin16, layout="interleaved"), make_rotary()(x, sin16, cos16))
# half layout, fp32 tables
c, s = ang.cos(), ang.sin()
x1, x2 = x.float()[..., :D // 2], x.float()[..., D // 2:]
want = torch.cat([x1 * c[:, None] - x2 * s[:, None], x1 * s[:, None] + x2 * c[:, None]], -1)
check(R.rotate(x, c, s), want.half())
# inverse undoes, both layouts (two roundings)
for layout in ("half", "interleaved"):
    y = R.rotate(x, c, s, layout=layout)
    check(R.rotate(y, c, s, inverse=True, layout=layout) * 0.5, x * 0.5)
# autograd: the gradient is the inverse rotation of dy
xg = x.clone().requires_grad_()
dy = torch.randn(T, H, D).half()
R.function().apply(xg, cos16, sin16, "interleaved").backward(dy)
check(xg.grad, R.rotate(dy, cos16, sin16, inverse=True, layout="interleaved"))
print("WORST %%.3e" %% worst)
''' % BENCH
    worst, stdout = _interpreted_worst(code)
    assert worst < 8e-3, stdout


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gran", [None, 128])
def test_flex_block_mask_is_block_diagonal(causal, gran):
    """peers/flex.py's BlockMask, built from block lists at the pattern's
    block size or at 128 tokens (the backward's fallback), keeps exactly the
    block-diagonal pairs: eager flex_attention (which evaluates the
    mask_mod on every pair) equals dense attention under the reference
    mask, with partial blocks and a length not a multiple of 128."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    from peers.flex import block_lists_mask
    bs = 64
    blen = torch.tensor([64, 30, 64, 5, 17], dtype=torch.int32)
    S = len(blen) * bs
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, S, 64, generator=g) for _ in range(3))
    keep = torch.zeros(S, S, dtype=torch.bool)
    for b, n in enumerate(blen.tolist()):
        for i in range(bs):
            hi = min(n, i + 1) if causal else n
            keep[b * bs + i, b * bs:b * bs + hi] = True
    s = (q @ k.transpose(-1, -2)) / 8.0
    want = torch.nan_to_num(torch.softmax(s.masked_fill(~keep, float("-inf")), -1)) @ v
    bm, _ = block_lists_mask(fa.BlockMask, blen, bs, causal, gran)
    got = fa.flex_attention(q, k, v, block_mask=bm)
    # rows that see no key: flex gives 0, as the reference after nan_to_num
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    # The block lists, as the compiled kernel reads them (eager flex reads
    # only the mask_mod): masked blocks through the mask_mod, full blocks
    # whole, nothing else.
    g = gran or bs
    dense = torch.zeros(S, S, dtype=torch.bool)
    qi = torch.arange(S).view(-1, 1)
    ki = torch.arange(S).view(1, -1)
    mm = bm.mask_mod(0, 0, qi, ki)
    nb = -(-S // g)
    for i in range(nb):
        rows = slice(i * g, min(S, (i + 1) * g))
        for j in bm.kv_indices[0, 0, i, :int(bm.kv_num_blocks[0, 0, i])].tolist():
            cols = slice(j * g, min(S, (j + 1) * g))
            dense[rows, cols] |= mm[rows, cols]
        for j in bm.full_kv_indices[0, 0, i, :int(bm.full_kv_num_blocks[0, 0, i])].tolist():
            dense[rows, slice(j * g, min(S, (j + 1) * g))] = True
    assert torch.equal(dense, keep)
