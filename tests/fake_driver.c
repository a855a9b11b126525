// SPDX-License-Identifier: BSD-3-Clause
/* fake_driver.c: the recording CUDA driver table of fake_driver.h. Each
 * test runs in its own forked process, so one record serves them all. */
#include "fake_driver.h"

#include <check.h>
#include <string.h>

ag_fake_launch ag_fake_seen;
static ag_driver fake_driver;

static CUcontext fake_below; /* one level of the context stack is enough here */

static CUresult CUDAAPI fake_push(CUcontext c) {
  fake_below = ag_fake_seen.current;
  ag_fake_seen.current = c;
  ag_fake_seen.pushes++;
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fake_pop(CUcontext *c) {
  *c = ag_fake_seen.current;
  ag_fake_seen.current = fake_below;
  fake_below = NULL;
  ag_fake_seen.pops++;
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fake_get_current(CUcontext *c) {
  *c = ag_fake_seen.current;
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fake_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                    CUstream stream, void **params, void **extra) {
  (void)stream;
  ag_fake_launch *s = &ag_fake_seen;
  /* one-dimensional grids and blocks; the jagged kernels' grids have heads in y */
  ck_assert_uint_eq((s->jagged ? 1 : gy) * gz * by * bz, 1);
  ck_assert_ptr_null(extra);
  if (s->count < 4) s->grids_x[s->count] = gx, s->grids_y[s->count] = gy;
  s->grid_y = gy;
  const int n = s->ptrs;
  ck_assert_int_le(n, (int)(sizeof s->ptr / sizeof s->ptr[0]));
  s->count++;
  s->fn = f;
  s->grid = gx, s->block = bx, s->smem = smem;
  for (int i = 0; i < n; i++) s->ptr[i] = *(CUdeviceptr *)params[i];
  s->batch = *(long long *)params[n];
  s->heads = *(int *)params[n + 1];
  if (s->jagged) {
    s->kv_heads = *(int *)params[n + 2];
    s->total = *(long long *)params[n + 3];
    s->total_k = *(long long *)params[n + 4];
    s->items = *(long long *)params[n + 5];
    for (int m = 0; m < s->tmaps && m < 2; m++) {
      const CUtensorMap *map = params[n + 6 + m];
      ck_assert_uint_eq((uintptr_t)map % 64, 0); /* a map's alignment */
      memcpy(s->map_words[m], map, sizeof s->map_words[m]);
    }
    return CUDA_SUCCESS;
  }
  s->total = *(long long *)params[n + 2];
  s->items = *(long long *)params[n + 3];
  for (int i = 0; i < s->strides && i < 8; i++) s->stride[i] = *(int *)params[n + 4 + i];
  if (s->strides) s->kv_heads = *(int *)params[n + 4 + s->strides]; /* after the strides */
  return CUDA_SUCCESS;
}

static CUresult CUDAAPI fake_encode(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank,
                                    void *global, const cuuint64_t *dims,
                                    const cuuint64_t *strides, const cuuint32_t *box,
                                    const cuuint32_t *steps, CUtensorMapInterleave interleave,
                                    CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                    CUtensorMapFloatOOBfill fill) {
  (void)steps, (void)interleave, (void)fill;
  ag_fake_launch *s = &ag_fake_seen;
  s->encodes++;
  s->enc_type = (int)type, s->enc_rank = rank, s->enc_swizzle = (int)swizzle, s->enc_l2 = (int)l2;
  for (unsigned i = 0; i < 3 && i < rank; i++) s->enc_dims[i] = dims[i], s->enc_box[i] = box[i];
  for (unsigned i = 0; i + 1 < rank && i < 2; i++) s->enc_strides[i] = strides[i];
  memset(map, 0, sizeof *map);
  unsigned long long words[2] = {(unsigned long long)(uintptr_t)global, dims[rank - 1]};
  memcpy(map, words, sizeof words);
  return CUDA_SUCCESS;
}

void ag_fake_driver_attach(ag_context *ctx, int ptrs) {
  memset(&fake_driver, 0, sizeof fake_driver);
  fake_driver.cuCtxPushCurrent = fake_push;
  fake_driver.cuCtxPopCurrent = fake_pop;
  fake_driver.cuCtxGetCurrent = fake_get_current;
  fake_driver.cuLaunchKernel = fake_launch;
  fake_driver.cuTensorMapEncodeTiled = fake_encode;
  ctx->drv = &fake_driver;
  ctx->cu = (CUcontext)(uintptr_t)0xC0; /* not current until pushed */
  ctx->sm_count = 132;
  memset(&ag_fake_seen, 0, sizeof ag_fake_seen);
  fake_below = NULL;
  ag_fake_seen.ptrs = ptrs;
}

void ag_fake_jagged_kernel(ag_fake_kernel *f, const char *yaml, int ptrs) {
  memset(f, 0, sizeof *f);
  ag_error err = {0};
  ag_status st = ag_spec_load_string(yaml, strlen(yaml), "fake.yaml", &f->kernel.spec, &err);
  ck_assert_msg(st == AG_OK, "%s", err.message ? err.message : "");
  ck_assert_int_eq(ag_plan_make(&f->kernel.spec, &f->kernel.plan, &err), AG_OK);
  ag_fake_driver_attach(&f->ctx, ptrs);
  ag_fake_seen.jagged = true;
  f->kernel.ctx = &f->ctx;
  for (int i = 0; i < f->kernel.plan.nkernels; i++) {
    f->kernel.fn[i] = (CUfunction)(uintptr_t)(0x100 + i);
    f->kernel.ctas_per_sm[i] = 1;
  }
}
