// SPDX-License-Identifier: BSD-3-Clause
/* reference.h: the float64 CPU reference for attention, with or without
 * rotary embeddings, and the 16-bit float conversions it needs. Used by the
 * GPU tests, `attngen run` and the bench; written once, here. Needs only
 * libc and libm. */
#ifndef AG_REFERENCE_H
#define AG_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attngen.h"

/* 16-bit float conversions, round to nearest even; NaN stays NaN. */
uint16_t ag_float_to_bf16(float f);
float ag_bf16_to_float(uint16_t h);
uint16_t ag_float_to_fp16(float f);
float ag_fp16_to_float(uint16_t h);
uint16_t ag_float_to_half(ag_dtype dtype, float f);
float ag_half_to_float(ag_dtype dtype, uint16_t h);

/* Block-diagonal attention forward in float64 over whole tensors: q, k, v
 * are [total, heads, dim] 16-bit values of `dtype`; out is [total, heads,
 * dim] doubles, written for every token of every sequence of offsets. */
void ag_ref_block_forward(ag_dtype dtype, int block_size, bool causal, double scale,
                          const uint16_t *q, const uint16_t *k, const uint16_t *v,
                          const int32_t *offsets, int64_t batch, int64_t heads, int head_dim,
                          double *out);

/* The same from float64 inputs (q, k, v [total, heads, dim] doubles): the
 * function the backward's finite-difference test differentiates. */
void ag_ref_block_forward_f64(int block_size, bool causal, double scale, const double *q,
                              const double *k, const double *v, const int32_t *offsets,
                              int64_t batch, int64_t heads, int head_dim, double *out);

/* Block-diagonal attention backward in float64, from the definitions. For
 * each block and head, with L the loss and dO = dL/dO given:
 *   P  = softmax(scale * Q K^T) over the keys the query sees (its block; with
 *        causal, keys at or before it), 0 elsewhere
 *   dV = P^T dO
 *   dP = dO V^T
 *   dS = P (.) (dP - rowsum(P (.) dP))     (dL/d(scale * Q K^T))
 *   dQ = scale * dS K,   dK = scale * dS^T Q
 * q, k, v, dout are [total, heads, dim] 16-bit values of `dtype`; dq, dk, dv
 * are [total, heads, dim] doubles, written for every token of every sequence
 * of offsets. Allocates O(block_size^2) scratch; aborts if that fails. */
void ag_ref_block_backward(ag_dtype dtype, int block_size, bool causal, double scale,
                           const uint16_t *q, const uint16_t *k, const uint16_t *v,
                           const uint16_t *dout, const int32_t *offsets, int64_t batch,
                           int64_t heads, int head_dim, double *dq, double *dk, double *dv);
/* The same from float64 inputs. */
void ag_ref_block_backward_f64(int block_size, bool causal, double scale, const double *q,
                               const double *k, const double *v, const double *dout,
                               const int32_t *offsets, int64_t batch, int64_t heads,
                               int head_dim, double *dq, double *dk, double *dv);

/* ---- rotary embeddings ----
 * Pair i (0 <= i < dim / 2) of every head of token t is (x[2i], x[2i + 1])
 * (AG_ROTARY_INTERLEAVED) or (x[i], x[i + dim / 2]) (AG_ROTARY_HALF), rotated
 * by the angle a(t, i):
 *   (x0, x1) -> (x0 cos a - x1 sin a, x0 sin a + x1 cos a).
 * Positions AG_POSITIONS_TABLE: sin a = table[t][i], cos a = table[t][dim / 2
 * + i], whatever they are (a table rounded to 16 bits is not exactly
 * orthogonal; the rotation uses its values as given). AG_POSITIONS_SEQUENCE
 * and AG_POSITIONS_BLOCK: a = p base^(-2i / dim), p the token's index in its
 * sequence, or in its block of block_size tokens (blocks cut from each
 * sequence's start). */
typedef struct ag_ref_rotary {
  ag_rotary_layout layout;       /* AG_ROTARY_NONE: nothing is rotated */
  unsigned apply_to;             /* AG_APPLY_* bits: the tensors rotated */
  ag_rotary_positions positions;
  double base;                   /* computed positions */
  int block_size;                /* AG_POSITIONS_BLOCK */
  const double *table;           /* AG_POSITIONS_TABLE: [total, dim] */
} ag_ref_rotary;

/* Rotate x ([total, heads, dim] doubles) in place, pair by pair, for every
 * token of every sequence of offsets; with `inverse`, by -a instead, which
 * is the transpose R^T (the gradient's chain rule: x' = R x gives dL/dx =
 * R^T dL/dx'). rot->apply_to is not consulted. */
void ag_ref_rotary_apply(const ag_ref_rotary *rot, bool inverse, const int32_t *offsets,
                         int64_t batch, int64_t heads, int head_dim, double *x);

/* ag_ref_rotary_apply with the tokens of sequence b at positions shift[b]
 * on (shift NULL: 0), as the jagged pattern's queries are (bottom-right
 * aligned: shift Lk - Lq). Computed positions only are shifted; a table is
 * read at the token's row as before. */
void ag_ref_rotary_apply_shifted(const ag_ref_rotary *rot, bool inverse, const int32_t *offsets,
                                 const int64_t *shift, int64_t batch, int64_t heads,
                                 int head_dim, double *x);

/* Attention with rotary embeddings, as the kernels compute it, in float64:
 * the tensors of rot->apply_to rotated, then ag_ref_block_forward_f64. The
 * inputs are left as they are (rotated copies are made). */
void ag_ref_block_forward_rotary_f64(const ag_ref_rotary *rot, int block_size, bool causal,
                                     double scale, const double *q, const double *k,
                                     const double *v, const int32_t *offsets, int64_t batch,
                                     int64_t heads, int head_dim, double *out);
/* Its gradients with respect to the unrotated q, k, v: the rotated copies
 * through ag_ref_block_backward_f64, then dq, dk, dv of the rotated tensors
 * rotated back (R^T). */
void ag_ref_block_backward_rotary_f64(const ag_ref_rotary *rot, int block_size, bool causal,
                                      double scale, const double *q, const double *k,
                                      const double *v, const double *dout,
                                      const int32_t *offsets, int64_t batch, int64_t heads,
                                      int head_dim, double *dq, double *dk, double *dv);

/* The error measure of the tests: ||got - ref||_F / ||ref||_F over `elems`
 * values; a NaN anywhere in `got` gives +inf. */
double ag_rel_error(ag_dtype dtype, const uint16_t *got, const double *ref, size_t elems);

/* A small, seedable generator (xorshift64*), for reproducible test data.
 * The state lives with the caller. */
uint64_t ag_rand_next(uint64_t *state);
/* Uniform in [lo, hi). */
double ag_rand_uniform(uint64_t *state, double lo, double hi);

#endif
