# SPDX-License-Identifier: BSD-3-Clause
"""A STUB of the few torch.Tensor attributes attngen's argument checks read
(.dtype, .shape, .device, .get_device(), .is_contiguous(), .data_ptr(),
.tolist()), and of
the few torch functions attngen.ops and attngen.jagged call around a launch
(FakeTorch: empty_like, full_like, empty, full, is_grad_enabled,
cuda.current_stream, and a minimal autograd.Function that records the ctx
so a test can call backward; outputs marked non-differentiable get none).

It is not torch and computes nothing: it lets the pure-Python validation in
attngen._validate and the wiring of attngen.ops (which kernel, which C entry
point, which pointers and stream, which gradients come back) run on machines
without torch (CI). The GPU tests use real torch tensors instead.
"""
import itertools

_ptrs = itertools.count(0x7F0000100000, 0x100000)  # fresh, 16-byte aligned addresses


class StubDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name

    __repr__ = __str__

    def __eq__(self, other):
        return isinstance(other, StubDtype) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


bfloat16 = StubDtype("bfloat16")
float16 = StubDtype("float16")
float32 = StubDtype("float32")
int32 = StubDtype("int32")
int64 = StubDtype("int64")


class StubDevice:
    def __init__(self, spec="cuda:0"):
        kind, _, index = spec.partition(":")
        self.type = kind
        self.index = int(index) if index else (0 if kind == "cuda" else None)

    def __str__(self):
        return self.type if self.index is None else "%s:%d" % (self.type, self.index)

    __repr__ = __str__

    def __eq__(self, other):
        return isinstance(other, StubDevice) and (other.type, other.index) == (self.type, self.index)

    def __hash__(self):
        return hash((self.type, self.index))


class StubTensor:
    """Shape/dtype/device metadata only; `values` backs tolist() for offsets."""

    def __init__(self, shape, dtype=bfloat16, device="cuda:0", contiguous=True, ptr=0x7F0000000000,
                 values=None, requires_grad=False, strides=None):
        self.shape = tuple(shape)
        # element strides: given for views (unbind), else the packed ones
        if strides is None:
            strides, n = [], 1
            for d in reversed(self.shape):
                strides.insert(0, n)
                n *= max(int(d), 1)
        self._strides = tuple(strides)
        self.stacked_from = None  # the tensors FakeTorch.stack stacked into it
        self.dtype = dtype
        self.device = device if isinstance(device, StubDevice) else StubDevice(device)
        self._contiguous = contiguous
        self._ptr = ptr
        self._values = values
        self.requires_grad = requires_grad
        self.fill = None       # what full_like filled it with (FakeTorch)
        self.grad_fn = None    # (Function class, ctx) after FakeFunction.apply

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def is_contiguous(self):
        return self._contiguous

    def get_device(self):
        return self.device.index if self.device.type == "cuda" else -1

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def view(self, *shape):
        out = StubTensor(shape, self.dtype, self.device, self._contiguous, self._ptr)
        out.viewed_from = self
        return out

    def sum(self, dim):
        out = self._like(shape=self.shape[:dim] + self.shape[dim + 1:])
        out.summed_from = (self, dim)
        return out

    def repeat_interleave(self, repeats, dim):
        shape = list(self.shape)
        shape[dim] *= repeats
        out = self._like(shape=tuple(shape))
        out.repeated_from = (self, repeats, dim)
        return out

    def unbind(self, dim):
        """Views along dim, each at its own data pointer (2-byte elements),
        contiguous only when no other dimension is spaced by dim's removal
        (here: when dim is 0, or the leading dimensions have one element)."""
        shape = self.shape[:dim] + self.shape[dim + 1:]
        strides = self._strides[:dim] + self._strides[dim + 1:]
        contiguous = self._contiguous and all(int(d) <= 1 for d in self.shape[:dim])
        return tuple(StubTensor(shape, self.dtype, self.device, contiguous,
                                self._ptr + i * self._strides[dim] * 2, strides=strides)
                     for i in range(self.shape[dim]))

    def _like(self, **kw):
        args = dict(shape=self.shape, dtype=self.dtype, device=self.device, ptr=next(_ptrs))
        args.update(kw)
        return StubTensor(**args)

    def contiguous(self):
        return self if self._contiguous else self._like()

    def clone(self):
        return self._like()

    def to(self, dtype):
        return self if dtype == self.dtype else self._like(dtype=dtype)

    def zero_(self):
        self.fill = 0.0
        return self

    def fill_(self, value):
        self.fill = value
        return self

    def requires_grad_(self, flag=True):
        self.requires_grad = flag
        return self

    def tolist(self):
        if self._values is None:
            raise AssertionError("stub tensor has no values")
        return list(self._values)


