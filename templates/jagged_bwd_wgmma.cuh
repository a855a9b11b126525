@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_wgmma.cuh: the wgmma products of a key-stationary step that
@# both sm_90a jagged backwards issue (jagged_bwd_sm90.cu, jagged_bwd_ws.cu),
@# and the stores of dS^T and of dK, dV. Operands are 64-column matrices of
@# 128-byte rows in the 128-byte swizzle (wgmma_sm90.cuh). Issued, not
@# committed: the caller fences, commits and waits.
@# Needs: kHeadDim, kHalves, kBlockM (64, or 128 at head dim 64), kBlockN, Band,
@#   kKBytes, kQBytes, kRowBytes, kStepOverRows, kScale, sw128_desc(),
@#   wgmma_ss(), wgmma_rs(), pack2(), stmatrix_x4() (bulk_sm90.cuh), and for
@#   kBlockM 128 wgmma_ss_n128().
@# Placeholders: @MMA_TYPE@ (DKV_N128 only). Conditions: DKV_N128 (head
@#   dim 128: keys_product and issue_dkv_n128 of jagged_bwd_dkv_n128.cuh
@#   instead of keys_product and issue_dkv).
/* ---- begin key-stationary step (wgmma) ---- */
// The query columns key rows key0 and key0 + 8 of a tile see, as ranges:
// row r sees [max(0, r - hi), min(mq - 1, r - lo)] (none past nk), so
// column c is seen iff (unsigned)(c - first[h]) < (unsigned)width[h], one
// compare an element (the sm_90a backwards' key-row layout, S^T).
__device__ __forceinline__ void seen_columns(const Band &band, int key0, int mq, int nk,
                                             int (&first)[2], int (&width)[2]) {
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int r = key0 + 8 * hr;
    first[hr] = max(0, r - band.hi);
    const int last = min(mq - 1, r - band.lo);
    width[hr] = r < nk ? max(0, last - first[hr] + 1) : 0;
  }
}

// A key tile's accumulator (dV's or dK's) zeroed.
__device__ __forceinline__ void zero_acc(float (&acc)[kHalves][8][4]) {
#pragma unroll
  for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[hh][n][e] = 0.f;
}

// dV's and dK's accumulators zeroed, at a key tile's start.
__device__ __forceinline__ void zero_dkv(float (&acc_v)[kHalves][8][4],
                                         float (&acc_k)[kHalves][8][4]) {
  zero_acc(acc_v);
  zero_acc(acc_k);
}

// P^T's entries (key rows key0, key0 + 8; kN chunks of 8 query columns)
// that those rows do not see set to 0: the band, the queries past mq, the
// keys past nk (seen_columns). jagged_bwd_ws.cu still writes this loop and
// the next one out itself: through these helpers its machine code changed
// (tools/cubin_code.py, session 42), which no GPU has checked yet.
template <int kN>
__device__ __forceinline__ void mask_unseen(float (&p)[kN][4], const Band &band, int key0, int mq,
                                            int nk, int tq) {
  int first[2], width[2];
  seen_columns(band, key0, mq, nk, first, width);
#pragma unroll
  for (int j = 0; j < kN; j++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int c = 8 * j + 2 * tq + (e & 1);
      if ((unsigned)(c - first[e >> 1]) >= (unsigned)width[e >> 1]) p[j][e] = 0.f;
    }
}

// dS^T = P^T (.) (dP^T - D) and P^T as 16-bit pairs (the A operands of dK
// and dV), D of the step's columns at d_r.
template <int kN>
__device__ __forceinline__ void p_ds_pairs(const float (&p)[kN][4], const float (&dp)[kN][4],
                                           const float *d_r, int tq, unsigned (&p16)[kN][2],
                                           unsigned (&ds16)[kN][2]) {
#pragma unroll
  for (int j = 0; j < kN; j++) {
    const float2 dd = *reinterpret_cast<const float2 *>(d_r + 8 * j + 2 * tq);
    ds16[j][0] = pack2(p[j][0] * (dp[j][0] - dd.x), p[j][1] * (dp[j][1] - dd.y));
    ds16[j][1] = pack2(p[j][2] * (dp[j][2] - dd.x), p[j][3] * (dp[j][3] - dd.y));
    p16[j][0] = pack2(p[j][0], p[j][1]);
    p16[j][1] = pack2(p[j][2], p[j][3]);
  }
}

