@# SPDX-License-Identifier: BSD-3-Clause
@# rotary_core.cuh: the rotation of rotary embeddings itself, shared by the
@# block kernels (rotary.cuh) and the jagged ones (jagged_rotary.cuh): the
@# angles of computed positions, and the in-place rotation of one unit of
@# work (a 16-byte chunk of a swizzled shared-memory tile row, with its
@# partner in the half layout). The math is rotary.cuh's comment.
@# Uses the includer's kHeadDim, kHeadChunks (16-byte chunks per head),
@# swizzle(row, chunk) (an element's offset in the tile: the layout
@# rotate_unit reads unless given another), pack2() and unpack2().
@# Placeholders: with computed positions @ROTARY_BASE@ and @ROTARY_TURNS@
@#   (see rotary.cuh).
@# Conditions: ROTARY_HALF (the half layout, else interleaved),
@#   ROTARY_COMPUTED (positions computed), ROTARY_TABLE (from a table).
@if ROTARY_HALF@
constexpr int kUnitsPerRow = kHeadChunks / 2;  // units of work per row and head
constexpr int kUnitPairs = 8;  // pairs per unit: a chunk and its partner
@else@
constexpr int kUnitsPerRow = kHeadChunks;  // units of work per row and head
constexpr int kUnitPairs = 4;  // pairs per unit: one chunk
@endif@
@if ROTARY_COMPUTED@
constexpr int kPairs = kHeadDim / 2;  // rotary pairs per head
[[maybe_unused]] constexpr float kRotaryBase = @ROTARY_BASE@;  // the spec's base, for the reader
// kRotaryTurns[i] = kRotaryBase^(-2i / kHeadDim) / (2 pi): pair i's angle per
// position, in turns (its inverse frequency over 2 pi).
__device__ constexpr float kRotaryTurns[kPairs] = {
@ROTARY_TURNS@
};

// sin and cos of an angle given in turns: the whole turns drop exactly
// (rintf), and the rest, at most half a turn, goes to the special-function
// unit in radians.
__device__ __forceinline__ void rotary_sincos(float turns, float &s, float &c) {
  const float r = (turns - rintf(turns)) * 6.283185307e+00f;
  asm("sin.approx.ftz.f32 %0, %1;\n" : "=f"(s) : "f"(r));
  asm("cos.approx.ftz.f32 %0, %1;\n" : "=f"(c) : "f"(r));
}
@endif@
@if ROTARY_TABLE@
@if ROTARY_HALF@

// The 8 floats of a unit's 8 packed sines (or cosines), one table chunk's
// words, in memory order.
__device__ __forceinline__ void unpack(unsigned a, unsigned b, unsigned c, unsigned d,
                                       float (&x)[8]) {
  unpack2(a, x[0], x[1]);
  unpack2(b, x[2], x[3]);
  unpack2(c, x[4], x[5]);
  unpack2(d, x[6], x[7]);
}
@else@

// The 4 floats of a unit's 4 packed sines (or cosines), half a table
// chunk's words, in memory order.
__device__ __forceinline__ void unpack(unsigned a, unsigned b, float (&x)[4]) {
  unpack2(a, x[0], x[1]);
  unpack2(b, x[2], x[3]);
}
@endif@
@endif@

// The tile layout rotate_unit reads unless given another: swizzle().
struct Swizzled {
  static __device__ __forceinline__ int at(int row, int chunk) { return swizzle(row, chunk); }
};

@if ROTARY_HALF@
// Rotate two pairs of the half layout in place: (low of a, low of b) by the
// angle (s0, c0) and (high of a, high of b) by (s1, c1).
__device__ __forceinline__ void rotate_halves(unsigned &a, unsigned &b, float s0, float c0,
                                              float s1, float c1) {
  float a0, a1, b0, b1;
  unpack2(a, a0, a1);
  unpack2(b, b0, b1);
  a = pack2(a0 * c0 - b0 * s0, a1 * c1 - b1 * s1);
  b = pack2(a0 * s0 + b0 * c0, a1 * s1 + b1 * c1);
}

// Rotate unit `chunk` (chunk cc of one head of the tile row, cc <
// kHeadChunks / 2) with its partner kHeadChunks / 2 chunks on, each at its
// own swizzled place (L::at) in row `row` of tile x.
template <typename L = Swizzled>
__device__ __forceinline__ void rotate_unit(unsigned short *x, int row, int chunk,
                                            const float (&s)[kUnitPairs],
                                            const float (&c)[kUnitPairs]) {
  uint4 *pa = reinterpret_cast<uint4 *>(x + L::at(row, chunk));
  uint4 *pb = reinterpret_cast<uint4 *>(x + L::at(row, chunk + kHeadChunks / 2));
  uint4 a = *pa, b = *pb;
  rotate_halves(a.x, b.x, s[0], c[0], s[1], c[1]);
  rotate_halves(a.y, b.y, s[2], c[2], s[3], c[3]);
  rotate_halves(a.z, b.z, s[4], c[4], s[5], c[5]);
  rotate_halves(a.w, b.w, s[6], c[6], s[7], c[7]);
  *pa = a;
  *pb = b;
}
@else@
// Rotate the packed pair (x0 low, x1 high) by the angle (s, c).
__device__ __forceinline__ unsigned rotate_pair(unsigned pair, float s, float c) {
  float x0, x1;
  unpack2(pair, x0, x1);
  return pack2(x0 * c - x1 * s, x0 * s + x1 * c);
}

// Rotate unit `chunk` (chunk cc of one head of the tile row) in row `row`
// of tile x (at L::at): its four words are four pairs.
template <typename L = Swizzled>
__device__ __forceinline__ void rotate_unit(unsigned short *x, int row, int chunk,
                                            const float (&s)[kUnitPairs],
                                            const float (&c)[kUnitPairs]) {
  uint4 *p = reinterpret_cast<uint4 *>(x + L::at(row, chunk));
  uint4 w = *p;
  w.x = rotate_pair(w.x, s[0], c[0]);
  w.y = rotate_pair(w.y, s[1], c[1]);
  w.z = rotate_pair(w.z, s[2], c[2]);
  w.w = rotate_pair(w.w, s[3], c[3]);
  *p = w;
}
@endif@
