// SPDX-License-Identifier: BSD-3-Clause
/* tune_block.c: times plan variants of the block-diagonal forward (tiles
 * resident per CTA, grid shape, register cap) and of the backward (heads
 * per tile, stages, grid shape, CTAs per SM) on ads shapes, next to a
 * device-to-device copy measured in the same run. A tuning tool for
 * choosing plan_block.c's defaults; prints one line per variant.
 * Usage: tune_block [--bwd] [--dim 64|128] [L ...] (default: both head
 * dims, L = 1024 and 4096). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "runtime.h" /* internal: the plan and the driver table (see README, Development) */
#include "selfcheck.h"

static void usage(const char *why) {
  fprintf(stderr, "tune_block: %s\nusage: tune_block [--bwd] [--dim 64|128] [L ...]\n", why);
  exit(2);
}

static void die(ag_error *e) {
  fprintf(stderr, "tune_block: %s\n", e->message ? e->message : ag_strerror(e->code));
  exit(1);
}

/* Median ms of a device-to-device copy of `bytes` (counts read + write). */
static double copy_ms(ag_context *ctx, size_t bytes) {
  const ag_driver *drv = ctx->drv;
  CUdeviceptr a, b;
  CUevent e0, e1;
  CUcontext popped;
  drv->cuCtxPushCurrent(ctx->cu);
  if (drv->cuMemAlloc(&a, bytes) || drv->cuMemAlloc(&b, bytes)) {
    fprintf(stderr, "tune_block: cuMemAlloc failed\n");
    exit(1);
  }
  drv->cuMemsetD8(a, 1, bytes);
  drv->cuEventCreate(&e0, 0);
  drv->cuEventCreate(&e1, 0);
  float ms[21];
  for (int i = 0; i < 24; i++) {
    drv->cuEventRecord(e0, NULL);
    drv->cuMemcpyDtoD(b, a, bytes);
    drv->cuEventRecord(e1, NULL);
    drv->cuEventSynchronize(e1);
    if (i >= 3) drv->cuEventElapsedTime(&ms[i - 3], e0, e1);
  }
  for (int i = 0; i < 21; i++) /* insertion sort, then the median */
    for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
      float t = ms[j]; ms[j] = ms[j - 1]; ms[j - 1] = t;
    }
  drv->cuMemFree(a);
  drv->cuMemFree(b);
  drv->cuEventDestroy(e0);
  drv->cuEventDestroy(e1);
  drv->cuCtxPopCurrent(&popped);
  return ms[10];
}

/* One forward variant: tiles resident per CTA, grid (0 = persistent, else
 * tiles per CTA), register cap for a minimum of CTAs per SM. */
typedef struct fwd_variant { int stages, per_cta, min_ctas; } fwd_variant;
static const fwd_variant fwd_variants[] = {{2, 8, 2}, {2, 6, 2}, {2, 4, 2}, {2, 3, 2},
                                           {1, 6, 4}, {1, 4, 4}, {1, 3, 4}, {1, 2, 4}};

/* One backward variant: heads per tile, stages, grid (tiles per CTA, 0 =
 * persistent), CTAs per SM (0: the most that fit), and wgmma where the
 * shape allows it (0: mma.sync only). */
typedef struct bwd_variant { int hpt, stages, per_cta, min_ctas, wgmma; } bwd_variant;
static const bwd_variant bwd_variants[] = {
    {1, 2, 8, 0, 1}, {1, 1, 8, 0, 1}, {1, 1, 8, 5, 1}, {1, 1, 8, 6, 1}, {1, 1, 16, 6, 1},
    {1, 2, 4, 0, 1}, {1, 2, 16, 0, 1}};

/* The tuning spec: 64-token blocks, bf16, `dim`, the given passes. */
static ag_spec tune_spec(int dim, const char *passes) {
  ag_error err = {0};
  char yaml[256];
  snprintf(yaml, sizeof yaml, "name: tune\npattern: block_diagonal\nblock_size: 64\n"
           "head_dim: %d\ndtype: bf16\npasses: [%s]\n", dim, passes);
  ag_spec spec;
  if (ag_spec_load_string(yaml, strlen(yaml), "tune.yaml", &spec, &err)) die(&err);
  return spec;
}

