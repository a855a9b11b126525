# SPDX-License-Identifier: BSD-3-Clause
"""broadcast_attention: one dense set of queries shared by every sequence
(broadcast-Q, "PMA" attention) over jagged keys and values, with its
autograd Function.

q [n_q, heads, D] is read once by every sequence: sequence b's n_q queries
attend to its keys, rows [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k and v,
and its output rows are b * n_q .. b * n_q + n_q - 1. No copy of q per
sequence is made, forward or backward: the backward kernel sums dq over the
batch itself. Lengths are run-time data: one compiled kernel serves every
batch. torch is imported on first use only.
"""

import threading

from . import _errors, _lib, _spec, _validate, torch_ops
from .ops import (_Refused, _alloc, _device_index, _dout_for, _needs_grad, _packed, _ptr,
                  _rotary_key, _stream, _torch, load)

_kernel_lock = threading.Lock()
# (head_dim, dtype_tag, causal, window, scale, deterministic, backward, rotary) -> Kernel,
# or the _Refused of an UnsupportedError from spec validation
_kernels = {}

BACKWARD_LEAD = "attngen: the broadcast-Q backward pass is not supported for these options"


def _need_entry(name):
    if not _lib.has(name):
        raise _errors.UnsupportedError(
            "attngen: the loaded libattngen.so has no %s (built before broadcast-Q attention); "
            "rebuild it with `make build/libattngen.so`" % name)


def broadcast_kernel_for(head_dim=128, dtype="bf16", causal=False, window=None,
                         softmax_scale=None, deterministic=False, backward=False, rotary=None):
    """The (cached) Kernel broadcast_attention uses for these options: the
    spec of _spec.jagged_spec(..., broadcast=True) (`query: broadcast`).
    window: None or the spec's (left, right), as _validate.check_window_size
    returns it; rotary: as broadcast_attention's, positions "table" or
    "sequence". Raises UnsupportedError with spec validation's message for
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
                                         deterministic, backward=bool(backward), broadcast=True,
                                         rotary=rotary)
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
        kernel = broadcast_kernel_for(*opts, backward=True, rotary=rotary)
        kernel.handle(device_index)
        return kernel, None
    except _errors.UnsupportedError as e:
        return broadcast_kernel_for(*opts, rotary=rotary), _Refused.from_error(e, BACKWARD_LEAD)


def _forward_raw(kernel, q, k, v, cu_k, batch, poison=False, rotary_table=None,
                 rotary_table_k=None):
    """(out [batch * n_q, heads, D], lse [heads, batch * n_q]) of the
    broadcast forward on torch's current stream; no checks beyond the C
    launcher's. rotary_table / rotary_table_k: the queries' [n_q, D] and
    the keys' [total_k, D] tables of a kernel with rotary positions from
    tables (None where not read)."""
    torch = _torch()
    n_q, heads, dim = q.shape
    total_k, kv_heads, _ = k.shape
    rows = batch * n_q
    if poison:
        out = torch.full((rows, heads, dim), float("nan"), dtype=q.dtype, device=q.device)
        lse = torch.full((heads, rows), float("nan"), dtype=torch.float32, device=q.device)
    else:
        out = torch.empty((rows, heads, dim), dtype=q.dtype, device=q.device)
        lse = torch.empty((heads, rows), dtype=torch.float32, device=q.device)
    if rows == 0:
        return out, lse
    if total_k == 0:
        # No key in any sequence: every row sees none (output 0, logsumexp
        # -inf). The C launcher would refuse k's null pointer, so this is done here.
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse
    _need_entry("ag_broadcast_forward")
    h = kernel.handle(_device_index(torch, q))
    # the header's field order: q, k, v, o, lse, cu_seqlens_k, batch, n_q,
    # heads, kv_heads, total_k, host_cu_seqlens_k, rotary_table, rotary_table_k
    args = _lib.PACK_BROADCAST_FWD(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        cu_k.data_ptr(), batch, n_q, heads, kv_heads, total_k, 0, _ptr(rotary_table),
        _ptr(rotary_table_k))
    _lib.call("ag_broadcast_forward", h, args, _stream(torch, q),
              context=("attngen: broadcast forward '%s'", kernel.spec.name))
    return out, lse


def workspace_bytes(kernel_handle, batch, n_q, heads):
    """Bytes of scratch the broadcast backward needs with a kernel (its
    ag_kernel * handle): the C library's answer, 0 for a kernel that is not
    a broadcast spec's with the backward pass."""
    _need_entry("ag_broadcast_backward_workspace_bytes")
    return int(_lib.lib().ag_broadcast_backward_workspace_bytes(
        kernel_handle, int(batch), int(n_q), int(heads)))


