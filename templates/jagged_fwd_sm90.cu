@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_fwd_sm90.cu: jagged (varlen) attention forward on sm_90a: both
@# products on wgmma, one warpgroup per 64 query rows, K and V tiles shared
@# by the CTA's warpgroups. Compiled for sm_90a only (the plan picks it
@# there; jagged_fwd.cu is the portable forward).
@# Placeholders: @KERNEL_NAME@ @HEAD_DIM@ (64 | 128) @BLOCK_M@ (query rows
@#   per CTA, 64 per warpgroup) @BLOCK_N@ (keys per KV tile, a multiple of
@#   64) @STAGES@ (KV tiles resident, >= 3: a tile's stage is refilled two
@#   tiles later, once both products that read it are done) @SMEM_BYTES@
@#   (= (BLOCK_M + 2 * STAGES * BLOCK_N) * HEAD_DIM * 2) @SCALE_LOG2@
@#   @SCALE_TEXT@ @MMA_TYPE@ @PAIR_TYPE@ @CAUSAL@ @WINDOW@ @WINDOW_LEFT@
@#   @WINDOW_RIGHT@ @BROADCAST@ (as in jagged_fwd.cu).
@# Conditions: ROTARY, ROTARY_TABLE (as in jagged_fwd.cu; not with
@#   BROADCAST, and BLOCK_M == BLOCK_N: the Q and K/V tiles share one layout
@#   for the rotation). Includes: jagged_fwd_sm90_consts.cuh (with
@#   jagged_fwd_band.cuh), jagged_fwd_sm90_parts.cuh (mma_sm80.cuh,
@#   wgmma_sm90.cuh, jagged_walk.cuh, jagged_fwd_span.cuh,
@#   jagged_fwd_wgmma.cuh); with ROTARY unpack2.cuh and jagged_rotary.cuh.
@# Host rule and parameters: as jagged_fwd.cu's, with 128 * BLOCK_M / 64
@#   threads.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "this forward is planned for sm_90a only (wgmma)"
#endif
/* ---- begin constants ---- */
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kBlockM = @BLOCK_M@;  // query rows per CTA
constexpr int kBlockN = @BLOCK_N@;  // keys per KV tile
constexpr int kWarpgroups = kBlockM / 64;  // each owns 64 query rows
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kStages = @STAGES@;  // KV tiles resident
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
@include jagged_fwd_sm90_consts.cuh@
static_assert(kBlockM % 64 == 0 && kWarpgroups <= 2 && kBlockN % 64 == 0 && kBlockN <= 128,
              "warpgroups of 64 query rows; KV tiles of 64 or 128 keys");
static_assert(kStages >= 3, "a stage is refilled two tiles after its tile was computed");
static_assert(!(kBroadcast && @ROTARY@), "rotary embeddings with a broadcast Q are not planned");
/* ---- end constants ---- */

@include jagged_fwd_sm90_parts.cuh@

@if ROTARY@

@include unpack2.cuh@

// Element offset of chunk `chunk` of tile row `row` (the rotation's view
// of chunk_at: the Q tile and the K, V tiles have the same rows).
__device__ __forceinline__ int swizzle(int row, int chunk) {
  static_assert(kBlockM == kBlockN, "one layout for the Q and the K, V tiles");
  return (int)(chunk_at(kBlockN, row, chunk) / 2);
}

@include jagged_rotary.cuh@
@endif@

// Wait for this warpgroup's running P V (O += P V of the last tile).
__device__ __forceinline__ void retire_pv(float (&acc)[kHalves][8][4],
                                          const unsigned (&p16)[kBlockN / 16][4]) {
  wgmma_wait<0>();
#pragma unroll
  for (int hh = 0; hh < kHalves; hh++) wgmma_hold(acc[hh]);
  keep(p16);
}

// 1024-byte aligned: the swizzle's 8-row atoms start at multiples of 1024.
extern __shared__ __align__(1024) unsigned short smem[];

