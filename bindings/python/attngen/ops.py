"""attngen for PyTorch: spec loading, per-device contexts, kernels and
block_attention with its autograd Function.

torch is imported on first use only, so `import attngen` (and spec loading
through the C library) works without it. Contexts are created lazily, one
per device, under a lock, and kept for the life of the process (they retain
the device's primary context, the same one torch uses).
"""

import ctypes
import os
import threading

from . import _errors, _lib, _spec, _validate

# ---- contexts ---------------------------------------------------------------

_ctx_lock = threading.Lock()
_contexts = {}  # device ordinal -> ctypes.c_void_p (ag_context *)


def context(device_index):
    """The process-wide ag_context of a device (created on first call)."""
    device_index = int(device_index)
    ctx = _contexts.get(device_index)
    if ctx is not None:
        return ctx
    with _ctx_lock:
        ctx = _contexts.get(device_index)
        if ctx is None:
            handle = ctypes.c_void_p()
            _lib.call("ag_context_create", device_index, ctypes.byref(handle),
                      context="attngen: creating the context of CUDA device %d" % device_index)
            ctx = handle
            _contexts[device_index] = ctx
    return ctx


def context_arch(device_index):
    """The arch name of a device's context ("sm_90a", ...)."""
    s = _lib.lib().ag_context_arch(context(device_index))
    return s.decode() if s else None


# ---- specs and kernels -------------------------------------------------------

_PATTERNS = {_lib.AG_PATTERN_BLOCK_DIAGONAL: "block_diagonal", _lib.AG_PATTERN_JAGGED: "jagged"}
_DTYPES = {_lib.AG_DTYPE_BF16: "bf16", _lib.AG_DTYPE_FP16: "fp16"}


def _spec_info(box):
    s = box.spec
    passes = tuple(n for bit, n in ((_lib.AG_PASS_FORWARD, "forward"),
                                    (_lib.AG_PASS_BACKWARD, "backward")) if s.passes & bit)
    return _spec.SpecInfo(
        name=s.name.decode("utf-8", "replace"),
        source=s.source.decode("utf-8", "replace"),
        pattern=_PATTERNS.get(s.pattern, "unknown(%d)" % s.pattern),
        block_size=s.block_size,
        causal=bool(s.causal),
        head_dim=s.head_dim,
        dtype=_DTYPES.get(s.dtype, "unknown(%d)" % s.dtype),
        softmax_scale=s.softmax_scale if s.softmax_scale > 0 else None,
        scale=_lib.lib().ag_spec_scale(ctypes.byref(box)),
        passes=passes,
    )


def _looks_like_path(text):
    return "\n" not in text and (text.endswith((".yaml", ".yml")) or os.path.isfile(text))


def parse_spec(spec):
    """Parse a spec (path, YAML text or dict) with the C parser. Returns
    (AgSpecBox, SpecInfo). Raises SpecError / UnsupportedError / AttngenIOError
    with the C diagnostics."""
    box = _lib.AgSpecBox()
    if isinstance(spec, dict):
        text = _spec.dict_to_yaml(spec).encode()
        _lib.call("ag_spec_load_string", text, len(text), b"<dict>", ctypes.byref(box))
    elif isinstance(spec, os.PathLike) or (isinstance(spec, str) and _looks_like_path(spec)):
        path = os.fsencode(spec)
        _lib.call("ag_spec_load_file", path, ctypes.byref(box))
    elif isinstance(spec, (str, bytes)):
        text = spec.encode() if isinstance(spec, str) else spec
        _lib.call("ag_spec_load_string", text, len(text), b"<string>", ctypes.byref(box))
    else:
        raise TypeError("spec must be a path, a YAML string or a dict, got %s"
                        % type(spec).__name__)
    return box, _spec_info(box)


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError("attngen's tensor operations need PyTorch: %s" % e) from e
    return torch


def _current_device_index():
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


