// SPDX-License-Identifier: BSD-3-Clause
// bwd_test.cu: standalone GPU test and timing harness for the jagged
// attention backward (templates/jagged_bwd.cu). A dev tool: the variants
// come from tools/jagged_dev/bwd_gen.py (build/jagged_bwd/variants.cuh).
//
// build: python3 tools/jagged_dev/bwd_gen.py build/jagged_bwd/variants.cuh
//        gcc -O2 -std=c11 -Iinclude -Ireference -c reference/{reference,jagged_reference,jagged_bwd_reference}.c
//        nvcc -O3 -arch=sm_90a -Ibuild/jagged_bwd -Iinclude -Ireference tools/jagged_dev/bwd_test.cu *.o
// run:   bwd_test check | time | small VARIANT
#include <cuda.h>  // CUtensorMap and its encoder's types (the encoder comes through the runtime)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <ctime>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "jagged_bwd_reference.h"
}

typedef void (*KFn)(const unsigned short *, const unsigned short *, const unsigned short *,
                    const unsigned short *, const unsigned short *, const float *,
                    unsigned short *, unsigned short *, unsigned short *, float *, const int *,
                    const int *, long long, int, int, long long, long long, long long);
struct Variant {
  const char *name;
  int bf16, dim, causal, window, left, right, block, threads, smem_dq, smem_dkv;
  KFn dq, dkv;
  int fast;
  KFn pre, fdkv, post;  // the fast variant's kernels
  // TMA variants (templates/jagged_bwd_ws.cu under TMA_QDO): the rows of
  // the q and dout maps' boxes; their kernels take the two maps last, so
  // they are launched untyped (launch_tma)
  int tma_rows;
  // FUSED_DQ variants ("ws-fdq"): _kv rounds dQ itself (no _dq launched)
  // and the workspace holds the tiles' add counters (2 a row at head dim
  // 128) after the tile counter
  int fused;
};

#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(2);                                                                     \
    }                                                                              \
  } while (0)

