// SPDX-License-Identifier: BSD-3-Clause
/* jagged_bwd_reference.c: float64 CPU reference of jagged attention
 * backward (see jagged_bwd_reference.h). */
#include "jagged_bwd_reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ag_ref_jagged_bwd_part(const ag_ref_jagged_params *p, const double *q, const double *k,
                            const double *v, const double *dout, const int32_t *cu_q,
                            const int32_t *cu_k, int64_t b, int64_t g, double *dq, double *dk,
                            double *dv, double *out, double *lse) {
  const int dim = p->head_dim;
  const int64_t q0 = cu_q[b], lq = cu_q[b + 1] - cu_q[b];
  const int64_t k0 = cu_k[b], lk = cu_k[b + 1] - cu_k[b];
  const int64_t group = p->heads / p->kv_heads;
  const int64_t qs = p->heads * dim, ks = p->kv_heads * dim;
  for (int64_t j = 0; j < lk; j++) {
    memset(dk + (k0 + j) * ks + g * dim, 0, sizeof(double) * (size_t)dim);
    memset(dv + (k0 + j) * ks + g * dim, 0, sizeof(double) * (size_t)dim);
  }
  const size_t kn = lk > 0 ? (size_t)lk : 1;
  double *s = malloc(sizeof(double) * kn), *dp = malloc(sizeof(double) * kn);
  double *acc = malloc(sizeof(double) * (size_t)dim);
  if (!s || !dp || !acc) abort();
  for (int64_t h = g * group; h < (g + 1) * group; h++) {
    for (int64_t i = 0; i < lq; i++) {
      const double *qr = q + (q0 + i) * qs + h * dim, *dor = dout + (q0 + i) * qs + h * dim;
      double *dqr = dq + (q0 + i) * qs + h * dim;
      double *o = out ? out + (q0 + i) * qs + h * dim : NULL;
      memset(dqr, 0, sizeof(double) * (size_t)dim);
      int64_t lo, hi;
      ag_ref_jagged_key_range(p, lq, lk, i, &lo, &hi);
      if (lo >= hi) {
        if (o) memset(o, 0, sizeof(double) * (size_t)dim);
        if (lse) lse[h * p->total_q + q0 + i] = -INFINITY;
        continue;
      }
      double mx = -INFINITY;
      for (int64_t j = lo; j < hi; j++) {
        const double *kr = k + (k0 + j) * ks + g * dim, *vr = v + (k0 + j) * ks + g * dim;
        double dot = 0.0, dd = 0.0;
        for (int c = 0; c < dim; c++) {
          dot += qr[c] * kr[c];
          dd += dor[c] * vr[c];
        }
        s[j] = p->scale * dot;
        dp[j] = dd;
        if (s[j] > mx) mx = s[j];
      }
      double sum = 0.0;
      for (int64_t j = lo; j < hi; j++) {
        s[j] = exp(s[j] - mx);
        sum += s[j];
      }
      double di = 0.0;
      for (int c = 0; c < dim; c++) acc[c] = 0.0;
      for (int64_t j = lo; j < hi; j++) {
        s[j] /= sum;  // P
        di += s[j] * dp[j];
        const double *vr = v + (k0 + j) * ks + g * dim;
        for (int c = 0; c < dim; c++) acc[c] += s[j] * vr[c];
      }
      if (o)
        for (int c = 0; c < dim; c++) o[c] = acc[c];
      if (lse) lse[h * p->total_q + q0 + i] = mx + log(sum);
      for (int64_t j = lo; j < hi; j++) {
        const double ds = s[j] * (dp[j] - di);
        const double *kr = k + (k0 + j) * ks + g * dim;
        double *dkr = dk + (k0 + j) * ks + g * dim, *dvr = dv + (k0 + j) * ks + g * dim;
        for (int c = 0; c < dim; c++) {
          dqr[c] += p->scale * ds * kr[c];
          dkr[c] += p->scale * ds * qr[c];
          dvr[c] += s[j] * dor[c];
        }
      }
    }
  }
  free(s);
  free(dp);
  free(acc);
}

void ag_ref_jagged_bwd(const ag_ref_jagged_params *p, const double *q, const double *k,
                       const double *v, const double *dout, const int32_t *cu_q,
                       const int32_t *cu_k, double *dq, double *dk, double *dv, double *out,
                       double *lse) {
  for (int64_t b = 0; b < p->batch; b++)
    for (int64_t g = 0; g < p->kv_heads; g++)
      ag_ref_jagged_bwd_part(p, q, k, v, dout, cu_q, cu_k, b, g, dq, dk, dv, out, lse);
}