/* ---- begin kernel ----
 * One CTA per (virtual q tile, head), taken in reverse as jagged_fwd.cu
 * does. Warpgroup w owns query rows 64w..64w+63 of the tile. Per KV tile
 * (last first, one barrier each): S = Q K^T on wgmma (both operands in
 * shared memory), the wait for it also retires the previous tile's P V;
 * the online softmax in registers (this thread holds rows 16 (warp % 4) +
 * g and + 8 of its warpgroup's, key columns 64 h + 8n + 2tq, +1); O
 * rescaled; then O += P V issued (P from registers) and left running into
 * the next tile's barrier and S. The stage a tile's load refills is the
 * one of two tiles back, whose products every warpgroup has retired. */
extern "C" __global__ void __launch_bounds__(kThreads, 1)
@KERNEL_NAME@(@PARAMS@) {
  const long long vt = num_tiles - 1 - (long long)blockIdx.x;
  const int h = blockIdx.y;
  const JaggedTile jt =
      kBroadcast ? broadcast_tile<kBlockM>(cu_seqlens_k, batch, total_q, vt)
                 : jagged_find<kBlockM>(cu_seqlens_q, cu_seqlens_k, batch, total_q, vt);
  if (!jt.valid) return;  // the same answer in every warp
  const QuerySpan span = query_span(jt, total_k, h, heads, kv_heads);
  const long long k_start = span.k_start, lk = span.lk, m0 = span.m0, shift = span.shift;
  const int rows = span.rows, n_first = span.n_first, n_tiles = span.n_tiles, kvh = span.kvh;
  const long long q_stride = span.q_stride, kv_stride = span.kv_stride;

  const unsigned short *q_src = q + span.q_row0 * q_stride + (long long)h * kHeadDim;
  const unsigned short *k_src = k + k_start * kv_stride + (long long)kvh * kHeadDim;
  const unsigned short *v_src = v + k_start * kv_stride + (long long)kvh * kHeadDim;
  const unsigned q_a = smem_addr(smem), kv_a = q_a + kQBytes;
  // KV tile i of the walk is key tile n_first + n_tiles - 1 - i (last first).
  auto load_kv = [&](int i) {
    const long long n0 = (long long)(n_first + n_tiles - 1 - i) * kBlockN;
    const int valid = (int)(lk - n0 < kBlockN ? lk - n0 : kBlockN);
    const unsigned st = kv_a + (i % kStages) * 2 * kKvBytes;
    load_rows<kBlockN, kThreads>(st, k_src + n0 * kv_stride, kv_stride, valid);
    load_rows<kBlockN, kThreads>(st + kKvBytes, v_src + n0 * kv_stride, kv_stride, valid);
  };
  if (n_tiles > 0) {
    load_rows<kBlockM, kThreads>(q_a, q_src, q_stride, rows);
    load_kv(0);
  }
  cp_async_commit();

  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int wrow0 = 64 * wg;  // this warpgroup's first row of the tile
  const int r_lo = wrow0 + 16 * warp + g;  // this thread's rows: r_lo, r_lo + 8
  float acc[kHalves][8][4];
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
    for (int n = 0; n < 8; n++) acc[hh][n][0] = acc[hh][n][1] = acc[hh][n][2] = acc[hh][n][3] = 0.f;
  unsigned p16[kBlockN / 16][4];  // P of the tile whose P V is running, as A fragments

#pragma unroll 1
  for (int i = 0; i < n_tiles; i++) {
    cp_async_wait<0>();  // this tile (and, first, Q) has landed
    fence_proxy_async();  // it is read by wgmma (the async proxy)
    __syncthreads();  // for every thread; and every warpgroup has retired tile i - 2
    if (i + 1 < n_tiles) load_kv(i + 1);
    cp_async_commit();
    const unsigned k_s = kv_a + (i % kStages) * 2 * kKvBytes, v_s = k_s + kKvBytes;
    const long long n0 = (long long)(n_first + n_tiles - 1 - i) * kBlockN;
    const int kv_valid = (int)(lk - n0 < kBlockN ? lk - n0 : kBlockN);
@if ROTARY@
    {
      // Rotate the tile's keys (values) where they landed, and the queries
      // with the first tile (the running P V reads another stage); the
      // writes are fenced for wgmma's reads, and every warpgroup waits.
@if ROTARY_TABLE@
      const RotaryRows rq = {0, rotary_table + (jt.start + m0) * kHeadDim};
      const RotaryRows rk = {0, rotary_table_k + (k_start + n0) * kHeadDim};
@else@
      const RotaryRows rq = {m0 + shift, nullptr}, rk = {n0, nullptr};
@endif@
      unsigned short *const tile = smem + (kQBytes + (i % kStages) * 2 * kKvBytes) / 2;
      if (kRotateQ && i == 0) rotate_rows(smem, nullptr, rows, rq);
      if constexpr (kRotateK || kRotateV)
        rotate_rows(kRotateK ? tile : nullptr, kRotateV ? tile + kKvBytes / 2 : nullptr, kv_valid,
                    rk);
      fence_proxy_async();
      __syncthreads();
    }
@endif@
    // Key column c of tile row r is visible when r + diag_lo <= c <= r +
    // diag_hi; both clamped to where they change nothing inside a tile.
    constexpr long long kFar = kBlockM + kBlockN + 1;
    const long long dhi = m0 + shift + kRight - n0, dlo = m0 + shift - kLeft - n0;
    const int diag_hi = (int)(dhi > kFar ? kFar : (dhi < -kFar ? -kFar : dhi));
    const int diag_lo = (int)(dlo > kFar ? kFar : (dlo < -kFar ? -kFar : dlo));
    bool mask = kv_valid < kBlockN;
    if constexpr (kHasRight) mask = mask || diag_hi < kBlockN - 1;  // row 0 misses a key
    if constexpr (kHasLeft) mask = mask || (rows - 1) + diag_lo > 0;  // last row misses key 0
    // A warpgroup skips a tile none of its real rows sees a key of (as a
    // tile all masked would leave m, l and O): rows past the end, the
    // band's far side. Warpgroup-uniform; it still retires its running
    // P V, whose stage the next tile's load refills.
    bool skip = wrow0 >= rows;
    if constexpr (kHasRight) skip = skip || wrow0 + 63 + diag_hi < 0;
    if constexpr (kHasLeft) skip = skip || wrow0 + diag_lo > kBlockN - 1;
    if (skip) {
      retire_pv(acc, p16);
      continue;
    }

    // S = Q K^T for this warpgroup's 64 rows, kKeyHalves parts of 64 keys.
    float s[kKeyHalves][8][4];
    wgmma_fence();
    issue_s(s, q_a, k_s, wrow0);
    wgmma_wait<0>();  // S, and the last tile's P V
#pragma unroll
    for (int nh = 0; nh < kKeyHalves; nh++) wgmma_hold(s[nh]);
#pragma unroll
    for (int hh = 0; hh < kHalves; hh++) wgmma_hold(acc[hh]);
    if (i > 0) keep(p16);

    if (mask) {
#pragma unroll
      for (int nh = 0; nh < kKeyHalves; nh++)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int r = r_lo + (e >= 2 ? 8 : 0);
            const int col = 64 * nh + n * 8 + 2 * tq + (e & 1);
            bool hide = col >= kv_valid;
            if constexpr (kHasRight) hide = hide || col > r + diag_hi;
            if constexpr (kHasLeft) hide = hide || col < r + diag_lo;
            if (hide) s[nh][n][e] = neg_inf();
          }
    }
    // Tile row maxima (each row lives in the 4 lanes of a quad), new maxima.
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nh = 0; nh < kKeyHalves; nh++)
#pragma unroll
      for (int n = 0; n < 8; n++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[nh][n][0], s[nh][n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[nh][n][2], s[nh][n][3]));
      }
    float off[2], alpha[2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
      mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
      // A row that has seen no key yet keeps max -inf: offset 0 then, so
      // that exp2(-inf - offset) is 0, never NaN.
      off[hh] = mx[hh] == neg_inf() ? 0.f : mx[hh] * kScaleLog2;
      alpha[hh] = fast_exp2(m[hh] * kScaleLog2 - off[hh]);  // m = -inf: 0
      m[hh] = mx[hh];
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int nh = 0; nh < kKeyHalves; nh++)
#pragma unroll
      for (int n = 0; n < 8; n++) {
        s[nh][n][0] = fast_exp2(fmaf(s[nh][n][0], kScaleLog2, -off[0]));
        s[nh][n][1] = fast_exp2(fmaf(s[nh][n][1], kScaleLog2, -off[0]));
        s[nh][n][2] = fast_exp2(fmaf(s[nh][n][2], kScaleLog2, -off[1]));
        s[nh][n][3] = fast_exp2(fmaf(s[nh][n][3], kScaleLog2, -off[1]));
        rs[0] += s[nh][n][0] + s[nh][n][1];
        rs[1] += s[nh][n][2] + s[nh][n][3];
      }
    l[0] = l[0] * alpha[0] + rs[0];
    l[1] = l[1] * alpha[1] + rs[1];
    rescale(acc, alpha);
    // O += P V, left running into the next tile's barrier and S.
    pack_p(p16, s);
    wgmma_fence();
    issue_pv(acc, p16, v_s);
  }
  retire_pv(acc, p16);
  cp_async_wait<0>();

  // Normalise; stage the rows in the Q tile's place (every warpgroup is
  // done with Q after the barrier) as plain rows, 16-byte chunks swizzled
  // by the row, so that the global stores are 16-byte and coalesced.
  __syncthreads();
  unsigned short *const stage = smem;
  unsigned *const stage32 = reinterpret_cast<unsigned *>(stage);
  float inv[2], lrow[2];
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    float t = l[hh];
    t += __shfl_xor_sync(0xffffffffu, t, 1);
    t += __shfl_xor_sync(0xffffffffu, t, 2);
    lrow[hh] = t;
    inv[hh] = t > 0.f ? 1.f / t : 0.f;  // no key: O = 0
  }
  const int r_hi = r_lo + 8;
