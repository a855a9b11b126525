@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_ws.cu: jagged (varlen) attention backward on sm_90a, warp
@# specialized: the key-stationary kernel of jagged_bwd_sm90.cu with its
@# copies taken off the computing warps. Warpgroup 0 copies K and V once a
@# tile and streams each step's Q, dO, LSE and D through a ring of stages
@# (cp.async, completion on mbarriers); warpgroups 1.. each own 64 keys and
@# compute on wgmma, meeting once a step where dQ reads both halves of dS^T
@# (head dim 128: each adds its 64 columns; head dim 64 with 128-row steps:
@# its 64 queries). Between the same _pre and _dq kernels (jagged_bwd_rows.cuh),
@# with the dQ accumulator in tiles. The plan picks it on sm_90a for specs
@# without rotary embeddings, at head dim 64 without a mask either (the
@# others keep jagged_bwd_sm90.cu).
@# Includes: jagged_bwd_sm90_consts.cuh, mma_sm80.cuh, copy_rows.cuh, unpack2.cuh,
@#   wgmma_sm90.cuh,
@#   wgmma_n128_sm90.cuh (WGMMA_N128), bulk_sm90.cuh, pipeline_sm90.cuh,
@#   jagged_bwd_tile.cuh, jagged_bwd_wgmma.cuh (with jagged_bwd_dkv_n128.cuh
@#   under DKV_N128), jagged_bwd_rows.cuh.
@# Placeholders: @KERNEL_NAME@ @PARAMS@ @HEAD_DIM@ (64 | 128) @BLOCK_M@
@#   (query rows of a step: 64, or 128 at head dim 64) @BLOCK_N@ (keys of
@#   a CTA: 128, 64 per computing warpgroup) @STAGES@ (Q/dO stages, >= 2)
@#   @SMEM_BYTES@ (= 4 * HEAD_DIM * (KV_SLOTS * BLOCK_N + STAGES * BLOCK_M)
@#   + 4 * BLOCK_N * BLOCK_M + 8 * STAGES * BLOCK_M + BLOCK_N * 64 * 4,
@#   KV_SLOTS 2 at head dim 64, else 1) @ROWS_THREADS@ @SCALE@
@#   @SCALE_LOG2@ @SCALE_TEXT@ @MMA_TYPE@ @PAIR_TYPE@ @CAUSAL@ @WINDOW@
@#   @WINDOW_LEFT@ @WINDOW_RIGHT@ (as in jagged_bwd_sm90.cu).
@# Kernels and host rule: jagged_bwd_sm90.cu's (_pre, _kv, _dq on one
@#   stream), but _kv is persistent: 128 * (BLOCK_N / 64 + 1) threads, one
@#   CTA an SM (the walk AG_WALK_JAGGED_K_COUNTER: a grid of SMs), each
@#   taking (key tile, kv head) numbers from a counter that _pre zeroes, 8
@#   bytes after the dQ accumulator in the workspace.
@# Conditions: ROTARY (false: not planned with rotary embeddings),
@#   WGMMA_N128 (BLOCK_M is 128: the 64x128 product's helpers included),
@#   DKV_N128 (head dim 128: dV and dK as one 64x128 product a k-step),
@#   TMA_QDO (Q and dO by TMA: tma_sm90.cuh, and the kernels take tmap_q,
@#   tmap_dout last), FUSED_DQ (below; with TMA_QDO at head dim 128: dQ
@#   rounded inside _kv, no _dq launched; SMEM_BYTES then holds two 16 KB
@#   buffers more).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "this backward is planned for sm_90a only (wgmma)"
#endif
/* ---- begin jagged backward constants ---- */
@include jagged_bwd_sm90_consts.cuh@
constexpr int kMathWgs = kBlockN / 64;  // computing warpgroups, each owns 64 key rows
constexpr int kMathThreads = 128 * kMathWgs;
constexpr int kThreads = 128 + kMathThreads;  // warpgroup 0 loads
constexpr int kRowsThreads = @ROWS_THREADS@;  // threads of _pre and _dq
constexpr int kStages = @STAGES@;  // Q, dO stages
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory of _kv, as planned
// setmaxnreg budgets. At head dim 128 the computing warpgroups need 240
// (at 232 ptxas serialized every wgmma: 267 / 376 TFLOP/s at L 1024 / 4096
// then, 306 / 426 now), which leaves the loading one 24: its loops count
// instead of dividing and keep few 64-bit values (ptxas -v: 8 bytes
// spilled, the loader's).
constexpr bool kWide = kHeadDim == 128 || kBlockM == 128;  // the computing warpgroups need 240
constexpr int kLoadRegs = kWide ? 24 : 40, kMathRegs = kWide ? 240 : 232;
constexpr int kLoadUnroll = kWide ? 1 : 4;  // the loader's copy loops (registers)
// setmaxnreg moves registers within what the CTA is launched with: 65,536
// / kThreads a thread, rounded down to a multiple of 8 (168 for 384).
static_assert(128 * kLoadRegs + kMathThreads * kMathRegs <=
                  kThreads * (65536 / kThreads / 8 * 8),
              "the registers the CTA is launched with");
