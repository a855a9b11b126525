# SPDX-License-Identifier: BSD-3-Clause
# Emulate the index math of the rotary embeddings in templates/rotary.cuh and
# templates/rotary_load.cuh with numpy: the swizzled placement of Q, K, V and
# table rows in shared memory (load_tile, load_table), the prologue's units of
# work (rotate_tile, unit_angles, rotate_unit: a half-layout pair spans chunk cc
# and chunk cc + kHeadChunks / 2 of a row, each swizzled by the row) and the
# backward's inverse rotation of mma C-layout fragments in registers
# (unrotate_rows, pair_angle, two_angles), against numpy rotations of the
# unswizzled tensors. Float64 throughout: this checks indices, not rounding.
# Verification aid (not run by CI; needs numpy):
#   python3 tools/emulate/rotary_pairs.py
# Its index formulas are copied from the templates by hand: keep them in step.
import numpy as np

rng = np.random.default_rng(7)


def rotate_ref(x, s, c, half, inverse=False):
    """x: [rows, D] one head; s, c: [rows, D/2]. Pairs (2i, 2i+1) or (i, i+D/2)."""
    D = x.shape[1]
    y = x.copy()
    i0 = np.arange(D // 2) if half else 2 * np.arange(D // 2)
    i1 = i0 + D // 2 if half else i0 + 1
    s = -s if inverse else s
    y[:, i0] = x[:, i0] * c - x[:, i1] * s
    y[:, i1] = x[:, i0] * s + x[:, i1] * c
    return y


def run(B, D, HPT, threads, rows, heads, half, table_mode, rotate_v):
    RowElems = HPT * D; Chunks = RowElems // 8; HeadChunks = D // 8
    TileElems = B * RowElems; TableElems = B * D
    StageElems = 3 * TileElems + (TableElems if table_mode else 0)
    DimTiles = D // 8; Pairs = D // 2

    def swizzle(row, chunk): return row * RowElems + ((chunk ^ (row & 7)) * 8)
    def table_at(row, chunk): return row * D + ((chunk ^ (row & 7)) * 8)

    # Logical tiles: rows past `rows` and heads past `heads` are zero (as
    # load_tile's zero-fill leaves them).
    logical = []
    for m in range(3):
        L = rng.standard_normal((B, RowElems))
        L[rows:, :] = 0
        L[:, heads * D:] = 0
        logical.append(L)
    ang = rng.uniform(-np.pi, np.pi, size=(B, Pairs))
    ang[rows:, :] = 0
    S, C = np.sin(ang), np.cos(ang)
    S[rows:, :] = 0; C[rows:, :] = 0  # zero-filled table rows
    table_logical = np.concatenate([S, C], axis=1)  # [B, D]: sin | cos

    # load_tile / load_table: chunk placement.
    stage = np.full(StageElems, np.nan)
    for m in range(3):
        for row in range(B):
            for ch in range(Chunks):
                a = m * TileElems + swizzle(row, ch)
                stage[a:a + 8] = logical[m][row, ch * 8:ch * 8 + 8]
    table_base = StageElems - TableElems
    if table_mode:
        loads = B * HeadChunks
        for it in range((loads + threads - 1) // threads):
            for tid in range(threads):
                i = tid + it * threads
                if loads % threads != 0 and i >= loads: break
                row, chunk = i // HeadChunks, i % HeadChunks
                a = table_base + table_at(row, chunk)
                stage[a:a + 8] = table_logical[row, chunk * 8:chunk * 8 + 8]
        assert not np.isnan(stage[table_base:]).any(), "table coverage"

    # rotate_tile
    UnitsPerRow = HeadChunks // 2 if half else HeadChunks
    UnitPairs = 8 if half else 4
    UnitRows = threads // UnitsPerRow
    assert threads % UnitsPerRow == 0
    touched = np.zeros(StageElems, dtype=int)
    tensors = [0, 1, 2] if rotate_v else [0, 1]

    def unit_angles(row, cc):
        t = table_base
        if half:
            sw = stage[t + table_at(row, cc): t + table_at(row, cc) + 8]
            cw = stage[t + table_at(row, cc + HeadChunks // 2): t + table_at(row, cc + HeadChunks // 2) + 8]
        else:
            h4 = 4 * (cc & 1)
            sw = stage[t + table_at(row, cc >> 1) + h4: t + table_at(row, cc >> 1) + h4 + 4]
            cw = stage[t + table_at(row, (cc >> 1) + HeadChunks // 2) + h4:
                       t + table_at(row, (cc >> 1) + HeadChunks // 2) + h4 + 4]
        return sw.copy(), cw.copy()

    for tid in range(threads):
        cc = tid % UnitsPerRow
        row = tid // UnitsPerRow
        while row < rows:
            if table_mode:
                s, c = unit_angles(row, cc)
            else:  # computed: the same angles, indexed by pair 8cc + j / 4cc + j
                s = S[row, UnitPairs * cc: UnitPairs * cc + UnitPairs]
                c = C[row, UnitPairs * cc: UnitPairs * cc + UnitPairs]
            for h in range(HPT):
                for m in tensors:
                    x = m * TileElems
                    chunk = h * HeadChunks + cc
                    if half:
                        pa = x + swizzle(row, chunk); pb = x + swizzle(row, chunk + HeadChunks // 2)
                        a = stage[pa:pa + 8].copy(); b = stage[pb:pb + 8].copy()
                        # word j = elements 2j (lo), 2j + 1 (hi); rotate_halves(a.w, b.w, s[2j], c[2j], s[2j+1], c[2j+1])
                        for j in range(4):
                            for e, k in ((0, 2 * j), (1, 2 * j + 1)):
                                a0, b0 = a[2 * j + e], b[2 * j + e]
                                stage[pa + 2 * j + e] = a0 * c[k] - b0 * s[k]
                                stage[pb + 2 * j + e] = a0 * s[k] + b0 * c[k]
                        touched[pa:pa + 8] += 1; touched[pb:pb + 8] += 1
                    else:
                        p = x + swizzle(row, chunk)
                        w = stage[p:p + 8].copy()
                        for j in range(4):  # word j is pair 4cc + j
                            x0, x1 = w[2 * j], w[2 * j + 1]
                            stage[p + 2 * j] = x0 * c[j] - x1 * s[j]
                            stage[p + 2 * j + 1] = x0 * s[j] + x1 * c[j]
                        touched[p:p + 8] += 1
            row += UnitRows

    # Every element of a rotated tensor's valid rows exactly once; nothing else.
    for m in range(3):
        want = 1 if m in tensors else 0
        for row in range(B):
            for ch in range(Chunks):
                a = m * TileElems + swizzle(row, ch)
                assert (touched[a:a + 8] == (want if row < rows else 0)).all(), "coverage"
    assert touched[table_base:].sum() == 0 if table_mode else True

    # Compare with numpy rotations of the unswizzled heads.
    for m in range(3):
        got = np.zeros((B, RowElems))
        for row in range(B):
            for ch in range(Chunks):
                a = m * TileElems + swizzle(row, ch)
                got[row, ch * 8:ch * 8 + 8] = stage[a:a + 8]
        for h in range(HPT):
            x = logical[m][:, h * D:(h + 1) * D]
            want = rotate_ref(x, S, C, half) if m in tensors else x
            assert np.allclose(got[:, h * D:(h + 1) * D], want, atol=1e-12), ("rotation", m, h)

    # unrotate_rows: 16 gradient rows of a job in the C layout.
    for row0 in range(0, B, 16):
        G = rng.standard_normal((16, D))
        acc = np.zeros((DimTiles, 4, 32))
        for lane in range(32):
            g, tq = lane >> 2, lane & 3
            for n in range(DimTiles):
                for e in range(4):
                    acc[n, e, lane] = G[g + 8 * (e >> 1), 8 * n + 2 * tq + (e & 1)]

        def angle(row, i):
            if table_mode:  # pair_angle: one element each of sin and cos
                t = table_base
                return (stage[t + table_at(row, i >> 3) + (i & 7)],
                        stage[t + table_at(row, (i >> 3) + HeadChunks // 2) + (i & 7)])
            return S[row, i], C[row, i]

        for lane in range(32):
            g, tq = lane >> 2, lane & 3
            for hi in range(2):
                row = row0 + g + 8 * hi
                if half:
                    for n in range(DimTiles // 2):
                        i = 8 * n + 2 * tq
                        if table_mode:  # two_angles: one 32-bit word of each, i even
                            t = table_base
                            sw = stage[t + table_at(row, i >> 3) + (i & 7): t + table_at(row, i >> 3) + (i & 7) + 2]
                            cw = stage[t + table_at(row, (i >> 3) + HeadChunks // 2) + (i & 7):
                                       t + table_at(row, (i >> 3) + HeadChunks // 2) + (i & 7) + 2]
                            assert (i & 7) % 2 == 0
                        else:
                            sw, cw = S[row, i:i + 2], C[row, i:i + 2]
                        for e in range(2):
                            x0 = acc[n, 2 * hi + e, lane]; x1 = acc[n + DimTiles // 2, 2 * hi + e, lane]
                            acc[n, 2 * hi + e, lane] = x0 * cw[e] + x1 * sw[e]
                            acc[n + DimTiles // 2, 2 * hi + e, lane] = x1 * cw[e] - x0 * sw[e]
                else:
                    for n in range(DimTiles):
                        s, c = angle(row, 4 * n + tq)
                        x0 = acc[n, 2 * hi, lane]; x1 = acc[n, 2 * hi + 1, lane]
                        acc[n, 2 * hi, lane] = x0 * c + x1 * s
                        acc[n, 2 * hi + 1, lane] = x1 * c - x0 * s
        got = np.zeros((16, D))
        for lane in range(32):
            g, tq = lane >> 2, lane & 3
            for n in range(DimTiles):
                for e in range(4):
                    got[g + 8 * (e >> 1), 8 * n + 2 * tq + (e & 1)] = acc[n, e, lane]
        want = rotate_ref(G, S[row0:row0 + 16], C[row0:row0 + 16], half, inverse=True)
        assert np.allclose(got, want, atol=1e-12), ("unrotate", row0)

        # The epilogue's table reads: for each n, the warp's 32 lanes (8 rows
        # x 4 threads of a quad) read words in distinct banks, or the same
        # word: one wavefront, no conflict.
        if table_mode:
            for n in range(DimTiles // 2 if half else DimTiles):
                words = {}
                for lane in range(32):
                    g, tq = lane >> 2, lane & 3
                    i = 8 * n + 2 * tq if half else 4 * n + tq
                    for col in (i, Pairs + i):  # sin, cos
                        el = table_base + table_at(row0 + g, col >> 3) + (col & 7)
                        word = (el * 2) // 4
                        words.setdefault((word % 32, col >= Pairs), set()).add(word)
                assert all(len(w) == 1 for w in words.values()), ("bank conflict", n)

    print("ok B=%d D=%d heads/tile=%d threads=%d rows=%d heads=%d %s %s%s" % (
        B, D, HPT, threads, rows, heads, "half" if half else "interleaved",
        "table" if table_mode else "computed", " +v" if rotate_v else ""))


for half in (False, True):
    for table_mode in (True, False):
        run(64, 128, 1, 128, 64, 1, half, table_mode, True)
        run(64, 64, 2, 128, 61, 1, half, table_mode, False)   # partial block, last head missing
        run(16, 64, 2, 32, 16, 2, half, table_mode, True)
        run(48, 128, 1, 96, 33, 1, half, table_mode, False)
        run(128, 64, 1, 256, 127, 1, half, table_mode, True)
