// SPDX-License-Identifier: BSD-3-Clause
/* reference.c: float64 CPU attention, rotary embeddings and 16-bit float
 * conversions; see reference.h. Straightforward on purpose: it is the
 * yardstick. */
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

void ag_ref_block_forward_f64(int block_size, bool causal, double scale, const double *q,
                              const double *k, const double *v, const int32_t *offsets,
                              int64_t batch, int64_t heads, int head_dim, double *out) {
  /* ag_ref_block_forward's loop, operation for operation, on doubles. */
  const int64_t stride = heads * head_dim;
  double *p = malloc(sizeof(double) * (size_t)block_size);
  if (!p) abort();
  for (int64_t b = 0; b < batch; b++) {
    for (int64_t t0 = offsets[b]; t0 < offsets[b + 1]; t0 += block_size) {
      int64_t rows = offsets[b + 1] - t0 < block_size ? offsets[b + 1] - t0 : block_size;
      for (int64_t h = 0; h < heads; h++) {
        for (int64_t i = 0; i < rows; i++) {
          const double *qi = q + (t0 + i) * stride + h * head_dim;
          int64_t keys = causal ? i + 1 : rows;
          double m = -INFINITY, sum = 0;
          for (int64_t j = 0; j < keys; j++) {
            const double *kj = k + (t0 + j) * stride + h * head_dim;
            double s = 0;
            for (int d = 0; d < head_dim; d++) s += qi[d] * kj[d];
            p[j] = s * scale;
            if (p[j] > m) m = p[j];
          }
          for (int64_t j = 0; j < keys; j++) sum += p[j] = exp(p[j] - m);
          double *oi = out + (t0 + i) * stride + h * head_dim;
          for (int d = 0; d < head_dim; d++) oi[d] = 0;
          for (int64_t j = 0; j < keys; j++) {
            const double *vj = v + (t0 + j) * stride + h * head_dim;
            for (int d = 0; d < head_dim; d++) oi[d] += p[j] / sum * vj[d];
          }
        }
      }
    }
  }
  free(p);
}

/* ---- backward ----
 * One (block, head) at a time: its rows of each tensor are gathered into
 * dense rows x dim doubles, the gradients computed there and scattered back. */

typedef struct block_grads {
  int64_t rows;
  int dim;
  double *q, *k, *v, *dout;  /* inputs, rows x dim */
  double *dq, *dk, *dv;      /* outputs, rows x dim */
  double *p, *ds;            /* rows x rows */
} block_grads;

static void block_backward(block_grads *b, bool causal, double scale) {
  const int64_t n = b->rows;
  const int dim = b->dim;
  /* P, row by row: softmax of the scaled scores over the visible keys. */
  for (int64_t i = 0; i < n; i++) {
    int64_t keys = causal ? i + 1 : n;
    double *pi = b->p + i * n, m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < keys; j++) {
      double s = 0;
      for (int d = 0; d < dim; d++) s += b->q[i * dim + d] * b->k[j * dim + d];
      pi[j] = s * scale;
      if (pi[j] > m) m = pi[j];
    }
    for (int64_t j = 0; j < keys; j++) sum += pi[j] = exp(pi[j] - m);
    for (int64_t j = 0; j < n; j++) pi[j] = j < keys ? pi[j] / sum : 0;
  }
  /* dP = dO V^T, then dS = P (.) (dP - D) with D = rowsum(P (.) dP). */
  for (int64_t i = 0; i < n; i++) {
    const double *pi = b->p + i * n;
    double *dsi = b->ds + i * n, rowsum = 0;
    for (int64_t j = 0; j < n; j++) {
      double dp = 0;
      for (int d = 0; d < dim; d++) dp += b->dout[i * dim + d] * b->v[j * dim + d];
      dsi[j] = dp;
      rowsum += pi[j] * dp;
    }
    for (int64_t j = 0; j < n; j++) dsi[j] = pi[j] * (dsi[j] - rowsum);
  }
  /* dV = P^T dO, dK = scale * dS^T Q, dQ = scale * dS K. */
  memset(b->dq, 0, sizeof(double) * (size_t)(n * dim));
  memset(b->dk, 0, sizeof(double) * (size_t)(n * dim));
  memset(b->dv, 0, sizeof(double) * (size_t)(n * dim));
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++) {
      double p = b->p[i * n + j], ds = b->ds[i * n + j];
      for (int d = 0; d < dim; d++) {
        b->dv[j * dim + d] += p * b->dout[i * dim + d];
        b->dk[j * dim + d] += ds * b->q[i * dim + d];
        b->dq[i * dim + d] += ds * b->k[j * dim + d];
      }
    }
  for (int64_t e = 0; e < n * dim; e++) {
    b->dq[e] *= scale;
    b->dk[e] *= scale;
  }
}