// The dQ accumulator in tiles (jagged_bwd_rows.cuh): a step's 64 columns
// of its rows are one contiguous run, added by one bulk copy. On the H200
// (bf16, batch 1152, 4 heads, lengths uniform in [1, L], L 1024 / 4096)
// this kernel ran 265 / 376 TFLOP/s at head dim 128 with it and 220 / 296
// with a bulk add a row (64 a step), jagged_bwd_sm90.cu's way; 225 / 315
// against 166 / 220 at head dim 64
// (bench/results/2026-12-03-h200-jagged-bwd-ws-harness.log).
constexpr bool kDqTiled = true;
// Persistent: one CTA an SM, taking (key tile, kv head) numbers from a
// counter in the workspace (after the dQ accumulator; _pre zeroes it), so
// that a tile's start (K and V loads) overlaps the last tile's end, and
// whichever CTA is free takes the next tile. On the H200 (the harness as
// above) this ran 1.01-1.06x one CTA a tile, 1.09x at head dim 64 causal
// (bench/results/2026-12-03-h200-jagged-bwd-ws-persistent.log).
constexpr bool kTileCounter = true;
// Each step's Q and dO by TMA (tmap_q, tmap_dout: boxes of 64 columns by
// kBlockM rows, issued by one loading thread on the stage's full barrier)
// instead of 2 x 16 cp.async a loading thread. Rows past a sequence's end
// are then the next sequence's (zeros past the tensor), not zeros: the
// mask zeroes P and dS there and dQ's rows >= mq are not added (but a
// neighbour's Inf or NaN in dO or Q would reach dV, dK as 0 x Inf).
constexpr bool kTmaQdo = @TMA_QDO@;
// dQ rounded inside _kv (FUSED_DQ), not by a _dq pass over the whole
// accumulator: warps 2 and 3 of the loading warpgroup are then dQ warps,
// one a computing warpgroup. The computing warpgroup stages a step's dQ,
// writes a descriptor and arrives (named barrier kDqFull + wg, no wait);
// its dQ warp issues the bulk add, frees the staging rows once they are
// read (kDqEmpty + wg), waits for the add to land and counts it on the
// tile's counter in the workspace (zeroed by _pre). The add that completes
// the count (the key tiles whose band covers the step: keys_seen) rounds
// the tile into dQ from the accumulator's lines, still in L2: a bulk load
// into the warp's 16 KB buffer, then scale, round and store. Rows that see
// no key (LSE -inf) and tokens outside every sequence get dQ 0 from _pre.
// The loads are the other two warps'.
constexpr bool kFusedDq = @FUSED_DQ@;
static_assert(!kFusedDq || (kTmaQdo && kHeadDim == 128 && kBlockM == 64),
              "the fused dQ: TMA loads, head dim 128, 64-row steps (its buffers' room)");
constexpr int kLoadThreads = kFusedDq ? 64 : 128;  // the loading threads of warpgroup 0
constexpr int kDqFull = 5, kDqEmpty = 7;  // + the computing warpgroup (1..4 are taken)
constexpr int kConvBytes = kFusedDq ? 64 * 64 * 4 : 0;  // a dQ warp's buffer: one tile
// A step's add, from a computing warpgroup to its dQ warp (shared memory,
// ordered by the named barrier): rows < 0 ends the kernel's work.
struct DqAdd {
  long long t0;  // the tile's first token
  int hh;        // its head and half: h * kHalves + half
  int rows;      // its real rows (0: nothing to add)
  int expected;  // key tiles that add to it (the count that completes it)
};
static_assert(kBlockN == 128 && (kBlockM == 64 || (kBlockM == 128 && kHeadDim == 64)),
              "two warpgroups of 64 keys; query steps of 64 rows, or 128 at head dim 64");
static_assert(kStages >= 2, "a stage is refilled once its step's products are done");
static_assert(!@ROTARY@, "rotary embeddings take jagged_bwd_sm90.cu");
// Head dim 128: each warpgroup's dQ reads both halves of dS^T, for its 64
// columns of the head. Head dim 64 with 128-row steps: warpgroup w's dQ is
// that of queries 64w.. over every key, so it reads both halves too. On
// the H200 (the harness as above) 128-row steps ran 256 / 368 TFLOP/s
// against 232 / 318 with 64-row ones (each warpgroup adding its own keys'
// dQ: kOwnDs), 148 / 284 causal against 144 / 246
// (bench/results/2026-12-03-h200-jagged-bwd-ws-persistent.log).
constexpr bool kOwnDs = kHalves == 1 && kBlockM == 64;
constexpr int kChunks = kBlockM / 8;  // 8-column chunks of S^T's queries
// K and V slots: at head dim 64 two (the next tile's K, V land while the
// last steps of this one run; they take the 32 KB the SM has left), at 128
// one (no room). On the H200 two ran 1.00-1.02x one, in the harness and
// the product (bench/results/2026-12-04-h200-jagged-bwd-kv-slots.log).
constexpr int kKvSlots = kHeadDim == 64 ? 2 : 1;
// Shared memory: the K, V slots; the stages' Q and dO; two dS^T buffers (a step
// writes one while the other warpgroup's dQ may still read the last);
// the stages' LSE and D; one set of dQ staging rows per warpgroup (64 rows
// of 64 fp32 as the accumulator's tiles lay them out: the 8-float chunks
// swizzled by the token, so that a warp's float2 stores take the two
// wavefronts their 256 bytes need).
constexpr int kRingAt = kKvSlots * 2 * kKBytes;
constexpr int kDsAt = kRingAt + kStages * 2 * kQBytes;
constexpr int kRowsAt = kDsAt + 2 * kDsBytes;
constexpr int kStageStride = 64;
constexpr int kStageAt = kRowsAt + kStages * 2 * 4 * kBlockM;
constexpr int kConvAt = kStageAt + kMathWgs * 64 * kStageStride * 4;  // the dQ warps' buffers
static_assert(kConvAt + kMathWgs * kConvBytes == kSmemBytes,
              "the plan's shared memory is the K, V slots, the Q, dO stages, two dS^T, the row "
              "floats, the dQ staging rows and (FUSED_DQ) the dQ warps' buffers");
