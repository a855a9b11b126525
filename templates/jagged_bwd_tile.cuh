@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_tile.cuh: the pieces the jagged and broadcast backwards share:
@# which sequence and tile a CTA owns (the key-tile walks' KeyTile and
@# QueryStep), the band of keys a query sees, the swizzled tile layout and
@# its 16-byte async load (copy_rows.cuh), the rotary tables' pointers
@# (RotaryTables), the row statistics and
@# the softmax gradients; with the two mma.sync products (rows_mma.cuh:
@# rows times rows; rows_accumulate.cuh: a register operand times a tile)
@# and the row stores (store_rows.cuh); for the one-pass broadcast
@# backwards a slab's sequences (slab_start, slab_sequence).
@# Needs: kHeadDim, kBlockM, kBlockN, kThreads, kHasLeft, kHasRight,
@#   kWindowLeft, kRight, kBroadcast, kLog2e, kScaleLog2, fast_exp2(), pack2(), neg_inf(),
@#   unpack2(),
@#   smem_addr(), copy_rows(), ldmatrix_x4(), ldmatrix_x4_trans(),
@#   mma_16816(). No placeholders, no conditions.
/* ---- begin jagged tiles ----
 * Sequence i of a jagged tensor of `total` tokens starts at token
 * offsets[i] and numbers its tiles of kTile tokens from the "virtual"
 * number i + offsets[i] / kTile (as block_walk.cuh numbers blocks): the
 * numbers increase with i and leave at most one unused number per sequence,
 * so batch + total / kTile numbers cover every tile, known on the host
 * without reading the offsets. A CTA takes one number, finds its sequence
 * with a 32-way warp search over the offsets (every warp searches on its
 * own, so no barrier is needed) and leaves if the number is unused. */

// An offset clamped to [lo, total], so that malformed offsets can never
// send a load or store out of bounds.
__device__ __forceinline__ long long clamp_offset(long long x, long long lo, long long total) {
  return x < lo ? lo : (x > total ? total : x);
}

// The last sequence c in [0, batch) with c + offsets[c] / tile <= vt (the
// answer for sorted offsets; some sequence in range for any offsets). Each
// round tests 32 evenly spaced candidates, so 1152 sequences take 3 rounds.
// Warp-uniform: every lane returns the same.
__device__ __forceinline__ long long find_sequence(const int *offsets, long long batch,
                                                   long long total, long long vt, int tile) {
  const int lane = threadIdx.x & 31;
  long long lo = 0, hi = batch - 1;
  while (lo < hi) {
    const long long step = (hi - lo + 32) / 32;  // candidates lo + step * lane
    const long long cand = lo + step * lane;
    bool ok = false;
    if (cand <= hi) ok = cand + clamp_offset(__ldg(offsets + cand), 0, total) / tile <= vt;
    const unsigned ballot = __ballot_sync(0xffffffffu, ok);
    const int last = ballot ? 31 - __clz(ballot) : 0;
    lo += step * last;
    hi = min(hi, lo + step - 1);
  }
  return lo;
}

// The rotary tables of the queries and the keys (positions from tables;
// both null otherwise).
struct RotaryTables {
  const unsigned short *q, *k;
};

// One sequence's tokens in both tensors, clamped. A broadcast Q (one
// dense Q of n_q = total_q / batch rows shared by every sequence) has its
// rows at 0 in Q and dQ, and at seq * n_q in O, dO, lse and D.
struct SeqSpan {
  long long q_start, k_start;  // first token in O, dO, lse, D and in K (V, dK, dV)
  long long q_src;             // first row in Q (dQ): q_start, or 0 for a broadcast Q
  long long q_len, k_len;      // tokens: Lq, Lk
};

__device__ __forceinline__ SeqSpan seq_span(const int *cu_q, const int *cu_k, long long seq,
                                            long long batch, long long total_q,
                                            long long total_k) {
  SeqSpan s;
  if constexpr (kBroadcast) {
    s.q_len = total_q / batch;
    s.q_start = seq * s.q_len;
    s.q_src = 0;
  } else {
    s.q_start = clamp_offset(__ldg(cu_q + seq), 0, total_q);
    s.q_len = clamp_offset(__ldg(cu_q + seq + 1), s.q_start, total_q) - s.q_start;
    s.q_src = s.q_start;
  }
  s.k_start = clamp_offset(__ldg(cu_k + seq), 0, total_k);
  s.k_len = clamp_offset(__ldg(cu_k + seq + 1), s.k_start, total_k) - s.k_start;
  return s;
}

