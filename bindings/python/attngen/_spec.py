# SPDX-License-Identifier: BSD-3-Clause
"""Spec text for the Python side: a tiny YAML writer for spec dicts, and the
spec that `block_attention` generates for a set of arguments.

Pure Python: the C parser (ag_spec_load_string) remains the only judge of
what a valid spec is; nothing here second-guesses it beyond naming.
"""

import hashlib
import json
import math
import re

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"}


def _scalar(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("spec values must be finite, got %r" % value)
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, str):
        if _PLAIN.match(value) and value.lower() not in _YAML_WORDS:
            return value
        return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar
    raise TypeError("unsupported spec value %r (%s)" % (value, type(value).__name__))


def _emit(mapping, indent, lines):
    pad = "  " * indent
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise TypeError("spec keys must be strings, got %r" % (key,))
        if isinstance(value, dict):
            lines.append("%s%s:" % (pad, key))
            _emit(value, indent + 1, lines)
        elif isinstance(value, (list, tuple)):
            lines.append("%s%s: [%s]" % (pad, key, ", ".join(_scalar(v) for v in value)))
        else:
            lines.append("%s%s: %s" % (pad, key, _scalar(value)))


def dict_to_yaml(spec):
    """YAML text for a spec given as a dict (nested dicts and flat lists of
    scalars only, as specs are). Key order is kept."""
    if not isinstance(spec, dict):
        raise TypeError("a spec dict is required, got %s" % type(spec).__name__)
    lines = []
    _emit(spec, 0, lines)
    return "\n".join(lines) + "\n"


DTYPE_NAMES = ("bf16", "fp16")


def _scale_tag(scale):
    text = "%.9g" % scale
    return text.replace(".", "p").replace("-", "m").replace("+", "")


NAME_MAX = 48  # characters of a spec's name (spec_check.c)
ROTARY_BASE_DEFAULT = 10000.0


def _rotary_tag(rotary):
    """"_rope" and the rotary options in a few characters: the layout's
    initial, the rotated tensors, the positions' initial and any base other
    than the default, e.g. _ropei_qk_t or _ropeh_qkv_s_b500000."""
    tag = "_rope%s_%s_%s" % (rotary["layout"][0], "".join(rotary["apply_to"]),
                             rotary["positions"][0])
    base = rotary.get("base")
    if base is not None and base != ROTARY_BASE_DEFAULT:
        tag += "_b" + _scale_tag(base)
    return tag


def _rotary_mapping(rotary):
    """The spec's rotary mapping for normalized rotary options: layout,
    apply_to, positions, and base when there is one (computed positions)."""
    out = {"layout": rotary["layout"], "apply_to": list(rotary["apply_to"]),
           "positions": rotary["positions"]}
    if rotary.get("base") is not None:
        out["base"] = float(rotary["base"])
    return out


def block_spec_name(block_size, head_dim, dtype, causal=False, softmax_scale=None,
                    backward=False, rotary=None, row_strides=False):
    """The generated spec's name, e.g. torch_block64_d128_bf16, with
    _causal, _s<scale> and _rope<options> suffixes when they apply, _rs
    for kernels that take row strides (`row_strides: true`), and _grad for
    the spec with both passes (forward and backward in one module). A name
    past the 48 characters specs allow keeps its first 39 and ends with 8
    hex digits of a hash of the whole."""
    name = "torch_block%d_d%d_%s" % (block_size, head_dim, dtype)
    if causal:
        name += "_causal"
    if softmax_scale is not None:
        name += "_s" + _scale_tag(softmax_scale)
    if rotary is not None:
        name += _rotary_tag(rotary)
    if row_strides:
        name += "_rs"
    if backward:
        name += "_grad"
    name = name.lower()
    if len(name) > NAME_MAX:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = name[:NAME_MAX - 9] + "_" + digest
    return name


def block_spec(block_size, head_dim, dtype, causal=False, softmax_scale=None, backward=False,
               rotary=None, row_strides=False):
    """The spec dict block_attention compiles for its arguments. `dtype` is
    "bf16" or "fp16"; softmax_scale None means auto (1/sqrt(head_dim)).
    backward=True asks for `passes: [forward, backward]` (what
    block_attention uses when an input requires grad); otherwise the spec
    has the forward alone. `rotary`: None, or the normalized options of
    _validate.check_rotary ({"layout", "apply_to", "positions", "base"};
    base None with positions from a table), written as the spec's rotary
    mapping. row_strides=True asks for kernels that take each tensor's row
    stride and kv_heads (views of one projection, grouped-query heads)."""
    if dtype not in DTYPE_NAMES:
        raise ValueError("dtype must be one of %s, got %r" % (DTYPE_NAMES, dtype))
    spec = {
        "name": block_spec_name(block_size, head_dim, dtype, causal, softmax_scale, backward,
                                rotary, row_strides),
        "pattern": "block_diagonal",
        "block_size": int(block_size),
        "causal": bool(causal),
        "head_dim": int(head_dim),
        "dtype": dtype,
        "softmax_scale": "auto" if softmax_scale is None else float(softmax_scale),
    }
    if rotary is not None:
        spec["rotary"] = _rotary_mapping(rotary)
    spec["passes"] = ["forward", "backward"] if backward else ["forward"]
    if row_strides:
        spec["row_strides"] = True
    return spec


