// SPDX-License-Identifier: BSD-3-Clause
/* launch_cost.c: what attngen's own C launch path costs a call, without a
 * GPU: ag_block_forward, ag_block_backward and ag_jagged_forward on a
 * planned kernel whose driver table's cuLaunchKernel returns at once (no
 * driver is loaded). What it prints is the library's share of a launch's
 * host time (argument checks, the walk's grid, parameter packing); the
 * rest of a real call is the driver's cuLaunchKernel and the caller's own
 * cost (issue 20: the Python binding's ctypes call). Not part of `all`:
 * `make build/launch_cost && build/launch_cost [CALLS]`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime.h"

static int launches;

static CUresult CUDAAPI no_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                  CUstream stream, void **params, void **extra) {
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)smem;
  (void)stream, (void)params, (void)extra;
  launches++;
  return CUDA_SUCCESS;
}

static CUcontext current;
static CUresult CUDAAPI get_current(CUcontext *c) {
  *c = current;
  return CUDA_SUCCESS;
}

/* `yaml` planned for sm_90a into k, with a driver table that launches
 * nothing and the kernel's context current (as torch leaves it). */
static int kernel_for(const char *yaml, ag_context *ctx, ag_driver *drv, ag_kernel *k) {
  memset(k, 0, sizeof *k);
  ag_error err = {0};
  if (ag_spec_load_string(yaml, strlen(yaml), "launch_cost.yaml", &k->spec, &err) != AG_OK ||
      ag_plan_make(&k->spec, &k->plan, &err) != AG_OK) {
    fprintf(stderr, "launch_cost: %s\n", err.message ? err.message : "no plan");
    ag_error_clear(&err);
    return 1;
  }
  memset(drv, 0, sizeof *drv);
  drv->cuLaunchKernel = no_launch;
  drv->cuCtxGetCurrent = get_current;
  memset(ctx, 0, sizeof *ctx);
  ctx->drv = drv;
  ctx->cu = current = (CUcontext)(uintptr_t)0xC0;
  ctx->sm_count = 132;
  k->ctx = ctx;
  snprintf(k->arch, sizeof k->arch, "sm_90a");
  for (int i = 0; i < k->plan.nkernels; i++) {
    k->fn[i] = (CUfunction)(uintptr_t)(0x100 + i);
    k->ctas_per_sm[i] = 1;
  }
  return 0;
}

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define P(x) ((void *)(uintptr_t)(x))

int main(int argc, char **argv) {
  const long calls = argc > 1 ? atol(argv[1]) : 1000000;
  if (calls <= 0) {
    fprintf(stderr, "usage: launch_cost [CALLS]\n");
    return 2;
  }
  static ag_context ctx;
  static ag_driver drv;
  static ag_kernel block, jagged;
  if (kernel_for("name: b\npattern: block_diagonal\nblock_size: 64\nhead_dim: 64\n"
                 "dtype: bf16\narch: sm_90a\npasses: [forward, backward]\n",
                 &ctx, &drv, &block))
    return 1;
  ag_block_fwd_args f = {.q = P(0x100000), .k = P(0x200000), .v = P(0x300000),
                         .o = P(0x400000), .offsets = P(0x500000), .batch = 2, .heads = 1,
                         .total_tokens = 128};
  ag_block_bwd_args b = {.q = f.q, .k = f.k, .v = f.v, .dout = P(0x600000), .dq = P(0x700000),
                         .dk = P(0x800000), .dv = P(0x900000), .offsets = f.offsets,
                         .batch = 2, .heads = 1, .total_tokens = 128};
  ag_error err = {0};
  for (int round = 0; round < 2; round++) {
    double t0 = seconds();
    for (long i = 0; i < calls; i++)
      if (ag_block_forward(&block, &f, NULL, &err) != AG_OK) goto fail;
    double t1 = seconds();
    for (long i = 0; i < calls; i++)
      if (ag_block_backward(&block, &b, NULL, &err) != AG_OK) goto fail;
    double t2 = seconds();
    printf("ag_block_forward %.0f ns, ag_block_backward %.0f ns a call\n",
           (t1 - t0) / (double)calls * 1e9, (t2 - t1) / (double)calls * 1e9);
  }
  static ag_context jctx;
  static ag_driver jdrv;
  if (kernel_for("name: j\npattern: jagged\nhead_dim: 64\ndtype: bf16\narch: sm_90a\n"
                 "passes: [forward]\n",
                 &jctx, &jdrv, &jagged))
    return 1;
  ag_jagged_fwd_args jf = {.q = P(0x100000), .k = P(0x200000), .v = P(0x300000),
                           .o = P(0x400000), .cu_seqlens_q = P(0x600000),
                           .cu_seqlens_k = P(0x600000), .batch = 2, .heads = 1, .total_q = 128,
                           .total_k = 128};
  double t0 = seconds();
  for (long i = 0; i < calls; i++)
    if (ag_jagged_forward(&jagged, &jf, NULL, &err) != AG_OK) goto fail;
  printf("ag_jagged_forward %.0f ns a call (%d launches in all)\n",
         (seconds() - t0) / (double)calls * 1e9, launches);
  return 0;
fail:
  fprintf(stderr, "launch_cost: %s\n", err.message ? err.message : "failed");
  ag_error_clear(&err);
  return 1;
}
