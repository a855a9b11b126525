@# SPDX-License-Identifier: BSD-3-Clause
@# broadcast_bwd_sm90.cu: the broadcast-Q backward in one pass on sm_90a
@# (wgmma, warp specialized), for 64 < n_q <= 128 and heads == kv_heads:
@# broadcast_bwd.cu's walk and workspace (a CTA owns every query of one
@# head over a slab of sequences, dQ summed over the slab in registers, dK
@# and dV whole per key tile), its five products per key tile on the
@# warpgroup MMA, split between two query warpgroups and a key warpgroup.
@# Placeholders: @KERNEL_NAME@ @HEAD_DIM@ (64 | 128) @BLOCK_M@ (128: query
@#   rows, two warpgroups of 64) @BLOCK_N@ (64: keys of a tile) @WARPS@ (12:
@#   the two query warpgroups, then the key warpgroup) @STAGES@ (K, V
@#   slots, 2 or more) @MIN_CTAS@ (1) @SMEM_BYTES@ (= 4 * HEAD_DIM *
@#   (BLOCK_M + STAGES * BLOCK_N) + 8 * BLOCK_M * BLOCK_N + 8 * BLOCK_M)
@#   @SCALE@ @SCALE_LOG2@ @SCALE_TEXT@ @MMA_TYPE@ @PAIR_TYPE@ @CAUSAL@
@#   @WINDOW@ @WINDOW_LEFT@ @WINDOW_RIGHT@ (as in jagged_bwd.cu).
@# Conditions: DKV_N128 (jagged_bwd_wgmma.cuh's; here head dim 128, whose
@#   dQ product is one 64x128x16 a k-step).
@# Grid, parameters: as broadcast_bwd.cu's (WARPS * 32 threads); then
@#   jagged_bwd.cu's _dq_sum over the slabs.
@# Includes: jagged_bwd_band.cuh, jagged_bwd_sm90_parts.cuh (wgmma,
@#   mbarriers and register budgets, the tiles and softmax gradients, the
@#   stmatrix store of P and dS, and with DKV_N128 the 64x128 product),
@#   load_rows_sm90.cuh: emitted in a namespace of its own.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "this backward is planned for sm_90a only (wgmma)"
#endif
/* ---- begin broadcast backward constants ---- */
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kBlockM = @BLOCK_M@;  // query rows: every shared query (n_q <= kBlockM)
constexpr int kBlockN = @BLOCK_N@;  // keys of a tile
constexpr int kWarps = @WARPS@;  // warps per CTA: three warpgroups
constexpr int kStages = @STAGES@;  // K, V slots: kStages - 1 tiles load ahead
constexpr int kThreads = kWarps * 32;
constexpr int kCopyThreads = 256;  // the query warpgroups: they copy K, V, Q and dO
constexpr int kMinCtasPerSm = @MIN_CTAS@;  // launch bound
// setmaxnreg budgets: a query warpgroup holds dQ (64 registers at head dim
// 128), S and dP (32 each) and their 16-bit pairs; the key warpgroup one
// 64-column half of dV or dK (32).
constexpr int kQueryRegs = 208, kKeyRegs = 80;
// setmaxnreg moves registers within what the CTA is launched with: 65,536
// / kThreads a thread, rounded down to a multiple of 8 (168 for 384), not
// the SM's 65,536; a budget past it would wait forever in regs_inc.
static_assert(2 * 128 * kQueryRegs + 128 * kKeyRegs <= kThreads * (65536 / kThreads / 8 * 8),
              "the registers the CTA is launched with");
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
@include jagged_bwd_band.cuh@
constexpr bool kBroadcast = true;  // one dense Q shared by every sequence
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
static_assert(kBlockM == 128 && kBlockN == 64 && kWarps == 12 && kMinCtasPerSm == 1,
              "two warpgroups of 64 query rows and a key warpgroup, 64-key tiles");
