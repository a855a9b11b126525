@# SPDX-License-Identifier: BSD-3-Clause
@# block_walk.cuh: the work walk of the block-diagonal kernels: which (block,
@# head group) items a CTA takes, where each item's rows live, and the ring
@# of tiles in flight the whole-block kernels fill from it. Shared by
@# block_fwd.cu, block_bwd.cu and block_bwd_chunked.cu; uses the including
@# kernel's kBlock and kHeadsPerTile and cp_async_commit() (mma_sm80.cuh).
@# No placeholders. Conditions: ROTARY_SEQUENCE (tiles carry the
@# position of their first token in its sequence); TABLE_IN_GLOBAL with
@# ROTARY_TABLE (tiles carry their block's rows of the rotary table, which the
@# chunked backward, and the whole-block one (bwd_table_global), read in
@# global memory: the kernel sets them).
/* ---- begin work walk ----
 * Work items are (block, head group) pairs; a head group is kHeadsPerTile
 * adjacent heads, whose rows are contiguous in memory. Blocks get "virtual" numbers that need
 * no prefix sum over block counts: sequence i, starting at token s_i, numbers
 * its blocks from i + floor(s_i / kBlock). Those numbers increase with i and
 * leave at most one unused number per sequence, so the item space has
 * (batch + floor(total_tokens / kBlock)) * head_groups entries, known on the host
 * without reading the offsets. Each CTA takes one contiguous range of items,
 * finds its first sequence from a guess checked with one round of 32 loads
 * (each warp on its own) and then walks forward, skipping unused numbers
 * and empty sequences for free.
 * The walk runs between tiles, where a load it waits on stalls the next
 * tile's copies, so the end of the sequence after the current one is always
 * already on its way (`next_end`). */
struct Walk {
  const int *offsets;
  long long batch, total_tokens, end; // end: one past this CTA's last item
  int num_heads, groups;              // heads, and head groups, per token
  long long seq;                      // current sequence
  long long seq_start, seq_len;       // its tokens
  long long base;                     // virtual number of its first block
  long long vblock;                   // current virtual block
  int raw_end;                        // offsets[seq + 1] as read
  int next_end;                       // offsets[seq + 2] as read, if seq + 2 <= batch
  int group;
  bool done;
};

// An offset clamped to [lo, total_tokens], so that malformed offsets can
// never send a load or store out of bounds.
__device__ __forceinline__ long long clamp_offset(const Walk &w, long long x, long long lo) {
  return x < lo ? lo : (x > w.total_tokens ? w.total_tokens : x);
}

// Make sequence i current, given offsets[i] and offsets[i + 1] as read,
// and start reading offsets[i + 2] for the step after.
__device__ __forceinline__ void enter_sequence(Walk &w, long long i, int raw_start, int raw_end) {
  const long long s = clamp_offset(w, raw_start, 0), e = clamp_offset(w, raw_end, s);
  w.seq = i;
  w.seq_start = s;
  w.seq_len = e - s;
  w.base = i + s / kBlock;
  w.raw_end = raw_end;
  w.next_end = i + 2 <= w.batch ? __ldg(w.offsets + i + 2) : 0;
}

// Move to the first valid item at or after (vblock, group), or be done
// once past this CTA's share: vblock only grows, so a CTA stops at its
// share's end, never walking on through the empty sequences after it (all
// the batch's, when its tail is empty).
__device__ __forceinline__ void settle(Walk &w) {
  while (w.vblock - w.base >= (w.seq_len + kBlock - 1) / kBlock) {
    if (w.seq + 1 >= w.batch) { w.done = true; return; }
    enter_sequence(w, w.seq + 1, w.raw_end, w.next_end);
    if (w.vblock < w.base) { w.vblock = w.base; w.group = 0; }
    if (w.vblock * w.groups + w.group >= w.end) { w.done = true; return; }
  }
  if (w.vblock * w.groups + w.group >= w.end) w.done = true;
}

