@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_sm90.cu: jagged (varlen) attention backward on sm_90a, the
@# fast (not bit-identical) path: one key-stationary kernel on wgmma that
@# computes dK, dV and adds every tile pair's dQ to an fp32 accumulator
@# with atomics, between a kernel that writes D and zeroes the accumulator
@# and one that rounds it. Compiled for sm_90a only (the plan picks it
@# there; deterministic specs keep jagged_bwd.cu's two kernels).
@# Includes: jagged_bwd_sm90_consts.cuh, jagged_bwd_sm90_parts.cuh (the
@#   products, tiles, bands and barriers), load_rows_sm90.cuh,
@#   jagged_bwd_rows.cuh (the kernels _pre and _dq).
@# Placeholders: @KERNEL_NAME@ @HEAD_DIM@ (64 | 128) @BLOCK_M@ (query rows
@#   of a step: 64) @BLOCK_N@ (key rows of a CTA, 64 per warpgroup: 64 at
@#   head dim 64, 128 at 128)
@#   @SMEM_BYTES@ (the plan's dynamic shared memory of _kv, checked against
@#   the layout below: 4 * HEAD_DIM * (BLOCK_N + SLOTS * BLOCK_M) + 2 *
@#   BLOCK_N * BLOCK_M + 8 * SLOTS * BLOCK_M + STAGES * (BLOCK_N / 64) * 64 *
@#   STRIDE * 4, SLOTS = 2; STAGES, STRIDE = 1, 68 with MIN_CTAS 3, else 2, 72)
@#   @ROWS_THREADS@ (threads of _pre and _dq) @MIN_CTAS@ (CTAs of _kv an SM:
@#   3 takes one slot of staging rows, else two)
@#   @SCALE@ @SCALE_LOG2@ @SCALE_TEXT@ @MMA_TYPE@ @PAIR_TYPE@ @CAUSAL@
@#   @WINDOW@ @WINDOW_LEFT@ @WINDOW_RIGHT@ @ROTARY_TABLES@ (as in
@#   jagged_bwd.cu).
@# Kernels, in this order on one stream, all with jagged_bwd.cu's
@# parameters; `di` is [heads, total_q] D, then from float
@# dq_accumulator_at(heads, total_q) the [total_q, heads, HEAD_DIM] fp32
@# accumulator:
@#   @KERNEL_NAME@_pre: D = rowsum(dO (.) O), the accumulator zeroed; grid
@#     (ceil(total_q * heads / ROWS), 1), ROWS = ROWS_THREADS * 8 / HEAD_DIM
@#     (token, head) rows a CTA, ROWS_THREADS threads, no shared memory.
@#   @KERNEL_NAME@_kv: grid (batch + total_k / BLOCK_N, kv_heads),
@#     num_tiles = batch + total_k / BLOCK_N; 128 * BLOCK_N / 64 threads.
@#   @KERNEL_NAME@_dq: dQ = scale * accumulator, rounded; grid as _pre.
@# Conditions: ROTARY, ROTARY_TABLE (as in jagged_bwd.cu: with tables
@#   every kernel takes rotary_table and rotary_table_k after `di`): _kv
@#   rotates K (V) once and each step's Q in shared memory and dK (dV) back
@#   in registers, _dq rotates dQ back as it rounds it; DKV_N128 (false:
@#   jagged_bwd_wgmma.cuh's condition, planned for jagged_bwd_ws.cu only).
@#   Other features are selected with constexpr.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "this backward is planned for sm_90a only (wgmma)"
#endif
/* ---- begin jagged backward constants ---- */
@include jagged_bwd_sm90_consts.cuh@
constexpr int kWarpgroups = kBlockN / 64;  // each owns 64 key rows
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kCopyThreads = kThreads;  // every thread copies (load_rows_sm90.cuh)
constexpr int kRowsThreads = @ROWS_THREADS@;  // threads of _pre and _dq
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory of _kv, as planned
constexpr bool kDqTiled = false;  // the dQ accumulator row-major (jagged_bwd_rows.cuh)
constexpr bool kTileCounter = false;  // one CTA a tile (jagged_bwd_rows.cuh's _pre)
static_assert(kBlockM == 64 && kBlockN % 64 == 0 && kWarpgroups <= 2,
              "64-row query steps, 64 key rows per warpgroup");
