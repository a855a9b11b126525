@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_fwd_sm90_parts.cuh: the device parts both sm_90a jagged forwards
@# (jagged_fwd_sm90.cu, jagged_fwd_ws.cu) are made of, in order: the 16-bit
@# pairs and cp.async (mma_sm80.cuh, copy_rows.cuh), wgmma and its descriptors
@# (wgmma_sm90.cuh), the walk (jagged_walk.cuh), a query tile's span
@# (jagged_fwd_span.cuh) and the tile's loads, products and softmax steps
@# (jagged_fwd_wgmma.cuh).
@# Needs what those need: the includer's constants (jagged_fwd_sm90_consts.cuh).
@include mma_sm80.cuh@

@include copy_rows.cuh@

@include wgmma_sm90.cuh@

@include jagged_walk.cuh@

@include jagged_fwd_span.cuh@

@include jagged_fwd_wgmma.cuh@
