@# SPDX-License-Identifier: BSD-3-Clause
@# broadcast_bwd_keys.cu: the broadcast-Q backward in one pass on sm_90a for
@# n_q <= 64 and heads == kv_heads, key-stationary and warp specialized:
@# broadcast_bwd.cu's walk and workspace (a CTA owns every query of one
@# head over a slab of sequences; dK and dV whole per key tile; dQ summed
@# over the slab in registers), computed as jagged_bwd_ws.cu computes a
@# step with the roles swapped: the queries are the fixed step (Q for the
@# CTA's life, dO a sequence) and 128-key tiles stream past them. A loading
@# warpgroup copies each sequence's dO and row floats and each tile's K and
@# V; two computing warpgroups of 64 keys each compute S^T, dP^T, dV, dK and
@# their own dQ^T with no hand-off between them.
@# Placeholders: @KERNEL_NAME@ @PARAMS@ @HEAD_DIM@ (64 | 128) @BLOCK_M@ (64:
@#   query columns, n_q <= 64) @BLOCK_N@ (128: keys of a tile) @WARPS@ (12)
@#   @STAGES@ (K, V slots, >= 2) @MIN_CTAS@ (1) @SMEM_BYTES@ (= 4 * HEAD_DIM
@#   * (BLOCK_M * (1 + kSeqStages) / 2 + STAGES * BLOCK_N) + 4 * BLOCK_N *
@#   BLOCK_M + 8 * kSeqStages * BLOCK_M) @SCALE@ @SCALE_LOG2@ @SCALE_TEXT@
@#   @MMA_TYPE@ @PAIR_TYPE@ @CAUSAL@ @WINDOW@ @WINDOW_LEFT@ @WINDOW_RIGHT@
@#   (as in jagged_bwd.cu).
@# Conditions: DKV_N128 (head dim 128: dV and dK as one 64x128 product a
@#   k-step, jagged_bwd_dkv_n128.cuh).
@# Grid, parameters: broadcast_bwd.cu's (WARPS * 32 threads); then
@#   jagged_bwd.cu's _dq_sum over the slabs.
@# Includes: jagged_bwd_band.cuh, jagged_bwd_sm90_parts.cuh, load_rows_sm90.cuh:
@#   emitted in a namespace of its own.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "this backward is planned for sm_90a only (wgmma)"
#endif
/* ---- begin broadcast backward constants ---- */
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kBlockM = @BLOCK_M@;  // query columns: every shared query (n_q <= kBlockM)
constexpr int kBlockN = @BLOCK_N@;  // keys of a tile, 64 a computing warpgroup
constexpr int kWarps = @WARPS@;  // warps per CTA: the loading warpgroup, then two computing
constexpr int kStages = @STAGES@;  // K, V slots: kStages - 1 tiles load ahead
constexpr int kSeqStages = 2;  // dO (and row floats) slots: the next sequence's load early
constexpr int kThreads = kWarps * 32;
constexpr int kCopyThreads = 128;  // the loading warpgroup (load_rows_sm90.cuh's copiers)
constexpr int kMathThreads = kThreads - kCopyThreads;
constexpr int kMinCtasPerSm = @MIN_CTAS@;  // launch bound
// setmaxnreg budgets: a computing thread holds its warpgroup's dQ^T over
// the slab (32 a 64-column half), S^T and dP^T (32 each), their 16-bit
// pairs (16 each) and one of dV, dK (32 a half); the loading one copies
// rows, walks the slabs and computes D (row_stats, four passes' loads in
// flight: two round trips to memory a sequence at head dim 128, one at
// 64; D is on the loader's path between a sequence's tiles). ptxas (CUDA
// 13, sm_90a, session 42): no spills at 192 and 120, either head dim,
// causal too; with every pass in flight the loader spilled 24 bytes (16 at
// 184 and 136), with four at 200 and 104 8, and below 104 even one at a
// time (36 bytes at 56).
constexpr int kMathRegs = 192, kLoadRegs = 120;
// setmaxnreg moves registers within what the CTA is launched with: 65,536
// / kThreads a thread, rounded down to a multiple of 8 (168 for 384).
static_assert(kCopyThreads * kLoadRegs + kMathThreads * kMathRegs <=
                  kThreads * (65536 / kThreads / 8 * 8),
              "the registers the CTA is launched with");
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
@include jagged_bwd_band.cuh@
constexpr bool kBroadcast = true;  // one dense Q shared by every sequence
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
static_assert(kBlockM == 64 && kBlockN == 128 && kWarps == 12 && kMinCtasPerSm == 1,
              "64 query columns, two computing warpgroups of 64 keys and a loading one");
