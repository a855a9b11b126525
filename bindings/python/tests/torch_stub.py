"""A STUB of the few torch.Tensor attributes attngen's argument checks read
(.dtype, .shape, .device, .is_contiguous(), .data_ptr(), .tolist()).

It is not torch and computes nothing: it lets the pure-Python validation in
attngen._validate run on machines without torch (CI). The GPU tests use
real torch tensors instead.
"""


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
                 values=None):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = StubDevice(device)
        self._contiguous = contiguous
        self._ptr = ptr
        self._values = values

    def is_contiguous(self):
        return self._contiguous

    def data_ptr(self):
        return self._ptr

    def tolist(self):
        if self._values is None:
            raise AssertionError("stub tensor has no values")
        return list(self._values)


def qkv(tokens=100, heads=4, head_dim=128, dtype=bfloat16, device="cuda:0"):
    return tuple(StubTensor((tokens, heads, head_dim), dtype, device) for _ in range(3))


def offsets(values, device="cuda:0", dtype=int32):
    return StubTensor((len(values),), dtype, device, values=values)
