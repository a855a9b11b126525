# SPDX-License-Identifier: BSD-3-Clause
"""attngen for PyTorch: spec loading, per-device contexts, kernels and
block_attention with its autograd Function.

torch is imported on first use only, so `import attngen` (and spec loading
through the C library) works without it. Contexts are created lazily, one
per device, under a lock, and kept for the life of the process (they retain
the device's primary context, the same one torch uses).
"""

import ctypes
import os
import re
import threading

from . import _errors, _lib, _spec, _validate, torch_ops

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
_QUERIES = {_lib.AG_QUERY_PER_SEQUENCE: "per_sequence", _lib.AG_QUERY_BROADCAST: "broadcast"}


_ROTARY_LAYOUTS = {_lib.AG_ROTARY_INTERLEAVED: "interleaved", _lib.AG_ROTARY_HALF: "half"}
_POSITIONS = {_lib.AG_POSITIONS_TABLE: "table", _lib.AG_POSITIONS_SEQUENCE: "sequence",
              _lib.AG_POSITIONS_BLOCK: "block"}


def _rotary_info(r):
    if r.layout == _lib.AG_ROTARY_NONE:
        return None
    return {
        "layout": _ROTARY_LAYOUTS.get(r.layout, "unknown(%d)" % r.layout),
        "apply_to": tuple(n for bit, n in ((_lib.AG_APPLY_Q, "q"), (_lib.AG_APPLY_K, "k"),
                                           (_lib.AG_APPLY_V, "v")) if r.apply_to & bit),
        "positions": _POSITIONS.get(r.positions, "unknown(%d)" % r.positions),
        "base": r.base,
    }


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
        rotary=_rotary_info(s.rotary),
        window=(s.window_left, s.window_right) if s.has_window else None,
        deterministic=bool(s.deterministic),
        query=_QUERIES.get(s.query, "unknown(%d)" % s.query),
        row_strides=bool(s.row_strides),
    )


_YAML_MAPPING = re.compile(r"(^|\s)[^\s:]*:(\s|$)|^\s*[{\[]")


