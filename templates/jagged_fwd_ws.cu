@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_fwd_ws.cu: jagged (varlen) attention forward on sm_90a, warp
@# specialized: warpgroup 0 copies Q and a ring of K/V tiles (cp.async,
@# completion on mbarriers), each further warpgroup computes 64 query rows
@# on wgmma, issuing S of a tile and then the last tile's P V and running
@# S's softmax while that P V does; the computing warpgroups (two, or three
@# on 192-row tiles) take turns issuing, so that one's softmax runs under
@# the others' products. The plan
@# picks it on sm_90a for the main forward (the short-sequence tiles are
@# jagged_fwd_sm90.cu's at head dim 128, jagged_fwd.cu's at 64); with
@# rotary embeddings only with .sm90_fwd_ws_rotary (else they take
@# jagged_fwd_sm90.cu or jagged_fwd.cu).
@# Placeholders: @KERNEL_NAME@ @PARAMS@ @HEAD_DIM@ (64 | 128) @BLOCK_M@
@#   (query rows per CTA: 128, two computing warpgroups of 64; or 192,
@#   three, one tile a CTA)
@#   @BLOCK_N@ (keys per KV tile, 64 or 128) @STAGES@ (KV tiles resident,
@#   >= 2) @CTA_ITEMS@ (query tiles a CTA computes in turn) @Q_TILES@ (Q
@#   slots, 1 or 2) @TABLE_ROWS@ (0, or BLOCK_N with rotary tables: a slot
@#   for the table rows of the tile rotated next) @SMEM_BYTES@ (= (Q_TILES
@#   * BLOCK_M + TABLE_ROWS + 2 * STAGES * BLOCK_N) * HEAD_DIM * 2)
@#   @SCALE_LOG2@ @SCALE_TEXT@ @MMA_TYPE@ @PAIR_TYPE@ @CAUSAL@ @WINDOW@
@#   @WINDOW_LEFT@ @WINDOW_RIGHT@ @BROADCAST@ (as in jagged_fwd.cu) @ROTARY@
@#   (true: the loading warpgroup rotates each landed tile, below) @TMA_KV@ @SKIP_DEAD@
@#   @EXP2_FMA_EVERY@ (all three below; a condition too) @HEADS_INNER@
@#   (a condition: below).
@# Includes: jagged_fwd_sm90_consts.cuh (with jagged_fwd_band.cuh),
@#   jagged_fwd_sm90_parts.cuh (mma_sm80.cuh, copy_rows.cuh, wgmma_sm90.cuh,
@#   jagged_walk.cuh, jagged_fwd_span.cuh, jagged_fwd_wgmma.cuh),
@#   pipeline_sm90.cuh, tma_sm90.cuh (TMA_KV); with ROTARY unpack2.cuh and
@#   jagged_rotary.cuh.
@# Conditions: TMA_KV (K and V tiles by TMA: the kernel takes tmap_k,
@#   tmap_v last), HEADS_INNER (the grid is (CTAs * heads, 1), CTA x
@#   computing the CTA_ITEMS items from (x / heads) * CTA_ITEMS of head
@#   x % heads, so that a sequence's heads run side by side and read its
@#   K, V rows together; else (CTAs, heads); CTAs = ceil(items / CTA_ITEMS)),
@#   ROTARY, ROTARY_TABLE (as in jagged_fwd.cu; not with TMA_KV or three
@#   computing warpgroups: the loading warpgroup rotates each Q and K/V
@#   tile once its copies land, in place, then arrives on the tile's
@#   barrier; a broadcast Q's row i at position i, the table's row i).
@# Host rule and parameters: as jagged_fwd.cu's, with 128 * (BLOCK_M / 64
@#   + 1) threads and 1 CTA an SM (the registers: 56 a loading thread, 224
@#   a computing one, with ROTARY 80 and 208; with three computing
@#   warpgroups 32 and 160), and
@#   ceil(num_tiles / CTA_ITEMS) CTAs a head.
/* ---- begin constants ---- */
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kBlockM = @BLOCK_M@;  // query rows per CTA
constexpr int kBlockN = @BLOCK_N@;  // keys per KV tile
constexpr int kWarpgroups = kBlockM / 64;  // each owns 64 query rows
constexpr int kThreads = 128 * (kWarpgroups + 1);  // warpgroup 0 loads
constexpr int kMathThreads = 128 * kWarpgroups;
// The computing warpgroups take turns issuing their products (named
// barriers, in a ring), so that one's softmax runs under the others'
// products; each then takes a turn on every tile (kSkipDead: issuing less,
// or nothing, where its rows see less), so that the turns match. On the
// H200 (D128, L 1024 / 4096) turns ran 385 / 514 TFLOP/s against 336 / 439
// without (bench/results/2026-12-03-h200-jagged-fwd-ws-harness.log). Two
// warpgroups, or three where a tile's softmax takes about as long as its
// products (head dim 64: as many exponentials as S elements the tensor
// cores compute), so that two others' products cover it.
static_assert(kWarpgroups == 2 || kWarpgroups == 3,
              "two or three computing warpgroups of 64 rows");
