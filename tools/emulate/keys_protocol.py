# SPDX-License-Identifier: BSD-3-Clause
# A model of templates/broadcast_bwd_keys.cu's synchronization: the loading
# warpgroup and the two computing warpgroups of one CTA as coroutines
# (a warpgroup moves as one: its 128 arrivals are one arrival of weight
# 128), its mbarriers with phases, the flush's named barrier, run under
# random interleavings over random slabs and sequences (empty ones, one
# tile, many; slabs with no sequence; several slabs a CTA). It checks that
# every run ends (no deadlock), that no barrier runs two phases ahead of a
# waiter (the parity wait would be fooled), that each K, V slot and dO slot
# holds what its reader expects for as long as it reads it, that both
# computing warpgroups see every tile once and flush every slab of the CTA
# in order. (The dS^T rooms are a matter between the warps of one
# warpgroup, below this model.) The loops and counters are the template's,
# by hand: keep them in step. Verification aid (no numpy needed):
#   python3 tools/emulate/keys_protocol.py [runs]
import random
import sys

K_TILE, K_SLAB_END, K_END = 0, 1, 2


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.done = count, count, 0

    def arrive(self, n=1):
        self.pending -= n
        assert self.pending >= 0, "more arrivals than the barrier expects"
        if self.pending == 0:
            self.done += 1
            self.pending = self.count

    def passed(self, phase):
        # the parity wait for `phase` passes once it completed; a barrier two
        # phases on would look like `phase` not done (or done wrongly)
        assert self.done <= phase + 1, "barrier %d phases ahead of its waiter" % (self.done - phase)
        return self.done > phase


def cta(slabs_of_cta, stages, seq_stages, log):
    """Coroutines of one CTA: slabs_of_cta is a list of (slab, [n_steps of
    each sequence])."""
    kv_full = [Barrier(128 + 1) for _ in range(stages)]
    kv_empty = [Barrier(256) for _ in range(stages)]
    seq_full = [Barrier(2 * 128) for _ in range(seq_stages)]
    seq_empty = [Barrier(256) for _ in range(seq_stages)]
    tiles_s = [None] * stages      # the KeysTile of each slot
    kv_data = [None] * stages      # what the slot's K, V rows hold
    do_data = [None] * seq_stages  # which sequence a dO slot holds
    flush_bar = {"n": 0, "gen": 0}

    def wait(bar, phase):
        while not bar.passed(phase):
            yield

    def loader():
        t = seq = 0

        def hand_over(kind, slab):
            nonlocal t
            x = t % stages
            if t >= stages:
                yield from wait(kv_empty[x], t // stages - 1)
            tiles_s[x] = (kind, slab, None, None)
            kv_data[x] = None
            kv_full[x].arrive(128)
            kv_full[x].arrive(1)
            t += 1

        for slab, seqs in slabs_of_cta:
            for b, n_steps in enumerate(seqs):
                if n_steps == 0:
                    continue
                st = seq % seq_stages
                if seq >= seq_stages:
                    yield from wait(seq_empty[st], seq // seq_stages - 1)
                do_data[st] = (slab, b)
                seq_full[st].arrive(128)  # the copies
                yield
                seq_full[st].arrive(128)  # the row floats
                for i in range(n_steps):
                    x = t % stages
                    if t >= stages:
                        yield from wait(kv_empty[x], t // stages - 1)
                    tiles_s[x] = (K_TILE, slab, seq, (slab, b, i))
                    kv_data[x] = (slab, b, i)
                    kv_full[x].arrive(128)
                    kv_full[x].arrive(1)
                    t += 1
                    yield
                seq += 1
            yield from hand_over(K_SLAB_END, slab)
        yield from hand_over(K_END, 0)

    def computing(wg):
        cur = -1
        t = 0
        seen = []
        while True:
            x = t % stages
            yield from wait(kv_full[x], t // stages)
            kind, slab, s, tile = tiles_s[x]
            if kind == K_END:
                break
            if kind == K_SLAB_END:
                # flush: three meetings of both warpgroups (start, and per
                # half after the write and after the read; one half here)
                for _ in range(3):
                    gen = flush_bar["gen"]
                    flush_bar["n"] += 1
                    if flush_bar["n"] == 2:
                        flush_bar["n"] = 0
                        flush_bar["gen"] += 1
                    while flush_bar["gen"] == gen:
                        yield
                log.append(("flush", wg, slab))
                kv_empty[x].arrive(128)
                t += 1
                continue
            if s != cur:
                if cur >= 0:
                    seq_empty[cur % seq_stages].arrive(128)
                cur = s
                yield from wait(seq_full[cur % seq_stages], cur // seq_stages)
            st = cur % seq_stages
            assert kv_data[x] == tile, "K, V slot %d holds %s, tile %s expected" % (x, kv_data[x], tile)
            assert do_data[st] is not None and do_data[st] == tile[:2], "dO slot holds another sequence"
            yield  # the products run
            yield
            assert kv_data[x] == tile, "K, V slot %d rewritten while tile %s was read" % (x, tile)
            assert do_data[st] == tile[:2], "dO slot rewritten while in use"
            seen.append(tile)
            kv_empty[x].arrive(128)
            t += 1
        log.append(("tiles", wg, seen))

    return [loader(), computing(0), computing(1)]


def run(rng):
    stages = rng.choice([2, 3])
    grid = rng.randint(1, 4)
    slabs = rng.randint(1, 9)
    work = []
    for c in range(slabs):
        n = rng.choice([0, 0, 1, 2, 5])
        work.append([rng.choice([0, 0, 1, 1, 2, 3, 7]) for _ in range(n)])
    for block in range(grid):
        mine = [(c, work[c]) for c in range(block, slabs, grid)]
        log = []
        agents = cta(mine, stages, 2, log)
        live = list(agents)
        steps = 0
        while live:
            a = rng.choice(live)
            try:
                next(a)
            except StopIteration:
                live.remove(a)
            steps += 1
            assert steps < 200000, "no progress: deadlock (%s)" % (mine,)
        want = [(c, b, i) for c, seqs in mine for b, n in enumerate(seqs) for i in range(n)]
        for wg in (0, 1):
            tiles = [e[2] for e in log if e[0] == "tiles" and e[1] == wg]
            assert tiles == [want], "warpgroup %d saw %s, want %s" % (wg, tiles, want)
            flushed = [e[2] for e in log if e[0] == "flush" and e[1] == wg]
            assert flushed == [c for c, _ in mine], "flushes %s" % flushed


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(42)
    for _ in range(runs):
        run(rng)
    print("keys_protocol: %d random CTAs' runs ended, every tile and slab seen once, in order" % runs)


if __name__ == "__main__":
    main()