def _looks_like_path(text):
    """An existing file, or one line ending .yaml/.yml that is no YAML
    mapping ("name: x.yaml" is YAML text, not a path)."""
    if "\n" in text:
        return False
    if os.path.isfile(text):
        return True
    return text.endswith((".yaml", ".yml")) and not _YAML_MAPPING.search(text)


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
    """torch, imported on first use (the custom ops are registered apart:
    torch_ops.arm)."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError("attngen's tensor operations need PyTorch: %s" % e) from e
    return torch


# ---- refusals -------------------------------------------------------------------

class _Refused:
    """Why a kernel cannot be had or cannot run its backward: an exception
    recipe, raised afresh (never the same object twice) when it is asked
    for again."""

    def __init__(self, message, cls=_errors.UnsupportedError, code=_errors.AG_ERR_UNSUPPORTED,
                 code_name=None, detail=None):
        self.message, self.cls = message, cls
        self.code, self.code_name, self.detail = code, code_name, detail

    @classmethod
    def from_error(cls, exc, lead=None):
        """The recipe of `exc`, its message led by `lead` (unless it already
        starts with it)."""
        text = str(exc)
        if lead and not text.startswith(lead):
            text = "%s: %s" % (lead, text)
        return cls(text, type(exc) if isinstance(exc, _errors.AttngenError) else
                   _errors.UnsupportedError, getattr(exc, "code", _errors.AG_ERR_UNSUPPORTED),
                   getattr(exc, "code_name", None), getattr(exc, "detail", None))

    def error(self):
        return self.cls(self.message, code=self.code, code_name=self.code_name, detail=self.detail)


def _current_device_index():
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.current_device() if torch.cuda.is_available() else 0


class Kernel:
    """A parsed spec and its compiled kernels, one per device (compiled on
    first use of a device, through the runtime's memory and disk caches).
    A spec with `passes: [forward, backward]` compiles to one module holding
    both functions.

    Call it like block_attention without the options the spec fixes:
    `kernel(q, k, v, offsets, cpu_offsets=None, rotary_table=None)` (the
    table when the spec's rotary positions are `table`); autograd runs the
    backward pass when the spec has it (`passes: [forward, backward]`; a
    forward-only spec's .backward() says so). `kernel.backward(q, k, v,
    dout, offsets)` runs the backward kernel alone and returns (dq, dk, dv).
    """

    def __init__(self, box, info):
        self._box = box
        self.spec = info
        self._handles = {}
        self._strided = {}  # device ordinal -> ag_kernel_takes_row_strides
        self._grouping = {}  # device ordinal -> ag_kernel_takes_kv_heads
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

    def _handle_of(self, device_index):
        """handle(device_index), its cached value read without the call (the
        launches' hot path)."""
        h = self._handles.get(device_index)
        return h if h is not None else self.handle(device_index)

    def takes_row_strides(self, device_index=None):
        """Whether the kernel built for a device reads each tensor by its own
        row stride (ag_kernel_takes_row_strides). Then q, k, v that are views
        of one projection output (heads and head_dim dense, rows spaced, as
        `qkv.unbind(1)` of a [tokens, 3, heads, head_dim] tensor) are read
        in place, and block_attention_qkvpacked's backward writes dq, dk, dv
        straight into one packed gradient; otherwise such views are copied."""
        return self._takes(self._strided, "ag_kernel_takes_row_strides", device_index)

    def takes_kv_heads(self, device_index=None):
        """Whether the kernel built for a device reads k and v with fewer
        heads than q (grouped-query attention, ag_kernel_takes_kv_heads);
        otherwise each key head is repeated for its group of query heads
        before the launch (a copy) and autograd sums its gradient back."""
        return self._takes(self._grouping, "ag_kernel_takes_kv_heads", device_index)

    def _takes(self, cache, c_name, device_index):
        """The C predicate c_name of the kernel built for a device (False
        with a library that lacks it), cached by device in `cache`."""
        if device_index is None:
            device_index = _current_device_index()
        s = cache.get(device_index)
        if s is None:
            h = self._handle_of(device_index)
            s = cache[device_index] = _lib.has(c_name) and bool(getattr(_lib.lib(), c_name)(h))
        return s

    def _grouped(self, q, k, v, device_index=None):
        """(k, v, kv_heads) as the launch takes them: k and v themselves
        when they have q's heads or the kernel takes fewer; else each key
        head repeated for its heads // kv_heads query heads (new contiguous
        tensors with q's heads)."""
        heads, kv_heads = q.shape[1], k.shape[1]
        if kv_heads == heads:
            return k, v, kv_heads
        if device_index is None:
            device_index = _device_index(_torch(), q)
        if self.takes_kv_heads(device_index):
            return k, v, kv_heads
        group = heads // kv_heads
        return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), heads

    def _rows(self, tensors, device_index=None):
        """(tensors, row strides) as this kernel reads them on a device
        (default: the first tensor's): contiguous ones as they are (stride
        0: packed); views whose rows alone are spaced (_validate.row_stride)
        as they are, with their stride, when the kernel takes row strides;
        any other copied into a new contiguous tensor."""
        for t in tensors:
            if not t.is_contiguous():
                break
        else:  # the usual case: nothing to look up
            return tensors, (0,) * len(tensors)
        if device_index is None:
            device_index = _device_index(_torch(), tensors[0])
        takes = self.takes_row_strides(device_index)
        out, strides = [], []
        for t in tensors:
            s = _validate.row_stride(t) if takes else (0 if t.is_contiguous() else None)
            if s is None:
                t, s = t.contiguous(), 0
            out.append(t)
            strides.append(s)
        return tuple(out), tuple(strides)

    def _check(self, q, k, v, offsets, cpu_offsets):
        """(batch, plain): plain when q, k, v are contiguous with one shape
        (the one-pass check's tensors: no views, no grouped heads)."""
        spec = self.spec
        t = _validate.fast_block_tensors(q, k, v, offsets)
        if t is not None and t[0] == spec.dtype and t[4] == spec.head_dim and \
                spec.pattern == "block_diagonal":
            if cpu_offsets is not None:
                _validate.check_cpu_offsets(cpu_offsets, t[5], t[2])
            return t[5], True
        if self.spec.pattern != "block_diagonal":
            raise _errors.UnsupportedError(
                "kernel '%s' has pattern %s; a Kernel runs block_diagonal specs only "
                "(jagged sequences: attngen.jagged_attention; one Q shared by every sequence: "
                "attngen.broadcast_attention)" % (self.spec.name, self.spec.pattern))
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
        return batch, False

    def _check_table(self, q, rotary_table):
        r = self.spec.rotary
        wants = r is not None and r.get("positions") == "table"
        if rotary_table is None:
            if wants:
                raise ValueError("kernel '%s' applies rotary embeddings from a table: pass "
                                 "rotary_table=[total_tokens, head_dim] (sin in the first "
                                 "head_dim/2 columns, cos in the rest)" % self.spec.name)
            return None
        if not wants:
            raise ValueError("kernel '%s' takes no rotary_table (its spec has no rotary with "
                             "positions: table)" % self.spec.name)
        _validate.check_rotary_table(rotary_table, q)
        return rotary_table

    def _backward_refusal(self):
        """None when this kernel can run its backward, else a _Refused saying why."""
        if "backward" not in self.spec.passes:
            return _Refused(
                "attngen: kernel '%s' has no backward pass (passes: %s); load a spec with "
                "`passes: [forward, backward]` to differentiate through it, or call it under "
                "torch.no_grad() / on detached inputs"
                % (self.spec.name, ", ".join(self.spec.passes) or "none"))
        if not _lib.has(_PASS_ENTRY["backward"]):
            return _Refused(
                "attngen: the loaded libattngen.so has no ag_block_backward (built before the "
                "backward existed); rebuild it with `make build/libattngen.so`")
        return None

    def __call__(self, query, key, value, offsets, cpu_offsets=None, *, rotary_table=None,
                 _poison=False):
        batch, plain = self._check(query, key, value, offsets, cpu_offsets)
        table = self._check_table(query, rotary_table)
        if not _needs_grad(query, key, value):
            return self._forward_raw(query, key, value, offsets, batch, _poison, table, plain)
        refused = self._backward_refusal()
        base = _packed_base(query, key, value) if refused is None else None
        if base is not None:  # views of one qkv: its gradient as one tensor
            return _function().packed.apply(base, offsets, self, batch, _poison, None, table)
        return _function().apply(query, key, value, offsets, self, batch, _poison, refused,
                                 table)

    def backward(self, query, key, value, dout, offsets, cpu_offsets=None, *,
                 rotary_table=None, _poison=False):
        """The backward kernel alone, outside autograd: (dq, dk, dv) for the
        output gradient `dout` (a contiguous tensor like query), recomputing
        the softmax from query and key (no forward output needed); dk and dv
        in key's and value's shape (with fewer key heads, summed over each
        group). Runs on torch's current stream; returns new contiguous
        tensors."""
        batch, plain = self._check(query, key, value, offsets, cpu_offsets)
        _validate.check_dout(dout, query)
        table = self._check_table(query, rotary_table)
        refused = self._backward_refusal()
        if refused is not None:
            raise refused.error()
        return self._backward_raw(dout, query, key, value, offsets, batch, _poison, table,
                                  plain=plain)

    # -- passes (raw: no checks beyond the C launcher's, no autograd) --

    def _forward_raw(self, q, k, v, offsets, batch, poison=False, rotary_table=None,
                     plain=False):
        """out of the forward (plain: q, k, v known contiguous with one
        shape, so no view or grouped head to look for)."""
        torch = _torch()
        out = _alloc(torch, q, poison)
        tokens, heads, _ = q.shape
        if tokens == 0 or batch == 0:
            return out
        di = _device_index(torch, q)
        if plain:
            self._launch_forward(torch, q, k, v, offsets, out, batch, heads, tokens, di,
                                 rotary_table)
            return out
        k, v, kv_heads = self._grouped(q, k, v, di)
        (q, k, v), strides = self._rows((q, k, v), di)
        self._launch_forward(torch, q, k, v, offsets, out, batch, heads, tokens, di,
                             rotary_table, strides, kv_heads)
        return out

    def _launch_forward(self, torch, q, k, v, offsets, out, batch, heads, tokens, di,
                        rotary_table=None, strides=None, kv_heads=0):
        """ag_block_forward into `out` (contiguous) on device di's current
        stream, q, k, v read at their row `strides` (None or 0: packed), k
        and v with kv_heads heads (0: q's; a non-empty call; no checks
        beyond the C launcher's)."""
        qs, ks, vs = strides if strides is not None else (0, 0, 0)
        args = _lib.PACK_BLOCK_FWD(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), offsets.data_ptr(),
            batch, heads, tokens, 0, rotary_table.data_ptr() if rotary_table is not None else 0,
            qs, ks, vs, 0, kv_heads if kv_heads != heads else 0)
        _lib.call("ag_block_forward", self._handle_of(di), args, _stream_of(torch, di),
                  context=("attngen: block forward '%s'", self.spec.name))

    def _backward_raw(self, dout, q, k, v, offsets, batch, poison=False, rotary_table=None,
                      into=None, plain=False):
        """dq, dk, dv for a contiguous, aligned dout like q (not checked):
        new contiguous tensors, or with `into` = (dq, dk, dv, row strides)
        those (views of one packed gradient; this kernel takes row
        strides). With fewer key heads than query heads the kernel writes
        dk and dv per query head, summed here over each group. plain: q, k,
        v known contiguous with one shape."""
        torch = _torch()
        grad_strides = None
        if into is not None:
            dq, dk, dv, grad_strides = into
        elif poison:
            dq, dk, dv = (_alloc(torch, q, True) for _ in range(3))
        elif q.is_contiguous():  # empty_like keeps that layout
            # Three empty_like, not one torch.empty((3, ...)) unbound into
            # slices: timed whole on session 39's H100 host (overhead.py
            # --parts, two rounds), Kernel.backward took 19.0-20.2 us of
            # host this way and 21.2-21.7 through the one allocation,
            # though the allocation alone timed faster (7.0 us against
            # 10.5 for three empty_like in session 38).
            empty = torch.empty_like
            dq, dk, dv = empty(q), empty(q), empty(q)
        else:
            dq, dk, dv = (_alloc(torch, q, False) for _ in range(3))
        tokens, heads, _ = q.shape
        if plain:
            if tokens and batch:
                self._launch_backward(torch, dout, q, k, v, dq, dk, dv, offsets, batch, heads,
                                      tokens, _device_index(torch, q), rotary_table, None,
                                      grad_strides)
            return dq, dk, dv
        kv_heads = k.shape[1]
        if tokens and batch:
            di = _device_index(torch, q)
            k, v, launch_kv = self._grouped(q, k, v, di)
            (q, k, v), strides = self._rows((q, k, v), di)
            self._launch_backward(torch, dout, q, k, v, dq, dk, dv, offsets, batch, heads,
                                  tokens, di, rotary_table, strides, grad_strides, launch_kv)
        return dq, _sum_groups(dk, kv_heads), _sum_groups(dv, kv_heads)

    def _launch_backward(self, torch, dout, q, k, v, dq, dk, dv, offsets, batch, heads, tokens,
                         di, rotary_table, strides=None, grad_strides=None, kv_heads=0):
        """ag_block_backward on device di's current stream: q, k, v at their
        row `strides`, dq, dk, dv at `grad_strides` (None: packed), k and v
        with kv_heads heads (0: q's; a non-empty call)."""
        qs, ks, vs = strides if strides is not None else (0, 0, 0)
        dqs, dks, dvs = grad_strides if grad_strides is not None else (0, 0, 0)
        args = _lib.PACK_BLOCK_BWD(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(), dq.data_ptr(),
            dk.data_ptr(), dv.data_ptr(), offsets.data_ptr(), batch, heads, tokens, 0,
            rotary_table.data_ptr() if rotary_table is not None else 0,
            qs, ks, vs, 0, dqs, dks, dvs, kv_heads if kv_heads != heads else 0)
        _lib.call("ag_block_backward", self._handle_of(di), args, _stream_of(torch, di),
                  context=("attngen: block backward '%s'", self.spec.name))


def _sum_groups(grad, kv_heads):
    """A key or value gradient written per query head, [tokens, heads,
    head_dim], summed over each key head's heads // kv_heads query heads
    (adjacent ones, as the kernels group them); as it is when kv_heads is
    its heads."""
    tokens, heads, dim = grad.shape
    if heads == kv_heads:
        return grad
    return grad.view(tokens, kv_heads, heads // kv_heads, dim).sum(2)


# The C entry point of each pass.
_PASS_ENTRY = {"forward": "ag_block_forward", "backward": "ag_block_backward"}


def _alloc(torch, like, poison):
    """A new contiguous tensor like `like` (NaNs with poison). The inputs
    are checked contiguous before any launch, and empty_like keeps a
    contiguous tensor's layout; naming the memory format costs about as
    much again in argument parsing, so it is passed only when needed."""
    if poison:
        return torch.full_like(like, float("nan"), memory_format=torch.contiguous_format)
    if like.is_contiguous():
        return torch.empty_like(like)
    return torch.empty_like(like, memory_format=torch.contiguous_format)


def _ptr(t):
    """A tensor's address for the packed args; 0 (NULL) for None (the jagged
    and broadcast launches' optional rotary tables)."""
    return 0 if t is None else t.data_ptr()


def _stream(torch, t):
    """torch's current CUDA stream on t's device, as the C launchers take it
    (an int; 0 for the legacy default stream): its raw handle through torch._C's
    getter where torch has it (what Inductor's generated code calls; a
    fraction of a microsecond), else through a Stream object."""
    return _stream_of(torch, _device_index(torch, t))


# torch's raw current-stream getter, looked up once per torch module: (module, getter)
_raw_stream_getter = (None, None)


def _stream_of(torch, device_index):
    """_stream for a device by its index (what the hot paths have)."""
    global _raw_stream_getter
    mod, raw = _raw_stream_getter
    if mod is not torch:
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None) if hasattr(torch, "_C") \
            else None
        _raw_stream_getter = (torch, raw)
    # the handle as an int (0: the legacy default stream), which the
    # launches' c_void_p argument takes as it is: no ctypes object a call
    return raw(device_index) if raw is not None else \
        torch.cuda.current_stream(device_index).cuda_stream


def _device_index(torch, t):
    i = t.get_device()  # a CUDA tensor's ordinal (one call, no device object)
    return i if i is not None and i >= 0 else torch.cuda.current_device()


def _packed(*tensors):
    """The tensors, each not contiguous replaced by a contiguous copy (an
    autograd op: gradients reach the original view); what is not a tensor
    passes through for the checks to name. For the kernels that read packed
    rows only (jagged, broadcast): views of one projection output, as
    FlashAttention's varlen functions take them, work as they do there."""
    return tuple(t.contiguous() if getattr(t, "is_contiguous", None) is not None
                 and not t.is_contiguous() else t for t in tensors)


def _needs_grad(*tensors):
    """Whether autograd must record this call: grad mode is on and an input
    requires grad (only then is the backward pass asked for)."""
    for t in tensors:
        if getattr(t, "requires_grad", False):
            return _torch().is_grad_enabled()
    return False


def _dout_for(grad_out, q):
    """The output gradient as the backward kernel takes it: q's dtype,
    contiguous, 16-byte aligned (a copy only when it is not already)."""
    g = grad_out
    if g.dtype != q.dtype:
        g = g.to(q.dtype)
    if not g.is_contiguous():
        g = g.contiguous()
    if g.shape[0] > 0 and g.data_ptr() % _validate.ALIGNMENT:
        g = g.clone()
    return g


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
# (block_size, causal, head_dim, dtype_tag, scale, backward, rotary, row_strides) -> Kernel,
# or the _Refused of an UnsupportedError from spec validation (its answer
# does not change while the library stays loaded)
_kernels = {}

# The refusal of a backward that cannot be had for some options (a shape the
# backward kernel does not take; none today: every block size has one,
# rotary or not, but a future limit would land here).
BACKWARD_LEAD = "attngen: the backward pass is not supported for these options"


def _rotary_key(rotary):
    return None if rotary is None else (rotary["layout"], rotary["apply_to"],
                                        rotary["positions"], rotary["base"])


def kernel_for(block_size=64, causal=False, head_dim=128, dtype="bf16", softmax_scale=None,
               backward=False, rotary=None, row_strides=False):
    """The (cached) Kernel that block_attention uses for these options:
    forward alone, or with backward=True forward and backward in one module
    (what block_attention takes when an input requires grad). `rotary`: as
    block_attention's. row_strides=True: kernels that take each tensor's
    row stride and kv_heads (`row_strides: true`; what block_attention
    takes for views of one projection and grouped-query heads; about 2%
    slower than the packed ones on packed tensors at head_dim 128). Raises
    UnsupportedError with spec validation's message for options whose
    kernel does not fit (e.g. rotary positions from a table at block_size
    240 or 256 with head_dim 128, where the forward has no room for the
    table's rows; row strides with the backward of blocks past 128 tokens
    at head_dim 128)."""
    rotary = _validate.check_rotary(rotary)
    key = (block_size, causal, head_dim, dtype, softmax_scale, bool(backward), _rotary_key(rotary),
           bool(row_strides))
    k = _kernels.get(key)
    if k is None:
        with _kernel_lock:
            k = _kernels.get(key)
            if k is None:
                spec = _spec.block_spec(block_size, head_dim, dtype, causal, softmax_scale,
                                        backward=bool(backward), rotary=rotary,
                                        row_strides=bool(row_strides))
                try:
                    k = load(spec, compile=False)
                except _errors.UnsupportedError as e:
                    k = _Refused.from_error(e)
                _kernels[key] = k
    if isinstance(k, _Refused):
        raise k.error()
    return k


def _wants_row_strides(q, k, v):
    """Whether q, k, v are read best by a row_strides spec's kernels: k
    and v with fewer heads than q (grouped-query heads, read in place
    instead of repeated), or a view whose rows alone are spaced
    (_validate.row_stride: read in place instead of copied). Contiguous
    q, k, v with one head count take the packed kernels."""
    if k.shape[1] != q.shape[1]:
        return True
    for t in (q, k, v):
        if not t.is_contiguous() and _validate.row_stride(t) is not None:
            return True
    return False


def _layout_kernel(get, row_strides):
    """get(row_strides) for a call's layout: the row_strides kernels where
    the layout wants them and they exist for these options, else (and for
    options whose row-strides kernels are refused: the chunked backward of
    large blocks) the packed ones, which copy views and repeat key heads."""
    if row_strides:
        try:
            return get(True)
        except _errors.UnsupportedError:
            pass
    return get(False)


def _grad_kernel(opts, rotary, device_index, row_strides=False):
    """(kernel, refusal) for a call that autograd records: the kernel with
    both passes and None, or, when the backward cannot be had (a block size
    and head_dim the backward does not fit), the forward-only kernel and the
    _Refused that its backward will raise. row_strides: the layout wants
    the row_strides kernels (_wants_row_strides), taken where they exist."""
    if row_strides:
        try:
            kernel = kernel_for(*opts, backward=True, rotary=rotary, row_strides=True)
            kernel.handle(device_index)
            return kernel, kernel._backward_refusal()
        except _errors.UnsupportedError:
            pass
    try:
        kernel = kernel_for(*opts, backward=True, rotary=rotary)
        kernel.handle(device_index)
        return kernel, kernel._backward_refusal()
    except _errors.UnsupportedError as e:
        return kernel_for(*opts, rotary=rotary), _Refused.from_error(e, BACKWARD_LEAD)


_autograd_cls = None


def _block_forward(ctx, q, k, v, offsets, kernel, batch, poison, refused, table, grads):
    """The forward of both block Functions: views the kernel cannot read
    copied once (for both passes), the forward launched, and what the
    backward needs kept when gradients are asked for and it can run."""
    (q, k, v), strides = kernel._rows((q, k, v))
    plain = not any(strides) and k.shape[1] == q.shape[1]
    out = kernel._forward_raw(q, k, v, offsets, batch, poison, table, plain)
    ctx.kernel, ctx.batch, ctx.poison, ctx.refused = kernel, batch, poison, refused
    ctx.plain = plain
    if refused is None and grads:
        ctx.save_for_backward(q, k, v, offsets, table)
    return out


def _packed_base(q, k, v):
    """The [T, 3, H, D] view of the one tensor whose adjacent slices q, k, v
    are (qkv.unbind(1), or column slices of a [T, 3 H D] projection output,
    q's columns then k's then v's), so that autograd can take its gradient
    as one packed tensor (block_attention_qkvpacked's Function); None for
    anything else, and where the gradient must reach q, k, v themselves: a
    base that does not require grad (q alone may), retain_grad or hooks on
    one of them."""
    base = getattr(q, "_base", None)
    if base is None or getattr(k, "_base", None) is not base or \
            getattr(v, "_base", None) is not base or not base.requires_grad:
        return None
    for t in (q, k, v):
        if t.retains_grad or t._backward_hooks:
            return None
    tokens, heads, dim = q.shape
    row = 3 * heads * dim
    if tokens == 0 or k.shape != q.shape or v.shape != q.shape or \
            not base.is_contiguous() or base.numel() != tokens * row:
        return None
    strides = (row, dim, 1)
    if q.stride() != strides or k.stride() != strides or v.stride() != strides:
        return None
    p, step = q.data_ptr(), heads * dim * q.element_size()
    if base.data_ptr() != p or k.data_ptr() != p + step or v.data_ptr() != p + 2 * step:
        return None
    return base.view(tokens, 3, heads, dim)


def _block_saved(ctx):
    """What _block_forward kept (q, k, v, offsets, table), or the refusal
    it recorded raised."""
    if ctx.refused is not None:
        raise ctx.refused.error()
    return ctx.saved_tensors


def _function():
    """The torch.autograd.Function, built on first use (needs torch)."""
    global _autograd_cls
    if _autograd_cls is not None:
        return _autograd_cls
    torch = _torch()
    once_differentiable = torch.autograd.function.once_differentiable

    class BlockAttentionFunction(torch.autograd.Function):
        """Forward: attngen's block-diagonal forward. Backward: the kernel's
        backward pass (ag_block_backward on the current stream; the softmax
        is recomputed from q and k, so only q, k, v, offsets and any rotary
        table are saved), or the refusal recorded at forward time (a kernel
        without the backward pass, or options the backward does not fit)."""

        @staticmethod
        def forward(ctx, q, k, v, offsets, kernel, batch, poison, refused, rotary_table):
            return _block_forward(ctx, q, k, v, offsets, kernel, batch, poison, refused,
                                  rotary_table, any(ctx.needs_input_grad[:3]))

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_out):
            q, k, v, offsets, table = _block_saved(ctx)
            dq, dk, dv = ctx.kernel._backward_raw(_dout_for(grad_out, q), q, k, v, offsets,
                                                  ctx.batch, ctx.poison, table,
                                                  plain=ctx.plain)
            need = ctx.needs_input_grad
            return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                    None, None, None, None, None, None)

    class BlockAttentionQKVPackedFunction(torch.autograd.Function):
        """BlockAttentionFunction on the three slices of one packed qkv
        [tokens, 3, heads, head_dim]; its backward returns one packed dqkv,
        written in place by a kernel that takes row strides (else stacked
        from dq, dk, dv, what autograd would do for qkv.unbind(1))."""

        @staticmethod
        def forward(ctx, qkv, offsets, kernel, batch, poison, refused, rotary_table):
            return _block_forward(ctx, *qkv.unbind(1), offsets, kernel, batch, poison, refused,
                                  rotary_table, ctx.needs_input_grad[0])

        @staticmethod
        @once_differentiable
        def backward(ctx, grad_out):
            q, k, v, offsets, table = _block_saved(ctx)
            dout = _dout_for(grad_out, q)
            kernel = ctx.kernel
            tokens, heads, dim = q.shape
            if tokens > 0 and kernel.takes_row_strides(_device_index(torch, q)):
                shape = (tokens, 3, heads, dim)
                dqkv = torch.full(shape, float("nan"), dtype=q.dtype, device=q.device) \
                    if ctx.poison else torch.empty(shape, dtype=q.dtype, device=q.device)
                grads = dqkv.unbind(1)
                stride = _validate.row_stride(grads[0])
                kernel._backward_raw(dout, q, k, v, offsets, ctx.batch, ctx.poison, table,
                                     into=grads + ((stride,) * 3,))
            else:
                dqkv = torch.stack(kernel._backward_raw(dout, q, k, v, offsets, ctx.batch,
                                                        ctx.poison, table), dim=1)
            return dqkv, None, None, None, None, None, None

    BlockAttentionFunction.packed = BlockAttentionQKVPackedFunction
    _autograd_cls = BlockAttentionFunction
    return _autograd_cls


# ---- the eager fast path -----------------------------------------------------
# On small problems an eager call's host time is the launch's cost (issue
# 20: at most 15 us a call). A call whose options were already checked once
# (in exact types: an int block size, a bool causal, None or a float scale;
# no rotary, no cpu_offsets) and whose inputs need no graph takes
# _fast_block_forward: its tensors are checked in one pass
# (_validate.fast_block_tensors) and the forward-only Kernel the full path
# chose for those options is launched. Anything else, or any tensor the
# fast check does not pass, takes the full path, which raises with its
# message. (block_size, causal, softmax_scale, head_dim, dtype tag) -> Kernel
_fast_kernels = {}


def _fast_key(block_size, causal, softmax_scale, head_dim, tag):
    """The key of _fast_kernels for these options, or None when their types
    are not the exact ones the key stands for (a numpy int, 1 for True, an
    int scale: hashes equal to checked values but not checked themselves)."""
    if type(block_size) is not int or type(causal) is not bool or \
            (softmax_scale is not None and type(softmax_scale) is not float):
        return None
    return (block_size, causal, softmax_scale, head_dim, tag)


def _fast_block_forward(q, k, v, offsets, block_size, causal, softmax_scale):
    """block_attention's output by the fast path, or None when the call
    must take the full one (see _fast_kernels)."""
    torch = _torch()
    # torch.compile or a dispatch mode: the custom op. Tested first, so that
    # dynamo's trace reads nothing below (no guard on _fast_kernels, which
    # eager calls fill).
    if torch_ops.traced(torch) or not _fast_kernels:
        return None
    # a call autograd records (training) leaves at once, before the checks
    if _needs_grad(q, k, v):
        return None
    t = _validate.fast_block_tensors(q, k, v, offsets)
    if t is None:
        return None
    tag, di, tokens, heads, head_dim, batch = t
    key = _fast_key(block_size, causal, softmax_scale, head_dim, tag)
    kernel = _fast_kernels.get(key) if key is not None else None
    if kernel is None:
        return None
    out = torch.empty_like(q)  # q is contiguous: so is out
    if tokens > 0 and batch > 0:
        kernel._launch_forward(torch, q, k, v, offsets, out, batch, heads, tokens, di)
    return out


# ---- large blocks through the jagged kernels ----------------------------------
# A block of 192-256 tokens is a short jagged sequence: block attention
# with one jagged "sequence" a block is exact, and the jagged backward
# beats the block pattern's (chunked at 256 tokens) there. H200, 2026-12-05
# (bench/results/2026-12-05-h200-large-blocks-b*.json; batch 1152, 4 heads,
# L 1024 / 4096, s 0.7), backward kernels alone, block -> jagged, ms:
#   256 tokens: D128 8.32 -> 4.65, 33.07 -> 18.30; D64 4.40 -> 2.57, 17.44 -> 9.94
#   192 tokens: D128 6.50 -> 4.52, 25.74 -> 18.14; D64 3.47 -> 2.86, 13.71 -> 11.34
# while the jagged forward is the slower one (D64 256: 0.95 -> 1.16 ms). So
# calls autograd records (training) with blocks of 192 tokens or more and
# no rotary embeddings take the jagged kernels for both passes; others keep
# the block kernels. ATTNGEN_BLOCK_VIA_JAGGED=N (read at import) routes
# every call with blocks of N tokens or more instead (for the harness).
_GRAD_ROUTE_MIN_BLOCK = 192

def _route_min_block():
    text = os.environ.get("ATTNGEN_BLOCK_VIA_JAGGED", "").strip()
    try:
        return int(text) if text else None
    except ValueError:
        raise ValueError("ATTNGEN_BLOCK_VIA_JAGGED must be a block size (tokens), got %r"
                         % text) from None


_jagged_route_min_block = _route_min_block()


def _via_jagged(block_size, rotary, grad=False):
    """Whether block_attention takes the jagged kernels for these options:
    with ATTNGEN_BLOCK_VIA_JAGGED, its block size and up, where the rotary
    positions (if any) mean the same with a block as a sequence (a table,
    or the position in the block; not the position in the sequence);
    without it, calls autograd records (grad) with blocks of
    _GRAD_ROUTE_MIN_BLOCK tokens and up and no rotary embeddings."""
    m = _jagged_route_min_block
    if m is None:
        return grad and rotary is None and block_size >= _GRAD_ROUTE_MIN_BLOCK
    return block_size >= m and (rotary is None or rotary["positions"] in ("table", "block"))


def block_cu_seqlens(torch, offsets, total_tokens, block_size):
    """The jagged offsets of block attention: int32 [batch + total_tokens //
    block_size + 1], the first token of every block (cut from each
    sequence's start, the last one partial), then total_tokens repeated
    (empty sequences) up to the fixed length, so each block is one jagged
    sequence. On offsets' device, with no synchronization (the count of
    blocks is at most batch + total_tokens // block_size, the block walk's
    virtual numbering)."""
    batch = int(offsets.shape[0]) - 1
    m = batch + total_tokens // block_size
    if batch <= 0:  # no sequence (offsets [0]; any total_tokens is malformed then)
        return torch.full((m + 1,), total_tokens, dtype=torch.int32, device=offsets.device)
    off = offsets.long()
    blocks = (off[1:] - off[:-1] + block_size - 1) // block_size  # per sequence
    ends = torch.cumsum(blocks, 0)  # blocks up to and including each sequence
    i = torch.arange(m, device=offsets.device)
    seq = torch.searchsorted(ends, i, right=True).clamp_(max=batch - 1)
    start = off[seq] + (i - (ends[seq] - blocks[seq])) * block_size
    start = torch.where(i < ends[-1], start, torch.full_like(start, total_tokens))
    return torch.cat((start, start.new_full((1,), total_tokens))).to(torch.int32)


def _block_via_jagged(query, key, value, offsets, cpu_offsets, block_size, causal,
                      softmax_scale, rotary, rotary_table, poison):
    """block_attention by jagged_attention over block_cu_seqlens (eager or
    traced: jagged_attention takes its own custom op when traced)."""
    from .jagged import jagged_attention
    torch = torch_ops.traced_torch()
    if torch is None:
        torch = _torch()
        _validate.check_block_attention_args(query, key, value, offsets, cpu_offsets,
                                             block_size, causal, softmax_scale, rotary,
                                             rotary_table)
    cu = block_cu_seqlens(torch, offsets, int(query.shape[0]), block_size)
    jr = None if rotary is None else dict(
        rotary, positions="sequence" if rotary["positions"] == "block" else "table")
    return jagged_attention(query, key, value, cu, causal=causal, softmax_scale=softmax_scale,
                            rotary=jr, rotary_table=rotary_table, _poison=poison)


def block_attention(query, key, value, offsets, cpu_offsets=None, *, block_size=64,
                    causal=False, softmax_scale=None, rotary=None, rotary_table=None,
                    _poison=False):
    """Block-diagonal attention over packed sequences.

    query, key, value: [total_tokens, heads, head_dim] (head_dim 64 or 128),
    bf16 or fp16, on one CUDA device; contiguous, or views whose rows alone
    are spaced (column slices of one projection output, e.g. qkv.unbind(1)
    of [total_tokens, 3, heads, head_dim]: read in place by a kernel that
    takes row strides, else copied; any other layout is copied; q, k, v
    that are adjacent slices of one tensor take block_attention_qkvpacked's
    backward, one packed gradient for that tensor). key and value may have fewer heads than
    query, [total_tokens, kv_heads, head_dim] with kv_heads dividing heads
    (grouped-query attention: query head h reads key head h // (heads //
    kv_heads), and their gradients are summed over each group); a kernel
    that does not take kv_heads (Kernel.takes_kv_heads) gets each key head
    repeated for its group. offsets: int32 [batch + 1]
    on that device (offsets[0] = 0, non-decreasing, offsets[-1] =
    total_tokens). Each sequence is cut into blocks of `block_size` tokens
    from its own start; each block attends to itself (token i to tokens
    0..i of its block when causal); the last block of a sequence may be
    partial. softmax_scale None means 1/sqrt(head_dim).

    cpu_offsets (optional, as in Meta's block_attention_api): a host copy of
    offsets (CPU tensor, numpy array or list); when given, its values are
    validated without any device synchronization. Without it the values are
    not checked (the kernel clamps malformed offsets to the tensors' bounds).

    rotary (optional): rotary embeddings fused into the kernels, as the
    spec's rotary mapping: a dict {"layout": "interleaved" | "half",
    "apply_to": e.g. ["q", "k"] (the default), "positions": "table" (the
    default) | "sequence" | "block", "base": 10000.0 (computed positions
    only)}, or a layout name alone. With positions "table", pass
    rotary_table: [total_tokens, head_dim] of q's dtype on q's device, each
    token's sin in the first head_dim/2 columns and cos in the rest.
    Gradients are with respect to the unrotated inputs; the table gets none.

    Differentiable: when grad mode is on and an input requires grad, the
    kernel is built with both passes (`passes: [forward, backward]`, one
    module) and autograd's backward launches attngen's backward kernel
    (dq, dk, dv; no output or logsumexp is saved). For options the backward
    kernel does not fit (none today) the forward runs alone and
    `.backward()` raises UnsupportedError("attngen: the backward pass is not
    supported for these options: <the C message>").

    Runs asynchronously on torch's current CUDA stream and returns a new
    tensor like query. The first call for a new combination of options
    compiles a kernel (seconds; cached on disk afterwards). Options after
    cpu_offsets are keyword-only; bad arguments raise ValueError.
    """
    if cpu_offsets is None and rotary is None and rotary_table is None and not _poison:
        out = _fast_block_forward(query, key, value, offsets, block_size, causal, softmax_scale)
        if out is not None:
            return out
    if _jagged_route_min_block is not None or _needs_grad(query, key, value):
        bs, c, sc, rot = _validate.check_block_options(block_size, causal, softmax_scale, rotary)
        if _via_jagged(bs, rot, _needs_grad(query, key, value)):
            return _block_via_jagged(query, key, value, offsets, cpu_offsets, bs, c, sc, rot,
                                     rotary_table, _poison)
    torch = torch_ops.traced_torch()
    if torch is not None:
        # traced (torch.compile, a dispatch mode): the custom op, which checks
        # its tensors when it runs (cpu_offsets are not read)
        return torch_ops.block_attention(torch, query, key, value, offsets, block_size, causal,
                                         softmax_scale, rotary, rotary_table)
    a = _validate.check_block_attention_args(query, key, value, offsets, cpu_offsets,
                                             block_size, causal, softmax_scale, rotary,
                                             rotary_table)
    opts = (a["block_size"], a["causal"], a["head_dim"], a["dtype_tag"], a["softmax_scale"])
    rotary, table = a["rotary"], a["rotary_table"]
    strided = _wants_row_strides(query, key, value)
    if not _needs_grad(query, key, value):
        # No graph to record: the forward-only kernel, and no autograd.Function
        # machinery (its overhead is comparable to the launch on small problems).
        kernel = _layout_kernel(lambda rs: kernel_for(*opts, rotary=rotary, row_strides=rs),
                                strided)
        key_ = _fast_key(block_size, causal, softmax_scale, a["head_dim"], a["dtype_tag"])
        if rotary is None and key_ is not None and not strided:
            _fast_kernels[key_] = kernel  # these options, checked: the fast path's from now
        return kernel._forward_raw(query, key, value, offsets, a["batch"], _poison, table)
    kernel, refused = _grad_kernel(opts, rotary, _device_index(_torch(), query), strided)
    base = _packed_base(query, key, value) if refused is None else None
    if base is not None:  # views of one qkv: its gradient as one tensor (no stack)
        return _function().packed.apply(base, offsets, kernel, a["batch"], _poison, None, table)
    return _function().apply(query, key, value, offsets, kernel, a["batch"], _poison, refused,
                             table)


def block_attention_api(query, key, value, offsets, cpu_offsets=None):
    """Drop-in for Meta's block_attention_api(query, key, value, offsets,
    cpu_offsets): block 64, non-causal, scale 1/sqrt(head_dim);
    differentiable as block_attention."""
    return block_attention(query, key, value, offsets, cpu_offsets, block_size=64)


def block_attention_qkvpacked(qkv, offsets, cpu_offsets=None, *, block_size=64, causal=False,
                              softmax_scale=None, rotary=None, rotary_table=None, _poison=False):
    """block_attention on one packed qkv: [total_tokens, 3, heads, head_dim]
    (a projection output [total_tokens, 3 * heads * head_dim] viewed so:
    q, k, v = qkv.unbind(1)), as FlashAttention's *_qkvpacked_func take it.
    Options as block_attention's; returns out [total_tokens, heads,
    head_dim].

    Differentiable: the gradient of qkv comes back as one packed tensor
    like qkv, which the projection's backward reads with no concatenation.
    A kernel that takes row strides (Kernel.takes_row_strides) reads q, k,
    v in place and writes dq, dk, dv straight into it; otherwise q, k, v
    are copied once and the gradients stacked.
    """
    torch = torch_ops.traced_torch()
    _validate.check_qkv_packed(qkv, aligned=torch is None)
    q, k, v = qkv.unbind(1)
    # traced, no graph, or the large-block route's options (block_size, rotary):
    # block_attention on the slices
    if torch is not None or not _needs_grad(qkv) or \
            _via_jagged(*_validate.check_block_options(block_size, causal, softmax_scale,
                                                       rotary)[::3], True):
        return block_attention(q, k, v, offsets, cpu_offsets, block_size=block_size,
                               causal=causal, softmax_scale=softmax_scale, rotary=rotary,
                               rotary_table=rotary_table, _poison=_poison)
    a = _validate.check_block_attention_args(q, k, v, offsets, cpu_offsets, block_size, causal,
                                             softmax_scale, rotary, rotary_table)
    opts = (a["block_size"], a["causal"], a["head_dim"], a["dtype_tag"], a["softmax_scale"])
    kernel, refused = _grad_kernel(opts, a["rotary"], _device_index(_torch(), q), True)
    return _function().packed.apply(qkv, offsets, kernel, a["batch"], _poison, refused,
                                     a["rotary_table"])
