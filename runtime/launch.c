// SPDX-License-Identifier: BSD-3-Clause
/* launch.c: argument checks and launches for the generated kernels. Every
 * check runs on the host before the launch and costs no synchronization. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "runtime.h"

/* Whether descriptor d is launched by this run of `pass`: its pass, and
 * its variant when it is one of several alternatives (ag_plan_variant). */
static bool launched(const ag_plan_kernel *d, unsigned pass, const ag_launch *a) {
  return d->pass == pass && (!d->variant || d->variant == a->variant);
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
    if (!launched(d, pass, a)) continue;
    st = d->walk.kind == AG_WALK_BLOCK
             ? ag_walk_block_grid(&d->walk, a, ctx->sm_count, kernel->ctas_per_sm[i], grids[i],
                                  &items[i], err)
             : ag_walk_jagged_grid(&d->walk, a, ctx->sm_count, kernel->ctas_per_sm[i],
                                   grids[i], &items[i], err);
  }
  if (st != AG_OK) return st;
  const ag_driver *drv = ctx->drv;
  /* The context is the device's primary one, which torch's runtime calls
   * make current too: pushed (and popped) only when another is current,
   * two driver calls fewer on the common path. */
  CUcontext current = NULL;
  const bool push = drv->cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != ctx->cu;
  if (push && (st = ag_cuda_check(err, drv->cuCtxPushCurrent(ctx->cu), "cuCtxPushCurrent")))
    return st;
  /* The tensor maps of the TMA roles: encoded on first use, once a pass
   * (the kernels of a set share their parameters). */
  CUtensorMap maps[4]; /* by role, from AG_PARAM_TMAP_Q; boxes of map_rows rows */
  int map_rows[4] = {0, 0, 0, 0}, map_l2[4] = {0, 0, 0, 0};
  for (int i = 0; i < plan->nkernels && st == AG_OK; i++) {
    const ag_plan_kernel *d = &plan->kernels[i];
    if (!launched(d, pass, a) || !grids[i][0] || !grids[i][1]) continue;
    CUdeviceptr ptrs[AG_PLAN_MAX_PARAMS];
    long long wide[AG_PLAN_MAX_PARAMS];
    int narrow[AG_PLAN_MAX_PARAMS];
    void *params[AG_PLAN_MAX_PARAMS];
    for (int p = 0; p < d->nparams && st == AG_OK; p++) {
      const ag_param r = d->params[p];
      switch (r) {
        case AG_PARAM_TMAP_Q:
        case AG_PARAM_TMAP_DOUT:
        case AG_PARAM_TMAP_K:
        case AG_PARAM_TMAP_V: {
          static const ag_param of[4] = {AG_PARAM_Q, AG_PARAM_DOUT, AG_PARAM_K, AG_PARAM_V};
          const int m = (int)(r - AG_PARAM_TMAP_Q);
          const bool keys = m >= 2; /* k, v: total_k rows of kv_heads heads */
          /* encoded again where a kernel wants other boxes (its expect_tx
           * counts its own box's bytes) */
          if (map_rows[m] != d->tma_rows || map_l2[m] != d->tma_l2_bytes)
            st = ag_tma_rows_map(drv, &maps[m], a->ptr[of[m]], keys ? a->total_k : a->total_q,
                                 keys ? a->kv_heads : a->heads, plan->head_dim, d->tma_rows,
                                 d->tma_l2_bytes, err);
          map_rows[m] = st == AG_OK ? d->tma_rows : 0;
          map_l2[m] = d->tma_l2_bytes;
          params[p] = &maps[m];
          break;
        }
        case AG_PARAM_BATCH: wide[p] = a->batch; params[p] = &wide[p]; break;
        case AG_PARAM_TOTAL_Q: wide[p] = a->total_q; params[p] = &wide[p]; break;
        case AG_PARAM_TOTAL_K: wide[p] = a->total_k; params[p] = &wide[p]; break;
        case AG_PARAM_ITEMS: wide[p] = items[i]; params[p] = &wide[p]; break;
        case AG_PARAM_STRIDE_Q:
        case AG_PARAM_STRIDE_K:
        case AG_PARAM_STRIDE_V:
        case AG_PARAM_STRIDE_O:
        case AG_PARAM_STRIDE_DOUT:
        case AG_PARAM_STRIDE_DQ:
        case AG_PARAM_STRIDE_DK:
        case AG_PARAM_STRIDE_DV:
          narrow[p] = (int)a->stride[r - AG_PARAM_STRIDE_Q];
          params[p] = &narrow[p];
          break;
        case AG_PARAM_HEADS: narrow[p] = (int)a->heads; params[p] = &narrow[p]; break;
        case AG_PARAM_KV_HEADS: narrow[p] = (int)a->kv_heads; params[p] = &narrow[p]; break;
        default:
          ptrs[p] = (CUdeviceptr)(uintptr_t)a->ptr[r];
          params[p] = &ptrs[p];
      }
    }
    if (st != AG_OK) break;
    st = ag_cuda_check(err,
                       drv->cuLaunchKernel(kernel->fn[i], grids[i][0], grids[i][1], grids[i][2],
                                           (unsigned)d->threads, 1, 1, (unsigned)d->smem_bytes,
                                           (CUstream)stream, params, NULL),
                       "cuLaunchKernel");
  }
  CUcontext popped;
  if (push) drv->cuCtxPopCurrent(&popped);
  return st;
}