// setmaxnreg budgets (three: the 65,536 registers over 512 threads)
// (with rotary embeddings the loading thread rotates: 80 and 208, where
// ptxas spilled 4-12 bytes of a loading thread at 56 to 72)
constexpr int kLoadRegs = kWarpgroups == 2 ? (@ROTARY@ ? 80 : 56) : 32,
              kMathRegs = kWarpgroups == 2 ? (@ROTARY@ ? 208 : 224) : 160;
// setmaxnreg moves registers within what the CTA is launched with: 65,536
// / kThreads a thread, rounded down to a multiple of 8 (168 for 384).
static_assert(128 * kLoadRegs + kMathThreads * kMathRegs <=
                  kThreads * (65536 / kThreads / 8 * 8),
              "the registers the CTA is launched with");
constexpr int kStages = @STAGES@;  // KV tiles resident
// A CTA computes kItems query tiles in turn: the loading warpgroup runs on
// into the next tile's Q and K, V while the computing warpgroups end this
// one; with two Q slots the next tile's Q lands meanwhile too.
constexpr int kItems = @CTA_ITEMS@;
constexpr int kQTiles = @Q_TILES@;  // Q slots (each also stages its tile's O)
static_assert(kItems >= 1 && (kQTiles == 1 || kQTiles == 2), "items a CTA; Q slots");
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
// With rotary tables, a slot (after the K/V stages) where the loading
// warpgroup copies the table rows of the tile it rotates next, so that the
// rotation reads shared memory instead of one L2 round trip a row.
constexpr int kTableRows = @TABLE_ROWS@;
@include jagged_fwd_sm90_consts.cuh@
static_assert((kQTiles * kBlockM + kTableRows + 2 * kStages * kBlockN) * kHeadDim * 2 ==
                  kSmemBytes,
              "the plan's shared memory is the Q tiles, the table slot and the K/V stages");
static_assert(kTableRows == (@ROTARY@ && @ROTARY_TABLE@ ? kBlockN : 0),
              "a table slot of a tile's rows, with rotary tables");
// K and V tiles by TMA (tmap_k, tmap_v: boxes of 64 columns by kBlockN
// keys, issued by one loading thread on the stage's full barrier) instead
// of cp.async by the loading warpgroup. Keys past a sequence's end are then
// the next sequence's (zeros past the tensor), not zeros: the tile view
// masks every column past the real keys, so P is 0 there (but a
// neighbour's Inf or NaN in V would reach O as 0 x Inf).
constexpr bool kTmaKv = @TMA_KV@;
static_assert(kBlockN % 64 == 0 && kBlockN <= 128, "KV tiles of 64 or 128 keys");
static_assert(kStages >= 2, "a stage is refilled once its P V has run");
// A computing warpgroup issues no product at all where all its rows are
// past the query tile's end (a tile of 64 rows or fewer), and S over the
// first 64 keys alone on an item's first K/V tile where none of its rows
// sees a key past them (the keys' end, a causal diagonal; sees() below);
// it still takes its turns. (The P V of that tile, and any part of the
// run's tiles, stay whole: see the kernel for why.)
constexpr bool kSkipDead = @SKIP_DEAD@;
@if EXP2_FMA_EVERY@
// Every kExp2FmaEvery-th 8-key chunk of S takes its exponentials on the
// FMA pipe (exp2_fma), the rest on MUFU.EX2, whose 16 a clock an SM are
// the matmul rate's S elements at head dim 64.
constexpr int kExp2FmaEvery = @EXP2_FMA_EVERY@;
@endif@
// Rotary embeddings: the loading warpgroup waits for each tile's copies,
// rotates the tile in place and then arrives on its barrier (the copies
// by cp.async, not TMA: its threads hold the landed rows' chunks), with
// 80 registers a loading thread and 208 a computing one; the 32 a loading
// thread has beside three computing warpgroups would not hold it.
constexpr bool kRotary = @ROTARY@;
static_assert(!kRotary || (!kTmaKv && kWarpgroups == 2 && kBlockM == kBlockN),
              "rotary embeddings: cp.async K, V; two computing warpgroups; one tile layout");
