@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_fwd_span.cuh: what the query tile of a jagged forward CTA sees,
@# shared by jagged_fwd.cu and jagged_fwd_sm90.cu: its sequence's keys, its
@# real rows, its strides and key head, and the key tiles of the band.
@# Needs the includer's kHeadDim, kBlockM, kBlockN, kHasLeft, kHasRight, kLeft, kRight, kBroadcast and
@# jagged_walk.cuh. No placeholders, no conditions.
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
  long long q_row0;      // the tile's first row in Q (a broadcast Q's rows are every sequence's)
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
  t.q_row0 = (kBroadcast ? 0 : jt.start) + t.m0;
  return t;
}
/* ---- end query tile span ---- */
