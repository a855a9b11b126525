@# SPDX-License-Identifier: BSD-3-Clause
@# block_bwd_chunked.cu: block-diagonal attention backward for blocks too
@# large to keep whole in shared memory (past 128 tokens at head_dim 128,
@# 176 at 64): the block is walked in 64-row chunks, with recomputation.
@# Placeholders: @KERNEL_NAME@ @BLOCK_SIZE@ @HEAD_DIM@ @MIN_CTAS@ @SMEM_BYTES@
@#   @SCALE@ @SCALE_LOG2@ @SCALE_TEXT@ @MMA_TYPE@ @PAIR_TYPE@ (as block_bwd.cu)
@#   @ROTATE_Q@ @ROTATE_KEYS@ (0 | 1: Q, or K or V, rotated, so a chunk's
@#   resident pair lands apart; 0 without rotary embeddings). With rotary
@#   embeddings, those of rotary.cuh.
@# Conditions: CAUSAL; SCALE_IN_DS (as block_bwd.cu); OWN_HELPERS (include
@#   mma_sm80.cuh); IN_NAMESPACE (put all of this in namespace bwd);
@#   ROTARY (rotary embeddings: then those of rotary.cuh, with ROTARY_CHUNKS
@#   on; ROTARY_HALF also shapes the chunk load, ROTARY_TABLE the kernel's
@#   parameters and ROTARY_SEQUENCE the work walk); ROTATE_KEYS (K or V is
@#   rotated).
@if IN_NAMESPACE@
/* The backward kernel. Its constants and functions live in namespace bwd,
 * apart from the forward's; the device helpers above serve both. */
