@# SPDX-License-Identifier: BSD-3-Clause
@# block_bwd.cu: block-diagonal attention backward, mma.sync path (sm_80+).
@# Placeholders: @KERNEL_NAME@ @BLOCK_SIZE@ @HEAD_DIM@ @WARPS@ @HEADS_PER_TILE@ @STAGES@
@#   @MIN_CTAS@ @SMEM_BYTES@ (the plan's dynamic shared memory, checked against the
@#   layout below) @SCALE@ (the softmax scale, a float literal) @SCALE_LOG2@ (scale *
@#   log2(e)) @SCALE_TEXT@ (the scale as the spec gave it, for a comment)
@#   @MMA_TYPE@ @PAIR_TYPE@ (see mma_sm80.cuh)
@#   With rotary embeddings, those of rotary.cuh.
@# Conditions: CAUSAL; ROW_STRIDES (each tensor's row stride is a parameter, and
@#   kv_heads: K and V may have fewer heads, dK and dV per query head; else
@#   heads * head_dim, packed); PDS_OVERLAY (P and dS take the place of K and V once
@#   phase 1 is done: one job per warp, and P and dS no larger than K and V);
@#   WGMMA (with PDS_OVERLAY, one head of 64 tokens at head_dim 64 or 128,
@#   the tiles stored as 64-column halves (SPLIT_ROWS at 128), so every
@#   operand is a 64x64 matrix of 128-byte rows: where compiled for sm_90a
@#   the four warps compute both phases as one warpgroup with wgmma);
@#   BULK_STORE (each warp's staging rows end the shared memory: where
@#   compiled for sm_90 the gradients go through them to memory);
@#   SCALE_IN_DS (bf16: the softmax scale rides in dS; else dQ and dK take
@#   it as they are stored); SERIAL_KEY_GRADS (with WGMMA: dK's wgmma waits
@#   until dV is stored, for registers that computed sines and cosines need);
@#   ROTARY (rotary embeddings; then those of rotary.cuh, and
@#   ROTARY_TABLE and ROTARY_SEQUENCE also shape the tile load and the work
@#   walk); with ROTARY_TABLE, TABLE_IN_GLOBAL (the table rows read in
@#   global memory, from Tile::table) or TABLE_STAGED (loaded with each tile;
@#   TABLE_SLOT false: see rotary_load.cuh; with TABLE_REUSE a tile of the
@#   last tile's block keeps the rows in the stage it refills); LATE_DQ (with PDS_OVERLAY: dQ
@#   rotated back and stored after P and dS); OWN_HELPERS (include
@#   mma_sm80.cuh: off when a forward kernel earlier in the same source has
@#   emitted it); IN_NAMESPACE (put all of
@#   this in namespace bwd, apart from that forward's constants and functions).
@if IN_NAMESPACE@
/* The backward kernel. Its constants and functions live in namespace bwd,
 * apart from the forward's; the device helpers above serve both. */
