@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_sm90_consts.cuh: the constants both sm_90a jagged backwards
@# (jagged_bwd_sm90.cu, jagged_bwd_ws.cu) take from the spec (the tile,
@# the head dim, the band: jagged_bwd_band.cuh) and derive from their tile:
@# its 64-column matrices and byte sizes.
@# Placeholders: @HEAD_DIM@ @BLOCK_M@ @BLOCK_N@, and jagged_bwd_band.cuh's
@# (included). No conditions.
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kBlockM = @BLOCK_M@;  // query rows of a step
constexpr int kBlockN = @BLOCK_N@;  // key rows of a CTA
@include jagged_bwd_band.cuh@
constexpr bool kBroadcast = false;  // jagged_bwd_tile.cuh's spans: one Q row per output row
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
// Every operand is made of 64-column matrices of 128-byte rows in the
// 128-byte swizzle (wgmma_sm90.cuh): a tile of R rows is kHalves such
// R-row matrices, one per 64 columns of the head.
constexpr int kHalves = kHeadDim / 64;
constexpr int kRowBytes = 128;
constexpr int kKBytes = kBlockN * kHeadDim * 2;  // K (or V) of the CTA's keys
constexpr int kQBytes = kBlockM * kHeadDim * 2;  // Q (or dO) of a step
constexpr int kDsBytes = kBlockN * kBlockM * 2;  // dS^T of a step: [key][query]
constexpr int kStepOverRows = 16 * kRowBytes;  // a k16 step over 16 rows (MN-major)
