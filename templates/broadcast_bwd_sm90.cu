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
@if ROTARY@

@include jagged_rotary.cuh@

/* ---- begin rotary embeddings in this kernel ----
 * Every copying thread rotates the rows it copied itself (load_rows'
 * assignment: piece c = tid % kPieces of rows tid / kPieces + kCopyRowStep
 * i), once its own copies landed, and then arrives on the tile's barrier
 * in place of its copies: no thread waits for another's, so the two
 * query warpgroups still need not meet. A tile is rotated under a dQ
 * product (kRotateLag tiles after its copy started, kStages - 1 tiles
 * ahead of its use), its table rows prefetched to L2 with the copy. In the half
 * layout a piece's partner (kPieces / 2 pieces on, the same row) is lane
 * ^ kPieces / 2's. The key warpgroup rotates dK (dV) back in registers;
 * the slab's dQ partial stays rotated for _dq_sum (as broadcast_bwd.cu). */
constexpr int kCopyRowStep = kCopyThreads / kPieces;  // rows one pass of the copiers covers
// A K, V tile's pieces a thread rotates with their angles' loads in flight
// together: all (2 or 4), but one at a time in the half layout (head dim
// 64), where ptxas spilled with two. Holding a tile's angles from its copy
// to its rotation spilled too.
constexpr int kTileGroup = @ROTARY_HALF@ ? 1 : kBlockN / kCopyRowStep;
// Tiles between a K, V tile's copy and its rotation: with three stages or
// more a tile is rotated a tile after its copy started (its use is two or
// more tiles on), so that the copy has a whole tile to land; with two, in
// the tile its copy started in.
constexpr int kRotateLag = kStages >= 3 ? 1 : 0;
static_assert(kCopyThreads % kPieces == 0 && 32 % kPieces == 0,
              "a piece's partner in the half layout is in the same warp");
static_assert(!@ROTARY_HALF@ || kHalves == 1,
              "the half layout's pairs in one 64-column part of dK (head dim 64)");

