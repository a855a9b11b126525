@# SPDX-License-Identifier: BSD-3-Clause
@# mma_sm80.cuh: device helpers shared by the mma.sync kernels: shared-memory
@# addresses, 16-byte async copies, ldmatrix, the m16n8k16 tensor-core MMA
@# and a lane's rows of its result (for_lane_rows), packing fp32 pairs into
@# 16-bit pairs, exp2 on the special-function unit (fast_exp2, and
@# exp2_tile over one n-tile of scores).
@# Placeholders: @MMA_TYPE@ (bf16 | f16: PTX type of the inputs),
@#               @PAIR_TYPE@ (bf16x2 | f16x2: PTX type of a packed pair).
/* ---- begin device helpers (mma.sync m16n8k16, cp.async, ldmatrix) ---- */

// 32-bit shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned smem_addr(const void *p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// Copy 16 bytes global -> shared without touching registers. With
// src_bytes == 0 nothing is read and the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most `pending` committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" :: "n"(pending) : "memory");
}

// Four 8x8 16-bit matrices from shared memory; lanes 8i..8i+7 give the row
// addresses of matrix i. The .trans form hands out columns instead of rows.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// d += a * b for one 16x8x16 tile: a 16x16 (4 regs), b 16x8 (2 regs), d fp32.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.@MMA_TYPE@.@MMA_TYPE@.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// f(hi, row) for this lane's rows of a warp's 16-row result in the C layout
// (row row0 + g + 8 hi holds d[n][2 hi] and d[n][2 hi + 1]), those before
// `rows`.
template <class F>
__device__ __forceinline__ void for_lane_rows(int row0, int rows, F &&f) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int hi = 0; hi < 2; hi++) {
    const int row = row0 + g + 8 * hi;
    if (row < rows) f(hi, row);
  }
}

// Round two floats to a packed pair, `lo` in the low half.
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.@PAIR_TYPE@.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// -infinity (no constexpr spelling exists without headers).
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }

// 2^x on the special-function unit.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One n-tile of scores in the mma C layout (t[0], t[1] in row g, t[2],
// t[3] in row g + 8) to exp2(t * scale - off) in place, each row's two
// values added to its sum.
__device__ __forceinline__ void exp2_tile(float (&t)[4], float scale, float off_lo, float off_hi,
                                          float &sum_lo, float &sum_hi) {
  t[0] = fast_exp2(fmaf(t[0], scale, -off_lo));
  t[1] = fast_exp2(fmaf(t[1], scale, -off_lo));
  t[2] = fast_exp2(fmaf(t[2], scale, -off_hi));
  t[3] = fast_exp2(fmaf(t[3], scale, -off_hi));
  sum_lo += t[0] + t[1];
  sum_hi += t[2] + t[3];
}

/* ---- end device helpers ---- */
