# SPDX-License-Identifier: BSD-3-Clause
"""jagged_attention: attention over jagged (variable-length) sequences
packed back to back, named and ordered like FlashAttention's
flash_attn_varlen_func, with its autograd Function.

Each sequence b's queries, rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q,
attend to its keys, rows [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k and v.
Lengths are run-time data: one compiled kernel serves every batch (no
max_seqlen, no recompilation). torch is imported on first use only.
"""

import threading

from . import _errors, _lib, _spec, _validate, torch_ops
from .ops import (_Refused, _alloc, _device_index, _dout_for, _needs_grad, _packed, _ptr,
                  _rotary_key, _stream_of, _torch, load)

_kernel_lock = threading.Lock()
# (head_dim, dtype_tag, causal, window, scale, deterministic, backward, rotary) -> Kernel,
# or the _Refused of an UnsupportedError from spec validation
_kernels = {}

BACKWARD_LEAD = "attngen: the jagged backward pass is not supported for these options"


def _need_entry(name):
    if not _lib.has(name):
        raise _errors.UnsupportedError(
            "attngen: the loaded libattngen.so has no %s (built before the jagged pattern); "
            "rebuild it with `make build/libattngen.so`" % name)


def jagged_kernel_for(head_dim=128, dtype="bf16", causal=False, window=None, softmax_scale=None,
                      deterministic=False, backward=False, rotary=None):
    """The (cached) Kernel jagged_attention uses for these options (window:
    None or the spec's (left, right), as _validate.check_window_size
    returns it; rotary: as jagged_attention's, positions "table" or
    "sequence"). Raises UnsupportedError with spec validation's message for
    options attngen cannot build."""
    window = None if window is None else (int(window[0]), int(window[1]))
    rotary = _validate.check_jagged_rotary(rotary)
    key = (int(head_dim), dtype, bool(causal), window, softmax_scale, bool(deterministic),
           bool(backward), _rotary_key(rotary))
    k = _kernels.get(key)
    if k is None:
        with _kernel_lock:
            k = _kernels.get(key)
            if k is None:
                spec = _spec.jagged_spec(head_dim, dtype, causal, window, softmax_scale,
                                         deterministic, backward=bool(backward), rotary=rotary)
                try:
                    k = load(spec, compile=False)
                except _errors.UnsupportedError as e:
                    k = _Refused.from_error(e)
                _kernels[key] = k
    if isinstance(k, _Refused):
        raise k.error()
    return k


def _grad_kernel(opts, rotary, device_index):
    """(kernel, refusal): the kernel with both passes and None, or the
    forward-only kernel and the _Refused its backward raises."""
    try:
        kernel = jagged_kernel_for(*opts, backward=True, rotary=rotary)
        kernel.handle(device_index)
        return kernel, None
    except _errors.UnsupportedError as e:
        return jagged_kernel_for(*opts, rotary=rotary), _Refused.from_error(e, BACKWARD_LEAD)


def _forward_raw(kernel, q, k, v, cu_q, cu_k, batch, poison=False, rotary_table=None,
                 rotary_table_k=None):
    """(out, lse) of the jagged forward on torch's current stream; no checks
    beyond the C launcher's. rotary_table / rotary_table_k: the queries' and
    keys' tables of a kernel with rotary positions from tables (keys' None:
    the queries'), else None."""
    torch = _torch()
    total_q, heads, _ = q.shape
    total_k, kv_heads, _ = k.shape
    out = _alloc(torch, q, poison)
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
    di = _device_index(torch, q)
    h = kernel._handle_of(di)
    args = _lib.PACK_JAGGED_FWD(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        cu_q.data_ptr(), cu_k.data_ptr(), batch, heads, kv_heads, total_q, total_k, 0, 0,
        _ptr(rotary_table), _ptr(rotary_table_k))
    _lib.call("ag_jagged_forward", h, args, _stream_of(torch, di),
              context=("attngen: jagged forward '%s'", kernel.spec.name))
    return out, lse


def workspace_bytes(kernel_handle, heads, total_q):
    """Bytes of scratch the jagged backward needs with a kernel (its
    ag_kernel * handle): the C library's answer, 0 for a kernel that is not
    a jagged spec's with the backward pass. The fast sm_90a backward's is
    larger: it holds dQ's fp32 accumulator."""
    _need_entry("ag_jagged_backward_workspace_bytes")
    return int(_lib.lib().ag_jagged_backward_workspace_bytes(kernel_handle, int(heads),
                                                             int(total_q)))