namespace bwd {

@endif@
/* ---- begin constants ---- */
constexpr int kBlock = @BLOCK_SIZE@;  // tokens per diagonal block
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kWarps = @WARPS@;  // warps per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kHeadsPerTile = @HEADS_PER_TILE@;  // adjacent heads loaded as one tile
constexpr int kStages = @STAGES@;  // (block, head group) input tiles resident per CTA
constexpr int kMinCtasPerSm = @MIN_CTAS@;  // launch bound: registers fit this many CTAs
@include block_bwd_scale.cuh@

constexpr int kRowElems = kHeadsPerTile * kHeadDim;  // one tile row: contiguous in memory
constexpr int kChunks = kRowElems / 8;  // 16-byte chunks per tile row
constexpr int kHeadChunks = kHeadDim / 8;  // 16-byte chunks per head
constexpr int kTileElems = kBlock * kRowElems;  // one of Q, K, V, dO for one (block, head group)
@if TABLE_STAGED@
constexpr int kTableElems = kBlock * kHeadDim;  // the rotary table's rows of a block: sin | cos
constexpr int kStageElems = 4 * kTileElems + kTableElems;  // Q, K, V, dO and the table rows
@else@
@if TABLE_IN_GLOBAL@
constexpr int kStageElems = 4 * kTileElems;  // Q, K, V and dO (the table: read where it is)
@else@
constexpr int kStageElems = 4 * kTileElems;  // Q, K, V and dO
@endif@
@endif@
constexpr int kRowTiles = kBlock / 16;  // 16-row tiles of a block: query rows or key rows
constexpr int kKeyTiles = kBlock / 8;  // n-tiles of S = Q K^T and dP = dO V^T
constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of dQ, dK and dV
constexpr int kJobs = kHeadsPerTile * kRowTiles;  // (head, 16-row tile) jobs per tile and phase
// P and dS of one head are [query row][key] in rows of kPStride elements:
// blocks of a multiple of 64 tokens XOR-swizzle the 16-byte chunks of a row
// by the row (as the tiles do), other blocks pad each row by 16 bytes.
// Either way the quad stores of phase 1 and the 8 row addresses of an
// ldmatrix in phase 2 hit different banks.
constexpr bool kPSwizzle = kBlock % 64 == 0;
constexpr int kPStride = kPSwizzle ? kBlock : kBlock + 8;
constexpr int kPElems = kBlock * kPStride;  // P (or dS) of one head
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
@if BULK_STORE@
// Each warp's staging rows for its gradient stores, the last of shared
// memory: 16 rows of a head, each padded by 16 bytes so that the 8 row
// addresses of an stmatrix hit different banks.
constexpr int kStagingStride = kHeadDim + 8;
constexpr int kStagingElems = 16 * kStagingStride;  // one warp's
constexpr int kStagingBytes = 2 * kWarps * kStagingElems;
static_assert(kHeadDim == 64, "the plan stages rows of 64 elements");
@else@
constexpr int kStagingBytes = 0;  // no staging rows
@endif@
@if PDS_OVERLAY@
static_assert(kJobs == kWarps, "P and dS wait in registers: one job per warp");
static_assert(kHeadsPerTile * kPElems <= kTileElems, "P fits in K's place and dS in V's");
@if WGMMA@
static_assert(kWarps == 4 && kBlock == 64 && kHeadDim % 64 == 0 && kHeadsPerTile == 1 &&
                  kPSwizzle,
              "wgmma: one warpgroup on 64-row tiles of 128-byte swizzled rows");
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// Every operand is a 64x64 matrix of 128-byte rows: a tile is kHalves of
// them (its 64-column halves), P and dS one each.
constexpr int kHalves = kHeadDim / 64;
constexpr int kHalfBytes = 64 * 64 * 2;
// A wgmma k16 step over 16 rows of such a matrix (operands read MN-major);
// along the rows (read K-major) a step is 32 bytes, and every 4 steps the
// next half.
constexpr int kStepOverRows = 16 * 64 * 2;
#endif
static_assert(kPStride == 64, "P and dS rows are 128 bytes, as the halves' rows");
@endif@
static_assert(2 * kStages * kStageElems + kStagingBytes == kSmemBytes,
              "the plan's shared memory is the stages and the staging rows");
@else@
static_assert(2 * (kStages * kStageElems + 2 * kHeadsPerTile * kPElems) + kStagingBytes ==
                  kSmemBytes,
              "the plan's shared memory is the stages, P and dS of every head and the staging rows");
@endif@
/* ---- end constants ---- */

@if OWN_HELPERS@
@include mma_sm80.cuh@

@endif@
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
@include wgmma_sm90.cuh@
#endif

@endif@
@if BULK_STORE@
#if __CUDA_ARCH__ >= 900
@include bulk_sm90.cuh@
#endif

@endif@
// The CTA's dynamic shared memory: the stages, then P and dS or the staging
// rows where the plan has them. Declared out here rather than in the kernel,
// so that in a source holding both passes it is not the forward's.
@if WGMMA@
// 1024-byte aligned: wgmma reads the tiles in the 128-byte swizzle, whose
// 8-row atoms must start at multiples of 1024.
extern __shared__ __align__(1024) unsigned short smem[];
@else@
extern __shared__ __align__(128) unsigned short smem[];
@endif@

@include block_walk.cuh@

@include softmax_rows.cuh@

/* ---- begin the math ----
 * Per (block, head), with P = softmax(scale * Q K^T) over the visible keys
 * and dO = dL/dO given:
 *   dV = P^T dO,   dP = dO V^T,   D = rowsum(P (.) dP),
 *   dS = scale * P (.) (dP - D),   dQ = dS K,   dK = dS^T Q
 * (the scale multiplies dS or, for fp16, dQ and dK: kDsScale, kStoreScale).
 * The whole key range of a query is one tile, so P is recomputed exactly from
 * Q and K, and D (which equals rowsum(dO (.) O)) comes from P and dP: neither
 * O nor a logsumexp is read, and every gradient row belongs to one tile, so
 * no atomics. Two phases per tile, a barrier between them:
 *   1. (head, 16 query rows) jobs: S, P, dP and dS in registers, where a row
 *      lives in the 4 lanes of a quad (mma C layout); dQ of those rows from
 *      dS in registers (as the forward's O from P) and K; then P and dS,
 *      rounded to 16 bits, into shared memory.
 *   2. (head, 16 key rows) jobs: dV and dK rows are sums over every query
 *      row, so they wait for all of phase 1, and read P^T and dS^T as A
 *      operands with ldmatrix.trans. Phase 2 reads neither K nor V.
@if BULK_STORE@
 * The gradients go from the mma registers to memory in whole rows: on sm_90
 * through the warp's staging rows in shared memory and bulk copies, else
 * after shuffles in each quad that give every lane 16 contiguous bytes
 * (store_rows).
@else@
 * The gradients go from the mma registers to memory without shared memory:
 * each quad trades its pairs with shuffles so that every lane stores 16
 * contiguous bytes (store_rows).
@endif@
 * ---- end the math ---- */

@include tile_load.cuh@

// Q, K, V and dO of one tile, in that order. Rows past the sequence end are
// zero: their S is 0 and masked, their dO is 0, so they contribute nothing.
__device__ __forceinline__ void load_tile(unsigned short *stage, const unsigned short *q,
                                          const unsigned short *k, const unsigned short *v,
                                          const unsigned short *dout,
@if ROW_STRIDES@
                                          const InputRows<4> &row_stride, const Tile &t) {
@else@
                                          long long row_stride, const Tile &t) {
@endif@
  const unsigned short *const src[4] = {q, k, v, dout};
  load_tiles(stage, src, row_stride, t);
}
@if TABLE_STAGED@

@include rotary_load.cuh@
@endif@
/* ---- end tile load ---- */

@include unpack2.cuh@
@if ROTARY@

/* With rotary embeddings the prologue rotates Q, K (V) in place, so the
 * phases compute the gradients with respect to the rotated tensors and
 * rotate them back before storing them. */
@include rotary.cuh@
@endif@

// Element of P (or dS) at query row `row`, keys from 16-byte chunk `chunk`.
__device__ __forceinline__ int p_at(int row, int chunk) {
  return row * kPStride + 8 * (kPSwizzle ? chunk ^ (row & 7) : chunk);
}

@if BULK_STORE@
#if __CUDA_ARCH__ >= 900
// This warp's staging rows (shared address).
__device__ __forceinline__ unsigned staging_rows() {
  extern __shared__ unsigned short all_smem[];
  return smem_addr(all_smem + (kSmemBytes - kStagingBytes) / 2 + (threadIdx.x >> 5) * kStagingElems);
}

// Round 16 result rows (C layout: acc[n][e] is row row0 + g + 8 (e / 2),
// column 8n + 2tq + e % 2) times `mul` and store those before `rows` to
// `out` (the block's first token, this head): the warp writes them to its
// staging rows with stmatrix, then lane r < 16 hands row r to a bulk copy,
// which leaves the registers and the issue slots free. The copies run on
// while the warp computes; the next call waits only until they have read
// the staging rows.
__device__ __forceinline__ void store_rows(const float (&acc)[kDimTiles][4], float mul,
                                           int row0, int rows, unsigned short *out,
                                           long long row_stride) {
  const int lane = threadIdx.x & 31;
  const unsigned staging = staging_rows();
  bulk_wait_read<0>(); // the staging rows are free again
  __syncwarp();
  // stmatrix rows: lanes 8i..8i+7 address matrix i, rows 8 (i % 2) + 0..7
  // of n-tile n + i / 2.
  const unsigned at = staging + ((lane & 15) * kStagingStride + (lane >> 4) * 8) * 2;
#pragma unroll
  for (int n = 0; n < kDimTiles; n += 2)
    stmatrix_x4(at + n * 16, pack2(acc[n][0] * mul, acc[n][1] * mul),
                pack2(acc[n][2] * mul, acc[n][3] * mul),
                pack2(acc[n + 1][0] * mul, acc[n + 1][1] * mul),
                pack2(acc[n + 1][2] * mul, acc[n + 1][3] * mul));
  fence_to_bulk();
  __syncwarp();
  if (lane < 16 && row0 + lane < rows)
    bulk_store(out + (row0 + lane) * row_stride, staging + lane * kStagingStride * 2,
               kHeadDim * 2);
  bulk_commit();
}
#else
@endif@
// Round 16 result rows (C layout: acc[n][e] is row row0 + g + 8 (e / 2),
// column 8n + 2tq + e % 2) times `mul` and store those before `rows` to
// `out` (the block's first token, this head) in 16-byte pieces: for each 4
// n-tiles the quad transposes its 4 x 4 pairs with shuffles, so that lane
// tq holds the 8 columns of n-tile 4m + tq, and a warp's store writes 64
// contiguous bytes in each of 8 rows (whole 32-byte sectors).
__device__ __forceinline__ void store_rows(const float (&acc)[kDimTiles][4], float mul,
                                           int row0, int rows, unsigned short *out,
                                           long long row_stride) {
  static_assert(kDimTiles % 4 == 0, "n-tiles go in fours");
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int row = row0 + g + 8 * hi;
#pragma unroll
    for (int m = 0; m < kDimTiles / 4; m++) {
      // v[i]: this lane's pair of n-tile 4m + i. Each step swaps one bit of
      // (lane, i) where they differ; after both, v[i] is lane i's pair of
      // n-tile 4m + tq.
      unsigned v[4];
#pragma unroll
      for (int i = 0; i < 4; i++)
        v[i] = pack2(acc[4 * m + i][2 * hi] * mul, acc[4 * m + i][2 * hi + 1] * mul);
#pragma unroll
      for (int bit = 1; bit <= 2; bit <<= 1) {
        const bool upper = tq & bit;
#pragma unroll
        for (int i = 0; i < 4; i++) {
          if (i & bit) continue;
          const unsigned got = __shfl_xor_sync(0xffffffffu, upper ? v[i] : v[i | bit], bit);
          if (upper) v[i] = got;
          else v[i | bit] = got;
        }
      }
      if (row < rows)
        *reinterpret_cast<uint4 *>(out + row * row_stride + 8 * (4 * m + tq)) =
            make_uint4(v[0], v[1], v[2], v[3]);
    }
  }
}
@if BULK_STORE@
#endif
@endif@

