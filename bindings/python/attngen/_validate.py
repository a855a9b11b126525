# SPDX-License-Identifier: BSD-3-Clause
"""Argument checks for block_attention, written against duck types so they
run (and are tested) without torch.

A "tensor" here is anything with `.dtype` (whose str() is "torch.bfloat16",
"torch.float16", "torch.int32", ...), `.shape` (a sequence of ints),
`.device` (with `.type` and `.index`), `.is_contiguous()` and optionally
`.data_ptr()`. Every check raises ValueError with a message that names the
argument, what was expected and what was given. Nothing here synchronizes
with a device or reads tensor contents, except `check_cpu_offsets`, which
reads a host copy only.
"""

from . import _errors

HALF_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}
HEAD_DIMS = (64, 128)
BLOCK_MIN, BLOCK_MAX, BLOCK_STEP = 16, 256, 16
ALIGNMENT = 16


def dtype_name(dtype):
    """'torch.bfloat16' for torch.bfloat16 (and for stubs whose str() says so)."""
    return str(dtype)


def _shape(t):
    return tuple(int(s) for s in t.shape)


def _device_str(dev):
    return str(dev)


def _is_cuda(dev):
    return getattr(dev, "type", None) == "cuda"


def check_block_size(block_size):
    if isinstance(block_size, bool):
        raise ValueError("block_size must be an int, got %r" % (block_size,))
    if not isinstance(block_size, int):
        # numpy / torch integer scalars have __index__
        try:
            block_size = block_size.__index__()
        except AttributeError:
            raise ValueError("block_size must be an int, got %r" % (block_size,)) from None
    if not (BLOCK_MIN <= block_size <= BLOCK_MAX) or block_size % BLOCK_STEP:
        raise ValueError("block_size must be a multiple of %d in %d..%d, got %d"
                         % (BLOCK_STEP, BLOCK_MIN, BLOCK_MAX, block_size))
    return block_size


# The kernels hold the softmax scale (also times log2(e)) and the rotary base
# as fp32 literals: the C validator's bounds (generator/spec_check.c).
FP32_MIN_NORMAL = 1.1754943508222875e-38
MAX_SOFTMAX_SCALE = 2.3585e38
MAX_ROTARY_BASE = 3.4028e38


def _fp32_range(what, x, top):
    if not (FP32_MIN_NORMAL <= x <= top):
        raise ValueError("%s is out of range (the kernels hold it in fp32: between %.9g and "
                         "%.9g; got %r)" % (what, FP32_MIN_NORMAL, top, x))


def check_softmax_scale(softmax_scale):
    if softmax_scale is None:
        return None
    if isinstance(softmax_scale, bool):
        raise ValueError("softmax_scale must be None or a positive float, got %r"
                         % (softmax_scale,))
    try:
        s = float(softmax_scale)
    except OverflowError:  # an int past float's range, 10**400
        raise ValueError("softmax_scale must be a positive finite number, got an integer of "
                         "%d digits" % len(str(abs(softmax_scale)))) from None
    except (TypeError, ValueError):
        raise ValueError("softmax_scale must be None or a positive float, got %r"
                         % (softmax_scale,)) from None
    if not (s > 0 and s != float("inf")):
        raise ValueError("softmax_scale must be a positive finite number, got %r" % (s,))
    _fp32_range("softmax_scale", s, MAX_SOFTMAX_SCALE)
    return s


def check_causal(causal):
    if not isinstance(causal, bool):
        raise ValueError("causal must be True or False, got %r" % (causal,))
    return causal


# ---- fast paths ---------------------------------------------------------------
# Each check_* below first tries a fast path that accepts the usual valid
# arguments with a few comparisons (host time per call is the cost that
# shows on small shapes) and returns exactly what the full check would; on
# anything unusual it returns None and the full check runs, which raises
# with its message or accepts an odd-but-valid argument (a stub, say).

_dtype_tags = {}  # dtype object -> "bf16" / "fp16" / None (idempotent cache)


def _tag_of(dtype):
    tag = _dtype_tags.get(dtype, False)
    if tag is False:
        tag = _dtype_tags[dtype] = HALF_DTYPES.get(dtype_name(dtype))
    return tag


def _fast_qkv(q, k, v, same_shape):
    """(tag, device index, q.shape, k.shape) when q, k, v are CUDA tensors
    of one half dtype and device, 3-D, contiguous and aligned (k and v of
    q's shape when same_shape, else of one shape with q's head_dim), with
    a supported head_dim; else None. May raise for what is not a tensor
    (its callers catch that: the full check then says what is wrong)."""
    # Each tensor attribute costs a call into torch (~0.1 us): read each
    # once, compare dtypes (singletons) by identity, devices by index.
    dt = q.dtype
    tag = _tag_of(dt)
    if tag is None or k.dtype is not dt or v.dtype is not dt:
        return None
    if not (q.is_cuda and k.is_cuda and v.is_cuda):
        return None
    di = q.get_device()
    if k.get_device() != di or v.get_device() != di:
        return None
    qs = q.shape
    ks = qs if same_shape and k.shape == qs else k.shape
    if len(qs) != 3 or len(ks) != 3 or v.shape != ks or (same_shape and ks is not qs) \
            or ks[2] != qs[2] or qs[2] not in HEAD_DIMS or qs[1] < 1 or ks[1] < 1:
        return None
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return None
    if (qs[0] > 0 and q.data_ptr() % ALIGNMENT) or \
            (ks[0] > 0 and (k.data_ptr() | v.data_ptr()) % ALIGNMENT):
        return None
    return tag, di, qs, ks


