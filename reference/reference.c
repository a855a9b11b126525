/* reference.c: float64 CPU attention and 16-bit float conversions; see
 * reference.h. Straightforward on purpose: it is the yardstick. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"

uint16_t ag_float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float ag_bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t ag_float_to_fp16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow to inf */
  if (abs < 0x38800000u) {                                   /* subnormal or zero */
    float a;
    memcpy(&a, &abs, 4);
    /* a * 2^24 rounds to the subnormal's integer mantissa. */
    return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f));
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float ag_fp16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = ldexpf((float)mant, -24);
    return sign ? -f : f;
  }
  uint32_t u = exp == 31 ? sign | 0x7f800000u | (mant << 13)
                         : sign | ((exp + 112) << 23) | (mant << 13);
  memcpy(&f, &u, 4);
  return f;
}

uint16_t ag_float_to_half(ag_dtype dtype, float f) {
  return dtype == AG_DTYPE_FP16 ? ag_float_to_fp16(f) : ag_float_to_bf16(f);
}

float ag_half_to_float(ag_dtype dtype, uint16_t h) {
  return dtype == AG_DTYPE_FP16 ? ag_fp16_to_float(h) : ag_bf16_to_float(h);
}

void ag_ref_block_forward(ag_dtype dtype, int block_size, bool causal, double scale,
                          const uint16_t *q, const uint16_t *k, const uint16_t *v,
                          const int32_t *offsets, int64_t batch, int64_t heads, int head_dim,
                          double *out) {
  const int64_t stride = heads * head_dim;
  double *p = malloc(sizeof(double) * (size_t)block_size);
  if (!p) abort(); /* test-only code: no way to go on */
  for (int64_t b = 0; b < batch; b++) {
    for (int64_t t0 = offsets[b]; t0 < offsets[b + 1]; t0 += block_size) {
      int64_t rows = offsets[b + 1] - t0 < block_size ? offsets[b + 1] - t0 : block_size;
      for (int64_t h = 0; h < heads; h++) {
        for (int64_t i = 0; i < rows; i++) {
          const uint16_t *qi = q + (t0 + i) * stride + h * head_dim;
          int64_t keys = causal ? i + 1 : rows;
          double m = -INFINITY, sum = 0;
          for (int64_t j = 0; j < keys; j++) {
            const uint16_t *kj = k + (t0 + j) * stride + h * head_dim;
            double s = 0;
            for (int d = 0; d < head_dim; d++)
              s += (double)ag_half_to_float(dtype, qi[d]) * ag_half_to_float(dtype, kj[d]);
            p[j] = s * scale;
            if (p[j] > m) m = p[j];
          }
          for (int64_t j = 0; j < keys; j++) sum += p[j] = exp(p[j] - m);
          double *oi = out + (t0 + i) * stride + h * head_dim;
          for (int d = 0; d < head_dim; d++) oi[d] = 0;
          for (int64_t j = 0; j < keys; j++) {
            const uint16_t *vj = v + (t0 + j) * stride + h * head_dim;
            for (int d = 0; d < head_dim; d++) oi[d] += p[j] / sum * ag_half_to_float(dtype, vj[d]);
          }
        }
      }
    }
  }
  free(p);
}

double ag_rel_error(ag_dtype dtype, const uint16_t *got, const double *ref, size_t elems) {
  double num = 0, den = 0;
  for (size_t i = 0; i < elems; i++) {
    double g = ag_half_to_float(dtype, got[i]);
    if (isnan(g)) return INFINITY;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

uint64_t ag_rand_next(uint64_t *state) {
  uint64_t x = *state ? *state : 0x9e3779b97f4a7c15ull;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545f4914f6cdd1dull;
}

double ag_rand_uniform(uint64_t *state, double lo, double hi) {
  return lo + (hi - lo) * (double)(ag_rand_next(state) >> 11) * (1.0 / 9007199254740992.0);
}
