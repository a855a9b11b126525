@# SPDX-License-Identifier: BSD-3-Clause
@# load_rows_sm90.cuh: the copying threads of a CTA (its first
@# kCopyThreads) copy rows of one head into 64-column matrices of 128-byte
@# rows in the 128-byte swizzle, the layout wgmma reads (wgmma_sm90.cuh):
@# jagged_bwd_sm90.cu's and broadcast_bwd_sm90.cu's loads
@# (jagged_bwd_ws.cu's loading warpgroup has its own). Needs:
@# kCopyThreads, kPieces, kRowBytes, cp_async_16(). No placeholders, no
@# conditions.
// Start the copy of kRows rows of one head (`src` is row 0, this head)
// into the matrices at `dst` (shared address), the first `rows` real and
// the rest zero-filled; the caller commits. Piece c (16 bytes) of row r
// sits in matrix c / 8 at chunk (c % 8) ^ (r % 8) of the row.
template <int kRows>
__device__ __forceinline__ void load_rows(unsigned dst, const unsigned short *src,
                                          long long row_stride, int rows) {
  constexpr int kRowStep = kCopyThreads / kPieces;  // rows one pass of the copying threads covers
  static_assert(kCopyThreads % kPieces == 0 && kRows % kRowStep == 0, "passes cover whole rows");
  const int row0 = threadIdx.x / kPieces, c = threadIdx.x % kPieces;
  const unsigned base = dst + (c >> 3) * (kRows * kRowBytes);
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; i++) {
    const int row = row0 + i * kRowStep;
    const bool real = row < rows;
    cp_async_16(base + row * kRowBytes + (((c & 7) ^ (row & 7)) << 4),
                real ? src + row * row_stride + c * 8 : src, real ? 16 : 0);
  }
}
