@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_rotary.cuh: rotary embeddings fused into the jagged mma.sync
@# kernels (jagged_fwd.cu, jagged_bwd.cu): a tile's rows rotated in place in
@# shared memory once they have landed, and the backward's gradient rows
@# rotated back in registers before they are stored. Included after the
@# includer's tile layout; uses its kHeadDim, kThreads (rotate_rows'
@# default thread count), swizzle(row, chunk) (the tiles' layout unless
@# rotate_rows is given another), pack2(), unpack2() and for_lane_rows()
@# (mma_sm80.cuh).
@# Placeholders: @ROTATE_Q@ @ROTATE_K@ @ROTATE_V@ (0 | 1: the tensors
@#   rotated); those of rotary_core.cuh.
@# Conditions: ROTARY_TABLE (positions from the caller's tables, else
@#   computed); those of rotary_core.cuh.
/* ---- begin rotary embeddings ----
 * Pair i (0 <= i < kHeadDim / 2) of a head, (x[2i], x[2i + 1]) in the
 * interleaved layout or (x[i], x[i + kHeadDim / 2]) in the half layout, of
 * a token at position p is rotated by the angle a(p, i):
 *   (x0, x1) -> (x0 cos a - x1 sin a, x0 sin a + x1 cos a),
 * in fp32 from the 16-bit values, rounded back once. Key j of a sequence
 * is at position j; query i at i + Lk - Lq, aligned at the bottom right as
 * the causal mask is (for self-attention, i).
@if ROTARY_TABLE@
 * sin a and cos a are the caller's: the row of the token in its tensor's
 * table (the queries' rotary_table [total_q, kHeadDim], the keys'
 * rotary_table_k [total_k, kHeadDim]), sin in columns [0, kHeadDim / 2) and
 * cos in the rest, read from global memory beside the tile (a key tile's
 * rows serve every query tile of its sequence, from L2).
@else@
 * a(p, i) = p base^(-2i / kHeadDim) in fp32, as rotary_core.cuh computes it.
@endif@
 * Rows past the sequence end are not rotated (they are zero and stay so).
 */
constexpr int kHeadChunks = kHeadDim / 8;  // 16-byte chunks of a row (one head)
constexpr bool kRotateQ = @ROTATE_Q@, kRotateK = @ROTATE_K@, kRotateV = @ROTATE_V@;  // the tensors rotated
@include rotary_core.cuh@

// Where the angles of a tile's rows come from: row r is at position pos0 +
// r, or reads its table row at table + r * kHeadDim.
struct RotaryRows {
  long long pos0;
  const unsigned short *table;
};

// The rows of a tile whose row 0 is token `token0` of its tensor at
// position pos0: that token's row of `table` on, with positions from
// tables; else positions from pos0 (the table is not read).
__device__ __forceinline__ RotaryRows rotary_rows(const unsigned short *table, long long token0,
                                                  long long pos0) {
@if ROTARY_TABLE@
  (void)pos0;
  return {0, table + token0 * kHeadDim};
@else@
  (void)table, (void)token0;
  return {pos0, nullptr};
@endif@
}

// Unit cc's angles (see rotary_core.cuh) for a tile row as read, before
// they are unpacked: the table's words, sin then cos, or the row's
// position.
struct UnitAngles {
@if ROTARY_TABLE@
@if ROTARY_HALF@
  uint4 s, c;  // pairs 8cc .. 8cc + 7: chunk cc of the row, and chunk cc + kHeadChunks / 2
@else@
  uint2 s, c;  // pairs 4cc .. 4cc + 3: 8 bytes at element 4cc, and kHeadDim / 2 on
@endif@
@else@
  float p;
@endif@
};

// Read unit cc's angles for tile row `row`.
__device__ __forceinline__ UnitAngles unit_read(const RotaryRows &rr, int row, int cc) {
@if ROTARY_TABLE@
  const unsigned short *t = rr.table + (long long)row * kHeadDim;
@if ROTARY_HALF@
  return {__ldg(reinterpret_cast<const uint4 *>(t) + cc),
          __ldg(reinterpret_cast<const uint4 *>(t) + cc + kHeadChunks / 2)};
@else@
  return {__ldg(reinterpret_cast<const uint2 *>(t) + cc),
          __ldg(reinterpret_cast<const uint2 *>(t + kHeadDim / 2) + cc)};
@endif@
@else@
  (void)cc;
  return {(float)(rr.pos0 + row)};
@endif@
}

// sin and cos of unit cc's pairs from what unit_read read.
__device__ __forceinline__ void unit_angles(const UnitAngles &u, int cc, float (&s)[kUnitPairs],
                                            float (&c)[kUnitPairs]) {
@if ROTARY_TABLE@
  (void)cc;
@if ROTARY_HALF@
  unpack(u.s.x, u.s.y, u.s.z, u.s.w, s);
  unpack(u.c.x, u.c.y, u.c.z, u.c.w, c);
@else@
  unpack(u.s.x, u.s.y, s);
  unpack(u.c.x, u.c.y, c);
@endif@
@else@
#pragma unroll
  for (int j = 0; j < kUnitPairs; j++) rotary_sincos(u.p * kRotaryTurns[kUnitPairs * cc + j], s[j], c[j]);
@endif@
}

