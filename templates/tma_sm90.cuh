@# SPDX-License-Identifier: BSD-3-Clause
@# tma_sm90.cuh: device helpers for loading tiles by TMA (the Tensor Memory
@# Accelerator) on sm_90a: the tensor map type the kernels take as
@# __grid_constant__ parameters (encoded on the host by runtime/tma.c), the
@# tensor copy into shared memory and the mbarrier arrival that expects
@# its bytes. No placeholders, no conditions; sm_90a only.
/* ---- begin device helpers (TMA, sm_90a) ---- */
// A CUtensorMap: 128 opaque bytes, 64-byte aligned, read by the TMA unit
// from the kernel's parameter space (const __grid_constant__).
struct __align__(64) ag_tmap {
  unsigned long long opaque[16];
};
// mbarrier.arrive.expect_tx: one arrival that also expects `bytes` of
// asynchronous writes (complete_tx) in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes)
               : "memory");
}
// cp.async.bulk.tensor.3d (tile mode): the box of `map` at coordinates {c0,
// c1, c2} (innermost first) into shared memory at dst, counted against
// bar's transaction bytes; elements past the tensor's end arrive as zeros.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const ag_tmap *map, unsigned bar, int c0,
                                            int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%3, %4, %5}], [%2];\n"
      :: "r"(dst), "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
/* ---- end device helpers (TMA) ---- */
