// SPDX-License-Identifier: BSD-3-Clause
// fwd_test.cu: dev harness for templates/jagged_fwd.cu. Build with the
// expanded kernel (expand.py -o K.cuh) named by JV_KERNEL_FILE:
//   nvcc -O3 -arch=sm_90a -std=c++17 -Iinclude -Ireference -DJV_KERNEL_FILE='"K.cuh"' \
//        tools/jagged_dev/fwd_test.cu reference/jagged_reference.c reference/reference.c
// Run: `a.out test [seed]` (correctness suite against the float64
// reference) or `a.out bench L [batch heads]` (timing, lengths uniform in
// [1, L], self-attention, kv_heads = heads).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern "C" {
#include "jagged_reference.h"
#include "reference.h"
}

// The expanded kernel (expand.py's output), named by -DJV_KERNEL_FILE='"k.cuh"'.
#include JV_KERNEL_FILE

#define CK(x)                                                                       \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) {                                                        \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(2);                                                                      \
    }                                                                               \
  } while (0)

static const ag_dtype kDtype = JV_FP16 ? AG_DTYPE_FP16 : AG_DTYPE_BF16;
static const int kPad = 64; // poisoned rows past the end, checked untouched

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  double uni() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
  double gauss() {
    double u = uni(), w = uni();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * w);
  }
};

static std::vector<int32_t> cumsum(const std::vector<int> &lens) {
  std::vector<int32_t> cu(lens.size() + 1, 0);
  for (size_t i = 0; i < lens.size(); i++) cu[i + 1] = cu[i] + lens[i];
  return cu;
}

struct Dev {
  unsigned short *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float *lse = nullptr;
  int *cuq = nullptr, *cuk = nullptr;
};

static void launch(const Dev &d, long long batch, int heads, int kv_heads, long long total_q,
                   long long total_k, cudaStream_t st = 0) {
  const long long num_tiles = batch + total_q / kBlockM;
  dim3 grid((unsigned)num_tiles, heads, 1);
  JV_KERNEL<<<grid, kThreads, kSmemBytes, st>>>(d.q, d.k, d.v, d.o, d.lse, d.cuq, d.cuk, batch,
                                                heads, kv_heads, total_q, total_k, num_tiles);
}

struct Case {
  std::string name;
  std::vector<int> lq, lk; // lk empty: self-attention (one offsets pointer)
  int heads, kv_heads;
};

