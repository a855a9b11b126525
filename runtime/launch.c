/* launch.c: argument checks and launches for the generated kernels. Every
 * check runs on the host before the launch and costs no synchronization. */
#include <stdint.h>
#include <string.h>

#include "runtime.h"

/* Items the block-diagonal kernel walks: (batch + floor(total / block))
 * virtual blocks times head groups; see the work walk in
 * templates/block_fwd.cu. -1 when that overflows. */
static int64_t block_items(int64_t batch, int64_t total, int block, int64_t groups) {
  if (total / block > INT64_MAX - batch) return -1; /* checked before adding: no UB */
  int64_t vblocks = batch + total / block;
  if (vblocks > INT64_MAX / groups) return -1;
  return vblocks * groups;
}

static ag_status check_tensor(const void *p, const char *name, ag_error *err) {
  if (!p) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "%s is a null pointer", name);
  if ((uintptr_t)p % 16)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "%s (%p) is not 16-byte aligned; the kernel loads 16 bytes at a time", name,
                   p);
  return AG_OK;
}

/* The optional host copy of the offsets: starts at 0, never decreases,
 * ends at total. Reads batch + 1 entries; no synchronization. */
static ag_status check_host_offsets(const int32_t *off, int64_t batch, int64_t total,
                                    ag_error *err) {
  if (off[0] != 0)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "host_offsets[0] is %d; it must be 0",
                   (int)off[0]);
  for (int64_t i = 0; i < batch; i++)
    if (off[i + 1] < off[i])
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                     "host_offsets decrease at index %lld (%d after %d)", (long long)(i + 1),
                     (int)off[i + 1], (int)off[i]);
  if (off[batch] != total)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "host_offsets[%lld] (the last) is %d, not total_tokens (%lld)",
                   (long long)batch, (int)off[batch], (long long)total);
  return AG_OK;
}

ag_status ag_block_forward(ag_kernel *kernel, const ag_block_fwd_args *a,
                           struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  const ag_spec *s = &kernel->spec;
  const ag_plan *p = &kernel->plan;
  if (s->pattern != AG_PATTERN_BLOCK_DIAGONAL || !(s->passes & AG_PASS_FORWARD))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "kernel '%s' is not a block-diagonal forward kernel", s->name);
  if (a->batch < 0 || a->heads < 1 || a->total_tokens < 0)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "need batch >= 0, heads >= 1, total_tokens >= 0 (got %lld, %lld, %lld)",
                   (long long)a->batch, (long long)a->heads, (long long)a->total_tokens);
  if (a->heads > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "heads (%lld) exceeds 2^31 - 1",
                   (long long)a->heads);
  /* Byte size of one tensor: total * heads * head_dim * 2 must fit. */
  int64_t row_bytes = a->heads * p->head_dim * p->elem_bytes;
  if (a->total_tokens > 0 && a->total_tokens > INT64_MAX / row_bytes)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "tensors of %lld tokens x %lld heads x %d overflow a 64-bit byte count",
                   (long long)a->total_tokens, (long long)a->heads, p->head_dim);
  if (a->total_tokens > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "total_tokens (%lld) exceeds 2^31 - 1, the most int32 offsets can reach",
                   (long long)a->total_tokens);
  ag_status st;
  if (a->host_offsets &&
      (st = check_host_offsets(a->host_offsets, a->batch, a->total_tokens, err)))
    return st;
  if (a->batch == 0 || a->total_tokens == 0) return AG_OK; /* nothing to compute */
  if (a->batch > INT64_MAX - 1)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "batch is too large");
  if ((st = check_tensor(a->q, "q", err)) || (st = check_tensor(a->k, "k", err)) ||
      (st = check_tensor(a->v, "v", err)) || (st = check_tensor(a->o, "o", err)))
    return st;
  if (!a->offsets) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "offsets is a null pointer");
  if ((uintptr_t)a->offsets % 4)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "offsets (%p) is not 4-byte aligned",
                   (const void *)a->offsets);
  int64_t groups = (a->heads + p->heads_per_tile - 1) / p->heads_per_tile;
  int64_t items = block_items(a->batch, a->total_tokens, p->block_size, groups);
  if (items < 0) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "work count overflows");

  ag_context *ctx = kernel->ctx;
  const ag_driver *drv = ctx->drv;
  /* Persistent: as many CTAs as fit at once. Otherwise one CTA per
   * items_per_cta tiles, so the hardware balances CTAs across SMs; past the
   * grid limit, CTAs take proportionally more. */
  int64_t grid = (int64_t)ctx->sm_count * kernel->ctas_per_sm;
  if (p->items_per_cta > 0) /* rounded up without forming items + items_per_cta - 1 */
    grid = items / p->items_per_cta + (items % p->items_per_cta != 0);
  if (grid > INT32_MAX) grid = INT32_MAX;
  if (grid > items) grid = items;

  CUdeviceptr q = (CUdeviceptr)(uintptr_t)a->q, k = (CUdeviceptr)(uintptr_t)a->k,
              v = (CUdeviceptr)(uintptr_t)a->v, o = (CUdeviceptr)(uintptr_t)a->o,
              off = (CUdeviceptr)(uintptr_t)a->offsets;
  long long batch = a->batch, total = a->total_tokens, nitems = items;
  int heads = (int)a->heads;
  void *params[] = {&q, &k, &v, &o, &off, &batch, &heads, &total, &nitems};

  if ((st = ag_cuda_check(err, drv->cuCtxPushCurrent(ctx->cu), "cuCtxPushCurrent"))) return st;
  st = ag_cuda_check(err,
                     drv->cuLaunchKernel(kernel->fn, (unsigned)grid, 1, 1, (unsigned)p->threads,
                                         1, 1, (unsigned)p->smem_bytes, (CUstream)stream, params,
                                         NULL),
                     "cuLaunchKernel");
  CUcontext popped;
  drv->cuCtxPopCurrent(&popped);
  return st;
}
