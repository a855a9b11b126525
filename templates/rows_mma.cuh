@# SPDX-License-Identifier: BSD-3-Clause
@# rows_mma.cuh: 16 rows of one shared-memory tile times every row of
@# another, transposed, on mma.sync: S = Q K^T and dP = dO V^T, or with keys
@# as rows S^T and dP^T. Shared by block_fwd.cu, block_bwd.cu,
@# block_bwd_chunked.cu and jagged_bwd_tile.cuh (the jagged and broadcast
@# mma.sync backwards).
@# Needs: kHeadDim, swizzle(), ldmatrix_x4(), mma_16816(); the n-tiles of b
@# (keys in S, queries in S^T) are the template parameter kNT. No
@# placeholders, no conditions.
// c[i][j] = sum_d a[row0 + i][d] * b[j][d] for the 16 rows row0.. of tile a
// and the kNT * 8 rows j of tile b (head columns from chunk c0), as kNT 16x8
// accumulator tiles: S = Q K^T and dP = dO V^T, or S^T = K Q^T and
// dP^T = V dO^T. The loop over the head's 16-column steps is unrolled
// kUnroll times (the backwards keep it rolled: their registers are few; the
// block forward unrolls it whole).
template <int kNT, int kUnroll = 1>
__device__ __forceinline__ void rows_times_rows(float (&c)[kNT][4], unsigned a_s, unsigned b_s,
                                                int c0, int row0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < kNT; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll (kUnroll)
  for (int kk = 0; kk < kHeadDim / 16; kk++) {
    // A: lanes 0-15 address rows row0..row0+15 at dims 16kk.., lanes 16-31
    // the same rows at dims 16kk+8.. (matrices a0..a3).
    unsigned a[4];
    ldmatrix_x4(a, a_s + swizzle(row0 + (lane & 15), c0 + 2 * kk + (lane >> 4)) * 2);
#pragma unroll
    for (int n = 0; n < kNT; n += 2) {
      // B (k = dim, n = row of b) is b's rows read as columns: matrices 0, 1
      // are rows 8n..8n+7 at dims 16kk.. and 16kk+8.. (b0, b1 of n-tile n),
      // matrices 2, 3 the next 8 rows (n-tile n+1).
      unsigned b[4];
      ldmatrix_x4(b, b_s + swizzle(n * 8 + (lane & 7) + ((lane >> 4) << 3),
                                   c0 + 2 * kk + ((lane >> 3) & 1)) * 2);
      mma_16816(c[n], a, b[0], b[1]);
      mma_16816(c[n + 1], a, b[2], b[3]);
    }
  }
}