static bool run_case(const Case &c, Rng &rng, const ag_ref_jagged_params &base) {
  const bool self = c.lk.empty();
  const std::vector<int32_t> cuq = cumsum(c.lq), cuk = cumsum(self ? c.lq : c.lk);
  const long long batch = (long long)c.lq.size();
  const long long tq = cuq.back(), tk = cuk.back();
  const int D = kHeadDim, H = c.heads, KH = c.kv_heads;
  const size_t qn = (size_t)tq * H * D, kn = (size_t)tk * KH * D;
  std::vector<uint16_t> hq(qn), hk(kn), hv(kn);
  for (auto &x : hq) x = ag_float_to_half(kDtype, (float)rng.gauss());
  for (auto &x : hk) x = ag_float_to_half(kDtype, (float)rng.gauss());
  for (auto &x : hv) x = ag_float_to_half(kDtype, (float)rng.gauss());
  Dev d;
  const size_t on = (size_t)(tq + kPad) * H * D, ln = (size_t)H * tq + kPad;
  CK(cudaMalloc(&d.q, std::max<size_t>(qn, 1) * 2));
  CK(cudaMalloc(&d.k, std::max<size_t>(kn, 1) * 2));
  CK(cudaMalloc(&d.v, std::max<size_t>(kn, 1) * 2));
  CK(cudaMalloc(&d.o, on * 2));
  CK(cudaMalloc(&d.lse, ln * 4));
  CK(cudaMalloc(&d.cuq, cuq.size() * 4));
  if (self) d.cuk = d.cuq; else CK(cudaMalloc(&d.cuk, cuk.size() * 4));
  CK(cudaMemcpy(d.q, hq.data(), qn * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.k, hk.data(), kn * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.v, hv.data(), kn * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d.cuq, cuq.data(), cuq.size() * 4, cudaMemcpyHostToDevice));
  if (!self) CK(cudaMemcpy(d.cuk, cuk.data(), cuk.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(d.o, 0xff, on * 2));     // NaN in bf16 and fp16
  CK(cudaMemset(d.lse, 0xff, ln * 4));   // NaN
  launch(d, batch, H, KH, tq, tk);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> go(on);
  std::vector<float> gl(ln);
  CK(cudaMemcpy(go.data(), d.o, on * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(gl.data(), d.lse, ln * 4, cudaMemcpyDeviceToHost));
  cudaFree(d.q); cudaFree(d.k); cudaFree(d.v); cudaFree(d.o); cudaFree(d.lse); cudaFree(d.cuq);
  if (!self) cudaFree(d.cuk);

  // Reference, (sequence, head) pairs shared between threads, costliest first.
  ag_ref_jagged_params p = base;
  p.batch = batch; p.total_q = tq; p.heads = H; p.kv_heads = KH; p.head_dim = D;
  std::vector<double> ro(qn > 0 ? qn : 1), rl(ln);
  std::vector<std::pair<long long, long long>> work; // (-cost, b * H + h)
  for (long long b = 0; b < batch; b++)
    for (int h = 0; h < H; h++)
      work.push_back({-(long long)(cuq[b + 1] - cuq[b] + 1) * (cuk[b + 1] - cuk[b] + 1),
                      b * H + h});
  std::sort(work.begin(), work.end());
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    for (size_t i; (i = next++) < work.size();) {
      long long bh = work[i].second;
      ag_ref_jagged_forward_part(kDtype, &p, hq.data(), hk.data(), hv.data(), cuq.data(),
                                 cuk.data(), bh / H, bh % H, ro.data(), rl.data());
    }
  };
  unsigned nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> th;
  for (unsigned i = 0; i < nt; i++) th.emplace_back(worker);
  for (auto &t : th) t.join();

  // Compare.
  double num = 0, den = 0, lse_err = 0;
  long long nan_o = 0, nan_l = 0, inf_bad = 0, zero_bad = 0, pad_bad = 0;
  for (size_t i = 0; i < qn; i++) {
    float g = ag_half_to_float(kDtype, go[i]);
    if (std::isnan(g)) { nan_o++; continue; }
    double e = g - ro[i];
    num += e * e;
    den += ro[i] * ro[i];
  }
  for (long long b = 0; b < batch; b++)
    for (int h = 0; h < H; h++)
      for (long long r = cuq[b]; r < cuq[b + 1]; r++) {
        size_t li = (size_t)h * tq + r;
        float g = gl[li];
        double want = rl[li];
        if (std::isnan(g)) { nan_l++; continue; }
        if (std::isinf(want)) {
          if (!(std::isinf(g) && g < 0)) inf_bad++;
          for (int c2 = 0; c2 < D; c2++)
            if (go[((size_t)r * H + h) * D + c2] & 0x7fff) { zero_bad++; break; }
        } else {
          if (std::isinf(g)) inf_bad++;
          else lse_err = std::max(lse_err, fabs(g - want));
        }
      }
  for (size_t i = qn; i < on; i++) pad_bad += go[i] != 0xffff;
  for (size_t i = (size_t)H * tq; i < ln; i++) {
    uint32_t u;
    memcpy(&u, &gl[i], 4);
    pad_bad += u != 0xffffffffu;
  }
  const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
  const double tol = JV_FP16 ? 2e-3 : 1e-2;
  const bool ok = nan_o == 0 && nan_l == 0 && inf_bad == 0 && zero_bad == 0 && pad_bad == 0 &&
                  rel <= tol && lse_err <= 1e-3;
  printf("%s %-22s H%d KV%d tq%lld tk%lld | O rel %.3e  LSE maxabs %.3e | nanO %lld nanL %lld "
         "infbad %lld zerobad %lld padbad %lld\n",
         ok ? "PASS" : "FAIL", c.name.c_str(), H, KH, tq, tk, rel, lse_err, nan_o, nan_l,
         inf_bad, zero_bad, pad_bad);
  return ok;
}

static int test(uint64_t seed, bool quick) {
  Rng rng{seed * 0x9E3779B97F4A7C15ull + 1};
  ag_ref_jagged_params p{};
  p.scale = JV_SCALE;
  p.causal = JV_CAUSAL;
  p.window = JV_WINDOW;
  p.window_left = JV_LEFT;
  p.window_right = JV_RIGHT;
  std::vector<Case> cases;
  const std::vector<int> mixed = {65, 0, 4096, 1, 127, 63, 1000, 64, 129};
  const std::vector<int> small = {0, 1, 63, 64, 65, 127, 129, 1000, 300, 0};
  if (!quick) cases.push_back({"mixed-self", mixed, {}, 8, 8});
  std::vector<int> mixed2 = mixed;
  mixed2[2] = 2048;
  if (!quick) cases.push_back({"mixed-self", mixed2, {}, 8, 1});
  cases.push_back({"small-self", small, {}, 8, 4});
  if (!quick) cases.push_back({"small-self", small, {}, 8, 2});
  if (!quick) cases.push_back({"cross", {100, 37, 1000, 65, 0, 5, 129, 1, 200, 64, 3000},
                   {37, 100, 129, 1000, 5, 0, 129, 300, 64, 200, 1500}, 8, 2});
  cases.push_back({"cross-qk", {1, 2, 64, 128, 130}, {4096, 700, 64, 1, 129}, 4, 4});
  std::vector<int> many, many_k;
  for (int i = 0; i < 150; i++) {
    many.push_back((int)(rng.next() % 5 == 0 ? 0 : rng.next() % 300));
    many_k.push_back((int)(rng.next() % 300));
  }
  if (!quick) cases.push_back({"many-self", many, {}, 4, 2});
  cases.push_back({"many-cross", many, many_k, 2, 1});
  std::vector<int> skew(60, 1);
  skew[59] = 2000;
  if (!quick) cases.push_back({"skew-self", skew, {}, 2, 2});
  cases.push_back({"one", {1}, {}, 1, 1});
  cases.push_back({"empty", {0, 0, 0}, {}, 2, 1});
  int fails = 0;
  for (auto &c : cases) fails += !run_case(c, rng, p);
  printf("%s: %s, %d of %zu cases failed (seed %llu)\n", JV_DESC, fails ? "FAIL" : "PASS", fails,
         cases.size(), (unsigned long long)seed);
  return fails ? 1 : 0;
}

// Random 16-bit values (about unit variance) on the device: hashing, no host work.
__global__ void fill(unsigned short *p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ (unsigned)(i >> 32) ^ seed * 0x9E3779B9u;
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    float f = ((x & 0xffffff) * (1.f / 16777216.f) - 0.5f) * 3.4641f;
    if (JV_FP16) { __half hv = __float2half_rn(f); p[i] = *reinterpret_cast<unsigned short *>(&hv); }
    else { __nv_bfloat16 bv = __float2bfloat16_rn(f); p[i] = *reinterpret_cast<unsigned short *>(&bv); }
  }
}

