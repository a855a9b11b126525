// SPDX-License-Identifier: BSD-3-Clause
/* schedule.c: the host half of a persistent jagged schedule: every
 * (sequence, query tile) with its key-tile work, sorted longest first; the
 * (tile, head) items that follow from it are dealt to a fixed number of
 * CTAs in boustrophedon (zigzag) order, so that each CTA's total work is
 * near the average and the last wave is short.
 *
 * Two common cases skip the per-tile histogram: without a mask the
 * sequences are counting-sorted by their one work and written tile by
 * tile (build_unmasked); under the causal mask alone over self-attention
 * the works are an arithmetic series per sequence, so the order is
 * written from two counting sorts of the sequences (build_causal_self).
 * Windows and cross-attention under the mask take the general path below.
 *
 * The dealing is arithmetic, not a list: item i (tile i / heads, head
 * i % heads of the sorted order) goes to CTA i mod ctas in even rounds
 * (round = i / ctas) and ctas - 1 - (i mod ctas) in odd ones, so CTA c's
 * k-th item is i = k * ctas + (k odd ? ctas - 1 - c : c) while i < items
 * (ag_schedule_item_of; a kernel's walk computes the same). The host
 * writes only the sorted tiles, 8 bytes each: O(tiles) time, two passes
 * over the tiles (a counting sort by work, whose range is bounded by the
 * longest sequence's key tiles) and no division in them when the tile
 * sizes are powers of two. The kernel side is not built yet; see
 * bench/NOTES.md. Cost for 1152 sequences uniform in [1, 4096], causal:
 * 108 us on the H200's host before the two fast paths (2026-12-03), 15-27
 * us after them on the development container (tests/check_schedule.c). */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* x / d for d = 1 << shift when shift >= 0, else by division. */
static inline int64_t div_by(int64_t x, int64_t d, int shift) {
  return shift >= 0 ? x >> shift : x / d;
}

/* ceil(x / d), as div_by. */
static inline int64_t ceil_by(int64_t x, int64_t d, int shift) {
  return div_by(x + d - 1, d, shift);
}

/* Counts c[0..top] into the starts of their runs, the largest index first
 * (c[i] = the count above i): a descending counting sort's first half. */
static void starts_from_top(int64_t *c, int64_t top) {
  for (int64_t i = top, acc = 0; i >= 0; i--) {
    const int64_t n = c[i];
    c[i] = acc;
    acc += n;
  }
}

static int log2_exact(int64_t d) {
  for (int s = 0; s < 62; s++)
    if ((int64_t)1 << s == d) return s;
  return -1;
}

/* Key tiles a query tile visits: the union of its rows' key ranges
 * (bottom-right causal and window, as the kernels and the reference). */
static int64_t tile_work(const ag_schedule_shape *s, int shift_n, int64_t lq, int64_t lk,
                         int64_t m0, int64_t rows) {
  const int64_t d = lk - lq;
  int64_t lo = 0, hi = lk; /* [lo, hi) over all rows of the tile */
  if (s->causal || s->window) {
    const int64_t first = m0, last = m0 + rows - 1;
    if (s->window && s->window_left >= 0) lo = first + d - s->window_left;
    int64_t right = s->causal ? 0 : s->window ? s->window_right : -1;
    if (right >= 0) hi = last + d + right + 1;
    if (lo < 0) lo = 0;
    if (hi > lk) hi = lk;
  }
  if (hi <= lo) return 0;
  return ceil_by(hi, s->block_n, shift_n) - div_by(lo, s->block_n, shift_n);
}

/* The work of sequence b's tiles into w[0..n): without a mask one value
 * for all (every tile sees every key), under the causal mask alone a
 * closed form, else tile_work per tile. */
