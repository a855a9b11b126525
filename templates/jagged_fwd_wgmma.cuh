@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_fwd_wgmma.cuh: what the two sm_90a jagged forwards
@# (jagged_fwd_sm90.cu, jagged_fwd_ws.cu) share: the tiles' swizzled
@# layout and the tile loads (cp.async), a computing thread's rows
@# (row_place) and O's start (clear_out), a KV tile's view (real keys, band
@# diagonals, mask), the two products on wgmma, the online softmax between
@# them and the output's staging and stores.
@# Needs the includer's kHeadDim, kBlockM, kBlockN, kHalves, kKeyHalves,
@#   kRowBytes, kStepOverRows, kChunks, kHasLeft, kHasRight, kLeft, kRight,
@#   kScaleLog2; mma_sm80.cuh (pack2, fast_exp2, exp2_tile, neg_inf), copy_rows.cuh and
@#   wgmma_sm90.cuh. Condition: EXP2_FMA_EVERY (0, or N: softmax_step
@#   takes every N-th 8-key chunk's exponentials on the FMA pipe, exp2_fma;
@#   the includer then defines kExp2FmaEvery = N).
/* ---- begin wgmma forward pieces ----
 * A tile of R rows is kHalves matrices of R rows of 64 elements (128
 * bytes) in the 128-byte swizzle that wgmma reads: 16-byte chunk c of row
 * r sits in matrix c / 8 at chunk (c % 8) ^ (r % 8) of its row. */
__device__ __forceinline__ unsigned chunk_at(int rows, int row, int chunk) {
  return (chunk >> 3) * (rows * kRowBytes) + row * kRowBytes + (((chunk & 7) ^ (row & 7)) << 4);
}

// Start the copy of kRows tile rows from src (row stride `stride`
// elements) into the tile at shared address `dst` by the first kLoaders
// threads (the CTA, or the loading warpgroup); rows past `valid` are
// zero-filled, never read.
template <int kRows, int kLoaders>
__device__ __forceinline__ void load_rows(unsigned dst, const unsigned short *src,
                                          long long stride, int valid) {
  copy_rows<kRows, kChunks, kLoaders>(dst, src, stride, valid,
                                      [](int row, int c) { return chunk_at(kRows, row, c); });
}

// log2 on the special-function unit.
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Keep the registers a running wgmma reads (P, its A operand) live until
// here: placed after the wait, so the compiler cannot reuse them earlier.
__device__ __forceinline__ void keep(const unsigned (&p16)[kBlockN / 16][4]) {
#pragma unroll
  for (int j = 0; j < kBlockN / 16; j++)
    asm volatile("" :: "r"(p16[j][0]), "r"(p16[j][1]), "r"(p16[j][2]), "r"(p16[j][3]));
}

// Where computing thread mt (its index among the computing threads)
// works: its warpgroup, its column of the quad, the warpgroup's first row
// of the tile and its own rows r_lo and r_lo + 8 (the wgmma C layout).
struct RowPlace {
  int wg, tq, wrow0, r_lo;
};
__device__ __forceinline__ RowPlace row_place(int mt) {
  const int wg = mt >> 7, warp = (mt >> 5) & 3, lane = mt & 31;
  return {wg, lane & 3, 64 * wg, 64 * wg + 16 * warp + (lane >> 2)};
}

// O's accumulators at the start: zero.
__device__ __forceinline__ void clear_out(float (&acc)[kHalves][8][4]) {
#pragma unroll
  for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
    for (int n = 0; n < 8; n++) acc[hh][n][0] = acc[hh][n][1] = acc[hh][n][2] = acc[hh][n][3] = 0.f;
}