#pragma unroll
  for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
    for (int n = 0; n < 8; n++) {
      const int c = 8 * hh + n;  // the 16-byte chunk of the row
      stage32[(r_lo * kHeadDim + ((c ^ (r_lo & 7)) * 8) + 2 * tq) / 2] =
          pack2(acc[hh][n][0] * inv[0], acc[hh][n][1] * inv[0]);
      stage32[(r_hi * kHeadDim + ((c ^ (r_hi & 7)) * 8) + 2 * tq) / 2] =
          pack2(acc[hh][n][2] * inv[1], acc[hh][n][3] * inv[1]);
    }
  if (tq == 0 && lse != nullptr) {  // lse is optional (inference)
    // LSE = ln(sum_j exp(scale * s_j)) = (m * scale * log2 e + log2 l) * ln 2.
    constexpr float kLn2 = 0.693147180559945309f;
    float *lse_row = lse + (long long)h * total_q + jt.start + m0;
    if (r_lo < rows)
      lse_row[r_lo] = lrow[0] > 0.f ? (m[0] * kScaleLog2 + fast_log2(lrow[0])) * kLn2 : neg_inf();
    if (r_hi < rows)
      lse_row[r_hi] = lrow[1] > 0.f ? (m[1] * kScaleLog2 + fast_log2(lrow[1])) * kLn2 : neg_inf();
  }
  __syncthreads();
  unsigned short *out = o + (jt.start + m0) * q_stride + (long long)h * kHeadDim;
#pragma unroll
  for (int it = 0; it < kBlockM * kChunks / kThreads; it++) {
    const int idx = threadIdx.x + it * kThreads;
    const int row = idx / kChunks, chunk = idx % kChunks;
    if (row < rows)
      *reinterpret_cast<uint4 *>(out + row * q_stride + chunk * 8) =
          *reinterpret_cast<const uint4 *>(stage + row * kHeadDim + ((chunk ^ (row & 7)) * 8));
  }
}
/* ---- end kernel ---- */
