# SPDX-License-Identifier: BSD-3-Clause
"""CPU tests of the spec side: YAML writing, generated spec names, error
mapping, library discovery, and (when libattngen.so is built) parsing
through the C parser. No torch, no GPU."""
import os
import subprocess
import sys

import pytest

import attngen
from attngen import _errors, _lib, _spec

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_dict_to_yaml():
    text = attngen.dict_to_yaml({
        "name": "x1", "pattern": "block_diagonal", "block_size": 64, "causal": False,
        "softmax_scale": 0.05, "passes": ["forward"], "dtype": "bf16",
        "rotary": {"layout": "interleaved", "apply_to": ["q", "k"], "base": 10000.0},
        "odd": "needs quoting: yes", "word": "true",
    })
    assert text == (
        "name: x1\npattern: block_diagonal\nblock_size: 64\ncausal: false\n"
        "softmax_scale: 0.05\npasses: [forward]\ndtype: bf16\n"
        "rotary:\n  layout: interleaved\n  apply_to: [q, k]\n  base: 10000.0\n"
        "odd: \"needs quoting: yes\"\nword: \"true\"\n")
    with pytest.raises(ValueError):
        attngen.dict_to_yaml({"softmax_scale": float("nan")})
    with pytest.raises(TypeError):
        attngen.dict_to_yaml({"x": object()})


def test_block_spec_names():
    assert attngen.block_spec_name(64, 128, "bf16") == "torch_block64_d128_bf16"
    assert attngen.block_spec_name(16, 64, "fp16", causal=True) == "torch_block16_d64_fp16_causal"
    assert attngen.block_spec_name(64, 64, "bf16", softmax_scale=0.05) == "torch_block64_d64_bf16_s0p05"
    assert attngen.block_spec_name(64, 64, "bf16", softmax_scale=1e-5) == "torch_block64_d64_bf16_s1em05"
    s = attngen.block_spec(128, 64, "fp16", True, None)
    assert s["softmax_scale"] == "auto" and s["passes"] == ["forward"] and s["causal"] is True
    with pytest.raises(ValueError):
        attngen.block_spec(64, 64, "fp32")
    # the spec autograd asks for: both passes, its own name
    assert attngen.block_spec_name(64, 128, "bf16", backward=True) == "torch_block64_d128_bf16_grad"
    assert attngen.block_spec_name(16, 64, "fp16", True, 0.05, True) == \
        "torch_block16_d64_fp16_causal_s0p05_grad"
    s = attngen.block_spec(64, 128, "bf16", backward=True)
    assert s["passes"] == ["forward", "backward"] and s["name"].endswith("_grad")
    assert "passes: [forward, backward]\n" in attngen.dict_to_yaml(s)
    # rotary options: a short tag, and the spec's rotary mapping (base only
    # with computed positions)
    table = {"layout": "interleaved", "apply_to": ("q", "k"), "positions": "table", "base": None}
    assert attngen.block_spec_name(64, 128, "bf16", backward=True, rotary=table) == \
        "torch_block64_d128_bf16_ropei_qk_t_grad"
    s = attngen.block_spec(64, 128, "bf16", backward=True, rotary=table)
    assert attngen.dict_to_yaml(s).endswith(
        "rotary:\n  layout: interleaved\n  apply_to: [q, k]\n  positions: table\n"
        "passes: [forward, backward]\n")
    seq = {"layout": "half", "apply_to": ("q", "k", "v"), "positions": "sequence", "base": 1e4}
    assert attngen.block_spec_name(16, 64, "fp16", rotary=seq) == \
        "torch_block16_d64_fp16_ropeh_qkv_s"
    seq["base"] = 5e5
    assert attngen.block_spec_name(16, 64, "fp16", rotary=seq) == \
        "torch_block16_d64_fp16_ropeh_qkv_s_b500000"
    assert attngen.block_spec(16, 64, "fp16", rotary=seq)["rotary"]["base"] == 500000.0
    # past the 48 characters a spec's name may have: cut, with a hash of the whole
    long = attngen.block_spec_name(256, 128, "bf16", True, 0.0883883476, True, seq)
    assert len(long) == 48 and long.startswith("torch_block256_d128_bf16_causal_s0p0883")
    assert long != attngen.block_spec_name(256, 128, "bf16", True, 0.0883883476, False, seq)
    assert len(attngen.block_spec_name(256, 128, "bf16", True, 0.0883883476, True)) == 48