/* ---- end constants ---- */

@include jagged_fwd_sm90_parts.cuh@

@include pipeline_sm90.cuh@
@if ROTARY@

@include unpack2.cuh@

// Element offset of chunk `chunk` of tile row `row` (the rotation's view
// of chunk_at: the Q tile and the K, V tiles have the same rows).
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return (int)(chunk_at(kBlockN, row, chunk) / 2);
}

@include jagged_rotary.cuh@

// bar.sync on named barrier 5: the loading warpgroup alone.
__device__ __forceinline__ void loader_sync() { asm volatile("bar.sync 5, 128;\n" ::: "memory"); }
@if ROTARY_TABLE@

// sin and cos of unit cc's pairs (see rotary_core.cuh) for row `row` of
// the table rows staged at `tab` in the tiles' layout.
__device__ __forceinline__ void staged_angles(const unsigned short *tab, int row, int cc,
                                              float (&s)[kUnitPairs], float (&c)[kUnitPairs]) {
@if ROTARY_HALF@
  // Pairs 8cc .. 8cc + 7: sin is chunk cc of the row, cos chunk cc + kHeadChunks / 2.
  const uint4 sw = *reinterpret_cast<const uint4 *>(tab + swizzle(row, cc));
  const uint4 cw = *reinterpret_cast<const uint4 *>(tab + swizzle(row, cc + kHeadChunks / 2));
  unpack(sw.x, sw.y, sw.z, sw.w, s);
  unpack(cw.x, cw.y, cw.z, cw.w, c);
@else@
  // Pairs 4cc .. 4cc + 3: sin is half cc % 2 of chunk cc / 2 of the row, cos
  // the same half kHeadChunks / 2 chunks on.
  const int half = 4 * (cc & 1);
  const uint2 sw = *reinterpret_cast<const uint2 *>(tab + swizzle(row, cc >> 1) + half);
  const uint2 cw =
      *reinterpret_cast<const uint2 *>(tab + swizzle(row, (cc >> 1) + kHeadChunks / 2) + half);
  unpack(sw.x, sw.y, s);
  unpack(cw.x, cw.y, c);
@endif@
}
@endif@

