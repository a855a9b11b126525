/* reference.h: the float64 CPU reference for attention and the 16-bit float
 * conversions it needs. Used by the GPU tests, `attngen run` and the bench;
 * written once, here. Needs only libc and libm. */
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

/* The error measure of the tests: ||got - ref||_F / ||ref||_F over `elems`
 * values; a NaN anywhere in `got` gives +inf. */
double ag_rel_error(ag_dtype dtype, const uint16_t *got, const double *ref, size_t elems);

/* A small, seedable generator (xorshift64*), for reproducible test data.
 * The state lives with the caller. */
uint64_t ag_rand_next(uint64_t *state);
/* Uniform in [lo, hi). */
double ag_rand_uniform(uint64_t *state, double lo, double hi);

#endif
