// SPDX-License-Identifier: BSD-3-Clause
/* selfcheck.c: random inputs (and a rotary table of real sines and cosines
 * for kernels that take one), NaN-poisoned outputs, the float64 reference
 * on a sample of sequences, and CUDA-event timing; see selfcheck.h. Part
 * of the tools library (build/libattngen_tools.a), not of libattngen: it
 * reaches the runtime's internals (the driver table, the kernel struct), so
 * it links against the static libattngen.a. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fill.h"
#include "reference.h"
#include "runtime.h"
#include "selfcheck.h"

enum { CHUNK_ELEMS = 1 << 24 }; /* host staging: 32 MiB of 16-bit values */
enum { TABLE_STREAM = 8 };      /* ag_input_value's `which` for rotary table angles */

double ag_check_tolerance(ag_dtype dtype, bool backward) {
  if (dtype == AG_DTYPE_BF16) return backward ? 2e-2 : 1e-2;
  return backward ? 5e-3 : 2e-3;
}

static uint16_t nan_bits(ag_dtype d) { return d == AG_DTYPE_FP16 ? 0x7e00u : 0x7fc0u; }

/* ---- tensor sets ----
 * The device data of one shape, for either pass: `inputs` tensors filled
 * from (seed, element), then the outputs, each with guard rows after it,
 * and the offsets; the host keeps the offsets and a staging buffer. */
enum { MAX_TENSORS = 7 };

typedef struct tensor_set {
  ag_context *ctx;
  ag_dtype dtype;
  int head_dim;
  int inputs, tensors;          /* t[0 .. inputs) are inputs, the rest outputs */
  int64_t batch, heads, total;
  uint64_t seed, elems, guard;  /* elements per tensor, and per guard */
  float scale[MAX_TENSORS];     /* input `which` is ag_input_value(seed, which, e) * scale[which] */
  int32_t *offsets;             /* host copy */
  CUdeviceptr t[MAX_TENSORS];
  CUdeviceptr d_offsets;
  CUdeviceptr table;            /* rotary table [total, head_dim], made when a kernel needs it */
  uint16_t *stage;              /* host staging for chunked copies */
} tensor_set;

static void set_free(tensor_set *s) {
  if (s->ctx) {
    const ag_driver *drv = s->ctx->drv;
    CUcontext popped;
    bool pushed = drv->cuCtxPushCurrent(s->ctx->cu) == CUDA_SUCCESS;
    for (int i = 0; i < s->tensors; i++)
      if (s->t[i]) drv->cuMemFree(s->t[i]);
    if (s->d_offsets) drv->cuMemFree(s->d_offsets);
    if (s->table) drv->cuMemFree(s->table);
    if (pushed) drv->cuCtxPopCurrent(&popped);
  }
  free(s->offsets);
  free(s->stage);
  memset(s, 0, sizeof *s);
}

/* Input `which` of the set at element e, as the device holds it. */
static uint16_t input_at(const tensor_set *s, int which, uint64_t e) {
  return ag_float_to_half(s->dtype, ag_input_value(s->seed, which, e) * s->scale[which]);
}

