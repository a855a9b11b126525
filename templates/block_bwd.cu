@# block_bwd.cu: block-diagonal attention backward, mma.sync path (sm_80+).
@# Placeholders: @KERNEL_NAME@ @BLOCK_SIZE@ @HEAD_DIM@ @WARPS@ @HEADS_PER_TILE@ @STAGES@
@#   @MIN_CTAS@ @SMEM_BYTES@ (the plan's dynamic shared memory, checked against the
@#   layout below) @SCALE@ (the softmax scale, a float literal) @SCALE_LOG2@ (scale *
@#   log2(e)) @SCALE_TEXT@ (the scale as the spec gave it, for a comment)
@#   @MMA_TYPE@ @PAIR_TYPE@ (see mma_sm80.cuh)
@#   With rotary embeddings, those of rotary.cuh.
@# Conditions: CAUSAL; ROTARY (rotary embeddings; then those of rotary.cuh, and
@#   ROTARY_TABLE and ROTARY_SEQUENCE also shape the tile load and the work
@#   walk); OWN_HELPERS (include mma_sm80.cuh: off when a forward
@#   kernel earlier in the same source has emitted it); IN_NAMESPACE (put all of
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
constexpr float kScale = @SCALE@;  // softmax scale @SCALE_TEXT@
constexpr float kScaleLog2 = @SCALE_LOG2@;  // the scale times log2(e)

constexpr int kRowElems = kHeadsPerTile * kHeadDim;  // one tile row: contiguous in memory
constexpr int kChunks = kRowElems / 8;  // 16-byte chunks per tile row
constexpr int kHeadChunks = kHeadDim / 8;  // 16-byte chunks per head
constexpr int kTileElems = kBlock * kRowElems;  // one of Q, K, V, dO for one (block, head group)
@if ROTARY_TABLE@
constexpr int kTableElems = kBlock * kHeadDim;  // the rotary table's rows of a block: sin | cos
constexpr int kStageElems = 4 * kTileElems + kTableElems;  // Q, K, V, dO and the table rows
@else@
constexpr int kStageElems = 4 * kTileElems;  // Q, K, V and dO
@endif@
constexpr int kRowTiles = kBlock / 16;  // 16-row tiles of a block: query rows or key rows
constexpr int kKeyTiles = kBlock / 8;  // n-tiles of S = Q K^T and dP = dO V^T
constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of dQ, dK and dV
constexpr int kJobs = kHeadsPerTile * kRowTiles;  // (head, 16-row tile) jobs per tile and phase
constexpr int kLoads = kBlock * kChunks;  // 16-byte copies per tensor per tile
constexpr int kPStride = kBlock + 8;  // elements per row of P and dS: 16 bytes of padding
constexpr int kPElems = kBlock * kPStride;  // P (or dS) of one head: query rows x keys
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
static_assert(2 * (kStages * kStageElems + 2 * kHeadsPerTile * kPElems) == kSmemBytes,
              "the plan's shared memory is the stages plus P and dS of every head");
/* ---- end constants ---- */

@if OWN_HELPERS@
@include mma_sm80.cuh@

@endif@
@include block_walk.cuh@

@include softmax_rows.cuh@

/* ---- begin the math ----
 * Per (block, head), with P = softmax(scale * Q K^T) over the visible keys
 * and dO = dL/dO given:
 *   dV = P^T dO,   dP = dO V^T,   D = rowsum(P (.) dP),   dS = P (.) (dP - D),
 *   dQ = scale * dS K,   dK = scale * dS^T Q.
 * The whole key range of a query is one tile, so P is recomputed exactly from
 * Q and K, and D (which equals rowsum(dO (.) O)) comes from P and dP: neither
 * O nor a logsumexp is read, and every gradient row belongs to one tile, so
 * no atomics. Two phases per tile, a barrier between them:
 *   1. (head, 16 query rows) jobs: S, P, dP and dS in registers, where a row
 *      lives in the 4 lanes of a quad (mma C layout), then P and dS, rounded
 *      to 16 bits, into shared memory.
 *   2. (head, 16-row tile) jobs: dV and dK rows are key rows, sums over every
 *      query row, so they wait for all of phase 1 and read P^T and dS^T as A
 *      operands with ldmatrix.trans; dQ of the same tile index, as query rows,
 *      reads dS with a plain ldmatrix. Phase 2 reads no V, so V's rows of the
 *      job stage its outputs for 16-byte stores.
 * ---- end the math ---- */