def _fast_tensors(q, k, v, same_shape):
    """(dtype, tag, device, q.shape, k.shape) when _fast_qkv passes them;
    else None."""
    try:
        f = _fast_qkv(q, k, v, same_shape)
        return None if f is None else (q.dtype, f[0], q.device, f[2], f[3])
    except Exception:  # not tensors: the full check says what is wrong
        return None


def _fast_offsets(t, device):
    """batch for int32 1-D contiguous offsets of >= 1 element on device;
    else None."""
    try:
        shape = t.shape
        if len(shape) != 1 or shape[0] < 1 or t.device != device or \
                _tag_int32(t.dtype) is not True or not t.is_contiguous():
            return None
        return int(shape[0]) - 1
    except Exception:
        return None


def fast_block_tensors(q, k, v, offsets):
    """(dtype tag, device index, tokens, heads, head_dim, batch) when q, k,
    v and offsets pass every check of check_qkv and check_offsets (q, k, v
    as _fast_qkv's with one shape; offsets int32, 1-D, non-empty,
    contiguous, on their device), else None. One pass for the eager fast
    path (ops._fast_block_forward)."""
    try:
        f = _fast_qkv(q, k, v, True)
        if f is None:
            return None
        tag, di, (tokens, heads, head_dim), _ = f
        batch = _fast_int32_1d(offsets, di)
        return None if batch is None else (tag, di, tokens, heads, head_dim, batch)
    except Exception:  # not tensors: the full checks say what is wrong
        return None


def _fast_int32_1d(t, di):
    """len(t) - 1 for int32, 1-D, non-empty, contiguous offsets on CUDA
    device di; else None (the fast paths' offsets check)."""
    s = t.shape
    if len(s) != 1 or s[0] < 1 or not t.is_cuda or t.get_device() != di or \
            _tag_int32(t.dtype) is not True or not t.is_contiguous():
        return None
    return s[0] - 1


def fast_jagged_tensors(q, k, v, cu_q, cu_k):
    """(dtype tag, device index, total_q, heads, head_dim, total_k, kv_heads,
    batch) when q, k, v, cu_seqlens_q and cu_seqlens_k (None:
    self-attention) pass every check of check_jagged_attention_args on
    tensors, else None: jagged_attention's fast path."""
    try:
        f = _fast_qkv(q, k, v, False)
        if f is None:
            return None
        tag, di, (total_q, heads, head_dim), (total_k, kv_heads, _) = f
        if heads % kv_heads:
            return None
        batch = _fast_int32_1d(cu_q, di)
        if batch is None:
            return None
        if cu_k is None:
            if total_k != total_q:
                return None
        elif _fast_int32_1d(cu_k, di) != batch:
            return None
        return tag, di, total_q, heads, head_dim, total_k, kv_heads, batch
    except Exception:  # not tensors: the full checks say what is wrong
        return None


_int32_dtypes = {}


def _tag_int32(dtype):
    ok = _int32_dtypes.get(dtype)
    if ok is None:
        ok = _int32_dtypes[dtype] = dtype_name(dtype) == "torch.int32"
    return ok


def check_qkv(q, k, v):
    """Checks q [tokens, heads, head_dim] and k, v [tokens, kv_heads,
    head_dim] (kv_heads divides heads: grouped-query attention). Returns
    (dtype, dtype_tag, device, (tokens, heads, head_dim)) where dtype_tag is
    "bf16" or "fp16"."""
    fast = _fast_tensors(q, k, v, True)
    if fast is not None:
        dt, tag, dev, qs, _ = fast
        return dt, tag, dev, (int(qs[0]), int(qs[1]), int(qs[2]))
    named = (("q", q), ("k", k), ("v", v))
    for name, t in named:
        for attr in ("dtype", "shape", "device", "is_contiguous"):
            if not hasattr(t, attr):
                raise ValueError("%s must be a torch.Tensor, got %s" % (name, type(t).__name__))
    for name, t in named:
        if not _is_cuda(t.device):
            raise ValueError("%s must be a CUDA tensor, got one on %s" % (name, _device_str(t.device)))
    dev = q.device
    for name, t in named[1:]:
        if t.device != dev:
            raise ValueError("q, k and v must be on the same device: q is on %s, %s on %s"
                             % (_device_str(dev), name, _device_str(t.device)))
    for name, t in named:
        if dtype_name(t.dtype) not in HALF_DTYPES:
            raise ValueError("%s must be torch.bfloat16 or torch.float16, got %s"
                             % (name, dtype_name(t.dtype)))
    for name, t in named[1:]:
        if dtype_name(t.dtype) != dtype_name(q.dtype):
            raise ValueError("q, k and v must have the same dtype: q is %s, %s is %s"
                             % (dtype_name(q.dtype), name, dtype_name(t.dtype)))
    shape = _shape(q)
    for name, t in named:
        if len(t.shape) != 3:
            raise ValueError("%s must be 3-D [total_tokens, %s, head_dim], got shape %s"
                             % (name, "heads" if name == "q" else "kv_heads", list(_shape(t))))
    if _shape(v) != _shape(k):
        raise ValueError("k and v must have the same shape: k is %s, v is %s"
                         % (list(_shape(k)), list(_shape(v))))
    tokens, heads, head_dim = shape
    if head_dim not in HEAD_DIMS:
        raise ValueError("head_dim (the last dimension of q) must be 64 or 128, got %d" % head_dim)
    if heads < 1:
        raise ValueError("heads (the middle dimension of q) must be at least 1, got %d" % heads)
    ks = _shape(k)
    if ks[0] != tokens or ks[2] != head_dim or ks[1] < 1 or heads % ks[1]:
        raise ValueError("k and v must be [total_tokens, kv_heads, head_dim] with q's tokens "
                         "and head_dim and kv_heads dividing q's heads (grouped-query "
                         "attention): q is %s, k and v are %s" % (list(shape), list(ks)))
    # A tensor that is not contiguous is read in place by its row stride or
    # copied (ops.Kernel._rows); a contiguous one must be aligned as it is.
    for name, t in named:
        ptr = t.data_ptr() if hasattr(t, "data_ptr") and t.is_contiguous() else None
        if tokens > 0 and ptr is not None and ptr % ALIGNMENT:
            raise ValueError("%s's data pointer (0x%x) must be %d-byte aligned; it is a view "
                             "with a storage offset, call .clone() first" % (name, ptr, ALIGNMENT))
    return q.dtype, HALF_DTYPES[dtype_name(q.dtype)], dev, shape


