@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_fwd.cu: jagged (varlen) attention forward, FlashAttention-2 style,
@# mma.sync path (sm_80+, also compiled for sm_90a).
@# Placeholders: @KERNEL_NAME@ @HEAD_DIM@ (64 | 128) @BLOCK_M@ (query rows per
@#   CTA) @BLOCK_N@ (keys per KV tile) @WARPS@ (BLOCK_M is a multiple of
@#   16 * WARPS: each warp owns BLOCK_M / WARPS rows) @STAGES@ (KV tiles
@#   resident, >= 2) @MIN_CTAS@ @SMEM_BYTES@ (= (BLOCK_M + 2 * STAGES *
@#   BLOCK_N) * HEAD_DIM * 2) @SCALE_LOG2@ (scale * log2(e), a float literal)
@#   @SCALE_TEXT@ (the scale as the spec gave it, for a comment) @MMA_TYPE@
@#   @PAIR_TYPE@ (see mma_sm80.cuh) @CAUSAL@ (0 | 1) @WINDOW@ (0 | 1)
@#   @WINDOW_LEFT@ @WINDOW_RIGHT@ (integers; a negative one leaves its side
@#   unbounded; with CAUSAL the right one must be 0 or negative) @BROADCAST@
@#   (0 | 1: one dense Q of n_q = total_q / batch rows shared by every
@#   sequence; sequence b's output and lse rows at b * n_q).
@# Conditions: ROTARY (rotary embeddings: jagged_rotary.cuh's conditions and
@#   placeholders; with BROADCAST query row i of the shared Q is at the
@#   fixed position i, or reads row i of the queries' table), ROTARY_TABLE
@#   (its positions from tables); other features are picked with if
@#   constexpr.
@# Includes: jagged_fwd_band.cuh, mma_sm80.cuh, copy_rows.cuh, jagged_walk.cuh,
@#   jagged_fwd_span.cuh; with ROTARY
@#   unpack2.cuh and jagged_rotary.cuh.
@# Host rule: grid (batch + total_q / BLOCK_M, heads, 1) (integer division; the
@#   same number is the kernel's num_tiles); with BROADCAST (batch *
@#   ceil(n_q / BLOCK_M), heads, 1), block WARPS * 32 threads, dynamic
@#   shared memory SMEM_BYTES (over 48 KiB: set the function's max dynamic
@#   shared memory attribute).
@# Parameters: q [total_q, heads, HEAD_DIM] (BROADCAST: [n_q, heads,
@#   HEAD_DIM], and cu_seqlens_q is not read), k and v [total_k, kv_heads,
@#   HEAD_DIM] (16-bit), o like q, lse [heads, total_q] fp32 (natural log),
@#   cu_seqlens_q and cu_seqlens_k [batch + 1] int32 (may be one pointer);
@#   with ROTARY_TABLE, after lse, rotary_table [total_q, HEAD_DIM] (BROADCAST:
@#   [n_q, HEAD_DIM]) and rotary_table_k [total_k, HEAD_DIM] (sin, then
@#   cos, per token).
/* ---- begin constants ---- */
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kBlockM = @BLOCK_M@;  // query rows per CTA
constexpr int kBlockN = @BLOCK_N@;  // keys per KV tile
constexpr int kWarps = @WARPS@;  // warps per CTA
constexpr int kThreads = kWarps * 32;
constexpr int kStages = @STAGES@;  // KV tiles resident (one computed, the rest in flight)
constexpr int kMinCtasPerSm = @MIN_CTAS@;  // launch bound: registers fit this many CTAs
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
@include jagged_fwd_band.cuh@

