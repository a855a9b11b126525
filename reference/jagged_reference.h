// SPDX-License-Identifier: BSD-3-Clause
/* jagged_reference.h: the float64 CPU reference for jagged (variable-length,
 * FlashAttention "varlen") attention forward, with causal masks aligned to
 * the bottom right, sliding windows and grouped-query heads. Needs only libc
 * and libm (and the 16-bit conversions of reference.c). C11.
 *
 * Layout: q [total_q, heads, head_dim], k and v [total_k, kv_heads,
 * head_dim]; sequence b owns query rows cu_q[b] .. cu_q[b + 1] - 1 and key
 * rows cu_k[b] .. cu_k[b + 1] - 1 (cu_q == cu_k for self-attention). Query
 * head h reads kv head h / (heads / kv_heads).
 *
 * Visibility of key j (0-based in its sequence) to query i (likewise), with
 * Lq, Lk the sequence's lengths and d = Lk - Lq:
 *   causal:           j <= i + d
 *   window [lf, rt]:  i + d - lf <= j <= i + d + rt  (a negative bound means
 *                     that side is unbounded; causal with a window means rt 0)
 * A row that sees no key gets O = 0 and LSE = -inf. */
#ifndef AG_JAGGED_REFERENCE_H
#define AG_JAGGED_REFERENCE_H

#include <stdbool.h>
#include <stdint.h>

#include "attngen.h"

typedef struct ag_ref_jagged_params {
  int64_t batch;
  int64_t total_q;         /* rows of q: the row stride of lse's [heads, total_q] */
  int64_t heads, kv_heads; /* kv_heads divides heads */
  int head_dim;
  double scale;            /* softmax scale applied to Q K^T */
  bool causal;
  bool window;             /* with window_left, window_right */
  int64_t window_left, window_right;
} ag_ref_jagged_params;

/* Whether query i sees key j in a sequence of lq queries and lk keys. */
bool ag_ref_jagged_visible(const ag_ref_jagged_params *p, int64_t lq, int64_t lk, int64_t i,
                           int64_t j);

/* The keys query i sees form one range [*lo, *hi) (empty when *lo >= *hi),
 * clamped to [0, lk). */
void ag_ref_jagged_key_range(const ag_ref_jagged_params *p, int64_t lq, int64_t lk, int64_t i,
                             int64_t *lo, int64_t *hi);

/* Forward in float64 from 16-bit inputs of `dtype`. out: [total_q, heads,
 * head_dim] doubles; lse: [heads, total_q] doubles, the natural log of the
 * row's softmax denominator sum_j exp(scale * q.k_j) (-INFINITY for a row
 * without keys). Either output may be NULL. Every row of every sequence is
 * written; rows outside all sequences are left alone. Offsets must be
 * valid (non-decreasing, cu_q[0] >= 0). */
void ag_ref_jagged_forward(ag_dtype dtype, const ag_ref_jagged_params *p, const uint16_t *q,
                           const uint16_t *k, const uint16_t *v, const int32_t *cu_q,
                           const int32_t *cu_k, double *out, double *lse);

/* Only sequence b and head h of ag_ref_jagged_forward (either output may
 * be NULL), for callers that share the work between threads: distinct
 * (b, h) pairs write distinct elements. */
void ag_ref_jagged_forward_part(ag_dtype dtype, const ag_ref_jagged_params *p, const uint16_t *q,
                                const uint16_t *k, const uint16_t *v, const int32_t *cu_q,
                                const int32_t *cu_k, int64_t b, int64_t h, double *out,
                                double *lse);

/* ag_ref_jagged_forward_part from float64 inputs (rotated copies, say). */
void ag_ref_jagged_forward_part_f64(const ag_ref_jagged_params *p, const double *q,
                                    const double *k, const double *v, const int32_t *cu_q,
                                    const int32_t *cu_k, int64_t b, int64_t h, double *out,
                                    double *lse);

/* The same from float64 inputs (the function a backward's finite-difference
 * test differentiates). */
void ag_ref_jagged_forward_f64(const ag_ref_jagged_params *p, const double *q, const double *k,
                               const double *v, const int32_t *cu_q, const int32_t *cu_k,
                               double *out, double *lse);

#endif
