#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""schedule_sim.py: how much a longest-first (LPT) order of the jagged
forward's CTAs could gain over the order the hardware dispatches the grid
in today, in a model: 1152 sequences of lengths uniform in [1, L], 4
heads, 128-row query tiles, a CTA of `items` consecutive tiles (the walk's
order, last first) costing c0 + its key tiles of 128 (c0: the CTA's start
and end, in key tiles), one CTA an SM on 132 SMs, each next CTA (grid x
fastest, then the head) to the SM that frees first. Prints the makespan
over the ideal (total work / SMs) in grid order and in LPT order, and
their ratio: the most a sorted schedule could gain. bench/NOTES.md
(session 34) reads it.

    python3 tools/tune/schedule_sim.py [--items N] [--c0 X] [L ...]
"""
import argparse
import heapq
import math
import random


def makespan(works, sms):
    free = [0.0] * sms
    for w in works:
        heapq.heappush(free, heapq.heappop(free) + w)
    return max(free)


def ctas(L, causal, items, c0, heads, batch, seed):
    rnd = random.Random(seed)
    tiles = []
    for l in (rnd.randint(1, L) for _ in range(batch)):
        for qt in range(math.ceil(l / 128)):
            kend = min(l, (qt + 1) * 128) if causal else l
            tiles.append(math.ceil(kend / 128))
    tiles.reverse()  # the walk takes the tiles last first
    one_head = [c0 + sum(tiles[i:i + items]) for i in range(0, len(tiles), items)]
    return one_head * heads  # grid x fastest, then the head


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("lengths", nargs="*", type=int, default=[1024, 4096])
    p.add_argument("--items", type=int, default=1, help="query tiles a CTA")
    p.add_argument("--c0", type=float, default=1.0, help="a CTA's fixed cost, in key tiles")
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print("L causal grid/ideal lpt/ideal grid/lpt (items %d, c0 %g)" % (a.items, a.c0))
    for L in a.lengths:
        for causal in (False, True):
            w = ctas(L, causal, a.items, a.c0, 4, 1152, a.seed)
            ideal = sum(w) / a.sms
            grid = makespan(w, a.sms)
            lpt = makespan(sorted(w, reverse=True), a.sms)
            print("%d %s %.4f %.4f %.4f" % (L, causal, grid / ideal, lpt / ideal, grid / lpt))


if __name__ == "__main__":
    main()