static void sequence_work(const ag_schedule_shape *s, int shift_n, int64_t lq, int64_t lk,
                          int64_t n, int32_t *w) {
  if (!s->causal && !s->window) {
    const int32_t all = lk > 0 ? (int32_t)ceil_by(lk, s->block_n, shift_n) : 0;
    for (int64_t t = 0; t < n; t++) w[t] = all;
    return;
  }
  if (s->causal && !s->window) { /* keys [0, min(lk, end + lk - lq)) for rows ending at `end` */
    for (int64_t t = 0, end = s->block_m; t < n; t++, end += s->block_m) {
      int64_t hi = (end < lq ? end : lq) + lk - lq;
      if (hi > lk) hi = lk;
      w[t] = hi > 0 ? (int32_t)ceil_by(hi, s->block_n, shift_n) : 0;
    }
    return;
  }
  for (int64_t t = 0, m0 = 0; t < n; t++, m0 += s->block_m)
    w[t] = (int32_t)tile_work(s, shift_n, lq, lk, m0, lq - m0 < s->block_m ? lq - m0 : s->block_m);
}

/* The causal mask alone over self-attention (queries and keys share the
 * offsets), block_m a multiple of block_n: tile t < n - 1 of a sequence
 * of L tokens sees (t + 1) r key tiles (r = block_m / block_n), its last
 * tile ceil(L / block_n), which lies in ((n - 1) r, n r]. So the sorted
 * order is written without a per-tile histogram or scatter: with the
 * sequences ordered by tile count (longest first, a counting sort), the
 * tiles of work k r are tile k - 1 of a prefix of that order, and the last
 * tiles come from a second counting sort by their work. Every write is
 * sequential; O(batch + tiles + max_work). Returns false (nothing written)
 * when out of memory. */
static bool build_causal_self(const ag_schedule_shape *s, const int32_t *cu, int64_t batch,
                              int shift_m, int shift_n, int64_t max_work, int64_t max_n,
                              ag_schedule_tile *tiles) {
  const int64_t r = s->block_m / s->block_n;
  /* count[n]: sequences of n tiles; last[w]: last tiles of work w */
  int64_t *count = calloc((size_t)(max_n + 2), sizeof *count);
  int64_t *last = calloc((size_t)(max_work + 2), sizeof *last);
  int32_t *by_n = malloc(sizeof *by_n * (size_t)(batch ? batch : 1));
  int32_t *by_last = malloc(sizeof *by_last * (size_t)(batch ? batch : 1));
  if (!count || !last || !by_n || !by_last) {
    free(count), free(last), free(by_n), free(by_last);
    return false;
  }
  for (int64_t b = 0; b < batch; b++) {
    const int64_t l = (int64_t)cu[b + 1] - cu[b];
    if (l <= 0) continue;
    count[ceil_by(l, s->block_m, shift_m)]++;
    last[ceil_by(l, s->block_n, shift_n)]++;
  }
  starts_from_top(count, max_n); /* count[n] = sequences with more than n tiles */
  starts_from_top(last, max_work);
  for (int64_t b = 0; b < batch; b++) {
    const int64_t l = (int64_t)cu[b + 1] - cu[b];
    if (l <= 0) continue;
    by_n[count[ceil_by(l, s->block_m, shift_m)]++] = (int32_t)b;
    by_last[last[ceil_by(l, s->block_n, shift_n)]++] = (int32_t)b;
  }
  /* after the loop count[n] ends run n: count[n] = sequences with >= n tiles;
   * last[w] ends run w (run w starts at last[w + 1]) */
  int64_t at = 0;
  for (int64_t w = max_work; w >= 1; w--) {
    if (w % r == 0 && w / r + 1 <= max_n) { /* tile k - 1 of sequences with > k tiles */
      const int64_t k = w / r;
      const int64_t with = count[k + 1]; /* sequences of at least k + 1 tiles */
      for (int64_t i = 0; i < with; i++)
        tiles[at++] = (ag_schedule_tile){by_n[i], (int32_t)(k - 1)};
    }
    for (int64_t i = last[w + 1]; i < last[w]; i++) { /* last tiles of work w */
      const int32_t b = by_last[i];
      tiles[at++] = (ag_schedule_tile){b, (int32_t)(ceil_by((int64_t)cu[b + 1] - cu[b], s->block_m,
                                                            shift_m) - 1)};
    }
  }
  free(count), free(last), free(by_n), free(by_last);
  return true;
}

