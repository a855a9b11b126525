// SPDX-License-Identifier: BSD-3-Clause
/* schedule.c: the host half of a persistent jagged schedule: every
 * (sequence, query tile, head) item with its key-tile work, sorted longest
 * first and dealt to a fixed number of CTAs in boustrophedon (zigzag)
 * order, so that each CTA's total work is near the average and the last
 * wave is short. Pure host code, O(items): a bucket sort by work (work is
 * bounded by the longest sequence's key tiles) and one dealing pass. The
 * kernel side (a walk that reads the list) is not built yet; see
 * bench/NOTES.md. */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

/* Key tiles a query tile visits: the union of its rows' key ranges
 * (bottom-right causal and window, as the kernels and the reference). */
static int64_t tile_work(const ag_schedule_shape *s, int64_t lq, int64_t lk, int64_t m0,
                         int64_t rows) {
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
  return (hi + s->block_n - 1) / s->block_n - lo / s->block_n;
}

ag_status ag_schedule_build(const ag_schedule_shape *s, const int32_t *cu_q, const int32_t *cu_k,
                            int64_t batch, int64_t heads, int ctas, ag_schedule *out,
                            ag_error *err) {
  memset(out, 0, sizeof *out);
  if (!s || !cu_q || batch < 0 || heads < 1 || ctas < 1 || s->block_m < 1 || s->block_n < 1)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "ag_schedule_build: bad arguments");
  if (!cu_k) cu_k = cu_q;
  /* Pass 1: count the (sequence, tile) pairs. */
  int64_t pairs = 0;
  for (int64_t b = 0; b < batch; b++) {
    const int64_t lq = (int64_t)cu_q[b + 1] - cu_q[b], lk = (int64_t)cu_k[b + 1] - cu_k[b];
    if (lq < 0 || lk < 0)
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "offsets decrease at sequence %lld",
                     (long long)b);
    pairs += (lq + s->block_m - 1) / s->block_m;
  }
  if (pairs > INT32_MAX / heads)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "%lld tiles by %lld heads exceed 2^31 items",
                   (long long)pairs, (long long)heads);
  const int64_t nitems = pairs * heads;
  ag_schedule_item *unsorted = malloc(sizeof *unsorted * (size_t)(pairs ? pairs : 1));
  ag_schedule_item *sorted = malloc(sizeof *sorted * (size_t)(pairs ? pairs : 1));
  out->items = malloc(sizeof *out->items * (size_t)(nitems ? nitems : 1));
  out->cta_start = calloc((size_t)ctas + 1, sizeof *out->cta_start);
  int64_t *cursor = malloc(sizeof *cursor * (size_t)ctas);
  int64_t *bucket = NULL;
  if (!unsorted || !sorted || !out->items || !out->cta_start || !cursor) goto nomem;
  /* Pass 2: each pair's work, once. */
  int64_t max_work = 0, n = 0;
  for (int64_t b = 0; b < batch; b++) {
    const int64_t lq = (int64_t)cu_q[b + 1] - cu_q[b], lk = (int64_t)cu_k[b + 1] - cu_k[b];
    for (int64_t m0 = 0; m0 < lq; m0 += s->block_m) {
      const int64_t w = tile_work(s, lq, lk, m0, lq - m0 < s->block_m ? lq - m0 : s->block_m);
      if (w > max_work) max_work = w;
      unsorted[n++] = (ag_schedule_item){(int32_t)b, (int32_t)(m0 / s->block_m), 0, (int32_t)w};
    }
  }
  /* A bucket sort by work, longest first (stable: sequence order within a
   * bucket). */
  bucket = calloc((size_t)max_work + 2, sizeof *bucket);
  if (!bucket) goto nomem;
  for (int64_t p = 0; p < pairs; p++) bucket[max_work - unsorted[p].work + 1]++;
  for (int64_t w = 1; w <= max_work + 1; w++) bucket[w] += bucket[w - 1]; /* starts */
  for (int64_t p = 0; p < pairs; p++) sorted[bucket[max_work - unsorted[p].work]++] = unsorted[p];
  /* Deal: item i of the sorted order (heads of one tile adjacent) goes to
   * CTA i mod ctas on even rounds and ctas - 1 - (i mod ctas) on odd ones.
   * Counting first gives each CTA a contiguous range of the output. */
  for (int64_t i = 0, r = 0, odd = 0; i < nitems; i++) {
    out->cta_start[(odd ? ctas - 1 - r : r) + 1]++;
    if (++r == ctas) r = 0, odd ^= 1;
  }
  for (int c = 0; c < ctas; c++) out->cta_start[c + 1] += out->cta_start[c];
  for (int c = 0; c < ctas; c++) cursor[c] = out->cta_start[c];
  int64_t r = 0, odd = 0;
  for (int64_t p = 0; p < pairs; p++)
    for (int64_t h = 0; h < heads; h++) {
      ag_schedule_item it = sorted[p];
      it.head = (int32_t)h;
      out->items[cursor[odd ? ctas - 1 - r : r]++] = it;
      if (++r == ctas) r = 0, odd ^= 1;
    }
  out->nitems = nitems;
  out->ctas = ctas;
  free(unsorted);
  free(sorted);
  free(cursor);
  free(bucket);
  return AG_OK;
nomem:
  free(unsorted);
  free(sorted);
  free(cursor);
  free(bucket);
  ag_schedule_free(out);
  return ag_fail(err, AG_ERR_NOMEM, "out of memory for the schedule");
}

void ag_schedule_free(ag_schedule *s) {
  if (!s) return;
  free(s->items);
  free(s->cta_start);
  memset(s, 0, sizeof *s);
}