/* The kernel of a plan variant, compiled (cached by its source). */
static ag_kernel *variant_kernel(ag_context *ctx, const ag_spec *spec, const ag_plan *plan) {
  ag_error err = {0};
  char *src;
  if (ag_emit_plan(spec, plan, &src, &err)) die(&err);
  ag_kernel *k;
  ag_status st = ag_context_kernel(ctx, spec, plan, src, ctx->arch, NULL, &k, &err);
  free(src);
  if (st) die(&err);
  return k;
}

static void tune_forward(ag_context *ctx, const int32_t *len, int64_t batch, int64_t heads,
                         int L, int dim) {
  ag_error err = {0};
  ag_spec spec = tune_spec(dim, "forward");
  ag_block_data *d;
  if (ag_block_data_create(ctx, spec.dtype, dim, 64, len, batch, heads, 7, &d, &err)) die(&err);
  double bytes = ag_block_data_bytes(d);
  double cms = copy_ms(ctx, (size_t)(bytes / 2));
  printf("fwd L=%d d=%d: %.0f MB moved; copy of half that: %.4f ms = %.3f TB/s\n", L, dim,
         bytes / 1e6, cms, bytes / (cms * 1e-3) / 1e12);
  for (size_t vi = 0; vi < sizeof fwd_variants / sizeof fwd_variants[0]; vi++) {
    const fwd_variant *v = &fwd_variants[vi];
    ag_plan plan;
    if (ag_plan_make(&spec, &plan, &err)) die(&err);
    ag_plan_block_fwd *f = &plan.fwd;
    int hpt = f->heads_per_tile;
    f->stages = v->stages;
    f->smem_bytes = v->stages * 3 * 64 * hpt * dim * 2;
    f->items_per_cta = v->per_cta;
    f->min_ctas_per_sm = v->min_ctas;
    if (f->smem_bytes * v->min_ctas > 227 * 1024) continue;
    ag_plan_kernels(&spec, &plan);
    snprintf(plan.kernels[0].name, sizeof plan.kernels[0].name, "tune_d%d_h%d_s%d_i%d_m%d", dim,
             hpt, v->stages, v->per_cta, v->min_ctas);
    ag_kernel *k = variant_kernel(ctx, &spec, &plan);
    ag_check_result r;
    if (ag_block_data_check(d, k, 20000000, &r, &err)) die(&err);
    double ms;
    if (ag_block_data_time(d, k, 3, 30, &ms, &err)) die(&err);
    printf("  heads/tile %d, stages %d, tiles/CTA %2d, min CTAs %d: %d CTAs/SM, %.4f ms, %.3f TB/s "
           "= %.1f%% of copy; rel err %.2e%s\n",
           hpt, v->stages, v->per_cta, v->min_ctas, k->ctas_per_sm[0], ms, bytes / (ms * 1e-3) / 1e12,
           100 * cms / ms, r.rel_error, r.unwritten || r.guard_clobbered ? " UNWRITTEN/GUARD!" : "");
    fflush(stdout);
  }
  ag_block_data_destroy(d);
}