@if ROTARY_TABLE@
// Rows whose angles a thread reads before it rotates any of them: a table
// row's words come from L2 or memory, so the reads of kAngleRows rows are
// in flight together (their packed words held, 4 or 8 registers a row)
// instead of one round trip a row (before session 43: the forwards of
// broadcast rotary 1.06-1.44x slower on an H100,
// bench/results/2026-12-07-h100-rotary-angle-rows-s43.log).
constexpr int kAngleRows = 4;
@endif@

// Rotate rows [0, rows) of tile a, and of tile b unless it is null (V
// beside K: the same rows and angles), in place, in layout L (see
// rotary_core.cuh), by the kBy threads tid = 0 .. kBy - 1 (the CTA's, or
// a loading warpgroup's). Every thread keeps one unit column and steps
// down the rows (from tables kAngleRows at a time). The caller waits for
// the tiles before and synchronizes the threads after.
template <typename L = Swizzled, int kBy = kThreads>
__device__ __forceinline__ void rotate_rows(unsigned short *a, unsigned short *b, int rows,
                                            const RotaryRows &rr, unsigned tid = threadIdx.x) {
  constexpr int kUnitRows = kBy / kUnitsPerRow;  // rows rotated at a time by the threads
  static_assert(kBy % kUnitsPerRow == 0, "every thread keeps one unit column");
  const int cc = tid % kUnitsPerRow;
@if ROTARY_TABLE@
#pragma unroll 1
  for (int row0 = tid / kUnitsPerRow; row0 < rows; row0 += kAngleRows * kUnitRows) {
    UnitAngles u[kAngleRows];
#pragma unroll
    for (int r = 0; r < kAngleRows; r++)
      if (row0 + r * kUnitRows < rows) u[r] = unit_read(rr, row0 + r * kUnitRows, cc);
#pragma unroll
    for (int r = 0; r < kAngleRows; r++) {
      const int row = row0 + r * kUnitRows;
      if (row >= rows) break;
      float s[kUnitPairs], c[kUnitPairs];
      unit_angles(u[r], cc, s, c);
      if (a) rotate_unit<L>(a, row, cc, s, c);
      if (b) rotate_unit<L>(b, row, cc, s, c);
    }
  }
@else@
#pragma unroll 1
  for (int row = tid / kUnitsPerRow; row < rows; row += kUnitRows) {
    float s[kUnitPairs], c[kUnitPairs];
    unit_angles(unit_read(rr, row, cc), cc, s, c);
    if (a) rotate_unit<L>(a, row, cc, s, c);
    if (b) rotate_unit<L>(b, row, cc, s, c);
  }
@endif@
}

// sin and cos of pair i of tile row `row`.
__device__ __forceinline__ void pair_angle(const RotaryRows &rr, int row, int i, float &s,
                                           float &c) {
@if ROTARY_TABLE@
  const unsigned short *t = rr.table + (long long)row * kHeadDim;
  float unused;
  unpack2(__ldg(t + i), s, unused);
  unpack2(__ldg(t + kHeadDim / 2 + i), c, unused);
@else@
  rotary_sincos((float)(rr.pos0 + row) * kRotaryTurns[i], s, c);
@endif@
}

// Rotate a warp's 16 gradient rows back, those before `rows`: the inputs
// were rotated, x' = R x, so dL/dx = R^T dL/dx', pair by pair
//   (g0, g1) -> (g0 cos a + g1 sin a, g1 cos a - g0 sin a).
// acc is in the mma C layout: acc[n][e] is row row0 + g + 8 (e / 2),
// column 8n + 2tq + e % 2, in fp32 before rounding.
__device__ __forceinline__ void unrotate_rows(float (&acc)[kHeadDim / 8][4], int row0, int rows,
                                              const RotaryRows &rr) {
  constexpr int kTiles = kHeadDim / 8;  // n-tiles of a row
  const int tq = threadIdx.x & 3;
  for_lane_rows(row0, rows, [&](int hi, int row) {
@if ROTARY_HALF@
    // Column 8n + 2tq + e of n-tile n < kTiles / 2 pairs with the same
    // column of n-tile n + kTiles / 2, in this thread's registers: pair
    // 8n + 2tq + e.
#pragma unroll
    for (int n = 0; n < kTiles / 2; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        float s, c;
        pair_angle(rr, row, 8 * n + 2 * tq + e, s, c);
        const float x0 = acc[n][2 * hi + e], x1 = acc[n + kTiles / 2][2 * hi + e];
        acc[n][2 * hi + e] = x0 * c + x1 * s;
        acc[n + kTiles / 2][2 * hi + e] = x1 * c - x0 * s;
      }
@else@
    // Columns 8n + 2tq and 8n + 2tq + 1, this thread's pair of registers,
    // are pair 4n + tq.
#pragma unroll
    for (int n = 0; n < kTiles; n++) {
      float s, c;
      pair_angle(rr, row, 4 * n + tq, s, c);
      const float x0 = acc[n][2 * hi], x1 = acc[n][2 * hi + 1];
      acc[n][2 * hi] = x0 * c + x1 * s;
      acc[n][2 * hi + 1] = x1 * c - x0 * s;
    }
@endif@
  });
}
/* ---- end rotary embeddings ---- */
