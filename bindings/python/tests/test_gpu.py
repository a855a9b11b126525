# SPDX-License-Identifier: BSD-3-Clause
"""GPU tests of attngen's PyTorch binding against a float64 reference.

Need torch with CUDA, a GPU and libattngen.so (`make build/libattngen.so`,
or ATTNGEN_LIB); every test here is skipped with the reason otherwise.
Outputs (and gradients) are poisoned with NaN before each launch (through
the internal `_poison` option), so a row the kernel fails to write shows up
as NaN.

The backward tests compare dq, dk, dv with float64 PyTorch autograd; the
rotary tests rotate the float64 inputs first (gradients with respect to the
unrotated inputs, through the rotation).
"""
import math
import os

import pytest

import attngen
from gpu_env import need_gpu_and_lib

torch = pytest.importorskip("torch", reason="torch is not installed")
from rope64 import rotate64  # noqa: E402 (needs torch)

pytestmark = pytest.mark.gpu

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
# relative Frobenius error of each of dq, dk, dv against float64 autograd
GRAD_TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


@pytest.fixture(scope="module", autouse=True)
def _need_gpu_and_lib():
    need_gpu_and_lib(torch, attngen)


@pytest.fixture(scope="module", autouse=True)
def _precompile(_need_gpu_and_lib):
    """Build the kernels of the parametrized test in parallel (NVRTC runs with
    the GIL released); a failure here is left for the test itself to report."""
    import concurrent.futures as cf
    keys = [(b, c, d, t, None) for t in ("bf16", "fp16") for d in (64, 128)
            for b in (16, 64, 128) for c in (False, True)]
    keys = [(key, False) for key in keys] + [(key, True) for key in keys]
    dev = torch.cuda.current_device()

    def build(item):
        key, backward = item
        try:
            attngen.kernel_for(*key, backward=backward).handle(dev)
        except Exception:  # a real failure the test itself will show
            pass

    with cf.ThreadPoolExecutor(max_workers=8) as ex:
        list(ex.map(build, keys))


def attention64(q64, k64, v64, offsets, block, causal, scale=None):
    """Block-diagonal attention on float64 tensors [total, H, D] (on any
    device, differentiable): each sequence cut into blocks of `block` tokens
    from its own start, each block attending to itself (causally when
    asked)."""
    d = q64.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    pieces = []
    for s, e in zip(offsets[:-1], offsets[1:]):
        for b0 in range(s, e, block):
            b1 = min(b0 + block, e)
            qb, kb, vb = (t[b0:b1].transpose(0, 1) for t in (q64, k64, v64))  # [H, n, D]
            sc = qb @ kb.transpose(-1, -2) * scale
            if causal:
                n = b1 - b0
                mask = torch.ones(n, n, dtype=torch.bool, device=sc.device).triu(1)
                sc = sc.masked_fill(mask, float("-inf"))
            pieces.append((torch.softmax(sc, dim=-1) @ vb).transpose(0, 1))
    if not pieces:
        return q64 * 0
    return torch.cat(pieces)  # blocks are contiguous and in order: every token once


def reference(q, k, v, offsets, block, causal, scale=None):
    """The forward in float64 on the CPU."""
    q64, k64, v64 = (t.detach().double().cpu() for t in (q, k, v))
    return attention64(q64, k64, v64, offsets, block, causal, scale)


def reference_grads(q, k, v, dout, offsets, block, causal, scale=None):
    """dq, dk, dv in float64 by PyTorch autograd through attention64."""
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    out = attention64(*leaves, offsets, block, causal, scale)
    return torch.autograd.grad(out, leaves, dout.detach().double().cpu(), allow_unused=True)


def grad_errors(got, ref):
    """Relative Frobenius error of each gradient (dq, dk, dv)."""
    errs = []
    for g, r in zip(got, ref):
        g = g.double().cpu()
        errs.append(((g - r).norm() / r.norm().clamp_min(1e-300)).item())
    return errs


def block_errors(out, ref, offsets, block):
    """(relative Frobenius error overall, worst relative error of one block)."""
    o = out.double().cpu()
    overall = ((o - ref).norm() / ref.norm().clamp_min(1e-300)).item()
    worst = 0.0
    for s, e in zip(offsets[:-1], offsets[1:]):
        for b0 in range(s, e, block):
            b1 = min(b0 + block, e)
            r = ref[b0:b1].norm().item()
            worst = max(worst, (o[b0:b1] - ref[b0:b1]).norm().item() / max(r, 1e-300))
    return overall, worst