def _backward_raw(kernel, dout, q, k, v, out, lse, cu_k, batch, poison=False,
                  rotary_table=None, rotary_table_k=None):
    """dq [n_q, heads, D] (summed over the batch by the kernel), dk, dv of
    the broadcast backward for a contiguous, aligned dout like out (not
    checked), on torch's current stream; the tables as _forward_raw's."""
    torch = _torch()
    n_q, heads, _ = q.shape
    total_k, kv_heads, _ = k.shape
    dq, dk, dv = (_alloc(torch, t, poison) for t in (q, k, v))
    if batch * n_q == 0 or total_k == 0:
        # Nothing attends to anything: every gradient is 0.
        for t in (dq, dk, dv):
            t.zero_()
        return dq, dk, dv
    _need_entry("ag_broadcast_backward")
    h = kernel.handle(_device_index(torch, q))
    nbytes = workspace_bytes(h, batch, n_q, heads)
    if nbytes <= 0:
        raise _errors.InvalidArgumentError(
            "attngen: kernel '%s' is not a broadcast-Q kernel with the backward pass "
            "(ag_broadcast_backward_workspace_bytes is 0)" % kernel.spec.name,
            code=_errors.AG_ERR_INVALID_ARGUMENT, code_name="invalid argument")
    workspace = torch.empty(((nbytes + 3) // 4,), dtype=torch.float32, device=q.device)
    # the header's field order: q, k, v, o, dout, lse, dq, dk, dv, workspace,
    # cu_seqlens_k, batch, n_q, heads, kv_heads, total_k, host_cu_seqlens_k,
    # rotary_table, rotary_table_k
    args = _lib.PACK_BROADCAST_BWD(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(),
        lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), workspace.data_ptr(),
        cu_k.data_ptr(), batch, n_q, heads, kv_heads, total_k, 0, _ptr(rotary_table),
        _ptr(rotary_table_k))
    _lib.call("ag_broadcast_backward", h, args, _stream(torch, q),
              context=("attngen: broadcast backward '%s'", kernel.spec.name))
    return dq, dk, dv


_autograd_cls = None


def _function():
    """The torch.autograd.Function, built on first use (needs torch)."""
    global _autograd_cls
    if _autograd_cls is not None:
        return _autograd_cls
    torch = _torch()
    once_differentiable = torch.autograd.function.once_differentiable

    class BroadcastAttentionFunction(torch.autograd.Function):
        """Forward: ag_broadcast_forward (output and logsumexp). Backward:
        ag_broadcast_backward from q, k, v, the output, its logsumexp and
        dout (saved: q, k, v, out, lse, cu_seqlens_k and the two rotary
        tables), dq summed over the batch by the kernel; or the refusal
        recorded at forward time. The logsumexp output and the tables are
        not differentiable."""

        @staticmethod
        def forward(ctx, q, k, v, cu_k, kernel, batch, poison, refused, rotary_table,
                    rotary_table_k):
            out, lse = _forward_raw(kernel, q, k, v, cu_k, batch, poison, rotary_table,
                                    rotary_table_k)
            ctx.kernel, ctx.batch, ctx.poison, ctx.refused = kernel, batch, poison, refused
            if refused is None and any(ctx.needs_input_grad[:3]):
                ctx.save_for_backward(q, k, v, out, lse, cu_k, rotary_table, rotary_table_k)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_out, grad_lse=None):
            if ctx.refused is not None:
                raise ctx.refused.error()
            q, k, v, out, lse, cu_k, table, table_k = ctx.saved_tensors
            dq, dk, dv = _backward_raw(ctx.kernel, _dout_for(grad_out, out), q, k, v, out, lse,
                                       cu_k, ctx.batch, ctx.poison, table, table_k)
            need = ctx.needs_input_grad
            return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                    None, None, None, None, None, None, None)

    _autograd_cls = BroadcastAttentionFunction
    return _autograd_cls