static_assert(kStages >= 2, "a tile loads while the last one is used");
// Every operand is made of 64-column matrices of 128-byte rows in the
// 128-byte swizzle (wgmma_sm90.cuh): a tile of R rows is kHalves such
// R-row matrices, one per 64 columns of the head.
constexpr int kHalves = kHeadDim / 64;
constexpr int kRowBytes = 128;
constexpr int kQBytes = kBlockM * kHeadDim * 2;  // Q (or a sequence's dO)
constexpr int kKBytes = kBlockN * kHeadDim * 2;  // K (or V) of a tile
constexpr int kDsBytes = kBlockN * kBlockM * 2;  // dS^T of a tile: [key][query]
constexpr int kStepOverRows = 16 * kRowBytes;    // a k16 step over 16 rows (MN-major)
// Shared memory: Q, the kSeqStages dO slots, the kStages K, V slots (a
// ring), two dS^T rooms (a tile's in room t % 2, t the slot count; each
// computing warpgroup its 64 rows; at a slab's end the two warpgroups'
// dQ^T meet in room 0), then each dO slot's LSE * log2(e) and D of its
// rows.
constexpr int kDoAt = kQBytes;
constexpr int kRingAt = kDoAt + kSeqStages * kQBytes;
constexpr int kDsAt = kRingAt + kStages * 2 * kKBytes;
constexpr int kRowsAt = kDsAt + 2 * kDsBytes;
static_assert(kRowsAt + kSeqStages * 8 * kBlockM == kSmemBytes,
              "the plan's shared memory is Q, the dO slots, the K, V slots, two dS^T and two "
              "floats a row a dO slot");
static_assert(64 * 64 * 4 == kDsBytes, "a warpgroup's 64-column half of dQ^T fits dS^T's room");
/* ---- end broadcast backward constants ---- */

@include jagged_bwd_sm90_parts.cuh@

@include load_rows_sm90.cuh@

// 1024-byte aligned: the 128-byte swizzle's 8-row atoms start at
// multiples of 1024.
extern __shared__ __align__(1024) unsigned short smem[];

/* ---- begin the tile's products ---- */
// What the loading warpgroup hands the computing ones with a K, V slot:
// a tile, the end of a slab (dQ^T to its partial) or the end of the work.
enum : int { kTile = 0, kSlabEnd = 1, kEnd = 2 };
struct KeysTile {
  long long kv_at;  // the tile's first key row of this head in K, V, dK and dV (elements)
  long long k0;     // its first key in the sequence
  long long delta;  // the sequence's k_len - n_q: where the causal diagonal lies
  long long slab;   // kSlabEnd: the slab whose dQ^T is done
  int nk;           // real keys of the tile (past them rows of zeros)
  int seq;          // the CTA's sequence number: its dO slot seq % kSeqStages
  int kind;
};

// dQ^T += K^T dS^T over this warpgroup's 64 keys: A is K's rows read
// MN-major (M the head's 64 columns of matrix hh, k the keys), B is dS^T's
// rows read MN-major (N the queries); dqt[hh] rows are head columns,
// columns queries.
__device__ __forceinline__ void issue_dqt(float (&dqt)[kHalves][8][4], unsigned k_a,
                                          unsigned ds_a, int wg) {
#pragma unroll
  for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      wgmma_ss<1, 1>(dqt[hh],
                     sw128_desc(k_a + hh * (kKBytes / kHalves) + wg * 64 * kRowBytes,
                                kk * kStepOverRows),
                     sw128_desc(ds_a + wg * 64 * kRowBytes, kk * kStepOverRows), 1);
}