/* `scales`: one factor per input (NULL: all 1). */
static ag_status set_create(tensor_set *s, ag_context *ctx, ag_dtype dtype, int head_dim,
                            int guard_rows, const int32_t *lengths, int64_t batch, int64_t heads,
                            uint64_t seed, int inputs, int tensors, const float *scales,
                            ag_error *err) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < MAX_TENSORS; i++) s->scale[i] = scales && i < inputs ? scales[i] : 1.f;
  if (batch < 0 || heads < 1)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "need batch >= 0 and heads >= 1");
  s->dtype = dtype;
  s->head_dim = head_dim;
  s->inputs = inputs;
  s->tensors = tensors;
  s->batch = batch;
  s->heads = heads;
  s->seed = seed;
  s->offsets = malloc(sizeof(int32_t) * (size_t)(batch + 1));
  s->stage = malloc((size_t)CHUNK_ELEMS * 2);
  if (!s->offsets || !s->stage) {
    set_free(s);
    return ag_fail(err, AG_ERR_NOMEM, "out of memory");
  }
  s->offsets[0] = 0;
  for (int64_t i = 0; i < batch; i++) {
    if (lengths[i] < 0 || (int64_t)s->offsets[i] + lengths[i] > INT32_MAX) {
      set_free(s);
      return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                     "sequence lengths must be >= 0 and sum to less than 2^31");
    }
    s->offsets[i + 1] = s->offsets[i] + lengths[i];
  }
  s->total = s->offsets[batch];
  s->elems = (uint64_t)s->total * (uint64_t)heads * (uint64_t)head_dim;
  s->guard = (uint64_t)guard_rows * (uint64_t)heads * (uint64_t)head_dim;

  const ag_driver *drv = ctx->drv;
  ag_status st = ag_cuda_check(err, drv->cuCtxPushCurrent(ctx->cu), "cuCtxPushCurrent");
  if (st) {
    set_free(s);
    return st;
  }
  s->ctx = ctx; /* from here on set_free releases device memory */
  /* Outputs get guard rows after them; 16 spare bytes keep even an empty
   * tensor a distinct allocation. */
  for (int i = 0; i < tensors && st == AG_OK; i++)
    st = ag_cuda_check(
        err, drv->cuMemAlloc(&s->t[i], (s->elems + (i >= inputs ? s->guard : 0)) * 2 + 16),
        "cuMemAlloc");
  size_t off_bytes = sizeof(int32_t) * (size_t)(batch + 1);
  if (st == AG_OK) st = ag_cuda_check(err, drv->cuMemAlloc(&s->d_offsets, off_bytes), "cuMemAlloc");
  if (st == AG_OK)
    st = ag_cuda_check(err, drv->cuMemcpyHtoD(s->d_offsets, s->offsets, off_bytes), "cuMemcpyHtoD");
  for (int which = 0; which < inputs && st == AG_OK; which++)
    for (uint64_t at = 0; at < s->elems && st == AG_OK; at += CHUNK_ELEMS) {
      uint64_t n = s->elems - at < CHUNK_ELEMS ? s->elems - at : CHUNK_ELEMS;
      ag_fill_inputs(s->stage, dtype, seed, which, s->scale[which], at, n);
      st = ag_cuda_check(err, drv->cuMemcpyHtoD(s->t[which] + at * 2, s->stage, n * 2),
                         "cuMemcpyHtoD");
    }
  CUcontext popped;
  drv->cuCtxPopCurrent(&popped);
  if (st) set_free(s);
  return st;
}

/* Fill every output and its guard rows with NaN. Needs the context current. */
static ag_status set_poison(tensor_set *s, ag_error *err) {
  ag_status st = AG_OK;
  for (int i = s->inputs; i < s->tensors && st == AG_OK; i++)
    st = ag_cuda_check(err, s->ctx->drv->cuMemsetD16(s->t[i], nan_bits(s->dtype), s->elems + s->guard),
                       "cuMemsetD16");
  return st;
}

/* Add the poison left inside output `i` to *unwritten and the writes into
 * its guard rows to *clobbered. Needs the context current. */
static ag_status set_scan(tensor_set *s, int i, int64_t *unwritten, int64_t *clobbered,
                          ag_error *err) {
  const uint16_t nan = nan_bits(s->dtype);
  const uint64_t all = s->elems + s->guard;
  for (uint64_t at = 0; at < all; at += CHUNK_ELEMS) {
    uint64_t n = all - at < CHUNK_ELEMS ? all - at : CHUNK_ELEMS;
    ag_status st = ag_cuda_check(
        err, s->ctx->drv->cuMemcpyDtoH(s->stage, s->t[i] + at * 2, n * 2), "cuMemcpyDtoH");
    if (st) return st;
    for (uint64_t e = 0; e < n; e++) {
      bool poison = s->stage[e] == nan;
      if (at + e < s->elems) *unwritten += poison;
      else *clobbered += !poison;
    }
  }
  return AG_OK;
}