// Start this CTA's walk: its share of the num_items items, split evenly
// by blockIdx.x (the launcher sizes the grid), and the first valid one.
// Called by every thread of the CTA (the search uses whole warps).
__device__ __forceinline__ void walk_begin(Walk &w, const int *offsets, long long batch,
                                           int heads, long long total_tokens,
                                           long long num_items) {
  w.offsets = offsets;
  w.batch = batch;
  w.total_tokens = total_tokens;
  w.num_heads = heads;
  w.groups = (heads + kHeadsPerTile - 1) / kHeadsPerTile;
  const long long first = num_items * blockIdx.x / gridDim.x;
  w.end = num_items * (blockIdx.x + 1) / gridDim.x;
  w.vblock = first / w.groups;
  w.group = (int)(first % w.groups);
  w.done = first >= w.end;
  if (w.done) return;
  // The last sequence whose first virtual block is <= vblock. Were all
  // sequences of one length, it would be vblock * batch / (batch +
  // total_tokens / kBlock); the 32 lanes test the 32 sequences around that
  // guess with one load each, and their offsets are those enter_sequence
  // needs. One round of loads, where a search takes three (a CTA's first
  // copies wait on it, and a new CTA starts every few tiles). The test
  // passes for a prefix of the sequences (non-decreasing offsets), so the
  // window holds the answer when its first lane passes (or it starts at 0)
  // and its last fails (or it ends at the last sequence).
  const int lane = threadIdx.x & 31;
  const long long span = w.batch + w.total_tokens / kBlock; // virtual blocks, >= batch
  long long lo = w.vblock * w.batch / span - 15;
  if (lo > w.batch - 32) lo = w.batch - 32;
  if (lo < 0) lo = 0;
  const long long c = lo + lane;
  const int raw = c <= w.batch ? __ldg(w.offsets + c) : 0;
  const bool pass = c < w.batch && c + clamp_offset(w, raw, 0) / kBlock <= w.vblock;
  unsigned ballot = __ballot_sync(0xffffffffu, pass);
  int last = ballot ? 31 - __clz(ballot) : 0;
  int raw_start = __shfl_sync(0xffffffffu, raw, last);
  int raw_end = __shfl_sync(0xffffffffu, raw, last < 31 ? last + 1 : 31);
  if (((ballot & 1) || lo == 0) && (!(ballot >> 31) || lo + 31 >= w.batch - 1)) {
    lo += last;
    if (last == 31) raw_end = __ldg(w.offsets + lo + 1);
  } else {
    // Lengths far from even: search the whole range, each round testing 32
    // evenly spaced candidates, so 1152 sequences take 3 rounds. With
    // malformed offsets the answer is still a sequence in range.
    long long hi = w.batch - 1;
    lo = 0;
    while (lo < hi) {
      const long long step = (hi - lo + 32) / 32; // candidates lo + step * lane
      const long long cand = lo + step * lane;
      bool ok = false;
      if (cand <= hi)
        ok = cand + clamp_offset(w, __ldg(w.offsets + cand), 0) / kBlock <= w.vblock;
      ballot = __ballot_sync(0xffffffffu, ok);
      last = ballot ? 31 - __clz(ballot) : 0;
      lo += step * last;
      hi = min(hi, lo + step - 1);
    }
    raw_start = __ldg(w.offsets + lo);
    raw_end = __ldg(w.offsets + lo + 1);
  }
  enter_sequence(w, lo, raw_start, raw_end);
  if (w.vblock < w.base) { w.vblock = w.base; w.group = 0; }
  settle(w);
}

__device__ __forceinline__ void walk_next(Walk &w) {
  if (++w.group == w.groups) { w.group = 0; w.vblock++; }
  settle(w);
}

// One resident tile: where its rows live and how many are real.
struct Tile {
  long long token0; // first token of the block
  int rows;         // valid rows, 1..kBlock; 0 marks "no tile"
  int head0;        // first head of the group
  int heads;        // heads of the group that exist, 1..kHeadsPerTile
@if ROTARY_SEQUENCE@
  int pos0;         // index of the block's first token in its sequence
@endif@
@if TABLE_IN_GLOBAL@
@if ROTARY_TABLE@
  const unsigned short *table; // the block's rows of the rotary table (the kernel's)
@endif@
@endif@
};

__device__ __forceinline__ Tile walk_tile(const Walk &w) {
  Tile t;
@if TABLE_IN_GLOBAL@
@if ROTARY_TABLE@
  t.table = nullptr; // the kernel points it at the block's rows of its table
@endif@
@endif@
@if ROTARY_SEQUENCE@
  if (w.done) { t.token0 = 0; t.rows = 0; t.head0 = 0; t.heads = 0; t.pos0 = 0; return t; }
@else@
  if (w.done) { t.token0 = 0; t.rows = 0; t.head0 = 0; t.heads = 0; return t; }
@endif@
  long long j = w.vblock - w.base;
  long long left = w.seq_len - j * kBlock;
  t.token0 = w.seq_start + j * kBlock;
  t.rows = (int)(left < kBlock ? left : kBlock);
  t.head0 = w.group * kHeadsPerTile;
  t.heads = min(kHeadsPerTile, w.num_heads - t.head0);
@if ROTARY_SEQUENCE@
  t.pos0 = (int)(j * kBlock); // below total_tokens, so below 2^31
@endif@
  return t;
}

// The current tile (rows 0 when the walk is done), then step past it.
__device__ __forceinline__ Tile walk_take(Walk &w) {
  const Tile t = walk_tile(w);
  if (!w.done) walk_next(w);
  return t;
}

// The ring of tiles filled from a begun walk: ring[0..kStages-1] taken in
// turn; the copies of ring[0..kStages-2] (load(s, tile) into stage s, for
// a tile with rows) started as soon as the walk found each, before it
// looks further, a commit group each; ring[kStages-1]'s copies are the
// caller's first step's. ring[0] is computed first.
template <int kStages, class Load>
__device__ __forceinline__ void walk_fill(Walk &w, Tile (&ring)[kStages], Load load) {
#pragma unroll
  for (int s = 0; s < kStages; s++) {
    ring[s] = walk_take(w);
    if (s == kStages - 1) break;
    if (ring[s].rows) load(s, ring[s]);
    cp_async_commit();
  }
}
/* ---- end work walk ---- */
