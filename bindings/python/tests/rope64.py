# SPDX-License-Identifier: BSD-3-Clause
"""The GPU tests' rotary references (test_gpu_jagged.py, test_gpu_broadcast.py):
rows rotated by a table of angles in float64, and a caller's random table.
Needs torch (the calling module imports it first, or skips)."""
import math

import torch


def rotate64(x, table, layout):
    """x [total, H, D] rotated by the angles of table [total, D] (sin in the
    first D/2 columns, cos in the rest): pairs (2i, 2i+1) when interleaved,
    (i, i + D/2) when half."""
    h = x.shape[-1] // 2
    sin, cos = table[:, None, :h], table[:, None, h:]
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def random_table(rows, dim, dtype, seed):
    """A caller's table of random angles [rows, dim] (sin | cos) on the GPU."""
    g = torch.Generator().manual_seed(seed)
    angles = (torch.rand(rows, dim // 2, generator=g, dtype=torch.float64) - 0.5) * 2 * math.pi
    return torch.cat((angles.sin(), angles.cos()), dim=-1).to(dtype).cuda()