def test_error_mapping():
    e = _errors.make_error(_errors.AG_ERR_SPEC, "x.yaml:1:1: error: empty spec\n",
                           code_name="invalid spec", context="loading")
    assert isinstance(e, attngen.SpecError) and isinstance(e, ValueError)
    assert str(e) == "loading: invalid spec: x.yaml:1:1: error: empty spec"
    assert e.code == _errors.AG_ERR_SPEC and e.detail.endswith("empty spec")
    assert isinstance(_errors.make_error(_errors.AG_ERR_INVALID_ARGUMENT, "q is null"), ValueError)
    assert isinstance(_errors.make_error(_errors.AG_ERR_UNSUPPORTED, ""), NotImplementedError)
    assert isinstance(_errors.make_error(_errors.AG_ERR_IO, "nope"), OSError)
    assert isinstance(_errors.make_error(_errors.AG_ERR_NOMEM, ""), MemoryError)
    assert isinstance(_errors.make_error(_errors.AG_ERR_NVRTC, "log"), attngen.CompileError)
    assert isinstance(_errors.make_error(_errors.AG_ERR_NO_DRIVER, ""), attngen.DriverError)
    assert isinstance(_errors.make_error(_errors.AG_ERR_CUDA, ""), attngen.CudaError)
    assert type(_errors.make_error(99, "")) is attngen.AttngenError
    for code in range(1, _errors.AG_ERR_COUNT):
        assert isinstance(_errors.make_error(code, "m"), attngen.AttngenError)
    assert str(_errors.make_error(_errors.AG_ERR_CUDA, "")) == "CUDA error"


def test_missing_library_is_reported(monkeypatch):
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setenv("ATTNGEN_LIB", "/nonexistent/libattngen.so")
    with pytest.raises(attngen.LibraryNotFoundError, match="ATTNGEN_LIB=/nonexistent/libattngen.so does not exist"):
        attngen.parse_spec("name: x\n")
    monkeypatch.setattr(_lib, "_lib", None)  # do not keep a half state


def test_candidate_paths(monkeypatch):
    monkeypatch.setenv("ATTNGEN_LIB", "/x/lib.so")
    paths = list(_lib.candidate_paths())
    assert paths[0] == "/x/lib.so"
    assert os.path.join(REPO, "build", "libattngen.so") in paths


def test_candidate_paths_bundled_copy_second(monkeypatch):
    """pip install bundles the library in the package: tried after
    ATTNGEN_LIB, before the checkout's build/."""
    monkeypatch.setenv("ATTNGEN_LIB", "/x/libattngen.so")
    paths = list(_lib.candidate_paths())
    pkg = os.path.dirname(os.path.abspath(_lib.__file__))
    assert paths[0] == "/x/libattngen.so"
    assert paths[1] == os.path.join(pkg, "libattngen.so")


def test_system_search_only_when_needed(monkeypatch):
    """ctypes.util.find_library (ldconfig and gcc in subprocesses, tens of
    ms) runs only after every other place has been tried."""
    calls = []
    monkeypatch.setattr(_lib.ctypes.util, "find_library",
                        lambda name: calls.append(name) or "/sys/libattngen.so")
    monkeypatch.setenv("ATTNGEN_LIB", "/x/libattngen.so")
    paths = _lib.candidate_paths()
    assert next(paths) == "/x/libattngen.so"
    for _ in range(3):
        next(paths)
    assert calls == []
    assert next(paths) == "/sys/libattngen.so"
    assert calls == ["attngen"]


class _FakeVersion:
    def __init__(self, v):
        self.v = v

    def __call__(self):
        return self.v.encode()


class _FakeHandle:
    pass


def test_version_check():
    """A library of another version, or one older than ag_version, is
    refused with a message; the binding's own version passes."""
    h = _FakeHandle()
    with pytest.raises(_errors.LibraryNotFoundError, match="predates ag_version"):
        _lib._check_version(h, "/old/libattngen.so")
    h.ag_version = _FakeVersion("0.0.9")
    with pytest.raises(_errors.LibraryNotFoundError, match="is libattngen 0.0.9, but this binding"):
        _lib._check_version(h, "/other/libattngen.so")
    h.ag_version = _FakeVersion(attngen.__version__)
    _lib._check_version(h, "/same/libattngen.so")


