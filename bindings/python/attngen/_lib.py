# SPDX-License-Identifier: BSD-3-Clause
"""ctypes access to libattngen.so: finding it, the structs of
include/attngen.h and one checked-call helper.

The library is loaded lazily (first use), so `import attngen` works on a
machine where it is not built. Search order: $ATTNGEN_LIB, then the copy
`pip install` bundles in the package, then build/ at the repository root
(three levels above this file), then build/ two levels above the package,
then the system loader ("libattngen.so"). A library whose ag_version()
differs from the binding's version, or that has none, is refused: the
structs mirrored here are that version's.
"""

import ctypes
import ctypes.util
import os
import struct
import threading

from . import _errors
from ._version_of import binding_version

AG_NAME_MAX = 64
AG_SOURCE_MAX = 256
AG_KERNEL_NAME_MAX = 128

# enum values of include/attngen.h
AG_PATTERN_BLOCK_DIAGONAL, AG_PATTERN_JAGGED = 0, 1
AG_DTYPE_BF16, AG_DTYPE_FP16 = 0, 1
AG_QUERY_PER_SEQUENCE, AG_QUERY_BROADCAST = 0, 1
AG_ROTARY_NONE, AG_ROTARY_INTERLEAVED, AG_ROTARY_HALF = 0, 1, 2
AG_POSITIONS_TABLE, AG_POSITIONS_SEQUENCE, AG_POSITIONS_BLOCK = 0, 1, 2
AG_APPLY_Q, AG_APPLY_K, AG_APPLY_V = 1, 2, 4
AG_PASS_FORWARD, AG_PASS_BACKWARD = 1, 2
AG_ARCH_AUTO, AG_ARCH_SM80, AG_ARCH_SM90A = 0, 1, 2


class AgError(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_void_p)]


class AgPos(ctypes.Structure):
    _fields_ = [("line", ctypes.c_int), ("col", ctypes.c_int)]


class _AgRotary(ctypes.Structure):
    _fields_ = [
        ("layout", ctypes.c_int),
        ("apply_to", ctypes.c_uint),
        ("positions", ctypes.c_int),
        ("base", ctypes.c_double),
    ]


class _AgSpecAt(ctypes.Structure):
    _fields_ = [(n, AgPos) for n in (
        "name", "pattern", "block_size", "causal", "window", "query", "head_dim",
        "dtype", "softmax_scale", "rotary", "passes", "arch", "deterministic", "row_strides")]


class AgSpec(ctypes.Structure):
    """Mirror of `ag_spec` (512 bytes on x86-64 Linux at attngen 0.6.0)."""
    _fields_ = [
        ("source", ctypes.c_char * AG_SOURCE_MAX),
        ("name", ctypes.c_char * AG_NAME_MAX),
        ("pattern", ctypes.c_int),
        ("block_size", ctypes.c_int),
        ("causal", ctypes.c_bool),
        ("has_window", ctypes.c_bool),
        ("window_left", ctypes.c_int),
        ("window_right", ctypes.c_int),
        ("query", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("dtype", ctypes.c_int),
        ("softmax_scale", ctypes.c_double),
        ("rotary", _AgRotary),
        ("passes", ctypes.c_uint),
        ("arch", ctypes.c_int),
        ("deterministic", ctypes.c_bool),  # jagged: bit-identical backward
        ("row_strides", ctypes.c_bool),  # block: row strides and kv_heads taken
        ("at", _AgSpecAt),
    ]


class AgSpecBox(ctypes.Structure):
    """An ag_spec followed by slack, handed to the C calls that fill a spec:
    should the header grow fields before this mirror is updated, the C side
    writes into the slack instead of past the end of a Python buffer."""
    _fields_ = [("spec", AgSpec), ("_slack", ctypes.c_char * 4096)]


class AgBlockFwdArgs(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("total_tokens", ctypes.c_int64),
        ("host_offsets", ctypes.c_void_p),  # optional host copy; None: not checked
        ("rotary_table", ctypes.c_void_p),  # positions: table only; else None
        # row strides in elements; 0 (left unset): packed, heads * head_dim
        ("q_stride", ctypes.c_int64),
        ("k_stride", ctypes.c_int64),
        ("v_stride", ctypes.c_int64),
        ("o_stride", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),  # k's and v's heads; 0 (left unset): heads
    ]


class AgBlockBwdArgs(ctypes.Structure):
    """Mirror of `ag_block_bwd_args`, in the header's field order."""
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("dout", ctypes.c_void_p),
        ("dq", ctypes.c_void_p),
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("offsets", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("total_tokens", ctypes.c_int64),
        ("host_offsets", ctypes.c_void_p),  # optional host copy; None: not checked
        ("rotary_table", ctypes.c_void_p),  # positions: table only; else None
        # row strides in elements; 0 (left unset): packed, heads * head_dim
        ("q_stride", ctypes.c_int64),
        ("k_stride", ctypes.c_int64),
        ("v_stride", ctypes.c_int64),
        ("dout_stride", ctypes.c_int64),
        ("dq_stride", ctypes.c_int64),
        ("dk_stride", ctypes.c_int64),
        ("dv_stride", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),  # as in AgBlockFwdArgs; dk, dv then per query head
    ]


class AgJaggedFwdArgs(ctypes.Structure):
    """Mirror of `ag_jagged_fwd_args`, in the header's field order."""
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),           # optional fp32 [heads, total_q]; None: not written
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),       # 0 means heads
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("host_cu_seqlens_q", ctypes.c_void_p),  # optional host copies; None: not checked
        ("host_cu_seqlens_k", ctypes.c_void_p),
        # rotary positions: table only (else None): the queries' [total_q, head_dim] and
        # the keys' [total_k, head_dim]; rotary_table_k None means rotary_table
        ("rotary_table", ctypes.c_void_p),
        ("rotary_table_k", ctypes.c_void_p),
    ]


