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
@# Conditions: ROTARY, ROTARY_TABLE (as in jagged_fwd.cu, BROADCAST too;
@#   with BLOCK_M == BLOCK_N: the Q and K/V tiles share one layout for the
@#   rotation). Includes: jagged_fwd_sm90_consts.cuh (with
@#   jagged_fwd_band.cuh), jagged_fwd_sm90_parts.cuh (mma_sm80.cuh,
@#   copy_rows.cuh, wgmma_sm90.cuh, jagged_walk.cuh, jagged_fwd_span.cuh,
@#   jagged_fwd_wgmma.cuh); with ROTARY unpack2.cuh and jagged_rotary.cuh.
@# Host rule and parameters: as jagged_fwd.cu's, with 128 * BLOCK_M / 64
@#   threads.
/* ---- begin constants ---- */
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kBlockM = @BLOCK_M@;  // query rows per CTA
constexpr int kBlockN = @BLOCK_N@;  // keys per KV tile
constexpr int kWarpgroups = kBlockM / 64;  // each owns 64 query rows
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kStages = @STAGES@;  // KV tiles resident
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
@include jagged_fwd_sm90_consts.cuh@
static_assert((kBlockM + 2 * kStages * kBlockN) * kHeadDim * 2 == kSmemBytes,
              "the plan's shared memory is the Q tile and the K/V stages");
static_assert(kBlockM % 64 == 0 && kWarpgroups <= 2 && kBlockN % 64 == 0 && kBlockN <= 128,
              "warpgroups of 64 query rows; KV tiles of 64 or 128 keys");
static_assert(kStages >= 3, "a stage is refilled two tiles after its tile was computed");
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
 * the online softmax in registers (this thread holds rows r_lo and r_lo +
 * 8 of its warpgroup's, row_place, key columns 64 h + 8n + 2tq, +1); O
 * rescaled; then O += P V issued (P from registers) and left running into
 * the next tile's barrier and S. The stage a tile's load refills is the
 * one of two tiles back, whose products every warpgroup has retired. */
extern "C" __global__ void __launch_bounds__(kThreads, 1)
@KERNEL_NAME@(@PARAMS@) {
  const int h = blockIdx.y;
  const JaggedTile jt = cta_query_tile(cu_seqlens_q, cu_seqlens_k, batch, total_q, num_tiles);
  if (!jt.valid) return;  // the same answer in every warp
  const QuerySpan span = query_span(jt, total_k, h, heads, kv_heads);

  const unsigned short *q_src = q + span.q_at;
  const unsigned short *k_src = k + span.kv_at;
  const unsigned short *v_src = v + span.kv_at;
  const unsigned q_a = smem_addr(smem), kv_a = q_a + kQBytes;
  // KV tile i of the walk is key tile n_first + n_tiles - 1 - i (last first).
  auto load_kv = [&](int i) {
    const long long n0 = (long long)(span.n_first + span.n_tiles - 1 - i) * kBlockN;
    const int valid = (int)(span.lk - n0 < kBlockN ? span.lk - n0 : kBlockN);
    const unsigned st = kv_a + (i % kStages) * 2 * kKvBytes;
    load_rows<kBlockN, kThreads>(st, k_src + n0 * span.kv_stride, span.kv_stride, valid);
    load_rows<kBlockN, kThreads>(st + kKvBytes, v_src + n0 * span.kv_stride, span.kv_stride,
                                 valid);
  };
  if (span.n_tiles > 0) {
    load_rows<kBlockM, kThreads>(q_a, q_src, span.q_stride, span.rows);
    load_kv(0);
  }
  cp_async_commit();

  const RowPlace me = row_place(threadIdx.x);  // rows r_lo, r_lo + 8 of the warpgroup's
  const int tq = me.tq, wrow0 = me.wrow0, r_lo = me.r_lo;
  float acc[kHalves][8][4];
  clear_out(acc);
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  unsigned p16[kBlockN / 16][4];  // P of the tile whose P V is running, as A fragments

#pragma unroll 1
  for (int i = 0; i < span.n_tiles; i++) {
    cp_async_wait<0>();  // this tile (and, first, Q) has landed
    fence_proxy_async();  // it is read by wgmma (the async proxy)
    __syncthreads();  // for every thread; and every warpgroup has retired tile i - 2
    if (i + 1 < span.n_tiles) load_kv(i + 1);
    cp_async_commit();
    const unsigned k_s = kv_a + (i % kStages) * 2 * kKvBytes, v_s = k_s + kKvBytes;
    const long long n0 = (long long)(span.n_first + span.n_tiles - 1 - i) * kBlockN;
    // The tile's real keys, band diagonals and mask.
    const TileView t = tile_view(n0, span.lk, span.m0 + span.shift, span.rows);
@if ROTARY@
    {
      // Rotate the tile's keys (values) where they landed, and the queries
      // with the first tile (the running P V reads another stage); the
      // writes are fenced for wgmma's reads, and every warpgroup waits.
      // (A broadcast Q's row i: position i, the table's row i, whatever the
      // sequence.)
@if ROTARY_TABLE@
      const RotaryRows rq = {0, rotary_table + ((kBroadcast ? 0 : jt.start) + span.m0) * kHeadDim};
      const RotaryRows rk = {0, rotary_table_k + (span.k_start + n0) * kHeadDim};
@else@
      const RotaryRows rq = {kBroadcast ? span.m0 : span.m0 + span.shift, nullptr};
      const RotaryRows rk = {n0, nullptr};
@endif@
      unsigned short *const tile = smem + (kQBytes + (i % kStages) * 2 * kKvBytes) / 2;
      if (kRotateQ && i == 0) rotate_rows(smem, nullptr, span.rows, rq);
      if constexpr (kRotateK || kRotateV)
        rotate_rows(kRotateK ? tile : nullptr, kRotateV ? tile + kKvBytes / 2 : nullptr, t.kv_valid,
                    rk);
      fence_proxy_async();
      __syncthreads();
    }
@endif@
    // A warpgroup skips a tile none of its real rows sees a key of (as a
    // tile all masked would leave m, l and O): rows past the end, the
    // band's far side. Warpgroup-uniform; it still retires its running
    // P V, whose stage the next tile's load refills.
    bool skip = wrow0 >= span.rows;
    if constexpr (kHasRight) skip = skip || wrow0 + 63 + t.diag_hi < 0;
    if constexpr (kHasLeft) skip = skip || wrow0 + t.diag_lo > kBlockN - 1;
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
    float alpha[2];
    softmax_step(s, m, l, alpha, t, r_lo, tq);
    rescale(acc, alpha);
    // O += P V, left running into the next tile's barrier and S.
    pack_p(p16, s);
    wgmma_fence();
    issue_pv(acc, p16, v_s);
  }
  retire_pv(acc, p16);
  cp_async_wait<0>();

  // Normalise; stage the rows in the Q tile's place (every warpgroup is
  // done with Q after the barrier), then store them, 16 bytes a copy.
  __syncthreads();
  stage_out(acc, m, l, smem, lse, h, total_q, jt.start, span.m0, span.rows, r_lo, tq);
  __syncthreads();
  store_out<kThreads>(o + span.o_at, span.q_stride, smem, span.rows, (int)threadIdx.x);
}
/* ---- end kernel ---- */
