@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_fwd_sm90_consts.cuh: the constants both sm_90a jagged forwards
@# (jagged_fwd_sm90.cu, jagged_fwd_ws.cu) take from the spec (the band,
@# jagged_fwd_band.cuh) and derive from their tile: its 16-byte chunks,
@# 64-column matrices and byte sizes.
@# Needs the includer's kHeadDim, kBlockM, kBlockN (each includer checks
@#   its kSmemBytes against its Q tiles and K/V stages).
@# Includes: jagged_fwd_band.cuh (its placeholders). No conditions. Stops
@# a compilation for any arch but sm_90a.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "this forward is planned for sm_90a only (wgmma)"
#endif
@include jagged_fwd_band.cuh@
constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
constexpr int kHalves = kHeadDim / 64;  // 64-column matrices of a tile
constexpr int kKeyHalves = kBlockN / 64;  // 64-key parts of S
constexpr int kRowBytes = 128;  // a matrix row: 64 elements
constexpr int kQBytes = kBlockM * kHeadDim * 2;  // the Q tile (and the O staging)
constexpr int kKvBytes = kBlockN * kHeadDim * 2;  // one K or V tile
constexpr int kStepOverRows = 16 * kRowBytes;  // a k16 step over 16 rows (MN-major)
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
