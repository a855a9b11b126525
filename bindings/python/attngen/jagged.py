"""jagged_attention: attention over jagged (variable-length) sequences
packed back to back, named and ordered like FlashAttention's
flash_attn_varlen_func, with its autograd Function.

Each sequence b's queries, rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q,
attend to its keys, rows [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k and v.
Lengths are run-time data: one compiled kernel serves every batch (no
max_seqlen, no recompilation). torch is imported on first use only.
"""

import ctypes
import threading

from . import _errors, _lib, _spec, _validate
from .ops import _Refused, _device_index, _dout_for, _needs_grad, _torch, load

_kernel_lock = threading.Lock()
# (head_dim, dtype_tag, causal, window, scale, deterministic, backward) -> Kernel,
# or the _Refused of an UnsupportedError from spec validation
_kernels = {}

BACKWARD_LEAD = "attngen: the jagged backward pass is not supported for these options"


def _need_entry(name):
    if not _lib.has(name):
        raise _errors.UnsupportedError(
            "attngen: the loaded libattngen.so has no %s (built before the jagged pattern); "
            "rebuild it with `make build/libattngen.so`" % name)


def jagged_kernel_for(head_dim=128, dtype="bf16", causal=False, window=None, softmax_scale=None,
                      deterministic=False, backward=False):
    """The (cached) Kernel jagged_attention uses for these options (window:
    None or the spec's (left, right), as _validate.check_window_size
    returns it). Raises UnsupportedError with spec validation's message for
    options attngen cannot build."""
    window = None if window is None else (int(window[0]), int(window[1]))
    key = (int(head_dim), dtype, bool(causal), window, softmax_scale, bool(deterministic),
           bool(backward))
    k = _kernels.get(key)
    if k is None:
        with _kernel_lock:
            k = _kernels.get(key)
            if k is None:
                spec = _spec.jagged_spec(head_dim, dtype, causal, window, softmax_scale,
                                         deterministic, backward=bool(backward))
                try:
                    k = load(spec, compile=False)
                except _errors.UnsupportedError as e:
                    k = _Refused.from_error(e)
                _kernels[key] = k
    if isinstance(k, _Refused):
        raise k.error()
    return k


def _grad_kernel(opts, device_index):
    """(kernel, refusal): the kernel with both passes and None, or the
    forward-only kernel and the _Refused its backward raises."""
    try:
        kernel = jagged_kernel_for(*opts, backward=True)
        kernel.handle(device_index)
        return kernel, None
    except _errors.UnsupportedError as e:
        return jagged_kernel_for(*opts), _Refused.from_error(e, BACKWARD_LEAD)


def _alloc_like(torch, like, poison):
    if poison:
        return torch.full_like(like, float("nan"), memory_format=torch.contiguous_format)
    return torch.empty_like(like, memory_format=torch.contiguous_format)


def _stream(torch, q):
    s = torch.cuda.current_stream(q.device).cuda_stream
    return ctypes.c_void_p(s or None)


def _forward_raw(kernel, q, k, v, cu_q, cu_k, batch, poison=False):
    """(out, lse) of the jagged forward on torch's current stream; no checks
    beyond the C launcher's."""
    torch = _torch()
    total_q, heads, _ = q.shape
    total_k, kv_heads, _ = k.shape
    out = _alloc_like(torch, q, poison)
    if poison:
        lse = torch.full((heads, total_q), float("nan"), dtype=torch.float32, device=q.device)
    else:
        lse = torch.empty((heads, total_q), dtype=torch.float32, device=q.device)
    if total_q == 0:
        return out, lse
    if batch == 0 or total_k == 0:
        # No key anywhere: every row sees none (output 0, logsumexp -inf). The
        # C launcher would refuse k's null pointer, so this is done here.
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    _need_entry("ag_jagged_forward")
    h = kernel.handle(_device_index(torch, q))
    args = _lib.AgJaggedFwdArgs(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(), lse=lse.data_ptr(),
        cu_seqlens_q=cu_q.data_ptr(), cu_seqlens_k=cu_k.data_ptr(), batch=batch, heads=heads,
        kv_heads=kv_heads, total_q=total_q, total_k=total_k)
    _lib.call("ag_jagged_forward", h, ctypes.byref(args), _stream(torch, q),
              context="attngen: jagged forward '%s'" % kernel.spec.name)
    return out, lse


def workspace_bytes(kernel_handle, heads, total_q):
    """Bytes of scratch the jagged backward needs with a kernel (its
    ag_kernel * handle): the C library's answer, 0 for a kernel that is not
    a jagged spec's with the backward pass. The fast sm_90a backward's is
    larger: it holds dQ's fp32 accumulator."""
    _need_entry("ag_jagged_backward_workspace_bytes")
    return int(_lib.lib().ag_jagged_backward_workspace_bytes(kernel_handle, int(heads),
                                                             int(total_q)))


