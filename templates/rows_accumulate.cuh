@# SPDX-License-Identifier: BSD-3-Clause
@# rows_accumulate.cuh: acc += x b on mma.sync, x a warp's 16 rows of 16-bit
@# pairs in registers (P, dS or their transposes) and b a shared-memory tile
@# read as columns: dQ = dS K, dV = P^T dO, dK = dS^T Q. Shared by
@# block_bwd_chunked.cu and jagged_bwd_tile.cuh. Needs: kHeadDim, swizzle(),
@# ldmatrix_x4_trans(), mma_16816(). No placeholders, no conditions.
// acc += x b: x is 16 rows by the kNT * 8 rows of tile b as 16-bit pairs in
// C positions ([n][0] row g, [n][1] row g + 8, columns 8n + 2tq and + 1),
// which make the A fragment of each 16-row slice of b; b's rows are read as
// columns with ldmatrix.trans. dQ = dS K, dV = P^T dO, dK = dS^T Q.
template <int kNT>
__device__ __forceinline__ void accumulate(float (&acc)[kHeadDim / 8][4],
                                           const unsigned (&x)[kNT][2], unsigned b_s) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kNT / 2; j++) {
    const unsigned a[4] = {x[2 * j][0], x[2 * j][1], x[2 * j + 1][0], x[2 * j + 1][1]};
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; n += 2) {
      unsigned b[4];
      ldmatrix_x4_trans(b, b_s + swizzle(16 * j + (lane & 7) + (((lane >> 3) & 1) << 3),
                                         n + (lane >> 4)) * 2);
      mma_16816(acc[n], a, b[0], b[1]);
      mma_16816(acc[n + 1], a, b[2], b[3]);
    }
  }
}
