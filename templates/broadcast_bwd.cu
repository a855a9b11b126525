@# SPDX-License-Identifier: BSD-3-Clause
@# broadcast_bwd.cu: the broadcast-Q backward in one pass, mma.sync (sm_80+,
@# runs as compiled on sm_90a), for n_q <= BLOCK_M and heads == kv_heads.
@# Placeholders: @KERNEL_NAME@ @HEAD_DIM@ (64 | 128) @BLOCK_M@ (query rows:
@#   the whole n_q; 32, 64 or 128) @BLOCK_N@ (keys of a tile: 64) @WARPS@ (4 |
@#   8: BLOCK_M / 16 row groups, each computed by WARPS * 16 / BLOCK_M warps
@#   that split its keys) @STAGES@ (K, V slots, 2 or more) @MIN_CTAS@
@#   @SMEM_BYTES@ (= 4 * HEAD_DIM * (BLOCK_M + STAGES * BLOCK_N) +
@#   4 * BLOCK_M * BLOCK_N + 8 * BLOCK_M) @SCALE@ @SCALE_LOG2@ @SCALE_TEXT@
@#   @MMA_TYPE@ @PAIR_TYPE@ @CAUSAL@ @WINDOW@ @WINDOW_LEFT@ @WINDOW_RIGHT@
@#   @ROTARY_TABLES@ (as in jagged_bwd.cu).
@# Conditions: ROTARY (rotary embeddings, as jagged_bwd.cu's with a
@#   broadcast Q: Q rotated once a slab (query row i at the fixed position
@#   i), each key tile as it lands, dK (dV) rotated back in registers before
@#   it is stored, the slab's dQ partial left rotated for _dq_sum; the plan
@#   takes this kernel only where a warp holds both halves of each pair:
@#   the interleaved layout, or every column of dK), ROTARY_TABLE.
@# Grid: (slabs, heads) (ag_broadcast_slabs), WARPS * 32 threads, dynamic
@#   shared memory SMEM_BYTES; then jagged_bwd.cu's _dq_sum over the slabs.
@# Parameters: those of jagged_bwd.cu's kernels (q [n_q, heads, D]; `di`
@#   the workspace: the slabs' dQ partials at broadcast_partials_at(heads,
@#   total_q) floats; num_tiles = slabs).
@# Includes jagged_bwd_band.cuh, mma_sm80.cuh, copy_rows.cuh, unpack2.cuh and
@#   jagged_bwd_tile.cuh (and jagged_rotary.cuh with ROTARY):
@#   emitted in a namespace of its own.
/* ---- begin broadcast backward constants ---- */
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kBlockM = @BLOCK_M@;  // query rows: every shared query (n_q <= kBlockM)
constexpr int kBlockN = @BLOCK_N@;  // keys of a tile
constexpr int kWarps = @WARPS@;  // warps per CTA
constexpr int kStages = @STAGES@;  // K, V slots: kStages - 1 tiles load ahead
constexpr int kThreads = kWarps * 32;
constexpr int kMinCtasPerSm = @MIN_CTAS@;  // launch bound: registers fit this many CTAs
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
@include jagged_bwd_band.cuh@
constexpr bool kBroadcast = true;  // one dense Q shared by every sequence
constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of dQ, dK and dV
constexpr int kKeyTiles = kBlockN / 8;  // n-tiles of S and dP over a key tile
constexpr int kKeyGroups = kBlockN / 16;  // 16-key row groups of dK, dV
constexpr int kDimSplit = kWarps / kKeyGroups;  // warps sharing a key group, by columns
constexpr int kDimPart = kDimTiles / kDimSplit;  // n-tiles of dK, dV per warp
constexpr int kRowGroups = kBlockM / 16;  // 16-row groups of the queries (S, dP, dQ)
constexpr int kKeySplit = kWarps / kRowGroups;  // warps of a row group, each its keys
constexpr int kSplitTiles = kKeyTiles / kKeySplit;  // n-tiles of a warp's S and dP
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
static_assert(kBlockM % 16 == 0 && kWarps % kRowGroups == 0 && kBlockN == 64,
              "whole 16-row groups, each computed by the same number of warps; 64-key tiles");
static_assert(kSplitTiles % 2 == 0, "a warp's keys are pairs of n-tiles");
static_assert(kWarps % kKeyGroups == 0 && kDimPart % 2 == 0,
              "warps split dK and dV into whole key groups and pairs of n-tiles");