@include tile_load.cuh@

// Q, K, V and dO of one tile, in that order. Rows past the sequence end are
// zero: their S is 0 and masked, their dO is 0, so they contribute nothing.
__device__ __forceinline__ void load_tile(unsigned short *stage, const unsigned short *q,
                                          const unsigned short *k, const unsigned short *v,
                                          const unsigned short *dout, long long row_stride,
                                          const Tile &t) {
  const unsigned short *src[4] = {q, k, v, dout};
#pragma unroll
  for (int m = 0; m < 4; m++) load_tensor(stage + m * kTileElems, src[m], row_stride, t);
}
@if ROTARY_TABLE@

@include rotary_load.cuh@
@endif@
/* ---- end tile load ---- */

/* ---- begin phase 1: P and dS for 16 query rows ----
 * P and dS live in shared memory as [query row][key] with rows of kPStride
 * elements: the stride is an odd multiple of 16 bytes, so both the quad
 * stores below and the 8 row addresses of an ldmatrix in phase 2 hit
 * different banks, for every block size. */

// The two floats of a packed 16-bit pair (pack2's inverse), `lo` from the
// low half.
__device__ __forceinline__ void unpack2(unsigned pair, float &lo, float &hi) {
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.@MMA_TYPE@ %0, l; cvt.f32.@MMA_TYPE@ %1, h; }"
      : "=f"(lo), "=f"(hi) : "r"(pair));
}

// c[i][j] = sum_d a[row0 + i][d] * b[j][d] for the 16 rows row0.. of tile a
// and every row j of tile b (head columns from chunk c0), as kKeyTiles 16x8
// accumulator tiles: S = Q K^T and dP = dO V^T.
__device__ __forceinline__ void rows_times_rows(float (&c)[kKeyTiles][4], unsigned a_s,
                                                unsigned b_s, int c0, int row0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll 1
  for (int kk = 0; kk < kHeadDim / 16; kk++) {
    // A: lanes 0-15 address rows row0..row0+15 at dims 16kk.., lanes 16-31
    // the same rows at dims 16kk+8.. (matrices a0..a3).
    unsigned a[4];
    ldmatrix_x4(a, a_s + swizzle(row0 + (lane & 15), c0 + 2 * kk + (lane >> 4)) * 2);
#pragma unroll
    for (int n = 0; n < kKeyTiles; n += 2) {
      // B (k = dim, n = row of b) is b's rows read as columns: matrices 0, 1
      // are rows 8n..8n+7 at dims 16kk.. and 16kk+8.. (b0, b1 of n-tile n),
      // matrices 2, 3 the next 8 rows (n-tile n+1).
      unsigned b[4];
      ldmatrix_x4(b, b_s + swizzle(n * 8 + (lane & 7) + ((lane >> 4) << 3),
                                   c0 + 2 * kk + ((lane >> 3) & 1)) * 2);
      mma_16816(c[n], a, b[0], b[1]);
      mma_16816(c[n + 1], a, b[2], b[3]);
    }
  }
}

__device__ __forceinline__ void score_grads(const unsigned short *stage, unsigned short *p,
                                            unsigned short *ds, const Tile &t, int h,
                                            int row0) {
  const int c0 = h * kHeadChunks; // head h of the group: its first chunk in a tile row
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3; // row group and thread in quad
  const unsigned q_s = smem_addr(stage), k_s = smem_addr(stage + kTileElems),
                 v_s = smem_addr(stage + 2 * kTileElems), do_s = smem_addr(stage + 3 * kTileElems);

  // S = Q K^T. This thread holds rows r_lo ([0], [1]) and r_hi ([2], [3]) at
  // key columns 8n + 2tq and 8n + 2tq + 1 of every n-tile n.
  float s[kKeyTiles][4];
  rows_times_rows(s, q_s, k_s, c0, row0);

  const int r_lo = row0 + g, r_hi = r_lo + 8;
  float l_lo, l_hi; // row sums of P before normalisation
  softmax_rows(s, t, r_lo, r_hi, tq, l_lo, l_hi);

  // P, normalised and rounded to 16-bit pairs: stored for phase 2 at this
  // thread's C positions (rows r_lo and r_hi, keys 8n + 2tq, +1), and kept
  // as pairs, half the registers of fp32, for dS (so D and dS use the P
  // that dV does). Every row sees key 0, even rows past the end (their Q is
  // zero), so the sums are positive; the guard keeps NaN out all the same.
  const float inv_lo = l_lo > 0.f ? 1.f / l_lo : 0.f, inv_hi = l_hi > 0.f ? 1.f / l_hi : 0.f;
  unsigned *p32 = reinterpret_cast<unsigned *>(p), *ds32 = reinterpret_cast<unsigned *>(ds);
  unsigned pp[kKeyTiles][2];
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) {
    const int lo = (r_lo * kPStride + n * 8 + 2 * tq) / 2, hi = lo + 8 * kPStride / 2;
    pp[n][0] = pack2(s[n][0] * inv_lo, s[n][1] * inv_lo);
    pp[n][1] = pack2(s[n][2] * inv_hi, s[n][3] * inv_hi);
    p32[lo] = pp[n][0];
    p32[hi] = pp[n][1];
  }

  // dP = dO V^T, the same shape as S (and in S's registers).
  float dp[kKeyTiles][4];
  rows_times_rows(dp, do_s, v_s, c0, row0);

  // D = rowsum(P (.) dP), per thread and then over the quad.
  float d_lo = 0.f, d_hi = 0.f;
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) {
    float p0, p1, p2, p3;
    unpack2(pp[n][0], p0, p1);
    unpack2(pp[n][1], p2, p3);
    d_lo += p0 * dp[n][0] + p1 * dp[n][1];
    d_hi += p2 * dp[n][2] + p3 * dp[n][3];
  }
