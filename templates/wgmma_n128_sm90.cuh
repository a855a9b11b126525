@# SPDX-License-Identifier: BSD-3-Clause
@# wgmma_n128_sm90.cuh: the 64x128x16 warpgroup MMA (both operands from
@# shared memory, K-major) for the jagged backward's 128-row query steps
@# (jagged_bwd_ws.cu at head dim 64): S^T and dP^T of 64 keys by 128
@# queries. After wgmma_sm90.cuh, whose fragment layout it extends.
@# Placeholders: @MMA_TYPE@.
/* ---- begin device helpers (wgmma 64x128, sm_90a) ---- */
// d (+)= A B, 64x128x16, A and B from shared memory, both K-major (the
// 128-row step's S^T and dP^T): d[n][e] as above for n < 16.
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[16][4], unsigned long long a,
                                              unsigned long long b, int accumulate) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.@MMA_TYPE@.@MMA_TYPE@ "
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0; }\n"
               : WGMMA_D_OPERANDS(d), WGMMA_D_OPERANDS((d + 8))  // d[0..7], d[8..15]
               : "l"(a), "l"(b), "r"(accumulate));
}
// wgmma_hold for the 64x128 result.
__device__ __forceinline__ void wgmma_hold(float (&d)[16][4]) {
#pragma unroll
  for (int n = 0; n < 16; n++) asm volatile("" : WGMMA_TILE_OPERANDS(d[n]) :: "memory");
}
/* ---- end device helpers (wgmma 64x128) ---- */
