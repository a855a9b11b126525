/* launch.c: argument checks and launches for the generated kernels. Every
 * check runs on the host before the launch and costs no synchronization. */
#include <stdint.h>
#include <string.h>

#include "runtime.h"

/* Items the block-diagonal kernel walks: (batch + floor(total / block))
 * virtual blocks times head groups; see the work walk in
 * templates/block_walk.cuh. -1 when that overflows. */
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

/* What a block-diagonal launch is made of, forward or backward: the
 * tensors (inputs, then outputs, as the kernel takes them), the rotary
 * table when the kernel takes one (after the tensors), and the kernel's
 * shape from its plan. */
typedef struct block_launch {
  const void *tensors[7];
  const char *names[7];
  int ntensors;
  const char *kernel_name; /* the spec's name, for messages */
  bool takes_table;        /* rotary positions from a table */
  const void *table;       /* rotary_table of the arguments; ignored unless takes_table */
  const int32_t *offsets, *host_offsets;
  int64_t batch, heads, total;
  CUfunction fn;
  int ctas_per_sm;                                /* occupancy of fn */
  int block_size, head_dim, elem_bytes;           /* from the plan */
  int heads_per_tile, threads, smem_bytes, items_per_cta;
} block_launch;

/* Whether the kernel takes a rotary table parameter; other kernels ignore
 * the arguments' rotary_table, NULL or not. */
static bool takes_table(const ag_spec *s) {
  return s->rotary.layout != AG_ROTARY_NONE && s->rotary.positions == AG_POSITIONS_TABLE;
}

/* Every check, in order, then the launch; an empty batch or sequence set
 * returns AG_OK before any tensor is looked at. */
static ag_status launch_block(ag_kernel *kernel, const block_launch *l,
                              struct CUstream_st *stream, ag_error *err) {
  if (l->batch < 0 || l->heads < 1 || l->total < 0)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "need batch >= 0, heads >= 1, total_tokens >= 0 (got %lld, %lld, %lld)",
                   (long long)l->batch, (long long)l->heads, (long long)l->total);
  if (l->heads > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "heads (%lld) exceeds 2^31 - 1",
                   (long long)l->heads);
  /* Byte size of one tensor: total * heads * head_dim * 2 must fit. */
  int64_t row_bytes = l->heads * l->head_dim * l->elem_bytes;
  if (l->total > 0 && l->total > INT64_MAX / row_bytes)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "tensors of %lld tokens x %lld heads x %d overflow a 64-bit byte count",
                   (long long)l->total, (long long)l->heads, l->head_dim);
  if (l->total > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "total_tokens (%lld) exceeds 2^31 - 1, the most int32 offsets can reach",
                   (long long)l->total);
  ag_status st;
  if (l->host_offsets && (st = check_host_offsets(l->host_offsets, l->batch, l->total, err)))
    return st;
  if (l->batch == 0 || l->total == 0) return AG_OK; /* nothing to compute */
  if (l->batch > INT64_MAX - 1)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "batch is too large");
  for (int i = 0; i < l->ntensors; i++)
    if ((st = check_tensor(l->tensors[i], l->names[i], err))) return st;
  if (l->takes_table && !l->table)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "rotary_table is a null pointer; kernel '%s' takes its rotary positions from "
                   "a table ([total_tokens, head_dim]: sin, then cos)",
                   l->kernel_name);
  if (l->takes_table && (st = check_tensor(l->table, "rotary_table", err))) return st;
  if (!l->offsets) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "offsets is a null pointer");
  if ((uintptr_t)l->offsets % 4)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "offsets (%p) is not 4-byte aligned",
                   (const void *)l->offsets);
  int64_t groups = (l->heads + l->heads_per_tile - 1) / l->heads_per_tile;
  int64_t items = block_items(l->batch, l->total, l->block_size, groups);
  if (items < 0) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "work count overflows");

  ag_context *ctx = kernel->ctx;
  const ag_driver *drv = ctx->drv;
  /* Persistent: as many CTAs as fit at once. Otherwise one CTA per
   * items_per_cta tiles, so the hardware balances CTAs across SMs; past the
   * grid limit, CTAs take proportionally more. */
  int64_t grid = (int64_t)ctx->sm_count * l->ctas_per_sm;
  if (l->items_per_cta > 0) /* rounded up without forming items + items_per_cta - 1 */
    grid = items / l->items_per_cta + (items % l->items_per_cta != 0);
  if (grid > INT32_MAX) grid = INT32_MAX;
  if (grid > items) grid = items;

  /* Parameters: the tensors, the rotary table when taken, offsets, batch,
   * heads, total_tokens, items. */
  CUdeviceptr ptrs[7], table = (CUdeviceptr)(uintptr_t)l->table,
                       off = (CUdeviceptr)(uintptr_t)l->offsets;
  long long batch = l->batch, total = l->total, nitems = items;
  int heads = (int)l->heads;
  void *params[7 + 6];
  int n = 0;
  for (int i = 0; i < l->ntensors; i++) {
    ptrs[i] = (CUdeviceptr)(uintptr_t)l->tensors[i];
    params[n++] = &ptrs[i];
  }
  if (l->takes_table) params[n++] = &table;
  params[n++] = &off;
  params[n++] = &batch;
  params[n++] = &heads;
  params[n++] = &total;
  params[n++] = &nitems;

  if ((st = ag_cuda_check(err, drv->cuCtxPushCurrent(ctx->cu), "cuCtxPushCurrent"))) return st;
  st = ag_cuda_check(err,
                     drv->cuLaunchKernel(l->fn, (unsigned)grid, 1, 1, (unsigned)l->threads, 1, 1,
                                         (unsigned)l->smem_bytes, (CUstream)stream, params, NULL),
                     "cuLaunchKernel");
  CUcontext popped;
  drv->cuCtxPopCurrent(&popped);
  return st;
}

