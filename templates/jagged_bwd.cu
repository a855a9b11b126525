@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd.cu: jagged (varlen) attention backward, mma.sync path (sm_80+,
@# runs as compiled on sm_90a): two deterministic kernels, no atomics.
@# Placeholders: @KERNEL_NAME@ @HEAD_DIM@ (64 | 128) @BLOCK_M@ (query rows of
@#   a tile) @BLOCK_N@ (key rows of a tile; this version needs BLOCK_M ==
@#   BLOCK_N == 16 * WARPS) @WARPS@ (warps per CTA, both kernels) @MIN_CTAS@
@#   (launch bound) @SMEM_BYTES_DQ@ @SMEM_BYTES_DKV@ (the plan's dynamic shared
@#   memory per kernel, checked against the layouts below:
@#     DQ  = 4 * HEAD_DIM * (BLOCK_M + 2 * BLOCK_N) + 8 * BLOCK_M
@#     DKV = 4 * HEAD_DIM * (BLOCK_N + 2 * BLOCK_M) + 16 * BLOCK_M)
@#   @SCALE@ (softmax scale, a float literal) @SCALE_LOG2@ (scale * log2(e))
@#   @SCALE_TEXT@ (the scale as the spec gave it, for a comment) @MMA_TYPE@
@#   @PAIR_TYPE@ (see mma_sm80.cuh) @CAUSAL@ @WINDOW@ (true | false)
@#   @WINDOW_LEFT@ @WINDOW_RIGHT@ (ints, read only with WINDOW: a negative side
@#   is unbounded; CAUSAL caps the right side at 0) @BROADCAST@ (0 | 1: one
@#   dense Q [n_q = total_q / batch, heads, HEAD_DIM] shared by every
@#   sequence; its dQ is the sum over the batch, by slabs and _dq_sum)
@#   @ROTARY_TABLES@ (the kernels' RotaryTables: {rotary_table,
@#   rotary_table_k} with ROTARY_TABLE, else {nullptr, nullptr}).
@# Conditions: ROTARY (rotary embeddings: jagged_rotary.cuh's conditions and
@#   placeholders; with BROADCAST query row i of the shared Q is at the
@#   fixed position i, or reads row i of the queries' table, and _dq_sum
@#   rotates the summed dQ back), ROTARY_TABLE (its positions from tables:
@#   every kernel then takes rotary_table [total_q, HEAD_DIM] (BROADCAST:
@#   [n_q, HEAD_DIM]) and rotary_table_k [total_k, HEAD_DIM] after `di`);
@#   other features are selected with constexpr.
@# Grids (threads 32 * WARPS, dynamic shared memory as above, one stream,
@# _dq first): @KERNEL_NAME@_dq: (batch + total_q / BLOCK_M, heads), with
@#   num_tiles = batch + total_q / BLOCK_M;
@#   @KERNEL_NAME@_dkv: (batch + total_k / BLOCK_N, kv_heads), with
@#   num_tiles = batch + total_k / BLOCK_N.
@# With BROADCAST: _dq (q_tiles * slabs, heads), num_tiles = q_tiles * slabs
@#   (q_tiles = ceil(n_q / BLOCK_M)); _dkv as above; then
@#   @KERNEL_NAME@_dq_sum: (ceil(n_q * heads * HEAD_DIM / (4 * SUM_THREADS)), 1),
@#   SUM_THREADS threads, num_tiles = slabs (every kernel takes the same
@#   parameters); `di` then also holds the slabs' partials at
@#   broadcast_partials_at(heads, total_q) floats.
@# (gridDim.x may be smaller or larger than num_tiles: each CTA strides;
@#  blockIdx.y is the q head, resp. the kv head.) `di` is [heads, total_q]
@#  fp32 scratch that _dq writes and _dkv reads.
@# Includes jagged_bwd_band.cuh, mma_sm80.cuh, copy_rows.cuh, unpack2.cuh and
@#  jagged_bwd_tile.cuh
@#  unconditionally
@#  (and jagged_rotary.cuh with ROTARY):
@#  a source that also holds another kernel needs these in a namespace.
/* ---- begin jagged backward constants ---- */
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kBlockM = @BLOCK_M@;  // query rows of a tile
constexpr int kBlockN = @BLOCK_N@;  // key rows of a tile
constexpr int kWarps = @WARPS@;  // warps per CTA: 16 stationary rows each
constexpr int kThreads = kWarps * 32;
constexpr int kMinCtasPerSm = @MIN_CTAS@;  // launch bound: registers fit this many CTAs
constexpr int kSmemBytesDq = @SMEM_BYTES_DQ@;  // dynamic shared memory of _dq, as planned
constexpr int kSmemBytesDkv = @SMEM_BYTES_DKV@;  // dynamic shared memory of _dkv, as planned
@include jagged_bwd_band.cuh@
constexpr bool kBroadcast = @BROADCAST@;  // one dense Q shared by every sequence
constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of dQ, dK and dV
constexpr int kKeyTiles = kBlockN / 8;  // n-tiles of S and dP over a key tile (_dq)
constexpr int kQueryTiles = kBlockM / 8;  // n-tiles of S^T and dP^T over a query tile (_dkv)
static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim 64 or 128");
static_assert(kBlockM == 16 * kWarps && kBlockN == 16 * kWarps,
              "each warp owns 16 stationary rows; tiles of both kinds are 16 * WARPS rows");
// _dq: Q and dO of the query tile, then two K, V slots (a ring: the next
// key tile loads while this one is computed), then each query row's
// LSE * log2(e) and D, in floats.
constexpr int kQTileElems = kBlockM * kHeadDim;
constexpr int kKTileElems = kBlockN * kHeadDim;
static_assert(2 * (2 * kQTileElems + 4 * kKTileElems) + 2 * 4 * kBlockM == kSmemBytesDq,
              "the plan's _dq shared memory is Q, dO, two K, V slots and two floats a row");
// _dkv: K and V of the key tile, then two Q, dO slots, then two slots of
// LSE * log2(e) and D for the query rows of a Q, dO slot.
static_assert(2 * (2 * kKTileElems + 4 * kQTileElems) + 2 * 2 * 4 * kBlockM == kSmemBytesDkv,
              "the plan's _dkv shared memory is K, V, two Q, dO slots and their row floats");
/* ---- end jagged backward constants ---- */

@include mma_sm80.cuh@

@include copy_rows.cuh@

@include unpack2.cuh@

@include jagged_bwd_tile.cuh@
@if ROTARY@

@include jagged_rotary.cuh@

// The angles of a query tile's rows q0.. of sequence sp: at q0 + Lk - Lq
// (the table's rows from the sequence's first token); a broadcast Q's
// rows at q0, the table's rows q0.., the same in every sequence.
__device__ __forceinline__ RotaryRows query_rotary(const RotaryTables &tables, const SeqSpan &sp,
                                                   long long q0) {
  return rotary_rows(tables.q, sp.q_src + q0, kBroadcast ? q0 : q0 + sp.k_len - sp.q_len);
}
@endif@

// The CTA's dynamic shared memory (layouts above).
extern __shared__ __align__(128) unsigned short smem[];

/* ---- begin the math ----
 * Per (sequence, q head h, kv head h / (heads / kv_heads)), with
 * P = exp(scale * S - LSE) recomputed from the forward's LSE, S = Q K^T
 * over the keys each query sees, and dO given:
 *   D = rowsum(dO (.) O),  dP = dO V^T,  dS = P (.) (dP - D),
 *   dQ = scale * dS K,     dK = scale * dS^T Q,   dV = P^T dO
 * (dK, dV summed over the q heads of a kv head). dS is rounded unscaled and
 * the scale is applied in fp32 as dQ and dK are stored. Rows whose LSE is
 * -inf (no key) and rows past a sequence's end take LSE = +inf, so P = 0;
 * their D is 0. Both kernels keep every gradient row in one CTA and walk
 * their tiles in a fixed order: bit-identical results, no atomics.
 * ---- end the math ---- */

/* ---- begin kernel _dq ----
 * Q-stationary: a CTA owns one query tile of one head; it computes D for
 * its rows (from O and dO in memory) and writes it to `di` [heads,
 * total_q], then walks the key tiles of the band, K and V streaming
 * through two slots, and stores dQ. With a broadcast Q a CTA owns one
 * query tile of one head over a slab of sequences (slab_start): it adds
 * every sequence's dQ in order in registers and stores the slab's fp32
 * partial after D, [slabs, n_q, heads, kHeadDim] (num_tiles = q_tiles *
 * slabs), for _dq_sum. */

// One sequence's part of a query tile's dQ (rows q0.., mq of them real),
// added to acc; writes D of those rows. Starts with a barrier (the last
// tile's shared memory is free) and ends with no copy in flight.
__device__ __forceinline__ void dq_tile(float (&acc)[kDimTiles][4], const SeqSpan &sp,
    long long q0, int h, int hk, const unsigned short *__restrict__ q,
    const unsigned short *__restrict__ k, const unsigned short *__restrict__ v,
    const unsigned short *__restrict__ o, const unsigned short *__restrict__ dout,
    const float *__restrict__ lse, float *__restrict__ di, const RotaryTables &tables, int heads,
    int kv_heads, long long total_q) {
  (void)tables;
  const long long q_stride = (long long)heads * kHeadDim, k_stride = (long long)kv_heads * kHeadDim;
  unsigned short *const q_s = smem, *const do_s = smem + kQTileElems;
  unsigned short *const ring = smem + 2 * kQTileElems;  // slot i: K at 2i tiles, V after it
  float *const lse_s = reinterpret_cast<float *>(smem + 2 * kQTileElems + 4 * kKTileElems);
  float *const di_s = lse_s + kBlockM;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int row0 = 16 * warp;  // this warp's rows of the query tile
  const int mq = (int)min((long long)kBlockM, sp.q_len - q0);  // real query rows
  const long long delta = sp.k_len - sp.q_len;
  long long j_first, j_last;
  keys_seen(q0, q0 + mq - 1, sp.q_len, sp.k_len, j_first, j_last);
  const long long kt0 = j_first / kBlockN;
  const int n_steps = j_last < j_first ? 0 : (int)(j_last / kBlockN - kt0 + 1);

  const long long q_row = (sp.q_src + q0) * q_stride + (long long)h * kHeadDim;
  const long long o_row = (sp.q_start + q0) * q_stride + (long long)h * kHeadDim;
  const unsigned short *const k_head = k + sp.k_start * k_stride + (long long)hk * kHeadDim;
  const unsigned short *const v_head = v + sp.k_start * k_stride + (long long)hk * kHeadDim;

  __syncthreads();  // nobody reads the last tile's shared memory any more
  if (n_steps > 0) {
    const long long k0 = kt0 * kBlockN;
    const int nk = (int)min((long long)kBlockN, sp.k_len - k0);
    load_tile<kBlockM>(q_s, q + q_row, q_stride, mq);
    load_tile<kBlockM>(do_s, dout + o_row, q_stride, mq);
    load_tile<kBlockN>(ring, k_head + k0 * k_stride, k_stride, nk);
    load_tile<kBlockN>(ring + kKTileElems, v_head + k0 * k_stride, k_stride, nk);
  }
  cp_async_commit();

  // D of this warp's rows from memory while the tiles land.
  row_stats(o, dout, lse, di, o_row, q_stride, (long long)h * total_q + sp.q_start + q0, mq, row0,
            lse_s, di_s);
  __syncwarp();
  const float lse_lo = lse_s[row0 + g], lse_hi = lse_s[row0 + g + 8];
  const float d_lo = di_s[row0 + g], d_hi = di_s[row0 + g + 8];
  const unsigned q_a = smem_addr(q_s), do_a = smem_addr(do_s);

#pragma unroll 1
  for (int i = 0; i < n_steps; i++) {
    // Refill the other slot with the next key tile once every warp is
    // done with it, then wait for this one.
    __syncthreads();
    if (i + 1 < n_steps) {
      const long long k1 = (kt0 + i + 1) * kBlockN;
      const int nk1 = (int)min((long long)kBlockN, sp.k_len - k1);
      unsigned short *slot = ring + ((i + 1) & 1) * 2 * kKTileElems;
      load_tile<kBlockN>(slot, k_head + k1 * k_stride, k_stride, nk1);
      load_tile<kBlockN>(slot + kKTileElems, v_head + k1 * k_stride, k_stride, nk1);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const long long k0 = (kt0 + i) * kBlockN;
    const int nk = (int)min((long long)kBlockN, sp.k_len - k0);
@if ROTARY@
    // Rotate the key tile's K (V) where it landed, and Q with the first
    // tile; every warp reads them after the barrier.
    const RotaryRows rq = query_rotary(tables, sp, q0);
    // (a broadcast call passes no keys' table where only Q is rotated)
    const RotaryRows rk = kRotateK || kRotateV ? rotary_rows(tables.k, sp.k_start + k0, k0)
                                               : RotaryRows{0, nullptr};
    if (kRotateQ && i == 0) rotate_rows(q_s, nullptr, mq, rq);
    if constexpr (kRotateK || kRotateV) {
      unsigned short *slot = ring + (i & 1) * 2 * kKTileElems;
      rotate_rows(kRotateK ? slot : nullptr, kRotateV ? slot + kKTileElems : nullptr, nk, rk);
    }
    __syncthreads();
@endif@
    const unsigned k_a = smem_addr(ring + (i & 1) * 2 * kKTileElems);
    const unsigned v_a = k_a + 2 * kKTileElems;
    float s[kKeyTiles][4], dp[kKeyTiles][4];
    rows_times_rows(s, q_a, k_a, 0, row0);
    rows_times_rows(dp, do_a, v_a, 0, row0);
    const Band band = tile_band(q0, k0, delta);
    const bool full = nk == kBlockN && band.lo <= -(kBlockM - 1) && band.hi >= kBlockN - 1;
    unsigned p16[kKeyTiles][2], ds[kKeyTiles][2];
    probs_and_ds<kKeyTiles, false>(s, dp, lse_lo, lse_hi, d_lo, d_hi, full, nk, band, row0, p16,
                                   ds);
    accumulate<kKeyTiles>(acc, ds, k_a);
  }
  cp_async_wait<0>();  // no copy outlives the tile (none is pending with steps)
}

extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@_dq(@PARAMS@) {
  (void)dk;
  (void)dv;
  if (batch <= 0 || kv_heads <= 0 || heads % kv_heads != 0) return;
  const int h = blockIdx.y, hk = h / (heads / kv_heads);
  const long long q_stride = (long long)heads * kHeadDim;
  const int row0 = 16 * (threadIdx.x >> 5);  // this warp's rows of the query tile
  const RotaryTables tables = @ROTARY_TABLES@;
  float acc[kDimTiles][4];

#pragma unroll 1
  for (long long vt = blockIdx.x; vt < num_tiles; vt += gridDim.x) {
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    if constexpr (kBroadcast) {
      (void)dq;
      const long long n_q = total_q / batch, q_tiles = (n_q + kBlockM - 1) / kBlockM;
      const long long slabs = num_tiles / q_tiles, slab = vt / q_tiles;
      const long long q0 = (vt - slab * q_tiles) * kBlockM;
      const long long b1 = slab_start(cu_seqlens_k, batch, total_k, slab + 1, slabs);
#pragma unroll 1
      for (long long b = slab_start(cu_seqlens_k, batch, total_k, slab, slabs); b < b1; b++)
        dq_tile(acc, seq_span(cu_seqlens_q, cu_seqlens_k, b, batch, total_q, total_k), q0, h, hk,
                q, k, v, o, dout, lse, di, tables, heads, kv_heads, total_q);
      float *const part = di + broadcast_partials_at(heads, total_q) + slab * n_q * q_stride;
      store_rows(acc, kScale, row0, (int)min((long long)kBlockM, n_q - q0),
                     part + q0 * q_stride + (long long)h * kHeadDim, q_stride);
    } else {
      const long long seq = find_sequence(cu_seqlens_q, batch, total_q, vt, kBlockM);
      const SeqSpan sp = seq_span(cu_seqlens_q, cu_seqlens_k, seq, batch, total_q, total_k);
      const long long tile = vt - (seq + sp.q_start / kBlockM);
      if (tile < 0 || tile * kBlockM >= sp.q_len) continue;  // an unused number
      const long long q0 = tile * kBlockM;
      dq_tile(acc, sp, q0, h, hk, q, k, v, o, dout, lse, di, tables, heads, kv_heads, total_q);
      const int mq = (int)min((long long)kBlockM, sp.q_len - q0);
@if ROTARY@
      const RotaryRows rq = query_rotary(tables, sp, q0);
      if constexpr (kRotateQ) unrotate_rows(acc, row0, mq, rq);  // dQ of the unrotated Q
@endif@
      store_rows(acc, kScale, row0, mq, dq + (sp.q_start + q0) * q_stride + (long long)h * kHeadDim,
                 q_stride);
    }
  }
}
/* ---- end kernel _dq ---- */

/* ---- begin kernel _dkv ----
 * KV-stationary: a CTA owns one key tile of one kv head; it walks the
 * group's q heads in order and, for each, the query tiles of the band, Q,
 * dO and their rows' LSE and D streaming through two slots, and stores dK
 * and dV. Reads the `di` that _dq wrote. */
__device__ __forceinline__ void key_tiles(const unsigned short *__restrict__ q,
    const unsigned short *__restrict__ k, const unsigned short *__restrict__ v,
    const unsigned short *__restrict__ dout, const float *__restrict__ lse,
    unsigned short *__restrict__ dk, unsigned short *__restrict__ dv,
    const float *__restrict__ di, const RotaryTables &tables,
    const int *__restrict__ cu_seqlens_q, const int *__restrict__ cu_seqlens_k,
    long long batch, int heads, int kv_heads, long long total_q, long long total_k,
    long long num_tiles) {
  (void)tables;
  if (batch <= 0 || kv_heads <= 0 || heads % kv_heads != 0) return;
  const int hk = blockIdx.y, group = heads / kv_heads;
  const long long q_stride = (long long)heads * kHeadDim, k_stride = (long long)kv_heads * kHeadDim;
  unsigned short *const k_s = smem, *const v_s = smem + kKTileElems;
  unsigned short *const ring = smem + 2 * kKTileElems;  // slot i: Q at 2i tiles, dO after it
  float *const rows_s = reinterpret_cast<float *>(smem + 2 * kKTileElems + 4 * kQTileElems);
  // slot i's LSE * log2(e) at rows_s + 2i * kBlockM, its D kBlockM on
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int row0 = 16 * warp;  // this warp's rows of the key tile

#pragma unroll 1
  for (long long vt = blockIdx.x; vt < num_tiles; vt += gridDim.x) {
    const KeyTile kt =
        key_tile(cu_seqlens_q, cu_seqlens_k, batch, total_q, total_k, vt, hk, group, k_stride);
    if (!kt.used) continue;  // an unused number
    const SeqSpan &sp = kt.sp;
    const long long k0 = kt.k0, k_row = kt.k_row, delta = sp.k_len - sp.q_len;
    const int nk = kt.nk, n_steps = kt.n_steps;  // real key rows, steps
@if ROTARY@
    // (a broadcast call passes no keys' table where only Q is rotated)
    const RotaryRows rk = kRotateK || kRotateV ? rotary_rows(tables.k, sp.k_start + k0, k0)
                                               : RotaryRows{0, nullptr};
@endif@

    // Start the copies of step i's Q, dO and row floats into slot i & 1.
    auto load_step = [&](int i) {
      const QueryStep st = query_step(kt, i, hk, group, q_stride);
      unsigned short *slot = ring + (i & 1) * 2 * kQTileElems;
      load_tile<kBlockM>(slot, q + st.q_at, q_stride, st.mq);
      load_tile<kBlockM>(slot + kQTileElems, dout + st.at, q_stride, st.mq);
      if (threadIdx.x < kBlockM) {
        const int r = threadIdx.x;
        const long long row =
            (long long)st.h * total_q + sp.q_start + st.i0 + (r < st.mq ? r : 0);
        float *f = rows_s + (i & 1) * 2 * kBlockM;
        cp_async_4(smem_addr(f + r), lse + row, r < st.mq ? 4 : 0);
        cp_async_4(smem_addr(f + kBlockM + r), di + row, r < st.mq ? 4 : 0);
      }
    };

    __syncthreads();  // nobody reads the last tile's shared memory any more
    load_tile<kBlockN>(k_s, k + k_row, k_stride, nk);
    load_tile<kBlockN>(v_s, v + k_row, k_stride, nk);
    if (n_steps > 0) load_step(0);
    cp_async_commit();

    float acc_v[kDimTiles][4], acc_k[kDimTiles][4];
#pragma unroll
    for (int n = 0; n < kDimTiles; n++) {
      acc_v[n][0] = acc_v[n][1] = acc_v[n][2] = acc_v[n][3] = 0.f;
      acc_k[n][0] = acc_k[n][1] = acc_k[n][2] = acc_k[n][3] = 0.f;
    }
    const unsigned k_a = smem_addr(k_s), v_a = smem_addr(v_s);

#pragma unroll 1
    for (int i = 0; i < n_steps; i++) {
      __syncthreads();
      if (i + 1 < n_steps) load_step(i + 1);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      const QueryStep st = query_step(kt, i, hk, group, q_stride);
      const long long i0 = st.i0;
      const int mq = st.mq;
@if ROTARY@
      // Rotate the step's Q where it landed, and K (V) with the first step;
      // every warp reads them after the barrier.
      const RotaryRows rq = query_rotary(tables, sp, i0);
      if constexpr (kRotateQ) rotate_rows(ring + (i & 1) * 2 * kQTileElems, nullptr, mq, rq);
      if ((kRotateK || kRotateV) && i == 0)
        rotate_rows(kRotateK ? k_s : nullptr, kRotateV ? v_s : nullptr, nk, rk);
      __syncthreads();
@endif@
      const unsigned q_a = smem_addr(ring + (i & 1) * 2 * kQTileElems);
      const unsigned do_a = q_a + 2 * kQTileElems;
      const float *const lse_r = rows_s + (i & 1) * 2 * kBlockM, *const d_r = lse_r + kBlockM;
      // S^T: this thread's rows are keys row0 + g (+ 8), its columns queries.
      float s[kQueryTiles][4];
      rows_times_rows(s, k_a, q_a, 0, row0);
      const Band band = tile_band(i0, k0, delta);
      const bool full = mq == kBlockM && band.lo <= -(kBlockM - 1) && band.hi >= kBlockN - 1;
      unsigned p16[kQueryTiles][2];
#pragma unroll
      for (int n = 0; n < kQueryTiles; n++) {
        const int col = 8 * n + 2 * tq;
        const float2 lr = *reinterpret_cast<const float2 *>(lse_r + col);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int c = col + (e & 1), row = row0 + g + (e < 2 ? 0 : 8);
          float m = (e & 1) ? lr.y : lr.x;
          m = m == neg_inf() ? __int_as_float(0x7f800000) : m * kLog2e;  // no key: P = 0
          float p = fast_exp2(fmaf(s[n][e], kScaleLog2, -m));
          if (!full) {
            const int xd = row - c;
            if (c >= mq || xd < band.lo || xd > band.hi) p = 0.f;
          }
          s[n][e] = p;
        }
        p16[n][0] = pack2(s[n][0], s[n][1]);
        p16[n][1] = pack2(s[n][2], s[n][3]);
      }
      accumulate<kQueryTiles>(acc_v, p16, do_a);  // dV += P^T dO
      float dp[kQueryTiles][4];
      rows_times_rows(dp, v_a, do_a, 0, row0);  // dP^T = V dO^T
      unsigned ds[kQueryTiles][2];
#pragma unroll
      for (int n = 0; n < kQueryTiles; n++) {
        const float2 d = *reinterpret_cast<const float2 *>(d_r + 8 * n + 2 * tq);
        ds[n][0] = pack2(s[n][0] * (dp[n][0] - d.x), s[n][1] * (dp[n][1] - d.y));
        ds[n][1] = pack2(s[n][2] * (dp[n][2] - d.x), s[n][3] * (dp[n][3] - d.y));
      }
      accumulate<kQueryTiles>(acc_k, ds, q_a);  // dK += dS^T Q
    }
    cp_async_wait<0>();
@if ROTARY@
    // dK and dV of the unrotated K and V
    if constexpr (kRotateK) unrotate_rows(acc_k, row0, nk, rk);
    if constexpr (kRotateV) unrotate_rows(acc_v, row0, nk, rk);
@endif@
    store_rows(acc_v, 1.f, row0, nk, dv + k_row, k_stride);
    store_rows(acc_k, kScale, row0, nk, dk + k_row, k_stride);
  }
}

extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@_dkv(@PARAMS@) {
  (void)o;
  (void)dq;
  const RotaryTables tables = @ROTARY_TABLES@;
  key_tiles(q, k, v, dout, lse, dk, dv, di, tables, cu_seqlens_q, cu_seqlens_k, batch, heads,
            kv_heads, total_q, total_k, num_tiles);
}
/* ---- end kernel _dkv ---- */
@if BROADCAST@

/* ---- begin kernel _dq_sum ----
 * dQ [n_q, heads, kHeadDim] = the sum of _dq's per-slab fp32 partials,
 * slab 0 first: a fixed order, so dQ is bit-identical from run to run.
 * Each thread adds 4 adjacent floats of every slab.
@if ROTARY@
 * With a rotated Q the partials are the rotated Q's gradient: row i's
 * rotation is the same in every sequence, so the sum is rotated back once,
 * here (in the half layout a thread adds its 4 floats and their partners,
 * kHeadDim / 2 on, and half the threads have none).
@endif@
 */
constexpr int kSumThreads = @SUM_THREADS@;

// The sum over the slabs of the 4 floats at p, slab 0 first.
__device__ __forceinline__ float4 slab_sum(const float *p, long long slabs, long long n) {
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
  for (long long c = 0; c < slabs; c++) {
    const float4 x = __ldg(reinterpret_cast<const float4 *>(p + c * n));
    sum.x += x.x;
    sum.y += x.y;
    sum.z += x.z;
    sum.w += x.w;
  }
  return sum;
}

extern "C" __global__ void __launch_bounds__(kSumThreads)
@KERNEL_NAME@_dq_sum(@PARAMS@) {
  (void)q, (void)k, (void)v, (void)o, (void)dout, (void)lse, (void)dk, (void)dv;
  (void)cu_seqlens_q, (void)cu_seqlens_k, (void)kv_heads, (void)total_k;
  const long long slabs = num_tiles;  // this kernel's items are the slabs
  if (batch <= 0) return;
  const long long n = total_q / batch * heads * kHeadDim;  // floats of one partial
  const long long x = (long long)blockIdx.x * kSumThreads + threadIdx.x;
  const float *const parts = di + broadcast_partials_at(heads, total_q);
@if ROTARY@
  if constexpr (kRotateQ) {
    const RotaryTables tables = @ROTARY_TABLES@;
    const RotaryRows rr = rotary_rows(tables.q, 0, 0);  // dQ row i: position i, table row i
@if ROTARY_HALF@
    // 4 columns c.. of the first half and their partners c + kHeadDim / 2:
    // pairs c..c + 3
    constexpr int kQuads = kHeadDim / 8;  // a row's items
    const long long rh = x / kQuads;  // the (row, head) of the item
    const int c = (int)(x % kQuads) * 4;
    const long long e = rh * kHeadDim + c;
    if (e >= n) return;
    const float4 lo = slab_sum(parts + e, slabs, n);
    const float4 hi = slab_sum(parts + e + kHeadDim / 2, slabs, n);
    float g0[4] = {lo.x, lo.y, lo.z, lo.w}, g1[4] = {hi.x, hi.y, hi.z, hi.w};
    const int row = (int)(rh / heads);
#pragma unroll
    for (int j = 0; j < 4; j++) {
      float sn, cs;
      pair_angle(rr, row, c + j, sn, cs);
      const float a = g0[j], b = g1[j];
      g0[j] = a * cs + b * sn;
      g1[j] = b * cs - a * sn;
    }
    *reinterpret_cast<uint2 *>(dq + e) = make_uint2(pack2(g0[0], g0[1]), pack2(g0[2], g0[3]));
    *reinterpret_cast<uint2 *>(dq + e + kHeadDim / 2) =
        make_uint2(pack2(g1[0], g1[1]), pack2(g1[2], g1[3]));
@else@
    // 4 columns c.., pairs c / 2 and c / 2 + 1 (interleaved)
    const long long e = x * 4;
    if (e >= n) return;
    const float4 sum = slab_sum(parts + e, slabs, n);
    const int row = (int)(e / (heads * kHeadDim)), c = (int)(e % kHeadDim);
    float g[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
    for (int j = 0; j < 2; j++) {
      float sn, cs;
      pair_angle(rr, row, c / 2 + j, sn, cs);
      const float a = g[2 * j], b = g[2 * j + 1];
      g[2 * j] = a * cs + b * sn;
      g[2 * j + 1] = b * cs - a * sn;
    }
    *reinterpret_cast<uint2 *>(dq + e) = make_uint2(pack2(g[0], g[1]), pack2(g[2], g[3]));
@endif@
    return;
  }
@endif@
  const long long e = x * 4;
  if (e >= n) return;
  const float4 sum = slab_sum(parts + e, slabs, n);
  *reinterpret_cast<uint2 *>(dq + e) = make_uint2(pack2(sum.x, sum.y), pack2(sum.z, sum.w));
}
/* ---- end kernel _dq_sum ---- */
@endif@
