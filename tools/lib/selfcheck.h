// SPDX-License-Identifier: BSD-3-Clause
/* selfcheck.h: run a generated kernel on fresh random data, check it against
 * the float64 CPU reference and time it. Used by `attngen run`, the GPU
 * tests and the benchmark; sized for tensors past 2^31 elements (inputs are
 * generated and verified in chunks, the reference runs on a sample). Part
 * of the tools library (build/libattngen_tools.a, not libattngen): it
 * includes only the public header. */
#ifndef AG_SELFCHECK_H
#define AG_SELFCHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "attngen.h"

typedef struct ag_check_options {
  uint64_t seed;          /* inputs are a pure function of (seed, element) */
  int64_t max_ref_macs;   /* reference budget; 0: default (4e8) */
  int time_iters;         /* 0: no timing; else median of this many launches */
  int warmup_iters;
  float dout_scale;        /* backward: dO's values times this (0: 1), e.g. small gradients */
} ag_check_options;

/* The relative error a check must stay within, as the GPU tests and
 * `attngen run` judge it: the forward's output 1e-2 in bf16 and 2e-3 in
 * fp16; each of the backward's gradients (dQ, dK, dV) 2e-2 and 5e-3. */
double ag_check_tolerance(ag_dtype dtype, bool backward);

typedef struct ag_check_result {
  double rel_error;        /* ||O - ref|| / ||ref|| over the sampled sequences */
  int64_t sampled_seqs;    /* sequences compared with the reference */
  int64_t unwritten;       /* elements inside [0, total) left as the poison */
  int64_t guard_clobbered; /* elements written past the end of O */
  int64_t blocks;          /* diagonal blocks (sum of ceil(len / block)) */
  double median_ms;        /* when timed */
  double bytes;            /* bytes the forward must move: Q, K, V, O once */
} ag_check_result;

/* Device data for one shape: Q, K, V, O (+ one guard block of rows after
 * O) and the offsets, inputs filled from (seed, element). Reusable across
 * kernels of the same dtype and head_dim, for checks and timing. */
typedef struct ag_block_data ag_block_data;
ag_status ag_block_data_create(ag_context *ctx, ag_dtype dtype, int head_dim, int guard_rows,
                               const int32_t *lengths, int64_t batch, int64_t heads,
                               uint64_t seed, ag_block_data **out_data, ag_error *err);
void ag_block_data_destroy(ag_block_data *data);
/* Bytes the forward must move: Q, K, V read once and O written once. */
double ag_block_data_bytes(const ag_block_data *data);
/* Poison O, launch, synchronize, scan O and compare sampled sequences with
 * the reference (max_ref_macs: 0 for the default budget). With rotary
 * embeddings the reference rotates its inputs first (float64); a kernel
 * that takes its positions from a table gets one of real sines and cosines
 * of random angles, stored in the dtype, made on first use and kept with
 * the data (ag_block_data_bytes does not count it). */
ag_status ag_block_data_check(ag_block_data *data, ag_kernel *kernel, int64_t max_ref_macs,
                              ag_check_result *out, ag_error *err);
/* Median milliseconds over `iters` launches timed with CUDA events. */
ag_status ag_block_data_time(ag_block_data *data, ag_kernel *kernel, int warmup, int iters,
                             double *out_median_ms, ag_error *err);

/* All of the above in one call: allocates Q, K, V, O (+ one guard block of rows) and the offsets on the
 * kernel's device for the given sequence lengths (host array of `batch`),
 * fills the inputs, poisons O with NaN, launches, checks and frees.
 * Synchronizes. AG_ERR_CUDA / AG_ERR_NOMEM when memory runs out. */
ag_status ag_selfcheck_block_forward(ag_kernel *kernel, const int32_t *lengths, int64_t batch,
                                     int64_t heads, const ag_check_options *opt,
                                     ag_check_result *out, ag_error *err);

/* ---- backward ----
 * The same for the backward pass: Q, K, V, dO (inputs 0..3 of the element
 * hash), dQ, dK, dV (+ one guard block of rows after each), NaN-poisoned
 * before the launch and compared per gradient. */
typedef struct ag_check_bwd_result {
  double rel_error[3];     /* dQ, dK, dV: ||got - ref|| / ||ref|| over the sampled sequences */
  int64_t sampled_seqs;    /* sequences compared with the reference */
  int64_t unwritten[3];    /* elements of dQ, dK, dV inside [0, total) left as the poison */
  int64_t guard_clobbered; /* elements written past the end of dQ, dK or dV */
  int64_t blocks;          /* diagonal blocks (sum of ceil(len / block)) */
  double median_ms;        /* when timed */
  double bytes;            /* bytes the backward must move: Q, K, V, dO, dQ, dK, dV once */
} ag_check_bwd_result;

typedef struct ag_block_bwd_data ag_block_bwd_data;
ag_status ag_block_bwd_data_create(ag_context *ctx, ag_dtype dtype, int head_dim, int guard_rows,
                                   const int32_t *lengths, int64_t batch, int64_t heads,
                                   uint64_t seed, float dout_scale, ag_block_bwd_data **out_data,
                                   ag_error *err);
void ag_block_bwd_data_destroy(ag_block_bwd_data *data);
double ag_block_bwd_data_bytes(const ag_block_bwd_data *data);
/* Poison dQ, dK, dV, launch ag_block_backward, synchronize, scan and compare
 * sampled sequences with ag_ref_block_backward (with rotary embeddings,
 * ag_ref_block_backward_rotary_f64, and a rotary table as for the forward).
 * The kernel's spec must include the backward pass. */
ag_status ag_block_bwd_data_check(ag_block_bwd_data *data, ag_kernel *kernel,
                                  int64_t max_ref_macs, ag_check_bwd_result *out, ag_error *err);
ag_status ag_block_bwd_data_time(ag_block_bwd_data *data, ag_kernel *kernel, int warmup,
                                 int iters, double *out_median_ms, ag_error *err);
/* All of the above in one call, like ag_selfcheck_block_forward. */
ag_status ag_selfcheck_block_backward(ag_kernel *kernel, const int32_t *lengths, int64_t batch,
                                      int64_t heads, const ag_check_options *opt,
                                      ag_check_bwd_result *out, ag_error *err);

#endif
