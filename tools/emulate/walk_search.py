# SPDX-License-Identifier: BSD-3-Clause
# Emulate walk_begin's 32-way warp search (templates/block_walk.cuh) lane by
# lane, with the ballot, against the plain binary search it replaced: the
# same sequence for non-decreasing offsets (empty sequences, partial blocks,
# batches of 1 to 131,072), a sequence in range for malformed ones, and the
# number of rounds. Verification aid (not run by CI; plain Python):
# python3 tools/emulate/walk_search.py
# Its formulas are copied from the template by hand: keep them in step.
import random

BLOCK = 64


def clamp(x, lo, total):
    return lo if x < lo else (total if x > total else x)


def first_vblock(offsets, i, total):
    return i + clamp(offsets[i], 0, total) // BLOCK


def binary_search(offsets, batch, total, vblock):
    lo, hi = 0, batch - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if first_vblock(offsets, mid, total) <= vblock:
            lo = mid
        else:
            hi = mid - 1
    return lo


def warp_search(offsets, batch, total, vblock):
    lo, hi, rounds = 0, batch - 1, 0
    while lo < hi:
        step = (hi - lo + 32) // 32
        ballot = 0
        for lane in range(32):
            c = lo + step * lane
            if c <= hi and first_vblock(offsets, c, total) <= vblock:
                ballot |= 1 << lane
        last = ballot.bit_length() - 1 if ballot else 0
        lo += step * last
        hi = min(hi, lo + step - 1)
        rounds += 1
        assert rounds < 64, "no progress"
    return lo, rounds


def main():
    rng = random.Random(1)
    most = {}
    for trial in range(3000):
        batch = rng.choice([1, 2, 3, 31, 32, 33, 100, 1152, 5000, 131072]) if trial % 10 \
            else rng.randint(1, 70)
        offsets = [0]
        for _ in range(batch):
            offsets.append(offsets[-1] + rng.choice([0, 0, 1, 63, 64, 65, 200, 1000]))
        total = offsets[-1]
        items = batch + total // BLOCK  # virtual blocks (one head group)
        for _ in range(5):
            vblock = rng.randint(0, max(items - 1, 0))
            want = binary_search(offsets, batch, total, vblock)
            got, rounds = warp_search(offsets, batch, total, vblock)
            assert got == want, (batch, vblock, want, got)
            most[batch] = max(most.get(batch, 0), rounds)
        bad = [rng.randint(-100, total + 100) for _ in range(batch + 1)]
        got, _ = warp_search(bad, batch, total, rng.randint(0, items))
        assert 0 <= got < batch
    print("ok; most rounds by batch:", dict(sorted(most.items())))


if __name__ == "__main__":
    main()
