// SPDX-License-Identifier: BSD-3-Clause
/* walk_jagged.c: the host half of the jagged walks
 * (templates/jagged_walk.cuh): one CTA per (virtual tile, head). Sequence
 * i's tiles are numbered from i + offsets[i] / rows, so there are batch +
 * total / rows numbers (some unused, which their CTAs skip at once) and
 * the host needs no offsets to size the grid; a query walk's CTA may take
 * several numbers in turn (items_per_cta). The broadcast-Q walks: one
 * CTA per (sequence, query tile, head) of the forward, per (query tile,
 * slab of sequences, head) of the backward's dQ (the slabs cut on the
 * device, jagged_bwd_tile.cuh's slab_start), and the slabs' sum. The row
 * walk: `rows` (token, head) rows of the queries a CTA. The counter walk:
 * the key walk's numbers, taken by a grid of SMs (persistent). */
#include <stdint.h>

#include "runtime.h"

/* Enough (query tile, slab, head) CTAs to fill an H200 about twice over
 * (132 SMs x 2 CTAs), a fixed count so that dQ's order of additions, so
 * its bits, depend on the sizes alone. */
enum { SLAB_CTAS = 512 };

int64_t ag_broadcast_slabs(int64_t batch, int64_t n_q, int64_t heads, int block_m) {
  if (batch <= 0 || n_q <= 0 || heads <= 0 || block_m <= 0) return 0;
  const int64_t per_slab = (n_q + block_m - 1) / block_m * heads;
  int64_t slabs = (SLAB_CTAS + per_slab - 1) / per_slab;
  return slabs < batch ? slabs : batch;
}

/* The items (query tiles) a CTA of a query walk computes in turn. */
static int64_t cta_items(const ag_walk *w) {
  return w->items_per_cta > 1 ? w->items_per_cta : 1;
}

static ag_status broadcast_grid(const ag_walk *w, const ag_launch *a, unsigned out_grid[3],
                                int64_t *out_items, ag_error *err) {
  const int64_t n_q = a->batch > 0 ? a->total_q / a->batch : 0;
  const int64_t q_tiles = (n_q + w->rows - 1) / w->rows;
  int64_t x = 0, y = a->heads, items = 0;
  switch (w->kind) {
    case AG_WALK_BROADCAST_Q:
      items = a->batch * q_tiles;
      x = (items + cta_items(w) - 1) / cta_items(w);
      break;
    case AG_WALK_BROADCAST_SLABS:
      x = items = q_tiles * ag_broadcast_slabs(a->batch, n_q, a->heads, a->slab_rows);
      break;
    default: /* AG_WALK_BROADCAST_SUM */
      x = (n_q * a->heads + w->rows - 1) / w->rows;
      y = 1;
      items = ag_broadcast_slabs(a->batch, n_q, a->heads, a->slab_rows);
  }
  if (w->kind == AG_WALK_BROADCAST_Q && w->heads_inner) {
    /* heads below 2^16, x below 2^32 (n_q, batch checked by the caller):
     * the product fits */
    if (x * y > INT32_MAX)
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                     "%lld query tiles by %lld heads (a CTA each, heads inner) exceed the "
                     "grid's limits", (long long)x, (long long)y);
    x *= y;
    y = 1;
  }
  if (x > INT32_MAX || y > 65535)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "%lld query tiles by %lld heads exceed the grid's limits", (long long)x,
                   (long long)y);
  out_grid[0] = (unsigned)x;
  out_grid[1] = (unsigned)y;
  out_grid[2] = 1;
  *out_items = items;
  return AG_OK;
}

ag_status ag_walk_jagged_grid(const ag_walk *w, const ag_launch *a, int sm_count,
                              int ctas_per_sm, unsigned out_grid[3], int64_t *out_items,
                              ag_error *err) {
  if (w->kind == AG_WALK_JAGGED_ROWS) {
    /* total_q < 2^31 and heads < 2^16 (checked by the caller): no overflow */
    int64_t x = (a->total_q * a->heads + w->rows - 1) / w->rows;
    if (x > INT32_MAX)
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                     "%lld query rows by %lld heads exceed the grid's limits",
                     (long long)a->total_q, (long long)a->heads);
    if (x < 1) x = 1; /* no query: one CTA, which zeroes the tile counter */
    out_grid[0] = (unsigned)x;
    out_grid[1] = out_grid[2] = 1;
    *out_items = x;
    return AG_OK;
  }
  if (w->kind != AG_WALK_JAGGED_Q && w->kind != AG_WALK_JAGGED_K &&
      w->kind != AG_WALK_JAGGED_K_COUNTER)
    return broadcast_grid(w, a, out_grid, out_items, err);
  const bool keys = w->kind != AG_WALK_JAGGED_Q;
  const int64_t total = keys ? a->total_k : a->total_q;
  const int64_t heads = keys ? a->kv_heads : a->heads;
  const int64_t tiles = a->batch + total / w->rows; /* both below 2^31: checked by the caller */
  if (tiles > INT32_MAX || heads > 65535)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "%lld tiles of %d tokens by %lld heads exceed the grid's limits",
                   (long long)tiles, w->rows, (long long)heads);
  *out_items = tiles;
  if (w->kind == AG_WALK_JAGGED_K_COUNTER) {
    /* persistent: CTAs for every SM, no more than there are numbers */
    const int64_t numbers = tiles * heads;
    int64_t ctas = (int64_t)sm_count * ctas_per_sm;
    if (ctas < 1) ctas = 1; /* never no CTA: dK and dV would stay unwritten */
    out_grid[0] = (unsigned)(ctas < numbers ? ctas : numbers);
    out_grid[1] = out_grid[2] = 1;
    return AG_OK;
  }
  out_grid[0] = (unsigned)(keys ? tiles : (tiles + cta_items(w) - 1) / cta_items(w));
  out_grid[1] = (unsigned)heads;
  out_grid[2] = 1;
  return AG_OK;
}