static_assert(kHeadDim == 64 || kWarpgroups == 2,
              "head dim 128 splits dQ's columns between two warpgroups");
// Shared memory: K, V, two slots of Q and dO, dS^T, two slots of LSE and
// D for the step's query rows, then the dQ staging rows. A step's copies
// go to the other slot, free once the step's first barrier is passed.
constexpr int kSlots = 2;
// CTAs an SM, as planned: 3 at head dim 64 (one warpgroup a CTA, 168
// registers a thread, 75 KB of shared memory), whose CTAs run out of step
// so that one's softmax and staging overlap the others' products, and
// leave room for one slot of dQ staging rows; 1 at head dim 128 (two
// warpgroups), with two slots.
constexpr int kMinCtas = @MIN_CTAS@;
constexpr int kStageSlots = kMinCtas >= 3 ? 1 : 2;
// With head dim 64 each warpgroup's dQ reads only its own dS^T rows.
constexpr bool kOwnDs = kHalves == 1;
constexpr int kRingAt = 2 * kKBytes;
constexpr int kDsAt = kRingAt + kSlots * 2 * kQBytes;
constexpr int kRowsAt = kDsAt + kDsBytes;
// The dQ staging rows of a warpgroup: 64 rows of 64 fp32 a step, padded
// to 72 (68 where shared memory is short) so that a warp's float2 stores
// (8 rows x 4 quads) take the two wavefronts their 256 bytes need.
constexpr int kStageStride = kStageSlots == 1 ? 68 : 72;
constexpr int kStageAt = kRowsAt + kSlots * 2 * 4 * kBlockM;
static_assert(kStageAt + kStageSlots * kWarpgroups * 64 * kStageStride * 4 == kSmemBytes,
              "the plan's shared memory is K, V, two Q, dO slots, dS^T, the row floats and "
              "the dQ staging rows");
/* ---- end jagged backward constants ---- */

@include jagged_bwd_sm90_parts.cuh@
@if ROTARY@