namespace bwd {

@endif@
/* ---- begin constants ---- */
constexpr int kBlock = @BLOCK_SIZE@;  // tokens per diagonal block
constexpr int kHeadDim = @HEAD_DIM@;  // elements per head
constexpr int kWarps = 4;  // warps per CTA: 16 rows of a chunk each
constexpr int kThreads = kWarps * 32;
constexpr int kHeadsPerTile = 1;  // one head per work item
constexpr int kMinCtasPerSm = @MIN_CTAS@;  // launch bound: registers fit this many CTAs
@include block_bwd_scale.cuh@

constexpr int kChunk = 64;  // rows per chunk: 16 per warp
// Query rows with statistics: every row of every chunk, those past the
// block's end (in its last, partial chunk) too.
constexpr int kStatRows = (kBlock + kChunk - 1) / kChunk * kChunk;
constexpr int kPieces = kHeadDim / 8;  // 16-byte pieces per row
constexpr int kChunkElems = kChunk * kHeadDim;  // one chunk of one tensor
// n-tiles of a warp's rows of S and dP over a key chunk (in part B, of S^T
// and dP^T over a query chunk)
constexpr int kKeyTiles = kChunk / 8;
constexpr int kDimTiles = kHeadDim / 8;  // n-tiles of dQ, dK and dV
@if ROTARY@
constexpr int kHeadChunks = kPieces;  // rotary.cuh's name for a row's pieces
@endif@
constexpr int kSmemBytes = @SMEM_BYTES@;  // dynamic shared memory, as planned
// Shared memory: six chunk slots, then each query row's softmax statistics
// (three floats per row). A sweep keeps one pair of tensors' chunks in
// slots 0, 1 and streams the other pair's through slots 2, 3 and 4, 5: the
// next pair loads while this one is computed.
constexpr int kSlots = 6;
static_assert(2 * kSlots * kChunkElems + 3 * 4 * kStatRows == kSmemBytes,
              "the plan's shared memory is six chunks and the row statistics");
static_assert(kBlock > kChunk && kBlock % 16 == 0, "more than one chunk of 16-row tiles");
/* ---- end constants ---- */

@if OWN_HELPERS@
@include mma_sm80.cuh@

@endif@
// The CTA's dynamic shared memory: the six chunk slots, then the row
// statistics.
extern __shared__ __align__(128) unsigned short smem[];

@include block_walk.cuh@

/* ---- begin the math ----
 * Per (block, head), with P = softmax(scale * Q K^T) over the visible keys
 * and dO = dL/dO given:
 *   dV = P^T dO,   dP = dO V^T,   D = rowsum(P (.) dP),
 *   dS = scale * P (.) (dP - D),   dQ = dS K,   dK = dS^T Q
 * (the scale multiplies dS or, for fp16, dQ and dK: kDsScale, kStoreScale).
 * A block of kBlock rows does not fit in shared memory with its P and dS,
 * so it is walked in 64-row chunks, each warp taking 16 rows of a chunk:
 *   A. For each query chunk, two sweeps over the key chunks: the first
 *      finds each row's maximum, softmax sum and D (rescaled online as the
 *      maximum grows), which go to shared memory; the second recomputes S
 *      and dP, forms dS and sums dQ = dS K, stored once at the end.
 *   B. For each key chunk, one sweep over the query chunks: S^T and dP^T
 *      recomputed with keys as rows, P^T and dS^T from the statistics of
 *      A, and dV = P^T dO, dK = dS^T Q summed and stored at the end.
 * Q K^T is computed three times and dO V^T three times, for no logsumexp
 * in memory and no atomics: every gradient row belongs to one CTA.
@if ROTARY@
 * With rotary embeddings Q, K (V) are rotated in shared memory every time a
 * chunk of them lands (a chunk streamed again is loaded again, and rotated
 * again), each thread rotating the pieces it copied, so the barrier that
 * publishes a chunk publishes it rotated. The gradients are then those of
 * the rotated tensors, and dQ, dK (dV) are rotated back before they are
 * stored.
@endif@
 * ---- end the math ---- */

/* ---- begin chunk load ----
 * Chunks are row-major with 16-byte pieces XOR-swizzled by the row (piece
 * c of row r sits at c ^ (r % 8)), so the 8 row addresses of an ldmatrix
 * hit 8 different bank groups. Rows past the sequence end are zero-filled,
 * never read from memory. */
__device__ __forceinline__ int swizzle(int row, int piece) {
  return row * kHeadDim + ((piece ^ (row & 7)) * 8);
}

@if ROTARY_HALF@
// Threads that copy one row of a chunk: each copies piece p < kPieces / 2
// and its partner p + kPieces / 2, the unit that rotary.cuh rotates as one
// in the half layout, so that it can rotate what it copied (rotate_copied).
constexpr int kCopiers = kPieces / 2;
@else@
constexpr int kCopiers = kPieces;  // threads that copy one row of a chunk, a piece each
@endif@

// Start the copy of block rows r0..r0+63 of one tensor (the tile's head)
// into `chunk`; completion is awaited with the commit group.
__device__ __forceinline__ void load_chunk(unsigned short *chunk, const unsigned short *src,
                                           long long row_stride, const Tile &t, int r0) {
  constexpr int kRowStep = kThreads / kCopiers;  // rows one pass of the CTA covers
  static_assert(kThreads % kCopiers == 0 && kChunk % kRowStep == 0, "passes cover whole rows");
  const unsigned short *first = src + t.token0 * row_stride + (long long)t.head0 * kHeadDim;
  const unsigned dst = smem_addr(chunk);
  const int row0 = threadIdx.x / kCopiers, piece = threadIdx.x % kCopiers;
  const unsigned short *g = first + (r0 + row0) * row_stride + piece * 8;
#pragma unroll
  for (int k = 0; k < kChunk / kRowStep; k++) {
    const int row = row0 + k * kRowStep;
    const bool real = r0 + row < t.rows;
    const unsigned short *from = real ? g : first;  // the row, or zero fills
    cp_async_16(dst + swizzle(row, piece) * 2, from, real ? 16 : 0);
@if ROTARY_HALF@
    cp_async_16(dst + swizzle(row, piece + kPieces / 2) * 2, from + kHeadDim / 2, real ? 16 : 0);
@endif@
    g += kRowStep * row_stride;
  }
}

// The streamed pair of step i of a sweep sits in slots 2, 3 (even i) or 4,
// 5 (odd i); its first chunk here, the second kChunkElems on.
__device__ __forceinline__ unsigned short *ring_slot(unsigned short *slots, int i) {
  return slots + (2 + 2 * (i & 1)) * kChunkElems;
}

// Start the copy of tensors a and b at block rows r0.. into the ring slot
// of step i; the caller commits.
__device__ __forceinline__ void load_pair(unsigned short *slots, int i, const unsigned short *a,
                                          const unsigned short *b, long long row_stride,
                                          const Tile &t, int r0) {
  load_chunk(ring_slot(slots, i), a, row_stride, t, r0);
  load_chunk(ring_slot(slots, i) + kChunkElems, b, row_stride, t, r0);
}

// A chunk's start (query_chunk's and key_chunk's): the resident pair, a
// and b at block rows r0.., into slots 0 and 1, then the ring's first, c
// and d at rows r1.., into its step 0. With kApart the resident pair is a
// commit group of its own and has landed on return (this thread's
// copies), for the caller to work on while the ring's first lands.
template <int kApart>
__device__ __forceinline__ void start_chunk(unsigned short *slots, const unsigned short *a,
                                            const unsigned short *b, int r0,
                                            const unsigned short *c, const unsigned short *d,
                                            int r1, long long row_stride, const Tile &t) {
  __syncthreads(); // nobody reads the old chunks any more
  load_chunk(slots, a, row_stride, t, r0);
  load_chunk(slots + kChunkElems, b, row_stride, t, r0);
  if constexpr (kApart) cp_async_commit();
  load_pair(slots, 0, c, d, row_stride, t, r1);
  cp_async_commit();
  if constexpr (kApart) cp_async_wait<1>();
}

// Step i of a chunk's ring (in A, sweep 2 goes on with sweep 1's
// numbering): once every warp is done with step i - 1, refill its slot
// with the pair of step i + 1 (block rows r_next, none if negative), then
// wait for this thread's copies of step i's pair (and, at step 0, of the
// resident pair, unless the caller awaited them before). The caller then
@if ROTARY@
// rotates what it copied (rotate_copied reads no other thread's copies)
// and synchronizes the CTA, which publishes the chunks rotated.
@else@
// synchronizes the CTA, which publishes the chunks.
@endif@
__device__ __forceinline__ void ring_wait(unsigned short *slots, int i, const unsigned short *a,
                                          const unsigned short *b, long long row_stride,
                                          const Tile &t, int r_next) {
  __syncthreads();
  if (r_next >= 0) load_pair(slots, i + 1, a, b, row_stride, t, r_next);
  cp_async_commit();
  cp_async_wait<1>();
}
/* ---- end chunk load ---- */

@include rows_mma.cuh@

@include rows_accumulate.cuh@

@include store_rows.cuh@

@include unpack2.cuh@
@if ROTARY@

@include rotary.cuh@

/* ---- begin chunk rotation ---- */
// Rotate in place this thread's units of chunk x and, unless null, of chunk
// y, both at block rows r0..r0+63: exactly the units load_chunk had it copy
// (a unit is what a thread copies of a row: one piece, or with the half
// layout a piece and its partner), which its own wait has made visible to
// it; the barrier after publishes them. x and y hold the same rows and
// share the angles. Rows past the sequence end are zero and stay so.
__device__ __forceinline__ void rotate_copied(unsigned short *x, unsigned short *y,
                                              const Tile &t, int r0) {
  static_assert(kUnitsPerRow == kCopiers && kUnitRows == kThreads / kCopiers,
                "each thread rotates the units it copied, and no other thread's");
  static_assert(kChunk % kUnitRows == 0, "every thread has as many rows of a chunk");
  const int cc = threadIdx.x % kUnitsPerRow, row0 = threadIdx.x / kUnitsPerRow;
@if ROTARY_COMPUTED@
  float turns[kUnitPairs];
#pragma unroll
  for (int j = 0; j < kUnitPairs; j++) turns[j] = kRotaryTurns[kUnitPairs * cc + j];
@endif@
#pragma unroll
  for (int k = 0; k < kChunk / kUnitRows; k++) {
    const int row = row0 + k * kUnitRows;
    float s[kUnitPairs], c[kUnitPairs];
@if ROTARY_TABLE@
    // Rows past the end read the last row's angles (and are left alone), so
    // every row's table reads can be issued at once.
    unit_angles(t.table, min(r0 + row, t.rows - 1), cc, s, c);
@else@
    const float p = (float)rotary_position(t, r0 + row);
#pragma unroll
    for (int j = 0; j < kUnitPairs; j++) rotary_sincos(p * turns[j], s[j], c[j]);
@endif@
    if (r0 + row < t.rows) {
      rotate_unit(x, row, cc, s, c);
      if (y) rotate_unit(y, row, cc, s, c);
    }
  }
}
@if ROTATE_KEYS@

// Rotate this thread's units of a K, V chunk pair (K first, V kChunkElems
// on) at block rows r0..: those of the tensors the spec rotates.
__device__ __forceinline__ void rotate_keys(unsigned short *pair, const Tile &t, int r0) {
@if ROTATE_K@
@if ROTATE_V@
  rotate_copied(pair, pair + kChunkElems, t, r0); // K and V
@else@
  rotate_copied(pair, nullptr, t, r0); // K
@endif@
@else@
  rotate_copied(pair + kChunkElems, nullptr, t, r0); // V
@endif@
}
@endif@
/* ---- end chunk rotation ---- */
@endif@

__device__ __forceinline__ void clear(float (&acc)[kDimTiles][4]) {
#pragma unroll
  for (int n = 0; n < kDimTiles; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// Whether query `qr` sees key `kr` (rows of the block): never a key past
// the sequence end.
__device__ __forceinline__ bool visible(int qr, int kr, int rows) {
@if CAUSAL@
  return kr < rows && kr <= qr;
@else@
  return kr < rows;
@endif@
}

// Query rows' softmax statistics, in shared memory: the row maximum of
// S * scale * log2 e, 1 / the row sum, and D.
struct RowStats {
  float *max_log2, *inv_sum, *d;
};

/* ---- begin A: the query chunks ---- */
// Query chunk qc: its statistics into `st`, then dQ to memory.
__device__ __forceinline__ void query_chunk(unsigned short *slots, const RowStats &st,
                                            const Tile &t, int qc, const unsigned short *q,
                                            const unsigned short *k, const unsigned short *v,
                                            const unsigned short *dout, unsigned short *dq,
                                            long long row_stride) {
  const unsigned q_s = smem_addr(slots), do_s = smem_addr(slots + kChunkElems);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int row0 = 16 * warp;                          // this warp's rows of the chunk
  const int r_lo = qc * kChunk + row0 + g, r_hi = r_lo + 8;  // rows of the block
@if CAUSAL@
  const int last_kc = qc;  // keys after the chunk's last query are never seen
@else@
  const int last_kc = (t.rows - 1) / kChunk;
@endif@

  // Q and dO stay in slots 0, 1; K and V stream, key chunk kc at step kc
  // of sweep 1 and step key_chunks + kc of sweep 2.
  const int key_chunks = last_kc + 1;
  start_chunk<@ROTATE_Q@>(slots, q, dout, qc * kChunk, k, v, 0, row_stride, t);
@if ROTATE_Q@
  rotate_copied(slots, nullptr, t, qc * kChunk); // Q; the ring's first barrier publishes it
@endif@
  float s[kKeyTiles][4], dp[kKeyTiles][4];

  // Sweep 1: maximum, sum and D = rowsum(P (.) dP) of each row, with the
  // sum and D rescaled whenever the maximum grows. Every row sees key 0
  // in the first chunk, so the maximum is finite from there on.
  float m_lo = neg_inf(), m_hi = neg_inf(), l_lo = 0.f, l_hi = 0.f, a_lo = 0.f, a_hi = 0.f;
#pragma unroll 1
  for (int kc = 0; kc < key_chunks; kc++) {
    // the step after the last is sweep 2's first: key chunk 0 again
    ring_wait(slots, kc, k, v, row_stride, t, kc + 1 < key_chunks ? (kc + 1) * kChunk : 0);
@if ROTATE_KEYS@
    rotate_keys(ring_slot(slots, kc), t, kc * kChunk);
@endif@
    __syncthreads();
    const unsigned k_s = smem_addr(ring_slot(slots, kc)), v_s = k_s + 2 * kChunkElems;
    rows_times_rows(s, q_s, k_s, 0, row0);
    rows_times_rows(dp, do_s, v_s, 0, row0);
    float x_lo = neg_inf(), x_hi = neg_inf();
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = kc * kChunk + 8 * n + 2 * tq + (e & 1);
        s[n][e] = visible(e < 2 ? r_lo : r_hi, col, t.rows) ? s[n][e] * kScaleLog2 : neg_inf();
        if (e < 2) x_lo = fmaxf(x_lo, s[n][e]);
        else x_hi = fmaxf(x_hi, s[n][e]);
      }
#pragma unroll
    for (int d = 1; d < 4; d <<= 1) {
      x_lo = fmaxf(x_lo, __shfl_xor_sync(0xffffffffu, x_lo, d));
      x_hi = fmaxf(x_hi, __shfl_xor_sync(0xffffffffu, x_hi, d));
    }
    const float n_lo = fmaxf(m_lo, x_lo), n_hi = fmaxf(m_hi, x_hi);
    const float c_lo = fast_exp2(m_lo - n_lo), c_hi = fast_exp2(m_hi - n_hi);  // 0 at first
    l_lo *= c_lo;
    a_lo *= c_lo;
    l_hi *= c_hi;
    a_hi *= c_hi;
    m_lo = n_lo;
    m_hi = n_hi;
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float p = fast_exp2(s[n][e] - (e < 2 ? m_lo : m_hi));
        if (e < 2) { l_lo += p; a_lo += p * dp[n][e]; }
        else { l_hi += p; a_hi += p * dp[n][e]; }
      }
  }
#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, d);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, d);
    a_lo += __shfl_xor_sync(0xffffffffu, a_lo, d);
    a_hi += __shfl_xor_sync(0xffffffffu, a_hi, d);
  }
  const float inv_lo = 1.f / l_lo, inv_hi = 1.f / l_hi;
  const float d_lo = a_lo * inv_lo, d_hi = a_hi * inv_hi;
  if (tq == 0) {
    st.max_log2[r_lo] = m_lo;
    st.inv_sum[r_lo] = inv_lo;
    st.d[r_lo] = d_lo;
    st.max_log2[r_hi] = m_hi;
    st.inv_sum[r_hi] = inv_hi;
    st.d[r_hi] = d_hi;
  }

