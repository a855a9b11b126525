@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_walk.cuh: the device half of the jagged walk: which sequence and
@# which of its row tiles a CTA's virtual tile number names. Shared by the
@# jagged forward and backward kernels; broadcast_tile is the broadcast-Q
@# forward's (one dense Q shared by every sequence). No placeholders, no conditions; the
@# tile size is the template parameter kTileRows of each function (the
@# includer passes its own), and it needs nothing from the includer.
/* ---- begin jagged walk ----
 * Virtual tile numbers need no prefix sum over tile counts: sequence i,
 * whose rows start at s_i = offs[i], numbers its row tiles from
 * i + floor(s_i / kTileRows). Those numbers increase with i and leave at
 * most one unused number per sequence, so there are
 *   batch + floor(total / kTileRows)
 * virtual tiles, known on the host from batch and total alone; a CTA whose
 * number is unused exits. Offsets are clamped to [0, total] (and each end
 * to at least its start) as read, so malformed offsets can never send a
 * load or store out of bounds.
 * jagged_find is called by every lane of a warp (all 32 take part in the
 * search and all get the same answer); each warp may search on its own. */
struct JaggedTile {
  long long seq;      // sequence index
  long long start;    // its first row (clamped offs[seq])
  long long len;      // its rows
  long long tile;     // this tile's index in the sequence: rows tile*kTileRows..
  int raw_start_b, raw_end_b; // offs_b[seq], offs_b[seq + 1] as read (second offsets)
  bool valid;         // false: unused virtual number, nothing to do
};

__device__ __forceinline__ long long jagged_clamp(long long x, long long lo, long long total) {
  return x < lo ? lo : (x > total ? total : x);
}

// Find the sequence of virtual tile vt over offsets offs [batch + 1] of
// `total` rows; also reads offs_b[seq], offs_b[seq + 1] (the other side's
// offsets, e.g. cu_seqlens_k; may equal offs) in the same round of loads.
template <int kTileRows>
__device__ __forceinline__ JaggedTile jagged_find(const int *offs, const int *offs_b,
                                                  long long batch, long long total,
                                                  long long vt) {
  JaggedTile t;
  t.valid = false;
  t.seq = 0; t.start = 0; t.len = 0; t.tile = 0; t.raw_start_b = 0; t.raw_end_b = 0;
  if (batch <= 0) return t;
  const int lane = threadIdx.x & 31;
  // The last sequence c with c + floor(offs[c] / kTileRows) <= vt. Were all
  // sequences of one length it would be about vt * batch / span: the 32
  // lanes test the 32 sequences around that guess with one load each (and
  // read the second offsets beside them). The test passes for a prefix of
  // the sequences (non-decreasing offsets), so the window holds the answer
  // when its first lane passes (or it starts at 0) and its last fails (or
  // it reaches the last sequence). Otherwise a 32-way search (3 rounds for
  // 1152 sequences); with malformed offsets it still ends in range.
  const long long span = batch + total / kTileRows;
  long long lo = vt * batch / span - 15;
  if (lo > batch - 32) lo = batch - 32;
  if (lo < 0) lo = 0;
  const long long c = lo + lane;
  const int raw = c <= batch ? __ldg(offs + c) : 0;
  const int raw_b = c <= batch ? __ldg(offs_b + c) : 0;
  const bool pass = c < batch && c + jagged_clamp(raw, 0, total) / kTileRows <= vt;
  unsigned ballot = __ballot_sync(0xffffffffu, pass);
  if (!ballot && lo == 0) return t; // below sequence 0's first tile
  int last = ballot ? 31 - __clz(ballot) : 0;
  int raw_start = __shfl_sync(0xffffffffu, raw, last);
  int raw_end = __shfl_sync(0xffffffffu, raw, last < 31 ? last + 1 : 31);
  t.raw_start_b = __shfl_sync(0xffffffffu, raw_b, last);
  t.raw_end_b = __shfl_sync(0xffffffffu, raw_b, last < 31 ? last + 1 : 31);
  if ((ballot & 1) && (!(ballot >> 31) || lo + 31 >= batch - 1)) {
    lo += last;
    if (last == 31) {
      raw_end = __ldg(offs + lo + 1);
      t.raw_end_b = __ldg(offs_b + lo + 1);
    }
  } else {
    long long hi = batch - 1;
    lo = 0;
    while (lo < hi) {
      const long long step = (hi - lo + 32) / 32; // candidates lo + step * lane
      const long long cand = lo + step * lane;
      bool ok = false;
      if (cand <= hi) ok = cand + jagged_clamp(__ldg(offs + cand), 0, total) / kTileRows <= vt;
      ballot = __ballot_sync(0xffffffffu, ok);
      if (!ballot) return t; // only when sequence 0 fails: below its first tile
      last = 31 - __clz(ballot);
      lo += step * last;
      hi = min(hi, lo + step - 1);
    }
    raw_start = __ldg(offs + lo);
    raw_end = __ldg(offs + lo + 1);
    t.raw_start_b = __ldg(offs_b + lo);
    t.raw_end_b = __ldg(offs_b + lo + 1);
  }
  const long long s = jagged_clamp(raw_start, 0, total);
  const long long e = jagged_clamp(raw_end, s, total);
  t.seq = lo;
  t.start = s;
  t.len = e - s;
  t.tile = vt - (lo + s / kTileRows);
  t.valid = t.tile >= 0 && t.tile * kTileRows < t.len;
  return t;
}

// The broadcast walk: every sequence has the same n_q = total / batch
// query rows (one dense Q), so virtual tile vt is query tile vt % q_tiles
// of sequence vt / q_tiles, with no search; its rows in the output start
// at seq * n_q. Reads only the second offsets (cu_seqlens_k).
template <int kTileRows>
__device__ __forceinline__ JaggedTile broadcast_tile(const int *offs_b, long long batch,
                                                     long long total, long long vt) {
  JaggedTile t;
  t.valid = false;
  t.seq = 0; t.start = 0; t.len = 0; t.tile = 0; t.raw_start_b = 0; t.raw_end_b = 0;
  if (batch <= 0 || vt < 0) return t;
  // batch, total and vt are below 2^31 (the launcher's checks): 32-bit division
  const unsigned n_q = (unsigned)total / (unsigned)batch;
  const unsigned q_tiles = (n_q + kTileRows - 1) / kTileRows;
  if (q_tiles == 0 || vt >= batch * (long long)q_tiles) return t;
  const unsigned seq = (unsigned)vt / q_tiles;
  t.seq = seq;
  t.tile = (unsigned)vt - seq * q_tiles;
  t.start = (long long)seq * n_q;
  t.len = n_q;
  t.raw_start_b = __ldg(offs_b + t.seq);
  t.raw_end_b = __ldg(offs_b + t.seq + 1);
  t.valid = true;
  return t;
}
/* ---- end jagged walk ---- */
