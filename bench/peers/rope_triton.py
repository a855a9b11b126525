# SPDX-License-Identifier: BSD-3-Clause
"""A bandwidth-bound rotary pass in Triton, the fair unfused peer of a fused
rotary: x [T, H, D] rotated by the angles of per-token cos/sin tables
[T, D/2] (fp32, or 16-bit views into a sin | cos table [T, D] with its row
stride), in fp32, rounded back once; the half layout pairs (i, i + D/2),
the interleaved one (2i, 2i + 1). One read and one write of x, the tables
read once per head (from L2). Differentiable: the backward is the inverse
rotation of the gradient (sin negated). What a user would write in twenty
lines; how near its own stream ceiling it runs is measured by the caller
(bytes moved over time).

Imports torch and triton only when called (the bench's CPU tests import
this module without them; with TRITON_INTERPRET=1 they run it on CPU
tensors)."""

_kernel = None
BLOCK_ROWS = 16  # (token, head) rows per program


def kernel():
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit
    def rope(x_ptr, y_ptr, cos_ptr, sin_ptr, tab_stride, n_rows, heads, sign,
             D: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_R: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)  # (token, head) rows
        live = rows < n_rows
        tok = rows // heads
        pair = tl.arange(0, D // 2)
        base = rows[:, None].to(tl.int64) * D
        ang = tok[:, None].to(tl.int64) * tab_stride + pair[None, :]
        m = live[:, None]
        c = tl.load(cos_ptr + ang, mask=m, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + ang, mask=m, other=0.0).to(tl.float32) * sign
        if INTERLEAVED:
            # Whole rows in one contiguous load and store, the pairs split
            # and joined in registers: loads of every other element ran at
            # 0.56 TB/s on the H200 (bench/rotary_parts.py), the half
            # layout's two contiguous halves at 4.27.
            at = base + tl.arange(0, D)[None, :]
            x = tl.load(x_ptr + at, mask=m, other=0.0).to(tl.float32)
            x1, x2 = tl.split(tl.reshape(x, (BLOCK_R, D // 2, 2)))
            y = tl.interleave(x1 * c - x2 * s, x1 * s + x2 * c)
            tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=m)
        else:
            at1 = base + pair[None, :]
            at2 = at1 + D // 2
            x1 = tl.load(x_ptr + at1, mask=m, other=0.0).to(tl.float32)
            x2 = tl.load(x_ptr + at2, mask=m, other=0.0).to(tl.float32)
            tl.store(y_ptr + at1, (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=m)
            tl.store(y_ptr + at2, (x1 * s + x2 * c).to(y_ptr.dtype.element_ty), mask=m)

    _kernel = rope
    return _kernel


def rotate(x, cos, sin, inverse=False, layout="half"):
    """x [T, H, D] (contiguous, 16-bit) rotated by cos, sin [T, D/2] (fp32
    or 16-bit; rows may be strided, columns contiguous: e.g. the two halves
    of a sin | cos table [T, D]), pairs as `layout` ("half" or
    "interleaved"); inverse: by the negated angles."""
    import torch
    import triton
    t, h, d = x.shape
    assert cos.stride() == sin.stride() and cos.stride(-1) == 1, "tables: contiguous columns"
    y = torch.empty_like(x)
    rows = t * h
    if rows:
        grid = (triton.cdiv(rows, BLOCK_ROWS),)
        kernel()[grid](x, y, cos, sin, cos.stride(0), rows, h, -1.0 if inverse else 1.0, D=d,
                       INTERLEAVED=layout == "interleaved", BLOCK_R=BLOCK_ROWS)
    return y


_function = None


def function():
    """An autograd.Function: apply(x, cos, sin[, layout]) (layout "half" by
    default, or "interleaved")."""
    global _function
    if _function is not None:
        return _function
    import torch

    class Rope(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin, layout="half"):
            ctx.save_for_backward(cos, sin)
            ctx.layout = layout
            return rotate(x.contiguous(), cos, sin, layout=layout)

        @staticmethod
        def backward(ctx, dy):
            cos, sin = ctx.saved_tensors
            return (rotate(dy.contiguous(), cos, sin, inverse=True, layout=ctx.layout), None, None,
                    None)

    _function = Rope
    return _function


def bytes_moved(x, cos):
    """Bytes one rotation of x reads and writes (x twice, the tables once per
    head read from memory at least once)."""
    return 2 * x.numel() * x.element_size() + 2 * cos.numel() * cos.element_size()