  // Sweep 2: P and dS again, and dQ = dS K.
  float acc[kDimTiles][4];
  clear(acc);
  const float sd_lo = kDsScale * d_lo, sd_hi = kDsScale * d_hi;
#pragma unroll 1
  for (int kc = 0; kc < key_chunks; kc++) {
    const int i = key_chunks + kc;
    ring_wait(slots, i, k, v, row_stride, t, kc + 1 < key_chunks ? (kc + 1) * kChunk : -1);
@if ROTATE_KEYS@
    rotate_keys(ring_slot(slots, i), t, kc * kChunk); // loaded again: rotated again
@endif@
    __syncthreads();
    const unsigned k_s = smem_addr(ring_slot(slots, i)), v_s = k_s + 2 * kChunkElems;
    rows_times_rows(s, q_s, k_s, 0, row0);
    rows_times_rows(dp, do_s, v_s, 0, row0);
    unsigned ds[kKeyTiles][2];
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++) {
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int col = kc * kChunk + 8 * n + 2 * tq + (e & 1);
        const bool lo = e < 2;
        const float p = visible(lo ? r_lo : r_hi, col, t.rows)
                            ? fast_exp2(fmaf(s[n][e], kScaleLog2, -(lo ? m_lo : m_hi))) *
                                  (lo ? inv_lo : inv_hi)
                            : 0.f;
        x[e] = p * fmaf(dp[n][e], kDsScale, -(lo ? sd_lo : sd_hi));
      }
      ds[n][0] = pack2(x[0], x[1]);
      ds[n][1] = pack2(x[2], x[3]);
    }
    accumulate(acc, ds, k_s);
  }
