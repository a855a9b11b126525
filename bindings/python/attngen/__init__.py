# SPDX-License-Identifier: BSD-3-Clause
"""attngen: specialized attention kernels from YAML specs, for PyTorch.

    import attngen
    out = attngen.block_attention(q, k, v, offsets)            # block 64
    out = attngen.block_attention(q, k, v, offsets, cpu_offsets,
                                  block_size=128, causal=True)
    kernel = attngen.load("specs/ads_block64_d128_bf16.yaml")  # or YAML text, or a dict
    out = kernel(q, k, v, offsets)

block_attention is differentiable: with an input that requires grad it
builds the spec with `passes: [forward, backward]` and autograd launches
attngen's backward kernel. A Kernel whose spec has the backward also runs it
alone: `dq, dk, dv = kernel.backward(q, k, v, dout, offsets)`. q, k, v may
be column slices of one projection output (heads and head_dim dense, rows
spaced), and block_attention_qkvpacked(qkv, offsets) takes qkv [total_tokens,
3, heads, head_dim] and gives its gradient back as one packed tensor; a
kernel that takes row strides (Kernel.takes_row_strides) reads and writes
such views in place, else they are copied. Rotary embeddings are fused into
both passes:

    out = attngen.block_attention(q, k, v, offsets,
                                  rotary={"layout": "interleaved", "apply_to": ["q", "k"]},
                                  rotary_table=table)   # [total_tokens, head_dim]: sin | cos

Jagged (variable-length) sequences, named and ordered like FlashAttention's
flash_attn_varlen_func, so switching is an import:

    out = attngen.jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                   causal=True, window_size=(256, 0))
    out, lse = attngen.jagged_attention(q, k, v, cu_seqlens_q, return_lse=True)

q [total_q, heads, D], k and v [total_k, kv_heads, D] (kv_heads divides
heads), cu_seqlens int32 [batch + 1] on the device (cu_seqlens_k None:
self-attention); max_seqlen_q / max_seqlen_k are accepted and unused.
causal and windows are aligned at the bottom right as FlashAttention's;
lse is fp32 [heads, total_q]. Differentiable (forward and backward
kernels in one module). On an H200/H100 (sm_90a) the backward adds dq
with atomics, so dq's last bits vary run to run (dk, dv do not);
`deterministic=True` writes `deterministic: true` into the spec, which
takes the two-kernel backward with bit-identical gradients. Rotary
embeddings as block_attention's (positions "table" or "sequence"; key j at
position j, query i at i + Lk - Lq), both passes:

    out = attngen.jagged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                   rotary={"layout": "half"},
                                   rotary_table=table_q,     # [total_q, D]: sin | cos
                                   rotary_table_k=table_k)   # [total_k, D]; None: table_q

No dropout (UnsupportedError).

Broadcast queries: one dense q [n_q, heads, D] shared by every sequence
(a PMA block's seeds, candidates against each user's history), over the
same jagged k and v:

    out = attngen.broadcast_attention(q, k, v, cu_seqlens_k)    # [batch * n_q, heads, D]
    out, lse = attngen.broadcast_attention(q, k, v, cu_seqlens_k, causal=True,
                                           return_lse=True)     # lse [heads, batch * n_q]

Sequence b's output rows start at b * n_q; causal and windows are aligned at
the bottom right with Lq = n_q. Differentiable without expanding q: the
backward kernel sums dq [n_q, heads, D] over the batch (bit-identical run
to run). Its spec is jagged_spec(..., broadcast=True) (`query: broadcast`).

The runtime library libattngen.so is found through $ATTNGEN_LIB, the
repository's build/ directory or the system loader, and loaded on first use;
torch is imported on first use too, so this module imports without either.
"""


from ._errors import (  # noqa: F401
    AttngenError, AttngenIOError, AttngenMemoryError, CacheError, CompileError, CudaError,
    DriverError, InvalidArgumentError, LibraryNotFoundError, SpecError, UnsupportedError,
)
from ._spec import (  # noqa: F401
    SpecInfo, block_spec, block_spec_name, dict_to_yaml, jagged_spec, jagged_spec_name,
)
from ._validate import (  # noqa: F401
    check_block_attention_args, check_broadcast_attention_args, check_jagged_attention_args,
)
from .ops import (  # noqa: F401
    Kernel, block_attention, block_attention_api, block_attention_qkvpacked, context_arch,
    kernel_for, load, parse_spec,
)
from .jagged import jagged_attention, jagged_kernel_for  # noqa: F401
from .broadcast import broadcast_attention, broadcast_kernel_for  # noqa: F401

from . import torch_ops  # noqa: F401

from ._version_of import binding_version as _binding_version

__version__ = _binding_version()

__all__ = [
    "load", "block_attention", "block_attention_api", "block_attention_qkvpacked",
    "jagged_attention",
    "broadcast_attention", "Kernel", "SpecInfo", "parse_spec", "kernel_for",
    "jagged_kernel_for", "broadcast_kernel_for", "block_spec", "block_spec_name",
    "jagged_spec", "jagged_spec_name", "check_block_attention_args",
    "check_jagged_attention_args", "check_broadcast_attention_args",
    "AttngenError", "SpecError", "UnsupportedError", "InvalidArgumentError", "CompileError",
    "DriverError", "CudaError", "CacheError", "AttngenIOError", "AttngenMemoryError",
    "LibraryNotFoundError", "register_custom_ops",
]


def register_custom_ops():
    """Registers attngen's torch.library custom ops (torch.ops.attngen.*),
    which torch.compile traces. attngen does it itself when torch.compile's
    machinery (torch._dynamo) or torch.utils.flop_counter is imported, when
    a dispatch mode reaches its functions, and on the first lookup in
    torch.ops.attngen; this does it now. Idempotent."""
    torch_ops.register()


torch_ops.arm()


def library_path():
    """The path of the loaded libattngen.so (loads it)."""
    from . import _lib
    return _lib.lib()._name