// Q and dO of the queries, kStages K, V slots (a ring), P and dS of a tile
// [query][key] (16-bit), then each query row's LSE * log2(e) and D.
constexpr int kQTileElems = kBlockM * kHeadDim;
constexpr int kKTileElems = kBlockN * kHeadDim;
constexpr int kPTileElems = kBlockM * kBlockN;
static_assert(kStages >= 2, "a tile loads while the last one is used");
static_assert(2 * (2 * kQTileElems + 2 * kStages * kKTileElems + 2 * kPTileElems) + 8 * kBlockM ==
                  kSmemBytes,
              "the plan's shared memory is Q, dO, the K, V slots, P, dS and two floats a row");
// With kKeySplit > 1, a slab's dQ partials of the warps past a row group's
// first are summed through the K, V slots, rows padded by 8 floats so that
// a warp's stores of one row pair meet each bank twice at most.
constexpr int kRedRow = kHeadDim + 8;
static_assert((kKeySplit - 1) * kBlockM * kRedRow * 4 <= 2 * kStages * kKTileElems * 2,
              "the dQ partials fit the K, V slots");
/* ---- end broadcast backward constants ---- */

@include mma_sm80.cuh@

@include copy_rows.cuh@

@include unpack2.cuh@

@include jagged_bwd_tile.cuh@
@if ROTARY@

@include jagged_rotary.cuh@

static_assert(!@ROTARY_HALF@ || kDimPart == kDimTiles,
              "the half layout's pairs (n-tiles n and n + kDimTiles / 2) in one warp's columns");

// Rotate a warp's dK (dV) part back: rows kr0 + g (+ 8) of the key tile
// (those before `rows`), its kDimPart n-tiles from nt0, in the mma C layout
// (unrotate_rows for part of the columns).
__device__ __forceinline__ void unrotate_part(float (&acc)[kDimPart][4], int kr0, int rows, int nt0,
                                              const RotaryRows &rr) {
  const int tq = threadIdx.x & 3;
  for_lane_rows(kr0, rows, [&](int hi, int row) {
#pragma unroll
    for (int n = 0; n < (@ROTARY_HALF@ ? kDimPart / 2 : kDimPart); n++)
#pragma unroll
      for (int e = 0; e < (@ROTARY_HALF@ ? 2 : 1); e++) {
        // half: column 8n + 2tq + e with its partner kDimTiles / 2 n-tiles
        // on; interleaved: columns 8n + 2tq, + 1, pair 4n + tq
        const int m = @ROTARY_HALF@ ? n + kDimTiles / 2 : n;
        const int i = @ROTARY_HALF@ ? 8 * n + 2 * tq + e : 4 * (nt0 + n) + tq;
        const int a = @ROTARY_HALF@ ? 2 * hi + e : 2 * hi, b = @ROTARY_HALF@ ? a : a + 1;
        float s, c;
        pair_angle(rr, row, i, s, c);
        const float x0 = acc[n][a], x1 = acc[m][b];
        acc[n][a] = x0 * c + x1 * s;
        acc[m][b] = x1 * c - x0 * s;
      }
  });
}
@endif@

extern __shared__ __align__(128) unsigned short smem[];

/* ---- begin P and dS tiles ----
 * [kBlockM queries][kBlockN keys], 16-byte pieces XOR-swizzled by the row. */
__device__ __forceinline__ int pswizzle(int row, int piece) {
  return row * kBlockN + ((piece ^ (row & 7)) * 8);
}

// Store a warp's 16 rows of 16-bit pairs (C layout) for the kNT * 8 keys
// from 8 * piece0 into a P or dS tile.
template <int kNT>
__device__ __forceinline__ void put_rows(unsigned short *tile, const unsigned (&x)[kNT][2],
                                         int row0, int piece0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int n = 0; n < kNT; n++) {
    *reinterpret_cast<unsigned *>(tile + pswizzle(row0 + g, piece0 + n) + 2 * tq) = x[n][0];
    *reinterpret_cast<unsigned *>(tile + pswizzle(row0 + g + 8, piece0 + n) + 2 * tq) = x[n][1];
  }
}