def make_inputs(lengths, heads, head_dim, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=dtype, generator=g)
               for _ in range(3))
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return q, k, v, torch.tensor(offsets, dtype=torch.int32, device="cuda"), offsets


def lengths_for(block):
    # empty, length-1, partial, exact, one-past, several blocks, empty again
    return [0, 1, block - 1, block, block + 1, 2 * block + 5, 0, 3 * block, 37, 1, 5 * block + 3]


def check(out, q, k, v, offsets, block, causal, scale=None):
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    assert not torch.isnan(out).any(), "rows left unwritten (NaN poison survived)"
    ref = reference(q, k, v, offsets, block, causal, scale)
    overall, worst = block_errors(out, ref, offsets, block)
    tol = TOL[q.dtype]
    assert overall <= tol, "relative Frobenius error %.3g > %.3g" % (overall, tol)
    assert worst <= 3 * tol, "worst block relative error %.3g > %.3g" % (worst, 3 * tol)
    return overall


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("block", [16, 64, 128])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_block_attention_matches_float64(dtype, head_dim, block, causal):
    lengths = lengths_for(block)
    q, k, v, off, off_list = make_inputs(lengths, 3, head_dim, dtype, seed=block + head_dim)
    out = attngen.block_attention(q, k, v, off, off_list, block_size=block, causal=causal,
                                  _poison=True)
    torch.cuda.synchronize()
    check(out, q, k, v, off_list, block, causal)


def test_many_sequences_default_options():
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(0, 300, (96,), generator=g).tolist()
    q, k, v, off, off_list = make_inputs(lengths, 4, 128, torch.bfloat16, seed=1)
    out = attngen.block_attention(q, k, v, off, _poison=True)
    torch.cuda.synchronize()
    check(out, q, k, v, off_list, 64, False)
    # Meta's entry point gives the same result
    out2 = attngen.block_attention_api(q, k, v, off, off_list)
    torch.cuda.synchronize()
    assert torch.equal(out, out2)


def test_softmax_scale():
    lengths = [70, 5, 128]
    q, k, v, off, off_list = make_inputs(lengths, 2, 64, torch.float16, seed=3)
    out = attngen.block_attention(q, k, v, off, block_size=64, softmax_scale=0.05, _poison=True)
    torch.cuda.synchronize()
    check(out, q, k, v, off_list, 64, False, scale=0.05)
    assert attngen.kernel_for(64, False, 64, "fp16", 0.05).name == "torch_block64_d64_fp16_s0p05"


def test_runs_on_the_current_stream():
    lengths = [200, 64, 3]
    q, k, v, off, off_list = make_inputs(lengths, 2, 128, torch.bfloat16, seed=4)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = attngen.block_attention(q, k, v, off, _poison=True)
    s.synchronize()
    check(out, q, k, v, off_list, 64, False)


def test_empty_inputs():
    q, k, v, off, _ = make_inputs([], 2, 64, torch.bfloat16)
    assert attngen.block_attention(q, k, v, off).shape == (0, 2, 64)
    q, k, v, off, _ = make_inputs([0, 0], 2, 64, torch.bfloat16)
    assert attngen.block_attention(q, k, v, off, [0, 0, 0]).shape == (0, 2, 64)


def test_loaded_kernel_object():
    kernel = attngen.load(os.path.join(REPO, "specs", "ads_block64_d64_fp16.yaml"))
    assert kernel.spec.dtype == "fp16" and kernel.spec.head_dim == 64
    lengths = [100, 1, 64]
    q, k, v, off, off_list = make_inputs(lengths, 4, 64, torch.float16, seed=5)
    out = kernel(q, k, v, off, off_list, _poison=True)
    torch.cuda.synchronize()
    check(out, q, k, v, off_list, 64, False)
    with pytest.raises(ValueError, match="is for fp16 tensors, got torch.bfloat16"):
        kernel(q.bfloat16(), k.bfloat16(), v.bfloat16(), off)
    causal = attngen.load(os.path.join(REPO, "specs", "block128_d128_causal.yaml"))
    q, k, v, off, off_list = make_inputs([300, 17], 2, 128, torch.bfloat16, seed=6)
    out = causal(q, k, v, off, _poison=True)
    torch.cuda.synchronize()
    check(out, q, k, v, off_list, 128, True, scale=0.05)