__device__ __forceinline__ void clear(float (&acc)[kDimTiles][4]) {
#pragma unroll
  for (int n = 0; n < kDimTiles; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

/* ---- begin phase 1: P, dS and dQ for 16 query rows ---- */
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL

// Columns 64h.. of a result (its n-tiles 8h..8h+7): what one wgmma computes.
__device__ __forceinline__ float (&half_of(float (&acc)[kDimTiles][4], int h))[8][4] {
  return *reinterpret_cast<float(*)[8][4]>(&acc[8 * h]);
}

// d = X Y^T for the warpgroup's 64 rows of tile X at x_s against the 64 of
// tile Y at y_s, k over the head (S = Q K^T, dP = dO V^T); one commit group.
__device__ __forceinline__ void issue_rows_times_rows(float (&d)[kKeyTiles][4], unsigned x_s,
                                                      unsigned y_s) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; kk++) {
    const unsigned along = kk / 4 * kHalfBytes + kk % 4 * 32;
    wgmma_ss<0, 0>(d, sw128_desc(x_s, along), sw128_desc(y_s, along), kk);
  }
  wgmma_commit();
}
#endif
@endif@

@include rows_mma.cuh@

// P and dS of the job's 16 query rows as 16-bit pairs at this thread's C
// positions: [n][0] row r_lo, [n][1] row r_hi, keys 8n + 2tq and + 1.
struct RowGrads {
  unsigned p[kKeyTiles][2];
  unsigned ds[kKeyTiles][2];
};