// The tensor map of a [total_q, heads, dim] 16-bit tensor at `ptr` (rows of
// heads * dim elements) as jagged_bwd_ws.cu's TMA path reads it, as
// runtime/tma.c encodes it: dimensions {dim, heads, total_q}, box {64, 1,
// box_rows}, 128-byte swizzle, zeros out of bounds.
static void encode_rows_map(CUtensorMap *m, const void *ptr, long long tq, int heads, int dim,
                            int box_rows) {
  typedef CUresult (*Encode)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                             const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                             const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                             CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = nullptr;
  if (!encode) {
    cudaDriverEntryPointQueryResult qr;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000,
                                        cudaEnableDefault, &qr));
    if (!encode || qr != cudaDriverEntryPointSuccess) {
      fprintf(stderr, "cuTensorMapEncodeTiled not found (%d)\n", (int)qr);
      exit(2);
    }
  }
  const cuuint64_t dims[3] = {(cuuint64_t)dim, (cuuint64_t)heads, (cuuint64_t)std::max(tq, 1LL)};
  const cuuint64_t strides[2] = {(cuuint64_t)dim * 2, (cuuint64_t)heads * dim * 2};  // bytes
  const cuuint32_t box[3] = {64, 1, (cuuint32_t)box_rows}, elem[3] = {1, 1, 1};
  const CUresult r = encode(m, CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, const_cast<void *>(ptr), dims,
                            strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled: error %d\n", (int)r);
    exit(2);
  }
}
#include "variants.cuh"

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd() {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double urand() { return (rnd() >> 11) * (1.0 / 9007199254740992.0); }
static double nrand() {
  double u = urand(), v = urand();
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static uint16_t to16(int bf16, double x) {
  if (bf16) {
    __nv_bfloat16 h = __float2bfloat16_rn((float)x);
    uint16_t r;
    memcpy(&r, &h, 2);
    return r;
  }
  __half h = __float2half_rn((float)x);
  uint16_t r;
  memcpy(&r, &h, 2);
  return r;
}
static double from16(int bf16, uint16_t u) {
  if (bf16) {
    __nv_bfloat16 h;
    memcpy(&h, &u, 2);
    return (double)__bfloat162float(h);
  }
  __half h;
  memcpy(&h, &u, 2);
  return (double)__half2float(h);
}

struct Dev {
  unsigned short *q, *k, *v, *o, *dout, *dq, *dk, *dv;
  float *lse, *di;
  int *cu_q, *cu_k;
};

// One kernel of the fast backward with the jagged parameters, and for a
// TMA variant the maps of q and dout after them (launched untyped: its
// entry points take two more parameters than KFn says).
static void launch_one(const Variant &V, KFn f, dim3 grid, int threads, int smem, cudaStream_t st,
                       const Dev &d, long long batch, int heads, int kv_heads, long long tq,
                       long long tk, long long items) {
  if (!V.tma_rows) {
    f<<<grid, threads, smem, st>>>(d.q, d.k, d.v, d.o, d.dout, d.lse, d.dq, d.dk, d.dv, d.di,
                                   d.cu_q, d.cu_k, batch, heads, kv_heads, tq, tk, items);
    CK(cudaGetLastError());
    return;
  }
  static const void *lq, *ld;  // the maps, encoded again when the tensors change
  static long long ltq = -1;
  static int lh, lrows;
  static CUtensorMap mq, md;
  if (d.q != lq || d.dout != ld || tq != ltq || heads != lh || V.tma_rows != lrows) {
    encode_rows_map(&mq, d.q, tq, heads, V.dim, V.tma_rows);
    encode_rows_map(&md, d.dout, tq, heads, V.dim, V.tma_rows);
    lq = d.q, ld = d.dout, ltq = tq, lh = heads, lrows = V.tma_rows;
  }
  void *args[] = {(void *)&d.q,  (void *)&d.k,    (void *)&d.v,        (void *)&d.o,
                  (void *)&d.dout, (void *)&d.lse, (void *)&d.dq,      (void *)&d.dk,
                  (void *)&d.dv, (void *)&d.di,   (void *)&d.cu_q,     (void *)&d.cu_k,
                  &batch,        &heads,          &kv_heads,           &tq,
                  &tk,           &items,          &mq,                 &md};
  CK(cudaLaunchKernel((const void *)f, grid, dim3(threads), args, smem, st));
}

static void launch(const Variant &V, const Dev &d, long long batch, int heads, int kv_heads,
                   long long tq, long long tk, cudaStream_t st, int which = 3) {
  const long long nq = batch + tq / V.block, nk = batch + tk / V.block;
  if (V.fast == 2) {  // jagged_bwd_sm90.cu: _pre, _kv (BLOCK_N keys a CTA), _dq
    const long long rows = tq * heads, per = 256 * 8 / V.dim;
    const long long groups = tq * heads * (V.dim / 8);
    if (which & 1)
      launch_one(V, V.pre, dim3((unsigned)std::max(1LL, (rows + per - 1) / per)), 256, 0, st, d,
                 batch, heads, kv_heads, tq, tk, 0);
    // "ws-" variants are persistent (jagged_bwd_ws.cu's kTileCounter): a
    // CTA an SM, the counter zeroed by _pre (here too when _pre is not run)
    const bool persistent = !strncmp(V.name, "ws-", 3);
    if ((which & 2) && persistent && !(which & 1))  // the tile counter (and the add counters)
      CK(cudaMemsetAsync(d.di + (tq * heads + 3) / 4 * 4 + tq * heads * V.dim, 0,
                         8 + (V.fused ? 8 * tq * heads : 0), st));
    if (which & 2) {
      static int sms = 0;
      if (!sms) CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      launch_one(V, V.fdkv, persistent ? dim3((unsigned)sms) : dim3((unsigned)nk, kv_heads),
                 V.threads, V.smem_dkv, st, d, batch, heads, kv_heads, tq, tk, nk);
    }
    if ((which & 1) && !V.fused)
      launch_one(V, V.post, dim3((unsigned)std::max(1LL, (groups + 255) / 256)), 256, 0, st, d,
                 batch, heads, kv_heads, tq, tk, 0);
    return;
  }
  if (V.fast) {
    const long long rows = tq * heads, per = V.threads / (V.dim / 8);
    const long long groups = tq * heads * (V.dim / 8);
    if (which & 1) {
      V.pre<<<dim3((unsigned)std::max(1LL, (rows + per - 1) / per)), V.threads, 0, st>>>(
          d.q, d.k, d.v, d.o, d.dout, d.lse, d.dq, d.dk, d.dv, d.di, d.cu_q, d.cu_k, batch,
          heads, kv_heads, tq, tk, 0);
      CK(cudaGetLastError());
    }
    if (which & 2) {
      V.fdkv<<<dim3((unsigned)nk, kv_heads), V.threads, V.smem_dkv + 2 * V.block * V.block, st>>>(
          d.q, d.k, d.v, d.o, d.dout, d.lse, d.dq, d.dk, d.dv, d.di, d.cu_q, d.cu_k, batch,
          heads, kv_heads, tq, tk, nk);
      CK(cudaGetLastError());
    }
    if (which & 1) {
      V.post<<<dim3((unsigned)std::max(1LL, (groups + V.threads - 1) / V.threads)), V.threads, 0,
               st>>>(d.q, d.k, d.v, d.o, d.dout, d.lse, d.dq, d.dk, d.dv, d.di, d.cu_q, d.cu_k,
                     batch, heads, kv_heads, tq, tk, 0);
      CK(cudaGetLastError());
    }
    return;
  }
  if (which & 1) {
    V.dq<<<dim3((unsigned)nq, heads), V.threads, V.smem_dq, st>>>(
        d.q, d.k, d.v, d.o, d.dout, d.lse, d.dq, d.dk, d.dv, d.di, d.cu_q, d.cu_k, batch, heads,
        kv_heads, tq, tk, nq);
    CK(cudaGetLastError());
  }
  if (which & 2) {
    V.dkv<<<dim3((unsigned)nk, kv_heads), V.threads, V.smem_dkv, st>>>(
        d.q, d.k, d.v, d.o, d.dout, d.lse, d.dq, d.dk, d.dv, d.di, d.cu_q, d.cu_k, batch, heads,
        kv_heads, tq, tk, nk);
    CK(cudaGetLastError());
  }
}

static void set_attrs() {
  for (int i = 0; i < kNumVariants; i++) {
    if (kVariants[i].fast == 2) {
      CK(cudaFuncSetAttribute(kVariants[i].fdkv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kVariants[i].smem_dkv));
      continue;
    }
    CK(cudaFuncSetAttribute(kVariants[i].dq, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            kVariants[i].smem_dq));
    CK(cudaFuncSetAttribute(kVariants[i].dkv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            kVariants[i].smem_dkv));
    if (kVariants[i].fast)
      CK(cudaFuncSetAttribute(kVariants[i].fdkv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kVariants[i].smem_dkv + 2 * kVariants[i].block * kVariants[i].block));
  }
}

template <class T>
static T *dalloc(size_t n) {
  T *p;
  CK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

static double rel(const std::vector<uint16_t> &got, const std::vector<double> &ref, int bf16,
                  long long *nan_count) {
  double num = 0, den = 0;
  long long nans = 0;
  for (size_t i = 0; i < ref.size(); i++) {
    const double g = from16(bf16, got[i]);
    if (!std::isfinite(g)) {
      nans++;
      continue;
    }
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  *nan_count = nans;
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int failures = 0;

// One check: random inputs, float64 reference, NaN-poisoned outputs.
// reps > 1: also run the kernels reps times and compare bitwise.
static void check(int vi, const std::vector<int> &lq, const std::vector<int> &lk, int heads,
                  int kv_heads, int reps, const char *label) {
  const Variant &V = kVariants[vi];
  const int D = V.dim, bf16 = V.bf16;
  const long long batch = (long long)lq.size();
  std::vector<int> cu_q(batch + 1, 0), cu_k(batch + 1, 0);
  for (long long b = 0; b < batch; b++) {
    cu_q[b + 1] = cu_q[b] + lq[b];
    cu_k[b + 1] = cu_k[b] + lk[b];
  }
  const long long tq = cu_q[batch], tk = cu_k[batch];
  const size_t nq = (size_t)tq * heads * D, nk = (size_t)tk * kv_heads * D;
  std::vector<uint16_t> hq(nq), hk(nk), hv(nk), hdo(nq), ho(nq);
  std::vector<double> fq(nq), fk(nk), fv(nk), fdo(nq);
  auto fill = [&](std::vector<uint16_t> &h, std::vector<double> &f, double sd) {
    for (size_t i = 0; i < h.size(); i++) {
      h[i] = to16(bf16, nrand() * sd);
      f[i] = from16(bf16, h[i]);
    }
  };
  fill(hq, fq, 1.0);
  fill(hk, fk, 1.0);
  fill(hv, fv, 1.0);
  fill(hdo, fdo, 1.0);
  std::vector<double> rdq(nq), rdk(nk), rdv(nk), ro(nq), rlse((size_t)heads * tq);
  ag_ref_jagged_params p;
  memset(&p, 0, sizeof p);
  p.batch = batch;
  p.total_q = tq;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = D;
  p.scale = 1.0 / sqrt((double)D);
  p.causal = V.causal;
  p.window = V.window;
  p.window_left = V.left;
  p.window_right = V.right;
  {
    // (sequence, kv head) units over the host's threads, longest first
    std::vector<std::pair<long long, long long>> units;
    for (long long b = 0; b < batch; b++)
      for (int g = 0; g < kv_heads; g++) units.push_back({b, g});
    std::sort(units.begin(), units.end(), [&](auto &a, auto &c) {
      return (long long)lq[a.first] * lk[a.first] > (long long)lq[c.first] * lk[c.first];
    });
    int nt = (int)std::thread::hardware_concurrency();
    if (nt < 1) nt = 1;
    std::vector<std::thread> th;
    std::atomic<size_t> next(0);
    for (int t = 0; t < nt; t++)
      th.emplace_back([&] {
        for (size_t u; (u = next++) < units.size();)
          ag_ref_jagged_bwd_part(&p, fq.data(), fk.data(), fv.data(), fdo.data(), cu_q.data(),
                                 cu_k.data(), units[u].first, units[u].second, rdq.data(),
                                 rdk.data(), rdv.data(), ro.data(), rlse.data());
      });
    for (auto &t : th) t.join();
  }
  for (size_t i = 0; i < nq; i++) ho[i] = to16(bf16, ro[i]);
  std::vector<float> hlse(rlse.size());
  for (size_t i = 0; i < rlse.size(); i++) hlse[i] = (float)rlse[i];

  Dev d;
  d.q = dalloc<unsigned short>(nq);
  d.dout = dalloc<unsigned short>(nq);
  d.o = dalloc<unsigned short>(nq);
  d.dq = dalloc<unsigned short>(nq);
  d.k = dalloc<unsigned short>(nk);
  d.v = dalloc<unsigned short>(nk);
  d.dk = dalloc<unsigned short>(nk);
  d.dv = dalloc<unsigned short>(nk);
  d.lse = dalloc<float>(hlse.size());
  const size_t di_n = V.fast ? (hlse.size() + 31) / 32 * 32 + nq + 16 + (V.fused ? 2 * hlse.size() : 0)
                            : hlse.size();  // + the tile counter (and the add counters)
  d.di = dalloc<float>(di_n);
  d.cu_q = dalloc<int>(batch + 1);
  d.cu_k = dalloc<int>(batch + 1);
  CK(cudaMemcpy(d.q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.dout, hdo.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.o, ho.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.lse, hlse.data(), hlse.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.cu_q, cu_q.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.cu_k, cu_k.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  std::vector<uint16_t> gdq(nq), gdk(nk), gdv(nk), fdq, fdk, fdv;
  bool det = true;
  for (int r = 0; r < reps; r++) {
    CK(cudaMemset(d.dq, 0xff, nq * 2));
    CK(cudaMemset(d.dk, 0xff, nk * 2));
    CK(cudaMemset(d.dv, 0xff, nk * 2));
    CK(cudaMemset(d.di, 0xff, di_n * 4));
    launch(V, d, batch, heads, kv_heads, tq, tk, 0);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(gdq.data(), d.dq, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gdk.data(), d.dk, nk * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gdv.data(), d.dv, nk * 2, cudaMemcpyDeviceToHost));
    if (r == 0) {
      fdq = gdq;
      fdk = gdk;
      fdv = gdv;
    } else if (fdq != gdq || fdk != gdk || fdv != gdv) {
      det = false;
    }
  }
  long long n1, n2, n3;
  const double e1 = rel(gdq, rdq, bf16, &n1), e2 = rel(gdk, rdk, bf16, &n2),
               e3 = rel(gdv, rdv, bf16, &n3);
  const double tol = bf16 ? 2e-2 : 5e-3;
  const bool ok = n1 + n2 + n3 == 0 && e1 < tol && e2 < tol && e3 < tol && (det || V.fast);
  if (!ok) failures++;
  printf("%-4s %-34s %-22s h%d/%d tq%lld tk%lld  dq %.2e dk %.2e dv %.2e  unwritten %lld/%lld/%lld%s\n",
         ok ? "ok" : "FAIL", V.name, label, heads, kv_heads, tq, tk, e1, e2, e3, n1, n2, n3,
         reps > 1 ? (det ? "  det ok" : V.fast ? "  not bit-identical (atomics)" : "  NONDETERMINISTIC") : "");
  fflush(stdout);
  cudaFree(d.q); cudaFree(d.dout); cudaFree(d.o); cudaFree(d.dq); cudaFree(d.k); cudaFree(d.v);
  cudaFree(d.dk); cudaFree(d.dv); cudaFree(d.lse); cudaFree(d.di); cudaFree(d.cu_q);
  cudaFree(d.cu_k);
}

static std::vector<int> shuffled(std::vector<int> v) {
  for (size_t i = v.size(); i > 1; i--) std::swap(v[i - 1], v[rnd() % i]);
  return v;
}

static void run_checks() {
  const std::vector<int> base = {0, 1, 63, 64, 65, 127, 129, 1000};
  const int ratios[4][2] = {{4, 4}, {4, 2}, {8, 2}, {8, 1}};
  for (int vi = 0; vi < kNumVariants; vi++) {
    // self-attention, the mixed lengths with 1000, 5 runs bit-identical
    std::vector<int> l = shuffled(base);
    const int *r = ratios[vi % 2];
    check(vi, l, l, r[0], r[1], 5, "self mixed");
    // the larger GQA ratios on shorter sequences (host reference time)
    std::vector<int> l2 = shuffled(std::vector<int>{129, 0, 300, 64, 1, 65, 63, 127, 3, 200});
    const int *r2 = ratios[2 + vi % 2];
    check(vi, l2, l2, r2[0], r2[1], 1, "self mixed 2");
    // cross-attention, Lq != Lk both ways (Lq > Lk under causal: empty rows)
    std::vector<int> cq = {1, 100, 65, 300, 0, 50, 129, 1000, 64, 7, 257};
    std::vector<int> ck = {100, 1, 130, 64, 50, 0, 1000, 129, 64, 200, 3};
    check(vi, cq, ck, 4, 2, 1, "cross");
  }
  // one 4096 among others (5 runs bit-identical)
  std::vector<int> big = {1, 9, 10, 13};
  for (int vi = 0; vi < kNumVariants; vi++)
    if (kVariants[vi].fast == 2) big.push_back(vi);
  for (int vi : big) {
    if (vi >= kNumVariants) continue;
    std::vector<int> l = shuffled(std::vector<int>{4096, 1000, 129, 1, 0, 65, 511});
    check(vi, l, l, vi == 1 ? 2 : 4, vi == 1 ? 2 : 2, 5, "with 4096, 5 runs");
  }
}

// Random 16-bit values on the device (normal-ish: sum of uniforms), so the
// timing sees real data, never zeros.
__global__ void fill_kernel(unsigned short *p, size_t n, uint64_t seed, int bf16, float sd) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float u = ((z & 0xffff) + ((z >> 16) & 0xffff) + ((z >> 32) & 0xffff) - 1.5f * 65536.f) /
              65536.f * 2.f * sd;
    if (bf16) {
      __nv_bfloat16 h = __float2bfloat16_rn(u);
      p[i] = *reinterpret_cast<unsigned short *>(&h);
    } else {
      __half h = __float2half_rn(u);
      p[i] = *reinterpret_cast<unsigned short *>(&h);
    }
  }
}
__global__ void fill_lse(float *p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    uint64_t z = (seed + i) * 0x9e3779b97f4a7c15ull;
    z ^= z >> 29;
    p[i] = 4.f + (float)(z & 1023) / 512.f;
  }
}

static void time_one(int vi, int L, long long batch, int heads) {
  const Variant &V = kVariants[vi];
  std::vector<int> cu(batch + 1, 0);
  double pairs = 0;
  for (long long b = 0; b < batch; b++) {
    const int len = 1 + (int)(rnd() % L);
    cu[b + 1] = cu[b] + len;
    pairs += V.causal ? (double)len * (len + 1) / 2 : (double)len * len;
  }
  const long long t = cu[batch];
  const size_t n = (size_t)t * heads * V.dim;
  Dev d;
  d.q = dalloc<unsigned short>(n); d.k = dalloc<unsigned short>(n); d.v = dalloc<unsigned short>(n);
  d.o = dalloc<unsigned short>(n); d.dout = dalloc<unsigned short>(n);
  d.dq = dalloc<unsigned short>(n); d.dk = dalloc<unsigned short>(n); d.dv = dalloc<unsigned short>(n);
  d.lse = dalloc<float>((size_t)heads * t);
  d.di = dalloc<float>(((size_t)heads * t + 31) / 32 * 32 + (V.fast ? n + 16 : 0) +
                       (V.fused ? 2 * (size_t)heads * t : 0));
  d.cu_q = dalloc<int>(batch + 1);
  d.cu_k = d.cu_q;
  CK(cudaMemcpy(d.cu_q, cu.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  unsigned short *bufs[5] = {d.q, d.k, d.v, d.o, d.dout};
  for (int i = 0; i < 5; i++) fill_kernel<<<4096, 256>>>(bufs[i], n, 1234567ull * (i + 1), V.bf16, 1.f);
  fill_lse<<<1024, 256>>>(d.lse, (size_t)heads * t, 99);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const double flops = 2.5 * 4.0 * V.dim * heads * pairs;
  double med[3];
  const int reps = L > 2048 ? 7 : 15;
  for (int which = 3; which >= 1; which--) {
    launch(V, d, batch, heads, heads, t, t, 0, which);  // warm-up
    CK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int r = 0; r < reps; r++) {
      CK(cudaEventRecord(e0));
      launch(V, d, batch, heads, heads, t, t, 0, which);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float x;
      CK(cudaEventElapsedTime(&x, e0, e1));
      ms.push_back(x);
    }
    std::sort(ms.begin(), ms.end());
    med[which - 1] = ms[ms.size() / 2];
  }
  printf("time %-26s L%-5d tokens %-8lld  total %8.3f ms  %6.1f TFLOP/s   (dq %7.3f ms, dkv %7.3f ms)\n",
         V.name, L, t, med[2], flops / (med[2] * 1e-3) / 1e12, med[0], med[1]);
  fflush(stdout);
  cudaFree(d.q); cudaFree(d.k); cudaFree(d.v); cudaFree(d.o); cudaFree(d.dout); cudaFree(d.dq);
  cudaFree(d.dk); cudaFree(d.dv); cudaFree(d.lse); cudaFree(d.di); cudaFree(d.cu_q);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

static int find_variant(const char *name) {
  for (int i = 0; i < kNumVariants; i++)
    if (!strcmp(kVariants[i].name, name)) return i;
  fprintf(stderr, "no variant '%s'\n", name);
  exit(2);
}

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  if (argc > 2) rng_state ^= strtoull(argv[2], 0, 0);
  else rng_state ^= (uint64_t)time(0);
  set_attrs();
  if (mode == "check") {
    run_checks();
    printf("checks: %d failed\n", failures);
  } else if (mode == "checksm90") {  // the sm_90a variants only (argv[3..]: these alone)
    std::vector<int> only;
    for (int i = 3; i < argc; i++) only.push_back(find_variant(argv[i]));
    for (int vi = 0; vi < kNumVariants; vi++) {
      if (kVariants[vi].fast != 2) continue;
      if (!only.empty() && std::find(only.begin(), only.end(), vi) == only.end()) continue;
      std::vector<int> l = shuffled(std::vector<int>{0, 1, 63, 64, 65, 127, 129, 1000, 4096, 200});
      check(vi, l, l, 4, vi % 2 ? 2 : 4, 2, "self mixed");
      std::vector<int> l2 = shuffled(std::vector<int>{129, 0, 300, 64, 1, 65, 63, 127, 3, 200});
      check(vi, l2, l2, 8, vi % 2 ? 1 : 2, 1, "gqa");
      std::vector<int> cq = {1, 100, 65, 300, 0, 50, 129, 1000, 64, 7, 257};
      std::vector<int> ck = {100, 1, 130, 64, 50, 0, 1000, 129, 64, 200, 3};
      check(vi, cq, ck, 4, 2, 1, "cross");
    }
    printf("checks: %d failed\n", failures);
  } else if (mode == "time") {
    // argv[3..]: variant names (default: every bf16 full/causal variant)
    std::vector<int> vs;
    for (int i = 3; i < argc; i++) vs.push_back(find_variant(argv[i]));
    if (vs.empty())
      for (int i = 0; i < kNumVariants; i++)
        if (kVariants[i].bf16 && !kVariants[i].window && kVariants[i].block == 64) vs.push_back(i);
    // the same lengths for every variant of an L, so rows compare
    const uint64_t start = rng_state;
    // BWD_LENGTHS: the maximum lengths L (default "1024 4096")
    std::vector<int> lens;
    if (const char *e = getenv("BWD_LENGTHS"))
      for (char *end; *e; e = end) {
        const long L = strtol(e, &end, 10);
        if (end == e) break;
        lens.push_back((int)L);
      }
    if (lens.empty()) lens = {1024, 4096};
    // BWD_ROUNDS: the variants timed in turn this many times over (rows of
    // a round compare; the rounds show the spread), default 1
    const char *rounds_env = getenv("BWD_ROUNDS");
    const int rounds = rounds_env ? atoi(rounds_env) : 1;
    if (rounds < 1) {
      fprintf(stderr, "BWD_ROUNDS must be a whole number >= 1 (got '%s')\n", rounds_env);
      return 2;
    }
    for (int L : lens)
      for (int round = 0; round < rounds; round++)
        for (int vi : vs) {
          rng_state = start ^ (uint64_t)L;
          time_one(vi, L, 1152, 4);
        }
  } else if (mode == "small") {
    // a small batch of every shape class for the sanitizers
    for (int i = 3; i < argc; i++) {
      const int vi = find_variant(argv[i]);
      std::vector<int> l = {65, 0, 1, 130, 64};
      check(vi, l, l, 4, 2, 1, "small");
      std::vector<int> cq = {70, 1, 0, 20}, ck = {20, 64, 5, 0};
      check(vi, cq, ck, 2, 1, 1, "small cross");
    }
    printf("checks: %d failed\n", failures);
  }
  return failures ? 1 : 0;
}
