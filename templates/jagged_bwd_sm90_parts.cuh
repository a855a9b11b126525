@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_sm90_parts.cuh: the device parts the sm_90a backwards that
@# every thread copies for (jagged_bwd_sm90.cu, broadcast_bwd_sm90.cu) are
@# made of, in order: the 16-bit pairs and cp.async (mma_sm80.cuh,
@# copy_rows.cuh, unpack2.cuh), wgmma and its descriptors
@# (wgmma_sm90.cuh), stmatrix (bulk_sm90.cuh), mbarriers and named barriers (pipeline_sm90.cuh), the
@# jagged tiles, bands and softmax gradients (jagged_bwd_tile.cuh) and the
@# key-stationary products and stores (jagged_bwd_wgmma.cuh).
@# Needs what those need: the includer's constants.
@include mma_sm80.cuh@

@include copy_rows.cuh@

@include unpack2.cuh@

@include wgmma_sm90.cuh@

@include bulk_sm90.cuh@

@include pipeline_sm90.cuh@

@include jagged_bwd_tile.cuh@

@include jagged_bwd_wgmma.cuh@