// Phase 1 of one job, first part: P and dS of its rows into `out`.
__device__ __forceinline__ void score_grads(const unsigned short *stage, const Tile &t, int h,
                                            int row0, RowGrads &out) {
  const int c0 = h * kHeadChunks; // head h of the group: its first chunk in a tile row
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3; // row group and thread in quad
  const unsigned q_s = smem_addr(stage), k_s = smem_addr(stage + kTileElems),
                 v_s = smem_addr(stage + 2 * kTileElems), do_s = smem_addr(stage + 3 * kTileElems);

  // S = Q K^T. This thread holds rows r_lo ([0], [1]) and r_hi ([2], [3]) at
  // key columns 8n + 2tq and 8n + 2tq + 1 of every n-tile n.
  float s[kKeyTiles][4];
  float dp[kKeyTiles][4]; // dP = dO V^T, the same shape
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  // The warpgroup's 64 query rows at once: S, then dP, which runs on while
  // the softmax works on S.
  (void)c0;
  wgmma_fence();
  issue_rows_times_rows(s, q_s, k_s);
  issue_rows_times_rows(dp, do_s, v_s);
  wgmma_wait<1>();
  wgmma_hold(s);
#else
@endif@
  rows_times_rows(s, q_s, k_s, c0, row0);
@if WGMMA@
#endif
@endif@

  const int r_lo = row0 + g, r_hi = r_lo + 8;
  float l_lo, l_hi; // row sums of P before normalisation
  softmax_rows(s, t, r_lo, r_hi, tq, l_lo, l_hi);

  // P, normalised and rounded, so that D, dS and dV all use the P that is
  // stored. Every row sees key 0, even rows past the end (their Q is zero),
  // so the sums are positive; the guard keeps NaN out all the same.
  const float inv_lo = l_lo > 0.f ? 1.f / l_lo : 0.f, inv_hi = l_hi > 0.f ? 1.f / l_hi : 0.f;
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) {
    out.p[n][0] = pack2(s[n][0] * inv_lo, s[n][1] * inv_lo);
    out.p[n][1] = pack2(s[n][2] * inv_hi, s[n][3] * inv_hi);
  }

@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  wgmma_wait<0>();
  wgmma_hold(dp);
#else
@endif@
  rows_times_rows(dp, do_s, v_s, c0, row0);
