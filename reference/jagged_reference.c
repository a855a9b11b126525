// SPDX-License-Identifier: BSD-3-Clause
/* jagged_reference.c: float64 CPU reference of jagged attention forward
 * (see jagged_reference.h). Test-only code: allocation failure aborts. */
#include "jagged_reference.h"

#include <math.h>
#include <stdlib.h>

#include "reference.h"

bool ag_ref_jagged_visible(const ag_ref_jagged_params *p, int64_t lq, int64_t lk, int64_t i,
                           int64_t j) {
  const int64_t d = lk - lq;
  if (i < 0 || i >= lq || j < 0 || j >= lk) return false;
  if (p->causal && j > i + d) return false;
  if (p->window) {
    if (p->window_left >= 0 && j < i + d - p->window_left) return false;
    if (p->window_right >= 0 && j > i + d + p->window_right) return false;
  }
  return true;
}

void ag_ref_jagged_key_range(const ag_ref_jagged_params *p, int64_t lq, int64_t lk, int64_t i,
                             int64_t *lo, int64_t *hi) {
  const int64_t d = lk - lq;
  int64_t a = 0, b = lk;
  if (p->causal && i + d + 1 < b) b = i + d + 1;
  if (p->window) {
    if (p->window_left >= 0 && i + d - p->window_left > a) a = i + d - p->window_left;
    if (p->window_right >= 0 && i + d + p->window_right + 1 < b) b = i + d + p->window_right + 1;
  }
  if (a > lk) a = lk;
  if (b < a) b = a;
  *lo = a;
  *hi = b;
}

/* Inputs are 16-bit of some dtype (f64 == NULL) or doubles (f64 != NULL). */
typedef struct inputs {
  ag_dtype dtype;
  const uint16_t *h[3];
  const double *f[3];
} inputs;

static double elem(const inputs *in, int m, int64_t idx) {
  return in->f[m] ? in->f[m][idx] : (double)ag_half_to_float(in->dtype, in->h[m][idx]);
}

static void part(const inputs *in, const ag_ref_jagged_params *p, const int32_t *cu_q,
                 const int32_t *cu_k, int64_t b, int64_t h, double *out, double *lse) {
  const int dim = p->head_dim;
  const int64_t q0 = cu_q[b], lq = cu_q[b + 1] - cu_q[b];
  const int64_t k0 = cu_k[b], lk = cu_k[b + 1] - cu_k[b];
  const int64_t kvh = h / (p->heads / p->kv_heads);
  const int64_t qs = p->heads * dim, ks = p->kv_heads * dim;
  if (lq <= 0) return;
  size_t kn = lk > 0 ? (size_t)lk : 1;
  double *kd = malloc(sizeof(double) * kn * (size_t)dim);
  double *vd = malloc(sizeof(double) * kn * (size_t)dim);
  double *qd = malloc(sizeof(double) * (size_t)dim);
  double *s = malloc(sizeof(double) * kn);
  double *acc = malloc(sizeof(double) * (size_t)dim);
  if (!kd || !vd || !qd || !s || !acc) abort();
  for (int64_t j = 0; j < lk; j++)
    for (int c = 0; c < dim; c++) {
      kd[j * dim + c] = elem(in, 1, (k0 + j) * ks + kvh * dim + c);
      vd[j * dim + c] = elem(in, 2, (k0 + j) * ks + kvh * dim + c);
    }
  for (int64_t i = 0; i < lq; i++) {
    double *o = out ? out + (q0 + i) * qs + h * dim : NULL;
    for (int c = 0; c < dim; c++) qd[c] = elem(in, 0, (q0 + i) * qs + h * dim + c);
    int64_t lo, hi;
    ag_ref_jagged_key_range(p, lq, lk, i, &lo, &hi);
    if (lo >= hi) {
      if (o)
        for (int c = 0; c < dim; c++) o[c] = 0.0;
      if (lse) lse[h * p->total_q + q0 + i] = -INFINITY;
      continue;
    }
    double mx = -INFINITY;
    for (int64_t j = lo; j < hi; j++) {
      const double *kr = kd + j * dim;
      double d4[4] = {0.0, 0.0, 0.0, 0.0}; /* four sums: no serial add chain */
      int c = 0;
      for (; c + 4 <= dim; c += 4)
        for (int u = 0; u < 4; u++) d4[u] += qd[c + u] * kr[c + u];
      for (; c < dim; c++) d4[0] += qd[c] * kr[c];
      s[j] = p->scale * ((d4[0] + d4[1]) + (d4[2] + d4[3]));
      if (s[j] > mx) mx = s[j];
    }
    double sum = 0.0;
    for (int c = 0; c < dim; c++) acc[c] = 0.0;
    for (int64_t j = lo; j < hi; j++) {
      const double e = exp(s[j] - mx);
      const double *vr = vd + j * dim;
      sum += e;
      for (int c = 0; c < dim; c++) acc[c] += e * vr[c];
    }
    if (o)
      for (int c = 0; c < dim; c++) o[c] = acc[c] / sum;
    if (lse) lse[h * p->total_q + q0 + i] = mx + log(sum);
  }
  free(kd);
  free(vd);
  free(qd);
  free(s);
  free(acc);
}

void ag_ref_jagged_forward_part(ag_dtype dtype, const ag_ref_jagged_params *p, const uint16_t *q,
                                const uint16_t *k, const uint16_t *v, const int32_t *cu_q,
                                const int32_t *cu_k, int64_t b, int64_t h, double *out,
                                double *lse) {
  const inputs in = {dtype, {q, k, v}, {NULL, NULL, NULL}};
  part(&in, p, cu_q, cu_k, b, h, out, lse);
}

void ag_ref_jagged_forward_part_f64(const ag_ref_jagged_params *p, const double *q,
                                    const double *k, const double *v, const int32_t *cu_q,
                                    const int32_t *cu_k, int64_t b, int64_t h, double *out,
                                    double *lse) {
  const inputs in = {AG_DTYPE_BF16, {NULL, NULL, NULL}, {q, k, v}};
  part(&in, p, cu_q, cu_k, b, h, out, lse);
}

void ag_ref_jagged_forward(ag_dtype dtype, const ag_ref_jagged_params *p, const uint16_t *q,
                           const uint16_t *k, const uint16_t *v, const int32_t *cu_q,
                           const int32_t *cu_k, double *out, double *lse) {
  const inputs in = {dtype, {q, k, v}, {NULL, NULL, NULL}};
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < p->heads; h++) part(&in, p, cu_q, cu_k, b, h, out, lse);
}

void ag_ref_jagged_forward_f64(const ag_ref_jagged_params *p, const double *q, const double *k,
                               const double *v, const int32_t *cu_q, const int32_t *cu_k,
                               double *out, double *lse) {
  const inputs in = {AG_DTYPE_BF16, {NULL, NULL, NULL}, {q, k, v}};
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t h = 0; h < p->heads; h++) part(&in, p, cu_q, cu_k, b, h, out, lse);
}
