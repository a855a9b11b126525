@# SPDX-License-Identifier: BSD-3-Clause
@# block_fwd.cu: block-diagonal attention forward, mma.sync path (sm_80+).
@# Placeholders: @KERNEL_NAME@ @BLOCK_SIZE@ @HEAD_DIM@ @WARPS@
@#   @HEADS_PER_TILE@ @JOBS_PER_WARP@ @STAGES@ @MIN_CTAS@ @SCALE_LOG2@ (scale * log2(e), a float
@#   literal) @SCALE_TEXT@ (the scale as the spec gave it, for a comment)
@#   @MMA_TYPE@ @PAIR_TYPE@ (see mma_sm80.cuh) @SMEM_BYTES@ (the plan's dynamic shared
@#   memory; checked against the layout with a rotary table)
@#   With rotary embeddings, those of rotary.cuh.
@# Conditions: CAUSAL; ROW_STRIDES (the tensors' row strides are parameters, and
@#   kv_heads: K and V may have fewer heads; else heads * head_dim, packed); ROTARY (rotary embeddings; then those of rotary.cuh, and
@#   ROTARY_TABLE and ROTARY_SEQUENCE also shape the tile load and the work walk);
@#   TABLE_SLOT (with ROTARY_TABLE and two stages: the table rows in one slot
@#   after the stages, not one a stage); TABLE_REUSE (with ROTARY_TABLE: a
@#   tile of the last tile's block, its next head group, keeps the rows
@#   already in the slot or the stage instead of loading them again).
/* ---- begin constants ---- */
constexpr int kBlock = @BLOCK_SIZE@;  // tokens per diagonal block
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kWarps = @WARPS@;  // warps per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kHeadsPerTile = @HEADS_PER_TILE@;  // adjacent heads loaded as one tile
constexpr int kJobsPerWarp = @JOBS_PER_WARP@;  // (head, 16-row query tile) jobs per warp
constexpr int kStages = @STAGES@;  // (block, head group) tiles resident per CTA
constexpr int kMinCtasPerSm = @MIN_CTAS@;  // launch bound: registers fit this many CTAs
constexpr float kScaleLog2 = @SCALE_LOG2@;  // softmax scale @SCALE_TEXT@ times log2(e)

constexpr int kRowElems = kHeadsPerTile * kHeadDim;  // one tile row: contiguous in memory
constexpr int kChunks = kRowElems / 8;  // 16-byte chunks per tile row
constexpr int kHeadChunks = kHeadDim / 8;  // 16-byte chunks per head
constexpr int kTileElems = kBlock * kRowElems;  // one of Q, K, V for one (block, head group)
@if ROTARY_TABLE@
constexpr int kTableElems = kBlock * kHeadDim;  // the rotary table's rows of a block: sin | cos
@if TABLE_SLOT@
constexpr int kStageElems = 3 * kTileElems;  // Q, K and V (the table rows: one slot after)
@else@
constexpr int kStageElems = 3 * kTileElems + kTableElems;  // Q, K, V and the table rows
@endif@
@else@
constexpr int kStageElems = 3 * kTileElems;  // Q, K and V
@endif@
constexpr int kKeyTiles = kBlock / 8;  // n-tiles of S = Q K^T
constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of O = P V
constexpr int kJobs = kHeadsPerTile * kBlock / 16;  // (head, 16-row query tile) jobs per tile
static_assert(kWarps * kJobsPerWarp >= kJobs, "warps must cover the tile");
@if ROTARY_TABLE@
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
@if TABLE_SLOT@
static_assert(kStages == 2, "the slot takes the next tile's rows while this one is computed");
static_assert(2 * (kStages * kStageElems + kTableElems) == kSmemBytes,
              "the plan's shared memory is the stages and the table slot");
@else@
static_assert(2 * kStages * kStageElems == kSmemBytes, "the plan's shared memory is the stages");
@endif@
@endif@
/* ---- end constants ---- */