// A broadcast Q's dQ is the sum over the batch: _dq cuts the batch into
// `slabs` runs of consecutive sequences of about equal work (keys, plus
// kSeqCost a sequence for its own loads) and writes one fp32 partial per
// slab, which _dq_sum adds in slab order. Slab c starts at the first
// sequence b with (offsets[b] + kSeqCost * b) * slabs >= c * W, W the
// whole batch's work; slab `slabs` starts at batch. A 32-way warp search,
// warp-uniform; any offsets give a start in [0, batch].
constexpr long long kSeqCost = 64;
// The slabs' dQ partials follow D ([heads, total_q] floats) in the
// workspace, 16-byte aligned: [slabs, n_q, heads, kHeadDim] fp32.
__host__ __device__ constexpr long long broadcast_partials_at(long long heads, long long total_q) {
  return (heads * total_q + 3) / 4 * 4;
}
__device__ __forceinline__ long long slab_start(const int *cu_k, long long batch,
                                                long long total_k, long long c, long long slabs) {
  if (c <= 0) return 0;
  if (c >= slabs) return batch;
  const long long goal = c * (total_k + kSeqCost * batch);
  const int lane = threadIdx.x & 31;
  long long lo = 0, hi = batch;  // sequence lo is before the start (it holds for 0)
  while (lo < hi) {
    const long long step = (hi - lo + 32) / 32;  // candidates lo + step * lane
    const long long cand = lo + step * lane;
    bool before = false;
    if (cand <= hi)
      before = (clamp_offset(__ldg(cu_k + cand), 0, total_k) + kSeqCost * cand) * slabs < goal;
    const unsigned ballot = __ballot_sync(0xffffffffu, before);
    const int last = ballot ? 31 - __clz(ballot) : 0;
    lo += step * last;
    hi = min(hi, lo + step - 1);
  }
  return lo + 1 < batch ? lo + 1 : batch;
}

/* The band: query i (of Lq) sees key j (of Lk) iff 0 <= j < Lk and
 *   j - i - (Lk - Lq) in [-kWindowLeft, kRight]
 * each side only where it is bounded (kHasLeft, kHasRight): causal is
 * bottom-right aligned. Inside a tile pair (queries q0.., keys k0..) the
 * test is on x = (key row) - (query row) of the tiles against bounds made
 * small ints (tiles are far shorter than the clamp). */
struct Band {
  int lo, hi;  // x in [lo, hi] is visible
};

__device__ __forceinline__ Band tile_band(long long q0, long long k0, long long delta) {
  const long long base = k0 - q0 - delta;  // j - i - delta = x + base
  long long lo = kHasLeft ? -(long long)kWindowLeft - base : -4096;
  long long hi = kHasRight ? (long long)kRight - base : 4096;
  lo = lo < -4096 ? -4096 : (lo > 4096 ? 4096 : lo);
  hi = hi < -4096 ? -4096 : (hi > 4096 ? 4096 : hi);
  Band b;
  b.lo = (int)lo;
  b.hi = (int)hi;
  return b;
}

// Keys [*first, *last] some query of [i0, i1] (0 <= i0 <= i1 < Lq) sees;
// none if *last < *first.
__device__ __forceinline__ void keys_seen(long long i0, long long i1, long long lq, long long lk,
                                          long long &first, long long &last) {
  const long long delta = lk - lq;
  first = kHasLeft ? i0 + delta - kWindowLeft : 0;
  last = kHasRight ? i1 + delta + kRight : lk - 1;
  if (first < 0) first = 0;
  if (last > lk - 1) last = lk - 1;
}

