@# SPDX-License-Identifier: BSD-3-Clause
@# tile_load.cuh: the swizzled shared-memory tile layout, the 16-byte
@# async load of one [rows, head group] tensor tile and of a tile's inputs
@# (load_tiles), and the product with a tile's rows read transposed
@# (times_tile_rows), shared by the block forward and backward kernels.
@# Needs: kRowElems, kChunks, kHeadChunks, kHeadDim,
@# kThreads, kBlock, kDimTiles, kTileElems, Tile, smem_addr(), cp_async_16(),
@# ldmatrix_x4_trans(), mma_16816().
@# Conditions: SPLIT_ROWS (rows longer than 64 elements are stored as
@#   64-column halves, so that wgmma's 128-byte swizzle describes them);
@#   ROW_STRIDES (a tensor may have fewer heads than the tile: grouped K, V).
/* ---- begin tile load ----
@if SPLIT_ROWS@
 * Tiles are stored as 64-column halves, one after the other, each
 * row-major in rows of 128 bytes with 16-byte chunks XOR-swizzled by the
 * row (chunk c of a half's row r sits at c ^ (r % 8)): the 8 row addresses
 * of an ldmatrix hit 8 different bank groups, and each half is an operand
 * in wgmma's 128-byte swizzle. Rows past the sequence end, and heads past
 * the last, are zero-filled, never read from memory. */
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return (chunk / 8) * kBlock * 64 + row * 64 + ((chunk % 8) ^ (row & 7)) * 8;
}
@else@
 * Tiles are row-major with 16-byte chunks XOR-swizzled by the row (chunk c
 * of row r sits at c ^ (r % 8)), so the 8 row addresses of an ldmatrix hit 8
 * different bank groups. Rows past the sequence end, and heads past the
 * last, are zero-filled, never read from memory. */
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kRowElems + ((chunk ^ (row & 7)) * 8);
}
@endif@

// Start the copy of one tensor's tile (rows of the block, heads of the
// group) into `tile`; completion is awaited with the commit group. Each
// thread keeps one chunk column and steps down the rows, so its global
// address is worked out once and each further row is a constant step; the
// swizzle is written per row (where the step is a multiple of 8 rows it is
// the same for all, and the compiler folds it).
@if ROW_STRIDES@
// Head j of the tile is head (t.head0 + j) / group of src: group 1 for Q,
// O and the gradients; for K and V with grouped-query heads, the query
// heads a key head serves (adjacent ones share its rows).
__device__ __forceinline__ void load_tensor(unsigned short *tile, const unsigned short *src,
                                            long long row_stride, const Tile &t, int group) {
  constexpr int kRowStep = kThreads / kChunks;  // rows one pass of the CTA covers
  static_assert(kThreads % kChunks == 0, "a pass of the CTA covers whole rows");
  const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const bool head_real = chunk < t.heads * kHeadChunks;
  // src's head; a head past the last is zero-filled from an address that
  // stays inside src (the group's first head's)
  const int head = (head_real ? t.head0 + chunk / kHeadChunks : t.head0) / group;
  const unsigned short *base = src + t.token0 * row_stride + (long long)head * kHeadDim +
                               (chunk % kHeadChunks) * 8;
  const unsigned dst = smem_addr(tile);
  const unsigned short *g = base + row0 * row_stride;
@else@
__device__ __forceinline__ void load_tensor(unsigned short *tile, const unsigned short *src,
                                            long long row_stride, const Tile &t) {
  constexpr int kRowStep = kThreads / kChunks;  // rows one pass of the CTA covers
  static_assert(kThreads % kChunks == 0, "a pass of the CTA covers whole rows");
  const unsigned short *base = src + t.token0 * row_stride + (long long)t.head0 * kHeadDim;
  const unsigned dst = smem_addr(tile);
  const int row0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const bool head_real = chunk < t.heads * kHeadChunks;
  const unsigned short *g = base + row0 * row_stride + chunk * 8;
@endif@
#pragma unroll
  for (int k = 0; k < (kBlock + kRowStep - 1) / kRowStep; k++) {
    const int row = row0 + k * kRowStep;
    if (kBlock % kRowStep != 0 && row >= kBlock) break;
    const bool real = head_real && row < t.rows;
    cp_async_16(dst + swizzle(row, chunk) * 2, real ? g : base, real ? 16 : 0);
    g += kRowStep * row_stride;
  }
}

@if ROW_STRIDES@
// Where a tile's inputs' rows are: each tensor's row stride (elements), and
// the query heads each key head serves (tensors 1 and 2, K and V, have
// heads / kv_group).
template <int kTensors>
struct InputRows {
  long long stride[kTensors];
  int kv_group;
};

// Tensors src[0..] of one tile, in that order, into the stage's tiles.
template <int kTensors>
__device__ __forceinline__ void load_tiles(unsigned short *stage,
                                           const unsigned short *const (&src)[kTensors],
                                           const InputRows<kTensors> &row_stride, const Tile &t) {
#pragma unroll
  for (int m = 0; m < kTensors; m++)
    load_tensor(stage + m * kTileElems, src[m], row_stride.stride[m], t,
                m == 1 || m == 2 ? row_stride.kv_group : 1);
}
@else@
// Tensors src[0..] of one tile, in that order, into the stage's tiles.
template <int kTensors>
__device__ __forceinline__ void load_tiles(unsigned short *stage,
                                           const unsigned short *const (&src)[kTensors],
                                           long long row_stride, const Tile &t) {
#pragma unroll
  for (int m = 0; m < kTensors; m++) load_tensor(stage + m * kTileElems, src[m], row_stride, t);
}
@endif@

// acc += a b, b the 16 tile rows r0.. at b_s (shared address; head columns
// from chunk c0), k over those rows: read with ldmatrix.trans, as V in the
// forward's O = P V.
__device__ __forceinline__ void times_tile_rows(float (&acc)[kDimTiles][4], const unsigned (&a)[4],
                                                unsigned b_s, int r0, int c0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < kDimTiles; n += 2) {
    unsigned b[4];
    ldmatrix_x4_trans(b, b_s + swizzle(r0 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                       c0 + n + (lane >> 4)) * 2);
    mma_16816(acc[n], a, b[0], b[1]);
    mma_16816(acc[n + 1], a, b[2], b[3]);
  }
}
