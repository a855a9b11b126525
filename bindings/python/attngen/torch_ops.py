# SPDX-License-Identifier: BSD-3-Clause
"""attngen's entry points as torch.library custom ops, for torch.compile.

    torch.ops.attngen.block_attention        (+ block_attention_backward)
    torch.ops.attngen.jagged_attention       (+ jagged_attention_backward)
    torch.ops.attngen.broadcast_attention    (+ broadcast_attention_backward)

Each forward op has a fake implementation (output shapes, for tracing), an
autograd formula that calls its backward op, and a FLOP formula that
torch.utils.flop_counter.FlopCounterMode uses (the useful FLOPs of
bench/: 4 * head_dim * heads per visible pair forward, 2.5 times that
backward; it reads the offsets back to the host, as torch's own formulas
for varlen attention do).

Under torch.compile, attngen.block_attention, jagged_attention and
broadcast_attention call these ops, so that `torch.compile(fullgraph=True)`
traces forward and backward without a graph break. Eager calls keep their
direct path (an op's dispatch costs host time on small shapes); both launch
the same kernels. The ops take the public functions' options as plain
values (rotary as canonical text, see rotary_text) and check every argument
when they run, as the public functions do; under compilation the host-side
checks of cpu_offsets are skipped.

The ops are registered when torch.compile's machinery (torch._dynamo) or
torch.utils.flop_counter is imported, before or after attngen (arm()),
when a dispatch mode reaches attngen's functions, and on the first lookup
in torch.ops.attngen (lazy_namespace); register() does it at once.
Registering costs about 15 ms of host time (torch builds each op's fake and
autograd wrappers), which a process that only runs eager calls, the eager
path needing none of it, does not pay at import.
"""

import importlib.abc
import importlib.util
import sys
import threading
import warnings
from typing import Optional, Tuple

from . import _flops, _validate

_lock = threading.Lock()
_registered = False
_failed = None  # why registering failed (then it is not tried again)
_defining = None  # the thread inside _define (torch looks into torch.ops.attngen there)

_TENSORS = ("q", "k", "v")


def rotary_text(rotary):
    """The canonical text of a normalized rotary dict (check_rotary's), ""
    for None: "layout=half;apply_to=q,k;positions=table;base=" (base empty
    with positions from a table). The ops take it in place of the dict."""
    if rotary is None:
        return ""
    base = "" if rotary["base"] is None else repr(float(rotary["base"]))
    return "layout=%s;apply_to=%s;positions=%s;base=%s" % (
        rotary["layout"], ",".join(rotary["apply_to"]), rotary["positions"], base)


def rotary_from_text(text):
    """The rotary dict of rotary_text's text (None for "")."""
    if not text:
        return None
    fields = dict(part.split("=", 1) for part in text.split(";"))
    try:
        return {"layout": fields["layout"],
                "apply_to": tuple(t for t in fields["apply_to"].split(",") if t),
                "positions": fields["positions"],
                "base": float(fields["base"]) if fields["base"] else None}
    except (KeyError, ValueError):
        raise ValueError("attngen: malformed rotary text %r (expected %r)"
                         % (text, "layout=...;apply_to=...;positions=...;base=...")) from None


def traced_torch():
    """torch when the public functions should call the custom ops (see
    traced), else None; never imports torch (not imported: nothing traces).
    Outside torch.compile (a dispatch mode) the ops are registered here if
    they were not yet; under it they must be already (register())."""
    torch = sys.modules.get("torch")
    if torch is None or not traced(torch):
        return None
    if not _registered:
        if _compiling(torch) and not _failed:
            # arm()'s hook on torch._dynamo's import did not run (it was
            # imported past sys.meta_path): registering inside dynamo's trace
            # cannot work
            raise RuntimeError(
                "attngen: torch.compile reached attngen before its custom ops were registered: "
                "call attngen.register_custom_ops() before compiling")
        if not register():
            return None  # no custom ops on this torch: the direct path (warned once)
    return torch


def _compiling(torch):
    compiler = getattr(torch, "compiler", None)
    is_compiling = getattr(compiler, "is_compiling", None)
    return bool(is_compiling and is_compiling())


def traced(torch):
    """Whether the public functions should call the custom ops: torch.compile
    (dynamo) is tracing the caller, or a TorchDispatchMode is active
    (FlopCounterMode, FakeTensorMode, make_fx, ...), which sees the op as one."""
    if _compiling(torch):
        return True
    depth = getattr(torch._C, "_len_torch_dispatch_stack", None)
    return bool(depth and depth() > 0)


