/* selfcheck.c: random inputs, NaN-poisoned outputs, the float64 reference on
 * a sample of sequences, and CUDA-event timing; see selfcheck.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference.h"
#include "selfcheck.h"

enum { CHUNK_ELEMS = 1 << 24 }; /* host staging: 32 MiB of 16-bit values */

/* Element e of tensor `which` (0 q, 1 k, 2 v) as a value in [-2, 2): a
 * counter-based hash, so any element can be regenerated on demand. */
static float input_value(uint64_t seed, int which, uint64_t e) {
  uint64_t x = seed ^ ((uint64_t)(which + 1) * 0x9e3779b97f4a7c15ull) ^ (e * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (float)((double)(x >> 11) * (4.0 / 9007199254740992.0) - 2.0);
}

static uint16_t nan_bits(ag_dtype d) { return d == AG_DTYPE_FP16 ? 0x7e00u : 0x7fc0u; }

typedef struct buffers {
  CUdeviceptr t[4]; /* q, k, v, o */
  CUdeviceptr offsets;
} buffers;

static void free_buffers(const ag_driver *drv, buffers *b) {
  for (int i = 0; i < 4; i++)
    if (b->t[i]) drv->cuMemFree(b->t[i]);
  if (b->offsets) drv->cuMemFree(b->offsets);
  memset(b, 0, sizeof *b);
}

static ag_status fill_inputs(const ag_driver *drv, const buffers *b, ag_dtype dtype,
                             uint64_t seed, uint64_t elems, uint16_t *stage, ag_error *err) {
  for (int which = 0; which < 3; which++)
    for (uint64_t at = 0; at < elems; at += CHUNK_ELEMS) {
      uint64_t n = elems - at < CHUNK_ELEMS ? elems - at : CHUNK_ELEMS;
      for (uint64_t i = 0; i < n; i++)
        stage[i] = ag_float_to_half(dtype, input_value(seed, which, at + i));
      ag_status st = ag_cuda_check(err, drv->cuMemcpyHtoD(b->t[which] + at * 2, stage, n * 2),
                                   "cuMemcpyHtoD");
      if (st) return st;
    }
  return AG_OK;
}

/* Count poison left inside O and writes into the guard rows after it. */
static ag_status scan_output(const ag_driver *drv, const buffers *b, ag_dtype dtype,
                             uint64_t elems, uint64_t guard, uint16_t *stage,
                             ag_check_result *out, ag_error *err) {
  const uint16_t nan = nan_bits(dtype);
  for (uint64_t at = 0; at < elems + guard; at += CHUNK_ELEMS) {
    uint64_t n = elems + guard - at < CHUNK_ELEMS ? elems + guard - at : CHUNK_ELEMS;
    ag_status st = ag_cuda_check(err, drv->cuMemcpyDtoH(stage, b->t[3] + at * 2, n * 2),
                                 "cuMemcpyDtoH");
    if (st) return st;
    for (uint64_t i = 0; i < n; i++) {
      bool poison = stage[i] == nan;
      if (at + i < elems) out->unwritten += poison;
      else out->guard_clobbered += !poison;
    }
  }
  return AG_OK;
}

/* Compare sampled sequences with the float64 reference. */
static ag_status compare(const ag_driver *drv, const buffers *b, const ag_kernel *kern,
                         const int32_t *offsets, int64_t batch, int64_t heads, uint64_t seed,
                         int64_t budget, ag_check_result *out, ag_error *err) {
  const ag_spec *s = &kern->spec;
  const int dim = s->head_dim, bs = s->block_size;
  int64_t total_macs = 0;
  for (int64_t i = 0; i < batch; i++) {
    int64_t len = offsets[i + 1] - offsets[i];
    total_macs += len * (int64_t)bs * dim * 2 * heads;
  }
  int64_t stride = total_macs > budget ? (total_macs + budget - 1) / budget : 1;
  double num = 0, den = 0;
  ag_status st = AG_OK;
  for (int64_t i = 0; i < batch && st == AG_OK; i += stride) {
    int64_t len = offsets[i + 1] - offsets[i];
    if (len == 0) continue;
    size_t n = (size_t)(len * heads * dim);
    uint16_t *in = malloc(n * 2 * 4);
    double *ref = malloc(n * sizeof(double));
    if (!in || !ref) {
      free(in);
      free(ref);
      return ag_fail(err, AG_ERR_NOMEM, "out of memory for the reference");
    }
    uint64_t e0 = (uint64_t)offsets[i] * heads * dim;
    for (int which = 0; which < 3; which++)
      for (size_t e = 0; e < n; e++)
        in[which * n + e] = ag_float_to_half(s->dtype, input_value(seed, which, e0 + e));
    uint16_t *got = in + 3 * n;
    st = ag_cuda_check(err, drv->cuMemcpyDtoH(got, b->t[3] + e0 * 2, n * 2), "cuMemcpyDtoH");
    if (st == AG_OK) {
      int32_t local[2] = {0, (int32_t)len};
      ag_ref_block_forward(s->dtype, bs, s->causal, ag_spec_scale(s), in, in + n, in + 2 * n,
                           local, 1, heads, dim, ref);
      for (size_t e = 0; e < n; e++) {
        double g = ag_half_to_float(s->dtype, got[e]);
        num += isnan(g) ? INFINITY : (g - ref[e]) * (g - ref[e]);
        den += ref[e] * ref[e];
      }
      out->sampled_seqs++;
    }
    free(in);
    free(ref);
  }
  out->rel_error = den > 0 ? sqrt(num / den) : sqrt(num);
  return st;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static ag_status time_kernel(const ag_driver *drv, ag_kernel *kern, const ag_block_fwd_args *args,
                             const ag_check_options *opt, ag_check_result *out, ag_error *err) {
  CUevent ev[2] = {0, 0};
  float *ms = calloc((size_t)opt->time_iters, sizeof *ms);
  ag_status st = ms ? AG_OK : ag_fail(err, AG_ERR_NOMEM, "out of memory");
  for (int i = 0; i < 2 && st == AG_OK; i++)
    st = ag_cuda_check(err, drv->cuEventCreate(&ev[i], CU_EVENT_DEFAULT), "cuEventCreate");
  for (int i = 0; i < opt->warmup_iters && st == AG_OK; i++)
    st = ag_block_forward(kern, args, NULL, err);
  for (int i = 0; i < opt->time_iters && st == AG_OK; i++) {
    drv->cuEventRecord(ev[0], NULL);
    st = ag_block_forward(kern, args, NULL, err);
    drv->cuEventRecord(ev[1], NULL);
    if (st == AG_OK) st = ag_cuda_check(err, drv->cuEventSynchronize(ev[1]), "kernel (timed)");
    if (st == AG_OK)
      st = ag_cuda_check(err, drv->cuEventElapsedTime(&ms[i], ev[0], ev[1]), "cuEventElapsedTime");
  }
  if (st == AG_OK) {
    qsort(ms, (size_t)opt->time_iters, sizeof *ms, cmp_float);
    out->median_ms = ms[opt->time_iters / 2];
  }
  for (int i = 0; i < 2; i++)
    if (ev[i]) drv->cuEventDestroy(ev[i]);
  free(ms);
  return st;
}

ag_status ag_selfcheck_block_forward(ag_kernel *kern, const int32_t *lengths, int64_t batch,
                                     int64_t heads, const ag_check_options *opt,
                                     ag_check_result *out, ag_error *err) {
  memset(out, 0, sizeof *out);
  const ag_driver *drv = kern->ctx->drv;
  const ag_spec *s = &kern->spec;
  buffers b = {0};
  uint16_t *stage = NULL;
  int32_t *offsets = malloc(sizeof(int32_t) * (size_t)(batch + 1));
  if (!offsets) return ag_fail(err, AG_ERR_NOMEM, "out of memory");
  offsets[0] = 0;
  for (int64_t i = 0; i < batch; i++) {
    if (lengths[i] < 0 || (int64_t)offsets[i] + lengths[i] > INT32_MAX) {
      free(offsets);
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "sequence lengths must be >= 0 and sum < 2^31");
    }
    offsets[i + 1] = offsets[i] + lengths[i];
    out->blocks += (lengths[i] + s->block_size - 1) / s->block_size;
  }
  const int64_t total = offsets[batch];
  const uint64_t elems = (uint64_t)total * heads * s->head_dim;
  const uint64_t guard = (uint64_t)s->block_size * heads * s->head_dim;
  out->bytes = 4.0 * (double)elems * 2;

  ag_status st = ag_cuda_check(err, drv->cuCtxPushCurrent(kern->ctx->cu), "cuCtxPushCurrent");
  if (st) {
    free(offsets);
    return st;
  }
  stage = malloc((size_t)CHUNK_ELEMS * 2);
  if (!stage) st = ag_fail(err, AG_ERR_NOMEM, "out of memory");
  for (int i = 0; i < 4 && st == AG_OK; i++)
    st = ag_cuda_check(err, drv->cuMemAlloc(&b.t[i], (elems + (i == 3 ? guard : 0)) * 2 + 16),
                       "cuMemAlloc");
  if (st == AG_OK)
    st = ag_cuda_check(err, drv->cuMemAlloc(&b.offsets, sizeof(int32_t) * (size_t)(batch + 1)),
                       "cuMemAlloc");
  if (st == AG_OK)
    st = ag_cuda_check(err, drv->cuMemcpyHtoD(b.offsets, offsets, sizeof(int32_t) * (size_t)(batch + 1)),
                       "cuMemcpyHtoD");
  if (st == AG_OK) st = fill_inputs(drv, &b, s->dtype, opt->seed, elems, stage, err);
  if (st == AG_OK)
    st = ag_cuda_check(err, drv->cuMemsetD16(b.t[3], nan_bits(s->dtype), elems + guard),
                       "cuMemsetD16");
  ag_block_fwd_args args = {(const void *)(uintptr_t)b.t[0], (const void *)(uintptr_t)b.t[1],
                            (const void *)(uintptr_t)b.t[2], (void *)(uintptr_t)b.t[3],
                            (const int32_t *)(uintptr_t)b.offsets, batch, heads, total};
  if (st == AG_OK) st = ag_block_forward(kern, &args, NULL, err);
  if (st == AG_OK) st = ag_cuda_check(err, drv->cuCtxSynchronize(), "kernel");
  if (st == AG_OK) st = scan_output(drv, &b, s->dtype, elems, guard, stage, out, err);
  if (st == AG_OK)
    st = compare(drv, &b, kern, offsets, batch, heads, opt->seed,
                 opt->max_ref_macs > 0 ? opt->max_ref_macs : 400000000, out, err);
  if (st == AG_OK && opt->time_iters > 0) st = time_kernel(drv, kern, &args, opt, out, err);
  free_buffers(drv, &b);
  free(stage);
  free(offsets);
  CUcontext popped;
  drv->cuCtxPopCurrent(&popped);
  return st;
}