constexpr int kWarpRows = kBlockM / kWarps;  // query rows per warp
constexpr int kMTiles = kWarpRows / 16;  // 16-row m-tiles per warp
constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
constexpr int kKeyTiles = kBlockN / 8;  // n-tiles of S = Q K^T
constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of O = P V
constexpr int kQElems = kBlockM * kHeadDim;  // the Q tile (and the O staging)
constexpr int kKvElems = kBlockN * kHeadDim;  // one K or V tile
constexpr int kStageElems = 2 * kKvElems;  // K then V
// Warps skip KV tiles none of their real rows sees (rows past the sequence
// end, the band's far side). At head_dim 128 the skip's registers made
// ptxas spill and cost 8-10% on the H200 (measured), so only at 64.
constexpr bool kWarpSkip = kHeadDim <= 64;
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
static_assert(kWarpRows * kWarps == kBlockM && kMTiles * 16 == kWarpRows && kMTiles >= 1,
              "each warp owns whole 16-row m-tiles");
static_assert(kBlockN % 16 == 0 && kStages >= 2, "KV tiles of 16-key slices, double buffered");
static_assert(kThreads % kChunks == 0 && kBlockN % (kThreads / kChunks) == 0 &&
                  kBlockM % (kThreads / kChunks) == 0,
              "a pass of the CTA's loads covers whole rows of a tile");
static_assert((kQElems + kStages * kStageElems) * 2 == kSmemBytes,
              "the plan's shared memory is the Q tile and the K/V stages");
/* ---- end constants ---- */

@include mma_sm80.cuh@

@include copy_rows.cuh@

@include jagged_walk.cuh@

@include jagged_fwd_span.cuh@

/* ---- begin tile layout and loads ----
 * Tiles are row-major, kHeadDim elements a row, with 16-byte chunks
 * XOR-swizzled by the row (chunk c of row r sits at c ^ (r % 8)), so the 8
 * row addresses of an ldmatrix hit 8 different bank groups. */
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) * 8);
}

// log2 on the special-function unit.
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Start the copy of kRows tile rows from src (row stride `stride`
// elements) into `tile`; rows past `valid` are zero-filled, never read.
template <int kRows>
__device__ __forceinline__ void load_rows(unsigned short *tile, const unsigned short *src,
                                          long long stride, int valid) {
  copy_rows<kRows, kChunks, kThreads>(smem_addr(tile), src, stride, valid,
                                      [](int row, int c) { return 2u * swizzle(row, c); });
}
/* ---- end tile layout and loads ---- */
@if ROTARY@

@include unpack2.cuh@

@include jagged_rotary.cuh@
@endif@

/* ---- begin one KV tile ----
 * S = Q K^T for this warp's kMTiles x 16 rows and the tile's kBlockN keys,
 * then the online softmax (running row max m in raw S units, running row
 * sum l per thread, reduced over the quad at the end), then O += P V with P
 * reused from registers as the A operand. This thread holds rows
 * r_lo = g and r_hi = g + 8 of each m-tile, key columns 8n + 2tq, +1.
 * kMask: the tile needs the length or band mask; `diag_lo` / `diag_hi`
 * bound the visible keys: key column c of tile row r is visible when
 * r + diag_lo <= c <= r + diag_hi and c < kv_valid. */
template <bool kMask>
__device__ __forceinline__ void kv_tile(unsigned q_s, unsigned k_s, unsigned v_s, int wrow0,
                                        float (&acc)[kMTiles][kDimTiles][4],
                                        float (&m)[kMTiles][2], float (&l)[kMTiles][2],
                                        int kv_valid, int diag_lo, int diag_hi) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  float s[kMTiles][kKeyTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; mt++)
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; kk++) {
    unsigned a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; mt++)
      ldmatrix_x4(a[mt], q_s + swizzle(wrow0 + 16 * mt + (lane & 15), 2 * kk + (lane >> 4)) * 2);
#pragma unroll
    for (int n = 0; n < kKeyTiles; n += 2) {
      unsigned b[4];
      ldmatrix_x4(b, k_s + swizzle(n * 8 + (lane & 7) + ((lane >> 4) << 3),
                                2 * kk + ((lane >> 3) & 1)) * 2);
#pragma unroll
      for (int mt = 0; mt < kMTiles; mt++) {
        mma_16816(s[mt][n], a[mt], b[0], b[1]);
        mma_16816(s[mt][n + 1], a[mt], b[2], b[3]);
      }
    }
  }

