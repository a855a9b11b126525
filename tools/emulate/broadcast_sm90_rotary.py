# SPDX-License-Identifier: BSD-3-Clause
# Emulate the index math of rotary embeddings in templates/broadcast_bwd_sm90.cu
# with numpy: each copying thread rotating the pieces it copied itself
# (load_rows' assignment and 128-byte-swizzled layout, rotate_copied and
# rotate_piece: unit_read's table words, a half-layout piece's partner in lane
# ^ kPieces / 2 of the same warp), the prefetch of a tile's table lines
# (prefetch_angles), and the key warpgroup's inverse rotation of a 64-column
# part of dK in the wgmma C layout (unrotate_part, word_angles), against numpy
# rotations of the unswizzled tensors. Float64 throughout: this checks indices,
# not rounding. Verification aid (not run by CI; needs numpy):
#   python3 tools/emulate/broadcast_sm90_rotary.py
# Its index formulas are copied from the templates by hand: keep them in step.
import numpy as np

rng = np.random.default_rng(44)
COPY_THREADS, ROW_BYTES = 256, 128


def rotate_ref(x, s, c, half, inverse=False):
    """x: [rows, D]; s, c: [rows, D/2]. Pairs (2i, 2i+1) or (i, i+D/2)."""
    D = x.shape[1]
    y = x.copy()
    i0 = np.arange(D // 2) if half else 2 * np.arange(D // 2)
    i1 = i0 + D // 2 if half else i0 + 1
    s = -s if inverse else s
    y[:, i0] = x[:, i0] * c - x[:, i1] * s
    y[:, i1] = x[:, i0] * s + x[:, i1] * c
    return y


def piece_at(kRows, row, c):
    """load_rows' byte offset of piece c (16 bytes) of row `row`."""
    return (c >> 3) * (kRows * ROW_BYTES) + row * ROW_BYTES + (((c & 7) ^ (row & 7)) << 4)


def check_rotate_copied(D, kRows, rows, half):
    pieces = D // 8
    step = COPY_THREADS // pieces
    units_per_row = pieces // 2 if half else pieces
    x = np.zeros((kRows, D))
    x[:rows] = rng.standard_normal((rows, D))  # zero-filled past the real rows
    ang = rng.uniform(-3, 3, (kRows, D // 2))
    ang[rows:] = np.nan  # never read: rows past `rows` clamp to the last real one
    s_tab, c_tab = np.sin(ang), np.cos(ang)
    table = np.concatenate([s_tab, c_tab], axis=1)  # [row][sin..., cos...]
    mem = np.full(kRows * D, np.nan)  # shared memory, element-addressed
    seen = np.zeros(kRows * D, int)
    for r in range(kRows):
        for c in range(pieces):
            a = piece_at(kRows, r, c) // 2
            mem[a:a + 8] = x[r, 8 * c:8 * c + 8]
    # each thread reads its piece (piece_load), the partner's through the
    # shuffle, then stores its own: emulate the reads first, as a warp does
    new = {}
    for tid in range(COPY_THREADS):
        row0, c = tid // pieces, tid % pieces
        cc = c % units_per_row
        for i in range(kRows // step):
            row = row0 + i * step
            arow = min(row, rows - 1)  # unit_read of the clamped row
            if half:
                s = table[arow, 8 * cc:8 * cc + 8]
                co = table[arow, D // 2 + 8 * cc:D // 2 + 8 * cc + 8]
            else:
                s = table[arow, 4 * cc:4 * cc + 4]
                co = table[arow, D // 2 + 4 * cc:D // 2 + 4 * cc + 4]
            a = piece_at(kRows, row, c) // 2
            seen[a:a + 8] += 1
            w = mem[a:a + 8]
            if half:
                partner = tid ^ (pieces // 2)
                assert partner // 32 == tid // 32 and partner // pieces == row0
                pc = partner % pieces
                o = mem[piece_at(kRows, row, pc) // 2:piece_at(kRows, row, pc) // 2 + 8]
                low = c < pieces // 2
                x0, x1 = (w, o) if low else (o, w)
                # rotate_halves on words (lo, hi) pairs: element e of the piece
                # is pair 8cc + e
                y0 = x0 * co - x1 * s
                y1 = x0 * s + x1 * co
                new[a] = y0 if low else y1
            else:
                y = w.copy()
                y[0::2] = w[0::2] * co - w[1::2] * s
                y[1::2] = w[0::2] * s + w[1::2] * co
                new[a] = y
    assert (seen == 1).all(), "every piece rotated exactly once"
    for a, v in new.items():
        mem[a:a + 8] = v
    got = np.zeros((kRows, D))
    for r in range(kRows):
        for c in range(pieces):
            a = piece_at(kRows, r, c) // 2
            got[r, 8 * c:8 * c + 8] = mem[a:a + 8]
    want = np.zeros((kRows, D))
    want[:rows] = rotate_ref(x[:rows], s_tab[:rows], c_tab[:rows], half)
    assert np.allclose(got, want, atol=1e-12), (D, kRows, rows, half)


def check_prefetch(D, kRows, rows):
    pieces = D // 8
    step = COPY_THREADS // pieces
    lines = set()
    for tid in range(COPY_THREADS):
        row0, c = tid // pieces, tid % pieces
        if c >= D // 64:
            continue
        for i in range(kRows // step):
            r = row0 + i * step
            if r < rows:
                lines.add((r * D + 64 * c) * 2 // 128)
    want = {(r * D * 2 + b) // 128 for r in range(rows) for b in range(0, D * 2, 128)}
    assert lines == want, (D, rows)


def check_unrotate_part(D, rows, half):
    """The key warpgroup: 4 warps of 16 key rows, one 64-column part hh at a
    time; acc[j][e] is row 16 w + g + 8 (e / 2), column 8j + 2tq + e % 2."""
    halves = D // 64
    g_full = rng.standard_normal((64, D))  # dK' of the tile's 64 keys
    ang = rng.uniform(-3, 3, (64, D // 2))
    s_tab, c_tab = np.sin(ang), np.cos(ang)
    table = np.concatenate([s_tab, c_tab], axis=1)
    words = lambda row, w: (table[row, 2 * w:2 * w + 2], table[row, D // 2 + 2 * w:D // 2 + 2 * w + 2])
    got = np.full((64, D), np.nan)
    for hh in range(halves):
        for w in range(4):
            for lane in range(32):
                g, tq = lane >> 2, lane & 3
                acc = np.zeros((8, 4))
                for j in range(8):
                    for e in range(4):
                        acc[j, e] = g_full[16 * w + g + 8 * (e // 2), 64 * hh + 8 * j + 2 * tq + e % 2]
                for hi in range(2):
                    row = min(16 * w + g + 8 * hi, rows - 1)
                    if half:
                        assert halves == 1
                        for j in range(4):
                            s, c = words(row, 4 * j + tq)
                            for e in range(2):
                                x0, x1 = acc[j, 2 * hi + e], acc[j + 4, 2 * hi + e]
                                acc[j, 2 * hi + e] = x0 * c[e] + x1 * s[e]
                                acc[j + 4, 2 * hi + e] = x1 * c[e] - x0 * s[e]
                    else:
                        for j in range(8):
                            s, c = words(row, 16 * hh + 2 * j + (tq >> 1))
                            sn, cn = s[tq & 1], c[tq & 1]
                            x0, x1 = acc[j, 2 * hi], acc[j, 2 * hi + 1]
                            acc[j, 2 * hi] = x0 * cn + x1 * sn
                            acc[j, 2 * hi + 1] = x1 * cn - x0 * sn
                for j in range(8):
                    for e in range(4):
                        r = 16 * w + g + 8 * (e // 2)
                        if r < rows:  # store_rows keeps rows before nk
                            got[r, 64 * hh + 8 * j + 2 * tq + e % 2] = acc[j, e]
    want = rotate_ref(g_full[:rows], s_tab[:rows], c_tab[:rows], half, inverse=True)
    assert np.allclose(got[:rows], want, atol=1e-12), (D, rows, half)


def main():
    n = 0
    for D in (64, 128):
        for half in (False, True):
            for kRows, rows in ((64, 64), (64, 1), (64, 37), (128, 128), (128, 65), (128, 3)):
                check_rotate_copied(D, kRows, rows, half)
                n += 1
        for rows in (64, 1, 37):
            check_prefetch(D, 64, rows)
            for half in (False, True):
                if half and D == 128:
                    continue  # the plan keeps the half layout at head dim 128 off this kernel
                check_unrotate_part(D, rows, half)
                n += 1
    print(f"broadcast_sm90_rotary: {n} cases, indices as numpy's rotations")


if __name__ == "__main__":
    main()