/* ---- the block-diagonal pattern ------------------------------------------ */

/* What a block-diagonal launch is made of, forward or backward: the
 * tensors to check (inputs, then outputs) by role with their row strides
 * (0: packed), the rotary table and offsets, and the sizes (kv_heads 0:
 * heads). */
typedef struct block_launch {
  unsigned pass;
  int ntensors;
  const ag_param *roles;
  const char *const *names;
  const void *const *tensors;
  const int64_t *strides;
  const void *table;
  const int32_t *offsets, *host_offsets;
  int64_t batch, heads, total, kv_heads;
} block_launch;

/* A tensor's row stride: 0 (packed), or a multiple of 8 elements (16
 * bytes, so every row stays aligned) of at least a row's heads and below
 * 2^31 (the kernels take it as an int; with total_tokens below 2^31 the
 * last row's end then fits a 64-bit byte count); other than packed only
 * where the kernel takes strides. */
static ag_status check_row_stride(const ag_kernel *kernel, const char *name, int64_t stride,
                                  const char *heads, int64_t packed, ag_error *err) {
  if (stride == 0 || stride == packed) return AG_OK;
  if (stride < packed || stride % 8 || stride > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "%s_stride (%lld) must be 0 (packed) or a multiple of 8 elements from "
                   "%s * head_dim (%lld) to 2^31 - 1",
                   name, (long long)stride, heads, (long long)packed);
  if (!kernel->plan.row_strides)
    return ag_fail(err, AG_ERR_UNSUPPORTED,
                   "%s_stride %lld: kernel '%s' takes packed tensors only (rows %s * head_dim "
                   "= %lld elements apart); its spec does not say row_strides: true",
                   name, (long long)stride, kernel->spec.name, heads, (long long)packed);
  return AG_OK;
}

/* Every check, in order, then the launch; an empty batch or sequence set
 * returns AG_OK before any tensor is looked at. */
