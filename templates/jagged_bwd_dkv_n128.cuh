@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_dkv_n128.cuh: dV += P^T dO and dK += dS^T Q at head dim 128
@# as one 64x128x16 warpgroup MMA a k-step (A from registers, B read
@# MN-major across both 64-column matrices of Q or dO) instead of two
@# 64x64x16, as FlashAttention-3's Hopper backward issues them: half the
@# instructions, the A fragments shipped once. Included by
@# jagged_bwd_wgmma.cuh in place of issue_dkv; needs its includer's
@# kBlockM, kQBytes, kStepOverRows and wgmma_sm90.cuh.
@# Placeholders: @MMA_TYPE@. No conditions.
/* ---- begin device helpers (dK, dV as 64x128 products, sm_90a) ---- */
// d (+)= A B, 64x128x16 (PTX ISA: wgmma.mma_async), A from
// registers (16-bit pairs as wgmma_rs takes them), B from shared memory
// MN-major over two 64-column matrices: d[h][n][e] is column 64 h + 8 n +
// 2 tq + (e & 1), two wgmma_rs results side by side.
__device__ __forceinline__ void wgmma_rs_n128_mn(float (&d)[2][8][4], const unsigned (&a)[4],
                                                 unsigned long long b) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.@MMA_TYPE@.@MMA_TYPE@ "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
               "{%64, %65, %66, %67}, %68, p, 1, 1, 1; }\n"
               : WGMMA_D_OPERANDS(d[0]), WGMMA_D_OPERANDS(d[1])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// sw128_desc with a leading byte offset: read MN-major, a B of 128 columns
// spans two 64-element blocks (matrices) along N, `lbo` bytes apart (PTX
// ISA: the wgmma matrix descriptor's leading dimension byte offset).
__device__ __forceinline__ unsigned long long sw128_desc_lbo(unsigned tile, unsigned offset,
                                                             unsigned lbo) {
  return sw128_desc(tile, offset) - ((unsigned long long)1 << 16) +
         ((unsigned long long)(lbo >> 4) << 16);
}

// keys_product (jagged_bwd_wgmma.cuh) with one 64x128 product a k-step:
// B is dO or Q of the step, its two 64-column matrices kQBytes / 2 apart.
__device__ __forceinline__ void keys_product(float (&acc)[2][8][4],
                                             const unsigned (&x16)[kBlockM / 8][2],
                                             unsigned b_a) {
#pragma unroll
  for (int j = 0; j < kBlockM / 16; j++) {
    const unsigned a[4] = {x16[2 * j][0], x16[2 * j][1], x16[2 * j + 1][0], x16[2 * j + 1][1]};
    wgmma_rs_n128_mn(acc, a, sw128_desc_lbo(b_a, j * kStepOverRows, kQBytes / 2));
  }
}

// issue_dkv (jagged_bwd_wgmma.cuh) on those products: dV, then dK.
__device__ __forceinline__ void issue_dkv_n128(float (&acc_v)[2][8][4], float (&acc_k)[2][8][4],
                                               const unsigned (&p16)[kBlockM / 8][2],
                                               const unsigned (&ds16)[kBlockM / 8][2],
                                               unsigned q_a, unsigned do_a) {
  keys_product(acc_v, p16, do_a);
  keys_product(acc_k, ds16, q_a);
}
/* ---- end device helpers (dK, dV as 64x128 products) ---- */