// Queries [*first, *last] that see some key of [j0, j1] (0 <= j0 <= j1 < Lk).
__device__ __forceinline__ void queries_seeing(long long j0, long long j1, long long lq,
                                               long long lk, long long &first, long long &last) {
  const long long delta = lk - lq;
  first = kHasRight ? j0 - delta - kRight : 0;
  last = kHasLeft ? j1 - delta + kWindowLeft : lq - 1;
  if (first < 0) first = 0;
  if (last > lq - 1) last = lq - 1;
}

// Key tile vt of the key-tile walks (jagged_bwd.cu's _dkv, the sm_90a _kv
// kernels) for key head hk, group query heads a key head: its sequence, its
// keys k0.. (nk real; none where `used` is false, an unused number), K's
// (V's, dK's, dV's) element offset of its first row, and the steps that
// reach it: step i is query head hk * group + i / q_tiles, query tile qt0 +
// i % q_tiles (query_step).
struct KeyTile {
  bool used;
  SeqSpan sp;
  long long k0, qt0, k_row;
  int nk, q_tiles, n_steps;
};
__device__ __forceinline__ KeyTile key_tile(const int *cu_seqlens_q, const int *cu_seqlens_k,
                                            long long batch, long long total_q,
                                            long long total_k, long long vt, int hk, int group,
                                            long long k_stride) {
  KeyTile t;
  const long long seq = find_sequence(cu_seqlens_k, batch, total_k, vt, kBlockN);
  t.sp = seq_span(cu_seqlens_q, cu_seqlens_k, seq, batch, total_q, total_k);
  const long long tile = vt - (seq + t.sp.k_start / kBlockN);
  t.used = tile >= 0 && tile * kBlockN < t.sp.k_len;  // else an unused number
  t.k0 = tile * kBlockN;
  t.nk = t.used ? (int)min((long long)kBlockN, t.sp.k_len - t.k0) : 0;
  long long i_first = 0, i_last = -1;
  if (t.used) queries_seeing(t.k0, t.k0 + t.nk - 1, t.sp.q_len, t.sp.k_len, i_first, i_last);
  t.qt0 = i_first / kBlockM;
  t.q_tiles = i_last < i_first ? 0 : (int)(i_last / kBlockM - t.qt0 + 1);
  t.n_steps = t.q_tiles * group;
  t.k_row = (t.sp.k_start + t.k0) * k_stride + (long long)hk * kHeadDim;
  return t;
}

// Step i of key tile kt: its query head h, its query tile's first row i0
// in the sequence and real rows mq, and head h's element offsets of the
// tile's first row of dO and O (at) and of Q (q_at: a broadcast Q's rows
// are every sequence's), rows q_stride apart.
struct QueryStep {
  int h, mq;
  long long i0, at, q_at;
};
__device__ __forceinline__ QueryStep query_step(const KeyTile &kt, int i, int hk, int group,
                                                long long q_stride) {
  QueryStep st;
  st.h = hk * group + i / kt.q_tiles;
  st.i0 = (kt.qt0 + i % kt.q_tiles) * kBlockM;
  st.mq = (int)min((long long)kBlockM, kt.sp.q_len - st.i0);
  st.at = (kt.sp.q_start + st.i0) * q_stride + (long long)st.h * kHeadDim;
  st.q_at = st.at - (kt.sp.q_start - kt.sp.q_src) * q_stride;
  return st;
}

/* Tiles are row-major [rows][kHeadDim] with 16-byte pieces XOR-swizzled by
 * the row (piece c of row r sits at c ^ (r % 8)), so the 8 row addresses of
 * an ldmatrix hit 8 different bank groups. Rows past the sequence end are
 * zero-filled, never read from memory. */
constexpr int kPieces = kHeadDim / 8;  // 16-byte pieces per row

__device__ __forceinline__ int swizzle(int row, int piece) {
  return row * kHeadDim + ((piece ^ (row & 7)) * 8);
}

// Start the copy of kRows rows of one head (`src` is row 0 of the tile, this
// head) into `tile`, the first `rows` real; the caller commits.
template <int kRows>
__device__ __forceinline__ void load_tile(unsigned short *tile, const unsigned short *src,
                                          long long row_stride, int rows) {
  copy_rows<kRows, kPieces, kThreads>(smem_addr(tile), src, row_stride, rows,
                                      [](int row, int c) { return 2u * swizzle(row, c); });
}