def qkv(tokens=100, heads=4, head_dim=128, dtype=bfloat16, device="cuda:0"):
    return tuple(StubTensor((tokens, heads, head_dim), dtype, device) for _ in range(3))


def offsets(values, device="cuda:0", dtype=int32):
    return StubTensor((len(values),), dtype, device, values=values)


# ---- FakeTorch: the torch functions attngen.ops calls ------------------------

class _Stream:
    def __init__(self, handle):
        self.cuda_stream = handle


class FakeCtx:
    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad
        self.saved_tensors = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors


class FakeFunction:
    """autograd.Function's calling convention: apply() runs forward with a
    ctx whose needs_input_grad reflects requires_grad; the output keeps
    (class, ctx) so `run_backward(out, grad)` can call backward."""

    @classmethod
    def apply(cls, *args):
        ctx = FakeCtx(tuple(bool(getattr(a, "requires_grad", False)) for a in args))
        out = cls.forward(ctx, *args)
        for t in (out if isinstance(out, tuple) else (out,)):
            if t not in getattr(ctx, "non_differentiable", ()):
                t.grad_fn = (cls, ctx)
                t.requires_grad = True
        return out


def run_backward(out, grad):
    cls, ctx = out.grad_fn
    return cls.backward(ctx, grad)


class _Namespace:
    def __init__(self, **kw):
        self.__dict__.update(kw)


class FakeTorch:
    """Stands in for the torch module inside attngen.ops (monkeypatch
    ops._torch to return one)."""

    contiguous_format = "contiguous_format"
    bfloat16, float16, float32, int32, int64 = bfloat16, float16, float32, int32, int64

    def __init__(self, stream=0x5EED, grad_enabled=True, device_index=0):
        self.grad_enabled = grad_enabled
        self.streams = []
        self.cuda = _Namespace(
            current_stream=lambda dev=None: (self.streams.append(dev), _Stream(stream))[1],
            current_device=lambda: device_index,
            is_available=lambda: True)
        self.autograd = _Namespace(Function=FakeFunction,
                                   function=_Namespace(once_differentiable=lambda f: f))
        self.compiler = _Namespace(is_compiling=lambda: False)
        self._C = _Namespace(_len_torch_dispatch_stack=lambda: 0)

    def is_grad_enabled(self):
        return self.grad_enabled

    def empty_like(self, t, memory_format=None):
        # torch's default (preserve_format) keeps a contiguous tensor's layout
        assert memory_format == self.contiguous_format or t.is_contiguous()
        return t._like(contiguous=True)

    def empty(self, shape, dtype=None, device=None):
        return StubTensor(shape, dtype, device if device is not None else "cuda:0",
                          ptr=next(_ptrs))

    def full(self, shape, value, dtype=None, device=None):
        out = self.empty(shape, dtype, device)
        out.fill = value
        return out

    def stack(self, tensors, dim=0):
        shape = tuple(tensors[0].shape)
        out = self.empty(shape[:dim] + (len(tensors),) + shape[dim:], tensors[0].dtype,
                         tensors[0].device)
        out.stacked_from = tuple(tensors)
        return out

    def full_like(self, t, value, memory_format=None):
        assert memory_format == self.contiguous_format
        out = t._like(contiguous=True)
        out.fill = value
        return out