// ld.shared.v4.u32 / st.shared.v4.u32 at a 32-bit shared address (a
// piece of a tile; 32-bit addresses hold fewer registers than generic
// pointers).
__device__ __forceinline__ uint4 piece_load(unsigned a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ void piece_store(unsigned a, const uint4 &v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
               :: "r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// Rotate in place piece c (unit cc) of row `row` of the kRows-row
// matrices at shared address `at`, by angles u.
template <int kRows>
__device__ __forceinline__ void rotate_piece(unsigned at, int row, int c, int cc,
                                             const UnitAngles &u) {
  const unsigned p =
      at + (c >> 3) * (kRows * kRowBytes) + row * kRowBytes + (((c & 7) ^ (row & 7)) << 4);
  float s[kUnitPairs], cs[kUnitPairs];
  unit_angles(u, cc, s, cs);
@if ROTARY_HALF@
  // the partner piece, kPieces / 2 on in the same row: lane ^ kPieces / 2's
  const uint4 w = piece_load(p);
  uint4 o;
  o.x = __shfl_xor_sync(~0u, w.x, kPieces / 2);
  o.y = __shfl_xor_sync(~0u, w.y, kPieces / 2);
  o.z = __shfl_xor_sync(~0u, w.z, kPieces / 2);
  o.w = __shfl_xor_sync(~0u, w.w, kPieces / 2);
  const bool low = c < kPieces / 2;  // this piece holds the pairs' first elements
  uint4 x0 = low ? w : o, x1 = low ? o : w;
  rotate_halves(x0.x, x1.x, s[0], cs[0], s[1], cs[1]);
  rotate_halves(x0.y, x1.y, s[2], cs[2], s[3], cs[3]);
  rotate_halves(x0.z, x1.z, s[4], cs[4], s[5], cs[5]);
  rotate_halves(x0.w, x1.w, s[6], cs[6], s[7], cs[7]);
  piece_store(p, low ? x0 : x1);
@else@
  uint4 w = piece_load(p);
  w.x = rotate_pair(w.x, s[0], cs[0]);
  w.y = rotate_pair(w.y, s[1], cs[1]);
  w.z = rotate_pair(w.z, s[2], cs[2]);
  w.w = rotate_pair(w.w, s[3], cs[3]);
  piece_store(p, w);
@endif@
}

@if ROTARY_TABLE@
// Start bringing the table rows of this thread's pieces of a kRows-row
// tile (rows before `rows`) into L2 (prefetch.global.L2, PTX ISA 9.7.9.15):
// of each row's kHeadDim / 64 lines of 128 bytes, piece c < kHeadDim / 64
// asks for line c.
template <int kRows>
__device__ __forceinline__ void prefetch_angles(const RotaryRows &rr, int rows) {
  const int row0 = threadIdx.x / kPieces, c = threadIdx.x % kPieces;
  if (c >= kHeadDim / 64) return;
#pragma unroll
  for (int i = 0; i < kRows / kCopyRowStep; i++) {
    const int row = row0 + i * kCopyRowStep;
    const unsigned short *line = rr.table + (long long)row * kHeadDim + 64 * c;
    if (row < rows) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(line));
  }
}

@endif@
// Rotate in place the pieces this thread copied of the kRows-row matrices
// at shared address `at`, reading the angles (from `rr`; rows before
// `rows` real) of kGroup pieces at a time, their loads in flight together.
// Rows past the real ones are zeros and stay so (rotated by the last real
// row's angles: no branch, as in unrotate_part). The caller waited for
// its copies; fences and arrives after.
template <int kRows, int kGroup>
__device__ __forceinline__ void rotate_copied(unsigned at, const RotaryRows &rr, int rows) {
  const int row0 = threadIdx.x / kPieces, c = threadIdx.x % kPieces, cc = c % kUnitsPerRow;
  static_assert(kRows / kCopyRowStep % kGroup == 0, "whole groups");
#pragma unroll 1
  for (int i0 = 0; i0 < kRows / kCopyRowStep; i0 += kGroup) {
    UnitAngles u[kGroup];
#pragma unroll
    for (int k = 0; k < kGroup; k++)
      u[k] = unit_read(rr, min(row0 + (i0 + k) * kCopyRowStep, rows - 1), cc);
#pragma unroll
    for (int k = 0; k < kGroup; k++)
      rotate_piece<kRows>(at, row0 + (i0 + k) * kCopyRowStep, c, cc, u[k]);
  }
}

// sin and cos of pairs 2w and 2w + 1 of tile row `row`: one 32-bit word
// of each half of its table row (pair_angle reads 16-bit values: ptxas
// spilled with those in the key warpgroup), or computed.
__device__ __forceinline__ void word_angles(const RotaryRows &rr, int row, int w, float (&s)[2],
                                            float (&c)[2]) {
@if ROTARY_TABLE@
  const unsigned *t = reinterpret_cast<const unsigned *>(rr.table + (long long)row * kHeadDim);
  unpack2(__ldg(t + w), s[0], s[1]);
  unpack2(__ldg(t + kHeadDim / 4 + w), c[0], c[1]);
@else@
  rotary_sincos((float)(rr.pos0 + row) * kRotaryTurns[2 * w], s[0], c[0]);
  rotary_sincos((float)(rr.pos0 + row) * kRotaryTurns[2 * w + 1], s[1], c[1]);
@endif@
}

// Rotate the key warpgroup's 64-column part hh of dK (dV) back, pair by
// pair as unrotate_rows: rows row0 + g (+ 8) of the key tile, columns 64
// hh + 8 j + 2 tq + e in the wgmma C layout. Rows from `rows` on are not
// stored: they are rotated too, by the last real row's angles (no branch
// around the accumulator's registers: ptxas spilled hundreds of bytes
// with one, the two warpgroups' budgets as they are).
__device__ __forceinline__ void unrotate_part(float (&acc)[8][4], int hh, int row0, int rows,
                                              const RotaryRows &rr) {
  const int tq = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int row = min(row0 + g + 8 * hi, rows - 1);
@if ROTARY_HALF@
    (void)hh;
    // column 8j + 2tq + e of n-tile j < 4 pairs with the same column of
    // n-tile j + 4 (head dim 64): pair 8j + 2tq + e, of word 4j + tq
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float s[2], c[2];
      word_angles(rr, row, 4 * j + tq, s, c);
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float x0 = acc[j][2 * hi + e], x1 = acc[j + 4][2 * hi + e];
        acc[j][2 * hi + e] = x0 * c[e] + x1 * s[e];
        acc[j + 4][2 * hi + e] = x1 * c[e] - x0 * s[e];
      }
    }