def _backward_raw(kernel, dout, q, k, v, out, lse, cu_q, cu_k, batch, poison=False,
                  rotary_table=None, rotary_table_k=None):
    """dq, dk, dv of the jagged backward for a contiguous, aligned dout like
    q (not checked), on torch's current stream: with respect to the
    unrotated q, k, v when the kernel rotates them (the forward's tables)."""
    torch = _torch()
    total_q, heads, _ = q.shape
    total_k, kv_heads, _ = k.shape
    dq, dk, dv = (_alloc(torch, t, poison) for t in (q, k, v))
    if total_q == 0 or total_k == 0 or batch == 0:
        # Nothing attends to anything: every gradient is 0.
        for t in (dq, dk, dv):
            t.zero_()
        return dq, dk, dv
    _need_entry("ag_jagged_backward")
    di = _device_index(torch, q)
    h = kernel._handle_of(di)
    nbytes = workspace_bytes(h, heads, total_q)
    if nbytes <= 0:
        raise RuntimeError("attngen: jagged backward '%s': the library gave no workspace size"
                           % kernel.spec.name)
    workspace = torch.empty((max(nbytes // 4, 1),), dtype=torch.float32, device=q.device)
    args = _lib.PACK_JAGGED_BWD(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(),
        lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), workspace.data_ptr(),
        cu_q.data_ptr(), cu_k.data_ptr(), batch, heads, kv_heads, total_q, total_k, 0, 0,
        _ptr(rotary_table), _ptr(rotary_table_k))
    _lib.call("ag_jagged_backward", h, args, _stream_of(torch, di),
              context=("attngen: jagged backward '%s'", kernel.spec.name))
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
        (saved: q, k, v, out, lse, the two offsets and the two rotary
        tables, None without), or the refusal recorded at forward time.
        The logsumexp output is not differentiable; the tables get no
        gradient."""

        @staticmethod
        def forward(ctx, q, k, v, cu_q, cu_k, kernel, batch, poison, refused, rotary_table,
                    rotary_table_k):
            out, lse = _forward_raw(kernel, q, k, v, cu_q, cu_k, batch, poison, rotary_table,
                                    rotary_table_k)
            ctx.kernel, ctx.batch, ctx.poison, ctx.refused = kernel, batch, poison, refused
            if refused is None and any(ctx.needs_input_grad[:3]):
                ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, rotary_table,
                                      rotary_table_k)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_out, grad_lse=None):
            if ctx.refused is not None:
                raise ctx.refused.error()
            q, k, v, out, lse, cu_q, cu_k, table, table_k = ctx.saved_tensors
            dq, dk, dv = _backward_raw(ctx.kernel, _dout_for(grad_out, q), q, k, v, out, lse,
                                       cu_q, cu_k, ctx.batch, ctx.poison, table, table_k)
            need = ctx.needs_input_grad
            return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                    None, None, None, None, None, None, None, None)

    _autograd_cls = JaggedAttentionFunction
    return _autograd_cls


# ---- the eager fast path (as ops.py's for block_attention) ----------------------
# (causal, window_size, softmax_scale, deterministic, dropout_p, head_dim,
# dtype tag) -> the forward-only Kernel the full path chose for options it
# checked, in exact types; a repeated eager call with them checks its
# tensors in one pass (_validate.fast_jagged_tensors) and launches it.
_fast_kernels = {}


def _fast_key(causal, window_size, softmax_scale, deterministic, dropout_p, head_dim, tag):
    """The key of _fast_kernels, or None for options not in the exact types
    the key stands for (a list window, a numpy int, 1 for True, ...)."""
    if type(causal) is not bool or type(deterministic) is not bool or \
            (softmax_scale is not None and type(softmax_scale) is not float) or \
            type(dropout_p) not in (float, int) or type(window_size) is not tuple or \
            len(window_size) != 2 or type(window_size[0]) is not int or \
            type(window_size[1]) is not int:
        return None
    return (causal, window_size, softmax_scale, deterministic, dropout_p, head_dim, tag)


def _fast_forward(q, k, v, cu_q, cu_k, causal, window_size, softmax_scale, deterministic,
                  dropout_p):
    """(out, lse) by the fast path, or None when the call must take the full
    one."""
    torch = _torch()
    # torch.compile or a dispatch mode: the custom op (tested first: dynamo's
    # trace reads nothing below)
    if torch_ops.traced(torch) or not _fast_kernels:
        return None
    if _needs_grad(q, k, v):  # autograd records this call: at once, before the checks
        return None
    t = _validate.fast_jagged_tensors(q, k, v, cu_q, cu_k)
    if t is None:
        return None
    key = _fast_key(causal, window_size, softmax_scale, deterministic, dropout_p, t[4], t[0])
    kernel = _fast_kernels.get(key) if key is not None else None
    if kernel is None:
        return None
    return _forward_raw(kernel, q, k, v, cu_q, cu_q if cu_k is None else cu_k, t[7])


def jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k=None, max_seqlen_q=None,
                     max_seqlen_k=None, *, dropout_p=0.0, causal=False, window_size=(-1, -1),
                     softmax_scale=None, rotary=None, rotary_table=None, rotary_table_k=None,
                     deterministic=False, return_lse=False, _poison=False):
    """Attention over jagged sequences, a drop-in for FlashAttention's
    flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k, causal=..., window_size=..., softmax_scale=...).

    q: [total_q, heads, head_dim]; k, v: [total_k, kv_heads, head_dim]
    (kv_heads divides heads: grouped-query attention, query head h reads key
    head h // (heads // kv_heads)); head_dim 64 or 128; bf16 or fp16, on
    one CUDA device (a tensor that is not contiguous, such as a slice of one
    qkv projection, is copied first: the kernels read packed rows).
    cu_seqlens_q, cu_seqlens_k: int32
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
    (dk and dv are bit-identical either way).

    rotary (optional): rotary embeddings fused into both passes, as
    block_attention's (the spec's rotary mapping: {"layout": "interleaved"
    | "half", "apply_to": e.g. ["q", "k"] (the default), "positions":
    "table" (the default) | "sequence", "base": 10000.0 (computed positions
    only)}, or a layout name alone); positions "block" raise ValueError.
    Key j of a sequence is at position j, query i at i + Lk - Lq (aligned
    at the bottom right as the causal mask; i for self-attention). With
    positions "table", rotary_table is the queries' table [total_q,
    head_dim] and rotary_table_k the keys' [total_k, head_dim] (each row's
    sin in the first head_dim/2 columns, cos in the rest; q's dtype and
    device, contiguous); rotary_table_k None means rotary_table, which needs
    total_k == total_q (self-attention). Gradients are with respect to the
    unrotated q, k, v; the tables get none.

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
    if rotary is None and rotary_table is None and rotary_table_k is None and not _poison:
        r = _fast_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window_size,
                          softmax_scale, deterministic, dropout_p)
        if r is not None:
            return r if return_lse else r[0]
    q, k, v = _packed(q, k, v)  # views (e.g. of one qkv projection): copied
    torch = torch_ops.traced_torch()
    if torch is not None:
        # traced (torch.compile, a dispatch mode): the custom op, which checks
        # its tensors when it runs
        out, lse = torch_ops.jagged_attention(torch, q, k, v, cu_seqlens_q, cu_seqlens_k, causal,
                                              window_size, softmax_scale, deterministic, rotary,
                                              rotary_table, rotary_table_k, dropout_p)
        return (out, lse) if return_lse else out
    a = _validate.check_jagged_attention_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal,
                                              window_size, softmax_scale, rotary, rotary_table,
                                              deterministic, dropout_p, rotary_table_k)
    cu_k = a["cu_seqlens_k"]
    opts = (a["head_dim"], a["dtype_tag"], a["causal"], a["window"], a["softmax_scale"],
            a["deterministic"])
    rotary, table, table_k = a["rotary"], a["rotary_table"], a["rotary_table_k"]
    if not _needs_grad(q, k, v):
        kernel = jagged_kernel_for(*opts, rotary=rotary)
        key = _fast_key(causal, window_size, softmax_scale, deterministic, dropout_p,
                        a["head_dim"], a["dtype_tag"])
        if rotary is None and key is not None:
            _fast_kernels[key] = kernel  # these options, checked: the fast path's from now
        out, lse = _forward_raw(kernel, q, k, v, cu_seqlens_q, cu_k, a["batch"], _poison, table,
                                table_k)
    else:
        torch = _torch()
        kernel, refused = _grad_kernel(opts, rotary, _device_index(torch, q))
        out, lse = _function().apply(q, k, v, cu_seqlens_q, cu_k, kernel, a["batch"], _poison,
                                     refused, table, table_k)
    return (out, lse) if return_lse else out
