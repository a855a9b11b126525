// SPDX-License-Identifier: BSD-3-Clause
/* selfcheck_jagged.h: runs a jagged kernel on random data and checks it
 * against the float64 reference (reference/jagged_reference.h,
 * jagged_bwd_reference.h): outputs poisoned with NaN first, every real
 * element checked written, relative errors per tensor, the backward
 * repeated to check it bit for bit, and the times of both passes. For the
 * GPU tests, `attngen run` and the benchmark tools; not part of
 * libattngen. */
#ifndef AG_SELFCHECK_JAGGED_H
#define AG_SELFCHECK_JAGGED_H

#include <stdbool.h>
#include <stdint.h>

#include "attngen.h"

typedef struct ag_jagged_check_options {
  uint64_t seed;
  int64_t heads, kv_heads;  /* kv_heads 0: heads */
  bool backward;            /* also run and check the backward */
  int repeat_backward;      /* extra backward runs compared bit for bit with the first */
  int iters;                /* timed launches of each pass after the check (0: none) */
  /* The reference's work is capped: sequences are checked in order, head 0
   * and the last head of each, until this many multiply-adds are spent
   * (0: 4e9); the first, the longest and the last sequence are always
   * checked. Only the checked sequences' rows are copied to float64, so the
   * host needs memory for the 16-bit tensors and a sample: a run past 2^31
   * elements fits (not for a kernel of the backward alone, whose O and lse
   * come from the reference for every sequence, nor for a broadcast Q's
   * backward, whose dQ sums every sequence). */
  double max_ref_macs;
} ag_jagged_check_options;

typedef struct ag_jagged_check_result {
  double rel_o;             /* ||O - ref|| / ||ref|| over the checked (sequence, head) pairs */
  double lse_abs;           /* max |lse - ref| over rows with keys */
  int64_t lse_mismatch;     /* rows where one is -inf and the other not */
  double rel_dq, rel_dk, rel_dv;
  int64_t unwritten;        /* real elements left NaN (O, lse, dQ, dK, dV) */
  bool bitwise_repeatable;  /* every repeated backward equal to the first */
  bool dkv_repeatable;      /* dK and dV of every repeated backward equal to the first's */
  bool dq_by_atomics;       /* the kernel adds dQ with atomics (the fast sm_90a backward):
                             * only dK and dV need repeat bit for bit */
  int64_t checked_pairs;    /* (sequence, head) pairs compared */
  int64_t checked_grad_pairs; /* (sequence, key head) pairs whose gradients were compared */
  double fwd_ms, bwd_ms;    /* median of `iters` launches (0 when not timed) */
  double fwd_flops;         /* useful FLOPs of the forward: 4 D per visible (query, key) pair */
} ag_jagged_check_result;

/* Tolerances: relative error of O (bf16 1e-2, fp16 2e-3) and of the
 * gradients (2e-2, 5e-3); the lse's absolute error limit is 1e-3 * ... */
double ag_jagged_tolerance(ag_dtype dtype, bool backward);

/* Run `kernel` (a jagged spec) on `batch` sequences of lq[b] queries and
 * lk[b] keys (lk NULL: self-attention, one offsets array for both). */
ag_status ag_selfcheck_jagged(ag_kernel *kernel, const int32_t *lq, const int32_t *lk,
                              int64_t batch, const ag_jagged_check_options *opt,
                              ag_jagged_check_result *out, ag_error *err);

#endif
