/* launch.c: argument checks and launches for the generated kernels. Every
 * check runs on the host before the launch and costs no synchronization. */
#include <stdint.h>
#include <string.h>

#include "runtime.h"

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

/* The generic launcher: every kernel of a pass, parameters packed in its
 * descriptor's order, grid from its walk's host half. */
ag_status ag_launch_pass(ag_kernel *kernel, unsigned pass, const ag_launch *a,
                         struct CUstream_st *stream, ag_error *err) {
  ag_context *ctx = kernel->ctx;
  const ag_plan *plan = &kernel->plan;
  /* Every grid first: a work count that overflows is refused before
   * anything is launched. */
  unsigned grids[AG_PLAN_MAX_KERNELS][3];
  int64_t items[AG_PLAN_MAX_KERNELS];
  ag_status st = AG_OK;
  for (int i = 0; i < plan->nkernels && st == AG_OK; i++) {
    const ag_plan_kernel *d = &plan->kernels[i];
    if (d->pass != pass) continue;
    st = d->walk.kind == AG_WALK_BLOCK
             ? ag_walk_block_grid(&d->walk, a, ctx->sm_count, kernel->ctas_per_sm[i], grids[i],
                                  &items[i], err)
             : ag_walk_jagged_grid(&d->walk, a, grids[i], &items[i], err);
  }
  if (st != AG_OK) return st;
  const ag_driver *drv = ctx->drv;
  if ((st = ag_cuda_check(err, drv->cuCtxPushCurrent(ctx->cu), "cuCtxPushCurrent"))) return st;
  for (int i = 0; i < plan->nkernels && st == AG_OK; i++) {
    const ag_plan_kernel *d = &plan->kernels[i];
    if (d->pass != pass || !grids[i][0] || !grids[i][1]) continue;
    CUdeviceptr ptrs[AG_PLAN_MAX_PARAMS];
    long long wide[AG_PLAN_MAX_PARAMS];
    int narrow[AG_PLAN_MAX_PARAMS];
    void *params[AG_PLAN_MAX_PARAMS];
    for (int p = 0; p < d->nparams; p++) {
      const ag_param r = d->params[p];
      switch (r) {
        case AG_PARAM_BATCH: wide[p] = a->batch; params[p] = &wide[p]; break;
        case AG_PARAM_TOTAL_Q: wide[p] = a->total_q; params[p] = &wide[p]; break;
        case AG_PARAM_TOTAL_K: wide[p] = a->total_k; params[p] = &wide[p]; break;
        case AG_PARAM_ITEMS: wide[p] = items[i]; params[p] = &wide[p]; break;
        case AG_PARAM_HEADS: narrow[p] = (int)a->heads; params[p] = &narrow[p]; break;
        case AG_PARAM_KV_HEADS: narrow[p] = (int)a->kv_heads; params[p] = &narrow[p]; break;
        default:
          ptrs[p] = (CUdeviceptr)(uintptr_t)a->ptr[r];
          params[p] = &ptrs[p];
      }
    }
    st = ag_cuda_check(err,
                       drv->cuLaunchKernel(kernel->fn[i], grids[i][0], grids[i][1], grids[i][2],
                                           (unsigned)d->threads, 1, 1, (unsigned)d->smem_bytes,
                                           (CUstream)stream, params, NULL),
                       "cuLaunchKernel");
  }
  CUcontext popped;
  drv->cuCtxPopCurrent(&popped);
  return st;
}

/* ---- the block-diagonal pattern ------------------------------------------ */

/* What a block-diagonal launch is made of, forward or backward: the
 * tensors to check (inputs, then outputs), the rotary table when the
 * kernel takes one, and the sizes. */
typedef struct block_launch {
  ag_param roles[7];
  const char *names[7];
  int ntensors;
  const char *kernel_name; /* the spec's name, for messages */
  bool takes_table;        /* rotary positions from a table */
  const int32_t *host_offsets;
  int head_dim, elem_bytes; /* from the plan */
  unsigned pass;
} block_launch;

/* Every check, in order, then the launch; an empty batch or sequence set
 * returns AG_OK before any tensor is looked at. */