// A slab's dQ^T, the two computing warpgroups' summed (warpgroup 1's
// through the dS^T room, in the order 0 + 1 whatever the timing), times
// the scale, to its partial `out` (query q's row at q * stride, this head's
// columns from 0) for the mq real queries; then zeroed for the next slab.
// Both computing warpgroups call it, done with every product of the slab.
__device__ __forceinline__ void flush_dqt(float (&dqt)[kHalves][8][4], float *out,
                                          long long stride, int mq, int wg, int warp, int lane,
                                          float *room) {
  const int g = lane >> 2, tq = lane & 3;
  named_barrier_sync(3, kMathThreads);  // both warpgroups' products of the slab are done
#pragma unroll
  for (int hh = 0; hh < kHalves; hh++) {
    // element (r, c) (head column r of the half, query c) at r * 64 + c
    // with c's 8-float chunk swizzled by r: a warp's float2 stores meet
    // each bank twice at most
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      const int r = 16 * warp + g + 8 * hi;
      float2 *const row = reinterpret_cast<float2 *>(room + r * 64 + 2 * tq);
      if (wg == 1) {
#pragma unroll
        for (int n = 0; n < 8; n++)
          row[4 * (n ^ (r & 7))] = make_float2(dqt[hh][n][2 * hi], dqt[hh][n][2 * hi + 1]);
      }
    }
    named_barrier_sync(3, kMathThreads);
    if (wg == 0) {
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        const int r = 16 * warp + g + 8 * hi;
        const float2 *const row = reinterpret_cast<const float2 *>(room + r * 64 + 2 * tq);
#pragma unroll
        for (int n = 0; n < 8; n++) {
          const float2 other = row[4 * (n ^ (r & 7))];
#pragma unroll
          for (int e = 0; e < 2; e++) {
            const int c = 8 * n + 2 * tq + e;
            if (c < mq)
              out[c * stride + 64 * hh + r] =
                  (dqt[hh][n][2 * hi + e] + (e ? other.y : other.x)) * kScale;
          }
        }
      }
    }
    named_barrier_sync(3, kMathThreads);  // the room is read before it is written again
  }
  zero_acc(dqt);
}
/* ---- end the tile's products ---- */