#pragma unroll
  for (int mt = 0; mt < kMTiles; mt++) {
    if constexpr (kMask) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = wrow0 + 16 * mt + g + (e >= 2 ? 8 : 0);
          const int col = n * 8 + 2 * tq + (e & 1);
          bool hide = col >= kv_valid;
          if constexpr (kHasRight) hide = hide || col > r + diag_hi;
          if constexpr (kHasLeft) hide = hide || col < r + diag_lo;
          if (hide) s[mt][n][e] = neg_inf();
        }
    }
    // Tile row maxima (each row lives in the 4 lanes of a quad), new maxima.
    float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++) {
      mx[0] = fmaxf(mx[0], fmaxf(s[mt][n][0], s[mt][n][1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[mt][n][2], s[mt][n][3]));
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
    float off[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      // A row that has seen no key yet keeps max -inf: offset 0 then, so
      // that exp2(-inf - offset) is 0, never NaN. Unmasked tiles are finite.
      off[h] = (kMask && mx[h] == neg_inf()) ? 0.f : mx[h] * kScaleLog2;
      alpha[h] = fast_exp2(m[mt][h] * kScaleLog2 - off[h]); // m = -inf: 0
      m[mt][h] = mx[h];
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++)
      exp2_tile(s[mt][n], kScaleLog2, off[0], off[1], rs[0], rs[1]);
    l[mt][0] = l[mt][0] * alpha[0] + rs[0];
    l[mt][1] = l[mt][1] * alpha[1] + rs[1];
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) {
      acc[mt][n][0] *= alpha[0];
      acc[mt][n][1] *= alpha[0];
      acc[mt][n][2] *= alpha[1];
      acc[mt][n][3] *= alpha[1];
    }
  }

  // O += P V: the accumulators of key tiles 2j, 2j+1 are the A fragment of
  // key slice j.
#pragma unroll
  for (int j = 0; j < kBlockN / 16; j++) {
    unsigned a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; mt++) {
      a[mt][0] = pack2(s[mt][2 * j][0], s[mt][2 * j][1]);
      a[mt][1] = pack2(s[mt][2 * j][2], s[mt][2 * j][3]);
      a[mt][2] = pack2(s[mt][2 * j + 1][0], s[mt][2 * j + 1][1]);
      a[mt][3] = pack2(s[mt][2 * j + 1][2], s[mt][2 * j + 1][3]);
    }
#pragma unroll
    for (int n = 0; n < kDimTiles; n += 2) {
      unsigned b[4];
      ldmatrix_x4_trans(b, v_s + swizzle(16 * j + (lane & 7) + (((lane >> 3) & 1) << 3),
                                      n + (lane >> 4)) * 2);
#pragma unroll
      for (int mt = 0; mt < kMTiles; mt++) {
        mma_16816(acc[mt][n], a[mt], b[0], b[1]);
        mma_16816(acc[mt][n + 1], a[mt], b[2], b[3]);
      }
    }
  }
}
/* ---- end one KV tile ---- */