def register():
    """Defines the attngen custom ops (idempotent, thread-safe), and their
    FLOP formulas now if torch.utils.flop_counter is imported, else as soon
    as it is (importing it costs about 100 ms, which a process that never
    counts FLOPs should not pay). Returns whether the ops exist: a torch
    without torch.library.custom_op (before 2.4) gets a warning, once, and
    attngen's direct (eager) paths alone."""
    global _registered, _failed, _defining
    if _registered or _failed:
        return _registered
    with _lock:
        if not _registered and not _failed:
            import torch
            _defining = threading.get_ident()
            try:
                _define(torch)
            except Exception as e:
                _failed = "%s: %s" % (type(e).__name__, e)
                warnings.warn("attngen: its torch.library custom ops could not be registered "
                              "(%s); torch.compile will not trace attngen's functions, eager "
                              "calls are unaffected" % _failed)
                return False
            finally:
                _defining = None
            _registered = True
            _disarm()
    # Outside the lock: importing flop_counter waits for its module lock,
    # which a thread importing it holds while its hook waits for _lock.
    _flops_when_ready()
    return _registered


_flops_lock = threading.Lock()
_flops_state = {"armed": False, "done": False}


def _flops_when_ready():
    """The ops' FLOP formulas now if torch.utils.flop_counter is imported
    (or being imported: then once its module runs), else after its import."""
    with _flops_lock:
        if _flops_state["armed"]:
            return
        _flops_state["armed"] = True
    _after_import(_FLOP_MODULE, _define_flops_once)


def _define_flops_once():
    import torch
    from torch.utils.flop_counter import register_flop_formula  # no lock of ours held
    with _flops_lock:
        if _flops_state["done"]:
            return
        _define_flops(torch, register_flop_formula)
        _flops_state["done"] = True


_FLOP_MODULE = "torch.utils.flop_counter"


class _PostImport(importlib.abc.MetaPathFinder):
    """Runs a callback once `name` has been imported: a finder that wraps
    that module's loader, and leaves sys.meta_path once the module has run
    (a mere find_spec probe does not disarm it)."""

    def __init__(self, name, callback):
        self.name, self.callback = name, callback
        self.busy = self.done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self.busy or self.done:
            return None
        self.busy = True  # the lookup below asks the finders again, this one included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return spec
        if not hasattr(spec.loader, "exec_module"):
            return spec  # an old-style loader: left alone (no hook for this import)
        spec.loader = _HookedLoader(spec.loader, self)
        return spec


class _HookedLoader:
    """A module's loader that runs a _PostImport's callback once the module
    has run; every other attribute (get_source, is_package, the resource
    reader, ...) is the wrapped loader's."""

    def __init__(self, loader, finder):
        self._loader, self._finder = loader, finder

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self._loader.exec_module(module)
        finder = self._finder
        if not finder.done:
            finder.done = True
            try:
                sys.meta_path.remove(finder)
            except ValueError:
                pass
            _guarded(finder.callback)


def _guarded(callback):
    """callback(), its failure a warning (it runs inside someone's import)."""
    try:
        callback()
    except Exception as e:  # pragma: no cover - a torch without what we use
        warnings.warn("attngen: the FLOP formulas of its custom ops could not be registered: "
                      "%s: %s" % (type(e).__name__, e))


def _after_import(name, callback):
    """callback() now if `name` is imported, else after its import; returns
    the finder that waits for it (None if it ran now)."""
    if name in sys.modules:
        _guarded(callback)
        return None
    finder = _PostImport(name, callback)
    sys.meta_path.insert(0, finder)
    return finder


def registered():
    return _registered


# The modules whose import means the ops will be wanted: torch.compile and
# torch.export load torch._dynamo before they trace; FlopCounterMode users
# load torch.utils.flop_counter.
_TRIGGERS = ("torch._dynamo", _FLOP_MODULE)


def arm():
    """Registers the ops now if a trigger module is already imported, else
    as soon as one is, or as soon as torch.ops.attngen is looked into
    (attngen's import calls this)."""
    if any(name in sys.modules for name in _TRIGGERS):
        register()
        return
    _armed.extend(_after_import(name, _register_with_flops if name == _FLOP_MODULE else register)
                  for name in _TRIGGERS)
    torch = sys.modules.get("torch")
    if torch is not None:
        lazy_namespace(torch)
    else:
        _armed.append(_after_import("torch", lambda: lazy_namespace(sys.modules["torch"])))