static ag_status launch_block(ag_kernel *kernel, const block_launch *l,
                              struct CUstream_st *stream, ag_error *err) {
  const ag_spec *s = &kernel->spec;
  const ag_plan *p = &kernel->plan;
  const bool fwd = l->pass == AG_PASS_FORWARD;
  if (s->pattern != AG_PATTERN_BLOCK_DIAGONAL || !(s->passes & l->pass) ||
      !ag_plan_kernel_for(p, l->pass))
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel '%s' is not a block-diagonal %s kernel",
                   s->name, fwd ? "forward" : "backward");
  if (l->batch < 0 || l->heads < 1 || l->total < 0)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "need batch >= 0, heads >= 1, total_tokens >= 0 (got %lld, %lld, %lld)",
                   (long long)l->batch, (long long)l->heads, (long long)l->total);
  if (l->heads > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "heads (%lld) exceeds 2^31 - 1",
                   (long long)l->heads);
  /* Grouped-query heads: k and v (not dk, dv: per query head) have kv_heads. */
  const int64_t kv_heads = l->kv_heads ? l->kv_heads : l->heads;
  if (kv_heads < 1 || kv_heads > l->heads || l->heads % kv_heads)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "kv_heads (%lld) must be 0 (heads) or divide heads (%lld)",
                   (long long)l->kv_heads, (long long)l->heads);
  if (kv_heads != l->heads && !p->row_strides)
    return ag_fail(err, AG_ERR_UNSUPPORTED,
                   "kv_heads %lld: kernel '%s' takes as many key heads as query heads (%lld); "
                   "its spec does not say row_strides: true",
                   (long long)kv_heads, s->name, (long long)l->heads);
  /* Byte size of one tensor: total * heads * head_dim * 2 must fit. */
  int64_t row_bytes = l->heads * p->head_dim * p->elem_bytes;
  if (l->total > 0 && l->total > INT64_MAX / row_bytes)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "tensors of %lld tokens x %lld heads x %d overflow a 64-bit byte count",
                   (long long)l->total, (long long)l->heads, p->head_dim);
  if (l->total > INT32_MAX)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "total_tokens (%lld) exceeds 2^31 - 1, the most int32 offsets can reach",
                   (long long)l->total);
  ag_status st;
  if ((st = ag_check_host_offsets("host_offsets", "total_tokens", l->host_offsets, l->batch,
                                   l->total, err)))
    return st;
  if (l->batch == 0 || l->total == 0) return AG_OK; /* nothing to compute */
  if (l->batch > INT64_MAX - 1)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "batch is too large");
  ag_launch a = {.batch = l->batch, .heads = l->heads, .kv_heads = kv_heads, .total_q = l->total};
  for (int i = 0; i < l->ntensors; i++) {
    if ((st = ag_check_pointer(l->tensors[i], l->names[i], 16, err))) return st;
    a.ptr[l->roles[i]] = l->tensors[i];
    const bool keys = l->roles[i] == AG_PARAM_K || l->roles[i] == AG_PARAM_V;
    const int64_t packed = (keys ? kv_heads : l->heads) * p->head_dim;
    if (p->row_strides && packed > INT32_MAX) /* the kernels take strides as int */
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                     "%s's rows (%lld elements) exceed 2^31 - 1, the most a row stride holds",
                     l->names[i], (long long)packed);
    if ((st = check_row_stride(kernel, l->names[i], l->strides[i], keys ? "kv_heads" : "heads",
                               packed, err)))
      return st;
    a.stride[l->roles[i]] = l->strides[i] ? l->strides[i] : packed;
  }
  if (p->takes_table && !l->table)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "rotary_table is a null pointer; kernel '%s' takes its rotary positions from "
                   "a table ([total_tokens, head_dim]: sin, then cos)",
                   s->name);
  if (p->takes_table && (st = ag_check_pointer(l->table, "rotary_table", 16, err))) return st;
  if ((st = ag_check_pointer(l->offsets, "offsets", 4, err))) return st;
  a.ptr[AG_PARAM_ROTARY_TABLE] = l->table;
  a.ptr[AG_PARAM_OFFSETS_Q] = l->offsets;
  return ag_launch_pass(kernel, l->pass, &a, stream, err);
}

ag_status ag_block_forward(ag_kernel *kernel, const ag_block_fwd_args *a,
                           struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  static const ag_param roles[] = {AG_PARAM_Q, AG_PARAM_K, AG_PARAM_V, AG_PARAM_O};
  static const char *const names[] = {"q", "k", "v", "o"};
  const void *tensors[] = {a->q, a->k, a->v, a->o};
  const int64_t strides[] = {a->q_stride, a->k_stride, a->v_stride, a->o_stride};
  const block_launch l = {AG_PASS_FORWARD, 4,         roles,        names,   tensors,
                          strides,         a->rotary_table, a->offsets, a->host_offsets,
                          a->batch,        a->heads,        a->total_tokens, a->kv_heads};
  return launch_block(kernel, &l, stream, err);
}

ag_status ag_block_backward(ag_kernel *kernel, const ag_block_bwd_args *a,
                            struct CUstream_st *stream, ag_error *err) {
  if (!kernel || !a) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel or args is NULL");
  static const ag_param roles[] = {AG_PARAM_Q,  AG_PARAM_K,  AG_PARAM_V, AG_PARAM_DOUT,
                                   AG_PARAM_DQ, AG_PARAM_DK, AG_PARAM_DV};
  static const char *const names[] = {"q", "k", "v", "dout", "dq", "dk", "dv"};
  const void *tensors[] = {a->q, a->k, a->v, a->dout, a->dq, a->dk, a->dv};
  const int64_t strides[] = {a->q_stride,  a->k_stride,  a->v_stride, a->dout_stride,
                             a->dq_stride, a->dk_stride, a->dv_stride};
  const block_launch l = {AG_PASS_BACKWARD, 7,         roles,        names,   tensors,
                          strides,          a->rotary_table, a->offsets, a->host_offsets,
                          a->batch,         a->heads,        a->total_tokens, a->kv_heads};
  return launch_block(kernel, &l, stream, err);
}