def jagged_spec_name(head_dim, dtype, causal=False, window=None, softmax_scale=None,
                     deterministic=False, backward=False, broadcast=False, rotary=None):
    """The name of the spec jagged_attention generates, e.g.
    torch_jagged_d128_bf16, with _causal, _w<left>_<right> (window),
    _s<scale>, _rope<options> (rotary, as block_spec_name's), _det
    (deterministic) and _grad (both passes) when they apply;
    cut to 48 characters with a hash as block_spec_name. broadcast=True
    names broadcast_attention's spec (`query: broadcast`) the same way from
    torch_broadcast_ instead of torch_jagged_, e.g.
    torch_broadcast_d128_bf16_causal_grad."""
    name = "torch_%s_d%d_%s" % ("broadcast" if broadcast else "jagged", head_dim, dtype)
    if causal:
        name += "_causal"
    if window is not None:
        name += "_w%d_%d" % (int(window[0]), int(window[1]))
    if softmax_scale is not None:
        name += "_s" + _scale_tag(softmax_scale)
    if rotary is not None:
        name += _rotary_tag(rotary)
    if deterministic:
        name += "_det"
    if backward:
        name += "_grad"
    name = name.lower()
    if len(name) > NAME_MAX:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = name[:NAME_MAX - 9] + "_" + digest
    return name


def jagged_spec(head_dim, dtype, causal=False, window=None, softmax_scale=None,
                deterministic=False, backward=False, broadcast=False, rotary=None):
    """The spec dict jagged_attention compiles for its arguments: `pattern:
    jagged`, `causal`, `window: [left, right]` when `window` is a pair of
    non-negative ints (None: no window), `head_dim`, `dtype`,
    `softmax_scale` only when given (None: auto), `deterministic: true`
    only when asked, the `rotary` mapping when `rotary` is given (the
    normalized options of _validate.check_jagged_rotary, written as
    block_spec writes them), and `passes: [forward, backward]` with
    backward=True (else `[forward]`). The window is taken as given: mapping FlashAttention's
    window_size onto it is _validate.check_window_size's job.

    broadcast=True gives broadcast_attention's spec instead: the same keys
    with `query: broadcast` after the pattern (one dense Q shared by every
    sequence) and a torch_broadcast_ name (jagged_spec_name)."""
    if dtype not in DTYPE_NAMES:
        raise ValueError("dtype must be one of %s, got %r" % (DTYPE_NAMES, dtype))
    spec = {
        "name": jagged_spec_name(head_dim, dtype, causal, window, softmax_scale, deterministic,
                                 backward, broadcast, rotary),
        "pattern": "jagged",
    }
    if broadcast:
        spec["query"] = "broadcast"
    spec["causal"] = bool(causal)
    if window is not None:
        spec["window"] = [int(window[0]), int(window[1])]
    spec["head_dim"] = int(head_dim)
    spec["dtype"] = dtype
    if softmax_scale is not None:
        spec["softmax_scale"] = float(softmax_scale)
    if deterministic:
        spec["deterministic"] = True
    if rotary is not None:
        spec["rotary"] = _rotary_mapping(rotary)
    spec["passes"] = ["forward", "backward"] if backward else ["forward"]
    return spec


class SpecInfo:
    """What Python needs of a parsed ag_spec (a plain copy, no pointers)."""

    __slots__ = ("name", "source", "pattern", "block_size", "causal", "head_dim",
                 "dtype", "softmax_scale", "scale", "passes", "rotary", "window",
                 "deterministic", "query", "row_strides")

    def __init__(self, name, source, pattern, block_size, causal, head_dim, dtype,
                 softmax_scale, scale, passes, rotary=None, window=None, deterministic=False,
                 query="per_sequence", row_strides=False):
        self.name = name
        self.source = source
        self.pattern = pattern          # "block_diagonal" | "jagged"
        self.block_size = block_size
        self.causal = causal
        self.head_dim = head_dim
        self.dtype = dtype              # "bf16" | "fp16"
        self.softmax_scale = softmax_scale  # as written; None for auto
        self.scale = scale              # effective scale
        self.passes = passes            # tuple of "forward", "backward"
        # None, or {"layout": "interleaved"|"half", "apply_to": ("q", "k", ...),
        # "positions": "table"|"sequence"|"block", "base": float}
        self.rotary = rotary
        self.window = window            # jagged: None or (left, right)
        self.deterministic = deterministic  # jagged: `deterministic: true`
        self.query = query              # "per_sequence" | "broadcast" (jagged: one dense Q)
        self.row_strides = row_strides  # block: `row_strides: true`

    def __repr__(self):
        return ("SpecInfo(name=%r, pattern=%r, block_size=%d, causal=%r, head_dim=%d, "
                "dtype=%r, scale=%.9g, passes=%r%s)" % (
                    self.name, self.pattern, self.block_size, self.causal, self.head_dim,
                    self.dtype, self.scale, self.passes,
                    (", rotary=%r" % (self.rotary,) if self.rotary else "") +
                    (", window=%r" % (self.window,) if self.window else "") +
                    (", deterministic=True" if self.deterministic else "") +
                    (", query=%r" % self.query if self.query != "per_sequence" else "") +
                    (", row_strides=True" if self.row_strides else "")))