static void tune_backward(ag_context *ctx, const int32_t *len, int64_t batch, int64_t heads,
                          int L, int dim) {
  ag_error err = {0};
  ag_spec spec = tune_spec(dim, "backward");
  ag_block_bwd_data *d;
  if (ag_block_bwd_data_create(ctx, spec.dtype, dim, 64, len, batch, heads, 7, 1.f, &d, &err))
    die(&err);
  double bytes = ag_block_bwd_data_bytes(d);
  double cms = copy_ms(ctx, (size_t)(bytes / 2));
  printf("bwd L=%d d=%d: %.0f MB moved; copy of half that: %.4f ms = %.3f TB/s\n", L, dim,
         bytes / 1e6, cms, bytes / (cms * 1e-3) / 1e12);
  for (size_t vi = 0; vi < sizeof bwd_variants / sizeof bwd_variants[0]; vi++) {
    const bwd_variant *v = &bwd_variants[vi];
    ag_plan plan;
    if (ag_plan_make(&spec, &plan, &err)) die(&err);
    ag_plan_bwd *b = &plan.bwd;
    if (!ag_plan_backward_shape(&plan, v->hpt, v->stages, v->min_ctas, 32, b)) continue;
    b->items_per_cta = v->per_cta;
    if (!v->wgmma) {
      if (!b->wgmma) continue; /* the same kernel as its wgmma twin */
      b->wgmma = false;
    }
    ag_plan_kernels(&spec, &plan);
    ag_plan_kernel *bk = &plan.kernels[plan.nkernels - 1];
    snprintf(bk->name, sizeof bk->name, "tune_bwd_d%d_h%d_s%d_i%d_m%d%s", dim,
             b->heads_per_tile, b->stages, b->items_per_cta, b->min_ctas_per_sm,
             b->wgmma ? "_wgmma" : "");
    ag_kernel *k = variant_kernel(ctx, &spec, &plan);
    ag_check_bwd_result r;
    if (ag_block_bwd_data_check(d, k, 20000000, &r, &err)) die(&err);
    double ms;
    if (ag_block_bwd_data_time(d, k, 3, 30, &ms, &err)) die(&err);
    printf("  heads/tile %d, stages %d, tiles/CTA %2d, min CTAs %d, warps %d%s%s: %.4f ms, "
           "%.3f TB/s = %.1f%% of copy; rel err dq %.1e dk %.1e dv %.1e%s\n",
           b->heads_per_tile, b->stages, b->items_per_cta, b->min_ctas_per_sm, b->warps,
           b->pds_overlay ? ", P/dS over K/V" : "", b->wgmma ? ", wgmma" : "", ms,
           bytes / (ms * 1e-3) / 1e12, 100 * cms / ms, r.rel_error[0], r.rel_error[1],
           r.rel_error[2],
           r.unwritten[0] || r.unwritten[1] || r.unwritten[2] || r.guard_clobbered
               ? " UNWRITTEN/GUARD!" : "");
    fflush(stdout);
  }
  ag_block_bwd_data_destroy(d);
}

int main(int argc, char **argv) {
  ag_error err = {0};
  ag_context *ctx;
  bool bwd = false;
  int dims[2] = {128, 64}, ndims = 2, ls[8], nl = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bwd")) {
      bwd = true;
    } else if (!strcmp(argv[i], "--dim")) {
      if (i + 1 == argc || (strcmp(argv[i + 1], "64") && strcmp(argv[i + 1], "128")))
        usage("--dim takes 64 or 128");
      dims[0] = atoi(argv[++i]), ndims = 1;
    } else if (argv[i][0] == '-') {
      usage("unknown option");
    } else {
      char *end;
      long L = strtol(argv[i], &end, 10);
      if (*end || end == argv[i] || L < 16 || L > 1 << 20) usage("L must be a length in 16..2^20");
      if (nl == 8) usage("at most 8 lengths");
      ls[nl++] = (int)L;
    }
  }
  if (!nl) ls[nl++] = 1024, ls[nl++] = 4096;
  if (ag_context_create(0, &ctx, &err)) die(&err);
  for (int li = 0; li < nl; li++) {
    int L = ls[li];
    const int64_t batch = 1152, heads = 4;
    int32_t *len = malloc(sizeof(int32_t) * batch);
    uint64_t rng = 42;
    for (int64_t i = 0; i < batch; i++) /* uniform in [0.4 L, L] (sparsity 0.7) */
      len[i] = (int32_t)(0.4 * L + ag_rand_uniform(&rng, 0, 0.6 * L + 1));
    for (int di = 0; di < ndims; di++) {
      if (bwd) tune_backward(ctx, len, batch, heads, L, dims[di]);
      else tune_forward(ctx, len, batch, heads, L, dims[di]);
    }
    free(len);
  }
  ag_context_destroy(ctx);
  return 0;
}
