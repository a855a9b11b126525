@# SPDX-License-Identifier: BSD-3-Clause
@# rotary_load.cuh: the rotary table's rows of a tile, loaded with the tile
@# (positions from a table only). Included at the end of the tile load of
@# block_fwd.cu and block_bwd.cu; uses the including kernel's kBlock, kHeadDim,
@# kHeadChunks, kThreads, kStageElems, kTableElems, smem_addr(),
@# cp_async_16() and Tile, and with TABLE_SLOT kStages and smem. No
@# placeholders. Conditions: TABLE_SLOT (the forward's one slot after its
@# stages; else the rows end each stage).
/* The rotary table is [tokens, kHeadDim]: sin a(t, i) in column i, cos a(t, i)
 * in column kHeadDim / 2 + i, for pair i of every head of token t. The rows
 * of a block's tokens serve every head of its group and sit where
 * table_rows(stage) says, kTableElems elements, with their 16-byte chunks
 * swizzled by the row as the tensors' are: the backward reads one column of
 * 8 rows at a time, which then hits 8 different bank groups. Rows past the
 * sequence end are zero-filled (sin = cos = 0), never read from memory. */
__device__ __forceinline__ int table_at(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) * 8);
}

@if TABLE_SLOT@
// The rotary table rows of the tile about to be rotated: one slot after the
// stages, whichever stage holds the tile (the next tile's rows are loaded
// into it once this one is rotated).
__device__ __forceinline__ unsigned short *table_rows(unsigned short *) {
  return smem + kStages * kStageElems;
}
@else@
// A stage's rotary table rows: at its end.
__device__ __forceinline__ unsigned short *table_rows(unsigned short *stage) {
  return stage + kStageElems - kTableElems;
}
@endif@

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