// d = X Y^T over the head: X this warpgroup's 64 rows (64 wg..) of the
// CTA's kBlockN-row tile at x_a (K or V), Y the step's kBlockM rows at y_a
// (Q or dO); S^T or dP^T, rows keys and columns queries (64 or, with
// 128-row steps, 128: wgmma_n128_sm90.cuh, which only those includers
// include; a template, so that the other branch is never looked up).
template <int kChunks>
__device__ __forceinline__ void keys_times_queries(float (&d)[kChunks][4], unsigned x_a,
                                                   unsigned y_a, int wg) {
  static_assert(kChunks == kBlockM / 8, "a chunk of 8 query columns");
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; kk++) {
    const unsigned along = kk % 4 * 32;
    const unsigned long long a =
        sw128_desc(x_a + kk / 4 * kKBytes / kHalves + wg * 64 * kRowBytes, along);
    const unsigned long long b = sw128_desc(y_a + kk / 4 * kQBytes / kHalves, along);
    if constexpr (kChunks == 16) wgmma_ss_n128(d, a, b, kk);
    else wgmma_ss<0, 0>(d, a, b, kk);
  }
}

// dQ = dS K: A is dS^T at ds_a read MN-major (k over keys), B K's rows
// read MN-major. Head dim 128: every key, this warpgroup's 64 columns;
// head dim 64: this warpgroup's keys, every column, or with 128-row steps
// every key for this warpgroup's 64 queries (dS^T's matrix wg).
__device__ __forceinline__ void issue_dq(float (&c)[8][4], unsigned ds_a, unsigned k_a, int wg) {
  if constexpr (kBlockM == 128) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; kk++)
      wgmma_ss<1, 1>(c, sw128_desc(ds_a + wg * kBlockN * kRowBytes, kk * kStepOverRows),
                     sw128_desc(k_a, kk * kStepOverRows), kk);
  } else if constexpr (kHalves == 2) {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; kk++)
      wgmma_ss<1, 1>(c, sw128_desc(ds_a, kk * kStepOverRows),
                     sw128_desc(k_a + wg * (kKBytes / kHalves), kk * kStepOverRows), kk);
  } else {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
      wgmma_ss<1, 1>(c, sw128_desc(ds_a + wg * 64 * kRowBytes, kk * kStepOverRows),
                     sw128_desc(k_a + wg * 64 * kRowBytes, kk * kStepOverRows), kk);
  }
}

@if DKV_N128@
@include jagged_bwd_dkv_n128.cuh@

@else@
// acc += X^T B, k over the step's queries: X is P^T or dS^T from
// registers (16-bit pairs), B the step's dO or Q rows read MN-major, 64
// columns of the head at a time (dV = P^T dO, dK = dS^T Q).
__device__ __forceinline__ void keys_product(float (&acc)[kHalves][8][4],
                                             const unsigned (&x16)[kBlockM / 8][2],
                                             unsigned b_a) {
#pragma unroll
  for (int j = 0; j < kBlockM / 16; j++) {
    const unsigned a[4] = {x16[2 * j][0], x16[2 * j][1], x16[2 * j + 1][0], x16[2 * j + 1][1]};
#pragma unroll
    for (int hh = 0; hh < kHalves; hh++)
      wgmma_rs<1>(acc[hh], a, sw128_desc(b_a + hh * kQBytes / kHalves, j * kStepOverRows), 1);
  }
}

// dV += P^T dO and dK += dS^T Q.
__device__ __forceinline__ void issue_dkv(float (&acc_v)[kHalves][8][4],
                                          float (&acc_k)[kHalves][8][4],
                                          const unsigned (&p16)[kBlockM / 8][2],
                                          const unsigned (&ds16)[kBlockM / 8][2], unsigned q_a,
                                          unsigned do_a) {
  keys_product(acc_v, p16, do_a);
  keys_product(acc_k, ds16, q_a);
}
@endif@