// What a warpgroup does with one KV tile (first key n0): which columns
// are real, the band's diagonals (key column c of tile row r is visible
// when r + diag_lo <= c <= r + diag_hi, both clamped to where they change
// nothing inside a tile), and whether any element of its `rows` is masked.
// (jagged_fwd_ws.cu takes a turn on every tile, even one none of a
// warpgroup's rows sees: its warpgroups take turns, tile by tile, and with
// SKIP_DEAD it issues less there; jagged_fwd_sm90.cu skips such a tile.)
struct TileView {
  int kv_valid, diag_lo, diag_hi;
  bool mask;
};
__device__ __forceinline__ TileView tile_view(long long n0, long long lk, long long row_diag,
                                              int rows) {
  TileView t;
  t.kv_valid = (int)(lk - n0 < kBlockN ? lk - n0 : kBlockN);
  constexpr long long kFar = kBlockM + kBlockN + 1;
  const long long dhi = row_diag + kRight - n0, dlo = row_diag - kLeft - n0;
  t.diag_hi = (int)(dhi > kFar ? kFar : (dhi < -kFar ? -kFar : dhi));
  t.diag_lo = (int)(dlo > kFar ? kFar : (dlo < -kFar ? -kFar : dlo));
  t.mask = t.kv_valid < kBlockN;
  if constexpr (kHasRight) t.mask = t.mask || t.diag_hi < kBlockN - 1;  // row 0 misses a key
  if constexpr (kHasLeft) t.mask = t.mask || (rows - 1) + t.diag_lo > 0;  // last row misses key 0
  return t;
}

// S = Q K^T for this warpgroup's 64 rows, kKeyHalves parts of 64 keys (or
// parts kNh0 .. kNh1 - 1 alone); committed.
template <int kNh0 = 0, int kNh1 = kKeyHalves>
__device__ __forceinline__ void issue_s(float (&sc)[kKeyHalves][8][4], unsigned q_a, unsigned k_s,
                                        int wrow0) {
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; kk++) {
    const unsigned along = kk % 4 * 32;
    const unsigned a = q_a + kk / 4 * (kBlockM * kRowBytes) + wrow0 * kRowBytes;
#pragma unroll
    for (int nh = kNh0; nh < kNh1; nh++)
      wgmma_ss<0, 0>(sc[nh], sw128_desc(a, along),
                     sw128_desc(k_s + kk / 4 * (kBlockN * kRowBytes) + nh * 64 * kRowBytes, along),
                     kk);
  }
  wgmma_commit();
}

// O += P V (P from registers; V's rows read MN-major, 64 head columns at a
// time); committed.
__device__ __forceinline__ void issue_pv(float (&acc)[kHalves][8][4],
                                         const unsigned (&p16)[kBlockN / 16][4], unsigned v_s) {
#pragma unroll
  for (int j = 0; j < kBlockN / 16; j++)
#pragma unroll
    for (int hh = 0; hh < kHalves; hh++)
      wgmma_rs<1>(acc[hh], p16[j], sw128_desc(v_s + hh * (kBlockN * kRowBytes), j * kStepOverRows),
                  1);
  wgmma_commit();
}

@if EXP2_FMA_EVERY@
// 2^x on the FMA pipe instead of MUFU.EX2, which issues 16 a clock an SM:
// at head dim 64 as many exponentials as the tensor cores compute S
// elements, so that the exponentials alone would bound the forward at the
// matmul rate. x = n + f, n = floor(x) (added to 1.5 * 2^23 rounding
// down, n lands in the low bits), f in [0, 1] (1 only where x - floor(x)
// rounds up, just below an integer); 2^f by a cubic with p(0) = 1
// fitted for relative error (9.5e-5 at most, against bf16's 2^-9 rounding
// of P); n added to the exponent field. x is clamped to -127 first: -inf
// (a masked key) gives 0 exactly, as ex2.approx.ftz does; so does NaN,
// which MUFU.EX2 passes on.
// (In PTX: written in C, ptxas serialized the kernel's wgmmas at head dim
// 64 with 4 query tiles a CTA, C7511; this sequence it does not.)
__device__ __forceinline__ float exp2_fma(float x) {
  float y;
  asm("{\n\t"
      ".reg .f32 c, t, f, p;\n\t"
      ".reg .b32 n, b;\n\t"
      "max.f32 c, %1, 0fC2FE0000;\n\t"         // x = max(x, -127)
      "add.rm.f32 t, c, 0f4B400000;\n\t"       // t = 1.5 * 2^23 + floor(x)
      "sub.rn.f32 f, t, 0f4B400000;\n\t"       // floor(x)
      "sub.rn.f32 f, c, f;\n\t"                // f = x - floor(x)
      "fma.rn.f32 p, f, 0f3D9DFD71, 0f3E691D41;\n\t"  // 7.7143557e-2 f + 2.2765066e-1
      "fma.rn.f32 p, p, f, 0f3F31F026;\n\t"    // .. + 6.9507062e-1
      "fma.rn.f32 p, p, f, 0f3F800000;\n\t"    // .. + 1
      "mov.b32 n, t;\n\t"
      "shl.b32 n, n, 23;\n\t"                  // floor(x) in the exponent field
      "mov.b32 b, p;\n\t"
      "add.s32 b, b, n;\n\t"
      "mov.b32 %0, b;\n\t"
      "}"
      : "=f"(y) : "f"(x));
  return y;
}