static_assert(kStages >= 2, "a tile loads while the last one is used");
// Every operand is made of 64-column matrices of 128-byte rows in the
// 128-byte swizzle (wgmma_sm90.cuh): a tile of R rows is kHalves such
// R-row matrices, one per 64 columns of the head.
constexpr int kHalves = kHeadDim / 64;
constexpr int kRowBytes = 128;
constexpr int kQBytes = kBlockM * kHeadDim * 2;  // Q (or dO) of every query
constexpr int kKBytes = kBlockN * kHeadDim * 2;  // K (or V) of a tile
constexpr int kPBytes = kBlockM * kBlockN * 2;   // P (or dS) of a tile: [query][key]
constexpr int kStepOverRows = 16 * kRowBytes;    // a k16 step over 16 rows (MN-major)
// Shared memory: Q, dO, the kStages K, V slots (a ring), two slots of P
// and dS (the query warpgroups write tile n's into slot n % 2 while the key
// warpgroup reads tile n - 1's), then each query row's LSE * log2(e) and D.
constexpr int kRingAt = 2 * kQBytes;
constexpr int kPAt = kRingAt + kStages * 2 * kKBytes;
constexpr int kRowsAt = kPAt + 4 * kPBytes;
static_assert(kRowsAt + 8 * kBlockM == kSmemBytes,
              "the plan's shared memory is Q, dO, the K, V slots, two P, dS slots and two "
              "floats a row");
/* ---- end broadcast backward constants ---- */

@include jagged_bwd_sm90_parts.cuh@

@include load_rows_sm90.cuh@

// 1024-byte aligned: the 128-byte swizzle's 8-row atoms start at
// multiples of 1024.
extern __shared__ __align__(1024) unsigned short smem[];

/* ---- begin the tile's products ---- */
// d = X Y^T over the head: X this warpgroup's 64 query rows (64 wg..) of Q
// or dO at x_a, Y the tile's 64 keys of K or V at y_a: S or dP, rows
// queries and columns keys.
__device__ __forceinline__ void queries_times_keys(float (&d)[8][4], unsigned x_a, unsigned y_a,
                                                   int wg) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; kk++) {
    const unsigned along = kk % 4 * 32;
    wgmma_ss<0, 0>(d, sw128_desc(x_a + kk / 4 * (kQBytes / kHalves) + wg * 64 * kRowBytes, along),
                   sw128_desc(y_a + kk / 4 * (kKBytes / kHalves), along), kk);
  }
}

// dQ += dS K: A this warp's dS pairs (16 query rows by the tile's keys,
// the C layout), B the tile's K rows read MN-major (k over keys).
__device__ __forceinline__ void issue_dq_rs(float (&dq)[kHalves][8][4],
                                            const unsigned (&ds16)[8][2], unsigned k_a) {
#pragma unroll
  for (int j = 0; j < kBlockN / 16; j++) {
    const unsigned a[4] = {ds16[2 * j][0], ds16[2 * j][1], ds16[2 * j + 1][0],
                           ds16[2 * j + 1][1]};
@if DKV_N128@
    wgmma_rs_n128_mn(dq, a, sw128_desc_lbo(k_a, j * kStepOverRows, kKBytes / 2));
@else@
    wgmma_rs<1>(dq[0], a, sw128_desc(k_a, j * kStepOverRows), 1);
@endif@
  }
}

// acc = X^T B for the tile's 64 keys and the head's 64 columns from 64 hh:
// X is P or dS at x_a ([query][key], read MN-major: M over keys, k over
// queries), B is dO or Q (read MN-major) over the first 16 * ksteps
// queries; dV = P^T dO, dK = dS^T Q.
__device__ __forceinline__ void keys_by_queries(float (&acc)[8][4], unsigned x_a, unsigned b_a,
                                                int hh, int ksteps) {
#pragma unroll
  for (int kk = 0; kk < kBlockM / 16; kk++)
    if (kk < ksteps)  // uniform: the rows past n_q are zeros
      wgmma_ss<1, 1>(acc, sw128_desc(x_a, kk * kStepOverRows),
                     sw128_desc(b_a + hh * (kQBytes / kHalves), kk * kStepOverRows), kk);
}
/* ---- end the tile's products ---- */