def _register_with_flops():
    """The hook of flop_counter's import: the ops and, at once, their FLOP
    formulas (the module is whole now; a finder that register() set for it
    meanwhile would come too late for this import)."""
    if register():
        _define_flops_once()


def lazy_namespace(torch):
    """torch.ops.attngen as a namespace that registers the ops on its first
    lookup (a script naming torch.ops.attngen.*, a saved graph that
    torch.load resolves), so that deferring the registration breaks none
    of them. Without torch's _OpNamespace (a torch that moved it), the ops
    are registered now instead."""
    if _registered or _failed:
        return
    base = getattr(getattr(torch, "_ops", None), "_OpNamespace", None)
    ops = getattr(torch, "ops", None)
    if base is None or ops is None:
        register()
        return

    class _AttngenNamespace(base):
        # the ops' packets take their __module__ from the namespace's; pickled
        # graphs find them there (torch._ops.attngen)
        __module__ = base.__module__

        def __getattr__(self, name):
            if not name.startswith("__") and not _registered and not _failed and \
                    _defining != threading.get_ident():
                register()
            return super().__getattr__(name)

    try:
        setattr(ops, "attngen", _AttngenNamespace("attngen"))
    except Exception:  # pragma: no cover - a torch.ops that refuses it
        register()


_armed = []  # arm()'s finders, which leave sys.meta_path once the ops exist


def _disarm():
    while _armed:
        finder = _armed.pop()
        if finder in sys.meta_path:  # not the one that fired (it has left)
            sys.meta_path.remove(finder)


def _window(left, right):
    return (int(left), int(right))


