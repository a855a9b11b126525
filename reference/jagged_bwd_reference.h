// SPDX-License-Identifier: BSD-3-Clause
/* jagged_bwd_reference.h: the float64 CPU reference for jagged attention
 * backward: dQ, dK, dV from Q, K, V and dO, with the forward's O and LSE
 * recomputed along the way (and handed out where asked). Same layout,
 * masks (bottom-right causal, windows) and grouped-query heads as
 * jagged_reference.h, whose parameters and key ranges it uses. C11; libc,
 * libm and jagged_reference.c. Test-only code: allocation failure aborts.
 *
 * For each sequence and q head h (kv head h / (heads / kv_heads)), with P the
 * softmax of scale * Q K^T over the keys each query sees:
 *   dV = P^T dO,  dP = dO V^T,  D = rowsum(P (.) dP) (= rowsum(dO (.) O)),
 *   dS = P (.) (dP - D),  dQ = scale * dS K,  dK = scale * dS^T Q
 * dK and dV sum over the q heads of their kv head. A row that sees no key
 * has dQ = 0; a key no query sees has dK = dV = 0. */
#ifndef AG_JAGGED_BWD_REFERENCE_H
#define AG_JAGGED_BWD_REFERENCE_H

#include <stdint.h>

#include "jagged_reference.h"

/* q [total_q, heads, dim], k, v [total_k, kv_heads, dim], dout like q, all
 * doubles. Writes dq like q, dk and dv like k, for every token of every
 * sequence; out (like q) and lse ([heads, total_q], -INFINITY for a row
 * without keys) too where not NULL. Offsets must be valid. */
void ag_ref_jagged_bwd(const ag_ref_jagged_params *p, const double *q, const double *k,
                       const double *v, const double *dout, const int32_t *cu_q,
                       const int32_t *cu_k, double *dq, double *dk, double *dv, double *out,
                       double *lse);

/* Only sequence b and kv head g (with its group's q heads) of
 * ag_ref_jagged_bwd, for callers that share the work between threads:
 * distinct (b, g) pairs write distinct elements. */
void ag_ref_jagged_bwd_part(const ag_ref_jagged_params *p, const double *q, const double *k,
                            const double *v, const double *dout, const int32_t *cu_q,
                            const int32_t *cu_k, int64_t b, int64_t g, double *dq, double *dk,
                            double *dv, double *out, double *lse);

#endif