class Kernel:
    """A parsed spec and its compiled kernels, one per device (compiled on
    first use of a device, through the runtime's memory and disk caches).

    Call it like block_attention without the options the spec fixes:
    `kernel(q, k, v, offsets, cpu_offsets=None)`.
    """

    def __init__(self, box, info):
        self._box = box
        self.spec = info
        self._handles = {}
        self._lock = threading.Lock()

    def __repr__(self):
        return "<attngen.Kernel %s (devices compiled: %s)>" % (
            self.spec.name, sorted(self._handles) or "none")

    @property
    def name(self):
        return self.spec.name

    def supports(self, pass_name):
        """Whether this kernel can run a pass ("forward", "backward"): the spec
        asks for it and the loaded library implements it."""
        if pass_name not in self.spec.passes:
            return False
        return _PASS_ENTRY.get(pass_name) is not None and _lib.has(_PASS_ENTRY[pass_name])

    def handle(self, device_index=None):
        """The ag_kernel * for a device; compiles on the first call per device."""
        if device_index is None:
            device_index = _current_device_index()
        h = self._handles.get(device_index)
        if h is not None:
            return h
        ctx = context(device_index)  # outside self._lock: takes _ctx_lock
        with self._lock:
            h = self._handles.get(device_index)
            if h is None:
                out = ctypes.c_void_p()
                _lib.call("ag_kernel_get", ctx, ctypes.byref(self._box), ctypes.byref(out),
                          context="attngen: building kernel '%s' for device %d"
                          % (self.spec.name, device_index))
                h = out
                self._handles[device_index] = h
        return h

    compile = handle

    def _check(self, q, k, v, offsets, cpu_offsets):
        if self.spec.pattern != "block_diagonal":
            raise _errors.UnsupportedError(
                "kernel '%s' has pattern %s; only block_diagonal runs from Python so far"
                % (self.spec.name, self.spec.pattern))
        dtype, tag, device, (tokens, heads, head_dim) = _validate.check_qkv(q, k, v)
        if tag != self.spec.dtype:
            raise ValueError("kernel '%s' is for %s tensors, got %s"
                             % (self.spec.name, self.spec.dtype, _validate.dtype_name(dtype)))
        if head_dim != self.spec.head_dim:
            raise ValueError("kernel '%s' is for head_dim %d, got %d"
                             % (self.spec.name, self.spec.head_dim, head_dim))
        batch = _validate.check_offsets(offsets, device)
        if cpu_offsets is not None:
            _validate.check_cpu_offsets(cpu_offsets, batch, tokens)
        return batch

    def __call__(self, query, key, value, offsets, cpu_offsets=None, *, _poison=False):
        batch = self._check(query, key, value, offsets, cpu_offsets)
        return _apply(self, query, key, value, offsets, batch, _poison)

    # -- passes (raw: no checks beyond the C launcher's, no autograd) --

    def _forward_raw(self, q, k, v, offsets, batch, poison=False):
        torch = _torch()
        if poison:
            out = torch.full_like(q, float("nan"), memory_format=torch.contiguous_format)
        else:
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
        tokens, heads, _ = q.shape
        if tokens == 0 or batch == 0:
            return out
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        h = self.handle(dev)
        args = _lib.AgBlockFwdArgs(
            q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(),
            offsets=offsets.data_ptr(), batch=batch, heads=heads, total_tokens=tokens)
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _lib.call("ag_block_forward", h, ctypes.byref(args), ctypes.c_void_p(stream or None),
                  context="attngen: block forward '%s'" % self.spec.name)
        return out

    def _backward_raw(self, grad_out, q, k, v, out, offsets, batch):
        if not self.supports("backward"):
            have = ", ".join(self.spec.passes) or "none"
            raise NotImplementedError(
                "attngen: the backward pass of block attention is not implemented yet "
                "(kernel '%s' has passes: %s; the C API has no ag_block_backward). "
                "Run under torch.no_grad() or detach the inputs." % (self.spec.name, have))
        # When ag_block_backward lands: build its args struct in _lib, launch
        # it on the current stream like _forward_raw, and return (dq, dk, dv).
        raise NotImplementedError("attngen: ag_block_backward is present but not bound yet")


# The C entry point of each pass; None until the library has one.
_PASS_ENTRY = {"forward": "ag_block_forward", "backward": "ag_block_backward"}


def load(spec, device=None, compile=True):
    """A Kernel from a spec path, YAML string or dict.

    With compile=True (default) the kernel is built for `device` (an ordinal;
    default torch's current CUDA device, else 0) now, through the runtime's
    caches; with compile=False only the spec is parsed and devices compile on
    first use.
    """
    box, info = parse_spec(spec)
    kernel = Kernel(box, info)
    if compile:
        kernel.handle(device)
    return kernel


