@# SPDX-License-Identifier: BSD-3-Clause
@# softmax_rows.cuh: the masked softmax numerator of one warp's 16 rows of
@# S = Q K^T, shared by the forward and backward kernels.
@# Needs: kKeyTiles, kBlock, kScaleLog2, Tile, neg_inf(), exp2_tile() (mma_sm80.cuh).
@# Conditions: CAUSAL.
/* ---- begin softmax of one 16-row tile ----
 * This thread holds S at rows r_lo ([0], [1]) and r_hi ([2], [3]), key
 * columns 8n + 2tq and 8n + 2tq + 1 of every n-tile n. Masked keys become
 * -inf; S becomes exp2(S * scale * log2 e - row max), and the row sums come
 * back reduced over the quad of lanes that holds each row. The whole key
 * range is one tile, so there is no running maximum to rescale. */
__device__ __forceinline__ void softmax_rows(float (&s)[kKeyTiles][4], const Tile &t, int r_lo,
                                             int r_hi, int tq, float &l_lo, float &l_hi) {
@if CAUSAL@
  // Mask keys past the sequence end and keys after the query (causal).
  {
@else@
  // Mask keys past the sequence end (only a partial last block has any).
  if (t.rows < kBlock) {
@endif@
#pragma unroll
    for (int n = 0; n < kKeyTiles; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        int col = n * 8 + 2 * tq + (e & 1);
@if CAUSAL@
        if (col >= t.rows || col > (e < 2 ? r_lo : r_hi)) s[n][e] = neg_inf();
@else@
        if (col >= t.rows) s[n][e] = neg_inf();
@endif@
      }
  }

  // Row maxima: each row lives in the 4 lanes of a quad.
  float m_lo = neg_inf(), m_hi = neg_inf();
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) {
    m_lo = fmaxf(m_lo, fmaxf(s[n][0], s[n][1]));
    m_hi = fmaxf(m_hi, fmaxf(s[n][2], s[n][3]));
  }
#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    m_lo = fmaxf(m_lo, __shfl_xor_sync(0xffffffffu, m_lo, d));
    m_hi = fmaxf(m_hi, __shfl_xor_sync(0xffffffffu, m_hi, d));
  }
  // A row with no visible key (only rows past the end) would give NaN.
  const float off_lo = m_lo == neg_inf() ? 0.f : m_lo * kScaleLog2;
  const float off_hi = m_hi == neg_inf() ? 0.f : m_hi * kScaleLog2;

  // exp2(S * scale * log2 e - max); row sums kept per thread until the end.
  l_lo = 0.f;
  l_hi = 0.f;
#pragma unroll
  for (int n = 0; n < kKeyTiles; n++) exp2_tile(s[n], kScaleLog2, off_lo, off_hi, l_lo, l_hi);
#pragma unroll
  for (int d = 1; d < 4; d <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, d);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, d);
  }
}
/* ---- end softmax of one 16-row tile ---- */
