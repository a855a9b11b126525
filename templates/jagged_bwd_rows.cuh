@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_rows.cuh: the two row kernels around the sm_90a jagged
@# backward's key-stationary kernel (jagged_bwd_sm90.cu's and
@# jagged_bwd_ws.cu's _kv): _pre writes D = rowsum(dO (.) O) and zeroes the
@# fp32 dQ accumulator (and the persistent _kv's tile counter), _dq rounds
@# the accumulator into dQ (rotating it back first when Q is rotated).
@# Needs: kHeadDim, kRowsThreads, kPieces, kScale, kDqTiled, kTileCounter,
@#   @PARAMS@'s names,
@#   neg_inf(), dot_pieces(), RotaryTables (jagged_bwd_tile.cuh), pack2(), and with ROTARY: kRotateQ,
@#   RotaryRows, pair_angle(), clamp_offset() (and with FUSED_DQ clamp_offset()).
@# Placeholders: @KERNEL_NAME@ @PARAMS@ @ROTARY_TABLES@ (as in jagged_bwd.cu).
@# Conditions: ROTARY, ROTARY_TABLE,
@#   ROTARY_HALF (as the includer's), FUSED_DQ (jagged_bwd_ws.cu's: _pre also
@#   zeroes the tiles' add counters and writes dQ 0 for rows that see no
@#   key; needs kHalves).
// Where the fp32 dQ accumulator starts in `di` (16-byte aligned).
__device__ __forceinline__ long long dq_accumulator_at(long long heads, long long total_q) {
  return (heads * total_q + 3) / 4 * 4;
}

// The persistent backward's tile counter (kTileCounter): after the
// accumulator, 8-byte aligned (the accumulator's size is a multiple of 64
// floats).
__device__ __forceinline__ unsigned long long *tile_counter(float *di, long long heads,
                                                            long long total_q) {
  return reinterpret_cast<unsigned long long *>(di + dq_accumulator_at(heads, total_q) +
                                                heads * total_q * kHeadDim);
}

@if FUSED_DQ@
// FUSED_DQ's add counters, one a (head, 64-column half, token): after the
// tile counter (8 bytes), [heads * kHalves][total_q] of them; the one of
// a step's first token counts the adds to that step's tile.
__device__ __forceinline__ unsigned *dq_tile_counters(float *di, long long heads,
                                                      long long total_q) {
  return reinterpret_cast<unsigned *>(tile_counter(di, heads, total_q) + 1);
}

@endif@
// Where group i of dQ (8 elements: chunk i % kChunks of row i / kChunks of
// the [total_q * heads, kHeadDim] tensor) sits in the accumulator, in
// floats: at 8 i, or with kDqTiled in [heads][kHeadDim / 64][total_q][64]
// order, the 8-float chunks of token t's row XOR-swizzled by t % 8, so
// that a step's rows of one head and 64 columns are one contiguous run
// (one bulk add) and the staging stores that fill them are conflict-free.
__device__ __forceinline__ long long dq_group_at(long long i, int heads, long long total_q) {
  if constexpr (!kDqTiled) {
    (void)heads, (void)total_q;
    return 8 * i;
  } else {
    constexpr int kChunks = kHeadDim / 8;
    const long long row = i / kChunks, t = row / heads;
    const int h = (int)(row - t * heads), c = (int)(i - row * kChunks);
    return ((long long)(h * (kHeadDim / 64) + c / 8) * total_q + t) * 64 +
           ((c % 8) ^ (int)(t & 7)) * 8;
  }
}

/* ---- begin kernel _pre ----
 * One (token, head) row of kPieces lanes: D = rowsum(dO (.) O) to `di`
 * (0 for a row with no key, whose LSE is -inf), and the row's dQ
 * accumulator zeroed. */
