@# SPDX-License-Identifier: BSD-3-Clause
@# rotary.cuh: rotary position embeddings (RoPE) fused into the block-diagonal
@# kernels: a tile's Q, K (and V) rotated in place in shared memory once it
@# has landed and, in the backward, the gradients rotated back in registers
@# before they are stored. Included by block_fwd.cu after its tile load, by
@# block_bwd.cu after its phase 1 and by block_bwd_chunked.cu after its
@# stores (both backwards define unpack2 before); uses the including
@# kernel's kHeadDim, kHeadChunks, kThreads, kDimTiles (backward), swizzle(),
@# Tile and pack2(), and with positions from a table staged with the tiles
@# table_at() (rotary_load.cuh; rotary.cuh defines it for TABLE_IN_GLOBAL); the
@# whole-block kernels' kHeadsPerTile, kTileElems, kStageElems,
@# kTableElems and table_rows() (where rotate_tile finds a stage's table
@# rows) too.
@# The angles of computed positions and the rotation of one unit come from
@# rotary_core.cuh, included here.
@# Placeholders: @MMA_TYPE@ (see mma_sm80.cuh); with computed positions
@#   @ROTARY_BASE@ (the base, a float literal) and @ROTARY_TURNS@ (the
@#   kHeadDim / 2 float literals of kRotaryTurns, comma-separated, wrapped).
@# Conditions: ROTARY_HALF (the half layout, else interleaved); ROTARY_TABLE or
@#   ROTARY_COMPUTED (positions from a table, or computed: with
@#   ROTARY_SEQUENCE from the sequence's first token, else from the block's);
@#   ROTATE_Q, ROTATE_K, ROTATE_V (the tensors rotated); ROTARY_UNPACK
@#   (define unpack2: the forward has none); ROTARY_GRADS (the backward's
@#   inverse rotation of gradients); ROTARY_CHUNKS (the chunked backward:
@#   no stages and no rotate_tile, the kernel rotates each chunk as it lands;
@#   table rows are read in global memory, from Tile::table); ROTARY_STAGES
@#   (its opposite: the whole-block kernels, with rotate_tile);
@#   TABLE_IN_GLOBAL (table rows read in global memory, from Tile::table: the
@#   chunked backward's, and the whole-block backward's (bwd_table_global)).
/* ---- begin rotary embeddings ----
 * Pair i (0 <= i < kHeadDim / 2) of every head of token t is rotated by the
 * angle a(t, i):
 *   (x0, x1) -> (x0 cos a - x1 sin a, x0 sin a + x1 cos a),
 * in fp32 from the 16-bit values, rounded back once.
@if ROTARY_HALF@
 * Pairs are (x[i], x[i + kHeadDim / 2]) (the half layout): the two halves of
@if ROTARY_CHUNKS@
 * a head are kHeadChunks / 2 chunks apart in a row, but swizzle() places
 * every chunk by its own index and the row (see the chunk load), so a chunk
@else@
 * a head are kHeadChunks / 2 chunks apart in a tile row, but swizzle() places
 * every chunk by its own index and the row (see the tile load), so a chunk
@endif@
 * and its partner are each looked up, never found at a fixed distance. A
 * unit of work is chunk cc < kHeadChunks / 2 of a head in one row with its
 * partner cc + kHeadChunks / 2: element e of the one and element e of the
 * other are pair 8 cc + e.
@else@
 * Pairs are (x[2i], x[2i + 1]) (the interleaved layout): a pair is one
 * 32-bit word of a 16-byte chunk, which the swizzle moves whole, so a unit of
 * work is chunk cc of a head in one row: its word j is pair 4 cc + j.
@endif@
@if ROTARY_TABLE@
@if TABLE_IN_GLOBAL@
 * sin a and cos a are the caller's, read from the block's rows of the table
 * in global memory (Tile::table), where they are: beside the kernel's tiles
 * they would cost a CTA per SM at head_dim 128.
@else@
 * sin a and cos a are the caller's, from the table rows loaded with the tile
 * (see the tile load).
@endif@
@else@
@if ROTARY_SEQUENCE@
 * a(t, i) = p base^(-2i / kHeadDim), p the token's index in its sequence,
@else@
 * a(t, i) = p base^(-2i / kHeadDim), p the token's index in its block,
@endif@
 * in fp32: p times kRotaryTurns[i], the angle per position in turns, is
 * rounded once (as a framework's fp32 p * inv_freq is), its whole turns
 * drop exactly, and sin.approx and cos.approx of the rest (|angle| <= pi)
 * are within about 2^-21 of the sine and cosine.
@endif@
 * Rows past the sequence end are not rotated (they are zero and stay so).
 */
