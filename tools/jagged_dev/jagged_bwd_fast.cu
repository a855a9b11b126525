@# SPDX-License-Identifier: BSD-3-Clause
@# jagged_bwd_fast.cu: the "fast" jagged attention backward: everything of
@# jagged_bwd.cu (included, so its _dq and _dkv are there too, unused) plus
@# three kernels, launched in this order on one stream:
@#   @KERNEL_NAME@_fast_pre: D = rowsum(dO (.) O) into di, and the fp32 dQ
@#     accumulator zeroed; grid (ceil(total_q * heads / (32 * WARPS /
@#     (HEAD_DIM / 8))), 1).
@#   @KERNEL_NAME@_fast_dkv: as _dkv, and dQ = dS K of every tile pair added
@#     to the accumulator with fp32 atomics (NOT deterministic: the order of
@#     the adds varies); grid (batch + total_k / BLOCK_N, kv_heads),
@#     num_tiles = batch + total_k / BLOCK_N; dynamic shared memory
@#     SMEM_BYTES_DKV + 2 * BLOCK_M * BLOCK_N.
@#   @KERNEL_NAME@_fast_post: dQ = scale * accumulator, rounded; grid
@#     (ceil(total_q * heads * HEAD_DIM / 8 / (32 * WARPS)), 1).
@# All take jagged_bwd.cu's parameter list (num_tiles is read by _fast_dkv
@# only). `di` is larger here: [heads, total_q] D, then from float index
@# round_up(heads * total_q, 32) on the [total_q, heads, HEAD_DIM] fp32
@# accumulator. Placeholders: those of jagged_bwd.cu. No conditions.
@include jagged_bwd.cu@

/* ---- begin fast backward ---- */
constexpr int kSmemBytesFast = kSmemBytesDkv + 2 * kDsElems;  // _fast_dkv: dS^T after the rest

// Where the fp32 dQ accumulator starts in `di` (128-byte aligned).
__device__ __forceinline__ long long acc_offset(int heads, long long total_q) {
  return ((long long)heads * total_q + 31) / 32 * 32;
}

extern "C" __global__ void __launch_bounds__(kThreads)
@KERNEL_NAME@_fast_pre(const unsigned short *__restrict__ q, const unsigned short *__restrict__ k,
    const unsigned short *__restrict__ v, const unsigned short *__restrict__ o,
    const unsigned short *__restrict__ dout, const float *__restrict__ lse,
    unsigned short *__restrict__ dq, unsigned short *__restrict__ dk,
    unsigned short *__restrict__ dv, float *__restrict__ di,
    const int *__restrict__ cu_seqlens_q, const int *__restrict__ cu_seqlens_k,
    long long batch, int heads, int kv_heads, long long total_q, long long total_k,
    long long num_tiles) {
  constexpr int kRows = kThreads / kPieces;  // (token, head) rows per CTA
  const long long rows = total_q * heads;
  const long long row = blockIdx.x * (long long)kRows + threadIdx.x / kPieces;  // token * heads + head
  const int piece = threadIdx.x % kPieces;
  float *const acc = di + acc_offset(heads, total_q);
  float a = 0.f;
  if (row < rows) {
    const long long at = row * kHeadDim + piece * 8;
    const uint4 x = __ldg(reinterpret_cast<const uint4 *>(o + at));
    const uint4 y = __ldg(reinterpret_cast<const uint4 *>(dout + at));
    const unsigned xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float x0, x1, y0, y1;
      unpack2(xs[e], x0, x1);
      unpack2(ys[e], y0, y1);
      a = fmaf(x0, y0, a);
      a = fmaf(x1, y1, a);
    }
    reinterpret_cast<float4 *>(acc + at)[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    reinterpret_cast<float4 *>(acc + at)[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int d = 1; d < kPieces; d <<= 1) a += __shfl_xor_sync(0xffffffffu, a, d);
  if (piece == 0 && row < rows) {
    const long long t = row / heads, h = row % heads;
    const float x = lse[h * total_q + t];
    di[h * total_q + t] = x == neg_inf() ? 0.f : a;  // no key: D unused
  }
}

extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
@KERNEL_NAME@_fast_dkv(const unsigned short *__restrict__ q, const unsigned short *__restrict__ k,
    const unsigned short *__restrict__ v, const unsigned short *__restrict__ o,
    const unsigned short *__restrict__ dout, const float *__restrict__ lse,
    unsigned short *__restrict__ dq, unsigned short *__restrict__ dk,
    unsigned short *__restrict__ dv, float *__restrict__ di,
    const int *__restrict__ cu_seqlens_q, const int *__restrict__ cu_seqlens_k,
    long long batch, int heads, int kv_heads, long long total_q, long long total_k,
    long long num_tiles) {
  (void)o;
  (void)dq;
  key_tiles<true>(q, k, v, dout, lse, dk, dv, di, di + acc_offset(heads, total_q), cu_seqlens_q,
                  cu_seqlens_k, batch, heads, kv_heads, total_q, total_k, num_tiles);
}

extern "C" __global__ void __launch_bounds__(kThreads)
@KERNEL_NAME@_fast_post(const unsigned short *__restrict__ q, const unsigned short *__restrict__ k,
    const unsigned short *__restrict__ v, const unsigned short *__restrict__ o,
    const unsigned short *__restrict__ dout, const float *__restrict__ lse,
    unsigned short *__restrict__ dq, unsigned short *__restrict__ dk,
    unsigned short *__restrict__ dv, float *__restrict__ di,
    const int *__restrict__ cu_seqlens_q, const int *__restrict__ cu_seqlens_k,
    long long batch, int heads, int kv_heads, long long total_q, long long total_k,
    long long num_tiles) {
  const long long i = blockIdx.x * (long long)kThreads + threadIdx.x;  // 8-element group
  if (i >= total_q * heads * (kHeadDim / 8)) return;
  const float4 *const acc = reinterpret_cast<const float4 *>(di + acc_offset(heads, total_q)) + 2 * i;
  const float4 x = acc[0], y = acc[1];
  uint4 r;
  r.x = pack2(x.x * kScale, x.y * kScale);
  r.y = pack2(x.z * kScale, x.w * kScale);
  r.z = pack2(y.x * kScale, y.y * kScale);
  r.w = pack2(y.z * kScale, y.w * kScale);
  reinterpret_cast<uint4 *>(dq)[i] = r;
}
/* ---- end fast backward ---- */