/* ---- end jagged backward constants ---- */

@include mma_sm80.cuh@

@include copy_rows.cuh@

@include unpack2.cuh@

@include wgmma_sm90.cuh@

@if WGMMA_N128@
@include wgmma_n128_sm90.cuh@

@endif@
@include bulk_sm90.cuh@

@include pipeline_sm90.cuh@

@if TMA_QDO@
@include tma_sm90.cuh@

@endif@
@include jagged_bwd_tile.cuh@

@include jagged_bwd_wgmma.cuh@

// 1024-byte aligned: the 128-byte swizzle's 8-row atoms start at
// multiples of 1024.
extern __shared__ __align__(1024) unsigned short smem[];

@include jagged_bwd_rows.cuh@

/* ---- begin the math ----
 * As jagged_bwd_sm90.cu: P = exp(scale * S - LSE), dP = dO V^T, dS = P
 * (.) (dP - D), dV = P^T dO, dK = scale * dS^T Q, dQ = scale * dS K, D =
 * rowsum(dO (.) O); dQ is added to an fp32 accumulator tile pair by tile
 * pair, so its bits depend on the order the CTAs run in.
 * ---- end the math ---- */

// Start the copy of kRows rows of one head (`src` is row 0, this head)
// into the matrices at `dst` (shared address) by the loading warpgroup,
// the first `rows` real and the rest zero-filled. Piece c (16 bytes) of
// row r sits in matrix c / 8 at chunk (c % 8) ^ (r % 8) of the row.
template <int kRows>
__device__ __forceinline__ void load_rows(unsigned dst, const unsigned short *src,
                                          long long row_stride, int rows) {
  constexpr int kRowStep = kLoadThreads / kPieces;  // rows one pass of the loading threads covers
  static_assert(kRows % kRowStep == 0, "passes cover whole rows");
  const int row0 = threadIdx.x / kPieces, c = threadIdx.x % kPieces;
  const unsigned short *from = src + row0 * row_stride + c * 8;
  if constexpr (kRowStep % 8 == 0) {
    // a thread's rows share their swizzle
    unsigned at = dst + (c >> 3) * (kRows * kRowBytes) + row0 * kRowBytes + (((c & 7) ^ (row0 & 7)) << 4);
#pragma unroll kLoadUnroll
    for (int row = row0; row < kRows; row += kRowStep) {
      const bool real = row < rows;
      cp_async_16(at, real ? from : src, real ? 16 : 0);
      at += kRowStep * kRowBytes;
      from += kRowStep * row_stride;
    }
  } else {  // fewer loading threads (FUSED_DQ): each row its own swizzle
    const unsigned at = dst + (c >> 3) * (kRows * kRowBytes);
#pragma unroll kLoadUnroll
    for (int row = row0; row < kRows; row += kRowStep) {
      const bool real = row < rows;
      cp_async_16(at + row * kRowBytes + (((c & 7) ^ (row & 7)) << 4), real ? from : src,
                  real ? 16 : 0);
      from += kRowStep * row_stride;
    }
  }
}

@if TMA_QDO@
@else@
// Start the copy of a step's Q and dO rows (kBlockM of them, the first
// `rows` real, the rest zero-filled) at element `at` of q and dout into
// the stage at `slot` (Q, then dO), laid out as load_rows lays them. One
// loop for both, its index math shared, so that the loading warpgroup's
// registers stay few.
__device__ __forceinline__ void load_step(unsigned slot, const unsigned short *q,
                                          const unsigned short *dout, long long at,
                                          long long row_stride, int rows) {
  constexpr int kRowStep = 128 / kPieces;
  static_assert(kBlockM % kRowStep == 0 && kRowStep % 8 == 0, "passes cover whole rows");
  const int row0 = threadIdx.x / kPieces, c = threadIdx.x % kPieces;
  unsigned dst = slot + (c >> 3) * (kBlockM * kRowBytes) + row0 * kRowBytes + (((c & 7) ^ (row0 & 7)) << 4);
  long long off = at + row0 * row_stride + c * 8;
#pragma unroll kLoadUnroll
  for (int row = row0; row < kBlockM; row += kRowStep) {
    const bool real = row < rows;
    cp_async_16(dst, q + (real ? off : 0), real ? 16 : 0);
    cp_async_16(dst + kQBytes, dout + (real ? off : 0), real ? 16 : 0);
    dst += kRowStep * kRowBytes;
    off += kRowStep * row_stride;
  }
}

@endif@
// dV, and dK with the scale, of this warp's 16 key rows (tile rows key0 -
// g + 0..15) through its 16 of its warpgroup's dQ staging rows at `st`
// (shared address; free: the last bulk add read them): 16-byte chunks,
// swizzled by the row so that the quads' 4-byte stores take one wavefront
// a row, then 16 bytes a lane to global memory. The 4-byte stores straight
// from the accumulators that jagged_bwd_sm90.cu makes (store_dkv) held up
// the computing warps at every tile's end: on the H200 (the harness as
// above) this ran 1.02-1.06x them, but 0.98x at L 4096 causal
// (bench/results/2026-12-04-h200-jagged-bwd-ws-staged-stores.log).
__device__ __forceinline__ void store_dkv_staged(const float (&acc_v)[kHalves][8][4],
                                                 const float (&acc_k)[kHalves][8][4],
                                                 unsigned short *dk, unsigned short *dv,
                                                 long long k_row, long long k_stride, int key0,
                                                 int nk, int tq, int lane, unsigned st) {
  constexpr int kRowChunks = kHeadDim / 8;  // 16-byte chunks of a row
  static_assert(16 * kRowChunks * 16 <= 16 * kStageStride * 4, "16 rows fit the warp's staging rows");
  const int g = lane >> 2, row0 = key0 - g;  // the warp's first key row of the tile
#pragma unroll
  for (int which = 0; which < 2; which++) {  // dV, then dK
    const float (&acc)[kHalves][8][4] = which ? acc_k : acc_v;
    const float scale = which ? kScale : 1.f;
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
      const int r = g + 8 * hi;
#pragma unroll
      for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
        for (int n = 0; n < 8; n++)
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(st + r * (kRowChunks * 16) +
                                                        (((hh * 8 + n) ^ (r & 7)) << 4) + 4 * tq),
                       "r"(pack2(acc[hh][n][2 * hi] * scale, acc[hh][n][2 * hi + 1] * scale))
                       : "memory");
    }
    __syncwarp();
    unsigned short *const out = (which ? dk : dv) + k_row;
