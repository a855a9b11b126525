# SPDX-License-Identifier: BSD-3-Clause
# Emulate the warp-level fragment math of templates/block_bwd.cu (ldmatrix,
# ldmatrix.trans, mma.m16n8k16 row.col, C-layout stores) per PTX ISA semantics,
# with the template's exact index formulas, against numpy products.
# Verification aid (not run by CI; needs numpy): python3 tools/emulate/bwd_fragments.py
# Its index formulas are copied from templates/block_bwd.cu by hand: keep them in step.
import numpy as np
rng = np.random.default_rng(1)

def run(B, D, HPT, h):
    RowElems = HPT * D; Chunks = RowElems // 8; HeadChunks = D // 8
    KeyTiles = B // 8; DimTiles = D // 8; PStride = B + 8
    def swz(row, chunk): return row * RowElems + ((chunk ^ (row & 7)) * 8)
    def ldm(mem, addrs, trans):
        # addrs: 32 element offsets (row starts). returns r[4][32] pairs (lo, hi)
        r = [[None]*32 for _ in range(4)]
        for q in range(4):
            M = np.array([mem[addrs[8*q + i]: addrs[8*q + i] + 8] for i in range(8)])  # 8x8
            for l in range(32):
                if not trans: r[q][l] = (M[l//4, 2*(l%4)], M[l//4, 2*(l%4)+1])
                else: r[q][l] = (M[2*(l%4), l//4], M[2*(l%4)+1, l//4])
        return r
    def mma(c, a, b0, b1):
        # a: list of 4 regs per lane, b0/b1 per lane; c: [4][32] floats
        A = np.zeros((16,16)); Bm = np.zeros((16,8))
        for l in range(32):
            g, t = l//4, l%4
            A[g, 2*t:2*t+2] = a[0][l]; A[g+8, 2*t:2*t+2] = a[1][l]
            A[g, 2*t+8:2*t+10] = a[2][l]; A[g+8, 2*t+8:2*t+10] = a[3][l]
            Bm[2*t:2*t+2, g] = b0[l]; Bm[2*t+8:2*t+10, g] = b1[l]
        Cm = A @ Bm
        for l in range(32):
            g, t = l//4, l%4
            c[0][l] += Cm[g, 2*t]; c[1][l] += Cm[g, 2*t+1]; c[2][l] += Cm[g+8, 2*t]; c[3][l] += Cm[g+8, 2*t+1]
    def c_to_mat(c, ntiles):
        M = np.zeros((16, 8*ntiles))
        for n in range(ntiles):
            for l in range(32):
                g, t = l//4, l%4
                M[g, 8*n+2*t] = c[n][0][l]; M[g, 8*n+2*t+1] = c[n][1][l]
                M[g+8, 8*n+2*t] = c[n][2][l]; M[g+8, 8*n+2*t+1] = c[n][3][l]
        return M
    # tiles: Q, K, V, dO as [B][HPT*D] logical, stored swizzled
    logical = [rng.integers(-4, 5, size=(B, RowElems)).astype(float) for _ in range(4)]
    tile = []
    for L in logical:
        mem = np.zeros(B * RowElems)
        for row in range(B):
            for ch in range(Chunks): mem[swz(row, ch):swz(row, ch)+8] = L[row, ch*8:ch*8+8]
        tile.append(mem)
    Qm, Km, Vm, Om = [L[:, h*D:(h+1)*D] for L in logical]
    c0 = h * HeadChunks
    def rows_times_rows(a_mem, b_mem, row0):
        c = [[np.zeros(32) for _ in range(4)] for _ in range(KeyTiles)]
        for kk in range(D // 16):
            a = ldm(a_mem, [swz(row0 + (l & 15), c0 + 2*kk + (l >> 4)) for l in range(32)], False)
            for n in range(0, KeyTiles, 2):
                b = ldm(b_mem, [swz(n*8 + (l & 7) + ((l >> 4) << 3), c0 + 2*kk + ((l >> 3) & 1)) for l in range(32)], False)
                mma(c[n], a, b[0][:] and b[0], b[1]); mma(c[n+1], a, b[2], b[3])
        return c
    # phase 1 products
    X = rng.integers(-3, 4, size=(B, B)).astype(float)   # stands for P
    Y = rng.integers(-3, 4, size=(B, B)).astype(float)   # stands for dS
    pmem = np.full(B * PStride, np.nan); dsmem = np.full(B * PStride, np.nan)
    for row0 in range(0, B, 16):
        S = c_to_mat(rows_times_rows(tile[0], tile[1], row0), KeyTiles)
        assert np.array_equal(S, Qm[row0:row0+16] @ Km.T), "S"
        dP = c_to_mat(rows_times_rows(tile[3], tile[2], row0), KeyTiles)
        assert np.array_equal(dP, Om[row0:row0+16] @ Vm.T), "dP"
        # C-layout stores of X, Y rows row0.. to the padded layout
        for l in range(32):
            g, tq = l >> 2, l & 3
            r_lo = row0 + g
            for n in range(KeyTiles):
                lo = (r_lo * PStride + n * 8 + 2 * tq) // 2; hi = lo + 8 * PStride // 2
                for mem, M in ((pmem, X), (dsmem, Y)):
                    mem[2*lo:2*lo+2] = M[r_lo, 8*n+2*tq:8*n+2*tq+2]
                    mem[2*hi:2*hi+2] = M[r_lo+8, 8*n+2*tq:8*n+2*tq+2]
    assert np.array_equal(pmem.reshape(B, PStride)[:, :B], X), "P layout"
    def accumulate(trans, x_mem, r0, b_mem, kk0, kk1):
        acc = [[np.zeros(32) for _ in range(4)] for _ in range(DimTiles)]
        for kk in range(kk0, kk1):
            if trans:
                a = ldm(x_mem, [(16*kk + (l & 7) + ((l >> 4) << 3)) * PStride + r0 + (((l >> 3) & 1) << 3) for l in range(32)], True)
            else:
                a = ldm(x_mem, [(r0 + (l & 15)) * PStride + 16*kk + ((l >> 4) << 3) for l in range(32)], False)
            for n in range(0, DimTiles, 2):
                b = ldm(b_mem, [swz(16*kk + (l & 7) + (((l >> 3) & 1) << 3), c0 + n + (l >> 4)) for l in range(32)], True)
                mma(acc[n], a, b[0], b[1]); mma(acc[n+1], a, b[2], b[3])
        return acc
    tiles = B // 16
    for r0 in range(0, B, 16):
        for first in (0, r0 // 16):
            dV = c_to_mat(accumulate(True, pmem, r0, tile[3], first, tiles), DimTiles)
            want = X[16*first:, r0:r0+16].T @ Om[16*first:]
            assert np.array_equal(dV, want), "dV"
            dK = c_to_mat(accumulate(True, dsmem, r0, tile[0], first, tiles), DimTiles)
            assert np.array_equal(dK, Y[16*first:, r0:r0+16].T @ Qm[16*first:]), "dK"
        for kt in (tiles, r0 // 16 + 1):
            dQ = c_to_mat(accumulate(False, dsmem, r0, tile[1], 0, kt), DimTiles)
            assert np.array_equal(dQ, Y[r0:r0+16, :16*kt] @ Km[:16*kt]), "dQ"
        # store_rows staging into V's tile and the 16-byte read-back
        acc = accumulate(False, dsmem, r0, tile[1], 0, tiles)
        stage = tile[2].copy()
        for l in range(32):
            g, tq = l >> 2, l & 3
            for n in range(DimTiles):
                i = swz(r0 + g, c0 + n) + 2*tq; stage[i:i+2] = (acc[n][0][l], acc[n][1][l])
                i = swz(r0 + g + 8, c0 + n) + 2*tq; stage[i:i+2] = (acc[n][2][l], acc[n][3][l])
        out = np.full((16, D), np.nan)
        for it in range(HeadChunks // 2):
            for l in range(32):
                i = l + it * 32; row = r0 + i // HeadChunks; chunk = i % HeadChunks
                out[row - r0, chunk*8:chunk*8+8] = stage[swz(row, c0 + chunk):swz(row, c0 + chunk)+8]
        assert np.array_equal(out, c_to_mat(acc, DimTiles)), "staging"
    print("ok B=%d D=%d heads/tile=%d head=%d" % (B, D, HPT, h))

run(16, 64, 2, 1)
run(32, 64, 1, 0)
run(48, 64, 2, 0)
run(64, 128, 1, 0)
run(32, 64, 2, 1)