@if ROTATE_Q@
  unrotate_rows(acc, slots, t, qc * kChunk + row0);
@endif@
  store_rows(acc, kStoreScale, row0, t.rows - qc * kChunk,
             dq + (t.token0 + qc * kChunk) * row_stride + (long long)t.head0 * kHeadDim,
             row_stride);
}
/* ---- end A ---- */

/* ---- begin B: the key chunks ---- */
// Key chunk kc: dV and dK of its rows to memory, from the statistics of
// every query row.
__device__ __forceinline__ void key_chunk(unsigned short *slots, const RowStats &st,
                                          const Tile &t, int kc, const unsigned short *q,
                                          const unsigned short *k, const unsigned short *v,
                                          const unsigned short *dout, unsigned short *dk,
                                          unsigned short *dv, long long row_stride) {
  const unsigned k_s = smem_addr(slots), v_s = smem_addr(slots + kChunkElems);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int row0 = 16 * warp;                          // this warp's rows of the chunk
  const int r_lo = kc * kChunk + row0 + g, r_hi = r_lo + 8;  // key rows of the block
@if CAUSAL@
  const int first_qc = kc;  // queries before the chunk's first key never see it
@else@
  const int first_qc = 0;
@endif@

  // K and V stay in slots 0, 1; Q and dO stream, query chunk first_qc + i
  // at step i.
  start_chunk<@ROTATE_KEYS@>(slots, k, v, kc * kChunk, q, dout, first_qc * kChunk, row_stride,
                             t);
@if ROTATE_KEYS@
  rotate_keys(slots, t, kc * kChunk); // the ring's first barrier publishes them
@endif@
  float acc_v[kDimTiles][4], acc_k[kDimTiles][4];
  clear(acc_v);
  clear(acc_k);
#pragma unroll 1
  for (int qc = first_qc; qc * kChunk < t.rows; qc++) {
    const int i = qc - first_qc, r_next = (qc + 1) * kChunk;
    ring_wait(slots, i, q, dout, row_stride, t, r_next < t.rows ? r_next : -1);
@if ROTATE_Q@
    rotate_copied(ring_slot(slots, i), nullptr, t, qc * kChunk); // Q, for every key chunk
@endif@
    __syncthreads();
    const unsigned q_s = smem_addr(ring_slot(slots, i)), do_s = q_s + 2 * kChunkElems;
    // S^T, then dP^T: this thread's rows are keys r_lo, r_hi, its columns
    // queries. Queries past the end have zero Q and dO: their dS and their
    // share of dV are zero, and their statistics (of zero rows) finite.
    // P^T is rounded before dS is formed from it, so that S^T is dead by
    // the time dP^T is computed.
    float s[kKeyTiles][4];
    rows_times_rows(s, k_s, q_s, 0, row0);
    unsigned p[kKeyTiles][2];
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++) {
      const int col = qc * kChunk + 8 * n + 2 * tq;
      const float2 m = *reinterpret_cast<const float2 *>(st.max_log2 + col);
      const float2 il = *reinterpret_cast<const float2 *>(st.inv_sum + col);
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const bool c1 = e & 1;
        x[e] = visible(col + c1, e < 2 ? r_lo : r_hi, t.rows)
                   ? fast_exp2(fmaf(s[n][e], kScaleLog2, -(c1 ? m.y : m.x))) * (c1 ? il.y : il.x)
                   : 0.f;
      }
      p[n][0] = pack2(x[0], x[1]);
      p[n][1] = pack2(x[2], x[3]);
    }
    accumulate(acc_v, p, do_s);
    float dp[kKeyTiles][4];
    rows_times_rows(dp, v_s, do_s, 0, row0);
    unsigned ds[kKeyTiles][2];
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++) {
      const float2 d = *reinterpret_cast<const float2 *>(st.d + qc * kChunk + 8 * n + 2 * tq);
      float p0, p1, p2, p3;
      unpack2(p[n][0], p0, p1);
      unpack2(p[n][1], p2, p3);
      ds[n][0] = pack2(p0 * kDsScale * (dp[n][0] - d.x), p1 * kDsScale * (dp[n][1] - d.y));
      ds[n][1] = pack2(p2 * kDsScale * (dp[n][2] - d.x), p3 * kDsScale * (dp[n][3] - d.y));
    }
    accumulate(acc_k, ds, q_s);
  }
  const long long at = (t.token0 + kc * kChunk) * row_stride + (long long)t.head0 * kHeadDim;