ag_status ag_block_forward(ag_kernel *kernel, const ag_block_fwd_args *a,
                           struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  const ag_spec *s = &kernel->spec;
  const ag_plan *p = &kernel->plan;
  if (s->pattern != AG_PATTERN_BLOCK_DIAGONAL || !(s->passes & AG_PASS_FORWARD))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "kernel '%s' is not a block-diagonal forward kernel", s->name);
  const block_launch l = {.tensors = {a->q, a->k, a->v, a->o},
                          .names = {"q", "k", "v", "o"},
                          .ntensors = 4,
                          .kernel_name = s->name,
                          .takes_table = takes_table(s),
                          .table = a->rotary_table,
                          .offsets = a->offsets,
                          .host_offsets = a->host_offsets,
                          .batch = a->batch,
                          .heads = a->heads,
                          .total = a->total_tokens,
                          .fn = kernel->fn,
                          .ctas_per_sm = kernel->ctas_per_sm,
                          .block_size = p->block_size,
                          .head_dim = p->head_dim,
                          .elem_bytes = p->elem_bytes,
                          .heads_per_tile = p->heads_per_tile,
                          .threads = p->threads,
                          .smem_bytes = p->smem_bytes,
                          .items_per_cta = p->items_per_cta};
  return launch_block(kernel, &l, stream, err);
}

ag_status ag_block_backward(ag_kernel *kernel, const ag_block_bwd_args *a,
                            struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  const ag_spec *s = &kernel->spec;
  const ag_plan *p = &kernel->plan;
  if (s->pattern != AG_PATTERN_BLOCK_DIAGONAL || !(s->passes & AG_PASS_BACKWARD) ||
      !kernel->fn_bwd)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "kernel '%s' is not a block-diagonal backward kernel", s->name);
  const block_launch l = {.tensors = {a->q, a->k, a->v, a->dout, a->dq, a->dk, a->dv},
                          .names = {"q", "k", "v", "dout", "dq", "dk", "dv"},
                          .ntensors = 7,
                          .kernel_name = s->name,
                          .takes_table = takes_table(s),
                          .table = a->rotary_table,
                          .offsets = a->offsets,
                          .host_offsets = a->host_offsets,
                          .batch = a->batch,
                          .heads = a->heads,
                          .total = a->total_tokens,
                          .fn = kernel->fn_bwd,
                          .ctas_per_sm = kernel->ctas_per_sm_bwd,
                          .block_size = p->block_size,
                          .head_dim = p->head_dim,
                          .elem_bytes = p->elem_bytes,
                          .heads_per_tile = p->bwd.heads_per_tile,
                          .threads = p->bwd.threads,
                          .smem_bytes = p->bwd.smem_bytes,
                          .items_per_cta = p->bwd.items_per_cta};
  return launch_block(kernel, &l, stream, err);
}