/* Inputs come as 16-bit values (half != NULL) or doubles (f64 != NULL). */
typedef struct bwd_inputs {
  ag_dtype dtype;
  const uint16_t *half[4]; /* q, k, v, dout */
  const double *f64[4];
} bwd_inputs;

static void backward(const bwd_inputs *in, int block_size, bool causal, double scale,
                     const int32_t *offsets, int64_t batch, int64_t heads, int head_dim,
                     double *dq, double *dk, double *dv) {
  const int64_t stride = heads * head_dim;
  const size_t tile = (size_t)block_size * (size_t)head_dim;
  double *mem = malloc(sizeof(double) * (7 * tile + 2 * (size_t)block_size * block_size));
  if (!mem) abort(); /* test-only code: no way to go on */
  block_grads g = {0, head_dim, mem, mem + tile, mem + 2 * tile, mem + 3 * tile, mem + 4 * tile,
                   mem + 5 * tile, mem + 6 * tile, mem + 7 * tile, NULL};
  double *const inputs[4] = {g.q, g.k, g.v, g.dout};
  double *const outputs[3] = {dq, dk, dv};
  for (int64_t b = 0; b < batch; b++) {
    for (int64_t t0 = offsets[b]; t0 < offsets[b + 1]; t0 += block_size) {
      g.rows = offsets[b + 1] - t0 < block_size ? offsets[b + 1] - t0 : block_size;
      g.ds = g.p + g.rows * g.rows;
      for (int64_t h = 0; h < heads; h++) {
        for (int m = 0; m < 4; m++)
          for (int64_t i = 0; i < g.rows; i++)
            for (int d = 0; d < head_dim; d++) {
              int64_t e = (t0 + i) * stride + h * head_dim + d;
              inputs[m][i * head_dim + d] =
                  in->half[m] ? ag_half_to_float(in->dtype, in->half[m][e]) : in->f64[m][e];
            }
        block_backward(&g, causal, scale);
        const double *grads[3] = {g.dq, g.dk, g.dv};
        for (int m = 0; m < 3; m++)
          for (int64_t i = 0; i < g.rows; i++)
            memcpy(outputs[m] + (t0 + i) * stride + h * head_dim, grads[m] + i * head_dim,
                   sizeof(double) * (size_t)head_dim);
      }
    }
  }
  free(mem);
}

void ag_ref_block_backward(ag_dtype dtype, int block_size, bool causal, double scale,
                           const uint16_t *q, const uint16_t *k, const uint16_t *v,
                           const uint16_t *dout, const int32_t *offsets, int64_t batch,
                           int64_t heads, int head_dim, double *dq, double *dk, double *dv) {
  bwd_inputs in = {dtype, {q, k, v, dout}, {NULL, NULL, NULL, NULL}};
  backward(&in, block_size, causal, scale, offsets, batch, heads, head_dim, dq, dk, dv);
}

void ag_ref_block_backward_f64(int block_size, bool causal, double scale, const double *q,
                               const double *k, const double *v, const double *dout,
                               const int32_t *offsets, int64_t batch, int64_t heads,
                               int head_dim, double *dq, double *dk, double *dv) {
  bwd_inputs in = {AG_DTYPE_BF16, {NULL, NULL, NULL, NULL}, {q, k, v, dout}};
  backward(&in, block_size, causal, scale, offsets, batch, heads, head_dim, dq, dk, dv);
}

/* ---- rotary embeddings ---- */

void ag_ref_rotary_apply(const ag_ref_rotary *rot, bool inverse, const int32_t *offsets,
                         int64_t batch, int64_t heads, int head_dim, double *x) {
  ag_ref_rotary_apply_shifted(rot, inverse, offsets, NULL, batch, heads, head_dim, x);
}