constexpr int kRowsPerCta = kRowsThreads * 8 / kHeadDim;
extern "C" __global__ void __launch_bounds__(kRowsThreads)
@KERNEL_NAME@_pre(@PARAMS@) {
  (void)q, (void)k, (void)v, (void)dq, (void)dk, (void)dv, (void)cu_seqlens_q;
  (void)cu_seqlens_k, (void)batch, (void)kv_heads, (void)total_k, (void)num_tiles;
@if ROTARY_TABLE@
  (void)rotary_table, (void)rotary_table_k;
@endif@
  const long long rows = total_q * heads;
  const long long row = blockIdx.x * (long long)kRowsPerCta + threadIdx.x / kPieces;
  const int piece = threadIdx.x % kPieces;
  if constexpr (kTileCounter)
    if (blockIdx.x == 0 && threadIdx.x == 0) *tile_counter(di, heads, total_q) = 0;
  float a = 0.f;
  if (row < rows) {
    const long long at = row * kHeadDim + piece * 8;
    a = dot_pieces(o + at, dout + at, a);
    float4 *acc = reinterpret_cast<float4 *>(di + dq_accumulator_at(heads, total_q) + at);
    acc[0] = acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int d = 1; d < kPieces; d <<= 1) a += __shfl_xor_sync(0xffffffffu, a, d);
  if (piece == 0 && row < rows) {
    const long long t = row / heads, h = row - t * heads;
    di[h * total_q + t] = lse[h * total_q + t] == neg_inf() ? 0.f : a;
@if FUSED_DQ@
    unsigned *const counters = dq_tile_counters(di, heads, total_q);
#pragma unroll
    for (int half = 0; half < kHalves; half++) counters[(h * kHalves + half) * total_q + t] = 0;
@endif@
  }
@if FUSED_DQ@
  // A row that sees no key, or a token outside every sequence: no key tile
  // adds to it, and _kv may round no tile holding it, so its dQ (0) is
  // written here.
  if (row < rows) {
    const long long t = row / heads, h = row - t * heads;
    const long long first = clamp_offset(__ldg(cu_seqlens_q), 0, total_q);
    const long long end = clamp_offset(__ldg(cu_seqlens_q + batch), first, total_q);
    if (lse[h * total_q + t] == neg_inf() || t < first || t >= end)
      *reinterpret_cast<uint4 *>(dq + row * kHeadDim + piece * 8) = make_uint4(0, 0, 0, 0);
  }
@endif@
}
/* ---- end kernel _pre ---- */

@if ROTARY@
/* ---- begin dQ rotated back ----
 * Group i (8 elements) of the accumulator's [total_q * heads, kHeadDim]
 * rows: dQ = R^T (scale * accumulator), rounded, for the row's token t at
 * its position (t - its sequence's start + Lk - Lq: the sequence found by
 * a binary search over the clamped offsets), or with its table row. */
