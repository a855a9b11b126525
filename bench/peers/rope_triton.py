# SPDX-License-Identifier: BSD-3-Clause
"""A bandwidth-bound rotary pass in Triton, the fair unfused peer of a fused
rotary: x [T, H, D] rotated in the half layout (pairs i, i + D/2) by the
angles of per-token cos/sin tables [T, D/2] fp32, in fp32, rounded back
once; one read and one write of x, the tables read once per head (from
L2). Differentiable: the backward is the inverse rotation of the gradient
(sin negated). What a user would write in twenty lines; how near its own
stream ceiling it runs is measured by the caller (bytes moved over time).

Imports torch and triton only when called (the bench's CPU tests import
this module without them)."""

_kernel = None
BLOCK_ROWS = 16  # (token, head) rows per program


def kernel():
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit
    def rope_half(x_ptr, y_ptr, cos_ptr, sin_ptr, n_rows, heads, sign,
                  D: tl.constexpr, BLOCK_R: tl.constexpr):
        pid = tl.program_id(0)
        rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)  # (token, head) rows
        live = rows < n_rows
        tok = rows // heads
        half = tl.arange(0, D // 2)
        at = rows[:, None].to(tl.int64) * D + half[None, :]
        ang = tok[:, None].to(tl.int64) * (D // 2) + half[None, :]
        m = live[:, None]
        x1 = tl.load(x_ptr + at, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + at + D // 2, mask=m, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + ang, mask=m, other=0.0)
        s = tl.load(sin_ptr + ang, mask=m, other=0.0) * sign
        tl.store(y_ptr + at, (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=m)
        tl.store(y_ptr + at + D // 2, (x1 * s + x2 * c).to(y_ptr.dtype.element_ty), mask=m)

    _kernel = rope_half
    return _kernel


def rotate(x, cos, sin, inverse=False):
    """x [T, H, D] (contiguous, 16-bit) rotated by cos, sin [T, D/2] (fp32,
    contiguous); inverse: by the negated angles."""
    import torch
    import triton
    t, h, d = x.shape
    y = torch.empty_like(x)
    rows = t * h
    if rows:
        grid = (triton.cdiv(rows, BLOCK_ROWS),)
        kernel()[grid](x, y, cos, sin, rows, h, -1.0 if inverse else 1.0, D=d,
                       BLOCK_R=BLOCK_ROWS)
    return y


_function = None


def function():
    """An autograd.Function: apply(x, cos, sin)."""
    global _function
    if _function is not None:
        return _function
    import torch

    class RopeHalf(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin):
            ctx.save_for_backward(cos, sin)
            return rotate(x.contiguous(), cos, sin)

        @staticmethod
        def backward(ctx, dy):
            cos, sin = ctx.saved_tensors
            return rotate(dy.contiguous(), cos, sin, inverse=True), None, None

    _function = RopeHalf
    return _function


def bytes_moved(x, cos):
    """Bytes one rotation of x reads and writes (x twice, the tables once per
    head read from memory at least once)."""
    return 2 * x.numel() * x.element_size() + 2 * cos.numel() * cos.element_size()