static int bench(int L, int batch, int heads) {
  Rng rng{12345};
  std::vector<int> lens(batch);
  for (auto &x : lens) x = 1 + (int)(rng.next() % L);
  const std::vector<int32_t> cu = cumsum(lens);
  const long long tq = cu.back();
  const size_t n = (size_t)tq * heads * kHeadDim;
  Dev d;
  CK(cudaMalloc(&d.q, n * 2)); CK(cudaMalloc(&d.k, n * 2)); CK(cudaMalloc(&d.v, n * 2));
  CK(cudaMalloc(&d.o, n * 2)); CK(cudaMalloc(&d.lse, (size_t)heads * tq * 4));
  CK(cudaMalloc(&d.cuq, cu.size() * 4));
  d.cuk = d.cuq;
  fill<<<4096, 256>>>(d.q, n, 1u);
  fill<<<4096, 256>>>(d.k, n, 2u);
  fill<<<4096, 256>>>(d.v, n, 3u);
  CK(cudaMemcpy(d.cuq, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice));
  double flops = 0;
  for (int x : lens) flops += 4.0 * x * x * kHeadDim * heads;
  if (JV_CAUSAL) flops *= 0.5;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; i++) launch(d, batch, heads, heads, tq, tq);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < 15; i++) {
    CK(cudaEventRecord(a));
    launch(d, batch, heads, heads, tq, tq);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  const float med = ms[ms.size() / 2];
  printf("BENCH %s L%d b%d h%d tq%lld: median %.3f ms (min %.3f max %.3f) %.1f TFLOP/s\n",
         JV_DESC, L, batch, heads, tq, med, ms.front(), ms.back(), flops / (med * 1e-3) / 1e12);
  cudaFree(d.q); cudaFree(d.k); cudaFree(d.v); cudaFree(d.o); cudaFree(d.lse); cudaFree(d.cuq);
  return 0;
}

int main(int argc, char **argv) {
  CK(cudaFuncSetAttribute(JV_KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  if (argc >= 2 && (!strcmp(argv[1], "test") || !strcmp(argv[1], "quick"))) {
    uint64_t seed = argc >= 3 ? strtoull(argv[2], nullptr, 10)
                              : (uint64_t)std::chrono::system_clock::now().time_since_epoch().count();
    return test(seed, !strcmp(argv[1], "quick"));
  }
  if (argc >= 3 && !strcmp(argv[1], "bench"))
    return bench(atoi(argv[2]), argc >= 4 ? atoi(argv[3]) : 1152, argc >= 5 ? atoi(argv[4]) : 4);
  fprintf(stderr, "usage: %s test|quick [seed] | bench L [batch heads]\n", argv[0]);
  return 2;
}
