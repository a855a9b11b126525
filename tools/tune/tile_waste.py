#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""tile_waste.py: the share of the warp-specialized jagged forward's
products that are useful (visible query-key pairs over the pairs its tiles
compute), with lengths uniform in [1, L] (self-attention): 128-row query
tiles of two 64-row warpgroups against 128-key tiles, as computed whole
(columns 'whole'), with warpgroups whose rows are all past the sequence
skipped ('rows'), with 64-key parts no row of a warpgroup sees skipped
('parts'), and both ('both'). bench/NOTES.md (session 34) reads it.

    python3 tools/tune/tile_waste.py [L ...]      (default 1024 4096)
"""
import math
import sys


def useful_share(L, causal, skip_rows, skip_parts):
    useful = computed = 0
    for l in range(1, L + 1):
        useful += l * (l + 1) // 2 if causal else l * l
        for qt in range(math.ceil(l / 128)):
            for wg in range(2):
                r0 = qt * 128 + wg * 64
                if skip_rows and r0 >= l:
                    continue
                kend = min(l, r0 + 64) if causal else l  # keys this warpgroup needs
                for kt in range(math.ceil(kend / 128)):
                    need = min(128, kend - kt * 128)
                    computed += 64 * (64 if skip_parts and need <= 64 else 128)
    return useful / computed


def main(argv):
    lengths = [int(x) for x in argv] or [1024, 4096]
    print("L causal whole rows parts both")
    for L in lengths:
        for causal in (False, True):
            shares = [useful_share(L, causal, r, p) for r, p in ((0, 0), (1, 0), (0, 1), (1, 1))]
            print(L, causal, " ".join("%.3f" % x for x in shares))


if __name__ == "__main__":
    main(sys.argv[1:])