def check_qkv_packed(qkv, aligned=True):
    """Checks that qkv is a 4-D [total_tokens, 3, heads, head_dim] tensor,
    16-byte aligned unless aligned=False (a traced call: the op checks its
    slices when it runs); its slices q, k, v are then checked as
    check_qkv's."""
    if not hasattr(qkv, "shape") or not hasattr(qkv, "unbind"):
        raise ValueError("qkv must be a torch.Tensor, got %s" % type(qkv).__name__)
    shape = _shape(qkv)
    if len(shape) != 4 or shape[1] != 3:
        raise ValueError("qkv must be 4-D [total_tokens, 3, heads, head_dim] (q, k, v = "
                         "qkv.unbind(1)), got shape %s" % list(shape))
    ptr = qkv.data_ptr() if aligned and hasattr(qkv, "data_ptr") else None
    if shape[0] > 0 and ptr is not None and ptr % ALIGNMENT:
        raise ValueError("qkv's data pointer (0x%x) must be %d-byte aligned; it is a view with "
                         "a storage offset, call .clone() first" % (ptr, ALIGNMENT))


# The largest row stride a kernel takes (it holds strides as int).
MAX_ROW_STRIDE = 2 ** 31 - 1


def row_stride(t):
    """How a kernel that takes row strides reads a 3-D [tokens, heads,
    head_dim] tensor in place: 0 when it is contiguous (packed rows); its
    stride(0), in elements, when only its rows are spaced (heads and
    head_dim dense, as in a column slice of one projection output: the
    stride a multiple of 8 elements, at least heads * head_dim and below
    2^31, the data 16-byte aligned); None when it must be copied first."""
    if t.is_contiguous():
        return 0
    tokens, heads, dim = (int(x) for x in t.shape)
    s0, s1, s2 = (int(x) for x in t.stride())
    if (s2 != 1 and dim > 1) or (s1 != dim and heads > 1):
        return None
    if s0 % 8 or s0 < heads * dim or s0 > MAX_ROW_STRIDE or t.data_ptr() % ALIGNMENT:
        return None
    return s0


def check_dout(dout, q):
    """Checks the output gradient given to a backward: a tensor like q
    (same shape, dtype and device), contiguous and 16-byte aligned."""
    try:
        if (dout.device == q.device and dout.dtype == q.dtype and dout.shape == q.shape
                and dout.is_contiguous() and dout.data_ptr() % ALIGNMENT == 0):
            return
    except Exception:
        pass
    for attr in ("dtype", "shape", "device", "is_contiguous"):
        if not hasattr(dout, attr):
            raise ValueError("dout must be a torch.Tensor, got %s" % type(dout).__name__)
    if dout.device != q.device:
        raise ValueError("dout must be on the same device as q (%s), got %s"
                         % (_device_str(q.device), _device_str(dout.device)))
    if dtype_name(dout.dtype) != dtype_name(q.dtype):
        raise ValueError("dout must have q's dtype (%s), got %s"
                         % (dtype_name(q.dtype), dtype_name(dout.dtype)))
    if _shape(dout) != _shape(q):
        raise ValueError("dout must have q's shape %s, got %s"
                         % (list(_shape(q)), list(_shape(dout))))
    if not dout.is_contiguous():
        raise ValueError("dout must be contiguous (call .contiguous() first)")
    ptr = dout.data_ptr() if hasattr(dout, "data_ptr") else None
    if _shape(dout)[0] > 0 and ptr is not None and ptr % ALIGNMENT:
        raise ValueError("dout's data pointer (0x%x) must be %d-byte aligned; it is a view "
                         "with a storage offset, call .clone() first" % (ptr, ALIGNMENT))