def broadcast_attention(q, k, v, cu_seqlens_k, *, max_seqlen_k=None, window_size=(-1, -1),
                        causal=False, softmax_scale=None, deterministic=False, return_lse=False,
                        rotary=None, rotary_table=None, rotary_table_k=None, _poison=False):
    """Attention of one dense set of queries, shared by every sequence, over
    jagged keys and values (broadcast-Q, e.g. the learned seeds of a PMA
    block or a set of candidates attending to each user's history).

    q: [n_q, heads, head_dim], the same queries for every sequence; k, v:
    [total_k, kv_heads, head_dim] (kv_heads divides heads: grouped-query
    attention, query head h reads key head h // (heads // kv_heads));
    head_dim 64 or 128; bf16 or fp16, on one CUDA device (a tensor that is
    not contiguous is copied first). cu_seqlens_k: int32 [batch + 1] on
    that device, starting at 0,
    non-decreasing, ending at total_k (not checked on the host: that would
    synchronize); sequence b's keys are rows [cu_seqlens_k[b],
    cu_seqlens_k[b+1]) and may be none. max_seqlen_k: accepted and unused.

    causal and window_size as jagged_attention's, aligned at the bottom
    right with Lq = n_q: query i of a sequence of Lk keys sees key j <= i +
    Lk - n_q when causal (the n_q queries stand for its last n_q
    positions), and i + Lk - n_q - left <= j <= i + Lk - n_q + right for
    window_size=(left, right) (-1: unlimited; see jagged_attention for the
    forms taken). softmax_scale None means 1/sqrt(head_dim).
    deterministic=True asks the spec for `deterministic: true` (the
    backward is bit-identical run to run in any case).

    rotary (optional): rotary embeddings fused into both passes, as
    jagged_attention's option (positions "table" or "sequence"). Key j of a
    sequence is at position j; query row i of q at the fixed position i,
    the same in every sequence (not the mask's i + Lk - n_q: a rotation that
    moved with each sequence would make q, and dq, per sequence). With
    positions "table", rotary_table [n_q, head_dim] rotates query row i
    (needed when "q" is in apply_to) and rotary_table_k [total_k, head_dim]
    the keys (when "k" or "v" is); each row's sin in the first head_dim/2
    columns, cos in the rest, q's dtype and device, contiguous. Gradients
    are with respect to the unrotated q, k, v; the tables get none. These
    kernels are the mma.sync forwards and, without grouped heads at small
    n_q, the one-pass mma.sync backward, else the three-kernel one (on an
    H100 at head_dim 64, n_q 32: 1.95x the forward's time without rotary,
    1.5x the backward's).

    Returns out [batch * n_q, heads, head_dim] of q's dtype (sequence b's
    rows at b * n_q), or (out, lse) with return_lse=True: lse fp32 [heads,
    batch * n_q], natural log (-inf for a row that sees no key, whose output
    row is 0); lse is not differentiable.

    Differentiable: when grad mode is on and an input requires grad, the
    kernel is built with `passes: [forward, backward]` and autograd's
    backward runs ag_broadcast_backward: dq [n_q, heads, head_dim] is the sum
    over the batch, computed by the kernel (q is never expanded), dk and dv
    per sequence (summed over each key head's query heads). Runs
    asynchronously on torch's current CUDA stream. The first call for a new
    combination of options compiles a kernel (seconds; cached on disk
    afterwards). Bad arguments raise InvalidArgumentError (a ValueError).
    """
    q, k, v = _packed(q, k, v)  # views: copied (the kernels read packed rows)
    torch = torch_ops.traced_torch()
    if torch is not None:
        # traced (torch.compile, a dispatch mode): the custom op, which checks
        # its tensors when it runs
        out, lse = torch_ops.broadcast_attention(torch, q, k, v, cu_seqlens_k, causal,
                                                 window_size, softmax_scale, deterministic,
                                                 rotary, rotary_table, rotary_table_k)
        return (out, lse) if return_lse else out
    a = _validate.check_broadcast_attention_args(q, k, v, cu_seqlens_k, causal, window_size,
                                                 softmax_scale, rotary, rotary_table,
                                                 deterministic, rotary_table_k)
    opts = (a["head_dim"], a["dtype_tag"], a["causal"], a["window"], a["softmax_scale"],
            a["deterministic"])
    rotary = a["rotary"]
    if not _needs_grad(q, k, v):
        out, lse = _forward_raw(broadcast_kernel_for(*opts, rotary=rotary), q, k, v,
                                cu_seqlens_k, a["batch"], _poison, rotary_table, rotary_table_k)
    else:
        torch = _torch()
        kernel, refused = _grad_kernel(opts, rotary, _device_index(torch, q))
        out, lse = _function().apply(q, k, v, cu_seqlens_k, kernel, a["batch"], _poison, refused,
                                     rotary_table, rotary_table_k)
    return (out, lse) if return_lse else out