def test_version_is_the_headers():
    """One version: include/attngen.h's AG_VERSION_STRING is the package's."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
    with open(os.path.join(root, "include", "attngen.h")) as f:
        text = f.read()
    assert '#define AG_VERSION_STRING "%s"' % attngen.__version__ in text


def test_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import attngen\n"
            "from attngen import _validate\n"
            "print(attngen.block_spec_name(64, 128, 'bf16'))\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "torch_block64_d128_bf16"


# ---- through the C parser (needs libattngen.so, no GPU) ----

def _need_lib():
    try:
        _lib.lib()
    except attngen.LibraryNotFoundError as e:
        pytest.skip("libattngen.so not built: %s" % e)


def test_parse_bundled_spec():
    _need_lib()
    box, info = attngen.parse_spec(os.path.join(REPO, "specs", "ads_block64_d128_bf16.yaml"))
    assert (info.name, info.pattern, info.block_size, info.head_dim, info.dtype) == (
        "ads_block64_d128", "block_diagonal", 64, 128, "bf16")
    assert info.causal is False and info.softmax_scale is None and info.passes == ("forward",)
    assert abs(info.scale - 128 ** -0.5) < 1e-12
    assert info.source == "ads_block64_d128_bf16.yaml"


def test_parse_dict_and_string():
    _need_lib()
    _, info = attngen.parse_spec(attngen.block_spec(128, 64, "fp16", True, 0.05))
    assert (info.name, info.block_size, info.head_dim, info.dtype, info.causal) == (
        "torch_block128_d64_fp16_causal_s0p05", 128, 64, "fp16", True)
    assert info.scale == 0.05 and info.source == "<dict>"
    _, info = attngen.parse_spec("name: s1\npattern: block_diagonal\nblock_size: 32\n"
                                 "head_dim: 64\ndtype: bf16\n")
    assert info.block_size == 32 and info.source == "<string>"
    k = attngen.load(attngen.block_spec(64, 128, "bf16"), compile=False)
    assert k.name == "torch_block64_d128_bf16" and k.supports("forward")
    assert not k.supports("backward")


def test_spec_errors_carry_the_c_message():
    _need_lib()
    with pytest.raises(attngen.SpecError) as ei:
        attngen.parse_spec("name: bad\npattern: block_diagonal\nblok_size: 64\n")
    msg = str(ei.value)
    assert "<string>:3:1: error:" in msg and "blok_size" in msg
    assert ei.value.code == _errors.AG_ERR_SPEC
    with pytest.raises(attngen.AttngenIOError):
        attngen.parse_spec("/nonexistent/spec.yaml")
    with pytest.raises(TypeError):
        attngen.parse_spec(42)


def _layout_items():
    """(C expression, Python value) for the size of every mirrored struct
    and of each nested struct, and the offset of every field from the start
    of its top-level struct, recursively (designators like rotary.base and
    at.passes.line)."""
    import ctypes
    items = []

    def walk(ctype, cls, prefix, base):
        for field in cls._fields_:
            name, ftype = field[0], field[1]
            designator = prefix + name
            offset = base + getattr(cls, name).offset
            items.append(("offsetof(%s, %s)" % (ctype, designator), offset))
            if isinstance(ftype, type) and issubclass(ftype, ctypes.Structure):
                items.append(("sizeof(((%s *)0)->%s)" % (ctype, designator),
                              ctypes.sizeof(ftype)))
                walk(ctype, ftype, designator + ".", offset)

    for ctype, cls in _lib.MIRRORS.items():
        items.append(("sizeof(%s)" % ctype, ctypes.sizeof(cls)))
        walk(ctype, cls, "", 0)
    return items


# Enum values and limits the binding hard-codes, with their header names.
_CONSTANTS = [
    ("AG_NAME_MAX", _lib.AG_NAME_MAX), ("AG_SOURCE_MAX", _lib.AG_SOURCE_MAX),
    ("AG_KERNEL_NAME_MAX", _lib.AG_KERNEL_NAME_MAX),
    ("AG_PATTERN_BLOCK_DIAGONAL", _lib.AG_PATTERN_BLOCK_DIAGONAL),
    ("AG_PATTERN_JAGGED", _lib.AG_PATTERN_JAGGED),
    ("AG_QUERY_PER_SEQUENCE", _lib.AG_QUERY_PER_SEQUENCE),
    ("AG_QUERY_BROADCAST", _lib.AG_QUERY_BROADCAST),
    ("AG_DTYPE_BF16", _lib.AG_DTYPE_BF16), ("AG_DTYPE_FP16", _lib.AG_DTYPE_FP16),
    ("AG_ROTARY_NONE", _lib.AG_ROTARY_NONE), ("AG_ROTARY_INTERLEAVED", _lib.AG_ROTARY_INTERLEAVED),
    ("AG_ROTARY_HALF", _lib.AG_ROTARY_HALF),
    ("AG_POSITIONS_TABLE", _lib.AG_POSITIONS_TABLE),
    ("AG_POSITIONS_SEQUENCE", _lib.AG_POSITIONS_SEQUENCE),
    ("AG_POSITIONS_BLOCK", _lib.AG_POSITIONS_BLOCK),
    ("AG_APPLY_Q", _lib.AG_APPLY_Q), ("AG_APPLY_K", _lib.AG_APPLY_K),
    ("AG_APPLY_V", _lib.AG_APPLY_V),
    ("AG_PASS_FORWARD", _lib.AG_PASS_FORWARD), ("AG_PASS_BACKWARD", _lib.AG_PASS_BACKWARD),
    ("AG_ARCH_AUTO", _lib.AG_ARCH_AUTO), ("AG_ARCH_SM80", _lib.AG_ARCH_SM80),
    ("AG_ARCH_SM90A", _lib.AG_ARCH_SM90A),
] + [(name, getattr(_errors, name)) for name in (
    "AG_OK", "AG_ERR_SPEC", "AG_ERR_UNSUPPORTED", "AG_ERR_IO", "AG_ERR_NOMEM",
    "AG_ERR_TEMPLATE", "AG_ERR_NVRTC", "AG_ERR_NO_DRIVER", "AG_ERR_NO_DEVICE", "AG_ERR_CUDA",
    "AG_ERR_INVALID_ARGUMENT", "AG_ERR_CACHE", "AG_ERR_COUNT")]


def test_backward_spec_through_the_c_parser():
    """The spec autograd asks for parses with both passes; the forward-only
    one is unaffected."""
    _need_lib()
    _, info = attngen.parse_spec(attngen.block_spec(64, 64, "bf16", backward=True))
    assert info.passes == ("forward", "backward")
    k = attngen.kernel_for(64, False, 64, "bf16", None, backward=True)
    assert k.name == "torch_block64_d64_bf16_grad" and k.supports("backward")
    assert attngen.kernel_for(64, False, 64, "bf16").spec.passes == ("forward",)


def test_rotary_backward_at_every_block_size():
    """256-token blocks at head_dim 128 with rotary embeddings: the backward
    walks them in chunks, rotated, so both passes plan; with positions from
    a table the forward has no room for the table's rows, and validation
    refuses the spec at `rotary` with the plan's reason, once (the backward
    alone would fit)."""
    _need_lib()
    rotary = attngen._validate.check_rotary(
        {"layout": "half", "apply_to": ["q", "k"], "positions": "sequence"})
    _, info = attngen.parse_spec(attngen.block_spec(256, 128, "bf16", backward=True,
                                                    rotary=rotary))
    assert info.passes == ("forward", "backward")
    k = attngen.kernel_for(256, False, 128, "bf16", backward=True, rotary=rotary)
    assert k.spec.passes == ("forward", "backward") and k.supports("backward")
    table = attngen._validate.check_rotary({"layout": "interleaved", "positions": "table"})
    with pytest.raises(attngen.UnsupportedError) as ei:
        attngen.parse_spec(attngen.block_spec(256, 128, "bf16", backward=True, rotary=table))
    assert ("error: not supported yet: rotary positions from a table at block_size 256 "
            "with head_dim 128") in ei.value.detail
    assert ei.value.detail.count("error:") == 1
    with pytest.raises(attngen.UnsupportedError, match="block_size 256 with head_dim 128"):
        attngen.kernel_for(256, False, 128, "bf16", backward=True, rotary=table)


def test_rotary_spec_through_the_c_parser():
    """block_attention's rotary options make a spec the C parser reads back
    as given, for every layout and position mode."""
    _need_lib()
    for layout in ("interleaved", "half"):
        for positions, base in (("table", None), ("sequence", 10000.0), ("block", 5e5)):
            rotary = attngen._validate.check_rotary(
                {"layout": layout, "apply_to": ["v", "q"], "positions": positions,
                 **({} if base is None else {"base": base})})
            _, info = attngen.parse_spec(attngen.block_spec(64, 128, "bf16", backward=True,
                                                            rotary=rotary))
            assert info.rotary == {"layout": layout, "apply_to": ("q", "v"),
                                   "positions": positions, "base": base or 10000.0}
            assert info.passes == ("forward", "backward")
    k = attngen.kernel_for(64, True, 64, "fp16", backward=True, rotary="half")
    assert k.spec.rotary["positions"] == "table" and k.supports("backward")
    assert k.name == "torch_block64_d64_fp16_causal_ropeh_qk_t_grad"


def test_ctypes_mirrors_match_the_c_header(tmp_path):
    """Every ctypes struct passed to the C API (_lib.MIRRORS) has the C
    layout, read from the header by a compiled probe: the size of each
    struct and nested struct and the offset of every field. A field the
    header gains, loses or moves must be mirrored here, or C reads or writes
    past the Python struct. The enum values the binding hard-codes are
    checked the same way."""
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to read the header's struct layouts")
    items = _layout_items() + _CONSTANTS
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "attngen.h"',
             'int main(void) {']
    for expr, _ in items:
        lines.append('  printf("%%lld\\n", (long long)(%s));' % expr)
    lines += ['  return 0;', '}', '']
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(REPO, "include"), str(src), "-o", str(exe)],
                   check=True)
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True,
                                          text=True).stdout.split()]
    assert len(got) == len(items)
    wrong = ["%s: C %d, Python %d" % (expr, c, py) for (expr, py), c in zip(items, got) if c != py]
    assert not wrong, "ctypes mirrors differ from include/attngen.h:\n" + "\n".join(wrong)
    # Every C struct the launch API takes is mirrored.
    assert {"ag_block_fwd_args", "ag_block_bwd_args", "ag_spec", "ag_error"} <= set(_lib.MIRRORS)
    # The last field of each args struct ends the struct (no field missing at its end).
    import ctypes
    for ctype in ("ag_block_fwd_args", "ag_block_bwd_args"):
        cls = _lib.MIRRORS[ctype]
        last = cls._fields_[-1][0]
        assert getattr(cls, last).offset + ctypes.sizeof(ctypes.c_void_p) == ctypes.sizeof(cls)


def test_bwd_args_field_order_is_the_headers():
    """The backward's args mirror lists the header's fields in the header's
    order (offsets alone would not catch two same-typed fields swapped)."""
    import re
    header = open(os.path.join(REPO, "include", "attngen.h")).read()
    body = re.search(r"typedef struct ag_block_bwd_args \{(.*?)\} ag_block_bwd_args;", header,
                     re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        for part in decl.split(","):
            m = re.search(r"\**\s*([A-Za-z_][A-Za-z0-9_]*)\s*$", part.strip())
            names.append(m.group(1))
    assert names == [f[0] for f in _lib.AgBlockBwdArgs._fields_]
    assert names == ["q", "k", "v", "dout", "dq", "dk", "dv", "offsets", "batch", "heads",
                     "total_tokens", "host_offsets", "rotary_table", "q_stride", "k_stride",
                     "v_stride", "dout_stride", "dq_stride", "dk_stride", "dv_stride",
                     "kv_heads"]


def test_packed_args_read_back_as_the_mirrors():
    """The launches' packed args (_lib.PACK_*) are the bytes of their
    mirror struct: each field, packed in order, reads back as itself (0 as
    a NULL pointer), and args_of reads packed bytes and a byref alike. A
    mirror with a field that is not 8 bytes is refused when packed."""
    import ctypes
    packers = {"ag_block_forward": _lib.PACK_BLOCK_FWD, "ag_block_backward": _lib.PACK_BLOCK_BWD,
               "ag_jagged_forward": _lib.PACK_JAGGED_FWD,
               "ag_jagged_backward": _lib.PACK_JAGGED_BWD,
               "ag_broadcast_forward": _lib.PACK_BROADCAST_FWD,
               "ag_broadcast_backward": _lib.PACK_BROADCAST_BWD}
    assert set(packers) == set(_lib.ARGS_OF)
    for fn, pack in packers.items():
        cls = _lib.ARGS_OF[fn]
        values = [(i + 1) << 36 if t is ctypes.c_void_p else -(i + 1)
                  for i, (_, t) in enumerate(cls._fields_)]
        values[1] = 0  # a NULL pointer
        got = _lib.args_of(fn, pack(*values))
        want = [None if v == 0 else v for v in values]
        assert [getattr(got, name) for name, _ in cls._fields_] == want
        same = cls.from_buffer_copy(pack(*values))
        assert _lib.args_of(fn, ctypes.byref(same)) is same

    class Narrow(ctypes.Structure):
        _fields_ = [("q", ctypes.c_void_p), ("flag", ctypes.c_int)]
    with pytest.raises(TypeError, match="Narrow.flag is not an 8-byte field at offset 8"):
        _lib._packer(Narrow)


def test_one_line_yaml_ending_in_yaml_is_text_issue22():
    from attngen import ops
    assert not ops._looks_like_path("name: x.yaml")
    assert not ops._looks_like_path("{name: x.yaml}")
    assert ops._looks_like_path("specs/missing.yaml")
    assert ops._looks_like_path(os.path.join(REPO, "specs", "ads_block64_d128_bf16.yaml"))
    # Parsed as YAML text: the C parser's message names "<string>", not a file.
    with pytest.raises(attngen.SpecError, match="<string>"):
        attngen.parse_spec("name: x.yaml")