static bool needs_table(const ag_spec *s) {
  return s->rotary.layout != AG_ROTARY_NONE && s->rotary.positions == AG_POSITIONS_TABLE;
}

/* The rotary table of the shape (ag_table_value), made on first use by a
 * kernel that takes one and kept for the set's life; *out_table gets it
 * (0 for other kernels, which ignore it). */
static ag_status set_table(tensor_set *s, const ag_kernel *k, CUdeviceptr *out_table,
                           ag_error *err) {
  *out_table = 0;
  if (!needs_table(&k->spec)) return AG_OK;
  if (!s->table) {
    const ag_driver *drv = s->ctx->drv;
    const uint64_t elems = (uint64_t)s->total * (uint64_t)s->head_dim;
    ag_status st = ag_cuda_check(err, drv->cuCtxPushCurrent(s->ctx->cu), "cuCtxPushCurrent");
    if (st) return st;
    CUdeviceptr table = 0;
    st = ag_cuda_check(err, drv->cuMemAlloc(&table, elems * 2 + 16), "cuMemAlloc");
    for (uint64_t at = 0; at < elems && st == AG_OK; at += CHUNK_ELEMS) {
      uint64_t n = elems - at < CHUNK_ELEMS ? elems - at : CHUNK_ELEMS;
      ag_fill_table(s->stage, s->dtype, s->seed, TABLE_STREAM, s->head_dim, at, n);
      st = ag_cuda_check(err, drv->cuMemcpyHtoD(table + at * 2, s->stage, n * 2), "cuMemcpyHtoD");
    }
    if (st == AG_OK) s->table = table;
    else if (table) drv->cuMemFree(table);
    CUcontext popped;
    drv->cuCtxPopCurrent(&popped);
    if (st) return st;
  }
  *out_table = s->table;
  return AG_OK;
}

/* The float64 reference's rotary embeddings for a kernel's spec; `table`
 * holds the sampled sequence's rows of the rotary table (positions from a
 * table only). */
static ag_ref_rotary ref_rotary(const ag_spec *s, const double *table) {
  ag_ref_rotary r = {s->rotary.layout, s->rotary.apply_to, s->rotary.positions,
                     s->rotary.base, s->block_size, table};
  return r;
}

/* The 16-bit inputs of one sampled sequence (`count` values) as doubles,
 * then, for a kernel that takes a rotary table, the sequence's rows of it
 * (tokens t0 .. t0 + len), into mem. */
static void reference_inputs(const tensor_set *set, const ag_spec *s, const uint16_t *in,
                             size_t count, int64_t t0, int64_t len, double *mem) {
  for (size_t e = 0; e < count; e++) mem[e] = ag_half_to_float(s->dtype, in[e]);
  mem += count; /* the table rows follow the inputs */
  if (needs_table(s))
    for (int64_t t = 0; t < len; t++)
      for (int col = 0; col < s->head_dim; col++) {
        const uint64_t token = (uint64_t)(t0 + t);
        mem[t * s->head_dim + col] = ag_half_to_float(
            s->dtype, ag_table_value(set->seed, TABLE_STREAM, s->dtype, s->head_dim, token, col));
      }
}

/* Diagonal blocks of the shape: the sum of ceil(len / block). */
static int64_t set_blocks(const tensor_set *s, int block) {
  int64_t blocks = 0;
  for (int64_t i = 0; i < s->batch; i++)
    blocks += (s->offsets[i + 1] - s->offsets[i] + block - 1) / block;
  return blocks;
}