#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    d_lo += __shfl_xor_sync(0xffffffffu, d_lo, d);
    d_hi += __shfl_xor_sync(0xffffffffu, d_hi, d);
  }

  // dS = P (.) (dP - D), to shared memory like P (the scale is applied to
  // dQ and dK in fp32).
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) {
    const int lo = (r_lo * kPStride + n * 8 + 2 * tq) / 2, hi = lo + 8 * kPStride / 2;
    float p0, p1, p2, p3;
    unpack2(pp[n][0], p0, p1);
    unpack2(pp[n][1], p2, p3);
    ds32[lo] = pack2(p0 * (dp[n][0] - d_lo), p1 * (dp[n][1] - d_lo));
    ds32[hi] = pack2(p2 * (dp[n][2] - d_hi), p3 * (dp[n][3] - d_hi));
  }
}
/* ---- end phase 1 ---- */
@if ROTARY@

/* With rotary embeddings the prologue rotates Q, K (V) in place, so phase 1
 * and phase 2 compute the gradients with respect to the rotated tensors,
 * which phase 2 rotates back before storing them. */
@include rotary.cuh@
@endif@

/* ---- begin phase 2: dV, dK and dQ for one 16-row tile ---- */

// acc += A B over the 16-wide k slices kk0 <= kk < kk1. B is rows 16kk..
// of tile b (k = row, n = dim, head columns from chunk c0), read with
// ldmatrix.trans as V is in the forward's O = P V. A is 16 rows of x (P or
// dS in shared memory, [query][key]):
//   kTransposed:  A = x[:, r0..r0+15]^T, rows are keys r0.., k runs over
//                 queries: dV = P^T dO and dK = dS^T Q;
//   otherwise:    A = x[r0..r0+15, :], rows are queries r0.., k runs over
//                 keys: dQ = dS K.
template <bool kTransposed>
__device__ __forceinline__ void accumulate(float (&acc)[kDimTiles][4], unsigned x_s, int r0,
                                           unsigned b_s, int c0, int kk0, int kk1) {
  const int lane = threadIdx.x & 31;
#pragma unroll 1
  for (int kk = kk0; kk < kk1; kk++) {
    unsigned a[4];
    if (kTransposed)
      // Matrix i (lanes 8i..8i+7 give its rows) is x's query rows
      // 16kk + 8(i >> 1) + 0..7 at keys r0 + 8(i & 1) + 0..7; .trans hands
      // each lane its transpose, so matrices 0..3 are A's (keys +0 | +8) x
      // (queries +0 | +8) quarters in the order a0, a1, a2, a3.
      ldmatrix_x4_trans(a, x_s + ((16 * kk + (lane & 7) + ((lane >> 4) << 3)) * kPStride + r0 +
                                  (((lane >> 3) & 1) << 3)) * 2);
    else
      // As Q in S = Q K^T: lanes 0-15 address query rows r0..r0+15 at keys
      // 16kk.., lanes 16-31 the same rows at keys 16kk + 8..
      ldmatrix_x4(a, x_s + ((r0 + (lane & 15)) * kPStride + 16 * kk + ((lane >> 4) << 3)) * 2);
#pragma unroll
    for (int n = 0; n < kDimTiles; n += 2) {
      unsigned b[4];
      ldmatrix_x4_trans(b, b_s + swizzle(16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3),
                                         c0 + n + (lane >> 4)) * 2);
      mma_16816(acc[n], a, b[0], b[1]);
      mma_16816(acc[n + 1], a, b[2], b[3]);
    }
  }
}