@if WGMMA@
#endif
@endif@

  // D = rowsum(P (.) dP), per thread and then over the quad.
  float d_lo = 0.f, d_hi = 0.f;
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) {
    float p0, p1, p2, p3;
    unpack2(out.p[n][0], p0, p1);
    unpack2(out.p[n][1], p2, p3);
    d_lo += p0 * dp[n][0] + p1 * dp[n][1];
    d_hi += p2 * dp[n][2] + p3 * dp[n][3];
  }
#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    d_lo += __shfl_xor_sync(0xffffffffu, d_lo, d);
    d_hi += __shfl_xor_sync(0xffffffffu, d_hi, d);
  }

  // dS = P (.) (dP - D), times kDsScale, rounded like P.
  const float sd_lo = kDsScale * d_lo, sd_hi = kDsScale * d_hi;
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) {
    float p0, p1, p2, p3;
    unpack2(out.p[n][0], p0, p1);
    unpack2(out.p[n][1], p2, p3);
    out.ds[n][0] =
        pack2(p0 * fmaf(dp[n][0], kDsScale, -sd_lo), p1 * fmaf(dp[n][1], kDsScale, -sd_lo));
    out.ds[n][1] =
        pack2(p2 * fmaf(dp[n][2], kDsScale, -sd_hi), p3 * fmaf(dp[n][3], kDsScale, -sd_hi));
  }
}

// Phase 1 of one job, second part: dQ = dS K of its rows into acc. The dS
// pairs of key tiles 2j, 2j+1 are the A fragment of key slice j; K's rows
// 16j.. are B, read as V is in the forward's O = P V.
__device__ __forceinline__ void query_products(const unsigned short *stage, int h, int row0,
                                               const unsigned (&ds)[kKeyTiles][2],
                                               float (&acc)[kDimTiles][4]) {
  const unsigned k_s = smem_addr(stage + kTileElems);
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  // The warpgroup's 64 rows: A from the dS registers, B = K's rows 16j..
  // read MN-major (the k index j runs over K's rows), one half of K's
  // columns at a time.
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < kRowTiles; j++) {
    const unsigned a[4] = {ds[2 * j][0], ds[2 * j][1], ds[2 * j + 1][0], ds[2 * j + 1][1]};
#pragma unroll
    for (int h = 0; h < kHalves; h++)
      wgmma_rs<1>(half_of(acc, h), a, sw128_desc(k_s, h * kHalfBytes + j * kStepOverRows), j);
  }
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int h = 0; h < kHalves; h++) wgmma_hold(half_of(acc, h));
#else
@endif@
  const int c0 = h * kHeadChunks;
  clear(acc);
#pragma unroll
  for (int j = 0; j < kRowTiles; j++) {
@if CAUSAL@
    if (j > row0 / 16) break; // keys after the last query row: dS is 0
@endif@
    const unsigned a[4] = {ds[2 * j][0], ds[2 * j][1], ds[2 * j + 1][0], ds[2 * j + 1][1]};
    times_tile_rows(acc, a, k_s, 16 * j, c0);
  }
@if WGMMA@
#endif
@endif@
}

// Phase 1 of one job, third part: its dQ rows to memory.
__device__ __forceinline__ void query_store(const unsigned short *stage, const Tile &t, int h,
                                            int row0, float (&acc)[kDimTiles][4],
                                            unsigned short *dq, long long row_stride) {
@if ROTATE_Q@
  unrotate_rows(acc, stage, t, row0);
@endif@
  store_rows(acc, kStoreScale, row0, t.rows,
             dq + t.token0 * row_stride + (long long)(t.head0 + h) * kHeadDim, row_stride);
}

// dQ of one job's rows, to memory.
__device__ __forceinline__ void query_grads(const unsigned short *stage, const Tile &t, int h,
                                            int row0, const unsigned (&ds)[kKeyTiles][2],
                                            unsigned short *dq, long long row_stride) {
  float acc[kDimTiles][4];
  query_products(stage, h, row0, ds, acc);
  query_store(stage, t, h, row0, acc, dq, row_stride);
}

// Store one job's P and dS rows (head h's buffers p, ds) for phase 2.
__device__ __forceinline__ void store_scores(const RowGrads &rg, unsigned short *p,
                                             unsigned short *ds, int row0) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int r_lo = row0 + g, r_hi = r_lo + 8;
  unsigned *p32 = reinterpret_cast<unsigned *>(p), *ds32 = reinterpret_cast<unsigned *>(ds);
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) {
    const int lo = (p_at(r_lo, n) + 2 * tq) / 2, hi = (p_at(r_hi, n) + 2 * tq) / 2;
    p32[lo] = rg.p[n][0];
    p32[hi] = rg.p[n][1];
    ds32[lo] = rg.ds[n][0];
    ds32[hi] = rg.ds[n][1];
  }
}
/* ---- end phase 1 ---- */