def _backward_raw(kernel, dout, q, k, v, out, lse, cu_q, cu_k, batch, poison=False):
    """dq, dk, dv of the jagged backward for a contiguous, aligned dout like
    q (not checked), on torch's current stream."""
    torch = _torch()
    total_q, heads, _ = q.shape
    total_k, kv_heads, _ = k.shape
    dq, dk, dv = (_alloc_like(torch, t, poison) for t in (q, k, v))
    if total_q == 0 or total_k == 0 or batch == 0:
        # Nothing attends to anything: every gradient is 0.
        for t in (dq, dk, dv):
            t.zero_()
        return dq, dk, dv
    _need_entry("ag_jagged_backward")
    h = kernel.handle(_device_index(torch, q))
    nbytes = workspace_bytes(h, heads, total_q)
    if nbytes <= 0:
        raise RuntimeError("attngen: jagged backward '%s': the library gave no workspace size"
                           % kernel.spec.name)
    workspace = torch.empty((max(nbytes // 4, 1),), dtype=torch.float32, device=q.device)
    args = _lib.AgJaggedBwdArgs(
        q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(), dout=dout.data_ptr(),
        lse=lse.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(), dv=dv.data_ptr(),
        workspace=workspace.data_ptr(), cu_seqlens_q=cu_q.data_ptr(),
        cu_seqlens_k=cu_k.data_ptr(), batch=batch, heads=heads, kv_heads=kv_heads,
        total_q=total_q, total_k=total_k)
    _lib.call("ag_jagged_backward", h, ctypes.byref(args), _stream(torch, q),
              context="attngen: jagged backward '%s'" % kernel.spec.name)
    return dq, dk, dv


_autograd_cls = None


def _function():
    """The torch.autograd.Function, built on first use (needs torch)."""
    global _autograd_cls
    if _autograd_cls is not None:
        return _autograd_cls
    torch = _torch()
    once_differentiable = torch.autograd.function.once_differentiable

    class JaggedAttentionFunction(torch.autograd.Function):
        """Forward: ag_jagged_forward (output and logsumexp). Backward:
        ag_jagged_backward from q, k, v, the output, its logsumexp and dout
        (saved: q, k, v, out, lse and the two offsets), or the refusal
        recorded at forward time. The logsumexp output is not
        differentiable."""

        @staticmethod
        def forward(ctx, q, k, v, cu_q, cu_k, kernel, batch, poison, refused):
            out, lse = _forward_raw(kernel, q, k, v, cu_q, cu_k, batch, poison)
            ctx.kernel, ctx.batch, ctx.poison, ctx.refused = kernel, batch, poison, refused
            if refused is None and any(ctx.needs_input_grad[:3]):
                ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_out, grad_lse=None):
            if ctx.refused is not None:
                raise ctx.refused.error()
            q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
            dq, dk, dv = _backward_raw(ctx.kernel, _dout_for(grad_out, q), q, k, v, out, lse,
                                       cu_q, cu_k, ctx.batch, ctx.poison)
            need = ctx.needs_input_grad
            return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                    None, None, None, None, None, None)

    _autograd_cls = JaggedAttentionFunction
    return _autograd_cls


def jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k=None, max_seqlen_q=None,
                     max_seqlen_k=None, *, dropout_p=0.0, causal=False, window_size=(-1, -1),
                     softmax_scale=None, rotary=None, rotary_table=None, deterministic=False,
                     return_lse=False, _poison=False):
    """Attention over jagged sequences, a drop-in for FlashAttention's
    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k, causal=..., window_size=..., softmax_scale=...).

    q: [total_q, heads, head_dim]; k, v: [total_k, kv_heads, head_dim]
    (kv_heads divides heads: grouped-query attention, query head h reads key
    head h // (heads // kv_heads)); head_dim 64 or 128; bf16 or fp16,
    contiguous, on one CUDA device. cu_seqlens_q, cu_seqlens_k: int32
    [batch + 1] on that device, starting at 0, non-decreasing, ending at
    total_q and total_k (their values are not checked on the host: that
    would synchronize). cu_seqlens_k None: self-attention (cu_seqlens_q for
    both, total_k == total_q). max_seqlen_q, max_seqlen_k: accepted and
    unused (lengths are run-time data; one kernel serves every batch).

    causal: query i of a sequence with Lq queries and Lk keys sees key j <=
    i + Lk - Lq (aligned at the bottom right, as FlashAttention).
    window_size=(left, right): FlashAttention's sliding window, key j seen
    when i + Lk - Lq - left <= j <= i + Lk - Lq + right; -1 is unlimited.
    With causal the right side is capped at 0 (a right side > 0 raises
    ValueError); without causal (-1, 0) is the causal mask, and other
    windows with one unlimited side raise UnsupportedError. softmax_scale
    None means 1/sqrt(head_dim). dropout_p must be 0. deterministic=True
    asks the spec for `deterministic: true`: the backward's gradients are
    then bit-identical run to run (two kernels, no atomics); without it, on
    sm_90a, a faster backward adds dq with atomics, whose last bits vary
    (dk and dv are bit-identical either way). rotary / rotary_table: not
    supported with jagged sequences yet (UnsupportedError).

    Returns out (like q), or (out, lse) with return_lse=True: lse fp32
    [heads, total_q], each row's natural-log softmax denominator (-inf for a
    row that sees no key, whose output row is 0); lse is not differentiable.

    Differentiable: when grad mode is on and an input requires grad, the
    kernel is built with `passes: [forward, backward]` and autograd's
    backward runs ag_jagged_backward (dq, dk, dv; dk and dv summed over each
    key head's query heads). Runs asynchronously on torch's current CUDA
    stream. The first call for a new combination of options compiles a
    kernel (seconds; cached on disk afterwards). Bad arguments raise
    ValueError.
    """
    a = _validate.check_jagged_attention_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal,
                                              window_size, softmax_scale, rotary, rotary_table,
                                              deterministic, dropout_p)
    cu_k = a["cu_seqlens_k"]
    opts = (a["head_dim"], a["dtype_tag"], a["causal"], a["window"], a["softmax_scale"],
            a["deterministic"])
    if not _needs_grad(q, k, v):
        out, lse = _forward_raw(jagged_kernel_for(*opts), q, k, v, cu_seqlens_q, cu_k,
                                a["batch"], _poison)
    else:
        torch = _torch()
        kernel, refused = _grad_kernel(opts, _device_index(torch, q))
        out, lse = _function().apply(q, k, v, cu_seqlens_q, cu_k, kernel, a["batch"], _poison,
                                     refused)
    return (out, lse) if return_lse else out