@if ROTATE_V@
  unrotate_rows(acc_v, slots, t, kc * kChunk + row0);
@endif@
  store_rows(acc_v, 1.f, row0, t.rows - kc * kChunk, dv + at, row_stride);
@if ROTATE_K@
  unrotate_rows(acc_k, slots, t, kc * kChunk + row0);
@endif@
  store_rows(acc_k, kStoreScale, row0, t.rows - kc * kChunk, dk + at, row_stride);
}
/* ---- end B ---- */

/* ---- begin kernel ----
 * Every CTA walks its own contiguous range of (block, head) items (the
 * launcher sizes the grid): A over the block's query chunks, then B over
 * its key chunks. */
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@(@PARAMS@) {
  const long long row_stride = (long long)heads * kHeadDim;
  float *const stats = reinterpret_cast<float *>(smem + kSlots * kChunkElems);
  const RowStats st = {stats, stats + kStatRows, stats + 2 * kStatRows};

  Walk w;
  walk_begin(w, offsets, batch, heads, total_tokens, num_items);
  for (Tile t = walk_take(w); t.rows; t = walk_take(w)) {
@if ROTARY_TABLE@
    t.table = rotary_table + t.token0 * kHeadDim;
@endif@
    // A's last statistics are read by every warp in B: the barrier at the
    // top of each chunk orders them.
#pragma unroll 1
    for (int qc = 0; qc * kChunk < t.rows; qc++)
      query_chunk(smem, st, t, qc, q, k, v, dout, dq, row_stride);
#pragma unroll 1
    for (int kc = 0; kc * kChunk < t.rows; kc++)
      key_chunk(smem, st, t, kc, q, k, v, dout, dk, dv, row_stride);
  }
}
/* ---- end kernel ---- */
@if IN_NAMESPACE@

}  // namespace bwd
@endif@