class AgJaggedBwdArgs(ctypes.Structure):
    """Mirror of `ag_jagged_bwd_args`, in the header's field order."""
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("dout", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),           # the forward's, fp32 [heads, total_q]
        ("dq", ctypes.c_void_p),
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),     # fp32 [heads, total_q] scratch
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("host_cu_seqlens_q", ctypes.c_void_p),
        ("host_cu_seqlens_k", ctypes.c_void_p),
        ("rotary_table", ctypes.c_void_p),      # as in AgJaggedFwdArgs
        ("rotary_table_k", ctypes.c_void_p),
    ]


class AgBroadcastFwdArgs(ctypes.Structure):
    """Mirror of `ag_broadcast_fwd_args`, in the header's field order."""
    _fields_ = [
        ("q", ctypes.c_void_p),             # [n_q, heads, head_dim], shared by every sequence
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),             # [batch * n_q, heads, head_dim]
        ("lse", ctypes.c_void_p),           # optional fp32 [heads, batch * n_q]; None: not written
        ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("n_q", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),       # 0 means heads
        ("total_k", ctypes.c_int64),
        ("host_cu_seqlens_k", ctypes.c_void_p),  # optional host copy; None: not checked
        ("rotary_table", ctypes.c_void_p),  # positions "table", q rotated: [n_q, head_dim]
        ("rotary_table_k", ctypes.c_void_p),  # positions "table", k or v rotated: [total_k, head_dim]
    ]


class AgBroadcastBwdArgs(ctypes.Structure):
    """Mirror of `ag_broadcast_bwd_args`, in the header's field order."""
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("dout", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),           # the forward's, fp32 [heads, batch * n_q]
        ("dq", ctypes.c_void_p),            # [n_q, heads, head_dim]: summed over the batch
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),     # ag_broadcast_backward_workspace_bytes of scratch
        ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("n_q", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("host_cu_seqlens_k", ctypes.c_void_p),
        ("rotary_table", ctypes.c_void_p),
        ("rotary_table_k", ctypes.c_void_p),
    ]


# Every struct mirrored here, by its C type name: the layout test
# (tests/test_spec_and_lib.py) compares each field's offset and each size
# with the header. AgSpecBox is Python-only (an ag_spec plus slack).
MIRRORS = {
    "ag_error": AgError,
    "ag_pos": AgPos,
    "ag_spec": AgSpec,
    "ag_block_fwd_args": AgBlockFwdArgs,
    "ag_block_bwd_args": AgBlockBwdArgs,
    "ag_jagged_fwd_args": AgJaggedFwdArgs,
    "ag_jagged_bwd_args": AgJaggedBwdArgs,
    "ag_broadcast_fwd_args": AgBroadcastFwdArgs,
    "ag_broadcast_bwd_args": AgBroadcastBwdArgs,
}