def _define(torch):
    from . import broadcast, jagged, ops

    def backward_kernel(grad_kernel):
        """The kernel of a backward op: the pattern's _grad_kernel pair, its
        refusal (options the backward does not fit, a library without the
        backward) raised as the eager backward raises it."""
        kernel, refused = grad_kernel
        if refused is not None:
            raise refused.error()
        return kernel

    def dout_like(dout, t):
        """dout as the backward kernels take it (t's dtype, contiguous,
        aligned), checked against t."""
        dout = ops._dout_for(dout, t)
        _validate.check_dout(dout, t)
        return dout

    # ---- block_attention ------------------------------------------------------

    def block_check(q, k, v, offsets, block_size, causal, softmax_scale, rotary, table):
        a = _validate.check_block_attention_args(q, k, v, offsets, None, block_size, causal,
                                                 softmax_scale, rotary_from_text(rotary), table)
        opts = (a["block_size"], a["causal"], a["head_dim"], a["dtype_tag"], a["softmax_scale"])
        return a, opts

    @torch.library.custom_op("attngen::block_attention", mutates_args=())
    def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        offsets: torch.Tensor, block_size: int, causal: bool,
                        softmax_scale: Optional[float], rotary: str,
                        rotary_table: Optional[torch.Tensor],
                        with_backward: bool) -> torch.Tensor:
        a, opts = block_check(q, k, v, offsets, block_size, causal, softmax_scale, rotary,
                              rotary_table)
        # the kernels eager block_attention takes for this layout (row strides
        # for views of one projection and grouped heads)
        strided = ops._wants_row_strides(q, k, v)
        if with_backward:
            kernel, _ = ops._grad_kernel(opts, a["rotary"], ops._device_index(torch, q), strided)
        else:
            kernel = ops._layout_kernel(
                lambda rs: ops.kernel_for(*opts, rotary=a["rotary"], row_strides=rs), strided)
        return kernel._forward_raw(q, k, v, offsets, a["batch"], False, rotary_table)

    @block_attention.register_fake
    def _(q, k, v, offsets, block_size, causal, softmax_scale, rotary, rotary_table,
          with_backward):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.custom_op("attngen::block_attention_backward", mutates_args=())
    def block_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                                 v: torch.Tensor, offsets: torch.Tensor, block_size: int,
                                 causal: bool, softmax_scale: Optional[float], rotary: str,
                                 rotary_table: Optional[torch.Tensor]
                                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, opts = block_check(q, k, v, offsets, block_size, causal, softmax_scale, rotary,
                              rotary_table)
        kernel = backward_kernel(ops._grad_kernel(opts, a["rotary"], ops._device_index(torch, q),
                                                  ops._wants_row_strides(q, k, v)))
        return kernel._backward_raw(dout_like(dout, q), q, k, v, offsets, a["batch"], False,
                                    rotary_table)

    @block_attention_backward.register_fake
    def _(dout, q, k, v, offsets, block_size, causal, softmax_scale, rotary, rotary_table):
        return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                     for t in (q, k, v))

    def block_setup(ctx, inputs, output):
        q, k, v, offsets, block_size, causal, scale, rotary, table, _ = inputs
        ctx.save_for_backward(q, k, v, offsets, table)
        ctx.opts = (block_size, causal, scale, rotary)

    def block_grad(ctx, grad_out):
        q, k, v, offsets, table = ctx.saved_tensors
        dq, dk, dv = torch.ops.attngen.block_attention_backward(
            grad_out.to(q.dtype).contiguous(), q, k, v, offsets, *ctx.opts, table)
        return dq, dk, dv, None, None, None, None, None, None, None

    block_attention.register_autograd(block_grad, setup_context=block_setup)

    # ---- jagged_attention -----------------------------------------------------

    def jagged_check(q, k, v, cu_q, cu_k, causal, wl, wr, scale, deterministic, rotary, t, tk):
        a = _validate.check_jagged_attention_args(q, k, v, cu_q, cu_k, causal, _window(wl, wr),
                                                  scale, rotary_from_text(rotary), t,
                                                  deterministic, 0.0, tk)
        opts = (a["head_dim"], a["dtype_tag"], a["causal"], a["window"], a["softmax_scale"],
                a["deterministic"])
        return a, opts

    @torch.library.custom_op("attngen::jagged_attention", mutates_args=())
    def jagged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, causal: bool,
                         window_left: int, window_right: int, softmax_scale: Optional[float],
                         deterministic: bool, rotary: str, rotary_table: Optional[torch.Tensor],
                         rotary_table_k: Optional[torch.Tensor],
                         with_backward: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        a, opts = jagged_check(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window_left,
                               window_right, softmax_scale, deterministic, rotary, rotary_table,
                               rotary_table_k)
        if with_backward:
            kernel, _ = jagged._grad_kernel(opts, a["rotary"], ops._device_index(torch, q))
        else:
            kernel = jagged.jagged_kernel_for(*opts, rotary=a["rotary"])
        return jagged._forward_raw(kernel, q, k, v, cu_seqlens_q, cu_seqlens_k, a["batch"],
                                   False, rotary_table, rotary_table_k)

    @jagged_attention.register_fake
    def _(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window_left, window_right,
          softmax_scale, deterministic, rotary, rotary_table, rotary_table_k, with_backward):
        total_q, heads, _ = q.shape
        return (torch.empty_like(q, memory_format=torch.contiguous_format),
                q.new_empty((heads, total_q), dtype=torch.float32))

    @torch.library.custom_op("attngen::jagged_attention_backward", mutates_args=())
    def jagged_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                                  v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                                  cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                                  causal: bool, window_left: int, window_right: int,
                                  softmax_scale: Optional[float], deterministic: bool,
                                  rotary: str, rotary_table: Optional[torch.Tensor],
                                  rotary_table_k: Optional[torch.Tensor]
                                  ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, opts = jagged_check(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window_left,
                               window_right, softmax_scale, deterministic, rotary, rotary_table,
                               rotary_table_k)
        kernel = backward_kernel(jagged._grad_kernel(opts, a["rotary"],
                                                     ops._device_index(torch, q)))
        return jagged._backward_raw(kernel, dout_like(dout, q), q, k, v, out, lse,
                                    cu_seqlens_q, cu_seqlens_k, a["batch"], False, rotary_table,
                                    rotary_table_k)

    @jagged_attention_backward.register_fake
    def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal, window_left,
          window_right, softmax_scale, deterministic, rotary, rotary_table, rotary_table_k):
        return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                     for t in (q, k, v))

    def jagged_setup(ctx, inputs, output):
        (q, k, v, cu_q, cu_k, causal, wl, wr, scale, deterministic, rotary, table, table_k,
         _) = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, table, table_k)
        ctx.opts = (causal, wl, wr, scale, deterministic, rotary)
        ctx.mark_non_differentiable(lse)

    def jagged_grad(ctx, grad_out, grad_lse):
        q, k, v, out, lse, cu_q, cu_k, table, table_k = ctx.saved_tensors
        dq, dk, dv = torch.ops.attngen.jagged_attention_backward(
            grad_out.to(q.dtype).contiguous(), q, k, v, out, lse, cu_q, cu_k, *ctx.opts, table,
            table_k)
        return dq, dk, dv, *([None] * 11)

    jagged_attention.register_autograd(jagged_grad, setup_context=jagged_setup)

    # ---- broadcast_attention --------------------------------------------------

    def broadcast_check(q, k, v, cu_k, causal, wl, wr, scale, deterministic, rotary, t, tk):
        a = _validate.check_broadcast_attention_args(q, k, v, cu_k, causal, _window(wl, wr),
                                                     scale, rotary_from_text(rotary), t,
                                                     deterministic, tk)
        opts = (a["head_dim"], a["dtype_tag"], a["causal"], a["window"], a["softmax_scale"],
                a["deterministic"])
        return a, opts

    @torch.library.custom_op("attngen::broadcast_attention", mutates_args=())
    def broadcast_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cu_seqlens_k: torch.Tensor, causal: bool, window_left: int,
                            window_right: int, softmax_scale: Optional[float],
                            deterministic: bool, rotary: str,
                            rotary_table: Optional[torch.Tensor],
                            rotary_table_k: Optional[torch.Tensor],
                            with_backward: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        a, opts = broadcast_check(q, k, v, cu_seqlens_k, causal, window_left, window_right,
                                  softmax_scale, deterministic, rotary, rotary_table,
                                  rotary_table_k)
        if with_backward:
            kernel, _ = broadcast._grad_kernel(opts, a["rotary"], ops._device_index(torch, q))
        else:
            kernel = broadcast.broadcast_kernel_for(*opts, rotary=a["rotary"])
        return broadcast._forward_raw(kernel, q, k, v, cu_seqlens_k, a["batch"], False,
                                      rotary_table, rotary_table_k)

    @broadcast_attention.register_fake
    def _(q, k, v, cu_seqlens_k, causal, window_left, window_right, softmax_scale,
          deterministic, rotary, rotary_table, rotary_table_k, with_backward):
        n_q, heads, dim = q.shape
        rows = (cu_seqlens_k.shape[0] - 1) * n_q
        return (q.new_empty((rows, heads, dim)),
                q.new_empty((heads, rows), dtype=torch.float32))

    @torch.library.custom_op("attngen::broadcast_attention_backward", mutates_args=())
    def broadcast_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                                     v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                                     cu_seqlens_k: torch.Tensor, causal: bool, window_left: int,
                                     window_right: int, softmax_scale: Optional[float],
                                     deterministic: bool, rotary: str,
                                     rotary_table: Optional[torch.Tensor],
                                     rotary_table_k: Optional[torch.Tensor]
                                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, opts = broadcast_check(q, k, v, cu_seqlens_k, causal, window_left, window_right,
                                  softmax_scale, deterministic, rotary, rotary_table,
                                  rotary_table_k)
        kernel = backward_kernel(broadcast._grad_kernel(opts, a["rotary"],
                                                        ops._device_index(torch, q)))
        return broadcast._backward_raw(kernel, dout_like(dout, out), q, k, v, out, lse,
                                       cu_seqlens_k, a["batch"], False, rotary_table,
                                       rotary_table_k)

    @broadcast_attention_backward.register_fake
    def _(dout, q, k, v, out, lse, cu_seqlens_k, causal, window_left, window_right,
          softmax_scale, deterministic, rotary, rotary_table, rotary_table_k):
        return tuple(torch.empty_like(t, memory_format=torch.contiguous_format)
                     for t in (q, k, v))

    def broadcast_setup(ctx, inputs, output):
        q, k, v, cu_k, causal, wl, wr, scale, deterministic, rotary, table, table_k, _ = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, cu_k, table, table_k)
        ctx.opts = (causal, wl, wr, scale, deterministic, rotary)
        ctx.mark_non_differentiable(lse)

    def broadcast_grad(ctx, grad_out, grad_lse):
        q, k, v, out, lse, cu_k, table, table_k = ctx.saved_tensors
        dq, dk, dv = torch.ops.attngen.broadcast_attention_backward(
            grad_out.to(q.dtype).contiguous(), q, k, v, out, lse, cu_k, *ctx.opts, table,
            table_k)
        return dq, dk, dv, *([None] * 10)

    broadcast_attention.register_autograd(broadcast_grad, setup_context=broadcast_setup)