#pragma unroll
    for (int x = lane; x < 16 * kRowChunks; x += 32) {
      const int r = x / kRowChunks, c = x % kRowChunks;
      uint4 v4;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v4.x), "=r"(v4.y), "=r"(v4.z), "=r"(v4.w)
                   : "r"(st + r * (kRowChunks * 16) + ((c ^ (r & 7)) << 4)) : "memory");
      if (row0 + r < nk)
        *reinterpret_cast<uint4 *>(out + (row0 + r) * k_stride + 8 * c) = v4;
    }
    __syncwarp();  // read before dK (or the next tile's dQ) is staged
  }
}

@if FUSED_DQ@
// ---- FUSED_DQ's helpers (kFusedDq) ----
// bar.arrive: an arrival at named barrier `id` over `threads` threads,
// without waiting; this thread's earlier memory accesses are ordered
// before the barrier's completion for the threads that wait there.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
// cp.async.bulk.wait_group: at most `pending` of this thread's committed
// bulk groups unfinished, their writes to global memory included.
template <int pending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(pending) : "memory");
}
// fence.proxy.async.global: this thread's async-proxy accesses to global
// memory (the bulk add it waited for, the bulk load it is about to issue)
// ordered with its generic ones (the counter's atomic between them).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// cp.async.bulk (not a tensor): `bytes` (a multiple of 16, both addresses
// 16-byte aligned) from global memory into shared memory at dst, counted
// against bar's transaction bytes.
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src, unsigned bytes,
                                          unsigned bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// The dQ warps' shared state: each computing warpgroup's add, the
// buffers' mbarriers, and what the rounding needs (written once by thread
// 0; read through volatile loads where used, so that the 24 registers a
// loading thread has are not held by it across the loop).
struct DqWarpEnv {
  float *acc;          // the accumulator
  unsigned *counters;  // the tiles' add counters
  unsigned short *dq;
  long long total_q;
  int heads;
};
__shared__ DqAdd dq_desc_s[kMathWgs];
__shared__ DqWarpEnv dq_env_s;
__shared__ __align__(8) unsigned long long conv_bars_s[kMathWgs];

// A dQ warp: serves computing warpgroup wg (its descriptor dq_desc_s[wg],
// its staging rows) until the end descriptor. For each add: the bulk add
// (lane 0), the staging rows freed once read, the add waited for to land
// and counted on the tile's counter; the count's last add rounds the tile:
// a bulk load of its real rows into this warp's buffer (mbarrier
// conv_bars_s[wg]), then dQ = scale * accumulator, rounded, 8 bytes a
// lane, to dq [total_q, heads, kHeadDim].
__device__ __forceinline__ void dq_warp(int wg) {
  const int lane = threadIdx.x & 31;
  int rounded = 0;  // tiles rounded so far: conv_bar's phase
#pragma unroll 1
  for (;;) {
    named_barrier_sync(kDqFull + wg, 128 + 32);
    const volatile DqAdd *d = dq_desc_s + wg;
    const int rows = d->rows;
    if (rows < 0) break;
    const volatile DqWarpEnv *e = &dq_env_s;
    // every field read before the staging rows are freed: the computing
    // warpgroup rewrites the descriptor for its next step once they are
    const long long t0 = d->t0;
    const int hh = d->hh, expected = d->expected;
    float *const tile = e->acc + ((long long)hh * e->total_q + t0) * 64;
    if (lane == 0 && rows > 0) {
      bulk_reduce_add(tile, smem_addr(reinterpret_cast<char *>(smem) + kStageAt) +
                                wg * 64 * kStageStride * 4,
                      rows * 64 * 4);
      bulk_commit();
      bulk_wait_read<0>();
    }
    __syncwarp();
    named_barrier_arrive(kDqEmpty + wg, 128 + 32);  // the staging rows are free
    if (rows == 0) continue;
    const unsigned conv = smem_addr(reinterpret_cast<char *>(smem) + kConvAt) + wg * kConvBytes;
    const unsigned conv_bar = smem_addr(conv_bars_s + wg);
    int last = 0;
    if (lane == 0) {
      bulk_wait<0>();  // the add landed
      fence_proxy_async_global();
      __threadfence();  // released with the count
      last = atomicAdd(e->counters + (long long)hh * e->total_q + t0, 1u) + 1 ==
             (unsigned)expected;
      if (last) {
        __threadfence();  // every add the count saw, acquired
        fence_proxy_async_global();  // before the bulk load reads them
        mbar_arrive_expect_tx(conv_bar, rows * 256);
        bulk_load(conv, tile, rows * 256, conv_bar);
      }
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) continue;
    mbar_wait(conv_bar, rounded & 1);
    rounded++;
    // chunk c (8 floats) of the tile's row r, token t0 + r, sits at chunk
    // c ^ (t0 + r) % 8 (jagged_bwd_rows.cuh's dq_group_at). Four floats a
    // lane at a time: lane l takes quarter l % 16 of a row (chunk q / 2,
    // half q % 2), rows l / 16, + 2, ...
    const long long row_elems = (long long)e->heads * kHeadDim;
    unsigned short *const out = e->dq + (long long)(hh / kHalves) * kHeadDim +
                                (hh % kHalves) * 64 + 4 * (lane & 15);
    const int q = lane & 15;
#pragma unroll 1
    for (int r = lane >> 4; r < rows; r += 2) {
      const long long t = t0 + r;
      float v0, v1, v2, v3;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(v0), "=f"(v1), "=f"(v2), "=f"(v3)
                   : "r"(conv + r * 256 + (((q >> 1) ^ (int)(t & 7)) << 5) + ((q & 1) << 4))
                   : "memory");
      *reinterpret_cast<uint2 *>(out + t * row_elems) =
          make_uint2(pack2(v0 * kScale, v1 * kScale), pack2(v2 * kScale, v3 * kScale));
    }
    // the buffer read before the next bulk load writes it (the async proxy)
    fence_to_bulk();
    __syncwarp();
  }
}