// The loading warpgroup's own copies landed (and every other loading
// thread's, after the barrier): the tile at `tile` (elements) is rotated
// in place, rows [0, rows), with the angles of the table rows staged at
// `tab` (ROTARY_TABLE: the table slot), else computed from `rr`; fenced
// for wgmma's reads, and each loading thread arrives on barrier `bar`. b:
// V beside K, or null.
__device__ __forceinline__ void rotate_landed(unsigned short *a, unsigned short *b, int rows,
                                              const RotaryRows &rr, const unsigned short *tab,
                                              unsigned bar) {
  if (!a && !b) {  // nothing to rotate (the same in every loading thread)
    mbar_arrive_on_copies(bar);
    return;
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  loader_sync();
@if ROTARY_TABLE@
  (void)rr;
  {
    constexpr int kUnitRows = 128 / kUnitsPerRow;  // rows rotated at a time
    const int cc = threadIdx.x % kUnitsPerRow;
#pragma unroll 1
    for (int row = threadIdx.x / kUnitsPerRow; row < rows; row += kUnitRows) {
      float s[kUnitPairs], c[kUnitPairs];
      staged_angles(tab, row, cc, s, c);
      if (a) rotate_unit<Swizzled>(a, row, cc, s, c);
      if (b) rotate_unit<Swizzled>(b, row, cc, s, c);
    }
    loader_sync();  // the slot's rows read by every loading thread: it may be refilled
  }
@else@
  (void)tab;
  rotate_rows<Swizzled, 128>(a, b, rows, rr, threadIdx.x);
@endif@
  fence_proxy_async();
  mbar_arrive(bar);
}
@endif@

@if TMA_KV@
@include tma_sm90.cuh@

@endif@
// bar.sync on named barrier 1: the computing warpgroups alone.
__device__ __forceinline__ void math_sync() {
  asm volatile("bar.sync 1, %0;\n" :: "n"(kMathThreads) : "memory");
}
// Turns: warpgroup w waits at barrier 2 + w for its turn to issue, and
// gives the turn to the next one (w + 1, the last to 0) after issuing; the
// last warpgroup gives the first its first turn, and takes no turn to give
// after its last.
__device__ __forceinline__ void turn_wait(int wg) {
  asm volatile("bar.sync %0, 256;\n" :: "r"(2 + wg) : "memory");
}
__device__ __forceinline__ void turn_pass(int wg) {
  const int next = kWarpgroups == 2 ? 3 - wg : (wg == kWarpgroups - 1 ? 2 : 3 + wg);
  asm volatile("bar.arrive %0, 256;\n" :: "r"(next) : "memory");
}

// What computing warpgroup rows wrow..wrow + 63 see of tile t (kSkipDead;
// all of it where it is off): its first 64 keys alone where none of the
// rows sees a key past them (the keys end there, or a causal diagonal
// does), else all of it.
enum { kSeesFirst64, kSeesAll };
__device__ __forceinline__ int sees(const TileView &t, int wrow) {
  if constexpr (kSkipDead && kKeyHalves == 2) {
    bool upper = t.kv_valid > 64;  // keys 64.. exist
    if constexpr (kHasRight) upper = upper && wrow + 63 + t.diag_hi >= 64;  // the last row's
    if constexpr (kHasLeft) upper = upper && wrow + t.diag_lo <= 127;  // the first row's
    if (!upper) return kSeesFirst64;
  }
  return kSeesAll;
}

// 1024-byte aligned: the swizzle's 8-row atoms start at multiples of 1024.
extern __shared__ __align__(1024) unsigned short smem[];

/* ---- begin kernel ----
 * A CTA computes the query tiles kItems * blockIdx.x .. + kItems - 1 of
 * the walk (each of them virtual tile num_tiles - 1 - item, taken in
 * reverse as jagged_fwd.cu does) of head blockIdx.y, one after another.
 * Warpgroup 0 copies each tile's Q into its slot (item u of the CTA's
 * valid ones: slot u % kQTiles, refilled once that slot's last tile has
 * stored its output) and the K/V tiles of the walks (last first) into a
 * ring of kStages stages, numbered on across the CTA's tiles, each refilled
 * once every computing warpgroup released it. Warpgroup 1 + w owns query
 * rows 64w..64w+63. Per KV tile: S = Q K^T issued, then the last tile's
 * O += P V, and the wait for S alone; the softmax of S runs while that P V
 * does; then the wait for P V, its stage released, O rescaled, P packed. */
extern "C" __global__ void __launch_bounds__(kThreads, 1)
@KERNEL_NAME@(@PARAMS@) {
  // Q full[q], Q empty[q], full[s], empty[s]
  __shared__ __align__(8) unsigned long long bars[2 * kQTiles + 2 * kStages];
@if HEADS_INNER@
  // heads inner: CTA x is head x % heads of item x / heads
  const int h = (int)(blockIdx.x % (unsigned)heads);
@else@
  const int h = blockIdx.y;
@endif@
  const unsigned q_a = smem_addr(smem), kv_a = q_a + kQTiles * kQBytes;
  // the table slot (kTableRows), after the K/V stages
  [[maybe_unused]] const unsigned table_a = kv_a + kStages * 2 * kKvBytes;
  const unsigned q_full0 = smem_addr(bars), q_empty0 = q_full0 + 8 * kQTiles;
  const unsigned full0 = q_empty0 + 8 * kQTiles, empty0 = full0 + 8 * kStages;
  if (threadIdx.x == 0) {
    for (int q = 0; q < kQTiles; q++) {
      mbar_init(q_full0 + 8 * q, 128);           // every loading thread's copies (or arrival)
      mbar_init(q_empty0 + 8 * q, kMathThreads);  // every computing thread
    }
    for (int s = 0; s < kStages; s++) {
      mbar_init(full0 + 8 * s, kTmaKv ? 1 : 128);  // thread 0's expect_tx, or every copy (arrival)
      mbar_init(empty0 + 8 * s, kMathThreads / 32);
    }
    mbar_init_fence();
  }
  __syncthreads();
  // The warpgroup, broadcast from lane 0 so that the compiler sees it
  // warp-uniform (wgmma under a branch it cannot prove uniform serializes).
  const int wgi = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);
@if HEADS_INNER@
  const long long item0 = (long long)(blockIdx.x / (unsigned)heads) * kItems;
@else@
  const long long item0 = (long long)blockIdx.x * kItems;
@endif@

  if (wgi == 0) {
    // ---- the loading warpgroup ----
    regs_dec<kLoadRegs>();
    int u = 0;  // the CTA's valid tiles so far
    int g = 0;  // its K/V tiles so far: the ring's position
#pragma unroll 1
    for (int it = 0; it < kItems && item0 + it < num_tiles; it++) {
      const JaggedTile jt =
          query_tile_at(cu_seqlens_q, cu_seqlens_k, batch, total_q, num_tiles, item0 + it);
      if (!jt.valid) continue;  // the same answer in every warp
      const QuerySpan span = query_span(jt, total_k, h, heads, kv_heads);
      const unsigned short *k_src = k + span.kv_at;
      const unsigned short *v_src = v + span.kv_at;
      // the item's K/V tile i (last first) into the ring's stage g
      auto load_kv = [&](int i) {
        const int s = g % kStages;
        if (g >= kStages) mbar_wait(empty0 + 8 * s, (g / kStages - 1) & 1);
        const long long n0 = (long long)(span.n_first + span.n_tiles - 1 - i) * kBlockN;
        const int valid = (int)(span.lk - n0 < kBlockN ? span.lk - n0 : kBlockN);
        const unsigned st = kv_a + s * 2 * kKvBytes;
@if TMA_KV@
        (void)valid, (void)k_src, (void)v_src;
        if (threadIdx.x == 0) {  // K, then V: kHalves boxes of 64 columns each
          const int key = (int)(span.k_start + n0);
          mbar_arrive_expect_tx(full0 + 8 * s, 2 * kKvBytes);
#pragma unroll
          for (int hh = 0; hh < kHalves; hh++) {
            tma_load_3d(st + hh * (kKvBytes / kHalves), &tmap_k, full0 + 8 * s, 64 * hh,
                        span.kvh, key);
            tma_load_3d(st + kKvBytes + hh * (kKvBytes / kHalves), &tmap_v, full0 + 8 * s,
                        64 * hh, span.kvh, key);
          }
        }
@else@
        load_rows<kBlockN, 128>(st, k_src + n0 * span.kv_stride, span.kv_stride, valid);
        load_rows<kBlockN, 128>(st + kKvBytes, v_src + n0 * span.kv_stride, span.kv_stride,
                                valid);
@if ROTARY@
@if ROTARY_TABLE@
        const RotaryRows rk = {0, rotary_table_k + (span.k_start + n0) * kHeadDim};
        if (kTableRows > 0 && (kRotateK || kRotateV))
          load_rows<kBlockN, 128>(table_a, rk.table, kHeadDim, valid);
@else@
        const RotaryRows rk = {n0, nullptr};
@endif@
        unsigned short *const tile = smem + (st - q_a) / 2;
        rotate_landed(kRotateK ? tile : nullptr, kRotateV ? tile + kKvBytes / 2 : nullptr, valid,
                      rk, smem + (table_a - q_a) / 2, full0 + 8 * s);
@else@
        mbar_arrive_on_copies(full0 + 8 * s);
@endif@
@endif@
        g++;
      };
      // With one Q slot, the first K/V tiles go before the wait for it (no
      // more than kStages: a stage's refill waits only on earlier tiles);
      // with rotary embeddings not before a Q that needs no wait (the
      // loader finishes each tile before the next: Q would wait behind).
      const int pre = kQTiles == 2 || (kRotary && u < kQTiles) ? 0 : min(span.n_tiles, kStages);
      int i = 0;
#pragma unroll 1
      for (; i < pre; i++) load_kv(i);
      const int qs = u % kQTiles;
      if (u >= kQTiles) mbar_wait(q_empty0 + 8 * qs, (u / kQTiles - 1) & 1);
      if (span.n_tiles > 0)
        load_rows<kBlockM, 128>(q_a + qs * kQBytes, q + span.q_at, span.q_stride, span.rows);
@if ROTARY@
      // (A broadcast Q's row i: position i, the table's row i, whatever the
      // sequence.)
@if ROTARY_TABLE@
      const RotaryRows rq = {0, rotary_table + ((kBroadcast ? 0 : jt.start) + span.m0) * kHeadDim};
      if (kTableRows > 0 && kRotateQ && span.n_tiles > 0)
        load_rows<kBlockM, 128>(table_a, rq.table, kHeadDim, span.rows);
@else@
      const RotaryRows rq = {kBroadcast ? span.m0 : span.m0 + span.shift, nullptr};
@endif@
      rotate_landed(kRotateQ && span.n_tiles > 0 ? smem + qs * (kQBytes / 2) : nullptr, nullptr,
                    span.rows, rq, smem + (table_a - q_a) / 2, q_full0 + 8 * qs);
@else@
      mbar_arrive_on_copies(q_full0 + 8 * qs);  // at once where nothing was copied
@endif@
      u++;
#pragma unroll 1
      for (; i < span.n_tiles; i++) load_kv(i);
    }
    cp_async_wait<0>();
    return;
  }

  // ---- the computing warpgroups ----
  regs_inc<kMathRegs>();
  const int mt = threadIdx.x - 128;  // thread index among the computing ones
  const RowPlace me = row_place(mt);  // rows r_lo, r_lo + 8 of warpgroup wg
  const int wg = me.wg, tq = me.tq, wrow0 = me.wrow0, r_lo = me.r_lo;
  const int wrow_u = 64 * (wgi - 1);  // wrow0, as the compiler sees it warp-uniform
  const int lane = mt & 31;
  int u = 0;  // as the loader's
  int g = 0;
#pragma unroll 1
  for (int it = 0; it < kItems && item0 + it < num_tiles; it++) {
    const JaggedTile jt =
        query_tile_at(cu_seqlens_q, cu_seqlens_k, batch, total_q, num_tiles, item0 + it);
    if (!jt.valid) continue;  // the same answer in every warp
    const QuerySpan span = query_span(jt, total_k, h, heads, kv_heads);
    // any of this warpgroup's rows real (as far as kSkipDead asks)
    const bool active = !kSkipDead || wrow_u < span.rows;
    const int qs = u % kQTiles;
    const unsigned qt_a = q_a + qs * kQBytes;
    mbar_wait(q_full0 + 8 * qs, (u / kQTiles) & 1);
    u++;
    float acc[kHalves][8][4];
    clear_out(acc);
    float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
    unsigned p16[kBlockN / 16][4];  // P of the tile whose P V is next, as A fragments
    float sc[kKeyHalves][8][4];      // S of the tile in hand
    float alpha[2];
    // tile 0's first key
    const long long key_last = (long long)(span.n_first + span.n_tiles - 1) * kBlockN;
    auto view = [&](int i) {
      // every tile taken (none skipped), so that the turns match
      return tile_view(key_last - (long long)i * kBlockN, span.lk, span.m0 + span.shift,
                       span.rows);
    };
    // the item's tile i is the ring's g + i
    auto wait_full = [&](int i) {
      mbar_wait(full0 + 8 * ((g + i) % kStages), ((g + i) / kStages) & 1);
      // the copies are read by wgmma (the async proxy); TMA's already are
      if constexpr (!kTmaKv) fence_proxy_async();
    };
    auto release = [&](int i) {
      if (lane == 0) mbar_arrive(empty0 + 8 * ((g + i) % kStages));
    };
    auto stage_k = [&](int i) { return kv_a + ((g + i) % kStages) * 2 * kKvBytes; };

    int i = 0;
    if (span.n_tiles > 0 && !active) {
      // No real row in this warpgroup: its turns (as below) and releases
      // alone, O left 0. (A branch around the products inside the run
      // below makes ptxas serialize every wgmma, C7515.)
      if (wg == kWarpgroups - 1) turn_pass(wg);
#pragma unroll 1
      for (; i < span.n_tiles; i++) {
        wait_full(i);  // (so that the release is this fill's)
        turn_wait(wg);
        turn_pass(wg);
        release(i);
      }
      turn_wait(wg);
      if (kWarpgroups == 2 ? wg == 0 : wg != kWarpgroups - 1) turn_pass(wg);  // (as below)
    } else if (span.n_tiles > 0) {
      if constexpr (kTmaKv) fence_proxy_async();  // Q (cp.async) is read by wgmma
      if (wg == kWarpgroups - 1) turn_pass(wg);  // warpgroup 0 issues first
      // The first tile this warpgroup computes: S and its softmax alone.
      TileView t = view(i);
      const int seen = sees(t, wrow_u);  // of tile i
      wait_full(i);
      wgmma_fence();
      turn_wait(wg);
      // (ptxas serializes every wgmma of the kernel, C7515, where one of
      // them writes some of S's accumulators and another all of them: the
      // first 64 keys' S goes to accumulators of its own)
      if (seen == kSeesAll) {
        issue_s(sc, qt_a, stage_k(i), wrow0);
        turn_pass(wg);
        wgmma_wait<0>();
#pragma unroll
        for (int nh = 0; nh < kKeyHalves; nh++) wgmma_hold(sc[nh]);
      } else {  // kSeesFirst64
        float lo[kKeyHalves][8][4];
        issue_s<0, 1>(lo, qt_a, stage_k(i), wrow0);
        turn_pass(wg);
        wgmma_wait<0>();
        wgmma_hold(lo[0]);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
          for (int e = 0; e < 4; e++) sc[0][n][e] = lo[0][n][e];
        // (the keys past 64 are masked below, whatever sc holds there:
        // tile_view's mask is on wherever sees() answers kSeesFirst64)
      }
      softmax_step(sc, m, l, alpha, t, r_lo, tq);
      pack_p(p16, sc);
      int last = i;  // the tile whose P V is next
      // The run: S of tile i, then P V of the last tile, overlapped with S's
      // softmax, both over all keys (the first tile's P V too: P is 0
      // where its rows see nothing).
#pragma unroll 1
      for (i++; i < span.n_tiles; i++) {
        t = view(i);
        wait_full(i);
        wgmma_fence();
        turn_wait(wg);
        issue_s(sc, qt_a, stage_k(i), wrow0);
        issue_pv(acc, p16, stage_k(last) + kKvBytes);
        turn_pass(wg);
        wgmma_wait<1>();  // S; the P V runs on
#pragma unroll
        for (int nh = 0; nh < kKeyHalves; nh++) wgmma_hold(sc[nh]);
        softmax_step(sc, m, l, alpha, t, r_lo, tq);
        wgmma_wait<0>();  // the P V
#pragma unroll
        for (int hh = 0; hh < kHalves; hh++) wgmma_hold(acc[hh]);
        keep(p16);
        release(last);
        rescale(acc, alpha);
        pack_p(p16, sc);
        last = i;
      }
      wgmma_fence();
      turn_wait(wg);
      issue_pv(acc, p16, stage_k(last) + kKvBytes);
      // (the last issues last: no turn to give; written so for two warpgroups,
      // whose code a helper function changed)
      if (kWarpgroups == 2 ? wg == 0 : wg != kWarpgroups - 1) turn_pass(wg);
      wgmma_wait<0>();
#pragma unroll
      for (int hh = 0; hh < kHalves; hh++) wgmma_hold(acc[hh]);
      keep(p16);
      release(last);
    }
    g += span.n_tiles;

    // Normalise; stage the rows in the Q slot's place (every computing
    // warpgroup is done with Q after the barrier) as plain rows, 16-byte
    // chunks swizzled by the row, so that the global stores are 16-byte and
    // coalesced; then the slot is the loader's again.
    unsigned short *const stage = smem + qs * (kQBytes / 2);
    math_sync();
    stage_out(acc, m, l, stage, lse, h, total_q, jt.start, span.m0, span.rows, r_lo, tq);
    math_sync();
    store_out<kMathThreads>(o + span.o_at, span.q_stride, stage, span.rows, mt);
    if (kItems > 1) mbar_arrive(q_empty0 + 8 * qs);
  }
}
/* ---- end kernel ---- */