def _define_flops(torch, register_flop_formula):
    """The FLOP formulas of the ops, for FlopCounterMode."""

    @register_flop_formula(torch.ops.attngen.block_attention, get_raw=True)
    def _(q, k, v, offsets, block_size, causal, *args, out_val=None, **kwargs):
        return _flops.block_forward(torch, q, offsets, block_size, causal)

    @register_flop_formula(torch.ops.attngen.block_attention_backward, get_raw=True)
    def _(dout, q, k, v, offsets, block_size, causal, *args, out_val=None, **kwargs):
        return _flops.backward(_flops.block_forward(torch, q, offsets, block_size, causal))

    def jagged_fwd_flops(q, cu_q, cu_k, causal, wl, wr):
        c, window = _validate.check_window_size(_window(wl, wr), causal)
        return _flops.jagged_forward(torch, q, cu_q, cu_k, c, window)

    @register_flop_formula(torch.ops.attngen.jagged_attention, get_raw=True)
    def _(q, k, v, cu_q, cu_k, causal, wl, wr, *args, out_val=None, **kwargs):
        return jagged_fwd_flops(q, cu_q, cu_k, causal, wl, wr)

    @register_flop_formula(torch.ops.attngen.jagged_attention_backward, get_raw=True)
    def _(dout, q, k, v, out, lse, cu_q, cu_k, causal, wl, wr, *args, out_val=None, **kwargs):
        return _flops.backward(jagged_fwd_flops(q, cu_q, cu_k, causal, wl, wr))

    def broadcast_fwd_flops(q, cu_k, causal, wl, wr):
        c, window = _validate.check_window_size(_window(wl, wr), causal)
        return _flops.broadcast_forward(torch, q, cu_k, c, window)

    @register_flop_formula(torch.ops.attngen.broadcast_attention, get_raw=True)
    def _(q, k, v, cu_k, causal, wl, wr, *args, out_val=None, **kwargs):
        return broadcast_fwd_flops(q, cu_k, causal, wl, wr)

    @register_flop_formula(torch.ops.attngen.broadcast_attention_backward, get_raw=True)
    def _(dout, q, k, v, out, lse, cu_k, causal, wl, wr, *args, out_val=None, **kwargs):
        return _flops.backward(broadcast_fwd_flops(q, cu_k, causal, wl, wr))