__device__ __forceinline__ void unrotate_dq(const float4 *acc, long long i,
    unsigned short *__restrict__ dq, const RotaryTables &tables,
    const int *__restrict__ cu_seqlens_q, const int *__restrict__ cu_seqlens_k, long long batch,
    int heads, long long total_q, long long total_k) {
  constexpr int kChunks = kHeadDim / 8;
  const long long row = i / kChunks, t = row / heads;
  const int c = (int)(i - row * kChunks);
@if ROTARY_HALF@
  if (c >= kChunks / 2) return;  // the partner chunk's thread does it
@endif@
  RotaryRows rr;
@if ROTARY_TABLE@
  (void)cu_seqlens_q, (void)cu_seqlens_k, (void)batch, (void)total_q, (void)total_k;
  rr.pos0 = 0;
  rr.table = tables.q + t * kHeadDim;
@else@
  (void)tables;
  long long lo = 0, hi = batch - 1;  // the last sequence whose start is <= t
  while (lo < hi) {
    const long long mid = (lo + hi + 1) / 2;
    if (clamp_offset(__ldg(cu_seqlens_q + mid), 0, total_q) <= t) lo = mid;
    else hi = mid - 1;
  }
  const long long qs = clamp_offset(__ldg(cu_seqlens_q + lo), 0, total_q);
  const long long qe = clamp_offset(__ldg(cu_seqlens_q + lo + 1), qs, total_q);
  const long long ks = clamp_offset(__ldg(cu_seqlens_k + lo), 0, total_k);
  const long long ke = clamp_offset(__ldg(cu_seqlens_k + lo + 1), ks, total_k);
  rr.pos0 = t - qs + (ke - ks) - (qe - qs);
  rr.table = nullptr;
@endif@
  float g[2][8];  // the group (and, half layout, its partner), scaled
  {
    const float4 x = acc[0], y = acc[1];
    const float v[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
    for (int e = 0; e < 8; e++) g[0][e] = v[e] * kScale;
  }
@if ROTARY_HALF@
  {
    const float4 *const p = acc + 2 * (kChunks / 2);
    const float4 x = p[0], y = p[1];
    const float v[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
    for (int e = 0; e < 8; e++) g[1][e] = v[e] * kScale;
  }
  // pair 8c + e is (element e of this group, element e of the partner)
#pragma unroll
  for (int e = 0; e < 8; e++) {
    float s, co;
    pair_angle(rr, 0, 8 * c + e, s, co);
    const float x0 = g[0][e], x1 = g[1][e];
    g[0][e] = x0 * co + x1 * s;
    g[1][e] = x1 * co - x0 * s;
  }
@else@
  // pair 4c + j is elements 2j, 2j + 1 of this group
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float s, co;
    pair_angle(rr, 0, 4 * c + j, s, co);
    const float x0 = g[0][2 * j], x1 = g[0][2 * j + 1];
    g[0][2 * j] = x0 * co + x1 * s;
    g[0][2 * j + 1] = x1 * co - x0 * s;
  }
@endif@
@if ROTARY_HALF@
  constexpr int kParts = 2;  // the group, and its partner
@else@
  constexpr int kParts = 1;  // the group
@endif@
#pragma unroll
  for (int part = 0; part < kParts; part++) {
    uint4 r;
    r.x = pack2(g[part][0], g[part][1]);
    r.y = pack2(g[part][2], g[part][3]);
    r.z = pack2(g[part][4], g[part][5]);
    r.w = pack2(g[part][6], g[part][7]);
    reinterpret_cast<uint4 *>(dq)[i + part * (kChunks / 2)] = r;
  }
}
/* ---- end dQ rotated back ---- */

@endif@
/* ---- begin kernel _dq ----
 * dQ = scale * accumulator, rounded: 8 elements a thread. With Q rotated,
 * rotated back first: in the half layout the thread of a row's chunk c <
 * kChunks / 2 also takes chunk c + kChunks / 2 (its pairs' partners), and
 * that chunk's thread has nothing to do. */
extern "C" __global__ void __launch_bounds__(kRowsThreads)
@KERNEL_NAME@_dq(@PARAMS@) {
  (void)q, (void)k, (void)v, (void)o, (void)dout, (void)lse, (void)dk, (void)dv;
  (void)cu_seqlens_q, (void)cu_seqlens_k, (void)batch, (void)kv_heads, (void)total_k;
  (void)num_tiles;
  const long long i = blockIdx.x * (long long)kRowsThreads + threadIdx.x;  // 8-element group
  if (i >= total_q * heads * (kHeadDim / 8)) return;
  const float4 *const acc = reinterpret_cast<const float4 *>(di + dq_accumulator_at(heads, total_q)) +
                            dq_group_at(i, heads, total_q) / 4;
@if ROTARY@
  if constexpr (kRotateQ) {
    static_assert(!kDqTiled, "unrotate_dq reads the partner chunk of a row-major row");
    const RotaryTables tables = @ROTARY_TABLES@;
    unrotate_dq(acc, i, dq, tables, cu_seqlens_q, cu_seqlens_k, batch, heads, total_q, total_k);
    return;
  }
@endif@
  const float4 x = acc[0], y = acc[1];
  uint4 r;
  r.x = pack2(x.x * kScale, x.y * kScale);
  r.y = pack2(x.z * kScale, x.w * kScale);
  r.z = pack2(y.x * kScale, y.y * kScale);
  r.w = pack2(y.z * kScale, y.w * kScale);
  reinterpret_cast<uint4 *>(dq)[i] = r;
}
/* ---- end kernel _dq ---- */