def _packer(cls):
    """A struct.Struct whose pack() gives the bytes of one `cls`, its
    fields in order: a launch's arguments packed in about a third of the
    time of building the ctypes Structure (0.2 against 0.7 us here, more on
    a slower host), passed to C as a const pointer to that memory. Every
    field of an args mirror is 8 bytes (a pointer, packed from an int with
    0 for NULL, or an int64); a mirror with another field is refused at
    import, so a header change cannot pack wrong bytes silently."""
    codes = {ctypes.c_void_p: "Q", ctypes.c_int64: "q"}
    fmt = "="
    for i, (name, ctype) in enumerate(cls._fields_):
        if ctype not in codes or getattr(cls, name).offset != 8 * i:
            raise TypeError("attngen: %s.%s is not an 8-byte field at offset %d"
                            % (cls.__name__, name, 8 * i))
        fmt += codes[ctype]
    packer = struct.Struct(fmt)
    if packer.size != ctypes.sizeof(cls):
        raise TypeError("attngen: %s packs to %d bytes, not %d"
                        % (cls.__name__, packer.size, ctypes.sizeof(cls)))
    return packer


# pack(...) of each launch's args, every field positional (the header's
# order, 0 for a NULL pointer and for a size left to its default)
PACK_BLOCK_FWD = _packer(AgBlockFwdArgs).pack
PACK_BLOCK_BWD = _packer(AgBlockBwdArgs).pack
PACK_JAGGED_FWD = _packer(AgJaggedFwdArgs).pack
PACK_JAGGED_BWD = _packer(AgJaggedBwdArgs).pack
PACK_BROADCAST_FWD = _packer(AgBroadcastFwdArgs).pack
PACK_BROADCAST_BWD = _packer(AgBroadcastBwdArgs).pack

# The args struct of each launch entry point: what its packed bytes read as
# (args_of, for tests and messages).
ARGS_OF = {
    "ag_block_forward": AgBlockFwdArgs, "ag_block_backward": AgBlockBwdArgs,
    "ag_jagged_forward": AgJaggedFwdArgs, "ag_jagged_backward": AgJaggedBwdArgs,
    "ag_broadcast_forward": AgBroadcastFwdArgs, "ag_broadcast_backward": AgBroadcastBwdArgs,
}


def args_of(fn_name, arg):
    """The args struct a launch entry point was handed: `arg` packed bytes
    (the PACK_* functions) or a ctypes.byref of the struct."""
    if isinstance(arg, (bytes, bytearray)):
        return ARGS_OF[fn_name].from_buffer_copy(arg)
    return arg._obj


_P = ctypes.POINTER
_c_status = ctypes.c_int
_PROTOTYPES = {
    "ag_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "ag_error_clear": (None, [_P(AgError)]),
    "ag_spec_load_file": (_c_status, [ctypes.c_char_p, _P(AgSpecBox), _P(AgError)]),
    "ag_spec_load_string": (_c_status, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                                        _P(AgSpecBox), _P(AgError)]),
    "ag_spec_scale": (ctypes.c_double, [_P(AgSpecBox)]),
    "ag_context_create": (_c_status, [ctypes.c_int, _P(ctypes.c_void_p), _P(AgError)]),
    "ag_context_destroy": (None, [ctypes.c_void_p]),
    "ag_context_arch": (ctypes.c_char_p, [ctypes.c_void_p]),
    "ag_kernel_get": (_c_status, [ctypes.c_void_p, _P(AgSpecBox), _P(ctypes.c_void_p),
                                  _P(AgError)]),
    "ag_kernel_spec": (_P(AgSpec), [ctypes.c_void_p]),
    "ag_kernel_takes_row_strides": (ctypes.c_bool, [ctypes.c_void_p]),
    "ag_kernel_takes_kv_heads": (ctypes.c_bool, [ctypes.c_void_p]),
    # The launches take their args as a const pointer: PACK_* bytes (the
    # hot paths) or a ctypes.byref of the struct.
    "ag_block_forward": (_c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     _P(AgError)]),
    # Optional: a library built before the backward lacks it (Kernel.supports
    # then reports the backward as unavailable).
    "ag_block_backward": (_c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                      _P(AgError)]),
    # Optional: a library built before the jagged pattern lacks them
    # (jagged_attention then says so).
    "ag_jagged_forward": (_c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                      _P(AgError)]),
    "ag_jagged_backward": (_c_status, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                       _P(AgError)]),
    "ag_version": (ctypes.c_char_p, []),
    "ag_jagged_backward_workspace_bytes": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64,
                                                             ctypes.c_int64]),
    # Optional: a library built before broadcast-Q attention lacks them
    # (broadcast_attention then says so).
    "ag_broadcast_forward": (_c_status, [ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_void_p, _P(AgError)]),
    "ag_broadcast_backward": (_c_status, [ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_void_p, _P(AgError)]),
    "ag_broadcast_backward_workspace_bytes": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int64,
                                                                ctypes.c_int64, ctypes.c_int64]),
}
# Entry points that must exist for the library to be usable at all.
_REQUIRED = ("ag_strerror", "ag_error_clear", "ag_spec_load_string", "ag_spec_load_file")