@include mma_sm80.cuh@

@include block_walk.cuh@

@include softmax_rows.cuh@

@include tile_load.cuh@

@include rows_mma.cuh@

extern __shared__ __align__(128) unsigned short smem[];

// Q, K and V of one tile, in that order.
__device__ __forceinline__ void load_tile(unsigned short *stage, const unsigned short *q,
                                          const unsigned short *k, const unsigned short *v,
@if ROW_STRIDES@
                                          const InputRows<3> &row_stride, const Tile &t) {
@else@
                                          long long row_stride, const Tile &t) {
@endif@
  const unsigned short *const src[3] = {q, k, v};
  load_tiles(stage, src, row_stride, t);
}
@if ROTARY_TABLE@

@include rotary_load.cuh@
@endif@
/* ---- end tile load ---- */
@if ROTARY@

@include rotary.cuh@
@endif@

/* ---- begin attention for one 16-row query tile ----
 * S = Q K^T and P = softmax(S) stay in registers; P is reused directly as
 * the A operand of O = P V. The whole key range is one tile, so there is no
 * running maximum to rescale. */
__device__ __forceinline__ void attend_rows(unsigned short *stage, const Tile &t, int h,
                                            int row0, unsigned short *o, long long row_stride) {
  const int c0 = h * kHeadChunks; // head h of the group: its first chunk in a tile row
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3; // row group and thread in quad
  const unsigned q_s = smem_addr(stage), k_s = smem_addr(stage + kTileElems),
                 v_s = smem_addr(stage + 2 * kTileElems);

  // S = Q K^T for rows row0..row0+15, all kBlock keys.
  float s[kKeyTiles][4];
  rows_times_rows<kKeyTiles, kHeadDim / 16>(s, q_s, k_s, c0, row0);

  const int r_lo = row0 + g, r_hi = r_lo + 8;
  float l_lo, l_hi; // row sums of P before normalisation
  softmax_rows(s, t, r_lo, r_hi, tq, l_lo, l_hi);

  // O = P V: the accumulators of key tiles 2j, 2j+1 are the A fragment of
  // key slice j.
  float acc[kDimTiles][4];
#pragma unroll
  for (int n = 0; n < kDimTiles; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int j = 0; j < kBlock / 16; j++) {
    unsigned a[4] = {pack2(s[2 * j][0], s[2 * j][1]), pack2(s[2 * j][2], s[2 * j][3]),
                     pack2(s[2 * j + 1][0], s[2 * j + 1][1]),
                     pack2(s[2 * j + 1][2], s[2 * j + 1][3])};
    times_tile_rows(acc, a, v_s, 16 * j, c0);
  }

  // Normalise, then stage the 16 output rows in this warp's own Q rows and
  // head (read by no other warp) so the global stores are 16-byte and
  // coalesced. The warp's lanes read Q above: order those reads first.
  const float inv_lo = 1.f / l_lo, inv_hi = 1.f / l_hi;
  unsigned *stage32 = reinterpret_cast<unsigned *>(stage);
  __syncwarp();
#pragma unroll
  for (int n = 0; n < kDimTiles; n++) {
    stage32[(swizzle(r_lo, c0 + n) + 2 * tq) / 2] = pack2(acc[n][0] * inv_lo, acc[n][1] * inv_lo);
    stage32[(swizzle(r_hi, c0 + n) + 2 * tq) / 2] = pack2(acc[n][2] * inv_hi, acc[n][3] * inv_hi);
  }
  __syncwarp();
  unsigned short *out = o + t.token0 * row_stride + (long long)(t.head0 + h) * kHeadDim;
#pragma unroll
  for (int it = 0; it < kHeadChunks / 2; it++) {
    int i = lane + it * 32;
    int row = row0 + i / kHeadChunks, chunk = i % kHeadChunks;
    if (row < t.rows)
      *reinterpret_cast<uint4 *>(out + row * row_stride + chunk * 8) =
          *reinterpret_cast<const uint4 *>(stage + swizzle(row, c0 + chunk));
  }
}
/* ---- end attention for one 16-row query tile ---- */

