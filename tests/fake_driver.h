// SPDX-License-Identifier: BSD-3-Clause
/* fake_driver.h: a CUDA driver table for the launch tests without a GPU:
 * context push and pop succeed, and cuLaunchKernel launches nothing but
 * records what it was given. Shared by check_args.c, check_backward.c and
 * check_rotary.c. */
#ifndef AG_TEST_FAKE_DRIVER_H
#define AG_TEST_FAKE_DRIVER_H

#include "runtime.h"

/* The record of the launches since ag_fake_driver_attach. */
typedef struct ag_fake_launch {
  int count, pushes, pops;  /* launches, context pushes and pops */
  CUcontext current;        /* what cuCtxGetCurrent reports: pushes and pops move it */
  int ptrs;                 /* device pointers before `batch` in the parameters: set by the test */
  CUfunction fn;            /* of the last launch, and its shape */
  unsigned grid, block, smem;
  CUdeviceptr ptr[16];      /* its first `ptrs` parameters */
  long long batch, total, items;
  int heads;
  /* Set by the test: the block kernels' row strides (int parameters after
   * `items`) to read, and what the last launch passed (then also its
   * kv_heads, the int after them) */
  int strides;
  int stride[8];
  /* Set by the test for the jagged kernels' parameters (after the
   * pointers: batch, heads, kv_heads, total_q, total_k, items) and their
   * two-dimensional grids. */
  bool jagged;
  int kv_heads;
  long long total_k;
  unsigned grid_y;
  unsigned grids_x[4], grids_y[4]; /* of the first four launches */
  /* cuTensorMapEncodeTiled (set by the test: tmaps, the tensor-map
   * parameters after `items`): its calls, the last one's arguments, and
   * the last launch's maps (the fake writes the global address and the row
   * count into a map's first two words) */
  int tmaps, encodes;
  unsigned long long enc_dims[3], enc_strides[2];
  unsigned enc_box[3], enc_rank;
  int enc_swizzle, enc_type, enc_l2;
  unsigned long long map_words[2][2];
} ag_fake_launch;

extern ag_fake_launch ag_fake_seen;

/* Give `ctx` the recording driver (and 132 SMs) and clear the record; the
 * launches that follow are expected to pass `ptrs` device pointers before
 * batch, heads, total tokens and items. */
void ag_fake_driver_attach(ag_context *ctx, int ptrs);

/* A jagged-pattern kernel on the recording driver, without a device: the
 * spec from `yaml` (which must load), its plan, made-up function handles,
 * one CTA per SM; the launches are read as the jagged kernels' parameters. */
typedef struct ag_fake_kernel {
  ag_context ctx;
  ag_kernel kernel;
} ag_fake_kernel;
void ag_fake_jagged_kernel(ag_fake_kernel *f, const char *yaml, int ptrs);

#endif