def check_rotary_table(table, q, name="rotary_table", tokens=None, rows="total_tokens"):
    """Checks a rotary table for `positions: table`: [tokens, head_dim] of
    q's dtype on q's device, contiguous and 16-byte aligned (sin in the
    first head_dim/2 columns, cos in the rest; not checked). tokens None
    means q's (block_attention's table, one row per token); jagged_attention
    checks the keys' table (name "rotary_table_k") against total_k, naming
    the rows `rows` in messages."""
    for attr in ("dtype", "shape", "device", "is_contiguous"):
        if not hasattr(table, attr):
            raise ValueError("%s must be a torch.Tensor, got %s" % (name, type(table).__name__))
    head_dim = _shape(q)[-1]
    if tokens is None:
        tokens = _shape(q)[0]
    if table.device != q.device:
        raise ValueError("%s must be on the same device as q (%s), got %s"
                         % (name, _device_str(q.device), _device_str(table.device)))
    if dtype_name(table.dtype) != dtype_name(q.dtype):
        raise ValueError("%s must have q's dtype (%s), got %s"
                         % (name, dtype_name(q.dtype), dtype_name(table.dtype)))
    if _shape(table) != (tokens, head_dim):
        raise ValueError("%s must be [%s, head_dim] = %s, got %s"
                         % (name, rows, [tokens, head_dim], list(_shape(table))))
    if not table.is_contiguous():
        raise ValueError("%s must be contiguous (call .contiguous() first)" % name)
    ptr = table.data_ptr() if hasattr(table, "data_ptr") else None
    if tokens > 0 and ptr is not None and ptr % ALIGNMENT:
        raise ValueError("%s's data pointer (0x%x) must be %d-byte aligned"
                         % (name, ptr, ALIGNMENT))


ROTARY_LAYOUTS = ("interleaved", "half")
ROTARY_TENSORS = ("q", "k", "v")
ROTARY_POSITIONS = ("table", "sequence", "block")
ROTARY_KEYS = ("layout", "apply_to", "positions", "base")


def check_rotary(rotary):
    """Checks block_attention's rotary option (and jagged_attention's,
    through check_jagged_rotary), the spec's rotary mapping as a dict (or a
    layout name alone): {"layout": "interleaved" | "half",
    "apply_to": subset of ("q", "k", "v") (default ("q", "k")),
    "positions": "table" | "sequence" | "block" (default "table"), "base":
    a positive number, only with computed positions (default 10000.0)}.
    Returns None or the normalized dict: apply_to a tuple in q, k, v order,
    base a float, or None with positions from a table."""
    if rotary is None:
        return None
    if isinstance(rotary, str):
        rotary = {"layout": rotary}
    if not isinstance(rotary, dict):
        raise ValueError("rotary must be None, a layout name or a dict with keys %s, got %r"
                         % (", ".join(ROTARY_KEYS), rotary))
    unknown = sorted(str(key) for key in rotary if key not in ROTARY_KEYS)
    if unknown:
        raise ValueError("rotary has unknown key%s %s (keys: %s)"
                         % ("s" if len(unknown) > 1 else "", ", ".join(unknown),
                            ", ".join(ROTARY_KEYS)))
    layout = rotary.get("layout")
    if layout not in ROTARY_LAYOUTS:
        raise ValueError("rotary layout must be 'interleaved' or 'half', got %r" % (layout,))
    apply_to = rotary.get("apply_to", ("q", "k"))
    if isinstance(apply_to, str) or not isinstance(apply_to, (list, tuple, set, frozenset)):
        raise ValueError("rotary apply_to must be a list of 'q', 'k', 'v', got %r" % (apply_to,))
    bad = [t for t in apply_to if t not in ROTARY_TENSORS]
    if bad or not apply_to or len(set(apply_to)) != len(list(apply_to)):
        raise ValueError("rotary apply_to must be a non-empty list of distinct 'q', 'k', 'v', "
                         "got %r" % (list(apply_to),))
    positions = rotary.get("positions", "table")
    if positions not in ROTARY_POSITIONS:
        raise ValueError("rotary positions must be 'table', 'sequence' or 'block', got %r"
                         % (positions,))
    base = rotary.get("base")
    if positions == "table":
        if base is not None:
            raise ValueError("rotary base applies only to positions 'sequence' or 'block' "
                             "(with positions 'table' the caller's rotary_table holds sin and "
                             "cos)")
    else:
        base = 10000.0 if base is None else base
        if isinstance(base, bool) or not isinstance(base, (int, float)):
            raise ValueError("rotary base must be a positive finite number, got %r" % (base,))
        try:
            fbase = float(base)
        except OverflowError:  # an int past float's range, 10**400
            raise ValueError("rotary base must be a positive finite number, got an integer of "
                             "%d digits" % len(str(abs(base)))) from None
        if not (0 < fbase < float("inf")):
            raise ValueError("rotary base must be a positive finite number, got %r" % (base,))
        _fp32_range("rotary base", fbase, MAX_ROTARY_BASE)
        base = fbase
    return {"layout": layout, "apply_to": tuple(t for t in ROTARY_TENSORS if t in apply_to),
            "positions": positions, "base": base}


def check_offsets(offsets, device):
    """Checks the device offsets; returns batch (len(offsets) - 1)."""
    batch = _fast_offsets(offsets, device)
    if batch is not None:
        return batch
    for attr in ("dtype", "shape", "device"):
        if not hasattr(offsets, attr):
            raise ValueError("offsets must be a torch.Tensor, got %s" % type(offsets).__name__)
    if dtype_name(offsets.dtype) != "torch.int32":
        raise ValueError("offsets must be torch.int32, got %s" % dtype_name(offsets.dtype))
    if len(offsets.shape) != 1:
        raise ValueError("offsets must be 1-D [batch + 1], got shape %s" % list(_shape(offsets)))
    n = int(offsets.shape[0])
    if n < 1:
        raise ValueError("offsets must hold at least one element (batch + 1 >= 1), got 0")
    if offsets.device != device:
        raise ValueError("offsets must be on the same device as q (%s), got %s"
                         % (_device_str(device), _device_str(offsets.device)))
    if hasattr(offsets, "is_contiguous") and not offsets.is_contiguous():
        raise ValueError("offsets must be contiguous")
    return n - 1


