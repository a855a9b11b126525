@# SPDX-License-Identifier: BSD-3-Clause
@# store_rows.cuh: a warp's 16 result rows in the mma C layout, stored to
@# global memory pair by pair, 16-bit or fp32. Shared by the mma.sync
@# backwards that store without staging (block_bwd_chunked.cu, and through
@# jagged_bwd_tile.cuh jagged_bwd.cu and broadcast_bwd.cu); uses pack2() and
@# for_lane_rows() (mma_sm80.cuh). No placeholders or conditions.
// One pair of results: rounded to a 16-bit pair, or as two floats.
__device__ __forceinline__ void put_pair(unsigned short *at, float lo, float hi) {
  *reinterpret_cast<unsigned *>(at) = pack2(lo, hi);
}
__device__ __forceinline__ void put_pair(float *at, float lo, float hi) {
  *reinterpret_cast<float2 *>(at) = make_float2(lo, hi);
}

// Store 16 result rows of kTiles n-tiles (C layout: acc[n][e] is row row0 +
// g + 8 (e / 2), column 8n + 2tq + e % 2) times `mul`, those before `rows`,
// to `out` (row 0, rows row_stride elements apart): each lane writes its
// pairs.
template <int kTiles, class T>
__device__ __forceinline__ void store_rows(const float (&acc)[kTiles][4], float mul, int row0,
                                           int rows, T *out, long long row_stride) {
  const int tq = threadIdx.x & 3;
  for_lane_rows(row0, rows, [&](int hi, int row) {
    T *dst = out + row * row_stride + 2 * tq;
#pragma unroll
    for (int n = 0; n < kTiles; n++)
      put_pair(dst + 8 * n, acc[n][2 * hi] * mul, acc[n][2 * hi + 1] * mul);
  });
}
