@# SPDX-License-Identifier: BSD-3-Clause
@# bulk_sm90.cuh: device helpers for storing result rows through shared
@# memory on sm_90: stmatrix into staging rows, then bulk copies (the async
@# proxy's cp.async.bulk) from there to global memory. Only inside
@# `#if __CUDA_ARCH__ >= 900`.
/* ---- begin device helpers (stmatrix, bulk copies, sm_90) ---- */

// Four 8x8 16-bit matrices to shared memory (ldmatrix_x4's inverse): lanes
// 8i..8i+7 give the row addresses of matrix i, and r[i] holds this lane's
// pair of it in the mma C layout (row lane / 4, columns 2 (lane % 4) + 0, 1).
__device__ __forceinline__ void stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2,
                                            unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}

// Make this thread's shared-memory writes visible to the bulk copies (the
// async proxy); a barrier must follow before another thread issues them.
__device__ __forceinline__ void fence_to_bulk() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Copy `bytes` (a multiple of 16; both addresses 16-byte aligned) from
// shared to global memory in the background; closed into a group by
// bulk_commit.
__device__ __forceinline__ void bulk_store(void *dst, unsigned src, unsigned bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
               :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Wait until at most `pending` of this thread's committed groups have yet
// to finish reading their shared-memory source (the writes to global
// memory may still be on their way).
template <int pending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(pending) : "memory");
}

// dst[0, bytes / 4) += the fp32 values at shared address src, by the copy
// engine in the background (both 16-byte aligned, bytes a multiple of 16);
// closed into a group by bulk_commit. PTX ISA: cp.reduce.async.bulk.
__device__ __forceinline__ void bulk_reduce_add(float *dst, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               :: "l"(dst), "r"(src), "r"(bytes) : "memory");
}

/* ---- end device helpers (stmatrix, bulk copies) ---- */