def _host_list(cpu_offsets):
    dev = getattr(cpu_offsets, "device", None)
    if dev is not None and getattr(dev, "type", "cpu") != "cpu":
        raise ValueError("cpu_offsets must live on the host, got a tensor on %s "
                         "(pass offsets.cpu() once, or omit cpu_offsets)" % _device_str(dev))
    if hasattr(cpu_offsets, "tolist"):
        values = cpu_offsets.tolist()
    elif isinstance(cpu_offsets, (list, tuple, range)):
        values = list(cpu_offsets)
    else:
        raise ValueError("cpu_offsets must be a CPU tensor, a numpy array or a list of ints, "
                         "got %s (block_size and the other options are keyword-only)"
                         % type(cpu_offsets).__name__)
    if values and isinstance(values[0], list):
        raise ValueError("cpu_offsets must be 1-D")
    out = []
    for x in values:
        if isinstance(x, bool) or not float(x).is_integer():
            raise ValueError("cpu_offsets must hold integers, got %r" % (x,))
        out.append(int(x))
    return out


def check_cpu_offsets(cpu_offsets, batch, total_tokens):
    """Validates a host copy of the offsets: batch + 1 entries, offsets[0] ==
    0, non-decreasing, offsets[-1] == total_tokens. Returns them as a list."""
    values = _host_list(cpu_offsets)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise ValueError("batch must be an integer >= 0, got %r" % (batch,))
    if not values:
        raise ValueError("cpu_offsets must hold at least one element (batch + 1 >= 1), got 0")
    if len(values) != batch + 1:
        raise ValueError("cpu_offsets has %d entries but offsets has %d" % (len(values), batch + 1))
    if values[0] != 0:
        raise ValueError("offsets[0] must be 0, got %d" % values[0])
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise ValueError("offsets must be non-decreasing: offsets[%d] = %d < offsets[%d] = %d"
                             % (i, values[i], i - 1, values[i - 1]))
    if values[-1] != total_tokens:
        raise ValueError("offsets[-1] must equal total_tokens (q.shape[0] = %d), got %d"
                         % (total_tokens, values[-1]))
    return values


def check_block_options(block_size, causal, softmax_scale, rotary):
    """block_attention's options, before any tensor is looked at (the check
    torch.compile's traced calls make too): (block_size, causal,
    softmax_scale, rotary) normalized."""
    return (check_block_size(block_size), check_causal(causal),
            check_softmax_scale(softmax_scale), check_rotary(rotary))


def check_block_attention_args(q, k, v, offsets, cpu_offsets=None, block_size=64,
                               causal=False, softmax_scale=None, rotary=None,
                               rotary_table=None):
    """Every check of block_attention, in one call. Returns a dict with
    dtype, dtype_tag, device, tokens, heads, kv_heads, head_dim, batch, block_size,
    causal, softmax_scale, rotary (normalized) and rotary_table. A table is
    required with rotary positions 'table' and refused otherwise."""
    block_size, causal, softmax_scale, rotary = check_block_options(block_size, causal,
                                                                   softmax_scale, rotary)
    dtype, tag, device, (tokens, heads, head_dim) = check_qkv(q, k, v)
    batch = check_offsets(offsets, device)
    if cpu_offsets is not None:
        check_cpu_offsets(cpu_offsets, batch, tokens)
    wants_table = rotary is not None and rotary["positions"] == "table"
    if rotary_table is None and wants_table:
        raise ValueError("rotary positions 'table' need rotary_table=[total_tokens, head_dim] "
                         "(sin in the first head_dim/2 columns, cos in the rest)")
    if rotary_table is not None:
        if not wants_table:
            raise ValueError("rotary_table is only taken with rotary positions 'table' (got "
                             "rotary=%r)" % (rotary,))
        check_rotary_table(rotary_table, q)
    return {
        "dtype": dtype, "dtype_tag": tag, "device": device, "tokens": tokens,
        "heads": heads, "kv_heads": int(k.shape[1]), "head_dim": head_dim, "batch": batch,
        "block_size": block_size,
        "causal": causal, "softmax_scale": softmax_scale, "rotary": rotary,
        "rotary_table": rotary_table,
    }


# ---- jagged_attention ---------------------------------------------------------

def _is_int(x):
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    try:
        x.__index__()
        return True
    except (AttributeError, TypeError):
        return False


def check_window_size(window_size, causal):
    """Maps FlashAttention's window_size (left, right) onto the jagged
    spec's `causal` and `window`. Returns (causal, window), window None or a
    pair of non-negative ints [left, right]: query i of a sequence with Lq
    queries and Lk keys sees key j when i + d - left <= j <= i + d + right,
    d = Lk - Lq (bottom-right aligned, as FlashAttention).

    (-1, -1): no window. Both >= 0: [left, right]. With causal the right
    side is capped at 0 (-1 or 0 give 0; a right side > 0 contradicts the
    causal mask: ValueError), so (left, -1) is [left, 0] and (-1, -1) or
    (-1, 0) causal alone. Without causal, (-1, 0) is exactly the causal mask
    (what torch's varlen_attn passes for causal) and becomes causal=True;
    another window with one unlimited side (-1) cannot be expressed by the
    kernel: UnsupportedError."""
    causal = check_causal(causal)
    if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__") or \
            len(window_size) != 2:
        raise ValueError("window_size must be a pair (left, right) of ints >= -1, got %r"
                         % (window_size,))
    left, right = window_size
    if not (_is_int(left) and _is_int(right)):
        raise ValueError("window_size must be a pair (left, right) of ints >= -1, got %r"
                         % (window_size,))
    left, right = int(left), int(right)
    if left < -1 or right < -1:
        raise ValueError("window_size sides must be -1 (unlimited) or >= 0, got %r"
                         % ((left, right),))
    if causal:
        if right > 0:
            raise ValueError("window_size=%r with causal=True: a causal window sees no key "
                             "after the query, so its right side must be 0 or -1"
                             % ((left, right),))
        return True, (None if left == -1 else (left, 0))
    if left == -1 and right == -1:
        return False, None
    if left == -1 and right == 0:
        return True, None
    if left == -1 or right == -1:
        raise _errors.UnsupportedError(
            "attngen: window_size=%r without causal is not supported: the jagged kernel's "
            "window needs both sides bounded (left, right >= 0), or (-1, -1) for none, or "
            "causal=True (which caps the right side at 0)" % ((left, right),))
    return False, (left, right)


