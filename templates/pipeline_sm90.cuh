@# SPDX-License-Identifier: BSD-3-Clause
@# pipeline_sm90.cuh: device helpers for warp-specialized kernels on
@# sm_90a: mbarriers that stages of shared memory fill and drain through
@# (completed by the copies themselves or by arrivals), the warpgroup
@# register budgets that let loading warps give registers to computing
@# ones, and named barriers over some of a CTA's warps. No placeholders, no
@# conditions; sm_90a only.
/* ---- begin device helpers (mbarrier pipeline, sm_90a) ----
 * Each comment names the PTX ISA instruction it wraps (PTX ISA 8.x,
 * "Parallel Synchronization and Communication Instructions" for mbarrier,
 * "Data Movement and Conversion Instructions" for cp.async, "Miscellaneous
 * Instructions" for setmaxnreg). A barrier's phase completes when its
 * pending arrivals reach zero; its parity alternates 0, 1, 0, ... */

// mbarrier.init: a barrier in shared memory (8 bytes, 8-byte aligned)
// expecting `count` arrivals a phase. One thread initializes, then a
// fence (below) and a CTA barrier before any use.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
// fence.mbarrier_init: the initializations above, visible to the async
// operations (cp.async's arrivals) that follow.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// cp.async.mbarrier.arrive.noinc: arrive on `bar` once every cp.async
// this thread issued before has landed; .noinc: the arrival is one of the
// count the barrier was initialized with.
__device__ __forceinline__ void mbar_arrive_on_copies(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}
// mbarrier.arrive: one arrival (release semantics: this thread's earlier
// reads and writes of the stage are done before the phase can complete).
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// mbarrier.try_wait.parity: whether the phase of parity `parity` has
// completed, after waiting a while for it (acquire semantics).
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done != 0;
}
// Wait for the phase of parity `parity` to complete.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// setmaxnreg.dec / .inc: the executing warpgroup's registers a thread
// lowered (given back to the SM) or raised (taken from it, waiting until
// they are free); the whole warpgroup executes it. A multiple of 8 in
// [24, 256]; the CTA's budgets must add up to what it was launched with.
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(kRegs));
}
// bar.sync: named barrier `id` (1..15; 0 is __syncthreads') over
// `threads` threads (a multiple of 32), not the CTA.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
}
/* ---- end device helpers (mbarrier pipeline, sm_90a) ---- */