// The rotation's views of load_rows' layout (element offsets): a Q, dO
// slot of kBlockM rows and the K, V tiles of kBlockN rows.
template <int kRows>
struct Sw128Rows {
  static __device__ __forceinline__ int at(int row, int chunk) {
    return (chunk >> 3) * (kRows * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
  }
};

@include jagged_rotary.cuh@
@endif@

// 1024-byte aligned: the 128-byte swizzle's 8-row atoms start at
// multiples of 1024.
extern __shared__ __align__(1024) unsigned short smem[];

/* ---- begin the math ----
 * As jagged_bwd.cu: P = exp(scale * S - LSE), dP = dO V^T, dS = P (.) (dP
 * - D), dV = P^T dO, dK = scale * dS^T Q, dQ = scale * dS K, D =
 * rowsum(dO (.) O). Here dQ is added tile pair by tile pair with fp32
 * atomics, so its bits depend on the order the CTAs run in; dK and dV are
 * each written by one CTA, in a fixed order.
 * ---- end the math ---- */

@include load_rows_sm90.cuh@

@include jagged_bwd_rows.cuh@

/* ---- begin kernel _kv ----
 * KV-stationary: a CTA owns kBlockN keys of one kv head (warpgroup w the
 * 64 from 64w) and walks the group's q heads in order and, for each, the
 * query tiles of the band; Q, dO and their rows' LSE and D stream through
 * two slots. Per step each warpgroup computes S^T = K Q^T and dP^T = V dO^T
 * (A and B from shared memory), P^T and dS^T in registers, dV += P^T dO
 * and dK += dS^T Q (A from registers), writes dS^T to shared memory, and
 * after a barrier dQ = dS K over all kBlockN keys for its 64 columns of
 * the head (head_dim 128), or over its own 64 keys (head_dim 64), which
 * it adds to the accumulator. */
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtas)
@KERNEL_NAME@_kv(@PARAMS@) {
  (void)o;
  (void)dq;
  const RotaryTables tables = @ROTARY_TABLES@;
  (void)tables;
  if (batch <= 0 || kv_heads <= 0 || heads % kv_heads != 0) return;
  const int hk = blockIdx.y, group = heads / kv_heads;
  const long long q_stride = (long long)heads * kHeadDim, k_stride = (long long)kv_heads * kHeadDim;
  const unsigned base = smem_addr(smem);
  const unsigned k_a = base, v_a = base + kKBytes, ring_a = base + kRingAt, ds_a = base + kDsAt;
  float *const rows_s = reinterpret_cast<float *>(reinterpret_cast<char *>(smem) + kRowsAt);
  float *const stage_s = reinterpret_cast<float *>(reinterpret_cast<char *>(smem) + kStageAt);
  float *const dq_acc = di + dq_accumulator_at(heads, total_q);
  const int wg = threadIdx.x >> 7;  // this warpgroup's keys: 64 wg..
  const int warp = (threadIdx.x >> 5) & 3;  // its rows in them: 16 warp..
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int key0 = 64 * wg + 16 * warp + g;  // this thread's first key row of the tile (+8)

#pragma unroll 1
  for (long long vt = blockIdx.x; vt < num_tiles; vt += gridDim.x) {
    const KeyTile kt =
        key_tile(cu_seqlens_q, cu_seqlens_k, batch, total_q, total_k, vt, hk, group, k_stride);
    if (!kt.used) continue;  // an unused number
    const SeqSpan &sp = kt.sp;
    const long long delta = sp.k_len - sp.q_len;
@if ROTARY@
    const RotaryRows rk = rotary_rows(tables.k, sp.k_start + kt.k0, kt.k0);
@endif@

    // Start the copies of step i's Q, dO and row floats into slot i & 1.
    auto load_step = [&](int i) {
      const QueryStep st = query_step(kt, i, hk, group, q_stride);
      const unsigned slot = ring_a + (i % kSlots) * 2 * kQBytes;
      load_rows<kBlockM>(slot, q + st.q_at, q_stride, st.mq);
      load_rows<kBlockM>(slot + kQBytes, dout + st.at, q_stride, st.mq);
      if (threadIdx.x < 2 * kBlockM) {
        const int r = threadIdx.x % kBlockM;
        const long long row =
            (long long)st.h * total_q + sp.q_start + st.i0 + (r < st.mq ? r : 0);
        float *f = rows_s + (i % kSlots) * 2 * kBlockM + threadIdx.x;  // LSE, then D
        cp_async_4(smem_addr(f), (threadIdx.x < kBlockM ? lse : di) + row, r < st.mq ? 4 : 0);
      }
    };

    __syncthreads();  // nobody reads the last tile's shared memory any more
    load_rows<kBlockN>(k_a, k + kt.k_row, k_stride, kt.nk);
    load_rows<kBlockN>(v_a, v + kt.k_row, k_stride, kt.nk);
    if (kt.n_steps > 0) load_step(0);
    cp_async_commit();

    float acc_v[kHalves][8][4], acc_k[kHalves][8][4];
    zero_dkv(acc_v, acc_k);

    // P^T and dS^T of the step before: dV and dK read them (wgmma's A from
    // registers) until the wait at the next step's start.
    unsigned p16[8][2], ds16[8][2];
    // Wait for the last step's dV and dK: their accumulators pinned after
    // the wait, and (after a step) the P^T, dS^T registers they read kept
    // live to it.
    auto retire = [&](bool after_a_step) {
      wgmma_wait<0>();
#pragma unroll
      for (int hh = 0; hh < kHalves; hh++) {
        wgmma_hold(acc_v[hh]);
        wgmma_hold(acc_k[hh]);
      }
      if (after_a_step) {
        keep(p16);
        keep(ds16);
      }
    };
#pragma unroll 1
    for (int i = 0; i < kt.n_steps; i++) {
      // the step before's dV and dK are done: its Q, dO slot may be
      // reloaded and its P^T, dS^T registers rewritten
      retire(i > 0);
      if constexpr (kStageSlots == 2)
        bulk_wait_read<1>();  // step i - 2's staging rows are read: this step may write them
      __syncthreads();  // the other slot and dS^T are free (step i - 1 is done)
      if (i + 1 < kt.n_steps) load_step(i + 1);
      cp_async_commit();
      cp_async_wait<1>();
      fence_proxy_async();  // the copies are read by wgmma (the async proxy)
      __syncthreads();
      const QueryStep st = query_step(kt, i, hk, group, q_stride);
      const int h = st.h, mq = st.mq;
      const long long i0 = st.i0;
      const unsigned q_a = ring_a + (i % kSlots) * 2 * kQBytes, do_a = q_a + kQBytes;
      const float *const lse_r = rows_s + (i % kSlots) * 2 * kBlockM, *const d_r = lse_r + kBlockM;
@if ROTARY@
      {
        // Rotate the step's Q where it landed, and K (V) with the first
        // step; the writes are fenced for wgmma's reads, and all wait.
        const RotaryRows rq = rotary_rows(tables.q, sp.q_start + i0, i0 + delta);
        char *const bytes = reinterpret_cast<char *>(smem);
        if constexpr (kRotateQ)
          rotate_rows<Sw128Rows<kBlockM>>(
              reinterpret_cast<unsigned short *>(bytes + kRingAt + (i % kSlots) * 2 * kQBytes),
              nullptr, mq, rq);
        if ((kRotateK || kRotateV) && i == 0)
          rotate_rows<Sw128Rows<kBlockN>>(kRotateK ? smem : nullptr,
                                          kRotateV ? smem + kKBytes / 2 : nullptr, kt.nk, rk);
        fence_proxy_async();
        __syncthreads();
      }
@endif@

      // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys: rows
      // are keys (key0, key0 + 8), columns the step's queries.
      float s[8][4], dp[8][4];
      wgmma_two(s, dp, [&] {
        keys_times_queries(s, k_a, q_a, wg);
        keys_times_queries(dp, v_a, do_a, wg);
      });

      // P^T and dS^T as 16-bit pairs (the A operand of dV and dK); dS^T
      // also to shared memory for dQ.
      const Band band = tile_band(i0, kt.k0, delta);
      // A key row past the sequence end (zero-filled) is masked too: its
      // S is 0, and exp2(-LSE) of a row with a very negative LSE would be
      // inf, which dQ = dS K would turn into NaN (inf times K's zero row).
      const bool full = mq == kBlockM && kt.nk == kBlockN && band.lo <= -(kBlockM - 1) &&
                        band.hi >= kBlockN - 1;
      // P with no case for a query that sees no key (LSE -inf): each of its
      // pairs is masked, and a full tile has no such query. Key rows key0,
      // key0 + 8 see columns [max(0, r - hi), min(mq - 1, r - lo)] (none
      // past nk): c - first < width, one unsigned compare an element
      // (jagged_bwd_ws.cu's mask). On an H100 (the harness, against the
      // per-element band test) causal 1.02-1.03x at head dim 128, 1.01-1.19x
      // at 64 (bench/results/2026-12-06-h100-jagged-bwd-s29.log).
      int first[2], width[2];
      seen_columns(band, key0, mq, kt.nk, first, width);
#pragma unroll
      for (int n = 0; n < 8; n++) {
        const int col = 8 * n + 2 * tq;
        const float2 lr = *reinterpret_cast<const float2 *>(lse_r + col);
        const float2 dd = *reinterpret_cast<const float2 *>(d_r + col);
        const float m0 = lr.x * -kLog2e, m1 = lr.y * -kLog2e;
        float p[4], x[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
          p[e] = fast_exp2(fmaf(s[n][e], kScaleLog2, (e & 1) ? m1 : m0));
          if (!full && (unsigned)(col + (e & 1) - first[e >> 1]) >= (unsigned)width[e >> 1])
            p[e] = 0.f;
          x[e] = p[e] * (dp[n][e] - ((e & 1) ? dd.y : dd.x));
        }
        p16[n][0] = pack2(p[0], p[1]);
        p16[n][1] = pack2(p[2], p[3]);
        ds16[n][0] = pack2(x[0], x[1]);
        ds16[n][1] = pack2(x[2], x[3]);
        // dS^T [key][query]: row key0 (+ 8) of the step's matrix, chunk n
        store_ds_t(ds_a, key0, n, tq, ds16[n][0], ds16[n][1]);
      }

      // dQ = dS K: A is dS^T read MN-major (k over keys), B K's rows read
      // MN-major. Head dim 128: every key, this warpgroup's 64 columns;
      // head dim 64: this warpgroup's keys, every column.
      if constexpr (kStageSlots == 1)
        bulk_wait_read<0>();  // the step before's staging rows are read (by all: the barrier)
      fence_proxy_async();  // dS^T is read by wgmma
      if constexpr (kOwnDs) named_barrier_sync(1 + wg, 128);
      else __syncthreads();
      float c[8][4];
      wgmma_fence();
      issue_dq(c, ds_a, k_a, wg);
      wgmma_commit();
      issue_dkv(acc_v, acc_k, p16, ds16, q_a, do_a);
      wgmma_commit();

      wgmma_wait<1>();  // dQ is done; dV and dK run on under the staging
      wgmma_hold(c);

      // c's rows are the step's queries 16 warp + g (+ 8), its columns
      // 8n + 2tq of this warpgroup's 64 (head dim 128) or of the head: to
      // the warpgroup's staging rows, then a bulk fp32 add of each real
      // row to the accumulator (the copy engine adds whole rows).
      float *const stage = stage_s + ((kStageSlots == 2 ? i & 1 : 0) * kWarpgroups + wg) * 64 * kStageStride;
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        float *const srow = stage + (16 * warp + g + 8 * hi) * kStageStride + 2 * tq;
#pragma unroll
        for (int n = 0; n < 8; n++)
          *reinterpret_cast<float2 *>(srow + 8 * n) = make_float2(c[n][2 * hi], c[n][2 * hi + 1]);
      }
      fence_proxy_async();  // the staging rows are read by the copy engine
      named_barrier_sync(1 + wg, 128);
      const int r = threadIdx.x & 127;  // the row this thread hands over
      if (r < mq) {
        const int col0 = kHalves == 2 ? 64 * wg : 0;
        bulk_reduce_add(dq_acc + (sp.q_src + i0 + r) * q_stride + (long long)h * kHeadDim + col0,
                        smem_addr(stage + r * kStageStride), 64 * 4);
      }
      bulk_commit();
    }
    retire(kt.n_steps > 0);
    bulk_wait_read<0>();  // the staging rows may be written again
    cp_async_wait<0>();
@if ROTARY@
    // dK and dV of the unrotated K and V: acc_k[hh][n] is n-tile 8 hh + n
    // of this warpgroup's rows 16 warp.. of its keys.
    if constexpr (kRotateK)
      unrotate_rows(reinterpret_cast<float (&)[kHeadDim / 8][4]>(acc_k), 64 * wg + 16 * warp, kt.nk,
                    rk);
    if constexpr (kRotateV)
      unrotate_rows(reinterpret_cast<float (&)[kHeadDim / 8][4]>(acc_v), 64 * wg + 16 * warp, kt.nk,
                    rk);
@endif@

    // dV, and dK with the scale, of this thread's key rows.
    store_dkv(acc_v, acc_k, dk, dv, kt.k_row, k_stride, key0, kt.nk, tq);
  }
}
/* ---- end kernel _kv ---- */