@if ROTARY_UNPACK@
@include unpack2.cuh@

@endif@
@include rotary_core.cuh@
@if ROTARY_TABLE@
@if TABLE_IN_GLOBAL@

// Element of the rotary table at block row `row`, 16-byte chunk `chunk`,
// from the block's rows (Tile::table): read in global memory, row-major
// [tokens, kHeadDim], unswizzled.
__device__ __forceinline__ int table_at(int row, int chunk) {
  return row * kHeadDim + chunk * 8;
}
@endif@
@endif@

constexpr int kUnitRows = kThreads / kUnitsPerRow;  // rows rotated at a time by the CTA
static_assert(kThreads % kUnitsPerRow == 0, "every thread keeps one unit column");
@if ROTARY_COMPUTED@
// The position p of block row `row`.
__device__ __forceinline__ int rotary_position(const Tile &t, int row) {
@if ROTARY_SEQUENCE@
  return t.pos0 + row;
@else@
  return row;
@endif@
}

@endif@
@if ROTARY_TABLE@
@if TABLE_IN_GLOBAL@
// sin and cos of unit cc's pairs for block row `row`, from the block's table
// rows `table` (table_at(): in global memory, unswizzled).
@else@
// sin and cos of unit cc's pairs for tile row `row`, from the stage's table
// rows (read as the tensors' chunks are: table_at() swizzles them alike).
@endif@
__device__ __forceinline__ void unit_angles(const unsigned short *table, int row, int cc,
                                            float (&s)[kUnitPairs], float (&c)[kUnitPairs]) {
@if ROTARY_HALF@
  // Pairs 8cc .. 8cc + 7: sin is chunk cc of the row, cos chunk cc + kHeadChunks / 2.
  const uint4 sw = *reinterpret_cast<const uint4 *>(table + table_at(row, cc));
  const uint4 cw = *reinterpret_cast<const uint4 *>(table + table_at(row, cc + kHeadChunks / 2));
  unpack(sw.x, sw.y, sw.z, sw.w, s);
  unpack(cw.x, cw.y, cw.z, cw.w, c);
@else@
  // Pairs 4cc .. 4cc + 3: sin is half cc % 2 of chunk cc / 2 of the row, cos
  // the same half kHeadChunks / 2 chunks on.
  const int half = 4 * (cc & 1);
  const uint2 sw = *reinterpret_cast<const uint2 *>(table + table_at(row, cc >> 1) + half);
  const uint2 cw =
      *reinterpret_cast<const uint2 *>(table + table_at(row, (cc >> 1) + kHeadChunks / 2) + half);
  unpack(sw.x, sw.y, s);
  unpack(cw.x, cw.y, c);
@endif@
}

@endif@
@if ROTARY_STAGES@
// Rotate the resident tile's rotated tensors in place. Every thread keeps
// unit column cc = threadIdx.x % kUnitsPerRow, so the same pairs (and, for
// computed positions, frequencies) in every row it takes, every kUnitRows-th
// row; one unit's angles serve every head of the group and every tensor.
// The caller waits for the tile before and synchronizes the CTA after.
__device__ __forceinline__ void rotate_tile(unsigned short *stage, const Tile &t) {
  const int cc = threadIdx.x % kUnitsPerRow;
@if ROTARY_TABLE@
@if TABLE_IN_GLOBAL@
  const unsigned short *table = t.table; // the block's rows, where they are
@else@
  const unsigned short *table = table_rows(stage);
@endif@
@else@
  float turns[kUnitPairs];
#pragma unroll
  for (int j = 0; j < kUnitPairs; j++) turns[j] = kRotaryTurns[kUnitPairs * cc + j];
@endif@
#pragma unroll 1
  for (int row = threadIdx.x / kUnitsPerRow; row < t.rows; row += kUnitRows) {
    float s[kUnitPairs], c[kUnitPairs];
@if ROTARY_TABLE@
    unit_angles(table, row, cc, s, c);
@else@
    const float p = (float)rotary_position(t, row);
#pragma unroll
    for (int j = 0; j < kUnitPairs; j++) rotary_sincos(p * turns[j], s[j], c[j]);
@endif@
#pragma unroll
    for (int h = 0; h < kHeadsPerTile; h++) {
@if ROTATE_Q@
      rotate_unit(stage, row, h * kHeadChunks + cc, s, c);
@endif@
@if ROTATE_K@
      rotate_unit(stage + kTileElems, row, h * kHeadChunks + cc, s, c);
@endif@
@if ROTATE_V@
      rotate_unit(stage + 2 * kTileElems, row, h * kHeadChunks + cc, s, c);
@endif@
    }
  }
}
@endif@
@if ROTARY_GRADS@

