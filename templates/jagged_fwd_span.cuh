@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_fwd_span.cuh: what the query tile of a jagged forward CTA sees,
@# shared by the three jagged forwards: its sequence's keys, its
@# real rows, its strides and key head, the key tiles of the band and its
@# rows' offsets; and which query tile a CTA (or a CTA's item) computes.
@# Needs the includer's kHeadDim, kBlockM, kBlockN, kHasLeft, kHasRight, kLeft,
@# kRight, kBroadcast and jagged_walk.cuh. No placeholders, no conditions.
/* ---- begin query tile span ---- */
struct QuerySpan {
  long long k_start;     // the sequence's first key
  long long lk;          // its keys
  long long m0;          // the tile's first query row, in its sequence
  int rows;              // the tile's real query rows
  int kvh;               // the key head of query head h
  long long q_stride, kv_stride;  // elements between rows of Q (O) and of K (V)
  long long shift;       // query i's diagonal key is i + shift (Lk - Lq)
  int n_first, n_tiles;  // the key tiles of kBlockN any real row sees: n_first..
  // element offsets of the tile's first rows: head h's of Q (a broadcast
  // Q's rows are every sequence's) and of O, key head kvh's of the
  // sequence's K (V)
  long long q_at, o_at, kv_at;
};

__device__ __forceinline__ QuerySpan query_span(const JaggedTile &jt, long long total_k, int h,
                                                int heads, int kv_heads) {
  QuerySpan t;
  t.k_start = jagged_clamp(jt.raw_start_b, 0, total_k);
  t.lk = jagged_clamp(jt.raw_end_b, t.k_start, total_k) - t.k_start;
  const long long lq = jt.len;
  t.m0 = jt.tile * kBlockM;
  t.rows = (int)(lq - t.m0 < kBlockM ? lq - t.m0 : kBlockM);
  t.kvh = h / (heads / kv_heads);
  t.q_stride = (long long)heads * kHeadDim;
  t.kv_stride = (long long)kv_heads * kHeadDim;
  t.shift = t.lk - lq;
  // Keys any real row of the tile sees: [key_lo, key_hi).
  long long key_lo = 0, key_hi = t.lk;
  if constexpr (kHasLeft) key_lo = max(0ll, t.m0 + t.shift - kLeft);
  if constexpr (kHasRight) key_hi = min(t.lk, t.m0 + t.rows - 1 + t.shift + kRight + 1);
  t.n_first = (int)(key_lo / kBlockN);
  t.n_tiles = key_hi > key_lo ? (int)((key_hi - 1) / kBlockN) - t.n_first + 1 : 0;
  t.q_at = ((kBroadcast ? 0 : jt.start) + t.m0) * t.q_stride + (long long)h * kHeadDim;
  t.o_at = (jt.start + t.m0) * t.q_stride + (long long)h * kHeadDim;
  t.kv_at = t.k_start * t.kv_stride + (long long)t.kvh * kHeadDim;
  return t;
}

// Query tile `item` of the walk: virtual tile num_tiles - 1 - item, so
// that the tiles are taken in reverse and a sequence's last q tile (the
// most keys under a causal mask) starts first.
__device__ __forceinline__ JaggedTile query_tile_at(const int *cu_seqlens_q,
                                                    const int *cu_seqlens_k, long long batch,
                                                    long long total_q, long long num_tiles,
                                                    long long item) {
  const long long vt = num_tiles - 1 - item;
  return kBroadcast ? broadcast_tile<kBlockM>(cu_seqlens_k, batch, total_q, vt)
                    : jagged_find<kBlockM>(cu_seqlens_q, cu_seqlens_k, batch, total_q, vt);
}

// The query tile of a CTA that computes one: item blockIdx.x (written
// out: through query_tile_at, ptxas allocated the rotary kernels'
// registers otherwise).
__device__ __forceinline__ JaggedTile cta_query_tile(const int *cu_seqlens_q,
                                                     const int *cu_seqlens_k, long long batch,
                                                     long long total_q, long long num_tiles) {
  const long long vt = num_tiles - 1 - (long long)blockIdx.x;
  return kBroadcast ? broadcast_tile<kBlockM>(cu_seqlens_k, batch, total_q, vt)
                    : jagged_find<kBlockM>(cu_seqlens_q, cu_seqlens_k, batch, total_q, vt);
}
/* ---- end query tile span ---- */