static ag_status set_matches(const tensor_set *s, const ag_kernel *k, const char *name,
                             ag_error *err) {
  if (k->spec.dtype != s->dtype || k->spec.head_dim != s->head_dim)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT,
                   "kernel '%s' does not match the data's dtype and head_dim", name);
  return AG_OK;
}

/* ---- forward ---- */

enum { FWD_INPUTS = 3, FWD_TENSORS = 4 }; /* q, k, v; then o */

struct ag_block_data {
  tensor_set s;
  ag_block_fwd_args args;
};

void ag_block_data_destroy(ag_block_data *d) {
  if (!d) return;
  set_free(&d->s);
  free(d);
}

double ag_block_data_bytes(const ag_block_data *d) {
  return (double)FWD_TENSORS * (double)d->s.elems * 2;
}

ag_status ag_block_data_create(ag_context *ctx, ag_dtype dtype, int head_dim, int guard_rows,
                               const int32_t *lengths, int64_t batch, int64_t heads,
                               uint64_t seed, ag_block_data **out, ag_error *err) {
  *out = NULL;
  ag_block_data *d = calloc(1, sizeof *d);
  if (!d) return ag_fail(err, AG_ERR_NOMEM, "out of memory");
  ag_status st = set_create(&d->s, ctx, dtype, head_dim, guard_rows, lengths, batch, heads, seed,
                            FWD_INPUTS, FWD_TENSORS, NULL, err);
  if (st) {
    free(d);
    return st;
  }
#define PTR(i) ((void *)(uintptr_t)d->s.t[i])
  d->args = (ag_block_fwd_args){PTR(0), PTR(1), PTR(2), PTR(3),
                                (const int32_t *)(uintptr_t)d->s.d_offsets, batch, heads,
                                d->s.total, NULL, NULL, 0, 0, 0, 0, 0};
#undef PTR
  *out = d;
  return AG_OK;
}