@if ROTARY_TABLE@
// One 16-bit value as a float.
__device__ __forceinline__ float half_to_float(unsigned short x) {
  float f;
  asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.@MMA_TYPE@ %0, h; }" : "=f"(f) : "h"(x));
  return f;
}

@endif@
@if ROTARY_HALF@
// sin and cos of pairs i and i + 1 (i even) of block row `row`.
__device__ __forceinline__ void two_angles(const unsigned short *stage, const Tile &t, int row,
                                           int i, float (&s)[2], float (&c)[2]) {
@if ROTARY_TABLE@
@if TABLE_IN_GLOBAL@
  // The block's rows in global memory (`stage` is unused), where a row past
  // the sequence end (its gradient is not stored) reads the last one's.
  const unsigned short *table = t.table;
  row = min(row, t.rows - 1);
@else@
  const unsigned short *table = stage + kStageElems - kTableElems;
@endif@
  const unsigned *sw =
      reinterpret_cast<const unsigned *>(table + table_at(row, i >> 3) + (i & 7));
  const unsigned *cw = reinterpret_cast<const unsigned *>(
      table + table_at(row, (i >> 3) + kHeadChunks / 2) + (i & 7));
  unpack2(*sw, s[0], s[1]);
  unpack2(*cw, c[0], c[1]);
@else@
  const float p = (float)rotary_position(t, row);
  rotary_sincos(p * kRotaryTurns[i], s[0], c[0]);
  rotary_sincos(p * kRotaryTurns[i + 1], s[1], c[1]);
@endif@
}
@else@
// sin and cos of pair i of block row `row`.
__device__ __forceinline__ void pair_angle(const unsigned short *stage, const Tile &t, int row,
                                           int i, float &s, float &c) {
@if ROTARY_TABLE@
@if TABLE_IN_GLOBAL@
  // The block's rows in global memory (`stage` is unused), where a row past
  // the sequence end (its gradient is not stored) reads the last one's.
  const unsigned short *table = t.table;
  row = min(row, t.rows - 1);
@else@
  const unsigned short *table = stage + kStageElems - kTableElems;
@endif@
  s = half_to_float(table[table_at(row, i >> 3) + (i & 7)]);
  c = half_to_float(table[table_at(row, (i >> 3) + kHeadChunks / 2) + (i & 7)]);
@else@
  rotary_sincos((float)rotary_position(t, row) * kRotaryTurns[i], s, c);
@endif@
}
@endif@

// Rotate the 16 gradient rows of one warp back: the inputs were rotated,
// x' = R x, so dL/dx = R^T dL/dx', pair by pair
//   (g0, g1) -> (g0 cos a + g1 sin a, g1 cos a - g0 sin a).
// acc is in the mma C layout: acc[n][e] is row row0 + g + 8 (e / 2), column
// 8n + 2tq + e % 2, in fp32 before rounding.
@if ROTARY_CHUNKS@
// Rows are block rows; the chunked kernel has no stages and passes its
// chunk slots as `stage`, which the angles do not read.
@endif@
__device__ __forceinline__ void unrotate_rows(float (&acc)[kDimTiles][4],
                                              const unsigned short *stage, const Tile &t,
                                              int row0) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int row = row0 + g + 8 * hi;
@if ROTARY_HALF@
    // Column 8n + 2tq + e of n-tile n < kDimTiles / 2 pairs with the same
    // column of n-tile n + kDimTiles / 2, in this thread's registers: pair
    // 8n + 2tq + e.
#pragma unroll
    for (int n = 0; n < kDimTiles / 2; n++) {
      float s[2], c[2];
      two_angles(stage, t, row, 8 * n + 2 * tq, s, c);
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float x0 = acc[n][2 * hi + e], x1 = acc[n + kDimTiles / 2][2 * hi + e];
        acc[n][2 * hi + e] = x0 * c[e] + x1 * s[e];
        acc[n + kDimTiles / 2][2 * hi + e] = x1 * c[e] - x0 * s[e];
      }
    }
@else@
    // Columns 8n + 2tq and 8n + 2tq + 1, this thread's pair of registers,
    // are pair 4n + tq.
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) {
      float s, c;
      pair_angle(stage, t, row, 4 * n + tq, s, c);
      const float x0 = acc[n][2 * hi], x1 = acc[n][2 * hi + 1];
      acc[n][2 * hi] = x0 * c + x1 * s;
      acc[n][2 * hi + 1] = x1 * c - x0 * s;
    }
@endif@
  }
}
@endif@
/* ---- end rotary embeddings ---- */