// Copy 4 bytes global -> shared (zero-filled where src_bytes == 0).
__device__ __forceinline__ void cp_async_4(unsigned dst, const void *src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
               :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// The key tiles (of kBlockN) that the queries [0, mq) of a broadcast
// sequence see: n_steps of them from tile kt0 (none: 0).
struct SeenTiles {
  long long kt0;
  int n_steps;
};
__device__ __forceinline__ SeenTiles seen_key_tiles(const SeqSpan &sp, int mq) {
  long long j_first, j_last;
  keys_seen(0, mq - 1, sp.q_len, sp.k_len, j_first, j_last);
  SeenTiles t;
  t.kt0 = j_first / kBlockN;
  t.n_steps = j_last < j_first ? 0 : (int)(j_last / kBlockN - t.kt0 + 1);
  return t;
}

// Zero the rows of one head of dK and dV (row stride row_stride) of the
// keys outside those tiles: no query sees them. By the first kZeroThreads
// threads, 16 bytes each at a time.
template <int kZeroThreads>
__device__ __forceinline__ void zero_unseen_keys(unsigned short *dk, unsigned short *dv,
                                                 long long k_len, SeenTiles t,
                                                 long long row_stride) {
  auto zero = [&](long long r0, long long r1) {
    for (long long i = threadIdx.x; i < (r1 - r0) * kPieces; i += kZeroThreads) {
      const long long at = (r0 + i / kPieces) * row_stride + (i % kPieces) * 8;
      *reinterpret_cast<uint4 *>(dk + at) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4 *>(dv + at) = make_uint4(0, 0, 0, 0);
    }
  };
  zero(0, t.n_steps ? t.kt0 * kBlockN : k_len);
  if (t.n_steps) zero(min(k_len, (t.kt0 + t.n_steps) * kBlockN), k_len);
}

// Sequence b of a slab as head h's CTA of a one-pass broadcast backward
// walks it: its span, the key tiles its queries [0, mq) see, and where
// head h's rows start (every tensor's rows `stride` elements apart); the
// first kZeroThreads threads also zero the gradients of the keys no query
// sees (zero_unseen_keys).
struct SlabSequence : SeqSpan {
  long long delta;              // k_len - q_len: where the causal diagonal lies
  long long kt0;                // the first key tile seen
  int n_steps;                  // key tiles seen (0: none)
  long long o_row;              // head h's first row of O and dO
  const unsigned short *k, *v;  // head h's key 0 in K and V
  unsigned short *dk, *dv;      // and in dK and dV
};
template <int kZeroThreads>
__device__ __forceinline__ SlabSequence slab_sequence(
    const int *cu_q, const int *cu_k, long long b, long long batch, long long total_q,
    long long total_k, int mq, int h, long long stride, const unsigned short *k,
    const unsigned short *v, unsigned short *dk, unsigned short *dv) {
  SlabSequence s;
  static_cast<SeqSpan &>(s) = seq_span(cu_q, cu_k, b, batch, total_q, total_k);
  s.delta = s.k_len - s.q_len;
  const SeenTiles seen = seen_key_tiles(s, mq);
  s.kt0 = seen.kt0;
  s.n_steps = seen.n_steps;
  s.o_row = s.q_start * stride + (long long)h * kHeadDim;
  const long long kv_at = s.k_start * stride + (long long)h * kHeadDim;
  s.k = k + kv_at;
  s.v = v + kv_at;
  s.dk = dk + kv_at;
  s.dv = dv + kv_at;
  zero_unseen_keys<kZeroThreads>(s.dk, s.dv, s.k_len, seen, stride);
  return s;
}

@include rows_mma.cuh@

@include rows_accumulate.cuh@

@include store_rows.cuh@

// a + the dot product of the 8 16-bit values at x and at y (16 bytes each,
// aligned; read through the read-only cache), pair by pair in order: a
// piece of a row of D = rowsum(dO (.) O) (also jagged_bwd_rows.cuh's _pre).
__device__ __forceinline__ float dot_pieces(const unsigned short *x_at, const unsigned short *y_at,
                                            float a) {
  const uint4 x = __ldg(reinterpret_cast<const uint4 *>(x_at));
  const uint4 y = __ldg(reinterpret_cast<const uint4 *>(y_at));
  const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int e = 0; e < 4; e++) {
    float x0, x1, y0, y1;
    unpack2(xs[e], x0, x1);
    unpack2(ys[e], y0, y1);
    a = fmaf(x0, y0, a);
    a = fmaf(x1, y1, a);
  }
  return a;
}