/* No mask: every tile of a sequence sees all its key tiles, so the
 * sequences are sorted by that work (a counting sort, stable) and each
 * one's tiles written side by side. O(batch + tiles + max_work), every
 * tile write sequential. Returns false (nothing written) when out of
 * memory. */
static bool build_unmasked(const ag_schedule_shape *s, const int32_t *cu_q, const int32_t *cu_k,
                           int64_t batch, int shift_m, int shift_n, int64_t max_work,
                           ag_schedule_tile *tiles) {
  int64_t *start = calloc((size_t)(max_work + 2), sizeof *start);
  int32_t *order = malloc(sizeof *order * (size_t)(batch ? batch : 1));
  if (!start || !order) {
    free(start), free(order);
    return false;
  }
  for (int64_t b = 0; b < batch; b++)
    if (cu_q[b + 1] > cu_q[b])
      start[ceil_by((int64_t)cu_k[b + 1] - cu_k[b], s->block_n, shift_n)]++;
  starts_from_top(start, max_work); /* longest first */
  int64_t used = 0;
  for (int64_t b = 0; b < batch; b++)
    if (cu_q[b + 1] > cu_q[b]) {
      order[start[ceil_by((int64_t)cu_k[b + 1] - cu_k[b], s->block_n, shift_n)]++] = (int32_t)b;
      used++;
    }
  int64_t at = 0;
  for (int64_t i = 0; i < used; i++) {
    const int32_t b = order[i];
    const int64_t n = ceil_by((int64_t)cu_q[b + 1] - cu_q[b], s->block_m, shift_m);
    for (int64_t t = 0; t < n; t++) tiles[at++] = (ag_schedule_tile){b, (int32_t)t};
  }
  free(start), free(order);
  return true;
}