def check_grads(q, k, v, dout, off_list, block, causal, scale=None):
    """q.grad, k.grad, v.grad against float64 autograd: shape, dtype, no
    NaN (poison), relative Frobenius error per gradient."""
    got = (q.grad, k.grad, v.grad)
    for name, g in zip("qkv", got):
        assert g is not None, "d%s missing" % name
        assert g.shape == q.shape and g.dtype == q.dtype
        assert not torch.isnan(g).any(), "d%s: rows left unwritten (NaN poison survived)" % name
    ref = reference_grads(q, k, v, dout, off_list, block, causal, scale)
    errs = grad_errors(got, ref)
    tol = GRAD_TOL[q.dtype]
    for name, err in zip(("dq", "dk", "dv"), errs):
        assert err <= tol, "%s: relative Frobenius error %.3g > %.3g (all: %s)" % (
            name, err, tol, ["%.2e" % x for x in errs])
    return errs


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("block", [16, 64, 128])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_block_attention_backward_matches_float64(dtype, head_dim, block, causal):
    lengths = lengths_for(block)  # 0, 1, partial, exact, multi-block, ...
    q, k, v, off, off_list = make_inputs(lengths, 3, head_dim, dtype, seed=100 + block + head_dim)
    for t in (q, k, v):
        t.requires_grad_()
    out = attngen.block_attention(q, k, v, off, off_list, block_size=block, causal=causal,
                                  _poison=True)
    assert out.requires_grad
    dout = torch.randn_like(out)
    out.backward(dout)
    torch.cuda.synchronize()
    check(out.detach(), q, k, v, off_list, block, causal)  # the grad kernel's forward too
    check_grads(q, k, v, dout, off_list, block, causal)
    # the kernel alone, outside autograd, gives the same bits
    kernel = attngen.kernel_for(block, causal, head_dim,
                                "bf16" if dtype == torch.bfloat16 else "fp16", backward=True)
    dq, dk, dv = kernel.backward(q.detach(), k.detach(), v.detach(), dout, off, off_list)
    torch.cuda.synchronize()
    assert torch.equal(dq, q.grad) and torch.equal(dk, k.grad) and torch.equal(dv, v.grad)


def test_backward_many_sequences_and_meta_entry_point():
    g = torch.Generator().manual_seed(11)
    lengths = torch.randint(0, 300, (96,), generator=g).tolist()
    q, k, v, off, off_list = make_inputs(lengths, 4, 128, torch.bfloat16, seed=12)
    for t in (q, k, v):
        t.requires_grad_()
    out = attngen.block_attention_api(q, k, v, off, off_list)
    dout = torch.randn_like(out)
    out.backward(dout)
    torch.cuda.synchronize()
    check_grads(q, k, v, dout, off_list, 64, False)


def test_backward_softmax_scale_and_strided_dout():
    lengths = [70, 5, 128, 1]
    q, k, v, off, off_list = make_inputs(lengths, 2, 64, torch.float16, seed=13)
    for t in (q, k, v):
        t.requires_grad_()
    out = attngen.block_attention(q, k, v, off, block_size=64, softmax_scale=0.05, _poison=True)
    # a non-contiguous output gradient: the binding makes it contiguous
    dout = torch.randn(2, out.shape[0], 64, device="cuda", dtype=out.dtype).transpose(0, 1)
    assert not dout.is_contiguous()
    out.backward(dout)
    torch.cuda.synchronize()
    check_grads(q, k, v, dout, off_list, 64, False, scale=0.05)


def test_backward_only_requested_gradients_and_chain_rule():
    lengths = [100, 64, 3]
    q, k, v, off, off_list = make_inputs(lengths, 2, 128, torch.bfloat16, seed=14)
    v.requires_grad_()
    w = torch.randn_like(q)
    out = attngen.block_attention(q, k, v, off, causal=True)
    (out.float() * w.float()).sum().backward()  # dL/dout = w, through a cast
    torch.cuda.synchronize()
    assert q.grad is None and k.grad is None and v.grad is not None
    ref = reference_grads(q, k, v, w, off_list, 64, True)
    (err,) = grad_errors([v.grad], [ref[2]])
    assert err <= GRAD_TOL[torch.bfloat16]


def test_backward_runs_on_the_current_stream():
    lengths = [200, 64, 3]
    q, k, v, off, off_list = make_inputs(lengths, 2, 128, torch.bfloat16, seed=15)
    for t in (q, k, v):
        t.requires_grad_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = attngen.block_attention(q, k, v, off, _poison=True)
        dout = torch.randn_like(out)
        out.backward(dout)
    s.synchronize()
    check_grads(q, k, v, dout, off_list, 64, False)