/* ---- begin kernel ----
 * broadcast_bwd.cu's walk: a CTA owns every query (n_q <= kBlockM) of one
 * head over a slab of sequences (slab_start). The loading warpgroup copies
 * Q once, each sequence's dO into a dO slot with its rows' LSE * log2(e)
 * and D (row_stats, from memory), and each key tile of the band into a K,
 * V slot with a KeysTile saying what it is; at a slab's end (and the
 * work's) it hands over a slot with no tile. Computing warpgroup w (keys
 * 64 w.. of the tile) computes S^T = K Q^T and dP^T = V dO^T (rows keys,
 * columns queries; both operands from shared memory), P^T and dS^T in
 * registers, stores dS^T to its 64 rows of the dS^T room, then dV = P^T dO
 * (A from registers), stored, dK = dS^T Q, stored, and dQ^T += K^T dS^T
 * (both from shared memory) in registers over the slab. Every query is in
 * the CTA, so each key tile's gradients are whole (keys no query sees get
 * 0). Mbarriers: a K, V slot's full (the copies' 128 arrivals and thread
 * 0's, which wrote its KeysTile) and empty (the computing threads'); a dO
 * slot's full (the copies' and the row floats' arrivals) and empty (the
 * computing threads', once on a later sequence's tile). The plan sends 1
 * <= n_q <= 64 here. */
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@(@PARAMS@) {
  (void)dq;
  if (batch <= 0 || kv_heads != heads) return;
  __shared__ __align__(8) unsigned long long bars[2 * kStages + 2 * kSeqStages];
  __shared__ KeysTile tiles_s[kStages];
  const unsigned kv_full0 = smem_addr(bars), kv_empty0 = kv_full0 + 8 * kStages,
                 seq_full0 = kv_empty0 + 8 * kStages, seq_empty0 = seq_full0 + 8 * kSeqStages;
  if (threadIdx.x == 0) {
    for (int x = 0; x < kStages; x++) {
      mbar_init(kv_full0 + 8 * x, kCopyThreads + 1);
      mbar_init(kv_empty0 + 8 * x, kMathThreads);
    }
    for (int x = 0; x < kSeqStages; x++) {
      mbar_init(seq_full0 + 8 * x, 2 * kCopyThreads);  // the copies, then the row floats
      mbar_init(seq_empty0 + 8 * x, kMathThreads);
    }
    mbar_init_fence();
  }
  __syncthreads();
  const int h = blockIdx.y;
  const long long stride = (long long)heads * kHeadDim;  // of every tensor (heads == kv_heads)
  const long long n_q = total_q / batch, slabs = num_tiles;
  const int mq = (int)min((long long)kBlockM, n_q);  // real query columns
  const unsigned base = smem_addr(smem);
  const unsigned q_a = base, do_a = base + kDoAt, ring_a = base + kRingAt, ds_a = base + kDsAt;
  float *const rows_s = reinterpret_cast<float *>(reinterpret_cast<char *>(smem) + kRowsAt);
  // The warpgroup, broadcast from lane 0 so that the compiler sees it
  // warp-uniform (wgmma under a branch it cannot prove uniform serializes).
  const int wgi = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;

  if (wgi == 0) {
    // ---- the loading warpgroup ----
    regs_dec<kLoadRegs>();
    int t = 0, seq = 0;  // K, V slots handed over so far; sequences loaded
    // Hand slot t % kStages over with no tile (kind kSlabEnd or kEnd).
    auto hand_over = [&](int kind, long long slab) {
      const int x = t % kStages;
      if (t >= kStages) mbar_wait(kv_empty0 + 8 * x, (t / kStages - 1) & 1);
      if (threadIdx.x == 0) tiles_s[x] = KeysTile{0, 0, 0, slab, 0, 0, kind};
      mbar_arrive(kv_full0 + 8 * x);
      if (threadIdx.x == 0) mbar_arrive(kv_full0 + 8 * x);
      t++;
    };
#pragma unroll 1
    for (long long slab = blockIdx.x; slab < slabs; slab += gridDim.x) {
      const long long b1 = slab_start(cu_seqlens_k, batch, total_k, slab + 1, slabs);
#pragma unroll 1
      for (long long b = slab_start(cu_seqlens_k, batch, total_k, slab, slabs); b < b1; b++) {
        const SlabSequence sp = slab_sequence<kCopyThreads>(cu_seqlens_q, cu_seqlens_k, b, batch,
                                                            total_q, total_k, mq, h, stride, k, v,
                                                            dk, dv);
        if (sp.n_steps == 0) continue;
        // dO slot seq % kSeqStages, once the computing warpgroups moved on
        // from the sequence kSeqStages before; Q with the first.
        const int st = seq % kSeqStages;
        if (seq >= kSeqStages) mbar_wait(seq_empty0 + 8 * st, (seq / kSeqStages - 1) & 1);
        if (seq == 0) load_rows<kBlockM>(q_a, q + (long long)h * kHeadDim, stride, mq);
        load_rows<kBlockM>(do_a + st * kQBytes, dout + sp.o_row, stride, mq);
        mbar_arrive_on_copies(seq_full0 + 8 * st);
        float *const lse_s = rows_s + st * 2 * kBlockM;
        row_stats<4>(o, dout, lse, nullptr, sp.o_row, stride, (long long)h * total_q + sp.q_start,
                     mq, 16 * warp, lse_s, lse_s + kBlockM);
        mbar_arrive(seq_full0 + 8 * st);  // the row floats are written
        // Tile i of the sequence into K, V slot t % kStages, once the
        // computing warpgroups are done with tile t - kStages there. (Its
        // first tile's copies issued before D: ptxas then spilled 8 bytes
        // at head dim 128 with a mask, at every budget that fits.)
#pragma unroll 1
        for (int i = 0; i < sp.n_steps; i++, t++) {
          const int x = t % kStages;
          if (t >= kStages) mbar_wait(kv_empty0 + 8 * x, (t / kStages - 1) & 1);
          const long long k0 = (sp.kt0 + i) * kBlockN;
          const int nk = (int)min((long long)kBlockN, sp.k_len - k0);
          if (threadIdx.x == 0)
            tiles_s[x] = KeysTile{sp.k + k0 * stride - k, k0, sp.delta, slab, nk, seq, kTile};
          const unsigned slot = ring_a + x * 2 * kKBytes;
          load_rows<kBlockN>(slot, sp.k + k0 * stride, stride, nk);
          load_rows<kBlockN>(slot + kKBytes, sp.v + k0 * stride, stride, nk);
          mbar_arrive_on_copies(kv_full0 + 8 * x);
          if (threadIdx.x == 0) mbar_arrive(kv_full0 + 8 * x);
        }
        seq++;
      }
      hand_over(kSlabEnd, slab);
    }
    hand_over(kEnd, 0);
    // (the copies were never committed into groups: wait for them all)
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---- the computing warpgroups ----
  regs_inc<kMathRegs>();
  const int wg = wgi - 1;  // this warpgroup's keys: 64 wg.. of a tile
  const int g = lane >> 2, tq = lane & 3;
  const int key0 = 64 * wg + 16 * warp + g;  // this thread's first key row of a tile (+ 8)
  float dqt[kHalves][8][4];  // this warpgroup's dQ^T over the slab
  zero_acc(dqt);
  int cur = -1;  // the sequence whose dO slot is held
#pragma unroll 1
  for (int t = 0;; t++) {
    const int x = t % kStages;
    mbar_wait(kv_full0 + 8 * x, (t / kStages) & 1);
    const KeysTile kt = tiles_s[x];
    if (kt.kind == kEnd) break;
    if (kt.kind == kSlabEnd) {
      float *const out = di + broadcast_partials_at(heads, total_q) + kt.slab * n_q * stride +
                         (long long)h * kHeadDim;
      flush_dqt(dqt, out, stride, mq, wg, warp, lane,
                reinterpret_cast<float *>(reinterpret_cast<char *>(smem) + kDsAt));
      mbar_arrive(kv_empty0 + 8 * x);
      continue;
    }
    if (kt.seq != cur) {  // a new sequence: the last one's dO slot is free
      if (cur >= 0) mbar_arrive(seq_empty0 + 8 * (cur % kSeqStages));
      cur = kt.seq;
      mbar_wait(seq_full0 + 8 * (cur % kSeqStages), (cur / kSeqStages) & 1);
    }
    // the copies are read by wgmma, the async proxy
    fence_proxy_async();
    const int st = cur % kSeqStages;
    const unsigned k_a = ring_a + x * 2 * kKBytes, v_a = k_a + kKBytes;
    const unsigned dos_a = do_a + st * kQBytes;
    const float *const lse_r = rows_s + st * 2 * kBlockM, *const d_r = lse_r + kBlockM;

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys: rows
    // keys (key0, key0 + 8), columns the queries. Committed apart, so that
    // P^T is computed while dP^T runs.
    float sp_t[8][4], dp[8][4];  // S^T, then P^T in place
    wgmma_fence();
    keys_times_queries(sp_t, k_a, q_a, wg);
    wgmma_commit();
    keys_times_queries(dp, v_a, dos_a, wg);
    wgmma_commit();
    wgmma_wait<1>();
    wgmma_hold(sp_t);
    // P^T = exp2(scale * log2(e) * S^T - LSE * log2(e)): queries past n_q
    // (and those that see no key) have +inf there, so P^T is 0. Then the
    // band and the keys past the tile's end, as jagged_bwd_ws.cu masks.
    const Band band = tile_band(0, kt.k0, kt.delta);
    const bool full = kt.nk == kBlockN && band.lo <= -(kBlockM - 1) && band.hi >= kBlockN - 1;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const float2 lr = *reinterpret_cast<const float2 *>(lse_r + 8 * j + 2 * tq);
#pragma unroll
      for (int e = 0; e < 4; e++)
        sp_t[j][e] = fast_exp2(fmaf(sp_t[j][e], kScaleLog2, -((e & 1) ? lr.y : lr.x)));
    }
    if (!full) mask_unseen(sp_t, band, key0, mq, kt.nk, tq);
    wgmma_wait<0>();
    wgmma_hold(dp);
    // dS^T = P^T (.) (dP^T - D), and both as 16-bit pairs (A operands).
    unsigned p16[8][2], ds16[8][2];
    p_ds_pairs(sp_t, dp, d_r, tq, p16, ds16);
    // dS^T to this warpgroup's 64 rows of room t % 2 (the last tile's dQ^T
    // read the other one), for dQ^T.
    const unsigned dst_a = ds_a + (t & 1) * kDsBytes;
    store_ds_t_x4(dst_a, 64 * wg + 16 * warp, ds16, lane);
    fence_proxy_async();  // dS^T is read by wgmma
    named_barrier_sync(1 + wg, 128);

    // dV = P^T dO with dQ^T += K^T dS^T, then dK = dS^T Q: one of dV, dK
    // in registers at a time.
    float acc[kHalves][8][4];
    zero_acc(acc);
    wgmma_fence();
    keys_product(acc, p16, dos_a);
    issue_dqt(dqt, k_a, dst_a, wg);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int hh = 0; hh < kHalves; hh++) {
      wgmma_hold(acc[hh]);
      wgmma_hold(dqt[hh]);
    }
    keep(p16);
    store_key_rows(acc, 1.f, dv + kt.kv_at, stride, key0, kt.nk, tq);
    zero_acc(acc);
    wgmma_fence();
    keys_product(acc, ds16, q_a);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int hh = 0; hh < kHalves; hh++) wgmma_hold(acc[hh]);
    keep(ds16);
    // every product reading the slot is done: the next tile may land
    mbar_arrive(kv_empty0 + 8 * x);
    store_key_rows(acc, kScale, dk + kt.kv_at, stride, key0, kt.nk, tq);
  }
}
/* ---- end kernel ---- */