// D = rowsum(dO (.) O) of a warp's 16 query rows row0.. (of `rows` real;
// row r of O and dO at o_row + r * row_stride) from memory, kPieces lanes a
// row, one 16-byte piece of each; with each row's LSE * log2(e) (+inf for
// rows past the end or with no key, so that P = 0; their D is 0) into
// lse_s[r], di_s[r]. `di`, when not null, gets D at di[lse_at + r] (lse's
// index of row r). The warp's lanes read lse_s, di_s after a __syncwarp.
// kUnroll: passes (of 32 / kPieces rows) unrolled, their loads in flight
// together (a loading warpgroup short of registers takes 1).
template <int kUnroll = 16>
__device__ __forceinline__ void row_stats(const unsigned short *__restrict__ o,
    const unsigned short *__restrict__ dout, const float *__restrict__ lse,
    float *__restrict__ di, long long o_row, long long row_stride, long long lse_at, int rows,
    int row0, float *lse_s, float *di_s) {
  const int lane = threadIdx.x & 31;
  constexpr int kRowsPerPass = 32 / kPieces;
  const int piece = lane % kPieces;
#pragma unroll kUnroll
  for (int pass = 0; pass < 16 / kRowsPerPass; pass++) {
    const int r = row0 + pass * kRowsPerPass + lane / kPieces;
    float a = 0.f;
    if (r < rows) {
      const long long at = o_row + r * row_stride + piece * 8;
      a = dot_pieces(o + at, dout + at, a);
    }
#pragma unroll
    for (int d = 1; d < kPieces; d <<= 1) a += __shfl_xor_sync(0xffffffffu, a, d);
    if (piece == 0) {
      float l = __int_as_float(0x7f800000);  // +inf: P = 0
      if (r < rows) {
        const float x = lse[lse_at + r];
        if (x == neg_inf()) a = 0.f;  // no key: dQ = 0, D unused
        else l = x * kLog2e;
        if (di) di[lse_at + r] = a;
      } else {
        a = 0.f;
      }
      lse_s[r] = l;
      di_s[r] = a;
    }
  }
}

// P = exp(scale * S - LSE) and dS = P (.) (dP - D) of a warp's 16 query
// rows row0.. against a key tile (C layout, kNT n-tiles of 8 keys), as
// 16-bit pairs; P masked to 0 outside the band and past nk keys unless the
// tile is `full`. lse_lo/hi are LSE * log2(e) of rows g and g + 8, d_lo/hi
// their D. With kKeepP, P's pairs also go to p16.
template <int kNT, bool kKeepP>
__device__ __forceinline__ void probs_and_ds(const float (&s)[kNT][4], const float (&dp)[kNT][4],
    float lse_lo, float lse_hi, float d_lo, float d_hi, bool full, int nk, Band band, int row0,
    unsigned (&p16)[kNT][2], unsigned (&ds)[kNT][2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int n = 0; n < kNT; n++) {
    float p[4], x[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const bool lo = e < 2;
      const int col = 8 * n + 2 * tq + (e & 1), row = row0 + g + (lo ? 0 : 8);
      p[e] = fast_exp2(fmaf(s[n][e], kScaleLog2, -(lo ? lse_lo : lse_hi)));
      if (!full) {
        const int xd = col - row;
        if (col >= nk || xd < band.lo || xd > band.hi) p[e] = 0.f;
      }
      x[e] = p[e] * (dp[n][e] - (lo ? d_lo : d_hi));
    }
    if constexpr (kKeepP) {
      p16[n][0] = pack2(p[0], p[1]);
      p16[n][1] = pack2(p[2], p[3]);
    }
    ds[n][0] = pack2(x[0], x[1]);
    ds[n][1] = pack2(x[2], x[3]);
  }
}
/* ---- end jagged tiles ---- */