def check_jagged_qkv(q, k, v, q_rows="total_q"):
    """Checks q [total_q, heads, D] and k, v [total_k, kv_heads, D]. Returns
    (dtype, dtype_tag, device, total_q, heads, head_dim, total_k, kv_heads).
    q_rows names q's first dimension in messages ("n_q" for broadcast_attention,
    whose q is one dense [n_q, heads, D])."""
    fast = _fast_tensors(q, k, v, False)
    if fast is not None:
        dt, tag, dev, qs, ks = fast
        if qs[1] % ks[1] == 0:
            return (dt, tag, dev, int(qs[0]), int(qs[1]), int(qs[2]), int(ks[0]), int(ks[1]))
    named = (("q", q), ("k", k), ("v", v))
    for name, t in named:
        for attr in ("dtype", "shape", "device", "is_contiguous"):
            if not hasattr(t, attr):
                raise ValueError("%s must be a torch.Tensor, got %s" % (name, type(t).__name__))
    for name, t in named:
        if not _is_cuda(t.device):
            raise ValueError("%s must be a CUDA tensor, got one on %s"
                             % (name, _device_str(t.device)))
    dev = q.device
    for name, t in named[1:]:
        if t.device != dev:
            raise ValueError("q, k and v must be on the same device: q is on %s, %s on %s"
                             % (_device_str(dev), name, _device_str(t.device)))
    for name, t in named:
        if dtype_name(t.dtype) not in HALF_DTYPES:
            raise ValueError("%s must be torch.bfloat16 or torch.float16, got %s"
                             % (name, dtype_name(t.dtype)))
    for name, t in named[1:]:
        if dtype_name(t.dtype) != dtype_name(q.dtype):
            raise ValueError("q, k and v must have the same dtype: q is %s, %s is %s"
                             % (dtype_name(q.dtype), name, dtype_name(t.dtype)))
    for name, t in named:
        if len(t.shape) != 3:
            raise ValueError("%s must be 3-D [%s, %s, head_dim], got shape %s"
                             % (name, q_rows if name == "q" else "total_k",
                                "heads" if name == "q" else "kv_heads", list(_shape(t))))
    total_q, heads, head_dim = _shape(q)
    total_k, kv_heads, kdim = _shape(k)
    if _shape(v) != _shape(k):
        raise ValueError("k and v must have the same shape: k is %s, v is %s"
                         % (list(_shape(k)), list(_shape(v))))
    if kdim != head_dim:
        raise ValueError("q, k and v must have the same head_dim: q's is %d, k's and v's %d"
                         % (head_dim, kdim))
    if head_dim not in HEAD_DIMS:
        raise ValueError("head_dim (the last dimension of q) must be 64 or 128, got %d" % head_dim)
    if heads < 1:
        raise ValueError("heads (the middle dimension of q) must be at least 1, got %d" % heads)
    if kv_heads < 1:
        raise ValueError("kv_heads (the middle dimension of k and v) must be at least 1, got %d"
                         % kv_heads)
    if heads % kv_heads:
        raise ValueError("kv_heads (%d, k's and v's middle dimension) must divide heads (%d, "
                         "q's)" % (kv_heads, heads))
    for name, t in named:
        if not t.is_contiguous():
            raise ValueError("%s must be contiguous (call .contiguous() first)" % name)
    for name, t in named:
        ptr = t.data_ptr() if hasattr(t, "data_ptr") else None
        if _shape(t)[0] > 0 and ptr is not None and ptr % ALIGNMENT:
            raise ValueError("%s's data pointer (0x%x) must be %d-byte aligned; it is a view "
                             "with a storage offset, call .clone() first" % (name, ptr, ALIGNMENT))
    return (q.dtype, HALF_DTYPES[dtype_name(q.dtype)], dev, total_q, heads, head_dim, total_k,
            kv_heads)


def check_cu_seqlens(cu, device, name="cu_seqlens_q"):
    """Checks jagged offsets: int32 [batch + 1], contiguous, on q's device.
    Returns batch. The values are not read (no synchronization)."""
    batch = _fast_offsets(cu, device)
    if batch is not None:
        return batch
    for attr in ("dtype", "shape", "device"):
        if not hasattr(cu, attr):
            raise ValueError("%s must be a torch.Tensor, got %s" % (name, type(cu).__name__))
    if dtype_name(cu.dtype) != "torch.int32":
        raise ValueError("%s must be torch.int32, got %s" % (name, dtype_name(cu.dtype)))
    if len(cu.shape) != 1:
        raise ValueError("%s must be 1-D [batch + 1], got shape %s" % (name, list(_shape(cu))))
    n = int(cu.shape[0])
    if n < 1:
        raise ValueError("%s must hold at least one element (batch + 1 >= 1), got 0" % name)
    if cu.device != device:
        raise ValueError("%s must be on the same device as q (%s), got %s"
                         % (name, _device_str(device), _device_str(cu.device)))
    if hasattr(cu, "is_contiguous") and not cu.is_contiguous():
        raise ValueError("%s must be contiguous" % name)
    return n - 1