/* ---- begin kernel ----
 * One CTA per (virtual q tile, head): grid (batch + total_q / kBlockM,
 * heads). Virtual tiles are taken in reverse, so a sequence's last q tile
 * (the most keys under a causal mask) starts first. The CTA works out the
 * tile's key range up front (the band's keys for its first and last rows),
 * walks its KV tiles from the last to the first with kStages resident.
 * Each warp masks only tiles where one of its real rows misses a key (the
 * sequence end, the band's edges) and skips tiles where none of its real
 * rows sees one (rows past the sequence end, the far side of the band). */
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@(@PARAMS@) {
  extern __shared__ __align__(128) unsigned short smem[];
  const int h = blockIdx.y;
  const JaggedTile jt = cta_query_tile(cu_seqlens_q, cu_seqlens_k, batch, total_q, num_tiles);
  if (!jt.valid) return;  // the same answer in every warp
  const QuerySpan span = query_span(jt, total_k, h, heads, kv_heads);
  const long long lk = span.lk, m0 = span.m0, shift = span.shift;
  const int rows = span.rows, n_first = span.n_first, n_tiles = span.n_tiles;
  const long long q_stride = span.q_stride, kv_stride = span.kv_stride;

  const unsigned short *q_src = q + span.q_at;
  const unsigned short *k_src = k + span.kv_at;
  const unsigned short *v_src = v + span.kv_at;
  unsigned short *q_tile = smem;
  unsigned short *kv = smem + kQElems;
  // KV tile i of the walk is key tile n_first + n_tiles - 1 - i (last first).
  auto load_kv = [&](int i) {
    const long long n0 = (long long)(n_first + n_tiles - 1 - i) * kBlockN;
    const int valid = (int)(lk - n0 < kBlockN ? lk - n0 : kBlockN);
    unsigned short *st = kv + (i % kStages) * kStageElems;
    load_rows<kBlockN>(st, k_src + n0 * kv_stride, kv_stride, valid);
    load_rows<kBlockN>(st + kKvElems, v_src + n0 * kv_stride, kv_stride, valid);
  };
  if (n_tiles > 0) load_rows<kBlockM>(q_tile, q_src, q_stride, rows);
#pragma unroll
  for (int i = 0; i < kStages - 1; i++) {
    if (i < n_tiles) load_kv(i);
    cp_async_commit();
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int wrow0 = warp * kWarpRows;
  float acc[kMTiles][kDimTiles][4];
  float m[kMTiles][2], l[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; mt++) {
    m[mt][0] = m[mt][1] = neg_inf();
    l[mt][0] = l[mt][1] = 0.f;
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
  }
  const unsigned q_s = smem_addr(q_tile);

#pragma unroll 1
  for (int i = 0; i < n_tiles; i++) {
    __syncthreads(); // every warp is done with the stage the next load refills
    if (i + kStages - 1 < n_tiles) load_kv(i + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncthreads();
    const long long n0 = (long long)(n_first + n_tiles - 1 - i) * kBlockN;
    const int kv_valid = (int)(lk - n0 < kBlockN ? lk - n0 : kBlockN);
@if ROTARY@
    // Rotate the tile's keys (values) where they landed, and the queries
    // with the first tile; every warp reads them after the barrier.
    // (A broadcast Q's row i: position i, the table's row i, whatever the
    // sequence.)
@if ROTARY_TABLE@
    const RotaryRows rq = {0, rotary_table + ((kBroadcast ? 0 : jt.start) + m0) * kHeadDim};
    const RotaryRows rk = {0, rotary_table_k + (span.k_start + n0) * kHeadDim};
@else@
    const RotaryRows rq = {kBroadcast ? m0 : m0 + shift, nullptr}, rk = {n0, nullptr};
@endif@
    if (kRotateQ && i == 0) rotate_rows(q_tile, nullptr, rows, rq);
    if constexpr (kRotateK || kRotateV) {
      unsigned short *st = kv + (i % kStages) * kStageElems;
      rotate_rows(kRotateK ? st : nullptr, kRotateV ? st + kKvElems : nullptr, kv_valid, rk);
    }
    __syncthreads();
@endif@
    const unsigned k_s = smem_addr(kv + (i % kStages) * kStageElems);
    const unsigned v_s = k_s + kKvElems * 2;
    // Key column c of tile row r is visible when r + diag_lo <= c <= r +
    // diag_hi; both clamped to where they change nothing inside a tile.
    constexpr long long kFar = kBlockM + kBlockN + 1;
    const long long dhi = m0 + shift + kRight - n0, dlo = m0 + shift - kLeft - n0;
    const int diag_hi = (int)(dhi > kFar ? kFar : (dhi < -kFar ? -kFar : dhi));
    const int diag_lo = (int)(dlo > kFar ? kFar : (dlo < -kFar ? -kFar : dlo));
    // The CTA masks a tile where some real row misses a key. A warp skips a
    // tile none of its real rows sees a key of (the same as a tile all
    // masked: m, l and O unchanged): rows past the end, the band's far side.
    bool mask = kv_valid < kBlockN;
    if constexpr (kHasRight) mask = mask || diag_hi < kBlockN - 1; // row 0 misses a key
    if constexpr (kHasLeft) mask = mask || (rows - 1) + diag_lo > 0; // last row misses key 0
    bool skip = kWarpSkip && wrow0 >= rows;
    if constexpr (kWarpSkip && kHasRight) skip = skip || wrow0 + kWarpRows - 1 + diag_hi < 0;
    if constexpr (kWarpSkip && kHasLeft) skip = skip || wrow0 + diag_lo > kBlockN - 1;
    if (skip) continue; // warp-uniform; the barriers above are outside
    if (mask)
      kv_tile<true>(q_s, k_s, v_s, wrow0, acc, m, l, kv_valid, diag_lo, diag_hi);
    else
      kv_tile<false>(q_s, k_s, v_s, wrow0, acc, m, l, kv_valid, diag_lo, diag_hi);
  }
  cp_async_wait<0>();

  // Normalise; stage this warp's rows in its own rows of the Q tile (read by
  // no other warp) so that the global stores are 16-byte and coalesced. The
  // warp's lanes read Q above: order those reads first.
  unsigned *stage32 = reinterpret_cast<unsigned *>(q_tile);
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMTiles; mt++) {
    const int r_lo = wrow0 + 16 * mt + g, r_hi = r_lo + 8;
    float inv[2], lrow[2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float t = l[mt][hh];
      t += __shfl_xor_sync(0xffffffffu, t, 1);
      t += __shfl_xor_sync(0xffffffffu, t, 2);
      lrow[hh] = t;
      inv[hh] = t > 0.f ? 1.f / t : 0.f; // no key: O = 0
    }
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) {
      stage32[(swizzle(r_lo, n) + 2 * tq) / 2] = pack2(acc[mt][n][0] * inv[0], acc[mt][n][1] * inv[0]);
      stage32[(swizzle(r_hi, n) + 2 * tq) / 2] = pack2(acc[mt][n][2] * inv[1], acc[mt][n][3] * inv[1]);
    }
    if (tq == 0 && lse != nullptr) { // lse is optional (inference)
      // LSE = ln(sum_j exp(scale * s_j)) = (m * scale * log2 e + log2 l) * ln 2.
      constexpr float kLn2 = 0.693147180559945309f;
      float *lse_row = lse + (long long)h * total_q + jt.start + m0;
      if (r_lo < rows)
        lse_row[r_lo] = lrow[0] > 0.f ? (m[mt][0] * kScaleLog2 + fast_log2(lrow[0])) * kLn2 : neg_inf();
      if (r_hi < rows)
        lse_row[r_hi] = lrow[1] > 0.f ? (m[mt][1] * kScaleLog2 + fast_log2(lrow[1])) * kLn2 : neg_inf();
    }
  }
  __syncwarp();
  unsigned short *out = o + span.o_at;
#pragma unroll
  for (int it = 0; it < kWarpRows * kChunks / 32; it++) {
    const int i = lane + it * 32;
    const int row = wrow0 + i / kChunks, chunk = i % kChunks;
    if (row < rows)
      *reinterpret_cast<uint4 *>(out + row * q_stride + chunk * 8) =
          *reinterpret_cast<const uint4 *>(q_tile + swizzle(row, chunk));
  }
}
/* ---- end kernel ---- */