// Sum the dQ partials of a row group's warps (kKeySplit > 1; `share`: this
// warp's share of the keys) into its first warp's acc, through `red`
// (kKeySplit - 1 partials of kBlockM rows of kRedRow floats). Every thread
// of the CTA calls it, nobody using `red`.
__device__ __forceinline__ void sum_partials(float (&acc)[kDimTiles][4], float *red, int row0,
                                             int share) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  if (share > 0) {
    float *const at = red + ((share - 1) * kBlockM + row0 + g) * kRedRow + 2 * tq;
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) {
      *reinterpret_cast<float2 *>(at + 8 * n) = make_float2(acc[n][0], acc[n][1]);
      *reinterpret_cast<float2 *>(at + 8 * kRedRow + 8 * n) = make_float2(acc[n][2], acc[n][3]);
    }
  }
  __syncthreads();
  if (share == 0) {
#pragma unroll 1
    for (int p = 1; p < kKeySplit; p++) {
      const float *const at = red + ((p - 1) * kBlockM + row0 + g) * kRedRow + 2 * tq;
#pragma unroll
      for (int n = 0; n < kDimTiles; n++) {
        const float2 lo = *reinterpret_cast<const float2 *>(at + 8 * n);
        const float2 hi = *reinterpret_cast<const float2 *>(at + 8 * kRedRow + 8 * n);
        acc[n][0] += lo.x;
        acc[n][1] += lo.y;
        acc[n][2] += hi.x;
        acc[n][3] += hi.y;
      }
    }
  }
}

// acc = X^T B for the 16 keys kr0.. of the tile and the kDimPart n-tiles
// from nt0: X is P or dS in shared memory ([query][key]; its columns read
// as rows with ldmatrix.trans), B is dO or Q ([query][kHeadDim]), over the
// first 16 * ksteps queries. dV = P^T dO, dK = dS^T Q.
__device__ __forceinline__ void keys_by_queries(float (&acc)[kDimPart][4], unsigned x_s,
                                                unsigned b_s, int kr0, int nt0, int ksteps) {
  const int lane = threadIdx.x & 31, m = lane >> 3;
#pragma unroll
  for (int n = 0; n < kDimPart; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll 1
  for (int kk = 0; kk < ksteps; kk++) {
    // matrix m: queries 16kk + 8 (m / 2).., keys kr0 + 8 (m % 2)..
    unsigned a[4];
    ldmatrix_x4_trans(a, x_s + pswizzle(16 * kk + (lane & 7) + ((m >> 1) << 3),
                                        kr0 / 8 + (m & 1)) * 2);
#pragma unroll
    for (int n = 0; n < kDimPart; n += 2) {
      unsigned b[4];
      ldmatrix_x4_trans(b, b_s + swizzle(16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3),
                                         nt0 + n + (lane >> 4)) * 2);
      mma_16816(acc[n], a, b[0], b[1]);
      mma_16816(acc[n + 1], a, b[2], b[3]);
    }
  }
}

/* ---- end P and dS tiles ---- */

