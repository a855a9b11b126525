@# SPDX-License-Identifier: BSD-3-Clause
@# load_rows_sm90.cuh: the copying threads of a CTA (its first
@# kCopyThreads) copy rows of one head into 64-column matrices of 128-byte
@# rows in the 128-byte swizzle, the layout wgmma reads (wgmma_sm90.cuh):
@# jagged_bwd_sm90.cu's and broadcast_bwd_sm90.cu's loads
@# (jagged_bwd_ws.cu's loading warpgroup has its own). Needs:
@# kCopyThreads, kPieces, kRowBytes, copy_rows() (copy_rows.cuh). No
@# placeholders, no conditions.
// Start the copy of kRows rows of one head (`src` is row 0, this head)
// into the matrices at `dst` (shared address), the first `rows` real and
// the rest zero-filled; the caller commits. Piece c (16 bytes) of row r
// sits in matrix c / 8 at chunk (c % 8) ^ (r % 8) of the row.
template <int kRows>
__device__ __forceinline__ void load_rows(unsigned dst, const unsigned short *src,
                                          long long row_stride, int rows) {
  copy_rows<kRows, kPieces, kCopyThreads>(
      dst, src, row_stride, rows, [](int row, int c) {
        return (c >> 3) * (kRows * kRowBytes) + row * kRowBytes + (((c & 7) ^ (row & 7)) << 4);
      });
}
