@# block_walk.cuh: the work walk of the block-diagonal kernels: which (block,
@# head group) items a CTA takes and where each item's rows live. Shared by
@# block_fwd.cu and block_bwd.cu; uses the including kernel's kBlock and
@# kHeadsPerTile. No placeholders. Conditions: ROTARY_SEQUENCE (tiles carry the
@# position of their first token in its sequence).
/* ---- begin work walk ----
 * Work items are (block, head group) pairs; a head group is kHeadsPerTile
 * adjacent heads, whose rows are contiguous in memory. Blocks get "virtual" numbers that need
 * no prefix sum over block counts: sequence i, starting at token s_i, numbers
 * its blocks from i + floor(s_i / kBlock). Those numbers increase with i and
 * leave at most one unused number per sequence, so the item space has
 * (batch + floor(total_tokens / kBlock)) * head_groups entries, known on the host
 * without reading the offsets. Each CTA takes one contiguous range of items,
 * finds its first sequence by binary search and then walks forward, skipping
 * unused numbers and empty sequences for free. */
struct Walk {
  const int *offsets;
  long long batch, total_tokens, end; // end: one past this CTA's last item
  int num_heads, groups;              // heads, and head groups, per token
  long long seq;                      // current sequence
  long long seq_start, seq_len;       // its tokens
  long long base;                     // virtual number of its first block
  long long vblock;                   // current virtual block
  int group;
  bool done;
};

// Sequence bounds, clamped to [0, total_tokens] so that malformed offsets
// can never send a load or store out of bounds.
__device__ __forceinline__ void load_sequence(Walk &w, long long i) {
  long long s = __ldg(w.offsets + i), e = __ldg(w.offsets + i + 1);
  s = s < 0 ? 0 : (s > w.total_tokens ? w.total_tokens : s);
  e = e < s ? s : (e > w.total_tokens ? w.total_tokens : e);
  w.seq = i;
  w.seq_start = s;
  w.seq_len = e - s;
  w.base = i + s / kBlock;
}

// Move to the first valid item at or after (vblock, group).
__device__ __forceinline__ void settle(Walk &w) {
  while (w.vblock - w.base >= (w.seq_len + kBlock - 1) / kBlock) {
    if (w.seq + 1 >= w.batch) { w.done = true; return; }
    load_sequence(w, w.seq + 1);
    if (w.vblock < w.base) { w.vblock = w.base; w.group = 0; }
  }
  if (w.vblock * w.groups + w.group >= w.end) w.done = true;
}

__device__ __forceinline__ void walk_begin(Walk &w, long long first) {
  w.vblock = first / w.groups;
  w.group = (int)(first % w.groups);
  w.done = first >= w.end;
  if (w.done) return;
  // Last sequence whose first virtual block is <= vblock.
  long long lo = 0, hi = w.batch - 1;
  while (lo < hi) {
    long long mid = (lo + hi + 1) / 2;
    long long s = __ldg(w.offsets + mid);
    s = s < 0 ? 0 : (s > w.total_tokens ? w.total_tokens : s);
    if (mid + s / kBlock <= w.vblock) lo = mid; else hi = mid - 1;
  }
  load_sequence(w, lo);
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
};

__device__ __forceinline__ Tile walk_tile(const Walk &w) {
  Tile t;
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
/* ---- end work walk ---- */
