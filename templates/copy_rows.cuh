@# SPDX-License-Identifier: BSD-3-Clause
@# copy_rows.cuh: the 16-byte cp.async copy of a tile's rows into shared
@# memory, zero-filling rows past the real ones, with the layout a
@# function of (row, piece): the row loads of the jagged and broadcast
@# kernels (jagged_fwd.cu and jagged_bwd_tile.cuh: rows with swizzled
@# pieces; jagged_fwd_wgmma.cuh and load_rows_sm90.cuh: wgmma's 128-byte
@# swizzle). Needs cp_async_16() (mma_sm80.cuh). No placeholders, no
@# conditions.
/* ---- begin row copies ---- */
// Start the copy of kRows rows of kPieceCount 16-byte pieces each from src
// (row 0; rows `stride` elements apart) by the first kCopiers threads:
// piece c of row r goes to shared address dst + at(r, c); rows from
// `valid` on are zero-filled, never read. Each thread keeps one piece
// column and steps down the rows. The caller commits.
template <int kRows, int kPieceCount, int kCopiers, class At>
__device__ __forceinline__ void copy_rows(unsigned dst, const unsigned short *src,
                                          long long stride, int valid, At at) {
  constexpr int kRowStep = kCopiers / kPieceCount;  // rows one pass of the copiers covers
  static_assert(kCopiers % kPieceCount == 0 && kRows % kRowStep == 0, "passes cover whole rows");
  const int row0 = threadIdx.x / kPieceCount, c = threadIdx.x % kPieceCount;
  const unsigned short *g = src + row0 * stride + c * 8;
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; i++) {
    const int row = row0 + i * kRowStep;
    const bool real = row < valid;
    cp_async_16(dst + at(row, c), real ? g : src, real ? 16 : 0);
    g += kRowStep * stride;
  }
}
/* ---- end row copies ---- */