void ag_ref_rotary_apply_shifted(const ag_ref_rotary *rot, bool inverse, const int32_t *offsets,
                                 const int64_t *shift, int64_t batch, int64_t heads,
                                 int head_dim, double *x) {
  if (rot->layout == AG_ROTARY_NONE) return;
  const int64_t stride = heads * head_dim;
  const int pairs = head_dim / 2;
  for (int64_t b = 0; b < batch; b++)
    for (int64_t t = offsets[b]; t < offsets[b + 1]; t++) {
      int64_t p = t - offsets[b] + (shift ? shift[b] : 0); /* index in the sequence, shifted */
      if (rot->positions == AG_POSITIONS_BLOCK) p %= rot->block_size;
      for (int i = 0; i < pairs; i++) {
        double s, c;
        if (rot->positions == AG_POSITIONS_TABLE) {
          s = rot->table[t * head_dim + i];
          c = rot->table[t * head_dim + pairs + i];
        } else {
          double a = (double)p * pow(rot->base, -2.0 * i / head_dim);
          s = sin(a);
          c = cos(a);
        }
        if (inverse) s = -s;
        for (int64_t h = 0; h < heads; h++) {
          double *xh = x + t * stride + h * head_dim;
          double *x0 = rot->layout == AG_ROTARY_HALF ? &xh[i] : &xh[2 * i];
          double *x1 = rot->layout == AG_ROTARY_HALF ? &xh[i + pairs] : &xh[2 * i + 1];
          double a0 = *x0, a1 = *x1;
          *x0 = a0 * c - a1 * s;
          *x1 = a0 * s + a1 * c;
        }
      }
    }
}

/* Copies of q, k, v ([3][elems] in one allocation), those of apply_to
 * rotated; the caller frees [0]. */
static void rotated_copies(const ag_ref_rotary *rot, const double *const in[3],
                           const int32_t *offsets, int64_t batch, int64_t heads, int head_dim,
                           double *out[3]) {
  const size_t elems = (size_t)offsets[batch] * (size_t)heads * (size_t)head_dim;
  double *mem = malloc(sizeof(double) * (3 * elems + 1));
  if (!mem) abort(); /* test-only code: no way to go on */
  for (int m = 0; m < 3; m++) {
    out[m] = mem + m * elems;
    if (elems) memcpy(out[m], in[m], sizeof(double) * elems);
    if (rot->apply_to & (AG_APPLY_Q << m))
      ag_ref_rotary_apply(rot, false, offsets, batch, heads, head_dim, out[m]);
  }
}

void ag_ref_block_forward_rotary_f64(const ag_ref_rotary *rot, int block_size, bool causal,
                                     double scale, const double *q, const double *k,
                                     const double *v, const int32_t *offsets, int64_t batch,
                                     int64_t heads, int head_dim, double *out) {
  const double *in[3] = {q, k, v};
  double *r[3];
  rotated_copies(rot, in, offsets, batch, heads, head_dim, r);
  ag_ref_block_forward_f64(block_size, causal, scale, r[0], r[1], r[2], offsets, batch, heads,
                           head_dim, out);
  free(r[0]);
}

void ag_ref_block_backward_rotary_f64(const ag_ref_rotary *rot, int block_size, bool causal,
                                      double scale, const double *q, const double *k,
                                      const double *v, const double *dout,
                                      const int32_t *offsets, int64_t batch, int64_t heads,
                                      int head_dim, double *dq, double *dk, double *dv) {
  const double *in[3] = {q, k, v};
  double *r[3], *grads[3] = {dq, dk, dv};
  rotated_copies(rot, in, offsets, batch, heads, head_dim, r);
  ag_ref_block_backward_f64(block_size, causal, scale, r[0], r[1], r[2], dout, offsets, batch,
                            heads, head_dim, dq, dk, dv);
  for (int m = 0; m < 3; m++)
    if (rot->apply_to & (AG_APPLY_Q << m))
      ag_ref_rotary_apply(rot, true, offsets, batch, heads, head_dim, grads[m]);
  free(r[0]);
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