# ---- what the public functions call under torch.compile ------------------------------

def _needs_grad(torch, *tensors):
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def block_attention(torch, q, k, v, offsets, block_size, causal, softmax_scale, rotary,
                    rotary_table):
    block_size, causal, softmax_scale, rotary = _validate.check_block_options(
        block_size, causal, softmax_scale, rotary)
    return torch.ops.attngen.block_attention(
        q, k, v, offsets, block_size, causal, softmax_scale, rotary_text(rotary), rotary_table,
        _needs_grad(torch, q, k, v))


def jagged_attention(torch, q, k, v, cu_q, cu_k, causal, window_size, softmax_scale,
                     deterministic, rotary, rotary_table, rotary_table_k, dropout_p):
    # the options checked as eager calls check them; the raw window sides
    # go to the op, which maps them again when it runs
    _, _, softmax_scale, rotary, _ = _validate.check_jagged_options(
        causal, window_size, softmax_scale, rotary, deterministic, dropout_p)
    if cu_k is None:  # the op takes cu_seqlens_q for both then, and would read k by it
        _validate.check_self_attention_tokens(q.shape[0], k.shape[0])
    return torch.ops.attngen.jagged_attention(
        q, k, v, cu_q, cu_q if cu_k is None else cu_k, causal, int(window_size[0]),
        int(window_size[1]), softmax_scale, deterministic, rotary_text(rotary), rotary_table,
        rotary_table_k, _needs_grad(torch, q, k, v))


def broadcast_attention(torch, q, k, v, cu_k, causal, window_size, softmax_scale,
                        deterministic, rotary, rotary_table, rotary_table_k):
    _, _, softmax_scale, rotary, _ = _validate.check_broadcast_options(
        causal, window_size, softmax_scale, rotary, deterministic)
    return torch.ops.attngen.broadcast_attention(
        q, k, v, cu_k, causal, int(window_size[0]), int(window_size[1]), softmax_scale,
        deterministic, rotary_text(rotary), rotary_table, rotary_table_k,
        _needs_grad(torch, q, k, v))
