@# SPDX-License-Identifier: BSD-3-Clause
@# unpack2.cuh: pack2's inverse, for the kernels that read 16-bit pairs back
@# (block_bwd.cu, block_bwd_chunked.cu, and rotary.cuh in the forward).
@# Placeholders: @MMA_TYPE@ (see mma_sm80.cuh). No conditions.
// The two floats of a packed 16-bit pair (pack2's inverse), `lo` from the
// low half.
__device__ __forceinline__ void unpack2(unsigned pair, float &lo, float &hi) {
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.@MMA_TYPE@ %0, l; cvt.f32.@MMA_TYPE@ %1, h; }"
      : "=f"(lo), "=f"(hi) : "r"(pair));
}