__device__ __forceinline__ void clear(float (&acc)[kDimTiles][4]) {
#pragma unroll
  for (int n = 0; n < kDimTiles; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// Round 16 result rows (C layout) times `mul`, stage them in rows
// row0..row0+15 of head columns c0.. of `tile` (a tile nobody reads in this
// phase; these rows and columns belong to this job alone), then copy the
// rows before `rows` to `out` (the block's first token, this head) in whole
// 16-byte chunks: kHeadChunks / 2 rounds of 32 lanes cover 16 rows.
__device__ __forceinline__ void store_rows(const float (&acc)[kDimTiles][4], float mul,
                                           unsigned short *tile, int c0, int row0, int rows,
                                           unsigned short *out, long long row_stride) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  unsigned *tile32 = reinterpret_cast<unsigned *>(tile);
  __syncwarp(); // the lanes' reads of what was staged here before come first
#pragma unroll
  for (int n = 0; n < kDimTiles; n++) {
    tile32[(swizzle(row0 + g, c0 + n) + 2 * tq) / 2] = pack2(acc[n][0] * mul, acc[n][1] * mul);
    tile32[(swizzle(row0 + g + 8, c0 + n) + 2 * tq) / 2] = pack2(acc[n][2] * mul, acc[n][3] * mul);
  }
  __syncwarp();
#pragma unroll
  for (int it = 0; it < kHeadChunks / 2; it++) {
    int i = lane + it * 32;
    int row = row0 + i / kHeadChunks, chunk = i % kHeadChunks;
    if (row < rows)
      *reinterpret_cast<uint4 *>(out + row * row_stride + chunk * 8) =
          *reinterpret_cast<const uint4 *>(tile + swizzle(row, c0 + chunk));
  }
}

__device__ __forceinline__ void grads(unsigned short *stage, const unsigned short *p,
                                      const unsigned short *ds, const Tile &t, int h, int r0,
                                      unsigned short *dq, unsigned short *dk, unsigned short *dv,
                                      long long row_stride) {
  const int c0 = h * kHeadChunks;
  const unsigned q_s = smem_addr(stage), k_s = smem_addr(stage + kTileElems),
                 do_s = smem_addr(stage + 3 * kTileElems), p_s = smem_addr(p),
                 ds_s = smem_addr(ds);
  unsigned short *staging = stage + 2 * kTileElems; // V's tile: read by nobody in phase 2
  const long long at = t.token0 * row_stride + (long long)(t.head0 + h) * kHeadDim;
  // 16-row tiles that hold real rows: phase 1 wrote P and dS rows for these.
  const int tiles = (t.rows + 15) / 16;
@if CAUSAL@
  // P and dS vanish above the diagonal (key after query): keys r0.. get
  // gradients from query tiles r0 / 16 on, queries r0.. from key tiles up
  // to r0 / 16.
  const int first_query_tile = r0 / 16, key_tiles = r0 / 16 + 1;
@else@
  const int first_query_tile = 0, key_tiles = tiles;
@endif@
  float acc[kDimTiles][4];

  clear(acc); // dV = P^T dO
  accumulate<true>(acc, p_s, r0, do_s, c0, first_query_tile, tiles);
@if ROTATE_V@
  unrotate_rows(acc, stage, t, r0);
@endif@
  store_rows(acc, 1.f, staging, c0, r0, t.rows, dv + at, row_stride);

  clear(acc); // dK = scale * dS^T Q
  accumulate<true>(acc, ds_s, r0, q_s, c0, first_query_tile, tiles);
@if ROTATE_K@
  unrotate_rows(acc, stage, t, r0);
@endif@
  store_rows(acc, kScale, staging, c0, r0, t.rows, dk + at, row_stride);

  clear(acc); // dQ = scale * dS K
  accumulate<false>(acc, ds_s, r0, k_s, c0, 0, key_tiles);
@if ROTATE_Q@
  unrotate_rows(acc, stage, t, r0);
@endif@
  store_rows(acc, kScale, staging, c0, r0, t.rows, dq + at, row_stride);
}
/* ---- end phase 2 ---- */

/* ---- begin kernel ----
 * Every CTA walks its own contiguous range of items (the launcher sizes the
 * grid) with kStages input tiles resident, loading the next while computing
 * the current when there are two. P and dS are one buffer, reused by every
 * item: the barrier at the top of each step orders the last item's phase 2
 * before this item's phase 1. */
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@(const unsigned short *__restrict__ q, const unsigned short *__restrict__ k,
    const unsigned short *__restrict__ v, const unsigned short *__restrict__ dout,
    unsigned short *__restrict__ dq, unsigned short *__restrict__ dk,
@if ROTARY_TABLE@
    unsigned short *__restrict__ dv, const unsigned short *__restrict__ rotary_table,
    const int *__restrict__ offsets, long long batch,
@else@
    unsigned short *__restrict__ dv, const int *__restrict__ offsets, long long batch,
@endif@
    int heads, long long total_tokens, long long num_items) {
  extern __shared__ __align__(128) unsigned short smem[];
  unsigned short *const p_smem = smem + kStages * kStageElems;      // P of each head
  unsigned short *const ds_smem = p_smem + kHeadsPerTile * kPElems; // dS of each head
  const long long row_stride = (long long)heads * kHeadDim;
  const long long first = num_items * blockIdx.x / gridDim.x;

  Walk w;
  w.offsets = offsets;
  w.batch = batch;
  w.total_tokens = total_tokens;
  w.end = num_items * (blockIdx.x + 1) / gridDim.x;
  w.num_heads = heads;
  w.groups = (heads + kHeadsPerTile - 1) / kHeadsPerTile;
  walk_begin(w, first);

  // ring[0] is computed now; ring[1..kStages-1] are in flight.
  Tile ring[kStages];
#pragma unroll
  for (int s = 0; s < kStages; s++) {
    ring[s] = walk_tile(w);
    if (!w.done) walk_next(w);
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; s++) {
    if (ring[s].rows) load_tile(smem + s * kStageElems, q, k, v, dout, row_stride, ring[s]);
@if ROTARY_TABLE@
    if (ring[s].rows) load_table(smem + s * kStageElems, rotary_table, ring[s]);
@endif@
    cp_async_commit();
  }

  for (long long n = 0; ring[0].rows; n++) {
    // Refill the stage the previous step used, once every warp is done with it.
    __syncthreads();
    if (ring[kStages - 1].rows)
      load_tile(smem + ((n + kStages - 1) % kStages) * kStageElems, q, k, v, dout, row_stride,
                ring[kStages - 1]);
@if ROTARY_TABLE@
    if (ring[kStages - 1].rows)
      load_table(smem + ((n + kStages - 1) % kStages) * kStageElems, rotary_table,
                 ring[kStages - 1]);
@endif@
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncthreads();

    unsigned short *stage = smem + (n % kStages) * kStageElems;
@if ROTARY@
    // Rotate the tile in place; every warp then reads rows others rotated.
    rotate_tile(stage, ring[0]);
    __syncthreads();
@endif@
    const int warp = threadIdx.x >> 5;
    // Phase 1: (head, 16 query rows) jobs write P and dS.
#pragma unroll 1
    for (int job = warp; job < kJobs; job += kWarps) {
      int h = job / kRowTiles, row0 = job % kRowTiles * 16;
      if (row0 < ring[0].rows && h < ring[0].heads)
        score_grads(stage, p_smem + h * kPElems, ds_smem + h * kPElems, ring[0], h, row0);
    }
    // Every warp's P and dS rows are in; V is read no more.
    __syncthreads();
    // Phase 2: (head, 16-row tile) jobs: dV and dK of those key rows, dQ of
    // those query rows.
#pragma unroll 1
    for (int job = warp; job < kJobs; job += kWarps) {
      int h = job / kRowTiles, row0 = job % kRowTiles * 16;
      if (row0 < ring[0].rows && h < ring[0].heads)
        grads(stage, p_smem + h * kPElems, ds_smem + h * kPElems, ring[0], h, row0, dq, dk, dv,
              row_stride);
    }

#pragma unroll
    for (int s = 0; s < kStages - 1; s++) ring[s] = ring[s + 1];
    ring[kStages - 1] = walk_tile(w);
    if (!w.done) walk_next(w);
  }
  cp_async_wait<0>();
}
/* ---- end kernel ---- */
@if IN_NAMESPACE@

}  // namespace bwd
@endif@