@endif@
/* ---- begin kernel _kv ----
 * KV-stationary: a CTA owns kBlockN keys of one kv head and walks the
 * group's q heads in order and, for each, the query tiles of the band.
 * Warpgroup 0 copies K and V (once both computing warpgroups released the
 * last tile's) and each step's Q, dO, LSE and D into a ring of kStages
 * stages (each refilled once both released it). Computing warpgroup w owns
 * keys 64w..: per step S^T = K Q^T and dP^T = V dO^T, P^T and dS^T in
 * registers, dS^T to shared memory, dQ = dS K (head dim 128: its 64
 * columns over all keys, after a barrier of the computing warpgroups;
 * head dim 64: over its own keys), dV += P^T dO and dK += dS^T Q, and dQ
 * staged and bulk-added to the accumulator while dV and dK run. */
extern "C" __global__ void __launch_bounds__(kThreads, 1)
@KERNEL_NAME@_kv(@PARAMS@) {
  (void)o;
  (void)dq;
  // kv full[slot], kv empty[slot], full[stage], empty[stage]
  __shared__ __align__(8) unsigned long long bars[2 * kKvSlots + 2 * kStages];
  __shared__ long long tile_s[kKvSlots];  // the loader's tile for the computing warpgroups; -1: the end
  __shared__ KeyTile kt_s[kKvSlots];  // and its KeyTile, which they then need not search for
  __shared__ long long picks_s[2];  // the counter's numbers, for the loading warpgroup
  if (batch <= 0 || kv_heads <= 0 || heads % kv_heads != 0) return;
  const int group = heads / kv_heads;
  const long long numbers = num_tiles * kv_heads;  // number i: key tile i / kv_heads, kv head i % kv_heads
  const long long q_stride = (long long)heads * kHeadDim, k_stride = (long long)kv_heads * kHeadDim;
  const unsigned base = smem_addr(smem);
  const unsigned ring_a = base + kRingAt, ds_a = base + kDsAt;  // K, V of slot x at base + 2 kKBytes x
  float *const rows_s = reinterpret_cast<float *>(reinterpret_cast<char *>(smem) + kRowsAt);
  const unsigned kv_full0 = smem_addr(bars), kv_empty0 = kv_full0 + 8 * kKvSlots,
                 full0 = kv_empty0 + 8 * kKvSlots, empty0 = full0 + 8 * kStages;
  if (threadIdx.x == 0) {
    for (int x = 0; x < kKvSlots; x++) {
      // the copies' arrivals and thread 0's, which wrote tile_s[x]
      mbar_init(kv_full0 + 8 * x, kLoadThreads + 1);
      // Every computing thread releases what it read (its reads of the
      // row floats are plain loads): one arrival each.
      mbar_init(kv_empty0 + 8 * x, kMathThreads);
    }
    for (int s = 0; s < kStages; s++) {
      // the loading threads' copies, and with TMA thread 0's expect_tx
      mbar_init(full0 + 8 * s, kLoadThreads + (kTmaQdo ? 1 : 0));
      mbar_init(empty0 + 8 * s, kMathThreads);
    }
@if FUSED_DQ@
    for (int w = 0; w < kMathWgs; w++) mbar_init(smem_addr(conv_bars_s + w), 1);  // lane 0's expect_tx
    dq_env_s = DqWarpEnv{di + dq_accumulator_at(heads, total_q),
                         dq_tile_counters(di, heads, total_q), dq, total_q, heads};
@endif@
    mbar_init_fence();
  }
  __syncthreads();
  // The warpgroup, broadcast from lane 0 so that the compiler sees it
  // warp-uniform (wgmma under a branch it cannot prove uniform serializes).
  const int wgi = __shfl_sync(0xffffffffu, (int)(threadIdx.x >> 7), 0);

  if (wgi == 0) {
    // ---- the loading warpgroup ----
    regs_dec<kLoadRegs>();
@if FUSED_DQ@
    if (threadIdx.x >= kLoadThreads) {  // warps 2, 3: the dQ warps of warpgroups 1, 2
      dq_warp((threadIdx.x - kLoadThreads) >> 5);
      return;
    }
@endif@
    int n = 0, t = 0;  // steps and tiles loaded so far
#pragma unroll 1
    for (long long j = 0;; j++) {
      // The next number, for the whole warpgroup (barrier 4: 1..3 are the
      // computing warpgroups'); two slots, as a slot is rewritten only
      // after the next barrier, which every reader of it passed.
      if (threadIdx.x == 0)
        picks_s[j & 1] = (long long)atomicAdd(tile_counter(di, heads, total_q), 1ull);
      named_barrier_sync(4, kLoadThreads);
      const long long id = picks_s[j & 1];
      if (id >= numbers) break;
      const int hk = (int)(id % kv_heads);
      const KeyTile kt = key_tile(cu_seqlens_q, cu_seqlens_k, batch, total_q, total_k,
                                  id / kv_heads, hk, group, k_stride);
      if (!kt.used) continue;
      // Tile t takes slot t % kKvSlots, once its tile before was done.
      const int x = t % kKvSlots;
      const unsigned kv_full = kv_full0 + 8 * x, k_a = base + x * 2 * kKBytes;
      if (t >= kKvSlots) mbar_wait(kv_empty0 + 8 * x, (t / kKvSlots - 1) & 1);
      if (threadIdx.x == 0) {
        tile_s[x] = id;
        kt_s[x] = kt;
      }
      load_rows<kBlockN>(k_a, k + kt.k_row, k_stride, kt.nk);
      load_rows<kBlockN>(k_a + kKBytes, v + kt.k_row, k_stride, kt.nk);
      mbar_arrive_on_copies(kv_full);
      if (threadIdx.x == 0) mbar_arrive(kv_full);
      // Step i reads query tile qt0 + jq of q head h: both advance by
      // counting (no division), the tokens and rows as 32-bit where they
      // fit, so that the loop stays inside kLoadRegs.
      const long long tok0 = kt.sp.q_start + kt.qt0 * kBlockM;  // the first step's first token
      const int rows0 = (int)(kt.sp.q_len - kt.qt0 * kBlockM);  // its rows to the sequence end
      int jq = 0, h = hk * group;
#pragma unroll 1
      for (int i = 0; i < kt.n_steps; i++, n++) {
        const int s = n % kStages;
        if (n >= kStages) mbar_wait(empty0 + 8 * s, (n / kStages - 1) & 1);
        const int mq = min(kBlockM, rows0 - kBlockM * jq);
        const long long tok = tok0 + kBlockM * jq;
        const unsigned slot = ring_a + s * 2 * kQBytes;
@if TMA_QDO@
        if (threadIdx.x == 0) {  // Q, then dO: kHalves boxes of 64 columns each
          mbar_arrive_expect_tx(full0 + 8 * s, 2 * kQBytes);
#pragma unroll
          for (int hh = 0; hh < kHalves; hh++) {
            tma_load_3d(slot + hh * (kQBytes / kHalves), &tmap_q, full0 + 8 * s, 64 * hh, h,
                        (int)tok);
            tma_load_3d(slot + kQBytes + hh * (kQBytes / kHalves), &tmap_dout, full0 + 8 * s,
                        64 * hh, h, (int)tok);
          }
        }
@else@
        load_step(slot, q, dout, tok * q_stride + (long long)h * kHeadDim, q_stride, mq);
@endif@
        // LSE of the step's rows, then D: float x of the 2 kBlockM is row x
        // % kBlockM's, thread x copies it (and with 128-row steps x + 128).
        const int r = threadIdx.x % kBlockM;
        const long long row = (long long)h * total_q + tok + (r < mq ? r : 0);
        float *f = rows_s + s * 2 * kBlockM + threadIdx.x;
        if constexpr (kFusedDq) {  // 64 loading threads (kBlockM): both floats of a row
          cp_async_4(smem_addr(f), lse + row, r < mq ? 4 : 0);
          cp_async_4(smem_addr(f + kBlockM), di + row, r < mq ? 4 : 0);
        } else {
          cp_async_4(smem_addr(f), (threadIdx.x < kBlockM ? lse : di) + row, r < mq ? 4 : 0);
          if constexpr (kBlockM == 128) cp_async_4(smem_addr(f + 128), di + row, r < mq ? 4 : 0);
        }
        mbar_arrive_on_copies(full0 + 8 * s);
        if (++jq == kt.q_tiles) {
          jq = 0;
          h++;
        }
      }
      t++;
    }
    // No tile left: the computing warpgroups, done with the last one, read
    // the end.
    const int x = t % kKvSlots;
    if (t >= kKvSlots) mbar_wait(kv_empty0 + 8 * x, (t / kKvSlots - 1) & 1);
    if (threadIdx.x == 0) tile_s[x] = -1;
    mbar_arrive(kv_full0 + 8 * x);
    if (threadIdx.x == 0) mbar_arrive(kv_full0 + 8 * x);
    cp_async_wait<0>();
    return;
  }

  // ---- the computing warpgroups ----
  regs_inc<kMathRegs>();
  float *const stage_s = reinterpret_cast<float *>(reinterpret_cast<char *>(smem) + kStageAt);
  float *const dq_acc = di + dq_accumulator_at(heads, total_q);
  const int mt = threadIdx.x - 128;  // thread index among the computing ones
  const int wg = mt >> 7;  // this warpgroup's keys: 64 wg..
  const int warp = (mt >> 5) & 3;  // its rows in them: 16 warp..
  const int lane = mt & 31, g = lane >> 2, tq = lane & 3;
  const int key0 = 64 * wg + 16 * warp + g;  // this thread's first key row of the tile (+8)
  int n = 0;  // steps computed so far
@if FUSED_DQ@
  bool dq_pending = false;  // an add handed to the dQ warp that has not freed the staging rows
@endif@
#pragma unroll 1
  for (int t = 0;; t++) {
    const int x = t % kKvSlots;
    const unsigned k_a = base + x * 2 * kKBytes, v_a = k_a + kKBytes;
    mbar_wait(kv_full0 + 8 * x, (t / kKvSlots) & 1);
    if constexpr (kTmaQdo) fence_proxy_async();  // K, V (cp.async) are read by wgmma
    const long long id = *static_cast<volatile long long *>(&tile_s[x]);
    if (id < 0) break;
    const int hk = (int)(id % kv_heads);
    // The loader's KeyTile, written before thread 0's arrival on kv_full:
    // each computing thread searched cu_seqlens_k for it before (the traced
    // step's tile end, about 5,000 clocks a tile at L 1024). On an H100 (the
    // harness, three rounds in turn, L 1024 / 4096) 1.07 / 1.04x unmasked at
    // head dim 128, 1.07 / 1.08x at 64; causal 0.99 / 1.01x at 128, 1.05 /
    // 0.96x at 64 (bench/results/2026-12-06-h100-jagged-bwd-s29.log).
    const KeyTile kt = kt_s[x];
    const SeqSpan &sp = kt.sp;
    const long long delta = sp.k_len - sp.q_len;
    float acc_v[kHalves][8][4], acc_k[kHalves][8][4];
    zero_dkv(acc_v, acc_k);

#pragma unroll 1
    for (int i = 0; i < kt.n_steps; i++, n++) {
      const int s = n % kStages;
      mbar_wait(full0 + 8 * s, (n / kStages) & 1);
      // the copies are read by wgmma (the async proxy); TMA's already are
      if constexpr (!kTmaQdo) fence_proxy_async();
      const QueryStep st = query_step(kt, i, hk, group, q_stride);
      const int h = st.h, mq = st.mq;
      const long long i0 = st.i0;
      const unsigned q_a = ring_a + s * 2 * kQBytes, do_a = q_a + kQBytes;
      const float *const lse_r = rows_s + s * 2 * kBlockM, *const d_r = lse_r + kBlockM;
      const unsigned dst_a = ds_a + (n & 1) * kDsBytes;  // this step's dS^T buffer

      // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys: rows
      // are keys (key0, key0 + 8), columns the step's queries. Committed
      // apart, so that P^T is computed while dP^T runs.
      float sp_t[kChunks][4], dp[kChunks][4];  // S^T, then P^T in place
      wgmma_fence();
      keys_times_queries(sp_t, k_a, q_a, wg);
      wgmma_commit();
      keys_times_queries(dp, v_a, do_a, wg);
      wgmma_commit();
      wgmma_wait<1>();  // S^T; dP^T runs on
      wgmma_hold(sp_t);

      // P^T, and its 16-bit pairs (the A operand of dV). Masks as
      // jagged_bwd_sm90.cu's: a key row past the sequence end is masked too.
      const Band band = tile_band(i0, kt.k0, delta);
      const bool full = mq == kBlockM && kt.nk == kBlockN && band.lo <= -(kBlockM - 1) &&
                        band.hi >= kBlockN - 1;
      unsigned p16[kChunks][2], ds16[kChunks][2];
      // P first, with no case for a query that sees no key (LSE -inf): each
      // of its pairs is masked below, P selected to 0 whatever exp2 gave,
      // and a full tile has no such query. Then the mask, apart: key row r
      // sees columns [max(0, r - hi), min(mq - 1, r - lo)] (none past nk),
      // one unsigned compare an element. On an H100 (the harness, against
      // the per-element band test inside the exp2 loop) this ran causal
      // 1.08x at head dim 128 and 1.23-1.30x at 64, unmasked 1.0-1.03x
      // (bench/results/2026-12-06-h100-jagged-bwd-msk.log): the traced
      // step had spent 550 (head dim 128) to 1540 (64) more clocks on P
      // when masked (bench/results/2026-12-06-h100-jagged-bwd-trace.log).
#pragma unroll
      for (int j = 0; j < kChunks; j++) {
        const int col = 8 * j + 2 * tq;
        const float2 lr = *reinterpret_cast<const float2 *>(lse_r + col);
        const float m0 = lr.x * -kLog2e, m1 = lr.y * -kLog2e;
#pragma unroll
        for (int e = 0; e < 4; e++)
          sp_t[j][e] = fast_exp2(fmaf(sp_t[j][e], kScaleLog2, (e & 1) ? m1 : m0));
      }
      if (!full) {
        int first[2], width[2];
        seen_columns(band, key0, mq, kt.nk, first, width);
#pragma unroll
        for (int j = 0; j < kChunks; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int c = 8 * j + 2 * tq + (e & 1);
            if ((unsigned)(c - first[e >> 1]) >= (unsigned)width[e >> 1]) sp_t[j][e] = 0.f;
          }
      }
      wgmma_wait<0>();  // dP^T
      wgmma_hold(dp);
      // dS^T = P^T (.) (dP^T - D) as 16-bit pairs (the A operand of dK),
      // and to shared memory for dQ: row key0 (+ 8) of the step's
      // [key][query] matrices (64 queries each), chunk j.
#pragma unroll
      for (int j = 0; j < kChunks; j++) {
        const int col = 8 * j + 2 * tq;
        const float2 dd = *reinterpret_cast<const float2 *>(d_r + col);
        ds16[j][0] = pack2(sp_t[j][0] * (dp[j][0] - dd.x), sp_t[j][1] * (dp[j][1] - dd.y));
        ds16[j][1] = pack2(sp_t[j][2] * (dp[j][2] - dd.x), sp_t[j][3] * (dp[j][3] - dd.y));
        p16[j][0] = pack2(sp_t[j][0], sp_t[j][1]);
        p16[j][1] = pack2(sp_t[j][2], sp_t[j][3]);
      }
      // by stmatrix, 4 stores a thread instead of 16 st.shared.b32: on an
      // H100 (the harness, two seeds) 1.01-1.02x causal at head dim 128,
      // 1.04x at 64 (0.98-1.0x unmasked at 64, L 4096), even unmasked at 128
      // (bench/results/2026-12-06-h100-jagged-bwd-stm.log)
      store_ds_t_x4(dst_a, 64 * wg + 16 * warp, ds16, lane);

      // dQ = dS K: A is dS^T read MN-major (k over keys), B K's rows read
      // MN-major. The staging rows are free once every thread of the
      // warpgroup saw the last step's bulk adds read them (the barrier).
      bulk_wait_read<0>();
      fence_proxy_async();  // dS^T is read by wgmma
      if constexpr (kOwnDs) named_barrier_sync(2 + wg, 128);
      else named_barrier_sync(1, kMathThreads);
      float c[8][4];
      wgmma_fence();
      issue_dq(c, dst_a, k_a, wg);
      wgmma_commit();
@if DKV_N128@
      issue_dkv_n128(acc_v, acc_k, p16, ds16, q_a, do_a);
@else@
      issue_dkv(acc_v, acc_k, p16, ds16, q_a, do_a);
@endif@
      wgmma_commit();

      wgmma_wait<1>();  // dQ is done; dV and dK run on under the staging
      wgmma_hold(c);

      // c's rows are the step's queries 16 warp + g (+ 8) (of 64 wg.. with
      // 128-row steps), its columns 8j + 2tq of this warpgroup's 64 (head
      // dim 128) or of the head: to the warpgroup's staging rows in the
      // accumulator's tile layout, then one bulk fp32 add of the real rows
      // (the copy engine adds).
      float *const stage = stage_s + wg * 64 * kStageStride;
      const int q_off = kBlockM == 128 ? 64 * wg : 0;  // c's first query row of the step
      const long long t0 = sp.q_src + i0 + q_off;  // c's first token
      const int mc = min(64, mq - q_off);  // c's real rows (none: no add)
@if FUSED_DQ@
      if (dq_pending) named_barrier_sync(kDqEmpty + wg, 128 + 32);  // the last add read them
@endif@
#pragma unroll
      for (int hi = 0; hi < 2; hi++) {
        const int r = 16 * warp + g + 8 * hi;
        float *const srow = stage + r * kStageStride + 2 * tq;
        const int swz = (int)((t0 + r) & 7);  // jagged_bwd_rows.cuh's dq_group_at
#pragma unroll
        for (int j = 0; j < 8; j++)
          *reinterpret_cast<float2 *>(srow + 8 * (j ^ swz)) =
              make_float2(c[j][2 * hi], c[j][2 * hi + 1]);
      }
      fence_proxy_async();  // the staging rows are read by the copy engine
      const int half = kHalves == 2 ? wg : 0;  // the 64 columns of the head c holds
@if FUSED_DQ@
      // the add, to the dQ warp: the tile, its rows and how many key tiles
      // add to it (those the step's queries see keys of)
      if ((mt & 127) == 0) {
        long long kf, kl;
        keys_seen(i0, i0 + mq - 1, sp.q_len, sp.k_len, kf, kl);
        dq_desc_s[wg] = DqAdd{t0, h * kHalves + half, mc > 0 ? mc : 0,
                              kl < kf ? 0 : (int)(kl / kBlockN - kf / kBlockN + 1)};
      }
      named_barrier_arrive(kDqFull + wg, 128 + 32);
      dq_pending = true;
      (void)dq_acc;
@else@
      named_barrier_sync(2 + wg, 128);
      if ((mt & 127) == 0 && mc > 0) {
        bulk_reduce_add(dq_acc + ((long long)(h * kHalves + half) * total_q + t0) * 64,
                        smem_addr(stage), mc * 64 * 4);
        bulk_commit();
      }
@endif@

      // dV and dK are done: the stage may be refilled.
      wgmma_wait<0>();
#pragma unroll
      for (int hh = 0; hh < kHalves; hh++) {
        wgmma_hold(acc_v[hh]);
        wgmma_hold(acc_k[hh]);
      }
      keep(p16);
      keep(ds16);
      mbar_arrive(empty0 + 8 * s);
    }
    // Every product reading K and V is done: the next tile's may land.
    mbar_arrive(kv_empty0 + 8 * x);

    // dV, and dK with the scale, of the warp's key rows, once the
    // warpgroup's last bulk add read the staging rows.
@if FUSED_DQ@
    if (dq_pending) named_barrier_sync(kDqEmpty + wg, 128 + 32);
    dq_pending = false;
@else@
    if ((mt & 127) == 0) bulk_wait_read<0>();
    named_barrier_sync(2 + wg, 128);
@endif@
    store_dkv_staged(acc_v, acc_k, dk, dv, kt.k_row, k_stride, key0, kt.nk, tq, lane,
                     smem_addr(stage_s + (wg * 64 + 16 * warp) * kStageStride));
  }
@if FUSED_DQ@
  // The end, to the dQ warp (the staging rows are free: the last tile's end
  // waited for them).
  if ((mt & 127) == 0) dq_desc_s[wg] = DqAdd{0, 0, -1, 0};
  named_barrier_arrive(kDqFull + wg, 128 + 32);
@else@
  bulk_wait_read<0>();  // the staging rows are read before the CTA's memory goes
@endif@
}
/* ---- end kernel _kv ---- */