@else@
    // columns 8j + 2tq, + 1 of the part: pair 32 hh + 4j + tq (from
    // tables, of word 16 hh + 2j + tq / 2)
#pragma unroll
    for (int j = 0; j < 8; j++) {
      float sn, cn;
@if ROTARY_TABLE@
      float s[2], c[2];
      word_angles(rr, row, 16 * hh + 2 * j + (tq >> 1), s, c);
      sn = tq & 1 ? s[1] : s[0];
      cn = tq & 1 ? c[1] : c[0];
@else@
      rotary_sincos((float)(rr.pos0 + row) * kRotaryTurns[32 * hh + 4 * j + tq], sn, cn);
@endif@
      const float x0 = acc[j][2 * hi], x1 = acc[j][2 * hi + 1];
      acc[j][2 * hi] = x0 * cn + x1 * sn;
      acc[j][2 * hi + 1] = x1 * cn - x0 * sn;
    }
@endif@
  }
}
/* ---- end rotary embeddings in this kernel ---- */
@endif@

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
@if ROTARY@
  const RotaryTables tables = @ROTARY_TABLES@;
@endif@
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
@if ROTARY@
            if (is_k ? kRotateK : kRotateV)  // of the unrotated K (V)
              unrotate_part(acc, hh, 16 * (warp & 3), nk,
                            rotary_rows(tables.k, sp.k_start + k0, k0));
@endif@
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
@if ROTARY@
    if (kRotateQ && !q_loaded) {
      // Q first, rotated (row i at position i, or the table's row i): each
      // thread its own pieces once its copies landed; its fence and
      // arrivals after the first tiles' rotation order them for wgmma.
      // (Rotated beside the first tiles, inside the walk, ptxas spilled.)
      load_rows<kBlockM>(q_a, q + (long long)h * kHeadDim, stride, mq);
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      rotate_copied<kBlockM, 2>(q_a, rotary_rows(tables.q, 0, 0), mq);
      q_loaded = true;
    }
@endif@
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
@if ROTARY@
      // With rotary embeddings a thread arrives on the full barrier of a
      // tile it rotates (and of the first tiles, after Q) once it has
      // rotated its pieces, not when its copies land.
      constexpr bool kRotateKV = kRotateK || kRotateV;
      auto tile_rows = [&](int t) {  // where tile t's keys' angles come from
        const long long k0 = (sp.kt0 + t) * kBlockN;
        return rotary_rows(tables.k, sp.k_start + k0, k0);
      };