/* ---- begin kernel ----
 * broadcast_bwd.cu's walk: a CTA owns every query (n_q <= kBlockM) of one
 * head over a slab of sequences (slab_start); Q stays in shared memory; for
 * each sequence the query warpgroups load dO and compute D, then walk the
 * key tiles of the band, K and V streaming through kStages slots. Per
 * tile, query warpgroup w (rows 64 w..) computes S = Q K^T and dP = dO V^T
 * (both operands from shared memory), P and dS in registers, stores them
 * to the tile's P, dS slot and adds dQ += dS K (A from registers); the key
 * warpgroup then computes dV = P^T dO and dK = dS^T Q over every query
 * (both from shared memory) and stores them, while the query warpgroups go
 * on with the next tile: every query is in the CTA, so each key tile's
 * gradients are whole (keys no query sees get 0). Two mbarriers a P, dS
 * slot: full (the query warpgroups' 256 arrivals) and empty (the key
 * warpgroup's 128); and two a K, V slot (the copies' arrivals, and the
 * query threads' once done with the tile), so that the two query
 * warpgroups need not meet: one's softmax runs under the other's
 * products (while a query warpgroup still loads tiles it runs a tile
 * ahead of the other at most; in a sequence's last kStages - 1 tiles
 * only the P, dS slots hold it back). dQ, summed over the slab in
 * registers, goes to the slab's fp32 partial for _dq_sum. The plan sends
 * 1 <= n_q <= 128 here (with n_q 0 no product would write dK, dV): 64 <
 * n_q, or any with .bq_sm90_small (where n_q <= 64 the second query
 * warpgroup computes on rows of zeros, their P and dS never read). */
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@(@PARAMS@) {
  (void)dq;
  if (batch <= 0 || kv_heads != heads) return;
  // full[slot], empty[slot] of the P, dS slots (the query threads stored
  // P and dS; the key warpgroup is done with them), then of the K, V slots
  // (each copying thread's copies landed; each query thread is done with
  // the tile)
  __shared__ __align__(8) unsigned long long bars[4 + 2 * kStages];
  const unsigned full0 = smem_addr(bars), empty0 = full0 + 16, kv_full0 = full0 + 32,
                 kv_empty0 = kv_full0 + 8 * kStages;
  if (threadIdx.x == 0) {
    for (int x = 0; x < 2; x++) {
      mbar_init(full0 + 8 * x, kCopyThreads);
      mbar_init(empty0 + 8 * x, 128);
    }
    for (int x = 0; x < kStages; x++) {
      mbar_init(kv_full0 + 8 * x, kCopyThreads);
      mbar_init(kv_empty0 + 8 * x, kCopyThreads);
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int h = blockIdx.y;
  const long long stride = (long long)heads * kHeadDim;  // of every tensor (heads == kv_heads)
  const long long n_q = total_q / batch, slabs = num_tiles;
  const int mq = (int)min((long long)kBlockM, n_q);  // real query rows
  const int ksteps = (mq + 15) / 16;                 // 16-query steps of dK, dV
  const unsigned base = smem_addr(smem);
  const unsigned q_a = base, do_a = base + kQBytes, ring_a = base + kRingAt, pds_a = base + kPAt;
  float *const lse_s = reinterpret_cast<float *>(reinterpret_cast<char *>(smem) + kRowsAt);
  float *const di_s = lse_s + kBlockM;
  const int wg = threadIdx.x >> 7, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int row0 = 16 * warp;  // a query warp's rows (of warpgroup wg's 64 wg..)
  long long n = 0;  // tiles walked so far: tile n's P and dS in slot n % 2

  if (wg == 2) {
    // ---- the key warpgroup: dV = P^T dO, then dK = dS^T Q, of each tile
    // the query warpgroups hand over; the slot is freed once both are done.
    regs_dec<kKeyRegs>();
#pragma unroll 1
    for (long long slab = blockIdx.x; slab < slabs; slab += gridDim.x) {
      const long long b1 = slab_start(cu_seqlens_k, batch, total_k, slab + 1, slabs);
#pragma unroll 1
      for (long long b = slab_start(cu_seqlens_k, batch, total_k, slab, slabs); b < b1; b++) {
        const SeqSpan sp = seq_span(cu_seqlens_q, cu_seqlens_k, b, batch, total_q, total_k);
        const SeenTiles seen = seen_key_tiles(sp, mq);
        const long long kv_at = sp.k_start * stride + (long long)h * kHeadDim;  // this head's key 0
        unsigned short *const dk_head = dk + kv_at, *const dv_head = dv + kv_at;
#pragma unroll 1
        for (int i = 0; i < seen.n_steps; i++, n++) {
          const long long k0 = (seen.kt0 + i) * kBlockN;
          const int nk = (int)min((long long)kBlockN, sp.k_len - k0);
          const int x = (int)(n & 1);
          const unsigned p_a = pds_a + x * 2 * kPBytes, ds_a = p_a + kPBytes;
          mbar_wait(full0 + 8 * x, (unsigned)(n >> 1) & 1);
          // one 64-column half of dV, then of dK, at a time (the key
          // warpgroup's registers are few)
#pragma unroll 1
          for (int t = 0; t < 2 * kHalves; t++) {
            const bool is_k = t >= kHalves;
            const int hh = t % kHalves;
            float acc[8][4];
            wgmma_fence();
            keys_by_queries(acc, is_k ? ds_a : p_a, is_k ? q_a : do_a, hh, ksteps);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_hold(acc);
            if (t == 2 * kHalves - 1) mbar_arrive(empty0 + 8 * x);  // P and dS are read
            store_rows(acc, is_k ? kScale : 1.f, 16 * (warp & 3), nk,
                       (is_k ? dk_head : dv_head) + k0 * stride + 64 * hh, stride);
          }
        }
      }
    }
    return;
  }

  // ---- the query warpgroups ----
  regs_inc<kQueryRegs>();
  bool q_loaded = false;
#pragma unroll 1
  for (long long slab = blockIdx.x; slab < slabs; slab += gridDim.x) {
    float acc_q[kHalves][8][4];  // this warp's dQ, over the slab
#pragma unroll
    for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
      for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc_q[hh][j][e] = 0.f;
    const long long b1 = slab_start(cu_seqlens_k, batch, total_k, slab + 1, slabs);
#pragma unroll 1
    for (long long b = slab_start(cu_seqlens_k, batch, total_k, slab, slabs); b < b1; b++) {
      const SlabSequence sp = slab_sequence<kCopyThreads>(cu_seqlens_q, cu_seqlens_k, b, batch,
                                                          total_q, total_k, mq, h, stride, k, v,
                                                          dk, dv);
      if (sp.n_steps == 0) continue;

      // The key warpgroup is done with the last sequence's dO (its last
      // tile's P, dS slot is freed after dV and dK), and both query
      // warpgroups with its last tile (dP read dO).
      if (n > 0) {
        mbar_wait(empty0 + 8 * ((n - 1) & 1), (unsigned)((n - 1) >> 1) & 1);
        mbar_wait(kv_empty0 + 8 * ((n - 1) % kStages), (unsigned)((n - 1) / kStages) & 1);
      }
      if (!q_loaded) load_rows<kBlockM>(q_a, q + (long long)h * kHeadDim, stride, mq);
      q_loaded = true;
      load_rows<kBlockM>(do_a, dout + sp.o_row, stride, mq);
      // Tile t of the sequence (tile m = n0 + t of the CTA) into K, V slot m
      // % kStages once both query warpgroups are done with tile m -
      // kStages there; each copying thread arrives on the slot's full
      // barrier when its copies (with the first, Q's and dO's) land.
      const long long n0 = n;  // the sequence's first tile, of the CTA's
      auto load_tile_kv = [&](int t) {
        const long long m = n0 + t;
        const int x = (int)(m % kStages);
        if (m >= kStages) mbar_wait(kv_empty0 + 8 * x, (unsigned)(m / kStages - 1) & 1);
        const long long k0 = (sp.kt0 + t) * kBlockN;
        const int nk = (int)min((long long)kBlockN, sp.k_len - k0);
        const unsigned slot = ring_a + x * 2 * kKBytes;
        load_rows<kBlockN>(slot, sp.k + k0 * stride, stride, nk);
        load_rows<kBlockN>(slot + kKBytes, sp.v + k0 * stride, stride, nk);
        mbar_arrive_on_copies(kv_full0 + 8 * x);
      };
#pragma unroll 1
      for (int t = 0; t < kStages - 1 && t < sp.n_steps; t++) load_tile_kv(t);
      // D of this warp's rows from memory while the tiles land.
      row_stats(o, dout, lse, nullptr, sp.o_row, stride, (long long)h * total_q + sp.q_start, mq,
                row0, lse_s, di_s);
      __syncwarp();
      const float lse_lo = lse_s[row0 + g], lse_hi = lse_s[row0 + g + 8];
      const float d_lo = di_s[row0 + g], d_hi = di_s[row0 + g + 8];

#pragma unroll 1
      for (int i = 0; i < sp.n_steps; i++, n++) {
        // Tile i + kStages - 1 into the slot tile n - 1 freed (once both
        // query warpgroups are done with it), then wait for this one; the
        // two warpgroups need not meet otherwise, so that one's softmax can
        // run under the other's products.
        if (i + kStages - 1 < sp.n_steps) load_tile_kv(i + kStages - 1);
        const int kx = (int)(n % kStages);
        mbar_wait(kv_full0 + 8 * kx, (unsigned)(n / kStages) & 1);
        // the copies (and with the sequence's first tile Q's and dO's) are
        // read by wgmma, the async proxy: fenced by each reader after the
        // acquire, as jagged_bwd_ws.cu's computing warpgroups do; the key
        // warpgroup's reads of Q and dO follow this fence through full
        fence_proxy_async();
        const long long k0 = (sp.kt0 + i) * kBlockN;
        const int nk = (int)min((long long)kBlockN, sp.k_len - k0);
        const unsigned k_a = ring_a + kx * 2 * kKBytes, v_a = k_a + kKBytes;

        float s[8][4], dp[8][4];
        wgmma_two(s, dp, [&] {
          queries_times_keys(s, q_a, k_a, wg);
          queries_times_keys(dp, do_a, v_a, wg);
        });
        // P and dS of this warp's rows; rows past n_q have LSE +inf (P = 0).
        const Band band = tile_band(0, k0, sp.delta);
        const bool full = nk == kBlockN && band.lo <= -(kBlockM - 1) && band.hi >= kBlockN - 1;
        unsigned p16[8][2], ds16[8][2];
        probs_and_ds<8, true>(s, dp, lse_lo, lse_hi, d_lo, d_hi, full, nk, band, row0, p16, ds16);
        // To the slot, once the key warpgroup is done with tile n - 2's.
        const int x = (int)(n & 1);
        const unsigned p_a = pds_a + x * 2 * kPBytes;
        if (n >= 2) mbar_wait(empty0 + 8 * x, (unsigned)((n >> 1) - 1) & 1);
        store_ds_t_x4(p_a, row0, p16, lane);
        store_ds_t_x4(p_a + kPBytes, row0, ds16, lane);
        fence_proxy_async();  // P and dS are read by wgmma
        mbar_arrive(full0 + 8 * x);
        wgmma_fence();  // ds16 is read by the dQ product
        issue_dq_rs(acc_q, ds16, k_a);
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int hh = 0; hh < kHalves; hh++) wgmma_hold(acc_q[hh]);
        keep(ds16);
        mbar_arrive(kv_empty0 + 8 * kx);  // this thread is done with the tile's K, V
      }
    }
    float *const out = di + broadcast_partials_at(heads, total_q) + slab * n_q * stride;
#pragma unroll
    for (int hh = 0; hh < kHalves; hh++)
      store_rows(acc_q[hh], kScale, row0, mq, out + (long long)h * kHeadDim + 64 * hh, stride);
  }
}
/* ---- end kernel ---- */
