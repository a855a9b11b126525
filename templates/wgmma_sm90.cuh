@# SPDX-License-Identifier: BSD-3-Clause
@# wgmma_sm90.cuh: device helpers for the warpgroup MMA of sm_90a (wgmma):
@# shared-memory matrix descriptors of the tiles' 128-byte swizzle, the
@# 64x64x16 MMA with both operands in shared memory or A in registers, the
@# fences around it and wgmma_two (a step's S and dP as one group). Leaves
@# WGMMA_TILE_OPERANDS and WGMMA_D_OPERANDS (a result's asm operands)
@# defined for the 64x128 products. Only inside `#ifdef __CUDA_ARCH_FEAT_SM90_ALL`.
@# Placeholders: @MMA_TYPE@ (bf16 | f16: PTX type of the inputs).
/* ---- begin device helpers (wgmma, sm_90a) ----
 * A warpgroup (4 consecutive warps, the first a multiple of 4) computes a
 * 64x64 fp32 result; warp w of the group holds rows 16w..16w+15 in the same
 * registers as 8 mma.sync m16n8 accumulator tiles (d[n][e]: row g + 8(e / 2),
 * column 8n + 2tq + e % 2), so code written around mma.sync fragments reads
 * the result unchanged. Every thread of the group must execute these. */

// Descriptor of a 64-row operand laid out as the tiles are: rows of 128
// bytes (64 elements), the 16-byte chunk c of row r at c ^ (r % 8), the
// tile 1024-byte aligned. That is the 128-byte swizzle: 8-row atoms of
// 1024 bytes, stride (SBO) 1024 between atoms. Read K-major (rows run over
// M or N, the 64 elements over k) or MN-major (rows run over k); either way
// one 64-element block, so the leading offset (LBO) is not needed: it is
// set to 1, which jagged_bwd_dkv_n128.cuh's sw128_desc_lbo subtracts to put
// its own (keep the two in step). `tile`
// is the tile's shared address, `offset` the bytes from there to the first
// element the MMA reads: for K-major operands 32 per k16 step into the row,
// for MN-major 16 rows. The offset is added to the finished descriptor's
// start-address field (16-byte units), so the tile's part is worked out
// once for every step; shared addresses stay below 2^18, so the sum never
// carries out of the field.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned tile, unsigned offset) {
  return ((unsigned long long)((tile & 0x3FFFFu) >> 4) |  // start address, 16-byte units
          (unsigned long long)1 << 16 |                   // LBO: 1 (sw128_desc_lbo's)
          (unsigned long long)(1024 >> 4) << 32 |         // SBO: the next 8 rows
          (unsigned long long)1 << 62) +                  // 128-byte swizzle
         (offset >> 4);
}

// Order this thread's earlier register and shared-memory writes before the
// wgmma that follow (accumulators, A fragments).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// Close the wgmma issued since the last commit into a group.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Wait until at most `pending` committed groups are still running.
template <int pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(pending) : "memory");
}
// One n-tile t of an fp32 result (four registers) as read-write asm operands.
#define WGMMA_TILE_OPERANDS(t) "+f"(t[0]), "+f"(t[1]), "+f"(t[2]), "+f"(t[3])
// After wgmma_wait: pin the accumulators there, so that no read of them is
// moved above the wait (to the compiler the wgmma asm wrote them already).
__device__ __forceinline__ void wgmma_hold(float (&d)[8][4]) {
#pragma unroll
  for (int n = 0; n < 8; n++) asm volatile("" : WGMMA_TILE_OPERANDS(d[n]) :: "memory");
}
// The two products `issue` makes (a backward step's S and dP) as one group,
// waited for, their accumulators a and b pinned.
template <class F>
__device__ __forceinline__ void wgmma_two(float (&a)[8][4], float (&b)[8][4], F &&issue) {
  wgmma_fence();
  issue();
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_hold(a);
  wgmma_hold(b);
}
// Make this thread's generic-proxy shared-memory writes (st.shared,
// cp.async) visible to the async proxy that wgmma reads through; a barrier
// must follow before another thread's wgmma reads them.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The 64x64 fp32 result d (eight n-tiles of four registers) as the asm
// operands %0..%31 of both MMAs below, and the list of those registers.
// The 64x128 products (wgmma_n128_sm90.cuh, jagged_bwd_dkv_n128.cuh) pass
// two such halves, %0..%63.
#define WGMMA_D_OPERANDS(d)                                                         \
  WGMMA_TILE_OPERANDS(d[0]), WGMMA_TILE_OPERANDS(d[1]), WGMMA_TILE_OPERANDS(d[2]),  \
  WGMMA_TILE_OPERANDS(d[3]), WGMMA_TILE_OPERANDS(d[4]), WGMMA_TILE_OPERANDS(d[5]),  \
  WGMMA_TILE_OPERANDS(d[6]), WGMMA_TILE_OPERANDS(d[7])
#define WGMMA_D_LIST                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "      \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"

// d (+)= A B, 64x64x16, A and B from shared memory. kTransA / kTransB: 0
// for K-major operands, 1 for MN-major (16-bit types only). `accumulate` 0
// overwrites d.
template <int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], unsigned long long a,
                                         unsigned long long b, int accumulate) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.@MMA_TYPE@.@MMA_TYPE@ "
               WGMMA_D_LIST ", %32, %33, p, 1, 1, %35, %36; }\n"
               : WGMMA_D_OPERANDS(d)
               : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// d (+)= A B, 64x64x16, A from registers (this warp's 16 rows in the
// mma.sync A fragment layout), B from shared memory (kTransB as above).
template <int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[8][4], const unsigned (&a)[4],
                                         unsigned long long b, int accumulate) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.@MMA_TYPE@.@MMA_TYPE@ "
               WGMMA_D_LIST ", {%32, %33, %34, %35}, %36, p, 1, 1, %38; }\n"
               : WGMMA_D_OPERANDS(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate),
                 "n"(kTransB));
}
#undef WGMMA_D_LIST

// Keep registers an asynchronous wgmma reads (its A operand, as 16-bit
// pairs) live until here: placed after the wait, so the compiler cannot
// reuse them earlier.
template <int kN>
__device__ __forceinline__ void keep(const unsigned (&x)[kN][2]) {
#pragma unroll
  for (int n = 0; n < kN; n++) asm volatile("" :: "r"(x[n][0]), "r"(x[n][1]));
}

/* ---- end device helpers (wgmma) ---- */