/* ---- begin phase 2: dV and dK for 16 key rows ---- */

// acc += x^T b over query slices kk0 <= kk < kk1, for the 16 keys r0..: A is
// x[:, r0..r0+15]^T (x = P or dS, [query][key]; rows of A are keys, k runs
// over queries), read with ldmatrix.trans; B is rows 16kk.. of tile b (k =
// query row, n = dim, head columns from chunk c0), read with ldmatrix.trans
// as V is in the forward's O = P V. dV = P^T dO and dK = dS^T Q.
__device__ __forceinline__ void accumulate(float (&acc)[kDimTiles][4], unsigned x_s, int r0,
                                           unsigned b_s, int c0, int kk0, int kk1) {
  const int lane = threadIdx.x & 31;
#pragma unroll 1
  for (int kk = kk0; kk < kk1; kk++) {
    // Matrix i (lanes 8i..8i+7 give its rows) is x's query rows
    // 16kk + 8(i >> 1) + 0..7 at keys r0 + 8(i & 1) + 0..7; .trans hands
    // each lane its transpose, so matrices 0..3 are A's (keys +0 | +8) x
    // (queries +0 | +8) quarters in the order a0, a1, a2, a3.
    unsigned a[4];
    ldmatrix_x4_trans(a, x_s + p_at(16 * kk + (lane & 7) + ((lane >> 4) << 3),
                                    r0 / 8 + ((lane >> 3) & 1)) * 2);
    times_tile_rows(acc, a, b_s, 16 * kk, c0);
  }
}

@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
// Issue acc = x^T b for the warpgroup's 64 key rows over all 64 query rows:
// A = x^T (x = P or dS, [query][key]) and B = b (dO or Q), both read
// MN-major, the k index running over their rows; one commit group.
__device__ __forceinline__ void issue_key_mma(float (&acc)[kDimTiles][4], unsigned x_s,
                                              unsigned b_s) {
#pragma unroll
  for (int kk = 0; kk < kRowTiles; kk++)
#pragma unroll
    for (int h = 0; h < kHalves; h++)
      wgmma_ss<1, 1>(half_of(acc, h), sw128_desc(x_s, kk * kStepOverRows),
                     sw128_desc(b_s, h * kHalfBytes + kk * kStepOverRows), kk);
  wgmma_commit();
}
#endif

@endif@
__device__ __forceinline__ void key_grads(const unsigned short *stage, const unsigned short *p,
                                          const unsigned short *ds, const Tile &t, int h, int r0,
                                          unsigned short *dk, unsigned short *dv,
@if ROW_STRIDES@
                                          long long dk_stride, long long dv_stride) {
@else@
                                          long long row_stride) {
@endif@
  const int c0 = h * kHeadChunks;
  const unsigned q_s = smem_addr(stage), do_s = smem_addr(stage + 3 * kTileElems),
                 p_s = smem_addr(p), ds_s = smem_addr(ds);
@if ROW_STRIDES@
  const long long head = (long long)(t.head0 + h) * kHeadDim;
  unsigned short *const dk_rows = dk + t.token0 * dk_stride + head;
  unsigned short *const dv_rows = dv + t.token0 * dv_stride + head;
@else@
  const long long at = t.token0 * row_stride + (long long)(t.head0 + h) * kHeadDim;
@endif@
  // 16-row tiles that hold real rows: phase 1 wrote P and dS rows for these.
  const int tiles = (t.rows + 15) / 16;
@if CAUSAL@
  // P and dS vanish above the diagonal (key after query): keys r0.. get
  // gradients from query tiles r0 / 16 on.
  const int first_query_tile = r0 / 16;
@else@
  const int first_query_tile = 0;
@endif@
  float acc[kDimTiles][4];

@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  // All 64 query rows for the warpgroup's 64 keys: P and dS are zero where
  // no query sees the key, and past the sequence end dO and Q are.
  (void)c0, (void)first_query_tile, (void)tiles;
  float acc_k[kDimTiles][4];
  wgmma_fence();
  issue_key_mma(acc, p_s, do_s); // dV = P^T dO
@if SERIAL_KEY_GRADS@
  // dK waits until dV is stored: the sines and cosines computed there need
  // the registers its accumulators would hold.
  wgmma_wait<0>();
@else@
  issue_key_mma(acc_k, ds_s, q_s); // dK = dS^T Q runs on while dV is stored
  wgmma_wait<1>();
@endif@
#pragma unroll
  for (int h = 0; h < kHalves; h++) wgmma_hold(half_of(acc, h));
@if ROTATE_V@
  unrotate_rows(acc, stage, t, r0);
@endif@
@if ROW_STRIDES@
  store_rows(acc, 1.f, r0, t.rows, dv_rows, dv_stride);
@else@
  store_rows(acc, 1.f, r0, t.rows, dv + at, row_stride);
@endif@
@if SERIAL_KEY_GRADS@
  wgmma_fence();
  issue_key_mma(acc_k, ds_s, q_s); // dK = dS^T Q
@endif@
  wgmma_wait<0>();
#pragma unroll
  for (int h = 0; h < kHalves; h++) wgmma_hold(half_of(acc_k, h));
@if ROTATE_K@
  unrotate_rows(acc_k, stage, t, r0);
@endif@
@if ROW_STRIDES@
  store_rows(acc_k, kStoreScale, r0, t.rows, dk_rows, dk_stride);
@else@
  store_rows(acc_k, kStoreScale, r0, t.rows, dk + at, row_stride);
@endif@
#else
@endif@
  clear(acc); // dV = P^T dO
  accumulate(acc, p_s, r0, do_s, c0, first_query_tile, tiles);
@if ROTATE_V@
  unrotate_rows(acc, stage, t, r0);
@endif@
@if ROW_STRIDES@
  store_rows(acc, 1.f, r0, t.rows, dv_rows, dv_stride);
@else@
  store_rows(acc, 1.f, r0, t.rows, dv + at, row_stride);
@endif@

  clear(acc); // dK = dS^T Q
  accumulate(acc, ds_s, r0, q_s, c0, first_query_tile, tiles);
@if ROTATE_K@
  unrotate_rows(acc, stage, t, r0);
@endif@
@if ROW_STRIDES@
  store_rows(acc, kStoreScale, r0, t.rows, dk_rows, dk_stride);
@else@
  store_rows(acc, kStoreScale, r0, t.rows, dk + at, row_stride);
@endif@
@if WGMMA@
#endif
@endif@
}
/* ---- end phase 2 ---- */

