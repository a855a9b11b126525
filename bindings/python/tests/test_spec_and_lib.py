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
    paths = _lib.candidate_paths()
    assert paths[0] == "/x/lib.so"
    assert os.path.join(REPO, "build", "libattngen.so") in paths


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
    with pytest.raises(attngen.UnsupportedError, match="backward"):
        attngen.parse_spec({"name": "b", "pattern": "block_diagonal", "block_size": 64,
                            "head_dim": 64, "dtype": "bf16", "passes": ["forward", "backward"]})
    with pytest.raises(attngen.AttngenIOError):
        attngen.parse_spec("/nonexistent/spec.yaml")
    with pytest.raises(TypeError):
        attngen.parse_spec(42)


def test_ctypes_mirrors_match_the_c_header(tmp_path):
    """The ctypes structs passed to the C API have the C layout, read from
    the header by a compiled probe: a field the header gains must be
    mirrored here, or C reads or writes past the Python struct."""
    import ctypes
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to read the header's struct layouts")
    src = tmp_path / "sizes.c"
    src.write_text(
        '#include <stdio.h>\n#include <stddef.h>\n#include "attngen.h"\n'
        'int main(void) { printf("%zu %zu %zu %zu %zu %zu\\n", sizeof(ag_block_fwd_args),'
        ' offsetof(ag_block_fwd_args, total_tokens), sizeof(ag_spec),'
        ' offsetof(ag_spec, passes), offsetof(ag_spec, softmax_scale), sizeof(ag_error));'
        ' return 0; }\n')
    exe = tmp_path / "sizes"
    subprocess.run([cc, "-I", os.path.join(REPO, "include"), str(src), "-o", str(exe)],
                   check=True)
    fwd, total_at, spec, passes_at, scale_at, error = map(int, subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.split())
    assert ctypes.sizeof(_lib.AgBlockFwdArgs) == fwd
    assert _lib.AgBlockFwdArgs.total_tokens.offset == total_at
    assert ctypes.sizeof(_lib.AgSpec) == spec
    assert _lib.AgSpec.passes.offset == passes_at
    assert _lib.AgSpec.softmax_scale.offset == scale_at
    assert ctypes.sizeof(_lib.AgError) == error