def check_jagged_rotary(rotary):
    """check_rotary for the jagged pattern: positions "table" or "sequence"
    (key j of a sequence at position j, query i at i + Lk - Lq); "block"
    raises ValueError. Returns None or the normalized dict."""
    rotary = check_rotary(rotary)
    if rotary is not None and rotary["positions"] == "block":
        raise ValueError("rotary positions 'block' apply only to the block-diagonal pattern "
                         "(block_attention); jagged_attention takes positions 'table' or "
                         "'sequence'")
    return rotary


def check_jagged_rotary_tables(rotary, rotary_table, rotary_table_k, q, total_q, total_k):
    """Checks jagged_attention's rotary tables against its normalized rotary
    option: with positions "table", rotary_table [total_q, head_dim] (the
    queries') is required and rotary_table_k [total_k, head_dim] (the
    keys') optional, None meaning rotary_table (then total_k must equal
    total_q); with any other option neither is taken. ValueError otherwise."""
    wants_table = rotary is not None and rotary["positions"] == "table"
    if not wants_table:
        for name, t in (("rotary_table", rotary_table), ("rotary_table_k", rotary_table_k)):
            if t is not None:
                raise ValueError("%s is only taken with rotary positions 'table' (got rotary=%r)"
                                 % (name, rotary))
        return
    if rotary_table is None:
        raise ValueError("rotary positions 'table' need rotary_table=[total_q, head_dim] (the "
                         "queries' sin in the first head_dim/2 columns, cos in the rest) and, "
                         "for keys other than the queries' tokens, rotary_table_k=[total_k, "
                         "head_dim]")
    check_rotary_table(rotary_table, q, "rotary_table", total_q, "total_q")
    if rotary_table_k is None:
        if total_k != total_q:
            raise ValueError("rotary_table_k is None (the queries' rotary_table serves the keys "
                             "too) but k has %d tokens and q %d; pass rotary_table_k=[total_k, "
                             "head_dim] for cross-attention" % (total_k, total_q))
    else:
        check_rotary_table(rotary_table_k, q, "rotary_table_k", total_k, "total_k")


def check_deterministic(deterministic):
    if not isinstance(deterministic, bool):
        raise ValueError("deterministic must be True or False, got %r" % (deterministic,))
    return deterministic


def check_self_attention_tokens(total_q, total_k):
    """cu_seqlens_k None means cu_seqlens_q for the keys too, which needs as
    many key tokens as query tokens."""
    if total_k != total_q:
        raise ValueError("cu_seqlens_k is None (self-attention, cu_seqlens_q for both) but "
                         "k has %d tokens and q %d; pass cu_seqlens_k for cross-attention"
                         % (total_k, total_q))