_lock = threading.Lock()
_lib = None


def candidate_paths():
    """Where the library is looked for, in order (the last is a bare name
    for the system loader), yielded lazily: the system's search
    (ctypes.util.find_library runs ldconfig and gcc, about 20 ms) happens
    only when no earlier place has the library."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("ATTNGEN_LIB")
    if env:
        yield env
    yield os.path.join(here, "libattngen.so")  # bundled by setup.py
    yield os.path.normpath(os.path.join(here, "..", "..", "..", "build", "libattngen.so"))
    yield os.path.normpath(os.path.join(here, "..", "..", "build", "libattngen.so"))
    yield ctypes.util.find_library("attngen") or "libattngen.so"


def _bind(lib):
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            if name in _REQUIRED:
                raise _errors.LibraryNotFoundError(
                    "%s lacks the entry point %s; rebuild it with `make build/libattngen.so`"
                    % (lib._name, name))
            continue
        fn.restype = restype
        fn.argtypes = argtypes


def _check_version(handle, path):
    """Refuse a library of another version than the binding's (its structs
    and signatures may differ from the ones mirrored here), and one older
    than ag_version (0.2.0), whose ag_jagged_backward_workspace_bytes took
    other arguments."""
    fn = getattr(handle, "ag_version", None)
    if fn is None:
        raise _errors.LibraryNotFoundError(
            "%s predates ag_version (attngen < 0.2.0) and does not match this binding (%s); "
            "rebuild it (`make build/libattngen.so`) or reinstall the binding "
            "(`pip install ./bindings/python`)" % (path, binding_version()))
    got = fn().decode()
    want = binding_version()
    if want != "0+unknown" and got != want:
        raise _errors.LibraryNotFoundError(
            "%s is libattngen %s, but this binding is %s: its argument structs may differ; "
            "rebuild the library (`make build/libattngen.so`) or reinstall the binding "
            "(`pip install ./bindings/python`)" % (path, got, want))


def lib():
    """The loaded library (loads it on first call). Raises
    LibraryNotFoundError naming every place it looked."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        env = os.environ.get("ATTNGEN_LIB")
        for path in candidate_paths():
            is_bare = os.sep not in path
            if not is_bare and not os.path.exists(path):
                tried.append("%s (not found)" % path)
                if env and path == env:
                    # An explicit ATTNGEN_LIB that does not exist is an error
                    # of its own: do not silently take another library.
                    raise _errors.LibraryNotFoundError(
                        "ATTNGEN_LIB=%s does not exist" % env)
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
                continue
            _bind(handle)
            _check_version(handle, path)
            _lib = handle
            return _lib
        raise _errors.LibraryNotFoundError(
            "libattngen.so not found; build it with `make build/libattngen.so` at the "
            "repository root or set ATTNGEN_LIB. Tried: " + "; ".join(tried))


def has(name):
    """Whether the loaded library exports `name` (e.g. ag_block_backward)."""
    return getattr(lib(), name, None) is not None


def strerror(code):
    try:
        s = lib().ag_strerror(int(code))
        return s.decode("utf-8", "replace") if s else None
    except _errors.LibraryNotFoundError:
        return None


def call(fn_name, *args, context=None):
    """Call a status-returning C function with a fresh ag_error appended as
    its last argument; raise the mapped exception on failure. Returns None.
    context: the message's lead, or a tuple (format, *values) formatted
    only on failure (a launch's success path formats nothing).
    """
    L = lib()
    err = AgError()
    status = getattr(L, fn_name)(*args, ctypes.byref(err))
    if status == _errors.AG_OK:
        if err.message:  # a success leaves none today; free one if it ever does
            L.ag_error_clear(ctypes.byref(err))
        return
    detail = ctypes.string_at(err.message).decode("utf-8", "replace") if err.message else ""
    L.ag_error_clear(ctypes.byref(err))
    if isinstance(context, tuple):
        context = context[0] % context[1:]
    raise _errors.make_error(status, detail, code_name=strerror(status), context=context)