def test_backward_empty_inputs():
    q, k, v, off, _ = make_inputs([0, 0], 2, 64, torch.bfloat16)
    for t in (q, k, v):
        t.requires_grad_()
    out = attngen.block_attention(q, k, v, off, [0, 0, 0])
    out.backward(torch.zeros_like(out))
    assert q.grad.shape == (0, 2, 64) and v.grad.shape == (0, 2, 64)


def test_backward_of_a_loaded_forward_only_kernel():
    kernel = attngen.load(os.path.join(REPO, "specs", "ads_block64_d64_fp16.yaml"))
    assert not kernel.supports("backward")
    q, k, v, off, _ = make_inputs([70, 10], 2, 64, torch.float16)
    q.requires_grad_()
    out = kernel(q, k, v, off)
    with pytest.raises(NotImplementedError, match="has no backward pass"):
        out.sum().backward()


def test_backward_beyond_the_kernels_shared_memory():
    """block 256 at head_dim 128: the forward runs with inputs that require
    grad; the backward is refused (validation reports the plan's
    shared-memory limit) with a message that says so, or, should the kernel
    ever fit it, is right."""
    q, k, v, off, off_list = make_inputs([300, 17], 2, 128, torch.bfloat16, seed=16)
    q.requires_grad_()
    out = attngen.block_attention(q, k, v, off, block_size=256, _poison=True)
    torch.cuda.synchronize()
    check(out.detach(), q, k, v, off_list, 256, False)
    dout = torch.randn_like(out)
    try:
        out.backward(dout)
    except attngen.UnsupportedError as e:
        msg = str(e)
        assert msg.startswith("attngen: the backward pass is not supported for these options: ")
        assert "block_size 256 with head_dim 128" in msg, msg
        return
    torch.cuda.synchronize()
    ref = reference_grads(q, k, v, dout, off_list, 256, False)
    (err,) = grad_errors([q.grad], [ref[0]])
    assert err <= GRAD_TOL[torch.bfloat16]


# ---- rotary embeddings ---------------------------------------------------------