/* Compare sampled sequences with the float64 reference. */
static ag_status compare(ag_block_data *d, const ag_kernel *kern, int64_t budget,
                         ag_check_result *out, ag_error *err) {
  const ag_driver *drv = d->s.ctx->drv;
  const ag_spec *s = &kern->spec;
  const int dim = s->head_dim, bs = s->block_size;
  const int64_t heads = d->s.heads;
  int64_t total_macs = 0;
  for (int64_t i = 0; i < d->s.batch; i++)
    total_macs += (int64_t)(d->s.offsets[i + 1] - d->s.offsets[i]) * bs * dim * 2 * heads;
  int64_t stride = total_macs > budget ? (total_macs + budget - 1) / budget : 1;
  double num = 0, den = 0;
  ag_status st = AG_OK;
  for (int64_t i = 0; i < d->s.batch && st == AG_OK; i += stride) {
    int64_t len = d->s.offsets[i + 1] - d->s.offsets[i];
    if (len == 0) continue;
    size_t n = (size_t)(len * heads * dim);
    uint16_t *in = malloc(n * 2 * 4);
    double *ref = malloc(n * sizeof(double));
    if (!in || !ref) {
      free(in);
      free(ref);
      return ag_fail(err, AG_ERR_NOMEM, "out of memory for the reference");
    }
    uint64_t e0 = (uint64_t)d->s.offsets[i] * heads * dim;
    for (int which = 0; which < 3; which++)
      for (size_t e = 0; e < n; e++)
        in[which * n + e] = input_at(&d->s, which, e0 + e);
    uint16_t *got = in + 3 * n;
    st = ag_cuda_check(err, drv->cuMemcpyDtoH(got, d->s.t[3] + e0 * 2, n * 2), "cuMemcpyDtoH");
    int32_t local[2] = {0, (int32_t)len};
    if (st == AG_OK && s->rotary.layout != AG_ROTARY_NONE) {
      /* Rotary: rotate the inputs, then attention, in float64. */
      double *x = malloc(sizeof(double) * (3 * n + (size_t)len * dim));
      if (!x) st = ag_fail(err, AG_ERR_NOMEM, "out of memory for the reference");
      else {
        reference_inputs(&d->s, s, in, 3 * n, d->s.offsets[i], len, x);
        ag_ref_rotary rot = ref_rotary(s, x + 3 * n);
        ag_ref_block_forward_rotary_f64(&rot, bs, s->causal, ag_spec_scale(s), x, x + n,
                                        x + 2 * n, local, 1, heads, dim, ref);
        free(x);
      }
    } else if (st == AG_OK) {
      ag_ref_block_forward(s->dtype, bs, s->causal, ag_spec_scale(s), in, in + n, in + 2 * n,
                           local, 1, heads, dim, ref);
    }
    if (st == AG_OK) {
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

ag_status ag_block_data_check(ag_block_data *d, ag_kernel *kern, int64_t max_ref_macs,
                              ag_check_result *out, ag_error *err) {
  memset(out, 0, sizeof *out);
  ag_status st = set_matches(&d->s, kern, ag_plan_first_kernel(&kern->plan), err);
  if (st) return st;
  const ag_driver *drv = d->s.ctx->drv;
  out->blocks = set_blocks(&d->s, kern->spec.block_size);
  out->bytes = ag_block_data_bytes(d);
  CUdeviceptr table;
  if ((st = set_table(&d->s, kern, &table, err))) return st;
  d->args.rotary_table = (const void *)(uintptr_t)table;
  if ((st = ag_cuda_check(err, drv->cuCtxPushCurrent(d->s.ctx->cu), "cuCtxPushCurrent"))) return st;
  st = set_poison(&d->s, err);
  if (st == AG_OK) st = ag_block_forward(kern, &d->args, NULL, err);
  if (st == AG_OK) st = ag_cuda_check(err, drv->cuCtxSynchronize(), "kernel");
  if (st == AG_OK) st = set_scan(&d->s, FWD_INPUTS, &out->unwritten, &out->guard_clobbered, err);
  if (st == AG_OK) st = compare(d, kern, max_ref_macs > 0 ? max_ref_macs : 400000000, out, err);
  CUcontext popped;
  drv->cuCtxPopCurrent(&popped);
  return st;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* Median milliseconds of `iters` calls of launch(kernel, args), each
 * between two CUDA events, after `warmup` untimed calls. */
typedef ag_status (*launch_fn)(ag_kernel *kernel, const void *args, ag_error *err);

static ag_status time_launches(ag_context *ctx, launch_fn launch, ag_kernel *kern,
                               const void *args, int warmup, int iters, double *out_ms,
                               ag_error *err) {
  *out_ms = 0;
  if (iters < 1) return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "iters must be >= 1");
  const ag_driver *drv = ctx->drv;
  ag_status st = ag_cuda_check(err, drv->cuCtxPushCurrent(ctx->cu), "cuCtxPushCurrent");
  if (st) return st;
  CUevent ev[2] = {0, 0};
  float *ms = calloc((size_t)iters, sizeof *ms);
  if (!ms) st = ag_fail(err, AG_ERR_NOMEM, "out of memory");
  for (int i = 0; i < 2 && st == AG_OK; i++)
    st = ag_cuda_check(err, drv->cuEventCreate(&ev[i], CU_EVENT_DEFAULT), "cuEventCreate");
  for (int i = 0; i < warmup && st == AG_OK; i++) st = launch(kern, args, err);
  for (int i = 0; i < iters && st == AG_OK; i++) {
    drv->cuEventRecord(ev[0], NULL);
    st = launch(kern, args, err);
    drv->cuEventRecord(ev[1], NULL);
    if (st == AG_OK) st = ag_cuda_check(err, drv->cuEventSynchronize(ev[1]), "kernel (timed)");
    if (st == AG_OK)
      st = ag_cuda_check(err, drv->cuEventElapsedTime(&ms[i], ev[0], ev[1]), "cuEventElapsedTime");
  }
  if (st == AG_OK) {
    qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
    *out_ms = ms[iters / 2];
  }
  for (int i = 0; i < 2; i++)
    if (ev[i]) drv->cuEventDestroy(ev[i]);
  free(ms);
  CUcontext popped;
  drv->cuCtxPopCurrent(&popped);
  return st;
}

static ag_status launch_forward(ag_kernel *kern, const void *args, ag_error *err) {
  return ag_block_forward(kern, args, NULL, err);
}

ag_status ag_block_data_time(ag_block_data *d, ag_kernel *kern, int warmup, int iters,
                             double *out_ms, ag_error *err) {
  *out_ms = 0;
  ag_status st = set_matches(&d->s, kern, ag_plan_first_kernel(&kern->plan), err);
  if (st) return st;
  CUdeviceptr table;
  if ((st = set_table(&d->s, kern, &table, err))) return st;
  d->args.rotary_table = (const void *)(uintptr_t)table;
  return time_launches(d->s.ctx, launch_forward, kern, &d->args, warmup, iters, out_ms, err);
}

ag_status ag_selfcheck_block_forward(ag_kernel *kern, const int32_t *lengths, int64_t batch,
                                     int64_t heads, const ag_check_options *opt,
                                     ag_check_result *out, ag_error *err) {
  memset(out, 0, sizeof *out);
  ag_block_data *d;
  ag_status st = ag_block_data_create(kern->ctx, kern->spec.dtype, kern->spec.head_dim,
                                      kern->spec.block_size, lengths, batch, heads, opt->seed, &d,
                                      err);
  if (st) return st;
  st = ag_block_data_check(d, kern, opt->max_ref_macs, out, err);
  if (st == AG_OK && opt->time_iters > 0)
    st = ag_block_data_time(d, kern, opt->warmup_iters, opt->time_iters, &out->median_ms, err);
  ag_block_data_destroy(d);
  return st;
}

/* ---- backward ---------------------------------------------------------- */

enum { BWD_INPUTS = 4, BWD_TENSORS = 7 }; /* q, k, v, dout; then dq, dk, dv */

struct ag_block_bwd_data {
  tensor_set s;
  ag_block_bwd_args args;
};

void ag_block_bwd_data_destroy(ag_block_bwd_data *d) {
  if (!d) return;
  set_free(&d->s);
  free(d);
}

double ag_block_bwd_data_bytes(const ag_block_bwd_data *d) {
  return (double)BWD_TENSORS * (double)d->s.elems * 2;
}

ag_status ag_block_bwd_data_create(ag_context *ctx, ag_dtype dtype, int head_dim, int guard_rows,
                                   const int32_t *lengths, int64_t batch, int64_t heads,
                                   uint64_t seed, float dout_scale, ag_block_bwd_data **out,
                                   ag_error *err) {
  *out = NULL;
  ag_block_bwd_data *d = calloc(1, sizeof *d);
  if (!d) return ag_fail(err, AG_ERR_NOMEM, "out of memory");
  ag_status st = set_create(&d->s, ctx, dtype, head_dim, guard_rows, lengths, batch, heads, seed,
                            BWD_INPUTS, BWD_TENSORS,
                            (const float[BWD_INPUTS]){1.f, 1.f, 1.f, dout_scale > 0 ? dout_scale : 1.f},
                            err);
  if (st) {
    free(d);
    return st;
  }
#define PTR(i) ((void *)(uintptr_t)d->s.t[i])
  d->args = (ag_block_bwd_args){PTR(0), PTR(1), PTR(2), PTR(3), PTR(4), PTR(5), PTR(6),
                                (const int32_t *)(uintptr_t)d->s.d_offsets, batch, heads,
                                d->s.total, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0};
#undef PTR
  *out = d;
  return AG_OK;
}

/* Compare sampled sequences' dQ, dK, dV with the float64 reference. */
static ag_status compare_gradients(ag_block_bwd_data *d, const ag_kernel *kern, int64_t budget,
                                   ag_check_bwd_result *out, ag_error *err) {
  const ag_driver *drv = d->s.ctx->drv;
  const ag_spec *s = &kern->spec;
  const int dim = s->head_dim, bs = s->block_size;
  const int64_t heads = d->s.heads;
  /* The reference does about five products of a block's rows with its
   * keys per head: MACs ~ 5 * len * block * dim * heads. */
  int64_t total_macs = 0;
  for (int64_t i = 0; i < d->s.batch; i++)
    total_macs += (int64_t)(d->s.offsets[i + 1] - d->s.offsets[i]) * bs * dim * 5 * heads;
  int64_t stride = total_macs > budget ? (total_macs + budget - 1) / budget : 1;
  double num[3] = {0, 0, 0}, den[3] = {0, 0, 0};
  ag_status st = AG_OK;
  for (int64_t i = 0; i < d->s.batch && st == AG_OK; i += stride) {
    int64_t len = d->s.offsets[i + 1] - d->s.offsets[i];
    if (len == 0) continue;
    size_t n = (size_t)(len * heads * dim);
    uint16_t *in = malloc(n * 2 * BWD_TENSORS);
    double *ref = malloc(n * sizeof(double) * 3);
    if (!in || !ref) {
      free(in);
      free(ref);
      return ag_fail(err, AG_ERR_NOMEM, "out of memory for the reference");
    }
    uint64_t e0 = (uint64_t)d->s.offsets[i] * heads * dim;
    for (int which = 0; which < BWD_INPUTS; which++)
      for (size_t e = 0; e < n; e++)
        in[which * n + e] = input_at(&d->s, which, e0 + e);
    for (int g = 0; g < 3 && st == AG_OK; g++)
      st = ag_cuda_check(err,
                         drv->cuMemcpyDtoH(in + (BWD_INPUTS + g) * n,
                                           d->s.t[BWD_INPUTS + g] + e0 * 2, n * 2),
                         "cuMemcpyDtoH");
    int32_t local[2] = {0, (int32_t)len};
    if (st == AG_OK && s->rotary.layout != AG_ROTARY_NONE) {
      /* Rotary: rotate the inputs, then attention's gradients, then rotate
       * those of the rotated tensors back, in float64. */
      double *x = malloc(sizeof(double) * (BWD_INPUTS * n + (size_t)len * dim));
      if (!x) st = ag_fail(err, AG_ERR_NOMEM, "out of memory for the reference");
      else {
        reference_inputs(&d->s, s, in, BWD_INPUTS * n, d->s.offsets[i], len, x);
        ag_ref_rotary rot = ref_rotary(s, x + BWD_INPUTS * n);
        ag_ref_block_backward_rotary_f64(&rot, bs, s->causal, ag_spec_scale(s), x, x + n,
                                         x + 2 * n, x + 3 * n, local, 1, heads, dim, ref,
                                         ref + n, ref + 2 * n);
        free(x);
      }
    } else if (st == AG_OK) {
      ag_ref_block_backward(s->dtype, bs, s->causal, ag_spec_scale(s), in, in + n, in + 2 * n,
                            in + 3 * n, local, 1, heads, dim, ref, ref + n, ref + 2 * n);
    }
    if (st == AG_OK) {
      for (int g = 0; g < 3; g++)
        for (size_t e = 0; e < n; e++) {
          double got = ag_half_to_float(s->dtype, in[(BWD_INPUTS + g) * n + e]),
                 want = ref[g * n + e];
          num[g] += isnan(got) ? INFINITY : (got - want) * (got - want);
          den[g] += want * want;
        }
      out->sampled_seqs++;
    }
    free(in);
    free(ref);
  }
  for (int g = 0; g < 3; g++) out->rel_error[g] = den[g] > 0 ? sqrt(num[g] / den[g]) : sqrt(num[g]);
  return st;
}

ag_status ag_block_bwd_data_check(ag_block_bwd_data *d, ag_kernel *kern, int64_t max_ref_macs,
                                  ag_check_bwd_result *out, ag_error *err) {
  memset(out, 0, sizeof *out);
  const ag_plan_kernel *bk = ag_plan_kernel_for(&kern->plan, AG_PASS_BACKWARD);
  if (!bk)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel '%s' has no backward pass",
                   kern->spec.name);
  ag_status st = set_matches(&d->s, kern, bk->name, err);
  if (st) return st;
  const ag_driver *drv = d->s.ctx->drv;
  out->blocks = set_blocks(&d->s, kern->spec.block_size);
  out->bytes = ag_block_bwd_data_bytes(d);
  CUdeviceptr table;
  if ((st = set_table(&d->s, kern, &table, err))) return st;
  d->args.rotary_table = (const void *)(uintptr_t)table;
  if ((st = ag_cuda_check(err, drv->cuCtxPushCurrent(d->s.ctx->cu), "cuCtxPushCurrent"))) return st;
  st = set_poison(&d->s, err);
  if (st == AG_OK) st = ag_block_backward(kern, &d->args, NULL, err);
  if (st == AG_OK) st = ag_cuda_check(err, drv->cuCtxSynchronize(), "kernel");
  for (int g = 0; g < 3 && st == AG_OK; g++)
    st = set_scan(&d->s, BWD_INPUTS + g, &out->unwritten[g], &out->guard_clobbered, err);
  if (st == AG_OK)
    st = compare_gradients(d, kern, max_ref_macs > 0 ? max_ref_macs : 400000000, out, err);
  CUcontext popped;
  drv->cuCtxPopCurrent(&popped);
  return st;
}

static ag_status launch_backward(ag_kernel *kern, const void *args, ag_error *err) {
  return ag_block_backward(kern, args, NULL, err);
}

ag_status ag_block_bwd_data_time(ag_block_bwd_data *d, ag_kernel *kern, int warmup, int iters,
                                 double *out_ms, ag_error *err) {
  *out_ms = 0;
  const ag_plan_kernel *bk = ag_plan_kernel_for(&kern->plan, AG_PASS_BACKWARD);
  if (!bk)
    return ag_fail(err, AG_ERR_INVALID_ARGUMENT, "kernel '%s' has no backward pass",
                   kern->spec.name);
  ag_status st = set_matches(&d->s, kern, bk->name, err);
  if (st) return st;
  CUdeviceptr table;
  if ((st = set_table(&d->s, kern, &table, err))) return st;
  d->args.rotary_table = (const void *)(uintptr_t)table;
  return time_launches(d->s.ctx, launch_backward, kern, &d->args, warmup, iters, out_ms, err);
}

ag_status ag_selfcheck_block_backward(ag_kernel *kern, const int32_t *lengths, int64_t batch,
                                      int64_t heads, const ag_check_options *opt,
                                      ag_check_bwd_result *out, ag_error *err) {
  memset(out, 0, sizeof *out);
  ag_block_bwd_data *d;
  ag_status st = ag_block_bwd_data_create(kern->ctx, kern->spec.dtype, kern->spec.head_dim,
                                          kern->spec.block_size, lengths, batch, heads, opt->seed,
                                          opt->dout_scale, &d, err);
  if (st) return st;
  st = ag_block_bwd_data_check(d, kern, opt->max_ref_macs, out, err);
  if (st == AG_OK && opt->time_iters > 0)
    st = ag_block_bwd_data_time(d, kern, opt->warmup_iters, opt->time_iters, &out->median_ms,
                                err);
  ag_block_bwd_data_destroy(d);
  return st;
}