// exp2_tile's work on the FMA pipe.
__device__ __forceinline__ void exp2_tile_fma(float (&t)[4], float scale, float off_lo,
                                              float off_hi, float &sum_lo, float &sum_hi) {
  t[0] = exp2_fma(fmaf(t[0], scale, -off_lo));
  t[1] = exp2_fma(fmaf(t[1], scale, -off_lo));
  t[2] = exp2_fma(fmaf(t[2], scale, -off_hi));
  t[3] = exp2_fma(fmaf(t[3], scale, -off_hi));
  sum_lo += t[0] + t[1];
  sum_hi += t[2] + t[3];
}

@endif@
// The online softmax of one tile's S in place (masked, exponentiated), the
// running maxima m and sums l updated, alpha the factor O must be rescaled by.
__device__ __forceinline__ void softmax_step(float (&sc)[kKeyHalves][8][4], float (&m)[2],
                                             float (&l)[2], float (&alpha)[2], const TileView &t,
                                             int r_lo, int tq) {
  if (t.mask) {
#pragma unroll
    for (int nh = 0; nh < kKeyHalves; nh++)
#pragma unroll
      for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = r_lo + (e >= 2 ? 8 : 0);
          const int col = 64 * nh + n * 8 + 2 * tq + (e & 1);
          bool hide = col >= t.kv_valid;
          if constexpr (kHasRight) hide = hide || col > r + t.diag_hi;
          if constexpr (kHasLeft) hide = hide || col < r + t.diag_lo;
          if (hide) sc[nh][n][e] = neg_inf();
        }
  }
  // Tile row maxima (each row lives in the 4 lanes of a quad), new maxima.
  float mx[2] = {m[0], m[1]};
#pragma unroll
  for (int nh = 0; nh < kKeyHalves; nh++)
#pragma unroll
    for (int n = 0; n < 8; n++) {
      mx[0] = fmaxf(mx[0], fmaxf(sc[nh][n][0], sc[nh][n][1]));
      mx[1] = fmaxf(mx[1], fmaxf(sc[nh][n][2], sc[nh][n][3]));
    }
  float off[2];
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
    mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
    // A row that has seen no key yet keeps max -inf: offset 0 then, so
    // that exp2(-inf - offset) is 0, never NaN.
    off[hh] = mx[hh] == neg_inf() ? 0.f : mx[hh] * kScaleLog2;
    alpha[hh] = fast_exp2(m[hh] * kScaleLog2 - off[hh]);  // m = -inf: 0
    m[hh] = mx[hh];
  }
  float rs[2] = {0.f, 0.f};
#pragma unroll
  for (int nh = 0; nh < kKeyHalves; nh++)
#pragma unroll
@if EXP2_FMA_EVERY@
    for (int n = 0; n < 8; n++) {
      // 8-key chunks N - 1, 2N - 1, ... on the FMA pipe
      if ((8 * nh + n) % kExp2FmaEvery == kExp2FmaEvery - 1)
        exp2_tile_fma(sc[nh][n], kScaleLog2, off[0], off[1], rs[0], rs[1]);
      else
        exp2_tile(sc[nh][n], kScaleLog2, off[0], off[1], rs[0], rs[1]);
    }
@else@
    for (int n = 0; n < 8; n++) exp2_tile(sc[nh][n], kScaleLog2, off[0], off[1], rs[0], rs[1]);
@endif@
  l[0] = l[0] * alpha[0] + rs[0];
  l[1] = l[1] * alpha[1] + rs[1];
}

