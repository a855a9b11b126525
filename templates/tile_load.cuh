@# tile_load.cuh: the swizzled shared-memory tile layout and the 16-byte
@# async load of one [rows, head group] tensor tile, shared by the forward
@# and backward kernels. Needs: kRowElems, kChunks, kHeadChunks, kHeadDim,
@# kLoads, kThreads, Tile, smem_addr(), cp_async_16().
/* ---- begin tile load ----
 * Tiles are row-major with 16-byte chunks XOR-swizzled by the row (chunk c
 * of row r sits at c ^ (r % 8)), so the 8 row addresses of an ldmatrix hit 8
 * different bank groups. Rows past the sequence end, and heads past the
 * last, are zero-filled, never read from memory. */
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kRowElems + ((chunk ^ (row & 7)) * 8);
}

// Start the copy of one tensor's tile (rows of the block, heads of the
// group) into `tile`; completion is awaited with the commit group.
__device__ __forceinline__ void load_tensor(unsigned short *tile, const unsigned short *src,
                                            long long row_stride, const Tile &t) {
  const unsigned short *base = src + t.token0 * row_stride + (long long)t.head0 * kHeadDim;
  unsigned dst = smem_addr(tile);
#pragma unroll
  for (int it = 0; it < (kLoads + kThreads - 1) / kThreads; it++) {
    int i = threadIdx.x + it * kThreads;
    if (kLoads % kThreads != 0 && i >= kLoads) break;
    int row = i / kChunks, chunk = i % kChunks;
    bool real = row < t.rows && chunk < t.heads * kHeadChunks;
    const unsigned short *g = base + (real ? row * row_stride + chunk * 8 : 0);
    cp_async_16(dst + swizzle(row, chunk) * 2, g, real ? 16 : 0);
  }
}