/* ---- begin kernel ----
 * Every CTA walks its own contiguous range of items (the launcher sizes the
 * grid) with kStages input tiles resident, loading the next while computing
 * the current when there are two.
@if PDS_OVERLAY@
 * P and dS wait in each warp's registers until every warp is done with K and
 * V, then take their place in the stage.
@else@
 * P and dS are one buffer after the stages, reused by every item: the
 * barrier at the top of each step orders the last item's phase 2 before
 * this item's phase 1.
@endif@
 */
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@(@PARAMS@) {
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  if (smem_addr(smem) % 1024) __trap(); // never seen; wrong gradients would be worse
#endif
@endif@
@if ROW_STRIDES@
  // Elements from one token's row to the next: Q's, K's, V's and dO's (the
  // gradients': dq_stride, dk_stride, dv_stride); query head h reads key
  // head h / (heads / kv_heads), and dK, dV are written per query head.
  const InputRows<4> row_stride = {{q_stride, k_stride, v_stride, dout_stride},
                                   heads / kv_heads};
@else@
  const long long row_stride = (long long)heads * kHeadDim;
@endif@

  Walk w;
  walk_begin(w, offsets, batch, heads, total_tokens, num_items);
  Tile ring[kStages];
  walk_fill(w, ring, [&](int s, const Tile &t) {
    load_tile(smem + s * kStageElems, q, k, v, dout, row_stride, t);
@if TABLE_STAGED@
    load_table(smem + s * kStageElems, rotary_table, t);
@endif@
  });

@if TABLE_REUSE@
  // The first token of the last tile computed, whose stage the step
  // refills: a tile of the same block (the next head group) finds its
  // table rows there already (rotations read them, nothing writes them).
  long long last_token0 = -1;
@endif@
  for (long long n = 0; ring[0].rows; n++) {
    // Refill the stage the previous step used, once every warp is done with it.
    __syncthreads();
    if (ring[kStages - 1].rows)
      load_tile(smem + ((n + kStages - 1) % kStages) * kStageElems, q, k, v, dout, row_stride,
                ring[kStages - 1]);
@if TABLE_STAGED@
@if TABLE_REUSE@
    if (ring[kStages - 1].rows && ring[kStages - 1].token0 != last_token0)
@else@
    if (ring[kStages - 1].rows)
@endif@
      load_table(smem + ((n + kStages - 1) % kStages) * kStageElems, rotary_table,
                 ring[kStages - 1]);
@endif@
    cp_async_commit();
    cp_async_wait<kStages - 1>();
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    fence_proxy_async(); // the copies landed through the generic proxy; wgmma reads async
#endif
@endif@
    __syncthreads();

    unsigned short *stage = smem + (n % kStages) * kStageElems;
@if ROTARY@
    // Rotate the tile in place; every warp then reads rows others rotated.
@if TABLE_IN_GLOBAL@
    ring[0].table = rotary_table + ring[0].token0 * kHeadDim; // the block's rows
@endif@
    rotate_tile(stage, ring[0]);
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    fence_proxy_async();
#endif
@endif@
    __syncthreads();
@endif@
    const int warp = threadIdx.x >> 5;
@if PDS_OVERLAY@
    // P of head h where K was, dS where V was.
    unsigned short *const p_smem = stage + kTileElems, *const ds_smem = stage + 2 * kTileElems;
    // Phase 1: this warp's (head, 16 query rows) job: dQ to memory, P and dS
    // kept in registers until no warp reads K or V any more.
    {
      const int h = warp / kRowTiles, row0 = warp % kRowTiles * 16;
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
      // The warpgroup computes every row, those past the sequence end too
      // (zero Q and dO: their dS is zero), so phase 2 can sum over all.
      const bool mine = true;
#else
@endif@
      const bool mine = row0 < ring[0].rows && h < ring[0].heads;
@if WGMMA@
#endif
@endif@
      RowGrads rg;
@if LATE_DQ@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
      // dQ's products now; its rotation back once P and dS are stored, so
      // that their registers are free by then (else ptxas serializes wgmma).
      float dq_acc[kDimTiles][4];
      if (mine) {
        score_grads(stage, ring[0], h, row0, rg);
        query_products(stage, h, row0, rg.ds, dq_acc);
      }
      __syncthreads();
      if (mine) {
        store_scores(rg, p_smem + h * kPElems, ds_smem + h * kPElems, row0);
@if ROW_STRIDES@
        query_store(stage, ring[0], h, row0, dq_acc, dq, dq_stride);
@else@
        query_store(stage, ring[0], h, row0, dq_acc, dq, row_stride);
@endif@
      }
#else
      // (mma.sync: dQ's accumulators held across the barrier would spill)
@endif@
      if (mine) {
        score_grads(stage, ring[0], h, row0, rg);
@if ROW_STRIDES@
        query_grads(stage, ring[0], h, row0, rg.ds, dq, dq_stride);
@else@
        query_grads(stage, ring[0], h, row0, rg.ds, dq, row_stride);
@endif@
      }
      __syncthreads();
      if (mine) store_scores(rg, p_smem + h * kPElems, ds_smem + h * kPElems, row0);
@if LATE_DQ@
#endif
@endif@
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
      fence_proxy_async(); // phase 2's wgmma read P and dS
#endif
@endif@
    }
@else@
    unsigned short *const p_smem = smem + kStages * kStageElems; // P of each head
    unsigned short *const ds_smem = p_smem + kHeadsPerTile * kPElems; // dS of each head
    // Phase 1: (head, 16 query rows) jobs: dQ to memory, P and dS to shared
    // memory.
#pragma unroll 1
    for (int job = warp; job < kJobs; job += kWarps) {
      int h = job / kRowTiles, row0 = job % kRowTiles * 16;
      if (row0 < ring[0].rows && h < ring[0].heads) {
        RowGrads rg;
        score_grads(stage, ring[0], h, row0, rg);
        store_scores(rg, p_smem + h * kPElems, ds_smem + h * kPElems, row0);
@if ROW_STRIDES@
        query_grads(stage, ring[0], h, row0, rg.ds, dq, dq_stride);
@else@
        query_grads(stage, ring[0], h, row0, rg.ds, dq, row_stride);
@endif@
      }
    }
@endif@
    // Every warp's P and dS rows are in.
    __syncthreads();
    // Phase 2: (head, 16 key rows) jobs: dV and dK of those rows.
@if WGMMA@
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    // One warpgroup: every warp takes part (rows past the end are not stored).
@if ROW_STRIDES@
    key_grads(stage, p_smem, ds_smem, ring[0], 0, warp * 16, dk, dv, dk_stride, dv_stride);
@else@
    key_grads(stage, p_smem, ds_smem, ring[0], 0, warp * 16, dk, dv, row_stride);
@endif@
#else
@endif@
#pragma unroll 1
    for (int job = warp; job < kJobs; job += kWarps) {
      int h = job / kRowTiles, row0 = job % kRowTiles * 16;
      if (row0 < ring[0].rows && h < ring[0].heads)
@if ROW_STRIDES@
        key_grads(stage, p_smem + h * kPElems, ds_smem + h * kPElems, ring[0], h, row0, dk, dv,
                  dk_stride, dv_stride);
@else@
        key_grads(stage, p_smem + h * kPElems, ds_smem + h * kPElems, ring[0], h, row0, dk, dv,
                  row_stride);
@endif@
    }
@if WGMMA@
#endif
@endif@

@if TABLE_REUSE@
    last_token0 = ring[0].token0;
@endif@
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) ring[s] = ring[s + 1];
    ring[kStages - 1] = walk_take(w);
  }
  cp_async_wait<0>();
@if BULK_STORE@
#if __CUDA_ARCH__ >= 900
  bulk_wait_read<0>(); // the staging rows stay until the last copies have read them
#endif
@endif@
}
/* ---- end kernel ---- */
@if IN_NAMESPACE@

}  // namespace bwd
@endif@
