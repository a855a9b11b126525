/* walk_jagged.c: the host half of the jagged walks
 * (templates/jagged_walk.cuh): one CTA per (virtual tile, head). Sequence
 * i's tiles are numbered from i + offsets[i] / rows, so there are batch +
 * total / rows numbers (some unused, which their CTAs skip at once) and
 * the host needs no offsets to size the grid. */
#include <stdint.h>

#include "runtime.h"

ag_status ag_walk_jagged_grid(const ag_walk *w, const ag_launch *a, unsigned out_grid[3],
                              int64_t *out_items, ag_error *err) {
  const bool keys = w->kind == AG_WALK_JAGGED_K;
  const int64_t total = keys ? a->total_k : a->total_q;
  const int64_t heads = keys ? a->kv_heads : a->heads;
  const int64_t tiles = a->batch + total / w->rows; /* both below 2^31: checked by the caller */
  if (tiles > INT32_MAX || heads > 65535)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "%lld tiles of %d tokens by %lld heads exceed the grid's limits",
                   (long long)tiles, w->rows, (long long)heads);
  out_grid[0] = (unsigned)tiles;
  out_grid[1] = (unsigned)heads;
  out_grid[2] = 1;
  *out_items = tiles;
  return AG_OK;
}
