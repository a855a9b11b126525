// SPDX-License-Identifier: BSD-3-Clause
/* walk_block.c: the host half of the block walk (templates/block_walk.cuh):
 * how many (virtual block, head group) items there are and how many CTAs
 * take them, from batch, heads and total_tokens alone. It also keeps the
 * walk's device arithmetic free of signed overflow (see the caps below). */
#include <stdint.h>

#include "runtime.h"

/* Items: (batch + floor(total / block)) virtual blocks times head groups
 * (block_walk.cuh's numbering: sequence i's blocks start at i + offsets[i]
 * / block, so the count needs no offsets).
 *
 * The device half computes, in int64 or int: heads + kHeadsPerTile - 1
 * (int), num_items * (blockIdx.x + 1) (the CTA's share) and vblock * batch
 * (the first guess of its search, vblock below the virtual block count).
 * Heads and batch are capped so that the first and last fit; the grid is
 * capped so that items * grid fits (CTAs then take more items each, as past
 * the grid limit), so no size the checks accept can overflow there. */
ag_status ag_walk_block_grid(const ag_walk *w, const ag_launch *a, int sm_count, int ctas_per_sm,
                             unsigned out_grid[3], int64_t *out_items, ag_error *err) {
  if (a->heads > INT32_MAX - (w->heads_per_item - 1))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "heads (%lld) exceeds 2^31 - %d: rounded up to whole tiles of %d heads, "
                   "it must fit in int32",
                   (long long)a->heads, w->heads_per_item, w->heads_per_item);
  const int64_t groups = (a->heads + w->heads_per_item - 1) / w->heads_per_item;
  const int64_t batch = a->batch, total = a->total_q;
  if (total / w->rows > INT64_MAX - batch) /* checked before adding: no UB */
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "work count overflows");
  const int64_t vblocks = batch + total / w->rows;
  if (vblocks > INT64_MAX / groups)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "work count overflows");
  if (batch > 0 && vblocks > INT64_MAX / batch)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "batch (%lld) is too large: the block walk's search multiplies it by the "
                   "%lld virtual blocks, which overflows 64 bits (about 3.04e9 sequences at most)",
                   (long long)batch, (long long)vblocks);
  const int64_t items = vblocks * groups;
  /* Persistent: as many CTAs as fit at once. Otherwise one CTA per
   * items_per_cta items, so the hardware balances CTAs across SMs; past the
   * grid limit, CTAs take proportionally more. */
  int64_t grid = (int64_t)sm_count * ctas_per_sm;
  if (w->items_per_cta > 0) /* rounded up without forming items + items_per_cta - 1 */
    grid = items / w->items_per_cta + (items % w->items_per_cta != 0);
  if (grid > INT32_MAX) grid = INT32_MAX;
  if (grid > items) grid = items;
  if (items > 0 && grid > INT64_MAX / items) grid = INT64_MAX / items; /* >= 1 */
  out_grid[0] = (unsigned)grid;
  out_grid[1] = out_grid[2] = 1;
  *out_items = items;
  return AG_OK;
}