/* ---- begin kernel ----
 * Every CTA walks its own contiguous range of items (the launcher sizes the
 * grid) with kStages tiles resident, loading the next while computing the
 * current.
 * Warps take (head, 16-row query tile) jobs of the resident tile in turn. */
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@(@PARAMS@) {
@if ROW_STRIDES@
  // Elements from one token's row to the next: Q's, K's and V's (O's:
  // o_stride); query head h reads key head h / (heads / kv_heads).
  const InputRows<3> row_stride = {{q_stride, k_stride, v_stride}, heads / kv_heads};
@else@
  const long long row_stride = (long long)heads * kHeadDim;
@endif@

  Walk w;
  walk_begin(w, offsets, batch, heads, total_tokens, num_items);
  Tile ring[kStages];
  walk_fill(w, ring, [&](int s, const Tile &t) {
    load_tile(smem + s * kStageElems, q, k, v, row_stride, t);
@if ROTARY_TABLE@
    load_table(smem + s * kStageElems, rotary_table, t);
@endif@
  });

@if TABLE_REUSE@
@if TABLE_SLOT@
@else@
  // The first token of the last tile computed, whose stage the step
  // refills: a tile of the same block (the next head group) finds its
  // table rows there already.
  long long last_token0 = -1;
@endif@
@endif@
  for (long long n = 0; ring[0].rows; n++) {
    // Refill the stage the previous step used, once every warp is done with it.
    __syncthreads();
    if (ring[kStages - 1].rows)
      load_tile(smem + ((n + kStages - 1) % kStages) * kStageElems, q, k, v, row_stride,
                ring[kStages - 1]);
@if ROTARY_TABLE@
@if TABLE_SLOT@
    // (the table slot holds this tile's rows: the next tile's follow its rotation)
@else@
@if TABLE_REUSE@
    if (ring[kStages - 1].rows && ring[kStages - 1].token0 != last_token0)
@else@
    if (ring[kStages - 1].rows)
@endif@
      load_table(smem + ((n + kStages - 1) % kStages) * kStageElems, rotary_table,
                 ring[kStages - 1]);
@endif@
@endif@
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncthreads();

    unsigned short *stage = smem + (n % kStages) * kStageElems;
@if ROTARY@
    // Rotate the tile in place; every warp then reads rows others rotated.
    rotate_tile(stage, ring[0]);
    __syncthreads();
@if TABLE_SLOT@
    // The slot is free: the next tile's table rows, a tile's work ahead of
    // their use (the next step's wait takes them with the tile).
@if TABLE_REUSE@
    // Not where it is this block's next head group: its rows are these.
    if (ring[1].rows && ring[1].token0 != ring[0].token0) load_table(stage, rotary_table, ring[1]);
@else@
    if (ring[1].rows) load_table(stage, rotary_table, ring[1]);
@endif@
    cp_async_commit();
@endif@
@endif@
    const int warp = threadIdx.x >> 5;
#pragma unroll 1
    for (int job = warp; job < kJobs; job += kWarps) {
      int h = job / (kBlock / 16), row0 = job % (kBlock / 16) * 16;
      if (row0 < ring[0].rows && h < ring[0].heads)
@if ROW_STRIDES@
        attend_rows(stage, ring[0], h, row0, o, o_stride);
@else@
        attend_rows(stage, ring[0], h, row0, o, row_stride);
@endif@
    }

@if TABLE_REUSE@
@if TABLE_SLOT@
@else@
    last_token0 = ring[0].token0;
@endif@
@endif@
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) ring[s] = ring[s + 1];
    ring[kStages - 1] = walk_take(w);
  }
  cp_async_wait<0>();
}
/* ---- end kernel ---- */