def check_jagged_options(causal, window_size, softmax_scale, rotary, deterministic, dropout_p):
    """jagged_attention's options, before any tensor is looked at (the check
    torch.compile's traced calls make too): (causal, window, softmax_scale,
    rotary, deterministic), window and causal as check_window_size gives
    them. Dropout raises UnsupportedError."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or dropout_p != 0:
        raise _errors.UnsupportedError("attngen: dropout is not supported (dropout_p must be "
                                       "0.0, got %r)" % (dropout_p,))
    check_deterministic(deterministic)
    causal, window = check_window_size(window_size, causal)
    return causal, window, check_softmax_scale(softmax_scale), check_jagged_rotary(rotary), \
        deterministic


def check_jagged_attention_args(q, k, v, cu_seqlens_q, cu_seqlens_k=None, causal=False,
                                window_size=(-1, -1), softmax_scale=None, rotary=None,
                                rotary_table=None, deterministic=False, dropout_p=0.0,
                                rotary_table_k=None):
    """Every check of jagged_attention, in one call. Returns a dict with
    dtype, dtype_tag, device, total_q, heads, head_dim, total_k, kv_heads,
    batch, causal and window (after check_window_size), softmax_scale,
    deterministic, cu_seqlens_k (cu_seqlens_q when None was given), rotary
    (check_jagged_rotary's), rotary_table and rotary_table_k (as given,
    checked by check_jagged_rotary_tables)."""
    causal, window, softmax_scale, rotary, deterministic = check_jagged_options(
        causal, window_size, softmax_scale, rotary, deterministic, dropout_p)
    dtype, tag, device, total_q, heads, head_dim, total_k, kv_heads = check_jagged_qkv(q, k, v)
    batch = check_cu_seqlens(cu_seqlens_q, device, "cu_seqlens_q")
    if cu_seqlens_k is None:
        check_self_attention_tokens(total_q, total_k)
        cu_seqlens_k = cu_seqlens_q
    else:
        batch_k = check_cu_seqlens(cu_seqlens_k, device, "cu_seqlens_k")
        if batch_k != batch:
            raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length (batch + "
                             "1): got %d and %d" % (batch + 1, batch_k + 1))
    check_jagged_rotary_tables(rotary, rotary_table, rotary_table_k, q, total_q, total_k)
    return {
        "dtype": dtype, "dtype_tag": tag, "device": device, "total_q": total_q, "heads": heads,
        "head_dim": head_dim, "total_k": total_k, "kv_heads": kv_heads, "batch": batch,
        "causal": causal, "window": window, "softmax_scale": softmax_scale,
        "deterministic": deterministic, "cu_seqlens_k": cu_seqlens_k, "rotary": rotary,
        "rotary_table": rotary_table, "rotary_table_k": rotary_table_k,
    }


# ---- broadcast_attention -------------------------------------------------------

MAX_ROWS = 2 ** 31 - 1  # rows of a jagged tensor the kernels index in int32


def _invalid(message):
    return _errors.InvalidArgumentError(message, code=_errors.AG_ERR_INVALID_ARGUMENT,
                                        code_name="invalid argument")


def check_broadcast_options(causal, window_size, softmax_scale, rotary, deterministic):
    """broadcast_attention's options, before any tensor is looked at (the
    check torch.compile's traced calls make too): (causal, window,
    softmax_scale, rotary, deterministic), rotary as check_jagged_rotary
    gives it. Bad values raise InvalidArgumentError; windows the kernel
    cannot express, UnsupportedError."""
    try:
        check_deterministic(deterministic)
        causal, window = check_window_size(window_size, causal)
        return (causal, window, check_softmax_scale(softmax_scale), check_jagged_rotary(rotary),
                deterministic)
    except _errors.AttngenError:
        raise
    except ValueError as e:
        raise _invalid(str(e)) from None


def check_broadcast_rotary_tables(rotary, rotary_table, rotary_table_k, q, n_q, total_k):
    """Checks broadcast_attention's rotary tables against its normalized
    rotary option: with positions "table", each table the kernel reads is
    required and no other: rotary_table [n_q, head_dim] (query row i's, the
    same in every sequence) when "q" is rotated, rotary_table_k [total_k,
    head_dim] (the keys') when "k" or "v" is; neither with any other
    option. ValueError otherwise."""
    if rotary is None and rotary_table is None and rotary_table_k is None:
        return  # the common call: nothing to look at
    wants_table = rotary is not None and rotary["positions"] == "table"
    apply_to = rotary["apply_to"] if rotary is not None else ()
    for name, t, read, tokens, rows in (
            ("rotary_table", rotary_table, "q" in apply_to, n_q, "n_q"),
            ("rotary_table_k", rotary_table_k, "k" in apply_to or "v" in apply_to, total_k,
             "total_k")):
        if not wants_table:
            if t is not None:
                raise ValueError("%s is only taken with rotary positions 'table' (got rotary=%r)"
                                 % (name, rotary))
        elif read and t is None:
            raise ValueError("rotary positions 'table' with apply_to %s need %s=[%s, head_dim] "
                             "(sin in the first head_dim/2 columns, cos in the rest)"
                             % (list(apply_to), name, rows))
        elif not read and t is not None:
            raise ValueError("%s is not read: rotary apply_to %s rotates no %s (pass None)"
                             % (name, list(apply_to), "query" if rows == "n_q" else "key"))
        elif read:
            check_rotary_table(t, q, name, tokens, rows)


def check_broadcast_attention_args(q, k, v, cu_seqlens_k, causal=False, window_size=(-1, -1),
                                   softmax_scale=None, rotary=None, rotary_table=None,
                                   deterministic=False, rotary_table_k=None):
    """Every check of broadcast_attention, in one call: q one dense [n_q,
    heads, D] shared by every sequence, k and v [total_k, kv_heads, D]
    jagged by cu_seqlens_k (int32 [batch + 1] on q's device), the checks of
    jagged_attention otherwise (dtypes, head_dim, kv_heads dividing heads,
    contiguity, alignment, window_size through check_window_size), and
    batch * n_q, the output's rows, within 2^31 - 1, and the rotary tables
    (check_broadcast_rotary_tables). Returns a dict with dtype, dtype_tag,
    device, n_q, heads, head_dim, total_k, kv_heads, batch, rows (batch *
    n_q), causal, window, softmax_scale, rotary (check_jagged_rotary's),
    rotary_table, rotary_table_k (as given) and deterministic.

    Bad arguments raise InvalidArgumentError (a ValueError, as the C
    launcher's refusals); one-sided windows without causal raise
    UnsupportedError."""
    causal, window, softmax_scale, rotary, deterministic = check_broadcast_options(
        causal, window_size, softmax_scale, rotary, deterministic)
    try:
        dtype, tag, device, n_q, heads, head_dim, total_k, kv_heads = check_jagged_qkv(
            q, k, v, q_rows="n_q")
        batch = check_cu_seqlens(cu_seqlens_k, device, "cu_seqlens_k")
        check_broadcast_rotary_tables(rotary, rotary_table, rotary_table_k, q, n_q, total_k)
    except _errors.AttngenError:
        raise
    except ValueError as e:
        raise _invalid(str(e)) from None
    if batch * n_q > MAX_ROWS:
        raise _invalid("batch * n_q (%d * %d = %d: the output's rows) must be at most 2^31 - 1"
                       % (batch, n_q, batch * n_q))
    return {
        "dtype": dtype, "dtype_tag": tag, "device": device, "n_q": n_q, "heads": heads,
        "head_dim": head_dim, "total_k": total_k, "kv_heads": kv_heads, "batch": batch,
        "rows": batch * n_q, "causal": causal, "window": window,
        "softmax_scale": softmax_scale, "rotary": rotary, "rotary_table": rotary_table,
        "rotary_table_k": rotary_table_k, "deterministic": deterministic,
    }