__device__ __forceinline__ void rescale(float (&acc)[kHalves][8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
    for (int n = 0; n < 8; n++) {
      acc[hh][n][0] *= alpha[0];
      acc[hh][n][1] *= alpha[0];
      acc[hh][n][2] *= alpha[1];
      acc[hh][n][3] *= alpha[1];
    }
}

// The S accumulators of keys 16j.. are the A fragment of key slice j.
__device__ __forceinline__ void pack_p(unsigned (&p16)[kBlockN / 16][4],
                                       const float (&sc)[kKeyHalves][8][4]) {
#pragma unroll
  for (int j = 0; j < kBlockN / 16; j++) {
    const int nh = j / 4, n = 2 * (j % 4);
    p16[j][0] = pack2(sc[nh][n][0], sc[nh][n][1]);
    p16[j][1] = pack2(sc[nh][n][2], sc[nh][n][3]);
    p16[j][2] = pack2(sc[nh][n + 1][0], sc[nh][n + 1][1]);
    p16[j][3] = pack2(sc[nh][n + 1][2], sc[nh][n + 1][3]);
  }
}

// The end of this thread's rows r_lo and r_lo + 8: O = acc / l (0 for a
// row that saw no key) into `stage` as plain rows, 16-byte chunks
// swizzled by the row, so that the global stores are 16-byte and
// coalesced; and, where lse is given (training), each real row's
// logsumexp at row start + m0 of head h's (rows total_q apart).
__device__ __forceinline__ void stage_out(const float (&acc)[kHalves][8][4], const float (&m)[2],
                                          const float (&l)[2], unsigned short *stage, float *lse,
                                          int h, long long total_q, long long start,
                                          long long m0, int rows, int r_lo, int tq) {
  unsigned *const stage32 = reinterpret_cast<unsigned *>(stage);
  float inv[2], lrow[2];
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    float t = l[hh];
    t += __shfl_xor_sync(0xffffffffu, t, 1);
    t += __shfl_xor_sync(0xffffffffu, t, 2);
    lrow[hh] = t;
    inv[hh] = t > 0.f ? 1.f / t : 0.f;  // no key: O = 0
  }
  const int r_hi = r_lo + 8;
#pragma unroll
  for (int hh = 0; hh < kHalves; hh++)
#pragma unroll
    for (int n = 0; n < 8; n++) {
      const int c = 8 * hh + n;  // the 16-byte chunk of the row
      stage32[(r_lo * kHeadDim + ((c ^ (r_lo & 7)) * 8) + 2 * tq) / 2] =
          pack2(acc[hh][n][0] * inv[0], acc[hh][n][1] * inv[0]);
      stage32[(r_hi * kHeadDim + ((c ^ (r_hi & 7)) * 8) + 2 * tq) / 2] =
          pack2(acc[hh][n][2] * inv[1], acc[hh][n][3] * inv[1]);
    }
  if (tq == 0 && lse != nullptr) {  // lse is optional (inference)
    // LSE = ln(sum_j exp(scale * s_j)) = (m * scale * log2 e + log2 l) * ln 2.
    constexpr float kLn2 = 0.693147180559945309f;
    float *lse_row = lse + (long long)h * total_q + start + m0;
    if (r_lo < rows)
      lse_row[r_lo] = lrow[0] > 0.f ? (m[0] * kScaleLog2 + fast_log2(lrow[0])) * kLn2 : neg_inf();
    if (r_hi < rows)
      lse_row[r_hi] = lrow[1] > 0.f ? (m[1] * kScaleLog2 + fast_log2(lrow[1])) * kLn2 : neg_inf();
  }
}

// The staged rows (stage_out's, once every writer is past a barrier) to
// out, rows q_stride apart: thread t of kCount (threadIdx.x itself, or an
// index among some threads), 16 bytes a copy.
template <int kCount, typename Index>
__device__ __forceinline__ void store_out(unsigned short *out, long long q_stride,
                                          const unsigned short *stage, int rows, Index t) {
  static_assert(kBlockM * kChunks % kCount == 0, "the copiers cover the tile in whole passes");
#pragma unroll
  for (int it = 0; it < kBlockM * kChunks / kCount; it++) {
    const int idx = t + it * kCount;
    const int row = idx / kChunks, chunk = idx % kChunks;
    if (row < rows)
      *reinterpret_cast<uint4 *>(out + row * q_stride + chunk * 8) =
          *reinterpret_cast<const uint4 *>(stage + row * kHeadDim + ((chunk ^ (row & 7)) * 8));
  }
}
/* ---- end wgmma forward pieces ---- */