static ag_status launch_block(ag_kernel *kernel, const block_launch *l, const ag_launch *a,
                              struct CUstream_st *stream, ag_error *err) {
  if (a->batch < 0 || a->heads < 1 || a->total_q < 0)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "need batch >= 0, heads >= 1, total_tokens >= 0 (got %lld, %lld, %lld)",
                   (long long)a->batch, (long long)a->heads, (long long)a->total_q);
  if (a->heads > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "heads (%lld) exceeds 2^31 - 1",
                   (long long)a->heads);
  /* Byte size of one tensor: total * heads * head_dim * 2 must fit. */
  int64_t row_bytes = a->heads * l->head_dim * l->elem_bytes;
  if (a->total_q > 0 && a->total_q > INT64_MAX / row_bytes)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "tensors of %lld tokens x %lld heads x %d overflow a 64-bit byte count",
                   (long long)a->total_q, (long long)a->heads, l->head_dim);
  if (a->total_q > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "total_tokens (%lld) exceeds 2^31 - 1, the most int32 offsets can reach",
                   (long long)a->total_q);
  ag_status st;
  if (l->host_offsets && (st = check_host_offsets(l->host_offsets, a->batch, a->total_q, err)))
    return st;
  if (a->batch == 0 || a->total_q == 0) return AG_OK; /* nothing to compute */
  if (a->batch > INT64_MAX - 1)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "batch is too large");
  for (int i = 0; i < l->ntensors; i++)
    if ((st = check_tensor(a->ptr[l->roles[i]], l->names[i], err))) return st;
  const void *table = a->ptr[AG_PARAM_ROTARY_TABLE];
  if (l->takes_table && !table)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "rotary_table is a null pointer; kernel '%s' takes its rotary positions from "
                   "a table ([total_tokens, head_dim]: sin, then cos)",
                   l->kernel_name);
  if (l->takes_table && (st = check_tensor(table, "rotary_table", err))) return st;
  const void *off = a->ptr[AG_PARAM_OFFSETS_Q];
  if (!off) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "offsets is a null pointer");
  if ((uintptr_t)off % 4)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "offsets (%p) is not 4-byte aligned", off);
  return ag_launch_pass(kernel, l->pass, a, stream, err);
}

ag_status ag_block_forward(ag_kernel *kernel, const ag_block_fwd_args *a,
                           struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  const ag_spec *s = &kernel->spec;
  const ag_plan *p = &kernel->plan;
  if (s->pattern != AG_PATTERN_BLOCK_DIAGONAL || !(s->passes & AG_PASS_FORWARD) ||
      !ag_plan_kernel_for(p, AG_PASS_FORWARD))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "kernel '%s' is not a block-diagonal forward kernel", s->name);
  const block_launch l = {.roles = {AG_PARAM_Q, AG_PARAM_K, AG_PARAM_V, AG_PARAM_O},
                          .names = {"q", "k", "v", "o"},
                          .ntensors = 4,
                          .kernel_name = s->name,
                          .takes_table = p->takes_table,
                          .host_offsets = a->host_offsets,
                          .head_dim = p->head_dim,
                          .elem_bytes = p->elem_bytes,
                          .pass = AG_PASS_FORWARD};
  ag_launch la = {.batch = a->batch, .heads = a->heads, .total_q = a->total_tokens};
  la.ptr[AG_PARAM_Q] = a->q;
  la.ptr[AG_PARAM_K] = a->k;
  la.ptr[AG_PARAM_V] = a->v;
  la.ptr[AG_PARAM_O] = a->o;
  la.ptr[AG_PARAM_ROTARY_TABLE] = a->rotary_table;
  la.ptr[AG_PARAM_OFFSETS_Q] = a->offsets;
  return launch_block(kernel, &l, &la, stream, err);
}

ag_status ag_block_backward(ag_kernel *kernel, const ag_block_bwd_args *a,
                            struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  const ag_spec *s = &kernel->spec;
  const ag_plan *p = &kernel->plan;
  if (s->pattern != AG_PATTERN_BLOCK_DIAGONAL || !(s->passes & AG_PASS_BACKWARD) ||
      !ag_plan_kernel_for(p, AG_PASS_BACKWARD))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "kernel '%s' is not a block-diagonal backward kernel", s->name);
  const block_launch l = {.roles = {AG_PARAM_Q, AG_PARAM_K, AG_PARAM_V, AG_PARAM_DOUT, AG_PARAM_DQ,
                                    AG_PARAM_DK, AG_PARAM_DV},
                          .names = {"q", "k", "v", "dout", "dq", "dk", "dv"},
                          .ntensors = 7,
                          .kernel_name = s->name,
                          .takes_table = p->takes_table,
                          .host_offsets = a->host_offsets,
                          .head_dim = p->head_dim,
                          .elem_bytes = p->elem_bytes,
                          .pass = AG_PASS_BACKWARD};
  ag_launch la = {.batch = a->batch, .heads = a->heads, .total_q = a->total_tokens};
  la.ptr[AG_PARAM_Q] = a->q;
  la.ptr[AG_PARAM_K] = a->k;
  la.ptr[AG_PARAM_V] = a->v;
  la.ptr[AG_PARAM_DOUT] = a->dout;
  la.ptr[AG_PARAM_DQ] = a->dq;
  la.ptr[AG_PARAM_DK] = a->dk;
  la.ptr[AG_PARAM_DV] = a->dv;
  la.ptr[AG_PARAM_ROTARY_TABLE] = a->rotary_table;
  la.ptr[AG_PARAM_OFFSETS_Q] = a->offsets;
  return launch_block(kernel, &l, &la, stream, err);
}
