# SPDX-License-Identifier: BSD-3-Clause
# Matrix-level simulation of block_bwd.cu's control flow for one tile and head:
# zero-filled rows past the end, NaN (stale) P/dS rows for skipped jobs, the
# phase-2 loop bounds, the causal bounds; against the float64 definitions.
# Verification aid (not run by CI; needs numpy): python3 tools/emulate/bwd_flow.py
import numpy as np
rng = np.random.default_rng(5)
def ref(q, k, v, do, scale, causal):
    n = q.shape[0]
    s = q @ k.T * scale
    mask = np.ones((n, n), bool)
    if causal: mask = np.tril(mask)
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(1, keepdims=True)); p /= p.sum(1, keepdims=True)
    dp = do @ v.T
    ds = p * (dp - (p * dp).sum(1, keepdims=True))
    return scale * ds @ k, scale * ds.T @ q, p.T @ do
def kernel(q, k, v, do, scale, causal, B):
    rows, d = q.shape
    Z = lambda x: np.vstack([x, np.zeros((B - rows, d))])
    Q, K, V, O = map(Z, (q, k, v, do))
    P = np.full((B, B), np.nan); DS = np.full((B, B), np.nan)   # stale
    for row0 in range(0, B, 16):
        if row0 >= rows: continue
        S = Q[row0:row0+16] @ K.T
        r = np.arange(row0, row0 + 16)[:, None]; col = np.arange(B)[None, :]
        masked = (col >= rows) | ((col > r) if causal else False)
        S = np.where(masked, -np.inf, S)
        m = S.max(1, keepdims=True); off = np.where(m == -np.inf, 0, m * scale)
        e = np.exp(S * scale - off); l = e.sum(1, keepdims=True)
        p = e * np.where(l > 0, 1 / l, 0)
        dp = O[row0:row0+16] @ V.T
        dd = (p * dp).sum(1, keepdims=True)
        P[row0:row0+16] = p; DS[row0:row0+16] = p * (dp - dd)
    dq = np.full((B, d), np.nan); dk = dq.copy(); dv = dq.copy()
    tiles = (rows + 15) // 16
    for r0 in range(0, B, 16):
        if r0 >= rows: continue
        fq, kt = (r0 // 16, r0 // 16 + 1) if causal else (0, tiles)
        sl = slice(16 * fq, 16 * tiles)
        dv[r0:r0+16] = P[sl, r0:r0+16].T @ O[sl]
        dk[r0:r0+16] = scale * DS[sl, r0:r0+16].T @ Q[sl]
        dq[r0:r0+16] = scale * DS[r0:r0+16, :16*kt] @ K[:16*kt]
    return dq[:rows], dk[:rows], dv[:rows]
worst = 0
for B in (16, 48, 64, 128):
    for rows in sorted({1, 2, 15, 16, 17, B - 1, B}):
        if rows > B or rows < 1: continue
        for causal in (False, True):
            q, k, v, do = (rng.uniform(-2, 2, (rows, 8)) for _ in range(4))
            got = kernel(q, k, v, do, 0.3, causal, B); want = ref(q, k, v, do, 0.3, causal)
            for g, w in zip(got, want):
                assert not np.isnan(g).any(), (B, rows, causal)
                worst = max(worst, np.abs(g - w).max())
print("flow ok, worst abs diff %.2e" % worst)