ag_status ag_schedule_build(const ag_schedule_shape *s, const int32_t *cu_q, const int32_t *cu_k,
                            int64_t batch, int64_t heads, int ctas, ag_schedule *out,
                            ag_error *err) {
  /* a previous schedule's buffers are reused when they have room */
  ag_schedule_tile *keep = out->tiles;
  int32_t *keep_work = out->work;
  const int64_t kept = out->capacity;
  memset(out, 0, sizeof *out);
  out->tiles = keep;
  out->work = keep_work;
  out->capacity = kept;
  if (!s || !cu_q || batch < 0 || heads < 1 || ctas < 1 || s->block_m < 1 || s->block_n < 1)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_schedule_build: bad arguments");
  if (!cu_k) cu_k = cu_q;
  const int shift_m = log2_exact(s->block_m), shift_n = log2_exact(s->block_n);
  /* Pass 1: count the tiles; the longest key range bounds the work. */
  int64_t ntiles = 0, max_lk = 0, max_n = 0;
  for (int64_t b = 0; b < batch; b++) {
    const int64_t lq = (int64_t)cu_q[b + 1] - cu_q[b], lk = (int64_t)cu_k[b + 1] - cu_k[b];
    if (lq < 0 || lk < 0)
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "offsets decrease at sequence %lld",
                     (long long)b);
    const int64_t n = ceil_by(lq, s->block_m, shift_m);
    ntiles += n;
    if (n > max_n) max_n = n;
    if (lk > max_lk) max_lk = lk;
  }
  if (ntiles > INT32_MAX / heads)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "%lld tiles by %lld heads exceed 2^31 items",
                   (long long)ntiles, (long long)heads);
  /* work is at most the key tiles of the longest key range, or under a
   * window bounded on both sides (the causal mask bounds the right) of
   * its span over a tile's rows, plus one for a range that starts inside a
   * tile: the counting sort's range */
  int64_t max_work = ceil_by(max_lk, s->block_n, shift_n) + 1;
  if (s->window && s->window_left >= 0 && (s->causal || s->window_right >= 0)) {
    const int64_t span = s->window_left + (s->causal ? 0 : s->window_right) + s->block_m;
    const int64_t bound = ceil_by(span, s->block_n, shift_n) + 1;
    if (bound < max_work) max_work = bound;
  }
  if (!out->tiles || !out->work || out->capacity < ntiles) {
    free(out->tiles);
    free(out->work);
    out->capacity = 0;
    out->tiles = malloc(sizeof *out->tiles * (size_t)(ntiles ? ntiles : 1));
    out->work = malloc(sizeof *out->work * (size_t)(ntiles ? ntiles : 1));
    if (out->tiles && out->work) out->capacity = ntiles ? ntiles : 1;
  }
  const bool fast =
      out->capacity &&
      ((!s->causal && !s->window &&
        build_unmasked(s, cu_q, cu_k, batch, shift_m, shift_n, max_work, out->tiles)) ||
       (s->causal && !s->window && cu_k == cu_q && shift_m >= 0 && shift_n >= 0 &&
        s->block_m % s->block_n == 0 &&
        build_causal_self(s, cu_q, batch, shift_m, shift_n, max_work, max_n, out->tiles)));
  if (fast) {
    out->ntiles = ntiles;
    out->nitems = ntiles * heads;
    out->heads = heads;
    out->ctas = ctas;
    return AG_OK;
  }
  int64_t *bucket = calloc((size_t)max_work + 2, sizeof *bucket);
  if (!out->capacity || !bucket) {
    free(bucket);
    ag_schedule_free(out);
    return ag_fail(err, AG_ERR_NOMEM, "out of memory for the schedule");
  }
  /* Pass 2: each tile's work, and a histogram of it (bucket max_work - w + 1:
   * longest first). */
  int32_t *work = out->work;
  for (int64_t b = 0, at = 0; b < batch; b++) {
    const int64_t lq = (int64_t)cu_q[b + 1] - cu_q[b], lk = (int64_t)cu_k[b + 1] - cu_k[b];
    const int64_t n = ceil_by(lq, s->block_m, shift_m);
    sequence_work(s, shift_n, lq, lk, n, work + at);
    for (int64_t t = 0; t < n; t++) bucket[max_work - work[at + t] + 1]++;
    at += n;
  }
  for (int64_t w = 1; w <= max_work + 1; w++) bucket[w] += bucket[w - 1]; /* starts */
  /* Pass 3: each tile at its bucket's next place (stable: sequence order
   * within a bucket). */
  for (int64_t b = 0, at = 0; b < batch; b++) {
    const int64_t n = ceil_by((int64_t)cu_q[b + 1] - cu_q[b], s->block_m, shift_m);
    for (int64_t t = 0; t < n; t++)
      out->tiles[bucket[max_work - work[at + t]]++] = (ag_schedule_tile){(int32_t)b, (int32_t)t};
    at += n;
  }
  free(bucket);
  out->ntiles = ntiles;
  out->nitems = ntiles * heads;
  out->heads = heads;
  out->ctas = ctas;
  return AG_OK;
}

int64_t ag_schedule_cta_items(const ag_schedule *s, int cta) {
  const int64_t rounds = s->nitems / s->ctas, rest = s->nitems % s->ctas;
  /* the last, partial round reaches CTAs 0..rest-1 when even, else the last rest */
  const int64_t r = rounds & 1 ? s->ctas - 1 - cta : cta;
  return rounds + (r < rest);
}

ag_schedule_item ag_schedule_item_of(const ag_schedule *s, int cta, int64_t k) {
  const int64_t i = k * s->ctas + (k & 1 ? s->ctas - 1 - cta : cta);
  const ag_schedule_tile t = s->tiles[i / s->heads];
  return (ag_schedule_item){t.seq, t.tile, (int32_t)(i % s->heads)};
}

void ag_schedule_free(ag_schedule *s) {
  if (!s) return;
  free(s->tiles);
  free(s->work);
  memset(s, 0, sizeof *s);
}