@endif@
@if ROTARY@
      auto load_tile_kv = [&](int t, bool arrive) {
@else@
      auto load_tile_kv = [&](int t) {
@endif@
        const long long m = n0 + t;
        const int x = (int)(m % kStages);
        if (m >= kStages) mbar_wait(kv_empty0 + 8 * x, (unsigned)(m / kStages - 1) & 1);
        const long long k0 = (sp.kt0 + t) * kBlockN;
        const int nk = (int)min((long long)kBlockN, sp.k_len - k0);
        const unsigned slot = ring_a + x * 2 * kKBytes;
        load_rows<kBlockN>(slot, sp.k + k0 * stride, stride, nk);
        load_rows<kBlockN>(slot + kKBytes, sp.v + k0 * stride, stride, nk);
@if ROTARY@
        if (arrive) mbar_arrive_on_copies(kv_full0 + 8 * x);
@else@
        mbar_arrive_on_copies(kv_full0 + 8 * x);
@endif@
      };
#pragma unroll 1
@if ROTARY@
      for (int t = 0; t < kStages - 1 && t < sp.n_steps; t++) {
        load_tile_kv(t, false);
@if ROTARY_TABLE@
        if constexpr (kRotateKV)
          prefetch_angles<kBlockN>(tile_rows(t), (int)min((long long)kBlockN,
                                                          sp.k_len - (sp.kt0 + t) * kBlockN));
@endif@
      }
@else@
      for (int t = 0; t < kStages - 1 && t < sp.n_steps; t++) load_tile_kv(t);
@endif@
      // D of this warp's rows from memory while the tiles land.
      row_stats(o, dout, lse, nullptr, sp.o_row, stride, (long long)h * total_q + sp.q_start, mq,
                row0, lse_s, di_s);
      __syncwarp();
@if ROTARY@
      {
        // This thread's copies of dO and the first tiles landed: it
        // rotates its pieces of the tiles, fences them (and Q's) for
        // wgmma and arrives on the tiles' barriers.
        asm volatile("cp.async.wait_all;\n" ::: "memory");
#pragma unroll 1
        for (int t = 0; t < kStages - 1 && t < sp.n_steps; t++)
          if constexpr (kRotateKV) {
            const int nk = (int)min((long long)kBlockN, sp.k_len - (sp.kt0 + t) * kBlockN);
            const unsigned slot = ring_a + (unsigned)((n0 + t) % kStages) * 2 * kKBytes;
            if constexpr (kRotateK) rotate_copied<kBlockN, kTileGroup>(slot, tile_rows(t), nk);
            if constexpr (kRotateV)
              rotate_copied<kBlockN, kTileGroup>(slot + kKBytes, tile_rows(t), nk);
          }
        fence_proxy_async();
#pragma unroll
        for (int t = 0; t < kStages - 1; t++)
          if (t < sp.n_steps) mbar_arrive(kv_full0 + 8 * (unsigned)((n0 + t) % kStages));
      }
@endif@
      const float lse_lo = lse_s[row0 + g], lse_hi = lse_s[row0 + g + 8];
      const float d_lo = di_s[row0 + g], d_hi = di_s[row0 + g + 8];

#pragma unroll 1
      for (int i = 0; i < sp.n_steps; i++, n++) {
        // Tile i + kStages - 1 into the slot tile n - 1 freed (once both
        // query warpgroups are done with it), then wait for this one; the
        // two warpgroups need not meet otherwise, so that one's softmax can
        // run under the other's products.
@if ROTARY@
        // (its pieces rotated by this thread at the end of this tile)
        const bool ahead = i + kStages - 1 < sp.n_steps;
        if (ahead) load_tile_kv(i + kStages - 1, !kRotateKV);
        if constexpr (kRotateKV && kRotateLag == 1) cp_async_commit();  // (maybe empty)
@if ROTARY_TABLE@
        if (kRotateKV && ahead)
          prefetch_angles<kBlockN>(tile_rows(i + kStages - 1),
                                   (int)min((long long)kBlockN,
                                            sp.k_len - (sp.kt0 + i + kStages - 1) * kBlockN));
@endif@
@else@
        if (i + kStages - 1 < sp.n_steps) load_tile_kv(i + kStages - 1);
@endif@
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
@if ROTARY@
        // the tile whose copy started kRotateLag tiles ago (if it did)
        const int t = i + kStages - 1 - kRotateLag;
        if (kRotateKV && i >= kRotateLag && t < sp.n_steps) {
          // Under the dQ product: rotate this thread's pieces of tile t,
          // once they landed (the group of this tile's copy, if any, may
          // still be in flight), and arrive on its barrier.
          const int nk1 = (int)min((long long)kBlockN, sp.k_len - (sp.kt0 + t) * kBlockN);
          const unsigned slot = ring_a + (unsigned)((n0 + t) % kStages) * 2 * kKBytes;
          if constexpr (kRotateLag == 1) cp_async_wait<1>();
          else asm volatile("cp.async.wait_all;\n" ::: "memory");
          if constexpr (kRotateK) rotate_copied<kBlockN, kTileGroup>(slot, tile_rows(t), nk1);
          if constexpr (kRotateV)
            rotate_copied<kBlockN, kTileGroup>(slot + kKBytes, tile_rows(t), nk1);
          fence_proxy_async();
          mbar_arrive(kv_full0 + 8 * (unsigned)((n0 + t) % kStages));
        }
@endif@
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
