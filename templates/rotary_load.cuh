@# SPDX-License-Identifier: BSD-3-Clause
@# rotary_load.cuh: the rotary table's rows of a tile, loaded with the tile
@# (positions from a table only). Included at the end of the tile load of
@# block_fwd.cu and block_bwd.cu; uses the including kernel's kBlock, kHeadDim,
@# kHeadChunks, kThreads, table_rows() (where a stage's table rows are),
@# smem_addr(), cp_async_16() and Tile. No placeholders or conditions.
/* The rotary table is [tokens, kHeadDim]: sin a(t, i) in column i, cos a(t, i)
 * in column kHeadDim / 2 + i, for pair i of every head of token t. The rows
 * of a block's tokens serve every head of its group and sit where the
 * kernel's table_rows(stage) says, kTableElems elements, with their 16-byte
 * chunks swizzled by the row as the tensors' are: the backward reads one
 * column of 8 rows at a time, which then hits 8 different bank groups. Rows past the sequence end are
 * zero-filled (sin = cos = 0), never read from memory. */
__device__ __forceinline__ int table_at(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) * 8);
}

__device__ __forceinline__ void load_table(unsigned short *stage,
                                           const unsigned short *rotary_table, const Tile &t) {
  constexpr int kTableLoads = kBlock * kHeadChunks; // 16-byte copies of a block's rows
  const unsigned short *base = rotary_table + t.token0 * kHeadDim;
  const unsigned dst = smem_addr(table_rows(stage));
#pragma unroll
  for (int it = 0; it < (kTableLoads + kThreads - 1) / kThreads; it++) {
    int i = threadIdx.x + it * kThreads;
    if (kTableLoads % kThreads != 0 && i >= kTableLoads) break;
    int row = i / kHeadChunks, chunk = i % kHeadChunks;
    bool real = row < t.rows;
    const unsigned short *g = base + (real ? row * kHeadDim + chunk * 8 : 0);
    cp_async_16(dst + table_at(row, chunk) * 2, g, real ? 16 : 0);
  }
}