# ---- block_attention ---------------------------------------------------------

_kernel_lock = threading.Lock()
_kernels = {}  # (block_size, causal, head_dim, dtype_tag, scale) -> Kernel


def kernel_for(block_size=64, causal=False, head_dim=128, dtype="bf16", softmax_scale=None):
    """The (cached) Kernel that block_attention uses for these options."""
    key = (block_size, causal, head_dim, dtype, softmax_scale)
    k = _kernels.get(key)
    if k is not None:
        return k
    with _kernel_lock:
        k = _kernels.get(key)
        if k is None:
            spec = _spec.block_spec(block_size, head_dim, dtype, causal, softmax_scale)
            k = load(spec, compile=False)
            _kernels[key] = k
    return k


_autograd_cls = None


def _function():
    """The torch.autograd.Function, built on first use (needs torch)."""
    global _autograd_cls
    if _autograd_cls is not None:
        return _autograd_cls
    torch = _torch()

    class BlockAttentionFunction(torch.autograd.Function):
        """Forward: attngen's block-diagonal kernel. Backward: the kernel's
        backward pass (raises NotImplementedError until it exists)."""

        @staticmethod
        def forward(ctx, q, k, v, offsets, kernel, batch, poison):
            out = kernel._forward_raw(q, k, v, offsets, batch, poison)
            ctx.kernel, ctx.batch = kernel, batch
            if any(ctx.needs_input_grad[:3]):
                ctx.save_for_backward(q, k, v, offsets, out)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, offsets, out = ctx.saved_tensors
            dq, dk, dv = ctx.kernel._backward_raw(grad_out.contiguous(), q, k, v, out,
                                                  offsets, ctx.batch)
            return dq, dk, dv, None, None, None, None

    _autograd_cls = BlockAttentionFunction
    return _autograd_cls


def _apply(kernel, q, k, v, offsets, batch, poison):
    torch = _torch()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _function().apply(q, k, v, offsets, kernel, batch, poison)
    # No graph to record: skip the autograd.Function machinery (its overhead
    # is comparable to the launch itself on small problems).
    return kernel._forward_raw(q, k, v, offsets, batch, poison)


def block_attention(query, key, value, offsets, cpu_offsets=None, *, block_size=64,
                    causal=False, softmax_scale=None, _poison=False):
    """Block-diagonal attention over packed sequences.

    query, key, value: [total_tokens, heads, head_dim] (head_dim 64 or 128),
    bf16 or fp16, contiguous, on one CUDA device. offsets: int32 [batch + 1]
    on that device (offsets[0] = 0, non-decreasing, offsets[-1] =
    total_tokens). Each sequence is cut into blocks of `block_size` tokens
    from its own start; each block attends to itself (token i to tokens
    0..i of its block when causal); the last block of a sequence may be
    partial. softmax_scale None means 1/sqrt(head_dim).

    cpu_offsets (optional, as in Meta's block_attention_api): a host copy of
    offsets (CPU tensor, numpy array or list); when given, its values are
    validated without any device synchronization. Without it the values are
    not checked (the kernel clamps malformed offsets to the tensors' bounds).

    Runs asynchronously on torch's current CUDA stream and returns a new
    tensor like query. The first call for a new combination of options
    compiles a kernel (seconds; cached on disk afterwards). Options after
    cpu_offsets are keyword-only.
    """
    a = _validate.check_block_attention_args(query, key, value, offsets, cpu_offsets,
                                             block_size, causal, softmax_scale)
    kernel = kernel_for(a["block_size"], a["causal"], a["head_dim"], a["dtype_tag"],
                        a["softmax_scale"])
    return _apply(kernel, query, key, value, offsets, a["batch"], _poison)


def block_attention_api(query, key, value, offsets, cpu_offsets=None):
    """Drop-in for Meta's block_attention_api(query, key, value, offsets,
    cpu_offsets): block 64, non-causal, scale 1/sqrt(head_dim)."""
    return block_attention(query, key, value, offsets, cpu_offsets, block_size=64)