def computed_table64(offsets, block, head_dim, positions, base):
    """The float64 sin | cos the kernel computes: angle p * base^(-2i / D),
    p the token's index in its sequence, or in its block."""
    pos = []
    for s, e in zip(offsets[:-1], offsets[1:]):
        pos += [(t - s) % block if positions == "block" else t - s for t in range(s, e)]
    p = torch.tensor(pos, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return torch.cat((torch.sin(p * inv), torch.cos(p * inv)), dim=-1)


def rotary_reference(q, k, v, dout, offsets, block, causal, rotary, table64):
    """The output and dq, dk, dv (with respect to the unrotated inputs) in
    float64: the tensors of apply_to rotated, then attention64."""
    leaves = [t.detach().double().cpu().requires_grad_() for t in (q, k, v)]
    rotated = [rotate64(x, table64, rotary["layout"]) if n in rotary["apply_to"] else x
               for n, x in zip("qkv", leaves)]
    out = attention64(*rotated, offsets, block, causal)
    grads = torch.autograd.grad(out, leaves, dout.detach().double().cpu())
    return out.detach(), grads


@pytest.mark.parametrize("layout,apply_to,positions,dtype,head_dim,block,causal", [
    ("interleaved", ["q", "k"], "table", torch.bfloat16, 128, 64, False),  # Meta's
    ("half", ["q", "k", "v"], "sequence", torch.float16, 64, 64, True),
    ("interleaved", ["q", "k", "v"], "block", torch.bfloat16, 64, 16, True),
    ("half", ["q", "k"], "table", torch.float16, 128, 128, False),
], ids=["interleaved-qk-table", "half-qkv-sequence", "interleaved-qkv-block", "half-qk-table"])
def test_rotary_forward_and_backward_match_float64(layout, apply_to, positions, dtype, head_dim,
                                                   block, causal):
    lengths = lengths_for(block)
    q, k, v, off, off_list = make_inputs(lengths, 3, head_dim, dtype, seed=200 + block)
    for t in (q, k, v):
        t.requires_grad_()
    rotary = {"layout": layout, "apply_to": apply_to, "positions": positions}
    table = None
    if positions == "table":
        g = torch.Generator().manual_seed(block)
        angles = (torch.rand(q.shape[0], head_dim // 2, generator=g, dtype=torch.float64) - 0.5) \
            * 2 * math.pi
        table = torch.cat((angles.sin(), angles.cos()), dim=-1).to(dtype).cuda()
        table64 = table.double().cpu()  # the values as stored, as the kernel reads them
    else:
        rotary["base"] = 10000.0
        table64 = computed_table64(off_list, block, head_dim, positions, 10000.0)
    out = attngen.block_attention(q, k, v, off, off_list, block_size=block, causal=causal,
                                  rotary=rotary, rotary_table=table, _poison=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    torch.cuda.synchronize()
    ref_out, ref_grads = rotary_reference(q, k, v, dout, off_list, block, causal, rotary, table64)
    assert not torch.isnan(out).any(), "rows left unwritten (NaN poison survived)"
    overall, worst = block_errors(out.detach(), ref_out, off_list, block)
    assert overall <= TOL[dtype], "output: relative Frobenius error %.3g" % overall
    got = (q.grad, k.grad, v.grad)
    for name, g_ in zip(("dq", "dk", "dv"), got):
        assert g_ is not None and not torch.isnan(g_).any(), "%s missing or unwritten" % name
    errs = grad_errors(got, ref_grads)
    for name, err in zip(("dq", "dk", "dv"), errs):
        assert err <= GRAD_TOL[dtype], "%s: relative Frobenius error %.3g > %.3g (all: %s)" % (
            name, err, GRAD_TOL[dtype], ["%.2e" % x for x in errs])


def test_rotary_bundled_spec_and_kernel_backward():
    """specs/ads_block64_d128_rope.yaml through load(): the forward through
    autograd and Kernel.backward alone give the same gradients."""
    kernel = attngen.load(os.path.join(REPO, "specs", "ads_block64_d128_rope.yaml"))
    assert kernel.supports("backward") and kernel.spec.rotary["positions"] == "table"
    q, k, v, off, off_list = make_inputs([100, 1, 64, 130], 2, 128, torch.bfloat16, seed=21)
    angles = torch.rand(q.shape[0], 64, dtype=torch.float64) * 2 * math.pi
    table = torch.cat((angles.sin(), angles.cos()), dim=-1).to(torch.bfloat16).cuda()
    with pytest.raises(ValueError, match="pass rotary_table"):
        kernel(q, k, v, off)
    for t in (q, k, v):
        t.requires_grad_()
    out = kernel(q, k, v, off, off_list, rotary_table=table, _poison=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    dq, dk, dv = kernel.backward(q.detach(), k.detach(), v.detach(), dout, off, off_list,
                                 rotary_table=table)
    torch.cuda.synchronize()
    assert torch.equal(dq, q.grad) and torch.equal(dk, k.grad) and torch.equal(dv, v.grad)
    rotary = {"layout": "interleaved", "apply_to": ["q", "k"]}
    ref_out, ref_grads = rotary_reference(q, k, v, dout, off_list, 64, False, rotary,
                                          table.double().cpu())
    overall, _ = block_errors(out.detach(), ref_out, off_list, 64)
    assert overall <= TOL[torch.bfloat16]
    for err in grad_errors((q.grad, k.grad, v.grad), ref_grads):
        assert err <= GRAD_TOL[torch.bfloat16]


def test_argument_errors_on_real_tensors():
    q, k, v, off, off_list = make_inputs([70, 10], 2, 64, torch.bfloat16)
    base = torch.empty(q.numel() + 8, dtype=q.dtype, device="cuda")
    q_mis = base[1:1 + q.numel()].view(q.shape)
    with pytest.raises(ValueError, match="16-byte aligned"):
        attngen.block_attention(q_mis, k, v, off)
    # heads spaced (not a row stride): copied, same bits as the contiguous q
    q_t = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert not q_t.is_contiguous()
    assert torch.equal(attngen.block_attention(q_t, k, v, off), attngen.block_attention(q, k, v, off))
    with pytest.raises(ValueError, match="offsets must be torch.int32"):
        attngen.block_attention(q, k, v, off.long())
    with pytest.raises(ValueError, match="same device"):
        attngen.block_attention(q, k, v, off.cpu())
    with pytest.raises(ValueError, match="CUDA tensor"):
        attngen.block_attention(q.cpu(), k, v, off)
    with pytest.raises(ValueError, match=r"offsets\[-1\] must equal total_tokens"):
        attngen.block_attention(q, k, v, off, [0, 70, 79])
    with pytest.raises(ValueError, match="block_size"):
        attngen.block_attention(q, k, v, off, block_size=48 + 1)
    with pytest.raises(ValueError, match="head_dim"):
        attngen.block_attention(q[..., :32].contiguous(), k[..., :32].contiguous(),
                                v[..., :32].contiguous(), off)