/* ---- begin kernel ----
 * A CTA owns every query (n_q <= kBlockM) of one head over a slab of
 * sequences (slab_start). Q stays in shared memory; for each sequence it
 * loads dO and computes D, then walks the key tiles of the band, K and V
 * streaming through kStages slots: S = Q K^T and dP = dO V^T by the query
 * rows' warps (16 rows each; with kKeySplit > 1 warps a row group, each of
 * them its share of the tile's keys: no softmax reduction crosses keys,
 * LSE and D are known), P and dS to shared memory, dQ += dS K in
 * registers; then every warp computes its part of dV = P^T dO and dK =
 * dS^T Q for the tile and stores them: every query is in the CTA, so each
 * key tile's gradients are whole (keys no query sees get 0). Five
 * products per tile pair, where the two-kernel backward recomputes S and
 * dP (seven). dQ, summed over the slab in registers (and over a row
 * group's warps, sum_partials), goes to the slab's fp32 partial for
 * _dq_sum. */
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@(@PARAMS@) {
  (void)dq;
  if (batch <= 0 || kv_heads != heads) return;
  const int h = blockIdx.y;
  const long long stride = (long long)heads * kHeadDim;  // of every tensor (heads == kv_heads)
  const long long n_q = total_q / batch, slabs = num_tiles;
  const int mq = (int)min((long long)kBlockM, n_q);  // real query rows
  const int ksteps = (mq + 15) / 16;                 // 16-query steps of dK, dV
  unsigned short *const q_s = smem, *const do_s = smem + kQTileElems;
  unsigned short *const ring = smem + 2 * kQTileElems;  // slot i: K at 2i tiles, V after it
  unsigned short *const p_s = ring + 2 * kStages * kKTileElems, *const ds_s = p_s + kPTileElems;
  float *const lse_s = reinterpret_cast<float *>(ds_s + kPTileElems);
  float *const di_s = lse_s + kBlockM;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  // This warp's query rows, and its share of a tile's keys (kKeySplit > 1).
  const int row0 = kKeySplit > 1 ? 16 * (warp % kRowGroups) : 16 * warp;
  const int share = kKeySplit > 1 ? warp / kRowGroups : 0;
  const int key0 = share * (kBlockN / kKeySplit);
  const bool has_rows = row0 < mq;
  const int kr0 = 16 * (warp % kKeyGroups), nt0 = (warp / kKeyGroups) * kDimPart;
  const unsigned q_a = smem_addr(q_s), do_a = smem_addr(do_s), p_a = smem_addr(p_s),
                 ds_a = smem_addr(ds_s);
@if ROTARY@
  const RotaryTables tables = @ROTARY_TABLES@;
@endif@

#pragma unroll 1
  for (long long slab = blockIdx.x; slab < slabs; slab += gridDim.x) {
    float acc[kDimTiles][4];  // dQ of this warp's rows, over the slab
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    const long long b1 = slab_start(cu_seqlens_k, batch, total_k, slab + 1, slabs);
    bool q_loaded = false;
#pragma unroll 1
    for (long long b = slab_start(cu_seqlens_k, batch, total_k, slab, slabs); b < b1; b++) {
      const SlabSequence sp = slab_sequence<kThreads>(cu_seqlens_q, cu_seqlens_k, b, batch, total_q,
                                                      total_k, mq, h, stride, k, v, dk, dv);
      if (sp.n_steps == 0) continue;

      __syncthreads();  // nobody reads the last sequence's shared memory any more
@if ROTARY@
      const bool q_fresh = !q_loaded;  // rotated once it lands
@endif@
      if (!q_loaded) load_tile<kBlockM>(q_s, q + (long long)h * kHeadDim, stride, mq);
      q_loaded = true;
      load_tile<kBlockM>(do_s, dout + sp.o_row, stride, mq);
      // Tiles 0 .. kStages - 2 into their slots, a commit group each (dO
      // with the first); the loop keeps kStages - 1 groups in flight.
#pragma unroll
      for (int t = 0; t < kStages - 1; t++) {
        if (t == 0 || t < sp.n_steps) {  // (sp.n_steps >= 1: tile 0 always loads)
          const long long k0 = (sp.kt0 + t) * kBlockN;
          const int nk = (int)min((long long)kBlockN, sp.k_len - k0);
          unsigned short *const slot = ring + t * 2 * kKTileElems;
          load_tile<kBlockN>(slot, sp.k + k0 * stride, stride, nk);
          load_tile<kBlockN>(slot + kKTileElems, sp.v + k0 * stride, stride, nk);
        }
        cp_async_commit();
      }
      // D of this warp's rows from memory while the tiles land.
      if (share == 0)
        row_stats(o, dout, lse, nullptr, sp.o_row, stride, (long long)h * total_q + sp.q_start, mq,
                  row0, lse_s, di_s);
      if constexpr (kKeySplit > 1) __syncthreads();  // rows of another warp's
      else __syncwarp();
      const float lse_lo = lse_s[row0 + g], lse_hi = lse_s[row0 + g + 8];
      const float d_lo = di_s[row0 + g], d_hi = di_s[row0 + g + 8];
@if ROTARY@
      if (kRotateQ && q_fresh) {
        // Q (row i at position i, or the table's row i), once a slab: its
        // copy is the first group's, waited for here; every warp reads it
        // after the loop's barriers.
        cp_async_wait<kStages - 2>();
        __syncthreads();
        rotate_rows(q_s, nullptr, mq, rotary_rows(tables.q, 0, 0));
      }
@endif@

#pragma unroll 1
      for (int i = 0; i < sp.n_steps; i++) {
        // Refill the last tile's slot with tile i + kStages - 1 once every
        // warp is done with it (and with P and dS of the last tile), then
        // wait for this one.
        __syncthreads();
        if (i + kStages - 1 < sp.n_steps) {
          const long long k1 = (sp.kt0 + i + kStages - 1) * kBlockN;
          const int nk1 = (int)min((long long)kBlockN, sp.k_len - k1);
          unsigned short *slot = ring + ((unsigned)(i + kStages - 1) % kStages) * 2 * kKTileElems;
          load_tile<kBlockN>(slot, sp.k + k1 * stride, stride, nk1);
          load_tile<kBlockN>(slot + kKTileElems, sp.v + k1 * stride, stride, nk1);
        }
        cp_async_commit();
        cp_async_wait<kStages - 1>();
        __syncthreads();
        const long long k0 = (sp.kt0 + i) * kBlockN;
        const int nk = (int)min((long long)kBlockN, sp.k_len - k0);
@if ROTARY@
        // Rotate the tile's K (V) where it landed; every warp reads them
        // after the barrier.
        if constexpr (kRotateK || kRotateV) {
          unsigned short *slot = ring + ((unsigned)i % kStages) * 2 * kKTileElems;
          rotate_rows(kRotateK ? slot : nullptr, kRotateV ? slot + kKTileElems : nullptr, nk,
                      rotary_rows(tables.k, sp.k_start + k0, k0));
        }
        __syncthreads();
@endif@
        const unsigned k_a = smem_addr(ring + ((unsigned)i % kStages) * 2 * kKTileElems);
        const unsigned v_a = k_a + 2 * kKTileElems;
        if (has_rows) {  // warp-uniform: rows past n_q are neither computed nor read
          // This warp's keys key0.. of the tile (rows of K and V in the slot).
          constexpr int kKeys = kSplitTiles * 8;
          const unsigned kw_a = k_a + key0 * kHeadDim * 2, vw_a = v_a + key0 * kHeadDim * 2;
          const int nkw = nk - key0;
          float s[kSplitTiles][4], dp[kSplitTiles][4];
          rows_times_rows(s, q_a, kw_a, 0, row0);
          rows_times_rows(dp, do_a, vw_a, 0, row0);
          const Band band = tile_band(0, k0 + key0, sp.delta);
          const bool full =
              nk >= key0 + kKeys && band.lo <= -(kBlockM - 1) && band.hi >= kKeys - 1;
          unsigned p16[kSplitTiles][2], ds[kSplitTiles][2];
          probs_and_ds<kSplitTiles, true>(s, dp, lse_lo, lse_hi, d_lo, d_hi, full, nkw, band,
                                          row0, p16, ds);
          put_rows(p_s, p16, row0, key0 / 8);
          put_rows(ds_s, ds, row0, key0 / 8);
          accumulate<kSplitTiles>(acc, ds, kw_a);  // dQ += dS K
        }
        __syncthreads();  // P and dS of the tile complete
        float part[kDimPart][4];
        keys_by_queries(part, p_a, do_a, kr0, nt0, ksteps);  // dV = P^T dO
@if ROTARY@
        // (the keys' angles again, not held across the tile's products; no
        // keys' table is passed where only Q is rotated)
        const RotaryRows rk = kRotateK || kRotateV ? rotary_rows(tables.k, sp.k_start + k0, k0)
                                                   : RotaryRows{0, nullptr};
        if constexpr (kRotateV) unrotate_part(part, kr0, nk, nt0, rk);  // of the unrotated V
@endif@
        store_rows(part, 1.f, kr0, nk, sp.dv + k0 * stride + nt0 * 8, stride);
        keys_by_queries(part, ds_a, q_a, kr0, nt0, ksteps);  // dK = dS^T Q
@if ROTARY@
        if constexpr (kRotateK) unrotate_part(part, kr0, nk, nt0, rk);  // of the unrotated K
@endif@
        store_rows(part, kScale, kr0, nk, sp.dk + k0 * stride + nt0 * 8, stride);
      }
      cp_async_wait<0>();
    }
    if constexpr (kKeySplit > 1) {
      __syncthreads();  // nobody reads the K, V slots any more
      sum_partials(acc, reinterpret_cast<float *>(ring), row0, share);
    }
    float *const out = di + broadcast_partials_at(heads, total_q) + slab * n_q * stride;
    if (share == 0) store_rows(acc, kScale, row0, mq, out + (long long)h * kHeadDim, stride);
  }
}
/* ---- end kernel ---- */