// A thread's pairs of dS^T [key][query] into the matrices at ds_a (64
// query columns each, kBlockN rows): rows r and r + 8, chunk n (matrix n /
// 8), lane quad tq.
__device__ __forceinline__ void store_ds_t(unsigned ds_a, int r, int n, int tq, unsigned lo,
                                           unsigned hi) {
  ds_a += (n >> 3) * (kBlockN * kRowBytes);
  n &= 7;
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_a + r * kRowBytes + ((n ^ (r & 7)) << 4) + 4 * tq),
               "r"(lo) : "memory");
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ds_a + (r + 8) * kRowBytes +
                                                  ((n ^ ((r + 8) & 7)) << 4) + 4 * tq),
               "r"(hi) : "memory");
}

// A warp's 16 rows of dS^T from row0 (its pairs ds16[n] = rows row0 + lane
// / 4 and + 8, chunk n, the mma C layout) into the matrices at ds_a, laid
// out as store_ds_t lays them, by stmatrix: two chunks a store, lanes 8i..
// 8i + 7 giving the rows of matrix i (rows + 8 for odd i, chunk + 1 for i
// >= 2); 4 stores a thread where store_ds_t takes 16.
template <int kN>
__device__ __forceinline__ void store_ds_t_x4(unsigned ds_a, int row0,
                                              const unsigned (&ds16)[kN][2], int lane) {
  static_assert(kN % 2 == 0, "chunks in pairs");
  const int mi = lane >> 3, rr = lane & 7, row = row0 + rr + 8 * (mi & 1);
#pragma unroll
  for (int j = 0; j < kN; j += 2) {
    const int n = j + (mi >> 1);
    stmatrix_x4(ds_a + (n >> 3) * (kBlockN * kRowBytes) + row * kRowBytes + (((n & 7) ^ rr) << 4),
                ds16[j][0], ds16[j][1], ds16[j + 1][0], ds16[j + 1][1]);
  }
}

// Rows key0 and key0 + 8 of a tile (those before nk) of acc times `mul`,
// rounded, to out (the tile's row 0; rows `stride` elements apart): each
// thread its pairs.
__device__ __forceinline__ void store_key_rows(const float (&acc)[kHalves][8][4], float mul,
                                               unsigned short *out, long long stride, int key0,
                                               int nk, int tq) {
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int row = key0 + 8 * hi;
    if (row >= nk) continue;
    unsigned *const at = reinterpret_cast<unsigned *>(out + row * stride + 2 * tq);
#pragma unroll
    for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
      for (int n = 0; n < 8; n++)
        at[32 * hh + 4 * n] = pack2(acc[hh][n][2 * hi] * mul, acc[hh][n][2 * hi + 1] * mul);
  }
}

// dV, and dK with the scale, of this thread's key rows key0 and key0 + 8
// (of nk real ones) to the tiles at dk, dv + k_row (row stride k_stride):
// store_key_rows for both, a row's dV and dK stores together (through
// store_key_rows twice jagged_bwd_sm90.cu's machine code changed,
// tools/cubin_code.py, session 42, which no GPU has checked yet).
__device__ __forceinline__ void store_dkv(const float (&acc_v)[kHalves][8][4],
                                          const float (&acc_k)[kHalves][8][4],
                                          unsigned short *dk, unsigned short *dv,
                                          long long k_row, long long k_stride, int key0, int nk,
                                          int tq) {
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int row = key0 + 8 * hi;
    if (row >= nk) continue;
    unsigned *const v_out = reinterpret_cast<unsigned *>(dv + k_row + row * k_stride + 2 * tq);
    unsigned *const k_out = reinterpret_cast<unsigned *>(dk + k_row + row * k_stride + 2 * tq);
#pragma unroll
    for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
      for (int n = 0; n < 8; n++) {
        v_out[32 * hh + 4 * n] = pack2(acc_v[hh][n][2 * hi], acc_v[hh][n][2 * hi + 1]);
        k_out[32 * hh + 4 * n] =
            pack2(acc_k[hh][n][2 * hi] * kScale, acc_k[hh][n][2 * hi + 1] * kScale);
      }
  }
}
/* ---- end key-stationary step (wgmma) ---- */
